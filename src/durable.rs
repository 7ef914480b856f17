//! This module owns durable file operations: the atomic replacement of a
//! small file (temp → fsync → rename → fsync the directory), the fsync of a
//! directory, a new file written and fsynced, and the one place that tells
//! a full filesystem (ENOSPC, EDQUOT) from other I/O errors. Callers map
//! [`DurableError`] into their own error types, which name what the file is
//! for and what to do.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use nix::errno::Errno;

/// The mode of every file written here: private, since what we write (the
/// version record, the hold, the swap journal, a backup's manifest)
/// describes the cluster's data. The run's umask 077 would give the same.
pub const FILE_MODE: u32 = 0o600;

/// A durable operation that failed.
#[derive(Debug, thiserror::Error)]
#[error("{op} {path}: {source}")]
pub struct DurableError {
    /// What was being done: "create", "write", "fsync", "rename into
    /// place", "fsync dir".
    pub op: &'static str,
    /// The file or directory it was done to (for the rename, the target).
    pub path: PathBuf,
    /// True when the new content had already been renamed into place and
    /// only the fsync of its directory failed: the target then reads new,
    /// but a power loss may still bring back the old one.
    pub published: bool,
    /// The OS error.
    #[source]
    pub source: io::Error,
}

impl DurableError {
    /// True when the filesystem is full (out of space, or of quota).
    pub fn is_no_space(&self) -> bool {
        is_no_space(&self.source)
    }
}

/// True when `err` says the filesystem is full: ENOSPC, or EDQUOT (a
/// quota is a full filesystem to the writer).
pub fn is_no_space(err: &io::Error) -> bool {
    matches!(
        err.raw_os_error(),
        Some(code) if code == Errno::ENOSPC as i32 || code == Errno::EDQUOT as i32
    )
}

fn failed<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> DurableError + 'a {
    move |source| DurableError {
        op,
        path: path.to_path_buf(),
        published: false,
        source,
    }
}

/// Fsyncs the directory `dir`, which makes durable the entries created,
/// renamed or removed in it: a file's own fsync does not cover its name.
pub fn fsync_dir(dir: &Path) -> Result<(), DurableError> {
    File::open(dir)
        .and_then(|handle| handle.sync_all())
        .map_err(failed("fsync dir", dir))
}

/// The points of [`write_atomic`], in order, at which its caller may look
/// (the crash tests die there).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// The temp file holds the content, not yet fsynced.
    TempWritten,
    /// The temp file is fsynced, not yet renamed.
    TempSynced,
    /// The temp file is renamed over the target; the directory is not yet
    /// fsynced.
    Renamed,
}

/// Replaces `dir/name` with `content` atomically and durably, through the
/// temp file `dir/temp_name` (mode [`FILE_MODE`]): after a crash at any
/// point, `dir/name` holds the old content or the new, never a mix or
/// nothing. `at` is called at each [`Stage`]. On an error before the
/// rename, the temp file is removed and the target was not touched.
pub fn write_atomic(
    dir: &Path,
    temp_name: &str,
    name: &str,
    content: &[u8],
    mut at: impl FnMut(Stage),
) -> Result<(), DurableError> {
    let temp = dir.join(temp_name);
    let target = dir.join(name);
    if let Err(err) = write_temp(&temp, content, &mut at) {
        // Never leave a half-written temp file behind (a full disk fails
        // the write or the fsync): the target itself was not touched.
        let _ = fs::remove_file(&temp);
        return Err(err);
    }
    at(Stage::TempSynced);
    // rename(2) within one directory is atomic: readers see the old file or
    // the new one, never a partial write.
    if let Err(source) = fs::rename(&temp, &target) {
        let _ = fs::remove_file(&temp);
        return Err(failed("rename into place", &target)(source));
    }
    at(Stage::Renamed);
    // The rename is a change to the directory: fsync it, or a power loss
    // can bring back the old file (for version.txt: a completed step would
    // be forgotten, and rerun on data that has moved on).
    fsync_dir(dir).map_err(|err| DurableError {
        published: true,
        ..err
    })
}

/// Writes and fsyncs the temp file [`write_atomic`] renames into place.
fn write_temp(temp: &Path, content: &[u8], at: &mut impl FnMut(Stage)) -> Result<(), DurableError> {
    let mut file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(FILE_MODE)
        .open(temp)
        .map_err(failed("create", temp))?;
    file.write_all(content).map_err(failed("write", temp))?;
    at(Stage::TempWritten);
    // Flush the content before the rename publishes it: without this a
    // power loss can leave the file renamed but empty (kubernetes#98989).
    file.sync_all().map_err(failed("fsync", temp))
}

/// Writes `content` to the new file `path` (mode [`FILE_MODE`]; an
/// existing file is an error) and fsyncs it. Its name is durable only once
/// its directory is fsynced ([`fsync_dir`]), which callers writing several
/// files do once, after the last.
pub fn write_new(path: &Path, content: &[u8]) -> Result<(), DurableError> {
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(FILE_MODE)
        .open(path)
        .map_err(failed("create", path))?;
    file.write_all(content).map_err(failed("write", path))?;
    // The content must be on disk before anything that vouches for it (a
    // manifest, a rename that publishes its directory) is.
    file.sync_all().map_err(failed("fsync", path))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn write_atomic_replaces_the_file_and_leaves_no_temp() {
        let tmp = tempfile::tempdir().expect("tempdir");
        fs::write(tmp.path().join("v"), "old").expect("seed");
        write_atomic(tmp.path(), ".v.tmp", "v", b"new", |_| {}).expect("write");
        assert_eq!(fs::read(tmp.path().join("v")).expect("read"), b"new");
        assert!(!tmp.path().join(".v.tmp").exists());
        let mode = fs::metadata(tmp.path().join("v"))
            .expect("stat")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, FILE_MODE);
    }

    #[test]
    fn write_atomic_shows_old_content_until_the_rename() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let target = tmp.path().join("v");
        fs::write(&target, "old").expect("seed");
        let mut seen = Vec::new();
        write_atomic(tmp.path(), ".v.tmp", "v", b"new", |stage| {
            let temp = fs::read(tmp.path().join(".v.tmp")).ok();
            seen.push((stage, fs::read(&target).expect("target"), temp));
        })
        .expect("write");
        assert_eq!(
            seen,
            vec![
                (Stage::TempWritten, b"old".to_vec(), Some(b"new".to_vec())),
                (Stage::TempSynced, b"old".to_vec(), Some(b"new".to_vec())),
                (Stage::Renamed, b"new".to_vec(), None),
            ]
        );
    }

    #[test]
    fn write_atomic_into_a_missing_dir_fails_unpublished_naming_the_temp() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("gone");
        let err = write_atomic(&dir, ".v.tmp", "v", b"new", |_| {}).expect_err("no dir");
        assert_eq!(err.op, "create");
        assert_eq!(err.path, dir.join(".v.tmp"));
        assert!(!err.published && !err.is_no_space());
        assert!(err.to_string().contains(".v.tmp"), "{err}");
    }

    #[test]
    fn a_failed_rename_removes_the_temp_and_keeps_the_target() {
        let tmp = tempfile::tempdir().expect("tempdir");
        // A non-empty directory under the target name: rename(2) refuses.
        fs::create_dir_all(tmp.path().join("v").join("x")).expect("dir");
        let err = write_atomic(tmp.path(), ".v.tmp", "v", b"new", |_| {}).expect_err("dir");
        assert_eq!(err.op, "rename into place");
        assert_eq!(err.path, tmp.path().join("v"));
        assert!(!tmp.path().join(".v.tmp").exists());
        assert!(tmp.path().join("v").join("x").is_dir());
    }

    #[test]
    fn write_new_refuses_an_existing_file() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let path = tmp.path().join("MANIFEST");
        write_new(&path, b"one").expect("first");
        assert_eq!(fs::read(&path).expect("read"), b"one");
        let err = write_new(&path, b"two").expect_err("exists");
        assert_eq!(err.op, "create");
        assert_eq!(fs::read(&path).expect("read"), b"one");
    }

    #[test]
    fn fsync_dir_names_a_missing_dir() {
        let tmp = tempfile::tempdir().expect("tempdir");
        fsync_dir(tmp.path()).expect("fsync");
        let gone = tmp.path().join("gone");
        let err = fsync_dir(&gone).expect_err("missing");
        assert_eq!((err.op, err.path.as_path()), ("fsync dir", gone.as_path()));
    }

    #[test]
    fn no_space_is_enospc_or_edquot_only() {
        for (errno, full) in [
            (Errno::ENOSPC, true),
            (Errno::EDQUOT, true),
            (Errno::EIO, false),
            (Errno::EROFS, false),
        ] {
            assert_eq!(is_no_space(&io::Error::from(errno)), full, "{errno}");
        }
        assert!(!is_no_space(&io::Error::other("not an OS error")));
    }

    #[test]
    fn a_full_filesystem_is_reported_as_no_space() {
        // /dev/full fails every write with ENOSPC.
        let Ok(mut full) = OpenOptions::new().write(true).open("/dev/full") else {
            return;
        };
        let err = full
            .write_all(b"x")
            .and_then(|()| full.flush())
            .expect_err("full");
        let err = failed("write", Path::new("/dev/full"))(err);
        assert!(err.is_no_space(), "{err}");
    }
}
