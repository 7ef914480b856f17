//! This module owns the checks a run makes before it touches anything,
//! beyond what the pure plan decides: the data dir's access and read-only
//! mount, the hold a failed step left, the processes still running on the
//! data dir, what the data itself records (a version.txt it contradicts,
//! auth enabled, other members in its membership, its member name), data
//! kept where a step's etcd will not look, the ports a step listens on, and
//! the space the backup and the scratch copies need. Each refusal names its
//! subject and the fix, and exits 2 with nothing touched.

use std::net::{SocketAddr, TcpListener, ToSocketAddrs};
use std::path::Path;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use crate::backup::{self, BackupError};
use crate::config::{Config, DataElsewhere, Mode};
use crate::datadir::{self, DataDirError, DirState};
use crate::keyspace::Entry;
use crate::log;
use crate::ondisk::{self, OnDisk};
use crate::paths;
use crate::plan::{Plan, Step};
use crate::steps::{storage_migration, to_etcd2};
use crate::supervisor;
use crate::version::{Storage, Version, VersionPair};

/// How often the wait for an earlier run's processes looks again.
const PROCESS_POLL_INTERVAL: Duration = Duration::from_millis(20);

/// Why the run must not start.
#[derive(Debug, thiserror::Error)]
pub enum PreconditionError {
    /// The data dir cannot be used as it is (no access, a read-only mount,
    /// a hold).
    #[error(transparent)]
    DataDir(#[from] DataDirError),
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
    /// The backup or the scratch copies cannot be made: no space, a
    /// backup dir inside the data dir or not writable, a link in the data
    /// dir that loops or leads into the copy.
    #[error(transparent)]
    Space(#[from] BackupError),
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
        waited: Duration,
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
    #[error("the data in {data_dir} belongs to a cluster of {count} members ({members}), as its own membership records; etcd-migrate runs each release as an isolated single member, which on such data would rejoin (or lead) the live cluster; nothing was touched; {advice}")]
    DataMultiMember {
        /// The data dir.
        data_dir: String,
        /// What to do: a rolling upgrade, or (for a rollback or a storage
        /// change) that those are stop-the-world procedures to come.
        advice: &'static str,
        /// How many members.
        count: usize,
        /// Them, named with their peer URLs.
        members: String,
    },
    /// Steps are needed but etcd's settings keep data where a step's etcd
    /// will not look (each item says which setting and how to proceed).
    #[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; and: "))]
    DataElsewhere(Vec<DataElsewhere>),
    /// The data's v2 store holds content, and a step runs a release that
    /// refuses to start on it (3.6) or cannot read it (3.7).
    #[error("the v2 store of the data in {data_dir} holds content ({}; keys e.g. {keys:?}), and etcd {release}, a step of this plan, has no v2 store: 3.6 refuses to start on custom v2 content, 3.7 cannot read it; nothing was run; move what it holds into the v3 keyspace if it is still used, then remove it with an etcd of {recorded} serving the data (ETCDCTL_API=2 etcdctl rm --recursive <dir>; 3.4 and 3.5 serve the v2 API only with --enable-v2=true), and rerun; etcd 3.6's `etcdutl check v2store` checks the stopped data", .nodes.join(", "))]
    V2Content {
        /// The data dir.
        data_dir: String,
        /// The first step's release without a v2 store.
        release: Version,
        /// What version.txt records.
        recorded: Version,
        /// The top-level nodes that are content (v2 paths; `/2/…` ones are
        /// v2 auth users and roles).
        nodes: Vec<String>,
        /// Some of the keys under them.
        keys: Vec<String>,
    },
    /// The keys the data holds cannot be carried to the target storage as
    /// they are (found offline, before any etcd ran).
    #[error("the keys of the data in {data_dir} cannot all be carried from {from} to {to} storage: {detail}; nothing was run")]
    KeysUnfit {
        /// The data dir.
        data_dir: String,
        /// The storage the data has.
        from: Storage,
        /// The storage asked for.
        to: Storage,
        /// Which keys, why, and what to do.
        detail: String,
    },
    /// A stop signal came while waiting for an earlier run's processes.
    #[error("stopped by {0}")]
    Interrupted(Signal),
}

/// Refuses a data dir on hold, before any clean-up: what the failed run
/// left (its scratch copy too) is what the operator will look at. Returns
/// the state `inspect` found, or `None` when it failed otherwise (the
/// inspection under the lock reports that).
pub fn check_not_held(
    first_look: Result<DirState, DataDirError>,
) -> Result<Option<DirState>, PreconditionError> {
    match first_look {
        Ok(state) => Ok(Some(state)),
        Err(held @ DataDirError::Held { .. }) => Err(held.into()),
        Err(_) => Ok(None),
    }
}

/// Names a read-only mount or a dir owned by someone else now, not when
/// etcd finds it in the middle of a step. (A file in the dir's place is
/// reported by `inspect`.)
pub fn check_access(config: &Config) -> Result<(), PreconditionError> {
    if config.data_dir.is_dir() || !config.data_dir.exists() {
        datadir::check_access(&config.data_dir, config.mode != Mode::DryRun)?;
    }
    Ok(())
}

/// Waits (up to the stop grace an etcd gets) for processes on the data dir
/// to end: after a SIGKILL of an earlier etcd-migrate, its etcd and tools
/// got SIGTERM from their parent-death signal and may still be stopping,
/// holding the WAL lock and the ports. Anything still there after that is
/// not ours to stop: refuse, naming it. No signal thread runs yet, so a
/// termination signal is looked for on every round (it stays pending).
pub fn wait_for_processes_on(data_dir: &Path) -> Result<(), PreconditionError> {
    let started = Instant::now();
    let deadline = started + supervisor::STOP_GRACE;
    let mut logged = false;
    loop {
        if let Some(signal) = supervisor::take_pending_termination() {
            return Err(PreconditionError::Interrupted(signal));
        }
        let found = processes_on(data_dir);
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
            return Err(PreconditionError::Busy {
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
        std::thread::sleep(PROCESS_POLL_INTERVAL);
    }
}

/// The command line of the process at `/proc/<pid>` (`proc_dir`). While
/// a process exits, its main thread can be a zombie with an empty command
/// line while other threads still hold its ports and locks (measured: an
/// etcd 3.5 after SIGTERM, on a loaded machine): then any live thread's
/// command line is read.
fn command_line(proc_dir: &Path) -> Option<Vec<u8>> {
    let main = std::fs::read(proc_dir.join("cmdline")).ok()?;
    if !main.is_empty() {
        return Some(main);
    }
    std::fs::read_dir(proc_dir.join("task"))
        .ok()?
        .flatten()
        .filter_map(|task| std::fs::read(task.path().join("cmdline")).ok())
        .find(|line| !line.is_empty())
}

/// etcd, etcdctl and etcdutl processes (by program name; not etcd-migrate)
/// whose command line names `data_dir` or a path inside it
/// (`--data-dir=<data>`, `--data-dir <data>/.etcd-migrate.work/v2`): those
/// a killed etcd-migrate left stopping, or someone else's etcd on the same
/// data. Wrappers that name the data dir too (`sh -c`, `unshare`, tini,
/// the Kubernetes wrapper scripts) are not etcd. Each as (pid, command
/// line). Processes that vanish while being read are skipped.
pub fn processes_on(data_dir: &Path) -> Vec<(i32, String)> {
    // Compared as paths, resolved on both sides (crate::paths): an etcd
    // started with `--data-dir=/var/etcd/data/`, through a symlink, or with
    // a relative path from its own working dir is on the same data.
    let dir = paths::resolved(data_dir);
    let own = std::process::id() as i32;
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut found = Vec::new();
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        // Ourselves, and our own children: the release checks begun while
        // the data is read (`etcd-<v> <the member's flags> --version`) name
        // the data dir too, and are no earlier run's.
        if pid == own || parent_of(&entry.path()) == Some(own) {
            continue;
        }
        let Some(raw) = command_line(&entry.path()) else {
            continue;
        };
        let args: Vec<String> = raw
            .split(|b| *b == 0)
            .filter(|a| !a.is_empty())
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        let program = args
            .first()
            .and_then(|a| a.rsplit('/').next())
            .unwrap_or_default();
        let is_etcd = program.starts_with("etcd") && !program.starts_with("etcd-migrate");
        if !is_etcd {
            continue;
        }
        // Unreadable for another user's process (no ptrace access): its
        // relative paths then go unread, its absolute ones still count.
        let cwd = std::fs::read_link(entry.path().join("cwd")).ok();
        if names_dir(&args[1..], cwd.as_deref(), &dir) {
            found.push((pid, args.join(" ")));
        }
    }
    found
}

/// The parent pid of the process at `/proc/<pid>` (`proc_dir`): the field
/// after the state in its `stat`, read after the command name's closing
/// parenthesis (the name may hold spaces and parentheses itself).
fn parent_of(proc_dir: &Path) -> Option<i32> {
    let stat = std::fs::read_to_string(proc_dir.join("stat")).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    rest.split_whitespace().nth(1)?.parse().ok()
}

/// Whether `args` (of an etcd, etcdctl or etcdutl) name `dir` (resolved)
/// or a path inside it: an absolute path as an argument or as a flag's
/// `=` value, or a relative one given to a flag that takes a dir
/// (`--data-dir`, `--wal-dir`, `-data-dir x`), taken from `cwd`. Other
/// relative words (`--name=default`) are not read as paths: for an etcd
/// whose working dir is the data dir they would all seem to lie inside it.
fn names_dir(args: &[String], cwd: Option<&Path>, dir: &Path) -> bool {
    let inside = |path: &str| paths::resolved_from(cwd, Path::new(path)).starts_with(dir);
    let takes_dir = |flag: &str| flag.starts_with('-') && flag.ends_with("-dir");
    args.iter().enumerate().any(|(i, arg)| {
        let (flag, value) = match arg.split_once('=') {
            Some((flag, value)) => (Some(flag), value),
            None => (None, arg.as_str()),
        };
        if value.starts_with('/') {
            return inside(value);
        }
        let dir_value = match flag {
            Some(flag) => takes_dir(flag),
            None => i > 0 && takes_dir(&args[i - 1]),
        };
        dir_value && cwd.is_some() && !value.is_empty() && inside(value)
    })
}

/// Reads what the data itself records (offline, before any etcd runs on
/// it) and refuses what no step may do to it: a version.txt the data
/// contradicts, auth-enabled data, data of a multi-member cluster. Returns
/// the member name the data records, when it has one and steps will run:
/// rebuilt data keeps it, and a configured name that differs is reported
/// (an etcd started on existing data with another `--name` would rename
/// the member). Only for a recorded data dir whose plan changes it.
pub fn check_recorded_data(
    config: &Config,
    plan: &Plan,
    on_disk: &OnDisk,
) -> Result<Option<String>, PreconditionError> {
    for note in &on_disk.notes {
        log::info("data read", &[("note", note.as_str().into())]);
    }
    if let Some(cluster_version) = &on_disk.cluster_version {
        check_label(&config.data_dir, plan, cluster_version)?;
    }
    if plan.steps.is_empty() {
        return Ok(None);
    }
    check_alone(config, plan, on_disk)?;
    check_auth_off(config, plan, on_disk)?;
    check_v2_content(config, plan, on_disk)?;
    check_keys_fit(config, plan, on_disk)?;
    let recorded_name = on_disk
        .members
        .iter()
        .find(|m| Some(m.id) == on_disk.member_id)
        .map(|m| m.name.clone())
        .filter(|name| !name.is_empty());
    match &recorded_name {
        Some(name) if *name != config.member.name => log::warn(
            "the configured member name differs from the data's; the steps use the data's",
            &[
                ("data", name.as_str().into()),
                ("configured", config.member.name.as_str().into()),
            ],
        ),
        _ => {}
    }
    Ok(recorded_name)
}

/// What the offline read must hold for the checks of a run from
/// `recorded` to `target`: the v3 keys for a storage change; the v2
/// store's names when they are carried to etcd2, when they may land on
/// v3 keys (only those names), or when a release without a v2 store
/// comes; the whole v2 store for an upgrade from a 2.x release.
pub fn wanted(recorded: VersionPair, target: VersionPair) -> ondisk::Want {
    // An etcd3 upgrade may take its baseline offline: etcd's hash from
    // bolt, and the v2 store beside it (empty, or read by a start).
    let upgrade = recorded.storage == Storage::Etcd3
        && target.storage == Storage::Etcd3
        && target.version > recorded.version;
    let v2_names = match (recorded.storage, target.storage) {
        (Storage::Etcd2, Storage::Etcd3) => Some(ondisk::Keep::V3Names),
        (Storage::Etcd3, Storage::Etcd2) => Some(ondisk::Keep::All),
        (Storage::Etcd3, Storage::Etcd3) if !target.version.has_v2_api() || upgrade => {
            Some(ondisk::Keep::All)
        }
        _ => None,
    };
    ondisk::Want {
        v2_names,
        // A 2.x release's baseline: the whole v2 store, replayed offline
        // (src/baseline.rs).
        v2_store: recorded.storage == Storage::Etcd2
            && recorded.version.major == 2
            && target.version > recorded.version,
        v3_keys: recorded.storage != target.storage,
        v3_hash: false,
        // Walked while the first step's etcd starts (src/baseline.rs).
        v3_hash_later: upgrade,
    }
}

/// What the data records, read offline with what `want` asks for; `None`
/// (with a warning) when it cannot be read: etcd reads the same files and
/// will say what is wrong, in its own words, when it first starts on them.
pub fn read_data(config: &Config, want: &ondisk::Want) -> Option<OnDisk> {
    let started = Instant::now();
    match ondisk::read_with(&config.data_dir, want) {
        Ok(on_disk) => {
            log::info(
                "data read offline",
                &[
                    ("keys", want.v3_keys.into()),
                    ("hash", (want.v3_hash || want.v3_hash_later).into()),
                    ("v2_names", want.v2_names.is_some().into()),
                    ("ms", log::ms(started.elapsed())),
                ],
            );
            Some(on_disk)
        }
        Err(err) => {
            log::warn(
                "cannot read what the data records; its etcd will report it",
                &[("error", err.to_string().into())],
            );
            None
        }
    }
}

/// Refuses data whose own membership lists other members, unless the plan
/// rolls its upgrades through the cluster (`Plan::cluster`).
fn check_alone(config: &Config, plan: &Plan, on_disk: &OnDisk) -> Result<(), PreconditionError> {
    if on_disk.members.len() <= 1 || plan.cluster.is_some() || plan.pause.is_some() {
        return Ok(());
    }
    let upgrade = plan
        .steps
        .iter()
        .all(|step| matches!(step, Step::PatchUpgrade { .. } | Step::MinorUpgrade { .. }));
    Err(PreconditionError::DataMultiMember {
        data_dir: config.data_dir.display().to_string(),
        advice: if upgrade {
            "upgrade a multi-member cluster by rolling restarts, one minor at a time, with TARGET_VERSION set to the minor each member runs now"
        } else {
            "a cluster of several members changes storage (etcd2 <-> etcd3) or goes back where etcd has no online way in one whole-cluster pause job: run every member with ALLOW_CLUSTER_PAUSE=1 (docs/cluster-pause.md), or keep TARGET_VERSION at the release the members run now"
        },
        count: on_disk.members.len(),
        members: on_disk.members_text(),
    })
}

/// Refuses etcd3 data whose v2 store holds content when a step runs a
/// release without a v2 store, as that release would at its start (3.6)
/// or by losing it (3.7). Names the content.
fn check_v2_content(
    config: &Config,
    plan: &Plan,
    on_disk: &OnDisk,
) -> Result<(), PreconditionError> {
    // A cluster's members must never refuse one by one (each refusal
    // would cost the cluster a member); its roll decides in its own way.
    if plan.current.storage != Storage::Etcd3 || plan.cluster.is_some() || plan.pause.is_some() {
        return Ok(());
    }
    let Some(release) = plan.steps.iter().map(Step::runs).find(|v| !v.has_v2_api()) else {
        return Ok(());
    };
    let Some(names) = &on_disk.v2_names else {
        return Ok(());
    };
    let nodes = names.custom_content();
    if nodes.is_empty() {
        return Ok(());
    }
    Err(PreconditionError::V2Content {
        data_dir: config.data_dir.display().to_string(),
        release,
        recorded: plan.current.version,
        nodes: nodes
            .iter()
            .map(|n| n.strip_prefix("/1").unwrap_or(n).to_string())
            .collect(),
        keys: names.keys().take(10).map(str::to_string).collect(),
    })
}

/// Refuses, offline, the keys a storage change cannot carry: etcd2 ->
/// etcd3, a v2 key that would land on a v3 key of the same name; etcd3 ->
/// etcd2, a v3 key the v2 store cannot hold or would rename, or one that
/// falls on a key of the data's own v2 store. The same checks as the
/// steps make on what etcd serves; offline they need bolt to be the
/// keyspace (nothing in the WAL past it), else they are left to the step.
fn check_keys_fit(config: &Config, plan: &Plan, on_disk: &OnDisk) -> Result<(), PreconditionError> {
    let to = plan.target.storage;
    if plan.current.storage == to {
        return Ok(());
    }
    if plan.pause.is_some() {
        // A cluster's member must not refuse at its restart (a rollout
        // would take the members down one by one): the job reads the
        // live keyspace before its go and holds it, the old data
        // serving, while a key does not fit (`cluster::pause::fit`);
        // the converter's own run (a plan of one member, after it
        // removed the cluster mode's v2 records) checks its taken data
        // here again.
        return Ok(());
    }
    let v3 = match &on_disk.v3_keys {
        Some(Ok(keys)) => keys,
        Some(Err(why)) => {
            log::info(
                "keys checked by the step, not offline",
                &[("why", why.as_str().into())],
            );
            return Ok(());
        }
        None => return Ok(()),
    };
    let v3: Vec<Entry> = v3
        .iter()
        .map(|k| Entry {
            key: k.key.clone(),
            value: k.value.clone(),
            ttl: None,
            lease: k.lease,
        })
        .collect();
    let v2: Vec<Entry> = on_disk
        .v2_names
        .iter()
        .flat_map(|names| names.keys())
        .map(|path| Entry {
            key: path.as_bytes().to_vec(),
            value: Vec::new(),
            ttl: None,
            lease: 0,
        })
        .collect();
    let fits = match to {
        Storage::Etcd3 => storage_migration::check_no_clash(&v2, &v3),
        Storage::Etcd2 => {
            to_etcd2::check_v2_compatible(&v3).and_then(|()| to_etcd2::check_v2_side_fits(&v3, &v2))
        }
    };
    fits.map_err(|detail| PreconditionError::KeysUnfit {
        data_dir: config.data_dir.display().to_string(),
        from: plan.current.storage,
        to,
        detail,
    })
}

/// Refuses data with v3 or v2 authentication enabled.
fn check_auth_off(config: &Config, plan: &Plan, on_disk: &OnDisk) -> Result<(), PreconditionError> {
    let auth = match (on_disk.v3_auth_enabled, on_disk.v2_auth_enabled) {
        (true, _) => Some(("v3", "`etcdctl --user root auth disable` (ETCDCTL_API=3)")),
        (false, true) => Some(("v2", "`etcdctl -u root auth disable` (ETCDCTL_API=2)")),
        (false, false) => None,
    };
    match auth {
        Some((api, disable)) => Err(PreconditionError::AuthEnabled {
            data_dir: config.data_dir.display().to_string(),
            api,
            recorded: plan.current,
            disable,
        }),
        None => Ok(()),
    }
}

/// Refuses a version.txt whose release the data's cluster version
/// contradicts. The one accepted difference: the data is one minor ahead
/// of version.txt when the first step runs that minor in place (a run
/// that died during that step; the baseline handles it).
fn check_label(
    data_dir: &Path,
    plan: &Plan,
    cluster_version: &str,
) -> Result<(), PreconditionError> {
    let recorded = plan.current;
    let minor = |v: &str| v.split('.').take(2).collect::<Vec<_>>().join(".");
    let cluster_minor = minor(cluster_version);
    let recorded_minor = recorded.version.minor_line().to_string();
    // A run that died in its first step may have left the data at that
    // step's minor: an upgrade's etcd raised the cluster version, or etcd's
    // downgrade lowered it (before the older release was recorded).
    let interrupted_first_step = match plan.steps.first() {
        Some(
            step @ (Step::PatchUpgrade { .. }
            | Step::MinorUpgrade { .. }
            | Step::MinorDowngrade { .. }),
        ) => step.runs().minor_line().to_string() == cluster_minor,
        _ => false,
    };
    // A member of a cluster may run one minor ahead of the cluster
    // version while the others catch up (a wave under way), also where
    // the wave is a roll's that hands over to a pause job (the job waits
    // for the cluster version it runs at).
    let wave_under_way = (plan.cluster.is_some() || plan.pause.is_some())
        && cluster_version
            .parse::<Version>()
            .is_ok_and(|cv| cv.minor_line().next() == recorded.version.minor_line());
    // A 3.4.32+ member rolled down from 3.5 runs on data whose cluster
    // version stays 3.5 until the cluster's leader lowers it (seconds,
    // while every member answers; src/cluster/decide.rs).
    let rolled_down = recorded.version.rolls_down_from_next_minor()
        && cluster_version
            .parse::<Version>()
            .is_ok_and(|cv| recorded.version.minor_line().next() == cv.minor_line());
    if cluster_minor == recorded_minor || interrupted_first_step || wave_under_way || rolled_down {
        return Ok(());
    }
    let storage = if cluster_minor.starts_with("2.") {
        Storage::Etcd2
    } else {
        recorded.storage
    };
    Err(PreconditionError::Mislabelled {
        path: data_dir.join(datadir::VERSION_FILE).display().to_string(),
        recorded,
        cluster_version: cluster_version.to_string(),
        suggestion: format!("{cluster_minor}.<patch>/{storage}"),
        cluster_minor,
    })
}

/// Refuses a plan with steps that its settings or its host cannot carry
/// out: data kept where a step's etcd will not look, a port a step's etcd
/// cannot bind, no room (or no safe place) for the backup and the scratch
/// copies.
pub fn check_before_steps(config: &Config, plan: &Plan) -> Result<(), PreconditionError> {
    // A no-op or patch-only plan starts no etcd before the exec, which
    // gets these settings as they are; a step would not honour them.
    if !plan.steps.is_empty() && !config.data_elsewhere.is_empty() {
        return Err(PreconditionError::DataElsewhere(
            config.data_elsewhere.clone(),
        ));
    }
    // Only when etcd will run: a no-op stays fast, and a dry run may look
    // at a data dir whose etcd is serving (and holding the ports) right now.
    if !plan.steps.is_empty() && config.mode != Mode::DryRun {
        check_ports(config)?;
    }
    let backup = plan.backup.is_some();
    let destructive = plan.builds_a_copy();
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

/// Checks that every port a step's etcd listens on can be bound now, so a
/// port held by another process (an etcd already running on this data, a
/// second pod) is named before anything is touched. etcd binds with
/// SO_REUSEADDR, and so does `TcpListener`: a port in TIME_WAIT passes.
fn check_ports(config: &Config) -> Result<(), PreconditionError> {
    let port = config.member.client_port;
    let client = SocketAddr::from(([127, 0, 0, 1], port));
    try_bind(client).map_err(|reason| PreconditionError::PortUnavailable {
        role: "client",
        port,
        address: client.to_string(),
        setting: "--port (default 18629, or 18631 when the data dir path contains \"event\")"
            .to_string(),
        reason,
        fix: "stop whatever listens there, or give the steps a free loopback port with --port",
    })?;
    for (url, address) in peer_addresses(&config.member.listen_peer_urls) {
        // Port 0 binds "any free port", where no advertised peer URL points
        // (--peer-port 0 is refused with the configuration).
        if address.port() == 0 {
            return Err(PreconditionError::PortUnavailable {
                role: "peer",
                port: 0,
                address: address.to_string(),
                setting: format!("{url} in --listen-peer-urls (or $LISTEN_PEER_URLS)"),
                reason: "port 0 makes etcd listen on whatever port is free, which no peer URL can name".to_string(),
                fix: "give a real port in LISTEN_PEER_URLS (and the same in INITIAL_ADVERTISE_PEER_URLS and INITIAL_CLUSTER)",
            });
        }
        try_bind(address).map_err(|reason| PreconditionError::PortUnavailable {
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    #[test]
    fn a_member_one_minor_ahead_of_its_cluster_is_no_mislabel_only_in_a_cluster() {
        use crate::plan::{self, Bundle};
        use crate::version::VersionPair;
        let pair = |s: &str| -> VersionPair { s.parse().expect("pair") };
        let bundle = Bundle::new(
            ["3.2.32", "3.3.25", "3.4.23", "3.5.16"].map(|v| v.parse().expect("version")),
        );
        // Recorded 3.3.25 by a roll's proof while the others still run 3.2
        // (the cluster version 3.2.0), the target past a pause.
        let alone = plan::plan(pair("3.3.25/etcd2"), pair("3.5.16/etcd3"), &bundle).expect("plan");
        let dir = Path::new("/var/etcd/data");
        let err = check_label(dir, &alone, "3.2.0").expect_err("one member");
        assert!(err.to_string().contains("3.2.<patch>/etcd2"), "{err}");
        let pausing = Plan {
            pause: Some(3),
            ..alone.clone()
        };
        check_label(dir, &pausing, "3.2.0").expect("a pause job's member");
        let rolling = Plan {
            cluster: Some(3),
            ..alone.clone()
        };
        check_label(dir, &rolling, "3.2.0").expect("a rolling member");
        // Two minors behind is no wave.
        check_label(dir, &pausing, "3.1.0").expect_err("two minors");
    }

    #[test]
    fn a_3_4_32_member_rolled_down_from_3_5_is_no_mislabel_before_the_cluster_version_drops() {
        use crate::plan::{self, Bundle};
        use crate::version::VersionPair;
        let pair = |s: &str| -> VersionPair { s.parse().expect("pair") };
        let bundle = Bundle::new(
            ["3.4.23", "3.4.31", "3.4.45", "3.5.16"].map(|v| v.parse().expect("version")),
        );
        let dir = Path::new("/var/etcd/data");
        // At its target: no steps, no cluster plan; the data's cluster
        // version is still 3.5 (the leader lowers it seconds later).
        let at = plan::plan(pair("3.4.45/etcd3"), pair("3.4.45/etcd3"), &bundle).expect("plan");
        check_label(dir, &at, "3.5.0").expect("a 3.4.45 member rolled down");
        check_label(dir, &at, "3.6.0").expect_err("two minors");
        // 3.4.31 joins a 3.5 cluster but is not what a roll takes: a
        // 3.4.31 label on 3.5 data is what an operator wrote by hand.
        let old = plan::plan(pair("3.4.31/etcd3"), pair("3.4.31/etcd3"), &bundle).expect("plan");
        check_label(dir, &old, "3.5.0").expect_err("3.4.31");
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
    fn an_etcd_names_the_data_dir_however_its_arguments_spell_it() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let data = tmp.path().join("data");
        std::fs::create_dir(&data).expect("mkdir");
        let link = tmp.path().join("link");
        std::os::unix::fs::symlink(&data, &link).expect("symlink");
        let dir = paths::resolved(&data);
        let args = |list: &[String]| list.to_vec();
        let shown = data.display().to_string();
        let cases: Vec<(Vec<String>, Option<&Path>, bool)> = vec![
            (args(&[format!("--data-dir={shown}/")]), None, true),
            (
                args(&[format!("--data-dir={shown}//member/./wal")]),
                None,
                true,
            ),
            (
                args(&["-data-dir".into(), format!("{}", link.display())]),
                None,
                true,
            ),
            (args(&[format!("{shown}/../data/snapshot.db")]), None, true),
            (
                args(&["--data-dir".into(), "./data/".into()]),
                Some(tmp.path()),
                true,
            ),
            (
                args(&["--wal-dir=data/member/wal".into()]),
                Some(tmp.path()),
                true,
            ),
            // A relative path with no known working dir cannot be placed.
            (args(&["--data-dir=./data".into()]), None, false),
            // Words that are not paths, even from inside the data dir.
            (
                args(&["--name=default".into(), "default".into()]),
                Some(&data),
                false,
            ),
            (args(&[format!("--data-dir={shown}.backup")]), None, false),
            (
                args(&[format!("--data-dir={}", tmp.path().display())]),
                None,
                false,
            ),
        ];
        for (list, cwd, expected) in cases {
            assert_eq!(
                names_dir(&list, cwd, &dir),
                expected,
                "{list:?} from {cwd:?}"
            );
        }
    }

    #[test]
    fn processes_on_the_data_dir_are_etcds_naming_it_or_a_path_inside() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let data = tmp.path().join("data");
        // A shell under an etcd-like name stands in for a stopping etcd. It
        // waits in the `read` builtin on a fifo nobody writes: no child of
        // its own (a forked child would carry the same command line). It is
        // started by a shell that exits at once, so that it is no child of
        // ours (as an earlier run's etcd is not): its pid comes back on
        // the shell's output.
        let fake = tmp.path().join("etcd-3.4.23");
        std::fs::copy("/bin/sh", &fake).expect("copy sh");
        let fifo = tmp.path().join("never-written");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).expect("mkfifo");
        let scratch = format!("--data-dir={}/.etcd-migrate.work/v2", data.display());
        let started = Command::new("/bin/sh")
            .args([
                "-c",
                r#""$0" -c 'read line < "$1"' etcd "$1" "$2" >/dev/null 2>&1 & echo $!"#,
            ])
            .arg(&fake)
            .arg(&fifo)
            .arg(&scratch)
            .output()
            .expect("start the stand-in");
        let orphan: i32 = String::from_utf8_lossy(&started.stdout)
            .trim()
            .parse()
            .expect("the stand-in's pid");
        // Our own child naming the dir (as the release checks begun while
        // the data is read do) is no earlier run's.
        let mut own_child = Command::new(&fake)
            .args(["-c", "read line", "etcd", &scratch])
            .stdin(std::process::Stdio::piped())
            .spawn()
            .expect("spawn our own stand-in");
        // A wrapper naming the same dir is not etcd.
        let mut wrapper = Command::new("/bin/sh")
            .args(["-c", "read line", "sh", &scratch])
            .stdin(std::process::Stdio::piped())
            .spawn()
            .expect("spawn the wrapper");
        // Until each has exec'd (a loaded machine can take a while), /proc
        // shows another command line for it: wait, with a deadline.
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        let exec_done = |pid: i32| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|line| line.windows(scratch.len()).any(|w| w == scratch.as_bytes()))
        };
        let mut found = Vec::new();
        let pids = [orphan, own_child.id() as i32, wrapper.id() as i32];
        while !pids.iter().all(|pid| exec_done(*pid)) {
            assert!(
                std::time::Instant::now() < deadline,
                "the stand-ins never exec'd"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        found.extend(processes_on(&data));
        let other = processes_on(&tmp.path().join("dat"));
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(orphan),
            nix::sys::signal::Signal::SIGKILL,
        );
        let _ = own_child.kill();
        let _ = wrapper.kill();
        let _ = own_child.wait();
        let _ = wrapper.wait();
        let pids: Vec<i32> = found.iter().map(|(pid, _)| *pid).collect();
        assert_eq!(pids, [orphan], "{found:?}");
        assert!(found[0].1.contains(".etcd-migrate.work/v2"), "{found:?}");
        assert!(
            other.is_empty(),
            "a prefix of the name is not the dir: {other:?}"
        );
    }
}
