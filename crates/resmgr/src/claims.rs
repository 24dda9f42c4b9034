//! The claim lifecycle: prepare = allocate, commit, write the spec; unprepare = remove the spec,
//! release, commit.
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
//! a time, in arrival order ([`ClaimLocks`]): each step's decision (is a spec there, did this
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
//! otherwise, it may still run where the spec would grant.
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

use std::{
    collections::{BTreeMap, HashMap},
    sync::{Arc, Weak},
};

use cdi::ClaimUid;
use kubelet_plugin::ClaimRef;
use policy::Claim;
use tokio::sync::{Mutex, OwnedMutexGuard};
use tracing::{info, warn};

use crate::{
    errors::chain,
    manager::Manager,
    state::{ClaimRecord, DeviceRecord},
};

/// One lock per claim UID in use, so that the prepares and unprepares of a claim run one at a
/// time, in the order they arrived (tokio's mutex is fair). Entries go when nobody holds or
/// waits for them.
#[derive(Debug, Default)]
pub(crate) struct ClaimLocks(std::sync::Mutex<HashMap<String, Weak<Mutex<()>>>>);

impl ClaimLocks {
    /// Waits for claim `uid`'s turn.
    pub(crate) async fn lock(&self, uid: &str) -> OwnedMutexGuard<()> {
        let lock = {
            let mut map = crate::sync::lock(&self.0);
            map.retain(|_, w| w.strong_count() > 0);
            if let Some(lock) = map.get(uid).and_then(Weak::upgrade) {
                lock
            } else {
                let lock = Arc::new(Mutex::new(()));
                map.insert(uid.to_owned(), Arc::downgrade(&lock));
                lock
            }
        };
        lock.lock_owned().await
    }
}

/// Why a whole request was not admitted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AdmitError {
    /// The runtime's synchronization has not completed yet; the kubelet retries.
    #[error("cannot serve claims yet: still synchronizing with the container runtime")]
    NotSynchronized,
    /// A CDI spec that a running container uses grants CPUs another claim holds: serving claims
    /// could grant the same CPUs twice ([`crate::reconcile`]).
    #[error("cannot serve claims: {0}")]
    Contested(String),
    /// The request is malformed.
    #[error("invalid request: {0}")]
    InvalidArgument(String),
}

/// Why one claim failed: the claim, the step, the cause.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("claim {claim}: {step}: {cause}")]
pub struct LifecycleError {
    /// The claim.
    pub claim: ClaimRef,
    /// The step that failed.
    pub step: &'static str,
    /// The cause, with its chain.
    pub cause: String,
}

/// Per-claim answers, keyed by claim UID.
pub type ClaimAnswers<T> = BTreeMap<String, Result<T, LifecycleError>>;

impl Manager {
    /// Prepares claims, answering each on its own.
    pub async fn prepare(
        &self,
        claims: &[ClaimRef],
    ) -> Result<ClaimAnswers<Vec<DeviceRecord>>, AdmitError> {
        self.admit(claims)?;
        let mut answers = BTreeMap::new();
        for claim in claims {
            let answer = self.prepare_one(claim).await;
            match &answer {
                Ok(devices) => {
                    info!(claim = %claim, devices = ?devices.iter().map(|d| &d.device).collect::<Vec<_>>(), "claim prepared")
                }
                Err(e) => warn!(error = %e, "claim not prepared"),
            }
            answers.insert(claim.uid.clone(), answer);
        }
        Ok(answers)
    }

    /// Unprepares claims, answering each on its own.
    pub async fn unprepare(&self, claims: &[ClaimRef]) -> Result<ClaimAnswers<()>, AdmitError> {
        self.admit(claims)?;
        let mut answers = BTreeMap::new();
        for claim in claims {
            let answer = self.unprepare_one(claim).await;
            match &answer {
                Ok(()) => info!(claim = %claim, "claim released"),
                Err(e) => warn!(error = %e, "claim not released"),
            }
            answers.insert(claim.uid.clone(), answer);
        }
        Ok(answers)
    }

    /// Refuses a request before the gate opens, or one naming a malformed UID (which could not
    /// key its answer, and must not get near a file name).
    fn admit(&self, claims: &[ClaimRef]) -> Result<(), AdmitError> {
        for claim in claims {
            ClaimUid::new(&claim.uid)
                .map_err(|e| AdmitError::InvalidArgument(format!("claim {claim}: {e}")))?;
        }
        if !self.gate.is_open() {
            return Err(match crate::sync::lock(&self.contested).clone() {
                Some(why) => AdmitError::Contested(why),
                None => AdmitError::NotSynchronized,
            });
        }
        Ok(())
    }

    async fn prepare_one(&self, claim_ref: &ClaimRef) -> Result<Vec<DeviceRecord>, LifecycleError> {
        let fail = |step: &'static str, cause: String| LifecycleError {
            claim: claim_ref.clone(),
            step,
            cause,
        };
        let uid = claim_ref.uid.as_str();
        let claim = self
            .claim_reader
            .get_claim(claim_ref)
            .await
            .map_err(|e| fail("reading the claim", chain(&e)))?;
        if claim.results.is_empty() {
            info!(claim = %claim_ref, "no allocation results for this driver: nothing to prepare");
            return Ok(Vec::new());
        }
        let _turn = self.claim_locks.lock(uid).await;

        // Allocate, in memory, under the lock.
        let (edits, devices, created, ticket, version) = {
            let mut inner = self.lock().await;
            let created = !inner.records.contains_key(uid);
            let allocation = inner
                .policy
                .allocate_claim(&claim)
                .map_err(|e| fail("allocating", e.to_string()))?;
            self.faults().crash_point("prepare.allocated");
            for warning in &allocation.warnings {
                warn!(claim = %claim_ref, "{warning}");
            }
            let mut ticket = self.record_pending(&mut inner, allocation.updates);
            if created {
                // Also every container that may still run on the claim's CPUs, moved away or not
                // by this allocation (see crate::pending).
                let at_risk = match inner.policy.claim_cpus(uid) {
                    Some(cpus) => inner.pending.at_risk(&cpus),
                    None => inner.pending.displaced(),
                };
                ticket.extend(at_risk);
            }
            let devices = if allocation.edits.len() == claim.results.len() {
                self.devices(&claim)
                    .map_err(|cause| ("naming CDI devices", cause))
            } else {
                Err((
                    "allocating",
                    format!(
                        "the policy returned {} edits for {} allocation results",
                        allocation.edits.len(),
                        claim.results.len()
                    ),
                ))
            };
            match devices {
                Ok(devices) => {
                    inner.records.insert(
                        uid.to_owned(),
                        ClaimRecord {
                            namespace: claim.namespace.clone(),
                            name: claim.name.clone(),
                            devices: devices.clone(),
                            adopted: false,
                        },
                    );
                    inner.reconcile.confirm(uid);
                    let version = inner.current_version();
                    (allocation.edits, devices, created, ticket, version)
                }
                Err((step, cause)) => {
                    drop(inner);
                    let undo = self.roll_back(claim_ref, created, false).await;
                    return Err(fail(step, format!("{cause}; {undo}")));
                }
            }
        };

        // Commit step 1: the claim is on disk before anything grants it.
        if let Err(e) = self.persist(version).await {
            let undo = self.roll_back(claim_ref, created, false).await;
            return Err(fail("saving the state", format!("{}; {undo}", chain(&e))));
        }
        self.faults().crash_point("prepare.saved");

        // Commit step 2: the containers the allocation moved off the claim's CPUs have moved.
        if let Err(e) = self.deliver_ticket(&ticket).await {
            let undo = self.roll_back(claim_ref, created, false).await;
            return Err(fail("updating containers", format!("{e}; {undo}")));
        }
        self.faults().crash_point("prepare.delivered");

        // The spec, last.
        if let Err(e) = self.disk.write_spec(uid, edits).await {
            let undo = self.roll_back(claim_ref, created, true).await;
            return Err(fail(
                "writing the CDI spec",
                format!("{}; {undo}", chain(&e)),
            ));
        }
        self.faults().crash_point("prepare.spec-written");
        Ok(devices)
    }

    /// The devices to answer, in allocation-result order.
    fn devices(&self, claim: &Claim) -> Result<Vec<DeviceRecord>, String> {
        let uid = ClaimUid::new(&claim.uid).map_err(|e| e.to_string())?;
        claim
            .results
            .iter()
            .enumerate()
            .map(|(i, result)| {
                let id = cdi::claim::qualified_device_name(&self.config.driver, &uid, i)
                    .map_err(|e| chain(&e))?;
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
    /// allocation and no spec of it is on disk (`spec_written`: a spec write was attempted, so
    /// the file may be there and is removed first); says what it did.
    async fn roll_back(&self, claim: &ClaimRef, created: bool, spec_written: bool) -> String {
        let uid = claim.uid.as_str();
        if !created {
            return "the claim stays allocated: it was prepared before".into();
        }
        let spec = if spec_written {
            self.disk.remove_spec(uid).await.map(|_| false)
        } else {
            self.disk.has_spec(uid).await
        };
        match spec {
            Ok(false) => {}
            Ok(true) => return "the claim stays allocated: a spec of it is on disk".into(),
            Err(e) => {
                return format!(
                    "the claim stays allocated: its spec may be on disk ({})",
                    chain(&e)
                );
            }
        }
        let (ticket, version) = {
            let mut inner = self.lock().await;
            match inner.policy.release_claim(uid) {
                Ok(updates) => {
                    inner.records.remove(uid);
                    let ticket = self.record_pending(&mut inner, updates);
                    (ticket, inner.current_version())
                }
                Err(e) => return format!("rolling the allocation back failed too: {e}"),
            }
        };
        let said = match self.persist(version).await {
            Ok(()) => "the allocation was rolled back".into(),
            Err(e) => {
                // The claim stays on disk without a spec: the retry resolves it.
                warn!(claim = %claim, error = %chain(&e), "saving the rollback failed");
                "the allocation was rolled back in memory; saving that failed".into()
            }
        };
        // What is not delivered now is retried in the background.
        if let Err(e) = self.deliver_ticket(&ticket).await {
            warn!(claim = %claim, error = %e, "updates after a rollback are pending");
        }
        said
    }

    async fn unprepare_one(&self, claim: &ClaimRef) -> Result<(), LifecycleError> {
        let _turn = self.claim_locks.lock(&claim.uid).await;
        self.unprepare_steps(claim).await
    }

    /// Unprepare's steps, with the claim's lock held: remove the spec, release, commit.
    pub(crate) async fn unprepare_steps(&self, claim: &ClaimRef) -> Result<(), LifecycleError> {
        let fail = |step: &'static str, cause: String| LifecycleError {
            claim: claim.clone(),
            step,
            cause,
        };
        let uid = claim.uid.as_str();
        self.disk
            .remove_spec(uid)
            .await
            .map_err(|e| fail("removing the CDI spec", chain(&e)))?;
        self.faults().crash_point("unprepare.spec-removed");
        let (ticket, version) = {
            let mut inner = self.lock().await;
            let updates = inner
                .policy
                .release_claim(uid)
                .map_err(|e| fail("releasing", e.to_string()))?;
            self.faults().crash_point("unprepare.released");
            inner.records.remove(uid);
            inner.reconcile.forget(uid);
            let ticket = self.record_pending(&mut inner, updates);
            (ticket, inner.current_version())
        };
        // A claim already gone changed nothing: nothing is written, so a read-only or full
        // state directory does not fail it. A release not saved yet (an earlier attempt failed)
        // is saved now.
        self.persist(version)
            .await
            .map_err(|e| fail("saving the state", chain(&e)))?;
        self.faults().crash_point("unprepare.saved");
        // The release is committed; containers growing back onto its CPUs is not urgent, and
        // what is not delivered now is retried in the background.
        if let Err(e) = self.deliver_ticket(&ticket).await {
            warn!(claim = %claim, error = %e, "updates after releasing a claim are pending");
        }
        self.faults().crash_point("unprepare.delivered");
        Ok(())
    }

    /// What was answered for a prepared claim, if it is prepared.
    pub async fn claim_record(&self, uid: &str) -> Option<ClaimRecord> {
        self.lock().await.records.get(uid).cloned()
    }
}

/// `request/subrequest` → `request`: the kubelet matches devices to containers by base name.
fn base_request_name(request: &str) -> &str {
    request.split('/').next().unwrap_or(request)
}

#[cfg(test)]
mod tests {
    use futures::FutureExt;

    use super::*;

    #[test]
    fn strips_subrequests() {
        assert_eq!(base_request_name("cpus/big"), "cpus");
        assert_eq!(base_request_name("cpus"), "cpus");
    }

    fn entries(locks: &ClaimLocks) -> Vec<String> {
        let mut uids: Vec<String> = crate::sync::lock(&locks.0).keys().cloned().collect();
        uids.sort();
        uids
    }

    #[tokio::test]
    async fn a_claims_lock_entry_goes_when_nobody_holds_or_waits_for_it() {
        let locks = ClaimLocks::default();
        let held = locks.lock("u1").await;
        drop(locks.lock("u2").await);
        // u2's entry is dead now, u1's is held: the next lock keeps only live ones.
        let _u3 = locks.lock("u3").await;
        assert_eq!(entries(&locks), ["u1", "u3"]);
        drop(held);
        let _u1 = locks.lock("u1").await;
        assert_eq!(entries(&locks), ["u1", "u3"]);
        drop(_u1);
        let _u4 = locks.lock("u4").await;
        assert_eq!(
            entries(&locks),
            ["u3", "u4"],
            "a claim no call holds or waits for leaves no entry behind"
        );
    }

    #[tokio::test]
    async fn calls_for_one_claim_take_turns_and_other_claims_do_not_wait() {
        let locks = ClaimLocks::default();
        let first = locks.lock("u1").await;
        // Another claim's turn comes at once.
        let other = locks.lock("u2").now_or_never();
        assert!(other.is_some(), "u2 waited for u1's call");
        // The same claim's waits until the first call ends.
        let mut second = Box::pin(locks.lock("u1"));
        assert!(
            (&mut second).now_or_never().is_none(),
            "a second call on u1 ran while the first held it"
        );
        drop(first);
        assert!(
            second.now_or_never().is_some(),
            "u1's next call got no turn"
        );
    }
}
