//! `--svg FILE`: the machine drawn as nested boxes (sockets, NUMA nodes, cores, hardware
//! threads), each thread coloured by who holds it: reserved, shared, each claim, each exclusive
//! container. Hand-written SVG: the drawing is a few hundred rectangles and labels, which a
//! plotting crate would not make simpler.

use std::{collections::BTreeMap, fmt::Write as _};

use policy::{CpuSet, GrantKind, Topology};

use crate::view::InventoryRows;

const THREAD: u32 = 24;
const GAP: u32 = 4;
const CORES_PER_ROW: usize = 8;
const LABEL: u32 = 18;

const RESERVED: &str = "#9e9e9e";
const SHARED: &str = "#cfe3f7";
const IDLE: &str = "#ffffff";
/// Distinct fills for claims and exclusive containers, in order of appearance.
const PALETTE: [&str; 12] = [
    "#e6550d", "#31a354", "#756bb1", "#d6616b", "#3182bd", "#e7ba52", "#17becf", "#8c564b",
    "#e377c2", "#7f7f7f", "#bcbd22", "#393b79",
];

/// Who holds each CPU, and the legend.
struct Owners {
    by_cpu: BTreeMap<u32, usize>,
    /// (label, colour), index = owner id.
    legend: Vec<(String, String)>,
}

fn owners(topo: &Topology, inv: &InventoryRows) -> Owners {
    let mut legend = vec![
        (
            format!("reserved ({})", or_none(&inv.reserved)),
            RESERVED.to_owned(),
        ),
        (
            format!("shared ({})", or_none(&inv.shared)),
            SHARED.to_owned(),
        ),
        ("unassigned (isolated or idle)".to_owned(), IDLE.to_owned()),
    ];
    let mut by_cpu = BTreeMap::new();
    for cpu in topo.online.iter() {
        let owner = if inv.source.reserved.contains(cpu) {
            0
        } else if inv.source.shared.contains(cpu) {
            1
        } else {
            2
        };
        by_cpu.insert(cpu, owner);
    }
    let mut assign = |label: String, cpus: &CpuSet, legend: &mut Vec<(String, String)>| {
        let colour = PALETTE
            .get((legend.len() - 3) % PALETTE.len())
            .copied()
            .unwrap_or(IDLE);
        legend.push((label, colour.to_owned()));
        let id = legend.len() - 1;
        for cpu in cpus.iter() {
            by_cpu.insert(cpu, id);
        }
    };
    for c in &inv.claims {
        let users: Vec<&str> = inv
            .containers
            .iter()
            .filter(|p| p.grant == GrantKind::Claim && p.cpus == c.cpus)
            .map(|p| {
                if p.name.is_empty() {
                    p.id.as_str()
                } else {
                    p.name.as_str()
                }
            })
            .collect();
        let label = if users.is_empty() {
            format!("claim {} ({})", c.name, c.cpus)
        } else {
            format!(
                "claim {} ({}), used by {}",
                c.name,
                c.cpus,
                users.join(", ")
            )
        };
        if let Some(held) = inv.source.claims.iter().find(|h| h.uid == c.uid) {
            assign(label, &held.cpus, &mut legend);
        }
    }
    for c in &inv.containers {
        let own = inv.source.containers.iter().find(|p| {
            p.id == c.id && matches!(p.grant, GrantKind::Exclusive | GrantKind::Isolated)
        });
        if let Some(cpus) = own.map(|p| &p.cpus) {
            let name = if c.name.is_empty() { &c.id } else { &c.name };
            assign(
                format!("{name} ({}, {})", c.grant.as_str(), c.cpus),
                cpus,
                &mut legend,
            );
        }
    }
    Owners { by_cpu, legend }
}

fn or_none(s: &str) -> &str {
    if s.is_empty() { "none" } else { s }
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// The drawing.
pub fn render(topo: &Topology, inv: &InventoryRows, title: &str) -> String {
    let owners = owners(topo, inv);
    let mut body = String::new();
    let mut x = GAP * 2;
    let top = LABEL + GAP * 2;
    let mut height = 0;
    for (pi, package) in topo.packages.iter().enumerate() {
        let (w, h) = package_box(topo, &owners, pi, package.id, x, top, &mut body);
        x += w + GAP * 2;
        height = height.max(h);
    }
    let width = x.max(480);
    let mut legend = String::new();
    let mut y = top + height + GAP * 4;
    for (label, colour) in &owners.legend {
        let _ = writeln!(
            legend,
            r##"<rect x="{}" y="{y}" width="14" height="14" fill="{colour}" stroke="#333"/><text x="{}" y="{}" font-size="12">{}</text>"##,
            GAP * 2,
            GAP * 2 + 20,
            y + 12,
            esc(label)
        );
        y += 20;
    }
    let total = y + GAP * 2;
    format!(
        r##"<?xml version="1.0" encoding="UTF-8"?>
<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{total}" viewBox="0 0 {width} {total}" font-family="sans-serif">
<title>{}</title>
<rect width="100%" height="100%" fill="#fafafa"/>
<text x="{}" y="{}" font-size="14" font-weight="bold">{}</text>
{body}{legend}</svg>
"##,
        esc(title),
        GAP * 2,
        LABEL,
        esc(title)
    )
}

/// Draws one package at (x, y); returns its size.
fn package_box(
    topo: &Topology,
    owners: &Owners,
    index: usize,
    id: u32,
    x: u32,
    y: u32,
    out: &mut String,
) -> (u32, u32) {
    let mut inner = String::new();
    let mut nx = x + GAP * 2;
    let ny = y + LABEL + GAP;
    let mut h = 0;
    // NUMA nodes with CPUs in this package, then cores with no NUMA node.
    let mut groups: Vec<(String, Vec<&policy::topology::Core>)> = topo
        .numa_nodes
        .iter()
        .filter(|n| !n.is_memory_only())
        .map(|n| {
            let cores: Vec<_> = topo
                .cores
                .iter()
                .filter(|c| c.package == index && c.numa == Some(n.id))
                .collect();
            (
                format!("numa{} ({} MiB)", n.id, n.memory_bytes >> 20),
                cores,
            )
        })
        .filter(|(_, cores)| !cores.is_empty())
        .collect();
    let loose: Vec<_> = topo
        .cores
        .iter()
        .filter(|c| c.package == index && c.numa.is_none())
        .collect();
    if !loose.is_empty() {
        groups.push(("no numa node".to_owned(), loose));
    }
    for (label, cores) in &groups {
        let (w, gh) = numa_box(owners, label, cores, nx, ny, &mut inner);
        nx += w + GAP * 2;
        h = h.max(gh);
    }
    let width = (nx - x).max(120);
    let height = h + LABEL + GAP * 3;
    let _ = writeln!(
        out,
        r##"<g class="package"><rect x="{x}" y="{y}" width="{width}" height="{height}" rx="6" fill="#eeeeee" stroke="#555"/><text x="{}" y="{}" font-size="13">socket {id}</text>"##,
        x + GAP * 2,
        y + LABEL - 3
    );
    out.push_str(&inner);
    out.push_str("</g>\n");
    (width, height)
}

fn numa_box(
    owners: &Owners,
    label: &str,
    cores: &[&policy::topology::Core],
    x: u32,
    y: u32,
    out: &mut String,
) -> (u32, u32) {
    let threads = cores.iter().map(|c| c.threads.len()).max().unwrap_or(1);
    let threads = u32::try_from(threads).unwrap_or(1);
    let core_w = threads * THREAD + (threads + 1) * 2;
    let core_h = THREAD + 4;
    let columns = u32::try_from(cores.len().min(CORES_PER_ROW)).unwrap_or(1);
    let rows = u32::try_from(cores.len().div_ceil(CORES_PER_ROW)).unwrap_or(1);
    let width = (columns * (core_w + GAP) + GAP * 3).max(110);
    let height = rows * (core_h + GAP) + LABEL + GAP * 2;
    let _ = writeln!(
        out,
        r##"<g class="numa"><rect x="{x}" y="{y}" width="{width}" height="{height}" rx="4" fill="#ffffff" stroke="#888"/><text x="{}" y="{}" font-size="11">{}</text>"##,
        x + GAP,
        y + LABEL - 5,
        esc(label)
    );
    for (i, core) in cores.iter().enumerate() {
        let col = u32::try_from(i % CORES_PER_ROW).unwrap_or(0);
        let row = u32::try_from(i / CORES_PER_ROW).unwrap_or(0);
        let cx = x + GAP * 2 + col * (core_w + GAP);
        let cy = y + LABEL + row * (core_h + GAP);
        let _ = writeln!(
            out,
            r##"<rect class="core" x="{cx}" y="{cy}" width="{core_w}" height="{core_h}" fill="#dddddd" stroke="#999"/>"##
        );
        for (t, cpu) in core.threads.iter().enumerate() {
            let tx = cx + 2 + u32::try_from(t).unwrap_or(0) * (THREAD + 2);
            let ty = cy + 2;
            let owner = owners.by_cpu.get(&cpu).copied().unwrap_or(2);
            let (who, colour) = owners
                .legend
                .get(owner)
                .map_or(("unassigned", IDLE), |(l, c)| (l.as_str(), c.as_str()));
            let _ = writeln!(
                out,
                r##"<g class="cpu" id="cpu-{cpu}"><rect x="{tx}" y="{ty}" width="{THREAD}" height="{THREAD}" fill="{colour}" stroke="#333"/><text x="{}" y="{}" font-size="10" text-anchor="middle">{cpu}</text><title>cpu {cpu}: {}</title></g>"##,
                tx + THREAD / 2,
                ty + THREAD / 2 + 4,
                esc(who)
            );
        }
    }
    out.push_str("</g>\n");
    (width, height)
}
