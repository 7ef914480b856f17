//! This module owns the snapshot of what an etcd serves through v3: every
//! key with its value and lease, and every lease with its TTLs and keys,
//! and the comparison that proves a migration kept all of it.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::Path;
use std::time::Instant;

use etcd_client::{GetOptions, LeaseTimeToLiveOptions};

use super::etcd::{connect, EtcdProcess};
use super::{block_on, free_port, Member};

/// How every health key of the migrator begins (as a v2 path; in v3
/// without the slash): `/etcd-migrate-health-<run>-<attempt>`. It removes
/// each right after writing it, so none may be left.
pub const HEALTH_KEY_PREFIX: &str = "/etcd-migrate-health-";

/// The lease (v3) or TTL (v2) a health key is written under.
pub const HEALTH_LEASE_TTL_SECS: i64 = 60;

/// True for a health key of the migrator (v2 or v3 spelling).
pub fn is_health_key(key: &[u8]) -> bool {
    let key = key.strip_prefix(b"/").unwrap_or(key);
    key.starts_with(&HEALTH_KEY_PREFIX.as_bytes()[1..])
}

/// True for etcd's answer to a call its release does not have (gRPC
/// UNIMPLEMENTED: LeaseLeases before 3.3, LeaseTimeToLive before 3.1).
fn unimplemented(err: &etcd_client::Error) -> bool {
    matches!(err, etcd_client::Error::GRpcStatus(status) if i32::from(status.code()) == 12)
}

/// A key's value and the lease it is attached to (0: none).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The value.
    pub value: Vec<u8>,
    /// The lease id, 0 when the key has none.
    pub lease: i64,
}

/// A lease as etcd reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// The TTL it was granted, in seconds.
    pub granted_ttl: i64,
    /// The seconds left when the snapshot was taken.
    pub remaining_ttl: i64,
    /// The keys attached to it.
    pub keys: BTreeSet<Vec<u8>>,
}

/// Where a key sits in the MVCC history.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Revision {
    /// The revision that created it.
    pub create: i64,
    /// The revision that last changed it.
    pub modified: i64,
    /// How many times it was written since it was created.
    pub version: i64,
}

/// Everything a v3 client can read.
#[derive(Debug, Clone, Default)]
pub struct Keyspace {
    /// Every key.
    pub entries: BTreeMap<Vec<u8>, Entry>,
    /// Every key's revisions.
    pub revisions: BTreeMap<Vec<u8>, Revision>,
    /// Every lease, by id.
    pub leases: BTreeMap<i64, Lease>,
    /// The store's revision when it was read.
    pub revision: i64,
}

impl Keyspace {
    /// Reads every key and lease from the etcd at `endpoint` (3.1+: 3.0
    /// cannot tell a lease's TTL, see [`Keyspace::read_granted`]).
    pub async fn read(endpoint: &str) -> Keyspace {
        Keyspace::read_granted(endpoint, &BTreeMap::new(), Instant::now()).await
    }

    /// Reads every key and lease from the etcd at `endpoint`, any release
    /// 3.0+: where it cannot list leases (3.0 … 3.2), they are the ones
    /// its keys name; where it cannot tell a lease's TTL (3.0), the TTL is
    /// the one in `granted` (the data's own record of it, or the grant),
    /// and what is left of it counts from `since` (when that etcd started
    /// or the lease was granted: etcd gives every lease its full TTL again
    /// when it starts).
    pub async fn read_granted(
        endpoint: &str,
        granted: &BTreeMap<i64, i64>,
        since: Instant,
    ) -> Keyspace {
        let mut client = connect(endpoint)
            .await
            .unwrap_or_else(|err| panic!("connect {endpoint}: {err}"));
        let response = client
            .get("", Some(GetOptions::new().with_all_keys()))
            .await
            .unwrap_or_else(|err| panic!("get all keys from {endpoint}: {err}"));
        assert!(!response.more(), "range over all keys was truncated");
        let revision = response.header().map(|h| h.revision()).unwrap_or(0);
        let revisions = response
            .kvs()
            .iter()
            .map(|kv| {
                (
                    kv.key().to_vec(),
                    Revision {
                        create: kv.create_revision(),
                        modified: kv.mod_revision(),
                        version: kv.version(),
                    },
                )
            })
            .collect();
        let entries = response
            .kvs()
            .iter()
            .map(|kv| {
                (
                    kv.key().to_vec(),
                    Entry {
                        value: kv.value().to_vec(),
                        lease: kv.lease(),
                    },
                )
            })
            .collect();
        let ids: BTreeSet<i64> = match client.leases().await {
            Ok(listed) => listed.leases().iter().map(|lease| lease.id()).collect(),
            Err(err) if unimplemented(&err) => response
                .kvs()
                .iter()
                .map(|kv| kv.lease())
                .filter(|lease| *lease != 0)
                .collect(),
            Err(err) => panic!("list leases on {endpoint}: {err}"),
        };
        let mut leases = BTreeMap::new();
        for id in ids {
            let lease = match client
                .lease_time_to_live(id, Some(LeaseTimeToLiveOptions::new().with_keys()))
                .await
            {
                Ok(lease) => Lease {
                    granted_ttl: lease.granted_ttl(),
                    remaining_ttl: lease.ttl(),
                    keys: lease.keys().iter().cloned().collect(),
                },
                Err(err) if unimplemented(&err) => {
                    let granted_ttl = *granted.get(&id).unwrap_or_else(|| {
                        panic!("{endpoint} cannot tell the TTL of lease {id:x} (no LeaseTimeToLive) and it was not given")
                    });
                    let elapsed = since.elapsed().as_secs_f64().ceil() as i64;
                    Lease {
                        granted_ttl,
                        remaining_ttl: granted_ttl - elapsed,
                        keys: response
                            .kvs()
                            .iter()
                            .filter(|kv| kv.lease() == id)
                            .map(|kv| kv.key().to_vec())
                            .collect(),
                    }
                }
                Err(err) => panic!("time-to-live of lease {id:x} on {endpoint}: {err}"),
            };
            leases.insert(id, lease);
        }
        Keyspace {
            entries,
            revisions,
            leases,
            revision,
        }
    }

    /// The keyspace without the keyless leases a killed run's health write
    /// can leave: etcd-migrate grants one lease of
    /// `HEALTH_KEY_TTL_SECS` per write attempt and revokes it once done,
    /// so a run SIGKILLed in between leaves it, holding no key, to expire
    /// within that many seconds of the next etcd start (src/health.rs).
    /// The crash tests read the data right after the rerun, before that;
    /// the leases left out are said on stderr.
    pub fn without_health_leftovers(mut self, context: &str) -> Keyspace {
        let ttl = etcd_migrate::health::HEALTH_KEY_TTL_SECS;
        let left: Vec<i64> = self
            .leases
            .iter()
            .filter(|(_, lease)| lease.keys.is_empty() && lease.granted_ttl == ttl)
            .map(|(id, _)| *id)
            .collect();
        for id in &left {
            eprintln!(
                "{context}: a killed run's health lease {id:x} (granted {ttl} s, no key) left out"
            );
            self.leases.remove(id);
        }
        self
    }

    /// Asserts every key of `before` still has the create revision, mod
    /// revision and version it had.
    pub fn assert_revisions_kept(&self, before: &Keyspace) {
        let mut problems = String::new();
        let mut differing = 0;
        for (key, old) in &before.revisions {
            let new = self.revisions.get(key);
            if new != Some(old) {
                differing += 1;
                if differing <= 10 {
                    let _ = writeln!(
                        problems,
                        "key {:?}: before {old:?}, after {new:?}",
                        String::from_utf8_lossy(key)
                    );
                }
            }
        }
        assert!(
            problems.is_empty(),
            "{differing} keys lost their revisions (store revision {} before, {} after):\n{problems}",
            before.revision,
            self.revision
        );
    }

    /// How many keys were written more than once (mod revision past the
    /// create revision).
    pub fn rewritten_keys(&self) -> usize {
        self.revisions
            .values()
            .filter(|r| r.modified != r.create)
            .count()
    }

    /// How many keys are attached to a lease.
    pub fn leased_keys(&self) -> usize {
        self.entries
            .values()
            .filter(|entry| entry.lease != 0)
            .count()
    }

    /// Asserts the migrator left none of its health keys behind, except
    /// one under its own 60 s lease, which a run killed between writing
    /// and removing it leaves (it expires by itself).
    pub fn assert_no_health_key(&self) {
        let left: Vec<String> = self
            .entries
            .iter()
            .filter(|(key, entry)| is_health_key(key) && !self.expires_soon(entry.lease))
            .map(|(key, _)| String::from_utf8_lossy(key).into_owned())
            .collect();
        assert!(
            left.is_empty(),
            "the migrator left its health keys in the keyspace: {left:?}"
        );
    }

    /// True for a lease granted for at most a minute: a health key's.
    fn expires_soon(&self, lease: i64) -> bool {
        self.leases
            .get(&lease)
            .is_some_and(|l| l.granted_ttl <= HEALTH_LEASE_TTL_SECS)
    }

    /// The keyspace without the health keys a killed run may leave under
    /// their own short lease, without those leases, and without key-less
    /// leases of at most a minute (a killed run's health lease).
    fn without_leftover_health_keys(&self) -> Keyspace {
        let mut clean = self.clone();
        let leftovers: Vec<(Vec<u8>, i64)> = self
            .entries
            .iter()
            .filter(|(key, entry)| is_health_key(key) && self.expires_soon(entry.lease))
            .map(|(key, entry)| (key.clone(), entry.lease))
            .collect();
        for (key, lease) in leftovers {
            clean.entries.remove(&key);
            clean.revisions.remove(&key);
            clean.leases.remove(&lease);
        }
        // A run killed between its health lease's grant and the put under
        // it (or between the key's removal and the revoke) leaves that
        // lease with no key, expiring within a minute on its own.
        clean.leases.retain(|_, lease| {
            !(lease.keys.is_empty() && lease.granted_ttl <= HEALTH_LEASE_TTL_SECS)
        });
        clean
    }

    /// Asserts that `self` (read after a migration) holds exactly the keys,
    /// values and leases of `before` (read from the fixture), with none of
    /// the migrator's health keys left, and that every lease still has more
    /// than `min_remaining_ttl` s left.
    pub fn assert_kept(&self, before: &Keyspace, min_remaining_ttl: i64) {
        self.assert_no_health_key();
        let (before, this) = (
            &before.without_leftover_health_keys(),
            &self.without_leftover_health_keys(),
        );
        this.assert_same_as(before, min_remaining_ttl);
    }

    fn assert_same_as(&self, before: &Keyspace, min_remaining_ttl: i64) {
        let mut problems = String::new();
        let keys: BTreeSet<&Vec<u8>> = before.entries.keys().chain(self.entries.keys()).collect();
        let mut differing = 0;
        for key in keys {
            let (old, new) = (before.entries.get(key), self.entries.get(key));
            if old != new {
                differing += 1;
                if differing <= 10 {
                    let _ = writeln!(
                        problems,
                        "key {:?}: before {}, after {}",
                        String::from_utf8_lossy(key),
                        describe(old),
                        describe(new)
                    );
                }
            }
        }
        if differing > 10 {
            let _ = writeln!(problems, "… {} keys differ in all", differing);
        }
        let ids: BTreeSet<&i64> = before.leases.keys().chain(self.leases.keys()).collect();
        for id in ids {
            match (before.leases.get(id), self.leases.get(id)) {
                (Some(old), Some(new)) => {
                    if old.granted_ttl != new.granted_ttl {
                        let _ = writeln!(
                            problems,
                            "lease {id:x}: granted TTL {} became {}",
                            old.granted_ttl, new.granted_ttl
                        );
                    }
                    if old.keys != new.keys {
                        let _ = writeln!(
                            problems,
                            "lease {id:x}: {} keys became {}",
                            old.keys.len(),
                            new.keys.len()
                        );
                    }
                    if new.remaining_ttl <= min_remaining_ttl {
                        let _ = writeln!(
                            problems,
                            "lease {id:x}: only {} s left (want more than {min_remaining_ttl} s)",
                            new.remaining_ttl
                        );
                    }
                }
                (Some(_), None) => {
                    let _ = writeln!(problems, "lease {id:x} is gone");
                }
                (None, Some(_)) => {
                    let _ = writeln!(problems, "lease {id:x} appeared");
                }
                (None, None) => {}
            }
        }
        assert!(
            problems.is_empty(),
            "the migrated keyspace differs from the fixture's ({} keys, {} leases before; {} keys, {} leases after):\n{problems}",
            before.entries.len(),
            before.leases.len(),
            self.entries.len(),
            self.leases.len()
        );
    }
}

fn describe(entry: Option<&Entry>) -> String {
    match entry {
        None => "absent".to_string(),
        Some(entry) => format!(
            "{} bytes {:?}… lease {:x}",
            entry.value.len(),
            String::from_utf8_lossy(&entry.value[..entry.value.len().min(24)]),
            entry.lease
        ),
    }
}

/// Starts `etcd-<version>` on `data_dir` as `member` (on a fresh client
/// port), reads everything it serves, and stops it cleanly.
pub fn read_back(version: &str, member: &Member, data_dir: &Path, log_dir: &Path) -> Keyspace {
    let mut etcd = EtcdProcess::start(version, member, data_dir, free_port(), log_dir);
    let keyspace = block_on(async {
        etcd.wait_ready().await;
        Keyspace::read(&etcd.endpoint()).await
    });
    etcd.stop();
    keyspace
}
