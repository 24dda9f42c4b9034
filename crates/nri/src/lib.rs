//! A Rust NRI (Node Resource Interface) plugin stub.
//!
//! Speaks the NRI protocol to containerd and CRI-O and hands typed events to a [`Plugin`]. It
//! moves NRI messages and decides nothing: it knows nothing of DRA, claims, policies or CPUs.
//!
//! # Layers
//!
//! One unix socket (the *trunk*) carries multiplexer frames ([`wire`], `mux`); connection 1 carries
//! the Plugin service, which we serve, connection 2 the Runtime service, which we call (`rpc`, a
//! unary ttrpc); the payloads are the NRI messages in [`api`], prost types generated from our own
//! `.proto` files under `proto/` (written from the field tables, never copied) by
//! `cargo xtask codegen`. The stub ([`connect`]) does the handshake and returns a [`Handle`].
//!
//! # Why our own ttrpc and not ttrpc-rust
//!
//! ttrpc-rust's prost backend generates its code with `protoc` at build time, and we have no
//! `protoc` anywhere (our code generation is protox, pure Rust); its default backend is
//! rust-protobuf, a second protobuf stack next to the prost one the rest of the workspace uses.
//! It also owns the framing: whether its writes respect the Go peer's 4096-byte reader depends on
//! the ttrpc-rust release and on our mux emitting one frame per `poll_write` (reference §8), and
//! it cannot tell us when a particular reply has reached the socket, which the resource manager's
//! claim gate needs. NRI uses unary calls only, so the part of ttrpc we need is small: two
//! headers, two envelopes, stream-ID matching and status codes, a few hundred lines that we
//! control and test byte for byte.
//!
//! # The Go peer's 4096-byte reader
//!
//! Go reads every logical connection through a 4096-byte buffered reader and kills the plugin if a
//! frame that starts a message is larger. Every message we write goes out as the frame Go itself
//! writes: header plus at most 4086 payload bytes, then the rest as one frame
//! ([`wire::message_frames`]).
//!
//! # Unsolicited updates and the deadlock
//!
//! The runtime holds a global NRI lock while it sends an event to plugins, and serves
//! `UpdateContainers` under the same lock. A handler that calls [`Handle::update_containers`] and
//! awaits it therefore waits for a lock its own reply would release: both sides block until the
//! runtime's request timeout (2 s by default) disconnects the plugin. The call detects that it is
//! running inside a handler (a task-local set around every handler) and fails at once with
//! [`UpdateError::InsideEventHandler`]. Issue unsolicited updates from a separate task; a handler
//! that spawns such a task must not wait for it.
//!
//! # Notifications
//!
//! [`Handle::synchronized`] resolves when the final Synchronize reply has been written to the
//! socket (not merely computed); [`Handle::closed`] resolves when the connection is lost, with the
//! reason. The stub does not reconnect.
//!
//! # Deadlines
//!
//! Every runtime call carries the runtime's request timeout. A handler that overruns it is
//! abandoned (its future dropped) and **not answered**: the runtime has already given up, dropped
//! the plugin and let the operation proceed; an error reply that raced ahead of the runtime's own
//! timer would instead be taken as the plugin refusing, failing the CRI operation.
//!
//! # Runtime quirks seen in the conformance suite
//!
//! - The adaptation's `Stop` does not close external plugins' connections; a runtime that exits
//!   does (the suite cuts a proxy to simulate that).
//! - Chunked Synchronize (v0.8.0 and v0.12.5) scales the pods per chunk by a size ratio and
//!   truncates: with a single pod and over 4 MiB of containers the pod count per chunk becomes 0
//!   and the runtime sends empty `more` chunks until the request timeout, then drops the plugin.
//!   We answer each correctly; the loop is upstream's.
//!
//! # Tested against
//!
//! The conformance suite (`tests/conformance/nri`, run by `cargo xtask test`) drives this crate's
//! example plugins through containerd's own runtime side, `github.com/containerd/nri/pkg/adaptation`,
//! at two versions: **v0.12.5** (the newest release; NRI v0.12 runtimes such as containerd 2.4)
//! and **v0.8.0** (what containerd 1.7.26 to 2.1.x ship). The version table in [`version`] covers
//! containerd 1.7 to 2.2 and CRI-O 1.26 to 1.35; it has not been run against a live containerd or
//! CRI-O binary in CI.

// Generated code is exempt from our lints and docs; it is checked for freshness instead.
#[allow(
    missing_docs,
    missing_debug_implementations,
    clippy::all,
    clippy::pedantic
)]
mod generated {
    pub mod google {
        pub mod rpc {
            include!("generated/google.rpc.rs");
        }
    }
    pub mod ttrpc {
        include!("generated/ttrpc.rs");
    }
    pub mod nri {
        pub mod pkg {
            pub mod api {
                pub mod v1alpha1 {
                    include!("generated/nri.pkg.api.v1alpha1.rs");
                }
            }
        }
    }
}

/// The NRI messages (`nri.pkg.api.v1alpha1`), as prost types.
pub use generated::nri::pkg::api::v1alpha1 as api;

/// The ttrpc envelopes and `google.rpc.Status`, as prost types.
pub mod envelope {
    pub use crate::generated::google::rpc::Status;
    pub use crate::generated::ttrpc::{KeyValue, Request, Response};
}

pub mod events;
mod mux;
mod plugin;
mod rpc;
mod stub;
pub mod version;
pub mod wire;

pub use events::EventSet;
pub use mux::{Disconnect, SharedIoError};
pub use plugin::{Delivery, Plugin, PluginError, PluginErrorKind, RuntimeInfo, StateChange};
pub use rpc::{CallError, Status, code};
pub use stub::{
    DEFAULT_SOCKET_PATH, Endpoint, Handle, PLUGIN_NRI_VERSION, PLUGIN_SOCKET_ENV, StubConfig,
    StubError, UpdateError, UpdateLull, connect, connect_over, take_plugin_socket,
};

/// Re-exported so users build against the exact version our generated code was built with.
pub use prost;
