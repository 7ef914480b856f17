//! Restores from a snapshot (issue 29): a member's data dir replaced by
//! what `etcdctl snapshot save` took, once, with the revision bumped past
//! the snapshot's; the snapshot refused before anything is touched when it
//! is not the one vouched for, cut short, not a snapshot, or newer than the
//! target; a run killed at each point of the restore converges.

use std::path::PathBuf;
use std::process::Command;

use crate::harness::fixture::{self, FixtureSpec};
use crate::harness::keyspace::read_back;
use crate::harness::migrator::Migration;
use crate::harness::snapshot::{backups, restoring, sha256, snapshot_of, AFTER};
use crate::harness::tree::fingerprint;
use crate::harness::{free_port, linked_bin_dir, read_version_txt, temp_dir, Member};

#[test]
fn a_member_is_restored_from_a_snapshot_once_and_only_once() {
    let tmp = temp_dir("restore-once");
    let data = tmp.path().join("data");
    let member = Member::new("restore-once");
    fixture::build(FixtureSpec::full("3.5.16"), &data, &member, tmp.path());
    let file = tmp.path().join("snapshot.db");
    let held = snapshot_of("3.5.16", &data, &member, tmp.path(), &file);
    let sha = sha256(&file);

    let run = restoring("3.5.16", &data, &member, &file, &sha).run();
    run.assert_code(0);
    assert_eq!(run.lines_with("restored").len(), 1, "{}", run.explain());
    assert_eq!(read_version_txt(&data), "3.5.16/etcd3");
    assert_eq!(backups(&data).len(), 1, "the data as it was is backed up");

    let restored = read_back("3.5.16", &member, &data, tmp.path());
    assert!(
        !restored.entries.contains_key(AFTER.as_bytes()),
        "a key written after the snapshot is not in the restored member"
    );
    restored.assert_kept(&held, 3000);
    assert!(
        restored.revision > 1_000_000_000,
        "the revision is bumped past the snapshot's (watchers see a compaction, not revisions going back): {}",
        restored.revision
    );

    // The setting left in the manifest: nothing happens again.
    let again = restoring("3.5.16", &data, &member, &file, &sha).run();
    again.assert_code(0);
    assert!(
        again.lines_with("restoring the data dir").is_empty(),
        "restored twice:\n{}",
        again.explain()
    );
    assert_eq!(
        again.lines_with("already at target").len(),
        1,
        "{}",
        again.explain()
    );
    assert_eq!(backups(&data).len(), 1, "no second backup");
}

#[test]
fn a_snapshot_that_is_not_the_one_vouched_for_or_not_whole_is_refused_with_the_data_untouched() {
    let tmp = temp_dir("restore-refused");
    let data = tmp.path().join("data");
    let member = Member::new("restore-refused");
    fixture::build(FixtureSpec::small("3.5.16"), &data, &member, tmp.path());
    let file = tmp.path().join("snapshot.db");
    snapshot_of("3.5.16", &data, &member, tmp.path(), &file);
    let sha = sha256(&file);
    let bytes = std::fs::read(&file).expect("read");

    let cut = tmp.path().join("cut.db");
    std::fs::write(&cut, &bytes[..bytes.len() - 100]).expect("write");
    let raw = tmp.path().join("raw.db");
    std::fs::copy(data.join("member/snap/db"), &raw).expect("copy the db");
    let flipped = tmp.path().join("flipped.db");
    let mut changed = bytes.clone();
    changed[5000] ^= 0xff;
    std::fs::write(&flipped, &changed).expect("write");

    let before = fingerprint(&data);
    let cases: Vec<(&str, &str, PathBuf, String, &str)> = vec![
        (
            "another file's hash",
            "3.5.16",
            file.clone(),
            "0".repeat(64),
            "not the",
        ),
        (
            "cut short",
            "3.5.16",
            cut.clone(),
            sha256(&cut),
            "not a bolt db of 4 KiB pages",
        ),
        (
            "a db copied from a data dir",
            "3.5.16",
            raw.clone(),
            sha256(&raw),
            "not a bolt db of 4 KiB pages",
        ),
        (
            "a byte changed",
            "3.5.16",
            flipped.clone(),
            sha256(&flipped),
            "integrity hash",
        ),
        (
            "newer than the target",
            "3.4.23",
            file.clone(),
            sha.clone(),
            "newer than the target 3.4.23",
        ),
    ];
    for (what, target, snapshot, hash, says) in cases {
        let run = restoring(target, &data, &member, &snapshot, &hash).run();
        run.assert_code(2);
        run.assert_stderr_has(says);
        assert!(
            run.lines_with("restoring the data dir").is_empty(),
            "{what}: went on to restore:\n{}",
            run.explain()
        );
        before.assert_unchanged(&fingerprint(&data), what);
    }

    // Half the setting is a configuration error.
    let run = Migration::new("3.5.16", &data, &member)
        .arg("--restore-snapshot")
        .arg(&file)
        .run();
    run.assert_code(2);
    run.assert_stderr_has("--restore-snapshot-sha256");
    before.assert_unchanged(&fingerprint(&data), "the hash missing");
    assert!(backups(&data).is_empty(), "nothing was backed up");
}

#[test]
fn a_member_is_restored_from_one_of_our_backups_vouched_for_by_its_manifest() {
    let tmp = temp_dir("restore-backup");
    let data = tmp.path().join("data");
    let member = Member::new("restore-backup");
    fixture::build(FixtureSpec::small("3.5.16"), &data, &member, tmp.path());
    let file = tmp.path().join("snapshot.db");
    snapshot_of("3.5.16", &data, &member, tmp.path(), &file);
    // The data as it is (AFTER in it), backed up by the snapshot's restore.
    let held = read_back("3.5.16", &member, &data, tmp.path());
    assert!(held.entries.contains_key(AFTER.as_bytes()));
    restoring("3.5.16", &data, &member, &file, &sha256(&file))
        .run()
        .assert_code(0);
    let taken = backups(&data);
    assert_eq!(taken.len(), 1, "the restore backed the data up");
    let backup = taken[0].clone();
    let manifest_sha = sha256(&backup.join("MANIFEST.sha256"));

    // Refused, nothing touched: another hash, a backup that no longer
    // verifies, a directory that is no backup.
    let damaged = tmp.path().join("damaged");
    let copied = Command::new("cp")
        .arg("-a")
        .arg(&backup)
        .arg(&damaged)
        .status()
        .expect("cp");
    assert!(copied.success());
    let db = damaged.join("member/snap/db");
    let mut bytes = std::fs::read(&db).expect("read");
    bytes[5000] ^= 0xff;
    std::fs::write(&db, &bytes).expect("write");
    let before = fingerprint(&data);
    for (what, dir, hash, says) in [
        ("another hash", &backup, "0".repeat(64), "MANIFEST.sha256"),
        (
            "a byte changed",
            &damaged,
            manifest_sha.clone(),
            "does not verify",
        ),
        (
            "no backup",
            &tmp.path().to_path_buf(),
            manifest_sha.clone(),
            "not an etcd-migrate backup",
        ),
    ] {
        let run = restoring("3.5.16", &data, &member, dir, &hash).run();
        run.assert_code(2);
        run.assert_stderr_has(says);
        before.assert_unchanged(&fingerprint(&data), what);
    }

    // The backup, vouched for by its manifest's hash: the data as it was
    // before the snapshot's restore, AFTER and all, the revision bumped.
    let run = restoring("3.5.16", &data, &member, &backup, &manifest_sha).run();
    run.assert_code(0);
    assert_eq!(run.lines_with("restored").len(), 1, "{}", run.explain());
    let restored = read_back("3.5.16", &member, &data, tmp.path());
    restored.assert_kept(&held, 3000);
    assert!(
        restored.revision > 1_000_000_000,
        "the revision is bumped: {}",
        restored.revision
    );
}

#[test]
fn a_restore_killed_at_each_point_converges_on_the_next_start() {
    for point in ["restore-after-tool", "restore-after-swap"] {
        let tmp = temp_dir("restore-kill");
        let data = tmp.path().join("data");
        let member = Member::new("restore-kill");
        fixture::build(FixtureSpec::small("3.5.16"), &data, &member, tmp.path());
        let file = tmp.path().join("snapshot.db");
        let held = snapshot_of("3.5.16", &data, &member, tmp.path(), &file);
        let sha = sha256(&file);

        let killed = restoring("3.5.16", &data, &member, &file, &sha)
            .env("FAILPOINTS", format!("{point}=return"))
            .run();
        assert_eq!(
            killed.code(),
            None,
            "{point}: not killed:\n{}",
            killed.explain()
        );

        let run = restoring("3.5.16", &data, &member, &file, &sha).run();
        run.assert_code(0);
        assert_eq!(read_version_txt(&data), "3.5.16/etcd3", "{point}");
        let restored = read_back("3.5.16", &member, &data, tmp.path());
        assert!(
            !restored.entries.contains_key(AFTER.as_bytes()),
            "{point}: the key written after the snapshot is back"
        );
        restored.assert_kept(&held, 3000);
        assert!(
            !data.join(".etcd-migrate.work").exists(),
            "{point}: the scratch dir is gone"
        );
    }
}

#[test]
fn force_new_cluster_is_refused_where_there_is_no_quorum_to_recover() {
    let tmp = temp_dir("force-refused");
    let data = tmp.path().join("data");
    let member = Member::new("force-refused");
    fixture::build(FixtureSpec::small("3.5.16"), &data, &member, tmp.path());
    let before = fingerprint(&data);
    // --no-exec: nothing to run the member's etcd with.
    let run = Migration::new("3.5.16", &data, &member)
        .arg("--force-new-cluster")
        .run();
    run.assert_code(2);
    run.assert_stderr_has("--force-new-cluster refused");
    before.assert_unchanged(&fingerprint(&data), "--no-exec");
    // A cluster of one: no quorum to recover.
    let url = format!("http://127.0.0.1:{}", free_port());
    let run = Migration::new("3.5.16", &data, &member)
        .mode(crate::harness::migrator::Mode::Exec(member.exec_args(&url)))
        .env("FORCE_NEW_CLUSTER", "1")
        .run();
    run.assert_code(2);
    run.assert_stderr_has("a cluster of one");
    before.assert_unchanged(&fingerprint(&data), "one member");
    assert!(backups(&data).is_empty(), "nothing was backed up");
}

/// A join as a learner cut short (issue 29 item 3): the join's record and
/// a half-joined `member/`, no `version.txt`. A dry run calls the data dir
/// empty and touches nothing; a run removes the half-joined data and the
/// record and starts over (here with no cluster to join: the empty data
/// dir's record). A record beside a `version.txt` (the join was done) is
/// only removed, the data kept.
/// The line of a start that finds a join as a learner cut short.
const JOIN_AGAIN: &str = "a join as a learner died before its promotion was recorded: the member joins again, on an empty data dir";

#[test]
fn a_join_cut_short_as_a_learner_starts_over_on_an_empty_data_dir() {
    let tmp = temp_dir("join-cut-short");
    let data = tmp.path().join("data");
    let member = Member::new("join-cut-short");
    std::fs::create_dir_all(data.join("member/wal")).expect("mkdir");
    std::fs::write(
        data.join("member/wal/0000000000000000-0000000000000000.wal"),
        b"half",
    )
    .expect("write");
    std::fs::write(
        data.join(".etcd-migrate.joining"),
        br#"{"target":"3.5.16/etcd3"}"#,
    )
    .expect("write the record");
    let before = fingerprint(&data);

    let run = Migration::new("3.5.16", &data, &member)
        .mode(crate::harness::migrator::Mode::DryRun)
        .run();
    run.assert_code(0);
    assert!(
        run.stdout.contains("empty; would record 3.5.16/etcd3"),
        "{}",
        run.explain()
    );
    before.assert_unchanged(&fingerprint(&data), "the dry run");

    let run = Migration::new("3.5.16", &data, &member).run();
    run.assert_code(0);
    assert_eq!(run.lines_with(JOIN_AGAIN).len(), 1, "{}", run.explain());
    assert!(
        !data.join("member").exists(),
        "the half-joined data is gone"
    );
    assert!(
        !data.join(".etcd-migrate.joining").exists(),
        "and the record"
    );
    assert_eq!(read_version_txt(&data), "3.5.16/etcd3");

    // Done, then cut short before the record went: the data is kept.
    std::fs::create_dir_all(data.join("member/wal")).expect("mkdir");
    std::fs::write(data.join(".etcd-migrate.joining"), b"{}").expect("write the record");
    let run = Migration::new("3.5.16", &data, &member).run();
    run.assert_code(0);
    assert!(data.join("member/wal").exists(), "the joined data is kept");
    assert!(!data.join(".etcd-migrate.joining").exists());
    assert!(run.lines_with(JOIN_AGAIN).is_empty(), "{}", run.explain());
}

/// The file changed between its check and the end of the restore tool's
/// run (an operator copying a newer snapshot over it, a sync job): the
/// restore is refused before the swap, its work discarded, the data dir
/// as it was. The tool is the real `etcdutl` behind a wrapper that
/// touches the snapshot once it has restored from it, so the change comes
/// at a known point, not by timing.
#[test]
fn a_snapshot_changed_while_it_is_restored_is_refused_before_the_swap() {
    let tmp = temp_dir("restore-changed");
    let data = tmp.path().join("data");
    let member = Member::new("restore-changed");
    fixture::build(FixtureSpec::small("3.5.16"), &data, &member, tmp.path());
    let file = tmp.path().join("snapshot.db");
    snapshot_of("3.5.16", &data, &member, tmp.path(), &file);
    let sha = sha256(&file);
    let bin = linked_bin_dir(&["3.5.16"], tmp.path());
    let tool = bin.join("etcdutl-3.5.16");
    let real = std::fs::read_link(&tool).expect("the linked etcdutl");
    std::fs::remove_file(&tool).expect("unlink etcdutl");
    std::fs::write(
        &tool,
        format!(
            "#!/bin/sh\n'{}' \"$@\"\nrc=$?\nif [ \"$1\" = snapshot ]; then touch '{}'; fi\nexit $rc\n",
            real.display(),
            file.display()
        ),
    )
    .expect("write the wrapper");
    std::fs::set_permissions(&tool, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("chmod the wrapper");
    let before = fingerprint(&data);
    let run = restoring("3.5.16", &data, &member, &file, &sha)
        .bin_dir(&bin)
        .run();
    run.assert_code(2);
    run.assert_stderr_has("it changed while it was checked and restored");
    assert_eq!(
        run.lines_with("restoring the data dir from a snapshot")
            .len(),
        1,
        "the tool ran:\n{}",
        run.explain()
    );
    // Every file and dir as it was; the data dir itself held the work dir
    // for a while (its mtime moved: an entry came and went).
    before.without(&[""]).assert_unchanged(
        &fingerprint(&data).without(&[""]),
        "a restore refused after its tool ran",
    );
    // The file left alone (the tool unwrapped), the same setting restores.
    let again = restoring("3.5.16", &data, &member, &file, &sha).run();
    again.assert_code(0);
    assert_eq!(read_version_txt(&data), "3.5.16/etcd3");
}
