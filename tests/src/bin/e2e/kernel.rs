//! The kernel's view of the machine and of a container: online and isolated CPUs, NUMA nodes,
//! and for a process its cgroup's `cpuset.cpus`/`cpuset.mems` and the `Cpus_allowed_list`/
//! `Mems_allowed_list` the scheduler enforces (`/proc/<pid>/status`), and its memory limit and
//! hugetlb limit ([`memory`]). This is what the e2e checks: not what the agent says it did, not
//! what the runtime says it applied.

use std::{
    collections::BTreeMap,
    fs,
    path::{Path, PathBuf},
};

use anyhow::Context as _;
use policy::{CpuSet, NodeSet};

/// The machine, as sysfs says.
#[derive(Debug, Clone)]
pub struct Machine {
    pub online: CpuSet,
    pub isolated: CpuSet,
    /// NUMA node -> its CPUs (nodes without CPUs are left out).
    pub nodes: BTreeMap<u32, CpuSet>,
}

fn read(path: &str) -> anyhow::Result<String> {
    fs::read_to_string(path)
        .map(|s| s.trim().to_owned())
        .with_context(|| format!("reading {path}"))
}

fn set(text: &str, from: &str) -> anyhow::Result<CpuSet> {
    if text.is_empty() {
        return Ok(CpuSet::new());
    }
    text.parse()
        .map_err(|e| anyhow::anyhow!("{from}: {text:?} is not a cpu list: {e}"))
}

impl Machine {
    pub fn read() -> anyhow::Result<Self> {
        let online = set(
            &read("/sys/devices/system/cpu/online")?,
            "/sys/devices/system/cpu/online",
        )?;
        let isolated = match fs::read_to_string("/sys/devices/system/cpu/isolated") {
            Ok(s) => set(s.trim(), "/sys/devices/system/cpu/isolated")?,
            Err(_) => CpuSet::new(),
        };
        let mut nodes = BTreeMap::new();
        if let Ok(entries) = fs::read_dir("/sys/devices/system/node") {
            for entry in entries.flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                let Some(id) = name
                    .strip_prefix("node")
                    .and_then(|n| n.parse::<u32>().ok())
                else {
                    continue;
                };
                let path = format!("/sys/devices/system/node/{name}/cpulist");
                let cpus = set(&read(&path)?, &path)?.intersection(&online);
                if !cpus.is_empty() {
                    nodes.insert(id, cpus);
                }
            }
        }
        if nodes.is_empty() {
            // No NUMA support in the kernel: one node holds everything.
            nodes.insert(0, online.clone());
        }
        Ok(Self {
            online,
            isolated,
            nodes,
        })
    }

    /// The NUMA nodes whose CPUs meet `cpus`: the memory nodes a placement on them pins to.
    pub fn nodes_of(&self, cpus: &CpuSet) -> NodeSet {
        self.nodes
            .iter()
            .filter(|(_, c)| c.intersects(cpus))
            .map(|(id, _)| *id)
            .collect()
    }
}

/// A process's CPUs and memory nodes, from its cgroup and from the scheduler.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct View {
    /// The cgroup `cpuset.cpus` holds.
    pub cgroup_cpus: CpuSet,
    pub cgroup_mems: NodeSet,
    /// `Cpus_allowed_list` of `/proc/<pid>/status`.
    pub allowed_cpus: CpuSet,
    pub allowed_mems: NodeSet,
    /// The cgroup directory of the cpuset controller.
    pub cgroup: PathBuf,
}

/// What reading the kernel's view failed on; each names the file or the controller.
#[derive(Debug)]
pub enum KernelError {
    /// A file could not be read.
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    /// A file holds something else than its kind of value.
    Parse {
        path: PathBuf,
        text: String,
        expected: &'static str,
    },
    /// No mounted cgroup hierarchy has the controller.
    NoHierarchy { controller: String },
    /// The process is in no cgroup of the controller's hierarchy.
    NoCgroup { pid: u32, controller: String },
}

impl std::fmt::Display for KernelError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Read { path, source } => write!(f, "reading {}: {source}", path.display()),
            Self::Parse {
                path,
                text,
                expected,
            } => write!(f, "{}: {text:?} is not {expected}", path.display()),
            Self::NoHierarchy { controller } => write!(
                f,
                "no cgroup hierarchy has the {controller} controller (neither a v1 mount of it nor cgroup2 offering it)"
            ),
            Self::NoCgroup { pid, controller } => {
                write!(f, "process {pid} is in no {controller} cgroup")
            }
        }
    }
}

impl std::error::Error for KernelError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Read { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// A file's content, trimmed.
fn read_file(path: &Path) -> Result<String, KernelError> {
    fs::read_to_string(path)
        .map(|s| s.trim().to_owned())
        .map_err(|source| KernelError::Read {
            path: path.to_owned(),
            source,
        })
}

/// Where the hierarchy of `controller` is mounted and whether it is cgroup v2: a v1 mount
/// with the controller in its options, else a cgroup2 mount whose root offers it.
pub fn hierarchy(controller: &str) -> Result<(PathBuf, bool), KernelError> {
    let mounts = read_file(Path::new("/proc/self/mounts"))?;
    hierarchy_in(&mounts, controller, |p| fs::read_to_string(p).ok())
}

fn hierarchy_in(
    mounts: &str,
    controller: &str,
    read: impl Fn(&Path) -> Option<String>,
) -> Result<(PathBuf, bool), KernelError> {
    let fields = || {
        mounts
            .lines()
            .map(|l| l.split_whitespace().collect::<Vec<_>>())
    };
    if let Some(f) = fields()
        .find(|f| f.len() >= 4 && f[2] == "cgroup" && f[3].split(',').any(|o| o == controller))
    {
        return Ok((PathBuf::from(f[1]), false));
    }
    fields()
        .filter(|f| f.len() >= 3 && f[2] == "cgroup2")
        .find(|f| {
            read(&Path::new(f[1]).join("cgroup.controllers"))
                .is_some_and(|c| c.split_whitespace().any(|c| c == controller))
        })
        .map(|f| (PathBuf::from(f[1]), true))
        .ok_or_else(|| KernelError::NoHierarchy {
            controller: controller.to_owned(),
        })
}

/// Where the cpuset controller's hierarchy is mounted and whether it is cgroup v2.
pub fn cpuset_mount() -> Result<(PathBuf, bool), KernelError> {
    hierarchy("cpuset")
}

/// The cgroup directory of `pid` for `controller` (v1 or v2), and whether it is v2.
pub fn cgroup_of(pid: u32, controller: &str) -> Result<(PathBuf, bool), KernelError> {
    let (mount, v2) = hierarchy(controller)?;
    let cgroups = read_file(Path::new(&format!("/proc/{pid}/cgroup")))?;
    for line in cgroups.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, list, path) = (parts.next(), parts.next(), parts.next());
        let (Some(list), Some(path)) = (list, path) else {
            continue;
        };
        let matches = if v2 {
            list.is_empty()
        } else {
            list.split(',').any(|c| c == controller)
        };
        if matches {
            return Ok((mount.join(path.trim_start_matches('/')), v2));
        }
    }
    Err(KernelError::NoCgroup {
        pid,
        controller: controller.to_owned(),
    })
}

/// The cgroup directory of `pid` for the v1 controller `controller` (or the v2 one).
pub fn cgroup_dir(pid: u32, controller: &str) -> Result<PathBuf, KernelError> {
    cgroup_of(pid, controller).map(|(dir, _)| dir)
}

/// A container's memory as its cgroups hold it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Memory {
    /// `cpuset.mems` (v2: `cpuset.mems.effective` when it sets none of its own).
    pub mems: NodeSet,
    /// `memory.limit_in_bytes` (v2 `memory.max`); `None` when unlimited.
    pub limit: Option<u64>,
    /// `hugetlb.<size>.limit_in_bytes` (v2 `hugetlb.<size>.max`) of the page size asked for;
    /// `None` when unlimited or not asked for.
    pub hugetlb: Option<u64>,
    /// The files read, for the report.
    pub files: Vec<PathBuf>,
}

/// A limit as a cgroup file says it: bytes, `None` for no limit (v2's `max`, v1's page
/// counter maximum).
fn limit(path: &Path, text: &str) -> Result<Option<u64>, KernelError> {
    if text == "max" {
        return Ok(None);
    }
    let bytes: u64 = text.parse().map_err(|_| KernelError::Parse {
        path: path.to_owned(),
        text: text.to_owned(),
        expected: "a limit in bytes",
    })?;
    // v1 writes "no limit" as the page counter's maximum (PAGE_COUNTER_MAX pages), which
    // depends on the page size: anything past 2^62 bytes is it.
    Ok((bytes < 1 << 62).then_some(bytes))
}

/// The memory nodes, memory limit and, when `page` is given, hugetlb limit of that page size
/// (`2MB`, as the kernel names it) of `pid`'s cgroups.
pub fn memory(pid: u32, page: Option<&str>) -> Result<Memory, KernelError> {
    let mut files = Vec::new();
    let mut read = |dir: &Path, name: &str| {
        let path = dir.join(name);
        let text = read_file(&path);
        files.push(path.clone());
        text.map(|t| (path, t))
    };
    let (cpuset, v2) = cgroup_of(pid, "cpuset")?;
    let (path, mut text) = read(&cpuset, "cpuset.mems")?;
    if v2 && text.is_empty() {
        text = read(&cpuset, "cpuset.mems.effective")?.1;
    }
    let mems = if text.is_empty() {
        NodeSet::default()
    } else {
        text.parse().map_err(|_| KernelError::Parse {
            path,
            text: text.clone(),
            expected: "a node list",
        })?
    };
    let (dir, v2) = cgroup_of(pid, "memory")?;
    let (path, text) = read(
        &dir,
        if v2 {
            "memory.max"
        } else {
            "memory.limit_in_bytes"
        },
    )?;
    let memory_limit = limit(&path, &text)?;
    let hugetlb = match page {
        None => None,
        Some(page) => {
            let (dir, v2) = cgroup_of(pid, "hugetlb")?;
            let name = if v2 {
                format!("hugetlb.{page}.max")
            } else {
                format!("hugetlb.{page}.limit_in_bytes")
            };
            let (path, text) = read(&dir, &name)?;
            limit(&path, &text)?
        }
    };
    Ok(Memory {
        mems,
        limit: memory_limit,
        hugetlb,
        files,
    })
}

/// What the kernel says `pid` may run on.
pub fn view(pid: u32) -> anyhow::Result<View> {
    let cgroup = cgroup_dir(pid, "cpuset")?;
    let file = |name: &str| {
        let path = cgroup.join(name);
        fs::read_to_string(&path)
            .map(|s| s.trim().to_owned())
            .with_context(|| format!("reading {}", path.display()))
    };
    let status = read(&format!("/proc/{pid}/status"))?;
    let field = |name: &str| -> anyhow::Result<String> {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name).map(|v| v.trim().to_owned()))
            .with_context(|| format!("/proc/{pid}/status has no {name}"))
    };
    let nodes = |text: String, from: &str| -> anyhow::Result<NodeSet> {
        if text.is_empty() {
            return Ok(NodeSet::default());
        }
        text.parse()
            .map_err(|e| anyhow::anyhow!("{from}: {text:?} is not a node list: {e}"))
    };
    Ok(View {
        cgroup_cpus: set(&file("cpuset.cpus")?, "cpuset.cpus")?,
        cgroup_mems: nodes(file("cpuset.mems")?, "cpuset.mems")?,
        allowed_cpus: set(&field("Cpus_allowed_list:")?, "Cpus_allowed_list")?,
        allowed_mems: nodes(field("Mems_allowed_list:")?, "Mems_allowed_list")?,
        cgroup,
    })
}

/// The environment `pid` was started with.
pub fn environ(pid: u32) -> anyhow::Result<Vec<String>> {
    let path = format!("/proc/{pid}/environ");
    let bytes = fs::read(&path).with_context(|| format!("reading {path}"))?;
    Ok(bytes
        .split(|b| *b == 0)
        .filter(|e| !e.is_empty())
        .map(|e| String::from_utf8_lossy(e).into_owned())
        .collect())
}

/// A value of `pid`'s cgroup file `name` for `controller` (`cpu`, `cpu.shares`).
pub fn cgroup_value(pid: u32, controller: &str, name: &str) -> Result<String, KernelError> {
    read_file(&cgroup_dir(pid, controller)?.join(name))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTS: &str = "cgroup /sys/fs/cgroup/cpuset cgroup rw,relatime,cpuset 0 0\n\
                          cgroup /tmp/rme2e-x/hugetlb cgroup rw,relatime,hugetlb 0 0\n\
                          cgroup2 /sys/fs/cgroup/unified cgroup2 rw,relatime 0 0\n";

    #[test]
    fn a_controller_is_found_on_its_v1_mount_then_on_cgroup2() {
        let none = |_: &Path| None;
        assert_eq!(
            hierarchy_in(MOUNTS, "hugetlb", none).unwrap(),
            (PathBuf::from("/tmp/rme2e-x/hugetlb"), false)
        );
        let offers = |p: &Path| {
            (p == Path::new("/sys/fs/cgroup/unified/cgroup.controllers"))
                .then(|| "memory pids".to_owned())
        };
        assert_eq!(
            hierarchy_in(MOUNTS, "memory", offers).unwrap(),
            (PathBuf::from("/sys/fs/cgroup/unified"), true)
        );
        let err = hierarchy_in(MOUNTS, "memory", none).unwrap_err();
        assert!(matches!(err, KernelError::NoHierarchy { .. }));
        assert!(err.to_string().contains("the memory controller"), "{err}");
    }

    #[test]
    fn limits_read_bytes_and_no_limit_in_both_versions() {
        let path = Path::new("/c/memory.limit_in_bytes");
        assert_eq!(limit(path, "67108864").unwrap(), Some(64 << 20));
        assert_eq!(limit(path, "max").unwrap(), None);
        // v1's "no limit" on 4 KiB pages, and on 64 KiB pages.
        assert_eq!(limit(path, "9223372036854771712").unwrap(), None);
        assert_eq!(limit(path, "9223372036854710272").unwrap(), None);
        let err = limit(path, "lots").unwrap_err();
        assert_eq!(
            err.to_string(),
            "/c/memory.limit_in_bytes: \"lots\" is not a limit in bytes"
        );
    }

    #[test]
    fn a_file_that_cannot_be_read_is_named() {
        let err = read_file(Path::new("/nonexistent/hugetlb.2MB.limit_in_bytes")).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("reading /nonexistent/hugetlb.2MB.limit_in_bytes: "),
            "{err}"
        );
    }
}
