//! This module owns the minor rollback (3.x → 3.(x-1)): `serve` saves a
//! snapshot, `to`'s restore tool writes it into a fresh dir in the scratch
//! dir with the same member name, cluster, peer URLs and token, `to` proves
//! it by serving it (with the v2 side store carried over, which the
//! snapshot does not hold), and the member dirs swap.

use std::path::Path;
use std::time::Instant;

use crate::effects::{EtcdApi, Launcher, Tools};
use crate::keyspace::{Entry, Fingerprint};
use crate::log;
use crate::plan::Binary;
use crate::steps::{run, strings, Context, Failure, Serving};
use crate::swap::Disk;
use crate::version::{Storage, Version};

/// What the source gave: its fingerprint, its hidden v2 nodes, and its v2
/// side store's keys with when they were read.
struct Source {
    fingerprint: Fingerprint,
    hidden: Vec<String>,
    v2_side: Vec<Entry>,
    side_read_at: Instant,
}

/// Rolls the data back from `serve`'s minor to `to`'s; returns the
/// fingerprint of the restored copy, checked against `before`. Keys,
/// revisions and leases are in the snapshot.
pub(crate) async fn minor_rollback<L: Launcher, A: EtcdApi, T: Tools, D: Disk>(
    cx: &Context<'_, L, A, T, D>,
    serve: Version,
    to: Version,
    before: Option<&Fingerprint>,
) -> Result<Fingerprint, Failure> {
    let work = cx.disk.fresh_work_dir(cx.settings.data_dir)?;
    let snapshot = work.join("snapshot.db");
    let restored = work.join("restored");
    let source = save_snapshot(cx, serve, before, &snapshot).await?;
    crate::failpoint!("rollback-after-snapshot-save");
    restore(cx, to, &snapshot, &restored).await?;
    crate::failpoint!("rollback-after-restore");
    let before = before.unwrap_or(&source.fingerprint).clone();
    let after = prove_restored(cx, to, &restored, &source, &before).await?;
    crate::failpoint!("rollback-after-restored-served");
    cx.swap_in(&restored, to, Storage::Etcd3)?;
    Ok(after)
}

/// `serve` serves the data, which must hold what `before` held; its v2
/// side store is read, and `etcdctl snapshot save` writes `snapshot`.
async fn save_snapshot<L: Launcher, A: EtcdApi, T: Tools, D: Disk>(
    cx: &Context<'_, L, A, T, D>,
    serve: Version,
    before: Option<&Fingerprint>,
    snapshot: &Path,
) -> Result<Source, Failure> {
    let source = run(serve, Storage::Etcd3, cx.settings.data_dir);
    let mut serving = cx.start_serving(source).await?;
    let fingerprint = cx.read_fingerprint(&mut serving, Storage::Etcd3).await?;
    cx.check_kept(&mut serving, before, &fingerprint).await?;
    // The v2 side store is not in the snapshot: read its keys now.
    let hidden = serving.hidden_v2.clone();
    let v2_side = match fingerprint.v2_side() {
        Some(side) if side.keys > 0 => read_v2_side(cx, &mut serving, &hidden).await?,
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
    let saved = cx
        .offline(Binary::etcdctl(serve), &save_args, &[("ETCDCTL_API", "3")])
        .await;
    cx.stop_serving(serving).await?;
    saved?;
    Ok(Source {
        fingerprint,
        hidden,
        v2_side,
        side_read_at,
    })
}

/// The keys of the v2 store `serving` serves.
async fn read_v2_side<L: Launcher, A: EtcdApi, T: Tools, D: Disk>(
    cx: &Context<'_, L, A, T, D>,
    serving: &mut Serving<L::Etcd>,
    hidden: &[String],
) -> Result<Vec<Entry>, Failure> {
    let endpoint = serving.endpoint.clone();
    let side = cx
        .while_serving(
            serving,
            "read the v2 store",
            cx.api.read_v2(&endpoint, hidden),
        )
        .await?;
    Ok(side.unwrap_or_default())
}

/// `to`'s restore tool writes `snapshot` into `restored` as this member
/// of a new cluster with the configured token.
async fn restore<L: Launcher, A: EtcdApi, T: Tools, D: Disk>(
    cx: &Context<'_, L, A, T, D>,
    to: Version,
    snapshot: &Path,
    restored: &Path,
) -> Result<(), Failure> {
    let settings = &cx.settings;
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
    cx.offline(
        Binary::snapshot_restorer(to),
        &restore_args,
        &[("ETCDCTL_API", "3")],
    )
    .await
}

/// `to` serves the restored copy, which gets the source's v2 side store
/// and must then hold what `before` held; returns its fingerprint.
async fn prove_restored<L: Launcher, A: EtcdApi, T: Tools, D: Disk>(
    cx: &Context<'_, L, A, T, D>,
    to: Version,
    restored: &Path,
    source: &Source,
    before: &Fingerprint,
) -> Result<Fingerprint, Failure> {
    let mut serving = cx.start_serving(run(to, Storage::Etcd3, restored)).await?;
    carry_v2_side(cx, &mut serving, &source.v2_side, source.side_read_at).await?;
    // The carried hidden v2 nodes are where the source had them.
    serving.hidden_v2 = source.hidden.clone();
    let after = cx.read_fingerprint(&mut serving, Storage::Etcd3).await?;
    cx.check_kept(&mut serving, Some(before), &after).await?;
    cx.stop_serving(serving).await?;
    Ok(after)
}

/// Writes the v2 side store read from the source (`side`, read at
/// `read_at`) into the copy `serving` serves, each key with what is
/// left of its TTL: a v3 snapshot does not carry the v2 store.
async fn carry_v2_side<L: Launcher, A: EtcdApi, T: Tools, D: Disk>(
    cx: &Context<'_, L, A, T, D>,
    serving: &mut Serving<L::Etcd>,
    side: &[Entry],
    read_at: Instant,
) -> Result<(), Failure> {
    if side.is_empty() {
        return Ok(());
    }
    let to_write = cx
        .write_alive_v2(
            serving,
            side,
            read_at,
            "write the v2 store's keys into the restored copy",
        )
        .await?;
    log::info("v2 store carried", &[("keys", to_write.len().into())]);
    Ok(())
}
