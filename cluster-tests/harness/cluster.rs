//! This module owns a test cluster: N members, each a container of the
//! image under test on the run's private network with its own static
//! address, its own data volume and certificates, started kubeadm style
//! (etcd's flags after `--`) or GCE style (`INITIAL_CLUSTER` & co. and
//! `migrate-if-needed.sh`); the member operations the scenarios need
//! (stop, kill, start, cut off, reconnect, restart with another target,
//! an operator's rollout of new manifests); and the checks at the end
//! (every acknowledged write on every member, membership and ids
//! unchanged, keyspace hashes equal).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use etcd_client::GetOptions;

use super::docker::{docker_output, Container, Network, Volume, LABEL_KEY, POLL};
use super::monitor::{self, minor, Monitor, Round};
use super::pki::{self, Authority, ClientPki};
use super::writer::{self, connect, runtime, Writer, WriterLog};
use super::Api;

/// What a member may take to serve after its container starts.
pub const START_DEADLINE: Duration = Duration::from_secs(90);
/// What the entrypoint may take to refuse (it starts no etcd).
pub const REFUSE_DEADLINE: Duration = Duration::from_secs(60);
/// What a graceful stop may take before docker SIGKILLs (seconds).
pub const STOP_GRACE_S: u32 = 20;

/// How the members are configured, as the two production manifests do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Style {
    /// examples/kubeadm-etcd.yaml: etcd-migrate is the entrypoint, etcd's
    /// flags (with `--initial-cluster`) follow `--`.
    Kubeadm,
    /// examples/gce-etcd.manifest: `migrate-if-needed.sh || exit; exec
    /// etcd-${TARGET_VERSION} ...` with INITIAL_CLUSTER, ETCD_NAME,
    /// LISTEN_PEER_URLS, INITIAL_ADVERTISE_PEER_URLS and ETCD_CREDS.
    Gce,
    /// The same settings, but `exec etcd-migrate -- <etcd flags>` (as
    /// examples/ha/gce-etcd-*.manifest do), so that the entrypoint can roll
    /// a multi-member cluster (it supervises the member's etcd).
    GceHa,
    /// examples/ha/kubeadm-etcd-{a,b,c}.yaml as written, but for the
    /// addresses (the test network's instead of 198.51.100.x) and the
    /// target (the one the scenario asks for), run as the kubelet would
    /// (image-tests/pod2docker.py).
    KubeadmExample,
    /// examples/ha/gce-etcd-{a,b,c}.manifest, likewise.
    GceExample,
}

/// The documentation addresses the example sets use, in member order.
const EXAMPLE_IPS: [&str; 3] = ["198.51.100.11", "198.51.100.12", "198.51.100.13"];
/// The target the example sets are written with.
const EXAMPLE_TARGET: &str = "3.5.16";

/// Where a member of an example set comes from and puts its files.
struct Example {
    /// The manifest, relative to the repo.
    file: String,
    /// The certificates' dir in the member's root.
    pki_at: &'static str,
    /// `(file in the test's pki dir, name the manifest uses)`.
    certs: Vec<(&'static str, &'static str)>,
    /// The data dir in the member's root.
    data: &'static str,
}

impl Style {
    /// The example of member `name`, for the example styles.
    fn example(self, name: &str) -> Option<Example> {
        match self {
            Style::KubeadmExample => Some(Example {
                file: format!("examples/ha/kubeadm-{name}.yaml"),
                pki_at: "etc/kubernetes/pki/etcd",
                certs: vec![
                    (pki::CA, "ca.crt"),
                    (pki::SERVER_CERT, "server.crt"),
                    (pki::SERVER_KEY, "server.key"),
                    (pki::PEER_CERT, "peer.crt"),
                    (pki::PEER_KEY, "peer.key"),
                ],
                data: "var/lib/etcd",
            }),
            Style::GceExample => Some(Example {
                file: format!("examples/ha/gce-{name}.manifest"),
                pki_at: "etc/srv/kubernetes",
                certs: vec![
                    (pki::CA, "etcd-ca.crt"),
                    (pki::PEER_CERT, "etcd-peer.crt"),
                    (pki::PEER_KEY, "etcd-peer.key"),
                    (pki::CA, "pki/etcd-apiserver-ca.crt"),
                    (pki::SERVER_CERT, "pki/etcd-apiserver-server.crt"),
                    (pki::SERVER_KEY, "pki/etcd-apiserver-server.key"),
                ],
                data: "mnt/master-pd/var/etcd/data",
            }),
            _ => None,
        }
    }
}

/// One member: its name, address and container (None while removed).
pub struct Member {
    pub name: String,
    pub ip: String,
    pub container: Option<Container>,
    volume: Volume,
    pki_dir: std::path::PathBuf,
    /// Added to a running cluster (`--initial-cluster-state existing`).
    joined: bool,
}

/// Membership as a member reports it: the cluster id, and per member id
/// its name, peer URLs and client URLs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Membership {
    pub cluster_id: u64,
    pub members: BTreeMap<u64, (String, Vec<String>, Vec<String>)>,
}

/// What the cluster looked like once it had settled.
#[derive(Debug, Clone)]
pub struct Baseline {
    pub membership: Membership,
    /// Each member's own id, in member order.
    pub member_ids: Vec<u64>,
}

/// A running test cluster. Dropping it removes every container, volume and
/// the network (the field order is the removal order).
pub struct Cluster {
    pub members: Vec<Member>,
    pub network: Network,
    pub image: String,
    pub style: Style,
    pub client: ClientPki,
    pub run: String,
    /// How the test reads and writes it (from its first release).
    pub api: Api,
    /// The storage its data keeps (from its first release).
    pub storage: &'static str,
    /// The release it began at: the flags every member gets are the ones
    /// that release (and every later one) accepts.
    first: (u32, u32),
    label: String,
    token: String,
    authority: Authority,
    pki_root: tempfile::TempDir,
    /// More `docker run` options for every member started from now on
    /// (`-e`, `-v`), e.g. a restore's settings and its snapshot file.
    pub extra_options: Vec<String>,
    /// Whether the test SIGKILLed a member ([`Cluster::kill`]): only
    /// then may a member exit mid-job and be started again
    /// ([`Cluster::wait_job_done`]).
    pub killed: std::cell::Cell<bool>,
    /// How often each member was started again after it exited
    /// ([`Cluster::restart_exited`]), over the whole test.
    pub restarts: std::cell::RefCell<Vec<u32>>,
}

/// A v2 key as read back: its key, value and modified index.
type V2Leaf = (String, String, u64);

/// What an operator's manifest of one member says: its TARGET_VERSION,
/// TARGET_STORAGE, and env of its own beyond the cluster's
/// ([`Cluster::extra_options`]), e.g. `ALLOW_CLUSTER_PAUSE=1` on some
/// members only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub version: String,
    pub storage: &'static str,
    /// `NAME=value` pairs, each passed as `-e NAME=value`.
    pub env: Vec<String>,
}

impl Target {
    /// TARGET_VERSION `version` and TARGET_STORAGE `storage`, no more env.
    pub fn new(version: &str, storage: &'static str) -> Target {
        Target {
            version: version.to_string(),
            storage,
            env: Vec::new(),
        }
    }

    /// The same, with `name=value` in the member's env too.
    pub fn with_env(mut self, name: &str, value: &str) -> Target {
        self.env.push(format!("{name}={value}"));
        self
    }
}

/// How an operator rolls new manifests out over the members, in member
/// order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rollout {
    /// Each restart begins this long after the previous one began (or at
    /// once, if that one took longer), waiting for nobody to serve: a
    /// rollout on its own schedule.
    Apart(Duration),
    /// The next member once the one before serves again (`/health`
    /// within [`START_DEADLINE`]): a patient operator.
    Serving,
}

static SEQ: AtomicU32 = AtomicU32::new(0);

/// A name part unique to this run: pid, time and a counter.
fn run_id() -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos() ^ (d.as_secs() as u32))
        .unwrap_or(0);
    format!(
        "{:x}{:05x}{}",
        std::process::id(),
        nanos & 0xfffff,
        SEQ.fetch_add(1, Ordering::SeqCst)
    )
}

impl Cluster {
    /// Creates the network, certificates and volumes for `size` members
    /// and starts them all at `version` (a new cluster), then waits until
    /// every member is healthy and reports a cluster version of that minor.
    pub fn start(image: &str, test: &str, style: Style, size: usize, version: &str) -> Cluster {
        Cluster::start_with(
            image,
            test,
            style,
            size,
            version,
            super::storage_of(version),
        )
    }

    /// [`Cluster::start`] with the members' TARGET_STORAGE `storage` (e.g.
    /// 3.3.25 members on etcd2 data, as kube-up's clusters ran before their
    /// storage migration); the test reads and writes it over the API the
    /// data asks for ([`Api::of_data`]: v2 for etcd2).
    pub fn start_with(
        image: &str,
        test: &str,
        style: Style,
        size: usize,
        version: &str,
        storage: &'static str,
    ) -> Cluster {
        let run = format!("{test}-{}", run_id());
        let label = format!("{LABEL_KEY}={run}");
        let seed = std::process::id() ^ SEQ.load(Ordering::SeqCst).wrapping_mul(7919);
        let network = Network::create(&format!("emcl-{run}"), &label, seed);
        let pki_root = tempfile::Builder::new()
            .prefix("etcd-migrate-cluster-test.")
            .tempdir()
            .expect("temp dir for certificates");
        let authority = Authority::new(&run);
        let client = authority.write_client(&pki_root.path().join("client"));
        let mut cluster = Cluster {
            members: Vec::new(),
            network,
            image: image.to_string(),
            style,
            client,
            token: format!("cluster-test-{run}"),
            run,
            api: Api::of_data(version, storage),
            storage,
            first: minor(version).expect("a X.Y.Z version"),
            label,
            authority,
            pki_root,
            extra_options: Vec::new(),
            killed: std::cell::Cell::new(false),
            restarts: std::cell::RefCell::new(Vec::new()),
        };
        for _ in 0..size {
            cluster.new_member(false);
        }
        for i in 0..size {
            cluster.run_member(i, version);
        }
        for i in 0..size {
            cluster.wait_healthy(i, START_DEADLINE);
        }
        let expected = minor(version).expect("a X.Y.Z version");
        cluster.wait_cluster_version(expected, START_DEADLINE);
        cluster
    }

    /// Certificates, volume and address of the next member (not started).
    fn new_member(&mut self, joined: bool) -> usize {
        let i = self.members.len();
        let name = format!("etcd-{}", (b'a' + i as u8) as char);
        let ip = self.network.ip(11 + i as u8);
        let pki_dir = self.pki_root.path().join(&name);
        self.authority.write_member(&pki_dir, &name, &ip);
        self.members.push(Member {
            volume: Volume::create(&format!("emcl-{}-{name}", self.run), &self.label),
            name,
            ip,
            container: None,
            pki_dir,
            joined,
        });
        i
    }

    /// kubeadm's control-plane join: the next member is added to the
    /// membership through member 0 (`member add` with its peer URL), and
    /// its container started with TARGET_VERSION `version` on an empty
    /// data volume and `--initial-cluster-state existing`; does not wait.
    /// Returns its index.
    pub fn add_member(&mut self, version: &str) -> usize {
        let i = self.new_member(true);
        let peer = format!("https://{}:2380", self.members[i].ip);
        let (ip0, pki) = (self.members[0].ip.clone(), self.client.clone());
        runtime().block_on(async move {
            // etcd refuses a member add until every member has been
            // connected for a few seconds ("unhealthy cluster").
            let started = Instant::now();
            loop {
                let err = match connect(&pki, &ip0).await {
                    Ok(mut c) => match tokio::time::timeout(
                        writer::REQUEST_DEADLINE,
                        c.member_add([peer.as_str()], None),
                    )
                    .await
                    {
                        Ok(Ok(_)) => return,
                        Ok(Err(e)) => e.to_string(),
                        Err(_) => "no answer in time".to_string(),
                    },
                    Err(e) => e,
                };
                assert!(
                    started.elapsed() < START_DEADLINE,
                    "member add {peer}: {err} (for {START_DEADLINE:?})"
                );
                tokio::time::sleep(POLL * 5).await;
            }
        });
        self.run_member(i, version);
        i
    }

    /// A new member started with TARGET_VERSION `version` on an empty data
    /// volume and `--initial-cluster-state existing`, with no `member add`
    /// by anyone: its entrypoint adds it (issue 29). Does not wait.
    pub fn add_member_by_itself(&mut self, version: &str) -> usize {
        let i = self.new_member(true);
        self.run_member(i, version);
        i
    }

    /// Member `i` loses its data: its container is killed and removed, its
    /// volume replaced by an empty one; it is started again with
    /// TARGET_VERSION `version` and `--initial-cluster-state existing` (its
    /// stale entry still in the membership). Does not wait.
    pub fn wipe_and_rejoin(&mut self, i: usize, version: &str) {
        self.lose_data(i);
        self.run_member(i, version);
    }

    /// Member `i` is lost: its container killed and removed, its volume
    /// replaced by an empty one (not started; [`Cluster::run_member`]
    /// starts it with `--initial-cluster-state existing`).
    pub fn lose_data(&mut self, i: usize) {
        self.members[i].container = None;
        let name = format!("emcl-{}-{}-wiped", self.run, self.members[i].name);
        self.members[i].volume = Volume::create(&name, &self.label);
        self.members[i].joined = true;
    }

    /// The data's storage and the API the test uses for it from now on
    /// (after a storage migration: etcd3, read and written over v3). The
    /// members started from now on get TARGET_STORAGE `storage`.
    pub fn switch_data(&mut self, storage: &'static str, api: Api) {
        self.storage = storage;
        self.api = api;
    }

    /// Cuts member `i` off its network (`docker network disconnect`: the
    /// container loses its address).
    pub fn cut_off(&self, i: usize) {
        self.container(i).disconnect(&self.network.name);
    }

    /// Puts member `i` back on its network with its address. Cut off, the
    /// container had no address: an etcd its entrypoint started meanwhile
    /// could not bind its URLs and exited, and the entrypoint with it
    /// (saying the next start carries on). The kubelet starts a static
    /// pod's container again; so does this, and says so. Whether it did.
    pub fn reconnect(&self, i: usize) -> bool {
        let container = self.container(i);
        container.connect(&self.network.name, &self.members[i].ip);
        let crate::harness::docker::State::Exited(code) = container.state() else {
            return false;
        };
        crate::harness::say(&format!(
            "{} exited {code} while cut off (no address: its etcd could not bind); started again as the kubelet would; its last line: {}",
            self.members[i].name,
            crate::harness::last_line(&container.logs())
        ));
        container.start();
        true
    }

    /// Member names, in order.
    pub fn names(&self) -> Vec<String> {
        self.members.iter().map(|m| m.name.clone()).collect()
    }

    /// Member addresses, in order.
    pub fn ips(&self) -> Vec<String> {
        self.members.iter().map(|m| m.ip.clone()).collect()
    }

    fn initial_cluster(&self) -> String {
        self.members
            .iter()
            .map(|m| format!("{}=https://{}:2380", m.name, m.ip))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// A host dir for files the test hands every member (bind-mount it
    /// with [`Cluster::extra_options`]).
    pub fn shared_dir(&self) -> std::path::PathBuf {
        let dir = self.pki_root.path().join("shared");
        std::fs::create_dir_all(&dir).expect("create the shared dir");
        dir
    }

    /// The root a member's example manifest maps its hostPath volumes
    /// under.
    fn example_root(&self, i: usize) -> std::path::PathBuf {
        self.members[i].pki_dir.with_extension("root")
    }

    /// `docker run` arguments of member `i` from its example manifest,
    /// rendered for this network and `version` (pod2docker.py).
    fn example_args(&self, i: usize, version: &str) -> Option<Vec<String>> {
        let m = &self.members[i];
        let Example {
            file,
            pki_at,
            certs,
            ..
        } = self.style.example(&m.name)?;
        let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut text = std::fs::read_to_string(repo.join(&file))
            .unwrap_or_else(|e| panic!("read {file}: {e}"));
        for (j, doc_ip) in EXAMPLE_IPS.iter().enumerate().take(self.members.len()) {
            text = text.replace(doc_ip, &self.members[j].ip);
        }
        text = text.replace(EXAMPLE_TARGET, version);
        let root = self.example_root(i);
        let pki_dir = root.join(pki_at);
        for (from, to) in certs {
            let to = pki_dir.join(to);
            std::fs::create_dir_all(to.parent().expect("a parent dir")).expect("pki dir");
            std::fs::copy(m.pki_dir.join(from), &to)
                .unwrap_or_else(|e| panic!("copy {from} to {}: {e}", to.display()));
        }
        let rendered = root.join(
            std::path::Path::new(&file)
                .file_name()
                .expect("a file name"),
        );
        std::fs::write(&rendered, text).expect("write the rendered manifest");
        let container = if self.style == Style::GceExample {
            "etcd-container"
        } else {
            "etcd"
        };
        let out = std::process::Command::new("python3")
            .arg(repo.join("image-tests/pod2docker.py"))
            .arg(&rendered)
            .args(["--container", container, "--image", &self.image, "--root"])
            .arg(&root)
            .output()
            .expect("run pod2docker.py");
        assert!(
            out.status.success(),
            "pod2docker.py {}: {}",
            rendered.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        let mut args: Vec<String> = [
            "--label",
            &self.label,
            "--network",
            &self.network.name,
            "--ip",
            &m.ip,
            "--hostname",
            &m.name,
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        args.extend(
            String::from_utf8_lossy(&out.stdout)
                .split('\0')
                .filter(|a| !a.is_empty())
                .map(str::to_string),
        );
        Some(args)
    }

    /// `docker run` arguments of member `i` with TARGET_VERSION `version`.
    fn run_args(&self, i: usize, version: &str) -> Vec<String> {
        self.run_args_as(i, &Target::new(version, self.storage))
    }

    /// `docker run` arguments of member `i` with `target`'s settings.
    fn run_args_as(&self, i: usize, target: &Target) -> Vec<String> {
        let version = target.version.as_str();
        if let Some(args) = self.example_args(i, version) {
            // The example manifests are run as written: their storage is
            // the cluster's, their env their own.
            assert!(
                target.storage == self.storage && target.env.is_empty(),
                "{:?} runs its manifests as written, not with {target:?}",
                self.style
            );
            return args;
        }
        let m = &self.members[i];
        let mut args: Vec<String> = [
            "--label",
            &self.label,
            "--network",
            &self.network.name,
            "--ip",
            &m.ip,
            "--hostname",
            &m.name,
            "-e",
            &format!("TARGET_VERSION={version}"),
            "-e",
            &format!("TARGET_STORAGE={}", target.storage),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        for pair in &target.env {
            args.push("-e".to_string());
            args.push(pair.clone());
        }
        args.extend(self.extra_options.iter().cloned());
        let peer = format!("https://{}:2380", m.ip);
        let client_urls = format!("https://{}:2379", m.ip);
        let state = if m.joined { "existing" } else { "new" };
        match self.style {
            Style::Kubeadm => {
                let pki = "/etc/kubernetes/pki/etcd";
                args.extend([
                    "-v".to_string(),
                    format!("{}:/var/lib/etcd", m.volume.name),
                    "-v".to_string(),
                    format!("{}:{pki}:ro", m.pki_dir.display()),
                    self.image.clone(),
                    // kubeadm's etcd command line as it is: etcd-migrate
                    // takes the name and data dir from etcd's own flags.
                    "--".to_string(),
                    format!("--advertise-client-urls={client_urls}"),
                    format!("--cert-file={pki}/{}", pki::SERVER_CERT),
                    "--client-cert-auth=true".to_string(),
                    "--data-dir=/var/lib/etcd".to_string(),
                    format!("--initial-advertise-peer-urls={peer}"),
                    format!("--initial-cluster={}", self.initial_cluster()),
                    format!("--initial-cluster-token={}", self.token),
                    format!("--initial-cluster-state={}", state),
                    format!("--key-file={pki}/{}", pki::SERVER_KEY),
                    format!("--listen-client-urls=https://127.0.0.1:2379,{client_urls}"),
                    format!("--listen-peer-urls={peer}"),
                    format!("--name={}", m.name),
                    format!("--peer-cert-file={pki}/{}", pki::PEER_CERT),
                    "--peer-client-cert-auth=true".to_string(),
                    format!("--peer-key-file={pki}/{}", pki::PEER_KEY),
                    format!("--peer-trusted-ca-file={pki}/{}", pki::CA),
                    "--snapshot-count=10000".to_string(),
                    format!("--trusted-ca-file={pki}/{}", pki::CA),
                ]);
                // A flag of 3.3 and later: not for a cluster that began
                // earlier (its first release would refuse it).
                if self.first >= (3, 3) {
                    args.push("--listen-metrics-urls=http://127.0.0.1:2381".to_string());
                }
            }
            Style::KubeadmExample | Style::GceExample => unreachable!("example_args"),
            Style::Gce | Style::GceHa => {
                let pki = "/etc/srv/kubernetes";
                let creds = format!(
                    "--peer-trusted-ca-file {pki}/{ca} --peer-cert-file {pki}/{pc} --peer-key-file {pki}/{pk} -peer-client-cert-auth",
                    ca = pki::CA,
                    pc = pki::PEER_CERT,
                    pk = pki::PEER_KEY
                );
                let apiserver_creds = format!(
                    "--client-cert-auth --trusted-ca-file {pki}/{ca} --cert-file {pki}/{sc} --key-file {pki}/{sk}",
                    ca = pki::CA,
                    sc = pki::SERVER_CERT,
                    sk = pki::SERVER_KEY
                );
                // The manifest's command, with the member's own client URL
                // (the test's clients are not on the member's loopback).
                let start = if self.style == Style::GceHa {
                    format!("exec /usr/local/bin/etcd-migrate -- --name {}", m.name)
                } else {
                    "/usr/local/bin/migrate-if-needed.sh || exit; exec /usr/local/bin/etcd-${TARGET_VERSION}".to_string()
                };
                // The space quota is a flag of 3.0 and later.
                let quota = if self.first >= (3, 0) {
                    " --quota-backend-bytes=4294967296"
                } else {
                    ""
                };
                let command = format!(
                    "{start} --listen-peer-urls ${{LISTEN_PEER_URLS}} --initial-advertise-peer-urls ${{INITIAL_ADVERTISE_PEER_URLS}} --advertise-client-urls {client_urls} --listen-client-urls https://127.0.0.1:2379,{client_urls}{quota} --data-dir /var/etcd/data --initial-cluster-state {state} --initial-cluster ${{INITIAL_CLUSTER}} --initial-cluster-token {token} ${{ETCD_CREDS}} {apiserver_creds}",
                    token = self.token
                );
                for (k, v) in [
                    ("DO_NOT_MOVE_BINARIES", "true".to_string()),
                    ("DATA_DIRECTORY", "/var/etcd/data".to_string()),
                    ("ETCD_NAME", m.name.clone()),
                    ("INITIAL_CLUSTER", self.initial_cluster()),
                    ("LISTEN_PEER_URLS", peer.clone()),
                    ("INITIAL_ADVERTISE_PEER_URLS", peer.clone()),
                    ("ETCD_CREDS", creds),
                    ("ETCD_SNAPSHOT_COUNT", "10000".to_string()),
                ] {
                    args.push("-e".to_string());
                    args.push(format!("{k}={v}"));
                }
                args.extend([
                    "-v".to_string(),
                    format!("{}:/var/etcd", m.volume.name),
                    "-v".to_string(),
                    format!("{}:{pki}:ro", m.pki_dir.display()),
                    "--entrypoint".to_string(),
                    "/bin/sh".to_string(),
                    self.image.clone(),
                    "-c".to_string(),
                    command,
                ]);
            }
        }
        args
    }

    /// (Re)creates member `i`'s container with TARGET_VERSION `version`, on
    /// its data volume; does not wait.
    pub fn run_member(&mut self, i: usize, version: &str) {
        let args = self.run_args(i, version);
        self.replace_container(i, &args);
    }

    /// (Re)creates member `i`'s container with `target`'s TARGET_VERSION,
    /// TARGET_STORAGE and env, on its data volume; does not wait.
    pub fn run_member_as(&mut self, i: usize, target: &Target) {
        let args = self.run_args_as(i, target);
        self.replace_container(i, &args);
    }

    /// Member `i` restarted by the operator with a new manifest: its
    /// container stopped gracefully, then run again as `target` says (an
    /// operator's rollout of one manifest); does not wait.
    pub fn restart_as(&mut self, i: usize, target: &Target) {
        self.container(i).stop(STOP_GRACE_S);
        self.run_member_as(i, target);
    }

    /// An operator's rollout: member after member restarted with its new
    /// manifest (`targets`, one per member in member order) on
    /// `rollout`'s schedule. Returns once the last one was restarted (and,
    /// for [`Rollout::Serving`], serves).
    pub fn roll_out(&mut self, targets: &[Target], rollout: Rollout) {
        assert_eq!(targets.len(), self.members.len(), "one manifest per member");
        let mut next = Instant::now();
        for (i, target) in targets.iter().enumerate() {
            if let Rollout::Apart(gap) = rollout {
                // The operator's schedule, not a wait for the cluster.
                thread::sleep(next.saturating_duration_since(Instant::now()));
                next = Instant::now() + gap;
            }
            self.restart_as(i, target);
            eprintln!(
                "cluster {}: {} restarted with TARGET_VERSION={} TARGET_STORAGE={}{}",
                self.run,
                self.members[i].name,
                target.version,
                target.storage,
                target
                    .env
                    .iter()
                    .map(|pair| format!(" {pair}"))
                    .collect::<String>()
            );
            if rollout == Rollout::Serving {
                self.wait_healthy(i, START_DEADLINE);
            }
        }
    }

    /// (Re)creates member `i` (kubeadm style) as `etcd-<version>` itself
    /// with the member's etcd flags, bypassing etcd-migrate: what an
    /// operator's by-hand restart does, and how the harness proves that
    /// its monitor sees a member run two minors ahead.
    pub fn run_member_bypassing_entrypoint(&mut self, i: usize, version: &str) {
        assert_eq!(
            self.style,
            Style::Kubeadm,
            "the kubeadm style has etcd's flags"
        );
        let mut args = self.run_args(i, version);
        let image_at = args
            .iter()
            .position(|a| *a == self.image)
            .expect("the image in the docker run arguments");
        let dashes = args
            .iter()
            .position(|a| a == "--")
            .expect("etcd's flags after --");
        // [docker options] --entrypoint etcd-<v> image [etcd flags]
        let etcd_flags = args.split_off(dashes + 1);
        args.truncate(image_at);
        args.extend([
            "--entrypoint".to_string(),
            format!("/usr/local/bin/etcd-{version}"),
            self.image.clone(),
        ]);
        args.extend(etcd_flags);
        self.replace_container(i, &args);
    }

    fn replace_container(&mut self, i: usize, args: &[String]) {
        let name = format!("emcl-{}-{}", self.run, self.members[i].name);
        // The old container (if any) goes first: the name is reused.
        self.members[i].container = None;
        self.members[i].container = Some(Container::run(&name, args));
    }

    /// SIGKILLs member `i`'s container (its entrypoint and its etcd), and
    /// remembers that the test did.
    pub fn kill(&self, i: usize) {
        self.killed.set(true);
        self.container(i).kill();
    }

    pub fn container(&self, i: usize) -> &Container {
        self.members[i]
            .container
            .as_ref()
            .expect("the member has a container")
    }

    /// Waits until member `i` answers `/health` true.
    pub fn wait_healthy(&self, i: usize, deadline: Duration) {
        let m = &self.members[i];
        let started = Instant::now();
        loop {
            let why = match monitor::healthy(&self.client, &m.ip) {
                Ok(()) => return,
                Err(e) => e,
            };
            let state = m.container.as_ref().map(|c| c.state());
            if let Some(super::docker::State::Exited(code)) = state {
                panic!(
                    "member {} exited {code} instead of serving; its log:\n{}",
                    m.name,
                    self.container(i).logs()
                );
            }
            assert!(
                started.elapsed() < deadline,
                "member {} not healthy within {deadline:?} ({why}); its log:\n{}",
                m.name,
                m.container.as_ref().map(|c| c.logs()).unwrap_or_default()
            );
            thread::sleep(POLL * 2);
        }
    }

    /// Waits until every member serves and reports cluster version
    /// `expected` (major, minor).
    pub fn wait_cluster_version(&self, expected: (u32, u32), deadline: Duration) {
        let started = Instant::now();
        loop {
            let answers: Vec<Result<monitor::VersionAnswer, String>> = self
                .members
                .iter()
                .map(|m| monitor::version(&self.client, &m.ip))
                .collect();
            if answers
                .iter()
                .all(|a| matches!(a, Ok(v) if minor(&v.cluster) == Some(expected)))
            {
                return;
            }
            assert!(
                started.elapsed() < deadline,
                "cluster version not {}.{} on every member within {deadline:?}: {answers:?}",
                expected.0,
                expected.1
            );
            thread::sleep(POLL * 2);
        }
    }

    /// The cluster version member `i` reports.
    pub fn cluster_version(&self, i: usize) -> String {
        monitor::version(&self.client, &self.members[i].ip)
            .unwrap_or_else(|e| panic!("member {}: {e}", self.members[i].name))
            .cluster
    }

    /// Membership as member `i` reports it, and that member's own id.
    pub fn membership(&self, i: usize) -> (Membership, u64) {
        if self.api == Api::V2 {
            return self.membership_v2(i);
        }
        let ip = self.members[i].ip.clone();
        let pki = self.client.clone();
        runtime().block_on(async move {
            let mut c = connect(&pki, &ip).await.unwrap_or_else(|e| panic!("{e}"));
            let resp = tokio::time::timeout(writer::REQUEST_DEADLINE, c.member_list())
                .await
                .unwrap_or_else(|_| panic!("member list from {ip}: no answer in time"))
                .unwrap_or_else(|e| panic!("member list from {ip}: {e}"));
            let header = resp.header().expect("a response header");
            let membership = Membership {
                cluster_id: header.cluster_id(),
                members: resp
                    .members()
                    .iter()
                    .map(|m| {
                        (
                            m.id(),
                            (
                                m.name().to_string(),
                                m.peer_urls().to_vec(),
                                m.client_urls().to_vec(),
                            ),
                        )
                    })
                    .collect(),
            };
            (membership, header.member_id())
        })
    }

    /// [`Cluster::membership`] over v2: `/v2/members` (the cluster id in
    /// its `X-Etcd-Cluster-ID` header) and `/v2/stats/self` (the member's
    /// own id).
    fn membership_v2(&self, i: usize) -> (Membership, u64) {
        let ip = self.members[i].ip.clone();
        let http = writer::v2_http(&self.client);
        let hex = |v: &serde_json::Value, what: &str| -> u64 {
            v.as_str()
                .and_then(|s| u64::from_str_radix(s, 16).ok())
                .unwrap_or_else(|| panic!("{ip}: {what} {v} is not a hex id"))
        };
        runtime().block_on(async {
            let get = |path: &str| {
                let url = format!("https://{ip}:2379{path}");
                let request = http.get(&url).send();
                async move {
                    let response = request.await.unwrap_or_else(|e| panic!("GET {url}: {e}"));
                    let cluster_id = response
                        .headers()
                        .get("X-Etcd-Cluster-ID")
                        .and_then(|h| h.to_str().ok())
                        .map(str::to_string);
                    let body = response
                        .text()
                        .await
                        .unwrap_or_else(|e| panic!("GET {url}: {e}"));
                    let json: serde_json::Value = serde_json::from_str(&body)
                        .unwrap_or_else(|e| panic!("GET {url}: {body:?}: {e}"));
                    (json, cluster_id)
                }
            };
            let (members, cluster_id) = get("/v2/members").await;
            let (own, _) = get("/v2/stats/self").await;
            let urls = |v: &serde_json::Value| -> Vec<String> {
                v.as_array()
                    .map(|a| {
                        a.iter()
                            .filter_map(|u| u.as_str())
                            .map(str::to_string)
                            .collect()
                    })
                    .unwrap_or_default()
            };
            let membership = Membership {
                cluster_id: hex(
                    &serde_json::Value::String(cluster_id.unwrap_or_default()),
                    "X-Etcd-Cluster-ID",
                ),
                members: members["members"]
                    .as_array()
                    .unwrap_or_else(|| panic!("{ip}/v2/members: {members}"))
                    .iter()
                    .map(|m| {
                        (
                            hex(&m["id"], "member id"),
                            (
                                m["name"].as_str().unwrap_or_default().to_string(),
                                urls(&m["peerURLs"]),
                                urls(&m["clientURLs"]),
                            ),
                        )
                    })
                    .collect(),
            };
            (membership, hex(&own["id"], "own id"))
        })
    }

    /// Records membership and ids once the cluster has settled; every
    /// member must agree.
    pub fn baseline(&self) -> Baseline {
        let (membership, _) = self.membership(0);
        assert_eq!(
            membership.members.len(),
            self.members.len(),
            "membership: {membership:?}"
        );
        let member_ids = (0..self.members.len())
            .map(|i| {
                let (m, id) = self.membership(i);
                assert_eq!(
                    m, membership,
                    "member {} sees another membership",
                    self.members[i].name
                );
                id
            })
            .collect();
        Baseline {
            membership,
            member_ids,
        }
    }

    /// The continuous writer, to every member.
    pub fn start_writer(&self) -> Writer {
        Writer::start(self.client.clone(), self.ips(), self.api)
    }

    /// A writer that goes on where `earlier` stopped (its first write past
    /// `earlier`'s last), over the API the data asks for now: after a
    /// storage migration, v3 writes beside the v2 writer's, every one of
    /// both checked in one keyspace.
    pub fn start_writer_after(&self, earlier: &WriterLog) -> Writer {
        Writer::start_from(
            self.client.clone(),
            self.ips(),
            self.api,
            earlier.last_seq + 1,
        )
    }

    /// The /version monitor of every member.
    pub fn start_monitor(&self) -> Monitor {
        Monitor::start(self.client.clone(), self.ips())
    }

    /// Gracefully stops member `i` and restarts its container as it was,
    /// waiting until it is healthy again.
    pub fn restart(&self, i: usize) {
        let c = self.container(i);
        c.stop(STOP_GRACE_S);
        c.start();
        self.wait_healthy(i, START_DEADLINE);
    }

    /// Member `i`'s version.txt, read from its data volume by a one-off
    /// container of the image (labelled, removed when it ends).
    pub fn version_txt(&self, i: usize) -> String {
        self.try_version_txt(i).unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`Cluster::version_txt`], or why it cannot be read now (a member
    /// whose data dir is being replaced may have none for a while).
    pub fn try_version_txt(&self, i: usize) -> Result<String, String> {
        self.try_data_file(i, "version.txt")
    }

    /// The file `name` of member `i`'s data dir, trimmed, or why it cannot
    /// be read (it is not there).
    pub fn try_data_file(&self, i: usize, name: &str) -> Result<String, String> {
        let m = &self.members[i];
        if let Some(example) = self.style.example(&m.name) {
            let path = self.example_root(i).join(example.data).join(name);
            return std::fs::read_to_string(&path)
                .map(|s| s.trim().to_string())
                .map_err(|e| format!("read {}: {e}", path.display()));
        }
        let (mount, file) = match self.style {
            Style::Kubeadm => ("/var/lib/etcd", format!("/var/lib/etcd/{name}")),
            Style::Gce | Style::GceHa => ("/var/etcd", format!("/var/etcd/data/{name}")),
            Style::KubeadmExample | Style::GceExample => unreachable!("read from the host"),
        };
        let out = docker_output(&[
            "run",
            "--rm",
            "--label",
            &self.label,
            "--network",
            "none",
            "-v",
            &format!("{}:{mount}:ro", m.volume.name),
            "--entrypoint",
            "/bin/sh",
            &self.image,
            "-c",
            &format!("cat {file}"),
        ]);
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
        } else {
            Err(format!(
                "{}: cat {file}: {}",
                m.name,
                String::from_utf8_lossy(&out.stderr).trim()
            ))
        }
    }

    /// Logs of every member (for a failure message).
    pub fn all_logs(&self) -> String {
        self.members
            .iter()
            .filter_map(|m| {
                m.container
                    .as_ref()
                    .map(|c| format!("---- {} ----\n{}", m.name, c.logs()))
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Ends a scenario with a client writing throughout: stops `writer`
    /// and `monitor`, checks the invariants against `baseline` (see
    /// [`Cluster::check_invariants`]), and says that `test` passed and in
    /// how long since `started`.
    pub fn finish_scenario(
        &self,
        test: &str,
        started: Instant,
        baseline: &Baseline,
        writer: Writer,
        monitor: Monitor,
    ) {
        let log = writer.finish();
        let rounds = monitor.finish();
        self.check_invariants(baseline, &log, &rounds);
        super::say(&format!(
            "{test}: passed in {:.1} s",
            started.elapsed().as_secs_f64()
        ));
    }

    /// Every acknowledged write on every member (a linearizable read of the
    /// writer's prefix), and equal `HashKV`s at one revision; the problems
    /// found.
    pub(super) fn keyspaces_v3(&self, acked: &[u64]) -> Vec<String> {
        let ips = self.ips();
        let names = self.names();
        let pki = self.client.clone();
        let acked = acked.to_vec();
        runtime().block_on(async move {
            let mut problems = Vec::new();
            let mut revision = None;
            let mut hashes = Vec::new();
            for (ip, name) in ips.iter().zip(&names) {
                let mut c = match connect(&pki, ip).await {
                    Ok(c) => c,
                    Err(e) => {
                        problems.push(format!("{name}: {e}"));
                        continue;
                    }
                };
                // A linearizable read: the member has applied everything
                // committed before it, so the first member's revision is a
                // revision every later member can hash. Asked again within
                // 20 s: each call ends at the client's own 3 s, and a member
                // just back from a cut (its read index asked of a leader it
                // reconnects to) may take longer on a loaded machine (CI,
                // 2026-11-30: `kill-cut`, "Timeout expired" once).
                let resp = match tokio::time::timeout(Duration::from_secs(20), async {
                    loop {
                        match c
                            .get(writer::PREFIX, Some(GetOptions::new().with_prefix()))
                            .await
                        {
                            Ok(r) => break Ok(r),
                            Err(e) if e.to_string().contains("Timeout expired") => {
                                tokio::time::sleep(Duration::from_millis(200)).await;
                            }
                            Err(e) => break Err(e),
                        }
                    }
                })
                .await
                {
                    Ok(Ok(r)) => r,
                    Ok(Err(e)) => {
                        problems.push(format!("{name}: read: {e}"));
                        continue;
                    }
                    Err(_) => {
                        problems.push(format!("{name}: read: no answer in 20 s"));
                        continue;
                    }
                };
                let rev = *revision.get_or_insert(resp.header().map(|h| h.revision()).unwrap_or(0));
                let kvs: BTreeMap<String, String> = resp
                    .kvs()
                    .iter()
                    .map(|kv| {
                        (
                            String::from_utf8_lossy(kv.key()).into_owned(),
                            String::from_utf8_lossy(kv.value()).into_owned(),
                        )
                    })
                    .collect();
                let missing: Vec<u64> = acked
                    .iter()
                    .copied()
                    .filter(|seq| kvs.get(&writer::key(*seq)) != Some(&seq.to_string()))
                    .collect();
                if !missing.is_empty() {
                    problems.push(format!(
                        "{name}: {} of {} acknowledged writes missing or wrong, e.g. {:?}",
                        missing.len(),
                        acked.len(),
                        &missing[..missing.len().min(5)]
                    ));
                }
                match tokio::time::timeout(writer::REQUEST_DEADLINE * 3, c.hash_kv(rev)).await {
                    Ok(Ok(h)) => hashes.push((name.clone(), h.hash(), h.compact_version())),
                    // 3.2 and older have no HashKV: every key at the same
                    // revision, digested, stands for it.
                    Ok(Err(e)) if e.to_string().contains("unknown method HashKV") => {
                        match whole_keyspace_digest(&mut c, rev).await {
                            Ok(digest) => hashes.push((name.clone(), digest, 0)),
                            Err(e) => problems.push(format!("{name}: keyspace at {rev}: {e}")),
                        }
                    }
                    Ok(Err(e)) => problems.push(format!("{name}: hashkv at {rev}: {e}")),
                    Err(_) => problems.push(format!("{name}: hashkv at {rev}: no answer in time")),
                }
            }
            if hashes
                .iter()
                .any(|(_, h, c)| (*h, *c) != (hashes[0].1, hashes[0].2))
            {
                problems.push(format!(
                    "keyspace hashes differ at revision {revision:?}: {hashes:?}"
                ));
            }
            problems
        })
    }

    /// [`Cluster::keyspaces_v3`] over v2 (clusters that began before 3.3;
    /// 3.2 and earlier have no `HashKV`): a quorum read of the writer's
    /// prefix from each member, every acknowledged write in it, and the
    /// same keys, values and modified indexes on every member.
    pub(super) fn keyspaces_v2(&self, acked: &[u64]) -> Vec<String> {
        let http = writer::v2_http(&self.client);
        let mut problems = Vec::new();
        let mut first: Option<(String, Vec<V2Leaf>)> = None;
        for m in &self.members {
            let dir = writer::PREFIX.trim_end_matches('/');
            let url = format!(
                "{}?recursive=true&quorum=true&sorted=true",
                writer::v2_url(&m.ip, dir)
            );
            let json = match writer::get_json(&http, &url) {
                Ok(json) => json,
                Err(e) => {
                    problems.push(format!("{}: read {url}: {e}", m.name));
                    continue;
                }
            };
            let nodes: Vec<V2Leaf> = json["node"]["nodes"]
                .as_array()
                .map(|nodes| {
                    nodes
                        .iter()
                        .map(|n| {
                            (
                                n["key"].as_str().unwrap_or_default().to_string(),
                                n["value"].as_str().unwrap_or_default().to_string(),
                                n["modifiedIndex"].as_u64().unwrap_or(0),
                            )
                        })
                        .collect()
                })
                .unwrap_or_default();
            let kvs: BTreeMap<&str, &str> = nodes
                .iter()
                .map(|(k, v, _)| (k.as_str(), v.as_str()))
                .collect();
            let missing: Vec<u64> = acked
                .iter()
                .copied()
                .filter(|seq| {
                    kvs.get(writer::key(*seq).as_str()) != Some(&seq.to_string().as_str())
                })
                .collect();
            if !missing.is_empty() {
                problems.push(format!(
                    "{}: {} of {} acknowledged writes missing or wrong, e.g. {:?}",
                    m.name,
                    missing.len(),
                    acked.len(),
                    &missing[..missing.len().min(5)]
                ));
            }
            match &first {
                None => first = Some((m.name.clone(), nodes)),
                Some((name, theirs)) if *theirs != nodes => problems.push(format!(
                    "the v2 keyspaces of {name} and {} differ ({} and {} keys)",
                    m.name,
                    theirs.len(),
                    nodes.len()
                )),
                Some(_) => {}
            }
        }
        problems
    }

    /// The end-of-scenario invariants: every acknowledged write present on
    /// every member, membership, cluster and member ids unchanged, equal
    /// keyspace hashes at one revision on every member, and the monitor's
    /// rounds clean. Panics with every violation found.
    pub fn check_invariants(&self, baseline: &Baseline, log: &WriterLog, rounds: &[Round]) {
        let mut problems = monitor::violations(&self.names(), rounds);
        assert!(!rounds.is_empty(), "the monitor made no round");
        assert!(
            !log.acked.is_empty(),
            "the writer got no write acknowledged"
        );
        problems.extend(match self.api {
            Api::V3 => self.keyspaces_v3(&log.acked),
            Api::V2 => self.keyspaces_v2(&log.acked),
        });
        for i in 0..self.members.len() {
            let (membership, id) = self.membership(i);
            if membership != baseline.membership {
                problems.push(format!(
                    "{}: membership changed: was {:?}, now {:?}",
                    self.members[i].name, baseline.membership, membership
                ));
            }
            if id != baseline.member_ids[i] {
                problems.push(format!(
                    "{}: member id changed: was {:x}, now {id:x}",
                    self.members[i].name, baseline.member_ids[i]
                ));
            }
        }
        assert!(
            problems.is_empty(),
            "invariants violated:\n  {}\nlogs:\n{}",
            problems.join("\n  "),
            self.all_logs()
        );
        eprintln!(
            "cluster {}: invariants hold: {} acknowledged writes ({} failed attempts) on all {} members, {} monitor rounds, ids and membership unchanged, {}",
            self.run,
            log.acked.len(),
            log.failed,
            self.members.len(),
            rounds.len(),
            match self.api {
                Api::V3 => "keyspace hashes equal",
                Api::V2 => "v2 keyspaces equal (keys, values, modified indexes)",
            }
        );
    }
}

/// Every key a member holds at `revision` (its own store: serializable),
/// digested (key, value, create and mod revision, version, lease), for a
/// release without `HashKV`.
async fn whole_keyspace_digest(
    c: &mut etcd_client::Client,
    revision: i64,
) -> Result<u32, etcd_client::Error> {
    use std::hash::{Hash, Hasher};
    let resp = tokio::time::timeout(
        Duration::from_secs(20),
        c.get(
            vec![0u8],
            Some(
                GetOptions::new()
                    .with_range(vec![0u8])
                    .with_revision(revision)
                    .with_serializable(),
            ),
        ),
    )
    .await
    .unwrap_or_else(|_| panic!("a read of the keyspace at {revision}: no answer in 20 s"))?;
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    for kv in resp.kvs() {
        (
            kv.key(),
            kv.value(),
            kv.create_revision(),
            kv.mod_revision(),
            kv.version(),
            kv.lease(),
        )
            .hash(&mut hasher);
    }
    Ok(hasher.finish() as u32)
}
