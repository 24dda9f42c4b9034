//! A read-only window onto the topology-aware policy while the resource manager owns it.
//!
//! The manager takes the policy as a `Box<dyn Policy>` and calls it under its lock; the trait
//! has no way to ask *how* things are placed (which pool, exclusive or shared), which the
//! metrics, `/debug/state`, the simulator's report and its drawing need. The binary knows the
//! concrete policy it built, so it hands the manager a [`SharedPolicy`] that forwards every call
//! to a `TopologyAware` behind a mutex, and keeps a [`PolicyView`] of the same mutex for reading.
//! Readers take only that inner mutex, never the manager's lock, and only for as long as it takes
//! to copy out an [`Inventory`], so they cannot stall an NRI event.

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex, MutexGuard, PoisonError},
};

use policy::{
    Allocation, Claim, ClaimAllocation, Container, ContainerUpdate, CpuSet, Device, NodeSet,
    Policy, PolicyError, Resources, TopologyAware,
    topology_aware::{Grant, claims::Snapshot, pools::PoolKind},
};
use serde::Serialize;

/// The policy as the manager holds it: every call goes to the shared `TopologyAware`.
#[derive(Debug)]
pub struct SharedPolicy {
    name: String,
    inner: Arc<Mutex<TopologyAware>>,
}

/// The reading side.
#[derive(Debug, Clone)]
pub struct PolicyView {
    inner: Arc<Mutex<TopologyAware>>,
}

/// Wraps `policy`: the first half goes to the manager, the second to readers.
pub fn share(policy: TopologyAware) -> (SharedPolicy, PolicyView) {
    let name = policy.name().to_owned();
    let inner = Arc::new(Mutex::new(policy));
    (
        SharedPolicy {
            name,
            inner: inner.clone(),
        },
        PolicyView { inner },
    )
}

fn lock(m: &Mutex<TopologyAware>) -> MutexGuard<'_, TopologyAware> {
    // A panic inside a policy call poisons the mutex; the policy's own rule is that a failed
    // call leaves it as it was, so its state is still the best we have.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Policy for SharedPolicy {
    fn name(&self) -> &str {
        &self.name
    }
    fn restore(&mut self, snapshot: &serde_json::Value) -> Result<(), PolicyError> {
        lock(&self.inner).restore(snapshot)
    }
    fn snapshot(&self) -> serde_json::Value {
        lock(&self.inner).snapshot()
    }
    fn sync(&mut self, containers: &[Container]) -> Result<Vec<ContainerUpdate>, PolicyError> {
        lock(&self.inner).sync(containers)
    }
    fn allocate(&mut self, container: &Container) -> Result<Allocation, PolicyError> {
        lock(&self.inner).allocate(container)
    }
    fn update(&mut self, id: &str, r: &Resources) -> Result<Vec<ContainerUpdate>, PolicyError> {
        lock(&self.inner).update(id, r)
    }
    fn release(&mut self, id: &str) -> Result<Vec<ContainerUpdate>, PolicyError> {
        lock(&self.inner).release(id)
    }
    fn devices(&self) -> Result<Vec<Device>, PolicyError> {
        lock(&self.inner).devices()
    }
    fn allocate_claim(&mut self, claim: &Claim) -> Result<ClaimAllocation, PolicyError> {
        lock(&self.inner).allocate_claim(claim)
    }
    fn release_claim(&mut self, uid: &str) -> Result<Vec<ContainerUpdate>, PolicyError> {
        lock(&self.inner).release_claim(uid)
    }
    fn claims(&self) -> Vec<String> {
        lock(&self.inner).claims()
    }
}

/// How a container is placed, in words.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum GrantKind {
    /// On the reserved CPUs.
    Reserved,
    /// On a pool's shared CPUs.
    Shared,
    /// On CPUs of its own.
    Exclusive,
    /// On kernel-isolated CPUs of its own.
    Isolated,
    /// On the CPUs of the claims it uses.
    Claim,
}

impl GrantKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Reserved => "reserved",
            Self::Shared => "shared",
            Self::Exclusive => "exclusive",
            Self::Isolated => "isolated",
            Self::Claim => "claim",
        }
    }
}

/// One container's placement.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ContainerPlacement {
    pub id: String,
    /// `namespace/pod/container`, when the reader knows it.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub name: String,
    pub grant: GrantKind,
    /// The pool, for pool grants.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pool: Option<String>,
    pub cpus: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mems: Option<String>,
}

/// One claim's grant.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ClaimPlacement {
    pub uid: String,
    /// `namespace/name`.
    pub name: String,
    /// The devices, in result order.
    pub devices: Vec<String>,
    pub cpus: String,
    pub mems: String,
}

/// CPUs of one pool by what they are used for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PoolUse {
    pub name: String,
    pub kind: &'static str,
    pub cpus: String,
    pub reserved: usize,
    pub shared: usize,
    pub exclusive: usize,
    pub claimed: usize,
}

/// Everything placed, copied out of the policy at one instant.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Inventory {
    pub reserved: String,
    /// The root pool's shared CPUs: every CPU not reserved, isolated, or taken.
    pub shared: String,
    pub pools: Vec<PoolUse>,
    /// By container ID.
    pub containers: Vec<ContainerPlacement>,
    /// By claim UID.
    pub claims: Vec<ClaimPlacement>,
    /// CPUs taken by exclusive containers, by container ID (for drawing).
    #[serde(skip)]
    pub exclusive_cpus: BTreeMap<String, CpuSet>,
    /// CPUs of each claim, by UID (for drawing).
    #[serde(skip)]
    pub claim_cpus: BTreeMap<String, CpuSet>,
    #[serde(skip)]
    pub reserved_set: CpuSet,
    #[serde(skip)]
    pub shared_set: CpuSet,
}

impl PolicyView {
    /// The devices the policy publishes.
    pub fn devices(&self) -> Result<Vec<Device>, PolicyError> {
        lock(&self.inner).devices()
    }

    /// Copies out what is placed where.
    pub fn inventory(&self) -> Inventory {
        let p = lock(&self.inner);
        inventory(&p)
    }
}

/// What `policy` has placed where.
pub fn inventory(p: &TopologyAware) -> Inventory {
    let reserved = p.reserved_cpus().clone();
    let shared = p.shared_cpus();
    let snapshot: Snapshot = serde_json::from_value(p.snapshot()).unwrap_or_default();
    let mut claim_cpus = BTreeMap::new();
    let claims = snapshot
        .claims
        .iter()
        .map(|c| {
            let cpus = c.cpus();
            let mems = c
                .results
                .iter()
                .fold(NodeSet::new(), |acc, r| acc.union(&r.mems));
            claim_cpus.insert(c.uid.clone(), cpus.clone());
            ClaimPlacement {
                uid: c.uid.clone(),
                name: format!("{}/{}", c.namespace, c.name),
                devices: c.results.iter().map(|r| r.device.clone()).collect(),
                cpus: cpus.to_string(),
                mems: mems.to_string(),
            }
        })
        .collect();
    let mut exclusive_cpus = BTreeMap::new();
    let mut containers = Vec::new();
    for id in p.container_ids() {
        let Some(placement) = p.placement(&id) else {
            continue;
        };
        let grant = match &placement.grant {
            Grant::Reserved => GrantKind::Reserved,
            Grant::Shared { .. } => GrantKind::Shared,
            Grant::Exclusive { .. } => GrantKind::Exclusive,
            Grant::Isolated { .. } => GrantKind::Isolated,
            Grant::Claim { .. } => GrantKind::Claim,
        };
        if matches!(grant, GrantKind::Exclusive | GrantKind::Isolated) {
            exclusive_cpus.insert(id.clone(), placement.cpus.clone());
        }
        containers.push(ContainerPlacement {
            name: String::new(),
            id,
            grant,
            pool: placement.pool,
            cpus: placement.cpus.to_string(),
            mems: placement.mems.map(|m| m.to_string()),
        });
    }
    let exclusive_all = exclusive_cpus
        .values()
        .fold(CpuSet::new(), |acc, c| acc.union(c));
    let claimed_all = claim_cpus
        .values()
        .fold(CpuSet::new(), |acc: CpuSet, c| acc.union(c));
    let pools = p
        .pools()
        .iter()
        .map(|pool| PoolUse {
            name: pool.name.clone(),
            kind: match pool.kind {
                PoolKind::Root => "root",
                PoolKind::Socket => "socket",
                PoolKind::Die => "die",
                PoolKind::Numa => "numa",
                PoolKind::L3 => "l3",
            },
            cpus: pool.cpus.to_string(),
            reserved: pool.cpus.intersection(&reserved).len(),
            shared: pool.cpus.intersection(&shared).len(),
            exclusive: pool.cpus.intersection(&exclusive_all).len(),
            claimed: pool.cpus.intersection(&claimed_all).len(),
        })
        .collect();
    Inventory {
        reserved: reserved.to_string(),
        shared: shared.to_string(),
        pools,
        containers,
        claims,
        exclusive_cpus,
        claim_cpus,
        reserved_set: reserved,
        shared_set: shared,
    }
}
