//! This module owns whole-keyspace work against a step's etcd on its
//! isolated port: reading every key (v2 with TTLs, v3 with leases),
//! writing keys back (v2 with a TTL, v3 under a lease), deleting the v2
//! tree, and the fingerprint (key count, digests over every key, value and
//! expiry binding, v3 leases) that proves two reads of the data hold the
//! same keyspace.

use std::collections::BTreeMap;
use std::fmt;
use std::time::{Duration, Instant};

use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::health::HEALTH_KEY;
use crate::version::Storage;

/// Keys per v3 range request: K8s objects reach 1.5 MiB, so pages stay
/// small and the decoding limit generous.
const V3_PAGE: i64 = 200;

/// Largest v3 response we accept (etcd's own request limit is 1.5 MiB a
/// key; a page of them fits).
const V3_MAX_MESSAGE: usize = 512 * 1024 * 1024;

/// The gRPC status code UNIMPLEMENTED: what 3.0 … 3.2 answer to a lease
/// list (LeaseLeases came in 3.3).
const GRPC_UNIMPLEMENTED: i32 = 12;

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
        )
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
        }
    }

    /// Counts one entry of a read that began at `read_started` (our health
    /// key is skipped).
    fn add(&mut self, entry: &Entry, read_started: Instant) {
        if is_health_key(&entry.key) {
            return;
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
        if differs.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "before: {self}; after: {later}; {}",
                differs.join("; ")
            ))
        }
    }
}

/// True for the key every step writes (`etcd_version` in v3,
/// `/etcd_version` in v2): ours, not the user's data.
pub fn is_health_key(key: &[u8]) -> bool {
    v2_path(key) == format!("/{HEALTH_KEY}").as_bytes()
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
    reqwest::Client::builder()
        .no_proxy()
        .timeout(REQUEST_TIMEOUT)
        .build()
        .map_err(|err| format!("cannot build the HTTP client: {err}"))
}

/// Reads every leaf of the v2 store (recursive, with remaining TTLs).
/// Hidden v2 nodes (`_`-prefixed) are not listed by etcd and not read.
pub async fn read_v2(endpoint: &str) -> Result<Vec<Entry>, String> {
    let url = format!("{endpoint}/v2/keys/?recursive=true&sorted=true");
    let response = http_client()?
        .get(&url)
        .send()
        .await
        .map_err(|err| format!("v2 GET {url}: {err}"))?;
    let status = response.status();
    let body = response
        .text()
        .await
        .map_err(|err| format!("v2 GET {url}: {err}"))?;
    if !status.is_success() {
        return Err(format!("v2 GET {url}: HTTP {status}: {}", body.trim()));
    }
    let json: Value =
        serde_json::from_str(&body).map_err(|err| format!("v2 GET {url}: not JSON: {err}"))?;
    let mut entries = Vec::new();
    collect_v2(&json["node"], &mut entries);
    Ok(entries)
}

fn collect_v2(node: &Value, out: &mut Vec<Entry>) {
    if node["dir"].as_bool() == Some(true) {
        for child in node["nodes"].as_array().into_iter().flatten() {
            collect_v2(child, out);
        }
        return;
    }
    if let Some(key) = node["key"].as_str() {
        // A key in its last second (or past expiry, before etcd's 500 ms
        // sweep) is listed with its "expiration" but no "ttl" (0 is
        // omitted from the JSON): it is expiring, not permanent.
        let ttl = match (node["ttl"].as_i64(), node.get("expiration")) {
            (Some(ttl), _) => Some(ttl),
            (None, Some(_)) => Some(0),
            (None, None) => None,
        };
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
fn v2_url(endpoint: &str, key: &[u8]) -> String {
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

fn form_encode(value: &[u8]) -> String {
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
/// internal membership nodes, which the keys API does not list.
pub async fn delete_v2_tree(endpoint: &str) -> Result<usize, String> {
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

/// Reads every v3 key with the remaining TTL of its lease (if any), a page
/// at a time. A key whose lease has just run out (etcd has not deleted it
/// yet) comes with a TTL of 0.
pub async fn read_v3(endpoint: &str) -> Result<Vec<Entry>, String> {
    let client = v3_client(endpoint).await?;
    let mut entries = Vec::new();
    read_v3_with(&client, &mut |entry| entries.push(entry)).await?;
    Ok(entries)
}

/// Reads every v3 key (as [`read_v3`]), handing each to `sink` as its page
/// arrives, so a fingerprint never holds the keyspace in memory. Returns
/// the seconds left on each lease a key is bound to.
async fn read_v3_with(
    client: &etcd_client::Client,
    sink: &mut dyn FnMut(Entry),
) -> Result<BTreeMap<i64, i64>, String> {
    let mut kv = client.kv_client().max_decoding_message_size(V3_MAX_MESSAGE);
    let mut lease_client = client.lease_client();
    let mut ttl_of_lease: BTreeMap<i64, i64> = BTreeMap::new();
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
            let ttl = match kv.lease() {
                0 => None,
                lease => Some(match ttl_of_lease.get(&lease) {
                    Some(ttl) => *ttl,
                    None => {
                        let ttl = lease_ttl(&mut lease_client, lease).await?;
                        ttl_of_lease.insert(lease, ttl);
                        ttl
                    }
                }),
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
    Ok(ttl_of_lease)
}

/// Seconds left on a lease; 0 once it has run out (or is unknown).
async fn lease_ttl(client: &mut etcd_client::LeaseClient, lease: i64) -> Result<i64, String> {
    let answer = client
        .time_to_live(lease, None)
        .await
        .map_err(|err| format!("v3 lease {lease:x} time-to-live: {err}"))?;
    Ok(answer.ttl().max(0))
}

/// Every lease alive with its seconds left, or `None` where the API has no
/// lease list (etcd 3.0 … 3.2 answer "unimplemented").
async fn read_leases(
    client: &etcd_client::Client,
    known: &BTreeMap<i64, i64>,
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
        let ttl = match known.get(&lease.id()) {
            Some(ttl) => *ttl,
            None => lease_ttl(&mut lease_client, lease.id()).await?,
        };
        leases.insert(lease.id(), ttl);
    }
    Ok(Some(leases))
}

/// Reads the whole keyspace a step's etcd serves through `storage`'s API:
/// every entry, and the fingerprint of the read.
pub async fn read_all(
    endpoint: &str,
    storage: Storage,
) -> Result<(Vec<Entry>, Fingerprint), String> {
    let started = Instant::now();
    match storage {
        Storage::Etcd2 => {
            let entries = read_v2(endpoint).await?;
            let fingerprint = Fingerprint::new(storage, &entries, None, started);
            Ok((entries, fingerprint))
        }
        Storage::Etcd3 => {
            let client = v3_client(endpoint).await?;
            let mut entries = Vec::new();
            let known = read_v3_with(&client, &mut |entry| entries.push(entry)).await?;
            let leases = read_leases(&client, &known).await?;
            let fingerprint = Fingerprint::new(storage, &entries, leases.as_ref(), started);
            Ok((entries, fingerprint))
        }
    }
}

/// The fingerprint of the keyspace a step's etcd serves. A v3 keyspace is
/// hashed page by page and never held whole (a 2 GiB backend stays out of
/// our memory); the v2 API has no paging, so a v2 store is read at once.
pub async fn read_fingerprint(endpoint: &str, storage: Storage) -> Result<Fingerprint, String> {
    match storage {
        Storage::Etcd2 => Ok(read_all(endpoint, storage).await?.1),
        Storage::Etcd3 => {
            let started = Instant::now();
            let client = v3_client(endpoint).await?;
            let mut fingerprint = Fingerprint::empty(storage);
            let known =
                read_v3_with(&client, &mut |entry| fingerprint.add(&entry, started)).await?;
            let leases = read_leases(&client, &known).await?;
            Ok(fingerprint.finish(leases.as_ref(), started))
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
    fn fingerprint_ignores_order_the_health_key_and_the_leading_slash() {
        let a = [
            entry("/registry/a", "1"),
            entry("/registry/b", "2"),
            entry("/etcd_version", "3.3.25"),
        ];
        let b = [
            entry("registry/b", "2"),
            entry("registry/a", "1"),
            entry("etcd_version", "3.5.16"),
        ];
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
        collect_v2(&json["node"], &mut out);
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
