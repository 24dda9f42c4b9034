//! Memory accounting per NUMA node, and widening a container's memory nodes by distance.
//!
//! Every node has a capacity (its memory) and a used amount (the memory requests charged to
//! it). A container's request is charged to the nodes of its zone, filling them in order. When
//! the zone's free memory is short of the request, the zone is widened one node at a time to the
//! closest node outside it (smallest distance from any node of the pool, then lower number),
//! among the kinds the container allows, until it fits. When even every allowed node does not
//! hold it, the request is refused: a node is never silently overcommitted.

use std::fmt::Write as _;

use crate::{
    idset::NodeSet,
    topology::{MemoryKind, Topology},
};

#[derive(Debug, Clone)]
struct NodeMemory {
    id: u32,
    kind: MemoryKind,
    capacity: u64,
    used: u64,
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
    /// Every node of `topo`, nothing charged.
    pub fn new(topo: &Topology) -> Self {
        let mut nodes: Vec<NodeMemory> = topo
            .numa_nodes
            .iter()
            .map(|n| NodeMemory {
                id: n.id,
                kind: n.kind,
                capacity: n.memory_bytes,
                used: 0,
            })
            .collect();
        nodes.sort_by_key(|n| n.id);
        Self { nodes }
    }

    fn node(&self, id: u32) -> Option<&NodeMemory> {
        // Nodes are in ascending order (the topology's).
        let i = self.nodes.binary_search_by_key(&id, |n| n.id).ok()?;
        self.nodes.get(i)
    }

    /// Bytes still free on node `id`.
    pub fn free(&self, id: u32) -> u64 {
        self.node(id)
            .map_or(0, |n| n.capacity.saturating_sub(n.used))
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
                        mib(self.node(*id).map_or(0, |n| n.capacity))
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

    /// Whether nothing is charged anywhere.
    pub fn is_empty(&self) -> bool {
        self.nodes.iter().all(|n| n.used == 0)
    }
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
        let mut ledger = Ledger::new(&topo);
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
}
