//! This module owns the seam between the steps and the world: the small
//! traits through which every step kind starts etcd (`Launcher`,
//! `RunningEtcd`), talks to its API (`EtcdApi`: the health write, the
//! keyspace reads, the v2 writes and deletes, the leased puts), runs the
//! offline tools (`Tools`) and records progress (`Progress`), and the
//! `StepError` a step fails with. The disk work (backup, scratch dir, swap)
//! goes through `swap::Disk`. The real implementations live in `etcd`,
//! `health`, `swap` and `lib`; the fakes live in the tests.

use std::collections::BTreeMap;
use std::future::Future;
use std::path::Path;
use std::time::Duration;

use crate::backup;
use crate::binaries::BinError;
use crate::datadir::DataDirError;
use crate::dialect::StepEtcd;
use crate::keyspace::{Entry, Fingerprint, KnownLeases, Ours, Read};
use crate::plan::Binary;
use crate::supervisor::{ExitStatus, SupervisorError};
use crate::swap::SwapError;
use crate::version::{Minor, Storage, Version, VersionPair};

/// Starts a step's etcd.
pub trait Launcher {
    /// The running process.
    type Etcd: RunningEtcd;
    /// Starts etcd as `spec` says.
    fn launch(&self, spec: &StepEtcd<'_>) -> Result<Self::Etcd, StepError>;
    /// The hidden v2 nodes (names starting with `_`) the data in
    /// `data_dir` records, read offline before an etcd starts on it: the
    /// v2 API lists none of them, so the reads must ask for each.
    fn hidden_v2_paths(&self, data_dir: &Path) -> Vec<String>;
    /// A rebuilt copy replaced the data in `data_dir`: what was read of it
    /// before (its hidden v2 nodes) is read again.
    fn data_replaced(&self, data_dir: &Path) {
        let _ = data_dir;
    }
    /// The TTL each lease of the data in `data_dir` was granted (lease id →
    /// seconds), read offline while no etcd runs on it; `Ok(None)` where
    /// the data holds no lease table (no bolt database). For a release
    /// that cannot tell a lease's TTL (3.0 has no LeaseTimeToLive), read
    /// just before it starts on the data.
    fn granted_leases(&self, data_dir: &Path) -> Result<Option<BTreeMap<i64, i64>>, String>;
    /// Proves that the binary of `version` is that release, where the run
    /// put its check off until it would first run (the recorded release
    /// when the baseline is taken offline: it runs only if that falls back
    /// to a start). Nothing for a release checked before the first step.
    fn check_before_launch(&self, version: Version) -> impl Future<Output = Result<(), BinError>> {
        let _ = version;
        async { Ok(()) }
    }
}

/// A step's running etcd.
pub trait RunningEtcd {
    /// Its pid, for logs and errors.
    fn pid(&self) -> i32;
    /// Resolves when it has exited; callable again afterwards.
    fn wait(&mut self) -> impl Future<Output = ExitStatus>;
    /// SIGTERM, grace, SIGKILL, reap. Returns the status and whether
    /// SIGKILL was needed.
    fn stop(&mut self) -> impl Future<Output = Result<(ExitStatus, bool), SupervisorError>>;
    /// Its last lines of output, for error reports.
    fn recent_output(&mut self) -> Vec<String>;
    /// Proves that this process holds the socket listening on loopback
    /// `port`: then every call to that port reaches it, and none reached
    /// another process that took the port first (etcd binds at start and
    /// exits if it cannot). `Err` names the holder, if one is found.
    fn owns_listener(&self, port: u16) -> Result<(), String>;
}

/// What a step's etcd must report on `/version` once it has taken a
/// write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Expected {
    /// The release: the server must be it.
    pub release: Version,
    /// The lowest minor the data's cluster (and, 3.6+, storage) version may
    /// show: the release's own, or, while the data is being walked down by
    /// etcd's downgrade, the downgrade's target.
    pub lowest: Minor,
}

impl Expected {
    /// `release`, on data at its own minor.
    pub fn release(release: Version) -> Self {
        Expected {
            release,
            lowest: release.minor_line(),
        }
    }
}

/// Why one health attempt failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HealthError {
    /// Not yet: etcd is starting, electing, or the attempt timed out. The
    /// next attempt may succeed.
    #[error("{0}")]
    NotYet(String),
    /// The health key is written (and removed), but `/version` does not
    /// report what the step expects yet (etcd raises the cluster version a
    /// moment after it takes writes). What is left is to ask `/version`
    /// again ([`EtcdApi::versions`]), never to write again: each write
    /// would move the revision on and, on a step's etcd that snapshots
    /// after every entry, write a snapshot.
    #[error("{0}")]
    Written(String),
    /// Never, on this data as it is: etcd answered, and its answer shows a
    /// condition no retry clears (an alarm raised in the data). Carries what
    /// etcd said and what the operator must do.
    #[error("{reason}; {remedy}")]
    Refused {
        /// What etcd reported.
        reason: String,
        /// What to do about it.
        remedy: String,
    },
}

/// A step's etcd API: the health write, and every read and write a step
/// makes on the keyspace it serves. Errors are the API's own words, which
/// name the endpoint's URL and the key.
pub trait EtcdApi {
    /// Why a call failed. It names its subject (endpoint, key, lease,
    /// revision); a step's error keeps it, with its causes, as text.
    type Error: std::error::Error + Into<String>;

    /// Checks the data's alarms (where the API has them) and writes the
    /// health key once; then `/version` must report what `expected` says
    /// (`HealthError::Written` if the write is done but it does not yet).
    fn write(
        &self,
        endpoint: &str,
        storage: Storage,
        expected: Expected,
    ) -> impl Future<Output = Result<(), HealthError>>;

    /// `/version` reports what `expected` says: the release, the cluster
    /// version at its minor (3.6+: the storage version too). Asked after
    /// a write that returned `HealthError::Written`.
    fn versions(
        &self,
        endpoint: &str,
        expected: Expected,
    ) -> impl Future<Output = Result<(), HealthError>>;

    /// Has the cluster `endpoint` serves downgrade to `target`'s minor
    /// (etcd's `downgrade validate`, then `downgrade enable`; one already
    /// enabled to that minor counts as done).
    fn enable_downgrade(
        &self,
        endpoint: &str,
        target: Minor,
    ) -> impl Future<Output = Result<(), Self::Error>>;

    /// Whether the data `endpoint` serves is down at `target` (its cluster
    /// version, and on 3.6+ its storage version too).
    fn downgraded(
        &self,
        endpoint: &str,
        target: Minor,
    ) -> impl Future<Output = Result<bool, Self::Error>>;

    /// Ends the downgrade job of the cluster `endpoint` serves once its
    /// members run the target (etcd's `downgrade cancel`, which a leader
    /// also does by itself after a while); a release without the job
    /// (3.4) or without one under way is done already.
    fn finish_downgrade(&self, endpoint: &str) -> impl Future<Output = Result<(), Self::Error>>;

    /// Reads the whole keyspace of data `served` (the serving release and
    /// the data's storage) through its storage's API, and its other store
    /// where the release serves that API (and the hidden v2 nodes named in
    /// `hidden`), and fingerprints it; `known` holds the leases' TTLs where
    /// the release cannot tell them (3.0).
    fn fingerprint(
        &self,
        endpoint: &str,
        served: VersionPair,
        hidden: &[String],
        known: &KnownLeases,
    ) -> impl Future<Output = Result<Fingerprint, Self::Error>>;

    /// [`EtcdApi::fingerprint`], proven against `before` (the last step's
    /// read) by etcd's own hash where the release has one, instead of
    /// reading the whole keyspace (see `keyspace::read_fingerprint_since`).
    fn fingerprint_since(
        &self,
        endpoint: &str,
        served: VersionPair,
        hidden: &[String],
        known: &KnownLeases,
        before: Option<&Fingerprint>,
    ) -> impl Future<Output = Result<Fingerprint, Self::Error>> {
        let _ = before;
        self.fingerprint(endpoint, served, hidden, known)
    }

    /// etcd3 data: the fingerprint by etcd's own hash, without reading the
    /// keyspace (see `keyspace::read_fingerprint_by_hash`); `None` where
    /// the release has no hash (the caller reads it whole). The default
    /// has none.
    fn fingerprint_by_hash(
        &self,
        endpoint: &str,
        hidden: &[String],
    ) -> impl Future<Output = Result<Option<Fingerprint>, Self::Error>> {
        let _ = (endpoint, hidden);
        std::future::ready(Ok(None))
    }

    /// Reads every entry of data `served` through its storage's API (and
    /// the data's other store, see [`EtcdApi::fingerprint`]), this run's
    /// health keys left out, and fingerprints it.
    fn read_all(
        &self,
        endpoint: &str,
        served: VersionPair,
        hidden: &[String],
        known: &KnownLeases,
    ) -> impl Future<Output = Result<Read, Self::Error>>;

    /// Reads the v2 store (`None` where the release serves no v2 API).
    fn read_v2(
        &self,
        endpoint: &str,
        hidden: &[String],
    ) -> impl Future<Output = Result<Option<Vec<Entry>>, Self::Error>>;

    /// Writes `entries` through the v2 API, each with its TTL.
    fn write_all_v2(
        &self,
        endpoint: &str,
        entries: &[Entry],
    ) -> impl Future<Output = Result<(), Self::Error>>;

    /// Removes every top-level v2 node (and the hidden ones named);
    /// returns how many were removed.
    fn delete_v2_tree(
        &self,
        endpoint: &str,
        hidden: &[String],
    ) -> impl Future<Output = Result<usize, Self::Error>>;

    /// Grants one lease per group of `plan` and re-puts its keys under it,
    /// puts `put_back` as given (key, value, lease id: the hidden keys
    /// `etcdctl migrate` skipped, the v3 keys it may have overwritten),
    /// deletes the expired keys and this run's health keys; returns the
    /// leases granted.
    fn apply_leases(
        &self,
        endpoint: &str,
        plan: &LeasePlan,
        put_back: &[Entry],
    ) -> impl Future<Output = Result<KnownLeases, Self::Error>>;

    /// Compacts the v3 history of the data `endpoint` serves at its
    /// current revision, physically (old revisions and deletions'
    /// tombstones gone, every live key as it is); returns that revision.
    fn compact_history(&self, endpoint: &str) -> impl Future<Output = Result<i64, Self::Error>>;

    /// What the health writes of this run put into the keyspace, for the
    /// reads to leave out.
    fn ours(&self) -> Ours;
}

/// Which keys get which lease.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct LeasePlan {
    /// Lease TTL in seconds → the keys (and values) under it.
    pub groups: BTreeMap<i64, Vec<Entry>>,
    /// Keys whose TTL ran out: deleted from v3, not carried over.
    pub expired: Vec<String>,
}

impl LeasePlan {
    /// Every key the plan puts under a lease.
    pub fn leased_keys(&self) -> std::collections::BTreeSet<&[u8]> {
        self.groups
            .values()
            .flatten()
            .map(|e| e.key.as_slice())
            .collect()
    }
}

/// Runs the offline tools of a release (`etcdctl`, `etcdutl`).
pub trait Tools {
    /// Runs `binary` with `args` (and `env`) to completion. Dropping the
    /// future stops the tool.
    fn run(
        &self,
        binary: Binary,
        args: &[String],
        env: &[(&str, &str)],
    ) -> impl Future<Output = Result<(), StepError>>;
}

/// Where completed steps are recorded.
pub trait Progress {
    /// Durably records that the data is now at `pair`.
    fn record(&mut self, pair: VersionPair) -> Result<(), DataDirError>;
}

/// Why one step failed.
#[derive(Debug, thiserror::Error)]
pub enum StepError {
    /// The baseline being hashed offline while the step's etcd started
    /// could not be finished (the executor then reads it by a start).
    #[error("the baseline could not be taken offline while etcd {version} started: {reason}")]
    OfflineBaselineLost {
        /// The step's release.
        version: Version,
        /// Why.
        reason: String,
    },
    /// etcd could not be started.
    #[error("cannot start etcd {version}")]
    Launch {
        /// The release.
        version: Version,
        /// Why.
        #[source]
        source: SupervisorError,
    },
    /// etcd exited before it accepted a write.
    #[error("etcd {version} (pid {pid}) exited with {status} before the step's work was done; its last output:\n{output}")]
    ExitedEarly {
        /// The release.
        version: Version,
        /// Its pid.
        pid: i32,
        /// How it ended.
        status: ExitStatus,
        /// Its last lines.
        output: String,
    },
    /// etcd answered, but refuses writes on this data until the operator
    /// acts (e.g. a NOSPACE alarm raised before the migration).
    #[error("etcd {version} (pid {pid}) serves the data but refuses writes: {reason}; it was stopped and nothing was recorded; {remedy}")]
    Refused {
        /// The release.
        version: Version,
        /// Its pid.
        pid: i32,
        /// What etcd reported.
        reason: String,
        /// What to do.
        remedy: String,
    },
    /// What answered on the step's client port is not the etcd we started
    /// (another process took the port first).
    #[error("the etcd answering on {endpoint} is not etcd {version} (pid {pid}) that etcd-migrate started on the data: {holder}; nothing it said was used; stop whatever else listens there, or give the steps another loopback port with --port, and rerun")]
    NotOurs {
        /// The release we started.
        version: Version,
        /// Its pid.
        pid: i32,
        /// The step's client URL.
        endpoint: String,
        /// Who holds the port, as far as /proc tells.
        holder: String,
    },
    /// etcd never accepted a write before the deadline.
    #[error("etcd {version} (pid {pid}) did not accept a write within {waited:?} (last attempt: {last_error}); it was stopped; its last output:\n{output}")]
    HealthTimeout {
        /// The release.
        version: Version,
        /// Its pid.
        pid: i32,
        /// The deadline.
        waited: Duration,
        /// The last failed attempt.
        last_error: String,
        /// Its last lines.
        output: String,
    },
    /// etcd could not be stopped.
    #[error("cannot stop etcd {version}")]
    Stop {
        /// The release.
        version: Version,
        /// Why.
        #[source]
        source: SupervisorError,
    },
    /// An offline tool failed.
    #[error("{binary} {args} failed with {status}; its last output:\n{output}")]
    Tool {
        /// The tool.
        binary: Binary,
        /// Its arguments, for the operator to rerun by hand.
        args: String,
        /// How it ended.
        status: ExitStatus,
        /// Its last lines.
        output: String,
    },
    /// A piece of the step's work failed (a read, a copy, a check).
    #[error("{what}: {detail}")]
    Work {
        /// What was being done.
        what: String,
        /// What went wrong.
        detail: String,
    },
    /// The work did not finish in time.
    #[error("{what} did not finish within {waited:?}; it was stopped")]
    WorkTimeout {
        /// What was being done.
        what: String,
        /// The deadline.
        waited: Duration,
    },
    /// The keyspace after the step is not the one before it.
    #[error("the keyspace etcd {version} serves after the step is not the one before it ({detail}); the step was not recorded; do not serve this data until the difference is understood: a rebuilding step left the data untouched, but an in-place step ran etcd {version} on it, so compare it with a backup (take one with --backup always before rerunning)")]
    Changed {
        /// The release that served the result.
        version: Version,
        /// Both fingerprints and what differs.
        detail: String,
    },
    /// The data's v2 store holds keys, and the step's release serves no v2
    /// store (3.6 refuses to start on custom v2 content).
    #[error("the data's v2 store holds {keys} keys (e.g. {sample:?}), and etcd {version} has no v2 store to hold them (it refuses to start on such data); nothing was run; move what they hold into the v3 keyspace (or delete them: ETCDCTL_API=2 etcdctl rm, with an etcd of {last} serving the data), check with `etcdutl check v2store`, then rerun")]
    V2KeysUnsupported {
        /// The release without a v2 store.
        version: Version,
        /// The release that served the data last.
        last: Version,
        /// How many v2 keys.
        keys: usize,
        /// Some of them.
        sample: Vec<String>,
    },
    /// A binary whose check was put off until it would run is not the
    /// release its name claims, or could not be checked.
    #[error(transparent)]
    Binary(BinError),
    /// The scratch dir or the member swap failed.
    #[error(transparent)]
    Swap(#[from] SwapError),
    /// The backup before a destructive step failed.
    #[error("cannot back up the data dir before a step that rewrites it")]
    Backup(#[source] backup::BackupError),
    /// The step worked but could not be recorded.
    #[error("etcd {} ran on the data but {} could not be recorded", .pair.version, .pair)]
    Record {
        /// What should have been recorded.
        pair: VersionPair,
        /// Why it was not.
        #[source]
        source: DataDirError,
    },
}

impl StepError {
    /// Why the offline baseline was lost, for this failure only.
    pub fn offline_baseline_lost(&self) -> Option<&str> {
        match self {
            StepError::OfflineBaselineLost { reason, .. } => Some(reason),
            _ => None,
        }
    }
}

/// The error the test fakes of [`EtcdApi`] give: their message.
#[cfg(test)]
#[derive(Debug)]
pub(crate) struct FakeError(pub String);

#[cfg(test)]
impl std::fmt::Display for FakeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
impl std::error::Error for FakeError {}

#[cfg(test)]
impl From<String> for FakeError {
    fn from(message: String) -> Self {
        FakeError(message)
    }
}

#[cfg(test)]
impl From<FakeError> for String {
    fn from(err: FakeError) -> String {
        err.0
    }
}
