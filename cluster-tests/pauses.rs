//! This module owns the whole-cluster pause scenarios (issue 28): a
//! target no roll can reach member by member, rolled out with
//! `ALLOW_CLUSTER_PAUSE=1` on every member, is reached through one pause
//! of the cluster's writes; every member ends recording the target, with
//! its name and URLs but new ids, and every acknowledged write kept.
//!
//! - `three_members_etcd2_to_etcd3_with_one_pause`: 3.3.25 on etcd2 data
//!   (GCE's exec style) to etcd3; v2 keys with and without a TTL arrive
//!   as v3 keys with and without a lease, and v3 writes go on after.
//! - `three_members_3_4_to_3_3_with_one_pause`: 3.4.23 back to 3.3.25
//!   (kubeadm style), with a v3 client writing through the pause.
//! - `without_consent_on_one_member_the_job_waits`: one member without
//!   the consent holds the job; the cluster serves 3.4.23 and takes writes
//!   meanwhile, its members say why; once it consents the job is done.

use std::thread;
use std::time::{Duration, Instant};

use crate::harness::cluster::{Cluster, Rollout, Style, Target};
use crate::harness::monitor;
use crate::harness::pause::{ALLOW_CLUSTER_PAUSE, JOB_DEADLINE};
use crate::harness::{ready, say, Api};

/// What the writer must get acknowledged at each stage.
const ACKS: usize = 10;
const ACK_DEADLINE: Duration = Duration::from_secs(60);
/// The operator's rollout: each member's restart 3 s after the one
/// before, waiting for nobody.
const ROLLOUT_GAP: Duration = Duration::from_secs(3);
/// The TTL of the seeded v2 TTL keys: longer than the whole scenario, so
/// none may have expired by the check.
const TTL_S: u64 = 600;
/// How long the job must be seen waiting for the missing consent.
const WAITS_FOR: Duration = Duration::from_secs(30);
/// What a member may take to say why the job waits.
const SAYS_WHY_DEADLINE: Duration = Duration::from_secs(120);

/// A member's manifest with TARGET_VERSION `version`, TARGET_STORAGE
/// `storage` and the operator's consent to a pause.
fn consenting(version: &str, storage: &'static str) -> Target {
    Target::new(version, storage).with_env(ALLOW_CLUSTER_PAUSE, "1")
}

/// Waits until member `i`'s log shows `needle`.
fn wait_logged(cluster: &Cluster, i: usize, needle: &str, deadline: Duration) {
    let started = Instant::now();
    while cluster.container(i).count_in_log(needle) == 0 {
        assert!(
            started.elapsed() < deadline,
            "{} never logged {needle:?} within {deadline:?}; its log:\n{}",
            cluster.members[i].name,
            cluster.container(i).logs()
        );
        thread::sleep(Duration::from_millis(500));
    }
}

/// The release member `i` runs, as it answers `/version` within
/// `deadline`.
fn answer_within(cluster: &Cluster, i: usize, deadline: Duration) -> String {
    let started = Instant::now();
    loop {
        let why = match monitor::version(&cluster.client, &cluster.members[i].ip) {
            Ok(answer) => return answer.server,
            Err(e) => e,
        };
        assert!(
            started.elapsed() < deadline,
            "{} did not answer /version within {deadline:?}: {why}",
            cluster.members[i].name
        );
        thread::sleep(Duration::from_millis(500));
    }
}

/// 3 members of 3.3.25 on etcd2 data (GCE's exec style: the entrypoint
/// supervises etcd), written over v2, with 20 keys of a 600 s TTL and 200
/// plain ones seeded; the operator rolls out TARGET_STORAGE=etcd3 with
/// the consent, 3 s apart. Every member ends recording 3.3.25/etcd3, its
/// name and URLs kept and its id new; each v2 write and seeded key is a
/// v3 key (a TTL key under a lease with what was left of its TTL), and
/// v3 writes go on.
pub(crate) fn three_members_etcd2_to_etcd3_with_one_pause() {
    let test = "pause-etcd2-etcd3";
    let Some(ready) = ready(test, &["3.3.25"]) else {
        return;
    };
    let started = Instant::now();
    let mut cluster = Cluster::start_with(&ready.image, test, Style::GceHa, 3, "3.3.25", "etcd2");
    let before = cluster.baseline();
    let monitor = cluster.start_monitor();
    let writer = cluster.start_writer();
    let ttl_keys = cluster.seed_v2_keys("/cluster-test/ttl/", 20, Some(TTL_S));
    let plain_keys = cluster.seed_v2_keys("/cluster-test/plain/", 200, None);
    writer.wait_acks(0, ACKS, ACK_DEADLINE, "v2 writes before the rollout");
    // A v2 write once the data is etcd3 lands in its v2 store, which
    // nothing reads or migrates: the v2 writer stops before the rollout.
    let v2_log = writer.finish();
    // From the first restart on: the rollout's restarts overlap on a
    // loaded machine (the operator's doing), then the job stops every
    // member.
    monitor.excuse_down(true);
    cluster.roll_out(
        &vec![consenting("3.3.25", "etcd3"); 3],
        Rollout::Apart(ROLLOUT_GAP),
    );
    let took = cluster.wait_job_done("3.3.25", "etcd3", JOB_DEADLINE);
    monitor.excuse_down(false);
    say(&format!(
        "{test}: every member records and serves 3.3.25/etcd3 {:.1} s after the last restart",
        took.as_secs_f64()
    ));
    cluster.switch_data("etcd3", Api::V3);
    cluster.assert_migrated(&[&ttl_keys, &plain_keys]);
    let writer = cluster.start_writer_after(&v2_log);
    writer.wait_acks(0, ACKS, ACK_DEADLINE, "v3 writes after the job");
    cluster.finish_pause_scenario(test, started, &before, vec![v2_log], writer, monitor);
}

/// 3 members of 3.4.23 (kubeadm style), a v3 client writing throughout;
/// the operator rolls out TARGET_VERSION=3.3.25 with the consent, 3 s
/// apart. Every member ends recording 3.3.25/etcd3 with new ids, every
/// acknowledged write is kept, and the writer's pause is told.
pub(crate) fn three_members_3_4_to_3_3_with_one_pause() {
    let test = "pause-3-4-to-3-3";
    let Some(ready) = ready(test, &["3.4.23", "3.3.25"]) else {
        return;
    };
    let started = Instant::now();
    let mut cluster = Cluster::start(&ready.image, test, Style::Kubeadm, 3, "3.4.23");
    let before = cluster.baseline();
    let monitor = cluster.start_monitor();
    let writer = cluster.start_writer();
    writer.wait_acks(0, ACKS, ACK_DEADLINE, "writes before the rollout");
    monitor.excuse_down(true);
    cluster.roll_out(
        &vec![consenting("3.3.25", "etcd3"); 3],
        Rollout::Apart(ROLLOUT_GAP),
    );
    let took = cluster.wait_job_done("3.3.25", "etcd3", JOB_DEADLINE);
    monitor.excuse_down(false);
    say(&format!(
        "{test}: every member records and serves 3.3.25/etcd3 {:.1} s after the last restart",
        took.as_secs_f64()
    ));
    writer.wait_acks(writer.acks(), ACKS, ACK_DEADLINE, "writes after the job");
    cluster.finish_pause_scenario(test, started, &before, Vec::new(), writer, monitor);
}

/// 3 members of 3.4.23 (kubeadm style): the operator rolls out
/// TARGET_VERSION=3.3.25, each member once the one before serves, with
/// the consent on two and not on the third. For 30 s every member still
/// serves 3.4.23 and records 3.4.23/etcd3, writes are acknowledged
/// throughout (never two members down), and every member's log names
/// `ALLOW_CLUSTER_PAUSE`. Once the third is restarted with it too, the
/// job is done as in the 3.4 → 3.3 scenario.
pub(crate) fn without_consent_on_one_member_the_job_waits() {
    let test = "pause-no-consent";
    let Some(ready) = ready(test, &["3.4.23", "3.3.25"]) else {
        return;
    };
    let started = Instant::now();
    let mut cluster = Cluster::start(&ready.image, test, Style::Kubeadm, 3, "3.4.23");
    let before = cluster.baseline();
    let monitor = cluster.start_monitor();
    let writer = cluster.start_writer();
    let mut acks = writer.wait_acks(0, ACKS, ACK_DEADLINE, "writes before the rollout");
    let consent = consenting("3.3.25", "etcd3");
    let without = Target::new("3.3.25", "etcd3");
    cluster.roll_out(
        &[consent.clone(), consent.clone(), without],
        Rollout::Serving,
    );
    let last = cluster.members[2].name.clone();
    let watching = Instant::now();
    while watching.elapsed() < WAITS_FOR {
        acks = writer.wait_acks(
            acks,
            ACKS,
            ACK_DEADLINE,
            &format!("writes while the job waits for {last}'s consent"),
        );
        // A probe lost to a loaded machine proves nothing either way
        // (the monitor counts members down); an answer must be 3.4.23.
        for (i, member) in cluster.members.iter().enumerate() {
            if let Ok(answer) = monitor::version(&cluster.client, &member.ip) {
                assert_eq!(
                    answer.server,
                    "3.4.23",
                    "{} while {last} has no consent ({:.1} s after the rollout); its log:\n{}",
                    member.name,
                    watching.elapsed().as_secs_f64(),
                    cluster.container(i).logs()
                );
            }
        }
    }
    for i in 0..cluster.members.len() {
        assert_eq!(
            answer_within(&cluster, i, ACK_DEADLINE),
            "3.4.23",
            "{} after {:.1} s without {last}'s consent",
            cluster.members[i].name,
            watching.elapsed().as_secs_f64()
        );
    }
    for i in 0..cluster.members.len() {
        assert_eq!(
            cluster.version_txt(i),
            "3.4.23/etcd3",
            "{} records its release while the job waits",
            cluster.members[i].name
        );
    }
    // Each says why: the two that consented wait for the third, the
    // third lacks the consent.
    for i in 0..cluster.members.len() {
        wait_logged(&cluster, i, ALLOW_CLUSTER_PAUSE, SAYS_WHY_DEADLINE);
    }
    say(&format!(
        "{test}: the job waited {:.1} s for {last}'s consent, writes going on, every member naming {ALLOW_CLUSTER_PAUSE}",
        watching.elapsed().as_secs_f64()
    ));
    // The third's restart, then the job's stop of every member.
    monitor.excuse_down(true);
    cluster.restart_as(2, &consent);
    let took = cluster.wait_job_done("3.3.25", "etcd3", JOB_DEADLINE);
    monitor.excuse_down(false);
    say(&format!(
        "{test}: every member records and serves 3.3.25/etcd3 {:.1} s after {last} consented",
        took.as_secs_f64()
    ));
    writer.wait_acks(writer.acks(), ACKS, ACK_DEADLINE, "writes after the job");
    cluster.finish_pause_scenario(test, started, &before, Vec::new(), writer, monitor);
}
