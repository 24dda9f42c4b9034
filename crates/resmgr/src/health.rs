//! The health of our published devices, for the kubelet's resource health stream and for the
//! taints on them ([`crate::taints`]).
//!
//! A device is a set of CPUs ([`policy::Policy::device_cpus`]) on a NUMA node (its
//! `resource.kubernetes.io/numaNode`, [`HealthMonitor::with_device_nodes`]). Every poll interval
//! the monitor reads the kernel's online CPUs (`devices/system/cpu/online` under an injectable
//! sysfs root, through the policy's one sysfs reader) and the NUMA nodes with memory online
//! (`devices/system/node/has_memory`), and the devices the policy publishes, and reports:
//!
//! | device | health | message |
//! |---|---|---|
//! | published, every CPU behind it online, its node's memory online | Healthy | — |
//! | published, some CPU behind it offline | Unhealthy | `cpus 3,5 are offline` |
//! | published, its node had memory at start and has none online now | Unhealthy | `numa node 1 has no memory online` |
//! | published earlier in this run, not any more | Unhealthy | its CPUs left the published set |
//! | any, while the online CPUs or memory nodes cannot be read | Unknown | why |
//!
//! What is wrong with each published device is also a [`DeviceFault`], which the agent turns
//! into a taint on the device's slice entry, so that the scheduler places no new claim there.
//!
//! A device the policy stops publishing stays in the reports, because the kubelet keeps the
//! claims already prepared on it and shows their health from our reports. Without a sysfs root
//! (a synthetic or XML topology, which is not this machine) every CPU counts as online.
//!
//! The report goes into a `watch` channel that `kubelet_plugin` streams to the kubelet. A
//! change of any device's health wakes the streams; a poll that changes nothing only refreshes
//! the check time, which the streams' own repeats carry (see `kubelet_plugin`'s health module).

use std::{
    collections::BTreeMap,
    path::PathBuf,
    sync::Arc,
    time::{Duration, SystemTime},
};

use kubelet_plugin::{DeviceHealth, Health, HealthReport};
use policy::{CpuSet, NodeSet, topology::sysfs};
use stdx::errors;
use tokio::sync::{Notify, watch};
use tracing::{info, warn};

/// Where and how often the monitor looks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthConfig {
    /// The pool our devices are published in (the node's name).
    pub pool: String,
    /// The sysfs root (`/sys`), or `None` when the topology is not this machine's.
    pub sysfs_root: Option<PathBuf>,
    /// How often the devices are checked.
    pub poll: Duration,
}

impl HealthConfig {
    /// How often devices are checked unless configured otherwise: a CPU taken offline shows
    /// at the kubelet within this long.
    pub const DEFAULT_POLL: Duration = Duration::from_secs(5);

    /// `/sys`, checked every [`Self::DEFAULT_POLL`].
    pub fn new(pool: impl Into<String>) -> Self {
        Self {
            pool: pool.into(),
            sysfs_root: Some(PathBuf::from("/sys")),
            poll: Self::DEFAULT_POLL,
        }
    }

    /// How long a report holds at the kubelet: three polls, and never less than the
    /// kubelet's own default, so that a poll running late does not turn devices Unknown.
    fn valid_for(&self) -> Duration {
        (self.poll * 3).max(HealthReport::KUBELET_DEFAULT_TIMEOUT)
    }
}

/// The devices' CPUs as the policy publishes them now.
pub type DeviceCpus = Box<dyn Fn() -> BTreeMap<String, CpuSet> + Send + Sync>;

/// The NUMA node of each published device that has one.
pub type DeviceNodes = Box<dyn Fn() -> BTreeMap<String, u32> + Send + Sync>;

/// What is wrong with a published device: the CPUs behind it that are offline, and its node
/// when that node's memory went offline. Empty when nothing is.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeviceFault {
    /// CPUs behind the device that the kernel has offline.
    pub offline_cpus: CpuSet,
    /// The device's NUMA node, when it had memory at start and has none online now.
    pub memoryless_nodes: NodeSet,
}

impl DeviceFault {
    /// Whether nothing is wrong.
    pub fn is_empty(&self) -> bool {
        self.offline_cpus.is_empty() && self.memoryless_nodes.is_empty()
    }

    /// In words: `cpus 5-6 are offline; numa node 1 has no memory online`.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        match self.offline_cpus.len() {
            0 => {}
            1 => parts.push(format!("cpu {} is offline", self.offline_cpus)),
            _ => parts.push(format!("cpus {} are offline", self.offline_cpus)),
        }
        match self.memoryless_nodes.len() {
            0 => {}
            1 => parts.push(format!(
                "numa node {} has no memory online",
                self.memoryless_nodes
            )),
            _ => parts.push(format!(
                "numa nodes {} have no memory online",
                self.memoryless_nodes
            )),
        }
        parts.join("; ")
    }
}

/// What is wrong with each published device, by name; devices with nothing wrong are left out.
pub type DeviceFaults = BTreeMap<String, DeviceFault>;

/// Checks the devices' health; see the module docs.
pub struct HealthMonitor {
    config: HealthConfig,
    devices: DeviceCpus,
    nodes: Option<DeviceNodes>,
    /// Asks for a check now, before the next poll ([`Self::refresh_on`]).
    refresh: Option<Arc<Notify>>,
    /// Every device published in this run, with the CPUs last seen behind it.
    seen: BTreeMap<String, CpuSet>,
    /// What is wrong with the published devices, as of the last check.
    faults: watch::Sender<DeviceFaults>,
    /// The NUMA nodes with memory online at the first check (when the agent started, as the
    /// topology it discovered then): a device on one of them is faulty while its memory is
    /// offline. A node without memory at start was never promised any.
    had_memory: Option<NodeSet>,
}

impl std::fmt::Debug for HealthMonitor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HealthMonitor")
            .field("config", &self.config)
            .field("seen", &self.seen)
            .finish_non_exhaustive()
    }
}

impl HealthMonitor {
    /// A monitor of the devices `devices` returns.
    pub fn new(
        config: HealthConfig,
        devices: impl Fn() -> BTreeMap<String, CpuSet> + Send + Sync + 'static,
    ) -> Self {
        Self {
            config,
            devices: Box::new(devices),
            nodes: None,
            refresh: None,
            seen: BTreeMap::new(),
            faults: watch::Sender::new(DeviceFaults::new()),
            had_memory: None,
        }
    }

    /// Checks the memory of each device's NUMA node too, as `nodes` says them (devices without
    /// a node have none checked).
    #[must_use]
    pub fn with_device_nodes(
        mut self,
        nodes: impl Fn() -> BTreeMap<String, u32> + Send + Sync + 'static,
    ) -> Self {
        self.nodes = Some(Box::new(nodes));
        self
    }

    /// What is wrong with the published devices, updated by every check that changes it.
    pub fn faults(&self) -> watch::Receiver<DeviceFaults> {
        self.faults.subscribe()
    }

    /// Checks again at once whenever `refresh` is notified, besides every poll interval: when
    /// the devices appear (the agent takes the node only after its kubelet plugin, and the
    /// health stream's first report, are up), the kubelet learns of them then, not a poll later.
    #[must_use]
    pub fn refresh_on(mut self, refresh: Arc<Notify>) -> Self {
        self.refresh = Some(refresh);
        self
    }

    /// Checks every device once, as of `now`.
    pub fn check(&mut self, now: SystemTime) -> HealthReport {
        let published = (self.devices)();
        for (name, cpus) in &published {
            self.seen.insert(name.clone(), cpus.clone());
        }
        let nodes = self.nodes.as_ref().map(|f| f()).unwrap_or_default();
        let facts = self
            .online()
            .and_then(|online| Ok((online, self.memory()?)));
        let mut faults = DeviceFaults::new();
        let devices = self
            .seen
            .iter()
            .map(|(name, cpus)| {
                let (health, message) = match (&facts, published.contains_key(name)) {
                    (Err(why), _) => (Health::Unknown, why.clone()),
                    (Ok(_), false) => (
                        Health::Unhealthy,
                        format!("no longer published: cpus {cpus} left the published set"),
                    ),
                    (Ok((online, memory)), true) => {
                        let fault = DeviceFault {
                            offline_cpus: online
                                .as_ref()
                                .map_or_else(CpuSet::new, |online| cpus.difference(online)),
                            memoryless_nodes: match (memory, nodes.get(name)) {
                                (Some((had, memory)), Some(&node))
                                    if had.contains(node) && !memory.contains(node) =>
                                {
                                    std::iter::once(node).collect()
                                }
                                _ => NodeSet::new(),
                            },
                        };
                        if fault.is_empty() {
                            (Health::Healthy, String::new())
                        } else {
                            let message = fault.describe();
                            faults.insert(name.clone(), fault);
                            (Health::Unhealthy, message)
                        }
                    }
                };
                DeviceHealth {
                    pool: self.config.pool.clone(),
                    device: name.clone(),
                    health,
                    message,
                }
            })
            .collect();
        // Unknown (sysfs unreadable) keeps the faults last known: a taint is not dropped on a
        // read that failed.
        if facts.is_ok() {
            self.faults.send_if_modified(|current| {
                let changed = *current != faults;
                *current = faults;
                changed
            });
        }
        HealthReport {
            devices,
            checked_at: now,
            valid_for: self.config.valid_for(),
        }
    }

    /// The online CPUs (`None`: no restriction), or why they cannot be told.
    fn online(&self) -> Result<Option<CpuSet>, String> {
        let Some(root) = &self.config.sysfs_root else {
            return Ok(None);
        };
        sysfs::read_cpu_facts(root)
            .map(|facts| facts.online)
            .map_err(|e| format!("cannot tell which cpus are online: {}", errors::chain(&e)))
    }

    /// The NUMA nodes that had memory at the first check and those that have it now (`None`:
    /// not checked, without sysfs or without NUMA), or why they cannot be told.
    fn memory(&mut self) -> Result<Option<(NodeSet, NodeSet)>, String> {
        let Some(root) = &self.config.sysfs_root else {
            return Ok(None);
        };
        let now = sysfs::read_memory_nodes(root).map_err(|e| {
            format!(
                "cannot tell which numa nodes have memory online: {}",
                errors::chain(&e)
            )
        })?;
        Ok(now.map(|now| {
            let had = self.had_memory.get_or_insert_with(|| now.clone()).clone();
            (had, now)
        }))
    }

    /// Checks now and then every poll interval, in a task of its own, until every receiver is
    /// gone. Returns the receiving end, holding the first report.
    pub fn spawn(self) -> watch::Receiver<HealthReport> {
        let (rx, poll) = self.start();
        tokio::spawn(poll);
        rx
    }

    /// Checks now, and returns the receiving end, holding that report, with the poll that checks
    /// again every poll interval until every receiver is gone, for the caller to run.
    pub fn start(
        mut self,
    ) -> (
        watch::Receiver<HealthReport>,
        impl std::future::Future<Output = ()> + Send + 'static,
    ) {
        let first = self.check(SystemTime::now());
        log_changes(&[], &first.devices);
        let (tx, rx) = watch::channel(first);
        let poll = async move {
            let mut ticks = tokio::time::interval(self.config.poll);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            ticks.tick().await; // the first tick is now: the report above
            let refresh = self.refresh.clone();
            loop {
                tokio::select! {
                    _ = ticks.tick() => {}
                    () = async {
                        match &refresh {
                            Some(refresh) => refresh.notified().await,
                            None => std::future::pending().await,
                        }
                    } => ticks.reset(),
                    () = tx.closed() => return,
                }
                let report = self.check(SystemTime::now());
                tx.send_if_modified(|current| {
                    let changed = current.devices != report.devices;
                    if changed {
                        log_changes(&current.devices, &report.devices);
                    }
                    *current = report;
                    changed
                });
            }
        };
        (rx, poll)
    }
}

/// Logs each device whose health is new or different: a warning for anything but Healthy.
fn log_changes(before: &[DeviceHealth], after: &[DeviceHealth]) {
    for device in after {
        let old = before.iter().find(|d| d.device == device.device);
        if old.is_some_and(|old| old.health == device.health && old.message == device.message) {
            continue;
        }
        match device.health {
            Health::Healthy if old.is_some() => {
                info!(device = %device.device, "device healthy again");
            }
            Health::Healthy => {}
            Health::Unhealthy | Health::Unknown => warn!(
                device = %device.device,
                health = ?device.health,
                reason = %device.message,
                "device not healthy: the kubelet shows it in the status of pods with claims on it"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::{
        path::Path,
        sync::{Arc, Mutex},
    };

    use super::*;

    fn cpus(list: &str) -> CpuSet {
        list.parse().unwrap()
    }

    fn set_online(root: &Path, list: &str) {
        let dir = root.join("devices/system/cpu");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("online"), format!("{list}\n")).unwrap();
    }

    /// A monitor of `devices`, which the test may change, under sysfs root `root`.
    fn monitor(
        root: Option<&Path>,
        devices: &[(&str, &str)],
    ) -> (HealthMonitor, Arc<Mutex<BTreeMap<String, CpuSet>>>) {
        let published: BTreeMap<_, _> = devices
            .iter()
            .map(|(name, list)| ((*name).to_owned(), cpus(list)))
            .collect();
        let published = Arc::new(Mutex::new(published));
        let source = published.clone();
        let config = HealthConfig {
            sysfs_root: root.map(Path::to_owned),
            ..HealthConfig::new("node-a")
        };
        let monitor = HealthMonitor::new(config, move || source.lock().unwrap().clone());
        (monitor, published)
    }

    fn summary(report: &HealthReport) -> Vec<(String, Health, String)> {
        report
            .devices
            .iter()
            .map(|d| {
                assert_eq!(d.pool, "node-a");
                (d.device.clone(), d.health, d.message.clone())
            })
            .collect()
    }

    fn row(device: &str, health: Health, message: &str) -> (String, Health, String) {
        (device.to_owned(), health, message.to_owned())
    }

    #[test]
    fn devices_are_healthy_while_their_cpus_are_online_and_published() {
        let root = tempfile::tempdir().unwrap();
        set_online(root.path(), "0-7");
        let (mut checked, published) =
            monitor(Some(root.path()), &[("numa0", "1-3"), ("numa1", "4-7")]);
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1000);
        let report = checked.check(now);
        assert_eq!(report.checked_at, now);
        assert_eq!(report.valid_for, Duration::from_secs(30));
        assert_eq!(
            summary(&report),
            [
                row("numa0", Health::Healthy, ""),
                row("numa1", Health::Healthy, "")
            ]
        );

        set_online(root.path(), "0-4,7");
        assert_eq!(
            summary(&checked.check(now)),
            [
                row("numa0", Health::Healthy, ""),
                row("numa1", Health::Unhealthy, "cpus 5-6 are offline")
            ]
        );
        set_online(root.path(), "0-5,7");
        assert_eq!(
            summary(&checked.check(now))[1],
            row("numa1", Health::Unhealthy, "cpu 6 is offline")
        );

        published.lock().unwrap().remove("numa0");
        set_online(root.path(), "0-7");
        assert_eq!(
            summary(&checked.check(now)),
            [
                row(
                    "numa0",
                    Health::Unhealthy,
                    "no longer published: cpus 1-3 left the published set"
                ),
                row("numa1", Health::Healthy, "")
            ]
        );
        published
            .lock()
            .unwrap()
            .insert("numa0".into(), cpus("1-3"));
        assert_eq!(
            summary(&checked.check(now))[0],
            row("numa0", Health::Healthy, "")
        );
    }

    #[test]
    fn unreadable_online_cpus_make_every_device_unknown_and_no_sysfs_means_all_online() {
        let root = tempfile::tempdir().unwrap();
        set_online(root.path(), "0-3,garbage");
        let (mut unreadable, _) = monitor(Some(root.path()), &[("cpu1", "1")]);
        let report = unreadable.check(SystemTime::now());
        let (_, health, message) = &summary(&report)[0];
        assert_eq!(*health, Health::Unknown);
        assert!(
            message.contains("cannot tell which cpus are online")
                && message.contains("devices/system/cpu/online"),
            "{message}"
        );

        let (mut synthetic, _) = monitor(None, &[("cpu1", "1")]);
        assert_eq!(
            summary(&synthetic.check(SystemTime::now())),
            [row("cpu1", Health::Healthy, "")]
        );
    }

    fn set_memory(root: &Path, list: &str) {
        let dir = root.join("devices/system/node");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("has_memory"), format!("{list}\n")).unwrap();
    }

    #[test]
    fn a_node_that_lost_its_memory_makes_its_devices_unhealthy_and_faulty() {
        let root = tempfile::tempdir().unwrap();
        set_online(root.path(), "0-7");
        // Node 1 has memory at start; node 0 has none (a memory-less node is no news).
        set_memory(root.path(), "1");
        let (checked, _) = monitor(Some(root.path()), &[("numa0", "1-3"), ("numa1", "4-7")]);
        let mut checked = checked.with_device_nodes(|| {
            BTreeMap::from([("numa0".to_owned(), 0), ("numa1".to_owned(), 1)])
        });
        let faults = checked.faults();
        let now = SystemTime::UNIX_EPOCH;
        assert!(
            summary(&checked.check(now))
                .iter()
                .all(|(_, h, _)| *h == Health::Healthy)
        );
        assert!(faults.borrow().is_empty());

        set_memory(root.path(), "");
        set_online(root.path(), "0-5");
        assert_eq!(
            summary(&checked.check(now)),
            [
                row("numa0", Health::Healthy, ""),
                row(
                    "numa1",
                    Health::Unhealthy,
                    "cpus 6-7 are offline; numa node 1 has no memory online"
                )
            ]
        );
        assert_eq!(
            *faults.borrow(),
            DeviceFaults::from([(
                "numa1".to_owned(),
                DeviceFault {
                    offline_cpus: cpus("6-7"),
                    memoryless_nodes: "1".parse().unwrap(),
                }
            )])
        );
        // A read that fails keeps the faults last known.
        set_memory(root.path(), "garbage");
        let (_, health, message) = summary(&checked.check(now))[1].clone();
        assert_eq!(health, Health::Unknown);
        assert!(message.contains("has_memory"), "{message}");
        assert_eq!(faults.borrow().len(), 1);
        set_memory(root.path(), "1");
        set_online(root.path(), "0-7");
        checked.check(now);
        assert!(faults.borrow().is_empty(), "recovered: no fault left");
    }

    #[test]
    fn a_report_outlasts_three_polls() {
        let config = HealthConfig {
            poll: Duration::from_secs(20),
            ..HealthConfig::new("n")
        };
        assert_eq!(config.valid_for(), Duration::from_secs(60));
    }

    #[tokio::test]
    async fn a_cpu_going_offline_wakes_the_receivers_and_a_quiet_poll_does_not() {
        let root = tempfile::tempdir().unwrap();
        set_online(root.path(), "0-3");
        let (mut polled, _) = monitor(Some(root.path()), &[("cpu2", "2"), ("cpu3", "3")]);
        polled.config.poll = Duration::from_millis(20);
        let mut rx = polled.spawn();
        assert!(
            rx.borrow_and_update()
                .devices
                .iter()
                .all(|d| d.health == Health::Healthy)
        );
        set_online(root.path(), "0-2");
        tokio::time::timeout(Duration::from_secs(10), rx.changed())
            .await
            .expect("a change within the deadline")
            .unwrap();
        assert_eq!(
            summary(&rx.borrow_and_update()),
            [
                row("cpu2", Health::Healthy, ""),
                row("cpu3", Health::Unhealthy, "cpu 3 is offline")
            ]
        );
        // Later polls change nothing: no wake-up, but a fresher check time.
        let checked = rx.borrow().checked_at;
        let give_up = tokio::time::Instant::now() + Duration::from_secs(10);
        while rx.borrow().checked_at == checked {
            assert!(
                tokio::time::Instant::now() < give_up,
                "no poll refreshed the report"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert!(
            !rx.has_changed().unwrap(),
            "a quiet poll woke the receivers"
        );
    }

    #[tokio::test]
    async fn a_refresh_reports_devices_that_appeared_without_waiting_for_the_poll() {
        let (mut monitor, published) = monitor(None, &[]);
        // A poll far beyond the test's deadline: only the refresh can report in time.
        monitor.config.poll = Duration::from_secs(3600);
        let refresh = Arc::new(Notify::new());
        let mut rx = monitor.refresh_on(refresh.clone()).spawn();
        assert!(rx.borrow_and_update().devices.is_empty());
        published
            .lock()
            .unwrap()
            .insert("numa0".into(), cpus("0-3"));
        refresh.notify_one();
        tokio::time::timeout(Duration::from_secs(10), rx.changed())
            .await
            .expect("a report within the deadline")
            .unwrap();
        assert_eq!(
            summary(&rx.borrow_and_update()),
            [row("numa0", Health::Healthy, "")]
        );
    }
}
