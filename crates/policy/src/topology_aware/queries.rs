//! The read side of the topology-aware policy: the machine it places on, the pool tree, each
//! pool's CPUs split by use, where a container is placed, what a claim holds and each node's
//! memory account, for the simulator, tests and whoever inspects the policy.

use super::{Grant, Placement, PoolCpus, TopologyAware, claims::HeldClaim, pools::Pool};
use crate::{idset::CpuSet, topology::Topology};

impl TopologyAware {
    /// The topology it places on.
    pub fn topology(&self) -> &Topology {
        &self.topo
    }

    /// The pool tree, depth-first.
    pub fn pools(&self) -> &[Pool] {
        &self.pools
    }

    /// The reserved CPUs.
    pub fn reserved_cpus(&self) -> &CpuSet {
        &self.reserved
    }

    /// Pool `pool`'s CPUs, split into reserved, isolated, shared and exclusively granted.
    pub fn pool_cpus(&self, pool: usize) -> Option<PoolCpus> {
        let p = self.pools.get(pool)?;
        let isolated = p.cpus.intersection(&self.isolated);
        Some(PoolCpus {
            reserved: p.cpus.intersection(&self.reserved),
            isolated_granted: isolated.intersection(&self.isolated_taken),
            isolated: isolated.difference(&self.isolated_taken),
            shared: self.shared.get(pool).cloned().unwrap_or_default(),
            exclusive: p.cpus.intersection(&self.taken),
        })
    }

    /// The shared CPUs of the root pool: every CPU not reserved, isolated or taken.
    pub fn shared_cpus(&self) -> CpuSet {
        self.shared.first().cloned().unwrap_or_default()
    }

    /// Where a container is placed.
    pub fn placement(&self, container_id: &str) -> Option<Placement> {
        let p = self.containers.get(container_id)?;
        let pool = match &p.grant {
            Grant::Shared { pool, .. }
            | Grant::Exclusive { pool, .. }
            | Grant::Isolated { pool, .. } => self.pools.get(*pool).map(|p| p.name.clone()),
            Grant::Reserved | Grant::Claim { .. } => None,
        };
        Some(Placement {
            grant: p.grant.clone(),
            pool,
            cpus: self.cpus_of(&p.grant),
            mems: p.mems.clone(),
        })
    }

    /// The ids of the containers placed.
    pub fn container_ids(&self) -> Vec<String> {
        self.containers.keys().cloned().collect()
    }

    /// The CPUs a claim holds.
    pub fn claim_cpus(&self, uid: &str) -> Option<CpuSet> {
        self.claims.get(uid).map(HeldClaim::cpus)
    }

    /// Bytes of memory requests of containers charged to NUMA node `node`.
    pub fn memory_used(&self, node: u32) -> u64 {
        self.ledger.used(node)
    }

    /// Bytes of memory claims hold on NUMA node `node`.
    pub fn memory_claimed(&self, node: u32) -> u64 {
        self.ledger.claimed(node)
    }

    /// Bytes of hugepages of `page_size` claims hold on NUMA node `node`.
    pub fn hugepages_claimed(&self, node: u32, page_size: u64) -> u64 {
        self.ledger.hugepages_claimed(node, page_size)
    }
}
