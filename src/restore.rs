//! This module owns restoring the data dir from an etcd snapshot file,
//! once (issue 29): the procedure of "Operating etcd clusters for
//! Kubernetes", done by the entrypoint with the member's own settings, and
//! its mistakes refused before anything is touched.
//!
//! 1. The checks ([`check`]): the file's sha256 is the one given (the same
//!    setting on every member, so every member restores the same bytes),
//!    the integrity hash `etcdctl snapshot save` appends holds (a file cut
//!    short fails it), the file is a bolt db etcd could open, and the
//!    release that wrote it is not newer than the target. Our own backups
//!    (`etcd-migrate backup` dirs) are taken too (`check_backup`): the
//!    sha256 given is then the one of the backup's `MANIFEST.sha256`,
//!    every file is verified against the manifest, and the backup's db is
//!    restored (`--skip-hash-check`: a db copied from a stopped data dir
//!    has no appended hash; the manifest vouches for it instead) only if
//!    its WAL changes no key past it.
//! 2. The data dir backed up as it is (when it holds a member), then the
//!    target's own restore tool (`etcdutl`, `etcdctl` before 3.5) writes a
//!    fresh member into the scratch dir, with the member's name, peer URLs,
//!    initial cluster and token from its settings (the token with the
//!    snapshot's hash in it: members restored from different files get
//!    different cluster ids, and etcd keeps them apart), and, where the
//!    tool has them, `--bump-revision` and `--mark-compacted` (watchers
//!    see a compaction, never revisions going back).
//! 3. The new `member/` swapped in with the rebuilding steps' journalled
//!    exchange, `version.txt` recorded, the restart mark dropped, and last
//!    the restore's own record (`datadir::RESTORED_FILE`, the snapshot's sha256):
//!    a restart with the same setting never restores twice, a crash before
//!    the record restores again from the same file.

use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::{Instant, SystemTime};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::backup::{self, BackupError, BackupPolicy, StopCheck};
use crate::config::{Config, RestoreRequest};
use crate::datadir::{DataDirError, DirState};
use crate::durable;
use crate::effects::{StepError, Tools};
use crate::log;
use crate::ondisk;
use crate::plan::Binary;
use crate::survey::{Survey, SurveyError};
use crate::swap::{self, SwapError};
use crate::version::{Minor, Storage, Version, VersionPair};

/// The dir the restore tool writes into, in the scratch dir.
const RESTORE_DIR: &str = "restored";

/// The revision bump (etcd's own recommendation, 1e9): far past any
/// revision a cluster reached, so a watcher never sees one go back.
const BUMP_REVISION: &str = "1000000000";

/// What the restore's record (`datadir::RESTORED_FILE`) holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Restored {
    sha256: String,
    file: String,
    target: String,
    restored: String,
}

/// Why a restore was refused or failed.
#[derive(Debug, thiserror::Error)]
pub enum RestoreError {
    /// The snapshot or the setting is not one to restore (nothing touched).
    #[error("RESTORE_SNAPSHOT {file}: {reason}; {fix}")]
    Refused {
        /// The snapshot file.
        file: PathBuf,
        /// What is wrong with it.
        reason: String,
        /// What to do.
        fix: String,
    },
    /// The restore tool failed (the data dir is as it was).
    #[error("restoring {file} with {binary} failed (the data dir is as it was): {source}")]
    Tool {
        /// The snapshot file.
        file: PathBuf,
        /// The tool.
        binary: String,
        /// What it said.
        #[source]
        source: StepError,
    },
    /// Reading the snapshot.
    #[error("cannot read {file}: {source}")]
    Read {
        /// The snapshot file.
        file: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The backup before the restore.
    #[error(transparent)]
    Backup(#[from] BackupError),
    /// The scratch dir or the swap.
    #[error(transparent)]
    Swap(#[from] SwapError),
    /// The data dir's records.
    #[error(transparent)]
    DataDir(#[from] DataDirError),
    /// The data dir's survey.
    #[error(transparent)]
    Survey(#[from] SurveyError),
}

impl RestoreError {
    /// A refusal (exit 2: the input is wrong, nothing was touched), as
    /// opposed to a failure on the way (exit 1).
    pub fn is_refusal(&self) -> bool {
        matches!(self, RestoreError::Refused { .. })
    }
}

/// Whether the data dir, as `glance` read it, records a restore from the
/// snapshot `request` names (by its sha256): then the setting left in the
/// manifest does nothing again.
pub fn restored_before(glance: &crate::survey::Glance, request: &RestoreRequest) -> bool {
    glance.restored.as_deref() == Some(request.sha256.as_str())
}

/// What the checks found: the snapshot is the one vouched for and whole.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checked {
    /// The cluster version the snapshot records (3.5+ write one).
    pub cluster_version: Option<String>,
    /// Its size in bytes.
    pub bytes: u64,
    /// The bolt db the restore tool reads: the snapshot file, or a
    /// backup's `member/snap/db`.
    pub db: PathBuf,
    /// The db is a backup's (no hash appended: `--skip-hash-check`).
    pub from_backup: bool,
    /// A snapshot file as it was when its hashes were checked: the tool
    /// then skips its own pass over the same hash (`--skip-hash-check`)
    /// and the file must be the same after the tool read it.
    pub identity: Option<FileIdentity>,
}

/// What tells a file changed: its device and inode, size and mtime.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileIdentity {
    dev: u64,
    ino: u64,
    len: u64,
    mtime_ns: i128,
}

impl FileIdentity {
    /// `file`'s, now.
    fn of(file: &Path) -> Result<FileIdentity, RestoreError> {
        use std::os::unix::fs::MetadataExt;
        let meta = std::fs::metadata(file).map_err(|source| RestoreError::Read {
            file: file.to_path_buf(),
            source,
        })?;
        Ok(FileIdentity {
            dev: meta.dev(),
            ino: meta.ino(),
            len: meta.len(),
            mtime_ns: i128::from(meta.mtime()) * 1_000_000_000 + i128::from(meta.mtime_nsec()),
        })
    }
}

/// The checks before anything is touched (see the module doc).
pub fn check(config: &Config, request: &RestoreRequest) -> Result<Checked, RestoreError> {
    let file = &request.file;
    let refused = |reason: String, fix: &str| RestoreError::Refused {
        file: file.clone(),
        reason,
        fix: fix.to_string(),
    };
    let target = config.target;
    if target.storage != Storage::Etcd3 || !target.version.has_v3_api() {
        return Err(refused(
            format!("the target is {target}, and a snapshot holds a v3 keyspace only"),
            "restore with TARGET_VERSION 3.x and TARGET_STORAGE etcd3",
        ));
    }
    if file.is_dir() {
        return check_backup(config, request);
    }
    // Taken before the hashes: a change while they are read shows too.
    let identity = FileIdentity::of(file)?;
    let (whole, body, tail, bytes) = hashes(file)?;
    if whole != request.sha256 {
        return Err(refused(
            format!(
                "its sha256 is {whole}, not the {} RESTORE_SNAPSHOT_SHA256 gives",
                request.sha256
            ),
            "give every member the same file and its `sha256sum`; a file that changed since it was hashed is not the snapshot you chose",
        ));
    }
    match (body, tail) {
        (Some(body), Some(tail)) if body == tail => {}
        (Some(_), Some(_)) => {
            return Err(refused(
                format!("its integrity hash (the last 32 bytes `etcdctl snapshot save` appends) does not match its {bytes} bytes: cut short or changed"),
                "take the snapshot again with `etcdctl snapshot save`, or copy it again whole",
            ))
        }
        _ => {
            return Err(refused(
                format!("its {bytes} bytes are not a bolt db of 4 KiB pages with the 32-byte hash `etcdctl snapshot save` appends: cut short, or a db file copied from a data dir"),
                "take the snapshot with `etcdctl snapshot save` from a member that serves",
            ))
        }
    }
    let versions = ondisk::snapshot_versions(file).map_err(|err| {
        refused(
            format!("not a snapshot etcd can restore: {err}"),
            "take the snapshot with `etcdctl snapshot save` from a member that serves",
        )
    })?;
    let cluster_version =
        not_newer(&versions, target.version).map_err(|(reason, fix)| refused(reason, &fix))?;
    Ok(Checked {
        cluster_version,
        bytes,
        db: file.clone(),
        from_backup: false,
        identity: Some(identity),
    })
}

/// The checks of one of our backups named by `RESTORE_SNAPSHOT` (see the
/// module doc); nothing is touched.
fn check_backup(config: &Config, request: &RestoreRequest) -> Result<Checked, RestoreError> {
    let dir = &request.file;
    let refused = |reason: String, fix: &str| RestoreError::Refused {
        file: dir.clone(),
        reason,
        fix: fix.to_string(),
    };
    let manifest = dir.join(backup::MANIFEST_FILE);
    if !manifest.is_file() {
        return Err(refused(
            format!("a directory with no {}: not an etcd-migrate backup", backup::MANIFEST_FILE),
            "name a snapshot file (`etcdctl snapshot save`) or a backup dir `etcd-migrate backup list` shows",
        ));
    }
    let (whole, _, _, _) = hashes(&manifest)?;
    if whole != request.sha256 {
        return Err(refused(
            format!(
                "the sha256 of its {} is {whole}, not the {} RESTORE_SNAPSHOT_SHA256 gives",
                backup::MANIFEST_FILE,
                request.sha256
            ),
            &format!(
                "give every member the same backup and `sha256sum {}`",
                manifest.display()
            ),
        ));
    }
    backup::tool::verify(dir).map_err(|err| {
        refused(
            format!("it does not verify: {err}"),
            "copy the backup again whole, or choose another",
        )
    })?;
    let db = dir.join("member").join("snap").join("db");
    if !db.is_file() {
        return Err(refused(
            "it holds no member/snap/db: etcd2 data, which no snapshot restore takes".to_string(),
            &format!(
                "put it back on one member with `{}`, then migrate that member to etcd3",
                backup::tool::restore_command_line(&config.data_dir, dir)
            ),
        ));
    }
    let read = ondisk::read_with(
        dir,
        &ondisk::Want {
            v3_keys: true,
            ..ondisk::Want::default()
        },
    )
    .map_err(|err| {
        refused(
            format!("its data cannot be read: {err}"),
            "choose another backup",
        )
    })?;
    if let Some(Err(why)) = read.v3_keys {
        return Err(refused(
            format!("its db is not the whole keyspace: {why}"),
            &format!(
                "put it back on one member with `{}`, start it, and take a snapshot with `etcdctl snapshot save`",
                backup::tool::restore_command_line(&config.data_dir, dir)
            ),
        ));
    }
    let versions = ondisk::snapshot_versions(&db).map_err(|err| {
        refused(
            format!("its db is not one etcd can restore: {err}"),
            "choose another backup",
        )
    })?;
    let cluster_version = not_newer(&versions, config.target.version)
        .map_err(|(reason, fix)| refused(reason, &fix))?;
    let bytes = std::fs::metadata(&db)
        .map_err(|source| RestoreError::Read {
            file: db.clone(),
            source,
        })?
        .len();
    Ok(Checked {
        cluster_version,
        bytes,
        db,
        from_backup: true,
        identity: None,
    })
}

/// The snapshot's cluster version, unless it records a storage or
/// cluster version newer than `target` (why, and what to do).
fn not_newer(
    versions: &ondisk::SnapshotVersions,
    target: Version,
) -> Result<Option<String>, (String, String)> {
    for (what, version) in [
        ("storage version", versions.storage_version.as_deref()),
        ("cluster version", versions.cluster_version.as_deref()),
    ] {
        let Some(minor) = version.and_then(parse_minor) else {
            continue;
        };
        if minor > target.minor_line() {
            return Err((
                format!(
                    "it records {what} {minor}, newer than the target {target}: that release cannot serve it"
                ),
                format!("restore with TARGET_VERSION {minor}.x or newer, then downgrade the cluster"),
            ));
        }
    }
    Ok(versions.cluster_version.clone())
}

/// `3.5.0` or `3.6` as its minor line.
fn parse_minor(text: &str) -> Option<Minor> {
    let mut parts = text.trim().split('.');
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some(Minor::new(major, minor))
}

/// The file's sha256, and, when it is laid out as `snapshot save` writes
/// it (4 KiB bolt pages, then 32 bytes), the sha256 of the pages and the
/// 32 bytes themselves; one read of the file.
type Hashes = (String, Option<[u8; 32]>, Option<[u8; 32]>, u64);

fn hashes(file: &Path) -> Result<Hashes, RestoreError> {
    let read_err = |source| RestoreError::Read {
        file: file.to_path_buf(),
        source,
    };
    let mut f = File::open(file).map_err(read_err)?;
    let bytes = f.metadata().map_err(read_err)?.len();
    let laid_out = bytes > 32 && (bytes - 32) % 4096 == 0;
    let body_len = if laid_out { bytes - 32 } else { bytes };
    // One hasher: SHA-256 is a chain, so its state where the pages end is
    // the pages' hash, and the same state fed the tail is the file's.
    let mut hasher = Sha256::new();
    let mut body = None;
    let mut tail = Vec::with_capacity(32);
    let mut seen = 0u64;
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).map_err(read_err)?;
        if n == 0 {
            break;
        }
        let chunk = &buf[..n];
        let in_body = body_len.saturating_sub(seen).min(n as u64) as usize;
        hasher.update(&chunk[..in_body]);
        if laid_out && body.is_none() && seen + in_body as u64 == body_len {
            body = Some(hasher.clone().finalize().into());
        }
        hasher.update(&chunk[in_body..]);
        if laid_out {
            tail.extend_from_slice(&chunk[in_body..]);
        }
        seen += n as u64;
    }
    let hex = hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<String>();
    if !laid_out {
        return Ok((hex, None, None, bytes));
    }
    let tail: Option<[u8; 32]> = tail.as_slice().try_into().ok();
    Ok((hex, body, tail, bytes))
}

/// The member's settings as its etcd will read them (etcd's order, the
/// last wins): ours, then `ETCD_CREDS`, then the etcd arguments.
pub struct MemberSettings {
    /// `--name`.
    pub name: String,
    /// `--initial-cluster`.
    pub initial_cluster: String,
    /// `--initial-advertise-peer-urls`.
    pub peer_urls: String,
    /// `--initial-cluster-token`.
    pub token: String,
}

impl MemberSettings {
    /// From `config` (see the type's doc).
    pub fn of(config: &Config) -> MemberSettings {
        let args = config.member_args();
        let flag = |name: &str| crate::config::flag_in_args(&args, name).unwrap_or_default();
        MemberSettings {
            name: flag("name"),
            initial_cluster: flag("initial-cluster"),
            peer_urls: flag("initial-advertise-peer-urls"),
            token: flag("initial-cluster-token"),
        }
    }
}

/// Restores the data dir from `request`'s snapshot (checked already), as
/// the module doc says; `tools` runs the restore tool, `stop` is asked
/// during the backup.
pub async fn restore<T: Tools>(
    config: &Config,
    (request, checked): (&RestoreRequest, &Checked),
    survey: &mut Survey,
    tools: &T,
    stop: StopCheck<'_>,
) -> Result<(), RestoreError> {
    let started = Instant::now();
    let target = config.target;
    let file = request.file.clone();
    survey.make_ready()?;
    let dir = survey.dir().to_path_buf();
    if dir.join("member").exists() {
        let recorded = match survey.state() {
            DirState::Recorded(pair) => pair,
            DirState::Missing | DirState::Empty => target,
        };
        let policy = BackupPolicy {
            mode: config.backup.mode,
            root: config.backup.root.clone(),
            keep: config.backup.keep,
        };
        let taken = backup::create(&dir, &policy, recorded, SystemTime::now(), stop)?;
        log::info(
            "backup taken before the restore",
            &[("backup", taken.display().to_string().into())],
        );
        backup::prune(&policy.root, policy.keep, &taken, &dir)?;
    }
    let member = MemberSettings::of(config);
    // Different files, different cluster ids: a member restored from
    // another snapshot cannot join the others.
    let token = format!("{}-{}", member.token, &request.sha256[..16]);
    let work = swap::fresh_work_dir(&dir)?;
    let rebuilt = work.join(RESTORE_DIR);
    let binary = Binary::snapshot_restorer(target.version);
    let mut args = vec![
        "snapshot".to_string(),
        "restore".to_string(),
        checked.db.to_string_lossy().into_owned(),
        "--data-dir".to_string(),
        rebuilt.to_string_lossy().into_owned(),
        "--name".to_string(),
        member.name.clone(),
        "--initial-cluster".to_string(),
        member.initial_cluster.clone(),
        "--initial-advertise-peer-urls".to_string(),
        member.peer_urls.clone(),
        "--initial-cluster-token".to_string(),
        token.clone(),
    ];
    // A backup's db has no hash appended (its manifest vouched for it); a
    // snapshot file's appended hash was checked against its pages in the
    // same pass as its sha256 (`check`), so the tool need not read and
    // hash it again (it still cuts the 32 bytes off): the file is proven
    // unchanged since once the tool is done, below.
    if checked.from_backup || checked.identity.is_some() {
        args.push("--skip-hash-check".to_string());
    }
    let bumps = has_restore_bump(target.version);
    if bumps {
        args.extend([
            "--bump-revision".to_string(),
            BUMP_REVISION.to_string(),
            "--mark-compacted".to_string(),
        ]);
    }
    log::info(
        "restoring the data dir from a snapshot",
        &[
            ("snapshot", file.display().to_string().into()),
            ("sha256", request.sha256.clone().into()),
            ("name", member.name.clone().into()),
            ("initial_cluster", member.initial_cluster.clone().into()),
            ("token", token.into()),
            ("tool", binary.to_string().into()),
        ],
    );
    tools
        .run(binary, &args, &[("ETCDCTL_API", "3")])
        .await
        .map_err(|source| RestoreError::Tool {
            file: file.clone(),
            binary: binary.to_string(),
            source,
        })?;
    if let Some(before) = checked.identity {
        let now = FileIdentity::of(&file)?;
        if now != before {
            swap::discard_work_dir(&dir);
            return Err(RestoreError::Refused {
                file: file.clone(),
                reason: "it changed while it was checked and restored (its size, mtime or inode are not what they were when its hashes were read)".to_string(),
                fix: "leave the file alone while the member restores from it, and restart the member".to_string(),
            });
        }
    }
    crate::failpoint!("restore-after-tool");
    if dir.join("member").exists() {
        swap::swap_member(&dir, &rebuilt, target)?;
    } else {
        let member_dir = dir.join("member");
        std::fs::rename(rebuilt.join("member"), &member_dir).map_err(|source| SwapError::Io {
            op: "rename into",
            path: member_dir.clone(),
            source,
        })?;
        durable::fsync_dir(&dir).map_err(SwapError::from)?;
    }
    crate::failpoint!("restore-after-swap");
    survey.record_restored(target)?;
    swap::finish_rebuild(&dir);
    let record = Restored {
        sha256: request.sha256.clone(),
        file: file.display().to_string(),
        target: target.to_string(),
        restored: humantime::format_rfc3339_millis(SystemTime::now()).to_string(),
    };
    let json = serde_json::to_string(&record).unwrap_or_default();
    // Last, and durably: until it is there a restart restores again.
    survey.record_restore_done(&json)?;
    if !bumps {
        log::warn(
            "restored without a revision bump: this release's restore tool has none (3.4.27+, 3.5.10+, 3.6+ have one); clients that watch (kube-apiserver) must relist: restart them",
            &[("tool", binary.to_string().into())],
        );
    }
    log::info(
        "restored",
        &[
            ("version", VersionPair::to_string(&target).into()),
            ("snapshot", file.display().to_string().into()),
            ("ms", log::ms(started.elapsed())),
        ],
    );
    Ok(())
}

/// Whether `release`'s restore tool has `--bump-revision` and
/// `--mark-compacted` (etcdctl 3.4.27+, etcdutl 3.5.10+, 3.6 and later).
pub fn has_restore_bump(release: Version) -> bool {
    let floor = match (release.major, release.minor) {
        (3, 4) => Version::new(3, 4, 27),
        (3, 5) => Version::new(3, 5, 10),
        _ => Version::new(3, 6, 0),
    };
    release >= floor
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_revision_bump_is_used_where_the_tool_has_it() {
        for (release, has) in [
            ("3.3.25", false),
            ("3.4.23", false),
            ("3.4.27", true),
            ("3.5.1", false),
            ("3.5.16", true),
            ("3.6.0", true),
            ("3.7.1", true),
        ] {
            let release: Version = release.parse().expect("version");
            assert_eq!(has_restore_bump(release), has, "{release}");
        }
    }

    #[test]
    fn a_file_that_changes_after_its_check_is_told_by_its_identity() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("snap.db");
        std::fs::write(&path, b"pages").expect("write");
        let checked = FileIdentity::of(&path).expect("identity");
        assert_eq!(FileIdentity::of(&path).expect("again"), checked);
        // Rewritten in place (same size), then replaced by another file.
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::write(&path, b"PAGES").expect("rewrite");
        assert_ne!(FileIdentity::of(&path).expect("rewritten"), checked);
        let other = dir.path().join("other.db");
        std::fs::write(&other, b"pages").expect("write");
        std::fs::rename(&other, &path).expect("rename");
        assert_ne!(FileIdentity::of(&path).expect("replaced"), checked);
    }

    #[test]
    fn a_file_laid_out_as_snapshot_save_writes_it_is_checked_by_its_tail() {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join("snap.db");
        let body = vec![7u8; 8192];
        let mut file = body.clone();
        file.extend_from_slice(&Sha256::digest(&body));
        std::fs::write(&path, &file).expect("write");
        let (whole, b, t, bytes) = hashes(&path).expect("hashes");
        assert_eq!(bytes, 8192 + 32);
        assert_eq!(b, t);
        assert_eq!(
            whole,
            Sha256::digest(&file)
                .iter()
                .map(|x| format!("{x:02x}"))
                .collect::<String>()
        );
        // Cut short by a page: no longer laid out.
        std::fs::write(&path, &file[..4096 + 32 - 1]).expect("write");
        let (_, b, t, _) = hashes(&path).expect("hashes");
        assert_eq!((b, t), (None, None));
    }
}
