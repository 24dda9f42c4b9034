//! Pods of the node that wait for a prepare the kubelet will not retry until its next resync.
//!
//! When NodePrepareResources fails (the driver is not registered, its socket is dead, or it
//! refuses), the kubelet records `FailedPrepareDynamicResources` and returns from the pod's sync
//! without an error, so the pod worker tries again only at the periodic resync, 60 to 90 s later
//! (`pkg/kubelet/kuberuntime/kuberuntime_manager.go`, `SyncPod`; `pod_workers.go`,
//! `completeWork`). A driver that was down for a moment (a crash, a pod deleted without a
//! surge) costs every claim pod created meanwhile that minute. A change of a pod's annotations,
//! though, is an update the kubelet syncs at once (`pkg/kubelet/config/config.go`,
//! `podsDifferSemantically`). So once a driver serves again it marks its node's pods that have
//! resource claims and have not started, with an annotation of its own, and the kubelet retries
//! their prepares now.
//!
//! It needs `list` and `patch` on pods; the chart grants them only together with an admission
//! policy that lets the driver change nothing but that annotation, of pods on its own node.

use std::fmt;

use k8s_openapi::api::core::v1::Pod;
use kube::{
    Api, Client,
    api::{ListParams, Patch, PatchParams},
};
use tracing::{debug, info};

/// Why the waiting pods could not be marked.
#[derive(Debug, thiserror::Error)]
pub enum WaitingPodsError {
    /// Listing the node's pending pods failed.
    #[error("listing the pending pods of node {node}")]
    List {
        /// The node.
        node: String,
        /// The API server's answer.
        #[source]
        source: kube::Error,
    },
    /// Marking a pod failed (others may have been marked).
    #[error("marking pod {namespace}/{name} for the kubelet to sync")]
    Patch {
        /// The pod's namespace.
        namespace: String,
        /// The pod's name.
        name: String,
        /// The API server's answer.
        #[source]
        source: kube::Error,
    },
}

/// The node's pods that wait for their claims to be prepared.
#[derive(Clone)]
pub struct WaitingPods {
    client: Client,
    node: String,
    annotation: String,
}

impl fmt::Debug for WaitingPods {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WaitingPods")
            .field("node", &self.node)
            .field("annotation", &self.annotation)
            .finish_non_exhaustive()
    }
}

impl WaitingPods {
    /// The pods of `node`, marked with `<driver>/prepare-retry`.
    pub fn new(client: Client, node: impl Into<String>, driver: &str) -> Self {
        Self {
            client,
            node: node.into(),
            annotation: annotation(driver),
        }
    }

    /// Marks every pending pod of the node that has resource claims and no container running
    /// with the annotation (its value: `stamp`, the time), so that the kubelet syncs it and
    /// prepares its claims now. Returns how many it marked.
    pub async fn retry(&self, stamp: &str) -> Result<usize, WaitingPodsError> {
        let pods: Api<Pod> = Api::all(self.client.clone());
        let fields = format!("spec.nodeName={},status.phase=Pending", self.node);
        let list = pods
            .list(&ListParams::default().fields(&fields))
            .await
            .map_err(|source| WaitingPodsError::List {
                node: self.node.clone(),
                source,
            })?;
        let mut marked = 0;
        for pod in list.items.iter().filter(|p| waits_for_claims(p)) {
            let namespace = pod.metadata.namespace.clone().unwrap_or_default();
            let name = pod.metadata.name.clone().unwrap_or_default();
            let api: Api<Pod> = Api::namespaced(self.client.clone(), &namespace);
            let patch = serde_json::json!({"metadata": {"annotations": {&self.annotation: stamp}}});
            match api
                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => marked += 1,
                // Gone meanwhile: nothing waits.
                Err(kube::Error::Api(e)) if e.code == 404 => {
                    debug!(pod = %format!("{namespace}/{name}"), "a waiting pod went before it was marked");
                }
                Err(source) => {
                    return Err(WaitingPodsError::Patch {
                        namespace,
                        name,
                        source,
                    });
                }
            }
        }
        if marked > 0 {
            info!(pods = marked, annotation = %self.annotation, "marked the node's pods that wait for their claims: the kubelet prepares them now, not at its next resync");
        }
        Ok(marked)
    }
}

/// The annotation a driver marks waiting pods with.
pub fn annotation(driver: &str) -> String {
    format!("{driver}/prepare-retry")
}

/// Whether a pod has resource claims and no container that started.
fn waits_for_claims(pod: &Pod) -> bool {
    let claims = pod
        .spec
        .as_ref()
        .and_then(|s| s.resource_claims.as_ref())
        .is_some_and(|c| !c.is_empty());
    let started = pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .is_some_and(|cs| {
            cs.iter().any(|c| {
                c.state
                    .as_ref()
                    .is_some_and(|s| s.running.is_some() || s.terminated.is_some())
            })
        });
    claims && !started
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(claims: bool, running: bool) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns"},
            "spec": {
                "containers": [{"name": "app"}],
                "resourceClaims": if claims { serde_json::json!([{"name": "cpus", "resourceClaimTemplateName": "t"}]) } else { serde_json::json!([]) },
            },
            "status": {"phase": "Pending", "containerStatuses": if running {
                serde_json::json!([{"name": "app", "image": "i", "imageID": "", "ready": false, "restartCount": 0, "state": {"running": {}}}])
            } else {
                serde_json::json!([{"name": "app", "image": "i", "imageID": "", "ready": false, "restartCount": 0, "state": {"waiting": {"reason": "ContainerCreating"}}}])
            }},
        }))
        .unwrap()
    }

    #[test]
    fn only_pods_with_claims_and_no_started_container_wait() {
        assert!(waits_for_claims(&pod(true, false)));
        assert!(!waits_for_claims(&pod(false, false)), "no claims");
        assert!(!waits_for_claims(&pod(true, true)), "started");
        assert_eq!(
            annotation("topology-aware.resmgr.io"),
            "topology-aware.resmgr.io/prepare-retry"
        );
    }
}
