//! A Rust NRI (Node Resource Interface) plugin stub.
//!
//! Speaks the NRI protocol to containerd and CRI-O (a connection multiplexer carrying two ttrpc
//! channels over one unix socket) and hands typed events to a `Plugin`. It knows nothing of DRA,
//! claims or policies.
