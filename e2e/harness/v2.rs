//! This module owns etcd2 data in the tests: fixtures written through the
//! v2 HTTP API by real etcd (nested dirs, keys with TTLs, values with
//! unicode and special characters), the v2 keyspace read back (leaves with
//! their TTLs, and directories), and the check that a v3 keyspace is the
//! faithful migration of a v2 fixture (values, leases per TTL, expired keys
//! gone).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::task::JoinSet;

use super::etcd::{EtcdProcess, PROBE_TIMEOUT, REQUEST_TIMEOUT};
use super::keyspace::{is_health_key, Keyspace};
use super::{block_on, free_port, set_mode, write_version_txt, Member};

/// The key the v2 readiness probe writes and deletes again.
pub const V2_PROBE_KEY: &str = "/e2e-readiness-probe";

/// Requests in flight at once while a fixture is written.
const IN_FLIGHT: usize = 50;

impl EtcdProcess {
    /// Waits until a v2 write succeeds (etcd2 data: a v3 probe would write
    /// into the v3 store of a dir that must hold only v2 data).
    pub async fn wait_ready_v2(&mut self) {
        self.wait_ready_with(probe).await;
    }
}

/// An HTTP client for loopback etcd: no proxy from the environment, each
/// request timed out after [`REQUEST_TIMEOUT`].
pub fn http_client() -> reqwest::Client {
    http_client_within(REQUEST_TIMEOUT)
}

/// An HTTP client for loopback etcd whose requests time out after
/// `timeout`.
fn http_client_within(timeout: Duration) -> reqwest::Client {
    // reqwest takes its TLS provider from the process (src/tls.rs).
    etcd_migrate::tls::client_builder()
        .no_proxy()
        .timeout(timeout)
        .connect_timeout(timeout)
        .build()
        .unwrap_or_else(|err| panic!("cannot build an HTTP client: {err}"))
}

/// Percent-encodes everything but RFC 3986's unreserved characters.
fn encode(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len() * 3);
    for &b in bytes {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

/// The v2 keys URL of `path`, each segment percent-encoded.
pub fn key_url(endpoint: &str, path: &str) -> String {
    let mut url = format!("{endpoint}/v2/keys");
    for segment in path.split('/').filter(|s| !s.is_empty()) {
        url.push('/');
        url.push_str(&encode(segment.as_bytes()));
    }
    url
}

/// One v2 request; the parsed JSON body on a 2xx answer.
async fn send(request: reqwest::RequestBuilder, what: &str) -> Result<Value, String> {
    let response = request
        .send()
        .await
        .map_err(|err| format!("{what}: {err}"))?;
    let status = response.status();
    let body = response
        .text()
        .await
        .map_err(|err| format!("{what}: {err}"))?;
    if !status.is_success() {
        return Err(format!("{what}: HTTP {status}: {}", body.trim()));
    }
    serde_json::from_str(&body).map_err(|err| format!("{what}: not JSON ({err}): {body}"))
}

/// Sets `path` to `value` (with a TTL if given); returns the node etcd
/// reports.
pub async fn put(
    client: &reqwest::Client,
    endpoint: &str,
    path: &str,
    value: &str,
    ttl: Option<i64>,
) -> Result<Value, String> {
    let mut url = key_url(endpoint, path);
    if let Some(ttl) = ttl {
        let _ = write!(url, "?ttl={ttl}");
    }
    let request = client
        .put(&url)
        .header("content-type", "application/x-www-form-urlencoded")
        .body(format!("value={}", encode(value.as_bytes())));
    let body = send(request, &format!("v2 PUT {url}")).await?;
    Ok(body["node"].clone())
}

/// Deletes the key `path`.
pub async fn delete(client: &reqwest::Client, endpoint: &str, path: &str) -> Result<(), String> {
    let url = key_url(endpoint, path);
    send(client.delete(&url), &format!("v2 DELETE {url}"))
        .await
        .map(drop)
}

/// Deletes the dir `path` and everything below it.
pub async fn delete_dir(
    client: &reqwest::Client,
    endpoint: &str,
    path: &str,
) -> Result<(), String> {
    let url = format!("{}?dir=true&recursive=true", key_url(endpoint, path));
    send(client.delete(&url), &format!("v2 DELETE {url}"))
        .await
        .map(drop)
}

/// One v2 write and its undo: the proof that etcd serves etcd2 data.
pub async fn probe(endpoint: String) -> Result<(), String> {
    let client = http_client_within(PROBE_TIMEOUT);
    put(&client, &endpoint, V2_PROBE_KEY, "1", None).await?;
    delete(&client, &endpoint, V2_PROBE_KEY).await
}

/// A leaf of the v2 store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct V2Node {
    /// The value.
    pub value: String,
    /// Seconds left, as etcd reports them (absent: no TTL, or one that
    /// ran out less than a second ago).
    pub ttl: Option<i64>,
    /// When it expires (RFC 3339), if it does.
    pub expiration: Option<String>,
}

/// Everything the v2 keys API lists.
#[derive(Debug, Clone, Default)]
pub struct V2Keyspace {
    /// Every leaf, by path.
    pub leaves: BTreeMap<String, V2Node>,
    /// Every directory but the root.
    pub dirs: BTreeSet<String>,
}

impl V2Keyspace {
    /// Reads the whole v2 store served at `endpoint`.
    pub async fn read(endpoint: &str) -> V2Keyspace {
        let url = format!("{endpoint}/v2/keys/?recursive=true&sorted=true");
        let body = send(http_client().get(&url), &format!("v2 GET {url}"))
            .await
            .unwrap_or_else(|err| panic!("read the v2 store: {err}"));
        let mut keyspace = V2Keyspace::default();
        keyspace.collect(&body["node"], true);
        keyspace
    }

    fn collect(&mut self, node: &Value, root: bool) {
        let key = node["key"].as_str().unwrap_or_default().to_string();
        if node["dir"].as_bool() == Some(true) {
            if !root {
                self.dirs.insert(key);
            }
            for child in node["nodes"].as_array().into_iter().flatten() {
                self.collect(child, false);
            }
            return;
        }
        self.leaves.insert(
            key,
            V2Node {
                value: node["value"].as_str().unwrap_or_default().to_string(),
                ttl: node["ttl"].as_i64(),
                expiration: node["expiration"].as_str().map(str::to_string),
            },
        );
    }

    /// Asserts the store holds nothing: a storage migration leaves no
    /// migrated key in v2.
    pub fn assert_empty(&self) {
        assert!(
            self.leaves.is_empty() && self.dirs.is_empty(),
            "the v2 store must hold no migrated keys (3.6 refuses custom v2 content); it holds {} leaves and {} dirs, e.g. {:?}",
            self.leaves.len(),
            self.dirs.len(),
            self.leaves.keys().chain(self.dirs.iter()).take(5).collect::<Vec<_>>()
        );
    }

    /// The leaves without the migrator's health keys that a killed run
    /// may leave under their own TTL (they expire by themselves); one
    /// without a TTL stays, for the caller to report.
    pub fn without_health_key(&self) -> BTreeMap<String, V2Node> {
        self.leaves
            .iter()
            .filter(|(path, node)| !(is_health_key(path.as_bytes()) && node.expiration.is_some()))
            .map(|(path, node)| (path.clone(), node.clone()))
            .collect()
    }
}

/// The flags that turn the v2 API on for `etcd-<version>`: 3.4 and 3.5
/// serve it only with `--enable-v2=true`; 2.x and 3.0 … 3.3 always do, and
/// before 3.4 the flag does not exist (etcd refuses to start with it).
pub fn v2_flags(version: &str) -> &'static [&'static str] {
    if version.starts_with("3.4.") || version.starts_with("3.5.") {
        &["--enable-v2=true"]
    } else {
        &[]
    }
}

/// Starts `etcd-<version>` as `member` on `data_dir` with the v2 API on.
fn start_with_v2(version: &str, member: &Member, data_dir: &Path, log_dir: &Path) -> EtcdProcess {
    EtcdProcess::start_with(
        version,
        member,
        data_dir,
        free_port(),
        log_dir,
        v2_flags(version),
    )
}

/// Writes `keys` through the v2 API of `etcd-<version>` serving
/// `data_dir` (etcd3 data's v2 store, or etcd2 data), then stops it.
pub fn write_keys(version: &str, member: &Member, data_dir: &Path, log_dir: &Path, keys: &[V2Key]) {
    let mut etcd = start_with_v2(version, member, data_dir, log_dir);
    block_on(async {
        etcd.wait_ready_v2().await;
        let client = http_client();
        for key in keys {
            put(&client, &etcd.endpoint(), &key.path, &key.value, key.ttl)
                .await
                .unwrap_or_else(|err| panic!("write {}: {err}", key.path));
        }
    });
    etcd.stop();
}

/// Removes the v2 dirs `dirs` (and all below) through the v2 API of
/// `etcd-<version>` serving `data_dir`, then stops it.
pub fn remove_dirs(version: &str, member: &Member, data_dir: &Path, log_dir: &Path, dirs: &[&str]) {
    let mut etcd = start_with_v2(version, member, data_dir, log_dir);
    block_on(async {
        etcd.wait_ready_v2().await;
        let client = http_client();
        for dir in dirs {
            delete_dir(&client, &etcd.endpoint(), dir)
                .await
                .unwrap_or_else(|err| panic!("remove {dir}: {err}"));
        }
    });
    etcd.stop();
}

/// Starts `etcd-<version>` as `member` on `data_dir` with the v2 API on,
/// reads the v2 store, and stops it.
pub fn read_back_v2(version: &str, member: &Member, data_dir: &Path, log_dir: &Path) -> V2Keyspace {
    let mut etcd = start_with_v2(version, member, data_dir, log_dir);
    let keyspace = block_on(async {
        etcd.wait_ready_v2().await;
        V2Keyspace::read(&etcd.endpoint()).await
    });
    etcd.stop();
    keyspace
}

/// Starts `etcd-<version>` as `member` on data a storage migration wrote,
/// with the v2 API on; once it takes a v3 write, reads the v3 keyspace,
/// then the v2 store, and stops it. Returns both and when the v3 read
/// ended (the reference for [`assert_migrated`]'s remaining TTLs).
pub fn read_back_migrated(
    version: &str,
    member: &Member,
    data_dir: &Path,
    log_dir: &Path,
) -> (Keyspace, Instant, V2Keyspace) {
    let mut etcd = start_with_v2(version, member, data_dir, log_dir);
    let read = block_on(async {
        etcd.wait_ready().await;
        let v3 = Keyspace::read(&etcd.endpoint()).await;
        let read_at = Instant::now();
        (v3, read_at, V2Keyspace::read(&etcd.endpoint()).await)
    });
    etcd.stop();
    read
}

/// A v2 key a fixture writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct V2Key {
    /// The path, e.g. `/registry/pods/ns/x`.
    pub path: String,
    /// The value.
    pub value: String,
    /// Its TTL in seconds, if it expires.
    pub ttl: Option<i64>,
}

impl V2Key {
    /// A key without a TTL.
    pub fn plain(path: impl Into<String>, value: impl Into<String>) -> Self {
        V2Key {
            path: path.into(),
            value: value.into(),
            ttl: None,
        }
    }

    /// A key that expires after `ttl` seconds.
    pub fn expiring(path: impl Into<String>, value: impl Into<String>, ttl: i64) -> Self {
        V2Key {
            path: path.into(),
            value: value.into(),
            ttl: Some(ttl),
        }
    }
}

/// A key as the fixture wrote it.
#[derive(Debug, Clone)]
pub struct WrittenKey {
    /// What was written.
    pub key: V2Key,
    /// Just before the request was sent: the TTL counts from later.
    pub sent: Instant,
    /// When etcd said it expires, if it does.
    pub expiration: Option<String>,
}

/// An etcd2 data dir written by real etcd.
pub struct V2Fixture {
    /// The data dir.
    pub data_dir: PathBuf,
    /// Every key, in the order of the batches that wrote them.
    pub keys: Vec<WrittenKey>,
}

impl V2Fixture {
    /// The key written at `path`.
    pub fn key(&self, path: &str) -> &WrittenKey {
        self.keys
            .iter()
            .find(|k| k.key.path == path)
            .unwrap_or_else(|| panic!("the fixture wrote no {path}"))
    }
}

/// Writes `batches` into `data_dir` through the v2 API of `etcd-<version>`
/// running as `member`: the keys of one batch concurrently (so keys that
/// share a TTL expire within milliseconds of each other), the batches in
/// order. Leaves the dir as the Kubernetes image leaves etcd2 data: mode
/// 0700, `version.txt` = `<version>/etcd2`.
pub fn build(
    version: &str,
    data_dir: &Path,
    member: &Member,
    log_dir: &Path,
    batches: &[Vec<V2Key>],
) -> V2Fixture {
    build_paced(version, data_dir, member, log_dir, batches, Duration::ZERO)
}

/// [`build`] with `pause` between two batches (and none after the last:
/// etcd stops right after it).
pub fn build_paced(
    version: &str,
    data_dir: &Path,
    member: &Member,
    log_dir: &Path,
    batches: &[Vec<V2Key>],
    pause: Duration,
) -> V2Fixture {
    let mut etcd = EtcdProcess::start_with(
        version,
        member,
        data_dir,
        free_port(),
        log_dir,
        v2_flags(version),
    );
    let (keys, served) = block_on(async {
        etcd.wait_ready_v2().await;
        let endpoint = etcd.endpoint();
        let client = http_client();
        let mut written = Vec::new();
        for (n, batch) in batches.iter().enumerate() {
            if n > 0 && !pause.is_zero() {
                tokio::time::sleep(pause).await;
            }
            for chunk in batch.chunks(IN_FLIGHT) {
                let mut requests = JoinSet::new();
                for (i, key) in chunk.iter().enumerate() {
                    let (client, endpoint, key) = (client.clone(), endpoint.clone(), key.clone());
                    requests.spawn(async move {
                        let sent = Instant::now();
                        let node = put(&client, &endpoint, &key.path, &key.value, key.ttl).await;
                        (i, key, sent, node)
                    });
                }
                let mut done: Vec<(usize, WrittenKey)> = Vec::new();
                while let Some(result) = requests.join_next().await {
                    let (i, key, sent, node) =
                        result.unwrap_or_else(|err| panic!("a v2 write task failed: {err}"));
                    let node = node.unwrap_or_else(|err| panic!("write the v2 fixture: {err}"));
                    done.push((
                        i,
                        WrittenKey {
                            key,
                            sent,
                            expiration: node["expiration"].as_str().map(str::to_string),
                        },
                    ));
                }
                done.sort_by_key(|(i, _)| *i);
                written.extend(done.into_iter().map(|(_, key)| key));
            }
        }
        let served = V2Keyspace::read(&endpoint).await;
        (written, served)
    });
    etcd.stop();
    // Keys whose TTL ran out while the fixture etcd served may be gone.
    let served_at = Instant::now();
    for written in &keys {
        if written.key.ttl.is_some_and(|ttl| {
            served_at.duration_since(written.sent) + EXPIRY_MARGIN
                >= Duration::from_secs(ttl as u64)
        }) {
            continue;
        }
        let node = served.leaves.get(&written.key.path).unwrap_or_else(|| {
            panic!(
                "the fixture etcd does not serve {} it just wrote",
                written.key.path
            )
        });
        assert_eq!(
            node.value, written.key.value,
            "{}: the fixture etcd serves another value",
            written.key.path
        );
        assert_eq!(
            node.expiration.is_some(),
            written.key.ttl.is_some(),
            "{}: TTL as written",
            written.key.path
        );
    }
    set_mode(data_dir, 0o700);
    write_version_txt(data_dir, &format!("{version}/etcd2"));
    V2Fixture {
        data_dir: data_dir.to_path_buf(),
        keys,
    }
}

/// Values of every kind a v2 store holds as text.
fn v2_value(i: usize) -> String {
    match i % 8 {
        0 => format!("ünïcødé ✓ 日本語 🚀 #{i}"),
        1 => format!(r#"{{"kind":"Pod","metadata":{{"name":"p-{i}","labels":{{"a/b":"c=d"}}}}}}"#),
        2 => String::new(),
        3 => format!("special &=%+?#/;:@ \"quoted\" \\backslash\\ tab\t #{i}"),
        4 => format!("multi\nline\r\nvalue {i}\n"),
        5 if i == 5 => "x".repeat(10 * 1024),
        6 => format!("nul \u{0} inside and \u{7f} del #{i}"),
        _ => format!("value-{i}"),
    }
}

/// A Kubernetes-like etcd2 keyspace in write batches: `plain` keys in
/// nested dirs (`/registry/<kind>/<ns>/<name>`, deep `/a/b/c/…`, names with
/// spaces, unicode and reserved URL characters), then one batch per TTL in
/// `ttls`, each holding `per_ttl` event keys and one key outside
/// `/registry/events`.
pub fn kubernetes_like(plain: usize, ttls: &[i64], per_ttl: usize) -> Vec<Vec<V2Key>> {
    const KINDS: [&str; 4] = ["pods", "services", "configmaps", "secrets"];
    let mut first: Vec<V2Key> = (0..plain)
        .map(|i| {
            V2Key::plain(
                format!(
                    "/registry/{}/ns-{}/object-{i:04}",
                    KINDS[i % KINDS.len()],
                    i % 5
                ),
                v2_value(i),
            )
        })
        .collect();
    first.extend([
        V2Key::plain("/a/b/c/d", "deep"),
        V2Key::plain("/a/b/c/e/f/g/h", "deeper ✓"),
        V2Key::plain("/registry/configmaps/ns-ü/näme with spaces", "spaces"),
        V2Key::plain(
            "/registry/secrets/ns/a+b=c&d%e?f#g",
            "reserved URL characters",
        ),
        V2Key::plain("/registry/日本語/🚀", "unicode path"),
        V2Key::plain("/top-level", "at the root"),
    ]);
    let mut batches = vec![first];
    for ttl in ttls {
        let mut batch: Vec<V2Key> = (0..per_ttl)
            .map(|i| {
                V2Key::expiring(
                    format!("/registry/events/ns-{}/event-{ttl}-{i:03}", i % 3),
                    format!("event {i} lives {ttl} s ✓"),
                    *ttl,
                )
            })
            .collect();
        batch.push(V2Key::expiring(
            format!("/a/b/ttl-{ttl}"),
            format!("outside the events dir, {ttl} s"),
            *ttl,
        ));
        batches.push(batch);
    }
    batches
}

/// Asserts that `v3` (read at `read_at` from the migrated data) holds the
/// v2 fixture as the storage migration promises:
/// - every key but those in `gone` under its v2 path, with its value;
/// - no other key (a health key a killed run left under its own short
///   lease aside; the caller checks that none is left without one);
/// - a key without TTL has no lease; a key with TTL `t` has a lease whose
///   granted TTL is at most `t` and whose remaining TTL is in
///   `(t - elapsed - 5, t]`, `elapsed` counted from the key's write;
/// - keys that share a TTL share one lease, unless a second boundary of
///   the migration's read fell between them (they were written
///   milliseconds apart): then exactly two leases, one second apart; keys
///   of different TTLs never share one. Which keys land on which side is
///   not checked against their expiry order: etcd computes each listed
///   key's remaining TTL from a clock reading of its own, so when the
///   listing takes longer than the milliseconds between the writes (a
///   loaded machine), a key that expires later can be listed with the
///   shorter TTL;
/// - every lease holds keys (`orphans_allowed`: a rerun after a crash may
///   leave the first attempt's leases behind).
///
/// Returns how many TTL groups were split at a second boundary.
pub fn assert_migrated(
    v3: &Keyspace,
    fixture: &V2Fixture,
    read_at: Instant,
    gone: &BTreeSet<String>,
    orphans_allowed: bool,
) -> usize {
    let mut problems = String::new();
    let mut expected: BTreeMap<&str, &WrittenKey> = BTreeMap::new();
    for written in &fixture.keys {
        expected.insert(written.key.path.as_str(), written);
    }
    for (key, entry) in &v3.entries {
        let path = String::from_utf8_lossy(key);
        if is_health_key(key) && entry.lease != 0 {
            continue;
        }
        if gone.contains(path.as_ref()) {
            let _ = writeln!(
                problems,
                "{path} expired before the migration but is in v3 (lease {:x})",
                entry.lease
            );
        } else if !expected.contains_key(path.as_ref()) {
            let _ = writeln!(problems, "{path} is in v3 but was never written to v2");
        }
    }
    let mut by_ttl: BTreeMap<i64, Vec<(&WrittenKey, i64)>> = BTreeMap::new();
    for (path, written) in &expected {
        if gone.contains(*path) {
            continue;
        }
        let Some(entry) = v3.entries.get(path.as_bytes()) else {
            let _ = writeln!(problems, "{path} was not migrated");
            continue;
        };
        if entry.value != written.key.value.as_bytes() {
            let _ = writeln!(
                problems,
                "{path}: value {:?} became {:?}",
                written.key.value,
                String::from_utf8_lossy(&entry.value)
            );
        }
        match written.key.ttl {
            None if entry.lease != 0 => {
                let _ = writeln!(
                    problems,
                    "{path} has no TTL but got lease {:x}",
                    entry.lease
                );
            }
            None => {}
            Some(_) if entry.lease == 0 => {
                let _ = writeln!(
                    problems,
                    "{path} had a TTL but has no lease: it would never expire"
                );
            }
            Some(ttl) => {
                let Some(lease) = v3.leases.get(&entry.lease) else {
                    let _ = writeln!(problems, "{path}: lease {:x} is not listed", entry.lease);
                    continue;
                };
                let elapsed = read_at.duration_since(written.sent).as_secs_f64().ceil() as i64;
                let low = ttl - elapsed - 5;
                if lease.remaining_ttl <= low || lease.remaining_ttl > ttl {
                    let _ = writeln!(
                        problems,
                        "{path}: written with TTL {ttl} s {elapsed} s ago, its lease {:x} has {} s left (want ({low}, {ttl}])",
                        entry.lease, lease.remaining_ttl
                    );
                }
                if lease.granted_ttl > ttl {
                    let _ = writeln!(
                        problems,
                        "{path}: lease {:x} was granted {} s, more than the key's TTL {ttl} s",
                        entry.lease, lease.granted_ttl
                    );
                }
                by_ttl.entry(ttl).or_default().push((*written, entry.lease));
            }
        }
    }
    let mut splits = 0;
    let mut owner: BTreeMap<i64, i64> = BTreeMap::new();
    for (ttl, keys) in &by_ttl {
        let leases: BTreeSet<i64> = keys.iter().map(|(_, lease)| *lease).collect();
        for lease in &leases {
            if let Some(other) = owner.insert(*lease, *ttl) {
                let _ = writeln!(
                    problems,
                    "lease {lease:x} holds keys of TTL {other} s and of TTL {ttl} s"
                );
            }
        }
        match leases.len() {
            1 => {}
            2 => {
                splits += 1;
                let granted: Vec<i64> = leases
                    .iter()
                    .map(|id| v3.leases.get(id).map_or(0, |l| l.granted_ttl))
                    .collect();
                if granted[0].abs_diff(granted[1]) != 1 {
                    let _ = writeln!(
                        problems,
                        "the {} keys of TTL {ttl} s are on two leases granted {granted:?} s, which is not a split at one second boundary",
                        keys.len()
                    );
                }
            }
            n => {
                let _ = writeln!(
                    problems,
                    "the {} keys of TTL {ttl} s are on {n} leases instead of one",
                    keys.len()
                );
            }
        }
    }
    if !orphans_allowed {
        for (id, lease) in &v3.leases {
            if lease.keys.is_empty() {
                let _ = writeln!(
                    problems,
                    "lease {id:x} (granted {} s) holds no key",
                    lease.granted_ttl
                );
            }
        }
    }
    assert!(
        problems.is_empty(),
        "the v3 keyspace is not the migrated v2 fixture ({} keys written, {} in v3, {} leases):\n{problems}",
        fixture.keys.len(),
        v3.entries.len(),
        v3.leases.len()
    );
    splits
}

/// Asserts that the v2 store `v2` is the copy of the v3 keyspace `v3`
/// that the rollback to etcd2 promises: every v3 key under its v2 path
/// (one leading `/`) with its value; a leased key with a TTL in
/// `(lease_ttl - 60, lease_ttl]`, any other key without one; nothing else
/// (a health key a killed run left under its own short lease or TTL
/// aside).
pub fn assert_v2_copy(v2: &V2Keyspace, v3: &Keyspace, lease_ttl: i64) {
    let leaves = v2.without_health_key();
    let mut problems = Vec::new();
    let mut wanted = BTreeSet::new();
    for (key, entry) in &v3.entries {
        if is_health_key(key) && entry.lease != 0 {
            continue;
        }
        let text = String::from_utf8_lossy(key);
        let path = format!("/{}", text.trim_start_matches('/'));
        wanted.insert(path.clone());
        let Some(node) = leaves.get(&path) else {
            problems.push(format!("{path} is missing"));
            continue;
        };
        if node.value.as_bytes() != entry.value.as_slice() {
            problems.push(format!(
                "{path}: value {:?} became {:?}",
                String::from_utf8_lossy(&entry.value),
                node.value
            ));
        }
        match (entry.lease, node.ttl) {
            (0, None) => {}
            (0, Some(ttl)) => problems.push(format!("{path} had no lease but has TTL {ttl}")),
            (lease, None) => problems.push(format!("{path} had lease {lease:x} but has no TTL")),
            (_, Some(ttl)) => {
                if !(lease_ttl - 60 < ttl && ttl <= lease_ttl) {
                    problems.push(format!(
                        "{path}: TTL {ttl} s, want ({}, {lease_ttl}]",
                        lease_ttl - 60
                    ));
                }
            }
        }
    }
    for path in leaves.keys().filter(|path| !wanted.contains(*path)) {
        problems.push(format!("{path} is in the v2 store but was not in v3"));
    }
    assert!(
        problems.is_empty(),
        "the v2 store is not the v3 keyspace ({} v3 keys, {} v2 leaves):\n{}",
        v3.entries.len(),
        leaves.len(),
        problems.join("\n")
    );
}

/// How long to wait past the moment a key's TTL runs out before it counts
/// as expired for certain (v2 reports TTLs rounded up to whole seconds).
pub const EXPIRY_MARGIN: Duration = Duration::from_millis(1200);
