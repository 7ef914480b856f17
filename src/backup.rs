//! This module owns backups of the data dir: a full copy next to it (never
//! inside it), complete or absent after a crash, named with the time and
//! the version it holds, pruned to the newest N, with a free-space check
//! before the copy starts and the exact command that restores it.

use std::collections::BTreeMap;
use std::fs::{self, DirBuilder, File};
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use crate::datadir::{VERSION_TEMP_FILE, WORK_DIR};
use crate::version::VersionPair;

/// When to take a backup.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BackupMode {
    /// Before the first destructive step of a run (storage migration, any
    /// rollback): steps that rewrite the data rather than run a newer etcd
    /// on it.
    #[default]
    Destructive,
    /// Before the first step of any migration.
    Always,
    /// Never (the operator has their own).
    Never,
}

/// Where and how many backups are kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackupPolicy {
    /// When.
    pub mode: BackupMode,
    /// The directory that holds them (default `<data-dir>.backup`).
    pub root: PathBuf,
    /// How many to keep, newest first.
    pub keep: usize,
}

/// Why a backup could not be taken or pruned.
#[derive(Debug, thiserror::Error)]
pub enum BackupError {
    /// Not enough free space for the copy (and scratch space).
    #[error("not enough free space on the filesystem of {root} for {what}: {need} bytes are needed (the data dir holds {size} bytes; copies plus a margin), {have} are free; free space there, point --backup-dir at a larger filesystem, or pass --backup never if you have your own backup")]
    NoSpace {
        /// A path on the filesystem that is short.
        root: PathBuf,
        /// What needs the space.
        what: String,
        /// Bytes of the data dir.
        size: u64,
        /// Bytes needed.
        need: u64,
        /// Bytes free.
        have: u64,
    },
    /// The backup root is inside the data dir.
    #[error("backup dir {root} is inside the data dir {data_dir}; backups must live outside it")]
    Inside {
        /// The backup root.
        root: PathBuf,
        /// The data dir.
        data_dir: PathBuf,
    },
    /// The filesystem ran out of space or inodes during a copy (the free
    /// space check passed, but something else filled it, or it has too few
    /// inodes).
    #[error("the filesystem holding {path} is full ({op}: {source}); the partial copy was removed; free space (or inodes) there, or point --backup-dir at a larger filesystem, or pass --backup never if you have your own backup")]
    Full {
        /// What was being done.
        op: &'static str,
        /// The file or dir being written.
        path: PathBuf,
        /// The OS error (ENOSPC or EDQUOT).
        #[source]
        source: io::Error,
    },
    /// An I/O operation failed.
    #[error("{op} {path}: {source}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// On what.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
}

impl std::str::FromStr for BackupMode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "destructive" => Ok(BackupMode::Destructive),
            "always" => Ok(BackupMode::Always),
            "never" => Ok(BackupMode::Never),
            _ => Err("expected destructive, always or never".to_string()),
        }
    }
}

fn io_err<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> BackupError + 'a {
    move |source| {
        let path = path.to_path_buf();
        let full = matches!(
            source.raw_os_error(),
            Some(code) if code == nix::libc::ENOSPC || code == nix::libc::EDQUOT
        );
        if full {
            BackupError::Full { op, path, source }
        } else {
            BackupError::Io { op, path, source }
        }
    }
}

/// Entries of the data dir a backup leaves out: our own scratch space.
const SKIPPED: [&str; 2] = [WORK_DIR, VERSION_TEMP_FILE];

/// Prefix of a backup being written; a crash leaves it, the next prune
/// removes it.
const TEMP_PREFIX: &str = ".tmp-";

/// Bytes of regular files under `path` (what a copy needs).
pub fn tree_size(path: &Path) -> Result<u64, BackupError> {
    let mut total = 0;
    for entry in fs::read_dir(path).map_err(io_err("list", path))? {
        let entry = entry.map_err(io_err("list", path))?;
        let meta = entry.metadata().map_err(io_err("stat", &entry.path()))?;
        if meta.is_dir() {
            total += tree_size(&entry.path())?;
        } else {
            total += meta.len();
        }
    }
    Ok(total)
}

/// Bytes free for an unprivileged writer on the filesystem of `path`.
pub fn free_space(path: &Path) -> Result<u64, BackupError> {
    let stat = nix::sys::statvfs::statvfs(path).map_err(|errno| BackupError::Io {
        op: "statvfs",
        path: path.to_path_buf(),
        source: io::Error::from(errno),
    })?;
    Ok((stat.blocks_available() as u64).saturating_mul(stat.fragment_size() as u64))
}

/// What a copy of `size` bytes needs: the bytes, plus 10 % and 16 MiB for
/// directory blocks and the filesystem's own reserve.
pub fn needed_for(size: u64) -> u64 {
    size + size / 10 + 16 * 1024 * 1024
}

/// Checks that a backup of `data_dir` fits under `root` (or, while `root`
/// does not exist yet, its nearest existing ancestor). Reads only.
pub fn check_space(data_dir: &Path, root: &Path) -> Result<u64, BackupError> {
    check_free_space(data_dir, Some(root), false)
}

/// Checks, before anything is touched, that the filesystems involved can
/// take a backup under `backup_root` (if any) and, with `scratch`, the
/// scratch copies a rebuilding step makes inside the data dir (a snapshot
/// and a restored copy: twice the data). Needs on one filesystem add up.
pub fn check_free_space(
    data_dir: &Path,
    backup_root: Option<&Path>,
    scratch: bool,
) -> Result<u64, BackupError> {
    use std::os::unix::fs::MetadataExt;
    let size = tree_size(data_dir)?;
    let mut needs: Vec<(PathBuf, &'static str, u64)> = Vec::new();
    if let Some(root) = backup_root {
        if root.starts_with(data_dir) {
            return Err(BackupError::Inside {
                root: root.to_path_buf(),
                data_dir: data_dir.to_path_buf(),
            });
        }
        let probe = root
            .ancestors()
            .find(|p| p.exists())
            .unwrap_or(Path::new("/"))
            .to_path_buf();
        needs.push((probe, "a backup", needed_for(size)));
    }
    if scratch {
        needs.push((
            data_dir.to_path_buf(),
            "the step's scratch copies",
            needed_for(2 * size),
        ));
    }
    let mut by_device: BTreeMap<u64, (PathBuf, Vec<&str>, u64)> = BTreeMap::new();
    for (probe, what, need) in needs {
        let dev = fs::metadata(&probe).map_err(io_err("stat", &probe))?.dev();
        let slot = by_device
            .entry(dev)
            .or_insert_with(|| (probe.clone(), Vec::new(), 0));
        slot.1.push(what);
        slot.2 += need;
    }
    for (_, (probe, whats, need)) in by_device {
        let have = free_space(&probe)?;
        if have < need {
            return Err(BackupError::NoSpace {
                root: probe,
                what: whats.join(" and "),
                size,
                need,
                have,
            });
        }
    }
    Ok(size)
}

/// The name of a backup: UTC time to the millisecond, then what it holds,
/// e.g. `20261122T110000.123Z-3.5.16-etcd3`. The stamp is fixed-width, so
/// sorting names sorts by time (with whole seconds only, two backups of
/// one second would sort by version instead).
pub fn backup_name(now: SystemTime, pair: VersionPair) -> String {
    let stamp: String = humantime::format_rfc3339_millis(now)
        .to_string()
        .chars()
        .filter(|c| *c != '-' && *c != ':')
        .collect();
    format!("{stamp}-{}-{}", pair.version, pair.storage)
}

/// The time part of a backup name, comparable across names with and
/// without milliseconds.
fn time_key(name: &str) -> String {
    let stamp = name.split('-').next().unwrap_or(name).trim_end_matches('Z');
    if stamp.contains('.') {
        stamp.to_string()
    } else {
        format!("{stamp}.000")
    }
}

/// Copies `data_dir` to a new backup under `policy.root` and prunes old
/// ones. The copy is written under a temp name, fsynced file by file and
/// dir by dir, then renamed into place: after a crash a backup is complete
/// or absent.
pub fn create(
    data_dir: &Path,
    policy: &BackupPolicy,
    pair: VersionPair,
    now: SystemTime,
) -> Result<PathBuf, BackupError> {
    check_space(data_dir, &policy.root)?;
    DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&policy.root)
        .map_err(io_err("create backup dir", &policy.root))?;
    // Two backups in one millisecond: move the later one on by a
    // millisecond, so names stay unique and still sort by time.
    let mut when = now;
    let mut name = backup_name(when, pair);
    while policy.root.join(&name).exists()
        || policy.root.join(format!("{TEMP_PREFIX}{name}")).exists()
    {
        when += std::time::Duration::from_millis(1);
        name = backup_name(when, pair);
    }
    let temp = policy.root.join(format!("{TEMP_PREFIX}{name}"));
    if temp.exists() {
        fs::remove_dir_all(&temp).map_err(io_err("remove stale", &temp))?;
    }
    if let Err(err) = copy_tree(data_dir, &temp, true) {
        // Half a backup is no backup: never leave one to be mistaken for
        // it (a crash instead leaves the temp name, which the next backup
        // clears).
        let _ = fs::remove_dir_all(&temp);
        return Err(err);
    }
    crate::failpoint!("backup-before-publish");
    let target = policy.root.join(&name);
    // Publish the finished copy in one step: the rename is atomic, so a
    // reader (or a restore after a crash) never sees half a backup.
    fs::rename(&temp, &target).map_err(io_err("rename backup into place", &target))?;
    // The rename lives in the backup root's directory entries: without this
    // fsync a power loss could lose the published name.
    fsync(&policy.root)?;
    crate::failpoint!("backup-after-publish");
    prune(&policy.root, policy.keep, &target)?;
    Ok(target)
}

/// Copies the directory tree `from` to the new directory `to`, durably
/// (for a step's scratch copy).
pub fn copy_dir(from: &Path, to: &Path) -> Result<(), BackupError> {
    copy_tree(from, to, false)
}

/// Copies a directory tree, keeping modes; every file and directory is
/// fsynced so the copy is durable before it is published.
fn copy_tree(from: &Path, to: &Path, top: bool) -> Result<(), BackupError> {
    let meta = fs::metadata(from).map_err(io_err("stat", from))?;
    // A backup's top dir is private whatever the data dir's mode (the
    // Kubernetes tool made data dirs 0755): it holds the whole keyspace.
    let mode = if top { 0o700 } else { meta.mode() & 0o7777 };
    DirBuilder::new()
        .mode(mode)
        .create(to)
        .map_err(io_err("create", to))?;
    fs::set_permissions(to, fs::Permissions::from_mode(mode)).map_err(io_err("chmod", to))?;
    for entry in fs::read_dir(from).map_err(io_err("list", from))? {
        let entry = entry.map_err(io_err("list", from))?;
        let name = entry.file_name();
        if top && SKIPPED.iter().any(|s| name == *s) {
            continue;
        }
        let source = entry.path();
        let dest = to.join(&name);
        let file_type = entry.file_type().map_err(io_err("stat", &source))?;
        if file_type.is_dir() {
            copy_tree(&source, &dest, false)?;
        } else if file_type.is_symlink() {
            let link = fs::read_link(&source).map_err(io_err("read link", &source))?;
            std::os::unix::fs::symlink(&link, &dest).map_err(io_err("create link", &dest))?;
        } else {
            fs::copy(&source, &dest).map_err(io_err("copy into", &dest))?;
            // Durable before the backup is published by the rename.
            fsync(&dest)?;
            if top {
                // Half a backup on disk: the first file is in, the rest not.
                crate::failpoint!("backup-after-first-file");
            }
        }
    }
    // The directory's own entries, durable likewise.
    fsync(to)
}

fn fsync(path: &Path) -> Result<(), BackupError> {
    File::open(path)
        .and_then(|f| f.sync_all())
        .map_err(io_err("fsync", path))
}

/// The backups under `root`, oldest first.
pub fn list(root: &Path) -> Result<Vec<PathBuf>, BackupError> {
    let mut names: Vec<String> = Vec::new();
    let entries = match fs::read_dir(root) {
        Ok(entries) => entries,
        Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(err) => return Err(io_err("list", root)(err)),
    };
    for entry in entries {
        let entry = entry.map_err(io_err("list", root))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.starts_with(TEMP_PREFIX) && name.as_bytes().first().is_some_and(u8::is_ascii_digit)
        {
            names.push(name);
        }
    }
    names.sort_by_key(|name| (time_key(name), name.clone()));
    Ok(names.into_iter().map(|n| root.join(n)).collect())
}

/// Removes all but the newest `keep` backups, and any half-written one;
/// `just_taken` is always kept (and counts as one of them).
pub fn prune(root: &Path, keep: usize, just_taken: &Path) -> Result<Vec<PathBuf>, BackupError> {
    let mut removed = Vec::new();
    for entry in fs::read_dir(root).map_err(io_err("list", root))? {
        let entry = entry.map_err(io_err("list", root))?;
        if entry.file_name().to_string_lossy().starts_with(TEMP_PREFIX) {
            fs::remove_dir_all(entry.path()).map_err(io_err("remove", &entry.path()))?;
            removed.push(entry.path());
        }
    }
    let backups: Vec<PathBuf> = list(root)?
        .into_iter()
        .filter(|b| b != just_taken)
        .collect();
    let excess = backups.len().saturating_sub(keep.max(1) - 1);
    for old in &backups[..excess] {
        // Unpublish first: renamed to a temp name (and the rename made
        // durable), a backup that a crash cuts off mid-delete is never
        // found half-deleted under its published name; the next prune
        // clears the temp name.
        let name = old.file_name().map(|n| n.to_string_lossy().into_owned());
        let doomed = root.join(format!("{TEMP_PREFIX}{}", name.unwrap_or_default()));
        fs::rename(old, &doomed).map_err(io_err("unpublish old backup", old))?;
        fsync(root)?;
        fs::remove_dir_all(&doomed).map_err(io_err("remove old backup", &doomed))?;
        removed.push(old.clone());
    }
    Ok(removed)
}

/// A shell command that puts `backup` back as the content of `data_dir`
/// (content, not the dir itself: the data dir is often a mount point).
/// Run it with etcd stopped.
pub fn restore_command(data_dir: &Path, backup: &Path) -> String {
    let quote = |p: &Path| format!("'{}'", p.display().to_string().replace('\'', r"'\''"));
    format!(
        "find {data} -mindepth 1 -maxdepth 1 -exec rm -rf {{}} + && cp -a {backup}/. {data}/",
        data = quote(data_dir),
        backup = quote(backup)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, UNIX_EPOCH};

    fn pair(s: &str) -> VersionPair {
        s.parse().expect("pair")
    }

    fn sample_data(dir: &Path) {
        fs::create_dir_all(dir.join("member/snap")).expect("mkdir");
        fs::create_dir_all(dir.join("member/wal")).expect("mkdir");
        fs::write(dir.join("member/snap/db"), vec![7u8; 50_000]).expect("write");
        fs::write(dir.join("member/wal/0.wal"), b"wal").expect("write");
        fs::write(dir.join("version.txt"), "3.5.16/etcd3").expect("write");
        fs::set_permissions(dir, fs::Permissions::from_mode(0o700)).expect("chmod");
        fs::create_dir_all(dir.join(WORK_DIR)).expect("mkdir");
    }

    #[test]
    fn names_sort_by_time_and_say_what_they_hold() {
        let t = UNIX_EPOCH + Duration::from_secs(1_795_000_000);
        let name = backup_name(t, pair("3.5.16/etcd3"));
        assert!(name.ends_with("Z-3.5.16-etcd3"), "{name}");
        assert_eq!(name.len(), "20261122T110000.000Z-3.5.16-etcd3".len());
        // Within one second, time still orders them, not the version.
        let later = backup_name(t + Duration::from_millis(1), pair("3.3.25/etcd2"));
        assert!(time_key(&later) > time_key(&name));
        assert!(
            time_key("20261122T110000Z-3.5.16-etcd3")
                < time_key("20261122T110000.001Z-3.3.25-etcd3")
        );
    }

    #[test]
    fn pruning_keeps_the_backup_just_taken() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let data = tmp.path().join("data");
        sample_data(&data);
        let policy = BackupPolicy {
            mode: BackupMode::Always,
            root: tmp.path().join("b"),
            keep: 1,
        };
        let t = UNIX_EPOCH + Duration::from_secs(1_795_000_000);
        create(&data, &policy, pair("3.5.16/etcd3"), t).expect("first");
        let second = create(&data, &policy, pair("3.3.25/etcd3"), t).expect("same millisecond");
        assert_eq!(list(&policy.root).expect("list"), vec![second]);
    }

    #[test]
    fn backup_is_a_durable_copy_and_old_ones_are_pruned() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let data = tmp.path().join("data");
        sample_data(&data);
        let policy = BackupPolicy {
            mode: BackupMode::Always,
            root: tmp.path().join("data.backup"),
            keep: 2,
        };
        let t0 = UNIX_EPOCH + Duration::from_secs(1_795_000_000);
        let first = create(&data, &policy, pair("3.5.16/etcd3"), t0).expect("backup");
        assert_eq!(
            fs::read(first.join("member/snap/db")).expect("read").len(),
            50_000
        );
        assert_eq!(
            fs::read_to_string(first.join("version.txt")).expect("read"),
            "3.5.16/etcd3"
        );
        assert!(
            !first.join(WORK_DIR).exists(),
            "scratch space is not backed up"
        );
        assert_eq!(fs::metadata(&first).expect("stat").mode() & 0o777, 0o700);
        assert_eq!(
            fs::metadata(&policy.root).expect("stat").mode() & 0o777,
            0o700
        );
        // A crash mid-copy leaves a temp dir; the next backup clears it.
        fs::create_dir_all(policy.root.join(".tmp-20000101T000000Z-3.3.25-etcd3")).expect("mkdir");
        let second = create(&data, &policy, pair("3.5.16/etcd3"), t0).expect("same second");
        assert_ne!(first, second);
        let third = create(
            &data,
            &policy,
            pair("3.4.23/etcd3"),
            t0 + Duration::from_secs(5),
        )
        .expect("backup");
        assert_eq!(list(&policy.root).expect("list"), vec![second, third]);
        assert!(!policy
            .root
            .join(".tmp-20000101T000000Z-3.3.25-etcd3")
            .exists());
    }

    #[test]
    fn restore_command_puts_the_backup_back() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let data = tmp.path().join("da'ta");
        sample_data(&data);
        let policy = BackupPolicy {
            mode: BackupMode::Always,
            root: tmp.path().join("b"),
            keep: 3,
        };
        let backup =
            create(&data, &policy, pair("3.5.16/etcd3"), SystemTime::now()).expect("backup");
        fs::write(data.join("member/snap/db"), b"changed").expect("write");
        fs::write(data.join("stray"), b"x").expect("write");
        let status = std::process::Command::new("sh")
            .arg("-c")
            .arg(restore_command(&data, &backup))
            .status()
            .expect("sh");
        assert!(status.success());
        assert_eq!(
            fs::read(data.join("member/snap/db")).expect("read").len(),
            50_000
        );
        assert!(!data.join("stray").exists());
    }

    #[test]
    fn a_backup_inside_the_data_dir_is_refused() {
        let tmp = tempfile::tempdir().expect("tempdir");
        sample_data(tmp.path());
        let err = check_space(tmp.path(), &tmp.path().join("b")).expect_err("inside");
        assert!(err.to_string().contains("inside the data dir"), "{err}");
    }
}
