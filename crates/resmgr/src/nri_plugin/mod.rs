//! The resource manager as an NRI plugin: runtime events in, placement decisions out.
//!
//! [`ResmgrPlugin`] implements the nri crate's [`nri::Plugin`] by translating each event into
//! domain terms ([`translate`]) and handing it to the [`Manager`]; [`NriRuntime`] implements the
//! manager's [`Runtime`] over the stub's unsolicited `UpdateContainers`. [`connect`] wires the two;
//! [`Connection::serve`] is the manager's work while the connection lasts (opening the claim gate
//! once the Synchronize reply is out, retrying updates, reconciling), which the caller runs: this
//! module spawns no task. A container the manager refuses is
//! also told to the [`EventRecorder`], for an Event on its pod: the runtime's error reaches the
//! kubelet's log, but not always the user.
//!
//! A refusal reaches the runtime classified ([`refusal`]), as the DRA side's do: a malformed
//! request is `InvalidArgument`, a container that does not fit `FailedPrecondition`, a change
//! that could not be saved `Internal`.
//!
//! Subscribed events: CreateContainer, UpdateContainer and StopContainer (whose replies carry
//! updates to other containers), PostStartContainer and PostUpdateContainer (until which the
//! runtime may drop or overwrite a container's updates: [`crate::pending`]), PostCreateContainer
//! (the first the agent hears of a container CRI-O's Synchronize did not list, before it runs:
//! [`crate::container_events`]) and RemoveContainer; those four arrive as StateChange, or as
//! their own calls on NRI v0.12 runtimes, and carry none. Every one of them is in the mask of
//! every NRI version (events 1 to 11). Pod events change nothing the policy decides.

pub mod translate;

use std::{
    collections::HashMap,
    sync::{Arc, OnceLock},
};

use kube_dra::notices::{EventRecorder, NoEvents, Notice, PodRef};
use nri::{
    EventSet, Plugin, PluginError, PluginErrorKind, StateChange,
    api::{self, Event},
};
use policy::{ContainerUpdate, PolicyError};
use stdx::errors::chain;
use tracing::{info, warn};

use crate::{
    container_events::EventError,
    core::CommitError,
    manager::Manager,
    runtime::{BoxFuture, Runtime, RuntimeError},
};

/// The manager's runtime, over the NRI connection once there is one.
#[derive(Debug, Default)]
pub struct NriRuntime {
    handle: OnceLock<nri::Handle>,
}

impl NriRuntime {
    /// Attaches the live connection. Only the first call has an effect.
    pub fn attach(&self, handle: nri::Handle) {
        let _ = self.handle.set(handle);
    }
}

impl Runtime for NriRuntime {
    fn update_containers(
        &self,
        updates: Vec<ContainerUpdate>,
    ) -> BoxFuture<'_, Result<Vec<String>, RuntimeError>> {
        Box::pin(async move {
            let handle = self.handle.get().ok_or(RuntimeError::Disconnected)?;
            let updates = updates.iter().map(translate::update).collect();
            match handle.update_containers(updates).await {
                // We never set ignore_failure, so nothing comes back on success.
                Ok(failed) => Ok(failed.into_iter().map(|u| u.container_id).collect()),
                Err(
                    nri::UpdateError::EarlierUnanswered { waited_ms }
                    | nri::UpdateError::Call(nri::CallError::DeadlineExceeded {
                        timeout_ms: waited_ms,
                        ..
                    }),
                ) => Err(RuntimeError::Timeout(std::time::Duration::from_millis(
                    u64::try_from(waited_ms).unwrap_or(u64::MAX),
                ))),
                Err(nri::UpdateError::Call(nri::CallError::ConnectionClosed { .. })) => {
                    Err(RuntimeError::Disconnected)
                }
                Err(e) => Err(RuntimeError::Refused(chain(&e))),
            }
        })
    }
}

/// Told about every runtime event the plugin handles, for metrics.
pub trait EventObserver: Send + Sync + std::fmt::Debug {
    /// One event of `kind`: `synchronize`, `create-container`, `post-create-container`,
    /// `post-start-container`, `update-container`, `post-update-container`, `stop-container` or
    /// `remove-container`.
    fn event(&self, kind: &'static str);
}

/// Observes nothing.
impl EventObserver for () {
    fn event(&self, _kind: &'static str) {}
}

/// The resource manager's NRI plugin.
#[derive(Debug)]
pub struct ResmgrPlugin {
    manager: Arc<Manager>,
    observer: Arc<dyn EventObserver>,
    recorder: Arc<dyn EventRecorder>,
}

impl ResmgrPlugin {
    /// A plugin serving `manager`, telling `observer` about each event. It posts no Kubernetes
    /// events until given a recorder ([`ResmgrPlugin::with_recorder`]).
    pub fn new(manager: Arc<Manager>, observer: Arc<dyn EventObserver>) -> Self {
        Self {
            manager,
            observer,
            recorder: Arc::new(NoEvents),
        }
    }

    /// Tells `recorder` about every container it refuses, for an Event on the container's pod.
    pub fn with_recorder(mut self, recorder: Arc<dyn EventRecorder>) -> Self {
        self.recorder = recorder;
        self
    }
}

/// A request without what its event needs: malformed, whatever our state.
fn missing(call: &str, what: &str) -> PluginError {
    PluginError::with_kind(
        PluginErrorKind::InvalidArgument,
        format!("{call} request without a {what}"),
    )
}

/// The manager's failure of an event as the status the runtime gets, by its typed cause (gRPC's
/// meanings, as `dra_handler` answers the kubelet):
///
/// - the policy's refusals: a container that does not fit, or a policy that serves no claims,
///   is a well-formed request the node cannot grant as it is (`FailedPrecondition`; not
///   `ResourceExhausted`, which NRI runtimes read as an oversized message); a malformed
///   annotation or claim configuration is `InvalidArgument`; a container the policy does not
///   know is `NotFound`; a failed restore cannot come from an event (`Internal`);
/// - the commit's: the state could not be saved (the disk failed) is `Internal`; the runtime
///   did not confirm updates the change waits for is `Unavailable`, which a retry may get
///   through.
pub fn refusal(e: &EventError) -> PluginError {
    let kind = match e {
        EventError::Policy { source, .. } => match source {
            PolicyError::DoesNotFit { .. } | PolicyError::NoDraClaims => {
                PluginErrorKind::FailedPrecondition
            }
            PolicyError::Invalid { .. } | PolicyError::ClaimConfig { .. } => {
                PluginErrorKind::InvalidArgument
            }
            PolicyError::UnknownContainer(_) => PluginErrorKind::NotFound,
            PolicyError::Restore { .. } => PluginErrorKind::Internal,
        },
        EventError::Commit { source, .. } => match source {
            CommitError::Save(_) => PluginErrorKind::Internal,
            CommitError::Deliver(_) => PluginErrorKind::Unavailable,
        },
    };
    PluginError::with_kind(kind, chain(e))
}

fn updates(updates: &[ContainerUpdate]) -> Vec<api::ContainerUpdate> {
    updates.iter().map(translate::update).collect()
}

/// The events the plugin subscribes to (see the module docs).
pub fn subscriptions() -> EventSet {
    EventSet::of(&[
        Event::CreateContainer,
        // The first the agent hears of a container a Synchronize did not list, before it runs
        // (crate::container_events).
        Event::PostCreateContainer,
        // Until it, the runtime may drop updates of the container (crate::pending).
        Event::PostStartContainer,
        Event::UpdateContainer,
        // Until it, the runtime may overwrite updates of the container (crate::pending).
        Event::PostUpdateContainer,
        Event::StopContainer,
        Event::RemoveContainer,
    ])
}

impl Plugin for ResmgrPlugin {
    fn events(&self) -> EventSet {
        subscriptions()
    }

    async fn synchronize(
        &self,
        pods: Vec<api::PodSandbox>,
        containers: Vec<api::Container>,
    ) -> Result<Vec<api::ContainerUpdate>, PluginError> {
        self.observer.event("synchronize");
        let pods: HashMap<&str, &api::PodSandbox> =
            pods.iter().map(|p| (p.id.as_str(), p)).collect();
        let mut live = Vec::new();
        let mut starting = Vec::new();
        for c in &containers {
            let state = api::ContainerState::try_from(c.state)
                .unwrap_or(api::ContainerState::ContainerUnknown);
            if matches!(
                state,
                api::ContainerState::ContainerStopped | api::ContainerState::ContainerUnknown
            ) {
                continue;
            }
            match pods.get(c.pod_sandbox_id.as_str()) {
                Some(pod) => {
                    live.push(translate::container(pod, c));
                    // Perhaps being started now: see Manager::synchronize_starting.
                    if state == api::ContainerState::ContainerCreated {
                        starting.push(c.id.as_str());
                    }
                }
                None => {
                    warn!(container = %c.id, pod = %c.pod_sandbox_id, "container of an unknown pod left alone")
                }
            }
        }
        let result = self.manager.synchronize_starting(&live, &starting).await;
        result.map(|u| updates(&u)).map_err(|e| refusal(&e))
    }

    async fn create_container(
        &self,
        request: api::CreateContainerRequest,
    ) -> Result<api::CreateContainerResponse, PluginError> {
        self.observer.event("create-container");
        let pod = request
            .pod
            .as_ref()
            .ok_or_else(|| missing("CreateContainer", "pod"))?;
        let c = request
            .container
            .as_ref()
            .ok_or_else(|| missing("CreateContainer", "container"))?;
        let container = translate::container(pod, c);
        let allocation = match self.manager.create_container(&container).await {
            Ok(allocation) => allocation,
            Err(e) => {
                let refused = refusal(&e);
                self.recorder.record(Notice::ContainerRefused {
                    pod: PodRef {
                        namespace: container.pod.namespace.clone(),
                        name: container.pod.name.clone(),
                        uid: container.pod.uid.clone(),
                    },
                    container: container.name.clone(),
                    message: refused.message.clone(),
                });
                return Err(refused);
            }
        };
        Ok(api::CreateContainerResponse {
            adjust: translate::adjustment(&allocation.adjustment),
            update: updates(&allocation.updates),
            evict: Vec::new(),
        })
    }

    async fn update_container(
        &self,
        request: api::UpdateContainerRequest,
    ) -> Result<api::UpdateContainerResponse, PluginError> {
        self.observer.event("update-container");
        let pod = request
            .pod
            .as_ref()
            .ok_or_else(|| missing("UpdateContainer", "pod"))?;
        let c = request
            .container
            .as_ref()
            .ok_or_else(|| missing("UpdateContainer", "container"))?;
        let resources = translate::resources_of(request.linux_resources.as_ref());
        let u = self
            .manager
            .update_container(&translate::container(pod, c), &resources)
            .await
            .map_err(|e| refusal(&e))?;
        Ok(api::UpdateContainerResponse {
            update: updates(&u),
            evict: Vec::new(),
        })
    }

    async fn stop_container(
        &self,
        request: api::StopContainerRequest,
    ) -> Result<api::StopContainerResponse, PluginError> {
        self.observer.event("stop-container");
        let pod = request
            .pod
            .as_ref()
            .ok_or_else(|| missing("StopContainer", "pod"))?;
        let c = request
            .container
            .as_ref()
            .ok_or_else(|| missing("StopContainer", "container"))?;
        let u = self
            .manager
            .stop_container(&translate::container(pod, c))
            .await;
        Ok(api::StopContainerResponse {
            update: updates(&u),
        })
    }

    async fn state_change(&self, change: StateChange) -> Result<(), PluginError> {
        match change.event {
            Event::PostCreateContainer => {
                self.observer.event("post-create-container");
                let c = change
                    .container
                    .as_ref()
                    .ok_or_else(|| missing("PostCreateContainer", "container"))?;
                let pod = change.pod.unwrap_or_default();
                self.manager
                    .container_created(&translate::container(&pod, c))
                    .await;
            }
            Event::PostStartContainer => {
                self.observer.event("post-start-container");
                let c = change
                    .container
                    .as_ref()
                    .ok_or_else(|| missing("PostStartContainer", "container"))?;
                let pod = change.pod.unwrap_or_default();
                self.manager
                    .container_started(&translate::container(&pod, c))
                    .await;
            }
            Event::PostUpdateContainer => {
                self.observer.event("post-update-container");
                let c = change
                    .container
                    .as_ref()
                    .ok_or_else(|| missing("PostUpdateContainer", "container"))?;
                let pod = change.pod.unwrap_or_default();
                self.manager
                    .container_updated(&translate::container(&pod, c))
                    .await;
            }
            Event::RemoveContainer => {
                self.observer.event("remove-container");
                let c = change
                    .container
                    .as_ref()
                    .ok_or_else(|| missing("RemoveContainer", "container"))?;
                let pod = change.pod.unwrap_or_default();
                self.manager
                    .remove_container(&translate::container(&pod, c))
                    .await;
            }
            _ => {}
        }
        Ok(())
    }
}

/// Connects the manager to the runtime: registers `plugin` and attaches the connection to
/// `runtime`. The runtime starts calling `plugin` right away; what the manager needs done
/// besides answering it is [`Connection::serve`], which the caller runs.
pub async fn connect(
    plugin: ResmgrPlugin,
    runtime: &NriRuntime,
    config: nri::StubConfig,
    endpoint: nri::Endpoint,
) -> Result<Connection, nri::StubError> {
    let manager = plugin.manager.clone();
    let handle = nri::connect(Arc::new(plugin), config, endpoint).await?;
    runtime.attach(handle.clone());
    Ok(Connection { handle, manager })
}

/// The manager's live connection to the runtime.
#[derive(Debug)]
pub struct Connection {
    handle: nri::Handle,
    manager: Arc<Manager>,
}

impl Connection {
    /// The connection's handle.
    pub fn handle(&self) -> &nri::Handle {
        &self.handle
    }

    /// The manager's work on this connection, until the runtime goes away: opens the claim gate
    /// once the Synchronize reply has been written, then retries undelivered updates and runs
    /// the reconciler. Returns why the connection ended, which must end the process (the gate
    /// never closes). It spawns nothing: the caller runs it, in a task of its own; dropping it
    /// stops that work, not the connection.
    pub async fn serve(self) -> nri::Disconnect {
        let work = async {
            match self.handle.synchronized().await {
                Ok(()) => {
                    self.manager.synchronized().await;
                    tokio::join!(self.manager.run_retries(), self.manager.run_reconciler());
                }
                Err(e) => info!(reason = %chain(&e), "connection ended before synchronization"),
            }
            std::future::pending::<std::convert::Infallible>().await
        };
        tokio::select! {
            why = self.handle.closed() => why,
            never = work => match never {},
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;
    use crate::{
        core::{DeliveryCause, DeliveryError},
        runtime::RuntimeError,
        state::StateError,
    };

    fn policy(source: PolicyError) -> EventError {
        EventError::Policy {
            container: "ns/pod/c".into(),
            source,
        }
    }

    fn commit(source: CommitError) -> EventError {
        EventError::Commit {
            container: "ns/pod/c".into(),
            source,
        }
    }

    #[test]
    fn each_failure_reaches_the_runtime_classified_with_its_whole_chain() {
        use PluginErrorKind as K;
        let reason = |r: &str| r.to_owned();
        let cases = [
            (
                policy(PolicyError::DoesNotFit {
                    subject: "container c".into(),
                    reason: reason("needs 4 cpus"),
                }),
                K::FailedPrecondition,
            ),
            (policy(PolicyError::NoDraClaims), K::FailedPrecondition),
            (
                policy(PolicyError::Invalid {
                    subject: "container c".into(),
                    reason: reason("bad annotation"),
                }),
                K::InvalidArgument,
            ),
            (
                policy(PolicyError::ClaimConfig {
                    claim: "ns/claim (uid)".into(),
                    requests: "all requests".into(),
                    field: "memoryPinning".into(),
                    reason: reason("not a bool"),
                }),
                K::InvalidArgument,
            ),
            (
                policy(PolicyError::UnknownContainer("c".into())),
                K::NotFound,
            ),
            (policy(PolicyError::restore("no")), K::Internal),
            (
                commit(CommitError::Save(StateError::Read {
                    path: "/state/state.json".into(),
                    source: std::io::Error::from_raw_os_error(5),
                })),
                K::Internal,
            ),
            (
                commit(CommitError::Deliver(DeliveryError {
                    containers: BTreeSet::from(["other".to_owned()]),
                    cause: DeliveryCause::Runtime(RuntimeError::Disconnected),
                })),
                K::Unavailable,
            ),
        ];
        for (error, kind) in cases {
            let refused = refusal(&error);
            assert_eq!(refused.kind, kind, "{error:?}");
            assert_eq!(refused.message, chain(&error));
            assert!(refused.message.starts_with("container ns/pod/c: "));
        }
    }

    #[test]
    fn every_runtime_supported_delivers_every_event_subscribed_to() {
        use nri::version::NriVersion;
        let ours = subscriptions();
        // containerd 2.1 (v0.8), 2.2.0 (v0.10), 2.2.1 and CRI-O 1.36 (v0.11), containerd 2.4
        // (v0.12), and a runtime that does not say.
        for runtime in [
            Some(NriVersion::new(0, 8, 0)),
            Some(NriVersion::new(0, 10, 0)),
            Some(NriVersion::new(0, 11, 0)),
            Some(NriVersion::new(0, 12, 0)),
            None,
        ] {
            let (delivered, dropped) = ours.split_for(runtime);
            assert!(dropped.is_empty(), "{runtime:?} drops {dropped:?}");
            assert_eq!(delivered, ours, "{runtime:?}");
        }
        for needed in [
            Event::CreateContainer,
            Event::PostCreateContainer,
            Event::PostStartContainer,
            Event::UpdateContainer,
            Event::PostUpdateContainer,
            Event::StopContainer,
            Event::RemoveContainer,
        ] {
            assert!(ours.contains(needed), "{needed:?}");
        }
    }

    #[test]
    fn a_request_without_its_pod_or_container_is_an_invalid_argument() {
        let refused = missing("CreateContainer", "pod");
        assert_eq!(refused.kind, PluginErrorKind::InvalidArgument);
        assert_eq!(refused.message, "CreateContainer request without a pod");
    }
}
