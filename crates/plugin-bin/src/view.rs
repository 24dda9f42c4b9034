//! The form the binary prints a policy's [`policy::Inventory`] in: `/debug/state`'s
//! `allocation`, the simulator's report and drawing, `resmgr topology`.
//!
//! The binary never holds the policy: the resource manager owns it, and publishes what readers
//! need after every change ([`resmgr::Published`], read with [`resmgr::Manager::snapshot`]).
//! This module only turns that into rows. Nothing here knows which policy it is.

use policy::{Device, GrantKind, Policy, PolicyError};
use serde::Serialize;

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
pub struct InventoryRows {
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

impl From<policy::Inventory> for InventoryRows {
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

/// What the manager publishes, as a reader holds it ([`resmgr::Manager::published`]).
pub type Snapshots = tokio::sync::watch::Receiver<std::sync::Arc<resmgr::Published>>;

/// What the manager has placed where, now, in printed form ([`resmgr::Manager::inventory`]).
pub async fn inventory(manager: &resmgr::Manager) -> InventoryRows {
    InventoryRows::from(manager.inventory().await)
}
