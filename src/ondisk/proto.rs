//! This module owns the protobuf wire format as far as etcd's files need
//! it: an iterator over the fields of one message (varint, fixed64,
//! length-delimited, fixed32) that borrows from the buffer and never
//! allocates. etcd's messages are few and small, so they are read field by
//! field where they are used, without generated code.

/// A field's payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Value<'a> {
    /// Wire type 0: ints, bools, enums.
    Varint(u64),
    /// Wire type 1.
    Fixed64(u64),
    /// Wire type 2: bytes, strings, nested messages, packed repeats.
    Bytes(&'a [u8]),
    /// Wire type 5.
    Fixed32(u32),
}

impl<'a> Value<'a> {
    /// The integer of a varint field (`None` for other wire types).
    pub fn varint(self) -> Option<u64> {
        match self {
            Value::Varint(v) => Some(v),
            _ => None,
        }
    }

    /// The bytes of a length-delimited field (`None` for other wire types).
    pub fn bytes(self) -> Option<&'a [u8]> {
        match self {
            Value::Bytes(b) => Some(b),
            _ => None,
        }
    }
}

/// Why a message does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtoError {
    /// The buffer ends inside a field.
    #[error("message truncated at byte {0}")]
    Truncated(usize),
    /// A varint longer than 10 bytes, or one overflowing 64 bits.
    #[error("malformed varint at byte {0}")]
    BadVarint(usize),
    /// Groups (wire types 3 and 4, unused by etcd) or an unknown type.
    #[error("unsupported wire type {wire_type} at byte {at}")]
    WireType {
        /// The wire type.
        wire_type: u8,
        /// Where.
        at: usize,
    },
    /// Field number 0 is never valid.
    #[error("field number 0 at byte {0}")]
    FieldZero(usize),
}

/// Reads a varint at `*pos`, advancing it.
pub fn read_varint(buf: &[u8], pos: &mut usize) -> Result<u64, ProtoError> {
    let start = *pos;
    let mut value: u64 = 0;
    for shift in (0..70).step_by(7) {
        let Some(&byte) = buf.get(*pos) else {
            return Err(ProtoError::Truncated(start));
        };
        *pos += 1;
        // The tenth byte may only carry the 64th bit.
        if shift == 63 && byte > 1 {
            return Err(ProtoError::BadVarint(start));
        }
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Ok(value);
        }
    }
    Err(ProtoError::BadVarint(start))
}

/// The fields of one message, in the order they were written. Yields
/// `(field number, value)`; after an error it yields nothing more.
#[derive(Debug, Clone)]
pub struct Fields<'a> {
    buf: &'a [u8],
    pos: usize,
    failed: bool,
}

impl<'a> Fields<'a> {
    /// The fields of the message `buf`.
    pub fn new(buf: &'a [u8]) -> Self {
        Fields {
            buf,
            pos: 0,
            failed: false,
        }
    }

    fn next_field(&mut self) -> Result<(u64, Value<'a>), ProtoError> {
        let at = self.pos;
        let key = read_varint(self.buf, &mut self.pos)?;
        let number = key >> 3;
        if number == 0 {
            return Err(ProtoError::FieldZero(at));
        }
        let value = match key & 7 {
            0 => Value::Varint(read_varint(self.buf, &mut self.pos)?),
            1 => Value::Fixed64(u64::from_le_bytes(self.take::<8>(at)?)),
            2 => {
                let len = read_varint(self.buf, &mut self.pos)?;
                // Bounded by the buffer: a length past its end is an
                // error, never an allocation.
                let end = usize::try_from(len)
                    .ok()
                    .and_then(|len| self.pos.checked_add(len))
                    .filter(|end| *end <= self.buf.len())
                    .ok_or(ProtoError::Truncated(at))?;
                let bytes = &self.buf[self.pos..end];
                self.pos = end;
                Value::Bytes(bytes)
            }
            5 => Value::Fixed32(u32::from_le_bytes(self.take::<4>(at)?)),
            wire_type => {
                return Err(ProtoError::WireType {
                    wire_type: wire_type as u8,
                    at,
                })
            }
        };
        Ok((number, value))
    }

    fn take<const N: usize>(&mut self, at: usize) -> Result<[u8; N], ProtoError> {
        let end = self.pos + N;
        let bytes = self
            .buf
            .get(self.pos..end)
            .ok_or(ProtoError::Truncated(at))?;
        self.pos = end;
        let mut out = [0u8; N];
        out.copy_from_slice(bytes);
        Ok(out)
    }
}

impl<'a> Iterator for Fields<'a> {
    type Item = Result<(u64, Value<'a>), ProtoError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed || self.pos >= self.buf.len() {
            return None;
        }
        let field = self.next_field();
        self.failed = field.is_err();
        Some(field)
    }
}

/// Checks that `buf` is a well-formed message (every field parses).
pub fn is_message(buf: &[u8]) -> bool {
    Fields::new(buf).all(|field| field.is_ok())
}

/// The last value of varint field `number` (proto's "last one wins"), or
/// 0 when absent, as proto's default.
pub fn varint_field(buf: &[u8], number: u64) -> Result<u64, ProtoError> {
    let mut found = 0;
    for field in Fields::new(buf) {
        let (n, value) = field?;
        if n == number {
            if let Some(v) = value.varint() {
                found = v;
            }
        }
    }
    Ok(found)
}

/// The last value of length-delimited field `number`, if present.
pub fn bytes_field(buf: &[u8], number: u64) -> Result<Option<&[u8]>, ProtoError> {
    let mut found = None;
    for field in Fields::new(buf) {
        let (n, value) = field?;
        if n == number {
            if let Some(b) = value.bytes() {
                found = Some(b);
            }
        }
    }
    Ok(found)
}

/// Every value of repeated length-delimited field `number`, as UTF-8
/// (lossy: etcd writes UTF-8, and a name is reported, not compared).
pub fn strings_field(buf: &[u8], number: u64) -> Result<Vec<String>, ProtoError> {
    let mut found = Vec::new();
    for field in Fields::new(buf) {
        let (n, value) = field?;
        if n == number {
            if let Some(b) = value.bytes() {
                found.push(String::from_utf8_lossy(b).into_owned());
            }
        }
    }
    Ok(found)
}

/// The wire format written, for the tests that build WAL records, snapshots
/// and raft requests byte by byte (every reader's tests share it).
#[cfg(test)]
pub(crate) mod encode {
    /// Encodes a varint.
    pub fn varint(mut v: u64) -> Vec<u8> {
        let mut out = Vec::new();
        loop {
            let byte = (v & 0x7f) as u8;
            v >>= 7;
            if v == 0 {
                out.push(byte);
                return out;
            }
            out.push(byte | 0x80);
        }
    }

    /// A length-delimited field (wire type 2).
    pub fn field_bytes(number: u64, bytes: &[u8]) -> Vec<u8> {
        let mut out = varint(number << 3 | 2);
        out.extend(varint(bytes.len() as u64));
        out.extend_from_slice(bytes);
        out
    }

    /// A varint field (wire type 0).
    pub fn field_varint(number: u64, v: u64) -> Vec<u8> {
        let mut out = varint(number << 3);
        out.extend(varint(v));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::encode::varint;
    use super::*;

    #[test]
    fn varints_round_trip_at_their_edges() {
        for v in [0, 1, 127, 128, 300, u32::MAX as u64, u64::MAX - 1, u64::MAX] {
            let buf = varint(v);
            let mut pos = 0;
            assert_eq!(read_varint(&buf, &mut pos), Ok(v));
            assert_eq!(pos, buf.len());
        }
    }

    #[test]
    fn overlong_and_truncated_varints_are_errors() {
        let mut pos = 0;
        assert_eq!(
            read_varint(&[0xff; 11], &mut pos),
            Err(ProtoError::BadVarint(0))
        );
        let mut pos = 0;
        // Ten bytes whose last one carries more than the 64th bit.
        let mut overflow = vec![0xff; 9];
        overflow.push(0x02);
        assert_eq!(
            read_varint(&overflow, &mut pos),
            Err(ProtoError::BadVarint(0))
        );
        let mut pos = 0;
        assert_eq!(
            read_varint(&[0x80, 0x80], &mut pos),
            Err(ProtoError::Truncated(0))
        );
    }

    #[test]
    fn fields_of_every_wire_type() {
        let mut msg = Vec::new();
        msg.extend(varint(1 << 3));
        msg.extend(varint(150));
        msg.extend(varint((2 << 3) | 1));
        msg.extend(7u64.to_le_bytes());
        msg.extend(varint((3 << 3) | 2));
        msg.extend(varint(3));
        msg.extend(b"abc");
        msg.extend(varint((4 << 3) | 5));
        msg.extend(9u32.to_le_bytes());
        msg.extend(varint((1300 << 3) | 2));
        msg.extend(varint(0));
        let fields: Vec<_> = Fields::new(&msg).collect::<Result<_, _>>().unwrap();
        assert_eq!(
            fields,
            vec![
                (1, Value::Varint(150)),
                (2, Value::Fixed64(7)),
                (3, Value::Bytes(b"abc")),
                (4, Value::Fixed32(9)),
                (1300, Value::Bytes(b"")),
            ]
        );
        assert_eq!(varint_field(&msg, 1), Ok(150));
        assert_eq!(varint_field(&msg, 99), Ok(0));
        assert_eq!(bytes_field(&msg, 3), Ok(Some(&b"abc"[..])));
    }

    #[test]
    fn every_truncation_and_garbage_is_an_error_not_a_panic() {
        let mut msg = Vec::new();
        msg.extend(varint((3 << 3) | 2));
        msg.extend(varint(5));
        msg.extend(b"hello");
        msg.extend(varint((2 << 3) | 1));
        msg.extend(1u64.to_le_bytes());
        // Byte 7 ends the first field: a cut there is a valid message.
        for cut in (1..msg.len()).filter(|cut| *cut != 7) {
            let result: Result<Vec<_>, _> = Fields::new(&msg[..cut]).collect();
            assert!(result.is_err(), "cut at {cut} parsed");
        }
        // A length that points far past the end.
        let mut huge = varint((3 << 3) | 2);
        huge.extend(varint(u64::MAX));
        assert!(!is_message(&huge));
        // Groups and field 0.
        assert!(!is_message(&[(1 << 3) | 3]));
        assert!(!is_message(&[0x00, 0x01]));
        // Every byte pattern of length 1 and 2 terminates.
        for a in 0..=255u8 {
            for b in 0..=255u8 {
                let _ = Fields::new(&[a, b]).count();
            }
        }
    }

    #[test]
    fn v2_method_names_are_not_messages() {
        // etcd tells a bare v2 Request from an InternalRaftRequest by
        // whether field 2 parses as a message: method names never do.
        for method in ["PUT", "POST", "DELETE", "QGET", "SYNC", "GET", "HEAD"] {
            assert!(!is_message(method.as_bytes()), "{method}");
        }
    }
}
