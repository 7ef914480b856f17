//! This module owns the fingerprint of a directory tree: every path with
//! its type, mode, size, mtime and a hash of its content, so a test can
//! prove a refused run left a data dir exactly as it found it.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::hash::Hasher;
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// What one path looked like.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    /// `d`, `f`, `l` or `?`.
    pub kind: char,
    /// Permission bits.
    pub mode: u32,
    /// Size in bytes.
    pub size: u64,
    /// Modification time in ns: a file rewritten with the same bytes, or a
    /// dir where a file was created and removed again, was touched.
    pub mtime_ns: i128,
    /// Hash of the content (files) or of the link target (symlinks).
    pub hash: u64,
}

/// Every path under a root (the root itself is `""`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tree(pub BTreeMap<PathBuf, Node>);

/// Fingerprints the tree at `root`.
pub fn fingerprint(root: &Path) -> Tree {
    let mut nodes = BTreeMap::new();
    walk(root, Path::new(""), &mut nodes);
    Tree(nodes)
}

fn walk(root: &Path, relative: &Path, nodes: &mut BTreeMap<PathBuf, Node>) {
    let path = root.join(relative);
    let meta = std::fs::symlink_metadata(&path)
        .unwrap_or_else(|err| panic!("stat {}: {err}", path.display()));
    let kind = if meta.is_dir() {
        'd'
    } else if meta.is_file() {
        'f'
    } else if meta.file_type().is_symlink() {
        'l'
    } else {
        '?'
    };
    let mut hasher = std::hash::DefaultHasher::new();
    match kind {
        'f' => hash_file(&path, &mut hasher),
        'l' => {
            let target = std::fs::read_link(&path)
                .unwrap_or_else(|err| panic!("readlink {}: {err}", path.display()));
            hasher.write(target.as_os_str().as_encoded_bytes());
        }
        _ => {}
    }
    nodes.insert(
        relative.to_path_buf(),
        Node {
            kind,
            mode: meta.mode() & 0o7777,
            size: if kind == 'd' { 0 } else { meta.size() },
            mtime_ns: i128::from(meta.mtime()) * 1_000_000_000 + i128::from(meta.mtime_nsec()),
            hash: hasher.finish(),
        },
    );
    if kind == 'd' {
        let entries =
            std::fs::read_dir(&path).unwrap_or_else(|err| panic!("list {}: {err}", path.display()));
        for entry in entries {
            let entry = entry.unwrap_or_else(|err| panic!("list {}: {err}", path.display()));
            walk(root, &relative.join(entry.file_name()), nodes);
        }
    }
}

fn hash_file(path: &Path, hasher: &mut impl Hasher) {
    let mut file =
        std::fs::File::open(path).unwrap_or_else(|err| panic!("open {}: {err}", path.display()));
    let mut buffer = vec![0u8; 1 << 20];
    loop {
        let read = file
            .read(&mut buffer)
            .unwrap_or_else(|err| panic!("read {}: {err}", path.display()));
        if read == 0 {
            return;
        }
        hasher.write(&buffer[..read]);
    }
}

impl Tree {
    /// The tree without `paths` (relative; `""` is the root itself).
    pub fn without(&self, paths: &[&str]) -> Tree {
        let mut nodes = self.0.clone();
        for path in paths {
            nodes.remove(Path::new(path));
        }
        Tree(nodes)
    }

    /// The tree without modification times: what a copy that does not keep
    /// them (a backup) still has in common with the original.
    pub fn content(&self) -> Tree {
        Tree(
            self.0
                .iter()
                .map(|(path, node)| {
                    (
                        path.clone(),
                        Node {
                            mtime_ns: 0,
                            ..node.clone()
                        },
                    )
                })
                .collect(),
        )
    }

    /// Asserts `after` is the same tree, listing what changed.
    pub fn assert_unchanged(&self, after: &Tree, context: &str) {
        if self == after {
            return;
        }
        let mut changes = String::new();
        for (path, node) in &self.0 {
            match after.0.get(path) {
                None => {
                    let _ = writeln!(changes, "removed: {}", path.display());
                }
                Some(new) if new != node => {
                    let _ = writeln!(changes, "changed: {} {node:?} -> {new:?}", path.display());
                }
                Some(_) => {}
            }
        }
        for path in after.0.keys().filter(|path| !self.0.contains_key(*path)) {
            let _ = writeln!(changes, "added: {}", path.display());
        }
        panic!("{context}: the data dir was touched:\n{changes}");
    }
}
