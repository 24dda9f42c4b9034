//! What std lacks and every crate of the workspace may want, knowing nothing of resmgr: a leaf
//! crate with no dependency but tokio's mutex, as rust-analyzer's `stdx` is to rust-analyzer.
//!
//! - [`errors`]: the one error-chain printer, for answers, logs and the binary's last line;
//! - [`sync`]: the one poison-tolerant lock of a std mutex;
//! - [`scoped`]: the async lock held only for a plain closure, so never across an await;
//! - `logs` (feature `capture-logs`, for tests): what a closure logs, captured.
//!
//! A helper belongs here only if it is generic (no domain type, no protocol, no IO policy) and
//! more than one crate uses it, or its tests must build it alone ([`scoped`]'s compile-fail
//! cases).

pub mod errors;
#[cfg(feature = "capture-logs")]
pub mod logs;
pub mod scoped;
pub mod sync;
