//! Cross-crate integration tests of resmgr.
//!
//! The tests live in `tests/tests/*.rs`, each a scenario that crosses crate boundaries (the
//! resource manager driven through its real front ends); the library holds the test doubles and
//! the node set-up they share ([`fakes`], [`node`]). Protocol conformance against the upstream Go implementations lives in
//! `tests/conformance`, a Go module run by `cargo xtask test`.

pub mod fakes;
pub mod node;
