//! Cross-crate integration tests of resmgr.
//!
//! The tests live in `tests/tests/*.rs`, each a scenario that crosses crate boundaries (the
//! resource manager driven through its real front ends, or one of its boundaries against a fake
//! peer); the library is the one home of the test doubles and the node set-up they share:
//! [`fakes`] (a policy, runtimes, claims), [`fake_apiserver`] (a Kubernetes API server, also run
//! as the `fake-apiserver` binary by the Go agent suite), [`kubelet`] (the played kubelet, the
//! e2e runner's too) and [`node`]; of what the randomized models share ([`on_disk`], what a
//! node's disk says, [`rng`], their seeded randomness, and [`settings`], theirs from the
//! environment); and of the fault hooks
//! the manager's fault seam takes ([`resmgr::faults`]): [`faults`], the faults a test arms, and
//! [`crash`], the crash tests' abort at a named point (in the `crash-child` binary, and in
//! `resmgr-crashing`, the agent with that hook, which the Go agent suite runs). Protocol conformance
//! against the upstream Go implementations lives in `tests/conformance`, a Go module run by
//! `cargo xtask test`.

pub mod crash;
pub mod fake_apiserver;
pub mod fakes;
pub mod faults;
pub mod kubelet;
pub mod node;
pub mod on_disk;
pub mod rng;
pub mod settings;
