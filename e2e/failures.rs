//! Runs that stop in the middle: a stop signal during a step (the rerun
//! must converge), a step whose etcd dies (the completed steps stay
//! recorded), and a rerun that meets an etcd still stopping on the data
//! (it waits for it, or refuses one that does not stop).

use std::time::Duration;

use nix::sys::signal::Signal;

use crate::harness::etcd::kill_and_reap;
use crate::harness::fixture::{self, FixtureSpec};
use crate::harness::keyspace::read_back;
use crate::harness::migrator::{is_ours, Migration};
use crate::harness::{
    etcd_binary, install_program, install_script, is_running, read_version_txt, symlink, temp_dir,
    wait_until, Member, MIGRATE_TIMEOUT, STOP_GRACE,
};

/// How long the first step may take to log its etcd's pid.
const STEP_START_TIMEOUT: Duration = Duration::from_secs(30);

/// How long the step's etcd may outlive etcd-migrate after a SIGTERM (it
/// stops in milliseconds; the margin is for a loaded machine).
const STEP_ETCD_GONE_TIMEOUT: Duration = Duration::from_secs(15);

/// The `pid=` field of a log line.
fn pid_field(line: &str) -> i32 {
    line.split_whitespace()
        .find_map(|field| field.strip_prefix("pid="))
        .and_then(|pid| pid.parse().ok())
        .unwrap_or_else(|| panic!("no pid= in {line:?}"))
}

#[test]
fn sigterm_during_a_step_then_rerun_converges() {
    let tmp = temp_dir("sigterm");
    let data = tmp.path().join("data");
    let member = Member::new("sigterm");
    let fixture = fixture::build(FixtureSpec::full("3.3.25"), &data, &member, tmp.path());

    // Slow raft timings (appended last, so they win over the migrator's
    // fast ones) keep the first step's etcd from electing itself, and so
    // from accepting the migrator's write, for at least one 1 s tick: the
    // signal lands mid-step even on a loaded machine.
    let mut running = Migration::new("3.5.16", &data, &member)
        .bundled("3.3.25,3.4.23,3.5.16")
        .arg("--etcd-server-extra-args=--heartbeat-interval=1000 --election-timeout=10000")
        .spawn();
    let started = running.wait_for_line("etcd started step=1/2", STEP_START_TIMEOUT, |line| {
        line.starts_with("[etcd-migrate] ") && line.contains(" etcd started step=1/2 ")
    });
    let step_pid = pid_field(&started);
    assert!(started.contains("version=3.4.23"), "{started}");
    // etcd itself is running (its own output is relayed): the signal
    // interrupts a live step, not a fork that has yet to exec.
    running.wait_for_line("output of etcd 3.4.23", STEP_START_TIMEOUT, |line| {
        line.starts_with("[etcd-3.4.23] ")
    });
    running.signal(Signal::SIGTERM);
    let run = running.wait(STOP_GRACE * 2);
    run.assert_code(143);
    assert!(
        run.lines_with("step done").is_empty(),
        "the step must not complete\n{}",
        run.explain()
    );
    wait_until(
        &format!("the step's etcd (pid {step_pid}) to exit"),
        STEP_ETCD_GONE_TIMEOUT,
        || (!is_running(step_pid)).then_some(()),
    );
    assert_eq!(
        read_version_txt(&data),
        "3.3.25/etcd3",
        "the interrupted step is not recorded"
    );

    let rerun = Migration::new("3.5.16", &data, &member)
        .bundled("3.3.25,3.4.23,3.5.16")
        .run();
    rerun.assert_code(0);
    assert_eq!(
        rerun.lines_with("step done").len(),
        2,
        "{}",
        rerun.explain()
    );
    assert_eq!(read_version_txt(&data), "3.5.16/etcd3");
    let after = read_back("3.5.16", &member, &data, tmp.path());
    after.assert_kept(&fixture.keyspace, 3000);
}

/// An `etcd-3.5.16` that passes the version check and then dies at start
/// the way a Go panic does.
const PANICKING_ETCD: &str = r#"#!/bin/sh
if [ "$1" = "--version" ]; then
  echo "etcd Version: 3.5.16"
  echo "Git SHA: injected"
  exit 0
fi
echo "panic: injected failure" >&2
exit 2
"#;

#[test]
fn step_failure_leaves_last_completed_step_recorded() {
    let tmp = temp_dir("stepfail");
    let data = tmp.path().join("data");
    let member = Member::new("stepfail");
    fixture::build(FixtureSpec::full("3.3.25"), &data, &member, tmp.path());

    let bin = tmp.path().join("bin");
    std::fs::create_dir(&bin).expect("mkdir bin");
    for version in ["3.3.25", "3.4.23"] {
        symlink(&etcd_binary(version), &bin.join(format!("etcd-{version}")));
    }
    install_script(&bin.join("etcd-3.5.16"), PANICKING_ETCD);

    let run = Migration::new("3.5.16", &data, &member)
        .bin_dir(&bin)
        .bundled("3.3.25,3.4.23,3.5.16")
        .run();
    run.assert_code(3)
        .assert_stderr_has("panic: injected failure")
        .assert_stderr_has("step 2/2");
    assert_eq!(run.lines_with("step done").len(), 1, "{}", run.explain());
    assert_eq!(
        read_version_txt(&data),
        "3.4.23/etcd3",
        "the completed 3.4 step stays recorded"
    );
}

/// A stand-in for an etcd still on a data dir: a shell under the name
/// `etcd-3.4.23` whose command line names the data dir, as a step's etcd
/// does. It waits in the builtin `read` on a pipe from the test, so it
/// forks nothing and lives until the test ends it (or, should the test
/// process die, until the pipe closes); dropped, it is killed.
struct Lingering {
    child: std::process::Child,
}

impl Lingering {
    fn start(tmp: &std::path::Path, data: &std::path::Path) -> Self {
        let fake = tmp.join("etcd-3.4.23");
        // Copied by another process: a copy written by this multi-threaded
        // one could be held open for writing by a sibling test's fork, and
        // exec'ing it would fail with ETXTBSY.
        install_program(std::path::Path::new("/bin/sh"), &fake);
        let child = std::process::Command::new(&fake)
            .arg("-c")
            .arg("read _")
            .arg("etcd")
            .arg(format!("--data-dir={}", data.display()))
            .stdin(std::process::Stdio::piped())
            .spawn()
            .expect("spawn the stand-in etcd");
        Lingering { child }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Kills it and reaps it: from here no process is on the data dir.
    fn end(mut self) {
        kill_and_reap(&mut self.child);
    }
}

impl Drop for Lingering {
    fn drop(&mut self) {
        kill_and_reap(&mut self.child);
    }
}

#[test]
fn a_rerun_waits_for_an_earlier_etcd_still_stopping_on_the_data() {
    // A killed etcd-migrate's etcd gets SIGTERM from its parent-death
    // signal and may take a moment to stop, holding the WAL lock and the
    // ports: a restart must wait for it, not fail on a taken port. The
    // stand-in ends once the run says it waits (not after a fixed time,
    // which a slow start on a loaded machine could outlast).
    let tmp = temp_dir("lingering");
    let data = tmp.path().join("data");
    let member = Member::new("lingering");
    let fixture = fixture::build(FixtureSpec::small("3.3.25"), &data, &member, tmp.path());
    let stopping = Lingering::start(tmp.path(), &data);
    let mut running = Migration::new("3.4.23", &data, &member)
        .bundled("3.3.25,3.4.23")
        .spawn();
    running.wait_for_line("the wait for the stand-in", MIGRATE_TIMEOUT, |line| {
        is_ours(line, "waiting for processes still on the data dir")
    });
    stopping.end();
    let run = running.wait(MIGRATE_TIMEOUT);
    run.assert_code(0);
    assert_eq!(
        run.lines_with("waiting for processes still on the data dir")
            .len(),
        1,
        "{}",
        run.explain()
    );
    assert_eq!(
        run.lines_with("earlier processes on the data dir have ended")
            .len(),
        1
    );
    assert_eq!(read_version_txt(&data), "3.4.23/etcd3");
    let after = read_back("3.4.23", &member, &data, tmp.path());
    after.assert_kept(&fixture.keyspace, 3000);
}

#[test]
fn an_etcd_that_stays_on_the_data_is_named_and_refused_untouched() {
    let tmp = temp_dir("busy");
    let data = tmp.path().join("data");
    let member = Member::new("busy");
    fixture::build(FixtureSpec::small("3.3.25"), &data, &member, tmp.path());
    let before = crate::harness::tree::fingerprint(&data);
    let staying = Lingering::start(tmp.path(), &data);
    let run = Migration::new("3.4.23", &data, &member)
        .bundled("3.3.25,3.4.23")
        .run();
    let pid = staying.pid();
    staying.end();
    run.assert_code(2)
        .assert_stderr_has(&format!("still run on the data dir {}", data.display()))
        .assert_stderr_has(&format!("pid {pid}"))
        .assert_stderr_has("stop it");
    assert!(
        run.lines_with("etcd started").is_empty(),
        "{}",
        run.explain()
    );
    before.assert_unchanged(
        &crate::harness::tree::fingerprint(&data),
        "a run refused by a busy data dir",
    );
}
