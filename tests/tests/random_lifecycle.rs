//! The whole manager under random concurrent kubelet calls, runtime events and faults, checked
//! against the lifecycle's invariants after every step.
//!
//! The real topology-aware policy, the real state file and spec store (on a tmpfs when there is
//! one), a scripted runtime, claims from an API server double. Each step starts a few
//! operations at once — a pod's prepare (and sometimes a retry overlapping it), containers
//! created, a pod stopped and its claims unprepared, a container resized, a retry of an
//! unprepare that failed, the background retry (a failed save, undelivered updates) — after arming faults: `UpdateContainers`
//! failing as a whole or for one container, a state save, a spec or device metadata write or removal failing (also
//! after the spec landed), a slow disk, and a crash at a named crash or disk point followed by a
//! restart (sometimes with the state directory wiped, so the claims must be adopted from their
//! specs). Reconciliation gets steps of its own: a stray spec planted while the agent is down
//! (readable, granting free CPUs or a held claim's; or unreadable), with or without a running
//! container of a pod no kubelet claim knows of that uses it; a held claim deleted or
//! deallocated in the API server while its pods may run; a restart with an older state file
//! restored; reconcile passes, within the grace and after it (virtual time is advanced past the
//! seed's grace; a zero grace releases at the second pass). The runtime creates containers while
//! no agent is connected, and either lists them as created at the next agent's Synchronize
//! (containerd) or leaves them out of it, as CRI-O does with a container it is creating while it
//! synchronizes a plugin, and announces them afterwards (PostCreateContainer, which sometimes
//! misses the agent), starting them among the next step's operations. After every step:
//!
//! 1. every CDI spec on disk belongs to a claim the state file on disk accounts for, or to a
//!    stray the agent holds from what its users show (unreadable) or reports contested, and
//!    every file it mounts (its claim's device metadata, written and removed with faults of
//!    its own) is on disk;
//! 2. no CPU is in two claims (adopted ones included), in two specs on disk, or in a claim and
//!    an exclusive container, unless the agent reports a claim contested, and then every
//!    prepare is refused with `AdmitError::Contested` and the claim gate is closed;
//! 3. every claim whose prepare answered OK is held, with the same CPUs and a spec, until the
//!    kubelet unprepares it (or, deleted in the API server, reconciliation releases it), and no
//!    container of another pod runs on its CPUs (a container created while no agent was connected
//!    runs on every CPU until the agent's first update of it lands, which only the next settle
//!    guarantees: until then the claims granted before it was created are the ones it may share
//!    CPUs with); unless an older state restored gives its CPUs
//!    to a claim released since: then the restored claim gives way if it has no spec and
//!    nothing uses it, and otherwise the spec is reported contested, and the operator's
//!    recovery (the kubelet's unprepares, the stale claim released after the grace, a
//!    restart) takes it back;
//! 4. every few steps, and at the end: once faults clear (and the runtime has started what it
//!    was starting), every pending update is delivered and every running container, those its
//!    Synchronize did not list included, runs where the policy placed it;
//! 5. at the end, once every pod is gone and every claim unprepared: nothing is held, no spec is
//!    left, every CPU is shared again;
//! 6. reconciliation never releases or sweeps a claim the API server allocates to this node
//!    (a claim that gives way is one the kubelet was never answered OK for: invariant 3);
//! 7. a reconcile pass releases only claims that were unwanted (used by no container, allocated
//!    nowhere here) for the grace at least, and after a pass past the grace no unconfirmed
//!    claim is left that is unwanted.
//!
//! Runs are seeded and reproducible: one current-thread runtime with paused time per seed, disk
//! work run inline, every interleaving point (runtime calls, claim reads, slow disks) drawn from
//! the seed. A failure names the seed and the step and the steps before it, and
//! `RESMGR_SEED=<seed>` reruns just that seed. Without settings the test runs a bounded set of
//! seeds (CI: `SEEDS`); `RESMGR_SOAK_SECONDS=<n>` keeps drawing new seeds for that long (`cargo
//! xtask soak --minutes N`), from a first seed past the bounded set that differs from run to run
//! (printed; `RESMGR_FIRST_SEED` sets it), and `RESMGR_STEPS=<n>` sets the steps per seed.
//! `RESMGR_LOG_LINES=<n>` prints that many lines of a failing seed's log (40 by default).

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use cdi::ContainerEdits;
use integration_tests::{
    fakes::{DRIVER, FakeRuntime, claim_on},
    faults::{Fault, FaultTable, Point},
    on_disk::{disjoint, saved_claims},
    rng::Rng,
    settings::{clock_seed, env_u64},
};
use kube_dra::{ClaimReadError, ClaimReader, fake::StaticClaims};
use kubelet_plugin::ClaimRef;
use policy::{
    Claim, ClaimAllocation, Container, ContainerUpdate, CpuSet, Device, Inventory, Policy,
    PolicyError, QosClass, Resources, Topology, TopologyAware, TopologySource,
    topology_aware::{ClaimCpus, Exclusivity, Grant},
};
use resmgr::{
    AdmitError, BoxFuture, Manager, ManagerConfig, Outcome as Done, ReconcileConfig,
    ReconcileReport, Runtime, RuntimeError, state::StateFile,
};

/// Two sockets of one NUMA node each, 4 two-thread cores per node: numa0 is CPUs 0-7, numa1
/// 8-15; CPU 0 reserved.
const MACHINE: &str = "pack:2 numa:1 core:4 pu:2";
const NODES: [&str; 2] = ["numa0", "numa1"];
const ALL_CPUS: &str = "0-15";
const RESERVED: &str = "0";

/// Seeds (and steps each) of the bounded run, the one `cargo test` and CI do: seeds 0 to
/// `SEEDS - 1`. A soak (`RESMGR_SOAK_SECONDS`) starts past them, from a seed drawn from the clock
/// unless `RESMGR_FIRST_SEED` names one, so that each soak explores seeds no run has tried.
const SEEDS: u64 = 500;
const STEPS: usize = 120;

// ============================================================================================
// Randomness
// ============================================================================================

/// The seed's randomness for what runs inside the manager's calls (how long a runtime call or a
/// claim read is in flight), shared by the doubles.
type SharedRng = Arc<Mutex<Rng>>;

async fn yield_some(rng: &SharedRng, most: u64) {
    let n = rng.lock().unwrap().below(most + 1);
    for _ in 0..n {
        tokio::task::yield_now().await;
    }
}

// ============================================================================================
// Doubles
// ============================================================================================

/// The policy, shared so that the test can look at it between steps.
#[derive(Debug, Clone)]
struct Shared(Arc<Mutex<TopologyAware>>);

impl Shared {
    fn new(exclusivity: &Exclusivity) -> Self {
        let topology = Topology::load(&TopologySource::Synthetic(MACHINE.into())).unwrap();
        let config = policy::Config {
            driver: DRIVER.into(),
            exclusivity: exclusivity.clone(),
            ..policy::Config::default()
        };
        Self(Arc::new(Mutex::new(
            TopologyAware::new(topology, config).unwrap(),
        )))
    }

    fn get(&self) -> std::sync::MutexGuard<'_, TopologyAware> {
        self.0.lock().unwrap()
    }
}

impl Policy for Shared {
    fn name(&self) -> &str {
        "topology-aware"
    }
    fn restore(&mut self, snapshot: &serde_json::Value) -> Result<(), PolicyError> {
        self.get().restore(snapshot)
    }
    fn snapshot(&self) -> serde_json::Value {
        self.get().snapshot()
    }
    fn sync(&mut self, containers: &[Container]) -> Result<Vec<ContainerUpdate>, PolicyError> {
        self.get().sync(containers)
    }
    fn allocate(&mut self, container: &Container) -> Result<policy::Allocation, PolicyError> {
        self.get().allocate(container)
    }
    fn adopt_container(
        &mut self,
        container: &Container,
    ) -> Result<Vec<ContainerUpdate>, PolicyError> {
        self.get().adopt_container(container)
    }
    fn update(
        &mut self,
        id: &str,
        resources: &Resources,
    ) -> Result<Vec<ContainerUpdate>, PolicyError> {
        self.get().update(id, resources)
    }
    fn release(&mut self, id: &str) -> Result<Vec<ContainerUpdate>, PolicyError> {
        self.get().release(id)
    }
    fn devices(&self) -> Result<Vec<Device>, PolicyError> {
        self.get().devices()
    }
    fn allocate_claim(&mut self, claim: &Claim) -> Result<ClaimAllocation, PolicyError> {
        self.get().allocate_claim(claim)
    }
    fn adopt_claim(&mut self, uid: &str, edits: &[ContainerEdits]) -> Result<(), PolicyError> {
        self.get().adopt_claim(uid, edits)
    }
    fn release_claim(&mut self, uid: &str) -> Result<Vec<ContainerUpdate>, PolicyError> {
        self.get().release_claim(uid)
    }
    fn claims(&self) -> Vec<String> {
        self.get().claims()
    }
    fn claim_cpus(&self, uid: &str) -> Option<CpuSet> {
        self.get().claim_cpus(uid)
    }
    fn inventory(&self) -> Inventory {
        self.get().inventory()
    }
    // Forwarded, so that the manager's change tracking by counters is what the soak checks.
    fn generations(&self) -> policy::Generations {
        self.get().generations()
    }
}

/// The scripted runtime, whose calls stay in flight for a seeded number of scheduler turns.
#[derive(Debug)]
struct SlowRuntime {
    inner: Arc<FakeRuntime>,
    rng: SharedRng,
}

impl Runtime for SlowRuntime {
    fn update_containers(
        &self,
        updates: Vec<ContainerUpdate>,
    ) -> BoxFuture<'_, Result<Vec<String>, RuntimeError>> {
        Box::pin(async move {
            yield_some(&self.rng, 6).await;
            self.inner.update_containers(updates).await
        })
    }
}

/// The API server, whose answers take a seeded number of scheduler turns.
#[derive(Debug)]
struct SlowClaims {
    inner: Arc<StaticClaims>,
    rng: SharedRng,
}

impl ClaimReader for SlowClaims {
    fn get_claim<'a>(
        &'a self,
        claim: &'a ClaimRef,
    ) -> BoxFuture<'a, Result<Claim, ClaimReadError>> {
        Box::pin(async move {
            yield_some(&self.rng, 2).await;
            self.inner.get_claim(claim).await
        })
    }

    // Forwarded: the default cannot look up a claim taken back from its spec (no name), which
    // the real reader finds by UID.
    fn find_claim<'a>(
        &'a self,
        claim: &'a ClaimRef,
    ) -> BoxFuture<'a, Result<Option<Claim>, ClaimReadError>> {
        Box::pin(async move {
            yield_some(&self.rng, 2).await;
            self.inner.find_claim(claim).await
        })
    }
}

// ============================================================================================
// The world: what the kubelet and the runtime know
// ============================================================================================

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Shared,
    Exclusive(u64),
    Claims,
}

#[derive(Debug, Clone)]
struct Pod {
    uid: String,
    kind: Kind,
    claims: Vec<String>,
    /// The claims a prepare for this pod answered OK (each pod of a shared claim prepares it).
    prepared: BTreeSet<String>,
    /// Containers running.
    containers: Vec<String>,
    /// Containers started so far (they are never started twice).
    started: bool,
    /// The stray spec its containers use (they run from an earlier agent's grant, which no
    /// kubelet knows of).
    stray: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ClaimState {
    /// The kubelet has not had an OK answer for it.
    Unprepared,
    /// The kubelet had an OK answer and has not tried to unprepare it since.
    Prepared,
    /// Its pods are gone; the kubelet unprepares it until that answers OK.
    Unpreparing,
}

#[derive(Debug, Clone)]
struct ClaimModel {
    claim: Claim,
    state: ClaimState,
    /// What the prepare that answered OK granted, from its spec.
    granted: Option<CpuSet>,
    /// Deleted from the API server (or deallocated) while held: reconciliation may release it
    /// once nothing uses it.
    deleted: bool,
}

/// A stray CDI spec planted while the agent was down.
#[derive(Debug, Clone)]
struct StrayModel {
    unreadable: bool,
}

/// What an operation came back with, applied to the world after the step.
#[derive(Debug)]
enum Outcome {
    Prepared {
        pod: String,
        answers: BTreeMap<String, bool>,
    },
    Started {
        pod: String,
        containers: Vec<Container>,
    },
    /// Containers the last Synchronize did not list, started, with their pods.
    StartedUnlisted(Vec<(String, Container)>),
    Stopped {
        pod: String,
        unprepared: Option<BTreeMap<String, bool>>,
    },
    Unprepared {
        answers: BTreeMap<String, bool>,
    },
    Nothing,
}

impl Outcome {
    /// One line for the failure report.
    fn summary(&self) -> String {
        match self {
            Self::Prepared { answers, .. } | Self::Unprepared { answers } => format!("{answers:?}"),
            Self::Started { containers, .. } => containers
                .iter()
                .map(|c| {
                    format!(
                        "{} on {}",
                        c.id,
                        c.cpus.as_ref().map(ToString::to_string).unwrap_or_default()
                    )
                })
                .collect::<Vec<_>>()
                .join(", "),
            Self::StartedUnlisted(started) => format!("{} started", started.len()),
            Self::Stopped { unprepared, .. } => format!("stopped, unprepared {unprepared:?}"),
            Self::Nothing => "done".into(),
        }
    }
}

struct World {
    rng: Rng,
    shared_rng: SharedRng,
    dir: tempfile::TempDir,
    runtime: Arc<FakeRuntime>,
    api: Arc<StaticClaims>,
    policy: Shared,
    /// The agent; `None` only while it restarts.
    manager: Option<Arc<Manager>>,
    faults: FaultTable,
    /// Whether the runtime reports CDI devices (containerd ≥ 2.3) or only the environment.
    reports_cdi_devices: bool,
    /// Who gets CPUs of their own: only claims, or claims from a partition and Guaranteed
    /// containers from the rest.
    exclusivity: Exclusivity,
    pods: BTreeMap<String, Pod>,
    claims: BTreeMap<String, ClaimModel>,
    /// Running containers as the runtime knows them (their cpus are the runtime's).
    containers: BTreeMap<String, Container>,
    next_id: u64,
    log: Vec<String>,
    stats: Stats,
    /// The reconciliation grace of the seed's agents.
    grace: Duration,
    /// Copies of earlier state files, for restores of an older backup.
    older_states: Vec<Vec<u8>>,
    /// Stray specs planted, by UID.
    strays: BTreeMap<String, StrayModel>,
    /// Whether the agent reported a contested claim at the start of the step.
    contested: bool,
    /// When a reconcile pass of this agent first could have found each unconfirmed claim
    /// unwanted (used by nothing, allocated nowhere here), by the world's account.
    unwanted_since: BTreeMap<String, tokio::time::Instant>,
    /// Containers the runtime created while no agent was connected and is starting when the
    /// next agent synchronizes, with their pods.
    gap: Vec<(String, Container)>,
    /// Containers the runtime created while the last agent synchronized, left out of its list
    /// and announced to it since, not started yet, with their pods: the next step starts them
    /// among its operations, a settle at once.
    unlisted: Vec<(String, Container)>,
    /// Containers created while no agent was connected, until a settle has checked that they
    /// run where the agent placed them: the claims answered OK before they were created (see
    /// invariant 3).
    from_gap: BTreeMap<String, BTreeSet<String>>,
}

#[derive(Debug, Default, Clone, Copy)]
struct Stats {
    steps: u64,
    operations: u64,
    prepares_ok: u64,
    prepares_failed: u64,
    unprepares_ok: u64,
    unprepares_failed: u64,
    containers_started: u64,
    faults: u64,
    crashes: u64,
    wiped_restarts: u64,
    restarts: u64,
    strays: u64,
    contested: u64,
    deleted_claims: u64,
    restored_states: u64,
    reconcile_passes: u64,
    adopted: u64,
    swept: u64,
    set_aside: u64,
    held_unreadable: u64,
    released: u64,
    gave_way: u64,
    /// Containers created while no agent was connected that the next Synchronize listed, and
    /// that it left out (and of those, whose PostCreateContainer missed the agent).
    gap_listed: u64,
    gap_unlisted: u64,
    unlisted_unannounced: u64,
}

impl Stats {
    fn add(&mut self, o: &Stats) {
        self.steps += o.steps;
        self.operations += o.operations;
        self.prepares_ok += o.prepares_ok;
        self.prepares_failed += o.prepares_failed;
        self.unprepares_ok += o.unprepares_ok;
        self.unprepares_failed += o.unprepares_failed;
        self.containers_started += o.containers_started;
        self.faults += o.faults;
        self.crashes += o.crashes;
        self.wiped_restarts += o.wiped_restarts;
        self.restarts += o.restarts;
        self.strays += o.strays;
        self.contested += o.contested;
        self.deleted_claims += o.deleted_claims;
        self.restored_states += o.restored_states;
        self.reconcile_passes += o.reconcile_passes;
        self.adopted += o.adopted;
        self.swept += o.swept;
        self.set_aside += o.set_aside;
        self.held_unreadable += o.held_unreadable;
        self.released += o.released;
        self.gave_way += o.gave_way;
        self.gap_listed += o.gap_listed;
        self.gap_unlisted += o.gap_unlisted;
        self.unlisted_unannounced += o.unlisted_unannounced;
    }

    /// Counts what an agent's reconciliation did.
    fn count(&mut self, report: &ReconcileReport) {
        let n = |o| report.counts.get(&o).copied().unwrap_or(0);
        self.adopted += n(Done::Adopted);
        self.swept += n(Done::Swept);
        self.set_aside += n(Done::SetAside);
        self.held_unreadable += n(Done::HeldUnreadable);
        self.released += n(Done::Released);
        self.gave_way += n(Done::GaveWay);
    }
}

fn scratch_dir() -> tempfile::TempDir {
    // fsync on a tmpfs is cheap; the durability of the disk is not what this test checks.
    match tempfile::tempdir_in("/dev/shm") {
        Ok(dir) => dir,
        Err(_) => tempfile::tempdir().unwrap(),
    }
}

fn container(id: &str, pod: &Pod) -> Container {
    let (qos, resources) = match pod.kind {
        Kind::Exclusive(n) => (
            QosClass::Guaranteed,
            Resources {
                cpu_request_milli: n * 1000,
                cpu_limit_milli: Some(n * 1000),
                ..Resources::default()
            },
        ),
        Kind::Shared | Kind::Claims => (
            QosClass::Burstable,
            Resources {
                cpu_request_milli: 100,
                ..Resources::default()
            },
        ),
    };
    Container {
        id: id.into(),
        pod: policy::Pod {
            uid: pod.uid.clone(),
            namespace: "default".into(),
            name: pod.uid.clone(),
            qos,
            annotations: BTreeMap::new(),
        },
        name: id.into(),
        resources,
        annotations: BTreeMap::new(),
        cdi_devices: Vec::new(),
        env: Vec::new(),
        cpus: None,
        mems: None,
    }
}

fn start_manager(
    dir: &std::path::Path,
    policy: Shared,
    faults: &FaultTable,
    runtime: Arc<FakeRuntime>,
    api: Arc<StaticClaims>,
    rng: &SharedRng,
    grace: Duration,
) -> Result<Manager, resmgr::StartError> {
    Manager::start(
        ManagerConfig {
            faults: faults.handle(),
            // As with DRA: claim_on allocates in pool node-a.
            reconcile: ReconcileConfig {
                pool: Some("node-a".into()),
                grace,
                ..ReconcileConfig::default()
            },
            metadata: Some(resmgr::metadata::MetadataStore::new(
                dir.join("metadata"),
                DRIVER,
                kube_dra::metadata::MetadataVersion::ALL.to_vec(),
            )),
            ..ManagerConfig::new(DRIVER)
        },
        Box::new(policy),
        StateFile::new(dir.join("state")),
        cdi::SpecStore::new(dir.join("cdi"), DRIVER).unwrap(),
        Arc::new(SlowRuntime {
            inner: runtime,
            rng: rng.clone(),
        }),
        Arc::new(SlowClaims {
            inner: api,
            rng: rng.clone(),
        }),
    )
}

fn fresh_faults() -> FaultTable {
    let faults = FaultTable::new();
    faults.run_inline();
    faults
}

impl World {
    async fn new(seed: u64) -> Self {
        let mut rng = Rng(seed);
        let shared_rng = Arc::new(Mutex::new(Rng(rng.next_u64())));
        let dir = scratch_dir();
        let runtime = Arc::new(FakeRuntime::default());
        let api = Arc::new(StaticClaims::new());
        let exclusivity = if rng.chance(50) {
            Exclusivity::Claims
        } else {
            Exclusivity::Partition(ClaimCpus::Set("4-7,12-15".parse().unwrap()))
        };
        let policy = Shared::new(&exclusivity);
        let faults = fresh_faults();
        // A zero grace releases at the second pass that finds a claim unwanted.
        let grace = if rng.chance(30) {
            Duration::ZERO
        } else {
            Duration::from_secs(90)
        };
        let manager = start_manager(
            dir.path(),
            policy.clone(),
            &faults,
            runtime.clone(),
            api.clone(),
            &shared_rng,
            grace,
        )
        .unwrap();
        let reports_cdi_devices = rng.chance(50);
        let world = Self {
            rng,
            shared_rng,
            dir,
            runtime,
            api,
            policy,
            manager: Some(Arc::new(manager)),
            faults,
            reports_cdi_devices,
            exclusivity,
            pods: BTreeMap::new(),
            claims: BTreeMap::new(),
            containers: BTreeMap::new(),
            next_id: 0,
            log: Vec::new(),
            stats: Stats::default(),
            grace,
            older_states: Vec::new(),
            strays: BTreeMap::new(),
            contested: false,
            unwanted_since: BTreeMap::new(),
            gap: Vec::new(),
            unlisted: Vec::new(),
            from_gap: BTreeMap::new(),
        };
        let updates = world.m().synchronize(&[]).await.unwrap();
        world.runtime.apply_reply(&updates);
        world.m().synchronized().await;
        world
    }

    /// The agent.
    fn m(&self) -> Arc<Manager> {
        // Only `restart` takes it, and puts a new one back before it returns Ok.
        self.manager.clone().expect("the agent runs between steps")
    }

    fn id(&mut self, prefix: &str) -> String {
        self.next_id += 1;
        format!("{prefix}{}", self.next_id)
    }

    fn specs_dir(&self) -> cdi::SpecStore {
        cdi::SpecStore::new(self.dir.path().join("cdi"), DRIVER).unwrap()
    }

    fn state_dir(&self) -> std::path::PathBuf {
        self.dir.path().join("state")
    }

    // ----------------------------------------------------------------------------------------
    // One step
    // ----------------------------------------------------------------------------------------

    async fn step(&mut self, step: usize) -> Result<(), String> {
        self.stats.steps += 1;
        self.contested = self.m().contested().is_some();
        if self.contested {
            self.stats.contested += 1;
            self.contested_refuses().await?;
            if self.rng.chance(30) {
                return self.recover_contested().await;
            }
        }
        if self.rng.chance(3) {
            self.delete_claim();
        }
        self.arm_faults();
        let ops = 1 + self.rng.index(5);
        let mut tasks: Vec<(String, tokio::task::JoinHandle<Outcome>)> = Vec::new();
        let mut busy_pods = BTreeSet::new();
        if let Some(start) = self.start_unlisted(&mut busy_pods) {
            tasks.push(start);
        }
        for _ in 0..ops {
            if let Some((what, task)) = self.operation(&mut busy_pods) {
                tasks.push((what, task));
            }
        }
        self.stats.operations += tasks.len() as u64;
        let mut outcomes = Vec::new();
        for (what, task) in tasks {
            // Virtual time: a hang shows as this limit passing at once.
            match tokio::time::timeout(Duration::from_secs(3600), task).await {
                Ok(Ok(outcome)) => outcomes.push((what, outcome)),
                Ok(Err(e)) => return Err(format!("{what}: the operation panicked: {e}")),
                Err(_) => return Err(format!("{what}: the operation did not finish")),
            }
        }
        let mut crashed = self.faults.crashed_at();
        for (what, outcome) in outcomes {
            self.log.push(format!("  {what} -> {}", outcome.summary()));
            if self.contested
                && let Outcome::Prepared { answers, .. } = &outcome
                && answers.values().any(|ok| *ok)
            {
                return Err(format!(
                    "{what} answered OK while a claim is contested: {answers:?}"
                ));
            }
            self.apply(outcome);
        }
        self.check_disk()
            .await
            .map_err(|e| format!("after the operations: {e}"))?;
        if crashed.is_none() && self.rng.chance(8) {
            // Within the grace, unless time passed it (a slow disk is virtual time too).
            self.log.push("  reconcile".into());
            self.reconcile_pass()
                .await
                .map_err(|e| format!("reconciling: {e}"))?;
            crashed = self.faults.crashed_at();
        }
        if let Some(point) = crashed {
            self.stats.crashes += 1;
            self.log.push(format!("  crashed at {point}"));
            let wipe = self.rng.chance(25);
            self.restart(wipe).await?;
            self.check_disk()
                .await
                .map_err(|e| format!("after the restart: {e}"))?;
        } else if self.rng.chance(2) {
            let wipe = self.rng.chance(50);
            self.log.push(format!("  restart (state wiped: {wipe})"));
            self.graceful_stop().await?;
            if self.rng.chance(60) {
                for _ in 0..1 + self.rng.index(2) {
                    self.create_in_the_gap();
                }
            }
            self.restart(wipe).await?;
            self.check_disk()
                .await
                .map_err(|e| format!("after the restart: {e}"))?;
        } else if self.rng.chance(4) {
            // While the agent is down an earlier agent's spec turns up (a restored backup, a
            // failed cleanup, a manual copy).
            self.graceful_stop().await?;
            self.plant_stray();
            self.restart(false).await?;
            self.check_disk()
                .await
                .map_err(|e| format!("after a restart with a stray spec: {e}"))?;
        } else if !self.older_states.is_empty() && self.rng.chance(2) {
            self.graceful_stop().await?;
            let older = self.rng.pick(&self.older_states).unwrap().clone();
            self.log
                .push("  restart with an older state file restored".into());
            self.stats.restored_states += 1;
            std::fs::write(self.state_dir().join("state.json"), older)
                .map_err(|e| e.to_string())?;
            self.restart(false).await?;
            self.check_disk()
                .await
                .map_err(|e| format!("after restoring an older state: {e}"))?;
        }
        if self.rng.chance(6) {
            self.reconcile_past_grace()
                .await
                .map_err(|e| format!("reconciling past the grace: {e}"))?;
        }
        if self.rng.chance(5)
            && let Ok(bytes) = std::fs::read(self.state_dir().join("state.json"))
        {
            // A backup an operator may restore later.
            if self.older_states.len() >= 4 {
                self.older_states.remove(0);
            }
            self.older_states.push(bytes);
        }
        if step % 10 == 9 {
            self.settle().await.map_err(|e| format!("settling: {e}"))?;
        }
        Ok(())
    }

    /// A graceful stop: what is armed does not fire any more, and the state is saved.
    async fn graceful_stop(&mut self) -> Result<(), String> {
        self.faults.disarm_all();
        self.m().save_state().await.map_err(|e| e.to_string())
    }

    // ----------------------------------------------------------------------------------------
    // Reconciliation
    // ----------------------------------------------------------------------------------------

    /// CPUs no claim holds and no exclusive container runs on.
    fn free_cpus(&self) -> CpuSet {
        let policy = self.policy.get();
        let mut free = ALL_CPUS
            .parse::<CpuSet>()
            .unwrap()
            .difference(&RESERVED.parse().unwrap());
        for uid in policy.claims() {
            free = free.difference(&policy.claim_cpus(&uid).unwrap_or_default());
        }
        for c in self.containers.values() {
            if let Some(p) = policy.placement(&c.id)
                && matches!(p.grant, Grant::Exclusive { .. } | Grant::Isolated { .. })
            {
                free = free.difference(&p.cpus);
            }
        }
        match &self.exclusivity {
            Exclusivity::Partition(ClaimCpus::Set(claimable)) => free.intersection(claimable),
            _ => free,
        }
    }

    /// While no agent is connected, the kubelet creates the container of a pod whose claims
    /// were answered OK, and the runtime creates it where the kubelet asked: on every CPU,
    /// with what the claims' specs inject. The runtime is starting it when the next agent
    /// synchronizes: it lists it as created (containerd), or, still creating it, leaves it out
    /// (CRI-O: [`FakeRuntime::creating_unlisted`]); it skips updates of it until it runs.
    fn create_in_the_gap(&mut self) {
        let (name, pod) = self.gap_pod();
        let id = self.id("ctr-");
        let mut c = container(&id, &pod);
        let store = self.specs_dir();
        for uid in &pod.claims {
            let Ok(edits) = store.read_claim(uid) else {
                return;
            };
            for (i, e) in edits.iter().enumerate() {
                c.env.extend(e.env.iter().cloned());
                if self.reports_cdi_devices {
                    c.cdi_devices
                        .push(format!("{DRIVER}/device=claim-{uid}-{i}"));
                }
            }
        }
        let every: CpuSet = ALL_CPUS.parse().unwrap();
        let unlisted = self.rng.chance(50);
        if unlisted {
            self.runtime.creating_unlisted(&id);
            self.stats.gap_unlisted += 1;
        } else {
            self.runtime.creating(&id);
            self.stats.gap_listed += 1;
        }
        self.runtime.created(&id, Some(&every));
        // A runtime reports the cpuset of the container's spec: CRI-O none, when the kubelet
        // set none.
        c.cpus = (!unlisted || self.rng.chance(50)).then_some(every);
        self.log.push(format!(
            "  start {name} with no agent -> {id} on {ALL_CPUS}{}",
            if unlisted {
                " (created while the next agent synchronizes)"
            } else {
                ""
            }
        ));
        let mut granted: BTreeSet<String> = self.policy.get().claims().into_iter().collect();
        granted.extend(
            self.claims
                .iter()
                .filter(|(_, m)| m.state == ClaimState::Prepared)
                .map(|(uid, _)| uid.clone()),
        );
        // And every claim whose spec is on disk, a stray one planted while the agent was down
        // included: it grants its CPUs from before the container, which the agent that holds it
        // after its restart did not wait on.
        granted.extend(
            self.specs_dir()
                .claims()
                .expect("listing the specs on disk")
                .into_iter()
                .map(|u| u.to_string()),
        );
        self.from_gap.insert(id, granted);
        self.gap.push((name, c));
    }

    /// The pod whose container the kubelet creates while no agent is connected: one whose
    /// claims were answered OK and that has not started, or else a new one without claims.
    fn gap_pod(&mut self) -> (String, Pod) {
        let ready = self.pods.iter().find(|(_, p)| {
            !p.started
                && p.stray.is_none()
                && p.claims.iter().all(|uid| {
                    p.prepared.contains(uid)
                        && self
                            .claims
                            .get(uid)
                            .is_some_and(|m| m.state == ClaimState::Prepared)
                })
        });
        if let Some((name, pod)) = ready {
            return (name.clone(), pod.clone());
        }
        let uid = self.id("pod-");
        let kind = if self.rng.chance(50) {
            Kind::Shared
        } else {
            Kind::Exclusive(1 + self.rng.below(2))
        };
        let pod = Pod {
            uid: uid.clone(),
            kind,
            claims: Vec::new(),
            prepared: BTreeSet::new(),
            containers: Vec::new(),
            started: false,
            stray: None,
        };
        self.log
            .push(format!("  new pod {uid}: {kind:?} [] (no agent connected)"));
        self.pods.insert(uid.clone(), pod.clone());
        (uid, pod)
    }

    /// The runtime announces the containers it left out of the Synchronize it just finished
    /// (they are in its list from now on): PostCreateContainer, which sometimes misses the agent
    /// (CRI-O inserts a plugin into its list a moment after synchronizing it); then the first
    /// the agent hears of the container is its start, which follows at once. The others start
    /// among the next step's operations ([`World::start_unlisted`]). Returns whether it started
    /// any: the agent's background delivery, which the restart then lets run, sends its update
    /// (the agent cannot call the runtime from inside the runtime's own event).
    async fn announce_unlisted(&mut self, unlisted: Vec<(String, Container)>) -> bool {
        self.runtime.joined();
        let mut started = false;
        for (pod, c) in unlisted {
            if self.rng.chance(75) {
                self.log
                    .push(format!("  the runtime announces {} (created)", c.id));
                self.m().container_created(&c).await;
                self.unlisted.push((pod, c));
            } else {
                self.stats.unlisted_unannounced += 1;
                self.log.push(format!(
                    "  {}'s creation misses the agent; the runtime starts it",
                    c.id
                ));
                self.runtime.started(&c.id);
                self.m().container_started(&c).await;
                self.apply(Outcome::Started {
                    pod,
                    containers: vec![c],
                });
                started = true;
            }
        }
        started
    }

    /// The runtime starts the containers it left out of the last Synchronize and announced,
    /// among the step's other operations, and says so (PostStartContainer); the agent's
    /// background delivery then sends their updates. Their pods take part in nothing else this
    /// step.
    fn start_unlisted(
        &mut self,
        busy: &mut BTreeSet<String>,
    ) -> Option<(String, tokio::task::JoinHandle<Outcome>)> {
        if self.unlisted.is_empty() {
            return None;
        }
        let unlisted = std::mem::take(&mut self.unlisted);
        busy.extend(unlisted.iter().map(|(pod, _)| pod.clone()));
        let m = self.m();
        let runtime = self.runtime.clone();
        let rng = self.shared_rng.clone();
        let what = format!(
            "the runtime starts {:?}",
            unlisted.iter().map(|(_, c)| &c.id).collect::<Vec<_>>()
        );
        Some((
            what,
            tokio::spawn(async move {
                for (_, c) in &unlisted {
                    yield_some(&rng, 3).await;
                    runtime.started(&c.id);
                    if !m_crashed(&m) {
                        m.container_started(c).await;
                    }
                }
                let _ = m.retry_once().await;
                Outcome::StartedUnlisted(unlisted)
            }),
        ))
    }

    /// A settle begins on a calm node: the runtime has started what it was starting.
    async fn start_unlisted_now(&mut self) {
        for (pod, c) in std::mem::take(&mut self.unlisted) {
            self.runtime.started(&c.id);
            self.m().container_started(&c).await;
            self.apply(Outcome::Started {
                pod,
                containers: vec![c],
            });
        }
    }

    /// Writes a spec of ours that the state does not account for: readable and granting free
    /// CPUs or CPUs a claim holds, or unreadable; sometimes with a running container of a pod
    /// no kubelet claim knows of that uses it.
    fn plant_stray(&mut self) {
        let uid = self.id("stray-");
        let free = self.free_cpus();
        let held: Vec<CpuSet> = {
            let policy = self.policy.get();
            policy
                .claims()
                .iter()
                .filter_map(|c| policy.claim_cpus(c))
                .collect()
        };
        let on_held = (free.is_empty() || self.rng.chance(35)) && !held.is_empty();
        let cpus: CpuSet = if on_held {
            self.rng.pick(&held).unwrap().clone()
        } else {
            let n = 1 + self.rng.index(2);
            free.iter().take(n).collect()
        };
        if cpus.is_empty() {
            return;
        }
        let unreadable = self.rng.chance(25);
        let store = self.specs_dir();
        let env = vec![format!("DRA_CPUSET_{uid}={cpus}")];
        if unreadable {
            let path = store.spec_path(&cdi::ClaimUid::new(&uid).unwrap());
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, b"{\"cdiVersion\":").unwrap();
        } else {
            store
                .write_claim(&uid, &[ContainerEdits::with_env(env.clone())])
                .unwrap();
        }
        let used = self.rng.chance(50);
        self.stats.strays += 1;
        self.log.push(format!(
            "  stray spec {uid} on {cpus} ({}, {}, {})",
            if on_held { "held cpus" } else { "free cpus" },
            if unreadable { "unreadable" } else { "readable" },
            if used { "used" } else { "unused" }
        ));
        self.strays.insert(uid.clone(), StrayModel { unreadable });
        if !used {
            return;
        }
        let pod_uid = self.id("pod-");
        let mut pod = Pod {
            uid: pod_uid.clone(),
            kind: Kind::Claims,
            claims: Vec::new(),
            prepared: BTreeSet::new(),
            containers: Vec::new(),
            started: true,
            stray: Some(uid.clone()),
        };
        let id = self.id("ctr-");
        let mut c = container(&id, &pod);
        c.env = env;
        if self.reports_cdi_devices {
            c.cdi_devices.push(format!("{DRIVER}/device=claim-{uid}-0"));
        }
        self.runtime.apply_reply(&[ContainerUpdate {
            container_id: id.clone(),
            cpus: Some(cpus),
            mems: None,
        }]);
        pod.containers.push(id.clone());
        self.containers.insert(id, c);
        self.pods.insert(pod_uid, pod);
    }

    /// The claim source forgets a claim the agent holds (deleted, or deallocated) while its
    /// pods may still run.
    fn delete_claim(&mut self) {
        let held: Vec<String> = self
            .claims
            .iter()
            .filter(|(_, m)| m.state != ClaimState::Unprepared && !m.deleted)
            .map(|(uid, _)| uid.clone())
            .collect();
        let Some(uid) = self.rng.pick(&held).cloned() else {
            return;
        };
        let remove = self.rng.chance(50);
        let model = self.claims.get_mut(&uid).unwrap();
        model.deleted = true;
        if remove {
            self.api.remove(&model.claim.namespace, &model.claim.name);
        } else {
            self.api
                .deallocate(&model.claim.namespace, &model.claim.name);
        }
        self.stats.deleted_claims += 1;
        self.log.push(format!(
            "  claim {uid} {} in the API server",
            if remove { "deleted" } else { "deallocated" }
        ));
    }

    /// Whether a running container uses claim `uid`, by the world's account.
    fn used(&self, uid: &str) -> bool {
        self.containers
            .values()
            .chain(self.unlisted.iter().map(|(_, c)| c))
            .any(|c| {
                self.pods.get(&c.pod.uid).is_some_and(|p| {
                    p.claims.iter().any(|x| x == uid) || p.stray.as_deref() == Some(uid)
                })
            })
    }

    /// Whether the claim source allocates claim `uid` to this node, by the world's account.
    fn allocated(&self, uid: &str) -> bool {
        self.claims.get(uid).is_some_and(|m| !m.deleted)
    }

    /// With faults cleared: a pass, the grace passing, a pass; then no unconfirmed claim is left
    /// that nothing uses and the claim source does not allocate here.
    async fn reconcile_past_grace(&mut self) -> Result<(), String> {
        self.faults.disarm_all();
        {
            let mut rt = self.runtime.state.lock().unwrap();
            rt.refuse.clear();
            rt.report_failed.clear();
            rt.fail_calls = 0;
        }
        self.log
            .push("  reconcile, the grace passes, reconcile".into());
        self.reconcile_pass().await?;
        tokio::time::advance(self.grace + Duration::from_secs(1)).await;
        self.reconcile_pass().await?;
        let report = self.m().reconciliation().await;
        for uid in &report.unconfirmed {
            if !self.used(uid) && !self.allocated(uid) {
                return Err(format!(
                    "unconfirmed claim {uid} is used by nothing and allocated nowhere, but still held after the grace: {report:?}"
                ));
            }
        }
        self.check_disk().await
    }

    /// One reconcile pass, with nothing else running: what it releases was unwanted for the
    /// grace at least (invariant 7).
    async fn reconcile_pass(&mut self) -> Result<(), String> {
        self.stats.reconcile_passes += 1;
        let before = self.m().reconciliation().await;
        let now = tokio::time::Instant::now();
        let unwanted: BTreeSet<String> = before
            .unconfirmed
            .iter()
            .filter(|uid| !self.used(uid) && !self.allocated(uid))
            .cloned()
            .collect();
        self.unwanted_since.retain(|uid, _| unwanted.contains(uid));
        for uid in unwanted {
            self.unwanted_since.entry(uid).or_insert(now);
        }
        let released = |r: &ReconcileReport| -> BTreeSet<String> {
            r.recent
                .iter()
                .filter(|d| d.outcome == Done::Released)
                .map(|d| d.claim.clone())
                .collect()
        };
        let earlier = released(&before);
        self.m().reconcile_once().await;
        let after = self.m().reconciliation().await;
        self.check_reconciled(&after)?;
        let at = tokio::time::Instant::now();
        for uid in released(&after).difference(&earlier) {
            let Some(since) = self.unwanted_since.get(uid) else {
                return Err(format!(
                    "claim {uid} was released while something wanted it"
                ));
            };
            let unwanted = at.saturating_duration_since(*since);
            if unwanted < self.grace {
                return Err(format!(
                    "claim {uid} was released within the grace: unwanted for {unwanted:?} of {:?}",
                    self.grace
                ));
            }
        }
        Ok(())
    }

    /// What reconciliation released or swept was not allocated here (invariant 6).
    fn check_reconciled(&self, report: &ReconcileReport) -> Result<(), String> {
        for done in &report.recent {
            if matches!(done.outcome, Done::Released | Done::Swept) && self.allocated(&done.claim) {
                return Err(format!(
                    "reconciliation {} claim {}, which the claim source allocates here: {}",
                    done.outcome.as_str(),
                    done.claim,
                    done.detail
                ));
            }
        }
        Ok(())
    }

    /// While a claim is contested, claims are refused, saying so.
    async fn contested_refuses(&mut self) -> Result<(), String> {
        let probe = ClaimRef::new("default", "probe", "probe");
        match self.m().prepare(&[probe]).await {
            Err(AdmitError::Contested(_)) => Ok(()),
            other => Err(format!(
                "a claim is contested ({:?}), but a prepare answered {other:?}",
                self.m().contested()
            )),
        }
    }

    /// The operator's recovery from a contested claim: the pods using stray specs go, and the
    /// agent restarts.
    async fn recover_contested(&mut self) -> Result<(), String> {
        self.log
            .push("  the operator deletes the strays' pods and restarts the agent".into());
        let pods: Vec<String> = self
            .pods
            .values()
            .filter(|p| p.stray.is_some())
            .map(|p| p.uid.clone())
            .collect();
        for pod in pods {
            let m = self.m();
            let (_, task) = self.stop(&pod, m);
            let outcome = task.await.map_err(|e| e.to_string())?;
            self.apply(outcome);
        }
        // The kubelet keeps unpreparing the claims whose pods are gone (served while claims
        // are contested): one of them may hold the contested spec's CPUs. The recovery is done
        // on a calm node: nothing armed fires.
        self.faults.disarm_all();
        let unpreparing: Vec<ClaimRef> = self
            .claims
            .iter()
            .filter(|(_, c)| c.state == ClaimState::Unpreparing)
            .map(|(uid, _)| self.claim_ref(uid))
            .collect();
        if !unpreparing.is_empty() {
            let outcome = unprepare(&self.m(), &unpreparing).await;
            self.log.push(format!(
                "  the kubelet retries unprepare {:?} -> {}",
                unpreparing.iter().map(|c| &c.uid).collect::<Vec<_>>(),
                outcome.summary()
            ));
            self.apply(outcome);
        }
        // A stale claim of a restored state that holds a prepared claim's CPUs goes after the
        // grace.
        self.reconcile_past_grace().await?;
        self.graceful_stop().await?;
        self.restart(false).await?;
        self.check_disk()
            .await
            .map_err(|e| format!("after recovering from a contested claim: {e}"))?;
        if let Some(why) = self.m().contested() {
            return Err(format!("still contested after the recovery: {why}"));
        }
        Ok(())
    }

    /// Faults for the coming step, drawn from the seed.
    fn arm_faults(&mut self) {
        if self.rng.chance(10) {
            self.faults.disarm_all();
            let mut rt = self.runtime.state.lock().unwrap();
            rt.refuse.clear();
            rt.report_failed.clear();
            rt.fail_calls = 0;
            self.log.push("  faults cleared".into());
            return;
        }
        if self.rng.chance(12) {
            let point = *self.rng.pick(Point::DISK).unwrap();
            let fault = if self.rng.chance(50) {
                Fault::Fail
            } else {
                Fault::Delay(Duration::from_millis(1 + self.rng.below(3000)))
            };
            let skip = self.rng.index(3);
            self.faults.arm_after(point, skip, fault, Some(1));
            self.stats.faults += 1;
            self.log
                .push(format!("  fault {fault:?} at {point} after {skip}"));
        }
        if self.rng.chance(8) {
            let mut rt = self.runtime.state.lock().unwrap();
            rt.fail_calls = 1 + self.rng.index(2);
            self.stats.faults += 1;
            self.log
                .push(format!("  runtime fails the next {} calls", rt.fail_calls));
        }
        if self.rng.chance(6) {
            let ids: Vec<String> = self.containers.keys().cloned().collect();
            if let Some(id) = self.rng.pick(&ids) {
                let mut rt = self.runtime.state.lock().unwrap();
                if self.rng.chance(50) {
                    rt.refuse.insert(id.clone());
                    self.log.push(format!("  runtime refuses updates of {id}"));
                } else {
                    rt.report_failed.insert(id.clone());
                    self.log
                        .push(format!("  runtime reports {id}'s updates failed"));
                }
                self.stats.faults += 1;
            }
        }
        if self.rng.chance(4) {
            let point = if self.rng.chance(70) {
                *self.rng.pick(Point::STEPS).unwrap()
            } else {
                *self.rng.pick(Point::DISK).unwrap()
            };
            let skip = self.rng.index(2);
            self.faults.arm_after(point, skip, Fault::Crash, Some(1));
            self.log
                .push(format!("  crash armed at {point} after {skip}"));
        }
    }

    /// Starts one operation, if there is one to start.
    fn operation(
        &mut self,
        busy: &mut BTreeSet<String>,
    ) -> Option<(String, tokio::task::JoinHandle<Outcome>)> {
        let m = self.m();
        let roll = self.rng.below(100);
        // Pods whose claims the kubelet still has to prepare, pods ready to start, pods running.
        let free = |p: &&Pod| !busy.contains(&p.uid);
        let to_prepare: Vec<String> = self
            .pods
            .values()
            .filter(free)
            .filter(|p| !p.started && p.claims.iter().any(|c| !p.prepared.contains(c)))
            .map(|p| p.uid.clone())
            .collect();
        let to_start: Vec<String> = self
            .pods
            .values()
            .filter(free)
            .filter(|p| !p.started && p.claims.iter().all(|c| p.prepared.contains(c)))
            .map(|p| p.uid.clone())
            .collect();
        let running: Vec<String> = self
            .pods
            .values()
            .filter(free)
            .filter(|p| p.started)
            .map(|p| p.uid.clone())
            .collect();
        let unpreparing: Vec<String> = self
            .claims
            .iter()
            .filter(|(uid, c)| c.state == ClaimState::Unpreparing && !busy.contains(*uid))
            .map(|(uid, _)| uid.clone())
            .collect();

        if roll < 20 && self.pods.len() < 12 {
            let pod = self.new_pod(busy);
            busy.insert(pod.clone());
            return self.prepare_or_start(&pod, m);
        }
        if roll < 40 && !to_prepare.is_empty() {
            let pod = self.rng.pick(&to_prepare).unwrap().clone();
            busy.insert(pod.clone());
            return self.prepare_or_start(&pod, m);
        }
        if roll < 55 && !to_start.is_empty() {
            let pod = self.rng.pick(&to_start).unwrap().clone();
            busy.insert(pod.clone());
            return self.prepare_or_start(&pod, m);
        }
        if roll < 70 && !running.is_empty() {
            let pod = self.rng.pick(&running).unwrap().clone();
            busy.insert(pod.clone());
            return Some(self.stop(&pod, m));
        }
        if roll < 80 && !unpreparing.is_empty() {
            let uid = self.rng.pick(&unpreparing).unwrap().clone();
            busy.insert(uid.clone());
            let refs = vec![self.claim_ref(&uid)];
            return Some((
                format!("retry unprepare {uid}"),
                tokio::spawn(async move { unprepare(&m, &refs).await }),
            ));
        }
        if roll < 88 {
            let shared: Vec<Container> = self
                .containers
                .values()
                .filter(|c| c.pod.qos == QosClass::Burstable && !busy.contains(&c.pod.uid))
                .cloned()
                .collect();
            if let Some(c) = self.rng.pick(&shared).cloned() {
                busy.insert(c.pod.uid.clone());
                let milli = 100 + self.rng.below(1500);
                let runtime = self.runtime.clone();
                let rng = self.shared_rng.clone();
                return Some((
                    format!("resize {} to {milli}m", c.id),
                    tokio::spawn(async move {
                        let resources = Resources {
                            cpu_request_milli: milli,
                            ..c.resources
                        };
                        if let Ok(updates) = m.update_container(&c, &resources).await
                            && !m_crashed(&m)
                        {
                            // As containerd: the updates of others apply with the reply, under
                            // its NRI lock; the container's own after the event, outside it (an
                            // update of ours may land in between and be overwritten), then
                            // PostUpdateContainer.
                            let (own, others): (Vec<_>, Vec<_>) =
                                updates.into_iter().partition(|u| u.container_id == c.id);
                            runtime.apply_reply(&others);
                            yield_some(&rng, 4).await;
                            runtime.apply_reply(&own);
                            m.container_updated(&c).await;
                        }
                        Outcome::Nothing
                    }),
                ));
            }
        }
        Some((
            "background retry".into(),
            tokio::spawn(async move {
                let _ = m.retry_once().await;
                Outcome::Nothing
            }),
        ))
    }

    fn new_pod(&mut self, busy: &BTreeSet<String>) -> String {
        let uid = self.id("pod-");
        let kind = match self.rng.below(10) {
            0..=2 => Kind::Shared,
            3..=4 => Kind::Exclusive(1 + self.rng.below(2)),
            _ => Kind::Claims,
        };
        let mut claims = Vec::new();
        if kind == Kind::Claims {
            // Join a claim other pods share (none of them busy this step), or a claim of its
            // own (sometimes two).
            let joinable: Vec<String> = self
                .claims
                .iter()
                .filter(|(c, model)| {
                    model.state != ClaimState::Unpreparing
                        && !model.deleted
                        && self
                            .pods
                            .values()
                            .filter(|p| p.claims.contains(c))
                            .all(|p| !busy.contains(&p.uid))
                })
                .map(|(c, _)| c.clone())
                .collect();
            if self.rng.chance(25) && !joinable.is_empty() {
                claims.push(self.rng.pick(&joinable).unwrap().clone());
            } else {
                for _ in 0..1 + usize::from(self.rng.chance(20)) {
                    let claim_uid = self.id("claim-");
                    let node = *self.rng.pick(&NODES).unwrap();
                    let cpus = 1 + self.rng.below(3);
                    let mut claim = claim_on(&claim_uid, &uid, node, cpus);
                    claim.reserved_for.clear();
                    self.claims.insert(
                        claim_uid.clone(),
                        ClaimModel {
                            claim,
                            state: ClaimState::Unprepared,
                            granted: None,
                            deleted: false,
                        },
                    );
                    claims.push(claim_uid);
                }
            }
        }
        for c in &claims {
            let model = self.claims.get_mut(c).unwrap();
            model.claim.reserved_for.push(uid.clone());
            self.api.insert(model.claim.clone());
        }
        self.pods.insert(
            uid.clone(),
            Pod {
                uid: uid.clone(),
                kind,
                claims,
                prepared: BTreeSet::new(),
                containers: Vec::new(),
                started: false,
                stray: None,
            },
        );
        self.log.push(format!(
            "  new pod {uid}: {kind:?} {:?}",
            self.pods[&uid].claims
        ));
        uid
    }

    fn claim_ref(&self, uid: &str) -> ClaimRef {
        let c = &self.claims[uid].claim;
        ClaimRef::new(&c.namespace, &c.name, uid)
    }

    /// The kubelet's next move for a pod that has not started: prepare what is not prepared
    /// (sometimes twice at once, as a retry overlapping the call in flight), or start it.
    fn prepare_or_start(
        &mut self,
        pod: &str,
        m: Arc<Manager>,
    ) -> Option<(String, tokio::task::JoinHandle<Outcome>)> {
        let p = self.pods[pod].clone();
        let pending: Vec<ClaimRef> = p
            .claims
            .iter()
            .filter(|c| !p.prepared.contains(*c))
            .map(|c| self.claim_ref(c))
            .collect();
        if !pending.is_empty() {
            let overlap = self.rng.chance(20);
            let pod = pod.to_owned();
            return Some((
                format!(
                    "prepare {pod} {:?}{}",
                    pending.iter().map(|c| &c.uid).collect::<Vec<_>>(),
                    if overlap { " twice at once" } else { "" }
                ),
                tokio::spawn(async move {
                    let first = prepare(&m, &pending);
                    let answers = if overlap {
                        let (a, b) = tokio::join!(first, prepare(&m, &pending));
                        // The kubelet takes whichever answer reaches it; both must be right.
                        a.into_iter()
                            .map(|(uid, ok)| {
                                let other = b.get(&uid).copied().unwrap_or(false);
                                (uid, ok || other)
                            })
                            .collect()
                    } else {
                        first.await
                    };
                    Outcome::Prepared { pod, answers }
                }),
            ));
        }
        // Start its containers, with what the runtime resolves from the claims' specs.
        let mut containers = Vec::new();
        for _ in 0..1 + self.rng.index(2) {
            let id = self.id("ctr-");
            containers.push(container(&id, &p));
        }
        let claims: Vec<String> = p.claims.clone();
        let store = self.specs_dir();
        let reports = self.reports_cdi_devices;
        let faults = self.faults.clone();
        let runtime = self.runtime.clone();
        let pod = pod.to_owned();
        Some((
            format!("start {pod}"),
            tokio::spawn(async move {
                let mut started = Vec::new();
                for mut c in containers {
                    // The runtime resolves the CDI devices the kubelet names; a missing spec fails
                    // the container before any NRI event.
                    let mut resolved = true;
                    for uid in &claims {
                        match store.read_claim(uid) {
                            Ok(edits) => {
                                for (i, e) in edits.iter().enumerate() {
                                    c.env.extend(e.env.iter().cloned());
                                    if reports {
                                        c.cdi_devices
                                            .push(format!("{DRIVER}/device=claim-{uid}-{i}"));
                                    }
                                }
                            }
                            Err(_) => resolved = false,
                        }
                    }
                    if !resolved {
                        continue;
                    }
                    // As containerd at worst: from the container's CreateContainer until it runs,
                    // the runtime confirms updates of it without applying them; then it sends
                    // PostStartContainer. Other tasks run in between.
                    runtime.creating(&c.id);
                    if let Ok(allocation) = m.create_container(&c).await
                        && faults.crashed_at().is_none()
                    {
                        runtime.apply_reply(&allocation.updates);
                        c.cpus = allocation.adjustment.cpus.clone();
                        c.mems = allocation.adjustment.mems.clone();
                        tokio::task::yield_now().await;
                        runtime.created(&c.id, c.cpus.as_ref());
                        tokio::task::yield_now().await;
                        runtime.started(&c.id);
                        m.container_started(&c).await;
                        started.push(c);
                    } else {
                        runtime.started(&c.id);
                    }
                }
                Outcome::Started {
                    pod,
                    containers: started,
                }
            }),
        ))
    }

    /// The pod ends: its containers stop and are removed, then the kubelet unprepares the
    /// claims no other pod uses.
    fn stop(&mut self, pod: &str, m: Arc<Manager>) -> (String, tokio::task::JoinHandle<Outcome>) {
        let p = self.pods[pod].clone();
        let containers: Vec<Container> = p
            .containers
            .iter()
            .filter_map(|id| self.containers.get(id).cloned())
            .collect();
        let mut last_users = Vec::new();
        for uid in &p.claims {
            let others = self
                .pods
                .values()
                .any(|o| o.uid != p.uid && o.claims.contains(uid));
            if !others {
                last_users.push(self.claim_ref(uid));
            }
        }
        let faults = self.faults.clone();
        let runtime = self.runtime.clone();
        let pod = pod.to_owned();
        let remove_first = self.rng.chance(20);
        (
            format!(
                "stop {pod}, unprepare {:?}",
                last_users.iter().map(|c| &c.uid).collect::<Vec<_>>()
            ),
            tokio::spawn(async move {
                for c in &containers {
                    if remove_first {
                        // Stopped without a StopContainer reaching us.
                        m.remove_container(c).await;
                    } else {
                        let updates = m.stop_container(c).await;
                        if faults.crashed_at().is_none() {
                            runtime.apply_reply(&updates);
                        }
                        m.remove_container(c).await;
                    }
                }
                runtime
                    .state
                    .lock()
                    .unwrap()
                    .cpus
                    .retain(|id, _| !containers.iter().any(|c| &c.id == id));
                let unprepared = if last_users.is_empty() {
                    None
                } else {
                    match unprepare(&m, &last_users).await {
                        Outcome::Unprepared { answers } => Some(answers),
                        _ => None,
                    }
                };
                Outcome::Stopped { pod, unprepared }
            }),
        )
    }

    // ----------------------------------------------------------------------------------------
    // Outcomes
    // ----------------------------------------------------------------------------------------

    fn apply(&mut self, outcome: Outcome) {
        match outcome {
            Outcome::Prepared { pod, answers } => {
                for (uid, ok) in answers {
                    if ok {
                        self.stats.prepares_ok += 1;
                        if let Some(p) = self.pods.get_mut(&pod) {
                            p.prepared.insert(uid.clone());
                        }
                        let granted = self.spec_cpus(&uid);
                        let model = self.claims.get_mut(&uid).unwrap();
                        if model.state == ClaimState::Unprepared {
                            model.state = ClaimState::Prepared;
                            model.granted = granted;
                        }
                    } else {
                        self.stats.prepares_failed += 1;
                    }
                }
            }
            Outcome::Started { pod, containers } => {
                self.stats.containers_started += containers.len() as u64;
                let p = self.pods.get_mut(&pod).unwrap();
                p.started = true;
                for c in containers {
                    p.containers.push(c.id.clone());
                    self.containers.insert(c.id.clone(), c);
                }
            }
            Outcome::StartedUnlisted(started) => {
                for (pod, c) in started {
                    self.apply(Outcome::Started {
                        pod,
                        containers: vec![c],
                    });
                }
            }
            Outcome::Stopped { pod, unprepared } => {
                let p = self.pods.remove(&pod).unwrap();
                for id in &p.containers {
                    self.containers.remove(id);
                }
                for uid in &p.claims {
                    let others = self.pods.values().any(|o| o.claims.contains(uid));
                    if !others {
                        // The kubelet unprepares it until that answers OK: the answer is
                        // applied by the Unprepared outcome below.
                        if let Some(model) = self.claims.get_mut(uid) {
                            model.state = ClaimState::Unpreparing;
                        }
                    }
                }
                if let Some(answers) = unprepared {
                    self.apply(Outcome::Unprepared { answers });
                }
            }
            Outcome::Unprepared { answers } => {
                for (uid, ok) in answers {
                    if ok {
                        self.stats.unprepares_ok += 1;
                        // Its pods are gone, and the claim with them (as a template's claim).
                        if let Some(model) = self.claims.remove(&uid) {
                            self.api.remove(&model.claim.namespace, &model.claim.name);
                        }
                    } else {
                        self.stats.unprepares_failed += 1;
                    }
                }
            }
            Outcome::Nothing => {}
        }
    }

    /// The CPUs a claim's spec on disk grants.
    fn spec_cpus(&self, uid: &str) -> Option<CpuSet> {
        let edits = self.specs_dir().read_claim(uid).ok()?;
        let name = format!("DRA_CPUSET_{uid}=");
        let mut cpus = CpuSet::new();
        for e in edits {
            let v = e.env.iter().find_map(|v| v.strip_prefix(&name))?;
            cpus = cpus.union(&v.parse().ok()?);
        }
        Some(cpus)
    }

    // ----------------------------------------------------------------------------------------
    // Restarts
    // ----------------------------------------------------------------------------------------

    /// The agent starts again over the same directories (the state directory wiped if asked),
    /// and synchronizes with what the runtime runs.
    async fn restart(&mut self, wipe: bool) -> Result<(), String> {
        self.stats.restarts += 1;
        // Every task of the old agent has finished; it goes, and its lock with it.
        let old = self.manager.take().ok_or("no agent to restart")?;
        self.stats.count(&old.reconciliation().await);
        self.unwanted_since.clear();
        if Arc::strong_count(&old) != 1 {
            return Err("the old manager is still referenced".into());
        }
        drop(old);
        if wipe {
            self.stats.wiped_restarts += 1;
            std::fs::remove_dir_all(self.state_dir()).map_err(|e| e.to_string())?;
        }
        self.faults = fresh_faults();
        self.policy = Shared::new(&self.exclusivity);
        let manager = start_manager(
            self.dir.path(),
            self.policy.clone(),
            &self.faults,
            self.runtime.clone(),
            self.api.clone(),
            &self.shared_rng,
            self.grace,
        )
        .map_err(|e| format!("restarting: {}", stdx::errors::chain(&e)))?;
        self.manager = Some(Arc::new(manager));
        // The containers created in the gap that this Synchronize lists (those the last one left
        // out are in the runtime's list now, created), and those it leaves out.
        let mut gap = std::mem::take(&mut self.gap);
        gap.append(&mut self.unlisted);
        let (gap, unlisted): (Vec<_>, Vec<_>) = gap
            .into_iter()
            .partition(|(_, c)| self.runtime.listed(&c.id));
        let running: Vec<Container> = self
            .containers
            .values()
            .map(|c| Container {
                cpus: self.runtime.cpus(&c.id).and_then(|s| s.parse().ok()),
                ..c.clone()
            })
            .chain(gap.iter().map(|(_, c)| c.clone()))
            .collect();
        let starting: Vec<&str> = gap.iter().map(|(_, c)| c.id.as_str()).collect();
        let updates = self
            .m()
            .synchronize_starting(&running, &starting)
            .await
            .map_err(|e| format!("synchronizing: {}", stdx::errors::chain(&e)))?;
        self.runtime.apply_reply(&updates);
        self.m().synchronized().await;
        let started_unannounced = self.announce_unlisted(unlisted).await;
        if gap.is_empty() && !started_unannounced {
            return Ok(());
        }
        // The runtime has started them (and those whose creation missed the agent), and says
        // so; the agent's background delivery sends their updates (here with the runtime's
        // failures cleared, so that it succeeds) before anything is checked.
        for (pod, c) in gap {
            self.runtime.started(&c.id);
            self.m().container_started(&c).await;
            let p = self.pods.get_mut(&pod).ok_or("the gap's pod is gone")?;
            p.started = true;
            p.containers.push(c.id.clone());
            self.stats.containers_started += 1;
            self.containers.insert(c.id.clone(), c);
        }
        self.settle()
            .await
            .map_err(|e| format!("after containers created with no agent started: {e}"))
    }

    // ----------------------------------------------------------------------------------------
    // Invariants
    // ----------------------------------------------------------------------------------------

    /// What is on disk, what the kubelet was told, and what reconciliation did: invariants 1
    /// to 3 and 6.
    async fn check_disk(&self) -> Result<(), String> {
        let report = self.m().reconciliation().await;
        self.check_reconciled(&report)?;
        self.check_disk_with(&report)
    }

    fn check_disk_with(&self, report: &ReconcileReport) -> Result<(), String> {
        let state = saved_claims(&self.state_dir())?;
        let accounted: BTreeSet<String> = state.keys().cloned().collect();
        let specs: Vec<String> = self
            .specs_dir()
            .claims()
            .map_err(|e| e.to_string())?
            .into_iter()
            .map(|u| u.to_string())
            .collect();
        // 1. Every spec belongs to a claim the committed state accounts for, or is a stray
        // the agent holds from what its users show (unreadable) or reports contested. (Every
        // stray is judged by the time a step ends: a restart ends with its Synchronize.)
        let held_unreadable = |uid: &String| {
            self.strays.get(uid).is_some_and(|s| s.unreadable) && report.unconfirmed.contains(uid)
        };
        for uid in &specs {
            if !accounted.contains(uid)
                && !report.contested.contains_key(uid)
                && !held_unreadable(uid)
            {
                return Err(format!(
                    "the spec of {uid} is on disk, the state accounts for {accounted:?}, reconciliation reports {report:?}"
                ));
            }
        }
        // 1b. Every file a spec mounts (its claim's device metadata) is on disk: a container
        // created with the spec would fail without it.
        for uid in &specs {
            let Ok(edits) = self.specs_dir().read_claim(uid) else {
                continue;
            };
            for mount in edits.iter().flat_map(|e| &e.mounts) {
                if !std::path::Path::new(&mount.host_path).is_file() {
                    return Err(format!(
                        "the spec of {uid} mounts {}, which is not on disk",
                        mount.host_path
                    ));
                }
            }
        }
        // 2a. No two readable specs on disk grant the same CPU, unless the agent reports one
        // of them contested (and then refuses claims).
        let mut by_spec = BTreeMap::new();
        for uid in &specs {
            if let Some(cpus) = self.spec_cpus(uid)
                && !report.contested.contains_key(uid)
            {
                by_spec.insert(uid.clone(), cpus);
            }
        }
        disjoint("granted by the specs on disk", &by_spec)?;
        if !report.contested.is_empty() && self.m().gate().is_open() {
            return Err(format!(
                "claims {:?} are contested, but the claim gate is open",
                report.contested.keys()
            ));
        }
        // 2. No CPU in two claims, or in a claim and an exclusive container: among the claims
        // on disk, among the claims the policy holds now, and between the claims granted by a
        // spec or held now and what exclusive containers run on. (A claim on disk whose
        // rollback could not be saved is accounted without a spec, granting nothing: its CPUs
        // may be given to others until the next save.)
        disjoint("on disk", &state)?;
        let (now, exclusive) = {
            let policy = self.policy.get();
            let now: BTreeMap<String, CpuSet> = policy
                .claims()
                .into_iter()
                .filter_map(|uid| Some((uid.clone(), policy.claim_cpus(&uid)?)))
                .collect();
            let exclusive: BTreeMap<String, CpuSet> = self
                .containers
                .values()
                .filter_map(|c| policy.placement(&c.id).map(|p| (c.id.clone(), p)))
                .filter(|(_, p)| {
                    matches!(p.grant, Grant::Exclusive { .. } | Grant::Isolated { .. })
                })
                .map(|(id, p)| (id, p.cpus))
                .collect();
            (now, exclusive)
        };
        disjoint("held now", &now)?;
        let by_spec: Vec<(&String, &CpuSet)> = state
            .iter()
            .filter(|(uid, _)| specs.contains(uid))
            .collect();
        let union = |grants: &mut dyn Iterator<Item = (&String, &CpuSet)>| {
            grants.fold(CpuSet::new(), |all, (_, cpus)| all.union(cpus))
        };
        let granted = union(&mut by_spec.iter().copied().chain(&now));
        for c in self.containers.values() {
            if !exclusive.contains_key(&c.id) {
                continue;
            }
            let on: CpuSet = self
                .runtime
                .cpus(&c.id)
                .and_then(|s| s.parse().ok())
                .unwrap_or_default();
            let placed = exclusive.get(&c.id).cloned().unwrap_or_default();
            // One created while no agent was connected runs on every CPU until its first update
            // lands: where it runs is checked against the claims a spec grants (whose prepare
            // waited for its move) since it was created, not against claims held whose prepare
            // is under way or was cut short.
            let runs_against = if self.from_gap.contains_key(&c.id) {
                union(
                    &mut by_spec
                        .iter()
                        .copied()
                        .filter(|(uid, _)| !self.created_after(&c.id, uid)),
                )
            } else {
                granted.clone()
            };
            if on.intersects(&runs_against) || placed.intersects(&granted) {
                return Err(format!(
                    "exclusive container {} runs on {on} (placed on {placed}), claims are granted {granted}",
                    c.id
                ));
            }
        }
        // 3. Every claim answered OK is held, with its CPUs and its spec, until unprepared.
        for (uid, model) in &self.claims {
            if model.state != ClaimState::Prepared {
                continue;
            }
            if report.contested.contains_key(uid) && !state.contains_key(uid) {
                // An older state restored gives its CPUs to a claim released since: its spec
                // is contested, and claims are refused until the operator's recovery.
                continue;
            }
            if model.deleted
                && (!state.contains_key(uid)
                    || (report.unconfirmed.contains(uid) && !specs.contains(uid))
                    || (!specs.contains(uid) && self.policy.get().claim_cpus(uid).is_none()))
            {
                // Released by reconciliation once nothing used it: the kubelet's unprepare
                // will find nothing to do. (An older state restored since may hold it again,
                // without its spec: unconfirmed, released again after the grace. A release
                // whose save failed is on disk without its spec until the next save.)
                continue;
            }
            let Some(cpus) = state.get(uid) else {
                return Err(format!(
                    "claim {uid} answered OK but the state does not hold it"
                ));
            };
            if Some(cpus) != model.granted.as_ref() {
                return Err(format!(
                    "claim {uid} answered OK with {:?}, the state holds {cpus}",
                    model.granted
                ));
            }
            if !specs.contains(uid) {
                return Err(format!("claim {uid} answered OK but its spec is gone"));
            }
            // 3b. ... and nothing else runs on its CPUs: the containers its allocation moved off
            // them had moved before the spec granted them.
            for c in self.containers.values() {
                // While a stray is contested, its pods run where the earlier grant put them.
                let uses = self.pods.get(&c.pod.uid).is_some_and(|p| {
                    p.claims.contains(uid)
                        || p.stray
                            .as_ref()
                            .is_some_and(|s| report.contested.contains_key(s))
                });
                let on: CpuSet = self
                    .runtime
                    .cpus(&c.id)
                    .and_then(|s| s.parse().ok())
                    .unwrap_or_default();
                if !uses && on.intersects(cpus) && !self.created_after(&c.id, uid) {
                    let placed = self.policy.get().placement(&c.id);
                    return Err(format!(
                        "container {} runs on {on}, claim {uid} answered OK holds {cpus} (the policy placed it: {placed:?})",
                        c.id
                    ));
                }
            }
        }
        Ok(())
    }

    /// Whether container `id` was created while no agent was connected after claim `uid` was
    /// granted, and no settle has checked it since: it runs on every CPU, the claim's
    /// included, until the agent's first update of it lands (invariant 3).
    fn created_after(&self, id: &str, uid: &str) -> bool {
        self.from_gap
            .get(id)
            .is_some_and(|granted| granted.contains(uid))
    }

    /// Invariant 4: with the faults cleared, every pending update is delivered, and every
    /// running container runs where the policy placed it (and no shared container on a claim's
    /// CPUs).
    async fn settle(&mut self) -> Result<(), String> {
        self.faults.disarm_all();
        {
            let mut rt = self.runtime.state.lock().unwrap();
            rt.refuse.clear();
            rt.report_failed.clear();
            rt.fail_calls = 0;
        }
        self.start_unlisted_now().await;
        let _ = self.m().retry_once().await;
        if let Err(e) = self.m().retry_once().await {
            return Err(format!(
                "with no faults, the background retry failed: {}",
                stdx::errors::chain(&e)
            ));
        }
        let pending = self.m().pending_updates().await;
        if pending != 0 {
            return Err(format!("{pending} updates still pending with no faults"));
        }
        let policy = self.policy.get();
        let claimed: CpuSet = policy
            .claims()
            .iter()
            .filter_map(|uid| policy.claim_cpus(uid))
            .fold(CpuSet::new(), |a, c| a.union(&c));
        for c in self.containers.values() {
            let want = policy
                .placement(&c.id)
                .ok_or_else(|| format!("running container {} is not placed", c.id))?
                .cpus;
            let on = self.runtime.cpus(&c.id);
            if on.as_deref() != Some(want.to_string().as_str()) {
                return Err(format!(
                    "container {} runs on {on:?}, the policy placed it on {want}",
                    c.id
                ));
            }
            let uses_a_claim = self
                .pods
                .get(&c.pod.uid)
                .is_some_and(|p| !p.claims.is_empty() || p.stray.is_some());
            if !uses_a_claim && want.intersects(&claimed) {
                return Err(format!(
                    "container {} shares {want} with the claims' {claimed}",
                    c.id
                ));
            }
        }
        // Those created while no agent was connected run where the agent placed them.
        self.from_gap.clear();
        Ok(())
    }

    /// Invariant 5: every pod ends, every claim is unprepared, faults cleared; then nothing is
    /// left.
    async fn wind_down(&mut self) -> Result<(), String> {
        self.faults.disarm_all();
        self.settle().await?;
        let pods: Vec<String> = self.pods.keys().cloned().collect();
        for pod in pods {
            let m = self.m();
            let (_, task) = self.stop(&pod, m);
            let outcome = task.await.map_err(|e| e.to_string())?;
            self.apply(outcome);
        }
        if self.m().contested().is_some() {
            // The operator's recovery: the strays' pods are gone (as every pod is), the stale
            // claim goes after the grace, the agent restarts.
            self.recover_contested().await?;
        }
        // What no kubelet knows of (adopted strays, claims of a restored older state) goes
        // after the grace.
        self.reconcile_past_grace().await?;
        // Every claim the kubelet ever tried to prepare is in its checkpoint, and unprepared.
        let all: Vec<ClaimRef> = self.claims.keys().map(|uid| self.claim_ref(uid)).collect();
        let answers = unprepare(&self.m(), &all).await;
        if let Outcome::Unprepared { answers } = &answers
            && let Some((uid, _)) = answers.iter().find(|(_, ok)| !**ok)
        {
            return Err(format!("unprepare of {uid} failed with no faults"));
        }
        self.apply(answers);
        self.check_disk().await?;
        self.settle().await?;
        let state = saved_claims(&self.state_dir())?;
        let specs = self.specs_dir().claims().map_err(|e| e.to_string())?;
        if !state.is_empty() || !specs.is_empty() {
            return Err(format!("left behind: claims {state:?}, specs {specs:?}"));
        }
        let inventory = self.policy.get().inventory();
        let all: CpuSet = ALL_CPUS.parse().unwrap();
        let reserved: CpuSet = RESERVED.parse().unwrap();
        if inventory.shared != all.difference(&reserved) {
            return Err(format!(
                "with nothing running, the shared cpus are {}, not {}",
                inventory.shared,
                all.difference(&reserved)
            ));
        }
        self.stats.count(&self.m().reconciliation().await);
        Ok(())
    }
}

async fn prepare(m: &Manager, claims: &[ClaimRef]) -> BTreeMap<String, bool> {
    match m.prepare(claims).await {
        Ok(answers) => answers
            .into_iter()
            .map(|(uid, a)| (uid, a.is_ok() && !m_crashed(m)))
            .collect(),
        Err(_) => claims.iter().map(|c| (c.uid.clone(), false)).collect(),
    }
}

async fn unprepare(m: &Manager, claims: &[ClaimRef]) -> Outcome {
    let answers = match m.unprepare(claims).await {
        Ok(answers) => answers
            .into_iter()
            .map(|(uid, a)| (uid, a.is_ok() && !m_crashed(m)))
            .collect(),
        Err(_) => claims.iter().map(|c| (c.uid.clone(), false)).collect(),
    };
    Outcome::Unprepared { answers }
}

/// Whether the manager had crashed when an answer came back: the kubelet never got it.
fn m_crashed(m: &Manager) -> bool {
    m.config().faults.crashed()
}

// ============================================================================================
// The runs
// ============================================================================================

/// One seed: its steps, then the wind-down. The error names the step.
fn run_seed(seed: u64, steps: usize) -> Result<Stats, String> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    runtime.block_on(async {
        let mut world = World::new(seed).await;
        for step in 0..steps {
            world.log.push(format!("step {step}:"));
            if let Err(e) = world.step(step).await {
                let tail: Vec<&String> = world.log.iter().rev().take(log_tail()).collect();
                let tail: Vec<&str> = tail.into_iter().rev().map(String::as_str).collect();
                return Err(format!(
                    "seed {seed}, step {step}: {e}\nthe last steps:\n{}",
                    tail.join("\n")
                ));
            }
        }
        world.log.push("wind-down:".into());
        if let Err(e) = world.wind_down().await {
            let tail: Vec<&String> = world.log.iter().rev().take(log_tail()).collect();
            let tail: Vec<&str> = tail.into_iter().rev().map(String::as_str).collect();
            return Err(format!(
                "seed {seed}, wind-down after {steps} steps: {e}\nthe last steps:\n{}",
                tail.join("\n")
            ));
        }
        Ok(world.stats)
    })
}

/// How many lines of a failing seed's log to print: `RESMGR_LOG_LINES`, 40 by default.
fn log_tail() -> usize {
    env_u64("RESMGR_LOG_LINES").map_or(40, |n| usize::try_from(n).unwrap_or(usize::MAX))
}

#[test]
fn random_concurrent_calls_events_and_faults_keep_the_lifecycles_invariants() {
    let steps = env_u64("RESMGR_STEPS").map_or(STEPS, |s| usize::try_from(s).unwrap());
    let soak = env_u64("RESMGR_SOAK_SECONDS").map(Duration::from_secs);
    let only = env_u64("RESMGR_SEED");
    let first = env_u64("RESMGR_FIRST_SEED").unwrap_or_else(|| {
        if soak.is_some() {
            SEEDS + clock_seed()
        } else {
            0
        }
    });
    if soak.is_some() && only.is_none() {
        eprintln!(
            "random lifecycle: soaking from seed {first} (RESMGR_FIRST_SEED={first} repeats this run)"
        );
    }
    let started = Instant::now();
    let mut total = Stats::default();
    let mut seeds = 0;
    let mut seed = only.unwrap_or(first);
    loop {
        let result = std::panic::catch_unwind(|| run_seed(seed, steps));
        match result {
            Ok(Ok(stats)) => total.add(&stats),
            Ok(Err(failure)) => panic!(
                "{failure}\nreproduce with: RESMGR_SEED={seed} RESMGR_STEPS={steps} cargo test -p integration-tests --test random_lifecycle -- --nocapture"
            ),
            Err(_) => panic!(
                "seed {seed} panicked (see above)\nreproduce with: RESMGR_SEED={seed} RESMGR_STEPS={steps} cargo test -p integration-tests --test random_lifecycle -- --nocapture"
            ),
        }
        seeds += 1;
        seed += 1;
        let done = match (only, soak) {
            (Some(_), _) => true,
            (None, Some(budget)) => started.elapsed() >= budget,
            (None, None) => seed >= first + SEEDS,
        };
        if done {
            break;
        }
    }
    eprintln!(
        "random lifecycle: {seeds} seeds ({}..{seed}), {steps} steps each, in {:.1?}: {total:?}",
        only.unwrap_or(first),
        started.elapsed()
    );
    assert!(
        total.prepares_ok > 0 && total.unprepares_ok > 0,
        "the run exercised nothing: {total:?}"
    );
}
