//! Memory and hugepages through claims (issue 26): what a NUMA device (grouped model) or a
//! memory device (individual model) publishes, what the scheduler allocates from it, what the
//! node grants and enforces, and what it refuses.

use std::collections::BTreeMap;

use policy::{
    AllocationResult, AttributeValue, Claim, Container, Policy, PolicyError, QosClass, Quantity,
    Resources, Topology, TopologyAware, TopologySource,
    scheduler::{ClaimSpec, Constraint, DeviceRequest, Gates, Scheduler, Selector},
    topology_aware::{
        Config, DeviceMode, DeviceModel, MemoryConfig, NodeReservation, ReservedCpus,
    },
};

const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;
const PAGE_2M: u64 = 2 * MIB;

/// Two NUMA nodes of 32 GiB and 4 two-thread cores each; node 1 keeps 512 pages of 2 MiB and
/// 4 of 1 GiB, node 0 256 of 2 MiB; 2 GiB and 4 MiB of 2 MiB pages reserved on node 0.
fn topology() -> Topology {
    let mut topo = Topology::load(&TopologySource::Synthetic(
        "pack:1 numa:2(memory=32GiB) core:4 pu:2".into(),
    ))
    .unwrap();
    topo.numa_nodes[0].hugepages = BTreeMap::from([(PAGE_2M, 256)]);
    topo.numa_nodes[1].hugepages = BTreeMap::from([(PAGE_2M, 512), (GIB, 4)]);
    topo
}

fn memory_config(percent: u32) -> MemoryConfig {
    MemoryConfig {
        reserved: BTreeMap::from([(
            0,
            NodeReservation {
                memory: 2 * GIB,
                hugepages: BTreeMap::from([(PAGE_2M, 4 * MIB)]),
            },
        )]),
        claim_percent: percent,
        claim_hugepages: true,
    }
}

fn policy(memory: MemoryConfig) -> TopologyAware {
    let config = Config {
        reserved_cpus: ReservedCpus::Set("0-1".parse().unwrap()),
        memory,
        ..Config::default()
    };
    TopologyAware::new(topology(), config).unwrap()
}

fn q(s: &str) -> Quantity {
    s.parse().unwrap()
}

fn capacity(p: &TopologyAware, device: &str) -> BTreeMap<String, String> {
    p.devices()
        .unwrap()
        .into_iter()
        .find(|d| d.name == device)
        .unwrap()
        .capacities
        .into_iter()
        .map(|(name, c)| (name, c.value.to_string()))
        .collect()
}

fn request(name: &str, asks: &[(&str, &str)]) -> DeviceRequest {
    DeviceRequest {
        capacity: asks.iter().map(|(n, v)| ((*n).to_owned(), q(v))).collect(),
        ..DeviceRequest::count(name, 1)
    }
}

/// Allocates `uid` with the scheduler model from what `p` publishes, then prepares it.
fn schedule_and_prepare(
    p: &mut TopologyAware,
    sched: &mut Scheduler,
    uid: &str,
    asks: &[(&str, &str)],
) -> Result<policy::ClaimAllocation, PolicyError> {
    let spec = ClaimSpec {
        requests: vec![request("numa", asks)],
        constraints: Vec::new(),
    };
    let results = sched
        .allocate(uid, &spec, &p.devices().unwrap())
        .expect("the scheduler allocates it");
    p.allocate_claim(&claim(uid, results))
}

fn claim(uid: &str, results: Vec<AllocationResult>) -> Claim {
    Claim {
        uid: uid.into(),
        namespace: "ns".into(),
        name: uid.into(),
        reserved_for: vec![format!("pod-{uid}")],
        results,
        config: Vec::new(),
        pod_claim_name: None,
    }
}

fn by_hand(device: &str, consumed: &[(&str, &str)]) -> AllocationResult {
    AllocationResult {
        request: "numa".into(),
        pool: "node".into(),
        device: device.into(),
        share_id: Some("5ca1ab1e-0000-4000-8000-000000000001".into()),
        consumed_capacity: consumed
            .iter()
            .map(|(n, v)| ((*n).to_owned(), q(v)))
            .collect(),
    }
}

fn container(id: &str, pod: &str, memory: u64, cdi: Option<&str>) -> Container {
    let mut c = Container {
        id: id.into(),
        name: id.into(),
        resources: Resources {
            cpu_request_milli: 500,
            memory_request_bytes: memory,
            ..Resources::default()
        },
        cdi_devices: cdi.map(|d| vec![d.to_owned()]).unwrap_or_default(),
        ..Container::default()
    };
    c.pod.uid = pod.into();
    c.pod.qos = QosClass::Burstable;
    c
}

#[test]
fn without_claim_memory_devices_publish_cpus_only_as_before() {
    let p = policy(MemoryConfig::default());
    assert_eq!(
        capacity(&p, "numa1"),
        BTreeMap::from([("cpu".into(), "8".into())])
    );
}

#[test]
fn a_numa_device_publishes_its_memory_and_hugepages_less_the_reserved() {
    let p = policy(memory_config(50));
    // Node 0: (32 - 2) GiB / 2, and 256 - 2 reserved pages of 2 MiB.
    assert_eq!(
        capacity(&p, "numa0"),
        BTreeMap::from([
            ("cpu".into(), "6".into()),
            ("hugepages2Mi".into(), (254 * PAGE_2M).to_string()),
            ("memory".into(), (15 * GIB).to_string()),
        ])
    );
    assert_eq!(
        capacity(&p, "numa1"),
        BTreeMap::from([
            ("cpu".into(), "8".into()),
            ("hugepages1Gi".into(), (4 * GIB).to_string()),
            ("hugepages2Mi".into(), (512 * PAGE_2M).to_string()),
            ("memory".into(), (16 * GIB).to_string()),
        ])
    );
    let numa1 = p
        .devices()
        .unwrap()
        .into_iter()
        .find(|d| d.name == "numa1")
        .unwrap();
    // Hugepages come in whole pages: the request policy's step is the page.
    let policy = numa1.capacities["hugepages1Gi"]
        .request_policy
        .clone()
        .unwrap();
    assert_eq!(policy.default, Some(q("0")));
    assert!(matches!(
        policy.valid,
        policy::ValidValues::Range { step: Some(s), .. } if s == Quantity::from_units(GIB)
    ));
}

#[test]
fn cpus_and_memory_land_on_one_node_and_bound_the_container() {
    let mut p = policy(memory_config(50));
    let mut sched = Scheduler::new(
        "topology-aware.resmgr.io",
        "node",
        Gates {
            consumable_capacity: true,
        },
    );
    // 15 GiB fits numa0; the next 16 GiB only numa1.
    let a =
        schedule_and_prepare(&mut p, &mut sched, "a", &[("cpu", "2"), ("memory", "15Gi")]).unwrap();
    assert!(
        a.edits[0].env[0].starts_with("DRA_CPUSET_a=2-3"),
        "{:?}",
        a.edits
    );
    let b = schedule_and_prepare(
        &mut p,
        &mut sched,
        "b",
        &[("cpu", "4"), ("memory", "16Gi"), ("hugepages1Gi", "2Gi")],
    )
    .unwrap();
    assert_eq!(b.edits[0].env[0], "DRA_CPUSET_b=8-11");
    assert_eq!(p.memory_claimed(0), 15 * GIB);
    assert_eq!(p.memory_claimed(1), 16 * GIB);
    assert_eq!(p.hugepages_claimed(1, GIB), 2 * GIB);

    // The container using b is pinned to node 1, limited to b's memory and hugepages, and
    // charged nothing of its own: the claim's grant is its memory.
    let before = p.memory_used(1);
    let c = container(
        "c",
        "pod-b",
        GIB,
        Some("topology-aware.resmgr.io/device=claim-b-0"),
    );
    let adj = p.allocate(&c).unwrap().adjustment;
    assert_eq!(adj.mems.unwrap().to_string(), "1");
    assert_eq!(adj.memory_limit_bytes, Some(16 * GIB));
    assert_eq!(adj.hugepage_limits, BTreeMap::from([(GIB, 2 * GIB)]));
    assert_eq!(p.memory_used(1), before);
    // A lower limit the kubelet set stays.
    let mut d = container(
        "d",
        "pod-b",
        0,
        Some("topology-aware.resmgr.io/device=claim-b-0"),
    );
    d.resources.memory_limit_bytes = Some(GIB);
    assert_eq!(
        p.allocate(&d).unwrap().adjustment.memory_limit_bytes,
        Some(GIB)
    );

    // Nothing left for claims on either node: the scheduler says so, the pod stays Pending.
    let spec = ClaimSpec {
        requests: vec![request("numa", &[("memory", "1Gi")])],
        constraints: Vec::new(),
    };
    let err = sched
        .allocate("e", &spec, &p.devices().unwrap())
        .unwrap_err();
    assert!(err.to_string().contains("memory left"), "{err}");

    // Released, it is free again, and survives a restart in between.
    let snapshot = p.snapshot();
    let mut q = policy(memory_config(50));
    q.restore(&snapshot).unwrap();
    assert_eq!(q.memory_claimed(1), 16 * GIB);
    assert_eq!(q.hugepages_claimed(1, GIB), 2 * GIB);
    q.release_claim("b").unwrap();
    assert_eq!(q.memory_claimed(1), 0);
    assert_eq!(q.hugepages_claimed(1, GIB), 0);
}

#[test]
fn containers_placed_through_nri_never_take_the_claims_share() {
    let mut p = policy(memory_config(50));
    // 30 GiB of containers pinned near numa0's CPUs: 15 GiB fit there (the other half is for
    // claims), the rest widens to numa1's container half, never into a claim's half.
    let c = container("big", "pod-x", 30 * GIB, None);
    p.allocate(&c).unwrap();
    assert_eq!(p.memory_used(0) + p.memory_used(1), 30 * GIB);
    assert!(p.memory_used(0) <= 15 * GIB && p.memory_used(1) <= 16 * GIB);
    // Every byte published is still grantable.
    let full = claim(
        "all",
        vec![by_hand("numa1", &[("cpu", "1"), ("memory", "16Gi")])],
    );
    p.allocate_claim(&full).unwrap();
    assert_eq!(p.memory_claimed(1), 16 * GIB);
}

fn refusal(p: &mut TopologyAware, consumed: &[(&str, &str)]) -> String {
    let err = p
        .allocate_claim(&claim("bad", vec![by_hand("numa1", consumed)]))
        .unwrap_err();
    assert!(p.claims().is_empty(), "nothing held after {err}");
    assert_eq!(p.memory_claimed(1), 0);
    assert_eq!(p.hugepages_claimed(1, PAGE_2M), 0);
    err.to_string()
}

#[test]
fn what_the_node_cannot_grant_fails_the_prepare_naming_request_and_amount() {
    let mut p = policy(memory_config(50));
    let err = refusal(&mut p, &[("cpu", "1"), ("memory", "17Gi")]);
    assert!(
        err.contains("result 0 (request numa): consumed 17Gi of memory of device numa1 (node 1), but only 16Gi"),
        "{err}"
    );
    let err = refusal(&mut p, &[("cpu", "1"), ("hugepages2Mi", "3Mi")]);
    assert!(
        err.contains(
            "request numa): consumed 3Mi of hugepages2Mi, which is not a whole number of 2Mi pages"
        ),
        "{err}"
    );
    let err = refusal(&mut p, &[("cpu", "1"), ("hugepages16Gi", "16Gi")]);
    assert!(
        err.contains(
            "consumed 16Gi of hugepages16Gi, but node 1 keeps no 16Gi hugepages for claims"
        ),
        "{err}"
    );
    let err = refusal(&mut p, &[("cpu", "1"), ("hugepages2Mi", "2Gi")]);
    assert!(err.contains("consumed 2Gi of hugepages2Mi"), "{err}");
    // Hugepages charged by an earlier result count against a later one of the same claim.
    let two = claim(
        "two",
        vec![
            by_hand("numa1", &[("cpu", "1"), ("memory", "10Gi")]),
            by_hand("numa1", &[("cpu", "1"), ("memory", "10Gi")]),
        ],
    );
    let err = p.allocate_claim(&two).unwrap_err().to_string();
    assert!(
        err.contains("result 1 (request numa): consumed 10Gi of memory"),
        "{err}"
    );
    assert_eq!(p.memory_claimed(1), 0);
    // Memory consumed from a device that publishes none.
    let mut none = policy(MemoryConfig::default());
    let err = none
        .allocate_claim(&claim(
            "m",
            vec![by_hand("numa1", &[("cpu", "1"), ("memory", "1Gi")])],
        ))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("consumed 1Gi of memory of device numa1, which publishes no memory"),
        "{err}"
    );
}

#[test]
fn a_device_handed_out_whole_grants_all_of_its_nodes_memory() {
    let mut p = policy(memory_config(50));
    let whole = AllocationResult {
        share_id: None,
        consumed_capacity: BTreeMap::new(),
        ..by_hand("numa1", &[])
    };
    p.allocate_claim(&claim("w", vec![whole])).unwrap();
    assert_eq!(p.memory_claimed(1), 16 * GIB);
    assert_eq!(p.hugepages_claimed(1, GIB), 4 * GIB);
    assert_eq!(p.hugepages_claimed(1, PAGE_2M), 512 * PAGE_2M);
}

#[test]
fn a_claim_taken_back_from_its_spec_holds_its_memory_again() {
    let mut p = policy(memory_config(50));
    let granted = p
        .allocate_claim(&claim(
            "b",
            vec![by_hand(
                "numa1",
                &[("cpu", "2"), ("memory", "16Gi"), ("hugepages1Gi", "2Gi")],
            )],
        ))
        .unwrap();
    // The container is told what it holds; the spec says it to an agent that lost its state.
    let env = &granted.edits[0].env;
    assert!(
        env.contains(&format!("DRA_MEMORY_b={}", 16 * GIB)),
        "{env:?}"
    );
    assert!(
        env.contains(&"DRA_HUGEPAGES_b=1Gi=2Gi".to_owned()),
        "{env:?}"
    );
    let mut q = policy(memory_config(50));
    q.adopt_claim("b", &granted.edits).unwrap();
    assert_eq!(q.memory_claimed(1), 16 * GIB);
    assert_eq!(q.hugepages_claimed(1, GIB), 2 * GIB);
    // So its memory is not promised again.
    let err = q
        .allocate_claim(&claim(
            "c",
            vec![by_hand("numa1", &[("cpu", "1"), ("memory", "1Gi")])],
        ))
        .unwrap_err();
    assert!(err.to_string().contains("but only 0 of the 16Gi"), "{err}");
}

fn individual(memory: MemoryConfig) -> TopologyAware {
    let config = Config {
        reserved_cpus: ReservedCpus::Set("0-1".parse().unwrap()),
        memory,
        devices: DeviceModel {
            mode: DeviceMode::Individual,
            ..DeviceModel::default()
        },
        ..Config::default()
    };
    TopologyAware::new(topology(), config).unwrap()
}

/// The worked example's claim (examples/kubernetes/claim-cpus-memory-individual.yaml): memory
/// of the memory devices first, `count` CPU devices, both on one NUMA node.
fn memory_and_cpus(asks: &[(&str, &str)], count: u32) -> ClaimSpec {
    let mut memory = request("memory", asks);
    memory.selectors.push(Selector {
        attribute: "memoryKind".into(),
        value: AttributeValue::String("dram".into()),
    });
    let mut cpus = DeviceRequest::count("cpus", count);
    cpus.has_capacity.push("cpu".into());
    ClaimSpec {
        requests: vec![memory, cpus],
        constraints: vec![Constraint {
            requests: Vec::new(),
            match_attribute: "resource.kubernetes.io/numaNode".into(),
        }],
    }
}

fn on(request: &str, device: &str, consumed: &[(&str, &str)]) -> AllocationResult {
    AllocationResult {
        request: request.into(),
        share_id: (!consumed.is_empty()).then(|| "5ca1ab1e-0000-4000-8000-000000000002".into()),
        ..by_hand(device, consumed)
    }
}

fn env_of(edits: &[cdi::ContainerEdits], i: usize) -> Vec<String> {
    edits[i].env.clone()
}

#[test]
fn individual_memory_devices_publish_what_grouped_numa_devices_do_without_cpus() {
    assert!(
        !individual(MemoryConfig::default())
            .devices()
            .unwrap()
            .iter()
            .any(|d| d.name.starts_with("memory")),
        "no memory published, no memory device"
    );
    let p = individual(memory_config(50));
    let devices = p.devices().unwrap();
    let names: Vec<&str> = devices.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(names.len(), 14 + 2);
    assert_eq!(&names[14..], ["memory0", "memory1"], "after the cpus");
    // The same capacities, from the same offer, as the grouped model's numa devices.
    let grouped = policy(memory_config(50));
    for n in 0..2 {
        let mut numa = capacity(&grouped, &format!("numa{n}"));
        numa.remove("cpu");
        assert_eq!(capacity(&p, &format!("memory{n}")), numa);
        let numa = grouped
            .devices()
            .unwrap()
            .into_iter()
            .find(|d| d.name == format!("numa{n}"))
            .unwrap();
        let memory = devices
            .iter()
            .find(|d| d.name == format!("memory{n}"))
            .unwrap();
        for (name, c) in &memory.capacities {
            assert_eq!(
                c.request_policy, numa.capacities[name].request_policy,
                "{name}"
            );
        }
        assert!(memory.allow_multiple_allocations);
        assert_eq!(
            memory.attributes["resource.kubernetes.io/numaNode"],
            AttributeValue::Int(n)
        );
        assert_eq!(
            memory.attributes["memoryKind"],
            AttributeValue::String("dram".into())
        );
    }
}

#[test]
fn an_individual_claim_gets_cpus_and_memory_of_one_node_by_construction() {
    let mut p = individual(memory_config(50));
    let mut sched = Scheduler::new(
        "topology-aware.resmgr.io",
        "node",
        Gates {
            consumable_capacity: true,
        },
    );
    let mut prepare = |p: &mut TopologyAware, uid: &str, spec: &ClaimSpec| {
        let results = sched.allocate(uid, spec, &p.devices().unwrap())?;
        Ok::<_, policy::scheduler::ScheduleError>(
            p.allocate_claim(&claim(uid, results.clone())).unwrap(),
        )
    };
    // 15 GiB fit node 0; the next 16 GiB only node 1, with its CPUs.
    let a = prepare(&mut p, "a", &memory_and_cpus(&[("memory", "15Gi")], 2)).unwrap();
    assert_eq!(a.edits.len(), 3);
    assert!(a.warnings.is_empty(), "{:?}", a.warnings);
    assert_eq!(p.memory_claimed(0), 15 * GIB);
    let b = prepare(
        &mut p,
        "b",
        &memory_and_cpus(&[("memory", "16Gi"), ("hugepages1Gi", "2Gi")], 4),
    )
    .unwrap();
    assert_eq!(p.claim_cpus("b").unwrap().to_string(), "8-11");
    assert_eq!(p.memory_claimed(1), 16 * GIB);
    assert_eq!(p.hugepages_claimed(1, GIB), 2 * GIB);
    // The memory device's result says its memory and node, not CPUs; the CPUs' say the CPUs.
    assert_eq!(
        env_of(&b.edits, 0),
        [
            "DRA_MEMS_b=1".to_owned(),
            format!("DRA_MEMORY_b={}", 16 * GIB),
            "DRA_HUGEPAGES_b=1Gi=2Gi".to_owned()
        ]
    );
    assert_eq!(env_of(&b.edits, 1), ["DRA_CPUSET_b=8-11", "DRA_MEMS_b=1"]);

    // A container using the claim: its CPUs, node 1, limited to the claim's memory and
    // hugepages, charged nothing of its own (the claim's grant is its memory).
    let before = p.memory_used(1);
    let mut c = container("c", "pod-b", GIB, None);
    c.cdi_devices = (0..5)
        .map(|i| format!("topology-aware.resmgr.io/device=claim-b-{i}"))
        .collect();
    let adj = p.allocate(&c).unwrap().adjustment;
    assert_eq!(adj.cpus.unwrap().to_string(), "8-11");
    assert_eq!(adj.mems.unwrap().to_string(), "1");
    assert_eq!(adj.memory_limit_bytes, Some(16 * GIB));
    assert_eq!(adj.hugepage_limits, BTreeMap::from([(GIB, 2 * GIB)]));
    assert_eq!(p.memory_used(1), before);
    // One naming only the memory request runs on the CPUs that memory goes with.
    let only = container(
        "m",
        "pod-b",
        0,
        Some("topology-aware.resmgr.io/device=claim-b-0"),
    );
    let adj = p.allocate(&only).unwrap().adjustment;
    assert_eq!(adj.cpus.unwrap().to_string(), "8-11");
    assert_eq!(adj.memory_limit_bytes, Some(16 * GIB));

    // No node has 1 GiB for claims left next to free CPUs: the claim stays Pending.
    let err = prepare(&mut p, "e", &memory_and_cpus(&[("memory", "1Gi")], 1)).unwrap_err();
    assert!(err.to_string().contains("memory left"), "{err}");

    // Restored, or taken back from its spec, it holds the same memory on the same node.
    let mut q = individual(memory_config(50));
    q.restore(&p.snapshot()).unwrap();
    assert_eq!(q.memory_claimed(1), 16 * GIB);
    let mut r = individual(memory_config(50));
    r.adopt_claim("b", &b.edits).unwrap();
    assert_eq!(r.memory_claimed(1), 16 * GIB);
    assert_eq!(r.hugepages_claimed(1, GIB), 2 * GIB);
    assert_eq!(r.claim_cpus("b").unwrap().to_string(), "8-11");
    // Released, it is free again.
    q.release_claim("b").unwrap();
    assert_eq!(q.memory_claimed(1), 0);
    assert_eq!(q.hugepages_claimed(1, GIB), 0);
}

#[test]
fn a_memory_device_without_cpus_is_refused_and_one_away_from_them_is_granted_as_allocated() {
    let mut p = individual(memory_config(50));
    let err = p
        .allocate_claim(&claim(
            "alone",
            vec![on("memory", "memory1", &[("memory", "4Gi")])],
        ))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(
            "result 0 (request memory) is 4Gi of memory of NUMA node 1 (device memory1), but the claim has no cpus to go with it"
        ),
        "{err}"
    );
    assert!(p.claims().is_empty());
    assert_eq!(p.memory_claimed(1), 0);

    // No constraint: the scheduler put the memory on node 1 and the CPU on node 0. The pod is
    // placed for it, so the node grants it: memory where it was charged, with a warning.
    let asked = claim(
        "away",
        vec![
            on("memory", "memory1", &[("memory", "4Gi")]),
            on("cpus", "cpu2", &[]),
        ],
    );
    let away = p.allocate_claim(&asked).unwrap();
    // Prepared again (the kubelet retries), it is the same claim: same edits, charged once.
    assert_eq!(p.allocate_claim(&asked).unwrap().edits, away.edits);
    assert!(
        away.warnings.iter().any(|w| w.contains(
            "result 0 (request memory) is 4Gi of memory of NUMA node 1 (device memory1), but its cpus 2 are on NUMA node 0"
        )),
        "{:?}",
        away.warnings
    );
    assert_eq!(p.memory_claimed(1), 4 * GIB);
    assert_eq!(
        env_of(&away.edits, 1),
        ["DRA_CPUSET_away=2", "DRA_MEMS_away=1"]
    );
}

#[test]
fn memory_claims_restored_onto_another_device_model_are_not_promised_again() {
    let mut p = policy(memory_config(50));
    p.allocate_claim(&claim(
        "g",
        vec![by_hand(
            "numa1",
            &[("cpu", "2"), ("memory", "10Gi"), ("hugepages1Gi", "1Gi")],
        )],
    ))
    .unwrap();
    // The operator switches the node to device-mode individual: the scheduler does not count
    // the claim on numa1 against memory1, so memory1 leaves out what it holds.
    let mut q = individual(memory_config(50));
    q.restore(&p.snapshot()).unwrap();
    assert_eq!(q.memory_claimed(1), 10 * GIB);
    let memory1 = capacity(&q, "memory1");
    assert_eq!(memory1["memory"], (6 * GIB).to_string());
    assert_eq!(memory1["hugepages1Gi"], (3 * GIB).to_string());
    assert_eq!(
        capacity(&q, "memory0")["memory"],
        (15 * GIB).to_string(),
        "other nodes publish all of theirs"
    );
    // When it goes, memory1 publishes all of node 1's share again.
    q.release_claim("g").unwrap();
    assert_eq!(capacity(&q, "memory1")["memory"], (16 * GIB).to_string());
    assert_eq!(
        capacity(&q, "memory1")["hugepages1Gi"],
        (4 * GIB).to_string()
    );
}
