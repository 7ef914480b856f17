//! This module owns carrying out a plan: for each step, start its etcd,
//! wait until a write succeeds (or it dies, or the deadline passes, or we
//! are told to stop), stop it, and record the step in `version.txt`. It
//! talks to the outside only through the small traits below, so a test can
//! make step N fail in each way and check what was recorded.

use std::future::Future;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use tokio::sync::watch;

use crate::datadir::DataDirError;
use crate::dialect::StepEtcd;
use crate::log;
use crate::plan::{Plan, Step};
use crate::supervisor::{ExitStatus, SupervisorError};
use crate::version::{Storage, Version, VersionPair};

/// Pause between two health attempts. Tens of ms: a step's etcd is usually
/// writable 100–200 ms after start, and each attempt is a loopback call.
pub const HEALTH_POLL_INTERVAL: Duration = Duration::from_millis(15);

/// Starts a step's etcd.
pub trait Launcher {
    /// The running process.
    type Etcd: RunningEtcd;
    /// Starts etcd as `spec` says.
    fn launch(&self, spec: &StepEtcd<'_>) -> Result<Self::Etcd, StepError>;
}

/// A step's running etcd.
pub trait RunningEtcd {
    /// Its pid, for logs and errors.
    fn pid(&self) -> i32;
    /// Resolves when it has exited; callable again afterwards.
    fn wait(&mut self) -> impl Future<Output = ExitStatus>;
    /// SIGTERM, grace, SIGKILL, reap. Returns the status and whether
    /// SIGKILL was needed.
    fn stop(&mut self) -> impl Future<Output = Result<(ExitStatus, bool), SupervisorError>>;
    /// Its last lines of output, for error reports.
    fn recent_output(&mut self) -> Vec<String>;
}

/// Proves a step's etcd healthy with one write.
pub trait Health {
    /// Writes the health key once; `Err` carries why it failed.
    fn write(
        &self,
        endpoint: &str,
        storage: Storage,
        value: &str,
    ) -> impl Future<Output = Result<(), String>>;
}

/// Where completed steps are recorded.
pub trait Progress {
    /// Durably records that the data is now at `pair`.
    fn record(&mut self, pair: VersionPair) -> Result<(), DataDirError>;
}

/// Why one step failed.
#[derive(Debug, thiserror::Error)]
pub enum StepError {
    /// etcd could not be started.
    #[error("cannot start etcd {version}")]
    Launch {
        /// The release.
        version: Version,
        /// Why.
        #[source]
        source: SupervisorError,
    },
    /// etcd exited before it accepted a write.
    #[error("etcd {version} (pid {pid}) exited with {status} before accepting a write; its last output:\n{output}")]
    ExitedEarly {
        /// The release.
        version: Version,
        /// Its pid.
        pid: i32,
        /// How it ended.
        status: ExitStatus,
        /// Its last lines.
        output: String,
    },
    /// etcd never accepted a write before the deadline.
    #[error("etcd {version} (pid {pid}) did not accept a write within {waited:?} (last attempt: {last_error}); it was stopped; its last output:\n{output}")]
    HealthTimeout {
        /// The release.
        version: Version,
        /// Its pid.
        pid: i32,
        /// The deadline.
        waited: Duration,
        /// The last failed attempt.
        last_error: String,
        /// Its last lines.
        output: String,
    },
    /// etcd could not be stopped.
    #[error("cannot stop etcd {version}")]
    Stop {
        /// The release.
        version: Version,
        /// Why.
        #[source]
        source: SupervisorError,
    },
    /// The step worked but could not be recorded.
    #[error("etcd {} ran on the data but {} could not be recorded", .pair.version, .pair)]
    Record {
        /// What should have been recorded.
        pair: VersionPair,
        /// Why it was not.
        #[source]
        source: DataDirError,
    },
    /// The step kind exists in the plan but not yet in the executor.
    #[error("{step}: this step kind is planned but not implemented in this release of etcd-migrate (it lands with the storage-migration/rollback work); nothing was changed")]
    NotImplemented {
        /// The step.
        step: Step,
    },
}

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

/// The parts of the configuration every step's etcd shares.
#[derive(Debug, Clone)]
pub struct StepSettings<'a> {
    /// Member name.
    pub name: &'a str,
    /// Data dir.
    pub data_dir: &'a str,
    /// Loopback client port.
    pub client_port: u16,
    /// `--listen-peer-urls`.
    pub listen_peer_urls: &'a str,
    /// `--initial-advertise-peer-urls`.
    pub initial_advertise_peer_urls: &'a str,
    /// `--initial-cluster`.
    pub initial_cluster: &'a str,
    /// `ETCD_CREDS`.
    pub extra_args: &'a [String],
    /// Deadline for the first successful write.
    pub health_timeout: Duration,
}

/// Runs a plan's steps through the given effects.
pub struct Executor<'a, L, H, P> {
    /// Starts etcd.
    pub launcher: &'a L,
    /// Proves it healthy.
    pub health: &'a H,
    /// Records progress.
    pub progress: &'a mut P,
    /// Shared step settings.
    pub settings: StepSettings<'a>,
    /// Becomes `Some(signal)` when we are told to stop.
    pub termination: watch::Receiver<Option<Signal>>,
}

/// What ended a wait that races the etcd process and the stop signal.
enum Race<T> {
    Done(T),
    Signal(Signal),
    Exited(ExitStatus),
    Deadline,
}

/// A step-level failure before the step was recorded.
enum Failure {
    Step(StepError),
    Interrupted(Signal),
}

impl<L: Launcher, H: Health, P: Progress> Executor<'_, L, H, P> {
    /// Runs every step in order, recording each as it completes.
    pub async fn execute(&mut self, plan: &Plan) -> Result<(), ExecuteError> {
        let total = plan.steps.len();
        let mut recorded = plan.current;
        for (i, step) in plan.steps.iter().enumerate() {
            let label = format!("{}/{total}", i + 1);
            if let Some(signal) = *self.termination.borrow() {
                return Err(ExecuteError::Interrupted {
                    signal,
                    during: None,
                    recorded,
                });
            }
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
            match self.run_step(step, &label).await {
                Ok(()) => {}
                Err(Failure::Interrupted(signal)) => {
                    return Err(ExecuteError::Interrupted {
                        signal,
                        during: Some(format!("{label} ({step})")),
                        recorded,
                    })
                }
                Err(Failure::Step(source)) => {
                    return Err(ExecuteError::Step {
                        index: i + 1,
                        total,
                        step: *step,
                        recorded,
                        source: Box::new(source),
                    })
                }
            }
            let pair = step.result();
            self.progress
                .record(pair)
                .map_err(|source| ExecuteError::Step {
                    index: i + 1,
                    total,
                    step: *step,
                    recorded,
                    source: Box::new(StepError::Record { pair, source }),
                })?;
            recorded = pair;
            log::info(
                "step done",
                &[
                    ("step", label.into()),
                    ("recorded", pair.to_string().into()),
                    ("ms", log::ms(started.elapsed())),
                ],
            );
        }
        Ok(())
    }

    async fn run_step(&mut self, step: &Step, label: &str) -> Result<(), Failure> {
        match step {
            Step::PatchUpgrade { .. } | Step::MinorUpgrade { .. } => {
                self.run_on_data(step.result(), label).await
            }
            Step::StorageMigration { .. }
            | Step::MinorRollback { .. }
            | Step::RollbackToEtcd2 { .. } => {
                Err(Failure::Step(StepError::NotImplemented { step: *step }))
            }
        }
    }

    /// Runs `pair.version` on the data until one write succeeds, then stops
    /// it. The write is the proof that this release can serve the data.
    async fn run_on_data(&mut self, pair: VersionPair, label: &str) -> Result<(), Failure> {
        let settings = self.settings.clone();
        let spec = StepEtcd {
            version: pair.version,
            storage: pair.storage,
            name: settings.name,
            data_dir: settings.data_dir,
            client_port: settings.client_port,
            listen_peer_urls: settings.listen_peer_urls,
            initial_advertise_peer_urls: settings.initial_advertise_peer_urls,
            initial_cluster: settings.initial_cluster,
            extra_args: settings.extra_args,
        };
        let started = Instant::now();
        let mut etcd = self.launcher.launch(&spec).map_err(Failure::Step)?;
        let pid = etcd.pid();
        log::info(
            "etcd started",
            &[
                ("step", label.into()),
                ("version", pair.version.to_string().into()),
                ("pid", pid.into()),
                ("client", spec.client_url().into()),
            ],
        );
        let endpoint = spec.client_url();
        let value = pair.version.to_string();
        let deadline = tokio::time::Instant::now() + settings.health_timeout;
        let mut last_error = String::from("no attempt finished");
        let failure = loop {
            match self
                .race(
                    &mut etcd,
                    deadline,
                    self.health.write(&endpoint, pair.storage, &value),
                )
                .await
            {
                Race::Done(Ok(())) => break None,
                Race::Done(Err(err)) => last_error = err,
                Race::Signal(signal) => break Some(Failure::Interrupted(signal)),
                Race::Exited(status) => {
                    return Err(Failure::Step(StepError::ExitedEarly {
                        version: pair.version,
                        pid,
                        status,
                        output: etcd.recent_output().join("\n"),
                    }))
                }
                Race::Deadline => {
                    break Some(Failure::Step(StepError::HealthTimeout {
                        version: pair.version,
                        pid,
                        waited: settings.health_timeout,
                        last_error: last_error.clone(),
                        output: String::new(),
                    }))
                }
            }
            match self
                .race(
                    &mut etcd,
                    deadline,
                    tokio::time::sleep(HEALTH_POLL_INTERVAL),
                )
                .await
            {
                Race::Done(()) => {}
                Race::Signal(signal) => break Some(Failure::Interrupted(signal)),
                Race::Exited(status) => {
                    return Err(Failure::Step(StepError::ExitedEarly {
                        version: pair.version,
                        pid,
                        status,
                        output: etcd.recent_output().join("\n"),
                    }))
                }
                Race::Deadline => {
                    break Some(Failure::Step(StepError::HealthTimeout {
                        version: pair.version,
                        pid,
                        waited: settings.health_timeout,
                        last_error: last_error.clone(),
                        output: String::new(),
                    }))
                }
            }
        };
        let healthy_after = started.elapsed();
        let stopping = Instant::now();
        let stopped = etcd.stop().await;
        let stop_time = stopping.elapsed();
        match failure {
            Some(Failure::Step(StepError::HealthTimeout {
                version,
                pid,
                waited,
                last_error,
                ..
            })) => {
                return Err(Failure::Step(StepError::HealthTimeout {
                    version,
                    pid,
                    waited,
                    last_error,
                    output: etcd.recent_output().join("\n"),
                }))
            }
            Some(failure) => {
                if let Err(err) = stopped {
                    log::error(
                        "cannot stop etcd",
                        &[("pid", pid.into()), ("error", err.to_string().into())],
                    );
                }
                return Err(failure);
            }
            None => {}
        }
        let (status, killed) = stopped.map_err(|source| {
            Failure::Step(StepError::Stop {
                version: pair.version,
                source,
            })
        })?;
        let clean = matches!(
            status,
            ExitStatus::Exited(0) | ExitStatus::Signaled(Signal::SIGTERM)
        ) && !killed;
        let fields = [
            ("step", label.into()),
            ("version", pair.version.to_string().into()),
            ("pid", pid.into()),
            ("healthy_ms", log::ms(healthy_after)),
            ("stop_ms", log::ms(stop_time)),
            ("exit", status.to_string().into()),
        ];
        if clean {
            log::info("etcd healthy and stopped", &fields);
        } else {
            // The write was committed (raft fsyncs before acknowledging), so
            // the step stands; an unclean stop only costs the next start a
            // longer WAL replay.
            log::warn("etcd healthy but stopped uncleanly", &fields);
        }
        Ok(())
    }

    /// Polls `work` until it finishes, unless etcd exits, a stop signal
    /// arrives or the deadline passes first.
    async fn race<T>(
        &self,
        etcd: &mut L::Etcd,
        deadline: tokio::time::Instant,
        work: impl Future<Output = T>,
    ) -> Race<T> {
        let mut termination = self.termination.clone();
        tokio::select! {
            biased;
            signal = termination.wait_for(Option::is_some) => match signal.ok().and_then(|s| *s) {
                Some(signal) => Race::Signal(signal),
                // The sender lives as long as the supervisor; if it is gone,
                // no signal can come: treat it as a deadline so we never spin.
                None => Race::Deadline,
            },
            status = etcd.wait() => Race::Exited(status),
            _ = tokio::time::sleep_until(deadline) => Race::Deadline,
            output = work => Race::Done(output),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{plan, Bundle};
    use std::cell::RefCell;
    use std::rc::Rc;

    /// How the fake etcd of one step behaves.
    #[derive(Clone, Copy, Debug, PartialEq)]
    enum Behaviour {
        Healthy,
        WritesFailThenSucceed(u32),
        NeverHealthy,
        DiesAtStart,
        CannotLaunch,
    }

    #[derive(Default)]
    struct Journal {
        events: Vec<String>,
    }

    struct FakeLauncher {
        behaviours: Vec<Behaviour>,
        journal: Rc<RefCell<Journal>>,
        launches: RefCell<usize>,
    }

    struct FakeEtcd {
        version: Version,
        behaviour: Behaviour,
        journal: Rc<RefCell<Journal>>,
        stopped: bool,
    }

    struct FakeHealth {
        launches: Rc<RefCell<Vec<(Version, Behaviour)>>>,
        attempts: RefCell<u32>,
    }

    struct FakeProgress {
        journal: Rc<RefCell<Journal>>,
        fail: bool,
    }

    impl Launcher for FakeLauncher {
        type Etcd = FakeEtcd;
        fn launch(&self, spec: &StepEtcd<'_>) -> Result<FakeEtcd, StepError> {
            let n = *self.launches.borrow();
            *self.launches.borrow_mut() += 1;
            let behaviour = self
                .behaviours
                .get(n)
                .copied()
                .unwrap_or(Behaviour::Healthy);
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
    }

    impl Health for FakeHealth {
        fn write(
            &self,
            _endpoint: &str,
            _storage: Storage,
            value: &str,
        ) -> impl Future<Output = Result<(), String>> {
            let behaviour = self
                .launches
                .borrow()
                .iter()
                .rev()
                .find(|(v, _)| v.to_string() == value)
                .map(|(_, b)| *b)
                .unwrap_or(Behaviour::Healthy);
            *self.attempts.borrow_mut() += 1;
            let attempts = *self.attempts.borrow();
            async move {
                match behaviour {
                    Behaviour::Healthy => Ok(()),
                    Behaviour::WritesFailThenSucceed(n) if attempts > n => Ok(()),
                    Behaviour::DiesAtStart => std::future::pending().await,
                    _ => Err("connection refused".to_string()),
                }
            }
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

    fn walk(behaviours: &[Behaviour], signal: Option<Signal>, record_fails: bool) -> Outcome {
        let bundle =
            Bundle::new(["3.3.25", "3.4.23", "3.5.16"].map(|s| s.parse().expect("version")));
        let plan = plan(
            "3.3.25/etcd3".parse().expect("pair"),
            "3.5.16/etcd3".parse().expect("pair"),
            &bundle,
        )
        .expect("plans");
        let journal = Rc::new(RefCell::new(Journal::default()));
        let versions: Vec<Version> = plan.steps.iter().map(Step::runs).collect();
        let launcher = FakeLauncher {
            behaviours: behaviours.to_vec(),
            journal: Rc::clone(&journal),
            launches: RefCell::new(0),
        };
        let health = FakeHealth {
            launches: Rc::new(RefCell::new(
                versions
                    .iter()
                    .copied()
                    .zip(behaviours.iter().copied())
                    .collect(),
            )),
            attempts: RefCell::new(0),
        };
        let mut progress = FakeProgress {
            journal: Rc::clone(&journal),
            fail: record_fails,
        };
        let (sender, termination) = watch::channel(signal);
        let extra = Vec::new();
        let mut executor = Executor {
            launcher: &launcher,
            health: &health,
            progress: &mut progress,
            settings: StepSettings {
                name: "m",
                data_dir: "/data",
                client_port: 18629,
                listen_peer_urls: "http://localhost:2380",
                initial_advertise_peer_urls: "http://localhost:2380",
                initial_cluster: "m=http://localhost:2380",
                extra_args: &extra,
                health_timeout: Duration::from_millis(300),
            },
            termination,
        };
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("runtime");
        let result = runtime.block_on(executor.execute(&plan));
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
            let source = std::error::Error::source(&err)
                .map(ToString::to_string)
                .unwrap_or_default();
            match behaviour {
                Behaviour::NeverHealthy => assert!(
                    source.contains("did not accept a write within")
                        && source.contains("connection refused")
                        && source.contains("panic: fake etcd 3.5.16"),
                    "{source}"
                ),
                Behaviour::DiesAtStart => assert!(
                    source.contains("exited with exit code 2 before accepting a write")
                        && source.contains("panic: fake etcd 3.5.16"),
                    "{source}"
                ),
                _ => assert!(source.contains("cannot start etcd 3.5.16"), "{source}"),
            }
        }
    }

    #[test]
    fn a_failure_on_step_1_records_nothing() {
        let outcome = walk(&[Behaviour::NeverHealthy], None, false);
        assert!(outcome.result.is_err());
        assert_eq!(outcome.events, ["launch 3.4.23", "stop 3.4.23"]);
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
        let source = std::error::Error::source(&err)
            .map(ToString::to_string)
            .unwrap_or_default();
        assert!(
            source.contains("etcd 3.4.23 ran on the data but 3.4.23/etcd3 could not be recorded"),
            "{source}"
        );
    }
}
