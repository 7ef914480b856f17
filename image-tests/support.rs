//! This module owns what every container test shares: the image under test
//! and what it bundles, one test's docker objects and work dir (removed by
//! a Drop guard, also when the test fails), `docker` and `etcdctl` inside a
//! container, the waits (each with a deadline), seeding a data dir with a
//! real etcd of the image, and the keyspace a container's etcd serves.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsStr;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::harness::keyspace::{Entry, Keyspace, Lease, Revision};
use crate::harness::POLL_INTERVAL;

/// The repository root.
pub fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The image under test and what it bundles.
pub struct Image {
    /// `$IMAGE` (default `etcd-migrate:dev`).
    pub name: String,
    /// `$BASEIMAGE`: the base a test image built from a bundle uses.
    pub base: String,
    /// The image's `io.etcd-migrate.bundled-versions`, oldest first.
    pub bundled: Vec<String>,
}

impl Image {
    /// The newest bundled release.
    pub fn newest(&self) -> &str {
        self.bundled.last().map(String::as_str).unwrap_or("")
    }

    /// Whether `version` is bundled.
    pub fn bundles(&self, version: &str) -> bool {
        self.bundled.iter().any(|v| v == version)
    }

    /// The bundled list as the label spells it (comma-separated).
    pub fn bundled_label(&self) -> String {
        self.bundled.join(",")
    }
}

/// The image under test; fails the test (it runs only under `make
/// image-test`) when the machine cannot run it: not root, no image, or an
/// image without 3.3.25, 3.4.23 and 3.5.16.
pub fn image() -> &'static Image {
    static IMAGE: OnceLock<Image> = OnceLock::new();
    IMAGE.get_or_init(|| {
        assert!(
            nix::unistd::geteuid().is_root(),
            "run as root: the tests chown volumes and read containers' files"
        );
        let name = env_or("IMAGE", "etcd-migrate:dev");
        let base = env_or("BASEIMAGE", "etcd-migrate-base:glibc-bookworm");
        let label = docker(&[
            "image",
            "inspect",
            "-f",
            "{{ index .Config.Labels \"io.etcd-migrate.bundled-versions\" }}",
            &name,
        ]);
        assert!(
            label.status.success(),
            "no image {name}: build it with 'make image' ({})",
            stderr(&label)
        );
        let bundled: Vec<String> = stdout(&label)
            .trim()
            .split(',')
            .filter(|v| !v.is_empty())
            .map(str::to_string)
            .collect();
        for version in ["3.3.25", "3.4.23", "3.5.16"] {
            assert!(
                bundled.iter().any(|v| v == version),
                "{name} must bundle 3.3.25, 3.4.23 and 3.5.16 (it has {})",
                bundled.join(",")
            );
        }
        ensure_tool("openssl", "openssl");
        ensure_tool("curl", "curl");
        sweep_dead_runs();
        eprintln!("image-tests: image {name} (etcd {})", bundled.join(","));
        Image {
            name,
            base,
            bundled,
        }
    })
}

fn env_or(key: &str, default: &str) -> String {
    std::env::var(key)
        .ok()
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| default.to_string())
}

/// A command's stdout as text.
pub fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// A command's stderr as text.
pub fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).trim().to_string()
}

/// Runs `program args`, stdin closed, capturing both outputs.
pub fn run<S: AsRef<OsStr>>(program: &str, args: &[S]) -> Output {
    Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|err| panic!("run {program}: {err}"))
}

/// `docker args`.
pub fn docker<S: AsRef<OsStr>>(args: &[S]) -> Output {
    run("docker", args)
}

/// `docker args`, which must succeed; its stdout, trimmed.
pub fn docker_ok<S: AsRef<OsStr>>(args: &[S]) -> String {
    let output = docker(args);
    assert!(
        output.status.success(),
        "docker {} failed: {}",
        args.iter()
            .map(|a| a.as_ref().to_string_lossy().into_owned())
            .collect::<Vec<_>>()
            .join(" "),
        stderr(&output)
    );
    stdout(&output).trim().to_string()
}

/// Runs `script` with `sh -c` (its `$1`… are `args`), stdout and stderr
/// into one stream, in order; that stream and whether it succeeded.
pub fn sh(script: &str, args: &[&str]) -> (bool, String) {
    let output = Command::new("sh")
        .arg("-c")
        .arg(format!("exec 2>&1; {script}"))
        .arg("sh")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|err| panic!("run sh: {err}"));
    (output.status.success(), stdout(&output))
}

/// Installs `package` from Debian's packages when `tool` is missing.
pub fn ensure_tool(tool: &str, package: &str) {
    if sh("command -v \"$1\"", &[tool]).0 {
        return;
    }
    eprintln!("image-tests: {tool} is missing: installing {package} from Debian's packages");
    let output = Command::new("apt-get")
        .args(["install", "-y", "-q", package])
        .env("DEBIAN_FRONTEND", "noninteractive")
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|err| panic!("{tool} is needed (run apt-get: {err})"));
    assert!(
        output.status.success(),
        "{tool} is needed (apt-get install {package} failed: {})",
        stderr(&output)
    );
}

/// One test's docker objects and work dir. Everything it makes carries
/// its label (unique to this run and test) or is named with its run id, or
/// lives under its work dir; all of it is removed when it drops, also when
/// the test fails. The id begins with this process's pid, so a later run
/// removes what a killed one left (`sweep_dead_runs`).
pub struct TestRun {
    /// The image under test.
    pub image: &'static Image,
    /// Unique to this run and test: the work dir's random suffix.
    pub id: String,
    /// `io.etcd-migrate.image-test=<id>`.
    pub label: String,
    /// The work dir, mode 0755 (containers of other users read it).
    pub work: PathBuf,
    /// The test's name.
    name: String,
    /// When it began.
    started: Instant,
    /// The containers made without the label (the examples name theirs).
    named: Mutex<Vec<String>>,
    /// Removes the work dir last.
    _dir: tempfile::TempDir,
}

impl TestRun {
    /// A fresh run of the test `name`.
    pub fn new(name: &str) -> TestRun {
        let image = image();
        let pid = std::process::id();
        let dir = tempfile::Builder::new()
            .prefix(&format!("{WORK_PREFIX}{pid}-{name}-"))
            .tempdir_in("/tmp")
            .unwrap_or_else(|err| panic!("cannot create a work dir in /tmp: {err}"));
        crate::harness::set_mode(dir.path(), 0o755);
        let suffix = dir
            .path()
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let random = suffix.rsplit('-').next().unwrap_or(&suffix);
        let id = format!("{pid}-{}-{}", name.replace('_', "-"), random.to_lowercase());
        eprintln!(
            "image-tests: {name}: image {}, work dir {}",
            image.name,
            dir.path().display()
        );
        TestRun {
            image,
            label: format!("{LABEL_KEY}={id}"),
            name: name.to_string(),
            started: Instant::now(),
            id,
            work: dir.path().to_path_buf(),
            named: Mutex::new(Vec::new()),
            _dir: dir,
        }
    }

    /// A dir under the work dir (created).
    pub fn dir(&self, relative: &str) -> PathBuf {
        let path = self.work.join(relative);
        std::fs::create_dir_all(&path)
            .unwrap_or_else(|err| panic!("mkdir {}: {err}", path.display()));
        path
    }

    /// `docker run -d --label <label> args`: the container's id.
    pub fn run_d<S: AsRef<str>>(&self, args: &[S]) -> String {
        let mut argv = vec![
            "run".to_string(),
            "-d".into(),
            "--label".into(),
            self.label.clone(),
        ];
        argv.extend(args.iter().map(|a| a.as_ref().to_string()));
        let output = docker(&argv);
        assert!(
            output.status.success(),
            "docker {} failed: {}",
            argv.join(" "),
            stderr(&output)
        );
        stdout(&output).trim().to_string()
    }

    /// `docker create --label <label> IMAGE`: the container's id.
    pub fn create(&self, image: &str) -> String {
        docker_ok(&["create", "--label", &self.label, image])
    }

    /// Remembers a container that carries no label, to remove it by name.
    pub fn adopt(&self, name: &str) {
        self.named
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(name.to_string());
    }

    /// A container of the image run with `--rm` and the label, to its end:
    /// its output.
    pub fn run_rm(&self, args: &[&str]) -> Output {
        let mut argv = vec!["run", "--rm", "--label", &self.label];
        argv.extend_from_slice(args);
        docker(&argv)
    }

    /// Seeds `host/<sub>` (host mounted at /seed) with etcd `version` of
    /// the image, as `seed` in the shell tests did: `/registry/seed/version
    /// = version` and five pods, then SIGTERM (docker stop) and
    /// `version.txt`. Returns the keyspace it served before the stop.
    pub fn seed(&self, version: &str, host: &Path, name: &str, opts: &Seed) -> Keyspace {
        std::fs::create_dir_all(host)
            .unwrap_or_else(|err| panic!("mkdir {}: {err}", host.display()));
        let default_peer = vec![
            "--listen-peer-urls".to_string(),
            "http://localhost:2380".into(),
            "--initial-advertise-peer-urls".into(),
            "http://localhost:2380".into(),
            "--initial-cluster".into(),
            format!("{name}=http://localhost:2380"),
        ];
        let peer = if opts.peer.is_empty() {
            &default_peer
        } else {
            &opts.peer
        };
        let mut args: Vec<String> = opts.docker.clone();
        args.extend([
            "-v".to_string(),
            format!("{}:/seed", host.display()),
            "--entrypoint".into(),
            format!("/usr/local/bin/etcd-{version}"),
            self.image.name.clone(),
            "--name".into(),
            name.into(),
            "--data-dir".into(),
            format!("/seed/{}", opts.sub()),
            "--listen-client-urls".into(),
            "http://127.0.0.1:2379".into(),
            "--advertise-client-urls".into(),
            "http://127.0.0.1:2379".into(),
        ]);
        args.extend(peer.iter().cloned());
        let c = self.run_d(&args);
        // A deadline, not a count of tries: each try is a `docker exec`,
        // whose time grows with the machine's load.
        let endpoint = "http://127.0.0.1:2379";
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if ctl(
                &c,
                version,
                endpoint,
                &[],
                &["put", "/registry/seed/version", version],
            )
            .status
            .success()
            {
                break;
            }
            assert!(
                running(&c) && Instant::now() < deadline,
                "seed etcd {version} never took a write: {}",
                tail(&logs(&c), 20)
            );
            std::thread::sleep(POLL_INTERVAL);
        }
        for i in 1..=5 {
            let key = format!("/registry/pods/default/pod-{i}");
            let value = format!("{{\"name\":\"pod-{i}\"}}");
            let put = ctl(&c, version, endpoint, &[], &["put", &key, &value]);
            assert!(put.status.success(), "seed put failed: {}", stderr(&put));
        }
        let seeded = read_keyspace(&c, version, endpoint, &[]);
        docker_ok(&["stop", "-t", "10", &c]);
        docker_ok(&["rm", &c]);
        let data = host.join(opts.sub());
        crate::harness::write_version_txt(&data, &format!("{version}/etcd3"));
        let meta =
            std::fs::metadata(&data).unwrap_or_else(|err| panic!("stat {}: {err}", data.display()));
        std::os::unix::fs::chown(data.join("version.txt"), Some(meta.uid()), Some(meta.gid()))
            .unwrap_or_else(|err| panic!("chown {}/version.txt: {err}", data.display()));
        seeded
    }

    /// Removes every container (with its anonymous volumes) and network
    /// of this test.
    pub fn remove_labelled(&self) {
        let filter = format!("label={}", self.label);
        let listed = |what: &[&str]| {
            let mut argv = what.to_vec();
            argv.extend(["-q", "--filter", &filter]);
            stdout(&docker(&argv))
        };
        let ids = listed(&["ps", "-a"]);
        let ids: Vec<&str> = ids.split_whitespace().collect();
        if !ids.is_empty() {
            let mut argv = vec!["rm", "-f", "-v"];
            argv.extend(&ids);
            let _ = docker(&argv);
        }
        let nets = listed(&["network", "ls"]);
        let nets: Vec<&str> = nets.split_whitespace().collect();
        if !nets.is_empty() {
            let mut argv = vec!["network", "rm"];
            argv.extend(&nets);
            let _ = docker(&argv);
        }
    }
}

/// The label key every docker object of these tests carries; its value
/// begins with the pid of the test process that made it.
const LABEL_KEY: &str = "io.etcd-migrate.image-test";

/// Whether the run whose id (`<pid>-…`) is `id` is over: its process is
/// gone. `None` for an id without a pid.
fn run_is_over(id: &str) -> Option<bool> {
    let pid: u32 = id.split('-').next()?.parse().ok()?;
    Some(pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists())
}

/// Removes what earlier runs, stopped before their guards ran (Ctrl-C,
/// SIGKILL), left: containers, networks and images labelled by a test
/// process that is gone, the examples' containers it named, and its work
/// dirs.
fn sweep_dead_runs() {
    let over = |id: &str| run_is_over(id) == Some(true);
    let label_filter = format!("label={LABEL_KEY}");
    let format = format!("{{{{.ID}}}} {{{{.Label \"{LABEL_KEY}\"}}}}");
    for (list, remove) in [
        (vec!["ps", "-a"], vec!["rm", "-f", "-v"]),
        (vec!["network", "ls"], vec!["network", "rm"]),
    ] {
        let mut argv = list.clone();
        argv.extend(["--filter", &label_filter, "--format", &format]);
        for line in stdout(&docker(&argv)).lines() {
            if let Some((id, run)) = line.split_once(' ') {
                if over(run) {
                    let mut argv = remove.clone();
                    argv.push(id);
                    let _ = docker(&argv);
                }
            }
        }
    }
    let images = docker(&["image", "ls", "-q", "--filter", &label_filter]);
    let label_of = format!("{{{{index .Config.Labels \"{LABEL_KEY}\"}}}}");
    for id in stdout(&images).split_whitespace() {
        let run = stdout(&docker(&["image", "inspect", "-f", &label_of, id]));
        if over(run.trim()) {
            let _ = docker(&["rmi", "-f", id]);
        }
    }
    let named = docker(&[
        "ps",
        "-a",
        "--filter",
        "name=etcd-example-",
        "--format",
        "{{.ID}} {{.Names}}",
    ]);
    for line in stdout(&named).lines() {
        if let Some((id, name)) = line.split_once(' ') {
            if name.strip_prefix("etcd-example-").is_some_and(over) {
                let _ = docker(&["rm", "-f", "-v", id]);
            }
        }
    }
    if let Ok(entries) = std::fs::read_dir("/tmp") {
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.strip_prefix(WORK_PREFIX).is_some_and(over) {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
    }
}

/// How a test's work dir in /tmp is named: `<prefix><pid>-<test>-<random>`.
const WORK_PREFIX: &str = "etcd-migrate-image-tests-";

impl Drop for TestRun {
    fn drop(&mut self) {
        let named = std::mem::take(&mut *self.named.lock().unwrap_or_else(|p| p.into_inner()));
        for name in named {
            let _ = docker(&["rm", "-f", "-v", &name]);
        }
        self.remove_labelled();
        let filter = format!("label={}", self.label);
        let images = docker(&["image", "ls", "-q", "--filter", &filter]);
        let images = stdout(&images);
        let images: Vec<&str> = images.split_whitespace().collect();
        if !images.is_empty() {
            let mut argv = vec!["rmi", "-f"];
            argv.extend(&images);
            let _ = docker(&argv);
        }
        eprintln!(
            "image-tests: {} {} after {} s",
            self.name,
            if std::thread::panicking() {
                "FAILED"
            } else {
                "passed"
            },
            self.started.elapsed().as_secs()
        );
    }
}

/// How a seed etcd runs: extra docker options, its peer flags (default
/// `http://localhost:2380`) and its data dir under the mount (default
/// `data`).
#[derive(Default)]
pub struct Seed {
    /// Extra `docker run` options.
    pub docker: Vec<String>,
    /// The peer flags.
    pub peer: Vec<String>,
    /// The data dir's name under the mount.
    pub sub: Option<String>,
}

impl Seed {
    fn sub(&self) -> &str {
        self.sub.as_deref().unwrap_or("data")
    }
}

/// Strings from string slices.
pub fn strings(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

/// The last `n` lines of `text`.
pub fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// `docker logs`, stdout and stderr in order.
pub fn logs(c: &str) -> String {
    sh("docker logs \"$1\"", &[c]).1
}

/// Whether the logs of `c` hold `needle`.
pub fn has_log(c: &str, needle: &str) -> bool {
    logs(c).contains(needle)
}

/// The first log line holding `needle`, cut to 150 characters.
pub fn log_line(c: &str, needle: &str) -> String {
    logs(c)
        .lines()
        .find(|line| line.contains(needle))
        .map(|line| line.chars().take(150).collect())
        .unwrap_or_default()
}

/// `docker inspect -f format c`.
pub fn inspect(c: &str, format: &str) -> String {
    stdout(&docker(&["inspect", "-f", format, c]))
        .trim()
        .to_string()
}

/// Whether `c` runs.
pub fn running(c: &str) -> bool {
    inspect(c, "{{.State.Running}}") == "true"
}

/// Waits until the logs of `c` hold `needle`; fails when `c` exits first
/// or after `secs`.
pub fn wait_log(c: &str, needle: &str, secs: u64) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if has_log(c, needle) {
            return;
        }
        if !running(c) {
            assert!(
                has_log(c, needle),
                "container exited before logging '{needle}': {}",
                tail(&logs(c), 10)
            );
            return;
        }
        assert!(
            Instant::now() < deadline,
            "no '{needle}' in the logs within {secs} s"
        );
        std::thread::sleep(POLL_INTERVAL);
    }
}

/// Waits until `c` exits, at most `secs`: its exit code.
pub fn wait_exit(c: &str, secs: u64) -> i32 {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while running(c) {
        assert!(
            Instant::now() < deadline,
            "{c} still running after {secs} s"
        );
        std::thread::sleep(POLL_INTERVAL);
    }
    let code = inspect(c, "{{.State.ExitCode}}");
    code.parse()
        .unwrap_or_else(|err| panic!("exit code of {c} {code:?}: {err}"))
}

/// The command line of the container's PID 1, from the host (docker top),
/// so it needs nothing inside the image.
pub fn pid1(c: &str) -> String {
    let host_pid = inspect(c, "{{.State.Pid}}");
    let top = docker_ok(&["top", c, "-eo", "pid,args"]);
    top.lines()
        .filter_map(|line| line.trim().split_once(' '))
        .find(|(pid, _)| *pid == host_pid)
        .map(|(_, args)| args.trim().to_string())
        .unwrap_or_default()
}

/// PID 1 of `c` is `/usr/local/bin/etcd-<version>`.
pub fn expect_pid1_etcd(c: &str, version: &str) {
    let cmd = pid1(c);
    let program = format!("/usr/local/bin/etcd-{version}");
    assert!(
        cmd == program || cmd.starts_with(&format!("{program} ")),
        "PID 1 is '{cmd}', not {program}"
    );
}

/// etcdctl of `version` inside `c` (API 3) on `endpoint`, with the TLS
/// arguments `tls`.
pub fn ctl(c: &str, version: &str, endpoint: &str, tls: &[String], args: &[&str]) -> Output {
    let mut argv: Vec<String> = strings(&["exec", "-e", "ETCDCTL_API=3", c]);
    argv.push(format!("/usr/local/bin/etcdctl-{version}"));
    argv.extend(strings(&["--endpoints", endpoint, "--command-timeout=5s"]));
    argv.extend(tls.iter().cloned());
    argv.extend(strings(args));
    docker(&argv)
}

/// Waits until etcd in `c` serves `/registry/seed/version` on `endpoint`
/// (etcdctl of `version`); fails when `c` exits or after `secs`.
pub fn wait_serving(c: &str, version: &str, endpoint: &str, secs: u64, tls: &[String]) {
    if let Err(err) = try_wait_serving(c, version, endpoint, secs, tls) {
        panic!("{err}");
    }
}

/// [`wait_serving`], with what went wrong as an error.
pub fn try_wait_serving(
    c: &str,
    version: &str,
    endpoint: &str,
    secs: u64,
    tls: &[String],
) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        let out = ctl(
            c,
            version,
            endpoint,
            tls,
            &["get", "/registry/seed/version", "--print-value-only"],
        );
        if out.status.success() && !stdout(&out).trim().is_empty() {
            return Ok(());
        }
        if !running(c) {
            return Err(format!(
                "container exited ({}) instead of serving: {}",
                inspect(c, "{{.State.ExitCode}}"),
                tail(&logs(c), 20)
            ));
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "etcd in {c} did not serve /registry/seed/version on {endpoint} within {secs} s: {}{}",
                stdout(&out),
                stderr(&out)
            ));
        }
        std::thread::sleep(POLL_INTERVAL);
    }
}

/// Waits until `c` takes a write of `/registry/seed/version = value` on
/// 127.0.0.1:2379; fails when `c` exits or after `secs`.
pub fn wait_put(c: &str, version: &str, value: &str, secs: u64) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        let put = ctl(
            c,
            version,
            "http://127.0.0.1:2379",
            &[],
            &["put", "/registry/seed/version", value],
        );
        if put.status.success() {
            return;
        }
        assert!(
            running(c) && Instant::now() < deadline,
            "{c} did not take a write: {}",
            tail(&logs(c), 5)
        );
        std::thread::sleep(POLL_INTERVAL);
    }
}

/// The content of `<dir>/version.txt`, or `(none)`.
pub fn version_txt(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("version.txt")).unwrap_or_else(|_| "(none)".to_string())
}

/// The seeded pods are readable through etcd `version` in `c`, and the
/// whole keyspace is the seed's: every key, value, lease and revision,
/// and none of the migrator's health keys left.
pub fn expect_keys(c: &str, version: &str, endpoint: &str, tls: &[String], seeded: &Keyspace) {
    let out = ctl(
        c,
        version,
        endpoint,
        tls,
        &["get", "--prefix", "/registry/pods/", "--keys-only"],
    );
    let pods = stdout(&out)
        .lines()
        .filter(|line| line.starts_with("/registry/pods/"))
        .count();
    assert_eq!(
        pods,
        5,
        "seeded pods readable through etcd {version} on {endpoint}: {}",
        stderr(&out)
    );
    let now = read_keyspace(c, version, endpoint, tls);
    now.assert_kept(seeded, 0);
    now.assert_revisions_kept(seeded);
}

/// Everything the etcd at `endpoint` in `c` serves through v3, read with
/// etcdctl of `version` inside the container (the host cannot reach a
/// container's loopback): keys, values, revisions, and the leases keys are
/// attached to.
pub fn read_keyspace(c: &str, version: &str, endpoint: &str, tls: &[String]) -> Keyspace {
    let out = ctl(
        c,
        version,
        endpoint,
        tls,
        &["get", "", "--prefix", "-w", "json"],
    );
    assert!(
        out.status.success(),
        "etcdctl get of every key on {endpoint} in {c}: {}",
        stderr(&out)
    );
    let json: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|err| panic!("etcdctl's JSON from {c}: {err}: {}", stdout(&out)));
    let number =
        |v: &serde_json::Value, key: &str| v.get(key).and_then(|n| n.as_i64()).unwrap_or(0);
    let mut keyspace = Keyspace {
        revision: json
            .get("header")
            .map(|h| number(h, "revision"))
            .unwrap_or(0),
        ..Keyspace::default()
    };
    let kvs = json
        .get("kvs")
        .and_then(|k| k.as_array())
        .cloned()
        .unwrap_or_default();
    let mut lease_ids = BTreeSet::new();
    for kv in &kvs {
        let field = |key: &str| base64(kv.get(key).and_then(|v| v.as_str()).unwrap_or(""));
        let key = field("key");
        let lease = number(kv, "lease");
        if lease != 0 {
            lease_ids.insert(lease);
        }
        keyspace.revisions.insert(
            key.clone(),
            Revision {
                create: number(kv, "create_revision"),
                modified: number(kv, "mod_revision"),
                version: number(kv, "version"),
            },
        );
        keyspace.entries.insert(
            key,
            Entry {
                value: field("value"),
                lease,
            },
        );
    }
    let mut leases = BTreeMap::new();
    for id in lease_ids {
        let hex = format!("{id:x}");
        let out = ctl(
            c,
            version,
            endpoint,
            tls,
            &["lease", "timetolive", &hex, "--keys", "-w", "json"],
        );
        assert!(
            out.status.success(),
            "lease timetolive {hex} in {c}: {}",
            stderr(&out)
        );
        let lease: serde_json::Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|err| panic!("etcdctl's JSON of lease {hex}: {err}"));
        let keys = lease
            .get("keys")
            .and_then(|k| k.as_array())
            .map(|keys| {
                keys.iter()
                    .map(|k| base64(k.as_str().unwrap_or("")))
                    .collect()
            })
            .unwrap_or_default();
        leases.insert(
            id,
            Lease {
                granted_ttl: number(&lease, "granted-ttl"),
                remaining_ttl: number(&lease, "ttl"),
                keys,
            },
        );
    }
    keyspace.leases = leases;
    keyspace
}

/// Decodes standard base64 (etcdctl's JSON spelling of bytes).
pub fn base64(text: &str) -> Vec<u8> {
    let value = |c: u8| -> u32 {
        match c {
            b'A'..=b'Z' => u32::from(c - b'A'),
            b'a'..=b'z' => u32::from(c - b'a') + 26,
            b'0'..=b'9' => u32::from(c - b'0') + 52,
            b'+' => 62,
            b'/' => 63,
            _ => panic!("not base64: {text:?}"),
        }
    };
    let digits: Vec<u8> = text.bytes().filter(|c| *c != b'=').collect();
    let mut out = Vec::with_capacity(digits.len() * 3 / 4);
    for chunk in digits.chunks(4) {
        let bits = chunk
            .iter()
            .enumerate()
            .fold(0u32, |acc, (i, c)| acc | value(*c) << (18 - 6 * i));
        let bytes = bits.to_be_bytes();
        out.extend_from_slice(&bytes[1..chunk.len()]);
    }
    out
}

/// Every path under `root` (itself included) whose owner is not `uid`.
pub fn not_owned_by(root: &Path, uid: u32) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(path) = stack.pop() {
        let meta = std::fs::symlink_metadata(&path)
            .unwrap_or_else(|err| panic!("stat {}: {err}", path.display()));
        if meta.uid() != uid {
            found.push(path.clone());
        }
        if meta.is_dir() {
            for entry in std::fs::read_dir(&path)
                .unwrap_or_else(|err| panic!("list {}: {err}", path.display()))
            {
                stack.push(
                    entry
                        .unwrap_or_else(|err| panic!("list {}: {err}", path.display()))
                        .path(),
                );
            }
        }
    }
    found
}

/// A free loopback port for a published container port (the e2e
/// harness's: outside the ephemeral range, locked against other test
/// processes, never 18629/18631).
pub fn free_port() -> u16 {
    crate::harness::free_port()
}

/// `curl -fsS args`: its stdout, or `None` when it fails.
pub fn curl(args: &[&str]) -> Option<String> {
    let mut argv = vec!["-fsS"];
    argv.extend_from_slice(args);
    let output = run("curl", &argv);
    output.status.success().then(|| stdout(&output))
}

/// A CA and server, peer and client certificates (EC P-256, 1 day) in
/// `dir`, named as kubeadm names them, plus GCE's etcd-ca.crt /
/// etcd-peer.{crt,key}; `sans` as openssl spells them (`DNS:x`, `IP:y`).
pub fn make_certs(dir: &Path, sans: &[&str]) {
    std::fs::create_dir_all(dir).unwrap_or_else(|err| panic!("mkdir {}: {err}", dir.display()));
    let script = r#"
set -e
cd "$1"
ext="subjectAltName=$2
extendedKeyUsage=serverAuth,clientAuth"
printf '%s\n' "$ext" > ext.cnf
openssl ecparam -name prime256v1 -genkey -noout -out ca.key 2>/dev/null
openssl req -x509 -new -key ca.key -subj /CN=etcd-ca -days 1 -out ca.crt 2>/dev/null
for kind in server peer healthcheck-client; do
  openssl ecparam -name prime256v1 -genkey -noout -out "$kind.key" 2>/dev/null
  openssl req -new -key "$kind.key" -subj "/CN=$kind" -out "$kind.csr" 2>/dev/null
  openssl x509 -req -in "$kind.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -days 1 \
    -extfile ext.cnf -out "$kind.crt" 2>/dev/null
done
cp ca.crt etcd-ca.crt
cp peer.crt etcd-peer.crt
cp peer.key etcd-peer.key
rm -f ./*.csr ./*.srl ext.cnf
"#;
    let dir_text = dir.display().to_string();
    let (ok, out) = sh(script, &[&dir_text, &sans.join(",")]);
    assert!(ok, "openssl could not make certificates: {out}");
}

/// A python3 that has PyYAML, installing Debian's python3-yaml if needed.
pub fn yaml_python() -> &'static str {
    for python in ["python3", "/usr/bin/python3"] {
        if sh("\"$1\" -c 'import yaml'", &[python]).0 {
            return python;
        }
    }
    eprintln!("image-tests: PyYAML is missing: installing python3-yaml from Debian's packages");
    let installed = sh(
        "DEBIAN_FRONTEND=noninteractive apt-get install -y -q python3-yaml >/dev/null && /usr/bin/python3 -c 'import yaml'",
        &[],
    );
    assert!(
        installed.0,
        "no python3 with PyYAML, and apt-get install python3-yaml failed: {}",
        installed.1
    );
    "/usr/bin/python3"
}

/// The `docker run` arguments (after `docker run [test options]`) of the
/// container `container` of the pod manifest `manifest`, its hostPaths under
/// `root`: image-tests/pod2docker.py's answer.
pub fn pod_args(
    python: &str,
    manifest: &Path,
    container: &str,
    root: &Path,
    image: &str,
) -> Vec<String> {
    let script = repo().join("image-tests/pod2docker.py");
    let output = Command::new(python)
        .arg(&script)
        .arg(manifest)
        .args(["--container", container, "--image", image, "--root"])
        .arg(root)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|err| panic!("run {python} {}: {err}", script.display()));
    assert!(
        output.status.success(),
        "pod2docker.py {} failed: {}",
        manifest.display(),
        stderr(&output)
    );
    stdout(&output)
        .split('\0')
        .filter(|arg| !arg.is_empty())
        .map(str::to_string)
        .collect()
}

/// A file server on 127.0.0.1 for the files of one dir (HTTP/1.0 GET
/// only), stopped when it drops.
pub struct FileServer {
    /// Its port.
    pub port: u16,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl FileServer {
    /// Serves the files of `dir`.
    pub fn start(dir: &Path) -> FileServer {
        let port = free_port();
        let listener = TcpListener::bind(("127.0.0.1", port))
            .unwrap_or_else(|err| panic!("bind 127.0.0.1:{port}: {err}"));
        let stop = Arc::new(AtomicBool::new(false));
        let (dir, flag) = (dir.to_path_buf(), stop.clone());
        let thread = std::thread::spawn(move || {
            for stream in listener.incoming() {
                if flag.load(Ordering::SeqCst) {
                    return;
                }
                if let Ok(stream) = stream {
                    serve(&dir, stream);
                }
            }
        });
        FileServer {
            port,
            stop,
            thread: Some(thread),
        }
    }
}

fn serve(dir: &Path, mut stream: TcpStream) {
    let _ = stream.set_read_timeout(Some(Duration::from_secs(30)));
    let mut reader = BufReader::new(match stream.try_clone() {
        Ok(s) => s,
        Err(_) => return,
    });
    let mut request = String::new();
    if reader.read_line(&mut request).is_err() {
        return;
    }
    // The headers, up to the empty line.
    let mut line = String::new();
    while reader.read_line(&mut line).map(|n| n > 2).unwrap_or(false) {
        line.clear();
    }
    let path = request.split_whitespace().nth(1).unwrap_or("/");
    let name = path.trim_start_matches('/');
    let file = (!name.is_empty() && !name.contains('/') && !name.contains(".."))
        .then(|| std::fs::File::open(dir.join(name)).ok())
        .flatten();
    match file {
        Some(mut file) => {
            let mut body = Vec::new();
            if file.read_to_end(&mut body).is_err() {
                return;
            }
            let _ = write!(
                stream,
                "HTTP/1.0 200 OK\r\nContent-Length: {}\r\nContent-Type: application/octet-stream\r\n\r\n",
                body.len()
            );
            let _ = stream.write_all(&body);
        }
        None => {
            let _ = stream.write_all(b"HTTP/1.0 404 Not Found\r\nContent-Length: 0\r\n\r\n");
        }
    }
}

impl Drop for FileServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wakes the accept.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The sha256 of a file, in hex.
pub fn sha256_file(path: &Path) -> String {
    use sha2::Digest;
    let bytes = std::fs::read(path).unwrap_or_else(|err| panic!("read {}: {err}", path.display()));
    sha2::Sha256::digest(&bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[test]
fn base64_decodes_what_etcdctl_writes() {
    assert_eq!(base64("L3JlZ2lzdHJ5"), b"/registry");
    assert_eq!(base64("YQ=="), b"a");
    assert_eq!(base64("YWI="), b"ab");
    assert_eq!(base64(""), b"");
}
