//! Today's releases, single member, on real etcd 3.5.30, 3.6.10, 3.6.14
//! and 3.7.1 (issue 18; 3.6 and 3.7 from `$ETCD_EXTRA_BIN_DIR`, NOT RUN
//! without them): upstream's patch floors refused naming what to bundle,
//! a flag 3.7 removed refused naming its replacement, and 3.7 never the
//! first etcd on a WAL it cannot replay (3.5's v2 requests past the newest
//! snapshot: a 3.6 member that never snapshotted since), and v2 content
//! refused offline as 3.6.14 itself refuses it; and the Kubernetes
//! tool's v3 health key in 3.1.20/etcd2 data (issue 20.1); and a restore
//! from a snapshot on 3.6 and on 3.7 (issue 29: `etcdutl`'s
//! `--bump-revision` and `--mark-compacted`). The walks themselves are
//! `old_releases`' cases.

use std::path::Path;

use libtest_mimic::Trial;

use crate::harness::etcd::EtcdProcess;
use crate::harness::fixture::{self, FixtureSpec};
use crate::harness::keyspace::read_back;
use crate::harness::migrator::{Migration, Mode};
use crate::harness::snapshot::{backups, restoring, sha256, snapshot_of, AFTER};
use crate::harness::tree::fingerprint;
use crate::harness::v2::{self, V2Key};
use crate::harness::{
    block_on, copy_dir, etcd_binary, free_port, linked_bin_dir, read_version_txt, release_trial,
    temp_dir, write_version_txt, Member,
};

/// A test: its name, its body, the releases it needs.
type Test = (&'static str, fn(), &'static [&'static str]);

/// This module's tests with the releases each needs: one that lacks any
/// is listed as ignored after saying NOT RUN and why.
pub fn trials() -> Vec<Trial> {
    macro_rules! tests {
        ($($test:ident needs $needs:expr),* $(,)?) => {
            vec![$((concat!("present::", stringify!($test)), $test as fn(), &$needs[..])),*]
        };
    }
    let tests: Vec<Test> = tests![
        release_3_7_never_starts_first_on_a_wal_holding_3_5_requests
            needs ["3.5.30", "3.6.10", "3.6.14", "3.7.1"],
        upstreams_patch_floors_are_refused_naming_what_to_bundle needs ["3.6.10", "3.6.14", "3.7.1"],
        a_flag_3_7_removed_is_refused_up_front_naming_its_replacement needs ["3.6.14", "3.7.1"],
        v2_content_is_refused_offline_as_3_6_itself_refuses_it needs ["3.5.30", "3.6.14"],
        kubernetes_tools_health_key_on_3_1_etcd2_data_migrates_with_it needs ["3.1.20", "3.2.32"],
        a_3_6_member_is_restored_from_a_snapshot_past_its_revision needs ["3.5.30", "3.6.14"],
        a_3_7_member_is_restored_from_a_snapshot_past_its_revision
            needs ["3.5.30", "3.6.14", "3.7.1"],
    ];
    tests
        .into_iter()
        .map(|(name, test, needs)| release_trial("present", name, test, needs))
        .collect()
}

/// 3.5.30 data (a small keyspace with leases), then served once by 3.6.14
/// as a user's etcd would (default flags: no snapshot for 10,000 entries),
/// so its WAL still holds 3.5's v2 requests past its newest snapshot.
fn data_3_6_with_3_5_entries(data: &Path, member: &Member, logs: &Path) -> fixture::Fixture {
    let fixture = fixture::build(FixtureSpec::small("3.5.30"), data, member, logs);
    let mut etcd = EtcdProcess::start("3.6.14", member, data, free_port(), logs);
    block_on(etcd.wait_ready());
    etcd.stop();
    write_version_txt(data, "3.6.14/etcd3");
    let on_disk = etcd_migrate::ondisk::read(data).expect("read offline");
    assert!(
        on_disk.v2_requests_past_snapshot.is_some(),
        "the 3.6 member's WAL should still hold 3.5's v2 requests: {on_disk:?}"
    );
    fixture
}

fn release_3_7_never_starts_first_on_a_wal_holding_3_5_requests() {
    let tmp = temp_dir("present-replay");
    let data = tmp.path().join("data");
    let member = Member::new("present-replay");
    let fixture = data_3_6_with_3_5_entries(&data, &member, tmp.path());

    // The recorded 3.6.14 is not bundled, and no newer 3.6 patch is: 3.7.1
    // would be the first etcd on the data. Refused, nothing touched.
    let without = tmp.path().join("without");
    std::fs::create_dir(&without).expect("mkdir");
    let bin = linked_bin_dir(&["3.6.10", "3.7.1"], &without);
    let before = fingerprint(&data);
    Migration::new("3.7.1", &data, &member)
        .bin_dir(&bin)
        .run()
        .assert_refused_untouched(
            &data,
            &before,
            &[
                "etcd 3.7.1 cannot replay",
                "raft index",
                "bundle etcd 3.6.14",
            ],
        );

    // With 3.6.14 bundled it reads the baseline (a snapshot after every
    // entry), and 3.7.1 starts on a WAL it can replay.
    let with = tmp.path().join("with");
    std::fs::create_dir(&with).expect("mkdir");
    let bin = linked_bin_dir(&["3.6.14", "3.7.1"], &with);
    let run = Migration::new("3.7.1", &data, &member).bin_dir(&bin).run();
    run.assert_code(0);
    assert_eq!(run.step_kinds(), ["minor-upgrade"], "{}", run.explain());
    assert_eq!(read_version_txt(&data), "3.7.1/etcd3");
    let after = read_back("3.7.1", &member, &data, tmp.path());
    after.assert_kept(&fixture.keyspace, 3000);
    after.assert_revisions_kept(&fixture.keyspace);
}

fn upstreams_patch_floors_are_refused_naming_what_to_bundle() {
    for (from, target, bundle, expected) in [
        (
            "3.5.16",
            "3.6.14",
            ["3.5.16", "3.6.14"],
            "the path reaches 3.6 from 3.5.16, but upstream requires 3.5.26 or later",
        ),
        (
            "3.6.10",
            "3.7.1",
            ["3.6.10", "3.7.1"],
            "the path reaches 3.7 from 3.6.10, but upstream requires 3.6.11 or later",
        ),
    ] {
        let tmp = temp_dir("present-floor");
        let data = tmp.path().join("data");
        let member = Member::new("present-floor");
        fixture::build(FixtureSpec::small(from), &data, &member, tmp.path());
        let bin = linked_bin_dir(&bundle, tmp.path());
        let before = fingerprint(&data);
        Migration::new(target, &data, &member)
            .bin_dir(&bin)
            .run()
            .assert_refused_untouched(&data, &before, &[expected, "bundle etcd"]);
    }
}

fn a_flag_3_7_removed_is_refused_up_front_naming_its_replacement() {
    let tmp = temp_dir("present-flag");
    let data = tmp.path().join("data");
    let member = Member::new("present-flag");
    fixture::build(FixtureSpec::small("3.6.14"), &data, &member, tmp.path());
    let bin = linked_bin_dir(&["3.6.14", "3.7.1"], tmp.path());
    let mut args = member.exec_args(&format!("http://127.0.0.1:{}", free_port()));
    args.push("--experimental-initial-corrupt-check=true".to_string());
    let before = fingerprint(&data);
    Migration::new("3.7.1", &data, &member)
        .bin_dir(&bin)
        .mode(Mode::Exec(args))
        .run()
        .assert_refused_untouched(
            &data,
            &before,
            &[
                "flag provided but not defined: -experimental-initial-corrupt-check",
                "use --feature-gates=InitialCorruptCheck=true instead",
            ],
        );
}

/// How long etcd 3.6 may take to refuse data at its start.
const REFUSAL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// Starts `etcd-3.6.14` on `data` as `member` and waits for it to exit;
/// returns its output. Panics if it is still running after
/// [`REFUSAL_TIMEOUT`] (it then serves the data: the check would be wrong).
fn refusal_of_3_6(data: &Path, member: &Member, logs: &Path) -> String {
    let log = logs.join("etcd-3.6.14-refusal.log");
    let out = std::fs::File::create(&log).expect("log file");
    let client = format!("http://127.0.0.1:{}", free_port());
    let mut child = std::process::Command::new(etcd_binary("3.6.14"))
        .args(["--name", &member.name, "--data-dir"])
        .arg(data)
        .args([
            "--listen-client-urls",
            &client,
            "--advertise-client-urls",
            &client,
        ])
        .args(["--listen-peer-urls", &member.peer_url()])
        .args(["--initial-advertise-peer-urls", &member.peer_url()])
        .args(["--initial-cluster", &member.initial_cluster()])
        .stdout(out.try_clone().expect("log file"))
        .stderr(out)
        .spawn()
        .expect("start etcd 3.6.14");
    let started = std::time::Instant::now();
    loop {
        if let Some(status) = child.try_wait().expect("wait") {
            assert!(!status.success(), "etcd 3.6.14 exited 0 on v2 content");
            return std::fs::read_to_string(&log).unwrap_or_default();
        }
        if started.elapsed() > REFUSAL_TIMEOUT {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "etcd 3.6.14 serves data with v2 content:\n{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// 3.5.30 data whose v2 store holds flannel's config: etcd-migrate refuses
/// it offline before 3.6 (exit 2, untouched), and 3.6.14 itself refuses a
/// copy of it at start (its own words). Removed through the v2 API, the
/// same data walks to 3.6.14 with every key, revision and lease.
fn v2_content_is_refused_offline_as_3_6_itself_refuses_it() {
    let tmp = temp_dir("present-v2-content");
    let data = tmp.path().join("data");
    let member = Member::new("present-v2-content");
    let fixture = fixture::build(FixtureSpec::small("3.5.30"), &data, &member, tmp.path());
    v2::write_keys(
        "3.5.30",
        &member,
        &data,
        tmp.path(),
        &[V2Key::plain(
            "/coreos.com/network/config",
            r#"{"Network":"10.1.0.0/16"}"#,
        )],
    );
    let bin = linked_bin_dir(&["3.5.30", "3.6.14"], tmp.path());
    let before = fingerprint(&data);
    Migration::new("3.6.14", &data, &member)
        .bin_dir(&bin)
        .run()
        .assert_refused_untouched(
            &data,
            &before,
            &[
                "holds content (/coreos.com;",
                "etcd 3.6.14, a step of this plan",
            ],
        );

    // etcd 3.6.14 agrees, on a copy that a baseline-like start of 3.5.30
    // (a snapshot after every entry) has left with the content in its
    // newest snapshot, as the step before 3.6 would.
    let copy = tmp.path().join("copy");
    copy_dir(&data, &copy);
    let mut etcd = EtcdProcess::start_with(
        "3.5.30",
        &member,
        &copy,
        free_port(),
        tmp.path(),
        &["--snapshot-count=1", "--enable-v2=true"],
    );
    block_on(async {
        etcd.wait_ready().await;
        let mut client = crate::harness::etcd::connect(&etcd.endpoint())
            .await
            .expect("connect");
        client.put("snapshot-me", "1", None).await.expect("put");
    });
    etcd.stop();
    let said = refusal_of_3_6(&copy, &member, tmp.path());
    assert!(
        said.contains("custom content"),
        "etcd 3.6.14 refuses for another reason:\n{said}"
    );

    v2::remove_dirs("3.5.30", &member, &data, tmp.path(), &["/coreos.com"]);
    let run = Migration::new("3.6.14", &data, &member).bin_dir(&bin).run();
    run.assert_code(0);
    assert_eq!(read_version_txt(&data), "3.6.14/etcd3");
    let after = read_back("3.6.14", &member, &data, tmp.path());
    after.assert_kept(&fixture.keyspace, 3000);
    after.assert_revisions_kept(&fixture.keyspace);
}

/// Issue 20.1 as reproduced on old releases: 3.1.20/etcd2 data holding
/// the Kubernetes tool's v3 health key `etcd_version` (its last write at
/// the revision `etcdctl migrate` gives one of the v2 keys) walks to
/// 3.2.32/etcd3 with every v2 key and the v3 key at its last value; it once
/// failed the storage migration ("11 keys expected, 12 found") and put the
/// data on hold. Also the old releases' own test: not one of today's, but
/// it needs releases no registry has.
fn kubernetes_tools_health_key_on_3_1_etcd2_data_migrates_with_it() {
    let tmp = temp_dir("present-k8s-health-3-1");
    let data = tmp.path().join("data");
    let member = Member::new("present-k8s-health-3-1");
    fixture::etcd2_data_with_the_health_key("3.1.20", &data, &member, tmp.path());
    assert_eq!(read_version_txt(&data), "3.1.20/etcd2");
    let bin = linked_bin_dir(&["3.1.20", "3.2.32"], tmp.path());
    let run = Migration::new("3.2.32", &data, &member).bin_dir(&bin).run();
    run.assert_code(0);
    assert_eq!(read_version_txt(&data), "3.2.32/etcd3");
    assert!(!data.join(".etcd-migrate.hold").exists(), "no hold");
    let keyspace = read_back("3.2.32", &member, &data, tmp.path());
    let value = |key: &str| {
        keyspace
            .entries
            .get(key.as_bytes())
            .map(|e| String::from_utf8_lossy(&e.value).into_owned())
    };
    assert_eq!(value("etcd_version").as_deref(), Some("3.1.20 #12"));
    for i in 1..=10 {
        assert_eq!(
            value(&format!("/registry/pods/default/p{i}")),
            Some(format!("pod {i}"))
        );
    }
    assert_eq!(keyspace.entries.len(), 11, "{:?}", keyspace.entries.keys());
}

/// 3.5.30 data walked to `release` (3.6.14, or 3.7.1 through it), a
/// snapshot taken there, one more key written, then the member restored
/// from the snapshot: the restore runs `release`'s own `etcdutl` with the
/// revision bumped and the old revisions marked compacted, the member
/// serves every key of the snapshot and none after it, at a revision past
/// the snapshot's (a watcher sees a compaction, never revisions going
/// back), once, with the data as it was backed up.
fn restored_past_its_revision(release: &str, walk: &[&str]) {
    let tmp = temp_dir(&format!("restore-{release}"));
    let data = tmp.path().join("data");
    let member = Member::new("restore-present");
    fixture::build(FixtureSpec::small("3.5.30"), &data, &member, tmp.path());
    let bin = linked_bin_dir(walk, tmp.path());
    let walked = Migration::new(release, &data, &member).bin_dir(&bin).run();
    walked.assert_code(0);
    assert_eq!(read_version_txt(&data), format!("{release}/etcd3"));
    let file = tmp.path().join("snapshot.db");
    let held = snapshot_of(release, &data, &member, tmp.path(), &file);
    let sha = sha256(&file);
    let run = restoring(release, &data, &member, &file, &sha)
        .bin_dir(&bin)
        .run();
    run.assert_code(0);
    let tool = run.lines_with("restoring the data dir from a snapshot");
    assert!(
        tool.len() == 1 && tool[0].contains(&format!("etcdutl-{release}")),
        "restored once, by {release}'s etcdutl:\n{}",
        run.explain()
    );
    assert_eq!(read_version_txt(&data), format!("{release}/etcd3"));
    assert_eq!(backups(&data).len(), 1, "the data as it was is backed up");
    let restored = read_back(release, &member, &data, tmp.path());
    assert!(
        !restored.entries.contains_key(AFTER.as_bytes()),
        "a key written after the snapshot is not in the restored member"
    );
    restored.assert_kept(&held, 3000);
    assert!(
        restored.revision >= held.revision + 1_000_000_000,
        "the revision is bumped past the snapshot's ({}): {}",
        held.revision,
        restored.revision
    );
    let again = restoring(release, &data, &member, &file, &sha)
        .bin_dir(&bin)
        .run();
    again.assert_code(0);
    assert!(
        again.lines_with("restoring the data dir").is_empty(),
        "restored twice:\n{}",
        again.explain()
    );
}

fn a_3_6_member_is_restored_from_a_snapshot_past_its_revision() {
    restored_past_its_revision("3.6.14", &["3.5.30", "3.6.14"]);
}

fn a_3_7_member_is_restored_from_a_snapshot_past_its_revision() {
    restored_past_its_revision("3.7.1", &["3.5.30", "3.6.14", "3.7.1"]);
}
