//! This module owns the v3 API calls of a keyspace read: whole-keyspace
//! reads in windows that cost what they return (see [`super::ranges`]),
//! pages bounded by bytes, leases and their TTLs, the server's own hash of
//! the keyspace at a revision (Maintenance.HashKV, 3.3+) and the changes
//! made since a revision.

use std::collections::BTreeMap;
use std::time::Duration;

use futures_util::StreamExt;

use super::ranges::Walk;
use super::{Entry, KeyspaceError, KnownLeases, Ours, REQUEST_TIMEOUT};
use crate::log;

/// Largest v3 response we accept (etcd's own request limit is 1.5 MiB a
/// key; a page of them fits).
const V3_MAX_MESSAGE: usize = 512 * 1024 * 1024;

/// The gRPC status code UNIMPLEMENTED: what 3.0 … 3.2 answer to a lease
/// list (LeaseLeases came in 3.3) and to HashKV (3.3), and 3.0 to a
/// lease's time-to-live (LeaseTimeToLive came in 3.1).
const GRPC_UNIMPLEMENTED: i32 = 12;

/// How a whole-keyspace read pages: by bytes (what our memory holds at
/// once) and by count.
#[derive(Debug, Clone, Copy)]
pub struct ReadLimits {
    /// Bytes (keys and values) a page aims at: K8s objects reach 1.5 MiB,
    /// so with values that large a page holds a few keys, and with small
    /// ones up to `max_page`.
    pub page_bytes: usize,
    /// Keys a page holds at most.
    pub max_page: usize,
    /// Keys of the first page, before any size is known.
    pub first_page: usize,
}

impl Default for ReadLimits {
    fn default() -> Self {
        ReadLimits {
            page_bytes: 4 * 1024 * 1024,
            max_page: 1000,
            first_page: 8,
        }
    }
}

/// One range a read asked for: `[start, end)`, `end: None` to the end of
/// the keyspace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestedRange {
    /// The first key of the range.
    pub start: Vec<u8>,
    /// The key after the range, if bounded.
    pub end: Option<Vec<u8>>,
}

/// The etcd range end for "to the end of the keyspace".
const TO_THE_END: &[u8] = b"\0";

/// A v3 client with generous limits for whole-keyspace reads.
pub async fn v3_client(endpoint: &str) -> Result<etcd_client::Client, KeyspaceError> {
    let bounds = crate::grpc::Bounds {
        connect: Duration::from_secs(5),
        request: REQUEST_TIMEOUT,
    };
    crate::grpc::connect(&[endpoint.to_string()], None, bounds)
        .await
        .map_err(|source| KeyspaceError::Connect {
            endpoint: endpoint.to_string(),
            source,
        })
}

fn unimplemented(err: &etcd_client::Error) -> bool {
    matches!(err, etcd_client::Error::GRpcStatus(status)
        if i32::from(status.code()) == GRPC_UNIMPLEMENTED)
}

/// Reads every v3 key at one revision, window by window (see
/// [`super::ranges`]), handing each to `sink` with the remaining TTL of
/// its lease (a key whose lease has just run out, not yet deleted by etcd,
/// comes with 0), so a fingerprint never holds the keyspace in memory.
/// This run's health keys are left out. Where the release has no
/// LeaseTimeToLive (3.0), the TTL comes from `known`; a leased key whose
/// lease is not known there either comes without one (`ttl: None`,
/// `lease` set): it may expire at any moment, for all this read can tell.
/// Returns the seconds left on each lease a key is bound to, where they
/// are known, and the revision read. `trace` gets every range asked for.
pub(crate) async fn read_v3_with(
    client: &etcd_client::Client,
    endpoint: &str,
    ours: &Ours,
    known: &KnownLeases,
    limits: ReadLimits,
    sink: &mut dyn FnMut(Entry),
    mut trace: Option<&mut Vec<RequestedRange>>,
) -> Result<(BTreeMap<i64, i64>, i64), KeyspaceError> {
    let mut kv = client.kv_client().max_decoding_message_size(V3_MAX_MESSAGE);
    let mut ttls = LeaseTtls::new(client.lease_client(), endpoint, known);
    let mut walk = Walk::new();
    let mut page = limits.first_page.max(1);
    let mut progress = log::Progress::new("keyspace read", log::ProgressUnit::Keys, 0);
    let mut revision = 0;
    while let Some((start, end)) = walk.range() {
        let (start, end) = (start.to_vec(), end.map(<[u8]>::to_vec));
        if let Some(trace) = trace.as_deref_mut() {
            trace.push(RequestedRange {
                start: start.clone(),
                end: end.clone(),
            });
        }
        let response = get_page(&mut kv, endpoint, start, end, page, revision).await?;
        if revision == 0 {
            // Every window reads the same revision: a consistent snapshot.
            // The first range is the whole keyspace: its count is the total.
            revision = response.header().map(|h| h.revision()).unwrap_or(0);
            progress.set_total(u64::try_from(response.count()).unwrap_or(0));
        }
        let bytes = sink_page(&response, ours, &mut ttls, sink).await?;
        let returned = response.kvs().len();
        progress.add(returned as u64, bytes as u64);
        let keys: Vec<&[u8]> = response.kvs().iter().map(|kv| kv.key()).collect();
        let count = usize::try_from(response.count()).unwrap_or(0);
        walk.answer(&keys, count, response.more(), page);
        if let Some(average) = bytes.checked_div(returned) {
            // The next page holds about `page_bytes`, as this one's keys
            // and values averaged.
            page = (limits.page_bytes / average.max(1)).clamp(1, limits.max_page.max(1));
        }
    }
    Ok((ttls.known_ttls(), revision))
}

/// One range request: at most `page` keys of [`start`, `end`) (`end`
/// `None`: to the end of the keyspace) at `revision` (0: the newest).
async fn get_page(
    kv: &mut etcd_client::KvClient,
    endpoint: &str,
    start: Vec<u8>,
    end: Option<Vec<u8>>,
    page: usize,
    revision: i64,
) -> Result<etcd_client::GetResponse, KeyspaceError> {
    let options = etcd_client::GetOptions::new()
        .with_range(end.unwrap_or_else(|| TO_THE_END.to_vec()))
        .with_limit(page as i64)
        .with_revision(revision);
    kv.get(start.clone(), Some(options))
        .await
        .map_err(|source| KeyspaceError::Range {
            endpoint: endpoint.to_string(),
            key: String::from_utf8_lossy(&start).into_owned(),
            source,
        })
}

/// Hands every key of `response` that is not ours to `sink`, with the
/// seconds left on its lease; returns the bytes of all keys and values
/// the page held (ours included).
async fn sink_page(
    response: &etcd_client::GetResponse,
    ours: &Ours,
    ttls: &mut LeaseTtls<'_>,
    sink: &mut dyn FnMut(Entry),
) -> Result<usize, KeyspaceError> {
    ttls.ask_ahead(
        response
            .kvs()
            .iter()
            .filter(|kv| kv.lease() != 0 && !ours.holds_key(kv.key()))
            .map(|kv| kv.lease()),
    )
    .await?;
    let mut bytes = 0;
    for kv in response.kvs() {
        bytes += kv.key().len() + kv.value().len();
        if ours.holds_key(kv.key()) {
            continue;
        }
        let ttl = match kv.lease() {
            0 => None,
            lease => ttls.ttl(lease).await?,
        };
        sink(Entry {
            key: kv.key().to_vec(),
            value: kv.value().to_vec(),
            ttl,
            lease: kv.lease(),
        });
    }
    Ok(bytes)
}

/// The seconds left on each lease a key read is bound to: asked of etcd
/// once per lease, else taken from what the log knew.
struct LeaseTtls<'a> {
    client: etcd_client::LeaseClient,
    endpoint: &'a str,
    known: &'a KnownLeases,
    ttl_of_lease: BTreeMap<i64, Option<i64>>,
    // Asked once: a release that lacks the call lacks it for every lease.
    has_time_to_live: bool,
}

impl<'a> LeaseTtls<'a> {
    fn new(client: etcd_client::LeaseClient, endpoint: &'a str, known: &'a KnownLeases) -> Self {
        Self {
            client,
            endpoint,
            known,
            ttl_of_lease: BTreeMap::new(),
            has_time_to_live: true,
        }
    }

    /// The seconds left on `lease`, where known.
    async fn ttl(&mut self, lease: i64) -> Result<Option<i64>, KeyspaceError> {
        if let Some(ttl) = self.ttl_of_lease.get(&lease) {
            return Ok(*ttl);
        }
        let asked = if self.has_time_to_live {
            lease_ttl(&mut self.client, self.endpoint, lease).await?
        } else {
            None
        };
        self.has_time_to_live &= asked.is_some();
        let ttl = asked.or_else(|| self.known.remaining(lease));
        self.ttl_of_lease.insert(lease, ttl);
        Ok(ttl)
    }

    /// Asks etcd for the seconds left on each lease of `leases` not asked
    /// yet, [`LEASE_TTLS_IN_FLIGHT`] at a time, before a page's keys are
    /// handed on: a page of keys each on a lease of its own (the TTL keys
    /// of a storage migration, one lease per TTL) then costs a few round
    /// trips, not one per key. A release without LeaseTimeToLive (3.0)
    /// leaves them to [`LeaseTtls::ttl`], which takes them from `known`.
    async fn ask_ahead(
        &mut self,
        leases: impl IntoIterator<Item = i64>,
    ) -> Result<(), KeyspaceError> {
        if !self.has_time_to_live {
            return Ok(());
        }
        let new: std::collections::BTreeSet<i64> = leases
            .into_iter()
            .filter(|lease| !self.ttl_of_lease.contains_key(lease))
            .collect();
        for (lease, asked) in
            lease_ttls(&self.client, self.endpoint, new.into_iter().collect()).await
        {
            match asked? {
                Some(ttl) => {
                    self.ttl_of_lease.insert(lease, Some(ttl));
                }
                None => self.has_time_to_live = false,
            }
        }
        Ok(())
    }

    /// Every lease whose seconds left are known, with them.
    fn known_ttls(self) -> BTreeMap<i64, i64> {
        self.ttl_of_lease
            .into_iter()
            .filter_map(|(lease, ttl)| Some((lease, ttl?)))
            .collect()
    }
}

/// Seconds left on a lease; 0 once it has run out (or is unknown to
/// etcd); `None` where the release has no LeaseTimeToLive (3.0).
async fn lease_ttl(
    client: &mut etcd_client::LeaseClient,
    endpoint: &str,
    lease: i64,
) -> Result<Option<i64>, KeyspaceError> {
    match client.time_to_live(lease, None).await {
        Ok(answer) => Ok(Some(answer.ttl().max(0))),
        Err(err) if unimplemented(&err) => Ok(None),
        Err(source) => Err(KeyspaceError::Lease {
            endpoint: endpoint.to_string(),
            lease,
            source,
        }),
    }
}

/// Every lease alive with its seconds left (this run's health leases left
/// out), or `None` where the API has no lease list (etcd 3.0 … 3.2 answer
/// "unimplemented"). The TTLs of the leases in `expected` (those the last
/// read found) are asked beside the list, not after it: a lease no longer
/// there answers TTL -1 without an error, and only the listed ones count.
pub(crate) async fn read_leases(
    client: &etcd_client::Client,
    endpoint: &str,
    known: &BTreeMap<i64, i64>,
    ours: &Ours,
    expected: &[i64],
) -> Result<Option<BTreeMap<i64, i64>>, KeyspaceError> {
    let early: Vec<i64> = expected
        .iter()
        .copied()
        .filter(|id| !known.contains_key(id) && !ours.holds_lease(*id))
        .collect();
    let mut lease_client = client.lease_client();
    let asker = lease_client.clone();
    let (listed, early) = tokio::join!(lease_client.leases(), lease_ttls(&asker, endpoint, early));
    let mut early: BTreeMap<i64, Result<Option<i64>, KeyspaceError>> = early.into_iter().collect();
    let listed = match listed {
        Ok(listed) => listed,
        Err(err) if unimplemented(&err) => return Ok(None),
        Err(source) => {
            return Err(KeyspaceError::LeaseList {
                endpoint: endpoint.to_string(),
                source,
            })
        }
    };
    let mut leases = BTreeMap::new();
    let mut asked = Vec::new();
    for lease in listed.leases() {
        if ours.holds_lease(lease.id()) {
            continue;
        }
        match (known.get(&lease.id()), early.remove(&lease.id())) {
            (Some(ttl), _) => {
                leases.insert(lease.id(), *ttl);
            }
            (None, Some(ttl)) => {
                leases.insert(lease.id(), ttl?.unwrap_or(0));
            }
            (None, None) => asked.push(lease.id()),
        }
    }
    for (id, ttl) in lease_ttls(&asker, endpoint, asked).await {
        leases.insert(id, ttl?.unwrap_or(0));
    }
    Ok(Some(leases))
}

/// The seconds left on each of `ids`. A release that lists leases (3.3+)
/// also tells their TTLs: one call per lease, several in flight on the one
/// connection (sequential, 1k keys on 10 leases took 3-5 ms of a step's
/// proof; a cluster holds hundreds).
async fn lease_ttls(
    client: &etcd_client::LeaseClient,
    endpoint: &str,
    ids: Vec<i64>,
) -> Vec<(i64, Result<Option<i64>, KeyspaceError>)> {
    futures_util::stream::iter(ids.into_iter().map(|id| {
        let mut lease_client = client.clone();
        async move { (id, lease_ttl(&mut lease_client, endpoint, id).await) }
    }))
    .buffered(LEASE_TTLS_IN_FLIGHT)
    .collect()
    .await
}

/// How many lease TTL calls [`read_leases`] and a keyspace read's pages
/// keep in flight.
const LEASE_TTLS_IN_FLIGHT: usize = 16;

/// etcd's own hash of its keyspace history up to a revision
/// (Maintenance.HashKV): a CRC-32C over every entry of the key bucket
/// (the key's revision, and the key, value, create/mod revisions, version
/// and lease of that revision) from the compaction up to `revision`. The
/// bucket's bytes are what an in-place upgrade carries, so the same data
/// gives the same hash on every release (measured: 3.3.25, 3.4.23, 3.5.1
/// and 3.5.16 on one data dir, with deletes, leases and a compaction).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvHash {
    /// The revision hashed up to.
    pub revision: i64,
    /// The hash.
    pub hash: u32,
    /// The compaction the history starts after.
    pub compact_revision: i64,
}

/// The server's hash at `revision` (0: the current one, whose number the
/// answer's header gives), or `None` where the release has no HashKV
/// (before 3.3).
pub(crate) async fn hash_kv(
    client: &etcd_client::Client,
    endpoint: &str,
    revision: i64,
) -> Result<Option<KvHash>, KeyspaceError> {
    Ok(hash_kv_and_head(client, endpoint, revision)
        .await?
        .map(|(hash, _)| hash))
}

/// The same, with the server's current revision when it answered.
pub(crate) async fn hash_kv_and_head(
    client: &etcd_client::Client,
    endpoint: &str,
    revision: i64,
) -> Result<Option<(KvHash, i64)>, KeyspaceError> {
    let mut maintenance = client.maintenance_client();
    match maintenance.hash_kv(revision).await {
        Ok(answer) => {
            let head = answer.header().map(|h| h.revision()).unwrap_or(0);
            let hash = KvHash {
                revision: if revision == 0 { head } else { revision },
                hash: answer.hash(),
                compact_revision: answer.compact_version(),
            };
            Ok(Some((hash, head)))
        }
        Err(err) if unimplemented(&err) => Ok(None),
        Err(source) => Err(KeyspaceError::Hash {
            endpoint: endpoint.to_string(),
            revision,
            source,
        }),
    }
}

/// One change made to a key after a revision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Change {
    /// The key.
    pub key: Vec<u8>,
    /// True for a delete, false for a put.
    pub deleted: bool,
    /// The lease the key was bound to before the change (0: none or new).
    pub lease_before: i64,
    /// The value before the change (empty for a new key).
    pub value_before: Vec<u8>,
    /// The revision of the change.
    pub revision: i64,
}

/// Every change made after `after` up to and including `upto`, from the
/// server's history (a watch from `after + 1`, with the previous values).
pub(crate) async fn changes_since(
    client: &etcd_client::Client,
    endpoint: &str,
    after: i64,
    upto: i64,
) -> Result<Vec<Change>, KeyspaceError> {
    let mut changes = Vec::new();
    if upto <= after {
        return Ok(changes);
    }
    let failed = |detail: String| KeyspaceError::Watch {
        endpoint: endpoint.to_string(),
        revision: after,
        detail,
    };
    let work = async {
        let options = etcd_client::WatchOptions::new()
            .with_all_keys()
            .with_start_revision(after + 1)
            .with_prev_key();
        let mut watch_client = client.watch_client();
        let mut stream = watch_client
            .watch(vec![0u8], Some(options))
            .await
            .map_err(|err| failed(err.to_string()))?;
        loop {
            let Some(message) = stream.message().await.map_err(|e| failed(e.to_string()))? else {
                return Err(failed("the watch ended early".to_string()));
            };
            if message.canceled() || message.compact_revision() > 0 {
                return Err(failed(format!(
                    "the watch was cancelled (compacted at {}): {}",
                    message.compact_revision(),
                    message.cancel_reason()
                )));
            }
            let mut reached = false;
            for event in message.events() {
                let Some(kv) = event.kv() else { continue };
                reached |= kv.mod_revision() >= upto;
                changes.push(Change {
                    key: kv.key().to_vec(),
                    deleted: event.event_type() == etcd_client::EventType::Delete,
                    lease_before: event.prev_kv().map(|p| p.lease()).unwrap_or(0),
                    value_before: event
                        .prev_kv()
                        .map(|p| p.value().to_vec())
                        .unwrap_or_default(),
                    revision: kv.mod_revision(),
                });
            }
            // The events of one revision come in one response.
            if reached {
                return Ok(());
            }
        }
    };
    tokio::time::timeout(REQUEST_TIMEOUT, work)
        .await
        .map_err(|_| failed(format!("no answer within {REQUEST_TIMEOUT:?}")))??;
    changes.retain(|change| change.revision <= upto);
    Ok(changes)
}

/// How many keys `[start, end)` held at `revision` (a count is one visit
/// of the index, no values read).
pub(crate) async fn count_range(
    client: &etcd_client::Client,
    endpoint: &str,
    start: &[u8],
    end: &[u8],
    revision: i64,
) -> Result<usize, KeyspaceError> {
    let options = etcd_client::GetOptions::new()
        .with_range(end)
        .with_count_only()
        .with_revision(revision);
    client
        .kv_client()
        .get(start, Some(options))
        .await
        .map(|r| usize::try_from(r.count()).unwrap_or(0))
        .map_err(|source| KeyspaceError::Range {
            endpoint: endpoint.to_string(),
            key: String::from_utf8_lossy(start).into_owned(),
            source,
        })
}

/// Whether any key live at `upto` other than this run's health keys was
/// written after `after`: a range at `upto` of the keys whose modification
/// revision is later, keys only, at most a few. A read, answered at once,
/// where a watch from a past revision waits for etcd's watcher sync (every
/// 100 ms).
pub(crate) async fn written_since(
    client: &etcd_client::Client,
    endpoint: &str,
    after: i64,
    upto: i64,
    ours: &Ours,
) -> Result<bool, KeyspaceError> {
    let options = etcd_client::GetOptions::new()
        .with_range(TO_THE_END)
        .with_keys_only()
        .with_revision(upto)
        .with_min_mod_revision(after + 1)
        .with_limit(64);
    let answer = client
        .kv_client()
        .get(vec![0u8], Some(options))
        .await
        .map_err(|source| KeyspaceError::Range {
            endpoint: endpoint.to_string(),
            key: "\\0".to_string(),
            source,
        })?;
    Ok(answer.more() || answer.kvs().iter().any(|kv| !ours.holds_key(kv.key())))
}

/// How many keys the keyspace held at `revision`, this run's health keys
/// left out.
pub(crate) async fn count_keys(
    client: &etcd_client::Client,
    endpoint: &str,
    revision: i64,
    ours: &Ours,
) -> Result<usize, KeyspaceError> {
    // Both spellings of our health keys (with and without the slash), each
    // counted beside the whole: three round trips at once.
    let with_slash = ours.key_prefix().as_bytes();
    // (A reader that wrote nothing has an empty prefix: none to count.)
    let ours_ranges: Vec<(&[u8], Vec<u8>)> = with_slash
        .strip_prefix(b"/")
        .map(|without| [with_slash, without])
        .into_iter()
        .flatten()
        .filter_map(|prefix| Some((prefix, super::ranges::prefix_end(prefix)?)))
        .collect();
    let (all, mine) = tokio::join!(
        count_range(client, endpoint, &[0], TO_THE_END, revision),
        futures_util::future::try_join_all(
            ours_ranges
                .iter()
                .map(|(prefix, end)| count_range(client, endpoint, prefix, end, revision))
        )
    );
    Ok(all?.saturating_sub(mine?.into_iter().sum()))
}

/// A read of the v3 keyspace with the ranges it asked for: for tests that
/// check what each range cost etcd.
#[derive(Debug, Clone)]
pub struct TracedRead {
    /// Keys read.
    pub keys: usize,
    /// Bytes of keys and values read.
    pub bytes: usize,
    /// The revision read.
    pub revision: i64,
    /// Every range asked for, in order.
    pub ranges: Vec<RequestedRange>,
}

/// Reads the whole v3 keyspace `endpoint` serves with `limits`, and says
/// which ranges it asked for.
pub async fn traced_read(endpoint: &str, limits: ReadLimits) -> Result<TracedRead, KeyspaceError> {
    let client = v3_client(endpoint).await?;
    let mut ranges = Vec::new();
    let (mut keys, mut bytes) = (0, 0);
    let (_, revision) = read_v3_with(
        &client,
        endpoint,
        &Ours::default(),
        &KnownLeases::new(),
        limits,
        &mut |entry| {
            keys += 1;
            bytes += entry.key.len() + entry.value.len();
        },
        Some(&mut ranges),
    )
    .await?;
    Ok(TracedRead {
        keys,
        bytes,
        revision,
        ranges,
    })
}
