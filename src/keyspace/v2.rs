//! This module owns the v2 API calls of a keyspace read or rebuild:
//! reading the v2 store (with TTLs, and the hidden nodes the API never
//! lists), writing keys with a TTL, and deleting the tree.

use percent_encoding::{percent_encode, AsciiSet, NON_ALPHANUMERIC};
use serde::Deserialize;

use super::{Entry, KeyspaceError, Ours, REQUEST_TIMEOUT};

/// What stays unescaped in a v2 path segment or form value: RFC 3986's
/// unreserved characters.
const UNRESERVED: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'~');

/// A v2 keys API answer, whoever asks (a keyspace read, the cluster
/// mode's lock and announcements, a joiner's v2 proof): the node of a GET,
/// a write or an event of the history, the event's action, or etcd's
/// error code.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct V2Answer {
    #[serde(default)]
    pub action: String,
    #[serde(default)]
    pub node: Option<V2Node>,
    #[serde(default, rename = "errorCode")]
    pub error_code: Option<u32>,
}

/// The v2 error code for "key not found" (a failed compare is 101, an
/// existing key 105).
pub(crate) const V2_NOT_FOUND: u32 = 100;

/// One node of the v2 store as the keys API shows it.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct V2Node {
    #[serde(default)]
    pub key: Option<String>,
    #[serde(default)]
    pub value: Option<String>,
    #[serde(default)]
    pub dir: bool,
    #[serde(default)]
    pub ttl: Option<i64>,
    #[serde(default)]
    pub expiration: Option<String>,
    #[serde(default, rename = "modifiedIndex")]
    pub modified_index: u64,
    #[serde(default)]
    pub nodes: Vec<V2Node>,
}

pub(crate) fn http_client() -> Result<reqwest::Client, KeyspaceError> {
    crate::tls::client_builder()
        .no_proxy()
        .timeout(REQUEST_TIMEOUT)
        .build()
        .map_err(KeyspaceError::HttpClient)
}

fn request_failed(method: &'static str, url: &str, source: reqwest::Error) -> KeyspaceError {
    KeyspaceError::V2Request {
        method,
        url: url.to_string(),
        source,
    }
}

/// The node of a successful answer.
fn parse(url: &str, body: &str) -> Result<V2Node, KeyspaceError> {
    let answer: V2Answer = serde_json::from_str(body).map_err(|source| KeyspaceError::V2Json {
        url: url.to_string(),
        source,
    })?;
    answer.node.ok_or_else(|| KeyspaceError::V2NoNode {
        url: url.to_string(),
    })
}

/// Reads every leaf of the v2 store (recursive, with remaining TTLs),
/// without this run's health keys; `None` when the etcd serves no v2 API
/// (3.4/3.5 without `--enable-v2`, 3.6). A key inside a directory that has
/// a TTL expires with it: it gets the shortest TTL on its path. Hidden v2
/// nodes (a name starting with `_`) are never listed by etcd, so the ones
/// the data records (`hidden`, from [`crate::ondisk`]: a superset, so one
/// not found is skipped) are read one by one; a GET of a hidden directory
/// lists its visible children.
pub async fn read_v2(
    endpoint: &str,
    ours: &Ours,
    hidden: &[String],
) -> Result<Option<Vec<Entry>>, KeyspaceError> {
    let url = format!("{endpoint}/v2/keys/?recursive=true&sorted=true");
    let (status, body) = v2_get(&url).await?;
    if status.as_u16() == 404 && serde_json::from_str::<serde_json::Value>(&body).is_err() {
        // The root always exists; a 404 that is not a v2 error document
        // is the HTTP mux saying the v2 API is not served at all.
        return Ok(None);
    }
    if !status.is_success() {
        return Err(KeyspaceError::V2Status {
            method: "GET",
            url,
            status: status.as_u16(),
            body: body.trim().to_string(),
        });
    }
    let root = parse(&url, &body)?;
    let mut entries = Vec::new();
    collect_v2(&root, None, &mut entries);
    for path in hidden {
        if let Some(node) = read_v2_node(endpoint, path).await? {
            collect_v2(&node, None, &mut entries);
        }
    }
    entries.retain(|entry| !ours.holds_key(&entry.key));
    Ok(Some(entries))
}

/// One v2 node (recursively, if a directory), or `None` if it is gone.
async fn read_v2_node(endpoint: &str, path: &str) -> Result<Option<V2Node>, KeyspaceError> {
    let url = format!(
        "{}?recursive=true&sorted=true",
        v2_url(endpoint, path.as_bytes())
    );
    let (status, body) = v2_get(&url).await?;
    if status.as_u16() == 404 {
        return Ok(None);
    }
    if !status.is_success() {
        return Err(KeyspaceError::V2Status {
            method: "GET",
            url,
            status: status.as_u16(),
            body: body.trim().to_string(),
        });
    }
    Ok(Some(parse(&url, &body)?))
}

/// One v2 GET: the status and the body.
async fn v2_get(url: &str) -> Result<(reqwest::StatusCode, String), KeyspaceError> {
    let response = http_client()?
        .get(url)
        .send()
        .await
        .map_err(|err| request_failed("GET", url, err))?;
    let status = response.status();
    let body = response
        .text()
        .await
        .map_err(|err| request_failed("GET", url, err))?;
    Ok((status, body))
}

/// True for a v2 path with a hidden segment (a name starting with `_`):
/// the v2 API never lists it.
pub fn is_hidden_v2(key: &[u8]) -> bool {
    key.split(|b| *b == b'/')
        .any(|segment| segment.first() == Some(&b'_'))
}

/// Reads the v2 store of etcd2 data, which the release must serve.
pub(crate) async fn read_v2_store(
    endpoint: &str,
    ours: &Ours,
    hidden: &[String],
) -> Result<Vec<Entry>, KeyspaceError> {
    read_v2(endpoint, ours, hidden)
        .await?
        .ok_or_else(|| KeyspaceError::NoV2Api {
            endpoint: endpoint.to_string(),
        })
}

/// The seconds a v2 node has left, if it expires. A node in its last
/// second (or past expiry, before etcd's 500 ms sweep) is listed with its
/// "expiration" but no "ttl" (0 is omitted from the JSON): it is expiring,
/// not permanent.
fn v2_ttl(node: &V2Node) -> Option<i64> {
    match (node.ttl, &node.expiration) {
        (Some(ttl), _) => Some(ttl),
        (None, Some(_)) => Some(0),
        (None, None) => None,
    }
}

/// Collects the leaves under `node`; `inherited` is the shortest TTL of
/// the directories above it (a directory's expiry removes its children).
pub(crate) fn collect_v2(node: &V2Node, inherited: Option<i64>, out: &mut Vec<Entry>) {
    let ttl = match (inherited, v2_ttl(node)) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    if node.dir {
        for child in &node.nodes {
            collect_v2(child, ttl, out);
        }
        return;
    }
    if let Some(key) = &node.key {
        out.push(Entry {
            key: key.as_bytes().to_vec(),
            value: node
                .value
                .as_deref()
                .unwrap_or_default()
                .as_bytes()
                .to_vec(),
            ttl,
            lease: 0,
        });
    }
}

/// Percent-encodes each segment of a v2 path for a URL.
pub(crate) fn v2_url(endpoint: &str, key: &[u8]) -> String {
    let mut url = format!("{endpoint}/v2/keys");
    for segment in key.split(|b| *b == b'/').filter(|s| !s.is_empty()) {
        url.push('/');
        url.extend(percent_encode(segment, UNRESERVED));
    }
    url
}

/// The form body that sets a v2 key's value.
pub(crate) fn form_encode(value: &[u8]) -> String {
    let mut out = String::with_capacity(value.len() + 6);
    out.push_str("value=");
    out.extend(percent_encode(value, UNRESERVED));
    out
}

/// Writes one v2 key, with a TTL if given.
pub async fn write_v2(
    client: &reqwest::Client,
    endpoint: &str,
    key: &[u8],
    value: &[u8],
    ttl: Option<i64>,
) -> Result<(), KeyspaceError> {
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
        .map_err(|err| request_failed("PUT", &url, err))?;
    let status = response.status();
    if status.is_success() {
        return Ok(());
    }
    let body = response.text().await.unwrap_or_default();
    Err(KeyspaceError::V2Status {
        method: "PUT",
        url,
        status: status.as_u16(),
        body: body.trim().to_string(),
    })
}

/// Writes v2 keys, each with its TTL, [`super::WRITES_IN_FLIGHT`] at a
/// time; the first failure ends it. The order they land in is etcd's:
/// every caller writes leaves of distinct paths, none the parent of
/// another (`steps::to_etcd2::check_v2_compatible` and
/// `check_v2_side_fits` refuse anything else before a write; a v2 store
/// read back gives leaves only), into a copy that is read back and
/// compared before it is used.
pub async fn write_all_v2(endpoint: &str, entries: &[Entry]) -> Result<(), KeyspaceError> {
    let client = http_client()?;
    super::each_in_flight(entries, super::WRITES_IN_FLIGHT, |entry| {
        write_v2(&client, endpoint, &entry.key, &entry.value, entry.ttl)
    })
    .await
}

/// One v2 DELETE; a node already gone (404) is not an error. True when it
/// deleted something.
async fn delete_v2_node(client: &reqwest::Client, url: &str) -> Result<bool, KeyspaceError> {
    let response = client
        .delete(url)
        .send()
        .await
        .map_err(|err| request_failed("DELETE", url, err))?;
    let status = response.status();
    if status.is_success() {
        return Ok(true);
    }
    if status.as_u16() == 404 {
        return Ok(false);
    }
    let body = response.text().await.unwrap_or_default();
    Err(KeyspaceError::V2Status {
        method: "DELETE",
        url: url.to_string(),
        status: status.as_u16(),
        body: body.trim().to_string(),
    })
}

/// Deletes every top-level node of the v2 store (recursively), leaving the
/// internal membership nodes, which the keys API does not list; and the
/// `hidden` nodes, which it does not list either (a recursive delete of a
/// visible directory takes its hidden children with it, so only those at
/// the top matter; the others answer 404).
pub async fn delete_v2_tree(endpoint: &str, hidden: &[String]) -> Result<usize, KeyspaceError> {
    let client = http_client()?;
    let url = format!("{endpoint}/v2/keys/");
    let response = client
        .get(&url)
        .send()
        .await
        .map_err(|err| request_failed("GET", &url, err))?;
    let body = response
        .text()
        .await
        .map_err(|err| request_failed("GET", &url, err))?;
    let root = parse(&url, &body)?;
    let mut deleted = 0;
    for node in &root.nodes {
        let Some(key) = &node.key else {
            continue;
        };
        let node_url = format!(
            "{}{}",
            v2_url(endpoint, key.as_bytes()),
            if node.dir { "?recursive=true" } else { "" }
        );
        // A listed node counts as deleted even if it expired meanwhile.
        delete_v2_node(&client, &node_url).await?;
        deleted += 1;
    }
    for path in hidden {
        let node_url = format!("{}?recursive=true", v2_url(endpoint, path.as_bytes()));
        if delete_v2_node(&client, &node_url).await? {
            deleted += 1;
        }
    }
    Ok(deleted)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_answer_type_reads_every_kind_of_v2_answer() {
        // A miss: the error code, no node (the lock's and the
        // announcements' "not there yet").
        let miss: V2Answer = serde_json::from_str(
            r#"{"errorCode":100,"message":"Key not found","cause":"/etcd-migrate/lock","index":7}"#,
        )
        .unwrap();
        assert_eq!(miss.error_code, Some(V2_NOT_FOUND));
        assert!(miss.node.is_none());
        // A write: the action and the node, the node before it ignored.
        let set: V2Answer = serde_json::from_str(
            r#"{"action":"compareAndSwap","node":{"key":"/l","value":"b","ttl":30,"expiration":"2026-11-29T00:00:30Z","modifiedIndex":9,"createdIndex":8},"prevNode":{"key":"/l","value":"a","modifiedIndex":8,"createdIndex":8}}"#,
        )
        .unwrap();
        assert_eq!(set.error_code, None);
        assert_eq!(set.action, "compareAndSwap");
        let node = set.node.unwrap();
        assert_eq!(
            (node.key.as_deref(), node.value.as_deref(), node.ttl),
            (Some("/l"), Some("b"), Some(30))
        );
        assert_eq!(node.modified_index, 9);
        // A listing: directories and their children.
        let root = parse(
            "test",
            r#"{"action":"get","node":{"dir":true,"nodes":[{"key":"/d","dir":true,"nodes":[{"key":"/d/k","value":"v","modifiedIndex":3}]}]}}"#,
        )
        .unwrap();
        assert!(root.dir);
        assert_eq!(root.nodes[0].nodes[0].value.as_deref(), Some("v"));
        // A 2xx answer without a node is an error, not an empty store.
        assert!(matches!(
            parse("test", r#"{"action":"get"}"#),
            Err(KeyspaceError::V2NoNode { .. })
        ));
    }
}
