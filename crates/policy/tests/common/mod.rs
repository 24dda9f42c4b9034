//! What the policy's integration tests share: the machine most of them run on, cpuset
//! literals, and a claim's `CpuConfig`.

// Each test binary includes this module and uses what it needs of it.
#![allow(dead_code)]

use policy::{
    ClaimConfig, ConfigSource, CpuSet, Topology, TopologyAware, TopologySource,
    topology_aware::{Config, Exclusivity, ReservedCpus},
};
use serde_json::{Value, json};

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

/// A `CpuConfig` with `fields`.
pub fn cpu_config(fields: Value) -> Value {
    let mut v = json!({"apiVersion": "resmgr.io/v1alpha1", "kind": "CpuConfig"});
    v.as_object_mut()
        .unwrap()
        .extend(fields.as_object().unwrap().clone());
    v
}

/// A claim's configuration for `requests` (all of them, if empty): a `CpuConfig` with `fields`.
pub fn from_claim(requests: &[&str], fields: Value) -> ClaimConfig {
    ClaimConfig {
        source: ConfigSource::Claim,
        requests: requests.iter().map(|r| (*r).to_owned()).collect(),
        parameters: cpu_config(fields),
    }
}
