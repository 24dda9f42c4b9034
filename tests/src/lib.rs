//! Cross-crate integration tests of resmgr.
//!
//! The library is empty on purpose: the tests live in `tests/tests/*.rs`, each a scenario that
//! crosses crate boundaries (the resource manager driven through its real front ends). Protocol
//! conformance against the upstream Go implementations lives in `tests/conformance`, a Go module
//! run by `cargo xtask test`.
