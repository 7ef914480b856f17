//! Every adjacent transition of the supported paths on real etcd,
//! including the releases the registries do not have (2.2.1, 2.3.7,
//! 3.0.17, 3.1.20, 3.2.32): they come from the dir `$ETCD_EXTRA_BIN_DIR`
//! names (upstream release tarballs unpacked into a dir). Each case builds
//! a small data dir with its first release (etcd2: v2 keys, some with
//! TTLs; etcd3: v3 keys, keys on two leases, and keys written through the
//! v2 API, one with a TTL), runs etcd-migrate to its target, and reads the
//! result back with the target release: every key with its value, every
//! lease or TTL within what the time elapsed allows, nothing else.
//!
//! - up: 2.2 → 2.3 → 3.0 (etcd2), 3.0 → 3.1 → 3.2 → 3.3 → 3.4 → 3.5 (etcd3);
//! - the storage migration at each of 3.0 … 3.4;
//! - down: 3.7 → 3.6 → 3.5 and 3.5 → 3.4.45 through etcd's own downgrade
//!   (issue 19), 3.5 → 3.4.23 → 3.3 → 3.2 → 3.1 → 3.0 by snapshot and
//!   restore, and 3.0/etcd3 → 2.2.1/etcd2;
//! - the Kubernetes 1.5 → 1.6 path (2.2.1/etcd2 → 3.0.17/etcd3) and the
//!   whole walk 2.2.1/etcd2 → 3.5.16/etcd3;
//! - today's releases (issue 18): 3.5.16 → 3.5.30 → 3.6.14, 3.6.14 →
//!   3.7.1, 3.5.16 → 3.7.1 in one run, 3.6.10 → 3.6.14 → 3.7.1 (upstream's
//!   patch floors), and the whole walk 2.2.1/etcd2 → 3.7.1/etcd3. From 3.6
//!   on there is no v2 store to carry: those fixtures write none (a v2 key
//!   in the data is refused before 3.6 runs, see `v2_content`).
//!
//! Each case is a test of the `releases` target (libtest-mimic): one whose
//! binaries are missing says NOT RUN on stderr, naming them, and is
//! counted as ignored, never as passed. The cases run as many at once as
//! `--test-threads` says (the machine's CPUs by default).

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write as _;
use std::path::Path;
use std::time::{Duration, Instant};

use etcd_client::PutOptions;
use libtest_mimic::Trial;

use crate::harness::etcd::{connect, EtcdProcess};
use crate::harness::keyspace::Keyspace;
use crate::harness::migrator::Migration;
use crate::harness::v2::{self, read_back_v2, v2_flags, V2Fixture, V2Key, V2Keyspace};
use crate::harness::{
    block_on, extra_bin_dir, find_binary, free_port, linked_bin_dir, read_version_txt, set_mode,
    temp_dir, write_version_txt, Member, WORK_DIR,
};

/// The etcd3 fixture's leases: one of an hour (events), one of 20 minutes
/// (node leases).
const LONG_LEASE_SECS: i64 = 3600;
const SHORT_LEASE_SECS: i64 = 1200;

/// What must be left of a lease after a case (minutes at most pass).
const MIN_REMAINING_TTL: i64 = 900;

/// TTLs may read up to this much shorter than the time elapsed allows:
/// etcd rounds them (v2 up, v3 down), and a step restarts the count.
const TTL_MARGIN_SECS: i64 = 5;

/// How long one etcd-migrate run of a case may take (the whole walk is 8
/// steps, ~5 s on an idle machine).
const CASE_MIGRATE_TIMEOUT: Duration = Duration::from_secs(300);

/// The v2 keys written into etcd3 data: a flannel-style config and a lock
/// with a TTL.
const FLANNEL: &str = "/coreos.com/network/config";
const LOCK: &str = "/legacy/lock";

/// What a case's data holds before the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Data {
    /// etcd2 storage: v2 keys in nested dirs, some with TTLs.
    Etcd2,
    /// etcd3 storage: v3 keys, keys on two leases, and v2 keys.
    Etcd3,
}

/// One transition.
#[derive(Debug, Clone)]
struct Case {
    /// What version.txt holds before (its release writes the fixture).
    from: &'static str,
    /// The target pair.
    to: &'static str,
    /// Every release the path runs.
    releases: &'static [&'static str],
    /// The kinds of the steps the plan must have.
    steps: &'static [&'static str],
}

impl Case {
    fn name(&self) -> String {
        match self.steps {
            [kind] => format!("{} -> {} ({kind})", self.from, self.to),
            steps => format!("{} -> {} ({} steps)", self.from, self.to, steps.len()),
        }
    }

    fn data(&self) -> Data {
        if self.from.ends_with("/etcd2") {
            Data::Etcd2
        } else {
            Data::Etcd3
        }
    }

    fn first_release(&self) -> &'static str {
        release_of(self.from)
    }

    /// Whether the path reaches a release without a v2 store (3.6+): its
    /// etcd3 fixture then writes no v2 keys, which 3.6 refuses.
    fn reaches_v3_only(&self) -> bool {
        self.releases.iter().any(|v| !has_v2_store(v))
    }

    fn target_release(&self) -> &'static str {
        release_of(self.to)
    }

    /// The binaries the case runs that are nowhere to be found: each
    /// release's etcd, and the etcdctl of 3.x ones (`migrate`, `snapshot`;
    /// a 2.x etcdctl is never run).
    fn missing(&self) -> Vec<String> {
        self.releases
            .iter()
            .flat_map(|v| {
                let tools = if v.starts_with("2.") {
                    vec![format!("etcd-{v}")]
                } else {
                    vec![format!("etcd-{v}"), format!("etcdctl-{v}")]
                };
                tools
            })
            .filter(|name| find_binary(name).is_none())
            .collect()
    }
}

fn release_of(pair: &'static str) -> &'static str {
    pair.split('/').next().unwrap_or(pair)
}

/// Whether `version` serves a v2 store at all (2.x … 3.5).
fn has_v2_store(version: &str) -> bool {
    let minor: Vec<u32> = version
        .split('.')
        .take(2)
        .filter_map(|n| n.parse().ok())
        .collect();
    minor < vec![3, 6]
}

const UP: &[&str] = &["minor-upgrade"];
const DOWN: &[&str] = &["minor-rollback"];
const DOWNGRADE: &[&str] = &["minor-downgrade"];
const STORAGE: &[&str] = &["storage-migration"];

/// Every case, in the order they are started.
fn cases() -> Vec<Case> {
    let case = |from, to, releases, steps| Case {
        from,
        to,
        releases,
        steps,
    };
    vec![
        // The longest first, so the pool ends together.
        case(
            "2.2.1/etcd2",
            "3.7.1/etcd3",
            &[
                "2.2.1", "2.3.7", "3.0.17", "3.1.20", "3.2.32", "3.3.25", "3.4.23", "3.5.30",
                "3.6.14", "3.7.1",
            ],
            &[
                "minor-upgrade",
                "minor-upgrade",
                "storage-migration",
                "minor-upgrade",
                "minor-upgrade",
                "minor-upgrade",
                "minor-upgrade",
                "minor-upgrade",
                "minor-upgrade",
                "minor-upgrade",
            ],
        ),
        // Today's releases, through upstream's patch floors.
        case(
            "3.5.16/etcd3",
            "3.7.1/etcd3",
            &["3.5.16", "3.5.30", "3.6.14", "3.7.1"],
            &["patch-upgrade", "minor-upgrade", "minor-upgrade"],
        ),
        case(
            "3.5.16/etcd3",
            "3.6.14/etcd3",
            &["3.5.16", "3.5.30", "3.6.14"],
            &["patch-upgrade", "minor-upgrade"],
        ),
        case("3.6.14/etcd3", "3.7.1/etcd3", &["3.6.14", "3.7.1"], UP),
        case(
            "3.6.10/etcd3",
            "3.7.1/etcd3",
            &["3.6.10", "3.6.14", "3.7.1"],
            &["patch-upgrade", "minor-upgrade"],
        ),
        case(
            "2.2.1/etcd2",
            "3.5.16/etcd3",
            &[
                "2.2.1", "2.3.7", "3.0.17", "3.1.20", "3.2.32", "3.3.25", "3.4.23", "3.5.16",
            ],
            &[
                "minor-upgrade",
                "minor-upgrade",
                "storage-migration",
                "minor-upgrade",
                "minor-upgrade",
                "minor-upgrade",
                "minor-upgrade",
                "minor-upgrade",
            ],
        ),
        // Kubernetes 1.5 -> 1.6 and back.
        case(
            "2.2.1/etcd2",
            "3.0.17/etcd3",
            &["2.2.1", "2.3.7", "3.0.17"],
            &["minor-upgrade", "minor-upgrade", "storage-migration"],
        ),
        case(
            "3.0.17/etcd3",
            "2.2.1/etcd2",
            &["3.0.17", "2.2.1"],
            &["rollback-to-etcd2"],
        ),
        // Up.
        case("2.2.1/etcd2", "2.3.7/etcd2", &["2.2.1", "2.3.7"], UP),
        case("2.3.7/etcd2", "3.0.17/etcd2", &["2.3.7", "3.0.17"], UP),
        case("3.0.17/etcd3", "3.1.20/etcd3", &["3.0.17", "3.1.20"], UP),
        case("3.1.20/etcd3", "3.2.32/etcd3", &["3.1.20", "3.2.32"], UP),
        case("3.2.32/etcd3", "3.3.25/etcd3", &["3.2.32", "3.3.25"], UP),
        case("3.3.25/etcd3", "3.4.23/etcd3", &["3.3.25", "3.4.23"], UP),
        case("3.4.23/etcd3", "3.5.16/etcd3", &["3.4.23", "3.5.16"], UP),
        // The storage migration at each release that has `etcdctl migrate`.
        case("3.0.17/etcd2", "3.0.17/etcd3", &["3.0.17"], STORAGE),
        case("3.1.20/etcd2", "3.1.20/etcd3", &["3.1.20"], STORAGE),
        case("3.2.32/etcd2", "3.2.32/etcd3", &["3.2.32"], STORAGE),
        case("3.3.25/etcd2", "3.3.25/etcd3", &["3.3.25"], STORAGE),
        case("3.4.23/etcd2", "3.4.23/etcd3", &["3.4.23"], STORAGE),
        // Down through etcd's own downgrade (issue 19), where the pair has
        // one: 3.7 -> 3.6 -> 3.5, and 3.5 -> 3.4.31+.
        case(
            "3.7.1/etcd3",
            "3.5.30/etcd3",
            &["3.7.1", "3.6.14", "3.5.30"],
            &["minor-downgrade", "minor-downgrade"],
        ),
        case(
            "3.7.1/etcd3",
            "3.6.14/etcd3",
            &["3.7.1", "3.6.14"],
            DOWNGRADE,
        ),
        case(
            "3.6.14/etcd3",
            "3.5.30/etcd3",
            &["3.6.14", "3.5.30"],
            DOWNGRADE,
        ),
        case(
            "3.5.30/etcd3",
            "3.4.45/etcd3",
            &["3.5.30", "3.4.45"],
            DOWNGRADE,
        ),
        // Down by snapshot and restore.
        case("3.5.16/etcd3", "3.4.23/etcd3", &["3.5.16", "3.4.23"], DOWN),
        case("3.4.23/etcd3", "3.3.25/etcd3", &["3.4.23", "3.3.25"], DOWN),
        case("3.3.25/etcd3", "3.2.32/etcd3", &["3.3.25", "3.2.32"], DOWN),
        case("3.2.32/etcd3", "3.1.20/etcd3", &["3.2.32", "3.1.20"], DOWN),
        case("3.1.20/etcd3", "3.0.17/etcd3", &["3.1.20", "3.0.17"], DOWN),
    ]
}

/// A line on the test process's own stderr: the test runner captures
/// `eprintln!` of a passing test, and a case that could not run must be
/// seen.
fn say(line: &str) {
    let mut stderr = std::io::stderr().lock();
    let _ = writeln!(stderr, "old_releases: {line}");
    let _ = stderr.flush();
}

/// Every case as its own test: one whose binaries are missing is listed
/// as ignored, after its NOT RUN line naming them, never run or counted
/// as passed.
pub fn trials() -> Vec<Trial> {
    let mut trials: Vec<Trial> = cases()
        .into_iter()
        .map(|case| {
            let missing = case.missing();
            let name = format!("old_releases::{}", case.name());
            let ignored = !missing.is_empty();
            if ignored {
                let why = match extra_bin_dir() {
                    Some(dir) => format!("{} has no {}", dir.display(), missing.join(", ")),
                    None => format!(
                        "set ETCD_EXTRA_BIN_DIR to a dir with {}",
                        missing.join(", ")
                    ),
                };
                say(&format!(
                    "NOT RUN for want of binaries: {} ({why})",
                    case.name()
                ));
            }
            Trial::test(name, move || {
                check_case(&case);
                Ok(())
            })
            .with_ignored_flag(ignored)
        })
        .collect();
    for version in ["3.0.17", "3.1.20", "3.2.32", "3.3.25"] {
        let name = format!("old_releases::migration_beside_a_v3_history_{version}");
        let missing = find_binary(&format!("etcd-{version}")).is_none()
            || find_binary(&format!("etcdctl-{version}")).is_none();
        if missing {
            say(&format!(
                "NOT RUN for want of binaries: {name} (set ETCD_EXTRA_BIN_DIR to a dir with etcd-{version}, etcdctl-{version})"
            ));
        }
        trials.push(
            Trial::test(name, move || {
                migration_beside_a_v3_history(version);
                Ok(())
            })
            .with_ignored_flag(missing),
        );
    }
    trials
}

/// The v3 keys written beside the v2 store of the etcd2 data of
/// [`migration_beside_a_v3_history`]: a leased lock, the survivor of a
/// transaction of two puts, the Kubernetes tool's `etcd_version`.
const V3_HISTORY_KEPT: [&str; 3] = ["/etcd-migrate/lock", "/etcd-migrate/b", "etcd_version"];

/// etcd2 data whose v3 keyspace has a history (a leased key, a
/// transaction, a delete: what the cluster mode's locks and a pause job
/// leave in an etcd2 cluster served by 3.x) migrated to etcd3 at its own
/// release. Before 3.3, `etcdctl migrate` of such data made a db its own
/// release fatals on at the first put ("mvcc: range cannot find rev",
/// 3.0.17, 3.1.20 and 3.2.32); the step compacts the v3 history on its
/// copy first. Every v2 key is in v3 with its TTL as a lease, the live
/// v3 keys with their values, the deleted one gone.
fn migration_beside_a_v3_history(version: &'static str) {
    let tag = format!("old-v3-history-{version}").replace('.', "_");
    let tmp = temp_dir(&tag);
    let data = tmp.path().join("data");
    let member = Member::new(&tag);
    let fixture = v2::build(
        version,
        &data,
        &member,
        tmp.path(),
        &v2::kubernetes_like(12, &[SHORT_LEASE_SECS, LONG_LEASE_SECS], 4),
    );
    let mut etcd = EtcdProcess::start_with(
        version,
        &member,
        &data,
        free_port(),
        tmp.path(),
        v2_flags(version),
    );
    block_on(async {
        etcd.wait_ready().await;
        let mut client = connect(&etcd.endpoint()).await.expect("connect");
        let lease = client
            .lease_grant(LONG_LEASE_SECS, None)
            .await
            .expect("grant")
            .id();
        client
            .put(
                V3_HISTORY_KEPT[0],
                "held",
                Some(PutOptions::new().with_lease(lease)),
            )
            .await
            .expect("put the lock");
        client
            .txn(etcd_client::Txn::new().and_then([
                etcd_client::TxnOp::put("/etcd-migrate/a", "1", None),
                etcd_client::TxnOp::put(V3_HISTORY_KEPT[1], "2", None),
            ]))
            .await
            .expect("txn");
        client
            .delete("/etcd-migrate/a", None)
            .await
            .expect("delete");
        client
            .put(V3_HISTORY_KEPT[2], version, None)
            .await
            .expect("put etcd_version");
    });
    etcd.stop();
    let bin = linked_bin_dir(&[version], tmp.path());
    let run = Migration::new(version, &data, &member)
        .bin_dir(&bin)
        .arg("--target-storage")
        .arg("etcd3")
        .spawn()
        .wait(CASE_MIGRATE_TIMEOUT);
    run.assert_code(0);
    assert_eq!(run.step_kinds(), ["storage-migration"], "{}", run.explain());
    assert_eq!(
        read_version_txt(&data),
        format!("{version}/etcd3"),
        "{}",
        run.explain()
    );
    let compacted = !run.lines_with("v3 history compacted").is_empty();
    assert_eq!(
        compacted,
        version < "3.3",
        "the history is compacted before 3.3's migrate only:\n{}",
        run.explain()
    );
    let (mut v3, read_at, v2_after) = read_back_v3(version, &member, &data, tmp.path());
    let side: BTreeMap<Vec<u8>, _> = V3_HISTORY_KEPT
        .iter()
        .map(|key| {
            let entry = v3.entries.remove(key.as_bytes());
            // The lock's lease goes with it: the check below wants every
            // lease to hold a migrated key.
            if let Some(entry) = &entry {
                v3.leases.remove(&entry.lease);
            }
            (key.as_bytes().to_vec(), entry)
        })
        .collect();
    for (key, entry) in &side {
        let key = String::from_utf8_lossy(key);
        let entry = entry
            .as_ref()
            .unwrap_or_else(|| panic!("{key}: the v3 key is gone\n{}", run.explain()));
        let want = match key.as_ref() {
            "/etcd-migrate/lock" => "held",
            "/etcd-migrate/b" => "2",
            _ => version,
        };
        assert_eq!(entry.value, want.as_bytes(), "{key}: its value");
        assert_eq!(
            entry.lease != 0,
            key == "/etcd-migrate/lock",
            "{key}: its lease"
        );
    }
    assert!(
        !v3.entries.contains_key("/etcd-migrate/a".as_bytes()),
        "the deleted v3 key came back"
    );
    v3.assert_no_health_key();
    v2::assert_migrated(&v3, &fixture, read_at, &BTreeSet::new(), false);
    v2_after.assert_empty();
}

/// What a case expects of the v2 store: each leaf's value and, if it
/// expires, its TTL and when that began to count.
type V2Expected = BTreeMap<String, (String, Option<(i64, Instant)>)>;

/// The fixture a case starts from.
enum Fixture {
    Etcd2(V2Fixture),
    Etcd3(V3Fixture),
}

/// etcd3 data: what its etcd served when the fixture was written.
struct V3Fixture {
    /// The v3 keyspace.
    keyspace: Keyspace,
    /// Each lease's TTL and when it was granted.
    leases: BTreeMap<i64, (i64, Instant)>,
    /// The keys written through the v2 API.
    v2_side: V2Expected,
}

fn check_case(case: &Case) {
    let tag = format!("old-{}-{}", case.from, case.to).replace(['/', '.'], "_");
    let tmp = temp_dir(&tag);
    let data = tmp.path().join("data");
    let member = Member::new(&tag);
    let from = case.first_release();
    let fixture = match case.data() {
        Data::Etcd2 => Fixture::Etcd2(v2::build(
            from,
            &data,
            &member,
            tmp.path(),
            &v2::kubernetes_like(12, &[SHORT_LEASE_SECS, LONG_LEASE_SECS], 4),
        )),
        Data::Etcd3 => Fixture::Etcd3(build_v3(
            from,
            &data,
            &member,
            tmp.path(),
            case.to.ends_with("/etcd2"),
            !case.reaches_v3_only(),
        )),
    };
    let bin = linked_bin_dir(case.releases, tmp.path());
    let (to_version, to_storage) = (case.target_release(), release_storage(case.to));
    let run = Migration::new(to_version, &data, &member)
        .bin_dir(&bin)
        .arg("--target-storage")
        .arg(to_storage)
        .spawn()
        .wait(CASE_MIGRATE_TIMEOUT);
    run.assert_code(0);
    assert_eq!(run.step_kinds(), case.steps, "{}", run.explain());
    assert_eq!(read_version_txt(&data), case.to, "{}", run.explain());
    assert!(!data.join(WORK_DIR).exists(), "the scratch dir is removed");
    // Every etcd stops on SIGTERM with its data saved (2.2.1 once died in
    // a snapshot it was given no time to finish).
    assert!(
        run.lines_with("etcd healthy but stopped uncleanly")
            .is_empty(),
        "an etcd did not stop cleanly\n{}",
        run.explain()
    );

    match (&fixture, to_storage) {
        (Fixture::Etcd2(fixture), "etcd2") => {
            let v2 = read_back_v2(to_version, &member, &data, tmp.path());
            assert_v2_holds(&v2, &v2_expected(fixture), "the etcd2 data");
        }
        (Fixture::Etcd2(fixture), _) => {
            let (v3, read_at, v2_after) = read_back_v3(to_version, &member, &data, tmp.path());
            v3.assert_no_health_key();
            v2::assert_migrated(&v3, fixture, read_at, &BTreeSet::new(), false);
            v2_after.assert_empty();
        }
        (Fixture::Etcd3(fixture), "etcd2") => {
            let v2 = read_back_v2(to_version, &member, &data, tmp.path());
            let mut expected = fixture.v2_side.clone();
            for (key, entry) in &fixture.keyspace.entries {
                let path = format!("/{}", String::from_utf8_lossy(key).trim_start_matches('/'));
                let ttl = (entry.lease != 0).then(|| fixture.leases[&entry.lease]);
                let value = String::from_utf8(entry.value.clone())
                    .unwrap_or_else(|_| panic!("{path}: the fixture for etcd2 holds text only"));
                expected.insert(path, (value, ttl));
            }
            assert_v2_holds(&v2, &expected, "the v3 keys and v2 keys rebuilt as etcd2");
        }
        (Fixture::Etcd3(fixture), _) => {
            let (v3, _, v2_side) = read_back_v3(to_version, &member, &data, tmp.path());
            v3.assert_kept(&fixture.keyspace, MIN_REMAINING_TTL);
            v3.assert_revisions_kept(&fixture.keyspace);
            assert_v2_holds(&v2_side, &fixture.v2_side, "the v2 store of etcd3 data");
        }
    }
}

fn release_storage(pair: &'static str) -> &'static str {
    pair.split('/').nth(1).unwrap_or("etcd3")
}

/// What the v2 fixture wrote, as expected of a v2 store.
fn v2_expected(fixture: &V2Fixture) -> V2Expected {
    fixture
        .keys
        .iter()
        .map(|written| {
            (
                written.key.path.clone(),
                (
                    written.key.value.clone(),
                    written.key.ttl.map(|ttl| (ttl, written.sent)),
                ),
            )
        })
        .collect()
}

/// Asserts the v2 store holds exactly `expected` (health keys under
/// their own TTL aside): each value, no TTL where none was written, and a
/// TTL no longer than written and no shorter than the time elapsed since
/// allows.
fn assert_v2_holds(v2: &V2Keyspace, expected: &V2Expected, what: &str) {
    let leaves = v2.without_health_key();
    let mut problems = Vec::new();
    for (path, (value, ttl)) in expected {
        let Some(node) = leaves.get(path) else {
            problems.push(format!("{path} is missing"));
            continue;
        };
        if &node.value != value {
            problems.push(format!("{path}: value {value:?} became {:?}", node.value));
        }
        match (ttl, node.expiration.is_some(), node.ttl) {
            (None, false, _) => {}
            (None, true, got) => problems.push(format!("{path} had no TTL but has {got:?}")),
            (Some((want, _)), false, _) => problems.push(format!(
                "{path} had a TTL of {want} s but has none: it would never expire"
            )),
            (Some((want, since)), true, got) => {
                let elapsed = since.elapsed().as_secs_f64().ceil() as i64;
                let low = want - elapsed - TTL_MARGIN_SECS;
                let got = got.unwrap_or(0);
                if got <= low || got > *want {
                    problems.push(format!(
                        "{path}: TTL {got} s, want ({low}, {want}] ({want} s written {elapsed} s ago)"
                    ));
                }
            }
        }
    }
    for path in leaves.keys().filter(|path| !expected.contains_key(*path)) {
        problems.push(format!("{path} is in the v2 store but was never written"));
    }
    assert!(
        problems.is_empty(),
        "{what}: the v2 store differs ({} expected, {} found):\n{}",
        expected.len(),
        leaves.len(),
        problems.join("\n")
    );
}

/// Writes etcd3 data with `version`: 16 plain keys (one binary unless
/// `text_only`), `compact_rev_key`, 5 keys on an hour's lease, 3 on a
/// shorter one, and (`with_v2`) two v2 keys (one with an hour's TTL).
/// Returns what its etcd served.
fn build_v3(
    version: &str,
    data: &Path,
    member: &Member,
    logs: &Path,
    text_only: bool,
    with_v2: bool,
) -> V3Fixture {
    let mut etcd =
        EtcdProcess::start_with(version, member, data, free_port(), logs, v2_flags(version));
    let fixture = block_on(async {
        etcd.wait_ready().await;
        let endpoint = etcd.endpoint();
        let mut client = connect(&endpoint)
            .await
            .unwrap_or_else(|err| panic!("connect {endpoint}: {err}"));
        let mut leases = BTreeMap::new();
        let mut ids = Vec::new();
        for ttl in [LONG_LEASE_SECS, SHORT_LEASE_SECS] {
            let asked = Instant::now();
            let lease = client
                .lease_grant(ttl, None)
                .await
                .unwrap_or_else(|err| panic!("grant a lease on {endpoint}: {err}"));
            leases.insert(lease.id(), (lease.ttl(), asked));
            ids.push(lease.id());
        }
        let mut puts: Vec<(String, Vec<u8>, i64)> = (0..16)
            .map(|i| {
                let value = match i {
                    0 if !text_only => (0..=255u8).rev().collect(),
                    1 => "ünïcødé ✓ 日本語".as_bytes().to_vec(),
                    2 => Vec::new(),
                    _ => format!(r#"{{"kind":"Pod","metadata":{{"name":"p-{i}"}}}}"#).into_bytes(),
                };
                (format!("/registry/pods/ns-{}/p-{i:02}", i % 3), value, 0)
            })
            .collect();
        puts.push(("compact_rev_key".to_string(), b"42".to_vec(), 0));
        puts.extend((0..5).map(|i| {
            (
                format!("/registry/events/ns-{}/event-{i}", i % 2),
                format!("event {i} ✓").into_bytes(),
                ids[0],
            )
        }));
        puts.extend((0..3).map(|i| {
            (
                format!("/registry/leases/kube-node-lease/node-{i}"),
                format!("node {i}").into_bytes(),
                ids[1],
            )
        }));
        for (key, value, lease) in puts {
            let options = (lease != 0).then(|| PutOptions::new().with_lease(lease));
            client
                .put(key.clone(), value, options)
                .await
                .unwrap_or_else(|err| panic!("put {key} on {endpoint}: {err}"));
        }
        let http = v2::http_client();
        let mut v2_side = V2Expected::new();
        let v2_keys = [
            V2Key::plain(FLANNEL, r#"{"Network":"10.1.0.0/16"}"#),
            V2Key::expiring(LOCK, "held ✓", LONG_LEASE_SECS),
        ];
        for key in v2_keys.into_iter().filter(|_| with_v2) {
            let sent = Instant::now();
            v2::put(&http, &endpoint, &key.path, &key.value, key.ttl)
                .await
                .unwrap_or_else(|err| panic!("v2 put {}: {err}", key.path));
            v2_side.insert(key.path, (key.value, key.ttl.map(|ttl| (ttl, sent))));
        }
        let granted: BTreeMap<i64, i64> = leases.iter().map(|(id, (ttl, _))| (*id, *ttl)).collect();
        let since = leases
            .values()
            .map(|(_, at)| *at)
            .min()
            .unwrap_or_else(Instant::now);
        let keyspace = Keyspace::read_granted(&endpoint, &granted, since).await;
        V3Fixture {
            keyspace,
            leases,
            v2_side,
        }
    });
    etcd.stop();
    assert_eq!(
        fixture.keyspace.entries.len(),
        25,
        "every key written is served"
    );
    assert_eq!(fixture.keyspace.leases.len(), 2);
    set_mode(data, 0o700);
    write_version_txt(data, &format!("{version}/etcd3"));
    fixture
}

/// Serves the etcd3 data with `version` (the v2 API on), reads its v3
/// keyspace and its v2 store, and stops it. A release without
/// LeaseTimeToLive (3.0) learns its leases' TTLs from the data's own
/// record, read before it starts, as etcd-migrate does.
fn read_back_v3(
    version: &str,
    member: &Member,
    data: &Path,
    logs: &Path,
) -> (Keyspace, Instant, V2Keyspace) {
    let granted = etcd_migrate::ondisk::read(data)
        .unwrap_or_else(|err| panic!("read {} offline: {err}", data.display()))
        .leases
        .unwrap_or_default();
    let started = Instant::now();
    let mut etcd =
        EtcdProcess::start_with(version, member, data, free_port(), logs, v2_flags(version));
    let read = block_on(async {
        etcd.wait_ready().await;
        let v3 = Keyspace::read_granted(&etcd.endpoint(), &granted, started).await;
        let read_at = Instant::now();
        let v2 = match has_v2_store(version) {
            true => V2Keyspace::read(&etcd.endpoint()).await,
            false => V2Keyspace::default(),
        };
        (v3, read_at, v2)
    });
    etcd.stop();
    read
}
