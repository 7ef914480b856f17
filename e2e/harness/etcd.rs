//! This module owns the real etcd processes a test starts itself (to write
//! a fixture or to read the migrated data back): spawning one as a single
//! member, proving it healthy with a v3 write, stopping it with SIGTERM and
//! a deadline, and killing it when its guard drops so a failing test never
//! leaves an etcd behind.

use std::fs::File;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use etcd_client::{Client, ConnectOptions};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use super::{etcd_binary, Member, ETCD_READY_TIMEOUT, POLL_INTERVAL, STOP_GRACE};

/// How long one connect or request of the test's own client may take
/// when nothing retries it (fixture writes, keyspace reads): a put on
/// loopback takes milliseconds, but its fsync can wait seconds behind other
/// people's builds on a loaded disk, and one timeout fails the test.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// How long one attempt of a readiness probe (or of any poll that retries
/// until its own deadline) may take before the next attempt.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// The key the readiness probe writes and deletes again, so the keyspace a
/// test compares is not changed by probing it.
pub const PROBE_KEY: &str = "e2e-readiness-probe";

/// A v3 client for `endpoint` whose connect and requests each time out
/// after [`REQUEST_TIMEOUT`].
pub async fn connect(endpoint: &str) -> Result<Client, etcd_client::Error> {
    connect_within(endpoint, REQUEST_TIMEOUT).await
}

/// A v3 client for `endpoint` whose connect and requests each time out
/// after `timeout` (a poll retrying until its own deadline uses
/// [`PROBE_TIMEOUT`]).
pub async fn connect_within(
    endpoint: &str,
    timeout: Duration,
) -> Result<Client, etcd_client::Error> {
    let options = ConnectOptions::new()
        .with_connect_timeout(timeout)
        .with_timeout(timeout);
    Client::connect([endpoint], Some(options)).await
}

/// One write and its undo: the proof that etcd serves v3 (ETCD-NOTES:
/// `/health` is not proof).
pub async fn probe(endpoint: String) -> Result<(), String> {
    let mut client = connect_within(&endpoint, PROBE_TIMEOUT)
        .await
        .map_err(|err| format!("connect: {err}"))?;
    client
        .put(PROBE_KEY, "1", None)
        .await
        .map_err(|err| format!("put: {err}"))?;
    client
        .delete(PROBE_KEY, None)
        .await
        .map_err(|err| format!("delete: {err}"))?;
    Ok(())
}

/// Kills `child` (SIGKILL) and reaps it, with a deadline.
pub fn kill_and_reap(child: &mut Child) -> Option<ExitStatus> {
    if let Ok(Some(status)) = child.try_wait() {
        return Some(status);
    }
    let _ = child.kill();
    reap_within(child, STOP_GRACE)
}

/// Waits up to `timeout` for `child` to exit.
pub fn reap_within(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Some(status),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(POLL_INTERVAL),
            Ok(None) | Err(_) => return None,
        }
    }
}

/// SIGTERM, up to [`STOP_GRACE`], then SIGKILL. Returns how it ended and
/// whether SIGKILL was needed.
pub fn terminate(child: &mut Child) -> (ExitStatus, bool) {
    if let Ok(Some(status)) = child.try_wait() {
        return (status, false);
    }
    let pid = Pid::from_raw(child.id() as i32);
    let _ = kill(pid, Signal::SIGTERM);
    if let Some(status) = reap_within(child, STOP_GRACE) {
        return (status, false);
    }
    match kill_and_reap(child) {
        Some(status) => (status, true),
        None => panic!("pid {pid} survived SIGKILL for {STOP_GRACE:?}"),
    }
}

/// Makes a spawned process die with the test thread that started it, even
/// if the test process is killed before the guards run.
pub fn die_with_parent(command: &mut Command) {
    // SAFETY: the closure runs between fork and exec and makes one
    // async-signal-safe system call (prctl).
    unsafe {
        command.pre_exec(|| {
            nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(std::io::Error::from)
        });
    }
}

/// A real etcd started by the test, killed on drop.
pub struct EtcdProcess {
    child: Option<Child>,
    version: String,
    client_port: u16,
    log: PathBuf,
}

impl EtcdProcess {
    /// Starts `etcd-<version>` as `member` on `data_dir`, serving clients on
    /// `127.0.0.1:<client_port>`, its output in a file under `log_dir`.
    /// The short raft timings are safe for an isolated single member and
    /// cut start → first write to ~0.2 s (ETCD-NOTES).
    pub fn start(
        version: &str,
        member: &Member,
        data_dir: &Path,
        client_port: u16,
        log_dir: &Path,
    ) -> Self {
        Self::start_with(version, member, data_dir, client_port, log_dir, &[])
    }

    /// [`EtcdProcess::start`] of a member named `name` on `dir/<data>`, on
    /// a free client port, its log in `dir`: a lone etcd for a test.
    pub fn start_in(version: &str, dir: &Path, data: &str, name: &str) -> Self {
        Self::start(
            version,
            &Member::new(name),
            &dir.join(data),
            super::ports::free_port(),
            dir,
        )
    }

    /// [`EtcdProcess::start`] with `extra` flags appended (e.g.
    /// `--enable-v2=true` to read the v2 store of 3.4/3.5).
    pub fn start_with(
        version: &str,
        member: &Member,
        data_dir: &Path,
        client_port: u16,
        log_dir: &Path,
        extra: &[&str],
    ) -> Self {
        Self::start_program(
            &etcd_binary(version),
            version,
            member,
            data_dir,
            client_port,
            log_dir,
            extra,
        )
    }

    /// [`EtcdProcess::start_with`] of the etcd at `program` (a release
    /// outside the bin dir), `version` naming it in logs and messages.
    pub fn start_program(
        program: &Path,
        version: &str,
        member: &Member,
        data_dir: &Path,
        client_port: u16,
        log_dir: &Path,
        extra: &[&str],
    ) -> Self {
        let log = log_dir.join(format!("etcd-{version}-{client_port}.log"));
        let out =
            File::create(&log).unwrap_or_else(|err| panic!("create {}: {err}", log.display()));
        let err_out = out
            .try_clone()
            .unwrap_or_else(|err| panic!("dup {}: {err}", log.display()));
        let client_url = format!("http://127.0.0.1:{client_port}");
        let mut command = Command::new(program);
        command
            .arg(format!("--name={}", member.name))
            .arg(format!("--data-dir={}", data_dir.display()))
            .arg(format!("--listen-client-urls={client_url}"))
            .arg(format!("--advertise-client-urls={client_url}"))
            .arg(format!("--listen-peer-urls={}", member.peer_url()))
            .arg(format!(
                "--initial-advertise-peer-urls={}",
                member.peer_url()
            ))
            .arg(format!("--initial-cluster={}", member.initial_cluster()))
            .arg("--heartbeat-interval=10")
            .arg("--election-timeout=100")
            .args(extra)
            // etcd reads ETCD_* variables as flags: give it none.
            .env_clear()
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err_out);
        die_with_parent(&mut command);
        let child = command
            .spawn()
            .unwrap_or_else(|err| panic!("spawn {}: {err}", program.display()));
        EtcdProcess {
            child: Some(child),
            version: version.to_string(),
            client_port,
            log,
        }
    }

    /// `http://127.0.0.1:<client_port>`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.client_port)
    }

    /// The last lines etcd printed, for failure messages.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    fn child(&mut self) -> &mut Child {
        self.child
            .as_mut()
            .unwrap_or_else(|| panic!("etcd {} was already stopped", self.version))
    }

    /// Waits until a v3 write succeeds; panics with etcd's output if it
    /// exits or the deadline passes first.
    pub async fn wait_ready(&mut self) {
        self.wait_ready_with(probe).await;
    }

    /// Waits until `probe` succeeds on its endpoint (the v2 one lives
    /// with the v2 helpers: `v2.rs`'s `wait_ready_v2`).
    pub(super) async fn wait_ready_with<F, Fut>(&mut self, probe: F)
    where
        F: Fn(String) -> Fut,
        Fut: std::future::Future<Output = Result<(), String>>,
    {
        let started = Instant::now();
        let endpoint = self.endpoint();
        loop {
            if let Ok(Some(status)) = self.child().try_wait() {
                panic!(
                    "etcd {} exited with {status} before accepting a write; its output:\n{}",
                    self.version,
                    self.log_tail()
                );
            }
            let last_error = match probe(endpoint.clone()).await {
                Ok(()) => return,
                Err(err) => err,
            };
            if started.elapsed() > ETCD_READY_TIMEOUT {
                panic!(
                    "etcd {} did not accept a write on {endpoint} within {ETCD_READY_TIMEOUT:?} \
                     (last attempt: {last_error}); its output:\n{}",
                    self.version,
                    self.log_tail()
                );
            }
            tokio::time::sleep(POLL_INTERVAL).await;
        }
    }

    /// Stops etcd with SIGTERM (SIGKILL after [`STOP_GRACE`]) and asserts
    /// it stopped cleanly, so the data dir is left as etcd wants it.
    pub fn stop(mut self) {
        let mut child = self
            .child
            .take()
            .unwrap_or_else(|| panic!("etcd {} was already stopped", self.version));
        let (status, killed) = terminate(&mut child);
        assert!(
            !killed,
            "etcd {} ignored SIGTERM for {STOP_GRACE:?}; its output:\n{}",
            self.version,
            self.log_tail()
        );
        // etcd re-raises SIGTERM after its cleanup, or exits 0.
        let clean = status.success()
            || std::os::unix::process::ExitStatusExt::signal(&status)
                == Some(Signal::SIGTERM as i32);
        assert!(
            clean,
            "etcd {} stopped with {status}; its output:\n{}",
            self.version,
            self.log_tail()
        );
    }
}

impl Drop for EtcdProcess {
    fn drop(&mut self) {
        if let Some(child) = self.child.as_mut() {
            kill_and_reap(child);
        }
    }
}
