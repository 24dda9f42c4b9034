//! Planning a container on the unchanged state: classifying it, choosing its pool and CPUs, and
//! planning its memory.
//!
//! Every `plan_*` takes `&self` and returns what to commit, so a refusal changes nothing.

use std::{cmp::Reverse, collections::BTreeMap};

use super::{
    Exclusivity, Grant, Limits, Placed, TopologyAware,
    annotations::{self, Options, describe},
    claims,
    cpus::{self, Spare},
    to_i64,
};
use crate::{
    api::PolicyError,
    idset::{CpuSet, NodeSet},
    inventory::Fallback,
    model::{Container, QosClass},
    topology::MemoryKind,
};

/// What of `c` a placement keeps, for placing it again (an update, a claim that comes or goes)
/// and telling which claims it uses: everything but the environment entries that carry no claim's
/// CPUs and the annotations outside ours. The rest (PATH, service links, the kubelet's
/// annotations) is most of a container's size and never read again; with hundreds of containers
/// it is most of the policy's memory.
fn retained(c: &Container) -> Container {
    let ours = |m: &BTreeMap<String, String>| {
        m.iter()
            .filter(|(k, _)| k.contains(annotations::DOMAIN))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    };
    Container {
        id: c.id.clone(),
        pod: crate::model::Pod {
            uid: c.pod.uid.clone(),
            namespace: c.pod.namespace.clone(),
            name: c.pod.name.clone(),
            qos: c.pod.qos,
            annotations: ours(&c.pod.annotations),
        },
        name: c.name.clone(),
        resources: c.resources,
        annotations: ours(&c.annotations),
        cdi_devices: c.cdi_devices.clone(),
        env: c
            .env
            .iter()
            .filter(|e| {
                [
                    claims::CPUSET_ENV,
                    claims::MEMS_ENV,
                    claims::MEMORY_ENV,
                    claims::HUGEPAGES_ENV,
                ]
                .iter()
                .any(|prefix| e.starts_with(prefix))
            })
            .cloned()
            .collect(),
        cpus: c.cpus.clone(),
        mems: c.mems.clone(),
    }
}

/// What a container asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Class {
    /// Uses claims: their CPUs and nodes; memory pinned only when every result used pins it;
    /// the memory and hugepages they granted, which bound the container's limits.
    Claim {
        cpus: CpuSet,
        mems: NodeSet,
        pin_memory: bool,
        memory: u64,
        hugepages: BTreeMap<u64, u64>,
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
    pub(super) fn classify(&self, c: &Container, opts: &Options) -> Class {
        let used = claims::used_by(c, &self.claims, &self.config.driver);
        if !used.is_empty() {
            let mut cpus = CpuSet::new();
            let mut mems = NodeSet::new();
            let mut pin_memory = true;
            let mut memory = 0u64;
            let mut hugepages: BTreeMap<u64, u64> = BTreeMap::new();
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
                    memory = memory.saturating_add(r.memory);
                    for (size, bytes) in &r.hugepages {
                        let limit = hugepages.entry(*size).or_default();
                        *limit = limit.saturating_add(*bytes);
                    }
                }
            }
            if cpus.is_empty() {
                // It names only memory requests of its claims (individual memory devices): it
                // runs on the CPUs that memory goes with.
                cpus = used
                    .keys()
                    .filter_map(|uid| self.claims.get(uid))
                    .fold(CpuSet::new(), |acc, c| acc.union(&c.cpus()));
            }
            return Class::Claim {
                cpus,
                mems,
                pin_memory,
                memory,
                hugepages,
            };
        }
        if opts.reserved && !self.reserved.is_empty() {
            return Class::Reserved;
        }
        let milli = c.resources.cpu_request_milli;
        // With exclusivity through claims only, a Guaranteed container without a claim shares.
        if self.config.exclusivity != Exclusivity::Claims
            && c.pod.qos == QosClass::Guaranteed
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

    /// Plans a new container's placement. A container the kubelet admitted is never refused
    /// for CPUs or memory (only for a malformed request): see [`TopologyAware::plan_admitted`].
    pub(super) fn plan(&self, c: &Container) -> Result<Placed, PolicyError> {
        let opts = annotations::options(c, &self.config.reserved_namespaces)?;
        let class = self.classify(c, &opts);
        self.plan_admitted(c, &opts, &class, None)
    }

    /// Plans a running container again (its resources changed), preferring, when it stays
    /// shared, the pool whose CPUs it runs on (`c.cpus`): an update does not move it elsewhere.
    pub(super) fn plan_again(&self, c: &Container) -> Result<Placed, PolicyError> {
        let opts = annotations::options(c, &self.config.reserved_namespaces)?;
        let class = self.classify(c, &opts);
        self.plan_admitted(c, &opts, &class, c.cpus.as_ref())
    }

    /// Plans a container as its class asks; when its memory does not fit next to its CPUs,
    /// without pinning its memory (with a warning): the kubelet admitted it against the node's
    /// memory, which per-node accounting cannot refuse after the fact. CPUs never refuse it
    /// (see [`TopologyAware::plan_class`]).
    pub(super) fn plan_admitted(
        &self,
        c: &Container,
        opts: &Options,
        class: &Class,
        running_on: Option<&CpuSet>,
    ) -> Result<Placed, PolicyError> {
        let plan = |opts: &Options| match class {
            Class::Shared { milli } => self.plan_shared(c, opts, *milli, running_on),
            _ => self.plan_class(c, opts, class),
        };
        match plan(opts) {
            Err(PolicyError::DoesNotFit { reason, .. }) if opts.pin_memory => {
                let unpinned = Options {
                    pin_memory: false,
                    ..opts.clone()
                };
                let mut placed = plan(&unpinned)?;
                placed.fallbacks.push(Fallback::MemoryUnpinned);
                placed
                    .warnings
                    .push(format!("{reason}: its memory is not pinned instead"));
                Ok(placed)
            }
            other => other,
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
                memory,
                hugepages,
            } => {
                let opts = Options {
                    pin_memory: opts.pin_memory && *pin_memory,
                    ..opts.clone()
                };
                let grant = Grant::Claim { cpus: cpus.clone() };
                let limits = Limits {
                    // Never above what the kubelet set: a lower limit is the pod's own choice.
                    memory: (*memory > 0).then(|| {
                        c.resources
                            .memory_limit_bytes
                            .map_or(*memory, |l| l.min(*memory))
                    }),
                    hugepages: hugepages.clone(),
                };
                if *memory > 0 {
                    // The claims' grant is its memory: charged once, to the claims.
                    let mems = opts.pin_memory.then(|| mems.clone());
                    let mut placed = self.placed(c, grant, mems, Vec::new());
                    placed.limits = limits;
                    return Ok(placed);
                }
                let (mems, charge) = self.plan_memory(c, &opts, mems, "its claims' nodes")?;
                let mut placed = self.placed(c, grant, mems, charge);
                placed.limits = limits;
                Ok(placed)
            }
            Class::Reserved => {
                let nodes = self.nodes_of(&self.reserved);
                let (mems, charge) = self.plan_memory(c, opts, &nodes, "the reserved cpus")?;
                Ok(self.placed(c, Grant::Reserved, mems, charge))
            }
            Class::Exclusive { n, isolated } => {
                match self.plan_exclusive(c, opts, *n, *isolated)? {
                    Ok(placed) => Ok(placed),
                    Err(reason) => {
                        // Refusing would leave the pod the kubelet admitted failing for good.
                        let milli = c.resources.cpu_request_milli;
                        let mut placed = self.plan_shared(c, opts, milli, None)?;
                        placed.fallbacks.insert(0, Fallback::NotExclusive);
                        placed
                            .warnings
                            .insert(0, format!("{reason}: runs on shared cpus instead"));
                        Ok(placed)
                    }
                }
            }
            Class::Shared { milli } => self.plan_shared(c, opts, *milli, None),
        }
    }

    pub(super) fn placed(
        &self,
        c: &Container,
        grant: Grant,
        mems: Option<NodeSet>,
        charge: Vec<(u32, u64)>,
    ) -> Placed {
        Placed {
            container: retained(c),
            grant,
            mems,
            charge,
            limits: Limits::default(),
            fallbacks: Vec::new(),
            warnings: Vec::new(),
        }
    }

    /// The DRAM nodes local to `cpus`.
    pub(super) fn nodes_of(&self, cpus: &CpuSet) -> NodeSet {
        self.topo
            .numa_nodes
            .iter()
            .filter(|n| n.kind == MemoryKind::Dram && n.cpus.intersects(cpus))
            .map(|n| n.id)
            .collect()
    }

    /// The nodes a container with `kinds` may use next to DRAM nodes `dram`: those of them if
    /// DRAM is allowed, plus the memory-only nodes of allowed kinds attached to them.
    pub(super) fn zone(&self, dram: &NodeSet, kinds: &[MemoryKind]) -> NodeSet {
        let mut zone = if kinds.contains(&MemoryKind::Dram) {
            dram.clone()
        } else {
            NodeSet::new()
        };
        zone.extend(self.attached_to(dram, kinds));
        zone
    }

    /// Memory-only nodes of `kinds` whose closest CPU node is in `dram`.
    pub(super) fn attached_to<'a>(
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
    pub(super) fn plan_memory(
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

    /// Plans exclusive CPUs: out of a pool that can spare them beside what its shared
    /// containers need, else out of any pool that has them (its shared containers move); so
    /// `Ok(Err(reason))` only when fewer than `n` CPUs are free for exclusive grants (the caller
    /// places the container shared instead), `Err` when its memory does not fit.
    pub(super) fn plan_exclusive(
        &self,
        c: &Container,
        opts: &Options,
        n: usize,
        isolated: bool,
    ) -> Result<Result<Placed, String>, PolicyError> {
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
                    return Ok(Ok(self.placed(c, grant, mems, charge)));
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
            let Some(pool) = self.pools.get(id) else {
                continue;
            };
            // Never the CPUs published for claims.
            let free = self.exclusive_free(id);
            let mut left = spare.clone();
            let picked = cpus::pick(
                &self.topo,
                &self.index,
                &free,
                n,
                Some(Spare {
                    per_pool: &mut left,
                }),
            );
            if let Some(cpus) = picked {
                // Memory next to the CPUs granted, which may be fewer nodes than the pool has.
                let nodes = self.nodes_of(&cpus);
                let (mems, charge) = self.plan_memory(c, opts, &nodes, &pool.name)?;
                let grant = Grant::Exclusive { pool: id, cpus };
                return Ok(Ok(self.placed(c, grant, mems, charge)));
            }
        }
        // No pool can spare them beside what its shared containers need. The kubelet admitted
        // a Guaranteed container, and its static CPU manager would grant it CPUs of its own as
        // long as any are free, leaving the shared containers what is left and the reserved
        // CPUs: so, like a claim, the grant takes them anyway, from the tightest pool that has
        // them, then the one left least short; the shared containers move to the nearest
        // enclosing pool with shared CPUs, at worst to the reserved CPUs (the ripple). Otherwise
        // whether it got them would depend on which arrived first.
        let mut squeezing: Vec<(usize, bool, Reverse<i64>, usize)> = self
            .pools
            .iter()
            .filter(|p| self.exclusive_free(p.id).len() >= n)
            .map(|p| {
                (
                    p.cpus.len(),
                    !self.memory_fits(c, opts, &p.nodes),
                    Reverse(spare.get(p.id).copied().unwrap_or(0)),
                    p.id,
                )
            })
            .collect();
        squeezing.sort_unstable();
        for (_, _, _, id) in squeezing {
            let Some(pool) = self.pools.get(id) else {
                continue;
            };
            let free = self.exclusive_free(id);
            if let Some(cpus) = cpus::pick(&self.topo, &self.index, &free, n, None) {
                let nodes = self.nodes_of(&cpus);
                let (mems, charge) = self.plan_memory(c, opts, &nodes, &pool.name)?;
                let grant = Grant::Exclusive { pool: id, cpus };
                return Ok(Ok(self.placed(c, grant, mems, charge)));
            }
        }
        let mut not = vec!["reserved"];
        if !self.isolated.is_empty() {
            not.push("kernel-isolated");
        }
        if !self.claimable.is_empty() {
            not.push("set aside for claims");
        }
        let reason = format!(
            "needs {n} exclusive cpus; only {} cpus are neither {} nor held exclusively",
            self.exclusive_free(0).len(),
            not.join(", ")
        );
        Ok(Err(reason))
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
    ///
    /// It never refuses for CPUs: when no pool has room for the request, the container goes to
    /// the pool with the most room (overcommitting it); when no CPU is shared anywhere, to the
    /// root pool, whose containers then run on the reserved CPUs until CPUs are shared again
    /// (see [`TopologyAware::runs_on`]'s field docs). Both with a warning.
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
        let sharing = || {
            self.pools
                .iter()
                .filter(|p| self.shared.get(p.id).is_some_and(|s| !s.is_empty()))
                .map(|p| (p, self.shared_room(p.id)))
        };
        let best = sharing()
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
        let mut warning = None;
        let pool = match best {
            Some((pool, _)) => pool,
            None => match sharing().min_by_key(|&(p, room)| {
                (
                    !self.memory_fits(c, opts, &p.nodes),
                    Reverse(overlap(p.id)),
                    Reverse(room),
                    p.id,
                )
            }) {
                Some((pool, room)) => {
                    if milli > 0 {
                        warning = Some(format!(
                            "needs {milli}m of shared cpu and no pool has that much left: placed in {pool}, which has {room}m left, overcommitting its shared cpus"
                        ));
                    }
                    pool
                }
                None => {
                    let Some(root) = self.pools.first() else {
                        return Err(PolicyError::DoesNotFit {
                            subject: subject(c),
                            reason: "the machine has no cpu pool".into(),
                        });
                    };
                    warning = Some(format!(
                        "no cpu is shared anywhere (claims and exclusive grants hold them all): runs on the reserved cpus {} until some are shared again",
                        self.last_resort()
                    ));
                    root
                }
            },
        };
        let (mems, charge) = self.plan_memory(c, opts, &pool.nodes, &pool.name)?;
        let mut placed = self.placed(
            c,
            Grant::Shared {
                pool: pool.id,
                milli,
            },
            mems,
            charge,
        );
        placed.warnings.extend(warning);
        Ok(placed)
    }
}
