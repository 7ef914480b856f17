//! Backups before destructive steps, on real etcd: retention of the newest
//! `--backup-keep`, names and modes, the logged restore command bringing
//! the pre-rollback data back, the free-space check refusing a backup that
//! cannot fit, and pruning never taking the backup just made.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, SystemTime};

use serde_json::Value;

use crate::harness::etcd::read_back;
use crate::harness::fixture::{self, FixtureSpec};
use crate::harness::migrator::{field, Migration, Outcome};
use crate::harness::mount::Mount;
use crate::harness::tree::fingerprint;
use crate::harness::{
    dir_names, mode, read_version_txt, temp_dir, write_version_txt, Member, WORK_DIR,
};

const BUNDLE: &str = "3.3.25,3.4.23,3.5.16";

/// The `path=` of the `backup taken` line (text format), if any.
fn backup_taken(run: &Outcome) -> Option<PathBuf> {
    let lines = run.lines_with("backup taken");
    assert!(
        lines.len() <= 1,
        "one backup per run at most\n{}",
        run.explain()
    );
    lines.first().map(|line| {
        let path = field(line, "path").unwrap_or_else(|| panic!("no path= in {line:?}"));
        PathBuf::from(path)
    })
}

/// Whether `name` is `<YYYYMMDD>T<HHMMSS>Z-<version>-<storage>` with an
/// optional `-<n>`, and holds `pair` (`<version>/<storage>`).
fn is_backup_name(name: &str, pair: &str) -> bool {
    let Some((stamp, rest)) = name.split_once('-') else {
        return false;
    };
    // YYYYMMDDTHHMMSS.mmmZ: fixed width, so names sort by time.
    let stamp_ok = stamp.len() == 20
        && stamp.char_indices().all(|(i, c)| match i {
            8 => c == 'T',
            15 => c == '.',
            19 => c == 'Z',
            _ => c.is_ascii_digit(),
        });
    let held = pair.replace('/', "-");
    let suffix_ok = match rest.strip_prefix(&held) {
        Some("") => true,
        Some(n) => n
            .strip_prefix('-')
            .is_some_and(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit())),
        None => false,
    };
    stamp_ok && suffix_ok
}

#[test]
fn backups_are_kept_newest_first_up_to_backup_keep() {
    let tmp = temp_dir("retention");
    let data = tmp.path().join("data");
    let member = Member::new("retention");
    fixture::build(FixtureSpec::small("3.4.23"), &data, &member, tmp.path());
    let root = tmp.path().join("data.backup");
    let run = |target: &str, extra: &[&str]| {
        let mut migration = Migration::new(target, &data, &member)
            .bundled(BUNDLE)
            .arg("--backup-keep")
            .arg("2");
        for arg in extra {
            migration = migration.arg(*arg);
        }
        let run = migration.run();
        run.assert_code(0);
        assert_eq!(
            read_version_txt(&data),
            format!("{target}/etcd3"),
            "{}",
            run.explain()
        );
        run
    };

    // Rollback: destructive, so backed up by default.
    let first = backup_taken(&run("3.3.25", &[])).expect("a rollback is backed up");
    // Upgrade: not destructive, no backup by default.
    let upgrade = run("3.4.23", &[]);
    assert_eq!(backup_taken(&upgrade), None, "{}", upgrade.explain());
    // Upgrade with --backup always.
    let second = backup_taken(&run("3.5.16", &["--backup", "always"])).expect("always");
    // Rollback again: the third backup pushes the first one out.
    let third = backup_taken(&run("3.4.23", &[])).expect("a rollback is backed up");

    let kept = dir_names(&root);
    let expected: Vec<String> = [&second, &third]
        .iter()
        .map(|p| p.file_name().expect("name").to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        kept,
        expected,
        "the newest two backups remain (first was {})",
        first.display()
    );
    assert!(!first.exists());
    assert!(
        is_backup_name(&kept[0], "3.4.23/etcd3") && is_backup_name(&kept[1], "3.5.16/etcd3"),
        "names say when and what: {kept:?}"
    );
    assert_eq!(mode(&root), 0o700);
    for (name, pair) in kept.iter().zip(["3.4.23/etcd3", "3.5.16/etcd3"]) {
        let backup = root.join(name);
        assert_eq!(mode(&backup), 0o700, "{name}");
        assert_eq!(read_version_txt(&backup), pair, "{name}");
        assert!(
            !backup.join(WORK_DIR).exists(),
            "{name} holds scratch space"
        );
    }
    assert!(
        !kept.iter().any(|name| name.starts_with(".tmp-")),
        "no half-written backup is left: {kept:?}"
    );
}

#[test]
fn the_logged_restore_command_brings_back_the_pre_rollback_data() {
    let tmp = temp_dir("restore");
    let data = tmp.path().join("data");
    let member = Member::new("restore");
    let fixture = fixture::build(
        FixtureSpec::small("3.4.23").with_rewrites(5),
        &data,
        &member,
        tmp.path(),
    );
    let before = fingerprint(&data);

    let run = Migration::new("3.3.25", &data, &member)
        .bundled(BUNDLE)
        .arg("--log-format")
        .arg("json")
        .run();
    run.assert_code(0);
    assert_eq!(read_version_txt(&data), "3.3.25/etcd3");
    let lines = run.json_lines();
    let taken = lines
        .iter()
        .find(|line| line.get("msg").and_then(Value::as_str) == Some("backup taken"))
        .unwrap_or_else(|| panic!("no backup taken line\n{}", run.explain()));
    assert_eq!(
        taken.get("holds").and_then(Value::as_str),
        Some("3.4.23/etcd3")
    );
    let restore = taken
        .get("restore")
        .and_then(Value::as_str)
        .unwrap_or_else(|| panic!("no restore field in {taken:?}"));

    let output = Command::new("sh")
        .arg("-c")
        .arg(restore)
        .output()
        .unwrap_or_else(|err| panic!("run sh -c {restore:?}: {err}"));
    assert!(
        output.status.success(),
        "{restore:?} failed with {}: {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(read_version_txt(&data), "3.4.23/etcd3");
    before.content().assert_unchanged(
        &fingerprint(&data).content(),
        "the restored data dir differs from the pre-rollback one",
    );
    let after = read_back("3.4.23", &member, &data, tmp.path());
    after.assert_kept(&fixture.keyspace, 3000);
    after.assert_revisions_kept(&fixture.keyspace);
}

#[test]
fn a_backup_that_cannot_fit_is_refused_before_anything_changes() {
    let tmp = temp_dir("nospace");
    let data = tmp.path().join("data");
    let member = Member::new("nospace");
    fixture::build(FixtureSpec::small("3.4.23"), &data, &member, tmp.path());
    let small = Mount::tmpfs(&tmp.path().join("small"), "size=1m");
    let before = fingerprint(&data);

    let run = Migration::new("3.3.25", &data, &member)
        .bundled(BUNDLE)
        .arg("--backup-dir")
        .arg(small.path.join("b"))
        .run();
    run.assert_code(2)
        .assert_stderr_has("not enough free space");
    assert!(
        run.lines_with("step start").is_empty() && run.lines_with("etcd started").is_empty(),
        "nothing runs\n{}",
        run.explain()
    );
    before.assert_unchanged(&fingerprint(&data), "refused for lack of space");
    assert!(
        dir_names(&small.path).is_empty(),
        "nothing was written to the small filesystem"
    );
    assert!(!tmp.path().join("data.backup").exists());
    drop(small);
}

/// A backup whose name sorts after ours (taken before the clock was set
/// back, say) must not make the prune remove the backup this run just took
/// and announced.
#[test]
fn pruning_never_removes_the_backup_just_taken() {
    let tmp = temp_dir("prune-order");
    let data = tmp.path().join("data");
    let member = Member::new("prune-order");
    fixture::build(FixtureSpec::small("3.3.25"), &data, &member, tmp.path());
    let root = tmp.path().join("backups");
    let future = SystemTime::now() + Duration::from_secs(3600);
    let stamp: String = humantime::format_rfc3339_millis(future)
        .to_string()
        .chars()
        .filter(|c| *c != '-' && *c != ':')
        .collect();
    let later_named = root.join(format!("{stamp}-3.5.16-etcd3"));
    std::fs::create_dir_all(&later_named).expect("mkdir the later-named backup");
    write_version_txt(&later_named, "3.5.16/etcd3");

    let run = Migration::new("3.4.23", &data, &member)
        .bundled(BUNDLE)
        .arg("--backup")
        .arg("always")
        .arg("--backup-keep")
        .arg("1")
        .arg("--backup-dir")
        .arg(&root)
        .run();
    run.assert_code(0);
    let taken = backup_taken(&run).expect("--backup always takes one");
    assert!(
        taken.exists(),
        "the backup this run took and logged ({}) was pruned; kept: {:?}\n{}",
        taken.display(),
        dir_names(&root),
        run.explain()
    );
    let name = taken
        .file_name()
        .expect("name")
        .to_string_lossy()
        .into_owned();
    assert_eq!(dir_names(&root), [name]);
}
