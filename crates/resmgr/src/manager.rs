//! The resource manager: one policy, one lock, two front ends.
//!
//! # The lock
//!
//! Everything the policy decides lives in [`Inner`] behind one async mutex. NRI event handlers,
//! the runtime's Synchronize, and the kubelet's prepare and unprepare all take it, so the policy
//! sees one sequence of calls. It is held only for in-memory work: never across a call to the
//! runtime, and never across disk IO.
//!
//! # The lock is never held across a call to the runtime
//!
//! The runtime (containerd, CRI-O) holds its own NRI lock while it waits for our answer to an
//! event, and serves our unsolicited `UpdateContainers` under that same lock. If a commit held our
//! lock while waiting for `UpdateContainers`, an event arriving meanwhile would wait for our lock
//! while the runtime waits for our event answer: a deadlock that ends only when the runtime's
//! request timeout disconnects us. So a commit delivers the pending updates after letting go
//! ([`Manager::deliver`]); deliveries are serialized by a lock of their own that event handlers
//! never take. Event handlers therefore never wait on the runtime, including Synchronize, which
//! takes the manager lock like every other event. What keeps claims from racing the Synchronize
//! is not the lock but the gate ([`crate::gate`]).
//!
//! # The lock is never held across disk IO
//!
//! Saves and spec writes fsync, and a slow disk must not delay the answers to NRI events (the
//! runtime drops a plugin that misses its timeout, which ends the agent). So every change of
//! the durable state bumps a version under the lock, and is made durable afterwards, outside it,
//! by [`Manager::persist`]: saves are serialized by a lock of their own, each writes the newest
//! state (taken under the manager lock, briefly), and a caller whose version a later save
//! already covered does not write at all. Disk IO runs on the blocking pool ([`crate::disk`]).
//! Events that change nothing durable (with the topology-aware policy: every container event)
//! never wait for the disk.
//!
//! # Commit
//!
//! A commit is (1) making the durable state that includes a change durable (atomically, with
//! fsyncs), and (2) delivering the container updates the change made. Updates stay pending
//! ([`crate::pending`]) until the runtime confirms them; a claim's commit waits for the updates
//! its own allocation made, and what it could not deliver goes out from the background retry
//! ([`Manager::run_retries`]).

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
    time::Duration,
};

use policy::{ContainerUpdate, Policy};
use tokio::sync::{Mutex, Notify, watch};
use tracing::{debug, info, warn};

use crate::{
    claims::ClaimLocks,
    disk::Disk,
    faults::Faults,
    gate::Gate,
    kube::{ClaimReader, EventRecorder, NoEvents},
    pending::{PendingUpdates, Ticket, Versioned},
    published::{Guard, Published},
    reconcile::{ReconcileConfig, Reconciliation, Stray, Unconfirmed},
    runtime::{Runtime, RuntimeError},
    state::{ClaimRecord, STATE_VERSION, State, StateError, StateFile, StateLock},
};

/// Settings of the resource manager.
#[derive(Debug, Clone)]
pub struct ManagerConfig {
    /// The DRA driver name, also the CDI vendor of our specs.
    pub driver: String,
    /// How long one `UpdateContainers` call may take before its updates count as undelivered.
    pub update_timeout: Duration,
    /// First delay of the background retry of undelivered updates; it doubles up to
    /// [`ManagerConfig::max_retry_backoff`].
    pub retry_backoff: Duration,
    /// Longest delay between retries.
    pub max_retry_backoff: Duration,
    /// Injected faults, for tests; see [`crate::faults`]. Inert in release builds.
    pub faults: Faults,
    /// Reconciliation of strays and unconfirmed claims ([`crate::reconcile`]).
    pub reconcile: ReconcileConfig,
}

impl ManagerConfig {
    /// Defaults for a driver.
    pub fn new(driver: impl Into<String>) -> Self {
        Self {
            driver: driver.into(),
            update_timeout: Duration::from_secs(2),
            retry_backoff: Duration::from_millis(500),
            max_retry_backoff: Duration::from_secs(30),
            faults: Faults::default(),
            reconcile: ReconcileConfig::default(),
        }
    }
}

/// What the lock protects.
#[derive(Debug)]
pub(crate) struct Inner {
    pub(crate) policy: Box<dyn Policy>,
    pub(crate) records: BTreeMap<String, ClaimRecord>,
    pub(crate) pending: PendingUpdates,
    pub(crate) reconcile: Reconciliation,
    /// Counts changes of the durable state.
    version: u64,
    /// The durable state as of `version`: the policy's snapshot and the claim records.
    durable: (serde_json::Value, BTreeMap<String, ClaimRecord>),
}

impl Inner {
    /// Takes note of what the calls since the last note changed: if the policy's snapshot or the
    /// records differ from the durable state noted, that is a new version, returned for
    /// [`Manager::persist`]; `None` if nothing durable changed.
    pub(crate) fn note_changes(&mut self) -> Option<u64> {
        let snapshot = self.policy.snapshot();
        if snapshot == self.durable.0 && self.records == self.durable.1 {
            return None;
        }
        self.durable = (snapshot, self.records.clone());
        self.version += 1;
        Some(self.version)
    }

    /// Notes changes ([`Inner::note_changes`]) and returns the version that includes every
    /// change so far, whoever made it: what a claim's commit persists, so that it also finishes
    /// what an earlier failed save left unsaved.
    pub(crate) fn current_version(&mut self) -> u64 {
        self.note_changes();
        self.version
    }

    /// The newest durable state and its version.
    fn durable_state(&self) -> (u64, State) {
        let state = State {
            version: STATE_VERSION,
            policy: self.policy.name().to_owned(),
            policy_state: self.durable.0.clone(),
            claims: self.durable.1.clone(),
        };
        (self.version, state)
    }
}

/// Why the manager could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The state file could not be read; nothing was deleted.
    #[error(transparent)]
    State(#[from] StateError),
    /// The policy refused the saved state.
    #[error("restoring the policy from {path}")]
    Restore {
        /// The state file.
        path: std::path::PathBuf,
        /// The policy's error.
        #[source]
        source: policy::PolicyError,
    },
    /// The CDI spec directory could not be read or cleaned.
    #[error("reconciling CDI specs")]
    Specs(#[from] cdi::StoreError),
}

/// Undelivered updates after a delivery.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{} container update(s) not delivered: {cause}", containers.len())]
pub struct DeliveryError {
    /// The containers whose updates are still pending.
    pub containers: BTreeSet<String>,
    /// Why.
    pub cause: String,
}

/// The resource manager.
#[derive(Debug)]
pub struct Manager {
    pub(crate) inner: Mutex<Inner>,
    /// What readers see ([`crate::published`]).
    published: watch::Sender<Arc<Published>>,
    /// Serializes deliveries, so they reach the runtime in the order they were begun.
    delivery: Mutex<()>,
    /// Serializes saves; holds the version on disk.
    saved: Mutex<u64>,
    pub(crate) disk: Disk,
    /// One prepare or unprepare of a claim at a time.
    pub(crate) claim_locks: ClaimLocks,
    runtime: Arc<dyn Runtime>,
    pub(crate) claim_reader: Arc<dyn ClaimReader>,
    /// Where reconciliation tells users what it did (an Event on the Node).
    pub(crate) events: Arc<dyn EventRecorder>,
    pub(crate) gate: Gate,
    /// Why claims are refused after the Synchronize, when a claim is contested.
    pub(crate) contested: std::sync::Mutex<Option<String>>,
    pending_changed: Notify,
    pub(crate) config: ManagerConfig,
    /// This manager's hold on the state directory.
    _lock: StateLock,
}

impl Manager {
    /// Starts the manager from what is on disk: takes the state directory for itself (a second
    /// manager on it is refused before it reads or cleans anything), loads the state (a missing
    /// state is a fresh start; an unreadable one is an error and nothing is deleted), restores
    /// the policy from it, removes the temporary files of writes a crash interrupted, and takes
    /// back, provisionally, every claim whose CDI spec is on disk but not accounted for.
    ///
    /// No spec stops the start-up: what a stray spec is worth is judged at the runtime's
    /// Synchronize and by the API server ([`crate::reconcile`]). Adopted claims are saved before
    /// anything is served.
    pub fn start(
        config: ManagerConfig,
        mut policy: Box<dyn Policy>,
        state_file: StateFile,
        specs: cdi::SpecStore,
        runtime: Arc<dyn Runtime>,
        claim_reader: Arc<dyn ClaimReader>,
    ) -> Result<Self, StartError> {
        let lock = state_file.lock()?;
        let state = state_file.load(policy.name())?;
        state_file.remove_temporary_files()?;
        let mut records = match state {
            Some(state) => {
                policy
                    .restore(&state.policy_state)
                    .map_err(|source| StartError::Restore {
                        path: state_file.path(),
                        source,
                    })?;
                info!(path = %state_file.path().display(), claims = state.claims.len(), "state restored");
                state.claims
            }
            None => {
                info!(path = %state_file.path().display(), "no state file: fresh start");
                Default::default()
            }
        };
        specs.remove_temporary_files()?;
        let mut reconcile = Reconciliation::default();
        let accounted: BTreeSet<String> = policy.claims().into_iter().collect();
        let on_disk = specs.claims()?;
        let mut adopted = 0;
        for uid in &on_disk {
            if accounted.contains(uid.as_str()) {
                continue;
            }
            let path = specs.spec_path(uid);
            let stray = match specs.read_claim(uid.as_str()) {
                Err(e) => Stray::Unreadable(crate::errors::chain(&e)),
                Ok(edits) => match policy.adopt_claim(uid.as_str(), &edits) {
                    Ok(()) => {
                        records.insert(
                            uid.to_string(),
                            crate::reconcile::adopted_record(&config.driver, uid, edits.len()),
                        );
                        adopted += 1;
                        Stray::Adopted
                    }
                    Err(e) => Stray::Refused(e.to_string()),
                },
            };
            warn!(claim = %uid, spec = %path.display(), judged = ?stray,
                "the state does not account for this CDI spec: judged at the runtime's Synchronize");
            reconcile.strays.insert(uid.to_string(), stray);
        }
        // Claims held without proof that they are still wanted: adopted at an earlier start and
        // not prepared since, or held without a spec (see crate::reconcile).
        let with_spec: BTreeSet<&str> = on_disk.iter().map(cdi::ClaimUid::as_str).collect();
        for uid in &accounted {
            let adopted_before = records.get(uid).is_some_and(|r| r.adopted);
            if adopted_before || !with_spec.contains(uid.as_str()) {
                reconcile
                    .unconfirmed
                    .insert(uid.clone(), Unconfirmed::default());
            }
        }
        if adopted > 0 {
            // Durable before anything is served, like every commit.
            state_file.save(&State {
                version: STATE_VERSION,
                policy: policy.name().to_owned(),
                policy_state: policy.snapshot(),
                claims: records.clone(),
            })?;
            info!(claims = adopted, "adopted claims saved");
        }
        let durable = (policy.snapshot(), records.clone());
        let published = watch::Sender::new(Arc::new(Published::of(policy.as_ref(), &records)));
        Ok(Self {
            published,
            inner: Mutex::new(Inner {
                policy,
                records,
                pending: PendingUpdates::default(),
                reconcile,
                version: 0,
                durable,
            }),
            delivery: Mutex::new(()),
            saved: Mutex::new(0),
            disk: Disk {
                state_file,
                specs,
                faults: config.faults.clone(),
            },
            claim_locks: ClaimLocks::default(),
            runtime,
            claim_reader,
            events: Arc::new(NoEvents),
            gate: Gate::default(),
            contested: std::sync::Mutex::new(None),
            pending_changed: Notify::new(),
            config,
            _lock: lock,
        })
    }

    /// Tells users through `events` what reconciliation did (an Event on the Node).
    #[must_use]
    pub fn with_events(mut self, events: Arc<dyn EventRecorder>) -> Self {
        self.events = events;
        self
    }

    /// Why claims are refused although the runtime synchronized, if they are: a claim is
    /// contested ([`crate::reconcile`]).
    pub fn contested(&self) -> Option<String> {
        crate::sync::lock(&self.contested).clone()
    }

    /// The claim gate.
    pub fn gate(&self) -> &Gate {
        &self.gate
    }

    /// The manager's configuration.
    pub fn config(&self) -> &ManagerConfig {
        &self.config
    }

    /// Takes the lock.
    pub(crate) async fn lock(&self) -> Guard<'_> {
        Guard {
            inner: self.inner.lock().await,
            published: &self.published,
            changed: false,
        }
    }

    /// What readers need, refreshed under the lock at every change ([`crate::published`]).
    pub fn published(&self) -> watch::Receiver<Arc<Published>> {
        self.published.subscribe()
    }

    /// The snapshot as of now.
    pub fn snapshot(&self) -> Arc<Published> {
        self.published.borrow().clone()
    }

    /// The injected faults.
    pub(crate) fn faults(&self) -> &Faults {
        &self.config.faults
    }

    /// Records updates as pending and wakes the background retry; returns their versions.
    pub(crate) fn record_pending(
        &self,
        inner: &mut Inner,
        updates: Vec<ContainerUpdate>,
    ) -> Ticket {
        if updates.is_empty() {
            return Ticket::default();
        }
        let ticket = inner.pending.record(updates);
        self.pending_changed.notify_one();
        ticket
    }

    /// Makes the durable state durable up to `version` (from [`Inner::note_changes`]): commit
    /// step 1. Takes the manager lock only to copy the newest state; writes it outside. A save
    /// since `version` already covers it; a failed save leaves the disk where it was, and the
    /// next persist writes the newest state.
    pub(crate) async fn persist(&self, version: u64) -> Result<(), StateError> {
        let mut saved = self.saved.lock().await;
        if *saved >= version {
            return Ok(());
        }
        self.write_state(&mut saved).await
    }

    async fn write_state(&self, saved: &mut u64) -> Result<(), StateError> {
        let (version, state) = self.lock().await.durable_state();
        self.disk.save_state(state).await?;
        self.faults().crash_point("commit.state-written");
        *saved = version;
        Ok(())
    }

    /// Delivers everything pending to the runtime: commit step 2. Takes the manager lock only
    /// briefly, never across the runtime call. Fails naming the containers whose updates the
    /// runtime did not confirm, which stay pending.
    ///
    /// A batch the runtime refuses is sent again one update at a time, so that one container the
    /// runtime cannot update (it may be gone) does not hold back everyone else's updates.
    pub async fn deliver(&self) -> Result<(), DeliveryError> {
        self.deliver_only(None).await
    }

    /// Delivers the updates of `ticket` (and whatever newer versions of its containers are
    /// pending by then); fails naming the containers whose recorded version is not settled
    /// afterwards (see [`crate::pending`]): what other commits recorded since, or the runtime
    /// confirmed in the meantime, does not count against it.
    pub(crate) async fn deliver_ticket(&self, ticket: &Ticket) -> Result<(), DeliveryError> {
        if ticket.is_empty() {
            return Ok(());
        }
        let cause = match self.deliver_only(Some(&ticket.containers())).await {
            Ok(()) => String::new(),
            Err(e) => e.cause,
        };
        let unsettled = self.lock().await.pending.unsettled(ticket);
        if unsettled.is_empty() {
            return Ok(());
        }
        Err(DeliveryError {
            containers: unsettled,
            cause,
        })
    }

    async fn deliver_only(&self, only: Option<&BTreeSet<String>>) -> Result<(), DeliveryError> {
        let _serial = self.delivery.lock().await;
        let batch = self.lock().await.pending.begin(only);
        if batch.is_empty() {
            return Ok(());
        }
        let result = self
            .send(batch.iter().map(|v| v.update.clone()).collect())
            .await;
        let (failed, cause) = match result {
            Ok(failed) => {
                let failed: BTreeSet<String> = failed.into_iter().collect();
                self.lock()
                    .await
                    .pending
                    .finish(&batch, |id| !failed.contains(id));
                let cause = format!("the runtime failed updates of {failed:?}");
                (failed, cause)
            }
            Err(e) => {
                self.lock().await.pending.finish(&batch, |_| false);
                let mut failed = BTreeSet::new();
                if batch.len() > 1 {
                    debug!(error = %e, updates = batch.len(), "batch refused; sending updates one by one");
                    for single in &batch {
                        if !self.send_one(single).await {
                            failed.insert(single.update.container_id.clone());
                        }
                    }
                } else {
                    failed.extend(batch.iter().map(|v| v.update.container_id.clone()));
                }
                (failed, e.to_string())
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
        let Some(one) = self.lock().await.pending.begin_one(id) else {
            return true;
        };
        let ok = matches!(self.send(vec![one.update.clone()]).await, Ok(f) if f.is_empty());
        self.lock()
            .await
            .pending
            .finish(std::slice::from_ref(&one), |_| ok);
        ok
    }

    async fn send(&self, updates: Vec<ContainerUpdate>) -> Result<Vec<String>, RuntimeError> {
        if self.faults().crashed() {
            // Nothing of a crashed manager reaches the runtime.
            return Err(RuntimeError::Disconnected);
        }
        let timeout = self.config.update_timeout;
        match tokio::time::timeout(timeout, self.runtime.update_containers(updates)).await {
            Ok(result) => result,
            Err(_) => Err(RuntimeError::Timeout(timeout)),
        }
    }

    /// Retries undelivered updates in the background, with exponential backoff, for as long as
    /// the manager lives. Started once the gate is open.
    pub async fn run_retries(&self) {
        let mut backoff = self.config.retry_backoff;
        loop {
            let notified = self.pending_changed.notified();
            if self.lock().await.pending.is_empty() {
                notified.await;
                continue;
            }
            match self.deliver().await {
                Ok(()) => backoff = self.config.retry_backoff,
                Err(e) => {
                    warn!(error = %e, retry_in = ?backoff, "container updates still pending");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(self.config.max_retry_backoff);
                }
            }
        }
    }

    /// How many containers have updates pending.
    pub async fn pending_updates(&self) -> usize {
        self.lock().await.pending.len()
    }

    /// Every prepared claim's record, by UID: what `/debug/state` shows.
    pub async fn claim_records(&self) -> std::collections::BTreeMap<String, ClaimRecord> {
        self.lock().await.records.clone()
    }

    /// Saves the durable state once more: the last step of a graceful shutdown. Every commit
    /// has saved already; this makes the file exist, and current, even when nothing was ever
    /// committed.
    pub async fn save_state(&self) -> Result<(), StateError> {
        let mut saved = self.saved.lock().await;
        self.write_state(&mut saved).await
    }
}
