//! `resmgr topology`: the machine as the policy sees it, its pool tree, and the DRA devices the
//! agent would publish.

use std::{collections::BTreeMap, process::ExitCode};

use policy::{
    Topology,
    topology_aware::{Config, ReservedCpus},
};
use serde::Serialize;

use crate::{
    policy_choice,
    simulate::report::DeviceSummary,
    values::{self, Format},
    view,
};

#[derive(Serialize)]
struct Out<'a> {
    topology: &'a Topology,
    reserved: String,
    pools: Vec<view::PoolCounts>,
    devices: Vec<policy::Device>,
}

pub fn main(
    topology: &str,
    reserved: Option<&str>,
    reserved_count: &str,
    format: Format,
) -> anyhow::Result<ExitCode> {
    let source =
        values::topology(topology, None).map_err(|e| anyhow::anyhow!("--topology: {e}"))?;
    let reserved_cpus = match reserved {
        Some(set) => ReservedCpus::Set(
            values::reserved_cpuset(set).map_err(|e| anyhow::anyhow!("--reserved-cpus: {e}"))?,
        ),
        None => ReservedCpus::Count(
            values::reserved_count(reserved_count)
                .map_err(|e| anyhow::anyhow!("--reserved-cpu-count: {e}"))?,
        ),
    };
    let shown = values::show_reserved(&reserved_cpus);
    let topo =
        Topology::load(&source).map_err(|e| anyhow::anyhow!("--topology {topology:?}: {e}"))?;
    let policy = policy_choice::build(
        topo.clone(),
        Config {
            reserved_cpus,
            ..Config::default()
        },
    )
    .map_err(|e| anyhow::anyhow!("reserved cpus {shown}: {e}"))?;
    let devices = view::devices_to_show(&*policy)?;
    let report = policy.inventory();
    let depths: BTreeMap<String, usize> = report
        .pools
        .iter()
        .map(|p| (p.name.clone(), p.depth))
        .collect();
    let inventory = view::InventoryRows::from(report);
    match format {
        Format::Json => {
            let out = Out {
                topology: &topo,
                reserved: inventory.reserved.clone(),
                pools: inventory.pools,
                devices,
            };
            println!("{}", serde_json::to_string_pretty(&out)?);
        }
        Format::Text => {
            print!("{topo}");
            println!("reserved cpus {}", inventory.reserved);
            println!("pools:");
            let depth = |name: &str| depths.get(name).copied().unwrap_or(0);
            for p in &inventory.pools {
                println!(
                    "  {}{} ({}): cpus {}, {} shared, {} reserved",
                    "  ".repeat(depth(&p.name)),
                    p.name,
                    p.kind,
                    p.cpus,
                    p.shared,
                    p.reserved
                );
            }
            println!("DRA devices:");
            for d in &devices {
                let s = DeviceSummary::of(d);
                let numa = s
                    .numa_node
                    .map(|n| format!(", numa node {n}"))
                    .unwrap_or_default();
                println!(
                    "  {}: {} cpus to claim{numa}{}",
                    s.name,
                    s.cpu,
                    if d.allow_multiple_allocations {
                        ", shared by claims"
                    } else {
                        ""
                    }
                );
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
