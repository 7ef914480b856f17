//! This module owns carrying out a plan: the baseline fingerprint read by
//! the recorded release before the first step; then, per step, the check
//! that the step's release can hold what the data holds, the backup before
//! the first step that rewrites the data, the step itself (each kind in
//! its own file under `steps`), and its record in `version.txt`, after
//! which a rebuilding step's scratch dir is removed. It talks to the
//! outside only through the traits of `effects` and `swap::Disk`, so a
//! test can make step N fail in each way and check what was recorded.

use std::time::Instant;

use nix::sys::signal::Signal;
use tokio::sync::watch;
use tracing::Instrument;

use crate::baseline::PendingBaseline;
use crate::keyspace::Fingerprint;
use crate::log;
use crate::plan::{Plan, Step};
use crate::steps::in_place::run_in_place;
use crate::steps::minor_downgrade::minor_downgrade;
use crate::steps::minor_rollback::minor_rollback;
use crate::steps::storage_migration::storage_migration;
use crate::steps::to_etcd2::rollback_to_etcd2;
use crate::steps::{Context, Failure};
use crate::version::{Version, VersionPair};

pub use crate::effects::{EtcdApi, HealthError, Launcher, Progress, RunningEtcd, StepError, Tools};
pub use crate::steps::{StepSettings, HEALTH_POLL_INTERVAL, WORK_TIMEOUT};
pub use crate::swap::Disk;

/// Why the plan stopped.
#[derive(Debug, thiserror::Error)]
pub enum ExecuteError {
    /// A step failed; earlier steps are recorded.
    #[error("step {index}/{total} ({step}) failed; the data dir is as the last completed step left it (version.txt: {recorded}); fix the cause and rerun: etcd-migrate resumes from there")]
    Step {
        /// 1-based.
        index: usize,
        /// Steps in the plan.
        total: usize,
        /// The step.
        step: Step,
        /// What version.txt says now.
        recorded: VersionPair,
        /// What went wrong (boxed: it carries etcd's output).
        #[source]
        source: Box<StepError>,
    },
    /// The recorded release could not serve the data before the first step.
    #[error("etcd {version} could not serve the data as version.txt records it ({recorded}) before the first step; no step ran; fix the cause and rerun (if etcd's output below shows damaged data, such as a crc mismatch or a short db file, restore the data dir from a backup or an etcd snapshot first)")]
    Baseline {
        /// The release that was to read it.
        version: Version,
        /// What version.txt says.
        recorded: VersionPair,
        /// What went wrong.
        #[source]
        source: Box<StepError>,
    },
    /// A termination signal arrived.
    #[error("stopped by {signal}{}; version.txt: {recorded} (the interrupted step was not recorded; a rerun resumes from there)", .during.as_ref().map(|s| format!(" during step {s}")).unwrap_or_default())]
    Interrupted {
        /// The signal.
        signal: Signal,
        /// The step under way, if any.
        during: Option<String>,
        /// What version.txt says now.
        recorded: VersionPair,
    },
}

/// Runs a plan's steps through the given effects.
pub struct Executor<'a, L, A, T, D, P> {
    /// Starts etcd.
    pub launcher: &'a L,
    /// Talks to its API: proves it healthy, reads and writes keys.
    pub api: &'a A,
    /// Runs offline tools.
    pub tools: &'a T,
    /// Backs up, and does the rebuilding steps' scratch and swap work.
    pub disk: &'a D,
    /// Records progress.
    pub progress: &'a mut P,
    /// Shared step settings.
    pub settings: StepSettings<'a>,
    /// Becomes `Some(signal)` when we are told to stop.
    pub termination: watch::Receiver<Option<Signal>>,
    /// The baseline taken offline from the stopped data (`baseline`), used
    /// instead of a start of the recorded release: maybe still being
    /// hashed, in which case the first step (in place) starts its etcd and
    /// waits for it before its first write.
    pub offline_baseline: Option<PendingBaseline>,
}

/// The step under way: where it is in the plan, and what version.txt says.
struct Position {
    index: usize,
    total: usize,
    step: Step,
    label: String,
    recorded: VersionPair,
}

impl Position {
    /// The step failed with `source`.
    fn failed(&self, source: StepError) -> ExecuteError {
        ExecuteError::Step {
            index: self.index,
            total: self.total,
            step: self.step,
            recorded: self.recorded,
            source: Box::new(source),
        }
    }

    /// A stop signal came; `during` names what it interrupted.
    fn interrupted(&self, signal: Signal, during: Option<String>) -> ExecuteError {
        ExecuteError::Interrupted {
            signal,
            during,
            recorded: self.recorded,
        }
    }
}

impl<L: Launcher, A: EtcdApi, T: Tools, D: Disk, P: Progress> Executor<'_, L, A, T, D, P> {
    /// Runs every step in order, recording each as it completes.
    pub async fn execute(&mut self, plan: &Plan) -> Result<(), ExecuteError> {
        let total = plan.steps.len();
        let mut recorded = plan.current;
        // The keyspace as the last completed step left it; each step must
        // hand on the same. The rebuilding steps read their source first,
        // so without a baseline reader the first of them sets it.
        let mut pending = None;
        let mut before = match (
            plan.baseline,
            plan.steps.first(),
            self.offline_baseline.take(),
        ) {
            (Some(_), Some(first), Some(offline)) if runs_in_place(first) => {
                // The same point as a baseline read by a start: nothing run
                // on the data yet (its hash may still be being walked).
                crate::failpoint!("baseline-read");
                pending = Some(offline);
                None
            }
            (Some(version), Some(first), Some(offline)) => {
                let taken = match offline.wait().await {
                    Ok(taken) => taken,
                    Err(why) => {
                        self.offline_lost(version, &why);
                        self.baseline(version, first, plan.current, plan.baseline_by_hash())
                            .await?
                    }
                };
                crate::failpoint!("baseline-read");
                Some(taken)
            }
            (Some(version), Some(first), None) => Some(
                self.baseline(version, first, plan.current, plan.baseline_by_hash())
                    .await?,
            ),
            _ => None,
        };
        for (i, step) in plan.steps.iter().enumerate() {
            let at = Position {
                index: i + 1,
                total,
                step: *step,
                label: format!("{}/{total}", i + 1),
                recorded,
            };
            self.stop_if_signalled(&at)?;
            check_v2_side(&at, before.as_ref())?;
            // The plan decided which step the backup precedes (if any).
            if plan.backup == Some(i) {
                self.back_up(&at)?;
            }
            before = Some(match pending.take() {
                Some(offline) => self.run_first_with(&at, offline, plan).await?,
                None => self.run_and_record(&at, before.as_ref(), None).await?,
            });
            recorded = step.result();
        }
        Ok(())
    }

    /// The effects and settings the steps work with.
    fn context(&self) -> Context<'_, L, A, T, D> {
        Context {
            launcher: self.launcher,
            api: self.api,
            tools: self.tools,
            disk: self.disk,
            settings: self.settings.clone(),
            termination: self.termination.clone(),
        }
    }

    /// Fails if a stop signal has come.
    fn stop_if_signalled(&self, at: &Position) -> Result<(), ExecuteError> {
        match *self.termination.borrow() {
            Some(signal) => Err(at.interrupted(signal, None)),
            None => Ok(()),
        }
    }

    /// Takes the backup before the step `at`.
    fn back_up(&self, at: &Position) -> Result<(), ExecuteError> {
        match self.context().back_up(at.recorded) {
            Ok(()) => {}
            Err(Failure::Interrupted(signal)) => {
                let during = format!("{} ({}), in the backup before it", at.label, at.step);
                return Err(at.interrupted(signal, Some(during)));
            }
            Err(Failure::Step(err)) => return Err(at.failed(err)),
        }
        // A signal that came as the copy finished: no etcd starts.
        self.stop_if_signalled(at)
    }

    /// Runs the first step, an in-place one, with its baseline `offline`
    /// (which its etcd waits for before its first write). A baseline that
    /// could not be finished offline is read by a start instead, after that
    /// etcd stopped, and the step runs again.
    async fn run_first_with(
        &mut self,
        at: &Position,
        offline: PendingBaseline,
        plan: &Plan,
    ) -> Result<Fingerprint, ExecuteError> {
        let run = self.run_and_record(at, None, Some(offline)).await;
        let why = match &run {
            Err(ExecuteError::Step { source, .. }) => source.offline_baseline_lost(),
            _ => None,
        };
        let Some(why) = why.map(str::to_string) else {
            return run;
        };
        let recorded = at.recorded.version;
        self.offline_lost(recorded, &why);
        let before = self
            .baseline(recorded, &at.step, at.recorded, plan.baseline_by_hash())
            .await?;
        self.run_and_record(at, Some(&before), None).await
    }

    /// Says that the offline baseline could not be taken, and what is done
    /// instead.
    fn offline_lost(&self, recorded: Version, why: &str) {
        log::warn(
            "the baseline could not be taken offline; it is read by a start of the recorded release",
            &[
                ("version", recorded.to_string().into()),
                ("why", why.into()),
            ],
        );
    }

    /// Runs the step `at` and records it; returns the fingerprint of its
    /// result. `offline`: its baseline, still being taken (an in-place
    /// step only).
    async fn run_and_record(
        &mut self,
        at: &Position,
        before: Option<&Fingerprint>,
        offline: Option<PendingBaseline>,
    ) -> Result<Fingerprint, ExecuteError> {
        let (step, label) = (&at.step, &at.label);
        let started = Instant::now();
        log::info(
            "step start",
            &[
                ("step", label.clone().into()),
                ("kind", step.kind().into()),
                ("from", step.before().to_string().into()),
                ("to", step.result().to_string().into()),
            ],
        );
        // One span per step: every line inside it (and in the step kinds)
        // carries `step=<label>` without passing the label around.
        let after = match self
            .run_step(step, before, offline)
            .instrument(log::step_span(label))
            .await
        {
            Ok(after) => after,
            Err(Failure::Interrupted(signal)) => {
                return Err(at.interrupted(signal, Some(format!("{label} ({step})"))))
            }
            Err(Failure::Step(source)) => return Err(at.failed(source)),
        };
        crate::failpoint!("step-after-stop");
        let pair = step.result();
        self.progress
            .record(pair)
            .map_err(|source| at.failed(StepError::Record { pair, source }))?;
        crate::failpoint!("step-after-record");
        if step.builds_a_copy() {
            // Only now: until version.txt names the step, its scratch
            // dir (and swap journal) is what a restart recovers from.
            self.disk.finish(self.settings.data_dir);
        }
        log::info(
            "step done",
            &[
                ("step", label.clone().into()),
                ("recorded", pair.to_string().into()),
                ("fingerprint", after.to_string().into()),
                ("ms", log::ms(started.elapsed())),
            ],
        );
        Ok(after)
    }

    /// Runs one step of its kind; returns the fingerprint of its result,
    /// checked against `before` (the keyspace as the last step left it).
    async fn run_step(
        &self,
        step: &Step,
        before: Option<&Fingerprint>,
        offline: Option<PendingBaseline>,
    ) -> Result<Fingerprint, Failure> {
        let cx = self.context();
        match *step {
            Step::PatchUpgrade { .. } | Step::MinorUpgrade { .. } => {
                run_in_place(&cx, step.result(), before, offline).await
            }
            Step::StorageMigration { at } => storage_migration(&cx, at, before).await,
            Step::MinorRollback { serve, to, .. } => minor_rollback(&cx, serve, to, before).await,
            Step::MinorDowngrade { serve, to, .. } => minor_downgrade(&cx, serve, to, before).await,
            Step::RollbackToEtcd2 { serve, to, .. } => {
                rollback_to_etcd2(&cx, serve, to, before).await
            }
        }
    }

    /// Serves the data with the release version.txt names and fingerprints
    /// it: what every step after must keep.
    ///
    /// If that release exits at start, a run that died during `first` has
    /// most likely run `first`'s newer release on the data already (3.4
    /// sets the cluster version to 3.4 once it leads, and 3.3 then refuses
    /// the data as a downgrade). That release then reads the baseline: it is
    /// the newest that may have touched the data, and `first` runs it again.
    async fn baseline(
        &self,
        version: Version,
        first: &Step,
        recorded: VersionPair,
        by_hash: bool,
    ) -> Result<Fingerprint, ExecuteError> {
        let first_try = self.read_baseline(version, recorded, by_hash).await;
        let source = match &first_try {
            Err(ExecuteError::Baseline { source, .. })
                if matches!(**source, StepError::ExitedEarly { .. }) && first.runs() != version =>
            {
                source
            }
            _ => return first_try,
        };
        let (error, said) = first_and_last_lines(&source.to_string());
        log::warn(
            "the recorded release cannot serve the data; an interrupted run has probably run the first step's release on it already",
            &[
                ("version", version.to_string().into()),
                ("error", error.into()),
                ("etcd_said", said.into()),
                ("baseline_by", first.runs().to_string().into()),
            ],
        );
        match self.read_baseline(first.runs(), recorded, by_hash).await {
            Err(ExecuteError::Baseline { source, .. }) => {
                // Neither can: the recorded release's own failure is what
                // the operator must fix; the second one is logged.
                let (error, said) = first_and_last_lines(&source.to_string());
                log::error(
                    "the first step's release cannot serve the data either",
                    &[
                        ("version", first.runs().to_string().into()),
                        ("error", error.into()),
                        ("etcd_said", said.into()),
                    ],
                );
                first_try
            }
            second_try => second_try,
        }
    }

    /// One baseline read: `version` serves the data as recorded (read by
    /// etcd's hash alone when `by_hash` and the release has one).
    async fn read_baseline(
        &self,
        version: Version,
        recorded: VersionPair,
        by_hash: bool,
    ) -> Result<Fingerprint, ExecuteError> {
        if let Some(signal) = *self.termination.borrow() {
            return Err(ExecuteError::Interrupted {
                signal,
                during: None,
                recorded,
            });
        }
        match self
            .context()
            .read_baseline(version, recorded.storage, by_hash)
            .instrument(log::step_span("baseline"))
            .await
        {
            Ok(fingerprint) => Ok(fingerprint),
            Err(Failure::Interrupted(signal)) => Err(ExecuteError::Interrupted {
                signal,
                during: Some(format!("the baseline read by etcd {version}")),
                recorded,
            }),
            Err(Failure::Step(source)) => Err(ExecuteError::Baseline {
                version,
                recorded,
                source: Box::new(source),
            }),
        }
    }
}

/// True for the steps that serve the data in place: the ones whose etcd
/// may start while their offline baseline is still being hashed.
fn runs_in_place(step: &Step) -> bool {
    matches!(step, Step::PatchUpgrade { .. } | Step::MinorUpgrade { .. })
}

/// Refuses the step `at` when the data's v2 store holds keys and the
/// step's release serves no v2 store.
fn check_v2_side(at: &Position, before: Option<&Fingerprint>) -> Result<(), ExecuteError> {
    let Some(side) = before.and_then(Fingerprint::v2_side) else {
        return Ok(());
    };
    if side.keys > 0 && !at.step.runs().has_v2_api() {
        return Err(at.failed(StepError::V2KeysUnsupported {
            version: at.step.runs(),
            last: at.recorded.version,
            keys: side.keys,
            sample: side.sample().to_vec(),
        }));
    }
    Ok(())
}

/// The first line of an error report and its last non-empty one (etcd's
/// last words), for a one-line log.
fn first_and_last_lines(text: &str) -> (String, String) {
    let first = text.lines().next().unwrap_or_default();
    let last = text.lines().rev().find(|l| !l.trim().is_empty());
    (first.to_string(), last.unwrap_or_default().to_string())
}

/// Runs `plan` to its end, on a current-thread runtime, over the effects
/// given and with the settings every executor test shares: member `m` on
/// client port 18629, data in `/data`, a destructive backup kept 3 deep
/// in `/data.backup`, exact TTL leases.
#[cfg(test)]
fn execute_with_test_settings<L: Launcher, A: EtcdApi, T: Tools, D: Disk, P: Progress>(
    launcher: &L,
    api: &A,
    tools: &T,
    disk: &D,
    progress: &mut P,
    termination: watch::Receiver<Option<Signal>>,
    plan: &Plan,
) -> Result<(), ExecuteError> {
    use crate::backup::{BackupMode, BackupPolicy};
    use crate::config::{Member, TtlLeases};
    use std::path::Path;
    use std::time::Duration;

    let member = Member {
        name: "m".to_string(),
        client_port: 18629,
        listen_peer_urls: "http://localhost:2380".to_string(),
        initial_advertise_peer_urls: "http://localhost:2380".to_string(),
        initial_cluster: "m=http://localhost:2380".to_string(),
        initial_cluster_token: "etcd-cluster".to_string(),
        extra_args: Vec::new(),
    };
    let backup = BackupPolicy {
        mode: BackupMode::Destructive,
        root: "/data.backup".into(),
        keep: 3,
    };
    let mut executor = Executor {
        offline_baseline: None,
        launcher,
        api,
        tools,
        disk,
        progress,
        settings: StepSettings {
            member: &member,
            data_dir: Path::new("/data"),
            health_timeout: Duration::from_millis(300),
            backup: &backup,
            ttl_leases: TtlLeases::Exact,
            ttl_keys_directory: "/registry/events",
            keep_v2_keys: false,
        },
        termination,
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("runtime");
    runtime.block_on(executor.execute(plan))
}

#[cfg(test)]
mod rebuild_tests;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backup::{BackupError, BackupPolicy, StopCheck};
    use crate::datadir::DataDirError;
    use crate::dialect::StepEtcd;
    use crate::effects::{Expected, LeasePlan};
    use crate::keyspace::{Entry, KnownLeases, Ours, Read};
    use crate::plan::{plan, Binary, Bundle};
    use crate::supervisor::{ExitStatus, SupervisorError};
    use crate::swap::SwapError;
    use crate::version::{Minor, Storage};
    use std::cell::RefCell;
    use std::collections::BTreeMap;
    use std::future::Future;
    use std::path::{Path, PathBuf};
    use std::rc::Rc;

    /// How the fake etcd of one step behaves.
    #[derive(Clone, Copy, Debug, PartialEq)]
    enum Behaviour {
        Healthy,
        WritesFailThenSucceed(u32),
        NeverHealthy,
        DiesAtStart,
        CannotLaunch,
        Alarmed,
        /// Healthy, but serves a keyspace with one key less.
        LosesAKey,
        /// Healthy, and its data's v2 store holds a key (flannel's).
        HoldsV2Keys,
        /// Takes the health write, but `/version` reports the step's
        /// versions only at the n-th ask after it (etcd raising its
        /// cluster version late).
        VersionsLag(u32),
    }

    /// What every fake etcd serves (one key fewer for `LosesAKey`).
    fn fake_keyspace(behaviour: Behaviour) -> Fingerprint {
        let keep = if behaviour == Behaviour::LosesAKey {
            1
        } else {
            2
        };
        let entries: Vec<crate::keyspace::Entry> = ["/registry/a", "/registry/b"]
            .iter()
            .take(keep)
            .map(|key| crate::keyspace::Entry {
                key: key.as_bytes().to_vec(),
                value: b"v".to_vec(),
                ttl: None,
                lease: 0,
            })
            .collect();
        let fingerprint = Fingerprint::of(Storage::Etcd3, &entries);
        if behaviour != Behaviour::HoldsV2Keys {
            return fingerprint;
        }
        let side = crate::keyspace::Entry {
            key: b"/coreos.com/network/config".to_vec(),
            value: b"{}".to_vec(),
            ttl: None,
            lease: 0,
        };
        fingerprint.with_side(Some(Fingerprint::of(Storage::Etcd2, &[side])))
    }

    #[derive(Default)]
    struct Journal {
        events: Vec<String>,
    }

    /// Each release's behaviour (Healthy when not listed).
    type Behaviours = Rc<Vec<(Version, Behaviour)>>;

    fn behaviour_of(behaviours: &Behaviours, version: Version) -> Behaviour {
        behaviours
            .iter()
            .find(|(v, _)| *v == version)
            .map(|(_, b)| *b)
            .unwrap_or(Behaviour::Healthy)
    }

    struct FakeLauncher {
        behaviours: Behaviours,
        journal: Rc<RefCell<Journal>>,
    }

    struct FakeEtcd {
        version: Version,
        behaviour: Behaviour,
        journal: Rc<RefCell<Journal>>,
        stopped: bool,
    }

    struct FakeHealth {
        behaviours: Behaviours,
        journal: Rc<RefCell<Journal>>,
        attempts: RefCell<u32>,
        version_asks: RefCell<u32>,
    }

    /// Upgrades use no offline tool.
    struct NoTools;

    impl Tools for NoTools {
        async fn run(
            &self,
            binary: Binary,
            _args: &[String],
            _env: &[(&str, &str)],
        ) -> Result<(), StepError> {
            panic!("an upgrade ran {binary}")
        }
    }

    /// Upgrades do no disk work (and these walks take no backup).
    struct NoDisk;

    impl Disk for NoDisk {
        fn back_up(
            &self,
            _data_dir: &Path,
            _policy: &BackupPolicy,
            _pair: VersionPair,
            _stop: StopCheck<'_>,
        ) -> Result<PathBuf, BackupError> {
            panic!("an upgrade took a backup")
        }
        fn fresh_work_dir(&self, _data_dir: &Path) -> Result<PathBuf, SwapError> {
            panic!("an upgrade made a scratch dir")
        }
        fn create_dir(&self, _dir: &Path) -> Result<(), SwapError> {
            panic!("an upgrade made a scratch dir")
        }
        fn copy_dir(
            &self,
            _from: &Path,
            _to: &Path,
            _stop: StopCheck<'_>,
        ) -> Result<(), BackupError> {
            panic!("an upgrade copied the data")
        }
        fn swap(
            &self,
            _data_dir: &Path,
            _rebuilt: &Path,
            _pair: VersionPair,
        ) -> Result<(), SwapError> {
            panic!("an upgrade swapped the member dir")
        }
        fn finish(&self, _data_dir: &Path) {
            panic!("an upgrade finished a rebuild")
        }
    }

    struct FakeProgress {
        journal: Rc<RefCell<Journal>>,
        fail: bool,
    }

    impl Launcher for FakeLauncher {
        type Etcd = FakeEtcd;
        fn hidden_v2_paths(&self, _data_dir: &Path) -> Vec<String> {
            Vec::new()
        }
        fn launch(&self, spec: &StepEtcd<'_>) -> Result<FakeEtcd, StepError> {
            let behaviour = behaviour_of(&self.behaviours, spec.version);
            self.journal
                .borrow_mut()
                .events
                .push(format!("launch {}", spec.version));
            if behaviour == Behaviour::CannotLaunch {
                return Err(StepError::Launch {
                    version: spec.version,
                    source: SupervisorError::Spawn {
                        program: format!("etcd-{}", spec.version),
                        source: std::io::Error::from(std::io::ErrorKind::PermissionDenied),
                    },
                });
            }
            Ok(FakeEtcd {
                version: spec.version,
                behaviour,
                journal: Rc::clone(&self.journal),
                stopped: false,
            })
        }
        fn granted_leases(&self, data_dir: &Path) -> Result<Option<BTreeMap<i64, i64>>, String> {
            self.journal
                .borrow_mut()
                .events
                .push(format!("read leases {}", data_dir.display()));
            Ok(Some([(7, 3600)].into()))
        }
    }

    impl RunningEtcd for FakeEtcd {
        fn pid(&self) -> i32 {
            4242
        }
        fn wait(&mut self) -> impl Future<Output = ExitStatus> {
            let dies = self.behaviour == Behaviour::DiesAtStart || self.stopped;
            async move {
                if dies {
                    ExitStatus::Exited(2)
                } else {
                    std::future::pending().await
                }
            }
        }
        fn stop(&mut self) -> impl Future<Output = Result<(ExitStatus, bool), SupervisorError>> {
            self.stopped = true;
            self.journal
                .borrow_mut()
                .events
                .push(format!("stop {}", self.version));
            async { Ok((ExitStatus::Signaled(Signal::SIGTERM), false)) }
        }
        fn recent_output(&mut self) -> Vec<String> {
            vec![format!("panic: fake etcd {} failed", self.version)]
        }
        fn owns_listener(&self, _port: u16) -> Result<(), String> {
            Ok(())
        }
    }

    impl EtcdApi for FakeHealth {
        type Error = crate::effects::FakeError;

        fn write(
            &self,
            _endpoint: &str,
            _storage: Storage,
            expected: Expected,
        ) -> impl Future<Output = Result<(), HealthError>> {
            let behaviour = behaviour_of(&self.behaviours, expected.release);
            *self.attempts.borrow_mut() += 1;
            let attempts = *self.attempts.borrow();
            async move {
                match behaviour {
                    Behaviour::Healthy => Ok(()),
                    Behaviour::WritesFailThenSucceed(n) if attempts > n => Ok(()),
                    Behaviour::DiesAtStart => std::future::pending().await,
                    Behaviour::Alarmed => Err(HealthError::Refused {
                        reason: "alarm NOSPACE".to_string(),
                        remedy: "compact, defrag, disarm".to_string(),
                    }),
                    Behaviour::LosesAKey | Behaviour::HoldsV2Keys => Ok(()),
                    Behaviour::VersionsLag(_) => {
                        Err(HealthError::Written("cluster version 3.4".to_string()))
                    }
                    _ => Err(HealthError::NotYet("connection refused".to_string())),
                }
            }
        }

        fn versions(
            &self,
            _endpoint: &str,
            expected: Expected,
        ) -> impl Future<Output = Result<(), HealthError>> {
            let behaviour = behaviour_of(&self.behaviours, expected.release);
            *self.version_asks.borrow_mut() += 1;
            let asks = *self.version_asks.borrow();
            self.journal
                .borrow_mut()
                .events
                .push(format!("versions {}", expected.release));
            async move {
                match behaviour {
                    Behaviour::VersionsLag(n) if asks < n => {
                        Err(HealthError::NotYet("cluster version 3.4".to_string()))
                    }
                    _ => Ok(()),
                }
            }
        }

        fn fingerprint(
            &self,
            _endpoint: &str,
            _served: VersionPair,
            _hidden: &[String],
            known: &KnownLeases,
        ) -> impl Future<Output = Result<Fingerprint, crate::effects::FakeError>> {
            if !known.is_empty() {
                self.journal
                    .borrow_mut()
                    .events
                    .push(format!("fingerprint with {} known leases", known.len()));
            }
            // The etcd serving now is the one launched last.
            let serving = self
                .journal
                .borrow()
                .events
                .iter()
                .rev()
                .find_map(|e| e.strip_prefix("launch ").and_then(|v| v.parse().ok()));
            let behaviour = serving
                .map(|v| behaviour_of(&self.behaviours, v))
                .unwrap_or(Behaviour::Healthy);
            async move { Ok(fake_keyspace(behaviour)) }
        }

        async fn read_all(
            &self,
            _endpoint: &str,
            _served: VersionPair,
            _hidden: &[String],
            _known: &KnownLeases,
        ) -> Result<Read, crate::effects::FakeError> {
            panic!("an upgrade read the whole keyspace")
        }

        async fn read_v2(
            &self,
            _endpoint: &str,
            _hidden: &[String],
        ) -> Result<Option<Vec<Entry>>, crate::effects::FakeError> {
            panic!("an upgrade read the v2 store")
        }

        async fn write_all_v2(
            &self,
            _endpoint: &str,
            _entries: &[Entry],
        ) -> Result<(), crate::effects::FakeError> {
            panic!("an upgrade wrote v2 keys")
        }

        async fn enable_downgrade(
            &self,
            _endpoint: &str,
            _target: Minor,
        ) -> Result<(), crate::effects::FakeError> {
            panic!("an upgrade enabled a downgrade")
        }

        async fn downgraded(
            &self,
            _endpoint: &str,
            _target: Minor,
        ) -> Result<bool, crate::effects::FakeError> {
            panic!("an upgrade waited for a downgrade")
        }

        async fn finish_downgrade(&self, _endpoint: &str) -> Result<(), crate::effects::FakeError> {
            panic!("an upgrade ended a downgrade")
        }

        async fn compact_history(&self, _endpoint: &str) -> Result<i64, crate::effects::FakeError> {
            panic!("an upgrade compacted the history")
        }

        async fn delete_v2_tree(
            &self,
            _endpoint: &str,
            _hidden: &[String],
        ) -> Result<usize, crate::effects::FakeError> {
            panic!("an upgrade deleted v2 keys")
        }

        async fn apply_leases(
            &self,
            _endpoint: &str,
            _plan: &LeasePlan,
            _hidden: &[Entry],
        ) -> Result<KnownLeases, crate::effects::FakeError> {
            panic!("an upgrade attached leases")
        }

        fn ours(&self) -> Ours {
            Ours::default()
        }
    }

    impl Progress for FakeProgress {
        fn record(&mut self, pair: VersionPair) -> Result<(), DataDirError> {
            if self.fail {
                return Err(DataDirError::Io {
                    op: "fsync",
                    path: "/data/.version.txt.tmp".into(),
                    source: std::io::Error::from(std::io::ErrorKind::StorageFull),
                });
            }
            self.journal
                .borrow_mut()
                .events
                .push(format!("record {pair}"));
            Ok(())
        }
    }

    struct Outcome {
        result: Result<(), ExecuteError>,
        events: Vec<String>,
    }

    /// The text of the error under `err`: the step's own failure.
    fn source_text(err: &ExecuteError) -> String {
        std::error::Error::source(err)
            .map(ToString::to_string)
            .unwrap_or_default()
    }

    /// The walk 3.3.25 → 3.4.23 → 3.5.16 with `behaviours` for the steps'
    /// releases in order (the baseline's 3.3.25 is healthy).
    fn walk(behaviours: &[Behaviour], signal: Option<Signal>, record_fails: bool) -> Outcome {
        let versions = ["3.4.23", "3.5.16"].map(|s| s.parse::<Version>().expect("version"));
        let by_release = versions
            .iter()
            .copied()
            .zip(behaviours.iter().copied())
            .collect();
        walk_releases(by_release, signal, record_fails)
    }

    /// The walk with each release's behaviour given.
    fn walk_releases(
        behaviours: Vec<(Version, Behaviour)>,
        signal: Option<Signal>,
        record_fails: bool,
    ) -> Outcome {
        walk_between(
            &["3.3.25", "3.4.23", "3.5.16"],
            "3.3.25/etcd3",
            "3.5.16/etcd3",
            behaviours,
            signal,
            record_fails,
        )
    }

    /// The walk from `current` to `target` with `bundled` releases and
    /// each release's behaviour given.
    fn walk_between(
        bundled: &[&str],
        current: &str,
        target: &str,
        behaviours: Vec<(Version, Behaviour)>,
        signal: Option<Signal>,
        record_fails: bool,
    ) -> Outcome {
        let bundle = Bundle::new(bundled.iter().map(|s| s.parse().expect("version")));
        let plan = plan(
            current.parse().expect("pair"),
            target.parse().expect("pair"),
            &bundle,
        )
        .expect("plans");
        let journal = Rc::new(RefCell::new(Journal::default()));
        let behaviours: Behaviours = Rc::new(behaviours);
        let launcher = FakeLauncher {
            behaviours: Rc::clone(&behaviours),
            journal: Rc::clone(&journal),
        };
        let health = FakeHealth {
            behaviours,
            journal: Rc::clone(&journal),
            attempts: RefCell::new(0),
            version_asks: RefCell::new(0),
        };
        let mut progress = FakeProgress {
            journal: Rc::clone(&journal),
            fail: record_fails,
        };
        let (sender, termination) = watch::channel(signal);
        let result = execute_with_test_settings(
            &launcher,
            &health,
            &NoTools,
            &NoDisk,
            &mut progress,
            termination,
            &plan,
        );
        drop(sender);
        let events = journal.borrow().events.clone();
        Outcome { result, events }
    }

    #[test]
    fn healthy_steps_are_recorded_one_by_one() {
        let outcome = walk(
            &[Behaviour::Healthy, Behaviour::WritesFailThenSucceed(3)],
            None,
            false,
        );
        assert!(outcome.result.is_ok(), "{:?}", outcome.result);
        assert_eq!(
            outcome.events,
            [
                "launch 3.3.25",
                "stop 3.3.25",
                "launch 3.4.23",
                "stop 3.4.23",
                "record 3.4.23/etcd3",
                "launch 3.5.16",
                "stop 3.5.16",
                "record 3.5.16/etcd3"
            ]
        );
    }

    #[test]
    fn a_step_whose_versions_lag_writes_once_and_asks_only_versions_again() {
        // etcd may raise its cluster version seconds after it took the
        // health write (its version monitor missed the term's first
        // commit and waits for its 4 s timer): the wait asks `/version`
        // alone, and the step is recorded once it reports the release.
        let outcome = walk(
            &[Behaviour::VersionsLag(3), Behaviour::Healthy],
            None,
            false,
        );
        assert!(outcome.result.is_ok(), "{:?}", outcome.result);
        assert_eq!(
            outcome.events,
            [
                "launch 3.3.25",
                "stop 3.3.25",
                "launch 3.4.23",
                "versions 3.4.23",
                "versions 3.4.23",
                "versions 3.4.23",
                "stop 3.4.23",
                "record 3.4.23/etcd3",
                "launch 3.5.16",
                "stop 3.5.16",
                "record 3.5.16/etcd3"
            ]
        );
    }

    #[test]
    fn a_release_without_lease_time_to_live_reads_with_the_ttls_the_data_recorded() {
        // 3.0 cannot tell a lease's TTL: the data's own record of them is
        // read offline before 3.0 starts on it, and handed to every read
        // through that etcd; 3.1 is asked instead.
        let outcome = walk_between(
            &["3.0.17", "3.1.20"],
            "3.0.17/etcd3",
            "3.1.20/etcd3",
            Vec::new(),
            None,
            false,
        );
        assert!(outcome.result.is_ok(), "{:?}", outcome.result);
        assert_eq!(
            outcome.events,
            [
                "read leases /data",
                "launch 3.0.17",
                "fingerprint with 1 known leases",
                "stop 3.0.17",
                "launch 3.1.20",
                "stop 3.1.20",
                "record 3.1.20/etcd3"
            ]
        );
    }

    #[test]
    fn a_failure_on_step_2_leaves_step_1_recorded() {
        for behaviour in [
            Behaviour::NeverHealthy,
            Behaviour::DiesAtStart,
            Behaviour::CannotLaunch,
        ] {
            let outcome = walk(&[Behaviour::Healthy, behaviour], None, false);
            let err = outcome.result.expect_err("step 2 fails");
            let text = err.to_string();
            assert!(
                text.starts_with("step 2/2 (minor-upgrade 3.4.23/etcd3 -> 3.5.16/etcd3) failed"),
                "{text}"
            );
            assert!(text.contains("version.txt: 3.4.23/etcd3"), "{text}");
            assert!(
                !outcome.events.contains(&"record 3.5.16/etcd3".to_string()),
                "{behaviour:?}: {:?}",
                outcome.events
            );
            assert!(outcome.events.contains(&"record 3.4.23/etcd3".to_string()));
            if behaviour == Behaviour::NeverHealthy {
                assert_eq!(
                    outcome.events.last().map(String::as_str),
                    Some("stop 3.5.16"),
                    "the unhealthy etcd is stopped"
                );
            }
            let source = source_text(&err);
            match behaviour {
                Behaviour::NeverHealthy => assert!(
                    source.contains("did not accept a write within")
                        && source.contains("connection refused")
                        && source.contains("panic: fake etcd 3.5.16"),
                    "{source}"
                ),
                Behaviour::DiesAtStart => assert!(
                    source.contains("exited with exit code 2 before the step's work was done")
                        && source.contains("panic: fake etcd 3.5.16"),
                    "{source}"
                ),
                _ => assert!(source.contains("cannot start etcd 3.5.16"), "{source}"),
            }
        }
    }

    #[test]
    fn a_step_whose_keyspace_differs_is_not_recorded_and_shows_both_fingerprints() {
        let outcome = walk(&[Behaviour::Healthy, Behaviour::LosesAKey], None, false);
        let err = outcome.result.expect_err("step 2 loses a key");
        assert!(err.to_string().starts_with("step 2/2"), "{err}");
        assert!(
            err.to_string().contains("version.txt: 3.4.23/etcd3"),
            "{err}"
        );
        let source = source_text(&err);
        assert!(
            source.contains("etcd 3.5.16 serves after the step is not the one before it")
                && source.contains("before: v3 2 keys")
                && source.contains("after: v3 1 keys"),
            "{source}"
        );
        assert_eq!(
            outcome.events[outcome.events.len() - 2..],
            ["launch 3.5.16", "stop 3.5.16"],
            "the step's etcd is stopped and nothing recorded"
        );
        // The first step's own read is checked against the baseline too.
        let outcome = walk(&[Behaviour::LosesAKey], None, false);
        assert!(outcome.result.is_err());
        assert!(!outcome.events.iter().any(|e| e.starts_with("record")));
    }

    #[test]
    fn a_recorded_release_that_cannot_start_hands_the_baseline_to_the_first_steps() {
        let v = |s: &str| s.parse::<Version>().expect("version");
        let outcome = walk_releases(vec![(v("3.3.25"), Behaviour::DiesAtStart)], None, false);
        assert!(outcome.result.is_ok(), "{:?}", outcome.result);
        assert_eq!(
            outcome.events[..6],
            [
                "launch 3.3.25",
                "launch 3.4.23",
                "stop 3.4.23",
                "launch 3.4.23",
                "stop 3.4.23",
                "record 3.4.23/etcd3"
            ]
        );
        // When the first step's release cannot serve it either, the run
        // stops before any step, naming the baseline.
        let outcome = walk_releases(
            vec![
                (v("3.3.25"), Behaviour::DiesAtStart),
                (v("3.4.23"), Behaviour::DiesAtStart),
            ],
            None,
            false,
        );
        let err = outcome.result.expect_err("no baseline");
        assert!(
            err.to_string()
                .starts_with("etcd 3.3.25 could not serve the data as version.txt records it"),
            "the recorded release's failure is the one reported: {err}"
        );
        assert!(!outcome.events.iter().any(|e| e.starts_with("record")));
    }

    #[test]
    fn an_alarm_fails_the_step_at_once_with_the_remedy() {
        let outcome = walk(&[Behaviour::Alarmed], None, false);
        let err = outcome.result.expect_err("refused");
        let source = source_text(&err);
        assert!(
            source.contains("refuses writes: alarm NOSPACE")
                && source.contains("compact, defrag, disarm"),
            "{source}"
        );
        assert_eq!(
            outcome.events,
            [
                "launch 3.3.25",
                "stop 3.3.25",
                "launch 3.4.23",
                "stop 3.4.23"
            ]
        );
    }

    #[test]
    fn v2_keys_in_etcd3_data_refuse_the_step_to_a_release_without_a_v2_store() {
        let v = |s: &str| s.parse::<Version>().expect("version");
        let outcome = walk_between(
            &["3.5.30", "3.6.5"],
            "3.5.30/etcd3",
            "3.6.5/etcd3",
            vec![(v("3.5.30"), Behaviour::HoldsV2Keys)],
            None,
            false,
        );
        let err = outcome.result.expect_err("3.6 cannot hold v2 keys");
        let source = source_text(&err);
        assert!(
            source.contains("the data's v2 store holds 1 keys")
                && source.contains("/coreos.com/network/config")
                && source.contains("etcd 3.6.5 has no v2 store"),
            "{source}"
        );
        assert_eq!(
            outcome.events,
            ["launch 3.5.30", "stop 3.5.30"],
            "only the baseline ran; 3.6 never started on the data"
        );
    }

    #[test]
    fn a_failure_on_step_1_records_nothing() {
        let outcome = walk(&[Behaviour::NeverHealthy], None, false);
        assert!(outcome.result.is_err());
        assert_eq!(
            outcome.events,
            [
                "launch 3.3.25",
                "stop 3.3.25",
                "launch 3.4.23",
                "stop 3.4.23"
            ]
        );
    }

    #[test]
    fn a_stop_signal_stops_the_step_and_records_nothing_more() {
        let outcome = walk(&[Behaviour::NeverHealthy], Some(Signal::SIGTERM), false);
        // The signal was already pending before step 1: nothing starts.
        let err = outcome.result.expect_err("interrupted");
        assert!(
            matches!(
                err,
                ExecuteError::Interrupted {
                    signal: Signal::SIGTERM,
                    ..
                }
            ),
            "{err}"
        );
        assert!(outcome.events.is_empty(), "{:?}", outcome.events);
    }

    #[test]
    fn a_failed_record_fails_the_step() {
        let outcome = walk(&[Behaviour::Healthy], None, true);
        let err = outcome.result.expect_err("record fails");
        assert!(err.to_string().starts_with("step 1/2"), "{err}");
        let source = source_text(&err);
        assert!(
            source.contains("etcd 3.4.23 ran on the data but 3.4.23/etcd3 could not be recorded"),
            "{source}"
        );
    }
}
