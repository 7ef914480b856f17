//! This module owns the cluster mode end to end on loopback: three members
//! of a real TLS cluster, each on its own loopback address (127.0.0.11 …;
//! peer and client certificates made here), each
//! restarted in turn as `etcd-migrate -- <its etcd flags>` with a
//! multi-minor target, roll the cluster to it themselves; holders die at
//! the failpoints of their restart under the lock (`FAILPOINTS`, SIGKILL of
//! the entrypoint; every `cluster-after-*` point in the CI case) and are
//! started again. At the end every member runs the
//! target, reports its minor as the cluster version, records it in
//! `version.txt`, carries no restart mark, and the membership (ids, peer
//! and client URLs) is unchanged. The same on 2.x releases (2.2.1 → 2.3.7
//! → 3.0.17 over the v2 lock) when `$ETCD_EXTRA_BIN_DIR` has them; NOT RUN
//! without it. And one pause job (3.4.23 → 3.3.25) whose joiner's member
//! add meets the converter killed: asked again, never the end of its run.

use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use etcd_migrate::cluster::peer::PeerClient;
use etcd_migrate::version::Version;

use crate::cluster_probe::{observe, start_cluster_of, wait_for_cluster_version_of, Node, Pki};
use crate::harness::etcd::kill_and_reap;
use crate::harness::migrator::{Migration, Mode, Running};
use crate::harness::{block_on, read_version_txt, temp_dir, Member};

const ALL_NAMES: [&str; 5] = ["etcd-a", "etcd-b", "etcd-c", "etcd-d", "etcd-e"];
/// What the whole roll may take on a loaded two-core machine.
const ROLL_DEADLINE: Duration = Duration::from_secs(300);
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

fn say(line: &str) {
    let mut stderr = std::io::stderr().lock();
    let _ = writeln!(stderr, "cluster_roll: {line}");
}

/// A real TLS cluster of `size` members of the etcd at `program` on
/// loopback, settled at its release's cluster version.
struct TestCluster {
    tmp: tempfile::TempDir,
    pki: Pki,
    names: &'static [&'static str],
    nodes: Vec<Node>,
    peers: PeerClient,
    /// The cluster as first seen settled.
    before: etcd_migrate::cluster::View,
}

impl TestCluster {
    fn start(tag: &str, program: &Path, release: Version, size: usize) -> TestCluster {
        let names = &ALL_NAMES[..size];
        let tmp = temp_dir(tag);
        let pki = Pki::new(tmp.path(), names);
        let nodes = start_cluster_of(program, tmp.path(), &pki, names);
        let peers = PeerClient::new(Some(&pki.tls("etcd-a")), PROBE_TIMEOUT).expect("peer client");
        let before = wait_for_cluster_version_of(&peers, &nodes, release.minor_line());
        TestCluster {
            tmp,
            pki,
            names,
            nodes,
            peers,
            before,
        }
    }

    /// Member `i`'s data dir.
    fn data(&self, i: usize) -> std::path::PathBuf {
        self.tmp.path().join(self.names[i])
    }

    /// Member `i`'s etcd stopped (SIGKILL) with `recorded` in its
    /// version.txt, as the image's first run finds it; its data dir.
    fn take_down(&mut self, i: usize, recorded: &str) -> std::path::PathBuf {
        let data = self.data(i);
        std::fs::write(data.join("version.txt"), recorded).expect("version.txt");
        if let Some(mut child) = self.nodes[i].child.take() {
            kill_and_reap(&mut child);
        }
        data
    }

    /// `run` (member `i`'s entrypoint) started, once it serves again on
    /// its peer URL (an operator's rollout goes node by node).
    fn spawn_serving(&self, i: usize, run: &Migration) -> Running {
        let running = run.spawn();
        let started = Instant::now();
        while block_on(self.peers.version(&self.nodes[i].peer_url)).is_err() {
            assert!(
                started.elapsed() < ROLL_DEADLINE,
                "{} did not serve again: {}",
                self.names[i],
                running.stderr()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        running
    }

    /// Member `i` as it would run with `args` instead of its own flags.
    fn node_with(&self, i: usize, args: Vec<String>) -> Node {
        Node {
            peer_url: self.nodes[i].peer_url.clone(),
            client_url: self.nodes[i].client_url.clone(),
            args,
            child: None,
        }
    }

    /// Waits until every member runs `target` and records
    /// `target/storage` ([`wait_rolled`]).
    fn wait_all_on(&self, target: &str, storage: &str, members: &mut [Running]) {
        let all_recorded = || self.all_recorded(&format!("{target}/{storage}"));
        let release = target.parse().expect("version");
        wait_rolled(&self.peers, &self.nodes, release, &all_recorded, members);
    }

    /// Whether every member's version.txt records `want`.
    fn all_recorded(&self, want: &str) -> bool {
        (0..self.names.len()).all(|i| {
            std::fs::read_to_string(self.data(i).join("version.txt"))
                .is_ok_and(|text| text.trim() == want)
        })
    }
}

/// The entrypoints' stderr, one after the other (for a failure message).
fn all_stderr(members: &[Running]) -> String {
    members
        .iter()
        .map(|m| m.stderr())
        .collect::<Vec<_>>()
        .join("\n----\n")
}

/// The entrypoint of member `i`, in exec mode with the node's own flags.
fn entrypoint(
    node: &Node,
    name: &str,
    data: &Path,
    (target, storage): (&str, &str),
    bundled: &str,
    bin_dir: &Path,
) -> Migration {
    let member = Member::new(name);
    Migration {
        name: name.to_string(),
        ..Migration::new(target, data, &member)
    }
    .bin_dir(bin_dir)
    .bundled(bundled)
    .arg("--target-storage")
    .arg(storage)
    .mode(Mode::Exec(node.args.clone()))
}

/// Waits until every member's peer `/version` names `release`, the
/// cluster version is its minor and every `version.txt` records it (the
/// record follows the member's proof); panics with the members' logs
/// otherwise.
fn wait_rolled(
    peers: &PeerClient,
    nodes: &[Node],
    release: Version,
    recorded: &dyn Fn() -> bool,
    members: &mut [Running],
) {
    let started = Instant::now();
    loop {
        let view = observe(peers, nodes, Duration::ZERO);
        let done = view.cluster_version == Some(release.minor_line())
            && view
                .members
                .iter()
                .all(|m| m.reach == etcd_migrate::cluster::Reach::Up(release))
            && recorded();
        if done {
            say(&format!(
                "every member runs {release} {:.1} s after the last restart",
                started.elapsed().as_secs_f64()
            ));
            return;
        }
        if started.elapsed() > ROLL_DEADLINE {
            panic!(
                "the cluster did not reach {release} within {ROLL_DEADLINE:?}: {view:?}\n{}",
                all_stderr(members)
            );
        }
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// A cluster started at `from` (etcd itself), each member then restarted
/// as its entrypoint with TARGET_VERSION `target`; member `i` with
/// `failpoints[i]` dies there once (SIGKILL of its entrypoint; its etcd
/// follows by its parent-death signal) and is started again without.
fn roll(
    bin_dir: &Path,
    from: &str,
    storage: &str,
    target: &str,
    bundled: &str,
    failpoints: &[Option<&str>],
    backs_up: Option<usize>,
) {
    // One member per entry of `failpoints`.
    let mut cluster = TestCluster::start(
        "cluster-roll",
        &bin_dir.join(format!("etcd-{from}")),
        from.parse().expect("version"),
        failpoints.len(),
    );
    let names = cluster.names;
    let mut members: Vec<Running> = Vec::new();
    for (i, name) in names.iter().enumerate() {
        let data = cluster.take_down(i, &format!("{from}/{storage}"));
        let mut run = entrypoint(
            &cluster.nodes[i],
            name,
            &data,
            (target, storage),
            bundled,
            bin_dir,
        );
        if let Some(failpoint) = failpoints[i] {
            run = run.env("FAILPOINTS", format!("{failpoint}=return"));
        }
        if backs_up == Some(i) {
            run = run.arg("--backup").arg("always");
        }
        members.push(cluster.spawn_serving(i, &run));
    }
    let mut pending: Vec<usize> = (0..names.len())
        .filter(|i| failpoints[*i].is_some())
        .collect();
    // What the runs that died said (the lock taken, their restart).
    let mut history = String::new();
    let deadline = Instant::now() + ROLL_DEADLINE;
    while !pending.is_empty() {
        for i in pending.clone() {
            let Some(status) = members[i].try_status() else {
                continue;
            };
            // The failpoint's `return` is a SIGKILL of the entrypoint.
            assert_eq!(
                std::os::unix::process::ExitStatusExt::signal(&status),
                Some(9),
                "{} ended with {status}, not at its failpoint: {}",
                names[i],
                members[i].stderr()
            );
            say(&format!(
                "{} died at {}; starting it again",
                names[i],
                failpoints[i].unwrap_or_default()
            ));
            history.push_str(&members[i].stderr());
            let data = cluster.data(i);
            let again = entrypoint(
                &cluster.nodes[i],
                names[i],
                &data,
                (target, storage),
                bundled,
                bin_dir,
            );
            again.wait_for_ports_free(Duration::from_secs(30));
            members[i] = again.spawn();
            pending.retain(|p| *p != i);
        }
        assert!(
            Instant::now() < deadline,
            "members {pending:?} never reached their failpoints: {}",
            all_stderr(&members)
        );
        std::thread::sleep(Duration::from_millis(200));
    }

    cluster.wait_all_on(target, storage, &mut members);
    for (i, name) in names.iter().enumerate() {
        let data = cluster.data(i);
        assert_eq!(
            read_version_txt(&data),
            format!("{target}/{storage}"),
            "{name}"
        );
        assert!(
            !data.join(".etcd-migrate.restart").exists(),
            "{name} keeps a restart mark"
        );
    }
    let urls = |v: &etcd_migrate::cluster::View| {
        let mut m: Vec<_> = v
            .members
            .iter()
            .map(|m| {
                (
                    m.id,
                    m.name.clone(),
                    m.peer_urls.clone(),
                    m.client_urls.clone(),
                )
            })
            .collect();
        m.sort();
        m
    };
    // Every member's own view, through its client API (served once its
    // etcd is ready, never from the middle of its log's replay, as a peer
    // `/members` of a member that has just restarted can be). A member
    // that has just restarted publishes its client URLs a moment after it
    // answers (seen: an empty list once, on a loaded machine): the views
    // are compared once each lists every member published, within a
    // deadline.
    let before = urls(&cluster.before);
    let tls = cluster.pki.tls("etcd-a");
    let views = || -> Vec<Result<Vec<_>, String>> {
        cluster
            .nodes
            .iter()
            .map(|node| {
                block_on(etcd_migrate::cluster::client::membership(
                    std::slice::from_ref(&node.client_url),
                    Some(&tls),
                    PROBE_TIMEOUT,
                ))
                .map(|members| {
                    let mut m: Vec<_> = members
                        .into_iter()
                        .map(|m| (m.id, m.name, m.peer_urls, m.client_urls))
                        .collect();
                    m.sort();
                    m
                })
                .map_err(|e| e.to_string())
            })
            .collect()
    };
    let published = Instant::now() + Duration::from_secs(60);
    let after = loop {
        let after = views();
        let settled = after.iter().all(|view| {
            view.as_ref()
                .is_ok_and(|m| m.iter().all(|(_, _, _, client)| !client.is_empty()))
        });
        if settled || Instant::now() >= published {
            break after;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    for (name, view) in names.iter().zip(&after) {
        assert_eq!(
            view.as_ref(),
            Ok(&before),
            "the membership changed, as {name} lists it through its client API; every member's view: {after:#?}\nthe entrypoints' logs:\n{}",
            all_stderr(&members)
        );
    }
    if let Some(i) = backs_up {
        assert_backed_up_once(
            &cluster.tmp.path().join(format!("{}.backup", names[i])),
            from,
            storage,
            &members[i].stderr(),
        );
    }
    let logs: String = history + &members.iter().map(|m| m.stderr()).collect::<String>();
    assert!(
        logs.contains("upgrade lock taken") && logs.contains("member proven"),
        "the second wave went through the lock:\n{logs}"
    );
    stop_all(members);
}

/// Tells every member's entrypoint to stop. A stop request reaches the
/// member's etcd through its entrypoint (or is etcd's own, where the
/// entrypoint exec'd it): it ends as etcd ends on SIGTERM, 0 or 128 + 15
/// or the signal itself.
fn stop_all(members: Vec<Running>) {
    for mut member in members {
        member.signal(nix::sys::signal::Signal::SIGTERM);
        let outcome = member.wait(Duration::from_secs(60));
        let status = outcome.status;
        assert!(
            matches!(status.code(), Some(0) | Some(143))
                || std::os::unix::process::ExitStatusExt::signal(&status) == Some(15),
            "an entrypoint told to stop ended with {status}: {}",
            outcome.explain()
        );
    }
}

/// `--backup=always` on a member that rolls: one backup of its data as
/// recorded (taken before its etcd first started), complete with its
/// manifest, named for the release it holds.
fn assert_backed_up_once(root: &Path, from: &str, storage: &str, log: &str) {
    let backups: Vec<String> = std::fs::read_dir(root)
        .unwrap_or_else(|e| panic!("{}: {e}\n{log}", root.display()))
        .map(|entry| {
            entry
                .expect("entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    assert_eq!(backups.len(), 1, "{backups:?}\n{log}");
    assert!(
        backups[0].contains(&format!("-{from}-{storage}")),
        "{backups:?}"
    );
    assert!(
        root.join(&backups[0]).join("MANIFEST.sha256").is_file(),
        "{backups:?} has no manifest"
    );
    assert!(log.contains("backup taken"), "{log}");
}

/// Four of the five members of the 3.4 → 3.5 wave (under the lock) die
/// once, each at another failpoint: right after taking the lock, after
/// stopping its etcd, after starting the next release, after recording it
/// but before releasing the lock (the others then wait out the lock's TTL:
/// its next start takes the exec path).
#[test]
fn five_members_roll_3_3_to_3_5_through_holders_killed_at_each_failpoint() {
    roll(
        &crate::harness::bin_dir(),
        "3.3.25",
        "etcd3",
        "3.5.16",
        "3.3.25,3.4.23,3.5.16",
        &[
            Some("cluster-after-lock"),
            Some("cluster-after-stop"),
            Some("cluster-after-start"),
            Some("cluster-after-record"),
            None,
        ],
        // The fifth also asks for a backup before its first start.
        Some(4),
    );
}

/// The releases no registry has, from `$ETCD_EXTRA_BIN_DIR` (NOT RUN
/// without them).
fn extra(test: &str, binaries: &[&str]) -> Option<std::path::PathBuf> {
    let dir = crate::harness::extra_bin_dir()
        .filter(|dir| binaries.iter().all(|b| dir.join(b).is_file()));
    if dir.is_none() {
        say(&format!(
            "NOT RUN: {test} needs {} in $ETCD_EXTRA_BIN_DIR",
            binaries.join(", ")
        ));
    }
    dir
}

/// 3.0 → 3.1 over the v2 API (3.0's gRPC over TLS is not spoken), then
/// 3.1 → 3.2 over v3, the lock crossing from one store to the other.
#[test]
fn three_members_roll_3_0_to_3_2_over_the_v2_then_the_v3_lock() {
    let Some(dir) = extra(
        "the 3.0 → 3.2 roll",
        &["etcd-3.0.17", "etcd-3.1.20", "etcd-3.2.32"],
    ) else {
        return;
    };
    roll(
        &dir,
        "3.0.17",
        "etcd3",
        "3.2.32",
        "3.0.17,3.1.20,3.2.32",
        &[Some("cluster-after-lock"), None, None],
        None,
    );
}

#[test]
fn three_2x_members_roll_2_2_to_3_0_over_the_v2_lock() {
    let Some(dir) = extra("the 2.x roll", &["etcd-2.2.1", "etcd-2.3.7", "etcd-3.0.17"]) else {
        return;
    };
    roll(
        &dir,
        "2.2.1",
        "etcd2",
        "3.0.17",
        "2.2.1,2.3.7,3.0.17",
        &[None, Some("cluster-after-start"), None],
        None,
    );
}

/// A member restarted with a version change and a peer TLS no other member
/// accepts (a TLS change rolled out together with the version): refused
/// with exit 2 before its etcd starts, the data dir untouched; whether
/// our side rejects theirs (a stranger's CA) or theirs rejects ours (a
/// certificate from a stranger's CA, the cluster's CA still trusted).
#[test]
fn a_peer_tls_no_other_member_accepts_is_refused_untouched() {
    let bin_dir = crate::harness::bin_dir();
    let mut cluster = TestCluster::start(
        "cluster-tls",
        &bin_dir.join("etcd-3.3.25"),
        Version::new(3, 3, 25),
        3,
    );
    let data = cluster.take_down(0, "3.3.25/etcd3");
    let stranger_dir = cluster.tmp.path().join("stranger");
    std::fs::create_dir(&stranger_dir).expect("stranger dir");
    let stranger = Pki::new(&stranger_dir, &["etcd-a"]).tls("etcd-a");
    let ours = cluster.pki.tls("etcd-a");
    let cases = [
        (
            "a stranger's CA",
            stranger.trusted_ca.clone(),
            stranger.cert.clone(),
            stranger.key.clone(),
        ),
        (
            "a stranger's certificate",
            ours.trusted_ca.clone(),
            stranger.cert.clone(),
            stranger.key.clone(),
        ),
    ];
    for (case, ca, cert, key) in cases {
        let args: Vec<String> = cluster.nodes[0]
            .args
            .iter()
            .map(|arg| {
                let (flag, _) = arg.split_once('=').unwrap_or((arg, ""));
                match flag {
                    "--peer-trusted-ca-file" => format!("{flag}={}", ca.display()),
                    "--peer-cert-file" => format!("{flag}={}", cert.display()),
                    "--peer-key-file" => format!("{flag}={}", key.display()),
                    _ => arg.clone(),
                }
            })
            .collect();
        let node = cluster.node_with(0, args);
        let before = crate::harness::tree::fingerprint(&data);
        let run = entrypoint(
            &node,
            "etcd-a",
            &data,
            ("3.4.23", "etcd3"),
            "3.3.25,3.4.23",
            &bin_dir,
        )
        .run();
        say(&format!("{case}: {}", run.last_line()));
        run.assert_refused_untouched(
            &data,
            &before,
            &[
                "fails its handshake with every other member",
                "etcd-b",
                "etcd-c",
                "TARGET_VERSION=3.3.25",
            ],
        );
    }
}

/// The lock crosses from the v2 store to the v3 one when the cluster
/// version moves from 3.0 to 3.1, and etcd keeps the two apart: a hold in
/// v2 (here the operator's, as the last member restarting into 3.1 under
/// the lock would hold it) must keep the 3.2 wave waiting at cluster
/// version 3.1, though the v3 key is free. Three 3.0.17 members restarted
/// with TARGET_VERSION=3.2.32 start 3.1.20 (no lock needed), then wait,
/// naming the holder, until the v2 hold is let go; then roll to 3.2.32.
#[test]
fn a_hold_on_the_v2_lock_keeps_the_wave_after_the_crossing_waiting() {
    use etcd_migrate::cluster::lock::{Holder, Taken, UpgradeLock, V2Lock};
    let Some(bin_dir) = extra(
        "the v2 hold across the 3.0 → 3.1 crossing",
        &["etcd-3.0.17", "etcd-3.1.20", "etcd-3.2.32"],
    ) else {
        return;
    };
    let mut cluster = TestCluster::start(
        "cluster-crossing",
        &bin_dir.join("etcd-3.0.17"),
        Version::new(3, 0, 17),
        3,
    );
    let endpoints: Vec<String> = cluster.nodes.iter().map(|n| n.client_url.clone()).collect();
    let operator = Holder {
        member: "0".to_string(),
        name: "the operator (test)".to_string(),
        run: "test".to_string(),
    };
    let mut lock = V2Lock::new(
        &endpoints,
        Some(&cluster.pki.tls("etcd-a")),
        operator,
        PROBE_TIMEOUT,
    )
    .expect("the operator's v2 lock");
    assert_eq!(block_on(lock.try_take()).expect("take"), Taken::Ours);
    let (target, bundled) = ("3.2.32", "3.0.17,3.1.20,3.2.32");
    let mut members: Vec<Running> = Vec::new();
    for (i, name) in cluster.names.iter().enumerate() {
        let data = cluster.take_down(i, "3.0.17/etcd3");
        let run = entrypoint(
            &cluster.nodes[i],
            name,
            &data,
            (target, "etcd3"),
            bundled,
            &bin_dir,
        );
        members.push(cluster.spawn_serving(i, &run));
    }
    // Every member waits on the v2 holder at 3.1 (twice each: not a
    // passing glance); the hold is kept alive meanwhile.
    // "waiting for member 0 to finish its restart": the holder's id as the
    // observation names it (no member has it).
    let waiting = "waiting for member 0 to finish its restart";
    let started = Instant::now();
    let mut last_refresh = Instant::now();
    while !members
        .iter()
        .all(|m| m.stderr().matches(waiting).count() >= 2)
    {
        let view = observe(&cluster.peers, &cluster.nodes, Duration::ZERO);
        let ahead: Vec<String> = view
            .members
            .iter()
            .filter(|m| matches!(m.reach, etcd_migrate::cluster::Reach::Up(v) if v.minor_line() > Version::new(3, 1, 0).minor_line()))
            .map(|m| m.name.clone())
            .collect();
        assert!(
            ahead.is_empty(),
            "{ahead:?} went on past 3.1 while the v2 lock was held: {view:?}\n{}",
            all_stderr(&members)
        );
        assert!(
            started.elapsed() < ROLL_DEADLINE,
            "not every member waited on the v2 holder within {ROLL_DEADLINE:?}: {view:?}\n{}",
            all_stderr(&members)
        );
        if last_refresh.elapsed() > Duration::from_secs(10) {
            block_on(lock.refresh()).expect("the operator keeps the v2 hold");
            last_refresh = Instant::now();
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    say("every member waited at 3.1 on the hold in the v2 store; letting it go");
    block_on(lock.release()).expect("the operator lets the v2 lock go");
    cluster.wait_all_on(target, "etcd3", &mut members);
    let after = observe(&cluster.peers, &cluster.nodes, Duration::ZERO);
    let ids = |v: &etcd_migrate::cluster::View| {
        let mut ids: Vec<u64> = v.members.iter().map(|m| m.id).collect();
        ids.sort();
        ids
    };
    assert_eq!(ids(&cluster.before), ids(&after), "the membership changed");
}

/// `--backup always` in cluster mode, where the backup cannot be taken (no
/// room on the backup dir's filesystem): refused with exit 2 before the
/// member's etcd starts, naming the fix; the data dir byte-identical and
/// nothing written to the backup's filesystem.
#[test]
fn a_member_whose_backup_cannot_fit_is_refused_before_its_etcd_starts() {
    let bin_dir = crate::harness::bin_dir();
    let mut cluster = TestCluster::start(
        "cluster-backup-nospace",
        &bin_dir.join("etcd-3.3.25"),
        Version::new(3, 3, 25),
        3,
    );
    let data = cluster.take_down(0, "3.3.25/etcd3");
    let small = crate::harness::mount::Mount::tmpfs(&cluster.tmp.path().join("small"), "size=1m");
    let before = crate::harness::tree::fingerprint(&data);
    let run = entrypoint(
        &cluster.nodes[0],
        "etcd-a",
        &data,
        ("3.4.23", "etcd3"),
        "3.3.25,3.4.23",
        &bin_dir,
    )
    .arg("--backup")
    .arg("always")
    .arg("--backup-dir")
    .arg(small.path.join("b"))
    .run();
    say(&format!("a backup that cannot fit: {}", run.last_line()));
    run.assert_refused_untouched(
        &data,
        &before,
        &[
            "not enough free space",
            "--backup never",
            "nothing was started and the data dir is as it was",
        ],
    );
    let written = std::fs::read_dir(&small.path)
        .expect("the small filesystem")
        .count();
    assert_eq!(written, 0, "nothing is written to the backup's filesystem");
    drop(small);
}

/// A member's etcd flags go to every release it rolls through: a flag the
/// next one removed (`--ca-file`: 3.3 accepts it, 3.4 does not) is refused
/// with exit 2 before anything starts, naming the release and etcd's own
/// words, instead of a restart under the lock that could not start.
#[test]
fn a_flag_a_release_on_the_way_refuses_is_refused_before_anything_starts() {
    let bin_dir = crate::harness::bin_dir();
    let mut cluster = TestCluster::start(
        "cluster-flags",
        &bin_dir.join("etcd-3.3.25"),
        Version::new(3, 3, 25),
        3,
    );
    let data = cluster.take_down(0, "3.3.25/etcd3");
    let mut args = cluster.nodes[0].args.clone();
    args.push(format!(
        "--ca-file={}",
        cluster.pki.tls("etcd-a").trusted_ca.display()
    ));
    let node = cluster.node_with(0, args);
    let before = crate::harness::tree::fingerprint(&data);
    let run = entrypoint(
        &node,
        "etcd-a",
        &data,
        ("3.5.16", "etcd3"),
        "3.3.25,3.4.23,3.5.16",
        &bin_dir,
    )
    .run();
    say(&format!("--ca-file on the way to 3.5: {}", run.last_line()));
    run.assert_refused_untouched(
        &data,
        &before,
        &[
            "(etcd 3.4.23) refuses the etcd flags it is to run with",
            "flag provided but not defined: -ca-file",
            "3.3.25, 3.4.23, 3.5.16",
        ],
    );
}

/// Where a joiner of the pause job is held: under the converted cluster's
/// lock, before its member add.
#[cfg(feature = "failpoints")]
const JOIN_HOLD_AT: &str = "pause-join-after-lock";
/// Long enough for the test to read the point's trace line and freeze
/// the joiner there (what follows may then take as long as it takes).
#[cfg(feature = "failpoints")]
const JOIN_HOLD_MS: u64 = 3000;

/// Where a joiner of the pause job is held: added to the converted
/// cluster, before its etcd starts.
#[cfg(feature = "failpoints")]
const JOIN_START_AT: &str = "pause-join-before-etcd";
/// Where a joiner of the pause job is held: its etcd started on the
/// converted cluster, before its proof.
#[cfg(feature = "failpoints")]
const JOIN_PROOF_AT: &str = "pause-join-before-proof";
/// A joiner's line for each start of its etcd after that etcd exited.
#[cfg(feature = "failpoints")]
const STARTS_ITS_ETCD_AGAIN: &str =
    "pause job: this member's etcd exited during the job; starting it again";

/// A pause job of 3 members 3.4.23 → 3.3.25 with the operator's consent,
/// its first joiner frozen at failpoint `point` (the others pass it
/// later, once the lock is theirs).
#[cfg(feature = "failpoints")]
struct HeldJoiner {
    cluster: TestCluster,
    members: Vec<Running>,
    joiner: usize,
    frozen: crate::harness::migrator::Frozen,
    converter: usize,
    deadline: Instant,
}

#[cfg(feature = "failpoints")]
impl HeldJoiner {
    /// Member `i`'s entrypoint, TARGET_VERSION=3.3.25 with the consent.
    fn entry(cluster: &TestCluster, i: usize) -> Migration {
        entrypoint(
            &cluster.nodes[i],
            cluster.names[i],
            &cluster.data(i),
            ("3.3.25", "etcd3"),
            "3.3.25,3.4.23",
            &crate::harness::bin_dir(),
        )
        .arg("--allow-cluster-pause")
    }

    fn start(test: &str, point: &'static str) -> Self {
        let bin_dir = crate::harness::bin_dir();
        let mut cluster = TestCluster::start(
            test,
            &bin_dir.join("etcd-3.4.23"),
            Version::new(3, 4, 23),
            3,
        );
        let names = cluster.names;
        let mut members: Vec<Running> = Vec::new();
        for i in 0..names.len() {
            cluster.take_down(i, "3.4.23/etcd3");
            let run = Self::entry(&cluster, i)
                .env("FAILPOINTS", format!("{point}=1*sleep({JOIN_HOLD_MS})"))
                .env("ETCD_MIGRATE_FAILPOINT_TRACE", "1");
            members.push(cluster.spawn_serving(i, &run));
        }
        let deadline = Instant::now() + ROLL_DEADLINE;
        let holding = |line: &str| {
            crate::harness::migrator::is_ours(line, "failpoint")
                && crate::harness::migrator::field(line, "name") == Some(point)
        };
        let (joiner, frozen) = loop {
            let held = (0..names.len()).find(|&i| members[i].stderr().lines().any(holding));
            if let Some(i) = held {
                break (i, members[i].freeze());
            }
            assert!(
                Instant::now() < deadline,
                "no joiner reached {point}: {}",
                all_stderr(&members)
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        let converter = (0..names.len())
            .find(|&i| {
                members[i]
                    .stderr()
                    .contains("pause job: go; this member carries the data")
            })
            .unwrap_or_else(|| panic!("no converter: {}", all_stderr(&members)));
        HeldJoiner {
            cluster,
            members,
            joiner,
            frozen,
            converter,
            deadline,
        }
    }

    /// The pid of the etcd member `i`'s run spawned last (a process group
    /// of its own).
    fn etcd_pid(&self, i: usize) -> i32 {
        let log = self.members[i].stderr();
        log.lines()
            .rev()
            .filter(|line| crate::harness::migrator::is_ours(line, "member etcd spawned"))
            .find_map(|line| crate::harness::migrator::field(line, "pid")?.parse().ok())
            .unwrap_or_else(|| panic!("{} spawned no etcd: {log}", self.cluster.names[i]))
    }

    /// Lets the joiner go, waits for its line saying it started its etcd
    /// again on `data` ("none written yet", "its own, kept"), then `after`;
    /// every member ends on 3.3.25 and the joiner's run never ended.
    fn let_go_and_converge(self, data: &str, after: impl FnOnce()) {
        let HeldJoiner {
            cluster,
            mut members,
            joiner,
            frozen,
            deadline,
            ..
        } = self;
        let name = cluster.names[joiner];
        drop(frozen);
        loop {
            let log = members[joiner].stderr();
            if log
                .lines()
                .any(|line| line.contains(STARTS_ITS_ETCD_AGAIN) && line.contains(data))
            {
                break;
            }
            assert!(
                members[joiner].try_status().is_none() && Instant::now() < deadline,
                "{name} did not start its etcd again on {data:?}: {log}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        say(&format!(
            "{name}'s etcd exited and was started again by its run ({data})"
        ));
        after();
        cluster.wait_all_on("3.3.25", "etcd3", &mut members);
        assert!(
            members[joiner].try_status().is_none(),
            "{name}'s run ended: {}",
            members[joiner].stderr()
        );
        stop_all(members);
    }
}

/// The pause job's joiner whose etcd finds no converter to join (CI,
/// 2026-11-30: the converter killed 0.3 s after a joiner's add; the
/// joiner's etcd, "cannot fetch cluster info from peer urls", exited, and
/// so did the joiner's run, leaving the converted cluster of two voters
/// down until the kubelet's back-off let it start again) starts that etcd
/// again itself: the first joiner frozen right after its add, the
/// converter's etcd stopped (SIGSTOP: its peer port takes connections and
/// answers none), the joiner let go. Its etcd exits having written
/// nothing; its run says so and starts it again, until the converter's
/// etcd, let go, answers: every member ends on 3.3.25, the joiner's run
/// never ended (with the restart taken out it exits 1: tried).
#[cfg(feature = "failpoints")]
#[test]
fn a_joiners_etcd_that_finds_no_converter_is_started_again_by_its_run() {
    let held = HeldJoiner::start("pause-join-etcd", JOIN_START_AT);
    let etcd_pid = held.etcd_pid(held.converter);
    let stopped = crate::harness::migrator::Frozen::stop(etcd_pid);
    say(&format!(
        "{} added itself and is held; the converter {}'s etcd (pid {etcd_pid}) stopped; the joiner let go",
        held.cluster.names[held.joiner], held.cluster.names[held.converter]
    ));
    held.let_go_and_converge("none written yet", || drop(stopped));
}

/// The pause job's joiner whose etcd is killed after it started on the
/// converted cluster's data and before the joiner's proof (an OOM kill,
/// say) starts that etcd again on the data it received (its own member's
/// WAL) instead of ending its run: the first joiner frozen before its
/// proof, its etcd SIGKILLed once its WAL is on disk, the joiner let go:
/// its run starts the etcd again, is proven, and every member ends on
/// 3.3.25, the joiner's run never ended.
#[cfg(feature = "failpoints")]
#[test]
fn a_joiners_etcd_killed_before_its_proof_is_started_again_on_its_own_data() {
    let held = HeldJoiner::start("pause-join-proof", JOIN_PROOF_AT);
    let wal = held.cluster.data(held.joiner).join("member").join("wal");
    let written = || {
        std::fs::read_dir(&wal).is_ok_and(|entries| {
            entries
                .flatten()
                .any(|e| e.file_name().to_string_lossy().ends_with(".wal"))
        })
    };
    while !written() {
        assert!(
            Instant::now() < held.deadline,
            "the joiner's etcd wrote no WAL in {}",
            wal.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let etcd_pid = held.etcd_pid(held.joiner);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(etcd_pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap_or_else(|e| panic!("SIGKILL to {etcd_pid}: {e}"));
    say(&format!(
        "{}'s etcd (pid {etcd_pid}) SIGKILLed before its proof, its WAL written; the joiner let go",
        held.cluster.names[held.joiner]
    ));
    held.let_go_and_converge("its own, kept", || {});
}

/// The pause job's joiner whose member add meets the converted cluster
/// down (its converter SIGKILLed as it began to serve: CI once saw "peer
/// closed connection") releases the lock and asks again once the
/// converter is back, instead of ending its run: 3 members 3.4.23 →
/// 3.3.25 with the operator's consent; the first joiner frozen at its
/// add, the converter killed, the joiner let go (its add refused), the
/// converter started again; every member ends on 3.3.25, the joiner's
/// run never ended.
#[cfg(feature = "failpoints")]
#[test]
fn a_joiner_whose_add_meets_the_converter_down_asks_again() {
    let HeldJoiner {
        cluster,
        mut members,
        joiner,
        frozen,
        converter,
        deadline,
    } = HeldJoiner::start("pause-join", JOIN_HOLD_AT);
    let names = cluster.names;
    say(&format!(
        "{} holds the lock before its add; killing the converter {}",
        names[joiner], names[converter]
    ));
    members[converter].signal(nix::sys::signal::Signal::SIGKILL);
    let killed = Instant::now();
    while members[converter].try_status().is_none() {
        assert!(
            killed.elapsed() < Duration::from_secs(30),
            "the converter outlived SIGKILL"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let history = members[converter].stderr();
    let again = HeldJoiner::entry(&cluster, converter);
    again.wait_for_ports_free(Duration::from_secs(30));
    drop(frozen);
    let asked = "to add this member (";
    while !members[joiner].stderr().contains(asked) {
        assert!(
            members[joiner].try_status().is_none() && Instant::now() < deadline,
            "{} did not ask again after its add failed: {}",
            names[joiner],
            members[joiner].stderr()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    say(&format!(
        "{} asked again; the converter starts again",
        names[joiner]
    ));
    members[converter] = cluster.spawn_serving(converter, &again);
    cluster.wait_all_on("3.3.25", "etcd3", &mut members);
    assert!(
        members[joiner].try_status().is_none(),
        "{}'s run ended: {}",
        names[joiner],
        members[joiner].stderr()
    );
    let log = members[joiner].stderr();
    assert!(
        log.contains("asking again")
            && log.contains("pause job: this member added itself to the converted cluster"),
        "{} asked again and then joined: {log}\n(the converter's first run: {history})",
        names[joiner]
    );
    stop_all(members);
}
