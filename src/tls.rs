//! This module owns the process's TLS set-up: rustls with the ring
//! provider, installed once as the process default. reqwest is built
//! without a provider of its own (so that no second crypto library comes
//! in) and takes the process default when any client is built, plain HTTP
//! ones included; so every client constructor calls [`ensure_provider`]
//! first.

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
