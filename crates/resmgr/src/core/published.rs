//! What the core publishes for readers: the policy's devices and the claim records, as of the
//! last change, in a `tokio::sync::watch` (one writer, cheap readers, as kube-runtime's
//! reflector store). The policy's inventory, which grows with what runs on the node, is not
//! published at every change: a reader asks for it ([`crate::Manager::inventory`]).
//!
//! Metrics, `/debug/state`, the simulator's report and the ResourceSlice republisher need to read
//! what the policy decided without taking the manager lock (a reader must never delay an NRI
//! answer) and without a second handle on the policy. So nothing outside the core touches the
//! policy: every mutable use of the protected state goes through the lock's guard
//! ([`super::Guard`]), and dropping a guard that was used mutably publishes what changed.

// Blocking IO under the manager lock does not pass clippy (crates/resmgr/clippy.toml).
#![deny(clippy::disallowed_methods)]

use std::{collections::BTreeMap, sync::Arc};

use policy::{CpuSet, Device, Policy, PolicyError};

use crate::state::PreparedClaim;

/// What readers see, as of the last change. Each part is shared: a change replaces only the
/// parts it changed.
#[derive(Debug, Clone, PartialEq)]
pub struct Published {
    /// What the policy publishes ([`Policy::devices`]); `Err(PolicyError::NoDraClaims)` for a
    /// policy that serves no claims.
    pub devices: Arc<Result<Vec<Device>, PolicyError>>,
    /// The CPUs behind each published device, by name ([`Policy::device_cpus`]): what a
    /// device's health depends on.
    pub device_cpus: Arc<BTreeMap<String, CpuSet>>,
    /// Every prepared (or adopted) claim's record, by UID.
    pub claims: Arc<BTreeMap<String, PreparedClaim>>,
}

impl Published {
    /// The snapshot of a policy and its records.
    pub(crate) fn of(policy: &dyn Policy, claims: &BTreeMap<String, PreparedClaim>) -> Self {
        Self {
            devices: Arc::new(policy.devices()),
            device_cpus: Arc::new(policy.device_cpus()),
            claims: Arc::new(claims.clone()),
        }
    }

    /// The devices to show: none for a policy that serves no DRA claims.
    pub fn devices_to_show(&self) -> Result<Vec<Device>, PolicyError> {
        match &*self.devices {
            Err(PolicyError::NoDraClaims) => Ok(Vec::new()),
            other => other.clone(),
        }
    }
}
