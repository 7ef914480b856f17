//! This module owns what a member asks the cluster through its client API,
//! with the user's client TLS: who leads, which alarms are raised, and
//! handing leadership to another member before our etcd stops. v3 for 3.x
//! clusters (`Status`, `Alarm`, `MoveLeader`, which needs 3.3 and must be
//! asked of the leader itself); for 2.x clusters the leader comes from
//! `/v2/stats/self`, and there are neither alarms nor a transfer (a 2.x
//! leader's stop makes the others elect within an election timeout).

use std::time::Duration;

use etcd_client::{AlarmAction, AlarmType};
use serde::Deserialize;

use crate::cluster::peer::{self, PeerError, TlsFiles};
use crate::log::error_chain;
use crate::version::{Minor, Version};

/// Why the cluster's client API could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// No member answered.
    #[error("no member answered on {endpoints}: {reason}")]
    Unreachable {
        /// The client URLs tried.
        endpoints: String,
        /// What failed.
        reason: String,
    },
    /// The leader refused or failed the transfer.
    #[error("moving leadership from member {from:x} to member {to:x} failed: {reason}")]
    Transfer {
        /// The leader.
        from: u64,
        /// The member asked to lead.
        to: u64,
        /// What etcd said.
        reason: String,
    },
    /// etcd refused or failed a downgrade call.
    #[error("{endpoints}: {source}")]
    Downgrade {
        /// The client URLs asked.
        endpoints: String,
        /// The call and what etcd said.
        #[source]
        source: crate::downgrade::DowngradeError,
    },
    /// The TLS files could not be read.
    #[error(transparent)]
    Tls(#[from] PeerError),
}

/// Connects a v3 client to `endpoints`, with the client TLS files when the
/// cluster serves clients over TLS; every request ends within twice
/// `timeout`: once for its connection, TLS handshake included, once for
/// its answer ([`crate::grpc`]).
pub async fn connect_v3(
    endpoints: &[String],
    tls: Option<&TlsFiles>,
    timeout: Duration,
) -> Result<etcd_client::Client, ClientError> {
    let tls = match tls {
        None => None,
        Some(tls) => {
            let ca = peer::read("trusted CA", &tls.trusted_ca)?;
            let cert = peer::read("certificate", &tls.cert)?;
            let key = peer::read("key", &tls.key)?;
            Some(
                etcd_client::TlsOptions::new()
                    .ca_certificate(etcd_client::Certificate::from_pem(ca))
                    .identity(etcd_client::Identity::from_pem(cert, key))
                    // etcd before 3.5 (3.0 at least) answers TLS without
                    // ALPN; its client port speaks HTTP/2 all the same.
                    .assume_http2(true),
            )
        }
    };
    crate::grpc::connect(endpoints, tls, crate::grpc::Bounds::each(timeout))
        .await
        .map_err(|e| ClientError::Unreachable {
            endpoints: endpoints.join(","),
            reason: error_chain(&e),
        })
}

/// The membership that the member at `endpoints` (one member's client
/// URLs) lists, through the client API (each member's reach unknown yet:
/// down for no time).
///
/// Not its peer `/members`: an etcd that has just started answers that
/// while it still replays its log, with the membership of an earlier
/// index (after a bootstrap with no snapshot yet, any prefix of the
/// initial cluster; else the last snapshot's, without the members added
/// since). A leaving member of a pause job read that as its removal,
/// stopped, and left a cluster that still counted it (CI 2026-11-29).
/// etcd serves its client API only once its own publish is applied,
/// which is after every entry its log held: the list is then never of an
/// index before its start (it may lag the leader's by what is not
/// applied yet, which only ever delays a conclusion).
pub async fn membership(
    endpoints: &[String],
    tls: Option<&TlsFiles>,
    timeout: Duration,
) -> Result<Vec<crate::cluster::decide::Member>, ClientError> {
    let mut client = connect_v3(endpoints, tls, timeout).await?;
    let listed = client
        .member_list()
        .await
        .map_err(|e| ClientError::Unreachable {
            endpoints: endpoints.join(","),
            reason: error_chain(&e),
        })?;
    Ok(listed
        .members()
        .iter()
        .map(|m| crate::cluster::decide::Member {
            id: m.id(),
            name: m.name().to_string(),
            peer_urls: m.peer_urls().to_vec(),
            client_urls: m.client_urls().to_vec(),
            is_learner: m.is_learner(),
            reach: crate::cluster::Reach::Down(Duration::ZERO),
            storage: None,
        })
        .collect())
}

/// How [`scan_v3`] reads the keyspace.
#[derive(Debug, Clone, Copy, Default)]
pub struct Scan {
    /// At this revision (`None`: the newest).
    pub revision: Option<i64>,
    /// From the asked member's own store, not a quorum read.
    pub serializable: bool,
    /// Keys without their values.
    pub keys_only: bool,
}

/// Hands every v3 key of `client`'s cluster to `visit`, in key order, a
/// page of 1,000 at a time, until `visit` breaks with what it found
/// (`Ok(None)`: it never did). One scan for whoever needs the whole live
/// keyspace without holding it: the fit checks before a job's go, the
/// digest of a release without `HashKV`.
pub async fn scan_v3<T>(
    client: &mut etcd_client::Client,
    scan: Scan,
    mut visit: impl FnMut(&etcd_client::KeyValue) -> std::ops::ControlFlow<T>,
) -> Result<Option<T>, String> {
    const PAGE: i64 = 1000;
    let mut start = vec![0u8];
    loop {
        let mut options = etcd_client::GetOptions::new()
            .with_range(vec![0u8])
            .with_limit(PAGE);
        if let Some(revision) = scan.revision {
            options = options.with_revision(revision);
        }
        if scan.serializable {
            options = options.with_serializable();
        }
        if scan.keys_only {
            options = options.with_keys_only();
        }
        let page = client
            .get(start.clone(), Some(options))
            .await
            .map_err(|e| error_chain(&e))?;
        for kv in page.kvs() {
            if let std::ops::ControlFlow::Break(found) = visit(kv) {
                return Ok(Some(found));
            }
        }
        match page.kvs().last() {
            // The next page starts right after the last key of this one.
            Some(last) if page.more() => {
                start = last.key().to_vec();
                start.push(0);
            }
            _ => return Ok(None),
        }
    }
}

/// The v3 client API of a 3.x cluster.
pub struct V3Cluster {
    endpoints: Vec<String>,
    tls: Option<TlsFiles>,
    timeout: Duration,
    client: etcd_client::Client,
}

impl V3Cluster {
    /// Connects to the cluster's client URLs.
    pub async fn connect(
        endpoints: &[String],
        tls: Option<&TlsFiles>,
        timeout: Duration,
    ) -> Result<Self, ClientError> {
        Ok(V3Cluster {
            endpoints: endpoints.to_vec(),
            tls: tls.cloned(),
            timeout,
            client: connect_v3(endpoints, tls, timeout).await?,
        })
    }

    fn unreachable(&self, err: etcd_client::Error) -> ClientError {
        ClientError::Unreachable {
            endpoints: self.endpoints.join(","),
            reason: error_chain(&err),
        }
    }

    /// The leader's member id, as the member that answers knows it (`None`
    /// while there is no leader), and the target of an enabled downgrade
    /// job (3.6+ tell; `None` from older members).
    pub async fn status(&mut self) -> Result<(Option<u64>, Option<Minor>), ClientError> {
        let status = self
            .client
            .status()
            .await
            .map_err(|e| self.unreachable(e))?;
        let downgrade = status
            .downgrade_info()
            .filter(|info| info.enabled())
            .and_then(|info| info.target_version().parse::<Version>().ok())
            .map(Version::minor_line);
        Ok(((status.leader() != 0).then_some(status.leader()), downgrade))
    }

    /// The client itself, for requests of another module's keys (the
    /// announcements).
    pub fn client(&mut self) -> &mut etcd_client::Client {
        &mut self.client
    }

    /// The leader's member id alone (see [`V3Cluster::status`]).
    pub async fn leader(&mut self) -> Result<Option<u64>, ClientError> {
        Ok(self.status().await?.0)
    }

    /// Has etcd downgrade the cluster to `to` (validate, then enable).
    pub async fn enable_downgrade(&mut self, to: Minor) -> Result<(), ClientError> {
        let mut maintenance = self.client.maintenance_client();
        crate::downgrade::enable(&mut maintenance, to)
            .await
            .map_err(|source| self.downgrade_failed(source))
    }

    /// Ends the cluster's downgrade job.
    pub async fn cancel_downgrade(&mut self) -> Result<(), ClientError> {
        let mut maintenance = self.client.maintenance_client();
        crate::downgrade::cancel(&mut maintenance)
            .await
            .map_err(|source| self.downgrade_failed(source))
    }

    fn downgrade_failed(&self, source: crate::downgrade::DowngradeError) -> ClientError {
        ClientError::Downgrade {
            endpoints: self.endpoints.join(","),
            source,
        }
    }

    /// The raised alarms, by name (`NOSPACE`, `CORRUPT`), with the member
    /// that raised each.
    pub async fn alarms(&mut self) -> Result<Vec<String>, ClientError> {
        let response = self
            .client
            .alarm(AlarmAction::Get, AlarmType::None, None)
            .await
            .map_err(|e| self.unreachable(e))?;
        Ok(response
            .alarms()
            .iter()
            .map(|alarm| format!("{:?} on member {:x}", alarm.alarm(), alarm.member_id()))
            .collect())
    }

    /// Asks the leader, at `leader_url` (its client URL), to hand
    /// leadership to member `to`.
    pub async fn move_leader(
        &mut self,
        leader: u64,
        leader_url: &str,
        to: u64,
    ) -> Result<(), ClientError> {
        let mut at_leader =
            connect_v3(&[leader_url.to_string()], self.tls.as_ref(), self.timeout).await?;
        at_leader
            .move_leader(to)
            .await
            .map(|_| ())
            .map_err(|e| ClientError::Transfer {
                from: leader,
                to,
                reason: error_chain(&e),
            })
    }
}

#[derive(Deserialize)]
struct StatsSelf {
    #[serde(rename = "leaderInfo")]
    leader_info: Option<LeaderInfo>,
}

#[derive(Deserialize)]
struct LeaderInfo {
    leader: Option<String>,
}

/// The leader of a 2.x cluster, from the first member whose
/// `/v2/stats/self` answers.
pub async fn v2_leader(
    endpoints: &[String],
    tls: Option<&TlsFiles>,
    timeout: Duration,
) -> Result<Option<u64>, ClientError> {
    let http = peer::http_client(tls, timeout)?;
    let mut last = String::from("no client URL");
    for endpoint in endpoints {
        let url = format!("{}/v2/stats/self", endpoint.trim_end_matches('/'));
        let body = match http.get(&url).send().await {
            Ok(response) => match response.text().await {
                Ok(body) => body,
                Err(e) => {
                    last = format!("{url}: {}", error_chain(&e));
                    continue;
                }
            },
            Err(e) => {
                last = format!("{url}: {}", error_chain(&e));
                continue;
            }
        };
        match serde_json::from_str::<StatsSelf>(&body) {
            Ok(stats) => {
                return Ok(stats
                    .leader_info
                    .and_then(|info| info.leader)
                    .and_then(|hex| u64::from_str_radix(&hex, 16).ok()))
            }
            Err(e) => last = format!("{url} answered {body:?}: {e}"),
        }
    }
    Err(ClientError::Unreachable {
        endpoints: endpoints.join(","),
        reason: last,
    })
}
