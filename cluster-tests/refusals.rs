//! This module owns the safety-floor scenarios on a live cluster: a
//! member of a 3-member 3.3.25 cluster (TLS), restarted with
//! TARGET_VERSION=3.5.16 through `migrate-if-needed.sh` (which cannot
//! coordinate a roll), must be refused by its entrypoint (exit 2, naming
//! the members) while a client writes throughout; one of a 3.5.16 cluster
//! restarted with a rollback target keeps serving its release and says
//! why; a member joining with a target two
//! minors ahead of the cluster version likewise; the cluster keeps
//! quorum and every acknowledged write, the member's advertised URLs in the
//! membership are unchanged and the cluster version stays; restarted at
//! its release the member rejoins and every invariant holds.

use std::time::{Duration, Instant};

use crate::harness::cluster::{
    Baseline, Cluster, Style, REFUSE_DEADLINE, START_DEADLINE, STOP_GRACE_S,
};
use crate::harness::monitor::{minor, Monitor};
use crate::harness::writer::Writer;
use crate::harness::{ready, say, Ready};

/// What the writer must get acknowledged at each stage.
const ACKS: usize = 20;
const ACK_DEADLINE: Duration = Duration::from_secs(60);

/// A live 3-member cluster at `runs`, its writer and monitor going, and
/// one member just restarted with TARGET_VERSION=`target`.
struct Restarted {
    started: Instant,
    cluster: Cluster,
    baseline: Baseline,
    monitor: Monitor,
    writer: Writer,
    /// Writes acknowledged before the restart.
    acks: usize,
    /// The restarted member, and its name.
    victim: usize,
    name: String,
}

fn restart_one_with_target(
    ready: &Ready,
    test: &str,
    style: Style,
    runs: &str,
    target: &str,
) -> Restarted {
    let started = Instant::now();
    let mut cluster = Cluster::start(&ready.image, test, style, 3, runs);
    let baseline = cluster.baseline();
    let monitor = cluster.start_monitor();
    let writer = cluster.start_writer();
    let acks = writer.wait_acks(0, ACKS, ACK_DEADLINE, "writes before any restart");
    let victim = 1;
    let name = cluster.members[victim].name.clone();
    cluster.container(victim).stop(STOP_GRACE_S);
    cluster.run_member(victim, target);
    Restarted {
        started,
        cluster,
        baseline,
        monitor,
        writer,
        acks,
        victim,
        name,
    }
}

/// A member of a live 3-member cluster at `runs`, restarted with
/// TARGET_VERSION=`target`, must be refused; then it rejoins at `runs`.
fn refused_target_keeps_the_cluster(test: &str, style: Style, runs: &str, target: &str) {
    let Some(ready) = ready(test, &[runs, target]) else {
        return;
    };
    let cluster_minor = minor(runs).expect("X.Y.Z");
    let Restarted {
        started,
        mut cluster,
        baseline,
        monitor,
        writer,
        acks,
        victim,
        name,
    } = restart_one_with_target(&ready, test, style, runs, target);
    let code = cluster.container(victim).wait_exit(REFUSE_DEADLINE);
    let refusal = cluster.container(victim).logs();
    assert_eq!(
        code, 2,
        "{name} restarted with TARGET_VERSION={target} must be refused with exit 2; its log:\n{refusal}"
    );
    for member in cluster.names() {
        assert!(
            refusal.contains(&member),
            "the refusal must name member {member}; it says:\n{refusal}"
        );
    }
    eprintln!(
        "{test}: {name} at TARGET_VERSION={target} exited 2:\n{}",
        refusal.trim()
    );
    assert_eq!(
        cluster.version_txt(victim),
        format!("{runs}/etcd3"),
        "the refusal must leave version.txt alone"
    );

    // Quorum kept while the member is out, its URLs kept, the cluster
    // version kept.
    let acks = writer.wait_acks(acks, ACKS, ACK_DEADLINE, "writes while a member is refused");
    for live in (0..3).filter(|i| *i != victim) {
        let (membership, _) = cluster.membership(live);
        assert_eq!(
            membership, baseline.membership,
            "the membership changed after the refusal"
        );
        let cv = cluster.cluster_version(live);
        assert_eq!(
            minor(&cv),
            Some(cluster_minor),
            "cluster version after the refusal: {cv}"
        );
    }

    // Back at its release it rejoins.
    cluster.run_member(victim, runs);
    cluster.wait_healthy(victim, START_DEADLINE);
    writer.wait_acks(acks, ACKS, ACK_DEADLINE, "writes after the member rejoined");

    cluster.finish_scenario(test, started, &baseline, writer, monitor);
}

/// `migrate-if-needed.sh` (`--no-exec`) exits before etcd starts, so it
/// cannot restart the member under the cluster's lock nor supervise it: a
/// new target on multi-member data is refused, naming the members (the
/// entrypoint form rolls it: `upgrades`).
pub(crate) fn gce_member_restarted_with_a_new_target_by_migrate_if_needed_is_refused_and_rejoins() {
    refused_target_keeps_the_cluster("gce-refused", Style::Gce, "3.3.25", "3.5.16");
}

/// A member of a 3.5.16 cluster restarted with TARGET_VERSION one minor
/// back (a Kubernetes rollback lowering the target on each manifest in
/// turn) without the consent to a whole-cluster pause (3.5 -> 3.4.23 has
/// no online way: issue 28's pause job): the member must not exit over it
/// (each exit of the rollout would cost the cluster a voter). It starts
/// its recorded release, serves as a member, and says on its wait lines
/// that the job needs ALLOW_CLUSTER_PAUSE; its version.txt stays; put
/// back at its release it serves on.
pub(crate) fn kubeadm_member_restarted_one_minor_back_keeps_serving_its_release() {
    let (test, runs, target) = ("kubeadm-rollback", "3.5.16", "3.4.23");
    let Some(ready) = ready(test, &[runs, target]) else {
        return;
    };
    let Restarted {
        started,
        mut cluster,
        baseline,
        monitor,
        writer,
        acks,
        victim,
        name,
    } = restart_one_with_target(&ready, test, Style::Kubeadm, runs, target);
    cluster.wait_healthy(victim, START_DEADLINE);
    let why = "set ALLOW_CLUSTER_PAUSE=1 (or --allow-cluster-pause) on every member";
    let deadline = Instant::now() + REFUSE_DEADLINE;
    while cluster.container(victim).count_in_log(why) == 0 {
        assert!(
            Instant::now() < deadline,
            "{name} at TARGET_VERSION={target} never said why it stays; its log:\n{}",
            cluster.container(victim).logs()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    say(&format!(
        "{test}: {name} at TARGET_VERSION={target} serves {runs} and says: {why} ..."
    ));
    assert!(
        matches!(
            cluster.container(victim).state(),
            crate::harness::docker::State::Running
        ),
        "{name} must keep running"
    );
    assert_eq!(cluster.version_txt(victim), format!("{runs}/etcd3"));
    let acks = writer.wait_acks(
        acks,
        ACKS,
        ACK_DEADLINE,
        "writes while the target is lowered",
    );
    for live in 0..3 {
        let cv = cluster.cluster_version(live);
        assert_eq!(minor(&cv), minor(runs), "cluster version: {cv}");
    }

    // The rollout reverted: back at its release it serves on.
    cluster.container(victim).stop(STOP_GRACE_S);
    cluster.run_member(victim, runs);
    cluster.wait_healthy(victim, START_DEADLINE);
    writer.wait_acks(
        acks,
        ACKS,
        ACK_DEADLINE,
        "writes after the target was put back",
    );
    cluster.finish_scenario(test, started, &baseline, writer, monitor);
}

/// A member joining a live 3.3 cluster (kubeadm's control-plane join, or a
/// GCE master added: a `member add`, then the pod on an empty data dir with
/// `--initial-cluster-state existing`) with TARGET_VERSION=3.5.16 must not
/// run two minors ahead of the cluster version. Its data records no
/// membership yet, so the entrypoint asks the members `--initial-cluster`
/// (or INITIAL_CLUSTER) names for their cluster version, over the member's
/// peer TLS, and refuses a target that does not fit it (exit 2). Before
/// that check, 3.5.16 was exec'd and etcd let it join the 3.3 cluster.
fn joining_two_minors_ahead_is_refused(test: &str, style: Style) {
    let Some(ready) = ready(test, &["3.3.25", "3.5.16"]) else {
        return;
    };
    let started = Instant::now();
    let mut cluster = Cluster::start(&ready.image, test, style, 3, "3.3.25");
    let monitor = cluster.start_monitor();
    let writer = cluster.start_writer();
    let acks = writer.wait_acks(0, ACKS, ACK_DEADLINE, "writes before the join");
    let joiner = cluster.add_member("3.5.16");
    let name = cluster.members[joiner].name.clone();
    // Either it is refused, or it serves (and the monitor must not see
    // it two minors ahead).
    let deadline = Instant::now() + START_DEADLINE;
    let refused = loop {
        if let crate::harness::docker::State::Exited(code) = cluster.container(joiner).state() {
            break Some(code);
        }
        if crate::harness::monitor::healthy(&cluster.client, &cluster.members[joiner].ip).is_ok() {
            break None;
        }
        assert!(
            Instant::now() < deadline,
            "{name} neither refused nor served"
        );
        std::thread::sleep(crate::harness::docker::POLL * 2);
    };
    writer.wait_acks(acks, ACKS, ACK_DEADLINE, "writes after the join");
    let log = cluster.container(joiner).logs();
    let _ = writer.finish();
    let mut rounds = monitor.finish();
    if refused.is_none() {
        // The first monitor polls the three first members; one more round
        // of all four sees what the new member runs.
        let all = cluster.start_monitor();
        all.wait_round(ACK_DEADLINE, "every member answers", |r| {
            r.answers.iter().all(Option::is_some)
        });
        rounds = all.finish();
    }
    let cv = cluster.cluster_version(0);
    let found = crate::harness::monitor::violations(&cluster.names(), &rounds);
    say(&format!(
        "{test}: {name} joined with TARGET_VERSION=3.5.16: exit {refused:?}, cluster version {cv}, violations {found:?}; its first lines:\n{}",
        log.lines().take(8).collect::<Vec<_>>().join("\n")
    ));
    assert_eq!(refused, Some(2), "{name} must be refused with exit 2");
    assert!(found.is_empty(), "{found:?}");
    say(&format!(
        "{test}: passed in {:.1} s",
        started.elapsed().as_secs_f64()
    ));
}

pub(crate) fn kubeadm_member_joining_two_minors_ahead_is_refused() {
    joining_two_minors_ahead_is_refused("kubeadm-join", Style::Kubeadm);
}

pub(crate) fn gce_member_joining_two_minors_ahead_is_refused() {
    joining_two_minors_ahead_is_refused("gce-join", Style::Gce);
}
