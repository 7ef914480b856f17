//! This module owns the cluster-test harness: which image to test (or why
//! nothing runs), one scenario at a time, and the pieces a scenario is
//! made of.
//!
//! - `docker`: the docker CLI with deadlines; network, volume and container
//!   guards that remove what they made.
//! - `pki`: a CA and member/client certificates made in the test.
//! - `cluster`: N members of the image on a private network (kubeadm or GCE
//!   style), member operations, the end-of-scenario invariants.
//! - `writer`: TLS clients and the continuous writer.
//! - `monitor`: `/version` and `/health` probes, and the steady poll of
//!   every member with its invariants.
//! - `pause`: a whole-cluster pause job's checks (issue 28): seeded v2
//!   keys in their v3 form, new ids, the measured pause.

pub mod cluster;
pub mod docker;
pub mod monitor;
pub mod pause;
pub mod pki;
pub mod writer;

use std::cell::RefCell;
use std::io::Write;
use std::process::Command;
use std::sync::{Condvar, Mutex, OnceLock};

/// The env var naming the image under test.
pub const IMAGE_VAR: &str = "ETCD_MIGRATE_IMAGE";
/// The env var naming the dir of the releases no registry has; `make
/// cluster-test` bundles the ones it holds into the image.
pub const EXTRA_VAR: &str = "ETCD_EXTRA_BIN_DIR";
/// The releases no registry has (2.x, 3.0–3.2, 3.4.31+, 3.6, 3.7): bundled
/// only from `$ETCD_EXTRA_BIN_DIR`. One list, `images/extra-releases`, which
/// `make image` reads too, so a release added there is NOT RUN here (never a
/// failure) on a machine without it.
fn extra_releases() -> impl Iterator<Item = &'static str> {
    include_str!("../../images/extra-releases").split_whitespace()
}

/// How the test reads and writes a cluster's keys, its membership and the
/// operator's hold on the upgrade lock: over v3 from 3.3 on (the releases
/// CI fetches), over v2 for clusters that began at 2.x or 3.0–3.2 (their
/// v2 API is on by default, and etcd 3.0's gRPC over TLS breaks the Rust
/// HTTP/2 client with a GOAWAY, as the entrypoint's own notes say).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    V2,
    V3,
}

impl Api {
    /// The API for a cluster whose first release is `version`.
    pub fn of(version: &str) -> Api {
        match monitor::minor(version) {
            Some(m) if m < (3, 3) => Api::V2,
            _ => Api::V3,
        }
    }

    /// The API for data of `storage` served by `version`: v2 while the
    /// data is etcd2 (its keys are in the v2 store whatever the release),
    /// else [`Api::of`].
    pub fn of_data(version: &str, storage: &str) -> Api {
        if storage == "etcd2" {
            Api::V2
        } else {
            Api::of(version)
        }
    }
}

/// The storage a cluster whose first release is `version` keeps: etcd2
/// for 2.x (several members never change storage), else etcd3.
pub fn storage_of(version: &str) -> &'static str {
    match monitor::minor(version) {
        Some((2, _)) => "etcd2",
        _ => "etcd3",
    }
}

/// How many scenarios run at once: `CLUSTER_TEST_JOBS`, else 2. Each
/// has 3–5 etcd members on default heartbeats (100 ms, elections after
/// 1 s), and a scenario leaves the machine about three quarters idle
/// (waiting on restarts, leases, the lock): two at once on 2 cores keep
/// every invariant (measured under two CPU burners as well), and halve
/// the suite's time. `CLUSTER_TEST_JOBS=1` runs one at a time.
fn jobs() -> usize {
    static JOBS: OnceLock<usize> = OnceLock::new();
    *JOBS.get_or_init(|| {
        std::env::var("CLUSTER_TEST_JOBS")
            .ok()
            .and_then(|v| v.parse().ok())
            .filter(|n| *n > 0)
            .unwrap_or(2)
    })
}

/// The scenarios running now, and the wake-up for one waiting its turn.
static RUNNING: (Mutex<usize>, Condvar) = (Mutex::new(0), Condvar::new());

/// A scenario's turn: one of [`jobs`], given back on drop (a panicking
/// scenario's too).
struct Turn;

impl Turn {
    fn take() -> Turn {
        let (running, freed) = &RUNNING;
        let mut now = running.lock().unwrap_or_else(|p| p.into_inner());
        while *now >= jobs() {
            now = freed.wait(now).unwrap_or_else(|p| p.into_inner());
        }
        *now += 1;
        Turn
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        let (running, freed) = &RUNNING;
        let mut now = running.lock().unwrap_or_else(|p| p.into_inner());
        *now -= 1;
        freed.notify_one();
    }
}

/// What a scenario needs before it can run.
pub struct Ready {
    pub image: String,
    /// This scenario's turn ([`jobs`] run at once).
    _turn: Turn,
}

/// Whether a scenario needing `versions` can run here, decided once per
/// scenario before any runs (the runner then counts one that cannot as
/// ignored, never as passed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Availability {
    /// The image bundles every release it needs.
    Runs {
        /// The image.
        image: String,
    },
    /// It cannot run here, and why (said on stderr as `NOT RUN`).
    NotRun(String),
    /// The setup is broken (an image named but absent, an image lacking a
    /// release a registry has): the scenario runs, and fails saying so.
    Broken(String),
}

/// What the image under test bundles (its label), asked once.
fn bundled(image: &str) -> Result<String, String> {
    static BUNDLED: OnceLock<Result<String, String>> = OnceLock::new();
    BUNDLED
        .get_or_init(|| {
            let out = docker::docker_output(&[
                "image",
                "inspect",
                "-f",
                "{{ index .Config.Labels \"io.etcd-migrate.bundled-versions\" }}",
                image,
            ]);
            if out.status.success() {
                Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
            } else {
                Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
            }
        })
        .clone()
}

/// The newest release the image under test bundles of `version`'s minor
/// (the one a plan passes through: the latest bundled patch of each minor),
/// or `version` itself when that cannot be asked.
pub fn newest_patch_of(version: &str) -> String {
    let minor = |v: &str| v.rsplit_once('.').map(|(m, _)| m.to_string());
    let patch = |v: &str| {
        v.rsplit_once('.')
            .and_then(|(_, p)| p.parse::<u32>().ok())
            .unwrap_or(0)
    };
    let image = std::env::var(IMAGE_VAR).unwrap_or_default();
    let Ok(bundled) = bundled(&image) else {
        return version.to_string();
    };
    bundled
        .split(',')
        .filter(|b| minor(b) == minor(version))
        .max_by_key(|b| patch(b))
        .map_or_else(|| version.to_string(), str::to_string)
}

/// Whether a scenario needing `versions` can run: an image named, docker
/// and curl there, and every release bundled (a release no registry has,
/// absent from `$ETCD_EXTRA_BIN_DIR` or without it, is a NOT RUN; any
/// other missing release a broken setup).
pub fn availability(versions: &[&str]) -> Availability {
    let image = match std::env::var(IMAGE_VAR) {
        Ok(image) if !image.is_empty() => image,
        _ => {
            return Availability::NotRun(format!(
                "{IMAGE_VAR} is unset; `make cluster-test` builds the image and runs these tests (or set {IMAGE_VAR}=<tag of an image built with `make image`>)"
            ))
        }
    };
    for tool in ["docker", "curl"] {
        let found = Command::new(tool)
            .arg("--version")
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false);
        if !found {
            return Availability::NotRun(format!("{tool} is not available"));
        }
    }
    let bundled = match bundled(&image) {
        Ok(bundled) => bundled,
        // Named but absent is a broken setup, not a reason to pass.
        Err(why) => {
            return Availability::Broken(format!(
                "{IMAGE_VAR}={image}, but docker has no such image: {why}"
            ))
        }
    };
    let missing: Vec<&str> = versions
        .iter()
        .copied()
        .filter(|v| !bundled.split(',').any(|b| b == *v))
        .collect();
    let extra_dir = std::env::var(EXTRA_VAR).unwrap_or_default();
    // A release no registry has is a NOT RUN where the extra dir (if one
    // is named) lacks it too: the image could not bundle it. One the dir
    // holds but the image lacks is an image built without it: broken.
    let unavailable = |v: &str| {
        extra_releases().any(|e| e == v)
            && (extra_dir.is_empty()
                || !std::path::Path::new(&extra_dir)
                    .join(format!("etcd-{v}"))
                    .exists())
    };
    if missing.is_empty() {
        Availability::Runs { image }
    } else if missing.iter().all(|v| unavailable(v)) {
        Availability::NotRun(format!(
            "needs etcd {} (no registry has them): `make cluster-test {EXTRA_VAR}=<dir with etcd-<version> and etcdctl-<version>>` bundles them into the image",
            missing.join(", ")
        ))
    } else {
        Availability::Broken(format!(
            "image {image} lacks {missing:?} (it bundles {bundled})"
        ))
    }
}

thread_local! {
    /// Set while the runner asks a scenario what it needs: `ready` then
    /// records the releases and returns None before anything starts.
    static PROBE: RefCell<Option<Vec<String>>> = const { RefCell::new(None) };
}

/// The releases `scenario` asks `ready` for, found by running it in probe
/// mode: every scenario calls `ready` before it does anything else, so it
/// returns there at once. One list, the scenario's own, for the runner's
/// decision and the scenario's run.
pub fn needs_of(scenario: fn()) -> Vec<String> {
    PROBE.with(|probe| *probe.borrow_mut() = Some(Vec::new()));
    scenario();
    PROBE.with(|probe| probe.borrow_mut().take().unwrap_or_default())
}

/// The image to test, with this scenario's turn ([`jobs`] at once). Panics
/// when it cannot run: the runner lists such a scenario as ignored, so it
/// only gets here when the setup changed under the run or is broken.
pub fn ready(scenario: &str, versions: &[&str]) -> Option<Ready> {
    let probing = PROBE.with(|probe| {
        probe.borrow_mut().as_mut().map(|needs| {
            needs.extend(versions.iter().map(|v| v.to_string()));
        })
    });
    if probing.is_some() {
        return None;
    }
    match availability(versions) {
        Availability::Runs { image } => Some(Ready {
            image,
            _turn: Turn::take(),
        }),
        Availability::NotRun(why) | Availability::Broken(why) => {
            panic!("scenario {scenario} cannot run: {why}")
        }
    }
}

/// A line on stderr that libtest's capture does not swallow (it captures
/// only the print macros), so a skipped or finished scenario is seen.
pub fn say(line: &str) {
    let mut stderr = std::io::stderr().lock();
    let _ = writeln!(stderr, "cluster tests: {line}");
    let _ = stderr.flush();
}

/// The entrypoint's last line in `log` (what it was doing when killed),
/// cut to a readable length.
pub fn last_line(log: &str) -> String {
    const SHOWN: usize = 300;
    let line = log
        .lines()
        .rev()
        .find(|l| l.contains("[etcd-migrate]"))
        .unwrap_or("(none)");
    match line.char_indices().nth(SHOWN) {
        Some((at, _)) => format!("{}...", &line[..at]),
        None => line.to_string(),
    }
}
