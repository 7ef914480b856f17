//! This module owns our log output: one line per state transition, on
//! stderr, prefixed `[etcd-migrate]` in text mode so it stands apart from
//! etcd's own output, or one JSON object per line for machines. Child output
//! relayed from a step's etcd goes through here too, prefixed with the
//! release that printed it (`[etcd-3.4.23]`).

use std::io::Write;
use std::str::FromStr;
use std::sync::OnceLock;
use std::time::{Duration, SystemTime};

use serde_json::{Map, Value};

/// How log lines look.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogFormat {
    /// `[etcd-migrate] <time> <level> <message> key=value …`
    #[default]
    Text,
    /// `{"ts":…,"level":…,"source":"etcd-migrate","msg":…,…}`
    Json,
}

/// Severity of a line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    /// A transition or fact.
    Info,
    /// Something the operator should look at, that did not stop the run.
    Warn,
    /// Why the run stopped.
    Error,
}

static FORMAT: OnceLock<LogFormat> = OnceLock::new();

/// An error and its causes on one line, each cause once (a cause already
/// quoted in its parent's message is not repeated): "connection refused"
/// hides two or three levels down in hyper/tonic errors.
pub fn error_chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

/// Sets the format for the rest of the process; later calls are ignored.
pub fn init(format: LogFormat) {
    let _ = FORMAT.set(format);
}

fn format() -> LogFormat {
    FORMAT.get().copied().unwrap_or_default()
}

impl FromStr for LogFormat {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "text" => Ok(LogFormat::Text),
            "json" => Ok(LogFormat::Json),
            _ => Err("expected text or json".to_string()),
        }
    }
}

impl Level {
    fn as_str(self) -> &'static str {
        match self {
            Level::Info => "info",
            Level::Warn => "warn",
            Level::Error => "error",
        }
    }
}

/// Writes one line of ours. `fields` are rendered as `key=value` in text
/// mode and as object members in JSON mode.
pub fn line(level: Level, msg: &str, fields: &[(&str, Value)]) {
    let text = render(format(), "etcd-migrate", level, msg, fields);
    emit(&text);
}

/// Writes an info line.
pub fn info(msg: &str, fields: &[(&str, Value)]) {
    line(Level::Info, msg, fields);
}

/// Writes a warning line.
pub fn warn(msg: &str, fields: &[(&str, Value)]) {
    line(Level::Warn, msg, fields);
}

/// Writes an error line.
pub fn error(msg: &str, fields: &[(&str, Value)]) {
    line(Level::Error, msg, fields);
}

/// Relays one line printed by a child, prefixed with its source
/// (e.g. `etcd-3.4.23`).
pub fn relay(source: &str, child_line: &str) {
    let text = match format() {
        LogFormat::Text => format!("[{source}] {child_line}"),
        LogFormat::Json => render(LogFormat::Json, source, Level::Info, child_line, &[]),
    };
    emit(&text);
}

/// A duration as whole milliseconds, the unit every duration field uses.
pub fn ms(duration: Duration) -> Value {
    Value::from(u64::try_from(duration.as_millis()).unwrap_or(u64::MAX))
}

fn emit(text: &str) {
    // One write per line under the stderr lock, so relay threads and the
    // main thread never interleave inside a line. A closed stderr is not a
    // reason to stop a migration: ignore write errors.
    let mut stderr = std::io::stderr().lock();
    let _ = writeln!(stderr, "{text}");
}

fn render(
    format: LogFormat,
    source: &str,
    level: Level,
    msg: &str,
    fields: &[(&str, Value)],
) -> String {
    let ts = humantime::format_rfc3339_millis(SystemTime::now()).to_string();
    match format {
        LogFormat::Text => {
            let mut out = format!("[{source}] {ts} {} {msg}", level.as_str());
            for (key, value) in fields {
                match value {
                    Value::String(s) if !s.contains(char::is_whitespace) && !s.is_empty() => {
                        out.push_str(&format!(" {key}={s}"))
                    }
                    other => out.push_str(&format!(" {key}={other}")),
                }
            }
            out
        }
        LogFormat::Json => {
            let mut object = Map::new();
            object.insert("ts".into(), Value::from(ts));
            object.insert("level".into(), Value::from(level.as_str()));
            object.insert("source".into(), Value::from(source));
            object.insert("msg".into(), Value::from(msg));
            for (key, value) in fields {
                object.insert((*key).to_string(), value.clone());
            }
            Value::Object(object).to_string()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_lines_carry_the_prefix_and_fields() {
        let text = render(
            LogFormat::Text,
            "etcd-migrate",
            Level::Info,
            "step done",
            &[
                ("step", "1/2".into()),
                ("ms", 210.into()),
                ("why", "a b".into()),
            ],
        );
        assert!(text.starts_with("[etcd-migrate] "), "{text}");
        assert!(
            text.ends_with(" info step done step=1/2 ms=210 why=\"a b\""),
            "{text}"
        );
    }

    #[test]
    fn json_lines_are_one_object() {
        let text = render(
            LogFormat::Json,
            "etcd-3.4.23",
            Level::Warn,
            "x\"y",
            &[("pid", 42.into())],
        );
        let value: Value = serde_json::from_str(&text).expect("valid json");
        assert_eq!(value["source"], "etcd-3.4.23");
        assert_eq!(value["level"], "warn");
        assert_eq!(value["msg"], "x\"y");
        assert_eq!(value["pid"], 42);
        assert!(!text.contains('\n'));
    }
}
