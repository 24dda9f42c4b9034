//! The unary ttrpc server: decodes requests, runs each in its own task, writes the replies.
//!
//! Like the Go server it rejects even and non-increasing stream IDs (InvalidArgument), answers
//! unknown services and methods with Unimplemented, answers an oversized request with
//! ResourceExhausted and keeps the connection, and abandons a call that overruns the caller's
//! `timeout_nano` without replying (see below). Requests run concurrently, so replies may leave
//! out of order.

use std::{future::Future, pin::Pin, sync::Arc, time::Duration};

use bytes::{Bytes, BytesMut};
use prost::Message as _;
use tokio::sync::{mpsc, oneshot};

use super::{Status, code};
use crate::{
    envelope,
    mux::{MuxWriter, Outgoing},
    wire::{self, Inbound, MessageDecoder},
};

/// A service's answer to one call.
#[derive(Debug)]
pub(crate) struct Reply {
    /// The encoded reply message, or the status to answer with.
    pub result: Result<Vec<u8>, Status>,
    /// Told once the reply's last byte has been written to the socket.
    pub written: Option<oneshot::Sender<()>>,
}

impl From<Result<Vec<u8>, Status>> for Reply {
    fn from(result: Result<Vec<u8>, Status>) -> Self {
        Self {
            result,
            written: None,
        }
    }
}

/// The boxed future a service returns for one call.
pub(crate) type ReplyFuture = Pin<Box<dyn Future<Output = Reply> + Send>>;

/// What the server dispatches to: one method call in, one reply out.
pub(crate) trait Service: Send + Sync + 'static {
    fn call(self: Arc<Self>, method: String, payload: Bytes) -> ReplyFuture;
}

/// Serves `service` (named `service_name` on the wire) on connection `conn` until its inbound
/// stream ends.
pub(crate) fn serve<S: Service>(
    conn: u32,
    service_name: &'static str,
    service: Arc<S>,
    writer: MuxWriter,
    inbound: mpsc::Receiver<Bytes>,
) {
    tokio::spawn(serve_loop(conn, service_name, service, writer, inbound));
}

async fn serve_loop<S: Service>(
    conn: u32,
    service_name: &'static str,
    service: Arc<S>,
    writer: MuxWriter,
    mut inbound: mpsc::Receiver<Bytes>,
) {
    let mut decoder = MessageDecoder::default();
    let mut buf = BytesMut::new();
    let mut last_id = 0u32;
    while let Some(chunk) = inbound.recv().await {
        buf.extend_from_slice(&chunk);
        while let Some(item) = decoder.decode(&mut buf) {
            let (header, payload) = match item {
                Inbound::Message { header, payload } => (header, payload),
                Inbound::Oversized { header } => {
                    let status = Status::new(
                        code::RESOURCE_EXHAUSTED,
                        format!("request of {} bytes is over the 4 MiB limit", header.length),
                    );
                    respond(&writer, conn, header.stream_id, Err(status).into());
                    continue;
                }
            };
            if header.kind != wire::MESSAGE_TYPE_REQUEST {
                tracing::debug!(
                    stream = header.stream_id,
                    kind = header.kind,
                    "ignoring a non-request message"
                );
                continue;
            }
            let id = header.stream_id;
            if id % 2 == 0 || id <= last_id {
                let status = Status::new(
                    code::INVALID_ARGUMENT,
                    format!("stream id {id} is even or not above the last one ({last_id})"),
                );
                respond(&writer, conn, id, Err(status).into());
                continue;
            }
            last_id = id;
            let request = match envelope::Request::decode(payload) {
                Ok(r) => r,
                Err(e) => {
                    let status =
                        Status::new(code::INVALID_ARGUMENT, format!("request envelope: {e}"));
                    respond(&writer, conn, id, Err(status).into());
                    continue;
                }
            };
            if request.service != service_name {
                let status = Status::new(
                    code::UNIMPLEMENTED,
                    format!("service {} is not served here", request.service),
                );
                respond(&writer, conn, id, Err(status).into());
                continue;
            }
            let fut = service
                .clone()
                .call(request.method.clone(), request.payload.into());
            let deadline = u64::try_from(request.timeout_nano)
                .ok()
                .filter(|&n| n > 0)
                .map(Duration::from_nanos);
            let writer = writer.clone();
            tokio::spawn(async move {
                let reply = match deadline {
                    None => fut.await,
                    Some(d) => match tokio::time::timeout(d, fut).await {
                        Ok(reply) => reply,
                        Err(_) => {
                            // The caller has stopped waiting. No reply: a late one is useless,
                            // and one that beat the caller's own timer would turn "plugin timed
                            // out" (the runtime drops the plugin, the operation proceeds) into
                            // "plugin refused" (the operation fails).
                            tracing::warn!(
                                method = %request.method,
                                deadline_ms = d.as_millis(),
                                "abandoning a call that overran the runtime's deadline"
                            );
                            return;
                        }
                    },
                };
                respond(&writer, conn, id, reply);
            });
        }
    }
}

/// Encodes and queues the response to stream `id`. A reply over the limit is replaced by a
/// ResourceExhausted status, as Go does.
fn respond(writer: &MuxWriter, conn: u32, id: u32, reply: Reply) {
    let envelope = |result: Result<Vec<u8>, Status>| {
        let (status, payload) = match result {
            Ok(payload) => (
                envelope::Status {
                    code: code::OK,
                    ..Default::default()
                },
                payload,
            ),
            Err(s) => (
                envelope::Status {
                    code: s.code,
                    message: s.message,
                    details: vec![],
                },
                Vec::new(),
            ),
        };
        envelope::Response {
            status: Some(status),
            payload,
        }
        .encode_to_vec()
    };
    let bytes = envelope(reply.result);
    let mut written = reply.written;
    let frames =
        wire::message_frames(conn, id, wire::MESSAGE_TYPE_RESPONSE, &bytes).or_else(|_| {
            // The reply the service meant is not what goes out: nobody may be told it was written.
            written = None;
            let status = Status::new(
                code::RESOURCE_EXHAUSTED,
                format!("reply of {} bytes is over the 4 MiB limit", bytes.len()),
            );
            wire::message_frames(
                conn,
                id,
                wire::MESSAGE_TYPE_RESPONSE,
                &envelope(Err(status)),
            )
        });
    match frames {
        Ok(frames) => {
            let sent = writer.send(Outgoing { frames, written });
            if sent.is_err() {
                tracing::debug!(stream = id, "connection closed before the reply was sent");
            }
        }
        // A status-only envelope is a few bytes; it cannot exceed the limit.
        Err(e) => tracing::error!(stream = id, error = %e, "cannot encode a reply"),
    }
}
