//! What hwloc does not report, read from sysfs under a configurable root: isolated and online CPUs.
//!
//! The root is a parameter (`/sys` on a live node, a host mount when the agent runs in a
//! container, a temporary directory in tests). Files are read relative to it:
//! `devices/system/cpu/isolated` and `devices/system/cpu/online`, both in the kernel's list
//! format. A missing file means "nothing isolated" and "no restriction" respectively, as on
//! kernels that do not have them.

use std::{
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
