//! Container end-to-end tests of the multi-version image (issue 4): the real
//! image, real etcd, real `docker run` / `docker stop`, as root on the
//! Docker host. `make image-test` builds the image and runs them:
//!
//!     cargo test --test image-tests -- --ignored --test-threads=1
//!
//! with `IMAGE` (default `etcd-migrate:dev`) and `BASEIMAGE` (the base a
//! test image built from a tarball/dir bundle uses; that part is skipped
//! when it is missing). Each test is `#[ignore]`d, with the reason, so a
//! plain `cargo test --all-targets` (which has no image) skips them.
//!
//! Needs root (the tests chown volumes and read files etcd wrote), docker
//! and python3 (image-tests/pod2docker.py turns the example manifests into
//! `docker run`s); openssl, curl and PyYAML (for the kubeadm YAML) are
//! installed from Debian's packages when missing.
//!
//! Every container, network and image a test makes carries its own label
//! (`io.etcd-migrate.image-test=<test>-<random>`) or name, and every dir
//! lives under its own work dir; a Drop guard removes all of it when the
//! test ends, also when it fails. Every wait has a deadline.
//!
//! - `harness`: the e2e harness (e2e/harness): the data-dir tree
//!   fingerprint, the keyspace comparison, the test ports.
//! - `support`: the image, docker and etcdctl in containers, the waits,
//!   seeding a data dir, reading a container's keyspace.

#[allow(dead_code, unused_imports)]
#[path = "../e2e/harness/mod.rs"]
mod harness;
mod support;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use harness::tree::fingerprint;
use support::*;

/// The image's layout: versioned binaries, the newest-release names, the
/// wrappers and the entrypoint.
#[test]
#[ignore = "needs the image built by `make image` and root: run by `make image-test`"]
fn layout() {
    let t = TestRun::new("layout");
    let image = &t.image.name;
    let entry = docker_ok(&[
        "image",
        "inspect",
        "-f",
        "{{json .Config.Entrypoint}}",
        image,
    ]);
    assert_eq!(entry, r#"["/usr/local/bin/etcd-migrate"]"#, "entrypoint");
    let c = t.create(image);
    let (ok, listing) = sh("docker export \"$1\" | tar -tv", &[&c]);
    assert!(ok, "docker export {c} | tar -tv: {}", tail(&listing, 5));
    docker_ok(&["rm", &c]);
    // `tar -tv` lines without mode, owner, size, date and time.
    let list: Vec<String> = listing
        .lines()
        .map(|line| {
            line.split_whitespace()
                .skip(5)
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect();
    let has = |entry: &str| list.iter().any(|line| line == entry);
    for v in &t.image.bundled {
        assert!(
            has(&format!("usr/local/bin/etcd-{v}")),
            "no /usr/local/bin/etcd-{v}"
        );
        assert!(
            has(&format!("usr/local/bin/etcdctl-{v}")),
            "no /usr/local/bin/etcdctl-{v}"
        );
        let pre_35 = v.starts_with(['0', '1', '2'])
            || ["3.0.", "3.1.", "3.2.", "3.3.", "3.4."]
                .iter()
                .any(|p| v.starts_with(p));
        if !pre_35 {
            assert!(
                has(&format!("usr/local/bin/etcdutl-{v}")),
                "no /usr/local/bin/etcdutl-{v}"
            );
        }
    }
    let newest = t.image.newest();
    assert!(
        has(&format!("usr/local/bin/etcd -> etcd-{newest}")),
        "etcd does not name etcd-{newest}"
    );
    assert!(
        has(&format!("usr/local/bin/etcdctl -> etcdctl-{newest}")),
        "etcdctl does not name etcdctl-{newest}"
    );
    assert!(
        has("usr/local/bin/migrate -> migrate-if-needed.sh"),
        "no migrate -> migrate-if-needed.sh"
    );
    assert!(
        has("usr/local/bin/migrate-if-needed.sh"),
        "no migrate-if-needed.sh"
    );
    assert!(has("usr/local/bin/etcd-migrate"), "no etcd-migrate");
    let version = t.run_rm(&[image, "--version"]);
    assert!(
        stdout(&version)
            .lines()
            .any(|line| line.starts_with("etcd-migrate ")),
        "docker run IMAGE --version does not print etcd-migrate's version: {}{}",
        stdout(&version),
        stderr(&version)
    );
}

/// images/bundle.sh with an upstream-style tarball served on 127.0.0.1 and
/// a local directory; a sha256 mismatch, a tarball missing a tool and a
/// mislabelled binary are refused; the staged context builds an image whose
/// ETCD_VERSIONS must match it, and that image migrates.
#[test]
#[ignore = "needs the image built by `make image` and root: run by `make image-test`"]
fn bundle_sources() {
    let t = TestRun::new("bundle_sources");
    assert!(
        t.image.bundles("3.5.1"),
        "needs 3.5.1 in {} to make a tarball from",
        t.image.name
    );
    let w = t.dir("bundle");
    let srv = t.dir("bundle/srv");
    let tar1 = t.dir("bundle/tar/etcd-v3.5.1-linux-amd64");
    let tar2 = t.dir("bundle/tar2/etcd-v3.5.1-linux-amd64");
    let dir = t.dir("bundle/dir");
    let c = t.create(&t.image.name);
    let cp = |from: &str, to: &Path| {
        docker_ok(&[
            "cp",
            &format!("{c}:/usr/local/bin/{from}"),
            &to.display().to_string(),
        ]);
    };
    for f in ["etcd", "etcdctl", "etcdutl"] {
        cp(&format!("{f}-3.5.1"), &tar1.join(f));
    }
    cp("etcd-3.4.23", &dir.join("etcd"));
    cp("etcdctl-3.4.23", &dir.join("etcdctl"));
    cp("etcd-migrate", &w.join("etcd-migrate"));
    docker_ok(&["rm", &c]);
    let tar = |root: &str, file: &str| {
        let out = run(
            "tar",
            &[
                "-C",
                &w.join(root).display().to_string(),
                "-czf",
                &srv.join(file).display().to_string(),
                "etcd-v3.5.1-linux-amd64",
            ],
        );
        assert!(out.status.success(), "tar {file}: {}", stderr(&out));
    };
    tar("tar", "etcd-v3.5.1-linux-amd64.tar.gz");
    for f in ["etcd", "etcdctl"] {
        std::fs::copy(tar1.join(f), tar2.join(f)).unwrap_or_else(|err| panic!("cp {f}: {err}"));
    }
    tar("tar2", "no-etcdutl.tar.gz");
    let sha = sha256_file(&srv.join("etcd-v3.5.1-linux-amd64.tar.gz"));
    // Every hex digit one up (f wraps to 0): a wrong sha256.
    let bad: String = sha
        .chars()
        .map(|c| match c {
            '9' => 'a',
            'f' => '0',
            c => char::from(c as u8 + 1),
        })
        .collect();

    let server = FileServer::start(&srv);
    let port = server.port;
    let url = format!("http://127.0.0.1:{port}/etcd-v3.5.1-linux-amd64.tar.gz");
    let ctx = w.join("ctx/.cache/image-context");
    let ctx_text = ctx.display().to_string();
    let cache = w.join("cache").display().to_string();
    let migrate = w.join("etcd-migrate").display().to_string();
    let bundle = |args: &[&str]| {
        let mut argv = vec!["--cache", &cache, "--migrate", &migrate, "--out", &ctx_text];
        argv.extend_from_slice(args);
        let out = Command::new(repo().join("images/bundle.sh"))
            .args(&argv)
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap_or_else(|err| panic!("run images/bundle.sh: {err}"));
        (
            out.status.success(),
            format!("{}{}", stdout(&out), stderr(&out)),
            stdout(&out),
        )
    };

    // A wrong sha256 is refused, and nothing is staged.
    let (ok, out, _) = bundle(&["--tarball", &format!("3.5.1={url}#{bad}")]);
    assert!(!ok, "a sha256 mismatch was accepted");
    assert!(
        out.contains("sha256 mismatch"),
        "mismatch message missing: {out}"
    );
    assert!(
        !ctx.exists() && !w.join(format!("cache/tarballs/{bad}.tar.gz")).exists(),
        "a refused tarball left files"
    );
    // A 3.5 tarball without etcdutl is refused.
    let sha2 = sha256_file(&srv.join("no-etcdutl.tar.gz"));
    let (ok, out, _) = bundle(&[
        "--tarball",
        &format!("3.5.1=http://127.0.0.1:{port}/no-etcdutl.tar.gz#{sha2}"),
    ]);
    assert!(!ok, "a 3.5 tarball without etcdutl was accepted");
    assert!(
        out.contains("has no etcd-v3.5.1-linux-amd64/etcdutl"),
        "missing-etcdutl message missing: {out}"
    );
    // A binary that reports another version than its label is refused.
    let (ok, out, _) = bundle(&["--dir", &format!("3.4.22={}", dir.display())]);
    assert!(!ok, "a mislabelled binary was accepted");
    assert!(
        out.contains("does not report version 3.4.22"),
        "mislabel message missing: {out}"
    );
    // The right sha256, and a local dir: staged.
    let (ok, out, stdout_only) = bundle(&[
        "--tarball",
        &format!("3.5.1={url}#{sha}"),
        "--dir",
        &format!("3.4.23={}", dir.display()),
    ]);
    assert!(ok, "bundle.sh failed: {}", tail(&out, 10));
    assert_eq!(
        stdout_only.lines().last().unwrap_or(""),
        ctx_text,
        "bundle.sh's last line"
    );
    drop(server);
    assert_eq!(
        read(&ctx.join("VERSIONS")).trim_end(),
        "3.4.23,3.5.1",
        "VERSIONS"
    );
    for f in [
        "etcd-3.4.23",
        "etcdctl-3.4.23",
        "etcd-3.5.1",
        "etcdctl-3.5.1",
        "etcdutl-3.5.1",
        "etcd-migrate",
        "migrate-if-needed.sh",
    ] {
        let path = ctx.join("bin").join(f);
        assert!(
            std::fs::metadata(&path).is_ok_and(|m| m.permissions().mode() & 0o111 != 0),
            "{f} not staged"
        );
    }
    assert_eq!(
        std::fs::read_link(ctx.join("bin/etcd"))
            .map(|p| p.display().to_string())
            .unwrap_or_default(),
        "etcd-3.5.1",
        "etcd symlink"
    );
    assert!(
        read(&ctx.join("bundle-3.4.23,3.5.1.txt"))
            .contains(&format!("etcdutl-3.5.1  tarball {url} sha256={sha}")),
        "manifest does not record the tarball"
    );
    assert!(
        std::fs::read(ctx.join("bin/etcd-3.5.1")).ok() == std::fs::read(tar1.join("etcd")).ok(),
        "staged etcd-3.5.1 differs from the tarball's"
    );

    if !docker(&["image", "inspect", &t.image.base])
        .status
        .success()
    {
        eprintln!(
            "image-tests:   (no {}: building an image from this bundle is skipped)",
            t.image.base
        );
        return;
    }
    let tag = format!("etcd-migrate-image-test:{}", t.id);
    let dockerfile = repo().join("Dockerfile").display().to_string();
    let context = w.join("ctx").display().to_string();
    let base_arg = format!("BASEIMAGE={}", t.image.base);
    // ETCD_VERSIONS must match the staged bundle.
    let (ok, out) = sh(
        "docker build -q --label \"$1\" --build-arg \"$2\" --build-arg ETCD_VERSIONS=3.4.23,3.5.16 -f \"$3\" \"$4\"",
        &[&t.label, &base_arg, &dockerfile, &context],
    );
    assert!(
        !ok,
        "docker build with ETCD_VERSIONS not matching the bundle succeeded"
    );
    assert!(
        out.contains("bundle-3.4.23,3.5.16.txt"),
        "mismatched build failed for another reason: {out}"
    );
    let (ok, out) = sh(
        "docker build -q --label \"$1\" --build-arg \"$2\" --build-arg ETCD_VERSIONS=3.4.23,3.5.1 -t \"$5\" -f \"$3\" \"$4\"",
        &[&t.label, &base_arg, &dockerfile, &context, &tag],
    );
    assert!(
        ok,
        "docker build of the tarball bundle failed: {}",
        tail(&out, 3)
    );
    let smoke = run(
        &repo().join("images/smoke.sh").display().to_string(),
        &[&tag],
    );
    assert!(
        smoke.status.success(),
        "smoke test of {tag} failed: {}",
        tail(&stderr(&smoke), 5)
    );
    // It migrates 3.4.23 data to the tarball's 3.5.1 and becomes etcd 3.5.1.
    let vol = w.join("vol");
    let seeded = t.seed("3.4.23", &vol, "etcd0", &Seed::default());
    let c = t.run_d(&[
        "-v",
        &format!("{}:/var/etcd", vol.display()),
        "-e",
        "TARGET_VERSION=3.5.1",
        "-e",
        "DATA_DIRECTORY=/var/etcd/data",
        "-e",
        "ETCD_NAME=etcd0",
        &tag,
    ]);
    wait_serving(&c, "3.5.1", "http://127.0.0.1:2379", 30, &[]);
    expect_pid1_etcd(&c, "3.5.1");
    expect_keys(&c, "3.5.1", "http://127.0.0.1:2379", &[], &seeded);
    assert_eq!(version_txt(&vol.join("data")), "3.5.1/etcd3", "version.txt");
    docker_ok(&["rm", "-f", &c]);
    docker_ok(&["rmi", &tag]);
}

/// A file's content.
fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|err| panic!("read {}: {err}", path.display()))
}

/// The mode bits of `path` in octal, as `stat -c %a` prints them.
fn mode_text(path: &Path) -> String {
    format!("{:o}", harness::mode(path))
}

/// The owner uid of `path`.
fn uid(path: &Path) -> u32 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path)
        .unwrap_or_else(|err| panic!("stat {}: {err}", path.display()))
        .uid()
}

/// The owner gid of `path`.
fn gid(path: &Path) -> u32 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path)
        .unwrap_or_else(|err| panic!("stat {}: {err}", path.display()))
        .gid()
}

/// `-v HOST:/var/etcd`.
fn volume(host: &Path) -> String {
    format!("{}:/var/etcd", host.display())
}

/// 3.3.25 data on a bind-mounted host dir -> TARGET_VERSION=3.5.16:
/// migrated one minor at a time, then PID 1 is etcd 3.5.16 serving the
/// data, on a published port too. Restarts with a patch target and with a
/// rollback target.
#[test]
#[ignore = "needs the image built by `make image` and root: run by `make image-test`"]
fn migrate_and_serve() {
    let t = TestRun::new("migrate_and_serve");
    let image = t.image.name.as_str();
    let w = t.dir("migrate");
    let seeded = t.seed("3.3.25", &w, "etcd0", &Seed::default());
    let port = free_port();
    let ep = "http://127.0.0.1:2379";
    let c = t.run_d(&[
        "-v",
        &volume(&w),
        "-p",
        &format!("127.0.0.1:{port}:2379"),
        "-e",
        "TARGET_VERSION=3.5.16",
        "-e",
        "DATA_DIRECTORY=/var/etcd/data",
        "-e",
        "ETCD_NAME=etcd0",
        image,
        "--",
        "--listen-client-urls=http://0.0.0.0:2379",
        "--advertise-client-urls=http://127.0.0.1:2379",
    ]);
    wait_serving(&c, "3.5.16", ep, 60, &[]);
    expect_pid1_etcd(&c, "3.5.16");
    // The walk: 3.3.25 -> 3.4.23 -> 3.5.16, each a step, then exec.
    assert!(
        has_log(&c, "step done step=1/2 recorded=3.4.23/etcd3"),
        "no recorded 3.4.23 step"
    );
    assert!(
        has_log(&c, "step done step=2/2 recorded=3.5.16/etcd3"),
        "no recorded 3.5.16 step"
    );
    assert!(
        has_log(&c, "exec program=/usr/local/bin/etcd-3.5.16"),
        "no exec line"
    );
    let value = ctl(
        &c,
        "3.5.16",
        ep,
        &[],
        &["get", "/registry/seed/version", "--print-value-only"],
    );
    assert_eq!(stdout(&value).trim(), "3.3.25", "key written by 3.3.25");
    expect_keys(&c, "3.5.16", ep, &[], &seeded);
    let out = curl(&[&format!("http://127.0.0.1:{port}/version")])
        .unwrap_or_else(|| panic!("published port {port} does not answer"));
    assert!(
        out.contains(r#""etcdserver":"3.5.16""#),
        "GET /version on the published port: {out}"
    );
    assert_eq!(version_txt(&w.join("data")), "3.5.16/etcd3", "version.txt");
    assert_eq!(mode_text(&w.join("data")), "700", "data dir mode");
    docker_ok(&["stop", "-t", "10", &c]);
    let code = inspect(&c, "{{.State.ExitCode}}");
    assert!(
        code == "0" || code == "143",
        "etcd exited {code} on docker stop"
    );
    docker_ok(&["rm", &c]);

    // A new TARGET_VERSION, a patch: recorded without a step.
    if t.image.bundles("3.5.30") {
        let c = t.run_d(&[
            "-v",
            &volume(&w),
            "-e",
            "TARGET_VERSION=3.5.30",
            "-e",
            "DATA_DIRECTORY=/var/etcd/data",
            "-e",
            "ETCD_NAME=etcd0",
            image,
        ]);
        wait_serving(&c, "3.5.30", ep, 30, &[]);
        expect_pid1_etcd(&c, "3.5.30");
        expect_keys(&c, "3.5.30", ep, &[], &seeded);
        assert_eq!(
            version_txt(&w.join("data")),
            "3.5.30/etcd3",
            "version.txt after the patch upgrade"
        );
        docker_ok(&["stop", "-t", "10", &c]);
        docker_ok(&["rm", &c]);
    }

    // A rollback target (3.5 -> 3.4): executed; where a build refuses it,
    // exit 2, nothing touched, etcd never started.
    let before = fingerprint(&w.join("data"));
    let c = t.run_d(&[
        "-v",
        &volume(&w),
        "-e",
        "TARGET_VERSION=3.4.23",
        "-e",
        "DATA_DIRECTORY=/var/etcd/data",
        "-e",
        "ETCD_NAME=etcd0",
        image,
    ]);
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline && running(&c) && !has_log(&c, "exec program=") {
        std::thread::sleep(harness::POLL_INTERVAL);
    }
    if running(&c) {
        wait_serving(&c, "3.4.23", ep, 30, &[]);
        expect_pid1_etcd(&c, "3.4.23");
        expect_keys(&c, "3.4.23", ep, &[], &seeded);
        assert_eq!(
            version_txt(&w.join("data")),
            "3.4.23/etcd3",
            "version.txt after the rollback"
        );
        eprintln!("image-tests:   rollback 3.5 -> 3.4 executed");
    } else {
        let code = inspect(&c, "{{.State.ExitCode}}");
        assert_eq!(code, "2", "exit code of a refused rollback");
        assert!(
            !has_log(&c, "etcd started"),
            "a refused rollback started etcd"
        );
        before.assert_unchanged(&fingerprint(&w.join("data")), "a refused rollback");
        eprintln!(
            "image-tests:   rollback 3.5 -> 3.4 refused with exit 2, data untouched: {}",
            log_line(&c, " error ")
        );
    }
}

/// docker stop while a step's etcd runs: that etcd is stopped with
/// SIGTERM, the container exits 143 well within the grace period,
/// version.txt still names the last completed release, and the next start
/// resumes and converges.
#[test]
#[ignore = "needs the image built by `make image` and root: run by `make image-test`"]
fn stop_during_step() {
    let t = TestRun::new("stop_during_step");
    let w = t.dir("stop");
    let seeded = t.seed("3.3.25", &w, "etcd0", &Seed::default());
    // A longer election timeout (ETCD_CREDS reach every step etcd, last)
    // keeps the first step's etcd busy for ~3 s: room to stop it mid-step.
    let c = t.run_d(&[
        "-v",
        &volume(&w),
        "-e",
        "TARGET_VERSION=3.5.16",
        "-e",
        "DATA_DIRECTORY=/var/etcd/data",
        "-e",
        "ETCD_NAME=etcd0",
        "-e",
        "ETCD_CREDS=--election-timeout=3000",
        &t.image.name,
    ]);
    wait_log(&c, "etcd started step=1/2 version=3.4.23", 30);
    let t0 = Instant::now();
    docker_ok(&["stop", "-t", "10", &c]);
    let elapsed = t0.elapsed();
    let code = wait_exit(&c, 5);
    assert_eq!(code, 143, "exit code after docker stop");
    // Under the 10 s grace with room to spare (exit 143, not 137, already
    // shows docker did not have to SIGKILL); a loaded machine adds seconds
    // to docker's own round trips.
    assert!(
        elapsed < Duration::from_secs(9),
        "docker stop took {} ms (the grace period is 10 s)",
        elapsed.as_millis()
    );
    assert!(
        !has_log(&c, "healthy and stopped step=1/"),
        "the step completed before the stop; the test did not hit it"
    );
    // The step's etcd went on SIGTERM, without escalation to SIGKILL.
    // (etcd 3.x installs its own SIGTERM handler only once it serves, so a
    // step etcd stopped before its first write exits by SIGTERM's default
    // action, which its WAL and bolt db are made to survive; the resumed
    // run below proves it.)
    assert!(
        !has_log(&c, "SIGKILL"),
        "the step's etcd had to be SIGKILLed"
    );
    assert!(
        !has_log(&c, "exec program="),
        "etcd was exec'd after a stop"
    );
    assert_eq!(
        version_txt(&w.join("data")),
        "3.3.25/etcd3",
        "version.txt after the stop"
    );
    let line = logs(&c)
        .lines()
        .find(|l| l.contains("error") || l.contains("signal"))
        .map(|l| l.chars().take(150).collect::<String>())
        .unwrap_or_default();
    eprintln!(
        "image-tests:   stopped in step 1 after {} ms, exit 143: {line}",
        elapsed.as_millis()
    );
    // The same container, started again, resumes from 3.3.25 and converges.
    docker_ok(&["start", &c]);
    wait_serving(&c, "3.5.16", "http://127.0.0.1:2379", 60, &[]);
    expect_pid1_etcd(&c, "3.5.16");
    expect_keys(&c, "3.5.16", "http://127.0.0.1:2379", &[], &seeded);
    assert_eq!(
        version_txt(&w.join("data")),
        "3.5.16/etcd3",
        "version.txt after the resumed run"
    );
}

/// Failed migrations: the exit code and etcd-migrate's error reach docker
/// logs, and etcd is never started on unmigrated data.
#[test]
#[ignore = "needs the image built by `make image` and root: run by `make image-test`"]
fn failures() {
    let t = TestRun::new("failures");
    let image = t.image.name.as_str();
    let w = t.dir("fail");
    t.seed("3.3.25", &w, "etcd0", &Seed::default());
    let data = w.join("data");
    let before = fingerprint(&data);
    let all = |c: &str| logs(c);

    // A target that is not bundled: exit 2, nothing touched.
    let c = t.run_d(&[
        "-v",
        &volume(&w),
        "-e",
        "TARGET_VERSION=3.6.99",
        "-e",
        "DATA_DIRECTORY=/var/etcd/data",
        "-e",
        "ETCD_NAME=etcd0",
        image,
    ]);
    assert_eq!(wait_exit(&c, 30), 2, "exit code, target not bundled");
    assert!(
        has_log(&c, "3.6.99"),
        "the error does not name 3.6.99: {}",
        all(&c)
    );
    assert!(has_log(&c, "exit=2"), "no exit=2 in the logs: {}", all(&c));
    assert!(!has_log(&c, "etcd started"), "etcd was started");
    before.assert_unchanged(&fingerprint(&data), "data dir after exit 2 (not bundled)");
    eprintln!("image-tests:   not bundled: {}", log_line(&c, " error "));

    // No TARGET_VERSION: exit 2 naming it.
    let c = t.run_d(&[
        "-v",
        &volume(&w),
        "-e",
        "DATA_DIRECTORY=/var/etcd/data",
        image,
    ]);
    assert_eq!(wait_exit(&c, 30), 2, "exit code, no TARGET_VERSION");
    assert!(
        has_log(&c, "TARGET_VERSION"),
        "the error does not name TARGET_VERSION: {}",
        all(&c)
    );

    // A peer URL on an address this host does not have: refused before any
    // etcd starts (exit 2), naming the address and where it comes from.
    let c = t.run_d(&[
        "-v",
        &volume(&w),
        "-e",
        "TARGET_VERSION=3.5.16",
        "-e",
        "DATA_DIRECTORY=/var/etcd/data",
        "-e",
        "ETCD_NAME=etcd0",
        "-e",
        "LISTEN_PEER_URLS=http://203.0.113.1:2380",
        image,
    ]);
    assert_eq!(wait_exit(&c, 60), 2, "exit code, unbindable peer URL");
    assert!(
        has_log(&c, "203.0.113.1:2380"),
        "the error does not name the address: {}",
        tail(&all(&c), 5)
    );
    assert!(
        has_log(&c, "LISTEN_PEER_URLS"),
        "the error does not name LISTEN_PEER_URLS: {}",
        tail(&all(&c), 5)
    );
    assert!(!has_log(&c, "etcd started"), "etcd was started");
    before.assert_unchanged(
        &fingerprint(&data),
        "data dir after exit 2 (unbindable peer URL)",
    );
    eprintln!(
        "image-tests:   unbindable peer URL: {}",
        log_line(&c, " error ")
    );

    // A flag the steps' etcds do not know, through ETCD_CREDS: found by
    // their version checks before anything starts (exit 2), the error
    // quotes etcd's own words and names ETCD_CREDS, version.txt unchanged,
    // no exec.
    let c = t.run_d(&[
        "-v",
        &volume(&w),
        "-e",
        "TARGET_VERSION=3.5.16",
        "-e",
        "DATA_DIRECTORY=/var/etcd/data",
        "-e",
        "ETCD_NAME=etcd0",
        "-e",
        "ETCD_CREDS=--no-such-flag",
        image,
    ]);
    assert_eq!(
        wait_exit(&c, 60),
        2,
        "exit code, a flag the steps' etcds refuse"
    );
    assert!(has_log(&c, "exit=2"), "no exit=2 in the logs: {}", all(&c));
    assert!(
        has_log(&c, "ETCD_CREDS"),
        "the error names ETCD_CREDS: {}",
        all(&c)
    );
    assert!(!has_log(&c, "etcd started"), "an etcd was started");
    let text = all(&c);
    let from_error = text
        .find(" error ")
        .map(|at| &text[text[..at].rfind('\n').map_or(0, |n| n + 1)..])
        .unwrap_or("");
    assert!(
        from_error.contains("flag provided but not defined: -no-such-flag"),
        "the error does not quote etcd's complaint: {}",
        tail(&text, 5)
    );
    assert!(
        !has_log(&c, "exec program="),
        "etcd was exec'd after a refusal"
    );
    assert_eq!(
        version_txt(&data),
        "3.3.25/etcd3",
        "version.txt after a refusal"
    );
    eprintln!(
        "image-tests:   a flag the steps' etcds refuse: {}",
        log_line(&c, " error ")
    );
}

/// --user 1000:1000: a fresh data dir on a volume that user owns is
/// created 0700 and served; 3.4.23 data of that user migrates; a
/// root-owned volume fails cleanly.
#[test]
#[ignore = "needs the image built by `make image` and root: run by `make image-test`"]
fn non_root() {
    let t = TestRun::new("non_root");
    let image = t.image.name.as_str();
    let fresh = t.dir("user/fresh");
    let rootowned = t.dir("user/rootowned");
    std::os::unix::fs::chown(&fresh, Some(1000), Some(1000))
        .unwrap_or_else(|err| panic!("chown: {err}"));
    let c = t.run_d(&[
        "--user",
        "1000:1000",
        "-v",
        &volume(&fresh),
        "-e",
        "TARGET_VERSION=3.5.16",
        "-e",
        "DATA_DIRECTORY=/var/etcd/data",
        "-e",
        "ETCD_NAME=etcd0",
        image,
        "--",
        "--initial-cluster=etcd0=http://localhost:2380",
    ]);
    wait_put(&c, "3.5.16", "fresh", 30);
    expect_pid1_etcd(&c, "3.5.16");
    let data = fresh.join("data");
    assert_eq!(
        format!("{} {}:{}", mode_text(&data), uid(&data), gid(&data)),
        "700 1000:1000",
        "fresh data dir mode and owner"
    );
    assert_eq!(
        version_txt(&data),
        "3.5.16/etcd3",
        "version.txt of the fresh dir"
    );
    let others = not_owned_by(&fresh, 1000);
    assert!(others.is_empty(), "files not owned by 1000: {others:?}");
    let top = docker_ok(&["top", &c, "-eo", "pid,uid"]);
    let uids: std::collections::BTreeSet<&str> = top
        .lines()
        .skip(1)
        .filter_map(|line| line.split_whitespace().nth(1))
        .collect();
    assert_eq!(
        uids.into_iter().collect::<Vec<_>>(),
        ["1000"],
        "uid of the container's processes"
    );

    // 3.4.23 data written by uid 1000, migrated by uid 1000.
    let old = t.dir("user/old");
    std::os::unix::fs::chown(&old, Some(1000), Some(1000))
        .unwrap_or_else(|err| panic!("chown: {err}"));
    let seeded = t.seed(
        "3.4.23",
        &old,
        "etcd0",
        &Seed {
            docker: strings(&["--user", "1000:1000"]),
            ..Seed::default()
        },
    );
    let c = t.run_d(&[
        "--user",
        "1000:1000",
        "-v",
        &volume(&old),
        "-e",
        "TARGET_VERSION=3.5.16",
        "-e",
        "DATA_DIRECTORY=/var/etcd/data",
        "-e",
        "ETCD_NAME=etcd0",
        image,
    ]);
    wait_serving(&c, "3.5.16", "http://127.0.0.1:2379", 30, &[]);
    expect_keys(&c, "3.5.16", "http://127.0.0.1:2379", &[], &seeded);
    let data = old.join("data");
    assert_eq!(
        format!(
            "{} {} {}",
            mode_text(&data),
            uid(&data),
            uid(&data.join("version.txt"))
        ),
        "700 1000 1000",
        "migrated data dir mode/owner and version.txt owner"
    );
    let others = not_owned_by(&old, 1000);
    assert!(
        others.is_empty(),
        "files not owned by 1000 after the migration: {others:?}"
    );

    // A volume the user cannot write: refused before anything (exit 2),
    // with the owner and the chown that fixes it; no etcd.
    let c = t.run_d(&[
        "--user",
        "1000:1000",
        "-v",
        &volume(&rootowned),
        "-e",
        "TARGET_VERSION=3.5.16",
        "-e",
        "DATA_DIRECTORY=/var/etcd/data",
        "-e",
        "ETCD_NAME=etcd0",
        image,
    ]);
    assert_eq!(
        wait_exit(&c, 30),
        2,
        "exit code, a root-owned volume as uid 1000"
    );
    assert!(
        has_log(&c, "not readable and writable by uid 1000"),
        "the error does not say who cannot write: {}",
        logs(&c)
    );
    assert!(
        has_log(&c, "chown -R 1000"),
        "the error does not give the fix: {}",
        logs(&c)
    );
    assert!(!has_log(&c, "etcd started"), "etcd was started");
    eprintln!(
        "image-tests:   root-owned volume as 1000: exit 2: {}",
        log_line(&c, " error ")
    );
}

/// Zombie reaping while PID 1: a step binary that orphans a child (a
/// helper bin dir whose etcd-3.4.23 forks a short-lived grandchild and
/// execs the real one). PID 1 reaps it; nothing is left as a zombie after
/// the exec.
#[test]
#[ignore = "needs the image built by `make image` and root: run by `make image-test`"]
fn reaps_orphans() {
    let t = TestRun::new("reaps_orphans");
    let image = t.image.name.as_str();
    let bin = t.dir("reap/bin");
    let listed = t.run_rm(&[
        "--entrypoint", "/bin/sh", image, "-c",
        r#"cd /usr/local/bin && for f in etcd-[0-9]* etcdctl-[0-9]* etcdutl-[0-9]*; do [ -e "$f" ] && echo "$f"; done"#,
    ]);
    assert!(
        listed.status.success(),
        "listing the image's binaries: {}",
        stderr(&listed)
    );
    for f in stdout(&listed).split_whitespace() {
        if f != "etcd-3.4.23" {
            harness::symlink(&Path::new("/usr/local/bin").join(f), &bin.join(f));
        }
    }
    harness::install_script(
        &bin.join("etcd-3.4.23"),
        "#!/bin/sh\n# The subshell exits at once: its background child is re-parented to PID 1.\n\
         ( /usr/local/bin/etcdctl-3.4.23 version >/dev/null 2>&1 & )\n\
         exec /usr/local/bin/etcd-3.4.23 \"$@\"\n",
    );
    let vol = t.work.join("reap/vol");
    let seeded = t.seed("3.3.25", &vol, "etcd0", &Seed::default());
    let c = t.run_d(&[
        "-v",
        &volume(&vol),
        "-v",
        &format!("{}:/helper-bin:ro", bin.display()),
        "-e",
        "TARGET_VERSION=3.5.16",
        "-e",
        "DATA_DIRECTORY=/var/etcd/data",
        "-e",
        "ETCD_NAME=etcd0",
        image,
        "--bin-dir",
        "/helper-bin",
    ]);
    wait_serving(&c, "3.5.16", "http://127.0.0.1:2379", 60, &[]);
    expect_keys(&c, "3.5.16", "http://127.0.0.1:2379", &[], &seeded);
    assert!(
        has_log(&c, "reaped orphan"),
        "no 'reaped orphan' in the logs"
    );
    let top = docker_ok(&["top", &c, "-eo", "pid,stat,args"]);
    let zombies: Vec<&str> = top
        .lines()
        .skip(1)
        .filter(|line| {
            line.split_whitespace()
                .nth(1)
                .is_some_and(|stat| stat.contains('Z'))
        })
        .collect();
    assert!(zombies.is_empty(), "zombies left: {zombies:?}");
    let reaped = logs(&c)
        .lines()
        .filter(|line| line.contains("reaped orphan"))
        .count();
    eprintln!("image-tests:   {reaped} orphan(s) reaped, no zombies after exec");
}

/// Kubernetes image compatibility: an old-style manifest that runs
/// migrate-if-needed.sh and then execs /usr/local/bin/etcd (no
/// DO_NOT_MOVE_BINARIES), with a target older than the newest bundled
/// release, runs the target; `migrate` with flags migrates and exits.
#[test]
#[ignore = "needs the image built by `make image` and root: run by `make image-test`"]
fn legacy_wrappers() {
    let t = TestRun::new("legacy_wrappers");
    let image = t.image.name.as_str();
    let w = t.dir("legacy");
    let seeded = t.seed("3.3.25", &w, "etcd-kube-master", &Seed::default());
    let c = t.run_d(&[
        "-v", &volume(&w), "-e", "TARGET_STORAGE=etcd3", "-e", "TARGET_VERSION=3.4.23",
        "-e", "DATA_DIRECTORY=/var/etcd/data", "-e", "ETCD_HOSTNAME=kube-master", "--entrypoint", "/bin/sh", image, "-c",
        "if [ -e /usr/local/bin/migrate-if-needed.sh ]; then /usr/local/bin/migrate-if-needed.sh 1>>/var/etcd/etcd.log 2>&1; fi; exec /usr/local/bin/etcd --name etcd-kube-master --data-dir /var/etcd/data --listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 1>>/var/etcd/etcd.log 2>&1",
    ]);
    let etcd_log = || std::fs::read_to_string(w.join("etcd.log")).unwrap_or_default();
    if let Err(err) = try_wait_serving(&c, "3.4.23", "http://127.0.0.1:2379", 60, &[]) {
        panic!("{err}; etcd.log:\n{}", tail(&etcd_log(), 20));
    }
    let status = ctl(
        &c,
        "3.4.23",
        "http://127.0.0.1:2379",
        &[],
        &["endpoint", "status", "-w", "json"],
    );
    assert!(
        stdout(&status).contains(r#""version":"3.4.23""#),
        "/usr/local/bin/etcd is not serving as 3.4.23: {}",
        stdout(&status)
    );
    expect_keys(&c, "3.4.23", "http://127.0.0.1:2379", &[], &seeded);
    assert!(
        etcd_log().contains("/usr/local/bin/etcd -> etcd-3.4.23"),
        "the wrapper did not point etcd at 3.4.23"
    );
    assert_eq!(version_txt(&w.join("data")), "3.4.23/etcd3", "version.txt");
    docker_ok(&["rm", "-f", &c]);

    // `migrate` with the Kubernetes migrate binary's flags: migrates, exits 0.
    let bundled = t.image.bundled_label();
    let c = t.run_d(&[
        "-v",
        &volume(&w),
        "--entrypoint",
        "/usr/local/bin/migrate",
        image,
        "--name",
        "etcd-kube-master",
        "--data-dir",
        "/var/etcd/data",
        "--target-version",
        "3.5.16",
        "--target-storage",
        "etcd3",
        "--bundled-versions",
        &bundled,
        "--initial-cluster",
        "etcd-kube-master=http://localhost:2380",
    ]);
    assert_eq!(
        wait_exit(&c, 60),
        0,
        "migrate's exit code: {}",
        tail(&logs(&c), 10)
    );
    assert_eq!(
        version_txt(&w.join("data")),
        "3.5.16/etcd3",
        "version.txt after migrate"
    );
    assert!(!has_log(&c, "exec program="), "migrate exec'd etcd");
}

/// examples/docker-run.sh, run as written: a new cluster at 3.4.23, then
/// the same command with TARGET_VERSION=3.5.16 migrates it.
#[test]
#[ignore = "needs the image built by `make image` and root: run by `make image-test`"]
fn example_docker_run() {
    let t = TestRun::new("example_docker_run");
    let w = t.work.join("dockerrun");
    let name = format!("etcd-example-{}", t.id);
    let port = free_port().to_string();
    // The example's container carries no test label: removed by name.
    t.adopt(&name);
    let example = |target: &str| {
        let out = Command::new("sh")
            .arg(repo().join("examples/docker-run.sh"))
            .env("IMAGE", &t.image.name)
            .env("NAME", &name)
            .env("DATA", &w)
            .env("PORT", &port)
            .env("TARGET_VERSION", target)
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap_or_else(|err| panic!("run examples/docker-run.sh: {err}"));
        assert!(
            out.status.success(),
            "docker-run.sh ({target}) failed: {}",
            stderr(&out)
        );
    };
    example("3.4.23");
    wait_put(&name, "3.4.23", "3.4.23", 30);
    let out = curl(&[&format!("http://127.0.0.1:{port}/version")]).unwrap_or_default();
    assert!(
        out.contains(r#""etcdserver":"3.4.23""#),
        "127.0.0.1:{port}/version: {out:?}"
    );
    let written = read_keyspace(&name, "3.4.23", "http://127.0.0.1:2379", &[]);
    docker_ok(&["rm", "-f", &name]);
    example("3.5.16");
    wait_serving(&name, "3.5.16", "http://127.0.0.1:2379", 60, &[]);
    expect_pid1_etcd(&name, "3.5.16");
    let out = curl(&[&format!("http://127.0.0.1:{port}/version")]).unwrap_or_default();
    assert!(
        out.contains(r#""etcdserver":"3.5.16""#),
        "after the upgrade: {out:?}"
    );
    assert!(has_log(&name, "recorded=3.5.16/etcd3"), "no 3.5.16 step");
    assert_eq!(version_txt(&w.join("data")), "3.5.16/etcd3", "version.txt");
    // What 3.4.23 served is what 3.5.16 serves.
    let now = read_keyspace(&name, "3.5.16", "http://127.0.0.1:2379", &[]);
    now.assert_kept(&written, 0);
    now.assert_revisions_kept(&written);
}

/// examples/gce-etcd.manifest and gce-etcd-events.manifest, run as the
/// kubelet would run them on one master (both pods share the node's
/// network, as with hostNetwork), with peer TLS through ETCD_CREDS, on
/// 3.3.25 data.
#[test]
#[ignore = "needs the image built by `make image` and root: run by `make image-test`"]
fn example_gce() {
    let t = TestRun::new("example_gce");
    let image = t.image.name.as_str();
    let root = t.work.join("gce/node");
    let certs = root.join("etc/srv/kubernetes");
    make_certs(
        &certs,
        &["DNS:kube-master", "DNS:localhost", "IP:127.0.0.1"],
    );
    // The node: a network namespace with the hostname kube-master (a shell
    // waiting on stdin keeps it open).
    let node = t.run_d(&[
        "-i",
        "--hostname",
        "kube-master",
        "--entrypoint",
        "/bin/sh",
        image,
        "-c",
        "read -r _",
    ]);
    let creds = strings(&[
        "--peer-trusted-ca-file",
        "/s/etcd-ca.crt",
        "--peer-cert-file",
        "/s/etcd-peer.crt",
        "--peer-key-file",
        "/s/etcd-peer.key",
        "-peer-client-cert-auth",
    ]);
    let seed_docker = vec![
        "--network".to_string(),
        format!("container:{node}"),
        "-v".into(),
        format!("{}:/s:ro", certs.display()),
    ];
    let peer = |port: u16| {
        let mut peer = vec![
            "--listen-peer-urls".to_string(),
            format!("https://127.0.0.1:{port}"),
            "--initial-advertise-peer-urls".into(),
            format!("https://kube-master:{port}"),
            "--initial-cluster".into(),
            format!("etcd-kube-master=https://kube-master:{port}"),
        ];
        peer.extend(creds.iter().cloned());
        peer
    };
    let var_etcd = root.join("mnt/master-pd/var/etcd");
    let seeded = t.seed(
        "3.3.25",
        &var_etcd,
        "etcd-kube-master",
        &Seed {
            docker: seed_docker.clone(),
            peer: peer(2380),
            sub: Some("data".into()),
        },
    );
    let seeded_events = t.seed(
        "3.3.25",
        &var_etcd,
        "etcd-kube-master",
        &Seed {
            docker: seed_docker,
            peer: peer(2381),
            sub: Some("data-events".into()),
        },
    );

    let network = format!("container:{node}");
    let run_pod = |manifest: &str| {
        let mut args = strings(&["--network", &network]);
        args.extend(pod_args(
            "python3",
            &repo().join("examples").join(manifest),
            "etcd-container",
            &root,
            image,
        ));
        t.run_d(&args)
    };
    let c1 = run_pod("gce-etcd.manifest");
    let c2 = run_pod("gce-etcd-events.manifest");
    let log_tail = |name: &str| {
        tail(
            &std::fs::read_to_string(root.join("var/log").join(name)).unwrap_or_default(),
            20,
        )
    };
    if let Err(err) = try_wait_serving(&c1, "3.5.16", "http://127.0.0.1:2379", 60, &[]) {
        panic!("{err}; etcd.log:\n{}", log_tail("etcd.log"));
    }
    if let Err(err) = try_wait_serving(&c2, "3.5.16", "http://127.0.0.1:4002", 60, &[]) {
        panic!("{err}; etcd-events.log:\n{}", log_tail("etcd-events.log"));
    }
    expect_pid1_etcd(&c1, "3.5.16");
    expect_pid1_etcd(&c2, "3.5.16");
    expect_keys(&c1, "3.5.16", "http://127.0.0.1:2379", &[], &seeded);
    expect_keys(&c2, "3.5.16", "http://127.0.0.1:4002", &[], &seeded_events);
    let etcd_log = read(&root.join("var/log/etcd.log"));
    assert!(
        etcd_log.contains("migrated version=3.5.16/etcd3 steps=2"),
        "etcd.log has no migration"
    );
    assert!(
        read(&root.join("var/log/etcd-events.log")).contains("client=http://127.0.0.1:18631"),
        "events steps did not use port 18631"
    );
    assert_eq!(
        version_txt(&var_etcd.join("data")),
        "3.5.16/etcd3",
        "etcd version.txt"
    );
    assert_eq!(
        version_txt(&var_etcd.join("data-events")),
        "3.5.16/etcd3",
        "etcd-events version.txt"
    );
    // The peers speak TLS with ETCD_CREDS' certificates, in the steps too.
    let members = ctl(
        &c1,
        "3.5.16",
        "http://127.0.0.1:2379",
        &[],
        &["member", "list"],
    );
    assert!(
        stdout(&members).contains("https://kube-master:2380"),
        "etcd's member does not advertise https://kube-master:2380: {}",
        stdout(&members)
    );
    // A step etcd (relayed as [etcd-3.4.23]) ran with ETCD_CREDS' peer TLS.
    assert!(
        etcd_log
            .lines()
            .any(|line| line.starts_with("[etcd-3.4.23] ")
                && line.contains("peerTLS: cert = /etc/srv/kubernetes/etcd-peer.crt")),
        "the 3.4.23 step did not get ETCD_CREDS' peer TLS"
    );
}

/// examples/kubeadm-etcd.yaml, run as the kubelet would run it, on a
/// network where the container has the manifest's node IP, with kubeadm's
/// TLS, on 3.4.23 data.
#[test]
#[ignore = "needs the image built by `make image` and root: run by `make image-test`"]
fn example_kubeadm() {
    let python = yaml_python();
    let t = TestRun::new("example_kubeadm");
    let image = t.image.name.as_str();
    let root = t.work.join("kubeadm/node");
    let pki = root.join("etc/kubernetes/pki/etcd");
    make_certs(
        &pki,
        &[
            "DNS:node1",
            "DNS:localhost",
            "IP:127.0.0.1",
            "IP:198.51.100.10",
        ],
    );
    let net = docker_ok(&[
        "network",
        "create",
        "--label",
        &t.label,
        "--subnet",
        "198.51.100.0/24",
        &format!("etcd-migrate-test-{}", t.id),
    ]);
    let seed_dir = t.work.join("kubeadm/seed");
    let seeded = t.seed(
        "3.4.23",
        &seed_dir,
        "node1",
        &Seed {
            docker: vec![
                "--network".into(),
                net.clone(),
                "--ip".into(),
                "198.51.100.10".into(),
                "--hostname".into(),
                "node1".into(),
                "-v".into(),
                format!("{}:/pki:ro", pki.display()),
            ],
            peer: strings(&[
                "--listen-peer-urls",
                "https://198.51.100.10:2380",
                "--initial-advertise-peer-urls",
                "https://198.51.100.10:2380",
                "--initial-cluster",
                "node1=https://198.51.100.10:2380",
                "--peer-cert-file",
                "/pki/peer.crt",
                "--peer-key-file",
                "/pki/peer.key",
                "--peer-trusted-ca-file",
                "/pki/ca.crt",
                "--peer-client-cert-auth",
            ]),
            sub: None,
        },
    );
    std::fs::create_dir_all(root.join("var/lib"))
        .unwrap_or_else(|err| panic!("mkdir var/lib: {err}"));
    std::fs::rename(seed_dir.join("data"), root.join("var/lib/etcd"))
        .unwrap_or_else(|err| panic!("mv data: {err}"));
    let mut args = strings(&[
        "--network",
        &net,
        "--ip",
        "198.51.100.10",
        "--hostname",
        "node1",
    ]);
    args.extend(pod_args(
        python,
        &repo().join("examples/kubeadm-etcd.yaml"),
        "etcd",
        &root,
        image,
    ));
    let c = t.run_d(&args);
    let tls = strings(&[
        "--cacert",
        "/etc/kubernetes/pki/etcd/ca.crt",
        "--cert",
        "/etc/kubernetes/pki/etcd/healthcheck-client.crt",
        "--key",
        "/etc/kubernetes/pki/etcd/healthcheck-client.key",
    ]);
    wait_serving(&c, "3.5.16", "https://127.0.0.1:2379", 60, &tls);
    expect_pid1_etcd(&c, "3.5.16");
    expect_keys(&c, "3.5.16", "https://198.51.100.10:2379", &tls, &seeded);
    assert_eq!(
        version_txt(&root.join("var/lib/etcd")),
        "3.5.16/etcd3",
        "version.txt"
    );
    assert!(
        has_log(&c, "step done step=1/1 recorded=3.5.16/etcd3"),
        "no 3.5.16 step"
    );
    // From the host, over the node IP, with a client certificate.
    let p = |name: &str| pki.join(name).display().to_string();
    let out = curl(&[
        "--cacert",
        &p("ca.crt"),
        "--cert",
        &p("healthcheck-client.crt"),
        "--key",
        &p("healthcheck-client.key"),
        "https://198.51.100.10:2379/version",
    ])
    .unwrap_or_default();
    assert!(
        out.contains(r#""etcdserver":"3.5.16""#),
        "https://198.51.100.10:2379/version from the host: {out:?}"
    );
    // Without a client certificate: refused (client-cert-auth).
    assert!(
        curl(&[
            "--cacert",
            &p("ca.crt"),
            "https://198.51.100.10:2379/version"
        ])
        .is_none(),
        "etcd served a client without a certificate"
    );
}
