//! This module owns the v2 store's user keys (the store's `/1`) as the
//! stopped data holds them, values and expiry included: the newest
//! snapshot's nodes, then the log's v2 writes applied as etcd's store
//! applies them (`etcdserver.applyRequest` and `store/store.go` of
//! v2.2 … v2.3). It is what a start of a 2.x release would serve, read
//! without that start: the baseline of etcd2 data (issue 30 item 3),
//! which the first step's own whole read then proves.
//!
//! Where a write's outcome depends on what is not kept here (a node's
//! modified index: `prevIndex`; a `POST`'s generated name, which is the
//! store's index; a 2.3 TTL refresh), or on a path etcd would clean
//! first, the store is marked unknown, saying why, and the baseline is
//! read by a start as before.

use std::collections::BTreeMap;
use std::time::{SystemTime, UNIX_EPOCH};

use super::v2request::V2Request;

/// The store's user key space: every v2 key lives below it.
const KEYS_DIR: &str = "/1";

/// etcd's `minExpireTime`: a created node whose expiry is before it is
/// permanent (2000-01-01T00:00:00Z, Unix nanoseconds).
const MIN_EXPIRE_NANOS: i64 = 946_684_800 * 1_000_000_000;

/// One node below `/1`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Node {
    dir: bool,
    value: String,
    /// When it expires (Unix nanoseconds); `None`: never.
    expires: Option<i64>,
}

impl Node {
    /// A node; a dir's value is empty whatever was given.
    fn new(dir: bool, value: &str, expires: Option<i64>) -> Node {
        let value = if dir {
            String::new()
        } else {
            value.to_string()
        };
        Node {
            dir,
            value,
            expires,
        }
    }
}

/// The v2 store's user nodes, by full store path (`/1/a/b`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct V2Store {
    nodes: BTreeMap<String, Node>,
    /// Why the nodes may not be what etcd would serve.
    unknown: Option<String>,
}

/// One v2 key as the keys API would list it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct V2Leaf {
    /// Its v2 path (`/a/b`).
    pub key: String,
    pub value: String,
    /// The earliest expiry on its path as a read lists it (Unix
    /// nanoseconds): its own, or a dir's above it (see `V2Store::leaves`).
    pub expires: Option<i64>,
}

impl V2Store {
    /// Takes in a snapshot node: its full path, value, whether it is a dir
    /// and its `ExpireTime` as Go wrote it (RFC 3339; Go's zero time is
    /// "never").
    pub(super) fn snapshot_node(
        &mut self,
        path: &str,
        value: Option<String>,
        dir: bool,
        expire: Option<&str>,
    ) {
        if !is_below_keys(path) {
            return;
        }
        let expires = match expire.map(go_time_nanos) {
            None | Some(Ok(None)) => None,
            Some(Ok(Some(nanos))) => Some(nanos),
            Some(Err(why)) => {
                self.mark_unknown(format!("the expiry of {path} in the snapshot: {why}"));
                return;
            }
        };
        let node = Node::new(dir, value.as_deref().unwrap_or_default(), expires);
        self.nodes.insert(path.to_string(), node);
    }

    /// Applies one v2 request of the log, as `applyRequest` does.
    pub(super) fn apply(&mut self, request: &V2Request) {
        if self.unknown.is_some() {
            return;
        }
        let path = request.path.as_str();
        let method = request.method.as_str();
        if method == "SYNC" {
            self.expire(request.time);
            return;
        }
        if !matches!(method, "PUT" | "POST" | "DELETE")
            || !(path == KEYS_DIR || is_below_keys(path))
        {
            return;
        }
        if !is_clean(path) {
            self.mark_unknown(format!("a {method} of {path:?}, a path etcd cleans first"));
            return;
        }
        if request.refresh {
            self.mark_unknown(format!("a TTL refresh of {path}"));
            return;
        }
        if request.prev_index > 0 {
            self.mark_unknown(format!(
                "a {method} of {path} on prevIndex {} (node indexes are not kept)",
                request.prev_index
            ));
            return;
        }
        let expires = request.expiration;
        match (method, request.prev_exist) {
            ("POST", _) => self.mark_unknown(format!(
                "a POST to {path} (the key's name is the store's index, not kept)"
            )),
            ("PUT", Some(true)) if request.prev_value.is_empty() => {
                self.update(path, &request.val, expires)
            }
            ("PUT", Some(false)) => self.create(path, request.dir, &request.val, expires, false),
            ("PUT", _) if !request.prev_value.is_empty() => {
                self.compare_and_swap(path, &request.prev_value, &request.val, expires)
            }
            ("PUT", _) => self.create(path, request.dir, &request.val, expires, true),
            ("DELETE", _) if !request.prev_value.is_empty() => {
                self.compare_and_delete(path, &request.prev_value)
            }
            ("DELETE", _) => self.delete(path, request.dir, request.recursive),
            _ => {}
        }
    }

    /// Why the nodes may not be what etcd would serve, if they may not.
    pub fn unknown(&self) -> Option<&str> {
        self.unknown.as_deref()
    }

    /// Every key as a recursive read of the keys API lists it, with the
    /// hidden nodes (a name starting with `_`) read one by one, as
    /// `keyspace::read_v2` does: a key's expiry is the earliest of its own
    /// and its dirs' down from where its read began (the store's root, or
    /// its nearest hidden node).
    pub fn leaves(&self) -> Vec<V2Leaf> {
        self.nodes
            .iter()
            .filter(|(_, node)| !node.dir)
            .map(|(path, node)| {
                let user = &path[KEYS_DIR.len()..];
                let mut expires: Option<i64> = None;
                let mut prefix = String::from(KEYS_DIR);
                for segment in user.split('/').filter(|s| !s.is_empty()) {
                    prefix.push('/');
                    prefix.push_str(segment);
                    if segment.starts_with('_') {
                        // A hidden node's read starts at it.
                        expires = None;
                    }
                    let own = self.nodes.get(&prefix).and_then(|n| n.expires);
                    expires = match (expires, own) {
                        (Some(a), Some(b)) => Some(a.min(b)),
                        (a, b) => a.or(b),
                    };
                }
                V2Leaf {
                    key: user.to_string(),
                    value: node.value.clone(),
                    expires,
                }
            })
            .collect()
    }

    fn mark_unknown(&mut self, why: String) {
        if self.unknown.is_none() {
            self.unknown = Some(why);
        }
    }

    /// `store.internalCreate`: `replace` for a `Set` (a key is replaced, a
    /// dir refuses), else a `Create` (any node refuses). Missing parents
    /// become permanent dirs; a key on the way refuses.
    fn create(&mut self, path: &str, dir: bool, value: &str, expires: i64, replace: bool) {
        if path == KEYS_DIR {
            return;
        }
        let parents = parents(path);
        if parents
            .iter()
            .any(|p| self.nodes.get(p).is_some_and(|n| !n.dir))
        {
            return;
        }
        match self.nodes.get(path) {
            Some(node) if node.dir || !replace => return,
            _ => {}
        }
        for parent in parents {
            self.nodes
                .entry(parent)
                .or_insert_with(|| Node::new(true, "", None));
        }
        let expires = Some(expires).filter(|e| *e >= MIN_EXPIRE_NANOS);
        self.nodes
            .insert(path.to_string(), Node::new(dir, value, expires));
    }

    /// `store.Update`: an existing node's value (a dir's may only stay
    /// empty) and its TTL, as given (none: permanent).
    fn update(&mut self, path: &str, value: &str, expires: i64) {
        if path == KEYS_DIR {
            return;
        }
        let Some(node) = self.nodes.get_mut(path) else {
            return;
        };
        if node.dir && !value.is_empty() {
            return;
        }
        if !node.dir {
            node.value = value.to_string();
        }
        node.expires = Some(expires).filter(|e| *e != 0);
    }

    /// `store.CompareAndSwap` on a value: an existing key holding
    /// `previous` takes `value` and the TTL given.
    fn compare_and_swap(&mut self, path: &str, previous: &str, value: &str, expires: i64) {
        if path == KEYS_DIR {
            return;
        }
        if let Some(node) = self
            .nodes
            .get_mut(path)
            .filter(|n| !n.dir && n.value == previous)
        {
            node.value = value.to_string();
            node.expires = Some(expires).filter(|e| *e != 0);
        }
    }

    /// `store.CompareAndDelete` on a value: an existing key holding
    /// `previous` goes.
    fn compare_and_delete(&mut self, path: &str, previous: &str) {
        if self
            .nodes
            .get(path)
            .is_some_and(|n| !n.dir && n.value == previous)
        {
            self.nodes.remove(path);
        }
    }

    /// `store.Delete`: a key; a dir only as a dir (`recursive` implies
    /// it), and only empty unless `recursive`.
    fn delete(&mut self, path: &str, dir: bool, recursive: bool) {
        if path == KEYS_DIR {
            return;
        }
        let Some(node) = self.nodes.get(path) else {
            return;
        };
        if node.dir {
            if !(dir || recursive) {
                return;
            }
            if !recursive && self.has_children(path) {
                return;
            }
        }
        self.remove_tree(path);
    }

    /// `store.DeleteExpiredKeys(cutoff)`: every node expiring by then goes,
    /// with what is below it.
    fn expire(&mut self, cutoff: i64) {
        let due: Vec<String> = self
            .nodes
            .iter()
            .filter(|(_, n)| n.expires.is_some_and(|e| e <= cutoff))
            .map(|(p, _)| p.clone())
            .collect();
        for path in due {
            self.remove_tree(&path);
        }
    }

    fn has_children(&self, path: &str) -> bool {
        let below = format!("{path}/");
        self.nodes
            .range(below.clone()..)
            .next()
            .is_some_and(|(p, _)| p.starts_with(&below))
    }

    fn remove_tree(&mut self, path: &str) {
        self.nodes.remove(path);
        let below = format!("{path}/");
        let doomed: Vec<String> = self
            .nodes
            .range(below.clone()..)
            .take_while(|(p, _)| p.starts_with(&below))
            .map(|(p, _)| p.clone())
            .collect();
        for path in doomed {
            self.nodes.remove(&path);
        }
    }
}

/// Whether `path` names a node below the user key space.
fn is_below_keys(path: &str) -> bool {
    path.strip_prefix(KEYS_DIR)
        .is_some_and(|rest| rest.starts_with('/') && rest.len() > 1)
}

/// Whether `path` is as `path.Clean` leaves it: no empty, `.` or `..`
/// segment, no trailing `/`.
fn is_clean(path: &str) -> bool {
    path.starts_with('/')
        && path[1..]
            .split('/')
            .all(|s| !s.is_empty() && s != "." && s != "..")
}

/// The dirs above `path`, below `/1`, outermost first.
fn parents(path: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut at = String::from(KEYS_DIR);
    let user = &path[KEYS_DIR.len()..];
    let segments: Vec<&str> = user.split('/').filter(|s| !s.is_empty()).collect();
    if let Some((_, above)) = segments.split_last() {
        for segment in above {
            at.push('/');
            at.push_str(segment);
            out.push(at.clone());
        }
    }
    out
}

/// A Go `time.Time` as its JSON gives it (RFC 3339 with up to nine
/// fractional digits, `Z` or an offset) in Unix nanoseconds; `None` for
/// Go's zero time, etcd's "never".
fn go_time_nanos(text: &str) -> Result<Option<i64>, String> {
    if text.starts_with("0001-01-01T00:00:00") {
        return Ok(None);
    }
    let bad = || format!("{text:?} is not an RFC 3339 time");
    let (local, offset_secs) = match text.strip_suffix('Z') {
        Some(local) => (local, 0i64),
        None => {
            let at = text.len().checked_sub(6).ok_or_else(bad)?;
            let (local, offset) = text.split_at(at);
            let sign = match offset.as_bytes()[0] {
                b'+' => 1,
                b'-' => -1,
                _ => return Err(bad()),
            };
            let (hours, minutes) = offset[1..].split_once(':').ok_or_else(bad)?;
            let hours: i64 = hours.parse().map_err(|_| bad())?;
            let minutes: i64 = minutes.parse().map_err(|_| bad())?;
            (local, sign * (hours * 3600 + minutes * 60))
        }
    };
    let utc = humantime::parse_rfc3339(&format!("{local}Z")).map_err(|_| bad())?;
    let since = utc.duration_since(UNIX_EPOCH).map_err(|_| bad())?;
    let nanos = i64::try_from(since.as_nanos()).map_err(|_| bad())?;
    Ok(Some(nanos - offset_secs * 1_000_000_000))
}

/// Now, in Unix nanoseconds.
pub fn now_nanos() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: i64 = 1_800_000_000 * 1_000_000_000;

    fn put(path: &str, value: &str) -> V2Request {
        V2Request {
            method: "PUT".into(),
            path: path.into(),
            val: value.into(),
            ..V2Request::default()
        }
    }

    /// Go's zero time: never.
    const NEVER: &str = "0001-01-01T00:00:00Z";

    /// A snapshot node: a key with `value`, or a dir without one.
    fn node(store: &mut V2Store, path: &str, value: Option<&str>, expire: &str) {
        store.snapshot_node(
            path,
            value.map(str::to_string),
            value.is_none(),
            Some(expire),
        );
    }

    fn store(ops: &[V2Request]) -> V2Store {
        let mut store = V2Store::default();
        node(&mut store, "/1/snap/a", Some("1"), NEVER);
        node(&mut store, "/1/snap", None, NEVER);
        node(&mut store, "/1/ttl", Some("t"), "2027-01-15T08:00:00.5Z");
        for op in ops {
            store.apply(op);
        }
        store
    }

    fn keys(store: &V2Store) -> Vec<Key> {
        store
            .leaves()
            .into_iter()
            .map(|l| (l.key, l.value, l.expires.is_some()))
            .collect()
    }

    /// A key, its value, whether it expires.
    type Key = (String, String, bool);

    fn k(key: &str, value: &str, ttl: bool) -> Key {
        (key.to_string(), value.to_string(), ttl)
    }

    #[test]
    fn the_log_is_applied_as_etcds_store_applies_it() {
        let with = |f: &dyn Fn(&mut V2Request)| {
            let mut r = put("/1/snap/a", "2");
            f(&mut r);
            r
        };
        let cases: Vec<(&str, Vec<V2Request>, Vec<Key>)> = vec![
            (
                "nothing",
                vec![],
                vec![k("/snap/a", "1", false), k("/ttl", "t", true)],
            ),
            (
                "a set makes its dirs, replaces a key, refuses a dir and a key on the way",
                vec![
                    put("/1/x/y/z", "v"),
                    put("/1/snap/a", "2"),
                    put("/1/snap", "no"),
                    put("/1/snap/a/b", "no"),
                ],
                vec![
                    k("/snap/a", "2", false),
                    k("/ttl", "t", true),
                    k("/x/y/z", "v", false),
                ],
            ),
            (
                "create refuses an existing node",
                vec![with(&|r| r.prev_exist = Some(false)), {
                    let mut r = put("/1/new", "n");
                    r.prev_exist = Some(false);
                    r
                }],
                vec![
                    k("/new", "n", false),
                    k("/snap/a", "1", false),
                    k("/ttl", "t", true),
                ],
            ),
            (
                "update needs the node, and makes it permanent without a TTL",
                vec![
                    {
                        let mut r = put("/1/ttl", "u");
                        r.prev_exist = Some(true);
                        r
                    },
                    {
                        let mut r = put("/1/gone", "u");
                        r.prev_exist = Some(true);
                        r
                    },
                ],
                vec![k("/snap/a", "1", false), k("/ttl", "u", false)],
            ),
            (
                "compare-and-swap on the value",
                vec![with(&|r| r.prev_value = "1".into()), {
                    let mut r = put("/1/ttl", "no");
                    r.prev_value = "other".into();
                    r
                }],
                vec![k("/snap/a", "2", false), k("/ttl", "t", true)],
            ),
            (
                "a set with a TTL, and a SYNC past it",
                vec![
                    with(&|r| r.expiration = T0),
                    V2Request {
                        method: "SYNC".into(),
                        time: T0,
                        ..V2Request::default()
                    },
                ],
                vec![k("/ttl", "t", true)],
            ),
            (
                "an expiry before 2000 is none on create",
                vec![with(&|r| r.expiration = 5)],
                vec![k("/snap/a", "2", false), k("/ttl", "t", true)],
            ),
            (
                "delete: a key, a dir only as one, a full dir only recursively",
                vec![
                    V2Request {
                        method: "DELETE".into(),
                        path: "/1/snap".into(),
                        ..V2Request::default()
                    },
                    V2Request {
                        method: "DELETE".into(),
                        path: "/1/snap".into(),
                        dir: true,
                        ..V2Request::default()
                    },
                    V2Request {
                        method: "DELETE".into(),
                        path: "/1/ttl".into(),
                        ..V2Request::default()
                    },
                ],
                vec![k("/snap/a", "1", false)],
            ),
            (
                "a recursive delete takes the tree; compare-and-delete on the value",
                vec![
                    V2Request {
                        method: "DELETE".into(),
                        path: "/1/snap".into(),
                        recursive: true,
                        ..V2Request::default()
                    },
                    V2Request {
                        method: "DELETE".into(),
                        path: "/1/ttl".into(),
                        prev_value: "no".into(),
                        ..V2Request::default()
                    },
                ],
                vec![k("/ttl", "t", true)],
            ),
            (
                "membership and auth writes are not keys",
                vec![put("/0/version", "2.3.0"), put("/2/enabled", "true")],
                vec![k("/snap/a", "1", false), k("/ttl", "t", true)],
            ),
        ];
        for (name, ops, want) in cases {
            let store = store(&ops);
            assert_eq!(store.unknown(), None, "{name}");
            assert_eq!(keys(&store), want, "{name}");
        }
    }

    #[test]
    fn what_the_store_does_not_keep_makes_it_unknown() {
        let cases: Vec<(V2Request, &str)> = vec![
            (
                V2Request {
                    prev_index: 7,
                    ..put("/1/snap/a", "2")
                },
                "prevIndex 7",
            ),
            (
                V2Request {
                    method: "POST".into(),
                    ..put("/1/queue", "job")
                },
                "POST to /1/queue",
            ),
            (
                V2Request {
                    refresh: true,
                    ..put("/1/ttl", "")
                },
                "refresh",
            ),
            (put("/1/a//b", "x"), "cleans"),
        ];
        for (op, why) in cases {
            let store = store(&[op]);
            let unknown = store.unknown().expect(why);
            assert!(unknown.contains(why), "{unknown}");
        }
        // A POST elsewhere (v2 auth) and a read change nothing here.
        let store = store(&[
            V2Request {
                method: "POST".into(),
                ..put("/2/users/x", "")
            },
            V2Request {
                method: "QGET".into(),
                ..put("/1/snap", "")
            },
        ]);
        assert_eq!(store.unknown(), None);
    }

    #[test]
    fn a_key_expires_with_its_dirs_down_from_where_its_read_begins() {
        let mut store = V2Store::default();
        node(&mut store, "/1/d", None, "2027-01-01T00:00:00Z");
        node(&mut store, "/1/d/k", Some("v"), NEVER);
        node(&mut store, "/1/d/_h", None, NEVER);
        node(&mut store, "/1/d/_h/k", Some("v"), NEVER);
        node(&mut store, "/1/e", Some("v"), "2027-01-01T01:00:00+01:00");
        let leaves = store.leaves();
        let expiry = |key: &str| leaves.iter().find(|l| l.key == key).expect(key).expires;
        let jan1 = go_time_nanos("2027-01-01T00:00:00Z").expect("time");
        assert_eq!(expiry("/d/k"), jan1);
        // Read from /d/_h on: the dir's TTL above is not listed with it.
        assert_eq!(expiry("/d/_h/k"), None);
        assert_eq!(expiry("/e"), jan1);
        assert!(go_time_nanos("yesterday").is_err());
        assert_eq!(go_time_nanos("0001-01-01T00:00:00Z"), Ok(None));
    }
}
