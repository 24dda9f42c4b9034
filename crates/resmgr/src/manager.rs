//! The resource manager: one policy, one lock, two front ends.
//!
//! # The lock
//!
//! Everything the policy decides, and everything durable, lives in [`Inner`] behind one async
//! mutex. NRI event handlers, the runtime's Synchronize, and the kubelet's prepare and unprepare
//! all take it, so the policy sees one sequence of calls.
//!
//! # The lock is never held across a call to the runtime
//!
//! The runtime (containerd, CRI-O) holds its own NRI lock while it waits for our answer to an
//! event, and serves our unsolicited `UpdateContainers` under that same lock. If a commit held our
//! lock while waiting for `UpdateContainers`, an event arriving meanwhile would wait for our lock
//! while the runtime waits for our event answer: a deadlock that ends only when the runtime's
//! request timeout disconnects us. So a commit saves the state under the lock, lets go, and then
//! delivers the pending updates ([`Manager::deliver`]); deliveries are serialized by a lock of
//! their own that event handlers never take. Event handlers therefore never wait on the runtime,
//! including Synchronize, which takes the manager lock like every other event. What keeps claims
//! from racing the Synchronize is not the lock but the gate ([`crate::gate`]).
//!
//! # Commit
//!
//! A commit is (1) saving the durable state, under the lock, atomically and durably, and (2)
//! delivering the container updates the policy made, outside the lock. Updates stay pending
//! ([`crate::pending`]) until the runtime confirms them; what a commit could not deliver goes out
//! with the next commit and from the background retry ([`Manager::run_retries`]).

use std::{collections::BTreeSet, sync::Arc, time::Duration};

use policy::{ContainerUpdate, Policy};
use tokio::sync::{Mutex, MutexGuard, Notify};
use tracing::{debug, info, warn};

use crate::{
    crash::crash_point,
    gate::Gate,
    kube::ClaimReader,
    pending::PendingUpdates,
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
}

impl ManagerConfig {
    /// Defaults for a driver.
    pub fn new(driver: impl Into<String>) -> Self {
        Self {
            driver: driver.into(),
            update_timeout: Duration::from_secs(2),
            retry_backoff: Duration::from_millis(500),
            max_retry_backoff: Duration::from_secs(30),
        }
    }
}

/// What the lock protects.
#[derive(Debug)]
pub(crate) struct Inner {
    pub(crate) policy: Box<dyn Policy>,
    pub(crate) state_file: StateFile,
    pub(crate) specs: cdi::SpecStore,
    pub(crate) records: std::collections::BTreeMap<String, ClaimRecord>,
    pub(crate) pending: PendingUpdates,
    /// The policy snapshot and claim records last saved, so that what changes nothing durable
    /// skips the save, and what changed since a failed save saves it.
    saved_policy_state: serde_json::Value,
    saved_records: std::collections::BTreeMap<String, ClaimRecord>,
}

impl Inner {
    /// Saves the durable state: commit step 1.
    pub(crate) fn save(&mut self) -> Result<(), StateError> {
        let policy_state = self.policy.snapshot();
        let state = State {
            version: STATE_VERSION,
            policy: self.policy.name().to_owned(),
            policy_state: policy_state.clone(),
            claims: self.records.clone(),
        };
        self.state_file.save(&state)?;
        crash_point("commit.state-written");
        self.saved_policy_state = policy_state;
        self.saved_records = state.claims;
        Ok(())
    }

    /// Saves the state if it changed since the last successful save.
    pub(crate) fn save_if_changed(&mut self) -> Result<(), StateError> {
        if self.policy.snapshot() == self.saved_policy_state && self.records == self.saved_records {
            return Ok(());
        }
        self.save()
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
    /// Serializes deliveries, so they reach the runtime in the order they were begun.
    delivery: Mutex<()>,
    runtime: Arc<dyn Runtime>,
    pub(crate) claim_reader: Arc<dyn ClaimReader>,
    pub(crate) gate: Gate,
    pending_changed: Notify,
    pub(crate) config: ManagerConfig,
    /// This manager's hold on the state directory.
    _lock: StateLock,
}

impl Manager {
    /// Starts the manager from what is on disk: takes the state directory for itself (a second
    /// manager on it is refused before it reads or cleans anything), loads the state (a missing
    /// state is a fresh start; an unreadable one is an error and nothing is deleted), restores
    /// the policy from it, and removes the CDI specs of claims the policy does not account for and
    /// the temporary files of writes a crash interrupted.
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
        let records = match state {
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
        let accounted: BTreeSet<String> = policy.claims().into_iter().collect();
        specs.remove_temporary_files()?;
        for uid in specs.claims()? {
            if !accounted.contains(uid.as_str()) {
                // Our ordering never leaves such a spec; an older version, a restored backup or
                // a bug did. A spec nobody accounts for would grant CPUs nobody owns.
                warn!(claim = %uid, dir = %specs.dir().display(),
                    "removing CDI spec of a claim the state does not account for");
                specs.remove_claim(uid.as_str())?;
            }
        }
        let saved_policy_state = policy.snapshot();
        Ok(Self {
            inner: Mutex::new(Inner {
                policy,
                state_file,
                specs,
                saved_records: records.clone(),
                records,
                pending: PendingUpdates::default(),
                saved_policy_state,
            }),
            _lock: lock,
            delivery: Mutex::new(()),
            runtime,
            claim_reader,
            gate: Gate::default(),
            pending_changed: Notify::new(),
            config,
        })
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
    pub(crate) async fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().await
    }

    /// Records updates as pending and wakes the background retry.
    pub(crate) fn record_pending(&self, inner: &mut Inner, updates: Vec<ContainerUpdate>) {
        if !updates.is_empty() {
            inner.pending.record(updates);
            self.pending_changed.notify_one();
        }
    }

    /// Delivers everything pending to the runtime: commit step 2. Takes the manager lock only
    /// briefly, never across the runtime call. Returns the containers whose updates are still
    /// pending afterwards, as an error, if any.
    ///
    /// A batch the runtime refuses is sent again one update at a time, so that one container the
    /// runtime cannot update (it may be gone) does not hold back everyone else's updates.
    pub async fn deliver(&self) -> Result<(), DeliveryError> {
        let _serial = self.delivery.lock().await;
        let batch = self.lock().await.pending.begin();
        if batch.is_empty() {
            return Ok(());
        }
        let ids = |b: &[crate::pending::Versioned]| -> BTreeSet<String> {
            b.iter().map(|v| v.update.container_id.clone()).collect()
        };
        let result = self
            .send(batch.iter().map(|v| v.update.clone()).collect())
            .await;
        let mut cause = String::new();
        match result {
            Ok(failed) => {
                let failed: BTreeSet<String> = failed.into_iter().collect();
                self.lock()
                    .await
                    .pending
                    .finish(&batch, |id| !failed.contains(id));
                if !failed.is_empty() {
                    cause = format!("the runtime failed updates of {failed:?}");
                }
            }
            Err(e) => {
                self.lock().await.pending.finish(&batch, |_| false);
                cause = e.to_string();
                if batch.len() > 1 {
                    debug!(error = %e, updates = batch.len(), "batch refused; sending updates one by one");
                    for single in &batch {
                        let one = self
                            .lock()
                            .await
                            .pending
                            .begin_one(&single.update.container_id);
                        let Some(one) = one else { continue };
                        let ok = matches!(self.send(vec![one.update.clone()]).await, Ok(f) if f.is_empty());
                        self.lock()
                            .await
                            .pending
                            .finish(std::slice::from_ref(&one), |_| ok);
                    }
                }
            }
        }
        let inner = self.lock().await;
        let still: BTreeSet<String> = ids(&batch)
            .into_iter()
            .filter(|id| inner.pending.get(id).is_some())
            .collect();
        if still.is_empty() {
            Ok(())
        } else {
            Err(DeliveryError {
                containers: still,
                cause,
            })
        }
    }

    async fn send(&self, updates: Vec<ContainerUpdate>) -> Result<Vec<String>, RuntimeError> {
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

    /// Saves the durable state once more, under the lock, so any operation in flight finishes
    /// first: the last step of a graceful shutdown. Every commit has saved already; this makes
    /// the file exist, and current, even when nothing was ever committed.
    pub async fn save_state(&self) -> Result<(), StateError> {
        self.lock().await.save()
    }
}
