//! The simulated machine's CPUs and memory going offline and coming back (the `offline` and
//! `online` steps), and what the agent publishes about it: the sysfs files the agent's own
//! health monitor reads (`devices/system/cpu/online`, `devices/system/node/has_memory`, in a
//! directory of the simulation's), the faults it finds, and the taints the agent puts on the
//! devices ([`resmgr::taints`]), as `resmgr run` does.

use std::{
    path::PathBuf,
    sync::{Arc, Mutex},
    time::{Duration, SystemTime},
};

use anyhow::Context as _;
use policy::{CpuSet, Device, NodeSet, Topology};
use resmgr::{
    Published,
    health::{DeviceFaults, HealthConfig, HealthMonitor},
    taints::Taints,
};
use tokio::sync::watch;

/// The machine's online CPUs and memory, and the agent's view of its devices' health.
pub(crate) struct Hardware {
    sysfs: PathBuf,
    /// The CPUs online when the simulation started.
    cpus: CpuSet,
    /// The NUMA nodes with memory when the simulation started.
    memory_nodes: NodeSet,
    offline: CpuSet,
    memoryless: NodeSet,
    monitor: HealthMonitor,
    faults: watch::Receiver<DeviceFaults>,
    /// What the monitor reads the devices from.
    published: Arc<Mutex<Arc<Published>>>,
    taints: Taints,
    /// A clock that moves one second per check, so reports never depend on the time.
    checks: u64,
}

impl Hardware {
    /// Every CPU of `topology` online and every node with memory keeping it, written under
    /// `sysfs`; the devices as `published` says.
    pub(crate) fn new(
        sysfs: PathBuf,
        topology: &Topology,
        driver: &str,
        node: &str,
        published: Arc<Published>,
    ) -> anyhow::Result<Self> {
        let memory_nodes: NodeSet = topology
            .numa_nodes
            .iter()
            .filter(|n| n.memory_bytes > 0)
            .map(|n| n.id)
            .collect();
        let published = Arc::new(Mutex::new(published));
        let cpus_of = published.clone();
        let nodes_of = published.clone();
        let monitor = HealthMonitor::new(
            HealthConfig {
                sysfs_root: Some(sysfs.clone()),
                ..HealthConfig::new(node)
            },
            move || (*stdx::sync::lock(&cpus_of).device_cpus).clone(),
        )
        .with_device_nodes(move || crate::run::publish::device_nodes(&stdx::sync::lock(&nodes_of)));
        let faults = monitor.faults();
        let mut hardware = Self {
            sysfs,
            cpus: topology.online.clone(),
            memory_nodes,
            offline: CpuSet::new(),
            memoryless: NodeSet::new(),
            monitor,
            faults,
            published,
            taints: Taints::new(driver),
            checks: 0,
        };
        hardware.write()?;
        hardware.check();
        Ok(hardware)
    }

    /// Takes `cpus` and the memory of `nodes` offline, or brings them back; refuses CPUs or
    /// nodes the machine does not have.
    pub(crate) fn set(
        &mut self,
        online: bool,
        cpus: &CpuSet,
        nodes: &NodeSet,
    ) -> Result<(), String> {
        let unknown = cpus.difference(&self.cpus);
        if !unknown.is_empty() {
            return Err(format!(
                "cpus {unknown} are not cpus of this machine (online at start: {})",
                self.cpus
            ));
        }
        let no_memory = nodes.difference(&self.memory_nodes);
        if !no_memory.is_empty() {
            return Err(format!(
                "numa nodes {no_memory} have no memory on this machine (nodes with memory: {})",
                self.memory_nodes
            ));
        }
        if online {
            self.offline = self.offline.difference(cpus);
            self.memoryless = self.memoryless.difference(nodes);
        } else {
            self.offline = self.offline.union(cpus);
            self.memoryless = self.memoryless.union(nodes);
        }
        self.write().map_err(|e| format!("{e:#}"))
    }

    /// The devices `published` holds, with the taints the agent would publish on them now.
    pub(crate) fn devices(&mut self, published: Arc<Published>) -> Vec<Device> {
        *stdx::sync::lock(&self.published) = published.clone();
        self.check();
        let faults = self.faults.borrow().clone();
        let devices = published.devices_to_show().unwrap_or_default();
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(self.checks);
        self.taints.apply(devices, &faults, now)
    }

    /// What is wrong with each published device, as of the last check.
    pub(crate) fn faults(&self) -> DeviceFaults {
        self.faults.borrow().clone()
    }

    fn check(&mut self) {
        self.checks += 1;
        self.monitor
            .check(SystemTime::UNIX_EPOCH + Duration::from_secs(self.checks));
    }

    fn write(&self) -> anyhow::Result<()> {
        let cpu = self.sysfs.join("devices/system/cpu");
        let node = self.sysfs.join("devices/system/node");
        for dir in [&cpu, &node] {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        let online = self.cpus.difference(&self.offline);
        let memory = self.memory_nodes.difference(&self.memoryless);
        std::fs::write(cpu.join("online"), format!("{online}\n"))
            .with_context(|| format!("writing {}", cpu.join("online").display()))?;
        std::fs::write(node.join("has_memory"), format!("{memory}\n"))
            .with_context(|| format!("writing {}", node.join("has_memory").display()))?;
        Ok(())
    }
}
