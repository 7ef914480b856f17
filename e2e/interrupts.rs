//! Crashes and stops in the middle of the steps that rewrite data: each new
//! step kind is SIGKILLed at points picked from its log lines (etcd-migrate
//! dies at once; its etcd and tools get SIGTERM from the parent-death
//! signal), then rerun to the same target, which must converge: exit 0, the
//! target recorded, the fixture's keyspace, no scratch dir, no process
//! left. One more run is stopped with SIGTERM during a rollback.

use std::path::Path;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use crate::harness::etcd::{read_back, EtcdProcess};
use crate::harness::fixture::{self, Fixture, FixtureSpec, LEASE_TTL_SECS};
use crate::harness::keyspace::Keyspace;
use crate::harness::migrator::{Migration, Outcome, OUR_PREFIX};
use crate::harness::v2::{self, assert_v2_copy, read_back_v2, V2Fixture, V2Keyspace};
use crate::harness::{
    block_on, free_port, read_version_txt, temp_dir, wait_for_no_process_on, Member, STOP_GRACE,
};

/// How long a run may take to reach the line it is stopped at.
const LINE_TIMEOUT: Duration = Duration::from_secs(60);

/// How long the killed run's etcd and tools may outlive it.
const ORPHANS_GONE_TIMEOUT: Duration = Duration::from_secs(15);

/// Scratch dir of the rebuilding steps, and the journal of their swap.
const WORK_DIR: &str = ".etcd-migrate.work";
const SWAP_JOURNAL: &str = "swap-journal";

/// Whether `line` is our `message` line and contains every one of `parts`.
fn ours(line: &str, message: &str, parts: &[&str]) -> bool {
    line.starts_with(OUR_PREFIX)
        && line.contains(&format!(" {message} "))
        && parts.iter().all(|part| line.contains(part))
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
    let data = tmp.join("data");
    let mut etcd = EtcdProcess::start("3.3.25", member, &data, free_port(), tmp);
    let (v3, read_at, v2_after) = block_on(async {
        etcd.wait_ready().await;
        let v3 = Keyspace::read(&etcd.endpoint()).await;
        let read_at = Instant::now();
        (v3, read_at, V2Keyspace::read(&etcd.endpoint()).await)
    });
    etcd.stop();
    v2::assert_migrated(&v3, fixture, read_at, &Default::default(), true);
    let orphans = v3.leases.values().filter(|l| l.keys.is_empty()).count();
    eprintln!(
        "converged: {} keys, {} leases ({orphans} without keys)",
        v3.entries.len(),
        v3.leases.len()
    );
    assert!(
        v2_after.leaves.is_empty() && v2_after.dirs.is_empty(),
        "the v2 store still holds {} leaves and {} dirs",
        v2_after.leaves.len(),
        v2_after.dirs.len()
    );
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

// ---- minor rollback ----

fn assert_rollback_converged(tmp: &Path, member: &Member, fixture: &Fixture, version: &str) {
    let after = read_back(version, member, &fixture.data_dir, tmp);
    after.assert_kept(&fixture.keyspace, Some(version), 3000);
    after.assert_revisions_kept(&fixture.keyspace);
}

#[test]
fn minor_rollback_killed_after_the_restore_converges() {
    let tmp = temp_dir("kill-restore");
    let member = Member::new("kill-restore");
    let data = tmp.path().join("data");
    let fixture = fixture::build(
        FixtureSpec::small("3.5.16").with_rewrites(5),
        &data,
        &member,
        tmp.path(),
    );
    let migration = Migration::new("3.4.23", &data, &member).bundled("3.4.23,3.5.16");

    // The restored copy is in the scratch dir, not yet proven or swapped.
    interrupt(
        &migration,
        Signal::SIGKILL,
        "snapshot restored",
        1,
        |line| ours(line, "tool finished", &["args=\"snapshot restore "]),
    );
    assert_eq!(read_version_txt(&data), "3.5.16/etcd3");
    rerun_converges(&migration, "3.4.23/etcd3");
    assert_rollback_converged(tmp.path(), &member, &fixture, "3.4.23");
}

#[test]
fn minor_rollback_killed_around_the_swap_converges() {
    let tmp = temp_dir("kill-swap");
    let member = Member::new("kill-swap");
    let data = tmp.path().join("data");
    let fixture = fixture::build(
        FixtureSpec::small("3.4.23").with_rewrites(5),
        &data,
        &member,
        tmp.path(),
    );
    let migration = Migration::new("3.3.25", &data, &member).bundled("3.3.25,3.4.23");

    // The second stop of the step is 3.3.25 proving the restored copy;
    // the journal, the exchange and version.txt come next.
    interrupt(
        &migration,
        Signal::SIGKILL,
        "restored copy proven",
        2,
        |line| ours(line, "etcd healthy and stopped", &["step=1/1 "]),
    );
    rerun_converges(&migration, "3.3.25/etcd3");
    assert_rollback_converged(tmp.path(), &member, &fixture, "3.3.25");
}

#[test]
fn minor_rollback_stopped_by_sigterm_exits_143_and_the_rerun_converges() {
    let tmp = temp_dir("term-rollback");
    let member = Member::new("term-rollback");
    let data = tmp.path().join("data");
    let fixture = fixture::build(
        FixtureSpec::small("3.4.23").with_rewrites(5),
        &data,
        &member,
        tmp.path(),
    );
    let migration = Migration::new("3.3.25", &data, &member).bundled("3.3.25,3.4.23");

    // Next comes 3.3.25 serving the restored copy: the signal lands while
    // the step waits for its first write.
    let (stopped, sent) = interrupt(
        &migration,
        Signal::SIGTERM,
        "snapshot restored",
        1,
        |line| ours(line, "tool finished", &["args=\"snapshot restore "]),
    );
    let recorded = read_version_txt(&data);
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
    rerun_converges(&migration, "3.3.25/etcd3");
    assert_rollback_converged(tmp.path(), &member, &fixture, "3.3.25");
}

// ---- rollback to etcd2 ----

fn rollback_to_etcd2_killed_after(tag: &str, what: &str, matches: impl Fn(&str) -> bool) {
    let tmp = temp_dir(tag);
    let member = Member::new(tag);
    let data = tmp.path().join("data");
    let fixture = fixture::build(
        FixtureSpec::small("3.3.25").text_only(),
        &data,
        &member,
        tmp.path(),
    );
    let migration = Migration::new("3.3.25", &data, &member)
        .bundled("3.3.25")
        .arg("--target-storage")
        .arg("etcd2");

    interrupt(&migration, Signal::SIGKILL, what, 1, matches);
    assert!(
        ["3.3.25/etcd3", "3.3.25/etcd2"].contains(&read_version_txt(&data).as_str()),
        "version.txt names a pair the data was at"
    );
    rerun_converges(&migration, "3.3.25/etcd2");
    let v2 = read_back_v2("3.3.25", &member, &data, tmp.path());
    assert_v2_copy(&v2, &fixture.keyspace, LEASE_TTL_SECS);
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

/// The temp file `version.txt` is written through; a directory in its
/// place makes the record after a step's swap fail, deterministically
/// leaving what a crash between the swap and the record leaves.
const VERSION_TEMP: &str = ".version.txt.tmp";

/// Runs `migration` with the record of its (only) step made to fail, and
/// asserts it failed there: exit 3, the old pair still recorded. Returns
/// whether a swap journal was left. Then removes the obstacle.
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

#[test]
fn minor_rollback_swapped_but_not_recorded_is_finished_by_the_rerun() {
    let tmp = temp_dir("unrecorded-rollback");
    let member = Member::new("unrecorded-rollback");
    let data = tmp.path().join("data");
    let fixture = fixture::build(
        FixtureSpec::small("3.4.23").with_rewrites(5),
        &data,
        &member,
        tmp.path(),
    );
    let migration = Migration::new("3.3.25", &data, &member).bundled("3.3.25,3.4.23");
    assert!(
        fail_the_record(&migration, "3.4.23/etcd3"),
        "the swap journal stays until the step is recorded"
    );

    let rerun = rerun_converges(&migration, "3.3.25/etcd3");
    assert_eq!(
        rerun
            .lines_with("finished a step interrupted after its swap")
            .len(),
        1,
        "{}",
        rerun.explain()
    );
    assert!(
        rerun.step_kinds().is_empty(),
        "nothing is redone\n{}",
        rerun.explain()
    );
    assert_rollback_converged(tmp.path(), &member, &fixture, "3.3.25");
}

#[test]
fn rollback_to_etcd2_swapped_but_not_recorded_is_finished_by_the_rerun() {
    let tmp = temp_dir("unrecorded-etcd2");
    let member = Member::new("unrecorded-etcd2");
    let data = tmp.path().join("data");
    let fixture = fixture::build(
        FixtureSpec::small("3.3.25").text_only(),
        &data,
        &member,
        tmp.path(),
    );
    let migration = Migration::new("3.3.25", &data, &member)
        .bundled("3.3.25")
        .arg("--target-storage")
        .arg("etcd2");
    assert!(fail_the_record(&migration, "3.3.25/etcd3"));

    // Without the journal the rerun would read the rebuilt v2 store
    // through the v3 API, see no key, and rebuild an empty store.
    let rerun = rerun_converges(&migration, "3.3.25/etcd2");
    assert_eq!(
        rerun
            .lines_with("finished a step interrupted after its swap")
            .len(),
        1,
        "{}",
        rerun.explain()
    );
    let v2 = read_back_v2("3.3.25", &member, &data, tmp.path());
    assert_v2_copy(&v2, &fixture.keyspace, LEASE_TTL_SECS);
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

    let rerun = rerun_converges(&migration, "3.3.25/etcd3");
    assert_eq!(
        rerun
            .lines_with("finished a step interrupted after its swap")
            .len(),
        1,
        "{}",
        rerun.explain()
    );
    assert!(rerun.step_kinds().is_empty(), "{}", rerun.explain());
    assert_storage_converged(tmp.path(), &member, &fixture);
}

// ---- a data dir copied after a crash ----

/// `cp -a` of `from` to `to`: the same content under new inodes, as a
/// volume move or an operator's copy makes.
#[cfg(feature = "failpoints")]
fn copy_dir(from: &Path, to: &Path) {
    let status = std::process::Command::new("cp")
        .arg("-a")
        .arg(from)
        .arg(to)
        .status()
        .expect("run cp");
    assert!(
        status.success(),
        "cp -a {} {}",
        from.display(),
        to.display()
    );
}

#[cfg(feature = "failpoints")]
#[test]
fn a_data_dir_copied_after_a_crash_at_the_swap_is_finished_not_wiped() {
    use std::os::unix::process::ExitStatusExt;
    // Regression: the swap journal named the swapped-in member dir by
    // inode. Copied after a crash between the swap and the record, the data
    // dir had new inodes, so the rerun "discarded" the step, removed the
    // scratch dir (which held the data from before the step) and read the
    // rebuilt v2 store through the v3 API: 0 keys, recorded as etcd2.
    let tmp = temp_dir("copied-after-swap");
    let member = Member::new("copied-after-swap");
    let data = tmp.path().join("data");
    let fixture = fixture::build(
        FixtureSpec::small("3.3.25").text_only(),
        &data,
        &member,
        tmp.path(),
    );
    let migration = Migration::new("3.3.25", &data, &member)
        .bundled("3.3.25")
        .arg("--target-storage")
        .arg("etcd2");
    let killed = migration
        .clone()
        .env("FAILPOINTS", "swap-after-exchange=return")
        .run();
    assert_eq!(
        killed.status.signal(),
        Some(Signal::SIGKILL as i32),
        "{}",
        killed.explain()
    );
    assert_eq!(read_version_txt(&data), "3.3.25/etcd3");

    let copy = tmp.path().join("copy");
    copy_dir(&data, &copy);
    let mut on_copy = migration.clone();
    on_copy.data_dir = copy.clone();
    let rerun = rerun_converges(&on_copy, "3.3.25/etcd2");
    assert_eq!(
        rerun
            .lines_with("finished a step interrupted after its swap")
            .len(),
        1,
        "{}",
        rerun.explain()
    );
    let v2 = read_back_v2("3.3.25", &member, &copy, tmp.path());
    assert_v2_copy(&v2, &fixture.keyspace, LEASE_TTL_SECS);
}
