//! This module owns a stand-in for one etcd peer's `/members`: a port
//! that answers every request with a fixed body, for the answer an etcd
//! that has just restarted gives from the middle of its log's replay (an
//! earlier index's membership). A real etcd gives it only for
//! milliseconds, at no moment a test can choose (`e2e/cluster_probe.rs`
//! measures it); the stand-in gives it on purpose, built from a real
//! etcd's own answer.

use crate::harness::ports::free_port;

/// Serves `body` as every answer to an HTTP request on a port of its own,
/// as an etcd peer's `/members` would; returns its URL.
pub fn serve(body: String) -> String {
    use std::io::{Read, Write};
    let listener =
        std::net::TcpListener::bind(("127.0.0.1", free_port())).expect("bind the peer stand-in");
    let url = format!("http://{}", listener.local_addr().expect("its address"));
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut request = Vec::new();
            let mut buf = [0u8; 1024];
            while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                match stream.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => request.extend_from_slice(&buf[..n]),
                }
            }
            let _ = write!(
                stream,
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    url
}

/// etcd's own peer `/members` answer at `peer_url`, as JSON.
pub async fn peer_members(peer_url: &str) -> serde_json::Value {
    let url = format!("{}/members", peer_url.trim_end_matches('/'));
    let answer = super::v2::http_client()
        .get(&url)
        .send()
        .await
        .unwrap_or_else(|e| panic!("GET {url}: {e}"));
    let body = answer
        .text()
        .await
        .unwrap_or_else(|e| panic!("GET {url}: {e}"));
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("GET {url}: {e}: {body}"))
}
