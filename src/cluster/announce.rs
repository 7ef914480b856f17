//! This module owns each member's announcement of the target its
//! entrypoint was started with: one key per member,
//! `/etcd-migrate/target/<member id, hex>`, holding
//! `{"target":"3.6.14/etcd3","name":"etcd-a","run":"…"}`, written once the
//! member's etcd serves (in the cluster's store: v3 from cluster version
//! 3.1 on, v2 before) and read back in every observation.
//!
//! Why: a member restarts itself (the waves after the operator's own
//! restarts, every step of a downgrade) only when the operator's rollout
//! can no longer restart another member at the same moment. A member the
//! rollout restarted has announced the rollout's target before it serves,
//! so "every other member runs the minor we restart into, or announced our
//! target" says the rollout is over, whatever its schedule. The keys carry
//! no lease: a member whose entrypoint handed over to etcd (or ended)
//! still tells what its container was started with. The key layout and the
//! parse are pure; the two stores' requests take a client of the caller's.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::keyspace::{V2Answer, V2_NOT_FOUND};
use crate::log::error_chain;
use crate::version::{Version, VersionPair};

/// The prefix of the announcement keys.
pub const PREFIX: &str = "/etcd-migrate/target/";

/// What a member announces.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Announcement {
    /// The target its entrypoint was started with (`3.6.14/etcd3`).
    pub target: String,
    /// Its name, for whoever reads the key by hand.
    pub name: String,
    /// The entrypoint's run.
    pub run: String,
}

impl Announcement {
    /// Ours: `target` as `TARGET_VERSION`/`TARGET_STORAGE` say.
    pub fn new(target: VersionPair, name: &str, run: &str) -> Self {
        Announcement {
            target: target.to_string(),
            name: name.to_string(),
            run: run.to_string(),
        }
    }

    /// Its JSON, as the key holds it.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }
}

/// The key member `id` announces under.
pub fn key(id: u64) -> String {
    format!("{PREFIX}{id:x}")
}

/// The member id and target release of one announcement key, or `None`
/// for a key or value that is not one (it counts as no announcement).
pub fn parse(key: &str, value: &[u8]) -> Option<(u64, Version)> {
    let id = u64::from_str_radix(key.strip_prefix(PREFIX)?, 16).ok()?;
    let announcement: Announcement = serde_json::from_slice(value).ok()?;
    let release = announcement.target.split('/').next()?.parse().ok()?;
    Some((id, release))
}

/// Writes `announcement` as member `id`'s, through a v3 client.
pub async fn put_v3(
    client: &mut etcd_client::Client,
    id: u64,
    announcement: &Announcement,
) -> Result<(), String> {
    client
        .put(key(id), announcement.to_json(), None)
        .await
        .map(|_| ())
        .map_err(|e| error_chain(&e))
}

/// Every announcement, through a v3 client.
pub async fn read_v3(client: &mut etcd_client::Client) -> Result<BTreeMap<u64, Version>, String> {
    let response = client
        .get(PREFIX, Some(etcd_client::GetOptions::new().with_prefix()))
        .await
        .map_err(|e| error_chain(&e))?;
    Ok(response
        .kvs()
        .iter()
        .filter_map(|kv| parse(&String::from_utf8_lossy(kv.key()), kv.value()))
        .collect())
}

/// Writes `announcement` as member `id`'s into the v2 store, through the
/// first of `endpoints` that answers.
pub async fn put_v2(
    http: &reqwest::Client,
    endpoints: &[String],
    id: u64,
    announcement: &Announcement,
) -> Result<(), String> {
    let value = announcement.to_json();
    let mut last = String::from("no client URL");
    for endpoint in endpoints {
        let url = format!("{}/v2/keys{}", endpoint.trim_end_matches('/'), key(id));
        match http
            .put(&url)
            .form(&[("value", value.as_str())])
            .send()
            .await
        {
            Ok(response) if response.status().is_success() => return Ok(()),
            Ok(response) => last = format!("{url}: {}", response.status()),
            Err(e) => last = format!("{url}: {}", error_chain(&e)),
        }
    }
    Err(last)
}

/// Every announcement in the v2 store, from the first of `endpoints` that
/// answers.
pub async fn read_v2(
    http: &reqwest::Client,
    endpoints: &[String],
) -> Result<BTreeMap<u64, Version>, String> {
    let mut last = String::from("no client URL");
    for endpoint in endpoints {
        let url = format!(
            "{}/v2/keys{}",
            endpoint.trim_end_matches('/'),
            PREFIX.trim_end_matches('/')
        );
        let body = match http.get(&url).send().await {
            Ok(response) => match response.text().await {
                Ok(body) => body,
                Err(e) => {
                    last = format!("{url}: {}", error_chain(&e));
                    continue;
                }
            },
            Err(e) => {
                last = format!("{url}: {}", error_chain(&e));
                continue;
            }
        };
        return match serde_json::from_str::<V2Answer>(&body) {
            Ok(answer) if answer.error_code == Some(V2_NOT_FOUND) => Ok(BTreeMap::new()),
            Ok(answer) => Ok(answer
                .node
                .map(|dir| dir.nodes)
                .unwrap_or_default()
                .iter()
                .filter_map(|node| {
                    let value = node.value.as_deref()?;
                    parse(node.key.as_deref()?, value.as_bytes())
                })
                .collect()),
            Err(e) => Err(format!("{url} answered {body:?}: {e}")),
        };
    }
    Err(last)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_announcement_reads_back_as_its_member_and_release() {
        let pair: VersionPair = "3.6.14/etcd3".parse().expect("pair");
        let ours = Announcement::new(pair, "etcd-a", "r1");
        let json = ours.to_json();
        assert_eq!(
            parse(&key(0xab12), json.as_bytes()),
            Some((0xab12, "3.6.14".parse().expect("version")))
        );
    }

    #[test]
    fn what_is_not_an_announcement_counts_as_none() {
        let good = Announcement::new("3.6.14/etcd3".parse().expect("pair"), "a", "r").to_json();
        for (key, value) in [
            ("/etcd-migrate/target/zz", good.as_str()),
            ("/etcd-migrate/proof/ab", good.as_str()),
            ("/etcd-migrate/target/ab", "not json"),
            (
                "/etcd-migrate/target/ab",
                r#"{"target":"x/etcd3","name":"a","run":"r"}"#,
            ),
        ] {
            assert_eq!(parse(key, value.as_bytes()), None, "{key} = {value}");
        }
    }
}
