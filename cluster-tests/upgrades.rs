//! This module owns the rolling-upgrade scenarios (issue 11): members of a
//! live 3.3.25 cluster restarted with a multi-minor TARGET_VERSION walk
//! the whole cluster to it, wave after wave (3.3 → 3.4 → 3.5), their
//! entrypoints coordinating through the cluster itself (its cluster
//! version as the barrier, one member restarting at a time under the
//! upgrade lock), while a client writes throughout and the monitor checks,
//! every round, that no two members are down at once and no member runs
//! two minors ahead of the cluster version.

use std::thread;
use std::time::{Duration, Instant};

use crate::harness::cluster::{Baseline, Cluster, Style, START_DEADLINE, STOP_GRACE_S};
use crate::harness::monitor::{self, Monitor};
use crate::harness::writer::{connect, runtime, Writer};
use crate::harness::{ready, say, Ready};
use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};
use etcd_migrate::cluster::lock::LOCK_KEY;

/// What the writer must get acknowledged at each stage.
const ACKS: usize = 10;
const ACK_DEADLINE: Duration = Duration::from_secs(60);
/// What the whole roll may take once every member has its new target: two
/// waves of one restart per member, each a stop, a start and a proof, on a
/// loaded two-core machine.
const ROLL_DEADLINE: Duration = Duration::from_secs(600);
/// What a member's record may lag behind its peers seeing it run the
/// target: its proof (a `/version` and a write), retried until it holds.
const RECORD_DEADLINE: Duration = Duration::from_secs(120);

/// Waits until every member runs `release` and reports its minor as the
/// cluster version; says how long it took.
fn wait_rolled(cluster: &Cluster, release: &str, deadline: Duration) -> Duration {
    let started = Instant::now();
    let want = monitor::minor(release).expect("X.Y.Z");
    loop {
        let answers: Vec<Result<monitor::VersionAnswer, String>> = cluster
            .ips()
            .iter()
            .map(|ip| monitor::version(&cluster.client, ip))
            .collect();
        let done = answers.iter().all(|a| {
            matches!(a, Ok(v) if v.server == release && monitor::minor(&v.cluster) == Some(want))
        });
        if done {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < deadline,
            "the cluster did not reach {release} within {deadline:?}: {answers:?}\nlogs:\n{}",
            cluster.all_logs()
        );
        thread::sleep(Duration::from_millis(500));
    }
}

/// Member `i`'s version.txt records `want` within `deadline`.
fn wait_recorded(cluster: &Cluster, i: usize, want: &str, deadline: Duration) {
    let started = Instant::now();
    loop {
        let recorded = cluster.version_txt(i);
        if recorded == want {
            return;
        }
        assert!(
            started.elapsed() < deadline,
            "{}'s version.txt records {recorded:?}, not {want:?}, {deadline:?} after the roll\nlogs:\n{}",
            cluster.members[i].name,
            cluster.all_logs()
        );
        thread::sleep(Duration::from_millis(500));
    }
}

/// A scenario under way: the cluster at its first release, with the
/// writer and the monitor running.
struct Scenario {
    test: &'static str,
    started: Instant,
    cluster: Cluster,
    baseline: Baseline,
    monitor: Monitor,
    writer: Writer,
    acks: usize,
}

impl Scenario {
    /// `size` members at `from`, or None (after saying why) when the image
    /// is not there to test.
    fn start(
        test: &'static str,
        style: Style,
        size: usize,
        from: &str,
        needs: &[&str],
    ) -> Option<(Scenario, Ready)> {
        let mut versions = vec![from];
        versions.extend_from_slice(needs);
        let ready = ready(test, &versions)?;
        let started = Instant::now();
        let cluster = Cluster::start(&ready.image, test, style, size, from);
        let baseline = cluster.baseline();
        let monitor = cluster.start_monitor();
        let writer = cluster.start_writer();
        let acks = writer.wait_acks(0, ACKS, ACK_DEADLINE, "writes before the upgrade");
        Some((
            Scenario {
                test,
                started,
                cluster,
                baseline,
                monitor,
                writer,
                acks,
            },
            ready,
        ))
    }

    /// More writes acknowledged, with `why` in the failure message.
    fn writes(&mut self, why: &str) {
        self.acks = self.writer.wait_acks(self.acks, ACKS, ACK_DEADLINE, why);
    }

    /// Member `i` restarted by hand (gracefully) with TARGET_VERSION
    /// `target`, as an operator's rollout of its manifest does.
    fn retarget(&mut self, i: usize, target: &str) {
        self.cluster.container(i).stop(STOP_GRACE_S);
        self.cluster.run_member(i, target);
    }

    /// Every member, one by one, with TARGET_VERSION `target`: the next
    /// once the previous serves again.
    fn retarget_one_by_one(&mut self, target: &str) {
        for i in 0..self.cluster.members.len() {
            self.retarget(i, target);
            self.cluster.wait_healthy(i, START_DEADLINE);
            let name = self.cluster.members[i].name.clone();
            self.writes(&format!("writes after {name} got TARGET_VERSION={target}"));
        }
    }

    /// The roll to `target` is over: every member runs it, its minor is
    /// the cluster version, every version.txt records it, the roll went
    /// through the lock and the proofs, and every invariant holds.
    fn finish(self, target: &str) {
        self.finish_with(target, true);
    }

    /// [`Scenario::finish`]; `through_lock`: the last wave restarted
    /// members under the lock (a one-minor rollout needs none: each member
    /// starts the next minor when its own container starts).
    fn finish_with(mut self, target: &str, through_lock: bool) {
        let took = wait_rolled(&self.cluster, target, ROLL_DEADLINE);
        say(&format!(
            "{}: every member runs {target} {:.1} s after the last restart by hand",
            self.test,
            took.as_secs_f64()
        ));
        self.writes("writes after the roll");
        // A member's entrypoint records its release after proving it (a
        // write through its client URL), a moment after its peers see it
        // run: the record is waited for, not read once.
        for i in 0..self.cluster.members.len() {
            wait_recorded(
                &self.cluster,
                i,
                &format!("{target}/etcd3"),
                RECORD_DEADLINE,
            );
        }
        let record = self.record();
        eprintln!("{}: the entrypoints' record:\n{record}", self.test);
        assert!(
            !through_lock
                || (record.contains("upgrade lock taken") && record.contains("member proven")),
            "the roll went through the lock and the proof; logs:\n{}",
            self.cluster.all_logs()
        );
        let Scenario {
            test,
            started,
            cluster,
            baseline,
            monitor,
            writer,
            ..
        } = self;
        cluster.finish_scenario(test, started, &baseline, writer, monitor);
    }

    /// The entrypoints' lines about the roll, member by member.
    fn record(&self) -> String {
        let mut record = Vec::new();
        for (i, member) in self.cluster.members.iter().enumerate() {
            for line in self.cluster.container(i).logs().lines() {
                let ours = line.contains("[etcd-migrate]")
                    && [
                        "lock",
                        "restarting",
                        "proven",
                        "moved",
                        "stopped",
                        "waiting",
                        "mark",
                    ]
                    .iter()
                    .any(|w| line.contains(w));
                if ours {
                    record.push(format!("{}: {line}", member.name));
                }
            }
        }
        record.join("\n")
    }

    /// Waits until some member's log shows `needle` once more than
    /// `before` (per member) says; that member's index.
    fn wait_for_line(&self, needle: &str, before: &[usize], deadline: Duration) -> usize {
        let started = Instant::now();
        loop {
            for (i, seen) in before.iter().enumerate() {
                if self.cluster.container(i).count_in_log(needle) > *seen {
                    return i;
                }
            }
            assert!(
                started.elapsed() < deadline,
                "no member logged {needle:?} again within {deadline:?}; logs:\n{}",
                self.cluster.all_logs()
            );
            thread::sleep(Duration::from_millis(200));
        }
    }

    /// Takes the cluster's upgrade lock as an operator would to pause a
    /// roll (a holder that is no member; under a lease of its own), once
    /// whoever holds it now has let it go; returns the lease to revoke.
    fn hold_lock(&self) -> i64 {
        self.operator_lock(false)
    }

    /// Takes the upgrade lock as the operator at once, from whoever holds
    /// it (a holder just SIGKILLed: its run is gone), so that nobody else
    /// restarts until [`Scenario::release_lock`]; returns the lease.
    fn seize_lock(&self) -> i64 {
        self.operator_lock(true)
    }

    /// The operator's lock: put under a lease of its own once the key is
    /// free, or (`seize`) over whatever holds it. Through every member in
    /// turn: one just killed answers nothing.
    fn operator_lock(&self, seize: bool) -> i64 {
        let ips = self.cluster.ips();
        let pki = self.cluster.client.clone();
        let deadline = if seize { ACK_DEADLINE } else { ROLL_DEADLINE };
        runtime().block_on(async move {
            let holder =
                serde_json::json!({"member": "0", "name": "the operator (test)", "run": "test"})
                    .to_string();
            let started = Instant::now();
            for ip in ips.iter().cycle() {
                let attempt = async {
                    let mut c = connect(&pki, ip).await?;
                    let lease = c
                        .lease_grant(600, None)
                        .await
                        .map_err(|e| e.to_string())?
                        .id();
                    let free = [Compare::create_revision(LOCK_KEY, CompareOp::Equal, 0)];
                    let txn = Txn::new()
                        .when(if seize { &[][..] } else { &free[..] }.to_vec())
                        .and_then([TxnOp::put(
                            LOCK_KEY,
                            holder.as_str(),
                            Some(PutOptions::new().with_lease(lease)),
                        )]);
                    let taken = c.txn(txn).await.map_err(|e| e.to_string())?.succeeded();
                    if !taken {
                        let _ = c.lease_revoke(lease).await;
                    }
                    Ok::<_, String>(taken.then_some(lease))
                };
                let last = match attempt.await {
                    Ok(Some(lease)) => return lease,
                    Ok(None) => "held by another".to_string(),
                    Err(err) => err,
                };
                assert!(
                    started.elapsed() < deadline,
                    "the operator could not take the upgrade lock within {deadline:?}: {last}"
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            unreachable!("a cycle over the members ends only by returning or panicking")
        })
    }

    /// Lets the operator's hold go.
    fn release_lock(&self, lease: i64) {
        let ip = self.cluster.members[0].ip.clone();
        let pki = self.cluster.client.clone();
        runtime().block_on(async move {
            let mut c = connect(&pki, &ip).await.unwrap_or_else(|e| panic!("{e}"));
            c.lease_revoke(lease)
                .await
                .unwrap_or_else(|e| panic!("revoke the test's lock lease: {e}"));
        });
    }

    /// How often each member has logged `needle` so far.
    fn counts(&self, needle: &str) -> Vec<usize> {
        (0..self.cluster.members.len())
            .map(|i| self.cluster.container(i).count_in_log(needle))
            .collect()
    }
}

/// The kubeadm stacked example set (examples/ha/kubeadm-etcd-*.yaml), as
/// written but for the addresses: 3.3.25 members rolled to 3.5.16.
#[test]
fn the_kubeadm_example_set_rolls_three_members_from_3_3_to_3_5() {
    let Some((mut s, _ready)) = Scenario::start(
        "example-kubeadm-ha",
        Style::KubeadmExample,
        3,
        "3.3.25",
        &["3.4.23", "3.5.16"],
    ) else {
        return;
    };
    s.retarget_one_by_one("3.5.16");
    s.finish("3.5.16");
}

/// The GCE-style example set (examples/ha/gce-etcd-*.manifest), likewise.
#[test]
fn the_gce_example_set_rolls_three_members_from_3_3_to_3_5() {
    let Some((mut s, _ready)) = Scenario::start(
        "example-gce-ha",
        Style::GceExample,
        3,
        "3.3.25",
        &["3.4.23", "3.5.16"],
    ) else {
        return;
    };
    s.retarget_one_by_one("3.5.16");
    s.finish("3.5.16");
}

#[test]
fn five_members_gce_exec_style_roll_from_3_3_to_3_5() {
    let Some((mut s, _ready)) = Scenario::start(
        "roll-5-gce",
        Style::GceHa,
        5,
        "3.3.25",
        &["3.4.23", "3.5.16"],
    ) else {
        return;
    };
    s.retarget_one_by_one("3.5.16");
    s.finish("3.5.16");
}

#[test]
fn all_members_restarted_at_once_form_the_quorum_then_roll() {
    let Some((mut s, _ready)) = Scenario::start(
        "roll-all-at-once",
        Style::Kubeadm,
        3,
        "3.3.25",
        &["3.4.23", "3.5.16"],
    ) else {
        return;
    };
    // The scenario itself takes every member down together.
    s.monitor.excuse_down(true);
    for i in 0..3 {
        s.cluster.container(i).stop(STOP_GRACE_S);
    }
    for i in 0..3 {
        s.cluster.run_member(i, "3.5.16");
    }
    for i in 0..3 {
        s.cluster.wait_healthy(i, START_DEADLINE);
    }
    s.monitor.excuse_down(false);
    s.writes("writes once the members formed the quorum again");
    s.finish("3.5.16");
}

#[test]
fn a_member_offline_holds_the_wave_until_it_is_back() {
    let Some((mut s, _ready)) = Scenario::start(
        "roll-offline",
        Style::Kubeadm,
        3,
        "3.3.25",
        &["3.4.23", "3.5.16"],
    ) else {
        return;
    };
    let offline = 2;
    let name = s.cluster.members[offline].name.clone();
    s.cluster.container(offline).stop(STOP_GRACE_S);
    // The rollout restarts the two others while it is away: two members
    // down at once, the scenario's own doing (and only while it does it).
    s.monitor.excuse_down(true);
    for i in 0..2 {
        s.retarget(i, "3.5.16");
        s.cluster.wait_healthy(i, START_DEADLINE);
    }
    s.monitor.excuse_down(false);
    // Both start 3.4 (one minor ahead of the cluster version 3.3, as etcd
    // allows) and wait for the offline member, saying so; the cluster
    // version cannot reach 3.4 without it, so neither goes on to 3.5.
    let waiting = format!("waiting for member {name}");
    let before = vec![0; 3];
    s.wait_for_line(&waiting, &before, Duration::from_secs(60));
    let seen = s.counts(&waiting);
    s.wait_for_line(&waiting, &seen, Duration::from_secs(60));
    s.writes(&format!("writes while {name} is offline"));
    for i in 0..2 {
        let answer = monitor::version(&s.cluster.client, &s.cluster.members[i].ip)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            (answer.server.as_str(), monitor::minor(&answer.cluster)),
            ("3.4.23", Some((3, 3))),
            "member {i} while {name} was offline"
        );
    }
    s.retarget(offline, "3.5.16");
    s.cluster.wait_healthy(offline, START_DEADLINE);
    s.finish("3.5.16");
}

#[test]
fn lock_holders_killed_at_each_point_of_their_restart_resume_the_roll() {
    // The 3.4 → 3.5 wave has three restarts under the lock, one for each
    // point below (a holder killed at one starts 3.5 at once when it comes
    // back, using up its restart; the operator's hold keeps the others
    // from racing past the next point meanwhile: CI once saw the last
    // member restart while the test was still bringing the second victim
    // back, and then waited for a point nobody would reach). The point after the record (a
    // holder killed before its release: the others wait out the lock's
    // TTL) is e2e/cluster_roll.rs's, with the failpoint.
    let Some((mut s, _ready)) = Scenario::start(
        "roll-kills",
        Style::Kubeadm,
        3,
        "3.3.25",
        &["3.4.23", "3.5.16"],
    ) else {
        return;
    };
    // The operator holds the lock while the test is not watching for the
    // next point, so that no member passes it unseen: through the first
    // wave (no restart there needs the lock) and while a killed holder
    // comes back.
    let mut hold = Some(s.hold_lock());
    s.retarget_one_by_one("3.5.16");
    // Each point of a holder's restart, in the order they come; the member
    // that reaches it next is SIGKILLed there (container and all: the
    // entrypoint and its etcd), then started again as it was.
    for point in [
        "upgrade lock taken",
        "member etcd stopped",
        "member restarting into the next release",
    ] {
        let before = s.counts(point);
        if let Some(lease) = hold.take() {
            s.release_lock(lease);
        }
        let victim = s.wait_for_line(point, &before, ROLL_DEADLINE);
        let name = s.cluster.members[victim].name.clone();
        s.cluster.container(victim).kill();
        eprintln!("{}: {name} SIGKILLed after {point:?}", s.test);
        // The dead holder's lock becomes the operator's: the others wait
        // until the victim serves again and the test watches again.
        hold = Some(s.seize_lock());
        s.cluster.container(victim).start();
        s.cluster.wait_healthy(victim, START_DEADLINE);
        s.writes(&format!("writes after {name} was killed after {point:?}"));
    }
    if let Some(lease) = hold.take() {
        s.release_lock(lease);
    }
    s.finish("3.5.16");
}

#[test]
fn a_holder_cut_off_while_it_restarts_resumes_once_reconnected() {
    let Some((mut s, _ready)) = Scenario::start(
        "roll-cut",
        Style::Kubeadm,
        3,
        "3.3.25",
        &["3.4.23", "3.5.16"],
    ) else {
        return;
    };
    // The 3.5 wave waits on the operator's hold until the test watches,
    // so its first restart (two more to come) is the one cut off.
    let hold = s.hold_lock();
    s.retarget_one_by_one("3.5.16");
    let point = "member restarting into the next release";
    let before = s.counts(point);
    s.release_lock(hold);
    let victim = s.wait_for_line(point, &before, ROLL_DEADLINE);
    let name = s.cluster.members[victim].name.clone();
    let network = s.cluster.network.name.clone();
    s.cluster.container(victim).disconnect(&network);
    eprintln!("{}: {name} cut off after {point:?}", s.test);
    s.writes(&format!("writes while {name} is cut off"));
    let waiting = format!("waiting for member {name}");
    let seen = s.counts(&waiting);
    s.wait_for_line(&waiting, &seen, Duration::from_secs(60));
    let ip = s.cluster.members[victim].ip.clone();
    s.cluster.container(victim).connect(&network, &ip);
    s.finish("3.5.16");
}

#[test]
fn a_target_lowered_during_a_wave_ends_the_roll_at_the_lower_target() {
    let Some((mut s, _ready)) = Scenario::start(
        "roll-lowered",
        Style::Kubeadm,
        3,
        "3.3.25",
        &["3.4.23", "3.5.16"],
    ) else {
        return;
    };
    // The operator pauses the roll by holding the upgrade lock (nobody
    // restarts while another holds it), from before the first wave (which
    // needs no lock: each member starts 3.4 as it is restarted) so that no
    // 3.5 restart can begin; once a member has proven 3.4.23, every
    // member's target is lowered to 3.4.23, and the lock let go.
    let lease = s.hold_lock();
    s.retarget_one_by_one("3.5.16");
    s.wait_for_line("member proven release=3.4.23", &[0, 0, 0], ROLL_DEADLINE);
    eprintln!(
        "{}: the test holds the upgrade lock; lowering the target",
        s.test
    );
    s.retarget_one_by_one("3.4.23");
    s.release_lock(lease);
    // Nobody reached 3.5 (it would be refused now, a rollback, and never
    // serve 3.4.23 again): every member ends at 3.4.23, with one restart
    // each, the rollout's own.
    s.finish_with("3.4.23", false);
}
