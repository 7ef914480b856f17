//! This module owns reading what an etcd data dir records about itself,
//! offline (no etcd running) and read-only: the member and cluster ids,
//! the cluster version, the membership, whether v2 or v3 auth is on, the
//! v3 leases' granted TTLs, and the v2 store's hidden nodes. It reads the
//! files etcd 2.2 … 3.5 write: the WAL (`member/wal`), the raft snapshots
//! (`member/snap/*.snap`, holding the v2 store) and the bolt database
//! (`member/snap/db`), and replays the log on top of the newest snapshot
//! and of bolt as etcd does at start. Damage etcd itself would repair (a
//! torn WAL tail, a broken newest snapshot) is read around and noted;
//! damage etcd would refuse is an error naming the file.
//!
//! - `proto`: the protobuf wire format.
//! - `wal`: WAL segments and their records, streamed.
//! - `snap`: the newest `.snap` that decodes, its v2 store streamed.
//! - `bolt`: a read-only bolt page reader.
//! - `v2request`: a WAL entry's v2 request, decoded.
//! - `state`: what etcd's appliers make of the snapshot, bolt and log.
//! - `keys`: the keys themselves (bolt's live v3 keys, the v2 store's
//!   node names), only when a check asks for them ([`Want`]).
//!
//! Cost: the WAL is read once, record by record (reading starts at the
//! segment holding the snapshot's index, as etcd's does); only entries
//! after the snapshot are decoded, and only their top-level fields.
//! Memory is bounded by one WAL record, one snapshot value and the
//! reported state, whatever the data's size. Times and memory measured
//! on this project's machines: see [`read`].

mod bolt;
mod keys;
mod proto;
mod snap;
mod state;
mod v2request;
mod v2store;
mod wal;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use self::state::{Replay, V2State, V3State};

pub use self::keys::{HashStart, Keep, OfflineHash, V2Names, V3Key};
pub use self::v2store::{now_nanos, V2Leaf};

/// What an etcd snapshot file (`etcdctl snapshot save`: a bolt db with
/// its sha256 appended) records of the release that wrote it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SnapshotVersions {
    /// bolt's `cluster/clusterVersion` (3.5+ write it).
    pub cluster_version: Option<String>,
    /// bolt's `meta/storageVersion` (3.6+ write it).
    pub storage_version: Option<String>,
}

/// Reads a snapshot file's versions, read-only: an error names the file
/// when it is not a bolt db etcd could open.
pub fn snapshot_versions(path: &Path) -> Result<SnapshotVersions, OnDiskError> {
    let db = bolt::Db::open(path)?;
    let mut versions = SnapshotVersions::default();
    let text = |v: Vec<u8>| String::from_utf8_lossy(&v).into_owned();
    if let Some(meta) = db.bucket(b"meta")? {
        versions.storage_version = db.get(&meta, b"storageVersion")?.map(text);
    }
    if let Some(cluster) = db.bucket(b"cluster")? {
        versions.cluster_version = db.get(&cluster, b"clusterVersion")?.map(text);
    }
    Ok(versions)
}

/// One member of the cluster, as the data records it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MemberOnDisk {
    /// The member id.
    pub id: u64,
    /// Its `--name`; empty until the member has published it (a member
    /// added but never started has none).
    pub name: String,
    /// Its peer URLs.
    pub peer_urls: Vec<String>,
    /// Its client URLs, as last published (empty if never).
    pub client_urls: Vec<String>,
    /// Whether it is a learner (3.4+).
    pub is_learner: bool,
}

/// What a data dir records. A data dir without etcd's files (fresh, or
/// `member/` absent) gives the default: all `None`, empty and false.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OnDisk {
    /// This member's id (the WAL's metadata record).
    pub member_id: Option<u64>,
    /// The cluster id (the WAL's metadata record).
    pub cluster_id: Option<u64>,
    /// The cluster version, e.g. `3.3.0`: the last one set in the log
    /// after the snapshot (a v2 PUT of `/0/version`, or 3.5's
    /// `ClusterVersionSet`), else bolt's `cluster/clusterVersion` (3.0+),
    /// else the snapshot's v2 store. `None` before the cluster decided one.
    pub cluster_version: Option<String>,
    /// The current members (removed ones left out), by id: the v2 store's
    /// `/0/members` in the newest snapshot, changed by the log's conf
    /// changes and attribute publishes; bolt's `members` bucket only when
    /// the v2 store and log hold no membership.
    pub members: Vec<MemberOnDisk>,
    /// bolt's `auth/authEnabled` is `[1]`, as changed by later log entries
    /// (an enable without a root user holding the root role is refused).
    pub v3_auth_enabled: bool,
    /// The v2 store's `/2/enabled` is `true`.
    pub v2_auth_enabled: bool,
    /// bolt's `lease` bucket, lease id → granted TTL in seconds (etcd
    /// raises a TTL below its minimum, a few seconds, when it grants it;
    /// a grant still only in the log carries the TTL asked for). `None`
    /// for etcd2 data (no bolt database).
    pub leases: Option<BTreeMap<i64, i64>>,
    /// The user-visible paths (without the store's `/1` prefix) of hidden
    /// v2 nodes: every node whose own name starts with `_` (etcd's
    /// `IsHidden`; the v2 API lists none of them, but a GET of one lists
    /// its visible children). From the snapshot's store, plus those a
    /// later log entry writes. A superset: a node deleted or expired since
    /// may be named, so a reader should skip the ones not found.
    pub v2_hidden_paths: Vec<String>,
    /// The raft index of the newest v2 request (`pb.Request`, proposed by
    /// 2.x … 3.5) the WAL still holds past its newest snapshot record,
    /// where etcd 3.7 starts its replay: 3.7 no longer decodes them and
    /// panics replaying one ("unmarshal should never fail"). A member
    /// whose WAL still holds 3.5's entries (its member publish, its
    /// cluster-version updates) needs a snapshot taken by 3.6 past them
    /// before 3.7 may start on it. `None`: none there.
    pub v2_requests_past_snapshot: Option<u64>,
    /// The cluster version etcd's replay at start begins at: the newest
    /// snapshot's own (its v2 store, before the log after it), or, with no
    /// snapshot, the first one the WAL sets.
    pub replay_cluster_version: Option<String>,
    /// The raft index of a v2 request past the newest snapshot that etcd
    /// 3.6 refuses to replay (it converts only a member's attributes
    /// publish and a cluster-version update): a v2 write of user keys or
    /// auth, a delete, a TTL sync.
    pub v2_refused_by_3_6: Option<u64>,
    /// The names of the v2 store's nodes, when [`Want::v2_names`] asked
    /// for them: from the newest snapshot, changed by the log's v2 writes.
    /// Never a name the store lacks; see [`V2Names`] for what is left out.
    pub v2_names: Option<V2Names>,
    /// The v2 store's keys with their values and expiry, when
    /// [`Want::v2_store`] asked for them: what a start of a 2.x release
    /// would list; `Err` (why) where a write in the log had an outcome the
    /// replay does not keep (see `v2store`).
    pub v2_store: Option<Result<Vec<V2Leaf>, String>>,
    /// bolt's live v3 keys, when [`Want::v3_keys`] asked for them: `Err`
    /// (why) when the log changes keys past bolt's consistent index, so
    /// that bolt alone is not the keyspace etcd will serve.
    pub v3_keys: Option<Result<Vec<V3Key>, String>>,
    /// etcd's `HashKV` at the data's current revision and its live key
    /// count, computed from bolt, when [`Want::v3_hash`] asked: `Err` (why)
    /// where bolt alone does not give etcd's answer (the WAL changes keys
    /// past it, a compaction is unfinished).
    pub v3_hash: Option<Result<OfflineHash, String>>,
    /// Where that hash starts, when [`Want::v3_hash_later`] asked, for a
    /// walk of the key bucket later, while an etcd starts on the data
    /// ([`HashStart`] says why that is sound); `Err` as for `v3_hash`.
    pub v3_hash_start: Option<Result<HashStart, String>>,
    /// The alarms bolt's `alarm` bucket holds (`NOSPACE`, `CORRUPT`), as
    /// etcd raised them: a member with one refuses writes (NOSPACE) or
    /// more (CORRUPT) until it is disarmed.
    pub alarms: Vec<String>,
    /// The size of `member/snap/db` in bytes (what etcd holds against its
    /// backend quota), when there is one.
    pub db_bytes: Option<u64>,
    /// bolt's `meta/storageVersion` (3.6+ write it: the schema the data is
    /// in, which a downgrade lowers before an older release may start).
    pub storage_version: Option<String>,
    /// What was read around, one line each: a torn WAL tail, broken newer
    /// snapshots passed over, log entries or member records that did not
    /// decode.
    pub notes: Vec<String>,
}

impl OnDisk {
    /// The members as messages name them: `name peer-urls`, comma-joined
    /// (`(unstarted)` for a member that never published its name).
    pub fn members_text(&self) -> String {
        self.members
            .iter()
            .map(|m| {
                let name = if m.name.is_empty() {
                    "(unstarted)"
                } else {
                    &m.name
                };
                format!("{name} {}", m.peer_urls.join(","))
            })
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Why a data dir could not be read.
#[derive(Debug, thiserror::Error)]
pub enum OnDiskError {
    /// A file or dir could not be read at all.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file or dir.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A WAL record is damaged where etcd does not repair (not a torn
    /// tail): etcd refuses to start on it too.
    #[error("{path} is damaged at byte {offset}: {what}; etcd refuses this WAL too, so restore the data dir from a backup")]
    WalDamaged {
        /// The segment.
        path: PathBuf,
        /// The offset of the record.
        offset: u64,
        /// What is wrong.
        what: String,
    },
    /// The WAL segments do not form one log from the snapshot on.
    #[error("the WAL in {dir} is incomplete: {what}; etcd refuses it too, so restore the data dir from a backup")]
    WalSequence {
        /// The WAL dir.
        dir: PathBuf,
        /// What is missing.
        what: String,
    },
    /// No snapshot decodes and the WAL no longer reaches back to the
    /// start, so the state cannot be rebuilt.
    #[error("no snapshot in {dir} can be read ({reasons}) and the WAL no longer starts at the beginning; etcd cannot start on this either, so restore the data dir from a backup")]
    NoUsableSnapshot {
        /// The snap dir.
        dir: PathBuf,
        /// Each file and why, joined.
        reasons: String,
    },
    /// A snapshot's checksum is good but its v2 store does not parse
    /// (e.g. a v2 path nested deeper than ~60 levels, past the JSON
    /// parser's depth limit).
    #[error(
        "{path} cannot be read although its checksum is good: {what}; report this with the file"
    )]
    SnapUnreadable {
        /// The `.snap` file.
        path: PathBuf,
        /// The parser's complaint.
        what: String,
    },
    /// The bolt database is not one etcd wrote, or is damaged.
    #[error("{path} is not a readable bolt database: {what}; if etcd also refuses it, restore the data dir from a backup")]
    BoltDamaged {
        /// The `db` file.
        path: PathBuf,
        /// What is wrong.
        what: String,
    },
}

/// Where etcd keeps its WAL and snapshots: `<data-dir>/member` (2.2+),
/// or the data dir itself in the 2.0 layout (`wal/` and `snap/` at the
/// top, which 2.1+ moves into `member/` at start).
fn member_dir(data_dir: &Path) -> Option<PathBuf> {
    let member = data_dir.join("member");
    if member.is_dir() {
        return Some(member);
    }
    data_dir
        .join("wal")
        .is_dir()
        .then(|| data_dir.to_path_buf())
}

/// Whether the db of `data_dir` holds any v3 record (a key's revision or
/// a deletion's tombstone): its `key` bucket has an entry. `false` where
/// there is no db or no such bucket.
pub fn has_v3_records(data_dir: &Path) -> Result<bool, OnDiskError> {
    let path = data_dir.join("member").join("snap").join("db");
    if !path.exists() {
        return Ok(false);
    }
    let db = bolt::Db::open(&path)?;
    match db.bucket(b"key")? {
        Some(bucket) => Ok(db.last_key(&bucket)?.is_some()),
        None => Ok(false),
    }
}

/// The size of the newest raft snapshot (`member/snap/*.snap`, the v2
/// store and the membership) of the data in `data_dir`; 0 when there is
/// none or it cannot be read (the size only tunes how a step's etcd
/// runs).
pub fn newest_snap_bytes(data_dir: &Path) -> u64 {
    newest_snap(data_dir).map_or(0, |meta| meta.len())
}

/// Whether etcd wrote a WAL in `data_dir` (a `*.wal` segment in
/// `member/wal`): an etcd that joined a cluster and never got that far
/// left nothing of a member in it.
pub fn has_wal(data_dir: &Path) -> bool {
    file_names(&data_dir.join("member").join("wal"))
        .is_ok_and(|names| names.iter().any(|name| name.ends_with(".wal")))
}

/// The metadata of the newest raft snapshot (`member/snap/*.snap`) in
/// `data_dir`, if it has one.
pub fn newest_snap(data_dir: &Path) -> Option<std::fs::Metadata> {
    let dir = data_dir.join("member").join("snap");
    let names = file_names(&dir).ok()?;
    // `<16 hex term>-<16 hex index>.snap`: the greatest name is the newest.
    names
        .iter()
        .filter(|name| name.ends_with(".snap"))
        .max()
        .and_then(|name| std::fs::metadata(dir.join(name)).ok())
}

/// The names of the entries of `dir` (lossy UTF-8); none for a missing
/// dir, which a fresh or partial data dir may lack.
fn file_names(dir: &Path) -> Result<Vec<String>, OnDiskError> {
    let io = |source| OnDiskError::Io {
        path: dir.to_path_buf(),
        source,
    };
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => return Err(io(source)),
    };
    entries
        .map(|entry| {
            entry
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .map_err(io)
        })
        .collect()
}

/// What [`read_with`] reads beyond the small state every read gives.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Want {
    /// The v2 store's node names, kept as [`Keep`] says.
    pub v2_names: Option<Keep>,
    /// The v2 store's keys with their values and expiry (memory: the
    /// whole store's keys and values).
    pub v2_store: bool,
    /// bolt's live v3 keys (every page of the keyspace is read).
    pub v3_keys: bool,
    /// etcd's `HashKV` computed from bolt (two reads of every page of the
    /// keyspace; memory: a digest per key).
    pub v3_hash: bool,
    /// Only where etcd's `HashKV` from bolt starts (a few pages): the walk
    /// is left to [`HashStart::hash`].
    pub v3_hash_later: bool,
}

/// Reads what the etcd data in `data_dir` records, without changing
/// anything. See [`OnDisk`] for where each answer comes from.
///
/// Measured (release build, this project's shared 2-core machine):
/// - 3.5.16, 65,536 single puts of 1 KiB (64 MiB of values, two WAL
///   segments, no snapshot): 40–105 ms with the page cache warm, 145 ms
///   cold.
/// - 3.5.16, 100 MB of log in 1,024 transactions of 100 puts: 35–40 ms
///   warm, 95–125 ms cold (the CRC is the cost).
/// - 3.3.25, 150,000 v2 keys of 1 KiB: a 117 MB `.snap` streamed plus
///   50,000 WAL entries after it: 1.3–2.4 s, at most 3.5 MB resident.
///
/// The time grows linearly with the log and the snapshot; memory does
/// not grow with either.
pub fn read(data_dir: &Path) -> Result<OnDisk, OnDiskError> {
    read_with(data_dir, &Want::default())
}

/// [`read`], and the keys `want` asks for. The v2 names cost memory in
/// proportion to the names kept; the v3 keys, to the live keyspace, and a
/// read of every page of bolt's `key` bucket.
pub fn read_with(data_dir: &Path, want: &Want) -> Result<OnDisk, OnDiskError> {
    let Some(member_dir) = member_dir(data_dir) else {
        return Ok(OnDisk::default());
    };
    let mut notes = Vec::new();
    let sources = Sources::open(&member_dir, want, &mut notes)?;
    let replayed = replay(sources, &mut notes)?;
    Ok(replayed.into_on_disk(notes))
}

/// What the replay starts from: the newest readable snapshot's v2 store,
/// bolt's small buckets, and the WAL segments after the snapshot.
struct Sources {
    v2: V2State,
    snap_index: u64,
    snap_version: Option<String>,
    bolt: Option<BoltState>,
    v3_keys: Option<Vec<V3Key>>,
    v3_hash: Option<Result<OfflineHash, String>>,
    v3_hash_start: Option<Result<HashStart, String>>,
    segments: Vec<wal::Segment>,
}

impl Sources {
    fn open(member_dir: &Path, want: &Want, notes: &mut Vec<String>) -> Result<Self, OnDiskError> {
        let snap_dir = member_dir.join("snap");
        // bolt first: the v2 names kept may be those of its v3 keys.
        let db_path = snap_dir.join("db");
        let (bolt, v3_keys, v3_hash, v3_hash_start) = if db_path.exists() {
            let db = bolt::Db::open(&db_path)?;
            let wants_keys = want.v3_keys || want.v2_names == Some(Keep::V3Names);
            let keys = if wants_keys {
                Some(keys::read_v3_keys(&db)?)
            } else {
                None
            };
            let hash = if want.v3_hash {
                Some(keys::offline_hash(&db)?)
            } else {
                None
            };
            let start = if want.v3_hash_later {
                Some(keys::HashStart::open(&db)?)
            } else {
                None
            };
            (Some(read_bolt(&db, &db_path, notes)?), keys, hash, start)
        } else {
            let none = || Err("the data has no bolt database".to_string());
            (
                None,
                want.v3_keys.then(Vec::new),
                want.v3_hash.then(none),
                want.v3_hash_later
                    .then(|| Err("the data has no bolt database".to_string())),
            )
        };
        let keep = match &want.v2_names {
            Some(Keep::V3Names) => Some(Keep::Only(
                v3_keys
                    .iter()
                    .flatten()
                    .filter_map(|k| String::from_utf8(k.key.clone()).ok())
                    .collect(),
            )),
            other => other.clone(),
        };
        let mut fresh = V2State::default();
        fresh.names = keep.map(V2Names::new);
        fresh.store = want.v2_store.then(Default::default);
        let newest = snap::newest(&snap_dir, &fresh)?;
        for (path, why) in &newest.skipped {
            notes.push(format!(
                "passed over the broken snapshot {}: {why}",
                path.display()
            ));
        }
        let (v2, snap_index) = match newest.snapshot {
            Some(snapshot) => (snapshot.v2, snapshot.index),
            None => (fresh, 0),
        };
        let snap_version = v2.cluster_version.clone();
        let segments = match wal::segments(&member_dir.join("wal"), snap_index) {
            // With every snapshot broken, a WAL that starts after one cannot
            // be read from its start: say why the snapshots were passed over.
            Err(OnDiskError::WalSequence { .. })
                if snap_index == 0 && !newest.skipped.is_empty() =>
            {
                let reasons: Vec<String> = newest
                    .skipped
                    .iter()
                    .map(|(path, why)| format!("{}: {why}", path.display()))
                    .collect();
                return Err(OnDiskError::NoUsableSnapshot {
                    dir: snap_dir,
                    reasons: reasons.join("; "),
                });
            }
            other => other?,
        };
        Ok(Sources {
            v2,
            snap_index,
            snap_version,
            bolt,
            v3_keys,
            v3_hash,
            v3_hash_start,
            segments,
        })
    }
}

/// The state after the WAL is replayed on the sources.
struct Replayed {
    ids: Option<(u64, u64)>,
    bolt: Option<BoltState>,
    v3_keys: Option<Vec<V3Key>>,
    v3_hash: Option<Result<OfflineHash, String>>,
    v3_hash_start: Option<Result<HashStart, String>>,
    v2: V2State,
    v3: Option<V3State>,
    v2_requests_past_snapshot: Option<u64>,
    snap_version: Option<String>,
    snap_index: u64,
    v2_refused_by_3_6: Option<u64>,
}

/// Replays the WAL after the snapshot (and after bolt's consistent index)
/// on what the sources hold, noting a torn tail and undecodable records.
fn replay(sources: Sources, notes: &mut Vec<String>) -> Result<Replayed, OnDiskError> {
    let (v3, consistent_index) = match &sources.bolt {
        Some(bolt) => (Some(bolt.v3.clone()), bolt.consistent_index),
        None => (None, 0),
    };
    let snap_index = sources.snap_index;
    let mut replay = Replay::new(sources.v2, snap_index, v3, consistent_index);
    let mut ids = None;
    let (mut newest_snapshot_record, mut newest_v2_request) = (0, None);
    let mut refused_by_3_6 = None;
    let end = wal::read(&sources.segments, |record| {
        match record {
            wal::Record::Metadata {
                node_id,
                cluster_id,
            } => ids = Some((node_id, cluster_id)),
            wal::Record::Entry(entry) => {
                let proposal =
                    (entry.kind == wal::ENTRY_NORMAL).then(|| state::Proposal::of(entry.data));
                if proposal == Some(state::Proposal::Bare) {
                    newest_v2_request = Some(entry.index);
                }
                if let Some(told) = proposal.filter(|_| entry.index > snap_index) {
                    if state::refused_by_3_6(entry.data, told) {
                        refused_by_3_6 = Some(entry.index);
                    }
                }
                replay.entry(&entry, proposal)
            }
            wal::Record::HardState { commit } => replay.commit(commit),
            wal::Record::Snapshot { index } => {
                newest_snapshot_record = newest_snapshot_record.max(index)
            }
        }
        Ok(())
    })?;
    let v2_requests_past_snapshot = newest_v2_request.filter(|i| *i > newest_snapshot_record);
    if let Some((path, offset, why)) = end.torn {
        notes.push(format!(
            "the WAL ends in a torn write at byte {offset} of {} ({why}); etcd drops it at its next start, and so was it here",
            path.display()
        ));
    }
    let (v2, v3) = replay.finish();
    notes.extend(v2.problems.iter().cloned());
    if v2.more_problems > 0 {
        notes.push(format!(
            "and {} more undecodable records like those",
            v2.more_problems
        ));
    }
    Ok(Replayed {
        ids,
        bolt: sources.bolt,
        v3_keys: sources.v3_keys,
        v3_hash: sources.v3_hash,
        v3_hash_start: sources.v3_hash_start,
        v2,
        v3,
        v2_requests_past_snapshot,
        snap_version: sources.snap_version,
        snap_index,
        v2_refused_by_3_6: refused_by_3_6,
    })
}

impl Replayed {
    /// What the data records: the cluster version and membership from the
    /// WAL where it set them, else from bolt.
    fn into_on_disk(self, notes: Vec<String>) -> OnDisk {
        let Replayed {
            ids,
            bolt,
            v3_keys,
            v3_hash,
            v3_hash_start,
            v2,
            v3,
            v2_requests_past_snapshot,
            snap_version,
            snap_index,
            v2_refused_by_3_6,
        } = self;
        let keys_written = v3.as_ref().is_some_and(|v3| v3.keys_written);
        let past_bolt =
            "the WAL changes keys past what bolt holds (etcd applies them when it next starts)";
        let v3_keys = v3_keys.map(|keys| {
            if keys_written {
                Err(past_bolt.to_string())
            } else {
                Ok(keys)
            }
        });
        let v3_hash = v3_hash.map(|hash| match hash {
            Ok(_) if keys_written => Err(past_bolt.to_string()),
            other => other,
        });
        let v3_hash_start = v3_hash_start.map(|start| match start {
            Ok(_) if keys_written => Err(past_bolt.to_string()),
            other => other,
        });
        let cluster_version = match (&bolt, v2.version_from_wal) {
            (_, true) => v2.cluster_version.clone(),
            (
                Some(BoltState {
                    cluster_version: Some(version),
                    ..
                }),
                false,
            ) => Some(version.clone()),
            _ => v2.cluster_version.clone(),
        };
        let members: Vec<MemberOnDisk> = if v2.members.is_empty() {
            bolt.as_ref()
                .map(|bolt| bolt.members.values().cloned().collect())
                .unwrap_or_default()
        } else {
            v2.members.values().cloned().collect()
        };
        OnDisk {
            member_id: ids.map(|(member, _)| member),
            cluster_id: ids.map(|(_, cluster)| cluster),
            cluster_version,
            members,
            v3_auth_enabled: v3.as_ref().is_some_and(|v3| v3.auth_enabled),
            v2_auth_enabled: v2
                .v2_auth
                .as_deref()
                .is_some_and(|value| serde_json::from_str::<bool>(value).unwrap_or(false)),
            leases: v3.map(|v3| v3.leases),
            v2_hidden_paths: v2.hidden.into_iter().collect(),
            v2_requests_past_snapshot,
            replay_cluster_version: if snap_index > 0 {
                snap_version
            } else {
                v2.first_wal_version.clone()
            },
            v2_refused_by_3_6,
            v2_store: v2.store.map(|store| match store.unknown() {
                Some(why) => Err(why.to_string()),
                None => Ok(store.leaves()),
            }),
            v2_names: v2.names,
            v3_keys,
            v3_hash,
            v3_hash_start,
            alarms: bolt.as_ref().map(|b| b.alarms.clone()).unwrap_or_default(),
            db_bytes: bolt.as_ref().map(|b| b.bytes),
            storage_version: bolt.as_ref().and_then(|b| b.storage_version.clone()),
            notes,
        }
    }
}

/// What bolt says, before the log is replayed on it.
struct BoltState {
    alarms: Vec<String>,
    bytes: u64,
    storage_version: Option<String>,
    consistent_index: u64,
    cluster_version: Option<String>,
    members: BTreeMap<u64, MemberOnDisk>,
    v3: V3State,
}

/// Reads the small buckets of etcd's bolt database (never `key`).
fn read_bolt(
    db: &bolt::Db,
    path: &Path,
    notes: &mut Vec<String>,
) -> Result<BoltState, OnDiskError> {
    let damaged = |what: String| OnDiskError::BoltDamaged {
        path: path.to_path_buf(),
        what,
    };
    let mut state = BoltState {
        alarms: Vec::new(),
        bytes: std::fs::metadata(path).map(|m| m.len()).unwrap_or(0),
        storage_version: None,
        consistent_index: 0,
        cluster_version: None,
        members: BTreeMap::new(),
        v3: V3State::default(),
    };
    if let Some(meta) = db.bucket(b"meta")? {
        if let Some(value) = db.get(&meta, b"consistent_index")? {
            let bytes: [u8; 8] = value.as_slice().try_into().map_err(|_| {
                damaged(format!(
                    "meta/consistent_index is {} bytes, not 8",
                    value.len()
                ))
            })?;
            state.consistent_index = u64::from_be_bytes(bytes);
        }
        state.storage_version = db
            .get(&meta, b"storageVersion")?
            .map(|v| String::from_utf8_lossy(&v).into_owned());
    }
    if let Some(cluster) = db.bucket(b"cluster")? {
        state.cluster_version = db
            .get(&cluster, b"clusterVersion")?
            .map(|v| String::from_utf8_lossy(&v).into_owned());
    }
    if let Some(alarms) = db.bucket(b"alarm")? {
        db.for_each(&alarms, |member_alarm, _| {
            // `AlarmMember{MemberID (1), Alarm (2)}` is the key.
            let kind = proto::varint_field(member_alarm, 2).map_err(|err| {
                damaged(format!(
                    "alarm {member_alarm:02x?} is no alarm record: {err}"
                ))
            })?;
            state.alarms.push(match kind {
                1 => "NOSPACE".to_string(),
                2 => "CORRUPT".to_string(),
                other => format!("alarm type {other}"),
            });
            Ok(())
        })?;
    }
    read_bolt_auth(db, &damaged, &mut state.v3)?;
    read_bolt_leases(db, &damaged, &mut state.v3)?;
    state.members = read_bolt_members(db, path, notes)?;
    Ok(state)
}

/// The v3 auth flag and whether a root user with the root role exists.
fn read_bolt_auth(
    db: &bolt::Db,
    damaged: &dyn Fn(String) -> OnDiskError,
    v3: &mut V3State,
) -> Result<(), OnDiskError> {
    if let Some(auth) = db.bucket(b"auth")? {
        v3.auth_enabled = db.get(&auth, b"authEnabled")?.as_deref() == Some(&[1u8][..]);
    }
    if let Some(users) = db.bucket(b"authUsers")? {
        if let Some(root) = db.get(&users, b"root")? {
            let roles = proto::strings_field(&root, 3)
                .map_err(|err| damaged(format!("authUsers/root is no user record: {err}")))?;
            v3.root_exists = true;
            v3.root_has_root_role = roles.iter().any(|role| role == "root");
        }
    }
    Ok(())
}

/// Every lease's id and granted TTL.
fn read_bolt_leases(
    db: &bolt::Db,
    damaged: &dyn Fn(String) -> OnDiskError,
    v3: &mut V3State,
) -> Result<(), OnDiskError> {
    let Some(lease) = db.bucket(b"lease")? else {
        return Ok(());
    };
    db.for_each(&lease, |key, value| {
        let id = proto::varint_field(value, 1)
            .map_err(|err| damaged(format!("lease {key:02x?} is no lease record: {err}")))?;
        let ttl = proto::varint_field(value, 2)
            .map_err(|err| damaged(format!("lease {key:02x?} is no lease record: {err}")))?;
        v3.leases.insert(id as i64, ttl as i64);
        Ok(())
    })
}

/// The membership bolt records, less the removed members; a record that
/// is not member JSON becomes a note.
fn read_bolt_members(
    db: &bolt::Db,
    path: &Path,
    notes: &mut Vec<String>,
) -> Result<BTreeMap<u64, MemberOnDisk>, OnDiskError> {
    let mut removed = std::collections::BTreeSet::new();
    if let Some(bucket) = db.bucket(b"members_removed")? {
        db.for_each(&bucket, |key, _| {
            if let Some(id) = std::str::from_utf8(key)
                .ok()
                .and_then(|hex| u64::from_str_radix(hex, 16).ok())
            {
                removed.insert(id);
            }
            Ok(())
        })?;
    }
    let mut members = BTreeMap::new();
    let Some(bucket) = db.bucket(b"members")? else {
        return Ok(members);
    };
    db.for_each(&bucket, |key, value| {
        match serde_json::from_slice::<state::MemberJson>(value) {
            Ok(member) if !removed.contains(&member.id) => {
                members.insert(
                    member.id,
                    MemberOnDisk {
                        id: member.id,
                        name: member.name,
                        peer_urls: member.peer_urls.unwrap_or_default(),
                        client_urls: member.client_urls.unwrap_or_default(),
                        is_learner: member.is_learner,
                    },
                );
            }
            Ok(_) => {}
            Err(err) => notes.push(format!(
                "members/{} in {} is not member JSON: {err}",
                String::from_utf8_lossy(key),
                path.display()
            )),
        }
        Ok(())
    })?;
    Ok(members)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ondisk::proto::encode::{field_bytes, field_varint};

    /// An `InternalRaftRequest` carrying a default v2 PUT.
    fn v2_put(path: &str, value: &str) -> Vec<u8> {
        let mut request = field_varint(1, 1);
        request.extend(field_bytes(2, b"PUT"));
        request.extend(field_bytes(3, path.as_bytes()));
        request.extend(field_bytes(4, value.as_bytes()));
        field_bytes(2, &request)
    }

    /// A data dir in `layout` (`member` or the 2.0 top level) with the
    /// snapshot of `snap::tests::STORE` at index 9 and a WAL whose entry 5
    /// (covered by the snapshot) and entry 10 (after it) set the version.
    fn built_data_dir(layout: &str) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().join(layout);
        std::fs::create_dir_all(base.join("snap")).unwrap();
        std::fs::create_dir_all(base.join("wal")).unwrap();
        std::fs::write(
            base.join("snap/0000000000000002-0000000000000009.snap"),
            snap::tests::snap_file(snap::tests::STORE, 9, 2),
        )
        .unwrap();
        let mut metadata = field_varint(1, 0x8e9e05c52164694d);
        metadata.extend(field_varint(2, 0xcdf818194e3a8c32));
        let mut records = vec![(1, metadata)];
        for index in 1..=10 {
            let payload = match index {
                5 => v2_put("/0/version", "2.9.9"),
                10 => v2_put("/0/version", "3.4.0"),
                _ => Vec::new(),
            };
            records.push((2, wal::tests::entry_data(index, &payload)));
        }
        records.push((3, field_varint(3, 10)));
        let (segment, _) = wal::tests::segment(&records, 0);
        std::fs::write(
            base.join("wal/0000000000000000-0000000000000000.wal"),
            segment,
        )
        .unwrap();
        dir
    }

    #[test]
    fn the_log_after_the_snapshot_is_replayed_on_it_in_both_layouts() {
        for layout in ["member", "."] {
            let dir = built_data_dir(layout);
            let found = read(dir.path()).unwrap();
            assert_eq!(found.member_id, Some(0x8e9e05c52164694d), "{layout}");
            assert_eq!(found.cluster_id, Some(0xcdf818194e3a8c32));
            assert_eq!(found.cluster_version.as_deref(), Some("3.4.0"));
            assert_eq!(found.members.len(), 1);
            assert_eq!(found.members[0].name, "default");
            assert!(found.v2_auth_enabled && !found.v3_auth_enabled);
            assert_eq!(found.v2_hidden_paths, ["/_hidden"]);
            assert_eq!(found.leases, None, "no bolt: etcd2 data");
            assert!(found.notes.is_empty(), "{:?}", found.notes);
        }
    }

    #[test]
    fn a_broken_newest_snapshot_is_noted_and_passed_over() {
        let dir = built_data_dir("member");
        std::fs::write(
            dir.path()
                .join("member/snap/0000000000000002-000000000000000a.snap"),
            b"garbage",
        )
        .unwrap();
        let found = read(dir.path()).unwrap();
        assert_eq!(found.cluster_version.as_deref(), Some("3.4.0"));
        assert_eq!(found.notes.len(), 1, "{:?}", found.notes);
        // With the good one gone too, and the WAL not reaching back to
        // index 0, nothing can be rebuilt.
        std::fs::remove_file(
            dir.path()
                .join("member/snap/0000000000000002-0000000000000009.snap"),
        )
        .unwrap();
        std::fs::rename(
            dir.path()
                .join("member/wal/0000000000000000-0000000000000000.wal"),
            dir.path()
                .join("member/wal/0000000000000000-0000000000000005.wal"),
        )
        .unwrap();
        let err = read(dir.path()).unwrap_err();
        assert!(matches!(err, OnDiskError::NoUsableSnapshot { .. }), "{err}");
    }

    #[test]
    fn a_garbage_bolt_file_is_an_error_naming_it() {
        let dir = built_data_dir("member");
        let db = dir.path().join("member/snap/db");
        for garbage in [&b""[..], &[0u8; 8192][..], &[0xffu8; 3000][..]] {
            std::fs::write(&db, garbage).unwrap();
            let err = read(dir.path()).unwrap_err();
            assert!(err.to_string().contains(&db.display().to_string()), "{err}");
        }
        std::fs::write(&db, bolt::tests::small_db()).unwrap();
        let found = read(dir.path()).unwrap();
        assert!(found.v3_auth_enabled);
        assert_eq!(found.leases, Some(BTreeMap::from([(1, 60), (2, 120)])));
    }

    #[test]
    fn a_dir_without_etcd_files_reads_as_empty() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(read(dir.path()).unwrap(), OnDisk::default());
        assert_eq!(
            read(&dir.path().join("missing")).unwrap(),
            OnDisk::default()
        );
        std::fs::create_dir_all(dir.path().join("member/wal")).unwrap();
        std::fs::create_dir_all(dir.path().join("member/snap")).unwrap();
        assert_eq!(read(dir.path()).unwrap(), OnDisk::default());
    }
}
