//! This module owns the run as a whole: read the data dir, plan, check
//! every precondition before anything is touched, carry out the steps, and
//! say what to do next (exec the target or exit). `main` only parses, calls
//! [`run`] and maps the result to an exit code.

// Errors here carry the paths, versions and etcd output an operator needs;
// they travel up once per process, so their size costs nothing.
#![allow(clippy::result_large_err)]

pub mod backup;
pub mod binaries;
pub mod config;
pub mod datadir;
pub mod dialect;
pub mod etcd;
pub mod exec;
pub mod executor;
pub mod failpoint;
pub mod health;
pub mod keyspace;
pub mod log;
pub mod plan;
pub mod rebuild;
pub mod supervisor;
pub mod version;

use std::io::Write;
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
    #[error("no safe path from {current} to {target} in {data_dir}")]
    Plan {
        /// What version.txt says.
        current: VersionPair,
        /// What was asked for.
        target: VersionPair,
        /// The data dir.
        data_dir: String,
        /// Why.
        #[source]
        source: PlanError,
    },
    /// An empty or missing data dir cannot be started at the target.
    #[error("cannot start the empty data dir {data_dir} at the target")]
    FreshTarget {
        /// The data dir.
        data_dir: String,
        /// Why.
        #[source]
        source: PlanError,
    },
    /// The filesystems cannot take the backup or the scratch copies.
    #[error(transparent)]
    Space(#[from] backup::BackupError),
    /// A needed binary is absent or wrong.
    #[error(transparent)]
    Binary(#[from] BinError),
    /// Steps are needed but the member is not alone in its cluster.
    #[error("INITIAL_CLUSTER {initial_cluster:?} lists {members} members, but etcd-migrate runs intermediate releases as an isolated single member, which cannot reach quorum in a multi-member cluster (and forcing a new cluster would split it); upgrade the cluster by rolling restarts, one minor at a time, with TARGET_VERSION set to the minor each member runs now")]
    MultiMember {
        /// The setting.
        initial_cluster: String,
        /// How many members it lists.
        members: usize,
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
}

impl Error {
    /// The documented exit code for this error.
    pub fn exit_code(&self) -> u8 {
        match self {
            Error::DataDir(_)
            | Error::Plan { .. }
            | Error::FreshTarget { .. }
            | Error::Space(_)
            | Error::Binary(_)
            | Error::MultiMember { .. } => EXIT_PRECONDITION,
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
    let first_look = datadir::inspect(&config.data_dir);
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

    // Everything else reads and changes the data dir under its lock, after
    // finishing or discarding what an interrupted rebuilding step left.
    let mut lock = None;
    if config.data_dir.is_dir() && config.mode != Mode::DryRun {
        lock = Some(datadir::lock(&config.data_dir)?);
        if interrupted {
            datadir::remove_stale_version_temp(&config.data_dir)?;
            rebuild::recover_interrupted_swap(&config.data_dir)?;
        }
    }
    let state = datadir::inspect(&config.data_dir)?;

    let bundle = match &config.bundled_versions {
        Some(list) => Bundle::new(list.iter().copied()),
        None => binaries::scan(&config.bin_dir)?,
    };
    let plan = match state {
        DirState::Recorded(current) => {
            plan::plan(current, config.target, &bundle).map_err(|source| Error::Plan {
                current,
                target: config.target,
                data_dir: config.data_dir.display().to_string(),
                source,
            })?
        }
        DirState::Missing | DirState::Empty => {
            if !bundle.contains(config.target.version) {
                return Err(Error::FreshTarget {
                    data_dir: config.data_dir.display().to_string(),
                    source: PlanError::TargetNotBundled {
                        target: config.target.version,
                        bundled: bundle.to_string(),
                    },
                });
            }
            Plan {
                current: config.target,
                target: config.target,
                steps: Vec::new(),
            }
        }
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
        print_plan(config, &state, &plan);
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
    runtime.block_on(binaries::verify_reported_versions(
        &supervisor,
        &config.bin_dir,
        &needed,
    ))?;
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
        let health = health::EtcdHealth::new().map_err(Error::Runtime)?;
        let mut progress = DataDirProgress {
            dir: &config.data_dir,
        };
        let mut executor = Executor {
            launcher: &launcher,
            health: &health,
            tools: &launcher,
            progress: &mut progress,
            settings: StepSettings {
                name: &config.name,
                data_dir: &config.data_dir,
                client_port: config.client_port,
                listen_peer_urls: &config.listen_peer_urls,
                initial_advertise_peer_urls: &config.initial_advertise_peer_urls,
                initial_cluster: &config.initial_cluster,
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
        runtime.block_on(executor.execute(&plan))?;
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
    let destructive = plan.steps.iter().any(Step::is_destructive);
    let backup = match config.backup.mode {
        BackupMode::Always => !plan.steps.is_empty(),
        BackupMode::Destructive => destructive,
        BackupMode::Never => false,
    };
    if backup || destructive {
        backup::check_free_space(
            &config.data_dir,
            backup.then_some(config.backup.root.as_path()),
            destructive,
        )?;
    }
    Ok(())
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
            binaries::path(&config.bin_dir, Binary::etcd(config.target.version)),
            etcd_args,
            &config.data_dir.to_string_lossy(),
            config.listen_client_urls.as_deref(),
            std::env::var_os("ETCD_DATA_DIR").is_some_and(|v| !v.is_empty()),
        ))),
    }
}

/// `--dry-run`: the plan, on stdout, one line per step.
fn print_plan(config: &Config, state: &DirState, plan: &Plan) {
    let mut out = String::new();
    let dir = config.data_dir.display();
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
