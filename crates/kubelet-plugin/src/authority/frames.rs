//! The client-to-server half of one HTTP/2 connection, rewritten frame by frame (sans IO).
//!
//! Bytes go in as the client sent them and come out as the h2 server should see them. Every frame
//! except HEADERS and CONTINUATION passes through byte for byte, streamed as it arrives. A header
//! block (one HEADERS frame and the CONTINUATION frames that complete it) is collected whole,
//! decoded with the connection's HPACK decoder, its `:authority` replaced when it is not a valid
//! authority, re-encoded without the dynamic table, and written out again as one HEADERS frame and
//! as many CONTINUATION frames as the re-encoding needs. On the way:
//!
//! - padding is dropped (it only hides lengths; the server never sees it anyway once decoded);
//! - the priority fields and the END_STREAM flag are kept on the new HEADERS frame;
//! - output frames carry at most 16 384 payload bytes, the smallest `SETTINGS_MAX_FRAME_SIZE` any
//!   peer may advertise (RFC 9113 §4.2), so they fit whatever the server advertised;
//! - input frames larger than the server's advertised maximum are refused, as the server would.
//!
//! Anything that breaks the framing rules the rewrite depends on (a header block interrupted by
//! another frame, a CONTINUATION out of place, a block that does not decode, a PUSH_PROMISE from
//! a client) is a connection error in HTTP/2 anyway; the rewriter reports it and the connection is
//! closed. It never guesses: after an error it accepts no more input.

use bytes::{BufMut, BytesMut};
use tracing::debug;

use super::hpack::{self, HeaderField};

/// What every HTTP/2 client sends first (RFC 9113 §3.4).
pub(crate) const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

const FRAME_HEADER_LEN: usize = 9;

/// Frame types (RFC 9113 §6) the rewriter looks at.
const HEADERS: u8 = 0x1;
const PUSH_PROMISE: u8 = 0x5;
const CONTINUATION: u8 = 0x9;

/// Frame flags of HEADERS and CONTINUATION.
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;

/// The largest payload of a frame we write: the minimum `SETTINGS_MAX_FRAME_SIZE`.
const OUT_FRAME_SIZE: usize = 16_384;

/// What the value of a `:authority` the server cannot parse becomes: the name Kubernetes itself
/// uses as the authority of unix-socket dials (and grpc-go used before 1.57).
pub(crate) const REPLACEMENT_AUTHORITY: &[u8] = b"localhost";

/// Bounds on what the rewriter buffers, matched to the server it sits in front of.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    /// The server's `SETTINGS_MAX_FRAME_SIZE`: larger HEADERS or CONTINUATION frames are refused.
    pub max_frame_size: usize,
    /// The server's `SETTINGS_HEADER_TABLE_SIZE`: the largest HPACK table the client may use.
    pub header_table_size: usize,
    /// The largest compressed header block collected.
    pub max_block_size: usize,
    /// The largest decoded header list (name + value + 32 per field).
    pub max_list_size: usize,
}

/// Why the client's byte stream cannot be rewritten. All are connection errors.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum RewriteError {
    #[error("connection does not start with the HTTP/2 client preface")]
    BadPreface,
    #[error(
        "frame type {kind:#x} of {length} bytes on stream {stream_id} exceeds the maximum frame size {max}"
    )]
    FrameTooLarge {
        kind: u8,
        length: usize,
        stream_id: u32,
        max: usize,
    },
    #[error("header block on stream {stream_id} exceeds {limit} bytes")]
    BlockTooLarge { stream_id: u32, limit: usize },
    #[error(
        "header block on stream {expected} interrupted by frame type {kind:#x} on stream {stream_id}"
    )]
    ExpectedContinuation {
        expected: u32,
        kind: u8,
        stream_id: u32,
    },
    #[error("CONTINUATION frame on stream {stream_id} without an open header block")]
    UnexpectedContinuation { stream_id: u32 },
    #[error("HEADERS frame on stream 0")]
    HeadersOnStreamZero,
    #[error("HEADERS frame on stream {stream_id} is shorter than its padding and priority fields")]
    MalformedHeaders { stream_id: u32 },
    #[error("PUSH_PROMISE from a client on stream {stream_id} (only servers push)")]
    PushPromise { stream_id: u32 },
    #[error("header block on stream {stream_id} does not decode: {error}")]
    Hpack {
        stream_id: u32,
        error: hpack::HpackError,
    },
    #[error("the connection already failed")]
    AlreadyFailed,
}

#[derive(Debug, Clone, Copy)]
struct FrameHeader {
    length: usize,
    kind: u8,
    flags: u8,
    stream_id: u32,
}

impl FrameHeader {
    fn parse(b: &[u8; FRAME_HEADER_LEN]) -> Self {
        let [l0, l1, l2, kind, flags, s0, s1, s2, s3] = *b;
        Self {
            length: usize::from(l0) << 16 | usize::from(l1) << 8 | usize::from(l2),
            kind,
            flags,
            // The top bit is reserved and ignored on receipt (RFC 9113 §4.1).
            stream_id: u32::from_be_bytes([s0 & 0x7f, s1, s2, s3]),
        }
    }
}

#[derive(Debug)]
enum State {
    /// Matching the client preface; `matched` bytes so far.
    Preface { matched: usize },
    /// Collecting a frame header.
    FrameHeader {
        buf: [u8; FRAME_HEADER_LEN],
        filled: usize,
    },
    /// Passing a frame's payload through; `remaining` bytes to go.
    Forward { remaining: usize },
    /// Collecting the payload of a HEADERS or CONTINUATION frame.
    Collect {
        frame: FrameHeader,
        payload: Vec<u8>,
    },
    /// An error was reported; nothing more is accepted.
    Failed,
}

/// A header block that has started but not yet ended (no END_HEADERS seen).
#[derive(Debug)]
struct OpenBlock {
    stream_id: u32,
    end_stream: bool,
    priority: Option<[u8; 5]>,
    fragment: Vec<u8>,
}

/// Rewrites the client-to-server bytes of one connection.
#[derive(Debug)]
pub(crate) struct AuthorityRewriter {
    limits: Limits,
    state: State,
    decoder: hpack::Decoder,
    block: Option<OpenBlock>,
    out: BytesMut,
    rewritten: u64,
}

impl AuthorityRewriter {
    pub(crate) fn new(limits: Limits) -> Self {
        Self {
            limits,
            state: State::Preface { matched: 0 },
            decoder: hpack::Decoder::new(limits.header_table_size),
            block: None,
            out: BytesMut::new(),
            rewritten: 0,
        }
    }

    /// Bytes ready for the server. The caller takes (advances past) what it consumes.
    pub(crate) fn output(&mut self) -> &mut BytesMut {
        &mut self.out
    }

    /// How many `:authority` values were replaced on this connection so far.
    pub(crate) fn rewritten(&self) -> u64 {
        self.rewritten
    }

    /// Takes the next bytes the client sent. Output produced before an error stays in
    /// [`Self::output`]; after an error every call fails.
    pub(crate) fn feed(&mut self, input: &[u8]) -> Result<(), RewriteError> {
        let result = self.feed_inner(input);
        if result.is_err() {
            self.state = State::Failed;
        }
        result
    }

    fn feed_inner(&mut self, mut input: &[u8]) -> Result<(), RewriteError> {
        while !input.is_empty() {
            match &mut self.state {
                State::Failed => return Err(RewriteError::AlreadyFailed),
                State::Preface { matched } => {
                    let n = (PREFACE.len() - *matched).min(input.len());
                    let (head, rest) = input.split_at(n);
                    if PREFACE.get(*matched..*matched + n) != Some(head) {
                        return Err(RewriteError::BadPreface);
                    }
                    self.out.extend_from_slice(head);
                    *matched += n;
                    input = rest;
                    if *matched == PREFACE.len() {
                        self.state = State::FrameHeader {
                            buf: [0; FRAME_HEADER_LEN],
                            filled: 0,
                        };
                    }
                }
                State::FrameHeader { buf, filled } => {
                    let n = (FRAME_HEADER_LEN - *filled).min(input.len());
                    let (head, rest) = input.split_at(n);
                    if let Some(dst) = buf.get_mut(*filled..*filled + n) {
                        dst.copy_from_slice(head);
                    }
                    *filled += n;
                    input = rest;
                    if *filled == FRAME_HEADER_LEN {
                        let raw = *buf;
                        self.start_frame(&raw)?;
                    }
                }
                State::Forward { remaining } => {
                    let n = (*remaining).min(input.len());
                    let (head, rest) = input.split_at(n);
                    self.out.extend_from_slice(head);
                    *remaining -= n;
                    input = rest;
                    if *remaining == 0 {
                        self.next_frame();
                    }
                }
                State::Collect { frame, payload } => {
                    let n = (frame.length - payload.len()).min(input.len());
                    let (head, rest) = input.split_at(n);
                    payload.extend_from_slice(head);
                    input = rest;
                    if payload.len() == frame.length {
                        let frame = *frame;
                        let payload = std::mem::take(payload);
                        self.next_frame();
                        self.end_frame(frame, &payload)?;
                    }
                }
            }
        }
        Ok(())
    }

    fn next_frame(&mut self) {
        self.state = State::FrameHeader {
            buf: [0; FRAME_HEADER_LEN],
            filled: 0,
        };
    }

    /// A frame header is complete: decide what to do with the payload.
    fn start_frame(&mut self, raw: &[u8; FRAME_HEADER_LEN]) -> Result<(), RewriteError> {
        let frame = FrameHeader::parse(raw);
        if let Some(block) = &self.block {
            // Only a CONTINUATION of the same stream may follow an unfinished block (§6.10).
            if frame.kind != CONTINUATION || frame.stream_id != block.stream_id {
                return Err(RewriteError::ExpectedContinuation {
                    expected: block.stream_id,
                    kind: frame.kind,
                    stream_id: frame.stream_id,
                });
            }
        }
        match frame.kind {
            HEADERS | CONTINUATION => {
                if frame.kind == HEADERS && frame.stream_id == 0 {
                    return Err(RewriteError::HeadersOnStreamZero);
                }
                if frame.kind == CONTINUATION && self.block.is_none() {
                    return Err(RewriteError::UnexpectedContinuation {
                        stream_id: frame.stream_id,
                    });
                }
                if frame.length > self.limits.max_frame_size {
                    return Err(RewriteError::FrameTooLarge {
                        kind: frame.kind,
                        length: frame.length,
                        stream_id: frame.stream_id,
                        max: self.limits.max_frame_size,
                    });
                }
                if frame.length == 0 {
                    self.next_frame();
                    return self.end_frame(frame, &[]);
                }
                self.state = State::Collect {
                    frame,
                    payload: Vec::with_capacity(frame.length),
                };
            }
            PUSH_PROMISE => {
                return Err(RewriteError::PushPromise {
                    stream_id: frame.stream_id,
                });
            }
            _ => {
                self.out.extend_from_slice(raw);
                if frame.length == 0 {
                    self.next_frame();
                } else {
                    self.state = State::Forward {
                        remaining: frame.length,
                    };
                }
            }
        }
        Ok(())
    }

    /// A HEADERS or CONTINUATION payload is complete.
    fn end_frame(&mut self, frame: FrameHeader, payload: &[u8]) -> Result<(), RewriteError> {
        if frame.kind == HEADERS {
            let malformed = RewriteError::MalformedHeaders {
                stream_id: frame.stream_id,
            };
            let mut body = payload;
            let mut pad_len = 0;
            if frame.flags & PADDED != 0 {
                let (&len, rest) = body.split_first().ok_or(malformed.clone())?;
                pad_len = usize::from(len);
                body = rest;
            }
            let mut priority = None;
            if frame.flags & PRIORITY != 0 {
                let (fields, rest) = body.split_first_chunk::<5>().ok_or(malformed.clone())?;
                priority = Some(*fields);
                body = rest;
            }
            // Padding longer than what is left is a connection error (§6.2).
            let fragment_len = body.len().checked_sub(pad_len).ok_or(malformed)?;
            let fragment = body.get(..fragment_len).unwrap_or_default();
            self.block = Some(OpenBlock {
                stream_id: frame.stream_id,
                end_stream: frame.flags & END_STREAM != 0,
                priority,
                fragment: fragment.to_vec(),
            });
        } else if let Some(block) = &mut self.block {
            block.fragment.extend_from_slice(payload);
        }
        if let Some(block) = &self.block
            && block.fragment.len() > self.limits.max_block_size
        {
            return Err(RewriteError::BlockTooLarge {
                stream_id: block.stream_id,
                limit: self.limits.max_block_size,
            });
        }
        if frame.flags & END_HEADERS != 0
            && let Some(block) = self.block.take()
        {
            self.end_block(block)?;
        }
        Ok(())
    }

    /// A header block is complete: decode, fix `:authority`, re-encode, write out.
    fn end_block(&mut self, block: OpenBlock) -> Result<(), RewriteError> {
        let mut fields = self
            .decoder
            .decode(&block.fragment, self.limits.max_list_size)
            .map_err(|error| RewriteError::Hpack {
                stream_id: block.stream_id,
                error,
            })?;
        for field in &mut fields {
            if needs_rewrite(field) {
                debug!(
                    stream = block.stream_id,
                    authority = %String::from_utf8_lossy(&field.value),
                    "replacing an :authority the HTTP/2 server would reject"
                );
                field.value = bytes::Bytes::from_static(REPLACEMENT_AUTHORITY);
                self.rewritten += 1;
            }
        }
        let mut encoded = Vec::with_capacity(block.fragment.len() * 2);
        hpack::encode(&fields, &mut encoded);
        self.write_block(&block, &encoded);
        Ok(())
    }

    /// Writes a header block as HEADERS plus CONTINUATION frames of at most [`OUT_FRAME_SIZE`].
    fn write_block(&mut self, block: &OpenBlock, encoded: &[u8]) {
        let priority_len = if block.priority.is_some() { 5 } else { 0 };
        let first_len = encoded.len().min(OUT_FRAME_SIZE - priority_len);
        let (first, mut rest) = encoded.split_at(first_len);
        let mut flags = 0;
        if block.end_stream {
            flags |= END_STREAM;
        }
        if block.priority.is_some() {
            flags |= PRIORITY;
        }
        if rest.is_empty() {
            flags |= END_HEADERS;
        }
        self.write_frame_header(priority_len + first.len(), HEADERS, flags, block.stream_id);
        if let Some(priority) = &block.priority {
            self.out.extend_from_slice(priority);
        }
        self.out.extend_from_slice(first);
        while !rest.is_empty() {
            let (chunk, tail) = rest.split_at(rest.len().min(OUT_FRAME_SIZE));
            let flags = if tail.is_empty() { END_HEADERS } else { 0 };
            self.write_frame_header(chunk.len(), CONTINUATION, flags, block.stream_id);
            self.out.extend_from_slice(chunk);
            rest = tail;
        }
    }

    fn write_frame_header(&mut self, length: usize, kind: u8, flags: u8, stream_id: u32) {
        // `length` is at most OUT_FRAME_SIZE, so it fits the 24-bit field.
        let len = u32::try_from(length).unwrap_or(0).to_be_bytes();
        self.out.put_slice(&len[1..]);
        self.out.put_u8(kind);
        self.out.put_u8(flags);
        self.out.put_u32(stream_id);
    }
}

/// Whether this is an `:authority` the HTTP/2 server would reject. The check is the one h2
/// itself applies (`http::uri::Authority`), so exactly the values h2 resets a stream for are
/// replaced and every other value reaches the server unchanged.
fn needs_rewrite(field: &HeaderField) -> bool {
    field.name.as_ref() == b":authority"
        && http::uri::Authority::try_from(field.value.as_ref()).is_err()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::authority::hpack::TestEncoder;

    const LIMITS: Limits = Limits {
        max_frame_size: 16_384,
        header_table_size: 4096,
        max_block_size: 64 * 1024,
        max_list_size: 64 * 1024,
    };

    const SOCKET_AUTHORITY: &str = "%2Fvar%2Flib%2Fkubelet%2Fplugins_registry%2Fx-reg.sock";

    fn frame(kind: u8, flags: u8, stream_id: u32, payload: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        let len = u32::try_from(payload.len()).unwrap().to_be_bytes();
        out.extend_from_slice(&len[1..]);
        out.extend_from_slice(&[kind, flags]);
        out.extend_from_slice(&stream_id.to_be_bytes());
        out.extend_from_slice(payload);
        out
    }

    fn request(authority: &str, path: &str) -> Vec<(&'static str, String)> {
        vec![
            (":method", "POST".into()),
            (":scheme", "http".into()),
            (":path", path.into()),
            (":authority", authority.into()),
            ("content-type", "application/grpc".into()),
            ("user-agent", "grpc-go/1.85.0".into()),
            ("te", "trailers".into()),
        ]
    }

    fn encode(enc: &mut TestEncoder, fields: &[(&'static str, String)]) -> Vec<u8> {
        let borrowed: Vec<(&str, &str)> = fields.iter().map(|(n, v)| (*n, v.as_str())).collect();
        enc.encode(&borrowed)
    }

    /// Splits the rewriter's output into frames: (type, flags, stream, payload).
    fn frames(mut bytes: &[u8]) -> Vec<(u8, u8, u32, Vec<u8>)> {
        let mut out = Vec::new();
        while !bytes.is_empty() {
            let header: [u8; 9] = bytes[..9].try_into().unwrap();
            let h = FrameHeader::parse(&header);
            out.push((
                h.kind,
                h.flags,
                h.stream_id,
                bytes[9..9 + h.length].to_vec(),
            ));
            bytes = &bytes[9 + h.length..];
        }
        out
    }

    /// Decodes the header blocks of rewritten output with a fresh decoder, as the server does,
    /// checking on the way that the output never relies on the dynamic table.
    fn server_view(output: &[u8]) -> Vec<(u32, Vec<(String, String)>)> {
        let body = output
            .strip_prefix(PREFACE.as_slice())
            .expect("preface passes through");
        let mut decoder = hpack::Decoder::new(4096);
        let mut blocks = Vec::new();
        let mut open: Option<(u32, Vec<u8>)> = None;
        for (kind, flags, stream, payload) in frames(body) {
            let fragment = match kind {
                HEADERS => {
                    assert!(open.is_none());
                    assert_eq!(flags & PADDED, 0, "padding is dropped");
                    let skip = if flags & PRIORITY != 0 { 5 } else { 0 };
                    payload[skip..].to_vec()
                }
                CONTINUATION => open.take().unwrap().1.into_iter().chain(payload).collect(),
                _ => continue,
            };
            if flags & END_HEADERS != 0 {
                let fields = decoder.decode(&fragment, usize::MAX).unwrap();
                blocks.push((
                    stream,
                    fields
                        .iter()
                        .map(|f| {
                            (
                                String::from_utf8(f.name.to_vec()).unwrap(),
                                String::from_utf8(f.value.to_vec()).unwrap(),
                            )
                        })
                        .collect(),
                ));
            } else {
                open = Some((stream, fragment));
            }
        }
        assert!(open.is_none(), "no header block left open");
        blocks
    }

    fn authority_of(fields: &[(String, String)]) -> &str {
        &fields.iter().find(|(n, _)| n == ":authority").unwrap().1
    }

    fn rewrite(input: &[u8]) -> Result<Vec<u8>, RewriteError> {
        let mut r = AuthorityRewriter::new(LIMITS);
        r.feed(input)?;
        Ok(r.output().split().to_vec())
    }

    fn connection(blocks: &[Vec<u8>]) -> Vec<u8> {
        let mut input = PREFACE.to_vec();
        input.extend(frame(0x4, 0, 0, &[])); // SETTINGS
        for (i, block) in blocks.iter().enumerate() {
            let stream = 1 + 2 * u32::try_from(i).unwrap();
            input.extend(frame(HEADERS, END_HEADERS, stream, block));
            input.extend(frame(0x0, END_STREAM, stream, &[0, 0, 0, 0, 0])); // DATA
        }
        input
    }

    #[test]
    fn percent_encoded_authority_becomes_localhost_on_every_request_of_a_connection() {
        // grpc-go indexes the authority on the first request and sends an index afterwards: the
        // second and third blocks only make sense with the first one's dynamic table.
        let mut enc = TestEncoder::new();
        let blocks: Vec<Vec<u8>> = ["/a/GetInfo", "/a/Notify", "/a/GetInfo"]
            .iter()
            .map(|path| encode(&mut enc, &request(SOCKET_AUTHORITY, path)))
            .collect();
        assert!(
            blocks[1].len() < blocks[0].len() / 2,
            "later blocks use the dynamic table"
        );
        let mut r = AuthorityRewriter::new(LIMITS);
        r.feed(&connection(&blocks)).unwrap();
        assert_eq!(r.rewritten(), 3, "every request's authority counted");
        let out = r.output().split().to_vec();
        let seen = server_view(&out);
        assert_eq!(seen.len(), 3);
        for ((stream, fields), path) in seen.iter().zip(["/a/GetInfo", "/a/Notify", "/a/GetInfo"]) {
            assert_eq!(authority_of(fields), "localhost", "stream {stream}");
            let want: Vec<(String, String)> = request("localhost", path)
                .into_iter()
                .map(|(n, v)| (n.to_owned(), v))
                .collect();
            assert_eq!(fields, &want, "only :authority changes");
        }
    }

    #[test]
    fn valid_authorities_pass_unchanged() {
        for authority in ["localhost", "example.com:8443", "[::1]:50051"] {
            let block = encode(&mut TestEncoder::new(), &request(authority, "/s/M"));
            let mut r = AuthorityRewriter::new(LIMITS);
            r.feed(&connection(&[block])).unwrap();
            let seen = server_view(&r.output().split());
            assert_eq!(authority_of(&seen[0].1), authority);
            assert_eq!(r.rewritten(), 0);
        }
    }

    #[test]
    fn other_frames_pass_through_byte_for_byte() {
        let mut input = PREFACE.to_vec();
        let settings = frame(0x4, 0, 0, &[0, 3, 0, 0, 0, 100]);
        let ping = frame(0x6, 0, 0, &[1, 2, 3, 4, 5, 6, 7, 8]);
        let window = frame(0x8, 0, 0, &[0, 0, 1, 0]);
        // Longer than 16 bits can count: the length's top byte matters (a server that allows
        // such frames would get one; ours refuse them, but passing through is not our call).
        let data = frame(0x0, 0, 3, &vec![7; 70_000]);
        let priority = frame(0x2, 0, 5, &[0, 0, 0, 3, 16]);
        let rst = frame(0x3, 0, 7, &[0, 0, 0, 8]);
        for f in [&settings, &ping, &window, &data, &priority, &rst] {
            input.extend_from_slice(f);
        }
        // The frame after the long one is still found: a request behind it is rewritten.
        let block = encode(&mut TestEncoder::new(), &request(SOCKET_AUTHORITY, "/s/M"));
        let after = frame(HEADERS, END_HEADERS, 9, &block);
        let mut with_request = input.clone();
        with_request.extend_from_slice(&after);
        let out = rewrite(&with_request).unwrap();
        assert_eq!(out[..input.len()], input[..]);
        let seen = server_view(&out);
        assert_eq!(seen.len(), 1);
        assert_eq!(authority_of(&seen[0].1), "localhost");
    }

    #[test]
    fn input_split_at_every_byte_gives_the_same_output() {
        let mut enc = TestEncoder::new();
        let blocks = vec![
            encode(&mut enc, &request(SOCKET_AUTHORITY, "/a/B")),
            encode(&mut enc, &request(SOCKET_AUTHORITY, "/a/C")),
        ];
        let input = connection(&blocks);
        let whole = rewrite(&input).unwrap();
        let mut r = AuthorityRewriter::new(LIMITS);
        let mut out = Vec::new();
        for byte in &input {
            r.feed(std::slice::from_ref(byte)).unwrap();
            out.extend_from_slice(&r.output().split());
        }
        assert_eq!(out, whole);
    }

    /// A frame from the kinds and flags the rewriter looks at, with a payload that is sometimes a
    /// valid header block.
    fn arbitrary_frame() -> impl proptest::strategy::Strategy<Value = Vec<u8>> {
        use proptest::prelude::*;
        (
            prop_oneof![
                4 => Just(HEADERS),
                2 => Just(0x0),
                1 => Just(CONTINUATION),
                1 => Just(0x4),
                1 => Just(PUSH_PROMISE),
                1 => any::<u8>(),
            ],
            prop_oneof![
                4 => Just(END_HEADERS),
                1 => Just(0),
                1 => Just(END_HEADERS | PADDED | PRIORITY),
                1 => any::<u8>(),
            ],
            prop_oneof![4 => (0u32..4).prop_map(|i| 2 * i + 1), 1 => Just(0u32), 1 => any::<u32>()],
            prop_oneof![
                3 => Just(encode(&mut TestEncoder::new(), &request(SOCKET_AUTHORITY, "/p"))),
                2 => proptest::collection::vec(any::<u8>(), 0..64),
            ],
        )
            .prop_map(|(kind, flags, stream, payload)| frame(kind, flags, stream, &payload))
    }

    proptest::proptest! {
        /// The bytes come from the kubelet: any frames after the preface are rewritten or refused,
        /// never a panic, and where the input is cut makes no difference to the output or the
        /// verdict.
        #[test]
        fn arbitrary_frames_are_handled_the_same_however_the_input_is_cut(
            frames in proptest::collection::vec(arbitrary_frame(), 0..8),
            cut in proptest::prelude::any::<proptest::sample::Index>(),
        ) {
            let mut input = PREFACE.to_vec();
            for f in &frames {
                input.extend_from_slice(f);
            }
            let whole = rewrite(&input);
            let cut = cut.index(input.len() + 1);
            let mut r = AuthorityRewriter::new(LIMITS);
            let pieces = r.feed(&input[..cut]).and_then(|()| r.feed(&input[cut..]));
            let pieces = pieces.map(|()| r.output().split().to_vec());
            proptest::prop_assert_eq!(whole.is_ok(), pieces.is_ok());
            if let (Ok(whole), Ok(pieces)) = (whole, pieces) {
                proptest::prop_assert_eq!(whole, pieces);
            }
        }
    }

    #[test]
    fn continuation_frames_padding_and_priority_are_handled() {
        let mut enc = TestEncoder::new();
        let mut fields = request(SOCKET_AUTHORITY, "/a/B");
        fields.push(("x-big", "v".repeat(20_000)));
        let block = encode(&mut enc, &fields);
        assert!(block.len() > OUT_FRAME_SIZE);
        // HEADERS: padded (pad 10), with priority, END_STREAM; then two CONTINUATIONs.
        let (a, rest) = block.split_at(100);
        let (b, c) = rest.split_at(rest.len() / 2);
        let mut headers_payload = vec![10u8];
        headers_payload.extend_from_slice(&[0x80, 0, 0, 0, 200]); // exclusive dep on 0, weight 201
        headers_payload.extend_from_slice(a);
        headers_payload.extend_from_slice(&[0; 10]);
        let mut input = PREFACE.to_vec();
        input.extend(frame(
            HEADERS,
            PADDED | PRIORITY | END_STREAM,
            1,
            &headers_payload,
        ));
        input.extend(frame(CONTINUATION, 0, 1, b));
        input.extend(frame(CONTINUATION, END_HEADERS, 1, c));
        let out = rewrite(&input).unwrap();

        let out_frames = frames(&out[PREFACE.len()..]);
        let (kind, flags, _, payload) = &out_frames[0];
        assert_eq!(*kind, HEADERS);
        assert_eq!(
            flags & (END_STREAM | PRIORITY | PADDED | END_HEADERS),
            END_STREAM | PRIORITY
        );
        assert_eq!(&payload[..5], &[0x80, 0, 0, 0, 200], "priority kept");
        assert!(
            out_frames
                .iter()
                .all(|(_, _, _, p)| p.len() <= OUT_FRAME_SIZE)
        );
        assert!(
            out_frames.len() >= 2,
            "the re-encoded block needs CONTINUATION frames"
        );
        let seen = server_view(&out);
        assert_eq!(authority_of(&seen[0].1), "localhost");
        assert_eq!(seen[0].1.last().unwrap().1.len(), 20_000);
    }

    #[test]
    fn a_block_interrupted_by_another_frame_is_an_error() {
        let mut enc = TestEncoder::new();
        let block = encode(&mut enc, &request(SOCKET_AUTHORITY, "/a/B"));
        let mut input = PREFACE.to_vec();
        input.extend(frame(HEADERS, 0, 1, &block[..10]));
        input.extend(frame(0x6, 0, 0, &[0; 8]));
        assert_eq!(
            rewrite(&input),
            Err(RewriteError::ExpectedContinuation {
                expected: 1,
                kind: 0x6,
                stream_id: 0
            })
        );
        let mut input = PREFACE.to_vec();
        input.extend(frame(HEADERS, 0, 1, &block[..10]));
        input.extend(frame(CONTINUATION, END_HEADERS, 3, &block[10..]));
        assert!(matches!(
            rewrite(&input),
            Err(RewriteError::ExpectedContinuation { expected: 1, .. })
        ));
    }

    #[test]
    fn stray_continuation_push_promise_and_stream_zero_are_errors() {
        let mut input = PREFACE.to_vec();
        input.extend(frame(CONTINUATION, END_HEADERS, 1, &[0x82]));
        assert_eq!(
            rewrite(&input),
            Err(RewriteError::UnexpectedContinuation { stream_id: 1 })
        );
        let mut input = PREFACE.to_vec();
        input.extend(frame(PUSH_PROMISE, END_HEADERS, 1, &[0, 0, 0, 2, 0x82]));
        assert_eq!(
            rewrite(&input),
            Err(RewriteError::PushPromise { stream_id: 1 })
        );
        let mut input = PREFACE.to_vec();
        input.extend(frame(HEADERS, END_HEADERS, 0, &[0x82]));
        assert_eq!(rewrite(&input), Err(RewriteError::HeadersOnStreamZero));
    }

    #[test]
    fn padding_longer_than_the_frame_is_an_error() {
        let mut input = PREFACE.to_vec();
        input.extend(frame(HEADERS, END_HEADERS | PADDED, 1, &[5, 0x82, 0]));
        assert_eq!(
            rewrite(&input),
            Err(RewriteError::MalformedHeaders { stream_id: 1 })
        );
        let mut input = PREFACE.to_vec();
        input.extend(frame(HEADERS, END_HEADERS | PRIORITY, 1, &[0, 0, 0]));
        assert_eq!(
            rewrite(&input),
            Err(RewriteError::MalformedHeaders { stream_id: 1 })
        );
    }

    #[test]
    fn frames_over_the_servers_maximum_are_refused() {
        let mut input = PREFACE.to_vec();
        input.extend(frame(HEADERS, END_HEADERS, 1, &vec![0x82; 16_385]));
        assert!(matches!(
            rewrite(&input),
            Err(RewriteError::FrameTooLarge { length: 16_385, .. })
        ));
    }

    #[test]
    fn a_block_over_the_limit_is_refused() {
        let limits = Limits {
            max_block_size: 1000,
            ..LIMITS
        };
        // Exactly at the limit is fine.
        let mut at_limit = PREFACE.to_vec();
        at_limit.extend(frame(HEADERS, 0, 1, &[0x82; 600]));
        at_limit.extend(frame(CONTINUATION, END_HEADERS, 1, &[0x82; 400]));
        assert_eq!(AuthorityRewriter::new(limits).feed(&at_limit), Ok(()));

        let mut input = PREFACE.to_vec();
        input.extend(frame(HEADERS, 0, 1, &[0x82; 600]));
        input.extend(frame(CONTINUATION, END_HEADERS, 1, &[0x82; 600]));
        let mut r = AuthorityRewriter::new(limits);
        assert_eq!(
            r.feed(&input),
            Err(RewriteError::BlockTooLarge {
                stream_id: 1,
                limit: 1000
            })
        );
    }

    #[test]
    fn a_bad_preface_is_refused_and_nothing_after_an_error_is_accepted() {
        let mut r = AuthorityRewriter::new(LIMITS);
        assert_eq!(r.feed(b"GET / HTTP/1.1\r\n"), Err(RewriteError::BadPreface));
        assert_eq!(r.feed(PREFACE), Err(RewriteError::AlreadyFailed));
    }

    #[test]
    fn undecodable_hpack_is_an_error_naming_the_stream() {
        let mut input = PREFACE.to_vec();
        input.extend(frame(HEADERS, END_HEADERS, 3, &[0x80]));
        assert_eq!(
            rewrite(&input),
            Err(RewriteError::Hpack {
                stream_id: 3,
                error: hpack::HpackError::InvalidIndex(0)
            })
        );
    }

    #[test]
    fn trailers_and_empty_blocks_are_rewritten_as_blocks_too() {
        let mut enc = TestEncoder::new();
        let trailers = encode(&mut enc, &[("grpc-status", "0".to_owned())]);
        let mut input = PREFACE.to_vec();
        input.extend(frame(HEADERS, END_HEADERS | END_STREAM, 1, &trailers));
        input.extend(frame(HEADERS, END_HEADERS, 3, &[]));
        let out = rewrite(&input).unwrap();
        let seen = server_view(&out);
        assert_eq!(seen[0].1, vec![("grpc-status".to_owned(), "0".to_owned())]);
        assert!(seen[1].1.is_empty());
        let out_frames = frames(&out[PREFACE.len()..]);
        assert_eq!(out_frames[0].1, END_HEADERS | END_STREAM);
    }
}
