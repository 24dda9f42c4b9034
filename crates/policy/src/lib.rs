//! Pure placement decisions: domain types, the `Policy` trait, topology, the topology-aware policy.
//!
//! The policy decides which CPUs and memory nodes each container and each DRA claim gets. It does
//! no IO except topology discovery and knows nothing of gRPC, NRI wire types or files.
//!
//! - [`api`]: the [`Policy`] trait and its contract. Teams that want other decisions implement it;
//!   `examples/first_fit.rs` is a whole policy in under 150 lines.
//! - [`claim_env`]: the environment a claim's CDI spec gives a container, and the evidence that a
//!   container uses a claim, which the resource manager reads without asking a policy.
//! - [`model`]: the domain types the resource manager translates wire messages into.
//! - [`inventory`]: what a policy reports it has placed where, for metrics, debugging and the
//!   simulator.
//! - [`scheduler`]: a model of how kube-scheduler allocates claims from the devices a policy
//!   publishes, for the simulator and tests that put the scheduler's view next to the node's.
//! - [`topology`]: the machine (packages, dies, NUMA nodes, L3 groups, cores, threads, online and
//!   isolated CPUs), discovered through hwloc from the live machine, a synthetic description or
//!   an XML export.
//! - [`topology_aware`]: the policy resmgr ships, with its measured cost.
//! - [`idset`], [`quantity`]: the kernel's cpu/node list format and Kubernetes quantities.

pub mod api;
pub mod claim_env;
pub mod idset;
pub mod inventory;
pub mod model;
pub mod quantity;
pub mod scheduler;
pub mod topology;
pub mod topology_aware;

pub use api::{Generations, Policy, PolicyError, SnapshotError};
pub use idset::{CpuSet, IdSet, IdSetParseError, NodeSet};
pub use inventory::{
    ClaimPlacement, ContainerPlacement, Fallback, GrantKind, Inventory, PoolUsage,
};
pub use model::{
    Adjustment, Allocation, AllocationResult, AttributeValue, Capacity, Claim, ClaimAllocation,
    ClaimConfig, ConfigSource, Container, ContainerUpdate, Device, DeviceTaint, Pod, QosClass,
    RequestPolicy, Resources, TaintEffect, ValidValues,
};
pub use quantity::{Quantity, QuantityParseError};
pub use topology::{Topology, TopologyError, TopologySource};
pub use topology_aware::{Config, TopologyAware};
