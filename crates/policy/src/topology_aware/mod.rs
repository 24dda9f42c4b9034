//! The topology-aware policy: containers and DRA claims placed on a tree of CPU pools.
//!
//! # Placement
//!
//! The machine is a tree of pools ([`pools`]): root, sockets, dies, NUMA nodes, L3 groups. Each
//! online CPU is *reserved* (configured, for system pods), *isolated* (by the kernel), *shared*,
//! or *taken* by an exclusive grant (a container or a claim). A pool's shared CPUs are its CPUs
//! that are none of the others. Some CPUs are also *published* for claims ([`devices`]): which
//! ones, and whether containers may have CPUs of their own, is [`Exclusivity`].
//!
//! | container | gets |
//! |---|---|
//! | uses a DRA claim of ours | the claim's CPUs and memory nodes |
//! | reserved namespace (`kube-system`) or `reserved-cpus` annotation | the reserved CPUs |
//! | Guaranteed, whole CPUs, not `prefer-shared-cpus`, with `partition` or `pods` | exclusive CPUs not published for claims (isolated ones with `prefer-isolated-cpus`, when a pool has enough) |
//! | anything else (Burstable, BestEffort, fractional; Guaranteed with `claims`) | the shared CPUs of one pool |
//!
//! - **Exclusive** grants come from the tightest pool that fits (fewest CPUs, so a request that
//!   fits in a NUMA node or L3 group never spans two), then one whose memory has room, then the
//!   one with the fewest free CPUs (packing), then the lower id. Inside it, whole idle cores
//!   first ([`cpus`]). A grant never takes a CPU that is set aside for claims. It prefers CPUs
//!   that no pool's shared containers need (their summed requests, at least one CPU per pool in
//!   use); when no pool can spare enough beside them, it takes them anyway, from the tightest
//!   pool that has them, as a claim does and as the kubelet's static CPU manager does (its
//!   exclusive grants may take every CPU not reserved, and its shared pool keeps the reserved
//!   ones): the shared containers move, and a Guaranteed container runs shared only when fewer
//!   CPUs than it asks for are free of reservations, claims and exclusive grants. Otherwise the
//!   order of arrival would decide: a Guaranteed container arriving first takes the last shared
//!   CPUs, and a shared one arriving after it runs on the reserved CPUs anyway.
//! - **Shared** containers go to a pool with room for their request in it and every ancestor:
//!   memory fitting first, then room for the CPU limit, the deeper pool, fewer containers, more
//!   room, lower id. Their cpuset is the pool's shared CPUs *at any time*: when an exclusive
//!   grant or a claim cuts CPUs out of a pool, or gives them back, every shared container of
//!   that pool gets an update (the ripple).
//! - **Nothing the kubelet admitted is refused** for CPUs or memory: a Guaranteed container
//!   whose exclusive CPUs cannot be had runs shared; a shared container no pool has room for
//!   overcommits the roomiest; when claims or exclusive grants take a pool's last shared CPUs
//!   its containers run on
//!   the shared CPUs of the enclosing pool, and when nothing is shared anywhere on the reserved
//!   CPUs (which the kubelet's static CPU manager keeps in its shared pool for this reason);
//!   memory that does not fit is left unpinned. Each comes with a warning in the answer and shows
//!   in the inventory as a [`crate::Fallback`], which the binary exports as a metric.
//! - **Memory** ([`memory`]) is pinned to the DRAM nodes of the CPUs granted (of the pool, for
//!   shared containers), plus the memory-only nodes
//!   attached to it when the `memory-type` annotation asks for their kind, widened by distance
//!   when the request does not fit; requests never overcommit a node.
//!
//! # Claims
//!
//! See [`devices`] for what is published and what a result gets (the scheduler's promise:
//! every claim it allocates from our devices is granted), [`claims`] for the records and CDI
//! edits: CPUs picked whole cores first out of the device's claimable CPUs, never waiting for
//! shared containers (they move), recorded durably and granted through CDI environment edits;
//! containers using a claim are pinned to it. A claim's configuration ([`claim_config`]) may
//! leave its memory unpinned or ask for whole cores, which it gets when its device hands out
//! whole cores or whole cores make up what it consumed, and otherwise gets what the scheduler
//! allocated, with a warning.
//!
//! # Determinism and cost
//!
//! Every choice ends in a total order (ids, CPU numbers), and state lives in ordered maps, so
//! the same calls give the same answers. Failed calls change nothing: each operation plans on
//! the unchanged state, then commits.
//!
//! Measured with `cargo bench -p policy` (`benches/placement.rs`) on a synthetic
//! `pack:4 numa:4 core:32 pu:2` machine (1,024 threads, 16 NUMA nodes) holding 1,000 containers
//! (100 with 2 exclusive CPUs, 500 Burstable, 400 BestEffort; half the machine published for
//! claims with `partition`), on the 2-vCPU development VM while other builds kept its load
//! average high, so these are pessimistic:
//!
//! | operation | median | p99 | target |
//! |---|---|---|---|
//! | place a Burstable container | 1.8 µs | 2.0 µs | median < 20 µs |
//! | place a 2-CPU exclusive container (ripples ~60 shared containers) | 5.4 µs | 8.1 µs | median < 20 µs |
//! | allocate a 2-CPU claim (same ripple) | 9.5 µs | 36 µs | median < 20 µs |
//! | sync all 1,000 containers | 15.6 ms | 28.9 ms | < 20 ms |
//!
//! The cost of an exclusive grant or a claim is mostly the ripple: one update per shared
//! container of every pool that lost CPUs, which is the answer itself.

pub mod annotations;
pub mod claim_config;
pub mod claims;
pub mod cpus;
pub mod devices;
mod inventory;
pub mod memory;
mod place;
pub mod pools;

use std::collections::BTreeMap;

use claims::{HeldClaim, Snapshot};
use cpus::CpuIndex;
pub use devices::{DeviceMode, DeviceModel, DeviceTable, Granularity, GroupBy};
use memory::Ledger;
pub use memory::{MemoryConfig, NodeReservation};
use pools::Pool;

use crate::{
    api::{Policy, PolicyError},
    idset::{CpuSet, NodeSet},
    inventory::Fallback,
    model::{
        Adjustment, Allocation, Claim, ClaimAllocation, Container, ContainerUpdate, Device,
        Resources,
    },
    topology::{MemoryKind, Topology},
};

/// Which CPUs are reserved for system pods.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReservedCpus {
    /// This many CPUs, picked like an exclusive grant from the lowest-numbered cores.
    Count(usize),
    /// Exactly these CPUs (offline ones are ignored).
    Set(CpuSet),
}

/// The DRA driver name the policy serves unless configured otherwise.
pub const DEFAULT_DRIVER: &str = "topology-aware.resmgr.io";

/// Which CPUs a [`Exclusivity::Partition`] sets aside for claims.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimCpus {
    /// This many CPUs, picked like an exclusive grant (whole cores, tightly packed).
    Count(usize),
    /// Exactly these CPUs (offline ones are ignored).
    Set(CpuSet),
}

/// Who gets CPUs of their own. The published devices promise the scheduler CPUs; this decides
/// what else may take CPUs, so that the promise holds (see [`devices`]).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Exclusivity {
    /// Only DRA claims get CPUs of their own (the model of kubernetes-sigs/dra-driver-cpu).
    /// Guaranteed containers without a claim run on shared CPUs; every CPU that is not reserved
    /// or kernel-isolated is published, and claims never wait for shared containers, which
    /// move to the CPUs still shared. Needs the kubelet's CPU manager policy `none`.
    #[default]
    Claims,
    /// A fixed set of CPUs is published for claims and never granted to a container
    /// exclusively; while unclaimed they are lent to the shared pools and taken back (with
    /// container updates) when a claim arrives. Guaranteed containers with whole CPUs get
    /// exclusive CPUs from the rest, as with `Pods`.
    Partition(ClaimCpus),
    /// Classic nri-plugins: Guaranteed containers with whole CPUs get exclusive CPUs; no device
    /// is published (an empty pool) and claims are refused.
    Pods,
}

/// Configuration of the topology-aware policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// CPUs for system pods; they are never granted exclusively or shared, except as the last
    /// resort of shared containers when no other CPU is shared.
    pub reserved_cpus: ReservedCpus,
    /// Pods in these namespaces run on the reserved CPUs unless annotated otherwise.
    pub reserved_namespaces: Vec<String>,
    /// Our DRA driver name, which is also the CDI vendor of the claim devices the resource
    /// manager writes: a container uses one of our claims only through a device of this vendor
    /// (see [`claims`]).
    pub driver: String,
    /// Who gets CPUs of their own.
    pub exclusivity: Exclusivity,
    /// How the claimable CPUs are published.
    pub devices: DeviceModel,
    /// How each NUMA node's memory and hugepages are split between the system, claims and
    /// containers ([`memory`]); the default publishes none, as before memory was published.
    pub memory: MemoryConfig,
}

impl Default for Config {
    /// One reserved CPU (CPU 0 on most machines), `kube-system` on it, driver
    /// [`DEFAULT_DRIVER`], exclusive CPUs through claims only, one device per NUMA node.
    fn default() -> Self {
        Self {
            reserved_cpus: ReservedCpus::Count(1),
            reserved_namespaces: vec!["kube-system".into()],
            driver: DEFAULT_DRIVER.into(),
            exclusivity: Exclusivity::default(),
            devices: DeviceModel::default(),
            memory: MemoryConfig::default(),
        }
    }
}

/// Why the policy cannot be built from a topology and configuration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// The reserved CPUs cannot be had.
    #[error("cannot reserve cpus: {0}")]
    Reserved(String),
    /// The CPUs for claims cannot be had.
    #[error("cannot set cpus aside for claims: {0}")]
    ClaimCpus(String),
}

/// How a container is placed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Grant {
    /// On the reserved CPUs.
    Reserved,
    /// On the shared CPUs of a pool, with this CPU request.
    Shared {
        /// The pool.
        pool: usize,
        /// The request in milli-CPUs.
        milli: u64,
    },
    /// On CPUs of its own, cut out of a pool's shared CPUs.
    Exclusive {
        /// The pool.
        pool: usize,
        /// The CPUs.
        cpus: CpuSet,
    },
    /// On kernel-isolated CPUs of its own.
    Isolated {
        /// The pool.
        pool: usize,
        /// The CPUs.
        cpus: CpuSet,
    },
    /// On the CPUs of the claims it uses.
    Claim {
        /// The claims' CPUs.
        cpus: CpuSet,
    },
}

#[derive(Debug, Clone)]
struct Placed {
    container: Container,
    grant: Grant,
    mems: Option<NodeSet>,
    charge: Vec<(u32, u64)>,
    /// The memory and hugepage limits its claims bound it to.
    limits: Limits,
    /// What was done instead of refusing it, at placement ([`Fallback::NotExclusive`],
    /// [`Fallback::MemoryUnpinned`]); where its shared CPUs come from is worked out when asked.
    fallbacks: Vec<Fallback>,
    /// What to tell the operator about the placement; taken by the call that made it.
    warnings: Vec<String>,
}

/// The limits a container using claims gets from what they granted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Limits {
    /// Bytes of memory; `None` leaves the kubelet's limit.
    memory: Option<u64>,
    /// Bytes of hugepages by page size.
    hugepages: BTreeMap<u64, u64>,
}

/// Load on a pool from shared containers, its subtree included.
#[derive(Debug, Clone, Default)]
struct PoolLoad {
    milli: u64,
    count: usize,
    /// Shared containers placed in this very pool.
    /// With their memory nodes, so the ripple needs no lookup per member.
    members: BTreeMap<String, Option<NodeSet>>,
}

/// A container's placement, for inspection (simulator, tests).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// How it is placed.
    pub grant: Grant,
    /// The pool's name, for pool grants.
    pub pool: Option<String>,
    /// Its cpuset now.
    pub cpus: CpuSet,
    /// Its memory nodes, when pinned.
    pub mems: Option<NodeSet>,
}

/// A pool's CPUs, split by use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolCpus {
    /// Reserved for system pods.
    pub reserved: CpuSet,
    /// Kernel-isolated, free.
    pub isolated: CpuSet,
    /// Kernel-isolated, granted to containers.
    pub isolated_granted: CpuSet,
    /// Shared by the pool's shared containers.
    pub shared: CpuSet,
    /// Granted exclusively to containers and claims.
    pub exclusive: CpuSet,
}

/// The topology-aware policy. See the module docs.
#[derive(Debug, Clone)]
pub struct TopologyAware {
    topo: Topology,
    config: Config,
    pools: Vec<Pool>,
    index: CpuIndex,
    reserved: CpuSet,
    /// Online, isolated, not reserved.
    isolated: CpuSet,
    /// The CPUs claims may take, as the configuration says ([`Exclusivity`]).
    claimable: CpuSet,
    /// The published devices and the claimable CPUs behind them: `claimable` cut by the device
    /// model, less what claims on devices no longer published hold (see
    /// [`TopologyAware::refresh_devices`]).
    table: DeviceTable,
    /// Memory-only nodes: (node, kind, the CPU node closest to it).
    attached: Vec<(u32, MemoryKind, u32)>,
    /// Cut out of the shared CPUs: exclusive container grants and claims.
    taken: CpuSet,
    isolated_taken: CpuSet,
    /// Per pool: its shared CPUs now.
    shared: Vec<CpuSet>,
    /// Per pool: what its shared containers run on now: its shared CPUs, or, when it has none
    /// left, its parent's, and so up to the root; with nothing shared at all, the reserved CPUs.
    runs_on: Vec<CpuSet>,
    load: Vec<PoolLoad>,
    containers: BTreeMap<String, Placed>,
    claims: BTreeMap<String, HeldClaim>,
    ledger: Ledger,
    /// Counters of what the resource manager reads back ([`Policy::generations`]): moved where
    /// `claims` changes (the snapshot is the claims) and where `table` is built again.
    generations: Counters,
}

/// [`Policy::generations`]' counters.
#[derive(Debug, Clone, Copy, Default)]
struct Counters {
    durable: u64,
    devices: u64,
}

/// The updates a call collects. A container may be queued several times (a ripple, then its
/// own move); only its last update is reported, once, in container order.
#[derive(Debug, Default)]
struct Updates(Vec<ContainerUpdate>);

impl Updates {
    fn new() -> Self {
        Self::default()
    }

    fn push(&mut self, update: ContainerUpdate) {
        self.0.push(update);
    }

    fn remove(&mut self, id: &str) -> Option<ContainerUpdate> {
        let last = self.0.iter().rposition(|u| u.container_id == id)?;
        let update = self.0.remove(last);
        self.0.retain(|u| u.container_id != id);
        Some(update)
    }

    fn into_vec(self) -> Vec<ContainerUpdate> {
        let mut all = self.0;
        // Stable: among equal ids the last queued stays last, and dedup keeps the first, so
        // reverse first.
        all.reverse();
        all.sort_by(|a, b| a.container_id.cmp(&b.container_id));
        all.dedup_by(|later, earlier| later.container_id == earlier.container_id);
        all
    }
}

impl TopologyAware {
    /// A policy for `topo`, holding nothing.
    pub fn new(topo: Topology, config: Config) -> Result<Self, ConfigError> {
        let pools = pools::build(&topo);
        let index = CpuIndex::new(&topo, &pools);
        let reserved = match &config.reserved_cpus {
            ReservedCpus::Set(set) => set.intersection(&topo.online),
            ReservedCpus::Count(n) => {
                let free = topo.online.difference(&topo.isolated);
                cpus::pick(&topo, &index, &free, *n, None).ok_or_else(|| {
                    ConfigError::Reserved(format!(
                        "{n} cpus asked for, {} online and not isolated",
                        free.len()
                    ))
                })?
            }
        };
        let isolated = topo.isolated.difference(&reserved);
        let claimable = claimable(&topo, &index, &config, &reserved)?;
        let ledger = Ledger::new(&topo, &config.memory);
        let table =
            DeviceTable::build_with_memory(&topo, &claimable, &config.devices, &ledger.offer());
        let attached = topo.attached_memory();
        let mut policy = Self {
            attached,
            load: vec![PoolLoad::default(); pools.len()],
            shared: vec![CpuSet::new(); pools.len()],
            runs_on: vec![CpuSet::new(); pools.len()],
            pools,
            index,
            reserved,
            isolated,
            claimable,
            table,
            taken: CpuSet::new(),
            isolated_taken: CpuSet::new(),
            containers: BTreeMap::new(),
            claims: BTreeMap::new(),
            ledger,
            generations: Counters::default(),
            topo,
            config,
        };
        policy.refresh_all_shared();
        Ok(policy)
    }

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

    /// Charges (or with `charge` false takes back) what a claim's results hold of the memory
    /// account.
    fn account_claim(&mut self, record: &HeldClaim, charge: bool) {
        for r in &record.results {
            if let Some(node) = r.memory_node {
                if charge {
                    self.ledger.charge_claim(node, r.memory, &r.hugepages);
                } else {
                    self.ledger.uncharge_claim(node, r.memory, &r.hugepages);
                }
            }
        }
    }

    fn cpus_of(&self, grant: &Grant) -> CpuSet {
        match grant {
            Grant::Reserved => self.reserved.clone(),
            Grant::Shared { pool, .. } => self.runs_on.get(*pool).cloned().unwrap_or_default(),
            Grant::Exclusive { cpus, .. }
            | Grant::Isolated { cpus, .. }
            | Grant::Claim { cpus } => cpus.clone(),
        }
    }

    fn adjustment_of(&self, p: &Placed) -> Adjustment {
        Adjustment {
            cpus: Some(self.cpus_of(&p.grant)),
            mems: p.mems.clone(),
            memory_limit_bytes: p.limits.memory,
            hugepage_limits: p.limits.hugepages.clone(),
        }
    }

    fn update_of(&self, id: &str) -> Option<ContainerUpdate> {
        let p = self.containers.get(id)?;
        Some(ContainerUpdate {
            container_id: id.to_owned(),
            cpus: Some(self.cpus_of(&p.grant)),
            mems: p.mems.clone(),
        })
    }

    fn pool_shared_now(&self, pool: &Pool) -> CpuSet {
        pool.cpus
            .difference(&self.reserved)
            .difference(&self.isolated)
            .difference(&self.taken)
    }

    fn refresh_all_shared(&mut self) {
        for i in 0..self.pools.len() {
            let now = self.pools.get(i).map(|p| self.pool_shared_now(p));
            if let (Some(now), Some(slot)) = (now, self.shared.get_mut(i)) {
                *slot = now;
            }
        }
        self.runs_on = self.compute_runs_on();
    }

    /// Rebuilds the published devices, withholding the CPUs that claims allocated on devices
    /// this configuration does not publish hold (the device model, `group-by` or the claimable
    /// CPUs changed while they were held): the scheduler does not count those claims against the
    /// new devices, so publishing their CPUs would promise them twice. When such a claim goes,
    /// its CPUs are published again. Claims on devices still published need nothing: the
    /// scheduler already counts them.
    ///
    /// Memory goes the same way: what such claims hold of a node's memory and hugepages is left
    /// out of what that node's device publishes (`numa<N>` and `memory<N>` stand for the same
    /// account, and a claim on one is not counted against the other).
    fn refresh_devices(&mut self) {
        let mut offer = self.ledger.offer();
        let full = DeviceTable::build_with_memory(
            &self.topo,
            &self.claimable,
            &self.config.devices,
            &offer,
        );
        let unpublished: Vec<&claims::ResultRecord> = self
            .claims
            .values()
            .flat_map(|c| &c.results)
            .filter(|r| full.get(&r.device).is_none())
            .collect();
        let withheld = unpublished
            .iter()
            .fold(CpuSet::new(), |acc, r| acc.union(&r.cpus));
        let mut memory_withheld = false;
        for r in &unpublished {
            let Some(node) = r.memory_node else {
                continue;
            };
            if let Some(o) = offer.get_mut(&node) {
                o.memory = o.memory.saturating_sub(r.memory);
                for (size, bytes) in &r.hugepages {
                    if let Some(h) = o.hugepages.get_mut(size) {
                        *h = h.saturating_sub(*bytes);
                    }
                }
                memory_withheld = true;
            }
        }
        self.table = if withheld.intersects(full.cpus()) || memory_withheld {
            let claimable = self.claimable.difference(&withheld);
            DeviceTable::build_with_memory(&self.topo, &claimable, &self.config.devices, &offer)
        } else {
            full
        };
        self.generations.devices += 1;
    }

    /// What each pool's shared containers run on: see [`TopologyAware::runs_on`]'s field docs.
    /// Pools are numbered parents first, so one pass sees every parent before its children.
    fn compute_runs_on(&self) -> Vec<CpuSet> {
        let mut out: Vec<CpuSet> = Vec::with_capacity(self.pools.len());
        for (i, pool) in self.pools.iter().enumerate() {
            let own = self.shared.get(i).filter(|s| !s.is_empty());
            let set = match (own, pool.parent.and_then(|p| out.get(p))) {
                (Some(own), _) => own.clone(),
                (None, Some(parent)) => parent.clone(),
                (None, None) => self.last_resort(),
            };
            out.push(set);
        }
        out
    }

    /// Where shared containers run when no CPU is shared anywhere: the reserved CPUs, which the
    /// kubelet's static CPU manager keeps in its shared pool for this very reason; on a machine
    /// configured without reserved CPUs, every online CPU rather than none.
    fn last_resort(&self) -> CpuSet {
        if self.reserved.is_empty() {
            self.topo.online.clone()
        } else {
            self.reserved.clone()
        }
    }

    /// Why shared pool `pool`'s containers do not run on its own shared CPUs, if they do not.
    fn shared_fallback(&self, pool: usize) -> Option<Fallback> {
        if self.shared.get(pool).is_some_and(|s| !s.is_empty()) {
            return None;
        }
        let widened = self
            .ancestors(pool)
            .any(|a| self.shared.get(a).is_some_and(|s| !s.is_empty()));
        Some(if widened {
            Fallback::Widened
        } else {
            Fallback::Reserved
        })
    }

    /// Recomputes the shared CPUs of the pools holding any of `changed`, and queues an update
    /// for every shared container whose CPUs changed (the ripple): the members of those pools,
    /// and of pools below them that had run out of shared CPUs and borrow theirs.
    fn ripple(&mut self, changed: &CpuSet, updates: &mut Updates) {
        let mut any = false;
        for i in 0..self.pools.len() {
            let Some(pool) = self.pools.get(i) else {
                continue;
            };
            if !pool.cpus.intersects(changed) {
                continue;
            }
            let now = self.pool_shared_now(pool);
            if let Some(slot) = self.shared.get_mut(i)
                && *slot != now
            {
                *slot = now;
                any = true;
            }
        }
        if !any {
            return;
        }
        let now = self.compute_runs_on();
        let before = std::mem::replace(&mut self.runs_on, now);
        for (i, (was, now)) in before.iter().zip(&self.runs_on).enumerate() {
            if was == now {
                continue;
            }
            let Some(load) = self.load.get(i) else {
                continue;
            };
            for (id, mems) in &load.members {
                updates.push(ContainerUpdate {
                    container_id: id.clone(),
                    cpus: Some(now.clone()),
                    mems: mems.clone(),
                });
            }
        }
    }

    /// Shared CPUs each pool can still give up to exclusive container grants without taking
    /// what its shared containers need: those that are not set aside for claims, minus that need
    /// (so that claims taking back what they lent never leave shared containers short because
    /// of an exclusive grant). The grants prefer these; see [`TopologyAware::plan_exclusive`].
    fn spare(&self) -> Vec<i64> {
        (0..self.pools.len())
            .map(|i| {
                let have = self.exclusive_free(i).len();
                to_i64(have) - to_i64(self.need(i))
            })
            .collect()
    }

    /// The shared CPUs of pool `pool` an exclusive container grant may take: never the ones set
    /// aside for claims, published or not right now (the devices withhold some while claims of
    /// an earlier configuration hold them, and leave out the lone threads of split cores with
    /// whole-core granularity; either may be published later).
    fn exclusive_free(&self, pool: usize) -> CpuSet {
        self.shared
            .get(pool)
            .map(|s| s.difference(&self.claimable))
            .unwrap_or_default()
    }

    /// CPUs a pool's shared containers need: their summed requests, at least one if any.
    fn need(&self, pool: usize) -> usize {
        self.load.get(pool).map_or(0, |l| {
            let cpus = usize::try_from(l.milli.div_ceil(1000)).unwrap_or(usize::MAX);
            cpus.max(usize::from(l.count > 0))
        })
    }

    fn ancestors(&self, pool: usize) -> impl Iterator<Item = usize> + '_ {
        std::iter::successors(Some(pool), |&p| self.pools.get(p).and_then(|p| p.parent))
    }

    /// How many CPUs an allocation result gets (see [`devices`]): what it consumed of a shared
    /// device, all of a device handed out whole; for a device not published (the device model
    /// changed since it was allocated), what it consumed, if it says.
    fn cpus_for(&self, r: &crate::model::AllocationResult) -> Option<u64> {
        let consumed = r
            .consumed_capacity
            .get(devices::CPU_CAPACITY)
            .map(|q| q.units_ceil());
        let Some(device) = self.table.get(&r.device) else {
            return consumed;
        };
        let whole = u64::try_from(device.cpus.len()).ok();
        match device.share {
            devices::Share::Whole => whole,
            devices::Share::Consumable { .. } => consumed.or(whole),
        }
    }

    /// For every pool with shared containers, why they do not run on its own shared CPUs.
    fn pool_fallbacks(&self) -> Vec<Option<Fallback>> {
        (0..self.pools.len())
            .map(|i| {
                let members = self.load.get(i).is_some_and(|l| !l.members.is_empty());
                members.then(|| self.shared_fallback(i)).flatten()
            })
            .collect()
    }

    /// Warnings for pools whose shared containers lost their own shared CPUs since `before`
    /// (a [`TopologyAware::pool_fallbacks`]), blaming `cause`.
    fn fallback_warnings(&self, before: &[Option<Fallback>], cause: &str) -> Vec<String> {
        let now = self.pool_fallbacks();
        let mut out = Vec::new();
        for (i, (was, is)) in before.iter().zip(&now).enumerate() {
            let (Some(is), Some(pool), Some(load)) = (is, self.pools.get(i), self.load.get(i))
            else {
                continue;
            };
            if was.as_ref() == Some(is) {
                continue;
            }
            let cpus = self.runs_on.get(i).cloned().unwrap_or_default();
            let instead = match is {
                Fallback::Reserved => "the reserved cpus, as nothing else is shared".to_owned(),
                _ => {
                    let from = self
                        .ancestors(i)
                        .find(|&a| self.shared.get(a).is_some_and(|s| !s.is_empty()))
                        .and_then(|a| self.pools.get(a))
                        .map_or_else(|| "an enclosing pool".to_owned(), |p| p.name.clone());
                    format!("the shared cpus of {from}")
                }
            };
            out.push(format!(
                "{cause} took the last shared cpus of pool {pool}: its shared containers ({}) now run on {instead} ({cpus})",
                load.members.len()
            ));
        }
        out
    }

    /// Records a placement: CPUs, pool load, memory; queues the ripple.
    fn commit(&mut self, id: &str, placed: Placed, updates: &mut Updates) {
        self.ledger.charge(&placed.charge);
        match &placed.grant {
            Grant::Exclusive { cpus, .. } => {
                self.taken = self.taken.union(cpus);
                let cpus = cpus.clone();
                self.containers.insert(id.to_owned(), placed);
                self.ripple(&cpus, updates);
                return;
            }
            Grant::Isolated { cpus, .. } => {
                self.isolated_taken = self.isolated_taken.union(cpus);
            }
            Grant::Shared { pool, milli } => {
                let (pool, milli) = (*pool, *milli);
                for p in self.ancestors(pool).collect::<Vec<_>>() {
                    if let Some(l) = self.load.get_mut(p) {
                        l.milli += milli;
                        l.count += 1;
                    }
                }
                if let Some(l) = self.load.get_mut(pool) {
                    l.members.insert(id.to_owned(), placed.mems.clone());
                }
            }
            Grant::Reserved | Grant::Claim { .. } => {}
        }
        self.containers.insert(id.to_owned(), placed);
    }

    /// Forgets a placement, giving back what it held; queues the ripple.
    fn uncommit(&mut self, id: &str, updates: &mut Updates) -> Option<Placed> {
        let placed = self.containers.remove(id)?;
        updates.remove(id);
        self.ledger.uncharge(&placed.charge);
        match &placed.grant {
            Grant::Exclusive { cpus, .. } => {
                self.taken = self.taken.difference(cpus);
                self.ripple(cpus, updates);
            }
            Grant::Isolated { cpus, .. } => {
                self.isolated_taken = self.isolated_taken.difference(cpus);
            }
            Grant::Shared { pool, milli } => {
                for p in self.ancestors(*pool).collect::<Vec<_>>() {
                    if let Some(l) = self.load.get_mut(p) {
                        l.milli = l.milli.saturating_sub(*milli);
                        l.count = l.count.saturating_sub(1);
                    }
                }
                if let Some(l) = self.load.get_mut(*pool) {
                    l.members.remove(id);
                }
            }
            Grant::Reserved | Grant::Claim { .. } => {}
        }
        Some(placed)
    }

    /// How an adopted request's `cpus` split over its `n` results: one published device each
    /// when exactly `n` devices make them up (individual devices), or all of them on the
    /// smallest device that holds them when `n` is 1; otherwise, not knowing, all on the first
    /// result. With the device's name, or an empty one when no published device tells.
    fn split_adopted(&self, cpus: &CpuSet, n: usize) -> Vec<(String, CpuSet)> {
        let parts: Vec<(String, CpuSet)> = self
            .table
            .iter()
            .filter(|d| d.cpus.intersects(cpus))
            .map(|d| (d.device.name.clone(), d.cpus.intersection(cpus)))
            .collect();
        let covered = parts.iter().fold(CpuSet::new(), |all, (_, c)| all.union(c));
        if n > 1 && parts.len() == n && covered == *cpus {
            return parts;
        }
        let holder = self
            .table
            .iter()
            .filter(|d| d.cpus.is_superset(cpus))
            .min_by_key(|d| d.cpus.len())
            .map(|d| d.device.name.clone())
            .filter(|_| n == 1)
            .unwrap_or_default();
        std::iter::once((holder, cpus.clone()))
            .chain(std::iter::repeat_n((String::new(), CpuSet::new()), n - 1))
            .collect()
    }

    fn claim_edits(&self, uid: &str) -> Option<ClaimAllocation> {
        self.claims.get(uid).map(|c| ClaimAllocation {
            edits: c.edits(),
            ..ClaimAllocation::default()
        })
    }
}

/// The CPUs claims may take, as `config.exclusivity` says: see [`Exclusivity`].
fn claimable(
    topo: &Topology,
    index: &CpuIndex,
    config: &Config,
    reserved: &CpuSet,
) -> Result<CpuSet, ConfigError> {
    let available = topo.online.difference(reserved).difference(&topo.isolated);
    match &config.exclusivity {
        Exclusivity::Pods => Ok(CpuSet::new()),
        Exclusivity::Claims => Ok(available),
        Exclusivity::Partition(ClaimCpus::Set(set)) => {
            let online = set.intersection(&topo.online);
            for (what, cpus) in [("reserved", reserved), ("kernel-isolated", &topo.isolated)] {
                let both = online.intersection(cpus);
                if !both.is_empty() {
                    return Err(ConfigError::ClaimCpus(format!(
                        "cpus {both} of {set} are {what}"
                    )));
                }
            }
            Ok(online)
        }
        Exclusivity::Partition(ClaimCpus::Count(n)) => {
            cpus::pick(topo, index, &available, *n, None).ok_or_else(|| {
                ConfigError::ClaimCpus(format!(
                    "{n} cpus asked for, {} online and neither reserved nor isolated",
                    available.len()
                ))
            })
        }
    }
}

fn to_i64(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

fn into_vec(updates: Updates) -> Vec<ContainerUpdate> {
    updates.into_vec()
}

impl Policy for TopologyAware {
    fn name(&self) -> &str {
        "topology-aware"
    }

    fn restore(&mut self, snapshot: &serde_json::Value) -> Result<(), PolicyError> {
        if snapshot.is_null() {
            return Ok(());
        }
        // The version first, so that a newer snapshot says so rather than naming a field this
        // build does not know; then the shape, refusing unknown fields (see `Snapshot`).
        if let Some(version) = snapshot.get("version") {
            match version.as_u64() {
                Some(v) if v > u64::from(claims::SNAPSHOT_VERSION) => {
                    return Err(PolicyError::restore(format!(
                        "snapshot version {v} is newer than this build reads (1 to {}): it was \
                         written by a newer release",
                        claims::SNAPSHOT_VERSION
                    )));
                }
                Some(1..) => {}
                _ => {
                    return Err(PolicyError::restore(format!(
                        "not a topology-aware snapshot: version {version}"
                    )));
                }
            }
        }
        let snap: Snapshot = serde_path_to_error::deserialize(snapshot).map_err(|e| {
            let at = match e.path().to_string() {
                root if root == "." => String::new(),
                path => format!(" at {path}"),
            };
            let inner = e.into_inner();
            let reason = if inner.to_string().starts_with("unknown field") {
                format!(
                    "the snapshot has a field this build does not know, written by a newer \
                     release{at}"
                )
            } else {
                format!("not a topology-aware snapshot{at}")
            };
            PolicyError::restore_decoding(reason, inner)
        })?;
        // A claim keeps its CPUs whatever devices are published now (the device model or the
        // claimable CPUs may have changed since): its pods may be using them. It only needs
        // CPUs that a claim could ever have held, held by no other claim.
        let grantable = self
            .topo
            .online
            .difference(&self.reserved)
            .difference(&self.topo.isolated);
        let mut taken = self.taken.clone();
        let mut restored = BTreeMap::new();
        for claim in snap.claims {
            for (i, r) in claim.results.iter().enumerate() {
                let why = if !self.topo.online.is_superset(&r.cpus) {
                    Some(format!(
                        "{} are not online here (online {})",
                        r.cpus.difference(&self.topo.online),
                        self.topo.online
                    ))
                } else if !grantable.is_superset(&r.cpus) {
                    Some(format!(
                        "{} are reserved or kernel-isolated here",
                        r.cpus.difference(&grantable)
                    ))
                } else if taken.intersects(&r.cpus) {
                    Some(format!(
                        "{} are already held by another claim",
                        taken.intersection(&r.cpus)
                    ))
                } else {
                    None
                };
                if let Some(why) = why {
                    return Err(PolicyError::restore(format!(
                        "claim {} result {i} (device {}): cpus {}: {why}",
                        claim.describe(),
                        r.device,
                        r.cpus,
                    )));
                }
                taken = taken.union(&r.cpus);
            }
            restored.insert(claim.uid.clone(), claim);
        }
        let mut updates = Updates::new();
        let changed = taken.difference(&self.taken);
        self.taken = taken;
        for record in restored.values() {
            self.account_claim(record, true);
        }
        self.claims.extend(restored);
        self.generations.durable += 1;
        self.refresh_devices();
        self.ripple(&changed, &mut updates);
        Ok(())
    }

    fn snapshot(&self) -> serde_json::Value {
        let snap = Snapshot::of(self.claims.values().cloned().collect());
        // Plain structs of strings, numbers and sets: serializing cannot fail.
        serde_json::to_value(snap).unwrap_or(serde_json::Value::Null)
    }

    fn sync(&mut self, containers: &[Container]) -> Result<Vec<ContainerUpdate>, PolicyError> {
        Ok(self.sync_containers(containers))
    }

    fn allocate(&mut self, container: &Container) -> Result<Allocation, PolicyError> {
        if let Some(p) = self.containers.get(&container.id) {
            return Ok(Allocation {
                adjustment: self.adjustment_of(p),
                ..Allocation::default()
            });
        }
        let mut placed = self.plan(container)?;
        let mut warnings = std::mem::take(&mut placed.warnings);
        // An exclusive grant may take a pool's last shared CPUs, as a claim may.
        let before = matches!(placed.grant, Grant::Exclusive { .. }).then(|| self.pool_fallbacks());
        let mut updates = Updates::new();
        self.commit(&container.id, placed, &mut updates);
        updates.remove(&container.id);
        if let Some(before) = before {
            let cause = format!("container {}", annotations::describe(container));
            warnings.extend(self.fallback_warnings(&before, &cause));
        }
        let adjustment = self
            .containers
            .get(&container.id)
            .map(|p| self.adjustment_of(p))
            .unwrap_or_default();
        Ok(Allocation {
            adjustment,
            updates: into_vec(updates),
            warnings,
        })
    }

    fn update(
        &mut self,
        container_id: &str,
        resources: &Resources,
    ) -> Result<Vec<ContainerUpdate>, PolicyError> {
        let Some(old) = self.containers.get(container_id) else {
            return Err(PolicyError::UnknownContainer(container_id.to_owned()));
        };
        let mut container = old.container.clone();
        container.resources = *resources;
        container.cpus = Some(self.cpus_of(&old.grant));
        let mut updates = Updates::new();
        let Some(old) = self.uncommit(container_id, &mut updates) else {
            return Err(PolicyError::UnknownContainer(container_id.to_owned()));
        };
        match self.plan_again(&container) {
            Ok(mut placed) => {
                // An update has no answer but updates; where it landed shows in the inventory.
                placed.warnings.clear();
                self.commit(container_id, placed, &mut updates);
                let own = updates
                    .remove(container_id)
                    .or_else(|| self.update_of(container_id));
                let mut out = into_vec(updates);
                out.extend(own);
                Ok(out)
            }
            Err(e) => {
                // Put the old placement back exactly: what it held was just freed.
                let mut undo = Updates::new();
                self.commit(container_id, old, &mut undo);
                Err(e)
            }
        }
    }

    fn release(&mut self, container_id: &str) -> Result<Vec<ContainerUpdate>, PolicyError> {
        let mut updates = Updates::new();
        self.uncommit(container_id, &mut updates);
        Ok(into_vec(updates))
    }

    fn devices(&self) -> Result<Vec<Device>, PolicyError> {
        Ok(self.table.devices())
    }

    fn device_cpus(&self) -> BTreeMap<String, CpuSet> {
        self.table
            .iter()
            .map(|d| (d.device.name.clone(), d.cpus.clone()))
            .collect()
    }

    fn allocate_claim(&mut self, claim: &Claim) -> Result<ClaimAllocation, PolicyError> {
        if let Some(held) = self.claims.get(&claim.uid) {
            // Same UID, same results, same CPUs. Other results under a UID we hold mean the
            // claim was deallocated and allocated again before its unprepare reached us: the
            // old CPUs may still be in use, so the new results wait for the unprepare.
            if let Some(difference) = held.difference(claim, |r| self.cpus_for(r)) {
                return Err(PolicyError::Invalid {
                    subject: format!("claim {}", held.describe()),
                    reason: format!(
                        "it is prepared with other allocation results: {difference}; it keeps \
                         what it holds until it is unprepared, and a prepare after that gets the \
                         new results"
                    ),
                });
            }
        }
        if let Some(held) = self.claims.get_mut(&claim.uid) {
            // Later prepares may name more pods sharing the claim; an adopted claim learns
            // what its spec did not say.
            held.learn(claim);
            return self
                .claim_edits(&claim.uid)
                .ok_or_else(|| PolicyError::Invalid {
                    subject: format!("claim {}", claim.uid),
                    reason: "vanished while being read".into(),
                });
        }
        let (record, mut warnings) = self.plan_claim(claim)?;
        let cpus = record.cpus();
        let edits = record.edits();
        let before = self.pool_fallbacks();
        self.taken = self.taken.union(&cpus);
        self.account_claim(&record, true);
        self.claims.insert(claim.uid.clone(), record);
        self.generations.durable += 1;
        let mut updates = Updates::new();
        self.ripple(&cpus, &mut updates);
        warnings
            .extend(self.fallback_warnings(&before, &format!("claim {}", describe_claim(claim))));
        Ok(ClaimAllocation {
            edits,
            updates: into_vec(updates),
            warnings,
        })
    }

    fn adopt_claim(&mut self, uid: &str, edits: &[cdi::ContainerEdits]) -> Result<(), PolicyError> {
        if self.claims.contains_key(uid) {
            return Ok(());
        }
        let refuse = |reason: String| PolicyError::restore(format!("claim {uid}: {reason}"));
        let granted = claims::granted(uid, edits).map_err(refuse)?;
        let memory = claims::granted_memory(uid, edits).map_err(refuse)?;
        // Results whose edits say the same are one request's: two requests never share a CPU.
        // Each request's memory and hugepages are held by its first result.
        let mut requests: Vec<(CpuSet, Option<NodeSet>, Vec<usize>)> = Vec::new();
        for (i, (cpus, mems)) in granted.into_iter().enumerate() {
            match requests
                .iter_mut()
                .find(|(c, m, _)| *c == cpus && *m == mems)
            {
                Some((_, _, results)) => results.push(i),
                None => requests.push((cpus, mems, vec![i])),
            }
        }
        // Like a restore, it holds CPUs that a claim could ever hold, held by no other claim,
        // whatever devices are published now.
        let grantable = self
            .topo
            .online
            .difference(&self.reserved)
            .difference(&self.topo.isolated);
        let mut taken = self.taken.clone();
        let mut results = vec![None; edits.len()];
        // The node of the claim's CPUs: an unpinned memory device's result does not say its own.
        let cpu_node = self
            .nodes_of(
                &requests
                    .iter()
                    .fold(CpuSet::new(), |acc, (c, _, _)| acc.union(c)),
            )
            .first();
        for (k, (cpus, mems, indexes)) in requests.into_iter().enumerate() {
            if cpus.is_empty() {
                // Memory devices' results (individual model): their memory on their node.
                let node = mems.as_ref().and_then(NodeSet::first).or(cpu_node);
                let device = node
                    .map(|n| format!("memory{n}"))
                    .filter(|name| self.table.get(name).is_some_and(|d| d.is_memory()))
                    .unwrap_or_default();
                for (j, i) in indexes.iter().enumerate() {
                    let (bytes, hugepages) = if j == 0 {
                        memory.get(*i).cloned().unwrap_or_default()
                    } else {
                        Default::default()
                    };
                    let holds = bytes > 0 || !hugepages.is_empty();
                    results[*i] = Some(claims::ResultRecord {
                        request: format!("adopted-{k}"),
                        device: device.clone(),
                        memory_pinning: mems.is_some(),
                        memory_node: node.filter(|_| holds),
                        memory: bytes,
                        hugepages,
                        mems: node.into_iter().collect(),
                        cpus: CpuSet::new(),
                    });
                }
                continue;
            }
            if !grantable.is_superset(&cpus) {
                return Err(refuse(format!(
                    "cpus {} are not online or are reserved or kernel-isolated here",
                    cpus.difference(&grantable)
                )));
            }
            if taken.intersects(&cpus) {
                return Err(refuse(format!(
                    "cpus {} are held already",
                    taken.intersection(&cpus)
                )));
            }
            taken = taken.union(&cpus);
            for (i, (device, part)) in indexes.iter().zip(self.split_adopted(&cpus, indexes.len()))
            {
                // Its own nodes out of the request's, when it pins memory: its DRAM node and
                // the memory-only nodes attached to it (a claim's `memoryKinds`).
                let local = self.nodes_of(&part);
                let local_node = local.first();
                let near = self.zone(&local, &MemoryKind::ALL);
                let nodes = match &mems {
                    Some(all) if all.intersects(&near) => all.intersection(&near),
                    Some(all) => all.clone(),
                    None => local,
                };
                let (bytes, hugepages) = if Some(i) == indexes.first() {
                    memory.get(*i).cloned().unwrap_or_default()
                } else {
                    Default::default()
                };
                let holds = bytes > 0 || !hugepages.is_empty();
                results[*i] = Some(claims::ResultRecord {
                    request: format!("adopted-{k}"),
                    device,
                    memory_pinning: mems.is_some(),
                    memory_node: local_node.filter(|_| holds),
                    memory: bytes,
                    hugepages,
                    mems: nodes,
                    cpus: part,
                });
            }
        }
        let changed = taken.difference(&self.taken);
        self.taken = taken;
        let record = HeldClaim {
            uid: uid.to_owned(),
            namespace: String::new(),
            name: String::new(),
            reserved_for: Vec::new(),
            results: results.into_iter().flatten().collect(),
            adopted: true,
        };
        self.account_claim(&record, true);
        self.claims.insert(uid.to_owned(), record);
        self.generations.durable += 1;
        // Before Synchronize nobody runs here to update; the ripple keeps the pools right.
        self.ripple(&changed, &mut Updates::new());
        Ok(())
    }

    fn release_claim(&mut self, uid: &str) -> Result<Vec<ContainerUpdate>, PolicyError> {
        let Some(record) = self.claims.remove(uid) else {
            return Ok(Vec::new());
        };
        self.generations.durable += 1;
        let cpus = record.cpus();
        self.taken = self.taken.difference(&cpus);
        self.account_claim(&record, false);
        if record
            .results
            .iter()
            .any(|r| self.table.get(&r.device).is_none())
        {
            self.refresh_devices();
        }
        let mut updates = Updates::new();
        self.ripple(&cpus, &mut updates);
        Ok(into_vec(updates))
    }

    fn claims(&self) -> Vec<String> {
        self.claims.keys().cloned().collect()
    }

    fn claim_cpus(&self, uid: &str) -> Option<CpuSet> {
        TopologyAware::claim_cpus(self, uid)
    }

    fn inventory(&self) -> crate::inventory::Inventory {
        inventory::of(self)
    }

    fn generations(&self) -> crate::Generations {
        crate::Generations {
            durable: Some(self.generations.durable),
            devices: Some(self.generations.devices),
        }
    }
}

/// `namespace/name (uid)` of a claim, for messages.
fn describe_claim(claim: &Claim) -> String {
    format!("{}/{} ({})", claim.namespace, claim.name, claim.uid)
}
