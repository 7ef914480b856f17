//! This module owns the recovery of a cluster that lost its quorum (issue
//! 29 item 2): one surviving member, given `--force-new-cluster` (or
//! `FORCE_NEW_CLUSTER=1`) by the operator, is started once with etcd's
//! own `--force-new-cluster`, which makes it a one-member cluster that
//! keeps its data and ids and drops the other members from the
//! membership; the lost members then join it again one by one
//! (`self_join`).
//!
//! Never while the old cluster can still decide: the other members are
//! asked on their peer `/version`, and if enough answer to form a quorum
//! with this member ([`quorum_left`]), the force is refused (two clusters
//! from one would be a split brain). The forcing etcd runs as our child
//! with the member's own arguments and the flag, until its own peer
//! `/members` lists it alone, then it is stopped: the hand-over execs the
//! member's etcd without the flag, as every start does.
//!
//! Never two members at once either (the setting left on two survivors
//! restarted together: each would see the other down and force a cluster
//! of its own). While it looks, a member announces that it forces on its
//! own peer port ([`Announcement`]: a line, not TLS), and looks for at
//! least [`HOLD`]; what it sees of each other member ([`Seen`]) decides
//! ([`judge`], pure and table-tested): a forced cluster already there, or
//! a lower member id announcing, refuses; a higher id announcing, or a
//! peer port that listens but does not answer yet (an etcd starting, a
//! forced one among them), waits. Of two that look at once the lower id
//! forces; one that comes later finds the other's etcd on that port.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::cluster::decide::Member;
use crate::cluster::member::SupervisedEtcd;
use crate::cluster::peer::{PeerClient, PeerError, TlsFiles};
use crate::cluster::roll::MemberEtcd;
use crate::log;
use crate::log::error_chain;
use crate::supervisor::SupervisorError;
use crate::version::Version;

/// How long one member may take to answer.
const ASK_TIMEOUT: Duration = Duration::from_secs(3);

/// The pause between two looks at the forcing etcd's membership.
const LOOK_EVERY: Duration = Duration::from_millis(200);

/// How long a member looks at the others, announcing that it forces,
/// before it may force: longer than a round of looks takes (a lost
/// member's address answers nothing for `ASK_TIMEOUT` plus `RAW_TIMEOUT`),
/// so that another member announcing at the same time is seen, and it
/// sees us.
pub const HOLD: Duration = Duration::from_secs(6);

/// How long a member may wait for what it cannot tell yet (another
/// member's peer port that listens but does not answer, a higher id
/// announcing) before it refuses.
const UNDECIDED_FOR: Duration = Duration::from_secs(60);

/// What connecting to a peer port and reading its first line may take.
const RAW_TIMEOUT: Duration = Duration::from_secs(1);

/// How long after a peer `/members` that lists one member it is asked
/// again ([`look`]): past the replay of an etcd that has just started.
const REPLAY_GRACE: Duration = Duration::from_secs(2);

/// The line a forcing member's peer port answers with while it looks,
/// followed by its member id in hex.
const ANNOUNCED: &str = "etcd-migrate: forcing a new cluster, member ";

/// What a look at another member of the old cluster found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seen {
    /// Its etcd answers its peer `/version`; `alone`: its peer `/members`
    /// lists only itself (a cluster forced already).
    Answers {
        /// A forced cluster of its own.
        alone: bool,
    },
    /// Its entrypoint announces that it forces (its member id).
    Forcing(u64),
    /// Its peer port accepts connections but answers nothing yet (an etcd
    /// starting: loading a large db, or one just forced).
    Listening,
    /// Nothing there: refused, unreachable, or no connection in time.
    Gone,
}

/// What to do after one round of looks.
#[derive(Debug)]
pub enum Verdict {
    /// Nothing stands in the way (the caller still holds for [`HOLD`]).
    Go,
    /// Not yet, and why.
    Wait(String),
    /// Refused (nothing was touched).
    Refuse(ForceError),
}

/// The verdict on one round of looks at the other members of a cluster of
/// `members` (name, id, what was seen), for the member `own_id`.
pub fn judge(members: usize, own_id: u64, seen: &[(String, u64, Seen)]) -> Verdict {
    if let Some((name, id, _)) = seen
        .iter()
        .find(|(_, _, s)| *s == Seen::Answers { alone: true })
    {
        return Verdict::Refuse(ForceError::ForcedAlready {
            name: name.clone(),
            id: *id,
        });
    }
    let alive: Vec<&String> = seen
        .iter()
        .filter(|(_, _, s)| matches!(s, Seen::Answers { .. } | Seen::Listening))
        .map(|(name, _, _)| name)
        .collect();
    if quorum_left(members, alive.len()) {
        return Verdict::Refuse(ForceError::QuorumAnswers {
            answering: alive.len(),
            others: seen.len(),
            names: alive
                .iter()
                .map(|n| n.as_str())
                .collect::<Vec<_>>()
                .join(", "),
            quorum: members / 2 + 1,
            members,
        });
    }
    if let Some((name, id, _)) = seen
        .iter()
        .find(|(_, _, s)| matches!(s, Seen::Forcing(id) if *id < own_id))
    {
        return Verdict::Refuse(ForceError::Concurrent {
            name: name.clone(),
            id: *id,
        });
    }
    let mut waits = Vec::new();
    for (name, id, s) in seen {
        match s {
            Seen::Forcing(_) => waits.push(format!(
                "{name} ({id:x}) announces that it forces too, and yields to this member's lower id"
            )),
            Seen::Listening => waits.push(format!(
                "{name}'s peer port accepts connections but answers nothing yet (an etcd starting?)"
            )),
            Seen::Answers { .. } | Seen::Gone => {}
        }
    }
    if waits.is_empty() {
        Verdict::Go
    } else {
        Verdict::Wait(waits.join("; "))
    }
}

/// Why the force was refused or failed.
#[derive(Debug, thiserror::Error)]
pub enum ForceError {
    /// The old cluster can still form a quorum.
    #[error("--force-new-cluster refused: {answering} of the other {others} members of this cluster answer ({names}), a quorum with this member ({quorum} of {members}): the cluster is not lost; restart this member without FORCE_NEW_CLUSTER and it rejoins (forcing now would split the cluster in two)")]
    QuorumAnswers {
        /// How many others answered.
        answering: usize,
        /// How many others there are.
        others: usize,
        /// Who answered.
        names: String,
        /// The quorum.
        quorum: usize,
        /// The membership's size.
        members: usize,
    },
    /// Nothing to force.
    #[error("--force-new-cluster refused: {why}")]
    Refused {
        /// Why.
        why: String,
    },
    /// The forcing etcd did not end up alone within the deadline, or
    /// exited.
    #[error("the etcd started with --force-new-cluster did not report a one-member cluster within {within:?}: {why}; the data dir's backup is there; look at etcd's output above")]
    NotForced {
        /// The deadline.
        within: Duration,
        /// What was last seen.
        why: String,
    },
    /// Another member forced a cluster of its own already.
    #[error("--force-new-cluster refused: member {name} ({id:x}) forced a new cluster already (its membership lists it alone): a second one would split the data in two; restart this member without FORCE_NEW_CLUSTER on an empty data dir (--initial-cluster-state existing) and it joins that cluster; its data is as it was")]
    ForcedAlready {
        /// The other member.
        name: String,
        /// Its id.
        id: u64,
    },
    /// Another member forces at the same moment, and has the lower id.
    #[error("--force-new-cluster refused: member {name} ({id:x}) is forcing a new cluster at the same moment, and only one member may (the lower id goes on); this one yields, its data as it was: restart it without FORCE_NEW_CLUSTER on an empty data dir once {name} serves, and it joins that cluster")]
    Concurrent {
        /// The other member.
        name: String,
        /// Its id.
        id: u64,
    },
    /// What the others are doing could not be told in time.
    #[error("--force-new-cluster refused: for {within:?} it could not be told whether another member forms a cluster ({why}); nothing was touched; stop what answers on those peer ports, or restart this member without FORCE_NEW_CLUSTER")]
    Undecided {
        /// How long it looked.
        within: Duration,
        /// The last round's reasons.
        why: String,
    },
    /// This member's peer port is taken, so it cannot announce.
    #[error("--force-new-cluster refused: this member's peer address {addr} is in use by another process ({why}), so it cannot announce to the others that it forces; stop that process")]
    PortInUse {
        /// The address.
        addr: String,
        /// The error.
        why: String,
    },
    /// The peer TLS could not be used.
    #[error(transparent)]
    Peer(#[from] PeerError),
    /// Starting or stopping etcd.
    #[error(transparent)]
    Supervisor(#[from] SupervisorError),
}

/// Whether the old cluster of `members` can still decide with us: the
/// others answering, and this member, reach its quorum.
pub fn quorum_left(members: usize, others_answering: usize) -> bool {
    others_answering + 1 > members / 2
}

/// Refuses the force while the old cluster can decide, or while another
/// member forces (see the module doc): announces on `listen_peer` (the
/// member's own `--listen-peer-urls`) and looks at the other members every
/// second for at least [`HOLD`], until [`judge`] says go for the last
/// round, refuses, or `UNDECIDED_FOR` passes.
pub async fn check(
    members: &[Member],
    own_id: u64,
    peer_tls: Option<&TlsFiles>,
    listen_peer: &[String],
) -> Result<(), ForceError> {
    let peer = PeerClient::new(peer_tls, ASK_TIMEOUT)?;
    let others: Vec<&Member> = members.iter().filter(|m| m.id != own_id).collect();
    if others.is_empty() {
        return Err(ForceError::Refused {
            why: "this member's data records a cluster of one: there is no quorum to recover"
                .to_string(),
        });
    }
    let _announced = Announcement::start(listen_peer, own_id)?;
    let started = Instant::now();
    let mut said = None::<String>;
    loop {
        let round = Instant::now();
        // Asked together: a lost member's address may answer nothing until
        // the timeout, and the others must not wait behind it.
        let seen: Vec<(String, u64, Seen)> =
            futures_util::future::join_all(others.iter().map(|member| {
                let peer = &peer;
                async move { (member.name.clone(), member.id, look(peer, member).await) }
            }))
            .await;
        let verdict = judge(members.len(), own_id, &seen);
        let shown = format!("{seen:?}");
        if said.as_deref() != Some(shown.as_str()) {
            log::info(
                "looked at the old cluster before forcing a new one",
                &[
                    ("members", members.len().into()),
                    ("seen", shown.as_str().into()),
                    ("ms", log::ms(started.elapsed())),
                ],
            );
            said = Some(shown);
        }
        match verdict {
            Verdict::Refuse(err) => return Err(err),
            Verdict::Go if started.elapsed() >= HOLD => return Ok(()),
            Verdict::Go => {}
            Verdict::Wait(why) if started.elapsed() >= UNDECIDED_FOR => {
                return Err(ForceError::Undecided {
                    within: UNDECIDED_FOR,
                    why,
                })
            }
            Verdict::Wait(_) => {}
        }
        tokio::time::sleep(Duration::from_secs(1).saturating_sub(round.elapsed())).await;
    }
}

/// What `member` shows on its peer URLs: its etcd's `/version` (and then
/// its `/members`), else the first line its peer port gives.
pub async fn look(peer: &PeerClient, member: &Member) -> Seen {
    let mut seen = Seen::Gone;
    for url in &member.peer_urls {
        if peer.version(url).await.is_ok() {
            let mut alone = matches!(peer.members(url).await, Ok(list) if list.len() == 1);
            if alone {
                // An etcd that has just started answers its `/members`
                // from the middle of its log's replay: one member, for a
                // cluster bootstrapped or grown since its last snapshot.
                // Asked again once a replay is over, only an answer of more
                // members overturns it (a failed one never does: that is
                // the refusing side).
                tokio::time::sleep(REPLAY_GRACE).await;
                alone = match peer.members(url).await {
                    Ok(list) => list.len() == 1,
                    Err(_) => true,
                };
            }
            return Seen::Answers { alone };
        }
        let Some(addr) = socket_addr(url) else {
            continue;
        };
        let raw = tokio::task::spawn_blocking(move || first_line(addr))
            .await
            .unwrap_or(Seen::Gone);
        if raw != Seen::Gone {
            seen = raw;
        }
    }
    seen
}

/// `scheme://host:port` as an address to connect to or bind.
fn socket_addr(url: &str) -> Option<SocketAddr> {
    let parsed = url::Url::parse(url).ok()?;
    let host = parsed
        .host_str()?
        .trim_start_matches('[')
        .trim_end_matches(']');
    let port = parsed.port_or_known_default()?;
    (host, port).to_socket_addrs().ok()?.next()
}

/// The first line the peer port at `addr` gives (our announcement), or
/// that it listens without one, or that nothing is there.
fn first_line(addr: SocketAddr) -> Seen {
    let Ok(mut stream) = TcpStream::connect_timeout(&addr, RAW_TIMEOUT) else {
        return Seen::Gone;
    };
    // A connect to a loopback port nothing listens on can meet itself
    // (TCP's simultaneous open, when the kernel draws that very port as
    // the source): a connection to our own address is no listener.
    if stream.local_addr().ok() == Some(addr) {
        return Seen::Gone;
    }
    let _ = stream.set_read_timeout(Some(RAW_TIMEOUT));
    let mut buf = [0u8; 128];
    let mut got = 0;
    while got < buf.len() {
        match stream.read(&mut buf[got..]) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                got += n;
                if buf[..got].contains(&b'\n') {
                    break;
                }
            }
        }
    }
    let text = String::from_utf8_lossy(&buf[..got]);
    text.strip_prefix(ANNOUNCED)
        .and_then(|rest| u64::from_str_radix(rest.trim(), 16).ok())
        .map_or(Seen::Listening, Seen::Forcing)
}

/// Our announcement that this member forces: its peer addresses answer
/// every connection with `ANNOUNCED` and its id, until dropped (before
/// the forcing etcd takes the port).
pub struct Announcement {
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Announcement {
    /// Binds each of `listen_peer`'s addresses and answers on them.
    pub fn start(listen_peer: &[String], own_id: u64) -> Result<Announcement, ForceError> {
        let stop = Arc::new(AtomicBool::new(false));
        let mut threads = Vec::new();
        for url in listen_peer {
            let Some(addr) = socket_addr(url) else {
                continue;
            };
            let in_use = |e: std::io::Error| ForceError::PortInUse {
                addr: addr.to_string(),
                why: e.to_string(),
            };
            let listener = TcpListener::bind(addr).map_err(in_use)?;
            listener.set_nonblocking(true).map_err(in_use)?;
            let stop = Arc::clone(&stop);
            let line = format!("{ANNOUNCED}{own_id:x}\n");
            threads.push(std::thread::spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    match listener.accept() {
                        Ok((mut stream, _)) => {
                            let _ = stream.set_nonblocking(false);
                            let _ = stream.write_all(line.as_bytes());
                        }
                        Err(_) => std::thread::sleep(Duration::from_millis(20)),
                    }
                }
            }));
        }
        Ok(Announcement { stop, threads })
    }
}

impl Drop for Announcement {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

/// Starts `release` as our child with `--force-new-cluster` appended to
/// the member's own arguments (in `etcd`), waits until its own peer
/// `/members` (at `own_peer_url`) lists it alone, and stops it. Returns
/// the names the membership held before.
pub async fn force(
    mut etcd: SupervisedEtcd,
    release: Version,
    own: (&str, &[String]),
    tls: (Option<&TlsFiles>, Option<&TlsFiles>),
    within: Duration,
) -> Result<(), ForceError> {
    let (own_peer_url, client_urls) = own;
    let (peer_tls, client_tls) = tls;
    let peer = PeerClient::new(peer_tls, ASK_TIMEOUT)?;
    etcd.start(release).await?;
    let started = Instant::now();
    let outcome = loop {
        if let Some(status) = etcd.exited() {
            break Err(ForceError::NotForced {
                within,
                why: format!("it exited with {status}"),
            });
        }
        let seen = match peer.members(own_peer_url).await {
            // Alone in the membership it shows, but the removals it
            // appended may not be committed in its WAL yet (a stop now
            // found all three members again at the next start, measured
            // on 3.5.16): a write through it, answered only once applied
            // and so once the commit is on disk, is the proof.
            Ok(list) if list.len() == 1 => match committed(client_urls, client_tls).await {
                Ok(()) => break Ok(()),
                Err(why) => {
                    format!("alone in its membership, but a write does not commit yet: {why}")
                }
            },
            Ok(list) => format!("its membership lists {} members", list.len()),
            Err(err) => error_chain(&err),
        };
        if started.elapsed() > within {
            break Err(ForceError::NotForced { within, why: seen });
        }
        tokio::time::sleep(LOOK_EVERY).await;
    };
    let status = etcd.stop().await?;
    log::info(
        "the etcd that forced a new cluster stopped",
        &[
            ("status", status.to_string().into()),
            ("ms", log::ms(started.elapsed())),
        ],
    );
    outcome
}

/// The key the proof writes and deletes again.
const PROOF_KEY: &str = "/etcd-migrate/forced";

/// A write through our own client URLs commits (and is deleted again).
async fn committed(client_urls: &[String], client_tls: Option<&TlsFiles>) -> Result<(), String> {
    let mut client = crate::cluster::client::connect_v3(client_urls, client_tls, ASK_TIMEOUT)
        .await
        .map_err(|e| e.to_string())?;
    client
        .put(PROOF_KEY, "forced", None)
        .await
        .map_err(|e| error_chain(&e))?;
    client
        .delete(PROOF_KEY, None)
        .await
        .map_err(|e| error_chain(&e))?;
    Ok(())
}

/// `etcd` (the member's, supervised) with `--force-new-cluster` after its
/// own arguments.
pub fn forcing_etcd(etcd: SupervisedEtcd) -> SupervisedEtcd {
    etcd.with_arg("--force-new-cluster")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What another member showed: its name, its id, what was seen.
    type Other<'a> = (&'a str, u64, Seen);

    fn seen(list: &[Other<'_>]) -> Vec<(String, u64, Seen)> {
        list.iter()
            .map(|(name, id, s)| (name.to_string(), *id, *s))
            .collect()
    }

    #[test]
    fn of_two_members_forcing_at_once_the_lower_id_goes_on() {
        use Seen::*;
        let own = 0x20;
        // (members, what the others show, the verdict's kind)
        let table: &[(usize, &[Other<'_>], &str)] = &[
            // The two others lost: go.
            (3, &[("b", 0x30, Gone), ("c", 0x40, Gone)], "go"),
            // One other serves the old data: a quorum with us.
            (
                3,
                &[("b", 0x30, Answers { alone: false }), ("c", 0x40, Gone)],
                "quorum",
            ),
            // One other's etcd starts (listens, no answer yet): counted.
            (3, &[("b", 0x30, Listening), ("c", 0x40, Gone)], "quorum"),
            // Another forced its own cluster already.
            (
                3,
                &[("b", 0x30, Answers { alone: true }), ("c", 0x40, Gone)],
                "forced",
            ),
            (
                5,
                &[
                    ("b", 0x30, Answers { alone: true }),
                    ("c", 0x40, Gone),
                    ("d", 1, Gone),
                    ("e", 2, Gone),
                ],
                "forced",
            ),
            // Another announces with a lower id: yield.
            (
                3,
                &[("b", 0x10, Forcing(0x10)), ("c", 0x40, Gone)],
                "concurrent",
            ),
            // With a higher id: it yields, wait for it to go.
            (3, &[("b", 0x30, Forcing(0x30)), ("c", 0x40, Gone)], "wait"),
            // 5 members, one old member serving (no quorum with us), one
            // starting: wait until it tells what it is.
            (
                5,
                &[
                    ("b", 0x30, Listening),
                    ("c", 0x40, Gone),
                    ("d", 1, Gone),
                    ("e", 2, Gone),
                ],
                "wait",
            ),
            (
                5,
                &[
                    ("b", 0x30, Answers { alone: false }),
                    ("c", 0x40, Gone),
                    ("d", 1, Gone),
                    ("e", 2, Gone),
                ],
                "go",
            ),
        ];
        for (members, others, want) in table {
            let got = match judge(*members, own, &seen(others)) {
                Verdict::Go => "go",
                Verdict::Wait(_) => "wait",
                Verdict::Refuse(ForceError::QuorumAnswers { .. }) => "quorum",
                Verdict::Refuse(ForceError::ForcedAlready { .. }) => "forced",
                Verdict::Refuse(ForceError::Concurrent { .. }) => "concurrent",
                Verdict::Refuse(other) => panic!("{other}"),
            };
            assert_eq!(got, *want, "{members} members, {others:?}");
        }
    }

    #[test]
    fn an_announcement_is_read_as_forcing_and_a_silent_port_as_listening() {
        let probe = crate::listener::test_listener();
        let addr = probe.local_addr().expect("addr");
        // Silent: accepts (the kernel's backlog), never writes.
        assert_eq!(first_line(addr), Seen::Listening);
        drop(probe);
        assert_eq!(gone_within(addr), Seen::Gone, "closed port");
        let url = format!("http://{addr}");
        let announcement = Announcement::start(std::slice::from_ref(&url), 0xab).expect("binds");
        assert_eq!(first_line(addr), Seen::Forcing(0xab));
        assert!(matches!(
            Announcement::start(std::slice::from_ref(&url), 0xcd),
            Err(ForceError::PortInUse { .. })
        ));
        drop(announcement);
        assert_eq!(gone_within(addr), Seen::Gone, "given back on drop");
    }

    /// What `addr` shows once it is closed: `Gone`, or what it still
    /// showed after 10 s. A closed listener can answer for a moment
    /// longer: another test of this process that forks a child between
    /// the bind and the close leaves the child a copy of the socket until
    /// its exec closes it (seen under load: 4 runs in 40).
    fn gone_within(addr: SocketAddr) -> Seen {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let seen = first_line(addr);
            if seen == Seen::Gone || std::time::Instant::now() > deadline {
                return seen;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    #[test]
    fn the_old_cluster_decides_while_a_quorum_with_us_answers() {
        for (members, answering, left) in [
            (3, 2, true),
            (3, 1, true),
            (3, 0, false),
            (5, 2, true),
            (5, 1, false),
            (5, 0, false),
            (2, 1, true),
            (2, 0, false),
        ] {
            assert_eq!(
                quorum_left(members, answering),
                left,
                "{members} members, {answering} others answering"
            );
        }
    }
}
