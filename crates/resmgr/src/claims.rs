//! The claim lifecycle: prepare = allocate, commit, write the device metadata and then the spec;
//! unprepare = remove the spec and then the device metadata, release, commit.
//!
//! # Why this order
//!
//! At every instant, including any crash point, a CDI spec on disk belongs to a claim that the
//! committed state accounts for, and no container is granted CPUs that are accounted to nobody:
//! the spec, which is what grants a claim's CPUs to a container, is written only after the claim
//! is on disk, and removed before the claim leaves the disk. The worst a crash leaves is a claim
//! accounted for without a spec, which the kubelet's retry of prepare (which rewrites the spec)
//! or unprepare (which finishes the release) resolves.
//!
//! # Concurrency
//!
//! The kubelet calls us concurrently: one call per pod, a shared claim prepared by each of its
//! pods, a retry after its deadline while the first call still runs (calls run to the end in
//! tasks of their own, [`crate::dra_handler`]). Prepares and unprepares of *one* claim run one at
//! a time, in arrival order ([`crate::claim_locks`]): each step's decision (is a spec there, did this
//! call create the allocation) then stays true until the call ends. Calls for different claims
//! interleave freely; they share only the manager lock (in-memory work), the save lock and the
//! delivery lock.
//!
//! A prepare waits only for the updates that move containers off the claim's CPUs: those its
//! own allocation made, and those of any container that may still run there because an earlier
//! update never arrived ([`crate::pending`]). Other commits' updates, and a container the runtime
//! refuses that may not run on the claim's CPUs, do not fail it; they stay pending, retried in
//! the background and counted in the pending-updates metric. A container that may run on the
//! claim's CPUs and that the runtime does not confirm does fail it: until the runtime says
//! otherwise, it may still run where the spec would grant. A runtime that is only slow to answer
//! (a busy node) is waited for, up to [`crate::core::SETTLE_WAIT`], before that.
//!
//! # Failures
//!
//! A spec proves that a prepare completed. A failed prepare rolls the allocation back only if
//! this very call created it (the policy did not hold the claim when the call began) and no spec
//! of it is on disk, both checked under the claim's lock; after a failed spec write, whose file
//! may have landed (the directory's fsync can fail after the rename), the spec is removed first,
//! and if that fails the claim stays allocated: a spec on disk must stay accounted for. Once the
//! claim was held before, a pod may be using its CPUs, and because allocation is idempotent and
//! release releases the whole claim, rolling back would take CPUs from under it.
//!
//! Prepare always asks the policy, even when a spec exists, and rewrites the spec: the CDI
//! directory is often a tmpfs that a reboot emptied while the kubelet re-prepares. Unprepare of a
//! claim we do not know, or whose spec is gone, is success without writing anything, and a
//! retried unprepare still finishes a release and commit that a crash or a failed save
//! interrupted.
//!
//! Errors are per claim, in the kubelet's per-claim answer, naming the claim and the step: the
//! kubelet records and retries per claim. Only what is wrong with the whole request (the gate is
//! closed, a malformed UID that cannot key an answer) fails the whole request.

// Blocking IO under the manager lock does not pass clippy (crates/resmgr/clippy.toml).
#![deny(clippy::disallowed_methods)]

use std::collections::BTreeMap;

use cdi::{ClaimUid, ContainerEdits, StoreError};
use kube_dra::ClaimReadError;
use kubelet_plugin::ClaimRef;
use policy::{Claim, PolicyError};
use stdx::errors::chain;
use tokio::{
    sync::RwLockReadGuard,
    time::{Duration, Instant},
};
use tracing::{info, warn};

use crate::{
    core::{Change, CommitError, DeliveryError},
    faults::Point,
    manager::Manager,
    state::{DeviceRecord, PreparedClaim, StateError},
};

/// How long a kubelet call that arrives before the runtime's synchronization has been handled
/// is held before it is refused: well under the kubelet's 45 s per call, with room for the
/// prepare's own wait for containers the runtime is starting ([`crate::core::SETTLE_WAIT`],
/// 10 s). The agent normally synchronizes within a second of connecting to the runtime; a
/// runtime that restarts with the agent takes a few more.
pub const HOLD: Duration = Duration::from_secs(30);

/// Why a whole request was not admitted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AdmitError {
    /// The runtime's synchronization has not completed within [`HOLD`] of the call's arrival;
    /// the kubelet retries.
    #[error(
        "cannot serve claims yet: the container runtime has not synchronized with the agent (the call was held {}s)",
        HOLD.as_secs()
    )]
    NotSynchronized,
    /// The node was handed over to the agent of this pod ([`crate::handover`]); it serves the
    /// claims now.
    #[error("this agent handed the node over to the agent of pod {0}")]
    HandedOver(String),
    /// A handover of the node was still under way [`HOLD`] after the call arrived; the kubelet
    /// retries.
    #[error(
        "cannot serve claims now: this agent is handing the node over (the call was held {}s)",
        HOLD.as_secs()
    )]
    HandingOver,
    /// A CDI spec that a running container uses grants CPUs another claim holds: preparing
    /// claims could grant the same CPUs twice ([`crate::reconcile`]). Unprepares are served.
    #[error("cannot serve claims: {0}")]
    Contested(String),
    /// The request is malformed.
    #[error("invalid request: {0}")]
    InvalidArgument(String),
}

/// Why one claim failed: the claim, the step, the cause (in [`std::error::Error::source`]), and
/// for a failed prepare what became of its allocation.
#[derive(Debug, thiserror::Error)]
#[error("claim {claim}: {step}{}", undo.as_ref().map(|u| format!(" ({u})")).unwrap_or_default())]
pub struct LifecycleError {
    /// The claim.
    pub claim: ClaimRef,
    /// The step that failed.
    pub step: Step,
    /// What the failed prepare did with the allocation; `None` for an unprepare, or when
    /// nothing was allocated.
    pub undo: Option<Undo>,
    /// The cause.
    #[source]
    pub cause: Cause,
}

/// A step of prepare or unprepare.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Step {
    /// Reading the ResourceClaim from the API server.
    #[error("reading the claim")]
    ReadingClaim,
    /// The policy allocating the claim.
    #[error("allocating")]
    Allocating,
    /// Naming the claim's CDI devices.
    #[error("naming CDI devices")]
    NamingDevices,
    /// Commit step 1: saving the state.
    #[error("saving the state")]
    SavingState,
    /// Commit step 2: delivering the updates that move containers off the claim's CPUs.
    #[error("updating containers")]
    UpdatingContainers,
    /// Writing the claim's device metadata ([`crate::metadata`]).
    #[error("writing the device metadata")]
    WritingMetadata,
    /// Writing the claim's CDI spec.
    #[error("writing the CDI spec")]
    WritingSpec,
    /// Removing the claim's CDI spec.
    #[error("removing the CDI spec")]
    RemovingSpec,
    /// Removing the claim's device metadata.
    #[error("removing the device metadata")]
    RemovingMetadata,
    /// The policy releasing the claim.
    #[error("releasing")]
    Releasing,
}

/// What failed underneath a step.
#[derive(Debug, thiserror::Error)]
pub enum Cause {
    /// The API server.
    #[error(transparent)]
    Claim(#[from] ClaimReadError),
    /// The policy.
    #[error(transparent)]
    Policy(#[from] PolicyError),
    /// The policy's allocation does not fit the claim.
    #[error("the policy returned {edits} edits for {results} allocation results")]
    Edits {
        /// Edits returned.
        edits: usize,
        /// Allocation results of the claim.
        results: usize,
    },
    /// A CDI name.
    #[error(transparent)]
    Name(#[from] cdi::NameError),
    /// A claim UID.
    #[error(transparent)]
    Uid(#[from] cdi::UidError),
    /// The state file.
    #[error(transparent)]
    State(#[from] StateError),
    /// The runtime.
    #[error(transparent)]
    Delivery(#[from] DeliveryError),
    /// The CDI spec store.
    #[error(transparent)]
    Spec(#[from] StoreError),
    /// The device metadata.
    #[error(transparent)]
    Metadata(#[from] crate::metadata::MetadataError),
}

impl From<CommitError> for (Step, Cause) {
    fn from(e: CommitError) -> Self {
        match e {
            CommitError::Save(e) => (Step::SavingState, e.into()),
            CommitError::Deliver(e) => (Step::UpdatingContainers, e.into()),
        }
    }
}

/// What a failed prepare did with the claim's allocation.
#[derive(Debug, thiserror::Error)]
pub enum Undo {
    /// The claim was held before this call: a pod may be using its CPUs.
    #[error("the claim stays allocated: it was prepared before")]
    PreparedBefore,
    /// A spec of it is on disk, and a spec on disk must stay accounted for.
    #[error("the claim stays allocated: a spec of it is on disk")]
    SpecOnDisk,
    /// Whether a spec of it is on disk cannot be told.
    #[error("the claim stays allocated: its spec may be on disk ({})", chain(.0))]
    SpecMayBeOnDisk(StoreError),
    /// Rolled back and saved.
    #[error("the allocation was rolled back")]
    RolledBack,
    /// Rolled back in memory; the save failed, so the claim stays on disk without a spec until
    /// the next save or the kubelet's retry.
    #[error("the allocation was rolled back in memory; saving that failed")]
    RolledBackNotSaved,
    /// The policy could not release it.
    #[error("rolling the allocation back failed too: {0}")]
    Failed(PolicyError),
}

/// Which kubelet call a request is, for the gate ([`Manager::admit`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Call {
    Prepare,
    Unprepare,
}

/// Per-claim answers, keyed by claim UID.
pub type ClaimAnswers<T> = BTreeMap<String, Result<T, LifecycleError>>;

impl Manager {
    /// Prepares claims, answering each on its own; held until the runtime has synchronized, up
    /// to [`HOLD`].
    pub async fn prepare(
        &self,
        claims: &[ClaimRef],
    ) -> Result<ClaimAnswers<Vec<DeviceRecord>>, AdmitError> {
        self.prepare_until(claims, Instant::now() + HOLD).await
    }

    /// [`Manager::prepare`], held until `deadline` at most.
    pub async fn prepare_until(
        &self,
        claims: &[ClaimRef],
        deadline: Instant,
    ) -> Result<ClaimAnswers<Vec<DeviceRecord>>, AdmitError> {
        let _call = self.admit(claims, Call::Prepare, deadline).await?;
        let mut answers = BTreeMap::new();
        for claim in claims {
            let answer = self.prepare_one(claim).await;
            match &answer {
                Ok(devices) => {
                    info!(claim = %claim, devices = ?devices.iter().map(|d| &d.device).collect::<Vec<_>>(), "claim prepared")
                }
                Err(e) => warn!(error = %chain(e), "claim not prepared"),
            }
            answers.insert(claim.uid.clone(), answer);
        }
        Ok(answers)
    }

    /// Unprepares claims, answering each on its own; held until the runtime has synchronized,
    /// up to [`HOLD`].
    pub async fn unprepare(&self, claims: &[ClaimRef]) -> Result<ClaimAnswers<()>, AdmitError> {
        self.unprepare_until(claims, Instant::now() + HOLD).await
    }

    /// [`Manager::unprepare`], held until `deadline` at most.
    pub async fn unprepare_until(
        &self,
        claims: &[ClaimRef],
        deadline: Instant,
    ) -> Result<ClaimAnswers<()>, AdmitError> {
        let _call = self.admit(claims, Call::Unprepare, deadline).await?;
        let mut answers = BTreeMap::new();
        for claim in claims {
            let answer = self.unprepare_one(claim).await;
            match &answer {
                Ok(()) => info!(claim = %claim, "claim released"),
                Err(e) => warn!(error = %chain(e), "claim not released"),
            }
            answers.insert(claim.uid.clone(), answer);
        }
        Ok(answers)
    }

    /// Admits a request: holds it until the runtime has synchronized (up to `deadline`), and
    /// refuses a request naming a malformed UID (which could not key its answer, and must not
    /// get near a file name), a prepare while a claim is contested, and any request once the
    /// node was handed over. Returns the call's share of the manager's claim calls, which a
    /// handover waits for ([`Manager::hand_over`]).
    ///
    /// An unprepare is served while a claim is contested: it only gives CPUs back, and it is how
    /// the kubelet lets go of a claim whose pods are gone, which may be the very claim a
    /// contested spec's CPUs are held by. Refusing it would keep the contest for good.
    async fn admit(
        &self,
        claims: &[ClaimRef],
        call: Call,
        deadline: Instant,
    ) -> Result<RwLockReadGuard<'_, ()>, AdmitError> {
        for claim in claims {
            ClaimUid::new(&claim.uid)
                .map_err(|e| AdmitError::InvalidArgument(format!("claim {claim}: {e}")))?;
        }
        let share = loop {
            if tokio::time::timeout_at(deadline, self.gate.settled())
                .await
                .is_err()
            {
                return Err(match self.gate.handing_over() {
                    true => AdmitError::HandingOver,
                    false => AdmitError::NotSynchronized,
                });
            }
            // Counted before the gate is looked at again, so that a handover that shuts it now
            // waits for this call, or this call sees it shut.
            let share = self.calls.read().await;
            // A handover begun since: held (without a share, which the handover waits for)
            // until it is done or called off.
            if !self.gate.handing_over() {
                break share;
            }
        };
        if let Some(to) = self.gate.handed_over_to() {
            return Err(AdmitError::HandedOver(to));
        }
        if self.gate.is_open() {
            return Ok(share);
        }
        match (self.gate.refusal(), call) {
            (Some(why), Call::Prepare) => Err(AdmitError::Contested(why)),
            (Some(_), Call::Unprepare) => Ok(share),
            // Settled, and neither open, refusing nor handed over: unreachable, refused safely.
            (None, _) => Err(AdmitError::NotSynchronized),
        }
    }

    /// Prepare's steps: allocate, commit, write the spec; on a failure after the allocation,
    /// one rollback path.
    async fn prepare_one(&self, claim_ref: &ClaimRef) -> Result<Vec<DeviceRecord>, LifecycleError> {
        let fail = |step: Step, cause: Cause, undo: Option<Undo>| LifecycleError {
            claim: claim_ref.clone(),
            step,
            undo,
            cause,
        };
        let uid = claim_ref.uid.as_str();
        let claim = self
            .claim_reader
            .get_claim(claim_ref)
            .await
            .map_err(|e| fail(Step::ReadingClaim, e.into(), None))?;
        if claim.results.is_empty() {
            info!(claim = %claim_ref, "no allocation results for this driver: nothing to prepare");
            return Ok(Vec::new());
        }
        let _turn = self.claim_locks.lock(uid).await;
        let Allocated { created, outcome } = self
            .allocate(claim_ref, &claim)
            .await
            .map_err(|e| fail(Step::Allocating, e.into(), None))?;
        let mut spec_attempted = false;
        let done = async {
            let (edits, attributes, devices, change) = outcome?;
            self.core
                .commit(change.at(Point::PrepareSaved, Point::PrepareDelivered))
                .await
                .map_err(<(Step, Cause)>::from)?;
            let edits = self
                .grant_metadata(&claim, &attributes, edits)
                .await
                .map_err(|e| (Step::WritingMetadata, e.into()))?;
            self.faults().crash_point(Point::PrepareMetadataWritten);
            spec_attempted = true;
            self.core
                .write_spec(uid, edits)
                .await
                .map_err(|e| (Step::WritingSpec, e.into()))?;
            self.faults().crash_point(Point::PrepareSpecWritten);
            Ok::<_, (Step, Cause)>(devices)
        }
        .await;
        match done {
            Ok(devices) => Ok(devices),
            Err((step, cause)) => {
                let undo = self.roll_back(claim_ref, created, spec_attempted).await;
                Err(fail(step, cause, Some(undo)))
            }
        }
    }

    /// Allocates claim `claim` in memory, under the lock, and records it: the change to commit,
    /// or why what the policy allocated cannot be answered (rolled back by the caller). Fails
    /// only if the policy allocated nothing.
    async fn allocate(
        &self,
        claim_ref: &ClaimRef,
        claim: &Claim,
    ) -> Result<Allocated, PolicyError> {
        let uid = claim_ref.uid.as_str();
        self.core
            .with_lock(|mut inner| {
                let created = !inner.records.contains_key(uid);
                let allocation = inner.policy.allocate_claim(claim)?;
                self.faults().crash_point(Point::PrepareAllocated);
                for warning in &allocation.warnings {
                    warn!(claim = %claim_ref, "{warning}");
                }
                let mut ticket = inner.record_pending(allocation.updates);
                // Also every container that may still run on the claim's CPUs and is not meant to,
                // moved away or not by this allocation (see crate::pending). A claim held before (an
                // earlier prepare failed and could not roll back, or it was prepared and is prepared
                // again) waits for them too: the allocation that moved them may be an earlier call's,
                // whose updates the runtime has not confirmed yet.
                let at_risk = match inner.policy.claim_cpus(uid) {
                    Some(cpus) => inner.pending.at_risk(&cpus),
                    None => inner.pending.displaced(),
                };
                ticket.extend(at_risk);
                let devices = if allocation.edits.len() == claim.results.len() {
                    self.devices(claim)
                        .map_err(|cause| (Step::NamingDevices, cause))
                } else {
                    Err((
                        Step::Allocating,
                        Cause::Edits {
                            edits: allocation.edits.len(),
                            results: claim.results.len(),
                        },
                    ))
                };
                let outcome = match devices {
                    Ok(devices) => {
                        inner.records.insert(
                            uid.to_owned(),
                            PreparedClaim {
                                namespace: claim.namespace.clone(),
                                name: claim.name.clone(),
                                devices: devices.clone(),
                                adopted: false,
                            },
                        );
                        inner.reconcile.confirm(uid);
                        Ok((
                            allocation.edits,
                            allocation.attributes,
                            devices,
                            inner.change_all(ticket).granting(),
                        ))
                    }
                    Err(e) => Err(e),
                };
                Ok(Allocated { created, outcome })
            })
            .await
    }

    /// The devices to answer, in allocation-result order.
    fn devices(&self, claim: &Claim) -> Result<Vec<DeviceRecord>, Cause> {
        let uid = ClaimUid::new(&claim.uid)?;
        claim
            .results
            .iter()
            .enumerate()
            .map(|(i, result)| {
                let id = cdi::claim::qualified_device_name(&self.config.driver, &uid, i)?;
                Ok(DeviceRecord {
                    request_names: vec![base_request_name(&result.request).to_owned()],
                    pool: result.pool.clone(),
                    device: result.device.clone(),
                    cdi_device_id: id.to_string(),
                    share_id: result.share_id.clone(),
                })
            })
            .collect()
    }

    /// Undoes a failed prepare, with the claim's lock held, if this call created the
    /// allocation and no spec of it is on disk (`spec_attempted`: a spec write was attempted, so
    /// the file may be there and is removed first).
    async fn roll_back(&self, claim: &ClaimRef, created: bool, spec_attempted: bool) -> Undo {
        let uid = claim.uid.as_str();
        if !created {
            return Undo::PreparedBefore;
        }
        let spec = if spec_attempted {
            self.core.remove_spec(uid).await.map(|_| false)
        } else {
            self.core.has_spec(uid).await
        };
        match spec {
            Ok(false) => {}
            Ok(true) => return Undo::SpecOnDisk,
            Err(e) => return Undo::SpecMayBeOnDisk(e),
        }
        // With no spec, nothing mounts it. Left behind, the next start removes it.
        if let Err(e) = self.core.remove_metadata(uid).await {
            warn!(claim = %claim, error = %chain(&e), "removing the device metadata of a rolled back prepare failed");
        }
        let released = self
            .core
            .with_lock(|mut inner| {
                let updates = inner.policy.release_claim(uid)?;
                inner.records.remove(uid);
                let ticket = inner.record_pending(updates);
                Ok(inner.change_all(ticket))
            })
            .await;
        let change = match released {
            Ok(change) => change,
            Err(e) => return Undo::Failed(e),
        };
        match self.core.commit(change).await {
            Ok(()) => Undo::RolledBack,
            Err(CommitError::Deliver(e)) => {
                // Retried in the background.
                warn!(claim = %claim, error = %chain(&e), "updates after a rollback are pending");
                Undo::RolledBack
            }
            Err(CommitError::Save(e)) => {
                // The claim stays on disk without a spec: the retry resolves it.
                warn!(claim = %claim, error = %chain(&e), "saving the rollback failed");
                Undo::RolledBackNotSaved
            }
        }
    }

    async fn unprepare_one(&self, claim: &ClaimRef) -> Result<(), LifecycleError> {
        let _turn = self.claim_locks.lock(&claim.uid).await;
        self.unprepare_steps(claim).await
    }

    /// Unprepare's steps, with the claim's lock held: remove the spec, release, commit.
    pub(crate) async fn unprepare_steps(&self, claim: &ClaimRef) -> Result<(), LifecycleError> {
        let fail = |step: Step, cause: Cause| LifecycleError {
            claim: claim.clone(),
            step,
            undo: None,
            cause,
        };
        let uid = claim.uid.as_str();
        self.core
            .remove_spec(uid)
            .await
            .map_err(|e| fail(Step::RemovingSpec, e.into()))?;
        self.faults().crash_point(Point::UnprepareSpecRemoved);
        self.core
            .remove_metadata(uid)
            .await
            .map_err(|e| fail(Step::RemovingMetadata, e.into()))?;
        self.faults().crash_point(Point::UnprepareMetadataRemoved);
        let change = self
            .core
            .with_lock(|mut inner| {
                let updates = inner.policy.release_claim(uid)?;
                self.faults().crash_point(Point::UnprepareReleased);
                inner.records.remove(uid);
                inner.reconcile.forget(uid);
                let ticket = inner.record_pending(updates);
                Ok(inner.change_all(ticket))
            })
            .await
            .map_err(|e: PolicyError| fail(Step::Releasing, e.into()))?;
        // A claim already gone changed nothing: nothing is written, so a read-only or full
        // state directory does not fail it. A release not saved yet (an earlier attempt failed)
        // is saved now. Containers growing back onto its CPUs is not urgent: what is not
        // delivered now is retried in the background.
        match self
            .core
            .commit(change.at(Point::UnprepareSaved, Point::UnprepareDelivered))
            .await
        {
            Ok(()) => Ok(()),
            Err(CommitError::Save(e)) => Err(fail(Step::SavingState, e.into())),
            Err(CommitError::Deliver(e)) => {
                warn!(claim = %claim, error = %chain(&e), "updates after releasing a claim are pending");
                self.faults().crash_point(Point::UnprepareDelivered);
                Ok(())
            }
        }
    }

    /// What was answered for a prepared claim, if it is prepared.
    pub async fn claim_record(&self, uid: &str) -> Option<PreparedClaim> {
        self.core
            .with_lock(|inner| inner.records.get(uid).cloned())
            .await
    }
}

/// What [`Manager::allocate`] did: whether this call created the allocation, and the change to
/// commit with the spec's edits and the devices to answer, or why they cannot be answered.
struct Allocated {
    created: bool,
    outcome: Result<Recorded, (Step, Cause)>,
}

/// A claim allocated and recorded: the spec's edits, each result's attributes for its device
/// metadata, the devices to answer, the change to commit.
type Recorded = (
    Vec<ContainerEdits>,
    Vec<BTreeMap<String, policy::AttributeValue>>,
    Vec<DeviceRecord>,
    Change,
);

impl Manager {
    /// Prepare's step between the commit and the spec: writes claim `claim`'s device metadata
    /// durably and returns `edits` with each result's mount of it, or `edits` as they are
    /// without a metadata store.
    pub(crate) async fn grant_metadata(
        &self,
        claim: &Claim,
        attributes: &[BTreeMap<String, policy::AttributeValue>],
        edits: Vec<ContainerEdits>,
    ) -> Result<Vec<ContainerEdits>, crate::metadata::MetadataError> {
        let Some(store) = &self.config.metadata else {
            return Ok(edits);
        };
        let files = store.files(claim, attributes)?;
        self.core.write_metadata(&claim.uid, files).await?;
        store.with_mounts(claim, edits)
    }
}

/// `request/subrequest` → `request`: the kubelet matches devices to containers by base name.
fn base_request_name(request: &str) -> &str {
    request.split('/').next().unwrap_or(request)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strips_subrequests() {
        assert_eq!(base_request_name("cpus/big"), "cpus");
        assert_eq!(base_request_name("cpus"), "cpus");
    }
}
