//! Byte-level codecs: NRI multiplexer frames and ttrpc messages (reference §2 and §3.1).
//!
//! Owns the two headers, incremental decoders that accept any split of the byte stream and bound
//! what they buffer, and the writer rule that keeps Go peers alive: a frame that starts a ttrpc
//! message is at most 4096 bytes, because Go reads each logical connection through a 4096-byte
//! buffered reader and drops the whole plugin on a larger one (reference §2.4). No IO happens here;
//! the decoders are public so that the fuzz target can drive them.

use bytes::{Buf, BufMut, Bytes, BytesMut};

/// Size of the multiplexer frame header: connection ID and payload length, both big-endian u32.
pub const MUX_HEADER_LEN: usize = 8;
/// Size of the ttrpc message header: length, stream ID (big-endian u32), type, flags.
pub const TTRPC_HEADER_LEN: usize = 10;
/// The largest ttrpc payload either side accepts: 4 MiB.
pub const MAX_MESSAGE_LEN: usize = 4 << 20;
/// The largest mux frame payload a Go peer writes (a whole ttrpc message); we reject beyond it.
pub const MAX_FRAME_PAYLOAD: usize = TTRPC_HEADER_LEN + MAX_MESSAGE_LEN;
/// The size of the buffered reader Go puts in front of each logical connection.
pub const GO_READ_BUFFER: usize = 4096;
/// How many payload bytes fit in the frame that carries a message's header (4086).
pub const FIRST_FRAME_MAX_PAYLOAD: usize = GO_READ_BUFFER - TTRPC_HEADER_LEN;

/// ttrpc message type of a request.
pub const MESSAGE_TYPE_REQUEST: u8 = 0x01;
/// ttrpc message type of a response.
pub const MESSAGE_TYPE_RESPONSE: u8 = 0x02;
/// ttrpc message type of streaming data (never used by NRI; a protocol error in a unary reply).
pub const MESSAGE_TYPE_DATA: u8 = 0x03;

/// What a byte stream or an outgoing message got wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// A mux frame header announced more than [`MAX_FRAME_PAYLOAD`] bytes.
    #[error(
        "mux frame for connection {conn} announces {len} payload bytes, over the {MAX_FRAME_PAYLOAD}-byte limit"
    )]
    FrameTooLarge { conn: u32, len: usize },
    /// We were asked to send a ttrpc payload over [`MAX_MESSAGE_LEN`].
    #[error("ttrpc message of {len} bytes is over the {MAX_MESSAGE_LEN}-byte limit")]
    MessageTooLarge { len: usize },
}

// === mux frames ===

/// One multiplexer frame: a piece of one logical connection's byte stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MuxFrame {
    pub conn: u32,
    pub payload: Bytes,
}

/// Encodes one frame (header and payload) as the single buffer a transport write sends.
pub fn encode_frame(conn: u32, payload: &[u8]) -> Result<Bytes, WireError> {
    let len = wire_len(payload.len(), MAX_FRAME_PAYLOAD)
        .ok_or(WireError::MessageTooLarge { len: payload.len() })?;
    let mut out = BytesMut::with_capacity(MUX_HEADER_LEN + payload.len());
    out.put_u32(conn);
    out.put_u32(len);
    out.put_slice(payload);
    Ok(out.freeze())
}

/// Incremental decoder of the trunk's frame stream. It buffers at most one incomplete frame, so the
/// caller's buffer stays under [`MUX_HEADER_LEN`] + [`MAX_FRAME_PAYLOAD`] plus one read.
#[derive(Debug, Default)]
pub struct MuxDecoder;

impl MuxDecoder {
    /// Takes one complete frame off the front of `src`, or returns `None` until one is there.
    pub fn decode(&mut self, src: &mut BytesMut) -> Result<Option<MuxFrame>, WireError> {
        if src.len() < MUX_HEADER_LEN {
            return Ok(None);
        }
        let mut header = &src[..MUX_HEADER_LEN];
        let conn = header.get_u32();
        let len = usize::try_from(header.get_u32()).unwrap_or(usize::MAX);
        if len > MAX_FRAME_PAYLOAD {
            return Err(WireError::FrameTooLarge { conn, len });
        }
        if src.len() < MUX_HEADER_LEN + len {
            src.reserve(MUX_HEADER_LEN + len - src.len());
            return Ok(None);
        }
        src.advance(MUX_HEADER_LEN);
        let payload = src.split_to(len).freeze();
        Ok(Some(MuxFrame { conn, payload }))
    }
}

// === ttrpc messages ===

/// The 10-byte ttrpc message header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MessageHeader {
    /// Payload length, excluding the header.
    pub length: u32,
    pub stream_id: u32,
    /// [`MESSAGE_TYPE_REQUEST`], [`MESSAGE_TYPE_RESPONSE`] or [`MESSAGE_TYPE_DATA`].
    pub kind: u8,
    /// NRI always sends 0.
    pub flags: u8,
}

impl MessageHeader {
    pub fn encode(&self) -> [u8; TTRPC_HEADER_LEN] {
        let mut out = [0u8; TTRPC_HEADER_LEN];
        out[..4].copy_from_slice(&self.length.to_be_bytes());
        out[4..8].copy_from_slice(&self.stream_id.to_be_bytes());
        out[8] = self.kind;
        out[9] = self.flags;
        out
    }

    fn decode(mut bytes: &[u8]) -> Self {
        Self {
            length: bytes.get_u32(),
            stream_id: bytes.get_u32(),
            kind: bytes.get_u8(),
            flags: bytes.get_u8(),
        }
    }
}

/// What the message decoder produces.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Inbound {
    /// A complete message.
    Message {
        header: MessageHeader,
        payload: Bytes,
    },
    /// A message over [`MAX_MESSAGE_LEN`]: its payload is discarded as it arrives, without
    /// buffering, and the stream stays usable (the Go peer answers such a stream with
    /// ResourceExhausted and keeps the connection; so do we).
    Oversized { header: MessageHeader },
}

/// Incremental decoder of one logical connection's ttrpc message stream.
#[derive(Debug, Default)]
pub struct MessageDecoder {
    /// Bytes of an oversized payload still to be thrown away.
    discard: usize,
}

impl MessageDecoder {
    /// Takes one message off the front of `src`, or returns `None` until one is there.
    pub fn decode(&mut self, src: &mut BytesMut) -> Option<Inbound> {
        self.discard_from(src);
        if self.discard > 0 || src.len() < TTRPC_HEADER_LEN {
            return None;
        }
        let header = MessageHeader::decode(&src[..TTRPC_HEADER_LEN]);
        let len = usize::try_from(header.length).unwrap_or(usize::MAX);
        if len > MAX_MESSAGE_LEN {
            src.advance(TTRPC_HEADER_LEN);
            self.discard = len;
            self.discard_from(src);
            return Some(Inbound::Oversized { header });
        }
        if src.len() < TTRPC_HEADER_LEN + len {
            src.reserve(TTRPC_HEADER_LEN + len - src.len());
            return None;
        }
        src.advance(TTRPC_HEADER_LEN);
        let payload = src.split_to(len).freeze();
        Some(Inbound::Message { header, payload })
    }

    fn discard_from(&mut self, src: &mut BytesMut) {
        let n = self.discard.min(src.len());
        src.advance(n);
        self.discard -= n;
    }
}

/// The mux frames that carry one ttrpc message on connection `conn`, split the way Go splits them
/// (reference §2.4, rule 2): the first frame holds the header and up to 4086 payload bytes, so it
/// never exceeds the Go reader's 4096-byte buffer; the rest of the payload, if any, follows as one
/// frame, which Go reads directly because its buffer is empty by then.
pub fn message_frames(
    conn: u32,
    stream_id: u32,
    kind: u8,
    payload: &[u8],
) -> Result<Vec<Bytes>, WireError> {
    let length = wire_len(payload.len(), MAX_MESSAGE_LEN)
        .ok_or(WireError::MessageTooLarge { len: payload.len() })?;
    let header = MessageHeader {
        length,
        stream_id,
        kind,
        flags: 0,
    };
    let (head, tail) = payload.split_at(payload.len().min(FIRST_FRAME_MAX_PAYLOAD));
    let mut first = Vec::with_capacity(TTRPC_HEADER_LEN + head.len());
    first.extend_from_slice(&header.encode());
    first.extend_from_slice(head);
    let mut frames = vec![encode_frame(conn, &first)?];
    if !tail.is_empty() {
        frames.push(encode_frame(conn, tail)?);
    }
    Ok(frames)
}

/// `len` as a u32 if it is at most `max`.
fn wire_len(len: usize, max: usize) -> Option<u32> {
    if len > max {
        return None;
    }
    u32::try_from(len).ok()
}

#[cfg(test)]
mod tests;
