//! A claim's configuration for the topology-aware policy: `memoryPinning`, `fullCores` and
//! `memoryKinds` in the edits and in the containers using the claim, class/claim precedence, refusals of
//! malformed configurations that change nothing, and the choice kept across snapshot/restore
//! and re-prepares.

use std::collections::BTreeMap;

use policy::{
    AttributeValue, Claim, ClaimConfig, ConfigSource, Container, Pod, Policy, PolicyError,
    QosClass, Quantity, Resources, Topology, TopologyAware, TopologySource,
    model::AllocationResult,
    topology_aware::{Config, MemoryConfig, ReservedCpus},
};
use serde_json::{Value, json};

const GIB: u64 = 1 << 30;

mod common;
use common::{cpu_config, from_claim, machine, set};

/// A claim with one result per `(request, device, cpus)`.
fn claim(uid: &str, results: &[(&str, &str, u64)], config: Vec<ClaimConfig>) -> Claim {
    Claim {
        uid: uid.into(),
        namespace: "ml".into(),
        name: format!("claim-{uid}"),
        reserved_for: vec!["pod-x".into()],
        results: results
            .iter()
            .map(|(request, device, n)| AllocationResult {
                request: (*request).into(),
                pool: "node-a".into(),
                device: (*device).into(),
                share_id: Some("0".into()),
                consumed_capacity: BTreeMap::from([("cpu".into(), Quantity::from_units(*n))]),
            })
            .collect(),
        config,
        pod_claim_name: None,
    }
}

fn from_class(fields: Value) -> ClaimConfig {
    ClaimConfig {
        source: ConfigSource::Class,
        requests: vec![],
        parameters: cpu_config(fields),
    }
}

/// A Guaranteed container asking 1 GiB of memory, using results `indexes` of claims `uids`.
fn user(id: &str, uses: &[(&str, usize)]) -> Container {
    Container {
        id: id.into(),
        pod: Pod {
            uid: "pod-x".into(),
            namespace: "ml".into(),
            name: "trainer".into(),
            qos: QosClass::Guaranteed,
            annotations: BTreeMap::new(),
        },
        name: id.into(),
        resources: Resources {
            cpu_request_milli: 2000,
            cpu_limit_milli: Some(2000),
            memory_request_bytes: GIB,
            memory_limit_bytes: Some(GIB),
        },
        cdi_devices: uses
            .iter()
            .map(|(uid, i)| format!("topology-aware.resmgr.io/device=claim-{uid}-{i}"))
            .collect(),
        ..Container::default()
    }
}

#[test]
fn memory_pinning_off_leaves_dra_mems_out_and_the_container_unpinned() {
    let mut p = machine();
    let pinned = p
        .allocate_claim(&claim("u1", &[("cpus", "numa1", 2)], vec![]))
        .unwrap();
    assert_eq!(
        pinned.edits[0].env,
        ["DRA_CPUSET_u1=16-17", "DRA_MEMS_u1=1"]
    );
    let unpinned = p
        .allocate_claim(&claim(
            "u2",
            &[("cpus", "numa2", 2)],
            vec![from_claim(&[], json!({"memoryPinning": false}))],
        ))
        .unwrap();
    assert_eq!(unpinned.edits[0].env, ["DRA_CPUSET_u2=32-33"]);

    // A container of the pinned claim gets its node, and its memory is charged there.
    let a = p.allocate(&user("a", &[("u1", 0)])).unwrap().adjustment;
    assert_eq!(
        (a.cpus, a.mems.map(|m| m.to_string())),
        (Some(set("16-17")), Some("1".into()))
    );
    assert_eq!(p.memory_used(1), GIB);
    // One of the unpinned claim runs on its CPUs, memory left to the runtime, nothing charged.
    let b = p.allocate(&user("b", &[("u2", 0)])).unwrap().adjustment;
    assert_eq!((b.cpus, b.mems), (Some(set("32-33")), None));
    assert_eq!(p.memory_used(2), 0);
    // Using both: a pinned result cannot hold it to its node while the other leaves memory
    // free, so it is not pinned.
    let both = p
        .allocate(&user("c", &[("u1", 0), ("u2", 0)]))
        .unwrap()
        .adjustment;
    assert_eq!((both.cpus, both.mems), (Some(set("16-17,32-33")), None));
    // Sync places them the same way.
    let running = [
        user("a", &[("u1", 0)]),
        user("b", &[("u2", 0)]),
        user("c", &[("u1", 0), ("u2", 0)]),
    ];
    p.sync(&running).unwrap();
    let mems = |id: &str| p.placement(id).unwrap().mems.map(|m| m.to_string());
    assert_eq!(
        (mems("a"), mems("b"), mems("c")),
        (Some("1".into()), None, None)
    );
}

#[test]
fn full_cores_takes_whole_cores_when_it_can_and_otherwise_warns_instead_of_refusing() {
    let mut p = machine();
    // One CPU splits core 16-17.
    p.allocate_claim(&claim("u0", &[("cpus", "numa1", 1)], vec![]))
        .unwrap();
    assert_eq!(p.claim_cpus("u0"), Some(set("16")));
    let whole = || vec![from_claim(&[], json!({"fullCores": true}))];

    // By default an odd count takes the split core's free sibling.
    let mut q = p.clone();
    let split = q
        .allocate_claim(&claim("u1", &[("cpus", "numa1", 3)], vec![]))
        .unwrap();
    assert_eq!(split.edits[0].env[0], "DRA_CPUSET_u1=17-19");
    assert!(split.warnings.is_empty());

    // With fullCores the same count cannot be whole cores. The scheduler allocated it from a
    // per-CPU device without seeing the configuration, so refusing it would strand the pod:
    // it gets what it consumed, and a warning says why it is not whole cores.
    let mut q = p.clone();
    let a = q
        .allocate_claim(&claim("u1", &[("cpus", "numa1", 3)], whole()))
        .unwrap();
    assert_eq!(a.edits[0].env[0], "DRA_CPUSET_u1=17-19");
    assert_eq!(a.warnings.len(), 1, "{:?}", a.warnings);
    let w = &a.warnings[0];
    assert!(
        w.contains("fullCores") && w.contains("17-19") && w.contains("wholeCores"),
        "{w}"
    );

    // An even count skips the split core's sibling and takes a whole one, without a warning.
    let mut q = p.clone();
    let a = q
        .allocate_claim(&claim("u1", &[("cpus", "numa1", 2)], whole()))
        .unwrap();
    assert_eq!(a.edits[0].env, ["DRA_CPUSET_u1=18-19", "DRA_MEMS_u1=1"]);
    assert!(a.warnings.is_empty(), "{:?}", a.warnings);
    let used = q.allocate(&user("a", &[("u1", 0)])).unwrap().adjustment;
    assert_eq!(used.cpus, Some(set("18-19")));
    // Without it, one CPU would have come from the split core.
    let one = p
        .allocate_claim(&claim("u1", &[("cpus", "numa1", 1)], vec![]))
        .unwrap();
    assert_eq!(one.edits[0].env[0], "DRA_CPUSET_u1=17");
}

#[test]
fn the_claim_overrides_its_class_and_request_scoped_configs_apply_to_their_request() {
    let mut p = machine();
    // The class turns pinning off for everything; the claim turns it back on for `train`.
    let configs = vec![
        from_claim(&["train"], json!({"memoryPinning": true})),
        from_class(json!({"memoryPinning": false})),
    ];
    let a = p
        .allocate_claim(&claim(
            "u1",
            &[("train", "numa1", 2), ("io/fast", "numa2", 2)],
            configs,
        ))
        .unwrap();
    assert_eq!(a.edits[0].env, ["DRA_CPUSET_u1=16-17", "DRA_MEMS_u1=1"]);
    assert_eq!(a.edits[1].env, ["DRA_CPUSET_u1=32-33"]);
    // A later claim config for all requests overrides an earlier request-scoped one.
    let configs = vec![
        from_claim(&["io"], json!({"memoryPinning": false})),
        from_claim(&[], json!({"memoryPinning": true})),
    ];
    let b = p
        .allocate_claim(&claim("u2", &[("io/fast", "numa3", 1)], configs))
        .unwrap();
    assert_eq!(b.edits[0].env, ["DRA_CPUSET_u2=48", "DRA_MEMS_u2=3"]);
}

#[test]
fn a_config_that_does_not_decode_is_refused_naming_claim_request_and_field() {
    let cases: [(Value, &str, &str); 5] = [
        (
            json!({"apiVersion": "resmgr.io/v1", "kind": "CpuConfig"}),
            "apiVersion",
            "want \"resmgr.io/v1alpha1\", got \"resmgr.io/v1\"",
        ),
        (
            json!({"apiVersion": "resmgr.io/v1alpha1", "kind": "GpuConfig"}),
            "kind",
            "want \"CpuConfig\", got \"GpuConfig\"",
        ),
        (
            cpu_config(json!({"memoryPining": false})),
            "memoryPining",
            "unknown field `memoryPining`",
        ),
        (
            cpu_config(json!({"memoryPinning": "false"})),
            "memoryPinning",
            "invalid type: string \"false\", expected a boolean",
        ),
        (
            cpu_config(json!({"fullCores": 1})),
            "fullCores",
            "invalid type: integer `1`, expected a boolean",
        ),
    ];
    for (parameters, want_field, want_reason) in cases {
        let mut p = machine();
        p.allocate(&user("a", &[])).unwrap();
        let before = (p.shared_cpus(), p.snapshot(), p.container_ids());
        let bad = ClaimConfig {
            source: ConfigSource::Claim,
            requests: vec!["cpus".into()],
            parameters,
        };
        let err = p
            .allocate_claim(&claim("u1", &[("cpus", "numa1", 2)], vec![bad]))
            .unwrap_err();
        let PolicyError::ClaimConfig {
            claim,
            requests,
            field,
            reason,
        } = &err
        else {
            panic!("expected a config refusal, got {err:?}");
        };
        assert_eq!(claim, "ml/claim-u1 (u1)");
        assert_eq!(requests, "request cpus (from the claim)");
        assert_eq!(field, want_field);
        assert!(reason.starts_with(want_reason), "{reason}");
        assert!(err.to_string().contains(want_field), "{err}");
        assert!(p.claims().is_empty());
        assert_eq!(
            (p.shared_cpus(), p.snapshot(), p.container_ids()),
            before,
            "a refusal changes nothing"
        );
    }
}

#[test]
fn the_choice_survives_restore_and_re_prepares() {
    let mut p = machine();
    let unpinned = vec![from_claim(&[], json!({"memoryPinning": false}))];
    let first = p
        .allocate_claim(&claim("u1", &[("cpus", "numa1", 2)], unpinned))
        .unwrap();
    p.allocate_claim(&claim("u2", &[("cpus", "numa2", 2)], vec![]))
        .unwrap();
    let snap = p.snapshot();
    // Only the claim that differs from the default says so: older snapshots still read.
    let results = |uid: &str| {
        snap["claims"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["uid"] == uid)
            .unwrap()["results"][0]
            .clone()
    };
    assert_eq!(results("u1")["memory_pinning"], json!(false));
    assert!(results("u2").get("memory_pinning").is_none());

    let mut q = machine();
    q.restore(&snap).unwrap();
    assert_eq!(q.snapshot(), snap);
    // Re-prepared after the restart, even without its config (or with another one), the claim
    // gets what it got.
    let again = q
        .allocate_claim(&claim(
            "u1",
            &[("cpus", "numa1", 2)],
            vec![from_claim(&[], json!({"memoryPinning": true}))],
        ))
        .unwrap();
    assert_eq!(again.edits, first.edits);
    assert!(again.updates.is_empty());
    let a = q.allocate(&user("a", &[("u1", 0)])).unwrap().adjustment;
    assert_eq!((a.cpus, a.mems), (Some(set("16-17")), None));
    let b = q.allocate(&user("b", &[("u2", 0)])).unwrap().adjustment;
    assert_eq!(b.mems.map(|m| m.to_string()), Some("2".into()));
}

/// Two sockets, each a DRAM node of 4 GiB (0 and 2) with an HBM node of 1 GiB attached (1 and
/// 3), two two-thread cores a socket, CPU 0 reserved; half of each DRAM node for claims.
fn hbm_machine() -> TopologyAware {
    let topo = Topology::load(&TopologySource::Synthetic(
        "pack:2 [numa(memory=4GiB)] [numa(memory=1GiB)] core:2 pu:2".into(),
    ))
    .unwrap();
    let config = Config {
        reserved_cpus: ReservedCpus::Set("0".parse().unwrap()),
        memory: MemoryConfig {
            claim_percent: 50,
            ..MemoryConfig::default()
        },
        ..Config::default()
    };
    TopologyAware::new(topo, config).unwrap()
}

/// One result on `device` consuming `cpus` CPUs and `memory` of memory (`None`: none asked).
fn with_memory(uid: &str, device: &str, cpus: u64, memory: Option<&str>, kinds: Value) -> Claim {
    let mut c = claim(
        uid,
        &[("cpus", device, cpus)],
        vec![from_claim(&[], json!({"memoryKinds": kinds}))],
    );
    if let Some(m) = memory {
        c.results[0]
            .consumed_capacity
            .insert("memory".into(), m.parse().unwrap());
    }
    c
}

#[test]
fn memory_kinds_add_the_attached_memory_only_nodes() {
    let mut p = hbm_machine();
    // Each DRAM node's device says it has HBM attached, so a class can select it; a machine
    // without memory-only nodes says nothing of the kind.
    let attached: Vec<(String, bool)> = p
        .devices()
        .unwrap()
        .into_iter()
        .map(|d| {
            (
                d.name,
                d.attributes.get("hbmAttached") == Some(&AttributeValue::Bool(true)),
            )
        })
        .collect();
    assert_eq!(
        attached,
        [("numa0".to_owned(), true), ("numa2".to_owned(), true)]
    );
    assert!(
        machine()
            .devices()
            .unwrap()
            .iter()
            .all(|d| !d.attributes.keys().any(|k| k.ends_with("Attached")))
    );
    let hbm = p
        .allocate_claim(&with_memory(
            "u1",
            "numa0",
            2,
            Some("1Gi"),
            json!(["hbm", "dram"]),
        ))
        .unwrap();
    assert_eq!(
        hbm.edits[0].env,
        [
            "DRA_CPUSET_u1=2-3",
            "DRA_MEMS_u1=0-1",
            "DRA_MEMORY_u1=1073741824"
        ]
    );
    // HBM only, on the other socket: its own HBM node, not the DRAM node, not socket 0's HBM.
    let only = p
        .allocate_claim(&with_memory("u2", "numa2", 2, None, json!(["hbm"])))
        .unwrap();
    assert_eq!(only.edits[0].env, ["DRA_CPUSET_u2=4-5", "DRA_MEMS_u2=3"]);
    // Containers using them get those nodes; the claim's memory stays charged to its DRAM node.
    let a = p.allocate(&user("a", &[("u1", 0)])).unwrap().adjustment;
    assert_eq!(
        (a.cpus, a.mems.map(|m| m.to_string())),
        (Some(set("2-3")), Some("0-1".into()))
    );
    let b = p.allocate(&user("b", &[("u2", 0)])).unwrap().adjustment;
    assert_eq!(b.mems.map(|m| m.to_string()), Some("3".into()));
    // What a claim got is kept: a restart restores it, and so does taking it back from its spec.
    let mut q = hbm_machine();
    q.restore(&p.snapshot()).unwrap();
    assert_eq!(q.snapshot(), p.snapshot());
    let mut r = hbm_machine();
    r.adopt_claim("u1", &hbm.edits).unwrap();
    let again = r
        .allocate_claim(&with_memory(
            "u1",
            "numa0",
            2,
            Some("1Gi"),
            json!(["hbm", "dram"]),
        ))
        .unwrap();
    assert_eq!(again.edits, hbm.edits);
}

#[test]
fn a_memory_kind_the_node_lacks_refuses_the_claim_naming_what_it_holds() {
    let cases = [
        (
            with_memory("u1", "numa0", 2, Some("512Mi"), json!(["dram", "pmem"])),
            "invalid request for claim ml/claim-u1 (u1): result 0 (request cpus, cpus 2-3 and \
             512Mi of memory on NUMA node 0): its configuration's memoryKinds names pmem, but no pmem \
             memory is attached to NUMA node 0 (this machine has no pmem memory); select devices \
             with the attribute pmemAttached, or leave pmem out",
        ),
        (
            with_memory("u1", "numa2", 1, Some("512Mi"), json!(["hbm"])),
            "invalid request for claim ml/claim-u1 (u1): result 0 (request cpus, cpus 4 and \
             512Mi of memory on NUMA node 2): its configuration's memoryKinds leaves out dram, but \
             the 512Mi of memory it holds are NUMA node 2's dram: add dram, or ask for no memory",
        ),
    ];
    for (claim, want) in cases {
        let mut p = hbm_machine();
        p.allocate(&user("a", &[])).unwrap();
        let before = (p.shared_cpus(), p.snapshot(), p.container_ids());
        let err = p.allocate_claim(&claim).unwrap_err();
        assert!(matches!(err, PolicyError::Invalid { .. }), "{err:?}");
        assert_eq!(err.to_string(), want);
        assert!(p.claims().is_empty());
        assert_eq!(
            (p.shared_cpus(), p.snapshot(), p.container_ids()),
            before,
            "a refusal changes nothing"
        );
    }
}
