//! This module owns backups of the data dir: a full copy next to it (never
//! inside it, however its path is spelled), holding the content behind
//! every symlink in the data dir, complete or absent after a crash,
//! verifiable (`MANIFEST.sha256`, checked before the copy is published),
//! marked with the data dir it came from (`SOURCE`), named with the time
//! and the version it holds, and pruned to the newest N of this data dir's
//! own; the checks before a run (where the copy goes, what the data dir's
//! links lead to, a writable backup dir, free space); `tool` the
//! operator's commands that list, verify and restore them. A copy stops
//! between files and
//! between chunks when a termination signal comes, and removes itself.

use std::collections::{BTreeMap, HashMap};
use std::ffi::{OsStr, OsString};
use std::fs::{self, DirBuilder, File, Metadata, OpenOptions};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use nix::sys::signal::Signal;
use sha2::{Digest, Sha256};

use crate::datadir::{VERSION_TEMP_FILE, WORK_DIR};
use crate::durable::{self, DurableError};
use crate::log;
use crate::version::VersionPair;

pub mod copy;
pub mod tool;

/// When to take a backup (`--backup`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
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

/// The file in each backup that lists every file it holds with its
/// SHA-256, in `sha256sum` format: `cd <backup> && sha256sum -c
/// MANIFEST.sha256` verifies it.
pub const MANIFEST_FILE: &str = "MANIFEST.sha256";

/// The file in each backup that names the data dir it came from (its
/// canonical path): pruning removes only this data dir's backups.
pub const SOURCE_FILE: &str = "SOURCE";

/// Answers whether a termination signal has come (and which), so a long
/// copy can stop between files and between chunks.
pub type StopCheck<'a> = &'a dyn Fn() -> Option<Signal>;

/// A [`StopCheck`] for copies nothing can interrupt (tests).
pub fn never_stop() -> Option<Signal> {
    None
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
    /// The backup root is inside the data dir (compared as resolved paths:
    /// symlinks, `..` and relative paths do not hide it).
    #[error("backup dir {root} is inside the data dir {data_dir} (resolved: {resolved_root} is under {resolved_data}); a backup would copy itself until the disk fills: point --backup-dir outside the data dir")]
    Inside {
        /// The backup root, as given.
        root: PathBuf,
        /// The data dir, as given.
        data_dir: PathBuf,
        /// The backup root, resolved.
        resolved_root: PathBuf,
        /// The data dir, resolved.
        resolved_data: PathBuf,
    },
    /// A symlink (or a mount) in the data dir leads to a directory that
    /// holds the copy's destination.
    #[error("{path} in the data dir is {how}, which contains {destination}; the copy would copy itself: replace the link with the directory it names, or point --backup-dir elsewhere")]
    LeadsToCopy {
        /// The link (or mounted dir) in the data dir.
        path: PathBuf,
        /// "a symlink to `<target>`", or "a directory" (a bind mount).
        how: String,
        /// The backup dir or scratch dir it contains.
        destination: String,
    },
    /// A symlink (or a bind mount) in the data dir leads back to a directory
    /// above it.
    #[error("{path} in the data dir is {how}, a directory that contains it (a loop); a copy would never end: remove or fix the link")]
    Loop {
        /// The link (or dir) in the data dir.
        path: PathBuf,
        /// "a symlink to `<target>`", or "a mount of a directory above it".
        how: String,
    },
    /// A symlink in the data dir that cannot be followed.
    #[error("symlink {link} in the data dir points to {target}, which cannot be read ({source}); a backup must hold the content behind every link: fix or remove the link, or pass --backup never if you have your own backup")]
    Dangling {
        /// The link.
        link: PathBuf,
        /// What it points to.
        target: PathBuf,
        /// Why it cannot be followed.
        #[source]
        source: io::Error,
    },
    /// Something in the data dir that is neither a file nor a directory.
    #[error("{path} in the data dir is a {kind}, neither a file nor a directory; a copy cannot hold it: move it out of the data dir, or pass --backup never if you have your own backup")]
    Special {
        /// The entry.
        path: PathBuf,
        /// What it is.
        kind: &'static str,
    },
    /// The data dir holds an entry named like a backup's own files.
    #[error("{path} is in the data dir, but every backup keeps its own {name} there (a restore never copies it back); move it out of the data dir")]
    Reserved {
        /// The entry.
        path: PathBuf,
        /// The reserved name.
        name: &'static str,
    },
    /// The backup dir (or where it would be created) cannot be written.
    #[error("backup dir {root} cannot be written: {detail}; {fix}, point --backup-dir at a writable place, or pass --backup never if you have your own backup")]
    NotWritable {
        /// The backup root, as given.
        root: PathBuf,
        /// What the probe found.
        detail: String,
        /// What would make it writable.
        fix: String,
    },
    /// The copy did not hold what was copied into it.
    #[error(
        "the copy in {path} is not complete ({detail}); it was removed and nothing was published"
    )]
    Incomplete {
        /// The unpublished copy.
        path: PathBuf,
        /// What is missing or short.
        detail: String,
    },
    /// A termination signal stopped the copy.
    #[error("stopped by {signal} while copying to {path}; the partial copy was removed")]
    Interrupted {
        /// The signal.
        signal: Signal,
        /// The unpublished copy.
        path: PathBuf,
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

fn io_err<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> BackupError + 'a {
    move |source| {
        let path = path.to_path_buf();
        if durable::is_no_space(&source) {
            BackupError::Full { op, path, source }
        } else {
            BackupError::Io { op, path, source }
        }
    }
}

/// Entries of the data dir a backup leaves out: our own scratch space.
const SKIPPED: [&str; 2] = [WORK_DIR, VERSION_TEMP_FILE];

/// Names a backup keeps for itself at its top.
const RESERVED: [&str; 2] = [MANIFEST_FILE, SOURCE_FILE];

/// Prefix of a backup being written; a crash leaves it, the next prune
/// removes it.
const TEMP_PREFIX: &str = ".tmp-";

/// How a backup root's name extends the data dir's by default
/// (`<data-dir>.backup`).
const DEFAULT_ROOT_SUFFIX: &str = ".backup";

/// Bytes read and written at once: large enough that a copy runs at disk
/// speed, small enough that a termination signal is seen within
/// milliseconds (a chunk, then the check).
const CHUNK: usize = 1 << 20;

/// `path` as the kernel reaches it ([`crate::paths::resolved`]): two
/// paths that name one place resolve alike, however they are spelled.
pub fn resolve(path: &Path) -> Result<PathBuf, BackupError> {
    Ok(crate::paths::resolved(path))
}

/// What a walk of the data dir found.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Survey {
    /// Bytes of regular files (behind symlinks too): what a copy needs.
    pub bytes: u64,
    /// How many files.
    pub files: u64,
}

/// Directories a copy must never enter: each destination and every
/// existing directory above it, by device and inode, so that neither a
/// symlink nor a bind mount in the data dir can lead the copy into itself.
struct Fence {
    /// (device, inode) → the destination it contains, for the message.
    ids: HashMap<(u64, u64), String>,
}

impl Fence {
    fn around(destinations: &[(PathBuf, String)]) -> Result<Fence, BackupError> {
        let mut ids = HashMap::new();
        for (destination, what) in destinations {
            let resolved = resolve(destination)?;
            for dir in resolved.ancestors() {
                if let Ok(meta) = fs::metadata(dir) {
                    if meta.is_dir() {
                        ids.entry(id(&meta)).or_insert_with(|| what.clone());
                    }
                }
            }
        }
        Ok(Fence { ids })
    }
}

fn id(meta: &Metadata) -> (u64, u64) {
    (meta.dev(), meta.ino())
}

/// What an entry of the data dir holds, symlinks followed.
enum Node {
    Dir(Metadata),
    File(Metadata),
}

/// Follows `path` (an entry of the data dir, maybe a symlink) to what it
/// holds, refusing what a copy cannot hold: a link that cannot be
/// followed, a special file, a directory that contains the walk so far (a
/// loop) or a destination of the copy.
fn follow(path: &Path, stack: &[(u64, u64)], fence: &Fence) -> Result<Node, BackupError> {
    let own = fs::symlink_metadata(path).map_err(io_err("stat", path))?;
    let target = own
        .file_type()
        .is_symlink()
        .then(|| fs::read_link(path).unwrap_or_default());
    let meta = match &target {
        Some(target) => fs::metadata(path).map_err(|source| BackupError::Dangling {
            link: path.to_path_buf(),
            target: target.clone(),
            source,
        })?,
        None => own,
    };
    let how = |otherwise: String| match &target {
        Some(target) => format!("a symlink to {}", target.display()),
        None => otherwise,
    };
    let kind = meta.file_type();
    if kind.is_dir() {
        if stack.contains(&id(&meta)) {
            return Err(BackupError::Loop {
                path: path.to_path_buf(),
                how: how("a mount of a directory above it".to_string()),
            });
        }
        if let Some(destination) = fence.ids.get(&id(&meta)) {
            return Err(BackupError::LeadsToCopy {
                path: path.to_path_buf(),
                how: how("a directory".to_string()),
                destination: destination.clone(),
            });
        }
        return Ok(Node::Dir(meta));
    }
    if kind.is_file() {
        return Ok(Node::File(meta));
    }
    let kind = if kind.is_fifo() {
        "named pipe"
    } else if kind.is_socket() {
        "socket"
    } else if kind.is_block_device() {
        "block device"
    } else if kind.is_char_device() {
        "character device"
    } else {
        "special file"
    };
    Err(BackupError::Special {
        path: path.to_path_buf(),
        kind,
    })
}

/// Whether `name`, at the top of the data dir, is one a backup leaves out
/// (`Ok(true)`), or one it reserves for itself (an error).
fn skipped_at_top(dir: &Path, name: &OsStr) -> Result<bool, BackupError> {
    if SKIPPED.iter().any(|s| name == *s) {
        return Ok(true);
    }
    if let Some(reserved) = RESERVED.iter().find(|r| name == **r) {
        return Err(BackupError::Reserved {
            path: dir.join(name),
            name: reserved,
        });
    }
    Ok(false)
}

/// Walks the data dir as a backup will (symlinks followed, scratch space
/// left out) and refuses what a backup cannot hold; `fence` guards the
/// destinations.
fn walk(
    dir: &Path,
    top: bool,
    stack: &mut Vec<(u64, u64)>,
    fence: &Fence,
    survey: &mut Survey,
) -> Result<(), BackupError> {
    for entry in fs::read_dir(dir).map_err(io_err("list", dir))? {
        let entry = entry.map_err(io_err("list", dir))?;
        if top && skipped_at_top(dir, &entry.file_name())? {
            continue;
        }
        let path = entry.path();
        match follow(&path, stack, fence)? {
            Node::Dir(meta) => {
                stack.push(id(&meta));
                walk(&path, false, stack, fence, survey)?;
                stack.pop();
            }
            Node::File(meta) => {
                survey.bytes += meta.len();
                survey.files += 1;
            }
        }
    }
    Ok(())
}

/// Surveys the data dir for a copy to `destinations` (each with how a
/// message names it): its size, and that nothing in it loops or leads into
/// a destination.
fn survey(data_dir: &Path, destinations: &[(PathBuf, String)]) -> Result<Survey, BackupError> {
    let fence = Fence::around(destinations)?;
    let top = fs::metadata(data_dir).map_err(io_err("stat", data_dir))?;
    let mut stack = vec![id(&top)];
    let mut found = Survey::default();
    walk(data_dir, true, &mut stack, &fence, &mut found)?;
    Ok(found)
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

/// Checks that a backup of `data_dir` can be made under `root` (see
/// [`check_before_run`], without the write probe). Reads only.
pub fn check_space(data_dir: &Path, root: &Path) -> Result<u64, BackupError> {
    check_before_run(data_dir, Some(root), false, false)
}

/// [`check_space`] for a backup by hard links ([`Source::Retired`]):
/// where the backup root is on the data dir's filesystem, the links take
/// no space, so only the rest is checked (a file a link is refused for,
/// across two mounts of that filesystem, is copied instead, and a copy
/// that meets a full disk stops there with its partial copy removed,
/// `BackupError::Full`). Elsewhere the copy needs the space, as
/// [`check_space`] says.
fn check_for_links(data_dir: &Path, root: &Path) -> Result<u64, BackupError> {
    let dev = |p: &Path| fs::metadata(p).map(|m| m.dev()).map_err(io_err("stat", p));
    if dev(&nearest_existing(root)?)? != dev(data_dir)? {
        return check_space(data_dir, root);
    }
    check_outside(data_dir, root)?;
    let destination = (
        root.to_path_buf(),
        format!("the backup dir {}", root.display()),
    );
    Ok(survey(data_dir, &[destination])?.bytes)
}

/// The nearest existing dir of `root` (resolved): the filesystem a
/// backup there will be written on, before the root is created.
fn nearest_existing(root: &Path) -> Result<PathBuf, BackupError> {
    let resolved = resolve(root)?;
    Ok(resolved
        .ancestors()
        .find(|p| p.exists())
        .unwrap_or(Path::new("/"))
        .to_path_buf())
}

/// Refuses a backup root inside the data dir, compared as resolved paths:
/// a symlink, a relative path or `..` cannot hide it.
fn check_outside(data_dir: &Path, root: &Path) -> Result<(), BackupError> {
    let resolved_data = resolve(data_dir)?;
    let resolved_root = resolve(root)?;
    if resolved_root.starts_with(&resolved_data) {
        return Err(BackupError::Inside {
            root: root.to_path_buf(),
            data_dir: data_dir.to_path_buf(),
            resolved_root,
            resolved_data,
        });
    }
    Ok(())
}

/// Proves the backup root writable: creates and removes a file in it, or,
/// while it does not exist, in the nearest directory that does (where it
/// would be created). A permission check alone would pass a read-only
/// mount, and root passes every permission check.
fn probe_writable(root: &Path) -> Result<(), BackupError> {
    let refuse = |detail: String, fix: String| BackupError::NotWritable {
        root: root.to_path_buf(),
        detail,
        fix,
    };
    let resolved = resolve(root)?;
    let mut existing = None;
    for dir in resolved.ancestors() {
        match fs::symlink_metadata(dir) {
            Ok(meta) => {
                existing = Some((dir.to_path_buf(), meta));
                break;
            }
            // Missing, or under a file: the nearest existing part decides.
            Err(err)
                if err.kind() == io::ErrorKind::NotFound
                    || err.raw_os_error() == Some(nix::libc::ENOTDIR) =>
            {
                continue
            }
            Err(err) => return Err(io_err("stat", dir)(err)),
        }
    }
    let Some((dir, meta)) = existing else {
        return Ok(());
    };
    let subject = if dir == resolved {
        "it".to_string()
    } else {
        format!("{}, where it would be created,", dir.display())
    };
    if !meta.is_dir() {
        return Err(refuse(
            format!("{subject} is not a directory, so it cannot hold one"),
            format!("move {} out of the way", dir.display()),
        ));
    }
    let probe = dir.join(format!(".etcd-migrate-probe-{}", std::process::id()));
    let created = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&probe);
    match created {
        Ok(file) => {
            drop(file);
            fs::remove_file(&probe).map_err(io_err("remove probe", &probe))
        }
        Err(err) if err.raw_os_error() == Some(nix::libc::EROFS) => Err(refuse(
            format!("{subject} is on a read-only filesystem"),
            format!("mount {} read-write", dir.display()),
        )),
        Err(err) => Err(refuse(
            format!("creating a file in {} failed: {err}", dir.display()),
            format!(
                "make {} writable by uid {}",
                dir.display(),
                nix::unistd::Uid::current().as_raw()
            ),
        )),
    }
}

/// Checks, before anything is touched, that the copies a run will make
/// can be made:
/// - with `backup_root`, a backup: the root outside the data dir (resolved
///   paths), and (with `probe`) writable, proven by creating a file;
/// - with `scratch`, the scratch copies a rebuilding step makes inside the
///   data dir (a snapshot and a restored copy: twice the data);
/// - for either, nothing in the data dir (symlinks followed) loops, leads
///   into a destination, or is neither a file nor a directory;
/// - and the filesystems have the space; needs on one filesystem add up.
///
/// Returns the bytes of the data dir. Reads only, but for the probe.
pub fn check_before_run(
    data_dir: &Path,
    backup_root: Option<&Path>,
    scratch: bool,
    probe: bool,
) -> Result<u64, BackupError> {
    let mut destinations = Vec::new();
    if let Some(root) = backup_root {
        check_outside(data_dir, root)?;
        destinations.push((
            root.to_path_buf(),
            format!("the backup dir {}", root.display()),
        ));
    }
    if scratch {
        let work = data_dir.join(WORK_DIR);
        destinations.push((
            work.clone(),
            format!("the step's scratch dir {}", work.display()),
        ));
    }
    let size = survey(data_dir, &destinations)?.bytes;
    if let (Some(root), true) = (backup_root, probe) {
        probe_writable(root)?;
    }
    let mut needs: Vec<(PathBuf, &'static str, u64)> = Vec::new();
    if let Some(root) = backup_root {
        needs.push((nearest_existing(root)?, "a backup", needed_for(size)));
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

/// Copies `data_dir` to a new backup under `policy.root` and prunes this
/// data dir's old ones. The copy is written under a temp name: `SOURCE`
/// first, then every file (symlinks followed), each hashed as it is
/// copied and fsynced; then every file is checked to be there with its
/// size, `MANIFEST.sha256` is written, and the copy is renamed into place.
/// After a crash a backup is complete or absent. `stop` is asked between
/// files and between chunks; a signal removes the partial copy.
pub fn create(
    data_dir: &Path,
    policy: &BackupPolicy,
    pair: VersionPair,
    now: SystemTime,
    stop: StopCheck<'_>,
) -> Result<PathBuf, BackupError> {
    publish(data_dir, policy, pair, now, stop, Source::Kept)
}

/// What becomes of the data dir a backup is taken of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// It lives on (a step runs etcd on it next): the backup copies.
    Kept,
    /// It is retired: its files are never opened for writing again (a
    /// member that joins another cluster with an empty `member/`, its old
    /// data only ever read after this). The backup takes each file by a
    /// hard link where the backup root shares the data dir's filesystem,
    /// reading it once for its hash, so half a GB costs a read instead of
    /// a write and an fsync (a pause job's joiner does this on its way
    /// into the converted cluster, while the cluster waits for it); a copy
    /// where a link is not offered. Complete or absent after a crash all
    /// the same, and the data dir untouched (a link takes nothing from it,
    /// nor room: the free-space check is a copy's, `check_for_links`).
    Retired,
}

/// [`create`] for a data dir whose fate is `source`.
pub fn publish(
    data_dir: &Path,
    policy: &BackupPolicy,
    pair: VersionPair,
    now: SystemTime,
    stop: StopCheck<'_>,
    source: Source,
) -> Result<PathBuf, BackupError> {
    let link = source == Source::Retired;
    let size = if link {
        check_for_links(data_dir, &policy.root)?
    } else {
        check_space(data_dir, &policy.root)?
    };
    DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&policy.root)
        .map_err(io_err("create backup dir", &policy.root))?;
    let source = fs::canonicalize(data_dir).map_err(io_err("resolve", data_dir))?;
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
    let written = write_copy(data_dir, &temp, &source, &policy.root, size, stop, link);
    let tally = match written {
        Ok(tally) => tally,
        Err(err) => {
            // Half a backup is no backup: never leave one to be mistaken for
            // it (a crash instead leaves the temp name, which the next backup
            // of this data dir clears).
            let _ = fs::remove_dir_all(&temp);
            return Err(match err {
                BackupError::Interrupted { signal, .. } => {
                    BackupError::Interrupted { signal, path: temp }
                }
                other => other,
            });
        }
    };
    crate::failpoint!("backup-before-publish");
    let target = policy.root.join(&name);
    // Publish the finished copy in one step: the rename is atomic, so a
    // reader (or a restore after a crash) never sees half a backup.
    fs::rename(&temp, &target).map_err(io_err("rename backup into place", &target))?;
    // The rename lives in the backup root's directory entries: without this
    // fsync a power loss could lose the published name.
    fsync(&policy.root)?;
    tally.log_done("backup", &target);
    crate::failpoint!("backup-after-publish");
    prune(&policy.root, policy.keep, &target, data_dir)?;
    Ok(target)
}

/// Writes the whole unpublished backup of `size` bytes at `temp`; returns
/// how it was copied.
fn write_copy(
    data_dir: &Path,
    temp: &Path,
    source: &Path,
    root: &Path,
    size: u64,
    stop: StopCheck<'_>,
    link: bool,
) -> Result<copy::Tally, BackupError> {
    // A backup's top dir is private whatever the data dir's mode (the
    // Kubernetes tool made data dirs 0755): it holds the whole keyspace.
    make_dir(temp, 0o700)?;
    // SOURCE first: a temp dir a crash leaves is then known to be this
    // data dir's, and only its own next backup clears it.
    let mut named = source.as_os_str().as_bytes().to_vec();
    named.push(b'\n');
    write_file(&temp.join(SOURCE_FILE), &named)?;
    let mut copier = Copier::new(
        stop,
        &[(
            root.to_path_buf(),
            format!("the backup dir {}", root.display()),
        )],
        true,
        size,
    )?;
    copier.link = link;
    let top = fs::metadata(data_dir).map_err(io_err("stat", data_dir))?;
    let mut stack = vec![id(&top)];
    copier.copy_entries(data_dir, temp, Path::new(""), true, &mut stack)?;
    // Every file the copy wrote is there with the bytes it wrote, before
    // the manifest vouches for it and the rename publishes it.
    for entry in &copier.manifest {
        let path = temp.join(&entry.path);
        let found = fs::symlink_metadata(&path);
        match found {
            Ok(meta) if meta.is_file() && meta.len() == entry.size => {}
            Ok(meta) => {
                return Err(BackupError::Incomplete {
                    path: temp.to_path_buf(),
                    detail: format!(
                        "{} holds {} bytes, {} were copied",
                        path.display(),
                        meta.len(),
                        entry.size
                    ),
                })
            }
            Err(err) => {
                return Err(BackupError::Incomplete {
                    path: temp.to_path_buf(),
                    detail: format!("{}: {err}", path.display()),
                })
            }
        }
    }
    write_file(&temp.join(MANIFEST_FILE), &manifest_text(&copier.manifest))?;
    // The two files' names, durable likewise.
    fsync(temp)?;
    Ok(copier.tally)
}

/// Copies the directory tree `from` to the new directory `to`, durably
/// (for a step's scratch copy): symlinks followed, as a backup does; a
/// link that loops or leads into `to` is refused. `stop` is asked between
/// files and between chunks.
pub fn copy_dir(from: &Path, to: &Path, stop: StopCheck<'_>) -> Result<(), BackupError> {
    let meta = fs::metadata(from).map_err(io_err("stat", from))?;
    let parent = to.parent().unwrap_or(Path::new("/"));
    let destinations = [(parent.to_path_buf(), format!("the copy {}", to.display()))];
    let size = survey(from, &destinations)?.bytes;
    let mut copier = Copier::new(stop, &destinations, false, size)?;
    make_dir(to, meta.mode() & 0o7777)?;
    let mut stack = vec![id(&meta)];
    copier.copy_entries(from, to, Path::new(""), false, &mut stack)?;
    fsync(to)?;
    copier.tally.log_done("scratch copy", to);
    Ok(())
}

/// One file of a backup, as the manifest lists it.
struct ManifestEntry {
    /// Relative to the backup's top.
    path: PathBuf,
    /// Bytes copied.
    size: u64,
    /// SHA-256 of those bytes.
    digest: [u8; 32],
}

/// The manifest in `sha256sum` format, one `<hex>  <path>` line per file;
/// a name holding a backslash or a newline is escaped as `sha256sum`
/// does (the line starts with a backslash).
fn manifest_text(entries: &[ManifestEntry]) -> Vec<u8> {
    let mut text = Vec::new();
    for entry in entries {
        let name = entry.path.as_os_str().as_bytes();
        let escape = name.iter().any(|b| *b == b'\\' || *b == b'\n');
        if escape {
            text.push(b'\\');
        }
        for byte in entry.digest {
            text.extend_from_slice(format!("{byte:02x}").as_bytes());
        }
        text.extend_from_slice(b"  ");
        for &byte in name {
            match byte {
                b'\\' if escape => text.extend_from_slice(b"\\\\"),
                b'\n' => text.extend_from_slice(b"\\n"),
                other => text.push(other),
            }
        }
        text.push(b'\n');
    }
    text
}

/// A copy under way: the stop check, the fence, one buffer, and (for a
/// backup) the manifest so far.
struct Copier<'a> {
    stop: StopCheck<'a>,
    fence: Fence,
    buffer: Vec<u8>,
    backup: bool,
    /// Hard links first ([`Source::Retired`]).
    link: bool,
    manifest: Vec<ManifestEntry>,
    /// Methods, bytes and time so far.
    tally: copy::Tally,
    /// Progress lines of a long copy.
    progress: log::Progress,
}

impl<'a> Copier<'a> {
    /// A copier of `total` bytes (for progress lines) into `destinations`.
    fn new(
        stop: StopCheck<'a>,
        destinations: &[(PathBuf, String)],
        backup: bool,
        total: u64,
    ) -> Result<Self, BackupError> {
        let what = if backup { "backup copy" } else { "copy" };
        Ok(Copier {
            stop,
            fence: Fence::around(destinations)?,
            buffer: vec![0; CHUNK],
            backup,
            link: false,
            manifest: Vec::new(),
            tally: copy::Tally::default(),
            progress: log::Progress::new(what, log::ProgressUnit::Bytes, total),
        })
    }

    fn check_stop(&self, path: &Path) -> Result<(), BackupError> {
        match (self.stop)() {
            Some(signal) => Err(BackupError::Interrupted {
                signal,
                path: path.to_path_buf(),
            }),
            None => Ok(()),
        }
    }

    /// Copies the entries of `from` into the existing dir `to`; `relative`
    /// is `to` below the copy's top.
    fn copy_entries(
        &mut self,
        from: &Path,
        to: &Path,
        relative: &Path,
        top: bool,
        stack: &mut Vec<(u64, u64)>,
    ) -> Result<(), BackupError> {
        // In name order, so a manifest lists a tree the same way each time.
        let mut entries = Vec::new();
        for entry in fs::read_dir(from).map_err(io_err("list", from))? {
            entries.push(entry.map_err(io_err("list", from))?);
        }
        entries.sort_by_key(|entry| entry.file_name());
        for entry in entries {
            self.check_stop(to)?;
            let name = entry.file_name();
            if top && self.backup && skipped_at_top(from, &name)? {
                continue;
            }
            let source = entry.path();
            let dest = to.join(&name);
            let relative = relative.join(&name);
            match follow(&source, stack, &self.fence)? {
                Node::Dir(meta) => {
                    make_dir(&dest, meta.mode() & 0o7777)?;
                    stack.push(id(&meta));
                    self.copy_entries(&source, &dest, &relative, false, stack)?;
                    stack.pop();
                    // The directory's own entries, durable like the files.
                    fsync(&dest)?;
                }
                Node::File(meta) => {
                    let (size, digest) = self.copy_file(&source, &dest, meta.mode() & 0o7777)?;
                    if self.backup {
                        self.manifest.push(ManifestEntry {
                            path: relative,
                            size,
                            digest,
                        });
                    }
                    if top && self.backup {
                        // Half a backup on disk: the first file is in, the rest not.
                        crate::failpoint!("backup-after-first-file");
                    }
                }
            }
        }
        Ok(())
    }

    /// Copies one file the fastest way the filesystem offers
    /// ([`copy::copy_file`]), hashing it for a backup, keeps its mode, and
    /// fsyncs it: durable before the copy is published.
    fn copy_file(
        &mut self,
        from: &Path,
        to: &Path,
        mode: u32,
    ) -> Result<(u64, [u8; 32]), BackupError> {
        if self.link {
            if let Some(linked) = self.link_file(from, to)? {
                return Ok(linked);
            }
        }
        let input = File::open(from).map_err(io_err("open", from))?;
        // Readable too: a copy the kernel made is hashed by reading it back.
        let output = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(to)
            .map_err(io_err("create", to))?;
        let mut hasher = self.backup.then(Sha256::new);
        let mut hash = |chunk: &[u8]| {
            if let Some(hasher) = hasher.as_mut() {
                hasher.update(chunk);
            }
        };
        let mut between = counted_until_stopped(self.stop, &mut self.progress, to);
        let ends = copy::Ends {
            from: &input,
            from_path: from,
            to: &output,
            to_path: to,
        };
        let mut hooks = copy::Hooks {
            between: &mut between,
            bytes: if self.backup { Some(&mut hash) } else { None },
        };
        // The fastest first; copy.rs's tests force and fail each method.
        let copied = copy::copy_file(
            &copy::KERNEL,
            &ends,
            copy::Method::Reflink,
            &mut self.buffer,
            &mut hooks,
        )?;
        self.tally.add(copied);
        output
            .set_permissions(fs::Permissions::from_mode(mode))
            .map_err(io_err("chmod", to))?;
        // Durable before the copy is published by a rename.
        output.sync_all().map_err(io_err("fsync", to))?;
        let digest = hasher.map(|h| h.finalize().into()).unwrap_or([0; 32]);
        Ok((copied.bytes, digest))
    }
}

impl Copier<'_> {
    /// Takes `from` into a retired data dir's backup as a hard link at
    /// `to`, and hashes it by reading it; `None` when the filesystem
    /// offers no link for it (another filesystem, say): the caller copies.
    fn link_file(
        &mut self,
        from: &Path,
        to: &Path,
    ) -> Result<Option<(u64, [u8; 32])>, BackupError> {
        // The file a symlink leads to, as a copy follows it: a link to
        // the symlink itself would back up a path, not the bytes.
        let file = fs::canonicalize(from).map_err(io_err("resolve", from))?;
        match fs::hard_link(&file, to) {
            Ok(()) => {}
            Err(err) if copy::not_offered(&err) => return Ok(None),
            Err(err) => return Err(io_err("link", to)(err)),
        }
        let linked = File::open(to).map_err(io_err("open", to))?;
        let mut hasher = Sha256::new();
        let mut hash = |chunk: &[u8]| hasher.update(chunk);
        let mut between = counted_until_stopped(self.stop, &mut self.progress, to);
        let mut hooks = copy::Hooks {
            between: &mut between,
            bytes: Some(&mut hash),
        };
        let copied = copy::read_linked(&linked, to, &mut self.buffer, &mut hooks)?;
        self.tally.add(copied);
        // The bytes the hash vouches for, durable before the backup is
        // published: an etcd that was killed may have left them unsynced.
        linked.sync_all().map_err(io_err("fsync", to))?;
        Ok(Some((copied.bytes, hasher.finalize().into())))
    }
}

/// What a copy of the file `to` does between chunks: counts the bytes a
/// chunk finished into `progress`, and stops on a termination signal.
fn counted_until_stopped<'p>(
    stop: StopCheck<'p>,
    progress: &'p mut log::Progress,
    to: &'p Path,
) -> impl FnMut(u64) -> Result<(), BackupError> + 'p {
    move |done: u64| {
        progress.add(done, done);
        match stop() {
            Some(signal) => Err(BackupError::Interrupted {
                signal,
                path: to.to_path_buf(),
            }),
            None => Ok(()),
        }
    }
}

impl From<copy::CopyError> for BackupError {
    fn from(err: copy::CopyError) -> Self {
        io_err(err.op, &err.path)(err.source)
    }
}

/// Creates a directory with exactly `mode` (the umask aside).
fn make_dir(path: &Path, mode: u32) -> Result<(), BackupError> {
    DirBuilder::new()
        .mode(mode)
        .create(path)
        .map_err(io_err("create", path))?;
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).map_err(io_err("chmod", path))
}

/// Writes a new private file and fsyncs it: durable before the backup
/// that holds it is published.
fn write_file(path: &Path, content: &[u8]) -> Result<(), BackupError> {
    durable::write_new(path, content).map_err(BackupError::from)
}

/// Fsyncs a directory of the copy or the backup root.
fn fsync(dir: &Path) -> Result<(), BackupError> {
    durable::fsync_dir(dir).map_err(BackupError::from)
}

impl From<DurableError> for BackupError {
    fn from(err: DurableError) -> Self {
        io_err(err.op, &err.path)(err.source)
    }
}

/// Whose backups a prune may remove: those whose `SOURCE` names this data
/// dir; and those without one (written by releases before `SOURCE`
/// existed) only in this data dir's default root, `<data-dir>.backup`,
/// which no other data dir uses by default. In a shared custom root they
/// may be anyone's: left alone.
struct Owner {
    source: PathBuf,
    default_root: bool,
}

impl Owner {
    fn of(data_dir: &Path, root: &Path) -> Result<Owner, BackupError> {
        let source = fs::canonicalize(data_dir).map_err(io_err("resolve", data_dir))?;
        let mut default: OsString = source.clone().into_os_string();
        default.push(DEFAULT_ROOT_SUFFIX);
        let default_root = resolve(root)? == Path::new(&default);
        Ok(Owner {
            source,
            default_root,
        })
    }

    fn owns(&self, backup: &Path) -> bool {
        match fs::read(backup.join(SOURCE_FILE)) {
            Ok(mut named) => {
                if named.last() == Some(&b'\n') {
                    named.pop();
                }
                Path::new(OsStr::from_bytes(&named)) == self.source
            }
            Err(err) if err.kind() == io::ErrorKind::NotFound => self.default_root,
            // Unreadable: not provably ours, so kept.
            Err(_) => false,
        }
    }
}

/// The backups under `root`, oldest first, whoever's they are.
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

/// The backups of `data_dir` under `root`, oldest first (see [`prune`]
/// for which count as its own).
pub fn list_of(root: &Path, data_dir: &Path) -> Result<Vec<PathBuf>, BackupError> {
    let owner = Owner::of(data_dir, root)?;
    Ok(list(root)?.into_iter().filter(|b| owner.owns(b)).collect())
}

/// Removes all but the newest `keep` of `data_dir`'s backups under `root`,
/// and any half-written one of its own; `just_taken` is always kept (and
/// counts as one of them). Another data dir's backups are never touched:
/// a backup is this data dir's when its `SOURCE` names it, or, without a
/// `SOURCE` (an older release's), when `root` is `<data-dir>.backup`.
pub fn prune(
    root: &Path,
    keep: usize,
    just_taken: &Path,
    data_dir: &Path,
) -> Result<Vec<PathBuf>, BackupError> {
    let owner = Owner::of(data_dir, root)?;
    let mut removed = Vec::new();
    for entry in fs::read_dir(root).map_err(io_err("list", root))? {
        let entry = entry.map_err(io_err("list", root))?;
        let path = entry.path();
        // Another data dir's run may be writing its own right now.
        if entry.file_name().to_string_lossy().starts_with(TEMP_PREFIX) && owner.owns(&path) {
            fs::remove_dir_all(&path).map_err(io_err("remove", &path))?;
            removed.push(path);
        }
    }
    let backups: Vec<PathBuf> = list(root)?
        .into_iter()
        .filter(|b| b != just_taken && owner.owns(b))
        .collect();
    let excess = backups.len().saturating_sub(keep.max(1) - 1);
    for old in &backups[..excess] {
        // Unpublish first: renamed to a temp name (and the rename made
        // durable), a backup that a crash cuts off mid-delete is never
        // found half-deleted under its published name; the next prune
        // clears the temp name (its SOURCE, or the default root, still
        // says whose it is).
        let name = old.file_name().map(|n| n.to_string_lossy().into_owned());
        let doomed = root.join(format!("{TEMP_PREFIX}{}", name.unwrap_or_default()));
        fs::rename(old, &doomed).map_err(io_err("unpublish old backup", old))?;
        fsync(root)?;
        fs::remove_dir_all(&doomed).map_err(io_err("remove old backup", &doomed))?;
        removed.push(old.clone());
    }
    Ok(removed)
}

fn quote(path: &Path) -> String {
    format!("'{}'", path.display().to_string().replace('\'', r"'\''"))
}

#[cfg(test)]
pub(super) mod tests {
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
        create(&data, &policy, pair("3.5.16/etcd3"), t, &never_stop).expect("first");
        let second =
            create(&data, &policy, pair("3.3.25/etcd3"), t, &never_stop).expect("same millisecond");
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
        let first = create(&data, &policy, pair("3.5.16/etcd3"), t0, &never_stop).expect("backup");
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
        let second =
            create(&data, &policy, pair("3.5.16/etcd3"), t0, &never_stop).expect("same second");
        assert_ne!(first, second);
        let third = create(
            &data,
            &policy,
            pair("3.4.23/etcd3"),
            t0 + Duration::from_secs(5),
            &never_stop,
        )
        .expect("backup");
        assert_eq!(list(&policy.root).expect("list"), vec![second, third]);
        assert!(!policy
            .root
            .join(".tmp-20000101T000000Z-3.3.25-etcd3")
            .exists());
    }

    #[test]
    fn a_backup_inside_the_data_dir_is_refused() {
        let tmp = tempfile::tempdir().expect("tempdir");
        sample_data(tmp.path());
        let err = check_space(tmp.path(), &tmp.path().join("b")).expect_err("inside");
        assert!(err.to_string().contains("inside the data dir"), "{err}");
    }

    /// `--backup always` into `root`, keeping `keep` (also `tool`'s tests).
    pub(super) fn policy(root: PathBuf, keep: usize) -> BackupPolicy {
        BackupPolicy {
            mode: BackupMode::Always,
            root,
            keep,
        }
    }

    fn run_in(dir: &Path, script: &str) -> std::process::Output {
        std::process::Command::new("sh")
            .arg("-c")
            .arg(script)
            .current_dir(dir)
            .output()
            .expect("sh")
    }

    #[test]
    fn resolving_sees_through_links_dots_and_missing_parts() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let real = fs::canonicalize(tmp.path()).expect("canonical");
        let data = real.join("data");
        fs::create_dir(&data).expect("mkdir");
        std::os::unix::fs::symlink(&data, real.join("link")).expect("link");
        assert_eq!(
            resolve(&real.join("link/b")).expect("resolve"),
            data.join("b")
        );
        assert_eq!(
            resolve(&real.join("missing/../data/./b/c")).expect("resolve"),
            data.join("b/c")
        );
        assert_eq!(
            resolve(&real.join("link/../data.backup")).expect("resolve"),
            real.join("data.backup")
        );
    }

    #[test]
    fn a_backup_dir_inside_the_data_dir_through_a_link_or_dotdot_is_refused() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let data = tmp.path().join("data");
        sample_data(&data);
        std::os::unix::fs::symlink(&data, tmp.path().join("link")).expect("link");
        for root in [
            tmp.path().join("link/b"),
            tmp.path().join("elsewhere/../data/b"),
            data.clone(),
        ] {
            let err = check_space(&data, &root).expect_err("inside");
            assert!(
                matches!(err, BackupError::Inside { .. }),
                "{}: {err}",
                root.display()
            );
            assert!(
                err.to_string().contains("point --backup-dir outside"),
                "{err}"
            );
        }
    }

    #[test]
    fn a_retired_data_dir_is_backed_up_by_hard_links_that_its_manifest_vouches_for() {
        use std::os::unix::fs::MetadataExt;
        let tmp = tempfile::tempdir().expect("tempdir");
        let data = tmp.path().join("data");
        sample_data(&data);
        let elsewhere = tmp.path().join("elsewhere.txt");
        fs::write(&elsewhere, b"behind a symlink").expect("write");
        std::os::unix::fs::symlink(&elsewhere, data.join("linked.txt")).expect("symlink");
        let backup = publish(
            &data,
            &policy(tmp.path().join("data.backup"), 3),
            pair("3.4.23/etcd3"),
            SystemTime::now(),
            &never_stop,
            Source::Retired,
        )
        .expect("backup");
        let inode = |p: &Path| fs::metadata(p).expect("stat").ino();
        for file in ["member/snap/db", "member/wal/0.wal", "version.txt"] {
            assert_eq!(
                inode(&backup.join(file)),
                inode(&data.join(file)),
                "{file} is the data dir's own file"
            );
            assert!(data.join(file).exists(), "the data dir keeps {file}");
        }
        // A symlink is followed, as a copy follows it: the file, not the link.
        let linked = fs::symlink_metadata(backup.join("linked.txt")).expect("stat");
        assert!(linked.is_file());
        assert_eq!(linked.ino(), inode(&elsewhere));
        assert!(!backup.join(WORK_DIR).exists(), "scratch space stays out");
        let checked = tool::verify(&backup).expect("the manifest holds");
        assert_eq!(checked.files, 4, "{checked:?}");
        // The manifest is of the bytes, not of names: a change is caught.
        fs::remove_file(data.join("member/wal/0.wal")).expect("rm");
        fs::write(backup.join("member/wal/0.wal"), b"other").expect("write");
        assert!(tool::verify(&backup).is_err());
    }

    #[test]
    fn a_retired_data_dir_on_another_filesystem_than_its_backups_is_copied() {
        use std::os::unix::fs::MetadataExt;
        let tmp = tempfile::tempdir().expect("tempdir");
        let data = tmp.path().join("data");
        sample_data(&data);
        // tmpfs, while the temp dir is on the disk: a link across the two
        // fails with EXDEV, as with a backup dir on its own volume.
        let other = tempfile::tempdir_in("/dev/shm").expect("a dir in /dev/shm");
        let dev = |p: &Path| fs::metadata(p).expect("stat").dev();
        assert_ne!(
            dev(other.path()),
            dev(tmp.path()),
            "this test needs /dev/shm and the temp dir ({}) on two filesystems",
            tmp.path().display()
        );
        let backup = publish(
            &data,
            &policy(other.path().join("data.backup"), 3),
            pair("3.4.23/etcd3"),
            SystemTime::now(),
            &never_stop,
            Source::Retired,
        )
        .expect("backup");
        assert_eq!(
            fs::read(backup.join("member/snap/db")).expect("read"),
            vec![7u8; 50_000]
        );
        tool::verify(&backup).expect("the manifest holds");
        assert!(data.join("member/snap/db").exists());
    }

    #[test]
    fn a_backup_holds_the_content_behind_links_with_a_manifest_sha256sum_accepts() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let elsewhere = tmp.path().join("elsewhere");
        sample_data(&elsewhere);
        let data = tmp.path().join("data");
        fs::create_dir(&data).expect("mkdir");
        fs::write(data.join("version.txt"), "3.5.16/etcd3").expect("write");
        // member/ is a link, and so is member/wal inside it, and a file.
        std::os::unix::fs::symlink(elsewhere.join("member"), data.join("member")).expect("link");
        let wal = tmp.path().join("wal-disk/wal");
        fs::create_dir_all(&wal).expect("mkdir");
        fs::write(wal.join("1.wal"), vec![3u8; 3 * CHUNK + 7]).expect("write");
        fs::rename(elsewhere.join("member/wal"), tmp.path().join("old-wal")).expect("mv");
        std::os::unix::fs::symlink(&wal, elsewhere.join("member/wal")).expect("link");
        std::os::unix::fs::symlink(elsewhere.join("version.txt"), data.join("linked.txt"))
            .expect("link");
        fs::write(data.join("we\\ird\nname"), b"odd").expect("write");

        let root = tmp.path().join("b");
        let backup = create(
            &data,
            &policy(root.clone(), 3),
            pair("3.5.16/etcd3"),
            SystemTime::now(),
            &never_stop,
        )
        .expect("backup");
        for dir in ["member", "member/wal", "member/snap"] {
            let meta = fs::symlink_metadata(backup.join(dir)).expect("stat");
            assert!(meta.is_dir(), "{dir} is a real dir in the backup");
        }
        assert_eq!(
            fs::read(backup.join("member/wal/1.wal"))
                .expect("read")
                .len(),
            3 * CHUNK + 7
        );
        assert!(fs::symlink_metadata(backup.join("linked.txt"))
            .expect("stat")
            .is_file());
        let source = fs::read_to_string(backup.join(SOURCE_FILE)).expect("source");
        assert_eq!(
            source,
            format!(
                "{}\n",
                fs::canonicalize(&data).expect("canonical").display()
            )
        );
        let manifest = fs::read_to_string(backup.join(MANIFEST_FILE)).expect("manifest");
        assert_eq!(manifest.lines().count(), 5, "{manifest}");
        let check = run_in(&backup, &format!("sha256sum --strict -c {MANIFEST_FILE}"));
        assert!(
            check.status.success(),
            "{}{}",
            String::from_utf8_lossy(&check.stdout),
            String::from_utf8_lossy(&check.stderr)
        );
        // A damaged file is caught.
        fs::write(backup.join("member/snap/db"), b"damaged").expect("write");
        let check = run_in(&backup, &format!("sha256sum -c --quiet {MANIFEST_FILE}"));
        assert!(!check.status.success());
    }

    #[test]
    fn links_that_loop_or_lead_into_the_copy_are_refused_naming_the_link() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let data = tmp.path().join("data");
        let root = tmp.path().join("data.backup");
        type Setup = fn(&Path, &Path) -> PathBuf;
        let cases: [(&str, Setup, &str); 5] = [
            (
                "loop",
                |data, _| {
                    let link = data.join("member/snap/up");
                    std::os::unix::fs::symlink("../..", &link).expect("link");
                    link
                },
                "a directory that contains it (a loop)",
            ),
            (
                "to the backup's parent",
                |data, _| {
                    let link = data.join("member/parent");
                    std::os::unix::fs::symlink(data.parent().expect("parent"), &link)
                        .expect("link");
                    link
                },
                "which contains the backup dir",
            ),
            (
                "to the backup dir itself",
                |data, root| {
                    fs::create_dir_all(root).expect("mkdir");
                    let link = data.join("member/backups");
                    std::os::unix::fs::symlink(root, &link).expect("link");
                    link
                },
                "which contains the backup dir",
            ),
            (
                "dangling",
                |data, _| {
                    let link = data.join("member/gone");
                    std::os::unix::fs::symlink("/nonexistent/x", &link).expect("link");
                    link
                },
                "points to /nonexistent/x, which cannot be read",
            ),
            (
                "a named pipe",
                |data, _| {
                    let fifo = data.join("member/fifo");
                    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).expect("mkfifo");
                    fifo
                },
                "is a named pipe",
            ),
        ];
        for (name, setup, expected) in cases {
            let _ = fs::remove_dir_all(&data);
            let _ = fs::remove_dir_all(&root);
            sample_data(&data);
            let culprit = setup(&data, &root);
            let err = check_space(&data, &root).expect_err(name);
            let text = err.to_string();
            assert!(text.contains(expected), "{name}: {text}");
            assert!(
                text.contains(&culprit.display().to_string()),
                "{name} names the link: {text}"
            );
            // The copy itself refuses too, and leaves nothing.
            let err = create(
                &data,
                &policy(root.clone(), 3),
                pair("3.5.16/etcd3"),
                SystemTime::now(),
                &never_stop,
            )
            .expect_err(name);
            assert!(err.to_string().contains(expected), "{name}: {err}");
            assert!(list(&root).expect("list").is_empty(), "{name}");
        }
        // A scratch copy of member/ refuses a link back to the data dir.
        let _ = fs::remove_dir_all(&data);
        sample_data(&data);
        std::os::unix::fs::symlink(&data, data.join("member/data")).expect("link");
        let err = check_before_run(&data, None, true, false).expect_err("scratch");
        assert!(err.to_string().contains("member/data"), "{err}");
        fs::create_dir_all(data.join(WORK_DIR).join("converted")).expect("mkdir");
        let err = copy_dir(
            &data.join("member"),
            &data.join(WORK_DIR).join("converted/member"),
            &never_stop,
        )
        .expect_err("scratch copy");
        assert!(err.to_string().contains("member/data"), "{err}");
    }

    #[test]
    fn a_name_a_backup_reserves_is_refused_in_the_data_dir() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let data = tmp.path().join("data");
        sample_data(&data);
        fs::write(data.join(SOURCE_FILE), b"mine").expect("write");
        let err = check_space(&data, &tmp.path().join("b")).expect_err("reserved");
        assert!(matches!(err, BackupError::Reserved { .. }), "{err}");
    }

    #[test]
    fn a_backup_dir_that_cannot_be_created_is_refused_by_the_probe() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let data = tmp.path().join("data");
        sample_data(&data);
        fs::write(tmp.path().join("file"), b"x").expect("write");
        let err = check_before_run(&data, Some(&tmp.path().join("file/b")), false, true)
            .expect_err("a file where a dir must be");
        assert!(matches!(err, BackupError::NotWritable { .. }), "{err}");
        assert!(err.to_string().contains("is not a directory"), "{err}");
        let root = tmp.path().join("b");
        check_before_run(&data, Some(&root), false, true).expect("writable");
        assert!(!root.exists(), "the probe creates nothing that stays");
        assert_eq!(dir_entries(tmp.path()), ["data", "file"]);
    }

    fn dir_entries(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(dir)
            .expect("list")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn a_stop_mid_copy_removes_the_partial_backup() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let data = tmp.path().join("data");
        sample_data(&data);
        fs::write(data.join("member/snap/big"), vec![1u8; 8 * CHUNK]).expect("write");
        let root = tmp.path().join("b");
        // The stop comes at the fifth question: inside the copy.
        let asked = std::cell::Cell::new(0);
        let stop = || {
            asked.set(asked.get() + 1);
            (asked.get() >= 5).then_some(Signal::SIGTERM)
        };
        let err = create(
            &data,
            &policy(root.clone(), 3),
            pair("3.5.16/etcd3"),
            SystemTime::now(),
            &stop,
        )
        .expect_err("stopped");
        assert!(
            matches!(
                err,
                BackupError::Interrupted {
                    signal: Signal::SIGTERM,
                    ..
                }
            ),
            "{err}"
        );
        assert_eq!(asked.get(), 5, "no question after the stop");
        assert!(dir_entries(&root).is_empty(), "{:?}", dir_entries(&root));
    }

    #[test]
    fn pruning_touches_only_this_data_dirs_backups() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let a = tmp.path().join("a");
        let b = tmp.path().join("b");
        sample_data(&a);
        sample_data(&b);
        let shared = tmp.path().join("shared");
        // A backup of an older release (no SOURCE) in a shared dir: whose
        // it is cannot be told, so it stays.
        let legacy = shared.join("20000101T000000.000Z-3.4.23-etcd3");
        fs::create_dir_all(&legacy).expect("mkdir");
        let stale_other = shared.join(".tmp-20000101T000000.000Z-3.4.23-etcd3");
        fs::create_dir_all(&stale_other).expect("mkdir");
        let t = UNIX_EPOCH + Duration::from_secs(1_795_000_000);
        let one = policy(shared.clone(), 1);
        let a1 = create(&a, &one, pair("3.5.16/etcd3"), t, &never_stop).expect("a1");
        let b1 = create(&b, &one, pair("3.5.16/etcd3"), t, &never_stop).expect("b1");
        assert!(a1.exists(), "b's prune left a's backup");
        let a2 = create(
            &a,
            &one,
            pair("3.4.23/etcd3"),
            t + Duration::from_secs(1),
            &never_stop,
        )
        .expect("a2");
        assert!(!a1.exists(), "a's own old backup is pruned");
        assert_eq!(list_of(&shared, &a).expect("list"), vec![a2.clone()]);
        assert_eq!(list_of(&shared, &b).expect("list"), vec![b1.clone()]);
        assert_eq!(list(&shared).expect("list"), vec![legacy.clone(), b1, a2]);
        assert!(stale_other.exists(), "another run's temp dir is not ours");

        // In a's default root, a backup without SOURCE is a's (the
        // current release wrote it there).
        let default = tmp.path().join("a.backup");
        let old = default.join("20000101T000000.000Z-3.4.23-etcd3");
        fs::create_dir_all(&old).expect("mkdir");
        let taken = create(
            &a,
            &policy(default.clone(), 1),
            pair("3.5.16/etcd3"),
            t,
            &never_stop,
        )
        .expect("backup");
        assert_eq!(list(&default).expect("list"), vec![taken]);
    }
}
