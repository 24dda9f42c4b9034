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
//! # Failures
//!
//! A spec proves that a prepare completed. A failure part-way through a prepare rolls the
//! allocation back only while the claim had no spec when the prepare began: once a spec existed,
//! a pod may be using the claim's CPUs, and because allocation is idempotent and release releases
//! the whole claim, rolling back would take CPUs from under it.
//!
//! Prepare always asks the policy, even when a spec exists, and rewrites the spec: the CDI
//! directory is often a tmpfs that a reboot emptied while the kubelet re-prepares. Unprepare of a
//! claim we do not know, or whose spec is gone, is success, and a retried unprepare still finishes
//! a release and commit that a crash interrupted.
//!
//! Errors are per claim, in the kubelet's per-claim answer, naming the claim and the step: the
//! kubelet records and retries per claim. Only what is wrong with the whole request (the gate is
//! closed, a malformed UID that cannot key an answer) fails the whole request.

use std::collections::BTreeMap;

use cdi::ClaimUid;
use kubelet_plugin::ClaimRef;
use policy::Claim;
use tracing::{info, warn};

use crate::{
    crash::crash_point,
    errors::chain,
    manager::{Inner, Manager},
    state::{ClaimRecord, DeviceRecord},
};

/// Why a whole request was not admitted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AdmitError {
    /// The runtime's synchronization has not completed yet; the kubelet retries.
    #[error("cannot serve claims yet: still synchronizing with the container runtime")]
    NotSynchronized,
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
            return Err(AdmitError::NotSynchronized);
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

        // Allocate and commit step 1, under the lock.
        let (edits, devices, had_spec) = {
            let mut inner = self.lock().await;
            let had_spec = inner
                .specs
                .has_claim(uid)
                .map_err(|e| fail("checking for a CDI spec", chain(&e)))?;
            let allocation = inner
                .policy
                .allocate_claim(&claim)
                .map_err(|e| fail("allocating", e.to_string()))?;
            crash_point("prepare.allocated");
            for warning in &allocation.warnings {
                warn!(claim = %claim_ref, "{warning}");
            }
            self.record_pending(&mut inner, allocation.updates);
            if allocation.edits.len() != claim.results.len() {
                let undo = self.roll_back(&mut inner, claim_ref, had_spec);
                return Err(fail(
                    "allocating",
                    format!(
                        "the policy returned {} edits for {} allocation results; {undo}",
                        allocation.edits.len(),
                        claim.results.len()
                    ),
                ));
            }
            let devices = match self.devices(&claim) {
                Ok(devices) => devices,
                Err(cause) => {
                    let undo = self.roll_back(&mut inner, claim_ref, had_spec);
                    return Err(fail("naming CDI devices", format!("{cause}; {undo}")));
                }
            };
            inner.records.insert(
                uid.to_owned(),
                ClaimRecord {
                    namespace: claim.namespace.clone(),
                    name: claim.name.clone(),
                    devices: devices.clone(),
                },
            );
            if let Err(e) = inner.save() {
                let undo = self.roll_back(&mut inner, claim_ref, had_spec);
                return Err(fail("saving the state", format!("{}; {undo}", chain(&e))));
            }
            crash_point("prepare.saved");
            (allocation.edits, devices, had_spec)
        };

        // Commit step 2, outside the lock.
        if let Err(e) = self.deliver().await {
            let undo = self.roll_back(&mut *self.lock().await, claim_ref, had_spec);
            self.deliver_rollback().await;
            return Err(fail("updating containers", format!("{e}; {undo}")));
        }
        crash_point("prepare.delivered");

        // The spec, last, under the lock so that a concurrent unprepare cannot slip in between
        // the check and the write.
        let mut inner = self.lock().await;
        if !inner.records.contains_key(uid) {
            return Err(fail(
                "writing the CDI spec",
                "the claim was unprepared while it was being prepared".into(),
            ));
        }
        if let Err(e) = inner.specs.write_claim(uid, &edits) {
            let undo = self.roll_back(&mut inner, claim_ref, had_spec);
            drop(inner);
            self.deliver_rollback().await;
            return Err(fail(
                "writing the CDI spec",
                format!("{}; {undo}", chain(&e)),
            ));
        }
        crash_point("prepare.spec-written");
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

    /// Undoes a failed prepare if the claim had no spec when it began; says what it did.
    fn roll_back(&self, inner: &mut Inner, claim: &ClaimRef, had_spec: bool) -> String {
        if had_spec {
            return "the claim stays allocated: it was prepared before".into();
        }
        match inner.policy.release_claim(&claim.uid) {
            Ok(updates) => {
                inner.records.remove(&claim.uid);
                self.record_pending(inner, updates);
                match inner.save() {
                    Ok(()) => "the allocation was rolled back".into(),
                    Err(e) => {
                        // The claim stays on disk without a spec: the retry resolves it.
                        warn!(claim = %claim, error = %chain(&e), "saving the rollback failed");
                        "the allocation was rolled back in memory; saving that failed".into()
                    }
                }
            }
            Err(e) => format!("rolling the allocation back failed too: {e}"),
        }
    }

    /// Delivers what a rollback changed; what cannot be delivered is retried in the background.
    async fn deliver_rollback(&self) {
        if let Err(e) = self.deliver().await {
            warn!(error = %e, "updates after a rollback are pending");
        }
    }

    async fn unprepare_one(&self, claim: &ClaimRef) -> Result<(), LifecycleError> {
        let fail = |step: &'static str, cause: String| LifecycleError {
            claim: claim.clone(),
            step,
            cause,
        };
        {
            let mut inner = self.lock().await;
            inner
                .specs
                .remove_claim(&claim.uid)
                .map_err(|e| fail("removing the CDI spec", chain(&e)))?;
            crash_point("unprepare.spec-removed");
            let updates = inner
                .policy
                .release_claim(&claim.uid)
                .map_err(|e| fail("releasing", e.to_string()))?;
            crash_point("unprepare.released");
            inner.records.remove(&claim.uid);
            self.record_pending(&mut inner, updates);
            // A claim already gone changes nothing: it must not need a writable state directory.
            // One whose release was not saved yet (an earlier attempt failed) is saved now.
            inner
                .save_if_changed()
                .map_err(|e| fail("saving the state", chain(&e)))?;
            crash_point("unprepare.saved");
        }
        // The release is committed; containers growing back onto its CPUs is not urgent, and
        // what is not delivered now is retried in the background.
        if let Err(e) = self.deliver().await {
            warn!(claim = %claim, error = %e, "updates after releasing a claim are pending");
        }
        crash_point("unprepare.delivered");
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
    use super::*;

    #[test]
    fn strips_subrequests() {
        assert_eq!(base_request_name("cpus/big"), "cpus");
        assert_eq!(base_request_name("cpus"), "cpus");
    }
}
