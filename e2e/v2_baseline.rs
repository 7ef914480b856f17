//! The baseline of etcd2 data taken offline (issue 30 item 3), on real
//! etcd 2.2.1 and 2.3.7 (from `$ETCD_EXTRA_BIN_DIR`; NOT RUN without):
//! every kind of v2 write the replay follows (sets that make dirs,
//! creates and updates, compare-and-swap and compare-and-delete on a
//! value, refused writes, deletes, a TTL that runs out and one inherited
//! from a dir, hidden nodes) is replayed from the log and proven by
//! 2.3.7's whole read; a write whose outcome depends on a node's index
//! makes the baseline fall back to a start of 2.2.1, saying why.

use std::time::{Duration, Instant};

use libtest_mimic::Trial;

use crate::harness::etcd::EtcdProcess;
use crate::harness::migrator::{Migration, Mode};
use crate::harness::v2::{http_client, key_url, read_back_v2};
use crate::harness::{
    block_on, free_port, linked_bin_dir, read_version_txt, release_trial, temp_dir,
    write_version_txt, Member,
};

/// The releases these tests run.
const NEEDS: &[&str] = &["2.2.1", "2.3.7"];

/// How long a key written with a 1 s TTL may take to be expired by etcd's
/// sweep (the leader's SYNC, every 500 ms).
const EXPIRY_TIMEOUT: Duration = Duration::from_secs(30);

/// This module's tests; NOT RUN (ignored) without 2.2.1 and 2.3.7.
pub fn trials() -> Vec<Trial> {
    let tests: [(&'static str, fn()); 2] = [
        (
            "v2_baseline::every_v2_write_the_replay_follows_is_proven_by_the_first_steps_read",
            every_v2_write_the_replay_follows_is_proven_by_the_first_steps_read,
        ),
        (
            "v2_baseline::a_write_on_a_nodes_index_falls_back_to_a_start_saying_why",
            a_write_on_a_nodes_index_falls_back_to_a_start_saying_why,
        ),
    ];
    tests
        .into_iter()
        .map(|(name, test)| release_trial("v2_baseline", name, test, NEEDS))
        .collect()
}

/// One v2 request: `method` on `path` with the query `query` and the form
/// value `value`; the HTTP status.
async fn request(
    endpoint: &str,
    method: &str,
    path: &str,
    query: &str,
    value: Option<&str>,
) -> u16 {
    let mut url = key_url(endpoint, path);
    if !query.is_empty() {
        url.push('?');
        url.push_str(query);
    }
    let client = http_client();
    let mut builder = match method {
        "PUT" => client.put(&url),
        "POST" => client.post(&url),
        "DELETE" => client.delete(&url),
        other => panic!("{other}"),
    };
    if let Some(value) = value {
        builder = builder
            .header("content-type", "application/x-www-form-urlencoded")
            .body(format!("value={value}"));
    }
    let response = builder
        .send()
        .await
        .unwrap_or_else(|err| panic!("v2 {method} {url}: {err}"));
    response.status().as_u16()
}

/// The JSON of a v2 GET of `path`, or `None` on a 404.
async fn get(endpoint: &str, path: &str) -> Option<serde_json::Value> {
    let url = format!("{}?recursive=true", key_url(endpoint, path));
    let response = http_client()
        .get(&url)
        .send()
        .await
        .unwrap_or_else(|err| panic!("v2 GET {url}: {err}"));
    if response.status().as_u16() == 404 {
        return None;
    }
    let body = response.text().await.expect("v2 body");
    Some(serde_json::from_str(&body).unwrap_or_else(|err| panic!("v2 GET {url}: {err}: {body}")))
}

/// Runs etcd-migrate from 2.2.1/etcd2 to 2.3.7/etcd2 on `data` (no exec).
fn migrate(
    data: &std::path::Path,
    member: &Member,
    tmp: &std::path::Path,
) -> crate::harness::migrator::Outcome {
    write_version_txt(data, "2.2.1/etcd2");
    let bin = linked_bin_dir(NEEDS, tmp);
    let run = Migration::new("2.3.7", data, member)
        .arg("--target-storage")
        .arg("etcd2")
        .bin_dir(&bin)
        .mode(Mode::NoExec)
        .run();
    run.assert_code(0);
    assert_eq!(read_version_txt(data), "2.3.7/etcd2");
    run
}

fn every_v2_write_the_replay_follows_is_proven_by_the_first_steps_read() {
    let tmp = temp_dir("v2-baseline");
    let data = tmp.path().join("data");
    let member = Member::new("v2-baseline");
    let mut etcd = EtcdProcess::start("2.2.1", &member, &data, free_port(), tmp.path());
    block_on(async {
        etcd.wait_ready_v2().await;
        let e = etcd.endpoint();
        let e = e.as_str();
        for i in 1..=20 {
            let (path, value) = (format!("/reg/pods/p{i}"), format!("v{i}"));
            assert_eq!(request(e, "PUT", &path, "", Some(&value)).await, 201);
        }
        let writes: &[(&str, &str, &str, Option<&str>, u16)] = &[
            ("PUT", "/locks/a", "ttl=600", Some("me"), 201),
            ("PUT", "/ttldir", "dir=true&ttl=600", None, 201),
            ("PUT", "/ttldir/k", "", Some("in"), 201),
            ("PUT", "/_hidden/x", "", Some("h"), 201),
            ("PUT", "/reg/_h2/y", "", Some("h2"), 201),
            ("PUT", "/gone", "ttl=1", Some("soon"), 201),
            // Compare-and-swap on a value: one holds, one is refused.
            ("PUT", "/reg/pods/p1", "prevValue=v1", Some("swapped"), 200),
            ("PUT", "/reg/pods/p6", "prevValue=other", Some("no"), 412),
            // An update of an existing key, a create of one that exists,
            // a create of a new one.
            (
                "PUT",
                "/reg/pods/p2",
                "prevExist=true",
                Some("updated"),
                200,
            ),
            ("PUT", "/reg/pods/p3", "prevExist=false", Some("no"), 412),
            (
                "PUT",
                "/reg/pods/p21",
                "prevExist=false",
                Some("created"),
                201,
            ),
            // A TTL taken off again by an update without one.
            ("PUT", "/locks/b", "ttl=600", Some("held"), 201),
            ("PUT", "/locks/b", "prevExist=true", Some("kept"), 200),
            // Deletes: a key, a key on its value, a dir refused without
            // `dir`, a full dir refused without `recursive`, a tree.
            ("DELETE", "/reg/pods/p4", "", None, 200),
            ("DELETE", "/reg/pods/p5", "prevValue=v5", None, 200),
            ("DELETE", "/reg/pods/p7", "prevValue=other", None, 412),
            ("DELETE", "/reg", "", None, 403),
            ("DELETE", "/reg", "dir=true", None, 403),
            ("PUT", "/tmp/t/u", "", Some("x"), 201),
            ("DELETE", "/tmp", "recursive=true", None, 200),
            // A set on a dir is refused; a set under a key is refused.
            ("PUT", "/reg/pods", "", Some("no"), 403),
            ("PUT", "/reg/pods/p8/sub", "", Some("no"), 400),
        ];
        for (method, path, query, value, status) in writes {
            assert_eq!(
                request(e, method, path, query, *value).await,
                *status,
                "{method} {path}?{query}"
            );
        }
        // The 1 s TTL runs out; 2.2.1's sweep takes it out (a SYNC in the
        // log the replay applies).
        let started = Instant::now();
        while get(e, "/gone").await.is_some() {
            assert!(started.elapsed() < EXPIRY_TIMEOUT, "/gone did not expire");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    etcd.stop();

    let run = migrate(&data, &member, tmp.path());
    assert!(
        !run.lines_with("baseline taken offline").is_empty()
            && run.lines_with("baseline read by a start").is_empty(),
        "the baseline should be taken offline: {}",
        run.explain()
    );

    let after = read_back_v2("2.3.7", &member, &data, tmp.path());
    let mut expected: Vec<(String, String, bool)> = (1..=20)
        .filter(|i| ![4, 5].contains(i))
        .map(|i| (format!("/reg/pods/p{i}"), format!("v{i}"), false))
        .collect();
    expected[0].1 = "swapped".into();
    expected.retain(|(k, _, _)| k != "/reg/pods/p2");
    expected.push(("/reg/pods/p2".into(), "updated".into(), false));
    expected.push(("/reg/pods/p21".into(), "created".into(), false));
    expected.push(("/locks/a".into(), "me".into(), true));
    expected.push(("/locks/b".into(), "kept".into(), false));
    expected.push(("/ttldir/k".into(), "in".into(), false));
    expected.sort();
    let got: Vec<(String, String, bool)> = after
        .without_health_key()
        .into_iter()
        .map(|(key, node)| (key, node.value, node.expiration.is_some()))
        .collect();
    assert_eq!(got, expected);
    // The hidden keys are there too (the API lists none of them).
    let mut etcd = EtcdProcess::start("2.3.7", &member, &data, free_port(), tmp.path());
    block_on(async {
        etcd.wait_ready_v2().await;
        let e = etcd.endpoint();
        for (path, value) in [("/_hidden/x", "h"), ("/reg/_h2/y", "h2")] {
            let node = get(&e, path)
                .await
                .unwrap_or_else(|| panic!("{path} is gone"));
            assert_eq!(node["node"]["value"], value, "{path}");
        }
    });
    etcd.stop();
}

fn a_write_on_a_nodes_index_falls_back_to_a_start_saying_why() {
    let tmp = temp_dir("v2-baseline-index");
    let data = tmp.path().join("data");
    let member = Member::new("v2-baseline-index");
    let mut etcd = EtcdProcess::start("2.2.1", &member, &data, free_port(), tmp.path());
    block_on(async {
        etcd.wait_ready_v2().await;
        let e = etcd.endpoint();
        assert_eq!(request(&e, "PUT", "/a", "", Some("1")).await, 201);
        let index = get(&e, "/a").await.expect("/a")["node"]["modifiedIndex"]
            .as_u64()
            .expect("index");
        let query = format!("prevIndex={index}");
        assert_eq!(request(&e, "PUT", "/a", &query, Some("2")).await, 200);
    });
    etcd.stop();

    let run = migrate(&data, &member, tmp.path());
    let fell_back = run.lines_with("baseline read by a start of the recorded release");
    assert!(
        fell_back.iter().any(|line| line.contains("prevIndex")),
        "the baseline should be read by a start, naming the prevIndex write: {}",
        run.explain()
    );
    let after = read_back_v2("2.3.7", &member, &data, tmp.path());
    let a = after.leaves.get("/a").expect("/a");
    assert_eq!(a.value, "2");
}
