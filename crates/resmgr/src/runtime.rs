//! The runtime as the resource manager sees it: something that applies container updates.
//!
//! The NRI connection implements it in production; tests and the simulator use fakes. Keeping the
//! manager behind this trait is what lets the claim lifecycle be tested without a runtime.

pub use futures::future::BoxFuture;
use policy::ContainerUpdate;

/// Why the runtime did not take updates.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RuntimeError {
    /// The runtime answered with an error; which updates applied is unknown.
    #[error("the runtime refused the updates: {0}")]
    Refused(String),
    /// The runtime did not answer in time; which updates applied is unknown.
    #[error("the runtime did not answer within {0:?}")]
    Timeout(std::time::Duration),
    /// There is no runtime connection.
    #[error("not connected to the runtime")]
    Disconnected,
}

/// Applies container updates in the runtime (NRI `UpdateContainers`).
pub trait Runtime: Send + Sync + std::fmt::Debug {
    /// Sends updates; on success returns the IDs of the containers whose update failed.
    ///
    /// Must never be called from inside an NRI event handler: the runtime holds its lock while it
    /// waits for the handler and serves this call under the same lock.
    fn update_containers(
        &self,
        updates: Vec<ContainerUpdate>,
    ) -> BoxFuture<'_, Result<Vec<String>, RuntimeError>>;
}
