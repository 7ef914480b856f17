//! This module owns the bin dir: which releases it bundles (`etcd-<semver>`
//! files), whether each binary a plan needs is there and executable, and
//! whether each reports the release its name claims (with a deadline that
//! no leftover process holding a pipe can stretch, and a termination
//! signal honoured at once).

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::sys::signal::Signal;
use nix::unistd::{access, AccessFlags};
use tokio::sync::watch;

use crate::log;
use crate::plan::{Binary, Bundle, Tool};
use crate::supervisor::{Child, Supervisor, SupervisorError};
use crate::version::Version;

/// How long `<binary> version` may take. A Go binary answers in ~10 ms;
/// 20 s covers a cold page cache on a slow disk.
pub const VERSION_CHECK_TIMEOUT: Duration = Duration::from_secs(20);

/// How long a version check's output may stay open after its process
/// exited. A binary's own pipes close when it exits; only a process it
/// left behind keeps them open, and that is not worth waiting for.
pub const OUTPUT_GRACE: Duration = Duration::from_secs(1);

/// Why a binary cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum BinError {
    /// The bin dir cannot be listed.
    #[error("cannot list bin dir {dir}: {source}; point --bin-dir at the directory that holds etcd-<version>, etcdctl-<version> and etcdutl-<version> (the image's is /usr/local/bin)")]
    List {
        /// The bin dir.
        dir: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A needed binary is absent.
    #[error("{path} is missing: the plan needs {binary}; add it to the image or pick a target whose path is bundled (or, outside the image, point --bin-dir at the directory that holds etcd-<version>, etcdctl-<version> and etcdutl-<version>)")]
    Missing {
        /// Where it should be.
        path: PathBuf,
        /// Which binary.
        binary: Binary,
    },
    /// A needed binary cannot be executed.
    #[error("{path} is not an executable file ({reason}); the plan needs {binary}: replace it with the real {binary} binary (mode 0755)")]
    NotExecutable {
        /// The file.
        path: PathBuf,
        /// Which binary.
        binary: Binary,
        /// What is wrong.
        reason: String,
    },
    /// The binary failed to report its version.
    #[error("{path} did not report its version ({reason}); the plan needs a working {binary}: replace it with the real {binary} binary")]
    NoVersion {
        /// The file.
        path: PathBuf,
        /// Which binary.
        binary: Binary,
        /// What happened.
        reason: String,
    },
    /// The binary reports another release than its name.
    #[error("{path} reports version {reported}, not {expected}: the file is mislabelled; replace it with the real {binary}")]
    WrongVersion {
        /// The file.
        path: PathBuf,
        /// Which binary.
        binary: Binary,
        /// What its name says.
        expected: Version,
        /// What it says.
        reported: String,
    },
    /// The release refuses the etcd flags it is to run with (the user's,
    /// after `--`): found by its `--version` with those flags, which etcd
    /// parses in full before it answers and touches nothing.
    #[error("{path} (etcd {version}) refuses the etcd flags it is to run with: {refusal}; {advice}{whose}, so each must accept them: drop or replace the flag (e.g. --trusted-ca-file for --ca-file, which etcd 3.4 removed) and rerun; nothing was started and the data dir is as it was")]
    RefusesFlags {
        /// The file.
        path: PathBuf,
        /// Its release.
        version: Version,
        /// etcd's own words.
        refusal: String,
        /// The removed flag's replacement, when known, as a sentence
        /// ending in "; " (empty otherwise).
        advice: String,
        /// Which flags go to which releases, as a clause.
        whose: String,
    },
    /// The check process could not be run.
    #[error(transparent)]
    Supervisor(#[from] SupervisorError),
    /// A termination signal came while the binaries were checked.
    #[error("stopped by {signal} while checking {path}; nothing was touched")]
    Interrupted {
        /// The signal.
        signal: Signal,
        /// The binary whose check was awaited.
        path: PathBuf,
    },
}

/// The path of a binary in the bin dir.
pub fn path(bin_dir: &Path, binary: Binary) -> PathBuf {
    bin_dir.join(binary.to_string())
}

/// Every release with an `etcd-<semver>` file in `bin_dir`. Other names
/// (`etcd`, `etcd-migrate`, `etcd-3.5`) are ignored.
pub fn scan(bin_dir: &Path) -> Result<Bundle, BinError> {
    let entries = std::fs::read_dir(bin_dir).map_err(|source| BinError::List {
        dir: bin_dir.to_path_buf(),
        source,
    })?;
    let mut versions = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|source| BinError::List {
            dir: bin_dir.to_path_buf(),
            source,
        })?;
        let name = entry.file_name();
        if let Some(version) = name
            .to_str()
            .and_then(|n| n.strip_prefix("etcd-"))
            .and_then(|v| v.parse().ok())
        {
            versions.push(version);
        }
    }
    Ok(Bundle::new(versions))
}

/// Checks that each binary exists, is a regular file and is executable by
/// us. Cheap (a stat and an access per binary), so it runs before anything
/// is touched, on every path but the no-op.
pub fn check_present(bin_dir: &Path, binaries: &[Binary]) -> Result<(), BinError> {
    for &binary in binaries {
        let path = path(bin_dir, binary);
        let meta = match std::fs::metadata(&path) {
            Ok(meta) => meta,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
                return Err(BinError::Missing { path, binary })
            }
            Err(err) => {
                return Err(BinError::NotExecutable {
                    path,
                    binary,
                    reason: err.to_string(),
                })
            }
        };
        if !meta.is_file() {
            return Err(BinError::NotExecutable {
                path,
                binary,
                reason: "not a regular file".into(),
            });
        }
        if let Err(errno) = access(&path, AccessFlags::X_OK) {
            return Err(BinError::NotExecutable {
                path,
                binary,
                reason: format!("no execute permission: {}", errno.desc()),
            });
        }
    }
    Ok(())
}

/// The etcd flags some releases will run with: the user's (after `--`)
/// for the releases that serve the member, and `ETCD_CREDS` for the etcds
/// the steps run. Each release gets the flags it will run with in its
/// version check, so one that refuses a flag is found before anything
/// starts.
#[derive(Debug, Clone, Copy, Default)]
pub struct RunFlags<'a> {
    /// The user's flags.
    pub args: &'a [String],
    /// The releases that serve the member with them.
    pub releases: &'a [Version],
    /// `ETCD_CREDS`.
    pub step_args: &'a [String],
    /// The releases the steps run with it.
    pub step_releases: &'a [Version],
}

impl RunFlags<'_> {
    /// Whether any release runs with flags of the user's.
    pub fn any(&self) -> bool {
        (!self.args.is_empty() && !self.releases.is_empty())
            || (!self.step_args.is_empty() && !self.step_releases.is_empty())
    }

    /// The flags `binary` is checked with: each set whose releases hold
    /// it, for an etcd server; none for a tool.
    fn for_binary(&self, binary: Binary) -> Vec<String> {
        let mut flags = Vec::new();
        if binary.tool != Tool::Etcd {
            return flags;
        }
        if self.releases.contains(&binary.version) {
            flags.extend_from_slice(self.args);
        }
        if self.step_releases.contains(&binary.version) {
            flags.extend_from_slice(self.step_args);
        }
        flags
    }

    /// Where `binary`'s flags come from, as a clause for the refusal.
    fn whose(&self, binary: Binary) -> String {
        let text = |releases: &[Version]| {
            releases
                .iter()
                .map(Version::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        };
        let mut clauses = Vec::new();
        if !self.args.is_empty() && self.releases.contains(&binary.version) {
            clauses.push(format!(
                "the flags after `--` go to every release that serves this member ({})",
                text(self.releases)
            ));
        }
        if !self.step_args.is_empty() && self.step_releases.contains(&binary.version) {
            clauses.push(format!(
                "ETCD_CREDS (--etcd-server-extra-args) goes to every etcd a step runs ({})",
                text(self.step_releases)
            ));
        }
        clauses.join(", and ")
    }
}

/// What Go's flag package and etcd say of a command line they refuse
/// (before any other output: the parse is etcd's first act).
const FLAG_REFUSALS: [&str; 6] = [
    "flag provided but not defined",
    "invalid value",
    "invalid boolean value",
    "flag needs an argument",
    "bad flag syntax",
    "is not a valid flag",
];

/// The command that makes a binary print its version (an etcd server
/// parsing `flags` first), and the prefix of the line that carries it.
fn version_command(bin_dir: &Path, binary: Binary, flags: &[String]) -> (Command, &'static str) {
    let mut command = Command::new(path(bin_dir, binary));
    command.env_remove("ETCDCTL_API");
    let prefix = match binary.tool {
        Tool::Etcd => {
            // etcd parses every flag before it looks at --version (2.2 …
            // 3.5), and exits on the version without touching anything.
            command.args(flags).arg("--version");
            "etcd Version"
        }
        // etcdctl 3.4+ defaults to the v3 API, whose version command is a
        // subcommand; older ones only know the v2 `--version` flag.
        Tool::Etcdctl if binary.version >= Version::new(3, 4, 0) => {
            command.env("ETCDCTL_API", "3").arg("version");
            "etcdctl version"
        }
        Tool::Etcdctl => {
            command.arg("--version");
            "etcdctl version"
        }
        Tool::Etcdutl => {
            command.arg("version");
            "etcdutl version"
        }
    };
    (command, prefix)
}

/// A version check under way: its process, the output its pipes have
/// given so far, and how many of the two pipes have closed.
struct Check {
    binary: Binary,
    /// The flags it will run with, checked with it (none: a plain
    /// version check).
    flags: Vec<String>,
    prefix: &'static str,
    child: Child,
    output: Arc<Mutex<Vec<u8>>>,
    closed: watch::Receiver<usize>,
}

impl Check {
    fn output(&self) -> String {
        let bytes = self
            .output
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

/// Reads a check's pipe into `output` until it closes, then counts it
/// closed. A process the check left behind may hold the pipe open for
/// ever: nothing waits for this thread, and it ends with the process.
fn capture(mut stream: impl Read, output: Arc<Mutex<Vec<u8>>>, closed: Arc<watch::Sender<usize>>) {
    let mut chunk = [0u8; 4096];
    loop {
        match stream.read(&mut chunk) {
            Ok(0) => break,
            Ok(read) => output
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .extend_from_slice(&chunk[..read]),
            Err(err) if err.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        }
    }
    closed.send_modify(|count| *count += 1);
}

/// Runs every binary's version command at once (they are independent) and
/// checks each reports the release its name claims. Every wait has a
/// deadline that does not hang on a pipe: a check's output is taken when
/// its process has exited and its pipes closed, or [`OUTPUT_GRACE`] after
/// the exit (a process it left behind holds them; its process group is
/// killed). A check that does not exit within [`VERSION_CHECK_TIMEOUT`] is
/// killed with its group. A termination signal (`termination` turning
/// `Some`) kills every check's group and returns
/// [`BinError::Interrupted`] at once.
pub async fn verify_reported_versions(
    supervisor: &Supervisor,
    bin_dir: &Path,
    binaries: &[Binary],
    run_flags: RunFlags<'_>,
    termination: watch::Receiver<Option<Signal>>,
) -> Result<(), BinError> {
    verify_reported_versions_after(None, supervisor, bin_dir, binaries, run_flags, termination)
        .await
}

/// [`verify_reported_versions`], taking over the checks `early` began
/// where one is the same command (the binary with the same flags): begun
/// before the data was read offline, for the plan `version.txt` alone
/// gives, they ran while it was read. The rest start now; those of
/// `early` the run does not need are killed.
pub async fn verify_reported_versions_after(
    early: Option<EarlyChecks>,
    supervisor: &Supervisor,
    bin_dir: &Path,
    binaries: &[Binary],
    run_flags: RunFlags<'_>,
    termination: watch::Receiver<Option<Signal>>,
) -> Result<(), BinError> {
    let deadline = tokio::time::Instant::now() + VERSION_CHECK_TIMEOUT;
    let mut early = early.map_or_else(Vec::new, |mut early| std::mem::take(&mut early.checks));
    let mut checks = Vec::new();
    for &binary in binaries {
        let flags = run_flags.for_binary(binary);
        if let Some(i) = early
            .iter()
            .position(|c| c.binary == binary && c.flags == flags)
        {
            checks.push(early.swap_remove(i));
            continue;
        }
        match start_check(supervisor, bin_dir, binary, flags) {
            Ok(check) => checks.push(check),
            Err(err) => {
                kill_groups(&mut checks);
                kill_groups(&mut early);
                return Err(err);
            }
        }
    }
    kill_groups(&mut early);
    let mut first_error = None;
    for i in 0..checks.len() {
        let result = {
            let mut termination = termination.clone();
            let check = &mut checks[i];
            tokio::select! {
                biased;
                signal = termination.wait_for(Option::is_some) => match signal.ok().and_then(|s| *s) {
                    Some(signal) => Err(signal),
                    // No sender, no signal can come: just finish the check.
                    None => Ok(finish(check, bin_dir, deadline, &run_flags).await),
                },
                outcome = finish(check, bin_dir, deadline, &run_flags) => Ok(outcome),
            }
        };
        match result {
            Ok(Ok(())) => {}
            Ok(Err(err)) => {
                first_error.get_or_insert(err);
            }
            Err(signal) => {
                kill_groups(&mut checks);
                return Err(BinError::Interrupted {
                    signal,
                    path: path(bin_dir, checks[i].binary),
                });
            }
        }
    }
    first_error.map_or(Ok(()), Err)
}

/// Starts one version check: `binary`'s version command with `flags`,
/// its output captured by two threads.
fn start_check(
    supervisor: &Supervisor,
    bin_dir: &Path,
    binary: Binary,
    flags: Vec<String>,
) -> Result<Check, BinError> {
    let (mut command, prefix) = version_command(bin_dir, binary, &flags);
    command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = supervisor.spawn(&mut command)?;
    let output = Arc::new(Mutex::new(Vec::new()));
    let (closed_sender, closed) = watch::channel(0usize);
    let closed_sender = Arc::new(closed_sender);
    for stream in child.take_output() {
        let output = Arc::clone(&output);
        let closed = Arc::clone(&closed_sender);
        std::thread::spawn(move || capture(stream, output, closed));
    }
    Ok(Check {
        binary,
        flags,
        prefix,
        child,
        output,
        closed,
    })
}

/// Version checks begun before the run knows its plan for sure (see
/// [`verify_reported_versions_after`]); the processes run on their own
/// meanwhile. Dropped unused, they are killed with their groups.
pub struct EarlyChecks {
    checks: Vec<Check>,
}

impl EarlyChecks {
    /// Starts the checks of `binaries`, each with the flags `run_flags`
    /// gives it; `None` if one cannot start (the real check says why).
    pub fn start(
        supervisor: &Supervisor,
        bin_dir: &Path,
        binaries: &[Binary],
        run_flags: RunFlags<'_>,
    ) -> Option<EarlyChecks> {
        let mut early = EarlyChecks { checks: Vec::new() };
        for &binary in binaries {
            let check =
                start_check(supervisor, bin_dir, binary, run_flags.for_binary(binary)).ok()?;
            early.checks.push(check);
        }
        Some(early)
    }

    /// How many checks are under way.
    pub fn len(&self) -> usize {
        self.checks.len()
    }

    /// True when none is.
    pub fn is_empty(&self) -> bool {
        self.checks.is_empty()
    }
}

impl Drop for EarlyChecks {
    fn drop(&mut self) {
        kill_groups(&mut self.checks);
    }
}

/// Kills what is left of every check: its process and anything it left in
/// its process group.
fn kill_groups(checks: &mut [Check]) {
    for check in checks {
        check.child.kill_group();
    }
}

/// Waits for one check (its exit by `deadline`, then its output) and
/// judges what it reported.
async fn finish(
    check: &mut Check,
    bin_dir: &Path,
    deadline: tokio::time::Instant,
    run_flags: &RunFlags<'_>,
) -> Result<(), BinError> {
    let path = path(bin_dir, check.binary);
    let status = match tokio::time::timeout_at(deadline, check.child.wait()).await {
        Ok(status) => status,
        Err(_) => {
            check.child.kill_group();
            check.child.kill().await?;
            return Err(BinError::NoVersion {
                path,
                binary: check.binary,
                reason: format!(
                    "no answer within {VERSION_CHECK_TIMEOUT:?}; it was killed with its process group"
                ),
            });
        }
    };
    let closed = |count: &usize| *count == 2;
    if tokio::time::timeout(OUTPUT_GRACE, check.closed.wait_for(closed))
        .await
        .is_err()
    {
        // It exited, but something it started holds its output open: the
        // answer is in, the rest is not ours to wait for.
        check.child.kill_group();
        log::warn(
            "a version check left a process holding its output; killed its process group",
            &[
                ("binary", path.display().to_string().into()),
                ("pid", check.child.pid().into()),
            ],
        );
        // The group's SIGKILL closes the pipes; a process that left the
        // group keeps them, and its output is not waited for.
        let _ = tokio::time::timeout(OUTPUT_GRACE, check.closed.wait_for(closed)).await;
    }
    let output = check.output();
    if !check.flags.is_empty() {
        refused_flags(&path, check.binary, &output, &run_flags.whose(check.binary))?;
    }
    check_reported(&path, check.binary, check.prefix, status, &output)
}

/// The refusal of the flags a release was checked with, if its output
/// opens with one (etcd parses them before it prints anything else).
fn refused_flags(path: &Path, binary: Binary, output: &str, whose: &str) -> Result<(), BinError> {
    let refusal = output
        .lines()
        .find(|line| FLAG_REFUSALS.iter().any(|r| line.contains(r)));
    match refusal {
        Some(line) => Err(BinError::RefusesFlags {
            path: path.to_path_buf(),
            version: binary.version,
            refusal: line.trim().to_string(),
            advice: crate::dialect::removed_flag_advice(line, binary.version)
                .map(|advice| format!("{advice}; "))
                .unwrap_or_default(),
            whose: whose.to_string(),
        }),
        None => Ok(()),
    }
}

fn check_reported(
    path: &Path,
    binary: Binary,
    prefix: &str,
    status: crate::supervisor::ExitStatus,
    output: &str,
) -> Result<(), BinError> {
    // "etcdctl version: 3.3.25" (3.x), but "etcdctl version 2.2.1" (2.x,
    // whose CLI library prints its default format): the colon is optional.
    let reported = output
        .lines()
        .find_map(|line| line.trim().strip_prefix(prefix))
        .map(|rest| rest.trim_start_matches(':').trim());
    match reported {
        Some(reported) if reported == binary.version.to_string() => Ok(()),
        Some(reported) => Err(BinError::WrongVersion {
            path: path.to_path_buf(),
            binary,
            expected: binary.version,
            reported: reported.to_string(),
        }),
        None => {
            let first = output.lines().next().unwrap_or("no output");
            Err(BinError::NoVersion {
                path: path.to_path_buf(),
                binary,
                reason: format!("{status}, no {prefix:?} line; first line: {first:?}"),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::supervisor::ExitStatus;
    use std::os::unix::fs::PermissionsExt;

    fn binary(s: &str) -> Binary {
        Binary::etcd(s.parse().expect("version"))
    }

    #[test]
    fn scan_finds_only_versioned_servers() {
        let tmp = tempfile::tempdir().expect("tempdir");
        for name in [
            "etcd-3.4.23",
            "etcdctl-3.4.23",
            "etcd-3.5.16",
            "etcd",
            "etcd-migrate",
            "etcd-3.5",
            "etcd-3.5.1-rc",
        ] {
            std::fs::write(tmp.path().join(name), "").expect("write");
        }
        let bundle = scan(tmp.path()).expect("scans");
        assert_eq!(bundle.to_string(), "3.4.23, 3.5.16");
        let err = scan(&tmp.path().join("nope")).expect_err("missing dir");
        assert!(err.to_string().starts_with("cannot list bin dir"), "{err}");
    }

    /// etcd's own words for a refused flag (3.4.23 on `--ca-file`, Go's
    /// flag package on a bad value, etcd on a stray argument) are a
    /// refusal naming the release and the flag; a version answer is not.
    #[test]
    fn a_release_refusing_the_flags_is_named_with_its_words() {
        let path = Path::new("/usr/local/bin/etcd-3.4.23");
        let refused = "flag provided but not defined: -ca-file\nUsage:\n\n  etcd [flags]\n";
        let err = refused_flags(
            path,
            binary("3.4.23"),
            refused,
            "the flags after `--` go to every release that serves this member (3.3.25, 3.4.23, 3.5.16)",
        )
        .expect_err("refused");
        let text = err.to_string();
        for part in [
            "/usr/local/bin/etcd-3.4.23 (etcd 3.4.23) refuses",
            "flag provided but not defined: -ca-file",
            "(3.3.25, 3.4.23, 3.5.16)",
            "nothing was started",
        ] {
            assert!(text.contains(part), "{part:?} in {text}");
        }
        for words in [
            "invalid value \"x\" for flag -snapshot-count: parse error",
            "flag needs an argument: -name",
            "'stray' is not a valid flag",
        ] {
            assert!(
                refused_flags(path, binary("3.4.23"), words, "").is_err(),
                "{words}"
            );
        }
        let answered = "etcd Version: 3.4.23\nGit SHA: Not provided\nGo Version: go1.19\n";
        refused_flags(path, binary("3.4.23"), answered, "").expect("a version answer");
        // Only the etcd servers of the releases that run with the flags get
        // them; tools and other releases are checked bare.
        let args = vec!["--ca-file=/ca.crt".to_string()];
        let releases = [v("3.4.23")];
        let creds = vec!["--debug".to_string()];
        let steps = [v("3.3.25"), v("3.4.23")];
        let flags = RunFlags {
            args: &args,
            releases: &releases,
            step_args: &creds,
            step_releases: &steps,
        };
        assert_eq!(
            flags.for_binary(binary("3.4.23")),
            ["--ca-file=/ca.crt", "--debug"]
        );
        assert_eq!(flags.for_binary(binary("3.3.25")), ["--debug"]);
        assert!(flags.for_binary(binary("3.5.16")).is_empty());
        assert!(flags.whose(binary("3.3.25")).starts_with("ETCD_CREDS"));
        assert!(flags.whose(binary("3.4.23")).contains("after `--`"));
        assert!(flags.whose(binary("3.4.23")).contains("ETCD_CREDS"));
        assert!(flags
            .for_binary(Binary {
                tool: Tool::Etcdctl,
                version: v("3.4.23")
            })
            .is_empty());
    }

    fn v(s: &str) -> Version {
        s.parse().expect("version")
    }

    #[test]
    fn presence_check_names_the_binary_and_the_problem() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let err = check_present(tmp.path(), &[binary("3.4.23")]).expect_err("missing");
        assert!(err.to_string().contains("etcd-3.4.23 is missing"), "{err}");
        let file = tmp.path().join("etcd-3.4.23");
        std::fs::write(&file, "#!/bin/sh\n").expect("write");
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        let err = check_present(tmp.path(), &[binary("3.4.23")]).expect_err("not executable");
        assert!(
            err.to_string().contains("is not an executable file"),
            "{err}"
        );
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        check_present(tmp.path(), &[binary("3.4.23")]).expect("present");
    }

    #[test]
    fn reported_versions_are_compared_exactly() {
        let path = Path::new("/bin/etcd-3.4.23");
        let ok = "etcd Version: 3.4.23\nGit SHA: Not provided\n";
        check_reported(
            path,
            binary("3.4.23"),
            "etcd Version",
            ExitStatus::Exited(0),
            ok,
        )
        .expect("matches");
        let err = check_reported(
            path,
            binary("3.4.23"),
            "etcd Version",
            ExitStatus::Exited(0),
            "etcd Version: 3.4.2\n",
        )
        .expect_err("wrong");
        assert!(
            err.to_string()
                .contains("reports version 3.4.2, not 3.4.23"),
            "{err}"
        );
        let etcdctl_2 = Binary::etcdctl("2.2.1".parse().expect("version"));
        check_reported(
            path,
            etcdctl_2,
            "etcdctl version",
            ExitStatus::Exited(0),
            "etcdctl version 2.2.1\n",
        )
        .expect("2.x etcdctl prints no colon");
        let err = check_reported(
            path,
            binary("3.4.23"),
            "etcd Version",
            ExitStatus::Exited(2),
            "flag provided but not defined\n",
        )
        .expect_err("none");
        assert!(
            err.to_string().contains("did not report its version"),
            "{err}"
        );
    }
}
