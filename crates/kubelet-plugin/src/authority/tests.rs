//! The rewrite against the real h2 server: stock h2 resets a percent-encoded `:authority`, the
//! same bytes through [`RewritingStream`] are served, and ordinary h2 client traffic (Huffman,
//! dynamic table, CONTINUATION, bodies) passes through intact.

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Request, Response};
use tokio::{
    io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, DuplexStream, duplex},
    sync::mpsc,
};

use super::{
    RewritingStream,
    frames::{Limits, PREFACE},
    hpack::TestEncoder,
    server_limits,
};

const SOCKET_AUTHORITY: &str = "%2Fvar%2Flib%2Fkubelet%2Fplugins_registry%2Fx-reg.sock";

/// Guards every wait in these tests; none is expected to come near it.
const DEADLINE: Duration = Duration::from_secs(10);

/// What the server saw of one request.
#[derive(Debug)]
struct Seen {
    authority: Option<String>,
    path: String,
    headers: HeaderMap,
    body: Vec<u8>,
}

/// Runs an h2 server on `io` that records every request and answers 200 with an `x-echo-path`
/// header.
fn spawn_server<T>(io: T, max_header_list_size: u32) -> mpsc::UnboundedReceiver<Seen>
where
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut conn = h2::server::Builder::new()
            .max_header_list_size(max_header_list_size)
            .handshake::<_, Bytes>(io)
            .await
            .expect("server handshake");
        while let Some(request) = conn.accept().await {
            let Ok((request, mut respond)) = request else {
                break;
            };
            let tx = tx.clone();
            tokio::spawn(async move {
                let (parts, mut body) = request.into_parts();
                let mut data = Vec::new();
                while let Some(chunk) = body.data().await {
                    let chunk = chunk.expect("request body");
                    let _ = body.flow_control().release_capacity(chunk.len());
                    data.extend_from_slice(&chunk);
                }
                let path = parts.uri.path().to_owned();
                let response = Response::builder()
                    .header("x-echo-path", path.as_str())
                    .body(())
                    .expect("response");
                respond
                    .send_response(response, true)
                    .expect("send response");
                let _ = tx.send(Seen {
                    authority: parts.uri.authority().map(|a| a.to_string()),
                    path,
                    headers: parts.headers,
                    body: data,
                });
            });
        }
    });
    rx
}

fn frame(kind: u8, flags: u8, stream_id: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let len = u32::try_from(payload.len()).unwrap().to_be_bytes();
    out.extend_from_slice(&len[1..]);
    out.extend_from_slice(&[kind, flags]);
    out.extend_from_slice(&stream_id.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// Reads frames until one of type `kind` on `stream` arrives; returns its flags and payload.
async fn read_until(io: &mut DuplexStream, kind: u8, stream: u32) -> (u8, Vec<u8>) {
    loop {
        let mut header = [0u8; 9];
        io.read_exact(&mut header).await.expect("frame header");
        let len =
            usize::from(header[0]) << 16 | usize::from(header[1]) << 8 | usize::from(header[2]);
        let mut payload = vec![0; len];
        io.read_exact(&mut payload).await.expect("frame payload");
        let id = u32::from_be_bytes([header[5] & 0x7f, header[6], header[7], header[8]]);
        if header[3] == 0x4 && header[4] & 0x1 == 0 {
            // Acknowledge the server's SETTINGS, as any client must.
            io.write_all(&frame(0x4, 0x1, 0, &[])).await.unwrap();
        }
        if header[3] == kind && id == stream {
            return (header[4], payload);
        }
    }
}

/// What grpc-go sends for a unary call on a socket dialed by path.
fn grpc_go_request(enc: &mut TestEncoder, path: &str) -> Vec<u8> {
    enc.encode(&[
        (":method", "POST"),
        (":scheme", "http"),
        (":path", path),
        (":authority", SOCKET_AUTHORITY),
        ("content-type", "application/grpc"),
        ("user-agent", "grpc-go/1.85.0"),
        ("te", "trailers"),
        ("grpc-timeout", "999889u"),
    ])
}

fn client_preface() -> Vec<u8> {
    let mut out = PREFACE.to_vec();
    out.extend(frame(0x4, 0, 0, &[]));
    out
}

#[tokio::test]
async fn stock_h2_resets_a_percent_encoded_authority() {
    // This documents the upstream behaviour the rewrite exists for. If it starts failing, h2
    // accepts such authorities now and the rewrite may be removable.
    let (mut client, server_io) = duplex(1 << 16);
    let mut seen = spawn_server(server_io, 16 * 1024);
    let mut bytes = client_preface();
    bytes.extend(frame(
        0x1,
        0x4 | 0x1,
        1,
        &grpc_go_request(&mut TestEncoder::new(), "/s/M"),
    ));
    client.write_all(&bytes).await.unwrap();
    let (_, payload) = tokio::time::timeout(DEADLINE, read_until(&mut client, 0x3, 1))
        .await
        .expect("an RST_STREAM for stream 1");
    assert_eq!(payload, 1u32.to_be_bytes(), "PROTOCOL_ERROR");
    assert!(
        seen.try_recv().is_err(),
        "the request never reached the service"
    );
}

#[tokio::test]
async fn the_rewrite_gets_grpc_go_requests_served_on_one_connection() {
    let (mut client, server_io) = duplex(1 << 16);
    let mut seen = spawn_server(RewritingStream::new(server_io, server_limits()), 16 * 1024);
    let mut enc = TestEncoder::new();
    let mut bytes = client_preface();
    for (stream, path) in [
        (1, "/pluginregistration.Registration/GetInfo"),
        (3, "/x.Y/Z"),
    ] {
        // The second block carries the authority as a dynamic-table index.
        bytes.extend(frame(0x1, 0x4, stream, &grpc_go_request(&mut enc, path)));
        bytes.extend(frame(0x0, 0x1, stream, &[0, 0, 0, 0, 2, 8, 1]));
    }
    client.write_all(&bytes).await.unwrap();
    for (stream, path) in [
        (1, "/pluginregistration.Registration/GetInfo"),
        (3, "/x.Y/Z"),
    ] {
        let (_, block) = tokio::time::timeout(DEADLINE, read_until(&mut client, 0x1, stream))
            .await
            .expect("response headers");
        assert!(!block.is_empty());
        let got = seen.recv().await.expect("request seen");
        assert_eq!(got.authority.as_deref(), Some("localhost"));
        assert_eq!(got.path, path);
        assert_eq!(got.headers["content-type"], "application/grpc");
        assert_eq!(got.headers["grpc-timeout"], "999889u");
        assert_eq!(got.body, [0, 0, 0, 0, 2, 8, 1]);
    }
}

/// An h2 client through the rewrite: whatever h2's encoder does (Huffman, indexing, splitting a
/// large block into CONTINUATION frames), the server sees exactly what the client sent.
#[tokio::test]
async fn ordinary_h2_client_traffic_passes_through_intact() {
    let limits = Limits {
        max_block_size: 1 << 20,
        max_list_size: 1 << 20,
        ..server_limits()
    };
    let (client_io, server_io) = duplex(1 << 16);
    let mut seen = spawn_server(RewritingStream::new(server_io, limits), 1 << 20);
    let (send, conn) = h2::client::handshake(client_io)
        .await
        .expect("client handshake");
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let mut send = send.ready().await.expect("client ready");
    let big = "b".repeat(40_000); // larger than one frame: HEADERS + CONTINUATION
    for i in 0..5 {
        let value = if i == 2 {
            big.clone()
        } else {
            format!("value-{i}")
        };
        let request = Request::builder()
            .method("POST")
            .uri(format!("http://example.com:8080/svc/{i}"))
            .header("x-value", value.as_str())
            .header("x-same", "repeated on every request")
            .body(())
            .unwrap();
        let (response, mut stream) = send.send_request(request, false).expect("send request");
        stream
            .send_data(Bytes::from(vec![u8::try_from(i).unwrap(); 70_000]), true)
            .expect("send body");
        let response = tokio::time::timeout(DEADLINE, response)
            .await
            .expect("in time")
            .expect("response");
        assert_eq!(
            response.headers()["x-echo-path"],
            format!("/svc/{i}").as_str()
        );
        let got = seen.recv().await.expect("request seen");
        assert_eq!(got.authority.as_deref(), Some("example.com:8080"));
        assert_eq!(got.headers["x-value"], value.as_str());
        assert_eq!(got.headers["x-same"], "repeated on every request");
        assert_eq!(got.body, vec![u8::try_from(i).unwrap(); 70_000]);
        send = send.ready().await.expect("client ready");
    }
}

#[tokio::test]
async fn broken_framing_closes_the_connection() {
    let (mut client, server_io) = duplex(1 << 16);
    let _seen = spawn_server(RewritingStream::new(server_io, server_limits()), 16 * 1024);
    let mut bytes = client_preface();
    // HEADERS without END_HEADERS, then a PING: the block is interrupted.
    bytes.extend(frame(0x1, 0, 1, &[0x82]));
    bytes.extend(frame(0x6, 0, 0, &[0; 8]));
    client.write_all(&bytes).await.unwrap();
    let mut rest = Vec::new();
    // The server closes its end: reading reaches EOF instead of hanging.
    tokio::time::timeout(DEADLINE, client.read_to_end(&mut rest))
        .await
        .expect("the connection is closed")
        .expect("read");
}
