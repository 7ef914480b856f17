//! This module owns asking a member's peer endpoints, over the peer TLS
//! the member itself uses (`--peer-trusted-ca-file`, `--peer-cert-file`,
//! `--peer-key-file`), what it runs and what membership it knows: the
//! `/version` and `/members` answers `observe` parses. Every request has
//! its own deadline; an unreachable member is an error naming its URL, and
//! the caller counts how long it has been one.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::cluster::decide::Member;
use crate::cluster::observe::{self, ObserveError, VersionInfo};

/// A set of TLS files as etcd's flags name them: the peer set
/// (`--peer-trusted-ca-file`, `--peer-cert-file`, `--peer-key-file`) or
/// the client set (`--trusted-ca-file`, `--cert-file`, `--key-file`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// The CA the other side's certificate chains to.
    pub trusted_ca: PathBuf,
    /// Our certificate, presented when the other side asks for one
    /// (`--peer-client-cert-auth`, `--client-cert-auth`).
    pub cert: PathBuf,
    /// Its key.
    pub key: PathBuf,
}

/// Why a peer endpoint could not be asked, or its answer used.
#[derive(Debug, thiserror::Error)]
pub enum PeerError {
    /// A TLS file could not be read.
    #[error("cannot read the peer TLS {what} {path}: {source}")]
    ReadTls {
        /// Which file (`trusted CA`, `certificate`, `key`).
        what: &'static str,
        /// Its path.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The TLS files do not make a client.
    #[error("the peer TLS files (CA {ca}, certificate {cert}, key {key}) do not make a TLS client: {reason}")]
    BadTls {
        /// `--peer-trusted-ca-file`.
        ca: PathBuf,
        /// `--peer-cert-file`.
        cert: PathBuf,
        /// `--peer-key-file`.
        key: PathBuf,
        /// What was wrong.
        reason: String,
    },
    /// The HTTP client could not be built.
    #[error("cannot build the peer HTTP client: {0}")]
    Client(String),
    /// No answer within the deadline, or the connection failed.
    #[error("{endpoint} did not answer within {timeout:?}: {reason}")]
    Unreachable {
        /// The URL asked.
        endpoint: String,
        /// The deadline.
        timeout: Duration,
        /// What failed (connect, TLS, timeout).
        reason: String,
        /// The TLS handshake failed: the member listens, but one side does
        /// not accept the other's certificate (`tls_failure`).
        tls_refused: bool,
    },
    /// An answer that is not a success.
    #[error("{endpoint} answered HTTP {status}: {body}")]
    Status {
        /// The URL asked.
        endpoint: String,
        /// The status code.
        status: u16,
        /// The start of the body.
        body: String,
    },
    /// A success whose body is not what etcd serves there.
    #[error(transparent)]
    Answer(#[from] ObserveError),
}

/// Asks peer endpoints, each request bounded by `timeout`.
pub struct PeerClient {
    http: reqwest::Client,
    timeout: Duration,
}

/// Reads one of the TLS files, naming it on failure.
pub(crate) fn read(what: &'static str, path: &Path) -> Result<Vec<u8>, PeerError> {
    std::fs::read(path).map_err(|source| PeerError::ReadTls {
        what,
        path: path.to_path_buf(),
        source,
    })
}

/// An HTTP client for a member's endpoints (peer or client): plain when
/// `tls` is none, else trusting only `tls`'s CA and presenting its
/// certificate; every request bounded by `timeout`.
pub(crate) fn http_client(
    tls: Option<&TlsFiles>,
    timeout: Duration,
) -> Result<reqwest::Client, PeerError> {
    let mut builder = crate::tls::client_builder()
        // Members are addressed directly; a proxy in the environment must
        // not carry cluster traffic.
        .no_proxy()
        .connect_timeout(timeout)
        .timeout(timeout);
    if let Some(tls) = tls {
        let bad = |reason: String| PeerError::BadTls {
            ca: tls.trusted_ca.clone(),
            cert: tls.cert.clone(),
            key: tls.key.clone(),
            reason,
        };
        let ca = reqwest::Certificate::from_pem_bundle(&read("trusted CA", &tls.trusted_ca)?)
            .map_err(|e| bad(format!("the CA: {e}")))?;
        let mut pem = read("certificate", &tls.cert)?;
        pem.push(b'\n');
        pem.extend(read("key", &tls.key)?);
        let identity = reqwest::Identity::from_pem(&pem)
            .map_err(|e| bad(format!("the certificate and key: {e}")))?;
        builder = builder.tls_certs_only(ca).identity(identity);
    }
    builder
        .build()
        .map_err(|e| PeerError::Client(crate::log::error_chain(&e)))
}

impl PeerClient {
    /// A client for plain-HTTP peers (`tls` none) or for peers with TLS,
    /// trusting only the peers' CA and presenting the member's own peer
    /// certificate.
    pub fn new(tls: Option<&TlsFiles>, timeout: Duration) -> Result<Self, PeerError> {
        Ok(PeerClient {
            http: http_client(tls, timeout)?,
            timeout,
        })
    }

    /// The member at `peer_url`'s `/version`.
    pub async fn version(&self, peer_url: &str) -> Result<VersionInfo, PeerError> {
        let endpoint = format!("{}/version", peer_url.trim_end_matches('/'));
        let body = self.get(&endpoint).await?;
        Ok(observe::parse_version(&endpoint, &body)?)
    }

    /// The membership the member at `peer_url` knows.
    pub async fn members(&self, peer_url: &str) -> Result<Vec<Member>, PeerError> {
        let endpoint = format!("{}/members", peer_url.trim_end_matches('/'));
        let body = self.get(&endpoint).await?;
        Ok(observe::parse_members(&endpoint, &body)?)
    }

    async fn get(&self, endpoint: &str) -> Result<String, PeerError> {
        let unreachable = |e: reqwest::Error| PeerError::Unreachable {
            endpoint: endpoint.to_string(),
            timeout: self.timeout,
            reason: crate::log::error_chain(&e),
            tls_refused: tls_failure(&e),
        };
        let response = self.http.get(endpoint).send().await.map_err(unreachable)?;
        let status = response.status();
        let body = response.text().await.map_err(unreachable)?;
        if !status.is_success() {
            return Err(PeerError::Status {
                endpoint: endpoint.to_string(),
                status: status.as_u16(),
                body: body.chars().take(200).collect(),
            });
        }
        Ok(body)
    }
}

impl PeerError {
    /// Why the member's TLS handshake failed, when that is why it did not
    /// answer.
    pub fn tls_refusal(&self) -> Option<&str> {
        match self {
            PeerError::Unreachable {
                reason,
                tls_refused: true,
                ..
            } => Some(reason),
            _ => None,
        }
    }
}

/// True when `err` (or one of its causes) is a TLS error: the connection
/// was made and the handshake failed (a certificate one side does not
/// trust, an alert from the other side), as opposed to nobody listening
/// or a timeout. An `io::Error` hides the error it wraps from `source()`
/// (it returns that error's own source), so its inner error is looked at
/// too.
pub(crate) fn tls_failure(err: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(err);
    while let Some(err) = next {
        if err.downcast_ref::<rustls::Error>().is_some() {
            return true;
        }
        if let Some(inner) = err
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
        {
            if tls_failure(inner) {
                return true;
            }
        }
        next = err.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_tls_file_is_named() {
        let tls = TlsFiles {
            trusted_ca: PathBuf::from("/nonexistent/ca.crt"),
            cert: PathBuf::from("/nonexistent/peer.crt"),
            key: PathBuf::from("/nonexistent/peer.key"),
        };
        let err = PeerClient::new(Some(&tls), Duration::from_secs(1))
            .err()
            .expect("no client from missing files");
        let text = err.to_string();
        assert!(text.contains("trusted CA /nonexistent/ca.crt"), "{text}");
    }

    #[test]
    fn files_that_are_not_pem_are_refused_naming_all_three() {
        let dir = tempfile::tempdir().expect("temp dir");
        let file = |name: &str| {
            let path = dir.path().join(name);
            std::fs::write(&path, "not a pem file\n").expect("write");
            path
        };
        let tls = TlsFiles {
            trusted_ca: file("ca.crt"),
            cert: file("peer.crt"),
            key: file("peer.key"),
        };
        let err = PeerClient::new(Some(&tls), Duration::from_secs(1))
            .err()
            .expect("no client from garbage");
        let text = err.to_string();
        assert!(
            text.contains("ca.crt") && text.contains("peer.crt") && text.contains("peer.key"),
            "{text}"
        );
    }

    #[test]
    fn a_tls_error_is_found_behind_the_io_error_that_carries_it() {
        let alert = rustls::Error::AlertReceived(rustls::AlertDescription::BadCertificate);
        let io = std::io::Error::new(std::io::ErrorKind::InvalidData, alert);
        assert!(tls_failure(&io));
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        assert!(!tls_failure(&refused));
        let plain = std::io::Error::other("connection reset");
        assert!(!tls_failure(&plain));
    }

    #[test]
    fn a_plain_client_builds_with_the_provider_installed() {
        assert!(PeerClient::new(None, Duration::from_secs(1)).is_ok());
    }
}
