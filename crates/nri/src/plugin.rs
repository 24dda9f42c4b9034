//! The `Plugin` trait: what a plugin implements to receive typed NRI events.
//!
//! Every method but [`Plugin::events`] has a default that accepts the event and changes nothing,
//! so a plugin implements only what it subscribes to. Handlers run on the runtime's critical
//! path: the runtime holds its NRI lock, and every pod and container operation on the node waits,
//! until the handler returns (within the request timeout, 2 s by default, or the plugin is
//! dropped). An error from a handler fails the CRI operation, so return one only on purpose.

use std::{future::Future, time::Duration};

use crate::{
    api::{
        Container, ContainerUpdate, CreateContainerRequest, CreateContainerResponse, Event,
        PodSandbox, StopContainerRequest, StopContainerResponse, UpdateContainerRequest,
        UpdateContainerResponse, UpdatePodSandboxRequest,
    },
    events::EventSet,
    rpc::code,
    version::NriVersion,
};

/// A handler's refusal. The runtime receives it as a ttRPC status, [`PluginError::kind`]'s code
/// with this message, and fails the CRI operation (container creation, pod start, ...).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct PluginError {
    /// What kind of failure it is: the status code.
    pub kind: PluginErrorKind,
    /// What the runtime logs and fails the CRI operation with.
    pub message: String,
}

impl PluginError {
    /// An unclassified refusal ([`PluginErrorKind::Unknown`], what a Go plugin's plain error is).
    pub fn new(message: impl Into<String>) -> Self {
        Self::with_kind(PluginErrorKind::Unknown, message)
    }

    /// A refusal of `kind`.
    pub fn with_kind(kind: PluginErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
        }
    }
}

/// What kind of failure a [`PluginError`] is, as the ttRPC status code the runtime receives
/// (gRPC numbering, like the DRA side's statuses). The runtime fails the CRI operation whatever
/// the code; the code tells its log, and whoever reads the CRI error, what kind of failure it
/// was, without parsing the message.
///
/// There is no `ResourceExhausted`: ttRPC and NRI runtimes use it for a message over 4 MiB, and a
/// runtime answered it on Synchronize splits the message and tries again instead of reporting
/// the plugin's reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PluginErrorKind {
    /// Unclassified: gRPC `Unknown`.
    #[default]
    Unknown,
    /// The request is malformed (a field the event needs is missing, a value that cannot be),
    /// whatever state the plugin is in: gRPC `InvalidArgument`.
    InvalidArgument,
    /// The request names something the plugin does not know (an update of a container it never
    /// saw): gRPC `NotFound`.
    NotFound,
    /// A well-formed request the plugin cannot grant in the state it is in (a container that
    /// does not fit in what is free); it may once that state changes: gRPC `FailedPrecondition`.
    FailedPrecondition,
    /// A failure that may pass if the runtime tries again (an update the answer waits for was
    /// not confirmed): gRPC `Unavailable`.
    Unavailable,
    /// The plugin itself failed (its state could not be saved): gRPC `Internal`.
    Internal,
}

impl PluginErrorKind {
    /// The ttRPC status code the runtime receives.
    pub fn code(self) -> i32 {
        match self {
            Self::Unknown => code::UNKNOWN,
            Self::InvalidArgument => code::INVALID_ARGUMENT,
            Self::NotFound => code::NOT_FOUND,
            Self::FailedPrecondition => code::FAILED_PRECONDITION,
            Self::Unavailable => code::UNAVAILABLE,
            Self::Internal => code::INTERNAL,
        }
    }
}

/// What the runtime said about itself in Configure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeInfo {
    pub name: String,
    pub version: String,
    /// The runtime's NRI version, announced (v0.12+) or inferred from name and version; None if
    /// neither works (the plugin then gets the subscription every runtime accepts).
    pub nri_version: Option<NriVersion>,
    /// The plugin's configuration (pre-launched plugins only; "" for external ones).
    pub config: String,
    /// How long the runtime waits for registration (announced by NRI v0.7+, else 5 s).
    pub registration_timeout: Duration,
    /// How long the runtime waits for each reply (announced by NRI v0.7+, else 2 s).
    pub request_timeout: Duration,
}

/// How an event reached the plugin.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivery {
    /// Through the generic `StateChange` call (every runtime before NRI v0.12, and v0.12+ runtimes
    /// whose dedicated call we answered with Unimplemented).
    StateChange,
    /// Through the event's own call (NRI v0.12+ runtimes).
    Dedicated,
}

/// A pod or container lifecycle event that needs no reply: run/stop/remove pod sandbox,
/// post-update pod sandbox, post-create, start, post-start, post-update and remove container.
#[derive(Debug, Clone, PartialEq)]
pub struct StateChange {
    pub event: Event,
    pub pod: Option<PodSandbox>,
    /// None for pod events.
    pub container: Option<Container>,
    pub delivery: Delivery,
}

/// An NRI plugin. Implement the handlers for the events returned by [`Plugin::events`].
///
/// Do not call [`crate::Handle::update_containers`] from a handler, nor wait in a handler for a
/// task that does: the runtime serves that call under the lock it holds while waiting for the
/// handler, so the two wait for each other until the runtime's deadline drops the plugin. The
/// call detects the direct case and fails with [`crate::UpdateError::InsideEventHandler`].
pub trait Plugin: Send + Sync + 'static {
    /// The events to subscribe to. Events the runtime's NRI version does not know are left out of
    /// the subscription (with a warning); if nothing is left, Configure fails.
    fn events(&self) -> EventSet;

    /// Configure: the runtime introduced itself. An error makes the runtime drop the plugin.
    fn configure(
        &self,
        runtime: &RuntimeInfo,
    ) -> impl Future<Output = Result<(), PluginError>> + Send {
        let _ = runtime;
        async { Ok(()) }
    }

    /// Synchronize: every existing pod and container (all chunks of a chunked sync, gathered).
    /// The returned updates go back in the reply.
    fn synchronize(
        &self,
        pods: Vec<PodSandbox>,
        containers: Vec<Container>,
    ) -> impl Future<Output = Result<Vec<ContainerUpdate>, PluginError>> + Send {
        let _ = (pods, containers);
        async { Ok(Vec::new()) }
    }

    /// A container is being created: the reply may adjust it and update others.
    fn create_container(
        &self,
        request: CreateContainerRequest,
    ) -> impl Future<Output = Result<CreateContainerResponse, PluginError>> + Send {
        let _ = request;
        async { Ok(CreateContainerResponse::default()) }
    }

    /// A container's resources are being updated.
    fn update_container(
        &self,
        request: UpdateContainerRequest,
    ) -> impl Future<Output = Result<UpdateContainerResponse, PluginError>> + Send {
        let _ = request;
        async { Ok(UpdateContainerResponse::default()) }
    }

    /// A container is being stopped.
    fn stop_container(
        &self,
        request: StopContainerRequest,
    ) -> impl Future<Output = Result<StopContainerResponse, PluginError>> + Send {
        let _ = request;
        async { Ok(StopContainerResponse::default()) }
    }

    /// A pod's resources are being updated (NRI v0.10+; there is no fallback on older runtimes).
    fn update_pod_sandbox(
        &self,
        request: UpdatePodSandboxRequest,
    ) -> impl Future<Output = Result<(), PluginError>> + Send {
        let _ = request;
        async { Ok(()) }
    }

    /// Any other lifecycle event, however it was delivered.
    fn state_change(
        &self,
        change: StateChange,
    ) -> impl Future<Output = Result<(), PluginError>> + Send {
        let _ = change;
        async { Ok(()) }
    }

    /// Shutdown. No runtime sends it; it exists for completeness.
    fn shutdown(&self) -> impl Future<Output = ()> + Send {
        async {}
    }
}
