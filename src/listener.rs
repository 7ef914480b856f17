//! This module owns finding the socket that listens on a loopback TCP
//! port, by its inode: asked of the kernel's sock_diag netlink interface,
//! which walks the listening sockets alone, with /proc/net/tcp as the
//! fallback where netlink is refused.
//!
//! Why not /proc/net/tcp first: reading it walks every bucket of the
//! kernel's connection hash table, however few sockets there are. On a
//! 24 GiB machine that is 2 ms for 16 sockets, paid once per step while
//! the step's etcd waits to be stopped; the netlink dump of the listeners
//! takes a few microseconds.

use std::net::Ipv4Addr;
use std::os::fd::AsRawFd;

use nix::sys::socket::{
    recv, sendto, socket, AddressFamily, MsgFlags, NetlinkAddr, SockFlag, SockProtocol, SockType,
};

/// `SOCK_DIAG_BY_FAMILY` (linux/sock_diag.h).
const SOCK_DIAG_BY_FAMILY: u16 = 20;
/// `NLM_F_REQUEST | NLM_F_DUMP` (linux/netlink.h).
const DUMP_REQUEST: u16 = 0x1 | 0x300;
/// `NLMSG_ERROR` and `NLMSG_DONE` (linux/netlink.h).
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
/// `TCP_LISTEN` (the kernel's TCP state numbers).
const TCP_LISTEN: u8 = 10;
/// The netlink header, and `inet_diag_msg` up to and with its inode.
const HEADER_LEN: usize = 16;
const DIAG_MSG_LEN: usize = 72;

/// The inode of the TCP socket in state LISTEN on 127.0.0.1:`port` (in
/// the network namespace we and our children share): from sock_diag, or
/// from /proc/net/tcp where netlink is refused.
pub fn listening_inode(port: u16) -> Result<Option<u64>, String> {
    match listening_inode_by_netlink(port) {
        Ok(found) => Ok(found),
        Err(netlink) => listening_inode_by_proc(port)
            .map_err(|proc| format!("{proc} (and sock_diag: {netlink})")),
    }
}

/// [`listening_inode`] from /proc/net/tcp.
fn listening_inode_by_proc(port: u16) -> Result<Option<u64>, String> {
    let table = std::fs::read_to_string("/proc/net/tcp")
        .map_err(|err| format!("cannot read /proc/net/tcp: {err}"))?;
    Ok(find_listener(&table, Ipv4Addr::LOCALHOST, port))
}

/// [`listening_inode`] from a sock_diag dump of the IPv4 TCP listeners.
fn listening_inode_by_netlink(port: u16) -> Result<Option<u64>, String> {
    let fd = socket(
        AddressFamily::Netlink,
        SockType::Datagram,
        SockFlag::SOCK_CLOEXEC,
        SockProtocol::NetlinkSockDiag,
    )
    .map_err(|err| format!("netlink socket: {err}"))?;
    let kernel = NetlinkAddr::new(0, 0);
    sendto(
        fd.as_raw_fd(),
        &listeners_request(),
        &kernel,
        MsgFlags::empty(),
    )
    .map_err(|err| format!("netlink send: {err}"))?;
    // A dump comes in datagrams of whole messages until NLMSG_DONE; 32 KiB
    // holds hundreds of listeners.
    let mut buffer = vec![0u8; 32 * 1024];
    let mut found = None;
    loop {
        let len = recv(fd.as_raw_fd(), &mut buffer, MsgFlags::empty())
            .map_err(|err| format!("netlink receive: {err}"))?;
        match parse_dump(&buffer[..len], port, &mut found)? {
            Dump::More => continue,
            Dump::Done => return Ok(found),
        }
    }
}

/// The request: a dump of the IPv4 TCP sockets in state LISTEN
/// (`nlmsghdr` + `inet_diag_req_v2`, native-endian but for the socket
/// id's network-order fields, left zero: a dump matches on the states).
fn listeners_request() -> Vec<u8> {
    const REQUEST_LEN: usize = HEADER_LEN + 56;
    let mut message = Vec::with_capacity(REQUEST_LEN);
    message.extend_from_slice(&(REQUEST_LEN as u32).to_ne_bytes());
    message.extend_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
    message.extend_from_slice(&DUMP_REQUEST.to_ne_bytes());
    message.extend_from_slice(&1u32.to_ne_bytes()); // sequence number
    message.extend_from_slice(&0u32.to_ne_bytes()); // port id: the kernel's
    message.push(nix::libc::AF_INET as u8); // sdiag_family
    message.push(nix::libc::IPPROTO_TCP as u8); // sdiag_protocol
    message.push(0); // idiag_ext: no extensions
    message.push(0); // pad
    message.extend_from_slice(&(1u32 << TCP_LISTEN).to_ne_bytes()); // idiag_states
    message.resize(REQUEST_LEN, 0); // inet_diag_sockid: all zero
    message
}

/// Whether a dump goes on after this datagram.
#[derive(Debug, PartialEq, Eq)]
enum Dump {
    More,
    Done,
}

/// Reads one datagram of a dump: each `inet_diag_msg` listening on
/// 127.0.0.1:`port` sets `found` to its inode.
fn parse_dump(mut data: &[u8], port: u16, found: &mut Option<u64>) -> Result<Dump, String> {
    let u16_at = |b: &[u8], at: usize| u16::from_ne_bytes([b[at], b[at + 1]]);
    let u32_at = |b: &[u8], at: usize| u32::from_ne_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
    while data.len() >= HEADER_LEN {
        let len = u32_at(data, 0) as usize;
        if len < HEADER_LEN || len > data.len() {
            return Err(format!(
                "netlink message of {len} bytes in a {}-byte datagram",
                data.len()
            ));
        }
        let (message, body) = (&data[..len], &data[HEADER_LEN..len]);
        match u16_at(message, 4) {
            NLMSG_DONE => return Ok(Dump::Done),
            NLMSG_ERROR => {
                let errno = body
                    .get(..4)
                    .map(|b| i32::from_ne_bytes([b[0], b[1], b[2], b[3]]));
                return Err(format!(
                    "the kernel answered error {}",
                    errno.map_or("(truncated)".to_string(), |e| nix::errno::Errno::from_raw(
                        -e
                    )
                    .to_string())
                ));
            }
            SOCK_DIAG_BY_FAMILY if body.len() >= DIAG_MSG_LEN => {
                let state = body[1];
                // idiag_sport and idiag_src[0] are in network order.
                let sport = u16::from_be_bytes([body[4], body[5]]);
                let src = Ipv4Addr::new(body[8], body[9], body[10], body[11]);
                if state == TCP_LISTEN && sport == port && src == Ipv4Addr::LOCALHOST {
                    *found = Some(u64::from(u32_at(body, 68)));
                }
            }
            other => return Err(format!("unexpected netlink message type {other}")),
        }
        // Messages are 4-byte aligned.
        let next = (len + 3) & !3;
        data = data.get(next..).unwrap_or(&[]);
    }
    Ok(Dump::More)
}

/// The inode of the socket in state LISTEN on `ip:port` in a
/// /proc/net/tcp table. The kernel prints the address as the native-endian
/// u32 of the network-order bytes, and the port in hex.
fn find_listener(table: &str, ip: Ipv4Addr, port: u16) -> Option<u64> {
    const LISTEN: &str = "0A";
    table.lines().skip(1).find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let (local, state, inode) = (fields.get(1)?, fields.get(3)?, fields.get(9)?);
        let (addr, local_port) = local.split_once(':')?;
        let addr = u32::from_str_radix(addr, 16).ok()?;
        let local_port = u16::from_str_radix(local_port, 16).ok()?;
        (*state == LISTEN && local_port == port && Ipv4Addr::from(addr.to_ne_bytes()) == ip)
            .then(|| inode.parse().ok())
            .flatten()
    })
}

/// For tests: a loopback listener on a port outside the kernel's
/// ephemeral range, which no connect in this process draws as its source
/// port (a connect to it once closed cannot meet itself) and no other
/// test's `bind(…:0)` is handed once it is closed. Every call in the
/// process gets a port no earlier call got (tests run at once, and one
/// checks that a port it closed answers no more), each test process from
/// its own offset.
#[cfg(test)]
pub(crate) fn test_listener() -> std::net::TcpListener {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let range =
        std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").unwrap_or_default();
    let mut bounds = range
        .split_whitespace()
        .filter_map(|p| p.parse::<u32>().ok());
    let (low, high) = (
        bounds.next().unwrap_or(32768),
        bounds.next().unwrap_or(60999),
    );
    // Below the range, away from the well-known ports; above it where
    // nothing below is free.
    let ports: Vec<u32> = (20000..low.min(30000))
        .chain(high + 1..=u32::from(u16::MAX))
        .collect();
    let offset = (std::process::id() as usize * 97) % ports.len();
    loop {
        let n = NEXT.fetch_add(1, Ordering::SeqCst) as usize;
        assert!(
            n < ports.len(),
            "no free loopback port outside the ephemeral range"
        );
        let port = ports[(offset + n) % ports.len()] as u16;
        if let Ok(listener) = std::net::TcpListener::bind(("127.0.0.1", port)) {
            return listener;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_listener_is_found_by_address_port_and_state() {
        let table = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:4765 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 111 1 0000000000000000 100 0 0 10 0
   1: 0100007F:4766 0100007F:C350 01 00000000:00000000 00:00000000 00000000     0        0 222 1 0000000000000000 100 0 0 10 0
   2: 00000000:4766 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 333 1 0000000000000000 100 0 0 10 0
   3: 0100007F:4766 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 444 1 0000000000000000 100 0 0 10 0
";
        let lo = Ipv4Addr::LOCALHOST;
        assert_eq!(find_listener(table, lo, 0x4765), Some(111));
        assert_eq!(
            find_listener(table, lo, 0x4766),
            Some(444),
            "not the connection (01) nor the wildcard listener"
        );
        assert_eq!(find_listener(table, lo, 18629), None);
    }

    #[test]
    fn netlink_and_proc_name_the_same_listener_and_only_it() {
        let listener = test_listener();
        let wildcard = std::net::TcpListener::bind("0.0.0.0:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let by_proc = listening_inode_by_proc(port).expect("proc");
        assert!(by_proc.is_some());
        assert_eq!(listening_inode_by_netlink(port).expect("netlink"), by_proc);
        let other = wildcard.local_addr().expect("addr").port();
        assert_eq!(listening_inode_by_netlink(other).expect("netlink"), None);
        drop(listener);
        assert_eq!(listening_inode(port).expect("either"), None);
    }

    #[test]
    fn a_dump_is_read_across_messages_until_done() {
        let message = |kind: u16, body: &[u8]| {
            let mut m = Vec::new();
            m.extend_from_slice(&((HEADER_LEN + body.len()) as u32).to_ne_bytes());
            m.extend_from_slice(&kind.to_ne_bytes());
            m.extend_from_slice(&[0; 10]);
            m.extend_from_slice(body);
            m
        };
        let diag = |state: u8, port: u16, ip: [u8; 4], inode: u32| {
            let mut b = vec![0u8; DIAG_MSG_LEN];
            b[0] = nix::libc::AF_INET as u8;
            b[1] = state;
            b[4..6].copy_from_slice(&port.to_be_bytes());
            b[8..12].copy_from_slice(&ip);
            b[68..72].copy_from_slice(&inode.to_ne_bytes());
            b
        };
        let mut found = None;
        let mut datagram = message(
            SOCK_DIAG_BY_FAMILY,
            &diag(TCP_LISTEN, 2379, [0, 0, 0, 0], 7),
        );
        datagram.extend(message(
            SOCK_DIAG_BY_FAMILY,
            &diag(TCP_LISTEN, 2379, [127, 0, 0, 1], 9),
        ));
        assert_eq!(parse_dump(&datagram, 2379, &mut found), Ok(Dump::More));
        assert_eq!(found, Some(9));
        assert_eq!(
            parse_dump(&message(NLMSG_DONE, &[0; 4]), 2379, &mut found),
            Ok(Dump::Done)
        );
        let refused = message(NLMSG_ERROR, &(-1i32).to_ne_bytes());
        assert!(parse_dump(&refused, 2379, &mut found)
            .expect_err("an error")
            .contains("error"));
        assert!(parse_dump(&message(99, &[]), 2379, &mut found).is_err());
    }
}
