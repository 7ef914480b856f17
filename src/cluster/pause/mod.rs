//! This module owns the whole-cluster pause job (issue 28): a target that
//! no cluster takes member by member (etcd2 → etcd3, a rollback etcd has
//! no online way for), done by the members together with one pause of the
//! cluster's writes, which the operator consented to on every member
//! (`--allow-cluster-pause` / `ALLOW_CLUSTER_PAUSE=1`).
//!
//! The job, in order (every member runs the same code; the keys live
//! under `/etcd-migrate/pause/<job>/` in the cluster, the member's own
//! part in its data dir, [`Record`]):
//! 1. **Agree.** Each member with the consent records the job in its data
//!    dir (fsynced), then puts `agree/<id>`. Until the job's `go`, a
//!    member restarted with another target withdraws (a transaction that
//!    deletes its agreement only while there is no `go`), and the job
//!    waits, naming who has not agreed.
//! 2. **Go.** With every member of the membership agreed and up, one
//!    member writes `go` in a transaction that holds only while every
//!    agreement is there and no `go` is. It names the leader to carry the
//!    data (the converter, [`converter_at_go`]). Below cluster version
//!    3.3 only the leader writes it ([`may_write_go`]).
//! 3. **Shrink.** Every other member says it leaves (`stopping/<id>`);
//!    the converter, leader (else made leader: `MoveLeader`; below 3.3,
//!    where there is none, a leader that is not the converter hands the
//!    leadership over by a graceful restart of its etcd,
//!    [`hands_leadership_over`]), removes them from the
//!    membership one at a time (etcd's own `member remove`, committed by
//!    the old cluster's quorum). Where etcd refuses to remove a running
//!    member while the cluster settles (every member connected for 5 s),
//!    the converter asks one that leaves to stop first (`leave-now/<id>`,
//!    one at a time, only while every member answers:
//!    [`leaves_first`]), and removes it once it is down. A removed
//!    member's etcd stops by itself; its entrypoint records that it left
//!    (never to serve the old data again) and waits. The cluster serves
//!    writes all along.
//! 4. **Take.** Alone in the membership, the converter's log holds every
//!    committed write and it knows them committed (a cluster of one
//!    commits alone): it records that it converts and stops gracefully.
//!    The cluster's writes pause here.
//! 5. **Convert.** The converter backs up and runs the route on its data
//!    with the single-member steps, serves the target alone and puts
//!    `served`: the writes go on.
//! 6. **Join.** Each other member, one at a time under the new cluster's
//!    lock, backs up its old data, removes it, adds itself (as a learner
//!    where the target has them, [`joins_as_learner`], promoted once etcd
//!    says it caught up), starts the target on an empty data dir (etcd's
//!    snapshot transfer brings the data; a joiner whose own publish came
//!    inside that snapshot restarts its etcd once, [`publish_lost`]), is
//!    proven by `HashKV` equal to the converter's at one
//!    revision, records the target and puts `joined/<id>`. When every
//!    member joined, the converter removes the job's keys.
//!
//! Why it never splits and never loses a write: the membership shrinks
//! by raft's own reconfiguration, so no quorum of old data ever exists
//! without the converter, and etcd turns a removed member's data away;
//! the converter converts only once it is the cluster, so nothing is
//! committed that it does not hold. (Rejected: stopping the others and
//! forcing the converter's data with `--force-new-cluster`, which drops
//! the entries past the commit index its WAL records, and a follower's
//! may lag the leader's; see ARCHITECTURE.md.)
//!
//! The decisions here are pure and table-tested; `run` carries them out.

pub mod entry;
pub mod fit;
pub mod keys;
pub mod run;
pub mod v2proof;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::version::{Minor, VersionPair};

/// Whether a member joining a cluster of `target` joins as a learner: a
/// release with learners (3.4+). A learner counts for no quorum until it
/// is promoted, so a joiner that dies half-joined costs the converted
/// cluster nothing; before 3.4 it joins as a voter, one at a time.
pub use crate::cluster::self_join::joins_as_learner;

/// One job: one cluster (by its id before the job) going to one target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Job {
    /// `<cluster id hex>-<version>-<storage>`, the keys' directory.
    pub id: String,
    /// Where the job takes the cluster.
    pub target: VersionPair,
}

impl Job {
    /// The job of the cluster `cluster_id` to `target`: every member
    /// computes the same from its own data and its own target, so members
    /// started with different targets are in different jobs.
    pub fn new(cluster_id: u64, target: VersionPair) -> Job {
        Job {
            id: format!("{cluster_id:x}-{}-{}", target.version, target.storage),
            target,
        }
    }
}

/// Who carries the data, fixed by the member that wrote the job's `go`
/// ([`converter_at_go`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Go {
    /// The member that carries the data.
    pub converter: u64,
    /// The old membership, by id.
    pub members: Vec<u64>,
}

/// A member's part in the job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Carries the data.
    Converter,
    /// Leaves the old cluster (removed by the converter) and joins the
    /// converted one.
    Other,
    /// Not in the `go` (it joined the old cluster after it).
    Outside,
}

impl Go {
    /// The go of a job carried by `converter` for `members`.
    pub fn new(converter: u64, members: &[u64]) -> Go {
        let mut members = members.to_vec();
        members.sort_unstable();
        members.dedup();
        Go { converter, members }
    }

    /// Member `id`'s role.
    pub fn role(&self, id: u64) -> Role {
        if id == self.converter {
            Role::Converter
        } else if self.members.contains(&id) {
            Role::Other
        } else {
            Role::Outside
        }
    }

    /// Every member but the converter.
    pub fn others(&self) -> Vec<u64> {
        self.members
            .iter()
            .copied()
            .filter(|id| *id != self.converter)
            .collect()
    }
}

/// What the job's keys say, in one read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Seen {
    /// The members that agreed.
    pub agreed: BTreeSet<u64>,
    /// Each agreement's revision (its key's `mod_revision`): each run of a
    /// member puts it once its etcd answers, so the newest is the member
    /// whose etcd started last.
    pub agreed_at: BTreeMap<u64, i64>,
    /// The members the converter asked to stop before their removal
    /// ([`leaves_first`]).
    pub leave_now: BTreeSet<u64>,
    /// The job's go, once written.
    pub go: Option<Go>,
    /// The members that know the go and leave: the converter removes them.
    pub stopping: BTreeSet<u64>,
    /// The converted cluster serves (written in it, by the converter).
    pub served: bool,
    /// The members that joined the converted cluster.
    pub joined: BTreeSet<u64>,
}

/// The converter's next move on the way to a cluster of itself alone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Shrink {
    /// Remove this member (it said it leaves).
    Remove(u64),
    /// Wait for these members to say they leave.
    Wait(Vec<u64>),
    /// The membership is the converter alone: every committed write is
    /// in its log, and it knows them committed.
    Alone,
}

/// The converter's next move, given the `membership` it serves (ids)
/// and what the keys say: a member is removed only once it said it
/// leaves (it knows the go, and will not serve its old data again).
pub fn shrink(converter: u64, membership: &[u64], seen: &Seen) -> Shrink {
    let others: Vec<u64> = membership
        .iter()
        .copied()
        .filter(|id| *id != converter)
        .collect();
    if others.is_empty() {
        return Shrink::Alone;
    }
    // A member asked to stop first goes first: etcd removes a member
    // that is down at once, and its slot is the one the cluster lacks.
    let asked = others
        .iter()
        .find(|id| seen.leave_now.contains(id) && seen.stopping.contains(id));
    match asked.or_else(|| others.iter().find(|id| seen.stopping.contains(id))) {
        Some(id) => Shrink::Remove(*id),
        None => Shrink::Wait(others),
    }
}

/// The member the converter asks to stop before its removal, when etcd
/// refused to remove a running one while the cluster settles (etcd's
/// `--strict-reconfig-check`: a voter goes only once every member has
/// been connected for 5 s, and a member restarted by the rollout just
/// now holds every removal that long; a member that is down goes at
/// once). Only in a `membership` of 3 or more whose every member answers
/// (`all_answer`), and only while no member it asked is still in it: the
/// stop costs the cluster one member, never two, and a quorum stays to
/// commit the removal. Once every other member said it leaves, the one
/// whose agreement is the newest (each run of a member puts it again once
/// its etcd answers: the etcd started last, the one etcd waits for);
/// `None`: the converter waits (for their word, or for etcd). Never
/// below cluster version 3.3 (`cluster`): there a leadership lost by the
/// converter (killed, frozen) comes back only by a graceful restart of
/// the member that leads, which waits for every other member to answer,
/// and a member stopped first would never answer again.
pub fn leaves_first(
    converter: u64,
    membership: &[u64],
    seen: &Seen,
    all_answer: bool,
    cluster: Minor,
) -> Option<u64> {
    if cluster < MOVE_LEADER_FLOOR || membership.len() < 3 || !all_answer {
        return None;
    }
    if membership.iter().any(|id| seen.leave_now.contains(id)) {
        return None;
    }
    let others: Vec<u64> = membership
        .iter()
        .copied()
        .filter(|id| *id != converter)
        .collect();
    // Each must have said it leaves: the one etcd waits for may be the
    // last to say it.
    if others.iter().any(|id| !seen.stopping.contains(id)) {
        return None;
    }
    others
        .into_iter()
        .max_by_key(|id| (seen.agreed_at.get(id).copied().unwrap_or(0), *id))
}

/// The member the go names to carry the data, written by member `own`
/// while `leader` leads, at cluster version `cluster`. The leader: it
/// commits the removals itself with no hand-over, and (as a rule) it is
/// not the member the rollout restarted last, whose fresh connections
/// etcd makes every removal wait for (the writer is, as a rule: it saw
/// every agreement because its own came last). Below 3.3 only the
/// leader writes the go ([`may_write_go`]), so it names itself. A leader
/// outside the members (none known yet): the writer.
pub fn converter_at_go(own: u64, leader: u64, members: &[u64], cluster: Minor) -> u64 {
    if cluster >= MOVE_LEADER_FLOOR && members.contains(&leader) {
        leader
    } else {
        own
    }
}

pub use crate::plan::{JOB_FLOOR, MOVE_LEADER_FLOOR};

/// Whether this member may write the job's go at cluster version
/// `cluster`, leading or not. The go's writer carries the data, and the
/// converter must lead the old cluster while it removes the others (it
/// then commits each removal itself and knows it committed; a follower
/// can learn the last removal's commit too late, from a leader already
/// gone). From 3.3 any member writes it and moves the leadership to
/// itself; below, nothing moves the leadership to a chosen member, so
/// only the leader writes it.
pub fn may_write_go(cluster: Minor, leads: bool) -> bool {
    cluster >= MOVE_LEADER_FLOOR || leads
}

/// Whether a member hands the leadership of the old cluster over to the
/// converter by restarting its etcd gracefully (a 3.1/3.2 leader
/// transfers the leadership to a connected peer when its etcd stops on
/// SIGTERM): below 3.3 (no `MoveLeader`), after the go, when this member
/// is one the converter removes and it leads (the leadership moved since
/// the go: an election while the converter was slow). Only while every
/// other member of the old cluster answers (`others_answer`): the
/// restart costs the cluster one member, never two.
pub fn hands_leadership_over(cluster: Minor, role: Role, leads: bool, others_answer: bool) -> bool {
    cluster < MOVE_LEADER_FLOOR && role == Role::Other && leads && others_answer
}

/// The members whose agreement is missing.
pub fn not_agreed(members: &[u64], seen: &Seen) -> Vec<u64> {
    members
        .iter()
        .copied()
        .filter(|id| !seen.agreed.contains(id))
        .collect()
}

/// The phases a member records in its data dir ([`Record`]), in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Phase {
    /// Agreed to the job; its old data still serves, and the job may be
    /// withdrawn from until its `go`.
    Agreed,
    /// The converter is the old cluster's only member and stopped: it
    /// converts its data.
    Converting,
    /// Removed from the old cluster for the job: its old data never
    /// serves again; it joins the converted cluster.
    Stopping,
    /// Joining the converted cluster: the old data is backed up and goes.
    Joining,
    /// The converter serves the converted data; the job ends when every
    /// other member joined.
    Serving,
}

impl Phase {
    /// Whether the member's old data may run as a member of the old
    /// cluster in this phase (`None`: no record): until it was removed.
    pub fn old_data_serves(phase: Option<Phase>) -> bool {
        matches!(phase, None | Some(Phase::Agreed))
    }
}

/// A member as the old membership knows it: where the others find the
/// converter.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Whom {
    /// Its member id in the old cluster.
    pub id: u64,
    /// Its name.
    pub name: String,
    /// Its peer URLs.
    pub peer_urls: Vec<String>,
    /// Its client URLs.
    pub client_urls: Vec<String>,
}

/// This member's part in a job, as its data dir records it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// The job's id.
    pub job: String,
    /// The job's target (`3.3.25/etcd3`).
    pub target: String,
    /// What `version.txt` recorded when the member agreed.
    pub from: String,
    /// Where the member is.
    pub phase: Phase,
    /// The job's go, once the member saw it.
    #[serde(default)]
    pub go: Option<Go>,
    /// The converter, once the member saw the go.
    #[serde(default)]
    pub converter: Option<Whom>,
    /// The member's own id in the old cluster.
    pub own_id: u64,
    /// The backup of a joining member's old data.
    #[serde(default)]
    pub backup: Option<String>,
    /// The old membership, as this member's data recorded it when it
    /// agreed (a joining member's data is gone).
    #[serde(default)]
    pub members: Vec<Whom>,
}

impl Record {
    /// Whether a member with this record and the target `target` only
    /// withdraws from the job: the record is an agreement (no stop for it
    /// yet) to another target, and `target` is reached without a pause
    /// (`target_pauses`: its plan is a pause job; `None`: it has no plan,
    /// an error the run after the withdrawal reports). After the go the
    /// member is bound to the job whatever its target says.
    pub fn withdraws_only(&self, target: VersionPair, target_pauses: Option<bool>) -> bool {
        self.phase == Phase::Agreed
            && self.target().ok() != Some(target)
            && target_pauses != Some(true)
    }

    /// The record in `raw` (the file's bytes).
    pub fn parse(raw: &[u8]) -> Result<Record, String> {
        serde_json::from_slice(raw).map_err(|e| e.to_string())
    }

    /// Its JSON, as the file holds it.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// The job's target.
    pub fn target(&self) -> Result<VersionPair, String> {
        self.target
            .parse()
            .map_err(|e| format!("{:?}: {e}", self.target))
    }

    /// This member's role, once it saw the go.
    pub fn role(&self) -> Option<Role> {
        self.go.as_ref().map(|go| go.role(self.own_id))
    }
}

/// What a joiner sees while its new etcd does not answer on its client
/// URL yet: the signs of a publish etcd lost to its own snapshot.
///
/// A member's etcd serves clients only once its publish (its name and
/// client URLs, proposed through raft as it starts) comes back applied. A
/// joiner that started on an empty data dir receives the leader's
/// snapshot; where the others commit the publish without it (a third
/// voter, a learner) and the leader takes that snapshot after, the
/// publish is inside the snapshot, the joiner never applies it as an
/// entry, and its etcd waits out its request timeout (5 s plus two
/// election timeouts, 7 s by default) before it publishes again. Seen in
/// half the 3.3 pause jobs of the benchmark (etcd logs `publish error:
/// etcdserver: request timed out`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JoinerSigns {
    /// Since the joiner's etcd started on the empty data dir.
    pub since_start: Duration,
    /// The age of the newest raft snapshot in its data dir (`member/snap/
    /// *.snap`, written once the leader's snapshot is received), if any.
    pub snapshot_age: Option<Duration>,
    /// The converted cluster lists the joiner with its name: the publish
    /// is applied there.
    pub published: bool,
    /// Voters in the converted cluster, the joiner included if it is one.
    pub voters: usize,
    /// Whether the joiner is one of them.
    pub joiner_votes: bool,
    /// The other voters that answer on their client URLs.
    pub others_answering: usize,
}

/// How long after the leader's snapshot landed a joiner's etcd may take
/// to apply it before its silence counts as a lost publish (263 MB: 0.85 s).
pub const SNAPSHOT_APPLY_GRACE: Duration = Duration::from_millis(1500);

/// The earliest request timeout etcd has (5 s plus two election timeouts):
/// past this, a lost publish is being asked again anyway.
pub const PUBLISH_RETRY_FLOOR: Duration = Duration::from_secs(5);

/// The least a restart of the joiner's etcd takes to be worth it.
const RESTART_WORTH: Duration = Duration::from_millis(1500);

/// Restart the joiner's etcd (once): its publish is in the cluster, the
/// leader's snapshot in its data dir long enough to be applied, and it
/// still does not answer; a restart on that data publishes again at
/// once, where waiting costs the rest of etcd's request timeout. Only
/// while that wait is still long, and only where the restart costs the
/// converted cluster no quorum: the voters that answer without the
/// joiner are a majority of all voters.
pub fn publish_lost(signs: &JoinerSigns) -> bool {
    let quorum = signs.voters / 2 + 1;
    let without_joiner_ok = !signs.joiner_votes || signs.others_answering >= quorum;
    signs.published
        && signs
            .snapshot_age
            .is_some_and(|age| age >= SNAPSHOT_APPLY_GRACE)
        && signs.since_start + RESTART_WORTH < PUBLISH_RETRY_FLOOR
        && without_joiner_ok
}

/// Whether a member whose etcd exited during the job (a joiner before its
/// proof, the converter before every member joined) may start that etcd
/// again on the data dir as it is, with the same flags: the data holds
/// nothing of a member yet (`wal_written` false: a joiner's etcd that
/// never got the cluster, as when the converter was away as it started),
/// or the data of the member it joined as (`on_disk`, the WAL's member
/// id, is `entry`), or any member's where the caller has no entry to hold
/// it to (the converter, and a joiner that recorded the target: the data
/// is its own). Otherwise (another member's data, a WAL that does not
/// read) the run ends, and the next start sorts the data out.
pub fn may_start_again(wal_written: bool, on_disk: Option<u64>, entry: Option<u64>) -> bool {
    !wal_written || on_disk.is_some_and(|found| entry.is_none_or(|id| id == found))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_etcd_of_the_job_starts_again_only_on_nothing_or_its_own_member() {
        #[rustfmt::skip]
        let rows = [
            // (a WAL written, its member id, the entry joined as, may restart)
            (false, None, Some(7), true),
            (false, None, None, true),
            (true, Some(7), Some(7), true),
            (true, Some(7), None, true),
            (true, Some(8), Some(7), false),
            // A WAL that does not read (or names no member).
            (true, None, Some(7), false),
            (true, None, None, false),
        ];
        for (written, on_disk, entry, want) in rows {
            assert_eq!(
                may_start_again(written, on_disk, entry),
                want,
                "written {written}, on disk {on_disk:?}, entry {entry:?}"
            );
        }
    }

    fn signs() -> JoinerSigns {
        // The benchmark's second joiner at 3.3 (no learners): a third
        // voter, the two others up, its publish applied by them, the
        // leader's snapshot saved 1.6 s ago, 2.0 s after its start.
        JoinerSigns {
            since_start: Duration::from_millis(2000),
            snapshot_age: Some(Duration::from_millis(1600)),
            published: true,
            voters: 3,
            joiner_votes: true,
            others_answering: 2,
        }
    }

    #[test]
    fn a_joiner_whose_publish_came_inside_the_snapshot_restarts_its_etcd_only_where_safe() {
        assert!(publish_lost(&signs()), "the lost publish");
        let cases: [(&str, JoinerSigns); 6] = [
            (
                "its publish not applied yet: it may still come",
                JoinerSigns {
                    published: false,
                    ..signs()
                },
            ),
            (
                "no snapshot yet: the data is still coming",
                JoinerSigns {
                    snapshot_age: None,
                    ..signs()
                },
            ),
            (
                "the snapshot just landed: etcd may still apply it",
                JoinerSigns {
                    snapshot_age: Some(Duration::from_millis(900)),
                    ..signs()
                },
            ),
            (
                "etcd asks again soon anyway",
                JoinerSigns {
                    since_start: Duration::from_millis(3600),
                    ..signs()
                },
            ),
            // The first joiner beside the converter: two voters, the
            // restart would cost the quorum.
            (
                "a second voter of two",
                JoinerSigns {
                    voters: 2,
                    others_answering: 1,
                    ..signs()
                },
            ),
            (
                "a third voter while one other is down",
                JoinerSigns {
                    others_answering: 1,
                    ..signs()
                },
            ),
        ];
        for (why, case) in cases {
            assert!(!publish_lost(&case), "{why}: {case:?}");
        }
        // A learner costs no quorum, whoever answers.
        assert!(publish_lost(&JoinerSigns {
            joiner_votes: false,
            voters: 1,
            others_answering: 1,
            ..signs()
        }));
        // Five voters, the joiner the fifth: three others answering are
        // the quorum of five.
        assert!(publish_lost(&JoinerSigns {
            voters: 5,
            others_answering: 3,
            ..signs()
        }));
        assert!(!publish_lost(&JoinerSigns {
            voters: 5,
            others_answering: 2,
            ..signs()
        }));
    }

    #[test]
    fn below_3_3_only_the_leader_writes_the_go() {
        let (v3_1, v3_2, v3_3, v3_5) = (
            Minor::new(3, 1),
            Minor::new(3, 2),
            Minor::new(3, 3),
            Minor::new(3, 5),
        );
        #[rustfmt::skip]
        let rows = [
            // (cluster version, this member leads, may write the go)
            (v3_1, true, true),
            (v3_1, false, false),
            (v3_2, true, true),
            (v3_2, false, false),
            // MoveLeader: the writer takes the leadership after.
            (v3_3, false, true),
            (v3_3, true, true),
            (v3_5, false, true),
        ];
        for (cluster, leads, want) in rows {
            assert_eq!(
                may_write_go(cluster, leads),
                want,
                "{cluster} leads={leads}"
            );
        }
    }

    #[test]
    fn below_3_3_a_leader_that_does_not_carry_the_data_hands_it_over() {
        let (v3_2, v3_3) = (Minor::new(3, 2), Minor::new(3, 3));
        #[rustfmt::skip]
        let rows = [
            // (cluster, role, leads, every other member answers, hands over)
            ("the leadership moved off the converter", v3_2, Role::Other, true, true, true),
            ("a follower", v3_2, Role::Other, false, true, false),
            ("another member down: two would be", v3_2, Role::Other, true, false, false),
            ("the converter itself", v3_2, Role::Converter, true, true, false),
            ("not in the go", v3_2, Role::Outside, true, true, false),
            ("MoveLeader does it from 3.3", v3_3, Role::Other, true, true, false),
        ];
        for (why, cluster, role, leads, others, want) in rows {
            assert_eq!(
                hands_leadership_over(cluster, role, leads, others),
                want,
                "{why}"
            );
        }
    }

    #[test]
    fn the_go_is_the_same_whoever_computes_it() {
        let go = Go::new(30, &[50, 10, 30, 40, 20]);
        assert_eq!(go.members, vec![10, 20, 30, 40, 50]);
        assert_eq!(go.others(), vec![10, 20, 40, 50]);
        assert_eq!(go.role(30), Role::Converter);
        assert_eq!(go.role(20), Role::Other);
        assert_eq!(go.role(60), Role::Outside);
        assert_eq!(Go::new(30, &[40, 30, 50, 20, 10, 10]), go);
    }

    #[test]
    fn a_job_is_its_cluster_and_target() {
        let a = Job::new(0xabc, "3.3.25/etcd3".parse().expect("pair"));
        assert_eq!(a.id, "abc-3.3.25-etcd3");
        let b = Job::new(0xabc, "3.3.25/etcd2".parse().expect("pair"));
        assert_ne!(a.id, b.id);
    }

    #[test]
    fn the_converter_removes_only_the_members_that_said_they_leave() {
        let mut seen = Seen::default();
        // (membership, members that said they leave, next move)
        let rows: Vec<(Vec<u64>, Vec<u64>, Shrink)> = vec![
            (vec![1, 2, 3], vec![], Shrink::Wait(vec![2, 3])),
            (vec![1, 2, 3], vec![3], Shrink::Remove(3)),
            (vec![1, 2, 3], vec![2, 3], Shrink::Remove(2)),
            (vec![1, 3], vec![2, 3], Shrink::Remove(3)),
            (vec![1], vec![2, 3], Shrink::Alone),
            (vec![1], vec![], Shrink::Alone),
            // Its own word is not asked for.
            (vec![1, 2], vec![1], Shrink::Wait(vec![2])),
        ];
        for (membership, stopping, want) in rows {
            seen.stopping = stopping.iter().copied().collect();
            assert_eq!(
                shrink(1, &membership, &seen),
                want,
                "{membership:?} {stopping:?}"
            );
        }
    }

    #[test]
    fn a_member_asked_to_stop_first_is_removed_first() {
        let mut seen = Seen {
            stopping: [2, 3].into_iter().collect(),
            leave_now: [3].into_iter().collect(),
            ..Seen::default()
        };
        assert_eq!(shrink(1, &[1, 2, 3], &seen), Shrink::Remove(3));
        // Asked, but it has not said it leaves (it cannot have been asked
        // then; the word comes first all the same).
        seen.stopping = [2].into_iter().collect();
        assert_eq!(shrink(1, &[1, 2, 3], &seen), Shrink::Remove(2));
        // Removed already: the others as before.
        seen.stopping = [2, 3].into_iter().collect();
        assert_eq!(shrink(1, &[1, 2], &seen), Shrink::Remove(2));
    }

    #[test]
    fn the_converter_asks_the_last_to_agree_to_stop_first_one_at_a_time() {
        let seen = |stopping: &[u64], leave_now: &[u64]| Seen {
            stopping: stopping.iter().copied().collect(),
            leave_now: leave_now.iter().copied().collect(),
            agreed_at: [(1, 10), (2, 30), (3, 20), (4, 40), (5, 5)]
                .into_iter()
                .collect(),
            ..Seen::default()
        };
        // (membership with the converter first, said they leave, asked
        // already, all answer, asked now)
        type Row = (Vec<u64>, Vec<u64>, Vec<u64>, bool, Option<u64>);
        let rows: Vec<Row> = vec![
            (vec![1, 2, 3], vec![2, 3], vec![], true, Some(2)),
            // Only once every other member said it leaves (the one etcd
            // waits for may say it last).
            (vec![1, 2, 3], vec![3], vec![], true, None),
            (vec![1, 2, 3], vec![2], vec![], true, None),
            (vec![1, 2, 3], vec![], vec![], true, None),
            // Never the converter, however late it agreed.
            (vec![4, 2, 3], vec![2, 3, 4], vec![], true, Some(2)),
            // A member down already: a second one down would be two.
            (vec![1, 2, 3], vec![2, 3], vec![], false, None),
            // Two members: the one left could not remove the other.
            (vec![1, 2], vec![2], vec![], true, None),
            // One at a time: the one asked is still in the membership.
            (vec![1, 2, 3, 4, 5], vec![2, 3, 4, 5], vec![4], true, None),
            (vec![1, 2, 3, 5], vec![2, 3, 4, 5], vec![4], true, Some(2)),
            // No agreement read (a revision unknown): by id.
            (vec![1, 6, 7], vec![6, 7], vec![], true, Some(7)),
        ];
        for (membership, stopping, asked, all_answer, want) in rows {
            let seen = seen(&stopping, &asked);
            let at = |cluster| leaves_first(membership[0], &membership, &seen, all_answer, cluster);
            assert_eq!(
                at(Minor::new(3, 4)),
                want,
                "{membership:?} leaving {stopping:?} asked {asked:?} all answer {all_answer}"
            );
            // Below 3.3 a leadership lost comes back only while every
            // member answers: none stops first.
            assert_eq!(at(Minor::new(3, 2)), None);
        }
    }

    #[test]
    fn the_go_names_the_leader_from_3_3_and_its_writer_below() {
        let m = |s: &str| -> Minor {
            let (major, minor) = s.split_once('.').expect("major.minor");
            Minor::new(major.parse().expect("major"), minor.parse().expect("minor"))
        };
        let members = [1, 2, 3];
        // (writer, leader, cluster version, converter)
        for (own, leader, cluster, want) in [
            (3, 1, "3.4", 1),
            (3, 3, "3.4", 3),
            (3, 1, "3.3", 1),
            // No leader known, or one outside the go's members.
            (3, 0, "3.5", 3),
            (3, 9, "3.5", 3),
            // Below 3.3 only the leader writes the go.
            (2, 2, "3.2", 2),
        ] {
            assert_eq!(
                converter_at_go(own, leader, &members, m(cluster)),
                want,
                "writer {own} leader {leader} at {cluster}"
            );
        }
    }

    #[test]
    fn old_data_serves_only_before_the_member_stopped_for_the_job() {
        assert!(Phase::old_data_serves(None));
        assert!(Phase::old_data_serves(Some(Phase::Agreed)));
        for phase in [
            Phase::Converting,
            Phase::Stopping,
            Phase::Joining,
            Phase::Serving,
        ] {
            assert!(!Phase::old_data_serves(Some(phase)), "{phase:?}");
        }
    }

    #[test]
    fn a_record_reads_back() {
        let record = Record {
            job: "abc-3.3.25-etcd3".into(),
            target: "3.3.25/etcd3".into(),
            from: "3.3.25/etcd2".into(),
            phase: Phase::Stopping,
            go: Some(Go::new(1, &[1, 2, 3])),
            converter: Some(Whom {
                id: 1,
                name: "etcd-a".into(),
                peer_urls: vec!["https://10.0.0.1:2380".into()],
                client_urls: vec!["https://10.0.0.1:2379".into()],
            }),
            own_id: 2,
            backup: None,
            members: Vec::new(),
        };
        let back = Record::parse(record.to_json().as_bytes()).expect("parse");
        assert_eq!(back, record);
        assert_eq!(back.role(), Some(Role::Other));
        assert!(Record::parse(b"{}").is_err());
    }

    #[test]
    fn an_agreement_to_another_target_is_withdrawn_when_the_new_target_needs_no_pause() {
        let pair = |s: &str| s.parse::<VersionPair>().expect("pair");
        let agreed = |phase| Record {
            job: "abc-3.3.25-etcd3".into(),
            target: "3.3.25/etcd3".into(),
            from: "3.4.23/etcd3".into(),
            phase,
            go: None,
            converter: None,
            own_id: 2,
            backup: None,
            members: Vec::new(),
        };
        #[rustfmt::skip]
        let cases = [
            // (why, phase, target now, the target's plan pauses, withdraws only)
            ("raised: a rolling upgrade", Phase::Agreed, "3.5.16/etcd3", Some(false), true),
            ("back to what it records", Phase::Agreed, "3.4.23/etcd3", Some(false), true),
            ("no plan: withdrawn, then the plan's error", Phase::Agreed, "3.9.0/etcd3", None, true),
            ("another pause target: a job of its own", Phase::Agreed, "3.3.25/etcd2", Some(true), false),
            ("the same target", Phase::Agreed, "3.3.25/etcd3", Some(true), false),
            ("stopped for the job: bound to it", Phase::Stopping, "3.5.16/etcd3", Some(false), false),
            ("converting: bound to it", Phase::Converting, "3.5.16/etcd3", Some(false), false),
        ];
        for (why, phase, target, pauses, want) in cases {
            assert_eq!(
                agreed(phase).withdraws_only(pair(target), pauses),
                want,
                "{why}"
            );
        }
    }

    #[test]
    fn every_member_must_agree() {
        let mut seen = Seen::default();
        seen.agreed.extend([1, 3]);
        assert_eq!(not_agreed(&[1, 2, 3], &seen), vec![2]);
    }
}
