//! What the manager publishes for readers: the policy's devices and the claim records, as of the
//! last change, in a `tokio::sync::watch` (one writer, cheap readers, as kube-runtime's
//! reflector store). The policy's inventory, which grows with what runs on the node, is not
//! published at every change: a reader asks for it ([`crate::Manager::inventory`]).
//!
//! Metrics, `/debug/state`, the simulator's report and the ResourceSlice republisher need to read
//! what the policy decided without taking the manager lock (a reader must never delay an NRI
//! answer) and without a second handle on the policy. So nothing outside the manager touches the
//! policy: every mutable use of the manager's state goes through [`Guard`], and dropping a guard
//! that was used mutably publishes what changed. The snapshot is therefore refreshed under the
//! lock wherever state changes, by construction, not by remembering to.

use std::{collections::BTreeMap, sync::Arc};

use policy::{CpuSet, Device, Policy, PolicyError};
use tokio::sync::{MutexGuard, watch};

use crate::{
    manager::{Inner, PublishedAt},
    state::PreparedClaim,
};

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

/// The manager lock, held: what [`crate::Manager::with_lock`] hands its closure, which alone
/// makes one. Reading through it changes nothing; the first mutable access marks it, and
/// dropping a marked guard publishes what changed before the lock is released.
///
/// Public only because [`crate::Manager::with_lock`] is (for its doc tests); nothing of it is
/// usable outside this crate.
#[doc(hidden)]
#[derive(Debug)]
pub struct Guard<'a> {
    inner: MutexGuard<'a, Inner>,
    published: &'a watch::Sender<Arc<Published>>,
    changed: bool,
}

impl<'a> Guard<'a> {
    /// The guard of the lock `inner` was taken from, publishing to `published`.
    pub(crate) fn new(
        inner: MutexGuard<'a, Inner>,
        published: &'a watch::Sender<Arc<Published>>,
    ) -> Self {
        Self {
            inner,
            published,
            changed: false,
        }
    }
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
    /// Publishes the parts that changed, told by counters ([`policy::Policy::generations`],
    /// [`crate::state::Records::generation`]) as kube-runtime's reflector applies a delta: an
    /// event that changed no device and no record (every container event but an exclusive
    /// grant's, with the topology-aware policy) copies nothing and wakes no reader. A policy
    /// that keeps no device counter has its devices read again and compared.
    fn drop(&mut self) {
        if !self.changed {
            return;
        }
        let inner = &mut *self.inner;
        let now = PublishedAt {
            devices: inner.policy.generations().devices,
            records: inner.records.generation(),
        };
        let devices_moved = now.devices.is_none() || now.devices != inner.published_at.devices;
        let records_moved = now.records != inner.published_at.records;
        if !devices_moved && !records_moved {
            return;
        }
        inner.published_at = now;
        let policy = inner.policy.as_ref();
        let records = &inner.records;
        // Readers wake only when something they can see changed.
        self.published.send_if_modified(|old| {
            let mut next = (**old).clone();
            if devices_moved {
                let devices = policy.devices();
                if *next.devices != devices {
                    next.devices = Arc::new(devices);
                    next.device_cpus = Arc::new(policy.device_cpus());
                }
            }
            if records_moved && *next.claims != **records {
                next.claims = Arc::new((**records).clone());
            }
            if next == **old {
                return false;
            }
            *old = Arc::new(next);
            true
        });
    }
}
