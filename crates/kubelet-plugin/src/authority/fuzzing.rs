//! The properties the fuzz targets (`crates/kubelet-plugin/fuzz`) check, as functions that
//! panic when one breaks. They live in the crate so that they can see the rewriter's internals
//! without making them an API, and so that the crate's own tests run them on every build. Not an
//! API: hidden from the docs, and changed whenever the targets need.
//!
//! [`rewriter`]: any client byte stream is rewritten or refused, never a panic; however the
//! stream is cut into reads, the verdict is the same, and so is the output of an accepted stream
//! (a refused one may have passed a little more or less before the refusal, such as part of a
//! wrong preface; the connection closes there either way); and an accepted stream
//! reaches the server as the client meant it: every frame other than HEADERS and CONTINUATION
//! byte for byte and in order, every header block with the same fields, stream, END_STREAM and
//! priority, except an `:authority` the server would refuse, which becomes `localhost`, and in
//! frames no larger than any server accepts.
//!
//! [`hpack`]: any header block decodes or fails cleanly; what decodes, re-encoded, decodes to the
//! same fields with a fresh decoder (the re-encoding never relies on the dynamic table); any
//! Huffman string decodes or fails cleanly, and any byte string survives Huffman coding.

use super::{
    frames::{AuthorityRewriter, PREFACE, REPLACEMENT_AUTHORITY, RewriteError},
    hpack::{self, HeaderField},
    huffman, server_limits,
};

// The frame layout, written out again here rather than borrowed from the rewriter: the check is
// a second reading of RFC 9113, not the first one repeated.
const HEADERS: u8 = 0x1;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;
/// The largest frame payload every HTTP/2 server accepts (RFC 9113 §4.2).
const MIN_MAX_FRAME_SIZE: usize = 16_384;

/// What one run of the rewriter produced.
#[derive(Debug, PartialEq, Eq)]
struct Run {
    output: Vec<u8>,
    error: Option<RewriteError>,
    rewritten: u64,
}

fn run(input: &[u8], read_size: usize) -> Run {
    let mut rewriter = AuthorityRewriter::new(server_limits());
    let mut output = Vec::new();
    let mut error = None;
    for read in input.chunks(read_size.max(1)) {
        let result = rewriter.feed(read);
        output.extend_from_slice(&rewriter.output().split());
        if let Err(e) = result {
            error = Some(e);
            break;
        }
    }
    Run {
        output,
        error,
        rewritten: rewriter.rewritten(),
    }
}

/// One frame: type, flags, stream, payload.
type Frame = (u8, u8, u32, Vec<u8>);

/// The complete frames of `bytes` (a trailing incomplete one is left out).
fn frames(mut bytes: &[u8]) -> Vec<Frame> {
    let mut out = Vec::new();
    while let Some((header, rest)) = bytes.split_first_chunk::<9>() {
        let [l0, l1, l2, kind, flags, s0, s1, s2, s3] = *header;
        let length = usize::from(l0) << 16 | usize::from(l1) << 8 | usize::from(l2);
        let Some(payload) = rest.get(..length) else {
            break;
        };
        let stream = u32::from_be_bytes([s0 & 0x7f, s1, s2, s3]);
        out.push((kind, flags, stream, payload.to_vec()));
        bytes = &rest[length..];
    }
    out
}

/// A complete header block as the server decodes it.
#[derive(Debug, PartialEq, Eq)]
struct Block {
    stream: u32,
    end_stream: bool,
    priority: Option<Vec<u8>>,
    fields: Vec<HeaderField>,
}

/// The other frames and the complete header blocks of a stream of frames, decoded with one
/// connection-wide decoder. `None` if a block does not decode.
fn split(frames: &[Frame], max_list_size: usize) -> Option<(Vec<Frame>, Vec<Block>)> {
    let mut decoder = hpack::Decoder::new(server_limits().header_table_size);
    let mut others = Vec::new();
    let mut blocks = Vec::new();
    // The block being collected (its fields still empty) and its fragments so far.
    let mut open: Option<(Block, Vec<u8>)> = None;
    for frame in frames {
        let (kind, flags, stream, payload) = frame;
        let (fragment, flags) = match *kind {
            HEADERS => {
                let mut body = payload.as_slice();
                let mut pad = 0;
                if flags & PADDED != 0 {
                    let (&len, rest) = body.split_first()?;
                    pad = usize::from(len);
                    body = rest;
                }
                let mut priority = None;
                if flags & PRIORITY != 0 {
                    let (fields, rest) = body.split_first_chunk::<5>()?;
                    priority = Some(fields.to_vec());
                    body = rest;
                }
                let fragment = body.get(..body.len().checked_sub(pad)?)?;
                let block = Block {
                    stream: *stream,
                    end_stream: flags & END_STREAM != 0,
                    priority,
                    fields: Vec::new(),
                };
                open = Some((block, Vec::new()));
                (fragment, *flags)
            }
            CONTINUATION => (payload.as_slice(), *flags),
            _ => {
                others.push(frame.clone());
                continue;
            }
        };
        open.as_mut()?.1.extend_from_slice(fragment);
        if flags & END_HEADERS != 0 {
            let (mut block, fragment) = open.take()?;
            block.fields = decoder.decode(&fragment, max_list_size).ok()?;
            blocks.push(block);
        }
    }
    Some((others, blocks))
}

/// Checks the rewriter on one client byte stream. The first byte chooses the read size (its low
/// seven bits plus one) and whether the client preface is put in front of the rest (high bit
/// clear), so that the fuzzer spends its time on frames rather than on finding the preface.
pub fn rewriter(data: &[u8]) {
    let Some((&choice, rest)) = data.split_first() else {
        return;
    };
    let read_size = usize::from(choice & 0x7f) + 1;
    let mut input = Vec::with_capacity(PREFACE.len() + rest.len());
    if choice & 0x80 == 0 {
        input.extend_from_slice(PREFACE);
    }
    input.extend_from_slice(rest);

    let whole = run(&input, input.len());
    let cut = run(&input, read_size);
    if whole.error.is_some() || cut.error.is_some() {
        assert_eq!(
            whole.error, cut.error,
            "the verdict on reads of {read_size}"
        );
        assert!(
            whole.output.starts_with(&cut.output) || cut.output.starts_with(&whole.output),
            "a refused stream passed different bytes on reads of {read_size}"
        );
        return;
    }
    assert_eq!(whole, cut, "the same stream cut into reads of {read_size}");
    let Some(body) = input.strip_prefix(PREFACE.as_slice()) else {
        // Accepted without a whole preface: only a prefix of it, passed through.
        assert!(PREFACE.starts_with(&input) && whole.output == input);
        return;
    };
    let output = whole
        .output
        .strip_prefix(PREFACE.as_slice())
        .expect("the preface passes through");

    let sent = frames(body);
    let seen = frames(output);
    for (kind, flags, _, payload) in &seen {
        if matches!(*kind, HEADERS | CONTINUATION) {
            assert!(
                payload.len() <= MIN_MAX_FRAME_SIZE,
                "a header frame of {}",
                payload.len()
            );
            assert_eq!(flags & PADDED, 0, "padding is dropped");
        }
    }
    let (sent_others, sent_blocks) =
        split(&sent, server_limits().max_list_size).expect("an accepted block decodes");
    let (seen_others, seen_blocks) =
        split(&seen, usize::MAX).expect("the server decodes what it is given");
    // (A frame still arriving is forwarded as it comes; incomplete, it is in neither list.)
    assert_eq!(seen_others, sent_others);

    let mut rewritten = 0;
    let expected: Vec<Block> = sent_blocks
        .into_iter()
        .map(|mut block| {
            for field in &mut block.fields {
                let refused = field.name.as_ref() == b":authority"
                    && http::uri::Authority::try_from(field.value.as_ref()).is_err();
                if refused {
                    field.value = bytes::Bytes::from_static(REPLACEMENT_AUTHORITY);
                    rewritten += 1;
                }
            }
            block
        })
        .collect();
    assert_eq!(seen_blocks, expected);
    assert_eq!(whole.rewritten, rewritten);
}

/// Checks the HPACK decoder and encoder and the Huffman codec on one input.
pub fn hpack(data: &[u8]) {
    let limits = server_limits();
    let mut decoder = hpack::Decoder::new(limits.header_table_size);
    if let Ok(fields) = decoder.decode(data, limits.max_list_size) {
        let mut encoded = Vec::new();
        hpack::encode(&fields, &mut encoded);
        let again = hpack::Decoder::new(limits.header_table_size)
            .decode(&encoded, usize::MAX)
            .expect("a re-encoded block decodes");
        assert_eq!(again, fields);
    }
    let mut decoded = Vec::new();
    let _ = huffman::decode(data, &mut decoded);
    let mut decoded = Vec::new();
    huffman::decode(&huffman::encode(data), &mut decoded).expect("Huffman coding round-trips");
    assert_eq!(decoded, data);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::authority::hpack::TestEncoder;

    fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let len = u32::try_from(payload.len()).unwrap().to_be_bytes();
        let mut out = len[1..].to_vec();
        out.extend_from_slice(&[kind, flags]);
        out.extend_from_slice(&stream.to_be_bytes());
        out.extend_from_slice(payload);
        out
    }

    /// The kind of traffic the kubelet sends: requests on two streams with the socket path as
    /// `:authority`, a padded and prioritized HEADERS, a block split by CONTINUATION, data,
    /// settings, a frame cut off at the end.
    fn kubelet_like() -> Vec<u8> {
        let mut enc = TestEncoder::new();
        let fields = |authority: &'static str| {
            vec![
                (":method", "POST"),
                (":scheme", "http"),
                (":path", "/pluginregistration.Registration/GetInfo"),
                (":authority", authority),
                ("content-type", "application/grpc"),
                ("te", "trailers"),
            ]
        };
        let first = enc.encode(&fields(
            "%2Fvar%2Flib%2Fkubelet%2Fplugins_registry%2Fx-reg.sock",
        ));
        let second = enc.encode(&fields("localhost"));
        let mut padded = vec![3];
        padded.extend_from_slice(&[0, 0, 0, 1, 16]);
        padded.extend_from_slice(&second);
        padded.extend_from_slice(&[0; 3]);
        let mut input = vec![0]; // read size 1, preface in front
        input.extend(frame(0x4, 0, 0, &[0, 3, 0, 0, 0, 100]));
        let (a, b) = first.split_at(first.len() / 2);
        input.extend(frame(HEADERS, 0, 1, a));
        input.extend(frame(CONTINUATION, END_HEADERS, 1, b));
        input.extend(frame(0x0, END_STREAM, 1, b"\0\0\0\0\x02hi"));
        input.extend(frame(
            HEADERS,
            END_HEADERS | PADDED | PRIORITY | END_STREAM,
            3,
            &padded,
        ));
        input.extend(&frame(0x0, 0, 3, &[7; 40])[..20]);
        input
    }

    #[test]
    fn the_checks_hold_on_kubelet_like_traffic() {
        let input = kubelet_like();
        for read_size in [0u8, 1, 8, 127] {
            let mut data = input.clone();
            data[0] = read_size;
            rewriter(&data);
        }
        // The rewrite happened, so the comparisons above were not of two empty outputs.
        let mut with_preface = PREFACE.to_vec();
        with_preface.extend_from_slice(&input[1..]);
        assert_eq!(run(&with_preface, 5).rewritten, 1);
        hpack(&input[1..]);
        hpack(&TestEncoder::new().encode(&[(":authority", "a b"), ("x", "y")]));
    }

    #[test]
    fn a_wrong_preface_is_refused_however_it_is_cut() {
        // Found by the fuzzer in the check itself: read byte by byte, the matching start of a
        // wrong preface passes before the refusal; read whole, nothing does.
        rewriter(b"\x80PRI * HTTP/1.1\r\n");
        assert_eq!(run(b"PRX", 1).output, b"PR");
        assert_eq!(run(b"PRX", 3).output, b"");
    }

    proptest::proptest! {
        #[test]
        fn the_checks_hold_on_arbitrary_bytes(
            data in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..512),
        ) {
            rewriter(&data);
            hpack(&data);
        }
    }
}
