//! This module owns the offline baseline (issue 21): the fingerprint the
//! first step proves itself against, taken from the stopped data instead
//! of a start of the recorded release, where the data allows it. It is
//! what that start's by-hash read would give (etcd's `HashKV` at the
//! data's revision, the live key count, the leases, the v2 store beside),
//! computed by `ondisk`; the first step's etcd then hashes the same
//! revision itself, so an offline baseline that were wrong fails that
//! step closed, never passes it silently.
//!
//! The recorded release's start does more than read: it leaves a raft
//! snapshot taken at its own cluster version (a snapshot after every
//! entry), which the next release may need. Where it does, the offline
//! baseline is not taken and [`offline`] says why: 3.7 cannot replay the
//! v2 requests 3.5 left past the newest snapshot; 3.5 comes up "not
//! capable" of v3 when its replay begins at a 2.x cluster version; 3.6
//! refuses v2 requests past the snapshot, and custom v2 content in it.
//! And it finds what must stop the run before any newer release touches
//! the data (which would raise the cluster version past the recorded
//! release): an alarm, which only the recorded release can clear.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use crate::keyspace::{Entry, Fingerprint, KvHash};
use crate::log;
use crate::ondisk::{now_nanos, HashStart, OfflineHash, V2Leaf};

/// A db this large may be refused its next write by etcd's default
/// backend quota (2 GiB; etcd compares the file's size): the recorded
/// release's own write meets that first, where it can still be cleared.
const NEAR_QUOTA_BYTES: u64 = 1_800_000_000;
use crate::ondisk::OnDisk;
use crate::plan::{Plan, Step};
use crate::version::{Minor, Storage, Version};

/// The baseline of `plan` from the data as `on_disk` read it (with
/// `ondisk::Want::v3_hash`, and the v2 names where the recorded release
/// serves a v2 store or the first step runs 3.6+), or why it must be read
/// by a start of the recorded release.
pub fn offline(plan: &Plan, on_disk: &OnDisk) -> Result<Offline, String> {
    let (Some(recorded), Some(first)) = (plan.baseline, plan.steps.first()) else {
        return Err("the plan reads no baseline".to_string());
    };
    if plan.current.storage == Storage::Etcd2 {
        return offline_v2(recorded, on_disk);
    }
    if !plan.baseline_by_hash() {
        return Err("a step rebuilds the data and compares whole reads".to_string());
    }
    let runs = first.runs();
    if recorded.minor_line() < Minor::new(3, 3) || runs.minor_line() < Minor::new(3, 3) {
        return Err(format!(
            "etcd {recorded} or {runs} has no HashKV to prove the step by (3.3+)"
        ));
    }
    let hash = match (&on_disk.v3_hash, &on_disk.v3_hash_start) {
        (Some(Ok(hash)), _) => Hash::Done(*hash),
        (Some(Err(why)), _) | (None, Some(Err(why))) => return Err(why.clone()),
        (None, Some(Ok(start))) => Hash::Later(start.clone()),
        (None, None) => return Err("the hash was not computed".to_string()),
    };
    let (revision, compacted) = match &hash {
        Hash::Done(hash) => (hash.revision, hash.compact_revision),
        Hash::Later(start) => (start.revision(), start.compact_revision()),
    };
    if revision <= compacted {
        return Err(format!(
            "the data is compacted at its own revision {revision} (3.4 hashes no compacted revision)"
        ));
    }
    if !on_disk.alarms.is_empty() {
        return Err(format!(
            "the data holds the alarm {}: the recorded release reports it before a newer release runs on the data (which would raise its cluster version past the recorded release that must clear it)",
            on_disk.alarms.join(", ")
        ));
    }
    if let Some(bytes) = on_disk.db_bytes.filter(|b| *b >= NEAR_QUOTA_BYTES) {
        return Err(format!(
            "the db holds {bytes} bytes, near etcd's default backend quota (2 GiB): a write may raise NOSPACE, which the recorded release must meet first"
        ));
    }
    let Some(leases) = &on_disk.leases else {
        return Err("the data's leases were not read".to_string());
    };
    replays_without_a_snapshot(recorded, first, on_disk)?;
    let side = if recorded.has_v2_api() {
        Some(empty_v2_store(on_disk)?)
    } else {
        None
    };
    Ok(Offline(Kind::V3(Box::new(V3Parts {
        hash,
        leases: leases.clone(),
        side,
    }))))
}

/// The baseline of etcd2 data recorded at a 2.x release: its v2 store as
/// the replay of the stopped data gives it (`ondisk`'s v2 store), where
/// the log holds no write whose outcome the replay does not keep. The
/// first step (in place: a baseline is only read before one) reads the
/// whole store and compares, so a replay that were wrong fails that step
/// closed. A 3.x release serves etcd2 data's v3 keyspace beside it,
/// which a start reads.
fn offline_v2(recorded: Version, on_disk: &OnDisk) -> Result<Offline, String> {
    if recorded.major != 2 {
        return Err(format!(
            "etcd {recorded} serves a v3 keyspace beside the v2 store, which its start reads"
        ));
    }
    match &on_disk.v2_store {
        Some(Ok(leaves)) => Ok(Offline(Kind::V2(leaves.clone()))),
        Some(Err(why)) => Err(format!("the v2 store cannot be replayed offline: {why}")),
        None => Err("the v2 store was not read".to_string()),
    }
}

/// An offline baseline whose every part is read but, maybe, etcd's hash.
#[derive(Debug)]
pub struct Offline(Kind);

/// What an offline baseline is made of.
#[derive(Debug)]
enum Kind {
    /// etcd3 data.
    V3(Box<V3Parts>),
    /// etcd2 data at a 2.x release: every key of the v2 store.
    V2(Vec<V2Leaf>),
}

/// etcd3 data's baseline: etcd's hash from bolt, the leases, the v2 store
/// beside.
#[derive(Debug)]
struct V3Parts {
    hash: Hash,
    leases: BTreeMap<i64, i64>,
    side: Option<Fingerprint>,
}

/// etcd's hash from bolt: computed, or where its walk of the key bucket
/// starts.
#[derive(Debug)]
enum Hash {
    Done(OfflineHash),
    Later(HashStart),
}

impl Offline {
    /// The baseline, once the hash is computed (walking the key bucket
    /// here if it is still to do).
    pub fn take(self) -> Result<Fingerprint, String> {
        let (hash, leases, side) = match self.0 {
            Kind::V2(leaves) => return Ok(v2_fingerprint(&leaves, now_nanos())),
            Kind::V3(parts) => (parts.hash, parts.leases, parts.side),
        };
        let hash = match hash {
            Hash::Done(hash) => hash,
            Hash::Later(start) => start.hash()?,
        };
        Ok(Fingerprint::offline(
            hash.keys,
            KvHash {
                revision: hash.revision,
                hash: hash.hash,
                compact_revision: hash.compact_revision,
            },
            &leases,
            side,
        ))
    }

    /// [`Offline::take`] on a thread of its own, started now: the walk of
    /// a large key bucket (0.2 s at 200,000 keys) then runs while the
    /// binaries are verified and the first step's etcd starts, which waits
    /// for it before its first write (`HashStart` says why the walk may
    /// read the db while that etcd has it open).
    pub fn spawn(self) -> PendingBaseline {
        let (send, answer) = oneshot::channel();
        let started = Instant::now();
        let walk = move || {
            let taken = self.take();
            // The receiver is gone only if the run is: nothing to tell.
            let _ = send.send((taken, started.elapsed()));
        };
        if let Err(err) = std::thread::Builder::new()
            .name("offline-baseline".into())
            .spawn(walk)
        {
            return PendingBaseline::failed(format!("cannot start its thread: {err}"));
        }
        PendingBaseline { answer }
    }
}

/// An offline baseline being taken ([`Offline::spawn`]).
#[derive(Debug)]
pub struct PendingBaseline {
    answer: oneshot::Receiver<(Result<Fingerprint, String>, Duration)>,
}

impl PendingBaseline {
    /// One that is taken already.
    pub fn ready(fingerprint: Fingerprint) -> Self {
        Self::answered(Ok(fingerprint))
    }

    /// One that could not be taken, and why.
    pub fn failed(why: String) -> Self {
        Self::answered(Err(why))
    }

    fn answered(taken: Result<Fingerprint, String>) -> Self {
        let (send, answer) = oneshot::channel();
        let _ = send.send((taken, Duration::ZERO));
        PendingBaseline { answer }
    }

    /// The baseline, once taken (logged), or why it could not be.
    pub async fn wait(self) -> Result<Fingerprint, String> {
        let waiting = Instant::now();
        let (taken, took) = self
            .answer
            .await
            .map_err(|_| "its thread ended without an answer".to_string())?;
        if let Ok(fingerprint) = &taken {
            log::info(
                "offline baseline hashed",
                &[
                    ("fingerprint", fingerprint.to_string().into()),
                    ("ms", log::ms(took)),
                    ("waited_ms", log::ms(waiting.elapsed())),
                ],
            );
        }
        taken
    }
}

/// The fingerprint a whole read of the v2 store would give at `now`
/// (Unix nanoseconds): each key's seconds left as etcd lists them (the
/// part of a second begun counts; 0 once past, until etcd's expiry sweep
/// takes it out).
fn v2_fingerprint(leaves: &[V2Leaf], now: i64) -> Fingerprint {
    const NANOS: i64 = 1_000_000_000;
    let entries: Vec<Entry> = leaves
        .iter()
        .map(|leaf| Entry {
            key: leaf.key.as_bytes().to_vec(),
            value: leaf.value.as_bytes().to_vec(),
            ttl: leaf
                .expires
                .map(|at| (at.saturating_sub(now).max(0) + NANOS - 1) / NANOS),
            lease: 0,
        })
        .collect();
    Fingerprint::of(Storage::Etcd2, &entries)
}

/// Whether the first step's release starts on the data as it is, without
/// the snapshot the recorded release's start would have taken.
fn replays_without_a_snapshot(
    recorded: Version,
    first: &Step,
    on_disk: &OnDisk,
) -> Result<(), String> {
    let runs = first.runs();
    if let (true, Some(index)) = (
        runs.minor_line() >= Minor::new(3, 6),
        on_disk.v2_refused_by_3_6,
    ) {
        return Err(format!(
            "etcd {runs} refuses the v2 request at raft index {index} past the newest snapshot; the recorded release's start snapshots past it"
        ));
    }
    if let (true, Some(index)) = (
        runs.replays_only_v3_requests(),
        on_disk.v2_requests_past_snapshot,
    ) {
        return Err(format!(
            "etcd {runs} cannot replay the v2 request at raft index {index} past the newest snapshot; the recorded release's start snapshots past it"
        ));
    }
    if runs.minor_line() >= Minor::new(3, 6) && recorded.minor_line() < Minor::new(3, 6) {
        let names = on_disk
            .v2_names
            .as_ref()
            .ok_or("the v2 store's names were not read")?;
        if names.omitted() || !names.custom_content().is_empty() {
            return Err(format!(
                "etcd {runs} checks the newest snapshot's v2 store, which holds content or nodes with a TTL"
            ));
        }
    }
    if runs.minor_line() == Minor::new(3, 5) && recorded.minor_line() < Minor::new(3, 5) {
        let at_3x = on_disk
            .replay_cluster_version
            .as_deref()
            .is_some_and(|v| !v.starts_with("2."));
        if !at_3x {
            return Err(format!(
                "etcd {runs} would replay from {} (it comes up without v3 capabilities from a 2.x cluster version); the recorded release's start snapshots at its own",
                on_disk
                    .replay_cluster_version
                    .as_deref()
                    .map_or("a history whose cluster version is unknown".to_string(), |v| {
                        format!("cluster version {v}")
                    })
            ));
        }
    }
    Ok(())
}

/// The fingerprint of the data's v2 store beside its v3 keys, as a
/// release with a v2 API reads it: offline only when it is empty, and
/// known to be (no node left out for its TTL, no write in the WAL past
/// the snapshot whose outcome the names cannot tell).
fn empty_v2_store(on_disk: &OnDisk) -> Result<Fingerprint, String> {
    let names = on_disk
        .v2_names
        .as_ref()
        .ok_or("the v2 store's names were not read")?;
    if names.keys().next().is_some() || names.omitted() || names.uncertain() {
        return Err("the data's v2 store holds keys, which the recorded release reads".to_string());
    }
    Ok(Fingerprint::of(Storage::Etcd2, &[]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ondisk::{Keep, OfflineHash, V2Names};
    use crate::plan::{self, Bundle};
    use crate::version::VersionPair;
    use std::collections::BTreeMap;

    fn plan_of(from: &str, to: &str, bundle: &[&str]) -> Plan {
        plan_in(Storage::Etcd3, from, to, bundle)
    }

    /// The plan from `from` to `to` (both `storage`) with `bundle`, and
    /// its baseline reader.
    fn plan_in(storage: Storage, from: &str, to: &str, bundle: &[&str]) -> Plan {
        let pair = |s: &str| VersionPair {
            version: s.parse().expect("version"),
            storage,
        };
        let bundle = Bundle::new(bundle.iter().map(|v| v.parse().expect("version")));
        let mut plan = plan::plan(pair(from), pair(to), &bundle).expect("plan");
        plan.baseline = plan::baseline_reader(&plan, &bundle);
        plan
    }

    fn clean() -> OnDisk {
        OnDisk {
            v3_hash: Some(Ok(OfflineHash {
                revision: 120,
                compact_revision: 100,
                hash: 0xdead_beef,
                keys: 42,
            })),
            leases: Some(BTreeMap::from([(7, 3600)])),
            replay_cluster_version: Some("3.4.0".to_string()),
            v2_names: Some(V2Names::new(Keep::All)),
            ..OnDisk::default()
        }
    }

    fn etcd2_plan(from: &str, to: &str, bundle: &[&str]) -> Plan {
        plan_in(Storage::Etcd2, from, to, bundle)
    }

    #[test]
    fn etcd2_data_at_a_2x_release_gives_its_v2_store_as_a_whole_read_would() {
        let now = now_nanos();
        let leaves = vec![
            V2Leaf {
                key: "/registry/a".into(),
                value: "1".into(),
                expires: None,
            },
            V2Leaf {
                key: "/lock".into(),
                value: "me".into(),
                expires: Some(now + 30_000_000_000),
            },
        ];
        let on_disk = OnDisk {
            v2_store: Some(Ok(leaves)),
            ..OnDisk::default()
        };
        let hop = etcd2_plan("2.2.1", "3.0.17", &["2.2.1", "2.3.7", "3.0.17"]);
        let baseline = offline(&hop, &on_disk)
            .expect("offline")
            .take()
            .expect("taken");
        // What the first step's read lists: the same keys, the lock with
        // its TTL (seconds as etcd counts them).
        let read = Fingerprint::of(
            Storage::Etcd2,
            &[
                Entry {
                    key: b"/registry/a".to_vec(),
                    value: b"1".to_vec(),
                    ttl: None,
                    lease: 0,
                },
                Entry {
                    key: b"/lock".to_vec(),
                    value: b"me".to_vec(),
                    ttl: Some(29),
                    lease: 0,
                },
            ],
        );
        assert_eq!(baseline.keys, 2);
        baseline.check_kept_by(&read).expect("kept");
        // A value that differs fails the step closed.
        let changed = Fingerprint::of(
            Storage::Etcd2,
            &[Entry {
                key: b"/registry/a".to_vec(),
                value: b"2".to_vec(),
                ttl: None,
                lease: 0,
            }],
        );
        assert!(baseline.check_kept_by(&changed).is_err());

        let unknown = OnDisk {
            v2_store: Some(Err("a POST to /1/q".into())),
            ..OnDisk::default()
        };
        let err = offline(&hop, &unknown).expect_err("unknown");
        assert!(err.contains("a POST to /1/q"), "{err}");
        let at_3 = etcd2_plan("3.0.17", "3.1.20", &["3.0.17", "3.1.20"]);
        let err = offline(&at_3, &on_disk).expect_err("3.x");
        assert!(err.contains("v3 keyspace beside"), "{err}");
    }

    #[test]
    fn a_clean_stop_gives_the_baseline_and_every_hazard_falls_back_saying_why() {
        let hop = plan_of("3.4.23", "3.5.30", &["3.4.23", "3.5.30"]);
        let baseline = offline(&hop, &clean())
            .expect("offline")
            .take()
            .expect("computed");
        assert_eq!(baseline.keys, 42);
        // v2 writes past the snapshot whose outcome the names tell (the
        // deletes of a storage migration's v2 cleanup) leave it offline,
        // for a release that replays them (below 3.6).
        let emptied = OnDisk {
            v2_refused_by_3_6: Some(77),
            ..clean()
        };
        assert!(offline(&hop, &emptied).expect("offline").take().is_ok());
        let cases: Vec<(&str, Plan, OnDisk, &str)> = vec![
            (
                "unfinished compaction",
                hop.clone(),
                OnDisk {
                    v3_hash: Some(Err("a compaction to revision 130 is scheduled".into())),
                    ..clean()
                },
                "scheduled",
            ),
            (
                "3.5 from a 2.x snapshot",
                hop.clone(),
                OnDisk {
                    replay_cluster_version: Some("2.3.0".into()),
                    ..clean()
                },
                "without v3 capabilities",
            ),
            (
                "3.5 on an unknown history",
                hop.clone(),
                OnDisk {
                    replay_cluster_version: None,
                    ..clean()
                },
                "unknown",
            ),
            (
                "v2 keys beside",
                hop.clone(),
                OnDisk {
                    v2_names: Some(V2Names::for_test(&["/1/a"], &[], false)),
                    ..clean()
                },
                "v2 store holds keys",
            ),
            (
                "a v2 key that may not have expired",
                hop.clone(),
                OnDisk {
                    v2_names: Some(V2Names::for_test(&[], &["/1/lock"], false)),
                    ..clean()
                },
                "v2 store holds keys",
            ),
            (
                "a v2 write whose outcome is unknown",
                hop.clone(),
                OnDisk {
                    v2_names: Some(V2Names::for_test(&[], &[], true)),
                    ..clean()
                },
                "v2 store holds keys",
            ),
            (
                "3.7 on 3.5's requests",
                plan_of("3.6.14", "3.7.1", &["3.6.14", "3.7.1"]),
                OnDisk {
                    v2_requests_past_snapshot: Some(90),
                    ..clean()
                },
                "cannot replay the v2 request at raft index 90",
            ),
            (
                "3.6 on a v2 write",
                plan_of("3.5.30", "3.6.14", &["3.5.30", "3.6.14"]),
                OnDisk {
                    v2_refused_by_3_6: Some(91),
                    ..clean()
                },
                "refuses the v2 request at raft index 91",
            ),
            (
                "compacted at its revision",
                hop.clone(),
                OnDisk {
                    v3_hash: Some(Ok(OfflineHash {
                        revision: 100,
                        compact_revision: 100,
                        hash: 1,
                        keys: 1,
                    })),
                    ..clean()
                },
                "compacted at its own revision",
            ),
            (
                "an alarm raised",
                hop.clone(),
                OnDisk {
                    alarms: vec!["NOSPACE".into()],
                    ..clean()
                },
                "holds the alarm NOSPACE",
            ),
            (
                "a rollback",
                plan_of("3.5.30", "3.4.23", &["3.4.23", "3.5.30"]),
                clean(),
                "reads no baseline",
            ),
        ];
        for (name, plan, on_disk, why) in cases {
            let err = offline(&plan, &on_disk).expect_err(name);
            assert!(err.contains(why), "{name}: {err}");
        }
    }
}
