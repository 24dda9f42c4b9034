//! The `Policy` trait: the swap point between the resource manager and placement decisions.
//!
//! This page is all a team needs to write its own policy. `examples/first_fit.rs` is a complete
//! one in under 150 lines; the topology-aware policy ([`crate::topology_aware`]) is the full one.
//!
//! # Contract
//!
//! A policy is a pure state machine. The resource manager owns it (as a `Box<dyn Policy>`),
//! calls it under one lock, one call at a time, and does all IO: it persists
//! [`Policy::snapshot`], delivers the [`ContainerUpdate`]s the policy returns to the runtime,
//! writes the CDI specs built from [`ClaimAllocation::edits`], and publishes
//! [`Policy::devices`] as ResourceSlices. A policy does no IO (topology discovery at
//! construction is the one exception), spawns nothing, and returns the same decisions for the
//! same inputs (iterate ordered maps, break every tie on an id).
//!
//! The life of a policy:
//!
//! 1. construction (policy-specific: topology, configuration);
//! 2. [`Policy::restore`] with the last [`Policy::snapshot`] the resource manager saved, if
//!    there is a saved state at all (a fresh node skips this step);
//! 3. [`Policy::sync`] with every container the runtime reports as running: the policy rebuilds
//!    container placement, keeping every restored claim where it is;
//! 4. then, interleaved, in the order events happen: [`Policy::allocate`] / [`Policy::update`] /
//!    [`Policy::release`] for container events, [`Policy::allocate_claim`] /
//!    [`Policy::release_claim`] for DRA claims, [`Policy::adopt_container`] for a running
//!    container the runtime's Synchronize did not list, and [`Policy::sync`] again whenever the
//!    runtime reconnects.
//!
//! # Cpusets, memory nodes and updates
//!
//! A policy answers in [`crate::CpuSet`]s and [`crate::NodeSet`]s (kernel numbering; they print
//! in the `cpuset.cpus` list format). `None` in an [`crate::Adjustment`] or a
//! [`ContainerUpdate`] means "leave the runtime's value alone"; an empty set is never a valid
//! cpuset.
//!
//! Every mutating call returns the updates it made to *other* running containers: for example a
//! shared pool that shrinks when an exclusive grant is cut out of it, and grows back on release.
//! Updates are level-triggered: each carries the full desired cpuset (and memory nodes, when the
//! policy pins them), so the latest one for a container supersedes earlier ones and a lost one
//! is repaired by the next. Report a container at most once per call, never the container the
//! call is about in [`Allocation::updates`] (its answer is the adjustment), and only containers
//! that are running (allocated, synced or adopted, not released).
//!
//! # Claims
//!
//! A claim is a ResourceClaim the scheduler allocated on devices this policy published. The
//! resource manager calls [`Policy::allocate_claim`] when the kubelet prepares it, turns each
//! result's edits into the CDI device `<driver>/device=claim-<uid>-<i>` (`i` is the result's
//! index), and calls [`Policy::release_claim`] when the kubelet unprepares it.
//!
//! - [`Policy::allocate_claim`] returns exactly one [`cdi::ContainerEdits`] per allocation result,
//!   in result order, each non-empty (CDI refuses a device without edits). It is idempotent:
//!   allocating a claim UID the policy already holds, with the same allocation results, returns
//!   the same edits and changes nothing else. It is called on every prepare, including
//!   re-prepares after a restart. A UID it holds coming back with other results (the claim was
//!   deallocated and allocated again before its unprepare reached us) is refused with
//!   [`PolicyError::Invalid`] naming the difference, holding on to what it has: the old CPUs may
//!   still be in use, and answering the new results with the old CPUs would tell the kubelet a
//!   device the spec does not grant.
//! - [`Policy::release_claim`] of an unknown UID is success.
//! - [`Policy::adopt_claim`] takes a claim back from the edits it returned for it, read from the
//!   claim's CDI spec, when the saved state does not account for a spec on disk (the state
//!   directory was lost): a spec proves a prepare completed, and a pod may be running on it. It
//!   is called at start-up, after [`Policy::restore`] and before [`Policy::sync`]. A policy that
//!   cannot (the default) refuses, and the resource manager then refuses to start, deleting
//!   nothing.
//! - [`Policy::claim_cpus`] says which CPUs a claim holds (optional, see there).
//! - [`Policy::claims`] lists the UIDs the policy accounts for; the resource manager removes CDI
//!   specs of any other claim at start-up. Claims are durable: they must survive a restart
//!   through [`Policy::snapshot`] and [`Policy::restore`], because running containers do not say
//!   which CPUs a claim held.
//! - A container using a claim carries the claim's CDI device name in [`Container::cdi_devices`]
//!   (when the runtime reports them) and the edits' environment in [`Container::env`]. Only the
//!   device name is proof: a pod can set any environment variable, so a policy that trusts the
//!   environment must check the pod against [`Claim::reserved_for`].
//! - [`Claim::config`] carries the opaque configurations for our driver that the workload owner
//!   (claim) or the administrator (DeviceClass) wrote; [`crate::ClaimConfig`] states which apply
//!   to a result and which wins. A configuration that cannot be decoded is refused
//!   ([`PolicyError::ClaimConfig`]): silently ignoring a configuration it was given is a bug.
//!
//! # What the scheduler was promised
//!
//! A claim reaches the policy only after the scheduler allocated it from [`Policy::devices`], and
//! the scheduler never moves an allocated claim: a claim the policy refuses leaves its pod stuck
//! for good while the kubelet retries. So the devices must promise only what the policy will
//! grant whatever else happens on the node (containers placed through NRI take nothing a device
//! promises), and [`Policy::allocate_claim`] grants what the result consumed. A configuration the
//! scheduler cannot see (say whole cores on devices that hand out single CPUs) does not turn into
//! a refusal: the claim gets what the scheduler allocated, honouring the configuration as far as
//! that allows, and [`ClaimAllocation::warnings`] says what could not be honoured. A policy that
//! needs the scheduler to account for something publishes it in its devices (the topology-aware
//! policy's whole-core devices). Likewise a container the kubelet admitted is never refused for
//! CPUs or memory: it is placed as well as possible (shared CPUs instead of exclusive ones, the
//! reserved CPUs when nothing else is shared) and [`Allocation::warnings`] says so.
//! - A policy that does not serve claims returns [`PolicyError::NoDraClaims`] from
//!   [`Policy::devices`] and [`Policy::allocate_claim`]; the resource manager then publishes no
//!   devices and fails every claim with a clear message.
//!
//! # Inventory
//!
//! [`Policy::inventory`] reports what the policy has placed where: its reserved and shared CPUs,
//! its pools with their CPUs split by use, every container's grant and every claim's CPUs (see
//! [`crate::inventory`]). The resource manager never calls it and no decision depends on it: the
//! binary reads it for the `resmgr_pool_cpus` gauges, `/debug/state`, `resmgr topology` and the
//! simulator's report and drawing. It is called on every scrape and simulated step, under the
//! policy's lock, so it must be cheap (a copy of state the policy already keeps, linear in what
//! it holds) and free of side effects. A policy that keeps the default reports nothing: the
//! binary then exports no pool gauges, shows an empty allocation in `/debug/state`, no pools in
//! `resmgr topology`, and every CPU as unassigned in the simulator, while placement itself works
//! as before.
//!
//! # Errors
//!
//! [`PolicyError`] says what did not fit and where, in words an operator can act on. A failed
//! call must leave the policy exactly as it was before the call: plan on the unchanged state,
//! then commit. Input from outside the process (annotations, claims, snapshots) never panics.

use std::{collections::BTreeMap, sync::Arc};

use crate::{
    idset::CpuSet,
    inventory::Inventory,
    model::{Allocation, Claim, ClaimAllocation, Container, ContainerUpdate, Device, Resources},
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
    /// A claim's configuration for this policy cannot be decoded or honoured.
    #[error("claim {claim}: configuration for {requests}: {field}: {reason}")]
    ClaimConfig {
        /// The claim, `namespace/name (uid)`.
        claim: String,
        /// The requests the configuration applies to, for example `request cpus` or
        /// `all requests`.
        requests: String,
        /// The offending field of the parameters, for example `memoryPinning`.
        field: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The call names a container the policy does not know.
    #[error("unknown container {0}")]
    UnknownContainer(String),
    /// A snapshot (or a claim's CDI edits) could not be restored.
    #[error("cannot restore the policy state: {reason}")]
    Restore {
        /// What cannot be put back and why, in the policy's words: `claim 1234: cpus 4-7 are
        /// not online here`, or `not a topology-aware snapshot`.
        reason: String,
        /// The decoder's error, when the snapshot did not decode.
        #[source]
        source: Option<SnapshotError>,
    },
}

impl PolicyError {
    /// [`PolicyError::Restore`] of what the policy refuses to put back, saying why.
    pub fn restore(reason: impl Into<String>) -> Self {
        Self::Restore {
            reason: reason.into(),
            source: None,
        }
    }

    /// [`PolicyError::Restore`] of a snapshot that does not decode, saying where and why.
    pub fn restore_decoding(reason: impl Into<String>, source: serde_json::Error) -> Self {
        Self::Restore {
            reason: reason.into(),
            source: Some(SnapshotError(Arc::new(source))),
        }
    }

    /// [`PolicyError::Restore`] of a snapshot that does not decode as `policy`'s.
    pub fn undecodable_snapshot(policy: &str, source: serde_json::Error) -> Self {
        Self::Restore {
            reason: format!("not a {policy} snapshot"),
            source: Some(SnapshotError(Arc::new(source))),
        }
    }
}

/// Why a snapshot did not decode: the decoder's error, shared so that [`PolicyError`] stays
/// `Clone`. Two are equal when they say the same.
#[derive(Debug, Clone, thiserror::Error)]
#[error(transparent)]
pub struct SnapshotError(Arc<serde_json::Error>);

impl SnapshotError {
    /// The decoder's error.
    pub fn get(&self) -> &serde_json::Error {
        &self.0
    }
}

impl PartialEq for SnapshotError {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0) || self.0.to_string() == other.0.to_string()
    }
}

impl Eq for SnapshotError {}

/// Placement decisions for containers and DRA claims. See the module docs for the contract.
pub trait Policy: Send + std::fmt::Debug {
    /// A short name for logs and metrics, for example `topology-aware`. The resource manager
    /// also stores it with the saved state and refuses to restore another policy's state, so it
    /// must not change between versions.
    fn name(&self) -> &str;

    /// Restores durable state saved by [`Policy::snapshot`] (possibly by an older version of the
    /// same policy). Called at most once, before anything else, and only when there is a saved
    /// state. Refuse with [`PolicyError::Restore`] what cannot be put back exactly (CPUs that
    /// no longer exist, two claims on one CPU), holding nothing from it: the resource manager
    /// will not start on a state it cannot honour. That includes a snapshot a newer version
    /// wrote with something this one does not know: refuse it naming the version or the field,
    /// never drop the field (an agent rolled back would then save the state without it).
    fn restore(&mut self, snapshot: &serde_json::Value) -> Result<(), PolicyError>;

    /// The policy's durable state: whatever it must get back through [`Policy::restore`] after a
    /// restart (its claims and their CPUs). Container placement is rebuilt by [`Policy::sync`],
    /// so it does not belong here. Called after every mutating call; the resource manager saves
    /// the value when it changed, so equal states must produce equal values. A policy without
    /// durable state returns `Value::Null`.
    fn snapshot(&self) -> serde_json::Value;

    /// Rebuilds container placement from the running containers the runtime reports, replacing
    /// whatever placement the policy had, and keeping its claims. Each container's
    /// [`Container::cpus`] and [`Container::mems`] say what it runs on now; keeping them where
    /// possible avoids moving running workloads. Returns an update for every container whose
    /// desired cpuset or memory nodes differ from what it reported. A running container cannot
    /// be refused: one that no longer fits is placed as well as possible (for example on shared
    /// CPUs), not dropped.
    fn sync(&mut self, containers: &[Container]) -> Result<Vec<ContainerUpdate>, PolicyError>;

    /// Places a container being created: its [`crate::Adjustment`] and the updates the placement
    /// made to other containers. The kubelet admitted it, so it should not be refused for lack
    /// of CPUs or memory (see the module docs): place it as well as possible and say so in
    /// [`Allocation::warnings`]. Refuse with [`PolicyError::Invalid`] what is malformed (the
    /// runtime then fails the container). Allocating a container id the policy already holds
    /// returns its current placement and changes nothing.
    fn allocate(&mut self, container: &Container) -> Result<Allocation, PolicyError>;

    /// Places a running container the policy has not seen, as [`Policy::sync`] would have placed
    /// it had the runtime listed it, among the containers the policy holds. The runtime created
    /// it while no agent was connected and its Synchronize did not list it (CRI-O lists only the
    /// containers it has finished creating), so the policy first hears of it at a later event:
    /// its PostCreateContainer, PostStartContainer, or an update. [`Container::cpus`] and
    /// [`Container::mems`] say what it runs on now (`None`: what the kubelet asked, every CPU
    /// when it asked nothing). Returns the updates the placement made to other running
    /// containers and then, last, the container's own, when what it should run on differs from
    /// what it reports (as [`Policy::sync`] reports one). Like a synchronized container it is
    /// not refused: one that does not fit is placed as well as possible. The resource manager
    /// calls it only with a container it has not given the policy, through [`Policy::sync`],
    /// [`Policy::allocate`] or this, since the policy last released it.
    ///
    /// The default places it through [`Policy::allocate`] (so a request the policy refuses is
    /// refused here too, and the container is left where it runs) and turns the adjustment into
    /// the container's own update; a policy whose sync places a running container otherwise
    /// than a new one (where it runs now, say) implements it.
    fn adopt_container(
        &mut self,
        container: &Container,
    ) -> Result<Vec<ContainerUpdate>, PolicyError> {
        let allocation = self.allocate(container)?;
        let mut updates = allocation.updates;
        let want = allocation.adjustment;
        let cpus_differ = want.cpus.is_some() && want.cpus != container.cpus;
        let mems_differ = want.mems.is_some() && want.mems != container.mems;
        if cpus_differ || mems_differ {
            updates.push(ContainerUpdate {
                container_id: container.id.clone(),
                cpus: want.cpus,
                mems: want.mems,
            });
        }
        Ok(updates)
    }

    /// A running container's requests or limits changed; returns updates, the container's own
    /// last (it is always included). An unknown id is [`PolicyError::UnknownContainer`]; a
    /// refusal keeps the container where it was.
    fn update(
        &mut self,
        container_id: &str,
        resources: &Resources,
    ) -> Result<Vec<ContainerUpdate>, PolicyError>;

    /// A container stopped; releases what it held and returns the updates for containers that
    /// gain from it. An unknown container is success.
    fn release(&mut self, container_id: &str) -> Result<Vec<ContainerUpdate>, PolicyError>;

    /// The devices to publish for DRA, in a stable order. They are published at start-up and
    /// again after a claim is released if the list changed; so they should depend on the machine
    /// and configuration, not on what is allocated (consumable capacity is accounted by the
    /// scheduler), except to withhold what claims the scheduler does not count hold (claims on
    /// devices of an earlier configuration, restored from a snapshot), until they are released.
    /// Everything they promise must be grantable to the claims the scheduler allocates from
    /// them, whatever the containers on the node (see the module docs). An empty list publishes
    /// an empty pool.
    fn devices(&self) -> Result<Vec<Device>, PolicyError>;

    /// Allocates a claim's results: one non-empty set of edits per result, in result order,
    /// plus the updates the allocation made to running containers. Idempotent per claim UID
    /// (see the module docs). A result naming a device this policy does not publish is
    /// [`PolicyError::Invalid`]; one that cannot be satisfied (which the scheduler does not do
    /// from current devices) is [`PolicyError::DoesNotFit`]; a [`Claim::config`] the policy
    /// cannot decode is [`PolicyError::ClaimConfig`]; and then no result of the claim is
    /// allocated. A configuration that decodes but cannot be honoured on the devices the
    /// scheduler picked is not a refusal: grant what was allocated and say why in
    /// [`ClaimAllocation::warnings`]. The configuration is read when the claim is first
    /// allocated; a UID already held keeps what it got, and is refused with
    /// [`PolicyError::Invalid`] if its results changed.
    fn allocate_claim(&mut self, claim: &Claim) -> Result<ClaimAllocation, PolicyError>;

    /// Takes claim `uid` back from `edits`, the edits [`Policy::allocate_claim`] returned for
    /// it (read back from its CDI spec), holding exactly what they grant; see the module docs.
    /// What the edits do not say (requests, pods, namespace and name) the next
    /// [`Policy::allocate_claim`] of the UID tells, with the same idempotency rules. Refuse with
    /// [`PolicyError::Restore`] edits the policy did not write, or CPUs it cannot hold (not
    /// claimable, held already), holding nothing from them. A UID already held is success. The
    /// default refuses every claim.
    fn adopt_claim(&mut self, uid: &str, edits: &[cdi::ContainerEdits]) -> Result<(), PolicyError> {
        let _ = edits;
        Err(PolicyError::restore(format!(
            "claim {uid}: policy {} cannot take claims back from their CDI specs",
            self.name()
        )))
    }

    /// Releases a whole claim and returns the updates for containers that gain from it; an
    /// unknown UID is success. Containers still using the claim keep their cpusets until they
    /// are released or synced.
    fn release_claim(&mut self, uid: &str) -> Result<Vec<ContainerUpdate>, PolicyError>;

    /// The UIDs of the claims the policy accounts for, sorted.
    fn claims(&self) -> Vec<String>;

    /// The CPUs claim `uid` holds, if the policy says. The resource manager uses it before a new
    /// claim's spec grants its CPUs, to wait for every container that may still run on them
    /// (one the policy moved away earlier, whose update the runtime has not confirmed). The
    /// default says nothing; the resource manager then waits for every container that may run
    /// outside the CPUs the policy gives it, which holds claims back more often.
    fn claim_cpus(&self, uid: &str) -> Option<crate::CpuSet> {
        let _ = uid;
        None
    }

    /// What the policy has placed where, for metrics, debugging and the simulator; never for
    /// decisions (see the module docs). Cheap and free of side effects. The default reports
    /// nothing ([`Inventory::default`]), which costs a policy its pool gauges and drawings but
    /// nothing else.
    fn inventory(&self) -> Inventory {
        Inventory::default()
    }

    /// The CPUs behind each device [`Policy::devices`] publishes, by device name: what a
    /// device's health depends on (resmgr tells the kubelet a device is unhealthy while a CPU
    /// behind it is offline). Like [`Policy::inventory`], never for decisions; cheap. The
    /// default names none, and then a device is healthy for as long as it is published.
    fn device_cpus(&self) -> BTreeMap<String, CpuSet> {
        BTreeMap::new()
    }

    /// Counters of what the resource manager reads back after calls: it saves
    /// [`Policy::snapshot`] and re-reads [`Policy::devices`] and [`Policy::device_cpus`] only
    /// when their counter moved, so an event that changed neither costs it nothing. A policy that
    /// keeps counters must move each whenever what it counts could read differently. The
    /// default tracks nothing: the manager then serializes the snapshot after every mutating
    /// call to compare it, and re-reads the devices, which is correct and costs every event
    /// time that grows with what the node holds.
    fn generations(&self) -> Generations {
        Generations::default()
    }
}

/// What [`Policy::generations`] reports; `None` where the policy keeps no counter.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Generations {
    /// Moves whenever [`Policy::snapshot`] would return another value.
    pub durable: Option<u64>,
    /// Moves whenever [`Policy::devices`] or [`Policy::device_cpus`] would.
    pub devices: Option<u64>,
}
