//! The invariant of issue 18, on random walks through a node's life:
//!
//! 1. every claim the scheduler allocates from the devices the policy publishes at that moment
//!    is prepared (a refused allocated claim is a pod stuck in ContainerCreating for good);
//! 2. no CPU is held by two claims, or by a claim and an exclusive container (nor by two
//!    exclusive containers);
//! 3. every container the kubelet admitted is created, and runs on a non-empty cpuset;
//! 4. a claim holds the CPUs the scheduler counts it for (the `cpu` it consumed, or the whole
//!    device it was handed).
//! 5. with memory published (`claim-memory`, `claim-hugepages`: issue 26), claims hold on each
//!    NUMA node exactly the memory and hugepages the scheduler counts them for, never more than
//!    the node's device publishes.
//!
//! A walk is a sequence of pods of every QoS class (with and without claims, one to three
//! containers), pod and container removals, resizes and agent restarts (snapshot, a new policy,
//! restore, sync with the running containers; in some setups with another device model, as an
//! operator changing `device-mode`, `group-by` or `claim-granularity` on a node holding
//! claims). The kubelet admits a pod only when its CPU and memory requests fit the node's
//! allocatable (online CPUs minus reserved, the agent's reserved CPUs being the kubelet's). A pod
//! with a claim either mirrors the claimed CPUs in its main container's request, as pods must on
//! 1.34 and 1.35, or relies on the node-allocatable mapping (1.36), which charges the claimed CPUs
//! to the node. Claims are allocated by [`policy::scheduler`] from `Policy::devices` at that
//! moment: CPUs of a shared device (whole, fractional, or the policy's default; NUMA selectors),
//! or a count of devices with `matchAttribute` on the NUMA node; with whole-core or unpinned
//! memory configurations from the DeviceClass or the claim. A pod the scheduler or the kubelet
//! would not place is skipped; anything the node then refuses is a violation. A claim must also
//! hold exactly the CPUs the scheduler counts it for (exactly the ones it picked, on devices that
//! name their CPUs), all among its devices' CPUs.
//!
//! Machines: 1 NUMA node with 2 CPUs (one reserved), 2 NUMA nodes of 16 CPUs with SMT, 4 NUMA
//! nodes of 64 CPUs, and two hybrid parts (two-thread P-cores and one-thread E-cores): the
//! hwloc XML fixture, and a larger one made from a synthetic machine. Setups cover both device
//! models (and whole cores, and devices per socket), the three `cpu-exclusivity` settings, and
//! `DRAConsumableCapacity` on and off. Synthetic NUMA nodes have 64 GiB and containers ask for
//! at most 512 MiB, so memory rarely decides for containers. Setups with memory published give
//! every node 256 pages of 2 MiB and 2 of 1 GiB, reserve 1 GiB and 4 pages on node 0, publish
//! half of the rest, and let claims ask for memory (any number of MiB) and hugepages (odd MiB
//! amounts, rounded up to pages by the request policy; a 1 GiB page) next to their CPUs.
//!
//! Walks are generated from a seed by a small generator of our own (state-dependent steps, so
//! no shrinking; the failing step and the walk up to it are printed instead). Each test runs
//! `RESMGR_INVARIANT_CASES` walks (default 16) of `RESMGR_INVARIANT_STEPS` steps (default 80);
//! walk `i` uses seed `RESMGR_INVARIANT_SEED + i` (default seed 18). A failure prints the
//! command that replays exactly that walk. `cargo xtask soak --invariant-cases N` runs longer.

use std::collections::{BTreeMap, BTreeSet};

use policy::{
    AttributeValue, Claim, ClaimConfig, ConfigSource, Container, ContainerUpdate, CpuSet, Device,
    GrantKind, Pod, Policy, QosClass, Quantity, Resources, Topology, TopologyAware, TopologySource,
    model::AllocationResult,
    scheduler::{ClaimSpec, Constraint, DeviceRequest, Gates, ScheduleError, Scheduler, Selector},
    topology::CoreKind,
    topology_aware::{
        ClaimCpus, Config, DeviceMode, DeviceModel, Exclusivity, Granularity, GroupBy,
        MemoryConfig, NodeReservation, ReservedCpus,
    },
};

const DRIVER: &str = "topology-aware.resmgr.io";
const NUMA: &str = "resource.kubernetes.io/numaNode";
const POOL: &str = "node-1";

/// splitmix64: small, fast, and the same on every platform.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n` > 0).
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    /// Uniform in `lo..=hi`.
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi.saturating_sub(lo) + 1)
    }

    /// Uniform in `0..len` (`len` > 0), for picking from a list.
    fn index(&mut self, len: usize) -> usize {
        let len = u64::try_from(len).unwrap_or(u64::MAX);
        usize::try_from(self.below(len)).unwrap_or(0)
    }

    fn percent(&mut self, p: u64) -> bool {
        self.below(100) < p
    }
}

/// A machine shape the walks run on.
#[derive(Debug, Clone)]
struct Machine {
    name: &'static str,
    topology: Topology,
    reserved: ReservedCpus,
}

/// A machine, the agent's settings and the cluster's gates: what one test walks on.
#[derive(Debug, Clone)]
struct Setup {
    machine: Machine,
    exclusivity: Exclusivity,
    devices: DeviceModel,
    gates: Gates,
    /// Restarts may change the device model (mode, grouping, granularity), as an operator
    /// changing `device-mode`, `group-by` or `claim-granularity` on a node holding claims.
    reconfigure: bool,
    /// Half of each node's memory and all its hugepages are published for claims
    /// (`claim-memory: 50%`, `claim-hugepages: true`), and claims ask for them.
    memory: bool,
}

impl Setup {
    fn new(machine: &str, devices: DeviceModel, gates: Gates) -> Self {
        Self {
            machine: self::machine(machine),
            exclusivity: Exclusivity::Claims,
            devices,
            gates,
            reconfigure: false,
            memory: false,
        }
    }

    fn with_memory(mut self) -> Self {
        self.memory = true;
        self
    }

    fn reconfigured(mut self) -> Self {
        self.reconfigure = true;
        self
    }

    fn exclusivity(mut self, exclusivity: Exclusivity) -> Self {
        self.exclusivity = exclusivity;
        self
    }

    fn describe(&self) -> String {
        format!(
            "{}{}{}, {:?}, {:?} by {:?} per {:?}, DRAConsumableCapacity {}",
            self.machine.name,
            if self.memory {
                " (memory and hugepages published)"
            } else {
                ""
            },
            if self.reconfigure {
                " (device model changed on restarts)"
            } else {
                ""
            },
            self.exclusivity,
            self.devices.mode,
            self.devices.group_by,
            self.devices.granularity,
            if self.gates.consumable_capacity {
                "on"
            } else {
                "off"
            }
        )
    }
}

fn synthetic(desc: &str) -> Topology {
    Topology::load(&TopologySource::Synthetic(desc.into())).unwrap()
}

/// A hybrid part: 8 two-thread P-cores and 4 one-thread E-cores on one NUMA node (20 CPUs),
/// built from a synthetic machine by taking the second thread off the last 4 cores, as on
/// parts whose efficient cores have no SMT, with the core kinds hwloc's CPU kinds give.
fn hybrid() -> Topology {
    let mut t = synthetic("pack:1 numa:1(memory=64GiB) core:12 pu:2");
    let mut gone = CpuSet::new();
    for core in t.cores.iter_mut().take(8) {
        core.kind = CoreKind::Performance;
    }
    for core in t.cores.iter_mut().skip(8) {
        let second = core.threads.iter().nth(1).unwrap();
        gone = gone.union(&CpuSet::from_iter([second]));
        core.threads = core.threads.difference(&gone);
        core.kind = CoreKind::Efficiency;
    }
    t.online = t.online.difference(&gone);
    for p in &mut t.packages {
        p.cpus = p.cpus.difference(&gone);
    }
    for d in &mut t.dies {
        d.cpus = d.cpus.difference(&gone);
    }
    for n in &mut t.numa_nodes {
        n.cpus = n.cpus.difference(&gone);
    }
    for l3 in &mut t.l3_groups {
        l3.cpus = l3.cpus.difference(&gone);
    }
    assert_eq!(t.online.len(), 20);
    t
}

fn machine(name: &str) -> Machine {
    match name {
        "small" => Machine {
            name: "small",
            topology: synthetic("pack:1 numa:1(memory=64GiB) core:1 pu:2"),
            reserved: ReservedCpus::Count(1),
        },
        "smt16" => Machine {
            name: "smt16",
            topology: synthetic("pack:1 numa:2(memory=64GiB) core:4 pu:2"),
            reserved: ReservedCpus::Count(2),
        },
        "numa4" => Machine {
            name: "numa4",
            topology: synthetic("pack:2 numa:2(memory=64GiB) core:8 pu:2"),
            reserved: ReservedCpus::Count(2),
        },
        "hybrid-xml" => Machine {
            name: "hybrid-xml",
            topology: Topology::load(&TopologySource::Xml(
                std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hybrid.xml"),
            ))
            .unwrap(),
            reserved: ReservedCpus::Count(1),
        },
        "hybrid" => Machine {
            name: "hybrid",
            topology: hybrid(),
            reserved: ReservedCpus::Count(2),
        },
        other => panic!("no machine {other}"),
    }
}

fn new_policy(setup: &Setup) -> TopologyAware {
    let mut config = Config {
        reserved_cpus: setup.machine.reserved.clone(),
        exclusivity: setup.exclusivity.clone(),
        devices: setup.devices,
        driver: DRIVER.into(),
        ..Config::default()
    };
    let mut topology = setup.machine.topology.clone();
    if setup.memory {
        for node in &mut topology.numa_nodes {
            node.hugepages = BTreeMap::from([(PAGE_2M, 256), (GIB, 2)]);
        }
        config.memory = MemoryConfig {
            reserved: BTreeMap::from([(
                0,
                NodeReservation {
                    memory: GIB,
                    hugepages: BTreeMap::from([(PAGE_2M, 8 << 20)]),
                },
            )]),
            claim_percent: 50,
            claim_hugepages: true,
        };
    }
    TopologyAware::new(topology, config).unwrap()
}

const GIB: u64 = 1 << 30;
const PAGE_2M: u64 = 2 << 20;

/// One container of a pod, as the walk knows it.
#[derive(Debug, Clone)]
struct Member {
    id: String,
    /// Uses the pod's claim.
    claimed: bool,
}

#[derive(Debug, Clone)]
struct PodState {
    /// What the node-allocatable mapping charges the node for the pod's claim.
    charge_milli: u64,
    members: Vec<Member>,
    claim: Option<String>,
}

/// The node and the cluster around it.
struct World {
    setup: Setup,
    policy: TopologyAware,
    scheduler: Scheduler,
    allocatable_milli: u64,
    /// The node's memory, all allocatable (the kubelet's reservations aside).
    allocatable_memory: u64,
    pods: BTreeMap<u32, PodState>,
    /// Running containers, with what the runtime applied (the runtime's view).
    running: BTreeMap<String, Container>,
    next: u32,
    /// What the walk did, so a test can tell it exercised something.
    tally: Tally,
    /// Claim UID -> what the scheduler handed it, worked out from the devices published when it
    /// was allocated (a restart may publish others since).
    promised: BTreeMap<String, Promise>,
}

/// What the scheduler handed a claim.
#[derive(Debug, Clone)]
struct Promise {
    /// CPUs it counts the claim for.
    cpus: u64,
    /// The CPUs of the devices allocated: the claim's must be among them.
    behind: CpuSet,
    /// Every device was handed out whole and names its CPUs: the claim gets exactly `behind`.
    exact: bool,
}

impl Promise {
    fn of(results: &[AllocationResult], devices: &[Device], topology: &Topology) -> Self {
        let mut behind = CpuSet::new();
        let mut exact = true;
        for r in results {
            let device = devices.iter().find(|d| d.name == r.device);
            if device.is_some_and(is_memory_device) {
                // Memory, no CPUs: the CPU results say what the claim holds.
                continue;
            }
            if let Some(cpus) = device.and_then(|d| device_cpus(d, topology)) {
                behind = behind.union(&cpus);
            }
            let names_cpus = device.is_some_and(|d| {
                d.attributes.contains_key("cpu") || d.attributes.contains_key("cpus")
            });
            exact &= r.share_id.is_none() && names_cpus;
        }
        Self {
            cpus: results.iter().map(|r| counted_cpus(r, devices)).sum(),
            behind,
            exact,
        }
    }
}

/// How often each thing happened in a test's walks.
#[derive(Debug, Default, Clone, Copy)]
struct Tally {
    claims_prepared: u64,
    unschedulable: u64,
    not_admitted: u64,
    containers_created: u64,
    restarts: u64,
}

/// What went wrong, for the report.
type Violation = String;

impl World {
    fn new(setup: Setup) -> Self {
        let policy = new_policy(&setup);
        let reserved = policy.reserved_cpus().len() as u64;
        let online = setup.machine.topology.online.len() as u64;
        Self {
            allocatable_milli: (online - reserved) * 1000,
            allocatable_memory: setup
                .machine
                .topology
                .numa_nodes
                .iter()
                .map(|n| n.memory_bytes)
                .sum(),
            policy,
            scheduler: Scheduler::new(DRIVER, POOL, setup.gates),
            setup,
            pods: BTreeMap::new(),
            running: BTreeMap::new(),
            next: 0,
            tally: Tally::default(),
            promised: BTreeMap::new(),
        }
    }

    /// What the scheduler and the kubelet count against allocatable: every running
    /// container's request, and the claimed CPUs the node-allocatable mapping charges.
    fn admitted_milli(&self) -> u64 {
        let requests: u64 = self
            .running
            .values()
            .map(|c| c.resources.cpu_request_milli)
            .sum();
        let charged: u64 = self.pods.values().map(|p| p.charge_milli).sum();
        requests + charged
    }

    fn apply(&mut self, updates: &[ContainerUpdate]) {
        for u in updates {
            if let Some(c) = self.running.get_mut(&u.container_id) {
                if let Some(cpus) = &u.cpus {
                    c.cpus = Some(cpus.clone());
                }
                if let Some(mems) = &u.mems {
                    c.mems = Some(mems.clone());
                }
            }
        }
    }

    fn devices(&self) -> Vec<Device> {
        self.policy.devices().unwrap_or_default()
    }

    /// A step of the walk; `Ok(description)` or the violation it caused.
    fn step(&mut self, rng: &mut Rng) -> Result<String, Violation> {
        let roll = rng.below(100);
        match roll {
            0..50 => self.add_pod(rng),
            50..65 => self.remove_pod(rng),
            65..72 => self.remove_container(rng),
            72..90 => self.resize(rng),
            _ => {
                if self.setup.reconfigure && rng.percent(50) {
                    self.setup.devices = random_model(rng);
                }
                self.restart()
            }
        }
    }

    fn add_pod(&mut self, rng: &mut Rng) -> Result<String, Violation> {
        self.next += 1;
        let n = self.next;
        let qos = match rng.below(10) {
            0..5 => QosClass::Guaranteed,
            5..8 => QosClass::Burstable,
            _ => QosClass::BestEffort,
        };
        let pod = Pod {
            uid: format!("pod-{n}"),
            namespace: "default".into(),
            name: format!("p{n}"),
            qos,
            annotations: BTreeMap::new(),
        };
        let wants_claim = match qos {
            QosClass::Guaranteed => rng.percent(60),
            QosClass::Burstable => rng.percent(15),
            QosClass::BestEffort => false,
        };
        let size = 1 + rng.index(3);
        let mut resources: Vec<Resources> = (0..size).map(|_| self.resources(rng, qos)).collect();
        let mut description = format!("pod p{n} ({qos:?}, {size} container(s)");
        let mut claim = None;
        // A pod with a claim either mirrors the claimed CPUs in its main container's requests
        // (as pods must on 1.34 and 1.35), or relies on the node-allocatable mapping (1.36):
        // then the scheduler charges the claim's CPUs to the node and the pod asks for little.
        let mut mapped = false;
        if wants_claim {
            let (spec, config, cpus) = self.claim_request(rng);
            mapped = rng.percent(50);
            let milli = if mapped { 100 } else { cpus * 1000 };
            resources[0].cpu_request_milli = milli;
            if qos == QosClass::Guaranteed {
                resources[0].cpu_limit_milli = Some(milli);
            }
            description.push_str(&format!(
                ", claim {}{}",
                describe_claim(&spec, &config),
                if mapped {
                    ", node-allocatable mapping"
                } else {
                    ""
                }
            ));
            claim = Some((spec, config));
        }
        let pod_milli: u64 = resources.iter().map(|r| r.cpu_request_milli).sum();
        let pod_memory: u64 = resources.iter().map(|r| r.memory_request_bytes).sum();
        let memory: u64 = self
            .running
            .values()
            .map(|c| c.resources.memory_request_bytes)
            .sum();
        if memory + pod_memory > self.allocatable_memory {
            self.tally.not_admitted += 1;
            return Ok(format!(
                "{description}): not admitted, memory requests do not fit"
            ));
        }
        if self.admitted_milli() + pod_milli > self.allocatable_milli {
            self.tally.not_admitted += 1;
            return Ok(format!("{description}): not admitted, requests do not fit"));
        }
        let mut claim_uid = None;
        let mut charge_milli = 0;
        if let Some((spec, config)) = claim {
            let uid = format!("claim-{n}");
            let published = self.devices();
            let results = match self.scheduler.allocate(&uid, &spec, &published) {
                Ok(r) => r,
                Err(ScheduleError::Unschedulable(why)) => {
                    self.tally.unschedulable += 1;
                    return Ok(format!("{description}): unschedulable: {why}"));
                }
                Err(e) => panic!("the walk wrote an invalid claim: {e}"),
            };
            if mapped {
                charge_milli = results
                    .iter()
                    .map(|r| counted_cpus(r, &published))
                    .sum::<u64>()
                    * 1000;
                if self.admitted_milli() + pod_milli + charge_milli > self.allocatable_milli {
                    self.scheduler.deallocate(&uid);
                    self.tally.not_admitted += 1;
                    return Ok(format!(
                        "{description}): not admitted, requests and claimed cpus do not fit"
                    ));
                }
            }
            let claim = Claim {
                uid: uid.clone(),
                namespace: "default".into(),
                name: format!("c{n}"),
                reserved_for: vec![pod.uid.clone()],
                results: results.clone(),
                config,
                pod_claim_name: None,
            };
            description.push_str(&format!(") -> scheduler {}", show_results(&results)));
            if let Err(e) = self.policy.allocate_claim(&claim) {
                return Err(format!(
                    "{description}: the scheduler allocated claim {uid} and the node refused it: {e}"
                ));
            }
            self.tally.claims_prepared += 1;
            self.promised.insert(
                uid.clone(),
                Promise::of(&results, &published, &self.setup.machine.topology),
            );
            claim_uid = Some(uid);
        } else {
            description.push(')');
        }
        let mut members = Vec::new();
        for (i, r) in resources.into_iter().enumerate() {
            let id = format!("p{n}-c{i}");
            let claimed = i == 0 && claim_uid.is_some();
            let cdi_devices = match (&claim_uid, claimed) {
                (Some(uid), true) => {
                    let count = self.scheduler.allocations()[uid.as_str()].len();
                    let uid = cdi::ClaimUid::new(uid).unwrap();
                    (0..count)
                        .map(|k| {
                            cdi::claim::qualified_device_name(DRIVER, &uid, k)
                                .unwrap()
                                .to_string()
                        })
                        .collect()
                }
                _ => Vec::new(),
            };
            let container = Container {
                id: id.clone(),
                pod: pod.clone(),
                name: format!("c{i}"),
                resources: r,
                annotations: BTreeMap::new(),
                cdi_devices,
                env: Vec::new(),
                cpus: None,
                mems: None,
            };
            let placed = self.policy.allocate(&container).map_err(|e| {
                format!("{description}: the kubelet admitted container {id} and the node refused it: {e}")
            })?;
            let mut running = container;
            running.cpus = placed.adjustment.cpus;
            running.mems = placed.adjustment.mems;
            self.running.insert(id.clone(), running);
            self.apply(&placed.updates);
            self.tally.containers_created += 1;
            members.push(Member { id, claimed });
        }
        self.pods.insert(
            n,
            PodState {
                charge_milli,
                members,
                claim: claim_uid,
            },
        );
        Ok(description)
    }

    /// A container's requests and limits for its pod's class.
    fn resources(&self, rng: &mut Rng, qos: QosClass) -> Resources {
        let mib = rng.range(16, 512) << 20;
        match qos {
            QosClass::Guaranteed => {
                let milli = if rng.percent(80) {
                    rng.range(1, 4) * 1000
                } else {
                    rng.range(1, 39) * 100
                };
                Resources {
                    cpu_request_milli: milli,
                    cpu_limit_milli: Some(milli),
                    memory_request_bytes: mib,
                    memory_limit_bytes: Some(mib),
                }
            }
            QosClass::Burstable => {
                let milli = rng.range(0, 2000);
                Resources {
                    cpu_request_milli: milli,
                    cpu_limit_milli: rng.percent(50).then(|| milli + rng.range(0, 2000)),
                    memory_request_bytes: mib,
                    memory_limit_bytes: None,
                }
            }
            QosClass::BestEffort => Resources::default(),
        }
    }

    /// A claim for what the policy publishes now: CPUs of a shared device's `cpu` capacity, or
    /// a count of devices on one NUMA node; with a DeviceClass or claim configuration now and
    /// then. Returns it with the CPUs the pod mirrors.
    fn claim_request(&self, rng: &mut Rng) -> (ClaimSpec, Vec<ClaimConfig>, u64) {
        let devices = self.devices();
        // Grouped devices share their `cpu`; individual CPU devices carry it as their size.
        let shared = devices
            .iter()
            .any(|d| d.allow_multiple_allocations && d.capacities.contains_key("cpu"));
        let most = devices
            .iter()
            .map(|d| d.capacities.get("cpu").map_or(1, |c| c.value.units_ceil()))
            .max()
            .unwrap_or(1)
            .max(1);
        let (mut requests, constraints, cpus) = if shared {
            let mut request = if rng.percent(10) {
                // No amount: the request policy's default.
                DeviceRequest::count("cpus", 1)
            } else if rng.percent(15) {
                let milli = rng.range(1, most * 10 - 1) * 100;
                DeviceRequest::capacity("cpus", "cpu", Quantity::from_milli(milli))
            } else {
                DeviceRequest::capacity("cpus", "cpu", Quantity::from_units(rng.range(1, most)))
            };
            if self.setup.memory && rng.percent(60) {
                request.capacity.extend(random_memory(rng));
            }
            if rng.percent(30)
                && let Some(d) = devices.get(rng.index(devices.len()))
                && let Some(v) = d.attributes.get(NUMA)
            {
                request.selectors.push(Selector {
                    attribute: NUMA.into(),
                    value: v.clone(),
                });
            }
            let cpus = request
                .capacity
                .get("cpu")
                .map_or(1, |q: &Quantity| q.units_ceil());
            (vec![request], Vec::new(), cpus)
        } else {
            let count = rng.range(1, (devices.len() as u64).clamp(1, 8));
            let constraints = if rng.percent(70) {
                vec![Constraint {
                    requests: Vec::new(),
                    match_attribute: NUMA.into(),
                }]
            } else {
                Vec::new()
            };
            let mut requests = vec![DeviceRequest::count("cpus", u32::try_from(count).unwrap())];
            let mut constraints = constraints;
            if self.setup.memory && rng.percent(60) {
                // The memory devices' memory next to the CPUs, tied to their node (now and then
                // not: then memory lands where the scheduler puts it). Memory first, as the
                // worked example asks: the allocator tries devices request by request, and a
                // memory request after `count` CPUs would make it try every combination of a
                // node's CPUs before giving up on a node short of memory.
                let mut memory = DeviceRequest::count("memory", 1);
                memory.selectors.push(Selector {
                    attribute: "memoryKind".into(),
                    value: AttributeValue::String("dram".into()),
                });
                memory.capacity = random_memory(rng);
                requests.insert(0, memory);
                if constraints.is_empty() && rng.percent(80) {
                    constraints.push(Constraint {
                        requests: Vec::new(),
                        match_attribute: NUMA.into(),
                    });
                }
            }
            (requests, constraints, count)
        };
        // The chart's DeviceClass for CPUs selects devices with CPUs: not memory devices.
        if let Some(cpus) = requests.iter_mut().find(|r| r.name == "cpus") {
            cpus.has_capacity.push("cpu".into());
        }
        let mut config = Vec::new();
        if rng.percent(20) {
            config.push(cpu_config(ConfigSource::Class, "fullCores", true));
        }
        if rng.percent(10) {
            config.push(cpu_config(ConfigSource::Claim, "memoryPinning", false));
        }
        (
            ClaimSpec {
                requests,
                constraints,
            },
            config,
            cpus,
        )
    }

    fn remove_pod(&mut self, rng: &mut Rng) -> Result<String, Violation> {
        let Some(&n) = self.pods.keys().nth(rng.index(self.pods.len())) else {
            return Ok("remove a pod: none".into());
        };
        let Some(state) = self.pods.remove(&n) else {
            unreachable!()
        };
        for m in &state.members {
            self.stop(&m.id)?;
        }
        if let Some(uid) = &state.claim {
            let updates = self
                .policy
                .release_claim(uid)
                .map_err(|e| format!("releasing claim {uid}: {e}"))?;
            self.apply(&updates);
            self.scheduler.deallocate(uid);
            self.promised.remove(uid);
        }
        Ok(format!("remove pod p{n}"))
    }

    fn stop(&mut self, id: &str) -> Result<(), Violation> {
        self.running.remove(id);
        let updates = self
            .policy
            .release(id)
            .map_err(|e| format!("releasing container {id}: {e}"))?;
        self.apply(&updates);
        Ok(())
    }

    fn remove_container(&mut self, rng: &mut Rng) -> Result<String, Violation> {
        let candidates: Vec<(u32, String)> = self
            .pods
            .iter()
            .filter(|(_, p)| p.members.len() > 1)
            .flat_map(|(n, p)| p.members.iter().skip(1).map(|m| (*n, m.id.clone())))
            .collect();
        let Some((n, id)) = candidates.get(rng.index(candidates.len())).cloned() else {
            return Ok("remove a container: none".into());
        };
        self.stop(&id)?;
        if let Some(p) = self.pods.get_mut(&n) {
            p.members.retain(|m| m.id != id);
        }
        Ok(format!("remove container {id}"))
    }

    /// An in-place resize of a container without a claim, within the pod's class; the kubelet
    /// admits it when the node's requests still fit. The node may refuse it (the resize then
    /// fails and the container keeps what it had).
    fn resize(&mut self, rng: &mut Rng) -> Result<String, Violation> {
        let candidates: Vec<String> = self
            .pods
            .values()
            .flat_map(|p| {
                p.members
                    .iter()
                    .filter(|m| !m.claimed)
                    .map(|m| m.id.clone())
            })
            .collect();
        let Some(id) = candidates.get(rng.index(candidates.len())).cloned() else {
            return Ok("resize: nothing to resize".into());
        };
        let container = self.running[&id].clone();
        let qos = container.pod.qos;
        if qos == QosClass::BestEffort {
            return Ok(format!("resize {id}: BestEffort has nothing to resize"));
        }
        let mut resources = self.resources(rng, qos);
        resources.memory_request_bytes = container.resources.memory_request_bytes;
        resources.memory_limit_bytes = container.resources.memory_limit_bytes;
        let admitted = self.admitted_milli() - container.resources.cpu_request_milli
            + resources.cpu_request_milli;
        let what = format!(
            "resize {id} ({qos:?}) cpu {}m -> {}m",
            container.resources.cpu_request_milli, resources.cpu_request_milli
        );
        if admitted > self.allocatable_milli {
            return Ok(format!("{what}: not admitted"));
        }
        match self.policy.update(&id, &resources) {
            Ok(updates) => {
                if let Some(c) = self.running.get_mut(&id) {
                    c.resources = resources;
                }
                self.apply(&updates);
                Ok(what)
            }
            Err(e) => Ok(format!("{what}: refused by the node ({e})")),
        }
    }

    /// The agent restarts: a new policy restored from the last snapshot, synchronized with the
    /// running containers as the runtime reports them.
    fn restart(&mut self) -> Result<String, Violation> {
        let snapshot = self.policy.snapshot();
        let mut policy = new_policy(&self.setup);
        policy
            .restore(&snapshot)
            .map_err(|e| format!("restart: restoring the snapshot: {e}"))?;
        let running: Vec<Container> = self.running.values().cloned().collect();
        let updates = policy
            .sync(&running)
            .map_err(|e| format!("restart: synchronizing {} containers: {e}", running.len()))?;
        self.policy = policy;
        self.apply(&updates);
        self.tally.restarts += 1;
        Ok(format!(
            "restart the agent ({} containers) with {:?} devices by {:?} per {:?}",
            self.running.len(),
            self.setup.devices.mode,
            self.setup.devices.group_by,
            self.setup.devices.granularity
        ))
    }

    /// The invariant, after a step.
    /// 5. (with memory published) claims hold on each node exactly the memory and hugepages the
    /// scheduler counts them for, never more than the node's device publishes, and containers
    /// are never charged what is published.
    fn check_memory(&self) -> Result<(), Violation> {
        if !self.setup.memory {
            return Ok(());
        }
        let devices = self.devices();
        for node in &self.setup.machine.topology.numa_nodes {
            // Grouped NUMA devices and the individual model's memory devices.
            let names = [format!("numa{}", node.id), format!("memory{}", node.id)];
            let published = devices.iter().find(|d| names.contains(&d.name));
            let capacity = |key: &str| {
                published
                    .and_then(|d| d.capacities.get(key))
                    .map(|c| c.value.units_ceil())
            };
            // What the scheduler counts: what shares of numa<N> consumed.
            let counted = |key: &str| -> u64 {
                self.scheduler
                    .allocations()
                    .values()
                    .flatten()
                    .filter(|r| names.contains(&r.device) && r.share_id.is_some())
                    .filter_map(|r| r.consumed_capacity.get(key))
                    .map(|q| q.units_ceil())
                    .sum()
            };
            let held = [
                ("memory", self.policy.memory_claimed(node.id)),
                (
                    "hugepages2Mi",
                    self.policy.hugepages_claimed(node.id, PAGE_2M),
                ),
                ("hugepages1Gi", self.policy.hugepages_claimed(node.id, GIB)),
            ];
            // What claims on this node's devices no longer published consumed: the device
            // published now leaves it out (the scheduler does not count it there).
            let unpublished = |key: &str| -> u64 {
                self.scheduler
                    .allocations()
                    .values()
                    .flatten()
                    .filter(|r| {
                        names.contains(&r.device) && !devices.iter().any(|d| d.name == r.device)
                    })
                    .filter_map(|r| r.consumed_capacity.get(key))
                    .map(|q| q.units_ceil())
                    .sum()
            };
            for (key, held) in held {
                if let Some(cap) = capacity(key)
                    && held > cap + unpublished(key)
                {
                    return Err(format!(
                        "claims hold {held} bytes of {key} on node {}, its device publishes {cap} (and claims on devices no longer published consumed {})",
                        node.id,
                        unpublished(key)
                    ));
                }
                // Whole devices (the gate off) and claims restored onto another device model
                // hold what the scheduler does not count by share; compare where it does.
                let all_shared = self
                    .scheduler
                    .allocations()
                    .values()
                    .flatten()
                    .filter(|r| names.contains(&r.device))
                    .all(|r| r.share_id.is_some());
                if self.setup.gates.consumable_capacity
                    && !self.setup.reconfigure
                    && all_shared
                    && held != counted(key)
                {
                    return Err(format!(
                        "claims hold {held} bytes of {key} on node {}, the scheduler counts {}",
                        node.id,
                        counted(key)
                    ));
                }
            }
        }
        Ok(())
    }

    fn check(&self) -> Result<(), Violation> {
        let held: BTreeSet<String> = self.policy.claims().into_iter().collect();
        for uid in self.scheduler.allocations().keys() {
            if !held.contains(uid) {
                return Err(format!(
                    "claim {uid} is allocated by the scheduler but not held by the node"
                ));
            }
        }
        let inventory = self.policy.inventory();
        let mut taken = CpuSet::new();
        for c in &inventory.claims {
            if taken.intersects(&c.cpus) {
                return Err(format!(
                    "claim {} holds cpus {} that another claim holds",
                    c.uid, c.cpus
                ));
            }
            taken = taken.union(&c.cpus);
            let Some(promise) = self.promised.get(&c.uid) else {
                return Err(format!(
                    "the node holds claim {}, which nobody allocated",
                    c.uid
                ));
            };
            if c.cpus.len() as u64 != promise.cpus {
                return Err(format!(
                    "claim {} holds {} cpus ({}), the scheduler counts it for {}",
                    c.uid,
                    c.cpus.len(),
                    c.cpus,
                    promise.cpus
                ));
            }
            if promise.exact && c.cpus != promise.behind {
                return Err(format!(
                    "claim {} holds cpus {}, the scheduler picked {}",
                    c.uid, c.cpus, promise.behind
                ));
            }
            if !promise.behind.is_superset(&c.cpus) {
                return Err(format!(
                    "claim {} holds cpus {}, outside its devices' cpus {}",
                    c.uid, c.cpus, promise.behind
                ));
            }
        }
        self.check_memory()?;
        for p in &inventory.containers {
            if matches!(p.grant, GrantKind::Exclusive | GrantKind::Isolated) {
                if taken.intersects(&p.cpus) {
                    return Err(format!(
                        "exclusive container {} on cpus {} overlaps a claim or another exclusive container",
                        p.id, p.cpus
                    ));
                }
                taken = taken.union(&p.cpus);
            }
        }
        for (id, c) in &self.running {
            if c.cpus.as_ref().is_some_and(CpuSet::is_empty) {
                return Err(format!("container {id} runs on an empty cpuset"));
            }
        }
        Ok(())
    }
}

/// The CPUs behind a device, as its attributes say: its CPU (`cpu`), its CPUs (`cpus`), or the
/// CPUs of its NUMA node or socket.
fn device_cpus(device: &Device, topology: &Topology) -> Option<CpuSet> {
    let int = |name: &str| match device.attributes.get(name) {
        Some(AttributeValue::Int(i)) => u32::try_from(*i).ok(),
        _ => None,
    };
    if let Some(cpu) = int("cpu") {
        return Some(CpuSet::from_iter([cpu]));
    }
    if let Some(AttributeValue::String(list)) = device.attributes.get("cpus") {
        return list.parse().ok();
    }
    if let Some(node) = int(NUMA) {
        return topology.numa_node(node).map(|n| n.cpus.clone());
    }
    let socket = int("socket")?;
    topology
        .packages
        .iter()
        .find(|p| p.id == socket)
        .map(|p| p.cpus.clone())
}

/// Memory in MiB (any amount: whole bytes), hugepages in MiB (odd amounts are rounded up to
/// whole pages by the request policy), sometimes a 1Gi page.
fn random_memory(rng: &mut Rng) -> BTreeMap<String, Quantity> {
    let mib = |n: u64| Quantity::from_units(n << 20);
    let mut asks = BTreeMap::from([("memory".to_owned(), mib(rng.range(1, 40 * 1024)))]);
    if rng.percent(40) {
        asks.insert("hugepages2Mi".into(), mib(rng.range(1, 200)));
    }
    if rng.percent(20) {
        asks.insert("hugepages1Gi".into(), Quantity::from_units(GIB));
    }
    asks
}

/// Whether `device` is a memory device of the individual model (no CPUs).
fn is_memory_device(device: &Device) -> bool {
    device.attributes.contains_key("memoryKind")
}

/// The CPUs the scheduler counts a result for: the `cpu` it consumed from a shared device, the
/// whole `cpu` capacity of a device handed out whole, none for a memory device, or one for a
/// device without one.
fn counted_cpus(r: &AllocationResult, devices: &[Device]) -> u64 {
    let device = devices.iter().find(|d| d.name == r.device);
    match r.consumed_capacity.get("cpu") {
        Some(q) => q.units_ceil(),
        None if device.is_some_and(is_memory_device) => 0,
        None => device
            .and_then(|d| d.capacities.get("cpu"))
            .map_or(1, |c| c.value.units_ceil()),
    }
}

/// `cpus: cpu=3, numaNode == 0; fullCores` and the like.
fn describe_claim(spec: &ClaimSpec, config: &[ClaimConfig]) -> String {
    let mut parts: Vec<String> = spec
        .requests
        .iter()
        .map(|r| {
            let mut what = vec![format!("count {}", r.count)];
            what.extend(r.capacity.iter().map(|(n, q)| format!("{n}={q}")));
            what.extend(r.selectors.iter().map(ToString::to_string));
            format!("{}: {}", r.name, what.join(", "))
        })
        .collect();
    parts.extend(
        spec.constraints
            .iter()
            .map(|c| format!("same {}", c.match_attribute)),
    );
    for c in config {
        if let Some(map) = c.parameters.as_object() {
            for (k, v) in map
                .iter()
                .filter(|(k, _)| *k != "apiVersion" && *k != "kind")
            {
                parts.push(format!("{k}={v} ({:?})", c.source));
            }
        }
    }
    parts.join("; ")
}

fn show_results(results: &[AllocationResult]) -> String {
    let each: Vec<String> = results
        .iter()
        .map(|r| match r.consumed_capacity.get("cpu") {
            Some(q) => format!("{} cpu {q}", r.device),
            None => r.device.clone(),
        })
        .collect();
    each.join(", ")
}

fn cpu_config(source: ConfigSource, field: &str, value: bool) -> ClaimConfig {
    ClaimConfig {
        source,
        requests: Vec::new(),
        parameters: serde_json::json!({
            "apiVersion": "resmgr.io/v1alpha1",
            "kind": "CpuConfig",
            field: value,
        }),
    }
}

/// Any device model the agent accepts.
fn random_model(rng: &mut Rng) -> DeviceModel {
    let mode = if rng.percent(50) {
        DeviceMode::Grouped
    } else {
        DeviceMode::Individual
    };
    let group_by = if mode == DeviceMode::Grouped && rng.percent(30) {
        GroupBy::Socket
    } else {
        GroupBy::Numa
    };
    let granularity = if rng.percent(30) {
        Granularity::Core
    } else {
        Granularity::Cpu
    };
    model(mode, group_by, granularity)
}

fn env_u64(name: &str, default: u64) -> u64 {
    match std::env::var(name) {
        Ok(v) => v
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v:?} is not a number")),
        Err(_) => default,
    }
}

/// Runs the walks of one test; panics with the first violation, the walk up to it and the
/// command that replays it.
fn walks(test: &str, setup: &Setup) {
    let tally = walk_all(test, setup);
    println!("{test}: {tally:?}");
    // Walks that placed nothing would pass on an empty result.
    if env_u64("RESMGR_INVARIANT_CASES", 16) > 0 {
        assert!(
            tally.containers_created > 0,
            "{test}: no container was created"
        );
        assert!(tally.restarts > 0, "{test}: the agent never restarted");
        // A node that publishes devices had claims prepared.
        if !new_policy(setup).devices().unwrap_or_default().is_empty() {
            assert!(tally.claims_prepared > 0, "{test}: no claim was prepared");
        }
    }
}

/// Runs the walks; returns what they did.
fn walk_all(test: &str, setup: &Setup) -> Tally {
    let cases = env_u64("RESMGR_INVARIANT_CASES", 16);
    let steps = env_u64("RESMGR_INVARIANT_STEPS", 80);
    let base = env_u64("RESMGR_INVARIANT_SEED", 18);
    let mut tally = Tally::default();
    for case in 0..cases {
        let seed = base.wrapping_add(case);
        let mut rng = Rng(seed);
        let mut world = World::new(setup.clone());
        let mut log = Vec::new();
        for step in 1..=steps {
            let outcome = world.step(&mut rng).and_then(|done| {
                log.push(format!("  {step}: {done}"));
                world.check()
            });
            if let Err(violation) = outcome {
                panic!(
                    "invariant violated on {}, seed {seed}, step {step}: {violation}\n\
                     walk so far:\n{}\n\
                     replay: RESMGR_INVARIANT_SEED={seed} RESMGR_INVARIANT_CASES=1 \
                     RESMGR_INVARIANT_STEPS={step} cargo test -p policy --test invariant -- --exact {test}",
                    setup.describe(),
                    log.join("\n"),
                );
            }
        }
        tally.claims_prepared += world.tally.claims_prepared;
        tally.unschedulable += world.tally.unschedulable;
        tally.not_admitted += world.tally.not_admitted;
        tally.containers_created += world.tally.containers_created;
        tally.restarts += world.tally.restarts;
    }
    tally
}

const ON: Gates = Gates {
    consumable_capacity: true,
};
const OFF: Gates = Gates {
    consumable_capacity: false,
};

const fn model(mode: DeviceMode, group_by: GroupBy, granularity: Granularity) -> DeviceModel {
    DeviceModel {
        mode,
        group_by,
        granularity,
        pcie_roots: false,
    }
}

const GROUPED: DeviceModel = model(DeviceMode::Grouped, GroupBy::Numa, Granularity::Cpu);
const INDIVIDUAL: DeviceModel = model(DeviceMode::Individual, GroupBy::Numa, Granularity::Cpu);
const GROUPED_CORES: DeviceModel = model(DeviceMode::Grouped, GroupBy::Numa, Granularity::Core);
const INDIVIDUAL_CORES: DeviceModel =
    model(DeviceMode::Individual, GroupBy::Numa, Granularity::Core);
const BY_SOCKET: DeviceModel = model(DeviceMode::Grouped, GroupBy::Socket, Granularity::Cpu);

/// One test per machine, device model, exclusivity and gate that a cluster runs: grouped with
/// the gate on (1.36) and off (1.34, 1.35: whole devices), individual (no gate needed), whole
/// cores, devices per socket, and the partition and nri-plugins exclusivity settings.
macro_rules! walk {
    ($name:ident, $setup:expr) => {
        #[test]
        fn $name() {
            walks(stringify!($name), &$setup);
        }
    };
}

walk!(small_grouped_gate_on, Setup::new("small", GROUPED, ON));
walk!(small_grouped_gate_off, Setup::new("small", GROUPED, OFF));
walk!(small_individual, Setup::new("small", INDIVIDUAL, OFF));
walk!(smt16_grouped_gate_on, Setup::new("smt16", GROUPED, ON));
walk!(smt16_grouped_gate_off, Setup::new("smt16", GROUPED, OFF));
walk!(smt16_individual, Setup::new("smt16", INDIVIDUAL, OFF));
walk!(
    smt16_grouped_memory,
    Setup::new("smt16", GROUPED, ON).with_memory()
);
walk!(
    numa4_grouped_memory,
    Setup::new("numa4", GROUPED, ON).with_memory()
);
walk!(
    smt16_grouped_memory_gate_off,
    Setup::new("smt16", GROUPED, OFF).with_memory()
);
walk!(
    smt16_grouped_memory_reconfigured,
    Setup::new("smt16", GROUPED, ON)
        .with_memory()
        .reconfigured()
);
walk!(
    smt16_individual_memory,
    Setup::new("smt16", INDIVIDUAL, ON).with_memory()
);
walk!(
    numa4_individual_memory,
    Setup::new("numa4", INDIVIDUAL, ON).with_memory()
);
walk!(
    smt16_individual_memory_reconfigured,
    Setup::new("smt16", INDIVIDUAL, ON)
        .with_memory()
        .reconfigured()
);
walk!(
    smt16_individual_memory_gate_off,
    Setup::new("smt16", INDIVIDUAL, OFF).with_memory()
);
walk!(
    smt16_individual_gate_on,
    Setup::new("smt16", INDIVIDUAL, ON)
);
walk!(
    smt16_grouped_whole_cores,
    Setup::new("smt16", GROUPED_CORES, ON)
);
walk!(
    smt16_individual_whole_cores,
    Setup::new("smt16", INDIVIDUAL_CORES, OFF)
);
walk!(
    smt16_partition_grouped,
    Setup::new("smt16", GROUPED, ON).exclusivity(Exclusivity::Partition(ClaimCpus::Count(8)))
);
walk!(
    smt16_partition_individual,
    Setup::new("smt16", INDIVIDUAL, OFF).exclusivity(Exclusivity::Partition(ClaimCpus::Count(8)))
);
walk!(
    smt16_pods,
    Setup::new("smt16", GROUPED, ON).exclusivity(Exclusivity::Pods)
);
walk!(numa4_grouped_gate_on, Setup::new("numa4", GROUPED, ON));
walk!(numa4_grouped_gate_off, Setup::new("numa4", GROUPED, OFF));
walk!(numa4_individual, Setup::new("numa4", INDIVIDUAL, OFF));
walk!(numa4_grouped_by_socket, Setup::new("numa4", BY_SOCKET, ON));
walk!(
    numa4_partition_individual,
    Setup::new("numa4", INDIVIDUAL, OFF).exclusivity(Exclusivity::Partition(ClaimCpus::Count(24)))
);
walk!(hybrid_grouped_gate_on, Setup::new("hybrid", GROUPED, ON));
walk!(hybrid_individual, Setup::new("hybrid", INDIVIDUAL, OFF));
walk!(hybrid_xml_grouped, Setup::new("hybrid-xml", GROUPED, ON));
walk!(
    hybrid_xml_individual,
    Setup::new("hybrid-xml", INDIVIDUAL, OFF)
);
walk!(
    hybrid_xml_grouped_whole_cores,
    Setup::new("hybrid-xml", GROUPED_CORES, ON)
);
walk!(
    smt16_device_model_changes,
    Setup::new("smt16", GROUPED, ON).reconfigured()
);
walk!(
    smt16_device_model_changes_gate_off,
    Setup::new("smt16", INDIVIDUAL, OFF).reconfigured()
);
walk!(
    numa4_device_model_changes,
    Setup::new("numa4", GROUPED, ON).reconfigured()
);
walk!(
    numa4_partition_device_model_changes,
    Setup::new("numa4", INDIVIDUAL, ON)
        .exclusivity(Exclusivity::Partition(ClaimCpus::Count(24)))
        .reconfigured()
);
walk!(
    hybrid_individual_whole_cores,
    Setup::new("hybrid", INDIVIDUAL_CORES, OFF)
);

#[test]
fn the_generator_replays_the_same_walk_from_the_same_seed() {
    let run = |seed| {
        let mut rng = Rng(seed);
        let mut world = World::new(Setup::new("smt16", GROUPED, ON));
        (0..40)
            .map(|_| world.step(&mut rng).unwrap_or_else(|v| v))
            .collect::<Vec<_>>()
    };
    assert_eq!(run(7), run(7));
    assert_ne!(run(7), run(8));
}

#[test]
fn the_hybrid_part_has_two_thread_and_one_thread_cores() {
    let t = hybrid();
    let threads: Vec<usize> = t.cores.iter().map(|c| c.threads.len()).collect();
    assert_eq!(threads, [2, 2, 2, 2, 2, 2, 2, 2, 1, 1, 1, 1]);
    let numa: usize = t.numa_nodes.iter().map(|n| n.cpus.len()).sum();
    assert_eq!(numa, 20);
    // The policy takes it, and says which cores are which.
    let policy = new_policy(&Setup::new("hybrid", INDIVIDUAL, OFF));
    let devices = policy.devices().unwrap();
    assert_eq!(devices.len(), 18);
    let kinds: BTreeSet<String> = devices
        .iter()
        .filter_map(|d| match d.attributes.get("coreType") {
            Some(AttributeValue::String(k)) => Some(k.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(kinds, BTreeSet::from(["e-core".into(), "p-core".into()]));
}

#[test]
fn check_finds_a_claim_the_node_does_not_hold() {
    let mut world = World::new(Setup::new("smt16", GROUPED, ON));
    world
        .scheduler
        .allocate(
            "ghost",
            &ClaimSpec {
                requests: vec![DeviceRequest::capacity(
                    "cpus",
                    "cpu",
                    Quantity::from_units(2),
                )],
                constraints: vec![],
            },
            &world.devices(),
        )
        .unwrap();
    let v = world.check().unwrap_err();
    assert!(
        v.contains("claim ghost is allocated by the scheduler but not held"),
        "{v}"
    );
}
