//! This module owns the multi-member cluster mode (issue 11): how the
//! entrypoints of a cluster's members roll it to the target one minor at a
//! time, coordinated through the cluster itself. So far it holds the pure
//! decision each member makes on what it observes (`decide`) and the pure
//! reading and assembling of what the members' peer endpoints say
//! (`observe`); fetching those over the peer TLS, the lock in the cluster,
//! leadership transfer and the restart as a member come behind the
//! executor's effect traits.

pub mod client;
pub mod decide;
pub mod lock;
pub mod observe;
pub mod peer;

pub use decide::{decide, Behind, Decision, Goal, Member, Own, Reach, Refusal, View, Waiting};
