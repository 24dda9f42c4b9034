//! What the manager publishes for readers: the policy's inventory and devices and the claim
//! records, as of the last change, in a `tokio::sync::watch` (one writer, cheap readers, as
//! kube-runtime's reflector store).
//!
//! Metrics, `/debug/state`, the simulator's report and the ResourceSlice republisher need to read
//! what the policy decided without taking the manager lock (a reader must never delay an NRI
//! answer) and without a second handle on the policy. So nothing outside the manager touches the
//! policy: every mutable use of the manager's state goes through [`Guard`], and dropping a guard
//! that was used mutably publishes a fresh [`Published`]. The snapshot is therefore refreshed
//! under the lock wherever state changes, by construction, not by remembering to.

use std::{collections::BTreeMap, sync::Arc};

use policy::{CpuSet, Device, Inventory, Policy, PolicyError};
use tokio::sync::{MutexGuard, watch};

use crate::{manager::Inner, state::PreparedClaim};

/// What readers see, as of the last change.
#[derive(Debug, Clone, PartialEq)]
pub struct Published {
    /// What the policy has placed where ([`Policy::inventory`]).
    pub inventory: Inventory,
    /// What the policy publishes ([`Policy::devices`]); `Err(PolicyError::NoDraClaims)` for a
    /// policy that serves no claims.
    pub devices: Result<Vec<Device>, PolicyError>,
    /// The CPUs behind each published device, by name ([`Policy::device_cpus`]): what a
    /// device's health depends on.
    pub device_cpus: BTreeMap<String, CpuSet>,
    /// Every prepared (or adopted) claim's record, by UID.
    pub claims: BTreeMap<String, PreparedClaim>,
}

impl Published {
    /// The snapshot of a policy and its records.
    pub(crate) fn of(policy: &dyn Policy, claims: &BTreeMap<String, PreparedClaim>) -> Self {
        Self {
            inventory: policy.inventory(),
            devices: policy.devices(),
            device_cpus: policy.device_cpus(),
            claims: claims.clone(),
        }
    }

    /// The devices to show: none for a policy that serves no DRA claims.
    pub fn devices_to_show(&self) -> Result<Vec<Device>, PolicyError> {
        match &self.devices {
            Err(PolicyError::NoDraClaims) => Ok(Vec::new()),
            other => other.clone(),
        }
    }
}

/// The manager lock, held. Reading through it changes nothing; the first mutable access marks
/// it, and dropping a marked guard publishes a fresh snapshot before the lock is released.
pub(crate) struct Guard<'a> {
    pub(crate) inner: MutexGuard<'a, Inner>,
    pub(crate) published: &'a watch::Sender<Arc<Published>>,
    pub(crate) changed: bool,
}

impl std::ops::Deref for Guard<'_> {
    type Target = Inner;
    fn deref(&self) -> &Inner {
        &self.inner
    }
}

impl std::ops::DerefMut for Guard<'_> {
    fn deref_mut(&mut self) -> &mut Inner {
        self.changed = true;
        &mut self.inner
    }
}

impl Drop for Guard<'_> {
    fn drop(&mut self) {
        if !self.changed {
            return;
        }
        let now = Published::of(self.inner.policy.as_ref(), &self.inner.records);
        // Readers wake only when something they can see changed.
        self.published.send_if_modified(|old| {
            if **old == now {
                return false;
            }
            *old = Arc::new(now);
            true
        });
    }
}
