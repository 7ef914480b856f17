//! The etcd2 → etcd3 storage migration on real etcd: a v2 store written by
//! etcd 3.3.25 through the v2 API (nested dirs, TTL keys, unicode and
//! special characters) walked to 3.5.16, every leaf checked in v3 with its
//! value and its lease, expired keys never resurrected, and the v2 store
//! left empty for 3.6.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use crate::harness::etcd::EtcdProcess;
use crate::harness::keyspace::read_back;
use crate::harness::keyspace::Keyspace;
use crate::harness::migrator::Migration;
use crate::harness::v2::{self, V2Key, EXPIRY_MARGIN};
use crate::harness::{
    block_on, dir_names, free_port, mode, read_version_txt, temp_dir, wait_until, Member, WORK_DIR,
};

/// The key written last with a 2 s TTL, expired before the migration.
const SHORT_LIVED: &str = "/registry/events/ns-0/short-lived";

/// Sleeps until `when` (no-op if it has passed).
fn sleep_until(when: Instant) {
    std::thread::sleep(when.saturating_duration_since(Instant::now()));
}

#[test]
fn storage_migration_3_3_etcd2_to_3_5_etcd3_keeps_values_and_ttls() {
    let tmp = temp_dir("storage");
    let data = tmp.path().join("data");
    let member = Member::new("storage");
    let mut batches = v2::kubernetes_like(130, &[600, 1200, 3000], 20);
    batches.push(vec![V2Key::expiring(
        SHORT_LIVED,
        "gone before the migration",
        2,
    )]);
    let fixture = v2::build("3.3.25", &data, &member, tmp.path(), &batches);
    assert!(
        fixture.keys.len() >= 200,
        "{} keys written",
        fixture.keys.len()
    );
    assert_eq!(read_version_txt(&data), "3.3.25/etcd2");

    // The short-lived key ran out while no etcd was serving the data: it
    // is still in the v2 store on disk, and must not come back.
    sleep_until(fixture.key(SHORT_LIVED).sent + Duration::from_secs(2) + EXPIRY_MARGIN);

    let run = Migration::new("3.5.16", &data, &member)
        .bundled("3.3.25,3.4.23,3.5.16")
        .run();
    run.assert_code(0);
    assert_eq!(
        run.step_kinds(),
        ["storage-migration", "minor-upgrade", "minor-upgrade"],
        "{}",
        run.explain()
    );
    for message in ["v2 keyspace read", "leases attached", "v3 keys verified"] {
        assert_eq!(
            run.lines_with(message).len(),
            1,
            "one {message:?} line\n{}",
            run.explain()
        );
    }
    assert_eq!(read_version_txt(&data), "3.5.16/etcd3");
    assert_eq!(mode(&data), 0o700);
    assert!(
        !data.join(WORK_DIR).exists(),
        "the scratch dir is removed once the step is recorded"
    );

    // The backup holds the etcd2 data as it was before the first step.
    let backup_root = tmp.path().join("data.backup");
    let backups = dir_names(&backup_root);
    assert!(
        backups.len() == 1 && backups[0].ends_with("Z-3.3.25-etcd2"),
        "one backup of 3.3.25/etcd2 expected in {}: {backups:?}",
        backup_root.display()
    );
    let backup = backup_root.join(&backups[0]);
    assert_eq!(read_version_txt(&backup), "3.3.25/etcd2");
    assert_eq!(mode(&backup), 0o700);

    // One 3.5.16 with the v2 API on reads both stores.
    let (v3, read_at, v2_after) = v2::read_back_migrated("3.5.16", &member, &data, tmp.path());

    v3.assert_no_health_key();
    let gone: BTreeSet<String> = [SHORT_LIVED.to_string()].into();
    let splits = v2::assert_migrated(&v3, &fixture, read_at, &gone, false);
    eprintln!(
        "storage migration: {} keys, {} leases, {splits} TTL group(s) split at a second boundary",
        v3.entries.len(),
        v3.leases.len()
    );
    v2_after.assert_empty();
}

/// etcd v2 reports a key whose TTL ran out less than a second ago, and
/// that its expiry sweep (every 500 ms) has not removed yet, with its
/// `expiration` but without `ttl` (the TTL rounds to 0, which the JSON
/// omits). Keys written 50 ms apart with TTLs of 1 to 3 s, the last just
/// before the fixture stops, make sure some key is in that state whenever
/// the migration reads the v2 store.
#[test]
fn storage_migration_never_turns_a_just_expired_key_into_a_permanent_one() {
    let tmp = temp_dir("just-expired");
    let data = tmp.path().join("data");
    let member = Member::new("just-expired");
    let mut batches = vec![vec![V2Key::plain("/registry/pods/ns/keep", "kept")]];
    batches.extend((0..24).map(|i| {
        vec![V2Key::expiring(
            format!("/registry/events/ns/short-{i:02}"),
            format!("short {i}"),
            1 + (i % 3) as i64,
        )]
    }));
    let fixture = v2::build_paced(
        "3.3.25",
        &data,
        &member,
        tmp.path(),
        &batches,
        Duration::from_millis(50),
    );

    let run = Migration::new("3.3.25", &data, &member)
        .bundled("3.3.25")
        .arg("--backup")
        .arg("never")
        .run();
    run.assert_code(0);
    assert_eq!(read_version_txt(&data), "3.3.25/etcd3");

    let v3 = read_back("3.3.25", &member, &data, tmp.path());
    assert_eq!(
        v3.entries
            .get(b"/registry/pods/ns/keep".as_slice())
            .map(|e| e.value.clone()),
        Some(b"kept".to_vec())
    );
    let permanent: Vec<String> = fixture
        .keys
        .iter()
        .filter(|k| k.key.ttl.is_some())
        .filter(|k| {
            v3.entries
                .get(k.key.path.as_bytes())
                .is_some_and(|entry| entry.lease == 0)
        })
        .map(|k| {
            format!(
                "{} (TTL {:?} s, expired at {})",
                k.key.path,
                k.key.ttl,
                k.expiration.as_deref().unwrap_or("?")
            )
        })
        .collect();
    assert!(
        permanent.is_empty(),
        "keys written with a TTL came out of the migration without a lease, so they never expire: {permanent:#?}\nthe migration's lines:\n{}",
        run.our_lines().join("\n")
    );
    // The leased ones do run out: nothing with a TTL is left once the
    // longest has passed on a serving etcd.
    let mut etcd = EtcdProcess::start("3.3.25", &member, &data, free_port(), tmp.path());
    block_on(etcd.wait_ready());
    let endpoint = etcd.endpoint();
    wait_until("every TTL key to expire", Duration::from_secs(10), || {
        let v3 = block_on(Keyspace::read(&endpoint));
        let left = v3
            .entries
            .keys()
            .filter(|k| k.starts_with(b"/registry/events/"))
            .count();
        (left == 0).then_some(())
    });
    etcd.stop();
}

/// `--ttl-leases flat` keeps the Kubernetes tool's meaning of
/// `--ttl-keys-directory`: every key under it (TTL or not) shares one
/// one-hour lease, while TTL keys elsewhere still get their own TTL.
#[test]
fn flat_ttl_leases_put_the_ttl_directory_under_one_hour_lease() {
    let tmp = temp_dir("flat");
    let data = tmp.path().join("data");
    let member = Member::new("flat");
    let batches = vec![vec![
        V2Key::expiring("/registry/events/ns/a", "short event", 600),
        V2Key::expiring("/registry/events/ns/b", "long event", 3000),
        V2Key::plain("/registry/events/ns/c", "event without TTL"),
        V2Key::expiring("/registry/leases/ns/l", "not an event", 1200),
        V2Key::plain("/registry/pods/ns/p", "pod"),
    ]];
    v2::build("3.3.25", &data, &member, tmp.path(), &batches);

    let run = Migration::new("3.3.25", &data, &member)
        .bundled("3.3.25")
        .arg("--ttl-leases")
        .arg("flat")
        .arg("--backup")
        .arg("never")
        .run();
    run.assert_code(0);
    assert_eq!(read_version_txt(&data), "3.3.25/etcd3");

    let v3 = read_back("3.3.25", &member, &data, tmp.path());
    let lease_of = |key: &str| {
        v3.entries
            .get(key.as_bytes())
            .unwrap_or_else(|| panic!("{key} missing after the migration"))
            .lease
    };
    let events = lease_of("/registry/events/ns/a");
    assert_ne!(events, 0, "events get the flat lease");
    assert_eq!(lease_of("/registry/events/ns/b"), events);
    assert_eq!(lease_of("/registry/events/ns/c"), events);
    let flat = &v3.leases[&events];
    assert_eq!(flat.granted_ttl, 3600, "the flat lease is one hour");
    let other = lease_of("/registry/leases/ns/l");
    assert!(
        other != 0 && other != events,
        "a TTL key outside the directory keeps its own lease"
    );
    let own = &v3.leases[&other];
    assert!(
        own.granted_ttl <= 1200 && own.granted_ttl > 1200 - 30,
        "{own:?}"
    );
    assert_eq!(
        lease_of("/registry/pods/ns/p"),
        0,
        "keys without TTL outside the directory get no lease"
    );
}

/// Every TTL key with a TTL of its own (Kubernetes events written over an
/// hour), so a lease of its own: the copy that gets the leases must not
/// snapshot its v2 store after each of those writes. With a snapshot after
/// every entry, each lease cost a serialization of the whole v2 store: at
/// 200k × 1 KiB (the pause bench of issue 28) 19 s a snapshot, and the
/// step never ended. The leases are granted and filled many at a time, and
/// the read that proves the copy asks many leases' TTLs per page: every key
/// keeps its value and gets a lease of its own, granted what was left of
/// its own TTL (the grants in the keys' order, each within its TTL).
#[test]
fn leases_for_many_ttls_are_attached_without_a_snapshot_per_write() {
    const TTL_KEYS: i64 = 300;
    let tmp = temp_dir("storage-many-ttls");
    let data = tmp.path().join("data");
    let member = Member::new("storage-many-ttls");
    let keys: Vec<V2Key> = (0..TTL_KEYS)
        .map(|i| {
            V2Key::expiring(
                format!("/registry/events/ns-0/event-{i:03}"),
                format!("event {i}"),
                600 + 10 * i,
            )
        })
        .collect();
    v2::build("3.3.25", &data, &member, tmp.path(), &[keys]);

    let run = Migration::new("3.3.25", &data, &member)
        .arg("--target-storage")
        .arg("etcd3")
        .run();
    run.assert_code(0);
    assert_eq!(read_version_txt(&data), "3.3.25/etcd3");
    let leases: usize = run
        .lines_with("leases attached")
        .iter()
        .filter_map(|line| crate::harness::migrator::field(line, "leases"))
        .filter_map(|n| n.parse::<usize>().ok())
        .sum();
    assert!(
        leases as i64 >= TTL_KEYS / 2,
        "a lease per TTL (or two keys' expiry in one second): {leases}\n{}",
        run.explain()
    );
    // The source's etcd snapshots after every entry (its store is small):
    // at its start and after its health write. The copy's, never.
    let snapshots = run.stderr.matches("saved snapshot at index").count();
    assert!(
        snapshots < 10,
        "{snapshots} raft snapshots for {leases} leases: the copy snapshots per write\n{}",
        run.explain()
    );
    let v3 = read_back("3.3.25", &member, &data, tmp.path());
    v3.assert_no_health_key();
    let mut granted = Vec::new();
    for i in 0..TTL_KEYS {
        let key = format!("/registry/events/ns-0/event-{i:03}");
        let ttl = 600 + 10 * i;
        let entry = v3
            .entries
            .get(key.as_bytes())
            .unwrap_or_else(|| panic!("{key} lost"));
        assert_eq!(entry.value, format!("event {i}").as_bytes(), "{key}");
        let lease = v3
            .leases
            .get(&entry.lease)
            .unwrap_or_else(|| panic!("{key}: no lease ({:x})", entry.lease));
        assert_eq!(
            lease.keys.iter().collect::<Vec<_>>(),
            [&key.as_bytes().to_vec()],
            "{key}: a lease of its own"
        );
        assert!(
            lease.granted_ttl > ttl - 300 && lease.granted_ttl <= ttl,
            "{key}: granted {} s of its {ttl} s",
            lease.granted_ttl
        );
        granted.push(lease.granted_ttl);
    }
    assert!(
        granted.windows(2).all(|w| w[0] < w[1]),
        "each key granted what was left of its own TTL, in the keys' order: {granted:?}"
    );
}
