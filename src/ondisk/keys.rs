//! This module owns the keys themselves, read offline, for the checks that
//! must refuse a run before any etcd starts: the live v3 keys of bolt's
//! `key` bucket (the newest revision of each, deletions applied) and the
//! names of the v2 store's nodes (the snapshot's store, then the log's v2
//! writes). Neither is read unless a check asks ([`super::Want`]): the v3
//! scan reads every page of the keyspace.
//!
//! The v2 names err on one side only: a node is left out where the log
//! alone cannot say it is there (a conditional write, a `POST`'s generated
//! name, a node with a TTL that may have expired), never invented. A check
//! that finds a name here is therefore right to refuse; one that finds
//! none still has the baseline read behind it, which reads the store
//! through etcd itself.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::hash::{BuildHasherDefault, DefaultHasher, Hash, Hasher};

use super::bolt;
use super::proto::{self, Fields};
use super::v2request::V2Request;
use super::OnDiskError;

/// bolt's bucket of v3 revisions.
const KEY_BUCKET: &[u8] = b"key";
/// A revision key: 8 bytes main revision, `_`, 8 bytes sub revision.
const REVISION_LEN: usize = 17;
/// A deletion's revision key carries this marker after the revision.
const TOMBSTONE: u8 = b't';

/// A live v3 key as bolt holds it at its newest revision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct V3Key {
    /// The key.
    pub key: Vec<u8>,
    /// Its value.
    pub value: Vec<u8>,
    /// The lease it is bound to (0: none).
    pub lease: i64,
}

/// Reads every live key of bolt's `key` bucket, in key order. Revisions
/// come in revision order, so the last record of a key is its state: a
/// tombstone removes it. Compacted history is simply absent.
pub fn read_v3_keys(db: &bolt::Db) -> Result<Vec<V3Key>, OnDiskError> {
    let mut live: BTreeMap<Vec<u8>, (Vec<u8>, i64)> = BTreeMap::new();
    let Some(bucket) = db.bucket(KEY_BUCKET)? else {
        return Ok(Vec::new());
    };
    db.for_each(&bucket, |revision, record| {
        let (tombstone, (key, value, lease)) = revision_record(db, revision, record)?;
        if tombstone {
            live.remove(key);
        } else {
            live.insert(key.to_vec(), (value.to_vec(), lease));
        }
        Ok(())
    })?;
    Ok(live
        .into_iter()
        .map(|(key, (value, lease))| V3Key { key, value, lease })
        .collect())
}

/// etcd's `HashKV` of the data at its current revision, and the live key
/// count there, computed from bolt alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OfflineHash {
    /// The data's current revision (the newest in the key bucket, or the
    /// compaction if newer), as etcd restores it.
    pub revision: i64,
    /// The finished compaction's revision (0: none).
    pub compact_revision: i64,
    /// The CRC-32C etcd's `HashKV` gives at `revision`.
    pub hash: u32,
    /// Live keys at `revision`.
    pub keys: usize,
}

/// etcd's `HashKV` at the current revision (`hashByRev`, 3.3 … 3.7): a
/// CRC-32C (Castagnoli) of the bucket's name, then of each revision key
/// and record in bucket order up to the revision, where a record at or
/// below the compaction counts only while it is its key's live revision
/// (etcd's `kvindex.Keep`; all of them when no key is live), and a
/// tombstone at the compaction itself never (3.4.34+/3.5.16+ keep it in
/// bolt, older releases delete it: skipping it makes both agree). One pass
/// over the bucket when nothing was ever compacted, two otherwise; memory
/// holds a 64-bit digest per key written since the compaction and per key
/// at or below it.
///
/// `Err(why)` where bolt alone does not give etcd's answer: a compaction
/// scheduled but unfinished (etcd finishes it when it starts), or a key
/// with two revisions at or below the finished compaction (it was not
/// finished either).
pub fn offline_hash(db: &bolt::Db) -> Result<Result<OfflineHash, String>, OnDiskError> {
    match HashStart::open(db)? {
        Ok(start) => walk_key_bucket(db, start.bucket.as_ref(), start.finished),
        Err(why) => Ok(Err(why)),
    }
}

/// Where `offline_hash` starts, read before any etcd runs on the data
/// (a few pages): the database as its meta page was then, the key
/// bucket, the compactions and the newest revision key. [`HashStart::hash`]
/// walks the bucket later, while the first step's etcd starts, and then
/// proves that no commit since has changed it.
///
/// Why that proof is enough: bolt copies on write, so a commit never
/// touches a page the committed tree still uses; a page it frees (the old
/// copy of what it changed) can be reused by a later commit. The bucket's
/// pages are freed only by a commit that changes the bucket, and every
/// change etcd makes to it writes a newer revision key (a put, a delete, a
/// lease's keys revoked) or, for a compaction, first records the
/// compaction it schedules in the `meta` bucket. So with the compactions
/// and the newest revision key as they were, no commit changed the bucket,
/// and every page the walk read was the one the meta page pinned. etcd's
/// own commits at start (its cluster and storage versions, the consistent
/// index) change other buckets only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HashStart {
    path: std::path::PathBuf,
    pinned: bolt::Pinned,
    /// `None`: the data has no key bucket.
    bucket: Option<bolt::Bucket>,
    finished: i64,
    scheduled: i64,
    /// The bucket's last (newest) revision key.
    last: Option<Vec<u8>>,
}

impl HashStart {
    /// Reads where the hash starts from, or why bolt alone cannot give
    /// etcd's answer (an unfinished compaction).
    pub fn open(db: &bolt::Db) -> Result<Result<HashStart, String>, OnDiskError> {
        let (finished, scheduled) = compactions(db)?;
        if scheduled > finished {
            return Ok(Err(format!(
                "a compaction to revision {scheduled} is scheduled but unfinished (etcd finishes it when it starts)"
            )));
        }
        let bucket = db.bucket(KEY_BUCKET)?;
        let last = match &bucket {
            Some(bucket) => db.last_key(bucket)?,
            None => None,
        };
        Ok(Ok(HashStart {
            path: db.path().to_path_buf(),
            pinned: db.pinned(),
            bucket,
            finished,
            scheduled,
            last,
        }))
    }

    /// The data's current revision, as [`OfflineHash::revision`].
    pub fn revision(&self) -> i64 {
        self.last
            .as_deref()
            .filter(|key| key.len() >= 8)
            .map_or(0, main_revision)
            .max(self.finished)
    }

    /// The finished compaction's revision (0: none).
    pub fn compact_revision(&self) -> i64 {
        self.finished
    }

    /// Walks the bucket as the meta page pinned it, then proves nothing
    /// changed it since ([`HashStart`] says why that is enough). `Err`
    /// names what went wrong; the caller then reads its baseline another
    /// way.
    pub fn hash(&self) -> Result<OfflineHash, String> {
        let db = bolt::Db::reopen(&self.path, self.pinned).map_err(|err| err.to_string())?;
        let hash = walk_key_bucket(&db, self.bucket.as_ref(), self.finished)
            .map_err(|err| err.to_string())??;
        crate::failpoint!("offline-baseline-walked");
        self.unchanged()?;
        if hash.revision != self.revision() {
            return Err(format!(
                "the walk found revision {}, the newest revision key says {}",
                hash.revision,
                self.revision()
            ));
        }
        Ok(hash)
    }

    /// Fails if a commit since [`HashStart::open`] changed the compactions
    /// or the newest revision key. Read at the newest meta page, again if a
    /// commit lands during the read (its freed pages may be reused only by
    /// a commit after it).
    fn unchanged(&self) -> Result<(), String> {
        let io = |err: OnDiskError| err.to_string();
        for _ in 0..READS_BEFORE_GIVING_UP {
            let db = bolt::Db::open(&self.path).map_err(io)?;
            let (finished, scheduled) = compactions(&db).map_err(io)?;
            let last = match db.bucket(KEY_BUCKET).map_err(io)? {
                Some(bucket) => db.last_key(&bucket).map_err(io)?,
                None => None,
            };
            let settled = bolt::Db::open(&self.path).map_err(io)?.pinned().txid;
            if settled != db.pinned().txid {
                continue;
            }
            if (finished, scheduled) != (self.finished, self.scheduled) {
                return Err(format!(
                    "the compactions changed while the key bucket was hashed (finished {} -> {finished}, scheduled {} -> {scheduled})",
                    self.finished, self.scheduled
                ));
            }
            if last != self.last {
                return Err(format!(
                    "the key bucket changed while it was hashed (newest revision {} -> {})",
                    self.revision(),
                    last.as_deref()
                        .filter(|key| key.len() >= 8)
                        .map_or(0, main_revision)
                ));
            }
            return Ok(());
        }
        Err(format!(
            "bolt committed during each of {READS_BEFORE_GIVING_UP} reads of its newest state"
        ))
    }
}

/// How often [`HashStart::unchanged`] reads again when a commit lands
/// during its read.
const READS_BEFORE_GIVING_UP: usize = 20;

/// The finished and the scheduled compaction's revisions (0: none).
fn compactions(db: &bolt::Db) -> Result<(i64, i64), OnDiskError> {
    let compact = |name: &[u8]| -> Result<i64, OnDiskError> {
        let Some(meta) = db.bucket(b"meta")? else {
            return Ok(0);
        };
        Ok(match db.get(&meta, name)? {
            Some(bytes) if bytes.len() >= 8 => main_revision(&bytes),
            Some(bytes) => {
                return Err(db.damaged(format!(
                    "meta/{} is {} bytes, not a revision",
                    String::from_utf8_lossy(name),
                    bytes.len()
                )))
            }
            None => 0,
        })
    };
    Ok((
        compact(b"finishedCompactRev")?,
        compact(b"scheduledCompactRev")?,
    ))
}

/// etcd's `HashKV` of the key bucket `bucket` (`None`: none), compacted at
/// `finished` (see [`offline_hash`]).
fn walk_key_bucket(
    db: &bolt::Db,
    bucket: Option<&bolt::Bucket>,
    finished: i64,
) -> Result<Result<OfflineHash, String>, OnDiskError> {
    let Some(bucket) = bucket else {
        return Ok(Ok(OfflineHash {
            revision: finished,
            compact_revision: finished,
            hash: crc32c::crc32c(KEY_BUCKET),
            keys: 0,
        }));
    };
    let entry = |revision: &[u8], record: &[u8]| -> Result<(i64, bool, u64), OnDiskError> {
        let (tombstone, (key, _, _)) = revision_record(db, revision, record)?;
        Ok((main_revision(revision), tombstone, digest(key)))
    };
    if finished == 0 {
        // Never compacted: every record counts, so one pass gives both the
        // hash and each key's last state.
        let mut newest = 0;
        let mut last: HashMap<u64, bool, ByDigest> = HashMap::default();
        let mut hash = crc32c::crc32c(KEY_BUCKET);
        db.for_each(bucket, |revision, record| {
            let (main, tombstone, key) = entry(revision, record)?;
            newest = newest.max(main);
            last.insert(key, tombstone);
            hash = crc32c::crc32c_append(hash, revision);
            hash = crc32c::crc32c_append(hash, record);
            Ok(())
        })?;
        return Ok(Ok(OfflineHash {
            revision: newest,
            compact_revision: 0,
            hash,
            keys: last.values().filter(|deleted| !**deleted).count(),
        }));
    }
    // Pass 1: the newest revision, each key's state after the compaction
    // (whether its last write deleted it), and the keys kept at or below
    // it (one revision each, once the compaction finished).
    let mut newest = finished;
    let mut since: HashMap<u64, bool, ByDigest> = HashMap::default();
    let mut kept: HashSet<u64, ByDigest> = HashSet::default();
    let mut twice = None;
    db.for_each(bucket, |revision, record| {
        let (main, tombstone, key) = entry(revision, record)?;
        newest = newest.max(main);
        if main > finished {
            since.insert(key, tombstone);
        } else if !tombstone && !kept.insert(key) {
            twice.get_or_insert(main);
        }
        Ok(())
    })?;
    if let Some(main) = twice {
        return Ok(Err(format!(
            "a key has two revisions at or below the compaction at {finished} (one at {main}): the compaction did not finish"
        )));
    }
    let live_below = kept.iter().filter(|k| !since.contains_key(k)).count();
    let keys = live_below + since.values().filter(|deleted| !**deleted).count();
    // Pass 2: the hash.
    let mut hash = crc32c::crc32c(KEY_BUCKET);
    db.for_each(bucket, |revision, record| {
        let (main, tombstone, key) = entry(revision, record)?;
        let counts = if main > finished {
            true
        } else if tombstone {
            // Below the compaction a tombstone is never a live revision;
            // at it, etcd skips it explicitly.
            keys == 0 && main != finished
        } else {
            // The key's live revision unless written since; all when no
            // key is live (etcd's "don't skip if there isn't one").
            keys == 0 || !since.contains_key(&key)
        };
        if counts {
            hash = crc32c::crc32c_append(hash, revision);
            hash = crc32c::crc32c_append(hash, record);
        }
        Ok(())
    })?;
    Ok(Ok(OfflineHash {
        revision: newest,
        compact_revision: finished,
        hash,
        keys,
    }))
}

/// The main revision of a revision key (its first 8 bytes, big-endian).
fn main_revision(bytes: &[u8]) -> i64 {
    let mut main = [0u8; 8];
    main.copy_from_slice(&bytes[..8]);
    i64::from_be_bytes(main)
}

/// A 64-bit digest of a key, for the sets [`offline_hash`] keeps.
fn digest(key: &[u8]) -> u64 {
    let mut hasher = DefaultHasher::new();
    key.hash(&mut hasher);
    hasher.finish()
}

/// Hashes a [`digest`] as itself: it is a SipHash of the key already, and
/// a second SipHash of it per record was a tenth of the walk (200,000
/// keys).
#[derive(Default)]
struct AsIs(u64);

impl Hasher for AsIs {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only `write_u64` is used (the sets hold u64 digests); anything
        // else folds in, still deterministic.
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }

    fn write_u64(&mut self, digest: u64) {
        self.0 = digest;
    }
}

/// A set or map keyed by [`digest`]s.
type ByDigest = BuildHasherDefault<AsIs>;

/// One record of bolt's `key` bucket: whether its revision key marks a
/// tombstone, and its key, value and lease, borrowed from the record.
/// Anything else is damage, named by its revision key.
type KeyValue<'a> = (&'a [u8], &'a [u8], i64);
fn revision_record<'a>(
    db: &bolt::Db,
    revision: &[u8],
    record: &'a [u8],
) -> Result<(bool, KeyValue<'a>), OnDiskError> {
    let tombstone = match revision.len() {
        REVISION_LEN => false,
        n if n == REVISION_LEN + 1 && revision[REVISION_LEN] == TOMBSTONE => true,
        _ => {
            return Err(db.damaged(format!(
                "key/{revision:02x?} is not a revision (17 bytes, or 18 with a tombstone mark)"
            )))
        }
    };
    let kv = key_value(record)
        .map_err(|err| db.damaged(format!("key/{revision:02x?} is no key-value record: {err}")))?;
    Ok((tombstone, kv))
}

/// `mvccpb.KeyValue`: key (1), value (5), lease (6).
fn key_value(record: &[u8]) -> Result<KeyValue<'_>, proto::ProtoError> {
    let (mut key, mut value, mut lease): KeyValue<'_> = (&[], &[], 0);
    for field in Fields::new(record) {
        match field? {
            (1, proto::Value::Bytes(b)) => key = b,
            (5, proto::Value::Bytes(b)) => value = b,
            (6, proto::Value::Varint(v)) => lease = v as i64,
            _ => {}
        }
    }
    Ok((key, value, lease))
}

/// Which v2 node names to keep.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Keep {
    /// Every node outside etcd's own `/0` (membership, cluster version).
    All,
    /// Only user keys at these v2 paths (`/a/b`, without the store's `/1`):
    /// what a check compares against a few known names, so a large store
    /// costs no memory.
    Only(BTreeSet<String>),
    /// Only user keys named as bolt's live v3 keys are (read first):
    /// [`Keep::Only`] with those names.
    V3Names,
}

/// The names of the v2 store's nodes outside `/0`, by full store path
/// (`/1/a/b` for the v2 key `/a/b`, `/2/users/x` for a v2 auth user), each
/// with whether it is a directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct V2Names {
    keep: Keep,
    nodes: BTreeMap<String, bool>,
    /// The nodes left out for their TTL (whether each is a dir), until a
    /// delete takes them out for sure: a TTL'd key in an older snapshot
    /// that a later `DELETE` in the WAL removed is gone whatever its TTL.
    omitted: BTreeMap<String, bool>,
    /// Whether a write in the log had an outcome these names cannot tell
    /// (a conditional delete, a `POST`'s generated key, a delete of a dir
    /// that may have had children): they are then not all there is.
    uncertain: bool,
}

impl V2Names {
    /// No names yet, keeping what `keep` says.
    pub fn new(keep: Keep) -> Self {
        V2Names {
            keep,
            nodes: BTreeMap::new(),
            omitted: BTreeMap::new(),
            uncertain: false,
        }
    }

    /// Names holding `keys` (full store paths), `ttl`s left out for their
    /// TTL, and uncertain if `uncertain`: for other modules' tests.
    #[cfg(test)]
    pub fn for_test(keys: &[&str], ttl: &[&str], uncertain: bool) -> Self {
        let mut names = V2Names::new(Keep::All);
        for key in keys {
            names.snapshot_node(key, false, false);
        }
        for key in ttl {
            names.snapshot_node(key, false, true);
        }
        names.uncertain = uncertain;
        names
    }

    fn keeps(&self, path: &str) -> bool {
        match &self.keep {
            Keep::All => path.len() > 1 && path != "/0" && !path.starts_with("/0/"),
            Keep::Only(paths) => path
                .strip_prefix("/1")
                .is_some_and(|user| paths.contains(user)),
            Keep::V3Names => false,
        }
    }

    /// Takes in a snapshot node (children come before their dir). A node
    /// with a TTL may have expired by the time etcd next starts, and its
    /// children with it: all are left out.
    pub(super) fn snapshot_node(&mut self, path: &str, dir: bool, expires: bool) {
        if expires {
            self.delete(path);
            if self.keeps(path) {
                self.omitted.insert(path.to_string(), dir);
            }
        } else if self.keeps(path) {
            self.nodes.insert(path.to_string(), dir);
        }
    }

    /// A write that creates `path` (its missing parents become dirs), as
    /// an unconditional v2 `PUT` does. Nothing when a parent is a key (the
    /// write failed) or the node exists (its name does not change).
    pub(super) fn create(&mut self, path: &str, dir: bool, expires: bool) {
        let mut parent = String::new();
        let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
        let Some((_, parents)) = segments.split_last() else {
            return;
        };
        for segment in parents {
            parent.push('/');
            parent.push_str(segment);
            if self.nodes.get(&parent) == Some(&false) {
                return;
            }
        }
        let mut parent = String::new();
        for segment in parents {
            parent.push('/');
            parent.push_str(segment);
            if self.keeps(&parent) {
                self.nodes.entry(parent.clone()).or_insert(true);
            }
        }
        if !self.keeps(path) {
            return;
        }
        if expires {
            // Left out like a TTL'd node of a snapshot (a node that
            // existed keeps its name, and the names stay not all there is).
            self.omitted.insert(path.to_string(), dir);
        } else {
            self.nodes.entry(path.to_string()).or_insert(dir);
        }
    }

    /// Takes in a v2 request from the log, as far as names go: a creating
    /// `PUT`, a `POST` (its dir; the key's generated name is not known
    /// here), a `DELETE`. Expiry (`SYNC`) needs nothing: nodes with a TTL
    /// are never kept. A compare-and-swap or an update changes no name.
    pub(super) fn apply(&mut self, request: &V2Request) {
        let path = request.path();
        match request.method() {
            "PUT" if request.creates() => self.create(path, request.dir(), request.expires()),
            "POST" => {
                self.uncertain |= self.keeps(path);
                self.create(path, true, false);
            }
            "DELETE" => {
                self.uncertain |= self.keeps(path) && !self.deletes_for_sure(request);
                self.delete(path);
            }
            _ => {}
        }
    }

    /// Whether etcd's store surely did what a `DELETE` asks (`store.Delete`
    /// of v2.2 … v3.5), as far as these names go: no condition, and the
    /// node a key, or a dir deleted `recursive`ly, or an empty one deleted
    /// as a dir (`dir=true`). A node it does not know is absent (the
    /// delete fails and changes nothing), unless these names are not all
    /// of the store's (only some kept).
    fn deletes_for_sure(&self, request: &V2Request) -> bool {
        if request.conditional() || self.keep != Keep::All {
            return false;
        }
        let path = request.path();
        let Some(dir) = self.nodes.get(path).or(self.omitted.get(path)) else {
            return true;
        };
        if !*dir || request.recursive() {
            return true;
        }
        let below = format!("{path}/");
        let empty = |nodes: &BTreeMap<String, bool>| {
            nodes
                .range(below.clone()..)
                .next()
                .is_none_or(|(p, _)| !p.starts_with(&below))
        };
        request.dir() && empty(&self.nodes) && empty(&self.omitted)
    }

    /// A v2 `DELETE` of `path`: it and everything below it. A delete that
    /// etcd refused (a condition, a non-empty dir without `recursive`) is
    /// taken as done: leaving a name out is the safe side (for the keys
    /// that must all be there, [`V2Names::uncertain`] says so).
    pub(super) fn delete(&mut self, path: &str) {
        let below = format!("{path}/");
        for nodes in [&mut self.nodes, &mut self.omitted] {
            nodes.remove(path);
            let doomed: Vec<String> = nodes
                .range(below.clone()..)
                .take_while(|(p, _)| p.starts_with(&below))
                .map(|(p, _)| p.clone())
                .collect();
            for path in doomed {
                nodes.remove(&path);
            }
        }
    }

    /// Whether a node outside `/0` was left out for its TTL (and not
    /// deleted since): the names are then not all there is.
    pub fn omitted(&self) -> bool {
        !self.omitted.is_empty()
    }

    /// Whether a write in the log did something these names cannot tell:
    /// they may then miss a key (or hold one that is gone).
    pub fn uncertain(&self) -> bool {
        self.uncertain
    }

    /// The user keys (not dirs), as v2 paths (`/a/b`), in order.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.nodes
            .iter()
            .filter(|(_, dir)| !**dir)
            .filter_map(|(path, _)| path.strip_prefix("/1"))
            .filter(|user| user.starts_with('/'))
    }

    /// The nodes that make the store hold custom content in etcd 3.6's
    /// sense (`membership.IsMetaStoreOnly`): a child of any top-level dir
    /// but `/0`, except that under `/2` (v2 auth) the `users`/`roles`
    /// dirs may stay as long as they are empty. As full store paths.
    pub fn custom_content(&self) -> Vec<&str> {
        self.nodes
            .keys()
            .map(String::as_str)
            .filter(|path| {
                let depth = path.split('/').filter(|s| !s.is_empty()).count();
                if path.starts_with("/2/") {
                    depth == 3
                } else {
                    depth == 2
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(ops: &[(&str, &str)]) -> V2Names {
        let mut names = V2Names::new(Keep::All);
        for (op, path) in ops {
            match *op {
                "key" => names.snapshot_node(path, false, false),
                "dir" => names.snapshot_node(path, true, false),
                "ttl" => names.snapshot_node(path, false, true),
                "put" => names.create(path, false, false),
                "mkdir" => names.create(path, true, false),
                "put-ttl" => names.create(path, false, true),
                "delete" => names.delete(path),
                other => panic!("{other}"),
            }
        }
        names
    }

    #[test]
    fn custom_content_is_what_etcd_3_6_refuses() {
        type Ops<'a> = &'a [(&'a str, &'a str)];
        let cases: &[(Ops, &[&str])] = &[
            // Only membership, the cluster version and an empty /1.
            (
                &[
                    ("key", "/0/version"),
                    ("dir", "/0/members"),
                    ("dir", "/0"),
                    ("dir", "/1"),
                ],
                &[],
            ),
            // flannel's config: /1 has a child.
            (
                &[
                    ("key", "/1/coreos.com/network/config"),
                    ("dir", "/1/coreos.com/network"),
                    ("dir", "/1/coreos.com"),
                    ("dir", "/1"),
                ],
                &["/1/coreos.com"],
            ),
            // An empty dir left behind by deleting the last key still counts.
            (
                &[("put", "/1/registry/a"), ("delete", "/1/registry/a")],
                &["/1/registry"],
            ),
            // ... until the dir itself goes.
            (&[("put", "/1/registry/a"), ("delete", "/1/registry")], &[]),
            // v2 auth's empty users/roles dirs are allowed, a user is not.
            (
                &[
                    ("key", "/2/enabled"),
                    ("dir", "/2/users"),
                    ("dir", "/2/roles"),
                    ("dir", "/2"),
                ],
                &[],
            ),
            (
                &[("key", "/2/users/root"), ("dir", "/2/users")],
                &["/2/users/root"],
            ),
            // A key with a TTL may be gone by the next start: left out.
            (&[("ttl", "/1/lock")], &[]),
            (&[("put-ttl", "/1/lock")], &[]),
        ];
        for (ops, custom) in cases {
            assert_eq!(names(ops).custom_content(), *custom, "{ops:?}");
        }
    }

    #[test]
    fn keys_follow_puts_and_deletes_and_never_invent_a_name() {
        let n = names(&[
            ("key", "/1/a/b"),
            ("dir", "/1/a"),
            ("put", "/1/a/c"),
            ("mkdir", "/1/d"),
            // A key cannot have children: this write failed in etcd.
            ("put", "/1/a/b/x"),
            ("delete", "/1/a/c"),
            ("put", "/1/e/f"),
        ]);
        assert_eq!(n.keys().collect::<Vec<_>>(), ["/a/b", "/e/f"]);
        // A dir with a TTL takes its children with it.
        let n = names(&[("key", "/1/t/k"), ("ttl", "/1/t")]);
        assert_eq!(n.keys().count(), 0);
    }

    /// Whether, after `ops` (snapshot nodes as in [`names`], then WAL
    /// requests `METHOD path flags…`), the names are all there is
    /// (nothing left out for a TTL, nothing uncertain) and which keys.
    fn replayed(snapshot: &[(&str, &str)], wal: &[&str]) -> (bool, Vec<String>) {
        let mut n = names(snapshot);
        for request in wal {
            let mut words = request.split(' ');
            let method = words.next().unwrap_or_default();
            let path = words.next().unwrap_or_default();
            let flags: Vec<&str> = words.collect();
            n.apply(&super::super::v2request::V2Request::for_test(
                method, path, &flags,
            ));
        }
        let whole = !n.omitted() && !n.uncertain();
        (whole, n.keys().map(str::to_string).collect())
    }

    #[test]
    fn the_names_are_all_there_is_only_where_every_write_had_a_sure_outcome() {
        let ttl_key = [("ttl", "/1/events/e"), ("dir", "/1/events")];
        let dir_with_keys = [
            ("key", "/1/pods/p"),
            ("key", "/1/pods/q"),
            ("dir", "/1/pods"),
        ];
        type Case<'a> = (&'a [(&'a str, &'a str)], &'a [&'a str], bool, &'a [&'a str]);
        let cases: &[Case] = &[
            // A TTL'd key in the snapshot: maybe there, maybe expired.
            (&ttl_key, &[], false, &[]),
            // ... deleted later in the WAL: surely gone.
            (&ttl_key, &["DELETE /1/events/e"], true, &[]),
            (&ttl_key, &["DELETE /1/events recursive dir"], true, &[]),
            // A dir deleted with everything below it.
            (&dir_with_keys, &["DELETE /1/pods recursive dir"], true, &[]),
            // A non-empty dir without `recursive`: etcd refuses it.
            (&dir_with_keys, &["DELETE /1/pods dir"], false, &[]),
            // Each key, then the empty dir.
            (
                &dir_with_keys,
                &["DELETE /1/pods/p", "DELETE /1/pods/q", "DELETE /1/pods dir"],
                true,
                &[],
            ),
            // A conditional delete may have failed.
            (
                &dir_with_keys,
                &["DELETE /1/pods/p prevValue"],
                false,
                &["/pods/q"],
            ),
            // A delete of a node that is not there changes nothing.
            (
                &dir_with_keys,
                &["DELETE /1/nodes/n"],
                true,
                &["/pods/p", "/pods/q"],
            ),
            // A POST makes a key whose name the log does not say.
            (&[], &["POST /1/queue"], false, &[]),
            // A TTL'd key put in the WAL: left out, like a snapshot's.
            (&[], &["PUT /1/lock ttl"], false, &[]),
            (&[], &["PUT /1/lock ttl", "DELETE /1/lock"], true, &[]),
            (&[], &["PUT /1/a"], true, &["/a"]),
        ];
        for (snapshot, wal, whole, keys) in cases {
            assert_eq!(
                replayed(snapshot, wal),
                (
                    *whole,
                    keys.iter().map(|k| k.to_string()).collect::<Vec<_>>()
                ),
                "{snapshot:?} then {wal:?}"
            );
        }
    }

    #[test]
    fn keep_only_remembers_just_the_names_asked_for() {
        let mut n = V2Names::new(Keep::Only(["/x".to_string()].into()));
        n.snapshot_node("/1/x", false, false);
        n.snapshot_node("/1/y", false, false);
        n.create("/1/z/x", false, false);
        assert_eq!(n.keys().collect::<Vec<_>>(), ["/x"]);
    }
}
