//! This module owns etcd's raft snapshot files, `snap/<term>-<index>.snap`:
//! picking the newest one that decodes (falling back to older ones past a
//! broken file, as etcd's snapshotter does), and reading the v2 store it
//! carries. A file is `snappb.Snapshot{crc, data}` where `data` is a
//! `raftpb.Snapshot{data: v2 store JSON, metadata{conf_state, index,
//! term}}` and `crc` its CRC-32C. The JSON (hundreds of MB on a large
//! etcd2 cluster) is streamed: only the nodes [`super::state`] asks for are
//! kept, so memory stays bounded by the deepest path and the largest
//! wanted value, whatever the snapshot's size.

use std::fmt;
use std::fs::File;
use std::io::{self, BufReader, Read};
use std::path::{Path, PathBuf};

use serde::de::{DeserializeSeed, IgnoredAny, MapAccess, Visitor};

use super::proto::{self, Fields};
use super::state::V2State;
use super::OnDiskError;

/// Read buffer of a snapshot file.
const READ_BUFFER_BYTES: usize = 1 << 16;

/// `raftpb.SnapshotMetadata` is a few ids and two integers; a larger one
/// is not etcd's.
const MAX_METADATA_BYTES: u64 = 1 << 20;

/// A snapshot read from disk.
#[derive(Debug)]
pub struct Snapshot {
    /// The raft index it covers the log up to.
    pub index: u64,
    /// What its v2 store holds.
    pub v2: V2State,
}

/// The newest readable snapshot, and the newer files passed over.
#[derive(Debug, Default)]
pub struct Newest {
    /// The snapshot, if any file decodes.
    pub snapshot: Option<Snapshot>,
    /// Files that did not decode, newest first, with why.
    pub skipped: Vec<(PathBuf, String)>,
}

/// Why one file was not used.
enum Failure {
    /// The file is broken (empty, truncated, checksum): etcd skips it.
    Broken(String),
    /// The file is intact but unreadable here, or the disk failed.
    Fatal(OnDiskError),
}

impl From<io::Error> for Failure {
    fn from(err: io::Error) -> Self {
        // Lengths are checked against the file's size before reading, so
        // an early end means the file shrank under us or is cut short.
        if err.kind() == io::ErrorKind::UnexpectedEof {
            Failure::Broken("the file ends early".to_string())
        } else {
            Failure::Fatal(OnDiskError::Io {
                path: PathBuf::new(),
                source: err,
            })
        }
    }
}

/// Reads the newest snapshot in `dir` that decodes. A missing dir, or one
/// without `.snap` files, gives none.
/// Each store is read into a clone of `fresh` (which says, for one,
/// whether node names are kept).
pub fn newest(dir: &Path, fresh: &V2State) -> Result<Newest, OnDiskError> {
    let mut names: Vec<String> = super::file_names(dir)?
        .into_iter()
        .filter(|name| name.ends_with(".snap"))
        .collect();
    // `<16 hex term>-<16 hex index>.snap`: by name is by (term, index).
    names.sort_unstable_by(|a, b| b.cmp(a));
    let mut newest = Newest::default();
    for name in names {
        let path = dir.join(&name);
        match load(&path, fresh) {
            Ok(snapshot) => {
                newest.snapshot = Some(snapshot);
                return Ok(newest);
            }
            Err(Failure::Broken(why)) => newest.skipped.push((path, why)),
            Err(Failure::Fatal(OnDiskError::Io { source, .. })) => {
                return Err(OnDiskError::Io { path, source })
            }
            Err(Failure::Fatal(err)) => return Err(err),
        }
    }
    Ok(newest)
}

/// A reader that counts and checksums what passes through it, and stops
/// at a limit.
struct Checked<R> {
    inner: R,
    remaining: u64,
    crc: u32,
}

impl<R: Read> Read for Checked<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let room = buf
            .len()
            .min(usize::try_from(self.remaining).unwrap_or(usize::MAX));
        if room == 0 {
            return Ok(0);
        }
        let n = self.inner.read(&mut buf[..room])?;
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        self.crc = crc32c::crc32c_append(self.crc, &buf[..n]);
        self.remaining -= n as u64;
        Ok(n)
    }
}

/// Reads a varint from a stream; `None` at a clean end of stream.
fn read_varint(reader: &mut impl Read) -> io::Result<Option<u64>> {
    let mut bytes = Vec::with_capacity(10);
    let mut byte = [0u8; 1];
    loop {
        if reader.read(&mut byte)? == 0 {
            if bytes.is_empty() {
                return Ok(None);
            }
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        bytes.push(byte[0]);
        if byte[0] & 0x80 == 0 || bytes.len() == 10 {
            break;
        }
    }
    let mut pos = 0;
    proto::read_varint(&bytes, &mut pos)
        .map(Some)
        .map_err(|err| io::Error::new(io::ErrorKind::InvalidData, err.to_string()))
}

/// Skips a field of wire type `wire_type` whose key was just read.
fn skip_field(reader: &mut impl Read, wire_type: u64, limit: u64) -> Result<(), Failure> {
    let len = match wire_type {
        0 => {
            read_varint(reader)?.ok_or_else(|| Failure::Broken("the file ends early".into()))?;
            return Ok(());
        }
        1 => 8,
        2 => read_varint(reader)?.ok_or_else(|| Failure::Broken("the file ends early".into()))?,
        5 => 4,
        other => return Err(Failure::Broken(format!("unsupported wire type {other}"))),
    };
    if len > limit {
        return Err(Failure::Broken(format!(
            "a field of {len} bytes runs past the end"
        )));
    }
    let copied = io::copy(&mut reader.take(len), &mut io::sink())?;
    if copied < len {
        return Err(Failure::Broken("the file ends early".into()));
    }
    Ok(())
}

fn load(path: &Path, fresh: &V2State) -> Result<Snapshot, Failure> {
    let file = File::open(path)?;
    let len = file.metadata()?.len();
    if len == 0 {
        return Err(Failure::Broken("empty file".into()));
    }
    let mut reader = Checked {
        inner: BufReader::with_capacity(READ_BUFFER_BYTES, file),
        remaining: len,
        crc: 0,
    };
    let mut stored_crc = None;
    let mut body: Option<Body> = None;
    while let Some(key) = read_varint(&mut reader)? {
        match (key >> 3, key & 7) {
            (1, 0) => {
                let crc = read_varint(&mut reader)?
                    .ok_or_else(|| Failure::Broken("the file ends early".into()))?;
                stored_crc = Some(crc as u32);
            }
            (2, 2) => {
                let data_len = read_varint(&mut reader)?
                    .ok_or_else(|| Failure::Broken("the file ends early".into()))?;
                if data_len > reader.remaining {
                    return Err(Failure::Broken(format!(
                        "its data of {data_len} bytes runs past the end of the file"
                    )));
                }
                body = Some(read_body(&mut reader, data_len, fresh.clone())?);
            }
            (_, wire_type) => {
                let limit = reader.remaining;
                skip_field(&mut reader, wire_type, limit)?;
            }
        }
    }
    let (Some(stored_crc), Some(body)) = (stored_crc, body) else {
        return Err(Failure::Broken(
            "empty snapshot (no checksum or no data)".into(),
        ));
    };
    if stored_crc == 0 || body.len == 0 {
        return Err(Failure::Broken(
            "empty snapshot (no checksum or no data)".into(),
        ));
    }
    if stored_crc != body.crc {
        return Err(Failure::Broken(format!(
            "checksum mismatch (file says {stored_crc:#x}, data gives {:#x})",
            body.crc
        )));
    }
    // The checksum is good: a store that does not parse is not damage
    // etcd would skip past, and falling back would hide it.
    if let Some(what) = body.json_error {
        return Err(Failure::Fatal(OnDiskError::SnapUnreadable {
            path: path.to_path_buf(),
            what,
        }));
    }
    let mut v2 = body.v2;
    v2.finish_snapshot();
    Ok(Snapshot {
        index: body.index,
        v2,
    })
}

/// What a `raftpb.Snapshot` held.
struct Body {
    len: u64,
    crc: u32,
    index: u64,
    v2: V2State,
    json_error: Option<String>,
}

fn read_body(outer: &mut impl Read, len: u64, v2: V2State) -> Result<Body, Failure> {
    let mut reader = Checked {
        inner: outer,
        remaining: len,
        crc: 0,
    };
    let mut body = Body {
        len,
        crc: 0,
        index: 0,
        v2,
        json_error: None,
    };
    while reader.remaining > 0 {
        let Some(key) = read_varint(&mut reader)? else {
            break;
        };
        match (key >> 3, key & 7) {
            (1, 2) => {
                let json_len = read_varint(&mut reader)?
                    .ok_or_else(|| Failure::Broken("the file ends early".into()))?;
                if json_len > reader.remaining {
                    return Err(Failure::Broken(format!(
                        "its v2 store of {json_len} bytes runs past the end of the data"
                    )));
                }
                let mut json =
                    BufReader::with_capacity(READ_BUFFER_BYTES, (&mut reader).take(json_len));
                if json_len > 0 {
                    let mut de = serde_json::Deserializer::from_reader(&mut json);
                    let parsed = StoreSeed(&mut body.v2)
                        .deserialize(&mut de)
                        .and_then(|()| de.end());
                    if let Err(err) = parsed {
                        if err.is_io() {
                            return Err(Failure::Broken(format!(
                                "its v2 store cannot be read: {err}"
                            )));
                        }
                        body.json_error = Some(format!("its v2 store is not etcd's JSON: {err}"));
                    }
                }
                // Whatever the parser left (after an error) still counts
                // for the checksum.
                io::copy(&mut json, &mut io::sink())?;
            }
            (2, 2) => {
                let meta_len = read_varint(&mut reader)?
                    .ok_or_else(|| Failure::Broken("the file ends early".into()))?;
                if meta_len > reader.remaining || meta_len > MAX_METADATA_BYTES {
                    return Err(Failure::Broken(format!(
                        "its metadata of {meta_len} bytes is larger than etcd writes"
                    )));
                }
                let mut meta = vec![0u8; meta_len as usize];
                reader.read_exact(&mut meta)?;
                for field in Fields::new(&meta) {
                    match field {
                        Ok((2, proto::Value::Varint(v))) => body.index = v,
                        Ok(_) => {}
                        Err(err) => {
                            return Err(Failure::Broken(format!("undecodable metadata: {err}")))
                        }
                    }
                }
            }
            (_, wire_type) => {
                let limit = reader.remaining;
                skip_field(&mut reader, wire_type, limit)?;
            }
        }
    }
    body.crc = reader.crc;
    Ok(body)
}

/// The v2 store: `{"Root": node, "WatcherHub": …, "CurrentIndex": …, …}`.
struct StoreSeed<'a>(&'a mut V2State);

impl<'de> DeserializeSeed<'de> for StoreSeed<'_> {
    type Value = ();

    fn deserialize<D: serde::Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for StoreSeed<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("etcd's v2 store")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let mut root = false;
        while let Some(key) = map.next_key::<String>()? {
            if key == "Root" {
                map.next_value_seed(NodeSeed(&mut *self.0))?;
                root = true;
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        if root {
            Ok(())
        } else {
            Err(serde::de::Error::missing_field("Root"))
        }
    }
}

/// One node: `{"Path", "CreatedIndex", "ModifiedIndex", "ExpireTime",
/// "Value", "Children": {name: node} | null}`. Go writes the fields in
/// that order, so the path is known before the value is read.
struct NodeSeed<'a>(&'a mut V2State);

impl<'de> DeserializeSeed<'de> for NodeSeed<'_> {
    type Value = ();

    fn deserialize<D: serde::Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for NodeSeed<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a v2 store node")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let mut path: Option<String> = None;
        let mut value: Option<String> = None;
        let mut dir = false;
        let mut expire: Option<String> = None;
        while let Some(key) = map.next_key::<String>()? {
            match key.as_str() {
                "Path" => path = Some(map.next_value()?),
                "ExpireTime" => expire = map.next_value()?,
                // A value is kept only where it is needed (and, should a
                // writer ever put it before the path, kept to be safe).
                "Value" if path.as_deref().is_none_or(|p| self.0.wants_value(p)) => {
                    value = Some(map.next_value()?);
                }
                "Children" => dir = map.next_value_seed(ChildrenSeed(&mut *self.0))?,
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        let path = path.ok_or_else(|| serde::de::Error::missing_field("Path"))?;
        let value = value.filter(|_| self.0.wants_value(&path));
        self.0.snapshot_node(&path, value, dir, expire.as_deref());
        Ok(())
    }
}

/// A dir's children (`null` for a key); gives whether it was a dir.
struct ChildrenSeed<'a>(&'a mut V2State);

impl<'de> DeserializeSeed<'de> for ChildrenSeed<'_> {
    type Value = bool;

    fn deserialize<D: serde::Deserializer<'de>>(self, deserializer: D) -> Result<bool, D::Error> {
        deserializer.deserialize_option(self)
    }
}

impl<'de> Visitor<'de> for ChildrenSeed<'_> {
    type Value = bool;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a v2 store dir's children, or null")
    }

    fn visit_none<E: serde::de::Error>(self) -> Result<bool, E> {
        Ok(false)
    }

    fn visit_unit<E: serde::de::Error>(self) -> Result<bool, E> {
        Ok(false)
    }

    fn visit_some<D: serde::Deserializer<'de>>(self, deserializer: D) -> Result<bool, D::Error> {
        deserializer.deserialize_map(self)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<bool, A::Error> {
        while map.next_key::<IgnoredAny>()?.is_some() {
            map.next_value_seed(NodeSeed(&mut *self.0))?;
        }
        Ok(true)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::ondisk::proto::encode::{field_bytes, varint};

    /// A `.snap` file as etcd writes it, around `store_json`.
    pub fn snap_file(store_json: &str, index: u64, term: u64) -> Vec<u8> {
        let mut meta = field_bytes(1, &[]);
        meta.extend(varint(2 << 3));
        meta.extend(varint(index));
        meta.extend(varint(3 << 3));
        meta.extend(varint(term));
        let mut data = field_bytes(1, store_json.as_bytes());
        data.extend(field_bytes(2, &meta));
        let mut file = varint(1 << 3);
        file.extend(varint(u64::from(crc32c::crc32c(&data))));
        file.extend(field_bytes(2, &data));
        file
    }

    /// A v2 store as etcd 3.3 saves it (trimmed): one member, a cluster
    /// version, auth on, a hidden dir and a plain key.
    pub const STORE: &str = r#"{"Root":{"Path":"/","CreatedIndex":0,"ModifiedIndex":0,"ExpireTime":"0001-01-01T00:00:00Z","Value":"","Children":{"0":{"Path":"/0","CreatedIndex":0,"ModifiedIndex":0,"ExpireTime":"0001-01-01T00:00:00Z","Value":"","Children":{"members":{"Path":"/0/members","CreatedIndex":1,"ModifiedIndex":1,"ExpireTime":"0001-01-01T00:00:00Z","Value":"","Children":{"8e9e05c52164694d":{"Path":"/0/members/8e9e05c52164694d","CreatedIndex":1,"ModifiedIndex":1,"ExpireTime":"0001-01-01T00:00:00Z","Value":"","Children":{"attributes":{"Path":"/0/members/8e9e05c52164694d/attributes","CreatedIndex":2,"ModifiedIndex":2,"ExpireTime":"0001-01-01T00:00:00Z","Value":"{\"name\":\"default\",\"clientURLs\":[\"http://localhost:2379\"]}","Children":null},"raftAttributes":{"Path":"/0/members/8e9e05c52164694d/raftAttributes","CreatedIndex":1,"ModifiedIndex":1,"ExpireTime":"0001-01-01T00:00:00Z","Value":"{\"peerURLs\":[\"http://localhost:2380\"]}","Children":null}}}}},"removed_members":{"Path":"/0/removed_members","CreatedIndex":0,"ModifiedIndex":0,"ExpireTime":"0001-01-01T00:00:00Z","Value":"","Children":{"1234":{"Path":"/0/removed_members/1234","CreatedIndex":9,"ModifiedIndex":9,"ExpireTime":"0001-01-01T00:00:00Z","Value":"","Children":null}}},"version":{"Path":"/0/version","CreatedIndex":3,"ModifiedIndex":3,"ExpireTime":"0001-01-01T00:00:00Z","Value":"3.3.0","Children":null}}},"1":{"Path":"/1","CreatedIndex":0,"ModifiedIndex":0,"ExpireTime":"0001-01-01T00:00:00Z","Value":"","Children":{"_hidden":{"Path":"/1/_hidden","CreatedIndex":5,"ModifiedIndex":5,"ExpireTime":"0001-01-01T00:00:00Z","Value":"","Children":{"k":{"Path":"/1/_hidden/k","CreatedIndex":5,"ModifiedIndex":5,"ExpireTime":"0001-01-01T00:00:00Z","Value":"v","Children":null}}},"plain":{"Path":"/1/plain","CreatedIndex":4,"ModifiedIndex":4,"ExpireTime":"0001-01-01T00:00:00Z","Value":"x","Children":null}}},"2":{"Path":"/2","CreatedIndex":0,"ModifiedIndex":0,"ExpireTime":"0001-01-01T00:00:00Z","Value":"","Children":{"enabled":{"Path":"/2/enabled","CreatedIndex":6,"ModifiedIndex":7,"ExpireTime":"0001-01-01T00:00:00Z","Value":"true","Children":null}}}}},"WatcherHub":{"EventHistory":{"Queue":{"Events":[null],"Size":0,"Front":0,"Back":0,"Capacity":1000},"StartIndex":0,"LastIndex":0}},"CurrentIndex":9,"Stats":{"getsSuccess":0},"CurrentVersion":2}"#;

    #[test]
    fn reads_what_a_snapshot_store_holds() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("0000000000000002-0000000000000009.snap"),
            snap_file(STORE, 9, 2),
        )
        .unwrap();
        let newest = newest(dir.path(), &V2State::default()).unwrap();
        let snapshot = newest.snapshot.unwrap();
        assert_eq!(snapshot.index, 9);
        let v2 = snapshot.v2;
        assert_eq!(v2.cluster_version.as_deref(), Some("3.3.0"));
        assert_eq!(v2.v2_auth.as_deref(), Some("true"));
        let member = &v2.members[&0x8e9e05c52164694d];
        assert_eq!(member.name, "default");
        assert_eq!(member.peer_urls, ["http://localhost:2380"]);
        assert_eq!(member.client_urls, ["http://localhost:2379"]);
        assert!(v2.removed.contains(&0x1234));
        assert_eq!(v2.hidden.iter().collect::<Vec<_>>(), ["/_hidden"]);
    }

    #[test]
    fn broken_newer_files_fall_back_to_an_older_one() {
        let dir = tempfile::tempdir().unwrap();
        let good = snap_file(STORE, 9, 2);
        std::fs::write(
            dir.path().join("0000000000000002-0000000000000009.snap"),
            &good,
        )
        .unwrap();
        let mut flipped = snap_file(STORE, 20, 2);
        let middle = flipped.len() / 2;
        flipped[middle] ^= 0x01;
        std::fs::write(
            dir.path().join("0000000000000002-0000000000000014.snap"),
            &flipped,
        )
        .unwrap();
        std::fs::write(
            dir.path().join("0000000000000002-0000000000000015.snap"),
            b"",
        )
        .unwrap();
        std::fs::write(
            dir.path().join("0000000000000002-0000000000000016.snap"),
            &good[..good.len() - 3],
        )
        .unwrap();
        let newest = newest(dir.path(), &V2State::default()).unwrap();
        assert_eq!(newest.snapshot.unwrap().index, 9);
        assert_eq!(newest.skipped.len(), 3, "{:?}", newest.skipped);
    }

    #[test]
    fn every_truncation_and_bit_flip_is_handled() {
        let good = snap_file(STORE, 9, 2);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("0000000000000002-0000000000000009.snap");
        for cut in 0..good.len() {
            std::fs::write(&path, &good[..cut]).unwrap();
            let newest = newest(dir.path(), &V2State::default()).unwrap();
            assert!(newest.snapshot.is_none(), "cut at {cut} was accepted");
        }
        for at in (0..good.len()).step_by(7) {
            let mut bad = good.clone();
            bad[at] ^= 0x40;
            std::fs::write(&path, &bad).unwrap();
            // Either skipped as broken, or (a flip the checksum cannot
            // see, in the framing) read: never a panic.
            let _ = newest(dir.path(), &V2State::default());
        }
    }

    #[test]
    fn an_intact_store_that_is_not_json_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("0000000000000002-0000000000000009.snap"),
            snap_file("{\"Root\": 5}", 9, 2),
        )
        .unwrap();
        let err = newest(dir.path(), &V2State::default()).unwrap_err();
        assert!(matches!(err, OnDiskError::SnapUnreadable { .. }), "{err}");
    }
}
