//! Benchmark helper for bench/run.sh (not a test, not shipped).
//!
//! `floor step`: the minimal hand-rolled migration step, the floor our step
//! time is compared with. Spawn one etcd with exactly the flags
//! src/dialect.rs gives a step (its `StepEtcd::args`, not a copy), poll a v3 put of `etcd_version` every
//! `--poll-ms` until one succeeds, SIGTERM, wait for exit. Prints one JSON
//! line: total (spawn -> exit), healthy (spawn -> first successful put),
//! stop (SIGTERM -> exit), attempts.
//!
//! `floor seed`: writes a realistic key set (some keys on leases) into a
//! running etcd, `--concurrency` puts in flight (default 64). `floor count`: prints how many keys/leases a running etcd
//! holds (used to check the data survived the walk).
//!
//! Arguments are `--key=value` or `--key value`. `step` options: --mode
//! fresh|persistent (a new client per attempt, as src/health.rs does, or one
//! client for all attempts), --version/--storage (default: from the
//! `etcd-<version>` file name, and that release's storage), --poll-ms, --heartbeat-ms/--election-ms (default
//! the values of src/dialect.rs; only to explore others), --output null|pipe|file=PATH (where
//! etcd's stdout/stderr go), --trace (one stderr line per attempt),
//! --hold-client (persistent mode: keep the client open during the stop).

use std::collections::HashMap;
use std::io::Read;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use etcd_client::{Client, ConnectOptions, GetOptions, PutOptions};
use etcd_migrate::config::Member;
use etcd_migrate::dialect::StepEtcd;
use etcd_migrate::version::{Storage, Version};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(1);

fn main() {
    let mut argv = std::env::args().skip(1);
    let cmd = argv.next().unwrap_or_default();
    let args = parse(argv.collect());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let result = match cmd.as_str() {
        "step" => runtime.block_on(step(&args)),
        "seed" => runtime.block_on(seed(&args)),
        "count" => runtime.block_on(count(&args)),
        "putbench" => runtime.block_on(putbench(&args)),
        _ => Err(format!(
            "usage: floor step|seed|count|putbench --key=value ... (got {cmd:?})"
        )),
    };
    if let Err(err) = result {
        eprintln!("floor: {err}");
        std::process::exit(1);
    }
}

fn parse(list: Vec<String>) -> HashMap<String, String> {
    let mut map = HashMap::new();
    let mut it = list.into_iter().peekable();
    while let Some(arg) = it.next() {
        let Some(key) = arg.strip_prefix("--") else {
            continue;
        };
        if let Some((k, v)) = key.split_once('=') {
            map.insert(k.to_string(), v.to_string());
        } else if let Some(v) = it.next_if(|v| !v.starts_with("--")) {
            map.insert(key.to_string(), v);
        } else {
            map.insert(key.to_string(), String::new());
        }
    }
    map
}

fn get<'a>(args: &'a HashMap<String, String>, key: &str) -> Result<&'a str, String> {
    args.get(key)
        .map(String::as_str)
        .ok_or_else(|| format!("--{key} is required"))
}

fn get_or<T: std::str::FromStr>(args: &HashMap<String, String>, key: &str, default: T) -> T {
    args.get(key)
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn options() -> ConnectOptions {
    ConnectOptions::new()
        .with_connect_timeout(ATTEMPT_TIMEOUT)
        .with_timeout(ATTEMPT_TIMEOUT)
}

/// One put on a fresh client: exactly what src/health.rs does per attempt.
async fn put_fresh(endpoint: &str, value: &str) -> Result<(), String> {
    let mut client = Client::connect([endpoint], Some(options()))
        .await
        .map_err(|e| format!("connect: {e}"))?;
    client
        .put("etcd_version", value, None)
        .await
        .map(|_| ())
        .map_err(|e| format!("put: {e}"))
}

/// What `floor step` was asked to do.
struct StepArgs<'a> {
    etcd: &'a str,
    mode: &'a str,
    poll: Duration,
    output: &'a str,
    value: &'a str,
    timeout: Duration,
    // --trace: one stderr line per attempt (start, duration, outcome).
    trace: bool,
}

impl<'a> StepArgs<'a> {
    fn parse(args: &'a HashMap<String, String>) -> Result<Self, String> {
        Ok(StepArgs {
            etcd: get(args, "etcd")?,
            mode: args.get("mode").map(String::as_str).unwrap_or("fresh"),
            poll: Duration::from_millis(get_or(args, "poll-ms", 10u64)),
            output: args.get("output").map(String::as_str).unwrap_or("null"),
            value: args.get("value").map(String::as_str).unwrap_or("floor"),
            timeout: Duration::from_secs(get_or(args, "timeout-s", 60u64)),
            trace: args.contains_key("trace"),
        })
    }
}

/// What one `floor step` measured.
struct Measured {
    spawn_epoch: f64,
    total: Duration,
    healthy: Duration,
    stopped: Duration,
    attempts: u32,
    status: std::process::ExitStatus,
    first_error: String,
}

async fn step(args: &HashMap<String, String>) -> Result<(), String> {
    let step = StepArgs::parse(args)?;
    let (flags, client_url) = step_line(args, step.etcd)?;
    let mut command = etcd_command(step.etcd, &flags, step.output)?;

    // Built before the clock starts, as a persistent client would be in a
    // real tool (Client::connect is lazy: no network until the first call).
    let mut persistent = if step.mode == "persistent" {
        Some(
            Client::connect([client_url.as_str()], Some(options()))
                .await
                .map_err(|e| format!("connect: {e}"))?,
        )
    } else {
        None
    };

    let spawn_epoch = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or_default();
    let started = Instant::now();
    let mut child = command
        .spawn()
        .map_err(|e| format!("spawn {}: {e}", step.etcd))?;
    let drains = if step.output == "pipe" {
        drain_output(&mut child)
    } else {
        Vec::new()
    };
    let pid = Pid::from_raw(child.id() as i32);
    let (healthy, attempts, first_error) =
        poll_until_put(&step, &client_url, persistent.as_mut(), &mut child, started).await?;
    // --hold-client: keep the persistent client (and its HTTP/2
    // connection) open until etcd has exited, to show what that costs.
    let held = if args.contains_key("hold-client") {
        persistent.take()
    } else {
        drop(persistent.take());
        None
    };
    let (status, stopped) = stop(pid, child).await?;
    drop(held);
    let total = started.elapsed();
    for drain in drains {
        let _ = drain.join();
    }
    print_measured(&Measured {
        spawn_epoch,
        total,
        healthy,
        stopped,
        attempts,
        status,
        first_error,
    });
    Ok(())
}

/// The step's etcd flags, built by src/dialect.rs itself, and its client
/// URL.
fn step_line(args: &HashMap<String, String>, etcd: &str) -> Result<(Vec<String>, String), String> {
    let name = get(args, "name")?;
    let data_dir = get(args, "data-dir")?;
    let client_port: u16 = get(args, "client-port")?
        .parse()
        .map_err(|e| format!("--client-port: {e}"))?;
    let peer_url = get(args, "peer-url")?;
    let (version, storage) = step_release(args, etcd)?;
    let member = Member {
        name: name.to_string(),
        client_port,
        listen_peer_urls: peer_url.to_string(),
        initial_advertise_peer_urls: peer_url.to_string(),
        initial_cluster: format!("{name}={peer_url}"),
        initial_cluster_token: "etcd-cluster".to_string(),
        extra_args: Vec::new(),
    };
    // The exact line a real step gets: built by src/dialect.rs itself, so
    // the floor cannot drift from what is measured.
    let spec = StepEtcd {
        version,
        storage,
        member: &member,
        data_dir,
        new_cluster: false,
        snapshot_every_entry: etcd_migrate::dialect::snapshots_every_entry(
            etcd_migrate::ondisk::newest_snap_bytes(std::path::Path::new(data_dir)),
            false,
        ),
    };
    let client_url = spec.client_url();
    let mut flags = spec.args();
    override_timings(args, &mut flags)?;
    Ok((flags, client_url))
}

/// The release and storage the step runs: --version, else the `etcd-<v>`
/// file name the driver passes; --storage, else the release's default.
fn step_release(args: &HashMap<String, String>, etcd: &str) -> Result<(Version, Storage), String> {
    let version: Version = match args.get("version") {
        Some(version) => version.parse(),
        None => std::path::Path::new(etcd)
            .file_name()
            .and_then(|name| name.to_str())
            .and_then(|name| name.strip_prefix("etcd-"))
            .ok_or_else(|| format!("--version is required: {etcd} is not named etcd-<version>"))?
            .parse(),
    }
    .map_err(|e| format!("--version: {e}"))?;
    let storage: Storage = match args.get("storage") {
        Some(storage) => storage.parse().map_err(|e| format!("--storage: {e}"))?,
        None => version.default_storage(),
    };
    Ok((version, storage))
}

/// --heartbeat-ms/--election-ms only to explore other values than
/// STEP_HEARTBEAT_MS/STEP_ELECTION_TIMEOUT_MS: they replace the dialect's
/// value in place.
fn override_timings(args: &HashMap<String, String>, flags: &mut [String]) -> Result<(), String> {
    for (key, flag) in [
        ("heartbeat-ms", "--heartbeat-interval="),
        ("election-ms", "--election-timeout="),
    ] {
        if let Some(value) = args.get(key) {
            let ms: u32 = value.parse().map_err(|e| format!("--{key}: {e}"))?;
            let slot = flags
                .iter_mut()
                .find(|arg| arg.starts_with(flag))
                .ok_or_else(|| format!("the step's line has no {flag}"))?;
            *slot = format!("{flag}{ms}");
        }
    }
    Ok(())
}

/// The etcd command: `flags`, output to `output` (null|pipe|file=PATH),
/// no ETCD* environment, killed if this helper dies.
fn etcd_command(etcd: &str, flags: &[String], output: &str) -> Result<Command, String> {
    let mut command = Command::new(etcd);
    command.args(flags).stdin(Stdio::null());
    if output == "pipe" {
        command.stdout(Stdio::piped()).stderr(Stdio::piped());
    } else if let Some(path) = output.strip_prefix("file=") {
        // etcd's own timestamped lines, for the driver to find "ready to
        // serve client requests"; a file append costs etcd no more than
        // /dev/null does (no reader to wait for).
        let file = std::fs::File::create(path).map_err(|e| format!("{path}: {e}"))?;
        let copy = file.try_clone().map_err(|e| format!("{path}: {e}"))?;
        command.stdout(Stdio::from(file)).stderr(Stdio::from(copy));
    } else {
        command.stdout(Stdio::null()).stderr(Stdio::null());
    }
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("ETCD") {
            command.env_remove(key);
        }
    }
    // SAFETY: only prctl between fork and exec. If this helper dies, etcd
    // dies too (no stray etcd holding the bench ports).
    unsafe {
        command.pre_exec(|| {
            if nix::libc::prctl(nix::libc::PR_SET_PDEATHSIG, nix::libc::SIGKILL, 0, 0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    Ok(command)
}

/// Threads that read and discard the child's piped stdout and stderr.
fn drain_output(child: &mut std::process::Child) -> Vec<std::thread::JoinHandle<()>> {
    let streams: [Option<Box<dyn Read + Send>>; 2] = [
        child
            .stdout
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>),
        child
            .stderr
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>),
    ];
    let mut drains = Vec::new();
    for mut stream in streams.into_iter().flatten() {
        drains.push(std::thread::spawn(move || {
            let mut buf = [0u8; 8192];
            while matches!(stream.read(&mut buf), Ok(n) if n > 0) {}
        }));
    }
    drains
}

/// Puts `etcd_version` every --poll-ms until one succeeds: returns the
/// time from `started` to that put, the attempts and the first error.
async fn poll_until_put(
    step: &StepArgs<'_>,
    client_url: &str,
    mut persistent: Option<&mut Client>,
    child: &mut std::process::Child,
    started: Instant,
) -> Result<(Duration, u32, String), String> {
    let mut attempts = 0u32;
    let mut first_error = String::new();
    let mut last_error: String;
    let healthy = loop {
        attempts += 1;
        let attempt_start = started.elapsed();
        let attempt = match persistent.as_deref_mut() {
            Some(client) => client
                .put("etcd_version", step.value, None)
                .await
                .map(|_| ())
                .map_err(|e| format!("put: {e}")),
            None => put_fresh(client_url, step.value).await,
        };
        if step.trace {
            trace_attempt(attempts, attempt_start, started, &attempt);
        }
        match attempt {
            Ok(()) => break started.elapsed(),
            Err(err) => {
                if first_error.is_empty() {
                    first_error = err.clone();
                }
                last_error = err;
            }
        }
        if let Ok(Some(status)) = child.try_wait() {
            return Err(format!("etcd exited early with {status}: {last_error}"));
        }
        if started.elapsed() > step.timeout {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!(
                "no successful put within {:?}: {last_error}",
                step.timeout
            ));
        }
        tokio::time::sleep(step.poll).await;
    };
    Ok((healthy, attempts, first_error))
}

/// --trace: one stderr line for an attempt.
fn trace_attempt(
    attempts: u32,
    attempt_start: Duration,
    started: Instant,
    attempt: &Result<(), String>,
) {
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    eprintln!(
        "attempt {attempts} at {:.1} ms took {:.1} ms: {}",
        ms(attempt_start),
        ms(started.elapsed() - attempt_start),
        match attempt {
            Ok(()) => "ok".to_string(),
            Err(e) => e.chars().take(120).collect(),
        }
    );
}

/// SIGTERM etcd and wait for it to exit: its status and how long the
/// stop took.
async fn stop(
    pid: Pid,
    mut child: std::process::Child,
) -> Result<(std::process::ExitStatus, Duration), String> {
    let stopping = Instant::now();
    kill(pid, Signal::SIGTERM).map_err(|e| format!("kill: {e}"))?;
    // Wait on a thread and await the result, so the runtime keeps running
    // meanwhile (as etcd-migrate's reaper thread + oneshot do): a dropped
    // client's connection task can then close its socket. Blocking this
    // thread in wait() instead leaves the connection open, and etcd 3.5.30
    // then spends ~5 s in its graceful gRPC stop.
    let (sender, receiver) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        let _ = sender.send(child.wait());
    });
    let status = receiver
        .await
        .map_err(|e| format!("wait: {e}"))?
        .map_err(|e| format!("wait: {e}"))?;
    Ok((status, stopping.elapsed()))
}

/// The one JSON line bench/driver.py parses.
fn print_measured(m: &Measured) {
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!(
        "{{\"spawn_epoch\":{:.6},\"total_ms\":{:.3},\"healthy_ms\":{:.3},\"stop_ms\":{:.3},\"attempts\":{},\"exit\":{:?},\"first_error\":{:?}}}",
        m.spawn_epoch,
        ms(m.total),
        ms(m.healthy),
        ms(m.stopped),
        m.attempts,
        m.status.to_string(),
        m.first_error
    );
}

async fn seed(args: &HashMap<String, String>) -> Result<(), String> {
    let endpoint = get(args, "endpoint")?;
    let keys: usize = get_or(args, "keys", 1000);
    let leased: usize = get_or(args, "leased", 100);
    let leases: usize = get_or(args, "leases", 10).max(1);
    let value_bytes: usize = get_or(args, "value-bytes", 512);
    let prefix = args
        .get("prefix")
        .map(String::as_str)
        .unwrap_or("/registry");
    let mut client = Client::connect([endpoint], Some(options()))
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let mut lease_ids = Vec::new();
    for _ in 0..leases {
        // 1 h: long enough to outlive the benchmark.
        let lease = client
            .lease_grant(3600, None)
            .await
            .map_err(|e| format!("lease grant: {e}"))?;
        lease_ids.push(lease.id());
    }
    let value: String = "x".repeat(value_bytes);
    // --concurrency puts in flight (each its own revision, as the API
    // server's writes are): 1M keys one at a time took 3.3.25 minutes.
    let concurrency: usize = get_or(args, "concurrency", 64).max(1);
    let kv = client.kv_client();
    let mut next = 0;
    while next < keys {
        let batch = (next..keys.min(next + concurrency)).map(|i| {
            let (key, options) = if i < leased {
                (
                    format!("{prefix}/events/default/event-{i:07}"),
                    Some(PutOptions::new().with_lease(lease_ids[i % lease_ids.len()])),
                )
            } else {
                (format!("{prefix}/pods/default/pod-{i:07}"), None)
            };
            let mut kv = kv.clone();
            let value = value.as_str();
            async move { kv.put(key, value, options).await }
        });
        for put in futures_util::future::join_all(batch).await {
            put.map_err(|e| format!("put: {e}"))?;
        }
        next += concurrency;
    }
    println!("{{\"keys\":{keys},\"leased\":{leased},\"leases\":{leases}}}");
    Ok(())
}

async fn count(args: &HashMap<String, String>) -> Result<(), String> {
    let endpoint = get(args, "endpoint")?;
    let prefix = args
        .get("prefix")
        .map(String::as_str)
        .unwrap_or("/registry");
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut client = Client::connect([endpoint], Some(options()))
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let keys = loop {
        match client
            .get(
                prefix,
                Some(GetOptions::new().with_prefix().with_count_only()),
            )
            .await
        {
            Ok(resp) => break resp.count(),
            Err(_) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(20)).await;
                client = Client::connect([endpoint], Some(options()))
                    .await
                    .map_err(|e| format!("connect: {e}"))?;
            }
            Err(err) => return Err(format!("get: {err}")),
        }
    };
    let leases = client
        .leases()
        .await
        .map_err(|e| format!("leases: {e}"))?
        .leases()
        .len();
    let version = client
        .get("etcd_version", None)
        .await
        .map_err(|e| format!("get: {e}"))?
        .kvs()
        .first()
        .map(|kv| String::from_utf8_lossy(kv.value()).into_owned())
        .unwrap_or_default();
    println!("{{\"keys\":{keys},\"leases\":{leases},\"etcd_version\":{version:?}}}");
    Ok(())
}

/// Cost of one health attempt against a running etcd: a put on a fresh
/// client (connect + HTTP/2 handshake + put, as src/health.rs does each
/// attempt) vs a put on one persistent client. Prints medians and p90s.
async fn putbench(args: &HashMap<String, String>) -> Result<(), String> {
    let endpoint = get(args, "endpoint")?;
    let n: usize = get_or(args, "n", 200);
    let mut fresh = Vec::with_capacity(n);
    let mut persistent = Vec::with_capacity(n);
    let mut client = Client::connect([endpoint], Some(options()))
        .await
        .map_err(|e| format!("connect: {e}"))?;
    client
        .put("etcd_version", "warm", None)
        .await
        .map_err(|e| format!("put: {e}"))?;
    for _ in 0..n {
        let t = Instant::now();
        put_fresh(endpoint, "bench").await?;
        fresh.push(t.elapsed().as_secs_f64() * 1000.0);
        let t = Instant::now();
        client
            .put("etcd_version", "bench", None)
            .await
            .map_err(|e| format!("put: {e}"))?;
        persistent.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    let stat = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        (v[v.len() / 2], v[(v.len() * 9) / 10])
    };
    let (fm, f90) = stat(&mut fresh);
    let (pm, p90) = stat(&mut persistent);
    println!(
        "{{\"n\":{n},\"fresh_median_ms\":{fm:.3},\"fresh_p90_ms\":{f90:.3},\"persistent_median_ms\":{pm:.3},\"persistent_p90_ms\":{p90:.3}}}"
    );
    Ok(())
}
