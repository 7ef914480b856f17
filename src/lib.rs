//! This module owns the run as a whole: read the data dir, plan, check
//! every precondition before anything is touched, carry out the steps, and
//! say what to do next (exec the target or exit). `main` only parses, calls
//! [`run`] and maps the result to an exit code.

// Errors here carry the paths, versions and etcd output an operator needs;
// they travel up once per process, so their size costs nothing.
#![allow(clippy::result_large_err)]

pub mod backup;
pub mod binaries;
pub mod cluster;
pub mod config;
pub mod datadir;
pub mod dialect;
pub mod effects;
pub mod etcd;
pub mod exec;
pub mod executor;
pub mod failpoint;
pub mod health;
pub mod keyspace;
pub mod log;
pub mod ondisk;
pub mod paths;
pub mod plan;
pub mod steps;
pub mod supervisor;
pub mod swap;
pub mod tls;
pub mod version;

use std::io::Write;
use std::net::{SocketAddr, TcpListener, ToSocketAddrs};
use std::path::Path;
use std::time::Instant;

use nix::sys::signal::{SigSet, Signal};

use crate::backup::BackupMode;
use crate::binaries::BinError;
use crate::config::{Config, Mode};
use crate::datadir::{DataDirError, DirState, WORK_DIR};
use crate::exec::ExecTarget;
use crate::executor::{ExecuteError, Executor, Progress, StepSettings};
use crate::plan::{Binary, Bundle, Plan, PlanError, Step};
use crate::supervisor::{Supervisor, SupervisorError};
use crate::version::VersionPair;

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
}

/// Why the run stopped.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The data dir is unusable as it is.
    #[error(transparent)]
    DataDir(#[from] DataDirError),
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
        /// (see [`looked_in`]); empty otherwise.
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
    /// A port a step's etcd must listen on is taken (or not ours to take).
    #[error("{role} port {port} ({address}, from {setting}) cannot be bound: {reason}; {fix}")]
    PortUnavailable {
        /// "client" or "peer".
        role: &'static str,
        /// The port.
        port: u16,
        /// The address that was tried.
        address: String,
        /// The setting it comes from.
        setting: String,
        /// The OS error.
        reason: String,
        /// What to do.
        fix: &'static str,
    },
    /// An empty or missing data dir cannot be started at the target.
    #[error("cannot start the empty data dir {data_dir} at the target{looked_in}")]
    FreshTarget {
        /// The data dir.
        data_dir: String,
        /// Where the releases were looked for (see [`looked_in`]).
        looked_in: String,
        /// Why.
        #[source]
        source: PlanError,
    },
    /// The backup or the scratch copies cannot be made: no space, a
    /// backup dir inside the data dir or not writable, a link in the data
    /// dir that loops or leads into the copy.
    #[error(transparent)]
    Space(#[from] backup::BackupError),
    /// A needed binary is absent or wrong.
    #[error(transparent)]
    Binary(#[from] BinError),
    /// A process other than ours still runs on the data dir.
    #[error("{count} process(es) still run on the data dir {data_dir} after {waited:?}, e.g. pid {pid}: {command}; stop it (an etcd already serving this data, or one left by an earlier run) and rerun")]
    Busy {
        /// The data dir.
        data_dir: String,
        /// How many.
        count: usize,
        /// One of them.
        pid: i32,
        /// Its command line.
        command: String,
        /// How long we waited.
        waited: std::time::Duration,
    },
    /// version.txt names a release the data itself contradicts.
    #[error("{path} says {recorded}, but the data itself records cluster version {cluster_version} (so etcd {} last ran on it); a wrong version.txt walks the data through the wrong releases; write the release that last ran on the data into {path} (e.g. `printf {} > {path}`) and rerun", .cluster_minor, .suggestion)]
    Mislabelled {
        /// The version.txt file.
        path: String,
        /// What it says.
        recorded: VersionPair,
        /// What the data records.
        cluster_version: String,
        /// Its minor line.
        cluster_minor: String,
        /// A version.txt that would match.
        suggestion: String,
    },
    /// The data has authentication enabled.
    #[error("the data in {data_dir} has {api} authentication enabled, and etcd-migrate proves each step with writes that carry no credentials; nothing was touched; disable auth for the migration: serve the data with its recorded release {recorded} and run {disable}, rerun etcd-migrate, then enable auth again on the migrated data")]
    AuthEnabled {
        /// The data dir.
        data_dir: String,
        /// "v3" or "v2".
        api: &'static str,
        /// What version.txt says.
        recorded: VersionPair,
        /// The command that disables it.
        disable: &'static str,
    },
    /// The data's own membership lists other members.
    #[error("the data in {data_dir} belongs to a cluster of {count} members ({members}), as its own membership records; etcd-migrate runs each release as an isolated single member, which on such data would rejoin (or lead) the live cluster; nothing was touched; upgrade a multi-member cluster by rolling restarts, one minor at a time, with TARGET_VERSION set to the minor each member runs now")]
    DataMultiMember {
        /// The data dir.
        data_dir: String,
        /// How many members.
        count: usize,
        /// Them, named with their peer URLs.
        members: String,
    },
    /// Steps are needed but the member is not alone in its cluster.
    #[error("INITIAL_CLUSTER {initial_cluster:?} lists {members} members, but etcd-migrate runs intermediate releases as an isolated single member, which cannot reach quorum in a multi-member cluster (and forcing a new cluster would split it); upgrade the cluster by rolling restarts, one minor at a time, with TARGET_VERSION set to the minor each member runs now")]
    MultiMember {
        /// The setting.
        initial_cluster: String,
        /// How many members it lists.
        members: usize,
    },
    /// Steps are needed but etcd's settings keep data where a step's etcd
    /// will not look (each item says which setting and how to proceed).
    #[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; and: "))]
    DataElsewhere(Vec<config::DataElsewhere>),
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
}

impl Error {
    /// The documented exit code for this error.
    pub fn exit_code(&self) -> u8 {
        match self {
            Error::DataDir(_)
            | Error::Plan { .. }
            | Error::FreshTarget { .. }
            | Error::FutureData { .. }
            | Error::PortUnavailable { .. }
            | Error::Space(_)
            | Error::Binary(_)
            | Error::MultiMember { .. }
            | Error::Mislabelled { .. }
            | Error::AuthEnabled { .. }
            | Error::DataMultiMember { .. }
            | Error::DataElsewhere(_)
            | Error::Busy { .. } => EXIT_PRECONDITION,
            Error::Execute(ExecuteError::Step { .. } | ExecuteError::Baseline { .. }) => {
                EXIT_STEP_FAILED
            }
            Error::Execute(ExecuteError::Interrupted { signal, .. })
            | Error::Interrupted(signal) => signal_exit_code(*signal),
            Error::Record { .. } | Error::Supervisor(_) | Error::Runtime(_) => EXIT_FAILURE,
        }
    }
}

/// 128 + the signal number, the shell's convention for "killed by".
pub fn signal_exit_code(signal: Signal) -> u8 {
    128u8.saturating_add(signal as u8)
}

/// Records progress in the real data dir.
struct DataDirProgress<'a> {
    dir: &'a Path,
}

impl Progress for DataDirProgress<'_> {
    fn record(&mut self, pair: VersionPair) -> Result<(), DataDirError> {
        datadir::write_version(self.dir, pair)
    }
}

/// Carries out the whole run for `config`. `original_mask` is the signal
/// mask `main` found at start; children and the exec'd etcd get it back.
pub fn run(config: &Config, original_mask: SigSet) -> Result<Outcome, Error> {
    let started = Instant::now();
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
    let first_look = datadir::inspect(&config.data_dir);
    // A hold stops everything, before any clean-up: what the failed run
    // left (its scratch copy too) is what the operator will look at.
    if let Err(held @ DataDirError::Held { .. }) = first_look {
        return Err(Error::DataDir(held));
    }
    // A scratch dir, or a version.txt temp file: a run died mid-step or
    // mid-record. Either sends us down the locked path that cleans up.
    let interrupted = config.data_dir.join(WORK_DIR).exists()
        || config.data_dir.join(datadir::VERSION_TEMP_FILE).exists();
    // Fast path: the data is already at the target. Nothing is spawned and
    // no thread is started, so handing over to etcd costs a few ms.
    if let Ok(DirState::Recorded(current)) = first_look {
        if current == config.target && !interrupted {
            log::info(
                "already at target",
                &[
                    ("version", current.to_string().into()),
                    ("data_dir", config.data_dir.display().to_string().into()),
                    ("ms", log::ms(started.elapsed())),
                ],
            );
            return finish(config);
        }
    }

    // A read-only mount or a dir owned by someone else is named now, not
    // found by etcd in the middle of a step. (A file in the dir's place is
    // reported by `inspect` below.)
    if config.data_dir.is_dir() || !config.data_dir.exists() {
        datadir::check_access(&config.data_dir, config.mode != Mode::DryRun)?;
    }

    // Everything else reads and changes the data dir under its lock, after
    // finishing or discarding what an interrupted rebuilding step left.
    let mut lock = None;
    if config.data_dir.is_dir() && config.mode != Mode::DryRun {
        lock = Some(datadir::lock(&config.data_dir)?);
        wait_for_processes_on(&config.data_dir)?;
        if interrupted {
            datadir::remove_stale_version_temp(&config.data_dir)?;
            swap::recover_interrupted_swap(&config.data_dir)?;
        }
    }
    let state = datadir::inspect(&config.data_dir)?;

    let bundle = match &config.bundled_versions {
        Some(list) => Bundle::new(list.iter().copied()),
        None => binaries::scan(&config.bin_dir)?,
    };
    let plan = match state {
        DirState::Recorded(current) => {
            check_not_from_the_future(config, current, &bundle)?;
            plan::plan(current, config.target, &bundle).map_err(|source| Error::Plan {
                current,
                target: config.target,
                data_dir: config.data_dir.display().to_string(),
                looked_in: looked_in(config, &source),
                source,
            })?
        }
        DirState::Missing | DirState::Empty => {
            if !bundle.contains(config.target.version) {
                let source = PlanError::TargetNotBundled {
                    target: config.target.version,
                    bundled: bundle.to_string(),
                };
                return Err(Error::FreshTarget {
                    data_dir: config.data_dir.display().to_string(),
                    looked_in: looked_in(config, &source),
                    source,
                });
            }
            Plan {
                current: config.target,
                target: config.target,
                steps: Vec::new(),
            }
        }
    };
    let member = match state {
        DirState::Recorded(current) if !plan.is_noop() => {
            check_recorded_data(config, &plan, current)?
        }
        _ => None,
    };
    let name = member.as_deref().unwrap_or(&config.name);
    // The single member of --initial-cluster, under the name the data
    // records (a restore refuses a name the initial cluster lacks).
    let initial_cluster = if name == config.name {
        config.initial_cluster.clone()
    } else {
        format!("{name}={}", config.initial_advertise_peer_urls)
    };
    check_preconditions(config, &plan)?;
    let mut needed = plan.binaries();
    // The target's server is needed even with --no-exec: the manifest
    // starts it next, and a bundle that lists it without the file is broken.
    // So is the recorded release's when it reads the baseline.
    let target_etcd = Binary::etcd(config.target.version);
    let baseline = plan::baseline_reader(&plan, &bundle).map(Binary::etcd);
    for binary in [Some(target_etcd), baseline].into_iter().flatten() {
        if !needed.contains(&binary) {
            needed.push(binary);
        }
    }
    binaries::check_present(&config.bin_dir, &needed)?;

    if config.mode == Mode::DryRun {
        print_plan(config, &state, &plan, name);
        return Ok(Outcome::Exit);
    }

    log::info(
        "plan",
        &[
            (
                "from",
                if matches!(state, DirState::Recorded(_)) {
                    plan.current.to_string()
                } else {
                    "empty".to_string()
                }
                .into(),
            ),
            ("to", config.target.to_string().into()),
            ("steps", plan.steps.len().into()),
            ("member", name.into()),
            ("bundled", bundle.to_string().into()),
        ],
    );
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|err| Error::Runtime(format!("async runtime: {err}")))?;
    let supervisor = Supervisor::start(original_mask)?;
    // Each binary proves it is the release its name claims before the
    // first one touches the data.
    let verifying = Instant::now();
    let verified = runtime.block_on(binaries::verify_reported_versions(
        &supervisor,
        &config.bin_dir,
        &needed,
        supervisor.termination(),
    ));
    match verified {
        Err(BinError::Interrupted { signal, .. }) => return Err(Error::Interrupted(signal)),
        other => other?,
    }
    log::info(
        "binaries verified",
        &[
            ("count", needed.len().into()),
            ("ms", log::ms(verifying.elapsed())),
        ],
    );

    if state == DirState::Missing {
        datadir::create(&config.data_dir)?;
        log::info(
            "created data dir",
            &[
                ("data_dir", config.data_dir.display().to_string().into()),
                ("mode", "0700".into()),
            ],
        );
    }
    if lock.is_none() {
        lock = Some(datadir::lock(&config.data_dir)?);
        // The dir was created (or found empty) before the lock: make sure
        // no other migrator wrote into it in between.
        let locked_state = datadir::inspect(&config.data_dir)?;
        if locked_state != DirState::Empty {
            return Err(Error::Runtime(format!(
                "data dir {} changed while etcd-migrate was creating it (now {locked_state:?}); rerun",
                config.data_dir.display()
            )));
        }
    }

    // Under the lock, before the first change: etcd wants its data dir
    // 0700 (the Kubernetes tool created it 0755).
    match datadir::correct_mode(&config.data_dir) {
        Ok(Some(old)) => log::info(
            "corrected data dir mode",
            &[
                ("data_dir", config.data_dir.display().to_string().into()),
                ("from", format!("{old:04o}").into()),
                ("to", format!("{:04o}", datadir::DATA_DIR_MODE).into()),
            ],
        ),
        Ok(None) => {}
        // Not ours to change (another owner): etcd only warns about it.
        Err(err) => log::warn(
            "cannot correct the data dir mode",
            &[("error", err.to_string().into())],
        ),
    }

    if plan.is_noop() && matches!(state, DirState::Recorded(_)) {
        // Reached only after finishing an interrupted step: already recorded.
        log::info(
            "already at target",
            &[("version", config.target.to_string().into())],
        );
    } else if plan.steps.is_empty() {
        let reason = if matches!(state, DirState::Recorded(_)) {
            "patch change, no step needed"
        } else {
            "empty data dir"
        };
        datadir::write_version(&config.data_dir, config.target).map_err(|source| {
            Error::Record {
                pair: config.target,
                data_dir: config.data_dir.display().to_string(),
                source,
            }
        })?;
        log::info(
            "recorded",
            &[
                ("version", config.target.to_string().into()),
                ("reason", reason.into()),
            ],
        );
    } else {
        let launcher = etcd::ProcessLauncher::new(supervisor.clone(), config.bin_dir.clone());
        let health = health::EtcdHealth::new().map_err(|err| Error::Runtime(err.to_string()))?;
        let mut progress = DataDirProgress {
            dir: &config.data_dir,
        };
        let mut executor = Executor {
            launcher: &launcher,
            api: &health,
            tools: &launcher,
            disk: &swap::LocalDisk,
            progress: &mut progress,
            settings: StepSettings {
                name,
                data_dir: &config.data_dir,
                client_port: config.client_port,
                listen_peer_urls: &config.listen_peer_urls,
                initial_advertise_peer_urls: &config.initial_advertise_peer_urls,
                initial_cluster: &initial_cluster,
                initial_cluster_token: &config.initial_cluster_token,
                extra_args: &config.extra_args,
                health_timeout: config.health_timeout,
                backup: &config.backup,
                ttl_leases: config.ttl_leases,
                ttl_keys_directory: &config.ttl_keys_directory,
                keep_v2_keys: config.keep_v2_keys,
                baseline: plan::baseline_reader(&plan, &bundle),
            },
            termination: supervisor.termination(),
        };
        let executed = runtime.block_on(executor.execute(&plan));
        if let Err(err @ ExecuteError::Step { .. }) = &executed {
            hold_if_changed(&config.data_dir, err);
        }
        executed?;
    }
    if let Some(signal) = supervisor.terminated() {
        return Err(Error::Interrupted(signal));
    }
    // Held until here: the next holder is etcd itself (its WAL lock).
    drop(lock);
    log::info(
        "migrated",
        &[
            ("version", config.target.to_string().into()),
            ("steps", plan.steps.len().into()),
            ("ms", log::ms(started.elapsed())),
        ],
    );
    finish(config)
}

/// Reads what the data itself records (offline, before any etcd runs on
/// it) and refuses what no step may do to it: a version.txt the data
/// contradicts, auth-enabled data, data of a multi-member cluster. Returns
/// the member name the data records, when it has one: rebuilt data keeps
/// it, and a configured name that differs is reported (an etcd started on
/// existing data with another `--name` would rename the member).
fn check_recorded_data(
    config: &Config,
    plan: &Plan,
    recorded: VersionPair,
) -> Result<Option<String>, Error> {
    let data_dir = config.data_dir.display().to_string();
    let on_disk = match ondisk::read(&config.data_dir) {
        Ok(on_disk) => on_disk,
        Err(err) => {
            // etcd reads the same files and will say what is wrong, with
            // its own words, when the first step starts it.
            log::warn(
                "cannot read what the data records; its etcd will report it",
                &[("error", err.to_string().into())],
            );
            return Ok(None);
        }
    };
    for note in &on_disk.notes {
        log::info("data read", &[("note", note.as_str().into())]);
    }
    if let Some(cluster_version) = &on_disk.cluster_version {
        check_label(config, plan, recorded, cluster_version)?;
    }
    if plan.steps.is_empty() {
        return Ok(None);
    }
    if on_disk.members.len() > 1 {
        let members: Vec<String> = on_disk
            .members
            .iter()
            .map(|m| {
                let name = if m.name.is_empty() {
                    "(unstarted)"
                } else {
                    &m.name
                };
                format!("{name} {}", m.peer_urls.join(","))
            })
            .collect();
        return Err(Error::DataMultiMember {
            data_dir,
            count: on_disk.members.len(),
            members: members.join(", "),
        });
    }
    let auth = match (on_disk.v3_auth_enabled, on_disk.v2_auth_enabled) {
        (true, _) => Some(("v3", "`etcdctl --user root auth disable` (ETCDCTL_API=3)")),
        (false, true) => Some(("v2", "`etcdctl -u root auth disable` (ETCDCTL_API=2)")),
        (false, false) => None,
    };
    if let Some((api, disable)) = auth {
        return Err(Error::AuthEnabled {
            data_dir,
            api,
            recorded,
            disable,
        });
    }
    let recorded_name = on_disk
        .members
        .iter()
        .find(|m| Some(m.id) == on_disk.member_id)
        .map(|m| m.name.clone())
        .filter(|name| !name.is_empty());
    match &recorded_name {
        Some(name) if *name != config.name => log::warn(
            "the configured member name differs from the data's; the steps use the data's",
            &[
                ("data", name.as_str().into()),
                ("configured", config.name.as_str().into()),
            ],
        ),
        _ => {}
    }
    Ok(recorded_name)
}

/// Refuses a version.txt whose release the data's cluster version
/// contradicts. The one accepted difference: the data is one minor ahead
/// of version.txt when the first step runs that minor in place (a run
/// that died during that step; the baseline handles it).
fn check_label(
    config: &Config,
    plan: &Plan,
    recorded: VersionPair,
    cluster_version: &str,
) -> Result<(), Error> {
    let minor = |v: &str| v.split('.').take(2).collect::<Vec<_>>().join(".");
    let cluster_minor = minor(cluster_version);
    let recorded_minor = recorded.version.minor_line().to_string();
    let interrupted_first_step = match plan.steps.first() {
        Some(step @ (Step::PatchUpgrade { .. } | Step::MinorUpgrade { .. })) => {
            step.runs().minor_line().to_string() == cluster_minor
        }
        _ => false,
    };
    if cluster_minor == recorded_minor || interrupted_first_step {
        return Ok(());
    }
    let storage = if cluster_minor.starts_with("2.") {
        version::Storage::Etcd2
    } else {
        recorded.storage
    };
    Err(Error::Mislabelled {
        path: config
            .data_dir
            .join(datadir::VERSION_FILE)
            .display()
            .to_string(),
        recorded,
        cluster_version: cluster_version.to_string(),
        suggestion: format!("{cluster_minor}.<patch>/{storage}"),
        cluster_minor,
    })
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
            | PlanError::Stale35Before36 { .. }
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

/// Refuses plans this release cannot or must not carry out, before
/// anything is touched.
fn check_preconditions(config: &Config, plan: &Plan) -> Result<(), Error> {
    let members = initial_cluster_members(&config.initial_cluster);
    if !plan.steps.is_empty() && members > 1 {
        return Err(Error::MultiMember {
            initial_cluster: config.initial_cluster.clone(),
            members,
        });
    }
    // A no-op or patch-only plan starts no etcd before the exec, which
    // gets these settings as they are; a step would not honour them.
    if !plan.steps.is_empty() && !config.data_elsewhere.is_empty() {
        return Err(Error::DataElsewhere(config.data_elsewhere.clone()));
    }
    // Only when etcd will run: a no-op stays fast, and a dry run may look
    // at a data dir whose etcd is serving (and holding the ports) right now.
    if !plan.steps.is_empty() && config.mode != Mode::DryRun {
        check_ports(config)?;
    }
    let destructive = plan.steps.iter().any(Step::is_destructive);
    let backup = match config.backup.mode {
        BackupMode::Always => !plan.steps.is_empty(),
        BackupMode::Destructive => destructive,
        BackupMode::Never => false,
    };
    if backup || destructive {
        // The write probe only when the run will write: a dry run changes
        // nothing, not even a probe file.
        backup::check_before_run(
            &config.data_dir,
            backup.then_some(config.backup.root.as_path()),
            destructive,
            config.mode != Mode::DryRun,
        )?;
    }
    Ok(())
}

/// Waits (up to the stop grace an etcd gets) for processes on the data dir
/// to end: after a SIGKILL of an earlier etcd-migrate, its etcd and tools
/// got SIGTERM from their parent-death signal and may still be stopping,
/// holding the WAL lock and the ports. Anything still there after that is
/// not ours to stop: refuse, naming it. No signal thread runs yet, so a
/// termination signal is looked for on every round (it stays pending).
fn wait_for_processes_on(data_dir: &Path) -> Result<(), Error> {
    let started = Instant::now();
    let deadline = started + supervisor::STOP_GRACE;
    let mut logged = false;
    loop {
        if let Some(signal) = supervisor::take_pending_termination() {
            return Err(Error::Interrupted(signal));
        }
        let found = supervisor::processes_on(data_dir);
        let Some((pid, command)) = found.first().cloned() else {
            if logged {
                log::info(
                    "earlier processes on the data dir have ended",
                    &[("ms", log::ms(started.elapsed()))],
                );
            }
            return Ok(());
        };
        if Instant::now() >= deadline {
            return Err(Error::Busy {
                data_dir: data_dir.display().to_string(),
                count: found.len(),
                pid,
                command,
                waited: supervisor::STOP_GRACE,
            });
        }
        if !logged {
            log::warn(
                "waiting for processes still on the data dir (an earlier run's etcd stopping?)",
                &[
                    ("count", found.len().into()),
                    ("pid", pid.into()),
                    ("command", command.into()),
                ],
            );
            logged = true;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Puts the hold on the data dir when a step failed its fingerprint check:
/// the next run would otherwise read its baseline from the data as that
/// step left it and go on without noticing. A failure to write the hold
/// is logged; the step's own error is what the run reports.
fn hold_if_changed(data_dir: &Path, err: &ExecuteError) {
    let ExecuteError::Step { source, .. } = err else {
        return;
    };
    if !matches!(**source, executor::StepError::Changed { .. }) {
        return;
    }
    let when = humantime::format_rfc3339_millis(std::time::SystemTime::now());
    let reason = format!("{when}: {}", log::error_chain(err));
    match datadir::write_hold(data_dir, &reason) {
        Ok(()) => log::error(
            "the data dir is on hold until someone has looked",
            &[(
                "hold",
                data_dir
                    .join(datadir::HOLD_FILE)
                    .display()
                    .to_string()
                    .into(),
            )],
        ),
        Err(hold_err) => log::error(
            "cannot put the data dir on hold",
            &[("error", hold_err.to_string().into())],
        ),
    }
}

/// Refuses data last run by a release newer than anything the image has:
/// no bundled etcd can serve it, so no path (up or down) can start.
fn check_not_from_the_future(
    config: &Config,
    current: VersionPair,
    bundle: &Bundle,
) -> Result<(), Error> {
    let known = if current.version.major > 3 {
        Some("any release etcd-migrate knows (2.2 … 3.x)".to_string())
    } else {
        bundle
            .versions()
            .last()
            .filter(|newest| newest.minor_line() < current.version.minor_line())
            .map(|newest| format!("anything this image bundles (newest: {newest})"))
    };
    match known {
        Some(known) => Err(Error::FutureData {
            path: config
                .data_dir
                .join(datadir::VERSION_FILE)
                .display()
                .to_string(),
            current,
            known,
        }),
        None => Ok(()),
    }
}

/// Checks that every port a step's etcd listens on can be bound now, so a
/// port held by another process (an etcd already running on this data, a
/// second pod) is named before anything is touched. etcd binds with
/// SO_REUSEADDR, and so does `TcpListener`: a port in TIME_WAIT passes.
fn check_ports(config: &Config) -> Result<(), Error> {
    let client = SocketAddr::from(([127, 0, 0, 1], config.client_port));
    try_bind(client).map_err(|reason| Error::PortUnavailable {
        role: "client",
        port: config.client_port,
        address: client.to_string(),
        setting: "--port (default 18629, or 18631 when the data dir path contains \"event\")"
            .to_string(),
        reason,
        fix: "stop whatever listens there, or give the steps a free loopback port with --port",
    })?;
    for (url, address) in peer_addresses(&config.listen_peer_urls) {
        // Port 0 binds "any free port", where no advertised peer URL points
        // (--peer-port 0 is refused with the configuration).
        if address.port() == 0 {
            return Err(Error::PortUnavailable {
                role: "peer",
                port: 0,
                address: address.to_string(),
                setting: format!("{url} in --listen-peer-urls (or $LISTEN_PEER_URLS)"),
                reason: "port 0 makes etcd listen on whatever port is free, which no peer URL can name".to_string(),
                fix: "give a real port in LISTEN_PEER_URLS (and the same in INITIAL_ADVERTISE_PEER_URLS and INITIAL_CLUSTER)",
            });
        }
        try_bind(address).map_err(|reason| Error::PortUnavailable {
            role: "peer",
            port: address.port(),
            address: address.to_string(),
            setting: format!(
                "{url} in --listen-peer-urls (or $LISTEN_PEER_URLS; default http://localhost:<--peer-port>)"
            ),
            reason,
            fix: "stop whatever listens there (an etcd already serving this data?), or pick a free port with --peer-port, or set LISTEN_PEER_URLS (and INITIAL_ADVERTISE_PEER_URLS and INITIAL_CLUSTER to match)",
        })?;
    }
    Ok(())
}

fn try_bind(address: SocketAddr) -> Result<(), String> {
    TcpListener::bind(address)
        .map(drop)
        .map_err(|err| err.to_string())
}

/// The address each URL of `--listen-peer-urls` makes etcd listen on: the
/// host as Go's `net.Listen` takes it (an IP, or a name of which the first
/// IPv4 address is used). URLs without a host:port, or whose name does not
/// resolve, are left for etcd to report.
fn peer_addresses(urls: &str) -> Vec<(String, SocketAddr)> {
    urls.split(',')
        .map(str::trim)
        .filter(|url| !url.is_empty())
        .filter_map(|url| {
            let (scheme, rest) = url.split_once("://")?;
            if !matches!(scheme, "http" | "https") {
                return None;
            }
            let host_port = rest.split('/').next()?;
            let resolved: Vec<SocketAddr> = host_port.to_socket_addrs().ok()?.collect();
            let address = resolved
                .iter()
                .find(|a| a.is_ipv4())
                .or(resolved.first())
                .copied()?;
            Some((url.to_string(), address))
        })
        .collect()
}

/// How many distinct member names `--initial-cluster` lists.
fn initial_cluster_members(initial_cluster: &str) -> usize {
    let mut names: Vec<&str> = initial_cluster
        .split(',')
        .filter_map(|entry| entry.split_once('=').map(|(name, _)| name.trim()))
        .filter(|name| !name.is_empty())
        .collect();
    names.sort_unstable();
    names.dedup();
    names.len()
}

/// Exit, or hand over to the target etcd.
fn finish(config: &Config) -> Result<Outcome, Error> {
    match &config.mode {
        Mode::NoExec | Mode::DryRun => Ok(Outcome::Exit),
        Mode::Exec { etcd_args } => Ok(Outcome::Exec(ExecTarget::new(
            exec_program(config)?,
            etcd_args,
            &config.data_dir.to_string_lossy(),
            config.listen_client_urls.as_deref(),
            std::env::var_os("ETCD_DATA_DIR").is_some_and(|v| !v.is_empty()),
        ))),
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

/// `--dry-run`: the plan, on stdout, one line per step.
fn print_plan(config: &Config, state: &DirState, plan: &Plan, name: &str) {
    let mut out = String::new();
    let dir = config.data_dir.display();
    if name == config.name {
        out.push_str(&format!("member: {name}\n"));
    } else {
        out.push_str(&format!(
            "member: {name} (as the data records it; the configuration says {})\n",
            config.name
        ));
    }
    match state {
        DirState::Missing => out.push_str(&format!(
            "data dir {dir}: missing; would create it (mode 0700) and record {}\n",
            config.target
        )),
        DirState::Empty => out.push_str(&format!(
            "data dir {dir}: empty; would record {}\n",
            config.target
        )),
        DirState::Recorded(current) => out.push_str(&format!(
            "data dir {dir}: {current}; target {}\n",
            config.target
        )),
    }
    if config.data_dir.join(WORK_DIR).exists() {
        out.push_str("an interrupted step left a scratch dir; a real run first finishes its swap (if it happened) or discards it\n");
    }
    if plan.is_patch_only() {
        out.push_str(&format!(
            "patch change within {}: no step; would record {}\n",
            config.target.version.minor_line(),
            config.target
        ));
    }
    let total = plan.steps.len();
    for (i, step) in plan.steps.iter().enumerate() {
        let binaries: Vec<String> = step
            .binaries()
            .iter()
            .map(|b| binaries::path(&config.bin_dir, *b).display().to_string())
            .collect();
        out.push_str(&format!(
            "step {}/{total}: {step}; runs {}; client http://127.0.0.1:{}; peer {}\n",
            i + 1,
            binaries.join(" + "),
            config.client_port,
            config.listen_peer_urls
        ));
    }
    let backup_before = match config.backup.mode {
        BackupMode::Always => plan.steps.first(),
        BackupMode::Destructive => plan.steps.iter().find(|s| s.is_destructive()),
        BackupMode::Never => None,
    };
    if let Some(step) = backup_before {
        out.push_str(&format!(
            "backup: before {step}, into {}/<time>-{}-{} (keeping {})\n",
            config.backup.root.display(),
            step.before().version,
            step.before().storage,
            config.backup.keep
        ));
    }
    out.push_str(&format!(
        "then: exec {} (or exit 0 with --no-exec)\n",
        binaries::path(&config.bin_dir, Binary::etcd(config.target.version)).display()
    ));
    let _ = std::io::stdout().lock().write_all(out.as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_initial_cluster_members() {
        assert_eq!(initial_cluster_members("etcd-a=http://localhost:2380"), 1);
        assert_eq!(
            initial_cluster_members("a=http://1:2380,a=https://1:2380"),
            1
        );
        assert_eq!(
            initial_cluster_members("a=http://1:2380,b=http://2:2380,c=http://3:2380"),
            3
        );
    }

    #[test]
    fn peer_urls_become_the_addresses_etcd_listens_on() {
        let found = peer_addresses(
            "http://localhost:2380, https://10.1.2.3:2390/,http://[::1]:2400,unix://x:1,http://nohost",
        );
        let addresses: Vec<String> = found.iter().map(|(_, a)| a.to_string()).collect();
        assert_eq!(
            addresses,
            ["127.0.0.1:2380", "10.1.2.3:2390", "[::1]:2400"],
            "{found:?}"
        );
        assert_eq!(found[1].0, "https://10.1.2.3:2390/");
    }

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
