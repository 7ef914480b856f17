//! This module owns what every e2e test shares: where the real etcd
//! binaries are, the member identity a fixture and the migrator must agree
//! on (and the exec'd target's arguments), deadlines, small file helpers,
//! and the processes /proc lists. Loopback ports come from `ports`.

pub mod etcd;
pub mod fixture;
pub mod keyspace;
pub mod migrator;
pub mod mount;
pub mod ports;
pub mod snapshot;
pub mod stand_in;
pub mod tree;
pub mod v2;

pub use ports::free_port;

use std::future::Future;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// How long a real etcd may take from spawn to its first successful write.
/// Measured 0.1–1.6 s (ETCD-NOTES); 60 s leaves room for a loaded 2-core
/// box where other builds hold the CPUs and the disk.
pub const ETCD_READY_TIMEOUT: Duration = Duration::from_secs(60);

/// How long one `etcd-migrate` run may take before the test kills it. A
/// two-step walk takes 1–3 s here.
pub const MIGRATE_TIMEOUT: Duration = Duration::from_secs(90);

/// How long a process gets between SIGTERM and SIGKILL (etcd stops in
/// 3–50 ms, ETCD-NOTES).
pub const STOP_GRACE: Duration = Duration::from_secs(10);

/// The scratch dir the rebuilding steps keep inside the data dir.
pub const WORK_DIR: &str = ".etcd-migrate.work";

/// The temp file `version.txt` is written to before it is renamed over
/// the old one.
pub const VERSION_TEMP: &str = ".version.txt.tmp";

/// Poll interval of every wait loop.
pub const POLL_INTERVAL: Duration = Duration::from_millis(20);

/// The bin dir holding `etcd-<v>`, `etcdctl-<v>`, `etcdutl-<v>`:
/// `$ETCD_BIN_DIR`, else the cache `images/fetch-etcd.sh` fills.
pub fn bin_dir() -> PathBuf {
    match std::env::var_os("ETCD_BIN_DIR") {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => Path::new(env!("CARGO_MANIFEST_DIR")).join(".cache/etcd/bin"),
    }
}

/// The dir `$ETCD_EXTRA_BIN_DIR` names, if set: releases the suite's fetch
/// cannot reach (2.2.1, 2.3.7, 3.0.17, 3.1.20, 3.2.32 as upstream release
/// tarballs unpacked into a dir), for the tests in `old_releases`.
pub fn extra_bin_dir() -> Option<PathBuf> {
    std::env::var_os("ETCD_EXTRA_BIN_DIR")
        .filter(|dir| !dir.is_empty())
        .map(PathBuf::from)
}

/// True for an executable file.
fn is_executable(path: &Path) -> bool {
    std::fs::metadata(path)
        .map(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// Where `name` is: the bin dir, else the extra bin dir; `None` when
/// neither holds it as an executable file.
pub fn find_binary(name: &str) -> Option<PathBuf> {
    std::iter::once(bin_dir())
        .chain(extra_bin_dir())
        .map(|dir| dir.join(name))
        .find(|path| is_executable(path))
}

/// The path of a real binary, e.g. `binary("etcd-3.4.23")`, from the bin
/// dir (or the extra bin dir). Fails the test (never skips it) when the
/// binary is absent.
pub fn binary(name: &str) -> PathBuf {
    find_binary(name).unwrap_or_else(|| {
        panic!(
            "{} is missing or not executable: the e2e tests run real etcd binaries; \
             run `images/fetch-etcd.sh` (it fills {}), or point $ETCD_BIN_DIR at a dir \
             holding etcd-<version> files (releases it cannot fetch: $ETCD_EXTRA_BIN_DIR)",
            bin_dir().join(name).display(),
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join(".cache/etcd/bin")
                .display()
        )
    })
}

/// A bin dir in `dir` holding links to every binary of `releases`, from
/// the bin dir and the extra one: etcd-migrate takes one `--bin-dir`, and
/// releases missing from it are not bundled.
// Only the `releases` target (e2e/releases.rs) uses it.
#[allow(dead_code)]
pub fn linked_bin_dir(releases: &[&str], dir: &Path) -> PathBuf {
    let bin = dir.join("bin");
    std::fs::create_dir(&bin).unwrap_or_else(|err| panic!("mkdir {}: {err}", bin.display()));
    for version in releases {
        for tool in ["etcd", "etcdctl", "etcdutl"] {
            let name = format!("{tool}-{version}");
            if let Some(path) = find_binary(&name) {
                symlink(&path, &bin.join(&name));
            }
        }
    }
    bin
}

/// The etcd binaries of `releases` that neither bin dir holds: a test that
/// needs them says NOT RUN, naming them, instead of passing.
// Only the `releases` target (e2e/releases.rs) uses it.
#[allow(dead_code)]
pub fn missing_releases(releases: &[&str]) -> Vec<String> {
    releases
        .iter()
        .map(|v| format!("etcd-{v}"))
        .filter(|name| find_binary(name).is_none())
        .collect()
}

/// A test of the `releases` target: `test` runs when every release of
/// `needs` is there; otherwise the trial is listed as ignored after a NOT
/// RUN line on stderr (`module: NOT RUN: <name>: needs …`), never passed.
// Only the `releases` target (e2e/releases.rs) uses it.
#[allow(dead_code)]
pub fn release_trial(
    module: &str,
    name: &'static str,
    test: fn(),
    needs: &[&str],
) -> libtest_mimic::Trial {
    let missing = missing_releases(needs);
    if !missing.is_empty() {
        let mut stderr = std::io::stderr().lock();
        let _ = std::io::Write::write_fmt(
            &mut stderr,
            format_args!(
                "{module}: NOT RUN: {name}: needs {} (no registry has them): set ETCD_EXTRA_BIN_DIR to a dir holding them\n",
                missing.join(", ")
            ),
        );
    }
    libtest_mimic::Trial::test(name, move || {
        test();
        Ok(())
    })
    .with_ignored_flag(!missing.is_empty())
}

/// Every release the suite runs, from the default list of
/// `images/fetch-etcd.sh`.
pub const SUITE_RELEASES: [&str; 4] = ["3.3.25", "3.4.23", "3.5.1", "3.5.16"];

/// Fails the test unless every release of [`SUITE_RELEASES`] is in the
/// bin dir, so a run without binaries says how to fetch them instead of
/// failing on an exit code.
pub fn require_suite_binaries() {
    for version in SUITE_RELEASES {
        etcd_binary(version);
    }
}

/// The real `etcd-<version>`.
pub fn etcd_binary(version: &str) -> PathBuf {
    binary(&format!("etcd-{version}"))
}

/// The identity of the single member that owns a data dir. The fixture
/// etcd, every intermediate etcd the migrator starts, and the final etcd
/// must all use the same name and peer URL: etcd records both in the data.
#[derive(Debug, Clone)]
pub struct Member {
    /// `--name`.
    pub name: String,
    /// The port of `http://localhost:<peer_port>`, the migrator's default
    /// peer URL.
    pub peer_port: u16,
}

impl Member {
    /// A member with a fresh peer port, named after the test.
    pub fn new(tag: &str) -> Self {
        Member {
            name: format!("e2e-{tag}"),
            peer_port: free_port(),
        }
    }

    /// `http://localhost:<peer_port>`.
    pub fn peer_url(&self) -> String {
        format!("http://localhost:{}", self.peer_port)
    }

    /// `<name>=<peer_url>`.
    pub fn initial_cluster(&self) -> String {
        format!("{}={}", self.name, self.peer_url())
    }

    /// The etcd arguments of exec mode (after `--`): the target serves
    /// this member on `user_url` for clients and on its peer URL.
    pub fn exec_args(&self, user_url: &str) -> Vec<String> {
        [
            "--name",
            &self.name,
            "--listen-client-urls",
            user_url,
            "--advertise-client-urls",
            user_url,
            "--listen-peer-urls",
            &self.peer_url(),
            "--initial-advertise-peer-urls",
            &self.peer_url(),
            "--initial-cluster",
            &self.initial_cluster(),
        ]
        .iter()
        .map(|arg| arg.to_string())
        .collect()
    }
}

/// Runs `future` to completion on a fresh current-thread runtime.
pub fn block_on<F: Future>(future: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap_or_else(|err| panic!("cannot build a tokio runtime: {err}"))
        .block_on(future)
}

/// Polls `check` until it returns `Some`, or panics after `timeout` naming
/// `what`.
pub fn wait_until<T>(what: &str, timeout: Duration, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = check() {
            return value;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        std::thread::sleep(POLL_INTERVAL);
    }
}

/// A fresh temp dir for one test; its data dir goes in a subdir so etcd
/// logs and fake bin dirs can sit beside it without being fingerprinted.
pub fn temp_dir(tag: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(&format!("etcd-migrate-e2e-{tag}-"))
        .tempdir()
        .unwrap_or_else(|err| panic!("cannot create a temp dir: {err}"))
}

/// The content of `<dir>/version.txt`.
pub fn read_version_txt(dir: &Path) -> String {
    let path = dir.join("version.txt");
    std::fs::read_to_string(&path).unwrap_or_else(|err| panic!("read {}: {err}", path.display()))
}

/// Writes `<dir>/version.txt` as the Kubernetes image did (no newline).
pub fn write_version_txt(dir: &Path, content: &str) {
    let path = dir.join("version.txt");
    std::fs::write(&path, content).unwrap_or_else(|err| panic!("write {}: {err}", path.display()));
}

/// The permission bits of `path`.
pub fn mode(path: &Path) -> u32 {
    std::fs::metadata(path)
        .unwrap_or_else(|err| panic!("stat {}: {err}", path.display()))
        .permissions()
        .mode()
        & 0o7777
}

/// Sets the permission bits of `path`.
pub fn set_mode(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .unwrap_or_else(|err| panic!("chmod {:o} {}: {err}", mode, path.display()));
}

/// Installs `content` as an executable file at `path` through a separate
/// `install` process. Writing it from this multi-threaded test process
/// would risk ETXTBSY: a child forked by another test between our open and
/// its exec holds our write fd, and exec'ing a file open for writing fails.
pub fn install_script(path: &Path, content: &str) {
    let mut source = tempfile::NamedTempFile::new()
        .unwrap_or_else(|err| panic!("create a temp file for {}: {err}", path.display()));
    std::io::Write::write_all(&mut source, content.as_bytes())
        .unwrap_or_else(|err| panic!("write {}: {err}", source.path().display()));
    install_program(source.path(), path);
}

/// Copies the program `source` to `path` (mode 0755) through a separate
/// `install` process, for the reason [`install_script`] gives.
pub fn install_program(source: &Path, path: &Path) {
    let status = std::process::Command::new("install")
        .arg("-m")
        .arg("0755")
        .arg(source)
        .arg(path)
        .status()
        .unwrap_or_else(|err| panic!("run install: {err}"));
    assert!(
        status.success(),
        "install {} {} failed: {status}",
        source.display(),
        path.display()
    );
}

/// Links `link` to `target`.
pub fn symlink(target: &Path, link: &Path) {
    std::os::unix::fs::symlink(target, link)
        .unwrap_or_else(|err| panic!("symlink {} -> {}: {err}", link.display(), target.display()));
}

/// Every pid in /proc at the time of the listing (some may be gone by
/// the time the caller reads them).
pub fn pids() -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse().ok())
        .collect()
}

/// What `/proc/<pid>/stat` says of a process (or of one thread, read from
/// `/proc/<pid>/task/<tid>/stat`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcStat {
    /// The state letter (`R`, `S`, `Z`, …).
    pub state: char,
    /// The parent's pid.
    pub ppid: i32,
    /// The kernel's `PF_*` flags.
    pub flags: u64,
    /// When it started, in clock ticks since boot: with the pid, names
    /// one process even after the pid is reused (pid_max may be 32768).
    pub start: u64,
}

/// `PF_EXITING`: the process has begun to exit.
const PF_EXITING: u64 = 0x4;

/// `PF_KTHREAD`: a kernel thread (its command line is always empty).
const PF_KTHREAD: u64 = 0x0020_0000;

impl ProcStat {
    /// Whether this thread still runs (neither a zombie nor dead). For a
    /// whole process, see [`is_running`].
    pub fn is_live(&self) -> bool {
        self.state != 'Z' && self.state != 'X'
    }
}

/// The state, parent, flags and start of `pid`, or `None` once it is gone.
pub fn proc_stat(pid: i32) -> Option<ProcStat> {
    parse_stat(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// Parses one `stat` file of proc(5).
fn parse_stat(stat: &str) -> Option<ProcStat> {
    // `pid (comm) state ppid …`: the command name may itself hold spaces
    // or parentheses, so the fields are counted from its last `)`.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    // Fields 3, 4, 9 and 22 of proc(5), counted from 1 at the pid.
    let state = fields.first()?.chars().next()?;
    let ppid = fields.get(1)?.parse().ok()?;
    let flags = fields.get(6)?.parse().ok()?;
    let start = fields.get(19)?.parse().ok()?;
    Some(ProcStat {
        state,
        ppid,
        flags,
        start,
    })
}

/// Whether any thread of `pid` still runs. The main thread alone does not
/// tell: it can be a zombie, or have dropped its memory (its command line
/// then reads empty), while other threads, or the main thread itself in
/// the middle of its exit, still hold the process's files: its listening
/// sockets, its WAL lock. (Measured here: after SIGTERM to etcd 3.5.16 with
/// two CPU burners running, its client port was still bound after the main
/// thread's command line had gone empty, or it showed as a zombie, in 13
/// of 20 stops.) A process is gone once none of its threads is live.
pub fn is_running(pid: i32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    tasks.flatten().any(|task| {
        std::fs::read_to_string(task.path().join("stat"))
            .ok()
            .and_then(|stat| parse_stat(&stat))
            .is_some_and(|stat| stat.is_live())
    })
}

/// The command line of `pid` (arguments joined by spaces): the main
/// thread's, else that of any thread that still has the process's memory;
/// `None` once none has.
fn command_line(pid: i32) -> Option<String> {
    let read = |path: PathBuf| {
        std::fs::read(path)
            .ok()
            .filter(|raw| !raw.is_empty())
            .map(|raw| {
                String::from_utf8_lossy(&raw)
                    .replace('\0', " ")
                    .trim_end()
                    .to_string()
            })
    };
    let proc_dir = PathBuf::from(format!("/proc/{pid}"));
    read(proc_dir.join("cmdline")).or_else(|| {
        std::fs::read_dir(proc_dir.join("task"))
            .ok()?
            .flatten()
            .find_map(|task| read(task.path().join("cmdline")))
    })
}

/// Live processes (some thread not a zombie; not this process) whose
/// command line mentions `needle`, e.g. a test's unique data dir: the etcd
/// and etcdctl a killed etcd-migrate left behind, if any. Each as (pid,
/// command line). An orphan (its parent is init, where the orphans of a
/// killed run go, or this process) in the middle of its exit whose command
/// line can no longer be read is listed too: it may be one of those, still
/// holding their ports and locks, and it will be gone in a moment. (Where a
/// subreaper adopts orphans instead, such a process is missed here; the
/// crash tests also wait for the run's ports.)
pub fn processes_mentioning(needle: &str) -> Vec<(i32, String)> {
    let own = std::process::id() as i32;
    let mut found = Vec::new();
    for pid in pids() {
        // The process may be gone by now: skip what cannot be read.
        let Some(stat) = proc_stat(pid) else {
            continue;
        };
        if pid == own || stat.flags & PF_KTHREAD != 0 {
            continue;
        }
        let (mentions, cmdline) = match command_line(pid) {
            Some(cmdline) => (cmdline.contains(needle), cmdline),
            None => (
                stat.flags & PF_EXITING != 0 && (stat.ppid == 1 || stat.ppid == own),
                "(an orphan exiting; its command line is gone)".to_string(),
            ),
        };
        if mentions && is_running(pid) {
            found.push((pid, cmdline));
        }
    }
    found
}

/// Waits until no live process mentions `dir` on its command line; panics
/// listing them after `timeout`.
pub fn wait_for_no_process_on(dir: &Path, timeout: Duration) {
    let needle = dir.display().to_string();
    let deadline = Instant::now() + timeout;
    loop {
        let left = processes_mentioning(&needle);
        if left.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "processes on {needle} still run {timeout:?} after etcd-migrate died: {left:#?}"
        );
        std::thread::sleep(POLL_INTERVAL);
    }
}

/// Copies `from` to `to` with `cp -a`: the same content under new inodes,
/// as a volume move or an operator's copy makes.
pub fn copy_dir(from: &Path, to: &Path) {
    let status = std::process::Command::new("cp")
        .arg("-a")
        .arg(from)
        .arg(to)
        .status()
        .unwrap_or_else(|err| panic!("run cp: {err}"));
    assert!(
        status.success(),
        "cp -a {} {}: {status}",
        from.display(),
        to.display()
    );
}

/// The names of the entries of `dir`, sorted.
pub fn dir_names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap_or_else(|err| panic!("list {}: {err}", dir.display()))
        .map(|entry| {
            entry
                .unwrap_or_else(|err| panic!("list {}: {err}", dir.display()))
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    names.sort();
    names
}
