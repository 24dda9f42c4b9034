//! The resource manager: one policy serving two front ends.
//!
//! NRI events from the runtime and claim requests from the kubelet meet here, under one lock, with
//! durable state and the claim lifecycle (prepare = allocate, commit, write the CDI spec; unprepare
//! = remove the spec, release, commit). See ARCHITECTURE.md for the invariants this crate keeps,
//! [`manager`] for the lock and [`commit`] for the commit.
//!
//! It re-exports the crates whose types appear in its API (`kube_dra`, `kubelet_plugin`, `nri`,
//! `policy`), so the binary uses exactly the versions resmgr was built against without depending
//! on them; and `kube_dra`'s `errors` (the one error-chain printer) and `sync` (the one
//! poison-tolerant lock) as its own `errors` and `sync`, for itself and the binary.

pub mod claims;
pub mod commit;
pub mod container_events;
pub(crate) mod disk;
pub mod dra_handler;
pub mod faults;
pub mod gate;
pub mod handover;
pub mod health;
pub mod manager;
pub mod nri_plugin;
pub mod pending;
pub mod points;
pub mod published;
pub mod reconcile;
pub mod runtime;
pub mod state;

pub use claims::{AdmitError, Cause, ClaimAnswers, LifecycleError, Step, Undo};
pub use commit::{CommitError, DeliveryCause, DeliveryError};
pub use kube_dra;
pub use kube_dra::{ClaimReadError, ClaimReader, errors, sync};
pub use kubelet_plugin;
pub use manager::{Manager, ManagerConfig, StartError};
pub use nri;
pub use policy;
pub use published::Published;
pub use reconcile::{Outcome, ReconcileConfig, ReconcileReport};
pub use runtime::{BoxFuture, Runtime, RuntimeError};
