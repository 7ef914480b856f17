//! This module owns the disaster-recovery scenarios (issue 29): a whole
//! cluster restored from one snapshot by its members' entrypoints, each
//! given the same `RESTORE_SNAPSHOT` and `RESTORE_SNAPSHOT_SHA256`; members
//! that join by themselves; a lost quorum recovered. On 3.5.16, and on
//! 3.7.1 where `ETCD_EXTRA_BIN_DIR` has it (NOT RUN without).

use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

use crate::harness::cluster::{Cluster, Style, START_DEADLINE, STOP_GRACE_S};
use crate::harness::docker::first_to_log;
use crate::harness::writer::{connect, runtime, REQUEST_DEADLINE};
use crate::harness::{ready, say};

/// Keys written before the snapshot (all restored) and after it (none).
const BEFORE: &str = "/restore-test/before/";
const AFTER: &str = "/restore-test/after/";
const KEYS: usize = 50;

/// Puts `KEYS` keys under `prefix` through member `ip`.
fn put_keys(cluster: &Cluster, ip: &str, prefix: &str) {
    let pki = cluster.client.clone();
    let ip = ip.to_string();
    let prefix = prefix.to_string();
    runtime().block_on(async move {
        let mut c = connect(&pki, &ip).await.unwrap_or_else(|e| panic!("{e}"));
        for i in 0..KEYS {
            tokio::time::timeout(
                REQUEST_DEADLINE,
                c.put(format!("{prefix}{i:04}"), "v", None),
            )
            .await
            .unwrap_or_else(|_| panic!("put through {ip}: no answer in time"))
            .unwrap_or_else(|e| panic!("put through {ip}: {e}"));
        }
    });
}

/// How many keys under `prefix` member `ip` serves, and its revision.
fn count(cluster: &Cluster, ip: &str, prefix: &str) -> (usize, i64) {
    let pki = cluster.client.clone();
    let ip = ip.to_string();
    let prefix = prefix.to_string();
    runtime().block_on(async move {
        let mut c = connect(&pki, &ip).await.unwrap_or_else(|e| panic!("{e}"));
        let resp = tokio::time::timeout(
            REQUEST_DEADLINE,
            c.get(
                prefix.as_str(),
                Some(
                    etcd_client::GetOptions::new()
                        .with_prefix()
                        .with_count_only(),
                ),
            ),
        )
        .await
        .unwrap_or_else(|_| panic!("get from {ip}: no answer in time"))
        .unwrap_or_else(|e| panic!("get from {ip}: {e}"));
        let revision = resp.header().map_or(0, |h| h.revision());
        (resp.count() as usize, revision)
    })
}

/// 3 members of `release` (kubeadm style, TLS) with `KEYS` keys under
/// [`BEFORE`], written through the first (its address returned), or None
/// when the image is not there to test.
fn three_with_keys(test: &str, release: &str) -> Option<(Instant, Cluster, String)> {
    with_keys(test, release, Style::Kubeadm, 3)
}

/// [`three_with_keys`] with `size` members in `style`.
fn with_keys(
    test: &str,
    release: &str,
    style: Style,
    size: usize,
) -> Option<(Instant, Cluster, String)> {
    let ready = ready(test, &[release])?;
    let started = Instant::now();
    let cluster = Cluster::start(&ready.image, test, style, size, release);
    let ip0 = cluster.members[0].ip.clone();
    put_keys(&cluster, &ip0, BEFORE);
    Some((started, cluster, ip0))
}

/// Every member serves all `KEYS` keys under each of `prefixes`.
fn every_member_holds(cluster: &Cluster, prefixes: &[&str]) {
    for member in &cluster.members {
        for prefix in prefixes {
            assert_eq!(
                count(cluster, &member.ip, prefix).0,
                KEYS,
                "{} under {prefix}",
                member.name
            );
        }
    }
}

/// The snapshot member `ip` streams (what `etcdctl snapshot save` writes:
/// the db, then its sha256).
fn snapshot(cluster: &Cluster, ip: &str) -> Vec<u8> {
    let pki = cluster.client.clone();
    let ip = ip.to_string();
    runtime().block_on(async move {
        let mut c = connect(&pki, &ip).await.unwrap_or_else(|e| panic!("{e}"));
        let mut stream = c
            .snapshot()
            .await
            .unwrap_or_else(|e| panic!("snapshot from {ip}: {e}"));
        let mut bytes = Vec::new();
        loop {
            let next = tokio::time::timeout(Duration::from_secs(30), stream.message())
                .await
                .unwrap_or_else(|_| panic!("snapshot from {ip}: stalled"))
                .unwrap_or_else(|e| panic!("snapshot from {ip}: {e}"));
            match next {
                Some(part) => bytes.extend_from_slice(part.blob()),
                None => return bytes,
            }
        }
    })
}

/// 3 members at 3.5.16 (kubeadm style, TLS): keys written, a snapshot
/// taken from one member, more keys written; then every member is stopped
/// and started again with the snapshot's settings. Each restores once
/// (revision bumped past the snapshot's), the members form one cluster
/// again (one cluster id, the same three names and peer URLs), every key
/// up to the snapshot is there and none after, and writes go on; a member
/// restarted with the setting still in its manifest restores nothing again.
pub(crate) fn a_whole_cluster_is_restored_from_one_snapshot() {
    restore_cluster("restore-cluster", Style::Kubeadm, 3, false, "3.5.16");
}

/// The same on 3.7.1 (`ETCD_EXTRA_BIN_DIR`): 3.7's own `etcdutl`.
pub(crate) fn a_whole_3_7_cluster_is_restored_from_one_snapshot() {
    restore_cluster("restore-cluster-3-7", Style::Kubeadm, 3, false, "3.7.1");
}

/// The same with 5 members, GCE style: `migrate-if-needed.sh` restores
/// (`--no-exec`), then the manifest's own `exec etcd-<version>` serves.
/// One member is given another snapshot (taken later) and its hash: it
/// restores it, but its etcd is turned away by the others (another
/// cluster id: the token carries the file's hash) and serves nothing;
/// restarted with the right file and hash, it restores again and joins.
pub(crate) fn five_members_gce_style_are_restored_from_one_snapshot() {
    restore_cluster("restore-cluster-5", Style::Gce, 5, true, "3.5.16");
}

/// The mounted snapshot `name` and its sha256, as a member's options.
fn restore_options(shared: &std::path::Path, name: &str, bytes: &[u8]) -> Vec<String> {
    std::fs::write(shared.join(name), bytes).expect("write the snapshot");
    let sha: String = Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    vec![
        "-v".to_string(),
        format!("{}:/var/lib/etcd-restore:ro", shared.display()),
        "-e".to_string(),
        format!("RESTORE_SNAPSHOT=/var/lib/etcd-restore/{name}"),
        "-e".to_string(),
        format!("RESTORE_SNAPSHOT_SHA256={sha}"),
    ]
}

/// `size` members of 3.5.16 in `style` restored from one snapshot (see
/// [`a_whole_cluster_is_restored_from_one_snapshot`]); with `odd`, the
/// last one first from another (see
/// [`five_members_gce_style_are_restored_from_one_snapshot`]).
fn restore_cluster(test: &str, style: Style, size: usize, odd: bool, release: &str) {
    let Some(ready) = ready(test, &[release]) else {
        return;
    };
    let started = Instant::now();
    let mut cluster = Cluster::start(&ready.image, test, style, size, release);
    let (before_membership, _) = cluster.membership(0);
    let ip0 = cluster.members[0].ip.clone();
    put_keys(&cluster, &ip0, BEFORE);
    let bytes = snapshot(&cluster, &ip0);
    put_keys(&cluster, &ip0, AFTER);
    let (_, revision_before) = count(&cluster, &ip0, AFTER);
    let later = snapshot(&cluster, &ip0);

    let shared = cluster.shared_dir();
    let right = restore_options(&shared, "snapshot.db", &bytes);
    let wrong = restore_options(&shared, "later.db", &later);
    for i in 0..cluster.members.len() {
        cluster.container(i).stop(STOP_GRACE_S);
    }
    let restoring = Instant::now();
    let last = size - 1;
    for i in 0..cluster.members.len() {
        cluster.extra_options = if odd && i == last {
            wrong.clone()
        } else {
            right.clone()
        };
        cluster.run_member(i, release);
    }
    cluster.extra_options = right.clone();
    let same_file = if odd { last } else { size };
    for i in 0..same_file {
        cluster.wait_healthy(i, START_DEADLINE);
    }
    let took = restoring.elapsed();
    if odd {
        // Turned away by the others: its cluster id is not theirs.
        let started_odd = Instant::now();
        while cluster.container(last).count_in_log("cluster ID mismatch") == 0 {
            assert!(
                started_odd.elapsed() < START_DEADLINE,
                "{} restored from another file was not turned away:\n{}",
                cluster.members[last].name,
                cluster.container(last).logs()
            );
            std::thread::sleep(Duration::from_millis(500));
        }
        assert!(
            crate::harness::monitor::healthy(&cluster.client, &cluster.members[last].ip).is_err(),
            "{} serves from another file",
            cluster.members[last].name
        );
        say(&format!(
            "{test}: {} restored from another snapshot is turned away by the others (cluster ID mismatch); restarted with the right one",
            cluster.members[last].name
        ));
        cluster.run_member(last, release);
        cluster.wait_healthy(last, START_DEADLINE);
    }
    let (after_membership, _) = cluster.membership(0);
    assert_ne!(
        after_membership.cluster_id, before_membership.cluster_id,
        "a restored cluster is a new cluster (new ids)"
    );
    let names = |m: &crate::harness::cluster::Membership| {
        let mut v: Vec<(String, Vec<String>)> = m
            .members
            .values()
            .map(|(name, peers, _)| (name.clone(), peers.clone()))
            .collect();
        v.sort();
        v
    };
    assert_eq!(
        names(&after_membership),
        names(&before_membership),
        "the same names and peer URLs"
    );
    for i in 0..cluster.members.len() {
        let ip = cluster.members[i].ip.clone();
        let (membership, _) = cluster.membership(i);
        assert_eq!(
            membership.cluster_id, after_membership.cluster_id,
            "{} is in the one restored cluster",
            cluster.members[i].name
        );
        let (before, revision) = count(&cluster, &ip, BEFORE);
        let (after, _) = count(&cluster, &ip, AFTER);
        assert_eq!(
            before, KEYS,
            "{}: every key up to the snapshot",
            cluster.members[i].name
        );
        assert_eq!(
            after, 0,
            "{}: no key written after the snapshot",
            cluster.members[i].name
        );
        assert!(
            revision > revision_before && revision > 1_000_000_000,
            "{}: revision {revision} is past the old cluster's {revision_before} (bumped)",
            cluster.members[i].name
        );
        assert_eq!(
            cluster.container(i).count_in_log("restored version="),
            // (a container's own log: the odd member's second container
            // restored from the right file once)
            1,
            "{} restored once:\n{}",
            cluster.members[i].name,
            cluster.container(i).logs()
        );
    }
    put_keys(
        &cluster,
        &cluster.members[1].ip.clone(),
        "/restore-test/later/",
    );

    // The setting left in the manifest for days: a restart restores
    // nothing again, and the member rejoins its cluster.
    cluster.run_member(2, release);
    cluster.wait_healthy(2, START_DEADLINE);
    assert_eq!(
        cluster.container(2).count_in_log("restoring the data dir"),
        0,
        "restored again:\n{}",
        cluster.container(2).logs()
    );
    let (later, _) = count(
        &cluster,
        &cluster.members[2].ip.clone(),
        "/restore-test/later/",
    );
    assert_eq!(
        later, KEYS,
        "the restarted member has the writes since the restore"
    );
    say(&format!(
        "{test}: {size} members restored from one snapshot and serving in {:.1} s; passed in {:.1} s",
        took.as_secs_f64(),
        started.elapsed().as_secs_f64()
    ));
}

/// The line an entrypoint logs right after it added its member.
const ADDED: &str = "added this member to the cluster";
/// The line an entrypoint logs right after its learner was promoted.
const PROMOTED: &str = "this member, joined as a learner, is a voter now";
/// The line of a restart that finds a join as a learner cut short.
const JOIN_AGAIN: &str = "a join as a learner died before its promotion was recorded";
/// The line of a restart that finds its join recorded.
const SERVES_AS_RECORDED: &str = "already at target";

/// Members that join by themselves (issue 29 item 3), as learners (3.5):
/// a fourth member started on an empty data dir with
/// `--initial-cluster-state existing` and nobody's `member add` adds
/// itself; SIGKILLed right after its add (a learner, its half-joined data
/// never recorded), it is started again as the kubelet would, joins anew,
/// is promoted and serves. Then a member that lost its data (its volume
/// replaced by an empty one, its stale entry still in the membership)
/// removes that entry, adds itself again, and is SIGKILLed right after
/// its promotion; started again, it serves (as recorded, or joined anew
/// if the kill beat the record). The membership ends with four voters,
/// no stale entry, and every key on every member.
pub(crate) fn members_join_by_themselves_new_and_after_losing_their_data() {
    self_join("self-join", "3.5.16");
}

/// The same on 3.7.1 (`ETCD_EXTRA_BIN_DIR`).
pub(crate) fn members_join_by_themselves_on_3_7() {
    self_join("self-join-3-7", "3.7.1");
}

/// [`members_join_by_themselves_new_and_after_losing_their_data`] on
/// `release`.
fn self_join(test: &str, release: &str) {
    let Some((started, mut cluster, _)) = three_with_keys(test, release) else {
        return;
    };

    let d = cluster.add_member_by_itself(release);
    kill_at_line(&cluster, d, ADDED);
    cluster.wait_healthy(d, START_DEADLINE);
    let membership = wait_for_voters(&cluster, 4, START_DEADLINE);
    let ip_d = cluster.members[d].ip.clone();
    assert_eq!(
        count(&cluster, &ip_d, BEFORE).0,
        KEYS,
        "the new member holds the keyspace"
    );
    let log_d = cluster.container(d).logs();
    // The learner is promoted and recorded about 0.2 s after its add: a
    // kill that comes later on a loaded machine (seen with two CPU
    // burners beside the run) finds the join recorded, and the restart
    // serves as recorded. Either way it is one join, one promotion; the
    // cut-short path itself is e2e/restores.rs's, at a failpoint.
    let joined_anew = log_d.matches(JOIN_AGAIN).count();
    assert!(
        joined_anew == 1 || (joined_anew == 0 && log_d.contains(SERVES_AS_RECORDED)),
        "the restart found the join cut short and joined anew, or found it recorded and served: {log_d}"
    );
    assert_eq!(log_d.matches(PROMOTED).count(), 1, "{log_d}");

    let c = 2;
    let old_id = membership
        .iter()
        .find(|m| m.0 == cluster.members[c].name)
        .map(|m| m.1)
        .expect("etcd-c in the membership");
    cluster.wipe_and_rejoin(c, release);
    kill_at_line(&cluster, c, PROMOTED);
    cluster.wait_healthy(c, START_DEADLINE);
    let membership = wait_for_voters(&cluster, 4, START_DEADLINE);
    assert!(
        !membership.iter().any(|m| m.1 == old_id),
        "the stale entry {old_id:x} is gone: {membership:?}"
    );
    let log_c = cluster.container(c).logs();
    assert!(
        log_c.contains("removed this member's stale entry"),
        "{log_c}"
    );
    let ip_c = cluster.members[c].ip.clone();
    put_keys(&cluster, &ip_c, AFTER);
    every_member_holds(&cluster, &[BEFORE, AFTER]);
    say(&format!(
        "{test}: a member added itself (killed once as a learner: {}), a wiped member replaced its stale entry (killed once after its promotion); {}; passed in {:.1} s",
        if joined_anew == 1 {
            "the kill beat its record: it joined anew"
        } else {
            "the kill came after its record: it served as recorded"
        },
        if log_c.contains(JOIN_AGAIN) {
            "the second kill beat its record: it joined anew"
        } else {
            "the second kill came after its record: it served as recorded"
        },
        started.elapsed().as_secs_f64()
    ));
}

/// Member `i`'s entrypoint SIGKILLed (with its etcd) right after it logs
/// `line`, then its container started again as the kubelet would.
fn kill_at_line(cluster: &Cluster, i: usize, line: &str) {
    let container = cluster.container(i);
    if first_to_log(&[container], line, START_DEADLINE).is_none() {
        panic!(
            "{} never logged {line:?} within {START_DEADLINE:?}; its log:\n{}",
            cluster.members[i].name,
            container.logs()
        );
    }
    container.kill();
    say(&format!(
        "{} SIGKILLed right after {line:?}",
        cluster.members[i].name
    ));
    container.start();
}

/// Waits until member 0 lists `size` members, every one a started voter
/// (no learner, no unnamed entry); returns them as (name, id).
fn wait_for_voters(cluster: &Cluster, size: usize, deadline: Duration) -> Vec<(String, u64)> {
    wait_for_voters_through(cluster, 0, size, deadline)
}

/// [`wait_for_voters`], as member `through` lists them.
fn wait_for_voters_through(
    cluster: &Cluster,
    through: usize,
    size: usize,
    deadline: Duration,
) -> Vec<(String, u64)> {
    let pki = cluster.client.clone();
    let ip = cluster.members[through].ip.clone();
    let started = Instant::now();
    loop {
        let listed: Vec<(String, u64, bool)> = runtime().block_on(async {
            let mut c = connect(&pki, &ip).await.unwrap_or_else(|e| panic!("{e}"));
            let resp = tokio::time::timeout(REQUEST_DEADLINE, c.member_list())
                .await
                .unwrap_or_else(|_| panic!("member list from {ip}: no answer in time"))
                .unwrap_or_else(|e| panic!("member list from {ip}: {e}"));
            resp.members()
                .iter()
                .map(|m| (m.name().to_string(), m.id(), m.is_learner()))
                .collect()
        });
        if listed.len() == size
            && listed
                .iter()
                .all(|(name, _, learner)| !name.is_empty() && !learner)
        {
            return listed.into_iter().map(|(name, id, _)| (name, id)).collect();
        }
        assert!(
            started.elapsed() < deadline,
            "not {size} started voters within {deadline:?}: {listed:?}"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// A cluster that lost its quorum (issue 29 items 2 and 4): 3 members at
/// 3.5.16, keys written. First, `FORCE_NEW_CLUSTER=1` on a member while
/// the others serve is refused (exit 2, nothing touched). Then one member
/// is lost with its data, and the two survivors are both restarted with
/// the setting at once (a manifest edited on both): exactly one forces a
/// cluster of one with every key and takes writes; the other refuses
/// (exit 2, its data as it was), never a second cluster. The one that
/// yielded and the lost one then join by themselves on empty data dirs.
/// Restarted with the setting left, the survivor does not force again.
pub(crate) fn a_cluster_that_lost_its_quorum_is_recovered_from_one_survivor() {
    force_new("force-new", "3.5.16", Style::Kubeadm, 3);
}

/// The same on 5 members, GCE style: three lost with their data, the two
/// survivors restarted with the setting at once; one forces, and the
/// other and the three lost join it one by one.
pub(crate) fn five_members_that_lost_three_are_recovered_from_one_survivor() {
    force_new("force-new-5", "3.5.16", Style::GceHa, 5);
}

/// The same on 3.7.1 (`ETCD_EXTRA_BIN_DIR`).
pub(crate) fn a_3_7_cluster_that_lost_its_quorum_is_recovered() {
    force_new("force-new-3-7", "3.7.1", Style::Kubeadm, 3);
}

/// [`a_cluster_that_lost_its_quorum_is_recovered_from_one_survivor`] on
/// `release`.
fn force_new(test: &str, release: &str, style: Style, size: usize) {
    let Some((started, mut cluster, _)) = with_keys(test, release, style, size) else {
        return;
    };
    let force = vec!["-e".to_string(), "FORCE_NEW_CLUSTER=1".to_string()];

    cluster.extra_options = force.clone();
    cluster.container(0).stop(STOP_GRACE_S);
    cluster.run_member(0, release);
    let code = cluster.container(0).wait_exit(START_DEADLINE);
    assert_eq!(
        code,
        2,
        "refused while a quorum answers:\n{}",
        cluster.container(0).logs()
    );
    assert_eq!(
        cluster
            .container(0)
            .count_in_log("a quorum with this member"),
        1,
        "{}",
        cluster.container(0).logs()
    );

    // Members 2.. are lost; 0 (down since its refusal) and 1 are
    // restarted with the setting at once.
    for lost in 2..size {
        cluster.lose_data(lost);
    }
    cluster.container(1).stop(STOP_GRACE_S);
    let forcing = Instant::now();
    cluster.run_member(0, release);
    cluster.run_member(1, release);
    const FORCED: &str = "forced a new cluster of this member alone";
    let (winner, loser) = loop {
        let forced: Vec<usize> = (0..2)
            .filter(|&i| cluster.container(i).count_in_log(FORCED) > 0)
            .collect();
        let exited: Vec<(usize, i32)> = (0..2)
            .filter_map(|i| match cluster.container(i).state() {
                crate::harness::docker::State::Exited(code) => Some((i, code)),
                _ => None,
            })
            .collect();
        assert!(
            forced.len() < 2,
            "both survivors forced a cluster of their own:\n{}",
            cluster.all_logs()
        );
        if let ([w], [(l, code)]) = (forced.as_slice(), exited.as_slice()) {
            assert_eq!(
                *code,
                2,
                "the other survivor refuses:\n{}",
                cluster.all_logs()
            );
            break (*w, *l);
        }
        assert!(
            exited.len() < 2 && exited.iter().all(|(i, _)| !forced.contains(i)),
            "a survivor exited without the other forcing: {exited:?}\n{}",
            cluster.all_logs()
        );
        assert!(
            forcing.elapsed() < START_DEADLINE,
            "no single force within {START_DEADLINE:?}:\n{}",
            cluster.all_logs()
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    let yielded = cluster.container(loser).logs();
    assert!(yielded.contains("--force-new-cluster refused"), "{yielded}");
    cluster.wait_healthy(winner, START_DEADLINE);
    let took = forcing.elapsed();
    let (membership, _) = cluster.membership(winner);
    assert_eq!(
        membership.members.len(),
        1,
        "a cluster of one: {membership:?}"
    );
    let ip_w = cluster.members[winner].ip.clone();
    assert_eq!(
        count(&cluster, &ip_w, BEFORE).0,
        KEYS,
        "the survivor kept every key"
    );
    put_keys(&cluster, &ip_w, AFTER);

    cluster.extra_options.clear();
    cluster.lose_data(loser);
    for (n, i) in std::iter::once(loser).chain(2..size).enumerate() {
        cluster.run_member(i, release);
        cluster.wait_healthy(i, START_DEADLINE);
        // Each joins as a learner: serving reads once promoted.
        wait_for_voters_through(&cluster, winner, n + 2, START_DEADLINE);
    }
    every_member_holds(&cluster, &[BEFORE, AFTER]);

    cluster.extra_options = force;
    cluster.run_member(winner, release);
    cluster.wait_healthy(winner, START_DEADLINE);
    assert_eq!(
        cluster
            .container(winner)
            .count_in_log("forcing a new cluster of this member"),
        0,
        "forced again:\n{}",
        cluster.container(winner).logs()
    );
    say(&format!(
        "{test}: refused with a quorum; of two survivors restarted with the setting at once, {} forced and served alone {:.1} s after the restart, {} refused ({}); the others rejoined; passed in {:.1} s",
        cluster.members[winner].name,
        took.as_secs_f64(),
        cluster.members[loser].name,
        yielded
            .lines()
            .find(|l| l.contains("--force-new-cluster refused"))
            .and_then(|l| l.split("refused: ").nth(1))
            .map_or("", |l| l.split(':').next().unwrap_or("")),
        started.elapsed().as_secs_f64()
    ));
}
