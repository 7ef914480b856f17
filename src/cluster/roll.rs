//! This module owns the rolling loop of the cluster mode: one member's
//! entrypoint starting its etcd as a member of the live cluster, then
//! observing the cluster, deciding ([`decide`]) and acting, round after
//! round, until its member runs the target (or stays where it is), and then
//! serving: the member's etcd stays our supervised child until it exits or
//! we are told to stop.
//!
//! It talks to three small seams, so every failure can be injected in its
//! tests: [`Coordination`] (the cluster: observe, the upgrade lock, the
//! leadership transfer, the proof that our etcd serves as a member),
//! [`MemberEtcd`] (our member's etcd process) and [`Ledger`] (what the data
//! dir records: `version.txt`, and the restart mark that says which release
//! last started on the data before it was proven).
//!
//! Waiting for other members has no deadline (the member keeps serving and
//! says every [`Timing::progress_every`] what it waits for); our own
//! actions do: a release started under the lock must prove itself within
//! [`Timing::prove_deadline`], or the run stops it and exits non-zero with
//! the lock released.

use std::fmt;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use tokio::sync::watch;

use crate::cluster::decide::{decide, Decision, Goal, Own, Refusal, View, Waiting};
use crate::cluster::lock::Taken;
use crate::log;
use crate::plan::{self, Bundle, Step};
use crate::supervisor::ExitStatus;
use crate::version::{Minor, Version, VersionPair};

/// How often the loop looks, and how long our own actions may take.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    /// The pause between two observations.
    pub round: Duration,
    /// The pause between two observations while our own etcd has not
    /// proven itself yet: a just-started etcd serves within a second or
    /// two, and every round it is unproven the roll (and, under the lock,
    /// every other member) waits on it.
    pub prove_every: Duration,
    /// The pause between rounds while the wait is for something that
    /// moves by itself soon (see `moves_soon`).
    pub soon_every: Duration,
    /// How often an unchanged wait is reported again.
    pub progress_every: Duration,
    /// How long a release started under the lock may take to serve a
    /// write as a member before the run gives up on it.
    pub prove_deadline: Duration,
}

/// What this member's run works from.
#[derive(Debug, Clone)]
pub struct Rolling {
    /// Our member id (the data's WAL records it).
    pub own_id: u64,
    /// Our name, for messages.
    pub own_name: String,
    /// The peer URLs the configuration asks for (empty: not set).
    pub configured_peer_urls: Vec<String>,
    /// What `version.txt` records.
    pub recorded: VersionPair,
    /// The release the restart mark names: it started on the data after
    /// the last record, and was never proven.
    pub marked: Option<Version>,
    /// Where the roll takes the member: the user's target, or the release
    /// a pause job to it starts from ([`Rolling::then_pause`]).
    pub target: VersionPair,
    /// The roll ends where a pause job begins (`Plan::then_pause`): once
    /// this member runs `target`, [`run`] returns [`Ended::Rolled`] with
    /// its etcd still serving, for the job to take over.
    pub then_pause: bool,
    /// What the image bundles.
    pub bundle: Bundle,
    /// The loop's timing.
    pub timing: Timing,
}

/// The cluster, as the loop asks it.
// The futures run on the entrypoint's current-thread runtime: no Send needed.
#[allow(async_fn_in_trait)]
pub trait Coordination {
    /// What can go wrong, as its own type.
    type Error: std::error::Error + 'static;
    /// Every member's version as its peer endpoint tells it (our own etcd
    /// may be down): enough for the refusals before our etcd starts.
    async fn peers(&mut self) -> View;
    /// One whole observation: the peers, then the leader, alarms and the
    /// lock's holder over the client API. An error means the client API
    /// did not answer; nothing may be decided on such a round.
    async fn observe(&mut self) -> Result<View, Self::Error>;
    /// Takes the upgrade lock, or names who holds it.
    async fn take_lock(&mut self) -> Result<Taken, Self::Error>;
    /// Keeps our hold on the lock alive.
    async fn keep_lock(&mut self) -> Result<(), Self::Error>;
    /// Releases the lock (if it is still ours).
    async fn release_lock(&mut self) -> Result<(), Self::Error>;
    /// Hands leadership from `from` (us) to `to`.
    async fn move_leader(&mut self, from: u64, to: u64) -> Result<(), Self::Error>;
    /// Has etcd downgrade the cluster to `to` (validate, then enable; a
    /// job under way already is the same one).
    async fn enable_downgrade(&mut self, to: Minor) -> Result<(), Self::Error>;
    /// Ends the cluster's downgrade job (none left is done).
    async fn cancel_downgrade(&mut self) -> Result<(), Self::Error>;
    /// Proves our etcd serves `release` as a member: its peer `/version`
    /// names it and a write through its own client URL commits.
    async fn prove(&mut self, release: Version) -> Result<(), Self::Error>;
    /// Announces the target our entrypoint was started with, once per
    /// store (the cluster version may cross from v2 to v3 while we run);
    /// `true` when it wrote, `false` when the store has it already.
    async fn announce(&mut self, target: VersionPair) -> Result<bool, Self::Error>;
}

/// Our member's etcd process.
#[allow(async_fn_in_trait)]
pub trait MemberEtcd {
    /// What can go wrong, as its own type.
    type Error: std::error::Error + 'static;
    /// Starts `release` as our member, with the user's own settings.
    async fn start(&mut self, release: Version) -> Result<(), Self::Error>;
    /// Starts `release` as our member with the user's own settings and a
    /// raft snapshot after every entry (`--snapshot-count=1` last), so that
    /// its WAL holds a snapshot record past everything it replayed: the
    /// one start that readies a member's data for a release that cannot
    /// replay what an older one left in its WAL ([`Ledger::replay_blocker`]).
    async fn start_snapshotting(&mut self, release: Version) -> Result<(), Self::Error>;
    /// Stops it gracefully (SIGTERM, a deadline, then SIGKILL).
    async fn stop(&mut self) -> Result<ExitStatus, Self::Error>;
    /// Its exit status, if it has exited.
    fn exited(&mut self) -> Option<ExitStatus>;
    /// Waits until it exits.
    async fn wait(&mut self) -> ExitStatus;
}

/// What the data dir records of the member's release.
pub trait Ledger {
    /// What can go wrong, as its own type.
    type Error: std::error::Error + 'static;
    /// `version.txt` := `release`, and the restart mark goes.
    fn record(&mut self, release: Version) -> Result<(), Self::Error>;
    /// The restart mark := `release`, before it starts on the data.
    fn mark(&mut self, release: Version) -> Result<(), Self::Error>;
    /// Why `release` cannot start on the data as it stands, read offline
    /// while no etcd runs on it: etcd 3.7 no longer decodes the v2
    /// requests 3.5 wrote (its member publish, its cluster-version
    /// updates) and panics replaying one past the WAL's newest snapshot
    /// record. `None`: nothing stops it.
    fn replay_blocker(&mut self, release: Version) -> Result<Option<String>, Self::Error>;
    /// The storage version the data records (3.6+ write one), read
    /// offline while no etcd runs on it.
    fn storage_version(&mut self) -> Result<Option<Minor>, Self::Error>;
}

/// How the member's run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// Our etcd exited on its own, after the roll (or while serving).
    Exited(ExitStatus),
    /// We were told to stop; our etcd stopped gracefully.
    Stopped(Signal),
    /// This member runs the roll's target and a pause job comes next
    /// ([`Rolling::then_pause`]): our etcd still serves, for the job.
    Rolled,
}

/// Why the member's run failed.
#[derive(Debug, thiserror::Error)]
pub enum RollError {
    /// Going on would break etcd's rules or the cluster (exit 2).
    #[error("{0}")]
    Refused(#[from] Refusal),
    /// No bundled release can start on the data as recorded.
    #[error("version.txt records {recorded}, and the image bundles no {minor}.x release at or after it to start this member with (bundled: {bundled}); bundle etcd {recorded} or a newer {minor}.x patch")]
    NothingToStart {
        /// What version.txt records.
        recorded: Version,
        /// Its minor, for the message.
        minor: String,
        /// The bundle.
        bundled: String,
    },
    /// Our etcd exited while the roll was under way.
    #[error("this member's etcd {release} exited ({status}) while the cluster rolled to {target}; version.txt records the last release proven as a member; the next start resumes the roll (see etcd's own lines above for why it exited)")]
    EtcdExited {
        /// The release it ran.
        release: Version,
        /// How it ended.
        status: ExitStatus,
        /// The target.
        target: Version,
    },
    /// A release started under the lock never proved itself.
    #[error("this member's etcd {release} did not serve a write as a member of the cluster within {} s of its start ({reason}); it was stopped and the upgrade lock released; version.txt still records {recorded}; the next start tries {release} again", .deadline.as_secs())]
    NotProven {
        /// The release.
        release: Version,
        /// What version.txt records.
        recorded: Version,
        /// The deadline.
        deadline: Duration,
        /// The last reason.
        reason: String,
    },
    /// Our member's data still holds what the next release cannot replay
    /// after a start that should have snapshotted past it.
    #[error("this member's etcd {running} was started with --snapshot-count=1 to take a snapshot past what {into} cannot replay, and its WAL still holds it ({why}); a config file (--config-file) makes etcd ignore that flag: remove the WAL's old entries by restarting the member once on {running} with `snapshot-count: 1` in its config, then raise TARGET_VERSION again; the upgrade lock was released and version.txt still records {running}")]
    NotReadied {
        /// The release that could not start.
        into: Version,
        /// The release the member runs.
        running: Version,
        /// What blocks it.
        why: String,
    },
    /// One of our own actions failed.
    #[error("{action}: {reason}")]
    Action {
        /// What we were doing, naming the member and release.
        action: String,
        /// Why it failed, with its causes.
        reason: String,
    },
    /// A stop request came; our etcd was stopped (and the lock released).
    #[error("stopped by {0} while the cluster rolled; this member's etcd was stopped gracefully; version.txt records the last release proven as a member")]
    Interrupted(Signal),
}

impl RollError {
    fn action(action: impl Into<String>, err: &(dyn std::error::Error + 'static)) -> Self {
        RollError::Action {
            action: action.into(),
            reason: crate::log::error_chain(err),
        }
    }
}

/// The release our member starts with: the marked one (it already ran on
/// the data, and etcd data is never handed back to an older release), else
/// the recorded one when bundled, else the newest bundled patch of its
/// minor (a patch restart is allowed at any cluster version).
pub fn first_release(rolling: &Rolling) -> Result<Version, RollError> {
    if let Some(marked) = rolling.marked {
        if rolling.bundle.contains(marked) {
            return Ok(marked);
        }
    }
    let recorded = rolling.recorded.version;
    if rolling.bundle.contains(recorded) {
        return Ok(recorded);
    }
    match rolling.bundle.newest_in(recorded.minor_line()) {
        Some(newest) if newest > recorded => Ok(newest),
        _ => Err(RollError::NothingToStart {
            recorded,
            minor: recorded.minor_line().to_string(),
            bundled: rolling.bundle.to_string(),
        }),
    }
}

/// The next release on the way from `running` to the target: the first
/// step of the single-member plan when it is an upgrade (the newest
/// bundled patch of the running minor first, then the next minor).
pub fn next_release(running: Version, rolling: &Rolling) -> Option<Version> {
    let from = VersionPair {
        version: running,
        storage: rolling.recorded.storage,
    };
    let to = VersionPair {
        version: rolling.target.version,
        storage: rolling.recorded.storage,
    };
    let plan = plan::plan(from, to, &rolling.bundle).ok()?;
    match plan.steps.first()? {
        Step::PatchUpgrade { to, .. }
        | Step::MinorUpgrade { to, .. }
        | Step::MinorDowngrade { to, .. } => Some(*to),
        _ => None,
    }
}

/// The state the loop carries between rounds.
struct State {
    running: Version,
    proven: bool,
    /// When the release under the lock started (the proof deadline's start).
    started_under_lock: Option<Instant>,
    holding: bool,
    /// Leadership transfer already tried during this hold (3.0–3.2 and 2.x
    /// have none; a graceful stop makes the others elect).
    tried_transfer: bool,
    last_proof_error: String,
    /// A restart into this release waits for the running release, started
    /// once with a snapshot after every entry, to be proven (and so to
    /// have snapshotted past what the next cannot replay).
    readying: Option<Version>,
    /// The running release was started once already to take that
    /// snapshot.
    readied: bool,
    /// Refusals decided in a row (see [`REFUSALS_TO_END`]).
    refusals: u32,
    /// The last wait is for something that moves by itself soon
    /// ([`moves_soon`]): the next round comes after `Timing::soon_every`.
    soon: bool,
}

/// Observations in a row that must refuse before a member ends its roll
/// on a refusal: a member that just restarted reports the cluster version
/// its data held for a moment (seen: 8 ms), and the lowest version told
/// is the view's, so one observation may show a member two minors ahead.
const REFUSALS_TO_END: u32 = 3;

/// Rate-limits the progress lines: a line when the reason changes, or
/// every `every` while it does not.
struct Reporter {
    every: Duration,
    last: Option<(String, Instant)>,
    since: Instant,
}

impl Reporter {
    fn new(every: Duration) -> Self {
        Reporter {
            every,
            last: None,
            since: Instant::now(),
        }
    }

    fn wait(&mut self, kind: &str, line: &dyn fmt::Display) {
        let now = Instant::now();
        let due = match &self.last {
            Some((last_kind, at)) => last_kind != kind || now.duration_since(*at) >= self.every,
            None => true,
        };
        if let Some((last_kind, _)) = &self.last {
            if last_kind != kind {
                self.since = now;
            }
        } else {
            self.since = now;
        }
        if due {
            log::info(
                &line.to_string(),
                &[("waiting_ms", log::ms(now.duration_since(self.since)))],
            );
            self.last = Some((kind.to_string(), now));
        }
    }

    fn reset(&mut self) {
        self.last = None;
    }
}

/// A short name for a wait's kind, so one reason repeated is one line per
/// [`Timing::progress_every`] and a new reason is a line at once.
fn waiting_kind(waiting: &Waiting) -> String {
    match waiting {
        Waiting::OwnNotProven { running } => format!("own {running}"),
        Waiting::ClusterVersion { want, behind, .. } => format!(
            "cv {want} {}",
            behind.as_ref().map_or("", |b| b.member.as_str())
        ),
        Waiting::MemberDown { member, .. } => format!("down {member}"),
        Waiting::Learner { member } => format!("learner {member}"),
        Waiting::Alarms(alarms) => format!("alarms {}", alarms.join(",")),
        Waiting::LockHeld { member } => format!("lock {member}"),
        Waiting::PatchFloor { behind, .. } => format!("floor {}", behind.member),
        Waiting::NoWayBack { target, .. } => format!("back {target}"),
        Waiting::StorageVersion { want, have } => format!("storage {want} {have}"),
        Waiting::Downgrading { to, cluster } => format!("downgrading {to} {cluster}"),
        Waiting::Rollout { member, .. } => format!("rollout {member}"),
    }
}

/// How many other members `view` shows up.
fn answered(rolling: &Rolling, view: &View) -> usize {
    view.members
        .iter()
        .filter(|m| m.id != rolling.own_id)
        .filter(|m| matches!(m.reach, crate::cluster::Reach::Up(_)))
        .count()
}

/// Whether `view` refuses our start at `first` ([`choose_start`]'s
/// refusals: no member answers but some turn our TLS away, or the
/// decision on the view, toward `goal`, refuses).
fn start_refusal(rolling: &Rolling, first: Version, goal: &Goal, view: &View) -> Option<Refusal> {
    if answered(rolling, view) == 0 {
        // They listen, but not to our TLS: our etcd would not reach them
        // either. Nothing has started; the operator rolls the TLS change
        // out on its own first.
        return (!view.tls_refused.is_empty()).then(|| Refusal::PeerTlsRefused {
            refused: tls_refusals(view),
            recorded: rolling.recorded.version,
        });
    }
    match decide(view, &own(rolling, first, false), goal) {
        Decision::Refuse(refusal) => Some(refusal),
        _ => None,
    }
}

/// Each member that turned our TLS away, and why: `name peer-urls: why`.
fn tls_refusals(view: &View) -> String {
    view.members
        .iter()
        .filter_map(|m| {
            view.tls_refused.get(&m.id).map(|why| {
                format!(
                    "{} {}: {why}",
                    if m.name.is_empty() {
                        "(unstarted)"
                    } else {
                        &m.name
                    },
                    m.peer_urls.join(",")
                )
            })
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// Asks the cluster before our etcd starts, and chooses the release it
/// starts with. What refuses the run whatever happens next (not a member,
/// behind the cluster version, two minors ahead, a peer-URL change with a
/// version change) is an exit 2 with nothing started. A target below the
/// cluster version is not: the member starts its own release and waits,
/// saying why (an exit at every restart of the rollout would take the
/// cluster down one member at a time).
///
/// Our member is down already (its container just started), so starting
/// it one hop further than `first` takes nobody else down: the next patch
/// of its minor, or the next minor when the cluster version is our minor
/// (etcd's rule: one minor ahead at most). A one-minor rollout then costs
/// each member one restart, the operator's own, and entrypoint-initiated
/// restarts (under the lock) are left for the waves after it, when the
/// operator's rollout is over.
pub async fn choose_start<C: Coordination, L: Ledger>(
    rolling: &Rolling,
    first: Version,
    cluster: &mut C,
    ledger: &mut L,
) -> Result<Version, RollError> {
    let goal = Goal {
        target: rolling.target.version,
        next: next_release(first, rolling),
    };
    let mut view = cluster.peers().await;
    // A refusal stands only when [`REFUSALS_TO_END`] observations a round
    // apart agree, as in the loop: a peer still starting can answer with
    // less than it holds (a 2.2.1 member restarted beside us listed only
    // itself in its `/members` for a moment, and we refused as removed).
    let mut refusal = start_refusal(rolling, first, &goal, &view);
    for _ in 1..REFUSALS_TO_END {
        if refusal.is_none() {
            break;
        }
        tokio::time::sleep(rolling.timing.round).await;
        view = cluster.peers().await;
        refusal = start_refusal(rolling, first, &goal, &view);
    }
    if let Some(refusal) = refusal {
        return Err(refusal.into());
    }
    if answered(rolling, &view) == 0 {
        // All down (restarted at once, or a cluster being recovered): the
        // data's own cluster version bounds what ours may run, and etcd
        // refuses the rest itself.
        log::info(
            "no other member answers yet; starting this member to form the quorum",
            &[("release", first.to_string().into())],
        );
        return Ok(first);
    }
    let Some(next) = goal.next else {
        return Ok(first);
    };
    if next < first {
        // Going down: one hop down only where the cluster's downgrade is
        // on (its version already dropped) and this member's data is in
        // the older schema already; else where the data is, the downgrade
        // going through the cluster (enabled under the lock, then member
        // by member).
        let to = next.minor_line();
        if next.rolls_down_from_next_minor() && first.minor_line() == to.next() {
            // 3.5 to a 3.4.32+ needs no job: the member is down already
            // (restarted by the rollout), so it comes back on 3.4 at
            // once instead of once more later (etcd's guide does the
            // same restart by hand).
            log::info(
                "starting this member one hop down: it is down already, and a 3.4.32+ release joins a 3.5 cluster with no downgrade job",
                &[
                    ("from", first.to_string().into()),
                    ("release", next.to_string().into()),
                ],
            );
            return Ok(next);
        }
        let storage = ledger
            .storage_version()
            .map_err(|e| RollError::action("reading this member's storage version", &e))?;
        if view.cluster_version == Some(to) && storage == Some(to) {
            log::info(
                "starting this member one hop down: it is down already, the cluster's downgrade is on and its data is in the older schema",
                &[
                    ("from", first.to_string().into()),
                    ("release", next.to_string().into()),
                    ("storage_version", to.to_string().into()),
                ],
            );
            return Ok(next);
        }
        return Ok(first);
    }
    let patch = next.minor_line() == first.minor_line();
    let floor_met =
        crate::cluster::decide::patch_floor_unmet(&view, rolling.own_id, next).is_none();
    if patch || (view.cluster_version == Some(first.minor_line()) && floor_met) {
        let blocker = ledger
            .replay_blocker(next)
            .map_err(|e| RollError::action(format!("reading this member's WAL for {next}"), &e))?;
        if let Some(why) = blocker {
            // Readying the data takes one more start and stop: under the
            // lock, with the others up, not at our own start.
            log::info(
                "starting this member with its own release: the next cannot replay its data yet; the wave readies it under the upgrade lock",
                &[
                    ("release", first.to_string().into()),
                    ("next", next.to_string().into()),
                    ("why", why.into()),
                ],
            );
            return Ok(first);
        }
        log::info(
            "starting this member one hop further: it is down already, and the cluster allows it",
            &[
                ("from", first.to_string().into()),
                ("release", next.to_string().into()),
                (
                    "cluster_version",
                    view.cluster_version
                        .map_or("unknown".to_string(), |cv| cv.to_string())
                        .into(),
                ),
            ],
        );
        return Ok(next);
    }
    Ok(first)
}

fn own(rolling: &Rolling, running: Version, proven: bool) -> Own {
    Own {
        id: rolling.own_id,
        running,
        proven,
        configured_peer_urls: rolling.configured_peer_urls.clone(),
    }
}

/// The whole run of one member: start `first`, roll, then serve until our
/// etcd exits or a stop request comes.
pub async fn run<C, E, L>(
    rolling: &Rolling,
    first: Version,
    cluster: &mut C,
    etcd: &mut E,
    ledger: &mut L,
    mut termination: watch::Receiver<Option<Signal>>,
) -> Result<Ended, RollError>
where
    C: Coordination,
    E: MemberEtcd,
    L: Ledger,
{
    if first != rolling.recorded.version && Some(first) != rolling.marked {
        ledger.mark(first).map_err(|e| {
            RollError::action(format!("marking {first} as starting on the data"), &e)
        })?;
    }
    start(etcd, first).await?;
    let mut member = State {
        running: first,
        proven: false,
        started_under_lock: None,
        holding: false,
        tried_transfer: false,
        last_proof_error: String::new(),
        readying: None,
        readied: false,
        refusals: 0,
        soon: false,
    };
    if let Err(err) = roll(
        rolling,
        &mut member,
        cluster,
        etcd,
        ledger,
        &mut termination,
    )
    .await
    {
        give_up(&mut member, cluster, etcd).await;
        // A stop request that came during a failing action explains it.
        let stopped = *termination.borrow();
        return Err(match stopped {
            Some(signal) => RollError::Interrupted(signal),
            None => err,
        });
    }
    if member.holding {
        // Only a refusal ends the roll with the lock still held.
        if let Err(err) = cluster.release_lock().await {
            log::warn(
                "could not release the upgrade lock; it expires by itself within its TTL",
                &[("error", crate::log::error_chain(&err).into())],
            );
        }
    }
    if rolling.then_pause && member.running == rolling.target.version && member.proven {
        log::info(
            "this member runs the release the pause job starts from; its etcd serves on into the job",
            &[("release", member.running.to_string().into())],
        );
        return Ok(Ended::Rolled);
    }
    serve(etcd, &mut termination).await
}

async fn start<E: MemberEtcd>(etcd: &mut E, release: Version) -> Result<(), RollError> {
    let started = Instant::now();
    etcd.start(release)
        .await
        .map_err(|e| RollError::action(format!("starting this member's etcd {release}"), &e))?;
    log::info(
        "member etcd started",
        &[
            ("release", release.to_string().into()),
            ("ms", log::ms(started.elapsed())),
        ],
    );
    Ok(())
}

/// After a failure: our etcd stops (when it still runs) and the lock is
/// released, in that order, so nobody restarts while we are still going
/// down.
async fn give_up<C: Coordination, E: MemberEtcd>(
    member: &mut State,
    cluster: &mut C,
    etcd: &mut E,
) {
    if etcd.exited().is_none() {
        if let Err(err) = etcd.stop().await {
            log::warn(
                "stopping this member's etcd failed",
                &[("error", crate::log::error_chain(&err).into())],
            );
        }
    }
    if member.holding {
        match cluster.release_lock().await {
            Ok(()) => log::info("upgrade lock released", &[]),
            Err(err) => log::warn(
                "could not release the upgrade lock; it expires by itself within its TTL",
                &[("error", crate::log::error_chain(&err).into())],
            ),
        }
        member.holding = false;
    }
}

/// The observe → decide → act loop, until `Done` or `Stay`.
async fn roll<C, E, L>(
    rolling: &Rolling,
    member: &mut State,
    cluster: &mut C,
    etcd: &mut E,
    ledger: &mut L,
    termination: &mut watch::Receiver<Option<Signal>>,
) -> Result<(), RollError>
where
    C: Coordination,
    E: MemberEtcd,
    L: Ledger,
{
    let mut reporter = Reporter::new(rolling.timing.progress_every);
    loop {
        if let Some(signal) = *termination.borrow() {
            return Err(RollError::Interrupted(signal));
        }
        if let Some(status) = etcd.exited() {
            return Err(RollError::EtcdExited {
                release: member.running,
                status,
                target: rolling.target.version,
            });
        }
        if !member.proven {
            prove(rolling, member, cluster, ledger).await?;
        }
        if member.proven {
            announce(rolling, cluster).await;
            if let Some(into) = member.readying.take() {
                restart(rolling, member, etcd, ledger, into).await?;
                continue;
            }
        }
        if member.holding {
            if let Err(err) = cluster.keep_lock().await {
                log::warn(
                    "could not refresh the upgrade lock",
                    &[("error", crate::log::error_chain(&err).into())],
                );
            }
        }
        let decided = match cluster.observe().await {
            Ok(view) => Decided {
                decision: decide(
                    &view,
                    &own(rolling, member.running, member.proven),
                    &Goal {
                        target: rolling.target.version,
                        next: next_release(member.running, rolling),
                    },
                ),
                leader: view.leader,
            },
            Err(err) => {
                reporter.wait(
                    "observe",
                    &format!(
                        "waiting for the cluster's client API to answer: {}",
                        crate::log::error_chain(&err)
                    ),
                );
                pause(between_rounds(rolling, member), termination).await;
                continue;
            }
        };
        match act(
            rolling,
            member,
            cluster,
            etcd,
            ledger,
            decided,
            &mut reporter,
        )
        .await?
        {
            Next::Observe => {}
            Next::Pause => pause(between_rounds(rolling, member), termination).await,
            Next::Finished => return Ok(()),
        }
    }
}

/// Announces our target once our etcd serves (a failure is said and tried
/// again next round: until it lands, the others wait on us, never the
/// reverse).
async fn announce<C: Coordination>(rolling: &Rolling, cluster: &mut C) {
    match cluster.announce(rolling.target).await {
        Ok(false) => {}
        Ok(true) => {
            log::info(
                "target announced",
                &[("target", rolling.target.to_string().into())],
            );
        }
        Err(err) => log::warn(
            "could not announce this member's target; trying again next round",
            &[("error", crate::log::error_chain(&err).into())],
        ),
    }
}

/// The pause before the next round: shorter while our etcd is unproven
/// (a just-started etcd answers within a second or two, and the roll waits
/// on its proof).
fn between_rounds(rolling: &Rolling, member: &State) -> Duration {
    if !member.proven {
        rolling.timing.prove_every
    } else if member.soon {
        rolling.timing.soon_every
    } else {
        rolling.timing.round
    }
}

/// How long a member may be down and still count as restarting.
const SOON_DOWN: Duration = Duration::from_secs(30);

/// Whether what we wait for moves by itself within a second or two (a
/// member's restart under the lock, the cluster version following the
/// last member of a wave, etcd lowering a storage version or a cluster
/// version): then the next round comes sooner, so a wave's members follow
/// one another as closely as by hand (issue 30). A member down for long,
/// a rollout not over, a target with no way back wait on people: the long
/// round.
fn moves_soon(waiting: &Waiting) -> bool {
    match waiting {
        Waiting::LockHeld { .. }
        | Waiting::Downgrading { .. }
        | Waiting::StorageVersion { .. }
        | Waiting::OwnNotProven { .. } => true,
        Waiting::ClusterVersion { behind, .. } => behind
            .as_ref()
            .is_none_or(|b| matches!(b.reach, crate::cluster::Reach::Up(_))),
        // A member down for seconds is restarting (the rollout's or its
        // own restart); one down for longer waits on someone.
        Waiting::MemberDown { down_for, .. } => *down_for < SOON_DOWN,
        Waiting::Learner { .. }
        | Waiting::Alarms(_)
        | Waiting::NoWayBack { .. }
        | Waiting::Rollout { .. }
        | Waiting::PatchFloor { .. } => false,
    }
}

/// A decision with the leader it was made under (for the transfer).
struct Decided {
    decision: Decision,
    leader: Option<u64>,
}

enum Next {
    /// Observe again at once (the decision must be made again).
    Observe,
    /// Wait a round.
    Pause,
    /// The roll is over for this member.
    Finished,
}

async fn act<C, E, L>(
    rolling: &Rolling,
    member: &mut State,
    cluster: &mut C,
    etcd: &mut E,
    ledger: &mut L,
    decided: Decided,
    reporter: &mut Reporter,
) -> Result<Next, RollError>
where
    C: Coordination,
    E: MemberEtcd,
    L: Ledger,
{
    if !matches!(decided.decision, Decision::Refuse(_)) {
        member.refusals = 0;
    }
    member.soon = match &decided.decision {
        Decision::Wait(waiting) => moves_soon(waiting),
        // A lock another member holds is let go when its restart is over.
        Decision::TakeLock => true,
        _ => false,
    };
    match decided.decision {
        Decision::Wait(waiting) => {
            match &waiting {
                // Say why: the last proof attempt's error.
                Waiting::OwnNotProven { .. } if !member.last_proof_error.is_empty() => reporter
                    .wait(
                        &waiting_kind(&waiting),
                        &format!("{waiting}: {}", member.last_proof_error),
                    ),
                _ => reporter.wait(&waiting_kind(&waiting), &waiting),
            }
            Ok(Next::Pause)
        }
        Decision::TakeLock => match cluster.take_lock().await {
            Ok(Taken::Ours) => {
                crate::failpoint!("cluster-after-lock");
                reporter.reset();
                member.holding = true;
                member.tried_transfer = false;
                log::info(
                    "upgrade lock taken",
                    &[("member", rolling.own_name.as_str().into())],
                );
                // Decide again on a fresh observation, now that we hold it.
                Ok(Next::Observe)
            }
            Ok(Taken::HeldBy(holder)) => {
                reporter.wait(
                    &format!("lock {}", holder.member),
                    &format!(
                        "waiting for member {} ({}) to finish its restart",
                        holder.name, holder.member
                    ),
                );
                Ok(Next::Pause)
            }
            Err(err) => {
                reporter.wait(
                    "lock",
                    &format!(
                        "waiting to take the upgrade lock: {}",
                        crate::log::error_chain(&err)
                    ),
                );
                Ok(Next::Pause)
            }
        },
        Decision::MoveLeader { to } => {
            if member.tried_transfer {
                // Tried once in this hold: the graceful stop hands it over.
                return restart(
                    rolling,
                    member,
                    etcd,
                    ledger,
                    next_or_running(rolling, member),
                )
                .await;
            }
            member.tried_transfer = true;
            let from = decided.leader.unwrap_or(rolling.own_id);
            let started = Instant::now();
            match cluster.move_leader(from, to).await {
                Ok(()) => log::info(
                    "leadership moved",
                    &[
                        ("from", format!("{from:x}").into()),
                        ("to", format!("{to:x}").into()),
                        ("ms", log::ms(started.elapsed())),
                    ],
                ),
                Err(err) => log::warn(
                    "leadership not moved; the graceful stop makes the others elect",
                    &[("error", crate::log::error_chain(&err).into())],
                ),
            }
            Ok(Next::Observe)
        }
        Decision::Restart { into } => restart(rolling, member, etcd, ledger, into).await,
        Decision::EnableDowngrade { to } => {
            let started = Instant::now();
            match cluster.enable_downgrade(to).await {
                Ok(()) => {
                    log::info(
                        "downgrade enabled",
                        &[
                            ("to", to.to_string().into()),
                            ("member", rolling.own_name.as_str().into()),
                            ("ms", log::ms(started.elapsed())),
                        ],
                    );
                    // The leader lowers the cluster version on its own
                    // time: look again after a round.
                    Ok(Next::Pause)
                }
                Err(err) => {
                    reporter.wait(
                        "enable",
                        &format!(
                            "waiting to enable etcd's downgrade to {to}: {}",
                            crate::log::error_chain(&err)
                        ),
                    );
                    Ok(Next::Pause)
                }
            }
        }
        Decision::CancelDowngrade => {
            let started = Instant::now();
            match cluster.cancel_downgrade().await {
                Ok(()) => {
                    log::info(
                        "downgrade job ended",
                        &[
                            ("target", rolling.target.version.to_string().into()),
                            ("ms", log::ms(started.elapsed())),
                        ],
                    );
                    // The leader takes a moment to recompute the cluster
                    // version: look again after a round, not at once.
                    Ok(Next::Pause)
                }
                Err(err) => {
                    reporter.wait(
                        "cancel",
                        &format!(
                            "waiting to end etcd's downgrade job: {}",
                            crate::log::error_chain(&err)
                        ),
                    );
                    Ok(Next::Pause)
                }
            }
        }
        Decision::ReleaseLock => {
            if !member.holding {
                // The lock is our member's from a run that was killed: its
                // value names that run, and only the holder's own value
                // may delete the key. Take it over first (its swap is
                // compare-and-swap on that value).
                cluster
                    .take_lock()
                    .await
                    .map_err(|e| RollError::action("taking over our member's upgrade lock", &e))?;
            }
            if let Err(err) = cluster.release_lock().await {
                // Not fatal: the next round decides again (and releases
                // again); the lock expires by itself within its TTL.
                reporter.wait(
                    "release",
                    &format!(
                        "waiting to release the upgrade lock: {}",
                        crate::log::error_chain(&err)
                    ),
                );
                return Ok(Next::Pause);
            }
            member.holding = false;
            member.started_under_lock = None;
            log::info(
                "upgrade lock released",
                &[
                    ("member", rolling.own_name.as_str().into()),
                    ("release", member.running.to_string().into()),
                ],
            );
            Ok(Next::Pause)
        }
        Decision::Done => {
            log::info(
                "cluster roll done for this member",
                &[("release", member.running.to_string().into())],
            );
            Ok(Next::Finished)
        }
        Decision::Stay(reason) => {
            log::warn(&reason, &[("release", member.running.to_string().into())]);
            Ok(Next::Finished)
        }
        Decision::Refuse(refusal) if member.refusals + 1 < REFUSALS_TO_END => {
            // A member that just restarted reports the cluster version its
            // data held until it catches up (milliseconds): one
            // observation must not end the roll.
            member.refusals += 1;
            reporter.wait(
                "refusal",
                &format!(
                    "{refusal} (seen {} time(s) in a row; this member ends its roll only if it holds for {REFUSALS_TO_END} observations)",
                    member.refusals
                ),
            );
            Ok(Next::Pause)
        }
        Decision::Refuse(refusal) => {
            // Our etcd serves as a member: stopping it now would only cost
            // the cluster a voter. It keeps serving; nothing more changes.
            log::error(
                &format!(
                    "{refusal}; this member keeps serving {} and changes nothing more",
                    member.running
                ),
                &[],
            );
            Ok(Next::Finished)
        }
    }
}

fn next_or_running(rolling: &Rolling, member: &State) -> Version {
    next_release(member.running, rolling).unwrap_or(member.running)
}

/// Stop our etcd, mark the next release on the data, start it.
async fn restart<E: MemberEtcd, L: Ledger>(
    rolling: &Rolling,
    member: &mut State,
    etcd: &mut E,
    ledger: &mut L,
    into: Version,
) -> Result<Next, RollError> {
    let stopping = Instant::now();
    let status = etcd.stop().await.map_err(|e| {
        RollError::action(
            format!("stopping this member's etcd {}", member.running),
            &e,
        )
    })?;
    log::info(
        "member etcd stopped",
        &[
            ("release", member.running.to_string().into()),
            ("status", status.to_string().into()),
            ("ms", log::ms(stopping.elapsed())),
        ],
    );
    crate::failpoint!("cluster-after-stop");
    let blocker = ledger
        .replay_blocker(into)
        .map_err(|e| RollError::action(format!("reading this member's WAL for {into}"), &e))?;
    if let Some(why) = blocker {
        if member.readied {
            // It took its snapshot and it was not enough (a config file
            // that overrides --snapshot-count, say): nothing more to try.
            return Err(RollError::NotReadied {
                into,
                running: member.running,
                why,
            });
        }
        log::info(
            "this member's WAL holds what the next release cannot replay; its own release starts once more, taking a snapshot past it, before the restart",
            &[
                ("release", member.running.to_string().into()),
                ("next", into.to_string().into()),
                ("why", why.into()),
            ],
        );
        etcd.start_snapshotting(member.running).await.map_err(|e| {
            RollError::action(
                format!(
                    "starting this member's etcd {} to take a snapshot",
                    member.running
                ),
                &e,
            )
        })?;
        member.proven = false;
        member.readying = Some(into);
        member.readied = true;
        member.started_under_lock = Some(Instant::now());
        return Ok(Next::Pause);
    }
    member.readied = false;
    ledger
        .mark(into)
        .map_err(|e| RollError::action(format!("marking {into} as starting on the data"), &e))?;
    start(etcd, into).await?;
    crate::failpoint!("cluster-after-start");
    log::info(
        "member restarting into the next release",
        &[
            ("from", member.running.to_string().into()),
            ("to", into.to_string().into()),
            ("target", rolling.target.version.to_string().into()),
        ],
    );
    member.running = into;
    member.proven = false;
    member.started_under_lock = Some(Instant::now());
    // A second restart in the same hold (the wave's last member goes on to
    // the next minor at once) hands leadership away again first.
    member.tried_transfer = false;
    Ok(Next::Pause)
}

/// One attempt at proving our etcd; records it when it holds. Under the
/// lock, past the deadline, the run gives up.
async fn prove<C: Coordination, L: Ledger>(
    rolling: &Rolling,
    member: &mut State,
    cluster: &mut C,
    ledger: &mut L,
) -> Result<(), RollError> {
    match cluster.prove(member.running).await {
        Ok(()) => {
            ledger.record(member.running).map_err(|e| {
                RollError::action(format!("recording {} in version.txt", member.running), &e)
            })?;
            if member.started_under_lock.is_some() {
                crate::failpoint!("cluster-after-record");
            }
            member.proven = true;
            log::info(
                "member proven",
                &[
                    ("release", member.running.to_string().into()),
                    ("recorded", "version.txt".into()),
                ],
            );
            Ok(())
        }
        Err(err) => {
            member.last_proof_error = crate::log::error_chain(&err);
            match member.started_under_lock {
                Some(at) if at.elapsed() > rolling.timing.prove_deadline => {
                    Err(RollError::NotProven {
                        release: member.running,
                        recorded: rolling.recorded.version,
                        deadline: rolling.timing.prove_deadline,
                        reason: member.last_proof_error.clone(),
                    })
                }
                _ => Ok(()),
            }
        }
    }
}

async fn pause(round: Duration, termination: &mut watch::Receiver<Option<Signal>>) {
    if termination.borrow().is_some() {
        return;
    }
    tokio::select! {
        _ = tokio::time::sleep(round) => {}
        _ = termination.changed() => {}
    }
}

/// After the roll: our etcd serves until it exits, or a stop request comes
/// (then it is stopped gracefully, and we report the signal).
pub(crate) async fn serve<E: MemberEtcd>(
    etcd: &mut E,
    termination: &mut watch::Receiver<Option<Signal>>,
) -> Result<Ended, RollError> {
    loop {
        if let Some(signal) = *termination.borrow() {
            etcd.stop()
                .await
                .map_err(|e| RollError::action("stopping this member's etcd", &e))?;
            return Ok(Ended::Stopped(signal));
        }
        tokio::select! {
            status = etcd.wait() => return Ok(Ended::Exited(status)),
            changed = termination.changed() => {
                if changed.is_err() {
                    // The signal thread is gone: only the child's exit remains.
                    return Ok(Ended::Exited(etcd.wait().await));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
