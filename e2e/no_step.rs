//! Runs that start no etcd: an empty or missing data dir only records the
//! target, data already at the target is left alone, and a patch change
//! within one minor is recorded without a step.

use crate::harness::fixture::{self, FixtureSpec};
use crate::harness::keyspace::read_back;
use crate::harness::migrator::{Migration, Outcome};
use crate::harness::tree::fingerprint;
use crate::harness::{dir_names, mode, read_version_txt, set_mode, temp_dir, Member};

/// Asserts the run started no etcd.
fn assert_no_step(run: &Outcome) {
    assert!(
        run.lines_with("step start").is_empty() && run.lines_with("etcd started").is_empty(),
        "no step should run\n{}",
        run.explain()
    );
}

#[test]
fn empty_dir_records_the_target_without_steps() {
    let tmp = temp_dir("empty");
    let member = Member::new("empty");

    let empty = tmp.path().join("empty");
    std::fs::create_dir(&empty).expect("mkdir");
    set_mode(&empty, 0o700);
    let run = Migration::new("3.5.16", &empty, &member).run();
    run.assert_code(0);
    assert_no_step(&run);
    assert_eq!(read_version_txt(&empty), "3.5.16/etcd3");
    assert_eq!(
        dir_names(&empty),
        ["version.txt"],
        "only version.txt is written (no member/ dir)"
    );

    let missing = tmp.path().join("missing");
    let run = Migration::new("3.5.16", &missing, &member).run();
    run.assert_code(0);
    assert_no_step(&run);
    assert_eq!(mode(&missing), 0o700, "a created data dir gets etcd's mode");
    assert_eq!(read_version_txt(&missing), "3.5.16/etcd3");
    assert_eq!(dir_names(&missing), ["version.txt"]);
}

#[test]
fn noop_when_already_at_target() {
    let tmp = temp_dir("noop");
    let data = tmp.path().join("data");
    let member = Member::new("noop");
    fixture::build(FixtureSpec::small("3.5.16"), &data, &member, tmp.path());
    let before = fingerprint(&data);

    let run = Migration::new("3.5.16", &data, &member).run();
    run.assert_code(0);
    assert_eq!(
        run.lines_with("already at target").len(),
        1,
        "{}",
        run.explain()
    );
    assert_no_step(&run);
    before.assert_unchanged(&fingerprint(&data), "a run already at its target");
}

#[test]
fn patch_change_needs_no_step() {
    let tmp = temp_dir("patch");
    let data = tmp.path().join("data");
    let member = Member::new("patch");
    let fixture = fixture::build(FixtureSpec::small("3.5.1"), &data, &member, tmp.path());
    let before = fingerprint(&data);

    let run = Migration::new("3.5.16", &data, &member)
        .bundled("3.5.1,3.5.16")
        .run();
    run.assert_code(0);
    assert_no_step(&run);
    assert_eq!(read_version_txt(&data), "3.5.16/etcd3");
    // Only version.txt (and so the dir's own mtime) changed.
    before.without(&["", "version.txt"]).assert_unchanged(
        &fingerprint(&data).without(&["", "version.txt"]),
        "a patch change",
    );

    // And 3.5.16 serves 3.5.1's data as it is.
    let after = read_back("3.5.16", &member, &data, tmp.path());
    after.assert_kept(&fixture.keyspace, 3000);
}
