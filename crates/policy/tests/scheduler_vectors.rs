//! Test vectors for [`policy::scheduler`], shared with the upstream allocator.
//!
//! `tests/fixtures/scheduler-vectors.json` holds cases: the devices a policy publishes, the
//! claims already allocated from them, a claim to allocate, with `DRAConsumableCapacity` on or
//! off, and what the scheduler does with it (the results, or that the claim does not fit). This
//! test checks that the model gives exactly that. The Go test in `tests/conformance/allocator`
//! runs kube-scheduler's own allocator (`k8s.io/dynamic-resource-allocation/structured`, the
//! version the control-plane tests run) on the same cases and checks that it gives the same, so
//! the model cannot drift from the real scheduler unnoticed.
//!
//! The cases are a few by hand, one per rule, and sequences generated from a seed on the
//! devices the topology-aware policy publishes in each device model. `RESMGR_BLESS=1 cargo test
//! -p policy --test scheduler_vectors` regenerates the file from the model; review the diff, and
//! run the Go test, before committing it.

use std::{collections::BTreeMap, path::PathBuf};

use policy::{
    AllocationResult, AttributeValue, Capacity, Device, Policy, Quantity, RequestPolicy, Topology,
    TopologyAware, TopologySource, ValidValues,
    scheduler::{ClaimSpec, Constraint, DeviceRequest, Gates, ScheduleError, Scheduler, Selector},
    topology_aware::{Config, DeviceMode, DeviceModel, Granularity, MemoryConfig, ReservedCpus},
};
use serde::{Deserialize, Serialize};

const DRIVER: &str = "topology-aware.resmgr.io";
const POOL: &str = "node-1";
const NUMA: &str = "resource.kubernetes.io/numaNode";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Vectors {
    driver: String,
    pool: String,
    cases: Vec<Case>,
}

/// One allocation. Field names are the Go test's too.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Case {
    name: String,
    consumable_capacity: bool,
    /// As the agent publishes them; without the gate the API server drops
    /// `allowMultipleAllocations` and request policies before the scheduler sees them.
    devices: Vec<Device>,
    /// Results of the claims allocated before, one list per claim, as stored.
    allocated: Vec<Vec<AllocationResult>>,
    claim: ClaimJson,
    expect: Expect,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ClaimJson {
    requests: Vec<RequestJson>,
    #[serde(default)]
    constraints: Vec<ConstraintJson>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RequestJson {
    name: String,
    count: u32,
    #[serde(default)]
    selectors: Vec<SelectorJson>,
    /// Dropped by the API server without the gate.
    #[serde(default)]
    capacity: BTreeMap<String, Quantity>,
    /// Capacities every device must publish (a CEL selector `"cpu" in device.capacity[...]`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    has_capacity: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct SelectorJson {
    attribute: String,
    value: AttributeValue,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ConstraintJson {
    #[serde(default)]
    requests: Vec<String>,
    match_attribute: String,
}

/// What the scheduler does.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Expect {
    /// The results, in order; absent when the claim is not allocated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    results: Option<Vec<ResultJson>>,
    /// The allocator fails with an error containing this (more than 32 results).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ResultJson {
    request: String,
    device: String,
    /// Has a share ID (share IDs themselves are random upstream).
    shared: bool,
    #[serde(default)]
    consumed_capacity: BTreeMap<String, Quantity>,
}

impl ClaimJson {
    fn spec(&self) -> ClaimSpec {
        ClaimSpec {
            requests: self
                .requests
                .iter()
                .map(|r| DeviceRequest {
                    name: r.name.clone(),
                    count: r.count,
                    selectors: r
                        .selectors
                        .iter()
                        .map(|s| Selector {
                            attribute: s.attribute.clone(),
                            value: s.value.clone(),
                        })
                        .collect(),
                    capacity: r.capacity.clone(),
                    has_capacity: r.has_capacity.clone(),
                })
                .collect(),
            constraints: self
                .constraints
                .iter()
                .map(|c| Constraint {
                    requests: c.requests.clone(),
                    match_attribute: c.match_attribute.clone(),
                })
                .collect(),
        }
    }

    fn of(spec: &ClaimSpec) -> Self {
        Self {
            requests: spec
                .requests
                .iter()
                .map(|r| RequestJson {
                    name: r.name.clone(),
                    count: r.count,
                    selectors: r
                        .selectors
                        .iter()
                        .map(|s| SelectorJson {
                            attribute: s.attribute.clone(),
                            value: s.value.clone(),
                        })
                        .collect(),
                    capacity: r.capacity.clone(),
                    has_capacity: r.has_capacity.clone(),
                })
                .collect(),
            constraints: spec
                .constraints
                .iter()
                .map(|c| ConstraintJson {
                    requests: c.requests.clone(),
                    match_attribute: c.match_attribute.clone(),
                })
                .collect(),
        }
    }
}

/// What the model does with a case.
fn model(case: &Case) -> Expect {
    let mut scheduler = Scheduler::new(
        DRIVER,
        POOL,
        Gates {
            consumable_capacity: case.consumable_capacity,
        },
    );
    for (i, results) in case.allocated.iter().enumerate() {
        scheduler.record(&format!("before-{i}"), results.clone());
    }
    match scheduler.allocate("claim", &case.claim.spec(), &case.devices) {
        Ok(results) => Expect {
            results: Some(
                results
                    .into_iter()
                    .map(|r| ResultJson {
                        request: r.request,
                        device: r.device,
                        shared: r.share_id.is_some(),
                        consumed_capacity: r.consumed_capacity,
                    })
                    .collect(),
            ),
            error: None,
        },
        // The allocator refuses a claim that cannot hold its results with an error; a claim
        // that fits no devices is simply not allocated.
        Err(ScheduleError::Unschedulable(why)) if why.contains("results one claim can hold") => {
            Expect {
                results: None,
                error: Some("exceeds the claim limit".into()),
            }
        }
        Err(ScheduleError::Unschedulable(_)) => Expect {
            results: None,
            error: None,
        },
        Err(e) => panic!("case {}: the vectors hold an invalid claim: {e}", case.name),
    }
}

fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/scheduler-vectors.json")
}

/// One case per line, so a diff shows which changed.
fn write(vectors: &Vectors) -> String {
    let mut out = format!(
        "{{\"driver\": {}, \"pool\": {}, \"cases\": [\n",
        serde_json::to_string(&vectors.driver).unwrap(),
        serde_json::to_string(&vectors.pool).unwrap()
    );
    for (i, case) in vectors.cases.iter().enumerate() {
        out.push_str(&serde_json::to_string(case).unwrap());
        out.push_str(if i + 1 < vectors.cases.len() {
            ",\n"
        } else {
            "\n"
        });
    }
    out.push_str("]}\n");
    out
}

#[test]
fn the_model_gives_what_the_vectors_say() {
    if std::env::var_os("RESMGR_BLESS").is_some() {
        let cases: Vec<Case> = by_hand()
            .into_iter()
            .chain(generated())
            .chain(memory_devices())
            .collect();
        let vectors = Vectors {
            driver: DRIVER.into(),
            pool: POOL.into(),
            cases: cases
                .into_iter()
                .map(|mut c| {
                    c.expect = model(&c);
                    c
                })
                .collect(),
        };
        std::fs::write(fixture(), write(&vectors)).unwrap();
    }
    let text = std::fs::read_to_string(fixture()).unwrap();
    let vectors: Vectors = serde_json::from_str(&text).unwrap();
    assert_eq!(vectors.driver, DRIVER);
    let allocated = vectors
        .cases
        .iter()
        .filter(|c| c.expect.results.is_some())
        .count();
    // Both outcomes are covered, or the vectors prove little.
    assert!(allocated >= 20, "only {allocated} cases allocate");
    assert!(
        vectors.cases.len() - allocated >= 10,
        "too few cases that do not fit"
    );
    for case in &vectors.cases {
        assert_eq!(model(case), case.expect, "case {}", case.name);
    }
}

/// A case whose expectation the blessing fills in.
fn case(
    name: &str,
    consumable_capacity: bool,
    devices: Vec<Device>,
    allocated: Vec<Vec<AllocationResult>>,
    spec: &ClaimSpec,
) -> Case {
    Case {
        name: name.into(),
        consumable_capacity,
        devices,
        allocated,
        claim: ClaimJson::of(spec),
        expect: Expect {
            results: None,
            error: None,
        },
    }
}

fn q(s: &str) -> Quantity {
    s.parse().unwrap()
}

fn shared_device(node: i64, cpus: u64, policy: Option<RequestPolicy>) -> Device {
    Device {
        name: format!("numa{node}"),
        attributes: BTreeMap::from([(NUMA.to_owned(), AttributeValue::Int(node))]),
        capacities: BTreeMap::from([(
            "cpu".to_owned(),
            Capacity {
                value: Quantity::from_units(cpus),
                request_policy: policy,
            },
        )]),
        allow_multiple_allocations: true,
        taints: Vec::new(),
    }
}

fn range(default: Option<&str>, min: &str, max: Option<&str>, step: Option<&str>) -> RequestPolicy {
    RequestPolicy {
        default: default.map(q),
        valid: ValidValues::Range {
            min: q(min),
            max: max.map(q),
            step: step.map(q),
        },
    }
}

fn share(device: &str, cpu: &str) -> Vec<AllocationResult> {
    vec![AllocationResult {
        request: "cpus".into(),
        pool: POOL.into(),
        device: device.into(),
        share_id: Some(format!("share-{device}-{cpu}")),
        consumed_capacity: BTreeMap::from([("cpu".into(), q(cpu))]),
    }]
}

fn whole(devices: &[&str]) -> Vec<AllocationResult> {
    devices
        .iter()
        .map(|d| AllocationResult {
            request: "cpus".into(),
            pool: POOL.into(),
            device: (*d).into(),
            share_id: None,
            consumed_capacity: BTreeMap::new(),
        })
        .collect()
}

fn cpu_request(amount: Option<&str>) -> ClaimSpec {
    ClaimSpec {
        requests: vec![match amount {
            Some(a) => DeviceRequest::capacity("cpus", "cpu", q(a)),
            None => DeviceRequest::count("cpus", 1),
        }],
        constraints: vec![],
    }
}

fn count_on_one_node(count: u32) -> ClaimSpec {
    ClaimSpec {
        requests: vec![DeviceRequest::count("cpus", count)],
        constraints: vec![Constraint {
            requests: vec![],
            match_attribute: NUMA.into(),
        }],
    }
}

/// One case per rule of the model.
fn by_hand() -> Vec<Case> {
    let step1 = |cpus: u64| Some(range(Some("1"), "1", Some(&cpus.to_string()), Some("1")));
    let grouped = vec![shared_device(0, 6, step1(6)), shared_device(1, 8, step1(8))];
    let cores = vec![
        shared_device(0, 6, Some(range(Some("2"), "2", Some("6"), Some("2")))),
        shared_device(1, 8, Some(range(Some("2"), "2", Some("8"), Some("2")))),
    ];
    let values = vec![shared_device(
        0,
        8,
        Some(RequestPolicy {
            default: None,
            valid: ValidValues::Values(vec![q("1"), q("2"), q("4")]),
        }),
    )];
    let no_policy = vec![shared_device(0, 6, None)];
    let individual = single_cpus(2, 4);
    let mut cases = vec![
        case(
            "step rounds 2500m up to 3",
            true,
            grouped.clone(),
            vec![],
            &cpu_request(Some("2500m")),
        ),
        case(
            "no amount takes the default",
            true,
            grouped.clone(),
            vec![],
            &cpu_request(None),
        ),
        case(
            "no amount and no default takes the whole capacity",
            true,
            no_policy.clone(),
            vec![],
            &cpu_request(None),
        ),
        case(
            "no policy takes what is asked",
            true,
            no_policy,
            vec![],
            &cpu_request(Some("2500m")),
        ),
        case(
            "valid values round up to the next",
            true,
            values.clone(),
            vec![],
            &cpu_request(Some("3")),
        ),
        case(
            "above the largest valid value does not fit",
            true,
            values,
            vec![],
            &cpu_request(Some("5")),
        ),
        case(
            "above max skips the device",
            true,
            grouped.clone(),
            vec![],
            &cpu_request(Some("7")),
        ),
        case(
            "whole cores round 3 up to 4",
            true,
            cores.clone(),
            vec![],
            &cpu_request(Some("3")),
        ),
        case(
            "what others consumed counts",
            true,
            grouped.clone(),
            vec![share("numa0", "5"), share("numa1", "6")],
            &cpu_request(Some("2")),
        ),
        case(
            "nothing left anywhere",
            true,
            grouped.clone(),
            vec![share("numa0", "5"), share("numa1", "7")],
            &cpu_request(Some("2")),
        ),
        case(
            "a result without a share holds its device whole",
            true,
            grouped.clone(),
            vec![whole(&["numa0"])],
            &cpu_request(Some("1")),
        ),
        case(
            "gate off: a shared device is handed out whole",
            false,
            grouped.clone(),
            vec![],
            &cpu_request(Some("4")),
        ),
        case(
            "gate off: a device already handed out is not shared",
            false,
            grouped.clone(),
            vec![whole(&["numa0"]), whole(&["numa1"])],
            &cpu_request(Some("1")),
        ),
        case(
            "two requests of one claim share a device",
            true,
            grouped.clone(),
            vec![],
            &ClaimSpec {
                requests: vec![
                    DeviceRequest::capacity("a", "cpu", q("2")),
                    DeviceRequest::capacity("b", "cpu", q("3")),
                ],
                constraints: vec![],
            },
        ),
        case(
            "a count takes the first free devices",
            false,
            individual.clone(),
            vec![whole(&["cpu0", "cpu2"])],
            &ClaimSpec {
                requests: vec![DeviceRequest::count("cpus", 3)],
                constraints: vec![],
            },
        ),
        case(
            "matchAttribute backtracks to a node with enough",
            false,
            individual.clone(),
            vec![whole(&["cpu1", "cpu2"])],
            &count_on_one_node(3),
        ),
        case(
            "matchAttribute with no node enough",
            false,
            individual.clone(),
            vec![whole(&["cpu1", "cpu5"])],
            &count_on_one_node(4),
        ),
        case(
            "a selector on a bare attribute of the driver",
            false,
            individual.clone(),
            vec![],
            &ClaimSpec {
                requests: vec![DeviceRequest {
                    selectors: vec![Selector {
                        attribute: "socket".into(),
                        value: AttributeValue::Int(1),
                    }],
                    ..DeviceRequest::count("cpus", 2)
                }],
                constraints: vec![],
            },
        ),
        case(
            "a constraint on one request of two",
            false,
            individual.clone(),
            vec![whole(&["cpu1"])],
            &ClaimSpec {
                requests: vec![
                    DeviceRequest::count("main", 3),
                    DeviceRequest::count("extra", 1),
                ],
                constraints: vec![Constraint {
                    requests: vec!["main".into()],
                    match_attribute: NUMA.into(),
                }],
            },
        ),
        case(
            "a capacity named in the driver's domain",
            true,
            grouped.clone(),
            vec![],
            &ClaimSpec {
                requests: vec![DeviceRequest::capacity(
                    "cpus",
                    &format!("{DRIVER}/cpu"),
                    q("2"),
                )],
                constraints: vec![],
            },
        ),
        case(
            "a capacity of another domain matches no device",
            true,
            grouped,
            vec![],
            &ClaimSpec {
                requests: vec![DeviceRequest::capacity("cpus", "example.com/cpu", q("2"))],
                constraints: vec![],
            },
        ),
    ];
    let many = single_cpus(1, 40);
    cases.push(case(
        "33 results are more than a claim holds",
        false,
        many.clone(),
        vec![],
        &ClaimSpec {
            requests: vec![DeviceRequest::count("cpus", 33)],
            constraints: vec![],
        },
    ));
    cases.push(case(
        "32 results fit",
        false,
        many,
        vec![],
        &ClaimSpec {
            requests: vec![DeviceRequest::count("cpus", 32)],
            constraints: vec![],
        },
    ));
    cases
}

/// Devices of one CPU each: `per_node` on each of `nodes` NUMA nodes, socket = node.
fn single_cpus(nodes: i64, per_node: u32) -> Vec<Device> {
    (0..nodes)
        .flat_map(|n| {
            let first = u32::try_from(n).unwrap() * per_node;
            (first..first + per_node).map(move |c| Device {
                name: format!("cpu{c}"),
                attributes: BTreeMap::from([
                    (NUMA.to_owned(), AttributeValue::Int(n)),
                    ("socket".to_owned(), AttributeValue::Int(n)),
                    ("cpu".to_owned(), AttributeValue::Int(c.into())),
                ]),
                capacities: BTreeMap::new(),
                allow_multiple_allocations: false,
                taints: Vec::new(),
            })
        })
        .collect()
}

/// splitmix64.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    fn percent(&mut self, p: u64) -> bool {
        self.below(100) < p
    }
}

/// Sequences of claims on what the topology-aware policy publishes, each attempt a case with
/// the claims allocated before it.
fn generated() -> Vec<Case> {
    let hybrid = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hybrid.xml");
    let setups: Vec<(&str, TopologySource, DeviceMode, Granularity, bool)> = vec![
        (
            "smt16 grouped",
            synthetic("pack:1 numa:2 core:4 pu:2"),
            DeviceMode::Grouped,
            Granularity::Cpu,
            true,
        ),
        (
            "smt16 grouped gate off",
            synthetic("pack:1 numa:2 core:4 pu:2"),
            DeviceMode::Grouped,
            Granularity::Cpu,
            false,
        ),
        (
            "smt16 whole cores",
            synthetic("pack:1 numa:2 core:4 pu:2"),
            DeviceMode::Grouped,
            Granularity::Core,
            true,
        ),
        (
            "smt16 individual",
            synthetic("pack:1 numa:2 core:4 pu:2"),
            DeviceMode::Individual,
            Granularity::Cpu,
            false,
        ),
        (
            "numa4 grouped",
            synthetic("pack:2 numa:2 core:4 pu:1"),
            DeviceMode::Grouped,
            Granularity::Cpu,
            true,
        ),
        (
            "numa4 individual",
            synthetic("pack:2 numa:2 core:4 pu:1"),
            DeviceMode::Individual,
            Granularity::Cpu,
            true,
        ),
        (
            "hybrid individual cores",
            TopologySource::Xml(hybrid.clone()),
            DeviceMode::Individual,
            Granularity::Core,
            false,
        ),
        (
            "hybrid grouped",
            TopologySource::Xml(hybrid),
            DeviceMode::Grouped,
            Granularity::Cpu,
            true,
        ),
    ];
    let mut cases = Vec::new();
    for (i, (name, source, mode, granularity, gate)) in setups.into_iter().enumerate() {
        let topology = Topology::load(&source).unwrap();
        let config = Config {
            reserved_cpus: ReservedCpus::Count(1),
            devices: DeviceModel {
                mode,
                granularity,
                ..DeviceModel::default()
            },
            ..Config::default()
        };
        let devices = TopologyAware::new(topology, config)
            .unwrap()
            .devices()
            .unwrap();
        let mut rng = Rng(0x5eed + i as u64);
        let mut scheduler = Scheduler::new(
            DRIVER,
            POOL,
            Gates {
                consumable_capacity: gate,
            },
        );
        let mut allocated: Vec<Vec<AllocationResult>> = Vec::new();
        for attempt in 0..8 {
            let spec = random_claim(&mut rng, &devices);
            cases.push(case(
                &format!("{name} #{attempt}"),
                gate,
                devices.clone(),
                allocated.clone(),
                &spec,
            ));
            if let Ok(results) = scheduler.allocate(&format!("c{attempt}"), &spec, &devices) {
                allocated.push(results);
            }
        }
    }
    cases
}

/// The individual model's memory devices (issue 26) as the policy publishes them, on two NUMA
/// nodes of 8 GiB with 4 CPUs each, half of each node's memory for claims: the worked example's
/// claim (memory first, then `count` CPU devices of a class that selects devices with `cpu`,
/// tied by `matchAttribute`) lands on the one node that has both, or nowhere.
fn memory_devices() -> Vec<Case> {
    let topology = Topology::load(&synthetic("pack:1 numa:2(memory=8GiB) core:4 pu:1")).unwrap();
    let config = Config {
        reserved_cpus: ReservedCpus::Count(1),
        devices: DeviceModel {
            mode: DeviceMode::Individual,
            ..DeviceModel::default()
        },
        memory: MemoryConfig {
            claim_percent: 50,
            ..MemoryConfig::default()
        },
        ..Config::default()
    };
    let devices = TopologyAware::new(topology, config)
        .unwrap()
        .devices()
        .unwrap();
    let claim = |memory: &str, count: u32| {
        let mut mem = DeviceRequest::capacity("memory", "memory", q(memory));
        mem.selectors.push(Selector {
            attribute: "memoryKind".into(),
            value: AttributeValue::String("dram".into()),
        });
        let mut cpus = DeviceRequest::count("cpus", count);
        cpus.has_capacity.push("cpu".into());
        ClaimSpec {
            requests: vec![mem, cpus],
            constraints: vec![Constraint {
                requests: vec![],
                match_attribute: NUMA.into(),
            }],
        }
    };
    // 3 GiB of node 0's 4 GiB for claims are held.
    let held = vec![AllocationResult {
        request: "memory".into(),
        pool: POOL.into(),
        device: "memory0".into(),
        share_id: Some("share-memory0-3Gi".into()),
        consumed_capacity: BTreeMap::from([("memory".into(), q("3Gi"))]),
    }];
    vec![
        case(
            "individual memory and cpus on the one node with both",
            true,
            devices.clone(),
            vec![held.clone()],
            &claim("2Gi", 2),
        ),
        case(
            "individual memory and cpus: memory on one node, cpus on the other, is no allocation",
            true,
            devices.clone(),
            vec![held, whole(&["cpu4", "cpu5", "cpu6"])],
            &claim("2Gi", 2),
        ),
        case(
            "individual memory beyond every node stays pending",
            true,
            devices.clone(),
            vec![],
            &claim("5Gi", 1),
        ),
        case(
            "individual cpus of the cpu class never take a memory device",
            true,
            devices,
            vec![whole(&["cpu1", "cpu2", "cpu3", "cpu4", "cpu5", "cpu6"])],
            &ClaimSpec {
                requests: vec![DeviceRequest {
                    has_capacity: vec!["cpu".into()],
                    ..DeviceRequest::count("cpus", 2)
                }],
                constraints: vec![],
            },
        ),
    ]
}

fn synthetic(desc: &str) -> TopologySource {
    TopologySource::Synthetic(desc.into())
}

/// A claim for what `devices` offer: an amount of a shared device's `cpu` (whole, fractional or
/// none), or a count of devices, with a NUMA selector or constraint now and then, sometimes in
/// two requests.
fn random_claim(rng: &mut Rng, devices: &[Device]) -> ClaimSpec {
    let shared = devices.iter().any(|d| d.allow_multiple_allocations);
    let most = devices
        .iter()
        .map(|d| d.capacities.get("cpu").map_or(1, |c| c.value.units_ceil()))
        .max()
        .unwrap_or(1);
    let nodes: Vec<AttributeValue> = devices
        .iter()
        .filter_map(|d| d.attributes.get(NUMA).cloned())
        .collect();
    let request = |name: &str, rng: &mut Rng| {
        let mut r = if shared {
            match rng.below(10) {
                0 => DeviceRequest::count(name, 1),
                1 | 2 => DeviceRequest::capacity(
                    name,
                    "cpu",
                    Quantity::from_milli(100 * (1 + rng.below(most * 10))),
                ),
                _ => {
                    DeviceRequest::capacity(name, "cpu", Quantity::from_units(1 + rng.below(most)))
                }
            }
        } else {
            let count = 1 + rng.below(u64::try_from(devices.len()).unwrap().min(6));
            DeviceRequest::count(name, u32::try_from(count).unwrap())
        };
        if rng.percent(25) && !nodes.is_empty() {
            let v = nodes[usize::try_from(rng.below(nodes.len() as u64)).unwrap()].clone();
            r.selectors.push(Selector {
                attribute: NUMA.into(),
                value: v,
            });
        }
        r
    };
    let mut requests = vec![request("cpus", rng)];
    if rng.percent(20) {
        requests.push(request("more", rng));
    }
    let constraints = if !shared && rng.percent(60) {
        vec![Constraint {
            requests: vec![],
            match_attribute: NUMA.into(),
        }]
    } else {
        vec![]
    };
    ClaimSpec {
        requests,
        constraints,
    }
}
