//! Security on real etcd: every etcd a run starts, held open at the
//! failpoint `step-after-health-write`, listens only on the loopback client
//! port and on the configured peer URL, and etcd-migrate itself listens on
//! nothing; the data dir, the backup root, each backup and the scratch dir
//! (checked while a rebuilt copy is being served) are 0700, and nothing the
//! run creates is open to group or other.
#![cfg(feature = "failpoints")]

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, ToSocketAddrs};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

use crate::harness::fixture::{self, FixtureSpec};
use crate::harness::migrator::{field, is_ours, Migration};
use crate::harness::v2;
use crate::harness::{
    mode, pids, proc_stat, read_version_txt, temp_dir, Member, MIGRATE_TIMEOUT, WORK_DIR,
};

/// The failpoint that holds each step's etcd open: it is passed right
/// after the etcd accepted its first write, before it is used or stopped.
const HOLD_AT: &str = "step-after-health-write";

/// How long each etcd is held: the test only has to read the trace line
/// and freeze the run within it; the checks run while it is frozen.
const HOLD_MS: u64 = 2000;

/// Permission bits for group and other.
const GROUP_OTHER: u32 = 0o077;

/// A socket a process waits on: TCP in LISTEN, or UDP bound and not
/// connected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Listener {
    proto: &'static str,
    addr: SocketAddr,
}

/// An address as `/proc/net/{tcp,udp}{,6}` prints it: the IP as 32-bit
/// words in host byte order, then the port, all in hex.
fn parse_proc_addr(text: &str) -> SocketAddr {
    let (ip, port) = text
        .split_once(':')
        .unwrap_or_else(|| panic!("no port in /proc/net address {text:?}"));
    let port = u16::from_str_radix(port, 16)
        .unwrap_or_else(|err| panic!("port of /proc/net address {text:?}: {err}"));
    let bytes: Vec<u8> = ip
        .as_bytes()
        .chunks(8)
        .flat_map(|word| {
            let word = std::str::from_utf8(word).unwrap_or_default();
            u32::from_str_radix(word, 16)
                .unwrap_or_else(|err| panic!("IP of /proc/net address {text:?}: {err}"))
                .to_ne_bytes()
        })
        .collect();
    let ip = match <[u8; 4]>::try_from(bytes.as_slice()) {
        Ok(v4) => IpAddr::V4(Ipv4Addr::from(v4)),
        Err(_) => match <[u8; 16]>::try_from(bytes.as_slice()) {
            Ok(v6) => IpAddr::V6(Ipv6Addr::from(v6)),
            Err(_) => panic!("/proc/net address {text:?} is neither IPv4 nor IPv6"),
        },
    };
    SocketAddr::new(ip, port)
}

/// The inodes of the sockets `pid` holds open (`/proc/<pid>/fd/*` links
/// read `socket:[<inode>]`).
fn socket_inodes(pid: i32) -> BTreeSet<u64> {
    let dir = format!("/proc/{pid}/fd");
    let entries =
        std::fs::read_dir(&dir).unwrap_or_else(|err| panic!("list {dir} (pid {pid}): {err}"));
    entries
        .flatten()
        // An fd closed between the listing and the readlink is skipped.
        .filter_map(|entry| std::fs::read_link(entry.path()).ok())
        .filter_map(|link| {
            link.to_str()?
                .strip_prefix("socket:[")?
                .strip_suffix(']')?
                .parse()
                .ok()
        })
        .collect()
}

/// Every socket `pid` listens on, from the socket tables of its own
/// network namespace.
fn listeners(pid: i32) -> Vec<Listener> {
    let inodes = socket_inodes(pid);
    let mut found = Vec::new();
    // TCP_LISTEN is 0A; an unconnected UDP socket shows TCP_CLOSE (07).
    for (proto, table, state) in [
        ("tcp", "tcp", "0A"),
        ("tcp", "tcp6", "0A"),
        ("udp", "udp", "07"),
        ("udp", "udp6", "07"),
    ] {
        let path = format!("/proc/{pid}/net/{table}");
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|err| panic!("read {path} (pid {pid}): {err}"));
        for row in text.lines().skip(1) {
            let columns: Vec<&str> = row.split_whitespace().collect();
            if columns.len() < 10 || columns[3] != state {
                continue;
            }
            let inode: u64 = columns[9]
                .parse()
                .unwrap_or_else(|err| panic!("inode in {path} row {row:?}: {err}"));
            if inodes.contains(&inode) {
                found.push(Listener {
                    proto,
                    addr: parse_proc_addr(columns[1]),
                });
            }
        }
    }
    found
}

/// The live children of `parent`.
fn children_of(parent: i32) -> Vec<i32> {
    pids()
        .into_iter()
        // Gone since the listing: no stat, skipped.
        .filter(|&pid| proc_stat(pid).is_some_and(|stat| stat.ppid == parent && stat.is_live()))
        .collect()
}

/// Where the run's etcds may listen: `127.0.0.1`/`::1` on the client port,
/// and the addresses of the configured peer URL (by default
/// `http://localhost:<peer port>`).
struct Allowed {
    client_port: u16,
    peer: Vec<SocketAddr>,
}

impl Allowed {
    fn for_default_peer_url(client_port: u16, member: &Member) -> Self {
        let peer: Vec<SocketAddr> = ("localhost", member.peer_port)
            .to_socket_addrs()
            .unwrap_or_else(|err| panic!("resolve {}: {err}", member.peer_url()))
            .collect();
        assert!(
            !peer.is_empty(),
            "{} resolves to nothing",
            member.peer_url()
        );
        Allowed { client_port, peer }
    }

    fn permits(&self, listener: &Listener) -> bool {
        let loopback_client = listener.addr.port() == self.client_port
            && (listener.addr.ip() == IpAddr::V4(Ipv4Addr::LOCALHOST)
                || listener.addr.ip() == IpAddr::V6(Ipv6Addr::LOCALHOST));
        listener.proto == "tcp" && (loopback_client || self.peer.contains(&listener.addr))
    }
}

/// What the `etcd started` line said about the etcd about to be held.
#[derive(Debug, Clone)]
struct StartedEtcd {
    version: String,
    pid: i32,
    client_port: u16,
    data_dir: PathBuf,
}

fn parse_started(line: &str) -> StartedEtcd {
    let get = |key| field(line, key).unwrap_or_else(|| panic!("no {key}= in {line:?}"));
    let client = get("client");
    StartedEtcd {
        version: get("version").to_string(),
        pid: get("pid")
            .parse()
            .unwrap_or_else(|err| panic!("pid in {line:?}: {err}")),
        client_port: client
            .rsplit_once(':')
            .and_then(|(_, port)| port.parse().ok())
            .unwrap_or_else(|| panic!("no port in client={client} of {line:?}")),
        data_dir: PathBuf::from(get("data_dir")),
    }
}

/// Checks the sockets while `etcd` is held: it is a child of etcd-migrate,
/// it listens on its client port and its peer URL and nowhere else, no
/// other child listens anywhere else either, and etcd-migrate listens on
/// nothing.
fn check_sockets(migrator: i32, etcd: &StartedEtcd, allowed: &Allowed) {
    let subject = format!(
        "etcd {} (pid {}) on {}",
        etcd.version,
        etcd.pid,
        etcd.data_dir.display()
    );
    assert_eq!(
        etcd.client_port, allowed.client_port,
        "{subject} was given another client port than --port"
    );
    let children = children_of(migrator);
    assert!(
        children.contains(&etcd.pid),
        "{subject} is not a live child of etcd-migrate (pid {migrator}); its children: {children:?}"
    );
    let own = listeners(migrator);
    assert!(
        own.is_empty(),
        "etcd-migrate (pid {migrator}) listens on {own:?} while {subject} runs"
    );
    for child in children {
        let found = listeners(child);
        let stray: Vec<&Listener> = found.iter().filter(|l| !allowed.permits(l)).collect();
        assert!(
            stray.is_empty(),
            "pid {child} (a child of etcd-migrate, while {subject} runs) listens on {stray:?}; \
             only 127.0.0.1/::1 port {} and the peer URL {:?} are allowed; all its listeners: {found:?}",
            allowed.client_port,
            allowed.peer
        );
    }
    let found = listeners(etcd.pid);
    let on_client = found
        .iter()
        .any(|l| l.proto == "tcp" && l.addr.port() == allowed.client_port);
    let on_peer = found
        .iter()
        .any(|l| l.proto == "tcp" && allowed.peer.contains(&l.addr));
    assert!(
        on_client && on_peer,
        "{subject} should listen on its client port {} and its peer URL {:?}, but listens on {found:?}",
        allowed.client_port,
        allowed.peer
    );
    eprintln!("{subject} listens on {found:?}; etcd-migrate on nothing");
}

/// One path's identity and mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Node {
    ino: u64,
    mode: u32,
    dir: bool,
}

/// Every path under `root` (relative; the root itself is `""`). Entries
/// that vanish while listed (a running etcd renames its temp files) are
/// skipped.
fn nodes(root: &Path) -> BTreeMap<PathBuf, Node> {
    let mut found = BTreeMap::new();
    let mut pending = vec![PathBuf::new()];
    while let Some(relative) = pending.pop() {
        let path = root.join(&relative);
        let meta = match std::fs::symlink_metadata(&path) {
            Ok(meta) => meta,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => continue,
            Err(err) => panic!("stat {}: {err}", path.display()),
        };
        let dir = meta.is_dir();
        found.insert(
            relative.clone(),
            Node {
                ino: meta.ino(),
                mode: meta.mode() & 0o7777,
                dir,
            },
        );
        if dir {
            match std::fs::read_dir(&path) {
                Ok(entries) => {
                    pending.extend(entries.flatten().map(|e| relative.join(e.file_name())))
                }
                Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
                Err(err) => panic!("list {}: {err}", path.display()),
            }
        }
    }
    found
}

/// Fails listing every path under `root` that `ok` rejects.
fn assert_all(root: &Path, what: &str, mut ok: impl FnMut(&Path, &Node) -> bool) -> usize {
    let all = nodes(root);
    let bad: Vec<String> = all
        .iter()
        .filter(|(relative, node)| !ok(relative, node))
        .map(|(relative, node)| format!("{:o} {}", node.mode, root.join(relative).display()))
        .collect();
    assert!(
        bad.is_empty(),
        "{what}: these are open to group or other:\n{}",
        bad.join("\n")
    );
    all.len()
}

/// The scratch dir and everything in it: dirs exactly 0700, files private.
fn assert_scratch_private(data: &Path) {
    let work = data.join(WORK_DIR);
    let count = assert_all(&work, "the scratch dir while a step runs", |_, node| {
        if node.dir {
            node.mode == 0o700
        } else {
            node.mode & GROUP_OTHER == 0
        }
    });
    eprintln!("{count} paths in {} are private", work.display());
}

/// Runs `migration` with every step etcd held for [`HOLD_MS`] right after
/// its first write. At each hold, checks the sockets and, when it exists,
/// the scratch dir. Asserts exit 0 and returns the data dirs the held
/// etcds served, in order.
fn run_holding_each_etcd(migration: &Migration, allowed: &Allowed) -> Vec<PathBuf> {
    let mut running = migration
        .clone()
        .env("FAILPOINTS", format!("{HOLD_AT}=sleep({HOLD_MS})"))
        .env("ETCD_MIGRATE_FAILPOINT_TRACE", "1")
        .spawn();
    let migrator = running.pid();
    let deadline = Instant::now() + MIGRATE_TIMEOUT;
    let mut started: Option<StartedEtcd> = None;
    let mut served = Vec::new();
    while let Some(line) = running.next_line("the run to end", deadline) {
        if is_ours(&line, "etcd started") {
            started = Some(parse_started(&line));
        } else if is_ours(&line, "failpoint") && field(&line, "name") == Some(HOLD_AT) {
            let etcd = started.take().unwrap_or_else(|| {
                panic!(
                    "{HOLD_AT} passed with no etcd started (etcd-migrate pid {migrator}); stderr:\n{}",
                    running.stderr()
                )
            });
            // Frozen for the checks: the hold ends on its own clock, and a
            // loaded machine may take longer than it to run them.
            let frozen = running.freeze();
            check_sockets(migrator, &etcd, allowed);
            if migration.data_dir.join(WORK_DIR).exists() {
                assert_scratch_private(&migration.data_dir);
            }
            drop(frozen);
            served.push(etcd.data_dir);
        }
    }
    running
        .wait(deadline.saturating_duration_since(Instant::now()))
        .assert_code(0);
    served
}

/// After the run: the data dir is 0700, and every path in it that the run
/// created (new, replaced, or with its mode changed) is private. Returns
/// how many such paths there were.
fn assert_data_dir_private(data: &Path, before: &BTreeMap<PathBuf, Node>) -> usize {
    assert_eq!(mode(data), 0o700, "{}", data.display());
    let mut created = 0;
    assert_all(data, "the data dir after the run", |relative, node| {
        if before.get(relative) == Some(node) {
            return true;
        }
        created += 1;
        node.mode & GROUP_OTHER == 0
    });
    assert!(
        !data.join(WORK_DIR).exists(),
        "the scratch dir {} is left",
        data.join(WORK_DIR).display()
    );
    created
}

/// The backup root and each backup in it are 0700, and everything in a
/// backup is private, except a copy that keeps the exact mode its original
/// had in the data dir before the run (the user's choice, kept so the
/// logged restore command gives back the same tree). Returns how many
/// backups there are.
fn assert_backups_private(root: &Path, before: &BTreeMap<PathBuf, Node>) -> usize {
    assert_eq!(mode(root), 0o700, "backup root {}", root.display());
    let backups = crate::harness::dir_names(root);
    for name in &backups {
        let backup = root.join(name);
        assert_eq!(mode(&backup), 0o700, "backup {}", backup.display());
        assert_all(&backup, "a backup", |relative, node| {
            node.mode & GROUP_OTHER == 0
                || before
                    .get(relative)
                    .is_some_and(|original| original.mode == node.mode)
        });
    }
    backups.len()
}

#[test]
fn proc_net_addresses_are_read_in_host_byte_order() {
    if cfg!(target_endian = "little") {
        assert_eq!(
            parse_proc_addr("0100007F:1F90"),
            "127.0.0.1:8080".parse().expect("addr")
        );
        assert_eq!(
            parse_proc_addr("00000000000000000000000001000000:0050"),
            "[::1]:80".parse().expect("addr")
        );
    }
    assert_eq!(
        parse_proc_addr("00000000:0016"),
        "0.0.0.0:22".parse().expect("addr")
    );
}

#[test]
fn a_minor_upgrade_etcd_listens_only_on_loopback_and_the_peer_url() {
    let tmp = temp_dir("sec-upgrade");
    let data = tmp.path().join("data");
    let member = Member::new("sec-upgrade");
    fixture::build(FixtureSpec::small("3.3.25"), &data, &member, tmp.path());
    let before = nodes(&data);

    let migration = Migration::new("3.4.23", &data, &member).bundled("3.3.25,3.4.23");
    let allowed = Allowed::for_default_peer_url(migration.port, &member);
    let served = run_holding_each_etcd(&migration, &allowed);
    assert!(
        !served.is_empty() && served.iter().all(|dir| *dir == data),
        "every etcd of an upgrade serves the data dir itself: {served:?}"
    );
    assert_eq!(read_version_txt(&data), "3.4.23/etcd3");
    let created = assert_data_dir_private(&data, &before);
    assert!(created > 0, "the step wrote nothing into the data dir");
}

#[test]
fn a_minor_rollback_serves_its_restored_copy_on_loopback_and_keeps_backup_and_scratch_private() {
    let tmp = temp_dir("sec-rollback");
    let data = tmp.path().join("data");
    let member = Member::new("sec-rollback");
    fixture::build(FixtureSpec::small("3.5.16"), &data, &member, tmp.path());
    let before = nodes(&data);

    // --backup destructive (the default) backs up before the rollback.
    let migration = Migration::new("3.4.23", &data, &member).bundled("3.4.23,3.5.16");
    let allowed = Allowed::for_default_peer_url(migration.port, &member);
    let served = run_holding_each_etcd(&migration, &allowed);
    assert!(
        served.contains(&data) && served.contains(&data.join(WORK_DIR).join("restored")),
        "3.5.16 serves the data for the snapshot, then 3.4.23 serves the restored copy: {served:?}"
    );
    assert_eq!(read_version_txt(&data), "3.4.23/etcd3");
    assert!(assert_data_dir_private(&data, &before) > 0);
    assert_eq!(
        assert_backups_private(&tmp.path().join("data.backup"), &before),
        1
    );
}

#[test]
fn a_storage_migration_serves_its_converted_copy_on_loopback_and_keeps_backup_and_scratch_private()
{
    let tmp = temp_dir("sec-storage");
    let member = Member::new("sec-storage");
    let fixture = v2::build(
        "3.3.25",
        &tmp.path().join("data"),
        &member,
        tmp.path(),
        &v2::kubernetes_like(20, &[600], 4),
    );
    let data = fixture.data_dir;
    let before = nodes(&data);

    let migration = Migration::new("3.3.25", &data, &member).bundled("3.3.25");
    let allowed = Allowed::for_default_peer_url(migration.port, &member);
    let served = run_holding_each_etcd(&migration, &allowed);
    assert!(
        served.contains(&data) && served.contains(&data.join(WORK_DIR).join("converted")),
        "3.3.25 serves the v2 data to read it, then the converted copy: {served:?}"
    );
    assert_eq!(read_version_txt(&data), "3.3.25/etcd3");
    assert!(assert_data_dir_private(&data, &before) > 0);
    assert_eq!(
        assert_backups_private(&tmp.path().join("data.backup"), &before),
        1
    );
}
