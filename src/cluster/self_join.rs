//! This module owns a member that joins its live cluster by itself (issue
//! 29 item 3): started on an empty data dir with `--initial-cluster-state
//! existing`, it adds itself to the membership instead of waiting for a
//! `member add` by hand (kubeadm's "join control plane" move, and a member
//! replaced after it lost its data).
//!
//! What the membership must become is pure ([`change`]): nothing when a
//! member with our peer URL was added and never started (someone ran
//! `member add`); a stale entry of ours (our name and peer URL, started
//! once: our data was lost) removed first, then added again; an entry of
//! another member on our peer URL, or of our name on other peer URLs,
//! refused by name. The calls go to the members that answer, through the
//! client API with the member's own client TLS; etcd itself refuses an
//! add that would cost the quorum (`--strict-reconfig-check`). The member
//! joins as a voter, as `etcdctl member add` makes it, or, where the caller
//! asks (a release with learners, 3.4+, and a caller that stays to promote
//! it: the pause job's joiners), as a learner that [`try_promote`] makes a voter
//! once etcd says it caught up: until then it counts for no quorum, so a
//! joiner that dies half-joined costs the cluster nothing.

use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use tokio::sync::watch;

use crate::cluster::client::{self, ClientError};
use crate::cluster::decide::Member;
use crate::cluster::join::Peer;
use crate::cluster::member::SupervisedEtcd;
use crate::cluster::peer::{PeerClient, TlsFiles};
use crate::cluster::roll::{self, Ended, MemberEtcd};
use crate::datadir::DataDirError;
use crate::log;
use crate::log::error_chain;
use crate::supervisor::{ExitStatus, SupervisorError};
use crate::version::Version;

/// How long a member add refused as "unhealthy cluster" is asked again.
const UNHEALTHY_RETRY: Duration = Duration::from_secs(60);
/// The pause between two promotes of a learner that has not caught up.
const PROMOTE_EVERY: Duration = Duration::from_millis(200);
/// How often an unchanged wait for the promotion is reported again.
const PROGRESS_EVERY: Duration = Duration::from_secs(15);

/// Whether a member joining a cluster of `target` joins as a learner
/// (etcd has learners from 3.4 on), where a caller stays to promote it
/// (the pause job's joiners, and an exec'd member's self-join).
pub fn joins_as_learner(target: Version) -> bool {
    target >= Version::new(3, 4, 0)
}

/// This member in its cluster after the join: its id, and the
/// `--initial-cluster` etcd must start with to join it (every member's
/// name and peer URLs as the membership holds them now, ours included: etcd
/// refuses a joining member whose list differs from the membership).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Joined {
    /// Our member id.
    pub id: u64,
    /// `name=url,...` of the membership.
    pub initial_cluster: String,
    /// Added as a learner: promote it once its etcd runs ([`try_promote`]).
    pub learner: bool,
    /// The client URLs of the other started members (where a promote is
    /// asked).
    pub endpoints: Vec<String>,
}

/// `name=url,...` of `members` (id, name, peer URLs), ours (`own_id`,
/// unstarted so unnamed) under `name`.
pub fn initial_cluster(members: &[(u64, String, Vec<String>)], own_id: u64, name: &str) -> String {
    members
        .iter()
        .flat_map(|(id, member, urls)| {
            let member = if *id == own_id { name } else { member.as_str() };
            urls.iter().map(move |url| format!("{member}={url}"))
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// What the membership needs for us to join.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// Added already (by hand or by an earlier start of ours), never
    /// started: etcd joins as it is.
    AddedAlready {
        /// The entry's id.
        id: u64,
        /// The entry is a learner's.
        learner: bool,
    },
    /// Not there: add us.
    Add,
    /// Our entry from before our data was lost: remove it, then add us.
    Replace {
        /// The stale entry's id.
        id: u64,
    },
}

/// Why the member could not add itself (nothing was started).
#[derive(Debug, thiserror::Error)]
pub enum SelfJoinError {
    /// Another member has our peer URL.
    #[error("member {other} already has the peer URL {url} this member advertises: two members cannot share one; give this member its own --initial-advertise-peer-urls, or remove {other} (etcdctl member remove) if it is gone for good")]
    UrlTaken {
        /// The other member's name and id.
        other: String,
        /// The URL.
        url: String,
    },
    /// A member of our name has other peer URLs.
    #[error("a member named {name} (id {id:x}) is in the cluster with peer URLs {theirs}, not this member's {ours}: a moved member is removed first (etcdctl member remove {id:x}) or joins under another name")]
    NameTaken {
        /// The name.
        name: String,
        /// Its id.
        id: u64,
        /// Its peer URLs.
        theirs: String,
        /// Ours.
        ours: String,
    },
    /// No other member answered its peer `/members`.
    #[error("no member of the cluster this member joins answered for its membership ({tried}); start it again once one serves")]
    NoAnswer {
        /// The peer URLs asked, with why each failed.
        tried: String,
    },
    /// The client API.
    #[error(transparent)]
    Client(#[from] ClientError),
    /// A membership call failed.
    #[error("{action} through {endpoints} failed: {reason}")]
    Call {
        /// What was asked (e.g. `member add https://10.0.0.4:2380`).
        action: String,
        /// The client URLs.
        endpoints: String,
        /// What etcd said.
        reason: String,
    },
}

/// A URL as the membership compares it (etcd keeps what it was given; a
/// trailing slash is the same URL).
fn norm(url: &str) -> String {
    url.trim_end_matches('/').to_string()
}

/// What must change for a member named `name` advertising `peer_urls` to
/// join `members` (see the module doc).
pub fn change(
    members: &[Member],
    name: &str,
    peer_urls: &[String],
) -> Result<Change, SelfJoinError> {
    let ours: Vec<String> = peer_urls.iter().map(|u| norm(u)).collect();
    for member in members {
        let shared = member
            .peer_urls
            .iter()
            .map(|u| norm(u))
            .find(|u| ours.contains(u));
        if let Some(url) = shared {
            if member.name.is_empty() {
                return Ok(Change::AddedAlready {
                    id: member.id,
                    learner: member.is_learner,
                });
            }
            if member.name == name {
                return Ok(Change::Replace { id: member.id });
            }
            return Err(SelfJoinError::UrlTaken {
                other: format!("{} ({:x})", member.name, member.id),
                url,
            });
        }
        if member.name == name {
            return Err(SelfJoinError::NameTaken {
                name: name.to_string(),
                id: member.id,
                theirs: member.peer_urls.join(","),
                ours: peer_urls.join(","),
            });
        }
    }
    Ok(Change::Add)
}

/// Adds this member (`name`, `peer_urls`) to the cluster `others` belong
/// to, as [`change`] says; as a learner when `as_learner`.
pub async fn add_self(
    others: &[Peer],
    name: &str,
    peer_urls: &[String],
    peer_tls: Option<&TlsFiles>,
    client_tls: Option<&TlsFiles>,
    timeout: Duration,
    as_learner: bool,
) -> Result<Joined, SelfJoinError> {
    let peer = PeerClient::new(peer_tls, timeout).map_err(|e| SelfJoinError::NoAnswer {
        tried: e.to_string(),
    })?;
    let mut tried = Vec::new();
    let mut members = None;
    for other in others {
        match peer.members(&other.url).await {
            Ok(list) => {
                members = Some(list);
                break;
            }
            Err(err) => tried.push(format!("{}: {}", other.url, error_chain(&err))),
        }
    }
    let Some(listed) = members else {
        return Err(SelfJoinError::NoAnswer {
            tried: tried.join("; "),
        });
    };
    let members = as_applied(listed, peer_urls, client_tls, timeout).await;
    let what = change(&members, name, peer_urls)?;
    // The others' client URLs, one at a time: a client balancing over all
    // of them sends a call to one that is down (our own stale entry's
    // above all) and fails it.
    let ours = match what {
        Change::Replace { id } | Change::AddedAlready { id, .. } => Some(id),
        Change::Add => None,
    };
    let endpoints: Vec<String> = members
        .iter()
        .filter(|m| !m.name.is_empty() && Some(m.id) != ours)
        .flat_map(|m| m.client_urls.iter().cloned())
        .collect();
    if let Change::AddedAlready { id, learner } = what {
        log::info(
            "this member is in the membership already, never started: joining as it is",
            &[
                ("id", format!("{id:x}").into()),
                ("learner", learner.into()),
            ],
        );
        let list: Vec<(u64, String, Vec<String>)> = members
            .iter()
            .map(|m| (m.id, m.name.clone(), m.peer_urls.clone()))
            .collect();
        return Ok(Joined {
            id,
            initial_cluster: initial_cluster(&list, id, name),
            learner,
            endpoints,
        });
    }
    let mut last = None;
    for endpoint in &endpoints {
        let asked = Asked {
            name,
            peer_urls,
            as_learner,
        };
        match membership_change(endpoint, client_tls, timeout, what.clone(), &asked).await {
            Ok(mut joined) => {
                joined.endpoints.clone_from(&endpoints);
                return Ok(joined);
            }
            Err(err) => {
                log::warn(
                    "a member could not make the membership change; trying the next",
                    &[
                        ("endpoint", endpoint.as_str().into()),
                        ("error", err.to_string().into()),
                    ],
                );
                last = Some(err);
            }
        }
    }
    Err(last.unwrap_or(SelfJoinError::NoAnswer {
        tried: "no other member publishes a client URL".to_string(),
    }))
}

/// The membership `listed` by a peer `/members` answer, read again
/// through the client API of the members it names, all at once, the first
/// answer taken (not ours: an entry on our peer URLs is our own, not
/// serving).
///
/// Why: etcd answers its peer `/members` from the middle of its log's
/// replay when it has just restarted, so that list can be of an index
/// long before the cluster's: short of our own stale entry (then the add
/// is refused, "Peer URLs already exists"), or of a member of our name on
/// other URLs (then [`change`] does not refuse it). etcd serves its client
/// API only once its own publish is applied, after every entry its log
/// held ([`client::membership`]). Where no client API answers (a cluster
/// whose client TLS is not ours to speak, or every member just started),
/// the peer list is what there is; the add, asked through the client API
/// too, then fails and is asked again.
async fn as_applied(
    listed: Vec<Member>,
    peer_urls: &[String],
    client_tls: Option<&TlsFiles>,
    timeout: Duration,
) -> Vec<Member> {
    let ours: Vec<String> = peer_urls.iter().map(|u| norm(u)).collect();
    let endpoints: Vec<String> = listed
        .iter()
        .filter(|m| !m.name.is_empty() && !m.peer_urls.iter().any(|u| ours.contains(&norm(u))))
        .flat_map(|m| m.client_urls.iter().cloned())
        .collect();
    if endpoints.is_empty() {
        return listed;
    }
    // All at once, the first answer taken: a member that is down and
    // cut off would hold a one-at-a-time read for its whole timeout.
    let asked = endpoints.iter().map(|endpoint| {
        Box::pin(async move {
            client::membership(std::slice::from_ref(endpoint), client_tls, timeout)
                .await
                .map(|applied| (endpoint, applied))
                .map_err(|err| err.to_string())
        })
    });
    let first = futures_util::future::select_ok(asked)
        .await
        .map(|(first, _)| first);
    match first {
        Ok((endpoint, applied)) => {
            let ids = |list: &[Member]| {
                let mut ids: Vec<u64> = list.iter().map(|m| m.id).collect();
                ids.sort_unstable();
                ids
            };
            if ids(&applied) != ids(&listed) {
                log::info(
                    "the membership read through a member's client API differs from a peer's /members answer (read during that peer's log replay); the client API's is used",
                    &[
                        ("endpoint", endpoint.as_str().into()),
                        ("peer_listed", listed.len().into()),
                        ("applied", applied.len().into()),
                    ],
                );
            }
            applied
        }
        Err(last) => {
            log::warn(
                "no member's client API answered for the membership; using a peer's /members answer",
                &[("error", last.into())],
            );
            listed
        }
    }
}

/// Who asks to be added, and how.
#[derive(Debug, Clone, Copy)]
pub struct Asked<'a> {
    /// The member's name (`--name`).
    pub name: &'a str,
    /// The peer URLs it advertises.
    pub peer_urls: &'a [String],
    /// Added as a learner ([`joins_as_learner`]).
    pub as_learner: bool,
}

/// The remove (for [`Change::Replace`]) and the add, through the one
/// member at `endpoint` ([`add_self`] tries each member's in turn).
pub async fn membership_change(
    endpoint: &str,
    client_tls: Option<&TlsFiles>,
    timeout: Duration,
    what: Change,
    asked: &Asked<'_>,
) -> Result<Joined, SelfJoinError> {
    let Asked {
        name,
        peer_urls,
        as_learner,
    } = *asked;
    let mut api = client::connect_v3(&[endpoint.to_string()], client_tls, timeout).await?;
    let failed = |action: String| {
        let endpoints = endpoint.to_string();
        move |err: etcd_client::Error| SelfJoinError::Call {
            action,
            endpoints,
            reason: error_chain(&err),
        }
    };
    if let Change::Replace { id } = what {
        match api.member_remove(id).await {
            Ok(_) => log::info(
                "removed this member's stale entry (its data was lost)",
                &[("id", format!("{id:x}").into()), ("name", name.into())],
            ),
            // Removed by an attempt through another member already.
            Err(err) if error_chain(&err).contains("member not found") => {}
            Err(err) => return Err(failed(format!("member remove {id:x}"))(err)),
        }
    }
    // A refusal that passes within a second or a few is asked again, up
    // to a deadline ([`passing_add_refusal`]).
    let deadline = std::time::Instant::now() + UNHEALTHY_RETRY;
    // Said once per refusal, not once per ask.
    let mut said = None;
    let added = loop {
        let options = as_learner.then(|| etcd_client::MemberAddOptions::new().with_is_learner());
        match api.member_add(peer_urls, options).await {
            Ok(added) => break added,
            Err(err) => {
                let text = error_chain(&err);
                match passing_add_refusal(&text) {
                    Some((why, again)) if std::time::Instant::now() < deadline => {
                        if said != Some(why) {
                            log::info(why, &[("error", text.into())]);
                            said = Some(why);
                        }
                        tokio::time::sleep(again).await;
                    }
                    _ => return Err(failed(format!("member add {}", peer_urls.join(",")))(err)),
                }
            }
        }
    };
    let id = added.member().map_or(0, |m| m.id());
    let mut list: Vec<(u64, String, Vec<String>)> = added
        .member_list()
        .iter()
        .map(|m| (m.id(), m.name().to_string(), m.peer_urls().to_vec()))
        .collect();
    if list.is_empty() {
        // 3.1's MemberAddResponse carries no membership (3.2 added it):
        // ask for it, the add committed.
        let members = api
            .member_list()
            .await
            .map_err(failed("member list after the add".to_string()))?;
        list = members
            .members()
            .iter()
            .map(|m| (m.id(), m.name().to_string(), m.peer_urls().to_vec()))
            .collect();
    }
    if !list.iter().any(|(member, _, _)| *member == id) {
        list.push((id, name.to_string(), peer_urls.to_vec()));
    }
    log::info(
        "added this member to the cluster",
        &[
            ("id", format!("{id:x}").into()),
            ("name", name.into()),
            ("peer_urls", peer_urls.join(",").into()),
            ("members", list.len().into()),
            ("learner", as_learner.into()),
        ],
    );
    Ok(Joined {
        id,
        initial_cluster: initial_cluster(&list, id, name),
        learner: as_learner,
        endpoints: Vec::new(),
    })
}

/// What to log for a refused member add that passes by itself, and when
/// to ask again; `None` for a refusal that stays.
///
/// - etcd refuses an add while a member has been connected for less than
///   its health interval, 5 s ("unhealthy cluster",
///   `--strict-reconfig-check`): a cluster that just (re)started, or took
///   a member just before (a pause job's voters join one after another).
///   Asked again soon: the add goes through as the 5 s end.
/// - etcd derives a new member's id from its peer URLs and the Unix second
///   of the add, and refuses an id it removed for good (`ErrIDRemoved`,
///   sent as "member not found"): an add within the second of our removed
///   entry's own add (a join killed at once and started again) gets that
///   id back. The next second makes a new one (`e2e/self_join.rs`).
fn passing_add_refusal(error: &str) -> Option<(&'static str, Duration)> {
    if error.contains("unhealthy cluster") {
        Some((
            "the cluster refuses a member add while it settles; asking again",
            Duration::from_millis(200),
        ))
    } else if error.contains("member not found") {
        Some((
            "the cluster refuses a member add whose id it removed this second; asking again in the next",
            Duration::from_secs(1),
        ))
    } else {
        None
    }
}

/// What a promote of a learner came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Promoted {
    /// A voter now (or already: an earlier attempt whose answer was lost).
    Done,
    /// Not yet: etcd's answer (not in sync with the leader yet, or no
    /// member answered); ask again.
    NotYet(String),
}

/// Asks once, through `endpoints` (one at a time), that learner `id`
/// become a voter; etcd grants it once the learner caught up with the
/// leader. An error only for a member that is gone (`member not found`).
pub async fn try_promote(
    endpoints: &[String],
    client_tls: Option<&TlsFiles>,
    timeout: Duration,
    id: u64,
) -> Result<Promoted, SelfJoinError> {
    let mut last = String::from("no client URL to ask");
    for endpoint in endpoints {
        let mut api =
            match client::connect_v3(std::slice::from_ref(endpoint), client_tls, timeout).await {
                Ok(api) => api,
                Err(err) => {
                    last = format!("{endpoint}: {err}");
                    continue;
                }
            };
        match api.member_promote(id).await {
            // The caller says it, once, in its own words.
            Ok(_) => return Ok(Promoted::Done),
            Err(err) => {
                let answer = error_chain(&err);
                if promoted_already(&answer) {
                    return Ok(Promoted::Done);
                }
                if answer.contains("member not found") {
                    return Err(SelfJoinError::Call {
                        action: format!("member promote {id:x}"),
                        endpoints: endpoint.clone(),
                        reason: answer,
                    });
                }
                last = format!("{endpoint}: {answer}");
            }
        }
    }
    Ok(Promoted::NotYet(last))
}

/// Why an exec'd member's join as a learner ended before it served as a
/// voter. Its etcd is stopped; the join's record stays in the data dir, so
/// the next start discards the half-joined data and joins again.
#[derive(Debug, thiserror::Error)]
pub enum LearnerError {
    /// Not caught up within the deadline.
    #[error("this member, added as learner {id:x}, was not promoted to a voter within {deadline:?} ({why}); its etcd is stopped and its entry stays a learner, which counts for no quorum; start the member again to join anew (its half-joined data is discarded), give a large keyspace's first sync more time with --health-timeout, or remove the entry (etcdctl member remove {id:x})")]
    NotPromoted {
        /// Our member id.
        id: u64,
        /// The deadline (the health timeout).
        deadline: Duration,
        /// etcd's last answer.
        why: String,
    },
    /// Our etcd exited before its promotion.
    #[error("this member's etcd {release}, added as learner {id:x}, exited {status} before its promotion (its own log above says why); start the member again to join anew (its half-joined data is discarded)")]
    Exited {
        /// The release.
        release: Version,
        /// Our member id.
        id: u64,
        /// How it exited.
        status: ExitStatus,
    },
    /// Our entry is gone (removed by someone while we joined).
    #[error("{0}; start the member again to join anew")]
    Removed(SelfJoinError),
    /// Stopped before the promotion.
    #[error("stopped by {0} while this member, a learner, caught up; the next start joins again")]
    Interrupted(Signal),
    /// Starting, stopping or watching our etcd.
    #[error("this member's etcd, joining as a learner: {0}")]
    Supervisor(#[from] SupervisorError),
    /// The record after the promotion (a voter now, still serving until
    /// stopped).
    #[error("this member was promoted to a voter, but recording the target failed: {0}; its etcd is stopped, and the next start joins again")]
    Record(#[from] DataDirError),
    /// Serving after the promotion.
    #[error(transparent)]
    Serve(#[from] roll::RollError),
}

impl LearnerError {
    /// 128 + the signal when stopped, else 1 (a run that started etcd).
    pub fn exit_code(&self) -> u8 {
        match self {
            LearnerError::Interrupted(signal) => crate::signal_exit_code(*signal),
            _ => crate::EXIT_FAILURE,
        }
    }
}

/// The exec'd member that added itself as a learner (`joined`): its etcd
/// (`release`, with the membership's `--initial-cluster` in its arguments)
/// runs as our child until etcd promotes it to a voter, asked every
/// `PROMOTE_EVERY` through the other members within `deadline`; then
/// `record` writes `version.txt` (the release has run on the data as a
/// member), and the etcd serves until it exits or a stop request comes.
pub async fn promote_then_serve(
    etcd: &mut SupervisedEtcd,
    (joined, release): (&Joined, Version),
    client_tls: Option<&TlsFiles>,
    deadline: Duration,
    mut termination: watch::Receiver<Option<Signal>>,
    record: impl FnOnce() -> Result<(), DataDirError>,
) -> Result<Ended, LearnerError> {
    etcd.start(release).await?;
    let started = Instant::now();
    let mut said = None::<Instant>;
    loop {
        if let Some(signal) = *termination.borrow() {
            stop_quietly(etcd).await;
            return Err(LearnerError::Interrupted(signal));
        }
        if let Some(status) = etcd.exited() {
            return Err(LearnerError::Exited {
                release,
                id: joined.id,
                status,
            });
        }
        let why = match try_promote(&joined.endpoints, client_tls, PROBE, joined.id).await {
            Ok(Promoted::Done) => break,
            Ok(Promoted::NotYet(why)) => why,
            Err(err) => {
                stop_quietly(etcd).await;
                return Err(LearnerError::Removed(err));
            }
        };
        if started.elapsed() > deadline {
            stop_quietly(etcd).await;
            return Err(LearnerError::NotPromoted {
                id: joined.id,
                deadline,
                why,
            });
        }
        if said.is_none_or(|at| at.elapsed() >= PROGRESS_EVERY) {
            said = Some(Instant::now());
            log::info(
                "waiting for this member, a learner, to catch up with the leader before its promotion",
                &[
                    ("id", format!("{:x}", joined.id).into()),
                    ("etcd", why.into()),
                    ("ms", log::ms(started.elapsed())),
                ],
            );
        }
        tokio::select! {
            _ = tokio::time::sleep(PROMOTE_EVERY) => {}
            _ = termination.changed() => {}
        }
    }
    log::info(
        "this member, joined as a learner, is a voter now",
        &[
            ("id", format!("{:x}", joined.id).into()),
            ("ms", log::ms(started.elapsed())),
        ],
    );
    if let Err(err) = record() {
        stop_quietly(etcd).await;
        return Err(LearnerError::Record(err));
    }
    log::info(
        "this member joined its cluster; version.txt records its release",
        &[("version", release.to_string().into())],
    );
    Ok(roll::serve(etcd, &mut termination).await?)
}

/// Stops our etcd for an error the caller reports: a failed stop is said
/// beside that error, not instead of it.
async fn stop_quietly(etcd: &mut SupervisedEtcd) {
    if let Err(err) = etcd.stop().await {
        log::warn(
            "this member's etcd did not stop cleanly",
            &[("error", err.to_string().into())],
        );
    }
}

/// What one promote may take.
const PROBE: Duration = Duration::from_secs(5);

/// etcd's answer to a promote of a member that is no learner (any more).
fn promoted_already(answer: &str) -> bool {
    answer.contains("can only promote a learner member")
        && !answer.contains("which is in sync with leader")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::decide::Reach;

    #[test]
    fn the_add_refusals_that_pass_are_asked_again_and_no_other() {
        let cases = [
            ("etcdserver: unhealthy cluster", true),
            ("grpc request error: Some requested entity was not found: etcdserver: member not found", true),
            ("etcdserver: Peer URLs already exists", false),
            ("etcdserver: too many learner members in cluster", false),
            ("transport error", false),
        ];
        for (error, passes) in cases {
            assert_eq!(passing_add_refusal(error).is_some(), passes, "{error}");
        }
    }

    fn member(id: u64, name: &str, url: &str) -> Member {
        Member {
            id,
            name: name.to_string(),
            peer_urls: vec![url.to_string()],
            client_urls: vec![],
            is_learner: false,
            reach: Reach::Down(Duration::ZERO),
            storage: None,
        }
    }

    #[test]
    fn the_initial_cluster_of_a_joiner_is_the_membership_with_its_name() {
        let list = vec![
            (
                0xa,
                "etcd-a".to_string(),
                vec!["https://10.0.0.1:2380".to_string()],
            ),
            (
                0xd,
                String::new(),
                vec!["https://10.0.0.4:2380".to_string()],
            ),
        ];
        assert_eq!(
            initial_cluster(&list, 0xd, "etcd-d"),
            "etcd-a=https://10.0.0.1:2380,etcd-d=https://10.0.0.4:2380"
        );
    }

    #[test]
    fn what_the_membership_needs_as_a_table() {
        let ours = ["https://10.0.0.4:2380".to_string()];
        let a = member(0xa, "etcd-a", "https://10.0.0.1:2380");
        let b = member(0xb, "etcd-b", "https://10.0.0.2:2380");
        let cases: Vec<(&str, Vec<Member>, Result<Change, &str>)> = vec![
            (
                "not there: add",
                vec![a.clone(), b.clone()],
                Ok(Change::Add),
            ),
            (
                "added by hand, unstarted: as it is",
                vec![a.clone(), member(0xd, "", "https://10.0.0.4:2380/")],
                Ok(Change::AddedAlready {
                    id: 0xd,
                    learner: false,
                }),
            ),
            (
                "added as a learner, unstarted: as it is, promoted later",
                vec![
                    a.clone(),
                    Member {
                        is_learner: true,
                        ..member(0xd, "", "https://10.0.0.4:2380")
                    },
                ],
                Ok(Change::AddedAlready {
                    id: 0xd,
                    learner: true,
                }),
            ),
            (
                "our stale entry: replace",
                vec![a.clone(), member(0xd, "etcd-d", "https://10.0.0.4:2380")],
                Ok(Change::Replace { id: 0xd }),
            ),
            (
                "another member on our URL: refused",
                vec![a.clone(), member(0xe, "etcd-e", "https://10.0.0.4:2380")],
                Err("already has the peer URL"),
            ),
            (
                "our name on another URL: refused",
                vec![a.clone(), member(0xd, "etcd-d", "https://10.0.0.9:2380")],
                Err("a member named etcd-d"),
            ),
        ];
        for (what, members, want) in cases {
            let got = change(&members, "etcd-d", &ours);
            match (got, want) {
                (Ok(got), Ok(want)) => assert_eq!(got, want, "{what}"),
                (Err(err), Err(says)) => assert!(err.to_string().contains(says), "{what}: {err}"),
                (got, want) => panic!("{what}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn a_promote_of_a_voter_counts_as_done_and_one_not_in_sync_is_asked_again() {
        // etcd's own answers (etcdserver/errors.go).
        assert!(promoted_already(
            "etcdserver: can only promote a learner member"
        ));
        assert!(!promoted_already(
            "etcdserver: can only promote a learner member which is in sync with leader"
        ));
        assert!(!promoted_already("etcdserver: member not found"));
    }
}
