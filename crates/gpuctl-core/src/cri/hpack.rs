//! HPACK (RFC 7541), the header compression of HTTP/2: what a gRPC client needs. Requests
//! are encoded as literals without indexing and without Huffman coding (always valid, and
//! the few headers of a call are short); answers are decoded in full, since a server may use
//! the static and dynamic tables and Huffman coding as it likes (Go's gRPC server does).

use std::collections::VecDeque;

/// A header block that cannot be decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Malformed(pub &'static str);

/// Encodes `headers` as literal fields without indexing, new names (RFC 7541 6.2.2).
pub fn encode(headers: &[(&str, &str)]) -> Vec<u8> {
    let mut block = Vec::new();
    for (name, value) in headers {
        block.push(0);
        for text in [name, value] {
            integer(&mut block, 0, 7, text.len());
            block.extend_from_slice(text.as_bytes());
        }
    }
    block
}

fn integer(block: &mut Vec<u8>, first: u8, prefix_bits: u8, value: usize) {
    let max = (1usize << prefix_bits) - 1;
    if value < max {
        block.push(first | value as u8);
        return;
    }
    block.push(first | max as u8);
    let mut rest = value - max;
    while rest >= 0x80 {
        block.push((rest as u8 & 0x7f) | 0x80);
        rest >>= 7;
    }
    block.push(rest as u8);
}

/// The decoding side of one connection: its dynamic table lives as long as the connection.
#[derive(Debug)]
pub struct Decoder {
    table: VecDeque<(String, String)>,
    size: usize,
    max_size: usize,
}

/// The table size HTTP/2 starts with (SETTINGS_HEADER_TABLE_SIZE's default).
const DEFAULT_TABLE_SIZE: usize = 4096;

impl Default for Decoder {
    fn default() -> Decoder {
        Decoder {
            table: VecDeque::new(),
            size: 0,
            max_size: DEFAULT_TABLE_SIZE,
        }
    }
}

impl Decoder {
    /// The header fields of one complete header block.
    pub fn decode(&mut self, mut block: &[u8]) -> Result<Vec<(String, String)>, Malformed> {
        let mut fields = Vec::new();
        while let Some(&first) = block.first() {
            if first & 0x80 != 0 {
                let index = read_integer(&mut block, 7)?;
                fields.push(self.entry(index)?);
            } else if first & 0xc0 == 0x40 {
                let field = self.literal(&mut block, 6)?;
                self.insert(field.clone());
                fields.push(field);
            } else if first & 0xe0 == 0x20 {
                let size = read_integer(&mut block, 5)?;
                if size > DEFAULT_TABLE_SIZE {
                    return Err(Malformed("table size above the advertised limit"));
                }
                self.max_size = size;
                self.evict(0);
            } else {
                // Without indexing (0000) or never indexed (0001).
                fields.push(self.literal(&mut block, 4)?);
            }
        }
        Ok(fields)
    }

    fn literal(&self, block: &mut &[u8], prefix_bits: u8) -> Result<(String, String), Malformed> {
        let index = read_integer(block, prefix_bits)?;
        let name = match index {
            0 => read_string(block)?,
            _ => self.entry(index)?.0,
        };
        Ok((name, read_string(block)?))
    }

    fn entry(&self, index: usize) -> Result<(String, String), Malformed> {
        if index == 0 {
            return Err(Malformed("index 0"));
        }
        if let Some((name, value)) = STATIC_TABLE.get(index - 1) {
            return Ok((name.to_string(), value.to_string()));
        }
        self.table
            .get(index - 1 - STATIC_TABLE.len())
            .cloned()
            .ok_or(Malformed("index past the tables"))
    }

    fn insert(&mut self, field: (String, String)) {
        let size = field.0.len() + field.1.len() + 32;
        self.evict(size);
        if size <= self.max_size {
            self.size += size;
            self.table.push_front(field);
        }
    }

    /// Evicts the oldest entries until `incoming` more bytes fit.
    fn evict(&mut self, incoming: usize) {
        while self.size + incoming > self.max_size {
            let Some((name, value)) = self.table.pop_back() else {
                self.size = 0;
                return;
            };
            self.size -= name.len() + value.len() + 32;
        }
    }
}

fn read_integer(block: &mut &[u8], prefix_bits: u8) -> Result<usize, Malformed> {
    let (&first, mut rest) = block.split_first().ok_or(Malformed("truncated integer"))?;
    let max = (1usize << prefix_bits) - 1;
    let mut value = usize::from(first) & max;
    if value == max {
        let mut shift = 0;
        loop {
            let (&byte, after) = rest.split_first().ok_or(Malformed("truncated integer"))?;
            rest = after;
            if shift > 21 {
                return Err(Malformed("integer too large"));
            }
            value += usize::from(byte & 0x7f) << shift;
            shift += 7;
            if byte & 0x80 == 0 {
                break;
            }
        }
    }
    *block = rest;
    Ok(value)
}

fn read_string(block: &mut &[u8]) -> Result<String, Malformed> {
    let huffman = block.first().is_some_and(|b| b & 0x80 != 0);
    let len = read_integer(block, 7)?;
    if len > block.len() {
        return Err(Malformed("truncated string"));
    }
    let (bytes, rest) = block.split_at(len);
    *block = rest;
    let bytes = if huffman {
        huffman_decode(bytes)?
    } else {
        bytes.to_vec()
    };
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// Decodes Huffman-coded bytes (RFC 7541 5.2): at most 7 bits of padding, all ones.
fn huffman_decode(bytes: &[u8]) -> Result<Vec<u8>, Malformed> {
    let mut out = Vec::with_capacity(bytes.len() * 8 / 5);
    let (mut code, mut len) = (0u32, 0u8);
    for byte in bytes {
        for bit in (0..8).rev() {
            code = (code << 1) | u32::from((byte >> bit) & 1);
            len += 1;
            if len < 5 {
                continue;
            }
            if let Some(symbol) = HUFFMAN.iter().position(|&(c, l)| l == len && c == code) {
                out.push(symbol as u8);
                (code, len) = (0, 0);
            } else if len >= 30 {
                return Err(Malformed("invalid Huffman code"));
            }
        }
    }
    if len > 7 || code != (1u32 << len) - 1 {
        return Err(Malformed("invalid Huffman padding"));
    }
    Ok(out)
}

/// RFC 7541 Appendix A.
const STATIC_TABLE: [(&str, &str); 61] = [
    (":authority", ""),
    (":method", "GET"),
    (":method", "POST"),
    (":path", "/"),
    (":path", "/index.html"),
    (":scheme", "http"),
    (":scheme", "https"),
    (":status", "200"),
    (":status", "204"),
    (":status", "206"),
    (":status", "304"),
    (":status", "400"),
    (":status", "404"),
    (":status", "500"),
    ("accept-charset", ""),
    ("accept-encoding", "gzip, deflate"),
    ("accept-language", ""),
    ("accept-ranges", ""),
    ("accept", ""),
    ("access-control-allow-origin", ""),
    ("age", ""),
    ("allow", ""),
    ("authorization", ""),
    ("cache-control", ""),
    ("content-disposition", ""),
    ("content-encoding", ""),
    ("content-language", ""),
    ("content-length", ""),
    ("content-location", ""),
    ("content-range", ""),
    ("content-type", ""),
    ("cookie", ""),
    ("date", ""),
    ("etag", ""),
    ("expect", ""),
    ("expires", ""),
    ("from", ""),
    ("host", ""),
    ("if-match", ""),
    ("if-modified-since", ""),
    ("if-none-match", ""),
    ("if-range", ""),
    ("if-unmodified-since", ""),
    ("last-modified", ""),
    ("link", ""),
    ("location", ""),
    ("max-forwards", ""),
    ("proxy-authenticate", ""),
    ("proxy-authorization", ""),
    ("range", ""),
    ("referer", ""),
    ("refresh", ""),
    ("retry-after", ""),
    ("server", ""),
    ("set-cookie", ""),
    ("strict-transport-security", ""),
    ("transfer-encoding", ""),
    ("user-agent", ""),
    ("vary", ""),
    ("via", ""),
    ("www-authenticate", ""),
];

/// RFC 7541 Appendix B: each byte's code (right-aligned) and its length in bits.
#[rustfmt::skip]
const HUFFMAN: [(u32, u8); 256] = [
    (0x1ff8, 13), (0x7fffd8, 23), (0xfffffe2, 28), (0xfffffe3, 28), (0xfffffe4, 28), (0xfffffe5, 28), (0xfffffe6, 28), (0xfffffe7, 28),
    (0xfffffe8, 28), (0xffffea, 24), (0x3ffffffc, 30), (0xfffffe9, 28), (0xfffffea, 28), (0x3ffffffd, 30), (0xfffffeb, 28), (0xfffffec, 28),
    (0xfffffed, 28), (0xfffffee, 28), (0xfffffef, 28), (0xffffff0, 28), (0xffffff1, 28), (0xffffff2, 28), (0x3ffffffe, 30), (0xffffff3, 28),
    (0xffffff4, 28), (0xffffff5, 28), (0xffffff6, 28), (0xffffff7, 28), (0xffffff8, 28), (0xffffff9, 28), (0xffffffa, 28), (0xffffffb, 28),
    (0x14, 6), (0x3f8, 10), (0x3f9, 10), (0xffa, 12), (0x1ff9, 13), (0x15, 6), (0xf8, 8), (0x7fa, 11),
    (0x3fa, 10), (0x3fb, 10), (0xf9, 8), (0x7fb, 11), (0xfa, 8), (0x16, 6), (0x17, 6), (0x18, 6),
    (0x0, 5), (0x1, 5), (0x2, 5), (0x19, 6), (0x1a, 6), (0x1b, 6), (0x1c, 6), (0x1d, 6),
    (0x1e, 6), (0x1f, 6), (0x5c, 7), (0xfb, 8), (0x7ffc, 15), (0x20, 6), (0xffb, 12), (0x3fc, 10),
    (0x1ffa, 13), (0x21, 6), (0x5d, 7), (0x5e, 7), (0x5f, 7), (0x60, 7), (0x61, 7), (0x62, 7),
    (0x63, 7), (0x64, 7), (0x65, 7), (0x66, 7), (0x67, 7), (0x68, 7), (0x69, 7), (0x6a, 7),
    (0x6b, 7), (0x6c, 7), (0x6d, 7), (0x6e, 7), (0x6f, 7), (0x70, 7), (0x71, 7), (0x72, 7),
    (0xfc, 8), (0x73, 7), (0xfd, 8), (0x1ffb, 13), (0x7fff0, 19), (0x1ffc, 13), (0x3ffc, 14), (0x22, 6),
    (0x7ffd, 15), (0x3, 5), (0x23, 6), (0x4, 5), (0x24, 6), (0x5, 5), (0x25, 6), (0x26, 6),
    (0x27, 6), (0x6, 5), (0x74, 7), (0x75, 7), (0x28, 6), (0x29, 6), (0x2a, 6), (0x7, 5),
    (0x2b, 6), (0x76, 7), (0x2c, 6), (0x8, 5), (0x9, 5), (0x2d, 6), (0x77, 7), (0x78, 7),
    (0x79, 7), (0x7a, 7), (0x7b, 7), (0x7ffe, 15), (0x7fc, 11), (0x3ffd, 14), (0x1ffd, 13), (0xffffffc, 28),
    (0xfffe6, 20), (0x3fffd2, 22), (0xfffe7, 20), (0xfffe8, 20), (0x3fffd3, 22), (0x3fffd4, 22), (0x3fffd5, 22), (0x7fffd9, 23),
    (0x3fffd6, 22), (0x7fffda, 23), (0x7fffdb, 23), (0x7fffdc, 23), (0x7fffdd, 23), (0x7fffde, 23), (0xffffeb, 24), (0x7fffdf, 23),
    (0xffffec, 24), (0xffffed, 24), (0x3fffd7, 22), (0x7fffe0, 23), (0xffffee, 24), (0x7fffe1, 23), (0x7fffe2, 23), (0x7fffe3, 23),
    (0x7fffe4, 23), (0x1fffdc, 21), (0x3fffd8, 22), (0x7fffe5, 23), (0x3fffd9, 22), (0x7fffe6, 23), (0x7fffe7, 23), (0xffffef, 24),
    (0x3fffda, 22), (0x1fffdd, 21), (0xfffe9, 20), (0x3fffdb, 22), (0x3fffdc, 22), (0x7fffe8, 23), (0x7fffe9, 23), (0x1fffde, 21),
    (0x7fffea, 23), (0x3fffdd, 22), (0x3fffde, 22), (0xfffff0, 24), (0x1fffdf, 21), (0x3fffdf, 22), (0x7fffeb, 23), (0x7fffec, 23),
    (0x1fffe0, 21), (0x1fffe1, 21), (0x3fffe0, 22), (0x1fffe2, 21), (0x7fffed, 23), (0x3fffe1, 22), (0x7fffee, 23), (0x7fffef, 23),
    (0xfffea, 20), (0x3fffe2, 22), (0x3fffe3, 22), (0x3fffe4, 22), (0x7ffff0, 23), (0x3fffe5, 22), (0x3fffe6, 22), (0x7ffff1, 23),
    (0x3ffffe0, 26), (0x3ffffe1, 26), (0xfffeb, 20), (0x7fff1, 19), (0x3fffe7, 22), (0x7ffff2, 23), (0x3fffe8, 22), (0x1ffffec, 25),
    (0x3ffffe2, 26), (0x3ffffe3, 26), (0x3ffffe4, 26), (0x7ffffde, 27), (0x7ffffdf, 27), (0x3ffffe5, 26), (0xfffff1, 24), (0x1ffffed, 25),
    (0x7fff2, 19), (0x1fffe3, 21), (0x3ffffe6, 26), (0x7ffffe0, 27), (0x7ffffe1, 27), (0x3ffffe7, 26), (0x7ffffe2, 27), (0xfffff2, 24),
    (0x1fffe4, 21), (0x1fffe5, 21), (0x3ffffe8, 26), (0x3ffffe9, 26), (0xffffffd, 28), (0x7ffffe3, 27), (0x7ffffe4, 27), (0x7ffffe5, 27),
    (0xfffec, 20), (0xfffff3, 24), (0xfffed, 20), (0x1fffe6, 21), (0x3fffe9, 22), (0x1fffe7, 21), (0x1fffe8, 21), (0x7ffff3, 23),
    (0x3fffea, 22), (0x3fffeb, 22), (0x1ffffee, 25), (0x1ffffef, 25), (0xfffff4, 24), (0xfffff5, 24), (0x3ffffea, 26), (0x7ffff4, 23),
    (0x3ffffeb, 26), (0x7ffffe6, 27), (0x3ffffec, 26), (0x3ffffed, 26), (0x7ffffe7, 27), (0x7ffffe8, 27), (0x7ffffe9, 27), (0x7ffffea, 27),
    (0x7ffffeb, 27), (0xffffffe, 28), (0x7ffffec, 27), (0x7ffffed, 27), (0x7ffffee, 27), (0x7ffffef, 27), (0x7fffff0, 27), (0x3ffffee, 26),
];

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(text: &str) -> Vec<u8> {
        let digits: Vec<u8> = text.bytes().filter(u8::is_ascii_hexdigit).collect();
        digits
            .chunks(2)
            .map(|pair| u8::from_str_radix(std::str::from_utf8(pair).unwrap(), 16).unwrap())
            .collect()
    }

    fn pairs(fields: &[(String, String)]) -> Vec<(&str, &str)> {
        fields
            .iter()
            .map(|(n, v)| (n.as_str(), v.as_str()))
            .collect()
    }

    /// RFC 7541 C.4: requests with Huffman coding, sharing one dynamic table.
    #[test]
    fn decodes_the_rfc_huffman_examples_with_their_dynamic_table() {
        let mut decoder = Decoder::default();
        let first = decoder
            .decode(&hex("8286 8441 8cf1 e3c2 e5f2 3a6b a0ab 90f4 ff"))
            .unwrap();
        assert_eq!(
            pairs(&first),
            [
                (":method", "GET"),
                (":scheme", "http"),
                (":path", "/"),
                (":authority", "www.example.com")
            ]
        );
        let second = decoder
            .decode(&hex("8286 84be 5886 a8eb 1064 9cbf"))
            .unwrap();
        assert_eq!(pairs(&second)[3], (":authority", "www.example.com"));
        assert_eq!(pairs(&second)[4], ("cache-control", "no-cache"));
        let third = decoder
            .decode(&hex(
                "8287 85bf 4088 25a8 49e9 5ba9 7d7f 8925 a849 e95b b8e8 b4bf",
            ))
            .unwrap();
        assert_eq!(pairs(&third)[4], ("custom-key", "custom-value"));
        assert_eq!(pairs(&third)[2], (":path", "/index.html"));
    }

    /// RFC 7541 C.6: responses with Huffman coding and evictions from a 256-byte table.
    #[test]
    fn evicts_as_the_table_shrinks() {
        let mut decoder = Decoder::default();
        decoder.decode(&hex("3fe1 01")).unwrap(); // table size update to 256
        assert_eq!(decoder.max_size, 256);
        let first = decoder
            .decode(&hex(
                "4882 6402 5885 aec3 771a 4b61 96d0 7abe 9410 54d4 44a8 2005 9504 0b81 66e0 \
                 82a6 2d1b ff6e 919d 29ad 1718 63c7 8f0b 97c8 e9ae 82ae 43d3",
            ))
            .unwrap();
        assert_eq!(pairs(&first)[0], (":status", "302"));
        assert_eq!(pairs(&first)[3], ("location", "https://www.example.com"));
        let second = decoder.decode(&hex("4883 640e ff c1 c0 bf")).unwrap();
        assert_eq!(pairs(&second)[0], (":status", "307"));
        assert_eq!(pairs(&second)[3], ("location", "https://www.example.com"));
        assert_eq!(decoder.table.len(), 4);
    }

    #[test]
    fn what_is_encoded_decodes() {
        let headers = [
            (":path", "/runtime.v1.RuntimeService/ListContainers"),
            ("te", "trailers"),
        ];
        let long = "x".repeat(300);
        let block = encode(&[headers[0], headers[1], ("grpc-message", &long)]);
        let fields = Decoder::default().decode(&block).unwrap();
        assert_eq!(pairs(&fields)[..2], headers);
        assert_eq!(fields[2].1, long);
    }

    #[test]
    fn bad_blocks_are_errors_not_panics() {
        for bad in [
            &[0x80][..],
            &[0xff],
            &[0xbf],
            &[0x00, 0x05, b'a'],
            &[0x00, 0x81, 0x00],
            &[0x3f, 0xff, 0xff],
        ] {
            assert!(Decoder::default().decode(bad).is_err(), "{bad:?}");
        }
    }
}
