//! This module owns the multi-member cluster mode (issue 11): how the
//! entrypoints of a cluster's members roll it to the target one minor at a
//! time, coordinated through the cluster itself. So far:
//! - `decide`: the pure decision each member makes on what it observes;
//! - `observe`: reading the peer `/version` and `/members` answers and
//!   assembling one round's view (pure);
//! - `peer`: asking the peer endpoints over the member's peer TLS;
//! - `client`: the client API (leader, alarms, leadership transfer);
//! - `lock`: the upgrade lock in the cluster (v3 lease, v2 TTL);
//! - `announce`: each member's announced target, which tells a member
//!   whether the operator's rollout is over;
//! - `settings`: the member's TLS files and URLs from its etcd settings;
//! - `join`: the safety floor for a member with no data yet;
//! - `self_join`: such a member adding itself to the membership;
//! - `force`: one surviving member made a cluster of one when the quorum
//!   is lost;
//! - `pause`: the whole-cluster pause job, for the targets no cluster
//!   takes member by member (etcd2 -> etcd3, rollbacks without an online
//!   way);
//! - `roll`: the observe → decide → act loop of one member, behind three
//!   small seams (the cluster, our etcd, the data dir's records);
//! - `member`: the real side of those seams;
//! - `entry`: the cluster mode's entry from the run (seams built from the
//!   configuration and the data, the loop, the exit code).

/// Where the cluster mode keeps its own records in the cluster's store
/// (the lock, announcements, proofs, pause jobs; v2 on 2.x clusters, v3
/// after): no user key lives below it.
pub const RECORDS_DIR: &str = "/etcd-migrate";

pub mod announce;
pub mod client;
pub mod decide;
pub mod entry;
pub mod force;
pub mod join;
pub mod lock;
pub mod member;
pub mod observe;
pub mod pause;
pub mod peer;
pub mod roll;
pub mod self_join;
pub mod settings;

pub use decide::{decide, Behind, Decision, Goal, Member, Own, Reach, Refusal, View, Waiting};
