//! What hwloc does not report, read from sysfs under a configurable root: isolated and online
//! CPUs, and each NUMA node's hugepages.
//!
//! The root is a parameter (`/sys` on a live node, a host mount when the agent runs in a
//! container, a temporary directory in tests). Files are read relative to it:
//! `devices/system/cpu/isolated` and `devices/system/cpu/online`, both in the kernel's list
//! format. A missing file means "nothing isolated" and "no restriction" respectively, as on
//! kernels that do not have them. A node's hugepages are
//! `devices/system/node/node<N>/hugepages/hugepages-<size>kB/nr_hugepages`, one directory per
//! page size the kernel supports; a missing directory means no hugepages (a kernel without
//! them), and a size with no pages kept is left out.

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
