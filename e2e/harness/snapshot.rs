//! Snapshots to restore from (issue 29): one taken from a served data
//! dir with `etcdctl snapshot save`, its sha256, the restore settings, and
//! the backups a restore leaves.

use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::{Digest, Sha256};

use crate::harness::etcd::{connect, EtcdProcess};
use crate::harness::keyspace::Keyspace;
use crate::harness::migrator::Migration;
use crate::harness::{binary, block_on, free_port, Member};

/// The key written after the snapshot: never in a restored member.
pub const AFTER: &str = "/registry/after-the-snapshot";

/// The sha256 of `file`, as `sha256sum` prints it.
pub fn sha256(file: &Path) -> String {
    let bytes = std::fs::read(file).expect("read the snapshot");
    Sha256::digest(&bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// `version` serves `data` as `member`; `etcdctl snapshot save` takes
/// `file` from it; then [`AFTER`] is written. Returns the keyspace the
/// snapshot holds.
pub fn snapshot_of(
    version: &str,
    data: &Path,
    member: &Member,
    logs: &Path,
    file: &Path,
) -> Keyspace {
    let mut etcd = EtcdProcess::start(version, member, data, free_port(), logs);
    let endpoint = etcd.endpoint();
    let held = block_on(async {
        etcd.wait_ready().await;
        Keyspace::read(&endpoint).await
    });
    let saved = Command::new(binary(&format!("etcdctl-{version}")))
        .env("ETCDCTL_API", "3")
        .args(["--endpoints", &endpoint, "snapshot", "save"])
        .arg(file)
        .output()
        .expect("run etcdctl snapshot save");
    assert!(
        saved.status.success(),
        "etcdctl snapshot save: {}",
        String::from_utf8_lossy(&saved.stderr)
    );
    block_on(async {
        let mut client = connect(&endpoint).await.expect("connect");
        client.put(AFTER, "written after", None).await.expect("put");
    });
    etcd.stop();
    held
}

/// The migration of `data` to `target` with the restore settings.
pub fn restoring(target: &str, data: &Path, member: &Member, file: &Path, sha: &str) -> Migration {
    Migration::new(target, data, member)
        .arg("--restore-snapshot")
        .arg(file)
        .arg("--restore-snapshot-sha256")
        .arg(sha)
}

/// The backups of `data` (its default backup dir).
pub fn backups(data: &Path) -> Vec<PathBuf> {
    let root = PathBuf::from(format!("{}.backup", data.display()));
    std::fs::read_dir(&root)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default()
}
