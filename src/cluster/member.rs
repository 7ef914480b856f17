//! This module owns the real side of the rolling loop's seams: the live
//! cluster as one member sees it ([`LiveCluster`]: the peers' `/version`
//! and `/members` over the peer TLS, the leader, alarms, upgrade lock and
//! leadership transfer over the client API with the client TLS, and the
//! proof that our etcd serves as a member), our member's etcd as a
//! supervised child started with the user's own arguments
//! ([`SupervisedEtcd`]), and the data dir's records ([`DataLedger`]).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use futures_util::future::join_all;

use crate::binaries;
use crate::cluster::announce;
use crate::cluster::client::{self, ClientError, V3Cluster};
use crate::cluster::decide::{Member, Reach, View};
use crate::cluster::lock::{Holder, LockError, Taken, UpgradeLock, V2Lock, V3Lock};
use crate::cluster::observe::{self, Answers};
use crate::cluster::peer::{self, PeerClient, PeerError, TlsFiles};
use crate::cluster::roll::{Coordination, Ledger, MemberEtcd};
use crate::datadir::{self, DataDirError};
use crate::exec::ExecTarget;
use crate::plan::Binary;
use crate::supervisor::{Child, ExitStatus, Supervisor, SupervisorError};
use crate::version::{Minor, Storage, Version, VersionPair};

/// The key our proof write puts (under a short lease or TTL), per member.
pub const PROOF_PREFIX: &str = "/etcd-migrate/proof/";

/// How long the proof key lives.
const PROOF_TTL_SECS: i64 = 60;

/// Why the cluster could not be asked, or did not agree.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// The peer endpoints.
    #[error(transparent)]
    Peer(#[from] PeerError),
    /// The client API.
    #[error(transparent)]
    Client(#[from] ClientError),
    /// The upgrade lock.
    #[error(transparent)]
    Lock(#[from] LockError),
    /// Our member answered as another release than the one we started.
    #[error("this member's peer endpoint {endpoint} answers as etcd {answered}, not {started}")]
    WrongRelease {
        /// Our peer `/version`.
        endpoint: String,
        /// What it said.
        answered: Version,
        /// What we started.
        started: Version,
    },
    /// The proof write failed.
    #[error("the write of {key} through this member's client URL {endpoint} failed: {reason}")]
    Write {
        /// The key.
        key: String,
        /// Our client URL.
        endpoint: String,
        /// Why.
        reason: String,
    },
    /// Our announcement could not be written, or the members' read.
    #[error("{action} the members' announced targets ({prefix}…) failed: {reason}")]
    Announcements {
        /// `writing` or `reading`.
        action: &'static str,
        /// The keys' prefix.
        prefix: &'static str,
        /// Why.
        reason: String,
    },
    /// We have no client URL to write through.
    #[error("this member publishes no client URL (--advertise-client-urls) to prove it with")]
    NoClientUrl,
}

/// Which API the lock, the proof and the leader use: v2 while the cluster
/// version is 2.x (a 3.0 member refuses v3 requests until then) or 3.0
/// (etcd 3.0's gRPC over TLS breaks the HTTP/2 client with a GOAWAY
/// FRAME_SIZE_ERROR, seen on 3.0.17; its v2 API is on by default), v3 from
/// 3.1 on (3.4 turns v2 off by default).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Api {
    V2,
    V3,
}

/// The live cluster, as our member asks it.
pub struct LiveCluster {
    own_id: u64,
    own_peer_url: String,
    own_client_urls: Vec<String>,
    me: Holder,
    peer: PeerClient,
    client_tls: Option<TlsFiles>,
    timeout: Duration,
    /// The membership last learned (the data's own at first).
    members: Vec<Member>,
    /// The ids of a shorter membership another member answered with in
    /// the last round, not believed yet ([`LiveCluster::refresh_members`]).
    shrunk_to: Option<Vec<u64>>,
    /// Since when each silent member has not answered.
    silent_since: HashMap<u64, Instant>,
    /// The members whose TLS handshake failed in the last round, with why.
    tls_refused: BTreeMap<u64, String>,
    /// The lowest cluster version last told.
    cluster_version: Option<Minor>,
    api_client: Option<V3Cluster>,
    v2_lock: Option<V2Lock>,
    v3_lock: Option<Box<V3Lock>>,
    /// The store we took the lock in, while we hold it: the cluster
    /// version may cross into the other API under our hold, and the lock
    /// is kept and released where it was taken.
    held: Option<Api>,
    /// The store our announcement was last written to (once per store:
    /// the cluster version may cross from v2 to v3 while we run).
    announced_in: Option<Api>,
}

impl LiveCluster {
    /// A view of the cluster from `members` (the data's own membership),
    /// as member `me`, with the member's peer and client TLS.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        own_id: u64,
        members: Vec<Member>,
        own_client_urls: Vec<String>,
        me: Holder,
        peer_tls: Option<&TlsFiles>,
        client_tls: Option<TlsFiles>,
        timeout: Duration,
    ) -> Result<Self, PeerError> {
        let own_peer_url = members
            .iter()
            .find(|m| m.id == own_id)
            .and_then(|m| m.peer_urls.first().cloned())
            .unwrap_or_default();
        Ok(LiveCluster {
            own_id,
            own_peer_url,
            own_client_urls,
            me,
            peer: PeerClient::new(peer_tls, timeout)?,
            client_tls,
            timeout,
            members,
            shrunk_to: None,
            silent_since: HashMap::new(),
            tls_refused: BTreeMap::new(),
            cluster_version: None,
            api_client: None,
            v2_lock: None,
            v3_lock: None,
            held: None,
            announced_in: None,
        })
    }

    fn api(&self) -> Api {
        match self.cluster_version {
            Some(cv) if cv < Minor::new(3, 1) => Api::V2,
            _ => Api::V3,
        }
    }

    /// The store the lock is kept in now: where we took it, else the
    /// cluster's.
    fn lock_api(&self) -> Api {
        self.held.unwrap_or_else(|| self.api())
    }

    /// Where the client API is asked: our own member's client URLs. The
    /// loop acts only while our etcd is proven, and our member forwards
    /// what needs the leader; a list with the other members in it would
    /// fail requests the client balances onto one that is restarting.
    /// Until our URLs are known, every member's.
    fn client_endpoints(&self) -> Vec<String> {
        if !self.own_client_urls.is_empty() {
            return self.own_client_urls.clone();
        }
        let mut endpoints: Vec<String> = self
            .members
            .iter()
            .flat_map(|m| m.client_urls.iter().cloned())
            .collect();
        endpoints.dedup();
        endpoints
    }

    /// Every member's client URLs, ours first (the v2 lock tries them in
    /// order, one request at a time).
    fn all_client_endpoints(&self) -> Vec<String> {
        let mut endpoints = self.own_client_urls.clone();
        for member in self.members.iter().filter(|m| m.id != self.own_id) {
            endpoints.extend(member.client_urls.iter().cloned());
        }
        endpoints.dedup();
        endpoints
    }

    /// The membership from ourselves, else from the first member that
    /// answers; the last one learned when nobody does.
    ///
    /// Another member's answer that lacks members we knew is believed only
    /// when the next round's says the same: an etcd that has just
    /// restarted answers its peer `/members` from the middle of its log's
    /// replay, with the membership of an earlier index (`e2e/
    /// cluster_probe.rs` sees it), and a member left out of the view is one
    /// whose being down nobody counts. Our own etcd's answer is believed at
    /// once: the loop acts only while it is proven, so past its replay.
    async fn refresh_members(&mut self) {
        let mut urls: Vec<String> = vec![self.own_peer_url.clone()];
        urls.extend(
            self.members
                .iter()
                .filter(|m| m.id != self.own_id)
                .filter_map(|m| m.peer_urls.first().cloned()),
        );
        for url in urls.iter().filter(|u| !u.is_empty()) {
            if let Ok(members) = self.peer.members(url).await {
                if *url == self.own_peer_url {
                    self.shrunk_to = None;
                } else if !self.shrink_believed(&members) {
                    return;
                }
                if let Some(me) = members.iter().find(|m| m.id == self.own_id) {
                    if !me.client_urls.is_empty() && self.own_client_urls.is_empty() {
                        self.own_client_urls = me.client_urls.clone();
                    }
                }
                self.members = members;
                return;
            }
        }
    }

    /// Whether `answer` (another member's) may replace the membership we
    /// know: yes unless it lacks one of our members and the last round's
    /// other answer did not lack the same ones.
    fn shrink_believed(&mut self, answer: &[Member]) -> bool {
        let mut ids: Vec<u64> = answer.iter().map(|m| m.id).collect();
        ids.sort_unstable();
        let lacks = self
            .members
            .iter()
            .any(|m| ids.binary_search(&m.id).is_err());
        if !lacks {
            self.shrunk_to = None;
            return true;
        }
        if self.shrunk_to.as_ref() == Some(&ids) {
            self.shrunk_to = None;
            return true;
        }
        crate::log::info(
            "another member lists fewer members than this member knew (an etcd just started answers from the middle of its log's replay); believed if the next round's answer agrees",
            &[
                ("known", self.members.len().into()),
                ("listed", answer.len().into()),
            ],
        );
        self.shrunk_to = Some(ids);
        false
    }

    /// Asks every member's peer `/version` at once.
    async fn ask_versions(&mut self) -> Answers {
        let asked = join_all(self.members.iter().map(|m| {
            let url = m.peer_urls.first().cloned().unwrap_or_default();
            let peer = &self.peer;
            async move { (m.id, peer.version(&url).await) }
        }))
        .await;
        let now = Instant::now();
        let mut answers = Answers::new();
        self.tls_refused.clear();
        for (id, answer) in asked {
            match answer {
                Ok(info) => {
                    self.silent_since.remove(&id);
                    answers.insert(id, Ok(info));
                }
                Err(err) => {
                    if let Some(why) = err.tls_refusal() {
                        self.tls_refused.insert(id, why.to_string());
                    }
                    let since = *self.silent_since.entry(id).or_insert(now);
                    answers.insert(id, Err(now.duration_since(since)));
                }
            }
        }
        answers
    }

    async fn peer_view(&mut self) -> View {
        self.refresh_members().await;
        let answers = self.ask_versions().await;
        let mut view = observe::assemble(self.members.clone(), &answers, Vec::new(), None, None);
        view.tls_refused = self.tls_refused.clone();
        if view.cluster_version.is_some() {
            self.cluster_version = view.cluster_version;
        }
        view
    }

    async fn v3(&mut self) -> Result<&mut V3Cluster, ClusterError> {
        if self.api_client.is_none() {
            let endpoints = self.client_endpoints();
            let client =
                V3Cluster::connect(&endpoints, self.client_tls.as_ref(), self.timeout).await?;
            self.api_client = Some(client);
        }
        match self.api_client.as_mut() {
            Some(client) => Ok(client),
            None => Err(ClusterError::NoClientUrl),
        }
    }

    async fn v2_lock(&mut self) -> Result<&mut V2Lock, ClusterError> {
        if self.v2_lock.is_none() {
            self.v2_lock = Some(V2Lock::new(
                &self.all_client_endpoints(),
                self.client_tls.as_ref(),
                self.me.clone(),
                self.timeout,
            )?);
        }
        self.v2_lock.as_mut().ok_or(ClusterError::NoClientUrl)
    }

    async fn v3_lock(&mut self) -> Result<&mut V3Lock, ClusterError> {
        if self.v3_lock.is_none() {
            let endpoints = self.client_endpoints();
            let lock = V3Lock::connect(
                &endpoints,
                self.client_tls.as_ref(),
                self.me.clone(),
                self.timeout,
            )
            .await?;
            self.v3_lock = Some(Box::new(lock));
        }
        match self.v3_lock.as_deref_mut() {
            Some(lock) => Ok(lock),
            None => Err(ClusterError::NoClientUrl),
        }
    }

    /// Drops the cached clients after an error: the next call connects
    /// again (to the members as they are now).
    fn forget_clients(&mut self) {
        self.api_client = None;
    }

    /// The leader, the alarms and the target of an enabled downgrade job.
    async fn status(&mut self) -> Result<Status, ClusterError> {
        match self.api() {
            Api::V2 => {
                let endpoints = self.client_endpoints();
                let leader =
                    client::v2_leader(&endpoints, self.client_tls.as_ref(), self.timeout).await?;
                Ok((leader, Vec::new(), None))
            }
            Api::V3 => {
                let api = self.v3().await?;
                let (leader, downgrade) = api.status().await?;
                let alarms = api.alarms().await?;
                Ok((leader, alarms, downgrade))
            }
        }
    }

    /// Who holds the lock: in the cluster's store, and, at 3.1 (the first
    /// cluster version whose lock is v3), in the v2 store too, where a
    /// member that took it at 3.0 may still hold it.
    async fn holder(&mut self) -> Result<Option<u64>, ClusterError> {
        let holder = match self.api() {
            Api::V2 => self.v2_lock().await?.holder().await?,
            Api::V3 => {
                let mut holder = self.v3_lock().await?.holder().await?;
                if holder.is_none() && self.cluster_version == Some(Minor::new(3, 1)) {
                    if let Ok(lock) = self.v2_lock().await {
                        holder = lock.holder().await.unwrap_or(None);
                    }
                }
                holder
            }
        };
        Ok(holder.and_then(|h| h.member_id()))
    }

    /// Every member's announced target: from the cluster's store, and, at
    /// 3.1 (the first cluster version whose store is v3), from the v2
    /// store too for a member that announced at 3.0 and has not since.
    async fn announcements(&mut self) -> Result<BTreeMap<u64, Version>, ClusterError> {
        let failed = |reason: String| ClusterError::Announcements {
            action: "reading",
            prefix: announce::PREFIX,
            reason,
        };
        let v2 = |this: &Self| {
            let http = peer::http_client(this.client_tls.as_ref(), this.timeout);
            (http, this.all_client_endpoints())
        };
        match self.api() {
            Api::V2 => {
                let (http, endpoints) = v2(self);
                announce::read_v2(&http?, &endpoints).await.map_err(failed)
            }
            Api::V3 => {
                let mut announced = announce::read_v3(self.v3().await?.client())
                    .await
                    .map_err(failed)?;
                if self.cluster_version == Some(Minor::new(3, 1)) {
                    let (http, endpoints) = v2(self);
                    if let Ok(older) = announce::read_v2(&http?, &endpoints).await {
                        for (id, target) in older {
                            announced.entry(id).or_insert(target);
                        }
                    }
                }
                Ok(announced)
            }
        }
    }

    async fn proof_write(&mut self, release: Version) -> Result<(), ClusterError> {
        let endpoint = self
            .own_client_urls
            .first()
            .cloned()
            .ok_or(ClusterError::NoClientUrl)?;
        let key = format!("{PROOF_PREFIX}{:x}", self.own_id);
        let value = format!("{release} {}", self.me.run);
        let failed = |reason: String| ClusterError::Write {
            key: key.clone(),
            endpoint: endpoint.clone(),
            reason,
        };
        match self.api() {
            Api::V2 => {
                let http = peer::http_client(self.client_tls.as_ref(), self.timeout)?;
                let url = format!("{}/v2/keys{key}", endpoint.trim_end_matches('/'));
                let ttl = PROOF_TTL_SECS.to_string();
                let response = http
                    .put(&url)
                    .form(&[("value", value.as_str()), ("ttl", ttl.as_str())])
                    .send()
                    .await
                    .map_err(|e| failed(crate::log::error_chain(&e)))?;
                let status = response.status();
                if !status.is_success() {
                    let body = response.text().await.unwrap_or_default();
                    return Err(failed(format!("{status}: {}", body.trim())));
                }
                Ok(())
            }
            Api::V3 => {
                let mut client = client::connect_v3(
                    std::slice::from_ref(&endpoint),
                    self.client_tls.as_ref(),
                    self.timeout,
                )
                .await?;
                let lease = client
                    .lease_grant(PROOF_TTL_SECS, None)
                    .await
                    .map_err(|e| failed(crate::log::error_chain(&e)))?;
                client
                    .put(
                        key.as_str(),
                        value.as_str(),
                        Some(etcd_client::PutOptions::new().with_lease(lease.id())),
                    )
                    .await
                    .map_err(|e| failed(crate::log::error_chain(&e)))?;
                Ok(())
            }
        }
    }
}

/// The leader, the raised alarms, and the target of an enabled downgrade.
type Status = (Option<u64>, Vec<String>, Option<Minor>);

impl Coordination for LiveCluster {
    type Error = ClusterError;

    async fn peers(&mut self) -> View {
        self.peer_view().await
    }

    async fn observe(&mut self) -> Result<View, ClusterError> {
        let mut view = self.peer_view().await;
        let asked = async {
            let status = self.status().await?;
            let lock = self.holder().await?;
            let announced = self.announcements().await?;
            Ok::<_, ClusterError>((status, lock, announced))
        }
        .await;
        match asked {
            Ok(((leader, alarms, downgrade), lock, announced)) => {
                view.leader = leader;
                view.alarms = alarms;
                view.downgrade = downgrade;
                view.lock = lock;
                view.announced = announced;
                Ok(view)
            }
            Err(err) => {
                self.forget_clients();
                Err(err)
            }
        }
    }

    async fn take_lock(&mut self) -> Result<Taken, ClusterError> {
        let api = self.lock_api();
        let taken = match api {
            Api::V2 => self.v2_lock().await?.try_take().await,
            Api::V3 => self.v3_lock().await?.try_take().await,
        };
        match taken {
            Ok(Taken::Ours) => {
                self.held = Some(api);
                Ok(Taken::Ours)
            }
            Ok(other) => Ok(other),
            Err(err) => {
                self.v3_lock = None;
                Err(err.into())
            }
        }
    }

    /// Through our own member, else through each other member in turn: our
    /// member is down while it restarts under the lock (for as long as a
    /// large member takes to start), and the lease must outlive that.
    async fn keep_lock(&mut self) -> Result<(), ClusterError> {
        let mut routes = vec![self.client_endpoints()];
        routes.extend(
            self.members
                .iter()
                .filter(|m| m.id != self.own_id && !m.client_urls.is_empty())
                .map(|m| m.client_urls.clone()),
        );
        let mut last = None;
        let api = self.lock_api();
        for (i, route) in routes.iter().enumerate() {
            let refreshed = match api {
                Api::V2 => self.v2_lock().await?.refresh().await,
                Api::V3 => {
                    let lock = self.v3_lock().await?;
                    if i > 0 {
                        if let Err(err) = lock.reconnect(route).await {
                            last = Some(err);
                            continue;
                        }
                    }
                    lock.refresh().await
                }
            };
            match refreshed {
                Ok(()) => return Ok(()),
                // The lease is gone or another holds the key: no other
                // route changes that.
                Err(err @ LockError::Lost { .. }) => return Err(err.into()),
                Err(err) => last = Some(err),
            }
            if api == Api::V2 {
                // The v2 lock already tries every member it knows.
                break;
            }
        }
        Err(last.map_or(ClusterError::NoClientUrl, Into::into))
    }

    async fn release_lock(&mut self) -> Result<(), ClusterError> {
        match self.lock_api() {
            Api::V2 => self.v2_lock().await?.release().await?,
            Api::V3 => self.v3_lock().await?.release().await?,
        }
        self.held = None;
        Ok(())
    }

    async fn move_leader(&mut self, from: u64, to: u64) -> Result<(), ClusterError> {
        if self.api() == Api::V2 {
            return Err(ClientError::Unreachable {
                endpoints: self.client_endpoints().join(","),
                reason: "a 2.x cluster has no leadership transfer".to_string(),
            }
            .into());
        }
        let leader_url = self
            .own_client_urls
            .first()
            .cloned()
            .ok_or(ClusterError::NoClientUrl)?;
        let result = self.v3().await?.move_leader(from, &leader_url, to).await;
        result.map_err(Into::into)
    }

    async fn enable_downgrade(&mut self, to: Minor) -> Result<(), ClusterError> {
        let result = self.v3().await?.enable_downgrade(to).await;
        result.map_err(Into::into)
    }

    async fn cancel_downgrade(&mut self) -> Result<(), ClusterError> {
        let result = self.v3().await?.cancel_downgrade().await;
        result.map_err(Into::into)
    }

    async fn announce(&mut self, target: VersionPair) -> Result<bool, ClusterError> {
        let api = self.api();
        if self.announced_in == Some(api) {
            return Ok(false);
        }
        let announcement = announce::Announcement::new(target, &self.me.name, &self.me.run);
        let failed = |reason: String| ClusterError::Announcements {
            action: "writing",
            prefix: announce::PREFIX,
            reason,
        };
        match api {
            Api::V2 => {
                let http = peer::http_client(self.client_tls.as_ref(), self.timeout)?;
                let endpoints = self.all_client_endpoints();
                announce::put_v2(&http, &endpoints, self.own_id, &announcement)
                    .await
                    .map_err(failed)?;
            }
            Api::V3 => {
                let own_id = self.own_id;
                announce::put_v3(self.v3().await?.client(), own_id, &announcement)
                    .await
                    .map_err(failed)?;
            }
        }
        self.announced_in = Some(api);
        Ok(true)
    }

    async fn prove(&mut self, release: Version) -> Result<(), ClusterError> {
        let info = self.peer.version(&self.own_peer_url).await?;
        if info.server != release {
            return Err(ClusterError::WrongRelease {
                endpoint: format!("{}/version", self.own_peer_url),
                answered: info.server,
                started: release,
            });
        }
        if let Some(cv) = info.cluster {
            self.cluster_version = Some(cv);
        }
        self.proof_write(release).await
    }
}

/// Our member's etcd, a supervised child with the user's own arguments
/// and environment (what the exec would run), output straight to ours.
pub struct SupervisedEtcd {
    supervisor: Supervisor,
    bin_dir: PathBuf,
    etcd_args: Vec<String>,
    data_dir: String,
    listen_client_urls: Option<String>,
    env_has_data_dir: bool,
    grace: Duration,
    child: Option<Child>,
    /// The release `child` runs.
    release: Option<Version>,
}

impl SupervisedEtcd {
    /// A member etcd started as `etcd_args` say (plus `--data-dir`, as for
    /// the exec), stopped with `grace` before SIGKILL.
    pub fn new(
        supervisor: Supervisor,
        bin_dir: &Path,
        etcd_args: &[String],
        data_dir: &Path,
        listen_client_urls: Option<&str>,
        grace: Duration,
    ) -> Self {
        SupervisedEtcd {
            supervisor,
            bin_dir: bin_dir.to_path_buf(),
            etcd_args: etcd_args.to_vec(),
            data_dir: data_dir.to_string_lossy().into_owned(),
            listen_client_urls: listen_client_urls.map(str::to_string),
            env_has_data_dir: std::env::var_os("ETCD_DATA_DIR").is_some_and(|v| !v.is_empty()),
            grace,
            child: None,
            release: None,
        }
    }

    /// The same etcd with `arg` after the user's arguments.
    pub fn with_arg(mut self, arg: &str) -> Self {
        self.etcd_args.push(arg.to_string());
        self
    }

    /// Another etcd of the same member (none started yet) with `args`
    /// after the user's arguments: a joining member's etcd (etcd takes the
    /// last of a repeated flag; the environment's twin is dropped by the
    /// command line, `exec::ExecTarget`).
    pub fn clone_with_args(&self, args: &[String]) -> Self {
        let mut etcd_args = self.etcd_args.clone();
        etcd_args.extend(args.iter().cloned());
        SupervisedEtcd {
            supervisor: self.supervisor.clone(),
            bin_dir: self.bin_dir.clone(),
            etcd_args,
            data_dir: self.data_dir.clone(),
            listen_client_urls: self.listen_client_urls.clone(),
            env_has_data_dir: self.env_has_data_dir,
            grace: self.grace,
            child: None,
            release: None,
        }
    }

    /// Whether our etcd still runs `release` (a roll's last release that
    /// a pause job takes over, `Plan::then_pause`).
    pub fn runs(&mut self, release: Version) -> bool {
        self.release == Some(release)
            && self
                .child
                .as_mut()
                .is_some_and(|child| child.try_status().is_none())
    }

    /// Stops our etcd and says whether the stop was graceful: it was
    /// running when asked, and ended on SIGTERM (or exit 0) within the
    /// grace, not by SIGKILL.
    pub async fn stop_gracefully(&mut self) -> Result<bool, SupervisorError> {
        let Some(child) = self.child.as_mut() else {
            return Ok(false);
        };
        if child.try_status().is_some() {
            return Ok(false);
        }
        let (status, killed) = child.stop(self.grace).await?;
        Ok(!killed
            && matches!(
                status,
                ExitStatus::Exited(0) | ExitStatus::Signaled(nix::sys::signal::Signal::SIGTERM)
            ))
    }

    /// The command line a release runs with.
    pub fn target(&self, release: Version) -> ExecTarget {
        ExecTarget::new(
            binaries::path(&self.bin_dir, Binary::etcd(release)),
            &self.etcd_args,
            &self.data_dir,
            self.listen_client_urls.as_deref(),
            self.env_has_data_dir,
        )
        .for_release(release)
    }
}

impl SupervisedEtcd {
    /// Spawns `command` (a release's, see [`SupervisedEtcd::target`]) as
    /// our member's etcd (a supervised child, output straight to ours).
    fn spawn(&mut self, mut command: std::process::Command) -> Result<(), SupervisorError> {
        // One member, one etcd: a second start while the first still runs
        // would lose the race for the ports (etcd exits 1, "address already
        // in use") while the first serves unsupervised.
        if let Some(running) = self.child.as_mut() {
            if running.try_status().is_none() {
                return Err(SupervisorError::AlreadyRunning {
                    pid: running.pid(),
                    program: command.get_program().to_string_lossy().into_owned(),
                });
            }
        }
        command
            .stdin(Stdio::null())
            .stdout(Stdio::inherit())
            .stderr(Stdio::inherit());
        let child = self.supervisor.spawn(&mut command)?;
        crate::log::info(
            "member etcd spawned",
            &[
                ("pid", child.pid().into()),
                ("program", child.program().into()),
            ],
        );
        self.child = Some(child);
        Ok(())
    }
}

impl MemberEtcd for SupervisedEtcd {
    type Error = SupervisorError;

    async fn start(&mut self, release: Version) -> Result<(), SupervisorError> {
        self.spawn(self.target(release).command())?;
        self.release = Some(release);
        Ok(())
    }

    async fn start_snapshotting(&mut self, release: Version) -> Result<(), SupervisorError> {
        let mut command = self.target(release).command();
        // etcd refuses a flag its environment also sets ("conflicting
        // environment variable is shadowed", seen with GCE's manifests,
        // which set ETCD_SNAPSHOT_COUNT): where the environment sets it,
        // the environment gets the 1; otherwise the flag goes last, where
        // it wins over the user's own --snapshot-count.
        if std::env::var_os("ETCD_SNAPSHOT_COUNT").is_some_and(|v| !v.is_empty()) {
            command.env("ETCD_SNAPSHOT_COUNT", "1");
        } else {
            command.arg("--snapshot-count=1");
        }
        self.spawn(command)?;
        self.release = Some(release);
        Ok(())
    }

    async fn stop(&mut self) -> Result<ExitStatus, SupervisorError> {
        match self.child.as_mut() {
            Some(child) => child.stop(self.grace).await.map(|(status, _)| status),
            None => Ok(ExitStatus::Exited(0)),
        }
    }

    fn exited(&mut self) -> Option<ExitStatus> {
        self.child.as_mut().and_then(Child::try_status)
    }

    async fn wait(&mut self) -> ExitStatus {
        match self.child.as_mut() {
            Some(child) => child.wait().await,
            None => std::future::pending().await,
        }
    }
}

/// The data dir's records of the member's release.
pub struct DataLedger {
    /// The data dir.
    pub dir: PathBuf,
    /// The storage the data keeps (the roll never changes it).
    pub storage: Storage,
}

impl Ledger for DataLedger {
    type Error = DataDirError;

    fn record(&mut self, release: Version) -> Result<(), DataDirError> {
        datadir::record_and_unmark(
            &self.dir,
            VersionPair {
                version: release,
                storage: self.storage,
            },
        )
    }

    fn mark(&mut self, release: Version) -> Result<(), DataDirError> {
        datadir::write_restart_mark(&self.dir, release)
    }

    fn replay_blocker(&mut self, release: Version) -> Result<Option<String>, DataDirError> {
        if !release.replays_only_v3_requests() {
            return Ok(None);
        }
        let on_disk =
            crate::ondisk::read(&self.dir).map_err(|source| DataDirError::Unreadable {
                dir: self.dir.display().to_string(),
                source,
            })?;
        Ok(on_disk.v2_requests_past_snapshot.map(|index| {
            format!(
                "its WAL holds a v2 request (written by 3.5 or older) at raft index {index}, past its newest snapshot record, and etcd {release} panics replaying one"
            )
        }))
    }

    fn storage_version(&mut self) -> Result<Option<Minor>, DataDirError> {
        let on_disk =
            crate::ondisk::read(&self.dir).map_err(|source| DataDirError::Unreadable {
                dir: self.dir.display().to_string(),
                source,
            })?;
        Ok(on_disk
            .storage_version
            .and_then(|v| v.parse::<Version>().ok())
            .map(Version::minor_line))
    }
}

/// A member as the data records it, for the first view (before any peer
/// answered). Its reach is unknown: down for no time yet.
pub fn from_disk(member: &crate::ondisk::MemberOnDisk) -> Member {
    Member {
        id: member.id,
        name: member.name.clone(),
        peer_urls: member.peer_urls.clone(),
        client_urls: member.client_urls.clone(),
        is_learner: member.is_learner,
        reach: Reach::Down(Duration::ZERO),
        storage: None,
    }
}
