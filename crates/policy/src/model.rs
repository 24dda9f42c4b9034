//! Domain types: what the policy decides about, free of any wire format.
//!
//! The resource manager translates NRI messages, kubelet requests and Kubernetes objects into
//! these types at its boundary, so a policy never sees a protobuf or an API object, and a policy
//! can be driven by a simulator or a test with plain values.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::{idset::CpuSet, idset::NodeSet, quantity::Quantity};

/// A pod's Kubernetes quality-of-service class.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum QosClass {
    /// Every container has equal CPU and memory requests and limits.
    Guaranteed,
    /// Some request or limit is set, not Guaranteed.
    Burstable,
    /// No requests or limits (the default, as for a pod that sets nothing).
    #[default]
    BestEffort,
}

/// A pod, as far as placement cares.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pod {
    /// The Kubernetes UID of the pod.
    pub uid: String,
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// QoS class.
    pub qos: QosClass,
    /// Pod annotations; placement hints live under the `resource-policy.resmgr.io` namespace.
    pub annotations: BTreeMap<String, String>,
}

/// CPU and memory requests and limits of a container.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Resources {
    /// CPU request in milli-CPUs.
    pub cpu_request_milli: u64,
    /// CPU limit in milli-CPUs; `None` is unlimited.
    pub cpu_limit_milli: Option<u64>,
    /// Memory request in bytes.
    pub memory_request_bytes: u64,
    /// Memory limit in bytes; `None` is unlimited.
    pub memory_limit_bytes: Option<u64>,
}

/// A container, as far as placement cares.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Container {
    /// The runtime's container ID.
    pub id: String,
    /// The pod the container belongs to.
    pub pod: Pod,
    /// The container's name within its pod.
    pub name: String,
    /// Requests and limits.
    pub resources: Resources,
    /// Container annotations.
    pub annotations: BTreeMap<String, String>,
    /// Fully qualified CDI device names the runtime injected (`vendor/class=name`). Only
    /// runtimes that report them fill this (containerd 2.3 and later); see [`Container::env`].
    pub cdi_devices: Vec<String>,
    /// The container's environment, `NAME=VALUE`: the fallback way to find the claims a container
    /// uses when the runtime does not report CDI devices.
    pub env: Vec<String>,
    /// The cpuset the container runs on now, when known (on sync after a restart).
    pub cpus: Option<CpuSet>,
    /// The memory nodes the container is pinned to now, when known.
    pub mems: Option<NodeSet>,
}

/// One DRA allocation result of a claim, for our driver.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllocationResult {
    /// The request it satisfies, `<request>` or `<request>/<subrequest>`.
    pub request: String,
    /// The pool the device was published in.
    pub pool: String,
    /// The device name as published by [`Device::name`].
    pub device: String,
    /// The share of a device that allows multiple allocations.
    pub share_id: Option<String>,
    /// Capacity consumed from the device, by capacity name (for example `cpu`).
    pub consumed_capacity: BTreeMap<String, Quantity>,
}

/// A ResourceClaim allocated to our driver.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claim {
    /// The claim's UID.
    pub uid: String,
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// UIDs of the pods the claim is reserved for: only these may use it.
    pub reserved_for: Vec<String>,
    /// The claim's allocation results for our driver, in the claim's order.
    pub results: Vec<AllocationResult>,
    /// The opaque configurations for our driver the allocation carries (from the DeviceClass
    /// and from the claim), in the API's order; see [`ClaimConfig`] for which apply to a result.
    #[serde(default)]
    pub config: Vec<ClaimConfig>,
    /// The name the pod gives the claim (`pod.spec.resourceClaims[].name`), for a claim the
    /// resource claim controller made from a ResourceClaimTemplate (its
    /// `resource.kubernetes.io/pod-claim-name` annotation); `None` for a claim the pod names
    /// itself. Where a container finds the claim's device metadata depends on it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_claim_name: Option<String>,
}

impl Claim {
    /// The configurations that apply to a result for `request`, lowest precedence first: see
    /// [`ClaimConfig`].
    pub fn configs_for<'a>(&'a self, request: &'a str) -> impl Iterator<Item = &'a ClaimConfig> {
        let class = self
            .config
            .iter()
            .filter(|c| c.source == ConfigSource::Class);
        let claim = self
            .config
            .iter()
            .filter(|c| c.source == ConfigSource::Claim);
        class.chain(claim).filter(move |c| c.applies_to(request))
    }
}

/// Where a claim's configuration came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ConfigSource {
    /// The DeviceClass of the request (`FromClass`): set by the cluster administrator.
    Class,
    /// The ResourceClaim itself (`FromClaim`): set by the workload owner.
    Claim,
}

/// One opaque configuration for our driver in a claim's allocation
/// (`status.allocation.devices.config[]`).
///
/// Which configurations apply to an allocation result, and in what order:
///
/// - a configuration applies to a result when its `requests` is empty (all requests) or names
///   the result's request, either in full (`req/sub`) or by its base name (`req`, which covers
///   all its subrequests);
/// - the class's configurations come before the claim's, each in the API's order;
/// - later ones override earlier ones field by field: a field a later configuration does not
///   set keeps the earlier value. So a claim overrides its class, and among a claim's own
///   configurations the last one listed wins, whether it names the request or not.
///
/// [`Claim::configs_for`] yields them in that order. What `parameters` means is the policy's
/// business; a policy refuses a claim whose parameters it cannot decode rather than ignore them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClaimConfig {
    /// Class or claim.
    pub source: ConfigSource,
    /// The requests it applies to; empty means all of them.
    #[serde(default)]
    pub requests: Vec<String>,
    /// The opaque parameters, as the API server stored them.
    pub parameters: serde_json::Value,
}

impl ClaimConfig {
    /// Whether it applies to a result for `request` (`req` or `req/sub`).
    pub fn applies_to(&self, request: &str) -> bool {
        let base = request.split_once('/').map_or(request, |(base, _)| base);
        self.requests.is_empty() || self.requests.iter().any(|r| r == request || r == base)
    }
}

/// What the policy sets on a container being created.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Adjustment {
    /// The cpuset to run on; `None` leaves the runtime's choice.
    pub cpus: Option<CpuSet>,
    /// The memory nodes to allocate from; `None` leaves the runtime's choice.
    pub mems: Option<NodeSet>,
    /// The memory limit in bytes; `None` leaves the one the kubelet set. Set for a container
    /// using claims that granted memory: their memory, or the kubelet's limit when lower.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_limit_bytes: Option<u64>,
    /// Hugepage limits in bytes, by page size in bytes; sizes not listed keep the kubelet's
    /// limit (which is 0 for sizes the pod does not request). Set for a container using claims
    /// that granted hugepages.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub hugepage_limits: BTreeMap<u64, u64>,
}

/// A change to a container that already exists.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerUpdate {
    /// The runtime's container ID.
    pub container_id: String,
    /// The new cpuset; `None` leaves it alone.
    pub cpus: Option<CpuSet>,
    /// The new memory nodes; `None` leaves them alone.
    pub mems: Option<NodeSet>,
}

/// The policy's answer to a container being created.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Allocation {
    /// What to set on the new container.
    pub adjustment: Adjustment,
    /// Changes to other containers the placement made (for example shared pools shrinking).
    pub updates: Vec<ContainerUpdate>,
    /// What the operator should know about the placement: what the policy did instead of
    /// refusing (shared CPUs for a container that asked for exclusive ones, the reserved CPUs
    /// when nothing else is shared). The resource manager logs each as a warning.
    pub warnings: Vec<String>,
}

/// The policy's answer to a claim allocation.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClaimAllocation {
    /// Exactly one set of CDI edits per allocation result, in result order: what a container
    /// using that result gets injected.
    pub edits: Vec<cdi::ContainerEdits>,
    /// Changes to running containers the allocation made.
    pub updates: Vec<ContainerUpdate>,
    /// What the operator should know about the allocation: a configuration granted as well as
    /// the allocation allows rather than refused (`fullCores` on per-CPU devices), shared
    /// containers moved off the CPUs the claim took. The resource manager logs each as a
    /// warning.
    pub warnings: Vec<String>,
    /// What a container using each result may read of it, in result order: the attributes of
    /// its device and of what it was granted, by qualified name (bare names are in the driver's
    /// domain, as in [`Device::attributes`]). The resource manager writes them into the claim's
    /// device metadata (KEP-5304), which the runtime mounts into the container. Either one map
    /// per result or none at all (a policy that says nothing: the metadata then names the
    /// devices only).
    pub attributes: Vec<BTreeMap<String, AttributeValue>>,
}

/// A typed attribute value of a published device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum AttributeValue {
    /// An integer.
    Int(i64),
    /// A boolean.
    Bool(bool),
    /// A string (at most 64 characters).
    String(String),
    /// A semantic version.
    Version(String),
    /// A non-empty list of strings (each at most 64 characters): a list attribute, which the API
    /// server keeps only with the `DRAListTypeAttributes` gate, and which `matchAttribute`
    /// matches by intersection there.
    Strings(Vec<String>),
    /// A non-empty list of integers: a list attribute like [`AttributeValue::Strings`]. The
    /// topology-aware policy uses it only in device metadata (a result's CPU numbers), which no
    /// API server sees.
    Ints(Vec<i64>),
}

/// Which amounts a request may consume from a capacity.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ValidValues {
    /// One of these values, sorted ascending.
    Values(Vec<Quantity>),
    /// A range with an optional upper bound and step.
    Range {
        /// Smallest amount.
        min: Quantity,
        /// Largest amount.
        max: Option<Quantity>,
        /// Amounts are `min + k * step`.
        step: Option<Quantity>,
    },
}

/// How requests consume a capacity of a device that allows multiple allocations.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestPolicy {
    /// What a request that names no amount consumes.
    pub default: Option<Quantity>,
    /// What a request may consume.
    pub valid: ValidValues,
}

/// A capacity of a published device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Capacity {
    /// How much there is.
    pub value: Quantity,
    /// How requests consume it, for devices that allow multiple allocations.
    pub request_policy: Option<RequestPolicy>,
}

/// A device the policy offers for DRA allocation, published in our node's ResourceSlices.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Device {
    /// Device name, unique on the node (a DNS label).
    pub name: String,
    /// Attributes by qualified name (`resource.kubernetes.io/numaNode`) or bare name (in the
    /// driver's own domain).
    pub attributes: BTreeMap<String, AttributeValue>,
    /// Capacities by name.
    pub capacities: BTreeMap<String, Capacity>,
    /// Whether several claims may share the device, each consuming part of its capacity.
    pub allow_multiple_allocations: bool,
    /// Taints (KEP-5055): what keeps the scheduler from allocating the device to new claims.
    /// Policies publish none; the agent taints a device whose CPUs went offline or whose NUMA
    /// node lost its memory, and takes the taint off when they are back.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub taints: Vec<DeviceTaint>,
}

/// A taint on a published device (`devices[].taints[]` of a ResourceSlice).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceTaint {
    /// A label name: `<driver>/cpus-offline`.
    pub key: String,
    /// A label value saying why: which CPUs, which node.
    pub value: String,
    /// What it does to claims that do not tolerate it.
    pub effect: TaintEffect,
    /// When it was first seen, in seconds since the Unix epoch; the API server sets it when
    /// absent.
    pub time_added: Option<i64>,
}

/// A device taint's effect on claims that do not tolerate it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum TaintEffect {
    /// The scheduler allocates the device to no new claim; claims allocated before keep it.
    NoSchedule,
    /// As `NoSchedule`, and the claims allocated before are evicted with their pods.
    NoExecute,
    /// Nothing: the taint only informs.
    None,
}

impl TaintEffect {
    /// As the API spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NoSchedule => "NoSchedule",
            Self::NoExecute => "NoExecute",
            Self::None => "None",
        }
    }
}
