//! This module owns reading, from the member's own etcd settings (its
//! arguments, then the `ETCD_*` variables etcd itself reads, in etcd's own
//! order: a flag wins), what the cluster mode needs to talk to its cluster
//! as that member: the peer and client TLS files and the URLs it
//! advertises. Pure: the environment comes in as a lookup function.

use std::path::PathBuf;

use crate::cluster::peer::TlsFiles;
use crate::config::flag_in_args;

/// What the cluster mode uses of the member's etcd settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterSettings {
    /// The peer TLS (`--peer-trusted-ca-file`, `--peer-cert-file`,
    /// `--peer-key-file`), when the peer URLs are https.
    pub peer_tls: Option<TlsFiles>,
    /// The client TLS (`--trusted-ca-file`, `--cert-file`, `--key-file`),
    /// when the client URLs are https.
    pub client_tls: Option<TlsFiles>,
    /// `--initial-advertise-peer-urls`.
    pub advertise_peer_urls: Vec<String>,
    /// `--advertise-client-urls`.
    pub advertise_client_urls: Vec<String>,
}

/// Why the settings cannot carry the cluster mode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SettingsError {
    /// https URLs without the TLS files to speak it.
    #[error("the {side} URLs ({urls}) are https but {missing} is not set (in the etcd arguments or as ${env}); etcd-migrate talks to the other members with the member's own {side} TLS files")]
    MissingTls {
        /// `peer` or `client`.
        side: &'static str,
        /// The URLs.
        urls: String,
        /// The missing flag.
        missing: String,
        /// Its environment variable.
        env: String,
    },
    /// Self-signed automatic TLS, which cannot be verified.
    #[error("{flag} is set: the members' certificates are self-signed and nothing can verify them, so etcd-migrate cannot tell a member from an impostor; give the members certificates from a CA ({ca_flag}) to upgrade the cluster with etcd-migrate")]
    AutoTls {
        /// `--peer-auto-tls` or `--auto-tls`.
        flag: &'static str,
        /// The flag that names a CA.
        ca_flag: &'static str,
    },
}

/// The flags of one side's TLS.
struct Side {
    name: &'static str,
    urls_flag: &'static str,
    ca: &'static str,
    cert: &'static str,
    key: &'static str,
    auto: &'static str,
}

const PEER: Side = Side {
    name: "peer",
    urls_flag: "initial-advertise-peer-urls",
    ca: "peer-trusted-ca-file",
    cert: "peer-cert-file",
    key: "peer-key-file",
    auto: "peer-auto-tls",
};

const CLIENT: Side = Side {
    name: "client",
    urls_flag: "advertise-client-urls",
    ca: "trusted-ca-file",
    cert: "cert-file",
    key: "key-file",
    auto: "auto-tls",
};

/// `ETCD_PEER_CERT_FILE` for `peer-cert-file`.
fn env_name(flag: &str) -> String {
    format!("ETCD_{}", flag.to_uppercase().replace('-', "_"))
}

/// A flag's value from the arguments, else from its `ETCD_*` variable.
fn setting(args: &[String], env: &dyn Fn(&str) -> Option<String>, flag: &str) -> Option<String> {
    flag_in_args(args, flag)
        .or_else(|| env(&env_name(flag)))
        .filter(|value| !value.is_empty())
}

fn urls(value: Option<String>) -> Vec<String> {
    value
        .unwrap_or_default()
        .split(',')
        .map(str::trim)
        .filter(|url| !url.is_empty())
        .map(str::to_string)
        .collect()
}

fn tls(
    args: &[String],
    env: &dyn Fn(&str) -> Option<String>,
    side: &Side,
    urls: &[String],
) -> Result<Option<TlsFiles>, SettingsError> {
    if !urls.iter().any(|url| url.starts_with("https://")) {
        return Ok(None);
    }
    let auto = setting(args, env, side.auto);
    if auto.as_deref().is_some_and(|v| v != "false") && setting(args, env, side.ca).is_none() {
        return Err(SettingsError::AutoTls {
            flag: if side.name == "peer" {
                "--peer-auto-tls"
            } else {
                "--auto-tls"
            },
            ca_flag: if side.name == "peer" {
                "--peer-trusted-ca-file"
            } else {
                "--trusted-ca-file"
            },
        });
    }
    let file = |flag: &'static str| {
        setting(args, env, flag)
            .map(PathBuf::from)
            .ok_or_else(|| SettingsError::MissingTls {
                side: side.name,
                urls: urls.join(","),
                missing: format!("--{flag}"),
                env: env_name(flag),
            })
    };
    Ok(Some(TlsFiles {
        trusted_ca: file(side.ca)?,
        cert: file(side.cert)?,
        key: file(side.key)?,
    }))
}

/// The peer TLS files for talking to peers at `urls` (https among them
/// means the files must be set).
pub fn peer_tls(
    args: &[String],
    env: &dyn Fn(&str) -> Option<String>,
    urls: &[String],
) -> Result<Option<TlsFiles>, SettingsError> {
    tls(args, env, &PEER, urls)
}

/// The client TLS files the arguments set, for client `urls` (https ones
/// need them; none when every URL is plain http).
pub fn client_tls(
    args: &[String],
    env: &dyn Fn(&str) -> Option<String>,
    urls: &[String],
) -> Result<Option<TlsFiles>, SettingsError> {
    tls(args, env, &CLIENT, urls)
}

/// The value of etcd setting `flag` (without dashes) as etcd reads it: the
/// last of the arguments, else its `ETCD_*` env var.
pub fn value(args: &[String], env: &dyn Fn(&str) -> Option<String>, flag: &str) -> Option<String> {
    setting(args, env, flag)
}

/// The URLs of setting `flag` (comma-separated), as [`value`] reads it.
pub fn url_list(args: &[String], env: &dyn Fn(&str) -> Option<String>, flag: &str) -> Vec<String> {
    urls(setting(args, env, flag))
}

/// Reads the cluster settings from the etcd arguments and the environment.
pub fn read(
    args: &[String],
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<ClusterSettings, SettingsError> {
    let advertise_peer_urls = urls(setting(args, env, PEER.urls_flag));
    let advertise_client_urls = urls(setting(args, env, CLIENT.urls_flag));
    Ok(ClusterSettings {
        peer_tls: tls(args, env, &PEER, &advertise_peer_urls)?,
        client_tls: tls(args, env, &CLIENT, &advertise_client_urls)?,
        advertise_peer_urls,
        advertise_client_urls,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    fn files(dir: &str, prefix: &str) -> TlsFiles {
        TlsFiles {
            trusted_ca: PathBuf::from(format!("{dir}/ca.crt")),
            cert: PathBuf::from(format!("{dir}/{prefix}.crt")),
            key: PathBuf::from(format!("{dir}/{prefix}.key")),
        }
    }

    /// The etcd arguments kubeadm writes into its static pod.
    const KUBEADM: &[&str] = &[
        "--advertise-client-urls=https://10.0.0.1:2379",
        "--cert-file=/etc/kubernetes/pki/etcd/server.crt",
        "--client-cert-auth=true",
        "--initial-advertise-peer-urls=https://10.0.0.1:2380",
        "--initial-cluster=a=https://10.0.0.1:2380,b=https://10.0.0.2:2380",
        "--key-file=/etc/kubernetes/pki/etcd/server.key",
        "--listen-peer-urls=https://10.0.0.1:2380",
        "--peer-cert-file=/etc/kubernetes/pki/etcd/peer.crt",
        "--peer-client-cert-auth=true",
        "--peer-key-file=/etc/kubernetes/pki/etcd/peer.key",
        "--peer-trusted-ca-file=/etc/kubernetes/pki/etcd/ca.crt",
        "--trusted-ca-file=/etc/kubernetes/pki/etcd/ca.crt",
    ];

    #[test]
    fn kubeadm_arguments_give_both_tls_sets_and_the_urls() {
        let settings = read(&args(KUBEADM), &|_| None).expect("kubeadm settings");
        assert_eq!(
            settings.peer_tls,
            Some(files("/etc/kubernetes/pki/etcd", "peer"))
        );
        assert_eq!(
            settings.client_tls,
            Some(files("/etc/kubernetes/pki/etcd", "server"))
        );
        assert_eq!(settings.advertise_peer_urls, ["https://10.0.0.1:2380"]);
        assert_eq!(settings.advertise_client_urls, ["https://10.0.0.1:2379"]);
    }

    #[test]
    fn env_vars_stand_in_for_flags_and_a_flag_wins() {
        let env = |name: &str| match name {
            "ETCD_INITIAL_ADVERTISE_PEER_URLS" => Some("https://a:2380, https://b:2380".into()),
            "ETCD_PEER_TRUSTED_CA_FILE" => Some("/env/ca.crt".into()),
            "ETCD_PEER_CERT_FILE" => Some("/env/peer.crt".into()),
            "ETCD_PEER_KEY_FILE" => Some("/env/peer.key".into()),
            "ETCD_ADVERTISE_CLIENT_URLS" => Some("http://a:2379".into()),
            _ => None,
        };
        let settings = read(&args(&["--peer-key-file", "/flag/peer.key"]), &env).expect("settings");
        let peer = settings.peer_tls.expect("peer TLS");
        assert_eq!(peer.trusted_ca, PathBuf::from("/env/ca.crt"));
        assert_eq!(peer.key, PathBuf::from("/flag/peer.key"));
        assert_eq!(settings.client_tls, None);
        assert_eq!(
            settings.advertise_peer_urls,
            ["https://a:2380", "https://b:2380"]
        );
    }

    #[test]
    fn https_without_its_files_or_with_auto_tls_is_refused_naming_the_flag() {
        let err = read(
            &args(&[
                "--initial-advertise-peer-urls=https://10.0.0.1:2380",
                "--peer-trusted-ca-file=/ca.crt",
                "--peer-cert-file=/peer.crt",
            ]),
            &|_| None,
        )
        .expect_err("no key");
        let text = err.to_string();
        assert!(
            text.contains("--peer-key-file") && text.contains("$ETCD_PEER_KEY_FILE"),
            "{text}"
        );
        let err = read(
            &args(&[
                "--advertise-client-urls=https://10.0.0.1:2379",
                "--auto-tls",
                "true",
            ]),
            &|_| None,
        )
        .expect_err("auto TLS");
        assert!(matches!(
            err,
            SettingsError::AutoTls {
                flag: "--auto-tls",
                ..
            }
        ));
    }

    #[test]
    fn plain_http_needs_no_files() {
        let settings = read(
            &args(&[
                "--initial-advertise-peer-urls=http://10.0.0.1:2380",
                "--advertise-client-urls=http://10.0.0.1:2379",
            ]),
            &|_| None,
        )
        .expect("plain settings");
        assert_eq!(settings.peer_tls, None);
        assert_eq!(settings.client_tls, None);
    }
}
