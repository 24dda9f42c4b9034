//! Publishing the policy's devices as this node's ResourceSlices.
//!
//! One pool named after the node; slices of at most 128 devices, each naming the node and the
//! driver, owned by the Node object and labelled `app.kubernetes.io/managed-by=resmgr`. The
//! pool's generation goes up whenever its devices change; no devices is one empty slice. The
//! publisher only ever lists, writes and deletes slices selected by `spec.nodeName=<node>,
//! spec.driver=<driver>`, so other nodes' and other drivers' slices are never touched.
//!
//! - [`validate`]: the API server's rules, checked first, naming the device and field.
//! - [`build`]: devices to v1 slice specs (pure).
//! - [`wire`]: the three API versions' JSON, comparison, dropped-field detection (pure).
//! - [`publisher`]: [`SlicePublisher`], which talks to the API server, and
//!   [`first_publication`], the objects it creates for a new node (what `resmgr slices` prints).

pub mod allocatable;
pub mod build;
pub mod publisher;
pub mod validate;
pub mod wire;

use std::time::Duration;

use futures::future::BoxFuture;
use kubelet_plugin::names::dns_subdomain;
use policy::Device;

pub use publisher::{
    PublishError, PublishReport, PublishStatus, SlicePublisher, first_publication,
};
pub use validate::DeviceValidationError;

use super::retry::RetryPolicy;

/// Publishes devices. Implemented against the API server by [`SlicePublisher`] and in memory by
/// [`super::fake::RecordingPublisher`].
pub trait DevicePublisher: Send + Sync + std::fmt::Debug {
    /// Makes `devices` the published devices of this node (validating them first). On an API
    /// error the devices are still remembered, and [`SlicePublisher::maintain`] keeps trying.
    fn publish(&self, devices: Vec<Device>) -> BoxFuture<'_, Result<PublishReport, PublishError>>;
}

impl<T: DevicePublisher + ?Sized> DevicePublisher for std::sync::Arc<T> {
    fn publish(&self, devices: Vec<Device>) -> BoxFuture<'_, Result<PublishReport, PublishError>> {
        (**self).publish(devices)
    }
}

/// Maps a capacity of our devices to the node's allocatable `cpu`
/// (`nodeAllocatableResourceMappings`, Kubernetes 1.36 with the alpha
/// `DRANodeAllocatableResources` gate), so the scheduler charges claimed CPUs against the node
/// and pods need not repeat them in `resources.requests`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeAllocatableCpu {
    /// The capacity that counts CPUs (default `cpu`).
    pub capacity: String,
}

impl Default for NodeAllocatableCpu {
    fn default() -> Self {
        Self {
            capacity: "cpu".to_owned(),
        }
    }
}

/// What the publisher publishes and how persistently.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublisherConfig {
    /// Our driver name (a DNS subdomain of at most 63 characters).
    pub driver: String,
    /// This node's name; also the pool's name.
    pub node_name: String,
    /// The node-allocatable mapping of CPUs; `None` (the default) publishes none, which every
    /// cluster accepts.
    pub node_allocatable_cpu: Option<NodeAllocatableCpu>,
    /// Whether to map the devices' `memory` and `hugepages<size>` capacities to the node's
    /// allocatable `memory` and `hugepages-<size>` as well (off by default), so that the
    /// scheduler charges claimed memory against the node and, from 1.37, the kubelet applies it
    /// to the pod's and the container's limits.
    pub node_allocatable_memory: bool,
    /// While the API server refuses the mapping for our Node (1.37's admission, for a Node
    /// whose kubelet does not declare the feature), slices go without it, and the mapped form
    /// is tried again this long after it was last refused (and as soon as a publication finds
    /// that the Node has come to declare the feature).
    pub node_allocatable_retry: Duration,
    /// Timeouts and retries of each API request.
    pub retry: RetryPolicy,
    /// Wait before [`SlicePublisher::maintain`] retries a failed publication; doubled up to
    /// `max_resync_backoff`.
    pub resync_backoff: Duration,
    /// Longest wait between retries of a failed publication.
    pub max_resync_backoff: Duration,
}

impl PublisherConfig {
    /// Defaults for `driver` on `node_name`: no node-allocatable mapping (a refused one tried
    /// again every 5 minutes), retries within 30 s per request, failed publications retried
    /// after 1 s growing to 30 s.
    pub fn new(driver: impl Into<String>, node_name: impl Into<String>) -> Self {
        Self {
            driver: driver.into(),
            node_name: node_name.into(),
            node_allocatable_cpu: None,
            node_allocatable_memory: false,
            node_allocatable_retry: Duration::from_secs(300),
            retry: RetryPolicy::default(),
            resync_backoff: Duration::from_secs(1),
            max_resync_backoff: Duration::from_secs(30),
        }
    }

    /// Checks the names the API server would refuse.
    pub fn validate(&self) -> Result<(), PublisherConfigError> {
        let error = |field, reason| PublisherConfigError { field, reason };
        dns_subdomain(&self.driver, 63).map_err(|e| error("driver", e.to_string()))?;
        dns_subdomain(&self.node_name, 253).map_err(|e| error("node name", e.to_string()))?;
        if let Some(cpu) = &self.node_allocatable_cpu {
            validate::qualified_name(&cpu.capacity)
                .map_err(|r| error("node-allocatable cpu capacity", r))?;
        }
        if self.node_allocatable_retry.is_zero() {
            // Every refusal would be retried at once, for ever.
            return Err(error("node-allocatable retry", "must not be zero".into()));
        }
        Ok(())
    }
}

/// A publisher configuration the API server would refuse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("resource slice publisher: {field}: {reason}")]
pub struct PublisherConfigError {
    /// The offending setting.
    pub field: &'static str,
    /// What is wrong with it.
    pub reason: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_zero_node_allocatable_retry_is_refused() {
        let mut config = PublisherConfig::new("cpu.resmgr.io", "node-a");
        assert!(config.validate().is_ok());
        config.node_allocatable_retry = Duration::ZERO;
        let error = config.validate().unwrap_err();
        assert_eq!(error.field, "node-allocatable retry");
    }
}
