//! What a simulation reports: per step, what changed; at the end, who holds what. Rendered as
//! text for people and as JSON for programs, from the same values.
//!
//! Nothing in a report depends on where the simulation wrote (temporary directories) or on
//! timing, so the same scenario always prints the same report: the shipped scenarios' expected
//! outputs are checked byte for byte.

use std::fmt::Write as _;

use policy::{AttributeValue, Device, Topology};
use serde::Serialize;

use super::scenario::Scenario;
use crate::{values, view::Inventory};

/// A device the policy publishes, in short.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeviceSummary {
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub numa_node: Option<i64>,
    /// CPUs a claim may take on it.
    pub cpu: String,
    #[serde(skip)]
    pub cpu_capacity_milli: u64,
}

impl DeviceSummary {
    pub fn of(d: &Device) -> Self {
        let capacity = d.capacities.get("cpu").map(|c| c.value);
        let numa_node = d
            .attributes
            .get(policy::topology_aware::claims::NUMA_NODE_ATTRIBUTE)
            .and_then(|a| match a {
                AttributeValue::Int(n) => Some(*n),
                _ => None,
            });
        Self {
            name: d.name.clone(),
            numa_node,
            cpu: capacity.map_or_else(|| "0".into(), |q| q.to_string()),
            cpu_capacity_milli: capacity.map_or(0, |q| q.milli()),
        }
    }
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
    },
    /// A claim's CDI spec was written and its devices answered to the kubelet.
    Spec {
        claim: String,
        file: String,
        cdi_devices: Vec<String>,
    },
    /// A claim's CPUs were given back.
    Released { claim: String, cpus: String },
    /// The agent restarted from its state file.
    Restarted { claims: usize, containers: usize },
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
    pub devices: Vec<DeviceSummary>,
    pub steps: Vec<StepReport>,
    pub allocation: Inventory,
}

impl Report {
    pub fn new(
        file: &str,
        scenario: &Scenario,
        topology: &Topology,
        devices: Vec<DeviceSummary>,
        steps: Vec<StepReport>,
        inventory: &Inventory,
    ) -> Self {
        let summary = topology.to_string();
        let _ = values::show_reserved(&scenario.reserved_cpus);
        Self {
            scenario: file.to_owned(),
            description: scenario.description.clone(),
            machine: Machine {
                summary: summary.lines().next().unwrap_or_default().to_owned(),
                online: topology.online.to_string(),
                reserved: inventory.reserved.clone(),
            },
            devices,
            steps,
            allocation: inventory.clone(),
        }
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
        let devices: Vec<String> = self
            .devices
            .iter()
            .map(|d| format!("{} ({} cpus)", d.name, d.cpu))
            .collect();
        let _ = writeln!(o, "DRA devices published: {}", devices.join(", "));
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
            if let Some(e) = &s.error {
                let _ = writeln!(o, "    refused: {e}");
            }
            for c in &s.changes {
                let _ = writeln!(o, "    {}", change_line(c));
            }
            if s.error.is_none() && s.changes.is_empty() {
                let _ = writeln!(o, "    (no placement changed)");
            }
        }
        let _ = writeln!(o);
        let _ = writeln!(o, "final allocation:");
        o.push_str(&table(&self.allocation));
        o
    }
}

fn change_line(c: &Change) -> String {
    match c {
        Change::Placed {
            container,
            grant,
            pool,
            cpus,
            mems,
        } => {
            let how = match pool {
                Some(p) => format!("{grant} in {p}"),
                None => grant.clone(),
            };
            format!("+ {container}: {how}, cpus {cpus}, mems {mems}")
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
        } => format!(
            "+ claim {claim}: {} -> cpus {cpus}, mems {}",
            devices.join(","),
            dash(mems)
        ),
        Change::Spec {
            claim,
            file,
            cdi_devices,
        } => format!("  CDI spec {file} for {claim}: {}", cdi_devices.join(", ")),
        Change::Released { claim, cpus } => format!("- claim {claim}: cpus {cpus} released"),
        Change::Restarted { claims, containers } => format!(
            "agent restarted: {claims} claim(s) restored from the state file, {containers} running container(s) synchronized"
        ),
    }
}

/// The final allocation as an aligned table.
pub fn table(inv: &Inventory) -> String {
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
