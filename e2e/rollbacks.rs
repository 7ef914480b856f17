//! Rollbacks on real etcd: 3.5 → 3.3 by snapshot and restore, one minor at
//! a time, keeping keys, revisions and leases; 3.3 etcd3 → etcd2 by a copy
//! through the v2 API, keeping values and turning leases into TTLs; and the
//! refusal of a value the v2 store cannot hold.

use crate::harness::fixture::{self, FixtureSpec, LEASE_TTL_SECS};
use crate::harness::keyspace::is_health_key;
use crate::harness::keyspace::read_back;
use crate::harness::migrator::Migration;
use crate::harness::tree::fingerprint;
use crate::harness::v2::{assert_v2_copy, read_back_v2};
use crate::harness::{dir_names, mode, read_version_txt, temp_dir, Member, WORK_DIR};

/// Leases granted 3,600 s shortly before must show more than this left.
const MIN_REMAINING_TTL: i64 = 3000;

#[test]
fn rollback_3_5_to_3_3_in_one_run_keeps_keys_revisions_and_leases() {
    let tmp = temp_dir("rollback");
    let data = tmp.path().join("data");
    let member = Member::new("rollback");
    let fixture = fixture::build(
        FixtureSpec::full("3.5.16").with_rewrites(20),
        &data,
        &member,
        tmp.path(),
    );

    let run = Migration::new("3.3.25", &data, &member)
        .bundled("3.3.25,3.4.23,3.5.16")
        .run();
    run.assert_code(0);
    assert_eq!(
        run.step_kinds(),
        ["minor-rollback", "minor-rollback"],
        "{}",
        run.explain()
    );
    let starts = run.lines_with("step start");
    assert!(
        starts[0].contains("to=3.4.23/etcd3") && starts[1].contains("to=3.3.25/etcd3"),
        "one minor at a time: {starts:#?}"
    );
    // Each step: the newer release saves, the older one restores and
    // serves the restored copy.
    let tools: Vec<&str> = run.lines_with("tool finished");
    for (tool, args) in [
        ("etcdctl-3.5.16", "snapshot save"),
        ("etcdctl-3.4.23", "snapshot restore"),
        ("etcdctl-3.4.23", "snapshot save"),
        ("etcdctl-3.3.25", "snapshot restore"),
    ] {
        assert!(
            tools
                .iter()
                .any(|line| line.contains(&format!("tool={tool} ")) && line.contains(args)),
            "no {tool} {args}\n{}",
            run.explain()
        );
    }
    assert_eq!(read_version_txt(&data), "3.3.25/etcd3");
    assert_eq!(mode(&data), 0o700, "the data dir keeps its mode");
    assert!(!data.join(WORK_DIR).exists());

    let after = read_back("3.3.25", &member, &data, tmp.path());
    after.assert_kept(&fixture.keyspace, MIN_REMAINING_TTL);
    after.assert_revisions_kept(&fixture.keyspace);
    assert_eq!(after.rewritten_keys(), fixture.keyspace.rewritten_keys());
    assert!(
        after.revision >= fixture.keyspace.revision,
        "the store revision went back from {} to {}",
        fixture.keyspace.revision,
        after.revision
    );
}

#[test]
fn rollback_3_3_etcd3_to_etcd2_keeps_keys_and_ttls() {
    let tmp = temp_dir("to-etcd2");
    let data = tmp.path().join("data");
    let member = Member::new("to-etcd2");
    let fixture = fixture::build(
        FixtureSpec::full("3.3.25")
            .text_only()
            .with_extra_keys(&[("compact_rev_key", "42")]),
        &data,
        &member,
        tmp.path(),
    );

    let run = Migration::new("3.3.25", &data, &member)
        .bundled("3.3.25,3.4.23,3.5.16")
        .arg("--target-storage")
        .arg("etcd2")
        .run();
    run.assert_code(0);
    assert_eq!(run.step_kinds(), ["rollback-to-etcd2"], "{}", run.explain());
    assert_eq!(read_version_txt(&data), "3.3.25/etcd2");
    assert_eq!(mode(&data), 0o700);
    assert!(!data.join(WORK_DIR).exists());

    let v2 = read_back_v2("3.3.25", &member, &data, tmp.path());
    assert_v2_copy(&v2, &fixture.keyspace, LEASE_TTL_SECS);
    assert!(
        !v2.leaves.keys().any(|path| is_health_key(path.as_bytes())),
        "the rebuilt store holds a health key: {:?}",
        v2.leaves.keys().collect::<Vec<_>>()
    );
}

#[test]
fn rollback_to_etcd2_refuses_a_binary_value_and_keeps_the_data() {
    let tmp = temp_dir("binary");
    let data = tmp.path().join("data");
    let member = Member::new("binary");
    // The standard fixture holds protobuf-like values: not UTF-8.
    let fixture = fixture::build(FixtureSpec::small("3.3.25"), &data, &member, tmp.path());
    // Found in bolt's keys offline (issue 20): refused before anything
    // runs, the data byte for byte as it was, no backup taken.
    let before = fingerprint(&data);
    Migration::new("3.3.25", &data, &member)
        .bundled("3.3.25")
        .arg("--target-storage")
        .arg("etcd2")
        .run()
        .assert_refused_untouched(&data, &before, &["--storage-media-type", "not UTF-8"]);
    assert_eq!(read_version_txt(&data), "3.3.25/etcd3");
    let backups = tmp.path().join("data.backup");
    assert!(
        !backups.exists() || dir_names(&backups).is_empty(),
        "no backup for a run refused up front"
    );
    let after = read_back("3.3.25", &member, &data, tmp.path());
    after.assert_kept(&fixture.keyspace, MIN_REMAINING_TTL);
    after.assert_revisions_kept(&fixture.keyspace);
}
