//! This module owns the fake-driven failure tests of the rebuilding
//! steps: each effect a step
//! kind goes through is made to fail in turn, and the run must fail naming
//! its subject, stop every etcd it started, record nothing, and leave the
//! member dir unswapped (or, when only the record failed, leave the
//! scratch dir for the next start's recovery).

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use nix::sys::signal::Signal;
use tokio::sync::watch;

use super::{execute_with_test_settings, ExecuteError};
use crate::backup::{BackupError, BackupMode, BackupPolicy, StopCheck};
use crate::datadir::{DataDirError, WORK_DIR};
use crate::dialect::StepEtcd;
use crate::effects::{
    EtcdApi, Expected, HealthError, Launcher, LeasePlan, Progress, RunningEtcd, StepError, Tools,
};
use crate::keyspace::{Entry, Fingerprint, KnownLeases, Ours, Read};
use crate::plan::{backup_before, plan, Binary, Bundle};
use crate::supervisor::{ExitStatus, SupervisorError};
use crate::swap::{Disk, SwapError};
use crate::version::{Minor, Storage, VersionPair};

/// What the fakes did, in order, and the one effect that is to fail:
/// the `n`th event (1 unless the effect ends in `#n`) that starts with it.
struct World {
    events: RefCell<Vec<String>>,
    fail: Option<&'static str>,
    /// The index of the event that failed.
    failed_at: RefCell<Option<usize>>,
}

impl World {
    /// Logs `event`; fails if it is the effect to fail.
    fn did(&self, event: &str) -> Result<(), String> {
        self.events.borrow_mut().push(event.to_string());
        let Some(fail) = self.fail else {
            return Ok(());
        };
        let (prefix, nth) = match fail.split_once('#') {
            Some((prefix, nth)) => (prefix, nth.parse().expect("occurrence")),
            None => (fail, 1),
        };
        let events = self.events.borrow();
        let seen = events.iter().filter(|e| e.starts_with(prefix)).count();
        if event.starts_with(prefix) && seen == nth {
            *self.failed_at.borrow_mut() = Some(events.len() - 1);
            return Err(format!("injected failure of {event}"));
        }
        Ok(())
    }

    fn events(&self) -> Vec<String> {
        self.events.borrow().clone()
    }
}

/// The keyspace every fake etcd serves, in either storage.
fn entries() -> Vec<Entry> {
    ["/registry/a", "/registry/b"]
        .iter()
        .map(|key| Entry {
            key: key.as_bytes().to_vec(),
            value: b"v".to_vec(),
            ttl: None,
            lease: 0,
        })
        .collect()
}

struct Fakes(Rc<World>);

struct FakeEtcd {
    world: Rc<World>,
    version: String,
    stopped: bool,
}

impl Launcher for Fakes {
    type Etcd = FakeEtcd;

    fn launch(&self, spec: &StepEtcd<'_>) -> Result<FakeEtcd, StepError> {
        let event = format!("launch {} {}", spec.version, spec.data_dir);
        self.0.did(&event).map_err(|_| StepError::Launch {
            version: spec.version,
            source: SupervisorError::Spawn {
                program: format!("etcd-{}", spec.version),
                source: std::io::Error::from(std::io::ErrorKind::PermissionDenied),
            },
        })?;
        Ok(FakeEtcd {
            world: Rc::clone(&self.0),
            version: spec.version.to_string(),
            stopped: false,
        })
    }

    fn hidden_v2_paths(&self, _data_dir: &Path) -> Vec<String> {
        Vec::new()
    }

    fn granted_leases(&self, _data_dir: &Path) -> Result<Option<BTreeMap<i64, i64>>, String> {
        Ok(None)
    }
}

impl RunningEtcd for FakeEtcd {
    fn pid(&self) -> i32 {
        4242
    }

    async fn wait(&mut self) -> ExitStatus {
        if self.stopped {
            return ExitStatus::Signaled(Signal::SIGTERM);
        }
        std::future::pending().await
    }

    async fn stop(&mut self) -> Result<(ExitStatus, bool), SupervisorError> {
        self.stopped = true;
        let _ = self.world.did(&format!("stop {}", self.version));
        Ok((ExitStatus::Signaled(Signal::SIGTERM), false))
    }

    fn recent_output(&mut self) -> Vec<String> {
        vec![format!("fake etcd {} said goodbye", self.version)]
    }

    fn owns_listener(&self, _port: u16) -> Result<(), String> {
        Ok(())
    }
}

impl EtcdApi for Fakes {
    type Error = crate::effects::FakeError;

    async fn write(
        &self,
        endpoint: &str,
        _storage: Storage,
        _expected: Expected,
    ) -> Result<(), HealthError> {
        self.0
            .did(&format!("api write {endpoint}"))
            .map_err(|why| HealthError::Refused {
                reason: why,
                remedy: "fix it".to_string(),
            })
    }

    async fn versions(&self, _endpoint: &str, _expected: Expected) -> Result<(), HealthError> {
        Ok(())
    }

    async fn fingerprint(
        &self,
        endpoint: &str,
        served: VersionPair,
        _hidden: &[String],
        _known: &KnownLeases,
    ) -> Result<Fingerprint, crate::effects::FakeError> {
        self.0.did(&format!("api fingerprint {endpoint}"))?;
        Ok(Fingerprint::of(served.storage, &entries()))
    }

    async fn enable_downgrade(
        &self,
        endpoint: &str,
        target: Minor,
    ) -> Result<(), crate::effects::FakeError> {
        self.0
            .did(&format!("api enable_downgrade {endpoint} {target}"))?;
        Ok(())
    }

    async fn downgraded(
        &self,
        endpoint: &str,
        target: Minor,
    ) -> Result<bool, crate::effects::FakeError> {
        self.0.did(&format!("api downgraded {endpoint} {target}"))?;
        Ok(true)
    }

    async fn finish_downgrade(&self, endpoint: &str) -> Result<(), crate::effects::FakeError> {
        self.0.did(&format!("api finish_downgrade {endpoint}"))?;
        Ok(())
    }

    async fn compact_history(&self, endpoint: &str) -> Result<i64, crate::effects::FakeError> {
        self.0.did(&format!("api compact_history {endpoint}"))?;
        Ok(0)
    }

    async fn read_all(
        &self,
        endpoint: &str,
        served: VersionPair,
        _hidden: &[String],
        _known: &KnownLeases,
    ) -> Result<Read, crate::effects::FakeError> {
        let storage = served.storage;
        self.0.did(&format!("api read_all {endpoint} {storage}"))?;
        Ok(Read {
            entries: entries(),
            side: Vec::new(),
            fingerprint: Fingerprint::of(storage, &entries()),
        })
    }

    async fn read_v2(
        &self,
        endpoint: &str,
        _hidden: &[String],
    ) -> Result<Option<Vec<Entry>>, crate::effects::FakeError> {
        self.0.did(&format!("api read_v2 {endpoint}"))?;
        Ok(Some(Vec::new()))
    }

    async fn write_all_v2(
        &self,
        endpoint: &str,
        entries: &[Entry],
    ) -> Result<(), crate::effects::FakeError> {
        Ok(self.0.did(&format!(
            "api write_all_v2 {endpoint} {} keys",
            entries.len()
        ))?)
    }

    async fn delete_v2_tree(
        &self,
        endpoint: &str,
        _hidden: &[String],
    ) -> Result<usize, crate::effects::FakeError> {
        self.0.did(&format!("api delete_v2_tree {endpoint}"))?;
        Ok(2)
    }

    async fn apply_leases(
        &self,
        endpoint: &str,
        _plan: &LeasePlan,
        _hidden: &[Entry],
    ) -> Result<KnownLeases, crate::effects::FakeError> {
        self.0.did(&format!("api apply_leases {endpoint}"))?;
        Ok(KnownLeases::new())
    }

    fn ours(&self) -> Ours {
        Ours::default()
    }
}

impl Tools for Fakes {
    async fn run(
        &self,
        binary: Binary,
        args: &[String],
        _env: &[(&str, &str)],
    ) -> Result<(), StepError> {
        let event = format!("tool {binary} {}", args.join(" "));
        self.0.did(&event).map_err(|_| StepError::Tool {
            binary,
            args: args.join(" "),
            status: ExitStatus::Exited(1),
            output: "injected".to_string(),
        })
    }
}

impl Disk for Fakes {
    fn back_up(
        &self,
        data_dir: &Path,
        policy: &BackupPolicy,
        pair: VersionPair,
        _stop: StopCheck<'_>,
    ) -> Result<PathBuf, BackupError> {
        self.0
            .did(&format!("disk back_up {} {pair}", data_dir.display()))
            .map_err(|_| BackupError::Io {
                op: "write",
                path: policy.root.clone(),
                source: std::io::Error::from(std::io::ErrorKind::StorageFull),
            })?;
        Ok(policy.root.join("backup"))
    }

    fn fresh_work_dir(&self, data_dir: &Path) -> Result<PathBuf, SwapError> {
        let work = data_dir.join(WORK_DIR);
        self.0
            .did(&format!("disk fresh_work_dir {}", work.display()))
            .map_err(|_| io_failure("create", &work))?;
        Ok(work)
    }

    fn create_dir(&self, dir: &Path) -> Result<(), SwapError> {
        self.0
            .did(&format!("disk create_dir {}", dir.display()))
            .map_err(|_| io_failure("create", dir))
    }

    fn copy_dir(&self, from: &Path, to: &Path, _stop: StopCheck<'_>) -> Result<(), BackupError> {
        self.0
            .did(&format!(
                "disk copy_dir {} {}",
                from.display(),
                to.display()
            ))
            .map_err(|_| BackupError::Io {
                op: "copy",
                path: to.to_path_buf(),
                source: std::io::Error::from(std::io::ErrorKind::StorageFull),
            })
    }

    fn swap(&self, data_dir: &Path, rebuilt: &Path, pair: VersionPair) -> Result<(), SwapError> {
        self.0
            .did(&format!("disk swap {} {pair}", rebuilt.display()))
            .map_err(|_| SwapError::Exchange {
                current: data_dir.join("member"),
                new: rebuilt.join("member"),
                errno: nix::errno::Errno::EINVAL,
            })
    }

    fn finish(&self, data_dir: &Path) {
        let _ = self.0.did(&format!("disk finish {}", data_dir.display()));
    }
}

fn io_failure(op: &'static str, path: &Path) -> SwapError {
    SwapError::Io {
        op,
        path: path.to_path_buf(),
        source: std::io::Error::from(std::io::ErrorKind::StorageFull),
    }
}

impl Progress for Fakes {
    fn record(&mut self, pair: VersionPair) -> Result<(), DataDirError> {
        self.0
            .did(&format!("record {pair}"))
            .map_err(|_| DataDirError::Io {
                op: "fsync",
                path: "/data/.version.txt.tmp".into(),
                source: std::io::Error::from(std::io::ErrorKind::StorageFull),
            })
    }
}

struct Outcome {
    result: Result<(), ExecuteError>,
    events: Vec<String>,
    failed_at: Option<usize>,
}

impl Outcome {
    /// The error's text and its step's failure.
    fn error(&self) -> String {
        match &self.result {
            Ok(()) => panic!("the step succeeded: {:?}", self.events),
            Err(err) => {
                let source = std::error::Error::source(err)
                    .map(ToString::to_string)
                    .unwrap_or_default();
                format!("{err}\n{source}")
            }
        }
    }

    fn has(&self, prefix: &str) -> bool {
        self.events.iter().any(|e| e.starts_with(prefix))
    }

    /// Every etcd started was stopped (a launch that failed started none).
    fn all_stopped(&self) -> bool {
        let count = |p: &str| self.events.iter().filter(|e| e.starts_with(p)).count();
        let failed_launch = self
            .failed_at
            .is_some_and(|i| self.events[i].starts_with("launch "));
        count("launch ") - usize::from(failed_launch) == count("stop ")
    }
}

/// Runs the plan from `current` to `target` (one rebuilding step) with
/// `fail` failing.
fn migrate(current: &str, target: &str, fail: Option<&'static str>) -> Outcome {
    let bundle = Bundle::new(
        ["3.3.25", "3.4.23", "3.5.1", "3.5.16", "3.5.30", "3.6.14"]
            .map(|v| v.parse().expect("version")),
    );
    let mut plan = plan(
        current.parse().expect("pair"),
        target.parse().expect("pair"),
        &bundle,
    )
    .expect("plans");
    assert_eq!(plan.steps.len(), 1, "{:?}", plan.steps);
    plan.backup = backup_before(&plan.steps, BackupMode::Destructive);
    let world = Rc::new(World {
        events: RefCell::new(Vec::new()),
        fail,
        failed_at: RefCell::new(None),
    });
    let fakes = Fakes(Rc::clone(&world));
    let mut progress = Fakes(Rc::clone(&world));
    let (sender, termination) = watch::channel(None);
    let result = execute_with_test_settings(
        &fakes,
        &fakes,
        &fakes,
        &fakes,
        &mut progress,
        termination,
        &plan,
    );
    drop(sender);
    let failed_at = *world.failed_at.borrow();
    Outcome {
        result,
        events: world.events(),
        failed_at,
    }
}

/// Every effect of a step kind in order of use (the event names, up to the
/// first space after the effect), checked: the healthy run uses each; each
/// failure fails the step naming `subject` of the failing effect, stops
/// every etcd, and records nothing; failures before the swap leave the
/// member dir unswapped; a failed record leaves the scratch dir (and swap
/// journal) for the next start to finish.
fn check_every_failure(current: &str, target: &str, effects: &[(&'static str, &str)]) {
    let healthy = migrate(current, target, None);
    assert!(healthy.result.is_ok(), "{:?}", healthy.result);
    assert_eq!(
        healthy
            .events
            .iter()
            .filter(|e| e.starts_with("disk swap"))
            .count(),
        1,
        "{:?}",
        healthy.events
    );
    assert!(healthy.has(&format!("record {target}")));
    assert!(healthy.has("disk finish /data"), "{:?}", healthy.events);
    for (effect, subject) in effects {
        let outcome = migrate(current, target, Some(effect));
        let Some(failed_at) = outcome.failed_at else {
            panic!("{effect} is not used: {:?}", outcome.events)
        };
        let text = outcome.error();
        assert!(
            text.starts_with("step 1/1 (") && text.contains(&format!("version.txt: {current}")),
            "{effect}: {text}"
        );
        assert!(
            text.contains(subject),
            "{effect}: {subject:?} not in {text}"
        );
        assert!(outcome.all_stopped(), "{effect}: {:?}", outcome.events);
        assert!(
            !outcome.has("disk finish"),
            "{effect}: {:?}",
            outcome.events
        );
        if *effect == "record" {
            assert!(outcome.has("disk swap"), "{:?}", outcome.events);
            continue;
        }
        assert!(!outcome.has("record"), "{effect}: {:?}", outcome.events);
        // The failing effect is the last: nothing after it but stops.
        let after: Vec<&String> = outcome.events[failed_at + 1..]
            .iter()
            .filter(|e| !e.starts_with("stop "))
            .collect();
        assert!(after.is_empty(), "{effect}: then {after:?}");
    }
}

#[test]
fn every_effect_of_a_storage_migration_can_fail_it_without_a_swap() {
    let work = "/data/.etcd-migrate.work";
    check_every_failure(
        "3.4.23/etcd2",
        "3.4.23/etcd3",
        &[
            ("disk back_up", "cannot back up the data dir"),
            ("disk fresh_work_dir", work),
            ("launch 3.4.23 /data", "cannot start etcd 3.4.23"),
            ("api write", "refuses writes"),
            ("api read_all", "read the keyspace"),
            ("disk create_dir", "/converted"),
            ("disk copy_dir", "copy the data for conversion"),
            ("tool etcdctl-3.4.23 migrate", "migrate --data-dir"),
            (
                "launch 3.4.23 /data/.etcd-migrate.work/converted",
                "cannot start etcd 3.4.23",
            ),
            ("api write#2", "refuses writes"),
            ("api apply_leases", "attach leases to TTL keys"),
            ("api read_all#2", "read the v3 keyspace"),
            ("api delete_v2_tree", "remove the migrated keys"),
            ("api read_v2", "read what the v2 store holds now"),
            ("disk swap", "nothing was swapped"),
            ("record", "3.4.23/etcd3 could not be recorded"),
        ],
    );
}

#[test]
fn every_effect_of_a_minor_rollback_can_fail_it_without_a_swap() {
    check_every_failure(
        "3.5.16/etcd3",
        "3.4.23/etcd3",
        &[
            ("disk back_up", "cannot back up the data dir"),
            ("disk fresh_work_dir", "/data/.etcd-migrate.work"),
            ("launch 3.5.16", "cannot start etcd 3.5.16"),
            ("api write", "refuses writes"),
            ("api fingerprint", "fingerprint the keyspace"),
            ("tool etcdctl-3.5.16 snapshot save", "snapshot save"),
            ("tool etcdctl-3.4.23 snapshot restore", "snapshot restore"),
            ("launch 3.4.23", "cannot start etcd 3.4.23"),
            ("api write#2", "refuses writes"),
            ("api fingerprint#2", "fingerprint the keyspace"),
            ("disk swap", "nothing was swapped"),
            ("record", "3.4.23/etcd3 could not be recorded"),
        ],
    );
}

/// etcd's downgrade works on the data in place (no copy, no swap): every
/// effect of the step fails it unrecorded, with every etcd stopped and
/// nothing after the failure.
#[test]
fn every_effect_of_a_downgrade_can_fail_it_unrecorded() {
    let (current, target) = ("3.6.14/etcd3", "3.5.30/etcd3");
    let healthy = migrate(current, target, None);
    assert!(healthy.result.is_ok(), "{:?}", healthy.result);
    assert!(healthy.has(&format!("record {target}")));
    assert!(!healthy.has("disk swap"), "{:?}", healthy.events);
    // A failed look at the versions is looked again (until the deadline).
    let looked_again = migrate(current, target, Some("api downgraded"));
    assert!(looked_again.result.is_ok(), "{:?}", looked_again.events);
    for (effect, subject) in [
        ("disk back_up", "cannot back up the data dir"),
        ("launch 3.6.14 /data", "cannot start etcd 3.6.14"),
        ("api write", "refuses writes"),
        ("api fingerprint", "fingerprint the keyspace"),
        ("api enable_downgrade", "enable etcd's downgrade to 3.5"),
        ("launch 3.5.30 /data", "cannot start etcd 3.5.30"),
        ("api write#2", "refuses writes"),
        ("api fingerprint#2", "fingerprint the keyspace"),
        ("api finish_downgrade", "end etcd's downgrade job"),
        ("record", "3.5.30/etcd3 could not be recorded"),
    ] {
        let outcome = migrate(current, target, Some(effect));
        let Some(failed_at) = outcome.failed_at else {
            panic!("{effect} is not used: {:?}", outcome.events)
        };
        let text = outcome.error();
        assert!(
            text.starts_with("step 1/1 (minor-downgrade 3.6.14/etcd3 -> 3.5.30/etcd3)")
                && text.contains(&format!("version.txt: {current}")),
            "{effect}: {text}"
        );
        assert!(
            text.contains(subject),
            "{effect}: {subject:?} not in {text}"
        );
        assert!(outcome.all_stopped(), "{effect}: {:?}", outcome.events);
        if effect == "record" {
            continue;
        }
        assert!(!outcome.has("record"), "{effect}: {:?}", outcome.events);
        let after: Vec<&String> = outcome.events[failed_at + 1..]
            .iter()
            .filter(|e| !e.starts_with("stop "))
            .collect();
        assert!(after.is_empty(), "{effect}: then {after:?}");
    }
}

#[test]
fn every_effect_of_a_rollback_to_etcd2_can_fail_it_without_a_swap() {
    check_every_failure(
        "3.3.25/etcd3",
        "3.3.25/etcd2",
        &[
            ("disk back_up", "cannot back up the data dir"),
            ("disk fresh_work_dir", "/data/.etcd-migrate.work"),
            ("disk create_dir", "/v2"),
            ("launch 3.3.25 /data", "cannot start etcd 3.3.25"),
            ("api write", "refuses writes"),
            ("api read_all", "read the keyspace"),
            (
                "launch 3.3.25 /data/.etcd-migrate.work/v2",
                "cannot start etcd 3.3.25",
            ),
            ("api write#2", "refuses writes"),
            ("api write_all_v2", "write the keys into the v2 store"),
            ("api read_all#2", "read the new v2 store back"),
            ("disk swap", "nothing was swapped"),
            ("record", "3.3.25/etcd2 could not be recorded"),
        ],
    );
}
