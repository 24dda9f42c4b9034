//! The resource manager: one policy serving two front ends.
//!
//! NRI events from the runtime and claim requests from the kubelet meet here, under one lock, with
//! durable state and the claim lifecycle (prepare = allocate, commit, write the CDI spec; unprepare
//! = remove the spec, release, commit). See ARCHITECTURE.md for the invariants this crate keeps.

pub mod kube;

pub use policy;
