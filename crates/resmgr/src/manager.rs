//! The resource manager: the core ([`crate::core`]) and the services over it, as one public
//! type, [`Manager`], and its start-up from disk.
//!
//! [`Manager`] holds the core and what the services share beside it: the claim gate
//! ([`crate::gate`]), the per-claim locks ([`crate::claim_locks`]), the admission lock of claim
//! calls that a handover takes whole, the API server's claim reader and the Event recorder, the
//! configuration, and the state directory's lock. The lock and what it protects, the disk, the
//! runtime, commit and the published snapshot are the core's, private to it: the services
//! (`claims`, `container_events`, `reconcile`, `handover`) reach them only through its API. What this file implements of `Manager` is start-up and the readers and background
//! tasks the binary calls, each handed to the core.

// Blocking IO under the manager lock does not pass clippy (crates/resmgr/clippy.toml).
#![deny(clippy::disallowed_methods)]
use std::{collections::BTreeSet, sync::Arc, time::Duration};

use kube_dra::{ClaimReader, EventRecorder, NoEvents};
use policy::Policy;
use tokio::sync::watch;
use tracing::{info, warn};

use crate::{
    claim_locks::ClaimLocks,
    core::{CommitError, Core, DeliveryError, Published, Timing},
    disk::Disk,
    faults::Faults,
    gate::Gate,
    reconciliation::{ReconcileConfig, Reconciliation, Stray, Unconfirmed},
    runtime::Runtime,
    state::{PreparedClaim, Records, STATE_VERSION, State, StateError, StateFile, StateLock},
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
    /// Injected faults, for tests; see [`crate::faults`]. None by default, as in the agent.
    pub faults: Faults,
    /// Reconciliation of strays and unconfirmed claims ([`crate::reconcile`]).
    pub reconcile: ReconcileConfig,
    /// Where prepared claims' device metadata is written ([`crate::metadata`]); `None` writes
    /// none and mounts none.
    pub metadata: Option<crate::metadata::MetadataStore>,
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
            metadata: None,
        }
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

/// The resource manager.
#[derive(Debug)]
pub struct Manager {
    /// The lock and what it protects, the disk, the runtime, commit and the published
    /// snapshot, reached only through the core's API.
    pub(crate) core: Core,
    /// One prepare or unprepare of a claim at a time.
    pub(crate) claim_locks: ClaimLocks,
    pub(crate) claim_reader: Arc<dyn ClaimReader>,
    /// Where reconciliation tells users what it did (an Event on the Node).
    pub(crate) recorder: Arc<dyn EventRecorder>,
    pub(crate) gate: Gate,
    /// Every claim call admitted holds a share ([`crate::claims`]); a handover takes it whole,
    /// so it waits for the calls in flight and no call starts after it.
    pub(crate) calls: tokio::sync::RwLock<()>,
    pub(crate) config: ManagerConfig,
    /// This manager's hold on the state directory, until it hands the node over.
    pub(crate) state_lock: std::sync::Mutex<Option<StateLock>>,
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
        policy: Box<dyn Policy>,
        state_file: StateFile,
        specs: cdi::SpecStore,
        runtime: Arc<dyn Runtime>,
        claim_reader: Arc<dyn ClaimReader>,
    ) -> Result<Self, StartError> {
        let lock = state_file.lock()?;
        Self::start_locked(
            lock,
            config,
            policy,
            state_file,
            specs,
            runtime,
            claim_reader,
        )
    }

    /// [`Manager::start`] with the state directory's lock taken already (a new agent takes it
    /// as the old one lets it go: [`crate::handover`]).
    #[expect(
        clippy::disallowed_methods,
        reason = "start-up reads and writes the disk before anything is served, with no lock taken"
    )]
    pub fn start_locked(
        lock: StateLock,
        config: ManagerConfig,
        mut policy: Box<dyn Policy>,
        state_file: StateFile,
        specs: cdi::SpecStore,
        runtime: Arc<dyn Runtime>,
        claim_reader: Arc<dyn ClaimReader>,
    ) -> Result<Self, StartError> {
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
        let mut accounted: BTreeSet<String> = policy.claims().into_iter().collect();
        let on_disk = specs.claims()?;
        // A spec proves a prepare completed; a state that holds its claim on other CPUs is older
        // than it (a backup restored): the state's record gives way, and the spec is judged as a
        // stray below.
        for uid in &on_disk {
            if !accounted.contains(uid.as_str()) {
                continue;
            }
            let Ok(edits) = specs.read_claim(uid.as_str()) else {
                continue;
            };
            let granted =
                policy::claim_env::cpuset_in(edits.iter().flat_map(|e| &e.env), uid.as_str())
                    .and_then(|cpus| cpus.parse::<policy::CpuSet>().ok());
            let held = policy.claim_cpus(uid.as_str());
            if let (Some(granted), Some(held)) = (granted, held)
                && granted != held
            {
                warn!(claim = %uid, spec = %granted, state = %held,
                    "the state holds this claim on other cpus than its CDI spec grants: the state is older than the spec, which is taken back");
                policy
                    .release_claim(uid.as_str())
                    .map_err(|source| StartError::Restore {
                        path: state_file.path(),
                        source,
                    })?;
                records.remove(uid.as_str());
                accounted.remove(uid.as_str());
            }
        }
        let mut adopted = 0;
        for uid in &on_disk {
            if accounted.contains(uid.as_str()) {
                continue;
            }
            let path = specs.spec_path(uid);
            let stray = match specs.read_claim(uid.as_str()) {
                Err(e) => Stray::Unreadable(stdx::errors::chain(&e)),
                Ok(edits) => match policy.adopt_claim(uid.as_str(), &edits) {
                    Ok(()) => {
                        records.insert(
                            uid.to_string(),
                            crate::reconciliation::adopted_record(&config.driver, uid, edits.len()),
                        );
                        adopted += 1;
                        Stray::Adopted
                    }
                    Err(e) => Stray::Refused(e.to_string(), edits),
                },
            };
            warn!(claim = %uid, spec = %path.display(), judged = ?stray,
                "the state does not account for this CDI spec: judged at the runtime's Synchronize");
            reconcile.strays.insert(uid.to_string(), stray);
        }
        // Claims held without proof that they are still wanted: adopted at an earlier start and
        // not prepared since, or held without a spec (see crate::reconcile).
        let with_spec: BTreeSet<&str> = on_disk.iter().map(cdi::ClaimUid::as_str).collect();
        let keep_metadata = with_spec
            .iter()
            .map(|u| (*u).to_owned())
            .chain(records.keys().cloned())
            .collect();
        crate::metadata::sweep_at_start(config.metadata.as_ref(), &keep_metadata);
        for uid in &accounted {
            let adopted_before = records.get(uid).is_some_and(|r| r.adopted);
            let without_spec = !with_spec.contains(uid.as_str());
            if adopted_before || without_spec {
                reconcile.unconfirmed.insert(
                    uid.clone(),
                    Unconfirmed {
                        without_spec,
                        ..Unconfirmed::default()
                    },
                );
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
        let core = Core::new(
            policy,
            Records::new(records),
            reconcile,
            Disk::new(state_file, specs, config.faults.clone())
                .with_metadata(config.metadata.clone()),
            runtime,
            Timing {
                update_timeout: config.update_timeout,
                retry_backoff: config.retry_backoff,
                max_retry_backoff: config.max_retry_backoff,
            },
        );
        Ok(Self {
            core,
            claim_locks: ClaimLocks::default(),
            claim_reader,
            recorder: Arc::new(NoEvents),
            gate: Gate::default(),
            calls: tokio::sync::RwLock::new(()),
            config,
            state_lock: std::sync::Mutex::new(Some(lock)),
        })
    }

    /// Tells users through `recorder` what reconciliation did (an Event on the Node).
    #[must_use]
    pub fn with_recorder(mut self, recorder: Arc<dyn EventRecorder>) -> Self {
        self.recorder = recorder;
        self
    }

    /// Why claims are refused although the runtime synchronized, if they are: a claim is
    /// contested ([`crate::reconcile`]).
    pub fn contested(&self) -> Option<String> {
        self.gate.refusal()
    }

    /// The claim gate.
    pub fn gate(&self) -> &Gate {
        &self.gate
    }

    /// The manager's configuration.
    pub fn config(&self) -> &ManagerConfig {
        &self.config
    }

    /// What readers need, refreshed under the lock at every change ([`Published`]).
    pub fn published(&self) -> watch::Receiver<Arc<Published>> {
        self.core.published()
    }

    /// The snapshot as of now.
    pub fn snapshot(&self) -> Arc<Published> {
        self.core.snapshot()
    }

    /// The injected faults.
    pub(crate) fn faults(&self) -> &Faults {
        &self.config.faults
    }

    /// How many containers have updates pending.
    pub async fn pending_updates(&self) -> usize {
        self.core.with_lock(|inner| inner.pending.len()).await
    }

    /// Every prepared claim's record, by UID: what `/debug/state` shows.
    pub async fn claim_records(&self) -> std::collections::BTreeMap<String, PreparedClaim> {
        self.core.with_lock(|inner| (*inner.records).clone()).await
    }

    /// What the policy has placed where, now ([`Policy::inventory`]): for metrics, debugging
    /// and the simulator. It takes the lock, briefly: an inventory grows with what runs on the
    /// node, so it is made when a reader asks (a scrape, a debug request), not at every change.
    pub async fn inventory(&self) -> policy::Inventory {
        self.core.with_lock(|inner| inner.policy.inventory()).await
    }

    /// Delivers everything pending to the runtime ([`Core::deliver`]): fails naming the
    /// containers whose updates the runtime did not confirm, which stay pending.
    pub async fn deliver(&self) -> Result<(), DeliveryError> {
        self.core.deliver().await
    }

    /// One pass of what commits could not finish ([`Core::retry_once`]): a failed save, then
    /// what is pending.
    pub async fn retry_once(&self) -> Result<(), CommitError> {
        self.core.retry_once().await
    }

    /// Retries, in the background, what commits could not finish, with exponential backoff,
    /// for as long as the manager lives ([`Core::run_retries`]). Started once the gate is open.
    pub async fn run_retries(&self) {
        self.core.run_retries().await;
    }

    /// Saves the durable state once more: the last step of a graceful shutdown. Every commit
    /// has saved already; this makes the file exist, and current, even when nothing was ever
    /// committed. A manager that handed the node over saves nothing: the state is its
    /// successor's ([`crate::handover`]).
    pub async fn save_state(&self) -> Result<(), StateError> {
        if let Some(to) = self.gate.handed_over_to() {
            info!(successor = %to, "handed over: the state is the successor's, nothing saved");
            return Ok(());
        }
        self.core.save().await
    }
}
