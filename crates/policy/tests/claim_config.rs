//! A claim's configuration for the topology-aware policy: `memoryPinning` and `fullCores` in
//! the edits and in the containers using the claim, class/claim precedence, refusals of
//! malformed configurations that change nothing, and the choice kept across snapshot/restore
//! and re-prepares.

use std::collections::BTreeMap;

use policy::{
    Claim, ClaimConfig, ConfigSource, Container, Pod, Policy, PolicyError, QosClass, Quantity,
    Resources, model::AllocationResult,
};
use serde_json::{Value, json};

const GIB: u64 = 1 << 30;

mod common;
use common::{machine, set};

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
    }
}

fn cpu_config(fields: Value) -> Value {
    let mut v = json!({"apiVersion": "resmgr.io/v1alpha1", "kind": "CpuConfig"});
    v.as_object_mut()
        .unwrap()
        .extend(fields.as_object().unwrap().clone());
    v
}

fn from_claim(requests: &[&str], fields: Value) -> ClaimConfig {
    ClaimConfig {
        source: ConfigSource::Claim,
        requests: requests.iter().map(|r| (*r).to_owned()).collect(),
        parameters: cpu_config(fields),
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
