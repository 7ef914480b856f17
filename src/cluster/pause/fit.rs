//! This module owns the checks before the go of a job that changes the
//! storage: that the old cluster's live keyspace fits the target's
//! (etcd3 → etcd2: every v3 key a v2 store can hold, and none a hidden v2
//! node, which no joiner could be proven to hold; etcd2 → etcd3: no v2
//! leaf landing on a v3 key of the same name). A key that does not fit
//! holds the job with the old data serving, named on the wait line,
//! rather than refusing at a member's restart (a rollout would take the
//! members down one by one) or in the converter's step (after the
//! cluster paused). The converter's own run checks its taken data again.

use std::ops::ControlFlow;

use crate::cluster::client::{scan_v3, Scan};
use crate::cluster::RECORDS_DIR;
use crate::keyspace::{is_hidden_v2, Entry};

/// Calls `visit` with every v3 key of `client`'s cluster (and its value,
/// unless `keys_only`); the first thing it says does not fit.
async fn first_v3_misfit(
    client: &mut etcd_client::Client,
    keys_only: bool,
    mut visit: impl FnMut(&[u8], &[u8]) -> Option<String>,
) -> Result<Option<String>, String> {
    let scan = Scan {
        keys_only,
        ..Scan::default()
    };
    scan_v3(client, scan, |kv| match visit(kv.key(), kv.value()) {
        Some(why) => ControlFlow::Break(why),
        None => ControlFlow::Continue(()),
    })
    .await
}

fn key_entry(key: &[u8]) -> Entry {
    Entry {
        key: key.to_vec(),
        value: Vec::new(),
        ttl: None,
        lease: 0,
    }
}

/// Before the go of a job to etcd2 storage: what of the old cluster's v3
/// keyspace (read from `client` in pages) the v2 store could not hold
/// ([`crate::steps::to_etcd2::check_v2_compatible`]), or a hidden v2 path
/// the join proof could not list; `Ok(None)` when every key fits. The
/// converter's own step checks again on the data it took.
pub async fn v2_misfit(client: &mut etcd_client::Client) -> Result<Option<String>, String> {
    let mut keys = Vec::new();
    let binary = first_v3_misfit(client, false, |key, value| {
        if std::str::from_utf8(value).is_err() {
            return Some(format!(
                "the value of {:?} is binary (not UTF-8), which the v2 store cannot hold; for Kubernetes, switch the API server to --storage-media-type=application/json and rewrite the objects first",
                String::from_utf8_lossy(key)
            ));
        }
        keys.push(key_entry(key));
        None
    })
    .await?;
    crate::log::info(
        "pause job: the old cluster's keyspace read to check it fits etcd2 storage",
        &[("v3_keys", keys.len().into())],
    );
    if binary.is_some() {
        return Ok(binary);
    }
    if let Err(why) = crate::steps::to_etcd2::check_v2_compatible(&keys) {
        return Ok(Some(why));
    }
    let paths: Vec<Vec<u8>> = keys
        .iter()
        .map(|e| crate::keyspace::v2_path(&e.key))
        .collect();
    let hidden = hidden_paths(paths.iter().map(Vec::as_slice));
    if let Some(first) = hidden.first() {
        return Ok(Some(format!(
            "{} keys become hidden v2 nodes (a path segment starting with `_`, e.g. {first}), which the v2 API never lists, so a joined member's store could not be proven equal to the converter's; rename them through the v3 API, or take one member to etcd2 alone and add the others back to it (docs/cluster-pause.md, \"By hand\")",
            hidden.len()
        )));
    }
    Ok(None)
}

/// Before the go of an etcd2 → etcd3 job: a v2 leaf of the old cluster
/// (its v2 store as member `endpoint` lists it, less the cluster mode's
/// records, which the converter removes) that the storage migration would
/// write over a v3 key of the same name
/// ([`crate::steps::storage_migration::check_no_clash`]); `Ok(None)` when
/// none would.
pub async fn v3_clash(
    client: &mut etcd_client::Client,
    http: &reqwest::Client,
    endpoint: &str,
) -> Result<Option<String>, String> {
    let store = super::v2proof::read_store(http, endpoint).await?;
    let ours = |path: &str| {
        path.strip_prefix(RECORDS_DIR)
            .is_some_and(|rest| rest.starts_with('/'))
    };
    let v2: Vec<Entry> = store
        .nodes
        .iter()
        .filter(|(path, node)| {
            matches!(node, super::v2proof::Node::Leaf { .. }) && !ours(path.as_str())
        })
        .map(|(path, _)| key_entry(path.as_bytes()))
        .collect();
    let mut v3 = Vec::new();
    first_v3_misfit(client, true, |key, _| {
        v3.push(key_entry(key));
        None
    })
    .await?;
    crate::log::info(
        "pause job: the old cluster's keyspace read to check it fits etcd3 storage",
        &[
            ("v2_leaves", v2.len().into()),
            ("v3_keys", v3.len().into()),
            ("v2_index", store.index.into()),
        ],
    );
    Ok(crate::steps::storage_migration::check_no_clash(&v2, &v3).err())
}

/// The hidden v2 paths among `paths` (what a pause job to etcd2 refuses:
/// the join proof cannot list them).
pub fn hidden_paths<'a>(paths: impl IntoIterator<Item = &'a [u8]>) -> Vec<String> {
    paths
        .into_iter()
        .filter(|p| is_hidden_v2(p))
        .map(|p| String::from_utf8_lossy(p).into_owned())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hidden_paths_are_the_ones_with_an_underscore_segment() {
        let paths: Vec<&[u8]> = vec![b"/a/b", b"/_x", b"/a/_y/z", b"/a_b"];
        assert_eq!(hidden_paths(paths), vec!["/_x", "/a/_y/z"]);
    }
}
