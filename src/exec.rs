//! This module owns the hand-over: building the target etcd's command line
//! from the user's arguments and replacing this process with it, with what
//! `main` changed about the process at start (the signal mask, the umask)
//! given back.

use std::ffi::CString;
use std::path::PathBuf;

use nix::sys::signal::{self, SigSet, SigmaskHow, Signal};
use nix::sys::stat::{self, Mode};

use crate::config::data_dir_in_args;
use crate::supervisor;
use crate::version::Version;

/// Variables that configure etcd-migrate and mean nothing (or something
/// else) to etcd.
const OUR_ETCD_VARS: [&str; 3] = ["ETCD_CREDS", "ETCD_DATA_PREFIX", "ETCD_HOSTNAME"];

/// The umask of the whole run: group and other get nothing on any file or
/// dir that we, or the etcd, etcdctl and etcdutl we start, create. The data,
/// its backups and the scratch copies hold every key of the cluster, and
/// etcd leaves some modes to the umask (it writes `member/snap/*.snap` with
/// 0666).
pub const RUN_UMASK: u32 = 0o077;

/// Sets [`RUN_UMASK`] for the whole process and returns the umask it
/// replaced, for [`ExecTarget::exec`] to give back. Call first in `main`,
/// before anything is created.
pub fn make_created_files_private() -> Mode {
    stat::umask(Mode::from_bits_truncate(RUN_UMASK))
}

/// What the process had when it started and the target etcd gets back at
/// exec, so that it runs as if it had been started directly.
#[derive(Debug, Clone, Copy)]
pub struct Inherited {
    /// The signal mask before `main` blocked the handled signals.
    pub signal_mask: SigSet,
    /// The umask before `main` set [`RUN_UMASK`].
    pub umask: Mode,
}

/// The process that replaces us.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecTarget {
    /// `<bin-dir>/etcd-<target>`.
    pub program: PathBuf,
    /// Its arguments, without the program name.
    pub args: Vec<String>,
}

/// Why the hand-over did not happen.
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    /// A termination signal was pending: stop instead of starting etcd.
    #[error("stopped by {0} before exec")]
    Interrupted(Signal),
    /// An argument holds a NUL byte.
    #[error("etcd argument {0:?} contains a NUL byte")]
    Nul(String),
    /// execve failed.
    #[error("cannot exec {program}: {source}")]
    Exec {
        /// The program.
        program: PathBuf,
        /// The OS error.
        #[source]
        source: nix::errno::Errno,
    },
}

impl ExecTarget {
    /// The user's arguments, plus `--data-dir` when they set none (and the
    /// environment does not either: etcd refuses a flag that shadows its
    /// `ETCD_DATA_DIR`), plus client URLs from `LISTEN_CLIENT_URLS` when
    /// given and the arguments set none.
    pub fn new(
        program: PathBuf,
        user_args: &[String],
        data_dir: &str,
        listen_client_urls: Option<&str>,
        env_has_data_dir: bool,
    ) -> Self {
        let mut args = user_args.to_vec();
        if data_dir_in_args(user_args).is_none() && !env_has_data_dir {
            args.push(format!("--data-dir={data_dir}"));
        }
        let sets = |flag: &str| {
            user_args.iter().any(|a| {
                a.trim_start_matches('-').split('=').next() == Some(flag) && a.starts_with('-')
            })
        };
        if let Some(urls) = listen_client_urls {
            if !sets("listen-client-urls") {
                args.push(format!("--listen-client-urls={urls}"));
                if !sets("advertise-client-urls") {
                    args.push(format!("--advertise-client-urls={urls}"));
                }
            }
        }
        ExecTarget { program, args }
    }

    /// The same, with what `release` needs on data a migration may have
    /// left: a 3.4.31+ target reads the 3.5 schema a downgrade from 3.5
    /// leaves only with `--next-cluster-version-compatible` (refused
    /// without it, measured on 3.4.45; harmless on 3.4's own data), so it
    /// is added unless the arguments or the environment set it.
    pub fn for_release(mut self, release: Version) -> Self {
        let flag = "next-cluster-version-compatible";
        let set = self.args.iter().any(|a| {
            a.starts_with('-') && a.trim_start_matches('-').split('=').next() == Some(flag)
        }) || std::env::var_os("ETCD_NEXT_CLUSTER_VERSION_COMPATIBLE").is_some();
        if release.reads_next_minor_schema() && !set {
            self.args.push(format!("--{flag}"));
        }
        self
    }

    /// Our environment minus the variables that configured etcd-migrate
    /// and that etcd would misread: it reads every `ETCD_*` as a flag,
    /// warns about unknown ones, and refuses to start when one shadows a
    /// flag on the command line (`ETCD_NAME` next to `--name`).
    fn kept_environment(&self) -> Vec<(std::ffi::OsString, std::ffi::OsString)> {
        let sets = |flag: &str| {
            self.args.iter().any(|a| {
                a.starts_with('-') && a.trim_start_matches('-').split('=').next() == Some(flag)
            })
        };
        let (sets_name, sets_cluster) = (sets("name"), sets("initial-cluster"));
        let sets_state = sets("initial-cluster-state");
        std::env::vars_os()
            .filter(|(key, _)| {
                let key = key.to_string_lossy();
                !(OUR_ETCD_VARS.contains(&key.as_ref())
                    || (sets_name && key == "ETCD_NAME")
                    || (sets_cluster && key == "ETCD_INITIAL_CLUSTER")
                    || (sets_state && key == "ETCD_INITIAL_CLUSTER_STATE"))
            })
            .collect()
    }

    /// [`Self::kept_environment`] as execve wants it.
    fn environment(&self) -> Result<Vec<CString>, ExecError> {
        let mut envp = Vec::new();
        for (key, value) in self.kept_environment() {
            let key_text = key.to_string_lossy().into_owned();
            let mut entry = key.into_encoded_bytes();
            entry.push(b'=');
            entry.extend_from_slice(value.as_encoded_bytes());
            match CString::new(entry) {
                Ok(entry) => envp.push(entry),
                Err(_) => return Err(ExecError::Nul(key_text)),
            }
        }
        Ok(envp)
    }

    /// The same program, arguments and environment as a command to spawn
    /// (the cluster mode's supervised member etcd), instead of an exec.
    pub fn command(&self) -> std::process::Command {
        let mut command = std::process::Command::new(&self.program);
        command
            .args(&self.args)
            .env_clear()
            .envs(self.kept_environment());
        command
    }

    /// Replaces this process with the target etcd, which gets back the
    /// signal mask and the umask `inherited` holds. Returns only on failure.
    pub fn exec(&self, inherited: Inherited) -> ExecError {
        // A stop request that came while we were migrating is honoured, not
        // passed on to an etcd that was never meant to start.
        if let Some(sig) = supervisor::take_pending_termination() {
            return ExecError::Interrupted(sig);
        }
        crate::failpoint!("before-exec");
        let program = match CString::new(self.program.as_os_str().as_encoded_bytes()) {
            Ok(program) => program,
            Err(_) => return ExecError::Nul(self.program.display().to_string()),
        };
        let mut argv = vec![program.clone()];
        for arg in &self.args {
            match CString::new(arg.as_bytes()) {
                Ok(arg) => argv.push(arg),
                Err(_) => return ExecError::Nul(arg.clone()),
            }
        }
        let envp = match self.environment() {
            Ok(envp) => envp,
            Err(err) => return err,
        };
        // A blocked mask survives execve: without this etcd would never see
        // SIGTERM and `docker stop` would end in SIGKILL.
        if let Err(errno) =
            signal::sigprocmask(SigmaskHow::SIG_SETMASK, Some(&inherited.signal_mask), None)
        {
            return ExecError::Exec {
                program: self.program.clone(),
                source: errno,
            };
        }
        // The umask survives execve too: the target creates its files as
        // the user's umask says, as it would if started directly.
        stat::umask(inherited.umask);
        let errno = match nix::unistd::execve(&program, &argv, &envp) {
            Err(errno) => errno,
            Ok(never) => match never {},
        };
        // Back to the run's state, so the caller's exit path runs as before.
        make_created_files_private();
        let _ = signal::sigprocmask(
            SigmaskHow::SIG_BLOCK,
            Some(&supervisor::handled_signals()),
            None,
        );
        ExecError::Exec {
            program: self.program.clone(),
            source: errno,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Where [`exec_child`] has the exec'd shell write what it inherited.
    const PROBE_ENV: &str = "ETCD_MIGRATE_EXEC_PROBE";

    /// A umask no test runner starts with, standing for the user's.
    const USER_UMASK: u32 = 0o027;

    /// A child process does what `main` does (a user umask, then the run's
    /// umask and the blocked signals) and execs a shell through
    /// [`ExecTarget::exec`]; the shell reports its umask and blocked mask.
    #[test]
    fn the_exec_gives_the_target_the_original_umask_and_signal_mask() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let probe = tmp.path().join("inherited");
        let exe = std::env::current_exe().expect("test exe");
        let output = std::process::Command::new(&exe)
            .args([
                "--exact",
                "exec::tests::exec_child",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(PROBE_ENV, &probe)
            .output()
            .expect("run the exec child");
        assert!(
            output.status.success(),
            "exec child failed with {}: {}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
        let report = std::fs::read_to_string(&probe)
            .unwrap_or_else(|err| panic!("read {}: {err}", probe.display()));
        let mut lines = report.lines();
        assert_eq!(
            lines.next(),
            Some(format!("{USER_UMASK:04o}").as_str()),
            "umask of the exec'd target; report: {report:?}"
        );
        let blocked = lines
            .next()
            .and_then(|line| line.strip_prefix("SigBlk:"))
            .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
            .unwrap_or_else(|| panic!("no SigBlk line in {report:?}"));
        for sig in supervisor::handled_signals().iter() {
            assert_eq!(
                blocked & (1 << (sig as u32 - 1)),
                0,
                "{sig} is still blocked in the exec'd target (SigBlk {blocked:x})"
            );
        }
    }

    /// Not a test on its own: the process that execs, for
    /// [`the_exec_gives_the_target_the_original_umask_and_signal_mask`].
    #[test]
    #[ignore = "run by the_exec_gives_the_target_the_original_umask_and_signal_mask"]
    fn exec_child() {
        let Some(probe) = std::env::var_os(PROBE_ENV) else {
            return;
        };
        stat::umask(Mode::from_bits_truncate(USER_UMASK));
        let umask = make_created_files_private();
        // pthread_sigmask, like main: this test thread is the one that execs.
        let signal_mask = supervisor::block_signals().expect("block signals");
        let blocked = SigSet::thread_get_mask().expect("mask");
        assert!(
            blocked.contains(Signal::SIGTERM),
            "SIGTERM is blocked first"
        );
        let script = r#"umask > "$1"; exec grep SigBlk /proc/self/status >> "$1""#;
        let target = ExecTarget {
            program: PathBuf::from("/bin/sh"),
            args: vec![
                "-c".to_string(),
                script.to_string(),
                "sh".to_string(),
                probe.to_string_lossy().into_owned(),
            ],
        };
        let err = target.exec(Inherited { signal_mask, umask });
        panic!("exec /bin/sh failed: {err}");
    }

    fn args(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn data_dir_is_added_only_when_missing() {
        let p = PathBuf::from("/usr/local/bin/etcd-3.5.16");
        let t = ExecTarget::new(p.clone(), &args(&["--name", "m"]), "/data", None, false);
        assert_eq!(t.args, args(&["--name", "m", "--data-dir=/data"]));
        let t = ExecTarget::new(
            p.clone(),
            &args(&["--data-dir", "/data"]),
            "/data",
            None,
            false,
        );
        assert_eq!(t.args, args(&["--data-dir", "/data"]));
        let t = ExecTarget::new(p, &args(&[]), "/data", None, true);
        assert!(
            t.args.is_empty(),
            "ETCD_DATA_DIR in the environment already says it"
        );
    }

    #[test]
    fn listen_client_urls_fill_in_only_what_the_args_lack() {
        let p = PathBuf::from("/usr/local/bin/etcd-3.5.16");
        let t = ExecTarget::new(
            p.clone(),
            &args(&[]),
            "/d",
            Some("http://127.0.0.1:2379"),
            false,
        );
        assert_eq!(
            t.args,
            args(&[
                "--data-dir=/d",
                "--listen-client-urls=http://127.0.0.1:2379",
                "--advertise-client-urls=http://127.0.0.1:2379"
            ])
        );
        let t = ExecTarget::new(
            p,
            &args(&["--listen-client-urls=http://0.0.0.0:2379"]),
            "/d",
            Some("http://127.0.0.1:2379"),
            false,
        );
        assert_eq!(
            t.args,
            args(&["--listen-client-urls=http://0.0.0.0:2379", "--data-dir=/d"])
        );
    }
}
