//! The kernel's view of the machine and of a container: online and isolated CPUs, NUMA nodes,
//! and for a process its cgroup's `cpuset.cpus`/`cpuset.mems` and the `Cpus_allowed_list`/
//! `Mems_allowed_list` the scheduler enforces (`/proc/<pid>/status`). This is what the e2e
//! checks: not what the agent says it did, not what the runtime says it applied.

use std::{collections::BTreeMap, fs, path::PathBuf};

use anyhow::{Context as _, bail};
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

/// Where the cpuset controller's hierarchy is mounted and whether it is cgroup v2.
pub fn cpuset_mount() -> anyhow::Result<(PathBuf, bool)> {
    let mounts = read("/proc/self/mounts")?;
    for line in mounts.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 4 {
            continue;
        }
        if f[2] == "cgroup" && f[3].split(',').any(|o| o == "cpuset") {
            return Ok((PathBuf::from(f[1]), false));
        }
    }
    for line in mounts.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() >= 3 && f[2] == "cgroup2" {
            let controllers = fs::read_to_string(PathBuf::from(f[1]).join("cgroup.controllers"))
                .unwrap_or_default();
            if controllers.split_whitespace().any(|c| c == "cpuset") {
                return Ok((PathBuf::from(f[1]), true));
            }
        }
    }
    bail!(
        "no cgroup hierarchy has the cpuset controller (neither a v1 cpuset mount nor cgroup2 with cpuset)"
    )
}

/// The cgroup directory of `pid` for the v1 controller `controller` (or the v2 one).
pub fn cgroup_dir(pid: u32, controller: &str) -> anyhow::Result<PathBuf> {
    let (mount, v2) = if controller == "cpuset" {
        cpuset_mount()?
    } else {
        let mounts = read("/proc/self/mounts")?;
        let v1 = mounts.lines().find_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            (f.len() >= 4 && f[2] == "cgroup" && f[3].split(',').any(|o| o == controller))
                .then(|| PathBuf::from(f[1]))
        });
        match v1 {
            Some(m) => (m, false),
            None => (cpuset_mount()?.0, true),
        }
    };
    let cgroups = read(&format!("/proc/{pid}/cgroup"))?;
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
            return Ok(mount.join(path.trim_start_matches('/')));
        }
    }
    bail!("process {pid} is in no {controller} cgroup: {cgroups}")
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
pub fn cgroup_value(pid: u32, controller: &str, name: &str) -> anyhow::Result<String> {
    let path = cgroup_dir(pid, controller)?.join(name);
    fs::read_to_string(&path)
        .map(|s| s.trim().to_owned())
        .with_context(|| format!("reading {}", path.display()))
}
