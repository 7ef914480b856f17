//! This module owns every v3 client connection to etcd: one connect, whose
//! every request ends within its bound, the wait for a connection (TCP and
//! TLS handshake) included.
//!
//! Why not etcd-client's own options alone: its connect timeout bounds the
//! TCP connect only, and its request timeout starts once a connection is
//! ready. A port that takes connections and never answers the TLS
//! handshake (an etcd whose process is stopped, a member without quorum
//! behind a proxy, a kernel backlog with no accept) made a request wait
//! with no end (seen: a joiner silent for 180 s, CI 2026-11-29). Here each
//! request, readiness included, runs under one deadline: the connect bound
//! plus the request bound, so a call that the client's own timeouts would
//! have let finish is never cut shorter than they allow.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tower::ServiceExt;

/// A request as tonic sends it.
type Request = tonic::codegen::http::Request<tonic::body::Body>;
/// A response as tonic hands it back.
type Response = tonic::codegen::http::Response<tonic::body::Body>;

/// How long a connection and one request may each take.
#[derive(Debug, Clone, Copy)]
pub struct Bounds {
    /// TCP connect and TLS handshake.
    pub connect: Duration,
    /// The request, from the moment its connection is ready to its answer
    /// (for a stream: to its first message's headers).
    pub request: Duration,
}

impl Bounds {
    /// The same bound for the connection and for the request.
    pub fn each(bound: Duration) -> Self {
        Bounds {
            connect: bound,
            request: bound,
        }
    }

    /// The deadline of one request, its connection's wait included.
    fn whole(self) -> Duration {
        self.connect + self.request
    }
}

/// Connects a v3 client to `endpoints` (with `tls` when they serve over
/// TLS). No request is sent here; each later one ends within
/// `bounds.connect + bounds.request`, with a `DeadlineExceeded` status
/// whose message says so.
pub async fn connect(
    endpoints: &[String],
    tls: Option<etcd_client::TlsOptions>,
    bounds: Bounds,
) -> Result<etcd_client::Client, etcd_client::Error> {
    let mut options = etcd_client::ConnectOptions::new()
        .with_connect_timeout(bounds.connect)
        .with_timeout(bounds.request);
    if let Some(tls) = tls {
        crate::tls::ensure_provider();
        options = options.with_tls(tls);
    }
    etcd_client::Client::connect_with_balanced_channel(endpoints, Some(options), Bounded(bounds))
        .await
}

/// Builds etcd-client's balanced channel (the one it builds itself) inside
/// a [`Deadline`].
struct Bounded(Bounds);

impl etcd_client::BalancedChannelBuilder for Bounded {
    type Error = etcd_client::Error;

    fn balanced_channel(
        self,
        buffer_size: usize,
    ) -> Result<(etcd_client::Channel, Updater), Self::Error> {
        let (channel, updater) = tonic::transport::Channel::balance_channel(buffer_size);
        let deadline = Deadline {
            channel,
            bound: self.0.whole(),
        };
        let boxed = tower::util::BoxCloneSyncService::new(deadline);
        Ok((etcd_client::Channel::Custom(boxed), updater))
    }
}

/// What etcd-client sends a balanced channel its endpoints through.
type Updater = tokio::sync::mpsc::Sender<
    tonic::transport::channel::Change<tonic::codegen::http::Uri, tonic::transport::Endpoint>,
>;

/// tonic's channel with one deadline over each request's readiness and
/// answer. Always ready itself: the wait for a connection happens inside
/// the request's future, where the deadline sees it.
#[derive(Clone)]
struct Deadline {
    channel: tonic::transport::Channel,
    bound: Duration,
}

impl tower::Service<Request> for Deadline {
    type Response = Response;
    type Error = tower::BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Response, tower::BoxError>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request) -> Self::Future {
        let channel = self.channel.clone();
        let bound = self.bound;
        Box::pin(async move {
            match tokio::time::timeout(bound, channel.oneshot(request)).await {
                Ok(answer) => answer.map_err(Into::into),
                // A gRPC status of its own, so that tonic hands it on as it
                // is (a deadline, not an unknown error).
                Err(_) => Err(Box::new(tonic::Status::deadline_exceeded(format!(
                    "no answer within {bound:?} (connection and TLS handshake included)"
                ))) as tower::BoxError),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    fn block_on<T>(work: impl Future<Output = T>) -> T {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime")
            .block_on(work)
    }

    /// A port that takes connections (the kernel's backlog) and never
    /// answers: over TLS the handshake waits, and before this module the
    /// request waited with it, with no end. Its end here is the deadline,
    /// named in the error; the test's own 20 s says it did not wait.
    #[test]
    fn a_request_to_a_tls_port_that_never_answers_ends_at_its_deadline() {
        let silent = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let url = format!("https://{}", silent.local_addr().expect("address"));
        let bounds = Bounds::each(Duration::from_millis(200));
        let (took, answer) = block_on(async {
            let mut client = connect(&[url], Some(etcd_client::TlsOptions::new()), bounds)
                .await
                .expect("a client (no request yet)");
            let started = Instant::now();
            let answer = tokio::time::timeout(Duration::from_secs(20), client.get("k", None))
                .await
                .expect("the request ended by itself, not by the test's 20 s");
            (started.elapsed(), answer)
        });
        let text = match answer {
            Err(err) => crate::log::error_chain(&err),
            Ok(_) => panic!("a silent port answered"),
        };
        assert!(text.contains("no answer within 400ms"), "{text}");
        assert!(
            text.contains("Deadline"),
            "a deadline, not an unknown error: {text}"
        );
        assert!(took >= Duration::from_millis(400), "{took:?}");
        drop(silent);
    }

    /// The same silent port over plain HTTP: the connection is ready at
    /// once and the request's own bound ends it, as before this module.
    #[test]
    fn a_request_to_a_plain_port_that_never_answers_ends_within_its_deadline() {
        let silent = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let url = format!("http://{}", silent.local_addr().expect("address"));
        let bounds = Bounds::each(Duration::from_millis(200));
        let answer = block_on(async {
            let mut client = connect(&[url], None, bounds)
                .await
                .expect("a client (no request yet)");
            tokio::time::timeout(Duration::from_secs(20), client.get("k", None))
                .await
                .expect("the request ended by itself, not by the test's 20 s")
        });
        assert!(answer.is_err(), "a silent port answered");
        drop(silent);
    }

    /// A refused connection is said as before (its cause, not a deadline).
    #[test]
    fn a_refused_connection_says_so() {
        // Port 1: privileged, nothing of ours or of another test listens.
        let url = "http://127.0.0.1:1".to_string();
        let answer = block_on(async {
            let mut client = connect(&[url], None, Bounds::each(Duration::from_secs(2)))
                .await
                .expect("a client (no request yet)");
            client.get("k", None).await
        });
        let text = match answer {
            Err(err) => crate::log::error_chain(&err),
            Ok(_) => panic!("a closed port answered"),
        };
        assert!(text.to_lowercase().contains("connection refused"), "{text}");
    }
}
