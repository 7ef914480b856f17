//! This module owns the process's TLS set-up: rustls with the ring
//! provider, installed once as the process default. reqwest is built
//! without a provider of its own (so that no second crypto library comes
//! in) and takes the process default when any client is built, plain HTTP
//! ones included; so every client is built from [`client_builder`], which
//! installs it first. The builder also trusts no root at all until the
//! caller adds its CA: without that, reqwest asks the platform verifier for
//! the system's roots at build time, and an image with no CA bundle (ours)
//! fails to build even a plain-HTTP client.

use std::sync::Once;

static INSTALL: Once = Once::new();

/// Makes ring the process's rustls provider; later calls do nothing. An
/// already installed provider is kept (the install then reports it and
/// that is not an error).
pub fn ensure_provider() {
    INSTALL.call_once(|| {
        // Err means another provider was installed first: it serves as well.
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

/// A reqwest client builder with the provider installed and no trusted root
/// (plain HTTP needs none; a TLS caller adds its CA with `tls_certs_only`).
pub fn client_builder() -> reqwest::ClientBuilder {
    ensure_provider();
    reqwest::Client::builder().tls_certs_only(Vec::<reqwest::Certificate>::new())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An image has no CA bundle: a plain client must build without one.
    /// (SSL_CERT_FILE/SSL_CERT_DIR pointing nowhere stands in for it.)
    #[test]
    fn a_plain_client_builds_with_no_system_roots() {
        assert!(client_builder().no_proxy().build().is_ok());
    }
}
