//! The steps by hand that `docs/cluster-pause.md` ("By hand") gives for a
//! cluster no pause job takes (etcd3 → etcd2, a 3.0 target), on real
//! releases (`$ETCD_EXTRA_BIN_DIR`: 3.0.17, 2.2.1): three members of
//! 3.0.17 on etcd3 data, shrunk to one by `member remove`; that member
//! taken to 2.2.1/etcd2 by etcd-migrate alone; the other two added back
//! by etcd's member add on empty data dirs. Every member ends holding
//! every key, the leased one as a v2 key with its TTL.

use std::path::Path;
use std::time::{Duration, Instant};

use etcd_client::Client;
use libtest_mimic::Trial;
use serde_json::Value;

use crate::harness::etcd::{connect, connect_within, EtcdProcess, PROBE_TIMEOUT};
use crate::harness::migrator::Migration;
use crate::harness::v2::http_client;
use crate::harness::{
    block_on, free_port, linked_bin_dir, read_version_txt, release_trial, temp_dir,
    write_version_txt, Member,
};

/// Keys written before the change (and one on a lease of [`LEASE_TTL`]).
const KEYS: usize = 20;
const LEASE_TTL: i64 = 3600;
/// What etcd may take to let a membership change through after a member
/// started (3.x answers "unhealthy cluster" meanwhile).
const RECONFIG_DEADLINE: Duration = Duration::from_secs(60);

pub fn trials() -> Vec<Trial> {
    vec![release_trial(
        "by_hand",
        "by_hand::a_3_0_etcd3_cluster_goes_back_to_2_2_etcd2",
        a_3_0_etcd3_cluster_goes_back_to_2_2_etcd2,
        &["3.0.17", "2.2.1"],
    )]
}

/// `name=peer URL` of each member, comma-separated.
fn initial_cluster(members: &[&Member]) -> String {
    members
        .iter()
        .map(|m| format!("{}={}", m.name, m.peer_url()))
        .collect::<Vec<_>>()
        .join(",")
}

/// Starts `etcd-<version>` as `member` of `cluster` (`new` or `existing`).
fn start(
    version: &str,
    member: &Member,
    data: &Path,
    port: u16,
    logs: &Path,
    cluster: &str,
    state: &str,
) -> EtcdProcess {
    EtcdProcess::start_with(
        version,
        member,
        data,
        port,
        logs,
        &[
            &format!("--initial-cluster={cluster}"),
            &format!("--initial-cluster-state={state}"),
        ],
    )
}

/// Retries `change` until etcd takes it, within [`RECONFIG_DEADLINE`].
async fn until_taken<F, Fut>(what: &str, mut change: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), String>>,
{
    let started = Instant::now();
    loop {
        match change().await {
            Ok(()) => return,
            Err(_) if started.elapsed() < RECONFIG_DEADLINE => {
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(err) => panic!("{what}: {err}"),
        }
    }
}

/// The v2 store below `/registry` as member `endpoint` holds it itself:
/// key → (value, TTL).
async fn local_v2(endpoint: &str) -> Vec<(String, String, Option<i64>)> {
    let url = format!("{endpoint}/v2/keys/registry?recursive=true&sorted=true");
    let text = http_client()
        .get(&url)
        .send()
        .await
        .unwrap_or_else(|e| panic!("GET {url}: {e}"))
        .text()
        .await
        .unwrap_or_else(|e| panic!("GET {url}: {e}"));
    let body: Value =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("GET {url}: {e}: {text}"));
    let mut leaves = Vec::new();
    let mut stack = vec![body["node"].clone()];
    while let Some(node) = stack.pop() {
        if let Some(children) = node["nodes"].as_array() {
            stack.extend(children.iter().cloned());
        } else if node["dir"].as_bool() != Some(true) {
            leaves.push((
                node["key"].as_str().unwrap_or_default().to_string(),
                node["value"].as_str().unwrap_or_default().to_string(),
                node["ttl"].as_i64(),
            ));
        }
    }
    leaves.sort();
    leaves
}

fn a_3_0_etcd3_cluster_goes_back_to_2_2_etcd2() {
    let tmp = temp_dir("by-hand");
    let logs = tmp.path();
    let members: Vec<Member> = ["a", "b", "c"]
        .iter()
        .map(|n| Member::new(&format!("hand-{n}")))
        .collect();
    let ports: Vec<u16> = members.iter().map(|_| free_port()).collect();
    let data: Vec<_> = members.iter().map(|m| logs.join(&m.name)).collect();
    let all: Vec<&Member> = members.iter().collect();
    let cluster = initial_cluster(&all);
    let mut old: Vec<EtcdProcess> = (0..3)
        .map(|i| {
            start(
                "3.0.17",
                &members[i],
                &data[i],
                ports[i],
                logs,
                &cluster,
                "new",
            )
        })
        .collect();
    let endpoint_a = old[0].endpoint();
    block_on(async {
        for etcd in old.iter_mut() {
            etcd.wait_ready().await;
        }
        let mut client = connect(&endpoint_a).await.expect("connect");
        for i in 0..KEYS {
            client
                .put(format!("/registry/pods/p{i:02}"), format!("pod {i}"), None)
                .await
                .expect("put");
        }
        let lease = client.lease_grant(LEASE_TTL, None).await.expect("lease");
        client
            .put(
                "/registry/events/e1",
                "event",
                Some(etcd_client::PutOptions::new().with_lease(lease.id())),
            )
            .await
            .expect("put on a lease");
        // 1. Shrunk to one member: the others removed, then stopped. A
        // removal that takes the leader leaves the next request waiting
        // on an election: each attempt is cut short and asked again.
        let mut client = connect_within(&endpoint_a, PROBE_TIMEOUT)
            .await
            .expect("connect");
        let listed = client.member_list().await.expect("member list");
        for member in &members[1..] {
            let id = listed
                .members()
                .iter()
                .find(|m| m.name() == member.name)
                .unwrap_or_else(|| panic!("{} in {:?}", member.name, listed.members()))
                .id();
            until_taken(&format!("member remove {}", member.name), || {
                let mut client: Client = client.clone();
                async move {
                    client
                        .member_remove(id)
                        .await
                        .map(drop)
                        .map_err(|e| e.to_string())
                }
            })
            .await;
        }
    });
    for dir in &data {
        write_version_txt(dir, "3.0.17/etcd3");
    }
    let mut old = old.into_iter();
    let a = old.next().expect("a");
    for etcd in old {
        etcd.stop();
    }
    a.stop();

    // 2. That member taken to 2.2.1/etcd2 alone.
    let bin = linked_bin_dir(&["3.0.17", "2.2.1"], logs);
    let run = Migration::new("2.2.1", &data[0], &members[0])
        .bin_dir(&bin)
        .arg("--target-storage")
        .arg("etcd2")
        .run();
    run.assert_code(0);
    assert_eq!(
        read_version_txt(&data[0]),
        "2.2.1/etcd2",
        "{}",
        run.explain()
    );
    let mut joined = vec![start(
        "2.2.1",
        &members[0],
        &data[0],
        ports[0],
        logs,
        &initial_cluster(&all[..1]),
        "new",
    )];

    // 3. The others added back one at a time, on empty data dirs.
    block_on(async {
        joined[0].wait_ready_v2().await;
        let expected = local_v2(&endpoint_a).await;
        assert_eq!(expected.len(), KEYS + 1, "{expected:?}");
        for i in 1..3 {
            let url = format!("{endpoint_a}/v2/members");
            let peer = members[i].peer_url();
            until_taken(&format!("member add {}", members[i].name), || {
                let (url, peer) = (url.clone(), peer.clone());
                async move {
                    let response = http_client()
                        .post(&url)
                        .header("content-type", "application/json")
                        .body(serde_json::json!({ "peerURLs": [peer] }).to_string())
                        .send()
                        .await
                        .map_err(|e| e.to_string())?;
                    if response.status().is_success() {
                        Ok(())
                    } else {
                        Err(format!(
                            "{}: {}",
                            response.status(),
                            response.text().await.unwrap_or_default()
                        ))
                    }
                }
            })
            .await;
            std::fs::rename(
                &data[i],
                logs.join(format!("{}.etcd3-backup", members[i].name)),
            )
            .expect("the old data aside");
            let mut etcd = start(
                "2.2.1",
                &members[i],
                &data[i],
                ports[i],
                logs,
                &initial_cluster(&all[..=i]),
                "existing",
            );
            etcd.wait_ready_v2().await;
            let holds = local_v2(&etcd.endpoint()).await;
            let kept: Vec<_> = holds.iter().map(|(k, v, _)| (k, v)).collect();
            let want: Vec<_> = expected.iter().map(|(k, v, _)| (k, v)).collect();
            assert_eq!(kept, want, "{} holds what etcd-a holds", members[i].name);
            joined.push(etcd);
        }
        for etcd in &joined {
            let holds = local_v2(&etcd.endpoint()).await;
            let event = holds
                .iter()
                .find(|(k, _, _)| k == "/registry/events/e1")
                .unwrap_or_else(|| panic!("the leased key on {}: {holds:?}", etcd.endpoint()));
            let ttl = event.2.unwrap_or_else(|| panic!("{event:?} has no TTL"));
            assert!(ttl > 0 && ttl <= LEASE_TTL, "{event:?}");
            assert_eq!(holds.len(), KEYS + 1, "{holds:?}");
        }
    });
    for etcd in joined {
        etcd.stop();
    }
}
