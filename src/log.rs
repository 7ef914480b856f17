//! This module owns our log output: one line per state transition, on
//! stderr, prefixed `[etcd-migrate]` in text mode so it stands apart from
//! etcd's own output, or one JSON object per line for machines. Child output
//! relayed from a step's etcd goes through here too, prefixed with the
//! release that printed it (`[etcd-3.4.23]`).
//!
//! Every line is a `tracing` event of this crate, rendered by one layer
//! (`Lines`) in exactly the two documented shapes; the fields of the
//! spans an event is in (a step's `step`, see [`step_span`]) come first.
//! tracing-subscriber's own `fmt` layer was not used: its text and JSON
//! shapes (`"fields":{…}`, `"level":"INFO"`, no `[etcd-migrate]` prefix)
//! are not the documented ones. Events of other crates (hyper, h2, tonic)
//! are never enabled.

use std::fmt;
use std::io::Write;
use std::sync::{Once, OnceLock};
use std::time::{Duration, SystemTime};

use serde_json::{Map, Value};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::subscriber::Interest;
use tracing::{Event, Metadata, Subscriber};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use tracing_subscriber::registry::{LookupSpan, Registry};

/// How log lines look (`--log-format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
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

/// Set once the process-wide subscriber is in place.
static INSTALLED: Once = Once::new();

/// The field that carries a call's `fields` (a JSON array of `[key,
/// value]` pairs, in order) from [`line`] to the layer: tracing's field
/// names are fixed per call site, ours are chosen at run time.
const FIELDS: &str = "log.fields";

/// The field that marks a relayed child line and names its source.
const RELAY: &str = "log.relay";

/// Targets of the events and spans we render: this crate's own. Others
/// (hyper, h2, tonic below etcd-client) are never enabled.
const OUR_TARGET: &str = "etcd_migrate";

/// An error and its causes on one line, each cause once (a cause already
/// quoted in its parent's message is not repeated): "connection refused"
/// hides two or three levels down in hyper/tonic errors.
///
/// A gRPC status says its code and etcd's message, then its causes in
/// words: tonic's own text of a status appends its cause's debug form, a
/// screenful of struct names in every wait line that quotes it.
pub fn error_chain(err: &(dyn std::error::Error + 'static)) -> String {
    let (mut text, mut source) = match err.downcast_ref::<etcd_client::Error>() {
        Some(etcd_client::Error::GRpcStatus(status)) => (
            format!(
                "grpc request error: {}: {}",
                status.code().description(),
                status.message()
            ),
            std::error::Error::source(status),
        ),
        _ => (err.to_string(), err.source()),
    };
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

/// Sets the format for the rest of the process (later calls are ignored)
/// and installs the subscriber that renders this crate's tracing events.
pub fn init(format: LogFormat) {
    let _ = FORMAT.set(format);
    install();
}

fn format() -> LogFormat {
    FORMAT.get().copied().unwrap_or_default()
}

/// Installs the process-wide subscriber once. Lines before [`init`] (a
/// failure to block signals) come out in the default text format, as
/// lines after it in the format [`init`] set: the layer asks at each line.
fn install() {
    INSTALLED.call_once(|| {
        let layer = Lines {
            format,
            emit: emit_stderr,
        };
        // Fails only if someone else installed one first: theirs stays.
        let _ = tracing::subscriber::set_global_default(Registry::default().with(layer));
    });
}

/// Writes one line of ours, as a tracing event of this crate. `fields`
/// are rendered as `key=value` in text mode and as object members in JSON
/// mode, after the fields of the spans the event is in.
pub fn line(level: Level, msg: &str, fields: &[(&str, Value)]) {
    install();
    let packed = Value::Array(
        fields
            .iter()
            .map(|(key, value)| Value::Array(vec![Value::from(*key), value.clone()]))
            .collect(),
    )
    .to_string();
    let packed = packed.as_str();
    // tracing wants each call site's level as a constant.
    match level {
        Level::Info => tracing::info!(log.fields = packed, "{msg}"),
        Level::Warn => tracing::warn!(log.fields = packed, "{msg}"),
        Level::Error => tracing::error!(log.fields = packed, "{msg}"),
    }
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
    install();
    tracing::info!(log.relay = source, "{child_line}");
}

/// The span of one step: every line logged inside it, in either format,
/// carries `step=<label>` (e.g. `1/2`, `baseline`) without the call
/// passing it. Synchronous code enters it (`let _in = step_span(l).entered();`);
/// async code wraps the step's future with [`tracing::Instrument`]
/// (`.instrument(step_span(l))`), since a guard held across an `.await`
/// would tag other tasks' lines.
pub fn step_span(label: &str) -> tracing::Span {
    tracing::info_span!("step", step = label)
}

/// A duration as whole milliseconds, the unit every duration field uses.
pub fn ms(duration: Duration) -> Value {
    Value::from(u64::try_from(duration.as_millis()).unwrap_or(u64::MAX))
}

/// How often a long read, copy or wait says how far it is.
pub const PROGRESS_EVERY: Duration = Duration::from_secs(5);

/// What a [`Progress`] counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProgressUnit {
    /// Keys of a keyspace read (the bytes are their keys and values).
    Keys,
    /// Bytes of a copy.
    Bytes,
    /// Seconds of a wait against its deadline (no bytes, no rate).
    Seconds,
}

/// The progress lines of one long read, copy or wait: none while the work
/// is younger than [`PROGRESS_EVERY`], then at most one per
/// [`PROGRESS_EVERY`], each `<what> progress` with how much is done of the
/// total, the MB, the rate and the ETA (a wait: seconds waited, the
/// deadline, the seconds left). Lines come from the caller's thread when
/// it reports work ([`Progress::add`]) or asks ([`Progress::tick`]): a
/// single call that blocks is not interrupted to say so.
pub struct Progress {
    msg: String,
    unit: ProgressUnit,
    started: std::time::Instant,
    last_line: std::time::Instant,
    total: u64,
    done: u64,
    bytes: u64,
}

impl Progress {
    /// Starts counting `what` (e.g. "keyspace read", "backup copy",
    /// "health wait") out of `total` (0: not known yet).
    pub fn new(what: &str, unit: ProgressUnit, total: u64) -> Self {
        let now = std::time::Instant::now();
        Progress {
            msg: format!("{what} progress"),
            unit,
            started: now,
            last_line: now,
            total,
            done: 0,
            bytes: 0,
        }
    }

    /// Sets the total, once it is known.
    pub fn set_total(&mut self, total: u64) {
        self.total = total;
    }

    /// Counts `done` more units and `bytes` more bytes, and logs a line if
    /// one is due.
    pub fn add(&mut self, done: u64, bytes: u64) {
        self.done += done;
        self.bytes += bytes;
        self.tick(&[]);
    }

    /// Logs a line if one is due, with `extra` fields after the counts (a
    /// wait's attempts and last error). For [`ProgressUnit::Seconds`] the
    /// time waited is the count.
    pub fn tick(&mut self, extra: &[(&str, Value)]) {
        let now = std::time::Instant::now();
        if now.duration_since(self.last_line) < PROGRESS_EVERY {
            return;
        }
        self.last_line = now;
        let mut fields = self.fields(now.duration_since(self.started));
        fields.extend(extra.iter().map(|(k, v)| (k.to_string(), v.clone())));
        let borrowed: Vec<(&str, Value)> = fields
            .iter()
            .map(|(k, v)| (k.as_str(), v.clone()))
            .collect();
        info(&self.msg, &borrowed);
    }

    /// The fields of a line after `elapsed`.
    fn fields(&self, elapsed: Duration) -> Vec<(String, Value)> {
        let secs = elapsed.as_secs_f64().max(0.001);
        let whole = |x: f64| Value::from(x.max(0.0).round() as u64);
        if self.unit == ProgressUnit::Seconds {
            return vec![
                ("waited_s".into(), whole(secs)),
                ("deadline_s".into(), self.total.into()),
                ("left_s".into(), whole(self.total as f64 - secs)),
            ];
        }
        let rate = self.done as f64 / secs;
        let left = self.total.saturating_sub(self.done) as f64;
        let eta = if rate > 0.0 { left / rate } else { 0.0 };
        let mut fields: Vec<(String, Value)> = Vec::new();
        let unit = match self.unit {
            ProgressUnit::Keys => "keys",
            _ => "bytes",
        };
        fields.push((unit.into(), self.done.into()));
        fields.push(("total".into(), self.total.into()));
        fields.push((
            "mb".into(),
            format!("{:.1}", self.bytes as f64 / 1e6).into(),
        ));
        if self.unit == ProgressUnit::Keys {
            fields.push(("keys_per_s".into(), whole(rate)));
        }
        fields.push((
            "mb_per_s".into(),
            format!("{:.1}", self.bytes as f64 / 1e6 / secs).into(),
        ));
        fields.push(("eta_s".into(), whole(eta)));
        fields
    }
}

fn emit_stderr(text: &str) {
    // One write per line under the stderr lock, so relay threads and the
    // main thread never interleave inside a line. A closed stderr is not a
    // reason to stop a migration: ignore write errors.
    let mut stderr = std::io::stderr().lock();
    let _ = writeln!(stderr, "{text}");
}

/// The tracing layer that renders this crate's events in the two formats,
/// with the fields of every span an event is in (root first), and writes
/// each as one line.
struct Lines {
    /// The format, asked at each line.
    format: fn() -> LogFormat,
    /// Where a finished line goes.
    emit: fn(&str),
}

/// A span's fields, kept in its extensions for the events inside it.
struct SpanFields(Vec<(String, Value)>);

/// What an event or span says, collected from tracing's fields.
#[derive(Default)]
struct Collected {
    message: String,
    relay: Option<String>,
    fields: Vec<(String, Value)>,
}

impl Collected {
    fn put(&mut self, key: &str, value: Value) {
        match key {
            "message" => {
                self.message = match value {
                    Value::String(s) => s,
                    other => other.to_string(),
                }
            }
            RELAY => self.relay = value.as_str().map(str::to_string),
            _ => self.fields.push((key.to_string(), value)),
        }
    }
}

impl Visit for Collected {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == FIELDS {
            // Ours, from `line`: written by serde_json a moment ago.
            if let Ok(Value::Array(pairs)) = serde_json::from_str(value) {
                for pair in pairs {
                    if let Value::Array(mut kv) = pair {
                        if let (Some(value), Some(Value::String(key))) = (kv.pop(), kv.pop()) {
                            self.fields.push((key, value));
                        }
                    }
                }
            }
            return;
        }
        self.put(field.name(), Value::from(value));
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.put(field.name(), Value::from(value));
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.put(field.name(), Value::from(value));
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        self.put(field.name(), Value::from(value));
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.put(field.name(), Value::from(value));
    }

    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.put(field.name(), Value::from(error_chain(value)));
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        // `%x` fields arrive here too, their Debug being x's Display; so
        // does the message.
        self.put(field.name(), Value::from(format!("{value:?}")));
    }
}

fn ours(meta: &Metadata<'_>) -> bool {
    meta.target() == OUR_TARGET || meta.target().starts_with("etcd_migrate::")
}

impl<S> Layer<S> for Lines
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn register_callsite(&self, meta: &'static Metadata<'static>) -> Interest {
        if ours(meta) {
            Interest::always()
        } else {
            Interest::never()
        }
    }

    fn enabled(&self, meta: &Metadata<'_>, _ctx: Context<'_, S>) -> bool {
        ours(meta)
    }

    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut collected = Collected::default();
        attrs.record(&mut collected);
        if let Some(span) = ctx.span(id) {
            span.extensions_mut().insert(SpanFields(collected.fields));
        }
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        let mut collected = Collected::default();
        values.record(&mut collected);
        if let Some(span) = ctx.span(id) {
            let mut extensions = span.extensions_mut();
            if let Some(SpanFields(fields)) = extensions.get_mut::<SpanFields>() {
                for (key, value) in collected.fields {
                    match fields.iter_mut().find(|(k, _)| *k == key) {
                        Some(slot) => slot.1 = value,
                        None => fields.push((key, value)),
                    }
                }
            }
        }
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let mut collected = Collected::default();
        event.record(&mut collected);
        let level = match *event.metadata().level() {
            tracing::Level::ERROR => "error",
            tracing::Level::WARN => "warn",
            tracing::Level::INFO => "info",
            tracing::Level::DEBUG => "debug",
            tracing::Level::TRACE => "trace",
        };
        let format = (self.format)();
        let text = match collected.relay {
            // A child's own line: as it printed it, without our spans.
            Some(source) => match format {
                LogFormat::Text => format!("[{source}] {}", collected.message),
                LogFormat::Json => render::<&str>(format, &source, level, &collected.message, &[]),
            },
            None => {
                // The spans' fields first (root to leaf), then the event's;
                // a key the event names itself is its own.
                let mut fields = Vec::new();
                if let Some(scope) = ctx.event_scope(event) {
                    for span in scope.from_root() {
                        if let Some(SpanFields(own)) = span.extensions().get::<SpanFields>() {
                            for (key, value) in own {
                                if !collected.fields.iter().any(|(k, _)| k == key) {
                                    fields.retain(|(k, _): &(String, Value)| k != key);
                                    fields.push((key.clone(), value.clone()));
                                }
                            }
                        }
                    }
                }
                fields.append(&mut collected.fields);
                render(format, "etcd-migrate", level, &collected.message, &fields)
            }
        };
        (self.emit)(&text);
    }
}

fn render<K: AsRef<str>>(
    format: LogFormat,
    source: &str,
    level: &str,
    msg: &str,
    fields: &[(K, Value)],
) -> String {
    let ts = humantime::format_rfc3339_millis(SystemTime::now()).to_string();
    match format {
        LogFormat::Text => {
            let mut out = format!("[{source}] {ts} {level} {msg}");
            for (key, value) in fields {
                let key = key.as_ref();
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
            object.insert("level".into(), Value::from(level));
            object.insert("source".into(), Value::from(source));
            object.insert("msg".into(), Value::from(msg));
            for (key, value) in fields {
                object.insert(key.as_ref().to_string(), value.clone());
            }
            Value::Object(object).to_string()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// etcd refusing a call (nothing listens on port 1 of loopback) reads
    /// as the gRPC status and its causes in words, without tonic's debug
    /// form of the cause.
    #[test]
    fn a_refused_grpc_call_reads_in_words() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        let text = runtime.block_on(async {
            let options = etcd_client::ConnectOptions::new()
                .with_connect_timeout(std::time::Duration::from_secs(2))
                .with_timeout(std::time::Duration::from_secs(2));
            match etcd_client::Client::connect(["http://127.0.0.1:1"], Some(options)).await {
                Err(err) => error_chain(&err),
                Ok(mut client) => match client.get("k", None).await {
                    Err(err) => error_chain(&err),
                    Ok(_) => panic!("a get through port 1 succeeded"),
                },
            }
        });
        assert!(
            text.contains("Connection refused") || text.contains("connection refused"),
            "{text}"
        );
        assert!(
            !text.contains("tonic::") && !text.contains("ConnectError("),
            "{text}"
        );
    }

    fn field_map(fields: Vec<(String, Value)>) -> Vec<String> {
        fields
            .into_iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect()
    }

    #[test]
    fn progress_of_a_copy_says_bytes_of_total_mb_rate_and_eta() {
        let mut progress = Progress::new("backup copy", ProgressUnit::Bytes, 400_000_000);
        progress.done = 100_000_000;
        progress.bytes = 100_000_000;
        let fields = field_map(progress.fields(Duration::from_secs(5)));
        assert_eq!(
            fields,
            [
                "bytes=100000000",
                "total=400000000",
                "mb=\"100.0\"",
                "mb_per_s=\"20.0\"",
                "eta_s=15"
            ]
        );
    }

    #[test]
    fn progress_of_a_read_counts_keys_and_their_rate() {
        let mut progress = Progress::new("keyspace read", ProgressUnit::Keys, 0);
        progress.set_total(1000);
        progress.done = 250;
        progress.bytes = 2_000_000;
        let fields = field_map(progress.fields(Duration::from_secs(10)));
        assert_eq!(
            fields,
            [
                "keys=250",
                "total=1000",
                "mb=\"2.0\"",
                "keys_per_s=25",
                "mb_per_s=\"0.2\"",
                "eta_s=30"
            ]
        );
    }

    #[test]
    fn progress_of_a_wait_says_waited_deadline_and_left() {
        let progress = Progress::new("health wait", ProgressUnit::Seconds, 120);
        let fields = field_map(progress.fields(Duration::from_millis(7_400)));
        assert_eq!(fields, ["waited_s=7", "deadline_s=120", "left_s=113"]);
    }

    #[test]
    fn progress_says_nothing_before_its_interval() {
        let mut progress = Progress::new("backup copy", ProgressUnit::Bytes, 10);
        let before = progress.last_line;
        progress.add(5, 5);
        assert_eq!(progress.last_line, before, "a line within the interval");
        assert_eq!(progress.done, 5);
    }

    #[test]
    fn text_lines_carry_the_prefix_and_fields() {
        let text = render(
            LogFormat::Text,
            "etcd-migrate",
            "info",
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
            "warn",
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

    thread_local! {
        static CAPTURED: std::cell::RefCell<Vec<String>> = const { std::cell::RefCell::new(Vec::new()) };
    }

    fn capture(text: &str) {
        CAPTURED.with(|lines| lines.borrow_mut().push(text.to_string()));
    }

    fn text() -> LogFormat {
        LogFormat::Text
    }

    fn json() -> LogFormat {
        LogFormat::Json
    }

    /// The lines `body` logs on this thread, rendered in `format` by the
    /// layer the process installs (written to a buffer instead of stderr).
    fn lines_of(format: fn() -> LogFormat, body: impl FnOnce()) -> Vec<String> {
        CAPTURED.with(|lines| lines.borrow_mut().clear());
        let layer = Lines {
            format,
            emit: capture,
        };
        tracing::subscriber::with_default(Registry::default().with(layer), body);
        CAPTURED.with(|lines| lines.borrow_mut().drain(..).collect())
    }

    /// Drops the `[source] <ts> ` head of a text line.
    fn after_ts(line: &str) -> &str {
        let rest = line.strip_prefix("[etcd-migrate] ").expect("our prefix");
        rest.split_once(' ').expect("a timestamp").1
    }

    #[test]
    fn the_call_site_functions_render_as_before_through_tracing() {
        let lines = lines_of(text, || {
            info("step done", &[("step", "1/2".into()), ("ms", 210.into())]);
            warn("slow", &[("why", "a b".into()), ("empty", "".into())]);
            error("refused", &[("exit", 2.into())]);
            relay("etcd-3.4.23", "raft: {\"x\": 1}");
        });
        assert_eq!(lines.len(), 4, "{lines:?}");
        assert_eq!(after_ts(&lines[0]), "info step done step=1/2 ms=210");
        assert_eq!(after_ts(&lines[1]), "warn slow why=\"a b\" empty=\"\"");
        assert_eq!(after_ts(&lines[2]), "error refused exit=2");
        assert_eq!(lines[3], "[etcd-3.4.23] raft: {\"x\": 1}");
        let ts = lines[0].split(' ').nth(1).expect("ts");
        assert!(humantime::parse_rfc3339(ts).is_ok(), "{ts}");

        let lines = lines_of(json, || {
            info("step done", &[("step", "1/2".into()), ("ok", true.into())]);
            relay("etcd-3.4.23", "raft");
        });
        let ours: Value = serde_json::from_str(&lines[0]).expect("json");
        let mut keys: Vec<&str> = ours
            .as_object()
            .expect("object")
            .keys()
            .map(String::as_str)
            .collect();
        keys.sort_unstable();
        assert_eq!(keys, ["level", "msg", "ok", "source", "step", "ts"]);
        assert_eq!(ours["source"], "etcd-migrate");
        assert_eq!(ours["level"], "info");
        assert_eq!(ours["msg"], "step done");
        assert_eq!(
            (&ours["step"], &ours["ok"]),
            (&Value::from("1/2"), &Value::from(true))
        );
        let relayed: Value = serde_json::from_str(&lines[1]).expect("json");
        let mut keys: Vec<&str> = relayed
            .as_object()
            .expect("object")
            .keys()
            .map(String::as_str)
            .collect();
        keys.sort_unstable();
        assert_eq!(keys, ["level", "msg", "source", "ts"]);
        assert_eq!(
            (&relayed["source"], &relayed["msg"]),
            (&Value::from("etcd-3.4.23"), &Value::from("raft"))
        );
    }

    #[test]
    fn a_step_span_puts_its_label_on_every_line_inside_it() {
        let body = || {
            info("before", &[]);
            let _step = step_span("1/2").entered();
            info("step start", &[("from", "3.4.23".into())]);
            tracing::warn!(keys = 3u64, why = %"a b", "native");
            relay("etcd-3.5.16", "child");
            {
                let _inner = tracing::info_span!("phase", phase = "copy", step = "1/2b").entered();
                info("copying", &[("phase", "verify".into())]);
            }
            info("step done", &[]);
        };
        let lines = lines_of(text, body);
        let shown: Vec<&str> = lines
            .iter()
            .map(|line| match line.starts_with("[etcd-migrate] ") {
                true => after_ts(line),
                false => line.as_str(),
            })
            .collect();
        assert_eq!(
            shown,
            [
                "info before",
                "info step start step=1/2 from=3.4.23",
                "warn native step=1/2 keys=3 why=\"a b\"",
                // A child's line is its own: no span fields.
                "[etcd-3.5.16] child",
                // An inner span's field wins over an outer one's, the
                // event's own over both.
                "info copying step=1/2b phase=verify",
                "info step done step=1/2",
            ]
        );

        let lines = lines_of(json, body);
        let objects: Vec<Value> = lines
            .iter()
            .map(|line| serde_json::from_str(line).expect("json"))
            .collect();
        let steps: Vec<Option<&str>> = objects.iter().map(|o| o["step"].as_str()).collect();
        assert_eq!(
            steps,
            [
                None,
                Some("1/2"),
                Some("1/2"),
                None,
                Some("1/2b"),
                Some("1/2")
            ]
        );
        assert_eq!(objects[2]["keys"], 3);
        assert_eq!(objects[4]["phase"], "verify");
        assert_eq!(objects[3]["source"], "etcd-3.5.16");
    }

    #[test]
    fn other_crates_events_are_not_ours_to_print() {
        let lines = lines_of(text, || {
            tracing::info!(target: "h2::codec", "frame");
            tracing::debug!(target: "hyper", "conn");
            info("ours", &[]);
        });
        assert_eq!(lines.len(), 1, "{lines:?}");
    }
}
