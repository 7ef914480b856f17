//! This module owns the data dir as a whole: telling what state it is in
//! (missing, empty, recorded, unrecorded), creating it with etcd's mode,
//! locking it against a second migrator, and the crash-safe write of
//! `version.txt`. It never looks inside etcd's own files.

use std::fs::{self, DirBuilder, File};
use std::io::{self, Read};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};
use nix::unistd::{access, AccessFlags, Uid};

use crate::durable::{self, DurableError, Stage};
use crate::version::{ParseError, Version, VersionPair};

/// The file that records the data's version and storage, as in the
/// Kubernetes image.
pub const VERSION_FILE: &str = "version.txt";

/// The temporary name `version.txt` is written under before the rename.
/// A crash can leave it behind; it is ignored and overwritten.
pub const VERSION_TEMP_FILE: &str = ".version.txt.tmp";

/// Written when a step's keyspace differed from the one before it (the
/// fingerprint check): while it exists every run refuses the data dir.
/// Without it, the next run would read its baseline from the data as the
/// failed step left it and carry the difference on unnoticed.
pub const HOLD_FILE: &str = ".etcd-migrate.hold";

/// The temporary name the hold is written under before the rename.
const HOLD_TEMP_FILE: &str = ".etcd-migrate.hold.tmp";

/// The cluster mode's restart mark: written (durably) before a release
/// starts on a member's data, removed once that release has proven itself
/// as a member and `version.txt` records it. While it exists, the release
/// it names has run on the data unrecorded, and the member starts with it
/// again: etcd data is never handed back to an older release.
pub const RESTART_MARK_FILE: &str = ".etcd-migrate.restart";

/// The temporary name the restart mark is written under before the rename.
const RESTART_MARK_TEMP_FILE: &str = ".etcd-migrate.restart.tmp";

/// The record of the last restore from a snapshot (issue 29): JSON whose
/// `sha256` names the snapshot, written last by the restore, so that a
/// restart with the same setting never restores twice.
pub const RESTORED_FILE: &str = ".etcd-migrate.restored";

/// The record that this member was started once with
/// `--force-new-cluster` (issue 29): JSON with when, and the members it
/// left behind; a restart with the setting left never forces again.
pub const FORCED_FILE: &str = ".etcd-migrate.forced";

/// The record of this member's part in a whole-cluster pause job (issue
/// 28): JSON with the job, the member's role and phase
/// (`cluster::pause::Record`). Written, fsynced, before each point of no
/// return of the job, so that a restart carries on with the job instead
/// of serving data the job has taken away; removed when the job is done.
pub const PAUSE_FILE: &str = ".etcd-migrate.pause";

/// The temporary name the pause record is written under.
const PAUSE_TEMP_FILE: &str = ".etcd-migrate.pause.tmp";

/// The record of a join as a learner in progress (issue 29 item 3): an
/// exec'd member that added itself as a learner runs its etcd under our
/// supervision until it is promoted, and only then records the target in
/// `version.txt`. Written, fsynced, before the add; removed after that
/// record. While it is there without a `version.txt`, the data dir's
/// `member/` is the half-joined copy an earlier start received (never
/// recorded, from a member that counted for no quorum or is replaced):
/// the next start discards it and joins again.
pub const JOINING_FILE: &str = ".etcd-migrate.joining";

/// The temporary name the join's record is written under.
const JOINING_TEMP_FILE: &str = ".etcd-migrate.joining.tmp";

/// The temporary name the force's record is written under.
const FORCED_TEMP_FILE: &str = ".etcd-migrate.forced.tmp";

/// The temporary name the restore's record is written under.
const RESTORED_TEMP_FILE: &str = ".etcd-migrate.restored.tmp";

/// Scratch space of steps that rebuild the data (restores, rollbacks). It
/// lives inside the data dir so that swaps are renames within one
/// filesystem, even when the data dir is a mount point.
pub const WORK_DIR: &str = ".etcd-migrate.work";

/// Entries that do not make a data dir "non-empty": a filesystem's
/// `lost+found` at the root of a volume, and our own leftovers.
const IGNORED_ENTRIES: [&str; 6] = [
    "lost+found",
    VERSION_TEMP_FILE,
    WORK_DIR,
    RESTART_MARK_TEMP_FILE,
    JOINING_FILE,
    JOINING_TEMP_FILE,
];

/// What the data dir holds, as far as planning is concerned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DirState {
    /// The path does not exist.
    Missing,
    /// The dir exists and holds nothing of etcd's.
    Empty,
    /// The dir has a valid `version.txt`.
    Recorded(VersionPair),
}

/// Why the data dir cannot be used as it is.
#[derive(Debug, thiserror::Error)]
pub enum DataDirError {
    /// `version.txt` exists but does not parse.
    #[error("{path} holds {content:?}, which etcd-migrate cannot use: {source}; write the version and storage of the etcd that last ran on this data, e.g. `echo 3.4.23/etcd3 > {path}`")]
    Malformed {
        /// The file.
        path: PathBuf,
        /// What it holds (truncated if long).
        content: String,
        /// Why it was rejected.
        #[source]
        source: ParseError,
    },
    /// The dir has content but no `version.txt`.
    #[error("data dir {dir} is not empty ({entries}) but has no {VERSION_FILE}, so the etcd that wrote it is unknown; declare it before migrating, e.g. `echo 3.4.23/etcd3 > {dir}/{VERSION_FILE}` (the release that last ran on it; etcd2 if its data is in the v2 store)")]
    Unrecorded {
        /// The data dir.
        dir: PathBuf,
        /// Some of what it holds.
        entries: String,
    },
    /// `version.txt` exists but holds nothing (a write cut short: the
    /// Kubernetes tool never fsynced it, kubernetes#98989).
    #[error("{path} is empty, so the etcd that last ran on this data is unknown (a write cut short by a crash or a full disk leaves it so); write the version and storage of that etcd, e.g. `echo 3.4.23/etcd3 > {path}` (the newest release that ran on it; etcd2 if its data is in the v2 store)")]
    EmptyVersionFile {
        /// The file.
        path: PathBuf,
    },
    /// `version.txt` is a symlink to nothing.
    #[error("{path} is a symlink to {}, which does not exist, so the etcd that last ran on this data is unknown; point the link at the real version.txt, or replace it with the version and storage of that etcd, e.g. `rm {path} && echo 3.4.23/etcd3 > {path}`", .target.display())]
    DanglingVersionFile {
        /// The link.
        path: PathBuf,
        /// Where it points.
        target: PathBuf,
    },
    /// `version.txt` is far larger than any record.
    #[error("{path} is {size} bytes, but a version.txt holds one <version>/<storage> pair (e.g. `3.4.23/etcd3`, 12 bytes; etcd-migrate reads at most {MAX_VERSION_FILE_BYTES}), so this is not a version record; write the version and storage of the etcd that last ran on this data, e.g. `echo 3.4.23/etcd3 > {path}`")]
    VersionFileTooLarge {
        /// The file.
        path: PathBuf,
        /// Its size in bytes.
        size: u64,
    },
    /// `version.txt` is a directory, a FIFO or the like.
    #[error("{path} is {kind}, not a file; move it away and write the version and storage of the etcd that last ran on this data, e.g. `echo 3.4.23/etcd3 > {path}`")]
    VersionFileNotAFile {
        /// The entry.
        path: PathBuf,
        /// What it is.
        kind: &'static str,
    },
    /// The path exists but is not a directory.
    #[error("data dir {path} exists but is not a directory; move it away, or point --data-dir (or $DATA_DIRECTORY) at the etcd data directory")]
    NotADirectory {
        /// The path.
        path: PathBuf,
    },
    /// We may not read or write the data dir.
    #[error("{subject} is not {need} by uid {uid}, which etcd-migrate runs as (owner uid {owner}, mode {mode:04o}); run etcd-migrate (and etcd) as uid {owner}, or give it to uid {uid}: `chown -R {uid} {dir}`")]
    NoAccess {
        /// "data dir X", or, when it is missing, "Y, where the missing
        /// data dir X would be created,".
        subject: String,
        /// The dir that was checked: the data dir, or its nearest
        /// existing ancestor.
        dir: PathBuf,
        /// What we need: "readable", "readable and writable".
        need: &'static str,
        /// Our uid.
        uid: u32,
        /// The owner's uid.
        owner: u32,
        /// The permission bits.
        mode: u32,
    },
    /// The data dir is on a read-only filesystem.
    #[error("{subject} is on a read-only filesystem, but etcd-migrate records progress there and etcd writes its WAL there; mount {dir} read-write (drop `:ro` / `readOnly: true` from the volume)")]
    ReadOnly {
        /// As in [`DataDirError::NoAccess`].
        subject: String,
        /// The dir that was checked.
        dir: PathBuf,
    },
    /// A write failed because the filesystem is full.
    #[error("the filesystem of {path} is full ({op} failed: {source}); free space there and rerun ({VERSION_FILE} still holds what it held before)")]
    Full {
        /// What was being done.
        op: &'static str,
        /// The file being written.
        path: PathBuf,
        /// The OS error (ENOSPC or EDQUOT).
        #[source]
        source: io::Error,
    },
    /// Another process holds the data dir lock.
    /// A rebuilding step died around its swap, and neither member dir
    /// carries the step's mark: which one holds the data cannot be told.
    #[error("a rebuilding step was interrupted around its swap (journal {journal}), but neither {data_member} nor {copy_member} carries its mark {id}; nothing was changed: one of them holds the data as it was before the step, and the other the rebuilt copy; inspect both with etcd, keep the right one as member/, then remove {work} and rerun")]
    UnclearSwap {
        /// The journal.
        journal: PathBuf,
        /// The step's mark.
        id: String,
        /// `<data>/member`.
        data_member: PathBuf,
        /// The scratch copy's `member`.
        copy_member: PathBuf,
        /// The scratch dir.
        work: PathBuf,
    },
    /// A step found the keyspace changed; the data waits for an operator.
    #[error("{path} is there: a run stopped because a step's keyspace was not the one before it ({reason}); nothing runs on this data until someone has looked: compare it with its last backup (etcdctl get --prefix, or a snapshot), restore the backup if keys were lost, or, once the difference is understood and accepted, remove {path} and rerun")]
    Held {
        /// The hold file.
        path: PathBuf,
        /// What the failed run recorded in it.
        reason: String,
    },
    #[error("data dir {dir} is locked by another process (another etcd-migrate?); stop it before running this one")]
    Locked {
        /// The data dir.
        dir: PathBuf,
    },
    /// The restart mark does not name a release.
    #[error("{path} holds {content:?}, not a release ({source}); it is etcd-migrate's restart mark, naming the release that last started on this member's data; write that release (e.g. `echo 3.4.23 > {path}`), or remove {path} if version.txt already names it")]
    BadRestartMark {
        /// The mark.
        path: PathBuf,
        /// What it holds (truncated).
        content: String,
        /// Why it is not a release.
        #[source]
        source: ParseError,
    },
    /// What the data records could not be read (its WAL, snapshots or
    /// db): etcd refuses such data too.
    #[error("cannot read what the data in {dir} records")]
    Unreadable {
        /// The data dir.
        dir: String,
        /// What could not be read.
        #[source]
        source: crate::ondisk::OnDiskError,
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

/// An exclusive lock on the data dir, held until dropped. The fd is
/// close-on-exec, so exec'ing etcd releases it.
#[derive(Debug)]
pub struct DirLock {
    _lock: Flock<File>,
}

fn io_err<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> DataDirError + 'a {
    move |source| DataDirError::Io {
        op,
        path: path.to_path_buf(),
        source,
    }
}

/// Tells what state `dir` is in. Reads only.
pub fn inspect(dir: &Path) -> Result<DirState, DataDirError> {
    let meta = match fs::metadata(dir) {
        Ok(meta) => meta,
        Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(DirState::Missing),
        Err(err) => return Err(io_err("inspect data dir", dir)(err)),
    };
    if !meta.is_dir() {
        return Err(DataDirError::NotADirectory {
            path: dir.to_path_buf(),
        });
    }
    let hold = dir.join(HOLD_FILE);
    match fs::read_to_string(&hold) {
        Ok(reason) => {
            return Err(DataDirError::Held {
                path: hold,
                reason: truncate(reason.trim(), 4000),
            })
        }
        Err(err) if err.kind() == io::ErrorKind::NotFound => {}
        Err(err) => return Err(io_err("read", &hold)(err)),
    }
    let path = dir.join(VERSION_FILE);
    match read_version_file(&path) {
        Ok(bytes) if bytes.iter().all(u8::is_ascii_whitespace) => {
            Err(DataDirError::EmptyVersionFile { path })
        }
        Ok(bytes) => {
            let content = String::from_utf8_lossy(&bytes).into_owned();
            content
                .parse()
                .map(DirState::Recorded)
                .map_err(|source| DataDirError::Malformed {
                    path,
                    content: truncate(&content, 80),
                    source,
                })
        }
        Err(VersionFileError::Missing) => {
            // A join that died before its promotion: its `member/` is
            // discarded by the next run (`recover_interrupted_join`), so
            // the data dir is as empty as it was before the join.
            let joining = dir.join(JOINING_FILE).exists();
            let mut entries = Vec::new();
            for entry in fs::read_dir(dir).map_err(io_err("list data dir", dir))? {
                let entry = entry.map_err(io_err("list data dir", dir))?;
                let name = entry.file_name().to_string_lossy().into_owned();
                let half_joined = joining && name == "member";
                if !(IGNORED_ENTRIES.contains(&name.as_str()) || half_joined) {
                    entries.push(name);
                }
            }
            if entries.is_empty() {
                return Ok(DirState::Empty);
            }
            entries.sort();
            let shown: Vec<&str> = entries.iter().take(5).map(String::as_str).collect();
            let more = if entries.len() > 5 { ", …" } else { "" };
            Err(DataDirError::Unrecorded {
                dir: dir.to_path_buf(),
                entries: format!("{}{more}", shown.join(", ")),
            })
        }
        Err(VersionFileError::Unusable(err)) => Err(err),
    }
}

/// The most `version.txt` may hold. A record is 12 bytes (`3.4.23/etcd3`)
/// and whitespace around it is tolerated, but a file of kilobytes is not a
/// record: only this much is ever read, so a huge file (hundreds of MB
/// were read whole, then quoted whole in the error) costs no memory.
pub const MAX_VERSION_FILE_BYTES: u64 = 4096;

/// Why `version.txt` gave no content to parse.
enum VersionFileError {
    /// There is none (no entry at all): the dir is empty or unrecorded.
    Missing,
    /// There is one, but it cannot be read as a record.
    Unusable(DataDirError),
}

/// The content of `version.txt` at `path`, at most
/// [`MAX_VERSION_FILE_BYTES`]. A symlink is followed, but one that leads
/// nowhere is named as such (it is an entry, so the dir is not "without
/// version.txt"); anything but a regular file is refused before it is
/// opened (opening a FIFO for reading would wait for a writer forever).
fn read_version_file(path: &Path) -> Result<Vec<u8>, VersionFileError> {
    let unusable = |err| VersionFileError::Unusable(err);
    let entry = match fs::symlink_metadata(path) {
        Ok(entry) => entry,
        Err(err) if err.kind() == io::ErrorKind::NotFound => return Err(VersionFileError::Missing),
        Err(err) => return Err(unusable(io_err("stat", path)(err))),
    };
    let meta = match fs::metadata(path) {
        Ok(meta) => meta,
        Err(err) if entry.file_type().is_symlink() && err.kind() == io::ErrorKind::NotFound => {
            let target =
                fs::read_link(path).map_err(|err| unusable(io_err("read link", path)(err)))?;
            return Err(unusable(DataDirError::DanglingVersionFile {
                path: path.to_path_buf(),
                target,
            }));
        }
        Err(err) => return Err(unusable(io_err("stat", path)(err))),
    };
    if !meta.is_file() {
        let kind = if meta.is_dir() {
            "a directory"
        } else {
            "a special file (FIFO, socket or device)"
        };
        return Err(unusable(DataDirError::VersionFileNotAFile {
            path: path.to_path_buf(),
            kind,
        }));
    }
    let too_large = |size| {
        unusable(DataDirError::VersionFileTooLarge {
            path: path.to_path_buf(),
            size,
        })
    };
    if meta.len() > MAX_VERSION_FILE_BYTES {
        return Err(too_large(meta.len()));
    }
    let file = File::open(path).map_err(|err| unusable(io_err("read", path)(err)))?;
    // Bounded even if the file grew since the stat (or lies about its size).
    let mut bytes = Vec::new();
    file.take(MAX_VERSION_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|err| unusable(io_err("read", path)(err)))?;
    if bytes.len() as u64 > MAX_VERSION_FILE_BYTES {
        return Err(too_large(meta.len().max(bytes.len() as u64)));
    }
    Ok(bytes)
}

fn truncate(text: &str, max_chars: usize) -> String {
    if text.chars().count() <= max_chars {
        text.to_string()
    } else {
        let cut: String = text.chars().take(max_chars).collect();
        format!("{cut}…")
    }
}

/// Creates the data dir (and missing parents) with mode 0700, which etcd
/// 3.4.10+ expects of its data dir.
pub fn create(dir: &Path) -> Result<(), DataDirError> {
    DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(io_err("create data dir", dir))?;
    // The new directory entry lives in the parent: fsync it so the dir
    // (and the version.txt written into it next) survives a power loss.
    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        durable::fsync_dir(parent).map_err(io_from)?;
    }
    Ok(())
}

/// Checks, before anything is touched, that we can read the data dir and,
/// with `write`, write to it: a read-only mount or a dir owned by another
/// uid is named up front, not found mid-step by etcd. A missing data dir is
/// checked through the ancestor it would be created in.
pub fn check_access(dir: &Path, write: bool) -> Result<(), DataDirError> {
    // A relative path's last ancestor is "": the working directory.
    let existing = dir
        .ancestors()
        .map(|p| {
            if p.as_os_str().is_empty() {
                Path::new(".")
            } else {
                p
            }
        })
        .find(|p| p.exists())
        .unwrap_or(Path::new("/"));
    let mut flags = AccessFlags::R_OK | AccessFlags::X_OK;
    if write {
        flags |= AccessFlags::W_OK;
    }
    let subject = if existing == dir {
        format!("data dir {}", dir.display())
    } else {
        format!(
            "{}, where the missing data dir {} would be created,",
            existing.display(),
            dir.display()
        )
    };
    match access(existing, flags) {
        Ok(()) => Ok(()),
        Err(Errno::EROFS) => Err(DataDirError::ReadOnly {
            subject,
            dir: existing.to_path_buf(),
        }),
        Err(Errno::EACCES) | Err(Errno::EPERM) => {
            let meta = fs::metadata(existing).map_err(io_err("stat", existing))?;
            Err(DataDirError::NoAccess {
                subject,
                dir: existing.to_path_buf(),
                need: if write {
                    "readable and writable"
                } else {
                    "readable"
                },
                uid: Uid::current().as_raw(),
                owner: meta.uid(),
                mode: meta.mode() & 0o7777,
            })
        }
        Err(errno) => Err(io_err("check access to", existing)(io::Error::from(errno))),
    }
}

/// etcd's mode for its data dir: etcd 3.4.10+ warns about any other (some
/// releases refused to start), and the data is the cluster's secrets.
pub const DATA_DIR_MODE: u32 = 0o700;

/// Sets the data dir's mode to [`DATA_DIR_MODE`] if it has another
/// (the Kubernetes tool created it 0755). Returns the old mode when it
/// changed something.
pub fn correct_mode(dir: &Path) -> Result<Option<u32>, DataDirError> {
    let mode = fs::metadata(dir).map_err(io_err("stat", dir))?.mode() & 0o7777;
    if mode == DATA_DIR_MODE {
        return Ok(None);
    }
    fs::set_permissions(dir, fs::Permissions::from_mode(DATA_DIR_MODE))
        .map_err(io_err("chmod 0700", dir))?;
    Ok(Some(mode))
}

/// Takes an exclusive, non-blocking lock on the data dir itself, so two
/// migrators never work on one volume at once.
pub fn lock(dir: &Path) -> Result<DirLock, DataDirError> {
    let file = File::open(dir).map_err(io_err("open data dir", dir))?;
    match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
        Ok(lock) => Ok(DirLock { _lock: lock }),
        Err((_, nix::errno::Errno::EWOULDBLOCK)) => Err(DataDirError::Locked {
            dir: dir.to_path_buf(),
        }),
        Err((_, errno)) => Err(io_err("lock data dir", dir)(io::Error::from(errno))),
    }
}

/// Removes the temp file a run that died inside [`write_version`] left.
/// Its content was never published (the rename is the publication), so it
/// holds nothing version.txt does not. Anything but a regular file under
/// that name is not ours and is left alone (the record will then fail and
/// name it). Call under the lock.
pub fn remove_stale_version_temp(dir: &Path) -> Result<(), DataDirError> {
    let temp = dir.join(VERSION_TEMP_FILE);
    if !fs::symlink_metadata(&temp).is_ok_and(|meta| meta.is_file()) {
        return Ok(());
    }
    match fs::remove_file(&temp) {
        Ok(()) => {
            crate::log::info(
                "removed the temp file of an interrupted version.txt write",
                &[("path", temp.display().to_string().into())],
            );
            Ok(())
        }
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(DataDirError::Io {
            op: "remove",
            path: temp,
            source,
        }),
    }
}

/// Replaces `version.txt` atomically and durably: after a crash at any
/// point, it holds either the old pair or the new one, never a mix or
/// nothing.
pub fn write_version(dir: &Path, pair: VersionPair) -> Result<(), DataDirError> {
    // No trailing newline: byte-for-byte the Kubernetes format.
    replace_file(
        dir,
        VERSION_TEMP_FILE,
        VERSION_FILE,
        pair.to_string().as_bytes(),
    )
}

/// Writes the restart mark ([`RESTART_MARK_FILE`]) naming `version`,
/// atomically and durably, before that release starts on the data.
pub fn write_restart_mark(dir: &Path, version: Version) -> Result<(), DataDirError> {
    replace_file(
        dir,
        RESTART_MARK_TEMP_FILE,
        RESTART_MARK_FILE,
        version.to_string().as_bytes(),
    )
}

/// The release the restart mark names, if there is one.
pub fn read_restart_mark(dir: &Path) -> Result<Option<Version>, DataDirError> {
    let path = dir.join(RESTART_MARK_FILE);
    let content = match fs::read_to_string(&path) {
        Ok(content) => content,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(DataDirError::Io {
                op: "read",
                path,
                source,
            })
        }
    };
    content
        .trim()
        .parse::<Version>()
        .map(Some)
        .map_err(|source| DataDirError::BadRestartMark {
            content: content.chars().take(64).collect(),
            path,
            source,
        })
}

/// Records `pair` in `version.txt`, then removes the restart mark (in that
/// order: a crash between leaves a mark naming the recorded release).
pub fn record_and_unmark(dir: &Path, pair: VersionPair) -> Result<(), DataDirError> {
    write_version(dir, pair)?;
    remove_durably(dir, RESTART_MARK_FILE)
}

/// Removes `name` from `dir` if it is there, then fsyncs `dir`: a restart
/// after a crash finds it gone for good.
fn remove_durably(dir: &Path, name: &str) -> Result<(), DataDirError> {
    let path = dir.join(name);
    match fs::remove_file(&path) {
        Ok(()) => durable::fsync_dir(dir).map_err(|err| DataDirError::Io {
            op: err.op,
            path: err.path,
            source: err.source,
        }),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(DataDirError::Io {
            op: "remove",
            path,
            source,
        }),
    }
}

/// The sha256 of the snapshot the data was last restored from
/// ([`RESTORED_FILE`]), if it records one.
pub fn read_restored(dir: &Path) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Record {
        sha256: String,
    }
    let raw = fs::read(dir.join(RESTORED_FILE)).ok()?;
    serde_json::from_slice::<Record>(&raw)
        .ok()
        .map(|r| r.sha256)
}

/// Writes the restore's record ([`RESTORED_FILE`]), durably.
pub fn write_restored(dir: &Path, json: &str) -> Result<(), DataDirError> {
    replace_file(
        dir,
        RESTORED_TEMP_FILE,
        RESTORED_FILE,
        format!("{json}\n").as_bytes(),
    )
}

/// Whether the data records a `--force-new-cluster` start ([`FORCED_FILE`]).
pub fn forced(dir: &Path) -> bool {
    dir.join(FORCED_FILE).exists()
}

/// Writes the force's record ([`FORCED_FILE`]), durably.
pub fn write_forced(dir: &Path, json: &str) -> Result<(), DataDirError> {
    replace_file(
        dir,
        FORCED_TEMP_FILE,
        FORCED_FILE,
        format!("{json}\n").as_bytes(),
    )
}

/// Writes the record of a join as a learner ([`JOINING_FILE`]), durably,
/// before the member adds itself.
pub fn write_joining(dir: &Path, json: &str) -> Result<(), DataDirError> {
    replace_file(
        dir,
        JOINING_TEMP_FILE,
        JOINING_FILE,
        format!("{json}\n").as_bytes(),
    )
}

/// Removes the join's record, durably (an add that was refused).
pub fn remove_joining(dir: &Path) -> Result<(), DataDirError> {
    remove_durably(dir, JOINING_FILE)
}

/// Records `pair` in `version.txt`, then removes the join's record (in
/// that order: a crash between leaves a record beside a `version.txt`,
/// which says the join was done).
pub fn record_joined(dir: &Path, pair: VersionPair) -> Result<(), DataDirError> {
    write_version(dir, pair)?;
    remove_durably(dir, JOINING_FILE)
}

/// After a join as a learner that died (see [`JOINING_FILE`]): with a
/// `version.txt`, the join was done and only its record is removed;
/// without one, the half-joined `member/` is removed first (fsynced), then
/// the record, and the data dir is empty again for the join to start over
/// (its stale entry in the membership is replaced as a lost member's is).
/// Call under the lock.
pub fn recover_interrupted_join(dir: &Path) -> Result<(), DataDirError> {
    if !dir.join(JOINING_FILE).exists() {
        return Ok(());
    }
    if !dir.join(VERSION_FILE).exists() {
        let member = dir.join("member");
        let removed = match fs::remove_dir_all(&member) {
            Ok(()) => {
                durable::fsync_dir(dir).map_err(|err| DataDirError::Io {
                    op: err.op,
                    path: err.path,
                    source: err.source,
                })?;
                true
            }
            Err(err) if err.kind() == io::ErrorKind::NotFound => false,
            Err(source) => {
                return Err(DataDirError::Io {
                    op: "remove",
                    path: member,
                    source,
                })
            }
        };
        crate::log::info(
            "a join as a learner died before its promotion was recorded: the member joins again, on an empty data dir",
            &[
                ("half_joined_data_removed", removed.into()),
                ("path", member.display().to_string().into()),
            ],
        );
    }
    remove_durably(dir, JOINING_FILE)
}

/// The pause job's record ([`PAUSE_FILE`]), raw, if there is one.
pub fn read_pause(dir: &Path) -> Result<Option<Vec<u8>>, DataDirError> {
    let path = dir.join(PAUSE_FILE);
    match fs::read(&path) {
        Ok(raw) => Ok(Some(raw)),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(DataDirError::Io {
            op: "read",
            path,
            source,
        }),
    }
}

/// Writes the pause job's record ([`PAUSE_FILE`]), atomically and
/// durably: a restart finds the old record or the new one.
pub fn write_pause(dir: &Path, json: &str) -> Result<(), DataDirError> {
    replace_file(
        dir,
        PAUSE_TEMP_FILE,
        PAUSE_FILE,
        format!("{json}\n").as_bytes(),
    )
}

/// Removes the pause job's record, durably (the directory fsynced: a
/// restart after a crash must not find a job that is over).
pub fn remove_pause(dir: &Path) -> Result<(), DataDirError> {
    remove_durably(dir, PAUSE_FILE)
}

/// Puts the hold on the data dir ([`HOLD_FILE`]), durably, with `reason`.
pub fn write_hold(dir: &Path, reason: &str) -> Result<(), DataDirError> {
    replace_file(
        dir,
        HOLD_TEMP_FILE,
        HOLD_FILE,
        format!("{reason}\n").as_bytes(),
    )
}

/// Replaces `dir/name` with `content` atomically and durably, through the
/// temp file `dir/temp_name`. (The failpoints are named after version.txt,
/// the file this writes on every step; the hold goes the same way.)
fn replace_file(
    dir: &Path,
    temp_name: &str,
    name: &str,
    content: &[u8],
) -> Result<(), DataDirError> {
    durable::write_atomic(dir, temp_name, name, content, |stage| match stage {
        Stage::TempWritten => {
            crate::failpoint!("version-txt-after-temp-write");
        }
        Stage::TempSynced => {
            crate::failpoint!("version-txt-after-fsync");
        }
        Stage::Renamed => {
            crate::failpoint!("version-txt-after-rename");
        }
    })
    .map_err(|err| {
        // Full says version.txt holds what it held before: true only
        // while the new one is unpublished.
        if err.is_no_space() && !err.published {
            DataDirError::Full {
                op: err.op,
                path: err.path,
                source: err.source,
            }
        } else {
            io_from(err)
        }
    })
}

/// A durable operation's failure as a plain I/O error of ours.
fn io_from(err: DurableError) -> DataDirError {
    DataDirError::Io {
        op: err.op,
        path: err.path,
        source: err.source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::version::{Storage, Version};

    fn pair(s: &str) -> VersionPair {
        s.parse().expect("test pair parses")
    }

    /// The restart mark: written, read back, dropped with the record; a
    /// mark that names no release is an error naming it and the fix, and
    /// reading it changes nothing.
    #[test]
    fn the_restart_mark_goes_with_the_record_and_a_bad_one_is_named() {
        let tmp = tempfile::tempdir().expect("tempdir");
        assert_eq!(read_restart_mark(tmp.path()).expect("none"), None);
        write_restart_mark(tmp.path(), Version::new(3, 4, 23)).expect("mark");
        assert_eq!(
            read_restart_mark(tmp.path()).expect("mark"),
            Some(Version::new(3, 4, 23))
        );
        record_and_unmark(tmp.path(), pair("3.4.23/etcd3")).expect("record");
        assert_eq!(read_restart_mark(tmp.path()).expect("gone"), None);
        assert_eq!(
            fs::read_to_string(tmp.path().join(VERSION_FILE)).expect("version.txt"),
            "3.4.23/etcd3"
        );
        let mark = tmp.path().join(RESTART_MARK_FILE);
        fs::write(&mark, "garbage").expect("write");
        let err = read_restart_mark(tmp.path()).expect_err("not a release");
        let text = err.to_string();
        assert!(
            text.contains(&mark.display().to_string())
                && text.contains("\"garbage\"")
                && text.contains("restart mark"),
            "{text}"
        );
        assert_eq!(fs::read_to_string(&mark).expect("still there"), "garbage");
    }

    #[test]
    fn a_hold_refuses_the_data_dir_until_it_is_removed() {
        let tmp = tempfile::tempdir().expect("tempdir");
        write_version(tmp.path(), "3.4.23/etcd3".parse().expect("pair")).expect("write");
        write_hold(tmp.path(), "step 1/1 changed the keyspace").expect("hold");
        let err = inspect(tmp.path()).expect_err("held");
        let text = err.to_string();
        assert!(matches!(err, DataDirError::Held { .. }), "{text}");
        assert!(
            text.contains(&tmp.path().join(HOLD_FILE).display().to_string())
                && text.contains("step 1/1 changed the keyspace")
                && text.contains("remove"),
            "{text}"
        );
        fs::remove_file(tmp.path().join(HOLD_FILE)).expect("release");
        assert_eq!(
            inspect(tmp.path()).expect("released"),
            DirState::Recorded("3.4.23/etcd3".parse().expect("pair"))
        );
    }

    #[test]
    fn a_version_txt_that_is_no_record_is_named_without_reading_it_whole() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path();
        fs::create_dir(dir.join("member")).expect("mkdir");
        let path = dir.join(VERSION_FILE);
        let shown = path.display().to_string();

        let nowhere = dir.join("gone/version.txt");
        std::os::unix::fs::symlink(&nowhere, &path).expect("symlink");
        let text = inspect(dir).expect_err("dangling").to_string();
        assert!(
            text.contains(&format!(
                "{shown} is a symlink to {}, which does not exist",
                nowhere.display()
            )) && text.contains(&format!("rm {shown} && echo 3.4.23/etcd3 > {shown}")),
            "{text}"
        );
        assert!(!text.contains("has no version.txt"), "{text}");
        // Pointed at a real record, the link is read through.
        fs::create_dir(dir.join("gone")).expect("mkdir");
        fs::write(&nowhere, "3.5.16/etcd3\n").expect("write");
        assert_eq!(
            inspect(dir).expect("followed"),
            DirState::Recorded(pair("3.5.16/etcd3"))
        );
        fs::remove_file(&path).expect("rm link");

        // Sparse: a GiB on paper, nothing on disk, and never read.
        let huge = File::create(&path).expect("create");
        huge.set_len(1 << 30).expect("set_len");
        let text = inspect(dir).expect_err("huge").to_string();
        assert!(
            text.contains(&format!("{shown} is 1073741824 bytes"))
                && text.contains("not a version record"),
            "{text}"
        );
        assert!(text.len() < 1000, "the message quotes no content: {text}");
        huge.set_len(MAX_VERSION_FILE_BYTES + 1).expect("set_len");
        assert!(matches!(
            inspect(dir),
            Err(DataDirError::VersionFileTooLarge { size: 4097, .. })
        ));
        // At the limit it is read, and refused as malformed (all NULs).
        huge.set_len(MAX_VERSION_FILE_BYTES).expect("set_len");
        assert!(matches!(inspect(dir), Err(DataDirError::Malformed { .. })));
        fs::remove_file(&path).expect("rm");

        nix::unistd::mkfifo(&path, nix::sys::stat::Mode::from_bits_truncate(0o600))
            .expect("mkfifo");
        let text = inspect(dir).expect_err("a FIFO is not read").to_string();
        assert!(
            text.contains(&format!("{shown} is a special file")),
            "{text}"
        );
    }

    #[test]
    fn tells_missing_empty_recorded_and_unrecorded_apart() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("data");
        assert_eq!(inspect(&dir).expect("inspects"), DirState::Missing);
        create(&dir).expect("creates");
        assert_eq!(
            fs::metadata(&dir).expect("stat").permissions().mode() & 0o777,
            0o700
        );
        assert_eq!(inspect(&dir).expect("inspects"), DirState::Empty);
        fs::create_dir(dir.join("lost+found")).expect("mkdir");
        fs::write(dir.join(VERSION_TEMP_FILE), "3.4").expect("write");
        assert_eq!(
            inspect(&dir).expect("inspects"),
            DirState::Empty,
            "lost+found and a torn temp file are not data"
        );
        fs::create_dir(dir.join("member")).expect("mkdir");
        let err = inspect(&dir).expect_err("unrecorded");
        assert!(
            err.to_string()
                .contains("is not empty (member) but has no version.txt"),
            "{err}"
        );
        write_version(&dir, pair("3.4.23/etcd3")).expect("writes");
        assert_eq!(
            inspect(&dir).expect("inspects"),
            DirState::Recorded(pair("3.4.23/etcd3"))
        );
        assert_eq!(
            fs::read_to_string(dir.join(VERSION_FILE)).expect("read"),
            "3.4.23/etcd3"
        );
        assert!(
            !dir.join(VERSION_TEMP_FILE).exists(),
            "the temp file is renamed away"
        );
    }

    #[test]
    fn a_join_that_died_before_its_record_is_started_over_and_one_that_recorded_is_kept() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path();
        // Died as a learner: the record and the half-joined `member/`.
        write_joining(dir, r#"{"target":"3.5.16/etcd3"}"#).expect("record");
        fs::create_dir_all(dir.join("member/wal")).expect("mkdir");
        fs::write(dir.join("member/wal/0.wal"), "x").expect("write");
        assert_eq!(
            inspect(dir).expect("inspects"),
            DirState::Empty,
            "a half-joined member/ is no data of the member's"
        );
        recover_interrupted_join(dir).expect("recovers");
        assert!(!dir.join("member").exists(), "the half-joined data is gone");
        assert!(!dir.join(JOINING_FILE).exists(), "and its record");
        assert_eq!(inspect(dir).expect("inspects"), DirState::Empty);

        // Died after version.txt recorded the promoted member: kept.
        write_joining(dir, r#"{"target":"3.5.16/etcd3"}"#).expect("record");
        fs::create_dir_all(dir.join("member/wal")).expect("mkdir");
        write_version(dir, pair("3.5.16/etcd3")).expect("version");
        recover_interrupted_join(dir).expect("recovers");
        assert!(dir.join("member/wal").exists(), "the joined data is kept");
        assert!(!dir.join(JOINING_FILE).exists());
        assert_eq!(
            inspect(dir).expect("inspects"),
            DirState::Recorded(pair("3.5.16/etcd3"))
        );

        // No record: a member/ without version.txt is still refused.
        fs::remove_file(dir.join(VERSION_FILE)).expect("rm");
        recover_interrupted_join(dir).expect("nothing to recover");
        assert!(
            dir.join("member/wal").exists(),
            "never removed without the record"
        );
        assert!(matches!(inspect(dir), Err(DataDirError::Unrecorded { .. })));
    }

    #[test]
    fn record_joined_writes_the_version_before_removing_the_record() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path();
        write_joining(dir, "{}").expect("record");
        record_joined(dir, pair("3.4.23/etcd3")).expect("records");
        assert!(!dir.join(JOINING_FILE).exists());
        assert_eq!(
            inspect(dir).expect("inspects"),
            DirState::Recorded(pair("3.4.23/etcd3"))
        );
    }

    #[test]
    fn malformed_version_file_is_quoted_with_its_path() {
        let tmp = tempfile::tempdir().expect("tempdir");
        fs::write(tmp.path().join(VERSION_FILE), "3.4/etcd3\n").expect("write");
        let err = inspect(tmp.path()).expect_err("malformed");
        let text = err.to_string();
        assert!(
            text.contains("version.txt holds \"3.4/etcd3\\n\""),
            "{text}"
        );
        assert!(text.contains(&tmp.path().display().to_string()), "{text}");
        fs::write(tmp.path().join(VERSION_FILE), "").expect("write");
        assert!(
            inspect(tmp.path()).is_err(),
            "an empty version.txt is refused, not taken as empty data"
        );
    }

    #[test]
    fn an_empty_version_file_says_so_and_how_to_declare_the_version() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let path = tmp.path().join(VERSION_FILE);
        for content in ["", "\n", "  \n"] {
            fs::write(&path, content).expect("write");
            let err = inspect(tmp.path()).expect_err("empty");
            let text = err.to_string();
            assert!(
                text.contains(&format!("{} is empty", path.display()))
                    && text.contains(&format!("> {}", path.display())),
                "{content:?}: {text}"
            );
        }
    }

    #[test]
    fn a_data_dir_with_another_mode_gets_0700() {
        let tmp = tempfile::tempdir().expect("tempdir");
        fs::set_permissions(tmp.path(), fs::Permissions::from_mode(0o755)).expect("chmod");
        assert_eq!(correct_mode(tmp.path()).expect("corrects"), Some(0o755));
        assert_eq!(
            fs::metadata(tmp.path()).expect("stat").permissions().mode() & 0o7777,
            0o700
        );
        assert_eq!(
            correct_mode(tmp.path()).expect("checks"),
            None,
            "idempotent"
        );
    }

    #[test]
    fn a_missing_data_dir_is_checked_through_its_parent() {
        let tmp = tempfile::tempdir().expect("tempdir");
        check_access(&tmp.path().join("a/b/data"), true).expect("the temp dir is writable");
        check_access(tmp.path(), false).expect("readable");
        check_access(Path::new("no-such-relative-dir/data"), false)
            .expect("checked through the working directory");
    }

    #[test]
    fn a_file_is_not_a_data_dir() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let file = tmp.path().join("f");
        fs::write(&file, "").expect("write");
        assert!(matches!(
            inspect(&file),
            Err(DataDirError::NotADirectory { .. })
        ));
    }

    #[test]
    fn a_second_lock_is_refused() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let _first = lock(tmp.path()).expect("first lock");
        let err = lock(tmp.path()).expect_err("second lock");
        assert!(
            err.to_string().contains("is locked by another process"),
            "{err}"
        );
    }

    /// Kills a process that rewrites version.txt in a loop at arbitrary
    /// moments; every time, version.txt must hold one of the two values.
    #[test]
    fn version_write_survives_being_killed_at_any_point() {
        let exe = std::env::current_exe().expect("test exe");
        for round in 0..25u64 {
            let tmp = tempfile::tempdir().expect("tempdir");
            write_version(tmp.path(), pair("3.3.25/etcd3")).expect("seed");
            let mut child = std::process::Command::new(&exe)
                .args([
                    "--exact",
                    "datadir::tests::crash_writer_child",
                    "--ignored",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env("ETCD_MIGRATE_CRASH_DIR", tmp.path())
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .expect("spawn writer");
            std::thread::sleep(std::time::Duration::from_millis(5 + round * 3));
            child.kill().expect("kill writer");
            child.wait().expect("reap writer");
            let state = inspect(tmp.path()).expect("version.txt is whole after a crash");
            let expected = [pair("3.3.25/etcd3"), pair("3.4.23/etcd3")];
            assert!(
                matches!(state, DirState::Recorded(p) if expected.contains(&p)),
                "round {round}: {state:?}"
            );
        }
    }

    /// Not a test on its own: the process the crash test kills.
    #[test]
    #[ignore = "run by version_write_survives_being_killed_at_any_point"]
    fn crash_writer_child() {
        let Some(dir) = std::env::var_os("ETCD_MIGRATE_CRASH_DIR") else {
            return;
        };
        let pairs = [
            VersionPair {
                version: Version::new(3, 4, 23),
                storage: Storage::Etcd3,
            },
            VersionPair {
                version: Version::new(3, 3, 25),
                storage: Storage::Etcd3,
            },
        ];
        for i in 0.. {
            write_version(Path::new(&dir), pairs[i % 2]).expect("write");
        }
    }
}
