//! End-to-end tests: `etcd-migrate` run as a process against real etcd
//! binaries (from `images/fetch-etcd.sh`, or `$ETCD_BIN_DIR`), on data dirs
//! written by real etcd. Each test owns its temp dirs and its ports, so the
//! tests run in parallel; every wait has a deadline, and every process a
//! test starts is killed when its guard drops.
//!
//! - `harness`: bin dir, ports, etcd processes, fixtures, keyspace and tree
//!   snapshots, running `etcd-migrate`.
//! - `walks`: migrations that run steps, in `--no-exec` and exec mode.
//! - `no_step`: runs that only record (or keep) `version.txt`.
//! - `ondisk`: `etcd_migrate::ondisk::read` against what live etcd reported
//!   (ids, version, members, leases, auth, hidden v2 nodes), and on killed
//!   and damaged data dirs.
//! - `refusals`: bad input refused with exit 2 and the dir left untouched.
//! - `restores`: a member restored from a snapshot once (issue 29), the
//!   snapshots refused, a restore killed at each point.
//! - `failures`: a step that fails, a stop signal mid-step, and the rerun.
//! - `logging`: `--log-format json`.
//! - `storage`: etcd2 → etcd3 (values, TTLs as leases, expired keys).
//! - `rollbacks`: 3.5 → 3.3 by snapshot/restore, etcd3 → etcd2 by copy.
//! - `backups`: retention, the restore command, the free-space check.
//! - `interrupts`: SIGKILL/SIGTERM inside the rebuilding steps, and reruns.
//! - `pid1`: orphans re-parented to etcd-migrate as PID 1 are reaped.
//! - `crashes`: SIGKILL at every failpoint pass, of the entrypoint alone, and
//!   of the whole tree at random moments; every rerun converges.
//! - `security`: what a step's etcd listens on; modes of what a run creates.
//! - `fingerprint`: a key written behind our back fails the step (real etcd).
//! - `scale`: what a whole-keyspace read costs etcd (keys visited per key).
//! - `corners`: user keys named like the old health key, v2 keys inside
//!   etcd3 data, v2 directories with a TTL.
//! - `bad_input`: bad input and a bad environment (version.txt, binaries,
//!   permissions, ports, corrupt data, full disks, alarms, flags).
//! - `old_releases` and `present` (cases that need `$ETCD_EXTRA_BIN_DIR`)
//!   are the `releases` target (`e2e/releases.rs`).
//! - `cluster_probe`: the cluster mode's peer probe, view and decision on a
//!   real 3-member cluster with peer TLS.
//! - `pause_proof`: the pause job's proof of a joined member (`HashKV`,
//!   and below 3.3 a digest of every key) failing on a differing value.
//! - `pause_v2_proof`: on etcd2 storage, the v2 event history between two
//!   reads replayed onto the first gives the second; one value apart fails.
//! - `self_join`: a member replacing its stale entry within the second of
//!   that entry's add (etcd's removed-id refusal) joins under a new id.
//! - `cluster_roll`: the cluster mode end to end on loopback: three members
//!   restarted as their entrypoints roll 3.3 → 3.5 themselves, one killed at
//!   a failpoint under the lock; 2.2 → 3.0 over the v2 lock with
//!   `$ETCD_EXTRA_BIN_DIR`.

mod harness;

mod backups;
mod bad_input;
mod cluster_probe;
mod cluster_roll;
mod corners;
mod crashes;
mod failures;
#[cfg(feature = "failpoints")]
mod fingerprint;
mod interrupts;
mod kubernetes_data;
mod logging;
mod no_step;
mod ondisk;
mod pause_fit;
mod pause_proof;
mod pause_v2_proof;
mod pid1;
mod refusals;
mod restores;
mod rollbacks;
mod scale;
mod security;
mod self_join;
mod storage;
mod walks;
