//! This module owns the in-place steps (a patch or a minor upgrade): the
//! step's release serves the data as it is, takes a write, and must serve
//! the keyspace the last step left.

use crate::baseline::PendingBaseline;
use crate::effects::{EtcdApi, Launcher, Tools};
use crate::keyspace::Fingerprint;
use crate::steps::{run, Context, Failure};
use crate::swap::Disk;
use crate::version::VersionPair;

/// Runs `pair.version` on the data; returns the fingerprint of what it
/// serves, checked against `before`, or, for a first step whose baseline
/// is still being taken `offline`, against that baseline once its etcd
/// has waited for it (before its first write).
pub(crate) async fn run_in_place<L: Launcher, A: EtcdApi, T: Tools, D: Disk>(
    cx: &Context<'_, L, A, T, D>,
    pair: VersionPair,
    before: Option<&Fingerprint>,
    offline: Option<PendingBaseline>,
) -> Result<Fingerprint, Failure> {
    let serve = run(pair.version, pair.storage, cx.settings.data_dir);
    let (mut serving, taken) = cx.start_serving_after(serve, offline).await?;
    let before = taken.as_ref().or(before);
    let after = cx
        .read_fingerprint_since(&mut serving, pair.storage, before)
        .await?;
    crate::failpoint!("step-after-fingerprint");
    cx.check_kept(&mut serving, before, &after).await?;
    cx.stop_serving(serving).await?;
    Ok(after)
}
