//! This module owns the scenarios at one version (no version change): a
//! rolling restart member by member, and a member SIGKILLed then one cut
//! off the network; each keeps quorum and every acknowledged write, with
//! a client writing throughout. And the harness's own proof: a member
//! restarted by hand two minors ahead (etcd allows it) is caught by the
//! monitor.

use std::time::{Duration, Instant};

use crate::harness::cluster::{Cluster, Style, START_DEADLINE, STOP_GRACE_S};
use crate::harness::monitor::violations;
use crate::harness::{ready, say};

/// What the writer must get acknowledged at each stage.
const ACKS: usize = 10;
const ACK_DEADLINE: Duration = Duration::from_secs(60);

pub(crate) fn rolling_restart_of_five_members_at_one_version_keeps_quorum_and_writes() {
    let test = "rolling-5";
    let Some(ready) = ready(test, &["3.3.25"]) else {
        return;
    };
    let started = Instant::now();
    let cluster = Cluster::start(&ready.image, test, Style::Kubeadm, 5, "3.3.25");
    let baseline = cluster.baseline();
    let monitor = cluster.start_monitor();
    let writer = cluster.start_writer();
    let mut acks = writer.wait_acks(0, ACKS, ACK_DEADLINE, "writes before the restarts");
    for i in 0..cluster.members.len() {
        cluster.restart(i);
        // The next member goes down only once every member serves again.
        for j in 0..cluster.members.len() {
            cluster.wait_healthy(j, START_DEADLINE);
        }
        acks = writer.wait_acks(
            acks,
            ACKS,
            ACK_DEADLINE,
            &format!("writes after {} restarted", cluster.members[i].name),
        );
    }
    cluster.finish_scenario(test, started, &baseline, writer, monitor);
}

pub(crate) fn member_killed_then_member_cut_off_rejoin_with_every_write() {
    let test = "kill-cut";
    let Some(ready) = ready(test, &["3.3.25"]) else {
        return;
    };
    let started = Instant::now();
    let cluster = Cluster::start(&ready.image, test, Style::Kubeadm, 3, "3.3.25");
    let baseline = cluster.baseline();
    let monitor = cluster.start_monitor();
    let writer = cluster.start_writer();
    let acks = writer.wait_acks(0, ACKS, ACK_DEADLINE, "writes before the kill");

    // SIGKILL: no leadership transfer, no clean WAL close.
    cluster.container(0).kill();
    let acks = writer.wait_acks(acks, ACKS, ACK_DEADLINE, "writes while a member is killed");
    cluster.container(0).start();
    cluster.wait_healthy(0, START_DEADLINE);
    let acks = writer.wait_acks(acks, ACKS, ACK_DEADLINE, "writes after the kill");

    // Cut off: the member runs on, alone, until it is reconnected.
    cluster.cut_off(2);
    let acks = writer.wait_acks(acks, ACKS, ACK_DEADLINE, "writes while a member is cut off");
    assert!(
        !cluster.reconnect(2),
        "a member cut off while it serves runs on"
    );
    cluster.wait_healthy(2, START_DEADLINE);
    writer.wait_acks(acks, ACKS, ACK_DEADLINE, "writes after the reconnect");

    cluster.finish_scenario(test, started, &baseline, writer, monitor);
}

/// The failure, made by hand: etcd 3.5.16 started directly on a
/// member of a 3.3 cluster joins it (nothing in etcd from 3.1 on stops a
/// member two minors ahead). The monitor must report it, or its "no member
/// two minors ahead" check proves nothing.
pub(crate) fn monitor_catches_a_member_run_by_hand_two_minors_ahead() {
    let test = "by-hand";
    let Some(ready) = ready(test, &["3.3.25", "3.5.16"]) else {
        return;
    };
    let started = Instant::now();
    let mut cluster = Cluster::start(&ready.image, test, Style::Kubeadm, 3, "3.3.25");
    let monitor = cluster.start_monitor();
    cluster.container(2).stop(STOP_GRACE_S);
    cluster.run_member_bypassing_entrypoint(2, "3.5.16");
    cluster.wait_healthy(2, START_DEADLINE);
    monitor.wait_round(
        ACK_DEADLINE,
        "etcd-c answers as 3.5.16",
        |round| matches!(&round.answers[2], Some(a) if a.server == "3.5.16"),
    );
    let rounds = monitor.finish();
    let found = violations(&cluster.names(), &rounds);
    assert!(
        found
            .iter()
            .any(|v| v.contains("etcd-c runs 3.5.16 while the cluster version is 3.3")),
        "the monitor missed etcd-c at 3.5.16 in a 3.3 cluster: {found:?}"
    );
    say(&format!(
        "{test}: the monitor caught it ({}), passed in {:.1} s",
        found[0],
        started.elapsed().as_secs_f64()
    ));
}
