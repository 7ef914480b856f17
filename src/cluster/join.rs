//! This module owns the safety floor for a member whose data dir holds no
//! data yet (kubeadm's control-plane join, a GCE master added after
//! `member add`): its data records no membership, so the only way to know
//! whether the target fits the cluster it joins is to ask that cluster.
//! The other members named in `--initial-cluster` (or `INITIAL_CLUSTER`)
//! are asked their peer `/version`, over the member's own peer TLS; the
//! target must be the cluster version's minor or the one after it, as for
//! any member. A cluster that nobody answers for is one being bootstrapped
//! (every member starts on empty data at the same time): nothing to check.

use std::time::Duration;

use crate::cluster::observe::VersionInfo;
use crate::cluster::peer::{PeerClient, PeerError, TlsFiles};
use crate::version::{Minor, Version};

/// How long one member may take to answer.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(3);

/// One other member as `--initial-cluster` names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer {
    /// Its name.
    pub name: String,
    /// Its peer URL.
    pub url: String,
}

/// Why the member may not join with this target.
#[derive(Debug, thiserror::Error)]
pub enum JoinRefusal {
    /// The target is below the cluster version.
    #[error("this member joins a cluster whose cluster version is {cluster} ({told}), but TARGET_VERSION is {target}: etcd refuses a member older than the cluster version; set TARGET_VERSION to a {cluster}.x release; nothing was touched")]
    Behind {
        /// The cluster version.
        cluster: Minor,
        /// The target.
        target: Version,
        /// What each member told.
        told: String,
    },
    /// The target is two or more minors ahead.
    #[error("this member joins a cluster whose cluster version is {cluster} ({told}), but TARGET_VERSION is {target}: a member may run at most one minor ahead of the cluster version ({next}); join with TARGET_VERSION at {cluster}.x or {next}.x and upgrade the cluster one minor at a time; nothing was touched")]
    TwoAhead {
        /// The cluster version.
        cluster: Minor,
        /// The minor after it.
        next: Minor,
        /// The target.
        target: Version,
        /// What each member told.
        told: String,
    },
    /// The peer TLS files could not be used to ask.
    #[error("cannot ask the cluster this member joins for its version: {0}; nothing was touched")]
    Tls(#[from] PeerError),
}

/// The other members `initial_cluster` (`name=url,name=url`) names: every
/// entry but those named `own_name`.
pub fn other_members(initial_cluster: &str, own_name: &str) -> Vec<Peer> {
    initial_cluster
        .split(',')
        .filter_map(|entry| entry.split_once('='))
        .map(|(name, url)| (name.trim(), url.trim()))
        .filter(|(name, url)| *name != own_name && !url.is_empty())
        .map(|(name, url)| Peer {
            name: name.to_string(),
            url: url.to_string(),
        })
        .collect()
}

/// What asking the other members gave: each one's answer or why not.
pub type Told = Vec<(Peer, Result<VersionInfo, String>)>;

/// Asks every other member's peer `/version` at once, each within
/// [`PROBE_TIMEOUT`].
pub async fn ask(peers: &[Peer], tls: Option<&TlsFiles>) -> Result<Told, JoinRefusal> {
    let client = PeerClient::new(tls, PROBE_TIMEOUT)?;
    let answers = peers.iter().map(|peer| {
        let client = &client;
        async move {
            let answer = client
                .version(&peer.url)
                .await
                .map_err(|err| err.to_string());
            (peer.clone(), answer)
        }
    });
    // Together: each is bounded by PROBE_TIMEOUT, so all of them are.
    Ok(futures_util::future::join_all(answers).await)
}

/// Whether `target` fits what the members told (pure): the lowest cluster
/// version any member told decides; none told means a cluster being
/// bootstrapped.
pub fn check(target: Version, told: &Told) -> Result<(), JoinRefusal> {
    let Some(cluster) = told
        .iter()
        .filter_map(|(_, answer)| answer.as_ref().ok().and_then(|info| info.cluster))
        .min()
    else {
        return Ok(());
    };
    let told_text = told
        .iter()
        .map(|(peer, answer)| match answer {
            Ok(info) => format!("{} at {}: {}", peer.name, peer.url, info.server),
            Err(_) => format!("{} at {}: no answer", peer.name, peer.url),
        })
        .collect::<Vec<_>>()
        .join(", ");
    let wanted = target.minor_line();
    if wanted < cluster {
        return Err(JoinRefusal::Behind {
            cluster,
            target,
            told: told_text,
        });
    }
    if wanted > cluster.next() {
        return Err(JoinRefusal::TwoAhead {
            cluster,
            next: cluster.next(),
            target,
            told: told_text,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn told(answers: &[(&str, Option<(&str, &str)>)]) -> Told {
        answers
            .iter()
            .map(|(name, answer)| {
                let peer = Peer {
                    name: name.to_string(),
                    url: format!("https://{name}:2380"),
                };
                let answer = match answer {
                    Some((server, cluster)) => Ok(VersionInfo {
                        server: server.parse().expect("version"),
                        cluster: Some(
                            cluster
                                .parse::<Version>()
                                .expect("cluster version")
                                .minor_line(),
                        ),
                        storage: None,
                    }),
                    None => Err("connection refused".to_string()),
                };
                (peer, answer)
            })
            .collect()
    }

    #[test]
    fn the_other_members_are_every_entry_but_our_own() {
        assert_eq!(
            other_members("a=https://10.0.0.1:2380, b=https://10.0.0.2:2380,c=", "a"),
            [Peer {
                name: "b".to_string(),
                url: "https://10.0.0.2:2380".to_string()
            }]
        );
        assert!(other_members("a=http://localhost:2380", "a").is_empty());
    }

    #[test]
    fn a_target_fits_the_cluster_version_or_the_minor_after_it() {
        let v = |s: &str| s.parse::<Version>().expect("version");
        let live = told(&[
            ("b", Some(("3.3.25", "3.3.0"))),
            ("c", None),
            ("d", Some(("3.4.23", "3.3.0"))),
        ]);
        assert!(check(v("3.3.25"), &live).is_ok());
        assert!(check(v("3.4.23"), &live).is_ok());
        let err = check(v("3.5.16"), &live).expect_err("two minors ahead");
        let text = err.to_string();
        assert!(matches!(err, JoinRefusal::TwoAhead { .. }), "{text}");
        assert!(
            text.contains("b at https://b:2380: 3.3.25")
                && text.contains("c at https://c:2380: no answer"),
            "{text}"
        );
        assert!(matches!(
            check(v("3.2.32"), &live),
            Err(JoinRefusal::Behind { .. })
        ));
        // Nobody answers: a cluster being bootstrapped.
        assert!(check(v("3.5.16"), &told(&[("b", None), ("c", None)])).is_ok());
    }
}
