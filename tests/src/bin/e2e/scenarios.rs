//! The scenarios, run in order on one node, and the model that says what every container must
//! have at every moment.
//!
//! The model is ours, not the agent's: the reserved CPUs are what we configured; a claim holds
//! the CPUs its CDI spec names (checked: as many as allocated, on the allocated NUMA node, none
//! reserved or held by anyone else); an exclusive container holds what the kernel shows it has
//! (checked the same way); and the shared containers hold every other allowed CPU, or the
//! reserved CPUs when grants took all of them (the kubelet admitted them: they must run). After
//! each step every running container is checked in the kernel's view, its cgroup's cpuset and
//! its process's `Cpus_allowed_list`/`Mems_allowed_list`, so a container that moved when it
//! should not have fails as surely as one that did not move.
//!
//! Exclusive means alone: after each step no CPU of an exclusive container or of a prepared
//! claim is in the cpuset of any other running container the runtime knows of, whoever
//! started it (the agent's own container included). A container can hold the only CPU its
//! expectation allows and still share it; only this check sees that.
//!
//! The scenarios run in phases, one agent configuration each: `nri-pods` (`cpu-exclusivity:
//! pods`, nri-plugins' behaviour: Guaranteed containers get exclusive CPUs) and `dra-claims`
//! (the default: only claims are exclusive). Between phases the agent stops, the pods go, and
//! the next phase's agent starts from a state directory of its own.
//!
//! They are designed for a 2-CPU machine (one CPU reserved, one for everything else, so that
//! every grant empties the shared pool and every release refills it) and use more CPUs when
//! there are more: a claim takes half of its NUMA node's claimable CPUs.

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt::Write as _,
    path::Path,
};

use anyhow::{Context as _, bail, ensure};
use policy::{CpuSet, NodeSet};
use rustix::process::Signal;

use crate::{
    agent::{Agent, AgentConfig},
    apiserver::AllocatedClaim,
    cri::{Container, Cri, Pod, Qos},
    kernel::{self, Machine},
    kubelet::Kubelet,
    runtime::{Kind, Runtime},
    teardown::{self, Teardown},
};

/// What a container must have.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Expect {
    /// The reserved CPUs (a reserved namespace).
    Reserved,
    /// The shared CPUs: every allowed CPU nobody holds.
    Shared,
    /// Exclusive CPUs of its own (its key in the grants).
    Exclusive,
    /// The CPUs of the claim with this UID.
    Claim(String),
}

/// A running container.
#[derive(Debug, Clone)]
pub struct Running {
    /// `namespace/pod/container`.
    pub key: String,
    pub pod: String,
    pub id: String,
    pub pid: u32,
    pub expect: Expect,
    /// The cpuset the runtime reported right after creating it (CRI ContainerStatus).
    pub reported_at_creation: Option<CpuSet>,
}

/// One line of the report.
#[derive(Debug, Clone)]
pub struct Row {
    pub scenario: String,
    pub container: String,
    pub expected_cpus: String,
    pub cgroup_cpus: String,
    pub allowed_cpus: String,
    pub expected_mems: String,
    pub cgroup_mems: String,
    pub allowed_mems: String,
    pub ok: bool,
}

/// A claim's grant, from its CDI spec.
#[derive(Debug, Clone)]
pub struct Grant {
    pub cpus: CpuSet,
    pub mems: NodeSet,
    pub cdi_devices: Vec<String>,
}

/// CPUs that must be one holder's alone: an exclusive container's, or a prepared claim's.
#[derive(Debug, Clone)]
pub struct Holder {
    /// What holds them, as the failure names it.
    pub name: String,
    pub cpus: CpuSet,
    /// IDs of the containers that may run on them (the container; the claim's containers).
    pub members: BTreeSet<String>,
}

/// A running container as the kernel sees it.
#[derive(Debug, Clone)]
pub struct Seen {
    pub id: String,
    /// `namespace/pod/container`.
    pub key: String,
    pub cgroup_cpus: CpuSet,
    pub allowed_cpus: CpuSet,
}

/// A container that may run on CPUs another holds exclusively.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Intrusion {
    pub holder: String,
    pub members: BTreeSet<String>,
    pub intruder: String,
    pub cpus: CpuSet,
    pub message: String,
}

/// Every pair of a holder and a running container outside it whose cpuset (the cgroup's or
/// the scheduler's) meets the holder's CPUs.
pub fn intrusions(holders: &[Holder], seen: &[Seen]) -> Vec<Intrusion> {
    let mut found = Vec::new();
    for h in holders {
        for s in seen.iter().filter(|s| !h.members.contains(&s.id)) {
            let cpus = h.cpus.intersection(&s.cgroup_cpus.union(&s.allowed_cpus));
            if cpus.is_empty() {
                continue;
            }
            found.push(Intrusion {
                holder: h.name.clone(),
                members: h.members.clone(),
                intruder: s.key.clone(),
                message: format!(
                    "{} holds cpus {} exclusively, yet they are shared: {} (container {}) may run on cpus {cpus} (cpuset.cpus {}, Cpus_allowed_list {})",
                    h.name,
                    h.cpus,
                    s.key,
                    s.id,
                    s.cgroup_cpus,
                    s.allowed_cpus
                ),
                cpus,
            });
        }
    }
    found
}

/// The node and everything the scenarios know about it.
#[derive(Debug)]
pub struct World {
    pub machine: Machine,
    pub reserved: CpuSet,
    pub cri: Cri,
    pub runtime: Box<dyn Runtime>,
    pub kubelet: Kubelet,
    pub agent_config: AgentConfig,
    pub agent: Option<Agent>,
    pub teardown: Teardown,
    pub claims: Vec<AllocatedClaim>,
    /// Pod name -> (sandbox ID, pod).
    pub pods: BTreeMap<String, (String, Pod)>,
    pub running: Vec<Running>,
    /// Exclusive containers' CPUs by key.
    pub exclusive: BTreeMap<String, CpuSet>,
    /// Claims' grants by UID.
    pub granted: BTreeMap<String, Grant>,
    pub rows: Vec<Row>,
    /// What a scenario could not exercise on this machine, and why.
    pub notes: Vec<String>,
    /// Why the hugetlb limits cannot be checked on this machine, if they cannot.
    pub hugetlb_unavailable: Option<String>,
    scenario: String,
    /// Every running container the runtime listed last: ID -> (`namespace/pod/container`, pid).
    listed: BTreeMap<String, (String, u32)>,
}

/// A scenario: a name and what it does.
pub type Scenario = (&'static str, fn(&mut World) -> anyhow::Result<()>);

/// Scenarios that run under one agent configuration.
#[derive(Debug)]
pub struct Phase {
    pub name: &'static str,
    /// `resmgr run` flags of the phase.
    pub agent_args: &'static [&'static str],
    /// In order: each builds on what the one before left.
    pub scenarios: &'static [Scenario],
}

/// Every phase, in the order they run.
pub const PHASES: &[Phase] = &[
    Phase {
        name: "nri-pods",
        agent_args: &["--cpu-exclusivity=pods"],
        scenarios: &[("exclusive", exclusive)],
    },
    Phase {
        name: "dra-claims",
        // Claims may ask for memory and hugepages (claims that do not are unchanged).
        agent_args: &["--claim-memory=10%", "--claim-hugepages=true"],
        scenarios: &[
            ("reserved", reserved),
            ("guaranteed-shares", guaranteed_shares),
            ("shared", shared),
            ("resize", resize),
            ("claim", claim),
            ("agent-sigterm", |w| agent_restart(w, Signal::TERM)),
            ("agent-sigkill", |w| agent_restart(w, Signal::KILL)),
            ("runtime-restart", runtime_restart),
            ("unprepare", unprepare),
            ("create-while-prepare", create_while_prepare),
            ("stray-spec", stray_spec),
            ("memory-claim", memory_claim),
        ],
    },
];

/// The scenarios this runner runs on CRI-O, and why each needs it: the cluster stage runs every
/// kubelet-driven case on CRI-O under the real kubelet (tests/controlplane/clusterscenarios, one
/// cluster per runtime), so what stays here is what a real kubelet gives no hold on, an exact
/// instant or a fault, and what those build on. `--only` still runs any scenario on CRI-O.
pub const ON_CRIO: &[(&str, &str)] = &[
    (
        "shared",
        "the shared container the claim moves, which the scenarios after it build on",
    ),
    (
        "claim",
        "the claim the scenarios after it act on (its placement under the real kubelet: the cluster stage)",
    ),
    (
        "agent-sigkill",
        "the agent killed with SIGKILL between two given steps; the kubelet only ever deletes its pod (SIGTERM), which the cluster stage does",
    ),
    (
        "runtime-restart",
        "what CRI-O reports at the moment it is back, before the agent synchronizes again: it forgets NRI's updates",
    ),
    (
        "unprepare",
        "the claim given back at a given step, before the race below (its unprepare under the real kubelet: the cluster stage)",
    ),
    (
        "create-while-prepare",
        "a container created at given instants while a claim is prepared, the kernel sampled all along",
    ),
    (
        "stray-spec",
        "a fault: a stray CDI spec planted while the agent is down",
    ),
];

/// The command of every test container: a shell that execs a long sleep, so the process the
/// kernel shows is the one the environment check reads, with what a shell passes on.
fn sleeper() -> Vec<String> {
    vec![
        "/bin/sh".into(),
        "-c".into(),
        "exec /bin/sleep 2147483647".into(),
    ]
}

impl World {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        machine: Machine,
        reserved: CpuSet,
        cri: Cri,
        runtime: Box<dyn Runtime>,
        kubelet: Kubelet,
        agent_config: AgentConfig,
        teardown: Teardown,
        claims: Vec<AllocatedClaim>,
        hugetlb_unavailable: Option<String>,
    ) -> Self {
        Self {
            machine,
            reserved,
            cri,
            runtime,
            kubelet,
            agent_config,
            agent: None,
            teardown,
            claims,
            pods: BTreeMap::new(),
            running: Vec::new(),
            exclusive: BTreeMap::new(),
            granted: BTreeMap::new(),
            rows: Vec::new(),
            notes: Vec::new(),
            hugetlb_unavailable,
            scenario: String::new(),
            listed: BTreeMap::new(),
        }
    }

    /// Runs the scenarios named in `only` (all when empty), phase by phase.
    pub fn run(&mut self, only: &[String]) -> anyhow::Result<()> {
        let names: Vec<&str> = PHASES
            .iter()
            .flat_map(|p| p.scenarios.iter().map(|(n, _)| *n))
            .collect();
        if let Some(unknown) = only.iter().find(|o| !names.contains(&o.as_str())) {
            bail!("no scenario {unknown:?}; there are {}", names.join(", "));
        }
        let only: Vec<String> = if only.is_empty() && self.runtime.kind() == Kind::Crio {
            for (name, why) in ON_CRIO {
                eprintln!("e2e: on CRI-O, {name}: {why}");
            }
            let covered: Vec<&str> = names
                .iter()
                .copied()
                .filter(|n| !ON_CRIO.iter().any(|(o, _)| o == n))
                .collect();
            eprintln!(
                "e2e: on CRI-O the cluster stage runs what the others check, with the real kubelet: {}",
                covered.join(", ")
            );
            ON_CRIO.iter().map(|(n, _)| (*n).to_owned()).collect()
        } else {
            only.to_vec()
        };
        let only = only.as_slice();
        for phase in PHASES {
            let chosen: Vec<&Scenario> = phase
                .scenarios
                .iter()
                .filter(|(name, _)| only.is_empty() || only.iter().any(|o| o == name))
                .collect();
            if chosen.is_empty() {
                continue;
            }
            eprintln!(
                "e2e: phase {} (resmgr run {:?})",
                phase.name, phase.agent_args
            );
            self.begin(phase)
                .with_context(|| format!("starting phase {}", phase.name))?;
            for (name, scenario) in chosen {
                self.scenario = (*name).to_owned();
                eprintln!("e2e: scenario {name}");
                scenario(self).with_context(|| format!("scenario {name}"))?;
            }
        }
        Ok(())
    }

    /// Starts a phase: the previous phase's agent stops and its pods go; this phase's agent
    /// starts with its settings and a state of its own.
    fn begin(&mut self, phase: &Phase) -> anyhow::Result<()> {
        if let Some(agent) = self.agent.take() {
            let status = agent.stop(Signal::TERM)?;
            ensure!(
                status.success(),
                "resmgr run exited with {status} on SIGTERM"
            );
        }
        let pods: Vec<String> = self.pods.keys().cloned().collect();
        for pod in pods {
            self.remove_pod(&pod)?;
        }
        ensure!(
            self.granted.is_empty(),
            "claims are still prepared at the end of a phase: {:?}",
            self.granted.keys()
        );
        self.agent_config.phase = phase.agent_args.iter().map(|a| (*a).to_owned()).collect();
        self.agent_config.state = format!("agent-state-{}", phase.name);
        self.start_agent()
    }

    pub fn start_agent(&mut self) -> anyhow::Result<()> {
        let agent = Agent::start(&self.agent_config, &mut self.kubelet, &self.teardown)?;
        self.agent = Some(agent);
        Ok(())
    }

    fn agent(&mut self) -> anyhow::Result<Agent> {
        self.agent.take().context("the agent is not running")
    }

    /// CPUs a container may be given at all: online, not isolated.
    fn allowed(&self) -> CpuSet {
        self.machine.online.difference(&self.machine.isolated)
    }

    /// CPUs held by exclusive containers and claims, but `except` (a key or claim UID).
    fn held(&self, except: &str) -> CpuSet {
        let mut held = CpuSet::new();
        for (key, cpus) in &self.exclusive {
            if key != except {
                held = held.union(cpus);
            }
        }
        for (uid, g) in &self.granted {
            if uid != except {
                held = held.union(&g.cpus);
            }
        }
        held
    }

    /// The shared CPUs the model predicts. None are left when grants took them all; then the
    /// shared containers fall back to the reserved CPUs (the kubelet's static CPU manager never
    /// lets the shared pool run dry either).
    pub fn shared_cpus(&self) -> CpuSet {
        let shared = self
            .allowed()
            .difference(&self.reserved)
            .difference(&self.held(""));
        if shared.is_empty() {
            self.reserved.clone()
        } else {
            shared
        }
    }

    /// The CPUs and memory nodes `c` must have now.
    fn expected(&self, c: &Running) -> anyhow::Result<(CpuSet, NodeSet)> {
        Ok(match &c.expect {
            Expect::Reserved => (self.reserved.clone(), self.machine.nodes_of(&self.reserved)),
            Expect::Shared => {
                let cpus = self.shared_cpus();
                let mems = self.machine.nodes_of(&cpus);
                (cpus, mems)
            }
            Expect::Exclusive => {
                let cpus = self
                    .exclusive
                    .get(&c.key)
                    .with_context(|| format!("no grant recorded for {}", c.key))?
                    .clone();
                let mems = self.machine.nodes_of(&cpus);
                (cpus, mems)
            }
            Expect::Claim(uid) => {
                let g = self
                    .granted
                    .get(uid)
                    .with_context(|| format!("claim {uid} is not prepared"))?;
                (g.cpus.clone(), g.mems.clone())
            }
        })
    }

    /// Every running container the runtime knows of, ours or not, in the kernel's view. While
    /// the runtime is stopped, those it listed last whose processes still run (the shims or
    /// monitors keep them).
    fn seen(&mut self) -> anyhow::Result<Vec<Seen>> {
        if self.runtime.running() {
            let ids = self.cri.running_ids()?;
            self.listed.retain(|id, _| ids.contains(id));
            for id in ids {
                if !self.listed.contains_key(&id) {
                    let identity = self.cri.identify(&id)?;
                    self.listed.insert(id, identity);
                }
            }
        }
        let mut seen = Vec::new();
        for (id, (key, pid)) in &self.listed {
            if !teardown::alive(*pid) {
                // Gone since the runtime listed it: it runs on nothing.
                continue;
            }
            let view = kernel::view(*pid).with_context(|| format!("reading {key} (pid {pid})"))?;
            seen.push(Seen {
                id: id.clone(),
                key: key.clone(),
                cgroup_cpus: view.cgroup_cpus,
                allowed_cpus: view.allowed_cpus,
            });
        }
        for c in &self.running {
            ensure!(
                self.listed.contains_key(&c.id),
                "{} ({}) is not among the running containers the runtime lists",
                c.key,
                c.id
            );
        }
        Ok(seen)
    }

    /// What must be exclusive now: every exclusive container's CPUs, every prepared claim's.
    fn holders(&self) -> Vec<Holder> {
        let mut holders = Vec::new();
        for c in &self.running {
            if c.expect == Expect::Exclusive
                && let Some(cpus) = self.exclusive.get(&c.key)
            {
                holders.push(Holder {
                    name: format!("exclusive container {}", c.key),
                    cpus: cpus.clone(),
                    members: BTreeSet::from([c.id.clone()]),
                });
            }
        }
        for (uid, g) in &self.granted {
            let users: Vec<&Running> = self
                .running
                .iter()
                .filter(|c| c.expect == Expect::Claim(uid.clone()))
                .collect();
            let keys: Vec<&str> = users.iter().map(|c| c.key.as_str()).collect();
            holders.push(Holder {
                name: format!("claim {uid} (used by [{}])", keys.join(", ")),
                cpus: g.cpus.clone(),
                members: users.iter().map(|c| c.id.clone()).collect(),
            });
        }
        holders
    }

    /// Checks every running container in the kernel's view, and that exclusive CPUs are
    /// nobody else's; reports those in `report`.
    pub fn check(&mut self, report: &[&str]) -> anyhow::Result<()> {
        let seen = self.seen()?;
        let intrusions = intrusions(&self.holders(), &seen);
        let mut failures: Vec<String> = intrusions.iter().map(|i| i.message.clone()).collect();
        for c in self.running.clone() {
            let (cpus, mems) = self.expected(&c)?;
            let view = kernel::view(c.pid).with_context(|| format!("reading {}", c.key))?;
            // On a machine with several NUMA nodes a shared container may live in one node's
            // pool: its shared CPUs there are as right as the whole machine's.
            let (cpus, mems) = match self.machine.nodes.values().find(|node| {
                let in_node = cpus.intersection(node);
                c.expect == Expect::Shared && !in_node.is_empty() && in_node == view.cgroup_cpus
            }) {
                Some(node) if view.cgroup_cpus != cpus => {
                    let in_node = cpus.intersection(node);
                    let mems = self.machine.nodes_of(&in_node);
                    (in_node, mems)
                }
                _ => (cpus, mems),
            };
            let alone = !intrusions.iter().any(|i| i.members.contains(&c.id));
            let placed = view.cgroup_cpus == cpus
                && view.allowed_cpus == cpus
                && view.cgroup_mems == mems
                && view.allowed_mems == mems;
            let ok = placed && alone;
            let row = Row {
                scenario: self.scenario.clone(),
                container: c.key.clone(),
                expected_cpus: cpus.to_string(),
                cgroup_cpus: view.cgroup_cpus.to_string(),
                allowed_cpus: view.allowed_cpus.to_string(),
                expected_mems: mems.to_string(),
                cgroup_mems: view.cgroup_mems.to_string(),
                allowed_mems: view.allowed_mems.to_string(),
                ok,
            };
            if !placed {
                failures.push(format!(
                    "{} ({:?}) should have cpus {} mems {}, the kernel says cpuset.cpus {} Cpus_allowed_list {} cpuset.mems {} Mems_allowed_list {} ({})",
                    c.key,
                    c.expect,
                    row.expected_cpus,
                    row.expected_mems,
                    row.cgroup_cpus,
                    row.allowed_cpus,
                    row.cgroup_mems,
                    row.allowed_mems,
                    view.cgroup.display()
                ));
            }
            if report.contains(&c.key.as_str()) || !ok {
                self.rows.push(row);
            }
        }
        if !failures.is_empty() {
            bail!("{}", failures.join("\n"));
        }
        Ok(())
    }

    /// Runs a pod (once per name).
    fn pod(&mut self, name: &str, namespace: &str, qos: Qos) -> anyhow::Result<Pod> {
        if let Some((_, pod)) = self.pods.get(name) {
            return Ok(pod.clone());
        }
        let pod = Pod {
            name: name.into(),
            namespace: namespace.into(),
            uid: pod_uid(name),
            qos,
        };
        let id = self.cri.run_pod(&pod)?;
        self.pods.insert(name.into(), (id, pod.clone()));
        Ok(pod)
    }

    /// Starts a container in a running pod and records what it must have.
    fn container(&mut self, pod: &Pod, c: &Container, expect: Expect) -> anyhow::Result<Running> {
        let (pod_id, _) = self.pods[&pod.name].clone();
        let id = self
            .cri
            .start_container(&pod_id, pod, c)
            .with_context(|| format!("starting {}/{}/{}", pod.namespace, pod.name, c.name))?;
        self.track(pod, c, id, expect)
    }

    /// Records what a container started in a running pod must have.
    fn track(
        &mut self,
        pod: &Pod,
        c: &Container,
        id: String,
        expect: Expect,
    ) -> anyhow::Result<Running> {
        let pid = self.cri.pid(&id)?;
        let reported_at_creation = self.cri.reported_cpus(&id)?;
        let running = Running {
            key: format!("{}/{}/{}", pod.namespace, pod.name, c.name),
            pod: pod.name.clone(),
            id,
            pid,
            expect,
            reported_at_creation,
        };
        self.running.push(running.clone());
        Ok(running)
    }

    /// Stops and removes a pod; its containers leave the model.
    fn remove_pod(&mut self, name: &str) -> anyhow::Result<()> {
        let (id, _) = self
            .pods
            .remove(name)
            .with_context(|| format!("no pod {name}"))?;
        self.cri.remove_pod(&id)?;
        let gone: Vec<Running> = self
            .running
            .iter()
            .filter(|c| c.pod == name)
            .cloned()
            .collect();
        self.running.retain(|c| c.pod != name);
        for c in gone {
            self.exclusive.remove(&c.key);
            ensure!(
                teardown::wait_gone(c.pid, std::time::Duration::from_secs(30)),
                "{} (pid {}) still runs after its pod was removed",
                c.key,
                c.pid
            );
        }
        Ok(())
    }

    /// Prepares a claim as the kubelet does before it runs the claim's pod; records its grant
    /// from the CDI spec the agent wrote, after checking it against the allocation.
    fn prepare(&mut self, claim: &AllocatedClaim) -> anyhow::Result<()> {
        let prepared = self
            .kubelet
            .prepare(&claim.namespace, &claim.name, &claim.uid)?;
        ensure!(
            prepared.devices == [claim.device.clone()] && prepared.cdi_devices.len() == 1,
            "{} prepared as {prepared:?}, allocated on {}",
            claim.name,
            claim.device
        );
        let env = spec_env(&self.agent_config.cdi_dir, &claim.uid)?;
        let var = |prefix: &str, name: &str| {
            env.iter()
                .find_map(|e| e.strip_prefix(&format!("{prefix}{name}=")))
                .map(str::to_owned)
        };
        let safe = claim.uid.replace('-', "_");
        let cpus_text = var("DRA_CPUSET_", &claim.uid).with_context(|| {
            format!(
                "the spec of {} has no DRA_CPUSET_{}: {env:?}",
                claim.name, claim.uid
            )
        })?;
        ensure!(
            var("DRA_CPUSET_", &safe).as_deref() == Some(cpus_text.as_str()),
            "the spec of {} lacks the shell-safe DRA_CPUSET_{safe}: {env:?}",
            claim.name
        );
        let mems_text = var("DRA_MEMS_", &claim.uid).unwrap_or_default();
        let cpus: CpuSet = cpus_text.parse().map_err(|e| anyhow::anyhow!("{e}"))?;
        let mems: NodeSet = mems_text.parse().map_err(|e| anyhow::anyhow!("{e}"))?;
        let node: u32 = claim
            .device
            .strip_prefix("numa")
            .and_then(|n| n.parse().ok())
            .with_context(|| format!("device {} is not numaN", claim.device))?;
        let node_cpus = self.machine.nodes.get(&node).cloned().unwrap_or_default();
        let free = node_cpus
            .intersection(&self.allowed())
            .difference(&self.reserved)
            .difference(&self.held(&claim.uid));
        ensure!(
            cpus.len() == claim.cpus && free.is_superset(&cpus),
            "{} was granted cpus {cpus}: want {} of the free cpus {free} of numa{node}",
            claim.name,
            claim.cpus
        );
        ensure!(
            mems.to_string() == node.to_string(),
            "{} pins memory nodes {mems:?}, want {node}",
            claim.name
        );
        self.granted.insert(
            claim.uid.clone(),
            Grant {
                cpus,
                mems,
                cdi_devices: prepared.cdi_devices,
            },
        );
        Ok(())
    }

    /// Records an exclusive container's CPUs from the kernel, after checking them.
    fn learn_exclusive(&mut self, c: &Running, n: usize) -> anyhow::Result<()> {
        let view = kernel::view(c.pid)?;
        let free = self
            .allowed()
            .difference(&self.reserved)
            .difference(&self.held(&c.key));
        ensure!(
            view.cgroup_cpus.len() == n && free.is_superset(&view.cgroup_cpus),
            "{} got cpus {}: want {n} exclusive of the free cpus {free}",
            c.key,
            view.cgroup_cpus
        );
        self.exclusive.insert(c.key.clone(), view.cgroup_cpus);
        Ok(())
    }
}

/// A pod's UID from its name (the model needs it before the pod exists, for claims).
pub fn pod_uid(name: &str) -> String {
    let mut hex = String::new();
    for b in name.bytes().take(10) {
        let _ = write!(hex, "{b:02x}");
    }
    let hex = format!("{hex:0<20}");
    format!("{}-e2e0-4000-8000-{}", &hex[..8], &hex[8..])
}

/// The environment entries of claim `uid`'s CDI spec in `dir`.
fn spec_env(dir: &Path, uid: &str) -> anyhow::Result<Vec<String>> {
    for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry?.path();
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        if name.contains(uid) && name.ends_with(".json") {
            let spec: serde_json::Value = serde_json::from_slice(&std::fs::read(&path)?)
                .with_context(|| format!("parsing {}", path.display()))?;
            let mut env = Vec::new();
            for device in spec["devices"].as_array().into_iter().flatten() {
                for e in device["containerEdits"]["env"]
                    .as_array()
                    .into_iter()
                    .flatten()
                {
                    env.extend(e.as_str().map(str::to_owned));
                }
            }
            return Ok(env);
        }
    }
    bail!("no CDI spec for claim {uid} in {}", dir.display())
}

fn burstable(name: &str, milli: u64) -> Container {
    Container {
        name: name.into(),
        command: sleeper(),
        cpu_request_milli: milli,
        ..Container::default()
    }
}

fn guaranteed(name: &str, milli: u64) -> Container {
    Container {
        name: name.into(),
        command: sleeper(),
        cpu_request_milli: milli,
        cpu_limit_milli: milli,
        memory_limit: 64 << 20,
        ..Container::default()
    }
}

/// A system pod in `kube-system` runs on the reserved CPUs.
fn reserved(w: &mut World) -> anyhow::Result<()> {
    let pod = w.pod("coredns", "kube-system", Qos::Burstable)?;
    let c = w.container(&pod, &burstable("dns", 100), Expect::Reserved)?;
    w.check(&[&c.key])
}

/// With nri-plugins' exclusivity, a Guaranteed container of whole CPUs gets CPUs of its own.
/// A BestEffort container created next to it runs (on 2 CPUs none is left to share: it falls
/// back to the reserved CPUs, as the kubelet's static CPU manager would have it), and when the
/// exclusive container goes, the shared containers get its CPUs back at once.
fn exclusive(w: &mut World) -> anyhow::Result<()> {
    let pod = w.pod("pinned", "default", Qos::Guaranteed)?;
    let c = w.container(&pod, &guaranteed("worker", 1000), Expect::Exclusive)?;
    w.learn_exclusive(&c, 1)?;
    w.check(&[&c.key])?;
    let batch = w.pod("batch", "default", Qos::BestEffort)?;
    let b = w.container(&batch, &burstable("job", 0), Expect::Shared)?;
    w.check(&[&b.key])?;
    w.remove_pod("pinned")?;
    w.check(&[&b.key])
}

/// With the default exclusivity (claims), a Guaranteed container without a claim shares: only
/// claims are exclusive, so the scheduler's view of the node stays true.
fn guaranteed_shares(w: &mut World) -> anyhow::Result<()> {
    let pod = w.pod("steady", "default", Qos::Guaranteed)?;
    let c = w.container(&pod, &guaranteed("server", 1000), Expect::Shared)?;
    w.check(&[&c.key])
}

/// A Burstable container gets the shared CPUs.
fn shared(w: &mut World) -> anyhow::Result<()> {
    let pod = w.pod("web", "default", Qos::Burstable)?;
    let c = w.container(&pod, &burstable("app", 100), Expect::Shared)?;
    w.check(&[&c.key])
}

/// The kubelet resizes a running container (`crictl update`): the new CPU values reach its
/// cgroup, and its cpuset stays what the agent gave it.
fn resize(w: &mut World) -> anyhow::Result<()> {
    let c = w
        .running
        .iter()
        .find(|c| c.key == "default/web/app")
        .cloned()
        .context("the shared scenario's container is not running")?;
    w.cri.update(
        &c.id,
        &[
            "--cpu-share",
            "512",
            "--cpu-period",
            "100000",
            "--cpu-quota",
            "50000",
        ],
    )?;
    if kernel::cpuset_mount()?.1 {
        let max = kernel::cgroup_value(c.pid, "cpu", "cpu.max")?;
        ensure!(max == "50000 100000", "cpu.max is {max:?} after the resize");
    } else {
        let shares = kernel::cgroup_value(c.pid, "cpu", "cpu.shares")?;
        let quota = kernel::cgroup_value(c.pid, "cpu", "cpu.cfs_quota_us")?;
        ensure!(
            shares == "512" && quota == "50000",
            "cpu.shares {shares} cpu.cfs_quota_us {quota} after the resize, want 512 and 50000"
        );
    }
    w.check(&[&c.key])
}

/// The kubelet prepares a claim, then runs its pod: the agent takes the claim's CPUs out of the
/// shared pool and moves the running shared containers off them at once (UpdateContainers; on
/// 2 CPUs onto the reserved CPU), and the claim's container runs on exactly the claim's CPUs
/// and memory nodes, with the claim's variables reaching a process started through a shell.
fn claim(w: &mut World) -> anyhow::Result<()> {
    let claim = w.claims[0].clone();
    let shared_keys: Vec<String> = w
        .running
        .iter()
        .filter(|c| c.expect == Expect::Shared)
        .map(|c| c.key.clone())
        .collect();
    ensure!(
        !shared_keys.is_empty(),
        "no shared container runs to be moved by the claim"
    );
    w.prepare(&claim)?;
    // Prepare returns after the updates were delivered: the shared containers have moved.
    let keys: Vec<&str> = shared_keys.iter().map(String::as_str).collect();
    w.check(&keys)?;

    let pod = w.pod(&claim.pod_name, "default", Qos::Burstable)?;
    ensure!(
        pod.uid == claim.pod_uid,
        "the claim is reserved for another pod"
    );
    let mut c = burstable("postgres", 100);
    c.cdi_devices = w.granted[&claim.uid].cdi_devices.clone();
    let c = w.container(&pod, &c, Expect::Claim(claim.uid.clone()))?;
    w.check(&[&c.key])?;

    // What the process sees once sh has exec'd sleep: what the shell passed on.
    crate::procs::wait_until(
        "the claim's container to exec its sleep",
        std::time::Duration::from_secs(30),
        || {
            let cmdline = std::fs::read(format!("/proc/{}/cmdline", c.pid))?;
            Ok(cmdline.starts_with(b"/bin/sleep\0"))
        },
    )?;
    let env = kernel::environ(c.pid)?;
    let safe = format!("DRA_CPUSET_{}=", claim.uid.replace('-', "_"));
    let want = w.granted[&claim.uid].cpus.to_string();
    let seen = env.iter().find_map(|e| e.strip_prefix(&safe));
    ensure!(
        seen == Some(want.as_str()),
        "{} started through sh sees {safe}{seen:?}, want {want}: {env:?}",
        c.key
    );
    if env
        .iter()
        .any(|e| e.starts_with(&format!("DRA_CPUSET_{}=", claim.uid)))
    {
        w.notes
            .push("claim: this shell passed DRA_CPUSET_<uid> with hyphens on as well".to_owned());
    }
    Ok(())
}

/// The agent stops (SIGTERM: exits 0 having saved its state; SIGKILL: no chance to) and starts
/// again: nothing moved while it was away, it rebuilds from its state and the runtime's
/// Synchronize without moving anything, and it still knows the claim: a new container of the
/// claim's pod gets the claim's CPUs.
fn agent_restart(w: &mut World, signal: Signal) -> anyhow::Result<()> {
    w.check(&[])?;
    let agent = w.agent()?;
    let status = agent.stop(signal)?;
    if signal == Signal::TERM {
        ensure!(
            status.success(),
            "resmgr run exited with {status} on SIGTERM"
        );
    }
    w.check(&[])?;
    w.start_agent()?;
    let all: Vec<String> = w.running.iter().map(|c| c.key.clone()).collect();
    w.check(&all.iter().map(String::as_str).collect::<Vec<_>>())?;
    // The agent's Synchronize put the runtime's record right: every later NRI event about a
    // container carries that record, to the agent and to any other plugin.
    ensure_reports_agree("after the agent's Synchronize", &w.reports()?)?;
    claim_sidecar(
        w,
        if signal == Signal::TERM {
            "after-term"
        } else {
            "after-kill"
        },
    )
}

/// A new container of the claim's pod, using the claim.
fn claim_sidecar(w: &mut World, name: &str) -> anyhow::Result<()> {
    let claim = w.claims[0].clone();
    let pod = w.pods[&claim.pod_name].1.clone();
    let mut c = burstable(name, 0);
    c.cdi_devices = w.granted[&claim.uid].cdi_devices.clone();
    let c = w.container(&pod, &c, Expect::Claim(claim.uid.clone()))?;
    w.check(&[&c.key])
}

/// The runtime stops under the agent: the agent exits non-zero (it cannot serve without its
/// runtime); the containers keep running under their shims (containerd) or conmon (CRI-O),
/// untouched. The runtime comes back: containerd reports the cpusets it reported before;
/// CRI-O, which restores its containers from what it wrote at their creation, reports their
/// creation-time cpusets ([`crio_forgets_updates`]). The agent is restarted (as its DaemonSet
/// would), rebuilds from the runtime's Synchronize without moving anything, leaves the
/// runtime's record agreeing with the kernel, and serves the claim again.
fn runtime_restart(w: &mut World) -> anyhow::Result<()> {
    w.check(&[])?;
    let before = w.reports()?;
    ensure_reports_agree("before the restart", &before)?;
    w.runtime.stop()?;
    let agent = w.agent()?;
    let exited = agent.wait_exit()?;
    for c in &w.running {
        ensure!(
            teardown::alive(c.pid),
            "{} (pid {}) died with {}",
            c.key,
            c.pid,
            w.runtime.name()
        );
    }
    w.check(&[])?;
    w.runtime.start(&w.cri)?;
    let restarted = w.reports()?;
    match w.runtime.kind() {
        // containerd keeps what it reported, NRI updates included, in its metadata store.
        Kind::Containerd => {
            for (b, r) in before.iter().zip(&restarted) {
                ensure!(
                    b.reported == r.reported,
                    "containerd reported {} with cpus {} before its restart and {} after",
                    r.key,
                    shown(b.reported.as_ref()),
                    shown(r.reported.as_ref())
                );
            }
        }
        Kind::Crio => crio_forgets_updates(w, &restarted)?,
    }
    // A container's exit status is the runtime's to tell, so it is read now.
    let status = exited.status()?;
    ensure!(
        !status.success(),
        "the agent exited with {status} when {} went away, want a failure",
        w.runtime.name()
    );
    w.start_agent()?;
    let all: Vec<String> = w.running.iter().map(|c| c.key.clone()).collect();
    w.check(&all.iter().map(String::as_str).collect::<Vec<_>>())?;
    // The agent's Synchronize put the runtime's record right: every later NRI event about a
    // container carries that record, to the agent and to any other plugin.
    ensure_reports_agree("after the agent's Synchronize", &w.reports()?)?;
    claim_sidecar(
        w,
        match w.runtime.kind() {
            Kind::Containerd => "after-containerd",
            Kind::Crio => "after-crio",
        },
    )
}

/// A running container's cpuset as the runtime reports it and as the kernel has it.
#[derive(Debug, Clone)]
struct Report {
    key: String,
    reported: Option<CpuSet>,
    kernel: CpuSet,
    at_creation: Option<CpuSet>,
}

impl World {
    /// Every running container's cpuset, reported and in the kernel.
    fn reports(&self) -> anyhow::Result<Vec<Report>> {
        self.running
            .iter()
            .map(|c| {
                Ok(Report {
                    key: c.key.clone(),
                    reported: self.cri.reported_cpus(&c.id)?,
                    kernel: kernel::view(c.pid)?.cgroup_cpus,
                    at_creation: c.reported_at_creation.clone(),
                })
            })
            .collect()
    }
}

/// A reported cpuset in a message.
fn shown(cpus: Option<&CpuSet>) -> String {
    cpus.map_or_else(|| "none".to_owned(), ToString::to_string)
}

/// What the runtime reports is what the kernel has, or nothing (containerd reports a cpuset
/// only once an update set one: the CreateContainer adjustment is not in its CRI status).
fn ensure_reports_agree(when: &str, reports: &[Report]) -> anyhow::Result<()> {
    for r in reports {
        ensure!(
            r.reported.as_ref().is_none_or(|cpus| *cpus == r.kernel),
            "{when}, the runtime reports {} with cpus {}; the kernel says {}",
            r.key,
            shown(r.reported.as_ref()),
            r.kernel
        );
    }
    Ok(())
}

/// CRI-O forgets NRI updates across its restart: it keeps them in memory only, so the restarted
/// CRI-O reports (over CRI, and over NRI in Synchronize) the cpuset each container was created
/// with, and the containers the agent moved since (the shared ones the claim moved) are reported
/// where they no longer are.
fn crio_forgets_updates(w: &World, restarted: &[Report]) -> anyhow::Result<()> {
    let mut moved = Vec::new();
    for r in restarted {
        ensure!(
            r.reported == r.at_creation,
            "the restarted CRI-O reports {} with cpus {}, created with {}",
            r.key,
            shown(r.reported.as_ref()),
            shown(r.at_creation.as_ref())
        );
        if r.reported.as_ref() != Some(&r.kernel) {
            moved.push(r.key.as_str());
        }
    }
    ensure!(
        !moved.is_empty(),
        "no container was moved since its creation: nothing shows what CRI-O forgets"
    );
    let shared: Vec<&str> = w
        .running
        .iter()
        .filter(|c| c.expect == Expect::Shared)
        .map(|c| c.key.as_str())
        .collect();
    ensure!(
        moved == shared,
        "the restarted CRI-O reports {moved:?} off their cpus, want the moved shared containers {shared:?}"
    );
    Ok(())
}

/// The claim's pod goes and the kubelet unprepares the claim: its spec is removed and its
/// CPUs are shared again, with the running shared containers at once, and with a new one.
fn unprepare(w: &mut World) -> anyhow::Result<()> {
    let claim = w.claims[0].clone();
    w.remove_pod(&claim.pod_name)?;
    w.kubelet
        .unprepare(&claim.namespace, &claim.name, &claim.uid)?;
    ensure!(
        spec_env(&w.agent_config.cdi_dir, &claim.uid).is_err(),
        "the CDI spec of {} is still there after unprepare",
        claim.name
    );
    let returned = w.granted.remove(&claim.uid).context("claim not granted")?;
    ensure!(
        w.shared_cpus().is_superset(&returned.cpus),
        "the model does not share the returned cpus {}",
        returned.cpus
    );
    let shared: Vec<String> = w
        .running
        .iter()
        .filter(|c| c.expect == Expect::Shared)
        .map(|c| c.key.clone())
        .collect();
    w.check(&shared.iter().map(String::as_str).collect::<Vec<_>>())?;
    let pod = w.pod("later", "default", Qos::Burstable)?;
    let c = w.container(&pod, &burstable("app", 100), Expect::Shared)?;
    w.check(&[&c.key])
}

/// How many times [`create_while_prepare`] creates a container while it prepares a claim, and
/// how much later each time the prepare starts than the creation (the first at once).
const RACES: u32 = 12;
const RACE_STAGGER: std::time::Duration = std::time::Duration::from_millis(30);

/// A container is created while a claim whose CPUs it would share is prepared, at the same
/// moment, again and again (issue 35): the agent answers the container's CreateContainer while
/// the claim takes CPUs the answer gives it, and the runtime skips updates of a container it is
/// still creating. At every sample of the kernel's view, taken all along by a thread of its
/// own, no container runs on a CPU of a claim the kubelet has been answered OK for; after each
/// round every container is where the model says.
///
/// The prepare starts a little later each round ([`RACE_STAGGER`]), so that the rounds sweep the
/// window between the runtime asking the agent about the container and starting it; what is
/// checked never depends on where a round lands.
fn create_while_prepare(w: &mut World) -> anyhow::Result<()> {
    use std::sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    };

    let claim = w.claims[0].clone();
    ensure!(
        !w.granted.contains_key(&claim.uid),
        "{} is still prepared",
        claim.name
    );
    let pod = w.pod("racers", "default", Qos::Burstable)?;
    let (pod_id, _) = w.pods[&pod.name].clone();
    // The claims the kubelet has been answered OK for, with their CPUs: what no container but
    // their own may run on. A claim is added once its answer is in, and taken out before its
    // unprepare is sent, which starts a new epoch (the first number).
    let answered: Arc<Mutex<Answered>> = Arc::default();
    let done = Arc::new(AtomicBool::new(false));
    let sampler = std::thread::spawn({
        let (cri, answered, done) = (w.cri.clone(), answered.clone(), done.clone());
        move || sample_intrusions(&cri, &answered, &done)
    });
    let rounds = (|| -> anyhow::Result<()> {
        for round in 0..RACES {
            let c = burstable(&format!("racer-{round}"), 100);
            let creating = std::thread::spawn({
                let (cri, pod, pod_id, c) = (w.cri.clone(), pod.clone(), pod_id.clone(), c.clone());
                move || cri.start_container(&pod_id, &pod, &c)
            });
            std::thread::sleep(RACE_STAGGER * round);
            let prepared = w.prepare(&claim);
            let created = creating
                .join()
                .map_err(|_| anyhow::anyhow!("the creating thread panicked"))?;
            prepared.with_context(|| format!("round {round}: preparing {}", claim.name))?;
            stdx::sync::lock(&answered)
                .1
                .push((claim.uid.clone(), w.granted[&claim.uid].cpus.clone()));
            let id = created.with_context(|| format!("round {round}: creating {}", c.name))?;
            w.track(&pod, &c, id, Expect::Shared)?;
            w.check(&[])
                .with_context(|| format!("round {round}, with the claim prepared"))?;
            {
                let mut answered = stdx::sync::lock(&answered);
                answered.0 += 1;
                answered.1.clear();
            }
            w.kubelet
                .unprepare(&claim.namespace, &claim.name, &claim.uid)?;
            w.granted.remove(&claim.uid);
            w.check(&[])
                .with_context(|| format!("round {round}, with the claim unprepared"))?;
        }
        Ok(())
    })();
    done.store(true, Ordering::SeqCst);
    let sampled = sampler
        .join()
        .map_err(|_| anyhow::anyhow!("the sampling thread panicked"))?;
    rounds?;
    let (samples, intrusions) = sampled?;
    ensure!(
        intrusions.is_empty(),
        "a container ran on the CPUs of a claim answered OK:\n{}",
        intrusions.join("\n")
    );
    ensure!(samples > 0, "the kernel's view was never sampled");
    eprintln!(
        "e2e: {RACES} containers created while the claim was prepared; {samples} samples of every container, none on a claim's CPUs"
    );
    w.remove_pod(&pod.name)
}

/// The claims answered OK, with their CPUs, and the epoch: how many times they were taken out
/// before an unprepare.
type Answered = (u64, Vec<(String, CpuSet)>);

/// Samples every running container in the kernel's view until `done`, each against the claims
/// answered OK before the sample began and still held when its view was read (none of which
/// these containers use); the number of samples, and what each intrusion was. A view read after
/// the claims were taken out is not compared with them: their unprepare may have moved the
/// container back onto their CPUs meanwhile (a sample lists and inspects every container, which
/// takes longer than an unprepare on a busy machine).
fn sample_intrusions(
    cri: &Cri,
    answered: &std::sync::Mutex<Answered>,
    done: &std::sync::atomic::AtomicBool,
) -> anyhow::Result<(u64, Vec<String>)> {
    let mut known: BTreeMap<String, (String, u32)> = BTreeMap::new();
    let mut samples = 0;
    let mut intrusions = Vec::new();
    let epoch = || stdx::sync::lock(answered).0;
    while !done.load(std::sync::atomic::Ordering::SeqCst) {
        let (began, claims) = stdx::sync::lock(answered).clone();
        for id in cri.running_ids()? {
            if !known.contains_key(&id) {
                // A container that went between the listing and the look is not running.
                let Ok(identity) = cri.identify(&id) else {
                    continue;
                };
                known.insert(id.clone(), identity);
            }
            let (key, pid) = &known[&id];
            let Ok(view) = kernel::view(*pid) else {
                continue; // gone since it was listed: it runs on nothing
            };
            if epoch() != began {
                continue; // the claims were taken out, and may be unprepared, meanwhile
            }
            for (uid, cpus) in &claims {
                let on = cpus.intersection(&view.cgroup_cpus.union(&view.allowed_cpus));
                if !on.is_empty() {
                    intrusions.push(format!(
                        "sample {samples}: {key} (container {id}) may run on cpus {on} of claim {uid} (cpuset.cpus {}, Cpus_allowed_list {})",
                        view.cgroup_cpus, view.allowed_cpus
                    ));
                }
            }
        }
        samples += 1;
    }
    Ok((samples, intrusions))
}

/// A claim no one has: the UID of the stray spec planted while the agent is down.
const STRAY_UID: &str = "5742a100-0000-4000-8000-0000000000aa";

/// The operator's case of a stray spec: while the agent is down, a spec of ours that its state
/// does not account for turns up in its CDI directory (a restored backup, a failed cleanup, a
/// manual copy), unused and granting free CPUs. The agent restarts and is ready, every running
/// container keeps (or, once the stray is swept, gets back) its CPUs, the stray is swept (the
/// API server has no such claim), and the next claim gets every claimable CPU of the node, the
/// stray's included.
fn stray_spec(w: &mut World) -> anyhow::Result<()> {
    let next = w.claims[1].clone();
    let node: u32 = next
        .device
        .strip_prefix("numa")
        .and_then(|n| n.parse().ok())
        .with_context(|| format!("device {} is not numaN", next.device))?;
    let free = w
        .machine
        .nodes
        .get(&node)
        .cloned()
        .unwrap_or_default()
        .intersection(&w.allowed())
        .difference(&w.reserved)
        .difference(&w.held(""));
    ensure!(
        free.len() == next.cpus,
        "numa{node} has the free cpus {free}, the claim to prepare after the sweep wants {}",
        next.cpus
    );
    // Half of them (at least one): the rest are the shared containers' meanwhile.
    let stray: CpuSet = free.iter().take((free.len() / 2).max(1)).collect();
    w.check(&[])?;
    let status = w.agent()?.stop(Signal::TERM)?;
    ensure!(
        status.success(),
        "resmgr run exited with {status} on SIGTERM"
    );
    let store = cdi::SpecStore::new(&w.agent_config.cdi_dir, crate::DRIVER)
        .context("opening the agent's cdi directory")?;
    store
        .write_claim(
            STRAY_UID,
            &[cdi::ContainerEdits::with_env([
                format!("DRA_CPUSET_{STRAY_UID}={stray}"),
                format!("DRA_MEMS_{STRAY_UID}={node}"),
            ])],
        )
        .context("planting a stray spec")?;
    w.start_agent()?;
    crate::procs::wait_until(
        "the stray spec to be swept",
        std::time::Duration::from_secs(60),
        || Ok(spec_env(&w.agent_config.cdi_dir, STRAY_UID).is_err()),
    )?;
    // Swept is counted once its claim is released and the containers moved back.
    let agent = w.agent.as_ref().context("the agent is not running")?;
    crate::procs::wait_until(
        "the sweep to be counted",
        std::time::Duration::from_secs(30),
        || {
            let (_, metrics) = agent.get("/metrics")?;
            Ok(metrics.contains("resmgr_reconciled_claims_total{outcome=\"swept\"} 1"))
        },
    )?;
    let all: Vec<String> = w.running.iter().map(|c| c.key.clone()).collect();
    w.check(&all.iter().map(String::as_str).collect::<Vec<_>>())?;
    w.prepare(&next)?;
    let got = w.granted[&next.uid].cpus.clone();
    ensure!(
        got.is_superset(&stray),
        "{} got cpus {got}, not the swept stray's {stray}",
        next.name
    );
    w.check(&[])?;
    w.kubelet
        .unprepare(&next.namespace, &next.name, &next.uid)?;
    w.granted.remove(&next.uid);
    w.check(&all.iter().map(String::as_str).collect::<Vec<_>>())
}

/// The memory the memory scenario's claim asks for.
pub const CLAIMED_MEMORY: u64 = 64 << 20;
/// The hugepages (bytes of 2 MiB pages) it asks for, where the run could reserve them.
pub const CLAIMED_HUGEPAGES: u64 = 4 << 20;
/// The memory limit of the container of that claim that states a lower one of its own.
const OWN_LIMIT: u64 = 32 << 20;

/// A claim for `{cpu, memory, hugepages2Mi}`, used by a container that states no memory limit
/// and by one whose own limit is lower: in the kernel each has `cpuset.mems` on the claim's
/// node, the claimed memory as its memory limit (its own when lower, docs/which-claim.md), and
/// the claimed hugepages as its hugetlb limit. The pod goes and the claim is unprepared after.
fn memory_claim(w: &mut World) -> anyhow::Result<()> {
    let claim = w.claims[2].clone();
    w.prepare(&claim)?;
    let pod = w.pod(&claim.pod_name, "default", Qos::Burstable)?;
    let devices = w.granted[&claim.uid].cdi_devices.clone();
    let mems = w.granted[&claim.uid].mems.clone();
    let mut unlimited = burstable("app", 100);
    unlimited.cdi_devices = devices.clone();
    let mut capped = burstable("capped", 100);
    capped.memory_limit = OWN_LIMIT;
    capped.cdi_devices = devices;
    let mut keys = Vec::new();
    for (c, want_limit) in [(unlimited, CLAIMED_MEMORY), (capped, OWN_LIMIT)] {
        let c = w.container(&pod, &c, Expect::Claim(claim.uid.clone()))?;
        let page = w.hugetlb_unavailable.is_none().then_some("2MB");
        let got = kernel::memory(c.pid, page).with_context(|| format!("reading {}", c.key))?;
        let shown = |v: Option<u64>| v.map_or("unlimited".to_owned(), |b| b.to_string());
        w.notes.push(format!(
            "memory-claim: {}: cpuset.mems {}, memory limit {}, hugetlb 2MB limit {} ({})",
            c.key,
            got.mems,
            shown(got.limit),
            shown(got.hugetlb),
            got.files
                .iter()
                .map(|f| f.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ));
        ensure!(
            got.mems == mems,
            "{} has cpuset.mems {}, want the claim's node(s) {mems}",
            c.key,
            got.mems
        );
        ensure!(
            got.limit == Some(want_limit),
            "{} has the memory limit {}, want {want_limit} (the claim's {CLAIMED_MEMORY}, or the container's own when lower)",
            c.key,
            shown(got.limit)
        );
        if w.hugetlb_unavailable.is_none() {
            ensure!(
                got.hugetlb == Some(CLAIMED_HUGEPAGES),
                "{} has the hugetlb 2MB limit {}, want the claimed {CLAIMED_HUGEPAGES}",
                c.key,
                shown(got.hugetlb)
            );
        }
        keys.push(c.key);
    }
    if let Some(reason) = &w.hugetlb_unavailable {
        w.notes.push(format!(
            "memory-claim: hugetlb limits not checked: {reason}"
        ));
    }
    w.check(&keys.iter().map(String::as_str).collect::<Vec<_>>())?;
    w.remove_pod(&claim.pod_name)?;
    w.kubelet
        .unprepare(&claim.namespace, &claim.name, &claim.uid)?;
    w.granted.remove(&claim.uid);
    w.check(&[])
}

/// The report: one line per checked container and scenario.
pub fn table(rows: &[Row]) -> String {
    let header = [
        "SCENARIO",
        "CONTAINER",
        "EXPECTED CPUS",
        "CPUSET.CPUS",
        "CPUS_ALLOWED",
        "EXPECTED MEMS",
        "CPUSET.MEMS",
        "MEMS_ALLOWED",
        "",
    ];
    let cells: Vec<[String; 9]> = rows
        .iter()
        .map(|r| {
            [
                r.scenario.clone(),
                r.container.clone(),
                r.expected_cpus.clone(),
                r.cgroup_cpus.clone(),
                r.allowed_cpus.clone(),
                r.expected_mems.clone(),
                r.cgroup_mems.clone(),
                r.allowed_mems.clone(),
                if r.ok { "ok" } else { "FAIL" }.to_owned(),
            ]
        })
        .collect();
    let mut widths = header.map(str::len);
    for row in &cells {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.len());
        }
    }
    let mut out = String::new();
    let mut line = |cells: &[String]| {
        let parts: Vec<String> = cells
            .iter()
            .zip(widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        out.push_str(parts.join("  ").trim_end());
        out.push('\n');
    };
    line(&header.map(str::to_owned));
    for row in &cells {
        line(row);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cpus(text: &str) -> CpuSet {
        text.parse().unwrap()
    }

    fn seen(id: &str, key: &str, cgroup: &str, allowed: &str) -> Seen {
        Seen {
            id: id.into(),
            key: key.into(),
            cgroup_cpus: cpus(cgroup),
            allowed_cpus: cpus(allowed),
        }
    }

    fn holder(name: &str, held: &str, members: &[&str]) -> Holder {
        Holder {
            name: name.into(),
            cpus: cpus(held),
            members: members.iter().map(|m| (*m).to_owned()).collect(),
        }
    }

    #[test]
    fn the_crio_scenarios_are_scenarios_in_their_order() {
        let names: Vec<&str> = PHASES
            .iter()
            .flat_map(|p| p.scenarios.iter().map(|(n, _)| *n))
            .collect();
        let positions: Vec<usize> = ON_CRIO
            .iter()
            .map(|(n, _)| names.iter().position(|m| m == n).expect(n))
            .collect();
        assert!(positions.windows(2).all(|w| w[0] < w[1]), "{positions:?}");
    }

    #[test]
    fn an_exclusive_container_sharing_its_only_cpu_with_the_agent_is_named_with_it() {
        let found = intrusions(
            &[holder(
                "exclusive container default/pinned/worker",
                "1",
                &["w"],
            )],
            &[
                seen("w", "default/pinned/worker", "1", "1"),
                seen("a", "resmgr-system/resmgr-0/resmgr", "1", "1"),
                seen("d", "kube-system/coredns/dns", "0", "0"),
            ],
        );
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].intruder, "resmgr-system/resmgr-0/resmgr");
        assert_eq!(found[0].cpus, cpus("1"));
        let message = &found[0].message;
        assert!(
            message.contains("default/pinned/worker")
                && message.contains("resmgr-system/resmgr-0/resmgr"),
            "{message}"
        );
        assert!(message.contains("may run on cpus 1 "), "{message}");
    }

    #[test]
    fn the_cgroup_and_the_schedulers_view_each_count() {
        let h = [holder("exclusive container x", "2-3", &["x"])];
        let by_cgroup = intrusions(&h, &[seen("o", "o", "0-2", "0-1")]);
        assert_eq!(
            by_cgroup.iter().map(|i| i.cpus.clone()).collect::<Vec<_>>(),
            [cpus("2")]
        );
        let by_affinity = intrusions(&h, &[seen("o", "o", "0-1", "0,3")]);
        assert_eq!(
            by_affinity
                .iter()
                .map(|i| i.cpus.clone())
                .collect::<Vec<_>>(),
            [cpus("3")]
        );
    }

    #[test]
    fn a_claims_containers_share_its_cpus_and_nobody_else_may() {
        let h = [holder("claim u", "1", &["pg", "side"])];
        let users = [
            seen("pg", "d/p/pg", "1", "1"),
            seen("side", "d/p/side", "1", "1"),
        ];
        assert_eq!(intrusions(&h, &users), []);
        // A claim prepared before any container uses it is still nobody else's.
        let unused = [holder("claim u", "1", &[])];
        let found = intrusions(&unused, &[seen("web", "d/web/app", "0-1", "0-1")]);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].intruder, "d/web/app");
    }

    #[test]
    fn containers_off_the_held_cpus_pass() {
        let h = [
            holder("exclusive container a", "1", &["a"]),
            holder("claim u", "2-3", &["c"]),
        ];
        let all = [
            seen("a", "a", "1", "1"),
            seen("c", "c", "2-3", "2-3"),
            seen("s", "shared", "4-7", "4-7"),
            seen("r", "reserved", "0", "0"),
        ];
        assert_eq!(intrusions(&h, &all), []);
    }
}
