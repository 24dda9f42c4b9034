//! Kubelet-facing wire schemas: DRA `v1` and `v1beta1`, the DRA resource health stream (`v1`
//! and `v1alpha1`), and plugin registration.
//!
//! The `.proto` files under `proto/` are ours, written from the published field tables; the Rust
//! code under `src/generated/` is produced from them by `cargo xtask codegen` (protox, prost and
//! tonic, no `protoc`) and committed, so building this crate runs no generator. CI fails when the
//! committed code is stale.
//!
//! This crate owns message and service definitions only: no sockets, no policy, no claims. The
//! one piece of behaviour it adds is the codec the generated code uses ([`codec`]), which reports
//! a message that does not decode as `InvalidArgument` rather than `Internal`.

pub mod codec;

// Generated code is exempt from our lints and docs; it is checked for freshness instead.
#[allow(
    missing_docs,
    missing_debug_implementations,
    clippy::all,
    clippy::pedantic
)]
mod generated {
    pub mod pluginregistration {
        include!("generated/pluginregistration.rs");
    }
    pub mod dra_v1beta1 {
        include!("generated/k8s.io.kubelet.pkg.apis.dra.v1beta1.rs");
    }
    pub mod dra_v1 {
        include!("generated/k8s.io.kubelet.pkg.apis.dra.v1.rs");
    }
    pub mod dra_health_v1 {
        include!("generated/v1.rs");
    }
    pub mod dra_health_v1alpha1 {
        include!("generated/v1alpha1.rs");
    }
}

/// DRA resource health (`v1.DRAResourceHealth`): the device health stream kubelets 1.37 and
/// later open on the DRA socket when GetInfo lists it (preferred over `v1alpha1`). The messages
/// are those of [`health_v1alpha1`], in package `v1`.
pub use generated::dra_health_v1 as health_v1;

/// DRA resource health (`v1alpha1.DRAResourceHealth`): the device health stream 1.36 kubelets
/// open on the DRA socket (and 1.34/1.35 with the `ResourceHealthStatus` gate on); kubelets 1.37
/// to 1.39 open it on drivers that list it and not `v1`.
pub use generated::dra_health_v1alpha1 as health_v1alpha1;
/// DRA `v1` (`k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin`), served to kubelets 1.34 and later.
pub use generated::dra_v1 as v1;
/// DRA `v1beta1` (`k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin`), served to kubelets 1.32 and later.
pub use generated::dra_v1beta1 as v1beta1;
/// Plugin registration (`pluginregistration.Registration`): GetInfo, NotifyRegistrationStatus.
pub use generated::pluginregistration;

/// Re-exported so users build against the exact versions our generated code was built with.
pub use prost;
pub use tonic;
