//! This module owns whole-keyspace work against a step's etcd on its
//! isolated port: reading every key (v2 with TTLs, v3 with leases),
//! writing keys back (v2 with a TTL, v3 under a lease), deleting the v2
//! tree, and the fingerprint (key count, digests over every key, value and
//! expiry binding, v3 leases) that proves two reads of the data hold the
//! same keyspace. etcd3 data can also hold keys written through the v2 API
//! (flannel's `/coreos.com/network/config`, old tooling): wherever the
//! release serves the v2 API, they are read and fingerprinted too, as the
//! data's v2 side store.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::time::{Duration, Instant};

use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::version::Storage;

/// How many key names a fingerprint keeps for messages (e.g. the v2 keys
/// a release without the v2 API could not hold).
const SAMPLE_KEYS: usize = 10;

/// What this run wrote into the keyspace to prove each step healthy: keys
/// with one prefix unique to the run, and the leases they were put under.
/// Every read leaves them out, so they are never taken for the user's data
/// (see `health` for why no user key can have that prefix).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Ours {
    /// The prefix of every health key of this run (as a v2 path); empty
    /// (matching nothing) for a reader that wrote nothing.
    key_prefix: String,
    /// The v3 leases this run granted for its health keys.
    pub leases: BTreeSet<i64>,
}

impl Ours {
    /// The health keys of the run identified by `run` (random hex).
    pub fn for_run(run: &str) -> Ours {
        Ours {
            key_prefix: format!("/etcd-migrate-health-{run}-"),
            leases: BTreeSet::new(),
        }
    }

    /// The prefix of this run's health keys.
    pub fn key_prefix(&self) -> &str {
        &self.key_prefix
    }

    /// The health key of the given attempt.
    pub fn key(&self, attempt: u64) -> String {
        format!("{}{attempt}", self.key_prefix)
    }

    /// True for one of this run's health keys (v2 or v3 spelling).
    pub fn holds_key(&self, key: &[u8]) -> bool {
        !self.key_prefix.is_empty() && v2_path(key).starts_with(self.key_prefix.as_bytes())
    }

    /// True for one of this run's health leases.
    pub fn holds_lease(&self, lease: i64) -> bool {
        self.leases.contains(&lease)
    }
}

/// Keys per v3 range request: K8s objects reach 1.5 MiB, so pages stay
/// small and the decoding limit generous.
const V3_PAGE: i64 = 200;

/// Largest v3 response we accept (etcd's own request limit is 1.5 MiB a
/// key; a page of them fits).
const V3_MAX_MESSAGE: usize = 512 * 1024 * 1024;

/// The gRPC status code UNIMPLEMENTED: what 3.0 … 3.2 answer to a lease
/// list (LeaseLeases came in 3.3), and 3.0 to a lease's time-to-live
/// (LeaseTimeToLive came in 3.1).
const GRPC_UNIMPLEMENTED: i32 = 12;

/// What is known of leases' TTLs without asking etcd: each lease's TTL and
/// the moment it counts from. etcd 3.0 has no LeaseTimeToLive, so a read
/// through it learns from the keys only which lease each is bound to. The
/// TTL comes from here instead:
/// - the TTL the data recorded for the lease when its etcd last stopped
///   (`ondisk`: bolt's lease bucket), counted from that etcd's start,
///   because etcd gives every lease its full granted TTL again whenever it
///   starts (the lessor's promote, on becoming leader; a moment after the
///   start, so the start is the earlier, safe end);
/// - the TTL of a lease this run granted itself (the storage migration),
///   counted from just before the grant.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KnownLeases {
    ttls: BTreeMap<i64, (i64, Instant)>,
}

impl KnownLeases {
    /// Nothing known.
    pub fn new() -> Self {
        KnownLeases::default()
    }

    /// Every lease of `granted` (id → TTL in seconds), counted from
    /// `since`.
    pub fn granted_at(granted: &BTreeMap<i64, i64>, since: Instant) -> Self {
        KnownLeases {
            ttls: granted
                .iter()
                .map(|(id, ttl)| (*id, (*ttl, since)))
                .collect(),
        }
    }

    /// Adds one lease of `ttl` seconds, counted from `since`.
    pub fn insert(&mut self, lease: i64, ttl: i64, since: Instant) {
        self.ttls.insert(lease, (ttl, since));
    }

    /// Adds every lease `other` knows.
    pub fn extend(&mut self, other: KnownLeases) {
        self.ttls.extend(other.ttls);
    }

    /// How many leases are known.
    pub fn len(&self) -> usize {
        self.ttls.len()
    }

    /// True when none is.
    pub fn is_empty(&self) -> bool {
        self.ttls.is_empty()
    }

    /// The seconds `lease` has left at the latest, if it is known: its TTL
    /// less the whole seconds begun since it started counting (never less
    /// than 0), so it never says more than etcd would.
    pub fn remaining(&self, lease: i64) -> Option<i64> {
        let (ttl, since) = self.ttls.get(&lease)?;
        let elapsed = since.elapsed();
        let begun = elapsed.as_secs() + u64::from(elapsed.subsec_nanos() > 0);
        Some(
            ttl.saturating_sub(i64::try_from(begun).unwrap_or(i64::MAX))
                .max(0),
        )
    }
}

/// Per-request deadline for keyspace calls: a page of a large keyspace.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// One leaf key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The key (v2 keys are paths such as `/registry/pods/a`).
    pub key: Vec<u8>,
    /// The value.
    pub value: Vec<u8>,
    /// Seconds left to live, if the key expires (v2 TTL or v3 lease).
    pub ttl: Option<i64>,
    /// The v3 lease the key is bound to (0: none, and always 0 in v2).
    pub lease: i64,
}

/// A 256-bit sum of SHA-256 digests (mod 2^256): an order-independent
/// digest of a set of entries, from which one entry's part can be taken
/// out again (a key that expired between two reads).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Sum([u64; 4]);

impl Sum {
    fn of(parts: &[&[u8]]) -> Sum {
        let mut hasher = Sha256::new();
        for part in parts {
            // Length-prefixed so that ("ab","c") and ("a","bc") differ.
            hasher.update((part.len() as u64).to_be_bytes());
            hasher.update(part);
        }
        let digest: [u8; 32] = hasher.finalize().into();
        let mut limbs = [0u64; 4];
        for (limb, chunk) in limbs.iter_mut().zip(digest.chunks_exact(8)) {
            let mut bytes = [0u8; 8];
            bytes.copy_from_slice(chunk);
            *limb = u64::from_be_bytes(bytes);
        }
        Sum(limbs)
    }

    fn add(self, other: Sum) -> Sum {
        let mut out = [0u64; 4];
        let mut carry = false;
        for i in (0..4).rev() {
            let (a, c1) = self.0[i].overflowing_add(other.0[i]);
            let (b, c2) = a.overflowing_add(u64::from(carry));
            out[i] = b;
            carry = c1 || c2;
        }
        Sum(out)
    }

    fn sub(self, other: Sum) -> Sum {
        let mut out = [0u64; 4];
        let mut borrow = false;
        for i in (0..4).rev() {
            let (a, b1) = self.0[i].overflowing_sub(other.0[i]);
            let (b, b2) = a.overflowing_sub(u64::from(borrow));
            out[i] = b;
            borrow = b1 || b2;
        }
        Sum(out)
    }

    fn short(&self) -> String {
        format!("{:016x}", self.0[0])
    }
}

/// One entry that may legitimately be gone at a later read: its TTL or
/// lease can run out.
#[derive(Debug, Clone, Copy)]
struct Expiring {
    /// The earliest moment it can be gone.
    earliest: Instant,
    /// Its part of [`Fingerprint::digest`].
    digest: Sum,
    /// Its part of [`Fingerprint::content`].
    content: Sum,
}

/// What identifies a keyspace as one etcd served it: the number of keys,
/// a digest over every key, value and expiry binding, and (v3) the leases.
/// Our health key is left out: every step writes it with its own version.
///
/// - `digest` is storage-specific: v3 hashes (key, value, lease id), v2
///   hashes (key, value, TTL present or not).
/// - `content` hashes (key as a v2 path, value, expires or not) in both,
///   so a step that changes the storage can be compared too.
///
/// Both are sums of per-entry SHA-256 digests, so an entry whose TTL or
/// lease ran out between two reads can be taken out of the earlier one.
#[derive(Debug, Clone)]
pub struct Fingerprint {
    /// The API it was read through.
    pub storage: Storage,
    /// Keys (leaves in v2).
    pub keys: usize,
    /// v3 leases alive (`None` in v2, and where the API cannot list them:
    /// 3.0 … 3.2), with the earliest moment each can run out.
    leases: Option<BTreeMap<i64, Instant>>,
    digest: Sum,
    content: Sum,
    /// Entries that expire, by the hash of their v2 path.
    expiring: BTreeMap<[u8; 32], Expiring>,
    /// When the read that made it ended.
    read_done: Instant,
    /// The first keys read, for messages.
    sample: Vec<String>,
    /// etcd3 data: its v2 store, where the release serves the v2 API
    /// (`None`: not read, e.g. 3.6 has no v2 API).
    v2_side: Option<Box<Fingerprint>>,
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let storage = match self.storage {
            Storage::Etcd2 => "v2",
            Storage::Etcd3 => "v3",
        };
        write!(f, "{storage} {} keys", self.keys)?;
        if let Some(leases) = &self.leases {
            write!(f, " {} leases", leases.len())?;
        }
        write!(
            f,
            " {} expiring digest:{} content:{}",
            self.expiring.len(),
            self.digest.short(),
            self.content.short()
        )?;
        if let Some(side) = &self.v2_side {
            write!(f, " + v2 store: {side}")?;
        }
        Ok(())
    }
}

/// The earliest moment an entry read at `read_started` with `ttl` seconds
/// left can be gone: etcd rounds the remaining time (v2 up, v3 down), so
/// one second is taken off, and a restarted etcd only ever extends a lease.
fn earliest_expiry(read_started: Instant, ttl: i64) -> Instant {
    let secs = u64::try_from(ttl.saturating_sub(1)).unwrap_or(0);
    read_started + Duration::from_secs(secs)
}

impl Fingerprint {
    /// The fingerprint of `entries` as read through `storage`'s API between
    /// `read_started` and now; `leases` are the v3 leases alive with their
    /// seconds left, when the API lists them.
    pub fn new(
        storage: Storage,
        entries: &[Entry],
        leases: Option<&BTreeMap<i64, i64>>,
        read_started: Instant,
    ) -> Fingerprint {
        let mut fingerprint = Fingerprint::empty(storage);
        for entry in entries {
            fingerprint.add(entry, read_started);
        }
        fingerprint.finish(leases, read_started)
    }

    /// Nothing read yet: entries are added as a read brings them.
    fn empty(storage: Storage) -> Fingerprint {
        Fingerprint {
            storage,
            keys: 0,
            leases: None,
            digest: Sum::default(),
            content: Sum::default(),
            expiring: BTreeMap::new(),
            read_done: Instant::now(),
            sample: Vec::new(),
            v2_side: None,
        }
    }

    /// The same, with the fingerprint of the data's v2 store beside it.
    pub fn with_v2_side(mut self, side: Option<Fingerprint>) -> Self {
        self.v2_side = side.map(Box::new);
        self
    }

    /// The fingerprint of the v2 store that etcd3 data holds beside its v3
    /// keyspace, if it was read.
    pub fn v2_side(&self) -> Option<&Fingerprint> {
        self.v2_side.as_deref()
    }

    /// Some of the keys read (the first ones), for messages.
    pub fn sample(&self) -> &[String] {
        &self.sample
    }

    /// Counts one entry of a read that began at `read_started` (the reader
    /// has already left out what this run wrote).
    fn add(&mut self, entry: &Entry, read_started: Instant) {
        if self.sample.len() < SAMPLE_KEYS {
            self.sample
                .push(String::from_utf8_lossy(&entry.key).into_owned());
        }
        let path = v2_path(&entry.key);
        let expires = entry.ttl.is_some() || entry.lease != 0;
        let flag: &[u8] = if expires { b"expires" } else { b"stays" };
        let own = match self.storage {
            Storage::Etcd3 => Sum::of(&[&entry.key, &entry.value, &entry.lease.to_be_bytes()]),
            Storage::Etcd2 => Sum::of(&[&entry.key, &entry.value, flag]),
        };
        let neutral = Sum::of(&[&path, &entry.value, flag]);
        self.digest = self.digest.add(own);
        self.content = self.content.add(neutral);
        self.keys += 1;
        if expires {
            let path_hash: [u8; 32] = Sha256::digest(&path).into();
            self.expiring.insert(
                path_hash,
                Expiring {
                    earliest: earliest_expiry(read_started, entry.ttl.unwrap_or(0)),
                    digest: own,
                    content: neutral,
                },
            );
        }
    }

    /// Ends the read: the leases, and the moment it ended.
    fn finish(mut self, leases: Option<&BTreeMap<i64, i64>>, read_started: Instant) -> Self {
        self.leases = leases.map(|leases| {
            leases
                .iter()
                .map(|(id, ttl)| (*id, earliest_expiry(read_started, *ttl)))
                .collect()
        });
        self.read_done = Instant::now();
        self
    }

    /// The fingerprint of entries held in memory (no leases, read now).
    pub fn of(storage: Storage, entries: &[Entry]) -> Fingerprint {
        Fingerprint::new(storage, entries, None, Instant::now())
    }

    /// True when both hold the same keys and values, with the same expiry
    /// presence, whatever storage each was read through.
    pub fn same_content(&self, other: &Fingerprint) -> bool {
        self.keys == other.keys && self.content == other.content
    }

    /// Checks that `later` holds what `self` held: the same keys, values
    /// and bindings (through the same storage: the full digest and the
    /// leases; across a storage change: the content), except entries and
    /// leases whose TTL could have run out by the time `later` was read.
    /// `Err` says what differs.
    pub fn check_kept_by(&self, later: &Fingerprint) -> Result<(), String> {
        let mut differs = Vec::new();
        if self.storage == later.storage {
            differs.extend(self.store_differences(later));
            if let Some(before) = &self.v2_side {
                match &later.v2_side {
                    Some(after) => differs.extend(
                        before
                            .store_differences(after)
                            .into_iter()
                            .map(|d| format!("v2 store: {d}")),
                    ),
                    None if before.keys > 0 => differs.push(format!(
                        "the v2 store held {} keys (e.g. {:?}) and this release serves no v2 API, so they cannot be carried",
                        before.keys, before.sample
                    )),
                    None => {}
                }
            }
        } else if self.storage == Storage::Etcd3 {
            // etcd3 -> etcd2: the v3 keys and the v2 side store together
            // become the v2 store.
            differs.extend(self.merged_with_v2_side().store_differences(later));
        } else {
            // etcd2 -> etcd3: the v2 keys become the v3 keyspace; the v2
            // store is then emptied (or kept, with --keep-v2-keys) by design.
            differs.extend(self.store_differences(later));
        }
        if differs.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "before: {self}; after: {later}; {}",
                differs.join("; ")
            ))
        }
    }

    /// The v3 keyspace and the v2 side store as one set of entries (for a
    /// comparison by content only).
    fn merged_with_v2_side(&self) -> Fingerprint {
        let mut merged = self.clone();
        if let Some(side) = merged.v2_side.take() {
            merged.keys += side.keys;
            merged.content = merged.content.add(side.content);
            merged.expiring.extend(side.expiring);
            merged.sample.extend(side.sample);
        }
        merged
    }

    /// What differs between this store and the same store read `later`.
    fn store_differences(&self, later: &Fingerprint) -> Vec<String> {
        // Expired since: their earliest end has passed and `later` no
        // longer lists them as expiring (if it holds them at all, a changed
        // binding shows in the digest).
        let gone: Vec<&Expiring> = self
            .expiring
            .iter()
            .filter(|(path, e)| {
                e.earliest <= later.read_done && !later.expiring.contains_key(*path)
            })
            .map(|(_, e)| e)
            .collect();
        let keys = self.keys - gone.len();
        let content = gone.iter().fold(self.content, |sum, e| sum.sub(e.content));
        let mut differs = Vec::new();
        if later.keys != keys {
            differs.push(format!(
                "{} keys expected ({} before, {} expired since), {} found",
                keys,
                self.keys,
                gone.len(),
                later.keys
            ));
        }
        if later.storage == self.storage {
            let digest = gone.iter().fold(self.digest, |sum, e| sum.sub(e.digest));
            if later.digest != digest {
                differs.push("keys, values or lease bindings differ".to_string());
            }
            if let (Some(before), Some(after)) = (&self.leases, &later.leases) {
                let appeared: Vec<String> = after
                    .keys()
                    .filter(|id| !before.contains_key(id))
                    .map(|id| format!("{id:x}"))
                    .collect();
                let lost: Vec<String> = before
                    .iter()
                    .filter(|(id, earliest)| {
                        !after.contains_key(id) && **earliest > later.read_done
                    })
                    .map(|(id, _)| format!("{id:x}"))
                    .collect();
                if !appeared.is_empty() || !lost.is_empty() {
                    differs.push(format!(
                        "leases differ (lost before their TTL: {lost:?}, new: {appeared:?})"
                    ));
                }
            }
        } else if later.content != content {
            differs.push("keys, values or expiry differ".to_string());
        }
        differs
    }
}

/// A key as a v2 path: with exactly one leading `/`.
pub fn v2_path(key: &[u8]) -> Vec<u8> {
    let trimmed: &[u8] = match key.iter().position(|b| *b != b'/') {
        Some(start) => &key[start..],
        None => &[],
    };
    let mut path = Vec::with_capacity(trimmed.len() + 1);
    path.push(b'/');
    path.extend_from_slice(trimmed);
    path
}

fn http_client() -> Result<reqwest::Client, String> {
    crate::tls::ensure_provider();
    reqwest::Client::builder()
        .no_proxy()
        .timeout(REQUEST_TIMEOUT)
        .build()
        .map_err(|err| format!("cannot build the HTTP client: {err}"))
}

/// Reads every leaf of the v2 store (recursive, with remaining TTLs),
/// without this run's health keys; `None` when the etcd serves no v2 API
/// (3.4/3.5 without `--enable-v2`, 3.6). A key inside a directory that has
/// a TTL expires with it: it gets the shortest TTL on its path. Hidden v2
/// nodes (a name starting with `_`) are never listed by etcd, so the ones
/// the data records (`hidden`, from [`crate::ondisk`]: a superset, so one
/// not found is skipped) are read one by one; a GET of a hidden directory
/// lists its visible children.
pub async fn read_v2(
    endpoint: &str,
    ours: &Ours,
    hidden: &[String],
) -> Result<Option<Vec<Entry>>, String> {
    let url = format!("{endpoint}/v2/keys/?recursive=true&sorted=true");
    let (status, body) = v2_get(&url).await?;
    let json: Result<Value, _> = serde_json::from_str(&body);
    if status.as_u16() == 404 && json.is_err() {
        // The root always exists; a 404 that is not a v2 error document
        // is the HTTP mux saying the v2 API is not served at all.
        return Ok(None);
    }
    if !status.is_success() {
        return Err(format!("v2 GET {url}: HTTP {status}: {}", body.trim()));
    }
    let json = json.map_err(|err| format!("v2 GET {url}: not JSON: {err}"))?;
    let mut entries = Vec::new();
    collect_v2(&json["node"], None, &mut entries);
    for path in hidden {
        if let Some(node) = read_v2_node(endpoint, path).await? {
            collect_v2(&node, None, &mut entries);
        }
    }
    entries.retain(|entry| !ours.holds_key(&entry.key));
    Ok(Some(entries))
}

/// One v2 node (recursively, if a directory), or `None` if it is gone.
async fn read_v2_node(endpoint: &str, path: &str) -> Result<Option<Value>, String> {
    let url = format!(
        "{}?recursive=true&sorted=true",
        v2_url(endpoint, path.as_bytes())
    );
    let (status, body) = v2_get(&url).await?;
    if status.as_u16() == 404 {
        return Ok(None);
    }
    if !status.is_success() {
        return Err(format!("v2 GET {url}: HTTP {status}: {}", body.trim()));
    }
    let json: Value =
        serde_json::from_str(&body).map_err(|err| format!("v2 GET {url}: not JSON: {err}"))?;
    Ok(Some(json["node"].clone()))
}

/// One v2 GET: the status and the body.
async fn v2_get(url: &str) -> Result<(reqwest::StatusCode, String), String> {
    let response = http_client()?
        .get(url)
        .send()
        .await
        .map_err(|err| format!("v2 GET {url}: {err}"))?;
    let status = response.status();
    let body = response
        .text()
        .await
        .map_err(|err| format!("v2 GET {url}: {err}"))?;
    Ok((status, body))
}

/// True for a v2 path with a hidden segment (a name starting with `_`):
/// the v2 API never lists it.
pub fn is_hidden_v2(key: &[u8]) -> bool {
    key.split(|b| *b == b'/')
        .any(|segment| segment.first() == Some(&b'_'))
}

/// Reads the v2 store of etcd2 data, which the release must serve.
async fn read_v2_store(
    endpoint: &str,
    ours: &Ours,
    hidden: &[String],
) -> Result<Vec<Entry>, String> {
    read_v2(endpoint, ours, hidden).await?.ok_or_else(|| {
        format!("{endpoint} serves no v2 API (404 on /v2/keys/), but the data is etcd2 storage")
    })
}

/// The seconds a v2 node has left, if it expires. A node in its last
/// second (or past expiry, before etcd's 500 ms sweep) is listed with its
/// "expiration" but no "ttl" (0 is omitted from the JSON): it is expiring,
/// not permanent.
fn v2_ttl(node: &Value) -> Option<i64> {
    match (node["ttl"].as_i64(), node.get("expiration")) {
        (Some(ttl), _) => Some(ttl),
        (None, Some(_)) => Some(0),
        (None, None) => None,
    }
}

/// Collects the leaves under `node`; `inherited` is the shortest TTL of
/// the directories above it (a directory's expiry removes its children).
fn collect_v2(node: &Value, inherited: Option<i64>, out: &mut Vec<Entry>) {
    let ttl = match (inherited, v2_ttl(node)) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    if node["dir"].as_bool() == Some(true) {
        for child in node["nodes"].as_array().into_iter().flatten() {
            collect_v2(child, ttl, out);
        }
        return;
    }
    if let Some(key) = node["key"].as_str() {
        out.push(Entry {
            key: key.as_bytes().to_vec(),
            value: node["value"]
                .as_str()
                .unwrap_or_default()
                .as_bytes()
                .to_vec(),
            ttl,
            lease: 0,
        });
    }
}

/// Percent-encodes each segment of a v2 path for a URL.
pub(crate) fn v2_url(endpoint: &str, key: &[u8]) -> String {
    let mut url = format!("{endpoint}/v2/keys");
    for segment in key.split(|b| *b == b'/').filter(|s| !s.is_empty()) {
        url.push('/');
        for &b in segment {
            if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
                url.push(b as char);
            } else {
                url.push_str(&format!("%{b:02X}"));
            }
        }
    }
    url
}

pub(crate) fn form_encode(value: &[u8]) -> String {
    let mut out = String::with_capacity(value.len() + 6);
    out.push_str("value=");
    for &b in value {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Writes one v2 key, with a TTL if given.
pub async fn write_v2(
    client: &reqwest::Client,
    endpoint: &str,
    key: &[u8],
    value: &[u8],
    ttl: Option<i64>,
) -> Result<(), String> {
    let mut url = v2_url(endpoint, key);
    if let Some(ttl) = ttl {
        url.push_str(&format!("?ttl={ttl}"));
    }
    let response = client
        .put(&url)
        .header("content-type", "application/x-www-form-urlencoded")
        .body(form_encode(value))
        .send()
        .await
        .map_err(|err| format!("v2 PUT {url}: {err}"))?;
    let status = response.status();
    if status.is_success() {
        return Ok(());
    }
    let body = response.text().await.unwrap_or_default();
    Err(format!("v2 PUT {url}: HTTP {status}: {}", body.trim()))
}

/// Writes v2 keys one by one (the v2 API has no batch), each with its TTL.
pub async fn write_all_v2(endpoint: &str, entries: &[Entry]) -> Result<(), String> {
    let client = http_client()?;
    for entry in entries {
        write_v2(&client, endpoint, &entry.key, &entry.value, entry.ttl).await?;
    }
    Ok(())
}

/// Deletes every top-level node of the v2 store (recursively), leaving the
/// internal membership nodes, which the keys API does not list; and the
/// `hidden` nodes, which it does not list either (a recursive delete of a
/// visible directory takes its hidden children with it, so only those at
/// the top matter; the others answer 404).
pub async fn delete_v2_tree(endpoint: &str, hidden: &[String]) -> Result<usize, String> {
    let client = http_client()?;
    let url = format!("{endpoint}/v2/keys/");
    let response = client
        .get(&url)
        .send()
        .await
        .map_err(|err| format!("v2 GET {url}: {err}"))?;
    let body = response
        .text()
        .await
        .map_err(|err| format!("v2 GET {url}: {err}"))?;
    let json: Value =
        serde_json::from_str(&body).map_err(|err| format!("v2 GET {url}: not JSON: {err}"))?;
    let mut deleted = 0;
    for node in json["node"]["nodes"].as_array().into_iter().flatten() {
        let Some(key) = node["key"].as_str() else {
            continue;
        };
        let dir = node["dir"].as_bool() == Some(true);
        let node_url = format!(
            "{}{}",
            v2_url(endpoint, key.as_bytes()),
            if dir { "?recursive=true" } else { "" }
        );
        let response = client
            .delete(&node_url)
            .send()
            .await
            .map_err(|err| format!("v2 DELETE {node_url}: {err}"))?;
        if !response.status().is_success() && response.status().as_u16() != 404 {
            let status = response.status();
            let text = response.text().await.unwrap_or_default();
            return Err(format!(
                "v2 DELETE {node_url}: HTTP {status}: {}",
                text.trim()
            ));
        }
        deleted += 1;
    }
    for path in hidden {
        let node_url = format!("{}?recursive=true", v2_url(endpoint, path.as_bytes()));
        let response = client
            .delete(&node_url)
            .send()
            .await
            .map_err(|err| format!("v2 DELETE {node_url}: {err}"))?;
        match response.status().as_u16() {
            404 => {}
            _ if response.status().is_success() => deleted += 1,
            _ => {
                let status = response.status();
                let text = response.text().await.unwrap_or_default();
                return Err(format!(
                    "v2 DELETE {node_url}: HTTP {status}: {}",
                    text.trim()
                ));
            }
        }
    }
    Ok(deleted)
}

/// A v3 client with generous limits for whole-keyspace reads.
pub async fn v3_client(endpoint: &str) -> Result<etcd_client::Client, String> {
    let options = etcd_client::ConnectOptions::new()
        .with_connect_timeout(Duration::from_secs(5))
        .with_timeout(REQUEST_TIMEOUT);
    etcd_client::Client::connect([endpoint], Some(options))
        .await
        .map_err(|err| format!("v3 connect {endpoint}: {err}"))
}

/// Reads every v3 key, a page at a time, handing each to `sink` with the
/// remaining TTL of its lease (a key whose lease has just run out, not yet
/// deleted by etcd, comes with 0), so a fingerprint never holds the
/// keyspace in memory. This run's health keys are left out. Where the
/// release has no LeaseTimeToLive (3.0), the TTL comes from `known`; a
/// leased key whose lease is not known there either comes without one
/// (`ttl: None`, `lease` set): it may expire at any moment, for all this
/// read can tell. Returns the seconds left on each lease a key is bound
/// to, where they are known.
async fn read_v3_with(
    client: &etcd_client::Client,
    ours: &Ours,
    known: &KnownLeases,
    sink: &mut dyn FnMut(Entry),
) -> Result<BTreeMap<i64, i64>, String> {
    let mut kv = client.kv_client().max_decoding_message_size(V3_MAX_MESSAGE);
    let mut lease_client = client.lease_client();
    let mut ttl_of_lease: BTreeMap<i64, Option<i64>> = BTreeMap::new();
    // Asked once: a release that lacks the call lacks it for every lease.
    let mut has_time_to_live = true;
    let mut start: Vec<u8> = vec![0];
    let mut revision = 0;
    loop {
        let options = etcd_client::GetOptions::new()
            .with_from_key()
            .with_limit(V3_PAGE)
            .with_revision(revision);
        let response = kv
            .get(start.clone(), Some(options))
            .await
            .map_err(|err| format!("v3 range from {start:?}: {err}"))?;
        if revision == 0 {
            // Every page reads the same revision: a consistent snapshot.
            revision = response.header().map(|h| h.revision()).unwrap_or(0);
        }
        for kv in response.kvs() {
            if ours.holds_key(kv.key()) {
                continue;
            }
            let ttl = match kv.lease() {
                0 => None,
                lease => match ttl_of_lease.get(&lease) {
                    Some(ttl) => *ttl,
                    None => {
                        let asked = if has_time_to_live {
                            lease_ttl(&mut lease_client, lease).await?
                        } else {
                            None
                        };
                        has_time_to_live &= asked.is_some();
                        let ttl = asked.or_else(|| known.remaining(lease));
                        ttl_of_lease.insert(lease, ttl);
                        ttl
                    }
                },
            };
            sink(Entry {
                key: kv.key().to_vec(),
                value: kv.value().to_vec(),
                ttl,
                lease: kv.lease(),
            });
        }
        match (response.more(), response.kvs().last()) {
            (true, Some(last)) => {
                start = last.key().to_vec();
                start.push(0);
            }
            _ => break,
        }
    }
    Ok(ttl_of_lease
        .into_iter()
        .filter_map(|(lease, ttl)| Some((lease, ttl?)))
        .collect())
}

/// Seconds left on a lease; 0 once it has run out (or is unknown to
/// etcd); `None` where the release has no LeaseTimeToLive (3.0).
async fn lease_ttl(
    client: &mut etcd_client::LeaseClient,
    lease: i64,
) -> Result<Option<i64>, String> {
    match client.time_to_live(lease, None).await {
        Ok(answer) => Ok(Some(answer.ttl().max(0))),
        Err(etcd_client::Error::GRpcStatus(status))
            if i32::from(status.code()) == GRPC_UNIMPLEMENTED =>
        {
            Ok(None)
        }
        Err(err) => Err(format!("v3 lease {lease:x} time-to-live: {err}")),
    }
}

/// Every lease alive with its seconds left (this run's health leases left
/// out), or `None` where the API has no lease list (etcd 3.0 … 3.2 answer
/// "unimplemented").
async fn read_leases(
    client: &etcd_client::Client,
    known: &BTreeMap<i64, i64>,
    ours: &Ours,
) -> Result<Option<BTreeMap<i64, i64>>, String> {
    let mut lease_client = client.lease_client();
    let listed = match lease_client.leases().await {
        Ok(listed) => listed,
        Err(etcd_client::Error::GRpcStatus(status))
            if i32::from(status.code()) == GRPC_UNIMPLEMENTED =>
        {
            return Ok(None)
        }
        Err(err) => return Err(format!("v3 lease list: {err}")),
    };
    let mut leases = BTreeMap::new();
    for lease in listed.leases() {
        if ours.holds_lease(lease.id()) {
            continue;
        }
        // A release that lists leases (3.3+) also tells their TTLs.
        let ttl = match known.get(&lease.id()) {
            Some(ttl) => *ttl,
            None => lease_ttl(&mut lease_client, lease.id()).await?.unwrap_or(0),
        };
        leases.insert(lease.id(), ttl);
    }
    Ok(Some(leases))
}

/// A whole read of the data a step's etcd serves.
#[derive(Debug, Clone)]
pub struct Read {
    /// Every entry of the data's own storage.
    pub entries: Vec<Entry>,
    /// etcd3 data: the leaves of its v2 store (empty where none was read).
    pub v2_side: Vec<Entry>,
    /// The fingerprint of both.
    pub fingerprint: Fingerprint,
}

/// Reads everything a step's etcd serves of data in `storage`: every
/// entry, for etcd3 data the v2 side store too (where the release serves
/// the v2 API), and the fingerprint of the read; this run's health keys
/// and leases are left out. `known`: the leases' TTLs, for a release that
/// cannot tell them (see [`KnownLeases`]).
pub async fn read_all(
    endpoint: &str,
    storage: Storage,
    ours: &Ours,
    hidden: &[String],
    known: &KnownLeases,
) -> Result<Read, String> {
    let started = Instant::now();
    match storage {
        Storage::Etcd2 => {
            let entries = read_v2_store(endpoint, ours, hidden).await?;
            let fingerprint = Fingerprint::new(storage, &entries, None, started);
            Ok(Read {
                entries,
                v2_side: Vec::new(),
                fingerprint,
            })
        }
        Storage::Etcd3 => {
            let client = v3_client(endpoint).await?;
            let mut entries = Vec::new();
            let ttls = read_v3_with(&client, ours, known, &mut |entry| entries.push(entry)).await?;
            let leases = read_leases(&client, &ttls, ours).await?;
            let side = read_v2(endpoint, ours, hidden).await?;
            let side_fingerprint = side
                .as_ref()
                .map(|side| Fingerprint::new(Storage::Etcd2, side, None, started));
            let fingerprint = Fingerprint::new(storage, &entries, leases.as_ref(), started)
                .with_v2_side(side_fingerprint);
            Ok(Read {
                entries,
                v2_side: side.unwrap_or_default(),
                fingerprint,
            })
        }
    }
}

/// The fingerprint of the data a step's etcd serves. A v3 keyspace is
/// hashed page by page and never held whole (a 2 GiB backend stays out of
/// our memory); the v2 API has no paging, so a v2 store is read at once.
pub async fn read_fingerprint(
    endpoint: &str,
    storage: Storage,
    ours: &Ours,
    hidden: &[String],
    known: &KnownLeases,
) -> Result<Fingerprint, String> {
    match storage {
        Storage::Etcd2 => Ok(read_all(endpoint, storage, ours, hidden, known)
            .await?
            .fingerprint),
        Storage::Etcd3 => {
            let started = Instant::now();
            let client = v3_client(endpoint).await?;
            let mut fingerprint = Fingerprint::empty(storage);
            let ttls = read_v3_with(&client, ours, known, &mut |entry| {
                fingerprint.add(&entry, started)
            })
            .await?;
            let leases = read_leases(&client, &ttls, ours).await?;
            let side = read_v2(endpoint, ours, hidden)
                .await?
                .map(|side| Fingerprint::new(Storage::Etcd2, &side, None, started));
            Ok(fingerprint
                .finish(leases.as_ref(), started)
                .with_v2_side(side))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(key: &str, value: &str) -> Entry {
        Entry {
            key: key.as_bytes().to_vec(),
            value: value.as_bytes().to_vec(),
            ttl: None,
            lease: 0,
        }
    }

    fn leased(key: &str, value: &str, lease: i64, ttl: i64) -> Entry {
        Entry {
            ttl: Some(ttl),
            lease,
            ..entry(key, value)
        }
    }

    fn v3(entries: &[Entry], leases: &[(i64, i64)], read_started: Instant) -> Fingerprint {
        let leases: BTreeMap<i64, i64> = leases.iter().copied().collect();
        Fingerprint::new(Storage::Etcd3, entries, Some(&leases), read_started)
    }

    #[test]
    fn fingerprint_ignores_order_and_the_leading_slash() {
        let a = [entry("/registry/a", "1"), entry("/registry/b", "2")];
        let b = [entry("registry/b", "2"), entry("registry/a", "1")];
        let (fa, fb) = (
            Fingerprint::of(Storage::Etcd2, &a),
            Fingerprint::of(Storage::Etcd3, &b),
        );
        assert!(fa.same_content(&fb));
        assert_eq!(fa.keys, 2);
        fa.check_kept_by(&fb).expect("same content across storages");
        let c = [entry("/registry/a", "1"), entry("/registry/b", "3")];
        assert!(!fa.same_content(&Fingerprint::of(Storage::Etcd2, &c)));
        let d = [entry("/ab", "c")];
        let e = [entry("/a", "bc")];
        assert!(
            !Fingerprint::of(Storage::Etcd2, &d).same_content(&Fingerprint::of(Storage::Etcd2, &e))
        );
    }

    #[test]
    fn a_lost_key_a_changed_value_or_a_changed_lease_fails_the_check() {
        let now = Instant::now();
        let before = v3(
            &[entry("a", "1"), leased("b", "2", 7, 3600)],
            &[(7, 3600)],
            now,
        );
        before
            .check_kept_by(&v3(
                &[entry("a", "1"), leased("b", "2", 7, 3600)],
                &[(7, 3600)],
                now,
            ))
            .expect("identical");
        let lost = v3(&[leased("b", "2", 7, 3600)], &[(7, 3600)], now);
        let err = before.check_kept_by(&lost).expect_err("a key lost");
        assert!(
            err.contains("2 keys expected")
                && err.contains("1 found")
                && err.contains("before: v3 2 keys"),
            "{err}"
        );
        let changed = v3(
            &[entry("a", "X"), leased("b", "2", 7, 3600)],
            &[(7, 3600)],
            now,
        );
        assert!(before.check_kept_by(&changed).is_err(), "a value changed");
        let rebound = v3(
            &[entry("a", "1"), leased("b", "2", 8, 3600)],
            &[(8, 3600)],
            now,
        );
        let err = before.check_kept_by(&rebound).expect_err("another lease");
        assert!(err.contains("leases differ"), "{err}");
        // A key that lost its expiry (a resurrection) fails, in one storage
        // and across a storage change.
        let unleased = v3(&[entry("a", "1"), entry("b", "2")], &[(7, 3600)], now);
        assert!(before.check_kept_by(&unleased).is_err());
        let v2 = Fingerprint::of(Storage::Etcd2, &[entry("/a", "1"), entry("/b", "2")]);
        assert!(before.check_kept_by(&v2).is_err());
        let v2_ttl = Fingerprint::of(
            Storage::Etcd2,
            &[
                entry("/a", "1"),
                Entry {
                    ttl: Some(3599),
                    ..entry("/b", "2")
                },
            ],
        );
        before
            .check_kept_by(&v2_ttl)
            .expect("etcd3 -> etcd2 keeps content");
    }

    #[test]
    fn keys_and_leases_whose_ttl_ran_out_may_be_gone() {
        // Read 10 s ago with 2 s left: it may have expired since.
        let long_ago = Instant::now() - Duration::from_secs(10);
        let before = v3(
            &[
                entry("a", "1"),
                leased("b", "2", 7, 2),
                leased("c", "3", 9, 3600),
            ],
            &[(7, 2), (9, 3600), (11, 2)],
            long_ago,
        );
        let after = v3(
            &[entry("a", "1"), leased("c", "3", 9, 3600)],
            &[(9, 3600)],
            Instant::now(),
        );
        before
            .check_kept_by(&after)
            .expect("b and lease 11 expired");
        // Still there is fine too.
        let still = v3(
            &[
                entry("a", "1"),
                leased("b", "2", 7, 1),
                leased("c", "3", 9, 3600),
            ],
            &[(7, 1), (9, 3600), (11, 1)],
            Instant::now(),
        );
        before.check_kept_by(&still).expect("not yet swept");
        // But a key with an hour left cannot have expired.
        let gone = v3(&[entry("a", "1")], &[], Instant::now());
        let err = before.check_kept_by(&gone).expect_err("c had an hour");
        assert!(
            err.contains("2 keys expected") && err.contains("1 found"),
            "{err}"
        );
        // Nor a key read just now with 2 s left.
        let fresh = v3(
            &[entry("a", "1"), leased("b", "2", 7, 2)],
            &[(7, 2)],
            Instant::now(),
        );
        let after = v3(&[entry("a", "1")], &[], Instant::now());
        assert!(fresh.check_kept_by(&after).is_err());
    }

    #[test]
    fn a_user_key_named_like_the_old_health_key_is_data() {
        let with = [entry("/registry/a", "1"), entry("etcd_version", "mine")];
        let without = [entry("/registry/a", "1")];
        assert!(!Fingerprint::of(Storage::Etcd3, &with)
            .same_content(&Fingerprint::of(Storage::Etcd3, &without)));
    }

    #[test]
    fn only_this_runs_health_keys_and_leases_are_ours() {
        let mut ours = Ours::for_run("abc");
        ours.leases.insert(7);
        assert_eq!(ours.key(3), "/etcd-migrate-health-abc-3");
        assert!(ours.holds_key(b"/etcd-migrate-health-abc-3"));
        assert!(ours.holds_key(b"etcd-migrate-health-abc-12"), "v3 spelling");
        assert!(
            !ours.holds_key(b"/etcd-migrate-health-abd-3"),
            "another run's"
        );
        assert!(!ours.holds_key(b"/etcd_version"));
        assert!(ours.holds_lease(7) && !ours.holds_lease(8));
        assert!(
            !Ours::default().holds_key(b"/anything"),
            "the empty prefix matches nothing"
        );
    }

    fn v3_with_side(v3_entries: &[Entry], side: &[Entry]) -> Fingerprint {
        Fingerprint::of(Storage::Etcd3, v3_entries)
            .with_v2_side(Some(Fingerprint::of(Storage::Etcd2, side)))
    }

    #[test]
    fn the_v2_side_store_of_etcd3_data_must_be_kept() {
        let before = v3_with_side(
            &[entry("a", "1")],
            &[entry("/coreos.com/network/config", "x")],
        );
        before
            .check_kept_by(&v3_with_side(
                &[entry("a", "1")],
                &[entry("/coreos.com/network/config", "x")],
            ))
            .expect("both stores kept");
        let err = before
            .check_kept_by(&v3_with_side(&[entry("a", "1")], &[]))
            .expect_err("the v2 key was dropped");
        assert!(err.contains("v2 store: 1 keys expected"), "{err}");
        let err = before
            .check_kept_by(&Fingerprint::of(Storage::Etcd3, &[entry("a", "1")]))
            .expect_err("a release without the v2 API cannot carry it");
        assert!(
            err.contains("serves no v2 API") && err.contains("/coreos.com/network/config"),
            "{err}"
        );
        // An empty v2 store read before and none read after is fine.
        v3_with_side(&[entry("a", "1")], &[])
            .check_kept_by(&Fingerprint::of(Storage::Etcd3, &[entry("a", "1")]))
            .expect("nothing to carry");
        // etcd3 -> etcd2: the v3 keys and the v2 keys become one v2 store.
        let rebuilt = Fingerprint::of(
            Storage::Etcd2,
            &[entry("/a", "1"), entry("/coreos.com/network/config", "x")],
        );
        before
            .check_kept_by(&rebuilt)
            .expect("v3 + v2 side = the new v2 store");
        let err = before
            .check_kept_by(&Fingerprint::of(Storage::Etcd2, &[entry("/a", "1")]))
            .expect_err("the v2 side key was lost in the rebuild");
        assert!(err.contains("2 keys expected"), "{err}");
    }

    #[test]
    fn a_v2_directory_ttl_is_inherited_by_its_children() {
        let json: Value = serde_json::json!({"node": {"dir": true, "nodes": [
            {"key": "/d", "dir": true, "ttl": 40, "expiration": "x", "nodes": [
                {"key": "/d/a", "value": "1"},
                {"key": "/d/b", "value": "2", "ttl": 90, "expiration": "x"},
                {"key": "/d/c", "value": "3", "ttl": 10, "expiration": "x"},
                {"key": "/d/e", "dir": true, "nodes": [{"key": "/d/e/f", "value": "4"}]}
            ]},
            {"key": "/p", "value": "5"}
        ]}});
        let mut out = Vec::new();
        collect_v2(&json["node"], None, &mut out);
        let ttls: Vec<(String, Option<i64>)> = out
            .iter()
            .map(|e| (String::from_utf8_lossy(&e.key).into_owned(), e.ttl))
            .collect();
        assert_eq!(
            ttls,
            [
                ("/d/a".to_string(), Some(40)),
                ("/d/b".to_string(), Some(40)),
                ("/d/c".to_string(), Some(10)),
                ("/d/e/f".to_string(), Some(40)),
                ("/p".to_string(), None),
            ]
        );
    }

    #[test]
    fn a_known_lease_counts_down_from_its_start_and_never_says_more_than_etcd() {
        let now = Instant::now();
        let granted: BTreeMap<i64, i64> = [(7, 3600), (8, 5)].into();
        let mut known = KnownLeases::granted_at(&granted, now - Duration::from_millis(2500));
        // 2.5 s since the start: three seconds begun.
        assert_eq!(known.remaining(7), Some(3597));
        assert_eq!(known.remaining(8), Some(2));
        assert_eq!(known.remaining(9), None, "not known");
        known.insert(9, 10, now - Duration::from_secs(60));
        assert_eq!(known.remaining(9), Some(0), "ran out: 0, not negative");
        assert_eq!(known.len(), 3);
        // A leased key whose TTL is unknown may expire at any moment: a
        // later read without it passes.
        let read = Instant::now() - Duration::from_millis(10);
        let unknown = Entry {
            ttl: None,
            lease: 11,
            ..entry("/registry/events/e", "1")
        };
        let before = Fingerprint::new(Storage::Etcd3, &[entry("a", "1"), unknown], None, read);
        before
            .check_kept_by(&Fingerprint::new(
                Storage::Etcd3,
                &[entry("a", "1")],
                None,
                Instant::now(),
            ))
            .expect("an unknown TTL may have run out");
    }

    #[test]
    fn digest_sums_add_and_take_out() {
        let x = Sum::of(&[b"x"]);
        let y = Sum::of(&[b"y"]);
        assert_eq!(x.add(y).sub(y), x);
        assert_eq!(x.add(y), y.add(x));
        assert_ne!(x.add(y), x);
        let max = Sum([u64::MAX; 4]);
        assert_eq!(
            max.add(Sum([0, 0, 0, 1])),
            Sum::default(),
            "wraps mod 2^256"
        );
    }

    #[test]
    fn v2_urls_and_forms_are_escaped() {
        assert_eq!(
            v2_url("http://h", b"/registry/a b/c%"),
            "http://h/v2/keys/registry/a%20b/c%25"
        );
        assert_eq!(form_encode("x=1&y".as_bytes()), "value=x%3D1%26y");
        assert_eq!(v2_path(b"foo"), b"/foo".to_vec());
        assert_eq!(v2_path(b"//foo"), b"/foo".to_vec());
    }

    #[test]
    fn v2_tree_walk_collects_leaves_with_ttls() {
        let json: Value = serde_json::json!({"node": {"dir": true, "nodes": [
            {"key": "/a", "value": "1"},
            {"key": "/d", "dir": true, "nodes": [{"key": "/d/e", "value": "2", "ttl": 30, "expiration": "x"}]},
            {"key": "/empty", "dir": true},
            {"key": "/dying", "value": "3", "expiration": "x"}
        ]}});
        let mut out = Vec::new();
        collect_v2(&json["node"], None, &mut out);
        assert_eq!(out.len(), 3);
        assert_eq!(out[0].ttl, None);
        assert_eq!(out[1].ttl, Some(30));
        assert_eq!(
            out[2].ttl,
            Some(0),
            "expiration without ttl is expiring, not permanent"
        );
    }
}
