//! The rolling loop against a simulated cluster: two other members whose
//! releases a test sets (or changes as rounds pass), our member's etcd and
//! the data dir's records as fakes that log every effect, and failures
//! injected at each effect. The sequences asserted here are the order the
//! safety argument rests on: record only after a proof, the mark before a
//! start, leadership away before the stop, the lock released only after
//! our etcd is proven (or stopped, on failure).

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;

use super::*;
use crate::cluster::decide::{Member as ViewMember, Reach};
use crate::cluster::lock::Holder;
use crate::version::{Minor, Storage};

const OWN: u64 = 1;

fn v(text: &str) -> Version {
    text.parse().expect("version")
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct Fail(String);

/// The simulated world, shared by the three fakes.
#[derive(Default)]
struct World {
    /// The other members' releases (None: down), by id 2, 3, …
    others: Vec<Option<Version>>,
    /// What our etcd runs (None: stopped).
    own: Option<Version>,
    /// The cluster version.
    cv: Option<Minor>,
    lock: Option<u64>,
    leader: Option<u64>,
    rounds: usize,
    /// Effects, in order.
    log: Vec<String>,
    /// Injected failures.
    prove_fails: bool,
    /// The next releases of the lock fail (no quorum, say).
    release_failures: usize,
    etcd_exits_on_start_of: Option<Version>,
    /// Bring member `.0` up at release `.1` once this many rounds passed.
    comes_up: Option<(usize, usize, Version)>,
    /// Members whose peer TLS handshake with us fails, with why.
    tls_refused: BTreeMap<u64, String>,
    /// Raise a stop request at this round.
    stop_at_round: Option<usize>,
    stop: Option<watch::Sender<Option<Signal>>>,
    /// The data cannot be replayed by this release (3.7 on 3.5's WAL).
    replay_blocked: Option<Version>,
    /// A start with a snapshot after every entry clears `replay_blocked`.
    snapshot_cures: bool,
    /// The target of an enabled downgrade job.
    downgrade: Option<Minor>,
    /// The storage version our data records while our etcd is down.
    storage_on_disk: Option<Minor>,
    /// At this round, a member that just restarted tells this older
    /// cluster version (for a few milliseconds, on real etcd).
    stale_cluster_version: Option<(usize, Minor)>,
    /// The target our member announced.
    own_announced: Option<Version>,
    /// The target the other members announced (None: ours, the
    /// operator's rollout is over).
    others_announced: Option<Version>,
    /// At this round the operator's rollout reaches the others: from then
    /// on they announce ours.
    rollout_reaches_others_at: Option<usize>,
}

impl World {
    /// etcd's rule: the cluster version moves up to the lowest release
    /// only while every member answers, and never down; an enabled
    /// downgrade sets it to its target at once (3.6+), and the leader ends
    /// the job when every member runs it.
    fn cluster_version(&mut self) -> Option<Minor> {
        let all_up = self.own.is_some() && self.others.iter().all(Option::is_some);
        if let Some(to) = self.downgrade {
            self.cv = Some(to);
            let all_there = all_up
                && self
                    .others
                    .iter()
                    .flatten()
                    .chain(self.own.iter())
                    .all(|v| v.minor_line() == to);
            if all_there {
                self.downgrade = None;
                self.log.push("job ended by the leader".into());
            }
            return self.cv;
        }
        if all_up {
            let lowest = self
                .others
                .iter()
                .flatten()
                .chain(self.own.iter())
                .map(|v| v.minor_line())
                .min();
            self.cv = self.cv.max(lowest);
        }
        self.cv
    }

    fn view(&mut self) -> View {
        let mut members = vec![ViewMember {
            id: OWN,
            name: "own".into(),
            peer_urls: vec!["https://10.0.0.1:2380".into()],
            client_urls: vec![],
            is_learner: false,
            reach: self.own.map_or(Reach::Down(Duration::ZERO), Reach::Up),
            // etcd lowers the storage version once the cluster version
            // dropped: at once, here.
            storage: self
                .own
                .map(|own| own.minor_line().min(self.cv.unwrap_or(own.minor_line()))),
        }];
        for (i, release) in self.others.iter().enumerate() {
            members.push(ViewMember {
                id: i as u64 + 2,
                name: format!("m{}", i + 2),
                peer_urls: vec![format!("https://10.0.0.{}:2380", i + 2)],
                client_urls: vec![],
                is_learner: false,
                reach: release.map_or(Reach::Down(Duration::from_secs(30)), Reach::Up),
                storage: None,
            });
        }
        let cluster_version = self.cluster_version();
        View {
            cluster_version,
            members,
            alarms: vec![],
            leader: self.leader,
            tls_refused: self.tls_refused.clone(),
            lock: self.lock,
            downgrade: self.downgrade,
            announced: self.announced(),
        }
    }
}

impl World {
    /// Every member's announced target, ours included.
    fn announced(&self) -> BTreeMap<u64, Version> {
        let Some(ours) = self.own_announced else {
            return BTreeMap::new();
        };
        let theirs = self.others_announced.unwrap_or(ours);
        (0..self.others.len())
            .map(|i| (i as u64 + 2, theirs))
            .chain([(OWN, ours)])
            .collect()
    }
}

type Shared = Rc<RefCell<World>>;

struct FakeCluster(Shared);
struct FakeEtcd(Shared);
struct FakeLedger(Shared);

impl Coordination for FakeCluster {
    type Error = Fail;

    async fn peers(&mut self) -> View {
        self.0.borrow_mut().view()
    }

    async fn observe(&mut self) -> Result<View, Fail> {
        let mut w = self.0.borrow_mut();
        w.rounds += 1;
        let round = w.rounds;
        if let Some((index, at, release)) = w.comes_up {
            if round >= at {
                w.others[index] = Some(release);
            }
        }
        let stale = w
            .stale_cluster_version
            .filter(|(at, _)| *at == round)
            .map(|(_, minor)| minor);
        if w.rollout_reaches_others_at == Some(round) {
            w.others_announced = None;
            w.log.push("the rollout restarts the others".into());
        }
        if w.stop_at_round == Some(round) {
            if let Some(stop) = &w.stop {
                stop.send_replace(Some(Signal::SIGTERM));
            }
        }
        let mut view = w.view();
        if let Some(minor) = stale {
            view.cluster_version = Some(minor);
        }
        Ok(view)
    }

    async fn take_lock(&mut self) -> Result<Taken, Fail> {
        let mut w = self.0.borrow_mut();
        match w.lock {
            Some(holder) if holder != OWN => Ok(Taken::HeldBy(Holder {
                member: format!("{holder:x}"),
                name: format!("m{holder}"),
                run: "other".into(),
            })),
            _ => {
                w.lock = Some(OWN);
                w.log.push("lock".into());
                Ok(Taken::Ours)
            }
        }
    }

    async fn keep_lock(&mut self) -> Result<(), Fail> {
        Ok(())
    }

    async fn release_lock(&mut self) -> Result<(), Fail> {
        let mut w = self.0.borrow_mut();
        if w.release_failures > 0 {
            w.release_failures -= 1;
            w.log.push("unlock failed".into());
            return Err(Fail("no quorum".into()));
        }
        if w.lock == Some(OWN) {
            w.lock = None;
        }
        w.log.push("unlock".into());
        Ok(())
    }

    async fn move_leader(&mut self, _from: u64, to: u64) -> Result<(), Fail> {
        let mut w = self.0.borrow_mut();
        w.leader = Some(to);
        w.log.push(format!("leader->{to}"));
        Ok(())
    }

    async fn enable_downgrade(&mut self, to: Minor) -> Result<(), Fail> {
        let mut w = self.0.borrow_mut();
        w.downgrade = Some(to);
        w.log.push(format!("enable {to}"));
        Ok(())
    }

    async fn cancel_downgrade(&mut self) -> Result<(), Fail> {
        let mut w = self.0.borrow_mut();
        w.downgrade = None;
        w.log.push("cancel".into());
        Ok(())
    }

    async fn prove(&mut self, release: Version) -> Result<(), Fail> {
        let w = self.0.borrow();
        if w.prove_fails || w.own != Some(release) {
            return Err(Fail(format!("{release} does not serve")));
        }
        Ok(())
    }

    async fn announce(&mut self, target: VersionPair) -> Result<bool, Fail> {
        let mut w = self.0.borrow_mut();
        if w.own_announced == Some(target.version) {
            return Ok(false);
        }
        w.own_announced = Some(target.version);
        Ok(true)
    }
}

impl MemberEtcd for FakeEtcd {
    type Error = Fail;

    async fn start(&mut self, release: Version) -> Result<(), Fail> {
        let mut w = self.0.borrow_mut();
        w.own = Some(release);
        w.log.push(format!("start {release}"));
        Ok(())
    }

    async fn start_snapshotting(&mut self, release: Version) -> Result<(), Fail> {
        let mut w = self.0.borrow_mut();
        w.own = Some(release);
        w.log.push(format!("start {release} snapshotting"));
        if w.snapshot_cures {
            w.replay_blocked = None;
        }
        Ok(())
    }

    async fn stop(&mut self) -> Result<ExitStatus, Fail> {
        let mut w = self.0.borrow_mut();
        if let Some(release) = w.own.take() {
            w.log.push(format!("stop {release}"));
        }
        if w.leader == Some(OWN) {
            w.leader = None;
        }
        Ok(ExitStatus::Exited(0))
    }

    fn exited(&mut self) -> Option<ExitStatus> {
        let mut w = self.0.borrow_mut();
        match (w.own, w.etcd_exits_on_start_of) {
            (Some(running), Some(dies)) if running == dies => {
                w.own = None;
                w.log.push(format!("exited {running}"));
                Some(ExitStatus::Exited(1))
            }
            _ => None,
        }
    }

    async fn wait(&mut self) -> ExitStatus {
        let mut w = self.0.borrow_mut();
        w.log.push("served".into());
        ExitStatus::Exited(0)
    }
}

impl Ledger for FakeLedger {
    type Error = Fail;

    fn record(&mut self, release: Version) -> Result<(), Fail> {
        self.0.borrow_mut().log.push(format!("record {release}"));
        Ok(())
    }

    fn mark(&mut self, release: Version) -> Result<(), Fail> {
        self.0.borrow_mut().log.push(format!("mark {release}"));
        Ok(())
    }

    fn storage_version(&mut self) -> Result<Option<Minor>, Fail> {
        Ok(self.0.borrow().storage_on_disk)
    }

    fn replay_blocker(&mut self, release: Version) -> Result<Option<String>, Fail> {
        let w = self.0.borrow();
        Ok(w.replay_blocked
            .filter(|blocked| *blocked == release)
            .map(|_| "a v2 request past the newest snapshot".to_string()))
    }
}

fn rolling(recorded: &str, target: &str) -> Rolling {
    Rolling {
        own_id: OWN,
        own_name: "own".into(),
        configured_peer_urls: vec![],
        recorded: VersionPair {
            version: v(recorded),
            storage: Storage::Etcd3,
        },
        marked: None,
        target: VersionPair {
            version: v(target),
            storage: Storage::Etcd3,
        },
        then_pause: false,
        bundle: Bundle::new(["3.3.25", "3.4.23", "3.5.16"].map(v)),
        timing: Timing {
            round: Duration::ZERO,
            prove_every: Duration::ZERO,
            soon_every: Duration::ZERO,
            progress_every: Duration::from_secs(3600),
            prove_deadline: Duration::from_secs(3600),
        },
    }
}

/// The entrypoint's kind of runtime (current-thread), for one test.
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

/// Runs the whole member run in the world; returns the result and the log.
fn run_in(world: World, rolling: &Rolling) -> (Result<Ended, RollError>, Vec<String>) {
    let shared = Rc::new(RefCell::new(world));
    let (stop, termination) = watch::channel(None);
    shared.borrow_mut().stop = Some(stop);
    let runtime = runtime();
    let result = runtime.block_on(async {
        let mut cluster = FakeCluster(shared.clone());
        let first = first_release(rolling)?;
        let start = choose_start(
            rolling,
            first,
            &mut cluster,
            &mut FakeLedger(shared.clone()),
        )
        .await?;
        run(
            rolling,
            start,
            &mut cluster,
            &mut FakeEtcd(shared.clone()),
            &mut FakeLedger(shared.clone()),
            termination,
        )
        .await
    });
    let log = shared.borrow().log.clone();
    (result, log)
}

/// We run 3.4 already, one minor ahead; m3 reaches 3.4 after a while,
/// the cluster version follows, and our restart into 3.5 may go.
fn one_ahead() -> World {
    World {
        others: vec![Some(v("3.4.23")), Some(v("3.3.25"))],
        comes_up: Some((1, 5, v("3.4.23"))),
        cv: Some(Minor::new(3, 3)),
        leader: Some(OWN),
        ..World::default()
    }
}

#[test]
fn a_restart_under_the_lock_records_only_after_its_proof_and_hands_leadership_first() {
    let (result, log) = run_in(one_ahead(), &rolling("3.4.23", "3.5.16"));
    assert_eq!(
        result.expect("rolled"),
        Ended::Exited(ExitStatus::Exited(0))
    );
    assert_eq!(
        log,
        [
            "start 3.4.23",
            "record 3.4.23",
            "lock",
            "leader->2",
            "stop 3.4.23",
            "mark 3.5.16",
            "start 3.5.16",
            "record 3.5.16",
            "unlock",
            "served"
        ]
    );
}

#[test]
fn a_roll_before_a_pause_job_hands_its_etcd_over_serving() {
    // The same roll, ending where a pause job begins (Plan::then_pause):
    // nothing is served here, and nothing stopped: the job takes the etcd.
    let rolling = Rolling {
        then_pause: true,
        ..rolling("3.4.23", "3.5.16")
    };
    let (result, log) = run_in(one_ahead(), &rolling);
    assert_eq!(result.expect("rolled"), Ended::Rolled);
    assert_eq!(log.last().map(String::as_str), Some("unlock"), "{log:?}");
    assert!(!log.iter().any(|l| l == "served"), "{log:?}");
}

#[test]
fn a_member_down_already_starts_one_hop_further_and_the_next_wave_waits_for_the_lock() {
    // The others run 3.4 while the cluster version is 3.3 (we are the last
    // on 3.3): we start 3.4 at once, marked first; then the cluster
    // version is 3.4 and 3.5 goes under the lock.
    let world = World {
        others: vec![Some(v("3.4.23")), Some(v("3.4.23"))],
        cv: Some(Minor::new(3, 3)),
        ..World::default()
    };
    let (result, log) = run_in(world, &rolling("3.3.25", "3.5.16"));
    result.expect("rolled");
    assert_eq!(
        log,
        [
            "mark 3.4.23",
            "start 3.4.23",
            "record 3.4.23",
            "lock",
            "stop 3.4.23",
            "mark 3.5.16",
            "start 3.5.16",
            "record 3.5.16",
            "unlock",
            "served"
        ]
    );
}

#[test]
fn a_release_that_fails_is_tried_again_and_the_roll_goes_on() {
    let world = World {
        others: vec![Some(v("3.3.25")), Some(v("3.3.25"))],
        release_failures: 2,
        ..World::default()
    };
    let (result, log) = run_in(world, &rolling("3.3.25", "3.4.23"));
    result.expect("rolled");
    let tail: Vec<&str> = log.iter().rev().take(4).rev().map(String::as_str).collect();
    assert_eq!(
        tail,
        ["unlock failed", "unlock failed", "unlock", "served"],
        "{log:?}"
    );
}

#[test]
fn a_member_down_holds_the_wave_without_taking_the_lock() {
    // m3 is down for 20 rounds, then comes back at 3.3.25.
    let world = World {
        others: vec![Some(v("3.3.25")), None],
        comes_up: Some((1, 20, v("3.3.25"))),
        ..World::default()
    };
    let (result, log) = run_in(world, &rolling("3.3.25", "3.4.23"));
    result.expect("rolled");
    assert_eq!(log[..2], ["start 3.3.25", "record 3.3.25"]);
    // No lock while m3 was down: the first lock comes after it is back, so
    // the restart (one member down) never meets another member down.
    assert_eq!(log[2], "lock", "{log:?}");
    assert!(log.contains(&"start 3.4.23".to_string()));
}

#[test]
fn a_release_that_dies_after_its_start_leaves_the_mark_and_frees_the_lock() {
    let world = World {
        others: vec![Some(v("3.3.25")), Some(v("3.3.25"))],
        etcd_exits_on_start_of: Some(v("3.4.23")),
        ..World::default()
    };
    let (result, log) = run_in(world, &rolling("3.3.25", "3.4.23"));
    let err = result.expect_err("etcd died");
    assert!(
        matches!(err, RollError::EtcdExited { release, .. } if release == v("3.4.23")),
        "{err}"
    );
    assert!(!log.contains(&"record 3.4.23".to_string()), "{log:?}");
    assert_eq!(log.last().map(String::as_str), Some("unlock"), "{log:?}");
    let mark = log.iter().position(|l| l == "mark 3.4.23");
    let start = log.iter().position(|l| l == "start 3.4.23");
    assert!(mark.is_some() && mark < start, "{log:?}");
}

#[test]
fn a_release_never_proven_under_the_lock_is_stopped_then_the_lock_released() {
    let mut rolling = rolling("3.3.25", "3.4.23");
    rolling.timing.prove_deadline = Duration::ZERO;
    let world = World {
        others: vec![Some(v("3.3.25")), Some(v("3.3.25"))],
        ..World::default()
    };
    let shared = Rc::new(RefCell::new(world));
    // Proofs fail from the restart on: flip the switch when 3.4 starts.
    struct Flaky(Shared);
    impl MemberEtcd for Flaky {
        type Error = Fail;
        async fn start(&mut self, release: Version) -> Result<(), Fail> {
            if release == v("3.4.23") {
                self.0.borrow_mut().prove_fails = true;
            }
            FakeEtcd(self.0.clone()).start(release).await
        }
        async fn start_snapshotting(&mut self, release: Version) -> Result<(), Fail> {
            FakeEtcd(self.0.clone()).start_snapshotting(release).await
        }
        async fn stop(&mut self) -> Result<ExitStatus, Fail> {
            FakeEtcd(self.0.clone()).stop().await
        }
        fn exited(&mut self) -> Option<ExitStatus> {
            None
        }
        async fn wait(&mut self) -> ExitStatus {
            ExitStatus::Exited(0)
        }
    }
    let (_stop, termination) = watch::channel(None);
    let runtime = runtime();
    let result = runtime.block_on(run(
        &rolling,
        v("3.3.25"),
        &mut FakeCluster(shared.clone()),
        &mut Flaky(shared.clone()),
        &mut FakeLedger(shared.clone()),
        termination,
    ));
    let err = result.expect_err("never proven");
    assert!(matches!(err, RollError::NotProven { .. }), "{err}");
    let log = shared.borrow().log.clone();
    let n = log.len();
    assert_eq!(log[n - 2..], ["stop 3.4.23", "unlock"], "{log:?}");
}

#[test]
fn a_stop_request_while_waiting_stops_our_etcd_gracefully() {
    let world = World {
        others: vec![Some(v("3.3.25")), None],
        stop_at_round: Some(3),
        ..World::default()
    };
    let (result, log) = run_in(world, &rolling("3.3.25", "3.4.23"));
    let err = result.expect_err("stopped");
    assert!(
        matches!(err, RollError::Interrupted(Signal::SIGTERM)),
        "{err}"
    );
    assert_eq!(log, ["start 3.3.25", "record 3.3.25", "stop 3.3.25"]);
}

#[test]
fn a_member_behind_the_cluster_version_is_refused_before_anything_starts() {
    let world = World {
        others: vec![Some(v("3.4.23")), Some(v("3.4.23"))],
        own: None,
        ..World::default()
    };
    // Our data says 3.3.25, but the others report cluster version 3.4
    // (they bumped while we were away: our data is stale or foreign).
    let shared = Rc::new(RefCell::new(world));
    let rolling = rolling("3.3.25", "3.5.16");
    let runtime = runtime();
    let err = runtime
        .block_on(choose_start(
            &rolling,
            v("3.3.25"),
            &mut PeersOnly {
                shared: shared.clone(),
                asked: 0,
                edit: |_, view: &mut View| view.cluster_version = Some(Minor::new(3, 4)),
            },
            &mut FakeLedger(shared.clone()),
        ))
        .expect_err("behind");
    assert!(
        err.to_string().contains("cluster version is already 3.4"),
        "{err}"
    );
    assert!(shared.borrow().log.is_empty());
}

/// A cluster seen only through `peers`, each answer edited by `edit`
/// (given how many times it was asked, this one included); anything
/// else a start must not reach.
struct PeersOnly<F> {
    shared: Shared,
    asked: usize,
    edit: F,
}

impl<F: FnMut(usize, &mut View)> Coordination for PeersOnly<F> {
    type Error = Fail;
    async fn peers(&mut self) -> View {
        self.asked += 1;
        let mut view = self.shared.borrow_mut().view();
        (self.edit)(self.asked, &mut view);
        view
    }
    async fn observe(&mut self) -> Result<View, Fail> {
        Err(Fail("unused".into()))
    }
    async fn take_lock(&mut self) -> Result<Taken, Fail> {
        Err(Fail("unused".into()))
    }
    async fn keep_lock(&mut self) -> Result<(), Fail> {
        Ok(())
    }
    async fn release_lock(&mut self) -> Result<(), Fail> {
        Ok(())
    }
    async fn move_leader(&mut self, _: u64, _: u64) -> Result<(), Fail> {
        Ok(())
    }
    async fn enable_downgrade(&mut self, _: Minor) -> Result<(), Fail> {
        Err(Fail("unused".into()))
    }
    async fn cancel_downgrade(&mut self) -> Result<(), Fail> {
        Err(Fail("unused".into()))
    }
    async fn announce(&mut self, _: VersionPair) -> Result<bool, Fail> {
        Err(Fail("unused".into()))
    }
    async fn prove(&mut self, _: Version) -> Result<(), Fail> {
        Ok(())
    }
}

#[test]
fn a_peer_listing_only_itself_for_a_moment_refuses_nothing_a_lasting_one_does() {
    let world = || World {
        others: vec![Some(v("3.3.25")), Some(v("3.3.25"))],
        own: None,
        ..World::default()
    };
    let rolling = rolling("3.3.25", "3.4.23");
    let start = |partial_for| {
        let shared = Rc::new(RefCell::new(world()));
        // A peer that answers `/members` with only itself `partial_for`
        // times (a 2.2.1 member still starting), then with the whole
        // membership.
        let mut cluster = PeersOnly {
            shared: shared.clone(),
            asked: 0,
            edit: |asked, view: &mut View| {
                if asked <= partial_for {
                    view.members.retain(|m| m.id == 2);
                }
            },
        };
        let result = runtime().block_on(choose_start(
            &rolling,
            v("3.3.25"),
            &mut cluster,
            &mut FakeLedger(shared.clone()),
        ));
        (result, cluster.asked)
    };
    // Seen once (the all-at-once restart of a 2.2.1 cluster): asked
    // again, the membership holds us.
    let (result, asked) = start(1);
    assert!(result.is_ok(), "{:?}", result.err().map(|e| e.to_string()));
    assert_eq!(asked, 2);
    // Every observation of the start says so: removed, exit 2.
    let (result, asked) = start(usize::MAX);
    let err = result.expect_err("not a member");
    assert!(
        err.to_string()
            .contains("is not in the cluster's membership"),
        "{err}"
    );
    assert_eq!(asked, REFUSALS_TO_END as usize);
}

#[test]
fn a_peer_tls_no_other_member_accepts_is_refused_before_anything_starts() {
    // Both others listen but fail the handshake (a TLS change rolled out
    // with the version change): nothing starts, exit 2.
    let refusing = World {
        others: vec![None, None],
        tls_refused: [
            (2, "invalid peer certificate: UnknownIssuer".to_string()),
            (3, "invalid peer certificate: UnknownIssuer".to_string()),
        ]
        .into(),
        ..World::default()
    };
    let (result, log) = run_in(refusing, &rolling("3.3.25", "3.4.23"));
    let err = result.expect_err("refused");
    assert!(matches!(err, RollError::Refused(_)), "{err}");
    let text = err.to_string();
    assert!(
        text.contains("TARGET_VERSION=3.3.25")
            && text.contains("m2")
            && text.contains("UnknownIssuer"),
        "{text}"
    );
    assert!(log.is_empty(), "{log:?}");
    // One member accepts it: the TLS is the cluster's; the start goes on
    // (one hop further: the cluster version is our minor).
    let one_accepts = World {
        others: vec![Some(v("3.3.25")), None],
        tls_refused: [(3, "invalid peer certificate: UnknownIssuer".to_string())].into(),
        cv: Some(Minor::new(3, 3)),
        ..World::default()
    };
    let runtime = runtime();
    let start = runtime
        .block_on(choose_start(
            &rolling("3.3.25", "3.4.23"),
            v("3.3.25"),
            &mut FakeCluster(Rc::new(RefCell::new(one_accepts))),
            &mut FakeLedger(Rc::new(RefCell::new(World::default()))),
        ))
        .expect("starts");
    assert_eq!(start, v("3.4.23"));
}

#[test]
fn the_first_release_is_the_marked_one_then_the_recorded_then_its_newest_patch() {
    let mut r = rolling("3.3.25", "3.5.16");
    assert_eq!(first_release(&r).expect("recorded"), v("3.3.25"));
    r.marked = Some(v("3.4.23"));
    assert_eq!(first_release(&r).expect("marked"), v("3.4.23"));
    r.marked = None;
    r.recorded.version = v("3.3.20");
    assert_eq!(first_release(&r).expect("newest patch"), v("3.3.25"));
    r.recorded.version = v("3.2.32");
    let err = first_release(&r).expect_err("no 3.2 bundled");
    assert!(err.to_string().contains("no 3.2.x release"), "{err}");
}

/// A roll to 3.7 on the releases it passes through.
fn rolling_to_3_7(recorded: &str) -> Rolling {
    Rolling {
        bundle: Bundle::new(["3.5.30", "3.6.14", "3.7.1"].map(v)),
        ..rolling(recorded, "3.7.1")
    }
}

/// etcd 3.7 panicked replaying the v2 requests 3.5 left in a 3.6 member's
/// WAL (found rolling 3.5.16 → 3.7.1 in one go): the member's own release
/// starts once with a snapshot after every entry, proves itself, and only
/// then is 3.7 marked and started, all under the lock.
#[test]
fn a_member_whose_wal_3_7_cannot_replay_snapshots_on_its_own_release_first() {
    let world = World {
        others: vec![Some(v("3.6.14")), Some(v("3.6.14"))],
        cv: Some(Minor::new(3, 6)),
        replay_blocked: Some(v("3.7.1")),
        snapshot_cures: true,
        ..World::default()
    };
    let (result, log) = run_in(world, &rolling_to_3_7("3.6.14"));
    result.expect("rolled");
    assert_eq!(
        log,
        [
            "start 3.6.14",
            "record 3.6.14",
            "lock",
            "stop 3.6.14",
            "start 3.6.14 snapshotting",
            "record 3.6.14",
            "stop 3.6.14",
            "mark 3.7.1",
            "start 3.7.1",
            "record 3.7.1",
            "unlock",
            "served"
        ]
    );
}

/// Down already at its start, such a member does not go one hop further
/// into 3.7 (readying its data means one more start and stop, which only
/// the lock may allow): it starts its own release and waits for the wave.
#[test]
fn a_member_down_already_does_not_start_3_7_on_a_wal_it_cannot_replay() {
    let world = World {
        others: vec![Some(v("3.7.1")), Some(v("3.7.1"))],
        cv: Some(Minor::new(3, 6)),
        replay_blocked: Some(v("3.7.1")),
        snapshot_cures: true,
        ..World::default()
    };
    let (result, log) = run_in(world, &rolling_to_3_7("3.6.14"));
    result.expect("rolled");
    assert_eq!(log[..2], ["start 3.6.14", "record 3.6.14"]);
    assert!(
        log.contains(&"start 3.6.14 snapshotting".to_string()),
        "{log:?}"
    );
    assert!(
        log.iter().position(|l| l == "start 3.7.1") > log.iter().position(|l| l == "lock"),
        "3.7 starts only under the lock: {log:?}"
    );
}

/// A snapshot that does not cure (etcd ignores --snapshot-count under a
/// config file) ends the run with our etcd stopped and the lock released,
/// never 3.7 started on the data.
#[test]
fn data_still_blocked_after_the_snapshotting_start_ends_the_run_without_3_7() {
    let world = World {
        others: vec![Some(v("3.6.14")), Some(v("3.6.14"))],
        cv: Some(Minor::new(3, 6)),
        replay_blocked: Some(v("3.7.1")),
        snapshot_cures: false,
        ..World::default()
    };
    let (result, log) = run_in(world, &rolling_to_3_7("3.6.14"));
    let err = result.expect_err("not readied");
    assert!(matches!(err, RollError::NotReadied { .. }), "{err}");
    assert!(err.to_string().contains("--config-file"), "{err}");
    assert!(!log.contains(&"start 3.7.1".to_string()), "{log:?}");
    assert_eq!(log.last().map(String::as_str), Some("unlock"), "{log:?}");
}

/// A roll down through etcd's downgrade, on the releases it passes.
fn rolling_down(recorded: &str, target: &str) -> Rolling {
    Rolling {
        bundle: Bundle::new(["3.5.30", "3.6.14", "3.7.1"].map(v)),
        ..rolling(recorded, target)
    }
}

/// With every member on 3.7, the first member to take the lock enables
/// the downgrade (never a 3.6 start while the cluster version is 3.7),
/// lets the lock go, and restarts into 3.6 under it once the cluster
/// version has dropped, recording 3.6 only once proven, leadership handed
/// away first.
#[test]
fn a_downgrade_is_enabled_under_the_lock_before_any_member_starts_the_older_release() {
    let world = World {
        others: vec![Some(v("3.7.1")), Some(v("3.7.1"))],
        cv: Some(Minor::new(3, 7)),
        leader: Some(OWN),
        ..World::default()
    };
    let (result, log) = run_in(world, &rolling_down("3.7.1", "3.6.14"));
    result.expect("rolled");
    assert_eq!(
        log,
        [
            "start 3.7.1",
            "record 3.7.1",
            "lock",
            "enable 3.6",
            "unlock",
            "lock",
            "leader->2",
            "stop 3.7.1",
            "mark 3.6.14",
            "start 3.6.14",
            "record 3.6.14",
            "unlock",
            "served"
        ]
    );
}

/// Issue 30: the member the rollout restarted first enables the downgrade
/// and its storage version drops at once, but the other two still run
/// 3.7.1 with the old target: the rollout will restart them, at any
/// moment. It lets the lock go and does not stop its etcd until they
/// announce the new target (restarted by the rollout), whatever the time.
#[test]
fn the_member_that_enabled_a_downgrade_restarts_only_once_the_rollout_has_restarted_the_others() {
    let world = World {
        others: vec![Some(v("3.7.1")), Some(v("3.7.1"))],
        cv: Some(Minor::new(3, 7)),
        leader: Some(OWN),
        others_announced: Some(v("3.7.1")),
        rollout_reaches_others_at: Some(12),
        ..World::default()
    };
    let (result, log) = run_in(world, &rolling_down("3.7.1", "3.6.14"));
    result.expect("rolled");
    let pos = |what: &str| {
        log.iter()
            .position(|l| l == what)
            .unwrap_or_else(|| panic!("{what} missing: {log:?}"))
    };
    assert!(pos("enable 3.6") < pos("unlock"), "{log:?}");
    assert!(
        pos("the rollout restarts the others") < pos("stop 3.7.1"),
        "our etcd stopped while the rollout could still restart another member: {log:?}"
    );
    assert_eq!(
        log.iter().filter(|l| *l == "lock").count(),
        2,
        "the lock taken to enable, then once more to restart: {log:?}"
    );
    assert_eq!(log.last().map(String::as_str), Some("served"), "{log:?}");
}

/// 3.7 → 3.5: two waves, each enabled once the one before is over (the
/// leader ended its job when every member ran its target).
#[test]
fn a_two_minor_downgrade_walks_down_one_wave_at_a_time() {
    let world = World {
        others: vec![Some(v("3.6.14")), Some(v("3.6.14"))],
        cv: Some(Minor::new(3, 6)),
        downgrade: Some(Minor::new(3, 6)),
        comes_up: Some((0, 8, v("3.5.30"))),
        ..World::default()
    };
    let (result, log) = run_in(world, &rolling_down("3.7.1", "3.5.30"));
    result.expect("rolled");
    let pos = |what: &str| {
        log.iter()
            .position(|l| l == what)
            .unwrap_or_else(|| panic!("{what} missing: {log:?}"))
    };
    assert!(
        pos("record 3.6.14") < pos("job ended by the leader"),
        "{log:?}"
    );
    assert!(
        pos("job ended by the leader") < pos("enable 3.5"),
        "{log:?}"
    );
    assert!(pos("enable 3.5") < pos("start 3.5.30"), "{log:?}");
    assert_eq!(log.last().map(String::as_str), Some("served"), "{log:?}");
}

/// The target raised back to 3.7 while the downgrade to 3.6 is on: our
/// member, down at its start, starts 3.7.1 (one minor ahead of the
/// cluster version, as etcd allows), is recorded once proven, and cancels
/// the job, so that the cluster version can rise again.
#[test]
fn a_target_raised_mid_downgrade_cancels_the_job_and_rolls_forward() {
    let world = World {
        others: vec![Some(v("3.7.1")), Some(v("3.7.1"))],
        cv: Some(Minor::new(3, 6)),
        downgrade: Some(Minor::new(3, 6)),
        ..World::default()
    };
    let (result, log) = run_in(world, &rolling_down("3.6.14", "3.7.1"));
    result.expect("rolled");
    assert_eq!(
        log,
        [
            "mark 3.7.1",
            "start 3.7.1",
            "record 3.7.1",
            "cancel",
            "served"
        ]
    );
}

/// A member that just restarted tells its data's older cluster version
/// for a moment (seen on real etcd: 8 ms), which makes us look two minors
/// ahead in one observation: that is no reason to end the roll, which goes
/// on to the target once the view is right again.
#[test]
fn a_refusal_seen_once_does_not_end_the_roll() {
    // We run 3.4 one minor ahead, waiting for m3 to reach it (round 5);
    // at round 2 a restarted member tells cluster version 3.2.
    let world = World {
        others: vec![Some(v("3.4.23")), Some(v("3.3.25"))],
        comes_up: Some((1, 5, v("3.4.23"))),
        cv: Some(Minor::new(3, 3)),
        stale_cluster_version: Some((2, Minor::new(3, 2))),
        ..World::default()
    };
    let (result, log) = run_in(world, &rolling("3.4.23", "3.5.16"));
    result.expect("rolled");
    assert!(
        log.contains(&"record 3.5.16".to_string()),
        "the roll went on: {log:?}"
    );
}

/// 3.5 to a 3.4.32+ takes no downgrade job (etcd's guide): the member the
/// rollout restarted comes back on 3.4 at once, at cluster version 3.5,
/// never enabling anything, and records 3.4 once proven.
#[test]
fn a_3_5_member_restarted_with_a_3_4_32_target_starts_it_at_once_with_no_job() {
    let world = World {
        others: vec![Some(v("3.5.16")), Some(v("3.5.16"))],
        cv: Some(Minor::new(3, 5)),
        ..World::default()
    };
    let to_45 = Rolling {
        bundle: Bundle::new(["3.4.45", "3.5.16"].map(v)),
        ..rolling("3.5.16", "3.4.45")
    };
    let (result, log) = run_in(world, &to_45);
    result.expect("rolled");
    assert_eq!(
        log,
        ["mark 3.4.45", "start 3.4.45", "record 3.4.45", "served"]
    );
    // Below 3.4.32 a 3.4 leader cannot lower a 3.5 cluster version: the
    // member starts its own release and waits (the pause job's way).
    let world = World {
        others: vec![Some(v("3.5.16")), Some(v("3.5.16"))],
        cv: Some(Minor::new(3, 5)),
        ..World::default()
    };
    let start = runtime()
        .block_on(choose_start(
            &Rolling {
                bundle: Bundle::new(["3.4.31", "3.5.16"].map(v)),
                ..rolling("3.5.16", "3.4.31")
            },
            v("3.5.16"),
            &mut FakeCluster(Rc::new(RefCell::new(world))),
            &mut FakeLedger(Rc::new(RefCell::new(World::default()))),
        ))
        .expect("starts");
    assert_eq!(start, v("3.5.16"));
}
