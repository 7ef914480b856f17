//! Data as the Kubernetes tool we succeed left it (issue 20): its health
//! check wrote the key `etcd_version` through the v3 API on every 3.x
//! release, also on etcd2-labelled data, so a `3.x/etcd2` data dir it
//! served holds that v3 key beside the v2 store. Its storage migration
//! failed ("51 keys expected, 52 found") and put the data on hold.

use crate::harness::fixture::{etcd2_data_with_the_health_key, put_v3};
use crate::harness::keyspace::read_back;
use crate::harness::migrator::Migration;
use crate::harness::tree::fingerprint;
use crate::harness::v2::{self, V2Key};
use crate::harness::{read_version_txt, temp_dir, Member};

#[test]
fn etcd2_data_holding_the_kubernetes_tools_v3_health_key_migrates_to_etcd3_with_it() {
    let tmp = temp_dir("k8s-health-key");
    let data = tmp.path().join("data");
    let member = Member::new("k8s-health-key");
    etcd2_data_with_the_health_key("3.3.25", &data, &member, tmp.path());
    assert_eq!(read_version_txt(&data), "3.3.25/etcd2");

    let run = Migration::new("3.4.23", &data, &member)
        .bundled("3.3.25,3.4.23")
        .run();
    run.assert_code(0);
    assert_eq!(
        run.step_kinds(),
        ["storage-migration", "minor-upgrade"],
        "{}",
        run.explain()
    );
    assert!(
        run.lines_with("v2 keyspace read")
            .iter()
            .any(|l| l.contains("+ v3 keyspace: v3 1 keys")),
        "the fingerprint covers the v3 key beside the v2 store\n{}",
        run.explain()
    );
    assert_eq!(read_version_txt(&data), "3.4.23/etcd3");
    assert!(!data.join(".etcd-migrate.hold").exists(), "no hold");

    let keyspace = read_back("3.4.23", &member, &data, tmp.path());
    let value = |key: &str| {
        keyspace
            .entries
            .get(key.as_bytes())
            .map(|e| String::from_utf8_lossy(&e.value).into_owned())
    };
    assert_eq!(
        value("etcd_version").as_deref(),
        Some("3.3.25 #12"),
        "the v3 key keeps its last value (etcdctl migrate alone gives it back an older one)"
    );
    for i in 1..=10 {
        assert_eq!(
            value(&format!("/registry/pods/default/p{i}")),
            Some(format!("pod {i}")),
            "every v2 key is a v3 key now"
        );
    }
    assert_eq!(keyspace.entries.len(), 11, "{:?}", keyspace.entries.keys());
}

#[test]
fn a_v2_key_that_would_land_on_a_v3_key_of_etcd2_data_is_refused_by_name() {
    let tmp = temp_dir("k8s-clash");
    let data = tmp.path().join("data");
    let member = Member::new("k8s-clash");
    v2::build(
        "3.3.25",
        &data,
        &member,
        tmp.path(),
        &[vec![
            V2Key::plain("/registry/ranges/serviceips", "from v2"),
            V2Key::plain("/registry/pods/default/p", "pod"),
        ]],
    );
    put_v3(
        "3.3.25",
        &data,
        &member,
        tmp.path(),
        "/registry/ranges/serviceips",
        &["from v3"],
    );
    // Found offline, before any etcd runs: nothing touched.
    let before = fingerprint(&data);
    Migration::new("3.4.23", &data, &member)
        .bundled("3.3.25,3.4.23")
        .run()
        .assert_refused_untouched(
            &data,
            &before,
            &[
                "\"/registry/ranges/serviceips\"",
                "would be written over v3 keys of the same name",
            ],
        );
    assert_eq!(read_version_txt(&data), "3.3.25/etcd2", "nothing recorded");
    assert!(!data.join(".etcd-migrate.hold").exists(), "no hold");
}
