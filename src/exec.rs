//! This module owns the hand-over: building the target etcd's command line
//! from the user's arguments and replacing this process with it, with the
//! original signal mask restored.

use std::ffi::CString;
use std::path::PathBuf;

use nix::sys::signal::{self, SigSet, SigmaskHow, Signal};

use crate::config::data_dir_in_args;
use crate::supervisor;

/// Variables that configure etcd-migrate and mean nothing (or something
/// else) to etcd.
const OUR_ETCD_VARS: [&str; 3] = ["ETCD_CREDS", "ETCD_DATA_PREFIX", "ETCD_HOSTNAME"];

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

    /// Our environment minus the variables that configured etcd-migrate
    /// and that etcd would misread: it reads every `ETCD_*` as a flag,
    /// warns about unknown ones, and refuses to start when one shadows a
    /// flag on the command line (`ETCD_NAME` next to `--name`).
    fn environment(&self) -> Result<Vec<CString>, ExecError> {
        let sets_name = self.args.iter().any(|a| {
            a.starts_with('-') && a.trim_start_matches('-').split('=').next() == Some("name")
        });
        let mut envp = Vec::new();
        for (key, value) in std::env::vars_os() {
            let key_text = key.to_string_lossy().into_owned();
            if OUR_ETCD_VARS.contains(&key_text.as_str()) || (sets_name && key_text == "ETCD_NAME")
            {
                continue;
            }
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

    /// Replaces this process with the target etcd. Returns only on failure.
    pub fn exec(&self, original_mask: SigSet) -> ExecError {
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
        // A blocked mask survives execve: without this etcd would never see
        // SIGTERM and `docker stop` would end in SIGKILL.
        if let Err(errno) = signal::sigprocmask(SigmaskHow::SIG_SETMASK, Some(&original_mask), None)
        {
            return ExecError::Exec {
                program: self.program.clone(),
                source: errno,
            };
        }
        let envp = match self.environment() {
            Ok(envp) => envp,
            Err(err) => return err,
        };
        let errno = match nix::unistd::execve(&program, &argv, &envp) {
            Err(errno) => errno,
            Ok(never) => match never {},
        };
        // Block again so the caller's exit path runs as before.
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
