//! This module owns etcd's write-ahead log as files on disk: which segment
//! files make up the log (`<seq>-<index>.wal`, from the one holding the
//! snapshot's index on), and a streaming decoder of their records (frame,
//! `walpb.Record`, the CRC-32C chain) that hands each record to a visitor
//! and keeps none. Its rules follow etcd's `wal/decoder.go` (v3.3–v3.5):
//! a zero frame length is the preallocated end of a segment, and a record
//! cut short or failing its checksum in the last segment is a torn write
//! (etcd repairs it by truncation) when the record runs past the end of
//! the file or one of its 512-byte sectors is all zeros; anywhere else it
//! is damage that etcd refuses too.

use std::fs::File;
use std::io::{self, BufReader, Read};
use std::path::{Path, PathBuf};

use super::proto::{self, Fields, ProtoError};
use super::OnDiskError;

/// `walpb.Record.type` values (etcd `wal/wal.go`).
const METADATA_TYPE: u64 = 1;
const ENTRY_TYPE: u64 = 2;
const STATE_TYPE: u64 = 3;
const CRC_TYPE: u64 = 4;
const SNAPSHOT_TYPE: u64 = 5;

/// The frame header: a little-endian u64 whose low 56 bits are the record
/// length and whose top byte, when its high bit is set, holds the padding.
const FRAME_BYTES: u64 = 8;

/// etcd's torn-write detection works on 512-byte sectors.
const SECTOR_BYTES: u64 = 512;

/// Read buffer of one segment.
const READ_BUFFER_BYTES: usize = 1 << 20;

/// One segment file of the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Segment {
    /// The file.
    pub path: PathBuf,
    /// Its sequence number (consecutive across the log).
    pub seq: u64,
    /// The raft index its first entry follows.
    pub index: u64,
}

/// A raft log entry (`raftpb.Entry`).
#[derive(Debug, Clone, Copy)]
pub struct Entry<'a> {
    /// `EntryNormal` (0), `EntryConfChange` (1) or `EntryConfChangeV2` (2).
    pub kind: u64,
    /// Raft term.
    pub term: u64,
    /// Raft index.
    pub index: u64,
    /// The proposal.
    pub data: &'a [u8],
}

/// `raftpb.EntryNormal`.
pub const ENTRY_NORMAL: u64 = 0;
/// `raftpb.EntryConfChange`.
pub const ENTRY_CONF_CHANGE: u64 = 1;

/// One decoded record, borrowed from the decoder's buffer.
#[derive(Debug, Clone, Copy)]
pub enum Record<'a> {
    /// `etcdserverpb.Metadata`, at the head of every segment.
    Metadata {
        /// `NodeID`: this member's id.
        node_id: u64,
        /// `ClusterID`.
        cluster_id: u64,
    },
    /// A log entry.
    Entry(Entry<'a>),
    /// `raftpb.HardState`: its commit index.
    HardState {
        /// Highest index known committed.
        commit: u64,
    },
    /// `walpb.Snapshot`: a snapshot was taken at this raft index (etcd
    /// 3.7 starts its replay after the newest such record).
    Snapshot {
        /// The snapshot's raft index.
        index: u64,
    },
}

/// How the log ended.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WalEnd {
    /// Records decoded.
    pub records: u64,
    /// Where a torn write in the last segment was found (file, byte
    /// offset, why); the records before it were all decoded.
    pub torn: Option<(PathBuf, u64, String)>,
}

/// Parses `<16 hex seq>-<16 hex index>.wal`.
fn parse_name(name: &str) -> Option<(u64, u64)> {
    let stem = name.strip_suffix(".wal")?;
    let (seq, index) = stem.split_once('-')?;
    if seq.len() != 16 || index.len() != 16 {
        return None;
    }
    Some((
        u64::from_str_radix(seq, 16).ok()?,
        u64::from_str_radix(index, 16).ok()?,
    ))
}

/// The segments of the log in `dir` that etcd reads when its snapshot is
/// at `snap_index`: from the last segment whose first index is at most
/// `snap_index` on (etcd's `searchIndex`), checked to be consecutive.
/// Other files (`.tmp` leftovers) are ignored as etcd does. An empty or
/// missing dir gives no segments.
pub fn segments(dir: &Path, snap_index: u64) -> Result<Vec<Segment>, OnDiskError> {
    let mut all: Vec<Segment> = super::file_names(dir)?
        .into_iter()
        .filter_map(|name| {
            parse_name(&name).map(|(seq, index)| Segment {
                path: dir.join(&name),
                seq,
                index,
            })
        })
        .collect();
    // etcd sorts by name; with fixed-width hex that is (seq, index).
    all.sort_by_key(|s| (s.seq, s.index));
    if all.is_empty() {
        return Ok(all);
    }
    let Some(start) = all.iter().rposition(|s| s.index <= snap_index) else {
        return Err(OnDiskError::WalSequence {
            dir: dir.to_path_buf(),
            what: format!(
                "the oldest segment ({}) begins after the snapshot's index {snap_index}, so the entries between are gone",
                all[0].path.display()
            ),
        });
    };
    let selected = all.split_off(start);
    for pair in selected.windows(2) {
        if pair[1].seq != pair[0].seq.wrapping_add(1) {
            return Err(OnDiskError::WalSequence {
                dir: dir.to_path_buf(),
                what: format!(
                    "{} is followed by {} (a segment is missing)",
                    pair[0].path.display(),
                    pair[1].path.display()
                ),
            });
        }
    }
    Ok(selected)
}

/// Decodes every record of `segments` in order, handing each to `visit`.
/// Stops at the first error `visit` returns. Memory: one record at a time.
pub fn read(
    segments: &[Segment],
    mut visit: impl FnMut(Record<'_>) -> Result<(), OnDiskError>,
) -> Result<WalEnd, OnDiskError> {
    let mut end = WalEnd::default();
    let mut crc: u32 = 0;
    let mut metadata: Option<Vec<u8>> = None;
    let mut buf = Vec::new();
    for (i, segment) in segments.iter().enumerate() {
        let last = i + 1 == segments.len();
        let mut decoder = SegmentDecoder::open(&segment.path, last)?;
        loop {
            let frame = match decoder.next_frame(&mut buf)? {
                Frame::Record(len) => &buf[..len],
                Frame::End => break,
                Frame::Torn(offset, why) => {
                    end.torn = Some((segment.path.clone(), offset, why));
                    return Ok(end);
                }
            };
            let record = match parse_record(frame) {
                Ok(record) => record,
                Err(err) => {
                    end.torn = Some(decoder.torn_or_damaged(&buf, format!("record: {err}"))?);
                    return Ok(end);
                }
            };
            if record.kind == CRC_TYPE {
                // The head of a segment restates the chain's CRC so far;
                // 0 is the start of a log (or of our reading).
                if crc != 0 && record.crc != crc {
                    return Err(decoder.damaged(format!(
                        "the segment's CRC record says {:#x}, the chain so far is {crc:#x}",
                        record.crc
                    )));
                }
                crc = record.crc;
            } else {
                let next = crc32c::crc32c_append(crc, record.data);
                if next != record.crc {
                    let why = format!(
                        "checksum mismatch (record says {:#x}, data gives {next:#x})",
                        record.crc
                    );
                    end.torn = Some(decoder.torn_or_damaged(&buf, why)?);
                    return Ok(end);
                }
                crc = next;
            }
            end.records += 1;
            let decoded = decode(record.kind, record.data).map_err(|what| decoder.damaged(what))?;
            if let Some(Record::Metadata { .. }) = decoded {
                match &metadata {
                    Some(seen) if seen[..] != *record.data => return Err(decoder.damaged(
                        "its metadata (member and cluster id) differs from the earlier segments'"
                            .to_string(),
                    )),
                    _ => metadata = Some(record.data.to_vec()),
                }
            }
            if let Some(decoded) = decoded {
                visit(decoded)?;
            }
        }
    }
    Ok(end)
}

/// A `walpb.Record` borrowed from its frame.
struct RawRecord<'a> {
    kind: u64,
    crc: u32,
    data: &'a [u8],
}

fn parse_record(frame: &[u8]) -> Result<RawRecord<'_>, ProtoError> {
    let mut record = RawRecord {
        kind: 0,
        crc: 0,
        data: &[],
    };
    for field in Fields::new(frame) {
        match field? {
            (1, proto::Value::Varint(v)) => record.kind = v,
            // uint32 on the wire as a varint; the high bits are dropped as
            // Go's decoder does.
            (2, proto::Value::Varint(v)) => record.crc = v as u32,
            (3, proto::Value::Bytes(b)) => record.data = b,
            _ => {}
        }
    }
    Ok(record)
}

/// The record as etcd's reader sees it; `None` for the CRC records.
fn decode(kind: u64, data: &[u8]) -> Result<Option<Record<'_>>, String> {
    let bad = |what: &str, err: ProtoError| format!("undecodable {what}: {err}");
    Ok(Some(match kind {
        METADATA_TYPE => Record::Metadata {
            node_id: proto::varint_field(data, 1).map_err(|e| bad("metadata", e))?,
            cluster_id: proto::varint_field(data, 2).map_err(|e| bad("metadata", e))?,
        },
        ENTRY_TYPE => {
            let mut entry = Entry {
                kind: 0,
                term: 0,
                index: 0,
                data: &[],
            };
            for field in Fields::new(data) {
                match field.map_err(|e| bad("entry", e))? {
                    (1, proto::Value::Varint(v)) => entry.kind = v,
                    (2, proto::Value::Varint(v)) => entry.term = v,
                    (3, proto::Value::Varint(v)) => entry.index = v,
                    (4, proto::Value::Bytes(b)) => entry.data = b,
                    _ => {}
                }
            }
            Record::Entry(entry)
        }
        STATE_TYPE => Record::HardState {
            commit: proto::varint_field(data, 3).map_err(|e| bad("hard state", e))?,
        },
        SNAPSHOT_TYPE => Record::Snapshot {
            index: proto::varint_field(data, 1).map_err(|e| bad("snapshot record", e))?,
        },
        CRC_TYPE => return Ok(None),
        other => return Err(format!("unexpected record type {other}")),
    }))
}

/// What the next frame is.
enum Frame {
    /// A record is in the buffer: its first this many bytes (the rest is
    /// padding, kept for the torn-write check).
    Record(usize),
    /// The end of this segment (end of file, or preallocated zeros).
    End,
    /// A torn write at this offset in the last segment, and why.
    Torn(u64, String),
}

/// Reads the frames of one segment.
struct SegmentDecoder<'p> {
    path: &'p Path,
    reader: BufReader<File>,
    len: u64,
    /// Offset of the next frame.
    offset: u64,
    /// Offset of the frame just read.
    frame_start: u64,
    last: bool,
}

impl<'p> SegmentDecoder<'p> {
    fn open(path: &'p Path, last: bool) -> Result<Self, OnDiskError> {
        let io = |source| OnDiskError::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = File::open(path).map_err(io)?;
        let len = file.metadata().map_err(io)?.len();
        Ok(SegmentDecoder {
            path,
            reader: BufReader::with_capacity(READ_BUFFER_BYTES, file),
            len,
            offset: 0,
            frame_start: 0,
            last,
        })
    }

    fn damaged(&self, what: String) -> OnDiskError {
        OnDiskError::WalDamaged {
            path: self.path.to_path_buf(),
            offset: self.frame_start,
            what,
        }
    }

    /// A record cut short: a torn write in the last segment, damage in
    /// any other (etcd only ever appends to the last).
    fn cut_short(&self, why: String) -> Result<Frame, OnDiskError> {
        if self.last {
            Ok(Frame::Torn(self.frame_start, why))
        } else {
            Err(self.damaged(why))
        }
    }

    /// For a record that does not decode or fails its checksum: where and
    /// why, if etcd would call it a torn write (last segment, a zeroed
    /// sector in the frame with its padding), else the damage as an error.
    fn torn_or_damaged(
        &self,
        frame: &[u8],
        why: String,
    ) -> Result<(PathBuf, u64, String), OnDiskError> {
        if self.last && has_zero_sector(frame, self.frame_start + FRAME_BYTES) {
            Ok((
                self.path.to_path_buf(),
                self.frame_start,
                format!("{why}, with a zeroed sector"),
            ))
        } else {
            Err(self.damaged(why))
        }
    }

    /// Reads the next frame (record and padding) into `buf`.
    fn next_frame(&mut self, buf: &mut Vec<u8>) -> Result<Frame, OnDiskError> {
        self.frame_start = self.offset;
        let mut header = [0u8; FRAME_BYTES as usize];
        let got = read_full(&mut self.reader, &mut header).map_err(|source| OnDiskError::Io {
            path: self.path.to_path_buf(),
            source,
        })?;
        if got == 0 {
            return Ok(Frame::End);
        }
        if got < header.len() {
            return self.cut_short(format!(
                "the file ends inside a frame header ({got} of 8 bytes)"
            ));
        }
        let field = u64::from_le_bytes(header);
        if field == 0 {
            return Ok(Frame::End);
        }
        let record_bytes = field & !(0xffu64 << 56);
        let pad_bytes = if field >> 63 == 1 {
            (field >> 56) & 7
        } else {
            0
        };
        let available = self.len.saturating_sub(self.offset + FRAME_BYTES);
        // Bounded by the file: a garbage length never becomes an
        // allocation larger than what is there to read.
        if record_bytes.saturating_add(pad_bytes) > available {
            return self.cut_short(format!(
                "a record of {record_bytes} bytes runs past the end of the file ({available} bytes left)"
            ));
        }
        let total = (record_bytes + pad_bytes) as usize;
        buf.clear();
        buf.resize(total, 0);
        let got = read_full(&mut self.reader, buf).map_err(|source| OnDiskError::Io {
            path: self.path.to_path_buf(),
            source,
        })?;
        if got < total {
            // The file shrank while we read it.
            return self.cut_short(format!(
                "the file ends inside a record ({got} of {total} bytes)"
            ));
        }
        self.offset += FRAME_BYTES + record_bytes + pad_bytes;
        Ok(Frame::Record(record_bytes as usize))
    }
}

/// etcd's `isTornEntry`: splits the frame's bytes (which start at file
/// offset `file_offset`) on 512-byte sector boundaries; any all-zero
/// chunk means the write was torn.
fn has_zero_sector(data: &[u8], file_offset: u64) -> bool {
    let mut offset = file_offset;
    let mut rest = data;
    while !rest.is_empty() {
        let room = (SECTOR_BYTES - offset % SECTOR_BYTES) as usize;
        let (chunk, tail) = rest.split_at(room.min(rest.len()));
        if chunk.iter().all(|b| *b == 0) {
            return true;
        }
        offset += chunk.len() as u64;
        rest = tail;
    }
    false
}

/// Reads until `buf` is full or the file ends; returns the bytes read.
fn read_full(reader: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match reader.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
            Err(err) => return Err(err),
        }
    }
    Ok(got)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::ondisk::proto::encode::{field_bytes, field_varint};

    /// An entry record's data (`raftpb.Entry`).
    pub fn entry_data(index: u64, payload: &[u8]) -> Vec<u8> {
        let mut out = field_varint(1, 0);
        out.extend(field_varint(2, 1));
        out.extend(field_varint(3, index));
        out.extend(field_bytes(4, payload));
        out
    }

    /// Frames `records` (type, data) as etcd's encoder does, the chain
    /// starting at `crc` with a CRC record; returns the bytes and the
    /// chain's CRC after them.
    pub fn segment(records: &[(u64, Vec<u8>)], mut crc: u32) -> (Vec<u8>, u32) {
        let mut out = Vec::new();
        let mut all = vec![(CRC_TYPE, Vec::new())];
        all.extend(records.iter().cloned());
        for (kind, data) in all {
            let record_crc = if kind == CRC_TYPE {
                crc
            } else {
                crc = crc32c::crc32c_append(crc, &data);
                crc
            };
            let mut record = field_varint(1, kind);
            record.extend(field_varint(2, u64::from(record_crc)));
            if !data.is_empty() || kind != CRC_TYPE {
                record.extend(field_bytes(3, &data));
            }
            let pad = (8 - record.len() % 8) % 8;
            let mut len = record.len() as u64;
            if pad != 0 {
                len |= (0x80 | pad as u64) << 56;
            }
            out.extend(len.to_le_bytes());
            out.extend(&record);
            out.extend(std::iter::repeat_n(0u8, pad));
        }
        (out, crc)
    }

    fn metadata(node: u64, cluster: u64) -> (u64, Vec<u8>) {
        let mut data = field_varint(1, node);
        data.extend(field_varint(2, cluster));
        (METADATA_TYPE, data)
    }

    /// Two segments: metadata and entries 1–3 with a hard state, then
    /// metadata and entries 4–5; the second preallocated with zeros.
    fn two_segments(dir: &Path) -> Vec<u8> {
        let (first, crc) = segment(
            &[
                metadata(7, 9),
                (ENTRY_TYPE, entry_data(1, b"a")),
                (ENTRY_TYPE, entry_data(2, b"bb")),
                (ENTRY_TYPE, entry_data(3, b"ccc")),
                (STATE_TYPE, field_varint(3, 3)),
            ],
            0,
        );
        let (mut second, _) = segment(
            &[
                metadata(7, 9),
                (ENTRY_TYPE, entry_data(4, &[b'd'; 700])),
                (ENTRY_TYPE, entry_data(5, b"e")),
                (STATE_TYPE, field_varint(3, 5)),
            ],
            crc,
        );
        std::fs::write(dir.join("0000000000000000-0000000000000000.wal"), first).unwrap();
        let written = second.clone();
        second.resize(second.len() + 8192, 0);
        std::fs::write(dir.join("0000000000000001-0000000000000004.wal"), second).unwrap();
        written
    }

    /// Entry indexes, (member, cluster) ids, and how the log ended.
    type Read = (Vec<u64>, Option<(u64, u64)>, WalEnd);

    fn read_dir(dir: &Path, snap_index: u64) -> Result<Read, OnDiskError> {
        let segments = segments(dir, snap_index)?;
        let mut indexes = Vec::new();
        let mut ids = None;
        let end = read(&segments, |record| {
            match record {
                Record::Entry(entry) => indexes.push(entry.index),
                Record::Metadata {
                    node_id,
                    cluster_id,
                } => ids = Some((node_id, cluster_id)),
                _ => {}
            }
            Ok(())
        })?;
        Ok((indexes, ids, end))
    }

    #[test]
    fn reads_records_across_segments_and_stops_at_preallocated_zeros() {
        let dir = tempfile::tempdir().unwrap();
        two_segments(dir.path());
        std::fs::write(
            dir.path().join("0000000000000001-0000000000000004.wal.tmp"),
            b"x",
        )
        .unwrap();
        let (indexes, ids, end) = read_dir(dir.path(), 0).unwrap();
        assert_eq!(indexes, [1, 2, 3, 4, 5]);
        assert_eq!(ids, Some((7, 9)));
        assert_eq!(end.torn, None);
        // A snapshot at 4 starts at the second segment, as etcd does.
        let (indexes, _, _) = read_dir(dir.path(), 4).unwrap();
        assert_eq!(indexes, [4, 5]);
    }

    #[test]
    fn every_truncation_of_the_last_segment_is_a_torn_tail() {
        let dir = tempfile::tempdir().unwrap();
        let written = two_segments(dir.path());
        let last = dir.path().join("0000000000000001-0000000000000004.wal");
        for cut in 0..written.len() {
            std::fs::write(&last, &written[..cut]).unwrap();
            let (indexes, _, end) =
                read_dir(dir.path(), 0).unwrap_or_else(|err| panic!("cut at {cut}: {err}"));
            assert!(indexes.starts_with(&[1, 2, 3]), "cut at {cut}: {indexes:?}");
            if cut % 8 != 0 {
                assert!(end.torn.is_some(), "cut at {cut} inside a frame is torn");
            }
        }
    }

    #[test]
    fn a_zeroed_sector_in_the_last_record_is_torn_a_flipped_bit_is_damage() {
        let dir = tempfile::tempdir().unwrap();
        let written = two_segments(dir.path());
        let last = dir.path().join("0000000000000001-0000000000000004.wal");
        // The 700-byte entry spans a sector boundary: zero its second half.
        let mut torn = written.clone();
        let start = torn.windows(8).position(|w| w == [b'd'; 8]).unwrap();
        let boundary = (start / 512 + 1) * 512;
        torn[boundary..boundary + 512.min(written.len() - boundary)].fill(0);
        std::fs::write(&last, &torn).unwrap();
        let (indexes, _, end) = read_dir(dir.path(), 0).unwrap();
        assert_eq!(indexes, [1, 2, 3]);
        assert!(end.torn.is_some());

        let mut flipped = written.clone();
        flipped[start + 10] ^= 0x01;
        std::fs::write(&last, &flipped).unwrap();
        let err = read_dir(dir.path(), 0).unwrap_err();
        assert!(matches!(err, OnDiskError::WalDamaged { .. }), "{err}");
    }

    #[test]
    fn damage_before_the_last_segment_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        two_segments(dir.path());
        let first = dir.path().join("0000000000000000-0000000000000000.wal");
        let good = std::fs::read(&first).unwrap();
        for cut in [9, good.len() / 2, good.len() - 1] {
            std::fs::write(&first, &good[..cut]).unwrap();
            let err = read_dir(dir.path(), 0).unwrap_err();
            assert!(
                matches!(err, OnDiskError::WalDamaged { .. }),
                "cut {cut}: {err}"
            );
        }
        let mut huge = good.clone();
        huge[..8].copy_from_slice(&(u64::MAX >> 8).to_le_bytes());
        std::fs::write(&first, &huge).unwrap();
        assert!(read_dir(dir.path(), 0).is_err());
    }

    #[test]
    fn a_missing_segment_or_a_log_past_the_snapshot_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        two_segments(dir.path());
        std::fs::rename(
            dir.path().join("0000000000000001-0000000000000004.wal"),
            dir.path().join("0000000000000002-0000000000000004.wal"),
        )
        .unwrap();
        assert!(matches!(
            read_dir(dir.path(), 0),
            Err(OnDiskError::WalSequence { .. })
        ));
        std::fs::remove_file(dir.path().join("0000000000000000-0000000000000000.wal")).unwrap();
        assert!(matches!(
            read_dir(dir.path(), 0),
            Err(OnDiskError::WalSequence { .. })
        ));
    }

    #[test]
    fn garbage_segments_never_panic() {
        let dir = tempfile::tempdir().unwrap();
        let written = two_segments(dir.path());
        let last = dir.path().join("0000000000000001-0000000000000004.wal");
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        for round in 0..500 {
            let mut bad = written.clone();
            for _ in 0..(1 + round % 5) {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                let at = (seed as usize) % bad.len();
                bad[at] = (seed >> 40) as u8;
            }
            std::fs::write(&last, &bad).unwrap();
            let _ = read_dir(dir.path(), 0);
        }
    }
}
