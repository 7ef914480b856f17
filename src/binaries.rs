//! This module owns the bin dir: which releases it bundles (`etcd-<semver>`
//! files), whether each binary a plan needs is there and executable, and
//! whether each reports the release its name claims.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use nix::unistd::{access, AccessFlags};

use crate::plan::{Binary, Bundle, Tool};
use crate::supervisor::{Supervisor, SupervisorError};
use crate::version::Version;

/// How long `<binary> version` may take. A Go binary answers in ~10 ms;
/// 20 s covers a cold page cache on a slow disk.
pub const VERSION_CHECK_TIMEOUT: Duration = Duration::from_secs(20);

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
    /// The check process could not be run.
    #[error(transparent)]
    Supervisor(#[from] SupervisorError),
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

/// The command that makes a binary print its version, and the prefix of
/// the line that carries it.
fn version_command(bin_dir: &Path, binary: Binary) -> (Command, &'static str) {
    let mut command = Command::new(path(bin_dir, binary));
    command.env_remove("ETCDCTL_API");
    let prefix = match binary.tool {
        Tool::Etcd => {
            command.arg("--version");
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

/// Runs every binary's version command at once (they are independent) and
/// checks each reports the release its name claims.
pub async fn verify_reported_versions(
    supervisor: &Supervisor,
    bin_dir: &Path,
    binaries: &[Binary],
) -> Result<(), BinError> {
    let mut running = Vec::new();
    for &binary in binaries {
        let (mut command, prefix) = version_command(bin_dir, binary);
        command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = supervisor.spawn(&mut command)?;
        let stdout = child.stdout.take();
        let stderr = child.stderr.take();
        let reader = std::thread::spawn(move || {
            let mut text = String::new();
            for stream in [
                stdout.map(|s| Box::new(s) as Box<dyn Read + Send>),
                stderr.map(|s| Box::new(s) as Box<dyn Read + Send>),
            ]
            .into_iter()
            .flatten()
            {
                let mut bytes = Vec::new();
                let mut stream = stream;
                let _ = stream.read_to_end(&mut bytes);
                text.push_str(&String::from_utf8_lossy(&bytes));
            }
            text
        });
        running.push((binary, prefix, child, reader));
    }
    let mut first_error = None;
    for (binary, prefix, mut child, reader) in running {
        let path = path(bin_dir, binary);
        let status = match tokio::time::timeout(VERSION_CHECK_TIMEOUT, child.wait()).await {
            Ok(status) => status,
            Err(_) => {
                child.kill().await?;
                first_error.get_or_insert(BinError::NoVersion {
                    path,
                    binary,
                    reason: format!("no answer within {VERSION_CHECK_TIMEOUT:?}"),
                });
                continue;
            }
        };
        let output = reader.join().unwrap_or_default();
        if let Err(err) = check_reported(&path, binary, prefix, status, &output) {
            first_error.get_or_insert(err);
        }
    }
    first_error.map_or(Ok(()), Err)
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
