//! The memory account of each NUMA node, shared by containers and claims, and widening a
//! container's memory nodes by distance.
//!
//! # One account per node
//!
//! Every node has a capacity (its memory, as hwloc reports it) and hugepages of each size the
//! kernel keeps for it. Out of the capacity come, in this order:
//!
//! - the memory **reserved** for the system ([`MemoryConfig::reserved`], the kubelet's
//!   `--reserved-memory`), which nothing here ever charges;
//! - the memory **set aside for claims** ([`MemoryConfig::claim_percent`] of what is left):
//!   published as the `memory` capacity of the node's device (see [`super::devices`]) and
//!   charged only by claims, up to exactly that amount;
//! - the rest, **for containers** placed through NRI: their memory requests are charged to it.
//!
//! So the slices never promise memory that containers use, and no container is refused for
//! memory a claim holds: what a container cannot have next to its CPUs is widened to other
//! nodes, else left unpinned (with a warning), as before. A container that uses a claim which
//! granted memory is not charged at all (the claim's grant is its memory); one whose claims
//! granted none is charged as any other container, on its claims' nodes. Nothing is charged
//! twice or not at all.
//!
//! Hugepages are only ever charged by claims: containers placed through NRI get them from the
//! kubelet (`resources`), which the agent does not see. With [`MemoryConfig::claim_hugepages`]
//! every page of every size the node keeps, less the reserved ones, is set aside for claims and
//! published (`hugepages2Mi`, `hugepages1Gi`); without it none is.
//!
//! # Widening
//!
//! A container's request is charged to the nodes of its zone, filling them in order. When the
//! zone's free memory is short of the request, the zone is widened one node at a time to the
//! closest node outside it (smallest distance from any node of the pool, then lower number),
//! among the kinds the container allows, until it fits. When even every allowed node does not
//! hold it, the request is refused: a node is never silently overcommitted.

use std::{collections::BTreeMap, fmt::Write as _};

use crate::{
    idset::NodeSet,
    topology::{MemoryKind, Topology, page_size_name},
};

/// What is reserved for the system on one NUMA node (one entry of the kubelet's
/// `--reserved-memory`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeReservation {
    /// Bytes of ordinary memory.
    pub memory: u64,
    /// Bytes of hugepages by page size in bytes; rounded up to whole pages.
    pub hugepages: BTreeMap<u64, u64>,
}

/// How each node's memory is split (see the module docs).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MemoryConfig {
    /// Reserved for the system, by node number.
    pub reserved: BTreeMap<u32, NodeReservation>,
    /// Percent (0 to 100) of each DRAM node's memory, less the reserved, set aside for claims and
    /// published; 0 publishes no memory (the default, and how every node published before).
    pub claim_percent: u32,
    /// Set every hugepage not reserved aside for claims and publish it.
    pub claim_hugepages: bool,
}

/// What one node offers claims.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeOffer {
    /// Bytes of memory set aside for claims.
    pub memory: u64,
    /// Bytes of hugepages set aside for claims, by page size in bytes (only sizes with pages).
    pub hugepages: BTreeMap<u64, u64>,
}

/// Granularity of the memory set aside for claims: published amounts are whole MiB.
const CLAIM_MEMORY_UNIT: u64 = 1 << 20;

#[derive(Debug, Clone)]
struct Hugepages {
    /// Bytes set aside for claims.
    claimable: u64,
    /// Bytes claims hold.
    claimed: u64,
}

#[derive(Debug, Clone)]
struct NodeMemory {
    id: u32,
    kind: MemoryKind,
    capacity: u64,
    reserved: u64,
    /// Set aside for claims.
    claimable: u64,
    /// Charged by containers.
    used: u64,
    /// Charged by claims.
    claimed: u64,
    hugepages: BTreeMap<u64, Hugepages>,
}

impl NodeMemory {
    /// What containers may be charged: the capacity less the reserved and the claims' share.
    fn for_containers(&self) -> u64 {
        self.capacity
            .saturating_sub(self.reserved)
            .saturating_sub(self.claimable)
    }
}

/// What a container's memory request was charged to.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Charge {
    /// The nodes the container's memory is pinned to: its pool's, widened if needed.
    pub mems: NodeSet,
    /// Bytes charged per node.
    pub parts: Vec<(u32, u64)>,
}

/// Per-node capacity and use.
#[derive(Debug, Clone)]
pub struct Ledger {
    nodes: Vec<NodeMemory>,
}

fn mib(bytes: u64) -> u64 {
    bytes >> 20
}

impl Ledger {
    /// Every node of `topo`, split as `config` says, nothing charged.
    pub fn new(topo: &Topology, config: &MemoryConfig) -> Self {
        let none = NodeReservation::default();
        let mut nodes: Vec<NodeMemory> = topo
            .numa_nodes
            .iter()
            .map(|n| {
                let reserved = config.reserved.get(&n.id).unwrap_or(&none);
                let left = n.memory_bytes.saturating_sub(reserved.memory);
                // Claims take DRAM next to their CPUs; memory-only nodes are not published.
                let claimable = if n.kind == MemoryKind::Dram && !n.is_memory_only() {
                    let share = u128::from(left) * u128::from(config.claim_percent.min(100)) / 100;
                    u64::try_from(share).unwrap_or(left) / CLAIM_MEMORY_UNIT * CLAIM_MEMORY_UNIT
                } else {
                    0
                };
                let hugepages = n
                    .hugepages
                    .iter()
                    .map(|(&size, &pages)| {
                        let kept = reserved
                            .hugepages
                            .get(&size)
                            .map_or(0, |bytes| bytes.div_ceil(size.max(1)));
                        let claimable = if config.claim_hugepages {
                            pages.saturating_sub(kept).saturating_mul(size)
                        } else {
                            0
                        };
                        (
                            size,
                            Hugepages {
                                claimable,
                                claimed: 0,
                            },
                        )
                    })
                    .collect();
                NodeMemory {
                    id: n.id,
                    kind: n.kind,
                    capacity: n.memory_bytes,
                    reserved: reserved.memory.min(n.memory_bytes),
                    claimable,
                    used: 0,
                    claimed: 0,
                    hugepages,
                }
            })
            .collect();
        nodes.sort_by_key(|n| n.id);
        Self { nodes }
    }

    /// What each node offers claims, by node number (nodes that offer nothing left out).
    pub fn offer(&self) -> BTreeMap<u32, NodeOffer> {
        self.nodes
            .iter()
            .filter_map(|n| {
                let hugepages: BTreeMap<u64, u64> = n
                    .hugepages
                    .iter()
                    .filter(|(_, h)| h.claimable > 0)
                    .map(|(&size, h)| (size, h.claimable))
                    .collect();
                (n.claimable > 0 || !hugepages.is_empty()).then_some({
                    (
                        n.id,
                        NodeOffer {
                            memory: n.claimable,
                            hugepages,
                        },
                    )
                })
            })
            .collect()
    }

    /// Bytes of the claims' share of node `id` that no claim holds.
    pub fn claim_free(&self, id: u32) -> u64 {
        self.node(id)
            .map_or(0, |n| n.claimable.saturating_sub(n.claimed))
    }

    /// Bytes claims hold on node `id`.
    pub fn claimed(&self, id: u32) -> u64 {
        self.node(id).map_or(0, |n| n.claimed)
    }

    /// Bytes of hugepages of `size` set aside for claims on node `id` that no claim holds;
    /// `None` when the node keeps no hugepages of that size for claims.
    pub fn hugepages_free(&self, id: u32, size: u64) -> Option<u64> {
        let h = self.node(id)?.hugepages.get(&size)?;
        (h.claimable > 0).then(|| h.claimable.saturating_sub(h.claimed))
    }

    /// Bytes of hugepages of `size` claims hold on node `id`.
    pub fn hugepages_claimed(&self, id: u32, size: u64) -> u64 {
        self.node(id)
            .and_then(|n| n.hugepages.get(&size))
            .map_or(0, |h| h.claimed)
    }

    /// Charges a claim's grant on node `id`: `memory` bytes and hugepages by size. A claim
    /// restored from an earlier configuration may hold more than is set aside now: it keeps it
    /// (its pods may be using it), and nothing more is free until it goes.
    pub fn charge_claim(&mut self, id: u32, memory: u64, hugepages: &BTreeMap<u64, u64>) {
        if let Some(n) = self.nodes.iter_mut().find(|n| n.id == id) {
            n.claimed = n.claimed.saturating_add(memory);
            for (size, bytes) in hugepages {
                let h = n.hugepages.entry(*size).or_insert(Hugepages {
                    claimable: 0,
                    claimed: 0,
                });
                h.claimed = h.claimed.saturating_add(*bytes);
            }
        }
    }

    /// Takes a claim's charge back.
    pub fn uncharge_claim(&mut self, id: u32, memory: u64, hugepages: &BTreeMap<u64, u64>) {
        if let Some(n) = self.nodes.iter_mut().find(|n| n.id == id) {
            n.claimed = n.claimed.saturating_sub(memory);
            for (size, bytes) in hugepages {
                if let Some(h) = n.hugepages.get_mut(size) {
                    h.claimed = h.claimed.saturating_sub(*bytes);
                }
            }
        }
    }

    /// Forgets every container's charge, keeping the claims' (a sync places them again).
    pub fn clear_containers(&mut self) {
        for n in &mut self.nodes {
            n.used = 0;
        }
    }

    fn node(&self, id: u32) -> Option<&NodeMemory> {
        // Nodes are in ascending order (the topology's).
        let i = self.nodes.binary_search_by_key(&id, |n| n.id).ok()?;
        self.nodes.get(i)
    }

    /// Bytes still free for containers on node `id`.
    pub fn free(&self, id: u32) -> u64 {
        self.node(id)
            .map_or(0, |n| n.for_containers().saturating_sub(n.used))
    }

    /// Bytes charged to node `id`.
    pub fn used(&self, id: u32) -> u64 {
        self.node(id).map_or(0, |n| n.used)
    }

    /// Plans charging `request` bytes to `base` (widening as the module docs say), measuring
    /// distance from `reference`; `Err` says what did not fit and where.
    pub fn plan(
        &self,
        topo: &Topology,
        reference: &NodeSet,
        base: &NodeSet,
        kinds: &[MemoryKind],
        request: u64,
    ) -> Result<Charge, String> {
        let mut order: Vec<u32> = base.iter().collect();
        let mut free: u64 = order.iter().map(|&id| self.free(id)).sum();
        // An empty zone (the allowed kinds have no node in the pool) widens to one node even
        // for a zero request: a container cannot be pinned to no memory at all.
        while free < request || order.is_empty() {
            let next = self
                .nodes
                .iter()
                .filter(|n| kinds.contains(&n.kind) && !order.contains(&n.id))
                .min_by_key(|n| {
                    let d = reference
                        .iter()
                        .chain(order.iter().copied())
                        .map(|r| topo.distance(r, n.id))
                        .min()
                        .unwrap_or(u32::MAX);
                    (d, n.id)
                });
            let Some(next) = next else {
                let mut reason = format!(
                    "needs {} MiB of memory, nodes {} have {} MiB free",
                    mib(request),
                    order.iter().copied().collect::<NodeSet>(),
                    mib(free)
                );
                for id in &order {
                    let _ = write!(
                        reason,
                        "; node {id}: {} of {} MiB used",
                        mib(self.used(*id)),
                        mib(self.node(*id).map_or(0, NodeMemory::for_containers))
                    );
                }
                return Err(reason);
            };
            order.push(next.id);
            free = free.saturating_add(self.free(next.id));
        }
        let mut parts = Vec::new();
        let mut left = request;
        for &id in &order {
            if left == 0 {
                break;
            }
            let take = self.free(id).min(left);
            if take > 0 {
                parts.push((id, take));
                left -= take;
            }
        }
        Ok(Charge {
            mems: order.into_iter().collect(),
            parts,
        })
    }

    /// Applies a planned charge.
    pub fn charge(&mut self, parts: &[(u32, u64)]) {
        for &(id, bytes) in parts {
            if let Some(n) = self.nodes.iter_mut().find(|n| n.id == id) {
                n.used = n.used.saturating_add(bytes);
            }
        }
    }

    /// Takes a charge back.
    pub fn uncharge(&mut self, parts: &[(u32, u64)]) {
        for &(id, bytes) in parts {
            if let Some(n) = self.nodes.iter_mut().find(|n| n.id == id) {
                n.used = n.used.saturating_sub(bytes);
            }
        }
    }

    /// Whether nothing is charged anywhere, by containers or claims.
    pub fn is_empty(&self) -> bool {
        self.nodes
            .iter()
            .all(|n| n.used == 0 && n.claimed == 0 && n.hugepages.values().all(|h| h.claimed == 0))
    }
}

/// The capacity name a hugepage size is published under: `hugepages2Mi`, `hugepages1Gi`. The
/// Kubernetes resource name has a hyphen (`hugepages-2Mi`), which a ResourceSlice capacity name
/// (a C identifier) cannot have.
pub fn hugepage_capacity(page_size: u64) -> String {
    format!("hugepages{}", page_size_name(page_size))
}

/// The page size in bytes a capacity name stands for, if it is a hugepage capacity.
pub fn hugepage_size(capacity: &str) -> Option<u64> {
    let size: crate::quantity::Quantity = capacity.strip_prefix("hugepages")?.parse().ok()?;
    let bytes = size.units_ceil();
    (bytes > 0 && size.milli().is_multiple_of(1000)).then_some(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::TopologySource;

    const GIB: u64 = 1 << 30;

    fn nodes(s: &str) -> NodeSet {
        s.parse().unwrap()
    }

    #[test]
    fn widens_to_the_closest_node_and_refuses_what_does_not_fit() {
        // Four 1 GiB nodes, 0-1 on socket 0, 2-3 on socket 1.
        let topo = Topology::load(&TopologySource::Synthetic(
            "pack:2 numa:2 core:1 pu:1".into(),
        ))
        .unwrap();
        let mut ledger = Ledger::new(&topo, &MemoryConfig::default());
        let dram = [MemoryKind::Dram];
        let c = ledger
            .plan(&topo, &nodes("2"), &nodes("2"), &dram, GIB / 2)
            .unwrap();
        assert_eq!(c.mems, nodes("2"));
        ledger.charge(&c.parts);
        // 1 GiB more on node 2: widened to node 3 (same socket), not 0.
        let c = ledger
            .plan(&topo, &nodes("2"), &nodes("2"), &dram, GIB)
            .unwrap();
        assert_eq!(c.mems, nodes("2-3"));
        assert_eq!(c.parts, [(2, GIB / 2), (3, GIB / 2)]);
        ledger.charge(&c.parts);
        let err = ledger
            .plan(&topo, &nodes("2"), &nodes("2"), &dram, 3 * GIB)
            .unwrap_err();
        assert!(
            err.starts_with("needs 3072 MiB of memory, nodes 0-3 have 2560 MiB free"),
            "{err}"
        );
        ledger.uncharge(&c.parts);
        ledger.uncharge(&[(2, GIB / 2)]);
        assert!(ledger.is_empty());
    }

    #[test]
    fn containers_never_get_what_is_reserved_or_set_aside_for_claims() {
        let mut topo = Topology::load(&TopologySource::Synthetic(
            "pack:1 numa:2(memory=8GiB) core:1 pu:1".into(),
        ))
        .unwrap();
        topo.numa_nodes[1].hugepages = BTreeMap::from([(2 << 20, 512), (1 << 30, 2)]);
        let config = MemoryConfig {
            reserved: BTreeMap::from([(
                1,
                NodeReservation {
                    memory: 2 * GIB,
                    hugepages: BTreeMap::from([(2 << 20, 3 << 20)]),
                },
            )]),
            claim_percent: 50,
            claim_hugepages: true,
        };
        let mut ledger = Ledger::new(&topo, &config);
        // Node 1: 8 GiB, 2 reserved, half of the other 6 for claims.
        assert_eq!(ledger.free(1), 3 * GIB);
        assert_eq!(ledger.claim_free(1), 3 * GIB);
        assert_eq!(ledger.free(0), 4 * GIB);
        // 3 MiB reserved is 2 whole pages of 2 MiB.
        assert_eq!(ledger.hugepages_free(1, 2 << 20), Some(510 << 21));
        assert_eq!(ledger.hugepages_free(1, 1 << 30), Some(2 * GIB));
        assert_eq!(ledger.hugepages_free(0, 2 << 20), None);
        let offer = ledger.offer();
        assert_eq!(offer[&1].memory, 3 * GIB);
        assert_eq!(offer[&1].hugepages.len(), 2);
        // A claim's charge and a container's never meet.
        let huge = BTreeMap::from([(1 << 30, GIB)]);
        ledger.charge_claim(1, 3 * GIB, &huge);
        assert_eq!(ledger.claim_free(1), 0);
        assert_eq!(ledger.free(1), 3 * GIB);
        assert_eq!(ledger.hugepages_free(1, 1 << 30), Some(GIB));
        let err = ledger
            .plan(
                &topo,
                &nodes("1"),
                &nodes("1"),
                &[MemoryKind::Dram],
                4 * GIB,
            )
            .unwrap();
        assert_eq!(
            err.parts,
            [(1, 3 * GIB), (0, GIB)],
            "widened, not into the claims' share"
        );
        ledger.clear_containers();
        assert!(!ledger.is_empty(), "a sync keeps the claims' charges");
        ledger.uncharge_claim(1, 3 * GIB, &huge);
        assert!(ledger.is_empty());
    }

    #[test]
    fn hugepage_capacities_are_named_as_kubernetes_names_the_sizes() {
        assert_eq!(hugepage_capacity(2 << 20), "hugepages2Mi");
        assert_eq!(hugepage_capacity(1 << 30), "hugepages1Gi");
        assert_eq!(hugepage_capacity(64 << 10), "hugepages64Ki");
        assert_eq!(hugepage_size("hugepages2Mi"), Some(2 << 20));
        assert_eq!(hugepage_size("hugepages1Gi"), Some(1 << 30));
        assert_eq!(hugepage_size("memory"), None);
        assert_eq!(hugepage_size("hugepages"), None);
    }
}
