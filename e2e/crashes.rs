//! Crash at every point: etcd-migrate SIGKILLed at every pass of every
//! named failpoint of four migrations (the 3.3 → 3.5 walk, etcd2 → etcd3
//! storage migration, 3.5 → 3.3 rollbacks, etcd3 → etcd2), killed again
//! while its rerun recovers, killed alone (its step etcd must follow it),
//! and killed with its whole process tree at random moments; every rerun
//! must converge to the target with the fixture's keyspace, no scratch or
//! temp file, no half backup and no process left behind.
//!
//! Each scenario's fixture is written once by real etcd and copied
//! (`cp -a`) for every run. The failpoints a run meets are learnt from a
//! traced clean run (`ETCD_MIGRATE_FAILPOINT_TRACE=1`), never from a list,
//! so a new failpoint is covered as soon as the code passes it; the count
//! of names that killed a run is then checked against
//! `etcd_migrate::failpoint::ALL`.

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::process::{Child, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime};

use nix::sys::signal::{kill, killpg, Signal};
use nix::unistd::Pid;

use crate::harness::etcd::{die_with_parent, kill_and_reap, reap_within};
use crate::harness::fixture::{self, FixtureSpec, LEASE_TTL_SECS};
use crate::harness::keyspace::read_back;
use crate::harness::keyspace::{is_health_key, Keyspace};
use crate::harness::migrator::{Migration, Mode, Outcome};
use crate::harness::v2::{self, V2Fixture};
use crate::harness::{
    copy_dir, dir_names, is_running, pids, proc_stat, read_version_txt, require_suite_binaries,
    temp_dir, wait_for_no_process_on, wait_until, Member, MIGRATE_TIMEOUT, VERSION_TEMP, WORK_DIR,
};

/// The releases every scenario may use.
const BUNDLE: &str = "3.3.25,3.4.23,3.5.16";

/// How long a killed run's etcd and tools may outlive it (they get SIGTERM
/// from the parent-death signal and stop in milliseconds; the margin is
/// for a loaded machine).
const ORPHANS_GONE_TIMEOUT: Duration = Duration::from_secs(30);

/// Leases granted 3,600 s before must show more than this left.
const MIN_REMAINING_TTL: i64 = 3000;

/// A backup being written (published by renaming it without the prefix).
const BACKUP_TEMP_PREFIX: &str = ".tmp-";

/// The four migrations, each one test thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// 3.3.25/etcd3 → 3.5.16/etcd3: two minor upgrades.
    Walk,
    /// 3.3.25/etcd2 → 3.5.16/etcd3: the storage migration at 3.3.25,
    /// then two upgrades.
    Storage,
    /// 3.5.16/etcd3 → 3.3.25/etcd3: two minor rollbacks, the backup first.
    Rollbacks,
    /// 3.3.25/etcd3 → 3.3.25/etcd2: the rollback to a v2 store.
    ToEtcd2,
}

impl Kind {
    const ALL: [Kind; 4] = [Kind::Walk, Kind::Storage, Kind::Rollbacks, Kind::ToEtcd2];

    fn tag(self) -> &'static str {
        match self {
            Kind::Walk => "walk",
            Kind::Storage => "storage",
            Kind::Rollbacks => "rollbacks",
            Kind::ToEtcd2 => "to-etcd2",
        }
    }

    /// The pair the run ends at.
    fn target(self) -> &'static str {
        match self {
            Kind::Walk | Kind::Storage => "3.5.16/etcd3",
            Kind::Rollbacks => "3.3.25/etcd3",
            Kind::ToEtcd2 => "3.3.25/etcd2",
        }
    }

    /// Every pair version.txt may hold on the way (a torn or invented one
    /// is a bug wherever the run died).
    fn path(self) -> &'static [&'static str] {
        match self {
            Kind::Walk => &["3.3.25/etcd3", "3.4.23/etcd3", "3.5.16/etcd3"],
            Kind::Storage => &[
                "3.3.25/etcd2",
                "3.3.25/etcd3",
                "3.4.23/etcd3",
                "3.5.16/etcd3",
            ],
            Kind::Rollbacks => &["3.5.16/etcd3", "3.4.23/etcd3", "3.3.25/etcd3"],
            Kind::ToEtcd2 => &["3.3.25/etcd3", "3.3.25/etcd2"],
        }
    }
}

/// What the fixture held, to compare the converged data with.
enum Original {
    /// A v3 keyspace as the fixture's etcd served it.
    V3(Keyspace),
    /// A v2 store as written through the v2 API.
    V2(V2Fixture),
}

/// One scenario: its fixture (built once) and its numbered runs.
struct Scenario {
    kind: Kind,
    root: tempfile::TempDir,
    member: Member,
    fixture: PathBuf,
    original: Original,
    runs: AtomicUsize,
}

impl Scenario {
    /// Writes the scenario's fixture with real etcd: a few hundred keys,
    /// some rewritten, some on leases (v3) or with TTLs (v2).
    fn build(kind: Kind, prefix: &str) -> Scenario {
        require_suite_binaries();
        let tag = format!("{prefix}-{}", kind.tag());
        let root = temp_dir(&tag);
        let member = Member::new(&tag);
        let logs = root.path().join("fixture");
        let data = logs.join("data");
        std::fs::create_dir(&logs).unwrap_or_else(|err| panic!("mkdir {}: {err}", logs.display()));
        let original = match kind {
            Kind::Walk => Original::V3(
                fixture::build(
                    FixtureSpec::full("3.3.25").with_rewrites(20),
                    &data,
                    &member,
                    &logs,
                )
                .keyspace,
            ),
            Kind::Storage => {
                // TTLs far beyond the test's length: no key may expire on
                // its own while the runs go on.
                let batches = v2::kubernetes_like(200, &[900, 1800, 3000], 20);
                Original::V2(v2::build("3.3.25", &data, &member, &logs, &batches))
            }
            Kind::Rollbacks => Original::V3(
                fixture::build(
                    FixtureSpec::full("3.5.16").with_rewrites(20),
                    &data,
                    &member,
                    &logs,
                )
                .keyspace,
            ),
            Kind::ToEtcd2 => Original::V3(
                fixture::build(
                    FixtureSpec::full("3.3.25")
                        .text_only()
                        .with_extra_keys(&[("compact_rev_key", "42")]),
                    &data,
                    &member,
                    &logs,
                )
                .keyspace,
            ),
        };
        Scenario {
            kind,
            root,
            member,
            fixture: data,
            original,
            runs: AtomicUsize::new(0),
        }
    }

    /// A fresh copy of the fixture in `<root>/run-<n>/data`; its backups
    /// go to `<root>/run-<n>/data.backup`.
    fn fresh_run(&self) -> RunDir {
        let n = self.runs.fetch_add(1, Ordering::Relaxed);
        let dir = self.root.path().join(format!("run-{n}"));
        std::fs::create_dir(&dir).unwrap_or_else(|err| panic!("mkdir {}: {err}", dir.display()));
        let data = dir.join("data");
        copy_dir(&self.fixture, &data);
        let (version, storage) = self
            .kind
            .target()
            .split_once('/')
            .unwrap_or_else(|| panic!("bad target {}", self.kind.target()));
        let mut migration = Migration::new(version, &data, &self.member).bundled(BUNDLE);
        if storage == "etcd2" {
            migration = migration.arg("--target-storage").arg("etcd2");
        }
        RunDir {
            tag: format!("{} run-{n}", self.kind.tag()),
            dir,
            data,
            migration,
            launches: AtomicUsize::new(0),
        }
    }

    /// Reruns `run` without failpoints and asserts it converged.
    fn rerun_converges(&self, run: &RunDir, context: &str) -> Outcome {
        let outcome = run.launch(Mode::NoExec, &[], false).wait(MIGRATE_TIMEOUT);
        self.assert_converged(run, &outcome, context);
        outcome
    }

    /// Asserts `outcome` (of a run without failpoints) converged: exit 0,
    /// the target recorded, nothing but `member` and `version.txt` in the
    /// data dir, every backup complete and none half-written, no process
    /// left on the data, and the fixture's keyspace served by the target.
    fn assert_converged(&self, run: &RunDir, outcome: &Outcome, context: &str) {
        let context = format!("{} ({context})", run.tag);
        assert_eq!(
            outcome.code(),
            Some(0),
            "{context}: the rerun should converge\n{}",
            outcome.explain()
        );
        assert_eq!(
            read_version_txt(&run.data),
            self.kind.target(),
            "{context}: version.txt in {}\n{}",
            run.data.display(),
            outcome.explain()
        );
        assert_eq!(
            dir_names(&run.data),
            ["member", "version.txt"],
            "{context}: stray entries in {} (scratch dir {WORK_DIR}, temp file {VERSION_TEMP}?)\n{}",
            run.data.display(),
            outcome.explain()
        );
        let backups = run.dir.join("data.backup");
        if backups.exists() {
            for name in dir_names(&backups) {
                let backup = backups.join(&name);
                assert!(
                    !name.starts_with(BACKUP_TEMP_PREFIX),
                    "{context}: half-written backup {} left",
                    backup.display()
                );
                assert!(
                    backup.join("member").is_dir(),
                    "{context}: published backup {} has no member dir",
                    backup.display()
                );
                let held = read_version_txt(&backup);
                assert!(
                    name.ends_with(&format!("-{}", held.replace('/', "-"))),
                    "{context}: backup {} holds {held}, which its name does not say",
                    backup.display()
                );
            }
        }
        wait_for_no_process_on(&run.data, ORPHANS_GONE_TIMEOUT);
        with_context(&format!("{context}: the converged keyspace"), || {
            self.assert_keyspace(run)
        });
    }

    /// Reads the converged data back with the target release and compares
    /// it with the fixture: values, leases (v3) or TTLs (v2), revisions
    /// where the step keeps them.
    fn assert_keyspace(&self, run: &RunDir) {
        let (member, data, logs) = (&self.member, &run.data, &run.dir);
        match (&self.original, self.kind) {
            (Original::V3(before), Kind::Walk | Kind::Rollbacks) => {
                let version = if self.kind == Kind::Walk {
                    "3.5.16"
                } else {
                    "3.3.25"
                };
                let after =
                    read_back(version, member, data, logs).without_health_leftovers(&run.tag);
                after.assert_kept(before, MIN_REMAINING_TTL);
                after.assert_revisions_kept(before);
            }
            (Original::V3(before), Kind::ToEtcd2) => {
                let after = v2::read_back_v2("3.3.25", member, data, logs);
                v2::assert_v2_copy(&after, before, LEASE_TTL_SECS);
                let left: Vec<&String> = after
                    .leaves
                    .iter()
                    .filter(|(path, node)| {
                        is_health_key(path.as_bytes()) && node.expiration.is_none()
                    })
                    .map(|(path, _)| path)
                    .collect();
                assert!(left.is_empty(), "health keys left without a TTL: {left:?}");
            }
            (Original::V2(written), Kind::Storage) => {
                let (v3, read_at, v2_after) = v2::read_back_migrated("3.5.16", member, data, logs);
                let v3 = v3.without_health_leftovers(&run.tag);
                v3.assert_no_health_key();
                v2::assert_migrated(&v3, written, read_at, &BTreeSet::new(), false);
                v2_after.assert_empty();
            }
            _ => unreachable!("scenario {:?} has the other kind of fixture", self.kind),
        }
    }
}

/// One copy of the fixture and the runs on it.
struct RunDir {
    tag: String,
    dir: PathBuf,
    data: PathBuf,
    migration: Migration,
    launches: AtomicUsize,
}

impl RunDir {
    /// Starts etcd-migrate on this copy in `mode`, with `env` added to the
    /// harness's clean environment, in a process group of its own if
    /// `own_group`. Its output goes to files in the run dir.
    fn launch(&self, mode: Mode, env: &[(&str, &str)], own_group: bool) -> Launched {
        let n = self.launches.fetch_add(1, Ordering::Relaxed);
        let out = self.dir.join(format!("launch-{n}.stdout"));
        let err = self.dir.join(format!("launch-{n}.stderr"));
        let create = |path: &Path| {
            std::fs::File::create(path).unwrap_or_else(|e| panic!("create {}: {e}", path.display()))
        };
        let mut command = self.migration.clone().mode(mode).command();
        command
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(create(&out))
            .stderr(create(&err));
        if own_group {
            command.process_group(0);
        }
        die_with_parent(&mut command);
        let child = command
            .spawn()
            .unwrap_or_else(|e| panic!("{}: spawn etcd-migrate: {e}", self.tag));
        Launched {
            child: Some(child),
            out,
            err,
        }
    }

    /// Removes the run's files once it has passed (each copy holds a
    /// 64 MB WAL).
    fn remove(self) {
        std::fs::remove_dir_all(&self.dir)
            .unwrap_or_else(|err| panic!("remove {}: {err}", self.dir.display()));
    }
}

/// A started etcd-migrate, killed on drop.
struct Launched {
    child: Option<Child>,
    out: PathBuf,
    err: PathBuf,
}

impl Launched {
    fn pid(&self) -> i32 {
        self.child.as_ref().map_or(0, |child| child.id() as i32)
    }

    fn try_status(&mut self) -> Option<ExitStatus> {
        self.child
            .as_mut()
            .and_then(|child| child.try_wait().ok().flatten())
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(&self.err).unwrap_or_default()
    }

    /// Waits up to `timeout` for the exit; kills it and panics after that.
    fn wait(mut self, timeout: Duration) -> Outcome {
        let pid = self.pid();
        let Some(mut child) = self.child.take() else {
            panic!("etcd-migrate (pid {pid}) was already reaped");
        };
        let Some(status) = reap_within(&mut child, timeout) else {
            kill_and_reap(&mut child);
            panic!(
                "etcd-migrate (pid {pid}) did not finish within {timeout:?}; stderr:\n{}",
                self.stderr()
            );
        };
        Outcome {
            status,
            stdout: std::fs::read_to_string(&self.out).unwrap_or_default(),
            stderr: self.stderr(),
        }
    }
}

impl Drop for Launched {
    fn drop(&mut self) {
        if let Some(child) = self.child.as_mut() {
            kill_and_reap(child);
        }
    }
}

/// Runs `check`; if it panics, panics again saying `context` first (the
/// harness's assertions do not know which run they check).
fn with_context<T>(context: &str, check: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(check)) {
        Ok(value) => value,
        Err(cause) => {
            eprintln!("failed: {context}");
            resume_unwind(cause)
        }
    }
}

/// Runs `work` for every scenario kind on a thread of its own and returns
/// each result; panics naming every scenario that failed.
fn on_threads<T: Send>(work: impl Fn(Kind) -> T + Sync) -> Vec<T> {
    let work = &work;
    let results: Vec<(Kind, std::thread::Result<T>)> = std::thread::scope(|scope| {
        let handles: Vec<_> = Kind::ALL
            .iter()
            .map(|&kind| (kind, scope.spawn(move || work(kind))))
            .collect();
        handles
            .into_iter()
            .map(|(kind, handle)| (kind, handle.join()))
            .collect()
    });
    let failed: Vec<&str> = results
        .iter()
        .filter(|(_, result)| result.is_err())
        .map(|(kind, _)| kind.tag())
        .collect();
    assert!(
        failed.is_empty(),
        "scenarios failed (their panics are above): {failed:?}"
    );
    results
        .into_iter()
        .filter_map(|(_, result)| result.ok())
        .collect()
}

// ---- the whole tree killed at random moments ----

/// splitmix64: a seeded generator small enough to restate here, so a
/// failing sequence replays from its seed without a dependency.
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform enough in `0..n` for test choices.
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// Pids (zombies included) whose parent is in `parents`, from /proc.
fn children_of(parents: &BTreeSet<i32>) -> BTreeSet<i32> {
    pids()
        .into_iter()
        // Gone since the listing: no stat, skipped.
        .filter(|&pid| proc_stat(pid).is_some_and(|stat| parents.contains(&stat.ppid)))
        .collect()
}

/// SIGKILLs `root` and every descendant at once, as a container kill
/// does (its cgroup is frozen, then killed): the tree is stopped first,
/// top down, until no new descendant appears, then `root`'s process group
/// and every stopped pid get SIGKILL. etcd-migrate puts each child in a
/// group of its own, so the group kill alone would miss them. Returns
/// every process killed, as pid and start time.
fn kill_tree(root: i32) -> BTreeMap<i32, u64> {
    let mut tree = BTreeMap::new();
    let _ = kill(Pid::from_raw(root), Signal::SIGSTOP);
    if let Some(stat) = proc_stat(root) {
        tree.insert(root, stat.start);
    }
    loop {
        let known: BTreeSet<i32> = tree.keys().copied().collect();
        let new: Vec<i32> = children_of(&known).difference(&known).copied().collect();
        if new.is_empty() {
            break;
        }
        for pid in new {
            let _ = kill(Pid::from_raw(pid), Signal::SIGSTOP);
            // Gone already: nothing to kill or wait for.
            if let Some(stat) = proc_stat(pid) {
                tree.insert(pid, stat.start);
            }
        }
    }
    let _ = killpg(Pid::from_raw(root), Signal::SIGKILL);
    for pid in tree.keys() {
        let _ = kill(Pid::from_raw(*pid), Signal::SIGKILL);
    }
    tree
}

/// Waits until every process of `killed` (pid and start time, from
/// [`kill_tree`]) is gone or a zombie with no live thread, so a rerun never
/// meets one still holding a port or a lock; panics naming those left after
/// `timeout`. A pid now used by a process that started later counts as
/// gone.
fn wait_for_killed(killed: &BTreeMap<i32, u64>, timeout: Duration) {
    wait_until(
        &format!(
            "the {} killed processes {killed:?} to be gone",
            killed.len()
        ),
        timeout,
        || {
            killed
                .iter()
                .all(|(&pid, &start)| {
                    proc_stat(pid).is_none_or(|stat| stat.start != start || !is_running(pid))
                })
                .then_some(())
        },
    );
}

/// An env var parsed, or `default`.
fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    match std::env::var(name) {
        Ok(text) => text
            .parse()
            .unwrap_or_else(|_| panic!("${name}={text:?} does not parse")),
        Err(_) => default,
    }
}

#[test]
fn whole_tree_sigkilled_at_random_moments_always_converges() {
    let runs: usize = env_or("CRASH_RUNS", 20);
    let clock = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |since| since.as_nanos() as u64);
    let seed: u64 = env_or("CRASH_SEED", clock);
    eprintln!(
        "random crashes: {runs} runs, seed {seed} (replay: CRASH_SEED={seed} CRASH_RUNS={runs})"
    );
    let mut rng = SplitMix(seed);
    // Each run: a scenario and a moment, in thousandths of that
    // scenario's clean duration (measured below).
    let plan: Vec<(usize, Kind, u64)> = (0..runs)
        .map(|i| (i, Kind::ALL[rng.below(4) as usize], rng.below(1000)))
        .collect();

    let killed: Vec<usize> = on_threads(|kind| {
        let mine: Vec<(usize, u64)> = plan
            .iter()
            .filter(|(_, k, _)| *k == kind)
            .map(|(i, _, permille)| (*i, *permille))
            .collect();
        if mine.is_empty() {
            return 0;
        }
        let scenario = Scenario::build(kind, "random");
        let run = scenario.fresh_run();
        let started = Instant::now();
        let clean = run.launch(Mode::NoExec, &[], false).wait(MIGRATE_TIMEOUT);
        let clean_ms = started.elapsed().as_millis() as u64;
        scenario.assert_converged(&run, &clean, "clean run");
        run.remove();
        let mut killed = 0;
        for (i, permille) in mine {
            let delay = Duration::from_millis(clean_ms * permille / 1000);
            let run = scenario.fresh_run();
            let mut launched = run.launch(Mode::NoExec, &[], true);
            std::thread::sleep(delay);
            let finished_first = launched.try_status().is_some();
            let processes = if finished_first {
                BTreeMap::new()
            } else {
                kill_tree(launched.pid())
            };
            let outcome = launched.wait(MIGRATE_TIMEOUT);
            let by_kill = outcome.status.signal() == Some(Signal::SIGKILL as i32);
            if !by_kill {
                outcome.assert_code(0);
            }
            killed += usize::from(by_kill);
            wait_for_killed(&processes, ORPHANS_GONE_TIMEOUT);
            wait_for_no_process_on(&run.data, ORPHANS_GONE_TIMEOUT);
            run.migration.wait_for_ports_free(ORPHANS_GONE_TIMEOUT);
            let recorded = read_version_txt(&run.data);
            eprintln!(
                "run {i}: {} killed after {delay:?} of {clean_ms} ms: {}; version.txt {recorded}; its last line: {:?}",
                kind.tag(),
                if by_kill {
                    format!("{} processes SIGKILLed", processes.len())
                } else {
                    "it had finished".to_string()
                },
                outcome.our_lines().last()
            );
            assert!(
                kind.path().contains(&recorded.as_str()),
                "run {i} ({}): version.txt holds {recorded:?}, not a pair of the path",
                kind.tag()
            );
            scenario.rerun_converges(&run, &format!("run {i}, killed after {delay:?}"));
            run.remove();
        }
        killed
    });
    let killed: usize = killed.iter().sum();
    eprintln!("random crashes: {killed} of {runs} runs were killed mid-way (seed {seed})");
    // Moments are uniform over a clean run, so about two runs in three
    // die mid-way; none would mean the kills never landed.
    assert!(
        runs < 5 || killed > 0,
        "none of {runs} runs was killed before it finished (seed {seed})"
    );
}

// ---- failpoints ----

/// The tests that make etcd-migrate die at its named failpoints.
#[cfg(feature = "failpoints")]
mod points {
    use super::*;

    use crate::harness::free_port;
    use crate::harness::migrator::{field, is_ours};

    /// Makes etcd-migrate log every failpoint pass.
    const TRACE: (&str, &str) = ("ETCD_MIGRATE_FAILPOINT_TRACE", "1");

    /// Every failpoint pass a traced run logged, in order, as (name, k): the
    /// `k`th pass of `name`.
    fn passes(outcome: &Outcome) -> Vec<(String, usize)> {
        let mut seen: BTreeMap<String, usize> = BTreeMap::new();
        outcome
            .lines_with("failpoint")
            .iter()
            .filter_map(|line| field(line, "name"))
            .map(|name| {
                let k = seen.entry(name.to_string()).or_default();
                *k += 1;
                (name.to_string(), *k)
            })
            .collect()
    }

    impl Scenario {
        /// Kills a run of `run` at the `k`th pass of failpoint `name`, and
        /// asserts it died there, its children died with it, and version.txt
        /// names a pair of the path.
        fn kill_at(&self, run: &RunDir, name: &str, k: usize, mode: Mode) -> Outcome {
            let actions = if k == 1 {
                format!("{name}=return")
            } else {
                format!("{name}={}*off->return", k - 1)
            };
            let context = format!("{}: FAILPOINTS={actions}", run.tag);
            let outcome = run
                .launch(mode, &[("FAILPOINTS", &actions), TRACE], false)
                .wait(MIGRATE_TIMEOUT);
            assert_eq!(
                outcome.status.signal(),
                Some(Signal::SIGKILL as i32),
                "{context}: the run should SIGKILL itself at pass {k} of {name}\n{}",
                outcome.explain()
            );
            let kills = outcome.lines_with("failpoint: SIGKILL");
            let last = kills.last().and_then(|line| field(line, "name"));
            assert_eq!(
                last,
                Some(name),
                "{context}: the last failpoint line names where it died\n{}",
                outcome.explain()
            );
            let reached = passes(&outcome)
                .iter()
                .filter(|(pass, _)| pass == name)
                .count();
            assert_eq!(
                reached,
                k,
                "{context}: it died at pass {reached} of {name}, not {k}\n{}",
                outcome.explain()
            );
            wait_for_no_process_on(&run.data, ORPHANS_GONE_TIMEOUT);
            run.migration.wait_for_ports_free(ORPHANS_GONE_TIMEOUT);
            let recorded = read_version_txt(&run.data);
            assert!(
                self.kind.path().contains(&recorded.as_str()),
                "{context}: version.txt in {} holds {recorded:?}, not a pair of the path {:?}",
                run.data.display(),
                self.kind.path()
            );
            outcome
        }
    }

    /// How many of a rerun's first passes are each killed in turn, after a
    /// kill at a point of [`rerun_seeds`].
    const RERUN_KILLS: usize = 3;

    /// The points after which the rerun itself is killed, at its first
    /// [`RERUN_KILLS`] passes and at every pass a clean run never meets
    /// (every pass of these names is a seed): the swap
    /// (whose rerun finishes it and meets `recover-after-record`), a
    /// half-written backup, a version.txt temp file left behind.
    fn rerun_seeds(kind: Kind) -> &'static [&'static str] {
        match kind {
            Kind::Walk => &["version-txt-after-temp-write"],
            Kind::Storage => &["swap-after-exchange", "backup-before-publish"],
            Kind::Rollbacks => &["swap-after-exchange", "backup-after-first-file"],
            Kind::ToEtcd2 => &["swap-after-exchange", "version-txt-after-temp-write"],
        }
    }

    /// What one scenario exercised.
    struct Exercised {
        kind: Kind,
        /// Every name that killed a run.
        names: BTreeSet<String>,
        /// Passes of a clean run.
        passes: usize,
        /// Runs killed at a failpoint, reruns included.
        kills: usize,
        seconds: f64,
    }

    /// Kills the scenario at every pass of every failpoint a clean run
    /// meets, then kills reruns, then (walk) the passes only exec mode
    /// has; every rerun must converge.
    fn exercise(kind: Kind) -> Exercised {
        let started = Instant::now();
        let scenario = Scenario::build(kind, "crash");
        let mut names = BTreeSet::new();
        let mut kills = 0;

        let run = scenario.fresh_run();
        let clean = run
            .launch(Mode::NoExec, &[TRACE], false)
            .wait(MIGRATE_TIMEOUT);
        scenario.assert_converged(&run, &clean, "clean traced run");
        let all = passes(&clean);
        run.remove();
        assert!(
            !all.is_empty(),
            "{}: a clean run passes no failpoint",
            kind.tag()
        );

        for (name, k) in &all {
            let run = scenario.fresh_run();
            scenario.kill_at(&run, name, *k, Mode::NoExec);
            scenario.rerun_converges(&run, &format!("after a kill at pass {k} of {name}"));
            run.remove();
            names.insert(name.clone());
            kills += 1;
        }

        // Crash-safe recovery: kill the rerun too, at each of its first
        // passes, then rerun clean.
        for seed in rerun_seeds(kind) {
            let seeds: Vec<usize> = all
                .iter()
                .filter(|(name, _)| name == seed)
                .map(|(_, k)| *k)
                .collect();
            assert!(
                !seeds.is_empty(),
                "{}: a clean run never passes {seed}: {all:?}",
                kind.tag()
            );
            for k in seeds {
                let first = format!("a kill at pass {k} of {seed}");
                // The swap journal names the member dir by inode, so a
                // crashed dir cannot be copied: each rerun kill starts
                // from the fixture and dies at the seed again.
                let run = scenario.fresh_run();
                scenario.kill_at(&run, seed, k, Mode::NoExec);
                let traced = run
                    .launch(Mode::NoExec, &[TRACE], false)
                    .wait(MIGRATE_TIMEOUT);
                scenario.assert_converged(&run, &traced, &format!("traced rerun after {first}"));
                let rerun = passes(&traced);
                run.remove();
                if *seed == "swap-after-exchange" {
                    assert!(
                        rerun.iter().any(|(name, _)| name == "recover-after-record"),
                        "{}: the rerun after {first} should finish the swap: {rerun:?}\n{}",
                        kind.tag(),
                        traced.explain()
                    );
                }
                // Its first passes, and every pass of a point only a
                // recovery meets (`recover-after-record`): a double fault.
                let clean_names: BTreeSet<&String> = all.iter().map(|(name, _)| name).collect();
                let doubles: Vec<&(String, usize)> = rerun
                    .iter()
                    .enumerate()
                    .filter(|(i, (name, _))| *i < RERUN_KILLS || !clean_names.contains(name))
                    .map(|(_, pass)| pass)
                    .collect();
                for (name, j) in doubles {
                    let run = scenario.fresh_run();
                    scenario.kill_at(&run, seed, k, Mode::NoExec);
                    scenario.kill_at(&run, name, *j, Mode::NoExec);
                    scenario.rerun_converges(
                        &run,
                        &format!("after {first}, then at pass {j} of {name} in the rerun"),
                    );
                    run.remove();
                    names.insert(name.clone());
                    kills += 2;
                }
            }
        }

        if kind == Kind::Walk {
            let (exec_names, exec_kills) = exec_only_points(&scenario, &all);
            names.extend(exec_names);
            kills += exec_kills;
        }
        Exercised {
            kind,
            names,
            passes: all.len(),
            kills,
            seconds: started.elapsed().as_secs_f64(),
        }
    }

    /// The passes a traced exec-mode run meets that a `--no-exec` run
    /// (`no_exec`) does not: each is killed in exec mode, then a
    /// `--no-exec` rerun must converge.
    fn exec_only_points(
        scenario: &Scenario,
        no_exec: &[(String, usize)],
    ) -> (BTreeSet<String>, usize) {
        let user_url = format!("http://127.0.0.1:{}", free_port());
        let args = scenario.member.exec_args(&user_url);
        let run = scenario.fresh_run();
        let mut launched = run.launch(Mode::Exec(args.clone()), &[TRACE], false);
        let pid = launched.pid();
        let target = std::fs::canonicalize(crate::harness::etcd_binary("3.5.16"))
            .unwrap_or_else(|err| panic!("canonical etcd-3.5.16 path: {err}"));
        wait_until("etcd-migrate to exec etcd-3.5.16", MIGRATE_TIMEOUT, || {
            if let Some(status) = launched.try_status() {
                panic!(
                    "etcd-migrate (pid {pid}) exited with {status} instead of exec'ing; stderr:\n{}",
                    launched.stderr()
                );
            }
            let exe = std::fs::read_link(format!("/proc/{pid}/exe")).ok()?;
            (exe == target).then_some(())
        });
        kill(Pid::from_raw(pid), Signal::SIGTERM)
            .unwrap_or_else(|err| panic!("kill -TERM {pid}: {err}"));
        let traced = launched.wait(MIGRATE_TIMEOUT);
        wait_for_no_process_on(&run.data, ORPHANS_GONE_TIMEOUT);
        run.remove();
        let extra: Vec<(String, usize)> = passes(&traced)
            .into_iter()
            .filter(|pass| !no_exec.contains(pass))
            .collect();
        eprintln!("walk: exec mode adds the passes {extra:?}");
        let mut names = BTreeSet::new();
        for (name, k) in &extra {
            let run = scenario.fresh_run();
            scenario.kill_at(&run, name, *k, Mode::Exec(args.clone()));
            scenario.rerun_converges(
                &run,
                &format!("--no-exec after an exec-mode kill at pass {k} of {name}"),
            );
            run.remove();
            names.insert(name.clone());
        }
        let kills = extra.len();
        (names, kills)
    }

    #[test]
    fn every_pass_of_every_failpoint_converges() {
        let started = Instant::now();
        // The cluster mode's points are e2e/cluster_roll.rs's: a holder of
        // a real cluster's lock dies at each of them (and must have died by
        // SIGKILL, there), and a pause job's joiner is held at its own; the
        // restore's are e2e/restores.rs's; these scenarios run one member.
        let defined: BTreeSet<String> = etcd_migrate::failpoint::ALL
            .iter()
            .filter(|name| {
                !name.starts_with("cluster-")
                    && !name.starts_with("pause-")
                    && !name.starts_with("restore-")
            })
            .map(|name| name.to_string())
            .collect();
        let exercised = on_threads(exercise);
        let mut union = BTreeSet::new();
        for scenario in &exercised {
            eprintln!(
                "{}: {} points, {} passes in a clean run, {} runs killed, {:.1} s",
                scenario.kind.tag(),
                scenario.names.len(),
                scenario.passes,
                scenario.kills,
                scenario.seconds
            );
            union.extend(scenario.names.iter().cloned());
        }
        eprintln!(
            "failpoints exercised: {} / {} defined ({:.1} s)",
            union.len(),
            defined.len(),
            started.elapsed().as_secs_f64()
        );
        let never: Vec<&String> = defined.difference(&union).collect();
        let unknown: Vec<&String> = union.difference(&defined).collect();
        assert!(
            never.is_empty() && unknown.is_empty(),
            "failpoints no run died at: {never:?}; failpoints not in failpoint::ALL: {unknown:?}"
        );
    }

    #[test]
    fn sigkill_of_the_entrypoint_alone_takes_its_step_etcd_down() {
        let scenario = Scenario::build(Kind::Walk, "alone");
        let run = scenario.fresh_run();
        // Held once its first step's etcd has taken the health write, so
        // the kill finds that etcd running.
        let mut launched = run.launch(
            Mode::NoExec,
            &[("FAILPOINTS", "step-after-health-write=sleep(30000)")],
            false,
        );
        let migrator = launched.pid();
        let started = wait_until("a step's etcd to start", MIGRATE_TIMEOUT, || {
            if let Some(status) = launched.try_status() {
                panic!(
                    "etcd-migrate (pid {migrator}) exited with {status} before a step's etcd started; stderr:\n{}",
                    launched.stderr()
                );
            }
            let stderr = launched.stderr();
            let line = stderr.lines().find(|line| is_ours(line, "etcd started"))?;
            Some(line.to_string())
        });
        let etcd: i32 = field(&started, "pid")
            .and_then(|pid| pid.parse().ok())
            .unwrap_or_else(|| panic!("no pid in {started:?}"));
        assert!(
            crate::harness::is_running(etcd),
            "the step's etcd (pid {etcd}) should still run: {started}"
        );

        // Only etcd-migrate's pid, not its group (the etcd has its own).
        let killed = Instant::now();
        kill(Pid::from_raw(migrator), Signal::SIGKILL)
            .unwrap_or_else(|err| panic!("kill -KILL {migrator}: {err}"));
        let outcome = launched.wait(MIGRATE_TIMEOUT);
        assert_eq!(
            outcome.status.signal(),
            Some(Signal::SIGKILL as i32),
            "{}",
            outcome.explain()
        );
        wait_until(
            &format!("the step's etcd (pid {etcd}) to die with etcd-migrate (pid {migrator})"),
            ORPHANS_GONE_TIMEOUT,
            || (!crate::harness::is_running(etcd)).then_some(()),
        );
        eprintln!(
            "etcd pid {etcd} was gone within {:?} of the kill of etcd-migrate pid {migrator}",
            killed.elapsed()
        );
        // At once: the data dir's lock and etcd's WAL lock must be free.
        scenario.rerun_converges(&run, "rerun right after the entrypoint alone was killed");
    }
}
