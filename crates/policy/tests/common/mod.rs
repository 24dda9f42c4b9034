//! What the policy's integration tests share: the machine most of them run on, and cpuset
//! literals.

// Each test binary includes this module and uses what it needs of it.
#![allow(dead_code)]

use policy::{
    CpuSet, Topology, TopologyAware, TopologySource,
    topology_aware::{Config, Exclusivity, ReservedCpus},
};

/// Two sockets of two NUMA nodes of 8 two-thread cores (4 NUMA nodes; numa1 is CPUs 16-31,
/// cores 16-17, 18-19, ...), CPUs 0-1 reserved, exclusive CPUs through claims only (the
/// default).
pub fn machine() -> TopologyAware {
    machine_with(Exclusivity::Claims)
}

/// [`machine`] with another exclusivity setting.
pub fn machine_with(exclusivity: Exclusivity) -> TopologyAware {
    let topo = Topology::load(&TopologySource::Synthetic(
        "pack:2 numa:2 core:8 pu:2".into(),
    ))
    .unwrap();
    let config = Config {
        reserved_cpus: ReservedCpus::Set("0-1".parse().unwrap()),
        exclusivity,
        ..Config::default()
    };
    TopologyAware::new(topo, config).unwrap()
}

/// A cpuset from the kernel's list format.
pub fn set(s: &str) -> CpuSet {
    s.parse().unwrap()
}
