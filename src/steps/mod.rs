//! This module owns what every step kind does with its etcd, whatever the
//! kind: start it and race (write | exit | signal | deadline) until one
//! write succeeds, do the step's work while it serves, fingerprint what it
//! serves and check it against what the last step left, stop it; the
//! baseline read; the backup; and the offline tools. Each step kind lives
//! in its own file and takes the `Context`: the effects (`effects`,
//! `swap::Disk`) and the settings every step shares.

pub mod in_place;
pub mod minor_downgrade;
pub mod minor_rollback;
pub mod storage_migration;
pub mod to_etcd2;

use std::collections::BTreeMap;
use std::future::Future;
use std::path::Path;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use tokio::sync::watch;

use crate::backup::{self, BackupError, BackupPolicy};
use crate::baseline::PendingBaseline;
use crate::binaries::BinError;
use crate::config::{Member, TtlLeases};
use crate::dialect::StepEtcd;
use crate::effects::{EtcdApi, Expected, HealthError, Launcher, RunningEtcd, StepError, Tools};
use crate::keyspace::{self, Entry, Fingerprint, KnownLeases};
use crate::log;
use crate::plan::Binary;
use crate::supervisor::ExitStatus;
use crate::swap::{Disk, SwapError};
use crate::version::{Minor, Storage, Version, VersionPair};

/// Pause between two health attempts. Tens of ms: a step's etcd is usually
/// writable 100–200 ms after start, and each attempt is a loopback call.
pub const HEALTH_POLL_INTERVAL: Duration = Duration::from_millis(15);

/// Deadline for one piece of work inside a step (a snapshot, a restore, an
/// `etcdctl migrate`, a keyspace copy). Generous: 100,000 keys × 1 KiB
/// take seconds; the deadline only catches a hung tool, which is killed.
pub const WORK_TIMEOUT: Duration = Duration::from_secs(30 * 60);

/// The parts of the configuration every step shares.
#[derive(Debug, Clone)]
pub struct StepSettings<'a> {
    /// The member every step's etcd runs as.
    pub member: &'a Member,
    /// Data dir.
    pub data_dir: &'a Path,
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
}

/// What a step works with: the effects and the shared settings.
pub(crate) struct Context<'a, L, A, T, D> {
    /// Starts etcd.
    pub(crate) launcher: &'a L,
    /// Talks to its API.
    pub(crate) api: &'a A,
    /// Runs offline tools.
    pub(crate) tools: &'a T,
    /// Backs up, copies and swaps on disk.
    pub(crate) disk: &'a D,
    /// Shared step settings.
    pub(crate) settings: StepSettings<'a>,
    /// Becomes `Some(signal)` when we are told to stop.
    pub(crate) termination: watch::Receiver<Option<Signal>>,
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

impl From<SwapError> for Failure {
    fn from(err: SwapError) -> Self {
        Failure::Step(StepError::Swap(err))
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

impl<E> Serving<E> {
    /// What it serves, for the reads: its release on data in `storage`.
    pub(crate) fn serves(&self, storage: Storage) -> VersionPair {
        VersionPair {
            version: self.version,
            storage,
        }
    }
}

/// How a step's etcd is to be started, beyond the shared settings.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Run<'p> {
    pub(crate) version: Version,
    pub(crate) storage: Storage,
    pub(crate) data_dir: &'p Path,
    pub(crate) new_cluster: bool,
    /// The data is being walked down to this minor by etcd's downgrade
    /// (its cluster version may be there already).
    pub(crate) downgrading_to: Option<Minor>,
    /// The step writes many entries through this etcd (a lease per TTL
    /// key, every key of a copy): no snapshot after each
    /// (`dialect::snapshots_every_entry`).
    pub(crate) writes_many: bool,
}

impl Run<'_> {
    /// What its etcd must report once it has taken a write.
    fn expected(&self) -> Expected {
        Expected {
            release: self.version,
            lowest: self.downgrading_to.unwrap_or(self.version.minor_line()),
        }
    }

    /// What it serves, for the reads: its release on data in its storage.
    pub(crate) fn served(&self) -> VersionPair {
        VersionPair {
            version: self.version,
            storage: self.storage,
        }
    }
}

impl<L: Launcher, A: EtcdApi, T: Tools, D: Disk> Context<'_, L, A, T, D> {
    /// Starts `run.version` on `run.data_dir` and waits until one write
    /// succeeds: the proof that this release can serve the data. On any
    /// failure the etcd is stopped before returning.
    pub(crate) async fn start_serving(&self, run: Run<'_>) -> Result<Serving<L::Etcd>, Failure> {
        Ok(self.start_serving_after(run, None).await?.0)
    }

    /// [`Context::start_serving`], where the first write also waits for
    /// `offline`, the baseline being hashed meanwhile, which it returns:
    /// the walk of bolt's key bucket reads the db while this etcd loads
    /// it, and a write of ours is what would change the bucket under it.
    pub(crate) async fn start_serving_after(
        &self,
        run: Run<'_>,
        offline: Option<PendingBaseline>,
    ) -> Result<(Serving<L::Etcd>, Option<Fingerprint>), Failure> {
        let data_dir = run.data_dir.to_string_lossy();
        let spec = self.spec(run, &data_dir);
        // Asked for by the v2 reads only: a release without the v2 API
        // (3.6+) has none to make.
        let hidden_v2 = if run.version.has_v2_api() {
            self.launcher.hidden_v2_paths(run.data_dir)
        } else {
            Vec::new()
        };
        let granted = self.granted_leases(run);
        match self.launcher.check_before_launch(run.version).await {
            Ok(()) => {}
            Err(BinError::Interrupted { signal, .. }) => return Err(Failure::Interrupted(signal)),
            Err(err) => return Err(Failure::Step(StepError::Binary(err))),
        }
        let started = Instant::now();
        let mut etcd = self.launcher.launch(&spec)?;
        let pid = etcd.pid();
        log::info(
            "etcd started",
            &[
                ("version", run.version.to_string().into()),
                ("pid", pid.into()),
                ("client", spec.client_url().into()),
                ("data_dir", data_dir.as_ref().into()),
            ],
        );
        let endpoint = spec.client_url();
        let taken = match offline {
            Some(offline) => Some(self.await_baseline(&mut etcd, run, offline).await?),
            None => None,
        };
        self.await_write(&mut etcd, run, &endpoint).await?;
        crate::failpoint!("step-after-health-write");
        if let Err(holder) = etcd.owns_listener(spec.member.client_port) {
            stop_quietly(&mut etcd, pid).await;
            return Err(Failure::Step(StepError::NotOurs {
                version: run.version,
                pid,
                endpoint,
                holder,
            }));
        }
        let serving = Serving {
            etcd,
            pid,
            version: run.version,
            endpoint,
            started,
            healthy_after: started.elapsed(),
            hidden_v2,
            known: KnownLeases::granted_at(&granted, started),
        };
        Ok((serving, taken))
    }

    /// Waits for the baseline being taken `offline` while `etcd` starts,
    /// unless etcd exits, a stop signal comes or the health deadline
    /// passes first. On a failure, etcd is stopped (unless it exited).
    async fn await_baseline(
        &self,
        etcd: &mut L::Etcd,
        run: Run<'_>,
        offline: PendingBaseline,
    ) -> Result<Fingerprint, Failure> {
        let deadline = tokio::time::Instant::now() + self.settings.health_timeout;
        let ended = match self.race(etcd, deadline, offline.wait()).await {
            Race::Done(Ok(taken)) => return Ok(taken),
            Race::Done(Err(reason)) => {
                stop_quietly(etcd, etcd.pid()).await;
                return Err(Failure::Step(StepError::OfflineBaselineLost {
                    version: run.version,
                    reason,
                }));
            }
            Race::Signal(signal) => Race::Signal(signal),
            Race::Exited(status) => Race::Exited(status),
            Race::Deadline => Race::Deadline,
        };
        let waited = "waiting for the baseline being hashed offline".to_string();
        Err(self.write_failure(etcd, run.version, ended, waited).await)
    }

    /// How `run`'s etcd is started: its release's flags on the shared
    /// settings.
    fn spec<'s>(&'s self, run: Run<'_>, data_dir: &'s str) -> StepEtcd<'s> {
        let v2_snap_bytes = crate::ondisk::newest_snap_bytes(run.data_dir);
        StepEtcd {
            version: run.version,
            storage: run.storage,
            member: self.settings.member,
            data_dir,
            new_cluster: run.new_cluster,
            snapshot_every_entry: crate::dialect::snapshots_every_entry(
                v2_snap_bytes,
                run.writes_many,
            ),
        }
    }

    /// Writes the health key until a write succeeds, etcd exits, a stop
    /// signal comes or the health deadline passes; once one is written,
    /// only `/version` is asked until it reports what the step expects
    /// (one write per step, however long etcd takes to raise its cluster
    /// version). On a failure, etcd is stopped (unless it exited).
    async fn await_write(
        &self,
        etcd: &mut L::Etcd,
        run: Run<'_>,
        endpoint: &str,
    ) -> Result<(), Failure> {
        let pid = etcd.pid();
        let value = run.version.to_string();
        let expected = run.expected();
        let deadline = tokio::time::Instant::now() + self.settings.health_timeout;
        let mut last_error = String::from("no attempt finished");
        // A large data dir takes etcd long to load: say so while it does.
        let mut progress = log::Progress::new(
            "health wait",
            log::ProgressUnit::Seconds,
            self.settings.health_timeout.as_secs(),
        );
        let mut attempts = 0u64;
        let mut written = false;
        let ended = loop {
            attempts += 1;
            let attempt = if written {
                self.race(etcd, deadline, self.api.versions(endpoint, expected))
                    .await
            } else {
                self.race(
                    etcd,
                    deadline,
                    self.api.write(endpoint, run.storage, expected),
                )
                .await
            };
            if let Race::Done(Err(HealthError::Written(why))) = &attempt {
                if !written {
                    log::info(
                        "health key written; waiting for etcd's versions",
                        &[
                            ("version", value.as_str().into()),
                            ("pid", pid.into()),
                            ("why", why.as_str().into()),
                        ],
                    );
                }
                written = true;
            }
            let ended = match attempt {
                Race::Done(Ok(())) => return Ok(()),
                Race::Done(Err(HealthError::Refused { reason, remedy })) => {
                    stop_quietly(etcd, pid).await;
                    return Err(Failure::Step(StepError::Refused {
                        version: run.version,
                        pid,
                        reason,
                        remedy,
                    }));
                }
                Race::Done(Err(HealthError::NotYet(err) | HealthError::Written(err))) => {
                    last_error = err;
                    progress.tick(&[
                        ("version", value.as_str().into()),
                        ("pid", pid.into()),
                        ("attempts", attempts.into()),
                        ("last_error", last_error.as_str().into()),
                    ]);
                    self.race(etcd, deadline, tokio::time::sleep(HEALTH_POLL_INTERVAL))
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
        Err(self
            .write_failure(etcd, run.version, ended, last_error)
            .await)
    }

    /// The failure for a wait for a write that `ended` without one.
    async fn write_failure(
        &self,
        etcd: &mut L::Etcd,
        version: Version,
        ended: Race<()>,
        last_error: String,
    ) -> Failure {
        let pid = etcd.pid();
        match ended {
            Race::Signal(signal) => {
                stop_quietly(etcd, pid).await;
                Failure::Interrupted(signal)
            }
            Race::Exited(status) => Failure::Step(StepError::ExitedEarly {
                version,
                pid,
                status,
                output: etcd.recent_output().join("\n"),
            }),
            Race::Deadline | Race::Done(()) => {
                // Stopped first, so the report carries its last words.
                stop_quietly(etcd, pid).await;
                Failure::Step(StepError::HealthTimeout {
                    version,
                    pid,
                    waited: self.settings.health_timeout,
                    last_error,
                    output: etcd.recent_output().join("\n"),
                })
            }
        }
    }

    /// One baseline read: `version` serves the data as recorded (`storage`)
    /// and its keyspace is fingerprinted.
    pub(crate) async fn read_baseline(
        &self,
        version: Version,
        storage: Storage,
        by_hash: bool,
    ) -> Result<Fingerprint, Failure> {
        let started = Instant::now();
        let serve = run(version, storage, self.settings.data_dir);
        let mut serving = self.start_serving(serve).await?;
        let by_hash = if by_hash && storage == Storage::Etcd3 {
            self.read_fingerprint_by_hash(&mut serving).await?
        } else {
            None
        };
        let fingerprint = match by_hash {
            Some(fingerprint) => fingerprint,
            None => self.read_fingerprint(&mut serving, storage).await?,
        };
        crate::failpoint!("baseline-read");
        self.stop_serving(serving).await?;
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

    /// Serves the data with `run`, reads all of it through the API of its
    /// storage (etcd3 data: its v2 side store too; this run's health keys
    /// left out), checks it against `before` (what the last step left), and
    /// stops it. Returns the read and when it was made (TTLs count down
    /// from then).
    pub(crate) async fn read_source(
        &self,
        run: Run<'_>,
        before: Option<&Fingerprint>,
    ) -> Result<(keyspace::Read, Instant), Failure> {
        let mut serving = self.start_serving(run).await?;
        let endpoint = serving.endpoint.clone();
        let hidden = serving.hidden_v2.clone();
        let known = serving.known.clone();
        let read = self
            .while_serving(
                &mut serving,
                "read the keyspace",
                self.api.read_all(&endpoint, run.served(), &hidden, &known),
            )
            .await?;
        let read_at = Instant::now();
        self.check_kept(&mut serving, before, &read.fingerprint)
            .await?;
        self.stop_serving(serving).await?;
        Ok((read, read_at))
    }

    /// Reads the fingerprint of what `serving` serves (see
    /// [`Context::while_serving`] for what ends the read early).
    pub(crate) async fn read_fingerprint(
        &self,
        serving: &mut Serving<L::Etcd>,
        storage: Storage,
    ) -> Result<Fingerprint, Failure> {
        let endpoint = serving.endpoint.clone();
        let hidden = serving.hidden_v2.clone();
        let known = serving.known.clone();
        let served = serving.serves(storage);
        self.while_serving(
            serving,
            "fingerprint the keyspace",
            self.api.fingerprint(&endpoint, served, &hidden, &known),
        )
        .await
    }

    /// The fingerprint of what `serving` serves by etcd's own hash, without
    /// reading the keyspace (`None`: the release has no hash).
    pub(crate) async fn read_fingerprint_by_hash(
        &self,
        serving: &mut Serving<L::Etcd>,
    ) -> Result<Option<Fingerprint>, Failure> {
        let endpoint = serving.endpoint.clone();
        let hidden = serving.hidden_v2.clone();
        self.while_serving(
            serving,
            "fingerprint the keyspace by etcd's hash",
            self.api.fingerprint_by_hash(&endpoint, &hidden),
        )
        .await
    }

    /// [`Context::read_fingerprint`], proven against `before` by etcd's
    /// own hash where it can.
    pub(crate) async fn read_fingerprint_since(
        &self,
        serving: &mut Serving<L::Etcd>,
        storage: Storage,
        before: Option<&Fingerprint>,
    ) -> Result<Fingerprint, Failure> {
        let endpoint = serving.endpoint.clone();
        let hidden = serving.hidden_v2.clone();
        let known = serving.known.clone();
        let served = serving.serves(storage);
        self.while_serving(
            serving,
            "fingerprint the keyspace",
            self.api
                .fingerprint_since(&endpoint, served, &hidden, &known, before),
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

    /// Swaps `copy`, a member dir built in the scratch dir, in for the
    /// data dir's, which then holds `version`'s data in `storage`; the one
    /// end of every step kind that builds a copy.
    pub(crate) fn swap_in(
        &self,
        copy: &Path,
        version: Version,
        storage: Storage,
    ) -> Result<(), Failure> {
        let pair = VersionPair { version, storage };
        self.disk.swap(self.settings.data_dir, copy, pair)?;
        self.launcher.data_replaced(self.settings.data_dir);
        Ok(())
    }

    /// Takes the backup. The copy runs on this thread, so it asks the
    /// termination channel itself, between files and between chunks: a
    /// signal stops it within a chunk's time and removes the partial copy.
    pub(crate) fn back_up(&self, pair: VersionPair) -> Result<(), Failure> {
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
        let path = self
            .disk
            .back_up(self.settings.data_dir, self.settings.backup, pair, &stop)
            .map_err(|err| match err {
                BackupError::Interrupted { signal, .. } => Failure::Interrupted(signal),
                err => Failure::Step(StepError::Backup(err)),
            })?;
        log::info(
            "backup taken",
            &[
                ("path", path.display().to_string().into()),
                ("holds", pair.to_string().into()),
                ("ms", log::ms(started.elapsed())),
                ("verify", backup::tool::verify_command_line(&path).into()),
                (
                    "restore",
                    backup::tool::restore_command_line(self.settings.data_dir, &path).into(),
                ),
            ],
        );
        Ok(())
    }

    /// What `run`'s data records of its leases' TTLs, when `run`'s release
    /// cannot tell them (data under 3.0, whose v3 keyspace may hold leased
    /// keys whatever its storage): read offline, before that etcd starts. A read that fails is logged and leaves them unknown:
    /// the fingerprint then takes every leased key as one that may expire
    /// at any moment, which weakens the check but loses nothing.
    fn granted_leases(&self, run: Run<'_>) -> BTreeMap<i64, i64> {
        if !run.version.has_v3_api() || run.version.has_lease_time_to_live() {
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
    pub(crate) async fn stop_serving(&self, mut serving: Serving<L::Etcd>) -> Result<(), Failure> {
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

    /// Writes into the v2 store `serving` serves each of `entries` whose
    /// TTL, counted from `read_at`, has not run out, with what is left of
    /// it (`what` names the work); says which ran out; returns what it
    /// wrote.
    pub(crate) async fn write_alive_v2(
        &self,
        serving: &mut Serving<L::Etcd>,
        entries: &[Entry],
        read_at: Instant,
        what: &str,
    ) -> Result<Vec<Entry>, Failure> {
        let (to_write, expired) = still_alive(entries, read_at.elapsed().as_secs() as i64);
        report_expired(&expired);
        let endpoint = serving.endpoint.clone();
        self.while_serving(serving, what, self.api.write_all_v2(&endpoint, &to_write))
            .await?;
        Ok(to_write)
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
        let work = self.tools.run(binary, args, env);
        let deadline = tokio::time::sleep(WORK_TIMEOUT);
        tokio::pin!(work, deadline);
        // A snapshot restore or `etcdctl migrate` of a large data dir runs
        // for minutes: say so while it does.
        let mut progress = log::Progress::new(
            "tool wait",
            log::ProgressUnit::Seconds,
            WORK_TIMEOUT.as_secs(),
        );
        let mut ticks = tokio::time::interval(log::PROGRESS_EVERY);
        let result = loop {
            tokio::select! {
                biased;
                signal = termination.wait_for(Option::is_some) => break match signal.ok().and_then(|s| *s) {
                    Some(signal) => return Err(Failure::Interrupted(signal)),
                    None => Err(StepError::WorkTimeout { what: binary.to_string(), waited: WORK_TIMEOUT }),
                },
                _ = &mut deadline => break Err(StepError::WorkTimeout { what: binary.to_string(), waited: WORK_TIMEOUT }),
                result = &mut work => break result,
                _ = ticks.tick() => progress.tick(&[("tool", binary.to_string().into())]),
            }
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

/// How `version` serves the data in `data_dir` as `storage`.
pub(crate) fn run(version: Version, storage: Storage, data_dir: &Path) -> Run<'_> {
    Run {
        version,
        storage,
        data_dir,
        new_cluster: false,
        downgrading_to: None,
        writes_many: false,
    }
}

impl<'p> Run<'p> {
    /// The same run, for a step that writes many entries through it.
    pub(crate) fn writing_many(self) -> Run<'p> {
        Run {
            writes_many: true,
            ..self
        }
    }
}

/// How `version` serves fresh data in `data_dir` as a new cluster.
pub(crate) fn run_new(version: Version, storage: Storage, data_dir: &Path) -> Run<'_> {
    Run {
        new_cluster: true,
        ..run(version, storage, data_dir)
    }
}

/// A failure of a piece of a step's work.
pub(crate) fn work_err(what: &str, detail: impl std::fmt::Display) -> Failure {
    Failure::Step(StepError::Work {
        what: what.to_string(),
        detail: detail.to_string(),
    })
}

/// A copy's failure: a stop signal, or a failure of the work `what`.
pub(crate) fn copy_failure(what: &str, err: BackupError) -> Failure {
    match err {
        BackupError::Interrupted { signal, .. } => Failure::Interrupted(signal),
        err => work_err(what, err),
    }
}

pub(crate) fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| s.to_string()).collect()
}

/// The entries whose TTL has not run out `elapsed` seconds after they
/// were read, each with what is left of it, and the keys of those whose
/// TTL has.
pub(crate) fn still_alive(entries: &[Entry], elapsed: i64) -> (Vec<Entry>, Vec<String>) {
    let mut expired = Vec::new();
    let alive = entries
        .iter()
        .filter_map(|e| match e.ttl {
            Some(ttl) if ttl - elapsed <= 0 => {
                expired.push(String::from_utf8_lossy(&e.key).into_owned());
                None
            }
            ttl => Some(Entry {
                ttl: ttl.map(|ttl| ttl - elapsed),
                ..e.clone()
            }),
        })
        .collect();
    (alive, expired)
}

pub(crate) fn report_expired(expired: &[String]) {
    if expired.is_empty() {
        return;
    }
    let shown: Vec<&str> = expired.iter().take(10).map(String::as_str).collect();
    log::warn(
        "keys whose TTL ran out during the migration are not carried over",
        &[
            ("count", expired.len().into()),
            ("keys", shown.join(",").into()),
        ],
    );
}

/// A test key `key` = `value`, without a lease, with `ttl` seconds left
/// (or none): what the step kinds' unit tests read and write.
#[cfg(test)]
pub(crate) fn test_entry(key: &str, value: &str, ttl: Option<i64>) -> Entry {
    Entry {
        lease: 0,
        key: key.as_bytes().to_vec(),
        value: value.as_bytes().to_vec(),
        ttl,
    }
}
