//! The scenario file: a machine and a list of steps, in YAML, checked with line numbers.
//!
//! ```yaml
//! topology: "pack:2 numa:2 core:8 pu:2"     # a synthetic description, or live, or xml:<file>
//! reserved-cpus: "0-1"                      # a cpuset, as the kubelet writes it (or:)
//! # reserved-cpu-count: 2                   # this many CPUs (the default: 1)
//! steps:
//!   - pod: {name: web, namespace: default, qos: Burstable}
//!   - container: {pod: web, name: app, cpu-request: 500m, memory: 256Mi}
//!   - pod: {name: db, qos: Guaranteed}
//!   - claim: {name: db-cpus, pod: db, results: [{request: cpus, device: numa1, cpu: 4}]}
//!   # optional on a claim: its opaque configuration for our driver, as the claim (`source:
//!   # claim`, the default) or its DeviceClass (`source: class`) would carry it
//!   #   config: [{requests: [cpus], parameters: {apiVersion: resmgr.io/v1alpha1,
//!   #             kind: CpuConfig, memoryPinning: false}}]
//!   - container: {pod: db, name: postgres, cpu-request: 4, memory: 1Gi, claims: [db-cpus]}
//!   # or let the scheduler allocate the claim from what the agent publishes at that moment:
//!   # CPUs of a shared device's `cpu` capacity, or a count of devices on one NUMA node
//!   - schedule: {name: more-cpus, pod: db, cpu: 2500m}
//!   - schedule: {name: four, pod: db, count: 4, match-attribute: resource.kubernetes.io/numaNode}
//!   # several requests: requests: [{name: a, count: 2, selector: {socket: 1}}, {name: b, cpu: 2}]
//!   #   with constraints: [{requests: [a], match-attribute: resource.kubernetes.io/numaNode}]
//!   - update: {pod: web, container: app, cpu-request: 2}
//!   - restart
//!   # the operator changes the agent's settings (header keys, below) and it restarts with them
//!   - reconfigure: {cpu-exclusivity: partition, claim-cpus: 8-15}
//!   - remove: {pod: web}
//!   # CPUs (or a NUMA node's memory) go offline: the agent taints the devices behind them, and
//!   # the scheduler allocates them to no new claim until they come back
//!   - offline: {cpus: 4-5}
//!   - online: {cpus: 4-5}
//! ```
//!
//! A claim made from a ResourceClaimTemplate says the pod's name for it, `pod-claim-name`, on a
//! claim or schedule step: its containers find its device metadata under that name.
//!
//! `feature-gates: {DRAConsumableCapacity: false}` runs the scheduler as a cluster without
//! consumable capacity (the default of Kubernetes 1.34 and 1.35) would: shared devices are
//! handed out whole. It is on by default, as from 1.36.
//!
//! The policy's settings are header keys with the agent's names and values (docs/kubernetes.md):
//! `cpu-exclusivity` (`claims`, `partition` with `claim-cpus`, `pods`), `device-mode`
//! (`grouped`, `individual`), `group-by` (`numa`, `socket`), `claim-granularity` (`cpu`, `core`),
//! `reserved-memory`, `claim-memory`, `claim-hugepages`. A synthetic topology cannot say which
//! hugepages its nodes keep: `hugepages: "0:2Mi=512;1:2Mi=512,1Gi=4"` does (pages per size).
//! A scheduled request asks for memory and hugepages under `capacity`:
//! `schedule: {name: db, pod: db, cpu: 4, capacity: {memory: 16Gi, hugepages1Gi: 2Gi}}`.
//! A request names the chart's DeviceClass for CPUs (devices with the `cpu` capacity) unless it
//! says `class: memory`: the memory devices of `device-mode: individual`, as the DeviceClass of
//! examples/kubernetes/claim-cpus-memory-individual.yaml selects them (`memoryKind: dram`):
//! `requests: [{name: memory, class: memory, capacity: {memory: 16Gi}}, {name: cpus, count:
//! 4}]` with `constraints: [{match-attribute: resource.kubernetes.io/numaNode}]`.
//!
//! Shape errors come from the YAML decoder with its line and column; meaning errors (a container
//! of a pod never declared, a claim used before it exists) are found here, with the line of the
//! step, before anything runs.

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt,
    path::Path,
};

use policy::{
    AttributeValue, CpuSet, NodeSet, QosClass, Quantity, TopologySource,
    scheduler::{ClaimSpec, Constraint, DeviceRequest, Gates, Selector},
    topology_aware::{DeviceModel, Exclusivity, MemoryConfig, ReservedCpus},
};
use serde::{Deserialize, Deserializer};

use crate::values;

/// A checked scenario.
#[derive(Debug, Clone)]
pub struct Scenario {
    pub description: Option<String>,
    pub topology: TopologySource,
    /// The line of the `topology:` key, for errors found when loading it.
    pub topology_line: Option<usize>,
    pub reserved_cpus: ReservedCpus,
    pub reserved_namespaces: Option<Vec<String>>,
    /// Who gets CPUs of their own (`cpu-exclusivity`, `claim-cpus`).
    pub exclusivity: Exclusivity,
    /// How the claimable CPUs are published (`device-mode`, `group-by`, `claim-granularity`).
    pub devices: DeviceModel,
    /// `reserved-memory`, `claim-memory`, `claim-hugepages`.
    pub memory: MemoryConfig,
    /// Hugepages each node keeps (`hugepages`), which a synthetic topology cannot say: node
    /// number -> page size in bytes -> pages.
    pub hugepages: BTreeMap<u32, BTreeMap<u64, u64>>,
    pub node_name: String,
    /// The feature gates the simulated scheduler runs with.
    pub gates: Gates,
    /// Steps with their 1-based line, when it could be found.
    pub steps: Vec<(Option<usize>, Step)>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct File {
    #[serde(default)]
    description: Option<String>,
    topology: String,
    #[serde(default)]
    reserved_cpus: Option<Scalar>,
    #[serde(default)]
    reserved_cpu_count: Option<Scalar>,
    #[serde(default)]
    reserved_namespaces: Option<Vec<String>>,
    #[serde(default)]
    node_name: Option<String>,
    #[serde(default)]
    cpu_exclusivity: Option<String>,
    #[serde(default)]
    claim_cpus: Option<Scalar>,
    #[serde(default)]
    device_mode: Option<String>,
    #[serde(default)]
    group_by: Option<String>,
    #[serde(default)]
    claim_granularity: Option<String>,
    #[serde(default)]
    reserved_memory: Option<String>,
    #[serde(default)]
    claim_memory: Option<String>,
    #[serde(default)]
    claim_hugepages: Option<bool>,
    #[serde(default)]
    hugepages: Option<String>,
    #[serde(default)]
    feature_gates: FeatureGates,
    // Steps are written `- pod: {...}`: a map with the variant's name as its one key.
    #[serde(with = "serde_yaml_ng::with::singleton_map_recursive")]
    steps: Vec<Step>,
}

/// The Kubernetes feature gates that change what the scheduler does with our devices.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct FeatureGates {
    #[serde(rename = "DRAConsumableCapacity", default = "on")]
    consumable_capacity: bool,
}

impl Default for FeatureGates {
    fn default() -> Self {
        Self {
            consumable_capacity: true,
        }
    }
}

fn on() -> bool {
    true
}

/// One thing that happens on the node.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub enum Step {
    /// A pod is scheduled to the node.
    Pod(PodStep),
    /// A claim is allocated (by the scheduler) and prepared (by the kubelet).
    Claim(ClaimStep),
    /// The simulated scheduler allocates a claim from what the agent publishes now, then the
    /// kubelet prepares it.
    Schedule(ScheduleStep),
    /// A container is created and started.
    Container(ContainerStep),
    /// A container's resources change.
    Update(UpdateStep),
    /// A container, or a whole pod with its claims, goes away.
    Remove(RemoveStep),
    /// The agent restarts: state reloaded from disk, runtime synchronized again.
    Restart,
    /// The agent restarts with some of its settings changed.
    Reconfigure(ReconfigureStep),
    /// CPUs, or the memory of NUMA nodes, go offline: the kernel takes them away.
    Offline(HardwareStep),
    /// CPUs, or the memory of NUMA nodes, come back online.
    Online(HardwareStep),
}

/// The CPUs and NUMA nodes' memory an `offline` or `online` step concerns.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct HardwareStep {
    /// CPUs, in the kernel's list format.
    #[serde(default)]
    pub cpus: Option<String>,
    /// NUMA nodes whose memory goes or comes, in the kernel's list format.
    #[serde(default)]
    pub memory_nodes: Option<String>,
}

impl HardwareStep {
    /// The CPUs and nodes, parsed; what does not parse says which field.
    pub fn sets(&self) -> Result<(CpuSet, NodeSet), String> {
        let cpus = match &self.cpus {
            Some(list) => list
                .parse()
                .map_err(|e| format!("cpus: {list:?} is not a cpu list: {e}"))?,
            None => CpuSet::new(),
        };
        let nodes = match &self.memory_nodes {
            Some(list) => list
                .parse()
                .map_err(|e| format!("memory-nodes: {list:?} is not a node list: {e}"))?,
            None => NodeSet::new(),
        };
        if cpus.is_empty() && nodes.is_empty() {
            return Err("name cpus or memory-nodes".to_owned());
        }
        Ok((cpus, nodes))
    }

    /// `verb` agreeing with what the step names: `go` for CPUs, `goes` for a node's memory.
    fn verb(&self, verb: &str) -> String {
        if self.cpus.is_none() {
            format!("{verb}es")
        } else {
            verb.to_owned()
        }
    }

    fn describe(&self) -> String {
        let mut parts = Vec::new();
        if let Some(cpus) = &self.cpus {
            parts.push(format!("cpus {cpus}"));
        }
        if let Some(nodes) = &self.memory_nodes {
            parts.push(format!("the memory of numa node {nodes}"));
        }
        parts.join(" and ")
    }
}

/// Settings changed on a restart; the ones not written keep their values (except `claim-cpus`,
/// which goes when `cpu-exclusivity` changes to something other than `partition`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct ReconfigureStep {
    #[serde(default)]
    pub cpu_exclusivity: Option<String>,
    #[serde(default)]
    claim_cpus: Option<Scalar>,
    #[serde(default)]
    pub device_mode: Option<String>,
    #[serde(default)]
    pub group_by: Option<String>,
    #[serde(default)]
    pub claim_granularity: Option<String>,
    /// The settings in effect after it, worked out when the scenario is read.
    #[serde(skip)]
    pub resolved: Option<(Exclusivity, DeviceModel)>,
}

impl ReconfigureStep {
    /// `cpu-exclusivity: partition, claim-cpus: 8-15`, as written.
    pub fn written(&self) -> String {
        let mut parts = Vec::new();
        let mut add = |key: &str, v: Option<&str>| {
            if let Some(v) = v {
                parts.push(format!("{key}: {v}"));
            }
        };
        add("cpu-exclusivity", self.cpu_exclusivity.as_deref());
        add("claim-cpus", self.claim_cpus.as_ref().map(|s| s.0.as_str()));
        add("device-mode", self.device_mode.as_deref());
        add("group-by", self.group_by.as_deref());
        add("claim-granularity", self.claim_granularity.as_deref());
        parts.join(", ")
    }
}

/// The policy settings as written, for working out what a `reconfigure` step leaves.
#[derive(Debug, Clone, Default)]
struct WrittenSettings {
    cpu_exclusivity: Option<String>,
    claim_cpus: Option<String>,
    device_mode: Option<String>,
    group_by: Option<String>,
    claim_granularity: Option<String>,
}

impl WrittenSettings {
    fn resolve(&self) -> Result<(Exclusivity, DeviceModel), values::PolicyValueError> {
        values::policy_settings(&values::PolicyValues {
            cpu_exclusivity: self.cpu_exclusivity.as_deref(),
            claim_cpus: self.claim_cpus.as_deref(),
            device_mode: self.device_mode.as_deref(),
            group_by: self.group_by.as_deref(),
            claim_granularity: self.claim_granularity.as_deref(),
        })
    }

    fn change(&mut self, r: &ReconfigureStep) {
        if let Some(v) = &r.cpu_exclusivity {
            if v.trim() != "partition" {
                self.claim_cpus = None;
            }
            self.cpu_exclusivity = Some(v.clone());
        }
        if let Some(v) = &r.claim_cpus {
            self.claim_cpus = Some(v.0.clone());
        }
        for (mine, theirs) in [
            (&mut self.device_mode, &r.device_mode),
            (&mut self.group_by, &r.group_by),
            (&mut self.claim_granularity, &r.claim_granularity),
        ] {
            if theirs.is_some() {
                mine.clone_from(theirs);
            }
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct PodStep {
    pub name: String,
    #[serde(default = "default_namespace")]
    pub namespace: String,
    #[serde(default = "default_qos")]
    pub qos: QosClass,
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
}

fn default_namespace() -> String {
    "default".into()
}

fn default_qos() -> QosClass {
    QosClass::Burstable
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct ClaimStep {
    pub name: String,
    /// The pod the claim is reserved for; the claim lives in its namespace.
    pub pod: String,
    /// The pod's name for the claim, when the claim was made from a ResourceClaimTemplate
    /// (`pod.spec.resourceClaims[].name`): where its containers find its device metadata.
    #[serde(default)]
    pub pod_claim_name: Option<String>,
    pub results: Vec<ResultStep>,
    /// Opaque configuration for our driver, in the order the allocation would list it.
    #[serde(default)]
    pub config: Vec<ConfigStep>,
}

/// One `status.allocation.devices.config[]` entry of our driver.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct ConfigStep {
    /// Where it came from: `claim` (the default) or `class`.
    #[serde(default)]
    pub source: ConfigSourceStep,
    /// The requests it applies to; empty means all.
    #[serde(default)]
    pub requests: Vec<String>,
    /// The opaque parameters, passed to the policy as they are.
    pub parameters: serde_json::Value,
}

/// Where a configuration came from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ConfigSourceStep {
    /// The ResourceClaim.
    #[default]
    Claim,
    /// Its DeviceClass.
    Class,
}

/// A claim the scheduler allocates: one request written inline (`count`, `cpu`, `selector`,
/// `match-attribute`), or several under `requests` with `constraints`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct ScheduleStep {
    pub name: String,
    /// The pod the claim is reserved for; the claim lives in its namespace.
    pub pod: String,
    /// As on a claim step.
    #[serde(default)]
    pub pod_claim_name: Option<String>,
    /// The inline request's name (default `cpus`).
    #[serde(default)]
    pub request: Option<String>,
    #[serde(default)]
    pub count: Option<u32>,
    #[serde(default)]
    pub cpu: Option<Qty>,
    /// Other capacities each device must give (`memory: 16Gi`, `hugepages1Gi: 2Gi`).
    #[serde(default)]
    pub capacity: BTreeMap<String, Qty>,
    #[serde(default)]
    pub selector: BTreeMap<String, AttributeStep>,
    /// All requests' devices share this attribute's value.
    #[serde(default)]
    pub match_attribute: Option<String>,
    #[serde(default)]
    pub requests: Vec<RequestStep>,
    #[serde(default)]
    pub constraints: Vec<ConstraintStep>,
    /// Opaque configuration for our driver, as on a claim step.
    #[serde(default)]
    pub config: Vec<ConfigStep>,
}

/// One request of a scheduled claim.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct RequestStep {
    pub name: String,
    /// Devices (default 1).
    #[serde(default)]
    pub count: Option<u32>,
    /// The `cpu` capacity each device must give.
    #[serde(default)]
    pub cpu: Option<Qty>,
    /// Other capacities each device must give (`memory: 16Gi`).
    #[serde(default)]
    pub capacity: BTreeMap<String, Qty>,
    /// Attribute equality: every device has these values.
    #[serde(default)]
    pub selector: BTreeMap<String, AttributeStep>,
    /// The DeviceClass it names (default `cpu`).
    #[serde(default)]
    pub class: ClassStep,
}

/// The DeviceClass a request names.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ClassStep {
    /// The chart's class for CPUs: devices with the `cpu` capacity.
    #[default]
    Cpu,
    /// The memory devices of `device-mode: individual` (`memoryKind: dram`).
    Memory,
}

/// A `matchAttribute` constraint.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct ConstraintStep {
    /// The requests it applies to; empty means all.
    #[serde(default)]
    pub requests: Vec<String>,
    pub match_attribute: String,
}

/// An attribute value in a selector: an integer, a boolean or a string.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum AttributeStep {
    Int(i64),
    Bool(bool),
    String(String),
}

impl ScheduleStep {
    /// The claim as the scheduler gets it.
    pub fn spec(&self) -> ClaimSpec {
        let request = |name: &str,
                       count: Option<u32>,
                       cpu: Option<Qty>,
                       other: &BTreeMap<String, Qty>,
                       selector: &BTreeMap<_, _>,
                       class: ClassStep| {
            let mut capacity: BTreeMap<String, Quantity> =
                other.iter().map(|(n, q)| (n.clone(), q.0)).collect();
            if let Some(q) = cpu {
                capacity.insert("cpu".to_owned(), q.0);
            }
            let mut selectors = selectors(selector);
            let has_capacity = match class {
                ClassStep::Cpu => vec!["cpu".to_owned()],
                ClassStep::Memory => {
                    selectors.push(Selector {
                        attribute: "memoryKind".to_owned(),
                        value: AttributeValue::String("dram".to_owned()),
                    });
                    Vec::new()
                }
            };
            DeviceRequest {
                name: name.to_owned(),
                count: count.unwrap_or(1),
                selectors,
                capacity,
                has_capacity,
            }
        };
        if self.requests.is_empty() {
            ClaimSpec {
                requests: vec![request(
                    self.request.as_deref().unwrap_or("cpus"),
                    self.count,
                    self.cpu,
                    &self.capacity,
                    &self.selector,
                    ClassStep::Cpu,
                )],
                constraints: self
                    .match_attribute
                    .iter()
                    .map(|a| Constraint {
                        requests: Vec::new(),
                        match_attribute: a.clone(),
                    })
                    .collect(),
            }
        } else {
            ClaimSpec {
                requests: self
                    .requests
                    .iter()
                    .map(|r| request(&r.name, r.count, r.cpu, &r.capacity, &r.selector, r.class))
                    .collect(),
                constraints: self
                    .constraints
                    .iter()
                    .map(|c| Constraint {
                        requests: c.requests.clone(),
                        match_attribute: c.match_attribute.clone(),
                    })
                    .collect(),
            }
        }
    }

    /// Whether it mixes the inline request with `requests`.
    fn mixes_forms(&self) -> bool {
        let inline = self.request.is_some()
            || self.count.is_some()
            || self.cpu.is_some()
            || !self.capacity.is_empty()
            || !self.selector.is_empty()
            || self.match_attribute.is_some();
        let listed = !self.requests.is_empty() || !self.constraints.is_empty();
        inline && listed
    }
}

fn selectors(selector: &BTreeMap<String, AttributeStep>) -> Vec<Selector> {
    selector
        .iter()
        .map(|(attribute, v)| Selector {
            attribute: attribute.clone(),
            value: match v {
                AttributeStep::Int(i) => AttributeValue::Int(*i),
                AttributeStep::Bool(b) => AttributeValue::Bool(*b),
                AttributeStep::String(s) => AttributeValue::String(s.clone()),
            },
        })
        .collect()
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct ResultStep {
    pub request: String,
    pub device: String,
    /// CPUs consumed from the device.
    pub cpu: Qty,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct ContainerStep {
    pub pod: String,
    pub name: String,
    #[serde(default)]
    pub cpu_request: Option<Qty>,
    #[serde(default)]
    pub cpu_limit: Option<Qty>,
    #[serde(default)]
    pub memory: Option<Qty>,
    #[serde(default)]
    pub memory_limit: Option<Qty>,
    /// Claims (by name) whose devices the container uses.
    #[serde(default)]
    pub claims: Vec<String>,
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct UpdateStep {
    pub pod: String,
    pub container: String,
    #[serde(default)]
    pub cpu_request: Option<Qty>,
    #[serde(default)]
    pub cpu_limit: Option<Qty>,
    #[serde(default)]
    pub memory: Option<Qty>,
    #[serde(default)]
    pub memory_limit: Option<Qty>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct RemoveStep {
    pub pod: String,
    /// Only this container; without it, the whole pod and its claims.
    #[serde(default)]
    pub container: Option<String>,
}

/// A Kubernetes quantity written as a string (`500m`, `256Mi`) or a number (`4`, `0.5`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Qty(pub Quantity);

impl<'de> Deserialize<'de> for Qty {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = Scalar::deserialize(d)?.0;
        text.parse::<Quantity>()
            .map(Qty)
            .map_err(|e| serde::de::Error::custom(format!("{text:?} is not a quantity: {e}")))
    }
}

/// A string or a number, as text.
#[derive(Debug, Clone)]
struct Scalar(String);

impl<'de> Deserialize<'de> for Scalar {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            S(String),
            U(u64),
            F(f64),
        }
        Ok(Scalar(match Raw::deserialize(d)? {
            Raw::S(s) => s,
            Raw::U(u) => u.to_string(),
            Raw::F(f) => f.to_string(),
        }))
    }
}

/// A scenario error, with the file and, where known, the line.
#[derive(Debug)]
pub struct ScenarioError {
    pub file: String,
    pub line: Option<usize>,
    pub message: String,
}

impl fmt::Display for ScenarioError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.line {
            Some(line) => write!(f, "{}: line {line}: {}", self.file, self.message),
            None => write!(f, "{}: {}", self.file, self.message),
        }
    }
}

impl std::error::Error for ScenarioError {}

impl Step {
    /// What the step does, for reports.
    pub fn describe(&self) -> String {
        match self {
            Self::Pod(p) => format!("pod {}/{} ({:?})", p.namespace, p.name, p.qos),
            Self::Claim(c) => format!("claim {} for pod {}", c.name, c.pod),
            Self::Schedule(c) => format!("schedule claim {} for pod {}", c.name, c.pod),
            Self::Container(c) => format!("container {}/{}", c.pod, c.name),
            Self::Update(u) => format!("update {}/{}", u.pod, u.container),
            Self::Remove(r) => match &r.container {
                Some(c) => format!("remove container {}/{c}", r.pod),
                None => format!("remove pod {}", r.pod),
            },
            Self::Restart => "restart the agent".into(),
            Self::Reconfigure(r) => format!("restart the agent with {}", r.written()),
            Self::Offline(h) => format!("{} {} offline", h.describe(), h.verb("go")),
            Self::Online(h) => format!("{} {} back online", h.describe(), h.verb("come")),
        }
    }
}

/// Reads and checks a scenario file.
pub fn load(path: &Path) -> Result<Scenario, ScenarioError> {
    let text = std::fs::read_to_string(path).map_err(|e| ScenarioError {
        file: path.display().to_string(),
        line: None,
        message: format!("cannot read it: {e}"),
    })?;
    parse(&path.display().to_string(), &text, path.parent())
}

/// `hugepages: "0:2Mi=512,1Gi=4;1:2Mi=512"`: the pages each node keeps per size, as the kernel's
/// `nr_hugepages` would say on a live machine.
fn hugepages(value: &str) -> Result<BTreeMap<u32, BTreeMap<u64, u64>>, String> {
    let bad = |why: String| {
        format!(
            "{value:?}: {why}: expected `<node>:<size>=<pages>,...` per node, nodes separated by `;`, such as `0:2Mi=512,1Gi=4;1:2Mi=512`"
        )
    };
    let mut out = BTreeMap::new();
    for part in value.split(';').map(str::trim).filter(|p| !p.is_empty()) {
        let (node, sizes) = part
            .split_once(':')
            .ok_or_else(|| bad(format!("{part:?} names no node")))?;
        let node: u32 = node
            .trim()
            .parse()
            .map_err(|_| bad(format!("{node:?} is not a node number")))?;
        let mut pages = BTreeMap::new();
        for entry in sizes.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            let (size, count) = entry
                .split_once('=')
                .ok_or_else(|| bad(format!("{entry:?} has no `=`")))?;
            let size = size
                .trim()
                .parse::<Quantity>()
                .ok()
                .map(Quantity::units_ceil)
                .filter(|s| *s > 0)
                .ok_or_else(|| bad(format!("{size:?} is not a page size")))?;
            let count: u64 = count
                .trim()
                .parse()
                .map_err(|_| bad(format!("{count:?} is not a number of pages")))?;
            pages.insert(size, count);
        }
        out.insert(node, pages);
    }
    Ok(out)
}

/// Parses and checks scenario text; `base` resolves relative `xml:` paths.
pub fn parse(file: &str, text: &str, base: Option<&Path>) -> Result<Scenario, ScenarioError> {
    let err = |line: Option<usize>, message: String| ScenarioError {
        file: file.to_owned(),
        line,
        message,
    };
    let raw: File = serde_yaml_ng::from_str(text).map_err(|e| {
        let line = e.location().map(|l| l.line());
        // The decoder's message repeats the position at its end; the prefix says it already.
        let mut message = e.to_string();
        if let Some(at) = message.rfind(" at line ") {
            message.truncate(at);
        }
        err(line, message)
    })?;
    let key_line = |key: &str| {
        text.lines()
            .position(|l| l.starts_with(&format!("{key}:")))
            .map(|i| i + 1)
    };
    let t = raw.topology.trim();
    let topology_text = if t == "live" || t.starts_with("synthetic:") || t.starts_with("xml:") {
        raw.topology.clone()
    } else {
        format!("synthetic:{}", raw.topology)
    };
    let topology = values::topology(&topology_text, base)
        .map_err(|e| err(key_line("topology"), format!("topology: {e}")))?;
    let reserved_cpus = match (&raw.reserved_cpus, &raw.reserved_cpu_count) {
        (Some(_), Some(_)) => {
            return Err(err(
                key_line("reserved-cpu-count"),
                "reserved-cpus and reserved-cpu-count: both are set; reserved-cpus names the \
                 CPUs, reserved-cpu-count picks that many: set one of them"
                    .into(),
            ));
        }
        (Some(v), None) => ReservedCpus::Set(
            values::reserved_cpuset(&v.0)
                .map_err(|e| err(key_line("reserved-cpus"), format!("reserved-cpus: {e}")))?,
        ),
        (None, Some(v)) => ReservedCpus::Count(values::reserved_count(&v.0).map_err(|e| {
            err(
                key_line("reserved-cpu-count"),
                format!("reserved-cpu-count: {e}"),
            )
        })?),
        (None, None) => ReservedCpus::Count(1),
    };
    let (exclusivity, devices) = values::policy_settings(&values::PolicyValues {
        cpu_exclusivity: raw.cpu_exclusivity.as_deref(),
        claim_cpus: raw.claim_cpus.as_ref().map(|s| s.0.as_str()),
        device_mode: raw.device_mode.as_deref(),
        group_by: raw.group_by.as_deref(),
        claim_granularity: raw.claim_granularity.as_deref(),
    })
    .map_err(|e| err(key_line(e.key), format!("{}: {}", e.key, e.reason)))?;
    let reserved = match &raw.reserved_memory {
        Some(v) => values::reserved_memory(v)
            .map_err(|e| err(key_line("reserved-memory"), format!("reserved-memory: {e}")))?,
        None => BTreeMap::new(),
    };
    let claim_percent = match &raw.claim_memory {
        Some(v) => values::claim_memory(v)
            .map_err(|e| err(key_line("claim-memory"), format!("claim-memory: {e}")))?,
        None => 0,
    };
    let memory = MemoryConfig {
        reserved,
        claim_percent,
        claim_hugepages: raw.claim_hugepages.unwrap_or(false),
    };
    let hugepages = match &raw.hugepages {
        Some(v) => {
            hugepages(v).map_err(|e| err(key_line("hugepages"), format!("hugepages: {e}")))?
        }
        None => BTreeMap::new(),
    };
    let lines = step_lines(text, raw.steps.len());
    let mut steps: Vec<(Option<usize>, Step)> = lines.into_iter().zip(raw.steps).collect();
    let mut written = WrittenSettings {
        cpu_exclusivity: raw.cpu_exclusivity.clone(),
        claim_cpus: raw.claim_cpus.as_ref().map(|s| s.0.clone()),
        device_mode: raw.device_mode.clone(),
        group_by: raw.group_by.clone(),
        claim_granularity: raw.claim_granularity.clone(),
    };
    for (line, step) in &mut steps {
        if let Step::Reconfigure(r) = step {
            written.change(r);
            let resolved = written
                .resolve()
                .map_err(|e| err(*line, format!("reconfigure: {}: {}", e.key, e.reason)))?;
            r.resolved = Some(resolved);
        }
    }
    check(&steps).map_err(|(line, message)| err(line, message))?;
    if steps.is_empty() {
        return Err(err(
            key_line("steps"),
            "steps: the scenario has no steps".into(),
        ));
    }
    Ok(Scenario {
        description: raw.description,
        topology,
        topology_line: key_line("topology"),
        reserved_cpus,
        reserved_namespaces: raw.reserved_namespaces,
        exclusivity,
        devices,
        memory,
        hugepages,
        node_name: raw.node_name.unwrap_or_else(|| "sim-node".into()),
        gates: Gates {
            consumable_capacity: raw.feature_gates.consumable_capacity,
        },
        steps,
    })
}

/// Checks that every step refers to what earlier steps created.
fn check(steps: &[(Option<usize>, Step)]) -> Result<(), (Option<usize>, String)> {
    // Pod name -> (containers, claims) currently existing.
    let mut pods: BTreeMap<String, (BTreeSet<String>, BTreeSet<String>)> = BTreeMap::new();
    let mut claims: BTreeMap<String, String> = BTreeMap::new();
    let known = |pods: &BTreeMap<String, (BTreeSet<String>, BTreeSet<String>)>| {
        if pods.is_empty() {
            "no pod exists at this point".to_owned()
        } else {
            format!(
                "pods at this point: {}",
                pods.keys().cloned().collect::<Vec<_>>().join(", ")
            )
        }
    };
    for (line, step) in steps {
        let fail = |m: String| Err((*line, m));
        match step {
            Step::Pod(p) => {
                if p.name.is_empty() {
                    return fail("pod: name must not be empty".into());
                }
                if pods.contains_key(&p.name) {
                    return fail(format!("pod {:?} already exists", p.name));
                }
                pods.insert(p.name.clone(), Default::default());
            }
            Step::Claim(c) => {
                let Some((_, pod_claims)) = pods.get_mut(&c.pod) else {
                    return fail(format!(
                        "claim {:?}: pod {:?} does not exist ({})",
                        c.name,
                        c.pod,
                        known(&pods)
                    ));
                };
                if c.name.is_empty() {
                    return fail("claim: name must not be empty".into());
                }
                if claims.contains_key(&c.name) {
                    return fail(format!("claim {:?} already exists", c.name));
                }
                if c.results.is_empty() {
                    return fail(format!(
                        "claim {:?}: results must list at least one device",
                        c.name
                    ));
                }
                pod_claims.insert(c.name.clone());
                claims.insert(c.name.clone(), c.pod.clone());
            }
            Step::Schedule(c) => {
                let Some((_, pod_claims)) = pods.get_mut(&c.pod) else {
                    return fail(format!(
                        "schedule {:?}: pod {:?} does not exist ({})",
                        c.name,
                        c.pod,
                        known(&pods)
                    ));
                };
                if c.name.is_empty() {
                    return fail("schedule: name must not be empty".into());
                }
                if claims.contains_key(&c.name) {
                    return fail(format!("claim {:?} already exists", c.name));
                }
                if c.mixes_forms() {
                    return fail(format!(
                        "schedule {:?}: write one request inline (request, count, cpu, selector, match-attribute) or several under requests and constraints, not both",
                        c.name
                    ));
                }
                if let Err(e) = c.spec().validate() {
                    return fail(format!("schedule {:?}: {e}", c.name));
                }
                pod_claims.insert(c.name.clone());
                claims.insert(c.name.clone(), c.pod.clone());
            }
            Step::Container(c) => {
                let Some((containers, _)) = pods.get_mut(&c.pod) else {
                    return fail(format!(
                        "container {:?}: pod {:?} does not exist ({})",
                        c.name,
                        c.pod,
                        known(&pods)
                    ));
                };
                if c.name.is_empty() {
                    return fail("container: name must not be empty".into());
                }
                if !containers.insert(c.name.clone()) {
                    return fail(format!(
                        "container {:?} already exists in pod {:?}",
                        c.name, c.pod
                    ));
                }
                for claim in &c.claims {
                    match claims.get(claim) {
                        Some(pod) if *pod == c.pod => {}
                        Some(pod) => {
                            return fail(format!(
                                "container {:?}: claim {claim:?} is reserved for pod {pod:?}, not {:?}",
                                c.name, c.pod
                            ));
                        }
                        None => {
                            return fail(format!(
                                "container {:?}: claim {claim:?} does not exist (declare it with a claim step first)",
                                c.name
                            ));
                        }
                    }
                }
            }
            Step::Update(u) => {
                let exists = pods
                    .get(&u.pod)
                    .is_some_and(|(c, _)| c.contains(&u.container));
                if !exists {
                    return fail(format!(
                        "update: container {:?} of pod {:?} does not exist",
                        u.container, u.pod
                    ));
                }
            }
            Step::Remove(r) => match &r.container {
                None => {
                    let Some((_, pod_claims)) = pods.remove(&r.pod) else {
                        return fail(format!(
                            "remove: pod {:?} does not exist ({})",
                            r.pod,
                            known(&pods)
                        ));
                    };
                    for claim in pod_claims {
                        claims.remove(&claim);
                    }
                }
                Some(name) => {
                    let removed = pods.get_mut(&r.pod).is_some_and(|(c, _)| c.remove(name));
                    if !removed {
                        return fail(format!(
                            "remove: container {name:?} of pod {:?} does not exist",
                            r.pod
                        ));
                    }
                }
            },
            Step::Offline(h) | Step::Online(h) => {
                if let Err(e) = h.sets() {
                    return fail(format!("{}: {e}", step_name(step)));
                }
            }
            Step::Restart | Step::Reconfigure(_) => {}
        }
    }
    Ok(())
}

fn step_name(step: &Step) -> &'static str {
    match step {
        Step::Offline(_) => "offline",
        Step::Online(_) => "online",
        _ => "step",
    }
}

/// The 1-based line of each item of the top-level `steps:` list, found by indentation; `None`
/// for all when the list is not written in block style.
fn step_lines(text: &str, count: usize) -> Vec<Option<usize>> {
    let lines: Vec<&str> = text.lines().collect();
    let Some(start) = lines.iter().position(|l| l.trim_end() == "steps:") else {
        return vec![None; count];
    };
    let mut found = Vec::new();
    let mut indent = None;
    for (i, line) in lines.iter().enumerate().skip(start + 1) {
        let trimmed = line.trim_start();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        let depth = line.len() - trimmed.len();
        let item = trimmed == "-" || trimmed.starts_with("- ");
        match indent {
            None if item => indent = Some(depth),
            None => break,
            Some(d) if depth < d || (depth == d && !item) => break,
            Some(_) => {}
        }
        if item && Some(depth) == indent {
            found.push(Some(i + 1));
        }
    }
    if found.len() == count {
        found
    } else {
        vec![None; count]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "topology: \"pack:1 numa:2 core:2 pu:2\"
reserved-cpu-count: 1
steps:
  # a comment
  - pod: {name: web, qos: Burstable}
  - container: {pod: web, name: app, cpu-request: 500m, memory: 256Mi}
  - pod:
      name: db
      qos: Guaranteed
  - claim: {name: c, pod: db, results: [{request: cpus, device: numa1, cpu: 2}]}
  - container: {pod: db, name: pg, cpu-request: 2, claims: [c]}
  - restart
  - remove: {pod: web}
";

    #[test]
    fn parses_steps_with_their_lines() {
        let s = parse("s.yaml", GOOD, None).unwrap();
        let lines: Vec<Option<usize>> = s.steps.iter().map(|(l, _)| *l).collect();
        assert_eq!(lines, [5, 6, 7, 10, 11, 12, 13].map(Some).to_vec());
        assert_eq!(
            s.topology,
            TopologySource::Synthetic("pack:1 numa:2 core:2 pu:2".into())
        );
        assert!(matches!(s.steps[5].1, Step::Restart));
        let Step::Container(c) = &s.steps[1].1 else {
            panic!()
        };
        assert_eq!(c.cpu_request, Some(Qty(Quantity::from_milli(500))));
    }

    #[test]
    fn meaning_errors_name_the_step_line() {
        let bad = GOOD.replace("claims: [c]", "claims: [nope]");
        let e = parse("s.yaml", &bad, None).unwrap_err();
        assert_eq!(e.line, Some(11), "{e}");
        assert!(
            e.to_string().contains("claim \"nope\" does not exist"),
            "{e}"
        );

        let bad = GOOD.replace("remove: {pod: web}", "remove: {pod: nobody}");
        let e = parse("s.yaml", &bad, None).unwrap_err();
        assert_eq!(e.line, Some(13), "{e}");
    }

    #[test]
    fn offline_and_online_steps_name_cpus_or_memory_nodes() {
        let with = GOOD.replace(
            "remove: {pod: web}",
            "offline: {cpus: 4-5, memory-nodes: 1}",
        );
        let s = parse("s.yaml", &with, None).unwrap();
        let Step::Offline(h) = &s.steps[6].1 else {
            panic!("{:?}", s.steps[6])
        };
        assert_eq!(
            h.sets().unwrap(),
            ("4-5".parse().unwrap(), "1".parse().unwrap())
        );
        assert_eq!(
            s.steps[6].1.describe(),
            "cpus 4-5 and the memory of numa node 1 go offline"
        );
        for (bad, says) in [
            ("online: {}", "online: name cpus or memory-nodes"),
            (
                "offline: {cpus: four}",
                "offline: cpus: \"four\" is not a cpu list",
            ),
        ] {
            let e = parse("s.yaml", &GOOD.replace("remove: {pod: web}", bad), None).unwrap_err();
            assert_eq!(e.line, Some(13), "{e}");
            assert!(e.to_string().contains(says), "{e}");
        }
    }

    #[test]
    fn a_claim_carries_its_configuration() {
        let with = GOOD.replace(
            "cpu: 2}]}",
            "cpu: 2}], config: [{source: class, parameters: {kind: CpuConfig, fullCores: true}}, {requests: [cpus], parameters: {memoryPinning: false}}]}",
        );
        let s = parse("s.yaml", &with, None).unwrap();
        let Step::Claim(c) = &s.steps[3].1 else {
            panic!("{:?}", s.steps[3])
        };
        assert_eq!(c.config.len(), 2);
        assert_eq!(
            (c.config[0].source, c.config[1].source),
            (ConfigSourceStep::Class, ConfigSourceStep::Claim)
        );
        assert_eq!(c.config[1].requests, ["cpus"]);
        assert_eq!(
            c.config[0].parameters,
            serde_json::json!({"kind": "CpuConfig", "fullCores": true})
        );
        let without = parse("s.yaml", GOOD, None).unwrap();
        let Step::Claim(c) = &without.steps[3].1 else {
            panic!()
        };
        assert!(c.config.is_empty());
    }

    #[test]
    fn shape_errors_carry_the_decoders_line() {
        let bad = GOOD.replace("cpu-request: 500m", "cpus: 500m");
        let e = parse("s.yaml", &bad, None).unwrap_err();
        assert_eq!(e.line, Some(6), "{e}");
        assert!(e.to_string().contains("unknown field `cpus`"), "{e}");

        let bad = GOOD.replace("memory: 256Mi", "memory: lots");
        let e = parse("s.yaml", &bad, None).unwrap_err();
        assert_eq!(e.line, Some(6), "{e}");
        assert!(e.to_string().contains("\"lots\" is not a quantity"), "{e}");
    }

    #[test]
    fn a_schedule_step_takes_one_request_inline_or_several_with_constraints() {
        let inline = GOOD.replace(
            "  - restart\n",
            "  - schedule: {name: s, pod: db, count: 4, match-attribute: resource.kubernetes.io/numaNode, selector: {socket: 0, smt: true}}\n  - restart\n",
        );
        let s = parse("s.yaml", &inline, None).unwrap();
        let Step::Schedule(step) = &s.steps[5].1 else {
            panic!("{:?}", s.steps[5])
        };
        let spec = step.spec();
        assert_eq!(spec.requests.len(), 1);
        assert_eq!(spec.requests[0].name, "cpus");
        assert_eq!(spec.requests[0].count, 4);
        assert_eq!(
            spec.requests[0].selectors,
            [
                Selector {
                    attribute: "smt".into(),
                    value: AttributeValue::Bool(true)
                },
                Selector {
                    attribute: "socket".into(),
                    value: AttributeValue::Int(0)
                }
            ]
        );
        assert_eq!(spec.constraints[0].requests, Vec::<String>::new());
        assert_eq!(
            spec.constraints[0].match_attribute,
            "resource.kubernetes.io/numaNode"
        );

        let listed = GOOD.replace(
            "  - restart\n",
            "  - schedule: {name: s, pod: db, requests: [{name: a, count: 2}, {name: b, cpu: 2500m}], constraints: [{requests: [a], match-attribute: resource.kubernetes.io/numaNode}]}\n  - restart\n",
        );
        let s = parse("s.yaml", &listed, None).unwrap();
        let Step::Schedule(step) = &s.steps[5].1 else {
            panic!()
        };
        let spec = step.spec();
        assert_eq!(spec.requests[1].capacity["cpu"], Quantity::from_milli(2500));
        assert_eq!(spec.requests[1].count, 1);
        assert_eq!(spec.constraints[0].requests, ["a"]);
        assert!(s.gates.consumable_capacity, "the gate is on by default");
    }

    #[test]
    fn a_schedule_step_is_checked_like_the_api_server_would_with_its_line() {
        let cases = [
            (
                "{name: s, pod: db, count: 2, requests: [{name: a}]}",
                "not both",
            ),
            (
                "{name: s, pod: db, match-attribute: numaNode}",
                "must be a fully qualified name",
            ),
            ("{name: s, pod: db, count: 0}", "count must be at least 1"),
            ("{name: c, pod: db}", "claim \"c\" already exists"),
            ("{name: s, pod: nobody}", "pod \"nobody\" does not exist"),
        ];
        for (step, wanted) in cases {
            let bad = GOOD.replace(
                "  - restart\n",
                &format!("  - schedule: {step}\n  - restart\n"),
            );
            let e = parse("s.yaml", &bad, None).unwrap_err();
            assert_eq!(e.line, Some(12), "{step}: {e}");
            assert!(e.to_string().contains(wanted), "{step}: {e}");
        }
    }

    #[test]
    fn the_policy_settings_are_header_keys_checked_with_their_line() {
        let header = "cpu-exclusivity: partition\nclaim-cpus: 4-7\ndevice-mode: individual\nclaim-granularity: core\n";
        let s = parse("s.yaml", &format!("{header}{GOOD}"), None).unwrap();
        assert_eq!(
            s.exclusivity,
            Exclusivity::Partition(policy::topology_aware::ClaimCpus::Set(
                "4-7".parse().unwrap()
            ))
        );
        assert_eq!(
            s.devices.mode,
            policy::topology_aware::DeviceMode::Individual
        );
        let s = parse("s.yaml", GOOD, None).unwrap();
        assert_eq!(
            (s.exclusivity, s.devices),
            (Exclusivity::Claims, DeviceModel::default())
        );
        let e = parse("s.yaml", &format!("{GOOD}group-by: die\n"), None).unwrap_err();
        assert!(
            e.to_string().contains("group-by: \"die\" is not allowed"),
            "{e}"
        );
        assert_eq!(e.line, Some(GOOD.lines().count() + 1));
    }

    #[test]
    fn feature_gates_know_their_names() {
        let off = format!("feature-gates: {{DRAConsumableCapacity: false}}\n{GOOD}");
        assert!(
            !parse("s.yaml", &off, None)
                .unwrap()
                .gates
                .consumable_capacity
        );
        let typo = format!("feature-gates: {{DRAConsumableCapacities: false}}\n{GOOD}");
        let e = parse("s.yaml", &typo, None).unwrap_err();
        assert!(e.to_string().contains("DRAConsumableCapacities"), "{e}");
    }

    #[test]
    fn reconfigure_changes_the_settings_it_names_and_keeps_the_others() {
        let header = "cpu-exclusivity: pods\ndevice-mode: individual\n";
        let with = |steps: &str| {
            format!(
                "{header}{}",
                GOOD.replace("  - restart\n", &format!("{steps}  - restart\n"))
            )
        };
        let s = parse(
            "s.yaml",
            &with("  - reconfigure: {cpu-exclusivity: partition, claim-cpus: 4-7}\n  - reconfigure: {cpu-exclusivity: claims}\n"),
            None,
        )
        .unwrap();
        let resolved: Vec<(Exclusivity, DeviceModel)> = s
            .steps
            .iter()
            .filter_map(|(_, step)| match step {
                Step::Reconfigure(r) => r.resolved.clone(),
                _ => None,
            })
            .collect();
        let individual = DeviceModel {
            mode: policy::topology_aware::DeviceMode::Individual,
            ..DeviceModel::default()
        };
        assert_eq!(
            resolved,
            [
                (
                    Exclusivity::Partition(policy::topology_aware::ClaimCpus::Set(
                        "4-7".parse().unwrap()
                    )),
                    individual
                ),
                // claim-cpus goes with partition; the device mode stays.
                (Exclusivity::Claims, individual),
            ]
        );
        assert_eq!(
            s.steps[5].1.describe(),
            "restart the agent with cpu-exclusivity: partition, claim-cpus: 4-7"
        );
        let e = parse("s.yaml", &with("  - reconfigure: {claim-cpus: 4}\n"), None).unwrap_err();
        assert_eq!(e.line, Some(GOOD.lines().count() + 1), "{e}");
        assert!(e.to_string().contains("reconfigure: claim-cpus"), "{e}");
        let e = parse(
            "s.yaml",
            &with("  - reconfigure: {cpu-exclusivity: some}\n"),
            None,
        )
        .unwrap_err();
        assert!(e.to_string().contains("\"some\" is not allowed"), "{e}");
    }
}
