//! This module owns the certificates of a test cluster: one CA made in the
//! test, and per member a server and a peer certificate (both server and
//! client auth, SANs the member's name, its IP, localhost and 127.0.0.1, as
//! kubeadm issues them), plus one client certificate for the test's own
//! writer and probes. Everything is written under a dir the test owns.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

/// File names inside a member's certificate dir, as kubeadm names them in
/// /etc/kubernetes/pki/etcd.
pub const CA: &str = "ca.crt";
pub const SERVER_CERT: &str = "server.crt";
pub const SERVER_KEY: &str = "server.key";
pub const PEER_CERT: &str = "peer.crt";
pub const PEER_KEY: &str = "peer.key";

/// Where the test's client certificate lives on the host.
#[derive(Debug, Clone)]
pub struct ClientPki {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// The CA that signs every certificate of one cluster.
pub struct Authority {
    issuer: Issuer<'static, KeyPair>,
    ca_pem: String,
}

impl Authority {
    /// A fresh CA (ECDSA P-256), like kubeadm's etcd-ca.
    pub fn new(run: &str) -> Authority {
        let key = KeyPair::generate().expect("generate the CA key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, format!("etcd-ca-{run}"));
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let cert = params.self_signed(&key).expect("self-sign the CA");
        Authority {
            ca_pem: cert.pem(),
            issuer: Issuer::new(params, key),
        }
    }

    fn issue(
        &self,
        cn: &str,
        sans: &[String],
        ekus: Vec<ExtendedKeyUsagePurpose>,
    ) -> (String, String) {
        let key = KeyPair::generate().expect("generate a leaf key");
        let mut params = CertificateParams::new(sans.to_vec()).expect("leaf params");
        params.distinguished_name.push(DnType::CommonName, cn);
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = ekus;
        let cert = params
            .signed_by(&key, &self.issuer)
            .expect("sign a leaf certificate");
        (cert.pem(), key.serialize_pem())
    }

    /// Writes `dir/{ca.crt,server.*,peer.*}` for one member.
    pub fn write_member(&self, dir: &Path, name: &str, ip: &str) {
        fs::create_dir_all(dir).expect("create the member's pki dir");
        let sans = vec![
            name.to_string(),
            "localhost".to_string(),
            ip.to_string(),
            "127.0.0.1".to_string(),
        ];
        let both = || {
            vec![
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ]
        };
        write(dir, CA, &self.ca_pem, 0o644);
        let (cert, key) = self.issue(name, &sans, both());
        write(dir, SERVER_CERT, &cert, 0o644);
        write(dir, SERVER_KEY, &key, 0o600);
        let (cert, key) = self.issue(name, &sans, both());
        write(dir, PEER_CERT, &cert, 0o644);
        write(dir, PEER_KEY, &key, 0o600);
    }

    /// Writes the test's own client certificate (client auth only, like
    /// kubeadm's apiserver-etcd-client).
    pub fn write_client(&self, dir: &Path) -> ClientPki {
        fs::create_dir_all(dir).expect("create the client's pki dir");
        let (cert, key) = self.issue(
            "cluster-test-client",
            &[],
            vec![ExtendedKeyUsagePurpose::ClientAuth],
        );
        write(dir, CA, &self.ca_pem, 0o644);
        write(dir, "client.crt", &cert, 0o644);
        write(dir, "client.key", &key, 0o600);
        ClientPki {
            ca: dir.join(CA),
            cert: dir.join("client.crt"),
            key: dir.join("client.key"),
        }
    }
}

fn write(dir: &Path, name: &str, pem: &str, mode: u32) {
    let path = dir.join(name);
    fs::write(&path, pem).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
    fs::set_permissions(&path, fs::Permissions::from_mode(mode))
        .unwrap_or_else(|e| panic!("chmod {}: {e}", path.display()));
}
