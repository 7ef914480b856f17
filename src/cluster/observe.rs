//! This module owns reading what members say about themselves and their
//! cluster, and assembling it into the [`View`] a member decides on. The
//! sources are the two peer endpoints every release from 2.2 to 3.6 serves
//! (with the peer TLS, so no client credentials are needed): `/version`
//! (`{"etcdserver":"3.3.25","etcdcluster":"3.3.0"}`) and `/members` (the
//! membership as a JSON array). Parsing and assembling are pure; fetching
//! them is the caller's.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;

use crate::cluster::decide::{Member, Reach, View};
use crate::version::{Minor, Version};

/// What a member's `/version` says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VersionInfo {
    /// The release the member runs.
    pub server: Version,
    /// The cluster version it knows, or `None` while it is `not_decided`.
    pub cluster: Option<Minor>,
    /// Its storage version (3.6+ report one).
    pub storage: Option<Minor>,
}

/// Why a peer endpoint's answer could not be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ObserveError {
    /// Not the JSON the endpoint serves.
    #[error("{endpoint} answered {answer:?}, which is not the JSON etcd serves there: {reason}")]
    BadAnswer {
        /// The endpoint asked (e.g. `https://10.0.0.2:2380/version`).
        endpoint: String,
        /// The start of the answer.
        answer: String,
        /// What was wrong with it.
        reason: String,
    },
}

#[derive(Deserialize)]
struct RawVersion {
    etcdserver: String,
    etcdcluster: String,
    #[serde(default)]
    storage: Option<String>,
}

#[derive(Deserialize)]
struct RawMember {
    id: u64,
    #[serde(default)]
    name: String,
    #[serde(rename = "peerURLs", default)]
    peer_urls: Vec<String>,
    #[serde(rename = "clientURLs", default)]
    client_urls: Vec<String>,
    #[serde(rename = "isLearner", default)]
    is_learner: bool,
}

fn bad(endpoint: &str, answer: &str, reason: impl ToString) -> ObserveError {
    ObserveError::BadAnswer {
        endpoint: endpoint.to_string(),
        answer: answer.chars().take(200).collect(),
        reason: reason.to_string(),
    }
}

/// Parses a `/version` answer from `endpoint`.
pub fn parse_version(endpoint: &str, answer: &str) -> Result<VersionInfo, ObserveError> {
    let raw: RawVersion = serde_json::from_str(answer).map_err(|e| bad(endpoint, answer, e))?;
    let server = raw
        .etcdserver
        .parse::<Version>()
        .map_err(|e| bad(endpoint, answer, e))?;
    let cluster = match raw.etcdcluster.as_str() {
        "not_decided" | "" => None,
        text => Some(
            text.parse::<Version>()
                .map_err(|e| bad(endpoint, answer, e))?
                .minor_line(),
        ),
    };
    // 3.6+ (and its peers' `/version`) add the storage version.
    let storage = raw
        .storage
        .as_deref()
        .and_then(|text| text.parse::<Version>().ok())
        .map(Version::minor_line);
    Ok(VersionInfo {
        server,
        cluster,
        storage,
    })
}

/// Parses a `/members` answer from `endpoint` into the membership, every
/// member's reach still unknown (`Down` for zero seconds) until asked.
pub fn parse_members(endpoint: &str, answer: &str) -> Result<Vec<Member>, ObserveError> {
    let raw: Vec<RawMember> = serde_json::from_str(answer).map_err(|e| bad(endpoint, answer, e))?;
    if raw.is_empty() {
        return Err(bad(endpoint, answer, "an empty membership"));
    }
    Ok(raw
        .into_iter()
        .map(|m| Member {
            id: m.id,
            name: m.name,
            peer_urls: m.peer_urls,
            client_urls: m.client_urls,
            is_learner: m.is_learner,
            reach: Reach::Down(Duration::ZERO),
            storage: None,
        })
        .collect())
}

/// What one round of asking every member gave, per member id: its
/// `/version`, or how long it has not answered.
pub type Answers = BTreeMap<u64, Result<VersionInfo, Duration>>;

/// The view of one round: the membership with each member's reach, and the
/// cluster version. Members may learn a new cluster version at slightly
/// different times; the lowest one told is taken, so a member never moves
/// on a cluster version that not everyone has seen yet.
pub fn assemble(
    mut members: Vec<Member>,
    answers: &Answers,
    alarms: Vec<String>,
    leader: Option<u64>,
    lock: Option<u64>,
) -> View {
    for member in &mut members {
        member.reach = match answers.get(&member.id) {
            Some(Ok(info)) => Reach::Up(info.server),
            Some(Err(silent_for)) => Reach::Down(*silent_for),
            None => Reach::Down(Duration::ZERO),
        };
        member.storage = match answers.get(&member.id) {
            Some(Ok(info)) => info.storage,
            _ => None,
        };
    }
    let cluster_version = answers
        .values()
        .filter_map(|answer| answer.as_ref().ok().and_then(|info| info.cluster))
        .min();
    View {
        cluster_version,
        members,
        alarms,
        leader,
        tls_refused: BTreeMap::new(),
        lock,
        downgrade: None,
        announced: BTreeMap::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MEMBERS: &str = r#"[{"id":15985099378392235387,"peerURLs":["https://10.0.0.1:2380"],"name":"etcd-a","clientURLs":["https://10.0.0.1:2379"]},{"id":2,"peerURLs":["https://10.0.0.2:2380"],"isLearner":true},{"id":3,"peerURLs":["https://10.0.0.3:2380"],"name":"etcd-c"}]"#;

    #[test]
    fn version_answers_of_every_release_parse() {
        let info = parse_version(
            "http://a:2380/version",
            r#"{"etcdserver":"3.3.25","etcdcluster":"3.3.0"}"#,
        )
        .expect("3.3 answer");
        assert_eq!(info.server, Version::new(3, 3, 25));
        assert_eq!(info.cluster, Some(Minor::new(3, 3)));
        let present = parse_version(
            "http://a:2380/version",
            r#"{"etcdserver":"3.7.1","etcdcluster":"3.6.0","storage":"3.6.0"}"#,
        )
        .expect("3.6+ answer");
        assert_eq!(present.storage, Some(Minor::new(3, 6)));
        assert_eq!(info.storage, None);
        let early = parse_version(
            "http://a:2380/version",
            r#"{"etcdserver":"2.2.1","etcdcluster":"not_decided"}"#,
        )
        .expect("undecided answer");
        assert_eq!(early.cluster, None);
    }

    #[test]
    fn a_bad_answer_names_the_endpoint_and_what_came_back() {
        let err = parse_version("https://10.0.0.2:2380/version", "404 page not found")
            .expect_err("not JSON");
        let text = err.to_string();
        assert!(text.contains("https://10.0.0.2:2380/version"), "{text}");
        assert!(text.contains("404 page not found"), "{text}");
        assert!(parse_members("https://10.0.0.2:2380/members", "[]").is_err());
    }

    #[test]
    fn members_parse_with_learners_and_unstarted_members() {
        let members = parse_members("https://10.0.0.1:2380/members", MEMBERS).expect("members");
        assert_eq!(members.len(), 3);
        assert_eq!(members[0].id, 15985099378392235387);
        assert_eq!(members[0].name, "etcd-a");
        assert_eq!(members[0].client_urls, ["https://10.0.0.1:2379"]);
        assert!(members[1].is_learner);
        assert_eq!(members[1].name, "");
    }

    #[test]
    fn the_view_takes_each_reach_and_the_lowest_cluster_version_told() {
        let members = parse_members("m", MEMBERS).expect("members");
        let info = |server: Version, cluster: Minor| {
            Ok(VersionInfo {
                server,
                cluster: Some(cluster),
                storage: None,
            })
        };
        let answers: Answers = [
            (
                15985099378392235387,
                info(Version::new(3, 4, 23), Minor::new(3, 4)),
            ),
            (2, Err(Duration::from_secs(30))),
            (3, info(Version::new(3, 4, 23), Minor::new(3, 3))),
        ]
        .into_iter()
        .collect();
        let view = assemble(members, &answers, vec![], Some(3), None);
        assert_eq!(view.cluster_version, Some(Minor::new(3, 3)));
        assert_eq!(view.members[0].reach, Reach::Up(Version::new(3, 4, 23)));
        assert_eq!(view.members[1].reach, Reach::Down(Duration::from_secs(30)));
        assert_eq!(view.leader, Some(3));
    }
}
