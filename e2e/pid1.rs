//! Runs as PID 1: etcd-migrate started as the first process of a new PID
//! namespace (as in a container) must reap orphaned grandchildren that the
//! kernel re-parents to it while it runs a step.

use std::process::{Command, Stdio};

use crate::harness::fixture::{self, FixtureSpec};
use crate::harness::migrator::Migration;
use crate::harness::{
    etcd_binary, install_script, read_version_txt, symlink, temp_dir, wait_until, Member,
    MIGRATE_TIMEOUT,
};

#[test]
fn orphans_are_reaped_while_pid_1() {
    let tmp = temp_dir("pid1");
    let data = tmp.path().join("data");
    let member = Member::new("pid1");
    fixture::build(FixtureSpec::small("3.3.25"), &data, &member, tmp.path());

    // A bin dir whose etcd-3.4.23 leaves an orphan behind: the subshell
    // exits at once, so its short sleep is re-parented to PID 1 and exits
    // while the step's etcd is still starting.
    let bin = tmp.path().join("bin");
    std::fs::create_dir(&bin).expect("mkdir bin");
    symlink(&etcd_binary("3.3.25"), &bin.join("etcd-3.3.25"));
    let real = etcd_binary("3.4.23");
    install_script(
        &bin.join("etcd-3.4.23"),
        &format!(
            "#!/bin/sh\n[ \"$1\" = --version ] && exec {real} --version\n( sleep 0.05 & )\nexec {real} \"$@\"\n",
            real = real.display()
        ),
    );

    let migration = Migration::new("3.4.23", &data, &member)
        .bin_dir(&bin)
        .bundled("3.3.25,3.4.23");
    let inner = migration.command();
    let mut command = Command::new("unshare");
    command
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .args(["--pid", "--fork", "--kill-child"])
        .arg(inner.get_program())
        .args(inner.get_args())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = command
        .spawn()
        .unwrap_or_else(|err| panic!("run unshare (root is needed for a PID namespace): {err}"));
    let status = wait_until("etcd-migrate as PID 1 to finish", MIGRATE_TIMEOUT, || {
        child.try_wait().ok().flatten()
    });
    let output = child.wait_with_output().expect("collect output");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(status.success(), "exit {status}; stderr:\n{stderr}");
    assert_eq!(read_version_txt(&data), "3.4.23/etcd3");
    let reaped: Vec<&str> = stderr
        .lines()
        .filter(|line| line.starts_with("[etcd-migrate] ") && line.contains(" reaped orphan "))
        .collect();
    assert!(
        !reaped.is_empty(),
        "no orphan was reaped by PID 1; stderr:\n{stderr}"
    );
    assert!(
        reaped
            .iter()
            .all(|line| line.contains("status=\"exit code 0\"")),
        "{reaped:?}"
    );
}
