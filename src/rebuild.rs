//! This module owns the steps that rewrite the data rather than run a newer
//! etcd on it: the etcd2 → etcd3 storage migration (with per-key TTLs as
//! leases), the minor rollback by snapshot and restore, and the rollback to
//! a fresh v2 store; and the one atomic swap they all end with. Scratch work
//! happens in `<data-dir>/.etcd-migrate.work`, on the data's own
//! filesystem, so the swap is a rename even when the data dir is a mount
//! point.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::{self, DirBuilder, File};
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::time::Instant;

use nix::fcntl::{renameat2, RenameFlags, AT_FDCWD};

use crate::config::TtlLeases;
use crate::datadir::{self, DataDirError, WORK_DIR};
use crate::executor::{
    Executor, Failure, Health, Launcher, Progress, Run, Serving, StepError, Tools,
};
use crate::keyspace::{self, Entry, Fingerprint, KnownLeases, Ours};
use crate::log;
use crate::plan::Binary;
use crate::version::{Storage, Version, VersionPair};

/// The lease the flat TTL mode gives the TTL keys directory (what the
/// Kubernetes tool attached to `/registry/events`).
pub const FLAT_LEASE_SECONDS: i64 = 3600;

fn work_err(what: &str, detail: impl std::fmt::Display) -> Failure {
    Failure::Step(StepError::Work {
        what: what.to_string(),
        detail: detail.to_string(),
    })
}

/// Creates one directory with mode 0700 (etcd's data-dir mode).
fn create_private_dir(dir: &Path) -> Result<(), Failure> {
    DirBuilder::new()
        .mode(0o700)
        .create(dir)
        .map_err(|e| work_err(&format!("create {}", dir.display()), e))
}

/// Empties and recreates the scratch dir (a crashed earlier attempt may
/// have left one behind).
fn fresh_work_dir(data_dir: &Path) -> Result<PathBuf, Failure> {
    let work = data_dir.join(WORK_DIR);
    if work.exists() {
        fs::remove_dir_all(&work)
            .map_err(|e| work_err(&format!("remove leftover {}", work.display()), e))?;
    }
    create_private_dir(&work)?;
    Ok(work)
}

/// Removes the swap mark and then the scratch dir once a rebuilding step
/// is recorded (in that order: while the scratch dir and its journal
/// exist, a crash here is finished by the next start).
pub fn finish_rebuild(data_dir: &Path) {
    remove_swap_mark(data_dir);
    crate::failpoint!("finish-after-mark-removed");
    remove_work_dir(data_dir);
}

/// Removes the scratch dir once its step is recorded.
fn remove_work_dir(data_dir: &Path) {
    let work = data_dir.join(WORK_DIR);
    if !work.exists() {
        return;
    }
    if let Err(err) = fs::remove_dir_all(&work) {
        log::warn(
            "cannot remove scratch dir",
            &[
                ("path", work.display().to_string().into()),
                ("error", err.to_string().into()),
            ],
        );
    }
}

/// The journal a rebuilding step writes just before its swap: the pair
/// the data will be at, a fresh random mark, and the name of the rebuilt
/// dir in the scratch dir. The same mark is written into the rebuilt
/// `member/` ([`SWAP_MARK`]) before the exchange, so after a crash between
/// the swap and the version.txt write the next start can tell which
/// `member/` is which by content: the mark in `<data>/member` means the
/// swap happened (record the pair), the mark in the scratch copy means it
/// did not (discard the copy). Inodes would not do: a data dir copied after
/// the crash (`cp -a`, a volume move) has new ones. Without the journal, a
/// rerun would read the swapped-in data as if it were still at the old
/// version: a rebuilt v2 store read through the v3 API looks empty.
pub const SWAP_JOURNAL: &str = "swap-journal";

/// The file inside a rebuilt `member/` that carries its step's mark until
/// the step is recorded. etcd never runs with it there: it is written
/// after the rebuilt copy was last served and removed before anything
/// serves the data again.
pub const SWAP_MARK: &str = ".etcd-migrate-swap-mark";

/// Finishes or discards what an interrupted rebuilding step left in the
/// scratch dir. Call under the data-dir lock, before reading version.txt.
pub fn recover_interrupted_swap(data_dir: &Path) -> Result<Option<VersionPair>, DataDirError> {
    let work = data_dir.join(WORK_DIR);
    if !work.exists() {
        return Ok(None);
    }
    let journal = work.join(SWAP_JOURNAL);
    let mut finished = None;
    match fs::read_to_string(&journal) {
        Ok(text) => {
            let fields: Vec<&str> = text.split_whitespace().collect();
            let (pair, swapped) = match fields[..] {
                [pair, id, rebuilt] => {
                    let pair: VersionPair =
                        pair.parse().map_err(|_| bad_journal(&journal, &text))?;
                    let data_member = data_dir.join("member");
                    let copy_member = work.join(rebuilt).join("member");
                    let marked = |member: &Path| {
                        fs::read_to_string(member.join(SWAP_MARK)).is_ok_and(|m| m.trim() == id)
                    };
                    let swapped = match (marked(&data_member), marked(&copy_member)) {
                        (true, _) => true,
                        (false, true) => false,
                        // version.txt names the pair already: the step was
                        // recorded, and a crash came while its mark and
                        // scratch dir were being removed (the mark first).
                        (false, false) if records(data_dir, pair) => true,
                        (false, false) => {
                            return Err(DataDirError::UnclearSwap {
                                journal,
                                id: id.to_string(),
                                data_member,
                                copy_member,
                                work,
                            })
                        }
                    };
                    (pair, swapped)
                }
                // The first format (an inode instead of a mark), from a
                // release of etcd-migrate before the mark existed.
                [pair, ino] => {
                    let pair: VersionPair =
                        pair.parse().map_err(|_| bad_journal(&journal, &text))?;
                    let ino: u64 = ino.parse().map_err(|_| bad_journal(&journal, &text))?;
                    let member = data_dir.join("member");
                    let current = fs::metadata(&member).map_err(|source| DataDirError::Io {
                        op: "stat",
                        path: member.clone(),
                        source,
                    })?;
                    (pair, current.ino() == ino)
                }
                _ => return Err(bad_journal(&journal, &text)),
            };
            if swapped {
                datadir::write_version(data_dir, pair)?;
                crate::failpoint!("recover-after-record");
                remove_swap_mark(data_dir);
                log::warn(
                    "finished a step interrupted after its swap",
                    &[("recorded", pair.to_string().into())],
                );
                finished = Some(pair);
            } else {
                log::warn(
                    "discarded a step interrupted before its swap",
                    &[("would_have_been", pair.to_string().into())],
                );
            }
        }
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
            log::info(
                "removing scratch dir of an interrupted step",
                &[("path", work.display().to_string().into())],
            );
        }
        Err(source) => {
            return Err(DataDirError::Io {
                op: "read",
                path: journal,
                source,
            })
        }
    }
    fs::remove_dir_all(&work).map_err(|source| DataDirError::Io {
        op: "remove",
        path: work,
        source,
    })?;
    Ok(finished)
}

/// True when `version.txt` in `data_dir` names `pair`.
fn records(data_dir: &Path, pair: VersionPair) -> bool {
    matches!(datadir::inspect(data_dir), Ok(datadir::DirState::Recorded(recorded)) if recorded == pair)
}

/// Removes the mark from `<data>/member` once its step is recorded (a
/// failure only leaves a small file that the next recovery removes).
fn remove_swap_mark(data_dir: &Path) {
    let mark = data_dir.join("member").join(SWAP_MARK);
    match fs::remove_file(&mark) {
        Ok(()) => {}
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
        Err(err) => log::warn(
            "cannot remove the swap mark",
            &[
                ("path", mark.display().to_string().into()),
                ("error", err.to_string().into()),
            ],
        ),
    }
}

/// A mark no other step has used: 128 bits from the kernel's generator
/// (the time and pid if it cannot be read).
pub(crate) fn fresh_mark() -> String {
    let mut bytes = [0u8; 16];
    let read = File::open("/dev/urandom").and_then(|mut f| {
        use std::io::Read;
        f.read_exact(&mut bytes)
    });
    if read.is_err() {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default();
        bytes = (now ^ u128::from(std::process::id()) << 64).to_be_bytes();
    }
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn bad_journal(path: &Path, text: &str) -> DataDirError {
    DataDirError::Io {
        op: "parse",
        path: path.to_path_buf(),
        source: std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("unexpected content {text:?}"),
        ),
    }
}

fn fsync_dir(dir: &Path) -> Result<(), Failure> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| work_err(&format!("fsync {}", dir.display()), e))
}

/// Puts `rebuilt/member` in place of `data_dir/member` in one atomic
/// exchange: after a crash either the old member dir or the new one is in
/// place, never neither (two renames would leave a window with none). The
/// old one ends up in `rebuilt/`, removed with the scratch dir.
pub(crate) fn swap_member(
    data_dir: &Path,
    rebuilt: &Path,
    pair: VersionPair,
) -> Result<(), Failure> {
    let current = data_dir.join("member");
    let new = rebuilt.join("member");
    let work = data_dir.join(WORK_DIR);
    let rebuilt_name = rebuilt
        .strip_prefix(&work)
        .ok()
        .and_then(|name| name.to_str())
        .filter(|name| !name.is_empty() && !name.contains(char::is_whitespace))
        .ok_or_else(|| {
            work_err(
                "swap the member dirs",
                format!("{} is not a dir of {}", rebuilt.display(), work.display()),
            )
        })?;
    let mark = fresh_mark();
    let mark_path = new.join(SWAP_MARK);
    fs::write(&mark_path, format!("{mark}\n"))
        .and_then(|()| File::open(&mark_path)?.sync_all())
        .map_err(|e| work_err(&format!("write {}", mark_path.display()), e))?;
    fsync_dir(&new)?;
    let journal = work.join(SWAP_JOURNAL);
    let temp = work.join(format!("{SWAP_JOURNAL}.tmp"));
    fs::write(&temp, format!("{pair} {mark} {rebuilt_name}\n"))
        .and_then(|()| File::open(&temp)?.sync_all())
        .and_then(|()| fs::rename(&temp, &journal))
        .map_err(|e| work_err(&format!("write {}", journal.display()), e))?;
    // The journal and the mark must be on disk before the swap they
    // describe.
    fsync_dir(&work)?;
    crate::failpoint!("swap-after-journal");
    renameat2(AT_FDCWD, &current, AT_FDCWD, &new, RenameFlags::RENAME_EXCHANGE).map_err(|errno| {
        work_err(
            &format!("swap {} with {}", current.display(), new.display()),
            format!("{errno} (the filesystem must support renameat2 RENAME_EXCHANGE: ext4, xfs, btrfs, tmpfs and overlayfs do); nothing was swapped"),
        )
    })?;
    crate::failpoint!("swap-after-exchange");
    // Both directories changed entries: make the exchange durable before
    // version.txt records the step.
    fsync_dir(data_dir)?;
    fsync_dir(rebuilt)
}

/// Keys as v2 paths, checked for what the v2 store cannot hold: values and
/// keys that are not UTF-8 (v2 is JSON text), two keys that become one
/// path, and a key that would have to be both a file and a directory.
pub fn check_v2_compatible(entries: &[Entry]) -> Result<(), String> {
    let mut paths: BTreeSet<String> = BTreeSet::new();
    for entry in entries {
        let path = std::str::from_utf8(&keyspace::v2_path(&entry.key))
            .map_err(|_| {
                format!(
                    "key {:?} is not UTF-8; the v2 store holds text keys only",
                    String::from_utf8_lossy(&entry.key)
                )
            })?
            .trim_end_matches('/')
            .to_string();
        if std::str::from_utf8(&entry.value).is_err() {
            return Err(format!(
                "the value of {path} is binary (not UTF-8), which the v2 store cannot hold; for Kubernetes, switch the API server to --storage-media-type=application/json and rewrite the objects before rolling back to etcd2"
            ));
        }
        if path.split('/').skip(1).any(str::is_empty) {
            return Err(format!(
                "key {path:?} has an empty path segment, which v2 cannot represent"
            ));
        }
        if !paths.insert(path.clone()) {
            return Err(format!("two keys become the same v2 path {path}"));
        }
    }
    for path in &paths {
        let dir_prefix = format!("{path}/");
        if let Some(child) = paths
            .range(dir_prefix.clone()..)
            .next()
            .filter(|c| c.starts_with(&dir_prefix))
        {
            return Err(format!("{path} holds a value and is also the parent of {child}; in v2 a path is either a value or a directory"));
        }
    }
    Ok(())
}

impl<L: Launcher, H: Health, T: Tools, P: Progress> Executor<'_, L, H, T, P> {
    /// Serves the data with `run`, reads all of it through the API of its
    /// storage (etcd3 data: its v2 side store too; this run's health keys
    /// left out), checks it against `before` (what the last step left), and
    /// stops it. Returns the read and when it was made (TTLs count down
    /// from then).
    async fn read_source(
        &mut self,
        run: Run<'_>,
        label: &str,
        before: Option<&Fingerprint>,
    ) -> Result<(keyspace::Read, Instant), Failure> {
        let mut serving = self.start_serving(run, label).await?;
        let endpoint = serving.endpoint.clone();
        let ours = self.health.ours();
        let hidden = serving.hidden_v2.clone();
        let known = serving.known.clone();
        let read = self
            .while_serving(
                &mut serving,
                "read the keyspace",
                keyspace::read_all(&endpoint, run.storage, &ours, &hidden, &known),
            )
            .await?;
        let read_at = Instant::now();
        self.check_kept(&mut serving, before, &read.fingerprint)
            .await?;
        self.stop_serving(serving, label).await?;
        Ok((read, read_at))
    }

    /// Writes the v2 side store read from the source (`side`, read at
    /// `read_at`) into the copy `serving` serves, each key with what is
    /// left of its TTL: a v3 snapshot does not carry the v2 store.
    async fn carry_v2_side(
        &self,
        serving: &mut Serving<L::Etcd>,
        side: &[Entry],
        read_at: Instant,
        label: &str,
    ) -> Result<(), Failure> {
        if side.is_empty() {
            return Ok(());
        }
        let (to_write, expired) = still_alive(side, read_at.elapsed().as_secs() as i64);
        report_expired(label, &expired);
        let endpoint = serving.endpoint.clone();
        self.while_serving(
            serving,
            "write the v2 store's keys into the restored copy",
            keyspace::write_all_v2(&endpoint, &to_write),
        )
        .await?;
        log::info(
            "v2 store carried",
            &[("step", label.into()), ("keys", to_write.len().into())],
        );
        Ok(())
    }

    /// 3.x → 3.(x-1): `serve` saves a snapshot, `to`'s restore tool writes
    /// it into a fresh dir with the same member name, cluster, peer URLs
    /// and token, `to` proves it by serving it, and the member dirs swap.
    /// Keys, revisions and leases are in the snapshot.
    pub(crate) async fn minor_rollback(
        &mut self,
        serve: Version,
        to: Version,
        label: &str,
        before: Option<&Fingerprint>,
    ) -> Result<Fingerprint, Failure> {
        let data_dir = self.settings.data_dir.to_path_buf();
        let work = fresh_work_dir(&data_dir)?;
        let snapshot = work.join("snapshot.db");
        let restored = work.join("restored");

        let mut serving = self
            .start_serving(run(serve, Storage::Etcd3, &data_dir), label)
            .await?;
        let source = self.read_fingerprint(&mut serving, Storage::Etcd3).await?;
        self.check_kept(&mut serving, before, &source).await?;
        let before = before.unwrap_or(&source);
        // The v2 side store is not in the snapshot: read its keys now.
        let source_hidden = serving.hidden_v2.clone();
        let v2_side = match source.v2_side() {
            Some(side) if side.keys > 0 => {
                let endpoint = serving.endpoint.clone();
                let ours = self.health.ours();
                self.while_serving(
                    &mut serving,
                    "read the v2 store",
                    keyspace::read_v2(&endpoint, &ours, &source_hidden),
                )
                .await?
                .unwrap_or_default()
            }
            _ => Vec::new(),
        };
        let side_read_at = Instant::now();
        let save_args = strings(&[
            "snapshot",
            "save",
            &snapshot.to_string_lossy(),
            "--endpoints",
            &serving.endpoint,
        ]);
        let saved = self
            .offline(Binary::etcdctl(serve), &save_args, &[("ETCDCTL_API", "3")])
            .await;
        self.stop_serving(serving, label).await?;
        saved?;
        crate::failpoint!("rollback-after-snapshot-save");

        let restorer = Binary::snapshot_restorer(to);
        let settings = &self.settings;
        let restore_args = strings(&[
            "snapshot",
            "restore",
            &snapshot.to_string_lossy(),
            "--data-dir",
            &restored.to_string_lossy(),
            "--name",
            &settings.member.name,
            "--initial-cluster",
            &settings.member.initial_cluster,
            "--initial-advertise-peer-urls",
            &settings.member.initial_advertise_peer_urls,
            "--initial-cluster-token",
            &settings.member.initial_cluster_token,
        ]);
        self.offline(restorer, &restore_args, &[("ETCDCTL_API", "3")])
            .await?;
        crate::failpoint!("rollback-after-restore");

        let mut serving = self
            .start_serving(run(to, Storage::Etcd3, &restored), label)
            .await?;
        self.carry_v2_side(&mut serving, &v2_side, side_read_at, label)
            .await?;
        // The carried hidden v2 nodes are where the source had them.
        serving.hidden_v2 = source_hidden;
        let after = self.read_fingerprint(&mut serving, Storage::Etcd3).await?;
        self.check_kept(&mut serving, Some(before), &after).await?;
        self.stop_serving(serving, label).await?;
        crate::failpoint!("rollback-after-restored-served");
        swap_member(
            &data_dir,
            &restored,
            VersionPair {
                version: to,
                storage: Storage::Etcd3,
            },
        )?;
        Ok(after)
    }

    /// etcd3 → etcd2: `serve` serves the v3 data, every key is read with
    /// its lease's remaining TTL, `to` builds a fresh v2 store in the
    /// scratch dir, every key is written through the v2 API with its TTL,
    /// the copy is checked by fingerprint, and the member dirs swap.
    pub(crate) async fn rollback_to_etcd2(
        &mut self,
        serve: Version,
        to: Version,
        label: &str,
        before: Option<&Fingerprint>,
    ) -> Result<Fingerprint, Failure> {
        let data_dir = self.settings.data_dir.to_path_buf();
        let work = fresh_work_dir(&data_dir)?;
        let rebuilt = work.join("v2");
        create_private_dir(&rebuilt)?;

        let (read, read_at) = self
            .read_source(run(serve, Storage::Etcd3, &data_dir), label, before)
            .await?;
        let source = read.fingerprint;
        let before = before.unwrap_or(&source);
        check_v2_compatible(&read.entries)
            .and_then(|()| check_v2_side_fits(&read.entries, &read.v2_side))
            .and_then(|()| check_ttls_known(&read.entries, serve))
            .map_err(|detail| work_err("check that every v3 key fits the v2 store", detail))?;
        log::info(
            "v3 keyspace read",
            &[
                ("step", label.into()),
                ("fingerprint", source.to_string().into()),
            ],
        );
        crate::failpoint!("etcd2-rollback-after-v3-read");

        let mut serving = self
            .start_serving(run_new(to, Storage::Etcd2, &rebuilt), label)
            .await?;
        let endpoint = serving.endpoint.clone();
        // The v3 keys as v2 paths, and the keys the data's v2 store held
        // already: together they are the new v2 store.
        let all: Vec<Entry> = read
            .entries
            .iter()
            .map(|e| Entry {
                key: keyspace::v2_path(&e.key),
                lease: 0,
                ..e.clone()
            })
            .chain(read.v2_side.iter().cloned())
            .collect();
        let (to_write, expired) = still_alive(&all, read_at.elapsed().as_secs() as i64);
        report_expired(label, &expired);
        self.while_serving(
            &mut serving,
            "write the keys into the v2 store",
            keyspace::write_all_v2(&endpoint, &to_write),
        )
        .await?;
        crate::failpoint!("etcd2-rollback-after-v2-write");
        let ours = self.health.ours();
        // The v2 API lists no hidden node: ask for each one written.
        let hidden_written: Vec<String> = to_write
            .iter()
            .filter(|e| keyspace::is_hidden_v2(&e.key))
            .map(|e| String::from_utf8_lossy(&e.key).into_owned())
            .collect();
        let copy = self
            .while_serving(
                &mut serving,
                "read the new v2 store back",
                keyspace::read_all(
                    &endpoint,
                    Storage::Etcd2,
                    &ours,
                    &hidden_written,
                    &KnownLeases::new(),
                ),
            )
            .await?;
        let after = copy.fingerprint;
        let check = verify_copy(
            &to_write,
            &copy.entries,
            read_at.elapsed().as_secs() as i64 + 2,
        );
        if let Err(detail) = check {
            crate::executor::stop_serving_quietly(&mut serving).await;
            return Err(work_err("verify the v2 copy", detail));
        }
        self.check_kept(&mut serving, Some(before), &after).await?;
        log::info(
            "v2 store verified",
            &[
                ("step", label.into()),
                ("fingerprint", after.to_string().into()),
            ],
        );
        crate::failpoint!("etcd2-rollback-after-verify");
        self.stop_serving(serving, label).await?;
        swap_member(
            &data_dir,
            &rebuilt,
            VersionPair {
                version: to,
                storage: Storage::Etcd2,
            },
        )?;
        Ok(after)
    }

    /// etcd2 → etcd3 at `at` (3.0 … 3.4): fingerprint the v2 store while
    /// `at` serves it, convert a copy of it with `etcdctl migrate` offline,
    /// give every TTL key a lease with its own remaining TTL (keys that
    /// expire in the same second share one), check the v3 keys against the
    /// fingerprint, remove the migrated keys from the copy's v2 store (3.6
    /// refuses custom v2 content), and swap the copy in.
    ///
    /// Why a copy: `etcdctl migrate` must never run twice on one data dir.
    /// It writes each key at revision = its v2 modifiedIndex, over whatever
    /// is there; rerun on data whose v2 store was already emptied, it puts
    /// back unleased records of keys that had been re-put under leases. On
    /// a copy, any failure before the swap leaves the original untouched,
    /// and the rerun starts from scratch.
    pub(crate) async fn storage_migration(
        &mut self,
        at: Version,
        label: &str,
        before: Option<&Fingerprint>,
    ) -> Result<Fingerprint, Failure> {
        let data_dir = self.settings.data_dir.to_path_buf();
        let work = fresh_work_dir(&data_dir)?;
        let converted = work.join("converted");
        let (read, read_at) = self
            .read_source(run(at, Storage::Etcd2, &data_dir), label, before)
            .await?;
        let (v2, source) = (read.entries, read.fingerprint);
        log::info(
            "v2 keyspace read",
            &[
                ("step", label.into()),
                ("fingerprint", source.to_string().into()),
            ],
        );
        crate::failpoint!("migration-after-v2-read");

        let copying = Instant::now();
        create_private_dir(&converted)?;
        let stop = || *self.termination.borrow();
        crate::backup::copy_dir(&data_dir.join("member"), &converted.join("member"), &stop)
            .map_err(|e| match e {
                crate::backup::BackupError::Interrupted { signal, .. } => {
                    Failure::Interrupted(signal)
                }
                e => work_err("copy the data for conversion", e),
            })?;
        log::info(
            "data copied for conversion",
            &[("step", label.into()), ("ms", log::ms(copying.elapsed()))],
        );
        crate::failpoint!("migration-after-copy");
        let migrate_args = strings(&["migrate", "--data-dir", &converted.to_string_lossy()]);
        self.offline(Binary::etcdctl(at), &migrate_args, &[("ETCDCTL_API", "3")])
            .await?;
        crate::failpoint!("migration-after-etcdctl-migrate");

        let mut serving = self
            .start_serving(run(at, Storage::Etcd3, &converted), label)
            .await?;
        let endpoint = serving.endpoint.clone();
        let serving_hidden = serving.hidden_v2.clone();
        let plan = lease_plan(
            &v2,
            read_at.elapsed().as_secs() as i64,
            self.settings.ttl_leases,
            self.settings.ttl_keys_directory,
        );
        report_expired(label, &plan.expired);
        let leased = plan.groups.values().map(Vec::len).sum::<usize>();
        let ours = self.health.ours();
        let granted = self
            .while_serving(
                &mut serving,
                "attach leases to TTL keys",
                apply_leases(&endpoint, &plan, &ours, &hidden_without_ttl(&v2, &plan)),
            )
            .await?;
        // 3.0 cannot tell these leases' TTLs; the reads below take them
        // from what was granted.
        serving.known.extend(granted);
        log::info(
            "leases attached",
            &[
                ("step", label.into()),
                ("leases", plan.groups.len().into()),
                ("keys", leased.into()),
                ("expired", plan.expired.len().into()),
            ],
        );
        crate::failpoint!("migration-after-leases");

        let known = serving.known.clone();
        let converted_read = self
            .while_serving(
                &mut serving,
                "read the v3 keyspace",
                keyspace::read_all(&endpoint, Storage::Etcd3, &ours, &serving_hidden, &known),
            )
            .await?;
        let (v3, after) = (converted_read.entries, converted_read.fingerprint);
        // What v3 must hold: the v2 keys, less the expired, with the
        // expiry the lease plan gave them.
        let expected: Vec<Entry> = flat_expiry(&v2, &plan)
            .into_iter()
            .filter(|e| {
                !plan
                    .expired
                    .iter()
                    .any(|x| x.as_bytes() == e.key.as_slice())
            })
            .collect();
        let tolerance = read_at.elapsed().as_secs() as i64 + 2;
        if let Err(detail) = verify_migration(&expected, &v3, &plan, tolerance) {
            crate::executor::stop_serving_quietly(&mut serving).await;
            return Err(work_err(
                "verify the v3 keys against the v2 fingerprint",
                detail,
            ));
        }
        // What the step means to keep: the keyspace as the last step left
        // it, except that flat mode gives every key under the TTL keys
        // directory a lease.
        let intended = match self.settings.ttl_leases {
            TtlLeases::Exact => before.cloned().unwrap_or(source),
            TtlLeases::Flat => {
                Fingerprint::new(Storage::Etcd2, &flat_expiry(&v2, &plan), None, read_at)
            }
        };
        self.check_kept(&mut serving, Some(&intended), &after)
            .await?;
        log::info(
            "v3 keys verified",
            &[
                ("step", label.into()),
                ("fingerprint", after.to_string().into()),
            ],
        );
        crate::failpoint!("migration-after-verify");

        if !self.settings.keep_v2_keys {
            let removed = self
                .while_serving(
                    &mut serving,
                    "remove the migrated keys from the v2 store",
                    keyspace::delete_v2_tree(&endpoint, &serving_hidden),
                )
                .await?;
            log::info(
                "v2 store emptied of migrated keys",
                &[("step", label.into()), ("top_level_nodes", removed.into())],
            );
            crate::failpoint!("migration-after-v2-emptied");
        }
        // What the data's v2 store holds now (nothing, or the migrated
        // keys with --keep-v2-keys) is what the next steps must keep.
        let ours = self.health.ours();
        let v2_left = self
            .while_serving(
                &mut serving,
                "read what the v2 store holds now",
                keyspace::read_v2(&endpoint, &ours, &serving_hidden),
            )
            .await?
            .map(|left| Fingerprint::new(Storage::Etcd2, &left, None, Instant::now()));
        let after = after.with_v2_side(v2_left);
        self.stop_serving(serving, label).await?;
        swap_member(
            &data_dir,
            &converted,
            VersionPair {
                version: at,
                storage: Storage::Etcd3,
            },
        )?;
        Ok(after)
    }
}

/// The v2 entries as the lease plan means them to end up: every key it
/// puts under a lease expires (in flat mode, also keys of the TTL keys
/// directory that had no TTL).
fn flat_expiry(v2: &[Entry], plan: &LeasePlan) -> Vec<Entry> {
    let leased: BTreeSet<&[u8]> = plan
        .groups
        .values()
        .flatten()
        .map(|e| e.key.as_slice())
        .collect();
    v2.iter()
        .map(|e| Entry {
            ttl: e.ttl.or(leased
                .contains(e.key.as_slice())
                .then_some(FLAT_LEASE_SECONDS)),
            ..e.clone()
        })
        .collect()
}

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| s.to_string()).collect()
}

fn run(version: Version, storage: Storage, data_dir: &Path) -> Run<'_> {
    Run {
        version,
        storage,
        data_dir,
        new_cluster: false,
    }
}

fn run_new(version: Version, storage: Storage, data_dir: &Path) -> Run<'_> {
    Run {
        new_cluster: true,
        ..run(version, storage, data_dir)
    }
}

/// The entries whose TTL has not run out `elapsed` seconds after they
/// were read, each with what is left of it, and the keys of those whose
/// TTL has.
fn still_alive(entries: &[Entry], elapsed: i64) -> (Vec<Entry>, Vec<String>) {
    let mut expired = Vec::new();
    let alive = entries
        .iter()
        .filter_map(|e| match e.ttl {
            Some(ttl) if ttl - elapsed <= 0 => {
                expired.push(String::from_utf8_lossy(&e.key).into_owned());
                None
            }
            ttl => Some(Entry {
                ttl: ttl.map(|ttl| ttl - elapsed),
                ..e.clone()
            }),
        })
        .collect();
    (alive, expired)
}

/// The keys of the data's v2 store must not fall on the v2 paths of its
/// v3 keys (one path, or one a directory of the other), since both go
/// into one v2 store. Names both keys of a clash.
pub fn check_v2_side_fits(v3: &[Entry], v2_side: &[Entry]) -> Result<(), String> {
    if v2_side.is_empty() {
        return Ok(());
    }
    let v3_paths: BTreeMap<String, &[u8]> = v3
        .iter()
        .map(|e| {
            (
                String::from_utf8_lossy(&keyspace::v2_path(&e.key)).into_owned(),
                e.key.as_slice(),
            )
        })
        .collect();
    for entry in v2_side {
        let path = String::from_utf8_lossy(&entry.key).into_owned();
        let clash = v3_paths.get(&path).map(|k| (path.clone(), *k)).or_else(|| {
            // A v3 key under this path, or a v3 key that is a parent of it.
            let below = format!("{path}/");
            v3_paths
                .range(below.clone()..)
                .next()
                .filter(|(p, _)| p.starts_with(&below))
                .map(|(p, k)| (p.clone(), *k))
                .or_else(|| {
                    v3_paths
                        .iter()
                        .find(|(p, _)| path.starts_with(&format!("{p}/")))
                        .map(|(p, k)| (p.clone(), *k))
                })
        });
        if let Some((v3_path, v3_key)) = clash {
            return Err(format!(
                "the data holds the v2 key {path} and the v3 key {:?} (v2 path {v3_path}), which cannot both live in one v2 store; remove or rename one of them (etcdctl --api v2 / ETCDCTL_API=2 for the v2 key) and rerun",
                String::from_utf8_lossy(v3_key)
            ));
        }
    }
    Ok(())
}

/// Every leased v3 key must come with its TTL, since the v2 store needs
/// one (a key written without it would never expire). Only a release
/// without LeaseTimeToLive (3.0, `serve`) can leave it unknown, and only
/// when the data's own record of the lease could not be read.
fn check_ttls_known(entries: &[Entry], serve: Version) -> Result<(), String> {
    match entries.iter().find(|e| e.lease != 0 && e.ttl.is_none()) {
        None => Ok(()),
        Some(entry) => Err(format!(
            "the TTL of lease {:x} (on {:?}) is unknown: etcd {serve} cannot tell it (no LeaseTimeToLive) and the data's lease table could not be read (see the warning above), and a v2 key written without its TTL would never expire; restore the data's member/snap/db from a backup if it is damaged, or let the lease expire (or revoke it) before rolling back",
            entry.lease,
            String::from_utf8_lossy(&entry.key)
        )),
    }
}

fn report_expired(label: &str, expired: &[String]) {
    if expired.is_empty() {
        return;
    }
    let shown: Vec<&str> = expired.iter().take(10).map(String::as_str).collect();
    log::warn(
        "keys whose TTL ran out during the migration are not carried over",
        &[
            ("step", label.into()),
            ("count", expired.len().into()),
            ("keys", shown.join(",").into()),
        ],
    );
}

/// Which keys get which lease.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct LeasePlan {
    /// Lease TTL in seconds → the keys (and values) under it.
    pub groups: BTreeMap<i64, Vec<Entry>>,
    /// Keys whose TTL ran out: deleted from v3, not carried over.
    pub expired: Vec<String>,
}

/// Groups TTL keys by the second they expire in: `elapsed` seconds have
/// passed since their TTLs were read. In flat mode, every key under
/// `ttl_dir` gets the one-hour lease instead.
pub fn lease_plan(v2: &[Entry], elapsed: i64, mode: TtlLeases, ttl_dir: &str) -> LeasePlan {
    let mut plan = LeasePlan::default();
    let flat_prefix = format!("{}/", ttl_dir.trim_end_matches('/'));
    for entry in v2 {
        let key = String::from_utf8_lossy(&entry.key);
        if mode == TtlLeases::Flat && key.starts_with(&flat_prefix) {
            plan.groups
                .entry(FLAT_LEASE_SECONDS)
                .or_default()
                .push(entry.clone());
            continue;
        }
        if let Some(ttl) = entry.ttl {
            let left = ttl - elapsed;
            if left <= 0 {
                plan.expired.push(key.into_owned());
            } else {
                plan.groups.entry(left).or_default().push(entry.clone());
            }
        }
    }
    plan
}

/// The hidden v2 keys (a name starting with `_`) that the lease plan
/// leaves without a lease: `etcdctl migrate` does not copy hidden nodes
/// (the v2 store's listing skips them), so they are put into v3 by hand.
fn hidden_without_ttl(v2: &[Entry], plan: &LeasePlan) -> Vec<Entry> {
    let leased: BTreeSet<&[u8]> = plan
        .groups
        .values()
        .flatten()
        .map(|e| e.key.as_slice())
        .collect();
    v2.iter()
        .filter(|e| {
            keyspace::is_hidden_v2(&e.key) && e.ttl.is_none() && !leased.contains(e.key.as_slice())
        })
        .cloned()
        .collect()
}

/// Grants one lease per group and re-puts its keys under it; puts the
/// hidden keys `etcdctl migrate` skipped (`hidden`, and those of the
/// groups); deletes the expired keys that it copied without a TTL.
/// Returns the leases granted, each TTL counted from just before its
/// grant.
async fn apply_leases(
    endpoint: &str,
    plan: &LeasePlan,
    ours: &Ours,
    hidden: &[Entry],
) -> Result<KnownLeases, String> {
    let mut granted = KnownLeases::new();
    let mut client = keyspace::v3_client(endpoint).await?;
    // A health key of this run whose removal failed is still in the v2
    // store until its TTL runs out, and `etcdctl migrate` copied it
    // without one: remove the copy.
    client
        .delete(
            ours.key_prefix().as_bytes(),
            Some(etcd_client::DeleteOptions::new().with_prefix()),
        )
        .await
        .map_err(|e| format!("delete {}*: {e}", ours.key_prefix()))?;
    for entry in hidden {
        client
            .put(entry.key.clone(), entry.value.clone(), None)
            .await
            .map_err(|e| format!("put hidden {}: {e}", String::from_utf8_lossy(&entry.key)))?;
    }
    for key in &plan.expired {
        client
            .delete(key.as_bytes(), None)
            .await
            .map_err(|e| format!("delete expired {key}: {e}"))?;
    }
    for (ttl, entries) in &plan.groups {
        let asked = Instant::now();
        let lease = client
            .lease_grant(*ttl, None)
            .await
            .map_err(|e| format!("grant a {ttl} s lease: {e}"))?;
        granted.insert(lease.id(), lease.ttl(), asked);
        for entry in entries {
            // Only if `etcdctl migrate` copied it: a key the v2 store purged
            // after we read it must not come back, even briefly. A hidden
            // key it never copies: the read just before is its proof.
            let options = etcd_client::PutOptions::new().with_lease(lease.id());
            let guard = if keyspace::is_hidden_v2(&entry.key) {
                Vec::new()
            } else {
                vec![etcd_client::Compare::version(
                    entry.key.clone(),
                    etcd_client::CompareOp::Greater,
                    0,
                )]
            };
            let txn = etcd_client::Txn::new()
                .when(guard)
                .and_then([etcd_client::TxnOp::put(
                    entry.key.clone(),
                    entry.value.clone(),
                    Some(options),
                )]);
            client.txn(txn).await.map_err(|e| {
                format!(
                    "put {} under lease {:x}: {e}",
                    String::from_utf8_lossy(&entry.key),
                    lease.id()
                )
            })?;
        }
    }
    Ok(granted)
}

/// The v3 keys that came from v2 must match it exactly, and every leased
/// key must carry a TTL within `tolerance` seconds of its plan. A TTL key
/// that is missing because its TTL ran out (within `tolerance`) since the
/// read counts as expired, not as lost.
fn verify_migration(
    expected: &[Entry],
    v3: &[Entry],
    plan: &LeasePlan,
    tolerance: i64,
) -> Result<(), String> {
    let present: BTreeSet<&[u8]> = v3.iter().map(|e| e.key.as_slice()).collect();
    // Each leased key's TTL first: the most precise report.
    let ttl_of: BTreeMap<&[u8], Option<i64>> =
        v3.iter().map(|e| (e.key.as_slice(), e.ttl)).collect();
    for (ttl, entries) in &plan.groups {
        for entry in entries
            .iter()
            .filter(|e| present.contains(e.key.as_slice()))
        {
            match ttl_of.get(entry.key.as_slice()).copied().flatten() {
                Some(left) if left <= *ttl && left >= ttl - tolerance => {}
                other => {
                    return Err(format!(
                        "{} should expire in about {ttl} s but its lease says {other:?}",
                        String::from_utf8_lossy(&entry.key)
                    ))
                }
            }
        }
    }
    let expected: Vec<Entry> = expected
        .iter()
        .filter(|e| present.contains(e.key.as_slice()) || e.ttl.is_none_or(|t| t > tolerance))
        .cloned()
        .collect();
    let expected = expected.as_slice();
    let wanted: BTreeSet<&[u8]> = expected.iter().map(|e| e.key.as_slice()).collect();
    let migrated: Vec<Entry> = v3
        .iter()
        .filter(|e| wanted.contains(e.key.as_slice()))
        .cloned()
        .collect();
    let (want, got) = (
        Fingerprint::of(Storage::Etcd2, expected),
        Fingerprint::of(Storage::Etcd3, &migrated),
    );
    if !want.same_content(&got) {
        let have: BTreeSet<&[u8]> = migrated.iter().map(|e| e.key.as_slice()).collect();
        let missing: Vec<String> = wanted
            .difference(&have)
            .take(5)
            .map(|k| String::from_utf8_lossy(k).into_owned())
            .collect();
        return Err(format!(
            "v2 had {want}, v3 has {got} of those keys; missing: {missing:?}"
        ));
    }
    Ok(())
}

/// The v2 copy must hold exactly the keys written, with TTLs no longer
/// than written and no more than `tolerance` seconds shorter.
fn verify_copy(written: &[Entry], copied: &[Entry], tolerance: i64) -> Result<(), String> {
    let (want, got) = (
        Fingerprint::of(Storage::Etcd2, written),
        Fingerprint::of(Storage::Etcd2, copied),
    );
    if !want.same_content(&got) {
        return Err(format!("wrote {want}, the v2 store holds {got}"));
    }
    let ttl_of: BTreeMap<&[u8], Option<i64>> =
        copied.iter().map(|e| (e.key.as_slice(), e.ttl)).collect();
    for entry in written {
        let got = ttl_of.get(entry.key.as_slice()).copied().flatten();
        let ok = match (entry.ttl, got) {
            (None, None) => true,
            (Some(want), Some(got)) => got <= want && got >= want - tolerance,
            _ => false,
        };
        if !ok {
            return Err(format!(
                "{} was written with TTL {:?} but holds {got:?}",
                String::from_utf8_lossy(&entry.key),
                entry.ttl
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(key: &str, value: &str, ttl: Option<i64>) -> Entry {
        Entry {
            lease: 0,
            key: key.as_bytes().to_vec(),
            value: value.as_bytes().to_vec(),
            ttl,
        }
    }

    #[test]
    fn keys_expiring_in_the_same_second_share_a_lease() {
        let v2 = [
            e("/a", "1", Some(100)),
            e("/b", "2", Some(100)),
            e("/c", "3", Some(40)),
            e("/d", "4", None),
            e("/e", "5", Some(3)),
        ];
        let plan = lease_plan(&v2, 5, TtlLeases::Exact, "/registry/events");
        assert_eq!(plan.groups.keys().copied().collect::<Vec<_>>(), [35, 95]);
        assert_eq!(plan.groups[&95].len(), 2);
        assert_eq!(plan.expired, ["/e"]);
    }

    #[test]
    fn flat_mode_gives_the_ttl_directory_one_hour() {
        let v2 = [
            e("/registry/events/x", "1", Some(100)),
            e("/registry/events/y", "2", None),
            e("/registry/pods/p", "3", Some(50)),
        ];
        let plan = lease_plan(&v2, 0, TtlLeases::Flat, "/registry/events");
        assert_eq!(plan.groups[&FLAT_LEASE_SECONDS].len(), 2);
        assert_eq!(plan.groups[&50].len(), 1);
    }

    #[test]
    fn v2_refuses_what_it_cannot_hold() {
        assert!(check_v2_compatible(&[e("/a/b", "1", None), e("c", "2", None)]).is_ok());
        let err = check_v2_compatible(&[e("/a", "1", None), e("/a/b", "2", None)]).unwrap_err();
        assert!(
            err.contains("/a holds a value and is also the parent of /a/b"),
            "{err}"
        );
        let err = check_v2_compatible(&[e("a", "1", None), e("/a", "2", None)]).unwrap_err();
        assert!(err.contains("two keys become the same v2 path /a"), "{err}");
        let binary = Entry {
            lease: 0,
            key: b"/k".to_vec(),
            value: vec![0xff, 0x00],
            ttl: None,
        };
        let err = check_v2_compatible(&[binary]).unwrap_err();
        assert!(
            err.contains("--storage-media-type=application/json"),
            "{err}"
        );
        assert!(check_v2_compatible(&[e("/a//b", "1", None)]).is_err());
    }

    #[test]
    fn a_leased_key_without_a_known_ttl_is_not_written_to_v2_forever() {
        let serve: Version = "3.0.17".parse().expect("version");
        let known = Entry {
            lease: 7,
            ..e("/registry/events/a", "1", Some(3500))
        };
        assert!(check_ttls_known(&[e("/p", "1", None), known.clone()], serve).is_ok());
        let unknown = Entry {
            lease: 0x2a,
            ..e("/registry/events/b", "2", None)
        };
        let err = check_ttls_known(&[known, unknown], serve).expect_err("refused");
        assert!(
            err.contains("lease 2a")
                && err.contains("/registry/events/b")
                && err.contains("3.0.17"),
            "{err}"
        );
    }

    #[test]
    fn migration_check_catches_missing_keys_and_wrong_ttls() {
        let v2 = [e("/a", "1", Some(100)), e("/b", "2", None)];
        let plan = lease_plan(&v2, 0, TtlLeases::Exact, "/registry/events");
        let good = [
            e("/a", "1", Some(99)),
            e("/b", "2", None),
            e("/other", "v3 key kept", None),
        ];
        assert!(verify_migration(&v2, &good, &plan, 3).is_ok());
        let missing = [e("/a", "1", Some(99))];
        assert!(verify_migration(&v2, &missing, &plan, 3)
            .unwrap_err()
            .contains("missing: [\"/b\"]"));
        // A TTL key that ran out since the read is not "lost".
        let short = [e("/s", "1", Some(2)), e("/b", "2", None)];
        let short_plan = lease_plan(&short, 0, TtlLeases::Exact, "/registry/events");
        assert!(verify_migration(&short, &[e("/b", "2", None)], &short_plan, 3).is_ok());
        let no_lease = [e("/a", "1", None), e("/b", "2", None)];
        assert!(verify_migration(&v2, &no_lease, &plan, 3)
            .unwrap_err()
            .contains("should expire in about 100 s"));
    }

    #[test]
    fn swap_exchanges_member_dirs_atomically() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let data = tmp.path().join("data");
        let rebuilt = tmp.path().join("data/.etcd-migrate.work/v2");
        fs::create_dir_all(data.join("member")).expect("mkdir");
        fs::write(data.join("member/old"), "").expect("write");
        fs::create_dir_all(rebuilt.join("member")).expect("mkdir");
        fs::write(rebuilt.join("member/new"), "").expect("write");
        let pair: VersionPair = "3.4.23/etcd3".parse().expect("pair");
        assert!(swap_member(&data, &rebuilt, pair).is_ok());
        assert!(data.join("member/new").exists() && rebuilt.join("member/old").exists());
        // Died before recording: the next start finishes the step, and
        // removes the mark.
        crate::datadir::write_version(&data, "3.5.16/etcd3".parse().expect("pair")).expect("write");
        assert_eq!(
            recover_interrupted_swap(&data).expect("recovers"),
            Some(pair)
        );
        assert_eq!(
            fs::read_to_string(data.join("version.txt")).expect("read"),
            "3.4.23/etcd3"
        );
        assert!(!data.join(WORK_DIR).exists());
        assert!(!data.join("member").join(SWAP_MARK).exists());
    }

    /// Lays out a data dir whose rebuilding step died right after (or
    /// right before) its swap; returns the data dir.
    fn interrupted_swap(tmp: &Path, swapped: bool) -> PathBuf {
        let data = tmp.join("data");
        let rebuilt = data.join(WORK_DIR).join("v2");
        fs::create_dir_all(data.join("member")).expect("mkdir");
        fs::write(data.join("member/old"), "").expect("write");
        fs::create_dir_all(rebuilt.join("member")).expect("mkdir");
        fs::write(rebuilt.join("member/new"), "").expect("write");
        crate::datadir::write_version(&data, "3.3.25/etcd3".parse().expect("pair")).expect("write");
        if swapped {
            assert!(swap_member(&data, &rebuilt, "3.3.25/etcd2".parse().expect("pair")).is_ok());
        } else {
            // The journal and the mark are written, the exchange is not.
            let mark = "00ff";
            fs::write(rebuilt.join("member").join(SWAP_MARK), mark).expect("write");
            fs::write(
                data.join(WORK_DIR).join(SWAP_JOURNAL),
                format!("3.3.25/etcd2 {mark} v2\n"),
            )
            .expect("write");
        }
        data
    }

    /// `cp -a` of a dir tree: new inodes, same content.
    fn copy_tree(from: &Path, to: &Path) {
        let status = std::process::Command::new("cp")
            .arg("-a")
            .arg(from)
            .arg(to)
            .status()
            .expect("cp");
        assert!(status.success());
    }

    #[test]
    fn a_data_dir_copied_after_a_crash_at_the_swap_is_finished_not_wiped() {
        // Regression: the journal named the swapped-in member dir by inode;
        // a copy has new inodes, so the rerun "discarded" the step and
        // removed the scratch dir, which held the data from before the
        // step, then read the rebuilt v2 store through the v3 API as empty.
        for swapped in [true, false] {
            let tmp = tempfile::tempdir().expect("tempdir");
            let data = interrupted_swap(tmp.path(), swapped);
            let copy = tmp.path().join("copy");
            copy_tree(&data, &copy);
            let finished = recover_interrupted_swap(&copy).expect("recovers");
            let version = fs::read_to_string(copy.join("version.txt")).expect("read");
            if swapped {
                assert_eq!(finished, Some("3.3.25/etcd2".parse().expect("pair")));
                assert_eq!(version, "3.3.25/etcd2");
                assert!(copy.join("member/new").exists(), "the rebuilt data stays");
            } else {
                assert_eq!(finished, None);
                assert_eq!(version, "3.3.25/etcd3");
                assert!(copy.join("member/old").exists(), "the original data stays");
            }
            assert!(!copy.join(WORK_DIR).exists());
            assert!(!copy.join("member").join(SWAP_MARK).exists());
        }
    }

    #[test]
    fn a_swap_whose_mark_is_nowhere_is_refused_and_nothing_removed() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let data = interrupted_swap(tmp.path(), true);
        fs::remove_file(data.join("member").join(SWAP_MARK)).expect("remove the mark");
        let err = recover_interrupted_swap(&data).expect_err("unclear");
        assert!(matches!(err, DataDirError::UnclearSwap { .. }), "{err}");
        assert!(err.to_string().contains("nothing was changed"), "{err}");
        assert!(data.join(WORK_DIR).join("v2/member/old").exists());
        assert!(data.join("member/new").exists());
        assert_eq!(
            fs::read_to_string(data.join("version.txt")).expect("read"),
            "3.3.25/etcd3"
        );
    }

    #[test]
    fn a_recorded_step_killed_between_removing_its_mark_and_its_scratch_dir_is_finished() {
        // Regression (found by the random-kill test under load): the mark
        // was gone from member/, the old data (unmarked) in the scratch
        // dir, and the rerun refused as "unclear" although version.txt
        // already named the step.
        let tmp = tempfile::tempdir().expect("tempdir");
        let data = interrupted_swap(tmp.path(), true);
        fs::write(data.join("version.txt"), "3.3.25/etcd2").expect("record");
        fs::remove_file(data.join("member").join(SWAP_MARK)).expect("remove the mark");
        let finished = recover_interrupted_swap(&data).expect("recovers");
        assert_eq!(finished, Some("3.3.25/etcd2".parse().expect("pair")));
        assert!(data.join("member/new").exists(), "the rebuilt data stays");
        assert!(!data.join(WORK_DIR).exists());
    }

    #[test]
    fn a_journal_without_its_swap_is_discarded() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let data = tmp.path().join("data");
        fs::create_dir_all(data.join("member")).expect("mkdir");
        fs::create_dir_all(data.join(WORK_DIR).join("v2/member")).expect("mkdir");
        fs::write(data.join(WORK_DIR).join(SWAP_JOURNAL), "3.3.25/etcd2 1\n").expect("write");
        crate::datadir::write_version(&data, "3.3.25/etcd3".parse().expect("pair")).expect("write");
        assert_eq!(recover_interrupted_swap(&data).expect("recovers"), None);
        assert_eq!(
            fs::read_to_string(data.join("version.txt")).expect("read"),
            "3.3.25/etcd3"
        );
        assert!(!data.join(WORK_DIR).exists());
    }
}
