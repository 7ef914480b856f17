//! This module owns how one file's bytes are copied, the fastest safe way
//! the filesystem offers, and the tally of a whole copy (methods, bytes,
//! time) that a backup or a scratch copy logs when it is done:
//!
//! 0. for a backup that retires the data dir's files (`backup::Source::Retired`:
//!    no etcd opens them again), a hard link: the backup takes the file
//!    itself, and only reads it for its hash;
//! 1. a reflink (`FICLONE`): the copy shares the source's extents, copy on
//!    write (btrfs, XFS with reflink, bcachefs), so a multi-GB db costs a
//!    metadata update;
//! 2. `copy_file_range`: the kernel copies, without the trip through our
//!    buffer (and NFS or SMB may copy on the server);
//! 3. a read/write loop through one buffer.
//!
//! A method the filesystem does not offer fails at once with one of a few
//! errnos ([`not_offered`]; ext4 answers a reflink with EOPNOTSUPP): the
//! next one is tried from where the last stopped. Any other error is the
//! copy's. Every method copies from the first byte to the end of the
//! source; the caller fsyncs the copy. Nothing here is unsafe beyond the
//! one `ioctl`.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

use crate::log;

/// How a file was copied.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Method {
    /// A hard link: the file itself (a retired data dir's, in a backup).
    HardLink,
    /// `FICLONE`: shared extents.
    Reflink,
    /// `copy_file_range`: an in-kernel copy.
    CopyFileRange,
    /// read/write through our buffer (also: a kernel copy that stopped
    /// short and was finished this way).
    ReadWrite,
}

impl Method {
    /// The name in a log line.
    pub fn as_str(self) -> &'static str {
        match self {
            Method::HardLink => "hard link",
            Method::Reflink => "reflink",
            Method::CopyFileRange => "copy_file_range",
            Method::ReadWrite => "read/write",
        }
    }
}

/// A copy that failed.
#[derive(Debug, thiserror::Error)]
#[error("{op} {path}: {source}")]
pub struct CopyError {
    /// "read", "clone into", "copy into", "write", "read back".
    pub op: &'static str,
    /// The file it was done to.
    pub path: PathBuf,
    /// The OS error.
    #[source]
    pub source: io::Error,
}

/// The two ends of one file's copy: the source open for reading, the new
/// empty copy open for writing (and reading, to hash it back).
pub struct Ends<'a> {
    /// The source.
    pub from: &'a File,
    /// Its path, for errors.
    pub from_path: &'a Path,
    /// The copy.
    pub to: &'a File,
    /// Its path, for errors.
    pub to_path: &'a Path,
}

/// The system calls of the fast methods: the real ones, or (in tests)
/// ones that fail as a filesystem without them does.
#[derive(Clone, Copy)]
pub struct Kernel {
    /// Makes `to` share `from`'s extents.
    pub reflink: fn(from: &File, to: &File) -> io::Result<()>,
    /// Copies up to `len` bytes at `offset` in both files; returns how
    /// many (0 at the end).
    pub copy_range: fn(from: &File, to: &File, offset: u64, len: usize) -> io::Result<usize>,
}

/// The real system calls.
pub const KERNEL: Kernel = Kernel {
    reflink: ficlone,
    copy_range: copy_file_range,
};

fn ficlone(from: &File, to: &File) -> io::Result<()> {
    // SAFETY: FICLONE takes the source's descriptor as its argument and
    // touches no memory of ours; both descriptors are open for the call.
    let rc = unsafe { nix::libc::ioctl(to.as_raw_fd(), nix::libc::FICLONE, from.as_raw_fd()) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

fn copy_file_range(from: &File, to: &File, offset: u64, len: usize) -> io::Result<usize> {
    let mut off_in = i64::try_from(offset).map_err(io::Error::other)?;
    let mut off_out = off_in;
    nix::fcntl::copy_file_range(from, Some(&mut off_in), to, Some(&mut off_out), len)
        .map_err(io::Error::from)
}

/// True when `err` says the filesystem (or kernel) does not offer the
/// method for these two files, so the next one should be tried:
/// EOPNOTSUPP (no reflink on ext4), ENOTTY (no such ioctl), EXDEV (two
/// filesystems), EINVAL (a file the method cannot take), ENOSYS (an old
/// kernel), EPERM (a seccomp filter that forbids the call).
pub fn not_offered(err: &io::Error) -> bool {
    use nix::libc::{EINVAL, ENOSYS, ENOTTY, EOPNOTSUPP, EPERM, EXDEV};
    matches!(
        err.raw_os_error(),
        Some(EOPNOTSUPP | ENOTTY | EXDEV | EINVAL | ENOSYS | EPERM)
    )
}

/// One file copied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Copied {
    /// The slowest method that copied any of it.
    pub method: Method,
    /// Bytes copied.
    pub bytes: u64,
}

/// What sees every byte of a copy (a hash).
pub type ByteSink<'h> = &'h mut dyn FnMut(&[u8]);

/// What a copy asks of its caller as it goes.
pub struct Hooks<'h, E> {
    /// Called before the first byte and after each chunk with the bytes
    /// that chunk finished: copied, or, where `bytes` is set and sees the
    /// copy read back, read back (so a file's bytes count once, when its
    /// hash has them); an error (a termination signal) stops the copy.
    pub between: &'h mut dyn FnMut(u64) -> Result<(), E>,
    /// If set, sees every byte of the copy in order (a hash): read from
    /// the source in the read/write loop, read back from the copy when the
    /// kernel copied (so it vouches for what the copy holds).
    pub bytes: Option<ByteSink<'h>>,
}

/// Copies `ends.from` into the empty `ends.to`, trying `first` and then
/// each slower method, `buffer.len()` bytes per chunk (the kernel copy
/// too, so `between` is asked as often whatever the method).
pub fn copy_file<E: From<CopyError>>(
    kernel: &Kernel,
    ends: &Ends<'_>,
    first: Method,
    buffer: &mut [u8],
    hooks: &mut Hooks<'_, E>,
) -> Result<Copied, E> {
    let fail = |op: &'static str, path: &Path| {
        let path = path.to_path_buf();
        move |source| E::from(CopyError { op, path, source })
    };
    // Where the copy is read back for `bytes`, that read is what finishes
    // a byte: the kernel's copy counts nothing yet.
    let read_back_later = hooks.bytes.is_some();
    let counted = |n: u64| if read_back_later { 0 } else { n };
    (hooks.between)(0)?;
    if first == Method::Reflink {
        match (kernel.reflink)(ends.from, ends.to) {
            Ok(()) => {
                let bytes = ends
                    .to
                    .metadata()
                    .map_err(fail("stat", ends.to_path))?
                    .len();
                (hooks.between)(counted(bytes))?;
                read_back(ends, buffer, hooks)?;
                return Ok(Copied {
                    method: Method::Reflink,
                    bytes,
                });
            }
            Err(err) if not_offered(&err) => {}
            Err(err) => return Err(fail("clone into", ends.to_path)(err)),
        }
    }
    let chunk = buffer.len().max(1);
    let mut offset = 0u64;
    let mut method = Method::ReadWrite;
    if first <= Method::CopyFileRange {
        method = Method::CopyFileRange;
        loop {
            match (kernel.copy_range)(ends.from, ends.to, offset, chunk) {
                Ok(0) => break,
                Ok(copied) => {
                    offset += copied as u64;
                    (hooks.between)(counted(copied as u64))?;
                }
                Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
                Err(err) if not_offered(&err) => {
                    method = Method::ReadWrite;
                    break;
                }
                Err(err) => return Err(fail("copy into", ends.to_path)(err)),
            }
        }
        // A kernel copy can stop short of the end (0 from a filesystem
        // that copies nothing, e.g. procfs before 5.3, and fuse): the
        // loop below finishes it, or finds the end at once.
        let len = ends
            .from
            .metadata()
            .map_err(fail("stat", ends.from_path))?
            .len();
        if offset < len {
            method = Method::ReadWrite;
        }
    }
    let in_stream = offset == 0 && method == Method::ReadWrite;
    loop {
        let read = match ends.from.read_at(buffer, offset) {
            Ok(0) => break,
            Ok(read) => read,
            Err(err) if err.kind() == io::ErrorKind::Interrupted => continue,
            Err(err) => return Err(fail("read", ends.from_path)(err)),
        };
        let data = &buffer[..read];
        if in_stream {
            if let Some(bytes) = hooks.bytes.as_mut() {
                bytes(data);
            }
        }
        ends.to
            .write_all_at(data, offset)
            .map_err(fail("write", ends.to_path))?;
        offset += read as u64;
        let finished = if in_stream {
            read as u64
        } else {
            counted(read as u64)
        };
        (hooks.between)(finished)?;
    }
    if !in_stream {
        read_back(ends, buffer, hooks)?;
    }
    Ok(Copied {
        method,
        bytes: offset,
    })
}

/// A file hard-linked into a backup ([`Method::HardLink`]): its bytes,
/// read from the link, fed to `hooks.bytes` (the hash), `between` told
/// after each chunk.
pub fn read_linked<E: From<CopyError>>(
    file: &File,
    path: &Path,
    buffer: &mut [u8],
    hooks: &mut Hooks<'_, E>,
) -> Result<Copied, E> {
    (hooks.between)(0)?;
    let ends = Ends {
        from: file,
        from_path: path,
        to: file,
        to_path: path,
    };
    read_back(&ends, buffer, hooks)?;
    let bytes = file
        .metadata()
        .map_err(|source| {
            E::from(CopyError {
                op: "stat",
                path: path.to_path_buf(),
                source,
            })
        })?
        .len();
    Ok(Copied {
        method: Method::HardLink,
        bytes,
    })
}

/// Feeds the copy's bytes, read back from it, to `hooks.bytes` (if set),
/// telling `between` after each chunk how many it read.
fn read_back<E: From<CopyError>>(
    ends: &Ends<'_>,
    buffer: &mut [u8],
    hooks: &mut Hooks<'_, E>,
) -> Result<(), E> {
    let Some(bytes) = hooks.bytes.as_mut() else {
        return Ok(());
    };
    let mut offset = 0u64;
    loop {
        let read = match ends.to.read_at(buffer, offset) {
            Ok(0) => return Ok(()),
            Ok(read) => read,
            Err(err) if err.kind() == io::ErrorKind::Interrupted => continue,
            Err(source) => {
                return Err(E::from(CopyError {
                    op: "read back",
                    path: ends.to_path.to_path_buf(),
                    source,
                }))
            }
        };
        bytes(&buffer[..read]);
        offset += read as u64;
        (hooks.between)(read as u64)?;
    }
}

/// What a whole copy did: files and bytes by method, and since when.
pub struct Tally {
    started: Instant,
    files: [u64; 4],
    bytes: [u64; 4],
}

impl Default for Tally {
    fn default() -> Self {
        Tally {
            started: Instant::now(),
            files: [0; 4],
            bytes: [0; 4],
        }
    }
}

impl Tally {
    /// Counts one file.
    pub fn add(&mut self, copied: Copied) {
        let slot = copied.method as usize;
        self.files[slot] += 1;
        self.bytes[slot] += copied.bytes;
    }

    /// The methods used, fastest first: `reflink`, or e.g.
    /// `copy_file_range (12 files), read/write (1 files)` when they mixed.
    pub fn methods(&self) -> String {
        let used: Vec<(Method, u64)> = [
            Method::HardLink,
            Method::Reflink,
            Method::CopyFileRange,
            Method::ReadWrite,
        ]
        .into_iter()
        .map(|m| (m, self.files[m as usize]))
        .filter(|(_, files)| *files > 0)
        .collect();
        match used.as_slice() {
            [] => "none".to_string(),
            [(method, _)] => method.as_str().to_string(),
            many => many
                .iter()
                .map(|(m, files)| format!("{} ({files} files)", m.as_str()))
                .collect::<Vec<_>>()
                .join(", "),
        }
    }

    /// Bytes copied in all.
    pub fn bytes(&self) -> u64 {
        self.bytes.iter().sum()
    }

    /// Logs `copy done`: what was copied where, how, how many bytes and
    /// files, and how long it took.
    pub fn log_done(&self, what: &str, to: &Path) {
        let elapsed = self.started.elapsed();
        let bytes = self.bytes();
        let secs = elapsed.as_secs_f64().max(0.001);
        log::info(
            "copy done",
            &[
                ("what", what.into()),
                ("to", to.display().to_string().into()),
                ("method", self.methods().into()),
                ("files", self.files.iter().sum::<u64>().into()),
                ("bytes", bytes.into()),
                ("ms", log::ms(elapsed)),
                (
                    "mb_per_s",
                    format!("{:.1}", bytes as f64 / 1e6 / secs).into(),
                ),
            ],
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs::OpenOptions;

    #[derive(Debug)]
    struct Stopped(#[allow(dead_code)] CopyError);

    impl From<CopyError> for Stopped {
        fn from(err: CopyError) -> Self {
            Stopped(err)
        }
    }

    fn unsupported() -> io::Error {
        io::Error::from_raw_os_error(nix::libc::EOPNOTSUPP)
    }

    const NO_REFLINK: Kernel = Kernel {
        reflink: |_, _| Err(unsupported()),
        copy_range: copy_file_range,
    };

    const NOTHING_FAST: Kernel = Kernel {
        reflink: |_, _| Err(io::Error::from_raw_os_error(nix::libc::EXDEV)),
        copy_range: |_, _, _, _| Err(io::Error::from_raw_os_error(nix::libc::ENOSYS)),
    };

    /// A kernel copy that copies one chunk and then says it is done.
    const SHORT_KERNEL_COPY: Kernel = Kernel {
        reflink: |_, _| Err(unsupported()),
        copy_range: |from, to, offset, len| {
            if offset == 0 {
                copy_file_range(from, to, offset, len)
            } else {
                Ok(0)
            }
        },
    };

    const BROKEN_REFLINK: Kernel = Kernel {
        reflink: |_, _| Err(io::Error::from_raw_os_error(nix::libc::EIO)),
        copy_range: copy_file_range,
    };

    /// Bytes that differ at every offset of a chunk, so a misplaced chunk
    /// shows.
    fn content(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 7 + i / 4096) as u8).collect()
    }

    struct Run {
        copied: Result<Copied, Stopped>,
        copy: Vec<u8>,
        hashed: Vec<u8>,
        chunks: usize,
        counted: u64,
    }

    fn run(kernel: &Kernel, first: Method, source: &[u8], hash: bool) -> Run {
        let tmp = tempfile::tempdir().expect("tempdir");
        let from_path = tmp.path().join("from");
        let to_path = tmp.path().join("to");
        std::fs::write(&from_path, source).expect("write");
        let from = File::open(&from_path).expect("open");
        let to = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&to_path)
            .expect("create");
        let ends = Ends {
            from: &from,
            from_path: &from_path,
            to: &to,
            to_path: &to_path,
        };
        let mut hashed = Vec::new();
        let mut sink = |b: &[u8]| hashed.extend_from_slice(b);
        let mut chunks = 0;
        let mut counted = 0;
        let mut between = |n: u64| -> Result<(), Stopped> {
            chunks += 1;
            counted += n;
            Ok(())
        };
        let mut hooks = Hooks {
            between: &mut between,
            bytes: if hash { Some(&mut sink) } else { None },
        };
        let mut buffer = vec![0; 64 * 1024];
        let copied = copy_file(kernel, &ends, first, &mut buffer, &mut hooks);
        Run {
            copied,
            copy: std::fs::read(&to_path).expect("read copy"),
            hashed,
            chunks,
            counted,
        }
    }

    #[test]
    fn every_method_makes_a_byte_identical_copy_and_hashes_what_it_holds() {
        let source = content(300 * 1024 + 7);
        for first in [Method::Reflink, Method::CopyFileRange, Method::ReadWrite] {
            let r = run(&KERNEL, first, &source, true);
            let copied = r.copied.expect("copied");
            assert_eq!(copied.bytes, source.len() as u64, "{first:?}");
            assert!(copied.method >= first, "{first:?} gave {copied:?}");
            assert!(r.copy == source, "{first:?}: the copy differs");
            assert!(r.hashed == source, "{first:?}: the hashed bytes differ");
        }
    }

    #[test]
    fn each_byte_is_counted_once_whatever_the_method_and_hash() {
        let source = content(300_000);
        for kernel in [KERNEL, NO_REFLINK, NOTHING_FAST, SHORT_KERNEL_COPY] {
            for first in [Method::Reflink, Method::CopyFileRange, Method::ReadWrite] {
                for hash in [false, true] {
                    let r = run(&kernel, first, &source, hash);
                    assert_eq!(r.counted, source.len() as u64, "{first:?} hash {hash}");
                }
            }
        }
    }

    #[test]
    fn forced_read_write_is_read_write() {
        let source = content(100_000);
        let r = run(&KERNEL, Method::ReadWrite, &source, false);
        assert_eq!(r.copied.expect("copied").method, Method::ReadWrite);
        assert!(r.copy == source);
        // Before the first byte, then one per 64 KiB chunk.
        assert_eq!(r.chunks, 1 + 2);
    }

    #[test]
    fn without_reflink_the_kernel_copies() {
        let source = content(200_000);
        let r = run(&NO_REFLINK, Method::Reflink, &source, true);
        // copy_file_range itself may be missing where the tests run (an
        // old kernel, a seccomp filter): then read/write.
        let method = r.copied.expect("copied").method;
        assert!(method >= Method::CopyFileRange, "{method:?}");
        assert!(r.copy == source && r.hashed == source);
    }

    #[test]
    fn with_no_fast_method_the_loop_copies() {
        let source = content(200_000);
        let r = run(&NOTHING_FAST, Method::Reflink, &source, true);
        assert_eq!(r.copied.expect("copied").method, Method::ReadWrite);
        assert!(r.copy == source && r.hashed == source);
    }

    #[test]
    fn a_kernel_copy_that_stops_short_is_finished_by_the_loop() {
        let source = content(200_000);
        let r = run(&SHORT_KERNEL_COPY, Method::Reflink, &source, true);
        let copied = r.copied.expect("copied");
        assert_eq!(copied.method, Method::ReadWrite);
        assert_eq!(copied.bytes, source.len() as u64);
        assert!(r.copy == source, "the copy differs");
        assert!(r.hashed == source, "the hash saw other bytes");
    }

    #[test]
    fn an_error_that_is_not_a_missing_method_fails_the_copy() {
        let r = run(&BROKEN_REFLINK, Method::Reflink, &content(10), false);
        let Err(Stopped(err)) = r.copied else {
            panic!("copied")
        };
        assert_eq!(err.op, "clone into");
        assert!(err.path.ends_with("to"), "{err}");
    }

    #[test]
    fn an_empty_file_copies_as_empty() {
        for first in [Method::Reflink, Method::CopyFileRange, Method::ReadWrite] {
            let r = run(&KERNEL, first, &[], true);
            assert_eq!(r.copied.expect("copied").bytes, 0);
            assert!(r.copy.is_empty() && r.hashed.is_empty());
        }
    }

    #[test]
    fn only_missing_methods_fall_back() {
        for errno in [nix::libc::EOPNOTSUPP, nix::libc::EXDEV, nix::libc::ENOSYS] {
            assert!(not_offered(&io::Error::from_raw_os_error(errno)));
        }
        for errno in [nix::libc::EIO, nix::libc::ENOSPC, nix::libc::EDQUOT] {
            assert!(!not_offered(&io::Error::from_raw_os_error(errno)));
        }
    }

    #[test]
    fn a_tally_names_one_method_or_each_with_its_files() {
        let mut tally = Tally::default();
        tally.add(Copied {
            method: Method::CopyFileRange,
            bytes: 10,
        });
        assert_eq!(tally.methods(), "copy_file_range");
        tally.add(Copied {
            method: Method::ReadWrite,
            bytes: 5,
        });
        tally.add(Copied {
            method: Method::CopyFileRange,
            bytes: 1,
        });
        assert_eq!(
            tally.methods(),
            "copy_file_range (2 files), read/write (1 files)"
        );
        assert_eq!(tally.bytes(), 16);
    }
}
