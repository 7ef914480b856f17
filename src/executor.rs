//! This module owns carrying out a plan: for each step, start its etcd,
//! wait until a write succeeds (or it dies, or the deadline passes, or we
//! are told to stop), do the step's work while it serves, fingerprint the
//! keyspace it serves and check it against the one before the step, stop
//! it, and record the step in `version.txt`; the baseline fingerprint read
//! by the recorded release before the first step; and the backup before
//! the first step that rewrites the data. It talks to the outside only through the small
//! traits below, so a test can make step N fail in each way and check what
//! was recorded. The steps that rebuild data live in `rebuild`.

use std::collections::BTreeMap;
use std::future::Future;
use std::path::Path;
use std::time::{Duration, Instant, SystemTime};

use nix::sys::signal::Signal;
use tokio::sync::watch;

use crate::backup::{self, BackupMode, BackupPolicy};
use crate::datadir::DataDirError;
use crate::dialect::StepEtcd;
use crate::keyspace::{Fingerprint, KnownLeases, Ours};
use crate::log;
use crate::plan::{Binary, Plan, Step};
use crate::supervisor::{ExitStatus, SupervisorError};
use crate::version::{Storage, Version, VersionPair};

/// Pause between two health attempts. Tens of ms: a step's etcd is usually
/// writable 100–200 ms after start, and each attempt is a loopback call.
pub const HEALTH_POLL_INTERVAL: Duration = Duration::from_millis(15);

/// Deadline for one piece of work inside a step (a snapshot, a restore, an
/// `etcdctl migrate`, a keyspace copy). Generous: 100,000 keys × 1 KiB
/// take seconds; the deadline only catches a hung tool, which is killed.
pub const WORK_TIMEOUT: Duration = Duration::from_secs(30 * 60);

/// Starts a step's etcd.
pub trait Launcher {
    /// The running process.
    type Etcd: RunningEtcd;
    /// Starts etcd as `spec` says.
    fn launch(&self, spec: &StepEtcd<'_>) -> Result<Self::Etcd, StepError>;
    /// The hidden v2 nodes (names starting with `_`) the data in
    /// `data_dir` records, read offline before an etcd starts on it: the
    /// v2 API lists none of them, so the reads must ask for each.
    fn hidden_v2_paths(&self, data_dir: &Path) -> Vec<String>;
    /// The TTL each lease of the data in `data_dir` was granted (lease id →
    /// seconds), read offline while no etcd runs on it; `Ok(None)` where
    /// the data holds no lease table (no bolt database). For a release
    /// that cannot tell a lease's TTL (3.0 has no LeaseTimeToLive), read
    /// just before it starts on the data.
    fn granted_leases(&self, data_dir: &Path) -> Result<Option<BTreeMap<i64, i64>>, String>;
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
    /// Proves that this process holds the socket listening on loopback
    /// `port`: then every call to that port reaches it, and none reached
    /// another process that took the port first (etcd binds at start and
    /// exits if it cannot). `Err` names the holder, if one is found.
    fn owns_listener(&self, port: u16) -> Result<(), String>;
}

/// Why one health attempt failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HealthError {
    /// Not yet: etcd is starting, electing, or the attempt timed out. The
    /// next attempt may succeed.
    NotYet(String),
    /// Never, on this data as it is: etcd answered, and its answer shows a
    /// condition no retry clears (an alarm raised in the data). Carries what
    /// etcd said and what the operator must do.
    Refused {
        /// What etcd reported.
        reason: String,
        /// What to do about it.
        remedy: String,
    },
}

impl std::fmt::Display for HealthError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HealthError::NotYet(why) => f.write_str(why),
            HealthError::Refused { reason, remedy } => write!(f, "{reason}; {remedy}"),
        }
    }
}

/// Proves a step's etcd healthy with one write, and reads what it serves.
pub trait Health {
    /// Checks the data's alarms (where the API has them) and writes the
    /// health key once.
    fn write(
        &self,
        endpoint: &str,
        storage: Storage,
        value: &str,
    ) -> impl Future<Output = Result<(), HealthError>>;

    /// Reads the whole keyspace through `storage`'s API (and the hidden v2
    /// nodes named in `hidden`) and fingerprints it; `known` holds the
    /// leases' TTLs where the release cannot tell them (3.0).
    fn fingerprint(
        &self,
        endpoint: &str,
        storage: Storage,
        hidden: &[String],
        known: &KnownLeases,
    ) -> impl Future<Output = Result<Fingerprint, String>>;

    /// [`Health::fingerprint`], proven against `before` (the last step's
    /// read) by etcd's own hash where the release has one, instead of
    /// reading the whole keyspace (see `keyspace::read_fingerprint_since`).
    fn fingerprint_since(
        &self,
        endpoint: &str,
        storage: Storage,
        hidden: &[String],
        known: &KnownLeases,
        before: Option<&Fingerprint>,
    ) -> impl Future<Output = Result<Fingerprint, String>> {
        let _ = before;
        self.fingerprint(endpoint, storage, hidden, known)
    }

    /// What the health writes of this run put into the keyspace, for the
    /// reads to leave out.
    fn ours(&self) -> Ours;
}

/// Runs the offline tools of a release (`etcdctl`, `etcdutl`).
pub trait Tools {
    /// Runs `binary` with `args` (and `env`) to completion. Dropping the
    /// future stops the tool.
    fn run(
        &self,
        binary: Binary,
        args: &[String],
        env: &[(&str, &str)],
    ) -> impl Future<Output = Result<(), StepError>>;
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
    #[error("etcd {version} (pid {pid}) exited with {status} before the step's work was done; its last output:\n{output}")]
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
    /// etcd answered, but refuses writes on this data until the operator
    /// acts (e.g. a NOSPACE alarm raised before the migration).
    #[error("etcd {version} (pid {pid}) serves the data but refuses writes: {reason}; it was stopped and nothing was recorded; {remedy}")]
    Refused {
        /// The release.
        version: Version,
        /// Its pid.
        pid: i32,
        /// What etcd reported.
        reason: String,
        /// What to do.
        remedy: String,
    },
    /// What answered on the step's client port is not the etcd we started
    /// (another process took the port first).
    #[error("the etcd answering on {endpoint} is not etcd {version} (pid {pid}) that etcd-migrate started on the data: {holder}; nothing it said was used; stop whatever else listens there, or give the steps another loopback port with --port, and rerun")]
    NotOurs {
        /// The release we started.
        version: Version,
        /// Its pid.
        pid: i32,
        /// The step's client URL.
        endpoint: String,
        /// Who holds the port, as far as /proc tells.
        holder: String,
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
    /// An offline tool failed.
    #[error("{binary} {args} failed with {status}; its last output:\n{output}")]
    Tool {
        /// The tool.
        binary: Binary,
        /// Its arguments, for the operator to rerun by hand.
        args: String,
        /// How it ended.
        status: ExitStatus,
        /// Its last lines.
        output: String,
    },
    /// A piece of the step's work failed (a read, a copy, a check).
    #[error("{what}: {detail}")]
    Work {
        /// What was being done.
        what: String,
        /// What went wrong.
        detail: String,
    },
    /// The work did not finish in time.
    #[error("{what} did not finish within {waited:?}; it was stopped")]
    WorkTimeout {
        /// What was being done.
        what: String,
        /// The deadline.
        waited: Duration,
    },
    /// The keyspace after the step is not the one before it.
    #[error("the keyspace etcd {version} serves after the step is not the one before it ({detail}); the step was not recorded; do not serve this data until the difference is understood: a rebuilding step left the data untouched, but an in-place step ran etcd {version} on it, so compare it with a backup (take one with --backup always before rerunning)")]
    Changed {
        /// The release that served the result.
        version: Version,
        /// Both fingerprints and what differs.
        detail: String,
    },
    /// The data's v2 store holds keys, and the step's release serves no v2
    /// store (3.6 refuses to start on custom v2 content).
    #[error("the data's v2 store holds {keys} keys (e.g. {sample:?}), and etcd {version} has no v2 store to hold them (it refuses to start on such data); nothing was run; move what they hold into the v3 keyspace (or delete them: ETCDCTL_API=2 etcdctl rm, with an etcd of {last} serving the data), check with `etcdutl check v2store`, then rerun")]
    V2KeysUnsupported {
        /// The release without a v2 store.
        version: Version,
        /// The release that served the data last.
        last: Version,
        /// How many v2 keys.
        keys: usize,
        /// Some of them.
        sample: Vec<String>,
    },
    /// The backup before a destructive step failed.
    #[error("cannot back up the data dir before a step that rewrites it")]
    Backup(#[source] backup::BackupError),
    /// The step worked but could not be recorded.
    #[error("etcd {} ran on the data but {} could not be recorded", .pair.version, .pair)]
    Record {
        /// What should have been recorded.
        pair: VersionPair,
        /// Why it was not.
        #[source]
        source: DataDirError,
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

/// How keys that expired in the v2 store get their expiry in v3.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TtlLeases {
    /// Each key gets a lease with its own remaining TTL; keys that expire
    /// in the same second share one.
    #[default]
    Exact,
    /// The Kubernetes tool's way: every key under the TTL keys directory
    /// gets one lease of an hour (other TTL keys still get exact leases).
    Flat,
}

impl std::str::FromStr for TtlLeases {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "exact" => Ok(TtlLeases::Exact),
            "flat" => Ok(TtlLeases::Flat),
            _ => Err("expected exact or flat".to_string()),
        }
    }
}

/// The parts of the configuration every step shares.
#[derive(Debug, Clone)]
pub struct StepSettings<'a> {
    /// Member name.
    pub name: &'a str,
    /// Data dir.
    pub data_dir: &'a Path,
    /// Loopback client port.
    pub client_port: u16,
    /// `--listen-peer-urls`.
    pub listen_peer_urls: &'a str,
    /// `--initial-advertise-peer-urls`.
    pub initial_advertise_peer_urls: &'a str,
    /// `--initial-cluster`.
    pub initial_cluster: &'a str,
    /// `--initial-cluster-token` for restored and rebuilt data.
    pub initial_cluster_token: &'a str,
    /// `ETCD_CREDS`.
    pub extra_args: &'a [String],
    /// Deadline for the first successful write.
    pub health_timeout: Duration,
    /// Backups before destructive steps.
    pub backup: &'a BackupPolicy,
    /// Expiry of migrated v2 TTL keys.
    pub ttl_leases: TtlLeases,
    /// The Kubernetes TTL keys directory (flat mode).
    pub ttl_keys_directory: &'a str,
    /// Leave the v2 copies of migrated keys in place.
    pub keep_v2_keys: bool,
    /// The release that reads the data as recorded before the first step,
    /// for the baseline fingerprint ([`crate::plan::baseline_reader`]).
    pub baseline: Option<Version>,
}

/// Runs a plan's steps through the given effects.
pub struct Executor<'a, L, H, T, P> {
    /// Starts etcd.
    pub launcher: &'a L,
    /// Proves it healthy.
    pub health: &'a H,
    /// Runs offline tools.
    pub tools: &'a T,
    /// Records progress.
    pub progress: &'a mut P,
    /// Shared step settings.
    pub settings: StepSettings<'a>,
    /// Becomes `Some(signal)` when we are told to stop.
    pub termination: watch::Receiver<Option<Signal>>,
}

/// What ended a wait that races the etcd process and the stop signal.
pub(crate) enum Race<T> {
    Done(T),
    Signal(Signal),
    Exited(ExitStatus),
    Deadline,
}

/// A step-level failure before the step was recorded.
pub(crate) enum Failure {
    Step(StepError),
    Interrupted(Signal),
}

impl From<StepError> for Failure {
    fn from(err: StepError) -> Self {
        Failure::Step(err)
    }
}

/// A step's etcd that has accepted a write and is serving the data.
pub(crate) struct Serving<E> {
    pub(crate) etcd: E,
    pub(crate) pid: i32,
    pub(crate) version: Version,
    pub(crate) endpoint: String,
    pub(crate) started: Instant,
    pub(crate) healthy_after: Duration,
    /// The hidden v2 nodes the data it serves recorded when it started.
    pub(crate) hidden_v2: Vec<String>,
    /// The leases' TTLs where the release cannot tell them (3.0): what
    /// the data recorded, counted from `started`, and what the step
    /// granted itself since.
    pub(crate) known: KnownLeases,
}

/// How a step's etcd is to be started, beyond the shared settings.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Run<'p> {
    pub(crate) version: Version,
    pub(crate) storage: Storage,
    pub(crate) data_dir: &'p Path,
    pub(crate) new_cluster: bool,
}

impl<L: Launcher, H: Health, T: Tools, P: Progress> Executor<'_, L, H, T, P> {
    /// Runs every step in order, recording each as it completes.
    pub async fn execute(&mut self, plan: &Plan) -> Result<(), ExecuteError> {
        let total = plan.steps.len();
        let mut recorded = plan.current;
        let mut backed_up = false;
        // The keyspace as the last completed step left it; each step must
        // hand on the same. The rebuilding steps read their source first,
        // so without a baseline reader the first of them sets it.
        let mut before = match (self.settings.baseline, plan.steps.first()) {
            (Some(version), Some(first)) => {
                Some(self.baseline(version, first, plan.current).await?)
            }
            _ => None,
        };
        for (i, step) in plan.steps.iter().enumerate() {
            let label = format!("{}/{total}", i + 1);
            let fail = |recorded, source| ExecuteError::Step {
                index: i + 1,
                total,
                step: *step,
                recorded,
                source: Box::new(source),
            };
            if let Some(signal) = *self.termination.borrow() {
                return Err(ExecuteError::Interrupted {
                    signal,
                    during: None,
                    recorded,
                });
            }
            if let Some(side) = before.as_ref().and_then(Fingerprint::v2_side) {
                if side.keys > 0 && !step.runs().has_v2_api() {
                    return Err(fail(
                        recorded,
                        StepError::V2KeysUnsupported {
                            version: step.runs(),
                            last: recorded.version,
                            keys: side.keys,
                            sample: side.sample().to_vec(),
                        },
                    ));
                }
            }
            let wants_backup = match self.settings.backup.mode {
                BackupMode::Always => true,
                BackupMode::Destructive => step.is_destructive(),
                BackupMode::Never => false,
            };
            if wants_backup && !backed_up {
                match self.back_up(recorded) {
                    Ok(()) => {}
                    Err(Failure::Interrupted(signal)) => {
                        return Err(ExecuteError::Interrupted {
                            signal,
                            during: Some(format!("{label} ({step}), in the backup before it")),
                            recorded,
                        })
                    }
                    Err(Failure::Step(err)) => return Err(fail(recorded, err)),
                }
                backed_up = true;
                // A signal that came as the copy finished: no etcd starts.
                if let Some(signal) = *self.termination.borrow() {
                    return Err(ExecuteError::Interrupted {
                        signal,
                        during: None,
                        recorded,
                    });
                }
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
            let after = match self.run_step(step, &label, before.as_ref()).await {
                Ok(after) => after,
                Err(Failure::Interrupted(signal)) => {
                    return Err(ExecuteError::Interrupted {
                        signal,
                        during: Some(format!("{label} ({step})")),
                        recorded,
                    })
                }
                Err(Failure::Step(source)) => return Err(fail(recorded, source)),
            };
            crate::failpoint!("step-after-stop");
            let pair = step.result();
            self.progress
                .record(pair)
                .map_err(|source| fail(recorded, StepError::Record { pair, source }))?;
            recorded = pair;
            crate::failpoint!("step-after-record");
            if step.is_destructive() {
                // Only now: until version.txt names the step, its scratch
                // dir (and swap journal) is what a restart recovers from.
                crate::rebuild::finish_rebuild(self.settings.data_dir);
            }
            log::info(
                "step done",
                &[
                    ("step", label.into()),
                    ("recorded", pair.to_string().into()),
                    ("fingerprint", after.to_string().into()),
                    ("ms", log::ms(started.elapsed())),
                ],
            );
            before = Some(after);
        }
        Ok(())
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
        &mut self,
        version: Version,
        first: &Step,
        recorded: VersionPair,
    ) -> Result<Fingerprint, ExecuteError> {
        let first_try = self.read_baseline(version, recorded).await;
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
        match self.read_baseline(first.runs(), recorded).await {
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

    /// One baseline read: `version` serves the data as recorded.
    async fn read_baseline(
        &mut self,
        version: Version,
        recorded: VersionPair,
    ) -> Result<Fingerprint, ExecuteError> {
        if let Some(signal) = *self.termination.borrow() {
            return Err(ExecuteError::Interrupted {
                signal,
                during: None,
                recorded,
            });
        }
        let started = Instant::now();
        let label = "baseline";
        let run = Run {
            version,
            storage: recorded.storage,
            data_dir: self.settings.data_dir,
            new_cluster: false,
        };
        let read = async {
            let mut serving = self.start_serving(run, label).await?;
            let fingerprint = self
                .read_fingerprint(&mut serving, recorded.storage)
                .await?;
            crate::failpoint!("baseline-read");
            self.stop_serving(serving, label).await?;
            Ok::<_, Failure>(fingerprint)
        };
        match read.await {
            Ok(fingerprint) => {
                log::info(
                    "baseline read",
                    &[
                        ("version", version.to_string().into()),
                        ("fingerprint", fingerprint.to_string().into()),
                        ("ms", log::ms(started.elapsed())),
                    ],
                );
                Ok(fingerprint)
            }
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

    /// Reads the fingerprint of what `serving` serves (see
    /// [`Executor::while_serving`] for what ends the read early).
    pub(crate) async fn read_fingerprint(
        &self,
        serving: &mut Serving<L::Etcd>,
        storage: Storage,
    ) -> Result<Fingerprint, Failure> {
        let endpoint = serving.endpoint.clone();
        let hidden = serving.hidden_v2.clone();
        let known = serving.known.clone();
        self.while_serving(
            serving,
            "fingerprint the keyspace",
            self.health.fingerprint(&endpoint, storage, &hidden, &known),
        )
        .await
    }

    /// [`Executor::read_fingerprint`], proven against `before` by etcd's
    /// own hash where it can.
    async fn read_fingerprint_since(
        &self,
        serving: &mut Serving<L::Etcd>,
        storage: Storage,
        before: Option<&Fingerprint>,
    ) -> Result<Fingerprint, Failure> {
        let endpoint = serving.endpoint.clone();
        let hidden = serving.hidden_v2.clone();
        let known = serving.known.clone();
        self.while_serving(
            serving,
            "fingerprint the keyspace",
            self.health
                .fingerprint_since(&endpoint, storage, &hidden, &known, before),
        )
        .await
    }

    /// Fails (stopping `serving`) unless `after` holds what `before` held.
    pub(crate) async fn check_kept(
        &self,
        serving: &mut Serving<L::Etcd>,
        before: Option<&Fingerprint>,
        after: &Fingerprint,
    ) -> Result<(), Failure> {
        let Some(before) = before else {
            return Ok(());
        };
        if let Err(detail) = before.check_kept_by(after) {
            stop_serving_quietly(serving).await;
            return Err(Failure::Step(StepError::Changed {
                version: serving.version,
                detail,
            }));
        }
        Ok(())
    }

    /// Takes the backup. The copy runs on this thread, so it asks the
    /// termination channel itself, between files and between chunks: a
    /// signal stops it within a chunk's time and removes the partial copy.
    fn back_up(&self, pair: VersionPair) -> Result<(), Failure> {
        let started = Instant::now();
        log::info(
            "backup start",
            &[
                (
                    "dir",
                    self.settings.backup.root.display().to_string().into(),
                ),
                ("holds", pair.to_string().into()),
            ],
        );
        let stop = || *self.termination.borrow();
        let path = backup::create(
            self.settings.data_dir,
            self.settings.backup,
            pair,
            SystemTime::now(),
            &stop,
        )
        .map_err(|err| match err {
            backup::BackupError::Interrupted { signal, .. } => Failure::Interrupted(signal),
            err => Failure::Step(StepError::Backup(err)),
        })?;
        log::info(
            "backup taken",
            &[
                ("path", path.display().to_string().into()),
                ("holds", pair.to_string().into()),
                ("ms", log::ms(started.elapsed())),
                ("verify", backup::verify_command(&path).into()),
                (
                    "restore",
                    backup::restore_command(self.settings.data_dir, &path).into(),
                ),
            ],
        );
        Ok(())
    }

    /// Runs one step; returns the fingerprint of its result, checked
    /// against `before` (the keyspace as the last step left it).
    async fn run_step(
        &mut self,
        step: &Step,
        label: &str,
        before: Option<&Fingerprint>,
    ) -> Result<Fingerprint, Failure> {
        match *step {
            Step::PatchUpgrade { .. } | Step::MinorUpgrade { .. } => {
                let pair = step.result();
                let run = Run {
                    version: pair.version,
                    storage: pair.storage,
                    data_dir: self.settings.data_dir,
                    new_cluster: false,
                };
                let mut serving = self.start_serving(run, label).await?;
                let after = self
                    .read_fingerprint_since(&mut serving, pair.storage, before)
                    .await?;
                crate::failpoint!("step-after-fingerprint");
                self.check_kept(&mut serving, before, &after).await?;
                self.stop_serving(serving, label).await?;
                Ok(after)
            }
            Step::StorageMigration { at } => self.storage_migration(at, label, before).await,
            Step::MinorRollback { serve, to, .. } => {
                self.minor_rollback(serve, to, label, before).await
            }
            Step::RollbackToEtcd2 { serve, to, .. } => {
                self.rollback_to_etcd2(serve, to, label, before).await
            }
        }
    }

    /// Starts `run.version` on `run.data_dir` and waits until one write
    /// succeeds: the proof that this release can serve the data. On any
    /// failure the etcd is stopped before returning.
    pub(crate) async fn start_serving(
        &mut self,
        run: Run<'_>,
        label: &str,
    ) -> Result<Serving<L::Etcd>, Failure> {
        let settings = self.settings.clone();
        let data_dir = run.data_dir.to_string_lossy();
        let spec = StepEtcd {
            version: run.version,
            storage: run.storage,
            name: settings.name,
            data_dir: &data_dir,
            client_port: settings.client_port,
            listen_peer_urls: settings.listen_peer_urls,
            initial_advertise_peer_urls: settings.initial_advertise_peer_urls,
            initial_cluster: settings.initial_cluster,
            new_cluster_token: run.new_cluster.then_some(settings.initial_cluster_token),
            extra_args: settings.extra_args,
        };
        let hidden_v2 = self.launcher.hidden_v2_paths(run.data_dir);
        let granted = self.granted_leases(run);
        let started = Instant::now();
        let mut etcd = self.launcher.launch(&spec)?;
        let pid = etcd.pid();
        log::info(
            "etcd started",
            &[
                ("step", label.into()),
                ("version", run.version.to_string().into()),
                ("pid", pid.into()),
                ("client", spec.client_url().into()),
                ("data_dir", data_dir.as_ref().into()),
            ],
        );
        let endpoint = spec.client_url();
        let value = run.version.to_string();
        let deadline = tokio::time::Instant::now() + settings.health_timeout;
        let mut last_error = String::from("no attempt finished");
        let ended = loop {
            let attempt = self
                .race(
                    &mut etcd,
                    deadline,
                    self.health.write(&endpoint, run.storage, &value),
                )
                .await;
            let ended = match attempt {
                Race::Done(Ok(())) => {
                    crate::failpoint!("step-after-health-write");
                    if let Err(holder) = etcd.owns_listener(spec.client_port) {
                        stop_quietly(&mut etcd, pid).await;
                        return Err(Failure::Step(StepError::NotOurs {
                            version: run.version,
                            pid,
                            endpoint,
                            holder,
                        }));
                    }
                    return Ok(Serving {
                        etcd,
                        pid,
                        version: run.version,
                        endpoint,
                        started,
                        healthy_after: started.elapsed(),
                        hidden_v2,
                        known: KnownLeases::granted_at(&granted, started),
                    });
                }
                Race::Done(Err(HealthError::Refused { reason, remedy })) => {
                    stop_quietly(&mut etcd, pid).await;
                    return Err(Failure::Step(StepError::Refused {
                        version: run.version,
                        pid,
                        reason,
                        remedy,
                    }));
                }
                Race::Done(Err(HealthError::NotYet(err))) => {
                    last_error = err;
                    self.race(
                        &mut etcd,
                        deadline,
                        tokio::time::sleep(HEALTH_POLL_INTERVAL),
                    )
                    .await
                }
                Race::Signal(signal) => Race::Signal(signal),
                Race::Exited(status) => Race::Exited(status),
                Race::Deadline => Race::Deadline,
            };
            if !matches!(ended, Race::Done(())) {
                break ended;
            }
        };
        let failure = match ended {
            Race::Signal(signal) => {
                stop_quietly(&mut etcd, pid).await;
                Failure::Interrupted(signal)
            }
            Race::Exited(status) => Failure::Step(StepError::ExitedEarly {
                version: run.version,
                pid,
                status,
                output: etcd.recent_output().join("\n"),
            }),
            Race::Deadline | Race::Done(()) => {
                // Stopped first, so the report carries its last words.
                stop_quietly(&mut etcd, pid).await;
                Failure::Step(StepError::HealthTimeout {
                    version: run.version,
                    pid,
                    waited: settings.health_timeout,
                    last_error,
                    output: etcd.recent_output().join("\n"),
                })
            }
        };
        Err(failure)
    }

    /// What `run`'s data records of its leases' TTLs, when `run`'s release
    /// cannot tell them (etcd3 data under 3.0): read offline, before that
    /// etcd starts. A read that fails is logged and leaves them unknown:
    /// the fingerprint then takes every leased key as one that may expire
    /// at any moment, which weakens the check but loses nothing.
    fn granted_leases(&self, run: Run<'_>) -> BTreeMap<i64, i64> {
        if run.storage != Storage::Etcd3 || run.version.has_lease_time_to_live() {
            return BTreeMap::new();
        }
        let reading = Instant::now();
        match self.launcher.granted_leases(run.data_dir) {
            Ok(granted) => {
                let granted = granted.unwrap_or_default();
                log::info(
                    "lease TTLs read from the data",
                    &[
                        ("version", run.version.to_string().into()),
                        ("data_dir", run.data_dir.display().to_string().into()),
                        ("leases", granted.len().into()),
                        ("ms", log::ms(reading.elapsed())),
                    ],
                );
                granted
            }
            Err(err) => {
                log::warn(
                    "cannot read the leases' TTLs from the data; its leased keys count as expiring at any moment",
                    &[
                        ("version", run.version.to_string().into()),
                        ("data_dir", run.data_dir.display().to_string().into()),
                        ("error", err.into()),
                    ],
                );
                BTreeMap::new()
            }
        }
    }

    /// Stops a serving etcd and logs how the step's etcd went.
    pub(crate) async fn stop_serving(
        &mut self,
        mut serving: Serving<L::Etcd>,
        label: &str,
    ) -> Result<(), Failure> {
        let stopping = Instant::now();
        let (status, killed) = serving
            .etcd
            .stop()
            .await
            .map_err(|source| StepError::Stop {
                version: serving.version,
                source,
            })?;
        let clean = matches!(
            status,
            ExitStatus::Exited(0) | ExitStatus::Signaled(Signal::SIGTERM)
        ) && !killed;
        let fields = [
            ("step", label.into()),
            ("version", serving.version.to_string().into()),
            ("pid", serving.pid.into()),
            ("healthy_ms", log::ms(serving.healthy_after)),
            ("served_ms", log::ms(serving.started.elapsed())),
            ("stop_ms", log::ms(stopping.elapsed())),
            ("exit", status.to_string().into()),
        ];
        if clean {
            log::info("etcd healthy and stopped", &fields);
        } else {
            // Every write we made was committed (raft fsyncs before it
            // acknowledges), so the step stands; an unclean stop only costs
            // the next start a longer WAL replay.
            log::warn("etcd healthy but stopped uncleanly", &fields);
        }
        Ok(())
    }

    /// Does `work` while `serving` runs: fails (and stops etcd) if etcd
    /// dies, a stop signal arrives, the work fails or takes longer than
    /// [`WORK_TIMEOUT`].
    pub(crate) async fn while_serving<R, E: Into<String>>(
        &self,
        serving: &mut Serving<L::Etcd>,
        what: &str,
        work: impl Future<Output = Result<R, E>>,
    ) -> Result<R, Failure> {
        let deadline = tokio::time::Instant::now() + WORK_TIMEOUT;
        let failure = match self.race(&mut serving.etcd, deadline, work).await {
            Race::Done(Ok(value)) => return Ok(value),
            Race::Done(Err(detail)) => Failure::Step(StepError::Work {
                what: what.to_string(),
                detail: detail.into(),
            }),
            Race::Signal(signal) => Failure::Interrupted(signal),
            Race::Exited(status) => {
                return Err(Failure::Step(StepError::ExitedEarly {
                    version: serving.version,
                    pid: serving.pid,
                    status,
                    output: serving.etcd.recent_output().join("\n"),
                }))
            }
            Race::Deadline => Failure::Step(StepError::WorkTimeout {
                what: what.to_string(),
                waited: WORK_TIMEOUT,
            }),
        };
        stop_quietly(&mut serving.etcd, serving.pid).await;
        Err(failure)
    }

    /// Runs an offline tool, unless a stop signal comes first (dropping the
    /// tool's future stops it).
    pub(crate) async fn offline(
        &self,
        binary: Binary,
        args: &[String],
        env: &[(&str, &str)],
    ) -> Result<(), Failure> {
        let mut termination = self.termination.clone();
        let started = Instant::now();
        let result = tokio::select! {
            biased;
            signal = termination.wait_for(Option::is_some) => match signal.ok().and_then(|s| *s) {
                Some(signal) => return Err(Failure::Interrupted(signal)),
                None => Err(StepError::WorkTimeout { what: binary.to_string(), waited: WORK_TIMEOUT }),
            },
            _ = tokio::time::sleep(WORK_TIMEOUT) => Err(StepError::WorkTimeout { what: binary.to_string(), waited: WORK_TIMEOUT }),
            result = self.tools.run(binary, args, env) => result,
        };
        log::info(
            "tool finished",
            &[
                ("tool", binary.to_string().into()),
                ("args", args.join(" ").into()),
                ("ok", result.is_ok().into()),
                ("ms", log::ms(started.elapsed())),
            ],
        );
        result.map_err(Failure::Step)
    }

    /// Polls `work` until it finishes, unless etcd exits, a stop signal
    /// arrives or the deadline passes first.
    pub(crate) async fn race<R>(
        &self,
        etcd: &mut L::Etcd,
        deadline: tokio::time::Instant,
        work: impl Future<Output = R>,
    ) -> Race<R> {
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

/// The first line of an error report and its last non-empty one (etcd's
/// last words), for a one-line log.
fn first_and_last_lines(text: &str) -> (String, String) {
    let first = text.lines().next().unwrap_or_default();
    let last = text.lines().rev().find(|l| !l.trim().is_empty());
    (first.to_string(), last.unwrap_or_default().to_string())
}

/// Stops a serving etcd on a failure path (see [`stop_quietly`]).
pub(crate) async fn stop_serving_quietly<E: RunningEtcd>(serving: &mut Serving<E>) {
    stop_quietly(&mut serving.etcd, serving.pid).await;
}

/// Stops an etcd on a failure path, where the failure itself is what gets
/// reported; a stop error is logged.
async fn stop_quietly<E: RunningEtcd>(etcd: &mut E, pid: i32) {
    if let Err(err) = etcd.stop().await {
        log::error(
            "cannot stop etcd",
            &[("pid", pid.into()), ("error", err.to_string().into())],
        );
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
        Alarmed,
        /// Healthy, but serves a keyspace with one key less.
        LosesAKey,
        /// Healthy, and its data's v2 store holds a key (flannel's).
        HoldsV2Keys,
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
        fingerprint.with_v2_side(Some(Fingerprint::of(Storage::Etcd2, &[side])))
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

    impl Health for FakeHealth {
        fn write(
            &self,
            _endpoint: &str,
            _storage: Storage,
            value: &str,
        ) -> impl Future<Output = Result<(), HealthError>> {
            let behaviour = value
                .parse()
                .map(|v| behaviour_of(&self.behaviours, v))
                .unwrap_or(Behaviour::Healthy);
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
                    _ => Err(HealthError::NotYet("connection refused".to_string())),
                }
            }
        }

        fn fingerprint(
            &self,
            _endpoint: &str,
            _storage: Storage,
            _hidden: &[String],
            known: &KnownLeases,
        ) -> impl Future<Output = Result<Fingerprint, String>> {
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
        };
        let mut progress = FakeProgress {
            journal: Rc::clone(&journal),
            fail: record_fails,
        };
        let (sender, termination) = watch::channel(signal);
        let extra = Vec::new();
        let backup = BackupPolicy {
            mode: BackupMode::Destructive,
            root: "/data.backup".into(),
            keep: 3,
        };
        let mut executor = Executor {
            launcher: &launcher,
            health: &health,
            tools: &NoTools,
            progress: &mut progress,
            settings: StepSettings {
                name: "m",
                data_dir: Path::new("/data"),
                client_port: 18629,
                listen_peer_urls: "http://localhost:2380",
                initial_advertise_peer_urls: "http://localhost:2380",
                initial_cluster: "m=http://localhost:2380",
                initial_cluster_token: "etcd-cluster",
                extra_args: &extra,
                health_timeout: Duration::from_millis(300),
                backup: &backup,
                ttl_leases: TtlLeases::Exact,
                ttl_keys_directory: "/registry/events",
                keep_v2_keys: false,
                baseline: crate::plan::baseline_reader(&plan, &bundle),
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
