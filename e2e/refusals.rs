//! Input that etcd-migrate must refuse before touching anything: exit 2, a
//! message naming the subject, and a data dir byte-identical (same paths,
//! modes, sizes, mtimes, contents) before and after. `--dry-run` belongs
//! here too: it prints the plan and changes nothing.

use std::path::Path;

use crate::harness::fixture::{self, Fixture, FixtureSpec};
use crate::harness::migrator::{Migration, Mode, Outcome};
use crate::harness::tree::fingerprint;
use crate::harness::{etcd_binary, set_mode, symlink, temp_dir, write_version_txt, Member};

/// A small 3.3.25 data dir in `tmp`, written by real etcd.
fn fixture_3_3(tmp: &Path, tag: &str) -> Fixture {
    let data = tmp.join("data");
    fixture::build(FixtureSpec::small("3.3.25"), &data, &Member::new(tag), tmp)
}

/// Runs `migration` and asserts it exits 2, says each of `expected`, runs
/// no etcd and leaves its data dir exactly as it was.
fn assert_refused_untouched(migration: &Migration, expected: &[&str]) -> Outcome {
    let before = fingerprint(&migration.data_dir);
    let run = migration.run();
    run.assert_refused_untouched(&migration.data_dir, &before, expected);
    run
}

/// A bin dir in `tmp` whose `etcd-<v>` are links to the real releases.
fn linked_bin_dir(tmp: &Path, versions: &[&str]) -> std::path::PathBuf {
    let bin = tmp.join("bin");
    std::fs::create_dir(&bin).expect("mkdir bin");
    for version in versions {
        symlink(&etcd_binary(version), &bin.join(format!("etcd-{version}")));
    }
    bin
}

#[test]
fn missing_bundled_minor_is_refused_untouched() {
    let tmp = temp_dir("gap");
    let fixture = fixture_3_3(tmp.path(), "gap");
    let migration =
        Migration::new("3.5.16", &fixture.data_dir, &fixture.member).bundled("3.3.25,3.5.16");
    assert_refused_untouched(&migration, &["no etcd 3.4.x is bundled"]);
}

#[test]
fn malformed_version_txt_is_refused_untouched() {
    let tmp = temp_dir("malformed");
    let fixture = fixture_3_3(tmp.path(), "malformed");
    let data = &fixture.data_dir;
    write_version_txt(data, "3.3/etcd3");
    let migration = Migration::new("3.5.16", data, &fixture.member);
    let version_txt = data.join("version.txt");
    assert_refused_untouched(
        &migration,
        &["\"3.3/etcd3\"", &version_txt.display().to_string()],
    );

    // Non-empty, and nothing says which etcd wrote it.
    std::fs::remove_file(&version_txt).expect("remove version.txt");
    let run = assert_refused_untouched(
        &migration,
        &[
            &format!("data dir {} is not empty", data.display()),
            "has no version.txt",
            "member",
            &format!("> {}", version_txt.display()),
        ],
    );
    assert!(
        run.stderr.contains("echo 3."),
        "the message shows how to declare the version\n{}",
        run.explain()
    );
}

#[test]
fn unknown_target_is_refused_untouched() {
    let tmp = temp_dir("unknown");
    let fixture = fixture_3_3(tmp.path(), "unknown");
    for target in ["3.7.0", "3.4.99"] {
        let migration = Migration::new(target, &fixture.data_dir, &fixture.member);
        assert_refused_untouched(
            &migration,
            &[&format!("target etcd {target} is not bundled")],
        );
    }
}

#[test]
fn mislabelled_binary_is_refused_before_touching() {
    let tmp = temp_dir("mislabelled");
    let fixture = fixture_3_3(tmp.path(), "mislabelled");

    let bin = linked_bin_dir(tmp.path(), &["3.3.25", "3.5.16"]);
    let impostor = bin.join("etcd-3.4.23");
    symlink(&etcd_binary("3.5.16"), &impostor);
    let migration = Migration::new("3.5.16", &fixture.data_dir, &fixture.member)
        .bin_dir(&bin)
        .bundled("3.3.25,3.4.23,3.5.16");
    assert_refused_untouched(
        &migration,
        &[&format!(
            "{} reports version 3.5.16, not 3.4.23",
            impostor.display()
        )],
    );

    // A file that cannot be executed is named before anything runs.
    std::fs::remove_file(&impostor).expect("remove the impostor");
    std::fs::write(&impostor, b"\x7fELF not really").expect("write");
    set_mode(&impostor, 0o644);
    assert_refused_untouched(
        &migration,
        &[&format!("{} is not an executable file", impostor.display())],
    );
}

#[test]
fn dry_run_prints_the_plan_and_changes_nothing() {
    let tmp = temp_dir("dry");
    let fixture = fixture_3_3(tmp.path(), "dry");
    let migration = Migration::new("3.5.16", &fixture.data_dir, &fixture.member)
        .bundled("3.3.25,3.4.23,3.5.16")
        .mode(Mode::DryRun);
    let before = fingerprint(&fixture.data_dir);
    let run = migration.run();
    run.assert_code(0);
    before.assert_unchanged(&fingerprint(&fixture.data_dir), "--dry-run");
    assert!(
        run.lines_with("etcd started").is_empty(),
        "--dry-run starts no etcd\n{}",
        run.explain()
    );

    let steps: Vec<&str> = run
        .stdout
        .lines()
        .filter(|line| line.starts_with("step "))
        .collect();
    assert_eq!(steps.len(), 2, "one line per step\n{}", run.explain());
    let client = format!("client http://127.0.0.1:{}", migration.port);
    let peer = format!("peer {}", fixture.member.peer_url());
    for (line, (label, release)) in steps.iter().zip([("1/2", "3.4.23"), ("2/2", "3.5.16")]) {
        let binary = migration.bin_dir.join(format!("etcd-{release}"));
        for part in [
            format!("step {label}:"),
            binary.display().to_string(),
            client.clone(),
            peer.clone(),
        ] {
            assert!(
                line.contains(&part),
                "{line:?} should contain {part:?}\n{}",
                run.explain()
            );
        }
    }
    assert!(
        run.stdout.contains("3.3.25/etcd3"),
        "the plan names where it starts\n{}",
        run.explain()
    );
}
