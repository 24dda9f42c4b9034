//! `resmgr simulate`: the real resource manager and the real policy (the one
//! [`crate::policy_choice`] builds), in process, against a simulated runtime, kubelet and API
//! server, driven by a scenario file.
//!
//! Every step goes through the same [`resmgr::Manager`] calls the NRI plugin and the kubelet
//! servers make (create, update, stop and remove container; prepare and unprepare claims;
//! synchronize after a restart), with the durable state and the CDI specs written to real
//! directories. What the report shows is what the simulated runtime ended up applying and what
//! the policy holds, so a simulation cannot look better than the agent would behave.
//!
//! A `schedule` step puts the scheduler in front of that: [`policy::scheduler`] allocates the
//! claim from the devices the policy publishes at that moment and what is already allocated,
//! as kube-scheduler would, and the kubelet then prepares it. The report shows both views, and
//! flags loudly a claim the scheduler allocated and the node refused (its pod would be stuck)
//! or granted with another number of CPUs than the scheduler accounted.

pub(crate) mod hardware;
pub mod report;
pub mod scenario;
pub mod svg;
pub(crate) mod world;

use std::{collections::BTreeMap, path::PathBuf, sync::Arc};

use anyhow::Context as _;
use kube_dra::fake::StaticClaims;
use kubelet_plugin::ClaimRef;
use policy::{
    AllocationResult, AttributeValue, Claim, Container, CpuSet, Device, Pod, QosClass, Quantity,
    Resources, Topology, scheduler::Scheduler, topology_aware::Config,
};
use resmgr::{Manager, ManagerConfig, state::StateFile};

use self::{
    hardware::Hardware,
    report::{Change, DeviceSummary, Problem, Report, ScheduledResult, StepReport},
    scenario::{ContainerStep, HardwareStep, Qty, Scenario, ScheduleStep, Step},
    world::{Applied, SimRuntime},
};
use crate::{
    policy_choice,
    view::{self, InventoryRows, Snapshots},
};

/// Where the simulation writes.
#[derive(Debug, Clone)]
pub struct Dirs {
    pub cdi: PathBuf,
    pub state: PathBuf,
    /// The claims' device metadata, as the agent writes it.
    pub metadata: PathBuf,
    /// The machine's sysfs files the agent's health monitor reads (online CPUs and memory).
    pub sysfs: PathBuf,
}

impl Dirs {
    /// `cdi/`, `state/`, `metadata/` and `sysfs/` under `root`.
    pub fn under(root: &std::path::Path) -> Self {
        Self {
            cdi: root.join("cdi"),
            state: root.join("state"),
            metadata: root.join("metadata"),
            sysfs: root.join("sysfs"),
        }
    }
}

/// The outcome: the report, the machine, and the last inventory (for drawing).
#[derive(Debug)]
pub struct Outcome {
    pub report: Report,
    pub topology: Topology,
    pub inventory: InventoryRows,
}

/// A pod on the simulated node.
#[derive(Debug, Clone)]
struct SimPod {
    pod: Pod,
    /// Container name -> ID, in creation order.
    containers: Vec<(String, String)>,
    /// Claim names.
    claims: Vec<String>,
}

/// A claim the simulated scheduler allocated.
#[derive(Debug, Clone)]
struct SimClaim {
    reference: ClaimRef,
    /// The CDI device IDs the kubelet was answered with; `None` when the prepare failed.
    cdi_devices: Option<Vec<String>>,
    /// CPUs consumed per device, for the scheduler's capacity check.
    consumed: Vec<(String, Quantity)>,
}

/// Bytes as the report shows them: `16Gi`, `508Mi`.
pub(crate) fn memory_text(bytes: u64) -> String {
    if bytes == 0 {
        "0".into()
    } else {
        policy::topology::page_size_name(bytes)
    }
}

/// A consumed or requested amount of capacity `name`: CPUs as they are, bytes in binary units.
fn capacity_text(name: &str, q: Quantity) -> String {
    if name == "cpu" || !q.milli().is_multiple_of(1000) {
        q.to_string()
    } else {
        memory_text(q.units_ceil())
    }
}

struct Sim {
    driver: String,
    node: String,
    dirs: Dirs,
    topology: Topology,
    config: Config,
    /// The agent; `None` only after a restart that failed.
    manager: Option<Manager>,
    /// What the agent published last; still readable after a failed restart dropped it.
    view: Snapshots,
    /// What the agent had placed where when last asked; kept after a failed restart dropped it.
    last_inventory: InventoryRows,
    runtime: Arc<SimRuntime>,
    api: Arc<StaticClaims>,
    devices: Vec<DeviceSummary>,
    pods: BTreeMap<String, SimPod>,
    claims: BTreeMap<String, SimClaim>,
    /// Container ID -> what the runtime knows of it.
    containers: BTreeMap<String, Container>,
    /// Container ID -> `namespace/pod/name`, kept after the container is gone.
    names: BTreeMap<String, String>,
    next_id: u64,
    /// The simulated scheduler: what it allocated, from claim and schedule steps alike.
    scheduler: Scheduler,
    /// Claims the scheduler allocated that the node refused or granted differently.
    problems: Vec<Problem>,
    /// The step being run, 1-based, for problems.
    current_step: usize,
    /// What the scheduler handed out in the step being run, reported whether or not the node
    /// then granted it.
    scheduled: Option<Change>,
    /// The machine's CPUs and memory online, and the taints they make the agent publish.
    hardware: Hardware,
}

/// Runs `scenario` and reports what happened.
pub async fn run(scenario: &Scenario, file: &str, dirs: Dirs) -> anyhow::Result<Outcome> {
    let driver = crate::config::DEFAULT_DRIVER.to_owned();
    let mut topology =
        Topology::load(&scenario.topology).with_context(|| match scenario.topology_line {
            Some(line) => format!("{file}: line {line}: topology"),
            None => format!("{file}: topology"),
        })?;
    for node in &mut topology.numa_nodes {
        if let Some(pages) = scenario.hugepages.get(&node.id) {
            node.hugepages.clone_from(pages);
        }
    }
    let mut config = Config {
        reserved_cpus: scenario.reserved_cpus.clone(),
        driver: driver.clone(),
        exclusivity: scenario.exclusivity.clone(),
        devices: scenario.devices,
        memory: scenario.memory.clone(),
        ..Config::default()
    };
    if let Some(ns) = &scenario.reserved_namespaces {
        config.reserved_namespaces = ns.clone();
    }
    let runtime = Arc::new(SimRuntime::default());
    let api = Arc::new(StaticClaims::new());
    let (manager, view) = start(&driver, &topology, &config, &dirs, &runtime, &api)
        .with_context(|| format!("{file}: starting the resource manager"))?;
    manager.synchronize(&[]).await?;
    manager.synchronized().await;
    // A policy that serves no claims publishes nothing; its claim steps then fail per claim.
    let published = view
        .borrow()
        .devices_to_show()
        .context("the policy's devices")?;
    // The simulated API server checks the devices as a real one would check the ResourceSlice.
    {
        use kube_dra::DevicePublisher as _;
        kube_dra::fake::RecordingPublisher::new(&driver)
            .publish(published.clone())
            .await
            .map_err(|e| anyhow::anyhow!("{file}: the API server refuses the devices: {e}"))?;
    }
    let devices = published.iter().map(DeviceSummary::of).collect();
    let hardware = Hardware::new(
        dirs.sysfs.clone(),
        &topology,
        &driver,
        &scenario.node_name,
        view.borrow().clone(),
    )
    .with_context(|| format!("{file}: the simulated sysfs"))?;
    let mut sim = Sim {
        driver,
        node: scenario.node_name.clone(),
        dirs,
        config,
        manager: Some(manager),
        view,
        last_inventory: InventoryRows::from(policy::Inventory::default()),
        runtime,
        api,
        devices,
        pods: BTreeMap::new(),
        claims: BTreeMap::new(),
        containers: BTreeMap::new(),
        names: BTreeMap::new(),
        next_id: 0,
        topology: topology.clone(),
        scheduler: Scheduler::new(
            crate::config::DEFAULT_DRIVER,
            &scenario.node_name,
            scenario.gates,
        ),
        problems: Vec::new(),
        current_step: 0,
        scheduled: None,
        hardware,
    };
    let mut steps = Vec::new();
    for (i, (line, step)) in scenario.steps.iter().enumerate() {
        sim.current_step = i + 1;
        let before = sim.observe().await;
        let outcome = sim.step(step).await;
        // The background retry, made deterministic: whatever is pending goes out now.
        if let Ok(manager) = sim.manager() {
            let _ = manager.deliver().await;
        }
        let after = sim.observe().await;
        let mut changes = sim.diff(&before, &after);
        let error = match outcome {
            Ok(extra) => {
                changes.extend(extra);
                None
            }
            Err(e) => Some(e),
        };
        // What the scheduler handed out comes first: it happened before the node acted.
        if let Some(extra) = sim.scheduled.take() {
            changes.insert(0, extra);
        }
        steps.push(StepReport {
            step: i + 1,
            line: *line,
            action: step.describe(),
            error,
            changes,
        });
    }
    let inventory = sim.named_inventory().await;
    let report = Report::new(
        file,
        scenario,
        &sim.topology,
        sim.devices.clone(),
        steps,
        &inventory,
    )
    .with_problems(sim.problems.clone());
    Ok(Outcome {
        report,
        topology,
        inventory,
    })
}

fn start(
    driver: &str,
    topology: &Topology,
    config: &Config,
    dirs: &Dirs,
    runtime: &Arc<SimRuntime>,
    api: &Arc<StaticClaims>,
) -> anyhow::Result<(Manager, Snapshots)> {
    let policy = policy_choice::build(topology.clone(), config.clone())
        .map_err(|e| anyhow::anyhow!("reserved-cpus: {e}"))?;
    start_manager(driver, policy, dirs, runtime, api)
}

/// A resource manager over `policy` with the simulated runtime and API server, its state and
/// CDI specs in `dirs`, and the view the report reads.
pub(crate) fn start_manager(
    driver: &str,
    policy: Box<dyn policy::Policy>,
    dirs: &Dirs,
    runtime: &Arc<SimRuntime>,
    api: &Arc<StaticClaims>,
) -> anyhow::Result<(Manager, Snapshots)> {
    let specs = cdi::SpecStore::new(&dirs.cdi, driver)?;
    let manager = Manager::start(
        ManagerConfig {
            metadata: Some(resmgr::metadata::MetadataStore::new(
                &dirs.metadata,
                driver,
                kube_dra::metadata::MetadataVersion::ALL.to_vec(),
            )),
            ..ManagerConfig::new(driver)
        },
        policy,
        StateFile::new(&dirs.state),
        specs,
        runtime.clone(),
        api.clone(),
    )?;
    let view = manager.published();
    Ok((manager, view))
}

/// What the report compares before and after a step.
#[derive(Debug, Clone)]
struct Observed {
    applied: BTreeMap<String, Applied>,
    inventory: InventoryRows,
    /// The devices published (empty when the policy cannot say).
    devices: Vec<DeviceSummary>,
}

impl Sim {
    /// The agent.
    fn manager(&self) -> Result<&Manager, String> {
        self.manager
            .as_ref()
            .ok_or_else(|| "the agent is not running: its restart failed".to_owned())
    }

    /// What the agent has placed where now (as it was before a failed restart dropped it).
    async fn inventory(&mut self) -> InventoryRows {
        if let Some(manager) = &self.manager {
            self.last_inventory = view::inventory(manager).await;
        }
        self.last_inventory.clone()
    }

    async fn observe(&mut self) -> Observed {
        Observed {
            applied: self.runtime.table(),
            inventory: self.inventory().await,
            devices: self.published().iter().map(DeviceSummary::of).collect(),
        }
    }

    /// What the agent publishes now: the policy's devices, tainted as their health says.
    fn published(&mut self) -> Vec<Device> {
        let snapshot = self.view.borrow().clone();
        self.hardware.devices(snapshot)
    }

    /// CPUs or memory go offline or come back: the agent's health monitor sees it, and the
    /// devices behind them are tainted, or not any more. Reports each device whose taint came
    /// or went, with the claims prepared on a newly tainted one (they keep their CPUs).
    fn hardware(&mut self, online: bool, step: &HardwareStep) -> Result<Vec<Change>, String> {
        let (cpus, nodes) = step.sets()?;
        let before = self.hardware.faults();
        self.hardware.set(online, &cpus, &nodes)?;
        self.published();
        let after = self.hardware.faults();
        let claims = self.view.borrow().claims.clone();
        let mut changes = Vec::new();
        for (device, fault) in &after {
            if before.get(device) == Some(fault) {
                continue;
            }
            let on: Vec<String> = resmgr::taints::claims_on(std::slice::from_ref(device), &claims)
                .into_iter()
                .map(|(claim, _)| format!("{}/{}", claim.namespace, claim.name))
                .collect();
            changes.push(Change::Tainted {
                device: device.clone(),
                reason: fault.describe(),
                claims: on,
            });
        }
        for device in before.keys().filter(|d| !after.contains_key(*d)) {
            changes.push(Change::Healthy {
                device: device.clone(),
            });
        }
        Ok(changes)
    }

    fn uid(&mut self, tag: u32) -> String {
        self.next_id += 1;
        format!("{tag:08x}-0000-4000-8000-{:012x}", self.next_id)
    }

    fn container_name(&self, id: &str) -> String {
        self.names.get(id).cloned().unwrap_or_else(|| id.to_owned())
    }

    /// The inventory with container names filled in.
    async fn named_inventory(&mut self) -> InventoryRows {
        let mut inv = self.inventory().await;
        for c in &mut inv.containers {
            c.name = self.container_name(&c.id);
        }
        inv
    }

    async fn step(&mut self, step: &Step) -> Result<Vec<Change>, String> {
        match step {
            Step::Pod(p) => {
                let uid = self.uid(0x90d);
                self.pods.insert(
                    p.name.clone(),
                    SimPod {
                        pod: Pod {
                            uid,
                            namespace: p.namespace.clone(),
                            name: p.name.clone(),
                            qos: p.qos,
                            annotations: p.annotations.clone(),
                        },
                        containers: Vec::new(),
                        claims: Vec::new(),
                    },
                );
                Ok(Vec::new())
            }
            Step::Claim(c) => self.claim(c).await,
            Step::Schedule(c) => self.schedule(c).await,
            Step::Container(c) => self.create(c).await,
            Step::Update(u) => {
                let id = self.container_id(&u.pod, &u.container)?;
                let Some(container) = self.containers.get(&id).cloned() else {
                    return Err(format!(
                        "container {}/{} is not running",
                        u.pod, u.container
                    ));
                };
                let mut resources = container.resources;
                let qos = container.pod.qos;
                set_resources(
                    &mut resources,
                    qos,
                    u.cpu_request,
                    u.cpu_limit,
                    u.memory,
                    u.memory_limit,
                );
                let updates = self
                    .manager()?
                    .update_container(&container, &resources)
                    .await
                    .map_err(|e| stdx::errors::chain(&e))?;
                self.runtime.apply(&updates);
                if let Some(c) = self.containers.get_mut(&id) {
                    c.resources = resources;
                }
                Ok(Vec::new())
            }
            Step::Remove(r) => self.remove(&r.pod, r.container.as_deref()).await,
            Step::Restart => self.restart().await,
            Step::Reconfigure(r) => {
                if let Some((exclusivity, devices)) = &r.resolved {
                    self.config.exclusivity = exclusivity.clone();
                    self.config.devices = *devices;
                }
                self.restart().await
            }
            Step::Offline(h) => self.hardware(false, h),
            Step::Online(h) => self.hardware(true, h),
        }
    }

    fn container_id(&self, pod: &str, name: &str) -> Result<String, String> {
        self.pods
            .get(pod)
            .and_then(|p| p.containers.iter().find(|(n, _)| n == name))
            .map(|(_, id)| id.clone())
            .ok_or_else(|| format!("container {pod}/{name} is not running"))
    }

    async fn claim(&mut self, step: &scenario::ClaimStep) -> Result<Vec<Change>, String> {
        let Some(pod) = self.pods.get(&step.pod).map(|p| p.pod.clone()) else {
            return Err(format!("pod {} does not exist", step.pod));
        };
        // The scheduler: the device must be published, untainted, and have room.
        let published = self.published();
        let mut consumed = Vec::new();
        for r in &step.results {
            if let Some(tainted) = published
                .iter()
                .find(|d| d.name == r.device && !d.taints.is_empty())
            {
                return Err(format!(
                    "unschedulable: device {} is tainted ({}), and the claim does not tolerate it",
                    r.device,
                    report::taints_text(&tainted.taints)
                ));
            }
            let Some(device) = self.devices.iter().find(|d| d.name == r.device) else {
                return Err(format!(
                    "unschedulable: device {:?} is not published on this node (published: {})",
                    r.device,
                    self.devices
                        .iter()
                        .map(|d| d.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ));
            };
            let used: u64 = self
                .claims
                .values()
                .flat_map(|c| &c.consumed)
                .chain(&consumed)
                .filter(|(d, _)| *d == r.device)
                .map(|(_, q)| q.milli())
                .sum();
            if used + r.cpu.0.milli() > device.cpu_capacity_milli {
                return Err(format!(
                    "unschedulable: device {} has {} of its {} CPUs allocated; {} more do not fit",
                    r.device,
                    Quantity::from_milli(used),
                    Quantity::from_milli(device.cpu_capacity_milli),
                    r.cpu.0
                ));
            }
            consumed.push((r.device.clone(), r.cpu.0));
        }
        let uid = self.uid(0xc1a1);
        let claim = Claim {
            uid: uid.clone(),
            namespace: pod.namespace.clone(),
            name: step.name.clone(),
            reserved_for: vec![pod.uid.clone()],
            results: step
                .results
                .iter()
                .enumerate()
                .map(|(i, r)| AllocationResult {
                    request: r.request.clone(),
                    pool: self.node.clone(),
                    device: r.device.clone(),
                    share_id: Some(format!("{uid}-{i}")),
                    consumed_capacity: [("cpu".to_owned(), r.cpu.0)].into(),
                })
                .collect(),
            config: claim_config(&step.config),
            pod_claim_name: step.pod_claim_name.clone(),
        };
        self.scheduler.record(&uid, claim.results.clone());
        self.prepare(&step.pod, claim, consumed)
            .await
            .map(|(changes, _)| changes)
    }

    /// A claim the simulated scheduler allocates from the devices published now; then the
    /// kubelet prepares it, and what the node granted is held against what the scheduler
    /// handed out.
    async fn schedule(&mut self, step: &ScheduleStep) -> Result<Vec<Change>, String> {
        let Some(pod) = self.pods.get(&step.pod).map(|p| p.pod.clone()) else {
            return Err(format!("pod {} does not exist", step.pod));
        };
        self.view
            .borrow()
            .devices_to_show()
            .map_err(|e| format!("the policy's devices: {e}"))?;
        let published = self.published();
        let seen = self.scheduler.stored_devices(&published);
        let spec = step.spec();
        let (_, dropped) = self.scheduler.stored_claim(&spec);
        let uid = self.uid(0xc1a1);
        let claim_name = format!("{}/{}", pod.namespace, step.name);
        let results = self
            .scheduler
            .allocate(&uid, &spec, &published)
            .map_err(|e| {
                let mut m = e.to_string();
                if !dropped.is_empty() {
                    m.push_str(&format!(
                        " (DRAConsumableCapacity is off: the API server dropped {})",
                        dropped.join(", ")
                    ));
                }
                m
            })?;
        let handed: Vec<(ScheduledResult, u64)> = results
            .iter()
            .map(|r| {
                let (mut shown, cpus) =
                    scheduled_result(r, seen.iter().find(|d| d.name == r.device));
                // What the request asked for, where the request policy rounded it.
                let base = r.request.split('/').next().unwrap_or_default();
                if let Some(request) = spec.requests.iter().find(|q| q.name == base) {
                    for (name, asked) in &request.capacity {
                        let asked = capacity_text(name, *asked);
                        if shown.consumed.get(name).is_some_and(|c| *c != asked) {
                            shown.asked.insert(name.clone(), asked);
                        }
                    }
                }
                (shown, cpus)
            })
            .collect();
        let promised: u64 = handed.iter().map(|(_, cpus)| cpus).sum();
        self.scheduled = Some(Change::Scheduled {
            claim: claim_name.clone(),
            results: handed.into_iter().map(|(r, _)| r).collect(),
            cpus: promised,
            dropped,
        });
        // What the old claim step's capacity check counts: the CPUs each device lost.
        let consumed = results
            .iter()
            .map(|r| {
                let device = seen.iter().find(|d| d.name == r.device);
                (
                    r.device.clone(),
                    Quantity::from_units(scheduled_result(r, device).1),
                )
            })
            .collect();
        let picked = picked_cpus(&results, &seen);
        let claim = Claim {
            uid: uid.clone(),
            namespace: pod.namespace.clone(),
            name: step.name.clone(),
            reserved_for: vec![pod.uid.clone()],
            results,
            config: claim_config(&step.config),
            pod_claim_name: step.pod_claim_name.clone(),
        };
        match self.prepare(&step.pod, claim, consumed).await {
            Ok((mut changes, _)) => {
                let granted = self
                    .inventory()
                    .await
                    .source
                    .claims
                    .iter()
                    .find(|c| c.uid == uid)
                    .map(|c| c.cpus.clone())
                    .unwrap_or_default();
                let differs = match &picked {
                    Some(picked) if *picked != granted => Some(format!(
                        "the scheduler picked cpus {picked}, the node granted cpus {}",
                        show_cpus(&granted)
                    )),
                    Some(_) => None,
                    None => (granted.len() as u64 != promised).then(|| {
                        format!(
                            "the scheduler handed out {promised} cpu(s), the node granted {}",
                            granted.len()
                        )
                    }),
                };
                if let Some(message) = differs {
                    self.problems.push(Problem {
                        step: self.current_step,
                        kind: "mismatch".into(),
                        claim: claim_name.clone(),
                        message: message.clone(),
                    });
                    changes.push(Change::Mismatch {
                        claim: claim_name,
                        message,
                    });
                }
                Ok(changes)
            }
            Err(e) => {
                let message = format!(
                    "the scheduler allocated it and the node refused it, so its pod waits in ContainerCreating for good: {e}"
                );
                self.problems.push(Problem {
                    step: self.current_step,
                    kind: "stuck".into(),
                    claim: claim_name,
                    message: message.clone(),
                });
                Err(format!("STUCK: {message}"))
            }
        }
    }

    /// Puts an allocated claim in the API server and has the kubelet prepare it, as it does
    /// before starting the pod's containers. Returns the spec change and the claim's CDI
    /// devices, or why the prepare failed (the whole call, or this claim).
    async fn prepare(
        &mut self,
        pod_name: &str,
        claim: Claim,
        consumed: Vec<(String, Quantity)>,
    ) -> Result<(Vec<Change>, Vec<String>), String> {
        let uid = claim.uid.clone();
        let reference = ClaimRef {
            namespace: claim.namespace.clone(),
            name: claim.name.clone(),
            uid: uid.clone(),
        };
        let name = claim.name.clone();
        self.api.insert(claim);
        if let Some(p) = self.pods.get_mut(pod_name) {
            p.claims.push(name.clone());
        }
        let answer = self
            .manager()?
            .prepare(std::slice::from_ref(&reference))
            .await
            .map_err(|e| e.to_string())?
            .remove(&uid)
            .ok_or_else(|| format!("claim {reference}: the manager gave no answer"))?;
        let mut sim_claim = SimClaim {
            reference,
            cdi_devices: None,
            consumed,
        };
        match answer {
            Ok(devices) => {
                let ids: Vec<String> = devices.into_iter().map(|d| d.cdi_device_id).collect();
                sim_claim.cdi_devices = Some(ids.clone());
                let spec = cdi::ClaimUid::new(&uid)
                    .map(|u| cdi::claim::spec_file_name(&self.driver, &u))
                    .unwrap_or_default();
                let namespace = sim_claim.reference.namespace.clone();
                self.claims.insert(name.clone(), sim_claim);
                let claim = format!("{namespace}/{name}");
                let mut changes = vec![Change::Spec {
                    claim: claim.clone(),
                    file: spec,
                    cdi_devices: ids.clone(),
                }];
                changes.extend(self.metadata(&claim, &uid).map_err(|e| format!("{e:#}"))?);
                Ok((changes, ids))
            }
            Err(e) => {
                self.claims.insert(name, sim_claim);
                Err(format!(
                    "the kubelet could not prepare it: {}",
                    stdx::errors::chain(&e)
                ))
            }
        }
    }

    async fn create(&mut self, step: &ContainerStep) -> Result<Vec<Change>, String> {
        let Some(pod) = self.pods.get(&step.pod).map(|p| p.pod.clone()) else {
            return Err(format!("pod {} does not exist", step.pod));
        };
        let mut cdi_devices = Vec::new();
        for name in &step.claims {
            match self.claims.get(name).and_then(|c| c.cdi_devices.clone()) {
                Some(devices) => cdi_devices.extend(devices),
                None => {
                    return Err(format!(
                        "the pod cannot start: its claim {name} was not prepared"
                    ));
                }
            }
        }
        let env = self
            .inject(&cdi_devices)
            .map_err(|e| format!("injecting CDI devices: {e}"))?;
        let mut resources = Resources::default();
        set_resources(
            &mut resources,
            pod.qos,
            step.cpu_request,
            step.cpu_limit,
            step.memory,
            step.memory_limit,
        );
        let id = self.uid(0xc0de);
        self.names.insert(
            id.clone(),
            format!("{}/{}/{}", pod.namespace, pod.name, step.name),
        );
        let container = Container {
            id: id.clone(),
            pod,
            name: step.name.clone(),
            resources,
            annotations: step.annotations.clone(),
            cdi_devices,
            env,
            cpus: None,
            mems: None,
        };
        let manager = self.manager()?;
        let allocation = manager
            .create_container(&container)
            .await
            .map_err(|e| stdx::errors::chain(&e))?;
        self.runtime.apply(&allocation.updates);
        self.runtime.start(
            &id,
            Applied {
                cpus: allocation.adjustment.cpus.clone(),
                mems: allocation.adjustment.mems.clone(),
            },
        );
        // The runtime has it running now, and says so (PostStartContainer).
        manager.container_started(&container).await;
        let mut running = container;
        running.cpus = allocation.adjustment.cpus;
        running.mems = allocation.adjustment.mems;
        self.containers.insert(id.clone(), running);
        if let Some(p) = self.pods.get_mut(&step.pod) {
            p.containers.push((step.name.clone(), id));
        }
        Ok(Vec::new())
    }

    /// The device metadata the claim's spec mounts, as a container would read each file: what
    /// the agent wrote, read back from where the mount's host path says.
    fn metadata(&self, claim: &str, uid: &str) -> anyhow::Result<Vec<Change>> {
        let store = cdi::SpecStore::new(&self.dirs.cdi, &self.driver)?;
        let edits = store.read_claim(uid)?;
        let mut seen = Vec::new();
        let mut changes = Vec::new();
        for mount in edits.iter().flat_map(|e| &e.mounts) {
            if seen.contains(&mount.container_path) {
                continue;
            }
            seen.push(mount.container_path.clone());
            let bytes = std::fs::read(&mount.host_path)
                .with_context(|| format!("reading the device metadata {}", mount.host_path))?;
            let metadata = kube_dra::metadata::RequestMetadata::decode(&bytes)?;
            changes.push(Change::Metadata {
                claim: claim.to_owned(),
                path: mount.container_path.clone(),
                request: metadata.request,
                generation: metadata.generation,
                devices: metadata
                    .devices
                    .into_iter()
                    .map(|d| report::MetadataDevice {
                        name: d.name,
                        attributes: d
                            .attributes
                            .iter()
                            .map(|(k, v)| (k.clone(), report::attribute_text(v)))
                            .collect(),
                    })
                    .collect(),
            });
        }
        Ok(changes)
    }

    /// What a CDI-enabled runtime does with the devices: reads the specs, applies their
    /// environment edits, and checks that what they mount is there (runc fails a container
    /// whose mount source is missing).
    fn inject(&self, devices: &[String]) -> anyhow::Result<Vec<String>> {
        let mut env = Vec::new();
        let mut read: BTreeMap<PathBuf, cdi::Spec> = BTreeMap::new();
        for device in devices {
            let uid = cdi::claim::claim_of_device(device)?.uid;
            let path = self
                .dirs
                .cdi
                .join(cdi::claim::spec_file_name(&self.driver, &uid));
            if !read.contains_key(&path) {
                let bytes =
                    std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
                read.insert(path.clone(), serde_json::from_slice(&bytes)?);
            }
            let Some(spec) = read.get(&path) else {
                continue;
            };
            let name = device.rsplit('=').next().unwrap_or_default();
            for d in spec.devices.iter().filter(|d| d.name == name) {
                env.extend(d.container_edits.env.iter().cloned());
                if let Some(missing) = d
                    .container_edits
                    .mounts
                    .iter()
                    .find(|m| !std::path::Path::new(&m.host_path).exists())
                {
                    anyhow::bail!(
                        "device {device} mounts {}, which is not on the host",
                        missing.host_path
                    );
                }
            }
            env.extend(spec.container_edits.env.iter().cloned());
        }
        env.sort();
        env.dedup();
        Ok(env)
    }

    async fn remove(&mut self, pod: &str, only: Option<&str>) -> Result<Vec<Change>, String> {
        let Some(p) = self.pods.get(pod).cloned() else {
            return Err(format!("pod {pod} does not exist"));
        };
        let ids: Vec<String> = p
            .containers
            .iter()
            .filter(|(n, _)| only.is_none_or(|o| o == n))
            .map(|(_, id)| id.clone())
            .collect();
        for id in &ids {
            let Some(container) = self.containers.remove(id) else {
                continue;
            };
            let updates = self.manager()?.stop_container(&container).await;
            self.runtime.remove(id);
            self.runtime.apply(&updates);
            self.manager()?.remove_container(&container).await;
        }
        if let Some(p) = self.pods.get_mut(pod) {
            p.containers.retain(|(_, id)| !ids.contains(id));
        }
        if only.is_some() {
            return Ok(Vec::new());
        }
        // The pod is gone: the kubelet unprepares its claims, then they are deallocated.
        let refs: Vec<ClaimRef> = p
            .claims
            .iter()
            .filter_map(|n| self.claims.get(n).map(|c| c.reference.clone()))
            .collect();
        let mut error = None;
        if !refs.is_empty() {
            match self.manager()?.unprepare(&refs).await {
                Ok(answers) => {
                    for (_, answer) in answers {
                        if let Err(e) = answer {
                            error = Some(e.to_string());
                        }
                    }
                }
                Err(e) => error = Some(e.to_string()),
            }
        }
        for name in &p.claims {
            if let Some(c) = self.claims.remove(name) {
                self.api.remove(&c.reference.namespace, &c.reference.name);
                self.scheduler.deallocate(&c.reference.uid);
            }
        }
        self.pods.remove(pod);
        match error {
            None => Ok(Vec::new()),
            Some(e) => Err(format!("the kubelet could not unprepare a claim: {e}")),
        }
    }

    /// The agent restarts: a new manager and policy from the state on disk, synchronized with
    /// the containers the runtime still runs.
    async fn restart(&mut self) -> Result<Vec<Change>, String> {
        // The agent's process ends before the new one starts, and its hold on the state
        // directory with it.
        self.manager = None;
        let (manager, view) = start(
            &self.driver,
            &self.topology,
            &self.config,
            &self.dirs,
            &self.runtime,
            &self.api,
        )
        .map_err(|e| format!("{e:#}"))?;
        self.manager = Some(manager);
        self.view = view;
        let applied = self.runtime.table();
        let running: Vec<Container> = self
            .containers
            .values()
            .map(|c| {
                let mut c = c.clone();
                if let Some(a) = applied.get(&c.id) {
                    c.cpus = a.cpus.clone();
                    c.mems = a.mems.clone();
                }
                c
            })
            .collect();
        let updates = self
            .manager()?
            .synchronize(&running)
            .await
            .map_err(|e| stdx::errors::chain(&e))?;
        self.runtime.apply(&updates);
        self.manager()?.synchronized().await;
        let restored = self.inventory().await.claims.len();
        Ok(vec![Change::Restarted {
            claims: restored,
            containers: running.len(),
        }])
    }

    fn diff(&self, before: &Observed, after: &Observed) -> Vec<Change> {
        let mut out = Vec::new();
        if after.devices != before.devices {
            out.push(Change::Republished {
                devices: after.devices.clone(),
            });
        }
        let placement = |id: &str| after.inventory.containers.iter().find(|c| c.id == id);
        for (id, now) in &after.applied {
            let name = self.container_name(id);
            match before.applied.get(id) {
                None => {
                    let p = placement(id);
                    out.push(Change::Placed {
                        container: name,
                        grant: p.map_or("-", |p| p.grant.as_str()).to_owned(),
                        pool: p.and_then(|p| p.pool.clone()),
                        cpus: show(now.cpus.as_ref()),
                        mems: show(now.mems.as_ref()),
                        fallbacks: p.map_or_else(Vec::new, |p| {
                            p.fallbacks.iter().map(|f| f.as_str().to_owned()).collect()
                        }),
                    });
                }
                Some(was) if was != now => out.push(Change::Updated {
                    container: name,
                    cpus: show(now.cpus.as_ref()),
                    mems: show(now.mems.as_ref()),
                    was_cpus: show(was.cpus.as_ref()),
                    was_mems: show(was.mems.as_ref()),
                }),
                Some(_) => {}
            }
        }
        for id in before.applied.keys() {
            if !after.applied.contains_key(id) {
                out.push(Change::Removed {
                    container: self.container_name(id),
                });
            }
        }
        for c in &after.inventory.claims {
            if !before.inventory.claims.iter().any(|b| b.uid == c.uid) {
                let mut memory = Vec::new();
                let placed = after
                    .inventory
                    .source
                    .claims
                    .iter()
                    .find(|p| p.uid == c.uid);
                if let Some(p) = placed.filter(|p| p.memory > 0) {
                    memory.push(format!("memory {}", memory_text(p.memory)));
                }
                for (size, bytes) in placed.iter().flat_map(|p| &p.hugepages) {
                    memory.push(format!(
                        "hugepages{} {}",
                        memory_text(*size),
                        memory_text(*bytes)
                    ));
                }
                out.push(Change::Claimed {
                    claim: c.name.clone(),
                    devices: c.devices.clone(),
                    cpus: c.cpus.clone(),
                    mems: c.mems.clone(),
                    memory: (!memory.is_empty()).then(|| memory.join(", ")),
                });
            }
        }
        for c in &before.inventory.claims {
            if !after.inventory.claims.iter().any(|a| a.uid == c.uid) {
                out.push(Change::Released {
                    claim: c.name.clone(),
                    cpus: c.cpus.clone(),
                });
            }
        }
        out
    }
}

/// The claim's configuration for our driver, as the allocation carries it.
fn claim_config(steps: &[scenario::ConfigStep]) -> Vec<policy::ClaimConfig> {
    steps
        .iter()
        .map(|c| policy::ClaimConfig {
            source: match c.source {
                scenario::ConfigSourceStep::Claim => policy::ConfigSource::Claim,
                scenario::ConfigSourceStep::Class => policy::ConfigSource::Class,
            },
            requests: c.requests.clone(),
            parameters: c.parameters.clone(),
        })
        .collect()
}

/// The very CPUs the scheduler picked, when every result is a device handed out whole that
/// names its CPUs (the `cpu` or `cpus` attribute of a device per CPU or per core); `None`
/// otherwise (shared devices, or devices that do not say).
fn picked_cpus(results: &[AllocationResult], devices: &[Device]) -> Option<CpuSet> {
    let mut picked = CpuSet::new();
    for r in results {
        let device = devices.iter().find(|d| d.name == r.device)?;
        if is_memory_device(device) {
            // Memory, no CPUs: the CPU devices say which CPUs.
            continue;
        }
        if r.share_id.is_some() {
            return None;
        }
        let cpus = match (device.attributes.get("cpu"), device.attributes.get("cpus")) {
            (Some(AttributeValue::Int(cpu)), _) => CpuSet::from_iter([u32::try_from(*cpu).ok()?]),
            (_, Some(AttributeValue::String(list))) => list.parse().ok()?,
            _ => return None,
        };
        picked = picked.union(&cpus);
    }
    Some(picked)
}

fn show_cpus(cpus: &CpuSet) -> String {
    if cpus.is_empty() {
        "none".to_owned()
    } else {
        cpus.to_string()
    }
}

fn is_memory_device(device: &Device) -> bool {
    device
        .attributes
        .contains_key(policy::topology_aware::devices::MEMORY_KIND_ATTRIBUTE)
}

/// One result as the report shows it, and the CPUs the scheduler counts it for: the `cpu` it
/// consumed from a shared device, the whole `cpu` capacity of a device handed out whole, none
/// for a memory device, or one CPU for a device without one (a device per CPU).
fn scheduled_result(r: &AllocationResult, device: Option<&Device>) -> (ScheduledResult, u64) {
    let whole = r.share_id.is_none();
    let cpus = match r.consumed_capacity.get("cpu") {
        Some(q) => q.units_ceil(),
        None if device.is_some_and(is_memory_device) => 0,
        None => device
            .and_then(|d| d.capacities.get("cpu"))
            .map_or(1, |c| c.value.units_ceil()),
    };
    (
        ScheduledResult {
            request: r.request.clone(),
            device: r.device.clone(),
            share_id: r.share_id.clone(),
            consumed: r
                .consumed_capacity
                .iter()
                .map(|(n, q)| (n.clone(), capacity_text(n, *q)))
                .collect(),
            asked: BTreeMap::new(),
            whole,
            cpus,
        },
        cpus,
    )
}

fn show<T: ToString>(v: Option<&T>) -> String {
    v.map_or_else(|| "-".to_owned(), ToString::to_string)
}

/// Sets what a step gives; Guaranteed pods get limits equal to requests unless given.
fn set_resources(
    r: &mut Resources,
    qos: QosClass,
    cpu_request: Option<Qty>,
    cpu_limit: Option<Qty>,
    memory: Option<Qty>,
    memory_limit: Option<Qty>,
) {
    if let Some(q) = cpu_request {
        r.cpu_request_milli = q.0.milli();
    }
    if let Some(q) = cpu_limit {
        r.cpu_limit_milli = Some(q.0.milli());
    }
    if let Some(q) = memory {
        r.memory_request_bytes = q.0.units_ceil();
    }
    if let Some(q) = memory_limit {
        r.memory_limit_bytes = Some(q.0.units_ceil());
    }
    if qos == QosClass::Guaranteed {
        if cpu_limit.is_none() {
            r.cpu_limit_milli = Some(r.cpu_request_milli);
        }
        if memory_limit.is_none() {
            r.memory_limit_bytes = Some(r.memory_request_bytes);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn simulate(text: &str) -> Report {
        let dir = tempfile::tempdir().unwrap();
        let scenario = scenario::parse("s.yaml", text, None).unwrap();
        run(&scenario, "s.yaml", Dirs::under(dir.path()))
            .await
            .unwrap()
            .report
    }

    fn scheduled(step: &StepReport) -> Option<(&str, u64)> {
        step.changes.iter().find_map(|c| match c {
            Change::Scheduled { claim, cpus, .. } => Some((claim.as_str(), *cpus)),
            _ => None,
        })
    }

    #[test]
    fn the_cpus_the_scheduler_picked_are_known_from_devices_that_name_them() {
        let device = |name: &str, attribute: Option<(&str, AttributeValue)>| Device {
            name: name.into(),
            attributes: attribute
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v))
                .collect(),
            capacities: BTreeMap::new(),
            allow_multiple_allocations: false,
            taints: Vec::new(),
        };
        let devices = [
            device("cpu4", Some(("cpu", AttributeValue::Int(4)))),
            device(
                "core2",
                Some(("cpus", AttributeValue::String("5,37".into()))),
            ),
            device("numa0", None),
        ];
        let result = |device: &str, share: Option<&str>| AllocationResult {
            request: "cpus".into(),
            pool: "n".into(),
            device: device.into(),
            share_id: share.map(Into::into),
            consumed_capacity: BTreeMap::new(),
        };
        let picked = picked_cpus(&[result("cpu4", None), result("core2", None)], &devices);
        assert_eq!(picked, Some("4-5,37".parse().unwrap()));
        assert_eq!(picked_cpus(&[result("numa0", None)], &devices), None);
        assert_eq!(picked_cpus(&[result("cpu4", Some("s"))], &devices), None);
        assert_eq!(picked_cpus(&[result("gone", None)], &devices), None);
    }

    const MACHINE: &str = "topology: \"pack:1 numa:2 core:4 pu:2\"\nreserved-cpus: \"0-1\"\n";

    #[tokio::test]
    async fn the_scheduler_allocates_from_what_is_published_and_the_node_grants_it() {
        let report = simulate(&format!(
            "{MACHINE}steps:
  - pod: {{name: db, qos: Guaranteed}}
  - schedule: {{name: c, pod: db, cpu: 2500m, selector: {{resource.kubernetes.io/numaNode: 1}}}}
  - container: {{pod: db, name: pg, cpu-request: 3, claims: [c]}}
"
        ))
        .await;
        let step = &report.steps[1];
        assert_eq!(step.error, None);
        // Rounded up by the device's request policy, and granted as counted.
        assert_eq!(scheduled(step), Some(("default/c", 3)));
        assert!(step.changes.iter().any(|c| matches!(
            c,
            Change::Claimed { cpus, .. } if cpus.parse::<policy::CpuSet>().unwrap().len() == 3
        )));
        assert!(report.problems.is_empty(), "{:?}", report.problems);
        assert!(
            matches!(step.changes[0], Change::Scheduled { .. }),
            "scheduler first"
        );
        let Change::Scheduled { results, .. } = &step.changes[0] else {
            unreachable!()
        };
        assert_eq!(results[0].device, "numa1");
        assert!(results[0].share_id.is_some());
        assert_eq!(results[0].consumed["cpu"], "3");
    }

    #[tokio::test]
    async fn a_claim_for_what_the_slice_says_is_prepared_after_guaranteed_containers() {
        // Finding 1 of issue 18: exclusive containers ate numa0 while the slice still said 6.
        // Guaranteed containers without a claim now share CPUs, so the claim is prepared.
        let report = simulate(&format!(
            "{MACHINE}steps:
  - pod: {{name: a, qos: Guaranteed}}
  - container: {{pod: a, name: c, cpu-request: 6}}
  - pod: {{name: db, qos: Guaranteed}}
  - schedule: {{name: c, pod: db, cpu: 6, selector: {{resource.kubernetes.io/numaNode: 0}}}}
"
        ))
        .await;
        let step = &report.steps[3];
        assert_eq!(scheduled(step), Some(("default/c", 6)));
        assert_eq!(step.error, None);
        assert!(report.problems.is_empty(), "{:?}", report.problems);
    }

    #[tokio::test]
    async fn a_claim_the_node_refuses_after_allocation_is_reported_stuck() {
        // A configuration the node cannot decode: allocated, then refused.
        let report = simulate(&format!(
            "{MACHINE}steps:
  - pod: {{name: db, qos: Guaranteed}}
  - schedule: {{name: c, pod: db, cpu: 2, config: [{{parameters: {{apiVersion: resmgr.io/v1alpha1, kind: CpuConfig, memoryPining: false}}}}]}}
"
        ))
        .await;
        let step = &report.steps[1];
        assert_eq!(scheduled(step), Some(("default/c", 2)));
        let error = step.error.as_deref().unwrap();
        assert!(error.starts_with("STUCK: "), "{error}");
        assert_eq!(report.problems.len(), 1);
        assert_eq!(report.problems[0].kind, "stuck");
        assert_eq!(report.problems[0].step, 2);
        assert!(report.text().contains("PROBLEMS: 1 claim(s)"));
        assert!(report.json().contains("\"problems\""));
    }

    #[tokio::test]
    async fn a_claim_that_does_not_fit_is_unschedulable_not_stuck() {
        let report = simulate(&format!(
            "{MACHINE}steps:
  - pod: {{name: db, qos: Guaranteed}}
  - schedule: {{name: c, pod: db, cpu: 7, selector: {{resource.kubernetes.io/numaNode: 0}}}}
  - container: {{pod: db, name: pg, cpu-request: 7, claims: [c]}}
"
        ))
        .await;
        let error = report.steps[1].error.as_deref().unwrap();
        assert!(error.starts_with("unschedulable: "), "{error}");
        assert_eq!(scheduled(&report.steps[1]), None);
        assert!(report.problems.is_empty());
        assert!(report.steps[2].error.is_some(), "its pod cannot start");
    }

    #[tokio::test]
    async fn without_the_gate_a_device_allocated_whole_is_granted_whole() {
        let report = simulate(&format!(
            "{MACHINE}feature-gates: {{DRAConsumableCapacity: false}}
steps:
  - pod: {{name: db, qos: Guaranteed}}
  - schedule: {{name: c, pod: db, cpu: 4}}
"
        ))
        .await;
        let step = &report.steps[1];
        let Some(Change::Scheduled { dropped, cpus, .. }) = step.changes.first() else {
            panic!("{step:?}")
        };
        assert_eq!(dropped, &["request cpus: capacity cpu=4"]);
        assert_eq!(*cpus, 6, "numa0 whole");
        assert_eq!(
            report.feature_gates,
            BTreeMap::from([("DRAConsumableCapacity".to_owned(), false)])
        );
        // The node grants the device whole (finding 2 of issue 18: it granted one CPU).
        assert_eq!(report.allocation.source.claims[0].cpus.len(), 6);
        assert!(report.problems.is_empty(), "{:?}", report.problems);
    }

    #[tokio::test]
    async fn claims_of_both_steps_count_for_the_scheduler_until_their_pod_goes() {
        let report = simulate(&format!(
            "{MACHINE}steps:
  - pod: {{name: a, qos: Guaranteed}}
  - claim: {{name: by-hand, pod: a, results: [{{request: cpus, device: numa0, cpu: 5}}]}}
  - pod: {{name: b, qos: Guaranteed}}
  - schedule: {{name: two, pod: b, cpu: 2, selector: {{resource.kubernetes.io/numaNode: 0}}}}
  - remove: {{pod: a}}
  - schedule: {{name: again, pod: b, cpu: 2, selector: {{resource.kubernetes.io/numaNode: 0}}}}
  - claim: {{name: late, pod: b, results: [{{request: cpus, device: numa0, cpu: 5}}]}}
"
        ))
        .await;
        let e = report.steps[3].error.as_deref().unwrap();
        assert!(e.contains("1 of its 6 cpu left"), "{e}");
        assert_eq!(report.steps[5].error, None, "numa0 freed by the removal");
        // And a hand-written claim sees what the scheduler allocated.
        let e = report.steps[6].error.as_deref().unwrap();
        assert!(e.contains("has 2 of its 6 CPUs allocated"), "{e}");
    }
}
