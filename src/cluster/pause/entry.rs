//! This module owns the pause job's entry from the run: from the
//! configuration, what the data records and the member's record of the
//! job, the [`Pausing`] that carries its part out (its job, its old
//! membership, its TLS and URLs).

use std::time::Duration;

use crate::cluster::member::{self, SupervisedEtcd};
use crate::cluster::pause::run::Pausing;
use crate::cluster::pause::{Job, Phase, Record, Whom};
use crate::cluster::settings::{self, SettingsError};
use crate::config::{self, Config, Mode};
use crate::datadir;
use crate::log;
use crate::ondisk::OnDisk;
use crate::supervisor::Supervisor;
use crate::version::{Version, VersionPair};

/// What the member's etcd may take to stop gracefully.
const STOP_GRACE: Duration = Duration::from_secs(20);

/// Why the job cannot start on this member.
#[derive(Debug, thiserror::Error)]
pub enum EntryError {
    /// `--no-exec` cannot take part.
    #[error("the data in {data_dir} belongs to a cluster of {members} members ({names}), and {from} -> {target} takes the whole cluster's pause job (no cluster takes it member by member), in which this member's etcd runs as etcd-migrate's child; --no-exec (migrate-if-needed.sh) exits before etcd starts and cannot take part: run etcd-migrate as the container's command with etcd's flags after `--` (examples/ha/) and ALLOW_CLUSTER_PAUSE=1 on every member, or keep TARGET_VERSION/TARGET_STORAGE at {from}; nothing was touched")]
    NoExec {
        /// The data dir.
        data_dir: String,
        /// How many members.
        members: usize,
        /// Each member's name and peer URLs.
        names: String,
        /// What version.txt records.
        from: VersionPair,
        /// The target.
        target: VersionPair,
    },
    /// Nothing tells which member or cluster this is.
    #[error("{data_dir}: {why}; start the member once with etcd itself to see etcd's own error")]
    Unknown {
        /// The data dir.
        data_dir: String,
        /// What is missing.
        why: String,
    },
    /// The record cannot be read.
    #[error("the pause job's record {path} cannot be read ({why}); it says which part of a whole-cluster job this member has done: do not remove it by hand while the job runs (see docs/cluster-pause.md)")]
    Record {
        /// The file.
        path: String,
        /// Why.
        why: String,
    },
    /// The member's TLS settings.
    #[error(transparent)]
    Settings(#[from] SettingsError),
}

/// Refuses what cannot take part before anything is set up (`--no-exec`).
pub fn check_mode(
    config: &Config,
    on_disk: Option<&OnDisk>,
    from: VersionPair,
) -> Result<(), EntryError> {
    match &config.mode {
        Mode::Exec { .. } => Ok(()),
        Mode::NoExec | Mode::DryRun => Err(EntryError::NoExec {
            data_dir: config.data_dir.display().to_string(),
            members: on_disk.map_or(0, |d| d.members.len()),
            names: on_disk.map(OnDisk::members_text).unwrap_or_default(),
            from,
            target: config.target,
        }),
    }
}

/// The member's etcd as our supervised child, with the user's arguments
/// (the caller checked the mode: [`check_mode`]).
pub fn member_etcd(config: &Config, supervisor: &Supervisor) -> SupervisedEtcd {
    let args: &[String] = match &config.mode {
        Mode::Exec { etcd_args } => etcd_args,
        Mode::NoExec | Mode::DryRun => &[],
    };
    SupervisedEtcd::new(
        supervisor.clone(),
        &config.bin_dir,
        args,
        &config.data_dir,
        config.listen_client_urls.as_deref(),
        STOP_GRACE,
    )
}

/// The member's record of a job, if it has one.
pub fn read_record(config: &Config) -> Result<Option<Record>, EntryError> {
    let path = config.data_dir.join(datadir::PAUSE_FILE);
    let failed = |why: String| EntryError::Record {
        path: path.display().to_string(),
        why,
    };
    match datadir::read_pause(&config.data_dir).map_err(|e| failed(e.to_string()))? {
        Some(raw) => Record::parse(&raw).map(Some).map_err(failed),
        None => Ok(None),
    }
}

/// The member's part: its job (the record's, once the member stopped for
/// it; else the one its data and target make), the old membership (the
/// data's, else the record's), its own name and URLs from its settings;
/// `withdraw_only` when its target needs no pause and its record is an
/// agreement to an earlier target's job ([`Record::withdraws_only`]).
pub fn prepare(
    config: &Config,
    on_disk: Option<&OnDisk>,
    (record, withdraw_only): (Option<Record>, bool),
    recorded: VersionPair,
    old_release: Version,
    etcd: &SupervisedEtcd,
    supervisor: &Supervisor,
) -> Result<Pausing, EntryError> {
    let data_dir = config.data_dir.display().to_string();
    let unknown = |why: &str| EntryError::Unknown {
        data_dir: data_dir.clone(),
        why: why.to_string(),
    };
    let args = etcd.target(config.target.version).args;
    let env = |name: &str| std::env::var(name).ok();
    let cluster_settings = settings::read(&args, &env)?;
    let members: Vec<Whom> = match (on_disk, &record) {
        (Some(on_disk), _) if on_disk.members.len() > 1 => on_disk
            .members
            .iter()
            .map(member::from_disk)
            .map(|m| Whom {
                id: m.id,
                name: m.name,
                peer_urls: m.peer_urls,
                client_urls: m.client_urls,
            })
            .collect(),
        (_, Some(record)) if !record.members.is_empty() => record.members.clone(),
        _ => {
            return Err(unknown(
                "neither its data nor a pause record names the cluster's members",
            ))
        }
    };
    let own_id = match (&record, on_disk.and_then(|d| d.member_id)) {
        (Some(record), _) => record.own_id,
        (None, Some(id)) => id,
        (None, None) => return Err(unknown("its WAL records no member id")),
    };
    let own_old = members.iter().find(|m| m.id == own_id);
    let own = Whom {
        id: own_id,
        name: own_old
            .map(|m| m.name.clone())
            .filter(|n| !n.is_empty())
            .or_else(|| config::flag_in_args(&args, "name"))
            .unwrap_or_else(|| config.member.name.clone()),
        peer_urls: if cluster_settings.advertise_peer_urls.is_empty() {
            own_old.map(|m| m.peer_urls.clone()).unwrap_or_default()
        } else {
            cluster_settings.advertise_peer_urls.clone()
        },
        client_urls: if cluster_settings.advertise_client_urls.is_empty() {
            own_old.map(|m| m.client_urls.clone()).unwrap_or_default()
        } else {
            cluster_settings.advertise_client_urls.clone()
        },
    };
    let peer_urls: Vec<String> = members.iter().flat_map(|m| m.peer_urls.clone()).collect();
    let peer_tls = settings::peer_tls(&args, &env, &peer_urls)?;
    let fresh = Job::new(
        on_disk
            .and_then(|d| d.cluster_id)
            .or_else(|| {
                record
                    .as_ref()
                    .and_then(|r| u64::from_str_radix(r.job.split('-').next()?, 16).ok())
            })
            .unwrap_or(0),
        config.target,
    );
    // Once the member stopped for a job, that job is its own whatever the
    // target says now; an agreement alone is withdrawn by the run (if the
    // job has no go yet).
    let job = match &record {
        Some(r) if r.phase > Phase::Agreed || r.job == fresh.id => Job {
            id: r.job.clone(),
            target: r.target().map_err(|why| EntryError::Record {
                path: config
                    .data_dir
                    .join(datadir::PAUSE_FILE)
                    .display()
                    .to_string(),
                why,
            })?,
        },
        _ => fresh,
    };
    if let Some(r) = &record {
        log::info(
            "this member takes part in a whole-cluster pause job (its data dir records it)",
            &[
                ("job", r.job.as_str().into()),
                ("phase", format!("{:?}", r.phase).into()),
                ("target", r.target.as_str().into()),
            ],
        );
    }
    let target_serves_v2 = serves_v2(job.target.version, &args, &env);
    Ok(Pausing {
        target_serves_v2,
        job,
        data_dir: config.data_dir.clone(),
        recorded,
        old_release,
        consent: config.allow_cluster_pause,
        own,
        members,
        peer_tls,
        client_tls: cluster_settings.client_tls,
        record,
        prove_deadline: config.health_timeout,
        backup: config.backup.clone(),
        termination: supervisor.termination(),
        withdraw_only,
        agreed_this_run: false,
        misfit: None,
    })
}

/// Whether `release`, run with the member's etcd flags `args` (and
/// environment), serves the v2 API: etcd2 data is served (and a joiner
/// proven) through it, and 3.4 and 3.5 serve it only with `--enable-v2`.
fn serves_v2(
    release: crate::version::Version,
    args: &[String],
    env: &dyn Fn(&str) -> Option<String>,
) -> bool {
    release.has_v2_api()
        && (!release.needs_enable_v2_flag()
            || settings::value(args, env, "enable-v2").is_some_and(|v| v == "true"))
}

#[cfg(test)]
mod tests {
    use super::serves_v2;

    #[test]
    fn a_target_serves_v2_where_its_release_does_or_the_flags_ask() {
        let flag = vec!["--enable-v2=true".to_string()];
        let off = vec!["--enable-v2=false".to_string()];
        let none: Vec<String> = Vec::new();
        let no_env = |_: &str| None;
        let env_on = |name: &str| (name == "ETCD_ENABLE_V2").then(|| "true".to_string());
        let cases: Vec<(&str, &[String], bool, bool)> = vec![
            ("3.3.25", &none, false, true),
            ("3.4.23", &none, false, false),
            ("3.4.23", &flag, false, true),
            ("3.5.16", &off, false, false),
            ("3.5.16", &none, true, true),
            ("3.6.14", &flag, false, false),
        ];
        for (release, args, env, want) in cases {
            let got = if env {
                serves_v2(release.parse().expect("version"), args, &env_on)
            } else {
                serves_v2(release.parse().expect("version"), args, &no_env)
            };
            assert_eq!(got, want, "{release} {args:?} env {env}");
        }
    }
}
