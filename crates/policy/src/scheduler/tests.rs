//! One test per rule of the model, on hand-made device lists shaped like the two device models:
//! grouped (one shared device per NUMA node with a `cpu` capacity) and individual (one device
//! per CPU, no capacity).

use std::collections::BTreeMap;

use super::*;
use crate::model::{Capacity, RequestPolicy, ValidValues};

const DRIVER: &str = "cpu.example.io";
const NUMA: &str = "resource.kubernetes.io/numaNode";

fn q(s: &str) -> Quantity {
    s.parse().unwrap()
}

fn on() -> Scheduler {
    Scheduler::new(
        DRIVER,
        "node-1",
        Gates {
            consumable_capacity: true,
        },
    )
}

fn off() -> Scheduler {
    Scheduler::new(
        DRIVER,
        "node-1",
        Gates {
            consumable_capacity: false,
        },
    )
}

/// A grouped device: NUMA node `node` with `cpus` CPUs, shared, one CPU at a time.
fn grouped(node: i64, cpus: u64) -> Device {
    Device {
        name: format!("numa{node}"),
        attributes: BTreeMap::from([(NUMA.to_owned(), AttributeValue::Int(node))]),
        capacities: BTreeMap::from([(
            "cpu".to_owned(),
            Capacity {
                value: Quantity::from_units(cpus),
                request_policy: Some(RequestPolicy {
                    default: Some(Quantity::from_units(1)),
                    valid: ValidValues::Range {
                        min: Quantity::from_units(1),
                        max: Some(Quantity::from_units(cpus)),
                        step: Some(Quantity::from_units(1)),
                    },
                }),
            },
        )]),
        allow_multiple_allocations: true,
        taints: Vec::new(),
    }
}

/// An individual device: CPU `cpu` on NUMA node `node`, in socket `node / 2`.
fn individual(cpu: u32, node: i64) -> Device {
    Device {
        name: format!("cpu{cpu}"),
        attributes: BTreeMap::from([
            (NUMA.to_owned(), AttributeValue::Int(node)),
            ("socket".to_owned(), AttributeValue::Int(node / 2)),
        ]),
        capacities: BTreeMap::new(),
        allow_multiple_allocations: false,
        taints: Vec::new(),
    }
}

/// `per_node` CPUs on each of `nodes` NUMA nodes, numbered node by node.
fn cpus(nodes: i64, per_node: u32) -> Vec<Device> {
    (0..nodes)
        .flat_map(|n| {
            let first = u32::try_from(n).unwrap() * per_node;
            (first..first + per_node).map(move |c| individual(c, n))
        })
        .collect()
}

fn one(request: DeviceRequest) -> ClaimSpec {
    ClaimSpec {
        requests: vec![request],
        constraints: vec![],
    }
}

fn same_numa(request: DeviceRequest) -> ClaimSpec {
    ClaimSpec {
        requests: vec![request],
        constraints: vec![Constraint {
            requests: vec![],
            match_attribute: NUMA.into(),
        }],
    }
}

fn devices_of(results: &[AllocationResult]) -> Vec<&str> {
    results.iter().map(|r| r.device.as_str()).collect()
}

fn unschedulable(e: ScheduleError) -> String {
    match e {
        ScheduleError::Unschedulable(m) => m,
        other => panic!("expected unschedulable, got {other:?}"),
    }
}

#[test]
fn a_count_takes_that_many_free_devices_in_published_order_each_whole() {
    let devices = cpus(2, 4);
    let mut s = off();
    let first = s
        .allocate("a", &one(DeviceRequest::count("cpus", 3)), &devices)
        .unwrap();
    assert_eq!(devices_of(&first), ["cpu0", "cpu1", "cpu2"]);
    for r in &first {
        assert_eq!(r.request, "cpus");
        assert_eq!(r.pool, "node-1");
        assert_eq!(r.share_id, None, "a device taken whole has no share");
        assert!(r.consumed_capacity.is_empty());
    }
    let second = s
        .allocate("b", &one(DeviceRequest::count("cpus", 2)), &devices)
        .unwrap();
    assert_eq!(
        devices_of(&second),
        ["cpu3", "cpu4"],
        "held devices are skipped"
    );
    // Same with the gate on: devices without allowMultipleAllocations are taken whole.
    let mut s = on();
    let r = s
        .allocate("a", &one(DeviceRequest::count("cpus", 3)), &devices)
        .unwrap();
    assert_eq!(devices_of(&r), ["cpu0", "cpu1", "cpu2"]);
    assert!(r.iter().all(|r| r.share_id.is_none()));
}

#[test]
fn a_count_larger_than_the_free_devices_is_unschedulable_and_records_nothing() {
    let devices = cpus(1, 4);
    let mut s = on();
    s.allocate("a", &one(DeviceRequest::count("cpus", 3)), &devices)
        .unwrap();
    let e = s
        .allocate("b", &one(DeviceRequest::count("cpus", 2)), &devices)
        .unwrap_err();
    assert_eq!(
        unschedulable(e),
        "request cpus (2 devices): 1 of the 4 matching devices can take it (cpu0: allocated whole to another claim; cpu1: allocated whole to another claim; cpu2: allocated whole to another claim)"
    );
    assert_eq!(
        s.allocations().len(),
        1,
        "a failed allocation records nothing"
    );
    // Once a is deallocated, b fits.
    s.deallocate("a");
    let r = s
        .allocate("b", &one(DeviceRequest::count("cpus", 2)), &devices)
        .unwrap();
    assert_eq!(devices_of(&r), ["cpu0", "cpu1"]);
}

#[test]
fn match_attribute_backtracks_to_the_first_value_with_enough_free_devices() {
    let devices = cpus(3, 4);
    let mut s = off();
    // Take two CPUs of numa0: it has 2 left, numa1 has 4.
    s.allocate("a", &one(DeviceRequest::count("cpus", 2)), &devices)
        .unwrap();
    let r = s
        .allocate("b", &same_numa(DeviceRequest::count("cpus", 3)), &devices)
        .unwrap();
    assert_eq!(devices_of(&r), ["cpu4", "cpu5", "cpu6"]);
    // Without the constraint the first free ones are taken, across nodes.
    let r = s
        .allocate("c", &one(DeviceRequest::count("cpus", 3)), &devices)
        .unwrap();
    assert_eq!(devices_of(&r), ["cpu2", "cpu3", "cpu7"]);
}

#[test]
fn match_attribute_that_no_value_satisfies_says_how_many_share_one() {
    let devices = cpus(2, 4);
    let mut s = off();
    s.allocate("a", &one(DeviceRequest::count("cpus", 1)), &devices)
        .unwrap();
    s.allocate(
        "b",
        &one(DeviceRequest {
            selectors: vec![Selector {
                attribute: NUMA.into(),
                value: AttributeValue::Int(1),
            }],
            ..DeviceRequest::count("cpus", 1)
        }),
        &devices,
    )
    .unwrap();
    let e = s
        .allocate("c", &same_numa(DeviceRequest::count("cpus", 4)), &devices)
        .unwrap_err();
    assert_eq!(
        unschedulable(e),
        "request cpus (4 devices) must have one resource.kubernetes.io/numaNode for all its devices: at most 3 free ones share a value (resource.kubernetes.io/numaNode = 0)"
    );
}

#[test]
fn a_constraint_applies_only_to_the_requests_it_names() {
    let devices = cpus(2, 2);
    let mut s = off();
    s.allocate("a", &one(DeviceRequest::count("x", 1)), &devices)
        .unwrap();
    // "main" must be on one node (numa1, since numa0 has one left); "extra" may go anywhere
    // and takes the first free device.
    let spec = ClaimSpec {
        requests: vec![
            DeviceRequest::count("main", 2),
            DeviceRequest::count("extra", 1),
        ],
        constraints: vec![Constraint {
            requests: vec!["main".into()],
            match_attribute: NUMA.into(),
        }],
    };
    let r = s.allocate("b", &spec, &devices).unwrap();
    let got: Vec<(&str, &str)> = r
        .iter()
        .map(|r| (r.request.as_str(), r.device.as_str()))
        .collect();
    assert_eq!(got, [("main", "cpu2"), ("main", "cpu3"), ("extra", "cpu1")]);
}

#[test]
fn a_device_without_the_constrained_attribute_is_never_taken() {
    let mut devices = cpus(1, 2);
    devices[0].attributes.remove(NUMA);
    let r = off()
        .allocate("a", &same_numa(DeviceRequest::count("cpus", 1)), &devices)
        .unwrap();
    assert_eq!(devices_of(&r), ["cpu1"]);
}

#[test]
fn selectors_compare_typed_values_under_qualified_or_driver_bare_names() {
    let devices = cpus(4, 1);
    let pick = |attribute: &str, value: AttributeValue| {
        let request = DeviceRequest {
            selectors: vec![Selector {
                attribute: attribute.into(),
                value,
            }],
            ..DeviceRequest::count("cpus", 1)
        };
        off()
            .allocate("a", &one(request), &devices)
            .map(|r| r[0].device.clone())
    };
    assert_eq!(pick(NUMA, AttributeValue::Int(2)).unwrap(), "cpu2");
    // The device published `socket` bare: it is the driver's.
    assert_eq!(pick("socket", AttributeValue::Int(1)).unwrap(), "cpu2");
    assert_eq!(
        pick("cpu.example.io/socket", AttributeValue::Int(1)).unwrap(),
        "cpu2"
    );
    // Another domain does not see the driver's bare attribute; a value of another type
    // does not match.
    let e = pick("other.io/socket", AttributeValue::Int(1)).unwrap_err();
    assert_eq!(
        unschedulable(e),
        "request cpus (1 device with other.io/socket == 1): no published device has other.io/socket == 1"
    );
    assert!(pick(NUMA, AttributeValue::String("2".into())).is_err());
}

#[test]
fn capacity_is_rounded_by_the_request_policy_and_every_share_gets_an_id() {
    let devices = vec![grouped(0, 6), grouped(1, 8)];
    let mut s = on();
    let r = s
        .allocate(
            "a",
            &one(DeviceRequest::capacity("cpus", "cpu", q("2500m"))),
            &devices,
        )
        .unwrap();
    assert_eq!(r.len(), 1);
    assert_eq!(r[0].device, "numa0");
    assert_eq!(
        r[0].consumed_capacity,
        BTreeMap::from([("cpu".into(), q("3"))])
    );
    let first_share = r[0].share_id.clone().unwrap();
    // A request without capacity gets the policy's default.
    let r = s
        .allocate("b", &one(DeviceRequest::count("cpus", 1)), &devices)
        .unwrap();
    assert_eq!(r[0].device, "numa0");
    assert_eq!(r[0].consumed_capacity["cpu"], q("1"));
    assert_ne!(r[0].share_id.as_ref(), Some(&first_share));
    assert_eq!(s.consumed("numa0", "cpu"), q("4"));
    // 3 more do not fit on numa0 (2 left): numa1 gets them.
    let r = s
        .allocate(
            "c",
            &one(DeviceRequest::capacity("cpus", "cpu", q("3"))),
            &devices,
        )
        .unwrap();
    assert_eq!(r[0].device, "numa1");
    assert!(!s.held_whole("numa0"));
}

#[test]
fn capacity_nobody_has_left_is_unschedulable_naming_what_each_device_has() {
    let devices = vec![grouped(0, 6), grouped(1, 8)];
    let mut s = on();
    s.allocate(
        "a",
        &one(DeviceRequest::capacity("cpus", "cpu", q("5"))),
        &devices,
    )
    .unwrap();
    s.allocate(
        "b",
        &one(DeviceRequest::capacity("cpus", "cpu", q("7"))),
        &devices,
    )
    .unwrap();
    let e = s
        .allocate(
            "c",
            &one(DeviceRequest::capacity("cpus", "cpu", q("1500m"))),
            &devices,
        )
        .unwrap_err();
    assert_eq!(
        unschedulable(e),
        "request cpus (1 device with cpu=1500m): 0 of the 2 matching devices can take it (numa0: 1 of its 6 cpu left, 1500m rounded up to 2 by its request policy asked; numa1: 1 of its 8 cpu left, 1500m rounded up to 2 by its request policy asked)"
    );
}

#[test]
fn an_amount_above_the_policys_max_skips_the_device() {
    let devices = vec![grouped(0, 2), grouped(1, 8)];
    let r = on()
        .allocate(
            "a",
            &one(DeviceRequest::capacity("cpus", "cpu", q("4"))),
            &devices,
        )
        .unwrap();
    assert_eq!(r[0].device, "numa1");
    let e = on()
        .allocate(
            "a",
            &one(DeviceRequest::capacity("cpus", "cpu", q("9"))),
            &devices,
        )
        .unwrap_err();
    assert_eq!(
        unschedulable(e),
        "request cpus (1 device with cpu=9): 0 of the 2 matching devices can take it (numa0: its request policy refuses cpu 9; numa1: its request policy refuses cpu 9)"
    );
}

#[test]
fn capacity_names_match_exactly() {
    let devices = vec![grouped(0, 4)];
    let r = on()
        .allocate(
            "a",
            &one(DeviceRequest::capacity("cpus", "cpu", q("2"))),
            &devices,
        )
        .unwrap();
    assert_eq!(
        r[0].consumed_capacity,
        BTreeMap::from([("cpu".into(), q("2"))])
    );
    // Kubernetes 1.34 to 1.36 do not take `<driver>/cpu` for the bare `cpu` the device
    // published (later versions do).
    for name in ["cpu.example.io/cpu", "other.io/cpu"] {
        let e = on()
            .allocate(
                "a",
                &one(DeviceRequest::capacity("cpus", name, q("2"))),
                &devices,
            )
            .unwrap_err();
        assert!(
            unschedulable(e).contains(&format!("numa0: has no capacity [\"{name}\"]")),
            "{name}"
        );
    }
}

#[test]
fn a_capacity_request_on_a_device_taken_whole_must_fit_its_capacity() {
    // A whole device with capacity but no multiple allocations (gate on).
    let mut big = grouped(0, 4);
    big.allow_multiple_allocations = false;
    big.capacities.get_mut("cpu").unwrap().request_policy = None;
    let devices = vec![big];
    let r = on()
        .allocate(
            "a",
            &one(DeviceRequest::capacity("cpus", "cpu", q("3"))),
            &devices,
        )
        .unwrap();
    assert_eq!(r[0].share_id, None);
    assert!(r[0].consumed_capacity.is_empty());
    assert!(
        on().allocate(
            "a",
            &one(DeviceRequest::capacity("cpus", "cpu", q("5"))),
            &devices
        )
        .is_err()
    );
}

#[test]
fn two_requests_of_one_claim_may_share_a_device_and_their_amounts_add_up() {
    let devices = vec![grouped(0, 4)];
    let spec = ClaimSpec {
        requests: vec![
            DeviceRequest::capacity("a", "cpu", q("2")),
            DeviceRequest::capacity("b", "cpu", q("2")),
        ],
        constraints: vec![],
    };
    let r = on().allocate("x", &spec, &devices).unwrap();
    assert_eq!(devices_of(&r), ["numa0", "numa0"]);
    assert_ne!(r[0].share_id, r[1].share_id);
    let too_much = ClaimSpec {
        requests: vec![
            DeviceRequest::capacity("a", "cpu", q("3")),
            DeviceRequest::capacity("b", "cpu", q("2")),
        ],
        constraints: vec![],
    };
    assert!(on().allocate("x", &too_much, &devices).is_err());
}

#[test]
fn without_the_gate_a_shared_device_is_handed_out_whole_and_the_capacity_request_dropped() {
    let devices = vec![grouped(0, 6), grouped(1, 8)];
    let mut s = off();
    let spec = one(DeviceRequest::capacity("cpus", "cpu", q("4")));
    let (stored, dropped) = s.stored_claim(&spec);
    assert!(stored.requests[0].capacity.is_empty());
    assert_eq!(dropped, ["request cpus: capacity cpu=4"]);
    let seen = s.stored_devices(&devices);
    assert!(!seen[0].allow_multiple_allocations);
    assert_eq!(seen[0].capacities["cpu"].request_policy, None);
    assert_eq!(seen[0].capacities["cpu"].value, q("6"), "capacities stay");

    let r = s.allocate("a", &spec, &devices).unwrap();
    assert_eq!(r[0].device, "numa0");
    assert_eq!(r[0].share_id, None);
    assert!(r[0].consumed_capacity.is_empty(), "no consumedCapacity");
    assert!(s.held_whole("numa0"));
    // The next claim, even for one CPU, gets the other node whole; the third nothing.
    let r = s
        .allocate("b", &one(DeviceRequest::count("cpus", 1)), &devices)
        .unwrap();
    assert_eq!(r[0].device, "numa1");
    let e = s
        .allocate("c", &one(DeviceRequest::count("cpus", 1)), &devices)
        .unwrap_err();
    assert_eq!(
        unschedulable(e),
        "request cpus (1 device): 0 of the 2 matching devices can take it (numa0: allocated whole to another claim; numa1: allocated whole to another claim)"
    );
}

#[test]
fn a_result_without_a_share_holds_its_device_whole_even_with_the_gate_on() {
    // Allocated while the gate was off, then the gate was turned on.
    let devices = vec![grouped(0, 6)];
    let mut s = on();
    s.record(
        "old",
        vec![AllocationResult {
            request: "cpus".into(),
            pool: "node-1".into(),
            device: "numa0".into(),
            share_id: None,
            consumed_capacity: BTreeMap::new(),
        }],
    );
    assert!(s.held_whole("numa0"));
    assert!(
        s.allocate("new", &one(DeviceRequest::count("cpus", 1)), &devices)
            .is_err()
    );
    // And with the gate off, a share counts as whole too: the scheduler ignores share IDs.
    let mut s = off();
    s.record(
        "shared",
        vec![AllocationResult {
            share_id: Some("s".into()),
            consumed_capacity: BTreeMap::from([("cpu".into(), q("1"))]),
            request: "cpus".into(),
            pool: "node-1".into(),
            device: "numa0".into(),
        }],
    );
    assert!(s.held_whole("numa0"));
}

#[test]
fn results_of_another_pool_do_not_count() {
    let devices = vec![grouped(0, 2)];
    let mut s = on();
    s.record(
        "elsewhere",
        vec![AllocationResult {
            request: "cpus".into(),
            pool: "node-2".into(),
            device: "numa0".into(),
            share_id: None,
            consumed_capacity: BTreeMap::new(),
        }],
    );
    assert!(
        s.allocate("a", &one(DeviceRequest::count("cpus", 1)), &devices)
            .is_ok()
    );
}

#[test]
fn more_than_32_results_is_unschedulable() {
    let devices = cpus(1, 40);
    let e = off()
        .allocate("a", &one(DeviceRequest::count("cpus", 33)), &devices)
        .unwrap_err();
    assert_eq!(
        unschedulable(e),
        "the claim asks for 33 devices, more than the 32 results one claim can hold"
    );
    let r = off()
        .allocate("a", &one(DeviceRequest::count("cpus", 32)), &devices)
        .unwrap();
    assert_eq!(r.len(), 32);
}

#[test]
fn what_the_api_server_refuses_is_invalid() {
    let devices = cpus(1, 2);
    let invalid = |spec: ClaimSpec| match off().allocate("a", &spec, &devices) {
        Err(ScheduleError::Invalid(m)) => m,
        other => panic!("{other:?}"),
    };
    assert!(invalid(ClaimSpec::default()).contains("no requests"));
    assert!(invalid(one(DeviceRequest::count("cpus", 0))).contains("at least 1"));
    assert!(invalid(one(DeviceRequest::count("CPUs", 1))).contains("DNS label"));
    let twice = ClaimSpec {
        requests: vec![DeviceRequest::count("a", 1), DeviceRequest::count("a", 1)],
        constraints: vec![],
    };
    assert!(invalid(twice).contains("used twice"));
    let bare = ClaimSpec {
        constraints: vec![Constraint {
            requests: vec![],
            match_attribute: "numaNode".into(),
        }],
        ..one(DeviceRequest::count("cpus", 1))
    };
    assert!(invalid(bare).contains("fully qualified"));
    let unknown = ClaimSpec {
        constraints: vec![Constraint {
            requests: vec!["nope".into()],
            match_attribute: NUMA.into(),
        }],
        ..one(DeviceRequest::count("cpus", 1))
    };
    assert!(invalid(unknown).contains("\"nope\""));
    // An allocated claim is never allocated again.
    let mut s = off();
    s.allocate("a", &one(DeviceRequest::count("cpus", 1)), &devices)
        .unwrap();
    assert!(matches!(
        s.allocate("a", &one(DeviceRequest::count("cpus", 1)), &devices),
        Err(ScheduleError::Invalid(_))
    ));
}

#[test]
fn a_hopeless_constraint_on_many_devices_fails_fast() {
    // 16 NUMA nodes of 64 CPUs, each with 31 free: a 32-CPU request on one node has no
    // solution, which the exhaustive search would prove by trying every subset of 31.
    let devices = cpus(16, 64);
    let mut s = off();
    for n in 0..16u32 {
        let taken = ClaimSpec {
            requests: vec![DeviceRequest {
                selectors: vec![Selector {
                    attribute: NUMA.into(),
                    value: AttributeValue::Int(n.into()),
                }],
                ..DeviceRequest::count("cpus", 32)
            }],
            constraints: vec![],
        };
        s.allocate(&format!("t{n}"), &taken, &devices).unwrap();
        s.allocate(
            &format!("u{n}"),
            &one(DeviceRequest {
                selectors: vec![Selector {
                    attribute: NUMA.into(),
                    value: AttributeValue::Int(n.into()),
                }],
                ..DeviceRequest::count("cpus", 1)
            }),
            &devices,
        )
        .unwrap();
    }
    let e = s
        .allocate(
            "big",
            &same_numa(DeviceRequest::count("cpus", 32)),
            &devices,
        )
        .unwrap_err();
    assert!(unschedulable(e).contains("at most 31 free ones share a value"));
    // Free one node's CPU and it fits there.
    s.deallocate("u9");
    let r = s
        .allocate(
            "big",
            &same_numa(DeviceRequest::count("cpus", 32)),
            &devices,
        )
        .unwrap();
    assert!(r.iter().all(|r| {
        let cpu: u32 = r.device.trim_start_matches("cpu").parse().unwrap();
        cpu / 64 == 9
    }));
}

/// A device of `kind` whose `resource.kubernetes.io/pcieRoot` is `roots`.
fn rooted(name: &str, kind: &str, roots: AttributeValue) -> Device {
    Device {
        name: name.into(),
        attributes: BTreeMap::from([
            ("kind".to_owned(), AttributeValue::String(kind.into())),
            (PCIE_ROOT.to_owned(), roots),
        ]),
        capacities: BTreeMap::new(),
        allow_multiple_allocations: false,
        taints: Vec::new(),
    }
}

const PCIE_ROOT: &str = "resource.kubernetes.io/pcieRoot";

fn list(roots: &[&str]) -> AttributeValue {
    AttributeValue::Strings(roots.iter().map(|r| (*r).to_owned()).collect())
}

fn root(r: &str) -> AttributeValue {
    AttributeValue::String(r.into())
}

/// One device of `kind` for each request, all under `matchAttribute: pcieRoot`.
fn same_root(kinds: &[&str]) -> ClaimSpec {
    ClaimSpec {
        requests: kinds
            .iter()
            .map(|kind| DeviceRequest {
                selectors: vec![Selector {
                    attribute: "kind".into(),
                    value: AttributeValue::String((*kind).into()),
                }],
                ..DeviceRequest::count(kind, 1)
            })
            .collect(),
        constraints: vec![Constraint {
            requests: vec![],
            match_attribute: PCIE_ROOT.into(),
        }],
    }
}

#[test]
fn match_attribute_on_lists_needs_a_value_common_to_all_devices() {
    let devices = [
        rooted("numa0", "cpus", list(&["pci0000:00", "pci0000:40"])),
        rooted("numa1", "cpus", list(&["pci0000:80", "pci0000:c0"])),
        rooted("nic", "nic", list(&["pci0000:40", "pci0000:80"])),
        rooted("gpu", "gpu", root("pci0000:80")),
        rooted("gpu-as-int", "gpu-as-int", AttributeValue::Int(80)),
    ];
    let mut s = off();
    // A scalar is a one-element set: the GPU's root is one of numa1's, not the whole list.
    let r = s
        .allocate("gpu-cpus", &same_root(&["gpu", "cpus"]), &devices)
        .unwrap();
    assert_eq!(devices_of(&r), ["gpu", "numa1"]);
    s.deallocate("gpu-cpus");
    // The NIC shares a root with each NUMA device; with the GPU too only pci0000:80 is left,
    // so numa0 (which shares pci0000:40 with the NIC, first) is given up for numa1.
    let r = s
        .allocate(
            "nic-cpus-gpu",
            &same_root(&["nic", "cpus", "gpu"]),
            &devices,
        )
        .unwrap();
    assert_eq!(devices_of(&r), ["nic", "numa1", "gpu"]);
    s.deallocate("nic-cpus-gpu");
    let r = s
        .allocate("nic-cpus", &same_root(&["nic", "cpus"]), &devices)
        .unwrap();
    assert_eq!(devices_of(&r), ["nic", "numa0"]);
    // Values of another type never match, whatever they say.
    s.allocate("int", &same_root(&["gpu-as-int", "nic"]), &devices)
        .unwrap_err();
}

#[test]
fn a_tainted_device_is_allocated_to_no_claim_until_the_taint_goes() {
    let mut devices = vec![grouped(0, 4), grouped(1, 4)];
    devices[0].taints.push(crate::model::DeviceTaint {
        key: format!("{DRIVER}/cpus-offline"),
        value: "3".into(),
        effect: TaintEffect::NoSchedule,
        time_added: None,
    });
    let mut s = on();
    let first = s
        .allocate("a", &one(DeviceRequest::count("cpus", 1)), &devices)
        .unwrap();
    assert_eq!(devices_of(&first), ["numa1"], "numa0 is tainted");
    // A taint that only informs keeps nothing away.
    devices[0].taints[0].effect = TaintEffect::None;
    let second = s
        .allocate("b", &one(DeviceRequest::count("cpus", 1)), &devices)
        .unwrap();
    assert_eq!(devices_of(&second), ["numa0"]);
    devices[1].taints = devices[0].taints.clone();
    devices[1].taints[0].effect = TaintEffect::NoExecute;
    devices[0].taints[0].effect = TaintEffect::NoSchedule;
    let err = s
        .allocate("c", &one(DeviceRequest::count("cpus", 1)), &devices)
        .unwrap_err();
    assert!(!unschedulable(err).is_empty());
}
