//! Cluster tests (issue 11): multi-member etcd clusters of the image under
//! test, one container per member on a private Docker network with its own
//! address, peer and client TLS with certificates made in the test, a
//! client writing throughout, and the invariants checked on every monitor
//! round and at the end. Run with `make cluster-test`, or with
//! `ETCD_MIGRATE_IMAGE=<tag> cargo test --test cluster`; without that
//! variable every scenario prints `cluster tests: NOT RUN` and why.
//!
//! - `harness`: containers, network, certificates, writer, monitor, checks.
//! - `refusals`: the safety floor on a live cluster: a member restarted
//!   with a new target through `migrate-if-needed.sh` (`--no-exec`, which
//!   cannot coordinate a roll) is refused (exit 2) and the cluster keeps
//!   quorum, its writes and its membership; the member then rejoins; the
//!   same for a rollback target on a 3.5 cluster; a new member joining a
//!   3.3 cluster with TARGET_VERSION=3.5.16 on an empty data dir is refused.
//! - `upgrades`: the rolling upgrades the members' entrypoints coordinate
//!   (3.3 → 3.4 → 3.5 with 3 and 5 members, the `examples/ha/` sets as
//!   written, all restarted at once, a member offline through a wave, lock
//!   holders SIGKILLed at each point of their restart, a holder cut off, a
//!   target lowered mid-wave).
//! - `restarts`: restarts, kills and cuts at one version (no version
//!   change) keep quorum and every write; the monitor proven to catch a
//!   member run by hand two minors ahead.

mod harness;

mod refusals;
mod restarts;
mod upgrades;
