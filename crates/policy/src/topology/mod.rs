//! The machine as the policy sees it: packages, dies, NUMA nodes, L3 groups, cores and threads.
//!
//! [`Topology`] is plain data. [`discover`] fills it from hwloc (the live machine, a synthetic
//! description or an XML file) and [`sysfs`] adds what hwloc does not say: which CPUs the kernel
//! isolated, which it took offline, each node's hugepages and the PCIe root complexes local to
//! each CPU ([`PcieRoot`]). That discovery is the only IO in this crate; everything
//! downstream is a pure function of a `Topology`, so tests and benchmarks build one from a
//! synthetic string and get the same decisions every time.
//!
//! Numbering is the kernel's throughout (`os_index` in hwloc terms): CPU numbers as in
//! `cpuset.cpus`, node numbers as in `cpuset.mems`. Dies, L3 groups and cores, which have no
//! kernel number the policy needs, are identified by their index in the vectors here.

pub mod discover;
pub mod sysfs;

use std::{collections::BTreeMap, fmt};

use serde::{Deserialize, Serialize};

pub use discover::{TopologyError, TopologySource};

use crate::idset::{CpuSet, NodeSet};

/// What kind of memory a NUMA node holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum MemoryKind {
    /// Ordinary memory; every node with CPUs is DRAM.
    Dram,
    /// High-bandwidth memory without CPUs (MCDRAM, HBM).
    Hbm,
    /// Persistent or slow memory without CPUs (NVDIMM, CXL persistent memory).
    Pmem,
    /// CXL-attached volatile memory without CPUs.
    Cxl,
}

impl MemoryKind {
    /// Every kind, in order.
    pub const ALL: [Self; 4] = [Self::Dram, Self::Hbm, Self::Pmem, Self::Cxl];

    /// The lower-case name annotations use (`dram`, `hbm`, `pmem`, `cxl`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Dram => "dram",
            Self::Hbm => "hbm",
            Self::Pmem => "pmem",
            Self::Cxl => "cxl",
        }
    }
}

/// A physical package (socket).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Package {
    /// The kernel's package number (`physical_package_id`).
    pub id: u32,
    /// Its online CPUs.
    pub cpus: CpuSet,
}

/// A die inside a package.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Die {
    /// The package it belongs to.
    pub package: u32,
    /// Its online CPUs.
    pub cpus: CpuSet,
}

/// A NUMA node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NumaNode {
    /// The kernel's node number.
    pub id: u32,
    /// The online CPUs local to the node; empty for a memory-only node.
    pub cpus: CpuSet,
    /// Memory the node holds, in bytes.
    pub memory_bytes: u64,
    /// What kind of memory it is.
    pub kind: MemoryKind,
    /// The package its CPUs (or, for a memory-only node, its attachment point) belong to, if one.
    pub package: Option<u32>,
    /// Distance to every node by node number, including itself (10 by ACPI convention). Larger
    /// is farther. From the firmware's table when the source has one, else derived from the
    /// tree (see [`discover`]).
    pub distances: BTreeMap<u32, u32>,
    /// Hugepages the node holds: page size in bytes -> pages the kernel keeps for it
    /// (`nr_hugepages`, see [`sysfs`]). Empty when the source does not say (synthetic and XML
    /// topologies, or a kernel without hugepages).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub hugepages: BTreeMap<u64, u64>,
}

impl NumaNode {
    /// Whether the node has memory but no CPUs.
    pub fn is_memory_only(&self) -> bool {
        self.cpus.is_empty()
    }

    /// Bytes of hugepages of `page_size` bytes the node holds.
    pub fn hugepage_bytes(&self, page_size: u64) -> u64 {
        self.hugepages
            .get(&page_size)
            .map_or(0, |pages| pages.saturating_mul(page_size))
    }

    /// Distance to `other`; unknown pairs count as very far.
    pub fn distance_to(&self, other: u32) -> u32 {
        self.distances.get(&other).copied().unwrap_or(u32::MAX)
    }
}

/// A group of cores sharing a last-level (L3) cache.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CacheGroup {
    /// Its online CPUs.
    pub cpus: CpuSet,
}

/// What kind of core a core is, on hybrid parts (performance and efficiency cores).
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub enum CoreKind {
    /// The machine has one kind of core (or does not say).
    #[default]
    Standard,
    /// A performance core of a hybrid part (the kind hwloc ranks most performant).
    Performance,
    /// An efficiency core of a hybrid part (every other kind).
    Efficiency,
}

impl CoreKind {
    /// The name devices publish (`standard`, `p-core`, `e-core`, as kubernetes-sigs/dra-driver-cpu
    /// names them).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Standard => "standard",
            Self::Performance => "p-core",
            Self::Efficiency => "e-core",
        }
    }
}

/// A physical core and its hardware threads.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Core {
    /// Index into [`Topology::packages`].
    pub package: usize,
    /// Index into [`Topology::dies`].
    pub die: usize,
    /// The node number of the NUMA node the core's CPUs are local to, if any.
    pub numa: Option<u32>,
    /// Index into [`Topology::l3_groups`], if the machine reports L3 caches.
    pub l3: Option<usize>,
    /// The core's online hardware threads (SMT siblings).
    pub threads: CpuSet,
    /// Performance or efficiency core on a hybrid part.
    #[serde(default)]
    pub kind: CoreKind,
}

/// A PCIe root complex (host bridge) and the CPUs local to it, from sysfs (see [`sysfs`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PcieRoot {
    /// Its name as the kernel and Kubernetes' standard `resource.kubernetes.io/pcieRoot`
    /// attribute spell it: `pci<domain>:<bus>` in lower-case hex, such as `pci0000:00`.
    pub name: String,
    /// The online CPUs local to it: its root bus's `cpulistaffinity`, or, when that is empty or
    /// unreadable, the CPUs of its NUMA node; empty when neither says.
    pub cpus: CpuSet,
    /// The NUMA node its devices report (`numa_node`), if any does.
    pub numa_node: Option<u32>,
}

/// The machine as the policy sees it. See the module docs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Topology {
    /// Packages by ascending number.
    pub packages: Vec<Package>,
    /// Dies, package by package.
    pub dies: Vec<Die>,
    /// NUMA nodes by ascending number, memory-only nodes included.
    pub numa_nodes: Vec<NumaNode>,
    /// L3 cache groups in CPU order; empty when the source reports none.
    pub l3_groups: Vec<CacheGroup>,
    /// Cores with at least one online thread, in CPU order.
    pub cores: Vec<Core>,
    /// CPUs the kernel runs (everything the policy may hand out).
    pub online: CpuSet,
    /// CPUs that exist but are offline.
    pub offline: CpuSet,
    /// Online CPUs the kernel isolated from the scheduler (`isolcpus`).
    pub isolated: CpuSet,
    /// PCIe root complexes by name; empty when the topology was loaded without a sysfs root.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pcie_roots: Vec<PcieRoot>,
}

impl Topology {
    /// The NUMA node with kernel number `id`.
    pub fn numa_node(&self, id: u32) -> Option<&NumaNode> {
        self.numa_nodes.iter().find(|n| n.id == id)
    }

    /// Distance between two nodes; unknown pairs count as very far.
    pub fn distance(&self, from: u32, to: u32) -> u32 {
        self.numa_node(from).map_or(u32::MAX, |n| n.distance_to(to))
    }

    /// Every node that holds memory of kind DRAM.
    pub fn dram_nodes(&self) -> NodeSet {
        self.numa_nodes
            .iter()
            .filter(|n| n.kind == MemoryKind::Dram)
            .map(|n| n.id)
            .collect()
    }

    /// Each memory-only node as `(node, kind, closest)`: `closest` is the node with CPUs it is
    /// attached to (the nearest by distance, the lower number on a tie). Node order.
    pub fn attached_memory(&self) -> Vec<(u32, MemoryKind, u32)> {
        self.numa_nodes
            .iter()
            .filter(|m| m.is_memory_only())
            .filter_map(|m| {
                let closest = self
                    .numa_nodes
                    .iter()
                    .filter(|n| !n.is_memory_only())
                    .min_by_key(|n| (m.distance_to(n.id).min(n.distance_to(m.id)), n.id))?;
                Some((m.id, m.kind, closest.id))
            })
            .collect()
    }

    /// The names of the PCIe roots local to any of `cpus`, sorted.
    pub fn pcie_roots_of(&self, cpus: &CpuSet) -> Vec<String> {
        self.pcie_roots
            .iter()
            .filter(|r| r.cpus.intersects(cpus))
            .map(|r| r.name.clone())
            .collect()
    }

    /// The largest number of online threads any core has (1 without SMT).
    pub fn threads_per_core(&self) -> usize {
        self.cores
            .iter()
            .map(|c| c.threads.len())
            .max()
            .unwrap_or(1)
    }
}

/// A page size as Kubernetes names it in resource names (`2Mi`, `1Gi`, `64Ki`).
pub fn page_size_name(bytes: u64) -> String {
    for (shift, unit) in [(40, "Ti"), (30, "Gi"), (20, "Mi"), (10, "Ki")] {
        if bytes >= 1 << shift && bytes.is_multiple_of(1 << shift) {
            return format!("{}{unit}", bytes >> shift);
        }
    }
    bytes.to_string()
}

/// A short human summary: one line per package and per NUMA node.
impl fmt::Display for Topology {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{} packages, {} dies, {} numa nodes, {} l3 groups, {} cores, {} threads per core",
            self.packages.len(),
            self.dies.len(),
            self.numa_nodes.len(),
            self.l3_groups.len(),
            self.cores.len(),
            self.threads_per_core()
        )?;
        writeln!(
            f,
            "online cpus {:?}, offline {:?}, isolated {:?}",
            self.online.to_string(),
            self.offline.to_string(),
            self.isolated.to_string()
        )?;
        for p in &self.packages {
            writeln!(f, "package {}: cpus {}", p.id, p.cpus)?;
        }
        for n in &self.numa_nodes {
            let distances: Vec<String> = n.distances.values().map(u32::to_string).collect();
            write!(
                f,
                "numa{}: {} cpus {:?}, {} MiB {}, distances {}",
                n.id,
                n.cpus.len(),
                n.cpus.to_string(),
                n.memory_bytes >> 20,
                n.kind.as_str(),
                distances.join(" ")
            )?;
            for (size, pages) in &n.hugepages {
                write!(f, ", {pages} hugepages of {}", page_size_name(*size))?;
            }
            writeln!(f)?;
        }
        for r in &self.pcie_roots {
            let node = r
                .numa_node
                .map_or_else(String::new, |n| format!(", numa{n}"));
            writeln!(
                f,
                "pcie root {}: cpus {:?}{node}",
                r.name,
                r.cpus.to_string()
            )?;
        }
        Ok(())
    }
}
