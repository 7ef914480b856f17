//! This module owns the run as a whole: read the data dir, plan, check
//! every precondition before anything is touched, carry out the steps, and
//! say what to do next (exec the target or exit). `main` only parses, calls
//! [`run`] and maps the result to an exit code.

// Errors here carry the paths, versions and etcd output an operator needs;
// they travel up once per process, so their size costs nothing.
#![allow(clippy::result_large_err)]

pub mod backup;
pub mod baseline;
pub mod binaries;
pub mod cluster;
pub mod config;
pub mod datadir;
pub mod dialect;
pub mod downgrade;
pub mod durable;
pub mod effects;
pub mod etcd;
pub mod exec;
pub mod executor;
pub mod failpoint;
pub mod grpc;
pub mod health;
pub mod keyspace;
pub mod listener;
pub mod log;
pub mod ondisk;
pub mod paths;
pub mod plan;
pub mod preconditions;
pub mod restore;
pub mod steps;
pub mod supervisor;
pub mod survey;
pub mod swap;
pub mod tls;
pub mod version;

use std::io::Write;
use std::time::Instant;

use nix::sys::signal::{SigSet, Signal};

use crate::binaries::BinError;
use crate::config::{Config, Member, Mode};
use crate::datadir::{DataDirError, DirState};
use crate::exec::ExecTarget;
use crate::executor::{ExecuteError, Executor, Progress, StepSettings};
use crate::ondisk::OnDisk;
use crate::plan::{Binary, Bundle, Plan, PlanError, Refusal, Site, Situation, Work};
use crate::preconditions::PreconditionError;
use crate::supervisor::{Supervisor, SupervisorError};
use crate::survey::{Survey, SurveyError};
use crate::version::{Storage, Version, VersionPair};

/// Exit code: migrated (and, with `--no-exec`, done).
pub const EXIT_OK: u8 = 0;
/// Exit code: an unexpected failure outside a step (e.g. exec).
pub const EXIT_FAILURE: u8 = 1;
/// Exit code: bad configuration or precondition; nothing was touched.
pub const EXIT_PRECONDITION: u8 = 2;
/// Exit code: a step failed; the data is as the last completed step left
/// it and version.txt says which.
pub const EXIT_STEP_FAILED: u8 = 3;

/// What `main` does after a successful run.
#[derive(Debug)]
pub enum Outcome {
    /// Exit 0.
    Exit,
    /// Replace the process with the target etcd.
    Exec(ExecTarget),
    /// Exit with this code: the member etcd we supervised (cluster mode)
    /// ended so.
    ExitCode(u8),
}

/// Why the run stopped.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The data dir is unusable as it is.
    #[error(transparent)]
    DataDir(#[from] DataDirError),
    /// A member with no data yet would join its cluster at a target that
    /// does not fit the cluster version.
    #[error(transparent)]
    Join(#[from] cluster::join::JoinRefusal),
    /// The member's etcd settings cannot carry talking to its cluster.
    #[error(transparent)]
    ClusterSettings(#[from] cluster::settings::SettingsError),
    /// The cluster mode refused or failed.
    #[error(transparent)]
    Cluster(#[from] cluster::entry::EntryError),
    /// No safe path exists.
    #[error("no safe path from {current} to {target} in {data_dir}{looked_in}")]
    Plan {
        /// What version.txt says.
        current: VersionPair,
        /// What was asked for.
        target: VersionPair,
        /// The data dir.
        data_dir: String,
        /// Where the releases were looked for, when that is the problem
        /// (see `looked_in`); empty otherwise.
        looked_in: String,
        /// Why.
        #[source]
        source: PlanError,
    },
    /// version.txt names a release newer than anything this image can run.
    #[error("{path} says {current}: the data was last run by etcd {}, newer than {known}, so no bundled etcd can serve it or roll it back; run an image that bundles etcd {}.x (and, to roll back, every minor down to the target), or correct {path} if it is wrong", .current.version, .current.version.minor_line())]
    FutureData {
        /// The version.txt file.
        path: String,
        /// What it says.
        current: VersionPair,
        /// What this image knows, for the message.
        known: String,
    },
    /// An empty or missing data dir cannot be started at the target.
    #[error("cannot start the empty data dir {data_dir} at the target{looked_in}")]
    FreshTarget {
        /// The data dir.
        data_dir: String,
        /// Where the releases were looked for (see `looked_in`).
        looked_in: String,
        /// Why.
        #[source]
        source: PlanError,
    },
    /// A needed binary is absent or wrong.
    #[error(transparent)]
    Binary(#[from] BinError),
    /// A check before anything is touched failed.
    #[error(transparent)]
    Precondition(#[from] PreconditionError),
    /// Steps are needed but the member is not alone in its cluster.
    #[error("INITIAL_CLUSTER {initial_cluster:?} lists {members} members, but etcd-migrate runs intermediate releases as an isolated single member, which cannot reach quorum in a multi-member cluster (and forcing a new cluster would split it); upgrade the cluster by rolling restarts, one minor at a time, with TARGET_VERSION set to the minor each member runs now")]
    MultiMember {
        /// The setting.
        initial_cluster: String,
        /// How many members it lists.
        members: usize,
    },
    /// The plan refuses the data as it stands.
    #[error("cannot migrate {data_dir}: {refusal}")]
    Refused {
        /// The data dir.
        data_dir: String,
        /// Why.
        refusal: Refusal,
    },
    /// The plan stopped in a step or was interrupted.
    #[error(transparent)]
    Execute(#[from] ExecuteError),
    /// version.txt could not be written outside a step.
    #[error("cannot record {pair} in {data_dir}")]
    Record {
        /// The pair.
        pair: VersionPair,
        /// The data dir.
        data_dir: String,
        /// Why.
        #[source]
        source: DataDirError,
    },
    /// Signal handling or process supervision failed.
    #[error(transparent)]
    Supervisor(#[from] SupervisorError),
    /// The async runtime or the HTTP client could not start.
    #[error("cannot start: {0}")]
    Runtime(String),
    /// A stop signal came outside a step.
    #[error("stopped by {0}")]
    Interrupted(Signal),
    /// A member with no data could not add itself to its cluster (issue
    /// 29; nothing was started).
    #[error(transparent)]
    SelfJoin(#[from] cluster::self_join::SelfJoinError),
    /// A join as a learner, after the add.
    #[error(transparent)]
    Learner(#[from] cluster::self_join::LearnerError),
    /// The restore from a snapshot (issue 29) was refused or failed.
    #[error(transparent)]
    Restore(#[from] restore::RestoreError),
    /// The whole-cluster pause job (issue 28) could not start here.
    #[error(transparent)]
    PauseEntry(#[from] cluster::pause::entry::EntryError),
    /// The whole-cluster pause job failed on this member.
    #[error(transparent)]
    Pause(#[from] cluster::pause::run::PauseError),
}

impl Error {
    /// The documented exit code for this error.
    pub fn exit_code(&self) -> u8 {
        match self {
            Error::DataDir(_)
            | Error::Join(_)
            | Error::ClusterSettings(_)
            | Error::Plan { .. }
            | Error::FreshTarget { .. }
            | Error::FutureData { .. }
            | Error::Refused { .. }
            | Error::Binary(_)
            | Error::MultiMember { .. } => EXIT_PRECONDITION,
            Error::Precondition(PreconditionError::Interrupted(signal)) => {
                signal_exit_code(*signal)
            }
            Error::Precondition(_) => EXIT_PRECONDITION,
            Error::Execute(ExecuteError::Step { .. } | ExecuteError::Baseline { .. }) => {
                EXIT_STEP_FAILED
            }
            Error::Execute(ExecuteError::Interrupted { signal, .. })
            | Error::Interrupted(signal) => signal_exit_code(*signal),
            Error::Cluster(err) => err.exit_code(),
            Error::Restore(err) if err.is_refusal() => EXIT_PRECONDITION,
            Error::SelfJoin(_) => EXIT_PRECONDITION,
            Error::Learner(err) => err.exit_code(),
            Error::Restore(_) => EXIT_STEP_FAILED,
            Error::PauseEntry(_) => EXIT_PRECONDITION,
            Error::Pause(cluster::pause::run::PauseError::Interrupted(signal)) => {
                signal_exit_code(*signal)
            }
            Error::Pause(_) => EXIT_FAILURE,
            Error::Record { .. } | Error::Supervisor(_) | Error::Runtime(_) => EXIT_FAILURE,
        }
    }
}

/// 128 + the signal number, the shell's convention for "killed by".
pub fn signal_exit_code(signal: Signal) -> u8 {
    128u8.saturating_add(signal as u8)
}

impl From<SurveyError> for Error {
    fn from(err: SurveyError) -> Self {
        match err {
            SurveyError::DataDir(err) => Error::DataDir(err),
            SurveyError::Precondition(err) => Error::Precondition(err),
            err @ SurveyError::ChangedWhileCreated { .. } => Error::Runtime(err.to_string()),
        }
    }
}

/// Records progress in the real data dir, through its survey.
struct SurveyProgress<'a>(&'a mut Survey);

impl Progress for SurveyProgress<'_> {
    fn record(&mut self, pair: VersionPair) -> Result<(), DataDirError> {
        self.0.record(pair)
    }
}

/// Carries out the whole run for `config`: inspect the data dir, plan,
/// check every precondition, carry the plan out, hand over. `original_mask`
/// is the signal mask `main` found at start; children and the exec'd etcd
/// get it back.
pub fn run(config: &Config, original_mask: SigSet) -> Result<Outcome, Error> {
    let started = Instant::now();
    log_overrides(config);
    let glance = survey::glance(
        &config.data_dir,
        config.restore.is_some(),
        config.force_new_cluster,
    )?;
    let restoring = config
        .restore
        .as_ref()
        .filter(|request| !restore::restored_before(&glance, request));
    if let Some(request) = restoring {
        return restore_snapshot(config, request, &glance, original_mask);
    }
    if config.force_new_cluster {
        if !glance.forced {
            return force_new_cluster(config, &glance, original_mask);
        }
        log::info(
            "this member was forced into a new cluster before (its data dir records it): --force-new-cluster does nothing again",
            &[],
        );
    }
    // Fast path: the data is already at the target. Nothing is spawned and
    // no thread is started, so handing over to etcd costs a few ms.
    if glance.at(config.target) {
        log::info(
            "already at target",
            &[
                ("version", config.target.to_string().into()),
                ("data_dir", config.data_dir.display().to_string().into()),
                ("ms", log::ms(started.elapsed())),
            ],
        );
        return finish(config);
    }
    let bundle = match &config.bundled_versions {
        Some(list) => Bundle::new(list.iter().copied()),
        None => binaries::scan(&config.bin_dir)?,
    };
    // The binaries' checks run while the data is read offline.
    let early = begin_checks(config, &glance, &bundle, original_mask);
    let mut survey = Survey::take(config, &glance)?;
    let state = survey.state();
    // A member in a whole-cluster pause job carries on with it, whatever
    // its data and its target say now: its record says where it is.
    if let Some(record) = cluster::pause::entry::read_record(config)? {
        // An agreement to a job whose target is no longer the member's
        // (raised or lowered before the go) is withdrawn first; a target
        // that needs no pause then runs as it would have.
        let target_pauses = match survey.on_disk() {
            Some(on_disk) => make_plan(
                config,
                survey.state(),
                &bundle,
                (on_disk.members.len(), on_disk.v2_requests_past_snapshot),
                survey.restart_mark().is_some(),
            )
            .ok()
            .map(|plan| matches!(plan.work(), Work::Pause { .. })),
            None => None,
        };
        let withdraw_only = record.withdraws_only(config.target, target_pauses);
        if config.mode == Mode::DryRun {
            if withdraw_only {
                println!(
                    "this member agreed to the whole-cluster pause job {} (to {}): a real run withdraws that agreement (the job has no go yet) and then goes to {} without a pause (see docs/cluster-pause.md)",
                    record.job, record.target, config.target
                );
            } else {
                println!(
                    "this member takes part in the whole-cluster pause job {} (to {}), phase {:?}: a real run carries on with it (see docs/cluster-pause.md)",
                    record.job, record.target, record.phase
                );
            }
            return Ok(Outcome::Exit);
        }
        return pause_as_member(
            config,
            survey,
            (Some(record), withdraw_only),
            bundle,
            original_mask,
        );
    }
    let marked = survey.restart_mark();
    let on_disk = survey.on_disk();
    let data_members = on_disk.map_or(0, |d| d.members.len());
    let v2_request = on_disk.and_then(|d| d.v2_requests_past_snapshot);
    let plan = make_plan(
        config,
        state,
        &bundle,
        (data_members, v2_request),
        marked.is_some(),
    )?;
    // A member that added itself to a live cluster starts with the
    // membership as it is now (`--initial-cluster`, appended last).
    let joined = if plan.is_fresh() && config.mode != Mode::DryRun {
        check_join(config, &mut survey)?
    } else {
        None
    };
    if let Some(joined) = joined.as_ref().filter(|j| j.learner) {
        log_plan(config, &plan, &config.member, &bundle);
        return join_as_learner(config, joined, survey, original_mask);
    }
    let joined = joined.map(|j| j.initial_cluster);
    let recorded_name = match survey.on_disk() {
        Some(on_disk) if plan.is_recorded() && (!plan.is_noop() || plan.cluster.is_some()) => {
            preconditions::check_recorded_data(config, &plan, on_disk)?
        }
        _ => None,
    };
    let member = match recorded_name {
        Some(name) => config.member.named(&name),
        None => config.member.clone(),
    };
    if plan.cluster.is_none() && plan.pause.is_none() {
        preconditions::check_before_steps(config, &plan)?;
    }
    binaries::check_present(&config.bin_dir, &plan.needed_binaries())?;
    if config.mode == Mode::DryRun {
        print_plan(config, plan, member, survey.scratch());
        return Ok(Outcome::Exit);
    }
    if let (Work::Roll { .. }, Some(_), Mode::NoExec) =
        (plan.work(), survey.on_disk(), &config.mode)
    {
        return hand_over_one_hop(config, &plan, survey, bundle);
    }
    if let Work::Pause { .. } = plan.work() {
        log_plan(config, &plan, &member, &bundle);
        return pause_as_member(config, survey, (None, false), bundle, original_mask);
    }
    if let (Work::Roll { .. }, Some(on_disk)) = (plan.work(), survey.on_disk()) {
        cluster::entry::check_mode(config, on_disk)?;
        log_plan(config, &plan, &member, &bundle);
        return roll_as_member(config, &plan, survey, bundle, original_mask);
    }
    log_plan(config, &plan, &member, &bundle);
    let on_disk = survey.take_on_disk();
    let offline = OfflineRead {
        baseline: offline_baseline(&plan, on_disk.as_ref()),
        hidden_v2: on_disk.map(|on_disk| on_disk.v2_hidden_paths),
    };
    let runtime = async_runtime()?;
    let supervisor = Supervisor::start(original_mask)?;
    carry_out(
        config,
        &plan,
        &member,
        (offline, early),
        survey,
        (&runtime, &supervisor),
    )?;
    log::info(
        "migrated",
        &[
            ("version", config.target.to_string().into()),
            ("steps", plan.steps.len().into()),
            ("ms", log::ms(started.elapsed())),
        ],
    );
    finish_joined(config, joined.as_deref())
}

/// The restore from a snapshot (issue 29), once: checked before anything
/// is touched, then carried out under the data dir's survey; the member
/// then serves the target as restored (every member restored from the
/// same file forms the cluster again, as by hand).
fn restore_snapshot(
    config: &Config,
    request: &config::RestoreRequest,
    glance: &survey::Glance,
    original_mask: SigSet,
) -> Result<Outcome, Error> {
    let started = Instant::now();
    let checked = restore::check(config, request)?;
    log::info(
        "snapshot checked",
        &[
            ("snapshot", request.file.display().to_string().into()),
            ("bytes", checked.bytes.into()),
            (
                "cluster_version",
                checked
                    .cluster_version
                    .clone()
                    .unwrap_or_else(|| "unknown".to_string())
                    .into(),
            ),
        ],
    );
    let restorer = Binary::snapshot_restorer(config.target.version);
    binaries::check_present(
        &config.bin_dir,
        &[restorer, Binary::etcd(config.target.version)],
    )?;
    if config.mode == Mode::DryRun {
        let shown = format!(
            "would restore {} from snapshot {} (sha256 {}) with {restorer}, then record {} and serve it\n",
            config.data_dir.display(),
            request.file.display(),
            request.sha256,
            config.target
        );
        let _ = std::io::stdout().lock().write_all(shown.as_bytes());
        return Ok(Outcome::Exit);
    }
    let mut survey = Survey::take(config, glance)?;
    let runtime = async_runtime()?;
    let supervisor = Supervisor::start(original_mask)?;
    let launcher = etcd::ProcessLauncher::new(supervisor.clone(), config.bin_dir.clone());
    let stop = || supervisor.terminated();
    runtime.block_on(restore::restore(
        config,
        (request, &checked),
        &mut survey,
        &launcher,
        &stop,
    ))?;
    if let Some(signal) = supervisor.terminated() {
        return Err(Error::Interrupted(signal));
    }
    drop(survey);
    log::info(
        "handing over the restored data",
        &[("ms", log::ms(started.elapsed()))],
    );
    finish(config)
}

/// `--force-new-cluster` (issue 29): this surviving member, at its target,
/// becomes a cluster of one once (`cluster::entry::force_new_cluster`),
/// the force recorded, then handed over as every start is.
fn force_new_cluster(
    config: &Config,
    glance: &survey::Glance,
    original_mask: SigSet,
) -> Result<Outcome, Error> {
    let refused = |why: String| {
        Error::Cluster(cluster::entry::EntryError::Force(
            cluster::force::ForceError::Refused { why },
        ))
    };
    if !matches!(config.mode, Mode::Exec { .. }) {
        return Err(refused(
            "it runs the member's etcd with the member's own flags, given after `--` (the entrypoint form, as examples/ha/ does); --no-exec and --dry-run exit before etcd starts".to_string(),
        ));
    }
    let Some(DirState::Recorded(pair)) = glance.state.clone() else {
        return Err(refused(format!(
            "{} records no data (version.txt) to force a cluster from",
            config.data_dir.display()
        )));
    };
    if pair != config.target || glance.interrupted {
        return Err(refused(format!(
            "the data is at {pair}, not at the target {} (or a run was interrupted): force the new cluster at the release the data records, TARGET_VERSION={pair}, then change the target",
            config.target
        )));
    }
    let mut survey = Survey::take(config, glance)?;
    let Some(on_disk) = survey.read_now(config).cloned() else {
        return Err(refused(format!(
            "the data in {} could not be read offline (see the line above)",
            config.data_dir.display()
        )));
    };
    let runtime = async_runtime()?;
    let supervisor = Supervisor::start(original_mask)?;
    let removed = cluster::entry::force_new_cluster(config, pair, &on_disk, &runtime, &supervisor)?;
    if let Some(signal) = supervisor.terminated() {
        return Err(Error::Interrupted(signal));
    }
    let record = serde_json::json!({
        "forced": humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string(),
        "release": pair.to_string(),
        "left_behind": removed,
    });
    survey
        .record_forced(&record.to_string())
        .map_err(|source| Error::Record {
            pair,
            data_dir: config.data_dir.display().to_string(),
            source,
        })?;
    log::info(
        "forced a new cluster of this member alone; the others join it again with an empty data dir and --initial-cluster-state existing",
        &[("left_behind", removed.join(",").into())],
    );
    drop(survey);
    finish(config)
}

/// What the run's offline read of the stopped data gives its steps.
struct OfflineRead {
    /// The plan's baseline, where the data allows one offline.
    baseline: Option<baseline::Offline>,
    /// The data's hidden v2 nodes, which the first step's reads ask for.
    hidden_v2: Option<Vec<String>>,
}

/// The plan's baseline taken offline from the stopped data, where the
/// plan reads one and the data allows it; which way it is read, and why,
/// is logged either way.
fn offline_baseline(plan: &Plan, on_disk: Option<&OnDisk>) -> Option<baseline::Offline> {
    let recorded = plan.baseline?;
    let offline = match on_disk {
        Some(on_disk) => baseline::offline(plan, on_disk),
        None => Err("the data could not be read offline".to_string()),
    };
    match offline {
        Ok(offline) => {
            let (taken, proven_by) = match plan.current.storage {
                Storage::Etcd3 => (
                    "hashed from bolt, on a thread, while the binaries are verified and the first step's etcd starts",
                    "the first step's etcd hashing the same revision",
                ),
                Storage::Etcd2 => (
                    "the v2 store replayed from the newest snapshot and the log",
                    "the first step's etcd reading the whole v2 store",
                ),
            };
            log::info(
                "baseline taken offline",
                &[("taken", taken.into()), ("proven_by", proven_by.into())],
            );
            Some(offline)
        }
        Err(why) => {
            log::info(
                "baseline read by a start of the recorded release",
                &[
                    ("version", recorded.to_string().into()),
                    ("why", why.into()),
                ],
            );
            None
        }
    }
}

/// A member with no data yet: if `--initial-cluster` (or `INITIAL_CLUSTER`)
/// names other members, they are asked their cluster version, and the
/// target must fit it (`cluster::join`). Nobody answering means a cluster
/// being bootstrapped.
fn check_join(
    config: &Config,
    survey: &mut Survey,
) -> Result<Option<cluster::self_join::Joined>, Error> {
    let args = config.member_args();
    let initial_cluster = config::flag_in_args(&args, "initial-cluster").unwrap_or_default();
    let name = config::flag_in_args(&args, "name").unwrap_or_default();
    let others = cluster::join::other_members(&initial_cluster, &name);
    if others.is_empty() {
        return Ok(None);
    }
    let env = |name: &str| std::env::var(name).ok();
    // The TLS the other members' peer URLs need (not our own advertised
    // ones: a joiner's may be unset here, GCE style).
    let urls: Vec<String> = others.iter().map(|peer| peer.url.clone()).collect();
    let peer_tls = cluster::settings::peer_tls(&args, &env, &urls)?;
    let asking = Instant::now();
    let runtime = async_runtime()?;
    let told = runtime.block_on(cluster::join::ask(&others, peer_tls.as_ref()))?;
    let answered = told.iter().filter(|(_, answer)| answer.is_ok()).count();
    log::info(
        "asked the cluster this member joins",
        &[
            ("members", others.len().into()),
            ("answered", answered.into()),
            ("ms", log::ms(asking.elapsed())),
        ],
    );
    cluster::join::check(config.target.version, &told)?;
    // `--initial-cluster-state existing` on an empty data dir: the member
    // joins a live cluster, and adds itself to it (issue 29).
    let state = cluster::settings::value(&args, &env, "initial-cluster-state");
    if answered == 0 || state.as_deref() != Some("existing") {
        return Ok(None);
    }
    let peer_urls = cluster::settings::url_list(&args, &env, "initial-advertise-peer-urls");
    let client_urls = cluster::settings::url_list(&args, &env, "advertise-client-urls");
    let client_tls = cluster::settings::client_tls(&args, &env, &client_urls)?;
    // A learner where the release has them and this run stays beside its
    // etcd to promote it (not `--no-exec`, which exits before etcd runs:
    // a voter then, as `etcdctl member add` makes it). Its record first,
    // so that a start after a crash knows whose `member/` it finds.
    let as_learner = matches!(config.mode, Mode::Exec { .. })
        && cluster::self_join::joins_as_learner(config.target.version);
    if as_learner {
        survey.make_ready()?;
        let record = serde_json::json!({
            "target": config.target.to_string(),
            "name": name,
            "peer_urls": peer_urls,
            "since": humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string(),
        });
        datadir::write_joining(&config.data_dir, &record.to_string())?;
    }
    let joined = runtime.block_on(cluster::self_join::add_self(
        &others,
        &name,
        &peer_urls,
        peer_tls.as_ref(),
        client_tls.as_ref(),
        cluster::join::PROBE_TIMEOUT * 2,
        as_learner,
    ));
    if joined.is_err() && as_learner {
        // Refused or failed before any add: the data dir as it was.
        let _ = datadir::remove_joining(&config.data_dir);
    }
    Ok(Some(joined?))
}

/// A member that added itself as a learner ([`check_join`]): its etcd
/// runs as our child with the membership's `--initial-cluster` until etcd
/// promotes it, and `version.txt` records the target only then (until
/// then the join's record says the data is half-joined: a restart joins
/// again). Then it serves under our supervision, as a rolled member does,
/// and we exit with its code.
fn join_as_learner(
    config: &Config,
    joined: &cluster::self_join::Joined,
    survey: Survey,
    original_mask: SigSet,
) -> Result<Outcome, Error> {
    let Mode::Exec { etcd_args } = &config.mode else {
        return Err(Error::Runtime(
            "a learner's join needs the exec mode".to_string(),
        ));
    };
    let runtime = async_runtime()?;
    let supervisor = Supervisor::start(original_mask)?;
    let lock = survey.into_lock()?;
    binaries::check_present(&config.bin_dir, &[Binary::etcd(config.target.version)])?;
    log::info(
        "this member joins as a learner: its etcd runs under etcd-migrate until it is promoted, then serves",
        &[("initial_cluster", joined.initial_cluster.as_str().into())],
    );
    let mut etcd = cluster::member::SupervisedEtcd::new(
        supervisor.clone(),
        &config.bin_dir,
        etcd_args,
        &config.data_dir,
        config.listen_client_urls.as_deref(),
        cluster::entry::STOP_GRACE,
    )
    .with_arg(&format!("--initial-cluster={}", joined.initial_cluster));
    let args = config.member_args();
    let env = |name: &str| std::env::var(name).ok();
    let client_urls = cluster::settings::url_list(&args, &env, "advertise-client-urls");
    let client_tls = cluster::settings::client_tls(&args, &env, &client_urls)?;
    let ended = runtime.block_on(cluster::self_join::promote_then_serve(
        &mut etcd,
        (joined, config.target.version),
        client_tls.as_ref(),
        config.health_timeout,
        supervisor.termination(),
        || datadir::record_joined(&config.data_dir, config.target),
    ))?;
    drop(lock);
    Ok(Outcome::ExitCode(cluster::entry::exit_code(
        ended,
        &config.data_dir,
    )))
}

/// Logs each setting whose flag won over a different env var.
fn log_overrides(config: &Config) {
    for noted in &config.overridden {
        log::info(
            "flag overrides env",
            &[
                ("flag", noted.flag.into()),
                ("used", noted.shown(&noted.used).into()),
                ("env", noted.env.into()),
                ("ignored", noted.shown(&noted.ignored).into()),
            ],
        );
    }
}

/// The current-thread runtime the entrypoint's async work runs on.
fn async_runtime() -> Result<tokio::runtime::Runtime, Error> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|err| Error::Runtime(format!("async runtime: {err}")))
}

/// The data's offline read the cluster mode works from, taken out of the
/// survey.
fn read_for_cluster(survey: &mut Survey) -> Result<ondisk::OnDisk, Error> {
    survey
        .take_on_disk()
        .ok_or_else(|| Error::Runtime("the cluster mode needs the data's offline read".to_string()))
}

/// `--no-exec` with a member of a cluster (Kubernetes' own HA manifests):
/// the one hop the live cluster allows now is recorded and handed to the
/// manifest's etcd (`cluster::entry::hand_over`); anything else is refused.
fn hand_over_one_hop(
    config: &Config,
    plan: &Plan,
    mut survey: Survey,
    bundle: Bundle,
) -> Result<Outcome, Error> {
    let on_disk = read_for_cluster(&mut survey)?;
    let runtime = async_runtime()?;
    let marked = survey.restart_mark();
    let target = cluster::entry::hand_over(config, plan, &on_disk, marked, bundle, &runtime)?;
    survey.record(target).map_err(|source| Error::Record {
        pair: target,
        data_dir: config.data_dir.display().to_string(),
        source,
    })?;
    log::info(
        "recorded",
        &[
            ("version", target.to_string().into()),
            (
                "reason",
                "one hop the cluster allows, handed to the manifest's etcd".into(),
            ),
        ],
    );
    finish(config)
}

/// The cluster mode: this member's etcd runs as our supervised child while
/// the cluster rolls to the target (`cluster::entry`); the data dir's lock
/// is held throughout.
fn roll_as_member(
    config: &Config,
    plan: &Plan,
    mut survey: Survey,
    bundle: Bundle,
    original_mask: SigSet,
) -> Result<Outcome, Error> {
    let on_disk = read_for_cluster(&mut survey)?;
    let runtime = async_runtime()?;
    let supervisor = Supervisor::start(original_mask)?;
    verify_binaries(config, plan, (true, None), None, &runtime, &supervisor)?;
    let marked = survey.restart_mark();
    let lock = survey.into_lock()?;
    let finished = cluster::entry::run(
        config,
        plan,
        &on_disk,
        marked,
        bundle.clone(),
        &runtime,
        supervisor,
    )?;
    match finished {
        cluster::entry::Finished::Exit(code) => {
            drop(lock);
            Ok(Outcome::ExitCode(code))
        }
        // The roll reached the release the pause job starts from: the
        // member takes part in it with the etcd that serves now (issue 28
        // item 7), its membership and ids as the roll kept them.
        cluster::entry::Finished::ThenPause { etcd, supervisor } => take_part_in_pause(
            config,
            Joining {
                recorded: plan.target,
                on_disk: Some(on_disk),
                record: (None, false),
                lock,
            },
            bundle,
            (runtime, supervisor, *etcd),
            original_mask,
        ),
    }
}

/// What a member enters the pause job with.
struct Joining {
    /// What version.txt records.
    recorded: VersionPair,
    /// What the data recorded when this run began.
    on_disk: Option<ondisk::OnDisk>,
    /// Its record of the job, if it has one, and whether it only
    /// withdraws its agreement.
    record: (Option<cluster::pause::Record>, bool),
    /// The data dir's lock.
    lock: datadir::DirLock,
}

/// The whole-cluster pause job (issue 28): this member's part, from where
/// its record (`record`, if it has one) says it is. The converter's taken
/// data is forced into a one-member cluster and carried through the route
/// with the single-member steps ([`convert_taken`]) between its two parts.
fn pause_as_member(
    config: &Config,
    mut survey: Survey,
    (record, withdraw_only): (Option<cluster::pause::Record>, bool),
    bundle: Bundle,
    original_mask: SigSet,
) -> Result<Outcome, Error> {
    let on_disk = survey.take_on_disk();
    let recorded = match (survey.state(), &record) {
        (DirState::Recorded(pair), _) => pair,
        (_, Some(record)) => record.from.parse().map_err(|e| {
            Error::Runtime(format!("the pause record's `from` {:?}: {e}", record.from))
        })?,
        _ => {
            return Err(Error::Runtime(
                "the pause job needs a recorded data dir".to_string(),
            ))
        }
    };
    cluster::pause::entry::check_mode(config, on_disk.as_ref(), recorded)?;
    let runtime = async_runtime()?;
    let supervisor = Supervisor::start(original_mask)?;
    let etcd = cluster::pause::entry::member_etcd(config, &supervisor);
    let lock = survey.into_lock()?;
    take_part_in_pause(
        config,
        Joining {
            recorded,
            on_disk,
            record: (record, withdraw_only),
            lock,
        },
        bundle,
        (runtime, supervisor, etcd),
        original_mask,
    )
}

/// This member's part of the pause job (see [`pause_as_member`]), with the
/// runtime, supervisor and member etcd it runs on (its etcd running if a
/// roll handed it over).
fn take_part_in_pause(
    config: &Config,
    joining: Joining,
    bundle: Bundle,
    (runtime, supervisor, mut etcd): (
        tokio::runtime::Runtime,
        Supervisor,
        cluster::member::SupervisedEtcd,
    ),
    original_mask: SigSet,
) -> Result<Outcome, Error> {
    use cluster::pause::run::PauseEnd;
    let Joining {
        recorded,
        on_disk,
        record,
        lock,
    } = joining;
    let old_release = old_release(recorded, &bundle)?;
    let mut pausing = cluster::pause::entry::prepare(
        config,
        on_disk.as_ref(),
        record,
        recorded,
        old_release,
        &etcd,
        &supervisor,
    )?;
    let job_config = Config {
        target: pausing.job.target,
        member: converter_member(config, &pausing.own),
        ..config.clone()
    };
    // Every etcd the job may run here: the old release, the route's, the
    // target.
    if let Ok(route) = plan::plan(recorded, pausing.job.target, &bundle) {
        binaries::check_present(&config.bin_dir, &route.needed_binaries())?;
        verify_binaries(
            &job_config,
            &route,
            (false, None),
            None,
            &runtime,
            &supervisor,
        )?;
    }
    binaries::check_present(&config.bin_dir, &[Binary::etcd(old_release)])?;
    let end = match runtime.block_on(pausing.run(&mut etcd))? {
        PauseEnd::Convert => {
            drop(lock);
            convert_taken(&job_config, &mut pausing, &bundle, (&runtime, &supervisor))?;
            let lock = datadir::lock(&config.data_dir)?;
            let end = runtime.block_on(pausing.serve_converted(&mut etcd))?;
            drop(lock);
            end
        }
        end => {
            drop(lock);
            end
        }
    };
    match end {
        PauseEnd::Exit(code) => Ok(Outcome::ExitCode(code)),
        // Withdrawn, the record gone: the run starts over with the target
        // as it is (once: with no record, it never comes back here).
        PauseEnd::Withdrawn => run(config, original_mask),
        PauseEnd::Convert => Err(Error::Runtime(
            "the pause job asked for a second conversion".to_string(),
        )),
    }
}

/// The member the converter's steps run as: its name and peer URLs as
/// its etcd's own flags give them (the data's membership records them,
/// and a restore writes them anew), listening for peers on loopback only
/// (no other member may reach a step's etcd; the member's own etcd is
/// stopped, so its peer port is free), the token its flags give.
fn converter_member(config: &Config, own: &cluster::pause::Whom) -> Member {
    let args = config.member_args();
    let env = |name: &str| std::env::var(name).ok();
    let token = cluster::settings::value(&args, &env, "initial-cluster-token")
        .unwrap_or_else(|| config.member.initial_cluster_token.clone());
    Member {
        name: own.name.clone(),
        listen_peer_urls: format!("http://127.0.0.1:{}", config.peer_port),
        initial_advertise_peer_urls: own.peer_urls.join(","),
        initial_cluster: own
            .peer_urls
            .iter()
            .map(|url| format!("{}={url}", own.name))
            .collect::<Vec<_>>()
            .join(","),
        initial_cluster_token: token,
        ..config.member.clone()
    }
}

/// The release that serves `recorded` data: itself when bundled, else the
/// newest bundled patch of its minor after it.
fn old_release(recorded: VersionPair, bundle: &Bundle) -> Result<Version, Error> {
    let version = recorded.version;
    if bundle.contains(version) {
        return Ok(version);
    }
    match bundle.newest_in(version.minor_line()) {
        Some(newest) if newest > version => Ok(newest),
        _ => Err(Error::Runtime(format!(
            "version.txt records {version}, and the image bundles no {}.x release at or after it to serve the data with (bundled: {bundle}); bundle etcd {version}",
            version.minor_line()
        ))),
    }
}

/// The converter's taken data (its membership is the converter alone),
/// carried to the job's target: backed up once, then the route's
/// single-member steps, recorded as every run records them (`config` has
/// the job's target).
fn convert_taken(
    config: &Config,
    pausing: &mut cluster::pause::run::Pausing,
    bundle: &Bundle,
    (runtime, supervisor): (&tokio::runtime::Runtime, &Supervisor),
) -> Result<(), Error> {
    let started = Instant::now();
    let pausing_old = pausing.old_release;
    let listed = ondisk::read_with(&config.data_dir, &ondisk::Want::default())
        .map(|d| d.members.len())
        .unwrap_or(0);
    if listed > 1 {
        return Err(Error::Runtime(format!(
            "the pause job's converter stopped alone in its membership, but the data in {} lists {listed} members; nothing was converted; its record (.etcd-migrate.pause) is kept: report this",
            config.data_dir.display()
        )));
    }
    if pausing.backup_taken().is_none() {
        let termination = supervisor.termination();
        let path = backup::create(
            &config.data_dir,
            &config.backup,
            pausing.recorded,
            std::time::SystemTime::now(),
            &|| *termination.borrow(),
        )
        .map_err(|e| Error::Cluster(cluster::entry::EntryError::Backup(e)))?;
        log::info(
            "pause job: the taken data backed up before it converts",
            &[
                ("path", path.display().to_string().into()),
                ("verify", backup::tool::verify_command_line(&path).into()),
            ],
        );
        pausing.note_backup(&path)?;
    }
    let glance = survey::glance(&config.data_dir, false, false)?;
    let mut survey = Survey::take(config, &glance)?;
    let marked = survey.restart_mark();
    let on_disk = survey.on_disk();
    let data_members = on_disk.map_or(0, |d| d.members.len());
    let v2_request = on_disk.and_then(|d| d.v2_requests_past_snapshot);
    let mut plan = make_plan(
        config,
        survey.state(),
        bundle,
        (data_members, v2_request),
        marked.is_some(),
    )?;
    if plan.pause.is_some() || plan.cluster.is_some() {
        return Err(Error::Runtime(format!(
            "the pause job's taken data in {} still lists {data_members} members after the force",
            config.data_dir.display()
        )));
    }
    // The backup was taken above (by this run or an earlier one): the data
    // as the old cluster left it.
    plan.backup = None;
    // A key written between the check before the go and the take that
    // the target cannot hold stops the converter here or in its step,
    // the data untouched: a restart meets it again, so the converter
    // says the way out (it is the old cluster alone now).
    let stuck = |e: Error| {
        if matches!(
            e,
            Error::Precondition(PreconditionError::KeysUnfit { .. })
                | Error::Execute(ExecuteError::Step { .. })
        ) {
            log::error(
                "pause job: the converter cannot convert the data it took; its data and backup are as the old cluster left them, and this member is that cluster alone now (the others left it and wait for the converted one); a restart of this container converts again; if the cause is in the data (a key the target cannot hold, named above), start the old release by hand on the data dir with this member's flags, remove or fix the key through it, stop it, and start this container again: the job carries on from its record",
                &[
                    ("old_release", pausing_old.to_string().into()),
                    ("data_dir", config.data_dir.display().to_string().into()),
                ],
            );
        }
        e
    };
    preconditions::check_before_steps(config, &plan)
        .map_err(Error::Precondition)
        .map_err(stuck)?;
    let member = config.member.clone();
    log_plan(config, &plan, &member, bundle);
    let on_disk = survey.take_on_disk();
    let offline = OfflineRead {
        baseline: offline_baseline(&plan, on_disk.as_ref()),
        hidden_v2: on_disk.map(|on_disk| on_disk.v2_hidden_paths),
    };
    carry_out(
        config,
        &plan,
        &member,
        (offline, None),
        survey,
        (runtime, supervisor),
    )
    .map_err(stuck)?;
    log::info(
        "pause job: the taken data converted",
        &[
            ("version", config.target.to_string().into()),
            ("steps", plan.steps.len().into()),
            ("ms", log::ms(started.elapsed())),
        ],
    );
    Ok(())
}

/// The plan for the data dir as found, or the refusal as the run's error.
fn make_plan(
    config: &Config,
    state: DirState,
    bundle: &Bundle,
    (data_members, v2_request_past_snapshot): (usize, Option<u64>),
    restart_mark: bool,
) -> Result<Plan, Error> {
    let situation = Situation {
        found: state,
        target: config.target,
        bundle,
        backup: config.backup.mode,
        initial_cluster: &config.member.initial_cluster,
        data_members,
        restart_mark,
        v2_request_past_snapshot,
    };
    plan::decide(&situation).map_err(|refusal| match refusal {
        Refusal::FutureData { current, known } => Error::FutureData {
            path: config
                .data_dir
                .join(datadir::VERSION_FILE)
                .display()
                .to_string(),
            current,
            known,
        },
        Refusal::NoPath { current, source } => Error::Plan {
            current,
            target: config.target,
            data_dir: config.data_dir.display().to_string(),
            looked_in: looked_in(config, &source),
            source,
        },
        Refusal::FreshTarget(source) => Error::FreshTarget {
            data_dir: config.data_dir.display().to_string(),
            looked_in: looked_in(config, &source),
            source,
        },
        Refusal::MultiMember { members } => Error::MultiMember {
            initial_cluster: config.member.initial_cluster.clone(),
            members,
        },
        refusal @ Refusal::ReplayBlocked { .. } => Error::Refused {
            data_dir: config.data_dir.display().to_string(),
            refusal,
        },
    })
}

/// The "plan" log line.
fn log_plan(config: &Config, plan: &Plan, member: &Member, bundle: &Bundle) {
    let from = if plan.is_recorded() {
        plan.current.to_string()
    } else {
        "empty".to_string()
    };
    log::info(
        "plan",
        &[
            ("from", from.into()),
            ("to", config.target.to_string().into()),
            ("steps", plan.steps.len().into()),
            ("member", member.name.as_str().into()),
            ("bundled", bundle.to_string().into()),
        ],
    );
}

/// Carries the plan out: every binary proves its release, the data dir
/// is made ready under its lock, then the plan's work is done. The lock
/// is held until the end: the next holder is etcd itself (its WAL lock).
fn carry_out(
    config: &Config,
    plan: &Plan,
    member: &Member,
    (offline, early): (OfflineRead, Option<binaries::EarlyChecks>),
    mut survey: Survey,
    (runtime, supervisor): (&tokio::runtime::Runtime, &Supervisor),
) -> Result<(), Error> {
    // The baseline's hash is walked from here on, beside the checks.
    let OfflineRead {
        baseline,
        hidden_v2,
    } = offline;
    let pending = baseline.map(baseline::Offline::spawn);
    let later = checked_later(plan, pending.is_some());
    verify_binaries(config, plan, (false, later), early, runtime, supervisor)?;
    survey.make_ready()?;
    match plan.work() {
        // Reached only after finishing an interrupted step: already recorded.
        Work::Nothing => log::info(
            "already at target",
            &[("version", config.target.to_string().into())],
        ),
        Work::Record { reason } => {
            survey
                .record(config.target)
                .map_err(|source| Error::Record {
                    pair: config.target,
                    data_dir: config.data_dir.display().to_string(),
                    source,
                })?;
            log::info(
                "recorded",
                &[
                    ("version", config.target.to_string().into()),
                    ("reason", reason.into()),
                ],
            );
        }
        Work::Steps => execute_steps(
            config,
            plan,
            member,
            (pending, hidden_v2, later),
            &mut survey,
            (runtime, supervisor),
        )?,
        // Taken by `roll_as_member` and `pause_as_member` before the plan
        // is carried out here.
        Work::Roll { .. } | Work::Pause { .. } => {}
    }
    if let Some(signal) = supervisor.terminated() {
        return Err(Error::Interrupted(signal));
    }
    // The lock goes with the survey: the next holder is etcd itself.
    drop(survey);
    Ok(())
}

/// Each binary proves it is the release its name claims before the first
/// one touches the data; each etcd that will run with the user's flags
/// (after `--`) parses them in that check: the target the run execs, or,
/// when the member rolls with its cluster (`rolls`), every release it
/// passes through (each runs as the member, with those flags); and each
/// etcd a step runs parses `ETCD_CREDS`, which it will run with. `later`:
/// a binary checked only before it first runs (by the launcher).
fn verify_binaries(
    config: &Config,
    plan: &Plan,
    (rolls, later): (bool, Option<Binary>),
    early: Option<binaries::EarlyChecks>,
    runtime: &tokio::runtime::Runtime,
    supervisor: &Supervisor,
) -> Result<(), Error> {
    let checks = BinaryChecks::of(plan, rolls, later);
    let begun_early = early.as_ref().map_or(0, binaries::EarlyChecks::len);
    let verifying = Instant::now();
    let verified = runtime.block_on(binaries::verify_reported_versions_after(
        early,
        supervisor,
        &config.bin_dir,
        &checks.binaries,
        checks.run_flags(config),
        supervisor.termination(),
    ));
    match verified {
        Err(BinError::Interrupted { signal, .. }) => return Err(Error::Interrupted(signal)),
        other => other?,
    }
    let mut fields: Vec<(&str, serde_json::Value)> = vec![
        ("count", checks.binaries.len().into()),
        ("ms", log::ms(verifying.elapsed())),
    ];
    if begun_early > 0 {
        fields.push((
            "begun_early",
            format!("{begun_early} (while the data was read offline)").into(),
        ));
    }
    if let Some(binary) = later {
        fields.push((
            "later",
            format!("{binary} (runs only if the offline baseline falls back to a start)").into(),
        ));
    }
    log::info("binaries verified", &fields);
    Ok(())
}

/// What [`verify_binaries`] checks for a plan: each binary it needs but
/// `later`, and which etcd releases parse which flags.
struct BinaryChecks {
    binaries: Vec<Binary>,
    /// The releases that run with the user's flags (after `--`).
    flagged: Vec<Version>,
    /// The releases the steps run with `ETCD_CREDS`.
    stepped: Vec<Version>,
}

impl BinaryChecks {
    fn of(plan: &Plan, rolls: bool, later: Option<Binary>) -> BinaryChecks {
        let needed = plan.needed_binaries();
        let etcds = || {
            let mut releases: Vec<Version> = needed
                .iter()
                .filter(|b| b.tool == plan::Tool::Etcd)
                .map(|b| b.version)
                .collect();
            releases.sort();
            releases.dedup();
            releases
        };
        // A roll runs its steps' releases as the member (the steps a cluster
        // takes online); any other step means the member only waits.
        let waits_only = rolls && !plan.steps.iter().all(plan::Step::rolls_online);
        let flagged: Vec<Version> = if waits_only {
            // A cluster member whose target has no online way back runs
            // nothing but its recorded release (it waits, saying why).
            vec![plan.current.version]
        } else if rolls {
            etcds()
        } else {
            vec![plan.target.version]
        };
        // ETCD_CREDS goes to the etcds the steps run (the baseline read's
        // too): every etcd this plan needs, but in a roll (whose member etcds
        // get the user's flags, not ETCD_CREDS).
        let stepped: Vec<Version> = if rolls { Vec::new() } else { etcds() };
        // The flags above name every etcd that may run with them, the one
        // checked later too.
        let binaries: Vec<Binary> = needed
            .iter()
            .copied()
            .filter(|binary| Some(*binary) != later)
            .collect();
        BinaryChecks {
            binaries,
            flagged,
            stepped,
        }
    }

    fn run_flags<'a>(&'a self, config: &'a Config) -> binaries::RunFlags<'a> {
        let user_args: &[String] = match &config.mode {
            Mode::Exec { etcd_args } => etcd_args,
            _ => &[],
        };
        binaries::RunFlags {
            args: user_args,
            releases: &self.flagged,
            step_args: &config.member.extra_args,
            step_releases: &self.stepped,
        }
    }
}

/// The recorded release, checked only if it runs: where the plan reads
/// its baseline with it and that baseline is being taken offline
/// (`offline`), it runs only if that falls back to a start (an etcd
/// --version costs 10-20 ms, and two at once slow each other).
fn checked_later(plan: &Plan, offline: bool) -> Option<Binary> {
    plan.baseline
        .filter(|_| offline)
        .map(Binary::etcd)
        .filter(|b| b.version != plan.target.version && !plan.binaries().contains(b))
}

/// The version checks of a single member's walk, begun before its data
/// is read offline (40 ms at 200,000 keys, as long as the checks): the
/// plan `version.txt` alone gives, as if the data recorded one member and
/// its baseline could be taken offline. The checks the real plan needs
/// then are taken over; any other is killed, and one it needs but was not
/// begun starts then (`binaries::verify_reported_versions_after`). `None`
/// where no walk is in sight.
fn begin_checks(
    config: &Config,
    glance: &survey::Glance,
    bundle: &Bundle,
    original_mask: SigSet,
) -> Option<binaries::EarlyChecks> {
    if config.mode == Mode::DryRun || glance.interrupted {
        return None;
    }
    let found @ DirState::Recorded(_) = glance.state.clone()? else {
        return None;
    };
    let situation = Situation {
        found,
        target: config.target,
        bundle,
        backup: config.backup.mode,
        initial_cluster: &config.member.initial_cluster,
        data_members: 1,
        restart_mark: false,
        v2_request_past_snapshot: None,
    };
    let plan = plan::decide(&situation).ok()?;
    if !matches!(plan.work(), Work::Steps) {
        return None;
    }
    let checks = BinaryChecks::of(&plan, false, checked_later(&plan, true));
    let supervisor = Supervisor::start(original_mask).ok()?;
    binaries::EarlyChecks::start(
        &supervisor,
        &config.bin_dir,
        &checks.binaries,
        checks.run_flags(config),
    )
}

/// Runs the plan's steps on real etcd, as `member`.
fn execute_steps(
    config: &Config,
    plan: &Plan,
    member: &Member,
    (pending, hidden_v2, later): (
        Option<baseline::PendingBaseline>,
        Option<Vec<String>>,
        Option<Binary>,
    ),
    survey: &mut Survey,
    (runtime, supervisor): (&tokio::runtime::Runtime, &Supervisor),
) -> Result<(), Error> {
    let mut launcher = etcd::ProcessLauncher::new(supervisor.clone(), config.bin_dir.clone());
    if let Some(hidden) = hidden_v2 {
        launcher = launcher.knowing_hidden_v2(&config.data_dir, hidden);
    }
    if let Some(binary) = later {
        launcher = launcher.checking_later(binary, config.member.extra_args.clone());
    }
    let health = health::EtcdHealth::new().map_err(|err| Error::Runtime(err.to_string()))?;
    let mut progress = SurveyProgress(survey);
    let mut executor = Executor {
        launcher: &launcher,
        api: &health,
        tools: &launcher,
        disk: &swap::LocalDisk,
        progress: &mut progress,
        settings: StepSettings {
            member,
            data_dir: &config.data_dir,
            health_timeout: config.health_timeout,
            backup: &config.backup,
            ttl_leases: config.ttl_leases,
            ttl_keys_directory: &config.ttl_keys_directory,
            keep_v2_keys: config.keep_v2_keys,
        },
        termination: supervisor.termination(),
        offline_baseline: pending,
    };
    let executed = runtime.block_on(executor.execute(plan));
    if let Err(err @ ExecuteError::Step { .. }) = &executed {
        hold_if_changed(survey, err);
    }
    Ok(executed?)
}

/// Where the releases were looked for, for a plan that failed for want of
/// one: outside the image (a dev checkout, a host) the bin dir is often
/// just the wrong one, and the error must say which dir was searched and
/// how to name another. Empty for failures no bin dir would cure.
fn looked_in(config: &Config, err: &PlanError) -> String {
    let bundle_problem = matches!(
        err,
        PlanError::TargetNotBundled { .. }
            | PlanError::MissingMinor { .. }
            | PlanError::NoMigrateTool { .. }
            | PlanError::StalePatch { .. }
    );
    if !bundle_problem {
        return String::new();
    }
    let dir = config.bin_dir.display();
    match &config.bundled_versions {
        None => format!(
            " with the releases in bin dir {dir} (every etcd-<version> there; if the binaries are elsewhere, e.g. outside the image, point --bin-dir at their directory)"
        ),
        Some(_) => format!(
            " with the releases --bundled-versions lists, from bin dir {dir} (add the release to --bundled-versions, or drop it to use every etcd-<version> there; if the binaries are elsewhere, point --bin-dir at their directory)"
        ),
    }
}

/// Puts the hold on the data dir when a step failed its fingerprint check:
/// the next run would otherwise read its baseline from the data as that
/// step left it and go on without noticing. A failure to write the hold
/// is logged; the step's own error is what the run reports.
fn hold_if_changed(survey: &Survey, err: &ExecuteError) {
    let ExecuteError::Step { source, .. } = err else {
        return;
    };
    if !matches!(**source, executor::StepError::Changed { .. }) {
        return;
    }
    let when = humantime::format_rfc3339_millis(std::time::SystemTime::now());
    survey.hold(&format!("{when}: {}", log::error_chain(err)));
}

/// Exit, or hand over to the target etcd.
fn finish(config: &Config) -> Result<Outcome, Error> {
    finish_joined(config, None)
}

/// [`finish`]; `joined`: the `--initial-cluster` of a member that added
/// itself to a live cluster (the membership after the add: etcd refuses a
/// joiner whose list differs), appended after the user's arguments (the
/// last wins; `ETCD_INITIAL_CLUSTER` is then left out of its environment).
/// `--no-exec` cannot pass it on: the line says what the manifest's etcd
/// must be given.
fn finish_joined(config: &Config, joined: Option<&str>) -> Result<Outcome, Error> {
    match &config.mode {
        Mode::NoExec | Mode::DryRun => {
            if let Some(initial_cluster) = joined {
                log::info(
                    "this member joins with the membership as it is now: its etcd must start with this --initial-cluster",
                    &[("initial_cluster", initial_cluster.into())],
                );
            }
            Ok(Outcome::Exit)
        }
        Mode::Exec { etcd_args } => {
            let mut target = ExecTarget::new(
                exec_program(config)?,
                etcd_args,
                &config.data_dir.to_string_lossy(),
                config.listen_client_urls.as_deref(),
                std::env::var_os("ETCD_DATA_DIR").is_some_and(|v| !v.is_empty()),
            )
            .for_release(config.target.version);
            if let Some(initial_cluster) = joined {
                log::info(
                    "this member joins with the membership as it is now",
                    &[("initial_cluster", initial_cluster.into())],
                );
                target
                    .args
                    .push(format!("--initial-cluster={initial_cluster}"));
            }
            Ok(Outcome::Exec(target))
        }
    }
}

/// The target's server, checked to be there (a stat and an access, so the
/// no-op hand-over stays fast): a missing one is a precondition (exit 2,
/// naming the bin dir and `--bin-dir`), not an exec failure (exit 1).
fn exec_program(config: &Config) -> Result<std::path::PathBuf, Error> {
    let target = Binary::etcd(config.target.version);
    binaries::check_present(&config.bin_dir, &[target])?;
    Ok(binaries::path(&config.bin_dir, target))
}

/// `--dry-run`: the plan, placed where it would run, on stdout.
fn print_plan(config: &Config, plan: Plan, member: Member, interrupted: bool) {
    let site = Site {
        data_dir: config.data_dir.clone(),
        bin_dir: config.bin_dir.clone(),
        member,
        configured_name: config.member.name.clone(),
        backup_root: config.backup.root.clone(),
        backup_keep: config.backup.keep,
        interrupted,
    };
    let shown = plan.at(site).to_string();
    let _ = std::io::stdout().lock().write_all(shown.as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_follow_the_documentation() {
        assert_eq!(signal_exit_code(Signal::SIGTERM), 143);
        assert_eq!(signal_exit_code(Signal::SIGINT), 130);
        let multi = Error::MultiMember {
            initial_cluster: String::new(),
            members: 3,
        };
        assert_eq!(multi.exit_code(), EXIT_PRECONDITION);
    }
}
