//! The CDI (Container Device Interface) spec model and the per-claim spec store.
//!
//! A prepared DRA claim is granted to its containers through a CDI spec of its own. This crate owns
//! the spec's serde model, CDI name rules and the crash-safe store of one spec file per claim. It
//! knows nothing of what a claim means, of policies, or of the kubelet.

pub mod spec;

pub use spec::{ContainerEdits, Device, DeviceNode, Hook, IntelRdt, Mount, NetDevice, Spec};
