//! This module owns the cluster mode's entry from the run: from the
//! configuration and what the data records (its member id and membership),
//! it builds the rolling loop's real seams (the live cluster over the
//! member's own TLS, the supervised member etcd with the user's arguments,
//! the data dir's records), checks the cluster before anything starts,
//! takes the backup `--backup=always` asks for, runs the loop, and turns how it ended into the exit code.

use std::path::Path;
use std::time::Duration;

use crate::backup::{self, BackupError};
use crate::cluster::lock::Holder;
use crate::cluster::member::{self, DataLedger, LiveCluster, SupervisedEtcd};
use crate::cluster::peer::PeerError;
use crate::cluster::roll::{self, Ended, RollError, Rolling, Timing};
use crate::cluster::settings::{self, SettingsError};
use crate::config::{self, Config, Mode};
use crate::log;
use crate::ondisk::OnDisk;
use crate::plan::{Bundle, Plan};
use crate::supervisor::{ExitStatus, Supervisor};
use crate::version::{Version, VersionPair};

/// The pause between two observations of the cluster.
const ROUND: Duration = Duration::from_secs(2);
/// The pause between rounds while our own etcd is not proven yet (see
/// `Timing::prove_every`): short, a proof is one `/version` and one write.
const PROVE_EVERY: Duration = Duration::from_millis(250);
/// The pause between rounds while the wait is for something that moves by
/// itself within a second or two (another member's restart under the lock,
/// the cluster version following a wave): what a member adds to a wave
/// beyond a restart by hand is half of it, on average.
const SOON_EVERY: Duration = Duration::from_millis(200);
/// How often an unchanged wait is reported again.
const PROGRESS_EVERY: Duration = Duration::from_secs(15);
/// What one request to a member may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// What our etcd's graceful stop may take before SIGKILL (a leader hands
/// over first; a large WAL is synced). Well under the lock's TTL: nothing
/// refreshes the lock while the stop runs.
pub(crate) const STOP_GRACE: Duration = Duration::from_secs(20);

/// Why the cluster mode could not run, or how it failed.
#[derive(Debug, thiserror::Error)]
pub enum EntryError {
    /// `--no-exec` cannot keep the member's etcd running.
    #[error("the data in {data_dir} belongs to a cluster of {members} members ({names}), as its own membership records, and reaching {target} means restarting this member's etcd under the cluster's upgrade lock and supervising it, which --no-exec (migrate-if-needed.sh) cannot do: it exits before etcd starts, so it takes only the one hop the cluster allows at once (the next patch, or the next minor once the cluster version has reached this member's); run etcd-migrate as the container's command with etcd's flags after `--` (as every member in examples/ha/ does, e.g. examples/ha/gce-etcd-a.manifest or examples/ha/kubeadm-etcd-a.yaml), or set TARGET_VERSION to the release recorded in version.txt")]
    NoExec {
        /// The data dir.
        data_dir: String,
        /// How many members.
        members: usize,
        /// Each member's name and peer URLs.
        names: String,
        /// The target.
        target: Version,
    },
    /// The WAL names no member id.
    #[error("the data in {data_dir} belongs to a cluster of {members} members, but its WAL records no member id, so etcd-migrate cannot tell which member it is; start it with etcd itself once to see etcd's own error")]
    NoMemberId {
        /// The data dir.
        data_dir: String,
        /// How many members.
        members: usize,
    },
    /// The member's TLS settings.
    #[error(transparent)]
    Settings(#[from] SettingsError),
    /// The peer client.
    #[error(transparent)]
    Peer(#[from] PeerError),
    /// The loop.
    #[error(transparent)]
    Roll(#[from] RollError),
    /// The backup `--backup=always` asks for, before the member's etcd
    /// first starts (nothing started: the data is as it was).
    #[error("{0}; nothing was started and the data dir is as it was")]
    Backup(#[from] BackupError),
    /// `--force-new-cluster` refused or failed.
    #[error(transparent)]
    Force(#[from] crate::cluster::force::ForceError),
}

impl EntryError {
    /// The documented exit code: 2 for what refuses the run before
    /// anything started (a backup the settings or the data dir make
    /// impossible among it), 128 + signal when stopped, else 1 (a backup
    /// that failed while copying among it).
    pub fn exit_code(&self) -> u8 {
        match self {
            EntryError::NoExec { .. }
            | EntryError::NoMemberId { .. }
            | EntryError::Settings(_)
            | EntryError::Peer(_)
            | EntryError::Roll(RollError::Refused(_) | RollError::NothingToStart { .. })
            | EntryError::Force(
                crate::cluster::force::ForceError::QuorumAnswers { .. }
                | crate::cluster::force::ForceError::Refused { .. }
                | crate::cluster::force::ForceError::ForcedAlready { .. }
                | crate::cluster::force::ForceError::Concurrent { .. }
                | crate::cluster::force::ForceError::Undecided { .. }
                | crate::cluster::force::ForceError::PortInUse { .. },
            ) => crate::EXIT_PRECONDITION,
            // What the data dir or the backup settings make impossible, found
            // before a byte is copied: the single-member path's
            // preconditions refuse the same with 2.
            EntryError::Backup(
                BackupError::NoSpace { .. }
                | BackupError::Inside { .. }
                | BackupError::LeadsToCopy { .. }
                | BackupError::Loop { .. }
                | BackupError::Dangling { .. }
                | BackupError::Special { .. }
                | BackupError::Reserved { .. }
                | BackupError::NotWritable { .. },
            ) => crate::EXIT_PRECONDITION,
            EntryError::Roll(RollError::Interrupted(signal))
            | EntryError::Backup(BackupError::Interrupted { signal, .. }) => {
                crate::signal_exit_code(*signal)
            }
            EntryError::Roll(_) | EntryError::Backup(_) | EntryError::Force(_) => {
                crate::EXIT_FAILURE
            }
        }
    }
}

/// The etcd arguments the member runs with: the user's, after `--`.
fn etcd_args<'a>(config: &'a Config, on_disk: &OnDisk) -> Result<&'a [String], EntryError> {
    match &config.mode {
        Mode::Exec { etcd_args } => Ok(etcd_args),
        Mode::NoExec | Mode::DryRun => Err(EntryError::NoExec {
            data_dir: config.data_dir.display().to_string(),
            members: on_disk.members.len(),
            names: on_disk.members_text(),
            target: config.target.version,
        }),
    }
}

/// Refuses what cannot run before anything is set up (`--no-exec`).
pub fn check_mode(config: &Config, on_disk: &OnDisk) -> Result<(), EntryError> {
    etcd_args(config, on_disk).map(|_| ())
}

/// What a member's roll works from: its view of the cluster, its plan
/// and timings, the full command line its etcd reads.
struct Prepared {
    rolling: Rolling,
    live: LiveCluster,
}

/// Builds the roll's seams from the configuration, the data and `args`
/// (the command line the member's etcd reads).
fn prepare(
    config: &Config,
    plan: &Plan,
    on_disk: &OnDisk,
    marked: Option<Version>,
    bundle: Bundle,
    args: &[String],
) -> Result<Prepared, EntryError> {
    let members: Vec<_> = on_disk.members.iter().map(member::from_disk).collect();
    let own_id = on_disk.member_id.ok_or_else(|| EntryError::NoMemberId {
        data_dir: config.data_dir.display().to_string(),
        members: members.len(),
    })?;
    let env = |name: &str| std::env::var(name).ok();
    let cluster_settings = settings::read(args, &env)?;
    let peer_urls: Vec<String> = members
        .iter()
        .flat_map(|m| m.peer_urls.iter().cloned())
        .collect();
    let peer_tls = settings::peer_tls(args, &env, &peer_urls)?;
    let own_name = on_disk
        .members
        .iter()
        .find(|m| m.id == own_id)
        .map(|m| m.name.clone())
        .filter(|name| !name.is_empty())
        .or_else(|| config::flag_in_args(args, "name"))
        .unwrap_or_else(|| config.member.name.clone());
    let me = Holder {
        member: format!("{own_id:x}"),
        name: own_name.clone(),
        run: format!(
            "pid {} at {}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs())
        ),
    };
    let live = LiveCluster::new(
        own_id,
        members,
        cluster_settings.advertise_client_urls.clone(),
        me,
        peer_tls.as_ref(),
        cluster_settings.client_tls.clone(),
        REQUEST_TIMEOUT,
    )?;
    let rolling = Rolling {
        own_id,
        own_name,
        configured_peer_urls: cluster_settings.advertise_peer_urls.clone(),
        recorded: plan.current,
        marked,
        target: plan.target,
        then_pause: plan.then_pause.is_some(),
        bundle,
        timing: Timing {
            round: ROUND,
            prove_every: PROVE_EVERY,
            soon_every: SOON_EVERY,
            progress_every: PROGRESS_EVERY,
            prove_deadline: config.health_timeout,
        },
    };
    Ok(Prepared { rolling, live })
}

/// `--no-exec` with a member of a cluster (Kubernetes' own HA manifests:
/// `migrate-if-needed.sh`, then the manifest execs etcd): the one hop the
/// cluster allows now, as a roll's first start decides it
/// (`roll::choose_start`: the member is down already, its container just
/// started; the cluster version and the patch floors allow the next minor
/// or patch; etcd's own refusals checked against the live membership).
/// When that hop is the target, it is returned: the caller records it and
/// exits, and the manifest's etcd starts it. Anything more than one hop, a
/// restart mark (the cluster mode ran on this data), or a cluster that does
/// not allow the hop yet is the `--no-exec` refusal, which names the way.
/// The hop is etcd's, from the recorded release (`hop_bundle`).
pub fn hand_over(
    config: &Config,
    plan: &Plan,
    on_disk: &OnDisk,
    marked: Option<Version>,
    bundle: Bundle,
    runtime: &tokio::runtime::Runtime,
) -> Result<VersionPair, EntryError> {
    let refused = || EntryError::NoExec {
        data_dir: config.data_dir.display().to_string(),
        members: on_disk.members.len(),
        names: on_disk.members_text(),
        target: config.target.version,
    };
    if marked.is_some() || config.target.storage != plan.current.storage {
        return Err(refused());
    }
    let args = config.member_args();
    let bundle = hop_bundle(&bundle, plan.current.version, config.target.version);
    let Prepared {
        rolling, mut live, ..
    } = prepare(config, plan, on_disk, marked, bundle, &args)?;
    let first = roll::first_release(&rolling)?;
    let mut ledger = DataLedger {
        dir: config.data_dir.clone(),
        storage: plan.current.storage,
    };
    let start = runtime.block_on(roll::choose_start(&rolling, first, &mut live, &mut ledger))?;
    if start != config.target.version {
        return Err(refused());
    }
    log::info(
        "handing over one hop to the manifest's etcd: the cluster allows it; version.txt records it before it runs (--no-exec exits before etcd starts)",
        &[
            ("from", plan.current.to_string().into()),
            ("target", config.target.to_string().into()),
        ],
    );
    Ok(config.target)
}

/// The releases a hand-over's hop is planned among: the recorded one (or,
/// not bundled, the newest bundled patch of its minor) and the target.
/// A walk's own steps take the newest bundled patch of a minor before the
/// next; a hand-over runs no etcd of its own and takes only the hop etcd's
/// rolling upgrade allows from where the data is (one minor up, or a
/// patch, upstream's patch floors kept: a floor not among these two is no
/// hop), as the Kubernetes tool did: 3.4.23 → 3.5.16 with 3.4.45 bundled
/// too is one hop, not 3.4.23 → 3.4.45 → 3.5.16.
fn hop_bundle(bundle: &Bundle, recorded: Version, target: Version) -> Bundle {
    let from = if bundle.contains(recorded) {
        Some(recorded)
    } else {
        bundle.newest_in(recorded.minor_line())
    };
    Bundle::new(
        from.into_iter()
            .chain(Some(target).filter(|t| bundle.contains(*t))),
    )
}

/// The member's etcd as our supervised child, with `user_args`.
fn member_etcd(config: &Config, user_args: &[String], supervisor: &Supervisor) -> SupervisedEtcd {
    SupervisedEtcd::new(
        supervisor.clone(),
        &config.bin_dir,
        user_args,
        &config.data_dir,
        config.listen_client_urls.as_deref(),
        STOP_GRACE,
    )
}

/// `--force-new-cluster` on a surviving member (issue 29): refused while
/// a quorum of the old cluster answers; else the data dir is backed up and
/// the member's etcd (`recorded`, with the member's own arguments) is
/// started once with etcd's `--force-new-cluster` until it is a cluster of
/// one, then stopped. Returns the names of the members it left behind.
pub fn force_new_cluster(
    config: &Config,
    recorded: VersionPair,
    on_disk: &OnDisk,
    runtime: &tokio::runtime::Runtime,
    supervisor: &Supervisor,
) -> Result<Vec<String>, EntryError> {
    let user_args = etcd_args(config, on_disk)?;
    let members: Vec<_> = on_disk.members.iter().map(member::from_disk).collect();
    let own_id = on_disk.member_id.ok_or_else(|| EntryError::NoMemberId {
        data_dir: config.data_dir.display().to_string(),
        members: members.len(),
    })?;
    let etcd = crate::cluster::force::forcing_etcd(member_etcd(config, user_args, supervisor));
    let args = etcd.target(recorded.version).args;
    let env = |name: &str| std::env::var(name).ok();
    let peer_urls: Vec<String> = members
        .iter()
        .flat_map(|m| m.peer_urls.iter().cloned())
        .collect();
    let peer_tls = settings::peer_tls(&args, &env, &peer_urls)?;
    // Where the member's etcd listens for peers (etcd's default: its
    // advertised peer URLs are then local too).
    let mut listen_peer = settings::url_list(&args, &env, "listen-peer-urls");
    if listen_peer.is_empty() {
        listen_peer = members
            .iter()
            .find(|m| m.id == own_id)
            .map(|m| m.peer_urls.clone())
            .unwrap_or_default();
    }
    runtime.block_on(crate::cluster::force::check(
        &members,
        own_id,
        peer_tls.as_ref(),
        &listen_peer,
    ))?;
    back_up(config, recorded, supervisor)?;
    let own_peer_url = members
        .iter()
        .find(|m| m.id == own_id)
        .and_then(|m| m.peer_urls.first().cloned())
        .unwrap_or_default();
    log::info(
        "forcing a new cluster of this member alone (etcd --force-new-cluster)",
        &[
            ("release", recorded.version.to_string().into()),
            ("members", members.len().into()),
        ],
    );
    let cluster_settings = settings::read(&args, &env)?;
    runtime.block_on(crate::cluster::force::force(
        etcd,
        recorded.version,
        (&own_peer_url, &cluster_settings.advertise_client_urls),
        (peer_tls.as_ref(), cluster_settings.client_tls.as_ref()),
        config.health_timeout,
    ))?;
    Ok(members
        .iter()
        .filter(|m| m.id != own_id)
        .map(|m| m.name.clone())
        .collect())
}

/// How a member's roll ended.
pub enum Finished {
    /// Its etcd ended: the exit code the process ends with.
    Exit(u8),
    /// The roll reached the release a pause job starts from
    /// (`Plan::then_pause`): the etcd serves on, for the job to take over.
    ThenPause {
        /// The member's etcd, running.
        etcd: Box<SupervisedEtcd>,
        /// Its supervisor.
        supervisor: Supervisor,
    },
}

/// Rolls this member to the plan's target with its cluster, then serves
/// until its etcd exits (or, where a pause job comes next, hands the
/// running etcd over).
pub fn run(
    config: &Config,
    plan: &Plan,
    on_disk: &OnDisk,
    marked: Option<Version>,
    bundle: Bundle,
    runtime: &tokio::runtime::Runtime,
    supervisor: Supervisor,
) -> Result<Finished, EntryError> {
    let user_args = etcd_args(config, on_disk)?;
    let etcd = member_etcd(config, user_args, &supervisor);
    // What the member's etcd reads: the full command line it runs with.
    let args = etcd.target(plan.target.version).args;
    let Prepared { rolling, mut live } = prepare(config, plan, on_disk, marked, bundle, &args)?;
    let first = roll::first_release(&rolling)?;
    if let Some(marked) = marked {
        log::info(
            "a restart was not recorded; this member starts with the release that last ran on its data",
            &[("release", marked.to_string().into())],
        );
    }
    let mut etcd = etcd;
    let mut ledger = DataLedger {
        dir: config.data_dir.clone(),
        storage: plan.current.storage,
    };
    let start = runtime.block_on(roll::choose_start(&rolling, first, &mut live, &mut ledger))?;
    if plan.backup.is_some() && marked.is_none() {
        back_up(config, plan.current, &supervisor)?;
    }
    let ended = runtime.block_on(async {
        roll::run(
            &rolling,
            start,
            &mut live,
            &mut etcd,
            &mut ledger,
            supervisor.termination(),
        )
        .await
    })?;
    if let Ended::Rolled = ended {
        return Ok(Finished::ThenPause {
            etcd: Box::new(etcd),
            supervisor,
        });
    }
    Ok(Finished::Exit(exit_code(ended, &config.data_dir)))
}

/// The backup `--backup=always` asks for: the member's data dir as
/// `recorded`, copied while its etcd is down (its container just started,
/// and nothing of ours runs on the data yet), so that no other member
/// waits on it. A run that finds a restart mark takes none: the run that
/// wrote the mark took it before its own first start.
fn back_up(
    config: &Config,
    recorded: VersionPair,
    supervisor: &Supervisor,
) -> Result<(), EntryError> {
    let termination = supervisor.termination();
    let stop = || *termination.borrow();
    let started = std::time::Instant::now();
    let path = backup::create(
        &config.data_dir,
        &config.backup,
        recorded,
        std::time::SystemTime::now(),
        &stop,
    )?;
    log::info(
        "backup taken",
        &[
            ("path", path.display().to_string().into()),
            ("holds", recorded.to_string().into()),
            ("ms", log::ms(started.elapsed())),
            (
                "verify",
                crate::backup::tool::verify_command_line(&path).into(),
            ),
        ],
    );
    Ok(())
}

/// The exit code of the member's etcd, as if it had been exec'd: its own
/// code, or 128 + the signal that ended it.
pub(crate) fn exit_code(ended: Ended, data_dir: &Path) -> u8 {
    let status = match ended {
        Ended::Exited(status) => {
            log::info(
                "member etcd exited",
                &[
                    ("status", status.to_string().into()),
                    ("data_dir", data_dir.display().to_string().into()),
                ],
            );
            status
        }
        Ended::Stopped(signal) => {
            log::info(
                "member etcd stopped on request",
                &[("signal", signal.as_str().into())],
            );
            ExitStatus::Signaled(signal)
        }
        // Only a roll before a pause job ends so, and its caller hands the
        // etcd on (`run`): never an exit.
        Ended::Rolled => {
            log::error(
                "the roll ended for a pause job that nothing took over",
                &[("data_dir", data_dir.display().to_string().into())],
            );
            ExitStatus::Exited(i32::from(crate::EXIT_FAILURE))
        }
    };
    match status {
        ExitStatus::Exited(code) => u8::try_from(code).unwrap_or(crate::EXIT_FAILURE),
        ExitStatus::Signaled(signal) => crate::signal_exit_code(signal),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hand_over_plans_etcds_own_hop_from_the_recorded_release() {
        let v = |s: &str| -> Version { s.parse().expect("version") };
        let bundle = Bundle::new(["3.4.23", "3.4.45", "3.5.16", "3.5.30", "3.6.14"].map(v));
        let hop = |recorded: &str, target: &str| {
            let hop = hop_bundle(&bundle, v(recorded), v(target));
            let pair = |s: &str| -> crate::version::VersionPair {
                format!("{s}/etcd3").parse().expect("pair")
            };
            crate::plan::plan(pair(recorded), pair(target), &hop)
                .map(|plan| {
                    plan.steps
                        .iter()
                        .map(|step| step.runs().to_string())
                        .collect::<Vec<_>>()
                })
                .ok()
        };
        // One minor up straight from the recorded patch, as etcd allows.
        assert_eq!(hop("3.4.23", "3.5.16"), Some(vec!["3.5.16".to_string()]));
        // Not bundled: from the newest bundled patch of its minor.
        let from_newest: Vec<Version> = hop_bundle(&bundle, v("3.4.20"), v("3.5.16"))
            .versions()
            .collect();
        assert_eq!(from_newest, [v("3.4.45"), v("3.5.16")]);
        // Upstream's floor before 3.6 (3.5.26) is not the recorded 3.5.16:
        // no hop (the refusal names the way).
        assert_eq!(hop("3.5.16", "3.6.14"), None);
        assert_eq!(hop("3.5.30", "3.6.14"), Some(vec!["3.6.14".to_string()]));
    }

    /// A backup the settings or the data make impossible is a refusal (2,
    /// as the single-member path's preconditions say it); one that failed
    /// while copying is a failure (1); a stop is 128 + the signal.
    #[test]
    fn backup_errors_exit_as_the_single_member_path_does() {
        let no_space = EntryError::Backup(BackupError::NoSpace {
            root: "/backups".into(),
            what: "a backup".to_string(),
            size: 100,
            need: 130,
            have: 1,
        });
        assert_eq!(no_space.exit_code(), crate::EXIT_PRECONDITION);
        let full = EntryError::Backup(BackupError::Full {
            op: "write",
            path: "/backups/b/member/snap/db".into(),
            source: std::io::Error::from_raw_os_error(28),
        });
        assert_eq!(full.exit_code(), crate::EXIT_FAILURE);
        let stopped = EntryError::Backup(BackupError::Interrupted {
            signal: nix::sys::signal::Signal::SIGTERM,
            path: "/backups/b".into(),
        });
        assert_eq!(stopped.exit_code(), 128 + 15);
    }
}
