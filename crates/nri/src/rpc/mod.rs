//! A minimal unary ttrpc: a client and a server over one logical mux connection each.
//!
//! NRI uses unary calls only, so this is all of ttrpc it needs: the Request/Response envelopes,
//! odd increasing client stream IDs, replies matched by stream ID (Go servers answer concurrently,
//! so out of order), status codes, and the 4 MiB limit in both directions. Owning it (rather than
//! using ttrpc-rust) is what lets the writer follow the Go peer's 4096-byte reader rule exactly and
//! report when a reply has reached the socket; see the crate docs for the full reasoning.

mod client;
mod server;

pub(crate) use client::Client;
pub(crate) use server::{Reply, ReplyFuture, Service, serve};

/// The ttrpc status codes NRI peers use (gRPC numbering).
pub mod code {
    pub const OK: i32 = 0;
    /// Any plain Go error, e.g. a failed `UpdateContainers`.
    pub const UNKNOWN: i32 = 2;
    pub const INVALID_ARGUMENT: i32 = 3;
    pub const DEADLINE_EXCEEDED: i32 = 4;
    pub const NOT_FOUND: i32 = 5;
    /// A message over 4 MiB. NRI runtimes read it so: on a Synchronize they split the message
    /// and retry, so a plugin must not refuse with it.
    pub const RESOURCE_EXHAUSTED: i32 = 8;
    pub const FAILED_PRECONDITION: i32 = 9;
    /// Unknown service or method; drives the v0.12 StateChange fallback.
    pub const UNIMPLEMENTED: i32 = 12;
    pub const INTERNAL: i32 = 13;
    pub const UNAVAILABLE: i32 = 14;
}

/// A non-OK ttrpc status.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("status {code}: {message}")]
pub struct Status {
    pub code: i32,
    pub message: String,
}

impl Status {
    pub fn new(code: i32, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }
}

/// Why a call to the runtime did not produce a reply.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CallError {
    /// The runtime answered with a non-OK status.
    #[error("the runtime answered {method} with {status}")]
    Status { method: String, status: Status },
    /// No reply within the deadline.
    #[error("{method} got no reply within {timeout_ms} ms")]
    DeadlineExceeded { method: String, timeout_ms: u128 },
    /// The connection ended before the reply arrived (or before the call was sent).
    #[error("the connection to the runtime closed before {method} was answered")]
    ConnectionClosed { method: String },
    /// The request is over the 4 MiB limit; it was not sent.
    #[error("{method} request of {len} bytes is over the 4 MiB ttrpc limit")]
    TooLarge { method: String, len: usize },
    /// The reply did not decode as the expected message.
    #[error("the reply to {method} does not decode: {detail}")]
    Decode { method: String, detail: String },
    /// The runtime broke the unary protocol (e.g. a Data message as a reply).
    #[error("protocol error in the reply to {method}: {detail}")]
    Protocol { method: String, detail: String },
}
