//! This module owns the named failpoints: the places where the crash tests
//! make etcd-migrate die, and the list of them all. They exist only in a
//! build with the `failpoints` cargo feature (the `fail` crate, configured
//! by the `FAILPOINTS` environment variable); in any other build
//! `failpoint!` expands to nothing.
//!
//! The action that matters is `return`: it SIGKILLs the process on the
//! spot, as a power cut or an OOM kill would, with no destructor, no flush
//! and no signal handler run. `1*off->return` dies at the second pass,
//! `sleep(ms)` holds the run there, `panic` panics. With
//! `ETCD_MIGRATE_FAILPOINT_TRACE=1` every pass is logged, so a test can
//! learn which points a run meets, in order, and then die at each.

/// Every failpoint in the code. A unit test checks this list against the
/// `failpoint!` calls in the sources, both ways, so the crash tests can
/// tell failpoints exercised from failpoints defined.
pub const ALL: &[&str] = &[
    // executor: the read of the data before the first step
    "baseline-read",
    // ondisk: the offline baseline's walk of the key bucket, done (on its
    // own thread, beside the first step's etcd start)
    "offline-baseline-walked",
    // etcd: a step's etcd
    "etcd-before-spawn",
    "etcd-after-spawn",
    // executor: each step
    "step-after-health-write",
    "step-after-fingerprint",
    "step-after-stop",
    "step-after-record",
    // datadir: version.txt
    "version-txt-after-temp-write",
    "version-txt-after-fsync",
    "version-txt-after-rename",
    // backup
    "backup-after-first-file",
    "backup-before-publish",
    "backup-after-publish",
    // rebuild: etcd2 -> etcd3
    "migration-after-v2-read",
    "migration-after-copy",
    "migration-after-etcdctl-migrate",
    "migration-after-leases",
    "migration-after-verify",
    "migration-after-v2-emptied",
    // rebuild: 3.x -> 3.(x-1)
    "rollback-after-snapshot-save",
    "rollback-after-restore",
    "rollback-after-restored-served",
    // rebuild: etcd3 -> etcd2
    "etcd2-rollback-after-v3-read",
    "etcd2-rollback-after-v2-write",
    "etcd2-rollback-after-verify",
    // rebuild: the swap of member dirs
    "swap-after-journal",
    "swap-after-exchange",
    // rebuild: the clean-up after a rebuilding step is recorded
    "finish-after-mark-removed",
    // rebuild: finishing an interrupted swap on the next start
    "recover-after-record",
    // cluster: the lock holder's restart into the next release
    "cluster-after-lock",
    "cluster-after-stop",
    "cluster-after-start",
    "cluster-after-record",
    // pause job: a joiner holding the converted cluster's lock, before
    // its member add (e2e/cluster_roll.rs holds it there while the
    // converter is killed)
    "pause-join-after-lock",
    // pause job: a joiner added to the converted cluster, before its etcd
    // starts (e2e/cluster_roll.rs holds it there while the converter's
    // etcd is stopped, so that etcd finds no cluster to join)
    "pause-join-before-etcd",
    // pause job: a joiner's etcd started, before its proof (e2e/cluster_roll.rs
    // holds it there while it kills that etcd)
    "pause-join-before-proof",
    // restore: a snapshot restored into the scratch dir, then swapped in
    // (e2e/restores.rs kills there)
    "restore-after-tool",
    "restore-after-swap",
    // lib: the end of the run
    "before-exec",
];

/// Marks a named point where a test may make the process die. The name
/// must be in [`ALL`].
#[cfg(feature = "failpoints")]
#[macro_export]
macro_rules! failpoint {
    ($name:literal) => {
        $crate::failpoint::pass($name)
    };
}

/// Marks a named point where a test may make the process die (nothing in
/// this build: the `failpoints` feature is off).
#[cfg(not(feature = "failpoints"))]
#[macro_export]
macro_rules! failpoint {
    ($name:literal) => {};
}

/// Keeps the `FAILPOINTS` configuration alive for the whole run.
#[cfg(feature = "failpoints")]
pub struct Scenario(#[allow(dead_code)] fail::FailScenario<'static>);

/// Nothing to keep in a build without failpoints.
#[cfg(not(feature = "failpoints"))]
pub struct Scenario;

/// Reads `FAILPOINTS` (a build with failpoints) or does nothing.
pub fn setup() -> Scenario {
    #[cfg(feature = "failpoints")]
    {
        Scenario(fail::FailScenario::setup())
    }
    #[cfg(not(feature = "failpoints"))]
    {
        Scenario
    }
}

/// One pass through the failpoint `name`: runs its configured action;
/// `return` means SIGKILL ourselves here.
#[cfg(feature = "failpoints")]
pub fn pass(name: &'static str) {
    if std::env::var_os("ETCD_MIGRATE_FAILPOINT_TRACE").is_some() {
        crate::log::info("failpoint", &[("name", name.into())]);
    }
    if fail::eval(name, |_| ()).is_some() {
        crate::log::warn("failpoint: SIGKILL", &[("name", name.into())]);
        // SIGKILL cannot be blocked or caught: the process ends inside this
        // call, exactly here, as in a power cut.
        let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL);
        loop {
            std::thread::park();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::ALL;
    use std::collections::BTreeSet;

    /// The names used in `failpoint!("…")` calls across `src/` and its
    /// subdirectories.
    fn used() -> BTreeSet<String> {
        let mut dirs = vec![std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src")];
        let mut names = BTreeSet::new();
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(&dir).expect("src/") {
                let path = entry.expect("entry").path();
                if path.is_dir() {
                    dirs.push(path);
                    continue;
                }
                if path.file_name().and_then(|n| n.to_str()) == Some("failpoint.rs") {
                    continue;
                }
                let text = std::fs::read_to_string(&path).expect("source");
                for part in text.split("failpoint!(\"").skip(1) {
                    let name = part.split('"').next().expect("closing quote");
                    names.insert(name.to_string());
                }
            }
        }
        names
    }

    #[test]
    fn the_list_matches_the_calls_both_ways() {
        let listed: BTreeSet<String> = ALL.iter().map(|s| s.to_string()).collect();
        assert_eq!(listed.len(), ALL.len(), "a name is listed twice");
        let used = used();
        let unlisted: Vec<_> = used.difference(&listed).collect();
        let unused: Vec<_> = listed.difference(&used).collect();
        assert!(unlisted.is_empty(), "failpoints not in ALL: {unlisted:?}");
        assert!(unused.is_empty(), "ALL names no failpoint!: {unused:?}");
    }
}
