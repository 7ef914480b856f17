//! Crashes and stops in the middle of the steps that rewrite data: each new
//! step kind is SIGKILLed at points picked from its log lines (etcd-migrate
//! dies at once; its etcd and tools get SIGTERM from the parent-death
//! signal), then rerun to the same target, which must converge: exit 0, the
//! target recorded, the fixture's keyspace, no scratch dir, no process
//! left. One more run is stopped with SIGTERM during a rollback. And a
//! termination signal is honoured at once where a run used to wait: in
//! the backup copy (exit 143, the partial copy removed, no etcd started)
//! and in a version check that hangs; a version check that leaves a
//! process holding its output no longer hangs the run.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use tempfile::TempDir;

use crate::harness::fixture::{self, Fixture, FixtureSpec, LEASE_TTL_SECS};
use crate::harness::keyspace::read_back;
use crate::harness::migrator::{is_ours, Migration, Outcome};
use crate::harness::tree::fingerprint;
use crate::harness::v2::{self, assert_v2_copy, read_back_v2, V2Fixture};
use crate::harness::{
    dir_names, etcd_binary, install_script, processes_mentioning, read_version_txt, symlink,
    temp_dir, wait_for_no_process_on, wait_until, Member, STOP_GRACE, VERSION_TEMP, WORK_DIR,
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
        after.assert_kept(&self.fixture.keyspace, 3000);
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

// ---- a termination signal where a run used to wait ----

/// How long after SIGTERM the run may take to exit 143. It takes
/// milliseconds (a copy chunk, or the signal thread's wake-up); the
/// bound leaves room for a loaded 2-core machine, and the measured time
/// is printed.
const TERMINATION_TIMEOUT: Duration = Duration::from_secs(5);

/// Runs `migration`, sends SIGTERM once a line `matches`, and asserts the
/// run exits 143 within [`TERMINATION_TIMEOUT`]. Returns the run.
fn terminate_after(migration: &Migration, what: &str, matches: impl Fn(&str) -> bool) -> Outcome {
    let mut running = migration.spawn();
    running.wait_for_line(what, LINE_TIMEOUT, matches);
    let sent = Instant::now();
    running.signal(Signal::SIGTERM);
    let outcome = running.wait(STOP_GRACE * 2);
    let took = sent.elapsed();
    eprintln!("[{what}] SIGTERM to exit: {took:?}");
    outcome
        .assert_code(143)
        .assert_stderr_has("stopped by SIGTERM");
    assert!(
        took < TERMINATION_TIMEOUT,
        "SIGTERM took {took:?} to end the run\n{}",
        outcome.explain()
    );
    outcome
}

/// Regression: a SIGTERM during the backup copy waited for the whole copy
/// and then started the next etcd. The copy asks between files and
/// between 1 MiB chunks: the run exits 143, the partial copy is gone, no
/// etcd started, the data dir is as it was. The data is padded to 2 GiB
/// (a sparse file: the copy reads zeros fast but must write them all) so
/// the copy is far from done when the signal comes.
#[test]
fn sigterm_during_the_backup_copy_exits_143_and_starts_no_etcd() {
    let tmp = temp_dir("term-backup");
    let member = Member::new("term-backup");
    let data = tmp.path().join("data");
    fixture::build(FixtureSpec::small("3.4.23"), &data, &member, tmp.path());
    // Fingerprinted without the padding, whose 2 GiB would take the tree
    // hash a minute; the padding is checked by size and time.
    let before = fingerprint(&data).content();
    let padding = data.join("padding");
    let file = std::fs::File::create(&padding).expect("create the padding");
    file.set_len(2 << 30).expect("size the padding");
    drop(file);
    let padded = std::fs::metadata(&padding).expect("stat the padding");
    let migration = Migration::new("3.3.25", &data, &member).bundled("3.3.25,3.4.23");

    let stopped = terminate_after(&migration, "backup start", |line| {
        is_ours(line, "backup start")
    });
    assert!(
        stopped.lines_with("backup taken").is_empty(),
        "the copy finished before the signal: pad the data more\n{}",
        stopped.explain()
    );
    assert!(
        stopped.lines_with("etcd started").is_empty()
            && stopped.lines_with("step start").is_empty(),
        "no etcd starts after the signal\n{}",
        stopped.explain()
    );
    stopped.assert_stderr_has("in the backup before it");
    let root = tmp.path().join("data.backup");
    assert!(
        dir_names(&root).is_empty(),
        "the partial copy is removed: {:?}",
        dir_names(&root)
    );
    let after = std::fs::metadata(&padding).expect("stat the padding");
    assert_eq!(
        (after.len(), after.modified().ok()),
        (padded.len(), padded.modified().ok())
    );
    std::fs::remove_file(&padding).expect("remove the padding");
    before.assert_unchanged(
        &fingerprint(&data).content(),
        "a run stopped during its backup",
    );
    wait_for_no_process_on(&data, ORPHANS_GONE_TIMEOUT);
}

/// A bin dir of links to the real binaries of `versions`, with
/// `etcd-<fake>` replaced by `script` (`{real}` stands for the real
/// binary, `{holder}` for a copy of `sleep` whose path names the temp dir,
/// so the test can find what it leaves running).
fn bin_dir_with_fake(
    tmp: &Path,
    versions: &[&str],
    fake: &str,
    script: &str,
) -> (PathBuf, PathBuf) {
    let bin = tmp.join("bin");
    std::fs::create_dir(&bin).expect("mkdir bin");
    for version in versions {
        for tool in ["etcd", "etcdctl", "etcdutl"] {
            let name = format!("{tool}-{version}");
            let real = etcd_binary(version).with_file_name(&name);
            if real.exists() && name != format!("etcd-{fake}") {
                symlink(&real, &bin.join(&name));
            }
        }
    }
    // Copied by install(1), a process of its own, like install_script
    // (see there: no write fd of ours may leak into another test's exec).
    let holder = tmp.join("holder-sleep");
    let status = std::process::Command::new("install")
        .args(["-m", "0755", "/bin/sleep"])
        .arg(&holder)
        .status()
        .expect("run install");
    assert!(status.success(), "install {}", holder.display());
    let body = script
        .replace("{real}", &etcd_binary(fake).display().to_string())
        .replace("{holder}", &holder.display().to_string());
    install_script(&bin.join(format!("etcd-{fake}")), &body);
    (bin, holder)
}

/// Waits until no process runs `holder`, which the run must have killed.
fn assert_holder_gone(holder: &Path) {
    let needle = holder.display().to_string();
    wait_until(
        &format!("the left-behind {needle} to be gone"),
        ORPHANS_GONE_TIMEOUT,
        || processes_mentioning(&needle).is_empty().then_some(()),
    );
}

/// Regression: an `etcd-<v>` whose `--version` leaves a child holding its
/// stdout made the run wait for end-of-file on the pipe for ever, deaf to
/// SIGTERM. The output is now taken a second after the check exits, the
/// child's process group is killed, and the run goes on (this fake answers
/// with the real release's words and runs the real etcd otherwise).
#[test]
fn a_version_check_that_leaves_a_child_holding_stdout_does_not_hang_the_run() {
    let tmp = temp_dir("version-holder");
    let member = Member::new("version-holder");
    let data = tmp.path().join("data");
    fixture::build(FixtureSpec::small("3.4.23"), &data, &member, tmp.path());
    let (bin, holder) = bin_dir_with_fake(
        tmp.path(),
        &["3.4.23", "3.5.16"],
        "3.5.16",
        "#!/bin/sh\nif [ \"$1\" = --version ]; then\n  {real} --version\n  {holder} 3600 &\n  exit 0\nfi\nexec {real} \"$@\"\n",
    );
    let started = Instant::now();
    let run = Migration::new("3.5.16", &data, &member)
        .bin_dir(&bin)
        .bundled("3.4.23,3.5.16")
        .run();
    run.assert_code(0)
        .assert_stderr_has("a version check left a process holding its output");
    eprintln!("run with a holding version check: {:?}", started.elapsed());
    assert_eq!(read_version_txt(&data), "3.5.16/etcd3");
    assert_holder_gone(&holder);
}

/// A SIGTERM while a version check hangs ends the run at once (exit 143,
/// nothing touched) and kills the check with its process group.
#[test]
fn sigterm_during_a_hung_version_check_exits_143_at_once() {
    let tmp = temp_dir("version-hung");
    let member = Member::new("version-hung");
    let data = tmp.path().join("data");
    fixture::build(FixtureSpec::small("3.4.23"), &data, &member, tmp.path());
    let (bin, holder) = bin_dir_with_fake(
        tmp.path(),
        &["3.4.23", "3.5.16"],
        "3.5.16",
        "#!/bin/sh\n{holder} 3600\n",
    );
    let before = fingerprint(&data);
    let migration = Migration::new("3.5.16", &data, &member)
        .bin_dir(&bin)
        .bundled("3.4.23,3.5.16");
    let stopped = terminate_after(&migration, "the plan", |line| is_ours(line, "plan"));
    assert!(
        stopped.lines_with("etcd started").is_empty(),
        "{}",
        stopped.explain()
    );
    before.assert_unchanged(&fingerprint(&data), "a run stopped in its version check");
    assert_holder_gone(&holder);
}
