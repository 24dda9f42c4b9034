//! Golden byte vectors (reference §7) and split-invariance properties of the frame codecs.

use bytes::{Bytes, BytesMut};
use proptest::prelude::*;
use prost::Message as _;

use super::*;
use crate::{api, envelope};

fn hex(s: &str) -> Vec<u8> {
    let digits: Vec<u8> = s.bytes().filter(u8::is_ascii_hexdigit).collect();
    digits
        .chunks(2)
        .map(|p| u8::from_str_radix(std::str::from_utf8(p).unwrap(), 16).unwrap())
        .collect()
}

fn register_request_bytes() -> Vec<u8> {
    let mut v = hex("0a 1c");
    v.extend_from_slice(b"nri.pkg.api.v1alpha1.Runtime");
    v.extend(hex("12 0e"));
    v.extend_from_slice(b"RegisterPlugin");
    v.extend(hex("1a 0a 0a 04 74657374 12 02 3130"));
    v.extend(hex("20 80e497d012"));
    v
}

#[test]
fn register_plugin_request_matches_the_golden_bytes() {
    let req = api::RegisterPluginRequest {
        plugin_name: "test".into(),
        plugin_idx: "10".into(),
        nri_version: String::new(),
    };
    assert_eq!(req.encode_to_vec(), hex("0a 04 74657374 12 02 3130"));
    let envelope = envelope::Request {
        service: "nri.pkg.api.v1alpha1.Runtime".into(),
        method: "RegisterPlugin".into(),
        payload: req.encode_to_vec(),
        timeout_nano: 5_000_000_000,
        metadata: vec![],
    };
    let bytes = envelope.encode_to_vec();
    assert_eq!(bytes.len(), 64);
    assert_eq!(bytes, register_request_bytes());
}

#[test]
fn register_plugin_frame_matches_the_golden_header() {
    let frames = message_frames(2, 1, MESSAGE_TYPE_REQUEST, &register_request_bytes()).unwrap();
    assert_eq!(frames.len(), 1);
    let mut want = hex("00000002 0000004a 00000040 00000001 01 00");
    want.extend(register_request_bytes());
    assert_eq!(frames[0].as_ref(), want.as_slice());
}

#[test]
fn go_ok_reply_decodes_to_an_ok_response() {
    let mut src = BytesMut::from(&hex("00000002 0000000c 00000002 00000001 02 00 0a 00")[..]);
    let frame = MuxDecoder.decode(&mut src).unwrap().unwrap();
    assert_eq!(frame.conn, 2);
    assert!(src.is_empty());
    let mut stream = BytesMut::from(&frame.payload[..]);
    let Some(Inbound::Message { header, payload }) = MessageDecoder::default().decode(&mut stream)
    else {
        panic!("no message decoded");
    };
    assert_eq!(
        header,
        MessageHeader {
            length: 2,
            stream_id: 1,
            kind: MESSAGE_TYPE_RESPONSE,
            flags: 0
        }
    );
    let response = envelope::Response::decode(payload).unwrap();
    assert_eq!(response.status.map(|s| s.code), Some(0));
    assert!(response.payload.is_empty());
}

#[test]
fn configure_response_and_error_status_match_the_golden_bytes() {
    let reply = api::ConfigureResponse { events: 0x208 };
    assert_eq!(reply.encode_to_vec(), hex("10 8804"));
    let message = "unknown method Start"; // 20 bytes
    assert_eq!(message.len(), 20);
    let response = envelope::Response {
        status: Some(envelope::Status {
            code: 12,
            message: message.into(),
            details: vec![],
        }),
        payload: vec![],
    };
    let mut want = hex("0a 18 08 0c 12 14");
    want.extend_from_slice(message.as_bytes());
    assert_eq!(response.encode_to_vec(), want);
}

/// The sizes of the reference's 4096-byte reader table: a message's first frame never exceeds
/// 4096 bytes, and the remainder travels as one frame.
#[test]
fn messages_are_split_so_the_first_frame_fits_the_go_reader() {
    for (len, want) in [
        (0, vec![10]),
        (100, vec![110]),
        (4086, vec![4096]),
        (4087, vec![4096, 1]),
        (10_000, vec![4096, 10_000 - 4086]),
        (100_000, vec![4096, 100_000 - 4086]),
        (MAX_MESSAGE_LEN, vec![4096, MAX_MESSAGE_LEN - 4086]),
    ] {
        let payload = vec![0xa5; len];
        let frames = message_frames(1, 3, MESSAGE_TYPE_RESPONSE, &payload).unwrap();
        let sizes: Vec<usize> = frames.iter().map(|f| f.len() - MUX_HEADER_LEN).collect();
        assert_eq!(sizes, want, "payload of {len} bytes");
        for f in &frames {
            assert_eq!(&f[..4], &1u32.to_be_bytes(), "connection id");
        }
    }
}

#[test]
fn oversized_outgoing_messages_are_refused() {
    let payload = vec![0; MAX_MESSAGE_LEN + 1];
    assert_eq!(
        message_frames(1, 1, MESSAGE_TYPE_REQUEST, &payload),
        Err(WireError::MessageTooLarge {
            len: MAX_MESSAGE_LEN + 1
        })
    );
}

#[test]
fn a_frame_over_the_limit_is_rejected_by_the_decoder() {
    let mut src = BytesMut::from(&hex("00000001 00400010")[..]); // 4 MiB + 16
    assert_eq!(
        MuxDecoder.decode(&mut src),
        Err(WireError::FrameTooLarge {
            conn: 1,
            len: (4 << 20) + 16
        })
    );
}

#[test]
fn a_frame_at_the_limit_is_accepted() {
    let payload = vec![7u8; MAX_FRAME_PAYLOAD];
    let mut src = BytesMut::from(&encode_frame(2, &payload).unwrap()[..]);
    let frame = MuxDecoder.decode(&mut src).unwrap().unwrap();
    assert_eq!(frame.payload.len(), MAX_FRAME_PAYLOAD);
}

#[test]
fn an_oversized_message_is_skipped_and_the_stream_goes_on() {
    let big = MAX_MESSAGE_LEN + 5;
    let mut stream = Vec::new();
    stream.extend_from_slice(
        &MessageHeader {
            length: u32::try_from(big).unwrap(),
            stream_id: 5,
            kind: MESSAGE_TYPE_REQUEST,
            flags: 0,
        }
        .encode(),
    );
    stream.extend(std::iter::repeat_n(0xee, big));
    let small = MessageHeader {
        length: 3,
        stream_id: 7,
        kind: MESSAGE_TYPE_REQUEST,
        flags: 0,
    };
    stream.extend_from_slice(&small.encode());
    stream.extend_from_slice(b"abc");

    let mut decoder = MessageDecoder::default();
    let mut src = BytesMut::new();
    let mut out = Vec::new();
    // Feed in 64 KiB pieces: the decoder must never hold the oversized payload.
    for piece in stream.chunks(64 * 1024) {
        src.extend_from_slice(piece);
        while let Some(item) = decoder.decode(&mut src) {
            out.push(item);
        }
        assert!(
            src.len() <= 64 * 1024,
            "decoder buffered {} bytes",
            src.len()
        );
    }
    assert_eq!(out.len(), 2);
    assert!(matches!(out[0], Inbound::Oversized { header } if header.stream_id == 5));
    assert_eq!(
        out[1],
        Inbound::Message {
            header: small,
            payload: Bytes::from_static(b"abc")
        }
    );
}

// === properties: any split of the byte stream decodes the same ===

fn frames_strategy() -> impl Strategy<Value = Vec<(u32, Vec<u8>)>> {
    prop::collection::vec((0u32..4, prop::collection::vec(any::<u8>(), 0..300)), 0..12)
}

/// Cut points into a stream of `len` bytes.
fn cuts(len: usize, raw: &[usize]) -> Vec<usize> {
    let mut cuts: Vec<usize> = raw.iter().map(|c| c % (len + 1)).collect();
    cuts.sort_unstable();
    cuts.push(len);
    cuts
}

proptest! {
    #[test]
    fn mux_frames_decode_the_same_under_any_split(
        frames in frames_strategy(),
        raw_cuts in prop::collection::vec(any::<usize>(), 0..20),
    ) {
        let stream: Vec<u8> = frames
            .iter()
            .flat_map(|(c, p)| encode_frame(*c, p).unwrap().to_vec())
            .collect();
        let mut decoder = MuxDecoder;
        let mut src = BytesMut::new();
        let mut got = Vec::new();
        let mut start = 0;
        for end in cuts(stream.len(), &raw_cuts) {
            src.extend_from_slice(&stream[start..end]);
            start = end;
            while let Some(f) = decoder.decode(&mut src).unwrap() {
                got.push((f.conn, f.payload.to_vec()));
            }
        }
        prop_assert!(src.is_empty());
        prop_assert_eq!(got, frames);
    }

    #[test]
    fn ttrpc_messages_decode_the_same_under_any_split(
        messages in prop::collection::vec(
            (any::<u32>(), 1u8..4, prop::collection::vec(any::<u8>(), 0..5000)),
            0..6,
        ),
        raw_cuts in prop::collection::vec(any::<usize>(), 0..20),
    ) {
        // The logical stream as the peer's mux delivers it: frame payloads concatenated.
        let stream: Vec<u8> = messages
            .iter()
            .flat_map(|(id, kind, p)| message_frames(1, *id, *kind, p).unwrap())
            .flat_map(|f| f[MUX_HEADER_LEN..].to_vec())
            .collect();
        let mut decoder = MessageDecoder::default();
        let mut src = BytesMut::new();
        let mut got = Vec::new();
        let mut start = 0;
        for end in cuts(stream.len(), &raw_cuts) {
            src.extend_from_slice(&stream[start..end]);
            start = end;
            while let Some(item) = decoder.decode(&mut src) {
                let Inbound::Message { header, payload } = item else {
                    return Err(TestCaseError::fail("oversized message decoded"));
                };
                got.push((header.stream_id, header.kind, payload.to_vec()));
            }
        }
        prop_assert!(src.is_empty());
        prop_assert_eq!(got, messages);
    }
}
