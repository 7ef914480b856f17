//! This module owns the processes of a step: starting `etcd-<v>` with its
//! dialect's flags (and the offline tools `etcdctl`/`etcdutl`) with a clean
//! environment, relaying its output into our
//! log with a `[etcd-<v>]` prefix while keeping the last lines for error
//! reports, and stopping it through the supervisor.

use std::cell::RefCell;
use std::collections::{BTreeMap, VecDeque};
use std::future::Future;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::binaries;
use crate::dialect::StepEtcd;
use crate::effects::{Launcher, RunningEtcd, StepError, Tools};
use crate::log;
use crate::plan::Binary;
use crate::supervisor::{Child, ExitStatus, Supervisor, SupervisorError, STOP_GRACE};
use crate::version::Version;

/// How long an exited process's output may take to reach end-of-file
/// before its last lines are read for a report. Its pipes close as it
/// exits; only a process it left behind keeps them open.
const RELAY_DRAIN: Duration = Duration::from_secs(1);

/// How often the drain looks whether the relays are done.
const RELAY_POLL: Duration = Duration::from_millis(5);

/// How many of a process's first output lines an error report quotes: a
/// bad flag is reported on the first line, before pages of usage text.
pub const OUTPUT_HEAD_LINES: usize = 5;

/// How many of a process's last output lines an error report quotes: a
/// panic or fatal error comes last.
pub const OUTPUT_TAIL_LINES: usize = 20;

/// How many fatal lines from the middle of a process's output an error
/// report keeps: a Go crash prints its cause, then a goroutine dump far
/// longer than the tail.
pub const OUTPUT_FATAL_LINES: usize = 5;

/// True for a line that says why a process died: a Go panic or fatal
/// error, or etcd's own fatal/panic log line (capnslog `C |`, zap levels).
fn is_fatal(line: &str) -> bool {
    const MARKS: [&str; 7] = [
        "panic:",
        "fatal error:",
        "unexpected fault address",
        " C | ",
        "\"level\":\"fatal\"",
        "\"level\":\"panic\"",
        "\"level\":\"dpanic\"",
    ];
    MARKS.iter().any(|mark| line.contains(mark))
}

/// The first and last lines a process printed, and the fatal ones in
/// between, for error reports.
#[derive(Debug, Default)]
struct OutputSample {
    head: Vec<String>,
    fatal: Vec<String>,
    tail: VecDeque<String>,
    omitted: usize,
}

impl OutputSample {
    fn push(&mut self, line: &str) {
        if self.head.len() < OUTPUT_HEAD_LINES {
            self.head.push(line.to_string());
            return;
        }
        if self.tail.len() == OUTPUT_TAIL_LINES {
            match self.tail.pop_front() {
                Some(old) if is_fatal(&old) && self.fatal.len() < OUTPUT_FATAL_LINES => {
                    self.fatal.push(old);
                }
                _ => self.omitted += 1,
            }
        }
        self.tail.push_back(line.to_string());
    }

    fn lines(&self) -> Vec<String> {
        let mut lines = self.head.clone();
        if self.omitted > 0 {
            lines.push(format!("[… {} lines omitted …]", self.omitted));
        }
        lines.extend(self.fatal.iter().cloned());
        lines.extend(self.tail.iter().cloned());
        lines
    }
}

/// Starts real etcd binaries from the bin dir under the supervisor.
pub struct ProcessLauncher {
    supervisor: Supervisor,
    bin_dir: PathBuf,
    /// The data dir's hidden v2 nodes, as last read.
    hidden: RefCell<KnownHidden>,
    /// A release whose binary is checked only before its first launch,
    /// with the flags (`ETCD_CREDS`) it runs with.
    check_later: RefCell<Option<(Binary, Vec<String>)>>,
}

/// The hidden v2 nodes of the run's data dir as last read: read before
/// any etcd ran on it (the run's first read), or again after a rebuilt
/// copy replaced it. An etcd of ours running on the data in between adds
/// only our health keys (never hidden) and lets TTLs run out (nodes only
/// go), so the list stays a superset of the data's hidden nodes, which is
/// what the reads need (a node not found is skipped); a rebuild may write
/// hidden nodes (etcd3 keys copied into the v2 store), so it is read
/// again after one. Only the data dir's: a scratch path may hold another
/// copy next time. Saves each later in-place step a read of the data (8
/// ms at 200,000 keys, more with a long WAL).
#[derive(Debug, Default)]
struct KnownHidden {
    data_dir: Option<PathBuf>,
    paths: Option<Vec<String>>,
}

impl KnownHidden {
    /// `paths`, read from `data_dir`, the run's data dir.
    fn of(data_dir: &Path, paths: Vec<String>) -> Self {
        KnownHidden {
            data_dir: Some(data_dir.to_path_buf()),
            paths: Some(paths),
        }
    }

    /// What is known of `dir`'s hidden nodes, if it is the data dir.
    fn get(&self, dir: &Path) -> Option<Vec<String>> {
        self.paths
            .clone()
            .filter(|_| self.data_dir.as_deref() == Some(dir))
    }

    /// `paths`, just read from `dir`: kept if it is the data dir.
    fn keep(&mut self, dir: &Path, paths: &[String]) {
        if self.data_dir.as_deref() == Some(dir) {
            self.paths = Some(paths.to_vec());
        }
    }

    /// `dir` was replaced: read it again next time.
    fn forget(&mut self, dir: &Path) {
        if self.data_dir.as_deref() == Some(dir) {
            self.paths = None;
        }
    }
}

/// A step's etcd, running under the supervisor.
pub struct ProcessEtcd {
    child: Child,
    output: Arc<Mutex<OutputSample>>,
    relays: Vec<std::thread::JoinHandle<()>>,
}

impl ProcessLauncher {
    /// A launcher for binaries in `bin_dir`.
    pub fn new(supervisor: Supervisor, bin_dir: PathBuf) -> Self {
        ProcessLauncher {
            supervisor,
            bin_dir,
            hidden: RefCell::new(KnownHidden::default()),
            check_later: RefCell::new(None),
        }
    }

    /// The same, checking `binary` (an etcd server that runs with
    /// `step_args`) only before it first launches: the recorded release,
    /// which runs only if the offline baseline falls back to a start.
    /// Every other binary was checked before the first step; this one's
    /// file was found there too.
    pub fn checking_later(self, binary: Binary, step_args: Vec<String>) -> Self {
        self.check_later.replace(Some((binary, step_args)));
        self
    }

    /// The same, knowing the hidden v2 nodes of `data_dir` as the run's
    /// offline read found them: the first step starts without reading the
    /// data again (at 200,000 keys, the WAL's 128 MiB).
    pub fn knowing_hidden_v2(self, data_dir: &Path, paths: Vec<String>) -> Self {
        self.hidden.replace(KnownHidden::of(data_dir, paths));
        self
    }
}

impl Launcher for ProcessLauncher {
    type Etcd = ProcessEtcd;

    fn hidden_v2_paths(&self, data_dir: &std::path::Path) -> Vec<String> {
        if let Some(paths) = self.hidden.borrow().get(data_dir) {
            return paths;
        }
        match crate::ondisk::read(data_dir) {
            Ok(on_disk) => {
                self.hidden
                    .borrow_mut()
                    .keep(data_dir, &on_disk.v2_hidden_paths);
                on_disk.v2_hidden_paths
            }
            Err(err) => {
                // etcd reads the same files and reports them in its own
                // words when it starts on them.
                log::warn(
                    "cannot read the data's hidden v2 nodes",
                    &[
                        ("data_dir", data_dir.display().to_string().into()),
                        ("error", err.to_string().into()),
                    ],
                );
                Vec::new()
            }
        }
    }

    fn launch(&self, spec: &StepEtcd<'_>) -> Result<ProcessEtcd, StepError> {
        let binary = Binary::etcd(spec.version);
        crate::failpoint!("etcd-before-spawn");
        let etcd = spawn_relayed(&self.supervisor, &self.bin_dir, binary, &spec.args(), &[])
            .map_err(|source| StepError::Launch {
                version: spec.version,
                source,
            })?;
        crate::failpoint!("etcd-after-spawn");
        Ok(etcd)
    }

    fn data_replaced(&self, data_dir: &Path) {
        self.hidden.borrow_mut().forget(data_dir);
    }

    fn granted_leases(&self, data_dir: &Path) -> Result<Option<BTreeMap<i64, i64>>, String> {
        crate::ondisk::read(data_dir)
            .map(|on_disk| on_disk.leases)
            .map_err(|err| err.to_string())
    }

    async fn check_before_launch(&self, version: Version) -> Result<(), binaries::BinError> {
        let due = self
            .check_later
            .borrow_mut()
            .take_if(|(binary, _)| binary.version == version);
        let Some((binary, step_args)) = due else {
            return Ok(());
        };
        let checking = Instant::now();
        let run_flags = binaries::RunFlags {
            args: &[],
            releases: &[],
            step_args: &step_args,
            step_releases: &[version],
        };
        binaries::verify_reported_versions(
            &self.supervisor,
            &self.bin_dir,
            &[binary],
            run_flags,
            self.supervisor.termination(),
        )
        .await?;
        log::info(
            "binaries verified",
            &[
                ("count", 1u64.into()),
                ("binary", binary.to_string().into()),
                ("when", "before its first launch".into()),
                ("ms", log::ms(checking.elapsed())),
            ],
        );
        Ok(())
    }
}

impl Tools for ProcessLauncher {
    fn run(
        &self,
        binary: Binary,
        args: &[String],
        env: &[(&str, &str)],
    ) -> impl Future<Output = Result<(), StepError>> {
        let spawned = spawn_relayed(&self.supervisor, &self.bin_dir, binary, args, env);
        let args = args.join(" ");
        async move {
            let mut process = spawned.map_err(|source| StepError::Launch {
                version: binary.version,
                source,
            })?;
            let status = {
                // If this future is dropped (a stop signal), the guard stops
                // the tool so it never outlives the step.
                let mut guard = StopOnDrop(Some(&mut process.child));
                let status = match guard.0.as_mut() {
                    Some(child) => child.wait().await,
                    None => return Ok(()),
                };
                guard.0 = None;
                status
            };
            if status == ExitStatus::Exited(0) {
                return Ok(());
            }
            Err(StepError::Tool {
                binary,
                args,
                status,
                output: process.recent_output().join("\n"),
            })
        }
    }
}

/// Sends SIGTERM to a child whose waiting future was dropped.
struct StopOnDrop<'a>(Option<&'a mut Child>);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        if let Some(child) = self.0.as_mut() {
            child.signal(nix::sys::signal::Signal::SIGTERM);
        }
    }
}

/// Spawns a release's binary with a clean environment (plus `env`) and
/// relays its output into our log, prefixed with its name.
fn spawn_relayed(
    supervisor: &Supervisor,
    bin_dir: &std::path::Path,
    binary: Binary,
    args: &[String],
    env: &[(&str, &str)],
) -> Result<ProcessEtcd, SupervisorError> {
    let program = binaries::path(bin_dir, binary);
    let mut command = Command::new(&program);
    command
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // etcd reads ETCD_<FLAG> env vars as flags and refuses to start when
    // one shadows a flag we pass ("conflicting environment variable"), and
    // etcdctl reads ETCDCTL_*; our own ETCD_NAME/ETCD_CREDS would be read
    // as config too. The command line is the whole config.
    // ETCD_UNSUPPORTED_ARCH is kept: it is how etcd is allowed to run at
    // all on some architectures, not configuration.
    for (key, _) in std::env::vars_os() {
        let key_text = key.to_string_lossy();
        if key_text.starts_with("ETCD") && key_text != "ETCD_UNSUPPORTED_ARCH" {
            command.env_remove(key);
        }
    }
    command.envs(env.iter().copied());
    let mut child = supervisor.spawn(&mut command)?;
    let output = Arc::new(Mutex::new(OutputSample::default()));
    let source = binary.to_string();
    let mut relays = Vec::new();
    for stream in child.take_output() {
        let output = Arc::clone(&output);
        let source = source.clone();
        relays.push(std::thread::spawn(move || relay(stream, &source, &output)));
    }
    Ok(ProcessEtcd {
        child,
        output,
        relays,
    })
}

/// Copies a child's stream into our log line by line until it closes.
fn relay(stream: Box<dyn Read + Send>, source: &str, output: &Mutex<OutputSample>) {
    let mut reader = BufReader::new(stream);
    let mut bytes = Vec::new();
    loop {
        bytes.clear();
        match reader.read_until(b'\n', &mut bytes) {
            Ok(0) | Err(_) => return,
            Ok(_) => {
                let line = String::from_utf8_lossy(&bytes);
                let line = line.trim_end();
                log::relay(source, line);
                output
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner())
                    .push(line);
            }
        }
    }
}

impl RunningEtcd for ProcessEtcd {
    fn pid(&self) -> i32 {
        self.child.pid()
    }

    fn wait(&mut self) -> impl Future<Output = ExitStatus> {
        self.child.wait()
    }

    fn stop(&mut self) -> impl Future<Output = Result<(ExitStatus, bool), SupervisorError>> {
        self.child.stop(STOP_GRACE)
    }

    fn owns_listener(&self, port: u16) -> Result<(), String> {
        let pid = self.child.pid();
        if !proc_is_ours() {
            // /proc was mounted for another PID namespace (`unshare --pid`
            // without --mount-proc): its pids are not ours, so it cannot
            // tell. A container always mounts its own; the step still has
            // /version's release as its proof.
            log::warn(
                "cannot prove the step's port is held by its etcd: /proc belongs to another PID namespace",
                &[("pid", pid.into()), ("port", port.into())],
            );
            return Ok(());
        }
        let inode = crate::listener::listening_inode(port)?.ok_or_else(|| {
            format!("nothing listens on 127.0.0.1:{port} (pid {pid} has exited?)")
        })?;
        if holds_socket(pid, inode)? {
            return Ok(());
        }
        Err(match crate::supervisor::socket_holder(inode) {
            Some((holder, command)) => {
                format!("127.0.0.1:{port} is held by pid {holder} ({command})")
            }
            None => format!(
                "127.0.0.1:{port} is held by a process etcd-migrate cannot see (socket inode {inode})"
            ),
        })
    }

    fn recent_output(&mut self) -> Vec<String> {
        // Once the child is gone its pipes close: let the relays drain the
        // last lines (usually the panic that explains the exit) first. A
        // process it left behind may hold a pipe open for ever, so the
        // wait has a deadline; a relay still running then is left to end
        // with that process.
        if self.child.try_status().is_some() {
            let deadline = Instant::now() + RELAY_DRAIN;
            while self.relays.iter().any(|relay| !relay.is_finished()) && Instant::now() < deadline
            {
                std::thread::sleep(RELAY_POLL);
            }
            for relay in self.relays.drain(..) {
                if relay.is_finished() {
                    let _ = relay.join();
                }
            }
        }
        self.output
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .lines()
    }
}

/// True when /proc shows this process under its own pid (it was mounted
/// for our PID namespace).
fn proc_is_ours() -> bool {
    std::fs::read_link("/proc/self")
        .ok()
        .and_then(|link| link.to_str().and_then(|pid| pid.parse::<u32>().ok()))
        == Some(std::process::id())
}

/// Whether process `pid` has an fd on the socket `inode`.
fn holds_socket(pid: i32, inode: u64) -> Result<bool, String> {
    let dir = format!("/proc/{pid}/fd");
    let wanted = format!("socket:[{inode}]");
    let entries = std::fs::read_dir(&dir).map_err(|err| format!("cannot list {dir}: {err}"))?;
    Ok(entries.flatten().any(|fd| {
        std::fs::read_link(fd.path()).is_ok_and(|link| link.as_os_str() == wanted.as_str())
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_data_dirs_hidden_nodes_are_kept_until_a_rebuilt_copy_replaces_it() {
        let (data, scratch) = (Path::new("/var/etcd/data"), Path::new("/var/etcd/scratch"));
        let mut known = KnownHidden::default();
        assert_eq!(known.get(data), None, "nothing known before the run's read");
        known.keep(data, &["/1/_x".to_string()]);
        assert_eq!(known.get(data), None, "not the run's data dir yet");
        let mut known = KnownHidden::of(data, vec!["/1/_x".to_string()]);
        assert_eq!(known.get(data), Some(vec!["/1/_x".to_string()]));
        assert_eq!(known.get(scratch), None, "a scratch copy is read each time");
        known.keep(scratch, &["/1/_y".to_string()]);
        assert_eq!(known.get(scratch), None);
        assert_eq!(known.get(data), Some(vec!["/1/_x".to_string()]));
        known.forget(scratch);
        assert!(
            known.get(data).is_some(),
            "only the data dir's replacement counts"
        );
        known.forget(data);
        assert_eq!(known.get(data), None, "replaced: read again");
        known.keep(data, &["/1/_x".to_string(), "/1/_z".to_string()]);
        assert_eq!(
            known.get(data).map(|p| p.len()),
            Some(2),
            "the new read kept"
        );
    }

    #[test]
    fn our_own_listener_is_ours_and_no_one_elses() {
        let listener = crate::listener::test_listener();
        let port = listener.local_addr().expect("addr").port();
        let inode = crate::listener::listening_inode(port)
            .expect("read")
            .expect("listed");
        assert!(holds_socket(std::process::id() as i32, inode).expect("fds"));
        assert!(!holds_socket(1, inode).unwrap_or(false));
        assert_eq!(
            crate::supervisor::socket_holder(inode).map(|(pid, _)| pid),
            Some(std::process::id() as i32)
        );
    }

    #[test]
    fn error_reports_keep_the_first_and_the_last_lines() {
        let mut sample = OutputSample::default();
        sample.push("flag provided but not defined: -bogus");
        for i in 0..200 {
            sample.push(&format!("usage line {i}"));
        }
        let lines = sample.lines();
        assert_eq!(lines[0], "flag provided but not defined: -bogus");
        assert_eq!(lines[OUTPUT_HEAD_LINES], "[… 176 lines omitted …]");
        assert_eq!(lines.last().map(String::as_str), Some("usage line 199"));
        assert_eq!(lines.len(), OUTPUT_HEAD_LINES + 1 + OUTPUT_TAIL_LINES);
    }

    #[test]
    fn error_reports_keep_the_cause_of_a_crash_from_the_middle() {
        let mut sample = OutputSample::default();
        for i in 0..OUTPUT_HEAD_LINES {
            sample.push(&format!("start line {i}"));
        }
        sample.push("unexpected fault address 0x7f00dead");
        sample.push("fatal error: fault");
        for i in 0..300 {
            sample.push(&format!("goroutine {i} [running]:"));
        }
        let lines = sample.lines();
        assert_eq!(lines[OUTPUT_HEAD_LINES], "[… 280 lines omitted …]");
        assert_eq!(
            lines[OUTPUT_HEAD_LINES + 1],
            "unexpected fault address 0x7f00dead"
        );
        assert_eq!(lines[OUTPUT_HEAD_LINES + 2], "fatal error: fault");
        assert_eq!(
            lines.last().map(String::as_str),
            Some("goroutine 299 [running]:")
        );
        assert!(is_fatal(
            r#"{"level":"fatal","msg":"failed to open database"}"#
        ));
        assert!(is_fatal("2026-11-22 etcdserver: C | failed"));
        assert!(!is_fatal("goroutine 1 [running]:"));
    }
}
