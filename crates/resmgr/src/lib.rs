//! The resource manager: one policy serving two front ends.
//!
//! NRI events from the runtime and claim requests from the kubelet meet here, under one lock, with
//! durable state and the claim lifecycle (prepare = allocate, commit, write the CDI spec; unprepare
//! = remove the spec, release, commit). See ARCHITECTURE.md for the invariants this crate keeps,
//! and [`core`] for the lock and the commit.
//!
//! It re-exports no other crate, nor any item of one: the types of `kube_dra`, `kubelet_plugin`,
//! `nri`, `policy` and `cdi` that its API takes are named, by whoever uses them, through the
//! crate that defines them.

// Blocking IO (crates/resmgr/clippy.toml) is refused only in the modules that take the manager
// lock, each with a `#![deny]` of its own: the disk's blocking-pool side, the state file and the
// stores block by design, off the lock.
#![allow(
    clippy::disallowed_methods,
    reason = "denied per module, in those that take the manager lock"
)]

pub(crate) mod claim_locks;
pub mod claims;
pub mod container_events;
pub(crate) mod core;
pub(crate) mod disk;
pub mod dra_handler;
pub mod faults;
pub mod gate;
pub mod handover;
pub mod health;
pub mod manager;
pub mod metadata;
pub mod nri_plugin;
pub mod pending;
pub mod points;
pub mod reconcile;
pub(crate) mod reconciliation;
pub mod runtime;
pub mod state;
pub mod taints;

pub use crate::core::{CommitError, DeliveryCause, DeliveryError, Published, SETTLE_WAIT};
pub use claims::{AdmitError, Cause, ClaimAnswers, LifecycleError, Step, Undo};
pub use manager::{Manager, ManagerConfig, StartError};
pub use reconcile::{Outcome, ReconcileConfig, ReconcileReport};
pub use runtime::{BoxFuture, Runtime, RuntimeError};
