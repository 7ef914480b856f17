//! The steps by hand that `docs/cluster-pause.md` ("By hand") gives for a
//! cluster no pause job takes (etcd3 → etcd2, a 3.0 target), on real
//! releases (`$ETCD_EXTRA_BIN_DIR`): three members on etcd3 data, shrunk
//! to one by `member remove`; that member taken to the target by
//! etcd-migrate alone; the other two added back by etcd's member add on
//! empty data dirs. Every member ends holding every key, the leased one
//! still expiring (a v2 key with its TTL; a v3 key on a lease).
//!
//! - 3.0.17/etcd3 → 2.2.1/etcd2 (Kubernetes 1.6 → 1.5), the joiners
//!   added through the v2 members API;
//! - 3.1.20 → 3.0.17 (a 3.0 target), added through v3's `MemberAdd`.

use std::path::Path;
use std::time::{Duration, Instant};

use etcd_client::Client;
use libtest_mimic::Trial;

use crate::harness::etcd::{connect, connect_within, EtcdProcess, PROBE_TIMEOUT};
use crate::harness::migrator::Migration;
use crate::harness::v2::{http_client, V2Keyspace};
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
    vec![
        release_trial(
            "by_hand",
            "by_hand::a_3_0_etcd3_cluster_goes_back_to_2_2_etcd2",
            a_3_0_etcd3_cluster_goes_back_to_2_2_etcd2,
            &["3.0.17", "2.2.1"],
        ),
        release_trial(
            "by_hand",
            "by_hand::a_3_1_cluster_goes_back_to_3_0",
            a_3_1_cluster_goes_back_to_3_0,
            &["3.1.20", "3.0.17"],
        ),
    ]
}

fn a_3_0_etcd3_cluster_goes_back_to_2_2_etcd2() {
    by_hand("3.0.17", "2.2.1", "etcd2");
}

fn a_3_1_cluster_goes_back_to_3_0() {
    by_hand("3.1.20", "3.0.17", "etcd3");
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

/// The keys below `/registry` as member `endpoint` holds them itself
/// (a serializable read), sorted: key, value, and whether it expires (a
/// v2 TTL within [`LEASE_TTL`], or a v3 lease).
async fn local_keys(endpoint: &str, storage: &str) -> Vec<(String, String, bool)> {
    let mut keys = if storage == "etcd2" {
        local_v2(endpoint).await
    } else {
        let mut client = connect(endpoint).await.expect("connect");
        let options = etcd_client::GetOptions::new()
            .with_prefix()
            .with_serializable();
        let answer = client
            .get("/registry", Some(options))
            .await
            .unwrap_or_else(|e| panic!("get /registry from {endpoint}: {e}"));
        answer
            .kvs()
            .iter()
            .map(|kv| {
                (
                    String::from_utf8_lossy(kv.key()).into_owned(),
                    String::from_utf8_lossy(kv.value()).into_owned(),
                    kv.lease() != 0,
                )
            })
            .collect()
    };
    keys.sort();
    keys
}

/// The v2 store below `/registry` as member `endpoint` holds it.
async fn local_v2(endpoint: &str) -> Vec<(String, String, bool)> {
    V2Keyspace::read(endpoint)
        .await
        .leaves
        .into_iter()
        .filter(|(key, _)| key.starts_with("/registry/"))
        .map(|(key, node)| {
            let expires = node.ttl.is_some_and(|t| t > 0 && t <= LEASE_TTL);
            (key, node.value, expires)
        })
        .collect()
}

/// Waits until `etcd` takes a write through the API of its storage.
async fn wait_ready(etcd: &mut EtcdProcess, storage: &str) {
    if storage == "etcd2" {
        etcd.wait_ready_v2().await;
    } else {
        etcd.wait_ready().await;
    }
}

/// Adds `member` to the cluster `endpoint` serves, through the v2 members
/// API (2.x) or v3's `MemberAdd`.
async fn member_add(endpoint: &str, member: &Member, storage: &str) -> Result<(), String> {
    if storage == "etcd2" {
        let url = format!("{endpoint}/v2/members");
        let response = http_client()
            .post(&url)
            .header("content-type", "application/json")
            .body(serde_json::json!({ "peerURLs": [member.peer_url()] }).to_string())
            .send()
            .await
            .map_err(|e| e.to_string())?;
        if response.status().is_success() {
            return Ok(());
        }
        return Err(format!(
            "{}: {}",
            response.status(),
            response.text().await.unwrap_or_default()
        ));
    }
    let mut client = connect_within(endpoint, PROBE_TIMEOUT)
        .await
        .map_err(|e| e.to_string())?;
    client
        .member_add(vec![member.peer_url()], None)
        .await
        .map(drop)
        .map_err(|e| e.to_string())
}

/// Three members of `from` on etcd3 data taken to `to`/`storage` by hand.
fn by_hand(from: &str, to: &str, storage: &str) {
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
        .map(|i| start(from, &members[i], &data[i], ports[i], logs, &cluster, "new"))
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
        write_version_txt(dir, &format!("{from}/etcd3"));
    }
    let mut old = old.into_iter();
    let a = old.next().expect("a");
    for etcd in old {
        etcd.stop();
    }
    a.stop();

    // 2. That member taken to the target alone.
    let bin = linked_bin_dir(&[from, to], logs);
    let run = Migration::new(to, &data[0], &members[0])
        .bin_dir(&bin)
        .arg("--target-storage")
        .arg(storage)
        .run();
    run.assert_code(0);
    assert_eq!(
        read_version_txt(&data[0]),
        format!("{to}/{storage}"),
        "{}",
        run.explain()
    );
    let mut joined = vec![start(
        to,
        &members[0],
        &data[0],
        ports[0],
        logs,
        &initial_cluster(&all[..1]),
        "new",
    )];

    // 3. The others added back one at a time, on empty data dirs.
    block_on(async {
        wait_ready(&mut joined[0], storage).await;
        let expected = local_keys(&endpoint_a, storage).await;
        assert_eq!(expected.len(), KEYS + 1, "{expected:?}");
        let expiring: Vec<&str> = expected
            .iter()
            .filter(|(_, _, expires)| *expires)
            .map(|(k, _, _)| k.as_str())
            .collect();
        assert_eq!(expiring, ["/registry/events/e1"], "{expected:?}");
        for i in 1..3 {
            until_taken(&format!("member add {}", members[i].name), || {
                member_add(&endpoint_a, &members[i], storage)
            })
            .await;
            std::fs::rename(
                &data[i],
                logs.join(format!("{}.etcd3-backup", members[i].name)),
            )
            .expect("the old data aside");
            let mut etcd = start(
                to,
                &members[i],
                &data[i],
                ports[i],
                logs,
                &initial_cluster(&all[..=i]),
                "existing",
            );
            wait_ready(&mut etcd, storage).await;
            joined.push(etcd);
        }
        for (i, etcd) in joined.iter().enumerate() {
            assert_eq!(
                local_keys(&etcd.endpoint(), storage).await,
                expected,
                "{} holds what {} holds",
                members[i].name,
                members[0].name
            );
        }
    });
    for etcd in joined {
        etcd.stop();
    }
}
