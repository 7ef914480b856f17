//! This module owns the storage migration (etcd2 → etcd3 at `at`, 3.0 …
//! 3.4): fingerprint the v2 store while `at` serves it, compact the v3
//! history on a copy where `at` is below 3.3 and the db holds any
//! (`compact_before_migrate`), convert the copy with `etcdctl migrate`
//! offline, give every TTL key a lease with its
//! own remaining TTL (keys that expire in the same second share one),
//! put back the v3 keys the data already held (etcd2 data served by 3.x
//! can hold some: the Kubernetes tool wrote `etcd_version` through v3, and
//! `etcdctl migrate` writes each v2 key at revision = its modifiedIndex,
//! over any record at that revision), check the v3 keys against the
//! fingerprint, remove the migrated keys from the copy's v2 store (3.6
//! refuses custom v2 content), and swap the copy in.
//!
//! Why a copy: `etcdctl migrate` must never run twice on one data dir.
//! It writes each key at revision = its v2 modifiedIndex, over whatever
//! is there; rerun on data whose v2 store was already emptied, it puts
//! back unleased records of keys that had been re-put under leases. On
//! a copy, any failure before the swap leaves the original untouched,
//! and the rerun starts from scratch.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Instant;

use crate::effects::{EtcdApi, Launcher, LeasePlan, Tools};
use crate::keyspace::{self, Entry, Fingerprint};
use crate::log;
use crate::plan::Binary;
use crate::steps::{
    copy_failure, report_expired, run, strings, work_err, Context, Failure, Serving, TtlLeases,
};
use crate::swap::Disk;
use crate::version::{Minor, Storage, Version};

/// The lease the flat TTL mode gives the TTL keys directory (what the
/// Kubernetes tool attached to `/registry/events`).
pub const FLAT_LEASE_SECONDS: i64 = 3600;

/// What the v2 source held (and, beside it, the v3 keys the data already
/// held), and when it was read (TTLs count down from then).
struct Source {
    entries: Vec<Entry>,
    v3_side: Vec<Entry>,
    fingerprint: Fingerprint,
    read_at: Instant,
}

/// Migrates the data to etcd3 storage at `at`; returns the fingerprint of
/// the converted copy (with what its v2 store holds now), checked against
/// `before`.
pub(crate) async fn storage_migration<L: Launcher, A: EtcdApi, T: Tools, D: Disk>(
    cx: &Context<'_, L, A, T, D>,
    at: Version,
    before: Option<&Fingerprint>,
) -> Result<Fingerprint, Failure> {
    let data_dir = cx.settings.data_dir;
    let work = cx.disk.fresh_work_dir(data_dir)?;
    let converted = work.join("converted");
    let (read, read_at) = cx
        .read_source(run(at, Storage::Etcd2, data_dir), before)
        .await?;
    if let Err(clash) = check_no_clash(&read.entries, &read.side) {
        return Err(work_err("convert the v2 keys beside the v3 keys", clash));
    }
    let source = Source {
        entries: read.entries,
        v3_side: read.side,
        fingerprint: read.fingerprint,
        read_at,
    };
    log::info(
        "v2 keyspace read",
        &[("fingerprint", source.fingerprint.to_string().into())],
    );
    crate::failpoint!("migration-after-v2-read");
    convert_copy(cx, at, &converted).await?;
    let after = prove_converted(cx, at, &converted, &source, before).await?;
    cx.swap_in(&converted, at, Storage::Etcd3)?;
    Ok(after)
}

/// Copies the data's member dir into `converted` and converts the copy
/// with `at`'s `etcdctl migrate`.
async fn convert_copy<L: Launcher, A: EtcdApi, T: Tools, D: Disk>(
    cx: &Context<'_, L, A, T, D>,
    at: Version,
    converted: &Path,
) -> Result<(), Failure> {
    let copying = Instant::now();
    cx.disk.create_dir(converted)?;
    let stop = || *cx.termination.borrow();
    let member = cx.settings.data_dir.join("member");
    cx.disk
        .copy_dir(&member, &converted.join("member"), &stop)
        .map_err(|e| copy_failure("copy the data for conversion", e))?;
    log::info(
        "data copied for conversion",
        &[("ms", log::ms(copying.elapsed()))],
    );
    crate::failpoint!("migration-after-copy");
    compact_before_migrate(cx, at, converted).await?;
    let migrate_args = strings(&["migrate", "--data-dir", &converted.to_string_lossy()]);
    cx.offline(Binary::etcdctl(at), &migrate_args, &[("ETCDCTL_API", "3")])
        .await?;
    crate::failpoint!("migration-after-etcdctl-migrate");
    Ok(())
}

/// Before 3.3, `etcdctl migrate` of etcd2 data whose v3 keyspace has a
/// history (keys put and deleted beside the v2 store: the cluster mode's
/// locks, a job's keys) writes a db the same release then fatals on at
/// the first put of a migrated key ("mvcc: range cannot find rev",
/// measured on 3.0.17, 3.1.20 and 3.2.32 with one v3 key deleted; 3.3.25
/// converts the same data cleanly). On the copy, `at` first compacts that
/// history away (every live v3 key kept as it is, each put back and
/// checked after the conversion anyway); a copy whose db holds no v3
/// record at all, and 3.3+, skip it.
async fn compact_before_migrate<L: Launcher, A: EtcdApi, T: Tools, D: Disk>(
    cx: &Context<'_, L, A, T, D>,
    at: Version,
    converted: &Path,
) -> Result<(), Failure> {
    if at.minor_line() >= Minor::new(3, 3) || !has_v3_records(converted) {
        return Ok(());
    }
    let mut serving = cx.start_serving(run(at, Storage::Etcd2, converted)).await?;
    let endpoint = serving.endpoint.clone();
    let revision = cx
        .while_serving(
            &mut serving,
            "compact the v3 history before the conversion",
            cx.api.compact_history(&endpoint),
        )
        .await?;
    cx.stop_serving(serving).await?;
    log::info(
        "v3 history compacted on the copy before etcdctl migrate",
        &[
            ("revision", revision.into()),
            ("release", at.to_string().into()),
        ],
    );
    Ok(())
}

/// Whether the data dir `dir` holds any v3 record. An unreadable db
/// counts as holding some: the compaction then runs, which etcd does on
/// any db it serves.
fn has_v3_records(dir: &Path) -> bool {
    crate::ondisk::has_v3_records(dir).unwrap_or(true)
}

/// `at` serves the converted copy: its TTL keys get their leases, its v3
/// keys are checked against the source and what the step means to keep,
/// and its v2 store is emptied of the migrated keys (unless kept).
async fn prove_converted<L: Launcher, A: EtcdApi, T: Tools, D: Disk>(
    cx: &Context<'_, L, A, T, D>,
    at: Version,
    converted: &Path,
    source: &Source,
    before: Option<&Fingerprint>,
) -> Result<Fingerprint, Failure> {
    let mut serving = cx
        .start_serving(run(at, Storage::Etcd3, converted).writing_many())
        .await?;
    let plan = attach_leases(cx, &mut serving, source).await?;
    let after = verify_converted(cx, &mut serving, source, &plan, before).await?;
    log::info(
        "v3 keys verified",
        &[("fingerprint", after.to_string().into())],
    );
    crate::failpoint!("migration-after-verify");
    let after = empty_v2_store(cx, &mut serving, after).await?;
    cx.stop_serving(serving).await?;
    Ok(after)
}

/// Plans the leases for the source's TTL keys (what is left of each TTL)
/// and attaches them on the copy `serving` serves; returns the plan.
async fn attach_leases<L: Launcher, A: EtcdApi, T: Tools, D: Disk>(
    cx: &Context<'_, L, A, T, D>,
    serving: &mut Serving<L::Etcd>,
    source: &Source,
) -> Result<LeasePlan, Failure> {
    let v2 = &source.entries;
    let plan = lease_plan(
        v2,
        source.read_at.elapsed().as_secs() as i64,
        cx.settings.ttl_leases,
        cx.settings.ttl_keys_directory,
    );
    report_expired(&plan.expired);
    let leased = plan.groups.values().map(Vec::len).sum::<usize>();
    let endpoint = serving.endpoint.clone();
    let mut put_back = hidden_without_ttl(v2, &plan);
    put_back.extend(source.v3_side.iter().cloned());
    let granted = cx
        .while_serving(
            serving,
            "attach leases to TTL keys",
            cx.api.apply_leases(&endpoint, &plan, &put_back),
        )
        .await?;
    // 3.0 cannot tell these leases' TTLs; the reads below take them
    // from what was granted.
    serving.known.extend(granted);
    log::info(
        "leases attached",
        &[
            ("leases", plan.groups.len().into()),
            ("keys", leased.into()),
            ("expired", plan.expired.len().into()),
        ],
    );
    crate::failpoint!("migration-after-leases");
    Ok(plan)
}

/// Reads the copy's v3 keyspace: it must hold the source's keys (less the
/// expired) with the expiry `plan` gave them, and what the step means to
/// keep; returns its fingerprint.
async fn verify_converted<L: Launcher, A: EtcdApi, T: Tools, D: Disk>(
    cx: &Context<'_, L, A, T, D>,
    serving: &mut Serving<L::Etcd>,
    source: &Source,
    plan: &LeasePlan,
    before: Option<&Fingerprint>,
) -> Result<Fingerprint, Failure> {
    let endpoint = serving.endpoint.clone();
    let (hidden, known) = (serving.hidden_v2.clone(), serving.known.clone());
    let served = serving.serves(Storage::Etcd3);
    let converted_read = cx
        .while_serving(
            serving,
            "read the v3 keyspace",
            cx.api.read_all(&endpoint, served, &hidden, &known),
        )
        .await?;
    // What v3 must hold: the v2 keys, less the expired, with the
    // expiry the lease plan gave them.
    let v2 = &source.entries;
    let expected: Vec<Entry> = flat_expiry(v2, plan)
        .into_iter()
        .filter(|e| {
            !plan
                .expired
                .iter()
                .any(|x| x.as_bytes() == e.key.as_slice())
        })
        .collect();
    let tolerance = source.read_at.elapsed().as_secs() as i64 + 2;
    let checked = verify_migration(&expected, &converted_read.entries, plan, tolerance)
        .and_then(|()| verify_v3_side_kept(&source.v3_side, &converted_read.entries));
    if let Err(detail) = checked {
        crate::steps::stop_serving_quietly(serving).await;
        return Err(work_err(
            "verify the v3 keys against the v2 fingerprint",
            detail,
        ));
    }
    // What the step means to keep: the keyspace as the last step left
    // it, except that flat mode gives every key under the TTL keys
    // directory a lease.
    let intended = match cx.settings.ttl_leases {
        TtlLeases::Exact => before.cloned().unwrap_or(source.fingerprint.clone()),
        TtlLeases::Flat => {
            Fingerprint::new(Storage::Etcd2, &flat_expiry(v2, plan), None, source.read_at)
                .with_side(source.fingerprint.side().cloned())
        }
    };
    let after = converted_read.fingerprint;
    cx.check_kept(serving, Some(&intended), &after).await?;
    Ok(after)
}

/// Removes the migrated keys from the copy's v2 store (unless they are to
/// be kept) and adds what the v2 store holds now to `after`: what the
/// next steps must keep.
async fn empty_v2_store<L: Launcher, A: EtcdApi, T: Tools, D: Disk>(
    cx: &Context<'_, L, A, T, D>,
    serving: &mut Serving<L::Etcd>,
    after: Fingerprint,
) -> Result<Fingerprint, Failure> {
    let endpoint = serving.endpoint.clone();
    let hidden = serving.hidden_v2.clone();
    if !cx.settings.keep_v2_keys {
        let removed = cx
            .while_serving(
                serving,
                "remove the migrated keys from the v2 store",
                cx.api.delete_v2_tree(&endpoint, &hidden),
            )
            .await?;
        log::info(
            "v2 store emptied of migrated keys",
            &[("top_level_nodes", removed.into())],
        );
        crate::failpoint!("migration-after-v2-emptied");
    }
    let v2_left = cx
        .while_serving(
            serving,
            "read what the v2 store holds now",
            cx.api.read_v2(&endpoint, &hidden),
        )
        .await?
        .map(|left| Fingerprint::new(Storage::Etcd2, &left, None, Instant::now()));
    Ok(after.with_side(v2_left))
}

/// The v2 entries as the lease plan means them to end up: every key it
/// puts under a lease expires (in flat mode, also keys of the TTL keys
/// directory that had no TTL).
fn flat_expiry(v2: &[Entry], plan: &LeasePlan) -> Vec<Entry> {
    let leased = plan.leased_keys();
    v2.iter()
        .map(|e| Entry {
            ttl: e.ttl.or(leased
                .contains(e.key.as_slice())
                .then_some(FLAT_LEASE_SECONDS)),
            ..e.clone()
        })
        .collect()
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
    let leased = plan.leased_keys();
    v2.iter()
        .filter(|e| {
            keyspace::is_hidden_v2(&e.key) && e.ttl.is_none() && !leased.contains(e.key.as_slice())
        })
        .cloned()
        .collect()
}

/// Refuses v2 keys that `etcdctl migrate` would write over a v3 key the
/// data already holds (the same bytes: a v2 leaf `/a/b` becomes the v3
/// key `/a/b`): one of the two values would be lost. Names each clash.
pub fn check_no_clash(v2: &[Entry], v3: &[Entry]) -> Result<(), String> {
    let v3_keys: BTreeSet<&[u8]> = v3.iter().map(|e| e.key.as_slice()).collect();
    let clashes: Vec<String> = v2
        .iter()
        .filter(|e| v3_keys.contains(e.key.as_slice()))
        .map(|e| String::from_utf8_lossy(&e.key).into_owned())
        .collect();
    if clashes.is_empty() {
        return Ok(());
    }
    Err(format!(
        "{} v2 keys would be written over v3 keys of the same name, losing one value of each: {:?}; keep one of each pair (e.g. `etcdctl del <key>` through the v3 API, or a DELETE through the v2 API, at the recorded release) and rerun",
        clashes.len(),
        clashes.iter().take(10).collect::<Vec<_>>()
    ))
}

/// The v3 keys the data held before the conversion must be there after
/// it, each with its value and lease.
fn verify_v3_side_kept(v3_side: &[Entry], converted: &[Entry]) -> Result<(), String> {
    let after: BTreeMap<&[u8], &Entry> = converted.iter().map(|e| (e.key.as_slice(), e)).collect();
    for entry in v3_side {
        match after.get(entry.key.as_slice()) {
            Some(found) if found.value == entry.value && found.lease == entry.lease => {}
            found => {
                return Err(format!(
                    "the v3 key {:?} the data held before the conversion {} after it",
                    String::from_utf8_lossy(&entry.key),
                    match found {
                        Some(f) if f.value != entry.value => "has another value".to_string(),
                        Some(f) => format!("is under lease {:x}, not {:x},", f.lease, entry.lease),
                        None => "is missing".to_string(),
                    }
                ))
            }
        }
    }
    Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::steps::test_entry as e;

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
    fn a_v2_key_that_would_land_on_a_v3_key_is_refused_by_name() {
        let v2 = [e("/registry/a", "1", None), e("/etcd_version", "x", None)];
        assert!(check_no_clash(&v2, &[e("etcd_version", "3.3.25", None)]).is_ok());
        let err = check_no_clash(&v2, &[e("/registry/a", "v3 value", None)])
            .expect_err("the v2 key /registry/a would overwrite the v3 key");
        assert!(err.contains("\"/registry/a\""), "{err}");
    }

    /// `etcdctl migrate` writes each v2 key at revision = its modifiedIndex,
    /// over whatever record was there: a v3 key whose last write had that
    /// revision came back with an older value (measured on 3.3.25).
    #[test]
    fn a_v3_key_of_etcd2_data_must_keep_its_value_and_lease_through_the_conversion() {
        let mut leased = e("lease/k", "v", None);
        leased.lease = 7;
        let side = [e("etcd_version", "v12", None), leased.clone()];
        assert!(verify_v3_side_kept(
            &side,
            &[e("/registry/a", "1", None), side[0].clone(), leased.clone()]
        )
        .is_ok());
        let err = verify_v3_side_kept(&side, &[e("etcd_version", "v2", None), leased.clone()])
            .expect_err("overwritten by an older value");
        assert!(err.contains("another value"), "{err}");
        let err = verify_v3_side_kept(&side, &[side[0].clone()]).expect_err("lost");
        assert!(err.contains("missing"), "{err}");
        let mut unleased = leased;
        unleased.lease = 0;
        let err =
            verify_v3_side_kept(&side, &[side[0].clone(), unleased]).expect_err("lease dropped");
        assert!(err.contains("under lease 0, not 7"), "{err}");
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
}
