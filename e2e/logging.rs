//! `--log-format json`: every line on stderr is one JSON object, ours with
//! `"source":"etcd-migrate"`, relayed etcd output with
//! `"source":"etcd-<release>"`.

use serde_json::Value;

use crate::harness::fixture::{self, FixtureSpec};
use crate::harness::migrator::{Migration, Outcome};
use crate::harness::{read_version_txt, temp_dir, Member};

/// Parses every stderr line as a JSON object; returns them.
fn json_lines(run: &Outcome) -> Vec<serde_json::Map<String, Value>> {
    run.stderr
        .lines()
        .map(|line| match serde_json::from_str::<Value>(line) {
            Ok(Value::Object(object)) => object,
            _ => panic!(
                "stderr line is not one JSON object: {line:?}\n{}",
                run.explain()
            ),
        })
        .collect()
}

/// The `msg` of every line whose source is etcd-migrate.
fn our_messages(lines: &[serde_json::Map<String, Value>]) -> Vec<&str> {
    lines
        .iter()
        .filter(|line| line.get("source").and_then(Value::as_str) == Some("etcd-migrate"))
        .filter_map(|line| line.get("msg").and_then(Value::as_str))
        .collect()
}

#[test]
fn json_log_format_is_one_object_per_line() {
    let tmp = temp_dir("json");
    let data = tmp.path().join("data");
    let member = Member::new("json");
    fixture::build(FixtureSpec::small("3.4.23"), &data, &member, tmp.path());

    // A real step: our lines and the relayed etcd output.
    let run = Migration::new("3.5.16", &data, &member)
        .bundled("3.4.23,3.5.16")
        .arg("--log-format")
        .arg("json")
        .run();
    run.assert_code(0);
    assert_eq!(read_version_txt(&data), "3.5.16/etcd3");
    let lines = json_lines(&run);
    for line in &lines {
        let source = line.get("source").and_then(Value::as_str);
        assert!(
            // 3.4.23 reads the baseline, 3.5.16 runs the step.
            matches!(
                source,
                Some("etcd-migrate") | Some("etcd-3.4.23") | Some("etcd-3.5.16")
            ),
            "unexpected source in {line:?}"
        );
        for field in ["ts", "level", "msg"] {
            assert!(line.contains_key(field), "{field} missing in {line:?}");
        }
    }
    let ours = our_messages(&lines);
    for message in [
        "baseline taken offline",
        "step start",
        "etcd started",
        "step done",
        "migrated",
    ] {
        assert!(
            ours.contains(&message),
            "no {message:?} line of ours\n{}",
            run.explain()
        );
    }
    let started = lines
        .iter()
        .filter(|line| line.get("msg").and_then(Value::as_str) == Some("etcd started"))
        .find(|line| line.get("step").and_then(Value::as_str) != Some("baseline"))
        .expect("a step's etcd started line");
    assert_eq!(started.get("step").and_then(Value::as_str), Some("1/1"));
    assert_eq!(
        started.get("version").and_then(Value::as_str),
        Some("3.5.16")
    );
    assert!(started.get("pid").and_then(Value::as_i64).is_some());
    assert!(
        lines
            .iter()
            .any(|line| line.get("source").and_then(Value::as_str) == Some("etcd-3.5.16")),
        "etcd's own output is relayed as JSON too\n{}",
        run.explain()
    );

    // A refusal is reported in JSON as well.
    let empty = tmp.path().join("empty");
    let run = Migration::new("3.7.0", &empty, &member)
        .arg("--log-format")
        .arg("json")
        .run();
    run.assert_code(2);
    let lines = json_lines(&run);
    assert!(
        lines.iter().any(|line| {
            line.get("level").and_then(Value::as_str) == Some("error")
                && line.get("source").and_then(Value::as_str) == Some("etcd-migrate")
        }),
        "the refusal is an error line\n{}",
        run.explain()
    );
}

#[test]
fn json_log_format_covers_configuration_errors() {
    let tmp = temp_dir("json-config");
    let member = Member::new("json-config");
    // The flags parse and --log-format is valid; another setting is not.
    let run = Migration::new("3.5.16", &tmp.path().join("data"), &member)
        .arg("--log-format")
        .arg("json")
        .arg("--health-timeout")
        .arg("0")
        .run();
    run.assert_code(2);
    let lines = json_lines(&run);
    assert!(
        lines.iter().any(|line| {
            line.get("level").and_then(Value::as_str) == Some("error")
                && line
                    .get("msg")
                    .and_then(Value::as_str)
                    .is_some_and(|msg| msg.contains("--health-timeout"))
        }),
        "the configuration error names the flag, in JSON\n{}",
        run.explain()
    );
}
