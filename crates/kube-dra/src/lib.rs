//! The Kubernetes API side of a DRA driver: reading allocated ResourceClaims, publishing the
//! node's devices as ResourceSlices, and posting Events users must see. What Go's
//! `k8s.io/dynamic-resource-allocation` resourceslice controller and claim helpers are to a Go
//! driver, below the driver as `kubelet-plugin` is; resmgr is the driver that uses it.
//!
//! - [`claims`]: [`ClaimReader`] turns the kubelet's (namespace, name, UID) into a domain
//!   [`policy::Claim`] holding only our driver's allocation results; [`NoClaims`] reads none,
//!   for the agent without DRA.
//! - [`slices`]: [`DevicePublisher`] turns the policy's [`policy::Device`]s into one pool of
//!   ResourceSlices for this node, and [`SlicePublisher::maintain`] re-creates them when someone
//!   (the kubelet, at its start and after we deregister) deletes them.
//! - [`metadata`]: device metadata (KEP-5304), the file per claim and request a container reads
//!   about its devices: where a container finds it, and its versioned JSON.
//! - [`version`]: which `resource.k8s.io` version the cluster serves (v1 from Kubernetes 1.34,
//!   v1beta2 on 1.33, v1beta1 on 1.32), discovered once and shared by both.
//! - [`notices`]: [`EventRecorder`] turns a [`Notice`] (a container refused, a claim that failed
//!   to prepare) into a Kubernetes Event on the pod and the claim, deduplicated, combined and
//!   rate-limited like client-go's recorder, never blocking its caller.
//! - [`waiting`]: [`WaitingPods`] marks the node's pods that wait for a prepare the kubelet
//!   would retry only at its next resync (after the driver was down), so that it syncs them now.
//! - [`client`]: the API client, from a kubeconfig or the pod's service account.
//! - [`fake`]: in-memory implementations of the traits for the simulator and for tests of the
//!   resource manager; the agent (`resmgr run`) uses none of them.
//!
//! Kubernetes objects stop here: everything that leaves this crate is a domain type. Wire
//! objects of all three API versions are handled as JSON ([`kube::api::DynamicObject`]) and
//! converted to and from k8s-openapi's v1 types, so one code path serves every version.
//! docs/kubernetes.md says which Kubernetes versions and feature gates each capability needs.

pub mod claims;
pub mod client;
pub mod fake;
pub mod metadata;
pub mod notices;
mod retry;
pub mod slices;
pub mod version;
pub mod waiting;

pub use claims::{ClaimReadError, ClaimReader, KubeClaimReader, NoClaims};
pub use client::{ConnectError, connect};
pub use notices::{
    Clock, EventRecorder, EventStats, EventsConfig, KubeEvents, MonotonicClock, NoEvents, Notice,
    PodRef,
};
pub use slices::{
    DevicePublisher, DeviceValidationError, NodeAllocatableCpu, PublishError, PublishReport,
    PublishStatus, PublisherConfig, PublisherConfigError, SlicePublisher,
};
pub use version::{DiscoveryError, ResourceApiVersion, ResourceApiVersions};
pub use waiting::{WaitingPods, WaitingPodsError};

pub use retry::RetryPolicy;
