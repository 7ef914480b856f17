//! This module owns the v2 request a WAL entry carries
//! (`etcdserverpb.Request`), decoded to the fields that the replay
//! ([`super::state`]) and the v2 name set ([`super::keys`]) read. Both read
//! it; neither owns it, so it sits below them.

use super::proto::{self, Fields, ProtoError};

/// A v2 request (`etcdserverpb.Request`), the fields that matter.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct V2Request {
    pub(super) method: String,
    pub(super) path: String,
    pub(super) val: String,
    pub(super) prev_value: String,
    pub(super) prev_index: u64,
    pub(super) prev_exist: Option<bool>,
    pub(super) dir: bool,
    pub(super) expiration: i64,
    pub(super) recursive: bool,
    /// A `SYNC`'s moment (Unix nanoseconds): nodes expiring by then go.
    pub(super) time: i64,
    /// 2.3+: a TTL refresh that keeps the value.
    pub(super) refresh: bool,
}

impl V2Request {
    /// Decodes one from its wire form.
    pub(super) fn parse(buf: &[u8]) -> Result<Self, ProtoError> {
        let mut request = V2Request::default();
        let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        for field in Fields::new(buf) {
            match field? {
                (2, proto::Value::Bytes(b)) => request.method = text(b),
                (3, proto::Value::Bytes(b)) => request.path = text(b),
                (4, proto::Value::Bytes(b)) => request.val = text(b),
                (6, proto::Value::Bytes(b)) => request.prev_value = text(b),
                (7, proto::Value::Varint(v)) => request.prev_index = v,
                (5, proto::Value::Varint(v)) => request.dir = v != 0,
                (8, proto::Value::Varint(v)) => request.prev_exist = Some(v != 0),
                (9, proto::Value::Varint(v)) => request.expiration = v as i64,
                (12, proto::Value::Varint(v)) => request.recursive = v != 0,
                (15, proto::Value::Varint(v)) => request.time = v as i64,
                (17, proto::Value::Varint(v)) => request.refresh = v != 0,
                _ => {}
            }
        }
        Ok(request)
    }

    /// A request of `method` to `path` (`flags`: `dir`, `recursive`,
    /// `ttl`, `prevValue`), for tests.
    #[cfg(test)]
    pub(super) fn for_test(method: &str, path: &str, flags: &[&str]) -> Self {
        V2Request {
            method: method.to_string(),
            path: path.to_string(),
            dir: flags.contains(&"dir"),
            recursive: flags.contains(&"recursive"),
            expiration: if flags.contains(&"ttl") { 1 } else { 0 },
            prev_value: if flags.contains(&"prevValue") {
                "v".to_string()
            } else {
                String::new()
            },
            ..V2Request::default()
        }
    }

    /// Its method (`PUT`, `POST`, `DELETE`, `SYNC`, …).
    pub fn method(&self) -> &str {
        &self.method
    }

    /// Its full store path.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// Whether it creates its node when absent: an unconditional `PUT`
    /// (or a create, `prevExist=false`); a compare-and-swap or an update
    /// only changes an existing node.
    pub fn creates(&self) -> bool {
        self.method == "PUT"
            && self.prev_value.is_empty()
            && self.prev_index == 0
            && self.prev_exist != Some(true)
    }

    /// Whether it makes a dir (a `DELETE`: whether it may delete one).
    pub fn dir(&self) -> bool {
        self.dir
    }

    /// Whether a `DELETE` takes a dir with everything below it.
    pub fn recursive(&self) -> bool {
        self.recursive
    }

    /// Whether it holds only if the node is as it says (`prevValue`,
    /// `prevIndex`, `prevExist`).
    pub fn conditional(&self) -> bool {
        !self.prev_value.is_empty() || self.prev_index > 0 || self.prev_exist.is_some()
    }

    /// Whether the node it writes expires.
    pub fn expires(&self) -> bool {
        self.expiration != 0
    }
}
