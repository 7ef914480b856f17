//! This module owns whole-keyspace work against a step's etcd on its
//! isolated port: reading every key (v2 with TTLs, v3 with leases),
//! writing keys back (v2 with a TTL, v3 under a lease), deleting the v2
//! tree, and the fingerprint (count + digest of every leaf key and value)
//! that proves two keyspaces equal.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::health::HEALTH_KEY;

/// Keys per v3 range request: K8s objects reach 1.5 MiB, so pages stay
/// small and the decoding limit generous.
const V3_PAGE: i64 = 200;

/// Largest v3 response we accept (etcd's own request limit is 1.5 MiB a
/// key; a page of them fits).
const V3_MAX_MESSAGE: usize = 512 * 1024 * 1024;

/// Per-request deadline for keyspace calls: a page of a large keyspace.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// One leaf key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The key (v2 keys are paths such as `/registry/pods/a`).
    pub key: Vec<u8>,
    /// The value.
    pub value: Vec<u8>,
    /// Seconds left to live, if the key expires (v2 TTL or v3 lease).
    pub ttl: Option<i64>,
}

/// What identifies a keyspace's content: the number of leaf keys and a
/// SHA-256 over every (key, value) in key order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fingerprint {
    /// Leaf keys.
    pub count: usize,
    /// Digest of keys and values.
    pub digest: [u8; 32],
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let hex: String = self.digest[..8]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        write!(f, "{} keys sha256:{hex}…", self.count)
    }
}

/// The fingerprint of `entries`, leaving out our own health key (each step
/// writes it with its own version). Keys are normalised to v2 form (a
/// leading `/`) so a v2 store and the v3 keyspace made from it compare.
pub fn fingerprint<'a>(entries: impl IntoIterator<Item = &'a Entry>) -> Fingerprint {
    let mut sorted: BTreeMap<Vec<u8>, &[u8]> = BTreeMap::new();
    for entry in entries.into_iter().filter(|e| !is_health_key(&e.key)) {
        sorted.insert(v2_path(&entry.key), &entry.value);
    }
    let mut hasher = Sha256::new();
    for (key, value) in &sorted {
        // Length-prefixed so that ("ab","c") and ("a","bc") differ.
        hasher.update((key.len() as u64).to_be_bytes());
        hasher.update(key);
        hasher.update((value.len() as u64).to_be_bytes());
        hasher.update(value);
    }
    Fingerprint {
        count: sorted.len(),
        digest: hasher.finalize().into(),
    }
}

/// True for the key every step writes (`etcd_version` in v3,
/// `/etcd_version` in v2): ours, not the user's data.
pub fn is_health_key(key: &[u8]) -> bool {
    v2_path(key) == format!("/{HEALTH_KEY}").as_bytes()
}

/// A key as a v2 path: with exactly one leading `/`.
pub fn v2_path(key: &[u8]) -> Vec<u8> {
    let trimmed: &[u8] = match key.iter().position(|b| *b != b'/') {
        Some(start) => &key[start..],
        None => &[],
    };
    let mut path = Vec::with_capacity(trimmed.len() + 1);
    path.push(b'/');
    path.extend_from_slice(trimmed);
    path
}

fn http_client() -> Result<reqwest::Client, String> {
    reqwest::Client::builder()
        .no_proxy()
        .timeout(REQUEST_TIMEOUT)
        .build()
        .map_err(|err| format!("cannot build the HTTP client: {err}"))
}

/// Reads every leaf of the v2 store (recursive, with remaining TTLs).
/// Hidden v2 nodes (`_`-prefixed) are not listed by etcd and not read.
pub async fn read_v2(endpoint: &str) -> Result<Vec<Entry>, String> {
    let url = format!("{endpoint}/v2/keys/?recursive=true&sorted=true");
    let response = http_client()?
        .get(&url)
        .send()
        .await
        .map_err(|err| format!("v2 GET {url}: {err}"))?;
    let status = response.status();
    let body = response
        .text()
        .await
        .map_err(|err| format!("v2 GET {url}: {err}"))?;
    if !status.is_success() {
        return Err(format!("v2 GET {url}: HTTP {status}: {}", body.trim()));
    }
    let json: Value =
        serde_json::from_str(&body).map_err(|err| format!("v2 GET {url}: not JSON: {err}"))?;
    let mut entries = Vec::new();
    collect_v2(&json["node"], &mut entries);
    Ok(entries)
}

fn collect_v2(node: &Value, out: &mut Vec<Entry>) {
    if node["dir"].as_bool() == Some(true) {
        for child in node["nodes"].as_array().into_iter().flatten() {
            collect_v2(child, out);
        }
        return;
    }
    if let Some(key) = node["key"].as_str() {
        // A key in its last second (or past expiry, before etcd's 500 ms
        // sweep) is listed with its "expiration" but no "ttl" (0 is
        // omitted from the JSON): it is expiring, not permanent.
        let ttl = match (node["ttl"].as_i64(), node.get("expiration")) {
            (Some(ttl), _) => Some(ttl),
            (None, Some(_)) => Some(0),
            (None, None) => None,
        };
        out.push(Entry {
            key: key.as_bytes().to_vec(),
            value: node["value"]
                .as_str()
                .unwrap_or_default()
                .as_bytes()
                .to_vec(),
            ttl,
        });
    }
}

/// Percent-encodes each segment of a v2 path for a URL.
fn v2_url(endpoint: &str, key: &[u8]) -> String {
    let mut url = format!("{endpoint}/v2/keys");
    for segment in key.split(|b| *b == b'/').filter(|s| !s.is_empty()) {
        url.push('/');
        for &b in segment {
            if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
                url.push(b as char);
            } else {
                url.push_str(&format!("%{b:02X}"));
            }
        }
    }
    url
}

fn form_encode(value: &[u8]) -> String {
    let mut out = String::with_capacity(value.len() + 6);
    out.push_str("value=");
    for &b in value {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Writes one v2 key, with a TTL if given.
pub async fn write_v2(
    client: &reqwest::Client,
    endpoint: &str,
    key: &[u8],
    value: &[u8],
    ttl: Option<i64>,
) -> Result<(), String> {
    let mut url = v2_url(endpoint, key);
    if let Some(ttl) = ttl {
        url.push_str(&format!("?ttl={ttl}"));
    }
    let response = client
        .put(&url)
        .header("content-type", "application/x-www-form-urlencoded")
        .body(form_encode(value))
        .send()
        .await
        .map_err(|err| format!("v2 PUT {url}: {err}"))?;
    let status = response.status();
    if status.is_success() {
        return Ok(());
    }
    let body = response.text().await.unwrap_or_default();
    Err(format!("v2 PUT {url}: HTTP {status}: {}", body.trim()))
}

/// Writes v2 keys one by one (the v2 API has no batch), each with its TTL.
pub async fn write_all_v2(endpoint: &str, entries: &[Entry]) -> Result<(), String> {
    let client = http_client()?;
    for entry in entries {
        write_v2(&client, endpoint, &entry.key, &entry.value, entry.ttl).await?;
    }
    Ok(())
}

/// Deletes every top-level node of the v2 store (recursively), leaving the
/// internal membership nodes, which the keys API does not list.
pub async fn delete_v2_tree(endpoint: &str) -> Result<usize, String> {
    let client = http_client()?;
    let url = format!("{endpoint}/v2/keys/");
    let response = client
        .get(&url)
        .send()
        .await
        .map_err(|err| format!("v2 GET {url}: {err}"))?;
    let body = response
        .text()
        .await
        .map_err(|err| format!("v2 GET {url}: {err}"))?;
    let json: Value =
        serde_json::from_str(&body).map_err(|err| format!("v2 GET {url}: not JSON: {err}"))?;
    let mut deleted = 0;
    for node in json["node"]["nodes"].as_array().into_iter().flatten() {
        let Some(key) = node["key"].as_str() else {
            continue;
        };
        let dir = node["dir"].as_bool() == Some(true);
        let node_url = format!(
            "{}{}",
            v2_url(endpoint, key.as_bytes()),
            if dir { "?recursive=true" } else { "" }
        );
        let response = client
            .delete(&node_url)
            .send()
            .await
            .map_err(|err| format!("v2 DELETE {node_url}: {err}"))?;
        if !response.status().is_success() && response.status().as_u16() != 404 {
            let status = response.status();
            let text = response.text().await.unwrap_or_default();
            return Err(format!(
                "v2 DELETE {node_url}: HTTP {status}: {}",
                text.trim()
            ));
        }
        deleted += 1;
    }
    Ok(deleted)
}

/// A v3 client with generous limits for whole-keyspace reads.
pub async fn v3_client(endpoint: &str) -> Result<etcd_client::Client, String> {
    let options = etcd_client::ConnectOptions::new()
        .with_connect_timeout(Duration::from_secs(5))
        .with_timeout(REQUEST_TIMEOUT);
    etcd_client::Client::connect([endpoint], Some(options))
        .await
        .map_err(|err| format!("v3 connect {endpoint}: {err}"))
}

/// Reads every v3 key with the remaining TTL of its lease (if any), a page
/// at a time.
pub async fn read_v3(endpoint: &str) -> Result<Vec<Entry>, String> {
    let client = v3_client(endpoint).await?;
    let mut kv = client.kv_client().max_decoding_message_size(V3_MAX_MESSAGE);
    let mut lease_client = client.lease_client();
    let mut entries = Vec::new();
    let mut ttl_of_lease: BTreeMap<i64, Option<i64>> = BTreeMap::new();
    let mut start: Vec<u8> = vec![0];
    let mut revision = 0;
    loop {
        let options = etcd_client::GetOptions::new()
            .with_from_key()
            .with_limit(V3_PAGE)
            .with_revision(revision);
        let response = kv
            .get(start.clone(), Some(options))
            .await
            .map_err(|err| format!("v3 range from {start:?}: {err}"))?;
        if revision == 0 {
            // Every page reads the same revision: a consistent snapshot.
            revision = response.header().map(|h| h.revision()).unwrap_or(0);
        }
        for kv in response.kvs() {
            let ttl = match kv.lease() {
                0 => None,
                lease => match ttl_of_lease.get(&lease) {
                    Some(ttl) => *ttl,
                    None => {
                        let answer = lease_client
                            .time_to_live(lease, None)
                            .await
                            .map_err(|err| format!("v3 lease {lease:x} time-to-live: {err}"))?;
                        let ttl = (answer.ttl() > 0).then_some(answer.ttl());
                        ttl_of_lease.insert(lease, ttl);
                        ttl
                    }
                },
            };
            if kv.lease() != 0 && ttl.is_none() {
                // The lease ran out between the range and the lookup: the
                // key is gone (or going); do not carry it over.
                continue;
            }
            entries.push(Entry {
                key: kv.key().to_vec(),
                value: kv.value().to_vec(),
                ttl,
            });
        }
        match (response.more(), response.kvs().last()) {
            (true, Some(last)) => {
                start = last.key().to_vec();
                start.push(0);
            }
            _ => break,
        }
    }
    Ok(entries)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(key: &str, value: &str) -> Entry {
        Entry {
            key: key.as_bytes().to_vec(),
            value: value.as_bytes().to_vec(),
            ttl: None,
        }
    }

    #[test]
    fn fingerprint_ignores_order_the_health_key_and_the_leading_slash() {
        let a = [
            entry("/registry/a", "1"),
            entry("/registry/b", "2"),
            entry("/etcd_version", "3.3.25"),
        ];
        let b = [
            entry("registry/b", "2"),
            entry("registry/a", "1"),
            entry("etcd_version", "3.5.16"),
        ];
        assert_eq!(fingerprint(&a), fingerprint(&b));
        assert_eq!(fingerprint(&a).count, 2);
        let c = [entry("/registry/a", "1"), entry("/registry/b", "3")];
        assert_ne!(fingerprint(&a), fingerprint(&c));
        let d = [entry("/ab", "c")];
        let e = [entry("/a", "bc")];
        assert_ne!(fingerprint(&d), fingerprint(&e));
    }

    #[test]
    fn v2_urls_and_forms_are_escaped() {
        assert_eq!(
            v2_url("http://h", b"/registry/a b/c%"),
            "http://h/v2/keys/registry/a%20b/c%25"
        );
        assert_eq!(form_encode("x=1&y".as_bytes()), "value=x%3D1%26y");
        assert_eq!(v2_path(b"foo"), b"/foo".to_vec());
        assert_eq!(v2_path(b"//foo"), b"/foo".to_vec());
    }

    #[test]
    fn v2_tree_walk_collects_leaves_with_ttls() {
        let json: Value = serde_json::json!({"node": {"dir": true, "nodes": [
            {"key": "/a", "value": "1"},
            {"key": "/d", "dir": true, "nodes": [{"key": "/d/e", "value": "2", "ttl": 30, "expiration": "x"}]},
            {"key": "/empty", "dir": true},
            {"key": "/dying", "value": "3", "expiration": "x"}
        ]}});
        let mut out = Vec::new();
        collect_v2(&json["node"], &mut out);
        assert_eq!(out.len(), 3);
        assert_eq!(out[0].ttl, None);
        assert_eq!(out[1].ttl, Some(30));
        assert_eq!(
            out[2].ttl,
            Some(0),
            "expiration without ttl is expiring, not permanent"
        );
    }
}
