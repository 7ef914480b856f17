//! The fingerprint check on real etcd: a key that appears behind our back
//! (written into the data while a step's etcd serves it, between the read
//! before a step and the read after it) fails the step. Nothing is recorded,
//! a rebuilding step does not swap its copy in, and the data dir is put on
//! hold: every later run refuses it (exit 2) until an operator removes the
//! hold, after which a rerun converges. The window is held open with a
//! failpoint `sleep` (build feature `failpoints`).

use std::os::unix::fs::MetadataExt;
use std::time::Duration;

use crate::harness::etcd::connect;
use crate::harness::fixture::{self, FixtureSpec};
use crate::harness::keyspace::read_back;
use crate::harness::keyspace::Keyspace;
use crate::harness::migrator::{Migration, Outcome};
use crate::harness::tree::fingerprint as tree;
use crate::harness::{block_on, etcd_binary, read_version_txt, symlink, temp_dir, Member};

/// How long the failpoint holds the run: the test only has to read the
/// trace line and freeze the run within it (then the put may take as long
/// as it needs).
const HOLD_MS: u64 = 3000;

/// How long a run may take to reach the failpoint.
const REACH_TIMEOUT: Duration = Duration::from_secs(60);

/// The hold a fingerprint failure leaves in the data dir.
const HOLD_FILE: &str = ".etcd-migrate.hold";

/// Asserts the data dir is on hold: a run refuses it untouched (exit 2,
/// naming the hold and what the failed run saw), then removes the hold as
/// an operator would once the difference is understood.
fn assert_held_then_release(migration: &Migration) {
    let hold = migration.data_dir.join(HOLD_FILE);
    let reason = std::fs::read_to_string(&hold)
        .unwrap_or_else(|err| panic!("no hold at {}: {err}", hold.display()));
    assert!(
        reason.contains("is not the one before it") && reason.contains("before: v3 "),
        "the hold says what the failed run saw: {reason}"
    );
    let before = tree(&migration.data_dir);
    let refused = migration.run();
    refused
        .assert_code(2)
        .assert_stderr_has(&hold.display().to_string())
        .assert_stderr_has("remove");
    assert!(
        refused.lines_with("etcd started").is_empty(),
        "{}",
        refused.explain()
    );
    before.assert_unchanged(&tree(&migration.data_dir), "a run refused by the hold");
    std::fs::remove_file(&hold).expect("remove the hold");
}

/// Puts `key` into the etcd a held run serves on `port`.
fn put_behind_our_back(port: u16, key: &str) {
    let endpoint = format!("http://127.0.0.1:{port}");
    block_on(async {
        let mut client = connect(&endpoint)
            .await
            .unwrap_or_else(|err| panic!("connect {endpoint}: {err}"));
        client
            .put(key, "not from the data", None)
            .await
            .unwrap_or_else(|err| panic!("put {key} into {endpoint}: {err}"));
    });
}

/// Runs `migration` with the failpoint `point` held open (`spec` is its
/// fail action), writes a key into the etcd serving then, and returns the
/// finished run.
fn run_with_a_key_written_at(
    migration: Migration,
    point: &str,
    spec: &str,
) -> crate::harness::migrator::Outcome {
    let port = migration.port;
    let mut running = migration
        .env("FAILPOINTS", format!("{point}={spec}"))
        .env("ETCD_MIGRATE_FAILPOINT_TRACE", "1")
        .spawn();
    // The trace line comes just before the action; with a `k*off->` prefix
    // the held pass is the last of those lines before the sleep, so wait
    // for the etcd the run serves to stay put: count passes.
    let passes = 1 + spec
        .split_once("*off->")
        .map(|(k, _)| k.parse::<usize>().expect("a count"))
        .unwrap_or(0);
    for pass in 1..=passes {
        running.wait_for_line(&format!("pass {pass} of {point}"), REACH_TIMEOUT, |line| {
            line.starts_with("[etcd-migrate] ") && line.contains(&format!("name={point}"))
        });
    }
    // Frozen there, the run cannot leave the window before the put lands,
    // however long the put takes on a loaded machine.
    let frozen = running.freeze();
    put_behind_our_back(port, "/registry/intruder");
    drop(frozen);
    running.wait(REACH_TIMEOUT)
}

#[test]
fn a_key_written_after_the_baseline_read_fails_the_upgrade_and_nothing_is_recorded() {
    let tmp = temp_dir("fp-upgrade");
    let data = tmp.path().join("data");
    let member = Member::new("fp-upgrade");
    let fixture = fixture::build(FixtureSpec::small("3.3.25"), &data, &member, tmp.path());
    // A v2 key beside (flannel's config): the baseline is then read by a
    // start of the recorded release, not offline (issue 21), and that
    // release serving the data is the window this test writes into.
    crate::harness::v2::write_keys(
        "3.3.25",
        &member,
        &data,
        tmp.path(),
        &[crate::harness::v2::V2Key::plain(
            "/coreos.com/network/config",
            "{}",
        )],
    );
    let migration = Migration::new("3.4.23", &data, &member).bundled("3.3.25,3.4.23");

    // Held after the baseline fingerprint, with the recorded release still
    // serving: the key lands in the data before the step runs.
    let run = run_with_a_key_written_at(
        migration.clone(),
        "baseline-read",
        &format!("sleep({HOLD_MS})"),
    );
    run.assert_code(3)
        .assert_stderr_has("baseline read by a start of the recorded release")
        .assert_stderr_has("etcd 3.4.23 serves after the step is not the one before it")
        .assert_stderr_has("before: v3 ")
        .assert_stderr_has("keys expected")
        .assert_stderr_has("version.txt: 3.3.25/etcd3");
    assert!(run.lines_with("step done").is_empty(), "{}", run.explain());
    assert_eq!(read_version_txt(&data), "3.3.25/etcd3");

    // The failed step ran 3.4.23 on the data, so without the hold the
    // next run would read its baseline from the data as it now is and walk
    // on. Once an operator has looked and removed the hold, it does.
    assert_held_then_release(&migration);
    let rerun = migration.run();
    rerun.assert_code(0);
    assert_eq!(read_version_txt(&data), "3.4.23/etcd3");
    let after = read_back("3.4.23", &member, &data, tmp.path());
    assert!(
        after.entries.contains_key(b"/registry/intruder".as_slice()),
        "the rerun keeps what the data holds"
    );
    let users = |keyspace: &Keyspace| keyspace.entries.len();
    assert_eq!(
        users(&after),
        users(&fixture.keyspace) + 1,
        "the fixture's keys and the one written"
    );
}

#[test]
fn a_rollback_whose_restored_copy_differs_is_not_swapped_in() {
    let tmp = temp_dir("fp-rollback");
    let data = tmp.path().join("data");
    let member = Member::new("fp-rollback");
    let fixture = fixture::build(FixtureSpec::small("3.4.23"), &data, &member, tmp.path());
    let migration = Migration::new("3.3.25", &data, &member).bundled("3.3.25,3.4.23");
    let member_inode = || {
        std::fs::metadata(data.join("member"))
            .expect("stat member/")
            .ino()
    };
    let member_before = member_inode();

    // Passes of step-after-health-write: 1 = 3.4.23 serving the data for the
    // snapshot, 2 = 3.3.25 serving the restored copy. Write into the copy.
    let run = run_with_a_key_written_at(
        migration.clone(),
        "step-after-health-write",
        &format!("1*off->sleep({HOLD_MS})"),
    );
    run.assert_code(3)
        .assert_stderr_has("etcd 3.3.25 serves after the step is not the one before it")
        .assert_stderr_has("a rebuilding step left the data untouched");
    assert_eq!(read_version_txt(&data), "3.4.23/etcd3");
    // The copy was never swapped in: `member/` is the same directory (a
    // swap exchanges it with the copy's), and no scratch dir is left.
    assert_eq!(
        member_inode(),
        member_before,
        "the original member dir stays in place"
    );

    // Once released, a clean rerun rolls back the original data: no trace
    // of the key.
    assert_held_then_release(&migration);
    let rerun = migration.run();
    rerun.assert_code(0);
    assert_eq!(read_version_txt(&data), "3.3.25/etcd3");
    let after = read_back("3.3.25", &member, &data, tmp.path());
    assert!(!after.entries.contains_key(b"/registry/intruder".as_slice()));
    after.assert_kept(&fixture.keyspace, 3000);
}

#[test]
fn a_key_written_while_the_step_serves_fails_the_proof_by_revisions() {
    let tmp = temp_dir("fp-during-step");
    let data = tmp.path().join("data");
    let member = Member::new("fp-during-step");
    fixture::build(FixtureSpec::small("3.3.25"), &data, &member, tmp.path());
    // No v2 keys: the baseline is taken offline, and the step proves itself
    // by etcd's hash at that revision with every revision since ours
    // (issue 21). A key written behind our back, after the health write,
    // is a revision that is not: the history is read, and names it.
    let migration = Migration::new("3.4.23", &data, &member).bundled("3.3.25,3.4.23");
    let run = run_with_a_key_written_at(
        migration.clone(),
        "step-after-health-write",
        &format!("sleep({HOLD_MS})"),
    );
    run.assert_code(3)
        .assert_stderr_has("baseline taken offline")
        .assert_stderr_has("etcd 3.4.23 serves after the step is not the one before it")
        .assert_stderr_has(r#""/registry/intruder" was written at revision"#)
        .assert_stderr_has("version.txt: 3.3.25/etcd3");
    assert!(run.lines_with("step done").is_empty(), "{}", run.explain());
    assert_eq!(read_version_txt(&data), "3.3.25/etcd3");
    assert_held_then_release(&migration);
}

#[test]
fn a_key_written_while_the_baseline_is_walked_sends_it_back_to_a_start() {
    let tmp = temp_dir("fp-walked");
    let data = tmp.path().join("data");
    let member = Member::new("fp-walked");
    let fixture = fixture::build(FixtureSpec::small("3.3.25"), &data, &member, tmp.path());
    let migration = Migration::new("3.4.23", &data, &member).bundled("3.3.25,3.4.23");
    // The walk of the key bucket (on its own thread) is held once done;
    // meanwhile the first step's etcd starts on the data and waits for it
    // before its first write. A key written into that etcd, and committed
    // to bolt, is a change the walk did not see: the check after the walk
    // finds the bucket's newest revision moved, the baseline goes back to
    // a start (here 3.4.23's: 3.3.25 refuses data 3.4.23 has run on), and
    // the step runs again on the data as it now is.
    let run = with_a_key_written_while_walked(migration);
    run.assert_code(0)
        .assert_stderr_has("the baseline could not be taken offline")
        .assert_stderr_has("the key bucket changed while it was hashed")
        .assert_stderr_has("baseline read");
    assert_eq!(read_version_txt(&data), "3.4.23/etcd3");
    let after = read_back("3.4.23", &member, &data, tmp.path());
    assert!(after.entries.contains_key(b"/registry/intruder".as_slice()));
    assert_eq!(after.entries.len(), fixture.keyspace.entries.len() + 1);
}

/// The recorded release runs only if the offline baseline falls back to a
/// start, and its binary is checked only then: an impostor there (an
/// `etcd-3.3.25` that is 3.4.23) does not hold up a hop whose baseline is
/// taken offline and never runs; where the baseline falls back to a start
/// (a key written while the bucket is walked), it is refused before it
/// runs, naming the file, and nothing is recorded.
#[test]
fn the_recorded_release_is_checked_only_before_it_would_run() {
    let tmp = temp_dir("fp-later");
    let bin = tmp.path().join("bin");
    std::fs::create_dir(&bin).expect("mkdir bin");
    symlink(&etcd_binary("3.4.23"), &bin.join("etcd-3.4.23"));
    let impostor = bin.join("etcd-3.3.25");
    symlink(&etcd_binary("3.4.23"), &impostor);
    let refused = format!("{} reports version 3.4.23, not 3.3.25", impostor.display());

    let offline = tmp.path().join("offline");
    let member = Member::new("fp-later");
    fixture::build(FixtureSpec::small("3.3.25"), &offline, &member, tmp.path());
    let run = Migration::new("3.4.23", &offline, &member)
        .bin_dir(&bin)
        .bundled("3.3.25,3.4.23")
        .run();
    run.assert_code(0)
        .assert_stderr_has("runs only if the offline baseline falls back to a start");
    assert!(!run.stderr.contains(&refused), "{}", run.explain());
    assert_eq!(read_version_txt(&offline), "3.4.23/etcd3");

    let data = tmp.path().join("data");
    fixture::build(FixtureSpec::small("3.3.25"), &data, &member, tmp.path());
    let migration = Migration::new("3.4.23", &data, &member)
        .bin_dir(&bin)
        .bundled("3.3.25,3.4.23");
    let run = with_a_key_written_while_walked(migration);
    run.assert_code(3)
        .assert_stderr_has("the baseline could not be taken offline")
        .assert_stderr_has(&refused);
    let started_3_3 = run
        .lines_with("etcd started")
        .into_iter()
        .filter(|line| line.contains("version=3.3.25"))
        .count();
    assert_eq!(started_3_3, 0, "{}", run.explain());
    assert_eq!(read_version_txt(&data), "3.3.25/etcd3");
}

/// Runs `migration` with the walk of bolt's key bucket held once done
/// (failpoint `offline-baseline-walked`), writes `/registry/intruder` into
/// the first step's etcd meanwhile and lets bolt commit it, and returns
/// how the run ended.
fn with_a_key_written_while_walked(migration: Migration) -> Outcome {
    let port = migration.port;
    let mut running = migration
        .env(
            "FAILPOINTS",
            format!("offline-baseline-walked=sleep({HOLD_MS})"),
        )
        .env("ETCD_MIGRATE_FAILPOINT_TRACE", "1")
        .spawn();
    running.wait_for_line("pass 1 of offline-baseline-walked", REACH_TIMEOUT, |line| {
        line.starts_with("[etcd-migrate] ") && line.contains("name=offline-baseline-walked")
    });
    put_when_up(
        port,
        "/registry/intruder",
        Duration::from_millis(HOLD_MS / 2),
    );
    // bolt commits etcd's writes every 100 ms: let this one land there.
    std::thread::sleep(Duration::from_millis(500));
    running.wait(REACH_TIMEOUT)
}

/// Writes `key` into the etcd on `port` as soon as it takes writes (it
/// is starting), within `within`.
fn put_when_up(port: u16, key: &str, within: Duration) {
    let endpoint = format!("http://127.0.0.1:{port}");
    let deadline = std::time::Instant::now() + within;
    block_on(async {
        loop {
            let attempt = async {
                let mut client = connect(&endpoint).await.map_err(|e| e.to_string())?;
                client
                    .put(key, "not from the data", None)
                    .await
                    .map_err(|e| e.to_string())
            };
            match attempt.await {
                Ok(_) => return,
                Err(err) if std::time::Instant::now() >= deadline => {
                    panic!("put {key} into {endpoint}: {err}")
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
    });
}
