//! The Protocol Buffers wire format, as far as the CRI messages gpuctl sends and reads need
//! it: varints, strings, nested messages and `map<string, string>` entries. Field numbers are
//! those of kubernetes/cri-api's `pkg/apis/runtime/v1/api.proto`.

use std::collections::BTreeMap;

/// A message being written, field by field. Proto3 leaves defaults (0, "") out; nested
/// messages are always written, since their presence can matter (a filter, a config).
#[derive(Debug, Default, Clone)]
pub struct Writer {
    buf: Vec<u8>,
}

impl Writer {
    pub fn new() -> Writer {
        Writer::default()
    }

    /// A `string` (or `bytes`) field.
    pub fn string(mut self, field: u32, value: &str) -> Writer {
        if !value.is_empty() {
            self.bytes_field(field, value.as_bytes());
        }
        self
    }

    /// Each value of a `repeated string` field.
    pub fn strings(mut self, field: u32, values: &[&str]) -> Writer {
        for value in values {
            self.bytes_field(field, value.as_bytes());
        }
        self
    }

    /// A varint field: `uint32`, `uint64`, `int64` (non-negative), `bool`, an enum.
    pub fn uint(mut self, field: u32, value: u64) -> Writer {
        if value != 0 {
            varint(&mut self.buf, u64::from(field) << 3);
            varint(&mut self.buf, value);
        }
        self
    }

    /// A nested message.
    pub fn message(mut self, field: u32, inner: Writer) -> Writer {
        self.bytes_field(field, &inner.buf);
        self
    }

    /// A `map<string, string>`: one entry message (key 1, value 2) a pair.
    pub fn map(mut self, field: u32, entries: &[(&str, &str)]) -> Writer {
        for (key, value) in entries {
            let entry = Writer::new().string(1, key).string(2, value);
            self.bytes_field(field, &entry.buf);
        }
        self
    }

    pub fn into_bytes(self) -> Vec<u8> {
        self.buf
    }

    fn bytes_field(&mut self, field: u32, bytes: &[u8]) {
        varint(&mut self.buf, (u64::from(field) << 3) | 2);
        varint(&mut self.buf, bytes.len() as u64);
        self.buf.extend_from_slice(bytes);
    }
}

fn varint(buf: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        buf.push((value as u8) | 0x80);
        value >>= 7;
    }
    buf.push(value as u8);
}

/// One field of a message as read: its number and value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Value<'a> {
    Varint(u64),
    Bytes(&'a [u8]),
    /// A fixed 32- or 64-bit value; no CRI field gpuctl reads has one.
    Fixed,
}

/// A malformed message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Malformed(pub &'static str);

/// The fields of a message, in order; an error ends the iteration.
pub fn fields(mut buf: &[u8]) -> impl Iterator<Item = Result<(u32, Value<'_>), Malformed>> {
    std::iter::from_fn(move || {
        if buf.is_empty() {
            return None;
        }
        let field = next_field(&mut buf);
        if field.is_err() {
            buf = &[];
        }
        Some(field)
    })
}

fn next_field<'a>(buf: &mut &'a [u8]) -> Result<(u32, Value<'a>), Malformed> {
    let key = read_varint(buf)?;
    let number = u32::try_from(key >> 3).map_err(|_| Malformed("field number too large"))?;
    let value = match key & 7 {
        0 => Value::Varint(read_varint(buf)?),
        1 => {
            *buf = buf.get(8..).ok_or(Malformed("truncated fixed64"))?;
            Value::Fixed
        }
        2 => {
            let len = usize::try_from(read_varint(buf)?).map_err(|_| Malformed("length"))?;
            if len > buf.len() {
                return Err(Malformed("truncated length-delimited field"));
            }
            let (bytes, rest) = buf.split_at(len);
            *buf = rest;
            Value::Bytes(bytes)
        }
        5 => {
            *buf = buf.get(4..).ok_or(Malformed("truncated fixed32"))?;
            Value::Fixed
        }
        _ => return Err(Malformed("unknown wire type")),
    };
    Ok((number, value))
}

fn read_varint(buf: &mut &[u8]) -> Result<u64, Malformed> {
    let mut value = 0u64;
    for (i, byte) in buf.iter().enumerate().take(10) {
        value |= u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            *buf = &buf[i + 1..];
            return Ok(value);
        }
    }
    Err(Malformed("truncated varint"))
}

/// The text of a `string` field (invalid UTF-8 replaced: names are shown, never parsed).
pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// One entry of a `map<string, string>` field, added to `map`.
pub fn map_entry(bytes: &[u8], map: &mut BTreeMap<String, String>) -> Result<(), Malformed> {
    let (mut key, mut value) = (String::new(), String::new());
    for field in fields(bytes) {
        match field? {
            (1, Value::Bytes(b)) => key = text(b),
            (2, Value::Bytes(b)) => value = text(b),
            _ => {}
        }
    }
    map.insert(key, value);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_written_message_reads_back() {
        let inner = Writer::new().string(1, "trainer-0").uint(4, 3);
        let bytes = Writer::new()
            .string(1, "id")
            .message(2, inner)
            .uint(3, 300)
            .map(7, &[("io.kubernetes.pod.name", "trainer-0")])
            .into_bytes();
        let read: Vec<_> = fields(&bytes).collect::<Result<_, _>>().unwrap();
        assert_eq!(read[0], (1, Value::Bytes(b"id")));
        assert_eq!(read[2], (3, Value::Varint(300)));
        let Value::Bytes(nested) = read[1].1 else {
            panic!("not a message")
        };
        let nested: Vec<_> = fields(nested).collect::<Result<_, _>>().unwrap();
        assert_eq!(
            nested,
            [(1, Value::Bytes(b"trainer-0")), (4, Value::Varint(3))]
        );
        let Value::Bytes(entry) = read[3].1 else {
            panic!("not an entry")
        };
        let mut map = BTreeMap::new();
        map_entry(entry, &mut map).unwrap();
        assert_eq!(map["io.kubernetes.pod.name"], "trainer-0");
    }

    #[test]
    fn defaults_are_left_out_and_messages_kept() {
        let bytes = Writer::new()
            .string(1, "")
            .uint(2, 0)
            .message(3, Writer::new())
            .into_bytes();
        assert_eq!(bytes, [3 << 3 | 2, 0]);
    }

    #[test]
    fn truncated_input_is_an_error_not_a_panic() {
        for bad in [&[0x0a, 5, b'a'][..], &[0x08, 0x80], &[0x0f], &[0x09, 1, 2]] {
            assert!(fields(bad).any(|f| f.is_err()), "{bad:?}");
        }
        // Fixed-width fields are skipped, not misread.
        let mut bytes = vec![0x0d, 1, 2, 3, 4];
        bytes.extend(Writer::new().string(2, "x").into_bytes());
        let read: Vec<_> = fields(&bytes).collect::<Result<_, _>>().unwrap();
        assert_eq!(read, [(1, Value::Fixed), (2, Value::Bytes(b"x"))]);
    }
}
