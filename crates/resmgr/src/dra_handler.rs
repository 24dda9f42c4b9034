//! The claim lifecycle as the kubelet servers' [`ClaimHandler`].
//!
//! Each kubelet call runs in a task of its own. The kubelet abandons a call when its deadline
//! passes, and the server then drops the call's future; a lifecycle cut off part-way would be a
//! crash in miniature (safe, by the ordering, but leaving work for the retry). In its own task a
//! prepare or unprepare always runs to the end, and the kubelet's retry finds it done.
//!
//! A claim that fails to prepare is told to the [`EventRecorder`], for an Event on the claim and
//! its pods. A request refused as a whole is not: before the runtime has synchronized the kubelet
//! retries, and a malformed request names no claim to post on.

use std::sync::Arc;

use kube_dra::notices::{EventRecorder, NoEvents, Notice};
use kubelet_plugin::{
    ClaimError, ClaimHandler, ClaimRef, PrepareResults, PreparedDevice, RequestError,
    UnprepareResults,
};
use stdx::errors::chain;
use tokio::time::Instant;

use crate::{
    claims::{AdmitError, HOLD},
    manager::Manager,
};

/// The manager, serving the kubelet.
#[derive(Debug, Clone)]
pub struct LifecycleHandler {
    manager: Arc<Manager>,
    recorder: Arc<dyn EventRecorder>,
}

impl LifecycleHandler {
    /// A handler serving `manager`'s claim lifecycle. It posts no Kubernetes events until given a
    /// recorder ([`LifecycleHandler::with_recorder`]).
    pub fn new(manager: Arc<Manager>) -> Self {
        Self {
            manager,
            recorder: Arc::new(NoEvents),
        }
    }

    /// Tells `recorder` about every claim that fails to prepare.
    pub fn with_recorder(mut self, recorder: Arc<dyn EventRecorder>) -> Self {
        self.recorder = recorder;
        self
    }
}

/// The lifecycle's refusal of a whole request, as the gRPC status the kubelet gets.
fn refusal(e: AdmitError) -> RequestError {
    match e {
        AdmitError::NotSynchronized
        | AdmitError::Contested(_)
        | AdmitError::HandedOver(_)
        | AdmitError::HandingOver => RequestError::Unavailable(e.to_string()),
        AdmitError::InvalidArgument(_) => RequestError::InvalidArgument(e.to_string()),
    }
}

/// A lifecycle task that did not finish: its panic goes on in the caller, never an answer.
/// A panic is a bug that may have left the manager half-changed; answering `Internal` and
/// serving on would build every later answer on that. (In the agent a panic aborts the process
/// before it gets here: plugin-bin's `panics`.) A task cancelled because the runtime is shutting
/// down is `Unavailable`, which the kubelet retries.
fn lost(e: tokio::task::JoinError) -> RequestError {
    match e.try_into_panic() {
        Ok(panic) => std::panic::resume_unwind(panic),
        Err(e) => RequestError::Unavailable(format!("the claim lifecycle task was cancelled: {e}")),
    }
}

impl LifecycleHandler {
    /// The kubelet's prepare, held until the runtime has synchronized up to `deadline`
    /// ([`Manager::prepare_until`]).
    pub async fn prepare_until(
        &self,
        claims: &[ClaimRef],
        deadline: Instant,
    ) -> Result<PrepareResults, RequestError> {
        let manager = self.manager.clone();
        let claims = claims.to_vec();
        let answers = tokio::spawn(async move { manager.prepare_until(&claims, deadline).await })
            .await
            .map_err(lost)?
            .map_err(refusal)?;
        for e in answers.values().filter_map(|a| a.as_ref().err()) {
            self.recorder.record(Notice::ClaimNotPrepared {
                claim: e.claim.clone(),
                message: chain(e),
            });
        }
        Ok(answers
            .into_iter()
            .map(|(uid, answer)| {
                let answer = answer
                    .map(|devices| {
                        devices
                            .into_iter()
                            .map(|d| PreparedDevice {
                                request_names: d.request_names,
                                pool: d.pool,
                                device: d.device,
                                cdi_device_ids: vec![d.cdi_device_id],
                                share_id: d.share_id,
                            })
                            .collect()
                    })
                    .map_err(|e| ClaimError::new(chain(&e)));
                (uid, answer)
            })
            .collect())
    }

    /// The kubelet's unprepare, held until the runtime has synchronized up to `deadline`
    /// ([`Manager::unprepare_until`]).
    pub async fn unprepare_until(
        &self,
        claims: &[ClaimRef],
        deadline: Instant,
    ) -> Result<UnprepareResults, RequestError> {
        let manager = self.manager.clone();
        let claims = claims.to_vec();
        let answers = tokio::spawn(async move { manager.unprepare_until(&claims, deadline).await })
            .await
            .map_err(lost)?
            .map_err(refusal)?;
        Ok(answers
            .into_iter()
            .map(|(uid, answer)| (uid, answer.map_err(|e| ClaimError::new(chain(&e)))))
            .collect())
    }

    /// The manager it serves.
    pub fn manager(&self) -> &Arc<Manager> {
        &self.manager
    }
}

impl ClaimHandler for LifecycleHandler {
    async fn prepare(&self, claims: &[ClaimRef]) -> Result<PrepareResults, RequestError> {
        self.prepare_until(claims, Instant::now() + HOLD).await
    }

    async fn unprepare(&self, claims: &[ClaimRef]) -> Result<UnprepareResults, RequestError> {
        self.unprepare_until(claims, Instant::now() + HOLD).await
    }
}
