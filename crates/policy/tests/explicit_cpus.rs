//! A cpuset chosen outside Kubernetes (`cpus` and `memoryNodes` in a claim's configuration):
//! granted exactly when the CPUs lie in the devices the scheduler allocated and are free,
//! refused naming the CPUs and why otherwise (and then nothing is held), in both device models;
//! the device metadata says what was granted.

use std::collections::BTreeMap;

use policy::{
    AttributeValue, Claim, ClaimConfig, ConfigSource, Policy, PolicyError, Quantity, Topology,
    TopologyAware, TopologySource,
    model::AllocationResult,
    topology_aware::{Config, DeviceMode, DeviceModel, ReservedCpus},
};
use serde_json::{Value, json};

mod common;
use common::{cpu_config, from_claim, machine};

/// A claim with one result per `(request, device, cpus consumed)`; 0 consumes nothing (an
/// individual device).
fn claim(uid: &str, results: &[(&str, &str, u64)], config: Vec<ClaimConfig>) -> Claim {
    Claim {
        uid: uid.into(),
        namespace: "hpc".into(),
        name: format!("job-{uid}"),
        reserved_for: vec!["pod-x".into()],
        results: results
            .iter()
            .map(|(request, device, n)| AllocationResult {
                request: (*request).into(),
                pool: "node-a".into(),
                device: (*device).into(),
                share_id: (*n > 0).then(|| "0".into()),
                consumed_capacity: if *n > 0 {
                    BTreeMap::from([("cpu".into(), Quantity::from_units(*n))])
                } else {
                    BTreeMap::new()
                },
            })
            .collect(),
        config,
        ..Claim::default()
    }
}

fn cpus_of(fields: Value) -> Vec<ClaimConfig> {
    vec![from_claim(&["cpus"], fields)]
}

/// The refusal's text, after checking that the claim holds nothing.
fn refused(p: &mut TopologyAware, c: &Claim) -> String {
    let err = p.allocate_claim(c).unwrap_err();
    assert!(
        !p.claims().contains(&c.uid),
        "a refused claim is held: {err}"
    );
    err.to_string()
}

/// Checks that a claim `uid` of `results`, configured with `fields`, is refused, holding
/// nothing, with a text that says each of `says`.
fn refused_saying(
    p: &mut TopologyAware,
    uid: &str,
    results: &[(&str, &str, u64)],
    fields: Value,
    says: &[&str],
) {
    let text = refused(p, &claim(uid, results, cpus_of(fields)));
    for said in says {
        assert!(
            text.contains(said),
            "the refusal does not say {said:?}: {text}"
        );
    }
}

#[test]
fn grouped_devices_grant_exactly_the_named_cpus_and_say_so_in_the_metadata() {
    let mut p = machine();
    // Not what the picker would choose (it packs from the lowest free core): 2-3.
    let got = p
        .allocate_claim(&claim(
            "u1",
            &[("cpus", "numa0", 3)],
            cpus_of(json!({"cpus": "9,12-13"})),
        ))
        .unwrap();
    assert_eq!(got.edits[0].env, ["DRA_CPUSET_u1=9,12-13", "DRA_MEMS_u1=0"]);
    assert_eq!(
        got.attributes[0].get("grantedCpus"),
        Some(&AttributeValue::String("9,12-13".into()))
    );
    assert_eq!(
        got.attributes[0].get("grantedCpuIDs"),
        Some(&AttributeValue::Ints(vec![9, 12, 13]))
    );
    assert_eq!(
        got.attributes[0].get("resource.kubernetes.io/numaNode"),
        Some(&AttributeValue::Int(0))
    );
    // Prepared again, it answers the same.
    let again = p
        .allocate_claim(&claim(
            "u1",
            &[("cpus", "numa0", 3)],
            cpus_of(json!({"cpus": "9,12-13"})),
        ))
        .unwrap();
    assert_eq!(again.edits, got.edits);
    assert_eq!(again.attributes, got.attributes);
    // A claim without configuration next to it gets other CPUs than those.
    let other = p
        .allocate_claim(&claim("u2", &[("cpus", "numa0", 4)], vec![]))
        .unwrap();
    assert!(
        !other.edits[0].env[0].contains("9") && !other.edits[0].env[0].contains("12"),
        "{:?}",
        other.edits[0].env
    );
}

#[test]
fn cpus_outside_the_allocated_devices_are_refused_naming_each_and_why() {
    let mut p = machine();
    refused_saying(
        &mut p,
        "u1",
        &[("cpus", "numa0", 4)],
        json!({"cpus": "0-1,2-3"}),
        &[
            "the scheduler allocated 4 cpus of device numa0",
            "names 2 of them (2-3)",
            "cpus 0-1 are reserved for system pods",
        ],
    );
    refused_saying(
        &mut p,
        "u1",
        &[("cpus", "numa0", 2)],
        json!({"cpus": "2,16"}),
        &[
            "names 1 of them (2)",
            "cpu 16 is on device numa1, which the scheduler did not allocate to the request",
        ],
    );
    refused_saying(
        &mut p,
        "u1",
        &[("cpus", "numa0", 2)],
        json!({"cpus": "2-3,200"}),
        &["cpu 200 is not online on this node"],
    );
}

#[test]
fn more_or_fewer_cpus_than_the_scheduler_allocated_are_refused() {
    let mut p = machine();
    refused_saying(
        &mut p,
        "u1",
        &[("cpus", "numa0", 2)],
        json!({"cpus": "2-4"}),
        &["request cpus: its configuration names cpus 4 beyond the cpus the scheduler allocated"],
    );
    refused_saying(
        &mut p,
        "u1",
        &[("cpus", "numa0", 3)],
        json!({"cpus": "2-3"}),
        &["the scheduler allocated 3 cpus of device numa0"],
    );
}

#[test]
fn cpus_another_claim_holds_are_refused_naming_it() {
    let mut p = machine();
    p.allocate_claim(&claim(
        "u1",
        &[("cpus", "numa0", 2)],
        cpus_of(json!({"cpus": "4-5"})),
    ))
    .unwrap();
    let err = p
        .allocate_claim(&claim(
            "u2",
            &[("cpus", "numa0", 2)],
            cpus_of(json!({"cpus": "5-6"})),
        ))
        .unwrap_err();
    assert!(matches!(err, PolicyError::DoesNotFit { .. }), "{err:?}");
    let text = err.to_string();
    assert!(
        text.contains("names cpus 5 of device numa0, which are held by claim hpc/job-u1 (u1)"),
        "{text}"
    );
    assert_eq!(p.claims(), ["u1"]);
}

#[test]
fn a_class_may_not_name_cpus_and_a_configuration_names_one_requests() {
    let mut p = machine();
    let class = ClaimConfig {
        source: ConfigSource::Class,
        requests: vec![],
        parameters: cpu_config(json!({"cpus": "2-3"})),
    };
    let text = refused(&mut p, &claim("u1", &[("cpus", "numa0", 2)], vec![class]));
    assert!(
        text.contains("cpus: a device class cannot name them"),
        "{text}"
    );
    let text = refused(
        &mut p,
        &claim(
            "u1",
            &[("a", "numa0", 2), ("b", "numa1", 2)],
            vec![from_claim(&[], json!({"cpus": "2-3"}))],
        ),
    );
    assert!(
        text.contains("this configuration applies to requests a, b"),
        "{text}"
    );
    for bad in ["", "two", "3-1"] {
        let text = refused(
            &mut p,
            &claim("u1", &[("cpus", "numa0", 2)], cpus_of(json!({"cpus": bad}))),
        );
        assert!(
            text.contains("configuration for request cpus (from the claim): cpus:"),
            "{text}"
        );
    }
}

#[test]
fn a_request_over_two_grouped_devices_gets_the_named_cpus_of_each() {
    let mut p = machine();
    let got = p
        .allocate_claim(&claim(
            "u1",
            &[("cpus", "numa0", 2), ("cpus", "numa1", 2)],
            cpus_of(json!({"cpus": "6-7,20-21"})),
        ))
        .unwrap();
    // Each result's edits carry the request's CPUs; its metadata its own.
    assert_eq!(got.edits[0].env[0], "DRA_CPUSET_u1=6-7,20-21");
    assert_eq!(
        got.attributes[0].get("grantedCpus"),
        Some(&AttributeValue::String("6-7".into()))
    );
    assert_eq!(
        got.attributes[1].get("grantedCpus"),
        Some(&AttributeValue::String("20-21".into()))
    );
}

fn individual() -> TopologyAware {
    let topo = Topology::load(&TopologySource::Synthetic(
        "pack:2 numa:2 core:8 pu:2".into(),
    ))
    .unwrap();
    TopologyAware::new(
        topo,
        Config {
            reserved_cpus: ReservedCpus::Set("0-1".parse().unwrap()),
            devices: DeviceModel {
                mode: DeviceMode::Individual,
                ..DeviceModel::default()
            },
            ..Config::default()
        },
    )
    .unwrap()
}

#[test]
fn individual_devices_take_the_named_cpus_only_when_they_are_the_devices() {
    let mut p = individual();
    let got = p
        .allocate_claim(&claim(
            "u1",
            &[("cpus", "cpu4", 0), ("cpus", "cpu5", 0)],
            cpus_of(json!({"cpus": "4-5"})),
        ))
        .unwrap();
    assert_eq!(got.edits[0].env[0], "DRA_CPUSET_u1=4-5");
    refused_saying(
        &mut p,
        "u2",
        &[("cpus", "cpu6", 0), ("cpus", "cpu7", 0)],
        json!({"cpus": "6,8"}),
        &[
            "the scheduler allocated 1 cpu of device cpu7 (cpus 7), and its configuration names none of them",
            "cpu 8 is on device cpu8, which the scheduler did not allocate to the request",
        ],
    );
}

#[test]
fn memory_nodes_are_pinned_exactly_when_they_are_the_claims() {
    let mut p = machine();
    let got = p
        .allocate_claim(&claim(
            "u1",
            &[("cpus", "numa1", 2)],
            cpus_of(json!({"memoryNodes": "1"})),
        ))
        .unwrap();
    assert_eq!(got.edits[0].env[1], "DRA_MEMS_u1=1");
    refused_saying(
        &mut p,
        "u2",
        &[("cpus", "numa1", 2)],
        json!({"memoryNodes": "0-1"}),
        &[
            "names memory nodes 0-1, but node 0 is neither the NUMA node of its cpus or memory (node 1)",
        ],
    );
    let text = refused(
        &mut p,
        &claim(
            "u2",
            &[("cpus", "numa1", 2)],
            cpus_of(json!({"memoryNodes": "1", "memoryPinning": false})),
        ),
    );
    assert!(text.contains("memoryPinning is false"), "{text}");
}
