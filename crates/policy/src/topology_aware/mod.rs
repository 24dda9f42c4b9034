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
//!
//! # Where the code is
//!
//! This file holds the types, [`TopologyAware::new`] and the [`Policy`] implementation, which
//! hands each call to the file that owns it: `queries.rs` (the read side: pools, placements,
//! claims' CPUs, the memory account), `place.rs` (planning a container), `plan_claim.rs`
//! (planning a claim), `apply.rs` (committing a plan, and the ripple), `fallbacks.rs` (where
//! shared containers run when their pool has no shared CPUs left), `sync.rs` (rebuilding from
//! the runtime's containers), `restore.rs` (claims taken back after a restart) and
//! `inventory.rs` (the inventory), besides the public modules named above and [`annotations`].

pub mod annotations;
mod apply;
pub mod claim_config;
pub mod claims;
pub mod cpus;
pub mod devices;
mod fallbacks;
mod inventory;
pub mod memory;
pub mod metadata;
mod place;
mod plan_claim;
pub mod pools;
mod queries;
mod restore;
mod sync;

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
    model::{Allocation, Claim, ClaimAllocation, Container, ContainerUpdate, Device, Resources},
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
        self.restore_snapshot(snapshot)
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
        self.allocate_container(container)
    }

    fn adopt_container(
        &mut self,
        container: &Container,
    ) -> Result<Vec<ContainerUpdate>, PolicyError> {
        Ok(self.adopt_running(container))
    }

    fn update(
        &mut self,
        container_id: &str,
        resources: &Resources,
    ) -> Result<Vec<ContainerUpdate>, PolicyError> {
        self.update_container(container_id, resources)
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
        self.hold_claim(claim)
    }

    fn adopt_claim(&mut self, uid: &str, edits: &[cdi::ContainerEdits]) -> Result<(), PolicyError> {
        self.adopt(uid, edits)
    }

    fn release_claim(&mut self, uid: &str) -> Result<Vec<ContainerUpdate>, PolicyError> {
        self.drop_claim(uid)
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
