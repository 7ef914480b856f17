//! This module owns the rollback to etcd2 (etcd3 → etcd2): `serve`
//! serves the v3 data, every key is read with its lease's remaining TTL
//! (and the data's v2 side store with it), `to` builds a fresh v2 store in
//! the scratch dir, every key is written through the v2 API with its TTL,
//! the copy is read back and checked by fingerprint, and the member dirs
//! swap. What the v2 store cannot hold is refused before anything is
//! written.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Instant;

use crate::effects::{EtcdApi, Launcher, Tools};
use crate::keyspace::{self, Entry, Fingerprint, KnownLeases, Read};
use crate::log;
use crate::steps::{run, run_new, work_err, Context, Failure, Serving};
use crate::swap::Disk;
use crate::version::{Storage, Version};

/// Rebuilds the data as a v2 store of `to`; returns the fingerprint of the
/// copy, checked against `before`.
pub(crate) async fn rollback_to_etcd2<L: Launcher, A: EtcdApi, T: Tools, D: Disk>(
    cx: &Context<'_, L, A, T, D>,
    serve: Version,
    to: Version,
    before: Option<&Fingerprint>,
) -> Result<Fingerprint, Failure> {
    let data_dir = cx.settings.data_dir;
    let work = cx.disk.fresh_work_dir(data_dir)?;
    let rebuilt = work.join("v2");
    cx.disk.create_dir(&rebuilt)?;

    let (read, read_at) = cx
        .read_source(run(serve, Storage::Etcd3, data_dir), before)
        .await?;
    check_v2_compatible(&read.entries)
        .and_then(|()| check_v2_side_fits(&read.entries, &read.side))
        .and_then(|()| check_ttls_known(&read.entries, serve))
        .map_err(|detail| work_err("check that every v3 key fits the v2 store", detail))?;
    log::info(
        "v3 keyspace read",
        &[("fingerprint", read.fingerprint.to_string().into())],
    );
    crate::failpoint!("etcd2-rollback-after-v3-read");
    let before = before.unwrap_or(&read.fingerprint).clone();
    let after = build_v2_store(cx, to, &rebuilt, &read, read_at, &before).await?;
    cx.swap_in(&rebuilt, to, Storage::Etcd2)?;
    Ok(after)
}

/// `to` serves a fresh v2 store in `rebuilt`, takes every key of `read`
/// (the v3 keys as v2 paths, and the keys the data's v2 store held
/// already) with what is left of its TTL, and must then hold exactly them
/// and what `before` held; returns its fingerprint.
async fn build_v2_store<L: Launcher, A: EtcdApi, T: Tools, D: Disk>(
    cx: &Context<'_, L, A, T, D>,
    to: Version,
    rebuilt: &Path,
    read: &Read,
    read_at: Instant,
    before: &Fingerprint,
) -> Result<Fingerprint, Failure> {
    let mut serving = cx
        .start_serving(run_new(to, Storage::Etcd2, rebuilt).writing_many())
        .await?;
    let all: Vec<Entry> = read
        .entries
        .iter()
        .map(|e| Entry {
            key: keyspace::v2_path(&e.key),
            lease: 0,
            ..e.clone()
        })
        .chain(read.side.iter().cloned())
        .collect();
    let to_write = cx
        .write_alive_v2(
            &mut serving,
            &all,
            read_at,
            "write the keys into the v2 store",
        )
        .await?;
    crate::failpoint!("etcd2-rollback-after-v2-write");
    let after = verify_v2_store(cx, &mut serving, &to_write, read_at, before).await?;
    log::info(
        "v2 store verified",
        &[("fingerprint", after.to_string().into())],
    );
    crate::failpoint!("etcd2-rollback-after-verify");
    cx.stop_serving(serving).await?;
    Ok(after)
}

/// Reads the new v2 store back: it must hold exactly `written` (TTLs no
/// longer, and not much shorter, than written) and what `before` held.
async fn verify_v2_store<L: Launcher, A: EtcdApi, T: Tools, D: Disk>(
    cx: &Context<'_, L, A, T, D>,
    serving: &mut Serving<L::Etcd>,
    written: &[Entry],
    read_at: Instant,
    before: &Fingerprint,
) -> Result<Fingerprint, Failure> {
    let endpoint = serving.endpoint.clone();
    // The v2 API lists no hidden node: ask for each one written.
    let hidden_written: Vec<String> = written
        .iter()
        .filter(|e| keyspace::is_hidden_v2(&e.key))
        .map(|e| String::from_utf8_lossy(&e.key).into_owned())
        .collect();
    let served = serving.serves(Storage::Etcd2);
    let copy = cx
        .while_serving(
            serving,
            "read the new v2 store back",
            cx.api
                .read_all(&endpoint, served, &hidden_written, &KnownLeases::new()),
        )
        .await?;
    let tolerance = read_at.elapsed().as_secs() as i64 + 2;
    if let Err(detail) = verify_copy(written, &copy.entries, tolerance) {
        crate::steps::stop_serving_quietly(serving).await;
        return Err(work_err("verify the v2 copy", detail));
    }
    cx.check_kept(serving, Some(before), &copy.fingerprint)
        .await?;
    Ok(copy.fingerprint)
}

/// Keys as v2 paths, checked for what the v2 store cannot hold: values and
/// keys that are not UTF-8 (v2 is JSON text), a key the v2 store would
/// keep under another name ([`v2_name_problem`]), two keys that become
/// one path, and a key that would have to be both a file and a directory.
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
            .to_string();
        if std::str::from_utf8(&entry.value).is_err() {
            return Err(format!(
                "the value of {path} is binary (not UTF-8), which the v2 store cannot hold; for Kubernetes, switch the API server to --storage-media-type=application/json and rewrite the objects before rolling back to etcd2"
            ));
        }
        if let Some(problem) = v2_name_problem(&path) {
            return Err(format!(
                "key {:?} has {problem}: the v2 store cleans every path it is given, so it would keep this key under another name (or none); rename or remove it through the v3 API and rerun",
                String::from_utf8_lossy(&entry.key)
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

/// Why the v2 store would not keep a key at `path` (a v2 path, one leading
/// `/`) under that very name: etcd's v2 store passes every key through
/// Go's `path.Clean`, which drops a trailing slash, collapses empty
/// segments and resolves `.` and `..` (`/registry/a/../b` is stored as
/// `/registry/b`, `/registry/x/` as `/registry/x`). `None`: it would.
pub fn v2_name_problem(path: &str) -> Option<&'static str> {
    let name = path.strip_prefix('/').unwrap_or(path);
    if name.is_empty() {
        return Some("no name (it is the root of the v2 store)");
    }
    name.split('/').find_map(|segment| match segment {
        "" => Some("an empty path segment (a trailing slash or `//`)"),
        "." | ".." => Some("a `.` or `..` path segment"),
        _ => None,
    })
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
    use crate::steps::test_entry as e;

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

    /// `/registry/a/../b` and `/registry/x/` reached the v2 write and
    /// failed only at the copy's verification (exit 3, hold).
    #[test]
    fn a_key_v2_would_store_under_another_name_is_refused_by_name() {
        for key in [
            "/registry/a/../b",
            "/registry/x/",
            "/registry/./y",
            "/registry//z",
            "/",
            "/registry/..",
        ] {
            let err = check_v2_compatible(&[e(key, "1", None)]).expect_err(key);
            assert!(err.contains(&format!("{key:?}")), "{key}: {err}");
        }
        for fine in ["registry/a", "/registry/a.b", "/registry/...", "/a/.hidden"] {
            assert!(check_v2_compatible(&[e(fine, "1", None)]).is_ok(), "{fine}");
        }
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
}
