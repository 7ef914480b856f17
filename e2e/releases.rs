//! End-to-end tests that need etcd releases no registry has: 2.2.1,
//! 2.3.7, 3.0.17, 3.1.20, 3.2.32, 3.4.31+, 3.6 and 3.7, from the dir
//! `$ETCD_EXTRA_BIN_DIR` names (see README). Every case is its own test
//! (libtest-mimic), and one whose binaries are missing is listed as
//! ignored after a NOT RUN line naming them: the runner's count says what
//! ran, never "passed" for a case that did not.
//!
//! - `old_releases`: every adjacent transition 2.2 … 3.7 up and down, the
//!   storage migration at 3.0 … 3.4, etcd's downgrade 3.7 → 3.5 → 3.4.45,
//!   and the whole walks.
//! - `present`: today's releases: upstream's patch floors, a flag 3.7
//!   removed, 3.7 never the first etcd on a WAL it cannot replay, and a
//!   restore from a snapshot on 3.6 and 3.7.
//! - `v2_baseline`: etcd2 data's baseline replayed offline, proven by the
//!   first step's read, and its fallback to a start.
//! - `by_hand`: the steps by hand for a cluster no pause job takes
//!   (docs/cluster-pause.md): 3.0.17/etcd3 to 2.2.1/etcd2 and 3.1.20 to
//!   3.0.17, three members each.

// The harness is `e2e`'s; this target uses part of it.
mod by_hand;
#[allow(dead_code)]
mod harness;
mod old_releases;
mod present;
mod v2_baseline;

use libtest_mimic::Arguments;

fn main() {
    let args = Arguments::from_args();
    let mut trials = old_releases::trials();
    trials.extend(present::trials());
    trials.extend(v2_baseline::trials());
    trials.extend(by_hand::trials());
    libtest_mimic::run(&args, trials).exit();
}
