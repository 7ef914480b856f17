//! The pause job's proof of a member that joined a converted cluster on
//! etcd2 storage (`cluster::pause::v2proof`), on real etcd 3.3.25: a v2
//! store read, then every kind of change etcd's v2 store makes (a set, an
//! in-order create, a directory's TTL update, a compare-and-swap, a
//! recursive delete, a refresh, a directory's expiry, a key under new
//! directories), read again; the events etcd's history holds between the
//! two indexes, replayed onto the first read, give the second exactly
//! (and without them it differs: the test can fail). Two members with
//! one value apart fail the proof naming the key; a member against
//! itself passes it.

use std::time::{Duration, Instant};

use etcd_migrate::cluster::pause::v2proof::{
    events_between, first_difference, read_store, replay, same_v2_store, Node,
};

use crate::harness::etcd::EtcdProcess;
use crate::harness::{block_on, temp_dir};

const TIMEOUT: Duration = Duration::from_secs(5);

fn http() -> reqwest::Client {
    etcd_migrate::tls::client_builder()
        .no_proxy()
        .timeout(TIMEOUT)
        .build()
        .expect("http client")
}

/// One v2 request (`method` on `path` with the form `form`), which must
/// succeed.
async fn v2(
    http: &reqwest::Client,
    endpoint: &str,
    method: &str,
    path: &str,
    form: &[(&str, &str)],
) {
    let url = format!("{endpoint}/v2/keys{path}");
    let request = match method {
        "PUT" => http.put(&url),
        "POST" => http.post(&url),
        "DELETE" => http.delete(&url),
        other => panic!("method {other}"),
    };
    let response = request.form(form).send().await.expect("v2 request");
    let status = response.status();
    let body = response.text().await.unwrap_or_default();
    assert!(
        status.is_success(),
        "{method} {url} {form:?}: {status} {body}"
    );
}

#[test]
fn the_events_between_two_reads_replayed_give_the_later_read() {
    let dir = temp_dir("pause-v2-proof");
    let mut etcd = EtcdProcess::start_in("3.3.25", dir.path(), "data", "v2-proof");
    let endpoint = etcd.endpoint();
    block_on(async {
        etcd.wait_ready().await;
        let http = http();
        let put = |path: &'static str, form: Vec<(&'static str, &'static str)>| {
            let http = http.clone();
            let endpoint = endpoint.clone();
            async move { v2(&http, &endpoint, "PUT", path, &form).await }
        };
        put("/a/x", vec![("value", "1")]).await;
        put("/a/y", vec![("value", "2"), ("ttl", "600")]).await;
        put("/b", vec![("dir", "true"), ("ttl", "2")]).await;
        put("/b/z", vec![("value", "3")]).await;
        put("/c/k", vec![("value", "4")]).await;
        put("/keep", vec![("value", "old")]).await;
        put("/ab", vec![("value", "a sibling sharing /a's prefix")]).await;
        let first = read_store(&http, &endpoint).await.expect("first read");
        assert!(first.nodes.contains_key("/b/z"), "{first:?}");

        put("/a/x", vec![("value", "9"), ("ttl", "600")]).await;
        v2(&http, &endpoint, "POST", "/q", &[("value", "in order")]).await;
        put(
            "/a",
            vec![("dir", "true"), ("prevExist", "true"), ("ttl", "600")],
        )
        .await;
        put("/keep", vec![("value", "new"), ("prevValue", "old")]).await;
        v2(&http, &endpoint, "DELETE", "/c?recursive=true", &[]).await;
        put(
            "/a/y",
            vec![("refresh", "true"), ("prevExist", "true"), ("ttl", "900")],
        )
        .await;
        put("/n/m/o", vec![("value", "deep")]).await;
        // /b (a directory with a 2 s TTL) expires with /b/z: etcd's
        // leader sweeps every 500 ms.
        let started = Instant::now();
        let second = loop {
            let read = read_store(&http, &endpoint).await.expect("second read");
            if !read.nodes.contains_key("/b") {
                break read;
            }
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "/b never expired"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        };

        let events = events_between(None, &endpoint, first.index, second.index)
            .await
            .expect("the history between the reads");
        let actions: std::collections::BTreeSet<&str> =
            events.iter().map(|e| e.action.as_str()).collect();
        for action in [
            "set",
            "create",
            "update",
            "compareAndSwap",
            "delete",
            "expire",
        ] {
            assert!(actions.contains(action), "no {action} event in {events:?}");
        }
        assert!(
            first_difference(&first, &second).is_some(),
            "the two reads differ before the replay"
        );
        let mut replayed = first.clone();
        replay(&mut replayed, &events);
        assert_eq!(
            first_difference(&replayed, &second),
            None,
            "the first read, {} events replayed ({events:?}), against the second",
            events.len()
        );
        assert!(
            replayed.index <= second.index,
            "{} > {}",
            replayed.index,
            second.index
        );

        // The proof itself: a member against itself passes.
        let urls = vec![endpoint.clone()];
        let proven = same_v2_store(None, &urls, &urls, TIMEOUT)
            .await
            .expect("a member against itself");
        assert_eq!(proven.nodes, second.nodes.len());
    });

    // Another member, one value apart: the proof fails naming the key.
    let mut other = EtcdProcess::start_in("3.3.25", dir.path(), "other", "v2-proof-other");
    let other_endpoint = other.endpoint();
    block_on(async {
        other.wait_ready().await;
        let http = http();
        // A copy of every node (with a TTL where one expires), /keep's
        // value apart.
        let ours = read_store(&http, &endpoint).await.expect("read");
        for (path, node) in &ours.nodes {
            let mut form = Vec::new();
            match node {
                Node::Dir { expires: false } => continue,
                Node::Dir { expires: true } => form.push(("dir", "true")),
                Node::Leaf { value, .. } => form.push((
                    "value",
                    if path == "/keep" {
                        "not the converter's"
                    } else {
                        value.as_str()
                    },
                )),
            }
            if matches!(
                node,
                Node::Dir { expires: true } | Node::Leaf { expires: true, .. }
            ) {
                form.push(("ttl", "600"));
            }
            v2(&http, &other_endpoint, "PUT", path, &form).await;
        }
        // Two clusters' indexes mean nothing to each other: both are
        // brought to one index (sets of /ab to the value it has), so the
        // proof compares the two reads as they are, with no event between.
        let ab = match ours.nodes.get("/ab") {
            Some(Node::Leaf { value, .. }) => value.clone(),
            other => panic!("/ab is {other:?}"),
        };
        loop {
            let (a, b) = (
                read_store(&http, &endpoint).await.expect("read").index,
                read_store(&http, &other_endpoint)
                    .await
                    .expect("read")
                    .index,
            );
            if a == b {
                break;
            }
            let behind = if a < b { &endpoint } else { &other_endpoint };
            v2(&http, behind, "PUT", "/ab", &[("value", ab.as_str())]).await;
        }
        let failed = same_v2_store(
            None,
            std::slice::from_ref(&other_endpoint),
            std::slice::from_ref(&endpoint),
            TIMEOUT,
        )
        .await
        .expect_err("one value apart");
        assert!(failed.contains("/keep"), "{failed}");
    });
    other.stop();
    etcd.stop();
}
