//! Commit: the one path from a change made under the manager lock to the disk and the runtime.
//!
//! # A change is a value
//!
//! Every mutation under the manager lock ends by turning the lock's guard into a [`Change`]
//! ([`Guard::change`], [`Guard::change_all`]): the version of the durable state that includes it
//! and the ticket of the container updates it must wait for. Turning the guard into a change lets
//! go of the lock, and a change is `#[must_use]`, so it is committed after the lock is released or
//! dropped on purpose. [`Core::commit`] then (1) makes the durable state up to its version
//! durable (atomically, with fsyncs), and (2) delivers its updates and waits for the runtime to
//! confirm them ([`crate::pending`]); what it could not deliver goes out from the background
//! retry ([`Core::run_retries`]).
//!
//! # The lock is never held across IO: it does not compile
//!
//! The disk ([`crate::disk::Disk`]) and the runtime ([`crate::Runtime`]) are fields of [`Io`],
//! private to this module: nothing else can reach them, and everything here that reaches them
//! (a save, a spec written, removed, looked for or set aside, an `UpdateContainers` call) is
//! an `async fn`, awaited by its caller; the disk's blocking work runs on the blocking pool
//! (`crate::disk`).
//!
//! The manager lock, for its part, is only ever held inside a plain closure:
//! [`Core::with_lock`] takes the lock, hands the closure the [`Guard`], and lets go when the
//! closure returns. Nothing can be awaited in a closure that is not async, and the guard cannot
//! leave it (its lifetime is the closure's own: returning it, or a future holding it, or
//! keeping it in a captured variable does not compile). So no code holds the lock across IO,
//! or while it waits for any other lock (the lock order, below); the lock is a
//! [`stdx::scoped::ScopedLock`], whose trybuild cases are the compile-fail tests that keep it
//! so. Here the lock is taken only for in-memory work: copying the newest state, beginning and
//! finishing a batch of updates. Why it matters is in [`crate::core`].
//!
//! A closure rather than a token that the guard borrows and the IO needs: the manager is shared
//! (`&self`) by every task, so there would be a token per task, and code holding one task's
//! guard could make another token and do IO with it; a rule that only holds by convention. The
//! closure needs none.
//!
//! # Lock order
//!
//! claim lock ([`crate::claims`]) → save lock or delivery lock → manager lock. The manager lock
//! is innermost and never held while another lock is awaited (it cannot be: see above); the save
//! lock and the delivery lock are never held together.

// Blocking IO under the manager lock does not pass clippy (crates/resmgr/clippy.toml).
#![deny(clippy::disallowed_methods)]

use std::{collections::BTreeSet, sync::Arc, time::Duration};

use cdi::{ContainerEdits, StoreError};
use policy::ContainerUpdate;
use stdx::errors::chain;
use tokio::sync::{Mutex, Notify};
use tracing::{debug, warn};

use super::{Core, Timing};
#[cfg(doc)]
use super::{Guard, Inner};
use crate::{
    disk::Disk,
    faults::{Faults, Point},
    pending::{Ticket, Versioned},
    runtime::{Runtime, RuntimeError},
    state::StateError,
};

/// How long a claim's commit waits for the runtime to confirm the moves it needs: to start a
/// container it moves (see [`crate::pending`]; the kubelet starts a container right after
/// creating it), or to answer updates it is slow to apply (a busy node: each `runc update` is a
/// process, and the runtime may be stopping containers meanwhile). A bound for a slow node, not
/// a delay anyone pays; well within the kubelet's deadline for the call.
pub const SETTLE_WAIT: Duration = Duration::from_secs(10);

/// What one mutation under the manager lock changed, to commit once the lock is released.
#[must_use = "a change is committed with Core::commit once the lock is released"]
#[derive(Debug, Default)]
pub(crate) struct Change {
    /// The version of the durable state that includes it; `None`: nothing durable changed.
    version: Option<u64>,
    /// The updates to deliver and wait for.
    ticket: Ticket,
    /// The points passed once it is saved and once it is delivered.
    points: Option<(Point, Point)>,
    /// It grants CPUs: its delivery waits for the containers it moves that the runtime has not
    /// started, up to [`SETTLE_WAIT`] (see [`crate::pending`]).
    grants: bool,
}

impl Change {
    /// A change of the durable state up to `version` (`None`: nothing durable changed) that
    /// waits for `ticket`'s updates.
    pub(super) fn new(version: Option<u64>, ticket: Ticket) -> Self {
        Self {
            version,
            ticket,
            points: None,
            grants: false,
        }
    }

    /// Passes `saved` once the change is on disk and `delivered` once its updates are.
    pub(crate) fn at(mut self, saved: Point, delivered: Point) -> Self {
        self.points = Some((saved, delivered));
        self
    }

    /// Marks it as granting CPUs: nothing may still run on them once it is committed.
    pub(crate) fn granting(mut self) -> Self {
        self.grants = true;
        self
    }
}

/// Why a commit did not complete.
#[derive(Debug, thiserror::Error)]
pub enum CommitError {
    /// The state could not be saved; the disk is where it was, and the next commit writes the
    /// newest state. The change's updates stay pending.
    #[error("saving the state")]
    Save(#[source] StateError),
    /// The state is saved, but the runtime did not confirm every update the change waits for.
    #[error("updating containers")]
    Deliver(#[source] DeliveryError),
}

/// Undelivered updates after a delivery.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{} container update(s) not delivered", containers.len())]
pub struct DeliveryError {
    /// The containers whose updates are still pending.
    pub containers: BTreeSet<String>,
    /// Why.
    #[source]
    pub cause: DeliveryCause,
}

/// Why updates were not delivered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeliveryCause {
    /// The runtime took the call and reported these containers' updates as failed.
    #[error("the runtime failed updates of {0:?}")]
    Failed(BTreeSet<String>),
    /// The call itself failed.
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    /// A delivery begun earlier still carries them.
    #[error("a delivery begun earlier has not settled them yet")]
    InFlight,
    /// The runtime has not started these containers, and may drop their updates until it has
    /// (see [`crate::pending`]); it did not within [`SETTLE_WAIT`].
    #[error("the runtime has not finished creating and starting {0:?}")]
    NotStarted(BTreeSet<String>),
}

/// What reaches the disk and the runtime, and the locks that serialize it: private to this
/// module (see the module docs).
#[derive(Debug)]
pub(crate) struct Io {
    disk: Disk,
    runtime: Arc<dyn Runtime>,
    timing: Timing,
    /// Serializes deliveries, so they reach the runtime in the order they were begun.
    delivery: Mutex<()>,
    /// Serializes saves; holds the version on disk.
    saved: Mutex<u64>,
    /// The version on disk, for the manager's lock's side ([`Inner::unsaved`]).
    saved_version: Arc<std::sync::atomic::AtomicU64>,
    /// Wakes the background retry when updates become pending or deliverable.
    pending_changed: Notify,
    /// Wakes deliveries waiting for the runtime to start a container.
    started: Notify,
}

impl Io {
    pub(super) fn new(
        disk: Disk,
        runtime: Arc<dyn Runtime>,
        timing: Timing,
        saved_version: Arc<std::sync::atomic::AtomicU64>,
    ) -> Self {
        Self {
            disk,
            runtime,
            timing,
            delivery: Mutex::new(()),
            saved: Mutex::new(0),
            saved_version,
            pending_changed: Notify::new(),
            started: Notify::new(),
        }
    }

    fn faults(&self) -> &Faults {
        &self.disk.faults
    }

    /// Wakes the background retry: updates became pending or deliverable.
    pub(super) fn pending_changed(&self) {
        self.pending_changed.notify_one();
    }

    /// Wakes the deliveries waiting for the runtime to start a container.
    pub(super) fn started(&self) {
        self.started.notify_waiters();
    }
}

impl Core {
    /// Commits a change: saves the durable state up to its version, then delivers its updates.
    /// A failed save delivers nothing (the updates stay pending, retried in the background).
    pub(crate) async fn commit(&self, change: Change) -> Result<(), CommitError> {
        if let Some(version) = change.version
            && let Err(e) = self.persist(version).await
        {
            // The background retry saves it, unless a commit does first.
            self.io.pending_changed.notify_one();
            return Err(CommitError::Save(e));
        }
        if let Some((saved, _)) = change.points {
            self.io.faults().crash_point(saved);
        }
        self.deliver_ticket(&change.ticket, change.grants)
            .await
            .map_err(CommitError::Deliver)?;
        if let Some((_, delivered)) = change.points {
            self.io.faults().crash_point(delivered);
        }
        Ok(())
    }

    /// Makes the durable state durable up to `version`. Takes the manager lock only to copy the
    /// newest state; writes it outside. A save since `version` already covers it.
    async fn persist(&self, version: u64) -> Result<(), StateError> {
        let mut saved = self.io.saved.lock().await;
        if *saved >= version {
            return Ok(());
        }
        self.write_state(&mut saved).await
    }

    async fn write_state(&self, saved: &mut u64) -> Result<(), StateError> {
        let (version, state) = self.lock.with(|inner| inner.durable_state()).await;
        self.io.disk.save_state(state).await?;
        self.io.faults().crash_point(Point::CommitStateWritten);
        *saved = version;
        self.io
            .saved_version
            .fetch_max(version, std::sync::atomic::Ordering::Release);
        Ok(())
    }

    /// Saves the newest durable state now, whatever is saved already: the last save of a
    /// graceful shutdown or before a handover ([`crate::Manager::save_state`]).
    pub(crate) async fn save(&self) -> Result<(), StateError> {
        let mut saved = self.io.saved.lock().await;
        self.write_state(&mut saved).await
    }

    /// Stops every write to the disk, once the operations in flight are done: the node is
    /// handed over ([`crate::handover`]).
    pub(crate) async fn retire_disk(&self) {
        let _saves = self.io.saved.lock().await;
        self.io.disk.retire().await;
    }

    /// Writes claim `uid`'s CDI spec durably: the last step of a prepare, after its commit.
    pub(crate) async fn write_spec(
        &self,
        uid: &str,
        edits: Vec<ContainerEdits>,
    ) -> Result<(), StoreError> {
        self.io.disk.write_spec(uid, edits).await
    }

    /// Writes claim `uid`'s device metadata durably: a prepare's step after its commit and
    /// before its spec ([`crate::metadata`]).
    pub(crate) async fn write_metadata(
        &self,
        uid: &str,
        files: Vec<crate::metadata::MetadataFile>,
    ) -> Result<(), crate::metadata::MetadataError> {
        self.io.disk.write_metadata(uid, files).await
    }

    /// Removes claim `uid`'s device metadata durably: a release's step after its spec went;
    /// whether there was any.
    pub(crate) async fn remove_metadata(
        &self,
        uid: &str,
    ) -> Result<bool, crate::metadata::MetadataError> {
        self.io.disk.remove_metadata(uid).await
    }

    /// Removes claim `uid`'s CDI spec durably: the first step of a release; whether there was
    /// one.
    pub(crate) async fn remove_spec(&self, uid: &str) -> Result<bool, StoreError> {
        self.io.disk.remove_spec(uid).await
    }

    /// Whether claim `uid` has a CDI spec on disk.
    pub(crate) async fn has_spec(&self, uid: &str) -> Result<bool, StoreError> {
        self.io.disk.has_spec(uid).await
    }

    /// Moves claim `uid`'s unreadable CDI spec aside; where to, if it was there.
    pub(crate) async fn set_aside(
        &self,
        uid: &str,
    ) -> Result<Option<std::path::PathBuf>, StoreError> {
        self.io.disk.set_aside(uid).await
    }

    /// Delivers everything pending to the runtime. Takes the manager lock only briefly, never
    /// across the runtime call. Fails naming the containers whose updates the runtime did not
    /// confirm, which stay pending.
    ///
    /// A batch the runtime refuses is sent again one update at a time, so that one container the
    /// runtime cannot update (it may be gone) does not hold back everyone else's updates. A
    /// batch it did not answer in time is not: it is still pending, for the next delivery.
    pub(crate) async fn deliver(&self) -> Result<(), DeliveryError> {
        self.deliver_only(None).await
    }

    /// Delivers the updates of `ticket` (and whatever newer versions of its containers are
    /// pending by then); fails naming the containers whose recorded version is not settled
    /// afterwards (see [`crate::pending`]): what other commits recorded since, or the runtime
    /// confirmed in the meantime, does not count against it.
    ///
    /// Containers the runtime has not started cannot be updated yet: a change that `grants`
    /// CPUs waits for them, up to [`SETTLE_WAIT`], and sends their updates once they are started;
    /// any other leaves them to the background retry, which sends them then. Likewise a change
    /// that grants CPUs sends again what the runtime did not answer in time, up to
    /// [`SETTLE_WAIT`]; any other leaves it to the background retry.
    async fn deliver_ticket(&self, ticket: &Ticket, grants: bool) -> Result<(), DeliveryError> {
        if ticket.is_empty() {
            return Ok(());
        }
        let deadline = tokio::time::Instant::now() + SETTLE_WAIT;
        let containers = ticket.containers();
        // Nothing failed, yet something is unsettled and not starting: it was starting when the
        // batch was made and started since (or another delivery carried it); look again, a few
        // times, rather than fail the claim for a race with the runtime's event.
        let mut again = 3;
        loop {
            // Registered before looking, so a start noted in between is not missed.
            let started = self.io.started.notified();
            tokio::pin!(started);
            started.as_mut().enable();
            let delivered = self.deliver_only(Some(&containers)).await;
            let nothing_failed = delivered.is_ok();
            let cause = match delivered {
                Ok(()) => DeliveryCause::InFlight,
                Err(e) => e.cause,
            };
            let (unsettled, starting) = self
                .with_lock(|inner| {
                    let unsettled = inner.pending.unsettled(ticket);
                    let starting: BTreeSet<String> = unsettled
                        .iter()
                        .filter(|id| inner.pending.is_starting(id))
                        .cloned()
                        .collect();
                    (unsettled, starting)
                })
                .await;
            if unsettled.is_empty() {
                return Ok(());
            }
            // A runtime that did not answer in time is slow, not refusing: the call stays in it
            // until it answers (the NRI stub sends the next one only then), and may apply. A
            // claim waits for it, and sends again, rather than fail on a busy node; after the
            // background retry's first backoff, as that retry would: a runtime on NRI v0.11 that
            // was slow to apply an update has events queued behind it, and an update sent the
            // moment it answers may meet one of them (`nri::UpdateLull`).
            let unanswered = matches!(cause, DeliveryCause::Runtime(RuntimeError::Timeout(_)));
            if grants && unanswered && tokio::time::Instant::now() < deadline {
                debug!(containers = ?unsettled, "the runtime has not answered the claim's updates yet; sending them again");
                tokio::time::sleep(self.io.timing.retry_backoff).await;
                continue;
            }
            if nothing_failed && starting.is_empty() && again > 0 {
                again -= 1;
                continue;
            }
            if starting.is_empty() || !grants {
                let cause = if !starting.is_empty() && starting == unsettled {
                    DeliveryCause::NotStarted(starting)
                } else {
                    cause
                };
                return Err(DeliveryError {
                    containers: unsettled,
                    cause,
                });
            }
            if tokio::time::timeout_at(deadline, started).await.is_err() {
                return Err(DeliveryError {
                    containers: unsettled,
                    cause: DeliveryCause::NotStarted(starting),
                });
            }
        }
    }

    async fn deliver_only(&self, only: Option<&BTreeSet<String>>) -> Result<(), DeliveryError> {
        let _serial = self.io.delivery.lock().await;
        let batch = self.with_lock(|mut inner| inner.pending.begin(only)).await;
        if batch.is_empty() {
            return Ok(());
        }
        let result = self
            .send(batch.iter().map(|v| v.update.clone()).collect())
            .await;
        let (failed, cause) = match result {
            Ok(failed) => {
                let failed: BTreeSet<String> = failed.into_iter().collect();
                self.with_lock(|mut inner| inner.pending.finish(&batch, |id| !failed.contains(id)))
                    .await;
                (failed.clone(), DeliveryCause::Failed(failed))
            }
            Err(e) => {
                self.with_lock(|mut inner| inner.pending.finish(&batch, |_| false))
                    .await;
                let mut failed = BTreeSet::new();
                // Only a refusal may be one container's doing; a runtime that did not answer
                // would not answer the singles either, each taking the whole timeout.
                if batch.len() > 1 && matches!(e, RuntimeError::Refused(_)) {
                    debug!(error = %e, updates = batch.len(), "batch refused; sending updates one by one");
                    for single in &batch {
                        if !self.send_one(single).await {
                            failed.insert(single.update.container_id.clone());
                        }
                    }
                } else {
                    failed.extend(batch.iter().map(|v| v.update.container_id.clone()));
                }
                (failed, DeliveryCause::Runtime(e))
            }
        };
        if failed.is_empty() {
            Ok(())
        } else {
            Err(DeliveryError {
                containers: failed,
                cause,
            })
        }
    }

    /// Sends one container's pending update on its own; whether the runtime confirmed it (or
    /// nothing was pending for it any more).
    async fn send_one(&self, single: &Versioned) -> bool {
        let id = &single.update.container_id;
        let Some(one) = self
            .with_lock(|mut inner| inner.pending.begin_one(id))
            .await
        else {
            return true;
        };
        let ok = matches!(self.send(vec![one.update.clone()]).await, Ok(f) if f.is_empty());
        self.with_lock(|mut inner| inner.pending.finish(std::slice::from_ref(&one), |_| ok))
            .await;
        ok
    }

    async fn send(&self, updates: Vec<ContainerUpdate>) -> Result<Vec<String>, RuntimeError> {
        if self.io.faults().crashed() {
            // Nothing of a crashed manager reaches the runtime.
            return Err(RuntimeError::Disconnected);
        }
        let timeout = self.io.timing.update_timeout;
        match tokio::time::timeout(timeout, self.io.runtime.update_containers(updates)).await {
            Ok(result) => result,
            Err(_) => Err(RuntimeError::Timeout(timeout)),
        }
    }

    /// One pass of what commits could not finish: saves the state if a save failed since the
    /// last one succeeded (a failed save is otherwise retried only by the next commit, and an
    /// idle node may have none), then delivers what is pending.
    pub(crate) async fn retry_once(&self) -> Result<(), CommitError> {
        let unsaved = self.lock.with(|inner| inner.unsaved()).await;
        if let Some(version) = unsaved {
            self.persist(version).await.map_err(CommitError::Save)?;
        }
        self.deliver().await.map_err(CommitError::Deliver)
    }

    /// Retries, in the background, what commits could not finish (a failed save, undelivered
    /// updates: [`Core::retry_once`]), with exponential backoff, for as long as the core
    /// lives. Started once the gate is open.
    pub(crate) async fn run_retries(&self) {
        let mut backoff = self.io.timing.retry_backoff;
        loop {
            let notified = self.io.pending_changed.notified();
            let due = self
                .lock
                .with(|inner| inner.locked.pending.is_deliverable() || inner.unsaved().is_some())
                .await;
            if !due {
                notified.await;
                continue;
            }
            match self.retry_once().await {
                Ok(()) => backoff = self.io.timing.retry_backoff,
                Err(e) => {
                    warn!(error = %chain(&e), retry_in = ?backoff, "retrying what a commit could not finish");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(self.io.timing.max_retry_backoff);
                }
            }
        }
    }
}
