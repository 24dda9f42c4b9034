//! HPACK (RFC 7541) for the `:authority` rewrite: a full decoder for what a client sends, and an
//! encoder that never touches the dynamic table.
//!
//! The decoder keeps the client's dynamic table in step with the client's encoder, which is the
//! only reason a rewrite needs a full decoder: grpc-go indexes `:authority` on the first request
//! and refers to it by index afterwards, so the header blocks of one connection are not
//! independent. The encoder writes every field as a literal *without indexing* (or *never
//! indexed*, where the client said so, as RFC 7541 §6.2.3 requires of intermediaries), with a
//! static-table name where there is one, and never emits a table size update. So the h2 server
//! behind the rewrite decodes with an empty dynamic table for the whole connection, and the only
//! HPACK state that matters is the client's, which this decoder mirrors.

use std::collections::VecDeque;

use bytes::Bytes;

use super::huffman::{self, HuffmanError};

/// One decoded header field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HeaderField {
    pub name: Bytes,
    pub value: Bytes,
    /// Sent as "never indexed" (RFC 7541 §6.2.3): re-encode it the same way.
    pub never_indexed: bool,
}

impl HeaderField {
    /// The size HPACK and HTTP/2 account for a field: name, value and 32 octets of overhead
    /// (RFC 7541 §4.1, RFC 9113 §6.5.2 `SETTINGS_MAX_HEADER_LIST_SIZE`).
    pub(crate) fn size(&self) -> usize {
        entry_size(&self.name, &self.value)
    }
}

fn entry_size(name: &[u8], value: &[u8]) -> usize {
    name.len() + value.len() + 32
}

/// Why a header block does not decode. Each is a connection error (`COMPRESSION_ERROR`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum HpackError {
    #[error("header block ends inside a field representation")]
    Truncated,
    #[error("hpack integer does not fit in 32 bits")]
    IntegerOverflow,
    #[error("header table index {0} does not exist")]
    InvalidIndex(usize),
    #[error(transparent)]
    Huffman(#[from] HuffmanError),
    #[error("dynamic table size update to {requested} exceeds the allowed {allowed}")]
    TableSizeTooLarge { requested: usize, allowed: usize },
    #[error("dynamic table size update after the first header field of a block")]
    TableSizeUpdateNotAtStart,
    #[error("decoded header list exceeds {limit} bytes")]
    HeaderListTooLarge { limit: usize },
}

/// Decodes the header blocks of one connection direction, in order.
#[derive(Debug)]
pub(crate) struct Decoder {
    table: DynamicTable,
    /// The largest table size the encoder may choose: the receiver's `SETTINGS_HEADER_TABLE_SIZE`.
    allowed_table_size: usize,
}

impl Decoder {
    /// A decoder for a peer whose table may grow to `allowed_table_size` octets (the
    /// `SETTINGS_HEADER_TABLE_SIZE` the receiving server advertised; 4096 unless it changed it).
    pub(crate) fn new(allowed_table_size: usize) -> Self {
        Self {
            table: DynamicTable::new(allowed_table_size),
            allowed_table_size,
        }
    }

    /// Decodes one complete header block (all of its HEADERS and CONTINUATION fragments), updating
    /// the dynamic table. Fails when the decoded list would exceed `max_list_size` bytes.
    pub(crate) fn decode(
        &mut self,
        block: &[u8],
        max_list_size: usize,
    ) -> Result<Vec<HeaderField>, HpackError> {
        let mut fields = Vec::new();
        let mut list_size = 0usize;
        let mut pos = 0;
        while let Some(&first) = block.get(pos) {
            let field = if first & 0x80 != 0 {
                // Indexed field (§6.1).
                let index = integer(block, &mut pos, 7)?;
                let (name, value) = self.lookup(index)?;
                HeaderField {
                    name,
                    value,
                    never_indexed: false,
                }
            } else if first & 0xc0 == 0x40 {
                // Literal with incremental indexing (§6.2.1).
                let (name, value) = self.literal(block, &mut pos, 6)?;
                self.table.insert(name.clone(), value.clone());
                HeaderField {
                    name,
                    value,
                    never_indexed: false,
                }
            } else if first & 0xe0 == 0x20 {
                // Dynamic table size update (§6.3): only before the first field (§4.2).
                if !fields.is_empty() {
                    return Err(HpackError::TableSizeUpdateNotAtStart);
                }
                let requested = integer(block, &mut pos, 5)?;
                if requested > self.allowed_table_size {
                    return Err(HpackError::TableSizeTooLarge {
                        requested,
                        allowed: self.allowed_table_size,
                    });
                }
                self.table.set_max_size(requested);
                continue;
            } else {
                // Literal without indexing (0000xxxx, §6.2.2) or never indexed (0001xxxx, §6.2.3).
                let never_indexed = first & 0xf0 == 0x10;
                let (name, value) = self.literal(block, &mut pos, 4)?;
                HeaderField {
                    name,
                    value,
                    never_indexed,
                }
            };
            list_size = list_size.saturating_add(field.size());
            if list_size > max_list_size {
                return Err(HpackError::HeaderListTooLarge {
                    limit: max_list_size,
                });
            }
            fields.push(field);
        }
        Ok(fields)
    }

    /// A literal field whose name is indexed (non-zero prefix) or a string, then a value string.
    fn literal(
        &self,
        block: &[u8],
        pos: &mut usize,
        prefix_bits: u8,
    ) -> Result<(Bytes, Bytes), HpackError> {
        let name = match integer(block, pos, prefix_bits)? {
            0 => string(block, pos)?,
            index => self.lookup(index)?.0,
        };
        let value = string(block, pos)?;
        Ok((name, value))
    }

    /// Entry `index` of the static table followed by the dynamic table (§2.3.3).
    fn lookup(&self, index: usize) -> Result<(Bytes, Bytes), HpackError> {
        if let Some(dynamic) = index.checked_sub(STATIC_TABLE.len() + 1) {
            return self
                .table
                .get(dynamic)
                .ok_or(HpackError::InvalidIndex(index));
        }
        index
            .checked_sub(1)
            .and_then(|i| STATIC_TABLE.get(i))
            .map(|(n, v)| {
                (
                    Bytes::from_static(n.as_bytes()),
                    Bytes::from_static(v.as_bytes()),
                )
            })
            .ok_or(HpackError::InvalidIndex(index))
    }
}

/// The dynamic table (§2.3.2, §4): newest entry first, evicting the oldest to fit.
#[derive(Debug)]
struct DynamicTable {
    entries: VecDeque<(Bytes, Bytes)>,
    size: usize,
    max_size: usize,
}

impl DynamicTable {
    fn new(max_size: usize) -> Self {
        Self {
            entries: VecDeque::new(),
            size: 0,
            max_size,
        }
    }

    fn get(&self, index: usize) -> Option<(Bytes, Bytes)> {
        self.entries.get(index).cloned()
    }

    fn set_max_size(&mut self, max_size: usize) {
        self.max_size = max_size;
        self.evict_to(max_size);
    }

    /// Adds an entry; one larger than the whole table empties it and is not added (§4.4).
    fn insert(&mut self, name: Bytes, value: Bytes) {
        let size = entry_size(&name, &value);
        if size > self.max_size {
            self.entries.clear();
            self.size = 0;
            return;
        }
        self.evict_to(self.max_size - size);
        self.entries.push_front((name, value));
        self.size += size;
    }

    fn evict_to(&mut self, target: usize) {
        while self.size > target {
            let Some((name, value)) = self.entries.pop_back() else {
                break;
            };
            self.size -= entry_size(&name, &value);
        }
    }
}

/// Reads an integer with an N-bit prefix (§5.1) at `pos`, advancing it.
fn integer(block: &[u8], pos: &mut usize, prefix_bits: u8) -> Result<usize, HpackError> {
    let first = *block.get(*pos).ok_or(HpackError::Truncated)?;
    *pos += 1;
    let prefix_max = (1u8 << prefix_bits) - 1;
    let mut value = u64::from(first & prefix_max);
    if value < u64::from(prefix_max) {
        return usize::try_from(value).map_err(|_| HpackError::IntegerOverflow);
    }
    let mut shift = 0u32;
    loop {
        let byte = *block.get(*pos).ok_or(HpackError::Truncated)?;
        *pos += 1;
        value += u64::from(byte & 0x7f) << shift;
        if value > u64::from(u32::MAX) {
            return Err(HpackError::IntegerOverflow);
        }
        if byte & 0x80 == 0 {
            return usize::try_from(value).map_err(|_| HpackError::IntegerOverflow);
        }
        shift += 7;
        if shift > 28 {
            // Five continuation octets already carry 35 bits: more is padding with zeros at
            // best and an attack at worst.
            return Err(HpackError::IntegerOverflow);
        }
    }
}

/// Reads a string literal (§5.2), raw or Huffman-coded, at `pos`, advancing it.
fn string(block: &[u8], pos: &mut usize) -> Result<Bytes, HpackError> {
    let huffman = block.get(*pos).ok_or(HpackError::Truncated)? & 0x80 != 0;
    let len = integer(block, pos, 7)?;
    let end = pos.checked_add(len).ok_or(HpackError::Truncated)?;
    let raw = block.get(*pos..end).ok_or(HpackError::Truncated)?;
    *pos = end;
    if huffman {
        let mut out = Vec::with_capacity(len * 8 / 5);
        huffman::decode(raw, &mut out)?;
        Ok(Bytes::from(out))
    } else {
        Ok(Bytes::copy_from_slice(raw))
    }
}

/// Encodes `fields` as literals that leave the receiver's dynamic table alone: "without indexing"
/// or "never indexed", names from the static table where it has them, strings raw (Huffman
/// coding is optional, RFC 7541 §5.2, and not worth it on a local socket).
pub(crate) fn encode(fields: &[HeaderField], out: &mut Vec<u8>) {
    for field in fields {
        let flags = if field.never_indexed { 0x10 } else { 0x00 };
        match static_name_index(&field.name) {
            Some(index) => put_integer(out, flags, 4, index),
            None => {
                put_integer(out, flags, 4, 0);
                put_string(out, &field.name);
            }
        }
        put_string(out, &field.value);
    }
}

fn static_name_index(name: &[u8]) -> Option<usize> {
    STATIC_TABLE
        .iter()
        .position(|(n, _)| n.as_bytes() == name)
        .map(|i| i + 1)
}

/// Writes an integer with an N-bit prefix (§5.1); `flags` fills the bits above the prefix.
// Each cast keeps the low bits on purpose: the value was compared or masked to fit first.
#[allow(clippy::cast_possible_truncation)]
pub(crate) fn put_integer(out: &mut Vec<u8>, flags: u8, prefix_bits: u8, value: usize) {
    let prefix_max = usize::from((1u8 << prefix_bits) - 1);
    if value < prefix_max {
        out.push(flags | value as u8);
        return;
    }
    out.push(flags | prefix_max as u8);
    let mut rest = value - prefix_max;
    while rest >= 0x80 {
        out.push(0x80 | (rest & 0x7f) as u8);
        rest >>= 7;
    }
    out.push(rest as u8);
}

/// Writes a raw (not Huffman-coded) string literal.
fn put_string(out: &mut Vec<u8>, s: &[u8]) {
    put_integer(out, 0x00, 7, s.len());
    out.extend_from_slice(s);
}

/// RFC 7541 Appendix A, index 1 first.
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

/// An encoder that behaves like grpc-go's (golang.org/x/net/http2/hpack): exact matches by
/// index, everything else a literal with incremental indexing, Huffman where shorter. Tests use
/// it to produce what the kubelet sends.
#[cfg(test)]
#[derive(Debug)]
pub(crate) struct TestEncoder {
    table: DynamicTable,
    pending_size_update: Option<usize>,
}

#[cfg(test)]
impl TestEncoder {
    pub(crate) fn new() -> Self {
        Self {
            table: DynamicTable::new(4096),
            pending_size_update: None,
        }
    }

    /// Shrinks (or regrows) the table; the update goes out at the start of the next block.
    pub(crate) fn set_table_size(&mut self, size: usize) {
        self.table.set_max_size(size);
        self.pending_size_update = Some(size);
    }

    pub(crate) fn encode(&mut self, fields: &[(&str, &str)]) -> Vec<u8> {
        let mut out = Vec::new();
        if let Some(size) = self.pending_size_update.take() {
            put_integer(&mut out, 0x20, 5, size);
        }
        for &(name, value) in fields {
            let dynamic_base = STATIC_TABLE.len() + 1;
            let exact = STATIC_TABLE
                .iter()
                .position(|&(n, v)| n == name && v == value)
                .map(|i| i + 1)
                .or_else(|| {
                    self.table
                        .entries
                        .iter()
                        .position(|(n, v)| n == name.as_bytes() && v == value.as_bytes())
                        .map(|i| i + dynamic_base)
                });
            if let Some(index) = exact {
                put_integer(&mut out, 0x80, 7, index);
                continue;
            }
            let name_index = static_name_index(name.as_bytes()).or_else(|| {
                self.table
                    .entries
                    .iter()
                    .position(|(n, _)| n == name.as_bytes())
                    .map(|i| i + dynamic_base)
            });
            match name_index {
                Some(index) => put_integer(&mut out, 0x40, 6, index),
                None => {
                    put_integer(&mut out, 0x40, 6, 0);
                    put_test_string(&mut out, name.as_bytes());
                }
            }
            put_test_string(&mut out, value.as_bytes());
            self.table.insert(
                Bytes::copy_from_slice(name.as_bytes()),
                Bytes::copy_from_slice(value.as_bytes()),
            );
        }
        out
    }
}

#[cfg(test)]
fn put_test_string(out: &mut Vec<u8>, s: &[u8]) {
    let coded = huffman::encode(s);
    if coded.len() < s.len() {
        put_integer(out, 0x80, 7, coded.len());
        out.extend_from_slice(&coded);
    } else {
        put_string(out, s);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NO_LIMIT: usize = usize::MAX;

    fn hex(s: &str) -> Vec<u8> {
        let s: String = s.split_whitespace().collect();
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    fn pairs(fields: &[HeaderField]) -> Vec<(String, String)> {
        fields
            .iter()
            .map(|f| {
                (
                    String::from_utf8_lossy(&f.name).into_owned(),
                    String::from_utf8_lossy(&f.value).into_owned(),
                )
            })
            .collect()
    }

    fn owned(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(n, v)| ((*n).to_owned(), (*v).to_owned()))
            .collect()
    }

    /// RFC 7541 C.3 (no Huffman) and C.4 (Huffman): three requests on one connection, each
    /// leaning on the dynamic table the previous ones built.
    #[test]
    fn decodes_rfc_request_sequences() {
        let plain = [
            "8286 8441 0f77 7777 2e65 7861 6d70 6c65 2e63 6f6d",
            "8286 84be 5808 6e6f 2d63 6163 6865",
            "8287 85bf 400a 6375 7374 6f6d 2d6b 6579 0c63 7573 746f 6d2d 7661 6c75 65",
        ];
        let huffman = [
            "8286 8441 8cf1 e3c2 e5f2 3a6b a0ab 90f4 ff",
            "8286 84be 5886 a8eb 1064 9cbf",
            "8287 85bf 4088 25a8 49e9 5ba9 7d7f 8925 a849 e95b b8e8 b4bf",
        ];
        let expected = [
            owned(&[
                (":method", "GET"),
                (":scheme", "http"),
                (":path", "/"),
                (":authority", "www.example.com"),
            ]),
            owned(&[
                (":method", "GET"),
                (":scheme", "http"),
                (":path", "/"),
                (":authority", "www.example.com"),
                ("cache-control", "no-cache"),
            ]),
            owned(&[
                (":method", "GET"),
                (":scheme", "https"),
                (":path", "/index.html"),
                (":authority", "www.example.com"),
                ("custom-key", "custom-value"),
            ]),
        ];
        let table_sizes = [57, 110, 164];
        for blocks in [plain, huffman] {
            let mut decoder = Decoder::new(4096);
            for ((block, want), size) in blocks.iter().zip(&expected).zip(table_sizes) {
                let fields = decoder.decode(&hex(block), NO_LIMIT).unwrap();
                assert_eq!(&pairs(&fields), want);
                assert_eq!(decoder.table.size, size);
            }
        }
    }

    #[test]
    fn never_indexed_is_reported() {
        // RFC 7541 C.2.3: password: secret, never indexed.
        let block = hex("1008 7061 7373 776f 7264 0673 6563 7265 74");
        let fields = Decoder::new(4096).decode(&block, NO_LIMIT).unwrap();
        assert_eq!(pairs(&fields), owned(&[("password", "secret")]));
        assert!(fields[0].never_indexed);
    }

    #[test]
    fn eviction_keeps_the_table_within_its_size() {
        let mut enc = TestEncoder::new();
        let mut dec = Decoder::new(4096);
        enc.set_table_size(100);
        // Each entry is 32 + 1 + 40 = 73 bytes: only one fits at a time.
        let long = "x".repeat(40);
        for name in ["a", "b", "c"] {
            let block = enc.encode(&[(name, &long)]);
            let fields = dec.decode(&block, NO_LIMIT).unwrap();
            assert_eq!(pairs(&fields), owned(&[(name, &long)]));
            assert_eq!(dec.table.entries.len(), 1);
            assert!(dec.table.size <= 100);
        }
        // The latest entry is referenced by index 62 and decodes to "c".
        let fields = dec.decode(&[0x80 | 62], NO_LIMIT).unwrap();
        assert_eq!(pairs(&fields), owned(&[("c", &long)]));
        assert_eq!(
            dec.decode(&[0x80 | 63], NO_LIMIT),
            Err(HpackError::InvalidIndex(63))
        );
    }

    #[test]
    fn the_table_holds_exactly_its_size() {
        // Two entries of 50 bytes (32 + 1 + 17) fill a 100-byte table exactly: both stay.
        let mut enc = TestEncoder::new();
        let mut dec = Decoder::new(4096);
        enc.set_table_size(100);
        let value = "v".repeat(17);
        for name in ["a", "b"] {
            dec.decode(&enc.encode(&[(name, &value)]), NO_LIMIT)
                .unwrap();
        }
        assert_eq!(dec.table.size, 100);
        let both = dec.decode(&[0x80 | 62, 0x80 | 63], NO_LIMIT).unwrap();
        assert_eq!(pairs(&both), owned(&[("b", &value), ("a", &value)]));
        // A third evicts exactly the oldest, and the accounting follows.
        dec.decode(&enc.encode(&[("c", &value)]), NO_LIMIT).unwrap();
        assert_eq!(dec.table.size, 100);
        let both = dec.decode(&[0x80 | 62, 0x80 | 63], NO_LIMIT).unwrap();
        assert_eq!(pairs(&both), owned(&[("c", &value), ("b", &value)]));

        // One entry exactly the table's size is kept, alone.
        let mut dec = Decoder::new(100);
        let whole = "w".repeat(67);
        dec.decode(&enc.encode(&[("d", &whole)]), NO_LIMIT).unwrap();
        assert_eq!(dec.table.entries.len(), 1);
        let fields = dec.decode(&[0x80 | 62], NO_LIMIT).unwrap();
        assert_eq!(pairs(&fields), owned(&[("d", &whole)]));
    }

    #[test]
    fn an_entry_larger_than_the_table_empties_it() {
        let mut dec = Decoder::new(4096);
        let mut enc = TestEncoder::new();
        enc.set_table_size(64);
        dec.decode(&enc.encode(&[("a", "b")]), NO_LIMIT).unwrap();
        assert_eq!(dec.table.entries.len(), 1);
        dec.decode(&enc.encode(&[("big", &"y".repeat(64))]), NO_LIMIT)
            .unwrap();
        assert_eq!(dec.table.entries.len(), 0);
        assert_eq!(dec.table.size, 0);
    }

    #[test]
    fn table_size_update_beyond_the_setting_is_rejected() {
        // Up to the setting is allowed.
        let mut at_setting = Vec::new();
        put_integer(&mut at_setting, 0x20, 5, 4096);
        assert_eq!(Decoder::new(4096).decode(&at_setting, NO_LIMIT), Ok(vec![]));

        let mut block = Vec::new();
        put_integer(&mut block, 0x20, 5, 4097);
        assert_eq!(
            Decoder::new(4096).decode(&block, NO_LIMIT),
            Err(HpackError::TableSizeTooLarge {
                requested: 4097,
                allowed: 4096
            })
        );
    }

    #[test]
    fn table_size_update_after_a_field_is_rejected() {
        // :method GET, then a size update to 0.
        assert_eq!(
            Decoder::new(4096).decode(&[0x82, 0x20], NO_LIMIT),
            Err(HpackError::TableSizeUpdateNotAtStart)
        );
    }

    #[test]
    fn index_zero_and_unknown_indexes_are_rejected() {
        let mut dec = Decoder::new(4096);
        assert_eq!(
            dec.decode(&[0x80], NO_LIMIT),
            Err(HpackError::InvalidIndex(0))
        );
        assert_eq!(
            dec.decode(&[0x80 | 62], NO_LIMIT),
            Err(HpackError::InvalidIndex(62))
        );
    }

    #[test]
    fn truncated_blocks_fail_or_decode_a_prefix_never_garbage() {
        let mut enc = TestEncoder::new();
        let block = enc.encode(&[(":authority", "%2Fvar%2Flib%2Fkubelet"), ("x-key", "value")]);
        let full = Decoder::new(4096).decode(&block, NO_LIMIT).unwrap();
        let mut errors = 0;
        for cut in 1..block.len() {
            match Decoder::new(4096).decode(&block[..cut], NO_LIMIT) {
                // Cut exactly between two fields: the fields before the cut.
                Ok(fields) => assert_eq!(fields[..], full[..fields.len()], "cut at {cut}"),
                Err(_) => errors += 1,
            }
        }
        // Every cut but the one between the two fields fails.
        assert_eq!(errors, block.len() - 2);
    }

    proptest::proptest! {
        /// Header blocks come from the kubelet: any bytes decode or fail, never panic.
        #[test]
        fn arbitrary_blocks_never_panic(
            block in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..512),
        ) {
            let _ = Decoder::new(4096).decode(&block, 64 * 1024);
        }

        /// Valid blocks of random fields: they decode to exactly those fields when within the
        /// list limit, and are refused when over it.
        #[test]
        fn valid_blocks_decode_exactly_or_are_refused_over_the_limit(
            fields in proptest::collection::vec(("[a-z-]{1,12}", "[ -~]{0,40}"), 1..12),
            limit in 0usize..1024,
        ) {
            let list: Vec<(&str, &str)> =
                fields.iter().map(|(n, v)| (n.as_str(), v.as_str())).collect();
            let block = TestEncoder::new().encode(&list);
            let size: usize = list.iter().map(|(n, v)| n.len() + v.len() + 32).sum();
            match Decoder::new(4096).decode(&block, limit) {
                Ok(decoded) => {
                    proptest::prop_assert!(size <= limit, "{size} bytes decoded over a limit of {limit}");
                    proptest::prop_assert_eq!(pairs(&decoded), owned(&list));
                }
                Err(e) => proptest::prop_assert!(
                    size > limit,
                    "{size} bytes within a limit of {limit} refused: {e}"
                ),
            }
        }

        /// A valid block with bytes flipped: still no panic, and the dynamic table stays within
        /// the size the decoder allows.
        #[test]
        fn corrupted_blocks_never_panic(
            flips in proptest::collection::vec((0usize..64, proptest::prelude::any::<u8>()), 1..8),
        ) {
            let mut enc = TestEncoder::new();
            let mut block = enc.encode(&[
                (":authority", "%2Fvar%2Flib%2Fkubelet%2Fplugins_registry%2Fx-reg.sock"),
                (":path", "/v1.DRAPlugin/NodePrepareResources"),
                ("grpc-timeout", "44999m"),
            ]);
            for (at, byte) in flips {
                let at = at % block.len();
                block[at] ^= byte;
            }
            let mut dec = Decoder::new(256);
            let _ = dec.decode(&block, usize::MAX);
            proptest::prop_assert!(dec.table.size <= 256);
        }
    }

    #[test]
    fn oversized_integers_are_rejected() {
        // Indexed field, 7-bit prefix full, then continuation bytes forever.
        let block = [0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01];
        assert_eq!(
            Decoder::new(4096).decode(&block, NO_LIMIT),
            Err(HpackError::IntegerOverflow)
        );
    }

    #[test]
    fn integers_up_to_u32_max_decode_and_larger_overflow() {
        let max = usize::try_from(u32::MAX).unwrap();
        let mut buf = Vec::new();
        put_integer(&mut buf, 0, 7, max);
        assert_eq!(
            buf.len(),
            6,
            "u32::MAX takes the prefix and five continuation octets"
        );
        let mut pos = 0;
        assert_eq!(integer(&buf, &mut pos, 7), Ok(max));
        assert_eq!(pos, buf.len());

        let mut buf = Vec::new();
        put_integer(&mut buf, 0, 7, max + 1);
        assert_eq!(integer(&buf, &mut 0, 7), Err(HpackError::IntegerOverflow));
    }

    #[test]
    fn encoded_names_come_from_the_static_table_where_it_has_them() {
        let field = |name: &'static str| HeaderField {
            name: Bytes::from_static(name.as_bytes()),
            value: Bytes::from_static(b"v"),
            never_indexed: false,
        };
        let mut out = Vec::new();
        encode(&[field(":authority")], &mut out);
        // Literal without indexing, name index 1, then the value.
        assert_eq!(out, [0x01, 0x01, b'v']);
        let mut out = Vec::new();
        encode(&[field("x-custom")], &mut out);
        assert_eq!(out[..2], [0x00, 0x08]);
    }

    #[test]
    fn a_string_longer_than_the_block_is_rejected() {
        // Literal without indexing, new name, length 100 with 3 bytes present.
        let block = [0x00, 0x64, b'a', b'b', b'c'];
        assert_eq!(
            Decoder::new(4096).decode(&block, NO_LIMIT),
            Err(HpackError::Truncated)
        );
    }

    #[test]
    fn the_header_list_limit_counts_32_bytes_per_field() {
        // :method GET is 7 + 3 + 32 = 42 bytes.
        let mut dec = Decoder::new(4096);
        assert!(dec.decode(&[0x82], 42).is_ok());
        assert_eq!(
            dec.decode(&[0x82, 0x82], 83),
            Err(HpackError::HeaderListTooLarge { limit: 83 })
        );
    }

    #[test]
    fn encoded_fields_decode_to_the_same_fields_without_touching_the_table() {
        let fields = vec![
            HeaderField {
                name: Bytes::from_static(b":authority"),
                value: Bytes::from_static(b"localhost"),
                never_indexed: false,
            },
            HeaderField {
                name: Bytes::from_static(b"x-custom"),
                value: Bytes::from(vec![b'v'; 300]),
                never_indexed: false,
            },
            HeaderField {
                name: Bytes::from_static(b"authorization"),
                value: Bytes::from_static(b"secret"),
                never_indexed: true,
            },
        ];
        let mut block = Vec::new();
        encode(&fields, &mut block);
        let mut dec = Decoder::new(4096);
        assert_eq!(dec.decode(&block, NO_LIMIT).unwrap(), fields);
        assert_eq!(
            dec.table.entries.len(),
            0,
            "the receiver's table stays empty"
        );
    }

    #[test]
    fn integers_round_trip_at_prefix_boundaries() {
        for prefix in 4..=7u8 {
            for value in [
                0,
                1,
                14,
                15,
                16,
                30,
                31,
                126,
                127,
                128,
                254,
                255,
                256,
                1337,
                1 << 20,
            ] {
                let mut buf = Vec::new();
                put_integer(&mut buf, 0, prefix, value);
                let mut pos = 0;
                assert_eq!(
                    integer(&buf, &mut pos, prefix),
                    Ok(value),
                    "prefix {prefix}"
                );
                assert_eq!(pos, buf.len());
            }
        }
    }
}
