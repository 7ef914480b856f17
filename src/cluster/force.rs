//! This module owns the recovery of a cluster that lost its quorum (issue
//! 29 item 2): one surviving member, given `--force-new-cluster` (or
//! `FORCE_NEW_CLUSTER=1`) by the operator, is started once with etcd's
//! own `--force-new-cluster`, which makes it a one-member cluster that
//! keeps its data and ids and drops the other members from the
//! membership; the lost members then join it again one by one
//! (`self_join`).
//!
//! Never while the old cluster can still decide: the other members are
//! asked on their peer `/version`, and if enough answer to form a quorum
//! with this member ([`quorum_left`]), the force is refused (two clusters
//! from one would be a split brain). The forcing etcd runs as our child
//! with the member's own arguments and the flag, until its own peer
//! `/members` lists it alone, then it is stopped: the hand-over execs the
//! member's etcd without the flag, as every start does.

use std::time::{Duration, Instant};

use crate::cluster::decide::Member;
use crate::cluster::member::SupervisedEtcd;
use crate::cluster::peer::{error_text, PeerClient, PeerError, TlsFiles};
use crate::cluster::roll::MemberEtcd;
use crate::log;
use crate::supervisor::SupervisorError;
use crate::version::Version;

/// How long one member may take to answer.
const ASK_TIMEOUT: Duration = Duration::from_secs(3);

/// The pause between two looks at the forcing etcd's membership.
const LOOK_EVERY: Duration = Duration::from_millis(200);

/// Why the force was refused or failed.
#[derive(Debug, thiserror::Error)]
pub enum ForceError {
    /// The old cluster can still form a quorum.
    #[error("--force-new-cluster refused: {answering} of the other {others} members of this cluster answer ({names}), a quorum with this member ({quorum} of {members}): the cluster is not lost; restart this member without FORCE_NEW_CLUSTER and it rejoins (forcing now would split the cluster in two)")]
    QuorumAnswers {
        /// How many others answered.
        answering: usize,
        /// How many others there are.
        others: usize,
        /// Who answered.
        names: String,
        /// The quorum.
        quorum: usize,
        /// The membership's size.
        members: usize,
    },
    /// Nothing to force.
    #[error("--force-new-cluster refused: {why}")]
    Refused {
        /// Why.
        why: String,
    },
    /// The forcing etcd did not end up alone within the deadline, or
    /// exited.
    #[error("the etcd started with --force-new-cluster did not report a one-member cluster within {within:?}: {why}; the data dir's backup is there; look at etcd's output above")]
    NotForced {
        /// The deadline.
        within: Duration,
        /// What was last seen.
        why: String,
    },
    /// The peer TLS could not be used.
    #[error(transparent)]
    Peer(#[from] PeerError),
    /// Starting or stopping etcd.
    #[error(transparent)]
    Supervisor(#[from] SupervisorError),
}

/// Whether the old cluster of `members` can still decide with us: the
/// others answering, and this member, reach its quorum.
pub fn quorum_left(members: usize, others_answering: usize) -> bool {
    others_answering + 1 > members / 2
}

/// Refuses the force while the old cluster can decide (see the module
/// doc); `others` are the other members (id, name, peer URLs).
pub async fn check(
    members: &[Member],
    own_id: u64,
    peer_tls: Option<&TlsFiles>,
) -> Result<(), ForceError> {
    let peer = PeerClient::new(peer_tls, ASK_TIMEOUT)?;
    let others: Vec<&Member> = members.iter().filter(|m| m.id != own_id).collect();
    if others.is_empty() {
        return Err(ForceError::Refused {
            why: "this member's data records a cluster of one: there is no quorum to recover"
                .to_string(),
        });
    }
    // Asked together: a lost member's address may answer nothing until
    // the timeout, and the others must not wait behind it.
    let asked = futures_util::future::join_all(others.iter().map(|member| {
        let peer = &peer;
        async move {
            for url in &member.peer_urls {
                if peer.version(url).await.is_ok() {
                    return Some(format!("{} {url}", member.name));
                }
            }
            None
        }
    }))
    .await;
    let answering: Vec<String> = asked.into_iter().flatten().collect();
    log::info(
        "asked the old cluster before forcing a new one",
        &[
            ("members", members.len().into()),
            ("answering", answering.len().into()),
        ],
    );
    if quorum_left(members.len(), answering.len()) {
        return Err(ForceError::QuorumAnswers {
            answering: answering.len(),
            others: others.len(),
            names: answering.join(", "),
            quorum: members.len() / 2 + 1,
            members: members.len(),
        });
    }
    Ok(())
}

/// Starts `release` as our child with `--force-new-cluster` appended to
/// the member's own arguments (in `etcd`), waits until its own peer
/// `/members` (at `own_peer_url`) lists it alone, and stops it. Returns
/// the names the membership held before.
pub async fn force(
    mut etcd: SupervisedEtcd,
    release: Version,
    own: (&str, &[String]),
    tls: (Option<&TlsFiles>, Option<&TlsFiles>),
    within: Duration,
) -> Result<(), ForceError> {
    let (own_peer_url, client_urls) = own;
    let (peer_tls, client_tls) = tls;
    let peer = PeerClient::new(peer_tls, ASK_TIMEOUT)?;
    etcd.start(release).await?;
    let started = Instant::now();
    let outcome = loop {
        if let Some(status) = etcd.exited() {
            break Err(ForceError::NotForced {
                within,
                why: format!("it exited with {status}"),
            });
        }
        let seen = match peer.members(own_peer_url).await {
            // Alone in the membership it shows, but the removals it
            // appended may not be committed in its WAL yet (a stop now
            // found all three members again at the next start, measured
            // on 3.5.16): a write through it, answered only once applied
            // and so once the commit is on disk, is the proof.
            Ok(list) if list.len() == 1 => match committed(client_urls, client_tls).await {
                Ok(()) => break Ok(()),
                Err(why) => {
                    format!("alone in its membership, but a write does not commit yet: {why}")
                }
            },
            Ok(list) => format!("its membership lists {} members", list.len()),
            Err(err) => error_text(&err),
        };
        if started.elapsed() > within {
            break Err(ForceError::NotForced { within, why: seen });
        }
        tokio::time::sleep(LOOK_EVERY).await;
    };
    let status = etcd.stop().await?;
    log::info(
        "the etcd that forced a new cluster stopped",
        &[
            ("status", status.to_string().into()),
            ("ms", log::ms(started.elapsed())),
        ],
    );
    outcome
}

/// The key the proof writes and deletes again.
const PROOF_KEY: &str = "/etcd-migrate/forced";

/// A write through our own client URLs commits (and is deleted again).
async fn committed(client_urls: &[String], client_tls: Option<&TlsFiles>) -> Result<(), String> {
    let mut client = crate::cluster::client::connect_v3(client_urls, client_tls, ASK_TIMEOUT)
        .await
        .map_err(|e| e.to_string())?;
    client
        .put(PROOF_KEY, "forced", None)
        .await
        .map_err(|e| error_text(&e))?;
    client
        .delete(PROOF_KEY, None)
        .await
        .map_err(|e| error_text(&e))?;
    Ok(())
}

/// `etcd` (the member's, supervised) with `--force-new-cluster` after its
/// own arguments.
pub fn forcing_etcd(etcd: SupervisedEtcd) -> SupervisedEtcd {
    etcd.with_arg("--force-new-cluster")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_old_cluster_decides_while_a_quorum_with_us_answers() {
        for (members, answering, left) in [
            (3, 2, true),
            (3, 1, true),
            (3, 0, false),
            (5, 2, true),
            (5, 1, false),
            (5, 0, false),
            (2, 1, true),
            (2, 0, false),
        ] {
            assert_eq!(
                quorum_left(members, answering),
                left,
                "{members} members, {answering} others answering"
            );
        }
    }
}
