//! What hwloc does not report, read from sysfs under a configurable root: isolated and online
//! CPUs, the NUMA nodes with memory online (`devices/system/node/has_memory`, which device
//! health reads), each NUMA node's hugepages, and the PCIe root complexes with the CPUs local to
//! each.
//!
//! The root is a parameter (`/sys` on a live node, a host mount when the agent runs in a
//! container, a temporary directory in tests). Files are read relative to it:
//! `devices/system/cpu/isolated` and `devices/system/cpu/online`, both in the kernel's list
//! format. A missing file means "nothing isolated" and "no restriction" respectively, as on
//! kernels that do not have them. A node's hugepages are
//! `devices/system/node/node<N>/hugepages/hugepages-<size>kB/nr_hugepages`, one directory per
//! page size the kernel supports; a missing directory means no hugepages (a kernel without
//! them), and a size with no pages kept is left out.
//!
//! PCIe root complexes are the `devices/pci<DDDD>:<BB>` directories (domain and bus in hex, the
//! name Kubernetes' `resource.kubernetes.io/pcieRoot` attribute uses). The CPUs local to one are
//! its root bus's `devices/pci<DDDD>:<BB>/pci_bus/<DDDD>:<BB>/cpulistaffinity` (what
//! `class/pci_bus/<DDDD>:<BB>` links to); its NUMA node is the `numa_node` of the first device
//! on that bus that reports one (`-1`, no affinity, is none: the root itself has no such file).
//! An empty, missing or garbled `cpulistaffinity` is read as "not said" rather than refused: the
//! roots only add an optional attribute to devices, and a kernel quirk there must not stop the
//! agent; [`super::discover`] then takes the node's CPUs, or leaves the root local to none.

use std::{
    collections::BTreeMap,
    io,
    path::{Path, PathBuf},
};

use crate::idset::{CpuSet, IdSetParseError};

/// Why a sysfs file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum SysfsError {
    /// The file exists but could not be read.
    #[error("reading {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The file's content is not a number of pages.
    #[error("parsing {path}: {content:?} is not a number of pages")]
    Pages {
        /// The file.
        path: PathBuf,
        /// What it holds.
        content: String,
    },
    /// The file's content is not a CPU list.
    #[error("parsing {path}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// What was wrong.
        #[source]
        source: IdSetParseError,
    },
}

/// CPU facts from sysfs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CpuFacts {
    /// `isolated`; empty when the file is absent.
    pub isolated: CpuSet,
    /// `online`; `None` when the file is absent.
    pub online: Option<CpuSet>,
}

/// Reads [`CpuFacts`] under `root` (for example `/sys`).
pub fn read_cpu_facts(root: &Path) -> Result<CpuFacts, SysfsError> {
    let dir = root.join("devices/system/cpu");
    Ok(CpuFacts {
        isolated: read_list(&dir.join("isolated"))?.unwrap_or_default(),
        online: read_list(&dir.join("online"))?,
    })
}

/// The NUMA nodes that have memory online (`devices/system/node/has_memory`) under `root`;
/// `None` when the file is absent (a kernel without NUMA support).
pub fn read_memory_nodes(root: &Path) -> Result<Option<crate::idset::NodeSet>, SysfsError> {
    read_list(&root.join("devices/system/node/has_memory"))
}

/// Node `node`'s hugepages under `root`: page size in bytes -> pages kept (`nr_hugepages`), for
/// the sizes with at least one page.
pub fn read_hugepages(root: &Path, node: u32) -> Result<BTreeMap<u64, u64>, SysfsError> {
    let dir = root.join(format!("devices/system/node/node{node}/hugepages"));
    let entries = match std::fs::read_dir(&dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(BTreeMap::new()),
        Err(source) => return Err(SysfsError::Read { path: dir, source }),
    };
    let mut out = BTreeMap::new();
    for entry in entries {
        let entry = entry.map_err(|source| SysfsError::Read {
            path: dir.clone(),
            source,
        })?;
        let name = entry.file_name();
        // `hugepages-2048kB`; anything else is not a page size directory.
        let Some(kib) = name
            .to_str()
            .and_then(|n| n.strip_prefix("hugepages-"))
            .and_then(|n| n.strip_suffix("kB"))
            .and_then(|n| n.parse::<u64>().ok())
        else {
            continue;
        };
        let path = entry.path().join("nr_hugepages");
        let content = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(source) => return Err(SysfsError::Read { path, source }),
        };
        let pages: u64 = content.trim().parse().map_err(|_| SysfsError::Pages {
            path: path.clone(),
            content: content.trim().to_owned(),
        })?;
        if pages > 0 {
            out.insert(kib.saturating_mul(1024), pages);
        }
    }
    Ok(out)
}

/// A PCIe root as sysfs says it: the CPUs of its `cpulistaffinity` (`None` when the file is
/// missing, empty or garbled) and its NUMA node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawPcieRoot {
    /// `pci<DDDD>:<BB>`.
    pub name: String,
    /// `cpulistaffinity`, when it names CPUs.
    pub affinity: Option<CpuSet>,
    /// The first non-negative `numa_node` of a device on its root bus.
    pub numa_node: Option<u32>,
}

/// The PCIe root complexes under `root` (see the module docs), by name; none when `devices`
/// is missing.
pub fn read_pcie_roots(root: &Path) -> Result<Vec<RawPcieRoot>, SysfsError> {
    let dir = root.join("devices");
    let mut names: Vec<String> = match std::fs::read_dir(&dir) {
        Ok(entries) => entries
            .filter_map(Result::ok)
            .filter_map(|e| e.file_name().to_str().map(str::to_owned))
            .filter(|name| root_bus(name).is_some())
            .collect(),
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => return Err(SysfsError::Read { path: dir, source }),
    };
    names.sort();
    names
        .into_iter()
        .map(|name| {
            let bus = root_bus(&name).unwrap_or_default().to_owned();
            let root_dir = dir.join(&name);
            let affinity_path = root_dir.join("pci_bus").join(&bus).join("cpulistaffinity");
            let affinity = match std::fs::read_to_string(&affinity_path) {
                Ok(text) => text
                    .trim()
                    .parse::<CpuSet>()
                    .ok()
                    .filter(|cpus| !cpus.is_empty()),
                Err(e) if e.kind() == io::ErrorKind::NotFound => None,
                Err(source) => {
                    return Err(SysfsError::Read {
                        path: affinity_path,
                        source,
                    });
                }
            };
            let numa_node = root_numa_node(&root_dir, &bus)?;
            Ok(RawPcieRoot {
                name,
                affinity,
                numa_node,
            })
        })
        .collect()
}

/// `DDDD:BB` of a root complex directory named `pci<DDDD>:<BB>` (lower-case hex).
fn root_bus(name: &str) -> Option<&str> {
    let bus = name.strip_prefix("pci")?;
    let (domain, number) = bus.split_once(':')?;
    let hex = |s: &str, len| {
        s.len() == len
            && s.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    };
    (hex(domain, 4) && hex(number, 2)).then_some(bus)
}

/// The first non-negative `numa_node` of the devices `<bus>:DD.F` directly below a root.
fn root_numa_node(root_dir: &Path, bus: &str) -> Result<Option<u32>, SysfsError> {
    let entries = match std::fs::read_dir(root_dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(SysfsError::Read {
                path: root_dir.to_owned(),
                source,
            });
        }
    };
    let prefix = format!("{bus}:");
    let mut devices: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .filter(|e| {
            e.file_name()
                .to_str()
                .is_some_and(|n| n.starts_with(&prefix))
        })
        .map(|e| e.path().join("numa_node"))
        .collect();
    devices.sort();
    for path in devices {
        match std::fs::read_to_string(&path) {
            Ok(text) => {
                if let Ok(node) = text.trim().parse::<u32>() {
                    return Ok(Some(node));
                }
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(source) => return Err(SysfsError::Read { path, source }),
        }
    }
    Ok(None)
}

fn read_list(path: &Path) -> Result<Option<CpuSet>, SysfsError> {
    match std::fs::read_to_string(path) {
        Ok(text) => text.parse().map(Some).map_err(|source| SysfsError::Parse {
            path: path.to_owned(),
            source,
        }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(SysfsError::Read {
            path: path.to_owned(),
            source,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(root: &Path, name: &str, content: &str) {
        let dir = root.join("devices/system/cpu");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(name), content).unwrap();
    }

    #[test]
    fn reads_isolated_and_online_lists() {
        let root = tempfile::tempdir().unwrap();
        write(root.path(), "isolated", "2-3\n");
        write(root.path(), "online", "0-5,7\n");
        let facts = read_cpu_facts(root.path()).unwrap();
        assert_eq!(facts.isolated.to_string(), "2-3");
        assert_eq!(facts.online.unwrap().to_string(), "0-5,7");
    }

    #[test]
    fn missing_files_mean_nothing_isolated_and_no_restriction() {
        let root = tempfile::tempdir().unwrap();
        let facts = read_cpu_facts(root.path()).unwrap();
        assert_eq!(facts, CpuFacts::default());
    }

    fn hugepages(root: &Path, node: u32, kib: u64, content: &str) {
        let dir = root.join(format!(
            "devices/system/node/node{node}/hugepages/hugepages-{kib}kB"
        ));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("nr_hugepages"), content).unwrap();
    }

    #[test]
    fn reads_each_nodes_hugepages_by_page_size() {
        let root = tempfile::tempdir().unwrap();
        hugepages(root.path(), 1, 2048, "512\n");
        hugepages(root.path(), 1, 1_048_576, "4\n");
        hugepages(root.path(), 1, 64, "0\n");
        let got = read_hugepages(root.path(), 1).unwrap();
        assert_eq!(
            got,
            BTreeMap::from([(2 << 20, 512), (1 << 30, 4)]),
            "sizes without pages are left out"
        );
        assert!(read_hugepages(root.path(), 0).unwrap().is_empty());
        hugepages(root.path(), 0, 2048, "many\n");
        let err = read_hugepages(root.path(), 0).unwrap_err();
        assert!(
            err.to_string()
                .contains("hugepages-2048kB/nr_hugepages: \"many\" is not a number of pages"),
            "{err}"
        );
    }

    /// A root complex `pci<bus>` whose root bus says `affinity` (no file when `None`), with a
    /// device on it reporting `numa` (no device when `None`).
    fn pcie_root(root: &Path, bus: &str, affinity: Option<&str>, numa: Option<&str>) {
        let dir = root.join(format!("devices/pci{bus}"));
        let bus_dir = dir.join(format!("pci_bus/{bus}"));
        std::fs::create_dir_all(&bus_dir).unwrap();
        if let Some(affinity) = affinity {
            std::fs::write(bus_dir.join("cpulistaffinity"), affinity).unwrap();
        }
        if let Some(numa) = numa {
            let device = dir.join(format!("{bus}:00.0"));
            std::fs::create_dir_all(&device).unwrap();
            std::fs::write(device.join("numa_node"), numa).unwrap();
        }
    }

    #[test]
    fn reads_pcie_roots_with_their_affinity_and_numa_node() {
        let root = tempfile::tempdir().unwrap();
        pcie_root(root.path(), "0000:00", Some("0-3\n"), Some("0\n"));
        pcie_root(root.path(), "0000:80", Some("\n"), Some("1\n"));
        pcie_root(root.path(), "0001:00", Some("garbled\n"), None);
        pcie_root(root.path(), "0000:40", Some("4-7\n"), Some("-1\n"));
        // Not root complexes.
        std::fs::create_dir_all(root.path().join("devices/platform")).unwrap();
        std::fs::create_dir_all(root.path().join("devices/pci0000:0")).unwrap();
        std::fs::create_dir_all(root.path().join("devices/pciABCD:00")).unwrap();
        let got = read_pcie_roots(root.path()).unwrap();
        let cpus = |s: &str| Some(s.parse::<CpuSet>().unwrap());
        assert_eq!(
            got,
            [
                RawPcieRoot {
                    name: "pci0000:00".into(),
                    affinity: cpus("0-3"),
                    numa_node: Some(0)
                },
                RawPcieRoot {
                    name: "pci0000:40".into(),
                    affinity: cpus("4-7"),
                    numa_node: None
                },
                RawPcieRoot {
                    name: "pci0000:80".into(),
                    affinity: None,
                    numa_node: Some(1)
                },
                RawPcieRoot {
                    name: "pci0001:00".into(),
                    affinity: None,
                    numa_node: None
                },
            ]
        );
        assert!(
            read_pcie_roots(&root.path().join("absent"))
                .unwrap()
                .is_empty()
        );
    }

    #[test]
    fn a_garbled_file_is_an_error_naming_it() {
        let root = tempfile::tempdir().unwrap();
        write(root.path(), "isolated", "2-x\n");
        let err = read_cpu_facts(root.path()).unwrap_err();
        assert!(matches!(err, SysfsError::Parse { .. }));
        assert!(
            err.to_string().ends_with("devices/system/cpu/isolated"),
            "{err}"
        );
    }
}
