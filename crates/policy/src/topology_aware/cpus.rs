//! Picking exclusive CPUs: whole cores first, cache locality, tight packing.
//!
//! Given the CPUs free in a scope (a pool, or a NUMA node for a claim) and a count, the picker
//!
//! 1. takes whole idle cores (every online SMT sibling free), so siblings stay together, group
//!    by group (a group is the cores of one NUMA node sharing one L3 cache): from the group that
//!    holds the rest of the request most tightly, else from the group that holds the most,
//!    lowest core first;
//! 2. then single threads for the remainder: first siblings of cores it already took a thread
//!    of, then threads of cores others already split, then (splitting an idle core only when it
//!    must) in the groups it already uses, fewest free siblings first, lowest CPU first.
//!
//! Given a [`Spare`] (the policy's first try for an exclusive container grant), every CPU taken
//! out of the shared set must leave each pool it belongs to enough shared CPUs for the shared
//! containers placed there; the picker skips CPUs that would not.

use std::collections::BTreeMap;

use crate::{idset::CpuSet, topology::Topology};

use super::pools::Pool;

/// Static per-CPU lookups: the core and the innermost pool of every CPU.
#[derive(Debug, Clone)]
pub struct CpuIndex {
    core_of: Vec<usize>,
    leaf_of: Vec<usize>,
    parent: Vec<Option<usize>>,
}

const NONE: usize = usize::MAX;

impl CpuIndex {
    /// Indexes `topo`'s cores and the pools' CPUs.
    pub fn new(topo: &Topology, pools: &[Pool]) -> Self {
        let len = topo.online.iter().last().map_or(0, |c| c as usize + 1);
        let mut core_of = vec![NONE; len];
        for (i, core) in topo.cores.iter().enumerate() {
            for cpu in core.threads.iter() {
                if let Some(slot) = core_of.get_mut(cpu as usize) {
                    *slot = i;
                }
            }
        }
        // Pools are depth-first, so a descendant overwrites its ancestors.
        let mut leaf_of = vec![NONE; len];
        for pool in pools {
            for cpu in pool.cpus.iter() {
                if let Some(slot) = leaf_of.get_mut(cpu as usize) {
                    *slot = pool.id;
                }
            }
        }
        Self {
            core_of,
            leaf_of,
            parent: pools.iter().map(|p| p.parent).collect(),
        }
    }

    /// The core index of `cpu`.
    pub fn core_of(&self, cpu: u32) -> Option<usize> {
        self.core_of
            .get(cpu as usize)
            .copied()
            .filter(|&c| c != NONE)
    }

    /// The pools holding `cpu`, innermost first.
    pub fn pools_of(&self, cpu: u32) -> impl Iterator<Item = usize> + '_ {
        let leaf = self
            .leaf_of
            .get(cpu as usize)
            .copied()
            .filter(|&p| p != NONE);
        std::iter::successors(leaf, |&p| self.parent.get(p).copied().flatten())
    }
}

/// How many shared CPUs each pool can still give up; `None` for isolated CPUs, which no shared
/// container uses.
#[derive(Debug)]
pub struct Spare<'a> {
    /// Per pool: shared CPUs minus what its shared containers need.
    pub per_pool: &'a mut [i64],
}

impl Spare<'_> {
    /// How many CPUs the pools holding `cpu` can still spare together.
    fn room(&self, index: &CpuIndex, cpu: u32) -> i64 {
        index
            .pools_of(cpu)
            .filter_map(|p| self.per_pool.get(p).copied())
            .min()
            .unwrap_or(0)
    }

    /// Takes `cpus` if every pool they belong to can spare them.
    pub fn take(&mut self, index: &CpuIndex, cpus: &[u32]) -> bool {
        let mut need: Vec<(usize, i64)> = Vec::new();
        for &cpu in cpus {
            for pool in index.pools_of(cpu) {
                match need.iter_mut().find(|(p, _)| *p == pool) {
                    Some((_, n)) => *n += 1,
                    None => need.push((pool, 1)),
                }
            }
        }
        let fits = need
            .iter()
            .all(|&(p, n)| self.per_pool.get(p).is_some_and(|&s| s >= n));
        if fits {
            for (p, n) in need {
                if let Some(s) = self.per_pool.get_mut(p) {
                    *s -= n;
                }
            }
        }
        fits
    }
}

/// A cache group: the cores of one NUMA node sharing one L3 cache.
type Group = (Option<u32>, Option<usize>);

struct Candidate {
    /// The cache group: NUMA node and L3.
    group: Group,
    /// The core's online threads.
    size: usize,
    /// Its threads free in the scope and not yet taken.
    left: Vec<u32>,
    /// Whether this request took a thread of it.
    ours: bool,
    /// Whether the pools cannot spare it whole.
    blocked: bool,
}

/// Picks `n` CPUs from `free`; `None` when they cannot be had. See the module docs.
pub fn pick(
    topo: &Topology,
    index: &CpuIndex,
    free: &CpuSet,
    n: usize,
    mut spare: Option<Spare<'_>>,
) -> Option<CpuSet> {
    if n == 0 {
        return Some(CpuSet::new());
    }
    if free.len() < n {
        return None;
    }
    let mut by_core: BTreeMap<usize, Vec<u32>> = BTreeMap::new();
    for cpu in free.iter() {
        if let Some(core) = index.core_of(cpu) {
            by_core.entry(core).or_default().push(cpu);
        }
    }
    let mut cands: Vec<Candidate> = by_core
        .into_iter()
        .filter_map(|(core, left)| {
            let c = topo.cores.get(core)?;
            Some(Candidate {
                group: (c.numa, c.l3),
                size: c.threads.len(),
                left,
                ours: false,
                blocked: false,
            })
        })
        .collect();
    let take = |spare: &mut Option<Spare<'_>>, cpus: &[u32]| match spare {
        Some(s) => s.take(index, cpus),
        None => true,
    };
    let mut picked = CpuSet::new();
    let mut remaining = n;

    // 1. Whole idle cores, group by group. A group holds what its idle cores hold, capped by
    //    what its pools can spare.
    loop {
        let mut groups: BTreeMap<Group, (usize, u32)> = BTreeMap::new();
        for c in &cands {
            if !c.blocked && !c.ours && c.left.len() == c.size && c.size <= remaining {
                let first = c.left.first().copied().unwrap_or_default();
                let entry = groups.entry(c.group).or_insert((0, first));
                entry.0 += c.size;
            }
        }
        let capacity = |threads: usize, first: u32| match &spare {
            Some(s) => threads.min(usize::try_from(s.room(index, first)).unwrap_or(0)),
            None => threads,
        };
        let sized: Vec<(Group, usize)> = groups
            .into_iter()
            .map(|(g, (threads, first))| (g, capacity(threads, first)))
            .filter(|&(_, cap)| cap > 0)
            .collect();
        let chosen = sized
            .iter()
            .filter(|&&(_, cap)| cap >= remaining)
            .min_by_key(|&&(_, cap)| cap)
            .or_else(|| {
                sized
                    .iter()
                    .max_by_key(|&&(g, cap)| (cap, std::cmp::Reverse(g)))
            })
            .map(|&(g, _)| g);
        let Some(group) = chosen else { break };
        for c in cands.iter_mut().filter(|c| c.group == group) {
            if c.blocked || c.ours || c.left.len() != c.size || c.size > remaining {
                continue;
            }
            if take(&mut spare, &c.left) {
                picked.extend(c.left.drain(..));
                c.ours = true;
                remaining -= c.size;
            } else {
                c.blocked = true;
            }
        }
        // Every usable core of the group is now taken, blocked or too big; the next round
        // looks at the other groups.
        for c in cands.iter_mut().filter(|c| c.group == group && !c.ours) {
            if c.left.len() == c.size {
                c.blocked |= c.size <= remaining;
            }
        }
    }

    // 2. Single threads.
    let mut groups_used: Vec<Group> = cands.iter().filter(|c| c.ours).map(|c| c.group).collect();
    while remaining > 0 {
        let best = cands
            .iter()
            .enumerate()
            .filter(|(_, c)| !c.left.is_empty())
            .flat_map(|(i, c)| {
                let idle = c.left.len() == c.size && !c.ours;
                let far = !groups_used.contains(&c.group);
                c.left
                    .iter()
                    .map(move |&cpu| ((idle, !c.ours, far, c.left.len(), cpu), i, cpu))
            })
            .min_by_key(|(key, _, _)| *key);
        let (_, i, cpu) = best?;
        let c = cands.get_mut(i)?;
        c.left.retain(|&t| t != cpu);
        if take(&mut spare, &[cpu]) {
            picked.insert(cpu);
            c.ours = true;
            groups_used.push(c.group);
            remaining -= 1;
        }
        // A thread the pools cannot spare is dropped from `left` and not retried.
    }
    Some(picked)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::TopologySource;

    fn setup(desc: &str) -> (Topology, CpuIndex, Vec<Pool>) {
        let topo = Topology::load(&TopologySource::Synthetic(desc.into())).unwrap();
        let pools = super::super::pools::build(&topo);
        let index = CpuIndex::new(&topo, &pools);
        (topo, index, pools)
    }

    fn set(s: &str) -> CpuSet {
        s.parse().unwrap()
    }

    #[test]
    fn whole_cores_first_then_siblings_of_split_cores() {
        let (topo, index, _) = setup("pack:1 core:4 pu:2");
        // 0 is taken: core 0 is split, so a single CPU comes from it.
        assert_eq!(pick(&topo, &index, &set("1-7"), 1, None), Some(set("1")));
        // Two CPUs: a whole idle core, not thread 1 plus half of another core.
        assert_eq!(pick(&topo, &index, &set("1-7"), 2, None), Some(set("2-3")));
        // Three: a whole core, then the split core's free thread.
        assert_eq!(pick(&topo, &index, &set("1-7"), 3, None), Some(set("1-3")));
        assert_eq!(pick(&topo, &index, &set("1-7"), 8, None), None);
    }

    #[test]
    fn prefers_an_l3_group_that_holds_the_request() {
        let (topo, index, _) = setup("pack:1 l3:2 core:4 pu:2");
        // Group 0 (0-7) has one idle core left (6-7), group 1 (8-15) four.
        assert_eq!(
            pick(&topo, &index, &set("6-15"), 4, None),
            Some(set("8-11"))
        );
        // Two fit tightly in group 0.
        assert_eq!(pick(&topo, &index, &set("6-15"), 2, None), Some(set("6-7")));
    }

    #[test]
    fn leaves_pools_the_cpus_their_shared_containers_need() {
        let (topo, index, pools) = setup("pack:1 numa:2 core:2 pu:2");
        assert_eq!(pools.len(), 3);
        // root may give up 6 of 8, numa0 only 1 of 4, numa1 all 4.
        let mut spare = vec![6, 1, 4];
        let got = pick(
            &topo,
            &index,
            &set("0-7"),
            5,
            Some(Spare {
                per_pool: &mut spare,
            }),
        );
        assert_eq!(got, Some(set("0,4-7")));
        assert_eq!(spare, [1, 0, 0]);
    }
}
