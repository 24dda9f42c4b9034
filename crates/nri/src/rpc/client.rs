//! The unary ttrpc client: numbers calls, sends them, and matches replies by stream ID.
//!
//! Stream IDs are odd and increase by two per call, starting at 1 (Go servers reject anything
//! else). An ID is taken and its message queued under one lock, so IDs reach the socket in
//! increasing order even when many tasks call at once. Replies are matched through a table of
//! pending calls; the connection ending fails every pending call.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use bytes::{Bytes, BytesMut};
use prost::Message as _;
use stdx::sync::lock;
use tokio::sync::{mpsc, oneshot};

use super::{CallError, Status, code};
use crate::{
    envelope,
    mux::{MuxWriter, Outgoing},
    wire::{self, Inbound, MessageDecoder},
};

/// The result a reply delivers to a waiting call, before the method name is attached.
type Delivery = Result<Bytes, ReplyError>;

#[derive(Debug)]
enum ReplyError {
    Status(Status),
    Protocol(String),
}

#[derive(Debug, Default)]
struct State {
    next_id: u32,
    pending: HashMap<u32, oneshot::Sender<Delivery>>,
    closed: bool,
}

/// A client for one logical connection. Cheap to clone.
#[derive(Debug, Clone)]
pub(crate) struct Client {
    conn: u32,
    writer: MuxWriter,
    state: Arc<Mutex<State>>,
}

impl Client {
    /// Starts the reply reader on `inbound` and returns the client.
    pub fn start(conn: u32, writer: MuxWriter, inbound: mpsc::Receiver<Bytes>) -> Self {
        let state = Arc::new(Mutex::new(State {
            next_id: 1,
            ..State::default()
        }));
        tokio::spawn(read_replies(inbound, state.clone()));
        Self {
            conn,
            writer,
            state,
        }
    }

    /// Calls `service`/`method` with an encoded request and returns the encoded reply.
    pub async fn call(
        &self,
        service: &str,
        method: &str,
        request: Vec<u8>,
        timeout: Option<Duration>,
    ) -> Result<Bytes, CallError> {
        let timeout_nano = timeout.map_or(0, |t| i64::try_from(t.as_nanos()).unwrap_or(i64::MAX));
        let envelope = envelope::Request {
            service: service.into(),
            method: method.into(),
            payload: request,
            timeout_nano,
            metadata: vec![],
        }
        .encode_to_vec();
        let (tx, rx) = oneshot::channel();
        let id = {
            let mut state = lock(&self.state);
            if state.closed {
                return Err(CallError::ConnectionClosed {
                    method: method.into(),
                });
            }
            let id = state.next_id;
            let frames = wire::message_frames(self.conn, id, wire::MESSAGE_TYPE_REQUEST, &envelope)
                .map_err(|_| CallError::TooLarge {
                    method: method.into(),
                    len: envelope.len(),
                })?;
            state.next_id = id.wrapping_add(2);
            state.pending.insert(id, tx);
            let sent = self.writer.send(Outgoing {
                frames,
                written: None,
            });
            if sent.is_err() {
                state.pending.remove(&id);
                return Err(CallError::ConnectionClosed {
                    method: method.into(),
                });
            }
            id
        };
        let reply = match timeout {
            Some(t) => match tokio::time::timeout(t, rx).await {
                Ok(r) => r,
                Err(_) => {
                    self.forget(id);
                    return Err(CallError::DeadlineExceeded {
                        method: method.into(),
                        timeout_ms: t.as_millis(),
                    });
                }
            },
            None => rx.await,
        };
        match reply {
            Ok(Ok(payload)) => Ok(payload),
            Ok(Err(ReplyError::Status(status))) => Err(CallError::Status {
                method: method.into(),
                status,
            }),
            Ok(Err(ReplyError::Protocol(detail))) => Err(CallError::Protocol {
                method: method.into(),
                detail,
            }),
            Err(_) => Err(CallError::ConnectionClosed {
                method: method.into(),
            }),
        }
    }

    fn forget(&self, id: u32) {
        let mut state = lock(&self.state);
        state.pending.remove(&id);
    }
}

async fn read_replies(mut inbound: mpsc::Receiver<Bytes>, state: Arc<Mutex<State>>) {
    let mut decoder = MessageDecoder::default();
    let mut buf = BytesMut::new();
    while let Some(chunk) = inbound.recv().await {
        buf.extend_from_slice(&chunk);
        while let Some(item) = decoder.decode(&mut buf) {
            let (id, delivery) = match item {
                Inbound::Message { header, payload } => {
                    (header.stream_id, reply(header.kind, payload))
                }
                Inbound::Oversized { header } => (
                    header.stream_id,
                    Err(ReplyError::Status(Status::new(
                        code::RESOURCE_EXHAUSTED,
                        format!("reply of {} bytes is over the 4 MiB limit", header.length),
                    ))),
                ),
            };
            let waiter = lock(&state).pending.remove(&id);
            match waiter {
                Some(tx) => {
                    let _ = tx.send(delivery);
                }
                None => tracing::debug!(stream = id, "dropping a reply nobody waits for"),
            }
        }
    }
    // The connection is gone: fail every call still waiting, and refuse new ones.
    let mut state = lock(&state);
    state.closed = true;
    state.pending.clear();
}

fn reply(kind: u8, payload: Bytes) -> Delivery {
    if kind != wire::MESSAGE_TYPE_RESPONSE {
        return Err(ReplyError::Protocol(format!(
            "message type {kind} where a response was expected"
        )));
    }
    let response = envelope::Response::decode(payload)
        .map_err(|e| ReplyError::Protocol(format!("response envelope: {e}")))?;
    match response.status {
        Some(s) if s.code != code::OK => Err(ReplyError::Status(Status::new(s.code, s.message))),
        _ => Ok(Bytes::from(response.payload)),
    }
}
