//! Topology discovery through hwlocality: the live machine, a synthetic description, or XML.
//!
//! Rules, each forced by something hwloc does:
//!
//! - The live machine is loaded with `INCLUDE_DISALLOWED`: the agent runs inside a container
//!   whose own cgroup would otherwise hide every CPU it is not allowed to run on.
//! - hwloc attaches NUMA nodes as *memory children* of a package, die, group or cache, and gives
//!   each the cpuset of that parent. A CPU belongs to the first node found walking up from it;
//!   when several nodes hang off the same parent (DRAM next to HBM or CXL memory), the DRAM one
//!   (no subtype or `DRAM`, lowest number) owns the CPUs and the others are memory-only, as the
//!   kernel's own `node<N>/cpulist` says.
//! - Memory-only nodes are classed by hwloc subtype (`HBM`/`MCDRAM`, `NVM`/`CXL-NVM`/`SPM`,
//!   `CXL-DRAM`); without one, a node smaller than the average DRAM node is HBM, else PMEM.
//! - Distances come from the NUMA latency matrix when the source has one (the firmware's SLIT on
//!   a live machine, an XML `distances2` element). Synthetic topologies have none, so they are
//!   derived: 10 to itself, 12 within a package, 20 across packages.
//! - PCIe roots come from sysfs only (see [`super::sysfs`]), never from hwloc: hwloc keeps I/O
//!   objects only when asked to, an XML export has them only if the machine's was made so, and
//!   it names host bridges by bus range, not by the `pci<domain>:<bus>` name Kubernetes'
//!   `resource.kubernetes.io/pcieRoot` attribute uses. A synthetic or XML topology gets roots
//!   from the sysfs root it is given with (a replayed machine's), else none.
//! - hwloc lists no PU for an offline CPU: offline CPUs are the complete cpuset minus the online
//!   one, further restricted by sysfs `online` when a sysfs root is given.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
};

use hwlocality::{
    Topology as HwTopology,
    object::{TopologyObject, attributes::ObjectAttributes, types::ObjectType},
    topology::builder::BuildFlags,
};

use super::{
    CacheGroup, Core, CoreKind, Die, MemoryKind, NumaNode, Package, PcieRoot, Topology,
    sysfs::{self, SysfsError},
};
use crate::idset::CpuSet;

/// Where a topology comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TopologySource {
    /// The machine we run on.
    Live,
    /// An hwloc synthetic description such as `pack:2 numa:2 core:8 pu:2`.
    Synthetic(String),
    /// An hwloc XML export (`lstopo machine.xml`), for replaying a real machine.
    Xml(PathBuf),
}

/// Why a topology could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum TopologyError {
    /// hwloc refused to build the topology.
    #[error("cannot build the {source_kind} topology: {message}")]
    Build {
        /// Which kind of source failed.
        source_kind: &'static str,
        /// hwloc's message.
        message: String,
    },
    /// The isolated or online CPU lists could not be read.
    #[error("reading cpu facts from sysfs")]
    Sysfs(#[from] SysfsError),
    /// The topology has no usable CPU.
    #[error("the {source_kind} topology has no online cpu")]
    NoCpus {
        /// Which kind of source it was.
        source_kind: &'static str,
    },
}

impl TopologySource {
    fn kind(&self) -> &'static str {
        match self {
            Self::Live => "live",
            Self::Synthetic(_) => "synthetic",
            Self::Xml(_) => "xml",
        }
    }
}

impl Topology {
    /// Discovers a topology from `source`; the live machine reads isolated and online CPUs from
    /// `/sys`, other sources assume every CPU online and none isolated.
    pub fn load(source: &TopologySource) -> Result<Self, TopologyError> {
        let root = matches!(source, TopologySource::Live).then(|| Path::new("/sys"));
        Self::load_with_sysfs(source, root)
    }

    /// Discovers a topology from `source`, reading isolated and online CPUs, each node's
    /// hugepages and the PCIe roots from sysfs under `sysfs_root` when given (see
    /// [`super::sysfs`]).
    pub fn load_with_sysfs(
        source: &TopologySource,
        sysfs_root: Option<&Path>,
    ) -> Result<Self, TopologyError> {
        let kind = source.kind();
        let build_err = |message: String| TopologyError::Build {
            source_kind: kind,
            message,
        };
        let builder = HwTopology::builder();
        let builder = match source {
            TopologySource::Live => builder
                .with_flags(BuildFlags::INCLUDE_DISALLOWED)
                .map_err(|e| build_err(e.to_string()))?,
            TopologySource::Synthetic(desc) => builder
                .from_synthetic(desc)
                .map_err(|e| build_err(e.to_string()))?,
            TopologySource::Xml(path) => builder
                .from_xml_file(path)
                .map_err(|e| build_err(format!("{}: {e}", path.display())))?,
        };
        let hw = builder.build().map_err(|e| build_err(e.to_string()))?;
        let facts = match sysfs_root {
            Some(root) => sysfs::read_cpu_facts(root)?,
            None => sysfs::CpuFacts::default(),
        };
        let mut topo = from_hwloc(&hw, &facts);
        if let Some(root) = sysfs_root {
            for node in &mut topo.numa_nodes {
                node.hugepages = sysfs::read_hugepages(root, node.id)?;
            }
            topo.pcie_roots = pcie_roots(&topo, sysfs::read_pcie_roots(root)?);
        }
        if topo.online.is_empty() {
            return Err(TopologyError::NoCpus { source_kind: kind });
        }
        Ok(topo)
    }
}

/// The roots sysfs lists, local to the online CPUs of their `cpulistaffinity`, or of their NUMA
/// node when that says nothing.
fn pcie_roots(topo: &Topology, raw: Vec<sysfs::RawPcieRoot>) -> Vec<PcieRoot> {
    raw.into_iter()
        .map(|r| {
            let cpus = match (&r.affinity, r.numa_node) {
                (Some(cpus), _) => cpus.intersection(&topo.online),
                (None, Some(node)) => topo
                    .numa_node(node)
                    .map(|n| n.cpus.clone())
                    .unwrap_or_default(),
                (None, None) => CpuSet::new(),
            };
            PcieRoot {
                name: r.name,
                cpus,
                numa_node: r.numa_node,
            }
        })
        .collect()
}

fn to_u32(i: usize) -> u32 {
    // Kernel CPU and node numbers are far below u32::MAX; saturate rather than wrap.
    u32::try_from(i).unwrap_or(u32::MAX)
}

fn cpus_of(set: &hwlocality::cpu::cpuset::CpuSet) -> CpuSet {
    set.iter_set().map(|i| to_u32(usize::from(i))).collect()
}

/// NUMA nodes attached below `obj`'s memory children (through memory-side caches, if any).
fn numa_children<'t>(obj: &'t TopologyObject, out: &mut Vec<&'t TopologyObject>) {
    for child in obj.memory_children() {
        if child.object_type() == ObjectType::NUMANode {
            out.push(child);
        } else {
            numa_children(child, out);
        }
    }
}

fn subtype(obj: &TopologyObject) -> Option<String> {
    obj.subtype().map(|s| s.to_string_lossy().into_owned())
}

fn is_dram_subtype(obj: &TopologyObject) -> bool {
    subtype(obj).is_none_or(|s| s.eq_ignore_ascii_case("DRAM"))
}

/// The node that owns a PU's CPU: see the module docs.
fn primary_node(pu: &TopologyObject) -> Option<u32> {
    let parent = pu.ancestors().find(|a| a.memory_arity() > 0)?;
    let mut nodes = Vec::new();
    numa_children(parent, &mut nodes);
    let ids = |pick_dram: bool| {
        nodes
            .iter()
            .filter(|n| !pick_dram || is_dram_subtype(n))
            .filter_map(|n| n.os_index())
            .min()
    };
    ids(true).or_else(|| ids(false)).map(to_u32)
}

fn package_of(obj: &TopologyObject) -> Option<u32> {
    obj.first_ancestor_with_type(ObjectType::Package).map(|p| {
        p.os_index()
            .map_or_else(|| to_u32(p.logical_index()), to_u32)
    })
}

fn from_hwloc(hw: &HwTopology, facts: &sysfs::CpuFacts) -> Topology {
    let mut online = cpus_of(&hw.cpuset());
    if let Some(sys_online) = &facts.online {
        online = online.intersection(sys_online);
    }
    let offline = cpus_of(&hw.complete_cpuset()).difference(&online);
    let isolated = facts.isolated.intersection(&online);

    // Per online PU: (cpu, package, die key, l3 key, core key, node).
    struct Pu {
        cpu: u32,
        package: u32,
        die: (u32, u64),
        l3: Option<u64>,
        core: u64,
        node: Option<u32>,
    }
    let pus: Vec<Pu> = hw
        .objects_with_type(ObjectType::PU)
        .filter_map(|pu| {
            let cpu = to_u32(pu.os_index()?);
            if !online.contains(cpu) {
                return None;
            }
            let package = package_of(pu).unwrap_or(0);
            let key = |ty| {
                pu.first_ancestor_with_type(ty)
                    .map(TopologyObject::global_persistent_index)
            };
            Some(Pu {
                cpu,
                package,
                die: (package, key(ObjectType::Die).unwrap_or(0)),
                l3: key(ObjectType::L3Cache),
                // Without Core objects every thread is its own core.
                core: key(ObjectType::Core).unwrap_or(u64::MAX - u64::from(cpu)),
                node: primary_node(pu),
            })
        })
        .collect();

    let group = |key: &dyn Fn(&Pu) -> Option<u64>| -> Vec<(u64, CpuSet)> {
        let mut map: BTreeMap<u64, CpuSet> = BTreeMap::new();
        for pu in &pus {
            if let Some(k) = key(pu) {
                map.entry(k).or_default().insert(pu.cpu);
            }
        }
        let mut groups: Vec<(u64, CpuSet)> = map.into_iter().collect();
        groups.sort_by_key(|(_, cpus)| cpus.first());
        groups
    };

    let mut package_ids: BTreeMap<u32, CpuSet> = BTreeMap::new();
    for pu in &pus {
        package_ids.entry(pu.package).or_default().insert(pu.cpu);
    }
    let packages: Vec<Package> = package_ids
        .into_iter()
        .map(|(id, cpus)| Package { id, cpus })
        .collect();

    let mut die_map: BTreeMap<(u32, u64), CpuSet> = BTreeMap::new();
    for pu in &pus {
        die_map.entry(pu.die).or_default().insert(pu.cpu);
    }
    let mut dies: Vec<((u32, u64), CpuSet)> = die_map.into_iter().collect();
    dies.sort_by_key(|((package, _), cpus)| (*package, cpus.first()));
    let l3s = group(&|pu| pu.l3);
    let cores = group(&|pu| Some(pu.core));

    let index_of =
        |list: &[(u64, CpuSet)], cpu: u32| list.iter().position(|(_, c)| c.contains(cpu));
    let kinds = core_kinds(hw);
    let cores: Vec<Core> = cores
        .iter()
        .filter_map(|(_, threads)| {
            let first = threads.first()?;
            let pu = pus.iter().find(|p| p.cpu == first)?;
            Some(Core {
                package: packages.iter().position(|p| p.id == pu.package)?,
                die: dies.iter().position(|(_, c)| c.contains(first))?,
                numa: pu.node,
                l3: index_of(&l3s, first),
                threads: threads.clone(),
                kind: kinds
                    .iter()
                    .find(|(cpus, _)| cpus.contains(first))
                    .map_or(CoreKind::Standard, |(_, kind)| *kind),
            })
        })
        .collect();

    let numa_nodes = numa_nodes(hw, &pus.iter().map(|p| (p.cpu, p.node)).collect::<Vec<_>>());

    Topology {
        packages,
        dies: dies
            .into_iter()
            .map(|((package, _), cpus)| Die { package, cpus })
            .collect(),
        numa_nodes,
        l3_groups: l3s
            .into_iter()
            .map(|(_, cpus)| CacheGroup { cpus })
            .collect(),
        cores,
        online,
        offline,
        isolated,
        pcie_roots: Vec::new(),
    }
}

/// The kind of each CPU on a hybrid part: hwloc's CPU kinds, ranked by efficiency (the highest
/// is the performance kind) when hwloc could rank them (every kind has an efficiency, not all the
/// same), else by the `CoreType` it reports (`IntelCore` performance, `IntelAtom` efficiency).
/// One kind, or kinds it cannot tell apart, is a machine of standard cores (an empty list).
fn core_kinds(hw: &HwTopology) -> Vec<(CpuSet, CoreKind)> {
    let Ok(kinds) = hw.cpu_kinds() else {
        return Vec::new();
    };
    let kinds: Vec<_> = kinds.collect();
    if kinds.len() < 2 {
        return Vec::new();
    }
    let core_type = |k: &hwlocality::cpu::kind::CpuKind<'_>| {
        let info = k
            .infos
            .iter()
            .find(|i| i.name().to_string_lossy() == "CoreType")?;
        match info.value().to_string_lossy().as_ref() {
            "IntelCore" => Some(CoreKind::Performance),
            "IntelAtom" => Some(CoreKind::Efficiency),
            _ => None,
        }
    };
    let efficiencies: Option<Vec<usize>> = kinds.iter().map(|k| k.efficiency).collect();
    let ranked = efficiencies
        .as_ref()
        .filter(|e| e.iter().min() != e.iter().max())
        .and_then(|e| e.iter().max().copied());
    kinds
        .iter()
        .filter_map(|k| {
            let kind = match (ranked, k.efficiency) {
                (Some(most), Some(e)) if e == most => CoreKind::Performance,
                (Some(_), _) => CoreKind::Efficiency,
                (None, _) => core_type(k)?,
            };
            Some((cpus_of(&k.cpuset), kind))
        })
        .collect()
}

fn numa_nodes(hw: &HwTopology, pu_nodes: &[(u32, Option<u32>)]) -> Vec<NumaNode> {
    struct Raw {
        id: u32,
        memory: u64,
        subtype: Option<String>,
        package: Option<u32>,
        cpus: CpuSet,
    }
    let mut raw: Vec<Raw> = hw
        .objects_with_type(ObjectType::NUMANode)
        .filter_map(|node| {
            let id = to_u32(node.os_index()?);
            let memory = match node.attributes() {
                Some(ObjectAttributes::NUMANode(a)) => a.local_memory().map_or(0, |m| m.get()),
                _ => 0,
            };
            Some(Raw {
                id,
                memory,
                subtype: subtype(node),
                package: package_of(node),
                cpus: pu_nodes
                    .iter()
                    .filter(|(_, n)| *n == Some(id))
                    .map(|(cpu, _)| *cpu)
                    .collect(),
            })
        })
        .collect();
    raw.sort_by_key(|n| n.id);

    let dram: Vec<u64> = raw
        .iter()
        .filter(|n| !n.cpus.is_empty())
        .map(|n| n.memory)
        .collect();
    let average_dram = dram.iter().sum::<u64>() / u64::try_from(dram.len().max(1)).unwrap_or(1);
    let kind = |n: &Raw| {
        if !n.cpus.is_empty() {
            return MemoryKind::Dram;
        }
        match n.subtype.as_deref().map(str::to_ascii_uppercase).as_deref() {
            Some("HBM" | "MCDRAM") => MemoryKind::Hbm,
            Some("NVM" | "CXL-NVM" | "SPM") => MemoryKind::Pmem,
            Some("CXL-DRAM") => MemoryKind::Cxl,
            _ if n.memory < average_dram => MemoryKind::Hbm,
            _ => MemoryKind::Pmem,
        }
    };

    let matrix = latency_matrix(hw);
    raw.iter()
        .map(|n| {
            let distances = raw
                .iter()
                .map(|m| {
                    let derived = if m.id == n.id {
                        10
                    } else if n.package.is_some() && n.package == m.package {
                        12
                    } else {
                        20
                    };
                    let d = matrix.get(&(n.id, m.id)).copied().unwrap_or(derived);
                    (m.id, d)
                })
                .collect();
            NumaNode {
                id: n.id,
                cpus: n.cpus.clone(),
                memory_bytes: n.memory,
                kind: kind(n),
                package: n.package,
                distances,
                hugepages: BTreeMap::new(),
            }
        })
        .collect()
}

/// The NUMA distance matrix hwloc has, by (from, to) node number; empty when there is none.
fn latency_matrix(hw: &HwTopology) -> BTreeMap<(u32, u32), u32> {
    let Ok(all) = hw.distances(None) else {
        return BTreeMap::new();
    };
    for d in &all {
        let objects: Vec<Option<&TopologyObject>> = d.objects().collect();
        let ids: Option<Vec<u32>> = objects
            .iter()
            .map(|o| {
                o.filter(|o| o.object_type() == ObjectType::NUMANode)
                    .and_then(TopologyObject::os_index)
                    .map(to_u32)
            })
            .collect();
        let Some(ids) = ids else { continue };
        let unique: BTreeSet<u32> = ids.iter().copied().collect();
        if unique.len() != ids.len() {
            continue;
        }
        let values = d.distances();
        let mut out = BTreeMap::new();
        for (i, from) in ids.iter().enumerate() {
            for (j, to) in ids.iter().enumerate() {
                if let Some(v) = values.get(i * ids.len() + j) {
                    out.insert((*from, *to), u32::try_from(*v).unwrap_or(u32::MAX));
                }
            }
        }
        return out;
    }
    BTreeMap::new()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn synthetic(desc: &str) -> Topology {
        Topology::load(&TopologySource::Synthetic(desc.into())).unwrap()
    }

    #[test]
    fn models_packages_numa_nodes_cores_and_threads() {
        let t = synthetic("pack:2 numa:2 core:8 pu:2");
        assert_eq!(t.packages.len(), 2);
        assert_eq!(t.dies.len(), 2, "one die per package without Die objects");
        assert_eq!(t.numa_nodes.len(), 4);
        assert_eq!(t.cores.len(), 32);
        assert_eq!(t.threads_per_core(), 2);
        assert_eq!(t.online.to_string(), "0-63");
        assert_eq!(t.numa_nodes[1].cpus.to_string(), "16-31");
        assert_eq!(t.numa_nodes[2].package, Some(1));
        assert_eq!(t.cores[3].threads.to_string(), "6-7");
        assert_eq!(t.cores[3].numa, Some(0));
        assert!(t.numa_nodes.iter().all(|n| n.kind == MemoryKind::Dram));
        // Derived distances: 10 self, 12 in the package, 20 across.
        assert_eq!(t.distance(0, 0), 10);
        assert_eq!(t.distance(0, 1), 12);
        assert_eq!(t.distance(0, 2), 20);
    }

    #[test]
    fn models_l3_groups_and_dies() {
        let t = synthetic("pack:1 die:2 l3:2 core:4 pu:1");
        assert_eq!(t.dies.len(), 2);
        assert_eq!(t.l3_groups.len(), 4);
        assert_eq!(t.l3_groups[1].cpus.to_string(), "4-7");
        assert_eq!(t.cores[5].l3, Some(1));
        assert_eq!(t.cores[9].die, 1);
    }

    #[test]
    fn a_second_node_on_the_same_parent_is_memory_only() {
        let t = synthetic("pack:2 [numa(memory=64GiB)] [numa(memory=16GiB)] core:4 pu:2");
        assert_eq!(t.numa_nodes.len(), 4);
        let (dram, hbm) = (&t.numa_nodes[0], &t.numa_nodes[1]);
        assert_eq!(dram.cpus.to_string(), "0-7");
        assert_eq!(dram.kind, MemoryKind::Dram);
        assert_eq!(dram.memory_bytes, 64 << 30);
        assert!(hbm.is_memory_only());
        assert_eq!(hbm.kind, MemoryKind::Hbm, "smaller than average dram");
        assert_eq!(hbm.package, Some(0));
    }

    #[test]
    fn sysfs_root_takes_cpus_offline_and_isolates_them() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("devices/system/cpu");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("online"), "0-6\n").unwrap();
        std::fs::write(dir.join("isolated"), "2-3,7\n").unwrap();
        let t = Topology::load_with_sysfs(
            &TopologySource::Synthetic("pack:1 core:4 pu:2".into()),
            Some(root.path()),
        )
        .unwrap();
        assert_eq!(t.online.to_string(), "0-6");
        assert_eq!(t.offline.to_string(), "7");
        assert_eq!(
            t.isolated.to_string(),
            "2-3",
            "an offline cpu is not isolated"
        );
        assert_eq!(t.cores[3].threads.to_string(), "6");
    }

    #[test]
    fn pcie_roots_are_local_to_their_affinity_or_their_nodes_cpus() {
        let root = tempfile::tempdir().unwrap();
        let add = |bus: &str, affinity: &str, numa: Option<&str>| {
            let dir = root.path().join(format!("devices/pci{bus}"));
            let bus_dir = dir.join(format!("pci_bus/{bus}"));
            std::fs::create_dir_all(&bus_dir).unwrap();
            std::fs::write(bus_dir.join("cpulistaffinity"), affinity).unwrap();
            if let Some(numa) = numa {
                let device = dir.join(format!("{bus}:01.0"));
                std::fs::create_dir_all(&device).unwrap();
                std::fs::write(device.join("numa_node"), numa).unwrap();
            }
        };
        add("0000:00", "0-7,40\n", Some("0"));
        add("0000:80", "", Some("1"));
        add("0000:c0", "bogus", None);
        let t = Topology::load_with_sysfs(
            &TopologySource::Synthetic("pack:2 numa:1 core:4 pu:2".into()),
            Some(root.path()),
        )
        .unwrap();
        let got: Vec<(&str, String, Option<u32>)> = t
            .pcie_roots
            .iter()
            .map(|r| (r.name.as_str(), r.cpus.to_string(), r.numa_node))
            .collect();
        assert_eq!(
            got,
            [
                ("pci0000:00", "0-7".to_owned(), Some(0)),
                ("pci0000:80", "8-15".to_owned(), Some(1)),
                ("pci0000:c0", String::new(), None),
            ],
            "affinity limited to online cpus; an empty one falls back to the node's cpus; \
             without either the root is local to no cpu"
        );
        assert_eq!(
            t.pcie_roots_of(&"6-9".parse().unwrap()),
            ["pci0000:00", "pci0000:80"]
        );
        assert!(t.pcie_roots_of(&"16".parse().unwrap()).is_empty());
        assert!(
            synthetic("pack:2 core:4 pu:2").pcie_roots.is_empty(),
            "no sysfs root, no roots"
        );
    }

    #[test]
    fn hybrid_parts_tell_performance_from_efficiency_cores() {
        let xml =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hybrid.xml");
        let t = Topology::load(&TopologySource::Xml(xml.clone())).unwrap();
        let kinds: Vec<(String, CoreKind)> = t
            .cores
            .iter()
            .map(|c| (c.threads.to_string(), c.kind))
            .collect();
        assert_eq!(
            kinds,
            [
                ("0-1".to_owned(), CoreKind::Performance),
                ("2-3".to_owned(), CoreKind::Performance),
                ("4".to_owned(), CoreKind::Efficiency),
                ("5".to_owned(), CoreKind::Efficiency),
                ("6".to_owned(), CoreKind::Efficiency),
                ("7".to_owned(), CoreKind::Efficiency),
            ]
        );
        assert_eq!(t.threads_per_core(), 2);
        // Ranked efficiencies win over the CoreType names (here the other way round).
        let text = std::fs::read_to_string(&xml).unwrap();
        let ranked = text.replacen(
            "\"0x000000f0\" forced_efficiency=\"0\"",
            "\"0x000000f0\" forced_efficiency=\"1\"",
            1,
        );
        assert_ne!(ranked, text);
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("ranked.xml");
        std::fs::write(&file, ranked).unwrap();
        let t = Topology::load(&TopologySource::Xml(file)).unwrap();
        assert_eq!(t.cores[0].kind, CoreKind::Efficiency);
        assert_eq!(t.cores[5].kind, CoreKind::Performance);
        // A machine of one kind is standard cores.
        assert!(
            synthetic("pack:1 core:2 pu:2")
                .cores
                .iter()
                .all(|c| c.kind == CoreKind::Standard)
        );
    }

    #[test]
    fn a_bad_description_is_a_typed_error() {
        let err = Topology::load(&TopologySource::Synthetic("pack:zero".into())).unwrap_err();
        assert!(
            matches!(
                err,
                TopologyError::Build {
                    source_kind: "synthetic",
                    ..
                }
            ),
            "{err}"
        );
    }
}
