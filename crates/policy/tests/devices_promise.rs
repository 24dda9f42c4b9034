//! What the published devices promise, the policy grants (issue 18's findings, each reproduced
//! as measured): a claim the scheduler allocated from our devices is prepared with what it
//! consumed, and no container the kubelet admitted is refused for CPUs.

use std::collections::BTreeMap;

use policy::{
    AttributeValue, Claim, Container, CpuSet, Fallback, Pod, Policy, PolicyError, QosClass,
    Quantity, Resources, Topology, TopologyAware, TopologySource, ValidValues,
    model::{AllocationResult, ClaimConfig, ConfigSource},
    topology_aware::{Config, DeviceModel, Exclusivity, Grant, Granularity, ReservedCpus},
};
use serde_json::json;

fn policy(desc: &str, reserved: &str) -> TopologyAware {
    policy_with(desc, reserved, Config::default())
}

fn policy_with(desc: &str, reserved: &str, config: Config) -> TopologyAware {
    let topo = Topology::load(&TopologySource::Synthetic(desc.into())).unwrap();
    let config = Config {
        reserved_cpus: ReservedCpus::Set(reserved.parse().unwrap()),
        ..config
    };
    TopologyAware::new(topo, config).unwrap()
}

fn fallbacks(p: &TopologyAware, id: &str) -> Vec<Fallback> {
    let inv = p.inventory();
    inv.containers
        .iter()
        .find(|c| c.id == id)
        .map(|c| c.fallbacks.clone())
        .unwrap()
}

fn full_cores() -> ClaimConfig {
    ClaimConfig {
        source: ConfigSource::Class,
        requests: Vec::new(),
        parameters: json!({"apiVersion": "resmgr.io/v1alpha1", "kind": "CpuConfig", "fullCores": true}),
    }
}

fn set(s: &str) -> CpuSet {
    s.parse().unwrap()
}

fn container(id: &str, qos: QosClass, cpu_milli: u64) -> Container {
    Container {
        id: id.into(),
        pod: Pod {
            uid: format!("pod-{id}"),
            namespace: "default".into(),
            name: format!("pod-{id}"),
            qos,
            annotations: BTreeMap::new(),
        },
        name: id.into(),
        resources: Resources {
            cpu_request_milli: cpu_milli,
            cpu_limit_milli: (qos == QosClass::Guaranteed).then_some(cpu_milli),
            ..Resources::default()
        },
        ..Container::default()
    }
}

/// A claim with one result on `device`; `cpus` is its consumed capacity, `None` when the API
/// server dropped it (DRAConsumableCapacity off).
fn claim(uid: &str, device: &str, cpus: Option<u64>) -> Claim {
    Claim {
        uid: uid.into(),
        namespace: "ml".into(),
        name: format!("claim-{uid}"),
        reserved_for: vec![format!("pod-{uid}")],
        results: vec![AllocationResult {
            request: "cpus".into(),
            pool: "node".into(),
            device: device.into(),
            share_id: cpus.map(|_| "share".into()),
            consumed_capacity: cpus
                .map(|n| BTreeMap::from([("cpu".to_owned(), Quantity::from_units(n))]))
                .unwrap_or_default(),
        }],
        config: Vec::new(),
        pod_claim_name: None,
    }
}

/// The capacity `cpu` each device advertises.
fn advertised(p: &TopologyAware) -> Vec<(String, u64)> {
    p.devices()
        .unwrap()
        .iter()
        .map(|d| (d.name.clone(), d.capacities["cpu"].value.units_ceil()))
        .collect()
}

/// Finding 1: NRI placements ate what the slices promised. Three Guaranteed 2-CPU containers
/// without claims took exclusive CPUs while numa0 still advertised 6 CPUs, and a claim for the
/// advertised 6 was refused. With the default `cpu-exclusivity` (claims) they run on shared CPUs
/// and the claim gets its 6.
#[test]
fn a_claim_for_what_a_device_advertises_is_granted_after_guaranteed_pods_without_claims() {
    let mut p = policy("pack:1 numa:2 core:4 pu:2", "0-1");
    for id in ["g1", "g2", "g3"] {
        p.allocate(&container(id, QosClass::Guaranteed, 2000))
            .unwrap();
    }
    assert_eq!(
        advertised(&p),
        [("numa0".to_owned(), 6), ("numa1".to_owned(), 8)]
    );
    let granted = p.allocate_claim(&claim("u1", "numa0", Some(6))).unwrap();
    assert_eq!(p.claim_cpus("u1"), Some(set("2-7")));
    assert_eq!(granted.edits[0].env[0], "DRA_CPUSET_u1=2-7");
    // The Guaranteed containers were shared all along, and now share numa1.
    for id in ["g1", "g2", "g3"] {
        let cpus = p.placement(id).unwrap().cpus;
        assert!(!cpus.intersects(&set("2-7")), "{id} on {cpus}");
    }
}

/// Finding 1, second half: shared containers' requests counted against claims, invisibly to the
/// scheduler. A claim never waits for shared containers: they move to CPUs still shared.
#[test]
fn a_claim_does_not_wait_for_shared_containers() {
    let mut p = policy("pack:1 numa:2 core:4 pu:2", "0-1");
    // Four CPUs' worth of Burstable requests land on numa1 (the roomier node), one CPU's on
    // numa0.
    p.allocate(&container("b1", QosClass::Burstable, 4000))
        .unwrap();
    p.allocate(&container("b2", QosClass::Burstable, 1000))
        .unwrap();
    assert_eq!(p.placement("b1").unwrap().pool.as_deref(), Some("numa1"));
    assert_eq!(p.placement("b2").unwrap().pool.as_deref(), Some("numa0"));
    let granted = p.allocate_claim(&claim("u1", "numa1", Some(8))).unwrap();
    assert_eq!(p.claim_cpus("u1"), Some(set("8-15")));
    for id in ["b1", "b2"] {
        let cpus = p.placement(id).unwrap().cpus;
        assert_eq!(cpus, set("2-7"), "{id} runs on the CPUs still shared");
    }
    assert_eq!(fallbacks(&p, "b1"), [Fallback::Widened]);
    assert_eq!(fallbacks(&p, "b2"), []);
    assert_eq!(granted.updates.len(), 1);
    assert_eq!(
        granted.warnings,
        [
            "claim ml/claim-u1 (u1) took the last shared cpus of pool numa1: its shared containers (1) now run on the shared cpus of root (2-7)"
        ]
    );
    // The claim goes: they are back at home.
    p.release_claim("u1").unwrap();
    assert_eq!(p.placement("b1").unwrap().cpus, set("8-15"));
    assert!(fallbacks(&p, "b1").is_empty());
}

/// Finding 2: without DRAConsumableCapacity the API server drops `consumedCapacity` and the
/// scheduler hands the whole device to one claim; the claim got one CPU. It gets the device.
#[test]
fn a_result_without_consumed_capacity_gets_the_whole_device() {
    let mut p = policy("pack:1 numa:2 core:4 pu:2", "0-1");
    let first = p.allocate_claim(&claim("u1", "numa1", None)).unwrap();
    assert_eq!(p.claim_cpus("u1"), Some(set("8-15")));
    // Re-prepared (the kubelet restarted): the same whole device, not "other results".
    let again = p.allocate_claim(&claim("u1", "numa1", None)).unwrap();
    assert_eq!(again.edits, first.edits);
    p.allocate_claim(&claim("u0", "numa0", None)).unwrap();
    assert_eq!(p.claim_cpus("u0"), Some(set("2-7")));
}

/// Finding 4: on a 2-CPU node with one CPU reserved, once the other is claimed nothing is
/// shared; a BestEffort container the kubelet admitted was refused (`no shared cpu is left`).
/// It runs on the reserved CPU, as the kubelet's static CPU manager would run it.
#[test]
fn with_nothing_shared_a_container_runs_on_the_reserved_cpus() {
    let mut p = policy("pack:1 core:2 pu:1", "0");
    p.allocate_claim(&claim("u1", "numa0", Some(1))).unwrap();
    assert_eq!(p.claim_cpus("u1"), Some(set("1")));
    let placed = p
        .allocate(&container("be", QosClass::BestEffort, 0))
        .unwrap();
    assert_eq!(placed.adjustment.cpus, Some(set("0")));
    assert_eq!(
        placed.warnings,
        [
            "no cpu is shared anywhere (claims and exclusive grants hold them all): runs on the reserved cpus 0 until some are shared again"
        ]
    );
    assert_eq!(fallbacks(&p, "be"), [Fallback::Reserved]);
    // The claim goes: the container gets the CPU back.
    let updates = p.release_claim("u1").unwrap();
    assert_eq!(updates.len(), 1);
    assert_eq!(updates[0].cpus, Some(set("1")));
    assert!(fallbacks(&p, "be").is_empty());
}

/// Finding 4 as measured: with exclusive CPUs for Guaranteed pods (nri-plugins' model), a
/// Guaranteed 1-CPU container takes the only CPU not reserved, and a BestEffort container then
/// runs on the reserved CPU instead of failing; a Guaranteed container whose exclusive CPUs
/// cannot be had runs shared.
#[test]
fn with_exclusive_pods_nothing_the_kubelet_admitted_is_refused() {
    let pods = Config {
        exclusivity: Exclusivity::Pods,
        ..Config::default()
    };
    let mut p = policy_with("pack:1 core:2 pu:1", "0", pods);
    let g = p
        .allocate(&container("g", QosClass::Guaranteed, 1000))
        .unwrap();
    assert_eq!(g.adjustment.cpus, Some(set("1")));
    let be = p
        .allocate(&container("be", QosClass::BestEffort, 0))
        .unwrap();
    assert_eq!(be.adjustment.cpus, Some(set("0")));
    assert_eq!(fallbacks(&p, "be"), [Fallback::Reserved]);
    let g2 = p
        .allocate(&container("g2", QosClass::Guaranteed, 1000))
        .unwrap();
    assert_eq!(g2.adjustment.cpus, Some(set("0")));
    assert!(
        g2.warnings[0].starts_with("needs 1 exclusive cpus")
            && g2.warnings[0].ends_with("runs on shared cpus instead"),
        "{:?}",
        g2.warnings
    );
    assert_eq!(
        fallbacks(&p, "g2"),
        [Fallback::NotExclusive, Fallback::Reserved]
    );
    // When g goes, both get its CPU.
    let updates = p.release("g").unwrap();
    assert_eq!(updates.len(), 2);
    assert!(updates.iter().all(|u| u.cpus == Some(set("1"))));
}

/// Found on the real containerd e2e: on a 2-CPU node with CPU 0 reserved, a BestEffort
/// container on CPU 1 kept a Guaranteed 1-CPU container from its exclusive CPU (`at most 0 can be
/// cut out of one pool (root: 1 shared, 1 needed by its shared containers)`), while the other
/// order gave it the CPU and the BestEffort container the reserved one: the order of arrival
/// decided. Like a claim, and like the kubelet's static CPU manager, an exclusive grant takes a
/// pool's last shared CPUs; the shared containers move to the reserved CPUs and back.
#[test]
fn an_exclusive_grant_takes_the_last_shared_cpu_whatever_arrived_first() {
    let pods = || Config {
        exclusivity: Exclusivity::Pods,
        ..Config::default()
    };
    let mut p = policy_with("pack:1 core:2 pu:1", "0", pods());
    let be = p
        .allocate(&container("be", QosClass::BestEffort, 0))
        .unwrap();
    assert_eq!(be.adjustment.cpus, Some(set("1")));
    let g = p
        .allocate(&container("g", QosClass::Guaranteed, 1000))
        .unwrap();
    assert_eq!(
        p.placement("g").unwrap().grant,
        Grant::Exclusive {
            pool: 0,
            cpus: set("1")
        },
        "{:?}",
        g.warnings
    );
    assert_eq!(g.adjustment.cpus, Some(set("1")));
    assert_eq!(g.updates.len(), 1);
    assert_eq!(g.updates[0].container_id, "be");
    assert_eq!(g.updates[0].cpus, Some(set("0")));
    assert_eq!(
        g.warnings,
        [
            "container default/pod-g/g took the last shared cpus of pool root: its shared containers (1) now run on the reserved cpus, as nothing else is shared (0)"
        ]
    );
    assert!(fallbacks(&p, "g").is_empty());
    assert_eq!(fallbacks(&p, "be"), [Fallback::Reserved]);

    // The other order ends the same.
    let mut q = policy_with("pack:1 core:2 pu:1", "0", pods());
    q.allocate(&container("g", QosClass::Guaranteed, 1000))
        .unwrap();
    q.allocate(&container("be", QosClass::BestEffort, 0))
        .unwrap();
    for id in ["g", "be"] {
        assert_eq!(p.placement(id), q.placement(id), "{id}");
    }

    // The Guaranteed container goes: the BestEffort one gets its CPU back.
    let updates = p.release("g").unwrap();
    assert_eq!(updates.len(), 1);
    assert_eq!(updates[0].cpus, Some(set("1")));
    assert!(fallbacks(&p, "be").is_empty());
}

/// With a partition, an exclusive grant may take the last CPUs that are not published: the
/// shared containers then run on the claimable CPUs lent to the pool, and when a claim takes
/// those back, on the reserved CPUs. Shared requests still steer a grant elsewhere while some
/// pool can spare the CPUs without them.
#[test]
fn with_a_partition_an_exclusive_grant_leaves_shared_containers_the_lent_cpus() {
    use policy::topology_aware::ClaimCpus;
    let partition = Config {
        exclusivity: Exclusivity::Partition(ClaimCpus::Set(set("3"))),
        ..Config::default()
    };
    let mut p = policy_with("pack:1 core:4 pu:1", "0", partition);
    p.allocate(&container("b", QosClass::Burstable, 2500))
        .unwrap();
    assert_eq!(p.placement("b").unwrap().cpus, set("1-3"));
    let g = p
        .allocate(&container("g", QosClass::Guaranteed, 2000))
        .unwrap();
    assert_eq!(g.adjustment.cpus, Some(set("1-2")), "{:?}", g.warnings);
    assert_eq!(p.placement("b").unwrap().cpus, set("3"));
    assert!(fallbacks(&p, "b").is_empty());
    p.allocate_claim(&claim("u1", "numa0", Some(1))).unwrap();
    assert_eq!(p.placement("b").unwrap().cpus, set("0"));
    assert_eq!(fallbacks(&p, "b"), [Fallback::Reserved]);
    // Nothing is left for a second exclusive grant: it runs shared, with the one it would join.
    let g2 = p
        .allocate(&container("g2", QosClass::Guaranteed, 1000))
        .unwrap();
    assert_eq!(g2.adjustment.cpus, Some(set("0")));
    assert_eq!(
        g2.warnings[0],
        "needs 1 exclusive cpus; only 0 cpus are neither reserved, set aside for claims nor held exclusively: runs on shared cpus instead"
    );
}

/// Finding 4's message: on a single-NUMA machine the pool is `root`, not `numa0`, and the
/// refusal of a claim that cannot be had (here two claims allocated the same device whole, which
/// the scheduler never does) named numa0 and counted no shared containers. A claim's refusal now
/// speaks of its device and who holds it.
#[test]
fn a_claim_refusal_names_its_device_and_who_holds_it() {
    let mut p = policy("pack:1 core:4 pu:1", "0");
    p.allocate(&container("b", QosClass::Burstable, 1000))
        .unwrap();
    p.allocate_claim(&claim("u1", "numa0", Some(3))).unwrap();
    let err = p
        .allocate_claim(&claim("u2", "numa0", Some(1)))
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "claim ml/claim-u2 (u2) does not fit: result 0 (request cpus) consumed 1 cpus of device numa0, but only 0 of its 3 are free (1-3 held by claim ml/claim-u1 (u1))"
    );
    let PolicyError::DoesNotFit { .. } = err else {
        panic!("{err:?}")
    };
}

/// The fullCores finding: a claim for 3 CPUs whose DeviceClass sets fullCores, allocated by the
/// scheduler on an SMT-2 node's per-CPU device, was refused after allocation (a stuck pod). The
/// scheduler cannot see the configuration, so the claim is granted what it consumed.
#[test]
fn full_cores_the_scheduler_could_not_see_is_not_a_refusal() {
    let mut p = policy("pack:1 numa:2 core:4 pu:2", "0-1");
    let mut c = claim("u1", "numa1", Some(3));
    c.config = vec![full_cores()];
    let granted = p.allocate_claim(&c).unwrap();
    let got = p.claim_cpus("u1").unwrap();
    assert_eq!(got.len(), 3);
    assert_eq!(got, set("8-10"), "whole cores first, then one thread");
    assert_eq!(granted.warnings.len(), 1);
    assert!(
        granted.warnings[0].contains("fullCores"),
        "{:?}",
        granted.warnings
    );
}

/// How the scheduler sees whole cores: with `claim-granularity: core` every device is whole
/// cores (`wholeCores: true`, which a DeviceClass setting fullCores selects) and its request
/// policy counts in cores, so the scheduler rounds 3 CPUs up to 4 and the claim gets 2 cores.
#[test]
fn whole_core_devices_make_the_scheduler_round_up_to_cores() {
    let cores = Config {
        devices: DeviceModel {
            granularity: Granularity::Core,
            ..DeviceModel::default()
        },
        ..Config::default()
    };
    let mut p = policy_with("pack:1 numa:2 core:4 pu:2", "0", cores);
    let devices = p.devices().unwrap();
    let numa0 = &devices[0];
    assert_eq!(numa0.attributes["wholeCores"], AttributeValue::Bool(true));
    // CPU 1's sibling is reserved: not published.
    let cpu = &numa0.capacities["cpu"];
    assert_eq!(cpu.value, Quantity::from_units(6));
    let policy = cpu.request_policy.as_ref().unwrap();
    assert_eq!(policy.default, Some(Quantity::from_units(2)));
    assert_eq!(
        policy.valid,
        ValidValues::Range {
            min: Quantity::from_units(2),
            max: Some(Quantity::from_units(6)),
            step: Some(Quantity::from_units(2)),
        }
    );
    // The scheduler consumed 4 for a request of 3.
    let mut c = claim("u1", "numa1", Some(4));
    c.config = vec![full_cores()];
    let granted = p.allocate_claim(&c).unwrap();
    assert!(granted.warnings.is_empty(), "{:?}", granted.warnings);
    assert_eq!(p.claim_cpus("u1"), Some(set("8-11")));
    // Claims of one core each never split one, so the last core is always whole.
    for (i, uid) in ["u2", "u3"].iter().enumerate() {
        p.allocate_claim(&claim(uid, "numa1", Some(2))).unwrap();
        assert_eq!(p.claim_cpus(uid).unwrap().len(), 2, "claim {i}");
    }
    assert_eq!(
        p.claim_cpus("u2")
            .unwrap()
            .union(&p.claim_cpus("u3").unwrap()),
        set("12-15")
    );
}

/// A hybrid part (two 2-thread performance cores, four 1-thread efficiency cores), CPU 0
/// reserved: individual devices say which kind of core they are, and with whole-core granularity
/// every claim the request policy allows is made of whole cores of either kind, to the last CPU.
#[test]
fn hybrid_parts_publish_core_types_and_whole_cores_of_either_kind() {
    let xml = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hybrid.xml");
    let topo = Topology::load(&TopologySource::Xml(xml)).unwrap();
    let config = |mode, granularity| Config {
        reserved_cpus: ReservedCpus::Set(set("0")),
        devices: DeviceModel {
            mode,
            granularity,
            ..DeviceModel::default()
        },
        ..Config::default()
    };
    use policy::topology_aware::DeviceMode;
    let individual = TopologyAware::new(
        topo.clone(),
        config(DeviceMode::Individual, Granularity::Cpu),
    )
    .unwrap();
    let types: Vec<(String, AttributeValue)> = individual
        .devices()
        .unwrap()
        .into_iter()
        .map(|d| (d.name, d.attributes["coreType"].clone()))
        .collect();
    let kind = |k: &str| AttributeValue::String(k.into());
    assert_eq!(
        types,
        [
            ("cpu1".to_owned(), kind("p-core")),
            ("cpu2".to_owned(), kind("p-core")),
            ("cpu3".to_owned(), kind("p-core")),
            ("cpu4".to_owned(), kind("e-core")),
            ("cpu5".to_owned(), kind("e-core")),
            ("cpu6".to_owned(), kind("e-core")),
            ("cpu7".to_owned(), kind("e-core")),
        ]
    );
    let mut p = TopologyAware::new(topo, config(DeviceMode::Grouped, Granularity::Core)).unwrap();
    let numa0 = &p.devices().unwrap()[0];
    // CPU 1's sibling is reserved: 2-3 and the four efficiency cores.
    assert_eq!(numa0.capacities["cpu"].value, Quantity::from_units(6));
    let policy = numa0.capacities["cpu"].request_policy.clone().unwrap();
    assert_eq!(policy.default, Some(Quantity::from_units(2)));
    for uid in ["u1", "u2", "u3"] {
        p.allocate_claim(&claim(uid, "numa0", Some(2))).unwrap();
        let cpus = p.claim_cpus(uid).unwrap();
        let whole = p
            .topology()
            .cores
            .iter()
            .all(|c| !c.threads.intersects(&cpus) || cpus.is_superset(&c.threads));
        assert!(whole, "claim {uid} got {cpus}, which splits a core");
    }
}

/// The device model changes while a claim is held (the agent restarts with another
/// `device-mode` or `group-by`): the scheduler does not count the claim against the new devices,
/// so they must not promise its CPUs again until it is released.
#[test]
fn devices_of_a_new_model_withhold_what_claims_on_the_old_ones_hold() {
    use policy::topology_aware::{DeviceMode, GroupBy};
    let model = |mode, group_by| Config {
        devices: DeviceModel {
            mode,
            group_by,
            ..DeviceModel::default()
        },
        ..Config::default()
    };
    let names = |p: &TopologyAware| -> Vec<String> {
        p.devices().unwrap().into_iter().map(|d| d.name).collect()
    };
    let mut grouped = policy("pack:2 numa:1 core:4 pu:1", "0");
    grouped
        .allocate_claim(&claim("u1", "numa0", Some(3)))
        .unwrap();
    assert_eq!(grouped.claim_cpus("u1"), Some(set("1-3")));
    let saved = grouped.snapshot();

    // Individual devices: cpu1-3 are not published while u1 holds them.
    let mut p = policy_with(
        "pack:2 numa:1 core:4 pu:1",
        "0",
        model(DeviceMode::Individual, GroupBy::Numa),
    );
    assert_eq!(names(&p).len(), 7);
    p.restore(&saved).unwrap();
    assert_eq!(names(&p), ["cpu4", "cpu5", "cpu6", "cpu7"]);
    // Its re-prepare is answered as before.
    let again = p.allocate_claim(&claim("u1", "numa0", Some(3))).unwrap();
    assert_eq!(again.edits[0].env[0], "DRA_CPUSET_u1=1-3");
    p.release_claim("u1").unwrap();
    assert_eq!(names(&p).len(), 7, "published again once released");

    // Grouped by socket: socket0's capacity leaves out what u1 holds.
    let mut p = policy_with(
        "pack:2 numa:1 core:4 pu:1",
        "0",
        model(DeviceMode::Grouped, GroupBy::Socket),
    );
    p.restore(&saved).unwrap();
    assert_eq!(advertised(&p), [("socket1".to_owned(), 4)]);
    // Under the same model nothing is withheld: the scheduler counts u1 on numa0 itself.
    let mut same = policy("pack:2 numa:1 core:4 pu:1", "0");
    same.restore(&saved).unwrap();
    assert_eq!(
        advertised(&same),
        [("numa0".to_owned(), 3), ("numa1".to_owned(), 4)]
    );
}

/// With a partition, the CPUs the devices withhold for a claim of an earlier configuration (and
/// the other thread of its core, with whole-core granularity) are still set aside for claims: no
/// container gets them exclusively, so when the claim goes and they are published again, nothing
/// else holds them (found by i18sim's invariant walk: a container took CPU 3, and the claim the
/// scheduler then allocated for all of numa0 was refused).
#[test]
fn withheld_claim_cpus_stay_out_of_exclusive_container_grants() {
    use policy::topology_aware::{ClaimCpus, DeviceMode};
    let partition = |mode, granularity| Config {
        exclusivity: Exclusivity::Partition(ClaimCpus::Set(set("2-7"))),
        devices: DeviceModel {
            mode,
            granularity,
            ..DeviceModel::default()
        },
        ..Config::default()
    };
    let machine = "pack:1 numa:1 core:4 pu:2";
    let mut before = policy_with(
        machine,
        "0-1",
        partition(DeviceMode::Individual, Granularity::Cpu),
    );
    before.allocate_claim(&claim("u1", "cpu2", None)).unwrap();
    let mut p = policy_with(
        machine,
        "0-1",
        partition(DeviceMode::Grouped, Granularity::Core),
    );
    p.restore(&before.snapshot()).unwrap();
    // cpu2 is held; core 2-3 is not whole: numa0 publishes 4-7.
    assert_eq!(advertised(&p), [("numa0".to_owned(), 4)]);
    let g = p
        .allocate(&container("g", QosClass::Guaranteed, 1000))
        .unwrap();
    assert_ne!(
        g.adjustment.cpus,
        Some(set("3")),
        "CPU 3 is the partition's"
    );
    assert_eq!(fallbacks(&p, "g"), [Fallback::NotExclusive]);
    p.release_claim("u1").unwrap();
    assert_eq!(advertised(&p), [("numa0".to_owned(), 6)]);
    p.allocate_claim(&claim("u2", "numa0", Some(6))).unwrap();
    assert_eq!(p.claim_cpus("u2"), Some(set("2-7")));
}

/// The individual model's memory devices promise only the claims' share of each node (issue
/// 26): containers placed through NRI that ask for more memory than their share are widened and
/// then left unpinned, never charged to what a memory device publishes, and a claim for all of
/// it, with CPU devices of the same node, is granted afterwards.
#[test]
fn memory_devices_promise_nothing_containers_placed_through_nri_use() {
    const GIB: u64 = 1 << 30;
    let config = Config {
        devices: DeviceModel {
            mode: policy::topology_aware::DeviceMode::Individual,
            ..DeviceModel::default()
        },
        memory: policy::topology_aware::MemoryConfig {
            claim_percent: 50,
            ..Default::default()
        },
        ..Config::default()
    };
    let mut p = policy_with("pack:1 numa:2(memory=16GiB) core:4 pu:1", "0", config);
    let memory = |p: &TopologyAware| -> Vec<(String, u64)> {
        p.devices()
            .unwrap()
            .iter()
            .filter_map(|d| {
                let m = d.capacities.get("memory")?;
                Some((d.name.clone(), m.value.units_ceil()))
            })
            .collect()
    };
    let promised = memory(&p);
    assert_eq!(
        promised,
        [
            ("memory0".to_owned(), 8 * GIB),
            ("memory1".to_owned(), 8 * GIB)
        ]
    );
    // 21 GiB of Guaranteed containers: more than the 16 GiB the nodes keep for containers.
    for id in ["a", "b", "c"] {
        let mut c = container(id, QosClass::Guaranteed, 1000);
        c.resources.memory_request_bytes = 7 * GIB;
        c.resources.memory_limit_bytes = Some(7 * GIB);
        p.allocate(&c).unwrap();
    }
    assert!(p.memory_used(0) <= 8 * GIB && p.memory_used(1) <= 8 * GIB);
    assert_eq!(memory(&p), promised, "the slices promise the same");
    let on = |request: &str, device: &str, consumed: Option<(&str, u64)>| AllocationResult {
        request: request.into(),
        pool: "node".into(),
        device: device.into(),
        share_id: consumed.map(|_| "share".into()),
        consumed_capacity: consumed
            .map(|(n, b)| BTreeMap::from([(n.to_owned(), Quantity::from_units(b))]))
            .unwrap_or_default(),
    };
    for (uid, node, cpu) in [("m0", 0, "cpu1"), ("m1", 1, "cpu4")] {
        let mut c = claim(uid, cpu, None);
        c.results = vec![
            on(
                "memory",
                &format!("memory{node}"),
                Some(("memory", 8 * GIB)),
            ),
            on("cpus", cpu, None),
        ];
        p.allocate_claim(&c).unwrap();
        assert_eq!(p.memory_claimed(node), 8 * GIB);
    }
}
