//! This module owns signals and children, the PID-1 part (after tini): the
//! signal mask blocked at start, the one thread that waits for signals, the
//! one place that calls `waitpid` (it reaps every child, ours and orphans
//! re-parented to PID 1), spawning children with the original mask, a
//! parent-death signal and their own process group, and stopping them with
//! a deadline and an escalation.

use std::collections::HashMap;
use std::io;
use std::os::unix::process::CommandExt;
use std::process::Command;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::prctl;
use nix::sys::signal::{self, SigSet, SigmaskHow, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;
use tokio::sync::{oneshot, watch};

use crate::log;

/// Signals that ask us to stop: forwarded to the step's etcd as a graceful
/// stop, then we exit 128+n.
pub const TERMINATION_SIGNALS: [Signal; 4] = [
    Signal::SIGTERM,
    Signal::SIGINT,
    Signal::SIGHUP,
    Signal::SIGQUIT,
];

/// How long a stopped etcd gets between SIGTERM and SIGKILL. etcd stops in
/// 3–50 ms (ETCD-NOTES); 10 s is also Docker's default stop timeout, so a
/// `docker stop` never kills us before our own escalation.
pub const STOP_GRACE: Duration = Duration::from_secs(10);

/// How long after SIGKILL we wait for the kernel to report the exit.
pub const KILL_GRACE: Duration = Duration::from_secs(5);

/// How a child ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitStatus {
    /// It called exit with this code.
    Exited(i32),
    /// A signal ended it.
    Signaled(Signal),
}

impl std::fmt::Display for ExitStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ExitStatus::Exited(code) => write!(f, "exit code {code}"),
            ExitStatus::Signaled(sig) => write!(f, "killed by {sig}"),
        }
    }
}

/// Why a child could not be spawned, signalled or waited for.
#[derive(Debug, thiserror::Error)]
pub enum SupervisorError {
    /// The signal mask could not be changed.
    #[error("cannot set the signal mask: {0}")]
    Mask(#[source] Errno),
    /// The signal thread could not start.
    #[error("cannot start the signal thread: {0}")]
    Thread(#[source] io::Error),
    /// The program could not be started.
    #[error("cannot start {program}: {source}")]
    Spawn {
        /// The program path.
        program: String,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// A second etcd was asked for while the member's etcd still runs:
    /// two would race for the same ports and data dir.
    #[error("cannot start {program}: this member's etcd (pid {pid}) still runs; one member runs one etcd")]
    AlreadyRunning {
        /// The running child.
        pid: i32,
        /// The program asked for.
        program: String,
    },
    /// A child did not exit even after SIGKILL.
    #[error("pid {pid} ({program}) did not exit within {waited:?} of SIGKILL")]
    Unkillable {
        /// The child.
        pid: i32,
        /// Its program.
        program: String,
        /// How long we waited.
        waited: Duration,
    },
}

/// The set of signals we block from the first line of `main`: termination
/// signals (handled by the signal thread) and SIGCHLD (reaping).
pub fn handled_signals() -> SigSet {
    let mut set = SigSet::empty();
    for sig in TERMINATION_SIGNALS {
        set.add(sig);
    }
    set.add(Signal::SIGCHLD);
    set
}

/// Blocks [`handled_signals`] in the calling thread and returns the mask it
/// had before. Call before any thread exists: threads inherit the mask, so
/// no thread but the signal thread ever receives these signals.
pub fn block_signals() -> Result<SigSet, SupervisorError> {
    let mut original = SigSet::empty();
    signal::pthread_sigmask(
        SigmaskHow::SIG_BLOCK,
        Some(&handled_signals()),
        Some(&mut original),
    )
    .map_err(SupervisorError::Mask)?;
    Ok(original)
}

/// The termination signal the signal thread has taken, as a number (0:
/// none). The thread takes a signal off the pending set, so without this a
/// signal that came after the last check of the run (on the way to exec)
/// would be seen by nobody, and etcd would start anyway.
static TAKEN_TERMINATION: AtomicI32 = AtomicI32::new(0);

/// A termination signal that arrived while nobody was waiting for one (e.g.
/// before exec): one the signal thread took, or one still pending, taken
/// off the pending set.
pub fn take_pending_termination() -> Option<Signal> {
    let taken = TAKEN_TERMINATION.load(Ordering::SeqCst);
    if taken != 0 {
        return Signal::try_from(taken).ok();
    }
    let pending = SigSet::from_iter(
        TERMINATION_SIGNALS
            .iter()
            .copied()
            .filter(|sig| is_pending(*sig)),
    );
    pending.iter().next()?;
    pending.wait().ok()
}

fn is_pending(sig: Signal) -> bool {
    let mut set = std::mem::MaybeUninit::<nix::libc::sigset_t>::uninit();
    // SAFETY: sigpending fills the set it is given; we only read it after a
    // successful call.
    unsafe {
        if nix::libc::sigpending(set.as_mut_ptr()) != 0 {
            return false;
        }
        nix::libc::sigismember(set.as_ptr(), sig as i32) == 1
    }
}

/// Owner of the signal thread and of every child's exit status.
#[derive(Clone)]
pub struct Supervisor {
    inner: Arc<Inner>,
}

struct Inner {
    /// Exit-status subscribers by pid. Held while spawning so the reaper
    /// cannot see a child's exit before its subscriber is registered.
    waiters: Mutex<HashMap<i32, oneshot::Sender<ExitStatus>>>,
    termination: watch::Sender<Option<Signal>>,
    original_mask: SigSet,
}

/// A running child and the means to wait for and stop it.
pub struct Child {
    /// The child's stdout, if it was piped.
    pub stdout: Option<std::process::ChildStdout>,
    /// The child's stderr, if it was piped.
    pub stderr: Option<std::process::ChildStderr>,
    pid: Pid,
    program: String,
    exit: oneshot::Receiver<ExitStatus>,
    status: Option<ExitStatus>,
}

impl Supervisor {
    /// Starts the signal thread, once per process: a second call (a run
    /// that starts over, `PauseEnd::Withdrawn`) gets the same supervisor,
    /// since one thread must own the signals and every child's `waitpid`.
    /// `original_mask` is what [`block_signals`] returned; children get it
    /// back before they exec.
    pub fn start(original_mask: SigSet) -> Result<Supervisor, SupervisorError> {
        static STARTED: std::sync::OnceLock<Supervisor> = std::sync::OnceLock::new();
        if let Some(started) = STARTED.get() {
            return Ok(started.clone());
        }
        let supervisor = Self::start_thread(original_mask)?;
        Ok(STARTED.get_or_init(|| supervisor).clone())
    }

    /// The signal thread and the supervisor it serves.
    fn start_thread(original_mask: SigSet) -> Result<Supervisor, SupervisorError> {
        let (termination, _) = watch::channel(None);
        let inner = Arc::new(Inner {
            waiters: Mutex::new(HashMap::new()),
            termination,
            original_mask,
        });
        let thread_inner = Arc::clone(&inner);
        std::thread::Builder::new()
            .name("signals".into())
            .spawn(move || thread_inner.signal_loop())
            .map_err(SupervisorError::Thread)?;
        Ok(Supervisor { inner })
    }

    /// A receiver that holds `Some(signal)` once a termination signal came.
    pub fn termination(&self) -> watch::Receiver<Option<Signal>> {
        self.inner.termination.subscribe()
    }

    /// The termination signal received so far, if any.
    pub fn terminated(&self) -> Option<Signal> {
        *self.inner.termination.borrow()
    }

    /// Spawns `command` as a supervised child. It starts with the original
    /// signal mask (a blocked mask survives exec, and etcd would never see
    /// SIGTERM), in its own process group (a terminal's Ctrl-C reaches only
    /// us, and we stop it in order), with SIGTERM as its parent-death signal
    /// (if we are SIGKILLed, etcd still stops gracefully).
    pub fn spawn(&self, command: &mut Command) -> Result<Child, SupervisorError> {
        let program = command.get_program().to_string_lossy().into_owned();
        let mask = self.inner.original_mask;
        let parent = nix::unistd::getpid();
        // SAFETY: the closure runs between fork and exec, in a copy of a
        // multi-threaded process, so it may only make async-signal-safe
        // calls: sigprocmask, setpgid, prctl (through nix's
        // set_pdeathsig) and getppid, each a bare system call. Its errors
        // are errnos or a bare kind, never an allocated message: malloc's
        // lock may have been held by another thread at the fork.
        unsafe {
            command.pre_exec(move || {
                signal::sigprocmask(SigmaskHow::SIG_SETMASK, Some(&mask), None)
                    .map_err(io::Error::from)?;
                nix::unistd::setpgid(Pid::from_raw(0), Pid::from_raw(0))
                    .map_err(io::Error::from)?;
                prctl::set_pdeathsig(Signal::SIGTERM).map_err(io::Error::from)?;
                // If we died between the fork and the prctl, the signal
                // will never come: the child was already re-parented. It
                // must not go on to exec etcd as an orphan that holds the
                // data dir's WAL lock against our restart. (Nobody reads
                // this error: its reader is gone.)
                if nix::unistd::getppid() != parent {
                    return Err(io::Error::from(io::ErrorKind::Other));
                }
                Ok(())
            });
        }
        let mut waiters = self.inner.lock_waiters();
        let mut child = command.spawn().map_err(|source| SupervisorError::Spawn {
            program: program.clone(),
            source,
        })?;
        let pid = Pid::from_raw(child.id() as i32);
        let (sender, exit) = oneshot::channel();
        waiters.insert(pid.as_raw(), sender);
        drop(waiters);
        // `std::process::Child` is dropped without waiting: the reaper owns
        // waitpid. Its pipes move to our handle.
        let (stdout, stderr) = (child.stdout.take(), child.stderr.take());
        drop(child);
        Ok(Child {
            stdout,
            stderr,
            pid,
            program,
            exit,
            status: None,
        })
    }
}

impl Inner {
    fn lock_waiters(&self) -> MutexGuard<'_, HashMap<i32, oneshot::Sender<ExitStatus>>> {
        // A panic while holding the lock cannot leave the map inconsistent
        // (insert and remove are single calls), so poisoning is ignored.
        self.waiters
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn signal_loop(&self) {
        let set = handled_signals();
        loop {
            match set.wait() {
                Ok(Signal::SIGCHLD) => self.reap(),
                Ok(sig) => {
                    TAKEN_TERMINATION.store(sig as i32, Ordering::SeqCst);
                    log::warn(
                        "received signal, stopping",
                        &[("signal", sig.as_str().into())],
                    );
                    self.termination.send_replace(Some(sig));
                }
                Err(_) => continue,
            }
        }
    }

    /// Reaps every child that has exited: delivers the status of ours and
    /// logs orphans (grandchildren re-parented to us as PID 1).
    fn reap(&self) {
        let mut waiters = self.lock_waiters();
        loop {
            let (pid, status) = match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::Exited(pid, code)) => (pid, ExitStatus::Exited(code)),
                Ok(WaitStatus::Signaled(pid, sig, _)) => (pid, ExitStatus::Signaled(sig)),
                Ok(WaitStatus::StillAlive) | Err(Errno::ECHILD) => return,
                Ok(_) | Err(Errno::EINTR) => continue,
                Err(errno) => {
                    log::warn("waitpid failed", &[("errno", errno.desc().into())]);
                    return;
                }
            };
            match waiters.remove(&pid.as_raw()) {
                // The receiver may be gone if its owner gave up; nothing to do.
                Some(sender) => {
                    let _ = sender.send(status);
                }
                None => log::info(
                    "reaped orphan",
                    &[
                        ("pid", pid.as_raw().into()),
                        ("status", status.to_string().into()),
                    ],
                ),
            }
        }
    }
}

impl Child {
    /// Takes the piped stdout and stderr (those that were piped), for the
    /// threads that read them.
    pub fn take_output(&mut self) -> Vec<Box<dyn std::io::Read + Send>> {
        let stdout = self
            .stdout
            .take()
            .map(|s| Box::new(s) as Box<dyn std::io::Read + Send>);
        let stderr = self
            .stderr
            .take()
            .map(|s| Box::new(s) as Box<dyn std::io::Read + Send>);
        [stdout, stderr].into_iter().flatten().collect()
    }

    /// The child's pid.
    pub fn pid(&self) -> i32 {
        self.pid.as_raw()
    }

    /// The program it runs.
    pub fn program(&self) -> &str {
        &self.program
    }

    /// Waits until the child has exited and been reaped. Cancel-safe and
    /// callable again after it returned.
    pub async fn wait(&mut self) -> ExitStatus {
        if let Some(status) = self.status {
            return status;
        }
        // The sender is dropped without a value only if the supervisor is
        // gone, which cannot happen while the process runs; report it as a
        // SIGKILL so callers treat it as a hard stop.
        let status = (&mut self.exit)
            .await
            .unwrap_or(ExitStatus::Signaled(Signal::SIGKILL));
        self.status = Some(status);
        status
    }

    /// The exit status if the child has already exited.
    pub fn try_status(&mut self) -> Option<ExitStatus> {
        if self.status.is_none() {
            if let Ok(status) = self.exit.try_recv() {
                self.status = Some(status);
            }
        }
        self.status
    }

    /// Sends a signal unless the child was already reaped (its pid may have
    /// been reused).
    pub fn signal(&mut self, sig: Signal) {
        if self.try_status().is_none() {
            // ESRCH: it exited between the check and the kill; the reaper
            // will report it.
            let _ = signal::kill(self.pid, sig);
        }
    }

    /// Stops the child: SIGTERM, up to `grace`, then SIGKILL, up to
    /// [`KILL_GRACE`]. Returns how it ended and whether SIGKILL was needed.
    pub async fn stop(&mut self, grace: Duration) -> Result<(ExitStatus, bool), SupervisorError> {
        if let Some(status) = self.try_status() {
            return Ok((status, false));
        }
        self.signal(Signal::SIGTERM);
        if let Ok(status) = tokio::time::timeout(grace, self.wait()).await {
            return Ok((status, false));
        }
        log::warn(
            "child ignored SIGTERM, sending SIGKILL",
            &[
                ("pid", self.pid().into()),
                ("program", self.program.clone().into()),
                ("grace_ms", log::ms(grace)),
            ],
        );
        self.kill().await.map(|status| (status, true))
    }

    /// SIGKILL to the child's whole process group (it leads one: [`Supervisor::spawn`]
    /// puts it in its own), which reaches whatever it started and left
    /// behind, even after the child itself is gone: the kernel hands out no
    /// pid that is still a live group's id, so the group is still the
    /// child's while any member lives. Waits for nothing.
    pub fn kill_group(&mut self) {
        // ESRCH: the group is empty; nothing is left to stop.
        let _ = signal::killpg(self.pid, Signal::SIGKILL);
    }

    /// SIGKILL, then wait up to [`KILL_GRACE`] for the reaper.
    pub async fn kill(&mut self) -> Result<ExitStatus, SupervisorError> {
        self.signal(Signal::SIGKILL);
        let started = Instant::now();
        tokio::time::timeout(KILL_GRACE, self.wait())
            .await
            .map_err(|_| SupervisorError::Unkillable {
                pid: self.pid(),
                program: self.program.clone(),
                waited: started.elapsed(),
            })
    }
}
/// The process holding the socket `inode` (its pid and command line), if
/// /proc shows one we may look at: for the error that names who took a
/// step's port.
pub fn socket_holder(inode: u64) -> Option<(i32, String)> {
    let wanted = format!("socket:[{inode}]");
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        let Ok(fds) = std::fs::read_dir(entry.path().join("fd")) else {
            continue;
        };
        let holds = fds.flatten().any(|fd| {
            std::fs::read_link(fd.path()).is_ok_and(|l| l.as_os_str() == wanted.as_str())
        });
        if holds {
            let raw = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
            let command: Vec<String> = raw
                .split(|b| *b == 0)
                .filter(|a| !a.is_empty())
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect();
            return Some((pid, command.join(" ")));
        }
    }
    None
}
