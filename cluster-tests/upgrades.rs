//! This module owns the rolling-upgrade scenarios (issue 11): members of a
//! live 3.3.25 cluster restarted with a multi-minor TARGET_VERSION walk
//! the whole cluster to it, wave after wave (3.3 → 3.4 → 3.5), their
//! entrypoints coordinating through the cluster itself (its cluster
//! version as the barrier, one member restarting at a time under the
//! upgrade lock), while a client writes throughout and the monitor checks,
//! every round, that no two members are down at once and no member runs
//! two minors ahead of the cluster version.
//!
//! Each scenario runs along three lines: 3.3.25 → 3.4.23 → 3.5.16 (the
//! releases CI fetches), and, when the image bundles the releases no
//! registry has (`make cluster-test ETCD_EXTRA_BIN_DIR=...`; NOT RUN
//! otherwise), 2.2.1 → 2.3.7 → 3.0.17 on etcd2 data (GCE style, the lock
//! in v2) and 3.0.17 → 3.1.20 → 3.2.32 (kubeadm style, across the lock's
//! crossing from v2 to v3).

use std::thread;
use std::time::{Duration, Instant};

use crate::harness::cluster::{Baseline, Cluster, Style, START_DEADLINE, STOP_GRACE_S};
use crate::harness::docker::{first_to_log_past, Container};
use crate::harness::monitor::{self, Monitor};
use crate::harness::writer::{self, connect, runtime, Writer};
use crate::harness::{ready, say, Ready};
use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};
use etcd_migrate::cluster::lock::LOCK_KEY;

/// What the writer must get acknowledged at each stage.
const ACKS: usize = 10;
const ACK_DEADLINE: Duration = Duration::from_secs(60);
/// What the whole roll may take once every member has its new target: two
/// waves of one restart per member, each a stop, a start and a proof, on a
/// loaded two-core machine.
const ROLL_DEADLINE: Duration = Duration::from_secs(600);
/// What a member's record may lag behind its peers seeing it run the
/// target: its proof (a `/version` and a write), retried until it holds.
const RECORD_DEADLINE: Duration = Duration::from_secs(120);

/// Waits until every member runs `release` and reports its minor as the
/// cluster version; says how long it took.
fn wait_rolled(cluster: &Cluster, release: &str, deadline: Duration) -> Duration {
    let started = Instant::now();
    let want = monitor::minor(release).expect("X.Y.Z");
    loop {
        let answers: Vec<Result<monitor::VersionAnswer, String>> = cluster
            .ips()
            .iter()
            .map(|ip| monitor::version(&cluster.client, ip))
            .collect();
        let done = answers.iter().all(|a| {
            matches!(a, Ok(v) if v.server == release && monitor::minor(&v.cluster) == Some(want))
        });
        if done {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < deadline,
            "the cluster did not reach {release} within {deadline:?}: {answers:?}\nlogs:\n{}",
            cluster.all_logs()
        );
        thread::sleep(Duration::from_millis(500));
    }
}

/// Member `i`'s version.txt records `want` within `deadline`.
pub(crate) fn wait_recorded(cluster: &Cluster, i: usize, want: &str, deadline: Duration) {
    let started = Instant::now();
    loop {
        let recorded = cluster.version_txt(i);
        if recorded == want {
            return;
        }
        assert!(
            started.elapsed() < deadline,
            "{}'s version.txt records {recorded:?}, not {want:?}, {deadline:?} after the roll\nlogs:\n{}",
            cluster.members[i].name,
            cluster.all_logs()
        );
        thread::sleep(Duration::from_millis(500));
    }
}

/// A scenario under way: the cluster at its first release, with the
/// writer and the monitor running.
pub(crate) struct Scenario {
    pub(crate) test: &'static str,
    started: Instant,
    pub(crate) cluster: Cluster,
    baseline: Baseline,
    pub(crate) monitor: Monitor,
    writer: Writer,
    acks: usize,
}

impl Scenario {
    /// `size` members at `from`, or None (after saying why) when the image
    /// is not there to test.
    pub(crate) fn start(
        test: &'static str,
        style: Style,
        size: usize,
        from: &str,
        needs: &[&str],
    ) -> Option<(Scenario, Ready)> {
        let mut versions = vec![from];
        versions.extend_from_slice(needs);
        let ready = ready(test, &versions)?;
        let started = Instant::now();
        let cluster = Cluster::start(&ready.image, test, style, size, from);
        let baseline = cluster.baseline();
        let monitor = cluster.start_monitor();
        let writer = cluster.start_writer();
        let acks = writer.wait_acks(0, ACKS, ACK_DEADLINE, "writes before the upgrade");
        Some((
            Scenario {
                test,
                started,
                cluster,
                baseline,
                monitor,
                writer,
                acks,
            },
            ready,
        ))
    }

    /// More writes acknowledged, with `why` in the failure message.
    pub(crate) fn writes(&mut self, why: &str) {
        self.acks = self.writer.wait_acks(self.acks, ACKS, ACK_DEADLINE, why);
    }

    /// Member `i` restarted by hand (gracefully) with TARGET_VERSION
    /// `target`, as an operator's rollout of its manifest does.
    pub(crate) fn retarget(&mut self, i: usize, target: &str) {
        self.cluster.container(i).stop(STOP_GRACE_S);
        self.cluster.run_member(i, target);
    }

    /// Every member, one by one, with TARGET_VERSION `target`: the next
    /// once the previous serves again.
    pub(crate) fn retarget_one_by_one(&mut self, target: &str) {
        for i in 0..self.cluster.members.len() {
            self.retarget(i, target);
            self.cluster.wait_healthy(i, START_DEADLINE);
            let name = self.cluster.members[i].name.clone();
            self.writes(&format!("writes after {name} got TARGET_VERSION={target}"));
        }
    }

    /// A roll to `target` reached: every member runs it, its minor is the
    /// cluster version, every version.txt records it, and writes go on.
    /// The scenario goes on (another roll may follow).
    pub(crate) fn reached(&mut self, target: &str) {
        let took = wait_rolled(&self.cluster, target, ROLL_DEADLINE);
        say(&format!(
            "{}: every member runs {target} {:.1} s after the last restart by hand",
            self.test,
            took.as_secs_f64()
        ));
        for i in 0..self.cluster.members.len() {
            wait_recorded(
                &self.cluster,
                i,
                &format!("{target}/{}", self.cluster.storage),
                RECORD_DEADLINE,
            );
        }
        self.writes(&format!("writes once every member runs {target}"));
    }

    /// The roll to `target` is over: every member runs it, its minor is
    /// the cluster version, every version.txt records it, the roll went
    /// through the lock and the proofs, and every invariant holds.
    pub(crate) fn finish(self, target: &str) {
        self.finish_with(target, true);
    }

    /// [`Scenario::finish`]; `through_lock`: the last wave restarted
    /// members under the lock (a one-minor rollout needs none: each member
    /// starts the next minor when its own container starts).
    pub(crate) fn finish_with(mut self, target: &str, through_lock: bool) {
        let took = wait_rolled(&self.cluster, target, ROLL_DEADLINE);
        say(&format!(
            "{}: every member runs {target} {:.1} s after the last restart by hand",
            self.test,
            took.as_secs_f64()
        ));
        self.writes("writes after the roll");
        // A member's entrypoint records its release after proving it (a
        // write through its client URL), a moment after its peers see it
        // run: the record is waited for, not read once.
        for i in 0..self.cluster.members.len() {
            wait_recorded(
                &self.cluster,
                i,
                &format!("{target}/{}", self.cluster.storage),
                RECORD_DEADLINE,
            );
        }
        let record = self.record();
        eprintln!("{}: the entrypoints' record:\n{record}", self.test);
        assert!(
            !through_lock
                || (record.contains("upgrade lock taken") && record.contains("member proven")),
            "the roll went through the lock and the proof; logs:\n{}",
            self.cluster.all_logs()
        );
        let Scenario {
            test,
            started,
            cluster,
            baseline,
            monitor,
            writer,
            ..
        } = self;
        cluster.finish_scenario(test, started, &baseline, writer, monitor);
    }

    /// Each point of a holder's restart, in the order they come: the
    /// member that reaches it next is SIGKILLed there (container and all:
    /// the entrypoint and its etcd), then started again as it was. `hold`
    /// is the operator's lock, taken before the wave so that no member
    /// passes a point unseen; the dead holder's lock becomes the
    /// operator's while the victim comes back, and is let go at the end.
    pub(crate) fn kill_at_each(&mut self, hold: Hold, points: &[&str]) {
        let mut hold = Some(hold);
        for point in points {
            let before = self.counts(point);
            if let Some(hold) = hold.take() {
                self.release_lock(hold);
            }
            let victim = self.wait_for_line(point, &before, ROLL_DEADLINE);
            let name = self.cluster.members[victim].name.clone();
            self.cluster.container(victim).kill();
            eprintln!("{}: {name} SIGKILLed after {point:?}", self.test);
            hold = Some(self.seize_lock());
            self.cluster.container(victim).start();
            self.cluster.wait_healthy(victim, START_DEADLINE);
            self.writes(&format!("writes after {name} was killed after {point:?}"));
        }
        if let Some(hold) = hold.take() {
            self.release_lock(hold);
        }
    }

    /// The entrypoints' lines about the roll, member by member.
    pub(crate) fn record(&self) -> String {
        let mut record = Vec::new();
        for (i, member) in self.cluster.members.iter().enumerate() {
            for line in self.cluster.container(i).logs().lines() {
                let ours = line.contains("[etcd-migrate]")
                    && [
                        "lock",
                        "restarting",
                        "proven",
                        "moved",
                        "stopped",
                        "waiting",
                        "mark",
                        "downgrade",
                    ]
                    .iter()
                    .any(|w| line.contains(w));
                if ours {
                    record.push(format!("{}: {line}", member.name));
                }
            }
        }
        record.join("\n")
    }

    /// Waits until some member's log shows `needle` once more than
    /// `before` (per member) says; that member's index.
    pub(crate) fn wait_for_line(
        &self,
        needle: &str,
        before: &[usize],
        deadline: Duration,
    ) -> usize {
        // Followed as docker streams it: a kill on the line lands within
        // milliseconds, in the phase the line opens, however loaded the
        // machine (polling whole logs once took 7 s on a loaded machine,
        // and the roll had passed the next point by then).
        let containers: Vec<&Container> = (0..self.cluster.members.len())
            .map(|i| self.cluster.container(i))
            .collect();
        match first_to_log_past(&containers, needle, before, deadline) {
            Some(i) => i,
            None => panic!(
                "no member logged {needle:?} again within {deadline:?}; logs:\n{}",
                self.cluster.all_logs()
            ),
        }
    }

    /// Takes the cluster's upgrade lock as an operator would to pause a
    /// roll (a holder that is no member; under a lease or TTL of its own),
    /// once whoever holds it now has let it go.
    pub(crate) fn hold_lock(&self) -> Hold {
        self.operator_lock(false)
    }

    /// Enables etcd's downgrade to `minor` ("3.6") by hand through the
    /// first member, as `etcdctl downgrade enable` does.
    pub(crate) fn enable_downgrade_by_hand(&self, minor: &str) {
        let ip = self.cluster.members[0].ip.clone();
        let pki = self.cluster.client.clone();
        let to: etcd_migrate::version::Minor = format!("{minor}.0")
            .parse::<etcd_migrate::version::Version>()
            .expect("a minor")
            .minor_line();
        runtime().block_on(async move {
            let client = connect(&pki, &ip).await.unwrap_or_else(|e| panic!("{e}"));
            let mut maintenance = client.maintenance_client();
            etcd_migrate::downgrade::enable(&mut maintenance, to)
                .await
                .unwrap_or_else(|e| panic!("downgrade enable {minor} through {ip}: {e}"));
        });
    }

    /// Takes the upgrade lock as the operator at once, from whoever holds
    /// it (a holder just SIGKILLed: its run is gone), so that nobody else
    /// restarts until [`Scenario::release_lock`].
    pub(crate) fn seize_lock(&self) -> Hold {
        self.operator_lock(true)
    }

    /// The operator's lock, in the store the members use now (v2 while the
    /// cluster version is below 3.1, as they do): put once the key is free,
    /// or (`seize`) over whatever holds it. Through every member in turn:
    /// one just killed answers nothing.
    fn operator_lock(&self, seize: bool) -> Hold {
        let ips = self.cluster.ips();
        let deadline = if seize { ACK_DEADLINE } else { ROLL_DEADLINE };
        let started = Instant::now();
        let holder =
            serde_json::json!({"member": "0", "name": "the operator (test)", "run": "test"})
                .to_string();
        let v2 = self.lock_in_v2();
        let http = writer::v2_http(&self.cluster.client);
        let pki = self.cluster.client.clone();
        for ip in ips.iter().cycle() {
            let attempt = if v2 {
                runtime()
                    .block_on(take_v2(&http, ip, &holder, seize))
                    .map(|taken| taken.then_some(Hold::V2))
            } else {
                runtime()
                    .block_on(take_v3(&pki, ip, &holder, seize))
                    .map(|lease| lease.map(Hold::V3))
            };
            let last = match attempt {
                Ok(Some(hold)) => return hold,
                Ok(None) => "held by another".to_string(),
                Err(err) => err,
            };
            assert!(
                started.elapsed() < deadline,
                "the operator could not take the upgrade lock within {deadline:?}: {last}"
            );
            thread::sleep(Duration::from_millis(200));
        }
        unreachable!("a cycle over the members ends only by returning or panicking")
    }

    /// Whether the members keep the lock in v2 now: the cluster version
    /// (the first member that answers) is below 3.1.
    fn lock_in_v2(&self) -> bool {
        let started = Instant::now();
        loop {
            for ip in self.cluster.ips() {
                if let Ok(v) = monitor::version(&self.cluster.client, &ip) {
                    if let Some(cv) = monitor::minor(&v.cluster) {
                        return cv < (3, 1);
                    }
                }
            }
            assert!(
                started.elapsed() < ACK_DEADLINE,
                "no member told its cluster version within {ACK_DEADLINE:?}"
            );
            thread::sleep(Duration::from_millis(200));
        }
    }

    /// Lets the operator's hold go (through any member that answers).
    pub(crate) fn release_lock(&self, hold: Hold) {
        let http = writer::v2_http(&self.cluster.client);
        let pki = self.cluster.client.clone();
        let started = Instant::now();
        for ip in self.cluster.ips().iter().cycle() {
            let done = runtime().block_on(async {
                match hold {
                    Hold::V2 => http
                        .delete(writer::v2_url(ip, LOCK_KEY))
                        .send()
                        .await
                        .map(|_| ())
                        .map_err(|e| e.to_string()),
                    Hold::V3(lease) => match connect(&pki, ip).await {
                        Ok(mut c) => c
                            .lease_revoke(lease)
                            .await
                            .map(|_| ())
                            .map_err(|e| e.to_string()),
                        Err(e) => Err(e),
                    },
                }
            });
            match done {
                Ok(()) => return,
                Err(e) => assert!(
                    started.elapsed() < ACK_DEADLINE,
                    "the operator could not let the upgrade lock go within {ACK_DEADLINE:?}: {e}"
                ),
            }
            thread::sleep(Duration::from_millis(200));
        }
    }

    /// How often each member has logged `needle` so far.
    pub(crate) fn counts(&self, needle: &str) -> Vec<usize> {
        (0..self.cluster.members.len())
            .map(|i| self.cluster.container(i).count_in_log(needle))
            .collect()
    }
}

/// The operator's hold on the upgrade lock: a v3 lease, or the v2 key
/// (with a TTL of its own).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Hold {
    V2,
    V3(i64),
}

/// The operator's v3 lock through the member at `ip`: its lease once put.
async fn take_v3(
    pki: &crate::harness::pki::ClientPki,
    ip: &str,
    holder: &str,
    seize: bool,
) -> Result<Option<i64>, String> {
    let mut c = connect(pki, ip).await?;
    let lease = c
        .lease_grant(600, None)
        .await
        .map_err(|e| e.to_string())?
        .id();
    let free = [Compare::create_revision(LOCK_KEY, CompareOp::Equal, 0)];
    let txn = Txn::new()
        .when(if seize { &[][..] } else { &free[..] }.to_vec())
        .and_then([TxnOp::put(
            LOCK_KEY,
            holder,
            Some(PutOptions::new().with_lease(lease)),
        )]);
    let taken = c.txn(txn).await.map_err(|e| e.to_string())?.succeeded();
    if !taken {
        let _ = c.lease_revoke(lease).await;
    }
    Ok(taken.then_some(lease))
}

/// The operator's v2 lock through the member at `ip` (a TTL of 600 s;
/// `prevExist=false` unless seizing): whether it was put.
async fn take_v2(
    http: &reqwest::Client,
    ip: &str,
    holder: &str,
    seize: bool,
) -> Result<bool, String> {
    let mut form = vec![("value", holder), ("ttl", "600")];
    if !seize {
        form.push(("prevExist", "false"));
    }
    let url = writer::v2_url(ip, LOCK_KEY);
    let response = http
        .put(&url)
        .form(&form)
        .send()
        .await
        .map_err(|e| format!("{url}: {e}"))?;
    let body = response.text().await.map_err(|e| format!("{url}: {e}"))?;
    let answer: serde_json::Value =
        serde_json::from_str(&body).map_err(|e| format!("{url}: {body:?}: {e}"))?;
    Ok(answer.get("errorCode").is_none())
}

/// The kubeadm stacked example set (examples/ha/kubeadm-etcd-*.yaml), as
/// written but for the addresses: 3.3.25 members rolled to 3.5.16.
pub(crate) fn the_kubeadm_example_set_rolls_three_members_from_3_3_to_3_5() {
    let Some((mut s, _ready)) = Scenario::start(
        "example-kubeadm-ha",
        Style::KubeadmExample,
        3,
        "3.3.25",
        &["3.4.23", "3.5.16"],
    ) else {
        return;
    };
    s.retarget_one_by_one("3.5.16");
    s.finish("3.5.16");
}

/// The GCE-style example set (examples/ha/gce-etcd-*.manifest), likewise.
pub(crate) fn the_gce_example_set_rolls_three_members_from_3_3_to_3_5() {
    let Some((mut s, _ready)) = Scenario::start(
        "example-gce-ha",
        Style::GceExample,
        3,
        "3.3.25",
        &["3.4.23", "3.5.16"],
    ) else {
        return;
    };
    s.retarget_one_by_one("3.5.16");
    s.finish("3.5.16");
}

/// A path a scenario rolls a cluster along, and how its members are run.
#[derive(Debug, Clone, Copy)]
struct Line {
    /// The release the cluster begins at.
    from: &'static str,
    /// The release between: the first wave's.
    via: &'static str,
    /// The target, two minors above `from`.
    to: &'static str,
    /// Releases the roll also passes through, beside `via`.
    also: &'static [&'static str],
    /// How the three-member scenarios run their members (the five-member
    /// roll is GCE's exec style on every line).
    style: Style,
}

impl Line {
    /// The release between as the image runs it: the newest bundled
    /// patch of `via`'s minor (an image with 3.4.45 beside 3.4.23 passes
    /// through 3.4.45).
    fn via(&self) -> String {
        crate::harness::newest_patch_of(self.via)
    }
}

/// The releases CI fetches, kubeadm style.
const FROM_3_3: Line = Line {
    from: "3.3.25",
    via: "3.4.23",
    to: "3.5.16",
    also: &[],
    style: Style::Kubeadm,
};

/// etcd2 data from 2.2 to 3.0, GCE style (kube-up's HA masters of that
/// time), the lock in v2 throughout.
const FROM_2_2: Line = Line {
    from: "2.2.1",
    via: "2.3.7",
    to: "3.0.17",
    also: &[],
    style: Style::GceHa,
};

/// Today's releases, kubeadm style (the five-member roll GCE's): from
/// 3.5.16 to 3.7.1 in one roll. The first wave is the patch floor before
/// 3.6 (3.5.30, which every member starts as the rollout restarts it),
/// then 3.6.14 under the lock, then 3.7.1, which first has each member's
/// own 3.6 snapshot past the v2 requests 3.5 left in its WAL.
const FROM_3_5: Line = Line {
    from: "3.5.16",
    via: "3.5.30",
    to: "3.7.1",
    also: &["3.6.14"],
    style: Style::Kubeadm,
};

/// etcd3 data from 3.0 to 3.2, kubeadm style: the first wave at cluster
/// version 3.0 (the lock in v2), the second at 3.1 (in v3).
const FROM_3_0: Line = Line {
    from: "3.0.17",
    via: "3.1.20",
    to: "3.2.32",
    also: &[],
    style: Style::Kubeadm,
};

impl Line {
    /// `size` members of `style` at the line's first release, or None when
    /// the image is not there to test (said why).
    fn start(&self, test: &'static str, style: Style, size: usize) -> Option<(Scenario, Ready)> {
        let mut needs = vec![self.via, self.to];
        needs.extend_from_slice(self.also);
        Scenario::start(test, style, size, self.from, &needs)
    }
}

fn five_members_roll(test: &'static str, line: Line) {
    let Some((mut s, _ready)) = line.start(test, Style::GceHa, 5) else {
        return;
    };
    s.retarget_one_by_one(line.to);
    s.finish(line.to);
}

fn all_at_once(test: &'static str, line: Line) {
    let Some((mut s, _ready)) = line.start(test, line.style, 3) else {
        return;
    };
    // The scenario itself takes every member down together.
    s.monitor.excuse_down(true);
    for i in 0..3 {
        s.cluster.container(i).stop(STOP_GRACE_S);
    }
    for i in 0..3 {
        s.cluster.run_member(i, line.to);
    }
    for i in 0..3 {
        s.cluster.wait_healthy(i, START_DEADLINE);
    }
    s.monitor
        .end_excuse_once_answering(&[0, 1, 2], START_DEADLINE);
    s.writes("writes once the members formed the quorum again");
    s.finish(line.to);
}

fn offline_through_a_wave(test: &'static str, line: Line) {
    let Some((mut s, _ready)) = line.start(test, line.style, 3) else {
        return;
    };
    let offline = 2;
    let name = s.cluster.members[offline].name.clone();
    s.cluster.container(offline).stop(STOP_GRACE_S);
    // The rollout restarts the two others while it is away: two members
    // down at once, the scenario's own doing (and only while it does it).
    s.monitor.excuse_down(true);
    for i in 0..2 {
        s.retarget(i, line.to);
        s.cluster.wait_healthy(i, START_DEADLINE);
    }
    s.monitor.end_excuse_once_answering(&[0, 1], START_DEADLINE);
    // Both start the release between (one minor ahead of the cluster
    // version, as etcd allows) and wait for the offline member, saying so;
    // the cluster version cannot move without it, so neither goes on.
    let waiting = format!("waiting for member {name}");
    let before = vec![0; 3];
    s.wait_for_line(&waiting, &before, Duration::from_secs(60));
    let seen = s.counts(&waiting);
    s.wait_for_line(&waiting, &seen, Duration::from_secs(60));
    s.writes(&format!("writes while {name} is offline"));
    for i in 0..2 {
        let answer = monitor::version(&s.cluster.client, &s.cluster.members[i].ip)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            (answer.server.as_str(), monitor::minor(&answer.cluster)),
            (line.via().as_str(), monitor::minor(line.from)),
            "member {i} while {name} was offline"
        );
    }
    s.retarget(offline, line.to);
    s.cluster.wait_healthy(offline, START_DEADLINE);
    s.finish(line.to);
}

fn holders_killed(test: &'static str, line: Line) {
    // The second wave has three restarts under the lock, one for each
    // point below (a holder killed at one starts the target at once when
    // it comes back, using up its restart; the operator's hold keeps the
    // others from racing past the next point meanwhile: CI once saw the
    // last member restart while the test was still bringing the second
    // victim back, and then waited for a point nobody would reach). The
    // point after the record (a holder killed before its release: the
    // others wait out the lock's TTL) is e2e/cluster_roll.rs's, with the
    // failpoint.
    let Some((mut s, _ready)) = line.start(test, line.style, 3) else {
        return;
    };
    // The operator holds the lock while the test is not watching for the
    // next point, so that no member passes it unseen: through the first
    // wave (no restart there needs the lock) and while a killed holder
    // comes back.
    let hold = s.hold_lock();
    s.retarget_one_by_one(line.to);
    s.kill_at_each(
        hold,
        &[
            "upgrade lock taken",
            "member etcd stopped",
            "member restarting into the next release",
        ],
    );
    s.finish(line.to);
}

fn holder_cut_off(test: &'static str, line: Line) {
    let Some((mut s, _ready)) = line.start(test, line.style, 3) else {
        return;
    };
    // The second wave waits on the operator's hold until the test
    // watches, so its first restart (two more to come) is the one cut off.
    let hold = s.hold_lock();
    s.retarget_one_by_one(line.to);
    let point = "member restarting into the next release";
    let before = s.counts(point);
    s.release_lock(hold);
    let victim = s.wait_for_line(point, &before, ROLL_DEADLINE);
    let name = s.cluster.members[victim].name.clone();
    s.cluster.cut_off(victim);
    eprintln!("{}: {name} cut off after {point:?}", s.test);
    s.writes(&format!("writes while {name} is cut off"));
    let waiting = format!("waiting for member {name}");
    let seen = s.counts(&waiting);
    s.wait_for_line(&waiting, &seen, Duration::from_secs(60));
    // The line comes as its etcd is spawned, so the cut may beat the
    // bind of its URLs: then it exited, and is started again.
    s.cluster.reconnect(victim);
    s.finish(line.to);
}

fn target_lowered(test: &'static str, line: Line) {
    let Some((mut s, _ready)) = line.start(test, line.style, 3) else {
        return;
    };
    // The operator pauses the roll by holding the upgrade lock (nobody
    // restarts while another holds it), from before the first wave (which
    // needs no lock: each member starts the release between as it is
    // restarted) so that no restart into the target can begin; once a
    // member has proven the release between, every member's target is
    // lowered to it, and the lock let go.
    let hold = s.hold_lock();
    s.retarget_one_by_one(line.to);
    s.wait_for_line(
        &format!("member proven release={}", line.via()),
        &[0, 0, 0],
        ROLL_DEADLINE,
    );
    eprintln!(
        "{}: the test holds the upgrade lock; lowering the target",
        s.test
    );
    s.retarget_one_by_one(&line.via());
    s.release_lock(hold);
    // Nobody reached the target (it would be refused now, a rollback, and
    // never serve the release between again): every member ends there,
    // with one restart each, the rollout's own.
    s.finish_with(&line.via(), false);
}

pub(crate) fn five_members_gce_exec_style_roll_from_3_3_to_3_5() {
    five_members_roll("roll-5-gce", FROM_3_3);
}

pub(crate) fn all_members_restarted_at_once_form_the_quorum_then_roll() {
    all_at_once("roll-all-at-once", FROM_3_3);
}

pub(crate) fn a_member_offline_holds_the_wave_until_it_is_back() {
    offline_through_a_wave("roll-offline", FROM_3_3);
}

pub(crate) fn lock_holders_killed_at_each_point_of_their_restart_resume_the_roll() {
    holders_killed("roll-kills", FROM_3_3);
}

pub(crate) fn a_holder_cut_off_while_it_restarts_resumes_once_reconnected() {
    holder_cut_off("roll-cut", FROM_3_3);
}

pub(crate) fn a_target_lowered_during_a_wave_ends_the_roll_at_the_lower_target() {
    target_lowered("roll-lowered", FROM_3_3);
}

/// The rolling scenarios of a line as the tests of a module (`$tag`
/// prefixes each scenario's name, and so its containers').
macro_rules! scenarios_on {
    ($(#[$doc:meta])* $module:ident, $line:expr, $tag:literal) => {
        $(#[$doc])*
        pub(crate) mod $module {
            pub(crate) fn five_members_roll() {
                super::five_members_roll(concat!($tag, "-roll-5"), $line);
            }

            pub(crate) fn all_at_once() {
                super::all_at_once(concat!($tag, "-roll-all-at-once"), $line);
            }

            pub(crate) fn offline_through_a_wave() {
                super::offline_through_a_wave(concat!($tag, "-roll-offline"), $line);
            }

            pub(crate) fn holders_killed() {
                super::holders_killed(concat!($tag, "-roll-kills"), $line);
            }

            pub(crate) fn holder_cut_off() {
                super::holder_cut_off(concat!($tag, "-roll-cut"), $line);
            }

            pub(crate) fn target_lowered() {
                super::target_lowered(concat!($tag, "-roll-lowered"), $line);
            }
        }
    };
}

scenarios_on!(
    /// The same scenarios on etcd2 data, 2.2.1 → 2.3.7 → 3.0.17 (the image
    /// must bundle them: `$ETCD_EXTRA_BIN_DIR`).
    from_2_2,
    super::FROM_2_2,
    "v22"
);

scenarios_on!(
    /// The same scenarios from 3.5.16 to 3.7.1: the patch floor, 3.6, and
    /// 3.7 on WALs that still hold 3.5's v2 requests (the image must bundle
    /// 3.6.14 and 3.7.1: `$ETCD_EXTRA_BIN_DIR`).
    from_3_5,
    super::FROM_3_5,
    "v35"
);

scenarios_on!(
    /// The same scenarios from 3.0.17 to 3.2.32, across the lock's crossing
    /// from v2 to v3 (the image must bundle them: `$ETCD_EXTRA_BIN_DIR`).
    from_3_0,
    super::FROM_3_0,
    "v30"
);

/// Kubernetes' own HA manifests (issue 30): each member runs
/// `migrate-if-needed.sh || exit; exec etcd-${TARGET_VERSION}` (GCE
/// style, `--no-exec`), and the rollout restarts them one after another
/// with a target one minor up (the Kubernetes tool's `ha-v3-v3-up` case,
/// 3.4.23 → 3.5.16). Each entrypoint checks the live cluster as a roll's
/// first start does, records the target and exits 0; the manifest's etcd
/// starts it and joins, an ordinary rolling upgrade. (Two minors stay
/// refused: `refusals::gce_member_restarted_with_a_new_target_by_migrate_if_needed_is_refused_and_rejoins`.)
pub(crate) fn kubernetes_ha_manifests_roll_one_minor_up_through_migrate_if_needed() {
    let Some((mut s, _ready)) =
        Scenario::start("ha-v3-v3-up", Style::Gce, 3, "3.4.23", &["3.5.16"])
    else {
        return;
    };
    s.retarget_one_by_one("3.5.16");
    assert_eq!(
        s.counts("handing over one hop to the manifest's etcd")
            .iter()
            .sum::<usize>(),
        3,
        "every member handed its one hop over:\n{}",
        s.record()
    );
    s.finish_with("3.5.16", false);
}
