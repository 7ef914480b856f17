//! This module owns fixture data dirs: real etcd of a given release writes
//! Kubernetes-like keys (with binary, unicode, empty and 10 KiB values) and
//! leased keys, is stopped, and the dir is left as the Kubernetes image
//! leaves one (mode 0700, `version.txt` = `<release>/etcd3`).

use std::path::{Path, PathBuf};

use etcd_client::{PutOptions, Txn, TxnOp};

use super::etcd::{connect, EtcdProcess};
use super::keyspace::Keyspace;
use super::v2::{self, V2Key};
use super::{block_on, free_port, set_mode, write_version_txt, Member};

/// TTL of the fixture's leases: long enough that a lease that survives a
/// migration is visibly the same one (more than 3,000 s left afterwards).
pub const LEASE_TTL_SECS: i64 = 3600;

/// etcd refuses a transaction with more than 128 operations by default.
const TXN_OPS: usize = 100;

/// What a fixture holds.
#[derive(Debug, Clone, Copy)]
pub struct FixtureSpec {
    /// The etcd release that writes it.
    pub version: &'static str,
    /// Keys without a lease.
    pub plain_keys: usize,
    /// Leases granted.
    pub leases: usize,
    /// Keys attached to those leases (round robin).
    pub leased_keys: usize,
    /// The first this many plain keys are written three more times (so
    /// their mod revision and version differ from their creation).
    pub rewrites: usize,
    /// Only UTF-8 values (what the v2 store can hold): the protobuf-like
    /// binary values become text.
    pub text_only: bool,
    /// More plain keys, written last, e.g. Kubernetes' `compact_rev_key`
    /// (a v3 key without a leading slash).
    pub extra_keys: &'static [(&'static str, &'static str)],
}

impl FixtureSpec {
    /// A Kubernetes-sized keyspace written by `version`: 250 plain keys
    /// and 50 event keys on 3 leases.
    pub const fn full(version: &'static str) -> Self {
        FixtureSpec {
            version,
            plain_keys: 250,
            leases: 3,
            leased_keys: 50,
            rewrites: 0,
            text_only: false,
            extra_keys: &[],
        }
    }

    /// A small keyspace, for runs that must refuse before touching it.
    pub const fn small(version: &'static str) -> Self {
        FixtureSpec {
            version,
            plain_keys: 20,
            leases: 1,
            leased_keys: 5,
            rewrites: 0,
            text_only: false,
            extra_keys: &[],
        }
    }

    /// The same, with the first `n` plain keys rewritten three times.
    pub const fn with_rewrites(mut self, n: usize) -> Self {
        self.rewrites = n;
        self
    }

    /// The same, with text values only.
    pub const fn text_only(mut self) -> Self {
        self.text_only = true;
        self
    }

    /// The same, with `keys` written last.
    pub const fn with_extra_keys(mut self, keys: &'static [(&'static str, &'static str)]) -> Self {
        self.extra_keys = keys;
        self
    }
}

/// A data dir written by real etcd, and what it held when that etcd
/// stopped.
pub struct Fixture {
    /// The data dir.
    pub data_dir: PathBuf,
    /// The member that owns it; the migrator must run as this member.
    pub member: Member,
    /// The keyspace as the fixture's etcd served it.
    pub keyspace: Keyspace,
}

/// The value of the `i`th plain key: every kind of bytes a Kubernetes
/// object store holds (protobuf is binary, names are unicode, some values
/// are empty, a few are large).
fn value(i: usize, text_only: bool) -> Vec<u8> {
    if text_only && i % 5 == 0 {
        return format!("proto-as-json-{i} \"quoted\" \\ tab\t newline\n").into_bytes();
    }
    if i == 7 {
        return (0..10 * 1024)
            .map(|b| b"0123456789abcdef"[b % 16])
            .collect();
    }
    match i % 5 {
        // Protobuf-like: every byte value, NUL and invalid UTF-8 included.
        0 => (0..64).map(|b| ((b * 37 + i) % 256) as u8).collect(),
        1 => format!("ünïcødé ✓ 日本語 🚀 #{i}").into_bytes(),
        2 => format!(r#"{{"kind":"ConfigMap","metadata":{{"name":"cm-{i}"}},"data":{{"k":"v"}}}}"#)
            .into_bytes(),
        3 if i % 2 == 1 => Vec::new(),
        _ => format!("value-{i}").into_bytes(),
    }
}

fn plain_key(i: usize) -> String {
    const KINDS: [&str; 5] = ["pods", "services", "configmaps", "secrets", "deployments"];
    format!(
        "/registry/{}/ns-{}/object-{i:04}",
        KINDS[i % KINDS.len()],
        i % 7
    )
}

/// Writes the fixture described by `spec` into `data_dir` with real etcd
/// running as `member`, and returns what it served. etcd's log goes in
/// `log_dir`.
pub fn build(spec: FixtureSpec, data_dir: &Path, member: &Member, log_dir: &Path) -> Fixture {
    let mut etcd = EtcdProcess::start(spec.version, member, data_dir, free_port(), log_dir);
    let keyspace = block_on(async {
        etcd.wait_ready().await;
        let endpoint = etcd.endpoint();
        let mut client = connect(&endpoint)
            .await
            .unwrap_or_else(|err| panic!("connect {endpoint}: {err}"));
        let mut leases = Vec::new();
        for _ in 0..spec.leases {
            let lease = client
                .lease_grant(LEASE_TTL_SECS, None)
                .await
                .unwrap_or_else(|err| panic!("grant a lease on {endpoint}: {err}"));
            leases.push(lease.id());
        }
        let mut ops: Vec<TxnOp> = (0..spec.plain_keys)
            .map(|i| TxnOp::put(plain_key(i), value(i, spec.text_only), None))
            .collect();
        if !leases.is_empty() {
            ops.extend((0..spec.leased_keys).map(|i| {
                TxnOp::put(
                    format!("/registry/events/ns-{}/event-{i:04}", i % 3),
                    format!("event {i} ✓").into_bytes(),
                    Some(PutOptions::new().with_lease(leases[i % leases.len()])),
                )
            }));
        }
        ops.extend(
            spec.extra_keys
                .iter()
                .map(|(key, value)| TxnOp::put(*key, *value, None)),
        );
        // A transaction may not write one key twice: each round of
        // rewrites goes in transactions of its own.
        let mut rounds = vec![ops];
        for round in 1..=3 {
            rounds.push(
                (0..spec.rewrites.min(spec.plain_keys))
                    .map(|i| {
                        let mut rewritten = value(i, spec.text_only);
                        rewritten.extend_from_slice(format!(" (rewrite {round})").as_bytes());
                        TxnOp::put(plain_key(i), rewritten, None)
                    })
                    .collect(),
            );
        }
        for mut ops in rounds {
            while !ops.is_empty() {
                let batch: Vec<TxnOp> = ops.drain(..ops.len().min(TXN_OPS)).collect();
                let response = client
                    .txn(Txn::new().and_then(batch))
                    .await
                    .unwrap_or_else(|err| panic!("write fixture keys on {endpoint}: {err}"));
                assert!(response.succeeded(), "fixture transaction did not succeed");
            }
        }
        Keyspace::read(&endpoint).await
    });
    etcd.stop();
    let leased = if spec.leases == 0 {
        0
    } else {
        spec.leased_keys
    };
    assert_eq!(
        keyspace.entries.len(),
        spec.plain_keys + leased + spec.extra_keys.len(),
        "the fixture etcd should serve every key written"
    );
    assert_eq!(
        keyspace.rewritten_keys(),
        spec.rewrites.min(spec.plain_keys),
        "rewritten keys have a mod revision past their create revision"
    );
    assert_eq!(keyspace.leased_keys(), leased);
    assert_eq!(keyspace.leases.len(), spec.leases);
    // What the Kubernetes image leaves: etcd 3.4.10+ wants 0700, and
    // version.txt names the release that last ran on the data.
    set_mode(data_dir, 0o700);
    write_version_txt(data_dir, &format!("{}/etcd3", spec.version));
    Fixture {
        data_dir: data_dir.to_path_buf(),
        member: member.clone(),
        keyspace,
    }
}

/// Puts `key` = `values[i]` through the v3 API of `etcd-<version>` serving
/// `data` (etcd2 data: 3.x serves v3 beside v2), one write after another,
/// as the Kubernetes tool's health check overwrote `etcd_version`.
pub fn put_v3(
    version: &str,
    data: &Path,
    member: &Member,
    logs: &Path,
    key: &str,
    values: &[&str],
) {
    let mut etcd = EtcdProcess::start(version, member, data, free_port(), logs);
    block_on(async {
        etcd.wait_ready_v2().await;
        let mut client = connect(&etcd.endpoint())
            .await
            .unwrap_or_else(|err| panic!("v3 connect: {err}"));
        for value in values {
            client
                .put(key, *value, None)
                .await
                .unwrap_or_else(|err| panic!("v3 put {key}: {err}"));
        }
    });
    etcd.stop();
}

/// Ten v2 keys, then `etcd_version` written twelve times through v3: its
/// last write has revision 13, the modifiedIndex of one of the v2 keys,
/// and `etcdctl migrate` writes each v2 key at revision = its
/// modifiedIndex, over the record there (measured on 3.3.25: the key came
/// back as its second value).
pub fn etcd2_data_with_the_health_key(version: &str, data: &Path, member: &Member, logs: &Path) {
    let keys: Vec<V2Key> = (1..=10)
        .map(|i| V2Key::plain(format!("/registry/pods/default/p{i}"), format!("pod {i}")))
        .collect();
    v2::build(version, data, member, logs, &[keys]);
    let values: Vec<String> = (1..=12).map(|i| format!("{version} #{i}")).collect();
    let values: Vec<&str> = values.iter().map(String::as_str).collect();
    put_v3(version, data, member, logs, "etcd_version", &values);
}
