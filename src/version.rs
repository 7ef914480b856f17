//! This module owns the vocabulary of versions: an etcd release (`Version`),
//! the storage format a data dir holds (`Storage`), the pair recorded in
//! `version.txt` (`VersionPair`), and the strict parsers for all three.

use std::fmt;
use std::str::FromStr;

/// An etcd release, `major.minor.patch`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Version {
    /// Major number (2 or 3 for every etcd that ever shipped).
    pub major: u32,
    /// Minor number.
    pub minor: u32,
    /// Patch number.
    pub patch: u32,
}

/// A `major.minor` line of releases; the unit the planner walks by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Minor {
    /// Major number.
    pub major: u32,
    /// Minor number.
    pub minor: u32,
}

/// The storage format of a data dir.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Storage {
    /// The v2 store (etcd 2.x, and 3.x serving v2 data).
    Etcd2,
    /// The v3 mvcc backend (etcd 3.0+).
    Etcd3,
}

/// What `version.txt` records: the last etcd that ran on the data and the
/// storage format it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct VersionPair {
    /// The etcd release.
    pub version: Version,
    /// The storage format.
    pub storage: Storage,
}

/// Why a version, storage or pair string was rejected.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ParseError {
    /// Not three dot-separated decimal numbers.
    #[error("{input:?} is not a version of the form MAJOR.MINOR.PATCH (e.g. 3.4.23)")]
    Version {
        /// The rejected text.
        input: String,
    },
    /// Neither `etcd2` nor `etcd3`.
    #[error("{input:?} is not a storage format: expected etcd2 or etcd3")]
    Storage {
        /// The rejected text.
        input: String,
    },
    /// Not `<version>/<storage>`.
    #[error("{input:?} is not of the form <version>/<storage> (e.g. 3.4.23/etcd3)")]
    Pair {
        /// The rejected text.
        input: String,
    },
    /// etcd 2.x cannot hold v3 data.
    #[error(
        "{input:?} is impossible: etcd {version} has no etcd3 storage (etcd3 needs 3.0 or later)"
    )]
    Etcd3OnV2 {
        /// The rejected text.
        input: String,
        /// The 2.x version it named.
        version: Version,
    },
}

impl Version {
    /// Builds a version from its three numbers.
    pub const fn new(major: u32, minor: u32, patch: u32) -> Self {
        Version {
            major,
            minor,
            patch,
        }
    }

    /// The minor line this release belongs to.
    pub const fn minor_line(self) -> Minor {
        Minor {
            major: self.major,
            minor: self.minor,
        }
    }

    /// The storage a fresh data dir gets at this version when none is asked
    /// for: etcd2 for 2.x, etcd3 for 3.x (what the Kubernetes image did).
    pub fn default_storage(self) -> Storage {
        if self.major >= 3 {
            Storage::Etcd3
        } else {
            Storage::Etcd2
        }
    }

    /// True when this release serves the v2 API at all (2.x through 3.5;
    /// 3.6 removed it).
    pub fn has_v2_api(self) -> bool {
        self.minor_line() <= Minor::new(3, 5)
    }

    /// True when this release serves the v3 API (3.0+), e.g. on etcd2 data
    /// too, where old tooling wrote v3 keys beside the v2 store.
    pub fn has_v3_api(self) -> bool {
        self.major >= 3
    }

    /// True when this release's cluster can be walked down to `to` (the
    /// minor below) online, by etcd's own downgrade: `downgrade enable`
    /// on the running release, which lowers the data's cluster (and, 3.6+,
    /// storage) version, after which `to` serves it. 3.6 → 3.5 and 3.7 →
    /// 3.6 (etcd's downgrade guides); 3.5 → 3.4 only into a 3.4 patch that
    /// reads 3.5's schema (`--next-cluster-version-compatible`, 3.4.31+).
    pub fn downgrades_online_to(self, to: Version) -> bool {
        let from = self.minor_line();
        if from.previous() != Some(to.minor_line()) {
            return false;
        }
        from >= Minor::new(3, 6) || (from == Minor::new(3, 5) && to.reads_next_minor_schema())
    }

    /// True for a 3.4 patch with `--next-cluster-version-compatible`
    /// (3.4.31+): it then starts on data 3.5 wrote, joining a 3.5 cluster
    /// or finishing its downgrade. Harmless on 3.4's own data (measured on
    /// 3.4.45: data written with it starts without it and the reverse).
    pub fn reads_next_minor_schema(self) -> bool {
        self.minor_line() == Minor::new(3, 4) && self.patch >= 31
    }

    /// True for a 3.4 patch that a 3.5 cluster rolls down to online,
    /// member by member, with no downgrade job (etcd's guide "Downgrade
    /// etcd from 3.5 to 3.4" asks for 3.4.32+): started with
    /// `--next-cluster-version-compatible`, it joins the 3.5 cluster, and
    /// from 3.4.32 on a 3.4 leader lowers a 3.5 cluster version as a 3.5
    /// leader does (etcd's `IsValidClusterVersionChange`, commit
    /// 0d62c9977). Measured on 3.5.16 → 3.4.45: the cluster version is
    /// 3.4 within 3 s of the first member's restart, and 3.5 members run
    /// on at cluster version 3.4 as in an upgrade's mixed state.
    pub fn rolls_down_from_next_minor(self) -> bool {
        self.minor_line() == Minor::new(3, 4) && self.patch >= 32
    }

    /// True when this release reports its data's storage version (3.6+:
    /// `/version`'s `storage`), which follows the cluster version up at
    /// once and down once the downgrade is snapshotted.
    pub fn reports_storage_version(self) -> bool {
        self.minor_line() >= Minor::new(3, 6)
    }

    /// True when this release replays only v3 requests from the WAL (3.7+
    /// removed the v2 apply path, and panics on a v2 request written by
    /// 3.5 or older that its replay meets).
    pub fn replays_only_v3_requests(self) -> bool {
        self.minor_line() >= Minor::new(3, 7)
    }

    /// True when this release serves the v2 API only with `--enable-v2=true`
    /// (3.4 and 3.5).
    pub fn needs_enable_v2_flag(self) -> bool {
        self.minor_line() >= Minor::new(3, 4) && self.has_v2_api()
    }

    /// True when this release's `etcdctl` has the offline v2 → v3
    /// `migrate` command (3.0 through 3.4; 3.5 removed it).
    pub fn has_etcdctl_migrate(self) -> bool {
        self.minor_line() >= Minor::new(3, 0) && self.minor_line() <= Minor::new(3, 4)
    }

    /// True when this release answers LeaseTimeToLive (3.1+): 3.0's lease
    /// service has only grant, revoke and keep-alive, so a key's lease id
    /// is all it tells (ETCD-NOTES).
    pub fn has_lease_time_to_live(self) -> bool {
        self.minor_line() >= Minor::new(3, 1)
    }

    /// True when this release ships `etcdutl` (3.5+), which took over
    /// offline operations such as `snapshot restore` from `etcdctl`.
    pub fn has_etcdutl(self) -> bool {
        self.minor_line() >= Minor::new(3, 5)
    }
}

impl Minor {
    /// Builds a minor line from its two numbers.
    pub const fn new(major: u32, minor: u32) -> Self {
        Minor { major, minor }
    }

    /// The minor line released after this one. etcd went from 2.3 straight
    /// to 3.0; every other step is minor + 1.
    pub fn next(self) -> Minor {
        if self == Minor::new(2, 3) {
            Minor::new(3, 0)
        } else {
            Minor::new(self.major, self.minor + 1)
        }
    }

    /// The minor line released before this one, or `None` before 2.2 (the
    /// oldest release this tool knows).
    pub fn previous(self) -> Option<Minor> {
        match (self.major, self.minor) {
            (3, 0) => Some(Minor::new(2, 3)),
            (2, 2) => None,
            (_, 0) => None,
            (major, minor) => Some(Minor::new(major, minor - 1)),
        }
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

impl fmt::Display for Minor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

impl fmt::Display for Storage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Storage::Etcd2 => "etcd2",
            Storage::Etcd3 => "etcd3",
        })
    }
}

impl fmt::Display for VersionPair {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.version, self.storage)
    }
}

impl FromStr for Version {
    type Err = ParseError;

    /// Strict: exactly three decimal numbers, no `v` prefix, no pre-release
    /// suffix, no leading `+`/`-`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || ParseError::Version {
            input: s.to_string(),
        };
        let mut parts = s.split('.');
        let mut number = || -> Result<u32, ParseError> {
            let part = parts.next().ok_or_else(err)?;
            if part.is_empty() || !part.bytes().all(|b| b.is_ascii_digit()) {
                return Err(err());
            }
            part.parse().map_err(|_| err())
        };
        let version = Version::new(number()?, number()?, number()?);
        if parts.next().is_some() {
            return Err(err());
        }
        Ok(version)
    }
}

impl FromStr for Storage {
    type Err = ParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "etcd2" => Ok(Storage::Etcd2),
            "etcd3" => Ok(Storage::Etcd3),
            _ => Err(ParseError::Storage {
                input: s.to_string(),
            }),
        }
    }
}

impl FromStr for VersionPair {
    type Err = ParseError;

    /// Parses `<semver>/<storage>`, tolerating surrounding whitespace (a
    /// trailing newline from `echo`) and nothing else.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let trimmed = s.trim();
        let (version, storage) = trimmed.split_once('/').ok_or_else(|| ParseError::Pair {
            input: s.to_string(),
        })?;
        let version: Version = version.parse()?;
        let storage: Storage = storage.parse()?;
        if storage == Storage::Etcd3 && version.major < 3 {
            return Err(ParseError::Etcd3OnV2 {
                input: s.to_string(),
                version,
            });
        }
        Ok(VersionPair { version, storage })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &str) -> Version {
        s.parse().expect("test version parses")
    }

    #[test]
    fn parses_versions_strictly() {
        assert_eq!(v("3.4.23"), Version::new(3, 4, 23));
        assert_eq!(v("2.2.1"), Version::new(2, 2, 1));
        for bad in [
            "",
            "3",
            "3.4",
            "3.4.",
            "v3.4.23",
            "3.4.23.1",
            "3.4.23-rc.0",
            "3.4.x",
            " 3.4.23",
            "+3.4.23",
            "3..23",
            "99999999999.0.0",
        ] {
            assert!(
                bad.parse::<Version>().is_err(),
                "{bad:?} should be rejected"
            );
        }
    }

    #[test]
    fn parses_pairs_with_surrounding_whitespace_only() {
        let pair: VersionPair = " 3.4.23/etcd3\n".parse().expect("parses");
        assert_eq!(pair.version, Version::new(3, 4, 23));
        assert_eq!(pair.storage, Storage::Etcd3);
        assert_eq!(pair.to_string(), "3.4.23/etcd3");
        for bad in [
            "3.4.23",
            "3.4.23 /etcd3",
            "3.4.23/ etcd3",
            "3.4.23/etcd4",
            "3.4.23/etcd3/x",
            "/etcd3",
            "3.4.23/",
            "3.4.23/ETCD3",
            "2.2.1/etcd3",
        ] {
            assert!(
                bad.parse::<VersionPair>().is_err(),
                "{bad:?} should be rejected"
            );
        }
    }

    #[test]
    fn etcd3_on_2x_names_the_version() {
        let err = "2.3.7/etcd3".parse::<VersionPair>().unwrap_err();
        assert!(
            err.to_string().contains("etcd 2.3.7 has no etcd3 storage"),
            "{err}"
        );
    }

    #[test]
    fn minor_lines_walk_across_the_major_boundary() {
        assert_eq!(Minor::new(2, 2).next(), Minor::new(2, 3));
        assert_eq!(Minor::new(2, 3).next(), Minor::new(3, 0));
        assert_eq!(Minor::new(3, 5).next(), Minor::new(3, 6));
        assert_eq!(Minor::new(3, 0).previous(), Some(Minor::new(2, 3)));
        assert_eq!(Minor::new(2, 2).previous(), None);
        assert_eq!(Minor::new(3, 6).previous(), Some(Minor::new(3, 5)));
    }

    #[test]
    fn api_capabilities_follow_the_release_notes() {
        assert!(v("2.2.1").has_v2_api() && !v("2.2.1").needs_enable_v2_flag());
        assert!(v("3.3.25").has_v2_api() && !v("3.3.25").needs_enable_v2_flag());
        assert!(v("3.4.23").needs_enable_v2_flag() && v("3.5.16").needs_enable_v2_flag());
        assert!(!v("3.6.0").has_v2_api() && !v("3.6.0").needs_enable_v2_flag());
        assert!(v("3.0.17").has_etcdctl_migrate() && v("3.4.23").has_etcdctl_migrate());
        assert!(!v("2.3.7").has_etcdctl_migrate() && !v("3.5.1").has_etcdctl_migrate());
        assert!(!v("3.4.23").has_etcdutl() && v("3.5.1").has_etcdutl());
        assert!(!v("3.0.17").has_lease_time_to_live() && v("3.1.20").has_lease_time_to_live());
    }
}
