//! The pool tree: the machine cut into nested CPU pools along its topology.
//!
//! The root covers every online CPU. Below it, as the machine has them: sockets (only when
//! there are several, else socket 0 is the root), dies (when a socket has several), NUMA nodes
//! (when a socket or die has several), L3 groups (when a socket, die or NUMA node has several).
//! A level with a single member is skipped, so every pool is strictly smaller than its parent.
//! Pools are numbered depth-first, parents before children, which makes "lower id" a stable
//! tie-breaker and lets one pass over the pools see every ancestor before its descendants.

use std::fmt;

use crate::{
    idset::{CpuSet, NodeSet},
    topology::{MemoryKind, Topology},
};

/// What part of the machine a pool stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolKind {
    /// Every socket.
    Root,
    /// One socket.
    Socket,
    /// One die of a socket.
    Die,
    /// One NUMA node's CPUs.
    Numa,
    /// Cores sharing an L3 cache.
    L3,
}

/// One pool of the tree.
#[derive(Debug, Clone)]
pub struct Pool {
    /// Depth-first index; the root is 0.
    pub id: usize,
    /// A name for errors and logs: `root`, `socket1`, `die0.1`, `numa3`, `l3.5`.
    pub name: String,
    /// What it stands for.
    pub kind: PoolKind,
    /// The enclosing pool.
    pub parent: Option<usize>,
    /// Distance from the root.
    pub depth: usize,
    /// Its online CPUs.
    pub cpus: CpuSet,
    /// The DRAM nodes local to its CPUs.
    pub nodes: NodeSet,
    /// Memory-only nodes whose closest CPU node is among `nodes`, with their kind.
    pub memory_only: Vec<(u32, MemoryKind)>,
}

impl fmt::Display for Pool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name)
    }
}

/// Builds the tree; pools come back depth-first, root first.
pub fn build(topo: &Topology) -> Vec<Pool> {
    let mut b = Builder {
        topo,
        pools: Vec::new(),
    };
    if topo.packages.len() > 1 {
        let root = b.push("root".into(), PoolKind::Root, None, topo.online.clone());
        for p in &topo.packages {
            let id = b.push(
                format!("socket{}", p.id),
                PoolKind::Socket,
                Some(root),
                p.cpus.clone(),
            );
            b.expand_socket(id, p.id);
        }
    } else {
        let root = b.push("root".into(), PoolKind::Root, None, topo.online.clone());
        if let Some(p) = topo.packages.first() {
            b.expand_socket(root, p.id);
        }
    }
    let mut pools = b.pools;
    attach_memory_only(topo, &mut pools);
    pools
}

struct Builder<'t> {
    topo: &'t Topology,
    pools: Vec<Pool>,
}

impl Builder<'_> {
    fn push(&mut self, name: String, kind: PoolKind, parent: Option<usize>, cpus: CpuSet) -> usize {
        let id = self.pools.len();
        let depth = parent
            .and_then(|p| self.pools.get(p))
            .map_or(0, |p| p.depth + 1);
        let nodes = self
            .topo
            .numa_nodes
            .iter()
            .filter(|n| n.kind == MemoryKind::Dram && n.cpus.intersects(&cpus))
            .map(|n| n.id)
            .collect();
        self.pools.push(Pool {
            id,
            name,
            kind,
            parent,
            depth,
            cpus,
            nodes,
            memory_only: Vec::new(),
        });
        id
    }

    fn expand_socket(&mut self, pool: usize, package: u32) {
        let dies: Vec<CpuSet> = self
            .topo
            .dies
            .iter()
            .filter(|d| d.package == package && !d.cpus.is_empty())
            .map(|d| d.cpus.clone())
            .collect();
        if dies.len() > 1 {
            for (i, cpus) in dies.into_iter().enumerate() {
                let id = self.push(
                    format!("die{package}.{i}"),
                    PoolKind::Die,
                    Some(pool),
                    cpus.clone(),
                );
                self.expand_group(id, &cpus);
            }
        } else {
            let cpus = self.cpus_of(pool);
            self.expand_group(pool, &cpus);
        }
    }

    fn expand_group(&mut self, pool: usize, cpus: &CpuSet) {
        let nodes: Vec<(u32, CpuSet)> = self
            .topo
            .numa_nodes
            .iter()
            .map(|n| (n.id, n.cpus.intersection(cpus)))
            .filter(|(_, c)| !c.is_empty())
            .collect();
        if nodes.len() > 1 {
            for (node, cpus) in nodes {
                let id = self.push(
                    format!("numa{node}"),
                    PoolKind::Numa,
                    Some(pool),
                    cpus.clone(),
                );
                self.expand_l3(id, &cpus);
            }
        } else {
            self.expand_l3(pool, cpus);
        }
    }

    fn expand_l3(&mut self, pool: usize, cpus: &CpuSet) {
        let groups: Vec<(usize, CpuSet)> = self
            .topo
            .l3_groups
            .iter()
            .enumerate()
            .map(|(i, g)| (i, g.cpus.intersection(cpus)))
            .filter(|(_, c)| !c.is_empty())
            .collect();
        if groups.len() > 1 {
            for (i, cpus) in groups {
                self.push(format!("l3.{i}"), PoolKind::L3, Some(pool), cpus);
            }
        }
    }

    fn cpus_of(&self, pool: usize) -> CpuSet {
        self.pools
            .get(pool)
            .map(|p| p.cpus.clone())
            .unwrap_or_default()
    }
}

/// Memory-only nodes join every pool that holds their closest CPU node (ties: lower number).
fn attach_memory_only(topo: &Topology, pools: &mut [Pool]) {
    for m in topo.numa_nodes.iter().filter(|n| n.is_memory_only()) {
        let closest = topo
            .numa_nodes
            .iter()
            .filter(|n| !n.is_memory_only())
            .min_by_key(|n| (m.distance_to(n.id).min(n.distance_to(m.id)), n.id));
        let Some(closest) = closest else { continue };
        for p in pools.iter_mut().filter(|p| p.nodes.contains(closest.id)) {
            p.memory_only.push((m.id, m.kind));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::TopologySource;

    fn tree(desc: &str) -> Vec<String> {
        let topo = Topology::load(&TopologySource::Synthetic(desc.into())).unwrap();
        build(&topo)
            .iter()
            .map(|p| {
                format!(
                    "{}{} {} mems {}",
                    "  ".repeat(p.depth),
                    p.name,
                    p.cpus,
                    p.nodes
                )
            })
            .collect()
    }

    #[test]
    fn two_sockets_of_two_numa_nodes() {
        assert_eq!(
            tree("pack:2 numa:2 core:2 pu:2"),
            [
                "root 0-15 mems 0-3",
                "  socket0 0-7 mems 0-1",
                "    numa0 0-3 mems 0",
                "    numa1 4-7 mems 1",
                "  socket1 8-15 mems 2-3",
                "    numa2 8-11 mems 2",
                "    numa3 12-15 mems 3",
            ]
        );
    }

    #[test]
    fn one_socket_is_the_root_and_single_member_levels_are_skipped() {
        assert_eq!(tree("pack:1 core:4 pu:1"), ["root 0-3 mems 0"]);
        assert_eq!(
            tree("pack:1 die:2 l3:2 core:2 pu:1"),
            [
                "root 0-7 mems 0",
                "  die0.0 0-3 mems 0",
                "    l3.0 0-1 mems 0",
                "    l3.1 2-3 mems 0",
                "  die0.1 4-7 mems 0",
                "    l3.2 4-5 mems 0",
                "    l3.3 6-7 mems 0",
            ]
        );
    }

    #[test]
    fn numa_nodes_split_into_l3_groups() {
        assert_eq!(
            tree("pack:1 numa:2 l3:2 core:1 pu:2"),
            [
                "root 0-7 mems 0-1",
                "  numa0 0-3 mems 0",
                "    l3.0 0-1 mems 0",
                "    l3.1 2-3 mems 0",
                "  numa1 4-7 mems 1",
                "    l3.2 4-5 mems 1",
                "    l3.3 6-7 mems 1",
            ]
        );
    }

    #[test]
    fn memory_only_nodes_attach_to_the_pools_of_their_closest_cpu_node() {
        let topo = Topology::load(&TopologySource::Synthetic(
            "pack:2 [numa(memory=64GiB)] [numa(memory=16GiB)] core:2 pu:1".into(),
        ))
        .unwrap();
        let pools = build(&topo);
        let names: Vec<(&str, Vec<(u32, MemoryKind)>)> = pools
            .iter()
            .map(|p| (p.name.as_str(), p.memory_only.clone()))
            .collect();
        assert_eq!(
            names,
            [
                ("root", vec![(1, MemoryKind::Hbm), (3, MemoryKind::Hbm)]),
                ("socket0", vec![(1, MemoryKind::Hbm)]),
                ("socket1", vec![(3, MemoryKind::Hbm)]),
            ]
        );
    }
}
