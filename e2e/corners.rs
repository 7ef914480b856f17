//! Data the fixtures of the other tests lack, each found losing keys on
//! real etcd before it was handled (issue 9): user keys named like the
//! Kubernetes tool's health key, keys written through the v2 API inside
//! etcd3 data (flannel's config), and v2 directories with a TTL.

use std::path::Path;

use crate::harness::etcd::EtcdProcess;
use crate::harness::fixture::{self, FixtureSpec};
use crate::harness::keyspace::read_back;
use crate::harness::migrator::Migration;
use crate::harness::tree::fingerprint;
use crate::harness::v2::{self, read_back_v2, V2Key, V2Keyspace};
use crate::harness::{block_on, free_port, read_version_txt, temp_dir, write_version_txt, Member};

/// Leases and TTLs granted 3,600 s shortly before must show more than this.
const MIN_REMAINING_TTL: i64 = 3000;

/// The v2 keys written into etcd3 data: a flannel-style config, a nested
/// one, and one that expires.
const FLANNEL: &str = "/coreos.com/network/config";
const NESTED: &str = "/legacy/tool/state";
const EXPIRING: &str = "/legacy/lock";

/// Writes v2 keys into the data dir of `member` (etcd3 data's v2 store,
/// or etcd2 data) with 3.3.25, which serves the v2 API by default.
fn add_v2_keys(data: &Path, member: &Member, logs: &Path, keys: &[V2Key]) {
    v2::write_keys("3.3.25", member, data, logs, keys);
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
    // Found offline, before any etcd runs.
    let before = fingerprint(&data);
    Migration::new("3.3.25", &data, &member)
        .bundled("3.3.25,3.4.23,3.5.16")
        .arg("--target-storage")
        .arg("etcd2")
        .run()
        .assert_refused_untouched(
            &data,
            &before,
            &["the v2 key /flannel/config and the v3 key \"/flannel/config\""],
        );
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
fn auth_enabled_data_is_refused_up_front_with_the_remedy() {
    let tmp = temp_dir("auth");
    let data = tmp.path().join("data");
    let member = Member::new("auth");
    fixture::build(FixtureSpec::small("3.3.25"), &data, &member, tmp.path());
    enable_auth(&data, &member, tmp.path());
    let migration = Migration::new("3.5.16", &data, &member).bundled("3.3.25,3.4.23,3.5.16");
    let before = fingerprint(&data);
    migration.run().assert_refused_untouched(
        &data,
        &before,
        &["has v3 authentication enabled", "auth disable"],
    );
}

#[test]
fn a_version_txt_the_data_contradicts_is_refused_untouched() {
    let tmp = temp_dir("mislabelled");
    let bundle = "3.3.25,3.4.23,3.5.1,3.5.16";
    // 3.3 data labelled 3.4.23: the walk would skip 3.4.
    let old = tmp.path().join("old");
    let member = Member::new("mislabelled-old");
    fixture::build(FixtureSpec::small("3.3.25"), &old, &member, tmp.path());
    for (label, target) in [("3.4.23/etcd3", "3.5.16"), ("3.5.1/etcd3", "3.5.16")] {
        write_version_txt(&old, label);
        let before = fingerprint(&old);
        Migration::new(target, &old, &member)
            .bundled(bundle)
            .run()
            .assert_refused_untouched(
                &old,
                &before,
                &[
                    &format!("says {label}, but the data itself records cluster version 3.3.0"),
                    "printf 3.3.<patch>/etcd3",
                ],
            );
    }
    // 3.5 data labelled 3.3.25: no 3.3 or 3.4 can serve it.
    let new = tmp.path().join("new");
    let member = Member::new("mislabelled-new");
    fixture::build(FixtureSpec::small("3.5.16"), &new, &member, tmp.path());
    write_version_txt(&new, "3.3.25/etcd3");
    let before = fingerprint(&new);
    Migration::new("3.4.23", &new, &member)
        .bundled(bundle)
        .run()
        .assert_refused_untouched(&new, &before, &["records cluster version 3.5.0"]);
}

/// Data whose own membership lists another member: the cluster mode (a
/// rolling upgrade as a member, shown by --dry-run), which --no-exec cannot
/// carry (refused, naming the members); a rollback without an online
/// way and a storage change are the whole cluster's pause job (issue 28,
/// shown by --dry-run), in which --no-exec cannot take part either
/// (refused, naming the members and the way), also where keys etcd2
/// cannot hold would hold the job before its go. The data is untouched
/// each time.
#[test]
fn data_whose_membership_lists_other_members_rolls_as_a_member_or_is_refused_untouched() {
    let tmp = temp_dir("data-members");
    let data = tmp.path().join("data");
    let member = Member::new("data-members");
    fixture::build(FixtureSpec::small("3.4.23"), &data, &member, tmp.path());
    // A second member in the data's own membership (as on a member of a
    // 3-member cluster), while INITIAL_CLUSTER lists only this one.
    let mut etcd = EtcdProcess::start("3.4.23", &member, &data, free_port(), tmp.path());
    block_on(etcd.wait_ready());
    let etcdctl = crate::harness::binary("etcdctl-3.4.23");
    let out = std::process::Command::new(&etcdctl)
        .env_clear()
        .env("ETCDCTL_API", "3")
        .arg("--endpoints")
        .arg(etcd.endpoint())
        .args([
            "member",
            "add",
            "peer-b",
            "--peer-urls=http://127.0.0.2:2380",
        ])
        .output()
        .unwrap_or_else(|err| panic!("run {}: {err}", etcdctl.display()));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    etcd.stop();
    let before = fingerprint(&data);
    let upgrade = Migration::new("3.5.16", &data, &member).bundled("3.3.25,3.4.23,3.5.16");
    let dry = upgrade
        .clone()
        .mode(crate::harness::migrator::Mode::DryRun)
        .run();
    dry.assert_code(0);
    assert!(
        dry.stdout
            .contains("membership lists 2 members: a rolling upgrade")
            && dry.stdout.contains("restart 1/1: into 3.5.16"),
        "{}",
        dry.explain()
    );
    upgrade.run().assert_refused_untouched(
        &data,
        &before,
        &[
            "belongs to a cluster of 2 members",
            "http://127.0.0.2:2380",
            "--no-exec",
        ],
    );
    let rollback = Migration::new("3.3.25", &data, &member).bundled("3.3.25,3.4.23,3.5.16");
    let dry = rollback
        .clone()
        .mode(crate::harness::migrator::Mode::DryRun)
        .run();
    dry.assert_code(0);
    assert!(
        dry.stdout.contains("a whole-cluster pause job")
            && dry.stdout.contains("ALLOW_CLUSTER_PAUSE=1"),
        "{}",
        dry.explain()
    );
    rollback.run().assert_refused_untouched(
        &data,
        &before,
        &[
            "belongs to a cluster of 2 members",
            "http://127.0.0.2:2380",
            "--no-exec",
        ],
    );
    Migration::new("3.4.23", &data, &member)
        .bundled("3.3.25,3.4.23,3.5.16")
        .arg("--target-storage=etcd2")
        .run()
        .assert_refused_untouched(
            &data,
            &before,
            &[
                // A member's start no longer refuses what etcd2 cannot
                // hold (in a rollout that took the members down one by
                // one): the job holds before its go, naming the key
                // (cluster-tests `pause-etcd2-misfit`). Here --no-exec,
                // which takes no part in a job, is what is refused.
                "belongs to a cluster of 2 members",
                "3.4.23/etcd3 -> 3.4.23/etcd2 takes the whole cluster's pause job",
                "--no-exec",
            ],
        );
}

#[test]
fn a_configured_name_unlike_the_datas_is_reported_and_the_data_keeps_its_own() {
    let tmp = temp_dir("renamed");
    let data = tmp.path().join("data");
    let member = Member::new("renamed");
    let fixture = fixture::build(FixtureSpec::small("3.5.16"), &data, &member, tmp.path());
    let renamed = Migration {
        name: "someone-else".to_string(),
        ..Migration::new("3.4.23", &data, &member).bundled("3.3.25,3.4.23,3.5.16")
    };
    let dry = renamed
        .clone()
        .mode(crate::harness::migrator::Mode::DryRun)
        .run();
    dry.assert_code(0);
    assert!(
        dry.stdout.contains(&format!(
            "member: {} (as the data records it; the configuration says someone-else)",
            member.name
        )),
        "{}",
        dry.explain()
    );
    let run = renamed.run();
    run.assert_code(0);
    assert_eq!(
        run.lines_with("the configured member name differs").len(),
        1,
        "{}",
        run.explain()
    );
    // The rollback's restore kept the data's name: the member's own etcd
    // (named as before) serves it.
    read_back("3.4.23", &member, &data, tmp.path())
        .assert_kept(&fixture.keyspace, MIN_REMAINING_TTL);
}

/// Another etcd (of another cluster) that takes a step's client port after
/// the port check, just before the step's etcd starts: nothing it answers
/// may be used. Before the fix, the health write, the fingerprint and the
/// rollback's snapshot went to it, and its data was swapped in (exit 0).
#[cfg(feature = "failpoints")]
#[test]
fn an_etcd_of_another_cluster_on_the_steps_port_is_never_used() {
    use crate::harness::migrator::{field, is_ours};
    use crate::harness::MIGRATE_TIMEOUT;
    const BEFORE_SPAWN: &str = "etcd-before-spawn";

    let tmp = temp_dir("impostor");
    let data = tmp.path().join("data");
    let member = Member::new("impostor");
    let fixture = fixture::build(FixtureSpec::small("3.5.16"), &data, &member, tmp.path());
    let other_data = tmp.path().join("other");
    let other = Member::new("impostor-other");
    fixture::build(
        FixtureSpec::small("3.5.16"),
        &other_data,
        &other,
        tmp.path(),
    );

    let migration = Migration::new("3.4.23", &data, &member).bundled("3.4.23,3.5.16");
    let mut running = migration
        .clone()
        .env("FAILPOINTS", format!("{BEFORE_SPAWN}=sleep(3000)"))
        .env("ETCD_MIGRATE_FAILPOINT_TRACE", "1")
        .spawn();
    running.wait_for_line(BEFORE_SPAWN, MIGRATE_TIMEOUT, |line| {
        is_ours(line, "failpoint") && field(line, "name") == Some(BEFORE_SPAWN)
    });
    let mut impostor =
        EtcdProcess::start("3.5.16", &other, &other_data, migration.port, tmp.path());
    block_on(impostor.wait_ready());
    let run = running.wait(MIGRATE_TIMEOUT);
    impostor.stop();
    run.assert_code(3);
    assert!(
        run.stderr.contains(&format!(
            "is not etcd 3.5.16 (pid {})",
            run.lines_with("etcd started")
                .first()
                .and_then(|l| field(l, "pid"))
                .unwrap_or("?")
        )) || run.stderr.contains("address already in use"),
        "the step fails on the impostor, or on its own bind:\n{}",
        run.explain()
    );
    println!(
        "impostor: {}",
        if run.stderr.contains("is not etcd") {
            "caught by the listener check"
        } else {
            "the step's etcd could not bind first"
        }
    );
    assert_eq!(read_version_txt(&data), "3.5.16/etcd3", "nothing recorded");
    read_back("3.5.16", &member, &data, tmp.path())
        .assert_kept(&fixture.keyspace, MIN_REMAINING_TTL);
}

#[test]
fn hidden_v2_keys_are_carried_by_the_storage_migration_and_the_rollbacks() {
    let tmp = temp_dir("v2-hidden");
    let data = tmp.path().join("data");
    let member = Member::new("v2-hidden");
    // etcd2 data with hidden nodes: at the top, inside a visible dir, a
    // hidden dir with a visible child, and one that expires.
    v2::build(
        "3.3.25",
        &data,
        &member,
        tmp.path(),
        &[vec![V2Key::plain("/registry/pods/a", "visible")]],
    );
    // The fixture builder checks each key in the listing, which never
    // shows hidden ones: write them after.
    add_v2_keys(
        &data,
        &member,
        tmp.path(),
        &[
            V2Key::plain("/_hidden", "top"),
            V2Key::plain("/registry/_config", "inside"),
            V2Key::plain("/_dir/child", "under a hidden dir"),
            V2Key::expiring("/_lock", "held", 3600),
        ],
    );
    let run = Migration::new("3.3.25", &data, &member)
        .bundled("3.3.25")
        .arg("--target-storage")
        .arg("etcd3")
        .run();
    run.assert_code(0);
    let v3 = read_back("3.3.25", &member, &data, tmp.path());
    for (key, value) in [
        ("/registry/pods/a", "visible"),
        ("/_hidden", "top"),
        ("/registry/_config", "inside"),
        ("/_dir/child", "under a hidden dir"),
        ("/_lock", "held"),
    ] {
        assert_eq!(
            v3.entries
                .get(key.as_bytes())
                .map(|e| String::from_utf8_lossy(&e.value).into_owned())
                .as_deref(),
            Some(value),
            "{key} after etcd2 -> etcd3:\n{}",
            run.explain()
        );
    }
    let lock_lease = v3.entries.get(b"/_lock".as_slice()).map(|e| e.lease);
    let ttl = lock_lease
        .and_then(|l| v3.leases.get(&l))
        .map(|l| l.remaining_ttl);
    assert!(
        ttl.is_some_and(|t| t > MIN_REMAINING_TTL && t <= 3600),
        "/_lock keeps its expiry: {ttl:?}"
    );
    // The migrated v2 store keeps no hidden node either (3.6 refuses any).
    let v2_after = read_back_v2("3.3.25", &member, &data, tmp.path());
    assert!(
        v2_after.without_health_key().is_empty(),
        "{:?}",
        v2_after.leaves
    );

    // Back to etcd2: the v3 keys that are hidden in v2 are found again.
    let back = Migration::new("3.3.25", &data, &member)
        .bundled("3.3.25")
        .arg("--target-storage")
        .arg("etcd2")
        .run();
    back.assert_code(0);
    let mut etcd = EtcdProcess::start("3.3.25", &member, &data, free_port(), tmp.path());
    let hidden = block_on(async {
        etcd.wait_ready_v2().await;
        let client = v2::http_client();
        let mut found = Vec::new();
        for key in ["/_hidden", "/registry/_config", "/_dir/child", "/_lock"] {
            let url = v2::key_url(&etcd.endpoint(), key);
            let text = client
                .get(&url)
                .send()
                .await
                .unwrap_or_else(|err| panic!("GET {url}: {err}"))
                .text()
                .await
                .unwrap_or_else(|err| panic!("GET {url}: {err}"));
            let body: serde_json::Value = serde_json::from_str(&text)
                .unwrap_or_else(|err| panic!("GET {url}: {err}: {text}"));
            found.push((key, body["node"]["value"].as_str().map(str::to_string)));
        }
        found
    });
    etcd.stop();
    assert_eq!(
        hidden,
        [
            ("/_hidden", Some("top".to_string())),
            ("/registry/_config", Some("inside".to_string())),
            ("/_dir/child", Some("under a hidden dir".to_string())),
            ("/_lock", Some("held".to_string())),
        ],
        "{}",
        back.explain()
    );
}

#[test]
fn a_v3_key_the_v2_store_would_rename_refuses_the_rollback_to_etcd2_before_anything_runs() {
    let cases: [(&'static [(&str, &str)], &str); 3] = [
        (&[("/registry/a/../b", "v")], "a `.` or `..` path segment"),
        (&[("/registry/x/", "v")], "an empty path segment"),
        (&[("/registry//y", "v")], "an empty path segment"),
    ];
    for (extra, problem) in cases {
        let key = extra[0].0;
        let tmp = temp_dir("v2-rename");
        let data = tmp.path().join("data");
        let member = Member::new("v2-rename");
        fixture::build(
            FixtureSpec::small("3.3.25")
                .text_only()
                .with_extra_keys(extra),
            &data,
            &member,
            tmp.path(),
        );
        let before = fingerprint(&data);
        Migration::new("3.3.25", &data, &member)
            .bundled("3.3.25")
            .arg("--target-storage")
            .arg("etcd2")
            .run()
            .assert_refused_untouched(&data, &before, &[&format!("key {key:?} has {problem}")]);
    }
}

/// etcd3 data at 3.5.30 whose v2 store holds flannel's config: refused
/// offline before a plan that reaches 3.6 (which refuses to start on it,
/// see `present::v2_content_*` for 3.6.14 itself), naming the content;
/// once the content is removed through the v2 API, the same data passes
/// the check. 3.6.14 is only named in the bundle: the refusal comes
/// before any binary is needed.
#[test]
fn v2_content_in_etcd3_data_is_refused_by_name_before_a_release_without_a_v2_store() {
    let tmp = temp_dir("v2-content");
    let data = tmp.path().join("data");
    let member = Member::new("v2-content");
    fixture::build(FixtureSpec::small("3.5.30"), &data, &member, tmp.path());
    v2::write_keys(
        "3.5.30",
        &member,
        &data,
        tmp.path(),
        &[
            V2Key::plain(FLANNEL, r#"{"Network":"10.1.0.0/16"}"#),
            V2Key::plain(NESTED, "old"),
        ],
    );
    let before = fingerprint(&data);
    Migration::new("3.6.14", &data, &member)
        .bundled("3.5.30,3.6.14")
        .run()
        .assert_refused_untouched(
            &data,
            &before,
            &[
                "holds content (/coreos.com, /legacy; keys e.g. [\"/coreos.com/network/config\", \"/legacy/tool/state\"])",
                "etcd 3.6.14, a step of this plan, has no v2 store",
                "with an etcd of 3.5.30 serving the data",
            ],
        );

    // Removed as the message says (the dirs too: an empty dir is still
    // content to 3.6), the data passes: what stops the run now is the
    // missing 3.6.14 binary, after the data checks.
    v2::remove_dirs(
        "3.5.30",
        &member,
        &data,
        tmp.path(),
        &["/coreos.com", "/legacy"],
    );
    let run = Migration::new("3.6.14", &data, &member)
        .bundled("3.5.30,3.6.14")
        .bin_dir(tmp.path())
        .run();
    run.assert_code(2);
    assert!(
        !run.stderr.contains("holds content"),
        "the content is gone\n{}",
        run.explain()
    );
    run.assert_stderr_has("etcd-3.6.14");
}
