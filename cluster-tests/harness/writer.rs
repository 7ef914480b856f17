//! This module owns the test's etcd clients over TLS (one member each, a
//! deadline on every request; v3, or v2 over HTTPS for clusters that began
//! before 3.3) and the continuous writer: a thread that puts
//! `/cluster-test/w/<seq>` = `<seq>` at a steady rate, member after
//! member, and records every write a member acknowledged.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use etcd_client::{Certificate, Client, ConnectOptions, Identity, TlsOptions};

use super::docker::POLL;
use super::pki::ClientPki;
use super::Api;

/// Prefix of every key the writer puts.
pub const PREFIX: &str = "/cluster-test/w/";
/// A request's deadline (connect and call).
pub const REQUEST_DEADLINE: Duration = Duration::from_secs(3);
/// How long a member that failed a write is left out of the rotation.
pub const REST_AFTER_FAILURE: Duration = Duration::from_secs(2);
/// The writer's rate: one write started at most this often.
pub const WRITE_PERIOD: Duration = Duration::from_millis(50);

/// The key of write `seq`.
pub fn key(seq: u64) -> String {
    format!("{PREFIX}{seq:010}")
}

/// A client of the one member at `ip`, over TLS with the test's client
/// certificate.
pub async fn connect(pki: &ClientPki, ip: &str) -> Result<Client, String> {
    let read =
        |p: &std::path::Path| std::fs::read(p).map_err(|e| format!("read {}: {e}", p.display()));
    let tls = TlsOptions::new()
        .ca_certificate(Certificate::from_pem(read(&pki.ca)?))
        .identity(Identity::from_pem(read(&pki.cert)?, read(&pki.key)?))
        // etcd before 3.5 may answer without ALPN; its port speaks h2 anyway.
        .assume_http2(true);
    let options = ConnectOptions::new()
        .with_tls(tls)
        .with_connect_timeout(REQUEST_DEADLINE)
        .with_timeout(REQUEST_DEADLINE);
    let endpoint = format!("https://{ip}:2379");
    tokio::time::timeout(
        REQUEST_DEADLINE,
        Client::connect([endpoint.as_str()], Some(options)),
    )
    .await
    .map_err(|_| format!("{endpoint}: no connection within {REQUEST_DEADLINE:?}"))?
    .map_err(|e| format!("{endpoint}: {e}"))
}

/// An HTTPS client for the members' v2 API, with the test's client
/// certificate; every request bounded by [`REQUEST_DEADLINE`].
pub fn v2_http(pki: &ClientPki) -> reqwest::Client {
    let read = |p: &std::path::Path| {
        std::fs::read(p).unwrap_or_else(|e| panic!("read {}: {e}", p.display()))
    };
    let ca = reqwest::Certificate::from_pem(&read(&pki.ca)).expect("the test CA");
    let mut pem = read(&pki.cert);
    pem.push(b'\n');
    pem.extend(read(&pki.key));
    let identity = reqwest::Identity::from_pem(&pem).expect("the test's client identity");
    etcd_migrate::tls::client_builder()
        .no_proxy()
        .tls_certs_only([ca])
        .identity(identity)
        .connect_timeout(REQUEST_DEADLINE)
        .timeout(REQUEST_DEADLINE)
        .build()
        .expect("an HTTPS client")
}

/// The v2 keys URL of `key` on the member at `ip`.
pub fn v2_url(ip: &str, key: &str) -> String {
    format!("https://{ip}:2379/v2/keys{key}")
}

/// The JSON answer of a GET of `url` (a v2 read).
pub fn get_json(http: &reqwest::Client, url: &str) -> Result<serde_json::Value, String> {
    runtime().block_on(async {
        let response = http.get(url).send().await.map_err(|e| e.to_string())?;
        let body = response.text().await.map_err(|e| e.to_string())?;
        serde_json::from_str::<serde_json::Value>(&body).map_err(|e| format!("{body:?}: {e}"))
    })
}

/// A current-thread runtime for the test's own async calls.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// What the writer did.
#[derive(Debug, Default, Clone)]
pub struct WriterLog {
    /// Writes a member acknowledged, in order.
    pub acked: Vec<u64>,
    /// When each of `acked` was acknowledged, since the writer started.
    pub acked_at: Vec<Duration>,
    /// Attempts that failed or timed out (their write may or may not have
    /// been applied).
    pub failed: u64,
    /// When each failed attempt began, since the writer started.
    pub failed_at: Vec<Duration>,
    pub last_error: Option<String>,
    /// The last write attempted (acknowledged or not): a writer that goes
    /// on after this one starts past it ([`Writer::start_from`]).
    pub last_seq: u64,
}

/// A span in which the writer got no write acknowledged: from the start
/// of a failed write to the next acknowledgement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pause {
    /// When the first failed write began, since the writer started.
    pub from: Duration,
    pub took: Duration,
}

impl WriterLog {
    /// The longest span from a failed write to the next acknowledged one
    /// (a whole-cluster pause, as a client saw it); None when no write
    /// failed, or none was acknowledged after a failure. The writer makes
    /// one attempt at a time, so a failure that began before an
    /// acknowledgement arrived came before that write.
    pub fn longest_pause(&self) -> Option<Pause> {
        let mut failures = self.failed_at.iter().copied().peekable();
        let mut open: Option<Duration> = None;
        let mut longest: Option<Pause> = None;
        for &ack in &self.acked_at {
            while let Some(failed) = failures.next_if(|f| *f <= ack) {
                open.get_or_insert(failed);
            }
            if let Some(from) = open.take() {
                let took = ack.saturating_sub(from);
                if longest.is_none_or(|l| took > l.took) {
                    longest = Some(Pause { from, took });
                }
            }
        }
        longest
    }
}

/// The continuous writer (a thread with its own runtime).
pub struct Writer {
    stop: Arc<AtomicBool>,
    log: Arc<Mutex<WriterLog>>,
    thread: Option<JoinHandle<()>>,
}

impl Writer {
    /// Starts writing to the members at `ips` over `api`.
    pub fn start(pki: ClientPki, ips: Vec<String>, api: Api) -> Writer {
        Writer::start_from(pki, ips, api, 1)
    }

    /// [`Writer::start`], its first write `first` (past an earlier
    /// writer's [`WriterLog::last_seq`], so that no key of that writer is
    /// written again and both logs are checked in one keyspace).
    pub fn start_from(pki: ClientPki, ips: Vec<String>, api: Api, first: u64) -> Writer {
        let stop = Arc::new(AtomicBool::new(false));
        let log = Arc::new(Mutex::new(WriterLog::default()));
        let thread = {
            let (stop, log) = (stop.clone(), log.clone());
            thread::spawn(move || runtime().block_on(write_loop(pki, ips, api, first, stop, log)))
        };
        Writer {
            stop,
            log,
            thread: Some(thread),
        }
    }

    /// How many writes were acknowledged so far.
    pub fn acks(&self) -> usize {
        self.log.lock().expect("writer log").acked.len()
    }

    /// Waits (with `deadline`) until `more` writes beyond `from` were
    /// acknowledged: proof the cluster has quorum now.
    pub fn wait_acks(&self, from: usize, more: usize, deadline: Duration, why: &str) -> usize {
        let started = Instant::now();
        loop {
            let n = self.acks();
            if n >= from + more {
                return n;
            }
            if started.elapsed() > deadline {
                let log = self.log.lock().expect("writer log");
                panic!(
                    "{why}: only {} of {more} writes acknowledged within {deadline:?} ({} failed, last error: {:?})",
                    n - from,
                    log.failed,
                    log.last_error
                );
            }
            thread::sleep(POLL);
        }
    }

    /// Stops the writer; what it did.
    pub fn finish(mut self) -> WriterLog {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            t.join().expect("the writer thread panicked");
        }
        self.log.lock().expect("writer log").clone()
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

async fn write_loop(
    pki: ClientPki,
    ips: Vec<String>,
    api: Api,
    first: u64,
    stop: Arc<AtomicBool>,
    log: Arc<Mutex<WriterLog>>,
) {
    let started = Instant::now();
    let mut clients: Vec<Option<Client>> = ips.iter().map(|_| None).collect();
    let http = (api == Api::V2).then(|| v2_http(&pki));
    // A member that just failed is skipped for a while (unless every one
    // is), so a member that is down or cut off does not slow the writer
    // by a request deadline on every turn.
    let mut resting: Vec<Option<Instant>> = ips.iter().map(|_| None).collect();
    let mut ticker = tokio::time::interval(WRITE_PERIOD);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut seq: u64 = first.saturating_sub(1);
    let mut next_member = 0;
    while !stop.load(Ordering::SeqCst) {
        ticker.tick().await;
        seq += 1;
        log.lock().expect("writer log").last_seq = seq;
        let key = key(seq);
        // Member after member, each write to the next one; a member that
        // fails hands the write to the one after it.
        let now = Instant::now();
        let order: Vec<usize> = (0..ips.len())
            .map(|attempt| (next_member + attempt) % ips.len())
            .collect();
        let awake: Vec<usize> = order
            .iter()
            .copied()
            .filter(|m| resting[*m].is_none_or(|until| until <= now))
            .collect();
        let tries = if awake.is_empty() { order } else { awake };
        for m in tries {
            let value = seq.to_string();
            let attempt_began = started.elapsed();
            let result = match &http {
                Some(http) => put_v2(http, &ips[m], &key, &value).await,
                None => put(&pki, &ips[m], &mut clients[m], &key, &value).await,
            };
            let mut log = log.lock().expect("writer log");
            match result {
                Ok(()) => {
                    log.acked.push(seq);
                    log.acked_at.push(started.elapsed());
                    resting[m] = None;
                    break;
                }
                Err(e) => {
                    clients[m] = None;
                    resting[m] = Some(Instant::now() + REST_AFTER_FAILURE);
                    log.failed += 1;
                    log.failed_at.push(attempt_began);
                    log.last_error = Some(e);
                }
            }
        }
        next_member = (next_member + 1) % ips.len();
    }
}

async fn put(
    pki: &ClientPki,
    ip: &str,
    client: &mut Option<Client>,
    key: &str,
    value: &str,
) -> Result<(), String> {
    if client.is_none() {
        *client = Some(connect(pki, ip).await?);
    }
    let c = client.as_mut().expect("connected above");
    match tokio::time::timeout(REQUEST_DEADLINE, c.put(key, value, None)).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(format!("put {key} to {ip}: {e}")),
        Err(_) => Err(format!(
            "put {key} to {ip}: no answer within {REQUEST_DEADLINE:?}"
        )),
    }
}

/// A v2 PUT of `key` = `value`; Ok once the member answered with the node
/// it wrote (etcd answers a v2 write only once raft committed it).
async fn put_v2(http: &reqwest::Client, ip: &str, key: &str, value: &str) -> Result<(), String> {
    put_v2_ttl(http, ip, key, value, None).await
}

/// [`put_v2`] with a TTL in seconds (None: a key that never expires).
pub async fn put_v2_ttl(
    http: &reqwest::Client,
    ip: &str,
    key: &str,
    value: &str,
    ttl: Option<u64>,
) -> Result<(), String> {
    let url = v2_url(ip, key);
    let ttl = ttl.map(|t| t.to_string());
    let mut form = vec![("value", value)];
    if let Some(ttl) = &ttl {
        form.push(("ttl", ttl.as_str()));
    }
    let response = http
        .put(&url)
        .form(&form)
        .send()
        .await
        .map_err(|e| format!("put {url}: {e}"))?;
    let status = response.status();
    let body = response
        .text()
        .await
        .map_err(|e| format!("put {url}: {e}"))?;
    if status.is_success() && body.contains("\"node\"") {
        Ok(())
    } else {
        Err(format!("put {url}: HTTP {status}: {}", body.trim()))
    }
}

/// The writer's own check, run by the runner (`main.rs`) as a plain test:
/// no image needed.
pub mod tests {
    use super::*;

    pub fn longest_pause_runs_from_the_first_failure_to_the_next_ack() {
        let ms = Duration::from_millis;
        let log = WriterLog {
            acked: vec![1, 2, 5, 6],
            acked_at: vec![ms(50), ms(100), ms(4_200), ms(4_300)],
            // Every write from 150 ms on fails until the one acknowledged
            // at 4 200 ms: one span, from the first failure.
            failed: 3,
            failed_at: vec![ms(150), ms(1_000), ms(3_000)],
            ..WriterLog::default()
        };
        assert_eq!(
            log.longest_pause(),
            Some(Pause {
                from: ms(150),
                took: ms(4_050)
            })
        );
        let two = WriterLog {
            acked: vec![1, 3, 5],
            acked_at: vec![ms(100), ms(600), ms(2_000)],
            failed: 2,
            failed_at: vec![ms(500), ms(700)],
            ..WriterLog::default()
        };
        assert_eq!(
            two.longest_pause(),
            Some(Pause {
                from: ms(700),
                took: ms(1_300)
            })
        );
        let clean = WriterLog {
            acked: vec![1],
            acked_at: vec![ms(50)],
            ..WriterLog::default()
        };
        assert_eq!(clean.longest_pause(), None);
        // Failures with no acknowledgement after them: no span closed.
        let open = WriterLog {
            acked: vec![1],
            acked_at: vec![ms(50)],
            failed: 1,
            failed_at: vec![ms(60)],
            ..WriterLog::default()
        };
        assert_eq!(open.longest_pause(), None);
    }
}
