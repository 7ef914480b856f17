//! This module owns the proof of a member that joined a converted cluster
//! on etcd2 storage (etcd3 → etcd2 by a pause job): its v2 store equal to
//! the converter's at one index, while the cluster takes writes.
//!
//! etcd's `HashKV` covers the v3 keyspace only, and the v2 API has no read
//! at a fixed index. What it has: a recursive GET answers from the
//! member's own store under the store's lock, with the store's index in
//! `X-Etcd-Index`; and every member keeps the last 1,000 events of its
//! store (`?wait=true&waitIndex=N` answers the first event at or after
//! `N` from that history at once). So each member's store is read once;
//! the events between the two reads' indexes are taken from the member
//! read at the later one and replayed onto the earlier read
//! ([`replay`]); the two must then be equal ([`first_difference`]). The
//! cluster's own log brings every member through the same events, so this
//! shows the joiner's store, brought to the later index, is the
//! converter's.
//!
//! What is compared: every node the v2 API lists (directories and leaves,
//! a leaf's value, whether a node expires). Hidden nodes (a segment
//! starting with `_`) are not listed, so a cluster whose data has them is
//! not taken to etcd2 by a pause job (held before the go,
//! [`super::fit`]). A TTL refresh is no event in etcd's history; it
//! keeps the value and the TTL's presence, which is all that is compared.
//! `e2e/pause_v2_proof.rs` holds the replay to etcd's own history on real
//! 3.3.25, every kind of event among it.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::cluster::peer::TlsFiles;
use crate::keyspace::{is_hidden_v2, V2Answer, V2Node};
use crate::log::error_chain;

/// How long a history request may wait: etcd answers one that has an
/// event at once, and holds one that has none until a write comes; a
/// request held this long means no event is left up to the later read's
/// index (if one was missed, the stores differ and the proof fails, so a
/// slow answer can only cost a retry).
const HISTORY_WAIT: Duration = Duration::from_millis(700);

/// At most this many events are replayed in one proof: etcd keeps 1,000.
const MAX_EVENTS: usize = 1000;

/// One node as the proof compares it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Node {
    /// A directory; whether it expires.
    Dir { expires: bool },
    /// A leaf: its value and whether it expires.
    Leaf { value: String, expires: bool },
}

/// One member's v2 store as its API lists it, at its store index.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Store {
    /// `X-Etcd-Index` of the read.
    pub index: u64,
    /// Every listed node by its path (no root, no hidden node).
    pub nodes: BTreeMap<String, Node>,
}

/// One event of a store's history, as the proof replays it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// Its index (the node's `modifiedIndex`).
    pub index: u64,
    /// etcd's action: set, create, update, compareAndSwap, delete,
    /// compareAndDelete, expire.
    pub action: String,
    /// The node's path.
    pub key: String,
    /// The node after the event (none for a removal).
    pub node: Node,
}

/// A node as the proof compares it. A node in its last second is listed
/// with its expiration and no TTL (0 is left out of the JSON): it expires
/// all the same.
fn node_of(json: &V2Node) -> Node {
    let expires = json.ttl.is_some() || json.expiration.is_some();
    if json.dir {
        Node::Dir { expires }
    } else {
        Node::Leaf {
            value: json.value.clone().unwrap_or_default(),
            expires,
        }
    }
}

/// Every listed node under `json` by its path, hidden ones left out.
fn collect(json: &V2Node, out: &mut BTreeMap<String, Node>) {
    for child in &json.nodes {
        let Some(key) = &child.key else { continue };
        if is_hidden_v2(key.as_bytes()) {
            continue;
        }
        out.insert(key.clone(), node_of(child));
        collect(child, out);
    }
}

/// The node an answer holds, or why it is no answer of the keys API.
fn answer_of(url: &str, body: &str, what: &str) -> Result<(String, V2Node), String> {
    let answer: V2Answer =
        serde_json::from_str(body).map_err(|e| format!("{url}: not a v2 {what}: {e}"))?;
    let node = answer
        .node
        .ok_or_else(|| format!("{url}: not a v2 {what}: no node in {}", body.trim()))?;
    Ok((answer.action, node))
}

/// Applies `events` (in index order, each past `store.index`) to
/// `store`, as etcd's v2 store applied them: a write sets its node (a
/// directory keeps its children; missing parents become permanent
/// directories), a removal takes the node and everything under it.
/// Events on hidden nodes are left out, as the listing leaves them out.
pub fn replay(store: &mut Store, events: &[Event]) {
    for event in events {
        store.index = store.index.max(event.index);
        if is_hidden_v2(event.key.as_bytes()) {
            continue;
        }
        match event.action.as_str() {
            "delete" | "compareAndDelete" | "expire" => {
                let below = format!("{}/", event.key);
                store.nodes.remove(&event.key);
                let doomed: Vec<String> = store
                    .nodes
                    .range(below.clone()..)
                    .take_while(|(k, _)| k.starts_with(&below))
                    .map(|(k, _)| k.clone())
                    .collect();
                for key in doomed {
                    store.nodes.remove(&key);
                }
            }
            _ => {
                let mut parent = event.key.as_str();
                while let Some(cut) = parent.rfind('/').filter(|&i| i > 0) {
                    parent = &parent[..cut];
                    store
                        .nodes
                        .entry(parent.to_string())
                        .or_insert(Node::Dir { expires: false });
                }
                store.nodes.insert(event.key.clone(), event.node.clone());
            }
        }
    }
}

/// The first node where `a` and `b` differ, said for the log; `None` when
/// they hold the same nodes.
pub fn first_difference(a: &Store, b: &Store) -> Option<String> {
    let mut left = a.nodes.iter();
    let mut right = b.nodes.iter();
    loop {
        match (left.next(), right.next()) {
            (None, None) => return None,
            (Some((k, _)), None) => return Some(format!("{k} only on the first")),
            (None, Some((k, _))) => return Some(format!("{k} only on the second")),
            (Some((ka, na)), Some((kb, nb))) => {
                if ka != kb {
                    let (key, side) = if ka < kb {
                        (ka, "first")
                    } else {
                        (kb, "second")
                    };
                    return Some(format!("{key} only on the {side}"));
                }
                if na != nb {
                    return Some(format!("{ka}: {na:?} against {nb:?}"));
                }
            }
        }
    }
}

/// A joined member's v2 store proven equal to the converter's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Proven {
    /// The store index both stand at.
    pub index: u64,
    /// The nodes listed there.
    pub nodes: usize,
    /// The events replayed onto the earlier read.
    pub replayed: usize,
}

/// Member `endpoint`'s whole v2 store (its own, not a quorum read).
pub async fn read_store(http: &reqwest::Client, endpoint: &str) -> Result<Store, String> {
    let url = format!(
        "{}/v2/keys/?recursive=true&sorted=true",
        endpoint.trim_end_matches('/')
    );
    let response = http
        .get(&url)
        .send()
        .await
        .map_err(|e| format!("{url}: {}", error_chain(&e)))?;
    let status = response.status();
    let index = response
        .headers()
        .get("X-Etcd-Index")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let body = response
        .text()
        .await
        .map_err(|e| format!("{url}: {}", error_chain(&e)))?;
    if !status.is_success() {
        return Err(format!("{url}: {status}: {}", body.trim()));
    }
    let index = index.ok_or_else(|| format!("{url}: no X-Etcd-Index in the answer"))?;
    let (_, root) = answer_of(&url, &body, "answer")?;
    let mut nodes = BTreeMap::new();
    collect(&root, &mut nodes);
    Ok(Store { index, nodes })
}

/// The events of member `endpoint`'s history after `after` up to
/// `upto` (that member's store has reached `upto`).
pub async fn events_between(
    tls: Option<&TlsFiles>,
    endpoint: &str,
    after: u64,
    upto: u64,
) -> Result<Vec<Event>, String> {
    let http = crate::cluster::peer::http_client(tls, HISTORY_WAIT).map_err(|e| e.to_string())?;
    let mut events = Vec::new();
    let mut next = after + 1;
    while next <= upto {
        if events.len() >= MAX_EVENTS {
            return Err(format!(
                "more than {MAX_EVENTS} events between the two reads ({after} to {upto})"
            ));
        }
        let url = format!(
            "{}/v2/keys/?wait=true&recursive=true&waitIndex={next}",
            endpoint.trim_end_matches('/')
        );
        let response = match http.get(&url).send().await {
            Ok(response) => response,
            // Held: no event is left up to `upto` (see HISTORY_WAIT).
            Err(e) if e.is_timeout() => break,
            Err(e) => return Err(format!("{url}: {}", error_chain(&e))),
        };
        let status = response.status();
        let body = match response.text().await {
            Ok(body) => body,
            Err(e) if e.is_timeout() => break,
            Err(e) => return Err(format!("{url}: {}", error_chain(&e))),
        };
        if !status.is_success() {
            // 401 with errorCode 401: the history no longer reaches back
            // to `next` (more than 1,000 events since).
            return Err(format!("{url}: {status}: {}", body.trim()));
        }
        let (action, node) = answer_of(&url, &body, "event")?;
        let index = node.modified_index;
        if index < next {
            return Err(format!(
                "{url}: an event at index {index}, before the one asked for"
            ));
        }
        if index > upto {
            break;
        }
        events.push(Event {
            index,
            action,
            key: node.key.clone().unwrap_or_default(),
            node: node_of(&node),
        });
        next = index + 1;
    }
    Ok(events)
}

/// The proof: `ours` and `theirs` (client URLs) read once each, the
/// events between taken from whichever read later and replayed onto the
/// other; when equal, the index both stand at, the nodes and the events
/// replayed; else what differs.
pub async fn same_v2_store(
    tls: Option<&TlsFiles>,
    ours: &[String],
    theirs: &[String],
    timeout: Duration,
) -> Result<Proven, String> {
    let http = crate::cluster::peer::http_client(tls, timeout).map_err(|e| e.to_string())?;
    let own_url = ours.first().ok_or("this member has no client URL")?;
    let mine = read_store(&http, own_url).await?;
    let mut last = String::from("no client URL of the converter");
    for url in theirs {
        let other = match read_store(&http, url).await {
            Ok(store) => store,
            Err(why) => {
                last = why;
                continue;
            }
        };
        let (mut low, high, high_url) = if mine.index <= other.index {
            (mine, other, url.as_str())
        } else {
            (other, mine, own_url.as_str())
        };
        let events = events_between(tls, high_url, low.index, high.index).await?;
        replay(&mut low, &events);
        return match first_difference(&low, &high) {
            None => Ok(Proven {
                index: high.index,
                nodes: high.nodes.len(),
                replayed: events.len(),
            }),
            Some(diff) => Err(format!(
                "the v2 stores differ at index {} ({} events replayed): {diff}",
                high.index,
                events.len()
            )),
        };
    }
    Err(last)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leaf(value: &str, expires: bool) -> Node {
        Node::Leaf {
            value: value.to_string(),
            expires,
        }
    }

    fn dir(expires: bool) -> Node {
        Node::Dir { expires }
    }

    fn store(index: u64, nodes: &[(&str, Node)]) -> Store {
        Store {
            index,
            nodes: nodes
                .iter()
                .map(|(k, n)| (k.to_string(), n.clone()))
                .collect(),
        }
    }

    fn event(index: u64, action: &str, key: &str, node: Node) -> Event {
        Event {
            index,
            action: action.to_string(),
            key: key.to_string(),
            node,
        }
    }

    /// `base` at `index`, less `gone`, with `set`.
    fn changed(base: &Store, index: u64, gone: &[&str], set: &[(&str, Node)]) -> Store {
        let mut out = base.clone();
        out.index = index;
        for key in gone {
            out.nodes.remove(*key);
        }
        for (key, node) in set {
            out.nodes.insert(key.to_string(), node.clone());
        }
        out
    }

    #[test]
    fn replay_applies_writes_and_removals_as_the_v2_store_does() {
        let before = store(
            10,
            &[
                ("/a", dir(false)),
                ("/a/x", leaf("1", false)),
                ("/a/y", leaf("2", true)),
                ("/b", dir(true)),
                ("/b/z", leaf("3", false)),
                ("/ab", leaf("keep", false)),
            ],
        );
        let cases: Vec<(&str, Vec<Event>, Store)> = vec![
            ("no event: unchanged", vec![], before.clone()),
            (
                "a set replaces a leaf's value and TTL",
                vec![event(11, "set", "/a/x", leaf("9", true))],
                changed(&before, 11, &[], &[("/a/x", leaf("9", true))]),
            ),
            (
                "a create under new directories makes them permanent",
                vec![event(12, "create", "/c/d/e", leaf("n", false))],
                changed(
                    &before,
                    12,
                    &[],
                    &[
                        ("/c", dir(false)),
                        ("/c/d", dir(false)),
                        ("/c/d/e", leaf("n", false)),
                    ],
                ),
            ),
            (
                "a directory's update keeps its children",
                vec![event(13, "update", "/b", dir(false))],
                changed(&before, 13, &[], &[("/b", dir(false))]),
            ),
            (
                "a directory's expiry takes its children, not a sibling sharing its prefix",
                vec![event(14, "expire", "/a", dir(false))],
                changed(&before, 14, &["/a", "/a/x", "/a/y"], &[]),
            ),
            (
                "deletes and compare-and-deletes remove leaves; a CAS sets",
                vec![
                    event(15, "delete", "/a/x", leaf("", false)),
                    event(16, "compareAndDelete", "/a/y", leaf("", false)),
                    event(17, "compareAndSwap", "/b/z", leaf("4", false)),
                ],
                changed(
                    &before,
                    17,
                    &["/a/x", "/a/y"],
                    &[("/b/z", leaf("4", false))],
                ),
            ),
            (
                "events on hidden nodes are left out, as the listing leaves them",
                vec![
                    event(18, "set", "/_h", leaf("x", false)),
                    event(19, "set", "/a/_h/k", leaf("x", false)),
                    event(20, "delete", "/b/_z", leaf("", false)),
                ],
                changed(&before, 20, &[], &[]),
            ),
        ];
        for (why, events, want) in cases {
            let mut got = before.clone();
            replay(&mut got, &events);
            assert_eq!(got, want, "{why}");
        }
    }

    #[test]
    fn first_difference_names_the_node() {
        let a = store(5, &[("/a", leaf("1", false)), ("/b", leaf("2", false))]);
        let cases: Vec<(&str, Store, Option<&str>)> = vec![
            ("equal", a.clone(), None),
            (
                "the index alone does not differ",
                Store {
                    index: 9,
                    ..a.clone()
                },
                None,
            ),
            (
                "a value",
                store(5, &[("/a", leaf("1", false)), ("/b", leaf("3", false))]),
                Some("/b: "),
            ),
            (
                "the TTL's presence",
                store(5, &[("/a", leaf("1", true)), ("/b", leaf("2", false))]),
                Some("/a: "),
            ),
            (
                "a node missing on the second",
                store(5, &[("/a", leaf("1", false))]),
                Some("/b only on the first"),
            ),
            (
                "a node missing on the first",
                store(
                    5,
                    &[
                        ("/a", leaf("1", false)),
                        ("/aa", leaf("x", false)),
                        ("/b", leaf("2", false)),
                    ],
                ),
                Some("/aa only on the second"),
            ),
            (
                "a leaf against a directory",
                store(5, &[("/a", dir(false)), ("/b", leaf("2", false))]),
                Some("/a: "),
            ),
        ];
        for (why, b, want) in cases {
            let got = first_difference(&a, &b);
            match want {
                None => assert_eq!(got, None, "{why}"),
                Some(prefix) => assert!(
                    got.as_deref().is_some_and(|g| g.starts_with(prefix)),
                    "{why}: {got:?}"
                ),
            }
        }
    }

    #[test]
    fn a_listing_parses_into_nodes_without_hidden_ones() {
        let body = r#"{"action":"get","node":{"dir":true,"nodes":[
            {"key":"/a","dir":true,"modifiedIndex":4,"nodes":[
                {"key":"/a/x","value":"1","modifiedIndex":5},
                {"key":"/a/_h","value":"h","modifiedIndex":6},
                {"key":"/a/t","value":"2","expiration":"2026-11-29T00:00:00Z","modifiedIndex":7}]},
            {"key":"/e","dir":true,"ttl":30,"expiration":"2026-11-29T00:00:00Z","modifiedIndex":8}]}}"#;
        let (action, root) = answer_of("test", body, "answer").expect("parse");
        assert_eq!(action, "get");
        let mut nodes = BTreeMap::new();
        collect(&root, &mut nodes);
        let want: BTreeMap<String, Node> = [
            ("/a", dir(false)),
            ("/a/t", leaf("2", true)),
            ("/a/x", leaf("1", false)),
            ("/e", dir(true)),
        ]
        .into_iter()
        .map(|(k, n)| (k.to_string(), n))
        .collect();
        assert_eq!(nodes, want);
        // An event's index is its node's.
        let (_, event) = answer_of(
            "test",
            r#"{"action":"set","node":{"key":"/k","value":"v","modifiedIndex":9}}"#,
            "event",
        )
        .expect("an event");
        assert_eq!(event.modified_index, 9);
        // A 2xx body with no node is no listing (not an empty store).
        let empty = answer_of("test", r#"{"action":"get"}"#, "answer");
        assert!(empty.is_err(), "{empty:?}");
    }
}
