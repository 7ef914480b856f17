//! This module owns the migration plan and every decision in it: the pure
//! function `plan()` that turns (what version.txt says, what the user asked
//! for, what the image bundles) into an ordered list of steps, or a reason
//! why no safe path exists; and `decide()`, which adds what follows from the
//! same inputs (an empty or missing data dir, data from the future, a
//! multi-member `--initial-cluster`, the baseline reader, the backup). No
//! clock, filesystem, process or network is touched here, so every supported
//! and rejected combination is one row in the table tests below, and
//! `--dry-run` prints the plan's `Display`.

use std::collections::BTreeSet;
use std::fmt;
use std::path::PathBuf;

use crate::backup::BackupMode;
use crate::config::Member;
use crate::datadir::DirState;
use crate::version::{Minor, Storage, Version, VersionPair};

/// The oldest minor line this tool can read (the Kubernetes image started
/// at 2.2.1).
pub const OLDEST_MINOR: Minor = Minor::new(2, 2);

/// The patch of a minor upstream requires on every member before the next
/// minor starts, by that next minor: 3.5.26 before 3.6 (older 3.5 patches
/// can leave "zombie members" that 3.6 trips over: etcd blog, "zombie
/// members"; 3.5.24 … 3.5.26 fix upgrade blockers, upstream's 3.5 → 3.6
/// guide), 3.6.11 before 3.7 (upstream's 3.6 → 3.7 guide: earlier 3.6
/// patches may not be compatible with a rolling upgrade to 3.7).
pub const PATCH_FLOORS: [(Minor, Version, &str); 2] = [
    (
        Minor::new(3, 6),
        Version::new(3, 5, 26),
        "zombie-member and upgrade-blocker fixes",
    ),
    (
        Minor::new(3, 7),
        Version::new(3, 6, 11),
        "upstream's 3.6 to 3.7 upgrade guide",
    ),
];

/// The patch every member must run before `next` starts, with upstream's
/// reason, where upstream sets one ([`PATCH_FLOORS`]).
pub fn patch_floor(next: Minor) -> Option<(Version, &'static str)> {
    PATCH_FLOORS
        .iter()
        .find(|(minor, _, _)| *minor == next)
        .map(|(_, floor, why)| (*floor, *why))
}

/// The etcd releases available in the image.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Bundle {
    versions: BTreeSet<Version>,
}

/// One of the three programs a release ships.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Tool {
    /// The server, `etcd-<v>`.
    Etcd,
    /// The client, `etcdctl-<v>`.
    Etcdctl,
    /// The offline utility, `etcdutl-<v>` (3.5+).
    Etcdutl,
}

/// A program of a given release: what the image must hold for a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Binary {
    /// Which release (first, so that a sorted list groups by release).
    pub version: Version,
    /// Which program.
    pub tool: Tool,
}

/// One unit of work on the data dir. After each, `version.txt` records
/// [`Step::result`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Run a newer patch of the data's own minor, so that the next minor
    /// starts from the latest patch the image has (upstream's upgrade rule).
    PatchUpgrade {
        /// Version the data was last run with.
        from: Version,
        /// The patch that runs on it.
        to: Version,
        /// Storage kept by the step.
        storage: Storage,
    },
    /// Run the next minor on the data.
    MinorUpgrade {
        /// Version the data was last run with.
        from: Version,
        /// The release of the next minor that runs on it.
        to: Version,
        /// Storage kept by the step.
        storage: Storage,
    },
    /// Convert the v2 store to the v3 backend with `etcdctl migrate`, at a
    /// release whose etcdctl still has that command (3.0 … 3.4).
    StorageMigration {
        /// The release that serves the v2 data and converts it.
        at: Version,
    },
    /// Roll v3 data back by one minor: snapshot with the current release,
    /// restore with the older one.
    MinorRollback {
        /// Version the data was last run with.
        from: Version,
        /// The bundled release that serves the data to take the snapshot
        /// (`from` itself, or the newest bundled patch of its minor).
        serve: Version,
        /// The older release that restores and then runs the data.
        to: Version,
    },
    /// Walk v3 data down one minor through etcd's own downgrade: `serve`
    /// runs on the data and its cluster is told to downgrade to `to`'s
    /// minor (`downgrade enable`), which lowers the data's cluster and
    /// storage versions; then `to` runs on the data in place.
    MinorDowngrade {
        /// Version the data was last run with.
        from: Version,
        /// The bundled release that serves the data and enables the
        /// downgrade (`from` itself, or the newest bundled patch of its
        /// minor).
        serve: Version,
        /// The older release that runs on the downgraded data.
        to: Version,
    },
    /// Rebuild the data as a v2 store: copy every v3 key into a fresh v2
    /// store made by the target release.
    RollbackToEtcd2 {
        /// Version the data was last run with.
        from: Version,
        /// The bundled release that serves the v3 data for the copy.
        serve: Version,
        /// The release that builds and then runs the v2 store.
        to: Version,
    },
}

/// The ordered work from the recorded state to the target, and every
/// decision the run carries out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// What `version.txt` says now (the target, for an empty data dir).
    pub current: VersionPair,
    /// What the user asked for.
    pub target: VersionPair,
    /// The steps, in order; empty for a no-op, a patch-only change or an
    /// empty data dir.
    pub steps: Vec<Step>,
    /// What the data dir held: missing (created), empty, or recorded.
    pub found: DirState,
    /// The release that reads the baseline fingerprint before the first
    /// step ([`baseline_reader`]), if any.
    pub baseline: Option<Version>,
    /// The index of the step a backup is taken before, if any.
    pub backup: Option<usize>,
    /// Where the plan runs, for its `Display`; `None` for a bare route.
    pub site: Option<Site>,
    /// The data belongs to a cluster of this many members (its own
    /// membership says so) and the plan's upgrades are rolled through it,
    /// one member at a time, by the cluster mode instead of run as steps.
    pub cluster: Option<usize>,
    /// The data belongs to a cluster of this many members and the route
    /// holds a step no cluster rolls member by member (a storage change,
    /// a rollback etcd has no online way for): the members do the whole
    /// route together, with one pause of the cluster's writes
    /// (`cluster::pause`, issue 28). `steps` is the route the member that
    /// carries the data runs on its own.
    pub pause: Option<usize>,
    /// A roll whose end is not the user's target but the release a pause
    /// job can start from (issue 28 item 7): the cluster rolls its etcd2
    /// data (or etcd3 data below 3.3) up with the storage kept, to the
    /// newest bundled 3.3 (or, for a target of 3.1 or 3.2, to the target's
    /// release), then the members take the pause job to this, the user's
    /// target, in the same run. `target` is then the roll's end.
    pub then_pause: Option<VersionPair>,
}

/// From this cluster version on, a pause job's converter takes the
/// leadership with `MoveLeader` (3.3's; `cluster::pause`): a cluster below
/// it rolls here before a job to a target at or above it.
pub const MOVE_LEADER_FLOOR: Minor = Minor::new(3, 3);

/// The lowest cluster version a pause job runs at (`cluster::pause`). The
/// job's keys, its go and the removals go through the v3 API (the
/// cluster mode speaks v2 below 3.1), and a 3.1 or 3.2 leader hands its
/// leadership over when its etcd stops gracefully; 3.0 does neither.
/// Below [`MOVE_LEADER_FLOOR`] the leader carries the data.
pub const JOB_FLOOR: Minor = Minor::new(3, 1);

/// What a run does with the data dir once it holds the lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Work {
    /// Nothing: version.txt already names the target.
    Nothing,
    /// Roll the upgrades through the cluster, as one of its members.
    Roll {
        /// How many members the data's membership lists.
        members: usize,
    },
    /// Take part in the cluster's pause job, as one of its members.
    Pause {
        /// How many members the data's membership lists.
        members: usize,
    },
    /// Record the target without a step; the reason is logged.
    Record {
        /// "empty data dir" or "patch change, no step needed".
        reason: &'static str,
    },
    /// Run the steps.
    Steps,
}

/// Where a plan runs: what `--dry-run` shows beside the decisions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Site {
    /// The data dir.
    pub data_dir: PathBuf,
    /// Where the binaries are.
    pub bin_dir: PathBuf,
    /// The member the steps run as (under the name the data records).
    pub member: Member,
    /// The member name the configuration gives.
    pub configured_name: String,
    /// Where backups go.
    pub backup_root: PathBuf,
    /// How many backups are kept.
    pub backup_keep: usize,
    /// An interrupted step left a scratch dir (finished or discarded first).
    pub interrupted: bool,
}

/// What [`decide`] decides from, all of it read beforehand.
#[derive(Debug, Clone)]
pub struct Situation<'a> {
    /// What the data dir holds.
    pub found: DirState,
    /// What the user asked for.
    pub target: VersionPair,
    /// What the image bundles.
    pub bundle: &'a Bundle,
    /// When to back up.
    pub backup: BackupMode,
    /// `--initial-cluster`.
    pub initial_cluster: &'a str,
    /// How many members the data's own membership lists (0 when not read:
    /// no data, or the data already at the target).
    pub data_members: usize,
    /// The cluster mode's restart mark is on the data: a release started
    /// on it unrecorded, so the cluster mode must resume.
    pub restart_mark: bool,
    /// The raft index of a v2 request (written by 3.5 or older) the data's
    /// WAL holds past its newest snapshot record, which 3.7+ cannot replay
    /// (`OnDisk::v2_requests_past_snapshot`; `None` when not read).
    pub v2_request_past_snapshot: Option<u64>,
}

/// Why a run must not start, decided from its [`Situation`] alone.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum Refusal {
    /// version.txt names a release newer than anything the image can run.
    #[error("the data was last run by etcd {}, newer than {known}", .current.version)]
    FutureData {
        /// What version.txt says.
        current: VersionPair,
        /// What the image knows, for the message.
        known: String,
    },
    /// No safe path from the recorded release to the target.
    #[error("no safe path from {current} to the target")]
    NoPath {
        /// What version.txt says.
        current: VersionPair,
        /// Why.
        #[source]
        source: PlanError,
    },
    /// An empty or missing data dir cannot be started at the target.
    #[error("cannot start an empty data dir at the target")]
    FreshTarget(#[source] PlanError),
    /// Steps are needed but `--initial-cluster` lists other members.
    #[error("INITIAL_CLUSTER lists {members} members")]
    MultiMember {
        /// How many.
        members: usize,
    },
    /// The first etcd to start on the data would be one that cannot replay
    /// its WAL, and no release starts before it to snapshot past that.
    #[error("the data's WAL holds a v2 request (written by etcd 3.5 or older) at raft index {index}, past its newest snapshot, which etcd {first} cannot replay (it panics), and no bundled release of the data's own minor runs first to take a snapshot past it; bundle etcd {recorded} (the release version.txt records), or start the data once on it with --snapshot-count=1 and stop it, then rerun")]
    ReplayBlocked {
        /// The release the plan would start first.
        first: Version,
        /// What version.txt records.
        recorded: Version,
        /// The request's raft index.
        index: u64,
    },
}

/// Why no safe path exists. Every variant names the versions involved and
/// what the user can do about it.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum PlanError {
    /// A 2.x release outside 2.2 … 2.3, or older.
    #[error(
        "etcd {version} is not supported: etcd-migrate walks {oldest}.x, 2.3.x and 3.x releases"
    )]
    Unsupported {
        /// The rejected version.
        version: Version,
        /// [`OLDEST_MINOR`].
        oldest: Minor,
    },
    /// A major version with no known successor rules.
    #[error("etcd {version} is not a release etcd-migrate knows how to reach (only 2.x and 3.x)")]
    UnknownMajor {
        /// The rejected version.
        version: Version,
    },
    /// The target release is not in the image.
    #[error("target etcd {target} is not bundled (bundled: {bundled}); set TARGET_VERSION to a bundled release")]
    TargetNotBundled {
        /// The requested target.
        target: Version,
        /// The bundle, for the message.
        bundled: String,
    },
    /// A minor the path must pass through is not in the image.
    #[error("no etcd {minor}.x is bundled, but the path from {from} to {to} must pass through {minor} (etcd upgrades one minor at a time; bundled: {bundled})")]
    MissingMinor {
        /// The missing minor line.
        minor: Minor,
        /// Where the path starts.
        from: Version,
        /// Where the path ends.
        to: Version,
        /// The bundle, for the message.
        bundled: String,
    },
    /// etcd3 storage asked for on a 2.x release.
    #[error("TARGET_STORAGE=etcd3 needs etcd 3.0 or later, but TARGET_VERSION is {target}; use TARGET_STORAGE=etcd2 or a 3.x target")]
    Etcd3NeedsV3 {
        /// The requested target.
        target: Version,
    },
    /// etcd2 storage asked for on a release without the v2 API.
    #[error("etcd {version} has no v2 API, so it cannot serve etcd2 storage; etcd2 data can only live on 2.2 … 3.5")]
    NoV2Api {
        /// The release in question.
        version: Version,
    },
    /// Rolling back data held in the v2 store.
    #[error("rolling etcd2 data back from {from} to {to} is not supported: etcd refuses to start an older minor on newer v2 data; keep TARGET_VERSION at {from_minor}.x or newer")]
    Etcd2Rollback {
        /// Where the data is.
        from: Version,
        /// Where the user wants it.
        to: Version,
        /// The data's minor line, for the advice.
        from_minor: Minor,
    },
    /// No release on the path can convert v2 data to v3.
    #[error("cannot convert etcd2 data at {from} to etcd3 on the way to {to}: only etcdctl 3.0 … 3.4 has `migrate`, and no bundled 3.0 … 3.4 release lies on that path")]
    NoMigrateTool {
        /// Where the data is.
        from: Version,
        /// Where the user wants it.
        to: Version,
    },
    /// The next minor needs a recent patch of the one before to have run
    /// first ([`PATCH_FLOORS`]).
    #[error("the path reaches {next} from {have}, but upstream requires {need} or later before {next} ({why}); bundle etcd {need} or a newer {} patch", .need.minor_line())]
    StalePatch {
        /// The release the path would leave from.
        have: Version,
        /// The floor.
        need: Version,
        /// The minor it would start.
        next: Minor,
        /// Upstream's reason.
        why: &'static str,
    },
}

/// The release that reads the data as recorded before the first step, for
/// the baseline fingerprint every later step is checked against: the
/// recorded release itself, when the image has it and the first step runs
/// another release on the data in place. The rebuilding steps serve their
/// source with `serve`/`at` and read it anyway, so they need none; when
/// the recorded release is not bundled, the first step's own read is the
/// first fingerprint.
pub fn baseline_reader(plan: &Plan, bundle: &Bundle) -> Option<Version> {
    match plan.steps.first()? {
        Step::PatchUpgrade { .. } | Step::MinorUpgrade { .. } => bundle
            .contains(plan.current.version)
            .then_some(plan.current.version),
        Step::StorageMigration { .. }
        | Step::MinorRollback { .. }
        | Step::MinorDowngrade { .. }
        | Step::RollbackToEtcd2 { .. } => None,
    }
}

impl Bundle {
    /// Builds a bundle from a list of releases.
    pub fn new(versions: impl IntoIterator<Item = Version>) -> Self {
        Bundle {
            versions: versions.into_iter().collect(),
        }
    }

    /// True when the image has this exact release.
    pub fn contains(&self, version: Version) -> bool {
        self.versions.contains(&version)
    }

    /// The newest bundled patch of a minor line.
    pub fn newest_in(&self, minor: Minor) -> Option<Version> {
        self.versions
            .range(
                Version::new(minor.major, minor.minor, 0)
                    ..=Version::new(minor.major, minor.minor, u32::MAX),
            )
            .next_back()
            .copied()
    }

    /// The releases, oldest first.
    pub fn versions(&self) -> impl Iterator<Item = Version> + '_ {
        self.versions.iter().copied()
    }

    /// True when nothing is bundled.
    pub fn is_empty(&self) -> bool {
        self.versions.is_empty()
    }
}

impl fmt::Display for Bundle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.versions.is_empty() {
            return f.write_str("none");
        }
        let list: Vec<String> = self.versions.iter().map(Version::to_string).collect();
        f.write_str(&list.join(", "))
    }
}

impl fmt::Display for Tool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Tool::Etcd => "etcd",
            Tool::Etcdctl => "etcdctl",
            Tool::Etcdutl => "etcdutl",
        })
    }
}

impl fmt::Display for Binary {
    /// The file name in the bin dir, e.g. `etcdctl-3.4.23`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.tool, self.version)
    }
}

impl Binary {
    /// The server of a release.
    pub fn etcd(version: Version) -> Self {
        Binary {
            tool: Tool::Etcd,
            version,
        }
    }

    /// The client of a release.
    pub fn etcdctl(version: Version) -> Self {
        Binary {
            tool: Tool::Etcdctl,
            version,
        }
    }

    /// The tool that restores snapshots for a release: etcdutl from 3.5 on,
    /// etcdctl before.
    pub fn snapshot_restorer(version: Version) -> Self {
        Binary {
            tool: if version.has_etcdutl() {
                Tool::Etcdutl
            } else {
                Tool::Etcdctl
            },
            version,
        }
    }
}

impl Step {
    /// What `version.txt` records once the step has completed.
    pub fn result(&self) -> VersionPair {
        match *self {
            Step::PatchUpgrade { to, storage, .. } | Step::MinorUpgrade { to, storage, .. } => {
                VersionPair {
                    version: to,
                    storage,
                }
            }
            Step::StorageMigration { at } => VersionPair {
                version: at,
                storage: Storage::Etcd3,
            },
            Step::MinorRollback { to, .. } | Step::MinorDowngrade { to, .. } => VersionPair {
                version: to,
                storage: Storage::Etcd3,
            },
            Step::RollbackToEtcd2 { to, .. } => VersionPair {
                version: to,
                storage: Storage::Etcd2,
            },
        }
    }

    /// The release whose server runs on the data at the end of the step
    /// (and proves it healthy).
    pub fn runs(&self) -> Version {
        self.result().version
    }

    /// Every binary the step needs from the image.
    pub fn binaries(&self) -> Vec<Binary> {
        match *self {
            Step::PatchUpgrade { to, .. } | Step::MinorUpgrade { to, .. } => vec![Binary::etcd(to)],
            Step::StorageMigration { at } => vec![Binary::etcd(at), Binary::etcdctl(at)],
            Step::MinorRollback { serve, to, .. } => vec![
                Binary::etcd(serve),
                Binary::etcdctl(serve),
                Binary::snapshot_restorer(to),
                Binary::etcd(to),
            ],
            Step::RollbackToEtcd2 { serve, to, .. } | Step::MinorDowngrade { serve, to, .. } => {
                vec![Binary::etcd(serve), Binary::etcd(to)]
            }
        }
    }

    /// True for the steps that run a newer etcd on the data in place: the
    /// only ones a cluster rolls member by member.
    pub fn is_upgrade(&self) -> bool {
        matches!(self, Step::PatchUpgrade { .. } | Step::MinorUpgrade { .. })
    }

    /// True for the steps a cluster takes member by member, online: the
    /// upgrades, etcd's own downgrade where the serving release has it
    /// for clusters (3.6 and later), and 3.5 to a 3.4 that joins a 3.5
    /// cluster (3.4.32+, [`Version::rolls_down_from_next_minor`]: rolling
    /// restarts, no downgrade job). The others need the whole cluster's
    /// pause (`cluster::pause`).
    pub fn rolls_online(&self) -> bool {
        match *self {
            Step::PatchUpgrade { .. } | Step::MinorUpgrade { .. } => true,
            Step::MinorDowngrade { serve, to, .. } => {
                serve.minor_line() >= Minor::new(3, 6) || to.rolls_down_from_next_minor()
            }
            Step::StorageMigration { .. }
            | Step::MinorRollback { .. }
            | Step::RollbackToEtcd2 { .. } => false,
        }
    }

    /// True for the steps that take etcd3 data to an older minor (by
    /// etcd's downgrade or by snapshot), the storage kept.
    pub fn goes_back(&self) -> bool {
        matches!(
            self,
            Step::MinorRollback { .. } | Step::MinorDowngrade { .. }
        )
    }

    /// True for steps that rewrite the data rather than run a newer etcd
    /// on it; a backup is taken before the first of them.
    pub fn is_destructive(&self) -> bool {
        self.builds_a_copy() || matches!(self, Step::MinorDowngrade { .. })
    }

    /// True for the steps that build the data anew in a scratch dir and
    /// swap it in (and so need the room for a copy inside the data dir).
    pub fn builds_a_copy(&self) -> bool {
        matches!(
            self,
            Step::StorageMigration { .. }
                | Step::MinorRollback { .. }
                | Step::RollbackToEtcd2 { .. }
        )
    }

    /// The short name of the step kind, for logs.
    pub fn kind(&self) -> &'static str {
        match self {
            Step::PatchUpgrade { .. } => "patch-upgrade",
            Step::MinorUpgrade { .. } => "minor-upgrade",
            Step::StorageMigration { .. } => "storage-migration",
            Step::MinorRollback { .. } => "minor-rollback",
            Step::MinorDowngrade { .. } => "minor-downgrade",
            Step::RollbackToEtcd2 { .. } => "rollback-to-etcd2",
        }
    }

    /// The state the data is in before the step.
    pub fn before(&self) -> VersionPair {
        match *self {
            Step::PatchUpgrade { from, storage, .. } | Step::MinorUpgrade { from, storage, .. } => {
                VersionPair {
                    version: from,
                    storage,
                }
            }
            Step::StorageMigration { at } => VersionPair {
                version: at,
                storage: Storage::Etcd2,
            },
            Step::MinorRollback { from, .. }
            | Step::MinorDowngrade { from, .. }
            | Step::RollbackToEtcd2 { from, .. } => VersionPair {
                version: from,
                storage: Storage::Etcd3,
            },
        }
    }
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {} -> {}", self.kind(), self.before(), self.result())
    }
}

impl Plan {
    /// Whether the baseline may be fingerprinted by etcd's own hash alone,
    /// without a whole read: etcd3 data and only in-place steps, each of
    /// which proves itself by its etcd's hash at the last read's revision
    /// (a rebuilding step compares whole reads, and an etcd2 store has no
    /// hash). The release still decides: one without `HashKV` (before 3.3)
    /// is read whole.
    pub fn baseline_by_hash(&self) -> bool {
        self.current.storage == Storage::Etcd3
            && self.steps.iter().all(|step| {
                matches!(
                    step,
                    Step::PatchUpgrade {
                        storage: Storage::Etcd3,
                        ..
                    } | Step::MinorUpgrade {
                        storage: Storage::Etcd3,
                        ..
                    }
                )
            })
    }

    /// True when nothing needs to change.
    pub fn is_noop(&self) -> bool {
        self.current == self.target
    }

    /// True when `version.txt` must be rewritten without running a step: a
    /// patch change within one minor and one storage (patches of a minor
    /// share the on-disk format both ways, so no etcd needs to prove it).
    pub fn is_patch_only(&self) -> bool {
        self.steps.is_empty() && !self.is_noop()
    }

    /// True when the data dir held a `version.txt`.
    pub fn is_recorded(&self) -> bool {
        matches!(self.found, DirState::Recorded(_))
    }

    /// True when the data dir holds no data yet (missing or empty): the
    /// member starts fresh at the target.
    pub fn is_fresh(&self) -> bool {
        matches!(self.found, DirState::Missing | DirState::Empty)
    }

    /// True when a step builds the data anew in a scratch dir (and so
    /// needs room for a copy inside the data dir).
    pub fn builds_a_copy(&self) -> bool {
        self.steps.iter().any(Step::builds_a_copy)
    }

    /// What the run does with the data dir.
    pub fn work(&self) -> Work {
        if let Some(members) = self.pause {
            return Work::Pause { members };
        }
        if let Some(members) = self.cluster {
            return Work::Roll { members };
        }
        match (&self.found, self.steps.is_empty()) {
            (_, false) => Work::Steps,
            (DirState::Recorded(current), true) if *current == self.target => Work::Nothing,
            (DirState::Recorded(_), true) => Work::Record {
                reason: "patch change, no step needed",
            },
            (DirState::Missing | DirState::Empty, true) => Work::Record {
                reason: "empty data dir",
            },
        }
    }

    /// Every binary the plan's steps need, each once, in a stable order.
    pub fn binaries(&self) -> Vec<Binary> {
        let set: BTreeSet<Binary> = self.steps.iter().flat_map(Step::binaries).collect();
        set.into_iter().collect()
    }

    /// Every binary the run needs: the steps', the baseline reader's, and
    /// the target's server (even with --no-exec: the manifest starts it
    /// next, and a bundle that lists it without the file is broken).
    pub fn needed_binaries(&self) -> Vec<Binary> {
        let mut needed = self.binaries();
        let target = Binary::etcd(self.target.version);
        let baseline = self.baseline.map(Binary::etcd);
        for binary in [Some(target), baseline].into_iter().flatten() {
            if !needed.contains(&binary) {
                needed.push(binary);
            }
        }
        needed
    }

    /// The step the backup is taken before, if any.
    pub fn backup_step(&self) -> Option<&Step> {
        self.steps.get(self.backup?)
    }

    /// This plan, placed where it runs (for its `Display`).
    pub fn at(self, site: Site) -> Plan {
        Plan {
            site: Some(site),
            ..self
        }
    }
}

/// Decides the whole plan for `situation`: the steps, or the refusal, and
/// what the run does besides (record an empty dir, read a baseline, back
/// up before a step).
pub fn decide(situation: &Situation<'_>) -> Result<Plan, Refusal> {
    let Situation {
        ref found,
        target,
        bundle,
        backup,
        initial_cluster,
        data_members,
        restart_mark,
        v2_request_past_snapshot,
    } = *situation;
    let mut plan = match *found {
        DirState::Recorded(current) => {
            refuse_future_data(current, bundle)?;
            plan(current, target, bundle).map_err(|source| Refusal::NoPath { current, source })?
        }
        DirState::Missing | DirState::Empty => {
            if !bundle.contains(target.version) {
                return Err(Refusal::FreshTarget(PlanError::TargetNotBundled {
                    target: target.version,
                    bundled: bundle.to_string(),
                }));
            }
            Plan {
                current: target,
                target,
                steps: Vec::new(),
                found: found.clone(),
                baseline: None,
                backup: None,
                site: None,
                cluster: None,
                pause: None,
                then_pause: None,
            }
        }
    };
    let changes = !plan.steps.is_empty() || restart_mark;
    if data_members > 1 {
        // The data's own membership decides, not the command line. A
        // route with a step no cluster rolls is one pause job of the
        // whole cluster (issue 28), whatever else it holds.
        if !plan.steps.iter().all(Step::rolls_online) {
            if let Some(mut rolled) = roll_before_pause(&plan, bundle) {
                rolled.found = plan.found.clone();
                rolled.cluster = Some(data_members);
                rolled.backup = backup_before(&rolled.steps, backup);
                return Ok(rolled);
            }
            plan.pause = Some(data_members);
            plan.backup = None;
            return Ok(plan);
        }
        if changes && plan.steps.iter().all(Step::is_upgrade) {
            plan.cluster = Some(data_members);
            // Upgrades are not destructive: only --backup=always asks for
            // one (taken while the member is down, before its etcd starts).
            plan.backup = backup_before(&plan.steps, backup);
            return Ok(plan);
        }
        if !plan.steps.is_empty() && plan.steps.iter().all(Step::goes_back) {
            // A lower target on a cluster that etcd takes down online
            // (3.6+): the cluster mode's downgrade waves.
            plan.cluster = Some(data_members);
            return Ok(plan);
        }
    } else {
        let members = initial_cluster_members(initial_cluster);
        if !plan.steps.is_empty() && members > 1 {
            return Err(Refusal::MultiMember { members });
        }
    }
    refuse_unreplayable(&plan, v2_request_past_snapshot)?;
    plan.backup = backup_before(&plan.steps, backup);
    Ok(plan)
}

/// The roll that takes a cluster to where the pause job `plan` needs
/// can run, with its storage kept (a route a cluster cannot roll, from a
/// release too old for the job): the route's pause comes after it, in the
/// same run ([`Plan::then_pause`]).
/// - A target at 3.3 or later: the newest bundled 3.3
///   ([`MOVE_LEADER_FLOOR`]), where the job's converter takes the
///   leadership with `MoveLeader` and the rest of the way up is the
///   converter's.
/// - A target of 3.1 or 3.2 from etcd2 data below 3.1: the target's
///   release with the storage kept; the storage migration is the job
///   there, its leader carrying the data ([`JOB_FLOOR`]).
///
/// `None` where the cluster can run the job as it is (3.3 or later; 3.1
/// or later for a target below 3.3), where the target is below 3.1 (no
/// job reaches it: it waits, saying so), or where the way up is not a
/// roll.
fn roll_before_pause(plan: &Plan, bundle: &Bundle) -> Option<Plan> {
    let (from, to) = (
        plan.current.version.minor_line(),
        plan.target.version.minor_line(),
    );
    let end = if to >= MOVE_LEADER_FLOOR && from < MOVE_LEADER_FLOOR {
        bundle.newest_in(MOVE_LEADER_FLOOR)?
    } else if to < MOVE_LEADER_FLOOR && to >= JOB_FLOOR && from < JOB_FLOOR {
        plan.target.version
    } else {
        return None;
    };
    let end = VersionPair {
        version: end,
        storage: plan.current.storage,
    };
    let mut rolled = self::plan(plan.current, end, bundle).ok()?;
    if rolled.steps.is_empty() || !rolled.steps.iter().all(Step::is_upgrade) {
        return None;
    }
    rolled.then_pause = Some(plan.target);
    Some(rolled)
}

/// Refuses a plan whose first etcd start is a release that cannot replay
/// the data's WAL as it stands (3.7+ on a WAL holding a v2 request past its
/// newest snapshot). Every step's etcd snapshots after each entry, so only
/// the first start can meet such a WAL: a baseline read by the recorded
/// release, or a step of the data's own minor, runs first and readies it.
fn refuse_unreplayable(plan: &Plan, v2_request: Option<u64>) -> Result<(), Refusal> {
    let (Some(index), Some(first)) = (v2_request, plan.steps.first()) else {
        return Ok(());
    };
    let starts_first = match plan.baseline {
        Some(baseline) => baseline,
        None => match *first {
            Step::MinorRollback { serve, .. } | Step::RollbackToEtcd2 { serve, .. } => serve,
            _ => first.runs(),
        },
    };
    if starts_first.replays_only_v3_requests() {
        return Err(Refusal::ReplayBlocked {
            first: starts_first,
            recorded: plan.current.version,
            index,
        });
    }
    Ok(())
}

/// Refuses data last run by a release newer than anything the image has:
/// no bundled etcd can serve it, so no path (up or down) can start.
fn refuse_future_data(current: VersionPair, bundle: &Bundle) -> Result<(), Refusal> {
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
        Some(known) => Err(Refusal::FutureData { current, known }),
        None => Ok(()),
    }
}

/// The index of the step a backup is taken before: the first step
/// (`always`), the first destructive one (`destructive`), or none.
pub fn backup_before(steps: &[Step], mode: BackupMode) -> Option<usize> {
    match mode {
        BackupMode::Always => (!steps.is_empty()).then_some(0),
        BackupMode::Destructive => steps.iter().position(Step::is_destructive),
        BackupMode::Never => None,
    }
}

/// How many distinct member names `--initial-cluster` lists.
pub fn initial_cluster_members(initial_cluster: &str) -> usize {
    let mut names: Vec<&str> = initial_cluster
        .split(',')
        .filter_map(|entry| entry.split_once('=').map(|(name, _)| name.trim()))
        .filter(|name| !name.is_empty())
        .collect();
    names.sort_unstable();
    names.dedup();
    names.len()
}

impl fmt::Display for Plan {
    /// What `--dry-run` prints: one line per decision and per step.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let site = self.site.as_ref();
        let target = self.target;
        if let Some(site) = site {
            let name = &site.member.name;
            if *name == site.configured_name {
                writeln!(f, "member: {name}")?;
            } else {
                writeln!(
                    f,
                    "member: {name} (as the data records it; the configuration says {})",
                    site.configured_name
                )?;
            }
        }
        let dir = site.map_or("(not placed)".to_string(), |s| {
            s.data_dir.display().to_string()
        });
        match self.found {
            DirState::Missing => writeln!(
                f,
                "data dir {dir}: missing; would create it (mode 0700) and record {target}"
            )?,
            DirState::Empty => writeln!(f, "data dir {dir}: empty; would record {target}")?,
            DirState::Recorded(current) => {
                writeln!(f, "data dir {dir}: {current}; target {target}")?
            }
        }
        if site.is_some_and(|s| s.interrupted) {
            writeln!(f, "an interrupted step left a scratch dir; a real run first finishes its swap (if it happened) or discards it")?;
        }
        if self.is_patch_only() {
            writeln!(
                f,
                "patch change within {}: no step; would record {target}",
                target.version.minor_line()
            )?;
        }
        if let Some(members) = self.pause {
            return self.fmt_pause(f, members);
        }
        if let Some(members) = self.cluster {
            return self.fmt_roll(f, members);
        }
        self.fmt_steps(f)?;
        self.fmt_backup(f)?;
        writeln!(
            f,
            "then: exec {} (or exit 0 with --no-exec)",
            self.binary_path(Binary::etcd(target.version))
        )
    }
}

impl Plan {
    /// A binary as the run finds it: its path in the bin dir (its name,
    /// for a bare route).
    fn binary_path(&self, binary: Binary) -> String {
        match &self.site {
            Some(site) => site.bin_dir.join(binary.to_string()).display().to_string(),
            None => binary.to_string(),
        }
    }

    /// The cluster mode's plan: the releases this member restarts into, as
    /// the cluster's member, one member at a time.
    fn fmt_roll(&self, f: &mut fmt::Formatter<'_>, members: usize) -> fmt::Result {
        writeln!(
            f,
            "the data's own membership lists {members} members: a rolling upgrade, coordinated with the other members through the cluster (its cluster version as the barrier, one member restarting at a time under an upgrade lock in the cluster)"
        )?;
        let total = self.steps.len();
        for (i, step) in self.steps.iter().enumerate() {
            writeln!(
                f,
                "  restart {}/{total}: into {} ({}), as this member with its own flags, once the cluster allows it",
                i + 1,
                step.runs(),
                self.binary_path(Binary::etcd(step.runs()))
            )?;
        }
        self.fmt_backup(f)?;
        if let Some(then) = self.then_pause {
            return writeln!(
                f,
                "then: the whole-cluster pause job from {} to {then}, which the cluster cannot run at its present release (needs --allow-cluster-pause / ALLOW_CLUSTER_PAUSE=1 on every member; see docs/cluster-pause.md)",
                self.target
            );
        }
        writeln!(
            f,
            "then: keep serving {} as a supervised child (a later start with nothing to change execs it)",
            self.target.version
        )
    }

    /// The pause job's plan: the members agree, one carries the data
    /// through the route, the others join it.
    fn fmt_pause(&self, f: &mut fmt::Formatter<'_>, members: usize) -> fmt::Result {
        writeln!(
            f,
            "the data's own membership lists {members} members, and {} -> {} cannot roll member by member: a whole-cluster pause job (needs --allow-cluster-pause / ALLOW_CLUSTER_PAUSE=1 on every member; see docs/cluster-pause.md)",
            self.current, self.target
        )?;
        writeln!(
            f,
            "  1. every member agrees (durably, in its data dir and in the cluster)"
        )?;
        writeln!(f, "  2. the others stop; one member (the one that writes the job's go, made leader) stops last, holding every committed entry")?;
        writeln!(
            f,
            "  3. that member forces its data into a one-member cluster and runs the route on it:"
        )?;
        let total = self.steps.len();
        for (i, step) in self.steps.iter().enumerate() {
            writeln!(f, "     step {}/{total}: {step}", i + 1)?;
        }
        writeln!(f, "  4. it serves {} alone; the others back up their old data and join it one at a time, each proven by HashKV", self.target)?;
        writeln!(
            f,
            "then: keep serving {} as a supervised child (a later start with nothing to change execs it)",
            self.target.version
        )
    }

    /// One line per step (with the binaries, the client URL and the peer
    /// URLs it runs with), then the baseline read.
    fn fmt_steps(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let total = self.steps.len();
        for (i, step) in self.steps.iter().enumerate() {
            let binaries: Vec<String> = step
                .binaries()
                .into_iter()
                .map(|b| self.binary_path(b))
                .collect();
            write!(
                f,
                "step {}/{total}: {step}; runs {}",
                i + 1,
                binaries.join(" + ")
            )?;
            match &self.site {
                Some(site) => writeln!(
                    f,
                    "; client http://127.0.0.1:{}; peer {}",
                    site.member.client_port, site.member.listen_peer_urls
                )?,
                None => writeln!(f)?,
            }
        }
        if let Some(version) = self.baseline {
            let how = if self.baseline_by_hash() {
                "by etcd's own hash where it has one, else by reading it whole"
            } else {
                "by reading it whole"
            };
            writeln!(
                f,
                "baseline: {} serves the data as recorded once before step 1, to fingerprint it {how}",
                self.binary_path(Binary::etcd(version))
            )?;
        }
        Ok(())
    }

    /// The backup line, when one is taken.
    fn fmt_backup(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Some(step) = self.backup_step() else {
            return Ok(());
        };
        let before = step.before();
        match &self.site {
            Some(site) => writeln!(
                f,
                "backup: before {step}, into {}/<time>-{}-{} (keeping {})",
                site.backup_root.display(),
                before.version,
                before.storage,
                site.backup_keep
            ),
            None => writeln!(f, "backup: before {step}"),
        }
    }
}

/// Computes the route from `current` to `target` using only releases in
/// `bundle`, with its baseline reader; no backup and no site ([`decide`]
/// makes the run's whole plan). Pure: the same inputs always give the same
/// plan or error.
pub fn plan(current: VersionPair, target: VersionPair, bundle: &Bundle) -> Result<Plan, PlanError> {
    check_known(current.version)?;
    check_known(target.version)?;
    if target.storage == Storage::Etcd3 && target.version.major < 3 {
        return Err(PlanError::Etcd3NeedsV3 {
            target: target.version,
        });
    }
    for pair in [current, target] {
        if pair.storage == Storage::Etcd2 && !pair.version.has_v2_api() {
            return Err(PlanError::NoV2Api {
                version: pair.version,
            });
        }
    }
    if !bundle.contains(target.version) {
        return Err(PlanError::TargetNotBundled {
            target: target.version,
            bundled: bundle.to_string(),
        });
    }
    let planner = Planner { bundle };
    let steps = match (current.storage, target.storage) {
        _ if current == target => Vec::new(),
        (from, to) if from == to => planner.same_storage(current.version, target.version, from)?,
        (Storage::Etcd2, _) => planner.etcd2_to_etcd3(current.version, target.version)?,
        (Storage::Etcd3, _) => planner.etcd3_to_etcd2(current.version, target.version)?,
    };
    let mut plan = Plan {
        current,
        target,
        steps,
        found: DirState::Recorded(current),
        baseline: None,
        backup: None,
        site: None,
        cluster: None,
        pause: None,
        then_pause: None,
    };
    plan.baseline = baseline_reader(&plan, bundle);
    Ok(plan)
}

fn check_known(version: Version) -> Result<(), PlanError> {
    if version.major > 3 {
        return Err(PlanError::UnknownMajor { version });
    }
    if version.minor_line() < OLDEST_MINOR || (version.major == 2 && version.minor > 3) {
        return Err(PlanError::Unsupported {
            version,
            oldest: OLDEST_MINOR,
        });
    }
    Ok(())
}

struct Planner<'a> {
    bundle: &'a Bundle,
}

impl Planner<'_> {
    fn same_storage(
        &self,
        from: Version,
        to: Version,
        storage: Storage,
    ) -> Result<Vec<Step>, PlanError> {
        use std::cmp::Ordering;
        match to.minor_line().cmp(&from.minor_line()) {
            Ordering::Equal => Ok(Vec::new()),
            Ordering::Greater => self.upgrade_chain(from, to, storage),
            Ordering::Less if storage == Storage::Etcd2 => Err(PlanError::Etcd2Rollback {
                from,
                to,
                from_minor: from.minor_line(),
            }),
            Ordering::Less => self.rollback_chain(from, to),
        }
    }

    /// Upgrades one minor at a time: first the newest bundled patch of the
    /// data's own minor (if newer than the data), then the newest bundled
    /// patch of each minor in between, then the target itself.
    fn upgrade_chain(
        &self,
        from: Version,
        to: Version,
        storage: Storage,
    ) -> Result<Vec<Step>, PlanError> {
        let mut steps = Vec::new();
        let mut prev = from;
        if let Some(newest) = self.bundle.newest_in(from.minor_line()) {
            if newest > from {
                steps.push(Step::PatchUpgrade {
                    from,
                    to: newest,
                    storage,
                });
                prev = newest;
            }
        }
        let mut minor = from.minor_line().next();
        while minor <= to.minor_line() {
            let next = if minor == to.minor_line() {
                to
            } else {
                self.bundle
                    .newest_in(minor)
                    .ok_or_else(|| PlanError::MissingMinor {
                        minor,
                        from,
                        to,
                        bundled: self.bundle.to_string(),
                    })?
            };
            if let Some((need, why)) = patch_floor(next.minor_line()) {
                if prev < need {
                    return Err(PlanError::StalePatch {
                        have: prev,
                        need,
                        next: next.minor_line(),
                        why,
                    });
                }
            }
            steps.push(Step::MinorUpgrade {
                from: prev,
                to: next,
                storage,
            });
            prev = next;
            minor = minor.next();
        }
        Ok(steps)
    }

    /// Rolls v3 data back one minor at a time, through the newest bundled
    /// patch of each minor in between: online by etcd's own downgrade
    /// where the pair has one ([`Version::downgrades_online_to`]), else by
    /// snapshot and restore.
    fn rollback_chain(&self, from: Version, to: Version) -> Result<Vec<Step>, PlanError> {
        let mut steps = Vec::new();
        let mut prev = from;
        let mut serve = self.serving(from, from, to)?;
        let mut minor = from.minor_line();
        while let Some(lower) = minor.previous().filter(|m| *m >= to.minor_line()) {
            let next = if lower == to.minor_line() {
                to
            } else {
                self.bundle
                    .newest_in(lower)
                    .ok_or_else(|| PlanError::MissingMinor {
                        minor: lower,
                        from,
                        to,
                        bundled: self.bundle.to_string(),
                    })?
            };
            steps.push(if serve.downgrades_online_to(next) {
                Step::MinorDowngrade {
                    from: prev,
                    serve,
                    to: next,
                }
            } else {
                Step::MinorRollback {
                    from: prev,
                    serve,
                    to: next,
                }
            });
            prev = next;
            serve = next;
            minor = lower;
        }
        Ok(steps)
    }

    /// etcd2 → etcd3: walk as etcd2 to the first release on the path whose
    /// etcdctl has `migrate`, convert there, then walk on as etcd3.
    ///
    /// Why the earliest such release: after conversion every later step is
    /// proven through the v3 API (the API the user wants), and the v2 store
    /// never has to be served by 3.4/3.5, where v2 is deprecated and off by
    /// default. Within that minor we use its newest bundled patch, whose
    /// `migrate` has the most fixes.
    fn etcd2_to_etcd3(&self, from: Version, to: Version) -> Result<Vec<Step>, PlanError> {
        if to.minor_line() < from.minor_line() {
            return Err(PlanError::Etcd2Rollback {
                from,
                to,
                from_minor: from.minor_line(),
            });
        }
        let upgrades = if to.minor_line() > from.minor_line() {
            self.upgrade_chain(from, to, Storage::Etcd2)?
        } else {
            Vec::new()
        };
        // Points where the data rests: the start, then after each upgrade.
        // In a same-minor change the target patch is a point too: the
        // conversion step itself runs it.
        let mut points: Vec<Version> = std::iter::once(from)
            .chain(upgrades.iter().map(Step::runs))
            .collect();
        if upgrades.is_empty() && from != to {
            points.push(to);
        }
        let last_of_minor = |i: usize| {
            points
                .get(i + 1)
                .is_none_or(|n| n.minor_line() != points[i].minor_line())
        };
        let at = (0..points.len())
            .find(|&i| {
                points[i].has_etcdctl_migrate()
                    && self.bundle.contains(points[i])
                    && last_of_minor(i)
            })
            .ok_or(PlanError::NoMigrateTool { from, to })?;
        let mut steps: Vec<Step> = upgrades[..at.min(upgrades.len())].to_vec();
        steps.push(Step::StorageMigration { at: points[at] });
        steps.extend(upgrades.iter().skip(at).map(|step| match *step {
            Step::PatchUpgrade { from, to, .. } => Step::PatchUpgrade {
                from,
                to,
                storage: Storage::Etcd3,
            },
            Step::MinorUpgrade { from, to, .. } => Step::MinorUpgrade {
                from,
                to,
                storage: Storage::Etcd3,
            },
            other => other,
        }));
        Ok(steps)
    }

    /// etcd3 → etcd2: a logical copy of every key into a fresh v2 store made
    /// by the target release. Because it copies keys rather than files, the
    /// source can be any v3 release: no one-minor-at-a-time walk is needed
    /// downwards. Upwards, the data is first upgraded to the target as etcd3.
    fn etcd3_to_etcd2(&self, from: Version, to: Version) -> Result<Vec<Step>, PlanError> {
        if to.minor_line() > from.minor_line() {
            let mut steps = self.upgrade_chain(from, to, Storage::Etcd3)?;
            steps.push(Step::RollbackToEtcd2 {
                from: to,
                serve: to,
                to,
            });
            return Ok(steps);
        }
        let serve = self.serving(from, from, to)?;
        Ok(vec![Step::RollbackToEtcd2 { from, serve, to }])
    }

    /// The bundled release that can serve data last run by `data`: that
    /// release itself, or the newest bundled patch of its minor.
    fn serving(&self, data: Version, from: Version, to: Version) -> Result<Version, PlanError> {
        if self.bundle.contains(data) {
            return Ok(data);
        }
        self.bundle
            .newest_in(data.minor_line())
            .ok_or_else(|| PlanError::MissingMinor {
                minor: data.minor_line(),
                from,
                to,
                bundled: self.bundle.to_string(),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const E2: Storage = Storage::Etcd2;
    const E3: Storage = Storage::Etcd3;

    fn v(s: &str) -> Version {
        s.parse().expect("test version parses")
    }

    fn pair(s: &str) -> VersionPair {
        s.parse().expect("test pair parses")
    }

    fn bundle(list: &str) -> Bundle {
        Bundle::new(list.split(',').map(|s| v(s.trim())))
    }

    /// Every release Kubernetes' image ever bundled, plus 3.5.30, 3.6.10,
    /// 3.6.14 and 3.7.1.
    const FULL: &str =
        "2.2.1,2.3.7,3.0.17,3.1.20,3.2.32,3.3.25,3.4.23,3.5.1,3.5.16,3.5.30,3.6.10,3.6.14,3.7.1";
    /// What CI can fetch.
    const CI: &str = "3.3.25,3.4.23,3.5.1,3.5.16";

    fn up(from: &str, to: &str, storage: Storage) -> Step {
        Step::MinorUpgrade {
            from: v(from),
            to: v(to),
            storage,
        }
    }

    fn patch(from: &str, to: &str, storage: Storage) -> Step {
        Step::PatchUpgrade {
            from: v(from),
            to: v(to),
            storage,
        }
    }

    fn migrate(at: &str) -> Step {
        Step::StorageMigration { at: v(at) }
    }

    fn down(from: &str, serve: &str, to: &str) -> Step {
        Step::MinorRollback {
            from: v(from),
            serve: v(serve),
            to: v(to),
        }
    }

    fn downgrade(from: &str, serve: &str, to: &str) -> Step {
        Step::MinorDowngrade {
            from: v(from),
            serve: v(serve),
            to: v(to),
        }
    }

    fn to_etcd2(from: &str, serve: &str, to: &str) -> Step {
        Step::RollbackToEtcd2 {
            from: v(from),
            serve: v(serve),
            to: v(to),
        }
    }

    /// One row per (from, to, bundle): the expected steps, or the start of
    /// the expected error message.
    #[test]
    fn plan_table() {
        type Expect = Result<Vec<Step>, &'static str>;
        let rows: Vec<(&str, &str, &str, Expect)> = vec![
            // No-op and patch-only.
            ("3.5.16/etcd3", "3.5.16/etcd3", CI, Ok(vec![])),
            ("3.5.1/etcd3", "3.5.16/etcd3", CI, Ok(vec![])),
            ("3.5.16/etcd3", "3.5.1/etcd3", CI, Ok(vec![])),
            ("2.2.1/etcd2", "2.2.1/etcd2", FULL, Ok(vec![])),
            // Minor upgrades, one minor at a time, the final hop is a step.
            (
                "3.3.25/etcd3",
                "3.4.23/etcd3",
                CI,
                Ok(vec![up("3.3.25", "3.4.23", E3)]),
            ),
            (
                "3.3.25/etcd3",
                "3.5.16/etcd3",
                CI,
                Ok(vec![up("3.3.25", "3.4.23", E3), up("3.4.23", "3.5.16", E3)]),
            ),
            (
                "3.3.25/etcd3",
                "3.5.1/etcd3",
                CI,
                Ok(vec![up("3.3.25", "3.4.23", E3), up("3.4.23", "3.5.1", E3)]),
            ),
            // An older patch of the data's minor is first brought to the newest bundled patch.
            (
                "3.3.10/etcd3",
                "3.4.23/etcd3",
                CI,
                Ok(vec![
                    patch("3.3.10", "3.3.25", E3),
                    up("3.3.25", "3.4.23", E3),
                ]),
            ),
            // A data patch newer than the bundle's is not downgraded on the way up.
            (
                "3.3.27/etcd3",
                "3.4.23/etcd3",
                CI,
                Ok(vec![up("3.3.27", "3.4.23", E3)]),
            ),
            // The data's minor need not be bundled at all for an upgrade.
            (
                "3.2.32/etcd3",
                "3.3.25/etcd3",
                CI,
                Ok(vec![up("3.2.32", "3.3.25", E3)]),
            ),
            // The whole walk, v2 data all the way up.
            (
                "2.2.1/etcd2",
                "3.5.30/etcd3",
                FULL,
                Ok(vec![
                    up("2.2.1", "2.3.7", E2),
                    up("2.3.7", "3.0.17", E2),
                    migrate("3.0.17"),
                    up("3.0.17", "3.1.20", E3),
                    up("3.1.20", "3.2.32", E3),
                    up("3.2.32", "3.3.25", E3),
                    up("3.3.25", "3.4.23", E3),
                    up("3.4.23", "3.5.30", E3),
                ]),
            ),
            // Through the newest 3.5 patch to 3.6.
            (
                "3.4.23/etcd3",
                "3.6.14/etcd3",
                FULL,
                Ok(vec![up("3.4.23", "3.5.30", E3), up("3.5.30", "3.6.14", E3)]),
            ),
            (
                "3.5.16/etcd3",
                "3.6.14/etcd3",
                FULL,
                Ok(vec![
                    patch("3.5.16", "3.5.30", E3),
                    up("3.5.30", "3.6.14", E3),
                ]),
            ),
            (
                "3.5.16/etcd3",
                "3.6.14/etcd3",
                "3.5.16,3.6.14",
                Err("the path reaches 3.6 from 3.5.16, but upstream requires 3.5.26 or later"),
            ),
            // Through the newest 3.6 patch (3.6.11 or later) to 3.7.
            (
                "3.6.10/etcd3",
                "3.7.1/etcd3",
                FULL,
                Ok(vec![
                    patch("3.6.10", "3.6.14", E3),
                    up("3.6.14", "3.7.1", E3),
                ]),
            ),
            (
                "3.6.10/etcd3",
                "3.7.1/etcd3",
                "3.5.30,3.6.10,3.7.1",
                Err("the path reaches 3.7 from 3.6.10, but upstream requires 3.6.11 or later"),
            ),
            (
                "3.5.16/etcd3",
                "3.7.1/etcd3",
                FULL,
                Ok(vec![
                    patch("3.5.16", "3.5.30", E3),
                    up("3.5.30", "3.6.14", E3),
                    up("3.6.14", "3.7.1", E3),
                ]),
            ),
            (
                "3.5.30/etcd3",
                "3.7.1/etcd3",
                "3.5.30,3.7.1",
                Err("no etcd 3.6.x is bundled"),
            ),
            // The whole walk, from the oldest etcd2 data to today's release.
            (
                "2.2.1/etcd2",
                "3.7.1/etcd3",
                FULL,
                Ok(vec![
                    up("2.2.1", "2.3.7", E2),
                    up("2.3.7", "3.0.17", E2),
                    migrate("3.0.17"),
                    up("3.0.17", "3.1.20", E3),
                    up("3.1.20", "3.2.32", E3),
                    up("3.2.32", "3.3.25", E3),
                    up("3.3.25", "3.4.23", E3),
                    up("3.4.23", "3.5.30", E3),
                    up("3.5.30", "3.6.14", E3),
                    up("3.6.14", "3.7.1", E3),
                ]),
            ),
            (
                "3.7.1/etcd3",
                "3.7.1/etcd2",
                FULL,
                Err("etcd 3.7.1 has no v2 API"),
            ),
            // etcd2 storage kept on the way up.
            (
                "2.2.1/etcd2",
                "2.3.7/etcd2",
                FULL,
                Ok(vec![up("2.2.1", "2.3.7", E2)]),
            ),
            (
                "2.3.7/etcd2",
                "3.0.17/etcd2",
                FULL,
                Ok(vec![up("2.3.7", "3.0.17", E2)]),
            ),
            (
                "3.3.25/etcd2",
                "3.5.16/etcd2",
                CI,
                Ok(vec![up("3.3.25", "3.4.23", E2), up("3.4.23", "3.5.16", E2)]),
            ),
            (
                "3.5.16/etcd2",
                "3.6.14/etcd2",
                FULL,
                Err("etcd 3.6.14 has no v2 API"),
            ),
            // etcd2 -> etcd3 at the first release with `etcdctl migrate`.
            (
                "3.3.25/etcd2",
                "3.5.16/etcd3",
                CI,
                Ok(vec![
                    migrate("3.3.25"),
                    up("3.3.25", "3.4.23", E3),
                    up("3.4.23", "3.5.16", E3),
                ]),
            ),
            (
                "3.0.17/etcd2",
                "3.0.17/etcd3",
                FULL,
                Ok(vec![migrate("3.0.17")]),
            ),
            (
                "3.4.23/etcd2",
                "3.4.23/etcd3",
                CI,
                Ok(vec![migrate("3.4.23")]),
            ),
            (
                "3.3.10/etcd2",
                "3.3.25/etcd3",
                CI,
                Ok(vec![migrate("3.3.25")]),
            ),
            (
                "3.3.10/etcd2",
                "3.4.23/etcd3",
                CI,
                Ok(vec![
                    patch("3.3.10", "3.3.25", E2),
                    migrate("3.3.25"),
                    up("3.3.25", "3.4.23", E3),
                ]),
            ),
            (
                "3.5.1/etcd2",
                "3.5.16/etcd3",
                CI,
                Err("cannot convert etcd2 data at 3.5.1 to etcd3"),
            ),
            (
                "3.4.23/etcd2",
                "3.3.25/etcd3",
                CI,
                Err("rolling etcd2 data back from 3.4.23 to 3.3.25"),
            ),
            (
                "2.2.1/etcd2",
                "2.2.1/etcd3",
                FULL,
                Err("TARGET_STORAGE=etcd3 needs etcd 3.0"),
            ),
            // Minor rollbacks, chained.
            (
                "3.5.16/etcd3",
                "3.4.23/etcd3",
                CI,
                Ok(vec![down("3.5.16", "3.5.16", "3.4.23")]),
            ),
            (
                "3.5.16/etcd3",
                "3.3.25/etcd3",
                CI,
                Ok(vec![
                    down("3.5.16", "3.5.16", "3.4.23"),
                    down("3.4.23", "3.4.23", "3.3.25"),
                ]),
            ),
            // The way back through etcd's own downgrade where the pair has one
            // (3.7 -> 3.6 -> 3.5, 3.5 -> 3.4.31+), by snapshot and restore
            // where it has none (3.5 -> 3.4.30 and older, 3.4 and below).
            (
                "3.7.1/etcd3",
                "3.5.30/etcd3",
                FULL,
                Ok(vec![
                    downgrade("3.7.1", "3.7.1", "3.6.14"),
                    downgrade("3.6.14", "3.6.14", "3.5.30"),
                ]),
            ),
            (
                "3.5.30/etcd3",
                "3.4.45/etcd3",
                "3.4.45,3.5.30",
                Ok(vec![downgrade("3.5.30", "3.5.30", "3.4.45")]),
            ),
            (
                "3.5.30/etcd3",
                "3.3.25/etcd3",
                "3.3.25,3.4.23,3.4.45,3.5.30",
                Ok(vec![
                    downgrade("3.5.30", "3.5.30", "3.4.45"),
                    down("3.4.45", "3.4.45", "3.3.25"),
                ]),
            ),
            (
                "3.5.30/etcd3",
                "3.4.23/etcd3",
                "3.4.23,3.4.45,3.5.30",
                Ok(vec![down("3.5.30", "3.5.30", "3.4.23")]),
            ),
            // Data at an unbundled patch is served by the newest bundled patch of its minor.
            (
                "3.5.9/etcd3",
                "3.4.23/etcd3",
                CI,
                Ok(vec![down("3.5.9", "3.5.16", "3.4.23")]),
            ),
            (
                "3.6.14/etcd3",
                "3.0.17/etcd3",
                FULL,
                Ok(vec![
                    downgrade("3.6.14", "3.6.14", "3.5.30"),
                    down("3.5.30", "3.5.30", "3.4.23"),
                    down("3.4.23", "3.4.23", "3.3.25"),
                    down("3.3.25", "3.3.25", "3.2.32"),
                    down("3.2.32", "3.2.32", "3.1.20"),
                    down("3.1.20", "3.1.20", "3.0.17"),
                ]),
            ),
            (
                "3.5.16/etcd3",
                "3.3.25/etcd3",
                "3.3.25,3.5.16",
                Err("no etcd 3.4.x is bundled"),
            ),
            (
                "3.5.16/etcd3",
                "2.2.1/etcd3",
                FULL,
                Err("TARGET_STORAGE=etcd3 needs etcd 3.0"),
            ),
            // etcd2 rollbacks are refused.
            (
                "2.3.7/etcd2",
                "2.2.1/etcd2",
                FULL,
                Err("rolling etcd2 data back from 2.3.7 to 2.2.1"),
            ),
            (
                "3.1.20/etcd2",
                "3.0.17/etcd2",
                FULL,
                Err("rolling etcd2 data back"),
            ),
            // etcd3 -> etcd2: the Kubernetes 1.6 rollback, and same-version storage rollbacks.
            (
                "3.0.17/etcd3",
                "2.2.1/etcd2",
                FULL,
                Ok(vec![to_etcd2("3.0.17", "3.0.17", "2.2.1")]),
            ),
            (
                "3.3.25/etcd3",
                "3.3.25/etcd2",
                CI,
                Ok(vec![to_etcd2("3.3.25", "3.3.25", "3.3.25")]),
            ),
            (
                "3.5.16/etcd3",
                "3.5.16/etcd2",
                CI,
                Ok(vec![to_etcd2("3.5.16", "3.5.16", "3.5.16")]),
            ),
            (
                "3.5.16/etcd3",
                "3.3.25/etcd2",
                CI,
                Ok(vec![to_etcd2("3.5.16", "3.5.16", "3.3.25")]),
            ),
            (
                "3.3.25/etcd3",
                "3.4.23/etcd2",
                CI,
                Ok(vec![
                    up("3.3.25", "3.4.23", E3),
                    to_etcd2("3.4.23", "3.4.23", "3.4.23"),
                ]),
            ),
            (
                "3.6.14/etcd3",
                "3.6.14/etcd2",
                FULL,
                Err("etcd 3.6.14 has no v2 API"),
            ),
            (
                "3.5.16/etcd3",
                "2.2.1/etcd2",
                CI,
                Err("target etcd 2.2.1 is not bundled"),
            ),
            // Missing minors never panic and never loop.
            (
                "3.3.25/etcd3",
                "3.5.16/etcd3",
                "3.3.25,3.5.16",
                Err("no etcd 3.4.x is bundled"),
            ),
            (
                "2.2.1/etcd2",
                "3.3.25/etcd3",
                CI,
                Err("no etcd 2.3.x is bundled"),
            ),
            (
                "2.3.7/etcd2",
                "3.3.25/etcd3",
                "2.3.7,3.1.20,3.2.32,3.3.25",
                Err("no etcd 3.0.x is bundled"),
            ),
            // Unknown targets and impossible inputs.
            (
                "3.3.25/etcd3",
                "3.7.0/etcd3",
                CI,
                Err("target etcd 3.7.0 is not bundled"),
            ),
            (
                "3.3.25/etcd3",
                "3.4.99/etcd3",
                CI,
                Err("target etcd 3.4.99 is not bundled"),
            ),
            (
                "2.1.0/etcd2",
                "3.3.25/etcd3",
                CI,
                Err("etcd 2.1.0 is not supported"),
            ),
            (
                "2.4.0/etcd2",
                "3.3.25/etcd3",
                CI,
                Err("etcd 2.4.0 is not supported"),
            ),
            (
                "3.3.25/etcd3",
                "4.0.0/etcd3",
                CI,
                Err("etcd 4.0.0 is not a release"),
            ),
            (
                "3.3.25/etcd3",
                "3.5.16/etcd3",
                "",
                Err("target etcd 3.5.16 is not bundled (bundled: none)"),
            ),
        ];
        for (from, to, bundled, expect) in rows {
            let got = plan(pair(from), pair_or_raw(to), &bundle_or_empty(bundled));
            match (&got, &expect) {
                (Ok(plan), Ok(steps)) => {
                    assert_eq!(&plan.steps, steps, "{from} -> {to} with [{bundled}]")
                }
                (Err(err), Err(prefix)) => assert!(
                    err.to_string().starts_with(prefix),
                    "{from} -> {to} with [{bundled}]: error {err:?} should start with {prefix:?}"
                ),
                _ => panic!("{from} -> {to} with [{bundled}]: got {got:?}, expected {expect:?}"),
            }
        }
    }

    /// `2.2.1/etcd3` cannot be parsed, so rows that ask for it go through
    /// the planner's own check by building the pair by hand.
    fn pair_or_raw(s: &str) -> VersionPair {
        s.parse().unwrap_or_else(|_| {
            let (version, storage) = s.split_once('/').expect("row has a slash");
            VersionPair {
                version: v(version),
                storage: storage.parse().expect("row storage parses"),
            }
        })
    }

    fn bundle_or_empty(list: &str) -> Bundle {
        if list.is_empty() {
            Bundle::default()
        } else {
            bundle(list)
        }
    }

    #[test]
    fn every_supported_pair_from_2_2_1_to_3_7_plans_or_refuses_cleanly() {
        let full = bundle(FULL);
        let versions: Vec<Version> = full.versions().collect();
        for &from in &versions {
            for &to in &versions {
                for from_storage in [E2, E3] {
                    for to_storage in [E2, E3] {
                        if from_storage == E3 && from.major < 3 {
                            continue;
                        }
                        let current = VersionPair {
                            version: from,
                            storage: from_storage,
                        };
                        let target = VersionPair {
                            version: to,
                            storage: to_storage,
                        };
                        let Ok(plan) = plan(current, target, &full) else {
                            continue;
                        };
                        // Consecutive steps chain, the last lands on the target,
                        // and no step moves more than one minor.
                        let mut at = current;
                        for step in &plan.steps {
                            assert_eq!(
                                step.before().version.minor_line(),
                                at.version.minor_line(),
                                "{current} -> {target}: {step}"
                            );
                            if let Step::MinorUpgrade { from, to, .. } = step {
                                assert_eq!(from.minor_line().next(), to.minor_line(), "{step}");
                            }
                            if let Step::MinorRollback { from, to, .. } = step {
                                assert_eq!(
                                    from.minor_line().previous(),
                                    Some(to.minor_line()),
                                    "{step}"
                                );
                            }
                            for binary in step.binaries() {
                                assert!(
                                    full.contains(binary.version),
                                    "{step} needs unbundled {binary}"
                                );
                            }
                            at = step.result();
                        }
                        if !plan.steps.is_empty() {
                            assert_eq!(at, target, "{current} -> {target} ends at {at}");
                        } else {
                            assert_eq!(at.storage, target.storage);
                            assert_eq!(at.version.minor_line(), target.version.minor_line());
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn the_baseline_is_read_by_the_recorded_release_before_an_in_place_first_step() {
        let full = bundle(CI);
        let cases = [
            // (current, target, baseline reader)
            ("3.3.25/etcd3", "3.5.16/etcd3", Some("3.3.25")),
            ("3.4.23/etcd3", "3.5.16/etcd3", Some("3.4.23")),
            // 3.4.20 is not bundled: the first step's own read is the first.
            ("3.4.20/etcd3", "3.5.16/etcd3", None),
            // Rebuilding first steps read their source themselves.
            ("3.3.25/etcd2", "3.5.16/etcd3", None),
            ("3.5.16/etcd3", "3.3.25/etcd3", None),
            ("3.3.25/etcd3", "3.3.25/etcd2", None),
            // No step, no read.
            ("3.5.16/etcd3", "3.5.16/etcd3", None),
        ];
        for (current, target, want) in cases {
            let plan = plan(pair(current), pair(target), &full).expect("plans");
            let want = want.map(|v| v.parse().expect("version"));
            assert_eq!(baseline_reader(&plan, &full), want, "{current} -> {target}");
        }
    }

    #[test]
    fn the_baseline_is_read_by_hash_only_before_in_place_etcd3_steps() {
        let full = bundle(CI);
        let cases = [
            // (current, target, by hash)
            ("3.3.25/etcd3", "3.5.16/etcd3", true),
            ("3.4.23/etcd3", "3.4.23/etcd3", true),
            // A rebuilding step anywhere compares whole reads.
            ("3.3.25/etcd3", "3.4.23/etcd2", false),
            ("3.5.16/etcd3", "3.3.25/etcd3", false),
            // An etcd2 store has no hash.
            ("3.3.25/etcd2", "3.5.16/etcd3", false),
        ];
        for (current, target, want) in cases {
            let plan = plan(pair(current), pair(target), &full).expect("plans");
            assert_eq!(plan.baseline_by_hash(), want, "{current} -> {target}");
        }
    }

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

    /// What a row of the decision table expects of the plan.
    #[derive(Debug)]
    struct Decided {
        steps: usize,
        baseline: Option<&'static str>,
        backup: Option<usize>,
        work: Work,
    }

    const ONE: &str = "m=http://localhost:2380";
    const TWO: &str = "m=http://localhost:2380,n=http://10.0.0.2:2380";

    /// One row per situation: what the run decides besides the route, or
    /// the start of the refusal.
    #[test]
    fn decision_table() {
        use BackupMode::{Always, Destructive, Never};
        let record = |reason| Work::Record { reason };
        let ok = |steps, baseline, backup, work| {
            Ok(Decided {
                steps,
                baseline,
                backup,
                work,
            })
        };
        let recorded = |s: &str| DirState::Recorded(pair_or_raw(s));
        type Row = (
            DirState,
            &'static str,
            BackupMode,
            &'static str,
            Result<Decided, &'static str>,
        );
        let rows: Vec<Row> = vec![
            // The empty-dir case: record the target, if the image has it.
            (DirState::Missing, "3.5.16/etcd3", Destructive, ONE, ok(0, None, None, record("empty data dir"))),
            (DirState::Empty, "3.5.16/etcd3", Always, TWO, ok(0, None, None, record("empty data dir"))),
            (DirState::Empty, "3.4.99/etcd3", Destructive, ONE, Err("cannot start an empty data dir")),
            // Nothing to do, and a patch change recorded without a step.
            (recorded("3.5.16/etcd3"), "3.5.16/etcd3", Always, TWO, ok(0, None, None, Work::Nothing)),
            (recorded("3.5.1/etcd3"), "3.5.16/etcd3", Always, TWO, ok(0, None, None, record("patch change, no step needed"))),
            // In-place steps: a baseline, a backup only when always.
            (recorded("3.3.25/etcd3"), "3.5.16/etcd3", Destructive, ONE, ok(2, Some("3.3.25"), None, Work::Steps)),
            (recorded("3.3.25/etcd3"), "3.5.16/etcd3", Always, ONE, ok(2, Some("3.3.25"), Some(0), Work::Steps)),
            (recorded("3.3.25/etcd3"), "3.5.16/etcd3", Never, ONE, ok(2, Some("3.3.25"), None, Work::Steps)),
            (recorded("3.4.20/etcd3"), "3.5.16/etcd3", Destructive, ONE, ok(2, None, None, Work::Steps)),
            // Destructive steps: the backup before the first of them.
            (recorded("3.5.16/etcd3"), "3.3.25/etcd3", Destructive, ONE, ok(2, None, Some(0), Work::Steps)),
            (recorded("3.3.25/etcd3"), "3.4.23/etcd2", Destructive, ONE, ok(2, Some("3.3.25"), Some(1), Work::Steps)),
            (recorded("3.3.25/etcd3"), "3.4.23/etcd2", Always, ONE, ok(2, Some("3.3.25"), Some(0), Work::Steps)),
            (recorded("3.3.25/etcd3"), "3.4.23/etcd2", Never, ONE, ok(2, Some("3.3.25"), None, Work::Steps)),
            // Data from the future: no bundled etcd can serve it.
            (recorded("3.6.14/etcd3"), "3.5.16/etcd3", Destructive, ONE, Err("the data was last run by etcd 3.6.14, newer than anything this image bundles (newest: 3.5.16)")),
            (recorded("4.0.0/etcd3"), "3.5.16/etcd3", Destructive, ONE, Err("the data was last run by etcd 4.0.0, newer than any release etcd-migrate knows")),
            // No route.
            (recorded("3.3.25/etcd3"), "3.7.0/etcd3", Destructive, ONE, Err("no safe path from 3.3.25/etcd3")),
            // Steps in a multi-member cluster; without steps, no refusal.
            (recorded("3.3.25/etcd3"), "3.5.16/etcd3", Destructive, TWO, Err("INITIAL_CLUSTER lists 2 members")),
            (DirState::Missing, "3.5.16/etcd3", Destructive, TWO, ok(0, None, None, record("empty data dir"))),
        ];
        let bundle = bundle(CI);
        for (found, target, backup, initial_cluster, expect) in rows {
            let situation = Situation {
                found: found.clone(),
                target: pair(target),
                bundle: &bundle,
                backup,
                initial_cluster,
                data_members: 0,
                restart_mark: false,
                v2_request_past_snapshot: None,
            };
            let got = decide(&situation);
            let row = format!("{found:?} -> {target}, {backup:?}, {initial_cluster}");
            match (&got, &expect) {
                (Ok(plan), Ok(want)) => {
                    assert_eq!(plan.steps.len(), want.steps, "{row}");
                    assert_eq!(plan.baseline, want.baseline.map(v), "{row}");
                    assert_eq!(plan.backup, want.backup, "{row}");
                    assert_eq!(plan.work(), want.work, "{row}");
                    assert_eq!(plan.found, found, "{row}");
                }
                (Err(err), Err(prefix)) => assert!(
                    err.to_string().starts_with(prefix),
                    "{row}: refusal {err:?} should start with {prefix:?}"
                ),
                _ => panic!("{row}: got {got:?}, expected {expect:?}"),
            }
        }
    }

    /// The data's own membership decides the cluster mode: upgrades roll
    /// (whatever `--initial-cluster` says, kubeadm style or GCE style), a
    /// restart mark resumes the roll even at the target, etcd's own
    /// downgrade rolls down (3.6+), and every route with a step no cluster
    /// takes member by member (a storage change, a rollback without an
    /// online way) is one whole-cluster pause job.
    #[test]
    fn the_data_membership_decides_the_cluster_mode() {
        let (ci, full) = (bundle(CI), bundle(FULL));
        #[rustfmt::skip]
        type Row = (&'static str, &'static str, &'static str, usize, bool, Result<&'static str, &'static str>);
        let rows: Vec<Row> = vec![
            // (recorded, target, --initial-cluster, data members, mark, mode or refusal)
            ("3.3.25/etcd3", "3.5.16/etcd3", ONE, 3, false, Ok("roll 3")),
            ("3.3.25/etcd3", "3.5.16/etcd3", TWO, 3, false, Ok("roll 3")),
            ("3.3.25/etcd3", "3.4.23/etcd3", TWO, 5, false, Ok("roll 5")),
            // At the target: nothing to roll, unless a restart is unrecorded.
            ("3.5.16/etcd3", "3.5.16/etcd3", TWO, 3, false, Ok("none")),
            ("3.4.23/etcd3", "3.4.23/etcd3", TWO, 3, true, Ok("roll 3")),
            // A patch change needs no step: recorded, as for one member.
            ("3.5.1/etcd3", "3.5.16/etcd3", TWO, 3, false, Ok("none")),
            // Rollbacks etcd has no online way for: one pause job.
            ("3.5.16/etcd3", "3.4.23/etcd3", TWO, 3, false, Ok("pause 3")),
            ("3.4.23/etcd3", "3.3.25/etcd3", TWO, 5, false, Ok("pause 5")),
            // A storage change, either way: one pause job.
            ("3.3.25/etcd2", "3.3.25/etcd3", TWO, 3, false, Ok("pause 3")),
            ("3.3.25/etcd3", "3.4.23/etcd2", TWO, 3, false, Ok("pause 3")),
            // One member in the data: --initial-cluster still refuses steps.
            (
                "3.3.25/etcd3",
                "3.5.16/etcd3",
                TWO,
                1,
                false,
                Err("INITIAL_CLUSTER lists 2 members"),
            ),
            ("3.3.25/etcd3", "3.5.16/etcd3", ONE, 1, false, Ok("none")),
        ];
        // With the releases no registry has: etcd's downgrade rolls down
        // from 3.6 on; a route that also needs a rollback is one job.
        let extra_rows: Vec<Row> = vec![
            ("3.7.1/etcd3", "3.6.14/etcd3", TWO, 3, false, Ok("roll 3")),
            ("3.6.14/etcd3", "3.5.30/etcd3", TWO, 3, false, Ok("roll 3")),
            ("3.6.14/etcd3", "3.4.23/etcd3", TWO, 3, false, Ok("pause 3")),
            // A cluster below 3.3 cannot run a pause job (MoveLeader):
            // it rolls to 3.3 with its storage kept, then pauses.
            (
                "2.3.7/etcd2",
                "3.5.30/etcd3",
                TWO,
                3,
                false,
                Ok("roll 3 to 3.3.25/etcd2, then pause to 3.5.30/etcd3"),
            ),
            (
                "3.0.17/etcd2",
                "3.3.25/etcd3",
                TWO,
                3,
                false,
                Ok("roll 3 to 3.3.25/etcd2, then pause to 3.3.25/etcd3"),
            ),
            (
                "3.1.20/etcd3",
                "3.4.23/etcd2",
                TWO,
                3,
                false,
                Ok("roll 3 to 3.3.25/etcd3, then pause to 3.4.23/etcd2"),
            ),
            // ... unless its target is below 3.3 too: the job, where the
            // cluster is at 3.1 or 3.2 (the leader carries the data) ...
            ("3.2.32/etcd3", "3.1.20/etcd3", TWO, 3, false, Ok("pause 3")),
            ("3.1.20/etcd2", "3.2.32/etcd3", TWO, 3, false, Ok("pause 3")),
            // ... etcd2 data below 3.1 to 3.1 or 3.2 rolls to the target's
            // release with its storage kept, then migrates in the job ...
            (
                "2.3.7/etcd2",
                "3.2.32/etcd3",
                TWO,
                3,
                false,
                Ok("roll 3 to 3.2.32/etcd2, then pause to 3.2.32/etcd3"),
            ),
            // ... and below 3.1 there is no job (it waits, saying so).
            ("2.3.7/etcd2", "3.0.17/etcd3", TWO, 3, false, Ok("pause 3")),
        ];
        // 3.5 to a 3.4 that joins a 3.5 cluster (3.4.32+) rolls by
        // restarts; an older 3.4 patch takes a pause job.
        let fours = bundle("3.4.23,3.4.31,3.4.45,3.5.16,3.5.30");
        let fours_rows: Vec<Row> = vec![
            ("3.5.16/etcd3", "3.4.45/etcd3", TWO, 3, false, Ok("roll 3")),
            ("3.5.30/etcd3", "3.4.45/etcd3", ONE, 5, false, Ok("roll 5")),
            ("3.5.16/etcd3", "3.4.31/etcd3", TWO, 3, false, Ok("pause 3")),
            ("3.5.16/etcd3", "3.4.23/etcd3", TWO, 3, false, Ok("pause 3")),
        ];
        let all = rows
            .into_iter()
            .map(|row| (row, &ci))
            .chain(extra_rows.into_iter().map(|row| (row, &full)))
            .chain(fours_rows.into_iter().map(|row| (row, &fours)));
        for ((recorded, target, initial_cluster, data_members, restart_mark, expect), bundle) in all
        {
            let situation = Situation {
                found: DirState::Recorded(pair(recorded)),
                target: pair(target),
                bundle,
                backup: BackupMode::Destructive,
                initial_cluster,
                data_members,
                restart_mark,
                v2_request_past_snapshot: None,
            };
            let row = format!("{recorded} -> {target}, {initial_cluster}, {data_members} members, mark {restart_mark}");
            match (decide(&situation), expect) {
                (Ok(plan), Ok(mode)) => {
                    let got = match (plan.pause, plan.cluster, plan.then_pause) {
                        (Some(n), _, _) => format!("pause {n}"),
                        (None, Some(n), Some(then)) => {
                            format!("roll {n} to {}, then pause to {then}", plan.target)
                        }
                        (None, Some(n), None) => format!("roll {n}"),
                        (None, None, _) => "none".to_string(),
                    };
                    assert_eq!(got, mode, "{row}");
                    if let Some(then) = plan.then_pause {
                        let shown = plan.to_string();
                        let says = format!(
                            "then: the whole-cluster pause job from {} to {then}",
                            plan.target
                        );
                        assert!(shown.contains(&says), "{row}: {shown}");
                    }
                    if plan.pause.is_some() {
                        assert_eq!(
                            plan.backup, None,
                            "{row}: the converter backs up before its force"
                        );
                        assert!(!plan.steps.is_empty(), "{row}: the converter's route");
                    }
                    if plan.cluster.is_some() {
                        assert_eq!(plan.backup, None, "{row}: a roll takes no backup");
                        // Unless --backup=always asks for one.
                        let always = decide(&Situation {
                            backup: BackupMode::Always,
                            ..situation
                        })
                        .expect("plans");
                        let rolls =
                            !always.steps.is_empty() && always.steps.iter().all(Step::is_upgrade);
                        assert_eq!(always.backup, rolls.then_some(0), "{row}: --backup=always");
                    }
                }
                (Err(err), Err(prefix)) => {
                    assert!(err.to_string().starts_with(prefix), "{row}: {err}")
                }
                (got, expect) => panic!("{row}: got {got:?}, expected {expect:?}"),
            }
        }
    }

    #[test]
    fn the_plan_shows_every_decision() {
        let bundle = bundle(CI);
        let situation = Situation {
            found: DirState::Recorded(pair("3.3.25/etcd3")),
            target: pair("3.4.23/etcd2"),
            bundle: &bundle,
            backup: BackupMode::Destructive,
            initial_cluster: ONE,
            data_members: 0,
            restart_mark: false,
            v2_request_past_snapshot: None,
        };
        let member = Member {
            name: "data-name".to_string(),
            client_port: 18629,
            listen_peer_urls: "http://localhost:2380".to_string(),
            initial_advertise_peer_urls: "http://localhost:2380".to_string(),
            initial_cluster: "data-name=http://localhost:2380".to_string(),
            initial_cluster_token: "etcd-cluster".to_string(),
            extra_args: Vec::new(),
        };
        let site = Site {
            data_dir: "/var/etcd/data".into(),
            bin_dir: "/bin".into(),
            member,
            configured_name: "m".to_string(),
            backup_root: "/var/etcd/data.backup".into(),
            backup_keep: 3,
            interrupted: true,
        };
        let shown = decide(&situation).expect("plans").at(site).to_string();
        let lines: Vec<&str> = shown.lines().collect();
        assert_eq!(
            lines,
            [
                "member: data-name (as the data records it; the configuration says m)",
                "data dir /var/etcd/data: 3.3.25/etcd3; target 3.4.23/etcd2",
                "an interrupted step left a scratch dir; a real run first finishes its swap (if it happened) or discards it",
                "step 1/2: minor-upgrade 3.3.25/etcd3 -> 3.4.23/etcd3; runs /bin/etcd-3.4.23; client http://127.0.0.1:18629; peer http://localhost:2380",
                "step 2/2: rollback-to-etcd2 3.4.23/etcd3 -> 3.4.23/etcd2; runs /bin/etcd-3.4.23 + /bin/etcd-3.4.23; client http://127.0.0.1:18629; peer http://localhost:2380",
                "baseline: /bin/etcd-3.3.25 serves the data as recorded once before step 1, to fingerprint it by reading it whole",
                "backup: before rollback-to-etcd2 3.4.23/etcd3 -> 3.4.23/etcd2, into /var/etcd/data.backup/<time>-3.4.23-etcd3 (keeping 3)",
                "then: exec /bin/etcd-3.4.23 (or exit 0 with --no-exec)",
            ]
        );
    }

    #[test]
    fn plan_lists_each_binary_once() {
        let plan = plan(pair("3.5.16/etcd3"), pair("3.3.25/etcd3"), &bundle(CI)).expect("plans");
        let names: Vec<String> = plan.binaries().iter().map(Binary::to_string).collect();
        assert_eq!(
            names,
            [
                "etcd-3.3.25",
                "etcdctl-3.3.25",
                "etcd-3.4.23",
                "etcdctl-3.4.23",
                "etcd-3.5.16",
                "etcdctl-3.5.16"
            ]
        );
    }

    /// etcd 3.7 panics replaying a v2 request (written by 3.5 or older)
    /// past the WAL's newest snapshot: it must never be the first etcd to
    /// start on such data. A baseline read or a step of the data's own
    /// minor runs first (with a snapshot after every entry) and readies it.
    #[test]
    fn release_3_7_is_never_the_first_start_on_a_wal_it_cannot_replay() {
        let decide_with = |recorded: &str, bundled: &str, blocked: Option<u64>| {
            decide(&Situation {
                found: DirState::Recorded(pair(recorded)),
                target: pair("3.7.1/etcd3"),
                bundle: &bundle(bundled),
                backup: BackupMode::Destructive,
                initial_cluster: "",
                data_members: 1,
                restart_mark: false,
                v2_request_past_snapshot: blocked,
            })
        };
        let refused = decide_with("3.6.12/etcd3", "3.6.11,3.7.1", Some(42))
            .expect_err("3.7.1 would start first");
        assert!(
            refused.to_string().contains("raft index 42")
                && refused.to_string().contains("bundle etcd 3.6.12"),
            "{refused}"
        );
        assert!(decide_with("3.6.12/etcd3", "3.6.11,3.7.1", None).is_ok());
        let baseline =
            decide_with("3.6.12/etcd3", "3.6.12,3.7.1", Some(42)).expect("the baseline readies it");
        assert_eq!(baseline.baseline, Some(v("3.6.12")));
        let patch = decide_with("3.6.12/etcd3", "3.6.14,3.7.1", Some(42))
            .expect("the patch step readies it");
        assert_eq!(patch.steps.len(), 2);
    }
}
