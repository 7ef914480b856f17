//! This module owns the minor downgrade through etcd's own downgrade API
//! (3.7 → 3.6, 3.6 → 3.5, 3.5 → 3.4.31+): `serve`, the data's own minor,
//! serves the data and must hold what the last step left; its cluster is
//! told to downgrade to `to`'s minor (`downgrade validate`, `downgrade
//! enable`), and the step waits, bounded by the health deadline, until
//! the data's cluster version (3.6+: and its storage version) is there;
//! then `to` runs on the data in place, must hold the same keyspace
//! (proven by etcd's hash at the revision `serve` read), and ends the
//! downgrade job (`downgrade cancel`, what the leader does by itself once
//! every member runs the target), so the data is left as `to` would have
//! written it.
//!
//! Why not a snapshot and a restore (`minor_rollback`): a restored 3.7
//! snapshot still records cluster version 3.7, which 3.6.14 refuses
//! ("invalid downgrade; server version is lower than determined cluster
//! version"), and etcd's supported way back since 3.6 is this one. Why it
//! is safe to resume: until `to` is recorded, a rerun serves the data with
//! `serve` again (a member one minor ahead of a downgraded cluster version
//! is what etcd allows while the downgrade is enabled), enables the same
//! downgrade again (etcd says a job is under way: the same one) and goes on.

use std::time::{Duration, Instant};

use crate::effects::{EtcdApi, Launcher, Tools};
use crate::keyspace::Fingerprint;
use crate::log;
use crate::steps::{run, Context, Failure, Serving};
use crate::swap::Disk;
use crate::version::{Minor, Storage, Version};

/// Pause between two looks at the data's versions while etcd lowers them
/// (its leader does it on a timer of a few seconds).
pub const DOWNGRADE_POLL: Duration = Duration::from_millis(100);

/// Walks the data down from `serve`'s minor to `to`; returns the
/// fingerprint of what `to` serves, checked against `before`.
pub(crate) async fn minor_downgrade<L: Launcher, A: EtcdApi, T: Tools, D: Disk>(
    cx: &Context<'_, L, A, T, D>,
    serve: Version,
    to: Version,
    before: Option<&Fingerprint>,
) -> Result<Fingerprint, Failure> {
    let data_dir = cx.settings.data_dir;
    let target = to.minor_line();
    let mut source = run(serve, Storage::Etcd3, data_dir);
    source.downgrading_to = Some(target);
    let mut serving = cx.start_serving(source).await?;
    let read = cx
        .read_fingerprint_since(&mut serving, Storage::Etcd3, before)
        .await?;
    cx.check_kept(&mut serving, before, &read).await?;
    let endpoint = serving.endpoint.clone();
    cx.while_serving(
        &mut serving,
        &format!("enable etcd's downgrade to {target}"),
        cx.api.enable_downgrade(&endpoint, target),
    )
    .await?;
    log::info(
        "downgrade enabled",
        &[
            ("release", serve.to_string().into()),
            ("target", target.to_string().into()),
        ],
    );
    wait_downgraded(cx, &mut serving, target).await?;
    cx.stop_serving(serving).await?;
    let mut older = run(to, Storage::Etcd3, data_dir);
    older.downgrading_to = Some(target);
    let mut serving = cx.start_serving(older).await?;
    let after = cx
        .read_fingerprint_since(&mut serving, Storage::Etcd3, Some(&read))
        .await?;
    cx.check_kept(&mut serving, Some(&read), &after).await?;
    let endpoint = serving.endpoint.clone();
    cx.while_serving(
        &mut serving,
        "end etcd's downgrade job",
        cx.api.finish_downgrade(&endpoint),
    )
    .await?;
    cx.stop_serving(serving).await?;
    Ok(after)
}

/// Waits until the data `serving` serves is down at `target` (its
/// cluster version, and its storage version where the release reports
/// one), within the health deadline; says how long it took.
async fn wait_downgraded<L: Launcher, A: EtcdApi, T: Tools, D: Disk>(
    cx: &Context<'_, L, A, T, D>,
    serving: &mut Serving<L::Etcd>,
    target: Minor,
) -> Result<(), Failure> {
    let endpoint = serving.endpoint.clone();
    let deadline = cx.settings.health_timeout;
    let started = Instant::now();
    let wait = async {
        let mut progress = log::Progress::new(
            "downgrade wait",
            log::ProgressUnit::Seconds,
            deadline.as_secs(),
        );
        let mut last = String::from("not looked yet");
        while started.elapsed() < deadline {
            match cx.api.downgraded(&endpoint, target).await {
                Ok(true) => return Ok(()),
                Ok(false) => last = format!("the data's versions are not at {target} yet"),
                Err(err) => last = err.into(),
            }
            progress.tick(&[("target", target.to_string().into())]);
            tokio::time::sleep(DOWNGRADE_POLL).await;
        }
        Err(format!(
            "the data did not reach {target} within {} s ({last})",
            deadline.as_secs()
        ))
    };
    cx.while_serving(
        serving,
        &format!("wait for the downgrade to {target}"),
        wait,
    )
    .await?;
    log::info(
        "data downgraded",
        &[
            ("target", target.to_string().into()),
            ("ms", log::ms(started.elapsed())),
        ],
    );
    Ok(())
}
