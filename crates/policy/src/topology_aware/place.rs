//! Planning on the unchanged state: classifying a container, choosing its pool and CPUs,
//! planning its memory, planning a claim, and rebuilding everything on sync.
//!
//! Every `plan_*` takes `&self` and returns what to commit, so a refusal changes nothing.

use std::{cmp::Reverse, collections::BTreeMap};

use super::{
    Grant, Placed, TopologyAware, Updates,
    annotations::{self, Options, describe},
    claim_config,
    claims::{self, ClaimRecord, ResultRecord},
    cpus::{self, Spare},
    to_i64,
};
use crate::{
    api::PolicyError,
    idset::{CpuSet, NodeSet},
    model::{Claim, Container, ContainerUpdate, QosClass},
    topology::MemoryKind,
};

/// What a container asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Class {
    /// Uses claims: their CPUs and nodes; memory pinned only when every result used pins it.
    Claim {
        cpus: CpuSet,
        mems: NodeSet,
        pin_memory: bool,
    },
    Reserved,
    Exclusive {
        n: usize,
        isolated: bool,
    },
    Shared {
        milli: u64,
    },
}

/// The memory nodes to pin (none when unpinned) and the bytes charged per node.
type PlannedMemory = (Option<NodeSet>, Vec<(u32, u64)>);

fn subject(c: &Container) -> String {
    format!("container {}", describe(c))
}

impl TopologyAware {
    fn classify(&self, c: &Container, opts: &Options) -> Class {
        let used = claims::used_by(c, &self.claims, &self.config.driver);
        if !used.is_empty() {
            let mut cpus = CpuSet::new();
            let mut mems = NodeSet::new();
            let mut pin_memory = true;
            for (uid, indexes) in &used {
                let Some(claim) = self.claims.get(uid) else {
                    continue;
                };
                for r in indexes.iter().filter_map(|&i| claim.results.get(i)) {
                    cpus = cpus.union(&r.cpus);
                    mems = mems.union(&r.mems);
                    // A result that leaves memory to the runtime cannot have its container
                    // held to the nodes of the others.
                    pin_memory &= r.memory_pinning;
                }
            }
            return Class::Claim {
                cpus,
                mems,
                pin_memory,
            };
        }
        if opts.reserved && !self.reserved.is_empty() {
            return Class::Reserved;
        }
        let milli = c.resources.cpu_request_milli;
        if c.pod.qos == QosClass::Guaranteed
            && milli >= 1000
            && milli.is_multiple_of(1000)
            && !opts.prefer_shared
        {
            let n = usize::try_from(milli / 1000).unwrap_or(usize::MAX);
            return Class::Exclusive {
                n,
                isolated: opts.prefer_isolated,
            };
        }
        Class::Shared { milli }
    }

    /// Plans a new container's placement.
    pub(super) fn plan(&self, c: &Container) -> Result<Placed, PolicyError> {
        let opts = annotations::options(c, &self.config.reserved_namespaces)?;
        let class = self.classify(c, &opts);
        self.plan_class(c, &opts, &class)
    }

    /// Plans a running container again (its resources changed), preferring, when it stays
    /// shared, the pool whose CPUs it runs on (`c.cpus`): an update does not move it elsewhere.
    pub(super) fn plan_again(&self, c: &Container) -> Result<Placed, PolicyError> {
        let opts = annotations::options(c, &self.config.reserved_namespaces)?;
        let class = self.classify(c, &opts);
        match class {
            Class::Shared { milli } => self.plan_shared(c, &opts, milli, c.cpus.as_ref()),
            _ => self.plan_class(c, &opts, &class),
        }
    }

    fn plan_class(
        &self,
        c: &Container,
        opts: &Options,
        class: &Class,
    ) -> Result<Placed, PolicyError> {
        match class {
            Class::Claim {
                cpus,
                mems,
                pin_memory,
            } => {
                let opts = Options {
                    pin_memory: opts.pin_memory && *pin_memory,
                    ..opts.clone()
                };
                let (mems, charge) = self.plan_memory(c, &opts, mems, "its claims' nodes")?;
                Ok(self.placed(c, Grant::Claim { cpus: cpus.clone() }, mems, charge))
            }
            Class::Reserved => {
                let nodes = self.nodes_of(&self.reserved);
                let (mems, charge) = self.plan_memory(c, opts, &nodes, "the reserved cpus")?;
                Ok(self.placed(c, Grant::Reserved, mems, charge))
            }
            Class::Exclusive { n, isolated } => self.plan_exclusive(c, opts, *n, *isolated),
            Class::Shared { milli } => self.plan_shared(c, opts, *milli, None),
        }
    }

    fn placed(
        &self,
        c: &Container,
        grant: Grant,
        mems: Option<NodeSet>,
        charge: Vec<(u32, u64)>,
    ) -> Placed {
        Placed {
            container: c.clone(),
            grant,
            mems,
            charge,
        }
    }

    /// The DRAM nodes local to `cpus`.
    fn nodes_of(&self, cpus: &CpuSet) -> NodeSet {
        self.topo
            .numa_nodes
            .iter()
            .filter(|n| n.kind == MemoryKind::Dram && n.cpus.intersects(cpus))
            .map(|n| n.id)
            .collect()
    }

    /// The nodes a container with `kinds` may use next to DRAM nodes `dram`: those of them if
    /// DRAM is allowed, plus the memory-only nodes of allowed kinds attached to them.
    fn zone(&self, dram: &NodeSet, kinds: &[MemoryKind]) -> NodeSet {
        let mut zone = if kinds.contains(&MemoryKind::Dram) {
            dram.clone()
        } else {
            NodeSet::new()
        };
        zone.extend(self.attached_to(dram, kinds));
        zone
    }

    /// Memory-only nodes of `kinds` whose closest CPU node is in `dram`.
    fn attached_to<'a>(
        &'a self,
        dram: &'a NodeSet,
        kinds: &'a [MemoryKind],
    ) -> impl Iterator<Item = u32> + 'a {
        self.attached
            .iter()
            .filter(move |(_, kind, closest)| kinds.contains(kind) && dram.contains(*closest))
            .map(|(node, _, _)| *node)
    }

    /// Plans pinning and charging the container's memory near DRAM nodes `dram`.
    fn plan_memory(
        &self,
        c: &Container,
        opts: &Options,
        dram: &NodeSet,
        place: &str,
    ) -> Result<PlannedMemory, PolicyError> {
        if !opts.pin_memory {
            return Ok((None, Vec::new()));
        }
        let base = self.zone(dram, &opts.memory_kinds);
        let request = c.resources.memory_request_bytes;
        self.ledger
            .plan(&self.topo, dram, &base, &opts.memory_kinds, request)
            .map(|charge| (Some(charge.mems), charge.parts))
            .map_err(|reason| PolicyError::DoesNotFit {
                subject: subject(c),
                reason: format!("{reason} (cpus on {place})"),
            })
    }

    fn memory_fits(&self, c: &Container, opts: &Options, dram: &NodeSet) -> bool {
        let request = c.resources.memory_request_bytes;
        if !opts.pin_memory || request == 0 {
            return true;
        }
        // Called for every candidate pool: sums without building the zone.
        let mut free: u64 = self
            .attached_to(dram, &opts.memory_kinds)
            .map(|n| self.ledger.free(n))
            .sum();
        if opts.memory_kinds.contains(&MemoryKind::Dram) {
            free += dram.iter().map(|n| self.ledger.free(n)).sum::<u64>();
        }
        free >= request
    }

    fn plan_exclusive(
        &self,
        c: &Container,
        opts: &Options,
        n: usize,
        isolated: bool,
    ) -> Result<Placed, PolicyError> {
        if isolated {
            let free = self.isolated.difference(&self.isolated_taken);
            let mut order: Vec<&super::Pool> = self.pools.iter().collect();
            order.sort_by_key(|p| (p.cpus.len(), p.id));
            for pool in order {
                let scope = pool.cpus.intersection(&free);
                if let Some(cpus) = cpus::pick(&self.topo, &self.index, &scope, n, None) {
                    let nodes = self.nodes_of(&cpus);
                    let (mems, charge) = self.plan_memory(c, opts, &nodes, &pool.name)?;
                    let grant = Grant::Isolated {
                        pool: pool.id,
                        cpus,
                    };
                    return Ok(self.placed(c, grant, mems, charge));
                }
            }
            // Not enough isolated CPUs anywhere: ordinary exclusive CPUs.
        }
        let spare = self.spare();
        let ceiling = |p: usize| {
            self.ancestors(p)
                .filter_map(|a| spare.get(a).copied())
                .min()
                .unwrap_or(0)
        };
        let mut candidates: Vec<(usize, bool, i64, usize)> = self
            .pools
            .iter()
            .filter(|p| ceiling(p.id) >= to_i64(n))
            .map(|p| {
                let fits = self.memory_fits(c, opts, &p.nodes);
                (
                    p.cpus.len(),
                    !fits,
                    spare.get(p.id).copied().unwrap_or(0),
                    p.id,
                )
            })
            .collect();
        candidates.sort_unstable();
        for (_, _, _, id) in candidates {
            let (Some(pool), Some(free)) = (self.pools.get(id), self.shared.get(id)) else {
                continue;
            };
            let mut left = spare.clone();
            let picked = cpus::pick(
                &self.topo,
                &self.index,
                free,
                n,
                Some(Spare {
                    per_pool: &mut left,
                }),
            );
            if let Some(cpus) = picked {
                // Memory next to the CPUs granted, which may be fewer nodes than the pool has.
                let nodes = self.nodes_of(&cpus);
                let (mems, charge) = self.plan_memory(c, opts, &nodes, &pool.name)?;
                return Ok(self.placed(c, Grant::Exclusive { pool: id, cpus }, mems, charge));
            }
        }
        let best = self
            .pools
            .iter()
            .map(|p| (ceiling(p.id), Reverse(p.id)))
            .max()
            .and_then(|(most, Reverse(id))| Some((most, self.pools.get(id)?)));
        let reason = match best {
            Some((most, pool)) => format!(
                "needs {n} exclusive cpus; at most {} can be cut out of one pool ({pool}: {} shared, {} needed by its shared containers)",
                most.max(0),
                self.shared.get(pool.id).map_or(0, CpuSet::len),
                self.need(pool.id)
            ),
            None => format!("needs {n} exclusive cpus; no pool has any"),
        };
        Err(PolicyError::DoesNotFit {
            subject: subject(c),
            reason,
        })
    }

    /// Milli-CPUs of shared capacity left in `pool`, capped by every ancestor.
    fn shared_room(&self, pool: usize) -> i64 {
        self.ancestors(pool)
            .map(|a| {
                let cpus = self.shared.get(a).map_or(0, CpuSet::len);
                let used = self.load.get(a).map_or(0, |l| l.milli);
                to_i64(cpus).saturating_mul(1000) - i64::try_from(used).unwrap_or(i64::MAX)
            })
            .min()
            .unwrap_or(0)
    }

    /// Picks the pool for a shared container. `running_on` is the cpuset a running container
    /// has now (on sync): among pools that fit, the one whose shared CPUs cover most of it wins,
    /// so that restarting the agent does not move running containers between NUMA nodes.
    fn plan_shared(
        &self,
        c: &Container,
        opts: &Options,
        milli: u64,
        running_on: Option<&CpuSet>,
    ) -> Result<Placed, PolicyError> {
        let want = i64::try_from(milli).unwrap_or(i64::MAX);
        let limit = c.resources.cpu_limit_milli;
        let overlap = |pool: usize| {
            running_on.map_or(0, |cur| {
                self.shared
                    .get(pool)
                    .map_or(0, |s| s.intersection(cur).len())
            })
        };
        let best = self
            .pools
            .iter()
            .filter(|p| self.shared.get(p.id).is_some_and(|s| !s.is_empty()))
            .map(|p| (p, self.shared_room(p.id)))
            .filter(|&(_, room)| room >= want)
            .min_by_key(|&(p, room)| {
                let cpus = self.shared.get(p.id).map_or(0, CpuSet::len);
                let limit_room = limit.is_none_or(|l| {
                    to_i64(cpus).saturating_mul(1000) >= i64::try_from(l).unwrap_or(i64::MAX)
                });
                (
                    !self.memory_fits(c, opts, &p.nodes),
                    !limit_room,
                    Reverse(overlap(p.id)),
                    Reverse(p.depth),
                    self.load.get(p.id).map_or(0, |l| l.count),
                    Reverse(room),
                    p.id,
                )
            });
        let Some((pool, _)) = best else {
            let most = self
                .pools
                .iter()
                .map(|p| (self.shared_room(p.id), Reverse(p.id)))
                .max();
            let reason = match most
                .and_then(|(room, Reverse(id))| Some((room, self.pools.get(id)?)))
            {
                Some((room, pool)) if room > 0 => format!(
                    "needs {milli}m of shared cpu; the most any pool has left is {room}m in {pool}"
                ),
                _ => format!("needs {milli}m of shared cpu; no shared cpu is left"),
            };
            return Err(PolicyError::DoesNotFit {
                subject: subject(c),
                reason,
            });
        };
        let (mems, charge) = self.plan_memory(c, opts, &pool.nodes, &pool.name)?;
        Ok(self.placed(
            c,
            Grant::Shared {
                pool: pool.id,
                milli,
            },
            mems,
            charge,
        ))
    }

    /// Plans a new claim's CPUs, result by result, on the unchanged state, as its
    /// configuration asks.
    pub(super) fn plan_claim(&self, claim: &Claim) -> Result<ClaimRecord, PolicyError> {
        let subject = format!("claim {}/{} ({})", claim.namespace, claim.name, claim.uid);
        let settings = claim_config::settings(claim)?;
        let mut spare = self.spare();
        let mut tentative = CpuSet::new();
        let mut results = Vec::with_capacity(claim.results.len());
        for ((i, r), s) in claim.results.iter().enumerate().zip(settings) {
            let node = claims::device_node(&r.device).filter(|n| self.claimable.contains_key(n));
            let (Some(node), Some(claimable)) = (node, node.and_then(|n| self.claimable.get(&n)))
            else {
                return Err(PolicyError::Invalid {
                    subject,
                    reason: format!(
                        "result {i} (request {}): device {:?} is not one this policy publishes",
                        r.request, r.device
                    ),
                });
            };
            let n = claims::cpus_asked(r);
            if n == 0 {
                return Err(PolicyError::Invalid {
                    subject,
                    reason: format!("result {i} (request {}): consumes no cpu", r.request),
                });
            }
            let n = usize::try_from(n).unwrap_or(usize::MAX);
            let mut free = claimable.difference(&self.taken).difference(&tentative);
            if s.full_cores {
                free = self.whole_cores(&free);
            }
            let picked = cpus::pick(
                &self.topo,
                &self.index,
                &free,
                n,
                Some(Spare {
                    per_pool: &mut spare,
                }),
            )
            .filter(|cpus| !s.full_cores || self.whole_cores(cpus) == *cpus);
            let Some(cpus) = picked else {
                let name = claims::device_name(node);
                let need: usize = self
                    .pools
                    .iter()
                    .filter(|p| p.name == name)
                    .map(|p| self.need(p.id))
                    .sum();
                let (what, free_what) = if s.full_cores {
                    ("in whole cores (fullCores) ", "cpus in free whole cores")
                } else {
                    ("", "claimable cpus are free")
                };
                return Err(PolicyError::DoesNotFit {
                    subject,
                    reason: format!(
                        "result {i} (request {}) needs {n} cpus {what}on {name}: {} of its {} {free_what}, its shared containers need {need}",
                        r.request,
                        free.len(),
                        claimable.len()
                    ),
                });
            };
            tentative = tentative.union(&cpus);
            let mut record = ResultRecord::new(&r.request, node, cpus);
            record.memory_pinning = s.memory_pinning;
            results.push(record);
        }
        Ok(ClaimRecord {
            uid: claim.uid.clone(),
            namespace: claim.namespace.clone(),
            name: claim.name.clone(),
            reserved_for: claim.reserved_for.clone(),
            results,
        })
    }

    /// The CPUs of `cpus` whose core is in it whole (every online thread of the core; a core's
    /// threads are its online ones).
    fn whole_cores(&self, cpus: &CpuSet) -> CpuSet {
        self.topo
            .cores
            .iter()
            .map(|core| &core.threads)
            .filter(|threads| !threads.is_empty() && cpus.is_superset(threads))
            .fold(CpuSet::new(), |acc, threads| acc.union(threads))
    }

    /// Keeps a running exclusive container on the CPUs it has, when they are still free.
    fn plan_keep(&self, c: &Container, opts: &Options, n: usize, isolated: bool) -> Option<Placed> {
        let cpus = c.cpus.as_ref().filter(|s| s.len() == n)?;
        let pool = self
            .pools
            .iter()
            .filter(|p| p.cpus.is_superset(cpus))
            .min_by_key(|p| (p.cpus.len(), p.id))?;
        let grant = if isolated
            && self
                .isolated
                .difference(&self.isolated_taken)
                .is_superset(cpus)
        {
            Grant::Isolated {
                pool: pool.id,
                cpus: cpus.clone(),
            }
        } else {
            let free = self.shared.first()?;
            if !free.is_superset(cpus) {
                return None;
            }
            let mut spare = self.spare();
            let list: Vec<u32> = cpus.iter().collect();
            if !(Spare {
                per_pool: &mut spare,
            })
            .take(&self.index, &list)
            {
                return None;
            }
            Grant::Exclusive {
                pool: pool.id,
                cpus: cpus.clone(),
            }
        };
        let nodes = self.nodes_of(cpus);
        let (mems, charge) = self.plan_memory(c, opts, &nodes, &pool.name).ok()?;
        Some(self.placed(c, grant, mems, charge))
    }

    /// Places a running container no matter what: as planned, else without memory pinning,
    /// else on shared CPUs, else anywhere shared or reserved.
    fn place_running(
        &mut self,
        c: &Container,
        opts: &Options,
        class: &Class,
        updates: &mut Updates,
    ) {
        let unpinned = Options {
            pin_memory: false,
            ..opts.clone()
        };
        let shared = Class::Shared {
            milli: c.resources.cpu_request_milli,
        };
        let where_it_runs = match class {
            Class::Shared { milli } => self.plan_shared(c, opts, *milli, c.cpus.as_ref()).ok(),
            _ => None,
        };
        let placed = where_it_runs
            .map(Ok)
            .unwrap_or_else(|| self.plan_class(c, opts, class))
            .or_else(|_| self.plan_class(c, &unpinned, class))
            .or_else(|_| self.plan_class(c, &unpinned, &shared))
            .ok()
            .or_else(|| {
                let grant = if self.shared.first().is_some_and(|s| !s.is_empty()) {
                    Grant::Shared {
                        pool: 0,
                        milli: c.resources.cpu_request_milli,
                    }
                } else if !self.reserved.is_empty() {
                    Grant::Reserved
                } else {
                    return None;
                };
                Some(self.placed(c, grant, None, Vec::new()))
            });
        if let Some(placed) = placed {
            self.commit(&c.id, placed, updates);
        }
    }

    /// Rebuilds every container placement, keeping the claims; returns updates for containers
    /// whose cpuset or memory nodes differ from what the runtime reported.
    pub(super) fn sync_containers(&mut self, containers: &[Container]) -> Vec<ContainerUpdate> {
        self.containers.clear();
        for l in &mut self.load {
            *l = super::PoolLoad::default();
        }
        self.ledger = super::memory::Ledger::new(&self.topo);
        self.taken = self
            .claims
            .values()
            .fold(CpuSet::new(), |acc, c| acc.union(&c.cpus()));
        self.isolated_taken = CpuSet::new();
        self.refresh_all_shared();

        let by_id: BTreeMap<&str, &Container> =
            containers.iter().map(|c| (c.id.as_str(), c)).collect();
        let planned: Vec<(&Container, Options, Class)> = by_id
            .values()
            .map(|&c| {
                let opts = annotations::options(c, &self.config.reserved_namespaces)
                    .unwrap_or_else(|_| annotations::defaults(c, &self.config.reserved_namespaces));
                let class = self.classify(c, &opts);
                (c, opts, class)
            })
            .collect();
        let mut scratch = Updates::new();

        // Claims and reserved CPUs compete with nobody.
        for (c, opts, class) in &planned {
            if matches!(class, Class::Claim { .. } | Class::Reserved) {
                self.place_running(c, opts, class, &mut scratch);
            }
        }

        // Exclusive grants, leaving the shared containers to come room at the root.
        let (shared_milli, shared_count) = planned
            .iter()
            .filter_map(|(_, _, class)| match class {
                Class::Shared { milli } => Some(*milli),
                _ => None,
            })
            .fold((0u64, 0usize), |(m, n), milli| (m + milli, n + 1));
        if let Some(root) = self.load.first_mut() {
            root.milli += shared_milli;
            root.count += shared_count;
        }
        let mut exclusive: Vec<(&Container, &Options, &Class, usize)> = planned
            .iter()
            .filter_map(|(c, o, class)| match class {
                Class::Exclusive { n, .. } => Some((*c, o, class, *n)),
                _ => None,
            })
            .collect();
        let mut rest = Vec::new();
        for &(c, opts, class, n) in &exclusive {
            let Class::Exclusive { isolated, .. } = class else {
                continue;
            };
            match self.plan_keep(c, opts, n, *isolated) {
                Some(placed) => self.commit(&c.id, placed, &mut scratch),
                None => rest.push((c, opts, class, n)),
            }
        }
        exclusive = rest;
        exclusive.sort_by(|a, b| b.3.cmp(&a.3).then_with(|| a.0.id.cmp(&b.0.id)));
        for (c, opts, class, _) in exclusive {
            self.place_running(c, opts, class, &mut scratch);
        }
        if let Some(root) = self.load.first_mut() {
            root.milli = root.milli.saturating_sub(shared_milli);
            root.count = root.count.saturating_sub(shared_count);
        }

        for (c, opts, class) in &planned {
            if matches!(class, Class::Shared { .. }) {
                self.place_running(c, opts, class, &mut scratch);
            }
        }

        by_id
            .values()
            .filter_map(|c| {
                let want = self.update_of(&c.id)?;
                let cpus_differ = c.cpus != want.cpus;
                let mems_differ = want.mems.is_some() && c.mems != want.mems;
                (cpus_differ || mems_differ).then_some(want)
            })
            .collect()
    }
}
