//! This module owns what a whole-cluster pause job (issue 28) must leave
//! behind, checked on a live cluster: every member recording the target
//! and serving it; the same names and URLs, the joined members' ids new
//! (the converter keeps its own where its data is converted in place);
//! v2 keys seeded before the job in their v3 form (a TTL key under a
//! lease holding what was left of its TTL, a plain key under none); every write the writers got acknowledged on every member; and
//! the pause itself, as the writer and the monitor saw it.

use std::collections::{BTreeMap, BTreeSet};
use std::thread;
use std::time::{Duration, Instant};

use etcd_client::GetOptions;

use super::cluster::{Baseline, Cluster, Membership};
use super::docker::State;
use super::monitor::{self, Monitor, Round};
use super::writer::{self, connect, runtime, Writer, WriterLog, REQUEST_DEADLINE};
use super::{say, Api};

/// The member's consent to a job that pauses the whole cluster's writes.
pub const ALLOW_CLUSTER_PAUSE: &str = "ALLOW_CLUSTER_PAUSE";
/// What a job may take from the last member's restart to every member
/// recording and serving the target: the members agreeing, one stop, a
/// conversion, one start, and two joins one after another, each an etcd
/// start, on a loaded two-core machine.
pub const JOB_DEADLINE: Duration = Duration::from_secs(300);
/// What seeding one key may take, through whichever member answers.
/// How many times [`Cluster::wait_job_done`] starts a member again that
/// exited during the job before it calls the exits a crash loop.
pub const KUBELET_RESTARTS: u32 = 2;
const SEED_DEADLINE: Duration = Duration::from_secs(60);
/// What a read of a seeded prefix from one member may take.
const READ_DEADLINE: Duration = Duration::from_secs(20);

/// v2 keys the test put before a job, to be found in their v3 form after
/// it.
#[derive(Debug, Clone)]
pub struct SeededKeys {
    /// Every key starts with it (a v2 dir of its own).
    pub prefix: String,
    /// The TTL each key was put with, in seconds; None: no TTL.
    pub ttl: Option<u64>,
    /// Each key and its value.
    pub values: BTreeMap<String, String>,
}

/// `(name, peer URLs, client URLs)` of every member: what a pause keeps.
type Shape = BTreeSet<(String, Vec<String>, Vec<String>)>;

fn shape(membership: &Membership) -> Shape {
    membership
        .members
        .values()
        .map(|(name, peers, clients)| {
            let (mut peers, mut clients) = (peers.clone(), clients.clone());
            peers.sort();
            clients.sort();
            (name.clone(), peers, clients)
        })
        .collect()
}

/// What is left of `lease`'s TTL, in seconds.
async fn time_to_live(c: &mut etcd_client::Client, lease: i64) -> Result<i64, String> {
    match tokio::time::timeout(REQUEST_DEADLINE, c.lease_time_to_live(lease, None)).await {
        Ok(Ok(r)) => Ok(r.ttl()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!("no answer within {REQUEST_DEADLINE:?}")),
    }
}

impl Cluster {
    /// Puts `n` v2 keys under `prefix` (`<prefix>0000` = `seeded-0`, …),
    /// each with a TTL of `ttl` seconds if given, through whichever member
    /// answers; every put acknowledged.
    pub fn seed_v2_keys(&self, prefix: &str, n: usize, ttl: Option<u64>) -> SeededKeys {
        let http = writer::v2_http(&self.client);
        let ips = self.ips();
        let mut values = BTreeMap::new();
        for k in 0..n {
            let key = format!("{prefix}{k:04}");
            let value = format!("seeded-{k}");
            let started = Instant::now();
            for ip in ips.iter().cycle() {
                match runtime().block_on(writer::put_v2_ttl(&http, ip, &key, &value, ttl)) {
                    Ok(()) => break,
                    Err(e) => assert!(
                        started.elapsed() < SEED_DEADLINE,
                        "seeding {key}: no member acknowledged it within {SEED_DEADLINE:?}: {e}"
                    ),
                }
                thread::sleep(Duration::from_millis(200));
            }
            values.insert(key, value);
        }
        SeededKeys {
            prefix: prefix.to_string(),
            ttl,
            values,
        }
    }

    /// What is wrong with `seeded` after a storage migration, read over v3
    /// from every member (a linearizable read): each key there with its
    /// value and no other under its prefix; a TTL key under a lease whose
    /// remaining TTL is in (0, ttl]; a plain key under no lease.
    pub fn migrated_key_problems(&self, seeded: &SeededKeys) -> Vec<String> {
        let ips = self.ips();
        let names = self.names();
        let pki = self.client.clone();
        runtime().block_on(async move {
            let mut problems = Vec::new();
            for (ip, name) in ips.iter().zip(&names) {
                let mut c = match connect(&pki, ip).await {
                    Ok(c) => c,
                    Err(e) => {
                        problems.push(format!("{name}: {e}"));
                        continue;
                    }
                };
                let read = tokio::time::timeout(
                    READ_DEADLINE,
                    c.get(
                        seeded.prefix.as_str(),
                        Some(GetOptions::new().with_prefix()),
                    ),
                )
                .await;
                let resp = match read {
                    Ok(Ok(r)) => r,
                    Ok(Err(e)) => {
                        problems.push(format!("{name}: read {}: {e}", seeded.prefix));
                        continue;
                    }
                    Err(_) => {
                        problems.push(format!(
                            "{name}: read {}: no answer in {READ_DEADLINE:?}",
                            seeded.prefix
                        ));
                        continue;
                    }
                };
                let found: BTreeMap<String, (String, i64)> = resp
                    .kvs()
                    .iter()
                    .map(|kv| {
                        (
                            String::from_utf8_lossy(kv.key()).into_owned(),
                            (String::from_utf8_lossy(kv.value()).into_owned(), kv.lease()),
                        )
                    })
                    .collect();
                let values: BTreeMap<&String, &String> =
                    found.iter().map(|(k, (v, _))| (k, v)).collect();
                let wanted: BTreeMap<&String, &String> = seeded.values.iter().collect();
                if values != wanted {
                    let missing: Vec<&String> = seeded
                        .values
                        .iter()
                        .filter(|(k, v)| found.get(*k).map(|(f, _)| f) != Some(*v))
                        .map(|(k, _)| k)
                        .take(5)
                        .collect();
                    problems.push(format!(
                        "{name}: {} v3 keys under {} where {} v2 keys were seeded; missing or wrong e.g. {missing:?}",
                        found.len(),
                        seeded.prefix,
                        seeded.values.len()
                    ));
                }
                let mut remaining: BTreeMap<i64, Result<i64, String>> = BTreeMap::new();
                for (key, (_, lease)) in &found {
                    match (seeded.ttl, *lease) {
                        (None, 0) => {}
                        (None, lease) => problems.push(format!(
                            "{name}: {key} has lease {lease:x}, seeded with no TTL"
                        )),
                        (Some(_), 0) => {
                            problems.push(format!("{name}: {key} has no lease, seeded with a TTL"))
                        }
                        (Some(ttl), lease) => {
                            let left = match remaining.get(&lease) {
                                Some(left) => left.clone(),
                                None => {
                                    let left = time_to_live(&mut c, lease).await;
                                    remaining.insert(lease, left.clone());
                                    left
                                }
                            };
                            match left {
                                Ok(left) if left > 0 && left <= ttl as i64 => {}
                                Ok(left) => problems.push(format!(
                                    "{name}: {key}'s lease {lease:x} has {left} s left, not in (0, {ttl}]"
                                )),
                                Err(e) => problems.push(format!(
                                    "{name}: {key}'s lease {lease:x}: time to live: {e}"
                                )),
                            }
                        }
                    }
                }
            }
            problems
        })
    }

    /// Panics (with every member's log) unless every one of `seeded` is
    /// found in its v3 form on every member ([`Cluster::migrated_key_problems`]).
    pub fn assert_migrated(&self, seeded: &[&SeededKeys]) {
        let problems: Vec<String> = seeded
            .iter()
            .flat_map(|s| self.migrated_key_problems(s))
            .collect();
        assert!(
            problems.is_empty(),
            "seeded v2 keys not migrated:\n  {}\nlogs:\n{}",
            problems.join("\n  "),
            self.all_logs()
        );
        eprintln!(
            "cluster {}: seeded v2 keys found in v3 on every member: {}",
            self.run,
            seeded
                .iter()
                .map(|s| match s.ttl {
                    Some(ttl) =>
                        format!("{} under {} leased ({ttl} s TTL)", s.values.len(), s.prefix),
                    None => format!("{} under {} unleased", s.values.len(), s.prefix),
                })
                .collect::<Vec<_>>()
                .join(", ")
        );
    }

    /// Puts `n` v3 keys under `prefix` (`<prefix>0000` = `seeded-0`, …),
    /// all on one lease of `ttl` seconds if given, through whichever
    /// member answers; every put acknowledged.
    pub fn seed_v3_keys(&self, prefix: &str, n: usize, ttl: Option<u64>) -> SeededKeys {
        let ips = self.ips();
        let pki = self.client.clone();
        let values: BTreeMap<String, String> = (0..n)
            .map(|k| (format!("{prefix}{k:04}"), format!("seeded-{k}")))
            .collect();
        let started = Instant::now();
        for ip in ips.iter().cycle() {
            let done = runtime().block_on(async {
                let mut c = connect(&pki, ip).await?;
                let mut options = None;
                if let Some(ttl) = ttl {
                    let lease = c
                        .lease_grant(ttl as i64, None)
                        .await
                        .map_err(|e| e.to_string())?
                        .id();
                    options = Some(etcd_client::PutOptions::new().with_lease(lease));
                }
                for (key, value) in &values {
                    c.put(key.as_str(), value.as_str(), options.clone())
                        .await
                        .map_err(|e| format!("put {key}: {e}"))?;
                }
                Ok::<(), String>(())
            });
            if let Err(e) = done {
                assert!(
                    started.elapsed() < SEED_DEADLINE,
                    "seeding {prefix}: no member took every put within {SEED_DEADLINE:?}: {e}"
                );
            } else {
                break;
            }
            thread::sleep(Duration::from_millis(200));
        }
        SeededKeys {
            prefix: prefix.to_string(),
            ttl,
            values,
        }
    }

    /// Panics (with every member's log) unless every one of `seeded` (v3
    /// keys) is found in the v2 store of every member after an etcd3 →
    /// etcd2 job: its value, and for a leased key a TTL in (0, ttl], for
    /// a plain key none; no other key under its prefix.
    pub fn assert_rolled_back_to_etcd2(&self, seeded: &[&SeededKeys]) {
        let http = writer::v2_http(&self.client);
        let mut problems = Vec::new();
        for m in &self.members {
            for s in seeded {
                let url = format!(
                    "{}?recursive=true&sorted=true",
                    writer::v2_url(&m.ip, s.prefix.trim_end_matches('/'))
                );
                let json = match writer::get_json(&http, &url) {
                    Ok(json) => json,
                    Err(e) => {
                        problems.push(format!("{}: read {url}: {e}", m.name));
                        continue;
                    }
                };
                let mut found: BTreeMap<String, (String, Option<i64>)> = BTreeMap::new();
                for n in json["node"]["nodes"].as_array().into_iter().flatten() {
                    found.insert(
                        n["key"].as_str().unwrap_or_default().to_string(),
                        (
                            n["value"].as_str().unwrap_or_default().to_string(),
                            n["ttl"].as_i64(),
                        ),
                    );
                }
                let values: BTreeMap<&String, &String> =
                    found.iter().map(|(k, (v, _))| (k, v)).collect();
                let wanted: BTreeMap<&String, &String> = s.values.iter().collect();
                if values != wanted {
                    problems.push(format!(
                        "{}: {} v2 keys under {} where {} v3 keys were seeded",
                        m.name,
                        found.len(),
                        s.prefix,
                        s.values.len()
                    ));
                }
                for (key, (_, ttl)) in &found {
                    match (s.ttl, ttl) {
                        (None, None) => {}
                        (Some(want), Some(got)) if *got > 0 && *got <= want as i64 => {}
                        (want, got) => problems.push(format!(
                            "{}: {key} has TTL {got:?}, seeded on a lease of {want:?} s",
                            m.name
                        )),
                    }
                }
            }
        }
        assert!(
            problems.is_empty(),
            "seeded v3 keys not rolled back to etcd2:\n  {}\nlogs:\n{}",
            problems.join("\n  "),
            self.all_logs()
        );
        eprintln!(
            "cluster {}: seeded v3 keys found in the v2 store of every member: {}",
            self.run,
            seeded
                .iter()
                .map(|s| match s.ttl {
                    Some(ttl) => format!(
                        "{} under {} with TTLs (lease of {ttl} s)",
                        s.values.len(),
                        s.prefix
                    ),
                    None => format!("{} under {} without", s.values.len(), s.prefix),
                })
                .collect::<Vec<_>>()
                .join(", ")
        );
    }

    /// Where the test SIGKILLed a member ([`Cluster::kill`]), a member
    /// whose container has exited is started again, as the kubelet
    /// restarts a static pod's container: an entrypoint that fails mid-job
    /// (its etcd lost to a member killed in the same instant) exits, and
    /// its next start resumes. Not restarted, and the test fails with its
    /// log (`during` says what the test was waiting for): any exit in a job
    /// where nothing was killed, an exit 0 (nothing ends a job that way), a
    /// refusal (exit 2: only the operator can mend it), and a member that
    /// exits more than [`KUBELET_RESTARTS`] times in the test (a crash
    /// loop).
    pub fn restart_exited(&self, during: &str) {
        for (i, m) in self.members.iter().enumerate() {
            let Some(State::Exited(code)) = m.container.as_ref().map(|c| c.state()) else {
                continue;
            };
            let restarts = {
                let mut all = self.restarts.borrow_mut();
                if all.len() <= i {
                    // A member added after the cluster's start.
                    all.resize(i + 1, 0);
                }
                all[i] += 1;
                all[i]
            };
            if !self.killed.get() || code == 0 || code == 2 || restarts > KUBELET_RESTARTS {
                panic!(
                    "member {} exited {code} during {during} (exit {restarts} of it); its log:\n{}",
                    m.name,
                    self.container(i).logs()
                );
            }
            say(&format!(
                "cluster {}: {} exited {code} during {during}; started again, as the kubelet would ({restarts} of at most {KUBELET_RESTARTS})",
                self.run, m.name
            ));
            self.container(i).start();
        }
    }

    /// Waits until every member's version.txt records
    /// `<release>/<storage>`, and every member answers `/health` and runs
    /// `release`: a job done. How long it took. A member that exits
    /// meanwhile is dealt with by [`Cluster::restart_exited`].
    pub fn wait_job_done(&self, release: &str, storage: &str, deadline: Duration) -> Duration {
        /// A job still not done this long after the wait began is slow
        /// for a scenario of these sizes (8–20 s, as a rule): where each
        /// member is then is said once, so that a slow run that passes
        /// still tells what held it.
        const SLOW: Duration = Duration::from_secs(40);
        let want = format!("{release}/{storage}");
        let started = Instant::now();
        let mut said_slow = false;
        loop {
            self.restart_exited("the job");
            let states: Vec<String> = (0..self.members.len())
                .map(|i| {
                    let ip = &self.members[i].ip;
                    let recorded = self.try_version_txt(i);
                    let runs = monitor::version(&self.client, ip).map(|v| v.server);
                    let health = monitor::healthy(&self.client, ip);
                    match (recorded, runs, health) {
                        (Ok(r), Ok(s), Ok(())) if r == want && s == release => String::new(),
                        (r, s, h) => format!(
                            "{}: version.txt {r:?}, runs {s:?}, health {h:?}",
                            self.members[i].name
                        ),
                    }
                })
                .filter(|state| !state.is_empty())
                .collect();
            if states.is_empty() {
                return started.elapsed();
            }
            if !said_slow && started.elapsed() > SLOW {
                said_slow = true;
                let lasts: Vec<String> = (0..self.members.len())
                    .map(|i| {
                        let log = self.container(i).logs();
                        let ours: Vec<&str> = log
                            .lines()
                            .filter(|line| line.starts_with("[etcd-migrate]"))
                            .collect();
                        format!(
                            "{}:\n    {}",
                            self.members[i].name,
                            ours[ours.len().saturating_sub(4)..].join("\n    ")
                        )
                    })
                    .collect();
                say(&format!(
                    "cluster {}: the job is not done {:.0} s into the wait ({}); each member's last lines:\n  {}",
                    self.run,
                    started.elapsed().as_secs_f64(),
                    states.join("; "),
                    lasts.join("\n  ")
                ));
            }
            assert!(
                started.elapsed() < deadline,
                "the job did not end with every member recording and serving {want} within {deadline:?}:\n  {}\nlogs:\n{}",
                states.join("\n  "),
                self.all_logs()
            );
            thread::sleep(Duration::from_secs(1));
        }
    }

    /// The invariants after a whole-cluster pause job: every write in
    /// `acked` on every member (over the API the data asks for now), with
    /// equal keyspace hashes (v3); one cluster id, shared by all; the same
    /// names, peer and client URLs as `before`, and no member id of
    /// `before`'s but the converter's (kept where its data is converted in
    /// place); and the monitor's rounds clean (the
    /// rounds the scenario excused may have every member down). Panics
    /// with every violation found.
    pub fn check_pause_invariants(&self, before: &Baseline, acked: &[u64], rounds: &[Round]) {
        assert!(!rounds.is_empty(), "the monitor made no round");
        assert!(!acked.is_empty(), "the writer got no write acknowledged");
        let mut problems = monitor::violations(&self.names(), rounds);
        problems.extend(match self.api {
            Api::V3 => self.keyspaces_v3(acked),
            Api::V2 => self.keyspaces_v2(acked),
        });
        let old_ids: BTreeSet<u64> = before.membership.members.keys().copied().collect();
        let old_shape = shape(&before.membership);
        let mut cluster_ids = BTreeSet::new();
        let mut own_ids = BTreeSet::new();
        for i in 0..self.members.len() {
            let name = &self.members[i].name;
            let (membership, id) = self.membership(i);
            cluster_ids.insert(membership.cluster_id);
            own_ids.insert(id);
            if membership.members.len() != before.membership.members.len()
                || shape(&membership) != old_shape
            {
                problems.push(format!(
                    "{name}: names or URLs changed: were {old_shape:?}, now {:?}",
                    shape(&membership)
                ));
            }
            let reused: Vec<String> = membership
                .members
                .keys()
                .filter(|m| old_ids.contains(m))
                .map(|m| format!("{m:x}"))
                .collect();
            // The converter keeps its id where its data is converted in
            // place (etcd2 -> etcd3 keeps the WAL's ids); a restore gives
            // it a new one. Every member that joined it is new.
            if reused.len() > 1 {
                problems.push(format!(
                    "{name}: old member ids in the membership: {reused:?} (only the converter's may stay)"
                ));
            }
            if !membership.members.contains_key(&id) {
                problems.push(format!(
                    "{name}: its own id {id:x} is not in its membership"
                ));
            }
        }
        if cluster_ids.len() != 1 {
            problems.push(format!(
                "the members are in {} clusters: {cluster_ids:x?}",
                cluster_ids.len()
            ));
        }
        if own_ids.len() != self.members.len() {
            problems.push(format!("members share ids: {own_ids:x?}"));
        }
        assert!(
            problems.is_empty(),
            "invariants after the pause violated:\n  {}\nlogs:\n{}",
            problems.join("\n  "),
            self.all_logs()
        );
        eprintln!(
            "cluster {}: invariants after the pause hold: {} acknowledged writes on all {} members, {} monitor rounds, names and URLs unchanged, the joined members' ids new (cluster {:x?}), {}",
            self.run,
            acked.len(),
            self.members.len(),
            rounds.len(),
            cluster_ids,
            match self.api {
                Api::V3 => "keyspace hashes equal",
                Api::V2 => "v2 keyspaces equal (keys, values, modified indexes)",
            }
        );
    }

    /// Ends a scenario with a whole-cluster pause job: stops `writer` and
    /// `monitor`, checks [`Cluster::check_pause_invariants`] with the
    /// writes of `writer` and of the writers before it (`earlier`, e.g.
    /// one over v2 stopped before the job), says the longest pause each
    /// writer saw and the longest span with every member down, and that
    /// `test` passed and in how long since `started`.
    pub fn finish_pause_scenario(
        &self,
        test: &str,
        started: Instant,
        before: &Baseline,
        earlier: Vec<WriterLog>,
        writer: Writer,
        monitor: Monitor,
    ) {
        let mut logs = earlier;
        logs.push(writer.finish());
        let rounds = monitor.finish();
        let acked: Vec<u64> = logs.iter().flat_map(|l| l.acked.iter().copied()).collect();
        self.check_pause_invariants(before, &acked, &rounds);
        for (n, log) in logs.iter().enumerate() {
            match log.longest_pause() {
                Some(p) => say(&format!(
                    "{test}: writer {n}: longest pause {:.1} s (first failed write {:.1} s after it started, {} failed attempts in all)",
                    p.took.as_secs_f64(),
                    p.from.as_secs_f64(),
                    log.failed
                )),
                None => say(&format!(
                    "{test}: writer {n}: no pause ({} writes acknowledged, none failed before an acknowledged one)",
                    log.acked.len()
                )),
            }
        }
        if let Some((from, took)) = monitor::longest_all_down(&rounds) {
            say(&format!(
                "{test}: every member down for {:.1} s at most (from {:.1} s into the monitor)",
                took.as_secs_f64(),
                from.as_secs_f64()
            ));
        }
        say(&format!(
            "{test}: passed in {:.1} s",
            started.elapsed().as_secs_f64()
        ));
    }
}
