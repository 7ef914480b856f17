//! This module owns the configuration: the command line and the environment
//! (flag > env var > default, the Kubernetes image's names), resolved once
//! into the plain `Config` struct that the rest of the program reads. Tests
//! build `Config` directly or resolve it against a fake environment.

use std::ffi::OsString;
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Parser;

use crate::backup::{BackupMode, BackupPolicy};
use crate::log::LogFormat;
use crate::paths;
use crate::version::{ParseError, Storage, Version, VersionPair};

/// How long a step's etcd may take to accept its first write (the
/// Kubernetes tool waited 2 minutes too).
pub const DEFAULT_HEALTH_TIMEOUT: Duration = Duration::from_secs(120);

/// The `--health-timeout` values accepted, in seconds. Bounded above so
/// that the deadline (now + timeout) can always be computed (a value near
/// `u64::MAX` overflowed `Instant` and panicked after an etcd had
/// started) and because a step that has not taken a write in a day will
/// not take one.
pub const HEALTH_TIMEOUT_RANGE: std::ops::RangeInclusive<u64> = 1..=86_400;

/// Where the image keeps `etcd-<v>`, `etcdctl-<v>`, `etcdutl-<v>`.
pub const DEFAULT_BIN_DIR: &str = "/usr/local/bin";

/// What to do once the data dir is at the target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mode {
    /// Replace this process with the target etcd, with these arguments.
    Exec {
        /// Arguments after `--`, passed to etcd as they are.
        etcd_args: Vec<String>,
    },
    /// Migrate and exit 0 (what `migrate-if-needed.sh`-style manifests do).
    NoExec,
    /// Print the plan and change nothing.
    DryRun,
}

/// Everything the run needs, resolved and validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Where the data must end up.
    pub target: VersionPair,
    /// The etcd data dir.
    pub data_dir: PathBuf,
    /// The member every step's etcd runs as.
    pub member: Member,
    /// Where `etcd-<v>`, `etcdctl-<v>`, `etcdutl-<v>` live.
    pub bin_dir: PathBuf,
    /// The releases to use; `None` means every `etcd-<semver>` in `bin_dir`.
    pub bundled_versions: Option<Vec<Version>>,
    /// The peer port the default peer URLs are built from.
    pub peer_port: u16,
    /// Client URLs for the exec'd etcd when its arguments set none.
    pub listen_client_urls: Option<String>,
    /// The Kubernetes key prefix (used by the storage-migration steps).
    pub data_prefix: String,
    /// Keys under here get a flat lease in the Kubernetes-compatible TTL mode.
    pub ttl_keys_directory: String,
    /// Deadline for a step's etcd to accept its first write.
    pub health_timeout: Duration,
    /// When and where backups are taken, and how many are kept.
    pub backup: BackupPolicy,
    /// How v2 TTL keys get their expiry in v3.
    pub ttl_leases: TtlLeases,
    /// Leave the v2 copies of migrated keys in place.
    pub keep_v2_keys: bool,
    /// The snapshot to restore the data dir from, once (issue 29).
    pub restore: Option<RestoreRequest>,
    /// Start this member once as a new one-member cluster (issue 29).
    pub force_new_cluster: bool,
    /// The operator's consent to a whole-cluster pause job (issue 28): a
    /// target that cannot roll member by member (etcd2 -> etcd3, a
    /// rollback etcd has no online way for) stops the cluster's writes
    /// for the job's pause; without it on every member, the members keep
    /// serving and say why.
    pub allow_cluster_pause: bool,
    /// What to do after migrating.
    pub mode: Mode,
    /// How our own log lines look.
    pub log_format: LogFormat,
    /// Settings given both as a flag and as a different env var: the flag
    /// won. `run` logs each, so a manifest's stale env var is visible.
    pub overridden: Vec<Override>,
    /// etcd settings that keep data outside the data dir, or would make a
    /// step's etcd run elsewhere: a plan with steps refuses them (the
    /// no-op and patch paths start no etcd and pass them on).
    pub data_elsewhere: Vec<DataElsewhere>,
}

/// The member every step's etcd runs as: its name, where it listens, the
/// cluster it names and the user's extra flags. Resolved once; the steps
/// and each step's command line borrow it whole.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    /// The member name.
    pub name: String,
    /// The loopback client port of every intermediate etcd.
    pub client_port: u16,
    /// `--listen-peer-urls` of every intermediate etcd.
    pub listen_peer_urls: String,
    /// `--initial-advertise-peer-urls` of every intermediate etcd.
    pub initial_advertise_peer_urls: String,
    /// `--initial-cluster` of every intermediate etcd.
    pub initial_cluster: String,
    /// `--initial-cluster-token` for restored and rebuilt data.
    pub initial_cluster_token: String,
    /// Extra etcd flags for every intermediate etcd (`ETCD_CREDS`).
    pub extra_args: Vec<String>,
}

impl Member {
    /// This member under `name`, the name its data records: rebuilt data
    /// keeps it, and an etcd started on existing data with another name
    /// would rename the member. `--initial-cluster` then lists that one
    /// member at the advertised peer URLs (a restore refuses a name the
    /// initial cluster lacks).
    pub fn named(&self, name: &str) -> Member {
        if name == self.name {
            return self.clone();
        }
        Member {
            name: name.to_string(),
            initial_cluster: format!("{name}={}", self.initial_advertise_peer_urls),
            ..self.clone()
        }
    }
}

impl Config {
    /// The member settings its etcd will read, as flags in etcd's order
    /// (the last wins): ours first (`--initial-cluster`, `--name`,
    /// `--initial-advertise-peer-urls`, `--initial-cluster-token`), then
    /// `ETCD_CREDS`, then the etcd arguments. Read them back with
    /// [`flag_in_args`].
    pub fn member_args(&self) -> Vec<String> {
        let mut args = vec![
            format!("--initial-cluster={}", self.member.initial_cluster),
            format!("--name={}", self.member.name),
            format!(
                "--initial-advertise-peer-urls={}",
                self.member.initial_advertise_peer_urls
            ),
            format!(
                "--initial-cluster-token={}",
                self.member.initial_cluster_token
            ),
        ];
        args.extend(self.member.extra_args.iter().cloned());
        if let Mode::Exec { etcd_args } = &self.mode {
            args.extend(etcd_args.iter().cloned());
        }
        args
    }
}

/// A snapshot the data dir is to be restored from: the file and the
/// sha256 the operator vouches for (the same on every member).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RestoreRequest {
    /// The snapshot file (`etcdctl snapshot save`).
    pub file: PathBuf,
    /// Its sha256, lower-case hex.
    pub sha256: String,
}

/// `--restore-snapshot` and `--restore-snapshot-sha256` (or their env
/// vars): both or neither, the hash 64 hex digits.
fn resolve_restore(
    cli: &mut Cli,
    picker: &mut Picker<'_>,
) -> Result<Option<RestoreRequest>, ConfigError> {
    let file = picker.pick(
        cli.restore_snapshot
            .take()
            .map(|p| p.to_string_lossy().into_owned()),
        "--restore-snapshot",
        "RESTORE_SNAPSHOT",
    );
    let sha256 = picker.pick(
        cli.restore_snapshot_sha256.take(),
        "--restore-snapshot-sha256",
        "RESTORE_SNAPSHOT_SHA256",
    );
    match (file, sha256) {
        (None, None) => Ok(None),
        (None, Some(_)) => Err(ConfigError::Missing {
            flag: "--restore-snapshot",
            env: "RESTORE_SNAPSHOT",
            hint: "--restore-snapshot-sha256 names the hash of a snapshot file; give the file too, or drop the hash",
        }),
        (Some(_), None) => Err(ConfigError::Missing {
            flag: "--restore-snapshot-sha256",
            env: "RESTORE_SNAPSHOT_SHA256",
            hint: "the snapshot's sha256 (`sha256sum <file>`), so that every member is known to restore the same file",
        }),
        (Some(file), Some(sha256)) => {
            let sha256 = sha256.trim().to_ascii_lowercase();
            if sha256.len() != 64 || !sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(ConfigError::Invalid {
                    setting: "--restore-snapshot-sha256 / RESTORE_SNAPSHOT_SHA256".to_string(),
                    value: sha256,
                    reason: "not a sha256: 64 hex digits, as `sha256sum <file>` prints them".to_string(),
                });
            }
            Ok(Some(RestoreRequest {
                file: PathBuf::from(file),
                sha256,
            }))
        }
    }
}

/// How keys that expired in the v2 store get their expiry in v3.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum TtlLeases {
    /// Each key gets a lease with its own remaining TTL; keys that expire
    /// in the same second share one.
    #[default]
    Exact,
    /// The Kubernetes tool's way: every key under the TTL keys directory
    /// gets one lease of an hour (other TTL keys still get exact leases).
    Flat,
}

/// An etcd setting the steps cannot honour. Each step runs etcd on the
/// data dir alone (its `member/` holds the db and, by default, the WAL);
/// the rebuilding steps restore and swap `member/` as a whole.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DataElsewhere {
    /// The WAL lives outside `<data>/member/wal`. A step's etcd would find
    /// no WAL and bootstrap a fresh cluster (new IDs, raft history from
    /// zero) on the db; writes then time out or are lost, and the real WAL
    /// no longer matches the db (seen on real etcd 3.4).
    #[error("{setting} keeps the WAL in {}, outside the data dir {}, but each step's etcd runs on the data dir alone: it would find no WAL and bootstrap a fresh cluster on the db, after which writes are lost; stop etcd, move the WAL into the data dir (`mv {} {}`), remove {setting}, migrate, and afterwards, with etcd stopped, move it back and set it again if you want the WAL there", .wal_dir.display(), .data_dir.display(), .wal_dir.display(), .data_dir.join("member/wal").display())]
    WalDir {
        /// Where it is set, e.g. `--wal-dir in the etcd arguments`.
        setting: String,
        /// The WAL dir (absolute, for the `mv` command).
        wal_dir: PathBuf,
        /// The data dir.
        data_dir: PathBuf,
    },
    /// Another data dir than the migrated one.
    #[error("{setting} names the data dir {theirs:?}, but the data dir being migrated is {}; make them the same (or point --data-dir / $DATA_DIRECTORY at {theirs:?})", .data_dir.display())]
    DataDir {
        /// Where it is set.
        setting: String,
        /// What it says.
        theirs: String,
        /// The data dir.
        data_dir: PathBuf,
    },
    /// A config file for the step etcds: etcd then ignores every flag.
    #[error("--config-file in --etcd-server-extra-args ($ETCD_CREDS) makes each step's etcd ignore every other flag, the data dir, loopback client URL and peer settings etcd-migrate gives it included; remove it from $ETCD_CREDS and pass the settings it holds (e.g. TLS files) as flags")]
    ConfigFileForSteps,
    /// A config file whose data settings cannot be read.
    #[error("the etcd config file {file} (from {from}) cannot be read ({reason}), so where it keeps the data (data-dir, wal-dir) is unknown; make it readable by etcd-migrate")]
    UnreadableConfigFile {
        /// The file.
        file: String,
        /// The flag or env var that names it.
        from: &'static str,
        /// Why.
        reason: String,
    },
}

/// A setting given as a flag and, with another value, as its env var.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Override {
    /// The flag, which wins.
    pub flag: &'static str,
    /// The env var, which is ignored.
    pub env: &'static str,
    /// The flag's value (the one used).
    pub used: String,
    /// The env var's value (the one ignored).
    pub ignored: String,
}

impl Override {
    /// Env vars whose values stay out of the log (they may hold secrets).
    const SECRET: [&'static str; 1] = ["ETCD_CREDS"];

    /// `value`, or a placeholder when this setting's values are not shown.
    pub fn shown(&self, value: &str) -> String {
        if Self::SECRET.contains(&self.env) {
            format!("<{} bytes, not shown>", value.len())
        } else {
            value.to_string()
        }
    }
}

/// Why the configuration was rejected. Each names the flag and env var.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A required setting is absent.
    #[error("{flag} (or ${env}) is required: {hint}")]
    Missing {
        /// The flag.
        flag: &'static str,
        /// The env var.
        env: &'static str,
        /// What to set.
        hint: &'static str,
    },
    /// A setting has a malformed value.
    #[error("{setting} = {value:?} is invalid: {reason}")]
    Invalid {
        /// The flag, and its env var if it has one.
        setting: String,
        /// The rejected value.
        value: String,
        /// Why.
        reason: String,
    },
    /// No member name could be derived.
    #[error("no member name: set --name or $ETCD_NAME, or give etcd its --name after `--` (or set $ETCD_HOSTNAME / $HOSTNAME, which give etcd-<host>)")]
    NoName,
    /// Our member name and etcd's own `--name` differ.
    #[error("the member name is {ours:?} (--name or $ETCD_NAME) but the etcd arguments set --name {theirs:?}: the exec'd etcd would run as another member than the one the steps ran as; drop --name / $ETCD_NAME (etcd's own --name is then used) or make them the same")]
    NameConflict {
        /// `--name` / `$ETCD_NAME`.
        ours: String,
        /// `--name` after `--`.
        theirs: String,
    },
    /// The exec'd etcd would serve a different data dir than the migrated one.
    #[error("the etcd arguments set --data-dir {theirs:?} but the migrated data dir is {ours:?}; make them the same or drop --data-dir from the etcd arguments")]
    DataDirConflict {
        /// What the etcd arguments say.
        theirs: String,
        /// What `--data-dir` / `DATA_DIRECTORY` says.
        ours: PathBuf,
    },
    /// The exec'd etcd would take its data dir from a config file that
    /// names another one (or none).
    #[error("the etcd config file {file} (from {from}) {says}, and etcd ignores its command-line flags and ETCD_* variables when given a config file, so the exec'd etcd would serve {serves}, not the migrated data dir {}; set `data-dir: {}` in {file}", .ours.display(), .ours.display())]
    ConfigFileDataDir {
        /// The file.
        file: String,
        /// The flag or env var that names it.
        from: &'static str,
        /// "sets data-dir X", "sets no data-dir", "cannot be read (…)".
        says: String,
        /// What etcd would serve.
        serves: String,
        /// The migrated data dir.
        ours: PathBuf,
    },
    /// Incompatible mode flags.
    #[error("--dry-run and --no-exec cannot be combined")]
    Modes,
    /// Arguments after `--` in a mode that does not exec.
    #[error("etcd arguments after `--` are only used when etcd-migrate execs etcd; drop them or drop {mode}")]
    ArgsWithoutExec {
        /// The mode flag given.
        mode: &'static str,
    },
    /// The command line itself does not parse.
    #[error("{0}")]
    Cli(#[from] clap::Error),
}

/// The command line. Every option falls back to its env var, then to a
/// default, in [`resolve`]; clap only parses the flags.
#[derive(Debug, Parser)]
#[command(
    name = "etcd-migrate",
    version,
    about = "Walks an etcd data dir to TARGET_VERSION one minor at a time on real etcd, then execs etcd.",
    after_help = "Exit codes: 0 success; 2 bad configuration or precondition (nothing touched); \
3 a step failed (data as the last completed step left it, version.txt says which); \
1 other failure (e.g. exec); 128+n killed by signal n."
)]
struct Cli {
    /// Target etcd release, X.Y.Z [env: TARGET_VERSION]
    #[arg(long)]
    target_version: Option<String>,
    /// Target storage, etcd2|etcd3 [env: TARGET_STORAGE] [default: etcd3 for 3.x, etcd2 for 2.x]
    #[arg(long)]
    target_storage: Option<String>,
    /// The etcd data dir [env: DATA_DIRECTORY]
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Member name [env: ETCD_NAME] [default: etcd-$ETCD_HOSTNAME, else etcd-$HOSTNAME]
    #[arg(long)]
    name: Option<String>,
    /// Directory holding etcd-<v>, etcdctl-<v>, etcdutl-<v> [default: /usr/local/bin]
    #[arg(long)]
    bin_dir: Option<PathBuf>,
    /// Comma-separated releases to use [default: every etcd-<semver> in --bin-dir]
    #[arg(long)]
    bundled_versions: Option<String>,
    /// Loopback client port of intermediate etcds [default: 18629, 18631 if the data dir path contains "event"]
    #[arg(long)]
    port: Option<u16>,
    /// Peer port for the default peer URLs [default: 2380, 2381 if the data dir path contains "event"]
    #[arg(long)]
    peer_port: Option<u16>,
    /// [env: LISTEN_PEER_URLS] [default: http://localhost:<peer-port>]
    #[arg(long)]
    listen_peer_urls: Option<String>,
    /// [env: INITIAL_ADVERTISE_PEER_URLS] [default: http://localhost:<peer-port>]
    #[arg(long)]
    initial_advertise_peer_urls: Option<String>,
    /// [env: INITIAL_CLUSTER] [default: <name>=http://localhost:<peer-port>]
    #[arg(long)]
    initial_cluster: Option<String>,
    /// Client URLs of the exec'd etcd when its arguments set none [env: LISTEN_CLIENT_URLS]
    #[arg(long)]
    listen_client_urls: Option<String>,
    /// Kubernetes key prefix [env: ETCD_DATA_PREFIX] [default: /registry]
    #[arg(long)]
    etcd_data_prefix: Option<String>,
    /// Directory of TTL keys for the flat-lease mode [default: <prefix>/events]
    #[arg(long)]
    ttl_keys_directory: Option<String>,
    /// Extra flags for every intermediate etcd, whitespace-separated [env: ETCD_CREDS]
    #[arg(long, allow_hyphen_values = true)]
    etcd_server_extra_args: Option<String>,
    /// Seconds a step's etcd may take to accept its first write [default: 120]
    #[arg(long)]
    health_timeout: Option<u64>,
    /// Cluster token for restored and rebuilt data (rollbacks) [env: INITIAL_CLUSTER_TOKEN] [default: etcd-cluster]
    #[arg(long)]
    initial_cluster_token: Option<String>,
    /// When to back up the data dir: destructive (before the first storage migration or rollback), always (before any step), never [default: destructive]
    #[arg(long, value_enum)]
    backup: Option<BackupMode>,
    /// Where backups go [default: <data-dir>.backup]
    #[arg(long)]
    backup_dir: Option<PathBuf>,
    /// How many backups to keep [default: 3]
    #[arg(long)]
    backup_keep: Option<usize>,
    /// Restore the data dir from this etcd snapshot file (`etcdctl snapshot save`), once: give every member the same file [env: RESTORE_SNAPSHOT]
    #[arg(long)]
    restore_snapshot: Option<PathBuf>,
    /// The snapshot file's sha256, 64 hex digits (`sha256sum <file>`); required with --restore-snapshot [env: RESTORE_SNAPSHOT_SHA256]
    #[arg(long)]
    restore_snapshot_sha256: Option<String>,
    /// On one surviving member of a cluster that lost its quorum: start it once as a new one-member cluster with etcd's --force-new-cluster (refused while a quorum of the old cluster answers) [env: FORCE_NEW_CLUSTER=1]
    #[arg(long)]
    force_new_cluster: bool,
    /// Consent to a whole-cluster pause of writes where the target cannot roll member by member (etcd2 -> etcd3 storage, a rollback etcd has no online way for); needed on every member [env: ALLOW_CLUSTER_PAUSE=1]
    #[arg(long)]
    allow_cluster_pause: bool,
    /// Expiry of v2 TTL keys in v3: exact (a lease per remaining TTL) or flat (one 1 h lease for --ttl-keys-directory, as Kubernetes did) [default: exact]
    #[arg(long, value_enum)]
    ttl_leases: Option<TtlLeases>,
    /// Keep the v2 copies of migrated keys (etcd 3.6 refuses to start with them)
    #[arg(long)]
    keep_v2_keys: bool,
    /// Migrate, then exit 0 instead of exec'ing etcd
    #[arg(long)]
    no_exec: bool,
    /// Print the plan and change nothing
    #[arg(long)]
    dry_run: bool,
    /// Our log lines: text|json
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    /// Arguments for the exec'd etcd
    #[arg(last = true)]
    etcd_args: Vec<String>,
}

/// The log format asked for on the command line, read before (and even
/// if) the rest fails to parse, so configuration errors come out in it too.
pub fn log_format_hint<I: IntoIterator<Item = String>>(args: I) -> LogFormat {
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        if arg == "--" {
            break;
        }
        let value = match arg.strip_prefix("--log-format") {
            Some("") => args.next(),
            Some(rest) => rest.strip_prefix('=').map(str::to_string),
            None => None,
        };
        if let Some(format) =
            value.and_then(|v| <LogFormat as clap::ValueEnum>::from_str(&v, false).ok())
        {
            return format;
        }
    }
    LogFormat::default()
}

/// Parses the command line and resolves it against the process environment.
pub fn from_process() -> Result<Config, ConfigError> {
    resolve(std::env::args_os(), &|name| std::env::var(name).ok())
}

/// Parses `args` (program name first) and resolves every setting: the flag
/// if given, else the env var read through `env`, else the default.
pub fn resolve<I, T>(args: I, env: &dyn Fn(&str) -> Option<String>) -> Result<Config, ConfigError>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let mut cli = Cli::try_parse_from(args)?;
    let mut picker = Picker {
        env,
        overridden: Vec::new(),
    };
    let target = resolve_target(&mut cli, &mut picker)?;
    let data_dir = resolve_data_dir(&mut cli, &mut picker)?;
    let name = resolve_name(&mut cli, &mut picker)?;
    let (bin_dir, bundled_versions) = resolve_releases(&mut cli)?;
    let (member, peer_port) = resolve_member(&mut cli, &mut picker, name, &data_dir)?;
    let listen_client_urls = picker.pick(
        cli.listen_client_urls.take(),
        "--listen-client-urls",
        "LISTEN_CLIENT_URLS",
    );
    let data_prefix = picker
        .pick(
            cli.etcd_data_prefix.take(),
            "--etcd-data-prefix",
            "ETCD_DATA_PREFIX",
        )
        .unwrap_or_else(|| "/registry".to_string());
    let ttl_keys_directory = cli
        .ttl_keys_directory
        .take()
        .unwrap_or_else(|| format!("{data_prefix}/events"));
    let health_timeout = resolve_health_timeout(cli.health_timeout)?;
    let log_format = cli.log_format;
    let backup = resolve_backup(&mut cli, &data_dir)?;
    let env = |name: &str| picker.env(name);
    let config_file = EtcdConfigFile::find(&cli.etcd_args, &env);
    let data_elsewhere = find_data_elsewhere(
        &cli.etcd_args,
        config_file.as_ref(),
        &member.extra_args,
        &data_dir,
        &env,
    );
    let mode = resolve_mode(&mut cli, config_file.as_ref(), &data_dir, &env)?;
    let restore = resolve_restore(&mut cli, &mut picker)?;
    let force_new_cluster = cli.force_new_cluster
        || picker
            .env("FORCE_NEW_CLUSTER")
            .is_some_and(|v| matches!(v.trim(), "1" | "true" | "yes"));
    let allow_cluster_pause = cli.allow_cluster_pause
        || picker
            .env("ALLOW_CLUSTER_PAUSE")
            .is_some_and(|v| matches!(v.trim(), "1" | "true" | "yes"));
    Ok(Config {
        target,
        data_dir,
        member,
        bin_dir,
        bundled_versions,
        peer_port,
        listen_client_urls,
        data_prefix,
        ttl_keys_directory,
        health_timeout,
        backup,
        ttl_leases: cli.ttl_leases.unwrap_or_default(),
        keep_v2_keys: cli.keep_v2_keys,
        restore,
        force_new_cluster,
        allow_cluster_pause,
        mode,
        log_format,
        overridden: picker.overridden,
        data_elsewhere,
    })
}

/// Reads each setting as its flag, else its env var, and notes every flag
/// that shadows a different env var.
struct Picker<'e> {
    env: &'e dyn Fn(&str) -> Option<String>,
    overridden: Vec<Override>,
}

impl Picker<'_> {
    /// The env var `name`. An empty one counts as unset: manifests often
    /// template `VAR: ""`.
    fn env(&self, name: &str) -> Option<String> {
        (self.env)(name).filter(|value| !value.trim().is_empty())
    }

    /// The flag's value, else the env var's.
    fn pick(
        &mut self,
        flag_value: Option<String>,
        flag: &'static str,
        var: &'static str,
    ) -> Option<String> {
        match (flag_value, self.env(var)) {
            (Some(used), Some(ignored)) => {
                if used.trim() != ignored.trim() {
                    self.overridden.push(Override {
                        flag,
                        env: var,
                        used: used.clone(),
                        ignored,
                    });
                }
                Some(used)
            }
            (Some(used), None) => Some(used),
            (None, from_env) => from_env,
        }
    }
}

/// `--target-version` and `--target-storage` (default: the version's own).
fn resolve_target(cli: &mut Cli, picker: &mut Picker) -> Result<VersionPair, ConfigError> {
    let version_text = picker
        .pick(
            cli.target_version.take(),
            "--target-version",
            "TARGET_VERSION",
        )
        .ok_or(ConfigError::Missing {
            flag: "--target-version",
            env: "TARGET_VERSION",
            hint: "the etcd release to run, e.g. 3.5.16",
        })?;
    let version: Version =
        version_text
            .trim()
            .parse()
            .map_err(|err: ParseError| ConfigError::Invalid {
                setting: with_env("--target-version", "TARGET_VERSION"),
                value: version_text.clone(),
                reason: err.to_string(),
            })?;
    let storage = match picker.pick(
        cli.target_storage.take(),
        "--target-storage",
        "TARGET_STORAGE",
    ) {
        None => version.default_storage(),
        Some(text) => text
            .trim()
            .parse::<Storage>()
            .map_err(|err| ConfigError::Invalid {
                setting: with_env("--target-storage", "TARGET_STORAGE"),
                value: text.clone(),
                reason: err.to_string(),
            })?,
    };
    if storage == Storage::Etcd3 && version.major < 3 {
        return Err(ConfigError::Invalid {
            setting: with_env("--target-storage", "TARGET_STORAGE"),
            value: storage.to_string(),
            reason: format!("etcd {version} has no etcd3 storage; use etcd2 or a 3.x target"),
        });
    }
    Ok(VersionPair { version, storage })
}

/// `--bin-dir` (absolute, so that every message naming a binary names
/// where it was looked for, whatever the working dir) and
/// `--bundled-versions`.
fn resolve_releases(cli: &mut Cli) -> Result<(PathBuf, Option<Vec<Version>>), ConfigError> {
    let bin_dir = match cli.bin_dir.take() {
        Some(dir) => absolute_setting(&dir.to_string_lossy(), "--bin-dir".to_string())?,
        None => PathBuf::from(DEFAULT_BIN_DIR),
    };
    let bundled_versions = cli
        .bundled_versions
        .take()
        .map(|list| parse_version_list(&list))
        .transpose()?;
    Ok((bin_dir, bundled_versions))
}

/// `--data-dir`, as one absolute spelling.
/// `--data-dir` / `$DATA_DIRECTORY`, else the data dir etcd itself is
/// given: its `--data-dir` after `--`, else `$ETCD_DATA_DIR` (a kubeadm
/// manifest states it once, in etcd's own flags). When both are set and
/// differ, exec mode refuses the pair ([`check_data_dir_arg`]).
fn resolve_data_dir(cli: &mut Cli, picker: &mut Picker) -> Result<PathBuf, ConfigError> {
    let data_dir = picker
        .pick(
            cli.data_dir
                .take()
                .map(|dir| dir.to_string_lossy().into_owned()),
            "--data-dir",
            "DATA_DIRECTORY",
        )
        .or_else(|| data_dir_in_args(&cli.etcd_args))
        .or_else(|| picker.env("ETCD_DATA_DIR"))
        .ok_or(ConfigError::Missing {
            flag: "--data-dir",
            env: "DATA_DIRECTORY",
            hint: "the etcd data dir to migrate, e.g. /var/etcd/data (or give etcd its --data-dir after `--`, or set $ETCD_DATA_DIR)",
        })?;
    // One spelling from here on: `/var/etcd/data/`, `//var/etcd/data` and
    // `./data` run from `/var/etcd` are the same dir, and every path built
    // from it (the default backup dir, the scratch dir, etcd's --data-dir)
    // or compared with it must not depend on how the manifest wrote it.
    absolute_setting(&data_dir, with_env("--data-dir", "DATA_DIRECTORY"))
}

/// The member name: `--name` / `$ETCD_NAME`, else etcd's own `--name`
/// after `--` (a kubeadm manifest states it once, there), else
/// `etcd-$ETCD_HOSTNAME` / `etcd-$HOSTNAME` (the Kubernetes image's
/// default). `$ETCD_NAME` is etcd's own variable too, and etcd's flag
/// beats it: a `--name` after `--` that differs from ours would make the
/// exec'd etcd another member than the one the steps ran as, so the pair
/// is refused.
fn resolve_name(cli: &mut Cli, picker: &mut Picker) -> Result<String, ConfigError> {
    let ours = picker.pick(cli.name.take(), "--name", "ETCD_NAME");
    let etcds = flag_in_args(&cli.etcd_args, "name");
    match (ours, etcds) {
        (Some(ours), Some(theirs)) if ours != theirs => {
            Err(ConfigError::NameConflict { ours, theirs })
        }
        (Some(name), _) | (None, Some(name)) => Ok(name),
        (None, None) => picker
            .env("ETCD_HOSTNAME")
            .or_else(|| picker.env("HOSTNAME"))
            .map(|host| format!("etcd-{host}"))
            .ok_or(ConfigError::NoName),
    }
}

/// The member the steps run as, and the peer port its default URLs use.
fn resolve_member(
    cli: &mut Cli,
    picker: &mut Picker,
    name: String,
    data_dir: &Path,
) -> Result<(Member, u16), ConfigError> {
    // The Kubernetes image told etcd-events apart by its data dir path
    // (as given; here the absolute, normalised one, which names the same
    // dir however it was spelt).
    let events = data_dir.to_string_lossy().contains("event");
    let client_port = cli.port.unwrap_or(if events { 18631 } else { 18629 });
    let peer_port = cli.peer_port.unwrap_or(if events { 2381 } else { 2380 });
    // Port 0 binds "any free port": the step's etcd would listen where
    // nothing (our health check, the advertised peer URL) can find it.
    for (setting, port) in [("--port", client_port), ("--peer-port", peer_port)] {
        if port == 0 {
            return Err(ConfigError::Invalid {
                setting: setting.to_string(),
                value: "0".to_string(),
                reason:
                    "a step's etcd must listen on a known port; give a free port from 1 to 65535"
                        .to_string(),
            });
        }
    }
    let local_peer = format!("http://localhost:{peer_port}");
    let listen_peer_urls = picker
        .pick(
            cli.listen_peer_urls.take(),
            "--listen-peer-urls",
            "LISTEN_PEER_URLS",
        )
        .unwrap_or_else(|| local_peer.clone());
    let initial_advertise_peer_urls = picker
        .pick(
            cli.initial_advertise_peer_urls.take(),
            "--initial-advertise-peer-urls",
            "INITIAL_ADVERTISE_PEER_URLS",
        )
        .unwrap_or_else(|| local_peer.clone());
    let initial_cluster = picker
        .pick(
            cli.initial_cluster.take(),
            "--initial-cluster",
            "INITIAL_CLUSTER",
        )
        .unwrap_or_else(|| format!("{name}={local_peer}"));
    let extra_args: Vec<String> = picker
        .pick(
            cli.etcd_server_extra_args.take(),
            "--etcd-server-extra-args",
            "ETCD_CREDS",
        )
        .map(|text| text.split_whitespace().map(str::to_string).collect())
        .unwrap_or_default();
    let initial_cluster_token = picker
        .pick(
            cli.initial_cluster_token.take(),
            "--initial-cluster-token",
            "INITIAL_CLUSTER_TOKEN",
        )
        .unwrap_or_else(|| "etcd-cluster".to_string());
    let member = Member {
        name,
        client_port,
        listen_peer_urls,
        initial_advertise_peer_urls,
        initial_cluster,
        initial_cluster_token,
        extra_args,
    };
    Ok((member, peer_port))
}

/// `--health-timeout`, within [`HEALTH_TIMEOUT_RANGE`].
fn resolve_health_timeout(secs: Option<u64>) -> Result<Duration, ConfigError> {
    match secs {
        None => Ok(DEFAULT_HEALTH_TIMEOUT),
        Some(secs) if HEALTH_TIMEOUT_RANGE.contains(&secs) => Ok(Duration::from_secs(secs)),
        Some(secs) => Err(ConfigError::Invalid {
            setting: "--health-timeout".to_string(),
            value: secs.to_string(),
            reason: format!(
                "give from {} to {} seconds (24 h): a step needs time to start etcd, and a deadline past that is no deadline",
                HEALTH_TIMEOUT_RANGE.start(),
                HEALTH_TIMEOUT_RANGE.end()
            ),
        }),
    }
}

/// `--backup`, `--backup-dir` (default: beside the data dir) and
/// `--backup-keep`.
fn resolve_backup(cli: &mut Cli, data_dir: &Path) -> Result<BackupPolicy, ConfigError> {
    let mode = cli.backup.take().unwrap_or_default();
    let root = match cli.backup_dir.take() {
        Some(dir) => absolute_setting(&dir.to_string_lossy(), "--backup-dir".to_string())?,
        // Built from the normalised data dir: `/var/etcd/data/` + ".backup"
        // would have been `/var/etcd/data/.backup`, inside the data dir.
        None => {
            let mut root = data_dir.as_os_str().to_os_string();
            root.push(".backup");
            PathBuf::from(root)
        }
    };
    // A backup dir inside the data dir is refused where a backup is
    // planned (backup::check_before_run), with the resolved paths.
    let keep = cli.backup_keep.unwrap_or(3);
    if keep == 0 {
        return Err(ConfigError::Invalid {
            setting: "--backup-keep".to_string(),
            value: "0".to_string(),
            reason: "keep at least one backup, or pass --backup never".to_string(),
        });
    }
    Ok(BackupPolicy { mode, root, keep })
}

/// Exec (the default), `--no-exec` or `--dry-run`; in exec mode the exec'd
/// etcd must serve the migrated data dir.
fn resolve_mode(
    cli: &mut Cli,
    config_file: Option<&EtcdConfigFile>,
    data_dir: &Path,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Mode, ConfigError> {
    match (cli.dry_run, cli.no_exec) {
        (true, true) => Err(ConfigError::Modes),
        (true, false) if !cli.etcd_args.is_empty() => {
            Err(ConfigError::ArgsWithoutExec { mode: "--dry-run" })
        }
        (false, true) if !cli.etcd_args.is_empty() => {
            Err(ConfigError::ArgsWithoutExec { mode: "--no-exec" })
        }
        (true, false) => Ok(Mode::DryRun),
        (false, true) => Ok(Mode::NoExec),
        (false, false) => {
            check_data_dir_arg(&cli.etcd_args, data_dir, env)?;
            if let Some(file) = config_file {
                file.check_serves(data_dir)?;
            }
            Ok(Mode::Exec {
                etcd_args: std::mem::take(&mut cli.etcd_args),
            })
        }
    }
}

/// `value` as an absolute, normalised path ([`paths::absolute`]), or the
/// error naming `setting`.
fn absolute_setting(value: &str, setting: String) -> Result<PathBuf, ConfigError> {
    paths::absolute(Path::new(value)).map_err(|err| ConfigError::Invalid {
        setting,
        value: value.to_string(),
        reason: format!("cannot make it an absolute path: {err}"),
    })
}

/// "--flag (or $ENV)", how a setting with an env var is named in errors.
fn with_env(flag: &str, env: &str) -> String {
    format!("{flag} (or ${env})")
}

fn parse_version_list(list: &str) -> Result<Vec<Version>, ConfigError> {
    list.split(',')
        .map(str::trim)
        .filter(|item| !item.is_empty())
        .map(|item| {
            item.parse()
                .map_err(|err: ParseError| ConfigError::Invalid {
                    setting: "--bundled-versions".to_string(),
                    value: list.to_string(),
                    reason: err.to_string(),
                })
        })
        .collect()
}

/// The value of `--data-dir` in etcd arguments, if any (see
/// [`flag_in_args`]).
pub fn data_dir_in_args(args: &[String]) -> Option<String> {
    flag_in_args(args, "data-dir")
}

/// The value etcd takes for its flag `name` from `args`, as Go's flag
/// package reads them: `-name v`, `--name v`, `-name=v`, `--name=v`, the
/// last one winning.
pub fn flag_in_args(args: &[String], name: &str) -> Option<String> {
    let mut found = None;
    let mut iter = args.iter();
    while let Some(arg) = iter.next() {
        let Some(flag) = arg.strip_prefix("--").or_else(|| arg.strip_prefix('-')) else {
            continue;
        };
        if flag == name {
            found = iter.next().cloned();
        } else if let Some(value) = flag.strip_prefix(name).and_then(|v| v.strip_prefix('=')) {
            found = Some(value.to_string());
        }
    }
    found
}

/// The most of an etcd config file that is read: a real one is a few
/// KiB, and only its `data-dir` and `wal-dir` lines matter here.
const MAX_CONFIG_FILE_BYTES: u64 = 1 << 20;

/// The etcd config file the exec'd etcd (or, with `--no-exec`, the etcd
/// the manifest starts next in our environment) reads: `--config-file`
/// in its arguments, else `$ETCD_CONFIG_FILE`. Given one, etcd ignores
/// every other flag and `ETCD_*` variable (3.3 … 3.5, seen on real etcd),
/// so its `data-dir` and `wal-dir` say where the data is.
#[derive(Debug, Clone)]
struct EtcdConfigFile {
    /// The path, as given.
    file: String,
    /// Where it was named.
    from: &'static str,
    /// Its `data-dir` and `wal-dir` values, or why it could not be read.
    read: Result<(Option<String>, Option<String>), String>,
}

impl EtcdConfigFile {
    /// The config file `args` or the environment name, read.
    fn find(args: &[String], env: &dyn Fn(&str) -> Option<String>) -> Option<Self> {
        let (file, from) = match flag_in_args(args, "config-file") {
            Some(file) => (file, "--config-file in the etcd arguments"),
            None => (env("ETCD_CONFIG_FILE")?, "$ETCD_CONFIG_FILE"),
        };
        let read = read_config_file(Path::new(&file));
        Some(EtcdConfigFile { file, from, read })
    }

    /// Exec mode: the exec'd etcd must serve the migrated data dir, and
    /// with a config file only the file can say so.
    fn check_serves(&self, ours: &Path) -> Result<(), ConfigError> {
        let (says, serves) = match &self.read {
            Ok((Some(theirs), _)) if paths::same(Path::new(theirs), ours) => return Ok(()),
            Ok((Some(theirs), _)) => (format!("sets data-dir {theirs:?}"), format!("{theirs:?}")),
            Ok((None, _)) => (
                "sets no data-dir".to_string(),
                "etcd's default, <name>.etcd in its working dir".to_string(),
            ),
            Err(reason) => (
                format!("cannot be read by etcd-migrate ({reason})"),
                "whatever data-dir it sets".to_string(),
            ),
        };
        Err(ConfigError::ConfigFileDataDir {
            file: self.file.clone(),
            from: self.from,
            says,
            serves,
            ours: ours.to_path_buf(),
        })
    }
}

/// The `data-dir` and `wal-dir` an etcd config file sets. A plain line
/// scan for those two top-level keys, not a YAML parser: etcd's config
/// file is a flat map and its sample (etcd.conf.yml.sample) writes one
/// `key: value` per line. Flow style (`{data-dir: x}`) or a multi-line
/// scalar would go unseen; in exec mode a data-dir unseen is refused (the
/// file "sets no data-dir"), so only an unseen wal-dir could slip by.
fn read_config_file(path: &Path) -> Result<(Option<String>, Option<String>), String> {
    let file = File::open(path).map_err(|err| err.to_string())?;
    let mut bytes = Vec::new();
    file.take(MAX_CONFIG_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|err| err.to_string())?;
    if bytes.len() as u64 > MAX_CONFIG_FILE_BYTES {
        return Err(format!(
            "larger than {MAX_CONFIG_FILE_BYTES} bytes, which no etcd config file is"
        ));
    }
    let text = String::from_utf8_lossy(&bytes);
    let (mut data_dir, mut wal_dir) = (None, None);
    for line in text.lines() {
        // Indented lines belong to a nested map, not to etcd's top level.
        if line.starts_with(char::is_whitespace) {
            continue;
        }
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        let slot = match key.trim().trim_matches(['"', '\'']) {
            "data-dir" => &mut data_dir,
            "wal-dir" => &mut wal_dir,
            _ => continue,
        };
        // A repeated key: the last one is what etcd's YAML reader keeps.
        *slot = yaml_scalar(value);
    }
    Ok((data_dir, wal_dir))
}

/// A one-line YAML scalar: quoted, or plain up to a ` #` comment; empty,
/// `~` and `null` are no value (etcd then uses its default).
fn yaml_scalar(raw: &str) -> Option<String> {
    let raw = raw.trim();
    let value = if let Some(rest) = raw.strip_prefix('"') {
        rest.split('"').next().unwrap_or_default()
    } else if let Some(rest) = raw.strip_prefix('\'') {
        rest.split('\'').next().unwrap_or_default()
    } else {
        raw.split(" #").next().unwrap_or_default().trim()
    };
    match value {
        "" | "~" | "null" => None,
        value => Some(value.to_string()),
    }
}

/// Every etcd setting that puts data where the steps will not look (see
/// [`DataElsewhere`]): for the etcd that serves this data dir outside the
/// steps (exec'd, or started next by the manifest), a `--wal-dir` or
/// `$ETCD_WAL_DIR`, or a config file's `wal-dir` / other `data-dir`; for
/// the step etcds themselves, `--config-file`, `--wal-dir` or another
/// `--data-dir` in `$ETCD_CREDS`, which they get after their own flags.
/// A WAL dir that is `<data>/member/wal`, etcd's default, is no WAL
/// elsewhere.
fn find_data_elsewhere(
    etcd_args: &[String],
    config_file: Option<&EtcdConfigFile>,
    extra_args: &[String],
    data_dir: &Path,
    env: &dyn Fn(&str) -> Option<String>,
) -> Vec<DataElsewhere> {
    let mut found = Elsewhere {
        data_dir,
        found: Vec::new(),
    };
    match config_file {
        Some(EtcdConfigFile {
            file,
            from,
            read: Ok((file_data_dir, file_wal_dir)),
        }) => {
            let setting = |key: &str| format!("{key} in the etcd config file {file} (from {from})");
            if let Some(theirs) = file_data_dir {
                found.other_data_dir(setting("data-dir"), theirs.clone());
            }
            if let Some(wal) = file_wal_dir {
                found.wal_dir(setting("wal-dir"), wal.clone());
            }
        }
        Some(EtcdConfigFile {
            file,
            from,
            read: Err(reason),
        }) => found.found.push(DataElsewhere::UnreadableConfigFile {
            file: file.clone(),
            from,
            reason: reason.clone(),
        }),
        None => {
            if let Some(wal) = flag_in_args(etcd_args, "wal-dir") {
                found.wal_dir("--wal-dir in the etcd arguments".into(), wal);
            } else if let Some(wal) = env("ETCD_WAL_DIR") {
                found.wal_dir("$ETCD_WAL_DIR".into(), wal);
            }
        }
    }
    let in_creds = |flag: &str| format!("{flag} in --etcd-server-extra-args ($ETCD_CREDS)");
    if flag_in_args(extra_args, "config-file").is_some() {
        found.found.push(DataElsewhere::ConfigFileForSteps);
    }
    if let Some(wal) = flag_in_args(extra_args, "wal-dir") {
        found.wal_dir(in_creds("--wal-dir"), wal);
    }
    if let Some(theirs) = flag_in_args(extra_args, "data-dir") {
        found.other_data_dir(in_creds("--data-dir"), theirs);
    }
    found.found
}

/// The settings found so far that put data outside `data_dir`.
struct Elsewhere<'a> {
    data_dir: &'a Path,
    found: Vec<DataElsewhere>,
}

impl Elsewhere<'_> {
    /// A WAL dir set by `setting`, unless it is etcd's default place.
    fn wal_dir(&mut self, setting: String, value: String) {
        let wal = Path::new(&value);
        // Empty is etcd's default (`--wal-dir=` sets nothing).
        if !value.is_empty() && !paths::same(wal, &self.data_dir.join("member/wal")) {
            self.found.push(DataElsewhere::WalDir {
                setting,
                wal_dir: paths::absolute(wal).unwrap_or_else(|_| wal.to_path_buf()),
                data_dir: self.data_dir.to_path_buf(),
            });
        }
    }

    /// A data dir set by `setting`, unless it is ours.
    fn other_data_dir(&mut self, setting: String, theirs: String) {
        if !theirs.is_empty() && !paths::same(Path::new(&theirs), self.data_dir) {
            self.found.push(DataElsewhere::DataDir {
                setting,
                theirs,
                data_dir: self.data_dir.to_path_buf(),
            });
        }
    }
}

/// The exec'd etcd must serve the dir that was migrated: refuse arguments
/// (or an `ETCD_DATA_DIR` that etcd itself would read) naming another.
/// Compared as paths: `/var/etcd/data/` in the arguments and
/// `/var/etcd/data` in `DATA_DIRECTORY` are one dir, and so are a symlink
/// and its target ([`paths::same`]; the exec'd etcd runs in our working
/// dir, so a relative one is taken from there too).
fn check_data_dir_arg(
    args: &[String],
    data_dir: &Path,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<(), ConfigError> {
    let theirs = data_dir_in_args(args).or_else(|| env("ETCD_DATA_DIR"));
    match theirs {
        Some(theirs) if !paths::same(Path::new(&theirs), data_dir) => {
            Err(ConfigError::DataDirConflict {
                theirs,
                ours: data_dir.to_path_buf(),
            })
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn resolve_with(args: &[&str], env: &[(&str, &str)]) -> Result<Config, ConfigError> {
        let env: HashMap<String, String> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let argv = std::iter::once("etcd-migrate").chain(args.iter().copied());
        resolve(argv, &move |name| env.get(name).cloned())
    }

    const MINIMAL: [(&str, &str); 3] = [
        ("TARGET_VERSION", "3.5.16"),
        ("DATA_DIRECTORY", "/var/etcd/data"),
        ("HOSTNAME", "m1"),
    ];

    #[test]
    fn defaults_match_the_kubernetes_image() {
        let config = resolve_with(&[], &MINIMAL).expect("resolves");
        assert_eq!(config.target.to_string(), "3.5.16/etcd3");
        assert_eq!(config.member.name, "etcd-m1");
        assert_eq!(config.member.client_port, 18629);
        assert_eq!(config.peer_port, 2380);
        assert_eq!(config.member.listen_peer_urls, "http://localhost:2380");
        assert_eq!(
            config.member.initial_advertise_peer_urls,
            "http://localhost:2380"
        );
        assert_eq!(
            config.member.initial_cluster,
            "etcd-m1=http://localhost:2380"
        );
        assert_eq!(config.data_prefix, "/registry");
        assert_eq!(config.ttl_keys_directory, "/registry/events");
        assert_eq!(config.bin_dir, PathBuf::from("/usr/local/bin"));
        assert_eq!(config.health_timeout, DEFAULT_HEALTH_TIMEOUT);
        assert_eq!(config.mode, Mode::Exec { etcd_args: vec![] });
        assert!(config.member.extra_args.is_empty());
        assert_eq!(config.member.initial_cluster_token, "etcd-cluster");
        assert_eq!(config.backup.mode, BackupMode::Destructive);
        assert_eq!(config.backup.root, PathBuf::from("/var/etcd/data.backup"));
        assert_eq!(config.backup.keep, 3);
        assert_eq!(config.ttl_leases, TtlLeases::Exact);
        assert!(!config.keep_v2_keys);
    }

    #[test]
    fn the_data_dir_is_one_absolute_spelling_however_it_was_written() {
        let cwd = std::env::current_dir().expect("cwd");
        for (given, expected) in [
            ("/var/etcd/data/", PathBuf::from("/var/etcd/data")),
            ("//var//etcd/data", PathBuf::from("/var/etcd/data")),
            ("/var/./etcd/data/.", PathBuf::from("/var/etcd/data")),
            ("./rel/path", cwd.join("rel/path")),
        ] {
            let env = [
                ("TARGET_VERSION", "3.5.16"),
                ("DATA_DIRECTORY", given),
                ("HOSTNAME", "m1"),
            ];
            let config = resolve_with(&[], &env).expect(given);
            assert_eq!(config.data_dir, expected, "{given}");
            let mut backup = expected.into_os_string();
            backup.push(".backup");
            assert_eq!(
                config.backup.root,
                PathBuf::from(backup),
                "the default backup dir sits beside the data dir, not in it ({given})"
            );
        }
    }

    #[test]
    fn a_relative_bin_dir_is_made_absolute_for_the_messages_that_name_it() {
        let cwd = std::env::current_dir().expect("cwd");
        let config =
            resolve_with(&["--bin-dir", "./.cache/etcd/bin/"], &MINIMAL).expect("resolves");
        assert_eq!(config.bin_dir, cwd.join(".cache/etcd/bin"));
        let config = resolve_with(&[], &MINIMAL).expect("resolves");
        assert_eq!(config.bin_dir, PathBuf::from(DEFAULT_BIN_DIR));
    }

    #[test]
    fn etcd_args_naming_the_data_dir_differently_are_no_conflict() {
        let env = [
            ("TARGET_VERSION", "3.5.16"),
            ("DATA_DIRECTORY", "/var/etcd/data/"),
            ("HOSTNAME", "m1"),
        ];
        for args in [
            &["--", "--data-dir", "/var/etcd/data"][..],
            &["--", "--data-dir=//var/etcd/./data/"],
            &["--", "-data-dir", "/var/etcd/data/member/.."],
        ] {
            resolve_with(args, &env).unwrap_or_else(|err| panic!("{args:?}: {err}"));
        }
        let with_env_var: Vec<(&str, &str)> = env
            .iter()
            .copied()
            .chain([("ETCD_DATA_DIR", "/var/etcd//data")])
            .collect();
        resolve_with(&[], &with_env_var).expect("ETCD_DATA_DIR names the same dir");
        let err = resolve_with(&["--", "--data-dir=/var/etcd/data2"], &env)
            .expect_err("another dir")
            .to_string();
        assert!(
            err.contains("--data-dir \"/var/etcd/data2\"") && err.contains("\"/var/etcd/data\""),
            "{err}"
        );
    }

    #[test]
    fn events_data_dir_gets_the_events_ports() {
        let config = resolve_with(
            &[],
            &[
                ("TARGET_VERSION", "3.5.16"),
                ("DATA_DIRECTORY", "/var/etcd/data-events"),
                ("ETCD_NAME", "e"),
            ],
        )
        .expect("resolves");
        assert_eq!((config.member.client_port, config.peer_port), (18631, 2381));
        assert_eq!(config.member.initial_cluster, "e=http://localhost:2381");
    }

    #[test]
    fn flag_beats_env_beats_default() {
        let env = [
            ("TARGET_VERSION", "3.4.23"),
            ("TARGET_STORAGE", "etcd2"),
            ("DATA_DIRECTORY", "/env/dir"),
            ("ETCD_NAME", "from-env"),
            ("ETCD_HOSTNAME", "host-a"),
            ("HOSTNAME", "host-b"),
            ("INITIAL_CLUSTER", "from-env=http://10.0.0.1:2380"),
            ("LISTEN_PEER_URLS", "http://10.0.0.1:2380"),
            ("ETCD_CREDS", "--peer-client-cert-auth  --peer-cert-file=/c"),
            ("ETCD_DATA_PREFIX", "/prefix"),
        ];
        let config = resolve_with(&[], &env).expect("resolves");
        assert_eq!(config.target.to_string(), "3.4.23/etcd2");
        assert_eq!(config.data_dir, PathBuf::from("/env/dir"));
        assert_eq!(config.member.name, "from-env");
        assert_eq!(
            config.member.initial_cluster,
            "from-env=http://10.0.0.1:2380"
        );
        assert_eq!(config.member.listen_peer_urls, "http://10.0.0.1:2380");
        assert_eq!(
            config.member.initial_advertise_peer_urls,
            "http://localhost:2380"
        );
        assert_eq!(
            config.member.extra_args,
            ["--peer-client-cert-auth", "--peer-cert-file=/c"]
        );
        assert_eq!(config.ttl_keys_directory, "/prefix/events");

        let flags = [
            "--target-version",
            "3.5.1",
            "--target-storage",
            "etcd3",
            "--data-dir",
            "/flag/dir",
            "--name",
            "from-flag",
            "--initial-cluster",
            "from-flag=http://127.0.0.1:2380",
            "--etcd-server-extra-args",
            "--a --b",
            "--etcd-data-prefix",
            "/p2",
            "--ttl-keys-directory",
            "/p2/ttl",
            "--port",
            "1234",
            "--peer-port",
            "4321",
        ];
        let config = resolve_with(&flags, &env).expect("resolves");
        assert_eq!(config.target.to_string(), "3.5.1/etcd3");
        assert_eq!(config.data_dir, PathBuf::from("/flag/dir"));
        assert_eq!(config.member.name, "from-flag");
        assert_eq!(
            config.member.initial_cluster,
            "from-flag=http://127.0.0.1:2380"
        );
        assert_eq!(config.member.extra_args, ["--a", "--b"]);
        assert_eq!(config.data_prefix, "/p2");
        assert_eq!(config.ttl_keys_directory, "/p2/ttl");
        assert_eq!((config.member.client_port, config.peer_port), (1234, 4321));
        assert_eq!(
            config.member.initial_advertise_peer_urls,
            "http://localhost:4321"
        );
    }

    #[test]
    fn a_flag_that_shadows_a_different_env_var_is_noted() {
        let env = [
            ("TARGET_VERSION", "3.4.23"),
            ("DATA_DIRECTORY", "/var/etcd/data"),
            ("HOSTNAME", "m1"),
            ("ETCD_NAME", "same"),
            ("ETCD_CREDS", "--secret-ish"),
        ];
        let config = resolve_with(
            &[
                "--target-version",
                "3.5.16",
                "--name",
                "same",
                "--etcd-server-extra-args",
                "--other",
            ],
            &env,
        )
        .expect("resolves");
        assert_eq!(config.target.to_string(), "3.5.16/etcd3", "the flag wins");
        let noted: Vec<(&str, &str, &str, &str)> = config
            .overridden
            .iter()
            .map(|o| (o.flag, o.env, o.used.as_str(), o.ignored.as_str()))
            .collect();
        assert_eq!(
            noted,
            [
                ("--target-version", "TARGET_VERSION", "3.5.16", "3.4.23"),
                (
                    "--etcd-server-extra-args",
                    "ETCD_CREDS",
                    "--other",
                    "--secret-ish"
                ),
            ],
            "equal values are no conflict"
        );
        assert_eq!(
            config.overridden[1].shown("--secret-ish"),
            "<12 bytes, not shown>"
        );
        assert_eq!(config.overridden[0].shown("3.4.23"), "3.4.23");
        assert!(resolve_with(&[], &env)
            .expect("resolves")
            .overridden
            .is_empty());
    }

    #[test]
    fn the_member_under_the_name_its_data_records_names_only_itself() {
        let config = resolve_with(&["--initial-cluster", "m1=http://10.0.0.1:2380"], &MINIMAL)
            .expect("resolves");
        assert_eq!(config.member.named("etcd-m1"), config.member);
        let renamed = config.member.named("old");
        assert_eq!(renamed.name, "old");
        assert_eq!(renamed.initial_cluster, "old=http://localhost:2380");
        assert_eq!(
            Member {
                name: config.member.name.clone(),
                initial_cluster: config.member.initial_cluster.clone(),
                ..renamed
            },
            config.member,
            "nothing else changes"
        );
    }

    #[test]
    fn ttl_leases_takes_exact_or_flat() {
        let with = |value: &str| resolve_with(&["--ttl-leases", value], &MINIMAL);
        assert_eq!(with("flat").expect("flat").ttl_leases, TtlLeases::Flat);
        assert_eq!(with("exact").expect("exact").ttl_leases, TtlLeases::Exact);
        let err = with("hourly").expect_err("hourly").to_string();
        assert!(
            err.contains("--ttl-leases") && err.contains("exact, flat"),
            "{err}"
        );
    }

    #[test]
    fn name_falls_back_to_etcd_hostname_then_hostname() {
        let base = [("TARGET_VERSION", "3.5.16"), ("DATA_DIRECTORY", "/d")];
        let with = |extra: &[(&str, &str)]| {
            let env: Vec<(&str, &str)> = base.iter().chain(extra).copied().collect();
            resolve_with(&[], &env).map(|c| c.member.name)
        };
        assert_eq!(
            with(&[("ETCD_HOSTNAME", "a"), ("HOSTNAME", "b")]).expect("name"),
            "etcd-a"
        );
        assert_eq!(with(&[("HOSTNAME", "b")]).expect("name"), "etcd-b");
        assert_eq!(
            with(&[("ETCD_NAME", ""), ("HOSTNAME", "b")]).expect("name"),
            "etcd-b"
        );
        assert!(matches!(with(&[]), Err(ConfigError::NoName)));
    }

    /// kubeadm's etcd command states the name and data dir once, in
    /// etcd's own flags (issue 20.3): with ours unset they are taken from
    /// there; a different value on either side is refused.
    #[test]
    fn name_and_data_dir_come_from_etcds_own_flags_when_ours_are_unset() {
        let target = [("TARGET_VERSION", "3.5.16"), ("HOSTNAME", "h")];
        let kubeadm = ["--", "--data-dir=/var/lib/etcd", "--name", "etcd-a"];
        let config = resolve_with(&kubeadm, &target).expect("resolves from etcd's flags");
        assert_eq!(config.member.name, "etcd-a");
        assert_eq!(config.data_dir, PathBuf::from("/var/lib/etcd"));
        assert_eq!(
            config.member.initial_cluster,
            "etcd-a=http://localhost:2380"
        );

        // $ETCD_DATA_DIR, etcd's own variable, names it too.
        let env = [
            ("TARGET_VERSION", "3.5.16"),
            ("ETCD_DATA_DIR", "/e"),
            ("ETCD_NAME", "n"),
        ];
        let config = resolve_with(&[], &env).expect("resolves from etcd's env");
        assert_eq!(config.data_dir, PathBuf::from("/e"));
        assert_eq!(config.member.name, "n");

        // The same value on both sides is no conflict.
        let same = ["--name=etcd-a", "--data-dir", "/var/lib/etcd/", "--"];
        let both: Vec<&str> = same.iter().chain(&kubeadm[1..]).copied().collect();
        assert_eq!(
            resolve_with(&both, &target).expect("same").member.name,
            "etcd-a"
        );

        let other_name = ["--name=etcd-b", "--", "--data-dir=/d", "--name=etcd-a"];
        let err = resolve_with(&other_name, &target).expect_err("two names");
        assert!(
            matches!(&err, ConfigError::NameConflict { ours, theirs } if ours == "etcd-b" && theirs == "etcd-a"),
            "{err}"
        );
        let env_name = [("ETCD_NAME", "etcd-b"), target[0]];
        let err = resolve_with(&kubeadm, &env_name).expect_err("$ETCD_NAME and --name");
        assert!(err.to_string().contains("\"etcd-b\""), "{err}");

        let other_dir = ["--data-dir=/other", "--", "--data-dir=/var/lib/etcd"];
        let err = resolve_with(&other_dir, &target).expect_err("two data dirs");
        assert!(matches!(err, ConfigError::DataDirConflict { .. }), "{err}");

        let neither = resolve_with(&["--", "--name=a"], &target).expect_err("no data dir");
        assert!(neither.to_string().contains("$ETCD_DATA_DIR"), "{neither}");
    }

    #[test]
    fn default_storage_follows_the_major_version() {
        let config = resolve_with(
            &[],
            &[
                ("TARGET_VERSION", "2.2.1"),
                ("DATA_DIRECTORY", "/d"),
                ("HOSTNAME", "h"),
            ],
        )
        .expect("resolves");
        assert_eq!(config.target.to_string(), "2.2.1/etcd2");
    }

    #[test]
    fn bad_input_names_the_flag_and_env_var() {
        type Case<'a> = (Vec<(&'a str, &'a str)>, &'a [&'a str], &'a str);
        let cases: Vec<Case> = vec![
            (
                vec![("DATA_DIRECTORY", "/d"), ("HOSTNAME", "h")],
                &[],
                "--target-version (or $TARGET_VERSION) is required",
            ),
            (
                vec![
                    ("TARGET_VERSION", "3.5"),
                    ("DATA_DIRECTORY", "/d"),
                    ("HOSTNAME", "h"),
                ],
                &[],
                "--target-version (or $TARGET_VERSION) = \"3.5\" is invalid",
            ),
            (
                vec![("TARGET_VERSION", "3.5.16"), ("HOSTNAME", "h")],
                &[],
                "--data-dir (or $DATA_DIRECTORY) is required",
            ),
            (
                MINIMAL.to_vec(),
                &["--target-storage", "etcd4"],
                "--target-storage (or $TARGET_STORAGE) = \"etcd4\" is invalid",
            ),
            (
                vec![
                    ("TARGET_VERSION", "2.2.1"),
                    ("TARGET_STORAGE", "etcd3"),
                    ("DATA_DIRECTORY", "/d"),
                    ("HOSTNAME", "h"),
                ],
                &[],
                "etcd 2.2.1 has no etcd3 storage",
            ),
            (
                MINIMAL.to_vec(),
                &["--bundled-versions", "3.4.23,3.5"],
                "--bundled-versions",
            ),
            (MINIMAL.to_vec(), &["--log-format", "xml"], "--log-format"),
            (
                MINIMAL.to_vec(),
                &["--dry-run", "--no-exec"],
                "cannot be combined",
            ),
            (
                MINIMAL.to_vec(),
                &["--no-exec", "--", "--name", "x"],
                "only used when etcd-migrate execs etcd",
            ),
            (
                MINIMAL.to_vec(),
                &["--", "--data-dir=/elsewhere"],
                "the etcd arguments set --data-dir \"/elsewhere\"",
            ),
            (
                MINIMAL.to_vec(),
                &["--health-timeout", "0"],
                "--health-timeout = \"0\" is invalid: give from 1 to 86400 seconds",
            ),
            (
                MINIMAL.to_vec(),
                &["--health-timeout", "18446744073709551615"],
                "--health-timeout = \"18446744073709551615\" is invalid: give from 1 to 86400 seconds (24 h)",
            ),
            (
                MINIMAL.to_vec(),
                &["--health-timeout", "86401"],
                "--health-timeout = \"86401\" is invalid",
            ),
            (
                MINIMAL.to_vec(),
                &["--port", "0"],
                "--port = \"0\" is invalid: a step's etcd must listen on a known port",
            ),
            (
                MINIMAL.to_vec(),
                &["--peer-port", "0"],
                "--peer-port = \"0\" is invalid",
            ),
        ];
        for (env, args, expected) in cases {
            let err = resolve_with(args, &env).expect_err(expected);
            assert!(
                err.to_string().contains(expected),
                "{err} should contain {expected}"
            );
        }
    }

    #[test]
    fn etcd_args_after_double_dash_are_kept_verbatim() {
        let config = resolve_with(
            &[
                "--",
                "--listen-client-urls",
                "http://127.0.0.1:2379",
                "--data-dir",
                "/var/etcd/data",
            ],
            &MINIMAL,
        )
        .expect("resolves");
        assert_eq!(
            config.mode,
            Mode::Exec {
                etcd_args: vec![
                    "--listen-client-urls".into(),
                    "http://127.0.0.1:2379".into(),
                    "--data-dir".into(),
                    "/var/etcd/data".into()
                ]
            }
        );
    }

    #[test]
    fn log_format_is_found_before_the_full_parse() {
        let hint = |list: &[&str]| log_format_hint(list.iter().map(|s| s.to_string()));
        assert_eq!(
            hint(&["etcd-migrate", "--log-format", "json", "--bogus"]),
            LogFormat::Json
        );
        assert_eq!(
            hint(&["etcd-migrate", "--log-format=json"]),
            LogFormat::Json
        );
        assert_eq!(
            hint(&["etcd-migrate", "--", "--log-format=json"]),
            LogFormat::Text
        );
        assert_eq!(hint(&["etcd-migrate"]), LogFormat::Text);
    }

    #[test]
    fn finds_an_etcd_flag_in_every_go_spelling_the_last_one_winning() {
        let args = |list: &[&str]| list.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        for spelling in [
            &["--wal-dir=/w"][..],
            &["--wal-dir", "/w"],
            &["-wal-dir=/w"],
            &["-wal-dir", "/w"],
            &["--wal-dir=/first", "--name", "x", "-wal-dir", "/w"],
        ] {
            assert_eq!(
                flag_in_args(&args(spelling), "wal-dir"),
                Some("/w".into()),
                "{spelling:?}"
            );
        }
        assert_eq!(flag_in_args(&args(&["--wal-dirx=/w"]), "wal-dir"), None);
        assert_eq!(flag_in_args(&args(&["wal-dir=/w"]), "wal-dir"), None);
        assert_eq!(flag_in_args(&args(&["--wal-dir"]), "wal-dir"), None);
    }

    /// The settings that locate data, for a data dir at /var/etcd/data.
    fn elsewhere(args: &[&str], env: &[(&str, &str)]) -> Result<Vec<String>, ConfigError> {
        let mut all: Vec<(&str, &str)> = vec![
            ("TARGET_VERSION", "3.5.16"),
            ("DATA_DIRECTORY", "/var/etcd/data"),
            ("HOSTNAME", "m1"),
        ];
        all.extend_from_slice(env);
        let config = resolve_with(args, &all)?;
        Ok(config
            .data_elsewhere
            .iter()
            .map(ToString::to_string)
            .collect())
    }

    #[test]
    fn a_wal_dir_outside_the_data_dir_is_found_wherever_it_is_set() {
        for (args, env, setting) in [
            (
                &["--", "--wal-dir=/w"][..],
                &[][..],
                "--wal-dir in the etcd arguments",
            ),
            (
                &["--", "-wal-dir", "/w"],
                &[],
                "--wal-dir in the etcd arguments",
            ),
            (&["--no-exec"], &[("ETCD_WAL_DIR", "/w")], "$ETCD_WAL_DIR"),
            (
                &["--etcd-server-extra-args", "--peer-auto-tls --wal-dir=/w"],
                &[],
                "--wal-dir in --etcd-server-extra-args ($ETCD_CREDS)",
            ),
        ] {
            let found = elsewhere(args, env).expect("resolves");
            assert_eq!(found.len(), 1, "{args:?} {env:?}: {found:?}");
            for part in [
                &format!("{setting} keeps the WAL in /w, outside the data dir /var/etcd/data")[..],
                "mv /w /var/etcd/data/member/wal",
                &format!("remove {setting}"),
            ] {
                assert!(found[0].contains(part), "{found:?} lacks {part}");
            }
        }
        // etcd's own default place, however spelt, is no WAL elsewhere.
        for args in [
            &["--", "--wal-dir", "/var/etcd/data/member/wal/"][..],
            &["--", "--wal-dir="],
            &["--", "--data-dir", "/var/etcd//data", "--name", "m1"],
        ] {
            assert_eq!(
                elsewhere(args, &[]).expect("resolves"),
                Vec::<String>::new(),
                "{args:?}"
            );
        }
        let found = elsewhere(
            &[
                "--etcd-server-extra-args",
                "--config-file /c --data-dir=/other",
            ],
            &[],
        )
        .expect("resolves");
        assert!(
            found.len() == 2
                && found[0].contains("--config-file in --etcd-server-extra-args")
                && found[1].contains("--data-dir in --etcd-server-extra-args ($ETCD_CREDS) names the data dir \"/other\""),
            "{found:?}"
        );
    }

    #[test]
    fn a_config_file_says_where_the_data_is_for_the_exec_and_the_steps() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let file = tmp.path().join("etcd.yml");
        let shown = file.display().to_string();
        let write = |text: &str| std::fs::write(&file, text).expect("write");

        write("# data-dir: /nope\nname: m1\ndata-dir: '/var/etcd/data/' # ours\nwal-dir: \"/w\"\nclient-transport-security:\n  wal-dir: /nested\n");
        assert_eq!(
            read_config_file(&file).expect("reads"),
            (Some("/var/etcd/data/".into()), Some("/w".into()))
        );
        // Exec mode: the file names our data dir, so the exec is fine;
        // its wal-dir is refused only if steps are needed.
        let found = elsewhere(&["--", "--config-file", &shown], &[]).expect("resolves");
        assert!(
            found.len() == 1
                && found[0].contains(&format!("wal-dir in the etcd config file {shown} (from --config-file in the etcd arguments) keeps the WAL in /w")),
            "{found:?}"
        );
        // Given a config file, etcd ignores --wal-dir and $ETCD_WAL_DIR.
        write("data-dir: /var/etcd/data\nwal-dir: ~\n");
        let found = elsewhere(
            &["--no-exec"],
            &[("ETCD_CONFIG_FILE", &shown), ("ETCD_WAL_DIR", "/w")],
        )
        .expect("resolves");
        assert!(found.is_empty(), "{found:?}");

        // --no-exec: another data-dir in $ETCD_CONFIG_FILE is refused
        // with steps only.
        write("data-dir: /elsewhere\n");
        let found = elsewhere(&["--no-exec"], &[("ETCD_CONFIG_FILE", &shown)]).expect("resolves");
        assert!(
            found.len() == 1 && found[0].contains("names the data dir \"/elsewhere\""),
            "{found:?}"
        );
        // Exec mode: the exec'd etcd would serve another dir, or none.
        for (text, says) in [
            ("data-dir: /elsewhere\n", "sets data-dir \"/elsewhere\""),
            ("name: m1\n", "sets no data-dir"),
        ] {
            write(text);
            let err = elsewhere(&["--", "--config-file", &shown], &[])
                .expect_err(text)
                .to_string();
            for part in [
                &format!("the etcd config file {shown} (from --config-file in the etcd arguments) {says}")[..],
                "etcd ignores its command-line flags",
                &format!("set `data-dir: /var/etcd/data` in {shown}"),
            ] {
                assert!(err.contains(part), "{err} lacks {part}");
            }
        }
        std::fs::remove_file(&file).expect("rm");
        let found = elsewhere(&["--no-exec"], &[("ETCD_CONFIG_FILE", &shown)]).expect("resolves");
        assert!(
            found.len() == 1
                && found[0].contains(&format!(
                    "the etcd config file {shown} (from $ETCD_CONFIG_FILE) cannot be read"
                )),
            "{found:?}"
        );
    }

    #[test]
    fn finds_data_dir_in_both_go_flag_spellings() {
        let args = |list: &[&str]| list.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            data_dir_in_args(&args(&["--data-dir", "/a"])),
            Some("/a".into())
        );
        assert_eq!(
            data_dir_in_args(&args(&["-data-dir=/b"])),
            Some("/b".into())
        );
        assert_eq!(data_dir_in_args(&args(&["--name", "data-dir"])), None);
        assert_eq!(data_dir_in_args(&args(&["--wal-dir", "/w"])), None);
    }
}
