//! This module owns comparing paths as paths: the data dir, the backup and
//! bin dirs, and the dirs named in etcd's arguments, in its environment or
//! in other processes' command lines are compared after normalisation,
//! never as strings (`/var/etcd/data/`, `/var/etcd//data`, `/var/./etcd/data`
//! and, from `/var/etcd`, `./data` all name one dir).
//!
//! Two forms, for two purposes:
//! - [`absolute`] is lexical (no filesystem access but the working dir):
//!   the spelling we keep, show in messages and pass to etcd;
//! - [`resolved`] asks the filesystem (`canonicalize`) wherever the path
//!   exists, so that a symlink and its target, or `a/b/..` and `a`,
//!   compare equal: what comparisons use.

use std::io;
use std::path::{Component, Path, PathBuf};

/// `path` made absolute against the working directory, without `.`
/// components, repeated slashes or a trailing slash (what
/// [`Path::components`] drops). `..` is kept: collapsing it lexically is
/// wrong when the component before it is a symlink (`/link/..` is the
/// link target's parent), so only [`resolved`] removes it. Fails on an
/// empty path, or when the working directory is gone.
pub fn absolute(path: &Path) -> io::Result<PathBuf> {
    // std::path::absolute keeps a trailing slash; collecting the
    // components drops it and any `.` or `//` it left.
    Ok(std::path::absolute(path)?.components().collect())
}

/// What `path` names on this machine, for comparing it with another:
/// [`absolute`], then the longest existing ancestor canonicalised
/// (symlinks and `..` resolved by the filesystem) and the rest appended
/// lexically. Nothing in that rest exists, so none of it can be a symlink
/// and a `..` there simply drops the component before it. Falls back to
/// the lexical form if the working directory is gone.
pub fn resolved(path: &Path) -> PathBuf {
    resolved_from(None, path)
}

/// [`resolved`] for a path another process holds: a relative `path` is
/// taken from `cwd` (that process's working directory) when given.
pub fn resolved_from(cwd: Option<&Path>, path: &Path) -> PathBuf {
    let joined = match cwd {
        Some(cwd) if path.is_relative() => cwd.join(path),
        _ => path.to_path_buf(),
    };
    let lexical = absolute(&joined).unwrap_or(joined);
    // Peel components off the end until what is left exists.
    let mut existing = lexical.as_path();
    let mut rest: Vec<Component> = Vec::new();
    let base = loop {
        if let Ok(canonical) = std::fs::canonicalize(existing) {
            break canonical;
        }
        let mut components = existing.components();
        match components.next_back() {
            Some(last @ (Component::Normal(_) | Component::ParentDir)) => {
                rest.push(last);
                existing = components.as_path();
            }
            // The root (or nothing) is left and cannot be canonicalised:
            // the lexical form is all there is.
            _ => return lexical,
        }
    };
    let mut resolved = base;
    for component in rest.into_iter().rev() {
        match component {
            Component::ParentDir => {
                resolved.pop();
            }
            other => resolved.push(other),
        }
    }
    resolved
}

/// Whether `a` and `b` name the same directory entry (see [`resolved`]).
pub fn same(a: &Path, b: &Path) -> bool {
    resolved(a) == resolved(b)
}

/// Whether `inner` is `outer` or lies inside it, component by component
/// (`/data.backup` is not inside `/data`), after [`resolved`].
pub fn is_within(inner: &Path, outer: &Path) -> bool {
    resolved(inner).starts_with(resolved(outer))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absolute_drops_dots_doubled_and_trailing_slashes_but_keeps_dot_dot() {
        let cwd = std::env::current_dir().expect("cwd");
        for (given, expected) in [
            ("/var/etcd/data/", PathBuf::from("/var/etcd/data")),
            ("//var//etcd///data//", PathBuf::from("/var/etcd/data")),
            ("/var/./etcd/./data/.", PathBuf::from("/var/etcd/data")),
            ("/var/etcd/../data", PathBuf::from("/var/etcd/../data")),
            ("./rel/path/", cwd.join("rel/path")),
            ("rel", cwd.join("rel")),
        ] {
            assert_eq!(
                absolute(Path::new(given)).expect(given),
                expected,
                "{given}"
            );
        }
        assert!(
            absolute(Path::new("")).is_err(),
            "an empty path names nothing"
        );
    }

    #[test]
    fn resolved_paths_compare_equal_through_symlinks_and_dot_dot() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let real = tmp.path().join("real");
        std::fs::create_dir_all(real.join("data")).expect("mkdir");
        let link = tmp.path().join("link");
        std::os::unix::fs::symlink(&real, &link).expect("symlink");
        let data = real.join("data");
        for other in [
            format!("{}/", data.display()),
            format!("{}//data/.", real.display()),
            format!("{}/data", link.display()),
            format!("{}/data/../data/", link.display()),
        ] {
            assert!(
                same(&data, Path::new(&other)),
                "{other} is {}",
                data.display()
            );
        }
        // A missing path is resolved as far as it exists.
        let missing = data.join("member/wal");
        assert!(same(
            &missing,
            Path::new(&format!("{}/data/member/x/../wal/", link.display()))
        ));
        assert!(is_within(&link.join("data/member"), &data));
        assert!(is_within(&data, &data));
        assert!(!is_within(
            &tmp.path().join("real/data.backup"),
            &link.join("data")
        ));
        assert!(!same(&data, &real));
    }

    #[test]
    fn relative_paths_of_another_process_are_taken_from_its_cwd() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let data = tmp.path().join("data");
        std::fs::create_dir(&data).expect("mkdir");
        assert_eq!(
            resolved_from(Some(tmp.path()), Path::new("./data/")),
            resolved(&data)
        );
        assert_eq!(
            resolved_from(Some(Path::new("/elsewhere")), &data),
            resolved(&data),
            "an absolute path ignores the cwd"
        );
    }
}
