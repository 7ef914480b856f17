//! This module owns etcd's downgrade calls (the `Downgrade` RPC of 3.5+),
//! shared by the single-member downgrade step and the cluster roll:
//! `validate` then `enable` (a job already under way is the one asked
//! for: the plan only ever walks one minor down), `cancel` (no job left is
//! done), and whether a job is on. 3.5 applies an enable or a cancel but
//! never answers it (measured on 3.5.30); a short deadline and a second
//! look are quicker than its own 5 s timeout.

use etcd_client::{DowngradeOptions, MaintenanceClient};

use crate::log::error_chain;
use crate::version::Minor;

/// Cancels tried before their timeouts count as a failure.
const CANCEL_ATTEMPTS: u32 = 5;

/// Which call failed, and how.
#[derive(Debug, thiserror::Error)]
#[error("{op}: {source}")]
pub struct DowngradeError {
    /// The call (`downgrade validate 3.6`, …).
    pub op: String,
    /// etcd's answer.
    #[source]
    pub source: etcd_client::Error,
}

/// Has the cluster downgrade to `target`: validated, then enabled. A job
/// under way already, or an enable that times out (3.5), counts as done:
/// the caller's wait for its effect tells.
pub async fn enable(client: &mut MaintenanceClient, target: Minor) -> Result<(), DowngradeError> {
    let version = target.to_string();
    let failed = |op: &str, source| DowngradeError {
        op: format!("{op} {version}"),
        source,
    };
    match client
        .downgrade(DowngradeOptions::Validate(version.clone()))
        .await
    {
        Ok(_) => {}
        Err(err) if is_in_progress(&err) => return Ok(()),
        Err(source) => return Err(failed("downgrade validate", source)),
    }
    match client
        .downgrade(DowngradeOptions::Enable(version.clone()))
        .await
    {
        Ok(_) => Ok(()),
        Err(err) if is_in_progress(&err) || is_timeout(&err) => Ok(()),
        Err(source) => Err(failed("downgrade enable", source)),
    }
}

/// Ends the cluster's downgrade job; none left (or a release without the
/// call) is done.
pub async fn cancel(client: &mut MaintenanceClient) -> Result<(), DowngradeError> {
    let mut attempts = 0;
    loop {
        attempts += 1;
        match client.downgrade(DowngradeOptions::Cancel).await {
            Ok(_) => return Ok(()),
            Err(err)
                if error_chain(&err).contains("no inflight downgrade job")
                    || error_chain(&err).contains("unknown method Downgrade") =>
            {
                return Ok(())
            }
            // 3.5 does not answer although the cancel applies: the next
            // one says none is left.
            Err(err) if is_timeout(&err) && attempts < CANCEL_ATTEMPTS => {}
            Err(source) => {
                return Err(DowngradeError {
                    op: "downgrade cancel".to_string(),
                    source,
                })
            }
        }
    }
}

/// Whether a downgrade job to `target` is on, by etcd's validate (which
/// changes nothing): it refuses while a job is under way.
pub async fn is_on(client: &mut MaintenanceClient, target: Minor) -> Result<bool, DowngradeError> {
    match client
        .downgrade(DowngradeOptions::Validate(target.to_string()))
        .await
    {
        Ok(_) => Ok(false),
        Err(err) if is_in_progress(&err) => Ok(true),
        Err(source) => Err(DowngradeError {
            op: format!("downgrade validate {target}"),
            source,
        }),
    }
}

/// Whether etcd said a downgrade job is under way already.
fn is_in_progress(err: &etcd_client::Error) -> bool {
    error_chain(err).contains("downgrade job in progress")
}

/// Whether a call ended in a timeout (ours, or etcd's own "request timed
/// out"), not an answer.
pub fn is_timeout(err: &etcd_client::Error) -> bool {
    let text = error_chain(err);
    text.contains("request timed out")
        || text.contains("Timeout expired")
        || text.contains("deadline")
        || text.contains("timed out")
}
