//! This module owns carrying the pause job out on one member (see the
//! parent module for the job and why it is safe): its old etcd served
//! while the members agree and stop, the converter's graceful stop as
//! leader (the caller then forces and converts its data), the converted
//! data served until every other member joined, and a member's join of
//! the converted cluster. Every wait has a line that names what it waits
//! for, repeated every `PROGRESS_EVERY`; every phase change is recorded
//! in the data dir before it takes effect.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use tokio::sync::watch;

use crate::cluster::client::{self, connect_v3};
use crate::cluster::join::Peer;
use crate::cluster::lock::{Holder, Taken, UpgradeLock, V3Lock};
use crate::cluster::member::SupervisedEtcd;
use crate::cluster::pause::{
    self, fit, keys, v2proof, Go, Job, Phase, Record, Role, Seen, Shrink, Whom,
};
use crate::cluster::peer::{PeerClient, TlsFiles};
use crate::cluster::roll::MemberEtcd;
use crate::datadir;
use crate::log;
use crate::log::error_chain;
use crate::supervisor::{ExitStatus, SupervisorError};
use crate::version::{Minor, Storage, Version, VersionPair};

/// The pause between two rounds while the job waits for its go: on the
/// operator (consent, a member restarted), for as long as it takes.
const ROUND: Duration = Duration::from_millis(500);
/// The pause between two rounds once the job has its go: each phase
/// waits on another member's last one (its word that it leaves, its
/// removal, `served`, the lock, `joined`), and the cluster's writes pause
/// on some of them; a few reads a round, for seconds.
const ROUND_AFTER_GO: Duration = Duration::from_millis(100);
/// How often an unchanged wait is said again.
const PROGRESS_EVERY: Duration = Duration::from_secs(15);
/// What one request may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a member's etcd may take to answer a status request when a
/// joiner asks whether it would answer without it.
const ANSWER_TIMEOUT: Duration = Duration::from_millis(500);
/// How often a job to etcd2 storage that found a key the v2 store cannot
/// hold reads the keyspace again (a whole read: not every round).
const MISFIT_RECHECK: Duration = Duration::from_secs(5);
/// How long a member waits before it starts its etcd again, when that
/// etcd exited during the job ([`Pausing::running_or_started_again`]):
/// a joiner's etcd tries the converter's peer URLs for about as long, so a
/// converter that is away is asked every few seconds, not in a tight loop.
const ETCD_RESTART_AFTER: Duration = Duration::from_secs(2);

/// How the member's part ended.
#[derive(Debug)]
pub enum PauseEnd {
    /// Its etcd exited (or was stopped on request): exit with this code.
    Exit(u8),
    /// The converter took the data: the caller forces it into a
    /// one-member cluster (while it still lists several), runs the route
    /// on it, and then calls [`Pausing::serve_converted`].
    Convert,
    /// The member withdrew its agreement to a job its target no longer
    /// asks for (raised or lowered before the job's go, to a target that
    /// needs no pause); its etcd stopped, its record gone: the caller
    /// starts over with the target as it is now.
    Withdrawn,
}

/// Why the member's part failed.
#[derive(Debug, thiserror::Error)]
pub enum PauseError {
    /// The data dir's record.
    #[error("the pause job's record in {path}: {why}")]
    Record {
        /// The file.
        path: String,
        /// What failed.
        why: String,
    },
    /// Our etcd.
    #[error("this member's etcd: {0}")]
    Etcd(#[from] SupervisorError),
    /// Our etcd exited on its own.
    #[error("this member's etcd {release} exited ({status}) during the pause job {job}; the data dir records the member's part (.etcd-migrate.pause) and the next start carries on from there (see etcd's own lines above for why it exited)")]
    Exited {
        /// The release.
        release: Version,
        /// How.
        status: ExitStatus,
        /// The job.
        job: String,
    },
    /// A joined etcd never proved itself.
    #[error("this member's etcd {release} did not prove itself in the converted cluster within {} s ({why}); it was stopped, the lock released; the next start joins again (its old data is in the backup {backup})", .deadline.as_secs())]
    NotProven {
        /// The release.
        release: Version,
        /// The deadline.
        deadline: Duration,
        /// Why.
        why: String,
        /// The backup.
        backup: String,
    },
    /// The backup of a joining member's old data.
    #[error(
        "{0}; nothing was removed and the member has not joined yet; the next start tries again"
    )]
    Backup(#[from] crate::backup::BackupError),
    /// The data dir.
    #[error("{action} in {path}: {source}")]
    Io {
        /// What.
        action: &'static str,
        /// Where.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A stop request.
    #[error("stopped by {0} during the pause job; this member's etcd was stopped gracefully; the data dir records the member's part and the next start carries on")]
    Interrupted(Signal),
}

/// Why this member's add to the converted cluster failed, and whether to
/// ask again.
struct AddFailed {
    why: String,
    again: bool,
}

/// One member's part in the job, with what it needs to carry it out.
pub struct Pausing {
    /// The job.
    pub job: Job,
    /// The data dir.
    pub data_dir: PathBuf,
    /// What `version.txt` records now.
    pub recorded: VersionPair,
    /// The release that serves the old data.
    pub old_release: Version,
    /// The operator's consent.
    pub consent: bool,
    /// This member (its id in the old cluster, name, advertised URLs).
    pub own: Whom,
    /// The old membership.
    pub members: Vec<Whom>,
    /// The member's peer TLS, when its peer URLs are https.
    pub peer_tls: Option<TlsFiles>,
    /// The member's client TLS, when its client URLs are https.
    pub client_tls: Option<TlsFiles>,
    /// The member's record, as the data dir holds it.
    pub record: Option<Record>,
    /// Whether the member's etcd flags have its target serve the v2 API
    /// (3.4 and 3.5: `--enable-v2=true`), which a job to etcd2 storage
    /// needs.
    pub target_serves_v2: bool,
    /// How long our own etcd may take to serve.
    pub prove_deadline: Duration,
    /// Where backups go, and how many are kept.
    pub backup: crate::backup::BackupPolicy,
    /// A stop request.
    pub termination: watch::Receiver<Option<Signal>>,
    /// The member's target needs no pause (its record is an agreement to
    /// an earlier target's job): withdraw, then end ([`PauseEnd::Withdrawn`]).
    pub withdraw_only: bool,
    /// Whether this run put its agreement: each run puts it once its etcd
    /// answers, even where an earlier run's is there, so the agreement's
    /// revision says how recently this member's etcd started (the
    /// converter asks the freshest to stop first, [`pause::leaves_first`]).
    pub(super) agreed_this_run: bool,
    /// When this run last read the keyspace to check it fits the v2
    /// store (a job to etcd2), and what did not fit.
    pub(super) misfit: Option<(Instant, Option<String>)>,
}

/// What a wait is for, said once and then every [`PROGRESS_EVERY`].
struct Reporter {
    last: Option<(String, Instant)>,
}

impl Reporter {
    fn new() -> Self {
        Reporter { last: None }
    }

    fn wait(&mut self, job: &str, why: &str) {
        let due = match &self.last {
            Some((last, at)) => last != why || at.elapsed() >= PROGRESS_EVERY,
            None => true,
        };
        if due {
            log::info(
                "pause job waits",
                &[("job", job.into()), ("for", why.into())],
            );
            self.last = Some((why.to_string(), Instant::now()));
        }
    }
}

impl Pausing {
    fn record_path(&self) -> String {
        self.data_dir
            .join(datadir::PAUSE_FILE)
            .display()
            .to_string()
    }

    /// Records `record` durably, as ours from now on.
    fn write(&mut self, record: Record) -> Result<(), PauseError> {
        datadir::write_pause(&self.data_dir, &record.to_json()).map_err(|e| {
            PauseError::Record {
                path: self.record_path(),
                why: e.to_string(),
            }
        })?;
        log::info(
            "pause job recorded",
            &[
                ("job", record.job.as_str().into()),
                ("phase", format!("{:?}", record.phase).into()),
            ],
        );
        self.record = Some(record);
        Ok(())
    }

    /// Our record moved to `phase` (and changed by `change`).
    fn advance(
        &mut self,
        phase: Phase,
        change: impl FnOnce(&mut Record),
    ) -> Result<(), PauseError> {
        let mut record = self.record.clone().unwrap_or_else(|| self.fresh_record());
        record.phase = phase;
        change(&mut record);
        self.write(record)
    }

    fn fresh_record(&self) -> Record {
        Record {
            job: self.job.id.clone(),
            target: self.job.target.to_string(),
            from: self.recorded.to_string(),
            phase: Phase::Agreed,
            go: None,
            converter: None,
            own_id: self.own.id,
            backup: None,
            members: self.members.clone(),
        }
    }

    /// The backup of the converter's data before it converts, once taken
    /// (a restart does not take it again).
    pub fn backup_taken(&self) -> Option<String> {
        self.record.as_ref().and_then(|r| r.backup.clone())
    }

    /// Records the converter's backup.
    pub fn note_backup(&mut self, path: &Path) -> Result<(), PauseError> {
        let phase = self.phase().unwrap_or(Phase::Converting);
        let path = path.display().to_string();
        self.advance(phase, |r| r.backup = Some(path))
    }

    fn phase(&self) -> Option<Phase> {
        self.record.as_ref().map(|r| r.phase)
    }

    fn name_of(&self, id: u64) -> String {
        self.members
            .iter()
            .find(|m| m.id == id)
            .map_or_else(|| format!("{id:x}"), |m| format!("{} ({id:x})", m.name))
    }

    fn names(&self, ids: &[u64]) -> String {
        ids.iter()
            .map(|id| self.name_of(*id))
            .collect::<Vec<_>>()
            .join(", ")
    }

    fn stop_requested(&self) -> Option<Signal> {
        *self.termination.borrow()
    }

    /// Carries the member's part on from where its record says (see
    /// [`PauseEnd`]); `etcd` runs the member with the user's arguments.
    pub async fn run(&mut self, etcd: &mut SupervisedEtcd) -> Result<PauseEnd, PauseError> {
        if self.withdraw_only && self.withdraw_through_others().await? {
            return Ok(PauseEnd::Withdrawn);
        }
        let mut next = match self.phase() {
            None | Some(Phase::Agreed) => Next::ServeOld,
            Some(Phase::Converting) => Next::Convert,
            Some(Phase::Stopping | Phase::Joining) => Next::Join,
            Some(Phase::Serving) => return self.serve_converted(etcd).await,
        };
        loop {
            next = match next {
                Next::ServeOld => self.serve_old(etcd).await?,
                Next::Join => self.join(etcd).await?,
                Next::Convert => return Ok(PauseEnd::Convert),
                Next::Exit(code) => return Ok(PauseEnd::Exit(code)),
                Next::Withdrawn => return Ok(PauseEnd::Withdrawn),
            };
        }
    }

    /// Serves the old data as a member of the old cluster while the
    /// members agree and stop; ends when this member stopped for the job
    /// (then it joins) or took the data (the converter).
    async fn serve_old(&mut self, etcd: &mut SupervisedEtcd) -> Result<Next, PauseError> {
        let release = self.old_release;
        // A roll that ended where this job begins hands its etcd over
        // running (`Plan::then_pause`): it serves on.
        if !etcd.runs(release) {
            etcd.start(release).await?;
        }
        log::info(
            "pause job: this member serves its recorded release while the members agree",
            &[
                ("job", self.job.id.as_str().into()),
                ("release", release.to_string().into()),
                ("consent", self.consent.into()),
            ],
        );
        let peer = PeerClient::new(self.peer_tls.as_ref(), REQUEST_TIMEOUT)
            .map_err(|e| self.io_like("the peer client", e))?;
        let mut client: Option<etcd_client::Client> = None;
        let mut reporter = Reporter::new();
        let mut leaving = false;
        loop {
            if let Some(signal) = self.stop_requested() {
                etcd.stop().await?;
                return Err(PauseError::Interrupted(signal));
            }
            if let Some(status) = etcd.exited() {
                // A member that said it leaves is being removed: etcd
                // stops by itself once it is, and the converter may be
                // converting already (its peer URL silent). Its old data
                // never serves again either way.
                if leaving || self.removed().await {
                    return self.stop_for_job(etcd).await;
                }
                return Err(PauseError::Exited {
                    release,
                    status,
                    job: self.job.id.clone(),
                });
            }
            if client.is_none() {
                client = connect_v3(
                    &self.own.client_urls,
                    self.client_tls.as_ref(),
                    REQUEST_TIMEOUT,
                )
                .await
                .ok();
            }
            let Some(c) = client.as_mut() else {
                reporter.wait(
                    &self.job.id,
                    "this member's etcd to answer on its client URL",
                );
                self.sleep().await;
                continue;
            };
            if let Some(why) = self.withdraw_stale(c).await? {
                reporter.wait(&self.job.id, &why);
                self.sleep().await;
                continue;
            }
            if self.withdraw_only && self.record.is_none() {
                // Withdrawn (with no go, the job cannot happen without
                // this member): the target as it is now takes over, from
                // the old data, which never stopped being the cluster's.
                etcd.stop_gracefully().await?;
                log::info(
                    "pause job: this member's target needs no pause any more; its etcd stopped and the new target takes over",
                    &[("target", self.job.target.to_string().into())],
                );
                return Ok(Next::Withdrawn);
            }
            let read = keys::read(c, &self.job.id, false).await;
            let seen = match read {
                Ok(seen) => seen,
                Err(why) => {
                    if self.removed().await {
                        return self.stop_for_job(etcd).await;
                    }
                    reporter.wait(
                        &self.job.id,
                        &format!("the old cluster to answer a read of the job's keys ({why})"),
                    );
                    client = None;
                    self.sleep().await;
                    continue;
                }
            };
            let Some(go) = seen.go.clone() else {
                if let Some(why) = self.before_go(c, &peer, &seen).await? {
                    reporter.wait(&self.job.id, &why);
                }
                self.sleep().await;
                continue;
            };
            if self.record.as_ref().and_then(|r| r.go.as_ref()).is_none() {
                let converter = self.members.iter().find(|m| m.id == go.converter).cloned();
                self.advance(Phase::Agreed, |r| {
                    r.go = Some(go.clone());
                    r.converter = converter;
                })?;
                log::info(
                    if go.converter == self.own.id {
                        "pause job: go; this member carries the data"
                    } else {
                        "pause job: go"
                    },
                    &[
                        ("job", self.job.id.as_str().into()),
                        ("converter", self.name_of(go.converter).into()),
                    ],
                );
            }
            match go.role(self.own.id) {
                Role::Other => {
                    leaving = seen.stopping.contains(&self.own.id);
                    // Before its word that it leaves: the converter picks
                    // the member to stop first once every word is in.
                    if let Err(why) = self.agree(c, &seen).await {
                        reporter.wait(
                            &self.job.id,
                            &format!(
                                "the old cluster to take this member's agreement again ({why})"
                            ),
                        );
                        self.sleep().await;
                        continue;
                    }
                    if !leaving {
                        let key = keys::stopping_key(&self.job.id, self.own.id);
                        if let Err(why) = keys::put(c, &key, "{}").await {
                            reporter.wait(
                                &self.job.id,
                                &format!("the old cluster to take this member's word that it leaves ({why})"),
                            );
                            self.sleep().await;
                            continue;
                        }
                        log::info(
                            "pause job: this member leaves the old cluster (the converter removes it)",
                            &[("job", self.job.id.as_str().into())],
                        );
                        leaving = true;
                    }
                    if self.removed().await {
                        return self.stop_for_job(etcd).await;
                    }
                    if seen.leave_now.contains(&self.own.id) {
                        log::info(
                            "pause job: the converter asked this member to stop before its removal (etcd removes a member that is down at once)",
                            &[("job", self.job.id.as_str().into())],
                        );
                        return self.stop_for_job(etcd).await;
                    }
                    if let Some(why) = self.hand_over_leadership(c, &peer, etcd).await? {
                        reporter.wait(&self.job.id, &why);
                        client = None;
                        self.sleep().await;
                        continue;
                    }
                    reporter.wait(
                        &self.job.id,
                        &format!(
                            "{} to remove this member from the old cluster",
                            self.name_of(go.converter)
                        ),
                    );
                }
                Role::Outside => reporter.wait(
                    &self.job.id,
                    "nothing: this member is not in the job's go (it joined the cluster after it); it keeps serving",
                ),
                Role::Converter => match self.take(c, &peer, &seen, etcd).await? {
                    Taking::Taken => return Ok(Next::Convert),
                    Taking::Waiting(why) => reporter.wait(&self.job.id, &why),
                },
            }
            self.sleep().await;
        }
    }

    /// Withdraws this member's agreement through the other members'
    /// client URLs, its own etcd not started: the target that needs no
    /// pause then starts it once, as its own path does (a start here and
    /// a stop after the withdrawal would take this member down twice, the
    /// second time while the operator may be restarting another). `false`
    /// when the others did not take it (they lack a quorum without this
    /// member, or the job has its go): the withdrawal goes on with this
    /// member's etcd serving ([`Pausing::serve_old`]).
    async fn withdraw_through_others(&mut self) -> Result<bool, PauseError> {
        let endpoints: Vec<String> = self
            .members
            .iter()
            .filter(|m| m.id != self.own.id)
            .flat_map(|m| m.client_urls.iter().cloned())
            .collect();
        let Ok(mut client) =
            connect_v3(&endpoints, self.client_tls.as_ref(), REQUEST_TIMEOUT).await
        else {
            return Ok(false);
        };
        let withdrawn = self.withdraw_stale(&mut client).await?.is_none() && self.record.is_none();
        if withdrawn {
            log::info(
                "pause job: this member's target needs no pause any more; the new target takes over",
                &[("target", self.job.target.to_string().into())],
            );
        }
        Ok(withdrawn)
    }

    /// An agreement to another job (the member was restarted with
    /// another target): withdrawn while that job has no go, and the
    /// record goes; with a go, the member is bound to it. Returns what
    /// the member waits for when the old cluster did not answer.
    async fn withdraw_stale(
        &mut self,
        client: &mut etcd_client::Client,
    ) -> Result<Option<String>, PauseError> {
        let Some(record) = self.record.clone() else {
            return Ok(None);
        };
        if record.job == self.job.id {
            return Ok(None);
        }
        match keys::withdraw(client, &record.job, self.own.id).await {
            Ok(true) => {
                datadir::remove_pause(&self.data_dir).map_err(|e| PauseError::Record {
                    path: self.record_path(),
                    why: e.to_string(),
                })?;
                log::info(
                    "pause job: this member withdrew its agreement to an earlier job (its target changed before that job's go)",
                    &[
                        ("withdrawn", record.job.as_str().into()),
                        ("job", self.job.id.as_str().into()),
                    ],
                );
                self.record = None;
                Ok(None)
            }
            Ok(false) => {
                let target = record.target().map_err(|why| PauseError::Record {
                    path: self.record_path(),
                    why,
                })?;
                log::warn(
                    "pause job: the job this member agreed to has its go already; it carries on with that job, and the new target comes after it",
                    &[
                        ("job", record.job.as_str().into()),
                        ("target", target.to_string().into()),
                    ],
                );
                self.job = Job {
                    id: record.job.clone(),
                    target,
                };
                Ok(None)
            }
            Err(why) => Ok(Some(format!(
                "the old cluster to take this member's withdrawal from job {} ({why})",
                record.job
            ))),
        }
    }

    /// Before the go: agree (with consent), and write the go once every
    /// member agreed and is up. Returns what the member waits for.
    async fn before_go(
        &mut self,
        client: &mut etcd_client::Client,
        peer: &PeerClient,
        seen: &Seen,
    ) -> Result<Option<String>, PauseError> {
        if self.job.target.version.minor_line() < pause::JOB_FLOOR {
            // The converted cluster takes the joins and the job's keys
            // through the v3 API, as the old one does.
            return Ok(Some(format!(
                "nothing: a cluster is not taken to {} by a pause job (the job speaks etcd's v3 API to the converted cluster, and the members' client cannot speak 3.0's gRPC over TLS); keep TARGET_VERSION at {} or later (this member serves {} meanwhile), or take one member there alone and add the others back to it (docs/cluster-pause.md, \"By hand\")",
                self.job.target, pause::JOB_FLOOR, self.old_release
            )));
        }
        if !self.consent {
            return Ok(Some(format!(
                "the operator's consent: {} -> {} pauses the whole cluster's writes for a moment (no cluster takes it member by member); set ALLOW_CLUSTER_PAUSE=1 (or --allow-cluster-pause) on every member, or keep TARGET_VERSION/TARGET_STORAGE at {}; this member serves {} meanwhile",
                self.recorded, self.job.target, self.recorded, self.old_release
            )));
        }
        // Before this member agrees: without it, it could not be proven
        // once joined.
        if self.job.target.storage == Storage::Etcd2 && !self.target_serves_v2 {
            return Ok(Some(format!(
                "--enable-v2=true in this member's etcd flags (or ETCD_ENABLE_V2=true): etcd {} serves etcd2 data, and proves a joined member, through the v2 API, which it serves only when asked; or keep TARGET_STORAGE at {} (this member serves {} meanwhile)",
                self.job.target.version, self.recorded.storage, self.old_release
            )));
        }
        if self.record.is_none() {
            // Durably ours before the cluster hears of it: a restart finds
            // the job even if the agreement was the last thing written.
            let record = self.fresh_record();
            self.write(record)?;
        }
        if let Err(why) = self.agree(client, seen).await {
            return Ok(Some(format!(
                "the old cluster to take this member's agreement ({why})"
            )));
        }
        let ids: Vec<u64> = self.members.iter().map(|m| m.id).collect();
        let mut missing = pause::not_agreed(&ids, seen);
        missing.retain(|id| *id != self.own.id);
        if !missing.is_empty() {
            return Ok(Some(format!(
                "{} to agree (each needs TARGET_VERSION/TARGET_STORAGE = {} and ALLOW_CLUSTER_PAUSE=1, and its entrypoint restarted with them)",
                self.names(&missing),
                self.job.target
            )));
        }
        // Every member up, at a cluster version with MoveLeader.
        let mut down = Vec::new();
        let mut cluster = None;
        for member in &self.members {
            let url = member.peer_urls.first().cloned().unwrap_or_default();
            match peer.version(&url).await {
                Ok(info) => cluster = cluster.or(info.cluster),
                Err(_) => down.push(member.id),
            }
        }
        if !down.is_empty() {
            return Ok(Some(format!(
                "{} to answer on its peer URL",
                self.names(&down)
            )));
        }
        let cluster = match cluster {
            Some(cv) if cv >= pause::JOB_FLOOR => cv,
            other => {
                return Ok(Some(format!(
                    "a cluster version of {} or later (it is {}): the job speaks etcd's v3 API and needs a leader that hands its leadership over; roll the cluster to {} first with the storage kept",
                    pause::JOB_FLOOR,
                    other.map_or_else(|| "not decided".to_string(), |m| m.to_string()),
                    pause::JOB_FLOOR,
                )))
            }
        };
        let leader = match client.status().await {
            Ok(status) => status.leader(),
            Err(e) => {
                return Ok(Some(format!(
                    "this member's etcd to tell its status ({})",
                    error_chain(&e)
                )))
            }
        };
        if !pause::may_write_go(cluster, leader == self.own.id) {
            return Ok(Some(format!(
                "{} to write the go: at cluster version {cluster} (no MoveLeader) the leader carries the data",
                self.name_of(leader)
            )));
        }
        if self.job.target.storage != self.recorded.storage {
            // Held here, before anything stops, rather than refused at a
            // member's restart or by the converter's step once the
            // cluster has paused (`fit`). A whole read of the keyspace:
            // once per MISFIT_RECHECK while it fails.
            let recent = self
                .misfit
                .as_ref()
                .filter(|(at, _)| at.elapsed() < MISFIT_RECHECK)
                .map(|(_, why)| why.clone());
            let why = match recent {
                Some(why) => why,
                None => {
                    let found = match self.job.target.storage {
                        Storage::Etcd2 => fit::v2_misfit(client).await,
                        Storage::Etcd3 => self.v3_clash(client).await,
                    };
                    let why = match found {
                        Ok(None) => None,
                        Ok(Some(why)) => Some(format!(
                            "the keyspace to fit {} storage: {why}; or keep TARGET_STORAGE at {} (this member serves {} meanwhile)",
                            self.job.target.storage, self.recorded.storage, self.old_release
                        )),
                        Err(why) => Some(format!(
                            "the old cluster to answer a read of its keyspace, to check it fits {} storage ({why})",
                            self.job.target.storage
                        )),
                    };
                    self.misfit = Some((Instant::now(), why.clone()));
                    why
                }
            };
            if let Some(why) = why {
                return Ok(Some(why));
            }
        }
        let go = Go::new(
            pause::converter_at_go(self.own.id, leader, &ids, cluster),
            &ids,
        );
        match keys::write_go(client, &self.job.id, &ids, &go).await {
            Ok(true) => log::info(
                "pause job: every member agreed; this member wrote the go",
                &[
                    ("job", self.job.id.as_str().into()),
                    ("converter", self.name_of(go.converter).into()),
                ],
            ),
            Ok(false) => {}
            Err(why) => return Ok(Some(format!("the old cluster to take the go ({why})"))),
        }
        Ok(None)
    }

    /// [`fit::v3_clash`] through this member's own etcd (the old
    /// cluster's v2 store is the same on every member).
    async fn v3_clash(&self, client: &mut etcd_client::Client) -> Result<Option<String>, String> {
        let http = crate::cluster::peer::http_client(self.client_tls.as_ref(), REQUEST_TIMEOUT)
            .map_err(|e| e.to_string())?;
        let endpoint = self
            .own
            .client_urls
            .first()
            .ok_or("this member has no client URL")?;
        fit::v3_clash(client, &http, endpoint).await
    }

    /// Puts this member's agreement, where it is not there or this run has
    /// not put it yet: its revision then says how recently this member's
    /// etcd started ([`pause::leaves_first`]), also after the go (a member
    /// whose etcd came back just as every agreement was in).
    async fn agree(&mut self, client: &mut etcd_client::Client, seen: &Seen) -> Result<(), String> {
        let agreed_before = seen.agreed.contains(&self.own.id);
        if agreed_before && self.agreed_this_run {
            return Ok(());
        }
        let value = serde_json::json!({
            "name": self.own.name,
            "target": self.job.target.to_string(),
        })
        .to_string();
        keys::put(client, &keys::agree_key(&self.job.id, self.own.id), &value).await?;
        self.agreed_this_run = true;
        log::info(
            if agreed_before {
                "pause job: this member agreed again (its etcd started anew)"
            } else {
                "pause job: this member agreed"
            },
            &[("job", self.job.id.as_str().into())],
        );
        Ok(())
    }

    /// Before etcd2 data is converted: removes the cluster mode's own
    /// records from the old cluster's v2 store (`/etcd-migrate/`: a roll
    /// of the etcd2 cluster below 3.1 announced and proved itself there,
    /// and kept doing so in v3 after). They name members the job replaces,
    /// and the storage migration would write each over its v3 twin (it
    /// refuses to lose either value). The converter is the old cluster's
    /// only member here; a delete of what is gone already is done.
    ///
    /// Again once every member joined a converted cluster on etcd2
    /// storage: an etcd3 → etcd2 conversion copies every v3 key, the
    /// cluster mode's records with them (the job's own keys among them,
    /// which a restarted converter reads, so they stay in v3 until the
    /// take); the v2 copies go with the job.
    async fn forget_v2_records(&self, when: &'static str) -> Result<(), String> {
        let http = crate::cluster::peer::http_client(self.client_tls.as_ref(), REQUEST_TIMEOUT)
            .map_err(|e| e.to_string())?;
        let mut last = String::from("no client URL");
        for endpoint in &self.own.client_urls {
            let url = format!(
                "{}/v2/keys{}?dir=true&recursive=true",
                endpoint.trim_end_matches('/'),
                crate::cluster::RECORDS_DIR
            );
            match http.delete(&url).send().await {
                Ok(response)
                    if response.status().is_success() || response.status().as_u16() == 404 =>
                {
                    if response.status().is_success() {
                        log::info(
                            "pause job: removed the cluster mode's records from the v2 store",
                            &[("job", self.job.id.as_str().into()), ("when", when.into())],
                        );
                    }
                    return Ok(());
                }
                Ok(response) => last = format!("{url}: {}", response.status()),
                Err(e) => last = format!("{url}: {}", error_chain(&e)),
            }
        }
        Err(last)
    }

    /// The converter's round: leader first (the removals then never
    /// cost a leadership), then every other member removed once it said
    /// it leaves; alone in the membership, its log holds every committed
    /// write and it knows them committed: it stops, and the cluster's
    /// writes pause from there.
    async fn take(
        &mut self,
        client: &mut etcd_client::Client,
        peer: &PeerClient,
        seen: &Seen,
        etcd: &mut SupervisedEtcd,
    ) -> Result<Taking, PauseError> {
        let status = match client.status().await {
            Ok(status) => status,
            Err(e) => {
                return Ok(Taking::Waiting(format!(
                    "this member's etcd to tell its status ({})",
                    error_chain(&e)
                )))
            }
        };
        let leader = status.leader();
        if leader != self.own.id && self.old_release.minor_line() < pause::MOVE_LEADER_FLOOR {
            // No MoveLeader: the member that leads hands it over by a
            // graceful restart of its etcd (`pause::hands_leadership_over`).
            return Ok(Taking::Waiting(format!(
                "the leadership back from {}: below {} there is no MoveLeader; that member's entrypoint hands it over by restarting its etcd gracefully (etcd then transfers it)",
                self.name_of(leader),
                pause::MOVE_LEADER_FLOOR
            )));
        }
        if leader != self.own.id {
            let url = self
                .members
                .iter()
                .find(|m| m.id == leader)
                .and_then(|m| m.client_urls.first().cloned());
            let Some(url) = url else {
                return Ok(Taking::Waiting(format!(
                    "a leader whose client URL is known (the leader is {})",
                    self.name_of(leader)
                )));
            };
            let moved = match connect_v3(&[url], self.client_tls.as_ref(), REQUEST_TIMEOUT).await {
                Ok(mut at_leader) => at_leader
                    .move_leader(self.own.id)
                    .await
                    .map(|_| ())
                    .map_err(|e| error_chain(&e)),
                Err(e) => Err(e.to_string()),
            };
            return Ok(Taking::Waiting(match moved {
                Ok(()) => format!(
                    "leadership from {} (moved to this member)",
                    self.name_of(leader)
                ),
                Err(why) => format!("leadership from {} ({why})", self.name_of(leader)),
            }));
        }
        let listed = match client.member_list().await {
            Ok(list) => list.members().to_vec(),
            Err(e) => {
                return Ok(Taking::Waiting(format!(
                    "the old cluster's membership ({})",
                    error_chain(&e)
                )))
            }
        };
        let membership: Vec<u64> = listed.iter().map(|m| m.id()).collect();
        match pause::shrink(self.own.id, &membership, seen) {
            Shrink::Wait(ids) => Ok(Taking::Waiting(format!(
                "{} to say it leaves (its entrypoint sees the job's go)",
                self.names(&ids)
            ))),
            Shrink::Remove(id) => {
                if let Err(e) = client.member_remove(id).await {
                    let why = error_chain(&e);
                    if why.contains("unhealthy cluster") {
                        return self.leave_first(client, peer, &listed, seen, id, why).await;
                    }
                    return Ok(Taking::Waiting(format!(
                        "the removal of {} from the old cluster ({why})",
                        self.name_of(id),
                    )));
                }
                log::info(
                    "pause job: removed a member from the old cluster (it joins the converted one)",
                    &[
                        ("job", self.job.id.as_str().into()),
                        ("member", self.name_of(id).into()),
                        ("left", (membership.len() - 1).into()),
                    ],
                );
                Ok(Taking::Waiting("the next removal".to_string()))
            }
            Shrink::Alone => {
                let forgotten = if self.recorded.storage == Storage::Etcd2 {
                    self.forget_v2_records("the old cluster's, before the conversion")
                        .await
                } else {
                    Ok(())
                };
                if let Err(why) = forgotten {
                    return Ok(Taking::Waiting(format!(
                        "the removal of the cluster mode's v2 records from the old cluster ({why})"
                    )));
                }
                self.advance(Phase::Converting, |_| {})?;
                log::info(
                    "pause job: this member is the old cluster's only member and holds every committed write; it stops and converts its data: the cluster's writes pause from here",
                    &[("job", self.job.id.as_str().into())],
                );
                let graceful = etcd.stop_gracefully().await?;
                if !graceful {
                    log::warn(
                        "pause job: this member's etcd did not stop gracefully; its WAL is what etcd synced",
                        &[],
                    );
                }
                Ok(Taking::Taken)
            }
        }
    }

    /// etcd refused to remove `refused`, running, while the cluster
    /// settles (`why`): asks one member that said it leaves to stop first
    /// where that is safe ([`pause::leaves_first`]: every member answers
    /// on its peer URL, none asked is still in the membership), since
    /// etcd removes a member that is down at once; else waits for etcd.
    async fn leave_first(
        &self,
        client: &mut etcd_client::Client,
        peer: &PeerClient,
        listed: &[etcd_client::Member],
        seen: &Seen,
        refused: u64,
        why: String,
    ) -> Result<Taking, PauseError> {
        let all_answer = self.silent(peer, listed).await.is_empty();
        let membership: Vec<u64> = listed.iter().map(|m| m.id()).collect();
        let waiting = format!(
            "the removal of {} from the old cluster ({why}: etcd removes a running member only once every member has been connected for 5 s)",
            self.name_of(refused)
        );
        let Some(id) = pause::leaves_first(
            self.own.id,
            &membership,
            seen,
            all_answer,
            self.old_release.minor_line(),
        ) else {
            return Ok(Taking::Waiting(waiting));
        };
        if let Err(e) = keys::put(client, &keys::leave_now_key(&self.job.id, id), "{}").await {
            return Ok(Taking::Waiting(format!(
                "{waiting}; asking {} to stop first: {e}",
                self.name_of(id)
            )));
        }
        log::info(
            "pause job: etcd removes a running member only once every member has been connected for 5 s; asked one that leaves to stop first (one that is down goes at once)",
            &[
                ("job", self.job.id.as_str().into()),
                ("member", self.name_of(id).into()),
            ],
        );
        Ok(Taking::Waiting(format!(
            "{} to stop before its removal",
            self.name_of(id)
        )))
    }

    /// Below 3.3 (no `MoveLeader`), a member the converter removes that
    /// leads the old cluster hands the leadership over: it restarts its
    /// etcd gracefully on the same data, and a 3.1/3.2 etcd stopping on
    /// SIGTERM transfers its leadership to a connected peer first (if that
    /// is not the converter, the new leader does the same). Only while
    /// every other member of the old cluster answers, so the restart costs
    /// it one member, never two. `Some(why)` when this member leads (it
    /// restarted, or waits to): the round's wait.
    async fn hand_over_leadership(
        &mut self,
        client: &mut etcd_client::Client,
        peer: &PeerClient,
        etcd: &mut SupervisedEtcd,
    ) -> Result<Option<String>, PauseError> {
        let cluster = self.old_release.minor_line();
        if cluster >= pause::MOVE_LEADER_FLOOR {
            return Ok(None);
        }
        let leads = match client.status().await {
            Ok(status) => status.leader() == self.own.id,
            Err(_) => false,
        };
        if !leads {
            return Ok(None);
        }
        let membership = match client.member_list().await {
            Ok(list) => list.members().to_vec(),
            Err(e) => {
                return Ok(Some(format!(
                    "the old cluster's membership, to hand this member's leadership over ({})",
                    error_chain(&e)
                )))
            }
        };
        let silent = self.silent(peer, &membership).await;
        if !pause::hands_leadership_over(cluster, Role::Other, leads, silent.is_empty()) {
            return Ok(Some(format!(
                "{} to answer on its peer URL: this member leads the old cluster and hands the leadership over to the converter by a graceful restart, which must not be the second member down",
                self.names(&silent)
            )));
        }
        log::info(
            "pause job: this member leads the old cluster but does not carry the data; it restarts its etcd gracefully, which hands the leadership over (below 3.3 there is no MoveLeader)",
            &[
                ("job", self.job.id.as_str().into()),
                ("release", self.old_release.to_string().into()),
            ],
        );
        let graceful = etcd.stop_gracefully().await?;
        if !graceful {
            log::warn(
                "pause job: this member's etcd did not stop gracefully; the cluster elects a leader itself",
                &[],
            );
        }
        etcd.start(self.old_release).await?;
        Ok(Some(
            "this member's etcd, restarted to hand the leadership over, to answer".to_string(),
        ))
    }

    /// The members of `listed` but this one that answer on none of their
    /// peer URLs.
    async fn silent(&self, peer: &PeerClient, listed: &[etcd_client::Member]) -> Vec<u64> {
        let mut silent = Vec::new();
        for member in listed.iter().filter(|m| m.id() != self.own.id) {
            let mut answers = false;
            for url in member.peer_urls() {
                if peer.version(url).await.is_ok() {
                    answers = true;
                    break;
                }
            }
            if !answers {
                silent.push(member.id());
            }
        }
        silent
    }

    /// Whether the converter removed this member: the converter's etcd
    /// lists, through its client API, a membership without it (the old
    /// cluster's after the removal, or the converted cluster's, which
    /// this member has not joined yet). Through the client API, never the
    /// peer `/members`, which a converter restarted that moment answers
    /// from the middle of its log's replay ([`client::membership`]).
    async fn removed(&self) -> bool {
        let Some(go) = self.record.as_ref().and_then(|r| r.go.as_ref()) else {
            return false;
        };
        if go.role(self.own.id) != Role::Other {
            return false;
        }
        let Some(converter) = self.members.iter().find(|m| m.id == go.converter) else {
            return false;
        };
        match client::membership(
            &converter.client_urls,
            self.client_tls.as_ref(),
            REQUEST_TIMEOUT,
        )
        .await
        {
            Ok(members) => !members.iter().any(|m| m.id == self.own.id),
            Err(_) => false,
        }
    }

    /// Records that this member left the old cluster for the job (its old
    /// data never serves again), stops its etcd (etcd stops by itself
    /// once removed), and joins.
    async fn stop_for_job(&mut self, etcd: &mut SupervisedEtcd) -> Result<Next, PauseError> {
        self.advance(Phase::Stopping, |_| {})?;
        let status = etcd.stop().await?;
        log::info(
            "pause job: this member left the old cluster; its old etcd stopped",
            &[
                ("job", self.job.id.as_str().into()),
                ("status", status.to_string().into()),
            ],
        );
        Ok(Next::Join)
    }

    async fn sleep(&mut self) {
        let mut termination = self.termination.clone();
        let round = if self.record.as_ref().is_some_and(|r| r.go.is_some()) {
            ROUND_AFTER_GO
        } else {
            ROUND
        };
        tokio::select! {
            _ = tokio::time::sleep(round) => {}
            _ = termination.changed() => {}
        }
    }

    fn io_like(&self, action: &'static str, e: impl std::fmt::Display) -> PauseError {
        PauseError::Io {
            action,
            path: self.data_dir.display().to_string(),
            source: std::io::Error::other(e.to_string()),
        }
    }

    fn converter(&self) -> Option<Whom> {
        self.record.as_ref().and_then(|r| r.converter.clone())
    }

    /// Joins the converted cluster (it left the old one): waits until the
    /// converter serves, backs its old data up, and then,
    /// under the new cluster's lock, removes it, adds itself, starts the
    /// target on the empty data dir and proves it.
    async fn join(&mut self, etcd: &mut SupervisedEtcd) -> Result<Next, PauseError> {
        let Some(converter) = self.converter() else {
            return Err(PauseError::Record {
                path: self.record_path(),
                why: "it names no converter (it was written before the go)".to_string(),
            });
        };
        let target = self.job.target.version;
        let mut reporter = Reporter::new();
        // Where the converted cluster is asked: the converter's client URLs.
        let endpoints = converter.client_urls.clone();
        loop {
            if let Some(signal) = self.stop_requested() {
                return Err(PauseError::Interrupted(signal));
            }
            let served =
                match connect_v3(&endpoints, self.client_tls.as_ref(), REQUEST_TIMEOUT).await {
                    // Serializable: the converter applied `served` alone,
                    // and a joiner that died half-joined leaves it without
                    // a quorum until that joiner is back.
                    Ok(mut c) => c
                        .get(
                            keys::served_key(&self.job.id),
                            Some(etcd_client::GetOptions::new().with_serializable()),
                        )
                        .await
                        .map(|r| !r.kvs().is_empty())
                        .unwrap_or(false),
                    Err(_) => false,
                };
            if served {
                break;
            }
            reporter.wait(
                &self.job.id,
                &format!(
                    "{} to serve the converted data ({}); this member joins it then",
                    converter.name, self.job.target
                ),
            );
            self.sleep().await;
        }
        if self.phase() == Some(Phase::Joining)
            && datadir::inspect(&self.data_dir).ok()
                == Some(datadir::DirState::Recorded(self.job.target))
        {
            // Joined before a restart: the data is the converted cluster's.
            etcd.start(target).await?;
            return self
                .finish_join(etcd, &endpoints, None, None, None)
                .await
                .map(Next::Exit);
        }
        if self.phase() == Some(Phase::Joining) {
            if let Some((mut resumed, learner)) = self.resume_join(etcd, &converter).await? {
                // Our entry is in the converted cluster already: as a voter
                // it counts us, and may have no quorum until our etcd is
                // back, so neither the lock nor a membership call comes
                // first.
                resumed.start(target).await?;
                let outcome = self
                    .finish_join(&mut resumed, &endpoints, None, learner, None)
                    .await;
                if outcome.is_err() {
                    let _ = resumed.stop().await;
                }
                return outcome.map(Next::Exit);
            }
        }
        if self.phase() == Some(Phase::Stopping) {
            // Retired: the old data is never served again (the member
            // joins with an empty `member/`), so the backup may take its
            // files themselves, while the cluster waits for this member.
            let path = crate::backup::publish(
                &self.data_dir,
                &self.backup,
                self.recorded,
                std::time::SystemTime::now(),
                &|| *self.termination.borrow(),
                crate::backup::Source::Retired,
            )?;
            log::info(
                "pause job: this member's old data backed up",
                &[
                    ("path", path.display().to_string().into()),
                    (
                        "verify",
                        crate::backup::tool::verify_command_line(&path).into(),
                    ),
                ],
            );
            let backup = path.display().to_string();
            self.advance(Phase::Joining, |r| r.backup = Some(backup))?;
        }
        let holder = self.holder();
        let (mut lock, joined) =
            loop {
                if let Some(signal) = self.stop_requested() {
                    return Err(PauseError::Interrupted(signal));
                }
                match V3Lock::connect(
                    &endpoints,
                    self.client_tls.as_ref(),
                    holder.clone(),
                    REQUEST_TIMEOUT,
                )
                .await
                {
                    Ok(mut lock) => match lock.try_take().await {
                        Ok(Taken::Ours) => match self.add_self(&converter).await {
                            Ok(joined) => break (lock, joined),
                            Err(AddFailed { why, again }) => {
                                release_or_leave(&mut lock).await;
                                if !again {
                                    return Err(self
                                        .io_like("add this member to the converted cluster", why));
                                }
                                // The converted cluster did not answer (its
                                // member restarting, say): asked again. An add
                                // made whose answer was lost is found then
                                // (`self_join::change`: added, never started).
                                reporter.wait(
                                    &self.job.id,
                                    &format!(
                                    "the converted cluster to add this member ({why}); asking again"
                                ),
                                );
                            }
                        },
                        Ok(Taken::HeldBy(other)) => reporter.wait(
                            &self.job.id,
                            &format!(
                            "the converted cluster's lock, held by {} (one member joins at a time)",
                            other.name
                        ),
                        ),
                        Err(e) => reporter
                            .wait(&self.job.id, &format!("the converted cluster's lock ({e})")),
                    },
                    Err(e) => {
                        reporter.wait(&self.job.id, &format!("the converted cluster's lock ({e})"))
                    }
                }
                self.sleep().await;
            };
        let mut joining = etcd.clone_with_args(&[
            format!("--initial-cluster={}", joined.initial_cluster),
            "--initial-cluster-state=existing".to_string(),
        ]);
        // Added, its etcd not started: e2e/cluster_roll.rs holds a joiner
        // here while it stops the converter's etcd.
        crate::failpoint!("pause-join-before-etcd");
        joining.start(target).await?;
        let learner = joined.learner.then_some(joined.id);
        let outcome = self
            .finish_join(
                &mut joining,
                &endpoints,
                Some(&mut lock),
                learner,
                Some(joined.id),
            )
            .await;
        if outcome.is_err() {
            let _ = joining.stop().await;
            // Bounded: this member's own etcd may be what the converted
            // cluster lacks for its quorum (a voter that exited while it
            // joined), and the way back is this run's exit, for its next
            // start to resume the join.
            release_or_leave(&mut lock).await;
        }
        outcome.map(Next::Exit)
    }

    /// A join that died after this member was added to the converted
    /// cluster (its entry there, by our peer URL): the etcd that resumes
    /// it, on the data its earlier start received when that data is the
    /// entry's, else on an empty data dir, with the membership as it is,
    /// and the entry's id if it is a learner's (to promote). `None`: no
    /// entry of ours, the join starts over.
    async fn resume_join(
        &self,
        etcd: &SupervisedEtcd,
        converter: &Whom,
    ) -> Result<Option<(SupervisedEtcd, Option<u64>)>, PauseError> {
        // Through the client API: a converter restarted that moment
        // answers its peer `/members` from the middle of its replay
        // ([`client::membership`]), which could hide our entry or build a
        // short `--initial-cluster`.
        let Ok(membership) = client::membership(
            &converter.client_urls,
            self.client_tls.as_ref(),
            REQUEST_TIMEOUT,
        )
        .await
        else {
            return Ok(None);
        };
        let Some(entry) = membership
            .iter()
            .find(|m| m.peer_urls.iter().any(|u| self.own.peer_urls.contains(u)))
        else {
            return Ok(None);
        };
        let on_disk = crate::ondisk::read_with(&self.data_dir, &crate::ondisk::Want::default())
            .ok()
            .and_then(|d| d.member_id);
        if on_disk != Some(entry.id) {
            self.remove_member_dir()
                .map_err(|e| self.io_like("remove the half-joined data", e))?;
        }
        let members: Vec<(u64, String, Vec<String>)> = membership
            .iter()
            .map(|m| (m.id, m.name.clone(), m.peer_urls.clone()))
            .collect();
        let initial_cluster =
            crate::cluster::self_join::initial_cluster(&members, entry.id, &self.own.name);
        log::info(
            "pause job: this member was added to the converted cluster before its restart; its etcd starts again as that member",
            &[
                ("id", format!("{:x}", entry.id).into()),
                ("data_kept", (on_disk == Some(entry.id)).into()),
                ("learner", entry.is_learner.into()),
            ],
        );
        let resumed = etcd.clone_with_args(&[
            format!("--initial-cluster={initial_cluster}"),
            "--initial-cluster-state=existing".to_string(),
        ]);
        Ok(Some((resumed, entry.is_learner.then_some(entry.id))))
    }

    /// Removes the data dir's `member/` (the old data, backed up, or a
    /// half-joined copy of the new), if it is there.
    fn remove_member_dir(&self) -> Result<(), String> {
        let path = self.data_dir.join("member");
        match std::fs::remove_dir_all(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(format!("remove {}: {e}", path.display())),
        }
    }

    /// Removes the old data and adds this member to the converted
    /// cluster (a learner where the target has them); returns its entry
    /// and the `--initial-cluster` its etcd joins with.
    async fn add_self(
        &self,
        converter: &Whom,
    ) -> Result<crate::cluster::self_join::Joined, AddFailed> {
        // Under the converted cluster's lock: e2e/cluster_roll.rs holds a
        // joiner here while it kills the converter.
        crate::failpoint!("pause-join-after-lock");
        let fail = |why: String| AddFailed { why, again: false };
        self.remove_member_dir().map_err(fail)?;
        crate::durable::fsync_dir(&self.data_dir).map_err(|e| fail(e.to_string()))?;
        let peer = PeerClient::new(self.peer_tls.as_ref(), REQUEST_TIMEOUT)
            .map_err(|e| fail(e.to_string()))?;
        let mut others = Vec::new();
        for url in &converter.peer_urls {
            if let Ok(list) = peer.members(url).await {
                for member in list {
                    if let Some(url) = member.peer_urls.first() {
                        others.push(Peer {
                            name: member.name.clone(),
                            url: url.clone(),
                        });
                    }
                }
                break;
            }
        }
        if others.is_empty() {
            others = converter
                .peer_urls
                .iter()
                .map(|url| Peer {
                    name: converter.name.clone(),
                    url: url.clone(),
                })
                .collect();
        }
        others.retain(|p| !self.own.peer_urls.contains(&p.url));
        let joined = crate::cluster::self_join::add_self(
            &others,
            &self.own.name,
            &self.own.peer_urls,
            self.peer_tls.as_ref(),
            self.client_tls.as_ref(),
            REQUEST_TIMEOUT,
            super::joins_as_learner(self.job.target.version),
        )
        .await
        .map_err(|e| {
            use crate::cluster::self_join::SelfJoinError;
            // Another member's URL or name is the operator's to fix; the
            // rest is the converted cluster not answering (yet).
            let again = !matches!(
                e,
                SelfJoinError::UrlTaken { .. } | SelfJoinError::NameTaken { .. }
            );
            AddFailed {
                why: e.to_string(),
                again,
            }
        })?;
        log::info(
            "pause job: this member added itself to the converted cluster",
            &[
                ("id", format!("{:x}", joined.id).into()),
                ("initial_cluster", joined.initial_cluster.as_str().into()),
                ("learner", joined.learner.into()),
            ],
        );
        Ok(joined)
    }

    /// Promotes this member, joined as learner `id`, once etcd says it
    /// caught up with the converter; within the proof's deadline, its etcd
    /// watched throughout.
    async fn promote(
        &mut self,
        etcd: &mut SupervisedEtcd,
        endpoints: &[String],
        id: u64,
    ) -> Result<(), PauseError> {
        let target = self.job.target.version;
        let started = Instant::now();
        let mut reporter = Reporter::new();
        loop {
            self.running_or_started_again(etcd, Some(id), started)
                .await?;
            let Some(answer) = self
                .unless_ended(
                    etcd,
                    crate::cluster::self_join::try_promote(
                        endpoints,
                        self.client_tls.as_ref(),
                        REQUEST_TIMEOUT,
                        id,
                    ),
                )
                .await
            else {
                continue;
            };
            let why = match answer {
                Ok(crate::cluster::self_join::Promoted::Done) => {
                    log::info(
                        "pause job: this member, joined as a learner, is a voter now",
                        &[
                            ("id", format!("{id:x}").into()),
                            ("ms", log::ms(started.elapsed())),
                        ],
                    );
                    return Ok(());
                }
                Ok(crate::cluster::self_join::Promoted::NotYet(why)) => why,
                Err(e) => e.to_string(),
            };
            if started.elapsed() > self.prove_deadline {
                return Err(PauseError::NotProven {
                    release: target,
                    deadline: self.prove_deadline,
                    why: format!("learner {id:x} not promoted: {why}"),
                    backup: self
                        .record
                        .as_ref()
                        .and_then(|r| r.backup.clone())
                        .unwrap_or_default(),
                });
            }
            reporter.wait(
                &self.job.id,
                &format!("this member, a learner, to catch up and be promoted ({why})"),
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Proves the joined etcd (started by the caller: its release, a write, its keyspace equal to
    /// the converter's at one revision: `HashKV`, or on 3.2 and older a digest of every key),
    /// records the target, says it joined,
    /// releases the lock, removes the record, and serves.
    async fn finish_join(
        &mut self,
        etcd: &mut SupervisedEtcd,
        endpoints: &[String],
        lock: Option<&mut V3Lock>,
        learner: Option<u64>,
        fresh: Option<u64>,
    ) -> Result<u8, PauseError> {
        let target = self.job.target.version;
        let started = Instant::now();
        // Its etcd started, not proven: e2e/cluster_roll.rs holds a joiner
        // here while it kills that etcd.
        crate::failpoint!("pause-join-before-proof");
        // The entry this member joined as, where the caller knows it.
        let entry = fresh.or(learner);
        if let Some(id) = learner {
            self.promote(etcd, endpoints, id).await?;
        }
        let mut last;
        let mut restarted = false;
        // When our etcd last started: a lost publish is judged from there.
        let mut spawned = started;
        loop {
            if self.running_or_started_again(etcd, entry, started).await? {
                spawned = Instant::now();
                restarted = false;
            }
            if let Some(id) = fresh.filter(|_| !restarted) {
                // While its etcd does not answer, a proof's connection to
                // it would wait out its timeout: the signs are read
                // instead, for the few seconds a restart is worth it.
                if spawned.elapsed() < pause::PUBLISH_RETRY_FLOOR
                    && !self.answers(&self.own.client_urls).await
                {
                    restarted = self
                        .restart_if_publish_lost(etcd, endpoints, id, spawned)
                        .await?;
                    if !restarted {
                        // A connection that waited for an etcd about to
                        // serve completes as it does: a short pause.
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                }
            }
            let Some(hash) = self
                .unless_ended(etcd, self.same_hash(endpoints, target))
                .await
            else {
                continue;
            };
            match hash {
                Ok(revision) if self.job.target.storage == Storage::Etcd2 => {
                    // The data is the v2 store: HashKV covered only the
                    // job's own v3 keys.
                    let Some(v2) = self
                        .unless_ended(
                            etcd,
                            v2proof::same_v2_store(
                                self.client_tls.as_ref(),
                                &self.own.client_urls,
                                endpoints,
                                REQUEST_TIMEOUT,
                            ),
                        )
                        .await
                    else {
                        continue;
                    };
                    match v2 {
                        Ok(proven) => {
                            log::info(
                                "pause job: this member serves the converted data (its v2 store equal to the converter's at one index, the events between the two reads replayed)",
                                &[
                                    ("index", proven.index.into()),
                                    ("nodes", proven.nodes.into()),
                                    ("replayed", proven.replayed.into()),
                                    ("revision", revision.into()),
                                    ("ms", log::ms(started.elapsed())),
                                ],
                            );
                            break;
                        }
                        Err(why) => last = why,
                    }
                }
                Ok(revision) => {
                    log::info(
                        "pause job: this member serves the converted data (its keyspace equal to the converter's at one revision)",
                        &[
                            ("revision", revision.into()),
                            ("ms", log::ms(started.elapsed())),
                        ],
                    );
                    break;
                }
                Err(why) => last = why,
            }
            if started.elapsed() > self.prove_deadline {
                return Err(PauseError::NotProven {
                    release: target,
                    deadline: self.prove_deadline,
                    why: last,
                    backup: self
                        .record
                        .as_ref()
                        .and_then(|r| r.backup.clone())
                        .unwrap_or_default(),
                });
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        datadir::write_version(&self.data_dir, self.job.target).map_err(|e| {
            PauseError::Record {
                path: self
                    .data_dir
                    .join(datadir::VERSION_FILE)
                    .display()
                    .to_string(),
                why: e.to_string(),
            }
        })?;
        if let Ok(mut c) = connect_v3(endpoints, self.client_tls.as_ref(), REQUEST_TIMEOUT).await {
            let _ = keys::put(&mut c, &keys::joined_key(&self.job.id, self.own.id), "{}").await;
        }
        if lock.is_none() {
            self.release_lock_left(endpoints).await;
        }
        if let Some(lock) = lock {
            if let Err(e) = lock.release_within(REQUEST_TIMEOUT).await {
                log::warn(
                    "pause job: the converted cluster's lock was not released (its lease ends it)",
                    &[("error", e.to_string().into())],
                );
            }
        }
        datadir::remove_pause(&self.data_dir).map_err(|e| PauseError::Record {
            path: self.record_path(),
            why: e.to_string(),
        })?;
        log::info(
            "pause job: this member joined the converted cluster",
            &[
                ("job", self.job.id.as_str().into()),
                ("version", self.job.target.to_string().into()),
            ],
        );
        self.serve(etcd).await
    }

    /// The converted cluster's lock, if an earlier run of ours died
    /// holding it: taken as ours again and released (its lease would end
    /// it, a minute later, for the next member to join).
    async fn release_lock_left(&self, endpoints: &[String]) {
        let holder = self.holder();
        if let Ok(mut lock) =
            V3Lock::connect(endpoints, self.client_tls.as_ref(), holder, REQUEST_TIMEOUT).await
        {
            if let Ok(Some(current)) = lock.holder().await {
                if current.member == format!("{:x}", self.own.id)
                    && matches!(lock.try_take().await, Ok(Taken::Ours))
                {
                    release_or_leave(&mut lock).await;
                }
            }
        }
    }

    fn holder(&self) -> Holder {
        Holder {
            member: format!("{:x}", self.own.id),
            name: self.own.name.clone(),
            run: format!("pid {} (pause job)", std::process::id()),
        }
    }

    /// A joiner's etcd started on an empty data dir at `started` that
    /// does not answer (the caller asked): restarted once if its publish came to it
    /// inside etcd's snapshot ([`pause::publish_lost`]). `Ok(true)`: it
    /// was restarted.
    async fn restart_if_publish_lost(
        &self,
        etcd: &mut SupervisedEtcd,
        endpoints: &[String],
        id: u64,
        started: Instant,
    ) -> Result<bool, PauseError> {
        let since_start = started.elapsed();
        if since_start < pause::SNAPSHOT_APPLY_GRACE {
            // Nothing to read yet: spare the cluster the calls.
            return Ok(false);
        }
        let Some(Some(signs)) = self
            .unless_ended(etcd, self.joiner_signs(endpoints, id, since_start))
            .await
        else {
            return Ok(false);
        };
        if !pause::publish_lost(&signs) {
            return Ok(false);
        }
        log::info(
            "pause job: this member's etcd got its own publish inside etcd's snapshot and waits out its request timeout; restarting it, to publish again on the data it received",
            &[
                ("id", format!("{id:x}").into()),
                ("since_start_ms", log::ms(since_start)),
                (
                    "snapshot_age_ms",
                    log::ms(signs.snapshot_age.unwrap_or_default()),
                ),
                ("voters", signs.voters.into()),
                ("others_answering", signs.others_answering.into()),
            ],
        );
        etcd.stop().await?;
        etcd.start(self.job.target.version).await?;
        Ok(true)
    }

    /// Whether an etcd on `urls` answers a status request.
    async fn answers(&self, urls: &[String]) -> bool {
        match connect_v3(urls, self.client_tls.as_ref(), ANSWER_TIMEOUT).await {
            Ok(mut client) => tokio::time::timeout(ANSWER_TIMEOUT, client.status())
                .await
                .is_ok_and(|answer| answer.is_ok()),
            Err(_) => false,
        }
    }

    /// What the converted cluster (on `endpoints`) and this member's data
    /// dir say about joiner `id`; `None` if the cluster does not answer or
    /// does not list it.
    async fn joiner_signs(
        &self,
        endpoints: &[String],
        id: u64,
        since_start: Duration,
    ) -> Option<pause::JoinerSigns> {
        let mut client = connect_v3(endpoints, self.client_tls.as_ref(), REQUEST_TIMEOUT)
            .await
            .ok()?;
        let members = client.member_list().await.ok()?.members().to_vec();
        let joiner = members.iter().find(|m| m.id() == id)?;
        let voters: Vec<_> = members.iter().filter(|m| !m.is_learner()).collect();
        let mut others_answering = 0;
        for other in voters.iter().filter(|m| m.id() != id) {
            if self.answers(other.client_urls()).await {
                others_answering += 1;
            }
        }
        Some(pause::JoinerSigns {
            since_start,
            snapshot_age: crate::ondisk::newest_snap(&self.data_dir)
                .and_then(|meta| meta.modified().ok())
                .map(|written| written.elapsed().unwrap_or_default()),
            published: !joiner.name().is_empty(),
            voters: voters.len(),
            joiner_votes: !joiner.is_learner(),
            others_answering,
        })
    }

    /// `HashKV` of our etcd and the converter's at the converter's
    /// revision, once ours has it; the revision when equal
    /// ([`same_keyspace`]).
    async fn same_hash(&self, endpoints: &[String], release: Version) -> Result<i64, String> {
        let mut theirs = connect_v3(endpoints, self.client_tls.as_ref(), REQUEST_TIMEOUT)
            .await
            .map_err(|e| e.to_string())?;
        let mut ours = connect_v3(
            &self.own.client_urls,
            self.client_tls.as_ref(),
            REQUEST_TIMEOUT,
        )
        .await
        .map_err(|e| e.to_string())?;
        same_keyspace(&mut theirs, &mut ours, release).await
    }

    /// The converter, its data converted (version.txt records the
    /// target): serves it, says so, waits until every other member joined,
    /// then ends the job and serves on.
    pub async fn serve_converted(
        &mut self,
        etcd: &mut SupervisedEtcd,
    ) -> Result<PauseEnd, PauseError> {
        if self.phase() != Some(Phase::Serving) {
            self.advance(Phase::Serving, |_| {})?;
        }
        let target = self.job.target.version;
        etcd.start(target).await?;
        let started = Instant::now();
        let mut reporter = Reporter::new();
        let go = self.record.as_ref().and_then(|r| r.go.clone());
        let mut served = false;
        // Since when our etcd keeps exiting (none since it last answered).
        let mut exiting_since: Option<Instant> = None;
        loop {
            let window = exiting_since.unwrap_or_else(Instant::now);
            if self.running_or_started_again(etcd, None, window).await? {
                exiting_since = Some(window);
            }
            let mut client = match connect_v3(
                &self.own.client_urls,
                self.client_tls.as_ref(),
                REQUEST_TIMEOUT,
            )
            .await
            {
                Ok(c) => c,
                Err(e) => {
                    reporter.wait(&self.job.id, &format!("the converted data to serve ({e})"));
                    self.sleep().await;
                    continue;
                }
            };
            if !served {
                match keys::put(
                    &mut client,
                    &keys::served_key(&self.job.id),
                    &serde_json::json!({"target": self.job.target.to_string()}).to_string(),
                )
                .await
                {
                    Ok(()) => {
                        served = true;
                        log::info(
                            "pause job: the converted data serves as a cluster of this member alone; the cluster's writes go on; the others join it now",
                            &[
                                ("job", self.job.id.as_str().into()),
                                ("version", self.job.target.to_string().into()),
                                ("ms", log::ms(started.elapsed())),
                            ],
                        );
                    }
                    Err(why) => {
                        reporter.wait(
                            &self.job.id,
                            &format!("the converted data to take a write ({why})"),
                        );
                        self.sleep().await;
                        continue;
                    }
                }
            }
            let seen = match keys::read(&mut client, &self.job.id, false).await {
                Ok(seen) => {
                    exiting_since = None;
                    seen
                }
                Err(_) => Seen::default(),
            };
            let others = go.as_ref().map(Go::others).unwrap_or_default();
            let missing: Vec<u64> = others
                .iter()
                .copied()
                .filter(|id| !seen.joined.contains(id))
                .collect();
            if missing.is_empty() {
                if self.job.target.storage == Storage::Etcd2 {
                    if let Err(why) = self
                        .forget_v2_records("the converted copies, every member joined")
                        .await
                    {
                        reporter.wait(
                            &self.job.id,
                            &format!("the cluster mode's records in the converted v2 store to go ({why})"),
                        );
                        self.sleep().await;
                        continue;
                    }
                }
                if let Err(why) = keys::remove_all(&mut client, &self.job.id).await {
                    reporter.wait(&self.job.id, &format!("the job's keys to go ({why})"));
                    self.sleep().await;
                    continue;
                }
                datadir::remove_pause(&self.data_dir).map_err(|e| PauseError::Record {
                    path: self.record_path(),
                    why: e.to_string(),
                })?;
                log::info(
                    "pause job done: every member joined the converted cluster",
                    &[("job", self.job.id.as_str().into())],
                );
                return self.serve(etcd).await.map(PauseEnd::Exit);
            }
            reporter.wait(
                &self.job.id,
                &format!("{} to join the converted cluster", self.names(&missing)),
            );
            self.sleep().await;
        }
    }

    /// [`Self::still_running`] for our etcd during the job, a joiner's
    /// before its proof or the converter's before every member joined;
    /// `Ok(true)`: it had exited, and was started again.
    ///
    /// A joiner's etcd exits when the converted cluster is away as it
    /// starts ("cannot fetch cluster info from peer urls": the converter
    /// restarting), or when it is killed; the converter's, when it is
    /// killed or crashes. Either may be what the converted cluster lacks
    /// for its quorum (the converter always; a joiner that is a voter: two
    /// of two), so ending the run here would leave that cluster down for as
    /// long as the kubelet's back-off (10 s, then 20 s, 40 s …). Instead,
    /// where [`pause::may_start_again`] (nothing written yet, or the
    /// data of `entry`, the member it joined as; the converter's own data,
    /// `entry` `None`), its etcd is started again after
    /// [`ETCD_RESTART_AFTER`], with the same flags, as this member's next
    /// start would; within the proof's deadline from `since` (a joiner:
    /// its wait's start, for the caller's loops skip their own check when
    /// a wait ended on the exit; the converter: the first of the exits
    /// since its etcd last answered). Any other data, or past that: the
    /// error, for the next start to sort out.
    async fn running_or_started_again(
        &self,
        etcd: &mut SupervisedEtcd,
        entry: Option<u64>,
        since: Instant,
    ) -> Result<bool, PauseError> {
        let target = self.job.target.version;
        let exited = match self.still_running(etcd, target).await {
            Ok(()) => return Ok(false),
            Err(e @ PauseError::Exited { .. }) => e,
            Err(e) => return Err(e),
        };
        let written = crate::ondisk::has_wal(&self.data_dir);
        let on_disk = if written {
            crate::ondisk::read_with(&self.data_dir, &crate::ondisk::Want::default())
                .ok()
                .and_then(|found| found.member_id)
        } else {
            None
        };
        let ours = pause::may_start_again(written, on_disk, entry);
        let PauseError::Exited { status, .. } = &exited else {
            return Err(exited);
        };
        if since.elapsed() > self.prove_deadline {
            // Its etcd kept exiting: the proof's deadline ends the run as
            // a proof that never came would.
            log::warn(
                "pause job: this member's etcd kept exiting past the proof's deadline; ending this run",
                &[
                    ("status", status.to_string().into()),
                    ("deadline_s", self.prove_deadline.as_secs().into()),
                ],
            );
            return Err(exited);
        }
        if !ours {
            log::warn(
                "pause job: this member's etcd exited during the job, and its data dir holds another member's data or a WAL that does not read; ending this run for the next start to sort it out",
                &[
                    ("status", status.to_string().into()),
                    (
                        "on_disk",
                        on_disk.map_or_else(|| "unreadable".to_string(), |id| format!("{id:x}")).into(),
                    ),
                    ("entry", entry.map(|id| format!("{id:x}")).unwrap_or_default().into()),
                ],
            );
            return Err(exited);
        }
        log::warn(
            "pause job: this member's etcd exited during the job; starting it again, as this member's next start would",
            &[
                ("status", status.to_string().into()),
                ("data", if written { "its own, kept" } else { "none written yet" }.into()),
                ("after_ms", log::ms(ETCD_RESTART_AFTER)),
            ],
        );
        let mut termination = self.termination.clone();
        tokio::select! {
            _ = tokio::time::sleep(ETCD_RESTART_AFTER) => {}
            _ = termination.changed() => {}
        }
        if let Some(signal) = self.stop_requested() {
            return Err(PauseError::Interrupted(signal));
        }
        etcd.start(target).await?;
        Ok(true)
    }

    /// `work` (requests to the converted cluster), or `None` as soon as
    /// our etcd exits or a stop request comes; the caller's next look at
    /// its etcd ([`Self::running_or_started_again`]) takes it from there. A
    /// converter that is away holds a request for its whole timeout (5 s,
    /// and a connect to an address nobody has, longer): a joiner whose
    /// own etcd ended meanwhile must not wait that out first (seen: 14 s,
    /// CI 2026-11-30).
    async fn unless_ended<T>(
        &self,
        etcd: &mut SupervisedEtcd,
        work: impl std::future::Future<Output = T>,
    ) -> Option<T> {
        let mut termination = self.termination.clone();
        tokio::pin!(work);
        loop {
            if termination.borrow().is_some() {
                return None;
            }
            tokio::select! {
                done = &mut work => return Some(done),
                _ = etcd.wait() => return None,
                changed = termination.changed() => {
                    if changed.is_err() {
                        // The signal thread is gone: only the etcd's exit remains.
                        return tokio::select! {
                            done = &mut work => Some(done),
                            _ = etcd.wait() => None,
                        };
                    }
                }
            }
        }
    }

    /// Fails when a stop request came (our etcd stopped gracefully) or
    /// our etcd running `release` exited.
    async fn still_running(
        &self,
        etcd: &mut SupervisedEtcd,
        release: Version,
    ) -> Result<(), PauseError> {
        if let Some(signal) = self.stop_requested() {
            etcd.stop().await?;
            return Err(PauseError::Interrupted(signal));
        }
        match etcd.exited() {
            Some(status) => Err(PauseError::Exited {
                release,
                status,
                job: self.job.id.clone(),
            }),
            None => Ok(()),
        }
    }

    /// Serves until our etcd exits or a stop request comes.
    async fn serve(&mut self, etcd: &mut SupervisedEtcd) -> Result<u8, PauseError> {
        let mut termination = self.termination.clone();
        loop {
            if let Some(signal) = *termination.borrow() {
                etcd.stop().await?;
                return Ok(crate::signal_exit_code(signal));
            }
            tokio::select! {
                status = etcd.wait() => {
                    log::info("member etcd exited", &[("status", status.to_string().into())]);
                    return Ok(match status {
                        ExitStatus::Exited(code) => u8::try_from(code).unwrap_or(crate::EXIT_FAILURE),
                        ExitStatus::Signaled(signal) => crate::signal_exit_code(signal),
                    });
                }
                _ = termination.changed() => {}
            }
        }
    }
}

/// Where the member's part goes next.
enum Next {
    /// Serve the old data (until the member stops for the job).
    ServeOld,
    /// Join the converted cluster.
    Join,
    /// The converter took the data.
    Convert,
    /// Served until its etcd exited: exit with this code.
    Exit(u8),
    /// Withdrawn from a job the target no longer asks for.
    Withdrawn,
}

/// What the converter's round came to.
enum Taking {
    /// The data is taken.
    Taken,
    /// Not yet, and why.
    Waiting(String),
}

/// The path of the pause record in `dir`, for messages.
pub fn record_path(dir: &Path) -> PathBuf {
    dir.join(datadir::PAUSE_FILE)
}

/// The proof of a joined member (`ours`) against the converter
/// (`theirs`), both serving `release`: the converter's revision, once
/// ours has it, where both hash alike there: etcd's `HashKV`, or on a
/// release without it (3.2 and older) a digest of every key at that
/// revision (`keyspace_digest`). Otherwise what differs, or how far
/// behind ours is.
pub async fn same_keyspace(
    theirs: &mut etcd_client::Client,
    ours: &mut etcd_client::Client,
    release: Version,
) -> Result<i64, String> {
    let revision = theirs
        .status()
        .await
        .map_err(|e| error_chain(&e))?
        .header()
        .map_or(0, |h| h.revision());
    let own_revision = ours
        .get(
            "/etcd-migrate/pause/",
            Some(
                etcd_client::GetOptions::new()
                    .with_serializable()
                    .with_count_only(),
            ),
        )
        .await
        .map_err(|e| error_chain(&e))?
        .header()
        .map_or(0, |h| h.revision());
    if own_revision < revision {
        return Err(format!(
            "this member is at revision {own_revision}, the converter at {revision}"
        ));
    }
    if release.minor_line() < Minor::new(3, 3) {
        let a = keyspace_digest(theirs, revision).await?;
        let b = keyspace_digest(ours, revision).await?;
        if a != b {
            return Err(format!(
                "the keyspace at revision {revision}: converter {} keys (digest {}), this member {} keys (digest {})",
                a.0, a.1, b.0, b.1
            ));
        }
        return Ok(revision);
    }
    let a = theirs
        .hash_kv(revision)
        .await
        .map_err(|e| error_chain(&e))?
        .hash();
    let b = ours
        .hash_kv(revision)
        .await
        .map_err(|e| error_chain(&e))?
        .hash();
    if a != b {
        return Err(format!(
            "HashKV at revision {revision}: converter {a:x}, this member {b:x}"
        ));
    }
    Ok(revision)
}

/// Releases `lock` if the converted cluster answers within
/// `REQUEST_TIMEOUT`, else leaves it to its lease (a minute): see
/// [`V3Lock::release_within`]. A joiner whose etcd exited was seen silent
/// for 180 s in an unbounded release (CI, 2026-11-29), where it must exit
/// for its next start to resume the join.
async fn release_or_leave(lock: &mut V3Lock) {
    let _ = lock.release_within(REQUEST_TIMEOUT).await;
}

/// Every key of `client`'s member at `revision`, read in pages, as a
/// count and a SHA-256 over each key, value, create and mod revision,
/// version and lease (each field length-prefixed): what `HashKV` proves
/// on 3.3 and later, for a release without it. Serializable reads: the
/// member's own store, as `HashKV` is.
async fn keyspace_digest(
    client: &mut etcd_client::Client,
    revision: i64,
) -> Result<(u64, String), String> {
    use sha2::{Digest, Sha256};
    let mut digest = Sha256::new();
    let mut count = 0u64;
    let scan = crate::cluster::client::Scan {
        revision: Some(revision),
        serializable: true,
        keys_only: false,
    };
    crate::cluster::client::scan_v3(client, scan, |kv| {
        for field in [kv.key(), kv.value()] {
            digest.update((field.len() as u64).to_be_bytes());
            digest.update(field);
        }
        for number in [
            kv.create_revision(),
            kv.mod_revision(),
            kv.version(),
            kv.lease(),
        ] {
            digest.update(number.to_be_bytes());
        }
        count += 1;
        std::ops::ControlFlow::<()>::Continue(())
    })
    .await?;
    let hex: String = digest
        .finalize()
        .iter()
        .take(8)
        .map(|b| format!("{b:02x}"))
        .collect();
    Ok((count, hex))
}
