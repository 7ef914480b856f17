//! This module owns the data dir's state as one run sees it, and the run's
//! writes to it. Two looks, no more:
//! - [`glance`], before any lock: what `version.txt` records, the hold,
//!   whether an earlier run was interrupted (a scratch dir, a `version.txt`
//!   temp file, a restart mark), and, when a restore or a forced new
//!   cluster is asked, the record of the last one. Enough for the fast path (already at the
//!   target: exec), which must stay a few stats and one small read.
//! - [`Survey::take`], for every other run: access checked, the dir locked
//!   (when it exists and the run may change it), an earlier run's
//!   processes on it waited for, an interrupted record or swap finished or
//!   discarded, then `version.txt` and the restart mark read, and, when
//!   the run may change the data, what `ondisk` reads of it (once, with
//!   what the checks of this run want). The plan, the preconditions, the
//!   executor and the cluster roll read this value.
//!
//! Every write the run makes to the data dir's records goes through the
//! survey ([`Survey::record`], [`Survey::hold`], [`Survey::make_ready`]),
//! so the value stays what the disk says. The cluster roll's own ledger
//! (`cluster::member::DataLedger`) writes its marks while the survey's
//! lock is held by the roll, below this module.

use std::path::{Path, PathBuf};

use crate::config::{Config, Mode};
use crate::datadir::{self, DataDirError, DirLock, DirState};
use crate::log;
use crate::ondisk::OnDisk;
use crate::preconditions::{self, PreconditionError};
use crate::swap;
use crate::version::{Version, VersionPair};

/// Why the data dir could not be surveyed or written.
#[derive(Debug, thiserror::Error)]
pub enum SurveyError {
    /// The data dir itself (a lock, a record, a malformed file).
    #[error(transparent)]
    DataDir(#[from] DataDirError),
    /// A precondition the dir must meet (access, processes on it).
    #[error(transparent)]
    Precondition(#[from] PreconditionError),
    /// The dir changed between its creation and its lock.
    #[error("data dir {dir} changed while etcd-migrate was creating it (now {now:?}); rerun")]
    ChangedWhileCreated {
        /// The data dir.
        dir: String,
        /// What it holds now.
        now: DirState,
    },
}

/// What a look before the lock finds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Glance {
    /// What `version.txt` records (`None`: the look failed in a way the
    /// survey under the lock reports, if it still holds then).
    pub state: Option<DirState>,
    /// An earlier run died mid-step, mid-record or mid-roll: never the
    /// fast path; the survey cleans up under the lock.
    pub interrupted: bool,
    /// The sha256 of the snapshot the data was last restored from (read
    /// only when the run asks for a restore).
    pub restored: Option<String>,
    /// The data records a `--force-new-cluster` start (looked for only
    /// when the run asks for one).
    pub forced: bool,
}

impl Glance {
    /// The data already records `target` and nothing is left half done.
    pub fn at(&self, target: VersionPair) -> bool {
        self.state == Some(DirState::Recorded(target)) && !self.interrupted
    }
}

/// The look before the lock: a scratch dir, a `version.txt` temp file or
/// a restart mark sends the run down the locked path; a hold refuses it
/// at once (the one error that does not wait for the lock).
/// `restoring`: the run asks for a restore, so its record is read too.
pub fn glance(dir: &Path, restoring: bool, forcing: bool) -> Result<Glance, PreconditionError> {
    let interrupted = dir.join(datadir::WORK_DIR).exists()
        || dir.join(datadir::VERSION_TEMP_FILE).exists()
        || dir.join(datadir::RESTART_MARK_FILE).exists()
        // A member in a whole-cluster pause job carries on with the job.
        || dir.join(datadir::PAUSE_FILE).exists()
        // A join as a learner died before it was recorded.
        || dir.join(datadir::JOINING_FILE).exists();
    let state = preconditions::check_not_held(datadir::inspect(dir))?;
    let restored = restoring.then(|| datadir::read_restored(dir)).flatten();
    let forced = forcing && datadir::forced(dir);
    Ok(Glance {
        state,
        interrupted,
        restored,
        forced,
    })
}

/// The data dir as surveyed under its lock, and the one writer of its
/// records for the rest of the run.
#[derive(Debug)]
pub struct Survey {
    dir: PathBuf,
    lock: Option<DirLock>,
    state: DirState,
    restart_mark: Option<Version>,
    /// A scratch dir is there after the survey: an interrupted step left
    /// it, and a dry run (which recovers nothing) says so.
    scratch: bool,
    on_disk: Option<OnDisk>,
}

impl Survey {
    /// Takes the survey for `config`'s data dir (see the module doc). A
    /// dry run locks nothing and changes nothing.
    pub fn take(config: &Config, glance: &Glance) -> Result<Survey, SurveyError> {
        let dir = config.data_dir.clone();
        preconditions::check_access(config)?;
        let lock = if dir.is_dir() && config.mode != Mode::DryRun {
            let lock = datadir::lock(&dir)?;
            preconditions::wait_for_processes_on(&dir)?;
            if glance.interrupted {
                datadir::remove_stale_version_temp(&dir)?;
                swap::recover_interrupted_swap(&dir)?;
                datadir::recover_interrupted_join(&dir)?;
            }
            Some(lock)
        } else {
            None
        };
        let state = datadir::inspect(&dir)?;
        let restart_mark = match state {
            DirState::Recorded(_) => datadir::read_restart_mark(&dir)?,
            DirState::Missing | DirState::Empty => None,
        };
        let scratch = glance.interrupted && dir.join(datadir::WORK_DIR).exists();
        // What the data records, read once, when anything may change it.
        let on_disk = match state {
            DirState::Recorded(current) if current != config.target || restart_mark.is_some() => {
                preconditions::read_data(config, &preconditions::wanted(current, config.target))
            }
            _ => None,
        };
        Ok(Survey {
            dir,
            lock,
            state,
            restart_mark,
            scratch,
            on_disk,
        })
    }

    /// The data dir.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// What `version.txt` records.
    pub fn state(&self) -> DirState {
        self.state.clone()
    }

    /// The release the cluster mode started on the data that
    /// `version.txt` does not record yet.
    pub fn restart_mark(&self) -> Option<Version> {
        self.restart_mark
    }

    /// An interrupted step's scratch dir is still there (only a dry run,
    /// which recovers nothing, finds one).
    pub fn scratch(&self) -> bool {
        self.scratch
    }

    /// What the data records, read offline by [`Survey::take`] when the
    /// run may change it (`None`: not read, nothing recorded, or the read
    /// failed, which was logged).
    pub fn on_disk(&self) -> Option<&OnDisk> {
        self.on_disk.as_ref()
    }

    /// What the data records, read now if [`Survey::take`] did not (the
    /// data at the target: a force of a new cluster still needs its
    /// membership).
    pub fn read_now(&mut self, config: &Config) -> Option<&OnDisk> {
        if self.on_disk.is_none() {
            if let DirState::Recorded(current) = self.state {
                self.on_disk = preconditions::read_data(
                    config,
                    &preconditions::wanted(current, config.target),
                );
            }
        }
        self.on_disk.as_ref()
    }

    /// What the read found, taken out for whoever consumes it next.
    pub fn take_on_disk(&mut self) -> Option<OnDisk> {
        self.on_disk.take()
    }

    /// Ready for the first change: created (0700) when missing, locked
    /// when it was not (and still empty, or another migrator wrote into it
    /// in between), its mode corrected to what etcd wants.
    pub fn make_ready(&mut self) -> Result<(), SurveyError> {
        if self.state == DirState::Missing {
            datadir::create(&self.dir)?;
            self.state = DirState::Empty;
            log::info(
                "created data dir",
                &[
                    ("data_dir", self.dir.display().to_string().into()),
                    ("mode", "0700".into()),
                ],
            );
        }
        if self.lock.is_none() {
            let lock = datadir::lock(&self.dir)?;
            // The dir was created (or found empty) before the lock: make
            // sure no other migrator wrote into it in between.
            let now = datadir::inspect(&self.dir)?;
            if now != DirState::Empty {
                return Err(SurveyError::ChangedWhileCreated {
                    dir: self.dir.display().to_string(),
                    now,
                });
            }
            self.lock = Some(lock);
        }
        // Under the lock, before the first change: etcd wants its data dir
        // 0700 (the Kubernetes tool created it 0755).
        match datadir::correct_mode(&self.dir) {
            Ok(Some(old)) => log::info(
                "corrected data dir mode",
                &[
                    ("data_dir", self.dir.display().to_string().into()),
                    ("from", format!("{old:04o}").into()),
                    ("to", format!("{:04o}", datadir::DATA_DIR_MODE).into()),
                ],
            ),
            Ok(None) => {}
            // Not ours to change (another owner): etcd only warns about it.
            Err(err) => log::warn(
                "cannot correct the data dir mode",
                &[("error", err.to_string().into())],
            ),
        }
        Ok(())
    }

    /// `version.txt` := `pair`, durably; the survey says so too.
    pub fn record(&mut self, pair: VersionPair) -> Result<(), DataDirError> {
        datadir::write_version(&self.dir, pair)?;
        self.state = DirState::Recorded(pair);
        Ok(())
    }

    /// `version.txt` := `pair` and the restart mark gone (it spoke of the
    /// data a restore replaced).
    pub fn record_restored(&mut self, pair: VersionPair) -> Result<(), DataDirError> {
        datadir::record_and_unmark(&self.dir, pair)?;
        self.state = DirState::Recorded(pair);
        self.restart_mark = None;
        Ok(())
    }

    /// Writes the restore's record (`json`, the snapshot's sha256 in it),
    /// durably: the last write of a restore.
    pub fn record_restore_done(&self, json: &str) -> Result<(), DataDirError> {
        datadir::write_restored(&self.dir, json)
    }

    /// Writes the force's record (`json`), durably.
    pub fn record_forced(&self, json: &str) -> Result<(), DataDirError> {
        datadir::write_forced(&self.dir, json)
    }

    /// Puts the hold on the data dir (the next run refuses until someone
    /// has looked), with `reason`. A failure to write it is logged.
    pub fn hold(&self, reason: &str) {
        match datadir::write_hold(&self.dir, reason) {
            Ok(()) => log::error(
                "the data dir is on hold until someone has looked",
                &[(
                    "hold",
                    self.dir
                        .join(datadir::HOLD_FILE)
                        .display()
                        .to_string()
                        .into(),
                )],
            ),
            Err(hold_err) => log::error(
                "cannot put the data dir on hold",
                &[("error", hold_err.to_string().into())],
            ),
        }
    }

    /// The lock, for a run that hands the dir over (the cluster roll holds
    /// it to its end), taken now if the survey holds none.
    pub fn into_lock(self) -> Result<DirLock, DataDirError> {
        match self.lock {
            Some(lock) => Ok(lock),
            None => datadir::lock(&self.dir),
        }
    }
}
