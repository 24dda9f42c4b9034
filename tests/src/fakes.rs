//! Test doubles for the resource manager: a small deterministic policy ([`TestPolicy`]), the
//! runtimes, and claims and containers to feed them. (Claims are served by kube-dra's
//! in-memory `kube_dra::fake::StaticClaims`, which the simulator uses too; the Kubernetes API server
//! double is [`crate::fake_apiserver`].)
//!
//! # Which runtime for what
//!
//! Each `Runtime` double has one job; a test picks the one whose job it needs:
//!
//! | double | job | used by |
//! |---|---|---|
//! | [`FakeRuntime`] | records every call and its time, applies updates to a table, fails on demand (a whole call, a container, a container reported as failed) | the lifecycle tests, the kubelet end-to-end test |
//! | [`FileRuntime`] | keeps its containers in a file, so what it applied survives the crash of the process that called it | the crash-consistency test |
//! | [`StalledRuntime`] | does not answer until released, like a runtime holding its NRI lock | the lock-ordering test |
//!
//! Outside this package there are two more `Runtime`s, neither a test double: `NriRuntime`
//! (resmgr's `nri_plugin`, production) and the simulator's `SimRuntime` (plugin-bin's
//! `simulate::world`), part of `resmgr simulate`'s behaviour: it reports unknown containers as
//! failed and keeps memory nodes, as a real runtime does, and injects nothing.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
};

use cdi::ContainerEdits;
use kube_dra::fake::StaticClaims;
use kubelet_plugin::ClaimRef;
use policy::{
    Adjustment, Allocation, AllocationResult, Claim, ClaimAllocation, Container, ContainerUpdate,
    CpuSet, Device, Policy, PolicyError, Quantity, Resources,
};
use resmgr::{BoxFuture, Manager, ManagerConfig, Runtime, RuntimeError};

use crate::faults::FaultTable;

pub const DRIVER: &str = "test.resmgr.io";

/// A policy small enough to check by eye: CPUs `0..cpus`; a claim takes the highest free CPUs,
/// as many as its results consume; every container runs on the shared CPUs (all that no claim
/// holds), except containers of a pod a claim is reserved for, which run on the claim's CPUs.
/// Its snapshot is its claims. Claims whose UID starts with `bad` get edits CDI refuses (an env
/// entry without `=`), as a buggy policy would produce: the spec write fails on them. Like any
/// policy, it refuses a claim UID it holds when the allocation results differ. It refuses to
/// create containers whose name starts with `refused` ("does not fit").
#[derive(Debug, Clone, Default)]
pub struct TestPolicy {
    pub cpus: u32,
    /// By UID: the pods it is reserved for, its CPUs, and its results' devices.
    pub claims: BTreeMap<String, (Vec<String>, CpuSet, Vec<String>)>,
    pub containers: BTreeMap<String, Container>,
    /// Also keep the IDs of the containers it placed in its snapshot (as a policy with durable
    /// per-container state would): the snapshot is then `{"claims": …, "containers": […]}`.
    pub durable_containers: bool,
}

impl TestPolicy {
    pub fn new(cpus: u32) -> Self {
        Self {
            cpus,
            ..Self::default()
        }
    }

    fn shared(&self) -> CpuSet {
        let all: CpuSet = (0..self.cpus).collect();
        self.claims
            .values()
            .fold(all, |free, (_, c, _)| free.difference(c))
    }

    fn cpus_of(&self, c: &Container) -> CpuSet {
        self.claims
            .values()
            .find(|(pods, _, _)| pods.contains(&c.pod.uid))
            .map_or_else(|| self.shared(), |(_, cpus, _)| cpus.clone())
    }

    /// Updates for every container whose cpuset is not what it should be.
    fn ripple(&mut self) -> Vec<ContainerUpdate> {
        let mut updates = Vec::new();
        let ids: Vec<String> = self.containers.keys().cloned().collect();
        for id in ids {
            let want = self.cpus_of(&self.containers[&id]);
            let c = self.containers.get_mut(&id).unwrap();
            if c.cpus.as_ref() != Some(&want) {
                c.cpus = Some(want.clone());
                updates.push(ContainerUpdate {
                    container_id: id,
                    cpus: Some(want),
                    mems: None,
                });
            }
        }
        updates
    }
}

impl Policy for TestPolicy {
    fn name(&self) -> &str {
        "test"
    }

    fn restore(&mut self, snapshot: &serde_json::Value) -> Result<(), PolicyError> {
        let claims = if self.durable_containers {
            &snapshot["claims"]
        } else {
            snapshot
        };
        self.claims = serde_json::from_value(claims.clone())
            .map_err(|e| PolicyError::undecodable_snapshot(self.name(), e))?;
        Ok(())
    }

    fn snapshot(&self) -> serde_json::Value {
        let claims = serde_json::to_value(&self.claims).unwrap();
        if self.durable_containers {
            serde_json::json!({"claims": claims, "containers": self.containers.keys().collect::<Vec<_>>()})
        } else {
            claims
        }
    }

    fn sync(&mut self, containers: &[Container]) -> Result<Vec<ContainerUpdate>, PolicyError> {
        self.containers = containers
            .iter()
            .map(|c| (c.id.clone(), c.clone()))
            .collect();
        Ok(self.ripple())
    }

    fn allocate(&mut self, container: &Container) -> Result<Allocation, PolicyError> {
        if container.name.starts_with("refused") {
            return Err(PolicyError::DoesNotFit {
                subject: format!("container {}", container.name),
                reason: format!("needs more than the {} cpus of this node", self.cpus),
            });
        }
        let cpus = self.cpus_of(container);
        let mut c = container.clone();
        c.cpus = Some(cpus.clone());
        self.containers.insert(c.id.clone(), c);
        Ok(Allocation {
            adjustment: Adjustment {
                cpus: Some(cpus),
                ..Adjustment::default()
            },
            ..Allocation::default()
        })
    }

    fn update(&mut self, id: &str, _: &Resources) -> Result<Vec<ContainerUpdate>, PolicyError> {
        if !self.containers.contains_key(id) {
            return Err(PolicyError::UnknownContainer(id.into()));
        }
        Ok(Vec::new())
    }

    fn release(&mut self, id: &str) -> Result<Vec<ContainerUpdate>, PolicyError> {
        self.containers.remove(id);
        Ok(Vec::new())
    }

    fn devices(&self) -> Result<Vec<Device>, PolicyError> {
        Ok(Vec::new())
    }

    fn allocate_claim(&mut self, claim: &Claim) -> Result<ClaimAllocation, PolicyError> {
        let edits = |cpus: &CpuSet| {
            let env = if claim.uid.starts_with("bad") {
                "NOEQUALS".to_owned()
            } else {
                format!("DRA_CPUSET_{}={cpus}", claim.uid)
            };
            claim
                .results
                .iter()
                .map(|_| ContainerEdits::with_env([env.clone()]))
                .collect()
        };
        let devices: Vec<String> = claim.results.iter().map(|r| r.device.clone()).collect();
        if let Some((pods, _, held)) = self.claims.get_mut(&claim.uid)
            && held.is_empty()
        {
            // Adopted: learn what the spec did not say.
            pods.clone_from(&claim.reserved_for);
            held.clone_from(&devices);
        }
        if let Some((_, cpus, held)) = self.claims.get(&claim.uid) {
            if *held != devices {
                return Err(PolicyError::Invalid {
                    subject: format!("claim {}", claim.uid),
                    reason: format!("it holds devices {held:?}, now asked for {devices:?}"),
                });
            }
            return Ok(ClaimAllocation {
                edits: edits(cpus),
                ..ClaimAllocation::default()
            });
        }
        let want: u64 = claim
            .results
            .iter()
            .map(|r| r.consumed_capacity.get("cpu").map_or(1, |q| q.units_ceil()))
            .sum();
        let free = self.shared();
        if u64::try_from(free.len()).unwrap() <= want {
            return Err(PolicyError::DoesNotFit {
                subject: format!("claim {}", claim.uid),
                reason: format!("needs {want} CPUs, {} are free", free.len()),
            });
        }
        let cpus: CpuSet = free
            .iter()
            .rev()
            .take(usize::try_from(want).unwrap())
            .collect();
        self.claims.insert(
            claim.uid.clone(),
            (claim.reserved_for.clone(), cpus.clone(), devices),
        );
        Ok(ClaimAllocation {
            edits: edits(&cpus),
            updates: self.ripple(),
            warnings: Vec::new(),
            attributes: Vec::new(),
        })
    }

    /// Takes the CPUs of `DRA_CPUSET_<uid>` in the first edit; pods and devices unknown.
    fn adopt_claim(&mut self, uid: &str, edits: &[ContainerEdits]) -> Result<(), PolicyError> {
        let name = format!("DRA_CPUSET_{uid}=");
        let cpus = edits
            .first()
            .and_then(|e| e.env.iter().find_map(|v| v.strip_prefix(&name)))
            .and_then(|v| v.parse::<CpuSet>().ok())
            .ok_or_else(|| PolicyError::restore(format!("claim {uid}: no {name}<cpus>")))?;
        if !self.shared().is_superset(&cpus) {
            return Err(PolicyError::restore(format!(
                "claim {uid}: cpus {cpus} are not free"
            )));
        }
        self.claims
            .insert(uid.to_owned(), (Vec::new(), cpus, Vec::new()));
        Ok(())
    }

    fn release_claim(&mut self, uid: &str) -> Result<Vec<ContainerUpdate>, PolicyError> {
        if self.claims.remove(uid).is_none() {
            return Ok(Vec::new());
        }
        Ok(self.ripple())
    }

    fn claims(&self) -> Vec<String> {
        self.claims.keys().cloned().collect()
    }

    fn claim_cpus(&self, uid: &str) -> Option<CpuSet> {
        self.claims.get(uid).map(|(_, cpus, _)| cpus.clone())
    }
}

/// A runtime that applies updates to its own table of containers, records every call, and can be
/// told to fail or to hold calls: for tests of what the manager does with the runtime's answers.
/// Updates to containers it never saw are applied, not refused (use `refuse` for that).
#[derive(Debug, Default)]
pub struct FakeRuntime {
    pub state: Mutex<RuntimeState>,
    /// Notified after every call, whatever its outcome.
    pub called: tokio::sync::Notify,
    /// Notified (one permit) when a call arrives, before it waits for [`FakeRuntime::hold`].
    pub arrived: tokio::sync::Notify,
    /// Calls wait for this before they apply: a test holds it to keep a call in flight, as a
    /// real runtime's round trip does, while other tasks run.
    pub hold: tokio::sync::Mutex<()>,
}

#[derive(Debug, Default)]
pub struct RuntimeState {
    /// Applied cpusets by container.
    pub cpus: BTreeMap<String, CpuSet>,
    /// Every call, in order.
    pub calls: Vec<Vec<ContainerUpdate>>,
    /// Fail this many upcoming calls as a whole.
    pub fail_calls: usize,
    /// Containers whose updates the runtime refuses (as if gone), failing the call.
    pub refuse: BTreeSet<String>,
    /// Containers whose updates fail but were marked to be ignored: reported back as failed in
    /// a successful answer.
    pub report_failed: BTreeSet<String>,
    /// When each call arrived (tokio's clock, so paused-time tests see virtual time).
    pub call_times: Vec<tokio::time::Instant>,
    /// How many updates each call carried, counted as it arrived: before [`FakeRuntime::hold`],
    /// so a call abandoned while held counts too.
    pub arrivals: Vec<usize>,
    /// Containers being created and started: until their PostStartContainer the runtime skips
    /// their updates while reporting them applied, the worst of what containerd does (it does
    /// not know them until their PostCreateContainer, and then may write their updates into a
    /// spec their task was already made from) ([`FakeRuntime::creating`],
    /// [`FakeRuntime::created`], [`FakeRuntime::started`]).
    pub starting: BTreeSet<String>,
    /// Containers it is creating while it synchronizes a plugin, which that Synchronize leaves
    /// out, as CRI-O does ([`FakeRuntime::creating_unlisted`], [`FakeRuntime::listed`]).
    pub unlisted: BTreeSet<String>,
}

impl FakeRuntime {
    /// Waits until a call has arrived (and waits for [`FakeRuntime::hold`], if held). Fails the
    /// test instead of hanging when none comes: a test waiting for a delivery that a bug never
    /// starts must say so, not run into the harness's timeout.
    pub async fn call_arrives(&self) {
        tokio::time::timeout(std::time::Duration::from_secs(10), self.arrived.notified())
            .await
            .expect("no UpdateContainers call arrived within 10 s");
    }
}

impl Runtime for FakeRuntime {
    fn update_containers(
        &self,
        updates: Vec<ContainerUpdate>,
    ) -> BoxFuture<'_, Result<Vec<String>, RuntimeError>> {
        Box::pin(async move {
            self.state.lock().unwrap().arrivals.push(updates.len());
            self.arrived.notify_one();
            drop(self.hold.lock().await);
            let result = self.apply_call(updates);
            self.called.notify_waiters();
            result
        })
    }
}

impl FakeRuntime {
    fn apply_call(&self, updates: Vec<ContainerUpdate>) -> Result<Vec<String>, RuntimeError> {
        {
            let mut s = self.state.lock().unwrap();
            s.calls.push(updates.clone());
            s.call_times.push(tokio::time::Instant::now());
            if s.fail_calls > 0 {
                s.fail_calls -= 1;
                return Err(RuntimeError::Refused("injected failure".into()));
            }
            if updates.iter().any(|u| s.refuse.contains(&u.container_id)) {
                // Like containerd: a failed update fails the whole call, and whatever was
                // applied before it stays applied.
                let applied: Vec<&ContainerUpdate> = updates
                    .iter()
                    .take_while(|u| !s.refuse.contains(&u.container_id))
                    .collect();
                for u in applied {
                    if let Some(c) = &u.cpus {
                        s.cpus.insert(u.container_id.clone(), c.clone());
                    }
                }
                return Err(RuntimeError::Refused(
                    "NRI update of some containers failed".into(),
                ));
            }
            let mut failed = Vec::new();
            for u in &updates {
                if s.report_failed.contains(&u.container_id) {
                    failed.push(u.container_id.clone());
                } else if s.starting.contains(&u.container_id) {
                    // Skipped, and not reported.
                } else if let Some(c) = &u.cpus {
                    s.cpus.insert(u.container_id.clone(), c.clone());
                }
            }
            Ok(failed)
        }
    }
}

/// A claim of `cpus` CPUs from device `numa0`, reserved for pod `pod`.
pub fn claim(uid: &str, pod: &str, cpus: u64) -> Claim {
    Claim {
        uid: uid.into(),
        namespace: "default".into(),
        name: format!("claim-{uid}"),
        reserved_for: vec![pod.into()],
        results: vec![AllocationResult {
            request: "cpus/big".into(),
            pool: "node-a".into(),
            device: "numa0".into(),
            share_id: Some(format!("share-{uid}")),
            consumed_capacity: [("cpu".to_owned(), Quantity::from_units(cpus))].into(),
        }],
        config: Vec::new(),
        pod_claim_name: None,
    }
}

/// A claim of `cpus` CPUs from device `device`, reserved for pod `pod`.
pub fn claim_on(uid: &str, pod: &str, device: &str, cpus: u64) -> Claim {
    let mut c = claim(uid, pod, cpus);
    c.results[0].device = device.into();
    c
}

/// One socket of two NUMA nodes of 4 two-thread cores: numa0 is CPUs 0-7, numa1 8-15.
pub const TWO_NUMA: &str = "pack:1 numa:2 core:4 pu:2";

/// The real topology-aware policy on the synthetic machine `topology` (CPU 0 reserved), serving
/// our test driver.
pub fn topology_aware(topology: &str) -> Box<dyn Policy> {
    topology_aware_with(topology, policy::topology_aware::Exclusivity::default())
}

/// [`topology_aware`] with another choice of who gets CPUs of their own.
pub fn topology_aware_with(
    topology: &str,
    exclusivity: policy::topology_aware::Exclusivity,
) -> Box<dyn Policy> {
    let topology =
        policy::Topology::load(&policy::TopologySource::Synthetic(topology.into())).unwrap();
    let config = policy::Config {
        driver: DRIVER.into(),
        exclusivity,
        ..policy::Config::default()
    };
    Box::new(policy::TopologyAware::new(topology, config).unwrap())
}

pub fn claim_ref(uid: &str) -> ClaimRef {
    ClaimRef {
        namespace: "default".into(),
        name: format!("claim-{uid}"),
        uid: uid.into(),
    }
}

/// Prepares the claim `uid` alone and returns the error its answer carries: the request must be
/// admitted and the claim must fail (anything else fails the test, saying what came instead).
pub async fn prepare_error(m: &Manager, uid: &str) -> String {
    match m.prepare(&[claim_ref(uid)]).await {
        Ok(mut answers) => match answers.remove(uid) {
            Some(Err(e)) => stdx::errors::chain(&e),
            other => panic!("claim {uid}: expected its prepare to fail, got {other:?}"),
        },
        Err(e) => panic!("claim {uid}: the request was not admitted: {e}"),
    }
}

/// A running container of pod `pod`.
pub fn container(id: &str, pod: &str) -> Container {
    Container {
        id: id.into(),
        pod: policy::Pod {
            uid: pod.into(),
            namespace: "default".into(),
            name: pod.into(),
            qos: policy::QosClass::Burstable,
            annotations: BTreeMap::new(),
        },
        name: id.into(),
        resources: Resources::default(),
        annotations: BTreeMap::new(),
        cdi_devices: Vec::new(),
        env: Vec::new(),
        cpus: None,
        mems: None,
    }
}

/// A manager over temporary directories.
#[derive(Debug)]
pub struct Harness {
    pub dir: tempfile::TempDir,
    pub runtime: Arc<FakeRuntime>,
    pub claims: Arc<StaticClaims>,
    /// The faults of every manager the harness starts.
    pub faults: FaultTable,
    /// How its managers reconcile: as with DRA, our devices in pool `node-a` (where
    /// [`claim`]'s results are).
    pub reconcile: resmgr::ReconcileConfig,
}

impl Default for Harness {
    fn default() -> Self {
        Self::new()
    }
}

impl Harness {
    pub fn new() -> Self {
        Self {
            dir: tempfile::tempdir().unwrap(),
            runtime: Arc::new(FakeRuntime::default()),
            claims: Arc::new(StaticClaims::new()),
            faults: FaultTable::new(),
            reconcile: resmgr::ReconcileConfig {
                pool: Some("node-a".into()),
                ..resmgr::ReconcileConfig::default()
            },
        }
    }

    /// The manager settings the harness starts managers with.
    pub fn config(&self) -> ManagerConfig {
        ManagerConfig {
            faults: self.faults.handle(),
            reconcile: self.reconcile.clone(),
            ..ManagerConfig::new(DRIVER)
        }
    }

    pub fn state_dir(&self) -> PathBuf {
        self.dir.path().join("state")
    }

    pub fn cdi_dir(&self) -> PathBuf {
        self.dir.path().join("cdi")
    }

    pub fn start(&self, policy: TestPolicy) -> Result<Manager, resmgr::StartError> {
        self.start_with(Box::new(policy))
    }

    /// Starts a manager over any policy (the real one, for end-to-end checks of its rules).
    pub fn start_with(&self, policy: Box<dyn Policy>) -> Result<Manager, resmgr::StartError> {
        Manager::start(
            self.config(),
            policy,
            resmgr::state::StateFile::new(self.state_dir()),
            cdi::SpecStore::new(self.cdi_dir(), DRIVER).unwrap(),
            self.runtime.clone(),
            self.claims.clone(),
        )
    }

    /// Starts a manager, synchronizes it with `containers`, and opens the gate.
    pub async fn ready(&self, policy: TestPolicy, containers: &[Container]) -> Manager {
        self.ready_with(Box::new(policy), containers).await
    }

    /// [`Harness::ready`] over any policy.
    pub async fn ready_with(&self, policy: Box<dyn Policy>, containers: &[Container]) -> Manager {
        let m = self.start_with(policy).unwrap();
        let updates = m.synchronize(containers).await.unwrap();
        self.runtime.apply_reply(&updates);
        m.synchronized().await;
        m
    }

    /// The claim UIDs with a spec on disk.
    pub fn specs(&self) -> Vec<String> {
        cdi::SpecStore::new(self.cdi_dir(), DRIVER)
            .unwrap()
            .claims()
            .unwrap()
            .into_iter()
            .map(|u| u.to_string())
            .collect()
    }

    /// The claims the state file accounts for.
    pub fn saved_claims(&self) -> Vec<String> {
        saved_claims(&self.state_dir())
    }

    /// Makes every state save fail until [`Harness::mend_state_saves`]: the state directory is
    /// moved aside, intact, and a file put in its place, so a save cannot create it. (Tests run as
    /// root, which permissions do not stop, and the save's temporary file has a random name.)
    pub fn break_state_saves(&self) {
        let dir = self.state_dir();
        if dir.exists() {
            std::fs::rename(&dir, self.state_aside()).unwrap();
        }
        std::fs::write(&dir, b"not a directory").unwrap();
    }

    /// Undoes [`Harness::break_state_saves`]: the state directory is back as it was.
    pub fn mend_state_saves(&self) {
        std::fs::remove_file(self.state_dir()).unwrap();
        if self.state_aside().exists() {
            std::fs::rename(self.state_aside(), self.state_dir()).unwrap();
        }
    }

    fn state_aside(&self) -> PathBuf {
        self.dir.path().join("state.aside")
    }
}

impl FakeRuntime {
    /// Applies updates an NRI reply carried (skipping the containers not started).
    pub fn apply_reply(&self, updates: &[ContainerUpdate]) {
        let mut s = self.state.lock().unwrap();
        for u in updates {
            if s.starting.contains(&u.container_id) {
                continue;
            }
            if let Some(c) = &u.cpus {
                s.cpus.insert(u.container_id.clone(), c.clone());
            }
        }
    }

    /// The runtime starts creating `id`: it calls CreateContainer, and skips updates of the
    /// container until [`Self::started`].
    pub fn creating(&self, id: &str) {
        self.state.lock().unwrap().starting.insert(id.to_owned());
    }

    /// [`Self::creating`] as CRI-O does while it synchronizes a plugin: it lists the containers
    /// of its server, where `id` joins only once created, after the list is made, so the
    /// Synchronize under way leaves it out ([`Self::listed`]) until [`Self::joined`].
    /// (containerd holds a plugin's synchronization while it creates a container, and lists
    /// it as created.)
    pub fn creating_unlisted(&self, id: &str) {
        let mut s = self.state.lock().unwrap();
        s.starting.insert(id.to_owned());
        s.unlisted.insert(id.to_owned());
    }

    /// Whether a Synchronize now lists container `id` (see [`Self::creating_unlisted`]).
    pub fn listed(&self, id: &str) -> bool {
        !self.state.lock().unwrap().unlisted.contains(id)
    }

    /// The containers a Synchronize left out are created, in the runtime's list from now on;
    /// next it announces each (PostCreateContainer).
    pub fn joined(&self) {
        self.state.lock().unwrap().unlisted.clear();
    }

    /// The runtime has created `id` on `cpus` (the adjustment of its creation, `None`: where it
    /// asked).
    pub fn created(&self, id: &str, cpus: Option<&CpuSet>) {
        if let Some(cpus) = cpus {
            self.state
                .lock()
                .unwrap()
                .cpus
                .insert(id.to_owned(), cpus.clone());
        }
    }

    /// The runtime has started `id` on what it was created on and applies its updates from now
    /// on; next it sends PostStartContainer.
    pub fn started(&self, id: &str) {
        self.state.lock().unwrap().starting.remove(id);
    }

    pub fn cpus(&self, id: &str) -> Option<String> {
        self.state
            .lock()
            .unwrap()
            .cpus
            .get(id)
            .map(ToString::to_string)
    }
}

/// The claims a state file accounts for (empty when there is none): the manager's records,
/// which it commits together with the policy's claims, whatever the policy.
pub fn saved_claims(state_dir: &Path) -> Vec<String> {
    match std::fs::read(state_dir.join("state.json")) {
        Ok(bytes) => {
            let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
            v["claims"].as_object().unwrap().keys().cloned().collect()
        }
        Err(_) => Vec::new(),
    }
}

/// The containers a [`FileRuntime`] runs: pod UID and current cpuset, by container ID.
pub type RuntimeFile = BTreeMap<String, (String, CpuSet)>;

/// A runtime whose containers live in a JSON file, so that what it applied survives the crash of
/// the process that called it, as a real runtime's state survives ours.
#[derive(Debug)]
pub struct FileRuntime {
    pub path: PathBuf,
}

impl FileRuntime {
    pub fn read(&self) -> RuntimeFile {
        serde_json::from_slice(&std::fs::read(&self.path).unwrap()).unwrap()
    }

    pub fn write(&self, containers: &RuntimeFile) {
        let tmp = self.path.with_extension("tmp");
        std::fs::write(&tmp, serde_json::to_vec(containers).unwrap()).unwrap();
        std::fs::rename(&tmp, &self.path).unwrap();
    }

    /// Applies updates (from a reply or an UpdateContainers call).
    pub fn apply(&self, updates: &[ContainerUpdate]) {
        let mut containers = self.read();
        for u in updates {
            if let (Some(c), Some(cpus)) = (containers.get_mut(&u.container_id), &u.cpus) {
                c.1 = cpus.clone();
            }
        }
        self.write(&containers);
    }

    /// The running containers, as Synchronize reports them.
    pub fn containers(&self) -> Vec<Container> {
        self.read()
            .into_iter()
            .map(|(id, (pod, cpus))| Container {
                cpus: Some(cpus),
                ..container(&id, &pod)
            })
            .collect()
    }
}

impl Runtime for FileRuntime {
    fn update_containers(
        &self,
        updates: Vec<ContainerUpdate>,
    ) -> BoxFuture<'_, Result<Vec<String>, RuntimeError>> {
        Box::pin(async move {
            self.apply(&updates);
            Ok(Vec::new())
        })
    }
}

/// A runtime whose `UpdateContainers` does not answer until released, like a runtime that holds
/// its NRI lock while an event is in flight.
#[derive(Debug, Default)]
pub struct StalledRuntime {
    /// Notified when a call has arrived.
    pub called: tokio::sync::Notify,
    /// Notify to let the calls answer.
    pub release: tokio::sync::Notify,
}

impl Runtime for StalledRuntime {
    fn update_containers(
        &self,
        _updates: Vec<ContainerUpdate>,
    ) -> BoxFuture<'_, Result<Vec<String>, RuntimeError>> {
        Box::pin(async move {
            self.called.notify_one();
            self.release.notified().await;
            Ok(Vec::new())
        })
    }
}
