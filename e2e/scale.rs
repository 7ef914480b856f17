//! Keyspace reads at scale, on real etcd: what each whole-keyspace read
//! costs etcd. etcd 3.3 … 3.5 visit (and count) every key of a requested
//! range, whatever the page limit; a read that pages open ranges
//! `[last, end)` makes etcd visit the rest of the keyspace on every page,
//! which grows with the square of the key count. The test records the
//! ranges a read asks for and has the same etcd count, at the read's
//! revision, how many keys each spans: the sum must stay within a small
//! constant factor of the key count. No timings: counts only.

use std::future::Future;

use etcd_client::GetOptions;
use etcd_migrate::keyspace::{traced_read, ReadLimits};

use crate::harness::etcd::{connect, EtcdProcess};
use crate::harness::ports::free_port;
use crate::harness::{block_on, temp_dir, Member};

/// Keys written: enough that open-range paging in pages of `PAGE` would
/// visit 60× the key count, few enough to write in a second or two.
const KEYS: usize = 6000;

/// Keys per page, small so the test needs few keys.
const PAGE: usize = 50;

/// The bound on keys visited per key read (measured: see
/// `keyspace::ranges`; open ranges would need `KEYS / PAGE / 2` = 60).
const MAX_VISITS_PER_KEY: usize = 12;

/// Runs `body` with the endpoint of a fresh `version` etcd named `name`
/// (data and logs in temp dirs) once it is ready, stops it, and copies its
/// data dir to `SCALE_KEEP` where that is set.
fn on_fresh_etcd<F: Future<Output = ()>>(
    version: &str,
    name: &str,
    body: impl FnOnce(String) -> F,
) {
    let member = Member::new(name);
    let data = temp_dir(&format!("{name}-data"));
    let logs = temp_dir(&format!("{name}-logs"));
    let mut etcd = EtcdProcess::start(version, &member, data.path(), free_port(), logs.path());
    let endpoint = etcd.endpoint();
    block_on(async {
        etcd.wait_ready().await;
        body(endpoint).await;
    });
    etcd.stop();
    if let Ok(keep) = std::env::var("SCALE_KEEP") {
        // For a walk by hand: the data dir as this release left it.
        let status = std::process::Command::new("cp")
            .arg("-a")
            .arg(data.path())
            .arg(&keep)
            .status()
            .expect("cp");
        assert!(status.success());
    }
}

#[test]
fn a_keyspace_read_costs_etcd_a_constant_number_of_visits_per_key() {
    on_fresh_etcd("3.5.16", "scale", |endpoint| async move {
        let mut client = connect(&endpoint).await.expect("connect");
        // Two clusters of decimal keys (the windows' worst case: a digit
        // carries every hundred keys) and a few keys around them.
        let mut ops = Vec::new();
        for i in 0..KEYS {
            let key = if i % 2 == 0 {
                format!("/registry/pods/default/pod-{i:06}")
            } else {
                format!("/registry/secrets/kube-system/s-{i:06}")
            };
            ops.push(etcd_client::TxnOp::put(key, vec![b'x'; 64], None));
            if ops.len() == 100 {
                let txn = etcd_client::Txn::new().and_then(std::mem::take(&mut ops));
                client.txn(txn).await.expect("write keys");
            }
        }
        for key in ["/a", "/registry/", "/zzz", "compact"] {
            client.put(key, "v", None).await.expect("put");
        }
        let total = KEYS + 4;

        let limits = ReadLimits {
            page_bytes: 1 << 30,
            max_page: PAGE,
            first_page: PAGE,
        };
        let read = traced_read(&endpoint, limits)
            .await
            .unwrap_or_else(|err| panic!("read {endpoint}: {err}"));
        assert_eq!(read.keys, total, "every key read once");
        let mut visited = 0;
        for range in &read.ranges {
            let options = GetOptions::new()
                .with_range(range.end.clone().unwrap_or_else(|| vec![0]))
                .with_count_only()
                .with_revision(read.revision);
            let count = client
                .get(range.start.clone(), Some(options))
                .await
                .expect("count a range")
                .count();
            visited += usize::try_from(count).expect("a count");
        }
        assert!(
            visited <= MAX_VISITS_PER_KEY * total,
            "etcd visited {visited} keys for a read of {total} in {} ranges",
            read.ranges.len()
        );
        assert!(
            read.ranges.len() <= 8 * (total / PAGE + 1) + 64,
            "{} ranges for {total} keys in pages of {PAGE}",
            read.ranges.len()
        );
        eprintln!(
            "scale: {total} keys, {} ranges, etcd visited {visited} keys ({:.1} per key)",
            read.ranges.len(),
            visited as f64 / total as f64
        );
    });
}

#[test]
fn a_page_of_large_values_stays_small() {
    on_fresh_etcd("3.5.16", "scale-big", |endpoint| async move {
        let mut client = connect(&endpoint).await.expect("connect");
        for i in 0..40 {
            client
                .put(format!("/registry/big/{i:03}"), vec![b'v'; 1 << 20], None)
                .await
                .expect("put a 1 MiB value");
        }
        let limits = ReadLimits {
            page_bytes: 4 << 20,
            ..ReadLimits::default()
        };
        let read = traced_read(&endpoint, limits).await.expect("read");
        assert_eq!(read.keys, 40);
        // 40 MiB in pages of at most ~4 MiB (the first page is 8 keys).
        assert!(read.ranges.len() >= 6, "{} ranges", read.ranges.len());
    });
}

/// Not a test: the time of one whole-keyspace read of `SCALE_KEYS` keys
/// (default 100,000) × 1 KiB on 3.5.16, by open-range pages of 200 (the
/// read before windows) and by this crate's windows, printed. Run with
/// `cargo test --test e2e scale::measure -- --ignored --nocapture`
/// (`SCALE_VERSION` another release, `SCALE_KEEP` a path to copy the
/// data dir to).
#[test]
#[ignore]
fn measure_read_times() {
    let keys: usize = std::env::var("SCALE_KEYS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000);
    let version = std::env::var("SCALE_VERSION").unwrap_or_else(|_| "3.5.16".to_string());
    let version = version.as_str();
    on_fresh_etcd(version, "scale-measure", |endpoint| async move {
        let mut client = connect(&endpoint).await.expect("connect");
        let mut ops = Vec::new();
        for i in 0..keys {
            let key = format!("/registry/bench/key-{i:07}");
            ops.push(etcd_client::TxnOp::put(key, vec![b'x'; 1024], None));
            if ops.len() == 100 || i + 1 == keys {
                let txn = etcd_client::Txn::new().and_then(std::mem::take(&mut ops));
                client.txn(txn).await.expect("write keys");
            }
        }
        let started = std::time::Instant::now();
        let mut start = vec![0u8];
        let mut revision = 0;
        let mut read = 0;
        loop {
            let options = GetOptions::new()
                .with_from_key()
                .with_limit(200)
                .with_revision(revision);
            let page = client
                .get(start.clone(), Some(options))
                .await
                .expect("page");
            if revision == 0 {
                revision = page.header().expect("header").revision();
            }
            read += page.kvs().len();
            match (page.more(), page.kvs().last()) {
                (true, Some(last)) => {
                    start = last.key().to_vec();
                    start.push(0);
                }
                _ => break,
            }
        }
        let open = started.elapsed();
        let started = std::time::Instant::now();
        let windows = traced_read(&endpoint, ReadLimits::default())
            .await
            .expect("read");
        let windowed = started.elapsed();
        let started = std::time::Instant::now();
        let mut maintenance = client.maintenance_client();
        let hash = maintenance.hash_kv(0).await.expect("hash");
        let hashed = started.elapsed();
        eprintln!(
            "measure: {keys} keys x 1 KiB on {version}: open ranges of 200: {read} keys in {open:?}; windows: {} keys in {} ranges, {windowed:?}; HashKV: {hashed:?} ({:08x})",
            windows.keys,
            windows.ranges.len(),
            hash.hash()
        );
    });
}
