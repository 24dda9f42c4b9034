//! The `Policy` trait: the swap point between the resource manager and placement decisions.
//!
//! # Contract
//!
//! A policy is a pure state machine. The resource manager owns it, calls it under one lock, and
//! does all IO: it persists [`Policy::snapshot`], delivers the [`ContainerUpdate`]s the policy
//! returns to the runtime, writes the CDI specs built from [`ClaimAllocation::edits`], and
//! publishes [`Policy::devices`] as ResourceSlices. A policy does no IO (topology discovery at
//! construction is the one exception) and returns the same decisions for the same inputs.
//!
//! The life of a policy:
//!
//! 1. construction (policy-specific: topology, configuration);
//! 2. [`Policy::restore`] with the last [`Policy::snapshot`] the resource manager saved, if any;
//!    a policy restores its claims from it (claims cannot be rebuilt from running containers);
//! 3. [`Policy::sync`] with every container the runtime reports as running: the policy rebuilds
//!    container placement, keeping every restored claim where it is;
//! 4. then, interleaved: [`Policy::allocate`] / [`Policy::update`] / [`Policy::release`] for
//!    container events and [`Policy::allocate_claim`] / [`Policy::release_claim`] for DRA claims.
//!
//! Every mutating call returns the updates it made to *other* running containers (a shared pool
//! that shrinks when an exclusive grant is cut out of it, and grows back on release). Updates are
//! level-triggered: each carries the full desired cpuset/mems, so the latest one for a container
//! supersedes earlier ones.
//!
//! # Claims
//!
//! - [`Policy::allocate_claim`] returns exactly one [`cdi::ContainerEdits`] per allocation result,
//!   each non-empty (CDI refuses a device without edits). It is idempotent: allocating a claim UID
//!   the policy already holds returns the same edits and changes nothing. It is called on every
//!   prepare, including re-prepares after a reboot.
//! - [`Policy::release_claim`] of an unknown UID is success.
//! - [`Policy::claims`] lists the UIDs the policy accounts for; the resource manager removes CDI
//!   specs of any other claim at start-up.
//! - A policy that does not serve claims returns [`PolicyError::NoDraClaims`] from
//!   [`Policy::devices`] and [`Policy::allocate_claim`]; the resource manager then publishes no
//!   devices and fails every claim with a clear message.
//!
//! # Errors
//!
//! [`PolicyError`] says what did not fit and where. A failed call must leave the policy as it was
//! before the call.

use crate::model::{
    Allocation, Claim, ClaimAllocation, Container, ContainerUpdate, Device, Resources,
};

/// Why a policy refused or failed a request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    /// The policy does not serve DRA claims.
    #[error("this policy does not serve DRA claims")]
    NoDraClaims,
    /// The request cannot be satisfied with what is free.
    #[error("{subject} does not fit: {reason}")]
    DoesNotFit {
        /// What was asked for, for example `container default/web/app` or `claim 1234`.
        subject: String,
        /// What was missing and where, for example `needs 4 exclusive CPUs, numa1 has 2 free`.
        reason: String,
    },
    /// The request itself is wrong: an unknown device, a malformed annotation, a claim used by a
    /// pod it is not reserved for.
    #[error("invalid request for {subject}: {reason}")]
    Invalid {
        /// What the request was about.
        subject: String,
        /// What was wrong with it.
        reason: String,
    },
    /// The call names a container the policy does not know.
    #[error("unknown container {0}")]
    UnknownContainer(String),
    /// A snapshot could not be restored.
    #[error("cannot restore the policy state: {0}")]
    Restore(String),
}

/// Placement decisions for containers and DRA claims. See the module docs for the contract.
pub trait Policy: Send + std::fmt::Debug {
    /// A short name for logs and metrics, for example `topology-aware`.
    fn name(&self) -> &str;

    /// Restores durable state saved by [`Policy::snapshot`]. Called at most once, before
    /// anything else.
    fn restore(&mut self, snapshot: &serde_json::Value) -> Result<(), PolicyError>;

    /// The policy's durable state: whatever it must get back through [`Policy::restore`] after a
    /// restart (its claims and their CPUs). Container placement is rebuilt by [`Policy::sync`].
    fn snapshot(&self) -> serde_json::Value;

    /// Rebuilds container placement from the running containers the runtime reports; returns
    /// updates for those whose placement changed.
    fn sync(&mut self, containers: &[Container]) -> Result<Vec<ContainerUpdate>, PolicyError>;

    /// Places a container being created.
    fn allocate(&mut self, container: &Container) -> Result<Allocation, PolicyError>;

    /// A running container's requests or limits changed; returns updates, the container's own
    /// last.
    fn update(
        &mut self,
        container_id: &str,
        resources: &Resources,
    ) -> Result<Vec<ContainerUpdate>, PolicyError>;

    /// A container stopped; releases what it held. An unknown container is success.
    fn release(&mut self, container_id: &str) -> Result<Vec<ContainerUpdate>, PolicyError>;

    /// The devices to publish for DRA.
    fn devices(&self) -> Result<Vec<Device>, PolicyError>;

    /// Allocates a claim's results; idempotent per claim UID.
    fn allocate_claim(&mut self, claim: &Claim) -> Result<ClaimAllocation, PolicyError>;

    /// Releases a whole claim; an unknown UID is success.
    fn release_claim(&mut self, uid: &str) -> Result<Vec<ContainerUpdate>, PolicyError>;

    /// The UIDs of the claims the policy accounts for.
    fn claims(&self) -> Vec<String>;
}
