//! This module owns the real etcd API the steps go through (`EtcdApi`:
//! the health write below, the keyspace reads and v2 writes of `keyspace`,
//! and the leased puts of the storage migration), and the proof of health:
//! one write through the API the
//! data is served by (v2 HTTP for etcd2 storage, v3 gRPC for etcd3), of a
//! key that cannot be the user's, removed again at once. `/health` is not
//! used: 3.5 answers it while refusing every v3 call as "not capable"
//! (ETCD-NOTES). Before a v3 write, the data's alarms are listed: a NOSPACE
//! or CORRUPT alarm raised before the migration makes every write fail
//! forever, so it is reported at once, with the remedy, instead of after
//! the deadline.
//!
//! The health key. The Kubernetes tool wrote `etcd_version` and left it
//! there, overwriting a user key of that name. Ours is
//! `/etcd-migrate-health-<run>-<attempt>`: `<run>` is 128 random bits drawn
//! once per run, so no key the data held before the run can have that name;
//! the write is create-only (it fails rather than overwrite); the key
//! expires by itself (a 60 s v2 TTL, a 60 s v3 lease) should a crash come
//! between the write and its removal; and it is removed right after the
//! write. Keyspace reads leave out this run's keys and leases
//! ([`Ours`]), so a removal that failed cannot fail a fingerprint.

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::time::{Duration, Instant};

use etcd_client::{AlarmAction, AlarmType, Compare, CompareOp, PutOptions, Txn, TxnOp};

use crate::downgrade;
use crate::effects::{EtcdApi, Expected, HealthError, LeasePlan};
use crate::keyspace::{self, Entry, Fingerprint, KeyspaceError, KnownLeases, Ours, Read};
use crate::log::error_chain;
use crate::swap::fresh_mark;
#[cfg(test)]
use crate::version::Version;
use crate::version::{Minor, Storage, VersionPair};

/// Seconds a health key lives if it is never removed (a crash between the
/// write and the removal): long enough for the write to be read back,
/// short enough that a leftover is gone soon after the next start.
pub const HEALTH_KEY_TTL_SECS: i64 = 60;

/// How long one write attempt may take before the next is tried. A
/// single-member write is a few ms; 2.x holds writes up to 500 ms before it
/// has elected itself.
pub const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(1);

/// Deadline for one downgrade call. etcd proposes it through raft: 3.6+
/// answers within milliseconds; 3.5 applies it but never answers (its own
/// timeout comes after 5 s, measured on 3.5.30), so a short deadline and
/// a second call that finds the job in the state asked for are quicker.
pub const DOWNGRADE_CALL_TIMEOUT: Duration = Duration::from_secs(2);

/// What a physical compaction of a step's data may take (it walks every
/// revision of the key bucket; the step's deadline bounds it too).
const COMPACT_TIMEOUT: Duration = Duration::from_secs(120);

/// Why a call to a step's etcd failed (or could not be made); each names
/// the URL or endpoint and the key.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// A keyspace read or write failed.
    #[error(transparent)]
    Keyspace(#[from] KeyspaceError),
    /// The HTTP client could not be built.
    #[error("cannot build the HTTP client: {source}")]
    Client {
        /// Why.
        #[source]
        source: reqwest::Error,
    },
    /// A v2 request got no answer.
    #[error("v2 {method} {url}: {detail}")]
    V2Send {
        /// The HTTP method.
        method: &'static str,
        /// The key's URL.
        url: String,
        /// What went wrong, with its causes.
        detail: String,
    },
    /// A v2 request was answered with an error status.
    #[error("v2 {method} {url}: HTTP {status}: {body}")]
    V2Status {
        /// The HTTP method.
        method: &'static str,
        /// The key's URL.
        url: String,
        /// The status.
        status: reqwest::StatusCode,
        /// What etcd said.
        body: String,
    },
    /// The v3 client could not connect to the endpoint.
    #[error("{detail}")]
    Connect {
        /// The step's client URL.
        endpoint: String,
        /// What went wrong (names the endpoint).
        detail: String,
    },
    /// A v3 call on a key failed.
    #[error("{op} {key}: {source}")]
    V3Key {
        /// What was being done.
        op: &'static str,
        /// The key (or key prefix).
        key: String,
        /// Why.
        #[source]
        source: etcd_client::Error,
    },
    /// A lease could not be granted.
    #[error("grant a {ttl} s lease: {source}")]
    Grant {
        /// Its TTL in seconds.
        ttl: i64,
        /// Why.
        #[source]
        source: etcd_client::Error,
    },
    /// A put under a lease failed.
    #[error("put {key} under lease {lease:x}: {source}")]
    LeasedPut {
        /// The key.
        key: String,
        /// The lease.
        lease: i64,
        /// Why.
        #[source]
        source: etcd_client::Error,
    },
    /// A downgrade call (validate, enable, cancel) or the status read
    /// after it failed.
    #[error("{op} on {endpoint}: {source}")]
    Downgrade {
        /// What was asked, e.g. `downgrade enable 3.6`.
        op: String,
        /// The step's client URL.
        endpoint: String,
        /// Why.
        #[source]
        source: etcd_client::Error,
    },
    /// `/version` could not be read.
    #[error("GET {url}: {detail}")]
    Versions {
        /// The URL.
        url: String,
        /// Why.
        detail: String,
    },
}

/// Writes through the real APIs.
pub struct EtcdHealth {
    http: reqwest::Client,
    /// This run's health keys and leases.
    ours: RefCell<Ours>,
    /// Attempts so far: each writes a key of its own, so a key left by a
    /// failed removal never makes the next create-only write fail.
    attempts: Cell<u64>,
    /// Where this run's health lease ids start (random, from the run's
    /// mark): attempt `n` asks for lease `lease_base + n`.
    lease_base: u64,
}

/// The health lease id of attempt `attempt` of the run whose ids start at
/// `base`: positive (etcd takes 0 for "choose one"), and 62 random bits
/// away from any id etcd or a user chose.
fn lease_id(base: u64, attempt: u64) -> i64 {
    const SPAN: u64 = (1 << 62) - 1;
    let id = (base % SPAN + attempt % SPAN) % SPAN + 1;
    i64::try_from(id).unwrap_or(1)
}

/// The text etcd answers a lease grant whose id is taken with.
const LEASE_EXISTS: &str = "lease already exists";

impl EtcdHealth {
    /// A v3 maintenance client of the step's etcd at `endpoint`.
    async fn maintenance(
        &self,
        endpoint: &str,
    ) -> Result<etcd_client::MaintenanceClient, ApiError> {
        let bounds = crate::grpc::Bounds {
            connect: ATTEMPT_TIMEOUT,
            request: DOWNGRADE_CALL_TIMEOUT,
        };
        let client = crate::grpc::connect(&[endpoint.to_string()], None, bounds)
            .await
            .map_err(|err| ApiError::Connect {
                endpoint: endpoint.to_string(),
                detail: error_chain(&err),
            })?;
        Ok(client.maintenance_client())
    }

    /// A prober with its own HTTP client (no proxy: steps are on loopback)
    /// and this run's health key prefix.
    pub fn new() -> Result<Self, ApiError> {
        let http = crate::tls::client_builder()
            .no_proxy()
            .connect_timeout(ATTEMPT_TIMEOUT)
            .timeout(ATTEMPT_TIMEOUT)
            .build()
            .map_err(|source| ApiError::Client { source })?;
        let mark = fresh_mark();
        let lease_base = mark
            .get(..16)
            .and_then(|hex| u64::from_str_radix(hex, 16).ok())
            .unwrap_or_default();
        Ok(EtcdHealth {
            http,
            ours: RefCell::new(Ours::for_run(&mark)),
            attempts: Cell::new(0),
            lease_base,
        })
    }

    /// The key of the next attempt.
    fn next_key(&self) -> String {
        let attempt = self.attempts.get() + 1;
        self.attempts.set(attempt);
        self.ours.borrow().key(attempt)
    }

    /// v2: a create-only PUT with a TTL, then a DELETE.
    async fn write_v2(&self, endpoint: &str, value: &str) -> Result<(), ApiError> {
        let key = self.next_key();
        let url = keyspace::v2_url(endpoint, key.as_bytes());
        let put = format!("{url}?ttl={HEALTH_KEY_TTL_SECS}&prevExist=false");
        let response = self
            .http
            .put(&put)
            .header("content-type", "application/x-www-form-urlencoded")
            .body(keyspace::form_encode(value.as_bytes()))
            .send()
            .await
            .map_err(|err| ApiError::V2Send {
                method: "PUT",
                url: put.clone(),
                detail: error_chain(&err),
            })?;
        let status = response.status();
        if !status.is_success() {
            let body = response.text().await.unwrap_or_default();
            return Err(ApiError::V2Status {
                method: "PUT",
                url: put,
                status,
                body: body.trim().to_string(),
            });
        }
        let response = self
            .http
            .delete(&url)
            .send()
            .await
            .map_err(|err| ApiError::V2Send {
                method: "DELETE",
                url: url.clone(),
                detail: error_chain(&err),
            })?;
        let status = response.status();
        // 404: it expired already, which only a very slow step can see.
        if status.is_success() || status.as_u16() == 404 {
            return Ok(());
        }
        let body = response.text().await.unwrap_or_default();
        Err(ApiError::V2Status {
            method: "DELETE",
            url,
            status,
            body: body.trim().to_string(),
        })
    }

    /// After a write: the server must be the release we started, and the
    /// cluster version the data records must have reached its minor. A
    /// single member raises it right after it has elected itself, a moment
    /// after it takes writes; recording the step before that would leave
    /// data whose cluster version says the release before, and the next
    /// run would (rightly) refuse version.txt as not matching the data.
    async fn check_versions(&self, endpoint: &str, expected: Expected) -> Result<(), HealthError> {
        let release = expected.release.to_string();
        let url = format!("{endpoint}/version");
        let text = self
            .versions_text(&url)
            .await
            .map_err(|err| HealthError::NotYet(err.to_string()))?;
        match versions_state(&text, expected) {
            VersionsState::Reached(None) => Ok(()),
            VersionsState::Reached(Some(storage)) => {
                crate::log::info(
                    "storage version proven",
                    &[
                        ("release", release.as_str().into()),
                        ("storage", storage.into()),
                    ],
                );
                Ok(())
            }
            VersionsState::NotYet(why) => Err(HealthError::NotYet(format!("GET {url}: {why}"))),
            VersionsState::OtherServer(server) => Err(HealthError::Refused {
                reason: format!("the etcd on {endpoint} reports release {server}, not {release}, which etcd-migrate started"),
                remedy: "check the bundled binaries (etcd-<version> must be that release) and what else runs on this host, then rerun".to_string(),
            }),
        }
    }

    /// The text `url` (a `/version`) answers.
    async fn versions_text(&self, url: &str) -> Result<String, ApiError> {
        let failed = |err: reqwest::Error| ApiError::Versions {
            url: url.to_string(),
            detail: error_chain(&err),
        };
        self.http
            .get(url)
            .send()
            .await
            .map_err(failed)?
            .text()
            .await
            .map_err(failed)
    }

    /// v3: the alarms, then a lease, a create-only put under it, and the
    /// lease revoked (which deletes the key); `/version` is read beside the
    /// revoke, once the put has committed (see [`EtcdHealth::check_versions`]).
    async fn write_v3(&self, endpoint: &str, expected: Expected) -> Result<(), HealthError> {
        let value = expected.release.to_string();
        let bounds = crate::grpc::Bounds {
            connect: ATTEMPT_TIMEOUT,
            request: ATTEMPT_TIMEOUT,
        };
        let not_yet = |what: &str, err: &etcd_client::Error| {
            let text = format!("v3 {what} {endpoint}: {}", error_chain(err));
            auth_refusal(&text).unwrap_or(HealthError::NotYet(text))
        };
        let mut client = crate::grpc::connect(&[endpoint.to_string()], None, bounds)
            .await
            .map_err(|err| not_yet("connect", &err))?;
        let alarms = client
            .alarm(AlarmAction::Get, AlarmType::None, None)
            .await
            .map_err(|err| not_yet("alarm list", &err))?;
        let raised: Vec<AlarmType> = alarms.alarms().iter().map(|a| a.alarm()).collect();
        if let Some(refusal) = refusal_for(&raised) {
            return Err(refusal);
        }
        let key = self.next_key();
        // The lease's id is ours to choose, and known as ours before etcd
        // hears of it: a grant whose answer is lost (an attempt's deadline
        // passed while etcd was slow) and that etcd applies afterwards is
        // still ours, and no read takes it for the user's.
        let lease = lease_id(self.lease_base, self.attempts.get());
        self.ours.borrow_mut().leases.insert(lease);
        let options = etcd_client::LeaseGrantOptions::new().with_id(lease);
        if let Err(err) = client.lease_grant(HEALTH_KEY_TTL_SECS, Some(options)).await {
            if error_chain(&err).contains(LEASE_EXISTS) {
                // Someone else's: not ours after all (the next attempt
                // asks for the next id).
                self.ours.borrow_mut().leases.remove(&lease);
            }
            return Err(not_yet("lease grant", &err));
        }
        let put = Txn::new()
            .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(
                key.clone(),
                value.as_str(),
                Some(PutOptions::new().with_lease(lease)),
            )]);
        let written = client.txn(put).await.map_err(|err| not_yet("put", &err))?;
        let put_at = header_revision(written.header());
        if written.succeeded() {
            // A transaction that wrote is one revision, and its answer
            // names it: ours.
            self.ours.borrow_mut().revisions.extend(put_at);
        }
        // The revoke and /version at once: each is a round trip of its
        // own, and neither needs the other's answer.
        let (revoked, versions) = tokio::join!(
            client.lease_revoke(lease),
            self.check_versions(endpoint, expected)
        );
        if !written.succeeded() {
            return Err(HealthError::NotYet(format!(
                "v3 put {endpoint}: {key} exists already; the next attempt uses another key"
            )));
        }
        let revoked = revoked.map_err(|err| not_yet("lease revoke", &err))?;
        if let (Some(put_at), Some(revoked_at)) = (put_at, header_revision(revoked.header())) {
            if still_there(&mut client, &key, revoked_at - 1, put_at).await {
                // The key lived until just before the revoke's answer and
                // is gone in it: the revoke deleted it at that revision,
                // and a revoke of our lease deletes our key alone.
                self.ours.borrow_mut().revisions.insert(revoked_at);
            }
        }
        versions.map_err(only_versions_left)
    }
}

/// A `/version` not there yet, after the health key was written and
/// removed: only `/version` is asked again.
fn only_versions_left(err: HealthError) -> HealthError {
    match err {
        HealthError::NotYet(why) => HealthError::Written(why),
        other => other,
    }
}

/// The store revision an answer's header names, if it has one.
fn header_revision(header: Option<&etcd_client::ResponseHeader>) -> Option<i64> {
    header
        .map(|h| h.revision())
        .filter(|revision| *revision > 0)
}

/// True when `key` still held the value put at `put_at` at `revision`
/// (a local read at that revision; any failure says no, which only costs
/// a later check a read of the history).
async fn still_there(
    client: &mut etcd_client::Client,
    key: &str,
    revision: i64,
    put_at: i64,
) -> bool {
    let options = etcd_client::GetOptions::new()
        .with_revision(revision)
        .with_serializable();
    match client.get(key, Some(options)).await {
        Ok(answer) => answer.kvs().iter().any(|kv| kv.mod_revision() == put_at),
        Err(_) => false,
    }
}

/// A step's error keeps an API error as text, with its causes.
impl From<ApiError> for String {
    fn from(err: ApiError) -> String {
        crate::log::error_chain(&err)
    }
}

impl EtcdApi for EtcdHealth {
    type Error = ApiError;

    fn fingerprint(
        &self,
        endpoint: &str,
        served: VersionPair,
        hidden: &[String],
        known: &KnownLeases,
    ) -> impl Future<Output = Result<Fingerprint, ApiError>> {
        let endpoint = endpoint.to_string();
        let ours = self.ours.borrow().clone();
        let hidden = hidden.to_vec();
        let known = known.clone();
        async move {
            keyspace::read_fingerprint(&endpoint, served, &ours, &hidden, &known)
                .await
                .map_err(ApiError::from)
        }
    }

    fn fingerprint_by_hash(
        &self,
        endpoint: &str,
        hidden: &[String],
    ) -> impl Future<Output = Result<Option<Fingerprint>, ApiError>> {
        let endpoint = endpoint.to_string();
        let ours = self.ours.borrow().clone();
        let hidden = hidden.to_vec();
        async move {
            keyspace::read_fingerprint_by_hash(&endpoint, &ours, &hidden)
                .await
                .map_err(ApiError::from)
        }
    }

    fn fingerprint_since(
        &self,
        endpoint: &str,
        served: VersionPair,
        hidden: &[String],
        known: &KnownLeases,
        before: Option<&Fingerprint>,
    ) -> impl Future<Output = Result<Fingerprint, ApiError>> {
        let endpoint = endpoint.to_string();
        let ours = self.ours.borrow().clone();
        let hidden = hidden.to_vec();
        let known = known.clone();
        let before = before.cloned();
        async move {
            keyspace::read_fingerprint_since(
                &endpoint,
                served,
                &ours,
                &hidden,
                &known,
                before.as_ref(),
            )
            .await
            .map_err(ApiError::from)
        }
    }

    fn write(
        &self,
        endpoint: &str,
        storage: Storage,
        expected: Expected,
    ) -> impl Future<Output = Result<(), HealthError>> {
        let endpoint = endpoint.to_string();
        async move {
            match storage {
                Storage::Etcd2 => {
                    let value = expected.release.to_string();
                    self.write_v2(&endpoint, &value).await.map_err(|err| {
                        let text = err.to_string();
                        auth_refusal(&text).unwrap_or(HealthError::NotYet(text))
                    })?;
                    self.check_versions(&endpoint, expected)
                        .await
                        .map_err(only_versions_left)
                }
                Storage::Etcd3 => self.write_v3(&endpoint, expected).await,
            }
        }
    }

    fn versions(
        &self,
        endpoint: &str,
        expected: Expected,
    ) -> impl Future<Output = Result<(), HealthError>> {
        let endpoint = endpoint.to_string();
        async move { self.check_versions(&endpoint, expected).await }
    }

    async fn enable_downgrade(&self, endpoint: &str, target: Minor) -> Result<(), ApiError> {
        let mut client = self.maintenance(endpoint).await?;
        downgrade::enable(&mut client, target)
            .await
            .map_err(|err| ApiError::Downgrade {
                op: err.op,
                endpoint: endpoint.to_string(),
                source: err.source,
            })
    }

    async fn downgraded(&self, endpoint: &str, target: Minor) -> Result<bool, ApiError> {
        let url = format!("{endpoint}/version");
        let text = self.versions_text(&url).await?;
        let json: serde_json::Value =
            serde_json::from_str(&text).map_err(|err| ApiError::Versions {
                url: url.clone(),
                detail: format!("not JSON ({err}): {:.80}", text.trim()),
            })?;
        let at = |field: &str| json[field].as_str().and_then(minor_of);
        if json.get("storage").is_some() {
            // 3.6+: the leader lowers the cluster version at once, and the
            // storage version follows once the state is snapshotted.
            return Ok(at("etcdcluster") == Some(target) && at("storage") == Some(target));
        }
        // 3.5 keeps its cluster version while it runs (its members decide
        // it); the downgrade is the job it records, which a 3.4.31+
        // member then starts on. Its validate says whether one is on.
        let mut client = self.maintenance(endpoint).await?;
        downgrade::is_on(&mut client, target)
            .await
            .map_err(|err| ApiError::Downgrade {
                op: err.op,
                endpoint: endpoint.to_string(),
                source: err.source,
            })
    }

    async fn compact_history(&self, endpoint: &str) -> Result<i64, ApiError> {
        let bounds = crate::grpc::Bounds {
            connect: ATTEMPT_TIMEOUT,
            request: COMPACT_TIMEOUT,
        };
        let mut client = crate::grpc::connect(&[endpoint.to_string()], None, bounds)
            .await
            .map_err(|err| ApiError::Connect {
                endpoint: endpoint.to_string(),
                detail: error_chain(&err),
            })?;
        let key_err = |op| {
            move |source| ApiError::V3Key {
                op,
                key: "the whole keyspace".to_string(),
                source,
            }
        };
        let revision = client
            .get(
                "",
                Some(
                    etcd_client::GetOptions::new()
                        .with_all_keys()
                        .with_count_only(),
                ),
            )
            .await
            .map_err(key_err("read the revision of"))?
            .header()
            .map_or(0, |h| h.revision());
        client
            .compact(
                revision,
                Some(etcd_client::CompactionOptions::new().with_physical()),
            )
            .await
            .map_err(key_err("compact the history of"))?;
        Ok(revision)
    }

    async fn finish_downgrade(&self, endpoint: &str) -> Result<(), ApiError> {
        let mut client = self.maintenance(endpoint).await?;
        downgrade::cancel(&mut client)
            .await
            .map_err(|err| ApiError::Downgrade {
                op: err.op,
                endpoint: endpoint.to_string(),
                source: err.source,
            })
    }

    fn read_all(
        &self,
        endpoint: &str,
        served: VersionPair,
        hidden: &[String],
        known: &KnownLeases,
    ) -> impl Future<Output = Result<Read, ApiError>> {
        let endpoint = endpoint.to_string();
        let ours = self.ours.borrow().clone();
        let hidden = hidden.to_vec();
        let known = known.clone();
        async move {
            keyspace::read_all(&endpoint, served, &ours, &hidden, &known)
                .await
                .map_err(ApiError::from)
        }
    }

    fn read_v2(
        &self,
        endpoint: &str,
        hidden: &[String],
    ) -> impl Future<Output = Result<Option<Vec<Entry>>, ApiError>> {
        let ours = self.ours.borrow().clone();
        async move {
            keyspace::read_v2(endpoint, &ours, hidden)
                .await
                .map_err(ApiError::from)
        }
    }

    async fn write_all_v2(&self, endpoint: &str, entries: &[Entry]) -> Result<(), ApiError> {
        keyspace::write_all_v2(endpoint, entries)
            .await
            .map_err(ApiError::from)
    }

    async fn delete_v2_tree(&self, endpoint: &str, hidden: &[String]) -> Result<usize, ApiError> {
        keyspace::delete_v2_tree(endpoint, hidden)
            .await
            .map_err(ApiError::from)
    }

    fn apply_leases(
        &self,
        endpoint: &str,
        plan: &LeasePlan,
        put_back: &[Entry],
    ) -> impl Future<Output = Result<KnownLeases, ApiError>> {
        let ours = self.ours.borrow().clone();
        async move { apply_leases(endpoint, plan, &ours, put_back).await }
    }

    fn ours(&self) -> Ours {
        self.ours.borrow().clone()
    }
}

/// Grants one lease per group and re-puts its keys under it; puts
/// `put_back` as given (key, value, lease id: the hidden keys `etcdctl
/// migrate` skipped, the v3 keys it may have overwritten); deletes the
/// expired keys that it copied without a TTL. Returns the leases granted,
/// each TTL counted from just before its grant.
///
/// The writes go out [`keyspace::WRITES_IN_FLIGHT`] at a time, in no set order:
/// every key is written once (the v2 store names each key once, a key has
/// one TTL or none, and `check_no_clash` kept the v3 keys apart from the
/// v2 ones), into the converted copy, which is read back whole before it
/// is used. The first failed write ends the step.
async fn apply_leases(
    endpoint: &str,
    plan: &LeasePlan,
    ours: &Ours,
    put_back: &[Entry],
) -> Result<KnownLeases, ApiError> {
    use futures_util::{StreamExt, TryStreamExt};
    let client = keyspace::v3_client(endpoint)
        .await
        .map_err(|detail| ApiError::Connect {
            endpoint: endpoint.to_string(),
            detail: detail.to_string(),
        })?;
    // A health key of this run whose removal failed is still in the v2
    // store until its TTL runs out, and `etcdctl migrate` copied it
    // without one: remove the copy.
    client
        .clone()
        .delete(
            ours.key_prefix().as_bytes(),
            Some(etcd_client::DeleteOptions::new().with_prefix()),
        )
        .await
        .map_err(|source| ApiError::V3Key {
            op: "delete",
            key: format!("{}*", ours.key_prefix()),
            source,
        })?;
    keyspace::each_in_flight(put_back, keyspace::WRITES_IN_FLIGHT, |entry| {
        let mut client = client.clone();
        async move {
            let options = (entry.lease != 0).then(|| PutOptions::new().with_lease(entry.lease));
            client
                .put(entry.key.clone(), entry.value.clone(), options)
                .await
                .map(drop)
                .map_err(|source| ApiError::V3Key {
                    op: "put back",
                    key: String::from_utf8_lossy(&entry.key).into_owned(),
                    source,
                })
        }
    })
    .await?;
    keyspace::each_in_flight(&plan.expired, keyspace::WRITES_IN_FLIGHT, |key| {
        let mut client = client.clone();
        async move {
            client
                .delete(key.as_bytes(), None)
                .await
                .map(drop)
                .map_err(|source| ApiError::V3Key {
                    op: "delete expired",
                    key: key.clone(),
                    source,
                })
        }
    })
    .await?;
    // Groups are let in by their keys, at most WRITES_IN_FLIGHT keys'
    // worth at once (a group larger than that counts as that many): 64
    // groups of one key each (a TTL each, as events written over an hour
    // have), or one flat lease over many keys with 64 puts in flight. A
    // group's puts follow its grant at once, never behind a queue longer
    // than that, so a short TTL does not run out between the two.
    let room = tokio::sync::Semaphore::new(keyspace::WRITES_IN_FLIGHT);
    let grants: Vec<(i64, i64, Instant)> = futures_util::stream::iter(&plan.groups)
        .map(|(ttl, entries)| {
            let (client, room) = (client.clone(), &room);
            async move {
                let weight = entries.len().clamp(1, keyspace::WRITES_IN_FLIGHT);
                let _room = room
                    .acquire_many(u32::try_from(weight).unwrap_or(1))
                    .await
                    .expect("the semaphore is never closed");
                let asked = Instant::now();
                let lease = client
                    .clone()
                    .lease_grant(*ttl, None)
                    .await
                    .map_err(|source| ApiError::Grant { ttl: *ttl, source })?;
                let (id, granted_ttl) = (lease.id(), lease.ttl());
                keyspace::each_in_flight(entries, weight, |entry| {
                    let mut client = client.clone();
                    async move { put_under_lease(&mut client, entry, id).await }
                })
                .await?;
                Ok::<_, ApiError>((id, granted_ttl, asked))
            }
        })
        .buffer_unordered(keyspace::WRITES_IN_FLIGHT)
        .try_collect()
        .await?;
    let mut granted = KnownLeases::new();
    for (id, ttl, asked) in grants {
        granted.insert(id, ttl, asked);
    }
    Ok(granted)
}

/// Re-puts `entry` under `lease`, only if `etcdctl migrate` copied it: a
/// key the v2 store purged after we read it must not come back, even
/// briefly. A hidden key it never copies: the read just before is its
/// proof.
async fn put_under_lease(
    client: &mut etcd_client::Client,
    entry: &Entry,
    lease: i64,
) -> Result<(), ApiError> {
    let options = etcd_client::PutOptions::new().with_lease(lease);
    let guard = if keyspace::is_hidden_v2(&entry.key) {
        Vec::new()
    } else {
        vec![etcd_client::Compare::version(
            entry.key.clone(),
            etcd_client::CompareOp::Greater,
            0,
        )]
    };
    let txn = etcd_client::Txn::new()
        .when(guard)
        .and_then([etcd_client::TxnOp::put(
            entry.key.clone(),
            entry.value.clone(),
            Some(options),
        )]);
    client
        .txn(txn)
        .await
        .map_err(|source| ApiError::LeasedPut {
            key: String::from_utf8_lossy(&entry.key).into_owned(),
            lease,
            source,
        })?;
    Ok(())
}

/// What a step's `/version` says about the release and cluster version.
#[derive(Debug, PartialEq, Eq)]
enum VersionsState {
    /// The server is `release` and the cluster version is its minor (and,
    /// on 3.6+, the storage version too: this one is then `Some`).
    Reached(Option<String>),
    /// Not yet (the cluster version is not decided or still lower).
    NotYet(String),
    /// The server reports another release.
    OtherServer(String),
}

/// The minor of a version as `/version` spells it (`3.6`, `3.6.0`).
fn minor_of(text: &str) -> Option<Minor> {
    let mut parts = text.split('.');
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some(Minor::new(major, minor))
}

/// Reads `/version` (`{"etcdserver":"3.4.23","etcdcluster":"3.4.0"}` on
/// 2.2 … 3.5; 3.6+ adds `"storage":"3.6.0"`, the version of the data's
/// storage schema, which follows the cluster version up once every member
/// runs the new minor) against what is expected of the release we
/// started: its cluster version and, where reported, its storage version
/// must be at its minor (or, while the data is walked down by etcd's
/// downgrade, at any minor from the downgrade's target up to it) before
/// the step goes on: a 3.6 whose storage still says 3.5 has not finished
/// migrating the data's schema.
fn versions_state(text: &str, expected: Expected) -> VersionsState {
    let json: serde_json::Value = match serde_json::from_str(text) {
        Ok(json) => json,
        Err(_) => return VersionsState::NotYet(format!("not JSON: {:.80}", text.trim())),
    };
    let server = json["etcdserver"].as_str().unwrap_or_default();
    let cluster = json["etcdcluster"].as_str().unwrap_or_default();
    if server != expected.release.to_string() {
        return VersionsState::OtherServer(server.to_string());
    }
    let (lowest, own) = (expected.lowest, expected.release.minor_line());
    let fits = |v: &str| minor_of(v).is_some_and(|m| m >= lowest && m <= own);
    let wanted = if lowest == own {
        own.to_string()
    } else {
        format!("{lowest} … {own}")
    };
    if !fits(cluster) {
        return VersionsState::NotYet(format!(
            "the cluster version is {cluster:?}, not yet {wanted}"
        ));
    }
    match json["storage"].as_str() {
        None => VersionsState::Reached(None),
        Some(storage) if fits(storage) => VersionsState::Reached(Some(storage.to_string())),
        Some(storage) => VersionsState::NotYet(format!(
            "the storage version is {storage:?}, not yet {wanted}"
        )),
    }
}

/// What etcd answers an unauthenticated write on data with auth enabled:
/// v3 "user name is empty" (or "invalid auth token", "permission
/// denied"), v2 HTTP 401 with error code 110.
const AUTH_ANSWERS: [&str; 5] = [
    "user name is empty",
    "invalid auth token",
    "permission denied",
    "requires user authentication",
    "HTTP 401",
];

/// The refusal for a write that failed because the data has auth enabled:
/// no retry can succeed without credentials.
fn auth_refusal(text: &str) -> Option<HealthError> {
    AUTH_ANSWERS.iter().any(|answer| text.contains(answer)).then(|| HealthError::Refused {
        reason: format!("the data has authentication enabled, and etcd-migrate writes without credentials ({text})"),
        remedy: "disable auth for the migration: serve the data with its recorded release and run `etcdctl --user root auth disable` (v2: `etcdctl auth disable`), rerun etcd-migrate, then `etcdctl --user root auth enable` on the migrated data".to_string(),
    })
}

/// The refusal for alarms raised in the data, if any. Both kinds make etcd
/// refuse every write until an operator acts, so no retry can help.
fn refusal_for(raised: &[AlarmType]) -> Option<HealthError> {
    if raised.contains(&AlarmType::Nospace) {
        return Some(HealthError::Refused {
            reason: "the data holds a NOSPACE alarm: its backend reached the space quota (--quota-backend-bytes, 2 GiB by default) and etcd accepts no write until the alarm is cleared".to_string(),
            remedy: "to clear it, serve the data with its recorded release and run: `etcdctl endpoint status -w json` (note the revision), `etcdctl compact <revision>`, `etcdctl defrag`, `etcdctl alarm disarm`; then rerun etcd-migrate (or, if the data is meant to be this large, raise --quota-backend-bytes through ETCD_CREDS)".to_string(),
        });
    }
    if raised.contains(&AlarmType::Corrupt) {
        return Some(HealthError::Refused {
            reason: "the data holds a CORRUPT alarm: etcd found this member's data inconsistent".to_string(),
            remedy: "do not migrate it: restore this member from a backup or a snapshot (etcdctl snapshot restore), then rerun etcd-migrate".to_string(),
        });
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn health_lease_ids_are_positive_and_one_per_attempt() {
        for base in [0, 1, u64::MAX, 0x3fff_ffff_ffff_ffff, 0x8000_0000_0000_0000] {
            let ids: Vec<i64> = (1..=4).map(|attempt| lease_id(base, attempt)).collect();
            assert!(ids.iter().all(|id| *id > 0), "{base:#x}: {ids:?}");
            let distinct: std::collections::BTreeSet<_> = ids.iter().collect();
            assert_eq!(distinct.len(), ids.len(), "{base:#x}: {ids:?}");
        }
    }

    #[test]
    fn the_step_waits_for_the_cluster_version_to_reach_its_minor() {
        let at = |server: &str, cluster: &str| {
            versions_state(
                &format!(r#"{{"etcdserver":"{server}","etcdcluster":"{cluster}"}}"#),
                Expected::release(Version::new(3, 4, 23)),
            )
        };
        assert_eq!(at("3.4.23", "3.4.0"), VersionsState::Reached(None));
        assert!(matches!(at("3.4.23", "3.3.0"), VersionsState::NotYet(_)));
        assert!(matches!(
            at("3.4.23", "not_decided"),
            VersionsState::NotYet(_)
        ));
        assert_eq!(
            at("3.5.16", "3.5.0"),
            VersionsState::OtherServer("3.5.16".to_string())
        );
        assert!(matches!(
            versions_state(
                "404 page not found",
                Expected::release(Version::new(3, 4, 23))
            ),
            VersionsState::NotYet(_)
        ));
    }

    #[test]
    fn a_step_to_3_6_or_later_waits_for_its_storage_version_too() {
        let at = |cluster: &str, storage: &str| {
            versions_state(
                &format!(
                    r#"{{"etcdserver":"3.6.14","etcdcluster":"{cluster}","storage":"{storage}"}}"#
                ),
                Expected::release(Version::new(3, 6, 14)),
            )
        };
        assert_eq!(
            at("3.6.0", "3.6.0"),
            VersionsState::Reached(Some("3.6.0".to_string()))
        );
        let VersionsState::NotYet(why) = at("3.6.0", "3.5.0") else {
            panic!("a storage version of 3.5 is not 3.6");
        };
        assert!(why.contains("storage version is \"3.5.0\""), "{why}");
        assert!(matches!(at("3.5.0", "3.5.0"), VersionsState::NotYet(_)));
    }

    #[test]
    fn an_unauthenticated_write_on_auth_enabled_data_refuses_with_the_remedy() {
        for answer in [
            "v3 put http://127.0.0.1:1: status: InvalidArgument, message: \"etcdserver: user name is empty\"",
            "v2 PUT http://127.0.0.1:1/v2/keys/x: HTTP 401 Unauthorized: {\"errorCode\":110,\"message\":\"The request requires user authentication\"}",
        ] {
            match auth_refusal(answer) {
                Some(HealthError::Refused { reason, remedy }) => {
                    assert!(reason.contains("authentication enabled"), "{reason}");
                    assert!(remedy.contains("auth disable"), "{remedy}");
                }
                other => panic!("{answer}: {other:?}"),
            }
        }
        assert_eq!(auth_refusal("v3 connect: connection refused"), None);
    }

    #[test]
    fn raised_alarms_refuse_with_a_remedy_and_none_lets_the_write_go() {
        assert_eq!(refusal_for(&[]), None);
        assert_eq!(refusal_for(&[AlarmType::None]), None);
        match refusal_for(&[AlarmType::Nospace]) {
            Some(HealthError::Refused { reason, remedy }) => {
                assert!(reason.contains("NOSPACE"), "{reason}");
                for word in ["compact", "defrag", "alarm disarm"] {
                    assert!(remedy.contains(word), "{remedy}");
                }
            }
            other => panic!("NOSPACE must refuse: {other:?}"),
        }
        assert!(matches!(
            refusal_for(&[AlarmType::Corrupt]),
            Some(HealthError::Refused { .. })
        ));
    }
}
