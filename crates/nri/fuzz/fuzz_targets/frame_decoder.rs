//! Fuzz target: the trunk decoders must never panic, must bound what they buffer, and must decode
//! the same frames and messages however the byte stream is cut.
//!
//! Input: one byte choosing the read size (1 to 256 bytes per read), then the trunk's bytes. The
//! stream is decoded twice, whole and in reads of that size, and the results compared. Every
//! complete message is also decoded as a ttrpc envelope and as the NRI messages a plugin receives,
//! which must fail cleanly or succeed.

#![no_main]

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use nri::{
    api, envelope,
    wire::{Inbound, MAX_FRAME_PAYLOAD, MUX_HEADER_LEN, MessageDecoder, MuxDecoder},
};
use prost::Message as _;

/// Frames and messages decoded from a trunk stream, and whether the stream was rejected.
#[derive(Debug, PartialEq, Eq, Default)]
struct Decoded {
    frames: Vec<(u32, Vec<u8>)>,
    messages: Vec<(u32, Inbound)>,
    rejected: bool,
}

fn decode(input: &[u8], read_size: usize) -> Decoded {
    let mut out = Decoded::default();
    let mut mux = MuxDecoder;
    let mut trunk = BytesMut::new();
    let mut streams: Vec<(u32, MessageDecoder, BytesMut)> = Vec::new();
    for read in input.chunks(read_size) {
        trunk.extend_from_slice(read);
        loop {
            match mux.decode(&mut trunk) {
                Ok(Some(frame)) => {
                    out.frames.push((frame.conn, frame.payload.to_vec()));
                    let i = match streams.iter().position(|(c, _, _)| *c == frame.conn) {
                        Some(i) => i,
                        None => {
                            streams.push((frame.conn, MessageDecoder::default(), BytesMut::new()));
                            streams.len() - 1
                        }
                    };
                    let (conn, decoder, buf) = &mut streams[i];
                    buf.extend_from_slice(&frame.payload);
                    while let Some(item) = decoder.decode(buf) {
                        out.messages.push((*conn, item));
                    }
                }
                Ok(None) => break,
                Err(_) => {
                    out.rejected = true;
                    return out;
                }
            }
        }
        // The decoder holds at most one incomplete frame plus one read.
        assert!(trunk.len() <= MUX_HEADER_LEN + MAX_FRAME_PAYLOAD + read_size);
    }
    out
}

fn decode_payloads(messages: &[(u32, Inbound)]) {
    for (_, item) in messages {
        let Inbound::Message { payload, .. } = item else {
            continue;
        };
        if let Ok(request) = envelope::Request::decode(payload.clone()) {
            let p = &request.payload[..];
            let _ = api::ConfigureRequest::decode(p);
            let _ = api::SynchronizeRequest::decode(p);
            let _ = api::CreateContainerRequest::decode(p);
            let _ = api::UpdateContainerRequest::decode(p);
            let _ = api::StateChangeEvent::decode(p);
        }
        if let Ok(response) = envelope::Response::decode(payload.clone()) {
            let _ = api::UpdateContainersResponse::decode(&response.payload[..]);
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&size, stream)) = data.split_first() else {
        return;
    };
    let read_size = usize::from(size) + 1;
    let whole = decode(stream, stream.len().max(1));
    let pieces = decode(stream, read_size);
    assert_eq!(whole, pieces);
    decode_payloads(&whole.messages);
});
