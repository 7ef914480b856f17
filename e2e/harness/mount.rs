//! This module owns the filesystems a test mounts for itself (a small
//! tmpfs to fill, a bind of a dir, read-only or a second mount of its
//! filesystem): mounting them as root,
//! and unmounting them when the guard drops, lazily if a process of a
//! failed test still holds them.

use std::path::{Path, PathBuf};
use std::process::Command;

/// A filesystem mounted for one test, unmounted when dropped.
#[derive(Debug)]
pub struct Mount {
    /// Where it is mounted.
    pub path: PathBuf,
}

impl Mount {
    /// A tmpfs with `options` (e.g. `size=80m`, `nr_inodes=5`) at `path`,
    /// which is created if missing.
    pub fn tmpfs(path: &Path, options: &str) -> Mount {
        mkdir(path);
        run_mount(&["-t", "tmpfs", "-o", options, "tmpfs"], path);
        Mount {
            path: path.to_path_buf(),
        }
    }

    /// `source` bound at `path` (created if missing): the same filesystem
    /// at a second mount point, where `link(2)` from the first fails with
    /// EXDEV although both report one device.
    pub fn bind(source: &Path, path: &Path) -> Mount {
        mkdir(path);
        run_mount(&["--bind", &source.display().to_string()], path);
        Mount {
            path: path.to_path_buf(),
        }
    }

    /// `source` bound read-only at `path`, which is created if missing.
    pub fn read_only_bind(source: &Path, path: &Path) -> Mount {
        mkdir(path);
        run_mount(&["--bind", &source.display().to_string()], path);
        // The guard first, so a failed remount still unmounts the bind.
        let mount = Mount {
            path: path.to_path_buf(),
        };
        run_mount(&["-o", "remount,bind,ro"], path);
        mount
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let unmounted = Command::new("umount")
            .arg(&self.path)
            .status()
            .is_ok_and(|status| status.success());
        if !unmounted {
            // Busy (a process of a failed test still in it): detach it so
            // the temp dir can still be removed.
            let _ = Command::new("umount").arg("-l").arg(&self.path).status();
        }
    }
}

fn mkdir(path: &Path) {
    std::fs::create_dir_all(path).unwrap_or_else(|err| panic!("mkdir {}: {err}", path.display()));
}

/// `mount <args> <path>`; fails the test with mount's own words.
fn run_mount(args: &[&str], path: &Path) {
    let output = Command::new("mount")
        .args(args)
        .arg(path)
        .output()
        .unwrap_or_else(|err| panic!("run mount: {err}"));
    assert!(
        output.status.success(),
        "mount {args:?} {} failed (the e2e tests run as root with CAP_SYS_ADMIN): {}",
        path.display(),
        String::from_utf8_lossy(&output.stderr)
    );
}
