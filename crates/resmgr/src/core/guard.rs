//! The manager lock, held: [`Guard`], what [`super::Core::with_lock`] hands its closure. It
//! derefs to the protected data ([`Locked`]), ends a mutation as a [`Change`] to commit once
//! the lock is let go, records the updates a mutation made as pending, and, dropped after a
//! mutable use, publishes what changed before the lock is released.
//!
//! Nothing outside the core touches the policy but through a guard, and dropping a guard that
//! was used mutably publishes what changed: the snapshot is refreshed under the lock wherever
//! state changes, by construction, not by remembering to.

// Blocking IO under the manager lock does not pass clippy (crates/resmgr/clippy.toml).
#![deny(clippy::disallowed_methods)]

use std::sync::Arc;

use policy::ContainerUpdate;
use stdx::scoped::Held;
use tokio::sync::watch;

use super::{Change, Inner, Locked, Published, PublishedAt, commit::Io};
use crate::pending::Ticket;

/// The manager lock, held (see the module doc). Reading through it changes nothing; the first
/// mutable access marks it, and dropping a marked guard publishes what changed before the lock
/// is released.
#[derive(Debug)]
pub(crate) struct Guard<'a> {
    inner: Held<'a, Inner>,
    published: &'a watch::Sender<Arc<Published>>,
    io: &'a Io,
    changed: bool,
}

impl<'a> Guard<'a> {
    /// The guard of the held lock, publishing to `published`, waking `io`'s retries.
    pub(super) fn new(
        inner: Held<'a, Inner>,
        published: &'a watch::Sender<Arc<Published>>,
        io: &'a Io,
    ) -> Self {
        Self {
            inner,
            published,
            io,
            changed: false,
        }
    }

    /// Ends this use of the lock: what the calls since the last change made durable (nothing, if
    /// they changed nothing durable), and the updates to wait for. An event that changed nothing
    /// durable does not wait for anyone else's save.
    pub(crate) fn change(mut self, ticket: Ticket) -> Change {
        // Not what an earlier failed save left unsaved: an event must never wait for, or fail
        // by, a disk that another change found broken (the background retry saves it).
        self.changed = true;
        Change::new(self.inner.note_changes(), ticket)
    }

    /// Ends this use of the lock with everything changed so far, whoever changed it: what a
    /// claim's commit persists, so that it also finishes what an earlier failed save left
    /// unsaved.
    pub(crate) fn change_all(mut self, ticket: Ticket) -> Change {
        self.changed = true;
        Change::new(Some(self.inner.current_version()), ticket)
    }

    /// Records updates as pending and wakes the background retry; returns their versions.
    pub(crate) fn record_pending(&mut self, updates: Vec<ContainerUpdate>) -> Ticket {
        if updates.is_empty() {
            return Ticket::default();
        }
        let ticket = self.pending.record(updates);
        self.io.pending_changed();
        ticket
    }

    /// Takes note that the runtime started a container (its PostStartContainer): what is
    /// pending for it goes out from the background retry, since the runtime's own event is still
    /// waiting for our answer, and deliveries waiting for it go on.
    pub(crate) fn note_started(&mut self, container_id: &str) {
        if self.pending.started(container_id) {
            self.io.pending_changed();
        }
        self.io.started();
    }
}

impl std::ops::Deref for Guard<'_> {
    type Target = Locked;
    fn deref(&self) -> &Locked {
        &self.inner.locked
    }
}

impl std::ops::DerefMut for Guard<'_> {
    fn deref_mut(&mut self) -> &mut Locked {
        self.changed = true;
        &mut self.inner.locked
    }
}

impl Drop for Guard<'_> {
    /// Publishes the parts that changed, told by counters ([`policy::Policy::generations`],
    /// [`crate::state::Records::generation`]) as kube-runtime's reflector applies a delta: an
    /// event that changed no device and no record (every container event but an exclusive
    /// grant's, with the topology-aware policy) copies nothing and wakes no reader. A policy
    /// that keeps no device counter has its devices read again and compared.
    ///
    /// A guard dropped by a panic publishes nothing: the change it was used for stopped
    /// part-way, and readers (the slice publisher among them) must not see half of it. The agent
    /// never gets here (a panic aborts it before anything unwinds: plugin-bin's `panics`); a
    /// program that unwinds keeps the last whole snapshot.
    fn drop(&mut self) {
        if !self.changed || std::thread::panicking() {
            return;
        }
        let Inner { locked, books } = &mut *self.inner;
        let now = PublishedAt {
            devices: locked.policy.generations().devices,
            records: locked.records.generation(),
        };
        let devices_moved = now.devices.is_none() || now.devices != books.published_at.devices;
        let records_moved = now.records != books.published_at.records;
        if !devices_moved && !records_moved {
            return;
        }
        books.published_at = now;
        let policy = locked.policy.as_ref();
        let records = &locked.records;
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
