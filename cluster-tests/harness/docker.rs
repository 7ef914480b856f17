//! This module owns the Docker objects of a test run: running the docker
//! CLI with a deadline, and guards for the network, volumes and containers
//! that remove them when they drop (also when a test fails). Every object
//! carries the run's label and a name unique to the run.

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::{Duration, Instant};

/// How often a deadline-bounded wait looks again.
pub const POLL: Duration = Duration::from_millis(100);
/// What an ordinary docker CLI call (create, rm, inspect, kill) may take.
pub const DOCKER_CALL: Duration = Duration::from_secs(60);

/// Label put on every object of a cluster-test run.
pub const LABEL_KEY: &str = "io.etcd-migrate.cluster-test";

/// Runs `cmd` to its end, with `deadline`; past it the process is killed
/// and the test fails naming the command.
pub fn run_with_deadline(cmd: &mut Command, deadline: Duration) -> Output {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let shown = format!("{cmd:?}");
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {shown}: {e}"));
    let mut out = child.stdout.take().expect("piped stdout");
    let mut err = child.stderr.take().expect("piped stderr");
    let out_reader = thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = out.read_to_end(&mut buf);
        buf
    });
    let err_reader = thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = err.read_to_end(&mut buf);
        buf
    });
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            break status;
        }
        if started.elapsed() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{shown} did not finish within {deadline:?}");
        }
        thread::sleep(POLL.min(Duration::from_millis(20)));
    };
    Output {
        status,
        stdout: out_reader.join().unwrap_or_default(),
        stderr: err_reader.join().unwrap_or_default(),
    }
}

/// `docker <args>` with the ordinary deadline; returns the output whatever
/// the exit status.
pub fn docker_output(args: &[&str]) -> Output {
    run_with_deadline(Command::new("docker").args(args), DOCKER_CALL)
}

/// `docker <args>`, which must succeed; returns its trimmed stdout.
pub fn docker(args: &[&str]) -> String {
    let out = docker_output(args);
    assert!(
        out.status.success(),
        "docker {} failed ({}): {}",
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// The first of `containers` whose output shows `needle` (what it printed
/// before the call included), or None when none did within `deadline` or
/// every one's output ended. The output is followed as docker streams it
/// (`docker logs -f`), so a line is seen within milliseconds of its
/// printing, not a round of full reads later: a kill on a log line lands
/// in the phase the line opens.
pub fn first_to_log(containers: &[&Container], needle: &str, deadline: Duration) -> Option<usize> {
    first_to_log_past(containers, needle, &vec![0; containers.len()], deadline)
}

/// [`first_to_log`], for the first container whose output shows `needle`
/// more often than `past` says for it (its earlier lines counted too).
pub fn first_to_log_past(
    containers: &[&Container],
    needle: &str,
    past: &[usize],
    deadline: Duration,
) -> Option<usize> {
    /// Kills the followers however the wait ends.
    struct Followers(Vec<Child>);
    impl Drop for Followers {
        fn drop(&mut self) {
            for child in &mut self.0 {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
    /// One container's stdout or stderr; `count`, shared by the two, is
    /// its matches so far.
    struct Watched {
        i: usize,
        needle: String,
        past: usize,
        count: Arc<AtomicUsize>,
        seen: mpsc::Sender<usize>,
    }
    fn watch(pipe: impl Read + Send + 'static, watched: Watched) {
        thread::spawn(move || {
            let mut reader = BufReader::new(pipe);
            let mut line = Vec::new();
            // Bytes, not lines of UTF-8: etcd's output is not bound to be.
            while matches!(reader.read_until(b'\n', &mut line), Ok(n) if n > 0) {
                let matched = String::from_utf8_lossy(&line).contains(&watched.needle);
                if matched && watched.count.fetch_add(1, Ordering::SeqCst) + 1 > watched.past {
                    let _ = watched.seen.send(watched.i);
                    return;
                }
                line.clear();
            }
        });
    }
    let (seen, first) = mpsc::channel();
    let mut followers = Followers(Vec::new());
    for (i, container) in containers.iter().enumerate() {
        let mut child = Command::new("docker")
            .args(["logs", "-f", &container.name])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run docker logs -f {}: {e}", container.name));
        let count = Arc::new(AtomicUsize::new(0));
        let watched = || Watched {
            i,
            needle: needle.to_string(),
            past: past.get(i).copied().unwrap_or(0),
            count: Arc::clone(&count),
            seen: seen.clone(),
        };
        if let Some(out) = child.stdout.take() {
            watch(out, watched());
        }
        if let Some(err) = child.stderr.take() {
            watch(err, watched());
        }
        followers.0.push(child);
    }
    drop(seen);
    let found = first.recv_timeout(deadline).ok();
    drop(followers);
    found
}

/// A private bridge network with its own /24, removed on drop.
pub struct Network {
    pub name: String,
    /// The first three octets, e.g. "10.231.17".
    pub prefix: String,
}

impl Network {
    /// Creates `name` on the first free 10.231.X.0/24 (X from `seed`), so
    /// parallel runs and other networks on the host do not collide.
    pub fn create(name: &str, label: &str, seed: u32) -> Network {
        const TRIES: u32 = 40;
        let mut last = String::new();
        for i in 0..TRIES {
            let x = (seed.wrapping_add(i.wrapping_mul(37))) % 250 + 2;
            let prefix = format!("10.231.{x}");
            let subnet = format!("{prefix}.0/24");
            let out = docker_output(&[
                "network", "create", "--driver", "bridge", "--subnet", &subnet, "--label", label,
                name,
            ]);
            if out.status.success() {
                return Network {
                    name: name.to_string(),
                    prefix,
                };
            }
            last = String::from_utf8_lossy(&out.stderr).trim().to_string();
            // Only a taken subnet is worth another try.
            if !last.contains("overlap") && !last.contains("in use") {
                break;
            }
        }
        panic!("cannot create network {name}: {last}");
    }

    /// The address of host number `n` (1 is the gateway).
    pub fn ip(&self, n: u8) -> String {
        format!("{}.{n}", self.prefix)
    }
}

impl Drop for Network {
    fn drop(&mut self) {
        let _ = docker_output(&["network", "rm", &self.name]);
    }
}

/// A named volume, removed on drop (after the containers using it).
pub struct Volume {
    pub name: String,
}

impl Volume {
    pub fn create(name: &str, label: &str) -> Volume {
        docker(&["volume", "create", "--label", label, name]);
        Volume {
            name: name.to_string(),
        }
    }
}

impl Drop for Volume {
    fn drop(&mut self) {
        let _ = docker_output(&["volume", "rm", "-f", &self.name]);
    }
}

/// State of a container as `docker inspect` tells it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum State {
    Running,
    Exited(i32),
    Other(String),
}

/// A container by name; removed (with `-f`) on drop.
pub struct Container {
    pub name: String,
}

impl Container {
    /// `docker run -d --name <name> <args>`; the caller passes the rest.
    pub fn run(name: &str, args: &[String]) -> Container {
        let mut all: Vec<&str> = vec!["run", "-d", "--name", name];
        all.extend(args.iter().map(String::as_str));
        docker(&all);
        Container {
            name: name.to_string(),
        }
    }

    pub fn state(&self) -> State {
        let out = docker(&[
            "inspect",
            "-f",
            "{{.State.Status}} {{.State.ExitCode}}",
            &self.name,
        ]);
        match out.split_once(' ') {
            Some(("running", _)) => State::Running,
            Some(("exited", code)) => State::Exited(code.parse().unwrap_or(-1)),
            _ => State::Other(out),
        }
    }

    /// When the container last started (`docker inspect`): the same
    /// before and after a wait, the container did not exit in between.
    pub fn started_at(&self) -> String {
        docker(&["inspect", "-f", "{{.State.StartedAt}}", &self.name])
    }

    /// Waits (with `deadline`) for the container to exit; its exit code.
    pub fn wait_exit(&self, deadline: Duration) -> i32 {
        let started = Instant::now();
        loop {
            if let State::Exited(code) = self.state() {
                return code;
            }
            assert!(
                started.elapsed() < deadline,
                "container {} still running after {deadline:?}; its log:\n{}",
                self.name,
                self.logs()
            );
            thread::sleep(POLL);
        }
    }

    /// Everything the container printed (stdout and stderr).
    pub fn logs(&self) -> String {
        let out = docker_output(&["logs", &self.name]);
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    }

    /// How many times `needle` occurs in the container's log (across its
    /// restarts: `docker logs` keeps every run's output).
    pub fn count_in_log(&self, needle: &str) -> usize {
        self.logs().matches(needle).count()
    }

    /// SIGKILL to the container's PID 1 (`docker kill -s KILL`).
    pub fn kill(&self) {
        docker(&["kill", "-s", "KILL", &self.name]);
    }

    /// SIGKILLs, from the host, the container's processes whose command
    /// name starts with `prefix` (their pids as `docker top` gives them):
    /// the entrypoint's etcd, say, while the entrypoint runs on. How many
    /// there were.
    pub fn kill_processes(&self, prefix: &str) -> usize {
        let top = docker(&["top", &self.name, "-o", "pid,comm"]);
        let pids: Vec<i32> = top
            .lines()
            .skip(1)
            .filter_map(|line| {
                let (pid, comm) = line.trim().split_once(char::is_whitespace)?;
                comm.trim().starts_with(prefix).then(|| pid.parse().ok())?
            })
            .collect();
        for &pid in &pids {
            // Gone meanwhile (exited by itself) is as good as killed.
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        pids.len()
    }

    /// A graceful stop: SIGTERM, SIGKILL after `grace_s` seconds.
    pub fn stop(&self, grace_s: u32) {
        docker(&["stop", "-t", &grace_s.to_string(), &self.name]);
    }

    /// Starts the (stopped) container again with its own settings.
    pub fn start(&self) {
        docker(&["start", &self.name]);
    }

    /// Freezes every process of the container (`docker pause`: the cgroup
    /// freezer): its etcd answers nothing, as a stalled machine, until
    /// [`Container::thaw`].
    pub fn freeze(&self) {
        docker(&["pause", &self.name]);
    }

    /// Lets a frozen container run on.
    pub fn thaw(&self) {
        docker(&["unpause", &self.name]);
    }

    /// Cuts the container off its network.
    pub fn disconnect(&self, network: &str) {
        docker(&["network", "disconnect", network, &self.name]);
    }

    /// Puts the container back on its network with its address.
    pub fn connect(&self, network: &str, ip: &str) {
        docker(&["network", "connect", "--ip", ip, network, &self.name]);
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        let _ = docker_output(&["rm", "-f", "-v", &self.name]);
    }
}
