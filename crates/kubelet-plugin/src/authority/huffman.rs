//! HPACK's Huffman code (RFC 7541 §5.2 and Appendix B): decoding string literals.
//!
//! The code is *canonical*: within each code length, symbols get consecutive codes in increasing
//! symbol order, and the first code of a length continues from the last code of the previous
//! length, shifted left. So the whole code follows from one fact per symbol, its code length,
//! which [`SYMBOLS_BY_LENGTH`] lists in the order of RFC 7541 Appendix B. Decoding walks the code
//! one bit at a time with the classic canonical-code loop (first code, count and symbol offset per
//! length); header strings are short, so a bit loop is fast enough and easy to check.
//!
//! Why our own: no well-kept crate exposes an HPACK decoder (h2 keeps its own private), see
//! `super` for the whole argument.

/// Every byte value grouped by code length, each group in increasing byte order. EOS (symbol
/// 256) is the one 30-bit symbol not listed: being the largest symbol of the longest length it
/// gets the last code, all ones.
#[rustfmt::skip]
const SYMBOLS_BY_LENGTH: &[(usize, &[u8])] = &[
    (5, b"012aceiost"),
    (6, b" %-./3456789=A_bdfghlmnpru"),
    (7, b":BCDEFGHIJKLMNOPQRSTUVWYjkqvwxyz"),
    (8, b"&*,;XZ"),
    (10, b"!\"()?"),
    (11, b"'+|"),
    (12, b"#>"),
    (13, b"\x00$@[]~"),
    (14, b"^}"),
    (15, b"<`{"),
    (19, b"\\\xc3\xd0"),
    (20, b"\x80\x82\x83\xa2\xb8\xc2\xe0\xe2"),
    (21, b"\x99\xa1\xa7\xac\xb0\xb1\xb3\xd1\xd8\xd9\xe3\xe5\xe6"),
    (22, b"\x81\x84\x85\x86\x88\x92\x9a\x9c\xa0\xa3\xa4\xa9\xaa\xad\xb2\xb5\xb9\xba\xbb\xbd\xbe\xc4\xc6\xe4\xe8\xe9"),
    (23, b"\x01\x87\x89\x8a\x8b\x8c\x8d\x8f\x93\x95\x96\x97\x98\x9b\x9d\x9e\xa5\xa6\xa8\xae\xaf\xb4\xb6\xb7\xbc\xbf\xc5\xe7\xef"),
    (24, b"\x09\x8e\x90\x91\x94\x9f\xab\xce\xd7\xe1\xec\xed"),
    (25, b"\xc7\xcf\xea\xeb"),
    (26, b"\xc0\xc1\xc8\xc9\xca\xcd\xd2\xd5\xda\xdb\xee\xf0\xf2\xf3\xff"),
    (27, b"\xcb\xcc\xd3\xd4\xd6\xdd\xde\xdf\xf1\xf4\xf5\xf6\xf7\xf8\xfa\xfb\xfc\xfd\xfe"),
    (28, b"\x02\x03\x04\x05\x06\x07\x08\x0b\x0c\x0e\x0f\x10\x11\x12\x13\x14\x15\x17\x18\x19\x1a\x1b\x1c\x1d\x1e\x1f\x7f\xdc\xf9"),
    (30, b"\x0a\x0d\x16"),
];

/// The longest code, EOS's.
const MAX_LEN: usize = 30;

/// The end-of-string symbol; finding it inside a string is an error (RFC 7541 §5.2).
const EOS: u16 = 256;

/// The canonical code in the shape the decoder walks: how many codes each length has, and the
/// symbols in code order.
struct Canonical {
    counts: [u32; MAX_LEN + 1],
    symbols: [u16; 257],
}

const CANONICAL: Canonical = canonical();

const fn canonical() -> Canonical {
    let mut counts = [0u32; MAX_LEN + 1];
    let mut symbols = [0u16; 257];
    let mut next = 0;
    let mut g = 0;
    while g < SYMBOLS_BY_LENGTH.len() {
        let (len, group) = SYMBOLS_BY_LENGTH[g];
        let mut i = 0;
        while i < group.len() {
            symbols[next] = group[i] as u16;
            next += 1;
            counts[len] += 1;
            i += 1;
        }
        g += 1;
    }
    symbols[next] = EOS;
    counts[MAX_LEN] += 1;
    Canonical { counts, symbols }
}

/// Why a Huffman-coded string is invalid.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum HuffmanError {
    #[error("huffman string contains the EOS symbol")]
    Eos,
    #[error("huffman string ends with {0} bits of padding (at most 7 allowed)")]
    PaddingTooLong(usize),
    #[error("huffman string padding is not the most significant bits of EOS (all ones)")]
    PaddingNotOnes,
}

/// Decodes a Huffman-coded string literal, appending the bytes to `out`.
pub(crate) fn decode(input: &[u8], out: &mut Vec<u8>) -> Result<(), HuffmanError> {
    // The code being read: its bits so far, its length, the first code and the index of the
    // first symbol of that length, and whether every bit so far was a one (valid padding).
    let mut code: u32 = 0;
    let mut len = 0;
    let mut first: u32 = 0;
    let mut index: usize = 0;
    let mut all_ones = true;
    for byte in input {
        for shift in (0..8).rev() {
            let bit = u32::from((byte >> shift) & 1);
            code |= bit;
            len += 1;
            all_ones &= bit == 1;
            let count = CANONICAL.counts.get(len).copied().unwrap_or(0);
            // `code - first` is the code's rank among the codes of this length.
            match code.checked_sub(first).filter(|rank| *rank < count) {
                Some(rank) => {
                    let symbol = usize::try_from(rank)
                        .ok()
                        .and_then(|rank| CANONICAL.symbols.get(index + rank).copied())
                        .unwrap_or(EOS);
                    // Every symbol but EOS is a byte.
                    let Ok(byte) = u8::try_from(symbol) else {
                        return Err(HuffmanError::Eos);
                    };
                    out.push(byte);
                    (code, len, first, index, all_ones) = (0, 0, 0, 0, true);
                }
                None => {
                    // The code table is complete (Kraft sum exactly 1, checked by a test), so
                    // a code never grows past MAX_LEN bits; EOS, all ones, is matched above.
                    index += count as usize;
                    first = (first + count) << 1;
                    code <<= 1;
                }
            }
        }
    }
    if len > 7 {
        return Err(HuffmanError::PaddingTooLong(len));
    }
    if !all_ones {
        return Err(HuffmanError::PaddingNotOnes);
    }
    Ok(())
}

/// The canonical code of every symbol, as (code, length): what an encoder needs.
pub(crate) fn codes() -> Vec<(u32, usize)> {
    let mut lengths = vec![0usize; 257];
    for (len, group) in SYMBOLS_BY_LENGTH {
        for &b in *group {
            lengths[usize::from(b)] = *len;
        }
    }
    lengths[256] = MAX_LEN;
    let mut codes = vec![(0u32, 0usize); 257];
    let (mut code, mut prev_len) = (0u32, 0usize);
    for (n, &symbol) in CANONICAL.symbols.iter().enumerate() {
        let len = lengths[usize::from(symbol)];
        if n > 0 {
            code = (code + 1) << (len - prev_len);
        }
        codes[usize::from(symbol)] = (code, len);
        prev_len = len;
    }
    codes
}

/// Huffman-encodes `input` (tests use this to build what a grpc-go client sends, and the fuzz
/// checks to round-trip arbitrary bytes; the rewriter itself writes raw strings).
// The casts take the low byte of the bit accumulator on purpose.
#[allow(clippy::cast_possible_truncation)]
pub(crate) fn encode(input: &[u8]) -> Vec<u8> {
    let codes = codes();
    let mut out = Vec::new();
    let (mut acc, mut bits) = (0u64, 0usize);
    for &b in input {
        let (code, len) = codes[usize::from(b)];
        acc = (acc << len) | u64::from(code);
        bits += len;
        while bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
    }
    if bits > 0 {
        let pad = 8 - bits;
        out.push(((acc << pad) | ((1 << pad) - 1)) as u8);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    fn decoded(input: &[u8]) -> Result<Vec<u8>, HuffmanError> {
        let mut out = Vec::new();
        decode(input, &mut out).map(|()| out)
    }

    #[test]
    fn table_lists_every_byte_once_in_order_and_is_a_complete_code() {
        let mut seen = [0u8; 256];
        // Kraft sum in units of 2^-30: exactly 2^30 for a complete prefix code.
        let mut kraft: u64 = 1; // EOS, one 30-bit code
        for (len, group) in SYMBOLS_BY_LENGTH {
            assert!(
                group.windows(2).all(|w| w[0] < w[1]),
                "group {len} not ascending"
            );
            for &b in *group {
                seen[usize::from(b)] += 1;
                kraft += 1 << (MAX_LEN - len);
            }
        }
        assert!(seen.iter().all(|&n| n == 1), "every byte exactly once");
        assert_eq!(kraft, 1 << MAX_LEN);
    }

    #[test]
    fn codes_match_rfc_7541_appendix_b_anchors() {
        let codes = codes();
        assert_eq!(codes[usize::from(b'0')], (0x0, 5));
        assert_eq!(codes[usize::from(b' ')], (0x14, 6));
        assert_eq!(codes[usize::from(b':')], (0x5c, 7));
        assert_eq!(codes[usize::from(b'&')], (0xf8, 8));
        assert_eq!(codes[0], (0x1ff8, 13));
        assert_eq!(codes[usize::from(b'\\')], (0x7fff0, 19));
        assert_eq!(codes[255], (0x3ffffee, 26));
        assert_eq!(codes[256], (0x3fff_ffff, 30));
    }

    /// The Huffman-coded strings of RFC 7541 Appendix C.4 and C.6.
    const RFC_EXAMPLES: &[(&str, &str)] = &[
        ("www.example.com", "f1e3c2e5f23a6ba0ab90f4ff"),
        ("no-cache", "a8eb10649cbf"),
        ("custom-key", "25a849e95ba97d7f"),
        ("custom-value", "25a849e95bb8e8b4bf"),
        ("302", "6402"),
        ("private", "aec3771a4b"),
        (
            "Mon, 21 Oct 2013 20:13:21 GMT",
            "d07abe941054d444a8200595040b8166e082a62d1bff",
        ),
        (
            "https://www.example.com",
            "9d29ad171863c78f0b97c8e9ae82ae43d3",
        ),
    ];

    #[test]
    fn decodes_the_rfc_examples() {
        for (text, coded) in RFC_EXAMPLES {
            assert_eq!(decoded(&hex(coded)).unwrap(), text.as_bytes(), "{text}");
        }
    }

    #[test]
    fn test_encoder_reproduces_the_rfc_examples() {
        for (text, coded) in RFC_EXAMPLES {
            assert_eq!(encode(text.as_bytes()), hex(coded), "{text}");
        }
    }

    #[test]
    fn every_byte_value_round_trips() {
        let all: Vec<u8> = (0..=255).collect();
        assert_eq!(decoded(&encode(&all)).unwrap(), all);
        for b in 0..=255u8 {
            assert_eq!(decoded(&encode(&[b])).unwrap(), [b], "byte {b:#04x}");
        }
    }

    #[test]
    fn empty_string_decodes_empty() {
        assert_eq!(decoded(&[]).unwrap(), b"");
    }

    #[test]
    fn padding_longer_than_seven_bits_is_rejected() {
        assert_eq!(decoded(&[0xff]), Err(HuffmanError::PaddingTooLong(8)));
        // "0" (00000) then a full byte of ones: 11 bits of padding.
        assert_eq!(
            decoded(&[0x07, 0xff]),
            Err(HuffmanError::PaddingTooLong(11))
        );
    }

    #[test]
    fn padding_that_is_not_ones_is_rejected() {
        // "0" (00000) padded with 000.
        assert_eq!(decoded(&[0x00]), Err(HuffmanError::PaddingNotOnes));
    }

    #[test]
    fn eos_inside_a_string_is_rejected() {
        assert_eq!(decoded(&[0xff, 0xff, 0xff, 0xff]), Err(HuffmanError::Eos));
    }
}
