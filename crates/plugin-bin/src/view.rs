//! A read-only window onto the policy while the resource manager owns it, and the form the
//! binary prints a policy's [`policy::Inventory`] in.
//!
//! The manager takes the policy as a `Box<dyn Policy>` and calls it under its lock; the metrics,
//! `/debug/state`, the simulator's report and its drawing want to read the policy's
//! [`Policy::inventory`] too, without going through (and waiting on) that lock. So the binary
//! hands the manager a [`SharedPolicy`] that forwards every call to the policy behind a mutex,
//! and keeps a [`PolicyView`] of the same mutex for reading. Readers take only that inner mutex,
//! never the manager's lock, and only for as long as the policy takes to copy out its inventory,
//! so they cannot stall an NRI event. Nothing here knows which policy it is.

use std::sync::{Arc, Mutex};

pub use policy::GrantKind;
use policy::{
    Allocation, Claim, ClaimAllocation, Container, ContainerUpdate, Device, Policy, PolicyError,
    Resources,
};
use resmgr::sync::lock;
use serde::Serialize;

/// The policy as the manager holds it: every call goes to the shared policy.
#[derive(Debug)]
pub struct SharedPolicy {
    name: String,
    inner: Arc<Mutex<Box<dyn Policy>>>,
}

/// The reading side.
#[derive(Debug, Clone)]
pub struct PolicyView {
    inner: Arc<Mutex<Box<dyn Policy>>>,
}

/// Wraps `policy`: the first half goes to the manager, the second to readers.
pub fn share(policy: Box<dyn Policy>) -> (SharedPolicy, PolicyView) {
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
    fn adopt_claim(
        &mut self,
        uid: &str,
        edits: &[policy::cdi::ContainerEdits],
    ) -> Result<(), PolicyError> {
        lock(&self.inner).adopt_claim(uid, edits)
    }
    fn release_claim(&mut self, uid: &str) -> Result<Vec<ContainerUpdate>, PolicyError> {
        lock(&self.inner).release_claim(uid)
    }
    fn claims(&self) -> Vec<String> {
        lock(&self.inner).claims()
    }
    fn claim_cpus(&self, uid: &str) -> Option<policy::CpuSet> {
        lock(&self.inner).claim_cpus(uid)
    }
    fn inventory(&self) -> policy::Inventory {
        lock(&self.inner).inventory()
    }
    fn device_cpus(&self) -> std::collections::BTreeMap<String, policy::CpuSet> {
        lock(&self.inner).device_cpus()
    }
}

/// One container's placement, as printed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ContainerRow {
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
    /// What the policy did instead of refusing it, if anything.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub fallbacks: Vec<policy::Fallback>,
}

/// One claim's grant, as printed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ClaimRow {
    pub uid: String,
    /// `namespace/name`.
    pub name: String,
    /// The devices, in result order.
    pub devices: Vec<String>,
    pub cpus: String,
    pub mems: String,
}

/// CPUs of one pool by what they are used for, counted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PoolCounts {
    pub name: String,
    pub kind: String,
    pub cpus: String,
    pub reserved: usize,
    pub shared: usize,
    pub exclusive: usize,
    pub claimed: usize,
}

/// Everything placed, copied out of the policy at one instant, in the form the binary prints
/// (`/debug/state`'s `allocation`, the simulator's report): sets as cpu lists, pools as counts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Inventory {
    pub reserved: String,
    /// CPUs not reserved, isolated, or taken.
    pub shared: String,
    pub pools: Vec<PoolCounts>,
    /// By container ID.
    pub containers: Vec<ContainerRow>,
    /// By claim UID.
    pub claims: Vec<ClaimRow>,
    /// The policy's report as it came, with its sets (for drawing).
    #[serde(skip)]
    pub source: policy::Inventory,
}

impl From<policy::Inventory> for Inventory {
    fn from(inv: policy::Inventory) -> Self {
        let pools = inv
            .pools
            .iter()
            .map(|p| PoolCounts {
                name: p.name.clone(),
                kind: p.kind.clone(),
                cpus: p.cpus.to_string(),
                reserved: p.reserved.len(),
                shared: p.shared.len(),
                exclusive: p.exclusive.len(),
                claimed: p.claimed.len(),
            })
            .collect();
        let containers = inv
            .containers
            .iter()
            .map(|c| ContainerRow {
                id: c.id.clone(),
                name: String::new(),
                grant: c.grant,
                pool: c.pool.clone(),
                cpus: c.cpus.to_string(),
                mems: c.mems.as_ref().map(ToString::to_string),
                fallbacks: c.fallbacks.clone(),
            })
            .collect();
        let claims = inv
            .claims
            .iter()
            .map(|c| ClaimRow {
                name: format!("{}/{}", c.namespace, c.name),
                uid: c.uid.clone(),
                devices: c.devices.clone(),
                cpus: c.cpus.to_string(),
                mems: c.mems.to_string(),
            })
            .collect();
        Self {
            reserved: inv.reserved.to_string(),
            shared: inv.shared.to_string(),
            pools,
            containers,
            claims,
            source: inv,
        }
    }
}

/// The devices `policy` would publish, for showing them: none for a policy that serves no DRA
/// claims (its pools and containers still show).
pub fn devices_to_show(policy: &dyn Policy) -> Result<Vec<Device>, PolicyError> {
    match policy.devices() {
        Err(PolicyError::NoDraClaims) => Ok(Vec::new()),
        other => other,
    }
}

impl PolicyView {
    /// The devices the policy publishes.
    pub fn devices(&self) -> Result<Vec<Device>, PolicyError> {
        lock(&self.inner).devices()
    }

    /// [`devices_to_show`] of the policy.
    pub fn devices_to_show(&self) -> Result<Vec<Device>, PolicyError> {
        devices_to_show(&**lock(&self.inner))
    }

    /// The CPUs behind each published device, by name.
    pub fn device_cpus(&self) -> std::collections::BTreeMap<String, policy::CpuSet> {
        lock(&self.inner).device_cpus()
    }

    /// Copies out what is placed where.
    pub fn inventory(&self) -> Inventory {
        let inventory = lock(&self.inner).inventory();
        Inventory::from(inventory)
    }
}
