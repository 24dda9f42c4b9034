//! What a simulation reports: per step, what changed; at the end, who holds what. Rendered as
//! text for people and as JSON for programs, from the same values.
//!
//! Nothing in a report depends on where the simulation wrote (temporary directories) or on
//! timing, so the same scenario always prints the same report: the shipped scenarios' expected
//! outputs are checked byte for byte.

use std::{collections::BTreeMap, fmt::Write as _};

use policy::{
    AttributeValue, Device, DeviceTaint, Topology, ValidValues,
    topology_aware::devices::NUMA_NODE_ATTRIBUTE,
};
use serde::Serialize;

use super::scenario::Scenario;
use crate::view::InventoryRows;

/// A device the policy publishes, in short.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeviceSummary {
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub numa_node: Option<i64>,
    /// CPUs a claim may take on it.
    pub cpu: String,
    /// The steps its request policy rounds claims to, when more than one CPU (whole cores).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu_step: Option<String>,
    /// Memory a claim may take on it (`15Gi`), when it publishes memory.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory: Option<String>,
    /// Hugepages claims may take on it, by capacity name (`hugepages2Mi: 508Mi`).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub hugepages: BTreeMap<String, String>,
    /// Its taints (`cpus-offline=4_5:NoSchedule`): the scheduler allocates it to no new claim.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub taints: Vec<String>,
    #[serde(skip)]
    pub cpu_capacity_milli: u64,
    #[serde(skip)]
    pub memory_bytes: u64,
}

impl DeviceSummary {
    pub fn of(d: &Device) -> Self {
        let capacity = d.capacities.get("cpu").map(|c| c.value);
        let numa_node = d
            .attributes
            .get(policy::topology_aware::devices::NUMA_NODE_ATTRIBUTE)
            .and_then(|a| match a {
                AttributeValue::Int(n) => Some(*n),
                _ => None,
            });
        let cpu_step = d
            .capacities
            .get("cpu")
            .and_then(|c| c.request_policy.as_ref())
            .and_then(|p| match &p.valid {
                ValidValues::Range {
                    step: Some(step), ..
                } if *step > policy::Quantity::from_units(1) => Some(step.to_string()),
                _ => None,
            });
        // A device without a `cpu` capacity is one CPU (a device per CPU), unless it is a memory
        // device of the individual model, which has none.
        let memory_device = d
            .attributes
            .contains_key(policy::topology_aware::devices::MEMORY_KIND_ATTRIBUTE);
        let capacity = capacity.unwrap_or(policy::Quantity::from_units(u64::from(!memory_device)));
        let bytes = |c: &policy::Capacity| crate::simulate::memory_text(c.value.units_ceil());
        Self {
            name: d.name.clone(),
            numa_node,
            cpu: capacity.to_string(),
            cpu_step,
            memory: d.capacities.get("memory").map(bytes),
            hugepages: d
                .capacities
                .iter()
                .filter(|(n, _)| n.starts_with("hugepages"))
                .map(|(n, c)| (n.clone(), bytes(c)))
                .collect(),
            taints: d.taints.iter().map(taint_text).collect(),
            cpu_capacity_milli: capacity.milli(),
            memory_bytes: d
                .capacities
                .get("memory")
                .map_or(0, |c| c.value.units_ceil()),
        }
    }
}

/// A taint as `kubectl describe` would list it, the key's driver domain left out:
/// `cpus-offline=4_5:NoSchedule`.
fn taint_text(t: &DeviceTaint) -> String {
    let key = t
        .key
        .rsplit_once('/')
        .map_or(t.key.as_str(), |(_, name)| name);
    format!("{key}={}:{}", t.value, t.effect.as_str())
}

/// A device's taints in one string.
pub(crate) fn taints_text(taints: &[DeviceTaint]) -> String {
    taints.iter().map(taint_text).collect::<Vec<_>>().join(", ")
}

/// An attribute value as a consumer reads it: `8-11`, `1`, `true`, `[8,9,10,11]`.
pub(crate) fn attribute_text(v: &AttributeValue) -> String {
    match v {
        AttributeValue::Int(i) => i.to_string(),
        AttributeValue::Bool(b) => b.to_string(),
        AttributeValue::String(s) | AttributeValue::Version(s) => s.clone(),
        AttributeValue::Strings(list) => format!("[{}]", list.join(",")),
        AttributeValue::Ints(list) => format!(
            "[{}]",
            list.iter()
                .map(i64::to_string)
                .collect::<Vec<_>>()
                .join(",")
        ),
    }
}

/// A device in a claim's device metadata, as a container reads it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MetadataDevice {
    pub name: String,
    /// Every attribute, by name, as text.
    pub attributes: BTreeMap<String, String>,
}

/// One change a step made.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "change", rename_all = "kebab-case")]
pub enum Change {
    /// A container was created and placed.
    Placed {
        container: String,
        grant: String,
        #[serde(skip_serializing_if = "Option::is_none")]
        pool: Option<String>,
        cpus: String,
        mems: String,
        /// What the policy did instead of refusing it (`not-exclusive`, `reserved`, ...).
        #[serde(skip_serializing_if = "Vec::is_empty")]
        fallbacks: Vec<String>,
    },
    /// A running container's cpuset or memory nodes changed in the runtime.
    Updated {
        container: String,
        cpus: String,
        mems: String,
        was_cpus: String,
        was_mems: String,
    },
    /// A container is gone.
    Removed { container: String },
    /// A claim was allocated CPUs.
    Claimed {
        claim: String,
        devices: Vec<String>,
        cpus: String,
        mems: String,
        /// The memory and hugepages it holds (`16Gi memory, 2Gi hugepages1Gi`), if any.
        #[serde(skip_serializing_if = "Option::is_none")]
        memory: Option<String>,
    },
    /// A claim's CDI spec was written and its devices answered to the kubelet.
    Spec {
        claim: String,
        file: String,
        cdi_devices: Vec<String>,
    },
    /// A claim's device metadata, one file per request, as its containers find it.
    Metadata {
        claim: String,
        /// Where a container finds it.
        path: String,
        /// The request it is about (`cpus`, or `cpus/big`).
        request: String,
        generation: i64,
        devices: Vec<MetadataDevice>,
    },
    /// CPUs behind a device went offline, or its node lost its memory: the agent taints it.
    Tainted {
        device: String,
        reason: String,
        /// The claims prepared on it, which keep it.
        #[serde(skip_serializing_if = "Vec::is_empty")]
        claims: Vec<String>,
    },
    /// A tainted device recovered: its taint is taken off.
    Healthy { device: String },
    /// A claim's CPUs were given back.
    Released { claim: String, cpus: String },
    /// The agent restarted from its state file.
    Restarted { claims: usize, containers: usize },
    /// The simulated scheduler allocated a claim: what it handed out, before the node acted.
    Scheduled {
        claim: String,
        results: Vec<ScheduledResult>,
        /// The CPUs the scheduler counts as taken by the claim.
        cpus: u64,
        /// What the API server dropped from the claim (a gate is off).
        #[serde(skip_serializing_if = "Vec::is_empty")]
        dropped: Vec<String>,
    },
    /// The node granted a scheduled claim other CPUs than the scheduler counts.
    Mismatch { claim: String, message: String },
    /// The devices the agent publishes changed (the scheduler sees the new ones from now on).
    Republished { devices: Vec<DeviceSummary> },
}

/// One result the scheduler wrote.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ScheduledResult {
    pub request: String,
    pub device: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub share_id: Option<String>,
    /// Capacity consumed from a shared device.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub consumed: BTreeMap<String, String>,
    /// Capacity the request asked for, when the scheduler rounded it to something else.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub asked: BTreeMap<String, String>,
    /// Handed out whole (no share).
    pub whole: bool,
    /// The CPUs the scheduler counts it for.
    pub cpus: u64,
}

/// A claim the scheduler allocated that the node did not grant as allocated: a pod stuck in
/// ContainerCreating, or CPUs the scheduler does not know about.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Problem {
    pub step: usize,
    /// `stuck` or `mismatch`.
    pub kind: String,
    pub claim: String,
    pub message: String,
}

/// One step's outcome.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StepReport {
    pub step: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub line: Option<usize>,
    pub action: String,
    /// Why the step was refused, if it was (the scenario goes on).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    pub changes: Vec<Change>,
}

/// The machine, in short.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Machine {
    pub summary: String,
    pub online: String,
    pub reserved: String,
}

/// A whole simulation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Report {
    pub scenario: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    pub machine: Machine,
    /// The gates the simulated scheduler runs with, when not the default (all on).
    #[serde(rename = "feature-gates", skip_serializing_if = "BTreeMap::is_empty")]
    pub feature_gates: BTreeMap<String, bool>,
    pub devices: Vec<DeviceSummary>,
    pub steps: Vec<StepReport>,
    pub allocation: InventoryRows,
    /// Scheduled claims the node refused or granted differently.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub problems: Vec<Problem>,
}

impl Report {
    pub fn new(
        file: &str,
        scenario: &Scenario,
        topology: &Topology,
        devices: Vec<DeviceSummary>,
        steps: Vec<StepReport>,
        inventory: &InventoryRows,
    ) -> Self {
        let summary = topology.to_string();
        Self {
            scenario: file.to_owned(),
            description: scenario.description.clone(),
            machine: Machine {
                summary: summary.lines().next().unwrap_or_default().to_owned(),
                online: topology.online.to_string(),
                reserved: inventory.reserved.clone(),
            },
            feature_gates: if scenario.gates.consumable_capacity {
                BTreeMap::new()
            } else {
                BTreeMap::from([("DRAConsumableCapacity".to_owned(), false)])
            },
            devices,
            steps,
            allocation: inventory.clone(),
            problems: Vec::new(),
        }
    }

    /// With the problems the simulation found.
    pub fn with_problems(mut self, problems: Vec<Problem>) -> Self {
        self.problems = problems;
        self
    }

    /// Pretty JSON with a final newline.
    pub fn json(&self) -> String {
        // Strings, numbers and lists only: serializing cannot fail.
        let mut s = serde_json::to_string_pretty(self).unwrap_or_default();
        s.push('\n');
        s
    }

    /// The report for people.
    pub fn text(&self) -> String {
        let mut o = String::new();
        let _ = writeln!(o, "scenario {}", self.scenario);
        if let Some(d) = &self.description {
            for line in d.trim().lines() {
                let _ = writeln!(o, "  {line}");
            }
        }
        let _ = writeln!(o, "machine: {}", self.machine.summary);
        let _ = writeln!(
            o,
            "cpus online {}, reserved {}",
            self.machine.online, self.machine.reserved
        );
        let _ = writeln!(o, "DRA devices published: {}", devices_line(&self.devices));
        for (gate, on) in &self.feature_gates {
            let effect = if *on {
                ""
            } else {
                " (the API server drops consumable capacity: the scheduler hands out shared devices whole)"
            };
            let _ = writeln!(
                o,
                "feature gate {gate}: {}{effect}",
                if *on { "on" } else { "off" }
            );
        }
        for s in &self.steps {
            let _ = writeln!(o);
            match s.line {
                Some(line) => {
                    let _ = writeln!(o, "[{}] line {line}: {}", s.step, s.action);
                }
                None => {
                    let _ = writeln!(o, "[{}] {}", s.step, s.action);
                }
            }
            let scheduled = |c: &&Change| matches!(c, Change::Scheduled { .. });
            for c in s.changes.iter().filter(scheduled) {
                let _ = writeln!(o, "    {}", change_line(c));
            }
            if let Some(e) = &s.error {
                let _ = writeln!(o, "    refused: {e}");
            }
            for c in s.changes.iter().filter(|c| !scheduled(c)) {
                let _ = writeln!(o, "    {}", change_line(c));
            }
            if s.error.is_none() && s.changes.is_empty() {
                let _ = writeln!(o, "    (no placement changed)");
            }
        }
        let _ = writeln!(o);
        let _ = writeln!(o, "final allocation:");
        o.push_str(&table(&self.allocation));
        if !self.problems.is_empty() {
            let _ = writeln!(o);
            let _ = writeln!(
                o,
                "PROBLEMS: {} claim(s) the scheduler allocated were not granted as allocated:",
                self.problems.len()
            );
            for p in &self.problems {
                let _ = writeln!(
                    o,
                    "  [{}] {} {}: {}",
                    p.step,
                    p.kind.to_uppercase(),
                    p.claim,
                    p.message
                );
            }
        }
        o
    }
}

/// The devices in one line: each with its CPUs, or, for many, a count per NUMA node.
fn devices_line(devices: &[DeviceSummary]) -> String {
    if devices.is_empty() {
        return "none".to_owned();
    }
    if devices.len() <= 8 {
        let each: Vec<String> = devices
            .iter()
            .map(|d| {
                let mut what = match &d.cpu_step {
                    Some(step) => format!("{} cpus in steps of {step}", d.cpu),
                    None => format!("{} cpus", d.cpu),
                };
                if let Some(memory) = &d.memory {
                    let _ = write!(what, ", {memory} memory");
                }
                for (name, amount) in &d.hugepages {
                    let _ = write!(what, ", {amount} {name}");
                }
                if !d.taints.is_empty() {
                    let _ = write!(what, ", tainted {}", d.taints.join(", "));
                }
                format!("{} ({what})", d.name)
            })
            .collect();
        return each.join(", ");
    }
    let mut per_node: BTreeMap<Option<i64>, (usize, u64, u64)> = BTreeMap::new();
    for d in devices {
        let e = per_node.entry(d.numa_node).or_default();
        e.0 += 1;
        e.1 += d.cpu_capacity_milli;
        e.2 += d.memory_bytes;
    }
    let each: Vec<String> = per_node
        .iter()
        .map(|(node, (n, milli, memory))| {
            let cpus = policy::Quantity::from_milli(*milli);
            let memory = if *memory > 0 {
                format!(", {} memory", crate::simulate::memory_text(*memory))
            } else {
                String::new()
            };
            match node {
                Some(node) => format!("numa{node}: {n} devices ({cpus} cpus{memory})"),
                None => format!("no numa node: {n} devices ({cpus} cpus{memory})"),
            }
        })
        .collect();
    format!("{} devices; {}", devices.len(), each.join(", "))
}

fn change_line(c: &Change) -> String {
    match c {
        Change::Placed {
            container,
            grant,
            pool,
            cpus,
            mems,
            fallbacks,
        } => {
            let how = match pool {
                Some(p) => format!("{grant} in {p}"),
                None => grant.clone(),
            };
            let instead = if fallbacks.is_empty() {
                String::new()
            } else {
                format!(" (instead of a refusal: {})", fallbacks.join(", "))
            };
            format!("+ {container}: {how}, cpus {cpus}, mems {mems}{instead}")
        }
        Change::Updated {
            container,
            cpus,
            mems,
            was_cpus,
            was_mems,
        } => {
            let mut parts = Vec::new();
            if cpus != was_cpus {
                parts.push(format!("cpus {was_cpus} -> {cpus}"));
            }
            if mems != was_mems {
                parts.push(format!("mems {was_mems} -> {mems}"));
            }
            format!("~ {container}: {}", parts.join(", "))
        }
        Change::Removed { container } => format!("- {container}"),
        Change::Claimed {
            claim,
            devices,
            cpus,
            mems,
            memory,
        } => {
            let mut line = format!(
                "+ claim {claim}: {} -> cpus {cpus}, mems {}",
                devices.join(","),
                dash(mems)
            );
            if let Some(memory) = memory {
                let _ = write!(line, ", {memory}");
            }
            line
        }
        Change::Spec {
            claim,
            file,
            cdi_devices,
        } => format!("  CDI spec {file} for {claim}: {}", cdi_devices.join(", ")),
        Change::Metadata {
            path,
            generation,
            devices,
            ..
        } => {
            let mut text = format!("  device metadata {path} (generation {generation}):");
            for d in devices {
                // What the claim was granted; the device's published attributes are in the
                // file too (and in the JSON report).
                let granted: Vec<String> = d
                    .attributes
                    .iter()
                    .filter(|(k, _)| k.starts_with("granted") || k.as_str() == NUMA_NODE_ATTRIBUTE)
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect();
                let _ = write!(text, "\n        {}: {}", d.name, granted.join(" "));
            }
            text
        }
        Change::Tainted {
            device,
            reason,
            claims,
        } => {
            let mut line = format!(
                "! device {device} tainted (NoSchedule): {reason}; the scheduler allocates it to no new claim"
            );
            if !claims.is_empty() {
                let _ = write!(
                    line,
                    "; claims on it keep their cpus: {}",
                    claims.join(", ")
                );
            }
            line
        }
        Change::Healthy { device } => {
            format!("device {device} healthy again: its taint is taken off")
        }
        Change::Released { claim, cpus } => format!("- claim {claim}: cpus {cpus} released"),
        Change::Restarted { claims, containers } => format!(
            "agent restarted: {claims} claim(s) restored from the state file, {containers} running container(s) synchronized"
        ),
        Change::Scheduled {
            claim,
            results,
            cpus,
            dropped,
        } => {
            let mut groups: Vec<(String, Vec<String>)> = Vec::new();
            for r in results {
                let device = if !r.whole {
                    // Capacities a request did not ask for and took none of (a CPU request on
                    // a device that also has memory) say nothing.
                    let consumed: Vec<String> = r
                        .consumed
                        .iter()
                        .filter(|(n, q)| r.asked.contains_key(*n) || q.as_str() != "0")
                        .map(|(n, q)| match r.asked.get(n) {
                            Some(asked) => format!("{n} {q} for {asked} asked"),
                            None => format!("{n} {q}"),
                        })
                        .collect();
                    format!("{} ({})", r.device, consumed.join(", "))
                } else if r.cpus == 1 {
                    r.device.clone()
                } else {
                    format!("{} (whole, {} cpus)", r.device, r.cpus)
                };
                match groups.last_mut() {
                    Some((request, devices)) if *request == r.request => devices.push(device),
                    _ => groups.push((r.request.clone(), vec![device])),
                }
            }
            let each: Vec<String> = groups
                .iter()
                .map(|(request, devices)| format!("{request} -> {}", devices.join(", ")))
                .collect();
            let mut line = format!(
                "scheduler allocated {claim}: {} = {cpus} cpu(s)",
                each.join("; ")
            );
            if !dropped.is_empty() {
                let _ = write!(
                    line,
                    "\n      (DRAConsumableCapacity is off: the API server dropped {})",
                    dropped.join(", ")
                );
            }
            line
        }
        Change::Mismatch { claim, message } => format!("! MISMATCH {claim}: {message}"),
        Change::Republished { devices } => {
            format!("DRA devices published now: {}", devices_line(devices))
        }
    }
}

/// The final allocation as an aligned table.
pub fn table(inv: &InventoryRows) -> String {
    let mut rows: Vec<[String; 5]> = vec![
        ["OWNER", "KIND", "POOL", "CPUS", "MEMS"].map(String::from),
        [
            "(reserved)".into(),
            "reserved".into(),
            "-".into(),
            dash(&inv.reserved),
            "-".into(),
        ],
        [
            "(shared)".into(),
            "shared".into(),
            "-".into(),
            dash(&inv.shared),
            "-".into(),
        ],
    ];
    for c in &inv.claims {
        rows.push([
            format!("claim {}", c.name),
            "claim".into(),
            c.devices.join(","),
            dash(&c.cpus),
            dash(&c.mems),
        ]);
    }
    for c in &inv.containers {
        rows.push([
            if c.name.is_empty() {
                c.id.clone()
            } else {
                c.name.clone()
            },
            c.grant.as_str().into(),
            c.pool.clone().unwrap_or_else(|| "-".into()),
            dash(&c.cpus),
            c.mems.clone().unwrap_or_else(|| "-".into()),
        ]);
    }
    let widths: Vec<usize> = (0..5)
        .map(|i| rows.iter().map(|r| r[i].len()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for r in &rows {
        let mut line = String::new();
        for (i, cell) in r.iter().enumerate() {
            let w = widths.get(i).copied().unwrap_or(0);
            let _ = write!(line, "{cell:<w$}  ");
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

fn dash(s: &str) -> String {
    if s.is_empty() {
        "-".into()
    } else {
        s.to_owned()
    }
}
