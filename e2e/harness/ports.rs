//! This module owns the loopback ports the tests hand to etcd and to
//! etcd-migrate: ports outside the kernel's ephemeral range, reserved for
//! the life of the test process by a lock that every test process on the
//! machine honours.
//!
//! Why not `bind(127.0.0.1:0)`: that draws from the ephemeral range
//! (`/proc/sys/net/ipv4/ip_local_port_range`), which the kernel also hands
//! to every outgoing connection. A test that kills a run and reruns it on
//! the same ports (the crash tests do, hundreds of times) finds, on a busy
//! machine, that a client socket of some other test took the port while
//! nothing listened on it, and the rerun cannot bind. A port outside that
//! range is never given to an outgoing connection; our lock keeps other
//! test processes (several people or CI jobs running the suite at once)
//! off it; the bind check at hand-out skips whatever else listens there.
//!
//! The lock: one file per block of [`BLOCK`] ports under [`LOCK_DIR`],
//! `flock`ed (exclusive, non-blocking) the first time the process needs a
//! port from it and never unlocked: the kernel releases it when the process
//! exits, however it ends. A lock per block instead of per port keeps the
//! process to a handful of descriptors (a crash-test run uses about a
//! thousand ports).

use std::collections::BTreeSet;
use std::fs::{File, OpenOptions};
use std::io::ErrorKind;
use std::net::TcpListener;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};

/// The lowest port handed out: above the registered ports of common
/// services (etcd's 2379/2380 among them).
const FIRST_PORT: u16 = 10000;

/// How many ports one lock file covers.
const BLOCK: u16 = 100;

/// etcd-migrate's own default client ports: a run started by hand on this
/// machine may take them at any moment, so no test gets them.
const NEVER: [u16; 2] = [18629, 18631];

/// Where the block locks live: the system temp dir itself, not `$TMPDIR`,
/// so that processes of different users and CI jobs with their own
/// `$TMPDIR` still see each other's locks.
const LOCK_DIR: &str = "/tmp/etcd-migrate-test-ports";

/// Where the kernel says its ephemeral range is.
const EPHEMERAL_RANGE: &str = "/proc/sys/net/ipv4/ip_local_port_range";

/// What this process has reserved.
struct Reserved {
    /// The first port of every block outside the ephemeral range, in the
    /// order this process tries them.
    blocks: Vec<u16>,
    /// The next index into `blocks` to try locking.
    next_block: usize,
    /// The locks held; never dropped before the process exits.
    held: Vec<Flock<File>>,
    /// The next port to look at in the newest held block, and the end of
    /// that block (exclusive).
    cursor: Option<(u16, u32)>,
    /// Every port handed out (tests run in parallel threads).
    handed_out: BTreeSet<u16>,
}

static RESERVED: Mutex<Option<Reserved>> = Mutex::new(None);

/// A loopback port outside the ephemeral range that nothing listened on
/// when it was handed out, never handed out twice in this process, and
/// reserved against every other test process for the life of this one: a
/// test may kill what listens on it and bind it again later.
pub fn free_port() -> u16 {
    let mut guard = RESERVED
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let reserved = guard.get_or_insert_with(Reserved::new);
    loop {
        let (port, end) = match reserved.cursor {
            Some((port, end)) if u32::from(port) < end => (port, end),
            _ => {
                let first = reserved.lock_next_block();
                (first, u32::from(first) + u32::from(BLOCK))
            }
        };
        reserved.cursor = Some((port.saturating_add(1), end));
        if NEVER.contains(&port) || !reserved.handed_out.insert(port) {
            continue;
        }
        // Something outside our locks (a service, another program) may
        // listen there: skip it. SO_REUSEADDR (which std sets, as etcd and
        // etcd-migrate do) lets a port whose earlier connections linger in
        // TIME_WAIT count as free, as it is for them.
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

impl Reserved {
    fn new() -> Self {
        let (low, high) = ephemeral_range();
        let starts: Vec<u16> = (u32::from(FIRST_PORT)..=u32::from(u16::MAX))
            .step_by(usize::from(BLOCK))
            .map(|start| (start, start + u32::from(BLOCK) - 1))
            .filter(|&(_, last)| last <= u32::from(u16::MAX))
            .filter(|&(start, last)| last < u32::from(low) || start > u32::from(high))
            .filter_map(|(start, _)| u16::try_from(start).ok())
            .collect();
        assert!(
            !starts.is_empty(),
            "no block of {BLOCK} ports from {FIRST_PORT} up lies outside the ephemeral range \
             {low}-{high} ({EPHEMERAL_RANGE}): narrow that range"
        );
        // Each process starts at a block of its own (by pid), so parallel
        // runs rarely even try the same lock, and a new run does not reuse
        // the ports the last one just left.
        let offset = std::process::id() as usize % starts.len();
        let blocks = starts[offset..]
            .iter()
            .chain(&starts[..offset])
            .copied()
            .collect();
        Reserved {
            blocks,
            next_block: 0,
            held: Vec::new(),
            cursor: None,
            handed_out: BTreeSet::new(),
        }
    }

    /// Locks the next block no other process holds, and returns its first
    /// port; panics once every block was tried.
    fn lock_next_block(&mut self) -> u16 {
        let dir = lock_dir();
        while let Some(&start) = self.blocks.get(self.next_block) {
            self.next_block += 1;
            let path = dir.join(format!("{start}-{}.lock", start + (BLOCK - 1)));
            let file = open_lock_file(&path);
            match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
                Ok(lock) => {
                    self.held.push(lock);
                    return start;
                }
                // Another test process holds it.
                Err((_, Errno::EWOULDBLOCK)) => {}
                Err((_, errno)) => panic!("flock {}: {errno}", path.display()),
            }
        }
        panic!(
            "every block of test ports outside the ephemeral range is taken ({} blocks of {BLOCK}, \
             {} of them by this process): other test processes hold the rest (their locks are in {})",
            self.blocks.len(),
            self.held.len(),
            dir.display()
        );
    }
}

/// `(low, high)` of the kernel's ephemeral port range, or Linux's default
/// if it cannot be read.
fn ephemeral_range() -> (u16, u16) {
    let text = std::fs::read_to_string(EPHEMERAL_RANGE).unwrap_or_default();
    let mut numbers = text.split_whitespace().map(str::parse::<u16>);
    match (numbers.next(), numbers.next()) {
        (Some(Ok(low)), Some(Ok(high))) => (low, high),
        _ => (32768, 60999),
    }
}

/// [`LOCK_DIR`], created open to every user (sticky, as /tmp is) so test
/// processes of different users share it.
fn lock_dir() -> PathBuf {
    let dir = PathBuf::from(LOCK_DIR);
    match std::fs::create_dir(&dir) {
        Ok(()) => {
            // create_dir applies the umask: set the mode explicitly.
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o1777))
                .unwrap_or_else(|err| panic!("chmod 1777 {}: {err}", dir.display()));
        }
        Err(err) if err.kind() == ErrorKind::AlreadyExists => {}
        Err(err) => panic!(
            "cannot create the test port lock dir {}: {err}",
            dir.display()
        ),
    }
    dir
}

/// Opens (creating it if needed) a block's lock file. flock needs no write
/// access, so a file another user created is opened read-only.
fn open_lock_file(path: &Path) -> File {
    let created = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o666)
        .open(path);
    match created {
        Ok(file) => file,
        Err(err) if err.kind() == ErrorKind::PermissionDenied => {
            File::open(path).unwrap_or_else(|err| {
                panic!(
                    "cannot open the test port lock {}: {err} (its dir should be mode 1777: \
                     chmod 1777 {LOCK_DIR})",
                    path.display()
                )
            })
        }
        Err(err) => panic!(
            "cannot open the test port lock {}: {err} (its dir should be mode 1777: \
             chmod 1777 {LOCK_DIR})",
            path.display()
        ),
    }
}

#[test]
fn ports_lie_outside_the_ephemeral_range_and_are_locked_against_other_processes() {
    let (low, high) = ephemeral_range();
    let ports: Vec<u16> = (0..250).map(|_| free_port()).collect();
    let unique: BTreeSet<u16> = ports.iter().copied().collect();
    assert_eq!(unique.len(), ports.len(), "a port was handed out twice");
    for port in &ports {
        assert!(
            *port >= FIRST_PORT && (*port < low || *port > high),
            "port {port} is in the ephemeral range {low}-{high}"
        );
    }
    // Another process cannot take the block of any of them: `flock -n`
    // on its lock file fails while this process lives.
    let start = ports[0] - (ports[0] - FIRST_PORT) % BLOCK;
    let path = Path::new(LOCK_DIR).join(format!("{start}-{}.lock", start + BLOCK - 1));
    let status = std::process::Command::new("flock")
        .arg("--nonblock")
        .arg("--conflict-exit-code")
        .arg("99")
        .arg(&path)
        .arg("true")
        .status()
        .unwrap_or_else(|err| panic!("run flock: {err}"));
    assert_eq!(
        status.code(),
        Some(99),
        "another process could lock {} while this one holds port {}",
        path.display(),
        ports[0]
    );
}
