//! This module owns what the test learns from each member's client port
//! over TLS (`/version`, `/health`, with curl and a deadline per probe),
//! and the monitor that polls every member's `/version` at a steady rate
//! for a whole scenario, so that the invariants "never two members down at
//! once" and "no member two minors ahead of the cluster version" are
//! checked on every round, not only at the end.

use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use super::docker::{run_with_deadline, POLL};
use super::pki::ClientPki;

/// What one probe may take (curl's own --max-time; the process gets a
/// little more before it is killed).
pub const PROBE_DEADLINE: Duration = Duration::from_secs(3);
/// The monitor's rate: a round starts at most this often.
pub const MONITOR_PERIOD: Duration = Duration::from_millis(500);

/// A member's `/version` answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VersionAnswer {
    pub server: String,
    /// "not_decided" early in a cluster's life.
    pub cluster: String,
    /// The storage version 3.6+ report ("3.6.0"); empty before.
    pub storage: String,
}

/// `(major, minor)` of "3.4.23" / "3.4.0".
pub fn minor(version: &str) -> Option<(u32, u32)> {
    let mut parts = version.split('.');
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

/// GET `https://<ip>:2379<path>` with the test's client certificate; the
/// body, or why not.
pub fn get(pki: &ClientPki, ip: &str, path: &str) -> Result<String, String> {
    let url = format!("https://{ip}:2379{path}");
    let max = PROBE_DEADLINE.as_secs().to_string();
    let out = run_with_deadline(
        Command::new("curl")
            .args(["-sS", "--max-time", &max, "--connect-timeout", &max])
            .arg("--cacert")
            .arg(&pki.ca)
            .arg("--cert")
            .arg(&pki.cert)
            .arg("--key")
            .arg(&pki.key)
            .arg(&url),
        PROBE_DEADLINE + Duration::from_secs(5),
    );
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "{url}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// The member's `/version`.
pub fn version(pki: &ClientPki, ip: &str) -> Result<VersionAnswer, String> {
    let body = get(pki, ip, "/version")?;
    let v: serde_json::Value =
        serde_json::from_str(&body).map_err(|e| format!("{ip}/version {body:?}: {e}"))?;
    Ok(VersionAnswer {
        server: v["etcdserver"].as_str().unwrap_or_default().to_string(),
        cluster: v["etcdcluster"].as_str().unwrap_or_default().to_string(),
        storage: v["storage"].as_str().unwrap_or_default().to_string(),
    })
}

/// Whether the member's `/health` says true (a quorum read on every
/// release this image bundles).
pub fn healthy(pki: &ClientPki, ip: &str) -> Result<(), String> {
    let body = get(pki, ip, "/health")?;
    let v: serde_json::Value =
        serde_json::from_str(&body).map_err(|e| format!("{ip}/health {body:?}: {e}"))?;
    if v["health"].as_str() == Some("true") || v["health"].as_bool() == Some(true) {
        Ok(())
    } else {
        Err(format!("{ip}/health: {body}"))
    }
}

/// One round of the monitor: every member's answer (None: it did not
/// answer within the probe's deadline, i.e. it is down or cut off).
#[derive(Debug, Clone)]
pub struct Round {
    pub at: Duration,
    pub answers: Vec<Option<VersionAnswer>>,
    /// The scenario itself took members down together during this round
    /// (all restarted at once): "two down" is not a violation then.
    pub down_excused: bool,
}

/// Polls every member's `/version` until stopped.
pub struct Monitor {
    stop: Arc<AtomicBool>,
    excuse: Arc<AtomicBool>,
    rounds: Arc<Mutex<Vec<Round>>>,
    thread: Option<JoinHandle<()>>,
}

impl Monitor {
    /// Starts polling `ips` (in member order).
    pub fn start(pki: ClientPki, ips: Vec<String>) -> Monitor {
        let stop = Arc::new(AtomicBool::new(false));
        let excuse = Arc::new(AtomicBool::new(false));
        let rounds = Arc::new(Mutex::new(Vec::new()));
        let thread = {
            let stop = stop.clone();
            let excuse = excuse.clone();
            let rounds = rounds.clone();
            thread::spawn(move || {
                let started = Instant::now();
                while !stop.load(Ordering::SeqCst) {
                    let round_start = Instant::now();
                    let excused_at_start = excuse.load(Ordering::SeqCst);
                    let probes: Vec<_> = ips
                        .iter()
                        .map(|ip| {
                            let (pki, ip) = (pki.clone(), ip.clone());
                            thread::spawn(move || version(&pki, &ip).ok())
                        })
                        .collect();
                    let answers = probes
                        .into_iter()
                        .map(|p| p.join().unwrap_or(None))
                        .collect();
                    let down_excused = excused_at_start || excuse.load(Ordering::SeqCst);
                    rounds.lock().expect("rounds").push(Round {
                        at: round_start - started,
                        answers,
                        down_excused,
                    });
                    // The steady rate: the next round starts one period
                    // after this one started (or at once if it overran).
                    let next = round_start + MONITOR_PERIOD;
                    while Instant::now() < next && !stop.load(Ordering::SeqCst) {
                        thread::sleep(Duration::from_millis(20));
                    }
                }
            })
        };
        Monitor {
            stop,
            excuse,
            rounds,
            thread: Some(thread),
        }
    }

    /// While `on`, rounds with several members down are the scenario's own
    /// doing (it stopped them together), not a violation; every other
    /// check still holds in those rounds.
    pub fn excuse_down(&self, on: bool) {
        self.excuse.store(on, Ordering::SeqCst);
    }

    /// Ends the excuse ([`Monitor::excuse_down`]) once a round begun after
    /// this call finds every one of `members` answering. The scenario's
    /// own check that a member it restarted is healthy and the monitor's
    /// next probe of it are two requests, not one instant: the excuse
    /// ended on the first alone, and a round just after found that member
    /// not answering yet beside one the scenario keeps down (CI,
    /// 2026-11-30, `pause-member-down`: "2 members down at once" with the
    /// restarted member's etcd serving since 0.1 s before).
    pub fn end_excuse_once_answering(&self, members: &[usize], deadline: Duration) {
        // A round in flight now may have begun before the call.
        let from = self.rounds.lock().expect("rounds").len() + 1;
        let started = Instant::now();
        loop {
            let seen = self
                .rounds
                .lock()
                .expect("rounds")
                .iter()
                .skip(from)
                .any(|r| {
                    members
                        .iter()
                        .all(|&i| r.answers.get(i).is_some_and(Option::is_some))
                });
            if seen {
                self.excuse_down(false);
                return;
            }
            assert!(
                started.elapsed() < deadline,
                "no monitor round within {deadline:?} found members {members:?} answering"
            );
            thread::sleep(POLL);
        }
    }

    /// Waits (with `deadline`) until a round matching `pred` was recorded.
    pub fn wait_round(&self, deadline: Duration, what: &str, pred: impl Fn(&Round) -> bool) {
        let started = Instant::now();
        loop {
            if self.rounds.lock().expect("rounds").iter().any(&pred) {
                return;
            }
            assert!(
                started.elapsed() < deadline,
                "no monitor round within {deadline:?} where {what}"
            );
            thread::sleep(POLL);
        }
    }

    /// Stops polling; the rounds seen.
    pub fn finish(mut self) -> Vec<Round> {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            t.join().expect("the monitor thread panicked");
        }
        std::mem::take(&mut *self.rounds.lock().expect("rounds"))
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A minor's place on the upgrade path (2.2 → 2.3 → 3.0 → 3.1 …), so that
/// "two minors ahead" counts across the 2 → 3 boundary as etcd's rolling
/// procedure does.
fn step((major, minor): (u32, u32)) -> u32 {
    if major <= 2 {
        minor
    } else {
        4 + (major - 3) * 100 + minor
    }
}

/// The invariants over every round: never two members down at once; no
/// member ahead of the cluster version by two minors or more. The
/// cluster version is the highest any member reported in the round (it
/// only ever rises), else the last one known. Returns the violations.
pub fn violations(names: &[String], rounds: &[Round]) -> Vec<String> {
    let mut out = Vec::new();
    let mut cluster: Option<(u32, u32)> = None;
    for round in rounds {
        let down: Vec<&str> = round
            .answers
            .iter()
            .zip(names)
            .filter(|(a, _)| a.is_none())
            .map(|(_, n)| n.as_str())
            .collect();
        if down.len() >= 2 && !round.down_excused {
            out.push(format!(
                "at {:.1}s {} members down at once: {}",
                round.at.as_secs_f64(),
                down.len(),
                down.join(", ")
            ));
        }
        let seen = round
            .answers
            .iter()
            .flatten()
            .filter_map(|a| minor(&a.cluster))
            .max();
        if seen.is_some() {
            cluster = seen.max(cluster);
        }
        let Some((cmaj, cmin)) = cluster else {
            continue;
        };
        for (answer, name) in round.answers.iter().zip(names) {
            let Some(answer) = answer else { continue };
            if let Some(server) = minor(&answer.server) {
                if step(server) >= step((cmaj, cmin)) + 2 {
                    out.push(format!(
                        "at {:.1}s {name} runs {} while the cluster version is {cmaj}.{cmin}",
                        round.at.as_secs_f64(),
                        answer.server
                    ));
                }
            }
        }
    }
    out
}

/// The longest span in which no member answered at all (a whole-cluster
/// pause as the monitor saw it): from the first round with every member
/// down to the next round in which one answered (or the last round, if
/// none did); `(from, took)`, since the monitor started.
pub fn longest_all_down(rounds: &[Round]) -> Option<(Duration, Duration)> {
    let mut open: Option<Duration> = None;
    let mut longest: Option<(Duration, Duration)> = None;
    let close = |from: Duration, to: Duration, longest: &mut Option<(Duration, Duration)>| {
        let took = to.saturating_sub(from);
        if longest.is_none_or(|(_, l)| took > l) {
            *longest = Some((from, took));
        }
    };
    for round in rounds {
        let all_down = round.answers.iter().all(Option::is_none);
        match (all_down, open) {
            (true, None) => open = Some(round.at),
            (false, Some(from)) => {
                close(from, round.at, &mut longest);
                open = None;
            }
            _ => {}
        }
    }
    if let (Some(from), Some(last)) = (open, rounds.last()) {
        close(from, last.at, &mut longest);
    }
    longest
}

/// The monitor's own check, run by the runner (`main.rs`) as a plain
/// test: no image needed.
pub mod tests {
    use super::*;

    fn answer(server: &str, cluster: &str) -> Option<VersionAnswer> {
        Some(VersionAnswer {
            server: server.into(),
            cluster: cluster.into(),
            storage: String::new(),
        })
    }

    pub fn two_down_and_two_minors_ahead_are_violations() {
        let names: Vec<String> = ["a", "b", "c"].iter().map(|s| s.to_string()).collect();
        let ok = Round {
            at: Duration::ZERO,
            down_excused: false,
            answers: vec![answer("3.3.25", "3.3.0"), None, answer("3.4.23", "3.3.0")],
        };
        assert!(violations(&names, std::slice::from_ref(&ok)).is_empty());
        let two_down = Round {
            at: Duration::ZERO,
            answers: vec![answer("3.3.25", "3.3.0"), None, None],
            down_excused: false,
        };
        assert_eq!(violations(&names, std::slice::from_ref(&two_down)).len(), 1);
        let excused = Round {
            down_excused: true,
            ..two_down
        };
        assert!(violations(&names, &[excused]).is_empty());
        let ahead = Round {
            at: Duration::ZERO,
            down_excused: false,
            answers: vec![
                answer("3.3.25", "3.3.0"),
                answer("3.5.16", "not_decided"),
                answer("3.3.25", "3.3.0"),
            ],
        };
        let v = violations(&names, &[ok, ahead]);
        assert_eq!(v.len(), 1, "{v:?}");
        assert!(v[0].contains("b runs 3.5.16"), "{v:?}");
        // 2.3 → 3.0 is one step, 2.2 → 3.0 two.
        let boundary = |cluster: &str| Round {
            at: Duration::ZERO,
            down_excused: false,
            answers: vec![
                answer("3.0.17", cluster),
                answer("2.3.7", cluster),
                answer("2.3.7", cluster),
            ],
        };
        assert!(violations(&names, &[boundary("2.3.0")]).is_empty());
        assert_eq!(violations(&names, &[boundary("2.2.0")]).len(), 1);
    }

    pub fn the_longest_span_with_every_member_down_is_measured() {
        let round = |ms: u64, up: bool| Round {
            at: Duration::from_millis(ms),
            down_excused: true,
            answers: vec![
                up.then(|| answer("3.3.25", "3.3.0").expect("an answer")),
                None,
            ],
        };
        let rounds = [
            round(0, true),
            round(500, false),
            round(1_000, true),
            round(1_500, false),
            round(2_000, false),
            round(3_500, true),
            round(4_000, false),
        ];
        assert_eq!(
            longest_all_down(&rounds),
            Some((Duration::from_millis(1_500), Duration::from_millis(2_000)))
        );
        assert_eq!(longest_all_down(&rounds[..1]), None);
        // Still down at the last round: measured to it.
        assert_eq!(
            longest_all_down(&rounds[5..]),
            Some((Duration::from_millis(4_000), Duration::ZERO))
        );
    }
}
