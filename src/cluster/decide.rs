//! This module owns the one decision a member's entrypoint makes, again and
//! again, while a multi-member cluster rolls to its target: given what the
//! member sees of the cluster ([`View`]: every member's server version or how
//! long it has been unreachable, the cluster version, alarms, learners, the
//! leader, who holds the upgrade lock) and where its own member stands
//! ([`Own`]: the release its etcd runs, whether that release is proven) and
//! wants to go ([`Goal`]), what to do now ([`Decision`]).
//!
//! It is pure: no clock, network, process or file. The caller observes,
//! calls [`decide`], acts, and observes again; every rule below is a row in
//! the table test at the end. The rules are etcd's own, made strict:
//! - a member runs minor M only while the cluster version is M − 1 or M
//!   (etcd refuses to run below the cluster version, and from 3.1 on lets a
//!   member run any number of minors ahead: we never go two ahead);
//! - the cluster version moves to M only when every member runs M, so a
//!   member moves to M + 1 only once the cluster version is M;
//! - one member restarts at a time: the restart happens only under the
//!   upgrade lock, taken only while every other member is up, a voter, and
//!   the cluster has no alarm; the leader hands leadership away first;
//! - where upstream sets a patch floor before the next minor (3.5.26
//!   before 3.6, 3.6.11 before 3.7: `plan::PATCH_FLOORS`), no member
//!   starts that minor before every member runs the floor or later;
//! - the way back is etcd's own downgrade (3.6+): with every member on
//!   minor M, one member enables the downgrade to M − 1 under the lock
//!   (the cluster version drops to M − 1 at once); then each member, once
//!   its storage version is M − 1, restarts into M − 1 under the lock, one
//!   at a time; the leader ends the job when all run it. A goal above an
//!   enabled job's target cancels it (any member; etcd ignores a second
//!   cancel). 3.5 goes back to a 3.4.32+ with no job, as etcd's guide
//!   does it: each member in turn restarts into 3.4 under the lock (with
//!   `--next-cluster-version-compatible`, which lets it run at cluster
//!   version 3.5), and the leader lowers the cluster version once the
//!   first one runs. A target with no online way back keeps the member
//!   serving.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use crate::version::{Minor, Version};

/// One member as the cluster's membership lists it, with what we could
/// learn of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    /// The member's id in the membership.
    pub id: u64,
    /// Its name (empty for a member that has not started yet).
    pub name: String,
    /// Its peer URLs, as the membership records them.
    pub peer_urls: Vec<String>,
    /// Its client URLs, as it published them (empty before it started).
    pub client_urls: Vec<String>,
    /// A learner cannot vote: a restart while one exists may cost quorum.
    pub is_learner: bool,
    /// Whether it answered, and with which server version.
    pub reach: Reach,
    /// Its storage version, as it last told it (3.6+ report one).
    pub storage: Option<Minor>,
}

/// What asking a member for its version gave.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reach {
    /// It answered with this server version.
    Up(Version),
    /// It has not answered for this long.
    Down(Duration),
}

/// What a member sees of its cluster, in one observation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct View {
    /// The cluster version, when some member told it.
    pub cluster_version: Option<Minor>,
    /// The membership, ourselves included.
    pub members: Vec<Member>,
    /// Raised alarms (NOSPACE, CORRUPT), by name.
    pub alarms: Vec<String>,
    /// The leader's member id, when there is one.
    pub leader: Option<u64>,
    /// The members whose peer endpoint listens but whose TLS handshake with
    /// us failed in this round, with why (one side does not accept the
    /// other's certificate).
    pub tls_refused: BTreeMap<u64, String>,
    /// The member id holding the upgrade lock, if any. The lock belongs to
    /// the member, not to one run of its entrypoint: a holder SIGKILLed and
    /// restarted finds the lock still its own.
    pub lock: Option<u64>,
    /// The target of an enabled downgrade job, as a 3.6+ member reports
    /// it (`None`: no job, or the member that answered is older).
    pub downgrade: Option<Minor>,
    /// The target each member's entrypoint announced when it last rolled
    /// (`/etcd-migrate/target/<id>`), by member id: a member whose
    /// announcement is not ours has not been restarted by the operator's
    /// rollout of our target yet (`rollout_gate`).
    pub announced: BTreeMap<u64, Version>,
}

/// Where our own member stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Own {
    /// Our member id.
    pub id: u64,
    /// The release our etcd runs now (the one `version.txt` records).
    pub running: Version,
    /// Whether that release has proven itself as a member of the cluster
    /// (it answered a linearizable write through the quorum).
    pub proven: bool,
    /// The peer URLs the configuration asks for.
    pub configured_peer_urls: Vec<String>,
}

/// Where our member is going.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Goal {
    /// The release the user asked for.
    pub target: Version,
    /// The next release on the way there from `running` (the first step of
    /// the plan: the newest patch of the running minor first, then the next
    /// minor), or `None` when `running` is the target.
    pub next: Option<Version>,
}

/// What to do now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Keep serving the running release; observe again later.
    Wait(Waiting),
    /// Take the upgrade lock, then decide again.
    TakeLock,
    /// We lead: hand leadership to this member before our etcd stops.
    MoveLeader {
        /// The member id to transfer leadership to.
        to: u64,
    },
    /// Stop our etcd and start this release as the same member.
    Restart {
        /// The release to start.
        into: Version,
    },
    /// Under the lock, every member on our minor: have etcd downgrade the
    /// cluster to this minor (`downgrade validate`, then `enable`).
    EnableDowngrade {
        /// The minor one below ours.
        to: Minor,
    },
    /// End the enabled downgrade job: the goal is above its target, or
    /// every member runs it.
    CancelDowngrade,
    /// Our restart is done (or nothing more may happen under the lock):
    /// release it so the next member can go.
    ReleaseLock,
    /// The target runs and is proven; nothing is left to coordinate.
    Done,
    /// Keep serving the running release for good: the target is below it,
    /// and rolling a cluster back is not done member by member.
    Stay(String),
    /// Refuse (exit 2): going on would break etcd's rules or the cluster.
    Refuse(Refusal),
}

/// Why a member waits, phrased for the progress line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Waiting {
    /// Our own etcd has not proven itself as a member yet.
    OwnNotProven {
        /// The release it runs.
        running: Version,
    },
    /// The cluster version has not reached our minor.
    ClusterVersion {
        /// The minor it must reach.
        want: Minor,
        /// What it is (`None`: no member told it).
        have: Option<Minor>,
        /// The first member still below `want`, and its state.
        behind: Option<Behind>,
    },
    /// Another member is unreachable.
    MemberDown {
        /// Its name and peer URL.
        member: String,
        /// For how long.
        down_for: Duration,
    },
    /// A learner is in the membership.
    Learner {
        /// Its name and peer URL.
        member: String,
    },
    /// Alarms are raised.
    Alarms(Vec<String>),
    /// Another member holds the upgrade lock.
    LockHeld {
        /// Its name and peer URL.
        member: String,
    },
    /// TARGET_VERSION is below the cluster version: the cluster does not
    /// roll back member by member yet, and a member that exited over it
    /// would cost the cluster a voter at every restart the rollout makes.
    /// It keeps serving its release and says so on every wait line.
    NoWayBack {
        /// The cluster version.
        cluster: Minor,
        /// The requested target.
        target: Version,
        /// How many members the cluster has.
        members: usize,
        /// The release this member serves.
        running: Version,
    },
    /// The downgrade is enabled and our member's storage version is not
    /// down to its target yet (etcd lowers it once the state is saved).
    StorageVersion {
        /// The downgrade's target.
        want: Minor,
        /// What our member reports.
        have: Minor,
    },
    /// Another member neither runs the minor we restart into nor has
    /// announced our target: the operator's rollout has not restarted it
    /// yet, and may at any moment; a restart of ours then would make two
    /// members down at once.
    Rollout {
        /// Its name and peer URL.
        member: String,
        /// What it runs, or how long it has been silent.
        reach: Reach,
        /// The target its entrypoint announced (`None`: none since the
        /// cluster ran an etcd-migrate that announces).
        announced: Option<Version>,
        /// Our target.
        target: Version,
    },
    /// The downgrade is enabled, and the cluster version has not dropped
    /// to its target yet.
    Downgrading {
        /// The downgrade's target.
        to: Minor,
        /// The cluster version now.
        cluster: Minor,
    },
    /// A member does not run upstream's patch floor before the next minor
    /// yet (or cannot be asked).
    PatchFloor {
        /// The minor that waits for it.
        next: Minor,
        /// The floor.
        need: Version,
        /// The first member below it, and its state.
        behind: Behind,
    },
}

/// A member below the minor the cluster version must reach.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Behind {
    /// Its name and peer URL.
    pub member: String,
    /// What it reported, or how long it has been silent.
    pub reach: Reach,
}

/// Why a member refuses to go on. Each names the members and versions.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// Our member id is not in the membership the cluster reports.
    #[error("this member (id {id:x}) is not in the cluster's membership ({members}); it was removed, or its data belongs to another cluster: do not start it; re-add it with `etcdctl member add` and an empty data dir")]
    NotAMember {
        /// Our id.
        id: u64,
        /// The membership, for the message.
        members: String,
    },
    /// Our release is older than the cluster version.
    #[error("this member runs {running} but the cluster version is already {cluster}: etcd refuses to run a member behind the cluster version; set TARGET_VERSION to a {cluster}.x release")]
    Behind {
        /// The release we run.
        running: Version,
        /// The cluster version.
        cluster: Minor,
    },
    /// Our release is two or more minors ahead of the cluster version.
    #[error("this member runs {running} but the cluster version is {cluster}: a member may run at most one minor ahead ({next}); bring the other members to {cluster} first")]
    TwoAhead {
        /// The release we run.
        running: Version,
        /// The cluster version.
        cluster: Minor,
        /// The highest minor allowed now.
        next: Minor,
    },
    /// A peer-URL change together with a version change.
    #[error("the configured peer URLs ({configured}) differ from this member's in the cluster's membership ({recorded}): change the peer URLs (etcdctl member update) and the version in separate rollouts")]
    PeerUrlsChanged {
        /// What the configuration asks for.
        configured: String,
        /// What the membership records.
        recorded: String,
    },
    /// No other member accepts the peer TLS this member is configured
    /// with (or this member does not accept theirs), before a version
    /// change.
    #[error("the peer TLS this member is configured with (--peer-trusted-ca-file, --peer-cert-file, --peer-key-file) fails its handshake with every other member that listens ({refused}), and no member answered: a TLS change cannot be combined with a version change; roll the TLS change out first with TARGET_VERSION={recorded} (the release version.txt records), then the version")]
    PeerTlsRefused {
        /// The members that refused, each with its peer URL and why.
        refused: String,
        /// The release the data records.
        recorded: Version,
    },
}

impl fmt::Display for Waiting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Waiting::OwnNotProven { running } => {
                write!(
                    f,
                    "waiting for this member's etcd {running} to serve a write"
                )
            }
            Waiting::ClusterVersion { want, have, behind } => {
                let have = have.map_or("unknown".to_string(), |m| m.to_string());
                match behind {
                    Some(Behind { member, reach }) => write!(
                        f,
                        "waiting for member {member} to reach {want} (cluster version {have}): {}",
                        reach_text(*reach)
                    ),
                    None => write!(
                        f,
                        "waiting for the cluster version to reach {want} (now {have})"
                    ),
                }
            }
            Waiting::MemberDown { member, down_for } => write!(
                f,
                "waiting for member {member} to be reachable: unreachable for {} s",
                down_for.as_secs()
            ),
            Waiting::Learner { member } => write!(
                f,
                "waiting for learner {member} to be promoted or removed before a restart"
            ),
            Waiting::Alarms(alarms) => write!(
                f,
                "waiting for the cluster's alarms to be cleared: {}",
                alarms.join(", ")
            ),
            Waiting::LockHeld { member } => {
                write!(f, "waiting for member {member} to finish its restart")
            }
            Waiting::NoWayBack {
                cluster,
                target,
                members,
                running,
            } => write!(
                f,
                "TARGET_VERSION {target} is below the cluster version {cluster}: this member keeps serving {running}; a cluster of {members} members goes back only through etcd's downgrade, which needs a member on 3.6 or later and the release one minor below bundled (3.5 goes down online only to a bundled 3.4.32 or newer, and 3.4 and older have no downgrade), so nothing changes until TARGET_VERSION is {cluster}.x or newer again, or the image bundles the way down"
            ),
            Waiting::StorageVersion { want, have } => write!(
                f,
                "waiting for this member's storage version to reach {want} (now {have}) after etcd's downgrade was enabled"
            ),
            Waiting::Rollout {
                member,
                reach,
                announced,
                target,
            } => {
                let announced = match announced {
                    Some(theirs) => format!("its entrypoint was started with TARGET_VERSION {theirs}"),
                    None => "its entrypoint has announced no target (not restarted with this one yet, or an etcd-migrate older than the announcements)".to_string(),
                };
                write!(
                    f,
                    "waiting for the rollout of TARGET_VERSION {target} to restart member {member} ({}; {announced}): a restart of ours before the rollout's own restart of it could take two members down at once",
                    reach_text(*reach)
                )
            }
            Waiting::Downgrading { to, cluster } => write!(
                f,
                "waiting for the cluster version to drop to {to} (now {cluster}) after etcd's downgrade was enabled"
            ),
            Waiting::PatchFloor { next, need, behind } => write!(
                f,
                "waiting for member {} to run {need} or later before any member starts {next} (upstream's rule): {}",
                behind.member,
                reach_text(behind.reach)
            ),
        }
    }
}

fn reach_text(reach: Reach) -> String {
    match reach {
        Reach::Up(version) => format!("runs {version}"),
        Reach::Down(for_) => format!("unreachable for {} s", for_.as_secs()),
    }
}

/// A member's name and first peer URL, as progress lines name it.
fn label(member: &Member) -> String {
    let name = if member.name.is_empty() {
        format!("{:x}", member.id)
    } else {
        member.name.clone()
    };
    match member.peer_urls.first() {
        Some(url) => format!("{name} ({url})"),
        None => name,
    }
}

/// The decision for one observation; see the module doc for the rules.
pub fn decide(view: &View, own: &Own, goal: &Goal) -> Decision {
    if let Some(refusal) = refusal(view, own, goal) {
        return Decision::Refuse(refusal);
    }
    let holds_lock = view.lock == Some(own.id);
    let free = decide_unlocked(view, own, goal);
    match free {
        // Anything short of a restart lets the next member go first.
        Decision::Wait(_) | Decision::Done | Decision::Stay(_) if holds_lock => {
            Decision::ReleaseLock
        }
        Decision::TakeLock if holds_lock => restart_or_hand_over(view, own, goal),
        other => other,
    }
}

/// What refuses the run whatever the lock: membership, etcd's version
/// rules, a rollback, a peer-URL change riding along with a version change.
fn refusal(view: &View, own: &Own, goal: &Goal) -> Option<Refusal> {
    let Some(me) = view.members.iter().find(|m| m.id == own.id) else {
        let members = view.members.iter().map(label).collect::<Vec<_>>();
        return Some(Refusal::NotAMember {
            id: own.id,
            members: members.join(", "),
        });
    };
    let running = own.running.minor_line();
    if let Some(cluster) = view.cluster_version {
        // A 3.4.32+ member rolled down from 3.5 runs at cluster version 3.5
        // until the leader lowers it (see the module's doc).
        let rolled_down = own.running.rolls_down_from_next_minor() && cluster == running.next();
        if running < cluster && !rolled_down {
            return Some(Refusal::Behind {
                running: own.running,
                cluster,
            });
        }
        if running > cluster.next() {
            return Some(Refusal::TwoAhead {
                running: own.running,
                cluster,
                next: cluster.next(),
            });
        }
    }
    let moving = goal.next.is_some_and(|next| next != own.running);
    if moving && !same_urls(&own.configured_peer_urls, &me.peer_urls) {
        return Some(Refusal::PeerUrlsChanged {
            configured: own.configured_peer_urls.join(","),
            recorded: me.peer_urls.join(","),
        });
    }
    None
}

/// Peer URLs compare as sets, ignoring a trailing slash.
fn same_urls(a: &[String], b: &[String]) -> bool {
    let norm = |urls: &[String]| {
        let mut v: Vec<String> = urls
            .iter()
            .map(|u| u.trim_end_matches('/').to_string())
            .collect();
        v.sort();
        v.dedup();
        v
    };
    a.is_empty() || norm(a) == norm(b)
}

/// The decision as if the lock were free for us to take.
fn decide_unlocked(view: &View, own: &Own, goal: &Goal) -> Decision {
    if !own.proven {
        return Decision::Wait(Waiting::OwnNotProven {
            running: own.running,
        });
    }
    if let Some(job) = view.downgrade {
        if goal.target.minor_line() > job || all_run(view, job) {
            return Decision::CancelDowngrade;
        }
    }
    let running = own.running.minor_line();
    let down = goal
        .next
        .filter(|next| next.minor_line() < running && running >= Minor::new(3, 6));
    if let (Some(next), Some(cluster)) = (down, view.cluster_version) {
        return downgrade_step(view, own, goal, next, cluster);
    }
    // 3.5 to a 3.4.32+: rolling restarts, as an upgrade's (no job to
    // enable; the cluster version may be 3.5 or, once one member runs 3.4,
    // 3.4).
    let rolls_down = goal.next.filter(|next| {
        running == Minor::new(3, 5)
            && next.minor_line() < running
            && next.rolls_down_from_next_minor()
    });
    if let Some(next) = rolls_down {
        return rollout_then_lock(view, own, goal, next);
    }
    if let Some(cluster) = view.cluster_version {
        // A member on the target's minor already (a 3.4.32+ rolled down
        // from 3.5, the cluster version not lowered yet) is done.
        if goal.target.minor_line() < cluster
            && goal.target.minor_line() < running
            && view.members.len() > 1
        {
            return Decision::Wait(Waiting::NoWayBack {
                cluster,
                target: goal.target,
                members: view.members.len(),
                running: own.running,
            });
        }
    }
    if goal.target.minor_line() < own.running.minor_line() {
        return Decision::Stay(format!(
            "TARGET_VERSION {} is below the running {}; the cluster version has not reached {} yet, so this member stays on {} (a member may run one minor ahead) and goes no further",
            goal.target,
            own.running,
            own.running.minor_line(),
            own.running
        ));
    }
    let Some(next) = goal.next.filter(|next| *next != own.running) else {
        return Decision::Done;
    };
    if let Some(waiting) = version_gate(view, own, next) {
        return Decision::Wait(waiting);
    }
    rollout_then_lock(view, own, goal, next)
}

/// A restart into `next` once every other member is ready (a member down
/// is named first: the rollout may be restarting it), the operator's
/// rollout is over, and the lock is ours to take.
fn rollout_then_lock(view: &View, own: &Own, goal: &Goal, next: Version) -> Decision {
    if let Some(waiting) = others_ready(view, own) {
        return Decision::Wait(waiting);
    }
    if let Some(waiting) = rollout_gate(view, own, goal, next) {
        return Decision::Wait(waiting);
    }
    ready_then_lock(view, own)
}

/// Whether the operator's rollout of our target may still restart another
/// member: one that neither runs `next`'s minor already nor has announced
/// our target. Our own restarts (the waves after the rollout's, a
/// downgrade's) go only once it is over, whatever its schedule: a member
/// the rollout restarts announces the target it was given before it
/// serves (`/etcd-migrate/target/<id>`), and one that runs `next`'s minor
/// has been restarted already. A quiet spell proves nothing: kubeadm waits
/// for each pod, a loop of the operator's may wait a minute between two.
fn rollout_gate(view: &View, own: &Own, goal: &Goal, next: Version) -> Option<Waiting> {
    view.members
        .iter()
        .filter(|m| m.id != own.id)
        .find(|m| {
            let there = matches!(m.reach, Reach::Up(v) if v.minor_line() == next.minor_line());
            !there && view.announced.get(&m.id) != Some(&goal.target)
        })
        .map(|m| Waiting::Rollout {
            member: label(m),
            reach: m.reach,
            announced: view.announced.get(&m.id).copied(),
            target: goal.target,
        })
}

/// With every other member ready, the lock (unless another member holds
/// it): the last gate of every restart, up or down.
fn ready_then_lock(view: &View, own: &Own) -> Decision {
    if let Some(waiting) = others_ready(view, own) {
        return Decision::Wait(waiting);
    }
    match view.lock {
        Some(holder) if holder != own.id => Decision::Wait(Waiting::LockHeld {
            member: member_label(view, holder),
        }),
        _ => Decision::TakeLock,
    }
}

/// Whether every member answers on `minor`.
fn all_run(view: &View, minor: Minor) -> bool {
    view.members
        .iter()
        .all(|m| matches!(m.reach, Reach::Up(v) if v.minor_line() == minor))
}

/// One member's part of a downgrade to `next`'s minor, one below ours:
/// with the cluster version still ours, the downgrade is enabled under the
/// lock; once it has dropped, our restart into `next` waits for our
/// storage version, the others and the lock, as an upgrade's does.
fn downgrade_step(view: &View, own: &Own, goal: &Goal, next: Version, cluster: Minor) -> Decision {
    let to = next.minor_line();
    let running = own.running.minor_line();
    if cluster == running {
        if view.downgrade == Some(to) {
            // etcd lowers the cluster version only with every member
            // answering: name the one it waits for, if any.
            let waiting = others_ready(view, own).unwrap_or(Waiting::Downgrading { to, cluster });
            return Decision::Wait(waiting);
        }
        // The downgrade is enabled only with every member on our minor
        // (one still above is coming down in the wave before).
        let above = view.members.iter().find(|m| match m.reach {
            Reach::Up(version) => version.minor_line() != running,
            Reach::Down(_) => false,
        });
        if let Some(member) = above {
            return Decision::Wait(Waiting::ClusterVersion {
                want: running,
                have: Some(cluster),
                behind: Some(Behind {
                    member: label(member),
                    reach: member.reach,
                }),
            });
        }
    } else if cluster == to {
        let storage = view
            .members
            .iter()
            .find(|m| m.id == own.id)
            .and_then(|m| m.storage);
        if let Some(have) = storage.filter(|s| *s > to) {
            return Decision::Wait(Waiting::StorageVersion { want: to, have });
        }
        return rollout_then_lock(view, own, goal, next);
    } else {
        // Below our minor's predecessor: the refusals have said so.
        return Decision::Wait(Waiting::ClusterVersion {
            want: to,
            have: Some(cluster),
            behind: None,
        });
    }
    ready_then_lock(view, own)
}

/// A patch restart may go at any cluster version our release accepts; the
/// next minor only once the cluster version has reached ours and every
/// member runs upstream's patch floor before it.
fn version_gate(view: &View, own: &Own, next: Version) -> Option<Waiting> {
    let running = own.running.minor_line();
    if next.minor_line() == running {
        return None;
    }
    if view.cluster_version == Some(running) {
        return patch_floor_unmet(view, own.id, next);
    }
    let behind = view
        .members
        .iter()
        .filter(|m| m.id != own.id)
        .find(|m| match m.reach {
            Reach::Up(version) => version.minor_line() < running,
            Reach::Down(_) => true,
        })
        .map(|m| Behind {
            member: label(m),
            reach: m.reach,
        });
    Some(Waiting::ClusterVersion {
        want: running,
        have: view.cluster_version,
        behind,
    })
}

/// The first member (ours aside: its own plan goes through the floor) not
/// known to run upstream's patch floor before `next`'s minor, if that
/// minor has one: no member starts it before every member runs the floor.
pub fn patch_floor_unmet(view: &View, own_id: u64, next: Version) -> Option<Waiting> {
    let (need, _) = crate::plan::patch_floor(next.minor_line())?;
    view.members
        .iter()
        .filter(|m| m.id != own_id)
        .find(|m| match m.reach {
            Reach::Up(version) => version < need,
            Reach::Down(_) => true,
        })
        .map(|m| Waiting::PatchFloor {
            next: next.minor_line(),
            need,
            behind: Behind {
                member: label(m),
                reach: m.reach,
            },
        })
}

/// Every other member up and voting, and no alarm.
fn others_ready(view: &View, own: &Own) -> Option<Waiting> {
    for member in view.members.iter().filter(|m| m.id != own.id) {
        if let Reach::Down(down_for) = member.reach {
            return Some(Waiting::MemberDown {
                member: label(member),
                down_for,
            });
        }
    }
    if let Some(learner) = view.members.iter().find(|m| m.is_learner) {
        return Some(Waiting::Learner {
            member: label(learner),
        });
    }
    if !view.alarms.is_empty() {
        return Some(Waiting::Alarms(view.alarms.clone()));
    }
    None
}

/// Under the lock: enable a downgrade the cluster version has not taken
/// yet, else hand leadership away if we lead, else restart.
fn restart_or_hand_over(view: &View, own: &Own, goal: &Goal) -> Decision {
    let Some(next) = goal.next else {
        return Decision::ReleaseLock;
    };
    let running = own.running.minor_line();
    if next.minor_line() < running
        && running >= Minor::new(3, 6)
        && view.cluster_version == Some(running)
    {
        return Decision::EnableDowngrade {
            to: next.minor_line(),
        };
    }
    if view.leader == Some(own.id) {
        if let Some(to) = leader_successor(view, own, next) {
            return Decision::MoveLeader { to };
        }
    }
    Decision::Restart { into: next }
}

/// The member to lead while we restart into `next`: a voter that is up,
/// one that runs `next`'s minor already if any (it will not restart in
/// this wave, up or down), then the newest release, lowest id among equals.
fn leader_successor(view: &View, own: &Own, next: Version) -> Option<u64> {
    view.members
        .iter()
        .filter(|m| m.id != own.id && !m.is_learner)
        .filter_map(|m| match m.reach {
            Reach::Up(version) => Some((version.minor_line() == next.minor_line(), version, m.id)),
            Reach::Down(_) => None,
        })
        .max_by(|a, b| a.0.cmp(&b.0).then(a.1.cmp(&b.1)).then(b.2.cmp(&a.2)))
        .map(|(_, _, id)| id)
}

fn member_label(view: &View, id: u64) -> String {
    view.members
        .iter()
        .find(|m| m.id == id)
        .map_or_else(|| format!("{id:x}"), label)
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: u64 = 0xa;
    const B: u64 = 0xb;
    const C: u64 = 0xc;

    fn v(s: &str) -> Version {
        s.parse().expect("test version")
    }

    fn m(s: &str) -> Minor {
        v(&format!("{s}.0")).minor_line()
    }

    fn member(id: u64, reach: Reach) -> Member {
        Member {
            id,
            name: format!("etcd-{id:x}"),
            peer_urls: vec![format!("https://10.0.0.{id}:2380")],
            client_urls: vec![format!("https://10.0.0.{id}:2379")],
            is_learner: false,
            reach,
            storage: None,
        }
    }

    fn up(s: &str) -> Reach {
        Reach::Up(v(s))
    }

    fn view_of(cluster: &str, running: &str, b: Reach, c: Reach) -> View {
        view(cluster, running, b, c)
    }

    /// Three members, we are A running `running`, B and C as given.
    fn view(cluster: &str, running: &str, b: Reach, c: Reach) -> View {
        View {
            cluster_version: (!cluster.is_empty()).then(|| m(cluster)),
            members: vec![member(A, up(running)), member(B, b), member(C, c)],
            alarms: vec![],
            leader: Some(B),
            tls_refused: BTreeMap::new(),
            lock: None,
            downgrade: None,
            announced: BTreeMap::new(),
        }
    }

    fn own(running: &str) -> Own {
        Own {
            id: A,
            running: v(running),
            proven: true,
            configured_peer_urls: vec!["https://10.0.0.10:2380".to_string()],
        }
    }

    fn goal(target: &str, next: Option<&str>) -> Goal {
        Goal {
            target: v(target),
            next: next.map(v),
        }
    }

    #[test]
    fn the_rules_as_a_table() {
        let lock = |mut view: View, holder: u64| {
            view.lock = Some(holder);
            view
        };
        let lead = |mut view: View| {
            view.leader = Some(A);
            view
        };
        let alarm = |mut view: View| {
            view.alarms = vec!["NOSPACE".to_string()];
            view
        };
        let learner = |mut view: View| {
            view.members[2].is_learner = true;
            view
        };
        let job = |mut view: View, to: &str| {
            view.downgrade = Some(m(to));
            view
        };
        // Announcements: a row without any has every member announce its
        // goal's target (the rollout is over); these set them as given.
        let said = |mut view: View, targets: &[(u64, &str)]| {
            view.announced = targets.iter().map(|(id, t)| (*id, v(t))).collect();
            view
        };
        let storage = |mut view: View, minor: &str| {
            view.members[0].storage = Some(m(minor));
            view
        };
        let unproven = |mut own: Own| {
            own.proven = false;
            own
        };
        let down = Reach::Down(Duration::from_secs(45));
        #[rustfmt::skip]
        let rows: Vec<(&str, View, Own, Goal, Decision)> = vec![
            ("all at 3.3, next minor: take the lock",
             view("3.3", "3.3.25", up("3.3.25"), up("3.3.25")), own("3.3.25"), goal("3.5.16", Some("3.4.23")),
             Decision::TakeLock),
            ("lock ours, not leader: restart into the next minor",
             lock(view("3.3", "3.3.25", up("3.3.25"), up("3.3.25")), A), own("3.3.25"), goal("3.5.16", Some("3.4.23")),
             Decision::Restart { into: v("3.4.23") }),
            ("lock ours and we lead: hand leadership to the newest other member",
             lead(lock(view("3.3", "3.3.25", up("3.3.25"), up("3.4.23")), A)), own("3.3.25"), goal("3.5.16", Some("3.4.23")),
             Decision::MoveLeader { to: C }),
            ("lock held by another member: wait for it",
             lock(view("3.3", "3.3.25", up("3.4.23"), up("3.3.25")), B), own("3.3.25"), goal("3.5.16", Some("3.4.23")),
             Decision::Wait(Waiting::LockHeld { member: "etcd-b (https://10.0.0.11:2380)".to_string() })),
            ("we moved to 3.4, others still 3.3: wait for the cluster version, naming who",
             view("3.3", "3.4.23", up("3.4.23"), up("3.3.25")), own("3.4.23"), goal("3.5.16", Some("3.5.16")),
             Decision::Wait(Waiting::ClusterVersion { want: m("3.4"), have: Some(m("3.3")),
                 behind: Some(Behind { member: "etcd-c (https://10.0.0.12:2380)".to_string(), reach: up("3.3.25") }) })),
            ("we moved to 3.4 and still hold the lock: release it",
             lock(view("3.3", "3.4.23", up("3.3.25"), up("3.3.25")), A), own("3.4.23"), goal("3.5.16", Some("3.5.16")),
             Decision::ReleaseLock),
            ("a member down blocks the next restart",
             view("3.4", "3.4.23", up("3.4.23"), down), own("3.4.23"), goal("3.5.16", Some("3.5.16")),
             Decision::Wait(Waiting::MemberDown { member: "etcd-c (https://10.0.0.12:2380)".to_string(), down_for: Duration::from_secs(45) })),
            ("a member down below our minor: the cluster-version wait names it",
             view("3.3", "3.4.23", up("3.4.23"), down), own("3.4.23"), goal("3.5.16", Some("3.5.16")),
             Decision::Wait(Waiting::ClusterVersion { want: m("3.4"), have: Some(m("3.3")),
                 behind: Some(Behind { member: "etcd-c (https://10.0.0.12:2380)".to_string(), reach: down }) })),
            ("an alarm blocks the restart",
             alarm(view("3.4", "3.4.23", up("3.4.23"), up("3.4.23"))), own("3.4.23"), goal("3.5.16", Some("3.5.16")),
             Decision::Wait(Waiting::Alarms(vec!["NOSPACE".to_string()]))),
            ("a learner blocks the restart",
             learner(view("3.4", "3.4.23", up("3.4.23"), up("3.4.23"))), own("3.4.23"), goal("3.5.16", Some("3.5.16")),
             Decision::Wait(Waiting::Learner { member: "etcd-c (https://10.0.0.12:2380)".to_string() })),
            ("an alarm raised while we hold the lock: release it, restart nothing",
             alarm(lock(view("3.4", "3.4.23", up("3.4.23"), up("3.4.23")), A)), own("3.4.23"), goal("3.5.16", Some("3.5.16")),
             Decision::ReleaseLock),
            ("a patch first goes at any cluster version our minor accepts",
             view("3.2", "3.3.20", up("3.2.32"), up("3.3.25")), own("3.3.20"), goal("3.5.16", Some("3.3.25")),
             Decision::TakeLock),
            ("our own etcd not yet proven: wait for it",
             view("3.3", "3.3.25", up("3.3.25"), up("3.3.25")), unproven(own("3.3.25")), goal("3.5.16", Some("3.4.23")),
             Decision::Wait(Waiting::OwnNotProven { running: v("3.3.25") })),
            ("the target runs: done",
             view("3.5", "3.5.16", up("3.5.16"), up("3.5.16")), own("3.5.16"), goal("3.5.16", None),
             Decision::Done),
            ("the target runs but we hold the lock: release it first",
             lock(view("3.4", "3.5.16", up("3.4.23"), up("3.5.16")), A), own("3.5.16"), goal("3.5.16", None),
             Decision::ReleaseLock),
            ("2.x: 2.3 → 3.0 once the cluster version is 2.3",
             view("2.3", "2.3.7", up("2.3.7"), up("2.3.7")), own("2.3.7"), goal("3.0.17", Some("3.0.17")),
             Decision::TakeLock),
            ("unknown cluster version: wait, never guess",
             view("", "3.3.25", up("3.3.25"), up("3.3.25")), own("3.3.25"), goal("3.4.23", Some("3.4.23")),
             Decision::Wait(Waiting::ClusterVersion { want: m("3.3"), have: None, behind: None })),
            ("target lowered mid-wave: the members already ahead stay",
             view("3.4", "3.5.16", up("3.4.23"), up("3.5.16")), own("3.5.16"), goal("3.4.23", None),
             Decision::Stay("TARGET_VERSION 3.4.23 is below the running 3.5.16; the cluster version has not reached 3.5 yet, so this member stays on 3.5.16 (a member may run one minor ahead) and goes no further".to_string())),
            ("behind the cluster version: refuse",
             view("3.4", "3.3.25", up("3.4.23"), up("3.4.23")), own("3.3.25"), goal("3.5.16", Some("3.4.23")),
             Decision::Refuse(Refusal::Behind { running: v("3.3.25"), cluster: m("3.4") })),
            ("two minors ahead: refuse",
             view("3.3", "3.5.16", up("3.3.25"), up("3.3.25")), own("3.5.16"), goal("3.5.16", None),
             Decision::Refuse(Refusal::TwoAhead { running: v("3.5.16"), cluster: m("3.3"), next: m("3.4") })),
            ("3.6 waits for every member to run 3.5.26 or later",
             view("3.5", "3.5.30", up("3.5.30"), up("3.5.16")), own("3.5.30"), goal("3.6.14", Some("3.6.14")),
             Decision::Wait(Waiting::PatchFloor { next: m("3.6"), need: v("3.5.26"),
                 behind: Behind { member: "etcd-c (https://10.0.0.12:2380)".to_string(), reach: up("3.5.16") } })),
            ("3.7 waits for every member to run 3.6.11 or later",
             view("3.6", "3.6.14", up("3.6.10"), up("3.6.14")), own("3.6.14"), goal("3.7.1", Some("3.7.1")),
             Decision::Wait(Waiting::PatchFloor { next: m("3.7"), need: v("3.6.11"),
                 behind: Behind { member: "etcd-b (https://10.0.0.11:2380)".to_string(), reach: up("3.6.10") } })),
            ("every member on the floor: 3.7 may go",
             view("3.6", "3.6.14", up("3.6.11"), up("3.6.14")), own("3.6.14"), goal("3.7.1", Some("3.7.1")),
             Decision::TakeLock),
            ("a patch below the floor goes first, at any time",
             view("3.5", "3.5.16", up("3.5.16"), up("3.5.16")), own("3.5.16"), goal("3.6.14", Some("3.5.30")),
             Decision::TakeLock),
            ("a completed wave rolled back: keep serving, say why (an exit would cost a voter)",
             view("3.5", "3.5.16", up("3.5.16"), up("3.5.16")), own("3.5.16"), goal("3.4.23", None),
             Decision::Wait(Waiting::NoWayBack { cluster: m("3.5"), target: v("3.4.23"), members: 3, running: v("3.5.16") })),
            ("rolled back while holding the lock: the lock goes first",
             lock(view("3.5", "3.5.16", up("3.5.16"), up("3.5.16")), A), own("3.5.16"), goal("3.4.23", None),
             Decision::ReleaseLock),
            // The way back through etcd's downgrade.
            ("3.7 all round, target 3.6: take the lock to enable the downgrade",
             view("3.7", "3.7.1", up("3.7.1"), up("3.7.1")), own("3.7.1"), goal("3.6.14", Some("3.6.14")),
             Decision::TakeLock),
            ("the lock ours: enable the downgrade (not a restart: 3.6 refuses cluster version 3.7)",
             lead(lock(view("3.7", "3.7.1", up("3.7.1"), up("3.7.1")), A)), own("3.7.1"), goal("3.5.30", Some("3.6.14")),
             Decision::EnableDowngrade { to: m("3.6") }),
            ("a member down: no enable either",
             view("3.7", "3.7.1", up("3.7.1"), down), own("3.7.1"), goal("3.6.14", Some("3.6.14")),
             Decision::Wait(Waiting::MemberDown { member: "etcd-c (https://10.0.0.12:2380)".to_string(), down_for: Duration::from_secs(45) })),
            ("enabled, the cluster version not dropped yet: wait",
             job(view("3.7", "3.7.1", up("3.7.1"), up("3.7.1")), "3.6"), own("3.7.1"), goal("3.6.14", Some("3.6.14")),
             Decision::Wait(Waiting::Downgrading { to: m("3.6"), cluster: m("3.7") })),
            ("enabled, a member cut off: etcd keeps the cluster version until it answers; name it",
             job(view("3.7", "3.7.1", up("3.7.1"), down), "3.6"), own("3.7.1"), goal("3.6.14", Some("3.6.14")),
             Decision::Wait(Waiting::MemberDown { member: "etcd-c (https://10.0.0.12:2380)".to_string(), down_for: Duration::from_secs(45) })),
            ("dropped, our storage still 3.7: wait for it",
             storage(job(view("3.6", "3.7.1", up("3.7.1"), up("3.7.1")), "3.6"), "3.7"), own("3.7.1"), goal("3.6.14", Some("3.6.14")),
             Decision::Wait(Waiting::StorageVersion { want: m("3.6"), have: m("3.7") })),
            ("dropped, storage 3.6: take the lock to restart",
             storage(job(view("3.6", "3.7.1", up("3.7.1"), up("3.6.14")), "3.6"), "3.6"), own("3.7.1"), goal("3.6.14", Some("3.6.14")),
             Decision::TakeLock),
            ("the lock ours and we lead: hand over to the member already on 3.6",
             lead(lock(storage(job(view("3.6", "3.7.1", up("3.7.1"), up("3.6.14")), "3.6"), "3.6"), A)), own("3.7.1"), goal("3.6.14", Some("3.6.14")),
             Decision::MoveLeader { to: C }),
            ("the lock ours: restart into 3.6",
             lock(storage(job(view("3.6", "3.7.1", up("3.7.1"), up("3.6.14")), "3.6"), "3.6"), A), own("3.7.1"), goal("3.6.14", Some("3.6.14")),
             Decision::Restart { into: v("3.6.14") }),
            ("another member restarting: wait for it",
             lock(storage(job(view("3.6", "3.7.1", up("3.7.1"), up("3.6.14")), "3.6"), "3.6"), B), own("3.7.1"), goal("3.6.14", Some("3.6.14")),
             Decision::Wait(Waiting::LockHeld { member: "etcd-b (https://10.0.0.11:2380)".to_string() })),
            ("on 3.6 with the others: the job is over, end it",
             job(view("3.6", "3.6.14", up("3.6.14"), up("3.6.14")), "3.6"), own("3.6.14"), goal("3.6.14", None),
             Decision::CancelDowngrade),
            ("3.7 → 3.5: on 3.6 while a member still runs 3.7: wait for it, never enable 3.5 yet",
             job(view("3.6", "3.6.14", up("3.7.1"), up("3.6.14")), "3.6"), own("3.6.14"), goal("3.5.30", Some("3.5.30")),
             Decision::Wait(Waiting::ClusterVersion { want: m("3.6"), have: Some(m("3.6")),
                 behind: Some(Behind { member: "etcd-b (https://10.0.0.11:2380)".to_string(), reach: up("3.7.1") }) })),
            ("3.7 → 3.5: on 3.6 all round, the next wave enables 3.5",
             view("3.6", "3.6.14", up("3.6.14"), up("3.6.14")), own("3.6.14"), goal("3.5.30", Some("3.5.30")),
             Decision::TakeLock),
            ("target raised mid-downgrade: cancel the job",
             job(view("3.6", "3.6.14", up("3.7.1"), up("3.6.14")), "3.6"), own("3.6.14"), goal("3.7.1", Some("3.7.1")),
             Decision::CancelDowngrade),
            ("cancelled: back up as an upgrade",
             view("3.6", "3.6.14", up("3.7.1"), up("3.6.14")), own("3.6.14"), goal("3.7.1", Some("3.7.1")),
             Decision::TakeLock),
            ("3.5 → 3.4.31: no online way (3.4.32+ lowers a 3.5 cluster version), keep serving and say why",
             view("3.5", "3.5.30", up("3.5.30"), up("3.5.30")), own("3.5.30"), goal("3.4.31", Some("3.4.31")),
             Decision::Wait(Waiting::NoWayBack { cluster: m("3.5"), target: v("3.4.31"), members: 3, running: v("3.5.30") })),
            ("3.5 → 3.4.45: a rolling restart, no job: take the lock",
             view("3.5", "3.5.16", up("3.5.16"), up("3.5.16")), own("3.5.16"), goal("3.4.45", Some("3.4.45")),
             Decision::TakeLock),
            ("3.5 → 3.4.45, the lock ours: restart (never enable a job 3.5 does not roll on)",
             lock(view("3.5", "3.5.16", up("3.5.16"), up("3.5.16")), A), own("3.5.16"), goal("3.4.45", Some("3.4.45")),
             Decision::Restart { into: v("3.4.45") }),
            ("3.5 → 3.4.45, the lock ours and we lead: hand leadership to a member on 3.4 first",
             lead(lock(view("3.4", "3.5.16", up("3.5.16"), up("3.4.45")), A)), own("3.5.16"), goal("3.4.45", Some("3.4.45")),
             Decision::MoveLeader { to: C }),
            ("3.5 → 3.4.45, another member restarting: wait for it",
             view("3.5", "3.5.16", down, up("3.5.16")), own("3.5.16"), goal("3.4.45", Some("3.4.45")),
             Decision::Wait(Waiting::MemberDown { member: "etcd-b (https://10.0.0.11:2380)".to_string(), down_for: Duration::from_secs(45) })),
            ("3.5 → 3.4.45, a member the rollout has not restarted: wait for the rollout",
             said(view("3.5", "3.5.16", up("3.5.16"), up("3.5.16")), &[(B, "3.5.16"), (C, "3.4.45")]), own("3.5.16"), goal("3.4.45", Some("3.4.45")),
             Decision::Wait(Waiting::Rollout { member: "etcd-b (https://10.0.0.11:2380)".to_string(), reach: up("3.5.16"), announced: Some(v("3.5.16")), target: v("3.4.45") })),
            ("3.4.45 at cluster version 3.5 (not lowered yet): done, not behind",
             view("3.5", "3.4.45", up("3.5.16"), up("3.5.16")), own("3.4.45"), goal("3.4.45", None),
             Decision::Done),
            ("dropped, storage 3.6, a member still on 3.7 announced 3.7.1: the rollout has not restarted it yet, wait (issue 30)",
             said(storage(job(view("3.6", "3.7.1", up("3.7.1"), up("3.6.14")), "3.6"), "3.6"), &[(B, "3.7.1"), (C, "3.6.14")]), own("3.7.1"), goal("3.6.14", Some("3.6.14")),
             Decision::Wait(Waiting::Rollout { member: "etcd-b (https://10.0.0.11:2380)".to_string(), reach: up("3.7.1"), announced: Some(v("3.7.1")), target: v("3.6.14") })),
            ("the same for the member that enabled the job and holds the lock still: let it go (issue 30: it restarted under the rollout)",
             lock(said(storage(job(view("3.6", "3.7.1", up("3.7.1"), up("3.7.1")), "3.6"), "3.6"), &[(B, "3.7.1"), (C, "3.7.1")]), A), own("3.7.1"), goal("3.6.14", Some("3.6.14")),
             Decision::ReleaseLock),
            ("a member on 3.7 that announced nothing (not restarted with our target, or an older entrypoint): wait",
             said(storage(job(view("3.6", "3.7.1", up("3.7.1"), up("3.7.1")), "3.6"), "3.6"), &[(A, "3.6.14")]), own("3.7.1"), goal("3.6.14", Some("3.6.14")),
             Decision::Wait(Waiting::Rollout { member: "etcd-b (https://10.0.0.11:2380)".to_string(), reach: up("3.7.1"), announced: None, target: v("3.6.14") })),
            ("every other member announced ours, one still on 3.7: the rollout is over, the restarts go one at a time",
             said(storage(job(view("3.6", "3.7.1", up("3.7.1"), up("3.6.14")), "3.6"), "3.6"), &[(B, "3.6.14"), (C, "3.6.14")]), own("3.7.1"), goal("3.6.14", Some("3.6.14")),
             Decision::TakeLock),
            ("every other member on 3.6 already, announced or not: the last one goes",
             said(storage(job(view("3.6", "3.7.1", up("3.6.14"), up("3.6.14")), "3.6"), "3.6"), &[(A, "3.6.14")]), own("3.7.1"), goal("3.6.14", Some("3.6.14")),
             Decision::TakeLock),
            ("dropped, a member cut off: name it, not the rollout",
             said(storage(job(view("3.6", "3.7.1", up("3.6.14"), down), "3.6"), "3.6"), &[(A, "3.6.14")]), own("3.7.1"), goal("3.6.14", Some("3.6.14")),
             Decision::Wait(Waiting::MemberDown { member: "etcd-c (https://10.0.0.12:2380)".to_string(), down_for: Duration::from_secs(45) })),
            ("an upgrade's second wave: a member the rollout has not restarted (announced 3.3.25) waits the wave",
             said(view("3.4", "3.4.23", up("3.4.23"), up("3.4.23")), &[(B, "3.3.25"), (C, "3.5.16")]), own("3.4.23"), goal("3.5.16", Some("3.5.16")),
             Decision::Wait(Waiting::Rollout { member: "etcd-b (https://10.0.0.11:2380)".to_string(), reach: up("3.4.23"), announced: Some(v("3.3.25")), target: v("3.5.16") })),
            ("an upgrade's second wave, the rollout over: take the lock",
             said(view("3.4", "3.4.23", up("3.4.23"), up("3.4.23")), &[(B, "3.5.16"), (C, "3.5.16")]), own("3.4.23"), goal("3.5.16", Some("3.5.16")),
             Decision::TakeLock),
            ("a partial upgrade undone: 3.7 back to 3.6 at cluster version 3.6, no job needed",
             storage(view("3.6", "3.7.1", up("3.6.14"), up("3.6.14")), "3.6"), own("3.7.1"), goal("3.6.14", Some("3.6.14")),
             Decision::TakeLock),
        ];
        for (name, mut view, own, goal, want) in rows {
            if view.announced.is_empty() {
                view.announced = view.members.iter().map(|m| (m.id, goal.target)).collect();
            }
            assert_eq!(decide(&view, &own, &goal), want, "{name}");
        }
    }

    #[test]
    fn a_member_missing_from_the_membership_is_refused_naming_the_members() {
        let mut view = view("3.3", "3.3.25", up("3.3.25"), up("3.3.25"));
        view.members.remove(0);
        let Decision::Refuse(refusal) = decide(&view, &own("3.3.25"), &goal("3.4.23", None)) else {
            panic!("not refused");
        };
        let text = refusal.to_string();
        assert!(text.contains("id a"), "{text}");
        assert!(text.contains("etcd-b (https://10.0.0.11:2380)"), "{text}");
    }

    #[test]
    fn a_peer_url_change_refuses_only_together_with_a_version_change() {
        let mut view = view("3.3", "3.3.25", up("3.3.25"), up("3.3.25"));
        view.announced = [(B, v("3.4.23")), (C, v("3.4.23"))].into();
        let mut moved = own("3.3.25");
        moved.configured_peer_urls = vec!["https://10.9.9.9:2380".to_string()];
        assert!(matches!(
            decide(&view, &moved, &goal("3.4.23", Some("3.4.23"))),
            Decision::Refuse(Refusal::PeerUrlsChanged { .. })
        ));
        assert_eq!(decide(&view, &moved, &goal("3.3.25", None)), Decision::Done);
        let mut slash = own("3.3.25");
        slash.configured_peer_urls = vec!["https://10.0.0.10:2380/".to_string()];
        assert_eq!(
            decide(&view, &slash, &goal("3.4.23", Some("3.4.23"))),
            Decision::TakeLock
        );
    }

    #[test]
    fn progress_lines_name_the_member_and_how_long() {
        let waiting = Waiting::ClusterVersion {
            want: m("3.4"),
            have: Some(m("3.3")),
            behind: Some(Behind {
                member: "etcd-b (https://10.0.0.2:2380)".to_string(),
                reach: Reach::Down(Duration::from_secs(45)),
            }),
        };
        assert_eq!(
            waiting.to_string(),
            "waiting for member etcd-b (https://10.0.0.2:2380) to reach 3.4 (cluster version 3.3): unreachable for 45 s"
        );
    }

    #[test]
    fn the_leader_hands_over_to_an_up_voter_never_a_learner_or_a_silent_member() {
        let mut view = view("3.3", "3.3.25", Reach::Down(Duration::ZERO), up("3.3.25"));
        view.members[1].reach = up("3.4.23");
        view.members[1].is_learner = true;
        assert_eq!(
            leader_successor(&view, &own("3.3.25"), v("3.4.23")),
            Some(C)
        );
        view.members[2].reach = Reach::Down(Duration::ZERO);
        assert_eq!(leader_successor(&view, &own("3.3.25"), v("3.4.23")), None);
        // Going down, a member already down there leads, not the newest.
        let view = view_of("3.6", "3.7.1", up("3.7.1"), up("3.6.14"));
        assert_eq!(leader_successor(&view, &own("3.7.1"), v("3.6.14")), Some(C));
    }
}
