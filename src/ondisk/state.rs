//! This module owns what etcd's state machine makes of its log, as far as
//! [`super::OnDisk`] reports it: the v2 store's membership, cluster
//! version, v2 auth flag and hidden nodes (from a snapshot, then WAL
//! entries), and the v3 auth flag and leases (from bolt, then WAL
//! entries). It turns each log entry into the few effects that matter
//! here and applies them as etcd's appliers do (`etcdserver/apply_v2.go`,
//! `applyConfChange`, `auth/store.go`, `lease/lessor.go`, v2.2 … v3.5),
//! including the requests etcd refuses (a member added twice, auth enabled
//! without a root user), so a refused proposal in the log changes nothing.

use std::collections::{btree_map, BTreeMap, BTreeSet};

use serde::Deserialize;

use super::keys::V2Names;
use super::proto::{self, Fields, ProtoError};
use super::v2request::V2Request;
use super::v2store::V2Store;
use super::wal::{Entry, ENTRY_CONF_CHANGE, ENTRY_NORMAL};
use super::MemberOnDisk;

/// The v2 store path of the cluster version.
const VERSION_PATH: &str = "/0/version";
/// Members live under this v2 store dir, one dir per id in hex.
const MEMBERS_DIR: &str = "/0/members/";
/// Removed member ids are kept under this dir.
const REMOVED_DIR: &str = "/0/removed_members/";
/// The v2 auth switch (etcd 2.1+, `etcdserver/auth`): JSON `true`/`false`.
const V2_AUTH_PATH: &str = "/2/enabled";
/// User keys of the v2 API live under this prefix.
const KEYS_PREFIX: &str = "/1";
/// v3 auth's root user and role, the only ones that decide whether auth
/// can be enabled.
const ROOT: &[u8] = b"root";

/// A damaged log could make a note of every entry; the first ones say
/// what is wrong, the rest are counted.
pub const MAX_PROBLEMS: usize = 20;

/// `raftpb.ConfChangeType`.
const CONF_ADD: u64 = 0;
const CONF_REMOVE: u64 = 1;
const CONF_UPDATE: u64 = 2;
const CONF_ADD_LEARNER: u64 = 3;

/// `InternalRaftRequest` field numbers (`raft_internal.proto`, v3.0–v3.5).
mod irr {
    pub const V2: u64 = 2;
    pub const PUT: u64 = 4;
    pub const DELETE_RANGE: u64 = 5;
    pub const TXN: u64 = 6;
    pub const LEASE_GRANT: u64 = 8;
    pub const LEASE_REVOKE: u64 = 9;
    pub const AUTH_ENABLE: u64 = 1000;
    pub const AUTH_DISABLE: u64 = 1011;
    pub const USER_ADD: u64 = 1100;
    pub const USER_DELETE: u64 = 1101;
    pub const USER_GRANT_ROLE: u64 = 1104;
    pub const USER_REVOKE_ROLE: u64 = 1105;
    pub const CLUSTER_VERSION_SET: u64 = 1300;
    pub const MEMBER_ATTR_SET: u64 = 1301;
}

/// A member as etcd writes it into a conf change's context (and into
/// bolt's `members` bucket): `membership.Member`, flattened, plus 3.4's
/// `isPromote`. Go's nil slices arrive as `null`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct MemberJson {
    /// The member id.
    #[serde(default)]
    pub id: u64,
    /// Peer URLs.
    #[serde(rename = "peerURLs", default)]
    pub peer_urls: Option<Vec<String>>,
    /// Learner (3.4+).
    #[serde(rename = "isLearner", default)]
    pub is_learner: bool,
    /// Name (present in bolt and in the bootstrap conf changes).
    #[serde(default)]
    pub name: String,
    /// Client URLs.
    #[serde(rename = "clientURLs", default)]
    pub client_urls: Option<Vec<String>>,
    /// A learner's promotion (3.4+), sent as an `AddNode`.
    #[serde(rename = "isPromote", default)]
    pub is_promote: bool,
}

/// `/0/members/<id>/raftAttributes`.
#[derive(Debug, Clone, Default, Deserialize)]
struct RaftAttributesJson {
    #[serde(rename = "peerURLs", default)]
    peer_urls: Option<Vec<String>>,
    #[serde(rename = "isLearner", default)]
    is_learner: bool,
}

/// `/0/members/<id>/attributes`.
#[derive(Debug, Clone, Default, Deserialize)]
struct AttributesJson {
    #[serde(default)]
    name: String,
    #[serde(rename = "clientURLs", default)]
    client_urls: Option<Vec<String>>,
}

/// The v2 store as far as it is reported, and how it got there.
#[derive(Debug, Clone, Default)]
pub struct V2State {
    /// `/0/version`.
    pub cluster_version: Option<String>,
    /// Whether a WAL entry set the cluster version (it then outranks bolt).
    pub version_from_wal: bool,
    /// The first cluster version a WAL entry after the snapshot set.
    pub first_wal_version: Option<String>,
    /// The current members.
    pub members: BTreeMap<u64, MemberOnDisk>,
    /// Removed member ids.
    pub removed: BTreeSet<u64>,
    /// The raw value of `/2/enabled`, if the node exists.
    pub v2_auth: Option<String>,
    /// User-visible paths of hidden nodes.
    pub hidden: BTreeSet<String>,
    /// Things that did not decode, for the caller's notes (the first
    /// [`MAX_PROBLEMS`], then only counted).
    pub problems: Vec<String>,
    /// Problems beyond [`MAX_PROBLEMS`].
    pub more_problems: u64,
    /// The names of its nodes, when asked for (`None`: not kept).
    pub names: Option<V2Names>,
    /// Its user keys with their values and expiry, when asked for.
    pub store: Option<V2Store>,
    /// Members' attribute nodes seen in a snapshot before their
    /// `raftAttributes` (the store's children come sorted, so
    /// `attributes` comes first); merged by [`V2State::finish_snapshot`].
    pending_attributes: BTreeMap<u64, AttributesJson>,
}

/// The member id of a v2 store path `/0/members/<hex>/<leaf>`.
fn member_path(path: &str) -> Option<(u64, &str)> {
    let rest = path.strip_prefix(MEMBERS_DIR)?;
    let (hex, leaf) = rest.split_once('/')?;
    if hex.is_empty() || hex.len() > 16 || leaf.contains('/') {
        return None;
    }
    Some((u64::from_str_radix(hex, 16).ok()?, leaf))
}

impl V2State {
    /// Whether a snapshot node's value is needed (the others are skipped
    /// without being kept in memory): the cluster's own nodes, and the
    /// user keys where [`V2State::store`] keeps them.
    pub fn wants_value(&self, path: &str) -> bool {
        path == VERSION_PATH
            || path == V2_AUTH_PATH
            || path.starts_with(MEMBERS_DIR)
            || (self.store.is_some() && path.starts_with(KEYS_PREFIX))
    }

    /// Takes in one node of a snapshot's v2 store: its full path, when
    /// [`V2State::wants_value`] asked for it its value, whether it is a
    /// dir and its `ExpireTime` (Go's zero time, `0001-01-01T00:00:00Z`,
    /// is "never").
    pub fn snapshot_node(
        &mut self,
        path: &str,
        value: Option<String>,
        dir: bool,
        expire: Option<&str>,
    ) {
        let expires = expire.is_some_and(|at| !at.starts_with("0001-01-01"));
        if let Some(names) = self.names.as_mut() {
            names.snapshot_node(path, dir, expires);
        }
        self.note_hidden(path);
        if path.starts_with(KEYS_PREFIX) {
            if let Some(store) = self.store.as_mut() {
                store.snapshot_node(path, value, dir, expire);
            }
        } else if path == VERSION_PATH {
            self.cluster_version = value;
        } else if path == V2_AUTH_PATH {
            self.v2_auth = value;
        } else if let Some(hex) = path.strip_prefix(REMOVED_DIR) {
            if let Ok(id) = u64::from_str_radix(hex, 16) {
                self.removed.insert(id);
            }
        } else if let (Some((id, leaf)), Some(value)) = (member_path(path), value) {
            match leaf {
                "raftAttributes" => match serde_json::from_str::<RaftAttributesJson>(&value) {
                    Ok(raft) => {
                        let member = self.members.entry(id).or_insert_with(|| MemberOnDisk {
                            id,
                            ..MemberOnDisk::default()
                        });
                        member.peer_urls = raft.peer_urls.unwrap_or_default();
                        member.is_learner = raft.is_learner;
                    }
                    Err(err) => {
                        self.problem(format!("{path} in the snapshot is not member JSON: {err}"))
                    }
                },
                "attributes" => match serde_json::from_str::<AttributesJson>(&value) {
                    Ok(attributes) => {
                        self.pending_attributes.insert(id, attributes);
                    }
                    Err(err) => {
                        self.problem(format!("{path} in the snapshot is not member JSON: {err}"))
                    }
                },
                _ => {}
            }
        }
    }

    /// Notes a problem, within [`MAX_PROBLEMS`].
    fn problem(&mut self, what: String) {
        if self.problems.len() < MAX_PROBLEMS {
            self.problems.push(what);
        } else {
            self.more_problems += 1;
        }
    }

    /// Merges the attributes read from a snapshot into their members. A
    /// member dir without `raftAttributes` is no member (etcd refuses it).
    pub fn finish_snapshot(&mut self) {
        for (id, attributes) in std::mem::take(&mut self.pending_attributes) {
            if let Some(member) = self.members.get_mut(&id) {
                member.name = attributes.name;
                member.client_urls = attributes.client_urls.unwrap_or_default();
            }
        }
    }

    /// Records `path` (a full store path) if it names a user node whose
    /// own name starts with `_`: etcd's `IsHidden`, which the v2 API
    /// leaves out of every listing.
    fn note_hidden(&mut self, path: &str) {
        let Some(user) = path.strip_prefix(KEYS_PREFIX) else {
            return;
        };
        if !user.starts_with('/') {
            return;
        }
        if user
            .rsplit('/')
            .next()
            .is_some_and(|name| name.starts_with('_'))
        {
            self.hidden.insert(user.to_string());
        }
    }

    /// Records every node a v2 request to `path` creates or writes that is
    /// hidden (each prefix of the path whose last segment starts with `_`).
    fn note_hidden_prefixes(&mut self, path: &str) {
        let Some(user) = path.strip_prefix(KEYS_PREFIX) else {
            return;
        };
        if !user.starts_with('/') {
            return;
        }
        let mut prefix = String::new();
        for segment in user.split('/').filter(|s| !s.is_empty()) {
            prefix.push('/');
            prefix.push_str(segment);
            if segment.starts_with('_') {
                self.hidden.insert(prefix.clone());
            }
        }
    }

    fn set_attributes(&mut self, id: u64, name: String, client_urls: Vec<String>) {
        // etcd ignores a removed member's publish; an unknown one is a
        // panic in etcd, and nothing here.
        if let Some(member) = self.members.get_mut(&id) {
            member.name = name;
            member.client_urls = client_urls;
        }
    }

    fn set_version(&mut self, version: String) {
        if !self.version_from_wal {
            self.first_wal_version = Some(version.clone());
        }
        self.cluster_version = Some(version);
        self.version_from_wal = true;
    }

    fn apply_v2(&mut self, request: &V2Request) {
        if let Some(names) = self.names.as_mut() {
            names.apply(request);
        }
        if let Some(store) = self.store.as_mut() {
            store.apply(request);
        }
        match request.method.as_str() {
            "PUT" => {
                let conditional = request.prev_exist.is_some()
                    || request.prev_index > 0
                    || !request.prev_value.is_empty();
                if !conditional {
                    // etcd's default PUT branch: member attributes and the
                    // cluster version go to the cluster, not a plain set.
                    if let Some((id, "attributes")) = member_path(&request.path) {
                        match serde_json::from_str::<AttributesJson>(&request.val) {
                            Ok(a) => {
                                self.set_attributes(id, a.name, a.client_urls.unwrap_or_default())
                            }
                            Err(err) => self.problem(format!(
                                "a WAL entry publishing {} is not member JSON: {err}",
                                request.path
                            )),
                        }
                        return;
                    }
                    if request.path == VERSION_PATH {
                        self.set_version(request.val.clone());
                        return;
                    }
                }
                if request.path == V2_AUTH_PATH {
                    let exists = self.v2_auth.is_some();
                    let applies = match request.prev_exist {
                        Some(true) => exists,
                        Some(false) => !exists,
                        None => true,
                    } && (request.prev_value.is_empty()
                        || self.v2_auth.as_deref() == Some(request.prev_value.as_str()));
                    if applies {
                        self.v2_auth = Some(request.val.clone());
                    }
                }
                self.note_hidden_prefixes(&request.path);
            }
            "POST" => self.note_hidden_prefixes(&request.path),
            "DELETE"
                if request.path == V2_AUTH_PATH
                    && (request.prev_value.is_empty()
                        || self.v2_auth.as_deref() == Some(request.prev_value.as_str())) =>
            {
                self.v2_auth = None;
            }
            _ => {}
        }
    }

    fn apply_conf_change(&mut self, change: &ConfChange) {
        let id = change.node_id;
        match change.kind {
            CONF_ADD | CONF_ADD_LEARNER => {
                let Some(context) = &change.context else {
                    return;
                };
                if self.removed.contains(&id) || context.id != id {
                    return;
                }
                if context.is_promote {
                    if let Some(member) = self.members.get_mut(&id) {
                        member.is_learner = false;
                    }
                } else if let btree_map::Entry::Vacant(slot) = self.members.entry(id) {
                    // The store gets only the raft attributes; the name
                    // and client URLs come when the member publishes.
                    slot.insert(MemberOnDisk {
                        id,
                        name: String::new(),
                        peer_urls: context.peer_urls.clone().unwrap_or_default(),
                        client_urls: Vec::new(),
                        is_learner: context.is_learner,
                    });
                }
            }
            CONF_REMOVE if self.members.contains_key(&id) => {
                self.members.remove(&id);
                self.removed.insert(id);
            }
            CONF_UPDATE => {
                let Some(context) = &change.context else {
                    return;
                };
                if let Some(member) = self.members.get_mut(&id) {
                    member.peer_urls = context.peer_urls.clone().unwrap_or_default();
                    member.is_learner = context.is_learner;
                }
            }
            _ => {}
        }
    }
}

/// The v3 state that lives in bolt, as far as it is reported.
#[derive(Debug, Clone, Default)]
pub struct V3State {
    /// `auth/authEnabled`.
    pub auth_enabled: bool,
    /// Whether user `root` exists.
    pub root_exists: bool,
    /// Whether user `root` has role `root` (auth can be enabled).
    pub root_has_root_role: bool,
    /// Lease id → granted TTL (seconds).
    pub leases: BTreeMap<i64, i64>,
    /// Whether the log changes keys after bolt's consistent index (a put,
    /// a delete, a transaction, a lease revoke that deletes its keys):
    /// bolt's `key` bucket alone is then not the keyspace.
    pub keys_written: bool,
}

impl V3State {
    fn apply(&mut self, op: &V3Op) {
        match op {
            V3Op::KeysWritten => self.keys_written = true,
            V3Op::LeaseGrant { id, ttl } => {
                // A grant of an existing id is refused; one already in
                // bolt keeps the TTL etcd stored (raised to its minimum).
                self.leases.entry(*id).or_insert(*ttl);
            }
            V3Op::LeaseRevoke { id } => {
                self.leases.remove(id);
                self.keys_written = true;
            }
            V3Op::AuthEnable => {
                if self.root_exists && self.root_has_root_role {
                    self.auth_enabled = true;
                }
            }
            V3Op::AuthDisable => self.auth_enabled = false,
            V3Op::RootAdded => {
                if !self.root_exists {
                    self.root_exists = true;
                    self.root_has_root_role = false;
                }
            }
            V3Op::RootDeleted => {
                if !self.auth_enabled {
                    self.root_exists = false;
                    self.root_has_root_role = false;
                }
            }
            V3Op::RootRoleGranted => {
                if self.root_exists {
                    self.root_has_root_role = true;
                }
            }
            V3Op::RootRoleRevoked => {
                if self.root_exists && !self.auth_enabled {
                    self.root_has_root_role = false;
                }
            }
        }
    }
}

/// Whether applying `request` can change anything reported (with
/// `names`, every write outside `/0` does); the others are dropped at once
/// so the pending effects stay small.
fn matters(request: &V2Request, names: bool) -> bool {
    let path = request.path();
    path.starts_with("/0/")
        || path == V2_AUTH_PATH
        || (path.starts_with("/1/") && path.contains("/_"))
        || (names && !path.starts_with("/0/"))
}

/// A `raftpb.ConfChange` with its context decoded.
#[derive(Debug, Clone)]
struct ConfChange {
    kind: u64,
    node_id: u64,
    context: Option<MemberJson>,
}

/// A v3 operation that changes reported state.
#[derive(Debug, Clone, PartialEq, Eq)]
enum V3Op {
    /// A put, delete or transaction: the keyspace in bolt is not the
    /// keyspace any more.
    KeysWritten,
    LeaseGrant {
        id: i64,
        ttl: i64,
    },
    LeaseRevoke {
        id: i64,
    },
    AuthEnable,
    AuthDisable,
    RootAdded,
    RootDeleted,
    RootRoleGranted,
    RootRoleRevoked,
}

/// What one log entry does to reported state.
#[derive(Debug, Clone)]
enum Effect {
    V2(V2Request),
    ConfChange(ConfChange),
    /// 3.5's `ClusterVersionSet`: the v2 store and bolt both.
    ClusterVersion(String),
    /// 3.5's `ClusterMemberAttrSet`.
    MemberAttributes {
        id: u64,
        name: String,
        client_urls: Vec<String>,
    },
    V3(V3Op),
}

/// Decodes an entry's effects into `out` (empty); `proposal`: a normal
/// entry's, told apart. Undecodable proposals become a problem note and
/// no effect (etcd would panic on them at apply time).
fn effects(
    entry: &Entry<'_>,
    proposal: Option<Proposal<'_>>,
    state: &mut V2State,
    out: &mut Vec<Effect>,
) {
    let result = match (entry.kind, proposal) {
        (ENTRY_CONF_CHANGE, _) => conf_change_effects(entry.data, out),
        (ENTRY_NORMAL, Some(Proposal::Empty)) => Ok(()),
        (ENTRY_NORMAL, proposal) => normal_effects(
            entry.data,
            proposal.unwrap_or_else(|| Proposal::of(entry.data)),
            state.names.is_some() || state.store.is_some(),
            out,
        ),
        // EntryConfChangeV2: etcd never proposes one.
        _ => Ok(()),
    };
    if let Err(what) = result {
        state.problem(format!("WAL entry {}: {what}", entry.index));
        out.clear();
    }
}

fn conf_change_effects(data: &[u8], out: &mut Vec<Effect>) -> Result<(), String> {
    let mut change = ConfChange {
        kind: 0,
        node_id: 0,
        context: None,
    };
    let mut context: &[u8] = &[];
    for field in Fields::new(data) {
        match field.map_err(|e| format!("undecodable conf change: {e}"))? {
            (2, proto::Value::Varint(v)) => change.kind = v,
            (3, proto::Value::Varint(v)) => change.node_id = v,
            (4, proto::Value::Bytes(b)) => context = b,
            _ => {}
        }
    }
    // A removal carries no context; neither does a conf change raft
    // proposes itself (none in etcd's use), which changes no member.
    if change.kind != CONF_REMOVE && !context.is_empty() {
        change.context = Some(
            serde_json::from_slice(context)
                .map_err(|e| format!("conf change context is not member JSON: {e}"))?,
        );
    }
    out.push(Effect::ConfChange(change));
    Ok(())
}

/// A normal entry's proposal, told apart once per entry (a replay asks
/// three questions of each: bare or not, refused by 3.6, its effects).
///
/// Bare v2 `Request` or `InternalRaftRequest`: etcd tries
/// InternalRaftRequest first and falls back to a bare v2 Request (2.x,
/// and the v2 proposals of 3.x up to 3.5: its v2 API writes, its member
/// publish and its v2 cluster-version updates): a bare Request's field 2
/// is its method name, which never parses as a message. etcd 3.7 dropped
/// the fallback and panics on one ("unmarshal should never fail").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proposal<'a> {
    /// No data (raft's empty entry of a new term).
    Empty,
    /// A bare v2 `Request`: the whole data.
    Bare,
    /// An `InternalRaftRequest`; its last v2 field, if any.
    Internal { v2: Option<&'a [u8]> },
}

impl<'a> Proposal<'a> {
    /// Tells `data` apart (see [`Proposal`]).
    pub fn of(data: &'a [u8]) -> Self {
        if data.is_empty() {
            return Proposal::Empty;
        }
        // One walk of the top-level fields: all must decode, and the last
        // v2 field, if any, is a message too, for the entry to be an
        // InternalRaftRequest.
        let mut v2 = None;
        for field in Fields::new(data) {
            let Ok((number, value)) = field else {
                return Proposal::Bare;
            };
            if number == irr::V2 {
                v2 = value.bytes().or(v2);
            }
        }
        if v2.is_none_or(proto::is_message) {
            Proposal::Internal { v2 }
        } else {
            Proposal::Bare
        }
    }
}

/// Whether etcd 3.6 panics replaying this normal entry ("detected
/// disallowed v2 WAL"), told apart as `proposal`: a v2 request, bare or
/// wrapped, other than the two it converts (a member's attributes
/// publish, a cluster-version update).
pub fn refused_by_3_6(data: &[u8], proposal: Proposal<'_>) -> bool {
    let body = match proposal {
        Proposal::Empty | Proposal::Internal { v2: None } => return false,
        Proposal::Bare => data,
        Proposal::Internal { v2: Some(body) } => body,
    };
    let Ok(request) = V2Request::parse(body) else {
        return false;
    };
    let converted = request.method == "PUT"
        && (request.path == VERSION_PATH
            || matches!(member_path(&request.path), Some((_, "attributes"))));
    !converted
}

/// The effects of a normal entry; `names`: every v2 write matters (the
/// v2 store's names or keys are being kept).
fn normal_effects(
    data: &[u8],
    proposal: Proposal<'_>,
    names: bool,
    out: &mut Vec<Effect>,
) -> Result<(), String> {
    if proposal == Proposal::Bare {
        let request = V2Request::parse(data).map_err(|e| format!("undecodable v2 request: {e}"))?;
        if matters(&request, names) {
            out.push(Effect::V2(request));
        }
        return Ok(());
    }
    for field in Fields::new(data) {
        let (number, value) = field.map_err(bad("request"))?;
        let Some(body) = value.bytes() else {
            continue;
        };
        if let Some(effect) = internal_effect(number, body, names)? {
            out.push(effect);
        }
    }
    Ok(())
}

/// The error of an undecodable `what` in a normal entry.
fn bad(what: &'static str) -> impl Fn(ProtoError) -> String {
    move |e| format!("undecodable {what}: {e}")
}

/// The effect of one InternalRaftRequest field (`number`, its `body`), if
/// it is one this module follows.
fn internal_effect(number: u64, body: &[u8], names: bool) -> Result<Option<Effect>, String> {
    Ok(match number {
        irr::V2 => {
            let request = V2Request::parse(body).map_err(bad("v2 request"))?;
            matters(&request, names).then_some(Effect::V2(request))
        }
        irr::PUT | irr::DELETE_RANGE | irr::TXN => Some(Effect::V3(V3Op::KeysWritten)),
        irr::LEASE_GRANT => Some(Effect::V3(V3Op::LeaseGrant {
            ttl: proto::varint_field(body, 1).map_err(bad("lease grant"))? as i64,
            id: proto::varint_field(body, 2).map_err(bad("lease grant"))? as i64,
        })),
        irr::LEASE_REVOKE => Some(Effect::V3(V3Op::LeaseRevoke {
            id: proto::varint_field(body, 1).map_err(bad("lease revoke"))? as i64,
        })),
        irr::AUTH_ENABLE => Some(Effect::V3(V3Op::AuthEnable)),
        irr::AUTH_DISABLE => Some(Effect::V3(V3Op::AuthDisable)),
        irr::USER_ADD | irr::USER_DELETE | irr::USER_GRANT_ROLE | irr::USER_REVOKE_ROLE => {
            root_effect(number, body)?.map(Effect::V3)
        }
        irr::CLUSTER_VERSION_SET => {
            let version = proto::bytes_field(body, 1).map_err(bad("cluster version"))?;
            Some(Effect::ClusterVersion(
                String::from_utf8_lossy(version.unwrap_or_default()).into_owned(),
            ))
        }
        irr::MEMBER_ATTR_SET => Some(member_attributes_effect(body)?),
        _ => None,
    })
}

/// What a user add/delete or role grant/revoke does to root: only the
/// `root` user (and, for roles, the `root` role) matters.
fn root_effect(number: u64, body: &[u8]) -> Result<Option<V3Op>, String> {
    if number == irr::USER_ADD || number == irr::USER_DELETE {
        let user = proto::bytes_field(body, 1).map_err(bad("user request"))?;
        let op = if number == irr::USER_ADD {
            V3Op::RootAdded
        } else {
            V3Op::RootDeleted
        };
        return Ok((user == Some(ROOT)).then_some(op));
    }
    let user = proto::bytes_field(body, 1).map_err(bad("role request"))?;
    let role = proto::bytes_field(body, 2).map_err(bad("role request"))?;
    let op = if number == irr::USER_GRANT_ROLE {
        V3Op::RootRoleGranted
    } else {
        V3Op::RootRoleRevoked
    };
    Ok((user == Some(ROOT) && role == Some(ROOT)).then_some(op))
}

/// A member attributes update: the member's id, name and client URLs.
fn member_attributes_effect(body: &[u8]) -> Result<Effect, String> {
    let id = proto::varint_field(body, 1).map_err(bad("member attributes"))?;
    let attributes = proto::bytes_field(body, 2)
        .map_err(bad("member attributes"))?
        .unwrap_or_default();
    let name = proto::bytes_field(attributes, 1).map_err(bad("member attributes"))?;
    Ok(Effect::MemberAttributes {
        id,
        name: String::from_utf8_lossy(name.unwrap_or_default()).into_owned(),
        client_urls: proto::strings_field(attributes, 2).map_err(bad("member attributes"))?,
    })
}

/// Replays the log onto the states: entries after `v2_from` change the
/// v2 state, entries after `v3_from` the v3 state. Entries are applied in
/// log order once committed; an entry that reappears at a lower index
/// (a new leader overwrote the tail) drops the pending ones it replaces.
/// Whatever is still pending at the end of the log is applied too: a
/// single member commits its whole log when it next starts (in a
/// multi-member cluster a new leader may discard it).
#[derive(Debug)]
pub struct Replay {
    /// The v2 state.
    pub v2: V2State,
    /// The v3 state (none for etcd2 data).
    pub v3: Option<V3State>,
    v2_from: u64,
    v3_from: u64,
    commit: u64,
    pending: BTreeMap<u64, Vec<Effect>>,
    /// The lowest pending entry whose only effect is a write of keys
    /// past bolt (nearly every entry of a large log): kept as its index
    /// alone, since that effect only ever sets `keys_written`, whatever
    /// the order; dropped with a rewritten tail from it on.
    pending_write: Option<u64>,
    /// One entry's effects, reused.
    scratch: Vec<Effect>,
}

impl Replay {
    /// Starts from `v2` (a snapshot's store, at index `v2_from`) and `v3`
    /// (bolt, consistent up to `v3_from`).
    pub fn new(v2: V2State, v2_from: u64, v3: Option<V3State>, v3_from: u64) -> Self {
        Replay {
            v2,
            v3,
            v2_from,
            v3_from: v3_from.max(v2_from),
            commit: 0,
            pending: BTreeMap::new(),
            pending_write: None,
            scratch: Vec::new(),
        }
    }

    /// Takes in one entry; `proposal`: a normal entry's, if told apart
    /// already (else it is here).
    pub fn entry(&mut self, entry: &Entry<'_>, proposal: Option<Proposal<'_>>) {
        // A rewritten tail: what was pending from here on is gone (rare:
        // the split is only made when there is such a tail).
        if self
            .pending
            .last_key_value()
            .is_some_and(|(last, _)| *last >= entry.index)
        {
            let _ = self.pending.split_off(&entry.index);
        }
        if self.pending_write.is_some_and(|first| first >= entry.index) {
            self.pending_write = None;
        }
        if entry.index <= self.v2_from {
            return;
        }
        let mut effects = std::mem::take(&mut self.scratch);
        effects.clear();
        self::effects(entry, proposal, &mut self.v2, &mut effects);
        let only_a_write = matches!(effects[..], [Effect::V3(V3Op::KeysWritten)]);
        if entry.index <= self.commit {
            self.apply(entry.index, &effects);
        } else if only_a_write {
            // Any earlier pending write is below this one (a rewritten
            // tail from here on dropped the rest above): the lowest stays.
            self.pending_write.get_or_insert(entry.index);
        } else if !effects.is_empty() {
            self.pending
                .insert(entry.index, std::mem::take(&mut effects));
        }
        self.scratch = effects;
    }

    /// The pending write at or below `upto`, applied (see
    /// [`Replay::pending_write`]).
    fn apply_pending_write(&mut self, upto: u64) {
        if let Some(index) = self.pending_write.filter(|i| *i <= upto) {
            self.pending_write = None;
            self.apply(index, &[Effect::V3(V3Op::KeysWritten)]);
        }
    }

    /// Takes in a hard state: entries up to its commit are applied.
    pub fn commit(&mut self, commit: u64) {
        self.commit = self.commit.max(commit);
        // Usually everything pending is committed at once: no split then.
        let later = match self.pending.last_key_value() {
            Some((last, _)) if *last > self.commit => {
                self.pending.split_off(&self.commit.saturating_add(1))
            }
            _ => BTreeMap::new(),
        };
        let ready = std::mem::replace(&mut self.pending, later);
        for (index, effects) in ready {
            self.apply(index, &effects);
        }
        self.apply_pending_write(self.commit);
    }

    /// Applies what is still pending and returns the states.
    pub fn finish(mut self) -> (V2State, Option<V3State>) {
        for (index, effects) in std::mem::take(&mut self.pending) {
            self.apply(index, &effects);
        }
        self.apply_pending_write(u64::MAX);
        (self.v2, self.v3)
    }

    fn apply(&mut self, index: u64, effects: &[Effect]) {
        let v3_applies = index > self.v3_from;
        for effect in effects {
            match effect {
                Effect::V2(request) => self.v2.apply_v2(request),
                Effect::ConfChange(change) => self.v2.apply_conf_change(change),
                Effect::ClusterVersion(version) => self.v2.set_version(version.clone()),
                Effect::MemberAttributes {
                    id,
                    name,
                    client_urls,
                } => self
                    .v2
                    .set_attributes(*id, name.clone(), client_urls.clone()),
                Effect::V3(op) => {
                    if let (true, Some(v3)) = (v3_applies, self.v3.as_mut()) {
                        v3.apply(op);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ondisk::proto::encode::{field_bytes, field_varint};

    /// A v2 request as gogo writes it: ID, Method, Path, Val, then the
    /// non-nullable rest.
    fn v2_request(method: &str, path: &str, val: &str) -> Vec<u8> {
        let mut out = field_varint(1, 42);
        out.extend(field_bytes(2, method.as_bytes()));
        out.extend(field_bytes(3, path.as_bytes()));
        out.extend(field_bytes(4, val.as_bytes()));
        out.extend(field_varint(5, 0));
        out.extend(field_bytes(6, b""));
        out.extend(field_varint(7, 0));
        out
    }

    fn entry(index: u64, kind: u64, data: &[u8]) -> Entry<'_> {
        Entry {
            kind,
            term: 1,
            index,
            data,
        }
    }

    fn conf_change(kind: u64, id: u64, context: &str) -> Vec<u8> {
        let mut out = field_varint(1, 0);
        out.extend(field_varint(2, kind));
        out.extend(field_varint(3, id));
        out.extend(field_bytes(4, context.as_bytes()));
        out
    }

    #[test]
    fn bare_and_wrapped_v2_requests_both_apply() {
        let bare = v2_request("PUT", "/0/version", "2.3.0");
        let wrapped = field_bytes(irr::V2, &v2_request("PUT", "/0/version", "3.4.0"));
        let mut replay = Replay::new(V2State::default(), 0, None, 0);
        replay.entry(&entry(1, ENTRY_NORMAL, &bare), None);
        replay.commit(1);
        assert_eq!(replay.v2.cluster_version.as_deref(), Some("2.3.0"));
        replay.entry(&entry(2, ENTRY_NORMAL, &wrapped), None);
        let (v2, _) = replay.finish();
        assert_eq!(v2.cluster_version.as_deref(), Some("3.4.0"));
        assert!(v2.version_from_wal);
        assert_eq!(v2.first_wal_version.as_deref(), Some("2.3.0"));
    }

    #[test]
    fn etcd_3_6_replays_only_the_v2_requests_it_converts() {
        let converted = [
            v2_request("PUT", "/0/version", "3.5.0"),
            v2_request("PUT", "/0/members/8e9e05c52164694d/attributes", "{}"),
            field_bytes(irr::V2, &v2_request("PUT", "/0/version", "3.5.0")),
        ];
        for data in &converted {
            assert!(!refused_by_3_6(data, Proposal::of(data)));
        }
        let refused = [
            v2_request("PUT", "/1/coreos.com/network/config", "{}"),
            v2_request("DELETE", "/1/a", ""),
            v2_request("SYNC", "", ""),
            field_bytes(irr::V2, &v2_request("PUT", "/2/enabled", "false")),
        ];
        for data in &refused {
            assert!(refused_by_3_6(data, Proposal::of(data)));
        }
        // A v3 request is no v2 request at all.
        let v3 = field_bytes(irr::LEASE_REVOKE, &field_varint(1, 7));
        assert!(!refused_by_3_6(&v3, Proposal::of(&v3)));
    }

    #[test]
    fn membership_follows_conf_changes_and_publishes() {
        let add = conf_change(
            CONF_ADD,
            10,
            r#"{"id":10,"peerURLs":["http://a:2380"],"name":"a"}"#,
        );
        let add_b = conf_change(
            CONF_ADD_LEARNER,
            11,
            r#"{"id":11,"peerURLs":["http://b:2380"],"isLearner":true}"#,
        );
        let publish = v2_request(
            "PUT",
            "/0/members/a/attributes",
            r#"{"name":"a","clientURLs":["http://a:2379"]}"#,
        );
        let promote = conf_change(
            CONF_ADD,
            11,
            r#"{"id":11,"peerURLs":["http://b:2380"],"isPromote":true}"#,
        );
        let remove = conf_change(CONF_REMOVE, 10, "");
        let re_add = conf_change(CONF_ADD, 10, r#"{"id":10,"peerURLs":["http://a:2380"]}"#);
        let mut replay = Replay::new(V2State::default(), 0, None, 0);
        replay.entry(&entry(1, ENTRY_CONF_CHANGE, &add), None);
        replay.entry(&entry(2, ENTRY_CONF_CHANGE, &add_b), None);
        replay.entry(&entry(3, ENTRY_NORMAL, &publish), None);
        replay.commit(3);
        let a = &replay.v2.members[&10];
        assert_eq!((a.name.as_str(), a.client_urls.len()), ("a", 1));
        assert!(replay.v2.members[&11].is_learner);
        assert_eq!(replay.v2.members[&11].name, "", "never published");
        replay.entry(&entry(4, ENTRY_CONF_CHANGE, &promote), None);
        replay.entry(&entry(5, ENTRY_CONF_CHANGE, &remove), None);
        replay.entry(&entry(6, ENTRY_CONF_CHANGE, &re_add), None);
        let (v2, _) = replay.finish();
        assert_eq!(v2.members.keys().copied().collect::<Vec<_>>(), [11]);
        assert!(!v2.members[&11].is_learner);
        assert!(v2.removed.contains(&10), "a removed id cannot come back");
    }

    #[test]
    fn an_overwritten_tail_is_dropped() {
        let old = v2_request("PUT", "/0/version", "9.9.0");
        let new = v2_request("PUT", "/0/version", "3.1.0");
        let mut replay = Replay::new(V2State::default(), 0, None, 0);
        replay.commit(1);
        replay.entry(&entry(2, ENTRY_NORMAL, &old), None);
        replay.entry(&entry(3, ENTRY_NORMAL, &old), None);
        // A new leader rewrote the log from index 2.
        replay.entry(&entry(2, ENTRY_NORMAL, &new), None);
        // A garbage hard state cannot overflow the commit index.
        replay.commit(u64::MAX);
        let (v2, _) = replay.finish();
        assert_eq!(v2.cluster_version.as_deref(), Some("3.1.0"));
    }

    #[test]
    fn a_commit_inside_the_pending_entries_applies_only_those_it_covers() {
        let first = v2_request("PUT", "/0/version", "3.0.0");
        let uncommitted = v2_request("PUT", "/0/version", "9.9.0");
        let rewritten = v2_request("PUT", "/0/version", "3.1.0");
        let mut replay = Replay::new(V2State::default(), 0, None, 0);
        replay.entry(&entry(1, ENTRY_NORMAL, &first), None);
        replay.entry(&entry(2, ENTRY_NORMAL, &uncommitted), None);
        replay.commit(1);
        assert_eq!(replay.v2.cluster_version.as_deref(), Some("3.0.0"));
        assert_eq!(replay.pending.keys().copied().collect::<Vec<_>>(), [2]);
        // Entry 2 was never committed: a new leader's entry 2 replaces it.
        replay.entry(&entry(2, ENTRY_NORMAL, &rewritten), None);
        replay.commit(2);
        assert!(replay.pending.is_empty());
        assert_eq!(replay.v2.cluster_version.as_deref(), Some("3.1.0"));
    }

    /// A put past bolt, pending as its index alone: dropped with a tail a
    /// new leader rewrote, counted once a commit covers it or the log
    /// ends; never below bolt's consistent index.
    #[test]
    fn a_pending_write_counts_once_committed_and_not_once_rewritten() {
        let put = field_bytes(irr::PUT, &field_bytes(1, b"k"));
        let empty: [u8; 0] = [];
        let written = |steps: &dyn Fn(&mut Replay)| {
            let mut replay = Replay::new(V2State::default(), 0, Some(V3State::default()), 1);
            steps(&mut replay);
            let (_, v3) = replay.finish();
            v3.expect("v3").keys_written
        };
        // Below bolt's consistent index: bolt has it already.
        assert!(!written(&|r| {
            r.entry(&entry(1, ENTRY_NORMAL, &put), None);
            r.commit(1);
        }));
        // Pending, then committed.
        assert!(written(&|r| {
            r.entry(&entry(2, ENTRY_NORMAL, &put), None);
            assert!(!r.v3.as_ref().expect("v3").keys_written, "not yet");
            r.commit(2);
            assert!(r.v3.as_ref().expect("v3").keys_written);
        }));
        // Pending at the end of the log: a single member commits it.
        assert!(written(&|r| r.entry(&entry(2, ENTRY_NORMAL, &put), None)));
        // Rewritten from its index on by a new leader's empty entry.
        assert!(!written(&|r| {
            r.entry(&entry(2, ENTRY_NORMAL, &put), None);
            r.entry(&entry(3, ENTRY_NORMAL, &put), None);
            r.entry(&entry(2, ENTRY_NORMAL, &empty), None);
        }));
        // Rewritten above it: the write below stays.
        assert!(written(&|r| {
            r.entry(&entry(2, ENTRY_NORMAL, &put), None);
            r.entry(&entry(3, ENTRY_NORMAL, &put), None);
            r.entry(&entry(3, ENTRY_NORMAL, &empty), None);
            r.commit(3);
        }));
    }

    #[test]
    fn entries_before_the_snapshot_are_skipped() {
        let old = v2_request("PUT", "/0/version", "2.2.0");
        let snapshot = V2State {
            cluster_version: Some("3.0.0".into()),
            ..V2State::default()
        };
        let mut replay = Replay::new(snapshot, 5, None, 0);
        replay.entry(&entry(5, ENTRY_NORMAL, &old), None);
        let (v2, _) = replay.finish();
        assert_eq!(v2.cluster_version.as_deref(), Some("3.0.0"));
        assert!(!v2.version_from_wal);
    }

    #[test]
    fn auth_enable_needs_root_with_the_root_role() {
        let enable = field_bytes(irr::AUTH_ENABLE, b"");
        let user = field_bytes(irr::USER_ADD, &field_bytes(1, b"root"));
        let mut grant = field_bytes(1, b"root");
        grant.extend(field_bytes(2, b"root"));
        let grant = field_bytes(irr::USER_GRANT_ROLE, &grant);
        let mut replay = Replay::new(V2State::default(), 0, Some(V3State::default()), 0);
        for (i, data) in [&enable, &user, &enable].into_iter().enumerate() {
            replay.entry(&entry(i as u64 + 1, ENTRY_NORMAL, data), None);
        }
        replay.commit(3);
        assert!(
            !replay.v3.as_ref().unwrap().auth_enabled,
            "refused: no root role"
        );
        replay.entry(&entry(4, ENTRY_NORMAL, &grant), None);
        replay.entry(&entry(5, ENTRY_NORMAL, &enable), None);
        let (_, v3) = replay.finish();
        assert!(v3.unwrap().auth_enabled);
    }

    #[test]
    fn leases_granted_and_revoked_after_bolt() {
        let mut grant = field_varint(1, 60);
        grant.extend(field_varint(2, 7));
        let grant = field_bytes(irr::LEASE_GRANT, &grant);
        let revoke = field_bytes(irr::LEASE_REVOKE, &field_varint(1, 5));
        let bolt = V3State {
            leases: BTreeMap::from([(5, 100), (7, 3)]),
            ..V3State::default()
        };
        let mut replay = Replay::new(V2State::default(), 0, Some(bolt), 10);
        replay.entry(&entry(9, ENTRY_NORMAL, &revoke), None); // already in bolt
        replay.entry(&entry(11, ENTRY_NORMAL, &grant), None); // refused: exists
        let (_, v3) = replay.finish();
        assert_eq!(v3.unwrap().leases, BTreeMap::from([(5, 100), (7, 3)]));
    }

    #[test]
    fn hidden_nodes_from_snapshot_and_requests() {
        let mut state = V2State::default();
        state.snapshot_node("/1/_hidden", None, false, None);
        state.snapshot_node("/1/dir/_h/x", None, false, None);
        state.snapshot_node("/1/visible", None, false, None);
        state.snapshot_node("/0/_internal", None, false, None);
        let mut replay = Replay::new(state, 0, None, 0);
        let put = v2_request("PUT", "/1/a/_b/c/_d", "v");
        replay.entry(&entry(1, ENTRY_NORMAL, &put), None);
        let (v2, _) = replay.finish();
        assert_eq!(
            v2.hidden.into_iter().collect::<Vec<_>>(),
            ["/_hidden", "/a/_b", "/a/_b/c/_d"]
        );
    }

    #[test]
    fn garbage_entries_are_notes_not_panics() {
        let mut replay = Replay::new(V2State::default(), 0, Some(V3State::default()), 0);
        for (i, data) in [
            &[0xffu8; 7][..],
            b"PUT",
            &[0x12, 0x50],
            &conf_change(0, 1, "{"),
        ]
        .into_iter()
        .enumerate()
        {
            for kind in [ENTRY_NORMAL, ENTRY_CONF_CHANGE, 2] {
                replay.entry(&entry(i as u64 + 1, kind, data), None);
            }
        }
        for index in 10..100 {
            replay.entry(&entry(index, ENTRY_CONF_CHANGE, b"\xff"), None);
        }
        let (v2, _) = replay.finish();
        assert_eq!(v2.problems.len(), MAX_PROBLEMS, "notes are bounded");
        assert!(v2.more_problems > 0);
        assert!(v2.members.is_empty());
    }
}
