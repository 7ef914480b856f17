//! This module owns the upgrade lock: the one key in the cluster itself that
//! lets only one member restart at a time. It is create-only and
//! self-expiring, so a holder that dies frees it:
//! - v3 (clusters at 3.0 and later): a transaction that puts the key only
//!   while its `create_revision` is 0, under a lease of [`LOCK_TTL_SECS`]
//!   the holder keeps alive;
//! - v2 (2.x clusters): a `prevExist=false` PUT with a TTL, refreshed by a
//!   compare-and-swap on our own value (2.2 has no `refresh=true`).
//!
//! The value names the holder's member id, so a holder SIGKILLed and
//! restarted finds the lock still its own and takes it over. Releasing
//! deletes the key only while it still holds our value.

use std::time::Duration;

use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};
use serde::{Deserialize, Serialize};

use crate::cluster::client::{connect_v3, ClientError};
use crate::cluster::peer::{self, PeerError, TlsFiles};
use crate::keyspace::{V2Answer, V2_NOT_FOUND};
use crate::log::error_chain;

/// The lock's key. Outside Kubernetes' `/registry` prefix; present only
/// while a member restarts.
pub const LOCK_KEY: &str = "/etcd-migrate/upgrade-lock";

/// How long a lock outlives its holder's last refresh.
pub const LOCK_TTL_SECS: i64 = 60;

/// Who holds the lock: what the key's value says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Holder {
    /// The member id, hex (as etcd prints it).
    pub member: String,
    /// The member's name, for messages.
    pub name: String,
    /// The run of the entrypoint that took it.
    pub run: String,
}

impl Holder {
    /// The holder's member id.
    pub fn member_id(&self) -> Option<u64> {
        u64::from_str_radix(&self.member, 16).ok()
    }
}

/// What an attempt to take the lock gave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Taken {
    /// It is ours (taken now, or taken over from our own member's earlier
    /// run).
    Ours,
    /// Another member holds it.
    HeldBy(Holder),
}

/// Why the lock could not be used.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// The cluster did not answer.
    #[error("the upgrade lock {key} could not be reached through {endpoints}: {reason}")]
    Unreachable {
        /// The key.
        key: String,
        /// The client URLs tried.
        endpoints: String,
        /// What failed.
        reason: String,
    },
    /// The key holds something that is not a holder.
    #[error("the upgrade lock {key} holds {value:?}, which etcd-migrate did not write; remove the key once no member is restarting")]
    Foreign {
        /// The key.
        key: String,
        /// Its value.
        value: String,
    },
    /// Our hold ended (the lease or TTL ran out, or someone removed it).
    #[error(
        "the upgrade lock {key} is no longer ours (its TTL of {ttl} s ran out or it was removed)"
    )]
    Lost {
        /// The key.
        key: String,
        /// The TTL.
        ttl: i64,
    },
    /// The TLS files or client could not be set up.
    #[error(transparent)]
    Tls(#[from] PeerError),
}

fn parse_holder(key: &str, value: &[u8]) -> Result<Holder, LockError> {
    serde_json::from_slice(value).map_err(|_| LockError::Foreign {
        key: key.to_string(),
        value: String::from_utf8_lossy(value).into_owned(),
    })
}

/// One store of the lock (v3 or v2): three primitives, from which taking
/// it is written once ([`UpgradeLock::try_take`]).
// The futures run on the entrypoint's current-thread runtime: no Send needed.
#[allow(async_fn_in_trait)]
pub trait UpgradeLock {
    /// Who this client is.
    fn me(&self) -> &Holder;
    /// Creates the key with our value (and lease or TTL) only if it is
    /// absent; `true` when it was created.
    async fn create(&mut self) -> Result<bool, LockError>;
    /// The current value, raw, if the key exists.
    async fn current(&mut self) -> Result<Option<Vec<u8>>, LockError>;
    /// Replaces the value with ours (and our lease or TTL) only while it is
    /// still exactly `raw`; `true` when it was replaced.
    async fn swap(&mut self, raw: Vec<u8>) -> Result<bool, LockError>;
    /// Keeps our hold alive for another [`LOCK_TTL_SECS`].
    async fn refresh(&mut self) -> Result<(), LockError>;
    /// Removes the key if it still holds our value.
    async fn release(&mut self) -> Result<(), LockError>;

    /// Who holds the lock now, if anyone.
    async fn holder(&mut self) -> Result<Option<Holder>, LockError> {
        match self.current().await? {
            Some(raw) => parse_holder(LOCK_KEY, &raw).map(Some),
            None => Ok(None),
        }
    }

    /// Takes the lock if it is free or our member's (an earlier run of our
    /// entrypoint, SIGKILLed), else names its holder. A key deleted between
    /// our create and our read makes one more attempt.
    async fn try_take(&mut self) -> Result<Taken, LockError> {
        for _ in 0..2 {
            if self.create().await? {
                return Ok(Taken::Ours);
            }
            let Some(raw) = self.current().await? else {
                continue;
            };
            let holder = parse_holder(LOCK_KEY, &raw)?;
            if holder.member != self.me().member {
                return Ok(Taken::HeldBy(holder));
            }
            // Only while it still holds exactly what that run wrote.
            if self.swap(raw).await? {
                return Ok(Taken::Ours);
            }
        }
        Ok(self
            .holder()
            .await?
            .map_or_else(|| Taken::HeldBy(self.me().clone()), Taken::HeldBy))
    }
}

/// The lock over the v3 API.
pub struct V3Lock {
    client: etcd_client::Client,
    endpoints: String,
    me: Holder,
    value: String,
    lease: Option<i64>,
    tls: Option<TlsFiles>,
    timeout: Duration,
}

/// A v3 client for the lock at `endpoints`; its failures named as the
/// lock's.
async fn lock_client(
    endpoints: &[String],
    tls: Option<&TlsFiles>,
    timeout: Duration,
) -> Result<etcd_client::Client, LockError> {
    connect_v3(endpoints, tls, timeout)
        .await
        .map_err(|e| match e {
            ClientError::Tls(tls) => LockError::Tls(tls),
            other => LockError::Unreachable {
                key: LOCK_KEY.to_string(),
                endpoints: endpoints.join(","),
                reason: other.to_string(),
            },
        })
}

impl V3Lock {
    /// The same lock (our holder value, our lease) asked through other
    /// client URLs: our own member is down while it restarts under the
    /// lock, and the lease must be kept alive through another.
    pub async fn reconnect(&mut self, endpoints: &[String]) -> Result<(), LockError> {
        let joined = endpoints.join(",");
        self.client = lock_client(endpoints, self.tls.as_ref(), self.timeout).await?;
        self.endpoints = joined;
        Ok(())
    }

    /// Connects to the cluster's client URLs (with the client TLS files,
    /// when the cluster has client TLS) as `me`.
    pub async fn connect(
        endpoints: &[String],
        tls: Option<&TlsFiles>,
        me: Holder,
        timeout: Duration,
    ) -> Result<Self, LockError> {
        let joined = endpoints.join(",");
        let client = lock_client(endpoints, tls, timeout).await?;
        let value = serde_json::to_string(&me).map_err(|e| LockError::Unreachable {
            key: LOCK_KEY.to_string(),
            endpoints: joined.clone(),
            reason: e.to_string(),
        })?;
        Ok(V3Lock {
            client,
            endpoints: joined,
            me,
            value,
            lease: None,
            tls: tls.cloned(),
            timeout,
        })
    }

    /// [`UpgradeLock::release`] within `bound`, else an `Unreachable`
    /// error (the lease ends the lock then). A request of the etcd client
    /// waits for a ready connection before its own timeout starts, and
    /// over TLS a connection to a port that takes it but never serves (an
    /// etcd without its quorum) is never ready: the request would wait
    /// with no end (`e2e/cluster_probe.rs`
    /// `a_lock_release_to_a_tls_port_that_never_serves_ends_within_its_bound`).
    /// For the failure paths, where the way on is this run's exit.
    pub async fn release_within(&mut self, bound: Duration) -> Result<(), LockError> {
        match tokio::time::timeout(bound, self.release()).await {
            Ok(released) => released,
            Err(_) => Err(LockError::Unreachable {
                key: LOCK_KEY.to_string(),
                endpoints: self.endpoints.clone(),
                reason: format!("no answer within {bound:?}"),
            }),
        }
    }

    fn unreachable(&self, err: etcd_client::Error) -> LockError {
        LockError::Unreachable {
            key: LOCK_KEY.to_string(),
            endpoints: self.endpoints.clone(),
            reason: error_chain(&err),
        }
    }

    async fn lease(&mut self) -> Result<i64, LockError> {
        if let Some(id) = self.lease {
            return Ok(id);
        }
        let granted = self
            .client
            .lease_grant(LOCK_TTL_SECS, None)
            .await
            .map_err(|e| self.unreachable(e))?;
        self.lease = Some(granted.id());
        Ok(granted.id())
    }

    fn lost(&self) -> LockError {
        LockError::Lost {
            key: LOCK_KEY.to_string(),
            ttl: LOCK_TTL_SECS,
        }
    }

    /// Puts our value under our lease only while `compare` holds; `true`
    /// when it did.
    async fn put_when(&mut self, compare: Compare) -> Result<bool, LockError> {
        let lease = self.lease().await?;
        let put = TxnOp::put(
            LOCK_KEY,
            self.value.clone(),
            Some(PutOptions::new().with_lease(lease)),
        );
        let txn = Txn::new().when([compare]).and_then([put]);
        let response = self
            .client
            .txn(txn)
            .await
            .map_err(|e| self.unreachable(e))?;
        Ok(response.succeeded())
    }
}

impl UpgradeLock for V3Lock {
    fn me(&self) -> &Holder {
        &self.me
    }

    async fn create(&mut self) -> Result<bool, LockError> {
        self.put_when(Compare::create_revision(LOCK_KEY, CompareOp::Equal, 0))
            .await
    }

    async fn current(&mut self) -> Result<Option<Vec<u8>>, LockError> {
        let response = self
            .client
            .get(LOCK_KEY, None)
            .await
            .map_err(|e| self.unreachable(e))?;
        Ok(response.kvs().first().map(|kv| kv.value().to_vec()))
    }

    async fn swap(&mut self, raw: Vec<u8>) -> Result<bool, LockError> {
        self.put_when(Compare::value(LOCK_KEY, CompareOp::Equal, raw))
            .await
    }

    async fn refresh(&mut self) -> Result<(), LockError> {
        let Some(lease) = self.lease else {
            return Err(self.lost());
        };
        let (mut keeper, mut stream) = self
            .client
            .lease_keep_alive(lease)
            .await
            .map_err(|e| self.unreachable(e))?;
        keeper.keep_alive().await.map_err(|e| self.unreachable(e))?;
        // The stream's opening is bounded by the request's deadline
        // (`grpc.rs`); its answer is a message on the stream, bounded here
        // (a member frozen between the two would hold it without end).
        let answer = tokio::time::timeout(self.timeout, stream.message())
            .await
            .map_err(|_| LockError::Unreachable {
                key: LOCK_KEY.to_string(),
                endpoints: self.endpoints.clone(),
                reason: format!(
                    "no answer to the lease's keep-alive within {:?}",
                    self.timeout
                ),
            })?;
        match answer.map_err(|e| self.unreachable(e))? {
            Some(answer) if answer.ttl() > 0 => {}
            _ => return Err(self.lost()),
        }
        match self.holder().await? {
            Some(holder) if holder == self.me => Ok(()),
            _ => Err(self.lost()),
        }
    }

    /// Also ends our lease.
    async fn release(&mut self) -> Result<(), LockError> {
        let txn = Txn::new()
            .when([Compare::value(
                LOCK_KEY,
                CompareOp::Equal,
                self.value.clone(),
            )])
            .and_then([TxnOp::delete(LOCK_KEY, None)]);
        self.client
            .txn(txn)
            .await
            .map_err(|e| self.unreachable(e))?;
        if let Some(lease) = self.lease.take() {
            self.client
                .lease_revoke(lease)
                .await
                .map_err(|e| self.unreachable(e))?;
        }
        Ok(())
    }
}

/// The lock over the v2 API, for 2.x clusters.
pub struct V2Lock {
    http: reqwest::Client,
    endpoints: Vec<String>,
    me: Holder,
    value: String,
}

impl V2Lock {
    /// A lock client over the cluster's client URLs.
    pub fn new(
        endpoints: &[String],
        tls: Option<&TlsFiles>,
        me: Holder,
        timeout: Duration,
    ) -> Result<Self, LockError> {
        let value = serde_json::to_string(&me).map_err(|e| LockError::Unreachable {
            key: LOCK_KEY.to_string(),
            endpoints: endpoints.join(","),
            reason: e.to_string(),
        })?;
        Ok(V2Lock {
            http: peer::http_client(tls, timeout)?,
            endpoints: endpoints.to_vec(),
            me,
            value,
        })
    }

    /// One request to the first member that answers; `form` carries the
    /// value, TTL and conditions.
    async fn request(
        &self,
        method: reqwest::Method,
        form: &[(&str, &str)],
    ) -> Result<V2Answer, LockError> {
        let mut last = String::from("no client URL");
        for endpoint in &self.endpoints {
            let mut url = format!("{}/v2/keys{LOCK_KEY}", endpoint.trim_end_matches('/'));
            // etcd reads a PUT's form from its body, a DELETE's from the
            // query string (Go's ParseForm).
            let request = if method == reqwest::Method::PUT {
                self.http.request(method.clone(), &url).form(form)
            } else {
                if !form.is_empty() {
                    let query = url::form_urlencoded::Serializer::new(String::new())
                        .extend_pairs(form)
                        .finish();
                    url = format!("{url}?{query}");
                }
                self.http.request(method.clone(), &url)
            };
            match request.send().await {
                Ok(response) => match response.text().await {
                    Ok(body) => match serde_json::from_str::<V2Answer>(&body) {
                        Ok(answer) => return Ok(answer),
                        Err(e) => last = format!("{url} answered {body:?}: {e}"),
                    },
                    Err(e) => last = format!("{url}: {}", error_chain(&e)),
                },
                Err(e) => last = format!("{url}: {}", error_chain(&e)),
            }
        }
        Err(LockError::Unreachable {
            key: LOCK_KEY.to_string(),
            endpoints: self.endpoints.join(","),
            reason: last,
        })
    }

    /// A PUT of our value with the TTL and `condition`; `true` when etcd
    /// took it (no error code).
    async fn put_if(&self, condition: (&str, &str)) -> Result<bool, LockError> {
        let ttl = LOCK_TTL_SECS.to_string();
        let answer = self
            .request(
                reqwest::Method::PUT,
                &[("value", &self.value), ("ttl", &ttl), condition],
            )
            .await?;
        Ok(answer.error_code.is_none())
    }
}

impl UpgradeLock for V2Lock {
    fn me(&self) -> &Holder {
        &self.me
    }

    async fn create(&mut self) -> Result<bool, LockError> {
        self.put_if(("prevExist", "false")).await
    }

    async fn current(&mut self) -> Result<Option<Vec<u8>>, LockError> {
        let answer = self.request(reqwest::Method::GET, &[]).await?;
        if answer.error_code == Some(V2_NOT_FOUND) {
            return Ok(None);
        }
        Ok(answer
            .node
            .and_then(|node| node.value)
            .map(String::into_bytes))
    }

    async fn swap(&mut self, raw: Vec<u8>) -> Result<bool, LockError> {
        let raw = String::from_utf8_lossy(&raw).into_owned();
        self.put_if(("prevValue", &raw)).await
    }

    /// A compare-and-swap on our own value (2.2 has no `refresh=true`).
    async fn refresh(&mut self) -> Result<(), LockError> {
        let value = self.value.clone();
        match self.put_if(("prevValue", &value)).await? {
            true => Ok(()),
            false => Err(LockError::Lost {
                key: LOCK_KEY.to_string(),
                ttl: LOCK_TTL_SECS,
            }),
        }
    }

    async fn release(&mut self) -> Result<(), LockError> {
        let value = self.value.clone();
        self.request(reqwest::Method::DELETE, &[("prevValue", &value)])
            .await
            .map(|_| ())
    }
}
