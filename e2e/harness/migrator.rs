//! This module owns running the `etcd-migrate` binary under test: its
//! command line built from a member and a data dir (optionally started
//! through a launcher such as `setpriv`, to run as another user), a clean
//! environment, stdout and stderr collected (stderr also line by line as
//! it comes, for tests that act in the middle of a run), a deadline on
//! every run, a guard that kills it if the test fails first, and reading
//! its own log lines.

use std::ffi::OsString;
use std::io::{BufRead, BufReader, Read};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use super::etcd::{die_with_parent, kill_and_reap, reap_within};
use super::tree::{fingerprint, Tree};
use super::{bin_dir, free_port, require_suite_binaries, wait_until, Member, MIGRATE_TIMEOUT};

/// Runs a command line etcd-migrate logged for the operator (e.g. the
/// `backup taken` line's `restore`) with `sh -c`, as an operator would:
/// `etcd-migrate` found on the PATH (a link to [`program`] in `work`).
pub fn run_logged(command: &str, work: &Path) -> std::process::Output {
    let bin = work.join("logged-bin");
    let link = bin.join("etcd-migrate");
    if !link.exists() {
        std::fs::create_dir_all(&bin).expect("create logged-bin");
        std::os::unix::fs::symlink(program(), &link).expect("link etcd-migrate");
    }
    Command::new("sh")
        .arg("-c")
        .arg(command)
        .env("PATH", format!("{}:/usr/bin:/bin", bin.display()))
        .output()
        .unwrap_or_else(|err| panic!("run sh -c {command:?}: {err}"))
}

/// The etcd-migrate this test process runs: a hard link, taken at first
/// use, to the binary cargo built for it. The target dir may be shared
/// (`CARGO_TARGET_DIR`): a build from another checkout, or one without the
/// `failpoints` feature, replaces `target/debug/etcd-migrate` while the
/// suite runs, and the tests would run that binary from then on. The link
/// keeps the built file (cargo and the linker write a new file, they do
/// not rewrite it in place). It lives in `target/debug/e2e-snapshots/`
/// (a hard link must stay on the target dir's file system), named by this
/// process's pid; links of processes that have ended are removed on the
/// way. Where no link can be made, the built path is used as it is.
pub fn program() -> PathBuf {
    static PROGRAM: OnceLock<PathBuf> = OnceLock::new();
    PROGRAM
        .get_or_init(|| {
            let built = PathBuf::from(env!("CARGO_BIN_EXE_etcd-migrate"));
            match snapshot(&built) {
                Ok(link) => link,
                Err(err) => {
                    eprintln!(
                        "e2e: running {} itself (no snapshot of it: {err}); a build into the \
                         same target dir during the run would change what is tested",
                        built.display()
                    );
                    built
                }
            }
        })
        .clone()
}

/// Hard-links `built` as `e2e-snapshots/etcd-migrate-<pid>` beside it,
/// removing the links of processes that have ended.
fn snapshot(built: &Path) -> std::io::Result<PathBuf> {
    let dir = built
        .parent()
        .unwrap_or_else(|| Path::new("."))
        .join("e2e-snapshots");
    std::fs::create_dir_all(&dir)?;
    for entry in std::fs::read_dir(&dir)?.flatten() {
        let name = entry.file_name();
        let pid = name
            .to_str()
            .and_then(|name| name.strip_prefix("etcd-migrate-"))
            .and_then(|pid| pid.parse::<i32>().ok());
        if pid.is_some_and(|pid| !Path::new(&format!("/proc/{pid}")).exists()) {
            // Another process may remove it at the same moment: fine.
            let _ = std::fs::remove_file(entry.path());
        }
    }
    let link = dir.join(format!("etcd-migrate-{}", std::process::id()));
    // A link left by an ended process that had this pid.
    let _ = std::fs::remove_file(&link);
    std::fs::hard_link(built, &link)?;
    Ok(link)
}

/// How long the output pipes may stay open after the process exited (a
/// grandchild could hold them; none should).
const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

/// The exit code of a bad configuration or precondition (nothing
/// touched).
pub const EXIT_PRECONDITION: i32 = 2;

/// The prefix of every text log line etcd-migrate writes itself.
pub const OUR_PREFIX: &str = "[etcd-migrate] ";

/// What etcd-migrate does after migrating.
#[derive(Debug, Clone)]
pub enum Mode {
    /// `--no-exec`.
    NoExec,
    /// `--dry-run`.
    DryRun,
    /// Exec the target with these etcd arguments (after `--`).
    Exec(Vec<String>),
}

/// Whether `line` is one of our own text log lines with `message`
/// (`[etcd-migrate] <ts> <level> <message> key=value …`, matched loosely:
/// ` <message> ` anywhere after the prefix).
pub fn is_ours(line: &str, message: &str) -> bool {
    line.starts_with(OUR_PREFIX) && line.contains(&format!(" {message} "))
}

/// The value of `key=` in one of our text log lines, without the quotes
/// a value with spaces gets.
pub fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    line.split_whitespace()
        .find_map(|part| part.strip_prefix(key)?.strip_prefix('='))
        .map(|value| value.trim_matches('"'))
}

/// One invocation of etcd-migrate.
#[derive(Debug, Clone)]
pub struct Migration {
    /// The etcd-migrate binary: [`program`] (the one cargo built), unless a
    /// test needs a copy another user can reach.
    pub program: PathBuf,
    /// A command etcd-migrate is started through, its program first (e.g.
    /// `setpriv --reuid=65534 …`); empty to start it directly.
    pub launcher: Vec<OsString>,
    /// `--target-version`.
    pub target: String,
    /// `--data-dir`.
    pub data_dir: PathBuf,
    /// `--name`.
    pub name: String,
    /// `--bin-dir`.
    pub bin_dir: PathBuf,
    /// `--port`: client port of the intermediate etcds.
    pub port: u16,
    /// `--peer-port`.
    pub peer_port: u16,
    /// `--bundled-versions`, when given.
    pub bundled: Option<String>,
    /// What happens after the walk.
    pub mode: Mode,
    /// More flags before `--`.
    pub extra: Vec<OsString>,
    /// Environment variables on top of `PATH` (e.g. `FAILPOINTS`).
    pub env: Vec<(OsString, OsString)>,
    /// Leave out our `--data-dir` and `--name`: etcd's own flags after
    /// `--` name them (a kubeadm manifest's command line).
    pub member_from_etcd_flags: bool,
}

impl Migration {
    /// `--no-exec` migration of `data_dir` to `target` as `member`, with
    /// the real bin dir and a fresh client port.
    pub fn new(target: &str, data_dir: &Path, member: &Member) -> Self {
        require_suite_binaries();
        Migration {
            program: program(),
            launcher: Vec::new(),
            target: target.to_string(),
            data_dir: data_dir.to_path_buf(),
            name: member.name.clone(),
            bin_dir: bin_dir(),
            port: free_port(),
            peer_port: member.peer_port,
            bundled: None,
            mode: Mode::NoExec,
            extra: Vec::new(),
            env: Vec::new(),
            member_from_etcd_flags: false,
        }
    }

    /// Sets `--bundled-versions`.
    pub fn bundled(mut self, list: &str) -> Self {
        self.bundled = Some(list.to_string());
        self
    }

    /// Sets `--bin-dir`.
    pub fn bin_dir(mut self, dir: &Path) -> Self {
        self.bin_dir = dir.to_path_buf();
        self
    }

    /// Starts etcd-migrate (`program`) through `launcher`, e.g.
    /// `["setpriv", "--reuid=65534", …]`; the launcher gets the clean
    /// environment and passes it on.
    pub fn launched_by<S: Into<OsString>>(
        mut self,
        launcher: impl IntoIterator<Item = S>,
        program: &Path,
    ) -> Self {
        self.launcher = launcher.into_iter().map(Into::into).collect();
        self.program = program.to_path_buf();
        self
    }

    /// Passes no `--data-dir` and `--name` of ours: the exec mode's etcd
    /// arguments name them, as kubeadm's etcd command line does.
    pub fn member_from_etcd_flags(mut self) -> Self {
        self.member_from_etcd_flags = true;
        self
    }

    /// Sets the mode.
    pub fn mode(mut self, mode: Mode) -> Self {
        self.mode = mode;
        self
    }

    /// Adds a flag (before `--`).
    pub fn arg(mut self, arg: impl Into<OsString>) -> Self {
        self.extra.push(arg.into());
        self
    }

    /// Sets an environment variable for the run (the test build reads
    /// `FAILPOINTS`, see `src/failpoint.rs`).
    pub fn env(mut self, key: impl Into<OsString>, value: impl Into<OsString>) -> Self {
        self.env.push((key.into(), value.into()));
        self
    }

    /// The command, with an environment holding only `PATH` and what
    /// [`Migration::env`] added: the test
    /// runner's own `HOSTNAME`, `ETCD_*` or `INITIAL_CLUSTER` must not leak
    /// into the run.
    pub fn command(&self) -> Command {
        let mut command = match self.launcher.split_first() {
            Some((launcher, args)) => {
                let mut command = Command::new(launcher);
                command.args(args).arg(&self.program);
                command
            }
            None => Command::new(&self.program),
        };
        command
            .env_clear()
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .arg("--target-version")
            .arg(&self.target);
        if !self.member_from_etcd_flags {
            command
                .arg("--data-dir")
                .arg(&self.data_dir)
                .arg("--name")
                .arg(&self.name);
        }
        command
            .arg("--bin-dir")
            .arg(&self.bin_dir)
            .arg("--port")
            .arg(self.port.to_string())
            .arg("--peer-port")
            .arg(self.peer_port.to_string());
        if let Some(list) = &self.bundled {
            command.arg("--bundled-versions").arg(list);
        }
        command.args(&self.extra);
        match &self.mode {
            Mode::NoExec => {
                command.arg("--no-exec");
            }
            Mode::DryRun => {
                command.arg("--dry-run");
            }
            Mode::Exec(args) => {
                command.arg("--").args(args);
            }
        }
        command
    }

    /// Waits until the run's client and peer ports can be bound again, as
    /// etcd-migrate's own check binds them (SO_REUSEADDR); panics naming
    /// them after `timeout`. After a kill, the killed run's etcd may hold
    /// them while it exits; the ports are this test process's (see
    /// `ports`), so nothing else can hold them, and the wait ends as soon
    /// as that etcd has.
    pub fn wait_for_ports_free(&self, timeout: Duration) {
        let ports = [self.port, self.peer_port];
        wait_until(
            &format!("ports {ports:?} of a killed run to be free again"),
            timeout,
            || {
                ports
                    .iter()
                    .all(|&port| TcpListener::bind(("127.0.0.1", port)).is_ok())
                    .then_some(())
            },
        );
    }

    /// Starts etcd-migrate without waiting for it.
    pub fn spawn(&self) -> Running {
        let mut command = self.command();
        command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        die_with_parent(&mut command);
        let mut child = command
            .spawn()
            .unwrap_or_else(|err| panic!("spawn etcd-migrate: {err}"));
        let stdout = Arc::new(Mutex::new(String::new()));
        let stderr = Arc::new(Mutex::new(String::new()));
        let (line_sender, lines) = mpsc::channel();
        let (done_sender, done) = mpsc::channel();
        if let Some(stream) = child.stdout.take() {
            let sink = Arc::clone(&stdout);
            let done = done_sender.clone();
            std::thread::spawn(move || pump(stream, &sink, None, &done));
        }
        if let Some(stream) = child.stderr.take() {
            let sink = Arc::clone(&stderr);
            std::thread::spawn(move || pump(stream, &sink, Some(&line_sender), &done_sender));
        }
        Running {
            pid: child.id() as i32,
            child: Some(child),
            stdout,
            stderr,
            lines,
            done,
        }
    }

    /// Runs etcd-migrate to completion (killed after [`MIGRATE_TIMEOUT`]).
    pub fn run(&self) -> Outcome {
        self.spawn().wait(MIGRATE_TIMEOUT)
    }
}

/// Copies `stream` into `sink`, sending each line to `lines` too.
fn pump(
    stream: impl Read,
    sink: &Mutex<String>,
    lines: Option<&Sender<String>>,
    done: &Sender<()>,
) {
    let mut reader = BufReader::new(stream);
    let mut bytes = Vec::new();
    loop {
        bytes.clear();
        match reader.read_until(b'\n', &mut bytes) {
            Ok(0) | Err(_) => break,
            Ok(_) => {
                let line = String::from_utf8_lossy(&bytes).into_owned();
                sink.lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner())
                    .push_str(&line);
                if let Some(lines) = lines {
                    let _ = lines.send(line.trim_end_matches('\n').to_string());
                }
            }
        }
    }
    let _ = done.send(());
}

/// A running etcd-migrate, killed on drop.
pub struct Running {
    pid: i32,
    child: Option<Child>,
    stdout: Arc<Mutex<String>>,
    stderr: Arc<Mutex<String>>,
    lines: Receiver<String>,
    done: Receiver<()>,
}

impl Running {
    /// Its pid (after an exec, the target etcd's).
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// stderr so far.
    pub fn stderr(&self) -> String {
        self.stderr
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    /// Waits for the first stderr line (not yet consumed) that `matches`
    /// accepts and returns it; panics after `timeout` or if the output ends.
    pub fn wait_for_line(
        &mut self,
        what: &str,
        timeout: Duration,
        matches: impl Fn(&str) -> bool,
    ) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            match self.next_line(&format!("a line with {what}"), deadline) {
                Some(line) if matches(&line) => return line,
                Some(_) => {}
                None => panic!(
                    "etcd-migrate (pid {}) closed stderr before a line with {what}; stderr:\n{}",
                    self.pid,
                    self.stderr()
                ),
            }
        }
    }

    /// The next stderr line not yet consumed, or `None` once stderr has
    /// closed (the run is ending); panics, naming `what` the test waits
    /// for, if neither comes by `deadline`.
    pub fn next_line(&mut self, what: &str, deadline: Instant) -> Option<String> {
        let left = deadline.saturating_duration_since(Instant::now());
        match self.lines.recv_timeout(left) {
            Ok(line) => Some(line),
            Err(RecvTimeoutError::Disconnected) => None,
            Err(RecvTimeoutError::Timeout) => panic!(
                "waiting for {what}: no stderr line from etcd-migrate (pid {}) before the \
                 deadline; stderr so far:\n{}",
                self.pid,
                self.stderr()
            ),
        }
    }

    /// Sends `signal` to the process; panics if it already exited (its
    /// pid may belong to someone else by now).
    pub fn signal(&mut self, signal: Signal) {
        if let Some(status) = self.try_status() {
            panic!(
                "etcd-migrate (pid {}) already exited with {status}; stderr:\n{}",
                self.pid,
                self.stderr()
            );
        }
        kill(Pid::from_raw(self.pid), signal)
            .unwrap_or_else(|err| panic!("kill -{signal} {}: {err}", self.pid));
    }

    /// Sends `signal` unless the process has already exited (then the
    /// signal came too late to interrupt anything). Returns whether it was
    /// sent.
    pub fn signal_if_running(&mut self, signal: Signal) -> bool {
        if self.try_status().is_some() {
            return false;
        }
        kill(Pid::from_raw(self.pid), signal)
            .unwrap_or_else(|err| panic!("kill -{signal} {}: {err}", self.pid));
        true
    }

    /// Stops etcd-migrate (SIGSTOP) until the returned guard drops
    /// (SIGCONT). A failpoint `sleep` holds a run at a point for a fixed
    /// time only; a test that acts there freezes the run as soon as it reads
    /// the point's trace line, so what it then does may take as long as a
    /// loaded machine needs. The run's etcd, a process of its own, serves
    /// on. Panics if the run already exited. (Only the failpoint tests hold
    /// a run at a point.)
    #[cfg(feature = "failpoints")]
    pub fn freeze(&mut self) -> Frozen {
        self.signal(Signal::SIGSTOP);
        Frozen { pid: self.pid }
    }

    /// Whether it has exited (without reaping it twice).
    pub fn try_status(&mut self) -> Option<ExitStatus> {
        self.child
            .as_mut()
            .and_then(|child| child.try_wait().ok().flatten())
    }

    /// Waits up to `timeout` for the exit; kills it and panics after that.
    pub fn wait(mut self, timeout: Duration) -> Outcome {
        let Some(mut child) = self.child.take() else {
            panic!("etcd-migrate (pid {}) was already reaped", self.pid);
        };
        let Some(status) = reap_within(&mut child, timeout) else {
            kill_and_reap(&mut child);
            panic!(
                "etcd-migrate (pid {}) did not finish within {timeout:?}; it was killed; stderr:\n{}",
                self.pid,
                self.stderr()
            );
        };
        // Let the pumps reach end-of-file so no trailing line is lost.
        let drained = Instant::now() + DRAIN_TIMEOUT;
        for _ in 0..2 {
            let left = drained.saturating_duration_since(Instant::now());
            if self.done.recv_timeout(left).is_err() {
                break;
            }
        }
        Outcome {
            status,
            stdout: self
                .stdout
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .clone(),
            stderr: self.stderr(),
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(child) = self.child.as_mut() {
            kill_and_reap(child);
        }
    }
}

/// An etcd-migrate stopped by [`Running::freeze`], or any process by
/// [`Frozen::stop`]; continued (SIGCONT) when this drops, also when the
/// test fails first.
#[cfg(feature = "failpoints")]
pub struct Frozen {
    pid: i32,
}

#[cfg(feature = "failpoints")]
impl Frozen {
    /// Stops process `pid` (SIGSTOP): a run's etcd, say, a process group
    /// of its own.
    pub fn stop(pid: i32) -> Frozen {
        kill(Pid::from_raw(pid), Signal::SIGSTOP)
            .unwrap_or_else(|err| panic!("kill -SIGSTOP {pid}: {err}"));
        Frozen { pid }
    }
}

#[cfg(feature = "failpoints")]
impl Drop for Frozen {
    fn drop(&mut self) {
        let _ = kill(Pid::from_raw(self.pid), Signal::SIGCONT);
    }
}

/// How a finished run ended and what it printed.
#[derive(Debug)]
pub struct Outcome {
    /// The exit status.
    pub status: ExitStatus,
    /// Everything on stdout.
    pub stdout: String,
    /// Everything on stderr (ours and relayed etcd output).
    pub stderr: String,
}

impl Outcome {
    /// The exit code, `None` if a signal ended it.
    pub fn code(&self) -> Option<i32> {
        self.status.code()
    }

    /// The status and output, for assertion messages.
    pub fn explain(&self) -> String {
        format!(
            "etcd-migrate ended with {}\n--- stdout ---\n{}--- stderr ---\n{}",
            self.status, self.stdout, self.stderr
        )
    }

    /// Asserts the exit code.
    pub fn assert_code(&self, code: i32) -> &Self {
        assert_eq!(
            self.code(),
            Some(code),
            "unexpected exit code\n{}",
            self.explain()
        );
        self
    }

    /// Our own log lines (text format), without relayed etcd output.
    pub fn our_lines(&self) -> Vec<&str> {
        self.stderr
            .lines()
            .filter(|line| line.starts_with(OUR_PREFIX))
            .collect()
    }

    /// Our last log line (where the run ended, in its words), or `""`.
    pub fn last_line(&self) -> &str {
        self.our_lines().last().copied().unwrap_or_default()
    }

    /// Our lines whose message is `message`
    /// (`[etcd-migrate] <ts> <level> <message> key=value …`).
    pub fn lines_with(&self, message: &str) -> Vec<&str> {
        self.our_lines()
            .into_iter()
            .filter(|line| {
                let mut parts = line[OUR_PREFIX.len()..].splitn(3, ' ');
                let rest = parts.nth(2).unwrap_or("");
                rest == message || rest.starts_with(&format!("{message} "))
            })
            .collect()
    }

    /// Every stderr line parsed as one JSON object (`--log-format json`).
    pub fn json_lines(&self) -> Vec<serde_json::Map<String, serde_json::Value>> {
        self.stderr
            .lines()
            .map(|line| match serde_json::from_str(line) {
                Ok(serde_json::Value::Object(object)) => object,
                _ => panic!(
                    "stderr line is not one JSON object: {line:?}\n{}",
                    self.explain()
                ),
            })
            .collect()
    }

    /// The step kinds in the order their `step start` lines came.
    pub fn step_kinds(&self) -> Vec<String> {
        self.lines_with("step start")
            .iter()
            .filter_map(|line| field(line, "kind"))
            .map(str::to_string)
            .collect()
    }

    /// Asserts stderr contains `text`.
    pub fn assert_stderr_has(&self, text: &str) -> &Self {
        assert!(
            self.stderr.contains(text),
            "stderr should contain {text:?}\n{}",
            self.explain()
        );
        self
    }

    /// Asserts a refusal: exit 2 (bad configuration or precondition), each
    /// of `expected` on stderr, no etcd started, and the tree at `root`
    /// exactly as `before` was taken.
    pub fn assert_refused_untouched(&self, root: &Path, before: &Tree, expected: &[&str]) -> &Self {
        self.assert_code(EXIT_PRECONDITION);
        for text in expected {
            self.assert_stderr_has(text);
        }
        assert!(
            self.lines_with("etcd started").is_empty(),
            "a refused run starts no etcd\n{}",
            self.explain()
        );
        before.assert_unchanged(
            &fingerprint(root),
            &format!("a refused run (its last line: {:?})", self.last_line()),
        );
        self
    }
}
