//! `resmgr simulate`: the real resource manager and the real policy (the one
//! [`crate::policy_choice`] builds), in process, against a simulated runtime, kubelet and API
//! server, driven by a scenario file.
//!
//! Every step goes through the same [`resmgr::Manager`] calls the NRI plugin and the kubelet
//! servers make (create, update, stop and remove container; prepare and unprepare claims;
//! synchronize after a restart), with the durable state and the CDI specs written to real
//! directories. What the report shows is what the simulated runtime ended up applying and what
//! the policy holds, so a simulation cannot look better than the agent would behave.

pub mod report;
pub mod scenario;
pub mod svg;
pub(crate) mod world;

use std::{collections::BTreeMap, path::PathBuf, sync::Arc};

use anyhow::Context as _;
use policy::{
    AllocationResult, Claim, Container, Pod, QosClass, Quantity, Resources, Topology, cdi,
    topology_aware::Config,
};
use resmgr::{
    Manager, ManagerConfig, kube::fake::StaticClaims, kubelet_plugin::ClaimRef, state::StateFile,
};

use self::{
    report::{Change, DeviceSummary, Report, StepReport},
    scenario::{ContainerStep, Qty, Scenario, Step},
    world::{Applied, SimRuntime},
};
use crate::{
    policy_choice,
    view::{self, Inventory, PolicyView},
};

/// Where the simulation writes.
#[derive(Debug, Clone)]
pub struct Dirs {
    pub cdi: PathBuf,
    pub state: PathBuf,
}

impl Dirs {
    /// `cdi/` and `state/` under `root`, for the binary's tests.
    #[cfg(test)]
    pub fn under(root: &std::path::Path) -> Self {
        Self {
            cdi: root.join("cdi"),
            state: root.join("state"),
        }
    }
}

/// The outcome: the report, the machine, and the last inventory (for drawing).
#[derive(Debug)]
pub struct Outcome {
    pub report: Report,
    pub topology: Topology,
    pub inventory: Inventory,
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

struct Sim {
    driver: String,
    node: String,
    dirs: Dirs,
    topology: Topology,
    config: Config,
    manager: Manager,
    view: PolicyView,
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
}

/// Runs `scenario` and reports what happened.
pub async fn run(scenario: &Scenario, file: &str, dirs: Dirs) -> anyhow::Result<Outcome> {
    let driver = crate::config::DEFAULT_DRIVER.to_owned();
    let topology =
        Topology::load(&scenario.topology).with_context(|| match scenario.topology_line {
            Some(line) => format!("{file}: line {line}: topology"),
            None => format!("{file}: topology"),
        })?;
    let mut config = Config {
        reserved_cpus: scenario.reserved_cpus.clone(),
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
    let published = view.devices_to_show().context("the policy's devices")?;
    // The simulated API server checks the devices as a real one would check the ResourceSlice.
    {
        use resmgr::kube::DevicePublisher as _;
        resmgr::kube::fake::RecordingPublisher::new(&driver)
            .publish(published.clone())
            .await
            .map_err(|e| anyhow::anyhow!("{file}: the API server refuses the devices: {e}"))?;
    }
    let devices = published.iter().map(DeviceSummary::of).collect();
    let mut sim = Sim {
        driver,
        node: scenario.node_name.clone(),
        dirs,
        config,
        manager,
        view,
        runtime,
        api,
        devices,
        pods: BTreeMap::new(),
        claims: BTreeMap::new(),
        containers: BTreeMap::new(),
        names: BTreeMap::new(),
        next_id: 0,
        topology: topology.clone(),
    };
    let mut steps = Vec::new();
    for (i, (line, step)) in scenario.steps.iter().enumerate() {
        let before = sim.observe();
        let outcome = sim.step(step).await;
        // The background retry, made deterministic: whatever is pending goes out now.
        let _ = sim.manager.deliver().await;
        let after = sim.observe();
        let mut changes = sim.diff(&before, &after);
        let error = match outcome {
            Ok(extra) => {
                changes.extend(extra);
                None
            }
            Err(e) => Some(e),
        };
        steps.push(StepReport {
            step: i + 1,
            line: *line,
            action: step.describe(),
            error,
            changes,
        });
    }
    let inventory = sim.named_inventory();
    let report = Report::new(
        file,
        scenario,
        &sim.topology,
        sim.devices.clone(),
        steps,
        &inventory,
    );
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
) -> anyhow::Result<(Manager, PolicyView)> {
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
) -> anyhow::Result<(Manager, PolicyView)> {
    let (policy, view) = view::share(policy);
    let specs = cdi::SpecStore::new(&dirs.cdi, driver)?;
    let manager = Manager::start(
        ManagerConfig::new(driver),
        Box::new(policy),
        StateFile::new(&dirs.state),
        specs,
        runtime.clone(),
        api.clone(),
    )?;
    Ok((manager, view))
}

/// What the report compares before and after a step.
#[derive(Debug, Clone)]
struct Observed {
    applied: BTreeMap<String, Applied>,
    inventory: Inventory,
}

impl Sim {
    fn observe(&self) -> Observed {
        Observed {
            applied: self.runtime.table(),
            inventory: self.view.inventory(),
        }
    }

    fn uid(&mut self, tag: u32) -> String {
        self.next_id += 1;
        format!("{tag:08x}-0000-4000-8000-{:012x}", self.next_id)
    }

    fn container_name(&self, id: &str) -> String {
        self.names.get(id).cloned().unwrap_or_else(|| id.to_owned())
    }

    /// The inventory with container names filled in.
    fn named_inventory(&self) -> Inventory {
        let mut inv = self.view.inventory();
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
                    .manager
                    .update_container(&container, &resources)
                    .await
                    .map_err(|e| resmgr::errors::chain(&e))?;
                self.runtime.apply(&updates);
                if let Some(c) = self.containers.get_mut(&id) {
                    c.resources = resources;
                }
                Ok(Vec::new())
            }
            Step::Remove(r) => self.remove(&r.pod, r.container.as_deref()).await,
            Step::Restart => self.restart().await,
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
        // The scheduler: the device must be published and have room.
        let mut consumed = Vec::new();
        for r in &step.results {
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
            config: step
                .config
                .iter()
                .map(|c| policy::ClaimConfig {
                    source: match c.source {
                        scenario::ConfigSourceStep::Claim => policy::ConfigSource::Claim,
                        scenario::ConfigSourceStep::Class => policy::ConfigSource::Class,
                    },
                    requests: c.requests.clone(),
                    parameters: c.parameters.clone(),
                })
                .collect(),
        };
        self.api.insert(claim);
        let reference = ClaimRef {
            namespace: pod.namespace.clone(),
            name: step.name.clone(),
            uid: uid.clone(),
        };
        if let Some(p) = self.pods.get_mut(&step.pod) {
            p.claims.push(step.name.clone());
        }
        // The kubelet prepares the pod's claims before it starts its containers.
        let answer = self
            .manager
            .prepare(std::slice::from_ref(&reference))
            .await
            .map_err(|e| e.to_string())?
            .remove(&uid)
            .unwrap_or_else(|| {
                Err(resmgr::LifecycleError {
                    claim: reference.clone(),
                    step: "answering",
                    cause: "no answer".into(),
                })
            });
        let mut sim_claim = SimClaim {
            reference,
            cdi_devices: None,
            consumed,
        };
        match answer {
            Ok(devices) => {
                sim_claim.cdi_devices =
                    Some(devices.iter().map(|d| d.cdi_device_id.clone()).collect());
                let spec = cdi::ClaimUid::new(&uid)
                    .map(|u| cdi::claim::spec_file_name(&self.driver, &u))
                    .unwrap_or_default();
                self.claims.insert(step.name.clone(), sim_claim);
                Ok(vec![Change::Spec {
                    claim: format!("{}/{}", pod.namespace, step.name),
                    file: spec,
                    cdi_devices: devices.into_iter().map(|d| d.cdi_device_id).collect(),
                }])
            }
            Err(e) => {
                self.claims.insert(step.name.clone(), sim_claim);
                Err(format!("the kubelet could not prepare it: {e}"))
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
        let allocation = self
            .manager
            .create_container(&container)
            .await
            .map_err(|e| resmgr::errors::chain(&e))?;
        self.runtime.apply(&allocation.updates);
        self.runtime.start(
            &id,
            Applied {
                cpus: allocation.adjustment.cpus.clone(),
                mems: allocation.adjustment.mems.clone(),
            },
        );
        let mut running = container;
        running.cpus = allocation.adjustment.cpus;
        running.mems = allocation.adjustment.mems;
        self.containers.insert(id.clone(), running);
        if let Some(p) = self.pods.get_mut(&step.pod) {
            p.containers.push((step.name.clone(), id));
        }
        Ok(Vec::new())
    }

    /// What a CDI-enabled runtime does with the devices: reads the specs and applies their
    /// environment edits.
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
            let updates = self.manager.stop_container(&container).await;
            self.runtime.remove(id);
            self.runtime.apply(&updates);
            self.manager.remove_container(&container).await;
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
            match self.manager.unprepare(&refs).await {
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
        let (manager, view) = start(
            &self.driver,
            &self.topology,
            &self.config,
            &self.dirs,
            &self.runtime,
            &self.api,
        )
        .map_err(|e| format!("{e:#}"))?;
        self.manager = manager;
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
            .manager
            .synchronize(&running)
            .await
            .map_err(|e| resmgr::errors::chain(&e))?;
        self.runtime.apply(&updates);
        self.manager.synchronized().await;
        let restored = self.view.inventory().claims.len();
        Ok(vec![Change::Restarted {
            claims: restored,
            containers: running.len(),
        }])
    }

    fn diff(&self, before: &Observed, after: &Observed) -> Vec<Change> {
        let mut out = Vec::new();
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
                out.push(Change::Claimed {
                    claim: c.name.clone(),
                    devices: c.devices.clone(),
                    cpus: c.cpus.clone(),
                    mems: c.mems.clone(),
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
