//! Planning on the unchanged state: classifying a container, choosing its pool and CPUs,
//! planning its memory, planning a claim, and rebuilding everything on sync.
//!
//! Every `plan_*` takes `&self` and returns what to commit, so a refusal changes nothing.

use std::{cmp::Reverse, collections::BTreeMap};

use super::{
    Exclusivity, Grant, Limits, Placed, TopologyAware, Updates,
    annotations::{self, Options, describe},
    claim_config,
    claims::{self, HeldClaim, ResultRecord},
    cpus::{self, Spare},
    devices::{self, CPU_CAPACITY, Share},
    memory, to_i64,
};
use crate::{
    api::PolicyError,
    idset::{CpuSet, NodeSet},
    inventory::Fallback,
    model::{Claim, Container, ContainerUpdate, QosClass},
    topology::{MemoryKind, page_size_name},
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
enum Class {
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

/// What a claim's result gets of its node's memory account.
#[derive(Debug, Clone, Default)]
struct MemoryGrant {
    /// The node charged; `None` when nothing is granted.
    node: Option<u32>,
    /// Bytes of memory.
    memory: u64,
    /// Bytes of hugepages by page size.
    hugepages: BTreeMap<u64, u64>,
}

/// Bytes as a Kubernetes quantity, in the largest binary unit that is exact (`16Gi`, `3Mi`).
fn bytes_text(bytes: u64) -> String {
    if bytes == 0 {
        "0".into()
    } else {
        page_size_name(bytes)
    }
}

/// What a result holds of memory and hugepages, in words (`16Gi of memory and 256Mi of
/// hugepages2Mi`; `no memory` when nothing).
fn held_text(r: &ResultRecord) -> String {
    let mut parts = Vec::new();
    if r.memory > 0 {
        parts.push(format!("{} of memory", bytes_text(r.memory)));
    }
    for (&size, &bytes) in &r.hugepages {
        parts.push(format!(
            "{} of {}",
            bytes_text(bytes),
            memory::hugepage_capacity(size)
        ));
    }
    if parts.is_empty() {
        "no memory".into()
    } else {
        parts.join(" and ")
    }
}

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
    fn plan_admitted(
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

    fn placed(
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

    /// Plans exclusive CPUs: out of a pool that can spare them beside what its shared
    /// containers need, else out of any pool that has them (its shared containers move); so
    /// `Ok(Err(reason))` only when fewer than `n` CPUs are free for exclusive grants (the caller
    /// places the container shared instead), `Err` when its memory does not fit.
    fn plan_exclusive(
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

    /// Plans a new claim's CPUs, result by result, on the unchanged state, as its
    /// configuration asks; and what to warn about.
    ///
    /// Each result gets what the scheduler accounted on its device (see [`super::devices`]): a
    /// grouped device's consumed CPUs (picked whole cores first, and only whole cores on a
    /// whole-core device), a grouped device whole when the result consumed nothing (the API
    /// server dropped consumable capacity and the scheduler handed it out alone), an individual
    /// device's CPUs. It never waits for shared containers: they move to what stays shared. A
    /// result that cannot be had means the allocation disagrees with what this node published
    /// (another claim holds the CPUs), which the scheduler does not do from current slices.
    pub(super) fn plan_claim(
        &self,
        claim: &Claim,
    ) -> Result<(HeldClaim, Vec<String>), PolicyError> {
        let subject = format!("claim {}/{} ({})", claim.namespace, claim.name, claim.uid);
        let settings = claim_config::settings(claim)?;
        let mut tentative = CpuSet::new();
        // Memory this claim's earlier results take, by node: (bytes, hugepage bytes by size).
        let mut held: BTreeMap<u32, (u64, BTreeMap<u64, u64>)> = BTreeMap::new();
        let mut results = Vec::with_capacity(claim.results.len());
        for ((i, r), s) in claim.results.iter().enumerate().zip(&settings) {
            let at = format!("result {i} (request {})", r.request);
            let Some(device) = self.table.get(&r.device) else {
                let why = if self.config.exclusivity == Exclusivity::Pods {
                    "this node publishes no devices (cpu-exclusivity: pods)".to_owned()
                } else {
                    "it is not one this node publishes".to_owned()
                };
                return Err(PolicyError::Invalid {
                    subject,
                    reason: format!("{at}: device {:?}: {why}", r.device),
                });
            };
            if device.is_memory() {
                // Memory without CPUs: what it consumed of its node's account, or, handed out
                // whole (the API server dropped consumable capacity), all of it.
                let whole = r.consumed_capacity.is_empty();
                let grant = self.plan_claim_memory(&subject, &at, r, device, whole, &held)?;
                if let Some(node) = grant.node {
                    let entry = held.entry(node).or_default();
                    entry.0 += grant.memory;
                    for (size, bytes) in &grant.hugepages {
                        *entry.1.entry(*size).or_default() += bytes;
                    }
                }
                results.push(ResultRecord {
                    request: r.request.clone(),
                    device: r.device.clone(),
                    mems: device.memory_node.into_iter().collect(),
                    cpus: CpuSet::new(),
                    memory_pinning: s.memory_pinning,
                    memory_node: grant.node,
                    memory: grant.memory,
                    hugepages: grant.hugepages,
                });
                continue;
            }
            let free = device.cpus.difference(&self.taken).difference(&tentative);
            let consumed = match device.share {
                Share::Whole => None,
                Share::Consumable { .. } => r.consumed_capacity.get(CPU_CAPACITY),
            };
            let cpus = match consumed {
                None => {
                    if free != device.cpus {
                        let why = match device.share {
                            Share::Whole => "it is allocated to one claim at a time".to_owned(),
                            Share::Consumable { .. } => "the result consumed no capacity, so the scheduler handed the device out whole (DRAConsumableCapacity is off: device-mode individual fits this cluster)".to_owned(),
                        };
                        return Err(PolicyError::DoesNotFit {
                            subject,
                            reason: format!(
                                "{at} on device {}: {why}, but cpus {} of it are held by {}",
                                r.device,
                                device.cpus.difference(&free),
                                self.holders(&device.cpus.difference(&free), &tentative)
                            ),
                        });
                    }
                    device.cpus.clone()
                }
                Some(q) => {
                    let n = usize::try_from(q.units_ceil()).unwrap_or(usize::MAX);
                    if n == 0 {
                        return Err(PolicyError::Invalid {
                            subject,
                            reason: format!("{at}: consumes no cpu"),
                        });
                    }
                    let whole = (device.whole_cores || s.full_cores)
                        .then(|| self.pick_whole_cores(&free, n))
                        .flatten();
                    let picked =
                        whole.or_else(|| cpus::pick(&self.topo, &self.index, &free, n, None));
                    let Some(cpus) = picked else {
                        return Err(PolicyError::DoesNotFit {
                            subject,
                            reason: format!(
                                "{at} consumed {n} cpus of device {}, but only {} of its {} are free ({} held by {})",
                                r.device,
                                free.len(),
                                device.cpus.len(),
                                device.cpus.difference(&free),
                                self.holders(&device.cpus.difference(&free), &tentative)
                            ),
                        });
                    };
                    cpus
                }
            };
            tentative = tentative.union(&cpus);
            let whole = consumed.is_none();
            let grant = self.plan_claim_memory(&subject, &at, r, device, whole, &held)?;
            if let Some(node) = grant.node {
                let entry = held.entry(node).or_default();
                entry.0 += grant.memory;
                for (size, bytes) in &grant.hugepages {
                    *entry.1.entry(*size).or_default() += bytes;
                }
            }
            results.push(ResultRecord {
                request: r.request.clone(),
                device: r.device.clone(),
                mems: self.nodes_of(&cpus),
                cpus,
                memory_pinning: s.memory_pinning,
                memory_node: grant.node,
                memory: grant.memory,
                hugepages: grant.hugepages,
            });
        }
        let mut warnings = self.tie_memory_devices(&subject, &mut results)?;
        self.widen_to_memory_kinds(&subject, &mut results, &settings)?;
        // fullCores: whole cores per request (an individual request's CPUs are whole cores
        // together, not one by one).
        let mut asked: BTreeMap<&str, CpuSet> = BTreeMap::new();
        for (r, s) in results.iter().zip(&settings) {
            if s.full_cores {
                let entry = asked.entry(r.request.as_str()).or_default();
                *entry = entry.union(&r.cpus);
            }
        }
        for (request, cpus) in asked {
            let split = cpus.difference(&devices::whole_cores(&self.topo, &cpus));
            if !split.is_empty() {
                warnings.push(format!(
                    "{subject}: request {request} asks for whole cores (fullCores), but got cpus {cpus}, which share cores through {split}: its devices hand out single cpus (claim-granularity: cpu), so it gets what the scheduler allocated; select devices with wholeCores in its DeviceClass to get whole cores"
                ));
            }
        }
        Ok((
            HeldClaim {
                uid: claim.uid.clone(),
                namespace: claim.namespace.clone(),
                name: claim.name.clone(),
                reserved_for: claim.reserved_for.clone(),
                results,
                adopted: false,
            },
            warnings,
        ))
    }

    /// Ties a claim's memory devices (individual model) to its CPUs: its results' memory nodes
    /// become the nodes of its memory devices, where its memory is charged, so a container using
    /// it allocates from the memory it was granted. A memory device result without any CPU
    /// result is refused (a container using it would have no CPUs of the claim to run on);
    /// memory on another node than the claim's CPUs (a claim without the `matchAttribute`
    /// constraint on `resource.kubernetes.io/numaNode`) is granted as allocated, since the
    /// scheduler placed the pod for it, with a warning. Errors and warnings name the request
    /// and the amount.
    fn tie_memory_devices(
        &self,
        subject: &str,
        results: &mut [ResultRecord],
    ) -> Result<Vec<String>, PolicyError> {
        let memory_nodes = results
            .iter()
            .filter(|r| r.cpus.is_empty())
            .fold(NodeSet::new(), |acc, r| acc.union(&r.mems));
        if memory_nodes.is_empty() {
            return Ok(Vec::new());
        }
        let cpus = results
            .iter()
            .fold(CpuSet::new(), |acc, r| acc.union(&r.cpus));
        let cpu_nodes = self.nodes_of(&cpus);
        let tie = format!(
            "tie its requests with constraints: [{{matchAttribute: {}}}]",
            devices::NUMA_NODE_ATTRIBUTE
        );
        let mut warnings = Vec::new();
        for (i, r) in results
            .iter()
            .enumerate()
            .filter(|(_, r)| r.cpus.is_empty())
        {
            let at = format!(
                "result {i} (request {}) is {} of NUMA node {} (device {})",
                r.request,
                held_text(r),
                r.mems,
                r.device
            );
            if cpus.is_empty() {
                return Err(PolicyError::Invalid {
                    subject: subject.to_owned(),
                    reason: format!(
                        "{at}, but the claim has no cpus to go with it: ask for cpu devices in the same claim and {tie}"
                    ),
                });
            }
            if r.memory_pinning && cpu_nodes != r.mems {
                warnings.push(format!(
                    "{subject}: {at}, but its cpus {cpus} are on NUMA node {cpu_nodes}: containers using it get memory node {} as allocated, away from their cpus; {tie}",
                    memory_nodes
                ));
            }
        }
        for r in results.iter_mut() {
            r.mems = memory_nodes.clone();
        }
        Ok(warnings)
    }

    /// Widens each pinned result's memory nodes to the kinds its configuration allows
    /// (`memoryKinds`, see [`claim_config`]): the memory-only nodes of those kinds attached to
    /// its DRAM nodes, and the DRAM nodes only when `dram` is among them. A kind none of its
    /// nodes has attached, and leaving out `dram` for a result that holds memory or hugepages
    /// of its node, refuse the claim, naming the request and what it holds.
    fn widen_to_memory_kinds(
        &self,
        subject: &str,
        results: &mut [ResultRecord],
        settings: &[claim_config::Settings],
    ) -> Result<(), PolicyError> {
        for (i, (r, s)) in results.iter_mut().zip(settings).enumerate() {
            if !r.memory_pinning || s.memory_kinds == [MemoryKind::Dram] {
                continue;
            }
            let holds = if r.cpus.is_empty() {
                held_text(r)
            } else if r.memory > 0 || !r.hugepages.is_empty() {
                format!("cpus {} and {}", r.cpus, held_text(r))
            } else {
                format!("cpus {}", r.cpus)
            };
            let at = format!(
                "result {i} (request {}, {holds} on NUMA node {})",
                r.request, r.mems
            );
            let refuse = |reason: String| PolicyError::Invalid {
                subject: subject.to_owned(),
                reason: format!("{at}: {reason}"),
            };
            for &kind in s.memory_kinds.iter().filter(|&&k| k != MemoryKind::Dram) {
                if self.attached_to(&r.mems, &[kind]).next().is_some() {
                    continue;
                }
                let elsewhere: NodeSet = self
                    .attached
                    .iter()
                    .filter(|(_, k, _)| *k == kind)
                    .map(|(node, _, _)| *node)
                    .collect();
                let here = if elsewhere.is_empty() {
                    format!("this machine has no {} memory", kind.as_str())
                } else {
                    format!(
                        "this machine's {} memory is node {}, attached to other nodes",
                        kind.as_str(),
                        elsewhere
                    )
                };
                let kind_name = kind.as_str();
                return Err(refuse(format!(
                    "its configuration's memoryKinds names {kind_name}, but no {kind_name} memory is attached to NUMA node {} ({here}); select devices with the attribute {}, or leave {kind_name} out",
                    r.mems,
                    devices::attached_attribute(kind),
                )));
            }
            if !s.memory_kinds.contains(&MemoryKind::Dram)
                && (r.memory > 0 || !r.hugepages.is_empty())
            {
                return Err(refuse(format!(
                    "its configuration's memoryKinds leaves out dram, but the {} it holds are NUMA node {}'s dram: add dram, or ask for no memory",
                    held_text(r),
                    r.mems
                )));
            }
            r.mems = self.zone(&r.mems, &s.memory_kinds);
        }
        Ok(())
    }

    /// The memory and hugepages result `r` on `device` gets from its node's account: what it
    /// consumed of the device's `memory` and `hugepages<size>` capacities, or, for a device
    /// handed out `whole`, all of them. `held` is what the claim's earlier results take. A
    /// result that consumed memory the node does not have for claims, hugepages of a size it
    /// keeps none of, or hugepages that are not whole pages is refused, naming the request and
    /// the amount; nothing is charged then.
    fn plan_claim_memory(
        &self,
        subject: &str,
        at: &str,
        r: &crate::model::AllocationResult,
        device: &devices::PublishedDevice,
        whole: bool,
        held: &BTreeMap<u32, (u64, BTreeMap<u64, u64>)>,
    ) -> Result<MemoryGrant, PolicyError> {
        let invalid = |reason: String| PolicyError::Invalid {
            subject: subject.to_owned(),
            reason: format!("{at}: {reason}"),
        };
        let short = |reason: String| PolicyError::DoesNotFit {
            subject: subject.to_owned(),
            reason: format!("{at}: {reason}"),
        };
        let mut memory = 0u64;
        let mut hugepages: BTreeMap<u64, u64> = BTreeMap::new();
        let mut asked = Vec::new();
        for (name, q) in &r.consumed_capacity {
            // Memory in whole bytes, rounded up as the kubelet rounds a request.
            let bytes = q.units_ceil();
            if bytes == 0 || name == CPU_CAPACITY {
                continue;
            }
            if name == devices::MEMORY_CAPACITY {
                memory = bytes;
                asked.push(format!("{} of memory", bytes_text(bytes)));
            } else if let Some(size) = memory::hugepage_size(name) {
                if !q.milli().is_multiple_of(1000) || !bytes.is_multiple_of(size) {
                    return Err(invalid(format!(
                        "consumed {} of {name}, which is not a whole number of {} pages",
                        bytes_text(bytes),
                        page_size_name(size)
                    )));
                }
                hugepages.insert(size, bytes);
                asked.push(format!("{} of {name}", bytes_text(bytes)));
            }
        }
        let Some(node) = device.memory_node else {
            if asked.is_empty() {
                return Ok(MemoryGrant::default());
            }
            return Err(invalid(format!(
                "consumed {} of device {}, which publishes no memory or hugepages",
                asked.join(" and "),
                r.device
            )));
        };
        let (held_memory, held_huge) = held.get(&node).cloned().unwrap_or_default();
        let memory_free = self.ledger.claim_free(node).saturating_sub(held_memory);
        let huge_free = |size: u64| {
            self.ledger
                .hugepages_free(node, size)
                .map(|free| free.saturating_sub(held_huge.get(&size).copied().unwrap_or(0)))
        };
        if whole {
            // The scheduler handed the device out alone: all of its node's memory is the
            // claim's, as all of its CPUs are.
            let hugepages = device
                .device
                .capacities
                .keys()
                .filter_map(|name| memory::hugepage_size(name))
                .filter_map(|size| huge_free(size).map(|free| (size, free)))
                .filter(|(_, free)| *free > 0)
                .collect();
            return Ok(MemoryGrant {
                node: Some(node),
                memory: memory_free,
                hugepages,
            });
        }
        if memory > memory_free {
            return Err(short(format!(
                "consumed {} of memory of device {} (node {node}), but only {} of the {} set aside for claims there are free ({} held by claims)",
                bytes_text(memory),
                r.device,
                bytes_text(memory_free),
                bytes_text(self.ledger.claim_free(node) + self.ledger.claimed(node)),
                bytes_text(self.ledger.claimed(node) + held_memory),
            )));
        }
        for (&size, &bytes) in &hugepages {
            let name = memory::hugepage_capacity(size);
            let Some(free) = huge_free(size) else {
                return Err(invalid(format!(
                    "consumed {} of {name}, but node {node} keeps no {} hugepages for claims",
                    bytes_text(bytes),
                    page_size_name(size)
                )));
            };
            if bytes > free {
                return Err(short(format!(
                    "consumed {} of {name} of device {} (node {node}), but only {} are free for claims",
                    bytes_text(bytes),
                    r.device,
                    bytes_text(free),
                )));
            }
        }
        let any = memory > 0 || !hugepages.is_empty();
        Ok(MemoryGrant {
            node: any.then_some(node),
            memory,
            hugepages,
        })
    }

    /// Who holds `cpus`: the claims (and this claim's earlier results, `tentative`).
    fn holders(&self, cpus: &CpuSet, tentative: &CpuSet) -> String {
        let mut who: Vec<String> = self
            .claims
            .values()
            .filter(|c| c.cpus().intersects(cpus))
            .map(|c| format!("claim {}", c.describe()))
            .collect();
        if tentative.intersects(cpus) {
            who.push("this claim's other results".into());
        }
        if who.is_empty() {
            "containers".into()
        } else {
            who.join(", ")
        }
    }

    /// `n` CPUs of `free` in whole cores, if whole cores can make them up exactly: as the
    /// picker chooses them (cache locality, packing), else the largest cores first (on hybrid
    /// parts, where cores have different thread counts).
    fn pick_whole_cores(&self, free: &CpuSet, n: usize) -> Option<CpuSet> {
        let whole = devices::whole_cores(&self.topo, free);
        if let Some(cpus) = cpus::pick(&self.topo, &self.index, &whole, n, None)
            && devices::whole_cores(&self.topo, &cpus) == cpus
        {
            return Some(cpus);
        }
        let mut cores: Vec<&CpuSet> = self
            .topo
            .cores
            .iter()
            .map(|c| &c.threads)
            .filter(|t| !t.is_empty() && whole.is_superset(t))
            .collect();
        cores.sort_by_key(|t| (Reverse(t.len()), t.first()));
        let mut picked = CpuSet::new();
        let mut left = n;
        for threads in cores {
            if threads.len() <= left {
                picked = picked.union(threads);
                left -= threads.len();
            }
        }
        (left == 0).then_some(picked)
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
            // Not if claims may take them now (the exclusivity setting changed since).
            if !self.exclusive_free(0).is_superset(cpus) {
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

    /// Exclusive CPUs for a running container, with its memory unpinned if it does not fit
    /// pinned; `None` when the CPUs cannot be had.
    fn plan_exclusive_running(
        &self,
        c: &Container,
        opts: &Options,
        n: usize,
        isolated: bool,
    ) -> Option<Placed> {
        match self.plan_exclusive(c, opts, n, isolated) {
            Ok(Ok(placed)) => Some(placed),
            Ok(Err(_)) => None,
            Err(_) => {
                let unpinned = Options {
                    pin_memory: false,
                    ..opts.clone()
                };
                let mut placed = self.plan_exclusive(c, &unpinned, n, isolated).ok()?.ok()?;
                placed.fallbacks.push(Fallback::MemoryUnpinned);
                Some(placed)
            }
        }
    }

    /// Places a running container no matter what: as planned (which never refuses for CPUs or
    /// memory), else, for a request the policy cannot read, on the shared CPUs of the root.
    fn place_running(
        &mut self,
        c: &Container,
        opts: &Options,
        class: &Class,
        updates: &mut Updates,
    ) {
        let mut placed = self
            .plan_admitted(c, opts, class, c.cpus.as_ref())
            .unwrap_or_else(|_| {
                let grant = Grant::Shared {
                    pool: 0,
                    milli: c.resources.cpu_request_milli,
                };
                self.placed(c, grant, None, Vec::new())
            });
        // Nobody to tell on a sync; the inventory shows where it landed.
        placed.warnings.clear();
        self.commit(&c.id, placed, updates);
    }

    /// Rebuilds every container placement, keeping the claims; returns updates for containers
    /// whose cpuset or memory nodes differ from what the runtime reported.
    pub(super) fn sync_containers(&mut self, containers: &[Container]) -> Vec<ContainerUpdate> {
        // Containers that run shared because their exclusive CPUs could not be had stay shared:
        // a sync does not move running workloads it need not move.
        let ran_shared: std::collections::BTreeSet<String> = self
            .containers
            .iter()
            .filter(|(_, p)| p.fallbacks.contains(&Fallback::NotExclusive))
            .map(|(id, _)| id.clone())
            .collect();
        self.containers.clear();
        for l in &mut self.load {
            *l = super::PoolLoad::default();
        }
        self.ledger.clear_containers();
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

        let mut exclusive: Vec<(&Container, &Options, &Class, usize)> = planned
            .iter()
            .filter_map(|(c, o, class)| match class {
                Class::Exclusive { n, .. } => Some((*c, o, class, *n)),
                _ => None,
            })
            .collect();
        // Those that ran shared stay shared, placed with the shared ones (and like them,
        // where they run now): the policy said so before this sync, or, after a restart, their
        // CPUs are shared with another container, which exclusive CPUs never are.
        let shares_cpus = |c: &Container| {
            c.cpus.as_ref().is_some_and(|mine| {
                containers
                    .iter()
                    .any(|o| o.id != c.id && o.cpus.as_ref().is_some_and(|x| x.intersects(mine)))
            })
        };
        let mut not_exclusive = Vec::new();
        let mut rest = Vec::new();
        for &(c, opts, class, n) in &exclusive {
            let Class::Exclusive { isolated, .. } = class else {
                continue;
            };
            if ran_shared.contains(&c.id) || shares_cpus(c) {
                not_exclusive.push((c, opts));
                continue;
            }
            match self.plan_keep(c, opts, n, *isolated) {
                Some(placed) => self.commit(&c.id, placed, &mut scratch),
                None => rest.push((c, opts, class, n)),
            }
        }
        // New exclusive grants, leaving the shared containers to come room at the root. (Those
        // kept above are running: they stay where they are, shared containers or not.)
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
        exclusive = rest;
        exclusive.sort_by(|a, b| b.3.cmp(&a.3).then_with(|| a.0.id.cmp(&b.0.id)));
        for (c, opts, class, n) in exclusive {
            let Class::Exclusive { isolated, .. } = class else {
                continue;
            };
            match self.plan_exclusive_running(c, opts, n, *isolated) {
                Some(placed) => self.commit(&c.id, placed, &mut scratch),
                None => not_exclusive.push((c, opts)),
            }
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
        for (c, opts) in not_exclusive {
            let shared = Class::Shared {
                milli: c.resources.cpu_request_milli,
            };
            let mut placed = self
                .plan_admitted(c, opts, &shared, c.cpus.as_ref())
                .unwrap_or_else(|_| {
                    let grant = Grant::Shared {
                        pool: 0,
                        milli: c.resources.cpu_request_milli,
                    };
                    self.placed(c, grant, None, Vec::new())
                });
            placed.fallbacks.insert(0, Fallback::NotExclusive);
            placed.warnings.clear();
            self.commit(&c.id, placed, &mut scratch);
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
