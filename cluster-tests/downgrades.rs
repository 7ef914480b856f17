//! This module owns the rolling-downgrade scenarios (issue 19): members of
//! a live 3.7.1 cluster restarted with a lower TARGET_VERSION walk the
//! whole cluster back through etcd's own downgrade, one minor at a time:
//! with every member on 3.7, one member enables the downgrade under the
//! upgrade lock (the cluster version drops at once), then each member,
//! once its storage version is down too, restarts into the older release
//! under the lock and is recorded once proven. A client writes throughout
//! and the monitor checks, every round, that no two members are down at
//! once and no member runs a release the cluster version does not allow.
//! 3.5 → 3.4.45 takes no job (etcd's guide): each member the rollout
//! restarts comes back on 3.4 with `--next-cluster-version-compatible`.
//!
//! 3.6 and 3.7 are in no registry: these scenarios need an image built
//! with `ETCD_EXTRA_BIN_DIR` (NOT RUN, and counted as ignored, without).

use std::time::Duration;

use crate::harness::cluster::{Style, START_DEADLINE, STOP_GRACE_S};
use crate::upgrades::{wait_recorded, Scenario};

/// What a wave of the downgrade may take to show a line the test waits
/// for (a member enabling, stopping, restarting): its members' restarts
/// on a loaded two-core machine.
const LINE_DEADLINE: Duration = Duration::from_secs(600);

/// The enable, the stop and the restart of a downgrade, in the order a
/// wave logs them.
const ENABLED: &str = "downgrade enabled";
const STOPPED: &str = "member etcd stopped";
const RESTARTING: &str = "member restarting into the next release";

/// 3.7.1 → 3.5.30 (two waves, each enabled under the lock), then back up
/// to 3.7.1 (3.6.14's snapshot past what 3.7 cannot replay first): three
/// members, kubeadm style, one manifest at a time.
pub(crate) fn kubeadm_three_members_go_back_from_3_7_to_3_5_and_up_again() {
    let Some((mut s, _ready)) = Scenario::start(
        "down-kubeadm",
        Style::Kubeadm,
        3,
        "3.7.1",
        &["3.6.14", "3.5.30"],
    ) else {
        return;
    };
    s.retarget_one_by_one("3.5.30");
    s.reached("3.5.30");
    eprintln!(
        "{}: the entrypoints' record going down:\n{}",
        s.test,
        s.record()
    );
    let enabled: usize = s.counts(ENABLED).iter().sum();
    assert!(
        enabled >= 2,
        "two waves, each enabled once at least (to 3.6, then to 3.5):\n{}",
        s.record()
    );
    s.retarget_one_by_one("3.7.1");
    s.finish("3.7.1");
}

/// 3.7.1 → 3.5.30 and back up to 3.7.1 on five members, GCE style.
pub(crate) fn gce_five_members_go_back_from_3_7_to_3_5_and_up_again() {
    let Some((mut s, _ready)) = Scenario::start(
        "down-gce-5",
        Style::GceHa,
        5,
        "3.7.1",
        &["3.6.14", "3.5.30"],
    ) else {
        return;
    };
    s.retarget_one_by_one("3.5.30");
    s.reached("3.5.30");
    s.retarget_one_by_one("3.7.1");
    s.finish("3.7.1");
}

/// A member cut off from the others while the downgrade to 3.6 is
/// enabled: the wave waits for it (never two members down: the cut-off one
/// counts as down), writes go on through the other two, and once it is
/// back every member ends on 3.6 with every write kept.
pub(crate) fn a_member_cut_off_while_the_downgrade_is_enabled_rejoins_the_wave() {
    let Some((mut s, _ready)) =
        Scenario::start("down-cut", Style::Kubeadm, 3, "3.7.1", &["3.6.14"])
    else {
        return;
    };
    let hold = s.hold_lock();
    s.retarget_one_by_one("3.6.14");
    let before = s.counts(ENABLED);
    s.release_lock(hold);
    let enabler = s.wait_for_line(ENABLED, &before, LINE_DEADLINE);
    // Cut off a member other than the one that enabled.
    let victim = (enabler + 1) % 3;
    let name = s.cluster.members[victim].name.clone();
    s.cluster.cut_off(victim);
    eprintln!("{}: {name} cut off after the downgrade was enabled", s.test);
    s.writes(&format!("writes while {name} is cut off"));
    let waiting = format!("waiting for member {name}");
    let seen = s.counts(&waiting);
    s.wait_for_line(&waiting, &seen, Duration::from_secs(120));
    s.cluster.reconnect(victim);
    s.finish("3.6.14");
}

/// The member that reaches each point of a downgrade wave next (its enable,
/// its etcd's stop, its restart into 3.6) is SIGKILLed there, container
/// and all, then started again as it was: the wave resumes and ends with
/// every member on 3.6 and every write kept.
pub(crate) fn downgrade_holders_killed_at_each_point_resume() {
    let Some((mut s, _ready)) =
        Scenario::start("down-kills", Style::Kubeadm, 3, "3.7.1", &["3.6.14"])
    else {
        return;
    };
    let hold = s.hold_lock();
    s.retarget_one_by_one("3.6.14");
    s.kill_at_each(hold, &[ENABLED, STOPPED, RESTARTING]);
    s.finish("3.6.14");
}

/// The target raised back to 3.7.1 after one member went back to 3.6:
/// the job is cancelled (`downgrade job ended`) and the cluster rolls
/// forward to 3.7.1 as an upgrade. The operator holds the upgrade lock
/// throughout the way down, so that exactly one member is on 3.6 when the
/// target is raised, whatever the machine's speed: it enables etcd's
/// downgrade itself (as `etcdctl downgrade enable 3.6` does), waits for
/// the first member's storage version to drop, and restarts that member
/// with TARGET_VERSION=3.6.14 (down anyway, it starts 3.6.14 at once); the
/// others keep 3.7.1 and their target.
pub(crate) fn a_target_raised_mid_downgrade_cancels_it_and_rolls_forward() {
    let Some((mut s, _ready)) =
        Scenario::start("down-raised", Style::Kubeadm, 3, "3.7.1", &["3.6.14"])
    else {
        return;
    };
    let hold = s.hold_lock();
    s.enable_downgrade_by_hand("3.6");
    let ip = s.cluster.members[0].ip.clone();
    let started = std::time::Instant::now();
    loop {
        let storage = crate::harness::monitor::version(&s.cluster.client, &ip)
            .map(|v| v.storage)
            .unwrap_or_default();
        if storage.starts_with("3.6") {
            break;
        }
        assert!(
            started.elapsed() < LINE_DEADLINE,
            "etcd-a's storage version did not drop to 3.6 (now {storage:?})"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    s.retarget(0, "3.6.14");
    s.wait_for_line("member proven release=3.6.14", &[0, 0, 0], LINE_DEADLINE);
    eprintln!("{}: one member runs 3.6.14; raising the target", s.test);
    s.retarget(0, "3.7.1");
    s.wait_for_line("downgrade job ended", &[0, 0, 0], LINE_DEADLINE);
    s.release_lock(hold);
    // Each member, restarted with the raised target while the cluster
    // version is 3.6, starts 3.7.1 at once (one minor ahead, as etcd
    // allows): the way up needs no restart under the lock.
    s.retarget_one_by_one("3.7.1");
    s.finish_with("3.7.1", false);
}

/// A member offline when the others get the lower target: nobody enables
/// the downgrade (every member must be up), the two wait naming it and
/// keep serving 3.7; once it is back with the lower target, the wave goes.
pub(crate) fn a_member_offline_holds_the_downgrade_until_it_is_back() {
    let Some((mut s, _ready)) =
        Scenario::start("down-offline", Style::Kubeadm, 3, "3.7.1", &["3.6.14"])
    else {
        return;
    };
    let offline = 2;
    let name = s.cluster.members[offline].name.clone();
    s.cluster.container(offline).stop(STOP_GRACE_S);
    s.monitor.excuse_down(true);
    for i in 0..2 {
        s.retarget(i, "3.6.14");
        s.cluster.wait_healthy(i, START_DEADLINE);
    }
    s.monitor.end_excuse_once_answering(&[0, 1], START_DEADLINE);
    let waiting = format!("waiting for member {name}");
    s.wait_for_line(&waiting, &[0; 3], Duration::from_secs(120));
    assert_eq!(
        s.counts(ENABLED),
        vec![0; 3],
        "no member enables the downgrade while {name} is offline"
    );
    s.writes(&format!("writes while {name} is offline"));
    s.retarget(offline, "3.6.14");
    s.cluster.wait_healthy(offline, START_DEADLINE);
    s.finish("3.6.14");
}

/// Issue 30: an operator's rollout of a lower target on its own schedule
/// (the next member `gap` after the previous one was restarted, waiting
/// for it to serve when `wait_healthy`), while the first member restarted
/// enables the downgrade at once and its storage version drops within
/// seconds. No entrypoint stops its etcd to restart into 3.6 before the
/// rollout has restarted every member (each has announced 3.6.14 by
/// then): a restart of ours between two of the rollout's would be the
/// second member down. The monitor checks that no two are down at any
/// round throughout.
fn a_rollout_on_its_own_schedule(test: &'static str, gap: Duration, wait_healthy: bool) {
    let Some((mut s, _ready)) = Scenario::start(test, Style::Kubeadm, 3, "3.7.1", &["3.6.14"])
    else {
        return;
    };
    for i in 0..s.cluster.members.len() {
        let stopped = s.counts(STOPPED);
        assert_eq!(
            stopped,
            vec![0; 3],
            "{test}: a member's entrypoint stopped its etcd to restart before the rollout restarted {} (the second member down once the rollout does):\n{}",
            s.cluster.members[i].name,
            s.record()
        );
        s.retarget(i, "3.6.14");
        eprintln!(
            "{test}: {} restarted with TARGET_VERSION=3.6.14",
            s.cluster.members[i].name
        );
        if wait_healthy {
            s.cluster.wait_healthy(i, START_DEADLINE);
        }
        if i + 1 < s.cluster.members.len() {
            std::thread::sleep(gap);
        }
    }
    let enabled: usize = s.counts(ENABLED).iter().sum();
    assert!(
        enabled >= 1,
        "the downgrade was enabled during the rollout:\n{}",
        s.record()
    );
    s.finish("3.6.14");
}

/// The schedule: 3 s apart, nobody waiting for anybody.
pub(crate) fn a_rollout_3_s_apart_never_meets_a_restart_of_ours() {
    a_rollout_on_its_own_schedule("down-rollout-3s", Duration::from_secs(3), false);
}

/// A patient operator: each member serves again, then 40 s more (longer
/// than any quiet spell a heuristic would take for the rollout's end).
pub(crate) fn a_rollout_40_s_apart_never_meets_a_restart_of_ours() {
    a_rollout_on_its_own_schedule("down-rollout-40s", Duration::from_secs(40), true);
}

/// Issue 28 item 6: 3.5 back to a 3.4.32+ online, with no downgrade job
/// (etcd's guide "Downgrade etcd from 3.5 to 3.4"): each member the
/// rollout restarts comes back on 3.4.45 (`--next-cluster-version-compatible`)
/// at once, the cluster version drops to 3.4 when the first one runs, and
/// the others keep serving 3.5 meanwhile; then back up to 3.5.16 as an
/// ordinary one-minor roll. No member enables a downgrade job, none is
/// restarted under the lock (each restart is the rollout's own), and the
/// monitor sees no two members down at once.
pub(crate) fn three_members_go_back_from_3_5_to_3_4_45_with_no_job_and_up_again() {
    let Some((mut s, _ready)) =
        Scenario::start("down-3-5-to-3-4", Style::Kubeadm, 3, "3.5.16", &["3.4.45"])
    else {
        return;
    };
    s.retarget_one_by_one("3.4.45");
    s.reached("3.4.45");
    eprintln!(
        "{}: the entrypoints' record going down:\n{}",
        s.test,
        s.record()
    );
    assert_eq!(
        s.counts(ENABLED),
        vec![0; 3],
        "3.5 → 3.4 takes no downgrade job:\n{}",
        s.record()
    );
    assert_eq!(
        s.counts(STOPPED),
        vec![0; 3],
        "each member came back on 3.4 from the rollout's own restart, none stopped by its entrypoint:\n{}",
        s.record()
    );
    s.retarget_one_by_one("3.5.16");
    s.finish_with("3.5.16", false);
}

/// The line of a member that starts 3.4.32+ at once on 3.5 data (the
/// 3.5 → 3.4 way with no downgrade job).
const STARTS_3_4: &str = "a 3.4.32+ release joins a 3.5 cluster with no downgrade job";
/// The line of a member whose new release was proven by a write.
const PROVEN: &str = "member proven";

/// 3.5.16 → 3.4.45 with the operator's restarts, a member SIGKILLed
/// (container and all) at each point of its way down: the first as its
/// entrypoint starts 3.4.45 on the 3.5 data, the second once 3.4.45 was
/// proven (its record written or not). Each is started again as the
/// kubelet would, with the same target: it carries on from what
/// `version.txt` records, and the roll ends as without the kills, no
/// downgrade job enabled, every acknowledged write kept.
pub(crate) fn a_3_5_to_3_4_45_member_killed_at_each_point_carries_on() {
    let Some((mut s, _ready)) = Scenario::start(
        "down-3-5-to-3-4-kills",
        Style::Kubeadm,
        3,
        "3.5.16",
        &["3.4.45"],
    ) else {
        return;
    };
    for (i, point) in [(0, STARTS_3_4), (1, PROVEN)] {
        let before = s.counts(point);
        s.retarget(i, "3.4.45");
        let victim = s.wait_for_line(point, &before, LINE_DEADLINE);
        let name = s.cluster.members[victim].name.clone();
        assert_eq!(
            victim, i,
            "{name} logged {point:?}, not the member restarted"
        );
        s.cluster.container(victim).kill();
        eprintln!("{}: {name} SIGKILLed after {point:?}", s.test);
        s.cluster.container(victim).start();
        s.cluster.wait_healthy(victim, START_DEADLINE);
        // Its proof and record once more, before the next member's
        // lines are counted.
        wait_recorded(&s.cluster, victim, "3.4.45/etcd3", LINE_DEADLINE);
        s.writes(&format!("writes after {name} was killed after {point:?}"));
    }
    s.retarget(2, "3.4.45");
    s.reached("3.4.45");
    assert_eq!(
        s.counts(ENABLED),
        vec![0; 3],
        "3.5 → 3.4 takes no downgrade job, kills or not:\n{}",
        s.record()
    );
    s.finish_with("3.4.45", false);
}

/// The same rollout on the issue-30 schedule, 3 s apart and nobody
/// waiting for anybody, then GCE style on five members: never two down.
pub(crate) fn a_3_5_to_3_4_45_rollout_3_s_apart_on_five_members() {
    let Some((mut s, _ready)) =
        Scenario::start("down-3-5-rollout-5", Style::GceHa, 5, "3.5.16", &["3.4.45"])
    else {
        return;
    };
    for i in 0..s.cluster.members.len() {
        s.retarget(i, "3.4.45");
        if i + 1 < s.cluster.members.len() {
            std::thread::sleep(Duration::from_secs(3));
        }
    }
    s.finish_with("3.4.45", false);
}
