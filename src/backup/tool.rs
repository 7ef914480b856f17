//! This module owns `etcd-migrate backup list|verify|restore`: what an
//! operator runs, inside the image (which has no `sha256sum`) or beside
//! it, to see a data dir's backups, to check one against its
//! `MANIFEST.sha256`, and to put one back into a stopped member's data
//! dir. A restore is a rebuilding step of its own: the backup's `member/`
//! is copied into the scratch dir on the data's filesystem and exchanged
//! with the data's in one atomic swap, journalled as every step's swap
//! is, so a crash at any point leaves the data as it was or as the backup
//! holds it (the next run of etcd-migrate finishes or discards the swap).

use std::ffi::OsStr;
use std::fs::{self, File};
use std::io::{self, Read};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use clap::{Parser, Subcommand};
use nix::fcntl::{Flock, FlockArg};
use sha2::{Digest, Sha256};

use super::{
    list_of, never_stop, BackupError, Owner, DEFAULT_ROOT_SUFFIX, MANIFEST_FILE, SOURCE_FILE,
};
use crate::datadir::{self, DataDirError, HOLD_FILE, RESTART_MARK_FILE, VERSION_FILE};
use crate::durable::{self, DurableError};
use crate::log;
use crate::paths;
use crate::swap::{self, SwapError};
use crate::version::VersionPair;

/// Exit code of a refusal: nothing was touched.
const EXIT_REFUSED: u8 = 2;
/// Exit code of a backup that does not match its manifest.
const EXIT_DAMAGED: u8 = 3;
/// Exit code of any other failure.
const EXIT_FAILED: u8 = 1;

/// The name of the scratch dir's entry a restore builds in.
const RESTORE_DIR: &str = "restore";

/// `etcd-migrate backup ...`.
#[derive(Debug, Parser)]
#[command(
    name = "etcd-migrate backup",
    about = "List, verify and restore the backups etcd-migrate takes (no sha256sum needed).",
    after_help = "Exit codes: 0 success; 2 refused (nothing touched); 3 the backup does not match its manifest; 1 other failure."
)]
struct BackupCli {
    #[command(subcommand)]
    command: BackupCommand,
}

#[derive(Debug, Subcommand)]
enum BackupCommand {
    /// The data dir's backups, oldest first: path, what it holds, bytes
    List {
        /// The data dir whose backups to list [env: DATA_DIRECTORY]
        #[arg(long)]
        data_dir: Option<PathBuf>,
        /// Where the backups are [default: <data-dir>.backup]
        #[arg(long)]
        backup_dir: Option<PathBuf>,
    },
    /// Check every file of BACKUP against its MANIFEST.sha256 (and that it holds no other)
    Verify {
        /// The backup (a dir under the backup dir)
        backup: PathBuf,
    },
    /// Verify BACKUP, then put it back as the stopped member's data (one atomic swap of member/)
    Restore {
        /// The backup (a dir under the backup dir)
        backup: PathBuf,
        /// The data dir it came from [env: DATA_DIRECTORY]
        #[arg(long)]
        data_dir: Option<PathBuf>,
    },
}

/// Why a backup command failed.
#[derive(Debug, thiserror::Error)]
pub enum ToolError {
    /// No data dir given.
    #[error("no data dir: pass --data-dir or set $DATA_DIRECTORY")]
    NoDataDir,
    /// The path is not a backup etcd-migrate took.
    #[error("{} is not a backup etcd-migrate took: {reason}; `etcd-migrate backup list --data-dir <data dir>` lists the backups", .path.display())]
    NotABackup {
        /// The path given.
        path: PathBuf,
        /// What is missing.
        reason: String,
    },
    /// The backup differs from its manifest.
    #[error("backup {} does not match its {MANIFEST_FILE} ({} problem(s)): {}; do not restore it: use another backup (`etcd-migrate backup list`)", .backup.display(), .problems.len(), .problems.join("; "))]
    Damaged {
        /// The backup.
        backup: PathBuf,
        /// Each difference, naming its file.
        problems: Vec<String>,
    },
    /// The backup was taken of another data dir.
    #[error("backup {} was taken of {source_dir}, not of the data dir {}: restoring it would make this member another member's copy; restore it into {source_dir}, or pick this data dir's own backup (`etcd-migrate backup list --data-dir {}`)", .backup.display(), .data_dir.display(), .data_dir.display())]
    OtherSource {
        /// The backup.
        backup: PathBuf,
        /// What its SOURCE names (or why it names nothing).
        source_dir: String,
        /// The data dir given.
        data_dir: PathBuf,
    },
    /// Something has the member's db open for writing: an etcd serves it.
    #[error("{} is locked by a running process (an etcd serving this data dir): restore only into a stopped member's data dir; stop the member (for a static pod: move its manifest out of the manifests dir) and rerun", .file.display())]
    InUse {
        /// The db file.
        file: PathBuf,
    },
    /// The data dir cannot be used.
    #[error(transparent)]
    DataDir(#[from] DataDirError),
    /// The backups cannot be listed or copied.
    #[error(transparent)]
    Backup(#[from] BackupError),
    /// The swap failed (nothing swapped, or the journal finishes it).
    #[error(transparent)]
    Swap(#[from] SwapError),
    /// A file could not be read or written.
    #[error("{op} {}: {source}", .path.display())]
    Io {
        /// What was being done.
        op: &'static str,
        /// On what.
        path: PathBuf,
        /// Why it failed.
        source: io::Error,
    },
}

impl ToolError {
    /// The documented exit code.
    pub fn exit_code(&self) -> u8 {
        match self {
            ToolError::NoDataDir
            | ToolError::NotABackup { .. }
            | ToolError::OtherSource { .. }
            | ToolError::InUse { .. } => EXIT_REFUSED,
            ToolError::DataDir(DataDirError::Io { .. }) => EXIT_FAILED,
            ToolError::DataDir(_) => EXIT_REFUSED,
            ToolError::Damaged { .. } => EXIT_DAMAGED,
            _ => EXIT_FAILED,
        }
    }
}

impl From<DurableError> for ToolError {
    fn from(err: DurableError) -> Self {
        ToolError::Io {
            op: err.op,
            path: err.path,
            source: err.source,
        }
    }
}

fn io_err<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> ToolError + 'a {
    move |source| ToolError::Io {
        op,
        path: path.to_path_buf(),
        source,
    }
}

/// True when `args` (program name first) ask for a backup command.
pub fn is_backup_command(args: &[String]) -> bool {
    args.get(1).is_some_and(|arg| arg == "backup")
}

/// Runs `etcd-migrate backup ...` (`args`: program name first, then
/// `backup`); prints its results on stdout, errors as our log lines;
/// returns the exit code.
pub fn main(args: &[String], env: &dyn Fn(&str) -> Option<String>) -> u8 {
    let cli = match BackupCli::try_parse_from(args.iter().skip(1)) {
        Ok(cli) => cli,
        Err(err) => {
            let _ = err.print();
            return if err.use_stderr() { EXIT_REFUSED } else { 0 };
        }
    };
    let data_dir = |flag: Option<PathBuf>| {
        flag.or_else(|| {
            env("DATA_DIRECTORY")
                .filter(|d| !d.trim().is_empty())
                .map(PathBuf::from)
        })
        .ok_or(ToolError::NoDataDir)
        .and_then(|dir| {
            paths::absolute(&dir).map_err(|source| ToolError::Io {
                op: "make absolute",
                path: dir,
                source,
            })
        })
    };
    let result = match cli.command {
        BackupCommand::List {
            data_dir: dir,
            backup_dir,
        } => data_dir(dir).and_then(|dir| list_command(&dir, backup_dir.as_deref())),
        BackupCommand::Verify { backup } => verify(&backup).map(|checked| {
            println!(
                "{}: OK, {} files, {} bytes match {MANIFEST_FILE}",
                backup.display(),
                checked.files,
                checked.bytes
            );
        }),
        BackupCommand::Restore {
            backup,
            data_dir: dir,
        } => data_dir(dir).and_then(|dir| restore(&backup, &dir).map(|_| ())),
    };
    match result {
        Ok(()) => 0,
        Err(err) => {
            log::error(&err.to_string(), &[("exit", err.exit_code().into())]);
            err.exit_code()
        }
    }
}

/// Prints the backups of `data_dir` under `root` (default
/// `<data-dir>.backup`), oldest first.
fn list_command(data_dir: &Path, root: Option<&Path>) -> Result<(), ToolError> {
    let root = match root {
        Some(root) => root.to_path_buf(),
        None => default_root(data_dir),
    };
    let backups = list_of(&root, data_dir)?;
    if backups.is_empty() {
        println!(
            "no backups of {} under {}",
            data_dir.display(),
            root.display()
        );
    }
    for backup in backups {
        let holds = read_pair(&backup)
            .map(|pair| pair.to_string())
            .unwrap_or_else(|_| "?".to_string());
        let bytes = manifest_bytes(&backup)
            .map(|b| b.to_string())
            .unwrap_or_else(|| "?".to_string());
        println!("{}  holds={holds}  bytes={bytes}", backup.display());
    }
    Ok(())
}

/// `<data-dir>.backup`, the default backup root.
fn default_root(data_dir: &Path) -> PathBuf {
    let mut root = data_dir.as_os_str().to_owned();
    root.push(DEFAULT_ROOT_SUFFIX);
    PathBuf::from(root)
}

/// The pair a backup holds: its `version.txt`.
fn read_pair(backup: &Path) -> Result<VersionPair, ToolError> {
    let file = backup.join(VERSION_FILE);
    let text = fs::read_to_string(&file).map_err(|err| ToolError::NotABackup {
        path: backup.to_path_buf(),
        reason: format!("{}: {err}", file.display()),
    })?;
    text.trim().parse().map_err(|err| ToolError::NotABackup {
        path: backup.to_path_buf(),
        reason: format!("{} holds {:?}: {err}", file.display(), text.trim()),
    })
}

/// The bytes a backup's files hold, by the sizes on disk of what its
/// manifest lists (a quick figure for `list`; `verify` checks them).
fn manifest_bytes(backup: &Path) -> Option<u64> {
    let entries = read_manifest(backup).ok()?;
    Some(
        entries
            .iter()
            .filter_map(|(path, _)| fs::symlink_metadata(backup.join(path)).ok())
            .map(|meta| meta.len())
            .sum(),
    )
}

/// One manifest line: the file (relative to the backup) and its digest.
type Entry = (PathBuf, [u8; 32]);

/// The backup's manifest, parsed as `sha256sum -c` reads it: `<hex>
/// <path>` per line, a leading backslash marking a name with `\\` and
/// `\n` escapes. Every path must stay inside the backup.
fn read_manifest(backup: &Path) -> Result<Vec<Entry>, ToolError> {
    let file = backup.join(MANIFEST_FILE);
    let text = fs::read(&file).map_err(|err| ToolError::NotABackup {
        path: backup.to_path_buf(),
        reason: format!("{}: {err}", file.display()),
    })?;
    let bad = |n: usize, why: &str| ToolError::Damaged {
        backup: backup.to_path_buf(),
        problems: vec![format!("{MANIFEST_FILE} line {n}: {why}")],
    };
    let mut entries = Vec::new();
    for (index, line) in text.split(|b| *b == b'\n').enumerate() {
        let n = index + 1;
        if line.is_empty() {
            continue;
        }
        let (escaped, line) = match line.strip_prefix(b"\\") {
            Some(rest) => (true, rest),
            None => (false, line),
        };
        if line.len() < 66 || &line[64..66] != b"  " {
            return Err(bad(n, "not `<sha256>  <path>`"));
        }
        let digest = parse_hex(&line[..64]).ok_or_else(|| bad(n, "not a SHA-256 in hex"))?;
        let name = if escaped {
            unescape(&line[66..]).ok_or_else(|| bad(n, "a bad escape in the name"))?
        } else {
            line[66..].to_vec()
        };
        let path = PathBuf::from(OsStr::from_bytes(&name));
        if !path.components().all(|c| matches!(c, Component::Normal(_))) {
            return Err(bad(n, &format!("{} leaves the backup", path.display())));
        }
        entries.push((path, digest));
    }
    Ok(entries)
}

fn parse_hex(hex: &[u8]) -> Option<[u8; 32]> {
    let mut digest = [0u8; 32];
    for (i, pair) in hex.chunks(2).enumerate() {
        let text = std::str::from_utf8(pair).ok()?;
        *digest.get_mut(i)? = u8::from_str_radix(text, 16).ok()?;
    }
    Some(digest)
}

/// `sha256sum`'s name escapes: `\\` and `\n`.
fn unescape(name: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(name.len());
    let mut bytes = name.iter();
    while let Some(&byte) = bytes.next() {
        if byte != b'\\' {
            out.push(byte);
            continue;
        }
        match bytes.next() {
            Some(b'\\') => out.push(b'\\'),
            Some(b'n') => out.push(b'\n'),
            _ => return None,
        }
    }
    Some(out)
}

/// What a verified backup holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Checked {
    /// Files checked.
    pub files: usize,
    /// Their bytes.
    pub bytes: u64,
}

/// Checks every file the manifest of `backup` lists against its digest,
/// and that the backup holds no file the manifest does not list (but
/// `MANIFEST.sha256` and `SOURCE`): a file added to a backup would be
/// restored unchecked.
pub fn verify(backup: &Path) -> Result<Checked, ToolError> {
    let started = std::time::Instant::now();
    let entries = read_manifest(backup)?;
    let mut problems = Vec::new();
    let mut bytes = 0u64;
    for (path, digest) in &entries {
        let file = backup.join(path);
        match hash_file(&file) {
            Ok((found, len)) if found == *digest => bytes += len,
            Ok(_) => problems.push(format!("{}: content differs", path.display())),
            Err(err) => problems.push(format!("{}: {err}", path.display())),
        }
    }
    let listed: std::collections::HashSet<&Path> =
        entries.iter().map(|(path, _)| path.as_path()).collect();
    let mut found = Vec::new();
    files_in(backup, Path::new(""), &mut found).map_err(io_err("list", backup))?;
    for path in found {
        let top_file = path == Path::new(MANIFEST_FILE) || path == Path::new(SOURCE_FILE);
        if !top_file && !listed.contains(path.as_path()) {
            problems.push(format!("{}: not in the manifest", path.display()));
        }
    }
    if !problems.is_empty() {
        return Err(ToolError::Damaged {
            backup: backup.to_path_buf(),
            problems,
        });
    }
    let checked = Checked {
        files: entries.len(),
        bytes,
    };
    log::info(
        "backup verified",
        &[
            ("path", backup.display().to_string().into()),
            ("files", checked.files.into()),
            ("bytes", checked.bytes.into()),
            ("ms", log::ms(started.elapsed())),
        ],
    );
    Ok(checked)
}

/// The SHA-256 of `file` (a regular file, not followed if a link) and
/// its length.
fn hash_file(file: &Path) -> io::Result<([u8; 32], u64)> {
    let meta = fs::symlink_metadata(file)?;
    if !meta.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "not a regular file",
        ));
    }
    let mut reader = File::open(file)?;
    let mut hasher = Sha256::new();
    let mut buffer = vec![0u8; 1 << 20];
    let mut len = 0u64;
    loop {
        let n = reader.read(&mut buffer)?;
        if n == 0 {
            break;
        }
        hasher.update(&buffer[..n]);
        len += n as u64;
    }
    Ok((hasher.finalize().into(), len))
}

/// Every entry under `dir` that is not a directory, relative to the
/// backup's top (`prefix` is `dir`'s path from there).
fn files_in(dir: &Path, prefix: &Path, found: &mut Vec<PathBuf>) -> io::Result<()> {
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let relative = prefix.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            files_in(&entry.path(), &relative, found)?;
        } else {
            found.push(relative);
        }
    }
    Ok(())
}

/// Puts `backup` back as the content of `data_dir`: refused (nothing
/// touched) unless the backup verifies, was taken of this data dir, and
/// no etcd has the data open; then its `member/` is copied into the
/// scratch dir and swapped in atomically, its `version.txt` recorded, and
/// the hold and restart mark (which speak of the data replaced) removed.
/// Returns the pair the data holds now.
pub fn restore(backup: &Path, data_dir: &Path) -> Result<VersionPair, ToolError> {
    let started = std::time::Instant::now();
    if !backup.join("member").is_dir() {
        return Err(ToolError::NotABackup {
            path: backup.to_path_buf(),
            reason: "it holds no member/ dir".to_string(),
        });
    }
    let pair = read_pair(backup)?;
    check_source(backup, data_dir)?;
    let _lock = datadir::lock(data_dir)?;
    check_stopped(data_dir)?;
    verify(backup)?;
    // A scratch dir left by an interrupted run or restore is finished
    // or discarded first, as every run does.
    swap::recover_interrupted_swap(data_dir)?;
    let work = swap::fresh_work_dir(data_dir)?;
    let rebuilt = work.join(RESTORE_DIR);
    swap::create_private_dir(&rebuilt)?;
    super::copy_dir(&backup.join("member"), &rebuilt.join("member"), &never_stop)?;
    if data_dir.join("member").exists() {
        swap::swap_member(data_dir, &rebuilt, pair)?;
    } else {
        // Nothing to exchange with: one rename puts it in place.
        let member = data_dir.join("member");
        fs::rename(rebuilt.join("member"), &member).map_err(io_err("rename into", &member))?;
        durable::fsync_dir(data_dir)?;
    }
    datadir::write_version(data_dir, pair)?;
    // The record is new; give it the backup's mode, as the copy gave
    // every file of member/ its own.
    let record = data_dir.join(VERSION_FILE);
    let mode = fs::metadata(backup.join(VERSION_FILE)).map_err(io_err("stat", backup))?;
    fs::set_permissions(&record, mode.permissions()).map_err(io_err("chmod", &record))?;
    swap::finish_rebuild(data_dir);
    left_out(backup);
    for stale in [HOLD_FILE, RESTART_MARK_FILE] {
        remove_stale(data_dir, stale)?;
    }
    log::info(
        "backup restored",
        &[
            ("path", backup.display().to_string().into()),
            ("data_dir", data_dir.display().to_string().into()),
            ("holds", pair.to_string().into()),
            ("ms", log::ms(started.elapsed())),
        ],
    );
    Ok(pair)
}

/// Says which top-level entries of `backup` a restore leaves out: it puts
/// back `member/` and `version.txt`, what etcd and etcd-migrate read; a
/// file of the operator's that the data dir held is named so it can be
/// copied by hand.
fn left_out(backup: &Path) {
    let Ok(entries) = fs::read_dir(backup) else {
        return;
    };
    let restored = ["member", VERSION_FILE, MANIFEST_FILE, SOURCE_FILE];
    let mut others: Vec<String> = entries
        .filter_map(Result::ok)
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .filter(|name| !restored.contains(&name.as_str()))
        .collect();
    others.sort();
    if !others.is_empty() {
        log::warn(
            "not restored (neither etcd nor etcd-migrate reads them): copy them by hand if you need them",
            &[
                ("backup", backup.display().to_string().into()),
                ("entries", others.join(" ").into()),
            ],
        );
    }
}

/// The backup must be this data dir's: its `SOURCE` names it (or, for a
/// backup from before `SOURCE` existed, it sits in `<data-dir>.backup`).
fn check_source(backup: &Path, data_dir: &Path) -> Result<(), ToolError> {
    let root = backup.parent().unwrap_or(Path::new("/"));
    let owner = Owner::of(data_dir, root)?;
    if owner.owns(backup) {
        return Ok(());
    }
    let source_dir = match fs::read(backup.join(SOURCE_FILE)) {
        Ok(mut named) => {
            if named.last() == Some(&b'\n') {
                named.pop();
            }
            String::from_utf8_lossy(&named).into_owned()
        }
        Err(err) => format!(
            "an unknown data dir ({SOURCE_FILE}: {err}, and it is not in {})",
            default_root(data_dir).display()
        ),
    };
    Err(ToolError::OtherSource {
        backup: backup.to_path_buf(),
        source_dir,
        data_dir: data_dir.to_path_buf(),
    })
}

/// A running etcd holds an exclusive lock on its bolt db
/// (`member/snap/db`) for as long as it serves: if that lock cannot be
/// had, the member is not stopped.
fn check_stopped(data_dir: &Path) -> Result<(), ToolError> {
    let db = data_dir.join("member/snap/db");
    let file = match File::open(&db) {
        Ok(file) => file,
        Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(err) => return Err(io_err("open", &db)(err)),
    };
    match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
        Ok(_released_on_drop) => Ok(()),
        Err((_, nix::errno::Errno::EWOULDBLOCK)) => Err(ToolError::InUse { file: db }),
        Err((_, errno)) => Err(io_err("lock", &db)(io::Error::from(errno))),
    }
}

/// Removes `data_dir/name` if it is there, durably.
fn remove_stale(data_dir: &Path, name: &str) -> Result<(), ToolError> {
    let path = data_dir.join(name);
    match fs::remove_file(&path) {
        Ok(()) => {
            log::info(
                "removed with the data it spoke of",
                &[("path", path.display().to_string().into())],
            );
            Ok(durable::fsync_dir(data_dir)?)
        }
        Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(err) => Err(io_err("remove", &path)(err)),
    }
}

/// The command that verifies `backup`.
pub fn verify_command_line(backup: &Path) -> String {
    format!("etcd-migrate backup verify {}", super::quote(backup))
}

/// The command that restores `backup` into the stopped member's
/// `data_dir`.
pub fn restore_command_line(data_dir: &Path, backup: &Path) -> String {
    format!(
        "etcd-migrate backup restore {} --data-dir {}",
        super::quote(backup),
        super::quote(data_dir)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backup::create;
    use crate::backup::tests::policy;
    use std::time::SystemTime;

    fn pair(text: &str) -> VersionPair {
        text.parse().expect("pair")
    }

    /// A data dir at `3.5.16/etcd3` with a db and a WAL, and its backup.
    fn data_and_backup(root: &Path) -> (PathBuf, PathBuf) {
        let data = root.join("data");
        fs::create_dir_all(data.join("member/snap")).expect("mkdir");
        fs::create_dir_all(data.join("member/wal")).expect("mkdir");
        fs::write(data.join("member/snap/db"), vec![7u8; 70_000]).expect("write");
        fs::write(data.join("member/wal/0.wal"), b"wal").expect("write");
        datadir::write_version(&data, pair("3.5.16/etcd3")).expect("version");
        let backup = back_up(&data, default_root(&data), 3);
        (data, backup)
    }

    /// A backup of `data` (at `3.5.16/etcd3`) under `root`.
    fn back_up(data: &Path, root: PathBuf, keep: usize) -> PathBuf {
        create(
            data,
            &policy(root, keep),
            pair("3.5.16/etcd3"),
            SystemTime::now(),
            &never_stop,
        )
        .expect("backup")
    }

    #[test]
    fn verify_passes_a_fresh_backup_and_names_each_damage() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let (_data, backup) = data_and_backup(tmp.path());
        let checked = verify(&backup).expect("a fresh backup verifies");
        assert_eq!(checked.files, 3, "db, WAL, version.txt");
        assert_eq!(checked.bytes, 70_000 + 3 + "3.5.16/etcd3".len() as u64);

        fs::write(backup.join("member/wal/0.wal"), b"WAL").expect("write");
        fs::write(backup.join("member/extra"), b"x").expect("write");
        fs::remove_file(backup.join(VERSION_FILE)).expect("remove");
        let err = verify(&backup).expect_err("damaged");
        assert_eq!(err.exit_code(), EXIT_DAMAGED);
        let text = err.to_string();
        for named in [
            "member/wal/0.wal: content differs",
            "member/extra: not in the manifest",
            "version.txt: ",
        ] {
            assert!(text.contains(named), "{named:?} in {text}");
        }
    }

    #[test]
    fn a_manifest_path_that_leaves_the_backup_is_refused() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let (_data, backup) = data_and_backup(tmp.path());
        let line = format!("{}  ../../etc/passwd\n", "0".repeat(64));
        fs::write(backup.join(MANIFEST_FILE), line).expect("write");
        let err = verify(&backup).expect_err("escapes");
        assert!(err.to_string().contains("leaves the backup"), "{err}");
    }

    #[test]
    fn sha256sum_escapes_are_read_back() {
        assert_eq!(
            unescape(br"a\\b\nc").expect("valid"),
            vec![b'a', b'\\', b'b', b'\n', b'c']
        );
        assert!(unescape(br"a\x").is_none());

        // A backup of a file whose name needs them verifies.
        let tmp = tempfile::tempdir().expect("tempdir");
        let (data, _) = data_and_backup(tmp.path());
        fs::write(data.join("member/a\\b\nc"), b"odd").expect("write");
        let backup = back_up(&data, tmp.path().join("odd"), 1);
        assert_eq!(verify(&backup).expect("verifies").files, 4);
    }

    #[test]
    fn restore_swaps_the_backup_in_and_clears_what_spoke_of_the_old_data() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let (data, backup) = data_and_backup(tmp.path());
        // What a failed step leaves: other data, a later record, a hold.
        fs::write(data.join("member/snap/db"), b"later").expect("write");
        datadir::write_version(&data, pair("3.4.23/etcd3")).expect("version");
        datadir::write_hold(&data, "keyspace differs").expect("hold");

        assert_eq!(
            restore(&backup, &data).expect("restores"),
            pair("3.5.16/etcd3")
        );
        assert_eq!(
            fs::read(data.join("member/snap/db")).expect("db"),
            vec![7u8; 70_000]
        );
        assert_eq!(
            fs::read_to_string(data.join(VERSION_FILE)).expect("v"),
            "3.5.16/etcd3"
        );
        for gone in [
            HOLD_FILE,
            crate::datadir::WORK_DIR,
            "member/.etcd-migrate-swap-mark",
        ] {
            assert!(!data.join(gone).exists(), "{gone} left behind");
        }
        // The backup itself is untouched: it still verifies.
        verify(&backup).expect("still verifies");
    }

    #[test]
    fn restore_refuses_a_running_member_another_data_dirs_backup_and_damage_untouched() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let (data, backup) = data_and_backup(tmp.path());
        fs::write(data.join("member/snap/db"), b"now").expect("write");
        let untouched = |what: &str| {
            assert_eq!(
                fs::read(data.join("member/snap/db")).expect("db"),
                b"now",
                "{what}"
            );
            assert!(!data.join(crate::datadir::WORK_DIR).exists(), "{what}");
        };

        // etcd holds an exclusive flock on its db while it serves.
        let db = File::open(data.join("member/snap/db")).expect("open");
        let held = Flock::lock(db, FlockArg::LockExclusiveNonblock).expect("lock");
        let err = restore(&backup, &data).expect_err("in use");
        assert!(matches!(err, ToolError::InUse { .. }), "{err}");
        assert_eq!(err.exit_code(), EXIT_REFUSED);
        untouched("running member");
        drop(held);

        let other = tmp.path().join("other");
        fs::create_dir_all(&other).expect("mkdir");
        let err = restore(&backup, &other).expect_err("another data dir");
        assert!(matches!(err, ToolError::OtherSource { .. }), "{err}");
        assert!(
            err.to_string()
                .contains(&fs::canonicalize(&data).expect("c").display().to_string()),
            "{err}"
        );
        assert!(
            fs::read_dir(&other).expect("ls").next().is_none(),
            "nothing written"
        );

        fs::write(backup.join("member/wal/0.wal"), b"bad").expect("write");
        let err = restore(&backup, &data).expect_err("damaged");
        assert_eq!(err.exit_code(), EXIT_DAMAGED);
        untouched("damaged backup");
    }

    #[test]
    fn restore_into_a_data_dir_without_member_renames_it_in() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let (data, backup) = data_and_backup(tmp.path());
        fs::remove_dir_all(data.join("member")).expect("rm");
        restore(&backup, &data).expect("restores");
        assert_eq!(
            fs::read(data.join("member/wal/0.wal")).expect("wal"),
            b"wal"
        );
    }
}
