//! Backups before destructive steps, on real etcd: retention of the newest
//! `--backup-keep`, names and modes, the manifest `sha256sum -c` accepts,
//! the logged restore command bringing the pre-rollback data back, the
//! free-space check refusing a backup that cannot fit, pruning never
//! taking the backup just made nor another data dir's, a backup dir inside
//! the data dir however its path is spelled, and a data dir whose
//! `member/` (and `member/wal`) are symlinks backed up as their content;
//! a retired data dir backed up by hard links where a copy cannot fit,
//! and one whose links cross two mounts of its filesystem, copied until
//! the disk is full and then removed.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, SystemTime};

use serde_json::Value;

use crate::harness::etcd::{probe, EtcdProcess};
use crate::harness::fixture::{self, FixtureSpec};
use crate::harness::keyspace::read_back;
use crate::harness::migrator::{field, run_logged, Migration, Outcome};
use crate::harness::mount::Mount;
use crate::harness::tree::fingerprint;
use crate::harness::{
    block_on, dir_names, free_port, mode, read_version_txt, set_mode, symlink, temp_dir,
    wait_until, write_version_txt, Member, WORK_DIR,
};

const BUNDLE: &str = "3.3.25,3.4.23,3.5.16";

/// How long an etcd started by the test may take to serve.
const SERVE_TIMEOUT: Duration = Duration::from_secs(60);

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
        assert_copy_logged(run, path);
        PathBuf::from(path)
    })
}

/// The backup's `copy done` line says how it was copied (issue 12): the
/// methods, bytes and time, for the backup just taken.
fn assert_copy_logged(run: &Outcome, backup: &str) {
    let copies = run.lines_with("copy done");
    let line = copies
        .iter()
        .find(|line| field(line, "what") == Some("backup"))
        .unwrap_or_else(|| panic!("no 'copy done what=backup' line\n{}", run.explain()));
    assert_eq!(field(line, "to"), Some(backup), "{line}");
    let method = field(line, "method").unwrap_or_default();
    assert!(
        ["reflink", "copy_file_range", "read/write"]
            .iter()
            .any(|m| method.starts_with(m)),
        "{line}"
    );
    let bytes: u64 = field(line, "bytes")
        .and_then(|b| b.parse().ok())
        .unwrap_or(0);
    assert!(bytes > 0, "{line}");
    assert!(field(line, "ms").is_some(), "{line}");
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

/// Asserts `backup` verifies with `sha256sum -c MANIFEST.sha256` (run in
/// it, as the logged `verify` command does) and names `data` as its source.
fn assert_verifies(backup: &Path, data: &Path) {
    let output = Command::new("sha256sum")
        .args(["--strict", "-c", "MANIFEST.sha256"])
        .current_dir(backup)
        .output()
        .unwrap_or_else(|err| panic!("run sha256sum in {}: {err}", backup.display()));
    assert!(
        output.status.success(),
        "sha256sum -c in {} failed: {}{}",
        backup.display(),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    let listed = String::from_utf8_lossy(&output.stdout);
    assert!(
        listed.contains("version.txt: OK") && listed.contains("member/snap/db: OK"),
        "the manifest lists the data: {listed}"
    );
    let source = std::fs::read_to_string(backup.join("SOURCE"))
        .unwrap_or_else(|err| panic!("read SOURCE of {}: {err}", backup.display()));
    let canonical = std::fs::canonicalize(data).expect("canonical data dir");
    assert_eq!(
        source.trim_end_matches('\n'),
        canonical.display().to_string()
    );
}

#[test]
fn backups_are_kept_newest_first_up_to_backup_keep() {
    let tmp = temp_dir("retention");
    let data = tmp.path().join("data");
    let member = Member::new("retention");
    fixture::build(FixtureSpec::small("3.4.23"), &data, &member, tmp.path());
    let root = tmp.path().join("data.backup");
    // A backup the release before SOURCE existed left in the default root:
    // this data dir's, so it counts and, oldest, goes first.
    let legacy = root.join("20000101T000000Z-3.4.23-etcd3");
    std::fs::create_dir_all(&legacy).expect("mkdir the legacy backup");
    write_version_txt(&legacy, "3.4.23/etcd3");
    set_mode(&root, 0o700);
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
    assert!(!legacy.exists(), "the default root's legacy backup counted");
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
        assert_verifies(&backup, &data);
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

    assert!(
        restore.starts_with("etcd-migrate backup restore "),
        "the image has no sha256sum: the logged restore is our own command, not {restore:?}"
    );

    // Into a member that is serving: refused before anything is written
    // (etcd itself writes its WAL meanwhile, so the files are not compared).
    let etcd = EtcdProcess::start("3.3.25", &member, &data, free_port(), tmp.path());
    wait_until("etcd 3.3.25 serves the data", SERVE_TIMEOUT, || {
        block_on(probe(etcd.endpoint())).ok()
    });
    let refused = run_logged(restore, tmp.path());
    let said = String::from_utf8_lossy(&refused.stderr).into_owned();
    assert_eq!(refused.status.code(), Some(2), "{said}");
    assert!(
        said.contains("restore only into a stopped member"),
        "{said}"
    );
    etcd.stop();
    assert_eq!(read_version_txt(&data), "3.3.25/etcd3");
    assert!(
        !data.join(WORK_DIR).exists(),
        "a refused restore made a scratch dir"
    );

    let output = run_logged(restore, tmp.path());
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

/// A retired data dir (a pause job's joiner's, never opened again) is
/// backed up by hard links: on a filesystem with less room than a copy
/// needs, the copy is refused and the links are taken, sharing the data's
/// inodes, the manifest vouching for them, the data dir keeping every
/// file.
#[test]
fn a_retired_data_dir_is_backed_up_by_links_where_a_copy_cannot_fit() {
    use etcd_migrate::backup::{self, BackupError, BackupMode, BackupPolicy, Source};
    use std::os::unix::fs::MetadataExt;

    let tmp = temp_dir("retired-links");
    let small = Mount::tmpfs(&tmp.path().join("small"), "size=4m");
    let data = small.path.join("data");
    std::fs::create_dir_all(data.join("member/snap")).expect("mkdir");
    std::fs::create_dir_all(data.join("member/wal")).expect("mkdir");
    let db = data.join("member/snap/db");
    std::fs::write(&db, vec![7u8; 1 << 20]).expect("write db");
    std::fs::write(data.join("member/wal/0.wal"), b"wal").expect("write wal");
    write_version_txt(&data, "3.4.23/etcd3");
    let policy = BackupPolicy {
        mode: BackupMode::Always,
        root: small.path.join("data.backup"),
        keep: 3,
    };
    let pair = "3.4.23/etcd3".parse().expect("pair");
    let now = SystemTime::now();
    let copied = backup::publish(&data, &policy, pair, now, &backup::never_stop, Source::Kept);
    assert!(
        matches!(copied, Err(BackupError::NoSpace { .. })),
        "a copy needs more than the 4 MiB filesystem has: {copied:?}"
    );
    let linked = backup::publish(
        &data,
        &policy,
        pair,
        now,
        &backup::never_stop,
        Source::Retired,
    )
    .expect("the links need no room");
    let ino = |p: &Path| std::fs::metadata(p).expect("stat").ino();
    assert_eq!(
        ino(&linked.join("member/snap/db")),
        ino(&db),
        "a link, not a copy"
    );
    backup::tool::verify(&linked).expect("the manifest holds");
    assert_eq!(std::fs::read(&db).expect("read").len(), 1 << 20);
    drop(small);
}

/// A retired data dir whose backup dir is a second mount of the data's
/// filesystem: the two report one device, so no room is asked for, but
/// `link(2)` across the mounts fails with EXDEV and each file is copied.
/// A copy that meets the full disk stops there: `BackupError::Full`, the
/// partial backup removed (the filesystem's room back), the data dir
/// keeping every file.
#[test]
fn a_retired_backup_whose_links_cross_mounts_and_fill_the_disk_stops_clean() {
    use etcd_migrate::backup::{self, BackupError, BackupMode, BackupPolicy, Source};
    use std::os::unix::fs::MetadataExt;

    let tmp = temp_dir("retired-full");
    let small = Mount::tmpfs(&tmp.path().join("small"), "size=4m");
    let data = small.path.join("data");
    std::fs::create_dir_all(data.join("member/snap")).expect("mkdir");
    std::fs::create_dir_all(data.join("member/wal")).expect("mkdir");
    let db = data.join("member/snap/db");
    let content: Vec<u8> = (0..(5u32 << 19)).map(|i| (i % 251) as u8).collect();
    std::fs::write(&db, &content).expect("write db");
    std::fs::write(data.join("member/wal/0.wal"), b"wal").expect("write wal");
    write_version_txt(&data, "3.4.23/etcd3");
    let before = fingerprint(&data);
    let backups = small.path.join("backups");
    std::fs::create_dir(&backups).expect("mkdir");
    let second = Mount::bind(&backups, &tmp.path().join("second"));
    let dev = |p: &Path| std::fs::metadata(p).expect("stat").dev();
    assert_eq!(dev(&second.path), dev(&data), "one filesystem, two mounts");
    let free = || {
        nix::sys::statvfs::statvfs(&small.path)
            .expect("statvfs")
            .blocks_available()
    };
    let free_before = free();

    let policy = BackupPolicy {
        mode: BackupMode::Always,
        root: second.path.join("data.backup"),
        keep: 3,
    };
    let pair = "3.4.23/etcd3".parse().expect("pair");
    let result = backup::publish(
        &data,
        &policy,
        pair,
        SystemTime::now(),
        &backup::never_stop,
        Source::Retired,
    );
    let err = result.expect_err("a 2.5 MiB copy beside 2.5 MiB on 4 MiB cannot fit");
    assert!(matches!(err, BackupError::Full { .. }), "{err:?}");
    let message = err.to_string();
    assert!(
        message.contains("the partial copy was removed") && message.contains("--backup-dir"),
        "{message}"
    );
    let left: Vec<PathBuf> = walkdir(&second.path);
    assert!(left.is_empty(), "no partial backup is left: {left:?}");
    assert_eq!(free(), free_before, "the partial copy's room is back");
    before.assert_unchanged(&fingerprint(&data), "a backup that could not fit");
    assert_eq!(std::fs::read(&db).expect("read"), content);
    drop(second);
    drop(small);
}

/// Every file under `dir`, however deep.
fn walkdir(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir)
        .expect("list")
        .map(|e| e.expect("entry"))
    {
        let path = entry.path();
        if entry.file_type().expect("type").is_dir() {
            files.extend(walkdir(&path));
        } else {
            files.push(path);
        }
    }
    files
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
    // This data dir's, as its SOURCE says, so it counts against the keep.
    let canonical = std::fs::canonicalize(&data).expect("canonical data dir");
    std::fs::write(
        later_named.join("SOURCE"),
        format!("{}\n", canonical.display()),
    )
    .expect("write SOURCE");

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

/// Two data dirs sharing one `--backup-dir` (with `--backup-keep 1`) each
/// prune only their own backups; a backup without `SOURCE` there (an older
/// release's, whoever's it was) is left alone.
#[test]
fn two_data_dirs_sharing_a_backup_dir_prune_only_their_own() {
    let tmp = temp_dir("shared-backups");
    let shared = tmp.path().join("shared");
    let legacy = shared.join("20000101T000000Z-3.4.23-etcd3");
    std::fs::create_dir_all(&legacy).expect("mkdir the legacy backup");
    write_version_txt(&legacy, "3.4.23/etcd3");
    let dirs: Vec<(PathBuf, Member)> = ["a", "b"]
        .iter()
        .map(|tag| {
            let data = tmp.path().join(format!("data-{tag}"));
            let member = Member::new(&format!("shared-{tag}"));
            fixture::build(FixtureSpec::small("3.4.23"), &data, &member, tmp.path());
            (data, member)
        })
        .collect();
    let run = |(data, member): &(PathBuf, Member), target: &str, extra: &[&str]| {
        let mut migration = Migration::new(target, data, member)
            .bundled(BUNDLE)
            .arg("--backup-dir")
            .arg(&shared)
            .arg("--backup-keep")
            .arg("1");
        for arg in extra {
            migration = migration.arg(*arg);
        }
        let run = migration.run();
        run.assert_code(0);
        backup_taken(&run).unwrap_or_else(|| panic!("a backup\n{}", run.explain()))
    };

    let a1 = run(&dirs[0], "3.3.25", &[]);
    let b1 = run(&dirs[1], "3.3.25", &[]);
    assert!(a1.exists(), "b's prune removed a's backup {}", a1.display());
    let a2 = run(&dirs[0], "3.4.23", &["--backup", "always"]);
    assert!(!a1.exists(), "a's own older backup is pruned");
    assert!(b1.exists() && a2.exists() && legacy.exists());
    let mut expected: Vec<String> = [&legacy, &b1, &a2]
        .iter()
        .map(|p| p.file_name().expect("name").to_string_lossy().into_owned())
        .collect();
    expected.sort();
    assert_eq!(dir_names(&shared), expected);
    assert_verifies(&b1, &dirs[1].0);
    assert_verifies(&a2, &dirs[0].0);
}

/// A backup dir that is inside the data dir, named through a symlink, a
/// relative path or `..`, passed a textual check and the copy filled the
/// disk with copies of itself. Resolved paths are compared now: refused
/// with exit 2 before anything runs.
#[test]
fn a_backup_dir_inside_the_data_dir_by_any_spelling_is_refused_untouched() {
    let tmp = temp_dir("inside");
    let data = tmp.path().join("data");
    let member = Member::new("inside");
    fixture::build(FixtureSpec::small("3.4.23"), &data, &member, tmp.path());
    symlink(&data, &tmp.path().join("link"));
    let before = fingerprint(&data);
    let program = PathBuf::from(env!("CARGO_BIN_EXE_etcd-migrate"));
    let cases: [(&str, PathBuf, bool); 3] = [
        ("through a symlink", tmp.path().join("link/backups"), false),
        (
            "through ..",
            tmp.path().join("nowhere/../data/backups"),
            false,
        ),
        // Relative to the working directory, which is the temp dir.
        ("relative", PathBuf::from("data/backups"), true),
    ];
    for (name, root, relative) in cases {
        let mut migration = Migration::new("3.3.25", &data, &member)
            .bundled(BUNDLE)
            .arg("--backup-dir")
            .arg(&root);
        if relative {
            migration = migration.launched_by(
                ["env".into(), "-C".into(), tmp.path().as_os_str().to_owned()],
                &program,
            );
        }
        let run = migration.run();
        // A relative --backup-dir is shown as the absolute path it names.
        let shown = if relative {
            tmp.path().join(&root)
        } else {
            root.clone()
        };
        run.assert_refused_untouched(
            &data,
            &before,
            &[
                &format!("backup dir {} is inside the data dir", shown.display()),
                "point --backup-dir outside the data dir",
            ],
        );
        println!("{name}: {}", run.last_line());
    }
}

/// A data dir whose `member/` is a symlink (and `member/wal` inside it
/// another, to a second disk) was backed up as the symlink: the "backup"
/// pointed at the data it was to protect. It now holds the content,
/// verifies, and its restore command gives back data the old release
/// serves as it was.
#[test]
fn a_symlinked_member_dir_is_backed_up_as_its_content() {
    let tmp = temp_dir("linked-member");
    let built = tmp.path().join("built");
    let member = Member::new("linked-member");
    let fixture = fixture::build(FixtureSpec::small("3.4.23"), &built, &member, tmp.path());
    // data/member -> disk/member, disk/member/wal -> wal-disk/wal.
    let data = tmp.path().join("data");
    std::fs::create_dir(&data).expect("mkdir data");
    set_mode(&data, 0o700);
    std::fs::rename(built.join("version.txt"), data.join("version.txt")).expect("mv version.txt");
    let disk = tmp.path().join("disk");
    std::fs::create_dir(&disk).expect("mkdir disk");
    std::fs::rename(built.join("member"), disk.join("member")).expect("mv member");
    let wal_disk = tmp.path().join("wal-disk");
    std::fs::create_dir(&wal_disk).expect("mkdir wal disk");
    std::fs::rename(disk.join("member/wal"), wal_disk.join("wal")).expect("mv wal");
    symlink(&wal_disk.join("wal"), &disk.join("member/wal"));
    symlink(&disk.join("member"), &data.join("member"));

    let run = Migration::new("3.5.16", &data, &member)
        .bundled(BUNDLE)
        .arg("--backup")
        .arg("always")
        .arg("--log-format")
        .arg("json")
        .run();
    run.assert_code(0);
    let lines = run.json_lines();
    let taken = lines
        .iter()
        .find(|line| line.get("msg").and_then(Value::as_str) == Some("backup taken"))
        .unwrap_or_else(|| panic!("no backup taken line\n{}", run.explain()));
    let backup = PathBuf::from(taken.get("path").and_then(Value::as_str).expect("path"));
    for dir in ["member", "member/wal", "member/snap"] {
        let meta = std::fs::symlink_metadata(backup.join(dir)).expect("stat");
        assert!(
            meta.is_dir(),
            "{dir} in the backup is a directory, not a link"
        );
    }
    assert_verifies(&backup, &data);

    let restore = taken
        .get("restore")
        .and_then(Value::as_str)
        .expect("restore command");
    let output = run_logged(restore, tmp.path());
    assert!(
        output.status.success(),
        "{restore:?}: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(read_version_txt(&data), "3.4.23/etcd3");
    assert_eq!(dir_names(&data), ["member", "version.txt"]);
    // The baseline read (3.4.23 serving the data once) came before the
    // backup: its health write is in it.
    let after = read_back("3.4.23", &member, &data, tmp.path());
    after.assert_kept(&fixture.keyspace, 3000);
}
