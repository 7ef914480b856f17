//! Bad input and a bad environment, on real etcd: each case ends with its
//! documented exit code and a message that names the subject (path,
//! version, port, flag) and says what to do. Where etcd-migrate can refuse
//! before any etcd starts, the data dir is byte-identical afterwards; where
//! an etcd has to start to find the problem (corrupt data, a port taken
//! mid-run, a full disk during a step, a NOSPACE alarm), version.txt is
//! unchanged, no scratch dir or temp file is left, and data that can still
//! be served reads back as before. Input that must work however it is
//! written (a data dir spelt with a trailing slash, `//`, `/./` or
//! relative) and settings passed through unchanged (a `--wal-dir` on the
//! no-op exec) are here too. Cases already covered elsewhere are not
//! repeated: `refusals` (malformed version.txt, unrecorded dir, unknown
//! target, missing bundled minor, mislabelled and non-executable binary)
//! and `backups` (a backup the free-space check refuses).

use std::io::Write;
use std::net::TcpListener;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use etcd_client::{AlarmAction, AlarmOptions, AlarmType, DeleteOptions};

use crate::harness::etcd::{connect, connect_within, EtcdProcess, PROBE_TIMEOUT};
use crate::harness::fixture::{self, Fixture, FixtureSpec};
use crate::harness::keyspace::read_back;
use crate::harness::keyspace::Keyspace;
use crate::harness::migrator::{Migration, Outcome, Running};
use crate::harness::mount::Mount;
use crate::harness::tree::{fingerprint, Tree};
use crate::harness::v2::{self, V2Key};
use crate::harness::{
    block_on, dir_names, etcd_binary, free_port, install_script, mode, read_version_txt, set_mode,
    symlink, temp_dir, write_version_txt, Member, ETCD_READY_TIMEOUT, POLL_INTERVAL, STOP_GRACE,
    VERSION_TEMP, WORK_DIR,
};

/// Exit code (README): a step failed.
const EXIT_STEP_FAILED: i32 = 3;

/// The real releases these cases walk between.
const BUNDLE: &str = "3.3.25,3.4.23,3.5.16";

/// A small 3.x fixture written by real etcd `version` into `<tmp>/data`.
fn fixture_at(tmp: &Path, version: &'static str, tag: &str) -> Fixture {
    let data = tmp.join("data");
    fixture::build(FixtureSpec::small(version), &data, &Member::new(tag), tmp)
}

/// Our error line (text format) and the lines that continue it.
fn error_text(run: &Outcome) -> String {
    let start = run
        .stderr
        .match_indices("[etcd-migrate] ")
        .map(|(i, _)| i)
        .filter(|&i| run.stderr[i..].split_whitespace().nth(2) == Some("error"))
        .last()
        .unwrap_or_else(|| panic!("no error line\n{}", run.explain()));
    run.stderr[start..].to_string()
}

/// Asserts the error message carries the last line the failed etcd (the
/// one the error names, `etcd <version> (pid …)`) printed, relayed as
/// `[etcd-<version>] …`, so the operator sees etcd's own words without
/// digging through the relay.
fn assert_error_carries_etcds_last_line(run: &Outcome) {
    let error = error_text(run);
    let version = error
        .split("etcd ")
        .skip(1)
        .find_map(|rest| rest.split_once(" (pid ").map(|(version, _)| version))
        .filter(|version| version.split('.').all(|n| n.parse::<u32>().is_ok()))
        .unwrap_or_else(|| panic!("the error names no etcd pid: {error}\n{}", run.explain()));
    let relay = format!("[etcd-{version}] ");
    let last = run
        .stderr
        .lines()
        .filter_map(|line| line.strip_prefix(relay.as_str()).map(str::trim))
        .rfind(|rest| !rest.is_empty())
        .unwrap_or_else(|| panic!("etcd {version} printed nothing\n{}", run.explain()));
    assert!(
        error_text(run).contains(last),
        "the error should quote etcd's last line {last:?}\n{}",
        run.explain()
    );
}

/// After a run in which an etcd started on `data` and failed: the step is
/// not recorded (version.txt still says `recorded`) and no scratch dir or
/// temp file of ours is left. (etcd itself may have appended to its WAL or
/// created and removed its `.touch` probe, so the tree as a whole can
/// differ: that is why these cases do not assert byte identity.)
fn assert_nothing_recorded(run: &Outcome, data: &Path, recorded: &str) {
    assert_eq!(
        read_version_txt(data),
        recorded,
        "version.txt must still name the last completed step\n{}",
        run.explain()
    );
    assert!(
        run.lines_with("step done").is_empty() && run.lines_with("recorded").is_empty(),
        "nothing is recorded\n{}",
        run.explain()
    );
    for leftover in [WORK_DIR, VERSION_TEMP] {
        assert!(
            !data.join(leftover).exists(),
            "{} was left behind\n{}",
            data.join(leftover).display(),
            run.explain()
        );
    }
}

/// Fills the filesystem of `dir` to the last byte with a file `filler`
/// in it; returns the file.
fn fill(dir: &Path) -> PathBuf {
    let path = dir.join("filler");
    let mut file = std::fs::File::create(&path)
        .unwrap_or_else(|err| panic!("create {}: {err}", path.display()));
    let chunk = vec![0u8; 1 << 20];
    loop {
        match file.write_all(&chunk) {
            Ok(()) => {}
            Err(err) if err.raw_os_error() == Some(nix::libc::ENOSPC) => break,
            Err(err) => panic!("fill {}: {err}", path.display()),
        }
    }
    let free = nix::sys::statvfs::statvfs(dir)
        .unwrap_or_else(|err| panic!("statvfs {}: {err}", dir.display()))
        .blocks_available();
    assert_eq!(free, 0, "{} is not full", dir.display());
    path
}

/// Starts `etcd-<version>` on `data` as `member` and reads what it serves
/// without writing (data under a NOSPACE alarm refuses the harness's
/// write probe), then stops it.
fn read_back_without_writing(
    version: &str,
    member: &Member,
    data: &Path,
    log_dir: &Path,
) -> (Keyspace, Vec<String>) {
    let etcd = EtcdProcess::start(version, member, data, free_port(), log_dir);
    let endpoint = etcd.endpoint();
    let read = block_on(async {
        let started = Instant::now();
        loop {
            let attempt = async {
                let mut client = connect_within(&endpoint, PROBE_TIMEOUT).await?;
                client.get("probe", None).await?;
                let alarms = client
                    .alarm(AlarmAction::Get, AlarmType::None, None::<AlarmOptions>)
                    .await?;
                Ok::<_, etcd_client::Error>(
                    alarms
                        .alarms()
                        .iter()
                        .map(|alarm| format!("{:?}", alarm.alarm()))
                        .collect::<Vec<_>>(),
                )
            };
            match attempt.await {
                Ok(alarms) => break Some((Keyspace::read(&endpoint).await, alarms)),
                Err(_) if started.elapsed() < ETCD_READY_TIMEOUT => {
                    tokio::time::sleep(POLL_INTERVAL).await
                }
                Err(_) => break None,
            }
        }
    });
    let Some(read) = read else {
        panic!(
            "etcd {version} did not serve reads on {endpoint} within {ETCD_READY_TIMEOUT:?}; its output:\n{}",
            etcd.log_tail()
        );
    };
    etcd.stop();
    read
}

#[test]
fn version_txt_that_cannot_be_used_is_refused_untouched() {
    let tmp = temp_dir("bad-version-txt");
    let fixture = fixture_at(tmp.path(), "3.4.23", "bad-version-txt");
    let data = &fixture.data_dir;
    let path = data.join("version.txt").display().to_string();
    let declare = format!("> {path}");
    // (name, content, what the message says is wrong, what it says to
    // do); every message names the file too.
    let cases: [(&str, &[u8], &str, &str); 8] = [
        ("empty", b"", "is empty", &declare),
        ("a newline only", b"\n", "is empty", &declare),
        (
            "unknown storage",
            b"3.4.23/etcd4",
            "\"etcd4\" is not a storage format",
            &declare,
        ),
        (
            "no storage",
            b"3.4.23",
            "is not of the form <version>/<storage>",
            &declare,
        ),
        (
            "a v prefix",
            b"v3.4.23/etcd3",
            "is not a version of the form",
            &declare,
        ),
        (
            "etcd3 on a 2.x release",
            b"2.3.7/etcd3",
            "has no etcd3 storage",
            &declare,
        ),
        (
            "a future minor",
            b"3.7.0/etcd3",
            "newer than anything this image bundles (newest: 3.5.16)",
            "bundles etcd 3.7.x",
        ),
        (
            "a future major",
            b"4.0.0/etcd3",
            "newer than any release etcd-migrate knows",
            "bundles etcd 4.0.x",
        ),
    ];
    for (name, content, wrong, remedy) in cases {
        std::fs::write(data.join("version.txt"), content).expect("write version.txt");
        let before = fingerprint(data);
        let run = Migration::new("3.5.16", data, &fixture.member)
            .bundled(BUNDLE)
            .run();
        run.assert_refused_untouched(data, &before, &[&path, wrong, remedy]);
        println!(
            "version.txt {name} ({:?}): exit {:?}, {}",
            String::from_utf8_lossy(content),
            run.code(),
            run.last_line()
        );
    }
    println!("{} version.txt cases refused untouched", cases.len());
}

#[test]
fn targets_below_the_data_without_a_rollback_path_are_refused_untouched() {
    let tmp = temp_dir("no-rollback");

    // etcd2 data: etcd refuses an older minor on newer v2 data, and no
    // rebuild exists for the v2 store.
    let member = Member::new("no-rollback-v2");
    let v2_data = tmp.path().join("v2");
    v2::build(
        "3.3.25",
        &v2_data,
        &member,
        tmp.path(),
        &[vec![V2Key::plain("/registry/pods/p", "v")]],
    );
    let before = fingerprint(&v2_data);
    let run = Migration::new("2.3.7", &v2_data, &member)
        .bundled("2.3.7,3.3.25")
        .run();
    run.assert_refused_untouched(
        &v2_data,
        &before,
        &[
            "rolling etcd2 data back from 3.3.25 to 2.3.7 is not supported",
            "keep TARGET_VERSION at 3.3.x or newer",
        ],
    );

    // etcd3 data: a rollback goes down one minor at a time, so a missing
    // minor below the data blocks it.
    let fixture = fixture_at(tmp.path(), "3.4.23", "no-rollback-v3");
    let before = fingerprint(&fixture.data_dir);
    let run = Migration::new("3.2.32", &fixture.data_dir, &fixture.member)
        .bundled("3.2.32,3.4.23")
        .run();
    run.assert_refused_untouched(
        &fixture.data_dir,
        &before,
        &[
            "no safe path from 3.4.23/etcd3 to 3.2.32/etcd3",
            "no etcd 3.3.x is bundled",
        ],
    );
}

/// An `etcd-3.5.16` that exits 0 without saying which release it is.
const SILENT_ETCD: &str = "#!/bin/sh\necho \"usage: etcd [flags]\"\nexit 0\n";

#[test]
fn bundled_binaries_that_cannot_run_are_refused_untouched() {
    let tmp = temp_dir("bad-binaries");
    let fixture = fixture_at(tmp.path(), "3.4.23", "bad-binaries");
    let data = &fixture.data_dir;
    // What each case does to a bin dir of links to the real releases.
    type Break = fn(&Path);
    let cases: [(&str, &str, Break, &[&str]); 5] = [
        (
            "server missing",
            "3.5.16",
            |bin| std::fs::remove_file(bin.join("etcd-3.5.16")).expect("rm"),
            &["etcd-3.5.16 is missing", "add it to the image"],
        ),
        (
            "dangling link",
            "3.5.16",
            |bin| {
                std::fs::remove_file(bin.join("etcd-3.5.16")).expect("rm");
                symlink(Path::new("/nonexistent/etcd"), &bin.join("etcd-3.5.16"));
            },
            &["etcd-3.5.16 is missing", "add it to the image"],
        ),
        (
            "etcdctl missing for a rollback",
            "3.3.25",
            |bin| std::fs::remove_file(bin.join("etcdctl-3.4.23")).expect("rm"),
            &["etcdctl-3.4.23 is missing", "the plan needs etcdctl-3.4.23"],
        ),
        (
            "a directory",
            "3.5.16",
            |bin| {
                std::fs::remove_file(bin.join("etcd-3.5.16")).expect("rm");
                std::fs::create_dir(bin.join("etcd-3.5.16")).expect("mkdir");
            },
            &[
                "etcd-3.5.16 is not an executable file (not a regular file)",
                "replace it with the real etcd-3.5.16",
            ],
        ),
        (
            "says nothing",
            "3.5.16",
            |bin| {
                std::fs::remove_file(bin.join("etcd-3.5.16")).expect("rm");
                install_script(&bin.join("etcd-3.5.16"), SILENT_ETCD);
            },
            &[
                "etcd-3.5.16 did not report its version",
                "usage: etcd [flags]",
                "replace it with the real etcd-3.5.16",
            ],
        ),
    ];
    for (i, (name, target, break_it, expected)) in cases.iter().enumerate() {
        let bin = tmp.path().join(format!("bin-{i}"));
        std::fs::create_dir(&bin).expect("mkdir bin");
        for tool in ["etcd", "etcdctl"] {
            for version in ["3.3.25", "3.4.23", "3.5.16"] {
                let name = format!("{tool}-{version}");
                symlink(
                    &etcd_binary(version).with_file_name(&name),
                    &bin.join(&name),
                );
            }
        }
        break_it(&bin);
        let before = fingerprint(data);
        let run = Migration::new(target, data, &fixture.member)
            .bin_dir(&bin)
            .bundled(BUNDLE)
            .run();
        let named = bin.display().to_string();
        run.assert_refused_untouched(data, &before, expected);
        run.assert_stderr_has(&named);
        println!("binary {name}: exit {:?}, {}", run.code(), run.last_line());
    }
    println!("{} binary cases refused untouched", cases.len());
}

#[test]
fn a_file_in_place_of_the_data_dir_is_refused_untouched() {
    let tmp = temp_dir("file-data-dir");
    let file = tmp.path().join("data");
    std::fs::write(&file, "not a directory").expect("write");
    // The tree holding the file (a file cannot be a fingerprint's root).
    let before = fingerprint(tmp.path());
    let run = Migration::new("3.5.16", &file, &Member::new("file-data-dir")).run();
    run.assert_refused_untouched(
        tmp.path(),
        &before,
        &[
            &format!("data dir {} exists but is not a directory", file.display()),
            "point --data-dir (or $DATA_DIRECTORY) at",
        ],
    );
}

/// Whether every ancestor of `path` can be searched, and `path` itself
/// read and executed, by a user who is neither owner nor in the group.
fn open_to_others(path: &Path) -> bool {
    let readable = std::fs::metadata(path).is_ok_and(|meta| meta.mode() & 0o005 == 0o005);
    readable
        && path
            .ancestors()
            .skip(1)
            .filter(|dir| !dir.as_os_str().is_empty())
            .all(|dir| std::fs::metadata(dir).is_ok_and(|meta| meta.mode() & 0o001 != 0))
}

/// The uid the unreadable-dir case runs etcd-migrate as (`nobody`).
const OTHER_UID: u32 = 65534;

/// `migration` launched as [`OTHER_UID`] through `setpriv`, with a copy of
/// etcd-migrate in `tmp` if that user cannot reach the built one.
fn run_as_other(migration: Migration, tmp: &Path) -> Migration {
    let mut program = crate::harness::migrator::program();
    if !open_to_others(&program) {
        let copy = tmp.join("etcd-migrate");
        let status = Command::new("install")
            .args(["-m", "0755"])
            .arg(&program)
            .arg(&copy)
            .status()
            .expect("run install");
        assert!(status.success(), "install {}", copy.display());
        program = copy;
    }
    migration.launched_by(
        [
            "setpriv".to_string(),
            format!("--reuid={OTHER_UID}"),
            format!("--regid={OTHER_UID}"),
            "--clear-groups".to_string(),
        ],
        &program,
    )
}

#[test]
fn a_data_dir_another_user_owns_is_refused_untouched() {
    let tmp = temp_dir("unreadable");
    let fixture = fixture_at(tmp.path(), "3.4.23", "unreadable");
    let data = &fixture.data_dir;
    // The test's temp dir is 0700: open it so that only the data dir's own
    // mode (root, 0700) keeps the other user out.
    set_mode(tmp.path(), 0o755);
    assert_eq!(mode(data), 0o700);
    let migration = Migration::new("3.5.16", data, &fixture.member).bundled(BUNDLE);
    let as_other = run_as_other(migration, tmp.path());
    let before = fingerprint(data);
    let run = as_other.run();
    run.assert_refused_untouched(
        data,
        &before,
        &[
            &format!(
                "data dir {} is not readable and writable by uid {OTHER_UID}, which etcd-migrate runs as (owner uid 0, mode 0700)",
                data.display()
            ),
            &format!("chown -R {OTHER_UID} {}", data.display()),
        ],
    );
}

#[test]
fn a_read_only_data_dir_is_refused_before_any_etcd_starts() {
    let tmp = temp_dir("read-only");
    let fixture = fixture_at(tmp.path(), "3.4.23", "read-only");
    let read_only = Mount::read_only_bind(&fixture.data_dir, &tmp.path().join("ro"));
    let before = fingerprint(&fixture.data_dir);
    let migration = Migration::new("3.5.16", &read_only.path, &fixture.member).bundled(BUNDLE);
    let run = migration.run();
    run.assert_refused_untouched(
        &fixture.data_dir,
        &before,
        &[
            &format!(
                "data dir {} is on a read-only filesystem",
                read_only.path.display()
            ),
            &format!("mount {} read-write", read_only.path.display()),
        ],
    );
    // A data dir to be created under a read-only mount: named with the
    // mount it would be created in.
    let missing = read_only.path.join("new");
    let run = Migration::new("3.5.16", &missing, &fixture.member).run();
    run.assert_refused_untouched(
        &fixture.data_dir,
        &before,
        &[
            &format!(
                "{}, where the missing data dir {} would be created, is on a read-only filesystem",
                read_only.path.display(),
                missing.display()
            ),
            "read-write",
        ],
    );

    // Planning only reads: a dry run still shows the plan.
    let dry = migration
        .clone()
        .mode(crate::harness::migrator::Mode::DryRun)
        .run();
    dry.assert_code(0);
    assert!(
        dry.stdout
            .contains("step 1/1: minor-upgrade 3.4.23/etcd3 -> 3.5.16/etcd3"),
        "{}",
        dry.explain()
    );
    before.assert_unchanged(&fingerprint(&fixture.data_dir), "a dry run");
}

#[test]
fn ports_that_are_taken_are_refused_before_anything_is_touched() {
    let tmp = temp_dir("ports");
    let fixture = fixture_at(tmp.path(), "3.4.23", "ports");
    let data = &fixture.data_dir;
    let migration = Migration::new("3.5.16", data, &fixture.member).bundled(BUNDLE);
    let hold = |port: u16| {
        TcpListener::bind(("127.0.0.1", port))
            .unwrap_or_else(|err| panic!("hold 127.0.0.1:{port}: {err}"))
    };
    let before = fingerprint(data);

    let client = hold(migration.port);
    let run = migration.run();
    run.assert_refused_untouched(
        data,
        &before,
        &[
            &format!(
                "client port {0} (127.0.0.1:{0}, from --port",
                migration.port
            ),
            "already in use",
            "give the steps a free loopback port with --port",
        ],
    );
    println!("client port taken: {}", run.last_line());
    drop(client);

    let peer = hold(migration.peer_port);
    let run = migration.run();
    run.assert_refused_untouched(
        data,
        &before,
        &[
            &format!(
                "peer port {0} (127.0.0.1:{0}, from http://localhost:{0} in --listen-peer-urls",
                migration.peer_port
            ),
            "already in use",
            "--peer-port",
            "LISTEN_PEER_URLS",
        ],
    );
    println!("peer port taken: {}", run.last_line());
    drop(peer);

    // The second of two peer URLs, from the environment.
    let taken = free_port();
    let second = hold(taken);
    let urls = format!(
        "http://localhost:{},http://127.0.0.1:{taken}",
        migration.peer_port
    );
    let run = migration.clone().env("LISTEN_PEER_URLS", &urls).run();
    run.assert_refused_untouched(
        data,
        &before,
        &[
            &format!("peer port {taken} (127.0.0.1:{taken}, from http://127.0.0.1:{taken} in"),
            "$LISTEN_PEER_URLS",
        ],
    );
    println!("second LISTEN_PEER_URLS port taken: {}", run.last_line());
    drop(second);

    // A run with no step to take does not probe ports (and stays fast).
    let _client = hold(migration.port);
    let _peer = hold(migration.peer_port);
    let noop = Migration {
        target: "3.4.23".to_string(),
        ..migration.clone()
    }
    .run();
    noop.assert_code(0);
    assert_eq!(
        noop.lines_with("already at target").len(),
        1,
        "{}",
        noop.explain()
    );
    before.assert_unchanged(&fingerprint(data), "a no-op run with the ports taken");
}

/// The failpoint every etcd a run starts passes just before its spawn.
#[cfg(feature = "failpoints")]
const BEFORE_SPAWN: &str = "etcd-before-spawn";

#[cfg(feature = "failpoints")]
#[test]
fn a_port_taken_after_the_check_fails_the_step_with_etcds_words() {
    use crate::harness::migrator::{field, is_ours};
    use crate::harness::MIGRATE_TIMEOUT;

    let tmp = temp_dir("port-race");
    let fixture = fixture_at(tmp.path(), "3.4.23", "port-race");
    let data = &fixture.data_dir;
    let migration = Migration::new("3.5.16", data, &fixture.member).bundled(BUNDLE);
    // The run passes the port check, then is held before its first etcd
    // starts; the test takes the client port in that window, as another
    // process starting at the same moment would.
    let mut running = migration
        .clone()
        .env("FAILPOINTS", format!("{BEFORE_SPAWN}=sleep(2000)"))
        .env("ETCD_MIGRATE_FAILPOINT_TRACE", "1")
        .spawn();
    running.wait_for_line(BEFORE_SPAWN, MIGRATE_TIMEOUT, |line| {
        is_ours(line, "failpoint") && field(line, "name") == Some(BEFORE_SPAWN)
    });
    // Frozen until the port is ours: the hold is 2 s on its own clock.
    let frozen = running.freeze();
    let holder = TcpListener::bind(("127.0.0.1", migration.port))
        .unwrap_or_else(|err| panic!("take port {}: {err}", migration.port));
    drop(frozen);
    let run = running.wait(MIGRATE_TIMEOUT);
    run.assert_code(EXIT_STEP_FAILED)
        .assert_stderr_has(&format!("127.0.0.1:{}", migration.port))
        .assert_stderr_has("address already in use");
    assert_error_carries_etcds_last_line(&run);
    assert_nothing_recorded(&run, data, "3.4.23/etcd3");
    drop(holder);
    // etcd never got the port, so it never served: the data reads back
    // exactly as the fixture wrote it.
    let after = read_back("3.4.23", &fixture.member, data, tmp.path());
    after.assert_kept(&fixture.keyspace, 3000);
}

/// Flips one bit in the data of the middle record of the first WAL file
/// of `data`: a CRC mismatch, not a torn tail (which etcd repairs by
/// truncating). Returns the file and offset.
fn flip_a_bit_in_a_middle_wal_record(data: &Path) -> (PathBuf, usize) {
    let wal_dir = data.join("member/wal");
    let name = dir_names(&wal_dir)
        .into_iter()
        .find(|name| name.ends_with(".wal"))
        .unwrap_or_else(|| panic!("no .wal file in {}", wal_dir.display()));
    let path = wal_dir.join(name);
    let mut bytes =
        std::fs::read(&path).unwrap_or_else(|err| panic!("read {}: {err}", path.display()));
    // Frames: an 8-byte little-endian length word (the top byte flags
    // padding when its high bit is set), the record, the padding; a zero
    // word ends the written part of a preallocated file.
    let mut frames = Vec::new();
    let mut offset = 0;
    while offset + 8 <= bytes.len() {
        let word = u64::from_le_bytes(bytes[offset..offset + 8].try_into().expect("8 bytes"));
        if word == 0 {
            break;
        }
        let record = (word & 0x00ff_ffff_ffff_ffff) as usize;
        let padding = if word >> 63 == 1 {
            ((word >> 56) & 0x7) as usize
        } else {
            0
        };
        frames.push((offset, record));
        offset += 8 + record + padding;
    }
    assert!(
        frames.len() >= 10,
        "{} holds only {} records",
        path.display(),
        frames.len()
    );
    // The record's last byte lies in its data field (encoded last), so
    // the record still decodes and only its CRC no longer matches.
    let (start, record) = frames[frames.len() / 2];
    let at = start + 8 + record - 1;
    bytes[at] ^= 0x01;
    std::fs::write(&path, &bytes).unwrap_or_else(|err| panic!("write {}: {err}", path.display()));
    (path, at)
}

#[test]
fn corrupt_data_fails_the_step_with_etcds_last_lines() {
    let tmp = temp_dir("corrupt");
    type Corrupt = fn(&Path) -> String;
    let cases: [(&str, Corrupt, &[&str]); 2] = [
        (
            "truncated member/snap/db",
            |data| {
                let db = data.join("member/snap/db");
                let file = std::fs::OpenOptions::new()
                    .write(true)
                    .open(&db)
                    .unwrap_or_else(|err| panic!("open {}: {err}", db.display()));
                file.set_len(8192).expect("truncate db");
                format!("{} cut to 8192 bytes", db.display())
            },
            &[],
        ),
        (
            "a flipped bit in a middle WAL record",
            |data| {
                let (path, at) = flip_a_bit_in_a_middle_wal_record(data);
                format!("{} byte {at} flipped", path.display())
            },
            &["crc mismatch"],
        ),
    ];
    for (i, (name, corrupt, etcd_says)) in cases.iter().enumerate() {
        let dir = tmp.path().join(format!("case-{i}"));
        std::fs::create_dir(&dir).expect("mkdir case");
        let fixture = fixture_at(&dir, "3.4.23", &format!("corrupt-{i}"));
        let what = corrupt(&fixture.data_dir);
        let run = Migration::new("3.5.16", &fixture.data_dir, &fixture.member)
            .bundled(BUNDLE)
            .run();
        run.assert_code(EXIT_STEP_FAILED)
            .assert_stderr_has("exited with")
            .assert_stderr_has("its last output")
            .assert_stderr_has("fix the cause and rerun");
        for text in *etcd_says {
            assert!(
                error_text(&run).contains(text),
                "the error should say {text:?}\n{}",
                run.explain()
            );
        }
        assert_error_carries_etcds_last_line(&run);
        assert_nothing_recorded(&run, &fixture.data_dir, "3.4.23/etcd3");
        println!(
            "corrupt data, {name} ({what}): exit {:?}, {}",
            run.code(),
            error_text(&run).lines().next().unwrap_or("")
        );
    }
    println!("{} corrupt-data cases fail the step", cases.len());
}

/// Runs a rollback of a fresh 3.4.23 fixture whose backup goes to a tmpfs
/// with room for the bytes (the free-space check passes) but only 5
/// inodes: the copy of the data dir's tree runs out of them half way.
/// Returns the temp dir (and mount, which must outlive the checks), the
/// data dir's fingerprint before the run, the backup root and the run.
fn run_with_a_backup_that_runs_out_of_inodes(
) -> (tempfile::TempDir, Mount, Fixture, Tree, PathBuf, Outcome) {
    let tmp = temp_dir("full-backup");
    let fixture = fixture_at(tmp.path(), "3.4.23", "full-backup");
    let small = Mount::tmpfs(&tmp.path().join("small"), "size=256m,nr_inodes=5");
    let root = small.path.join("backups");
    let before = fingerprint(&fixture.data_dir);
    let run = Migration::new("3.3.25", &fixture.data_dir, &fixture.member)
        .bundled(BUNDLE)
        .arg("--backup-dir")
        .arg(&root)
        .run();
    (tmp, small, fixture, before, root, run)
}

#[test]
fn disk_full_during_the_backup_fails_before_any_etcd_starts() {
    let (_tmp, _small, fixture, before, _root, run) = run_with_a_backup_that_runs_out_of_inodes();
    run.assert_code(EXIT_STEP_FAILED)
        .assert_stderr_has("cannot back up the data dir")
        .assert_stderr_has("No space left on device");
    assert!(
        run.lines_with("etcd started").is_empty(),
        "the backup comes before the step's etcd\n{}",
        run.explain()
    );
    // No etcd started, so here the data dir is byte-identical.
    before.assert_unchanged(&fingerprint(&fixture.data_dir), "a run whose backup failed");
}

#[test]

fn disk_full_during_the_backup_removes_the_half_backup_and_names_the_backup_dir() {
    let (_tmp, _small, _fixture, _before, root, run) = run_with_a_backup_that_runs_out_of_inodes();
    run.assert_code(EXIT_STEP_FAILED)
        .assert_stderr_has(&root.display().to_string());
    let left: Vec<String> = if root.exists() {
        dir_names(&root)
    } else {
        Vec::new()
    };
    assert!(
        left.is_empty(),
        "the half-written backup must be removed, found {left:?} in {}\n{}",
        root.display(),
        run.explain()
    );
}

/// A backup dir that cannot be written (a read-only mount, a file where
/// a directory must be created, a dir another user owns) failed the run
/// with exit 3 after work; the run now proves it writable by creating a
/// file there (or where it would be created) and refuses with exit 2
/// before anything runs.
#[test]
fn an_unwritable_backup_dir_is_refused_before_anything_runs() {
    let tmp = temp_dir("backup-unwritable");
    let fixture = fixture_at(tmp.path(), "3.4.23", "backup-unwritable");
    let data = &fixture.data_dir;
    let empty = tmp.path().join("empty");
    std::fs::create_dir(&empty).expect("mkdir");
    let read_only = Mount::read_only_bind(&empty, &tmp.path().join("ro"));
    let file = tmp.path().join("file");
    std::fs::write(&file, "not a directory").expect("write");
    let ro = read_only.path.display().to_string();
    let cases: [(PathBuf, String); 3] = [
        (
            read_only.path.clone(),
            format!("backup dir {ro} cannot be written: it is on a read-only filesystem; mount {ro} read-write"),
        ),
        (
            read_only.path.join("backups"),
            format!("{ro}, where it would be created, is on a read-only filesystem; mount {ro} read-write"),
        ),
        (
            file.join("backups"),
            format!(
                "{0}, where it would be created, is not a directory, so it cannot hold one; move {0} out of the way",
                file.display()
            ),
        ),
    ];
    let before = fingerprint(data);
    for (root, expected) in &cases {
        // A rollback: destructive, so backed up by default.
        let run = Migration::new("3.3.25", data, &fixture.member)
            .bundled(BUNDLE)
            .arg("--backup-dir")
            .arg(root)
            .run();
        run.assert_refused_untouched(data, &before, &[expected, "--backup never"]);
        println!("backup dir {}: {}", root.display(), run.last_line());
    }
    assert!(dir_names(&read_only.path).is_empty());

    // Root passes every permission check; another user meets the mode.
    set_mode(tmp.path(), 0o755);
    let status = Command::new("chown")
        .args(["-R", &OTHER_UID.to_string()])
        .arg(data)
        .status()
        .expect("run chown");
    assert!(status.success(), "chown {}", data.display());
    let roots_only = tmp.path().join("roots-only");
    std::fs::create_dir(&roots_only).expect("mkdir");
    set_mode(&roots_only, 0o755);
    let before = fingerprint(data);
    let migration = Migration::new("3.3.25", data, &fixture.member)
        .bundled(BUNDLE)
        .arg("--backup-dir")
        .arg(roots_only.join("backups"));
    let run = run_as_other(migration, tmp.path()).run();
    run.assert_refused_untouched(
        data,
        &before,
        &[
            &format!(
                "backup dir {} cannot be written: creating a file in {} failed",
                roots_only.join("backups").display(),
                roots_only.display()
            ),
            &format!("make {} writable by uid {OTHER_UID}", roots_only.display()),
        ],
    );
    assert!(dir_names(&roots_only).is_empty());
    drop(read_only);
}

#[test]
fn disk_full_during_the_version_txt_write_keeps_the_old_record() {
    let tmp = temp_dir("full-record");
    // Room for the fixture's etcd: its 64 MB WAL segment and the next one,
    // which it preallocates beside it while it runs (with 96 MB, a loaded
    // machine let that race the db's commit: "no space left on device").
    let small = Mount::tmpfs(&tmp.path().join("small"), "size=192m");
    let fixture = fixture_at(&small.path, "3.5.1", "full-record");
    let data = &fixture.data_dir;
    let filler = fill(&small.path);
    let before = fingerprint(data);
    // A patch change records 3.5.16 without running a step.
    let run = Migration::new("3.5.16", data, &fixture.member)
        .bundled("3.5.1,3.5.16")
        .run();
    run.assert_code(1)
        .assert_stderr_has(&format!("cannot record 3.5.16/etcd3 in {}", data.display()))
        .assert_stderr_has("is full")
        .assert_stderr_has("No space left on device")
        .assert_stderr_has("free space there and rerun");
    assert_eq!(read_version_txt(data), "3.5.1/etcd3");
    assert!(
        !data.join(VERSION_TEMP).exists(),
        "the temp file of the failed write is removed\n{}",
        run.explain()
    );
    // The temp file was created and removed: the dir's mtime moved, and
    // nothing else.
    before
        .without(&[""])
        .assert_unchanged(&fingerprint(data).without(&[""]), "a failed record");

    // With room again, the same run records the patch change.
    std::fs::remove_file(&filler).expect("remove the filler");
    let rerun = Migration::new("3.5.16", data, &fixture.member)
        .bundled("3.5.1,3.5.16")
        .run();
    rerun.assert_code(0);
    assert_eq!(read_version_txt(data), "3.5.16/etcd3");
}

#[test]
fn disk_full_during_a_step_records_nothing() {
    let tmp = temp_dir("full-step");
    // etcd 3.4 preallocates each 64 MB WAL segment, and the next one while
    // it runs: room for both and the small fixture, then filled.
    let small = Mount::tmpfs(&tmp.path().join("small"), "size=192m");
    let fixture = fixture_at(&small.path, "3.4.23", "full-step");
    let data = &fixture.data_dir;
    let filler = fill(&small.path);
    let run = Migration::new("3.5.16", data, &fixture.member)
        .bundled(BUNDLE)
        .run();
    run.assert_code(EXIT_STEP_FAILED)
        .assert_stderr_has("no space left on device");
    assert_error_carries_etcds_last_line(&run);
    assert_nothing_recorded(&run, data, "3.4.23/etcd3");

    // With room again the data is served as the fixture left it.
    std::fs::remove_file(&filler).expect("remove the filler");
    let after = read_back("3.4.23", &fixture.member, data, tmp.path());
    after.assert_kept(&fixture.keyspace, 3000);
}

/// The quota of the NOSPACE fixture: small enough to fill in a few puts.
const SMALL_QUOTA: &str = "--quota-backend-bytes=1048576";

/// A 3.4.23 data dir whose etcd raised the NOSPACE alarm: written until a
/// put failed with "database space exceeded", then stopped. Returns what
/// it served.
fn nospace_fixture(data: &Path, member: &Member, log_dir: &Path) -> Keyspace {
    let mut etcd =
        EtcdProcess::start_with("3.4.23", member, data, free_port(), log_dir, &[SMALL_QUOTA]);
    let endpoint = etcd.endpoint();
    let keyspace = block_on(async {
        etcd.wait_ready().await;
        let mut client = connect(&endpoint)
            .await
            .unwrap_or_else(|err| panic!("connect {endpoint}: {err}"));
        for i in 0..10 {
            client
                .put(
                    format!("/registry/pods/ns/pod-{i}"),
                    format!("pod {i}"),
                    None,
                )
                .await
                .unwrap_or_else(|err| panic!("put on {endpoint}: {err}"));
        }
        let big = vec![b'x'; 100 * 1024];
        let mut exceeded = None;
        // etcd sizes the db at bolt's commits (every 100 ms): puts quicker
        // than that all get in first (seen once with 100, on a loaded
        // machine). Put until it refuses, a few hundred at most.
        for i in 0..600 {
            if let Err(err) = client.put(format!("/fill/{i}"), big.clone(), None).await {
                assert!(
                    err.to_string().contains("database space exceeded"),
                    "put {i} on {endpoint}: {err}"
                );
                exceeded = Some(i);
                break;
            }
        }
        assert!(
            exceeded.is_some(),
            "600 puts of 100 KiB fit in a 1 MiB quota"
        );
        // Under the alarm etcd still takes reads and deletes: drop the
        // filler (the quota is checked in batches, so several MB may have
        // got in, past what one range response may carry). The alarm stays
        // raised until someone disarms it.
        client
            .delete("/fill/", Some(DeleteOptions::new().with_prefix()))
            .await
            .unwrap_or_else(|err| panic!("delete /fill/ on {endpoint}: {err}"));
        let alarms = client
            .alarm(AlarmAction::Get, AlarmType::None, None::<AlarmOptions>)
            .await
            .unwrap_or_else(|err| panic!("list alarms on {endpoint}: {err}"));
        assert!(
            alarms
                .alarms()
                .iter()
                .any(|alarm| alarm.alarm() == AlarmType::Nospace),
            "NOSPACE is raised"
        );
        Keyspace::read(&endpoint).await
    });
    etcd.stop();
    set_mode(data, 0o700);
    write_version_txt(data, "3.4.23/etcd3");
    keyspace
}

/// How long a run may take to fail on a raised alarm: it is named on the
/// first answer, far below the health timeout ([`ALARM_HEALTH_TIMEOUT`]).
/// The run starts one etcd or two (1–3 s here); the margin is for a loaded
/// 2-core machine.
const ALARM_FAILS_WITHIN: Duration = Duration::from_secs(60);

/// The `--health-timeout` of the alarm run, in seconds: a run that only
/// gave up at its health timeout would take five times
/// [`ALARM_FAILS_WITHIN`] (the harness kills it after `MIGRATE_TIMEOUT`).
const ALARM_HEALTH_TIMEOUT: u64 = 300;

#[test]
fn a_raised_nospace_alarm_fails_the_step_at_once_with_the_remedy() {
    let tmp = temp_dir("nospace-alarm");
    let data = tmp.path().join("data");
    let member = Member::new("nospace-alarm");
    let before = nospace_fixture(&data, &member, tmp.path());

    let started = Instant::now();
    let run = Migration::new("3.5.16", &data, &member)
        .bundled(BUNDLE)
        .arg("--health-timeout")
        .arg(ALARM_HEALTH_TIMEOUT.to_string())
        .run();
    let took = started.elapsed();
    run.assert_code(EXIT_STEP_FAILED);
    let error = error_text(&run);
    for text in ["NOSPACE", "compact", "defrag", "alarm disarm"] {
        assert!(
            error.contains(text),
            "the error should say {text:?}\n{}",
            run.explain()
        );
    }
    assert!(
        took < ALARM_FAILS_WITHIN,
        "the alarm took {took:?} to fail the step (health timeout {ALARM_HEALTH_TIMEOUT} s)\n{}",
        run.explain()
    );
    assert_nothing_recorded(&run, &data, "3.4.23/etcd3");
    println!(
        "NOSPACE alarm: exit {:?} after {took:?}, {}",
        run.code(),
        error.lines().next().unwrap_or("")
    );

    // Nothing was written and nothing was disarmed behind the operator's
    // back: the keyspace is the fixture's and the alarm is still raised.
    let (after, alarms) = read_back_without_writing("3.4.23", &member, &data, tmp.path());
    after.assert_kept(&before, 3000);
    assert!(
        alarms.iter().any(|alarm| alarm == "Nospace"),
        "the alarm is still raised: {alarms:?}"
    );
}

#[test]
fn a_0755_data_dir_is_corrected_to_0700_when_the_run_touches_it() {
    let tmp = temp_dir("mode");
    let fixture = fixture_at(tmp.path(), "3.5.1", "mode");
    let data = &fixture.data_dir;
    set_mode(data, 0o755);

    // Already at the target: the fast path touches nothing, not even the
    // mode.
    let before = fingerprint(data);
    let noop = Migration::new("3.5.1", data, &fixture.member).run();
    noop.assert_code(0);
    assert!(noop.lines_with("corrected data dir mode").is_empty());
    before.assert_unchanged(&fingerprint(data), "a no-op run");

    // A patch change writes version.txt: the mode is corrected first.
    let run = Migration::new("3.5.16", data, &fixture.member)
        .bundled("3.5.1,3.5.16")
        .run();
    run.assert_code(0);
    let lines = run.lines_with("corrected data dir mode");
    assert_eq!(lines.len(), 1, "{}", run.explain());
    for part in [
        format!("data_dir={}", data.display()),
        "from=0755".to_string(),
        "to=0700".to_string(),
    ] {
        assert!(lines[0].contains(&part), "{} lacks {part}", lines[0]);
    }
    assert_eq!(mode(data), 0o700);
    assert_eq!(read_version_txt(data), "3.5.16/etcd3");
}

#[test]
fn a_flag_wins_over_a_different_env_var_and_says_so() {
    let tmp = temp_dir("flag-env");
    let fixture = fixture_at(tmp.path(), "3.5.16", "flag-env");
    let data = &fixture.data_dir;
    let elsewhere = tmp.path().join("elsewhere");
    let migration = Migration::new("3.5.16", data, &fixture.member).bundled(BUNDLE);
    let before = fingerprint(data);
    let run = migration
        .env("TARGET_VERSION", "3.4.23")
        .env("DATA_DIRECTORY", &elsewhere)
        // The same value as the flag: no conflict, no line.
        .env("ETCD_NAME", &fixture.member.name)
        .run();
    run.assert_code(0);
    let lines = run.lines_with("flag overrides env");
    assert_eq!(lines.len(), 2, "{}", run.explain());
    for (line, parts) in lines.iter().zip([
        [
            "flag=--target-version".to_string(),
            "used=3.5.16".to_string(),
            "env=TARGET_VERSION".to_string(),
            "ignored=3.4.23".to_string(),
        ],
        [
            "flag=--data-dir".to_string(),
            format!("used={}", data.display()),
            "env=DATA_DIRECTORY".to_string(),
            format!("ignored={}", elsewhere.display()),
        ],
    ]) {
        for part in parts {
            assert!(line.contains(&part), "{line} lacks {part}");
        }
    }
    assert_eq!(
        run.lines_with("already at target").len(),
        1,
        "{}",
        run.explain()
    );
    assert!(
        !elsewhere.exists(),
        "the ignored DATA_DIRECTORY is not created"
    );
    before.assert_unchanged(&fingerprint(data), "the flag's target was already reached");
}

#[test]
fn unknown_flags_are_refused_untouched() {
    let tmp = temp_dir("unknown-flags");
    let fixture = fixture_at(tmp.path(), "3.4.23", "unknown-flags");
    let data = &fixture.data_dir;
    let cases: [(&str, &[&str], &[&str]); 3] = [
        (
            "unknown",
            &["--bogus"],
            &["unexpected argument '--bogus'", "--help"],
        ),
        (
            "misspelt",
            &["--target-verison", "3.5.16"],
            &[
                "unexpected argument '--target-verison'",
                "a similar argument exists: '--target-version'",
            ],
        ),
        (
            "an etcd flag before --",
            &["--snapshot-count=5"],
            &[
                "unexpected argument '--snapshot-count'",
                "use '-- --snapshot-count",
            ],
        ),
    ];
    for (name, args, expected) in cases {
        let mut migration = Migration::new("3.5.16", data, &fixture.member).bundled(BUNDLE);
        for arg in args {
            migration = migration.arg(*arg);
        }
        let before = fingerprint(data);
        let run = migration.run();
        run.assert_refused_untouched(data, &before, expected);
        println!(
            "flag {name} {args:?}: exit {:?}, {}",
            run.code(),
            run.stderr.lines().next().unwrap_or("")
        );
    }
}

/// How long the exec'd etcd may take to answer on the user's port.
const EXEC_SERVE_TIMEOUT: Duration = Duration::from_secs(60);

/// Starts `migration` in exec mode and waits until the etcd it becomes
/// serves v3 on `user_url`; panics with its output if it exits first or
/// nothing answers in time.
fn exec_and_serve(migration: &Migration, user_url: &str) -> Running {
    let mut running = migration.spawn();
    let pid = running.pid();
    let deadline = Instant::now() + EXEC_SERVE_TIMEOUT;
    loop {
        if let Some(status) = running.try_status() {
            panic!(
                "etcd-migrate (pid {pid}) exited with {status} instead of becoming etcd; stderr:\n{}",
                running.stderr()
            );
        }
        let served = block_on(async { connect(user_url).await.ok()?.get("k", None).await.ok() });
        if served.is_some() {
            return running;
        }
        assert!(
            Instant::now() < deadline,
            "nothing served v3 on {user_url} within {EXEC_SERVE_TIMEOUT:?}; stderr:\n{}",
            running.stderr()
        );
        std::thread::sleep(POLL_INTERVAL);
    }
}

/// Stops the etcd an exec'd run became, with SIGTERM.
fn stop_exec(mut running: Running) {
    running.signal(nix::sys::signal::Signal::SIGTERM);
    let outcome = running.wait(STOP_GRACE);
    let by_sigterm = std::os::unix::process::ExitStatusExt::signal(&outcome.status)
        == Some(nix::sys::signal::Signal::SIGTERM as i32);
    assert!(
        outcome.status.success() || by_sigterm,
        "etcd should stop on SIGTERM\n{}",
        outcome.explain()
    );
}

/// `DATA_DIRECTORY=/var/etcd/data/` crash-looped every start, the no-op one
/// included: the default backup dir became `/var/etcd/data/.backup`, inside
/// the data dir, and was refused. Every spelling of one dir (a trailing
/// slash, `//`, `/./`, a relative path) must work on every path, and etcd
/// arguments that spell the data dir differently name the same dir.
#[test]
fn a_data_dir_spelt_with_slashes_dots_or_relative_works_on_every_path() {
    let tmp = temp_dir("spelling");
    let fixture = fixture_at(tmp.path(), "3.4.23", "spelling");
    let data = &fixture.data_dir;
    let shown = data.display().to_string();
    let parent = tmp.path().display().to_string();

    // The no-op start: nothing touched, with a trailing slash or `//`.
    let before = fingerprint(data);
    for spelling in [format!("{shown}/"), format!("{parent}//data//")] {
        let run = Migration::new("3.4.23", Path::new(&spelling), &fixture.member).run();
        run.assert_code(0);
        assert_eq!(
            run.lines_with("already at target").len(),
            1,
            "{spelling}\n{}",
            run.explain()
        );
        before.assert_unchanged(&fingerprint(data), &format!("a no-op run on {spelling}"));
    }

    // A walk ending in exec, the data dir given as `<tmp>//./data/` and
    // the etcd arguments' --data-dir as `<data>/`: one dir, no conflict.
    let user_url = format!("http://127.0.0.1:{}", free_port());
    let mut args = fixture.member.exec_args(&user_url);
    args.extend(["--data-dir".to_string(), format!("{shown}/")]);
    let walk = Migration::new(
        "3.5.16",
        Path::new(&format!("{parent}//./data/")),
        &fixture.member,
    )
    .bundled(BUNDLE)
    .mode(crate::harness::migrator::Mode::Exec(args));
    let running = exec_and_serve(&walk, &user_url);
    let served = block_on(Keyspace::read(&user_url));
    served.assert_kept(&fixture.keyspace, 3000);
    assert!(
        running.stderr().contains(&format!("data_dir={shown}\n")),
        "the steps run on the one spelling of the dir; stderr:\n{}",
        running.stderr()
    );
    stop_exec(running);
    assert_eq!(read_version_txt(data), "3.5.16/etcd3");

    // A rollback (destructive: it takes a backup) from the data dir's
    // parent as `./data/`: the backup goes beside the data dir.
    let program = PathBuf::from(env!("CARGO_BIN_EXE_etcd-migrate"));
    let rollback = Migration::new("3.4.23", Path::new("./data/"), &fixture.member)
        .bundled(BUNDLE)
        .launched_by(["env", "-C", parent.as_str()], &program);
    let run = rollback.run();
    run.assert_code(0);
    assert_eq!(run.step_kinds(), ["minor-rollback"], "{}", run.explain());
    assert_eq!(read_version_txt(data), "3.4.23/etcd3");
    let backups = dir_names(&tmp.path().join("data.backup"));
    assert_eq!(
        backups.len(),
        1,
        "one backup beside the data dir: {backups:?}"
    );
    assert!(!data.join(".backup").exists() && !data.join(WORK_DIR).exists());
    let after = crate::harness::keyspace::read_back("3.4.23", &fixture.member, data, tmp.path());
    after.assert_kept(&fixture.keyspace, 3000);
}

/// The address space `etcd-migrate` gets while it inspects a huge
/// version.txt: far less than the file, so reading it whole would fail.
const SMALL_ADDRESS_SPACE: u64 = 64 << 20;

/// Bad values are refused before anything runs: a `--health-timeout` that
/// overflowed the deadline (a panic, exit 101, after an etcd had started),
/// port 0, a version.txt symlink to nowhere (reported as "no version.txt"
/// in a dir listing version.txt) and a version.txt of hundreds of MB (read
/// whole and quoted whole in a 134 MB error line).
#[test]
fn bad_values_are_refused_before_anything_runs() {
    let tmp = temp_dir("bad-values");
    let fixture = fixture_at(tmp.path(), "3.4.23", "bad-values");
    let data = &fixture.data_dir;
    let migration = Migration::new("3.5.16", data, &fixture.member).bundled(BUNDLE);
    let before = fingerprint(data);
    type Case = (&'static str, Migration, Vec<String>);
    let cases: Vec<Case> = vec![
        (
            "an overflowing --health-timeout",
            migration
                .clone()
                .arg("--health-timeout")
                .arg("18446744073709551615"),
            vec![
                "--health-timeout = \"18446744073709551615\" is invalid".into(),
                "from 1 to 86400 seconds (24 h)".into(),
            ],
        ),
        (
            "a --health-timeout over a day",
            migration.clone().arg("--health-timeout").arg("86401"),
            vec!["--health-timeout = \"86401\" is invalid".into()],
        ),
        (
            "--port 0",
            Migration {
                port: 0,
                ..migration.clone()
            },
            vec!["--port = \"0\" is invalid".into(), "a free port".into()],
        ),
        (
            "--peer-port 0",
            Migration {
                peer_port: 0,
                ..migration.clone()
            },
            vec!["--peer-port = \"0\" is invalid".into()],
        ),
        (
            "port 0 in LISTEN_PEER_URLS",
            migration
                .clone()
                .env("LISTEN_PEER_URLS", "http://127.0.0.1:0"),
            vec![
                "peer port 0 (127.0.0.1:0, from http://127.0.0.1:0 in --listen-peer-urls".into(),
                "give a real port in LISTEN_PEER_URLS".into(),
            ],
        ),
    ];
    for (name, run_it, expected) in cases {
        let expected: Vec<&str> = expected.iter().map(String::as_str).collect();
        let run = run_it.run();
        run.assert_refused_untouched(data, &before, &expected);
        println!("{name}: exit {:?}, {}", run.code(), run.last_line());
    }

    // version.txt a symlink to nowhere: named as such, with the fix.
    let version_txt = data.join("version.txt");
    let shown = version_txt.display().to_string();
    let nowhere = tmp.path().join("moved/version.txt");
    std::fs::remove_file(&version_txt).expect("rm version.txt");
    symlink(&nowhere, &version_txt);
    let before = fingerprint(data);
    let run = migration.run();
    run.assert_refused_untouched(
        data,
        &before,
        &[
            &format!(
                "{shown} is a symlink to {}, which does not exist",
                nowhere.display()
            ),
            &format!("rm {shown} && echo 3.4.23/etcd3 > {shown}"),
        ],
    );
    assert!(
        !run.stderr.contains("has no version.txt"),
        "{}",
        run.explain()
    );
    println!("dangling version.txt: {}", run.last_line());

    // A 128 MiB version.txt (sparse), read with 64 MiB of address space:
    // refused by its size, which the message gives, and not one byte of
    // its content.
    std::fs::remove_file(&version_txt).expect("rm link");
    let huge = std::fs::File::create(&version_txt).expect("create");
    huge.set_len(128 << 20).expect("grow");
    drop(huge);
    let before = fingerprint(data);
    let program = PathBuf::from(env!("CARGO_BIN_EXE_etcd-migrate"));
    let run = migration
        .clone()
        .launched_by(
            ["prlimit".to_string(), format!("--as={SMALL_ADDRESS_SPACE}")],
            &program,
        )
        .run();
    run.assert_refused_untouched(
        data,
        &before,
        &[
            &format!("{shown} is 134217728 bytes"),
            "not a version record",
            &format!("echo 3.4.23/etcd3 > {shown}"),
        ],
    );
    assert!(
        run.stderr.len() < 4000 && !run.stderr.contains("\\0"),
        "the content is not quoted\n{}",
        run.explain()
    );
    println!("huge version.txt: {}", run.last_line());
}

/// Run outside the image (a dev checkout, a host) with the default or a
/// relative bin dir, a target the dir lacks was "not bundled (bundled:
/// none)" with no word of where etcd-migrate had looked. Every such error
/// names the bin dir it searched, absolute, and `--bin-dir`.
#[test]
fn a_release_missing_from_the_bin_dir_names_the_dir_searched_and_bin_dir() {
    let tmp = temp_dir("bin-dir");
    let fixture = fixture_at(tmp.path(), "3.4.23", "bin-dir");
    let data = &fixture.data_dir;
    let bin = tmp.path().join("bin");
    std::fs::create_dir(&bin).expect("mkdir bin");
    symlink(&etcd_binary("3.4.23"), &bin.join("etcd-3.4.23"));
    let empty = tmp.path().join("empty");
    let program = PathBuf::from(env!("CARGO_BIN_EXE_etcd-migrate"));
    let parent = tmp.path().display().to_string();
    // Started from the temp dir, with the bin dir given relative to it.
    let from_tmp = |target: &str, dir: &Path, bin_dir: &str| {
        Migration::new(target, dir, &fixture.member)
            .bin_dir(Path::new(bin_dir))
            .launched_by(["env", "-C", parent.as_str()], &program)
    };
    let searched = format!("bin dir {}", bin.display());
    let before = fingerprint(tmp.path());
    let cases: [(&str, Migration, Vec<String>); 6] = [
        (
            "an unbundled target",
            from_tmp("3.5.16", data, "./bin/"),
            vec![
                format!("{searched} (every etcd-<version> there"),
                "point --bin-dir at their directory".into(),
                "target etcd 3.5.16 is not bundled (bundled: 3.4.23)".into(),
            ],
        ),
        (
            "an unbundled target for an empty dir",
            from_tmp("3.5.16", &empty, "bin"),
            vec![
                format!("cannot start the empty data dir {} at the target with the releases in {searched}", empty.display()),
                "--bin-dir".into(),
            ],
        ),
        (
            "a bin dir that does not exist",
            from_tmp("3.5.16", data, "nowhere"),
            vec![
                format!("cannot list bin dir {}/nowhere", parent),
                "point --bin-dir at the directory that holds etcd-<version>".into(),
            ],
        ),
        (
            "a target --bundled-versions leaves out",
            from_tmp("3.5.16", data, "bin").bundled("3.4.23"),
            vec![
                format!("with the releases --bundled-versions lists, from {searched}"),
                "--bin-dir".into(),
            ],
        ),
        (
            "a target --bundled-versions lists but the bin dir lacks",
            from_tmp("3.5.16", data, "bin").bundled("3.4.23,3.5.16"),
            vec![
                format!("{}/etcd-3.5.16 is missing", bin.display()),
                "point --bin-dir at the directory that holds etcd-<version>".into(),
            ],
        ),
        (
            "the no-op exec of a target whose server is missing",
            from_tmp("3.4.23", data, "bin")
                .bundled("3.4.23")
                .mode(crate::harness::migrator::Mode::Exec(Vec::new())),
            vec![
                format!("{}/etcd-3.4.23 is missing", bin.display()),
                "point --bin-dir at the directory that holds etcd-<version>".into(),
            ],
        ),
    ];
    // The no-op's server goes missing only for its own case.
    for (name, migration, expected) in cases {
        let hidden = bin.join("etcd-3.4.23.hidden");
        let noop = name.starts_with("the no-op");
        if noop {
            std::fs::rename(bin.join("etcd-3.4.23"), &hidden).expect("hide etcd-3.4.23");
        }
        let before = if noop {
            fingerprint(tmp.path())
        } else {
            before.clone()
        };
        let expected: Vec<&str> = expected.iter().map(String::as_str).collect();
        let run = migration.run();
        run.assert_refused_untouched(tmp.path(), &before, &expected);
        println!("{name}: {}", run.last_line());
        if noop {
            std::fs::rename(&hidden, bin.join("etcd-3.4.23")).expect("restore etcd-3.4.23");
        }
    }
}

/// Writes 20 keys with real etcd 3.4.23 into `data`, its WAL in `wal`
/// (`--wal-dir`), stops it and leaves the dir as the Kubernetes image
/// does (0700, version.txt); returns what it served.
fn fixture_with_wal_elsewhere(
    data: &Path,
    wal: &Path,
    member: &Member,
    log_dir: &Path,
) -> Keyspace {
    let wal_flag = format!("--wal-dir={}", wal.display());
    let mut etcd =
        EtcdProcess::start_with("3.4.23", member, data, free_port(), log_dir, &[&wal_flag]);
    let keyspace = block_on(async {
        etcd.wait_ready().await;
        let endpoint = etcd.endpoint();
        let mut client = connect(&endpoint)
            .await
            .unwrap_or_else(|err| panic!("connect {endpoint}: {err}"));
        for i in 0..20 {
            client
                .put(format!("/registry/pods/p-{i:02}"), format!("pod {i}"), None)
                .await
                .unwrap_or_else(|err| panic!("put on {endpoint}: {err}"));
        }
        Keyspace::read(&endpoint).await
    });
    etcd.stop();
    assert_eq!(keyspace.entries.len(), 20);
    assert!(
        !data.join("member/wal").exists() && !dir_names(wal).is_empty(),
        "etcd keeps the WAL in {} only",
        wal.display()
    );
    set_mode(data, 0o700);
    write_version_txt(data, "3.4.23/etcd3");
    keyspace
}

/// `--wal-dir` in the etcd arguments (any Go spelling), `$ETCD_WAL_DIR`, a
/// config file's `wal-dir`, or `--wal-dir` in `$ETCD_CREDS` was ignored by
/// the steps: the baseline etcd found no WAL in the data dir, bootstrapped
/// a fresh cluster on the db, and acknowledged writes were lost. A plan
/// with steps now refuses each before anything runs, naming the setting and
/// the way through; the no-op start passes it on to the exec'd etcd; and
/// the way through (the WAL moved into the data dir) migrates every key.
#[test]
fn a_wal_outside_the_data_dir_refuses_steps_and_passes_through_a_no_op() {
    let tmp = temp_dir("wal-dir");
    let member = Member::new("wal-dir");
    let data = tmp.path().join("data");
    let wal = tmp.path().join("wal");
    let keyspace = fixture_with_wal_elsewhere(&data, &wal, &member, tmp.path());
    let (data_shown, wal_shown) = (data.display().to_string(), wal.display().to_string());
    let config_file = tmp.path().join("etcd.yml");
    std::fs::write(
        &config_file,
        format!(
            "name: {}\ndata-dir: {data_shown}\nwal-dir: {wal_shown}\n",
            member.name
        ),
    )
    .expect("write the config file");
    let file_shown = config_file.display().to_string();
    let exec = |extra: &[&str]| {
        let mut args = member.exec_args("http://127.0.0.1:1");
        args.extend(extra.iter().map(|arg| arg.to_string()));
        Migration::new("3.5.16", &data, &member)
            .bundled(BUNDLE)
            .mode(crate::harness::migrator::Mode::Exec(args))
    };
    let no_exec = Migration::new("3.5.16", &data, &member).bundled(BUNDLE);
    let in_args = "--wal-dir in the etcd arguments";
    let in_file =
        |from: &str| format!("wal-dir in the etcd config file {file_shown} (from {from})");
    let cases: Vec<(&str, Migration, String)> = vec![
        (
            "--wal-dir=x",
            exec(&[&format!("--wal-dir={wal_shown}")]),
            in_args.into(),
        ),
        (
            "--wal-dir x",
            exec(&["--wal-dir", &wal_shown]),
            in_args.into(),
        ),
        (
            "-wal-dir=x",
            exec(&[&format!("-wal-dir={wal_shown}")]),
            in_args.into(),
        ),
        (
            "-wal-dir x",
            exec(&["-wal-dir", &wal_shown]),
            in_args.into(),
        ),
        (
            "$ETCD_WAL_DIR",
            no_exec.clone().env("ETCD_WAL_DIR", &wal),
            "$ETCD_WAL_DIR".into(),
        ),
        (
            "--config-file",
            exec(&["--config-file", &file_shown]),
            in_file("--config-file in the etcd arguments"),
        ),
        (
            "$ETCD_CONFIG_FILE",
            no_exec.clone().env("ETCD_CONFIG_FILE", &config_file),
            in_file("$ETCD_CONFIG_FILE"),
        ),
        (
            "$ETCD_CREDS",
            no_exec
                .clone()
                .env("ETCD_CREDS", format!("--wal-dir {wal_shown}")),
            "--wal-dir in --etcd-server-extra-args ($ETCD_CREDS)".into(),
        ),
    ];
    // The data dir, the WAL and the config file: none may change.
    let before = fingerprint(tmp.path());
    for (name, migration, setting) in &cases {
        let run = migration.run();
        run.assert_refused_untouched(
            tmp.path(),
            &before,
            &[
                &format!(
                    "{setting} keeps the WAL in {wal_shown}, outside the data dir {data_shown}"
                ),
                "would find no WAL",
                &format!("mv {wal_shown} {data_shown}/member/wal"),
                &format!("remove {setting}"),
            ],
        );
        println!("{name}: {}", run.last_line());
    }
    println!("{} WAL settings refused untouched", cases.len());

    // Given a config file, etcd ignores its flags (the --data-dir we add
    // included) and serves the file's data-dir, or <name>.etcd: an exec,
    // even a no-op one, with a file that names no data dir is refused.
    let bare_file = tmp.path().join("bare.yml");
    std::fs::write(
        &bare_file,
        format!(
            "name: {}
",
            member.name
        ),
    )
    .expect("write");
    let before = fingerprint(tmp.path());
    let mut args = member.exec_args("http://127.0.0.1:1");
    args.extend(["--config-file".to_string(), bare_file.display().to_string()]);
    let run = Migration::new("3.4.23", &data, &member)
        .mode(crate::harness::migrator::Mode::Exec(args))
        .run();
    run.assert_refused_untouched(
        tmp.path(),
        &before,
        &[
            &format!("the etcd config file {} (from --config-file in the etcd arguments) sets no data-dir", bare_file.display()),
            &format!("set `data-dir: {data_shown}` in {}", bare_file.display()),
        ],
    );
    std::fs::remove_file(&bare_file).expect("rm");

    // Already at the target: no etcd runs before the exec, which gets the
    // flag as it is and serves the data from its WAL.
    let user_url = format!("http://127.0.0.1:{}", free_port());
    let mut args = member.exec_args(&user_url);
    args.push(format!("--wal-dir={wal_shown}"));
    let noop =
        Migration::new("3.4.23", &data, &member).mode(crate::harness::migrator::Mode::Exec(args));
    let running = exec_and_serve(&noop, &user_url);
    let cmdline = std::fs::read(format!("/proc/{}/cmdline", running.pid()))
        .map(|raw| String::from_utf8_lossy(&raw).replace('\0', " "))
        .unwrap_or_default();
    assert!(
        cmdline.contains(&format!("--wal-dir={wal_shown}")),
        "the exec'd etcd gets --wal-dir: {cmdline}"
    );
    let served = block_on(Keyspace::read(&user_url));
    served.assert_kept(&keyspace, 0);
    stop_exec(running);

    // The way through the message gives: the WAL moved into the data dir,
    // no flag, and the walk keeps every key.
    std::fs::rename(&wal, data.join("member/wal")).expect("mv the WAL into the data dir");
    let run = no_exec.run();
    run.assert_code(0);
    assert_eq!(read_version_txt(&data), "3.5.16/etcd3");
    let after = crate::harness::keyspace::read_back("3.5.16", &member, &data, tmp.path());
    after.assert_kept(&keyspace, 0);
}

/// The target the run execs refuses the user's etcd flags (`--ca-file`,
/// which 3.3 accepts and 3.4 removed): found by the target's version check
/// with those flags, before any step. Refused with exit 2 naming the
/// release and etcd's own words; the data dir byte-identical, no etcd
/// started.
#[test]
fn a_target_that_refuses_the_etcd_flags_is_refused_before_any_step() {
    let tmp = temp_dir("flags-refused");
    let fixture = fixture_at(tmp.path(), "3.3.25", "flags-refused");
    let data = fixture.data_dir.clone();
    let member = Member::new("flags-refused");
    let before = fingerprint(&data);
    let mut args = member.exec_args("http://127.0.0.1:1");
    args.push(format!("--ca-file={}", data.join("ca.crt").display()));
    let run = Migration::new("3.4.23", &data, &member)
        .bundled(BUNDLE)
        .mode(crate::harness::migrator::Mode::Exec(args))
        .run();
    run.assert_refused_untouched(
        &data,
        &before,
        &[
            "etcd-3.4.23 (etcd 3.4.23) refuses the etcd flags it is to run with",
            "flag provided but not defined: -ca-file",
            "--trusted-ca-file",
        ],
    );
    assert!(
        run.lines_with("step start").is_empty(),
        "no step ran\n{}",
        run.explain()
    );
}

/// `ETCD_CREDS` goes to every etcd a step runs: a flag one of them refuses
/// (`--ca-file`, which 3.3 accepts and 3.4 removed) is found by that
/// release's version check with it, before anything runs, naming
/// `ETCD_CREDS` and the releases it goes to (issue 18: found before, it
/// failed the 3.4 step's start).
#[test]
fn a_step_release_that_refuses_etcd_creds_is_refused_before_any_step() {
    let tmp = temp_dir("creds-refused");
    let fixture = fixture_at(tmp.path(), "3.3.25", "creds-refused");
    let data = fixture.data_dir.clone();
    let member = Member::new("creds-refused");
    let before = fingerprint(&data);
    let run = Migration::new("3.5.16", &data, &member)
        .bundled(BUNDLE)
        .env(
            "ETCD_CREDS",
            format!("--ca-file={}", data.join("ca.crt").display()),
        )
        .run();
    run.assert_refused_untouched(
        &data,
        &before,
        &[
            "(etcd 3.4.23) refuses the etcd flags it is to run with",
            "flag provided but not defined: -ca-file",
            "ETCD_CREDS (--etcd-server-extra-args) goes to every etcd a step runs (3.3.25, 3.4.23, 3.5.16)",
        ],
    );
}
