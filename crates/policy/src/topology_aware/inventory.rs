//! The topology-aware policy's [`Inventory`]: its pool tree with each pool's CPUs split by use,
//! every container's grant and every claim's CPUs, read straight from the policy's state.

use super::{Grant, TopologyAware, pools::PoolKind};
use crate::{
    idset::{CpuSet, NodeSet},
    inventory::{ClaimPlacement, ContainerPlacement, Fallback, GrantKind, Inventory, PoolUsage},
};

/// What `p` has placed where.
pub(super) fn of(p: &TopologyAware) -> Inventory {
    let reserved = p.reserved.clone();
    let shared = p.shared_cpus();
    let claims: Vec<ClaimPlacement> = p
        .claims
        .values()
        .map(|c| ClaimPlacement {
            uid: c.uid.clone(),
            namespace: c.namespace.clone(),
            name: c.name.clone(),
            devices: c.results.iter().map(|r| r.device.clone()).collect(),
            cpus: c.cpus(),
            // A result whose configuration leaves memory to the runtime grants no node.
            mems: c
                .results
                .iter()
                .filter(|r| r.memory_pinning)
                .fold(NodeSet::new(), |acc, r| acc.union(&r.mems)),
            memory: c.results.iter().map(|r| r.memory).sum(),
            hugepages: c.results.iter().flat_map(|r| &r.hugepages).fold(
                std::collections::BTreeMap::new(),
                |mut all, (size, bytes)| {
                    *all.entry(*size).or_default() += bytes;
                    all
                },
            ),
        })
        .collect();
    let containers: Vec<ContainerPlacement> = p
        .containers
        .iter()
        .map(|(id, placed)| {
            let (grant, pool) = match &placed.grant {
                Grant::Reserved => (GrantKind::Reserved, None),
                Grant::Shared { pool, .. } => (GrantKind::Shared, Some(*pool)),
                Grant::Exclusive { pool, .. } => (GrantKind::Exclusive, Some(*pool)),
                Grant::Isolated { pool, .. } => (GrantKind::Isolated, Some(*pool)),
                Grant::Claim { .. } => (GrantKind::Claim, None),
            };
            ContainerPlacement {
                id: id.clone(),
                grant,
                pool: pool
                    .and_then(|i| p.pools.get(i))
                    .map(|pool| pool.name.clone()),
                cpus: p.cpus_of(&placed.grant),
                mems: placed.mems.clone(),
                fallbacks: fallbacks(p, placed),
            }
        })
        .collect();
    // Exclusive means a container's own CPUs, isolated or not; claims are counted apart.
    let exclusive = containers
        .iter()
        .filter(|c| matches!(c.grant, GrantKind::Exclusive | GrantKind::Isolated))
        .fold(CpuSet::new(), |acc, c| acc.union(&c.cpus));
    let claimed = claims
        .iter()
        .fold(CpuSet::new(), |acc, c| acc.union(&c.cpus));
    let pools = p
        .pools
        .iter()
        .map(|pool| PoolUsage {
            name: pool.name.clone(),
            kind: kind_name(pool.kind).to_owned(),
            depth: pool.depth,
            cpus: pool.cpus.clone(),
            reserved: pool.cpus.intersection(&reserved),
            shared: pool.cpus.intersection(&shared),
            exclusive: pool.cpus.intersection(&exclusive),
            claimed: pool.cpus.intersection(&claimed),
        })
        .collect();
    Inventory {
        reserved,
        shared,
        pools,
        containers,
        claims,
    }
}

/// What was done for a container instead of refusing it: at placement, and where its shared
/// CPUs come from now.
fn fallbacks(p: &TopologyAware, placed: &super::Placed) -> Vec<Fallback> {
    let mut out = placed.fallbacks.clone();
    if let Grant::Shared { pool, .. } = &placed.grant {
        out.extend(p.shared_fallback(*pool));
    }
    out.sort_unstable();
    out
}

fn kind_name(kind: PoolKind) -> &'static str {
    match kind {
        PoolKind::Root => "root",
        PoolKind::Socket => "socket",
        PoolKind::Die => "die",
        PoolKind::Numa => "numa",
        PoolKind::L3 => "l3",
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::{
        api::Policy,
        model::{AllocationResult, Claim, Container, Pod, QosClass, Resources},
        quantity::Quantity,
        topology::{Topology, TopologySource},
        topology_aware::{ClaimCpus, Config, Exclusivity, ReservedCpus},
    };

    fn set(s: &str) -> CpuSet {
        s.parse().unwrap()
    }

    fn container(id: &str, namespace: &str, qos: QosClass, cpu_milli: u64) -> Container {
        Container {
            id: id.into(),
            pod: Pod {
                uid: format!("pod-{id}"),
                namespace: namespace.into(),
                name: format!("pod-{id}"),
                qos,
                ..Pod::default()
            },
            name: id.into(),
            resources: Resources {
                cpu_request_milli: cpu_milli,
                cpu_limit_milli: (qos == QosClass::Guaranteed).then_some(cpu_milli),
                ..Resources::default()
            },
            ..Container::default()
        }
    }

    /// Two NUMA nodes of four single-thread cores (CPUs 0-3, 4-7), CPU 0 reserved and numa1's
    /// CPUs published for claims; a system pod on the reserved CPU, a Burstable container
    /// shared, 2 exclusive CPUs for a database, and a 2-CPU claim on numa1.
    fn scenario() -> TopologyAware {
        let topo = Topology::load(&TopologySource::Synthetic(
            "pack:1 numa:2 core:4 pu:1".into(),
        ))
        .unwrap();
        let config = Config {
            reserved_cpus: ReservedCpus::Set(set("0")),
            exclusivity: Exclusivity::Partition(ClaimCpus::Set(set("4-7"))),
            ..Config::default()
        };
        let mut p = TopologyAware::new(topo, config).unwrap();
        p.allocate(&container("sys", "kube-system", QosClass::Burstable, 100))
            .unwrap();
        p.allocate(&container("web", "default", QosClass::Burstable, 500))
            .unwrap();
        p.allocate(&container("db", "default", QosClass::Guaranteed, 2000))
            .unwrap();
        p.allocate_claim(&Claim {
            uid: "uid-1".into(),
            namespace: "ml".into(),
            name: "trainer".into(),
            reserved_for: vec!["pod-x".into()],
            results: vec![AllocationResult {
                request: "cpus".into(),
                pool: "node".into(),
                device: "numa1".into(),
                share_id: None,
                consumed_capacity: BTreeMap::from([("cpu".into(), Quantity::from_units(2))]),
            }],
            ..Claim::default()
        })
        .unwrap();
        p
    }

    fn pool(
        name: &str,
        kind: &str,
        depth: usize,
        [cpus, reserved, shared, exclusive, claimed]: [&str; 5],
    ) -> PoolUsage {
        PoolUsage {
            name: name.into(),
            kind: kind.into(),
            depth,
            cpus: set(cpus),
            reserved: set(reserved),
            shared: set(shared),
            exclusive: set(exclusive),
            claimed: set(claimed),
        }
    }

    #[test]
    fn every_pool_splits_its_cpus_into_reserved_shared_exclusive_and_claimed() {
        let inv = scenario().inventory();
        assert_eq!((inv.reserved, inv.shared), (set("0"), set("3,6-7")));
        // db's two exclusive CPUs come out of numa0 (1-2), the claim's out of numa1 (4-5).
        assert_eq!(
            inv.pools,
            vec![
                pool("root", "root", 0, ["0-7", "0", "3,6-7", "1-2", "4-5"]),
                pool("numa0", "numa", 1, ["0-3", "0", "3", "1-2", ""]),
                pool("numa1", "numa", 1, ["4-7", "", "6-7", "", "4-5"]),
            ]
        );
    }

    #[test]
    fn placements_name_each_containers_grant_pool_and_cpus_and_each_claims_devices() {
        let inv = scenario().inventory();
        let placed =
            |id: &str, grant, pool: Option<&str>, cpus: &str, mems: u32| ContainerPlacement {
                id: id.into(),
                grant,
                pool: pool.map(Into::into),
                cpus: set(cpus),
                mems: Some(NodeSet::from_iter([mems])),
                fallbacks: Vec::new(),
            };
        assert_eq!(
            inv.containers,
            vec![
                placed("db", GrantKind::Exclusive, Some("numa0"), "1-2", 0),
                placed("sys", GrantKind::Reserved, None, "0", 0),
                // A shared container runs on its pool's shared CPUs, which the claim cut down.
                placed("web", GrantKind::Shared, Some("numa1"), "6-7", 1),
            ]
        );
        assert_eq!(
            inv.claims,
            vec![ClaimPlacement {
                uid: "uid-1".into(),
                namespace: "ml".into(),
                name: "trainer".into(),
                devices: vec!["numa1".into()],
                cpus: set("4-5"),
                mems: NodeSet::from_iter([1]),
                ..ClaimPlacement::default()
            }]
        );
    }

    #[test]
    fn a_fresh_policy_reports_its_pools_and_nothing_placed() {
        let topo = Topology::load(&TopologySource::Synthetic("pack:1 core:4 pu:1".into())).unwrap();
        let inv = TopologyAware::new(topo, Config::default())
            .unwrap()
            .inventory();
        assert_eq!(inv.reserved, set("0"));
        assert_eq!(inv.shared, set("1-3"));
        assert_eq!(
            inv.pools,
            vec![pool("root", "root", 0, ["0-3", "0", "1-3", "", ""])]
        );
        assert!(inv.containers.is_empty() && inv.claims.is_empty());
    }
}
