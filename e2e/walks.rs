//! Migrations that run steps on real etcd: the two-minor walk from 3.3 to
//! 3.5 in `--no-exec` mode, and the same walk ending in the exec of the
//! target etcd on the user's ports.

use std::time::{Duration, Instant};

use etcd_client::GetOptions;
use nix::sys::signal::Signal;

use crate::harness::etcd::{connect_within, PROBE_TIMEOUT};
use crate::harness::fixture::{self, FixtureSpec};
use crate::harness::keyspace::read_back;
use crate::harness::keyspace::Keyspace;
use crate::harness::migrator::{Migration, Mode, Running};
use crate::harness::tree::fingerprint;
use crate::harness::{
    block_on, etcd_binary, free_port, mode, read_version_txt, temp_dir, Member, POLL_INTERVAL,
    STOP_GRACE,
};

/// Leases granted 3,600 s ago at most a minute before must show more than
/// this many seconds left after the walk.
const MIN_REMAINING_TTL: i64 = 3000;

/// How long the exec'd etcd may take to answer on the user's port.
const EXEC_SERVE_TIMEOUT: Duration = Duration::from_secs(60);

#[test]
fn walk_3_3_to_3_5_through_3_4_keeps_every_key_and_lease() {
    let tmp = temp_dir("walk");
    let data = tmp.path().join("data");
    let member = Member::new("walk");
    let fixture = fixture::build(FixtureSpec::full("3.3.25"), &data, &member, tmp.path());

    let run = Migration::new("3.5.16", &data, &member)
        .bundled("3.3.25,3.4.23,3.5.1,3.5.16")
        .run();
    run.assert_code(0);

    let starts = run.lines_with("step start");
    assert_eq!(starts.len(), 2, "two steps expected\n{}", run.explain());
    // Both steps' binaries were checked while the data was read offline
    // (the plan version.txt alone gives is the run's).
    let verified = run.lines_with("binaries verified");
    assert!(
        verified.len() == 1
            && verified[0].contains("count=2")
            && verified[0].contains("begun_early=\"2 "),
        "both checks begun before the offline read\n{}",
        run.explain()
    );
    assert!(
        starts[0].contains("step=1/2") && starts[0].contains("to=3.4.23/etcd3"),
        "first step goes to 3.4.23: {}",
        starts[0]
    );
    assert!(
        starts[1].contains("step=2/2") && starts[1].contains("to=3.5.16/etcd3"),
        "second step goes to 3.5.16: {}",
        starts[1]
    );
    // The baseline is taken offline from the stopped data (etcd's hash
    // computed from bolt, issue 21): no start of the recorded release;
    // each step runs its own release.
    let started = run.lines_with("etcd started");
    assert!(
        started.len() == 2
            && started[0].contains("version=3.4.23")
            && started[1].contains("version=3.5.16"),
        "no baseline start, then each step its own release\n{}",
        run.explain()
    );
    // One fingerprint before and one after each step, all alike but for
    // the health key, which none of them counts.
    // Taken offline: said at the plan, fingerprinted once the walk of the
    // key bucket (beside the first step's etcd start) is done.
    assert_eq!(run.lines_with("baseline taken offline").len(), 1);
    let baseline = run.lines_with("offline baseline hashed");
    let done = run.lines_with("step done");
    assert_eq!((baseline.len(), done.len()), (1, 2), "{}", run.explain());
    let digest = |line: &str| {
        let at = line.find("fingerprint=").expect("a fingerprint field");
        line[at..]
            .split(" ms=")
            .next()
            .expect("field")
            .split(" proven_by=")
            .next()
            .expect("field")
            .to_string()
    };
    let keys = fixture.keyspace.entries.len();
    assert!(
        digest(baseline[0]).contains(&format!("v3 {keys} keys")),
        "the baseline counts the fixture's keys: {}",
        baseline[0]
    );
    for line in &done {
        assert_eq!(digest(line), digest(baseline[0]), "{line}");
    }
    // In-place steps only: each step proves itself by its etcd's hash
    // against the fingerprint before it, the first against the offline
    // one (issue 12, 21).
    let proven = run.lines_with("keyspace proven by etcd's hash");
    assert_eq!(proven.len(), 2, "{}", run.explain());
    // Nothing but our health writes between: both hash the baseline's
    // revision (the anchor stays), proven by the revisions alone.
    let revision = |line: &str| {
        line.split(' ')
            .find_map(|field| field.strip_prefix("revision="))
            .expect("a revision field")
            .to_string()
    };
    assert_eq!(
        revision(proven[0]),
        revision(proven[1]),
        "{}",
        run.explain()
    );
    for line in &proven {
        assert!(line.contains("by=\"revisions all ours\""), "{line}");
    }
    assert_eq!(run.lines_with("migrated").len(), 1, "{}", run.explain());
    run.assert_stderr_has("[etcd-3.4.23] ")
        .assert_stderr_has("[etcd-3.5.16] ");
    assert_eq!(read_version_txt(&data), "3.5.16/etcd3");
    assert_eq!(mode(&data), 0o700, "the data dir keeps etcd's mode");

    let after = read_back("3.5.16", &member, &data, tmp.path());
    after.assert_kept(&fixture.keyspace, MIN_REMAINING_TTL);
    assert!(after.leased_keys() >= 50, "leased keys kept their leases");
    assert_eq!(mode(&data), 0o700);
}

#[test]
fn exec_mode_serves_the_target_on_the_users_port_as_the_same_pid() {
    let tmp = temp_dir("exec");
    let data = tmp.path().join("data");
    let member = Member::new("exec");
    let fixture = fixture::build(FixtureSpec::full("3.3.25"), &data, &member, tmp.path());

    let user_url = format!("http://127.0.0.1:{}", free_port());
    let mut running = Migration::new("3.5.16", &data, &member)
        .bundled("3.3.25,3.4.23,3.5.16")
        .mode(Mode::Exec(member.exec_args(&user_url)))
        .spawn();
    let pid = wait_served(&mut running, &user_url);

    // The pid we spawned is now etcd 3.5.16 itself: exec, not fork.
    let exe = std::fs::read_link(format!("/proc/{pid}/exe"))
        .unwrap_or_else(|err| panic!("readlink /proc/{pid}/exe: {err}"));
    let target = std::fs::canonicalize(etcd_binary("3.5.16")).expect("canonical etcd-3.5.16 path");
    assert_eq!(
        exe,
        target,
        "pid {pid} should run etcd-3.5.16; stderr:\n{}",
        running.stderr()
    );
    assert_eq!(read_version_txt(&data), "3.5.16/etcd3");
    assert!(
        running.stderr().contains("[etcd-migrate] ") && running.stderr().contains(" exec "),
        "the hand-over is logged; stderr:\n{}",
        running.stderr()
    );

    let served = block_on(Keyspace::read(&user_url));
    served.assert_kept(&fixture.keyspace, MIN_REMAINING_TTL);
    stop(running);
}

/// kubeadm's etcd command line names the member and the data dir once, in
/// etcd's own flags (issue 20.3): with only the target in front of it, the
/// walk runs as that member on that dir and the target serves it. A name
/// of ours that differs from etcd's is refused before anything starts.
#[test]
fn kubeadm_command_line_alone_names_the_member_and_the_data_dir() {
    let tmp = temp_dir("kubeadm-flags");
    let data = tmp.path().join("data");
    let member = Member::new("kubeadm-flags");
    let fixture = fixture::build(FixtureSpec::full("3.4.23"), &data, &member, tmp.path());
    let user_url = format!("http://127.0.0.1:{}", free_port());
    let mut etcd_args = member.exec_args(&user_url);
    etcd_args.extend(["--data-dir".to_string(), data.display().to_string()]);

    let before = fingerprint(tmp.path());
    let other = Migration::new("3.5.16", &data, &member)
        .member_from_etcd_flags()
        .arg("--name=someone-else")
        .mode(Mode::Exec(etcd_args.clone()))
        .run();
    other.assert_refused_untouched(
        tmp.path(),
        &before,
        &["\"someone-else\"", &format!("--name \"{}\"", member.name)],
    );

    let mut running = Migration::new("3.5.16", &data, &member)
        .member_from_etcd_flags()
        .bundled("3.4.23,3.5.16")
        .mode(Mode::Exec(etcd_args))
        .spawn();
    wait_served(&mut running, &user_url);
    assert_eq!(read_version_txt(&data), "3.5.16/etcd3");
    let served = block_on(Keyspace::read(&user_url));
    served.assert_kept(&fixture.keyspace, MIN_REMAINING_TTL);
    stop(running);
}

/// Waits until the exec'd etcd answers v3 on `user_url`; panics with the
/// run's stderr if etcd-migrate exits first or nothing answers in time.
/// Returns the run's pid.
fn wait_served(running: &mut Running, user_url: &str) -> i32 {
    let pid = running.pid();
    let deadline = Instant::now() + EXEC_SERVE_TIMEOUT;
    loop {
        if let Some(status) = running.try_status() {
            panic!(
                "etcd-migrate (pid {pid}) exited with {status} instead of becoming etcd; stderr:\n{}",
                running.stderr()
            );
        }
        let served = block_on(async {
            let mut client = connect_within(user_url, PROBE_TIMEOUT).await.ok()?;
            client
                .get("etcd_version", Some(GetOptions::new()))
                .await
                .ok()
        });
        if served.is_some() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "nothing served v3 on {user_url} within {EXEC_SERVE_TIMEOUT:?}; stderr:\n{}",
            running.stderr()
        );
        std::thread::sleep(POLL_INTERVAL);
    }
    pid
}

/// Stops the exec'd etcd with SIGTERM and checks it went.
fn stop(mut running: Running) {
    running.signal(Signal::SIGTERM);
    let outcome = running.wait(STOP_GRACE);
    let by_sigterm = std::os::unix::process::ExitStatusExt::signal(&outcome.status)
        == Some(Signal::SIGTERM as i32);
    assert!(
        outcome.status.success() || by_sigterm,
        "etcd should stop on SIGTERM\n{}",
        outcome.explain()
    );
}
