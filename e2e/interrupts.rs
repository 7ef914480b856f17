//! Crashes and stops in the middle of the steps that rewrite data: each new
//! step kind is SIGKILLed at points picked from its log lines (etcd-migrate
//! dies at once; its etcd and tools get SIGTERM from the parent-death
//! signal), then rerun to the same target, which must converge: exit 0, the
//! target recorded, the fixture's keyspace, no scratch dir, no process
//! left. One more run is stopped with SIGTERM during a rollback.

use std::path::Path;
use std::time::Duration;

use nix::sys::signal::Signal;
use tempfile::TempDir;

use crate::harness::etcd::read_back;
use crate::harness::fixture::{self, Fixture, FixtureSpec, LEASE_TTL_SECS};
use crate::harness::migrator::{is_ours, Migration, Outcome};
use crate::harness::v2::{self, assert_v2_copy, read_back_v2, V2Fixture};
use crate::harness::{
    read_version_txt, temp_dir, wait_for_no_process_on, Member, STOP_GRACE, VERSION_TEMP, WORK_DIR,
};

/// How long a run may take to reach the line it is stopped at.
const LINE_TIMEOUT: Duration = Duration::from_secs(60);

/// How long the killed run's etcd and tools may outlive it (milliseconds
/// here; the margin is for a loaded machine).
const ORPHANS_GONE_TIMEOUT: Duration = Duration::from_secs(30);

/// The journal of a rebuilding step's swap, in its scratch dir.
const SWAP_JOURNAL: &str = "swap-journal";

/// Whether `line` is our `message` line and contains every one of `parts`.
fn ours(line: &str, message: &str, parts: &[&str]) -> bool {
    is_ours(line, message) && parts.iter().all(|part| line.contains(part))
}

/// Runs `migration`, sends `signal` right after the `nth` stderr line that
/// `matches` accepts, and waits for the end. Then waits until no process
/// runs on the data dir any more (the step's etcd, an etcdctl). Returns
/// how the run ended, and whether the signal was sent before it ended.
fn interrupt(
    migration: &Migration,
    signal: Signal,
    what: &str,
    nth: usize,
    matches: impl Fn(&str) -> bool,
) -> (Outcome, bool) {
    let mut running = migration.spawn();
    let mut line = String::new();
    for _ in 0..nth {
        line = running.wait_for_line(what, LINE_TIMEOUT, &matches);
    }
    let sent = running.signal_if_running(signal);
    let outcome = running.wait(STOP_GRACE * 2);
    wait_for_no_process_on(&migration.data_dir, ORPHANS_GONE_TIMEOUT);
    migration.wait_for_ports_free(ORPHANS_GONE_TIMEOUT);
    let killed = std::os::unix::process::ExitStatusExt::signal(&outcome.status);
    // Where the signal really landed: the run's last line of its own.
    let last = outcome.our_lines().last().map(|l| l.to_string());
    eprintln!(
        "[{what}] {signal} {} after {line:?}: ended with {}; its last line: {last:?}; left: {}",
        if sent { "sent" } else { "came too late" },
        outcome.status,
        leftovers(&migration.data_dir)
    );
    if signal == Signal::SIGKILL && sent && killed != Some(Signal::SIGKILL as i32) {
        // It exited on its own between our check and the kill.
        outcome.assert_code(0);
    }
    (outcome, sent)
}

/// What an interrupted run left in the data dir.
fn leftovers(data: &Path) -> String {
    let work = data.join(WORK_DIR);
    format!(
        "version.txt {}, scratch dir {}, swap journal {}",
        read_version_txt(data),
        if work.exists() { "present" } else { "absent" },
        if work.join(SWAP_JOURNAL).exists() {
            "present"
        } else {
            "absent"
        },
    )
}

/// Reruns `migration` to the end and asserts it converged: exit 0,
/// `expected` recorded, no scratch dir, no process left on the data.
fn rerun_converges(migration: &Migration, expected: &str) -> Outcome {
    let rerun = migration.run();
    rerun.assert_code(0);
    assert_eq!(
        read_version_txt(&migration.data_dir),
        expected,
        "{}",
        rerun.explain()
    );
    assert!(
        !migration.data_dir.join(WORK_DIR).exists(),
        "the rerun leaves no scratch dir\n{}",
        rerun.explain()
    );
    wait_for_no_process_on(&migration.data_dir, ORPHANS_GONE_TIMEOUT);
    let recovery: Vec<&str> = [
        "finished a step interrupted after its swap",
        "discarded a step interrupted before its swap",
        "removing scratch dir of an interrupted step",
    ]
    .into_iter()
    .filter(|message| !rerun.lines_with(message).is_empty())
    .collect();
    eprintln!(
        "rerun: steps {:?}, recovery {recovery:?}",
        rerun.step_kinds()
    );
    rerun
}

// ---- etcd2 → etcd3 ----

/// A small etcd2 fixture (nested dirs, two TTLs) at 3.3.25.
fn v2_fixture(tmp: &Path, member: &Member) -> V2Fixture {
    let batches = v2::kubernetes_like(40, &[600, 1200], 8);
    v2::build("3.3.25", &tmp.join("data"), member, tmp, &batches)
}

/// Reads the migrated data with 3.3.25 (v3 and v2) and checks it holds the
/// fixture and an empty v2 store. Leases of an attempt that was killed
/// before its keys were verified may remain (they expire on their own).
fn assert_storage_converged(tmp: &Path, member: &Member, fixture: &V2Fixture) {
    let (v3, read_at, v2_after) = v2::read_back_migrated("3.3.25", member, &tmp.join("data"), tmp);
    v2::assert_migrated(&v3, fixture, read_at, &Default::default(), true);
    let orphans = v3.leases.values().filter(|l| l.keys.is_empty()).count();
    eprintln!(
        "converged: {} keys, {} leases ({orphans} without keys)",
        v3.entries.len(),
        v3.leases.len()
    );
    v2_after.assert_empty();
}

fn storage_migration_killed_after(tag: &str, what: &str, matches: impl Fn(&str) -> bool) {
    let tmp = temp_dir(tag);
    let member = Member::new(tag);
    let fixture = v2_fixture(tmp.path(), &member);
    let migration = Migration::new("3.3.25", &fixture.data_dir, &member).bundled("3.3.25");

    interrupt(&migration, Signal::SIGKILL, what, 1, matches);
    assert!(
        ["3.3.25/etcd2", "3.3.25/etcd3"].contains(&read_version_txt(&fixture.data_dir).as_str()),
        "version.txt names a pair the data was at"
    );
    rerun_converges(&migration, "3.3.25/etcd3");
    assert_storage_converged(tmp.path(), &member, &fixture);
}

#[test]
fn storage_migration_killed_after_etcdctl_migrate_converges() {
    // The data holds v3 keys without leases, the v2 store is untouched,
    // version.txt still says etcd2.
    storage_migration_killed_after("kill-migrate", "etcdctl migrate finished", |line| {
        ours(
            line,
            "tool finished",
            &["tool=etcdctl-3.3.25 ", "args=\"migrate "],
        )
    });
}

#[test]
fn storage_migration_killed_after_leases_attached_converges() {
    // The v3 keys have their leases, the v2 store still holds the keys.
    storage_migration_killed_after("kill-leases", "leases attached", |line| {
        ours(line, "leases attached", &[])
    });
}

// ---- minor rollback and rollback to etcd2 ----

/// One rollback test: its temp dir, a small fixture written by real etcd
/// in `<tmp>/data`, and the migration that rolls it back.
struct Rollback {
    tmp: TempDir,
    member: Member,
    fixture: Fixture,
    migration: Migration,
}

impl Rollback {
    /// A fixture written by `from` (some keys rewritten, so revisions
    /// matter), rolled back one minor to `to`.
    fn minor(tag: &str, from: &'static str, to: &str) -> Self {
        Self::build(
            tag,
            FixtureSpec::small(from).with_rewrites(5),
            |data, member| Migration::new(to, data, member).bundled(&format!("{to},{from}")),
        )
    }

    /// A 3.3.25 fixture of text values, rolled back to etcd2.
    fn to_etcd2(tag: &str) -> Self {
        Self::build(
            tag,
            FixtureSpec::small("3.3.25").text_only(),
            |data, member| {
                Migration::new("3.3.25", data, member)
                    .bundled("3.3.25")
                    .arg("--target-storage")
                    .arg("etcd2")
            },
        )
    }

    fn build(
        tag: &str,
        spec: FixtureSpec,
        migration: impl FnOnce(&Path, &Member) -> Migration,
    ) -> Self {
        let tmp = temp_dir(tag);
        let member = Member::new(tag);
        let fixture = fixture::build(spec, &tmp.path().join("data"), &member, tmp.path());
        let migration = migration(&fixture.data_dir, &member);
        Rollback {
            tmp,
            member,
            fixture,
            migration,
        }
    }

    fn data(&self) -> &Path {
        &self.fixture.data_dir
    }

    /// `version` serves the fixture's keys, values, leases and revisions.
    fn assert_rolled_back_to(&self, version: &str) {
        let after = read_back(version, &self.member, self.data(), self.tmp.path());
        after.assert_kept(&self.fixture.keyspace, Some(version), 3000);
        after.assert_revisions_kept(&self.fixture.keyspace);
    }

    /// The v2 store in `data` (the fixture's data dir, or a copy of it) is
    /// the copy of the fixture's keys.
    fn assert_v2_copy_in(&self, data: &Path) {
        let v2 = read_back_v2("3.3.25", &self.member, data, self.tmp.path());
        assert_v2_copy(&v2, &self.fixture.keyspace, LEASE_TTL_SECS);
    }
}

#[test]
fn minor_rollback_killed_after_the_restore_converges() {
    let case = Rollback::minor("kill-restore", "3.5.16", "3.4.23");
    // The restored copy is in the scratch dir, not yet proven or swapped.
    interrupt(
        &case.migration,
        Signal::SIGKILL,
        "snapshot restored",
        1,
        |line| ours(line, "tool finished", &["args=\"snapshot restore "]),
    );
    assert_eq!(read_version_txt(case.data()), "3.5.16/etcd3");
    rerun_converges(&case.migration, "3.4.23/etcd3");
    case.assert_rolled_back_to("3.4.23");
}

#[test]
fn minor_rollback_killed_around_the_swap_converges() {
    let case = Rollback::minor("kill-swap", "3.4.23", "3.3.25");
    // The second stop of the step is 3.3.25 proving the restored copy;
    // the journal, the exchange and version.txt come next.
    interrupt(
        &case.migration,
        Signal::SIGKILL,
        "restored copy proven",
        2,
        |line| ours(line, "etcd healthy and stopped", &["step=1/1 "]),
    );
    rerun_converges(&case.migration, "3.3.25/etcd3");
    case.assert_rolled_back_to("3.3.25");
}

#[test]
fn minor_rollback_stopped_by_sigterm_exits_143_and_the_rerun_converges() {
    let case = Rollback::minor("term-rollback", "3.4.23", "3.3.25");
    // Next comes 3.3.25 serving the restored copy: the signal lands while
    // the step waits for its first write.
    let (stopped, sent) = interrupt(
        &case.migration,
        Signal::SIGTERM,
        "snapshot restored",
        1,
        |line| ours(line, "tool finished", &["args=\"snapshot restore "]),
    );
    let recorded = read_version_txt(case.data());
    if !sent {
        // The run had exited before the signal was sent (a loaded
        // machine): it must then have completed the step.
        stopped.assert_code(0);
        assert_eq!(recorded, "3.3.25/etcd3");
    } else {
        stopped.assert_code(143);
        assert!(
            recorded == "3.4.23/etcd3" || recorded == "3.3.25/etcd3",
            "version.txt {recorded:?} names neither the start nor a completed step"
        );
        if recorded == "3.4.23/etcd3" {
            assert!(
                stopped.lines_with("step done").is_empty(),
                "{}",
                stopped.explain()
            );
            stopped.assert_stderr_has("stopped by SIGTERM");
        }
    }
    rerun_converges(&case.migration, "3.3.25/etcd3");
    case.assert_rolled_back_to("3.3.25");
}

fn rollback_to_etcd2_killed_after(tag: &str, what: &str, matches: impl Fn(&str) -> bool) {
    let case = Rollback::to_etcd2(tag);
    interrupt(&case.migration, Signal::SIGKILL, what, 1, matches);
    assert!(
        ["3.3.25/etcd3", "3.3.25/etcd2"].contains(&read_version_txt(case.data()).as_str()),
        "version.txt names a pair the data was at"
    );
    rerun_converges(&case.migration, "3.3.25/etcd2");
    case.assert_v2_copy_in(case.data());
}

#[test]
fn rollback_to_etcd2_killed_after_the_v3_read_converges() {
    // The v3 data is read and its etcd stopped; the v2 store is not built.
    rollback_to_etcd2_killed_after("kill-v3-read", "v3 keyspace read", |line| {
        ours(line, "v3 keyspace read", &[])
    });
}

#[test]
fn rollback_to_etcd2_killed_after_the_v2_check_converges() {
    // The rebuilt v2 store is verified; its etcd stops, then the swap.
    rollback_to_etcd2_killed_after("kill-v2-check", "v2 store verified", |line| {
        ours(line, "v2 store verified", &[])
    });
}

// ---- swapped (or converted) but not recorded ----

/// Runs `migration` with the record of its (only) step made to fail, and
/// asserts it failed there: exit 3, the old pair still recorded. Returns
/// whether a swap journal was left. Then removes the obstacle. (A
/// directory where [`VERSION_TEMP`] goes makes the record after a step's
/// swap fail, deterministically leaving what a crash between the swap and
/// the record leaves.)
fn fail_the_record(migration: &Migration, old: &str) -> bool {
    let data = &migration.data_dir;
    std::fs::create_dir(data.join(VERSION_TEMP)).expect("mkdir the obstacle");
    let run = migration.run();
    run.assert_code(3)
        .assert_stderr_has("could not be recorded");
    assert_eq!(read_version_txt(data), old);
    let journal = data.join(WORK_DIR).join(SWAP_JOURNAL).exists();
    eprintln!("record failed; left: {}", leftovers(data));
    std::fs::remove_dir(data.join(VERSION_TEMP)).expect("rmdir the obstacle");
    journal
}

/// Reruns `migration` to `expected` (see [`rerun_converges`]) and asserts
/// it finished the step left between its swap and its record, once.
fn rerun_finishes_the_swap(migration: &Migration, expected: &str) -> Outcome {
    let rerun = rerun_converges(migration, expected);
    assert_eq!(
        rerun
            .lines_with("finished a step interrupted after its swap")
            .len(),
        1,
        "{}",
        rerun.explain()
    );
    rerun
}

#[test]
fn minor_rollback_swapped_but_not_recorded_is_finished_by_the_rerun() {
    let case = Rollback::minor("unrecorded-rollback", "3.4.23", "3.3.25");
    assert!(
        fail_the_record(&case.migration, "3.4.23/etcd3"),
        "the swap journal stays until the step is recorded"
    );

    let rerun = rerun_finishes_the_swap(&case.migration, "3.3.25/etcd3");
    assert!(
        rerun.step_kinds().is_empty(),
        "nothing is redone\n{}",
        rerun.explain()
    );
    case.assert_rolled_back_to("3.3.25");
}

#[test]
fn rollback_to_etcd2_swapped_but_not_recorded_is_finished_by_the_rerun() {
    let case = Rollback::to_etcd2("unrecorded-etcd2");
    assert!(fail_the_record(&case.migration, "3.3.25/etcd3"));

    // Without the journal the rerun would read the rebuilt v2 store
    // through the v3 API, see no key, and rebuild an empty store.
    rerun_finishes_the_swap(&case.migration, "3.3.25/etcd2");
    case.assert_v2_copy_in(case.data());
}

#[test]
fn storage_migration_converted_but_not_recorded_converges() {
    // Regression: the conversion used to happen in place, and a rerun ran
    // `etcdctl migrate` a second time over converted data, putting back
    // unleased records of TTL keys. It now converts a copy and swaps it in
    // with a journal, so the rerun finishes the step instead of redoing it.
    let tmp = temp_dir("unrecorded-storage");
    let member = Member::new("unrecorded-storage");
    let fixture = v2_fixture(tmp.path(), &member);
    let migration = Migration::new("3.3.25", &fixture.data_dir, &member).bundled("3.3.25");
    fail_the_record(&migration, "3.3.25/etcd2");

    let rerun = rerun_finishes_the_swap(&migration, "3.3.25/etcd3");
    assert!(rerun.step_kinds().is_empty(), "{}", rerun.explain());
    assert_storage_converged(tmp.path(), &member, &fixture);
}

// ---- a data dir copied after a crash ----

#[cfg(feature = "failpoints")]
#[test]
fn a_data_dir_copied_after_a_crash_at_the_swap_is_finished_not_wiped() {
    use std::os::unix::process::ExitStatusExt;

    use crate::harness::copy_dir;
    // Regression: the swap journal named the swapped-in member dir by
    // inode. Copied after a crash between the swap and the record, the data
    // dir had new inodes, so the rerun "discarded" the step, removed the
    // scratch dir (which held the data from before the step) and read the
    // rebuilt v2 store through the v3 API: 0 keys, recorded as etcd2.
    let case = Rollback::to_etcd2("copied-after-swap");
    let killed = case
        .migration
        .clone()
        .env("FAILPOINTS", "swap-after-exchange=return")
        .run();
    assert_eq!(
        killed.status.signal(),
        Some(Signal::SIGKILL as i32),
        "{}",
        killed.explain()
    );
    assert_eq!(read_version_txt(case.data()), "3.3.25/etcd3");

    let copy = case.tmp.path().join("copy");
    copy_dir(case.data(), &copy);
    let mut on_copy = case.migration.clone();
    on_copy.data_dir = copy.clone();
    rerun_finishes_the_swap(&on_copy, "3.3.25/etcd2");
    case.assert_v2_copy_in(&copy);
}
