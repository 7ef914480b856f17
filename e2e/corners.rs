//! Data the fixtures of the other tests lack, each found losing keys on
//! real etcd before it was handled (issue 9): user keys named like the
//! Kubernetes tool's health key, keys written through the v2 API inside
//! etcd3 data (flannel's config), and v2 directories with a TTL.

use std::path::Path;

use crate::harness::etcd::{read_back, EtcdProcess};
use crate::harness::fixture::{self, FixtureSpec};
use crate::harness::migrator::Migration;
use crate::harness::v2::{self, read_back_v2, V2Key, V2Keyspace};
use crate::harness::{block_on, free_port, read_version_txt, temp_dir, Member};

/// Leases and TTLs granted 3,600 s shortly before must show more than this.
const MIN_REMAINING_TTL: i64 = 3000;

/// The v2 keys written into etcd3 data: a flannel-style config, a nested
/// one, and one that expires.
const FLANNEL: &str = "/coreos.com/network/config";
const NESTED: &str = "/legacy/tool/state";
const EXPIRING: &str = "/legacy/lock";

/// Writes v2 keys into the etcd3 data dir of `member` with the 3.3.25 it
/// was written by (3.3 serves the v2 API by default).
fn add_v2_keys(data: &Path, member: &Member, logs: &Path, keys: &[V2Key]) {
    let mut etcd = EtcdProcess::start("3.3.25", member, data, free_port(), logs);
    block_on(async {
        etcd.wait_ready_v2().await;
        let client = v2::http_client();
        for key in keys {
            v2::put(&client, &etcd.endpoint(), &key.path, &key.value, key.ttl)
                .await
                .unwrap_or_else(|err| panic!("write {}: {err}", key.path));
        }
    });
    etcd.stop();
}

fn v2_side_keys() -> Vec<V2Key> {
    vec![
        V2Key::plain(FLANNEL, r#"{"Network":"10.1.0.0/16"}"#),
        V2Key::plain(NESTED, "kept ✓"),
        V2Key::expiring(EXPIRING, "held", 3600),
    ]
}

/// Asserts `v2` holds the v2 keys written into the etcd3 data, the
/// expiring one with most of its hour left.
fn assert_v2_side_kept(v2: &V2Keyspace, when: &str) {
    let leaves = v2.without_health_key();
    assert_eq!(
        leaves.get(FLANNEL).map(|n| n.value.as_str()),
        Some(r#"{"Network":"10.1.0.0/16"}"#),
        "{when}: {FLANNEL} lost: {leaves:?}"
    );
    assert_eq!(
        leaves.get(NESTED).map(|n| n.value.as_str()),
        Some("kept ✓"),
        "{when}: {NESTED} lost"
    );
    let ttl = leaves.get(EXPIRING).and_then(|n| n.ttl);
    assert!(
        ttl.is_some_and(|t| t > MIN_REMAINING_TTL && t <= 3600),
        "{when}: {EXPIRING} should expire in about an hour, has {ttl:?}"
    );
}

#[test]
fn user_keys_named_like_the_old_health_key_survive_a_walk_and_a_rollback() {
    let tmp = temp_dir("health-key-names");
    let data = tmp.path().join("data");
    let member = Member::new("health-key-names");
    let fixture = fixture::build(
        FixtureSpec::small("3.3.25")
            .with_extra_keys(&[("etcd_version", "mine"), ("/etcd_version", "mine too")]),
        &data,
        &member,
        tmp.path(),
    );

    let up = Migration::new("3.5.16", &data, &member)
        .bundled("3.3.25,3.4.23,3.5.16")
        .run();
    up.assert_code(0);
    read_back("3.5.16", &member, &data, tmp.path())
        .assert_kept(&fixture.keyspace, MIN_REMAINING_TTL);

    let down = Migration::new("3.3.25", &data, &member)
        .bundled("3.3.25,3.4.23,3.5.16")
        .run();
    down.assert_code(0);
    assert_eq!(down.step_kinds(), ["minor-rollback", "minor-rollback"]);
    read_back("3.3.25", &member, &data, tmp.path())
        .assert_kept(&fixture.keyspace, MIN_REMAINING_TTL);
}

#[test]
fn v2_keys_inside_etcd3_data_survive_a_walk_and_the_rollbacks() {
    let tmp = temp_dir("v2-in-etcd3");
    let data = tmp.path().join("data");
    let member = Member::new("v2-in-etcd3");
    let fixture = fixture::build(
        FixtureSpec::small("3.3.25").text_only(),
        &data,
        &member,
        tmp.path(),
    );
    add_v2_keys(&data, &member, tmp.path(), &v2_side_keys());

    let up = Migration::new("3.5.16", &data, &member)
        .bundled("3.3.25,3.4.23,3.5.16")
        .run();
    up.assert_code(0);
    assert!(
        up.lines_with("step done")
            .iter()
            .all(|line| line.contains("v2 store: v2 3 keys")),
        "every step fingerprints the v2 store too:\n{}",
        up.explain()
    );
    assert_v2_side_kept(
        &read_back_v2("3.5.16", &member, &data, tmp.path()),
        "after 3.3 -> 3.5",
    );
    read_back("3.5.16", &member, &data, tmp.path())
        .assert_kept(&fixture.keyspace, MIN_REMAINING_TTL);

    // Snapshot and restore carry no v2 store: the step carries it.
    let down = Migration::new("3.3.25", &data, &member)
        .bundled("3.3.25,3.4.23,3.5.16")
        .run();
    down.assert_code(0);
    assert_eq!(
        down.lines_with("v2 store carried").len(),
        2,
        "{}",
        down.explain()
    );
    assert_v2_side_kept(
        &read_back_v2("3.3.25", &member, &data, tmp.path()),
        "after 3.5 -> 3.3",
    );
    read_back("3.3.25", &member, &data, tmp.path())
        .assert_kept(&fixture.keyspace, MIN_REMAINING_TTL);

    // etcd3 -> etcd2: the v3 keys and the v2 keys make the new v2 store.
    let to_etcd2 = Migration::new("3.3.25", &data, &member)
        .bundled("3.3.25,3.4.23,3.5.16")
        .arg("--target-storage")
        .arg("etcd2")
        .run();
    to_etcd2.assert_code(0);
    assert_eq!(read_version_txt(&data), "3.3.25/etcd2");
    let v2 = read_back_v2("3.3.25", &member, &data, tmp.path());
    assert_v2_side_kept(&v2, "after etcd3 -> etcd2");
    let leaves = v2.without_health_key();
    assert_eq!(
        leaves.len(),
        fixture.keyspace.entries.len() + 3,
        "every v3 key and every v2 key: {:?}",
        leaves.keys().take(10).collect::<Vec<_>>()
    );
}

#[test]
fn a_v2_key_on_the_path_of_a_v3_key_refuses_the_rollback_to_etcd2_and_names_both() {
    let tmp = temp_dir("v2-clash");
    let data = tmp.path().join("data");
    let member = Member::new("v2-clash");
    fixture::build(
        FixtureSpec::small("3.3.25")
            .text_only()
            .with_extra_keys(&[("/flannel/config", "from v3")]),
        &data,
        &member,
        tmp.path(),
    );
    add_v2_keys(
        &data,
        &member,
        tmp.path(),
        &[V2Key::plain("/flannel/config", "from v2")],
    );
    let run = Migration::new("3.3.25", &data, &member)
        .bundled("3.3.25,3.4.23,3.5.16")
        .arg("--target-storage")
        .arg("etcd2")
        .run();
    run.assert_code(3);
    run.assert_stderr_has("the v2 key /flannel/config and the v3 key \"/flannel/config\"");
    assert_eq!(read_version_txt(&data), "3.3.25/etcd3", "nothing recorded");
    // The data still serves both keys as they were.
    let v2 = read_back_v2("3.3.25", &member, &data, tmp.path());
    assert_eq!(
        v2.without_health_key()
            .get("/flannel/config")
            .map(|n| n.value.as_str()),
        Some("from v2")
    );
}

#[test]
fn keys_in_a_v2_directory_with_a_ttl_expire_with_it_after_the_storage_migration() {
    let tmp = temp_dir("v2-dir-ttl");
    let data = tmp.path().join("data");
    let member = Member::new("v2-dir-ttl");
    v2::build(
        "3.3.25",
        &data,
        &member,
        tmp.path(),
        &[vec![V2Key::plain("/registry/pods/a", "stays")]],
    );
    // A directory with an hour to live, holding two plain keys.
    let mut etcd = EtcdProcess::start("3.3.25", &member, &data, free_port(), tmp.path());
    block_on(async {
        etcd.wait_ready_v2().await;
        let client = v2::http_client();
        let url = format!(
            "{}?dir=true&ttl=3600",
            v2::key_url(&etcd.endpoint(), "/registry/leases")
        );
        let response = client
            .put(&url)
            .send()
            .await
            .unwrap_or_else(|err| panic!("create the TTL dir: {err}"));
        assert!(response.status().is_success(), "{:?}", response.status());
        for key in ["/registry/leases/a", "/registry/leases/b"] {
            v2::put(&client, &etcd.endpoint(), key, "leased", None)
                .await
                .unwrap_or_else(|err| panic!("write {key}: {err}"));
        }
    });
    etcd.stop();

    let run = Migration::new("3.3.25", &data, &member)
        .bundled("3.3.25")
        .arg("--target-storage")
        .arg("etcd3")
        .run();
    run.assert_code(0);
    assert_eq!(run.step_kinds(), ["storage-migration"], "{}", run.explain());
    let v3 = read_back("3.3.25", &member, &data, tmp.path());
    v3.assert_no_health_key();
    assert_eq!(
        v3.entries
            .get(b"/registry/pods/a".as_slice())
            .map(|e| e.lease),
        Some(0),
        "a key outside the dir stays permanent"
    );
    for key in ["/registry/leases/a", "/registry/leases/b"] {
        let lease = v3
            .entries
            .get(key.as_bytes())
            .map(|e| e.lease)
            .unwrap_or_else(|| panic!("{key} lost"));
        assert_ne!(lease, 0, "{key} lost its directory's expiry");
        let remaining = v3.leases.get(&lease).map(|l| l.remaining_ttl);
        assert!(
            remaining.is_some_and(|t| t > MIN_REMAINING_TTL && t <= 3600),
            "{key}: lease {lease:x} has {remaining:?} s left, want the directory's hour"
        );
    }
}

/// Turns auth on in the data of `member` with etcdctl 3.3.25: a root user
/// with a password, then `auth enable`.
fn enable_auth(data: &Path, member: &Member, logs: &Path) {
    let mut etcd = EtcdProcess::start("3.3.25", member, data, free_port(), logs);
    block_on(etcd.wait_ready());
    let etcdctl = crate::harness::binary("etcdctl-3.3.25");
    for args in [
        &["user", "add", "root:secret"][..],
        &["--user", "root:secret", "auth", "enable"][..],
    ] {
        let out = std::process::Command::new(&etcdctl)
            .env_clear()
            .env("ETCDCTL_API", "3")
            .arg("--endpoints")
            .arg(etcd.endpoint())
            .args(args)
            .output()
            .unwrap_or_else(|err| panic!("run {}: {err}", etcdctl.display()));
        assert!(
            out.status.success(),
            "etcdctl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    etcd.stop();
}

#[test]
fn auth_enabled_data_is_refused_at_once_with_the_remedy() {
    let tmp = temp_dir("auth");
    let data = tmp.path().join("data");
    let member = Member::new("auth");
    fixture::build(FixtureSpec::small("3.3.25"), &data, &member, tmp.path());
    enable_auth(&data, &member, tmp.path());
    let run = Migration::new("3.5.16", &data, &member)
        .bundled("3.3.25,3.4.23,3.5.16")
        .arg("--health-timeout")
        .arg("600")
        .run();
    assert_ne!(run.code(), Some(0), "{}", run.explain());
    run.assert_stderr_has("authentication enabled")
        .assert_stderr_has("auth disable");
    assert_eq!(read_version_txt(&data), "3.3.25/etcd3", "nothing recorded");
    assert!(
        run.lines_with("etcd started").len() <= 1,
        "no step ran after the refusal:\n{}",
        run.explain()
    );
}
