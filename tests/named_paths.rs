//! This module owns one check: every repository path, relative Markdown link
//! (with its heading anchor) and repository command that our messages and
//! docs name exists (issue 20: a refusal sent operators to a manifest the
//! repository never had). It is a test and nothing else, so it is a test
//! target of its own (`cargo test --test named-paths`), not a module of the
//! library.
//!
//! What counts, so that the check neither flaps nor misses:
//! - **Where:** the string literals of `src/**/*.rs` (escapes decoded,
//!   comments skipped; this file's own literals are its fixtures and are
//!   left out) and every line of the Markdown files in [`MARKDOWN`] and
//!   `docs/*.md`.
//! - **A path** is a word that starts with one of [`TOP_DIRS`] right after
//!   the start of the text, a blank or one of [`OPENERS`]. After `/`, `<`,
//!   `$`, `.`, a letter or a digit it is the tail of something else (an
//!   absolute path such as `/var/…`, a URL, `<data-dir>/…`) and is not ours.
//!   In a path, `{a,b}` expands and `*` must match an entry; a placeholder
//!   (`<x>`, `$X`, `{name}`) ends it, and the directory before it must
//!   exist. A trailing `/` asks for a directory.
//! - **A link** is `[text](target)` or `[text]: target` outside code, with
//!   a target that is not a URL; it is resolved from the file's own
//!   directory, as GitHub does. An anchor into a Markdown file must be one of
//!   its headings' GitHub slugs.
//! - **A command** is only looked for in code (fenced blocks, code spans,
//!   and code spans inside string literals): `make <target>` needs the
//!   Makefile rule, `cargo … --test <t>`, `--example <e>`, `--features <f>`
//!   need Cargo.toml's; a repository script in command position (the first
//!   word after `VAR=value` words, in a fenced line or a code span of more
//!   than one word) must be executable. A script named bare (`foo.sh`,
//!   `foo.py`) anywhere must be a file of the repository.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Component, Path, PathBuf};

/// The repository's top-level directories whose paths we check.
const TOP_DIRS: &[&str] = &[
    ".ci/",
    "bench/",
    "cluster-tests/",
    "docs/",
    "e2e/",
    "examples/",
    "image-tests/",
    "images/",
    "scripts/",
    "src/",
    "tests/",
];

/// The characters after which a path of ours may start.
const OPENERS: &str = "`\"'([*|,;=";

/// The Markdown files outside `docs/` whose paths and links we check.
const MARKDOWN: &[&str] = &[
    "README.md",
    "ARCHITECTURE.md",
    "images/README.md",
    "examples/README.md",
];

/// Directories that hold builds and caches, not the repository.
const NOT_OURS: &[&str] = &["target", ".git", ".cache"];

/// A name or link that does not resolve, with where it was written.
#[derive(Debug, PartialEq, Eq)]
struct Finding {
    file: String,
    line: usize,
    what: String,
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}: {}", self.file, self.line, self.what)
    }
}

/// Text to scan, each char with its source line.
struct Text {
    chars: Vec<char>,
    lines: Vec<usize>,
}

impl Text {
    fn line(line: usize, s: &str) -> Text {
        let chars: Vec<char> = s.chars().collect();
        let lines = vec![line; chars.len()];
        Text { chars, lines }
    }

    fn line_at(&self, i: usize) -> usize {
        self.lines
            .get(i)
            .or(self.lines.last())
            .copied()
            .unwrap_or(0)
    }

    fn slice(&self, from: usize, to: usize) -> Text {
        Text {
            chars: self.chars[from..to].to_vec(),
            lines: self.lines[from..to].to_vec(),
        }
    }

    /// The code spans (between backticks) inside this text.
    fn code_spans(&self) -> Vec<Text> {
        let ticks: Vec<usize> = (0..self.chars.len())
            .filter(|&i| self.chars[i] == '`')
            .collect();
        ticks
            .chunks_exact(2)
            .map(|pair| self.slice(pair[0] + 1, pair[1]))
            .collect()
    }
}

/// What the repository offers: its files, Makefile rules and Cargo targets.
struct Repo {
    root: PathBuf,
    make_targets: BTreeSet<String>,
    cargo_tests: BTreeSet<String>,
    cargo_examples: BTreeSet<String>,
    cargo_features: BTreeSet<String>,
    script_names: BTreeSet<String>,
}

impl Repo {
    fn load(root: &Path) -> Repo {
        let makefile = std::fs::read_to_string(root.join("Makefile")).unwrap_or_default();
        let make_targets = makefile
            .lines()
            .filter(|l| !l.starts_with(['\t', ' ', '#', '.']))
            .filter_map(|l| l.split_once(':'))
            .filter(|(_, rest)| !rest.starts_with('='))
            .flat_map(|(names, _)| names.split_whitespace().map(str::to_string))
            .collect();
        let cargo = std::fs::read_to_string(root.join("Cargo.toml")).unwrap_or_default();
        let mut tables: BTreeMap<&str, BTreeSet<String>> = BTreeMap::new();
        let mut table = "";
        for l in cargo.lines().map(str::trim) {
            if l.starts_with('[') {
                table = l;
            } else if let Some((key, value)) = l.split_once('=') {
                let key = key.trim();
                let name = if table == "[features]" {
                    key
                } else if key == "name" {
                    value.trim().trim_matches('"')
                } else {
                    continue;
                };
                tables.entry(table).or_default().insert(name.to_string());
            }
        }
        let mut script_names = BTreeSet::new();
        for file in files_under(root, root) {
            if let Some(name) = file.file_name().and_then(|n| n.to_str()) {
                if name.ends_with(".sh") || name.ends_with(".py") {
                    script_names.insert(name.to_string());
                }
            }
        }
        Repo {
            root: root.to_path_buf(),
            make_targets,
            cargo_tests: tables.remove("[[test]]").unwrap_or_default(),
            cargo_examples: tables.remove("[[example]]").unwrap_or_default(),
            cargo_features: tables.remove("[features]").unwrap_or_default(),
            script_names,
        }
    }

    /// Every finding of a Rust source file (`file` is repository-relative).
    fn check_rust(&self, file: &str, source: &str) -> Vec<Finding> {
        let mut found = Vec::new();
        for literal in rust_strings(source) {
            self.check_paths(file, &literal, &mut found);
            for span in literal.code_spans() {
                self.check_command(file, &span, false, &mut found);
            }
        }
        found
    }

    /// Every finding of a Markdown file (`file` is repository-relative).
    fn check_markdown(&self, file: &str, text: &str) -> Vec<Finding> {
        let mut found = Vec::new();
        let mut fence: Option<String> = None;
        // A code span may run over lines, but not past a paragraph.
        let mut span: Option<(usize, Text)> = None;
        for (n, line) in text.lines().enumerate() {
            let n = n + 1;
            let whole = Text::line(n, line);
            self.check_paths(file, &whole, &mut found);
            let trimmed = line.trim_start();
            if let Some(open) = &fence {
                if trimmed.starts_with(open.as_str()) {
                    fence = None;
                } else {
                    self.check_command(file, &whole, true, &mut found);
                }
                continue;
            }
            if trimmed.starts_with("```") || trimmed.starts_with("~~~") {
                let mark: String = trimmed
                    .chars()
                    .take_while(|&c| c == '`' || c == '~')
                    .collect();
                fence = Some(mark);
                span = None;
                continue;
            }
            if trimmed.is_empty() {
                span = None;
                continue;
            }
            if let Some(target) = reference_definition(trimmed) {
                self.check_link(file, n, target, &mut found);
            }
            let chars = &whole.chars;
            let mut i = 0;
            while i < chars.len() {
                if chars[i] == '`' {
                    let run = chars[i..].iter().take_while(|&&c| c == '`').count();
                    match span.take() {
                        Some((open, text)) if open == run => {
                            self.check_command(file, &text, false, &mut found);
                        }
                        Some(other) => span = Some(other),
                        None => span = Some((run, Text::line(n, ""))),
                    }
                    i += run;
                    continue;
                }
                if let Some((_, text)) = &mut span {
                    text.chars.push(chars[i]);
                    text.lines.push(n);
                } else if chars[i] == ']' && chars.get(i + 1) == Some(&'(') {
                    if let Some(target) = link_target(&chars[i + 2..]) {
                        self.check_link(file, n, &target, &mut found);
                    }
                }
                i += 1;
            }
            if let Some((_, text)) = &mut span {
                text.chars.push(' ');
                text.lines.push(n);
            }
        }
        found
    }

    fn check_paths(&self, file: &str, text: &Text, found: &mut Vec<Finding>) {
        for (at, word) in path_words(&text.chars) {
            if let Err(what) = self.resolve(&word) {
                found.push(Finding {
                    file: file.to_string(),
                    line: text.line_at(at),
                    what,
                });
            }
        }
        for (at, name) in script_words(&text.chars) {
            if !self.script_names.contains(&name) {
                found.push(Finding {
                    file: file.to_string(),
                    line: text.line_at(at),
                    what: format!("no script {name} in the repository"),
                });
            }
        }
    }

    /// A path word: Ok when it names what the repository holds.
    fn resolve(&self, word: &str) -> Result<(), String> {
        let placeholder = [word.find(['<', '$']), placeholder_brace(word)];
        let (word, cut) = match placeholder.into_iter().flatten().min() {
            Some(at) => (&word[..word[..at].rfind('/').map_or(0, |s| s + 1)], true),
            None => (word, false),
        };
        for path in expand_braces(word) {
            let missing = match path.rsplit_once('/') {
                // `src/**/*.rs`: the directory before the first glob.
                Some((dir, _)) if dir.contains('*') => {
                    let before = &dir[..dir.find('*').unwrap_or(0)];
                    let before = &before[..before.rfind('/').map_or(0, |s| s + 1)];
                    !self.root.join(before).is_dir()
                }
                Some((dir, last)) if last.contains('*') => {
                    let pattern = last;
                    let matched = std::fs::read_dir(self.root.join(dir))
                        .map(|entries| {
                            entries
                                .flatten()
                                .any(|e| glob_match(pattern, &e.file_name().to_string_lossy()))
                        })
                        .unwrap_or(false);
                    !matched
                }
                _ if path.ends_with('/') => !self.root.join(&path).is_dir(),
                _ => self.root.join(&path).symlink_metadata().is_err(),
            };
            if missing {
                let what = if cut { "directory" } else { "path" };
                return Err(format!("{what} {path} does not exist in the repository"));
            }
        }
        Ok(())
    }

    fn check_link(&self, file: &str, line: usize, target: &str, found: &mut Vec<Finding>) {
        if target.contains("://") || target.starts_with("mailto:") {
            return;
        }
        let (path, anchor) = target.split_once('#').unwrap_or((target, ""));
        let mut report = |what: String| {
            found.push(Finding {
                file: file.to_string(),
                line,
                what,
            })
        };
        let resolved = if path.is_empty() {
            Some(PathBuf::from(file))
        } else {
            let base = Path::new(file).parent().unwrap_or(Path::new(""));
            normalize(&base.join(path))
        };
        let Some(resolved) = resolved else {
            report(format!("link {target} leads outside the repository"));
            return;
        };
        let full = self.root.join(&resolved);
        if full.symlink_metadata().is_err() {
            report(format!(
                "link {target}: {} does not exist in the repository",
                resolved.display()
            ));
            return;
        }
        if anchor.is_empty() || resolved.extension().is_none_or(|e| e != "md") {
            return;
        }
        let text = std::fs::read_to_string(&full).unwrap_or_default();
        if !heading_slugs(&text).contains(anchor) {
            report(format!(
                "link {target}: {} has no heading whose anchor is #{anchor}",
                resolved.display()
            ));
        }
    }

    /// Commands in a piece of code: make targets, cargo targets, and the
    /// repository script it runs (a fenced line is a command line; a code
    /// span is one when it has more than one word).
    fn check_command(&self, file: &str, code: &Text, line: bool, found: &mut Vec<Finding>) {
        let words: Vec<(usize, String)> = words(&code.chars);
        let mut report = |at: usize, what: String| {
            found.push(Finding {
                file: file.to_string(),
                line: code.line_at(at),
                what,
            })
        };
        for (k, (at, word)) in words.iter().enumerate() {
            let next = words[k + 1..].iter().find(|(_, w)| !w.contains('='));
            let Some((_, next)) = next else { continue };
            if !next
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_".contains(c))
            {
                continue;
            }
            let cargo = words[..k].iter().any(|(_, w)| w == "cargo");
            let (known, kind) = match word.as_str() {
                "make" => (&self.make_targets, "Makefile rule"),
                "--test" if cargo => (&self.cargo_tests, "Cargo.toml test target"),
                "--example" if cargo => (&self.cargo_examples, "Cargo.toml example"),
                "--features" if cargo => (&self.cargo_features, "Cargo.toml feature"),
                _ => continue,
            };
            if !known.contains(next.as_str()) {
                report(*at, format!("`{word} {next}`: no {kind} {next}"));
            }
        }
        // A repository script in command position must be runnable.
        if !line && words.len() < 2 {
            return;
        }
        let command = words.iter().find(|(_, w)| !w.contains('=') && w != "$");
        if let Some((at, word)) = command {
            let word = word.as_str();
            let ours = TOP_DIRS.iter().any(|d| word.starts_with(d));
            let path = self.root.join(word);
            if ours && path.is_file() && !is_executable(&path) {
                report(
                    *at,
                    format!("{word} is run as a command but is not executable"),
                );
            }
        }
    }
}

/// The string literals of a Rust source, escapes decoded, comments skipped.
fn rust_strings(source: &str) -> Vec<Text> {
    let c: Vec<char> = source.chars().collect();
    let at = |i: usize| c.get(i).copied().unwrap_or('\0');
    let ident = |ch: char| ch.is_alphanumeric() || ch == '_';
    let mut out = Vec::new();
    let mut line = 1;
    let mut i = 0;
    while i < c.len() {
        match c[i] {
            '\n' => {
                line += 1;
                i += 1;
            }
            '/' if at(i + 1) == '/' => {
                while i < c.len() && c[i] != '\n' {
                    i += 1;
                }
            }
            '/' if at(i + 1) == '*' => {
                let mut depth = 0;
                while i < c.len() {
                    if c[i] == '/' && at(i + 1) == '*' {
                        depth += 1;
                        i += 2;
                    } else if c[i] == '*' && at(i + 1) == '/' {
                        depth -= 1;
                        i += 2;
                        if depth == 0 {
                            break;
                        }
                    } else {
                        line += usize::from(c[i] == '\n');
                        i += 1;
                    }
                }
            }
            // A char literal ('x', '\'', '\u{41}') or a lifetime ('a).
            '\'' => {
                if at(i + 1) == '\\' {
                    i += 3;
                    while i < c.len() && c[i] != '\'' {
                        i += 1;
                    }
                    i += 1;
                } else if at(i + 2) == '\'' {
                    i += 3;
                } else {
                    i += 1;
                }
            }
            ch if ident(ch) => {
                let prefix_start = i;
                while ident(at(i)) {
                    i += 1;
                }
                let prefix: String = c[prefix_start..i].iter().collect();
                let raw = prefix == "r" || prefix == "br";
                let hashes = c[i..].iter().take_while(|&&h| h == '#').count();
                // `r"…"`, `r#"…"#`, `br"…"`; not a raw identifier (`r#type`).
                if raw && at(i + hashes) == '"' {
                    i += hashes + 1;
                    let mut text = Text::line(line, "");
                    while i < c.len() {
                        let closes = c[i] == '"' && (1..=hashes).all(|k| at(i + k) == '#');
                        if closes {
                            i += hashes + 1;
                            break;
                        }
                        text.chars.push(c[i]);
                        text.lines.push(line);
                        line += usize::from(c[i] == '\n');
                        i += 1;
                    }
                    out.push(text);
                }
                // `b"…"` falls through to the plain string on the next turn.
            }
            '"' => {
                i += 1;
                let mut text = Text::line(line, "");
                while i < c.len() && c[i] != '"' {
                    let mut ch = c[i];
                    if ch == '\\' {
                        i += 1;
                        ch = match at(i) {
                            'n' => '\n',
                            't' => '\t',
                            'r' => '\r',
                            '0' => '\0',
                            '\n' => {
                                // A line continuation: the newline and the
                                // next line's indentation are not text.
                                while at(i).is_whitespace() {
                                    line += usize::from(at(i) == '\n');
                                    i += 1;
                                }
                                continue;
                            }
                            'x' | 'u' => {
                                // \x41, \u{41}: not path characters either way.
                                while at(i + 1).is_ascii_hexdigit() || "{}".contains(at(i + 1)) {
                                    i += 1;
                                }
                                '\u{fffd}'
                            }
                            other => other,
                        };
                    }
                    text.chars.push(ch);
                    text.lines.push(line);
                    line += usize::from(c[i] == '\n');
                    i += 1;
                }
                i += 1;
                out.push(text);
            }
            _ => i += 1,
        }
    }
    out
}

/// The path words of a text, each with its char index.
fn path_words(c: &[char]) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for start in 0..c.len() {
        let opens = start == 0 || c[start - 1].is_whitespace() || OPENERS.contains(c[start - 1]);
        if !opens {
            continue;
        }
        let rest: String = c[start..(start + 16).min(c.len())].iter().collect();
        if !TOP_DIRS.iter().any(|d| rest.starts_with(d)) {
            continue;
        }
        let mut end = start;
        while end < c.len() {
            let ch = c[end];
            if ch.is_alphanumeric() || "._-/*".contains(ch) {
                end += 1;
            } else if ch == '{' || ch == '<' {
                // A group or placeholder is part of the word up to its close.
                let close = if ch == '{' { '}' } else { '>' };
                match c[end..].iter().take(64).position(|&x| x == close) {
                    Some(len) if !c[end..end + len].iter().any(|x| x.is_whitespace()) => {
                        end += len + 1;
                    }
                    _ => break,
                }
            } else if ch == '$' {
                end += 1;
            } else {
                break;
            }
        }
        let word: String = c[start..end].iter().collect();
        out.push((start, word.trim_end_matches('.').to_string()));
    }
    out
}

/// Where a `{…}` without a comma (a format placeholder) starts in a word.
fn placeholder_brace(word: &str) -> Option<usize> {
    let mut from = 0;
    while let Some(open) = word[from..].find('{').map(|o| o + from) {
        let close = word[open..].find('}').map_or(word.len(), |c| c + open);
        if !word[open..close].contains(',') {
            return Some(open);
        }
        from = close;
    }
    None
}

/// `a/{b,c}.d` → `a/b.d`, `a/c.d`.
fn expand_braces(word: &str) -> Vec<String> {
    let Some(open) = word.find('{') else {
        return vec![word.to_string()];
    };
    let Some(close) = word[open..].find('}').map(|c| c + open) else {
        return vec![word.to_string()];
    };
    word[open + 1..close]
        .split(',')
        .flat_map(|alt| expand_braces(&format!("{}{alt}{}", &word[..open], &word[close + 1..])))
        .collect()
}

/// A shell glob with `*` only.
fn glob_match(pattern: &str, name: &str) -> bool {
    match pattern.split_once('*') {
        None => pattern == name,
        Some((head, tail)) => {
            name.starts_with(head)
                && (0..=name.len() - head.len()).any(|skip| {
                    name.is_char_boundary(head.len() + skip)
                        && glob_match(tail, &name[head.len() + skip..])
                })
        }
    }
}

/// Scripts named bare (`migrate-if-needed.sh`), each with its char index.
fn script_words(c: &[char]) -> Vec<(usize, String)> {
    let name_char = |ch: char| ch.is_ascii_alphanumeric() || "._-".contains(ch);
    let mut out = Vec::new();
    let mut i = 0;
    while i < c.len() {
        if !name_char(c[i]) {
            i += 1;
            continue;
        }
        let start = i;
        while i < c.len() && name_char(c[i]) {
            i += 1;
        }
        let before = start.checked_sub(1).map(|b| c[b]);
        let bare = before.is_none_or(|b| !"/<>{}$~".contains(b));
        let word: String = c[start..i].iter().collect();
        let word = word.trim_end_matches('.');
        let script = word.ends_with(".sh") || word.ends_with(".py");
        if bare && script && word.len() > 3 && !word.starts_with('.') {
            out.push((start, word.to_string()));
        }
    }
    out
}

/// Whitespace-separated words with their char index.
fn words(c: &[char]) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < c.len() {
        if c[i].is_whitespace() {
            i += 1;
            continue;
        }
        let start = i;
        while i < c.len() && !c[i].is_whitespace() {
            i += 1;
        }
        out.push((start, c[start..i].iter().collect()));
    }
    out
}

/// The target of an inline link, from the char after `](`.
fn link_target(c: &[char]) -> Option<String> {
    let mut depth = 0;
    for (i, &ch) in c.iter().enumerate() {
        match ch {
            '(' => depth += 1,
            ')' if depth == 0 => {
                let inner: String = c[..i].iter().collect();
                let inner = inner.trim();
                let target = inner.split_whitespace().next().unwrap_or("");
                return Some(
                    target
                        .trim_start_matches('<')
                        .trim_end_matches('>')
                        .to_string(),
                );
            }
            ')' => depth -= 1,
            _ => {}
        }
    }
    None
}

/// The target of a reference definition, `[name]: target`.
fn reference_definition(line: &str) -> Option<&str> {
    let rest = line.strip_prefix('[')?;
    let (label, rest) = rest.split_once("]:")?;
    if label.is_empty() || label.contains(']') {
        return None;
    }
    rest.split_whitespace().next()
}

/// `a/b/../c` → `a/c`; None when it climbs out of the repository.
fn normalize(path: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            Component::CurDir => {}
            Component::ParentDir => {
                if !out.pop() {
                    return None;
                }
            }
            Component::Normal(p) => out.push(p),
            Component::RootDir | Component::Prefix(_) => return None,
        }
    }
    Some(out)
}

/// The anchors GitHub gives a Markdown file's headings: lowercase, every
/// char but letters, digits, `_`, `-` and space dropped, spaces to `-`;
/// a repeated slug gets `-1`, `-2`, ….
fn heading_slugs(text: &str) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut slugs = BTreeSet::new();
    let mut fenced = false;
    for line in text.lines() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("```") || trimmed.starts_with("~~~") {
            fenced = !fenced;
            continue;
        }
        let level = line.chars().take_while(|&c| c == '#').count();
        if fenced || !(1..=6).contains(&level) || !line[level..].starts_with(' ') {
            continue;
        }
        let title = line[level..].trim().trim_end_matches('#').trim();
        let slug: String = title
            .chars()
            .flat_map(char::to_lowercase)
            .filter(|&c| c.is_alphanumeric() || c == '_' || c == '-' || c == ' ')
            .map(|c| if c == ' ' { '-' } else { c })
            .collect();
        let n = seen.entry(slug.clone()).or_insert(0);
        slugs.insert(if *n == 0 { slug } else { format!("{slug}-{n}") });
        *n += 1;
    }
    slugs
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    path.metadata()
        .is_ok_and(|m| m.permissions().mode() & 0o111 != 0)
}

/// Every file under `dir`, skipping builds and caches.
fn files_under(root: &Path, dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return out;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let skip = dir == root && NOT_OURS.iter().any(|n| entry.file_name() == *n);
        if skip {
            continue;
        }
        if path.is_dir() {
            out.extend(files_under(root, &path));
        } else {
            out.push(path);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn repo_root() -> &'static Path {
        Path::new(env!("CARGO_MANIFEST_DIR"))
    }

    #[test]
    fn every_path_link_and_command_our_messages_and_docs_name_exists() {
        let root = repo_root();
        let repo = Repo::load(root);
        let mut found = Vec::new();
        let mut sources = files_under(root, &root.join("src"));
        sources.sort();
        let mut checked = 0;
        for path in sources {
            let rel = path.strip_prefix(root).expect("under the root");
            if path.extension().is_none_or(|e| e != "rs") || rel == Path::new(file!()) {
                continue;
            }
            let text = std::fs::read_to_string(&path).expect("a source file");
            found.extend(repo.check_rust(&rel.to_string_lossy(), &text));
            checked += 1;
        }
        let mut markdown: Vec<PathBuf> = MARKDOWN.iter().map(PathBuf::from).collect();
        let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
            .map(|d| {
                d.flatten()
                    .map(|e| Path::new("docs").join(e.file_name()))
                    .collect()
            })
            .unwrap_or_default();
        docs.retain(|p| p.extension().is_some_and(|e| e == "md"));
        docs.sort();
        markdown.extend(docs);
        for rel in markdown {
            let text = std::fs::read_to_string(root.join(&rel)).expect("a Markdown file");
            found.extend(repo.check_markdown(&rel.to_string_lossy(), &text));
            checked += 1;
        }
        assert!(checked > 40, "only {checked} files found to check");
        let listed: Vec<String> = found.iter().map(Finding::to_string).collect();
        assert!(
            listed.is_empty(),
            "names that do not resolve:\n{}",
            listed.join("\n")
        );
    }

    /// A repository of a few files, to show each rule fail.
    fn fixture() -> (tempfile::TempDir, Repo) {
        let dir = tempfile::tempdir().expect("a temp dir");
        let root = dir.path();
        for (path, text) in [
            (
                "Makefile",
                "IMAGE ?= x\n.PHONY: image\nimage: bundle\n\tdocker build .\n",
            ),
            (
                "Cargo.toml",
                "[[test]]\nname = \"e2e\"\n[features]\nfailpoints = []\n",
            ),
            ("examples/ha/gce-etcd-a.manifest", ""),
            ("examples/ha/gce-etcd-b.manifest", ""),
            (
                "docs/paths.md",
                "# Paths\n## The `version.txt` contract\n## Backups\n## Backups\n",
            ),
            ("README.md", "[paths](docs/paths.md#backups-1)\n"),
            ("scripts/demo.sh", ""),
            ("images/migrate-if-needed.sh", ""),
        ] {
            let path = root.join(path);
            std::fs::create_dir_all(path.parent().expect("a parent")).expect("mkdir");
            std::fs::write(&path, text).expect("write");
        }
        let repo = Repo::load(root);
        (dir, repo)
    }

    fn whats(found: Vec<Finding>) -> Vec<String> {
        found.into_iter().map(|f| f.to_string()).collect()
    }

    #[test]
    fn the_cluster_refusal_naming_a_manifest_we_never_had_is_found() {
        let (_dir, repo) = fixture();
        let source = concat!(
            "#[error(\"which --no-exec cannot do; run etcd-migrate with `--` (see\n",
            "    exam",
            "ples/gce-etcd-ha.manifest and exam",
            "ples/ha/gce-etcd-a.manifest)\")]\n",
            "NoExec,\n",
        );
        assert_eq!(
            whats(repo.check_rust("src/cluster/entry.rs", source)),
            ["src/cluster/entry.rs:2: path examples/gce-etcd-ha.manifest does not exist in the repository"]
        );
    }

    #[test]
    fn placeholders_absolute_paths_urls_and_comments_are_not_ours() {
        let (_dir, repo) = fixture();
        let source = concat!(
            "// exam",
            "ples/none.yaml in a comment\n",
            "/* src/none.rs /* nested */ */\n",
            "let _ = '\"'; let _: &'static str = \"<data-dir>/src/none /var/exam",
            "ples/x\";\n",
            "let _ = \"https://github.com/etcd-io/etcd/blob/main/scripts/none.sh\";\n",
            "let _ = r#\"exam",
            "ples/ha/{name}.yaml, exam",
            "ples/ha/$X, exam",
            "ples/ha/<m>.yaml\"#;\n",
            "let _ = \"exam",
            "ples/ha/gce-etcd-{a,b}.manifest exam",
            "ples/ha/gce-etcd-*.manifest.\";\n",
        );
        assert_eq!(
            whats(repo.check_rust("src/x.rs", source)),
            Vec::<String>::new()
        );
        let broken = concat!(
            "let _ = \"exam",
            "ples/ha/gce-etcd-{a,c}.manifest exam",
            "ples/ha/kubeadm-*.yaml\";\n",
            "let _ = \"exam",
            "ples/none/{name}.yaml\\n   \\\n  scr",
            "ipts/none.sh\";\n",
        );
        assert_eq!(
            whats(repo.check_rust("src/x.rs", broken)),
            [
                "src/x.rs:1: path examples/ha/gce-etcd-c.manifest does not exist in the repository",
                "src/x.rs:1: path examples/ha/kubeadm-*.yaml does not exist in the repository",
                "src/x.rs:2: directory examples/none/ does not exist in the repository",
                "src/x.rs:3: path scripts/none.sh does not exist in the repository",
            ]
        );
    }

    #[test]
    fn links_resolve_from_their_own_file_and_anchors_are_github_slugs() {
        let (_dir, repo) = fixture();
        let good = concat!(
            "[a](paths.md#the-versiontxt-contract), [b](../README.md), [c](#backups-1)\n",
            "`[not](a-link.md)` [d](https://example.com/x.md#y)\n",
            "[e]: ../scripts/demo.sh\n",
        );
        assert_eq!(
            whats(repo.check_markdown("docs/paths.md", good)),
            Vec::<String>::new()
        );
        let bad = concat!(
            "[a](docs/paths.md#backups-2) and [b](paths.md)\n",
            "see [the walk](#the-walk)\n",
            "```sh\n[not](a-link.md)\n```\n",
            "[c](../../etc/passwd)\n",
        );
        assert_eq!(
            whats(repo.check_markdown("README.md", bad)),
            [
                "README.md:1: link docs/paths.md#backups-2: docs/paths.md has no heading whose anchor is #backups-2",
                "README.md:1: link paths.md: paths.md does not exist in the repository",
                "README.md:2: link #the-walk: README.md has no heading whose anchor is #the-walk",
                "README.md:6: link ../../etc/passwd leads outside the repository",
            ]
        );
    }

    #[test]
    fn commands_need_their_makefile_rule_cargo_target_and_runnable_script() {
        let (_dir, repo) = fixture();
        let good = concat!(
            "make them the same; `make image` and `make IMAGE=x image`\n",
            "`cargo test --features failpoints --test e2e walks`, `migrate-if-needed.sh`\n",
        );
        assert_eq!(
            whats(repo.check_markdown("README.md", good)),
            Vec::<String>::new()
        );
        let bad = concat!(
            "```sh\nscr",
            "ipts/demo.sh    # the demo\nmake cluster-test\n```\n",
            "`cargo test --test e2e2`, `cargo test\n--features failpoint` and `fetch-etcd.sh`\n",
        );
        assert_eq!(
            whats(repo.check_markdown("README.md", bad)),
            [
                "README.md:2: scripts/demo.sh is run as a command but is not executable",
                "README.md:3: `make cluster-test`: no Makefile rule cluster-test",
                "README.md:5: `--test e2e2`: no Cargo.toml test target e2e2",
                "README.md:6: no script fetch-etcd.sh in the repository",
                "README.md:6: `--features failpoint`: no Cargo.toml feature failpoint",
            ]
        );
    }
}
