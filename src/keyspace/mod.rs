//! This module owns whole-keyspace work against a step's etcd on its
//! isolated port: reading every key (v2 with TTLs, v3 with leases),
//! writing keys back (v2 with a TTL, v3 under a lease), deleting the v2
//! tree, and the fingerprint (key count, digests over every key, value and
//! expiry binding, v3 leases) that proves two reads of the data hold the
//! same keyspace. Data can hold keys in both stores: etcd3 data keys
//! written through the v2 API (flannel's `/coreos.com/network/config`, old
//! tooling), etcd2 data served by 3.x keys written through the v3 API (the
//! Kubernetes tool's `etcd_version` health key). Wherever the release
//! serves the other API, those are read and fingerprinted too, as the
//! data's side store.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

use crate::version::{Storage, VersionPair};

mod ranges;
mod v2;
mod v3;

pub use v2::{delete_v2_tree, is_hidden_v2, read_v2, write_all_v2, write_v2};
pub(crate) use v2::{form_encode, v2_url, V2Answer, V2Node, V2_NOT_FOUND};
pub use v3::{traced_read, v3_client, KvHash, ReadLimits, RequestedRange, TracedRead};

/// What a keyspace call could not do, naming the endpoint (and the key,
/// lease, revision or URL) it was about.
#[derive(Debug, thiserror::Error)]
pub enum KeyspaceError {
    /// No v3 client could connect.
    #[error("v3 connect {endpoint}")]
    Connect {
        endpoint: String,
        #[source]
        source: etcd_client::Error,
    },
    /// A v3 range request failed.
    #[error("v3 range from {key:?} on {endpoint}")]
    Range {
        endpoint: String,
        key: String,
        #[source]
        source: etcd_client::Error,
    },
    /// A lease's time-to-live could not be read.
    #[error("v3 lease {lease:x} time-to-live on {endpoint}")]
    Lease {
        endpoint: String,
        lease: i64,
        #[source]
        source: etcd_client::Error,
    },
    /// The leases could not be listed.
    #[error("v3 lease list on {endpoint}")]
    LeaseList {
        endpoint: String,
        #[source]
        source: etcd_client::Error,
    },
    /// etcd could not hash its keyspace at a revision (e.g. compacted).
    #[error("v3 hash of the keyspace at revision {revision} on {endpoint}")]
    Hash {
        endpoint: String,
        revision: i64,
        #[source]
        source: etcd_client::Error,
    },
    /// The changes after a revision could not be listed.
    #[error("v3 changes after revision {revision} on {endpoint}: {detail}")]
    Watch {
        endpoint: String,
        revision: i64,
        detail: String,
    },
    /// The HTTP client for the v2 API could not be built.
    #[error("cannot build the HTTP client")]
    HttpClient(#[source] reqwest::Error),
    /// A v2 request got no answer.
    #[error("v2 {method} {url}")]
    V2Request {
        method: &'static str,
        url: String,
        #[source]
        source: reqwest::Error,
    },
    /// A v2 request was answered with an error status.
    #[error("v2 {method} {url}: HTTP {status}: {body}")]
    V2Status {
        method: &'static str,
        url: String,
        status: u16,
        body: String,
    },
    /// A v2 answer was not the JSON the keys API sends.
    #[error("v2 GET {url}: not JSON")]
    V2Json {
        url: String,
        #[source]
        source: serde_json::Error,
    },
    /// A v2 answer that should name a node names none.
    #[error("v2 GET {url}: the answer holds no node")]
    V2NoNode { url: String },
    /// etcd2 data, but the release serves no v2 API.
    #[error("{endpoint} serves no v2 API (404 on /v2/keys/), but the data is etcd2 storage")]
    NoV2Api { endpoint: String },
}

/// The error with its causes on one line, for callers that report work
/// failures as text.
impl From<KeyspaceError> for String {
    fn from(err: KeyspaceError) -> String {
        crate::log::error_chain(&err)
    }
}

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
    /// The v3 revisions this run's health writes made, each proven to
    /// hold nothing but a health key (see `health`). A revision is one
    /// transaction, so a run of revisions that are all in here saw no
    /// change but ours.
    pub revisions: BTreeSet<i64>,
}

impl Ours {
    /// The health keys of the run identified by `run` (random hex).
    pub fn for_run(run: &str) -> Ours {
        Ours {
            key_prefix: format!("/etcd-migrate-health-{run}-"),
            ..Ours::default()
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

    /// True when every revision after `after` up to `upto` is one this run
    /// made: nothing but our health writes changed the keyspace between.
    /// (A write whose answer was lost is not in here, so it only ever
    /// makes this false.)
    pub fn made_every_revision(&self, after: i64, upto: i64) -> bool {
        // None at all is every one; and a range ending before it starts
        // is one `range` refuses (it panics).
        upto == after
            || (upto > after
                && i64::try_from(self.revisions.range(after + 1..=upto).count()).ok()
                    == Some(upto - after))
    }
}

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

/// How many writes a bulk load into a fresh copy keeps in flight (the v2
/// keys of a rollback to etcd2, the leases and keys of a storage
/// migration). Neither API batches writes, but etcd commits the proposals
/// that wait together (one raft append, one fsync), so keys go in at its
/// batching rate rather than at one round trip and one fsync each.
pub const WRITES_IN_FLIGHT: usize = 64;

/// Runs `write` on every item, `in_flight` at a time, in no set order;
/// the first error ends it (the writes still in flight are dropped). For
/// writes whose order does not matter: each key written once, into a copy
/// that is read back before it is used.
pub async fn each_in_flight<T, E, Fut>(
    items: impl IntoIterator<Item = T>,
    in_flight: usize,
    write: impl FnMut(T) -> Fut,
) -> Result<(), E>
where
    Fut: std::future::Future<Output = Result<(), E>>,
{
    use futures_util::{StreamExt, TryStreamExt};
    futures_util::stream::iter(items)
        .map(write)
        .buffer_unordered(in_flight.max(1))
        .try_for_each(|()| async { Ok(()) })
        .await
}

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
    /// The data's other store, where the release serves its API: etcd3
    /// data's v2 store (`None` on 3.6+, which has no v2 API), etcd2 data's
    /// v3 keyspace (3.x; `None` on 2.x).
    side: Option<Box<Fingerprint>>,
    /// v3 on 3.3+: etcd's own hash of the keyspace history at the revision
    /// read, for the next step to check by.
    hash: Option<KvHash>,
    /// v3: what this etcd said of the revision the earlier read was made
    /// at, where both had a hash.
    since: Option<SinceCheck>,
    /// True when `digest`, `content`, `expiring` and `sample` cover every
    /// entry (a whole read, or one derived from it); false for a baseline
    /// fingerprinted by etcd's hash alone
    /// ([`read_fingerprint_by_hash`]): then only `keys`, `leases`, `hash`
    /// and the v2 side store hold, and a later read is proven against it
    /// by etcd's hash at its revision or not at all.
    whole: bool,
}

/// What a later etcd says of the revision an earlier read was made at.
#[derive(Debug, Clone)]
struct SinceCheck {
    /// The earlier read's hash.
    expected: KvHash,
    /// This etcd's hash at the same revision.
    found: KvHash,
    /// Changes since that revision that are neither ours nor a lease
    /// running out: each a difference.
    strays: Vec<String>,
    /// Keys counted by etcd at this read's revision, where the keyspace
    /// was not read whole.
    counted: Option<usize>,
}

impl SinceCheck {
    /// Sorts `changes` (ours already left out): a delete of a key whose
    /// lease is gone now is the lease running out; anything else is a
    /// stray.
    fn with_strays(mut self, changes: &[v3::Change], alive: Option<&BTreeMap<i64, i64>>) -> Self {
        self.strays = changes
            .iter()
            .filter(|change| !is_expiry(change, alive))
            .map(|change| {
                format!(
                    "{:?} was {} at revision {}, after the last step's read at {}",
                    String::from_utf8_lossy(&change.key),
                    if change.deleted { "deleted" } else { "written" },
                    change.revision,
                    self.expected.revision
                )
            })
            .collect();
        self
    }
}

/// True for the delete of a leased key whose lease is no longer alive.
fn is_expiry(change: &v3::Change, alive: Option<&BTreeMap<i64, i64>>) -> bool {
    change.deleted
        && change.lease_before != 0
        && !alive.is_some_and(|alive| alive.contains_key(&change.lease_before))
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
        // By hash alone: the revisions and hashes go in their own lines
        // (`keyspace fingerprinted by etcd's hash`, `keyspace proven by
        // etcd's hash`); every fingerprint derived from it reads the same.
        match self.whole {
            false => write!(f, " by etcd's hash")?,
            true => write!(
                f,
                " {} expiring digest:{} content:{}",
                self.expiring.len(),
                self.digest.short(),
                self.content.short()
            )?,
        }
        if let Some(side) = &self.side {
            write!(f, " + {}: {side}", store_name(side.storage))?;
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

    /// The ids of the v3 leases it found alive (none where it could not
    /// list them).
    fn lease_ids(&self) -> Vec<i64> {
        self.leases
            .iter()
            .flat_map(|leases| leases.keys().copied())
            .collect()
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
            side: None,
            hash: None,
            since: None,
            whole: true,
        }
    }

    /// The fingerprint of what this etcd serves, derived from `self` (the
    /// last step's read) without reading the keyspace: etcd's hash at
    /// `self`'s revision (in `since`) proves the keyspace was the same
    /// there, and `changes` (ours left out) are all that happened since:
    /// keys whose lease ran out are taken out (with the values the history
    /// gives), anything else is a stray the check reports. `counted` is
    /// etcd's own key count now, where the history was read (with no change
    /// but ours, the count is `self`'s); `now` is the hash the next step
    /// proves itself by: `self`'s own where nothing changed, else this
    /// etcd's hash now (so no expiry is ever taken out twice).
    fn derived(
        &self,
        now: KvHash,
        since: SinceCheck,
        changes: &[v3::Change],
        leases: Option<&BTreeMap<i64, i64>>,
        counted: Option<usize>,
        read_started: Instant,
    ) -> Fingerprint {
        let mut derived = self.clone();
        derived.side = None;
        for change in changes.iter().filter(|c| is_expiry(c, leases)) {
            let entry = Entry {
                key: change.key.clone(),
                value: change.value_before.clone(),
                ttl: Some(0),
                lease: change.lease_before,
            };
            derived.take_out(&entry);
        }
        derived.hash = Some(now);
        derived.since = Some(SinceCheck {
            counted,
            ..since.with_strays(changes, leases)
        });
        derived.finish(leases, read_started)
    }

    /// Takes one entry's part out (a key that expired).
    fn take_out(&mut self, entry: &Entry) {
        let path = v2_path(&entry.key);
        let own = Sum::of(&[&entry.key, &entry.value, &entry.lease.to_be_bytes()]);
        let neutral = Sum::of(&[&path, &entry.value, b"expires"]);
        self.digest = self.digest.sub(own);
        self.content = self.content.sub(neutral);
        self.keys = self.keys.saturating_sub(1);
        let path_hash: [u8; 32] = Sha256::digest(&path).into();
        self.expiring.remove(&path_hash);
    }

    /// The same, with the fingerprint of the data's other store beside it
    /// (etcd3 data: its v2 store; etcd2 data: its v3 keyspace).
    pub fn with_side(mut self, side: Option<Fingerprint>) -> Self {
        self.side = side.map(Box::new);
        self
    }

    /// The fingerprint of the data's other store, if it was read.
    pub fn side(&self) -> Option<&Fingerprint> {
        self.side.as_deref()
    }

    /// The fingerprint of the v2 store that etcd3 data holds beside its v3
    /// keyspace, if it was read.
    pub fn v2_side(&self) -> Option<&Fingerprint> {
        self.side().filter(|side| side.storage == Storage::Etcd2)
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

    /// A baseline computed offline from the stopped data (`ondisk`): `keys`
    /// live keys, etcd's hash at the data's revision (which the first
    /// step's etcd must give too), the leases with their granted TTLs (an
    /// etcd that starts on the data renews each to its full TTL), and the
    /// v2 store beside. Like a by-hash read, it is not `whole`.
    pub fn offline(
        keys: usize,
        hash: KvHash,
        leases: &BTreeMap<i64, i64>,
        side: Option<Fingerprint>,
    ) -> Fingerprint {
        let mut fingerprint = Fingerprint::empty(Storage::Etcd3);
        fingerprint.keys = keys;
        fingerprint.hash = Some(hash);
        fingerprint.whole = false;
        fingerprint
            .finish(Some(leases), Instant::now())
            .with_side(side)
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
        if let Some(since) = &later.since {
            differs.extend(self.hash_differences(since, later));
        }
        if !self.whole {
            if let Some(unproven) = self.unproven_by_hash(later) {
                return Err(unproven);
            }
        }
        if self.storage == later.storage {
            differs.extend(self.store_differences(later));
            if let Some(before) = &self.side {
                let name = store_name(before.storage);
                match later.side.as_deref().filter(|s| s.storage == before.storage) {
                    Some(after) => differs.extend(
                        before
                            .store_differences(after)
                            .into_iter()
                            .map(|d| format!("{name}: {d}")),
                    ),
                    None if before.keys > 0 => differs.push(format!(
                        "the {name} held {} keys (e.g. {:?}) and this release serves no {} API, so they cannot be carried",
                        before.keys,
                        before.sample,
                        match before.storage {
                            Storage::Etcd2 => "v2",
                            Storage::Etcd3 => "v3",
                        }
                    )),
                    None => {}
                }
            }
        } else {
            // A storage change: both stores become the new one. etcd3 ->
            // etcd2: the v3 keys and the v2 side store make the new v2
            // store. etcd2 -> etcd3: `etcdctl migrate` writes the v2 keys
            // beside the v3 keys the data already held; the v2 store is
            // then emptied (or kept, with --keep-v2-keys) by design.
            differs.extend(self.merged_with_side().store_differences(later));
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

    /// Why `later` cannot be proven against `self`, a fingerprint by
    /// etcd's hash alone: only a read checked by etcd's hash at `self`'s
    /// revision can be (no digest exists to compare a whole read with).
    /// No plan asks for it (a baseline is read by hash only before in-place
    /// etcd3 steps on releases with a hash); this keeps a mistake from
    /// passing unproven.
    fn unproven_by_hash(&self, later: &Fingerprint) -> Option<String> {
        let revision = self.hash.map_or(0, |h| h.revision);
        if self.storage != later.storage {
            return Some(format!(
                "before: {self}; after: {later}; the earlier read was made by etcd's hash at revision {revision} only, which cannot be compared with a read through another storage"
            ));
        }
        if later.since.is_none() {
            return Some(format!(
                "before: {self}; after: {later}; the earlier read was made by etcd's hash at revision {revision} only, and this etcd did not hash that revision: nothing proves the keyspace kept"
            ));
        }
        None
    }

    /// What etcd's hashes and history say differs since `self` was read.
    fn hash_differences(&self, since: &SinceCheck, later: &Fingerprint) -> Vec<String> {
        let mut differs = Vec::new();
        if self.hash != Some(since.expected) {
            differs.push(format!(
                "the hash to check by is not this read's ({:?}, {:?})",
                self.hash, since.expected
            ));
        }
        if since.found.hash != since.expected.hash {
            differs.push(format!(
                "etcd's hash of the keyspace at revision {} differs: {:08x} before, {:08x} now (compacted at {} and {})",
                since.expected.revision,
                since.expected.hash,
                since.found.hash,
                since.expected.compact_revision,
                since.found.compact_revision
            ));
        }
        differs.extend(since.strays.iter().cloned());
        if let Some(counted) = since.counted {
            if counted != later.keys {
                differs.push(format!(
                    "{} keys expected, etcd counts {counted}",
                    later.keys
                ));
            }
        }
        differs
    }

    /// The data's two stores as one set of entries (for a comparison by
    /// content only, across a storage change).
    fn merged_with_side(&self) -> Fingerprint {
        let mut merged = self.clone();
        if let Some(side) = merged.side.take() {
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
        // A fingerprint by hash alone has no digest: etcd's hash at its
        // revision, the history since and etcd's count (see
        // `hash_differences`) prove the keys and values; the leases are
        // still compared below.
        let whole = self.whole;
        if whole && later.keys != keys {
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
            if whole && later.digest != digest {
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

/// How messages name a store read beside the data's own.
fn store_name(storage: Storage) -> &'static str {
    match storage {
        Storage::Etcd2 => "v2 store",
        Storage::Etcd3 => "v3 keyspace",
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

/// A whole read of the data a step's etcd serves.
#[derive(Debug, Clone)]
pub struct Read {
    /// Every entry of the data's own storage.
    pub entries: Vec<Entry>,
    /// The data's other store (etcd3 data: the leaves of its v2 store;
    /// etcd2 data served by 3.x: its v3 keys), empty where none was read.
    pub side: Vec<Entry>,
    /// The fingerprint of both.
    pub fingerprint: Fingerprint,
}

/// Reads everything a step's etcd serves of data as `served` (the
/// serving release and the data's storage): every entry, the data's other
/// store too where the release serves its API (etcd3 data: the v2 store;
/// etcd2 data on 3.x: the v3 keyspace), and the fingerprint of the read;
/// this run's health keys and leases are left out. `known`: the leases'
/// TTLs, for a release that cannot tell them (see [`KnownLeases`]).
pub async fn read_all(
    endpoint: &str,
    served: VersionPair,
    ours: &Ours,
    hidden: &[String],
    known: &KnownLeases,
) -> Result<Read, KeyspaceError> {
    let started = Instant::now();
    match served.storage {
        Storage::Etcd2 => {
            let entries = v2::read_v2_store(endpoint, ours, hidden).await?;
            let mut fingerprint = Fingerprint::new(Storage::Etcd2, &entries, None, started);
            let mut side = Vec::new();
            if served.version.has_v3_api() {
                let client = v3::v3_client(endpoint).await?;
                let whole =
                    read_v3_whole(&client, endpoint, ours, None, known, None, &mut |entry| {
                        side.push(entry)
                    })
                    .await?;
                let v3 = Fingerprint::new(Storage::Etcd3, &side, whole.leases.as_ref(), started);
                fingerprint = fingerprint.with_side(Some(v3));
            }
            Ok(Read {
                entries,
                side,
                fingerprint,
            })
        }
        Storage::Etcd3 => {
            let client = v3::v3_client(endpoint).await?;
            let mut entries = Vec::new();
            let whole = read_v3_whole(
                &client,
                endpoint,
                ours,
                Some(hidden),
                known,
                None,
                &mut |entry| entries.push(entry),
            )
            .await?;
            let side_fingerprint = whole
                .side
                .as_ref()
                .map(|side| Fingerprint::new(Storage::Etcd2, side, None, started));
            let mut fingerprint =
                Fingerprint::new(Storage::Etcd3, &entries, whole.leases.as_ref(), started)
                    .with_side(side_fingerprint);
            fingerprint.hash = whole.hash;
            fingerprint.since = whole.since;
            Ok(Read {
                entries,
                side: whole.side.unwrap_or_default(),
                fingerprint,
            })
        }
    }
}

/// The baseline's fingerprint of an etcd3 keyspace by etcd's own hash,
/// without reading it (issue 12: a whole read of 200k keys costs as much
/// as the etcd start it follows): `HashKV` at the current revision, etcd's
/// key count there, the leases, and the v2 side store (read whole: the v2
/// API has no hash). The next in-place step proves itself against it the
/// way every in-place step proves itself against the last: its etcd hashes
/// the same revision, and the history since holds only our writes and
/// expiries. `None` where the release has no `HashKV` (before 3.3): read
/// the keyspace whole instead.
pub async fn read_fingerprint_by_hash(
    endpoint: &str,
    ours: &Ours,
    hidden: &[String],
) -> Result<Option<Fingerprint>, KeyspaceError> {
    let started = Instant::now();
    let client = v3::v3_client(endpoint).await?;
    let Some(hash) = v3::hash_kv(&client, endpoint, 0).await? else {
        return Ok(None);
    };
    let keys = v3::count_keys(&client, endpoint, hash.revision, ours).await?;
    let leases = v3::read_leases(&client, endpoint, &BTreeMap::new(), ours, &[]).await?;
    let side = v2::read_v2(endpoint, ours, hidden)
        .await?
        .map(|side| Fingerprint::new(Storage::Etcd2, &side, None, started));
    let mut fingerprint = Fingerprint::empty(Storage::Etcd3);
    fingerprint.keys = keys;
    fingerprint.hash = Some(hash);
    fingerprint.whole = false;
    crate::log::info(
        "keyspace fingerprinted by etcd's hash",
        &[
            ("revision", hash.revision.into()),
            ("hash", format!("{:08x}", hash.hash).into()),
            ("keys", keys.into()),
        ],
    );
    Ok(Some(
        fingerprint.finish(leases.as_ref(), started).with_side(side),
    ))
}

/// The fingerprint of the data a step's etcd serves, from a whole read. A
/// v3 keyspace is hashed window by window and never held whole (a 2 GiB
/// backend stays out of our memory); the v2 API has no paging, so a v2
/// store is read at once.
pub async fn read_fingerprint(
    endpoint: &str,
    served: VersionPair,
    ours: &Ours,
    hidden: &[String],
    known: &KnownLeases,
) -> Result<Fingerprint, KeyspaceError> {
    read_fingerprint_since(endpoint, served, ours, hidden, known, None).await
}

/// The fingerprint of the data a step's etcd serves, proven against
/// `before` (what the last step read) where etcd can check itself: when
/// both are v3, `before` carries etcd's hash at the revision it read
/// (HashKV, 3.3+) and this etcd still holds that revision, the v3 keyspace
/// is not read at all. This etcd hashes the same revision (equal hashes:
/// the same keys, values, leases and revisions up to there, the whole
/// history since the last compaction), the changes made since (our health
/// writes, expired leases) are listed from its history, and its hash at
/// its own revision is kept for the next step. Leases with their TTLs and
/// the v2 side store are read as in a whole read. Anywhere else (no
/// `before`, v2, a release without HashKV) the keyspace is read whole.
pub async fn read_fingerprint_since(
    endpoint: &str,
    served: VersionPair,
    ours: &Ours,
    hidden: &[String],
    known: &KnownLeases,
    before: Option<&Fingerprint>,
) -> Result<Fingerprint, KeyspaceError> {
    let started = Instant::now();
    if served.storage == Storage::Etcd2 {
        return Ok(read_all(endpoint, served, ours, hidden, known)
            .await?
            .fingerprint);
    }
    let client = v3::v3_client(endpoint).await?;
    let anchor = before
        .filter(|before| before.storage == Storage::Etcd3)
        .and_then(|before| before.hash);
    if let (Some(anchor), Some(before)) = (anchor, before) {
        if let Some(proven) =
            prove_since(&client, endpoint, before, anchor, ours, hidden, started).await?
        {
            return Ok(proven);
        }
    }
    let mut fingerprint = Fingerprint::empty(Storage::Etcd3);
    let whole = read_v3_whole(
        &client,
        endpoint,
        ours,
        Some(hidden),
        known,
        before,
        &mut |entry| fingerprint.add(&entry, started),
    )
    .await?;
    fingerprint.hash = whole.hash;
    fingerprint.since = whole.since;
    let side = whole
        .side
        .map(|side| Fingerprint::new(Storage::Etcd2, &side, None, started));
    Ok(fingerprint
        .finish(whole.leases.as_ref(), started)
        .with_side(side))
}

/// `before` proven kept by etcd's hash at `anchor` (the revision it was
/// hashed at), without reading the keyspace; `None` where the release has
/// no HashKV (then the keyspace is read whole).
///
/// The usual case costs one HashKV: every revision since `anchor` is one
/// of our health writes, so the keyspace is `before`'s, and the next step
/// proves itself at the same `anchor` (no change since, so nothing is
/// taken out twice). Anything else is read from etcd's history: its
/// count, the changes since (leases running out are taken out, anything
/// else fails the check) and its hash now, the next step's anchor.
async fn prove_since(
    client: &etcd_client::Client,
    endpoint: &str,
    before: &Fingerprint,
    anchor: KvHash,
    ours: &Ours,
    hidden: &[String],
    started: Instant,
) -> Result<Option<Fingerprint>, KeyspaceError> {
    // etcd's count at the anchor beside its hash there (the offline
    // baseline's count, computed by us, is checked by it too), and the
    // leases and the v2 store beside: all at once. Where the history must
    // be read, the leases are read again after it (a lease that ran out
    // since must not look alive to the history's deletes).
    let no_ttls = BTreeMap::new();
    let expected_leases = before.lease_ids();
    let (hashed, counted_there, leases_beside, side) = tokio::join!(
        v3::hash_kv_and_head(client, endpoint, anchor.revision),
        v3::count_keys(client, endpoint, anchor.revision, ours),
        v3::read_leases(client, endpoint, &no_ttls, ours, &expected_leases),
        v2::read_v2(endpoint, ours, hidden),
    );
    let Some((there, head)) = hashed? else {
        return Ok(None);
    };
    let since = SinceCheck {
        expected: anchor,
        found: there,
        strays: Vec::new(),
        counted: None,
    };
    let by_revisions = ours.made_every_revision(anchor.revision, head);
    let (now, counted, changes) = if by_revisions {
        (anchor, Some(counted_there?), Vec::new())
    } else {
        let Some(now) = v3::hash_kv(client, endpoint, head).await? else {
            return Ok(None);
        };
        let counted = v3::count_keys(client, endpoint, now.revision, ours).await?;
        let changes = changes_since(client, endpoint, before, anchor, now, ours, counted).await?;
        // No change but ours: the anchor still holds, and stays.
        let carried = if changes.is_empty() { anchor } else { now };
        (carried, Some(counted), changes)
    };
    let leases = if by_revisions {
        leases_beside?
    } else {
        v3::read_leases(client, endpoint, &BTreeMap::new(), ours, &expected_leases).await?
    };
    let side = side?.map(|side| Fingerprint::new(Storage::Etcd2, &side, None, started));
    crate::log::info(
        "keyspace proven by etcd's hash",
        &[
            ("revision", anchor.revision.into()),
            ("hash", format!("{:08x}", there.hash).into()),
            ("changes_since", changes.len().into()),
            ("now", head.into()),
            (
                "by",
                if by_revisions {
                    "revisions all ours"
                } else {
                    "history"
                }
                .into(),
            ),
        ],
    );
    Ok(Some(
        before
            .derived(now, since, &changes, leases.as_ref(), counted, started)
            .with_side(side),
    ))
}

/// What a whole v3 read gives besides its entries: etcd's hash at the
/// revision read, what it says of `before`'s revision (with the changes
/// since that are not expiries), the leases with their TTLs, and the v2
/// side store where the release serves the v2 API.
struct WholeV3 {
    hash: Option<KvHash>,
    since: Option<SinceCheck>,
    leases: Option<BTreeMap<i64, i64>>,
    side: Option<Vec<Entry>>,
}

/// Reads the whole v3 keyspace `client` serves into `sink` (this run's
/// keys and leases left out), then etcd's hash at that revision, the check
/// against `before`, the leases and, given the `hidden` v2 nodes to ask
/// for, the v2 side store of etcd3 data: the one whole read behind
/// [`read_all`] and [`read_fingerprint_since`].
async fn read_v3_whole(
    client: &etcd_client::Client,
    endpoint: &str,
    ours: &Ours,
    hidden: Option<&[String]>,
    known: &KnownLeases,
    before: Option<&Fingerprint>,
    sink: &mut dyn FnMut(Entry),
) -> Result<WholeV3, KeyspaceError> {
    let (ttls, revision) = v3::read_v3_with(
        client,
        endpoint,
        ours,
        known,
        ReadLimits::default(),
        sink,
        None,
    )
    .await?;
    let hash = v3::hash_kv(client, endpoint, revision).await?;
    let since = check_since(client, endpoint, before, hash, ours).await?;
    let leases = v3::read_leases(client, endpoint, &ttls, ours, &[]).await?;
    let since = since.map(|(since, changes)| since.with_strays(&changes, leases.as_ref()));
    let side = match hidden {
        Some(hidden) => v2::read_v2(endpoint, ours, hidden).await?,
        None => None,
    };
    Ok(WholeV3 {
        hash,
        since,
        leases,
        side,
    })
}

/// What this etcd says of the revision `before` was read at: its hash
/// there and every change since, up to `now` (this read's revision); `None`
/// when `before` has no hash or this release none.
async fn check_since(
    client: &etcd_client::Client,
    endpoint: &str,
    before: Option<&Fingerprint>,
    now: Option<KvHash>,
    ours: &Ours,
) -> Result<Option<(SinceCheck, Vec<v3::Change>)>, KeyspaceError> {
    let (Some(before), Some(earlier), Some(now)) = (before, before.and_then(|b| b.hash), now)
    else {
        return Ok(None);
    };
    if before.storage != Storage::Etcd3 {
        return Ok(None);
    }
    let Some(there) = v3::hash_kv(client, endpoint, earlier.revision).await? else {
        return Ok(None);
    };
    let changes = v3::changes_since(client, endpoint, earlier.revision, now.revision)
        .await?
        .into_iter()
        .filter(|change| !ours.holds_key(&change.key))
        .collect();
    Ok(Some((
        SinceCheck {
            expected: earlier,
            found: there,
            strays: Vec::new(),
            counted: None,
        },
        changes,
    )))
}

/// Every change since `anchor` up to `now` but ours. `counted` (etcd's
/// count at `now`, ours left out) allows the quick answer for a count
/// equal to `before`'s with no key but ours written since: no change at
/// all (a key written and deleted again in between leaves the keyspace as
/// it was); anything else is read from the history.
async fn changes_since(
    client: &etcd_client::Client,
    endpoint: &str,
    before: &Fingerprint,
    anchor: KvHash,
    now: KvHash,
    ours: &Ours,
    counted: usize,
) -> Result<Vec<v3::Change>, KeyspaceError> {
    if counted == before.keys
        && !v3::written_since(client, endpoint, anchor.revision, now.revision, ours).await?
    {
        return Ok(Vec::new());
    }
    let mut changes = v3::changes_since(client, endpoint, anchor.revision, now.revision).await?;
    changes.retain(|change| !ours.holds_key(&change.key));
    Ok(changes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    fn node_of(json: Value) -> v2::V2Node {
        serde_json::from_value(json["node"].clone()).expect("a v2 node")
    }

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
    fn a_run_of_revisions_is_ours_only_when_every_one_is() {
        let mut ours = Ours::for_run("abc");
        assert!(ours.made_every_revision(10, 10), "nothing since");
        assert!(!ours.made_every_revision(10, 11), "one not ours");
        ours.revisions.extend([11, 12, 14, 15]);
        assert!(ours.made_every_revision(10, 12));
        assert!(
            !ours.made_every_revision(10, 15),
            "13 was someone else's (a lease running out, say)"
        );
        assert!(ours.made_every_revision(13, 15));
        assert!(!ours.made_every_revision(9, 12), "10 is not ours");
        assert!(
            !ours.made_every_revision(12, 11),
            "a head behind the anchor"
        );
        // A head at the anchor itself once revisions of ours exist (a hash
        // answered before a write of ours): this once panicked in `range`.
        assert!(ours.made_every_revision(15, 15), "nothing since");
        assert!(ours.made_every_revision(12, 12));
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
            .with_side(Some(Fingerprint::of(Storage::Etcd2, side)))
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

    /// etcd2 data served by 3.x with a v3 key beside its v2 store (the
    /// Kubernetes tool's `etcd_version`): "51 keys expected, 52 found" put
    /// such data on hold after its storage migration.
    #[test]
    fn the_v3_keys_of_etcd2_data_are_kept_and_come_through_its_storage_migration() {
        let v2 = [entry("/registry/a", "1"), entry("/registry/b", "2")];
        let v3_side = [entry("etcd_version", "3.3.25")];
        let before = Fingerprint::of(Storage::Etcd2, &v2)
            .with_side(Some(Fingerprint::of(Storage::Etcd3, &v3_side)));
        assert!(before.v2_side().is_none(), "the side store is v3");
        assert!(
            before.to_string().contains("+ v3 keyspace: v3 1 keys"),
            "{before}"
        );
        // An in-place step of etcd2 data keeps both stores.
        before
            .check_kept_by(&before.clone())
            .expect("both stores kept");
        let err = before
            .check_kept_by(
                &Fingerprint::of(Storage::Etcd2, &v2)
                    .with_side(Some(Fingerprint::of(Storage::Etcd3, &[]))),
            )
            .expect_err("the v3 key was lost");
        assert!(err.contains("v3 keyspace: 1 keys expected"), "{err}");
        // etcd2 -> etcd3: the v2 keys join the v3 keys.
        let converted = Fingerprint::of(
            Storage::Etcd3,
            &[
                entry("/registry/a", "1"),
                entry("/registry/b", "2"),
                entry("etcd_version", "3.3.25"),
            ],
        );
        before
            .check_kept_by(&converted)
            .expect("v2 keys + v3 keys = the new v3 keyspace");
        let err = before
            .check_kept_by(&Fingerprint::of(
                Storage::Etcd3,
                &[entry("/registry/a", "1"), entry("/registry/b", "2")],
            ))
            .expect_err("the v3 key was lost in the conversion");
        assert!(err.contains("3 keys expected"), "{err}");
        let err = before
            .check_kept_by(&Fingerprint::of(
                Storage::Etcd3,
                &[
                    entry("/registry/a", "1"),
                    entry("/registry/b", "2"),
                    entry("etcd_version", "v2"),
                ],
            ))
            .expect_err("the v3 key's value was overwritten");
        assert!(err.contains("differ"), "{err}");
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
        v2::collect_v2(&node_of(json), None, &mut out);
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

    fn kv_hash(revision: i64, hash: u32) -> KvHash {
        KvHash {
            revision,
            hash,
            compact_revision: 0,
        }
    }

    fn change(key: &str, deleted: bool, lease: i64) -> v3::Change {
        v3::Change {
            key: key.as_bytes().to_vec(),
            deleted,
            lease_before: lease,
            value_before: b"2".to_vec(),
            revision: 12,
        }
    }

    #[test]
    fn a_fingerprint_proven_by_hash_keeps_the_digest_and_fails_on_any_other_change() {
        let now = Instant::now();
        let mut before = v3(
            &[entry("a", "1"), leased("b", "2", 7, 2)],
            &[(7, 2)],
            now - Duration::from_secs(10),
        );
        before.hash = Some(kv_hash(10, 0xabcd));
        let since = |found: u32| SinceCheck {
            expected: kv_hash(10, 0xabcd),
            found: kv_hash(10, found),
            strays: Vec::new(),
            counted: None,
        };
        // The same hash, nothing since: the same fingerprint.
        let kept = before.derived(
            kv_hash(14, 1),
            since(0xabcd),
            &[],
            Some(&[(7, 1)].into()),
            Some(2),
            now,
        );
        before.check_kept_by(&kept).expect("proven by hash");
        assert!(kept.same_content(&before));
        // Lease 7 ran out and took b with it: still kept.
        let expired = before.derived(
            kv_hash(14, 1),
            since(0xabcd),
            &[change("b", true, 7)],
            Some(&BTreeMap::new()),
            Some(1),
            now,
        );
        assert_eq!(expired.keys, 1);
        before
            .check_kept_by(&expired)
            .expect("b expired with its lease");
        // Another hash at the same revision: the history differs.
        let err = before
            .check_kept_by(&before.derived(kv_hash(14, 1), since(0xbeef), &[], None, Some(2), now))
            .expect_err("another hash");
        assert!(
            err.contains("etcd's hash of the keyspace at revision 10 differs"),
            "{err}"
        );
        // A key written, or deleted while its lease lives, since: strays.
        for stray in [
            change("c", false, 0),
            change("b", true, 7),
            change("a", true, 0),
        ] {
            let err = before
                .check_kept_by(&before.derived(
                    kv_hash(14, 1),
                    since(0xabcd),
                    &[stray],
                    Some(&[(7, 1)].into()),
                    Some(2),
                    now,
                ))
                .expect_err("a stray change");
            assert!(err.contains("after the last step's read at 10"), "{err}");
        }
        // etcd counts another number of keys than the proof derives.
        let err = before
            .check_kept_by(&before.derived(kv_hash(14, 1), since(0xabcd), &[], None, Some(3), now))
            .expect_err("a count that differs");
        assert!(err.contains("etcd counts 3"), "{err}");
    }

    /// A baseline fingerprinted by etcd's hash alone (2 keys at revision
    /// 10, lease 7 alive), as `read_fingerprint_by_hash` makes it.
    fn by_hash(leases: &[(i64, i64)], read: Instant) -> Fingerprint {
        let mut fingerprint = Fingerprint::empty(Storage::Etcd3);
        fingerprint.keys = 2;
        fingerprint.hash = Some(kv_hash(10, 0xabcd));
        fingerprint.whole = false;
        fingerprint.finish(Some(&leases.iter().copied().collect()), read)
    }

    #[test]
    fn a_baseline_by_hash_alone_proves_only_what_etcds_hash_checks() {
        let now = Instant::now();
        let before = by_hash(&[(7, 60)], now - Duration::from_secs(1));
        let since = |found: u32| SinceCheck {
            expected: kv_hash(10, 0xabcd),
            found: kv_hash(10, found),
            strays: Vec::new(),
            counted: None,
        };
        assert_eq!(before.to_string(), "v3 2 keys 1 leases by etcd's hash");
        // The same hash, nothing since, etcd counts the same: kept, and the
        // next step can be proven against what it derives.
        let kept = before.derived(
            kv_hash(14, 1),
            since(0xabcd),
            &[],
            Some(&[(7, 59)].into()),
            Some(2),
            now,
        );
        before.check_kept_by(&kept).expect("proven by hash");
        let next = kept.derived(
            kv_hash(16, 2),
            SinceCheck {
                expected: kv_hash(14, 1),
                found: kv_hash(14, 1),
                strays: Vec::new(),
                counted: None,
            },
            &[],
            Some(&[(7, 58)].into()),
            Some(2),
            now,
        );
        kept.check_kept_by(&next).expect("the chain goes on");
        // A key gone (etcd counts 1), another hash, a lease lost before its
        // TTL: each fails.
        let err = before
            .check_kept_by(&before.derived(
                kv_hash(14, 1),
                since(0xabcd),
                &[],
                Some(&[(7, 59)].into()),
                Some(1),
                now,
            ))
            .expect_err("a lost key");
        assert!(err.contains("etcd counts 1"), "{err}");
        let err = before
            .check_kept_by(&before.derived(
                kv_hash(14, 1),
                since(0xbeef),
                &[],
                Some(&[(7, 59)].into()),
                Some(2),
                now,
            ))
            .expect_err("another hash");
        assert!(err.contains("differs"), "{err}");
        let err = before
            .check_kept_by(&before.derived(
                kv_hash(14, 1),
                since(0xabcd),
                &[],
                Some(&BTreeMap::new()),
                Some(2),
                now,
            ))
            .expect_err("a lease lost");
        assert!(err.contains("leases differ"), "{err}");
        // A whole read not checked by hash at revision 10 proves nothing
        // against it, even one that looks the same; nor does a read through
        // another storage.
        let whole = v3(&[entry("a", "1"), leased("b", "2", 7, 59)], &[(7, 59)], now);
        let err = before.check_kept_by(&whole).expect_err("unproven");
        assert!(err.contains("did not hash that revision"), "{err}");
        let v2 = Fingerprint::new(Storage::Etcd2, &[entry("a", "1")], None, now);
        let err = before.check_kept_by(&v2).expect_err("another storage");
        assert!(err.contains("another storage"), "{err}");
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
        v2::collect_v2(&node_of(json), None, &mut out);
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
