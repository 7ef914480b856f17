//! This module owns the migration plan: the pure function `plan()` that turns
//! (what the data dir holds, what the user asked for, what the image bundles)
//! into an ordered list of steps, or a reason why no safe path exists. No
//! clock, filesystem, process or network is touched here, so every supported
//! and rejected combination is one row in the table test below.

use std::collections::BTreeSet;
use std::fmt;

use crate::version::{Minor, Storage, Version, VersionPair};

/// The oldest minor line this tool can read (the Kubernetes image started
/// at 2.2.1).
pub const OLDEST_MINOR: Minor = Minor::new(2, 2);

/// The 3.5 patch upstream requires before 3.6: older 3.5 patches can leave
/// "zombie members" that 3.6 trips over (etcd blog, "zombie members"; the
/// fix syncs the v2 and v3 membership stores).
pub const MIN_3_5_BEFORE_3_6: Version = Version::new(3, 5, 26);

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

/// The ordered work from the recorded state to the target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// What `version.txt` says now.
    pub current: VersionPair,
    /// What the user asked for.
    pub target: VersionPair,
    /// The steps, in order; empty for a no-op or a patch-only change.
    pub steps: Vec<Step>,
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
    /// 3.6 needs a recent 3.5 patch to have run first.
    #[error("the path reaches 3.6 from {have}, but upstream requires {need} or later before 3.6 (zombie-member fix); bundle etcd {need} or newer")]
    Stale35Before36 {
        /// The 3.5 release the path would leave from.
        have: Version,
        /// [`MIN_3_5_BEFORE_3_6`].
        need: Version,
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
            Step::MinorRollback { to, .. } => VersionPair {
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
            Step::RollbackToEtcd2 { serve, to, .. } => vec![Binary::etcd(serve), Binary::etcd(to)],
        }
    }

    /// True for steps that rewrite the data rather than run a newer etcd
    /// on it; a backup is taken before the first of them.
    pub fn is_destructive(&self) -> bool {
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
            Step::MinorRollback { from, .. } | Step::RollbackToEtcd2 { from, .. } => VersionPair {
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

    /// Every binary the plan needs, each once, in a stable order.
    pub fn binaries(&self) -> Vec<Binary> {
        let set: BTreeSet<Binary> = self.steps.iter().flat_map(Step::binaries).collect();
        set.into_iter().collect()
    }
}

/// Computes the path from `current` to `target` using only releases in
/// `bundle`. Pure: the same inputs always give the same plan or error.
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
    Ok(Plan {
        current,
        target,
        steps,
    })
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
            if prev.minor_line() == Minor::new(3, 5)
                && next.minor_line() == Minor::new(3, 6)
                && prev < MIN_3_5_BEFORE_3_6
            {
                return Err(PlanError::Stale35Before36 {
                    have: prev,
                    need: MIN_3_5_BEFORE_3_6,
                });
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
    /// patch of each minor in between.
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
            steps.push(Step::MinorRollback {
                from: prev,
                serve,
                to: next,
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

    /// Every release Kubernetes' image ever bundled, plus 3.5.30 and 3.6.5.
    const FULL: &str = "2.2.1,2.3.7,3.0.17,3.1.20,3.2.32,3.3.25,3.4.23,3.5.1,3.5.16,3.5.30,3.6.5";
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
                "3.6.5/etcd3",
                FULL,
                Ok(vec![up("3.4.23", "3.5.30", E3), up("3.5.30", "3.6.5", E3)]),
            ),
            (
                "3.5.16/etcd3",
                "3.6.5/etcd3",
                FULL,
                Ok(vec![
                    patch("3.5.16", "3.5.30", E3),
                    up("3.5.30", "3.6.5", E3),
                ]),
            ),
            (
                "3.5.16/etcd3",
                "3.6.5/etcd3",
                "3.5.16,3.6.5",
                Err("the path reaches 3.6 from 3.5.16"),
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
                "3.6.5/etcd2",
                FULL,
                Err("etcd 3.6.5 has no v2 API"),
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
            // Data at an unbundled patch is served by the newest bundled patch of its minor.
            (
                "3.5.9/etcd3",
                "3.4.23/etcd3",
                CI,
                Ok(vec![down("3.5.9", "3.5.16", "3.4.23")]),
            ),
            (
                "3.6.5/etcd3",
                "3.0.17/etcd3",
                FULL,
                Ok(vec![
                    down("3.6.5", "3.6.5", "3.5.30"),
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
                "3.6.5/etcd3",
                "3.6.5/etcd2",
                FULL,
                Err("etcd 3.6.5 has no v2 API"),
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
    fn every_supported_pair_from_2_2_1_to_3_6_plans_or_refuses_cleanly() {
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
}
