//! This module owns the flag dialect of each etcd release: the exact
//! command line an intermediate etcd gets for a step, and the flags a
//! release removed with what replaces them (for the message that refuses
//! a user's flag). Pure, so every release's line is checked in a table
//! test without running it.

use crate::config::Member;
use crate::version::{Minor, Storage, Version};

/// Raft heartbeat for an isolated single-member step, in ms. Every release
/// 2.2.1 … 3.7.1 accepts it; with the election timeout below it cuts start
/// → first write from ~1.3 s to ~0.1 s (ETCD-NOTES, and measured here).
pub const STEP_HEARTBEAT_MS: u32 = 10;

/// Raft election timeout for an isolated single-member step, in ms: the
/// least etcd accepts with the heartbeat above (5 heartbeats). A member
/// whose data has no snapshot yet (it then does not know at start that it
/// is alone, and does not fast-forward its ticks) waits a random 50-100 ms
/// before it elects itself, where 100 took 100-200: 2.2.1 → 3.0.17 (three
/// starts) went from 0.53 s to 0.37 s. Every release 2.2.1 … 3.7.1 takes a
/// write with it (measured). One member alone never loses its leadership
/// to a late heartbeat, so nothing but start-up time depends on it.
pub const STEP_ELECTION_TIMEOUT_MS: u32 = 50;

/// Where and how a step's etcd runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepEtcd<'a> {
    /// The release that runs.
    pub version: Version,
    /// The storage the data holds while it runs.
    pub storage: Storage,
    /// The member it runs as (its `ETCD_CREDS` appended last, so the user
    /// can override anything).
    pub member: &'a Member,
    /// Data dir (the data dir, or a scratch dir being rebuilt).
    pub data_dir: &'a str,
    /// Bootstrap a new single-member cluster with the member's cluster
    /// token (an empty data dir being rebuilt); false for existing data.
    pub new_cluster: bool,
    /// Take a raft snapshot after every entry (see [`StepEtcd::args`]):
    /// false where that would serialize a big v2 store at each of many
    /// writes ([`snapshots_every_entry`]).
    pub snapshot_every_entry: bool,
}

/// The largest v2 store (its newest `.snap`, bytes) a step's etcd still
/// snapshots after every entry. Each snapshot serializes the whole v2
/// store: 241 MB took 19 s a snapshot on 3.3.25 (200k × 1 KiB of etcd2
/// data), so that its health write, one entry, timed out after 120 s; 4
/// MiB takes well under 0.5 s.
pub const SNAPSHOT_EVERY_ENTRY_MAX_V2_BYTES: u64 = 4 << 20;

/// Whether a step's etcd snapshots after every entry: on data whose v2
/// store (its newest `.snap`, `v2_snap_bytes`) is small, and not where
/// the step writes many entries (`writes_many`: the lease of each TTL
/// key, every key of an etcd3 → etcd2 copy), where one snapshot per write
/// costs a serialization of the whole store per key.
pub fn snapshots_every_entry(v2_snap_bytes: u64, writes_many: bool) -> bool {
    !writes_many && v2_snap_bytes <= SNAPSHOT_EVERY_ENTRY_MAX_V2_BYTES
}

impl StepEtcd<'_> {
    /// The client URL, loopback only: no client outside this host (or this
    /// container) can reach an intermediate etcd.
    pub fn client_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.member.client_port)
    }

    /// The full argument list (without the program name).
    pub fn args(&self) -> Vec<String> {
        let client_url = self.client_url();
        let member = self.member;
        let mut args: Vec<String> = [
            ("--name", member.name.as_str()),
            ("--data-dir", self.data_dir),
            ("--listen-client-urls", &client_url),
            ("--advertise-client-urls", &client_url),
            ("--listen-peer-urls", &member.listen_peer_urls),
            (
                "--initial-advertise-peer-urls",
                &member.initial_advertise_peer_urls,
            ),
            ("--initial-cluster", &member.initial_cluster),
        ]
        .iter()
        .map(|(flag, value)| format!("{flag}={value}"))
        .collect();
        args.push(format!("--heartbeat-interval={STEP_HEARTBEAT_MS}"));
        args.push(format!("--election-timeout={STEP_ELECTION_TIMEOUT_MS}"));
        // Snapshot after every entry, so the step leaves a fresh snapshot
        // taken at this release's cluster version. The next release then
        // starts sooner, and 3.5 does not replay history from a 2.x cluster
        // version and come up "not capable" of v3 (ETCD-NOTES; fixed
        // upstream only after 3.5.30, etcd PR 17860).
        //
        // Not for 2.2: its snapshot races its shutdown, and a SIGTERM
        // that lands while one is being saved makes it die with exit 1
        // ("save snapshot error: write …wal: file already closed"):
        // measured in 7 of 20 stops right after a write; 0 of 30 on
        // 2.3.7, 0 of 20 on 3.0.17, 0 of 20 on 2.2.1 without the flag.
        // Nor where it would serialize a big v2 store at every write
        // (`snapshot_every_entry`); the step then leaves no fresh
        // snapshot, and the next release replays the WAL.
        if self.snapshot_every_entry && self.version.minor_line() > Minor::new(2, 2) {
            args.push("--snapshot-count=1".to_string());
        }
        if self.new_cluster {
            args.push("--initial-cluster-state=new".to_string());
            args.push(format!(
                "--initial-cluster-token={}",
                member.initial_cluster_token
            ));
        }
        if self.version.needs_enable_v2_flag() {
            // 3.4 and 3.5 serve the v2 API only when asked. Every step
            // asks: etcd2 data is proven through it, and etcd3 data can
            // hold v2 keys too (flannel's config, old tooling), which are
            // read, fingerprinted and carried like the v3 keys.
            args.push("--enable-v2=true".to_string());
        }
        if self.version.reads_next_minor_schema() {
            // A 3.4.31+ step may run on data a 3.5 downgrade left (3.5's
            // schema), which it reads only with this; harmless on 3.4's
            // own data (measured on 3.4.45).
            args.push("--next-cluster-version-compatible".to_string());
        }
        args.extend(member.extra_args.iter().cloned());
        args
    }
}

/// Flags a release removed, by the minor that removed them, with what
/// replaces them (`None`: nothing, the feature is gone). From etcd's own
/// sources: 3.4 dropped the v2-era TLS names; 3.5 the capnslog logging
/// flags; 3.6 the v2 API; 3.7 every `--experimental-*` flag, whose
/// replacements 3.6 already accepts (and names in its deprecation
/// warnings: `server/etcdmain/config.go`, `server/embed/config.go` and
/// `server/features` at v3.6.14).
const REMOVED_FLAGS: &[(&str, Minor, Option<&str>)] = &[
    ("ca-file", Minor::new(3, 4), Some("--trusted-ca-file")),
    (
        "peer-ca-file",
        Minor::new(3, 4),
        Some("--peer-trusted-ca-file"),
    ),
    ("debug", Minor::new(3, 5), Some("--log-level=debug")),
    ("log-package-levels", Minor::new(3, 5), Some("--log-level")),
    ("enable-v2", Minor::new(3, 6), None),
    ("experimental-enable-v2v3", Minor::new(3, 6), None),
    (
        "experimental-bootstrap-defrag-threshold-megabytes",
        Minor::new(3, 7),
        Some("--bootstrap-defrag-threshold-megabytes"),
    ),
    (
        "experimental-compact-hash-check-enabled",
        Minor::new(3, 7),
        Some("--feature-gates=CompactHashCheck=true"),
    ),
    (
        "experimental-compact-hash-check-time",
        Minor::new(3, 7),
        Some("--compact-hash-check-time"),
    ),
    (
        "experimental-compaction-batch-limit",
        Minor::new(3, 7),
        Some("--compaction-batch-limit"),
    ),
    (
        "experimental-compaction-sleep-interval",
        Minor::new(3, 7),
        Some("--compaction-sleep-interval"),
    ),
    (
        "experimental-corrupt-check-time",
        Minor::new(3, 7),
        Some("--corrupt-check-time"),
    ),
    (
        "experimental-distributed-tracing-address",
        Minor::new(3, 7),
        Some("--distributed-tracing-address"),
    ),
    (
        "experimental-distributed-tracing-instance-id",
        Minor::new(3, 7),
        Some("--distributed-tracing-instance-id"),
    ),
    (
        "experimental-distributed-tracing-sampling-rate",
        Minor::new(3, 7),
        Some("--distributed-tracing-sampling-rate"),
    ),
    (
        "experimental-distributed-tracing-service-name",
        Minor::new(3, 7),
        Some("--distributed-tracing-service-name"),
    ),
    (
        "experimental-downgrade-check-time",
        Minor::new(3, 7),
        Some("--downgrade-check-time"),
    ),
    (
        "experimental-enable-distributed-tracing",
        Minor::new(3, 7),
        Some("--enable-distributed-tracing"),
    ),
    (
        "experimental-enable-lease-checkpoint",
        Minor::new(3, 7),
        Some("--feature-gates=LeaseCheckpoint=true"),
    ),
    (
        "experimental-enable-lease-checkpoint-persist",
        Minor::new(3, 7),
        Some("--feature-gates=LeaseCheckpointPersist=true"),
    ),
    (
        "experimental-initial-corrupt-check",
        Minor::new(3, 7),
        Some("--feature-gates=InitialCorruptCheck=true"),
    ),
    (
        "experimental-memory-mlock",
        Minor::new(3, 7),
        Some("--memory-mlock"),
    ),
    (
        "experimental-peer-skip-client-san-verification",
        Minor::new(3, 7),
        Some("--peer-skip-client-san-verification"),
    ),
    (
        "experimental-snapshot-catchup-entries",
        Minor::new(3, 7),
        Some("--snapshot-catchup-entries"),
    ),
    (
        "experimental-snapshot-catch-up-entries",
        Minor::new(3, 7),
        Some("--snapshot-catchup-entries"),
    ),
    (
        "experimental-stop-grpc-service-on-defrag",
        Minor::new(3, 7),
        Some("--feature-gates=StopGRPCServiceOnDefrag=true"),
    ),
    (
        "experimental-txn-mode-write-with-shared-buffer",
        Minor::new(3, 7),
        Some("--feature-gates=TxnModeWriteWithSharedBuffer=true"),
    ),
    (
        "experimental-warning-apply-duration",
        Minor::new(3, 7),
        Some("--warning-apply-duration"),
    ),
    (
        "experimental-warning-unary-request-duration",
        Minor::new(3, 7),
        Some("--warning-unary-request-duration"),
    ),
    (
        "experimental-watch-progress-notify-interval",
        Minor::new(3, 7),
        Some("--watch-progress-notify-interval"),
    ),
];

/// What to tell the operator of an etcd flag `release` refuses, from
/// etcd's own refusal (`flag provided but not defined: -ca-file`): the
/// minor that removed it and its replacement, when the table knows it.
pub fn removed_flag_advice(refusal: &str, release: Version) -> Option<String> {
    let name = refusal
        .split("flag provided but not defined:")
        .nth(1)?
        .split_whitespace()
        .next()?
        .trim_start_matches('-');
    let (_, removed_in, replacement) = REMOVED_FLAGS
        .iter()
        .find(|(flag, removed_in, _)| *flag == name && *removed_in <= release.minor_line())?;
    Some(match replacement {
        Some(replacement) => {
            format!(
            "etcd {removed_in} removed --{name}; use {replacement} instead (etcd {} accepts both)",
            removed_in.previous().map_or(String::new(), |m| m.to_string())
        )
        }
        None => {
            format!("etcd {removed_in} removed --{name} and has no replacement for it: drop it")
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(version: &str, storage: Storage) -> Vec<String> {
        step_snapshotting(version, storage, true)
    }

    fn step_snapshotting(
        version: &str,
        storage: Storage,
        snapshot_every_entry: bool,
    ) -> Vec<String> {
        let member = Member {
            name: "etcd-m1".to_string(),
            client_port: 18629,
            listen_peer_urls: "http://localhost:2380".to_string(),
            initial_advertise_peer_urls: "http://localhost:2380".to_string(),
            initial_cluster: "etcd-m1=http://localhost:2380".to_string(),
            initial_cluster_token: "etcd-cluster".to_string(),
            extra_args: vec!["--peer-client-cert-auth".to_string()],
        };
        StepEtcd {
            version: version.parse().expect("version"),
            storage,
            member: &member,
            data_dir: "/var/etcd/data",
            new_cluster: false,
            snapshot_every_entry,
        }
        .args()
    }

    #[test]
    fn a_big_v2_store_or_many_writes_take_no_snapshot_after_every_entry() {
        #[rustfmt::skip]
        let cases = [
            // (v2 snapshot bytes, writes many, snapshot every entry)
            (0, false, true),
            (SNAPSHOT_EVERY_ENTRY_MAX_V2_BYTES, false, true),
            (SNAPSHOT_EVERY_ENTRY_MAX_V2_BYTES + 1, false, false),
            (241_000_000, false, false),
            (0, true, false),
        ];
        for (bytes, many, want) in cases {
            assert_eq!(
                snapshots_every_entry(bytes, many),
                want,
                "{bytes} bytes, many {many}"
            );
        }
        let args = step_snapshotting("3.3.25", Storage::Etcd3, false);
        assert!(
            !args.iter().any(|a| a.starts_with("--snapshot-count")),
            "{args:?}"
        );
    }

    #[test]
    fn every_release_gets_its_own_dialect() {
        let common = [
            "--name=etcd-m1",
            "--data-dir=/var/etcd/data",
            "--listen-client-urls=http://127.0.0.1:18629",
            "--advertise-client-urls=http://127.0.0.1:18629",
            "--listen-peer-urls=http://localhost:2380",
            "--initial-advertise-peer-urls=http://localhost:2380",
            "--initial-cluster=etcd-m1=http://localhost:2380",
            "--heartbeat-interval=10",
            "--election-timeout=50",
            "--snapshot-count=1",
        ];
        let rows: [(&str, Storage, bool); 9] = [
            ("2.2.1", Storage::Etcd2, false),
            ("2.3.7", Storage::Etcd2, false),
            ("3.0.17", Storage::Etcd2, false),
            ("3.3.25", Storage::Etcd2, false),
            ("3.3.25", Storage::Etcd3, false),
            ("3.4.23", Storage::Etcd2, true),
            ("3.4.23", Storage::Etcd3, true),
            ("3.5.16", Storage::Etcd2, true),
            ("3.6.5", Storage::Etcd3, false),
        ];
        for (version, storage, enable_v2) in rows {
            let args = step(version, storage);
            let mut expected: Vec<String> = common
                .iter()
                .filter(|arg| !(version == "2.2.1" && **arg == "--snapshot-count=1"))
                .map(|s| s.to_string())
                .collect();
            if enable_v2 {
                expected.push("--enable-v2=true".into());
            }
            expected.push("--peer-client-cert-auth".into());
            assert_eq!(args, expected, "{version}/{storage}");
        }
    }

    #[test]
    fn a_removed_flag_is_named_with_its_replacement() {
        let advice = |refusal: &str, release: &str| {
            removed_flag_advice(refusal, release.parse().expect("version"))
        };
        assert_eq!(
            advice(
                "flag provided but not defined: -experimental-initial-corrupt-check",
                "3.7.1"
            )
            .as_deref(),
            Some("etcd 3.7 removed --experimental-initial-corrupt-check; use --feature-gates=InitialCorruptCheck=true instead (etcd 3.6 accepts both)")
        );
        assert_eq!(
            advice("flag provided but not defined: -ca-file\nUsage:", "3.4.23").as_deref(),
            Some(
                "etcd 3.4 removed --ca-file; use --trusted-ca-file instead (etcd 3.3 accepts both)"
            )
        );
        assert!(
            advice("flag provided but not defined: -enable-v2", "3.6.14")
                .is_some_and(|a| a.contains("no replacement"))
        );
        assert_eq!(
            advice("flag provided but not defined: -no-such-flag", "3.7.1"),
            None
        );
        assert_eq!(
            advice("invalid value \"x\" for flag -snapshot-count", "3.7.1"),
            None
        );
    }

    #[test]
    fn clients_reach_it_on_loopback_only() {
        for arg in step("3.5.16", Storage::Etcd3) {
            if arg.contains("client-urls") {
                assert!(arg.ends_with("=http://127.0.0.1:18629"), "{arg}");
            }
        }
    }
}
