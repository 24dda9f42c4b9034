//! Agents handing the node over at random instants: two or three agents at once, each wired as
//! `resmgr run` wires it (plugin-bin's `node`: taking the node, asking its owner, standby,
//! refusal, the takeover; the manager and its handover), over one state directory and CDI
//! directory, a played container runtime and a played kubelet, in one process.
//!
//! Each step of a seed starts an agent (a surge pod, or the restarted container of a pod whose
//! agent died or handed over), kills one at a random instant (its tasks stop where they are, its
//! descriptors close: its lock, its handover socket, its runtime connection, a lock it was
//! passing), has the kubelet prepare or unprepare a claim through the agent it calls, or has the
//! runtime create or remove a container (through the agent connected to it, or in the gap when
//! none is), and lets virtual time pass. After every step, and again once the seed has settled:
//!
//! 1. **one owner at a time**: the runtime never has two agents connected, and an agent's
//!    updates reach it only while that agent is connected;
//! 2. every CDI spec on disk belongs to a claim the state file on disk accounts for, and no CPU
//!    is in two claims of the state file;
//! 3. every kubelet call answered by an agent that lived through it is answered OK for every
//!    claim (the claims always fit): a call is held, never refused, while the node passes;
//! 4. a claim answered OK keeps its CPUs until the kubelet unprepares it, whichever agent owns
//!    the node;
//! 5. once the seed settles (no more agents start or die): **the agent the kubelet calls owns
//!    the node** (it is the one connected to the runtime, and its calls are served), and no
//!    container of the runtime runs on a claim's CPUs.
//!
//! Runs are seeded and reproducible: one current-thread runtime with paused time per seed, disk
//! work inline, handover sockets in process. A failure names the seed and the steps before it,
//! and `RESMGR_SEED=<seed>` reruns just that seed. Without settings the test runs `SEEDS`
//! seeds (CI); `RESMGR_SOAK_SECONDS=<n>` keeps drawing new seeds for that long (`cargo xtask
//! soak --minutes N` runs it after the lifecycle soak), from a first seed that differs from run
//! to run (printed; `RESMGR_FIRST_SEED` sets it); `RESMGR_STEPS=<n>` sets the steps per seed.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::PathBuf,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use integration_tests::{
    fakes::{DRIVER, claim_on, claim_ref, topology_aware},
    on_disk::{saved_claims, spec_uids},
    rng::Rng,
    settings::{clock_seed, env_u64},
};
use kube_dra::fake::StaticClaims;
use kubelet_plugin::RegistrationState;
use policy::{Container, ContainerUpdate, CpuSet, QosClass, Resources};
use resmgr::{
    BoxFuture, Manager, ManagerConfig, ReconcileConfig, Runtime, RuntimeError,
    claims::HOLD,
    dra_handler::LifecycleHandler,
    faults::{FaultHooks, Faults, Point},
    handover::{Hello, Owner},
    state::StateFile,
};
use resmgr_agent::node::{Kubelet, Node, Standing};
use tokio::{sync::watch, task::JoinSet};

/// One NUMA node of 4 two-thread cores: CPUs 0-7, CPU 0 reserved.
const MACHINE: &str = "pack:1 numa:1 core:4 pu:2";
const DEVICE: &str = "numa0";
/// At most this many claims are held at once, one CPU each: they always fit.
const MAX_CLAIMS: usize = 4;
/// At most this many agents live at once: the old one, a surge pod, and one more.
const MAX_AGENTS: usize = 3;

/// Seeds (and steps each) of the bounded run, the one `cargo test` and CI do.
const SEEDS: u64 = 200;
const STEPS: usize = 40;

/// The agents' fault hooks: disk work inline (so that a seed runs the same every time), and a
/// random pause at every step of a handover (half of them, up to 1.5 s), which widens the
/// windows between steps for the other agents' polls and the kubelet's calls to land in.
#[derive(Debug)]
struct Pauses(Mutex<Rng>);

impl FaultHooks for Pauses {
    fn inline(&self) -> bool {
        true
    }

    fn pause(&self, _point: Point) -> BoxFuture<'_, ()> {
        let wait = {
            let mut rng = self.0.lock().unwrap();
            if rng.chance(50) { rng.below(1500) } else { 0 }
        };
        Box::pin(async move {
            if wait > 0 {
                tokio::time::sleep(Duration::from_millis(wait)).await;
            }
        })
    }
}

// ============================================================================================
// The played runtime: one table of containers, one plugin connection at a time
// ============================================================================================

#[derive(Debug, Default)]
struct RuntimeTable {
    /// The agent connected as the runtime's NRI plugin.
    connected: Option<u64>,
    /// Containers and the CPUs they run on (`None`: every CPU, unadjusted).
    containers: BTreeMap<String, Container>,
    /// What broke invariant 1.
    violations: Vec<String>,
}

/// The runtime, shared by every agent's [`AgentRuntime`].
#[derive(Debug, Default)]
struct PlayedRuntime(Mutex<RuntimeTable>);

impl PlayedRuntime {
    fn table(&self) -> std::sync::MutexGuard<'_, RuntimeTable> {
        self.0.lock().unwrap()
    }

    /// Agent `id` registers as the runtime's plugin: the containers Synchronize lists.
    fn connect(&self, id: u64) -> Vec<Container> {
        let mut t = self.table();
        if let Some(other) = t.connected {
            t.violations.push(format!(
                "agent {id} connected to the runtime while agent {other} was connected"
            ));
        }
        t.connected = Some(id);
        t.containers.values().cloned().collect()
    }

    /// Agent `id`'s connection closes (it closed it, or it died).
    fn disconnect(&self, id: u64) {
        let mut t = self.table();
        if t.connected == Some(id) {
            t.connected = None;
        }
    }

    fn apply(&self, updates: &[ContainerUpdate]) {
        let mut t = self.table();
        for u in updates {
            if let (Some(c), Some(cpus)) = (t.containers.get_mut(&u.container_id), &u.cpus) {
                c.cpus = Some(cpus.clone());
            }
        }
    }
}

/// What agent `id`'s manager reaches of the runtime: its updates apply only while it is the
/// connected plugin; otherwise its connection is gone, as the NRI stub's would be.
#[derive(Debug)]
struct AgentRuntime {
    id: u64,
    runtime: Arc<PlayedRuntime>,
}

impl Runtime for AgentRuntime {
    fn update_containers(
        &self,
        updates: Vec<ContainerUpdate>,
    ) -> BoxFuture<'_, Result<Vec<String>, RuntimeError>> {
        Box::pin(async move {
            // A round trip: other tasks run meanwhile.
            tokio::task::yield_now().await;
            if self.runtime.table().connected != Some(self.id) {
                return Err(RuntimeError::Disconnected);
            }
            self.runtime.apply(&updates);
            Ok(Vec::new())
        })
    }
}

// ============================================================================================
// Agents
// ============================================================================================

/// A kubelet call's outcome, as the kubelet sees it.
#[derive(Debug)]
enum Answer {
    /// Every claim answered OK.
    Ok,
    /// Refused, or a claim failed: why.
    Failed(String),
}

/// One agent: a pod's `resmgr run`.
#[derive(Debug)]
struct Agent {
    pod: String,
    node: Arc<Node>,
    /// Everything the agent runs, the kubelet's calls to it included: aborted when it dies.
    tasks: JoinSet<()>,
    /// The kubelet's registration of it: set by the agent when it registers; the kubelet's
    /// order of registrations.
    registered: Arc<Mutex<Option<u64>>>,
}

/// What an agent's tasks need of the world.
#[derive(Debug, Clone)]
struct Node0 {
    state_dir: PathBuf,
    cdi_dir: PathBuf,
    runtime: Arc<PlayedRuntime>,
    api: Arc<StaticClaims>,
    faults: Faults,
    registrations: Arc<Mutex<u64>>,
}

impl Agent {
    /// Starts the agent of pod `pod` as `resmgr run` does: takes the node, then serves it.
    fn start(
        id: u64,
        pod: &str,
        generation: Option<u64>,
        world: &Node0,
        log: Arc<Mutex<Vec<String>>>,
    ) -> Self {
        let node = Arc::new(Node::new(world.faults.clone()));
        let registered = Arc::new(Mutex::new(None));
        let mut tasks = JoinSet::new();
        tasks.spawn(register(node.clone(), registered.clone(), world.clone()));
        let hello = Hello::new(pod).with_generation(generation);
        tasks.spawn(serve(id, hello, node.clone(), world.clone(), log));
        Self {
            pod: pod.to_owned(),
            node,
            tasks,
            registered,
        }
    }

    /// Whether the kubelet calls it: registered and not handed over (it deregisters then).
    fn registration(&self) -> Option<u64> {
        if matches!(self.node.standing(), Standing::HandedOver { .. }) {
            return None;
        }
        *self.registered.lock().unwrap()
    }
}

/// The agent's kubelet plugin: registers when the node tells it to, and the kubelet connects;
/// deregisters when it tells it to.
async fn register(node: Arc<Node>, registered: Arc<Mutex<Option<u64>>>, world: Node0) {
    loop {
        let registration = node.registering().await;
        let order = {
            let mut n = world.registrations.lock().unwrap();
            *n += 1;
            *n
        };
        *registered.lock().unwrap() = Some(order);
        // The senders live as long as the plugin serves.
        let (_registration, registration_rx) = watch::channel(RegistrationState::Registered);
        let (_connections, connections_rx) = watch::channel(1_u64);
        node.kubelet_serves(Kubelet {
            registration: registration_rx,
            connections: connections_rx,
        });
        node.registration_ends(registration).await;
        *registered.lock().unwrap() = None;
    }
}

/// `resmgr run`'s node task: takes the node, starts the manager from disk, serves handovers and
/// the runtime connection until it hands the node over.
async fn serve(id: u64, hello: Hello, node: Arc<Node>, world: Node0, log: Arc<Mutex<Vec<String>>>) {
    let pod = hello.pod_uid.clone();
    let state_file = StateFile::new(&world.state_dir);
    let (lock, predecessors) = match node.take(&state_file, Some(&hello), true).await {
        Ok(taken) => taken,
        Err(e) => {
            note(
                &log,
                format!("agent {id} ({pod}) could not take the node: {e:#}"),
            );
            return;
        }
    };
    let manager = Manager::start_locked(
        lock,
        ManagerConfig {
            faults: world.faults.clone(),
            reconcile: ReconcileConfig {
                pool: Some("node-a".into()),
                ..ReconcileConfig::default()
            },
            ..ManagerConfig::new(DRIVER)
        },
        topology_aware(MACHINE),
        state_file,
        cdi::SpecStore::new(&world.cdi_dir, DRIVER).unwrap(),
        Arc::new(AgentRuntime {
            id,
            runtime: world.runtime.clone(),
        }),
        world.api.clone(),
    );
    let manager = match manager {
        Ok(m) => Arc::new(m),
        Err(e) => {
            note(
                &log,
                format!(
                    "VIOLATION agent {id} ({pod}) could not start from disk: {}",
                    stdx::errors::chain(&e)
                ),
            );
            return;
        }
    };
    node.own(manager.clone());
    note(&log, format!("agent {id} ({pod}) owns the node"));
    let owner = Owner::bind(&world.state_dir, &hello, predecessors, world.faults.clone()).unwrap();
    let handovers = node.clone().serve_handovers(owner, manager.clone());
    let connection = runtime_connection(id, &node, &manager, &world.runtime);
    let (handed, ()) = tokio::join!(handovers, connection);
    handed.unwrap();
    note(&log, format!("agent {id} ({pod}) handed the node over"));
    std::future::pending::<()>().await;
}

/// The agent's NRI connection: Synchronize, then serving until the handover closes it.
async fn runtime_connection(
    id: u64,
    node: &Node,
    manager: &Arc<Manager>,
    runtime: &Arc<PlayedRuntime>,
) {
    if node.surrender.is_cancelled() {
        node.runtime_closed.send_replace(true);
        return;
    }
    let containers = runtime.connect(id);
    let updates = manager.synchronize(&containers).await.unwrap();
    runtime.apply(&updates);
    manager.synchronized().await;
    tokio::select! {
        () = node.surrender.cancelled() => {}
        () = manager.run_retries() => {}
    }
    runtime.disconnect(id);
    node.runtime_closed.send_replace(true);
}

fn note(log: &Mutex<Vec<String>>, line: String) {
    let at = tokio::time::Instant::now().into_std();
    let mut log = log.lock().unwrap();
    log.push(format!("{at:?} {line}"));
}

// ============================================================================================
// The world
// ============================================================================================

#[derive(Debug)]
struct World {
    rng: Rng,
    _dir: tempfile::TempDir,
    node0: Node0,
    agents: BTreeMap<u64, Agent>,
    /// The DaemonSet's pods, by UID: whether each is deleted, and its agent while it runs.
    pods: BTreeMap<String, PodModel>,
    /// The DaemonSet's newest pod: the one that must end up owning the node.
    current: Option<String>,
    next_id: u64,
    /// Claims answered OK, with the CPUs their spec grants.
    held: BTreeMap<String, CpuSet>,
    /// Kubelet calls in flight: the agent called, what, and where the answer comes.
    calls: Vec<Call>,
    /// The claims the API server holds for this node.
    api_claims: BTreeSet<String>,
    /// Whether the agents know their pods' template generations.
    generations: bool,
    /// Owners whose successor died before they handed the node over: (owner, successor pod,
    /// the agents of that pod started by then).
    called_off: Vec<(u64, String, u64)>,
    log: Arc<Mutex<Vec<String>>>,
    stats: Stats,
}

/// One of the DaemonSet's pods.
#[derive(Debug, Default)]
struct PodModel {
    /// The DaemonSet template generation it was made from, when its agents know it.
    generation: Option<u64>,
    /// Deleted: its agent is gone for good.
    deleted: bool,
    /// An agent of it handed the node over.
    handed_over: bool,
    /// How many agents of it started.
    starts: u64,
    /// Its agent, while it runs.
    agent: Option<u64>,
}

#[derive(Debug)]
struct Call {
    agent: u64,
    uid: String,
    prepare: bool,
    answer: tokio::sync::oneshot::Receiver<Answer>,
}

#[derive(Debug, Default, Clone, Copy)]
struct Stats {
    agents: u64,
    kills: u64,
    handovers: u64,
    prepares_ok: u64,
    unprepares_ok: u64,
    calls_lost: u64,
    refused_mid_handover: u64,
    containers: u64,
}

impl Stats {
    fn add(&mut self, o: &Stats) {
        self.agents += o.agents;
        self.kills += o.kills;
        self.handovers += o.handovers;
        self.prepares_ok += o.prepares_ok;
        self.unprepares_ok += o.unprepares_ok;
        self.calls_lost += o.calls_lost;
        self.refused_mid_handover += o.refused_mid_handover;
        self.containers += o.containers;
    }
}

impl World {
    fn new(seed: u64) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let mut rng = Rng(seed);
        let faults = Faults::new(Arc::new(Pauses(Mutex::new(Rng(rng.next_u64())))));
        let node0 = Node0 {
            state_dir: dir.path().join("state"),
            cdi_dir: dir.path().join("cdi"),
            runtime: Arc::new(PlayedRuntime::default()),
            api: Arc::new(StaticClaims::new()),
            faults,
            registrations: Arc::new(Mutex::new(0)),
        };
        Self {
            rng,
            _dir: dir,
            node0,
            agents: BTreeMap::new(),
            pods: BTreeMap::new(),
            current: None,
            next_id: 0,
            held: BTreeMap::new(),
            calls: Vec::new(),
            api_claims: BTreeSet::new(),
            generations: seed.is_multiple_of(2),
            called_off: Vec::new(),
            log: Arc::new(Mutex::new(Vec::new())),
            stats: Stats::default(),
        }
    }

    fn note(&self, line: String) {
        note(&self.log, line);
    }

    fn id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    /// A rolling update's surge pod: the DaemonSet's newest, whose agent starts.
    fn surge(&mut self) {
        let pod = format!("pod-{}", self.id());
        // Half the seeds' agents know their pods' generations (`pod-generation`), half do
        // not: then only the pods that handed the node over are refused.
        let generation = self.generations.then(|| self.pods.len() as u64 + 1);
        self.pods.insert(
            pod.clone(),
            PodModel {
                generation,
                ..PodModel::default()
            },
        );
        self.current = Some(pod.clone());
        self.start_agent(&pod);
    }

    /// Whether a new rolling update may start now. With generations, always. Without them, only
    /// once the newest pod's agent owns the node (or its pod has none): a newer pod that comes
    /// while an older new one still waits to take the node over (two rollouts in quick
    /// succession) is the case generations exist for; without them, whichever of the two asks
    /// the owner last takes the node, which may be the older (docs/deploy.md, "Upgrading").
    fn may_surge(&self) -> bool {
        self.generations
            || self.current.as_ref().is_none_or(|c| {
                self.pods[c]
                    .agent
                    .is_none_or(|id| self.agents[&id].node.standing() == Standing::Owner)
            })
    }

    /// The kubelet restarts the container of a pod whose agent died.
    fn restart_one(&mut self) {
        // Without generations, an agent cannot tell an old pod's restarted agent from a new
        // one, unless that pod handed the node over (docs/deploy.md, "Upgrading"): such seeds
        // restart only the newest pod's agent and those of pods that handed the node over.
        let dead: Vec<String> = self
            .pods
            .iter()
            .filter(|(uid, p)| {
                !p.deleted
                    && p.agent.is_none()
                    && (self.generations || p.handed_over || Some(*uid) == self.current.as_ref())
            })
            .map(|(uid, _)| uid.clone())
            .collect();
        if !dead.is_empty() {
            let pod = dead[self.rng.index(dead.len())].clone();
            self.start_agent(&pod);
        }
    }

    /// Starts the agent of pod `pod`.
    fn start_agent(&mut self, pod: &str) {
        let id = self.id();
        self.note(format!("agent {id} starts, pod {pod}"));
        self.stats.agents += 1;
        let generation = self.pods[pod].generation;
        let agent = Agent::start(id, pod, generation, &self.node0, self.log.clone());
        self.agents.insert(id, agent);
        if let Some(p) = self.pods.get_mut(pod) {
            p.agent = Some(id);
            p.starts += 1;
        }
    }

    /// Kills agent `id` where it stands: its tasks stop, its descriptors close. Its pod's
    /// container is restarted later, unless the pod is deleted.
    fn kill(&mut self, id: u64) {
        let Some(mut agent) = self.agents.remove(&id) else {
            return;
        };
        self.note(format!(
            "agent {id} ({}) dies: {:?}",
            agent.pod,
            agent.node.standing()
        ));
        self.stats.kills += 1;
        // An owner it was taking the node over from, that has not handed it over yet, must not
        // hand it over to it now.
        if let Standing::TakingOver { from } = agent.node.standing()
            && let Some((owner, _)) = self
                .agents
                .iter()
                .find(|(_, a)| a.pod == from && a.node.manager().is_some_and(|m| !m.handed_over()))
        {
            let starts = self.pods.get(&agent.pod).map_or(0, |p| p.starts);
            self.called_off.push((*owner, agent.pod.clone(), starts));
        }
        agent.tasks.abort_all();
        self.node0.runtime.disconnect(id);
        if let Some(p) = self.pods.get_mut(&agent.pod) {
            p.agent = None;
            p.handed_over |= matches!(agent.node.standing(), Standing::HandedOver { .. });
        }
    }

    /// The DaemonSet deletes a pod it replaced, once its newest pod is ready (owns the node).
    fn delete_old_pod(&mut self) {
        let ready = self
            .current
            .as_ref()
            .and_then(|c| self.pods[c].agent)
            .is_some_and(|id| self.agents[&id].node.standing() == Standing::Owner);
        let old: Vec<String> = self
            .pods
            .iter()
            .filter(|(uid, p)| !p.deleted && Some(*uid) != self.current.as_ref())
            .map(|(uid, _)| uid.clone())
            .collect();
        if !ready || old.is_empty() {
            return;
        }
        let pod = old[self.rng.index(old.len())].clone();
        self.note(format!("the DaemonSet deletes pod {pod}"));
        if let Some(id) = self.pods[&pod].agent {
            self.kill(id);
        }
        self.pods.get_mut(&pod).unwrap().deleted = true;
    }

    /// The agent the kubelet calls: the newest it registered that has not deregistered.
    fn called(&self) -> Option<u64> {
        self.agents
            .iter()
            .filter_map(|(id, a)| a.registration().map(|order| (order, *id)))
            .max()
            .map(|(_, id)| id)
    }

    /// The kubelet calls `uid`'s prepare (or unprepare) on the agent it calls, held until the
    /// agent owns the node, as the binary holds it (`run::measured`).
    fn call(&mut self, uid: &str, prepare: bool) {
        let Some(id) = self.called() else {
            return;
        };
        let (tx, rx) = tokio::sync::oneshot::channel();
        let node = self.agents[&id].node.clone();
        let claim = claim_ref(uid);
        self.note(format!(
            "kubelet: {} {uid} on agent {id}",
            if prepare { "prepare" } else { "unprepare" }
        ));
        self.agents.get_mut(&id).unwrap().tasks.spawn(async move {
            let deadline = tokio::time::Instant::now() + HOLD;
            let answer = match node.manager_until(deadline).await {
                // As the binary answers it (`run::measured`).
                None => Answer::Failed(format!(
                    "Unavailable: the agent does not own the node ({:?}), after {:?}",
                    node.standing(),
                    HOLD - deadline.saturating_duration_since(tokio::time::Instant::now())
                )),
                Some(manager) => {
                    let handler = LifecycleHandler::new(manager);
                    let claims = std::slice::from_ref(&claim);
                    if prepare {
                        match handler.prepare_until(claims, deadline).await {
                            Ok(results) => match &results[&claim.uid] {
                                Ok(_) => Answer::Ok,
                                Err(e) => Answer::Failed(format!("{e:?}")),
                            },
                            Err(e) => Answer::Failed(format!("{e:?}")),
                        }
                    } else {
                        match handler.unprepare_until(claims, deadline).await {
                            Ok(results) => match &results[&claim.uid] {
                                Ok(()) => Answer::Ok,
                                Err(e) => Answer::Failed(format!("{e:?}")),
                            },
                            Err(e) => Answer::Failed(format!("{e:?}")),
                        }
                    }
                }
            };
            let _ = tx.send(answer);
        });
        self.calls.push(Call {
            agent: id,
            uid: uid.to_owned(),
            prepare,
            answer: rx,
        });
    }

    /// The answers that came: invariants 3 and 4's bookkeeping.
    fn collect_answers(&mut self) -> Result<(), String> {
        let mut still = Vec::new();
        let mut retries = Vec::new();
        for mut call in std::mem::take(&mut self.calls) {
            match call.answer.try_recv() {
                Err(tokio::sync::oneshot::error::TryRecvError::Empty) => still.push(call),
                Err(tokio::sync::oneshot::error::TryRecvError::Closed) => {
                    // The agent died during the call: the kubelet retries later.
                    self.stats.calls_lost += 1;
                    self.note(format!("kubelet: the call for {} was lost", call.uid));
                }
                // The kubelet sent the call to an agent that cannot serve it any more: one that
                // handed the node over since (the call arrived after the successor registered;
                // or the successor registered before it, in standby, so the kubelet kept
                // calling it; or the successor died once there was no way back), or one in
                // standby that the owner refused since (it deregistered; it may own the node
                // again by now, having taken the lock once its owner died). It is refused
                // saying so, and the kubelet's retry reaches the agent it calls now, or the
                // successor's restarted container.
                Ok(Answer::Failed(why))
                    if why.starts_with("Unavailable")
                        && (self.called().is_some_and(|now| now != call.agent)
                            || Self::refused_standby(&why)
                            || self.successor_died(&why)
                            || self.successor_registered_first(&why, call.agent)) =>
                {
                    self.stats.refused_mid_handover += 1;
                    self.note(format!(
                        "kubelet: the call for {} on agent {} was refused ({why}); retrying",
                        call.uid, call.agent
                    ));
                    retries.push((call.uid, call.prepare));
                }
                Ok(Answer::Failed(why)) => {
                    return Err(format!(
                        "agent {} failed the kubelet's {} of {}: {why}",
                        call.agent,
                        if call.prepare { "prepare" } else { "unprepare" },
                        call.uid
                    ));
                }
                Ok(Answer::Ok) if call.prepare => {
                    let cpus = self.spec_cpus(&call.uid)?;
                    if let Some(before) = self.held.get(&call.uid)
                        && *before != cpus
                    {
                        return Err(format!("{} was granted {before}, and now {cpus}", call.uid));
                    }
                    self.stats.prepares_ok += 1;
                    self.note(format!("kubelet: {} prepared, cpus {cpus}", call.uid));
                    self.held.insert(call.uid, cpus);
                }
                Ok(Answer::Ok) => {
                    self.stats.unprepares_ok += 1;
                    self.note(format!("kubelet: {} unprepared", call.uid));
                    self.held.remove(&call.uid);
                    // The pod is gone, and its claim with it.
                    self.node0.api.remove("default", &claim_ref(&call.uid).name);
                    self.api_claims.remove(&call.uid);
                }
            }
        }
        self.calls = still;
        for (uid, prepare) in retries {
            self.call(&uid, prepare);
        }
        Ok(())
    }

    /// The successor a refusal names (`... handed the node over to the agent of pod X`).
    fn successor_named(why: &str) -> Option<&str> {
        why.split("handed the node over to the agent of pod ")
            .nth(1)
            .map(|rest| rest.trim_end_matches(['"', ')']))
    }

    /// Whether `why` is the refusal of an agent in standby whose owner refused it.
    fn refused_standby(why: &str) -> bool {
        why.contains("the agent does not own the node (Refused")
    }

    /// Whether `why`, a refusal naming the successor the node was handed to, names one whose
    /// agent died: none of its pod's agents is registered with the kubelet (its restarted
    /// container's may be starting), so the kubelet still calls the agent that handed over.
    fn successor_died(&self, why: &str) -> bool {
        Self::successor_named(why).is_some_and(|pod| {
            !self
                .agents
                .values()
                .any(|a| a.pod == pod && a.registration().is_some())
        })
    }

    /// Whether `why`, a refusal naming the successor the node was handed to, names one that
    /// registered with the kubelet before agent `refusing` did (in standby): the kubelet calls
    /// the newest registered, so it called the old owner until that one deregistered.
    fn successor_registered_first(&self, why: &str, refusing: u64) -> bool {
        let Some(pod) = Self::successor_named(why) else {
            return false;
        };
        let Some(theirs) = self
            .agents
            .get(&refusing)
            .and_then(|a| *a.registered.lock().unwrap())
        else {
            return true;
        };
        self.agents
            .values()
            .filter(|a| a.pod == pod)
            .filter_map(|a| *a.registered.lock().unwrap())
            .any(|order| order < theirs)
    }

    fn busy(&self, uid: &str) -> bool {
        self.calls.iter().any(|c| c.uid == uid)
    }

    /// The kubelet prepares a new claim, or again a held one, or unprepares one.
    fn kubelet_step(&mut self) {
        let held: Vec<String> = self
            .held
            .keys()
            .filter(|u| !self.busy(u))
            .cloned()
            .collect();
        let pending: Vec<String> = self
            .api_claims
            .iter()
            .filter(|u| !self.held.contains_key(*u) && !self.busy(u))
            .cloned()
            .collect();
        match self.rng.below(3) {
            0 if !held.is_empty() => {
                let uid = held[self.rng.index(held.len())].clone();
                self.call(&uid, false);
            }
            1 if !held.is_empty() => {
                let uid = held[self.rng.index(held.len())].clone();
                self.call(&uid, true);
            }
            _ if !pending.is_empty() => {
                let uid = pending[self.rng.index(pending.len())].clone();
                self.call(&uid, true);
            }
            _ if self.api_claims.len() < MAX_CLAIMS => {
                let uid = format!("c{}", self.id());
                self.node0
                    .api
                    .insert(claim_on(&uid, &format!("pod-of-{uid}"), DEVICE, 1));
                self.api_claims.insert(uid.clone());
                self.call(&uid, true);
            }
            _ => {}
        }
    }

    /// The runtime creates a container (through the connected agent, or unadjusted in the gap),
    /// or removes one.
    async fn runtime_step(&mut self) -> Result<(), String> {
        let connected = self.node0.runtime.table().connected;
        let manager = connected
            .and_then(|id| self.agents.get(&id))
            .and_then(|a| a.node.manager().cloned());
        let existing: Vec<String> = self
            .node0
            .runtime
            .table()
            .containers
            .keys()
            .cloned()
            .collect();
        if !existing.is_empty() && self.rng.chance(30) {
            let id = existing[self.rng.index(existing.len())].clone();
            let c = self.node0.runtime.table().containers.remove(&id);
            if let (Some(m), Some(c)) = (manager, c) {
                m.stop_container(&c).await;
                m.remove_container(&c).await;
            }
            self.note(format!("runtime: {id} removed"));
            return Ok(());
        }
        let n = self.id();
        let mut c = Container {
            id: format!("ctr-{n}"),
            pod: policy::Pod {
                uid: format!("plain-{n}"),
                namespace: "default".into(),
                name: format!("plain-{n}"),
                qos: QosClass::Burstable,
                annotations: BTreeMap::new(),
            },
            name: "app".into(),
            resources: Resources {
                cpu_request_milli: 100,
                ..Resources::default()
            },
            ..Container::default()
        };
        match manager {
            Some(m) => match m.create_container(&c).await {
                Ok(allocation) => {
                    c.cpus = allocation.adjustment.cpus.clone();
                    self.node0
                        .runtime
                        .table()
                        .containers
                        .insert(c.id.clone(), c.clone());
                    self.node0.runtime.apply(&allocation.updates);
                    // The runtime starts it at once, and says so.
                    m.container_started(&c).await;
                }
                Err(e) => return Err(format!("creating {}: {}", c.id, stdx::errors::chain(&e))),
            },
            None => {
                // The gap: created as the kubelet asked, placed by the next Synchronize.
                self.node0
                    .runtime
                    .table()
                    .containers
                    .insert(c.id.clone(), c.clone());
            }
        }
        self.stats.containers += 1;
        self.note(format!(
            "runtime: {} created, cpus {:?}",
            c.id,
            c.cpus.as_ref().map(ToString::to_string)
        ));
        Ok(())
    }

    async fn step(&mut self) -> Result<(), String> {
        let live = self.agents.len();
        match self.rng.below(100) {
            0..12 if live < MAX_AGENTS && self.may_surge() => self.surge(),
            12..22 if live < MAX_AGENTS => self.restart_one(),
            22..32 if live > 0 => {
                let ids: Vec<u64> = self.agents.keys().copied().collect();
                let id = ids[self.rng.index(ids.len())];
                // A random instant: up to a few seconds on.
                let wait = self.rng.below(3000);
                tokio::time::sleep(Duration::from_millis(wait)).await;
                self.kill(id);
            }
            32..38 => self.delete_old_pod(),
            38..72 => self.kubelet_step(),
            72..92 => self.runtime_step().await?,
            _ => {}
        }
        if self.agents.is_empty() {
            self.surge();
        }
        let wait = self.rng.below(2000);
        tokio::time::sleep(Duration::from_millis(wait)).await;
        self.collect_answers()?;
        self.check()
    }

    /// Invariants 1 and 2, and the agents' own complaints.
    fn check(&self) -> Result<(), String> {
        if let Some(v) = self.node0.runtime.table().violations.first() {
            return Err(v.clone());
        }
        for (owner, to, starts) in &self.called_off {
            let handed = self.agents.get(owner).is_some_and(
                |a| matches!(a.node.standing(), Standing::HandedOver { to: t } if t == *to),
            );
            // Unless another agent of that pod started since, and asked again.
            if handed && self.pods.get(to).is_some_and(|p| p.starts == *starts) {
                return Err(format!(
                    "agent {owner} handed the node over to the agent of pod {to}, which died before the owner let go of anything: the handover should have been called off"
                ));
            }
        }
        if let Some(v) = self
            .log
            .lock()
            .unwrap()
            .iter()
            .find(|l| l.starts_with("VIOLATION"))
        {
            return Err(v.clone());
        }
        let state = saved_claims(&self.node0.state_dir)?;
        let specs = spec_uids(&self.node0.cdi_dir)?;
        for uid in &specs {
            if !state.contains_key(uid) {
                return Err(format!(
                    "the spec of {uid} is on disk, and the state on disk has no such claim"
                ));
            }
        }
        let mut seen = CpuSet::default();
        for (uid, cpus) in &state {
            if !seen.intersection(cpus).is_empty() {
                return Err(format!("claim {uid}'s CPUs {cpus} are another claim's too"));
            }
            seen = seen.union(cpus);
        }
        Ok(())
    }

    /// The CPUs claim `uid`'s spec grants.
    fn spec_cpus(&self, uid: &str) -> Result<CpuSet, String> {
        let edits = cdi::SpecStore::new(&self.node0.cdi_dir, DRIVER)
            .and_then(|store| store.read_claim(uid))
            .map_err(|e| format!("the spec of {uid}: {}", stdx::errors::chain(&e)))?;
        let var = format!("DRA_CPUSET_{uid}=");
        let mut cpus = CpuSet::new();
        for e in edits {
            let v = e
                .env
                .iter()
                .find_map(|v| v.strip_prefix(&var))
                .ok_or_else(|| format!("the spec of {uid} sets no {var}"))?;
            cpus = cpus.union(&v.parse().map_err(|e| format!("the spec of {uid}: {e:?}"))?);
        }
        Ok(cpus)
    }

    /// No more agents start or die: every call is answered, the agent the kubelet calls owns
    /// the node, and every held claim is still granted (invariants 3 to 5).
    async fn settle(&mut self) -> Result<(), String> {
        // The kubelet restarts every container that died, and no more die; then the DaemonSet
        // deletes the pods it replaced once its newest is ready. Long enough for any takeover
        // under way: a held call's HOLD, and the new agent's lock poll after an owner died.
        // (Without generations, the pods restart_one leaves dead are deleted.)
        loop {
            let before = self.agents.len();
            self.restart_one();
            if self.agents.len() == before {
                break;
            }
        }
        for p in self.pods.values_mut() {
            p.deleted |= p.agent.is_none();
        }
        tokio::time::sleep(HOLD + Duration::from_secs(5)).await;
        self.collect_answers()?;
        let current = self.current.clone().ok_or("no pod")?;
        let current_agent = self.pods[&current]
            .agent
            .ok_or("the newest pod has no agent")?;
        if self.agents[&current_agent].node.standing() != Standing::Owner {
            return Err(format!(
                "the newest pod's agent ({current_agent}) does not own the node: {:?}",
                self.agents[&current_agent].node.standing()
            ));
        }
        while self
            .pods
            .iter()
            .any(|(uid, p)| !p.deleted && *uid != current)
        {
            self.delete_old_pod();
        }
        tokio::time::sleep(Duration::from_secs(5)).await;
        self.collect_answers()?;
        if let Some(call) = self.calls.first() {
            return Err(format!(
                "the kubelet's call for {} on agent {} was never answered",
                call.uid, call.agent
            ));
        }
        let called = self.called().ok_or("the kubelet calls no agent")?;
        if called != current_agent {
            return Err(format!(
                "the kubelet calls agent {called}, not the newest pod's ({current_agent})"
            ));
        }
        let agent = &self.agents[&called];
        if agent.node.standing() != Standing::Owner || agent.node.manager().is_none() {
            return Err(format!(
                "the agent the kubelet calls ({called}) does not own the node: {:?}",
                agent.node.standing()
            ));
        }
        let connected = self.node0.runtime.table().connected;
        if connected != Some(called) {
            return Err(format!(
                "the agent the kubelet calls ({called}) is not the runtime's plugin ({connected:?})"
            ));
        }
        // The kubelet re-prepares every held claim (as after a restart): same CPUs, at once.
        for uid in self.held.keys().cloned().collect::<Vec<_>>() {
            self.call(&uid, true);
        }
        tokio::time::sleep(Duration::from_secs(15)).await;
        self.collect_answers()?;
        if !self.calls.is_empty() {
            return Err("re-prepares of held claims were not answered".into());
        }
        self.check()?;
        let containers = self.node0.runtime.table().containers.clone();
        for c in containers.values() {
            let Some(cpus) = &c.cpus else {
                return Err(format!("{} was never placed: it runs on every CPU", c.id));
            };
            for (uid, held) in &self.held {
                if !cpus.intersection(held).is_empty() {
                    return Err(format!(
                        "{} runs on {cpus}, which {uid} holds ({held})",
                        c.id
                    ));
                }
            }
        }
        Ok(())
    }
}

fn run_seed(seed: u64, steps: usize) -> Result<Stats, String> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap();
    runtime.block_on(async {
        let mut world = World::new(seed);
        world.surge();
        let mut failed = None;
        for step in 0..steps {
            world.note(format!("step {step}:"));
            if let Err(e) = world.step().await {
                failed = Some(format!("step {step}: {e}"));
                break;
            }
        }
        if failed.is_none() {
            world.note("settle:".into());
            if let Err(e) = world.settle().await {
                failed = Some(format!("settling: {e}"));
            }
        }
        let mut stats = world.stats;
        stats.handovers = world
            .log
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l.ends_with("handed the node over"))
            .count() as u64;
        for agent in world.agents.values_mut() {
            agent.tasks.abort_all();
        }
        match failed {
            None => Ok(stats),
            Some(e) => {
                let log = world.log.lock().unwrap();
                let tail: Vec<&str> = log
                    .iter()
                    .rev()
                    .take(60)
                    .rev()
                    .map(String::as_str)
                    .collect();
                Err(format!(
                    "seed {seed}, {e}\nthe last steps:\n{}",
                    tail.join("\n")
                ))
            }
        }
    })
}

#[test]
fn agents_that_start_die_and_hand_over_at_random_keep_one_owner_and_the_claims() {
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
            "random handover: soaking from seed {first} (RESMGR_FIRST_SEED={first} repeats this run)"
        );
    }
    let started = Instant::now();
    let mut total = Stats::default();
    let mut seeds = 0;
    let mut seed = only.unwrap_or(first);
    loop {
        match run_seed(seed, steps) {
            Ok(stats) => total.add(&stats),
            Err(failure) => panic!(
                "{failure}\nreproduce with: RESMGR_SEED={seed} RESMGR_STEPS={steps} cargo test -p integration-tests --test random_handover -- --nocapture"
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
        "random handover: {seeds} seeds, {steps} steps each, in {:.1?}: {total:?}",
        started.elapsed()
    );
    assert!(
        total.kills > 0 && total.prepares_ok > 0 && total.unprepares_ok > 0 && total.agents > seeds,
        "the run exercised nothing: {total:?}"
    );
}
