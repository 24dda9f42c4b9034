//! Pure placement decisions: domain types, the `Policy` trait, topology, the topology-aware policy.
//!
//! The policy decides which CPUs and memory nodes each container and each DRA claim gets. It does
//! no IO except topology discovery and knows nothing of gRPC, NRI wire types or files.

pub mod topology;
