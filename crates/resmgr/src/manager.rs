//! The resource manager: one policy, one lock, two front ends.
//!
//! # The lock
//!
//! Everything the policy decides lives in [`Inner`] behind one async mutex. NRI event handlers,
//! the runtime's Synchronize, and the kubelet's prepare and unprepare all take it, so the policy
//! sees one sequence of calls. It is held only for in-memory work: never across a call to the
//! runtime, and never across disk IO. It is taken only through [`Manager::with_lock`], by a plain
//! closure that cannot await, so code that would hold it across IO does not compile (see
//! [`crate::commit`]).
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
//! the durable state bumps a version under the lock, and is made durable afterwards, outside it:
//! saves are serialized by a lock of their own, each writes the newest state (taken under the
//! manager lock, briefly), and a caller whose version a later save already covered does not
//! write at all. Disk IO runs on the blocking pool ([`crate::disk`]). Events that change nothing
//! durable (with the topology-aware policy: every container event) never wait for the disk.
//!
//! # Commit
//!
//! A commit makes a change durable and delivers the container updates it made; both rules above
//! are kept by [`crate::commit`], which alone holds the disk and the runtime, and which takes a
//! change only once the lock is let go: the change is what the lock's closure returns.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
    time::Duration,
};

use kube_dra::{ClaimReader, EventRecorder, NoEvents};
use policy::Policy;
use tokio::sync::{Mutex, watch};
use tracing::{info, warn};

use crate::{
    claims::ClaimLocks,
    commit::Io,
    disk::Disk,
    faults::Faults,
    gate::Gate,
    pending::PendingUpdates,
    published::{Guard, Published},
    reconcile::{ReconcileConfig, Reconciliation, Stray, Unconfirmed},
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

/// What the lock protects. Public only because [`Manager::with_lock`] is (for its doc tests);
/// nothing of it is usable outside this crate.
#[doc(hidden)]
#[derive(Debug)]
pub struct Inner {
    pub(crate) policy: Box<dyn Policy>,
    pub(crate) records: Records,
    pub(crate) pending: PendingUpdates,
    pub(crate) reconcile: Reconciliation,
    /// Counts changes of the durable state.
    version: u64,
    /// The version on disk, which the commit module sets after each save: a version above it is
    /// unsaved (a save failed, or is under way), and the background retry saves it.
    pub(crate) saved: Arc<std::sync::atomic::AtomicU64>,
    /// The durable state as of `version`.
    durable: Durable,
    /// The counters the published snapshot was made at ([`crate::published`]).
    pub(crate) published_at: PublishedAt,
}

/// The durable state as of the manager's version: the policy's snapshot and the claim records,
/// with the counters they were taken at.
#[derive(Debug)]
struct Durable {
    snapshot: serde_json::Value,
    records: BTreeMap<String, PreparedClaim>,
    /// The policy's durable counter ([`policy::Generations::durable`]); `None`: it keeps none.
    policy: Option<u64>,
    records_generation: u64,
}

/// The counters the published snapshot was made at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PublishedAt {
    /// The policy's devices counter; `None`: it keeps none.
    pub(crate) devices: Option<u64>,
    pub(crate) records: u64,
}

impl Inner {
    /// Takes note of what the calls since the last note changed: if the policy's durable state
    /// or the records changed, that is a new version, returned for
    /// [`crate::commit::Change`]; `None` if nothing durable changed.
    ///
    /// Changes are told by counters ([`policy::Policy::generations`], [`Records::generation`]):
    /// nothing is serialized or copied to find out, so an event that changed nothing durable
    /// costs nothing here. Only a policy that keeps no counter has its snapshot taken and
    /// compared after every mutating call.
    pub(crate) fn note_changes(&mut self) -> Option<u64> {
        let counted = self.policy.generations().durable;
        let records_changed = self.records.generation() != self.durable.records_generation;
        let snapshot = match counted {
            Some(now) if Some(now) == self.durable.policy => None,
            Some(_) => Some(self.policy.snapshot()),
            None => Some(self.policy.snapshot()).filter(|s| *s != self.durable.snapshot),
        };
        if snapshot.is_none() && !records_changed {
            return None;
        }
        if let Some(snapshot) = snapshot {
            self.durable.snapshot = snapshot;
            self.durable.policy = counted;
        }
        if records_changed {
            self.durable.records = (*self.records).clone();
            self.durable.records_generation = self.records.generation();
        }
        self.version += 1;
        Some(self.version)
    }

    /// The newest version if it is not on disk yet (an earlier save failed, or one is under
    /// way): what a claim's commit and the background retry save
    /// ([`crate::commit::Manager::retry_once`]).
    pub(crate) fn unsaved(&self) -> Option<u64> {
        (self.version > self.saved.load(std::sync::atomic::Ordering::Acquire))
            .then_some(self.version)
    }

    /// Notes changes ([`Inner::note_changes`]) and returns the version that includes every
    /// change so far, whoever made it.
    pub(crate) fn current_version(&mut self) -> u64 {
        self.note_changes();
        self.version
    }

    /// The newest durable state and its version.
    pub(crate) fn durable_state(&self) -> (u64, State) {
        let state = State {
            version: STATE_VERSION,
            policy: self.policy.name().to_owned(),
            policy_state: self.durable.snapshot.clone(),
            claims: self.durable.records.clone(),
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

/// The resource manager.
#[derive(Debug)]
pub struct Manager {
    /// Reached only through [`Manager::with_lock`].
    inner: Mutex<Inner>,
    /// What readers see ([`crate::published`]).
    published: watch::Sender<Arc<Published>>,
    /// The disk and the runtime, reached only through [`crate::commit`].
    pub(crate) io: Io,
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
        let records = Records::new(records);
        let generations = policy.generations();
        let durable = Durable {
            snapshot: policy.snapshot(),
            records: (*records).clone(),
            policy: generations.durable,
            records_generation: records.generation(),
        };
        let saved = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let published = watch::Sender::new(Arc::new(Published::of(policy.as_ref(), &records)));
        let published_at = PublishedAt {
            devices: generations.devices,
            records: records.generation(),
        };
        Ok(Self {
            published,
            inner: Mutex::new(Inner {
                policy,
                records,
                pending: PendingUpdates::default(),
                reconcile,
                version: 0,
                saved: saved.clone(),
                durable,
                published_at,
            }),
            io: Io::new(
                Disk::new(state_file, specs, config.faults.clone()),
                runtime,
                config.update_timeout,
                saved,
            ),
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

    /// Runs `f` with the manager lock held, and lets the lock go when `f` returns: the one way
    /// to the manager's state.
    ///
    /// `f` is a plain closure, so nothing can be awaited while the lock is held, and every IO
    /// of the manager is awaited (the state file, CDI specs, the runtime: [`crate::commit`]);
    /// the guard's lifetime is `f`'s own, so it cannot leave `f`, in what `f` returns or
    /// otherwise. So holding the lock across IO does not compile.
    ///
    /// Public only for the examples below, which are the tests of that (a doc test, like a
    /// `trybuild` case, sees only the public API): outside this crate the guard ([`Guard`]) can
    /// be held but not used. The IO they try is the state's save, the one that is public; the
    /// spec IO is crate-private, and awaited like it. The first is refused by the closure not
    /// being async; the other two, by the guard's lifetime being `f`'s (given `f` a guard that
    /// outlives it, they compile).
    ///
    /// None of these compiles: awaiting IO with the lock held,
    ///
    /// ```compile_fail
    /// # async fn f(manager: &resmgr::Manager) {
    /// manager.with_lock(|_guard| manager.save_state().await).await;
    /// # }
    /// ```
    ///
    /// returning a future that holds the guard, to await once `f` has returned,
    ///
    /// ```compile_fail
    /// # async fn f(manager: &resmgr::Manager) {
    /// let save = manager
    ///     .with_lock(|guard| async move {
    ///         let _held = guard;
    ///         manager.save_state().await
    ///     })
    ///     .await;
    /// save.await.unwrap();
    /// # }
    /// ```
    ///
    /// or keeping the guard outside `f`:
    ///
    /// ```compile_fail
    /// # async fn f(manager: &resmgr::Manager) {
    /// let mut held = None;
    /// manager.with_lock(|guard| held = Some(guard)).await;
    /// manager.save_state().await.unwrap();
    /// drop(held);
    /// # }
    /// ```
    ///
    /// The same code without the guard held across the save compiles (so the examples above
    /// fail for that alone):
    ///
    /// ```
    /// # async fn f(manager: &resmgr::Manager) {
    /// // A future made under the lock and awaited after it.
    /// manager.with_lock(|_guard| manager.save_state()).await.await.unwrap();
    /// // A future that does not hold the guard.
    /// let save = manager
    ///     .with_lock(|_guard| async move { manager.save_state().await })
    ///     .await;
    /// save.await.unwrap();
    /// // Something else kept outside.
    /// let mut held = None;
    /// manager.with_lock(|_guard| held = Some(())).await;
    /// manager.save_state().await.unwrap();
    /// drop(held);
    /// # }
    /// ```
    #[doc(hidden)]
    pub async fn with_lock<R>(&self, f: impl FnOnce(Guard<'_>) -> R) -> R {
        f(Guard::new(self.inner.lock().await, &self.published))
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
    /// How many containers have updates pending.
    pub async fn pending_updates(&self) -> usize {
        self.with_lock(|inner| inner.pending.len()).await
    }

    /// Every prepared claim's record, by UID: what `/debug/state` shows.
    pub async fn claim_records(&self) -> std::collections::BTreeMap<String, PreparedClaim> {
        self.with_lock(|inner| (*inner.records).clone()).await
    }

    /// What the policy has placed where, now ([`Policy::inventory`]): for metrics, debugging
    /// and the simulator. It takes the lock, briefly: an inventory grows with what runs on the
    /// node, so it is made when a reader asks (a scrape, a debug request), not at every change.
    pub async fn inventory(&self) -> policy::Inventory {
        self.with_lock(|inner| inner.policy.inventory()).await
    }
}
