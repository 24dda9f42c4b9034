//! The topology-aware policy through its life: restore, sync, update, claims, failures that
//! change nothing, snapshot round trips.

use std::collections::BTreeMap;

use policy::{
    Claim, Container, Fallback, Pod, Policy, PolicyError, QosClass, Quantity, Resources,
    TopologyAware,
    model::AllocationResult,
    topology_aware::{ClaimCpus, Exclusivity},
};

mod common;
use common::{machine, machine_with, set};

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
        annotations: BTreeMap::new(),
        cdi_devices: vec![],
        env: vec![],
        cpus: None,
        mems: None,
    }
}

fn claim(uid: &str, results: &[(&str, u64)]) -> Claim {
    Claim {
        uid: uid.into(),
        namespace: "ml".into(),
        name: "trainer-cpus".into(),
        reserved_for: vec!["pod-x".into()],
        results: results
            .iter()
            .map(|(device, n)| AllocationResult {
                request: "cpus".into(),
                pool: "node-a".into(),
                device: (*device).into(),
                share_id: Some("0".into()),
                consumed_capacity: BTreeMap::from([("cpu".into(), Quantity::from_units(*n))]),
            })
            .collect(),
        config: Vec::new(),
        pod_claim_name: None,
    }
}

/// Every container's cpuset and memory nodes, for "nothing changed" comparisons.
fn placements(p: &TopologyAware) -> Vec<(String, String, String)> {
    p.container_ids()
        .into_iter()
        .map(|id| {
            let pl = p.placement(&id).unwrap();
            let mems = pl.mems.map(|m| m.to_string()).unwrap_or_default();
            (id, pl.cpus.to_string(), mems)
        })
        .collect()
}

#[test]
fn claim_edits_put_cpus_and_memory_nodes_in_the_environment() {
    let mut p = machine();
    let a = p
        .allocate_claim(&claim("u1", &[("numa1", 4), ("numa2", 2)]))
        .unwrap();
    assert_eq!(a.edits.len(), 2, "one edit per result");
    // Both results are of request `cpus`: a container using it gets both devices, and each
    // says the whole of it.
    assert_eq!(
        a.edits[0].env,
        ["DRA_CPUSET_u1=16-19,32-33", "DRA_MEMS_u1=1-2"]
    );
    assert_eq!(a.edits[1].env, a.edits[0].env);
    assert_eq!(p.claims(), ["u1"]);
    assert_eq!(p.claim_cpus("u1"), Some(set("16-19,32-33")));
    // Without a consumed capacity (the API server dropped it), the scheduler handed the
    // device out whole: the claim gets all of it.
    let mut whole = claim("u2", &[("numa3", 1)]);
    whole.results[0].consumed_capacity.clear();
    let a = p.allocate_claim(&whole).unwrap();
    assert_eq!(a.edits[0].env[0], "DRA_CPUSET_u2=48-63");
    // A device others hold CPUs of cannot have been handed out whole: the error says which
    // setting fits a cluster that drops consumable capacity.
    let mut late = claim("u3", &[("numa1", 1)]);
    late.results[0].consumed_capacity.clear();
    let err = p.allocate_claim(&late).unwrap_err().to_string();
    assert!(
        err.contains("DRAConsumableCapacity")
            && err.contains("device-mode individual")
            && err.contains("16-19 of it are held by claim ml/trainer-cpus (u1)"),
        "{err}"
    );
}

#[test]
fn a_claim_that_does_not_fit_changes_nothing() {
    let mut p = machine();
    p.allocate(&container("b1", QosClass::Burstable, 1000))
        .unwrap();
    let before = (placements(&p), p.shared_cpus(), p.snapshot());
    // The first result fits, the second does not: neither is taken.
    let err = p
        .allocate_claim(&claim("u1", &[("numa1", 4), ("numa2", 17)]))
        .unwrap_err();
    assert!(
        matches!(&err, PolicyError::DoesNotFit { reason, .. } if reason.contains("result 1") && reason.contains("numa2")),
        "{err}"
    );
    assert!(p.claims().is_empty());
    assert_eq!((placements(&p), p.shared_cpus(), p.snapshot()), before);
}

#[test]
fn releasing_an_unknown_claim_or_container_is_success() {
    let mut p = machine();
    assert_eq!(p.release_claim("nope").unwrap(), []);
    assert_eq!(p.release("nope").unwrap(), []);
}

#[test]
fn snapshot_restores_claims_on_the_same_cpus() {
    let mut p = machine();
    p.allocate_claim(&claim("u1", &[("numa1", 4)])).unwrap();
    p.allocate_claim(&claim("u2", &[("numa3", 3)])).unwrap();
    let snap = p.snapshot();

    let mut q = machine();
    q.restore(&snap).unwrap();
    assert_eq!(q.claims(), ["u1", "u2"]);
    assert_eq!(q.claim_cpus("u1"), Some(set("16-19")));
    assert_eq!(q.claim_cpus("u2"), Some(set("48-50")));
    assert_eq!(q.snapshot(), snap);
    // Restored CPUs are out of the shared pool, and idempotency holds across the restart.
    assert!(!q.shared_cpus().intersects(&set("16-19,48-50")));
    let again = q.allocate_claim(&claim("u1", &[("numa1", 4)])).unwrap();
    assert_eq!(again.edits[0].env[0], "DRA_CPUSET_u1=16-19");
    assert!(again.updates.is_empty());
}

#[test]
fn restore_refuses_what_cannot_be_put_back() {
    let mut p = machine();
    p.allocate_claim(&claim("u1", &[("numa0", 2)])).unwrap();
    let good = p.snapshot();
    let cases = [
        (
            serde_json::json!({"version": 3, "claims": []}),
            "snapshot version 3 is newer than this build reads (1 to 2): it was written by a newer release",
        ),
        (
            serde_json::json!({"version": 0, "claims": []}),
            "not a topology-aware snapshot: version 0",
        ),
        (
            serde_json::json!({"claims": 3}),
            "not a topology-aware snapshot",
        ),
        // A field this build does not know is refused by name and place, never dropped: the
        // release that wrote it may rely on it (see claims::Snapshot).
        (
            serde_json::from_str(
                &good
                    .to_string()
                    .replace(r#""request":"#, r#""memory_tier":"hbm","request":"#),
            )
            .unwrap(),
            "the snapshot has a field this build does not know, written by a newer release at \
             claims[0].results[0].memory_tier",
        ),
        (
            serde_json::from_str(
                &good
                    .to_string()
                    .replace(r#""claims":["#, r#""generation":7,"claims":["#),
            )
            .unwrap(),
            "the snapshot has a field this build does not know, written by a newer release at \
             generation",
        ),
        (
            serde_json::from_str(&good.to_string().replace("2-3", "0-1")).unwrap(),
            "result 0 (device numa0): cpus 0-1: 0-1 are reserved or kernel-isolated here",
        ),
        (
            serde_json::from_str(&good.to_string().replace("2-3", "126-129")).unwrap(),
            "cpus 126-129: 126-129 are not online here (online 0-63)",
        ),
    ];
    for (snap, want) in cases {
        let mut q = machine();
        let err = q.restore(&snap).unwrap_err();
        assert!(
            matches!(&err, PolicyError::Restore { reason, .. } if reason.contains(want)),
            "{want}: {err}"
        );
        assert!(q.claims().is_empty());
    }
    // The decoder's error is the cause, in `source()` and not in the message.
    let err = machine()
        .restore(&serde_json::json!({"claims": 3}))
        .unwrap_err();
    let cause = std::error::Error::source(&err)
        .expect("the decoder's error")
        .to_string();
    assert!(cause.contains("invalid type"), "{cause}");
    assert!(!err.to_string().contains(&cause), "{err}");
    // Two claims on the same CPUs cannot both be restored.
    let doubled = good.to_string().replace(
        r#""claims":["#,
        &format!(
            r#""claims":[{},"#,
            good["claims"][0].to_string().replace("\"u1\"", "\"u9\"")
        ),
    );
    let err = machine()
        .restore(&serde_json::from_str(&doubled).unwrap())
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("2-3 are already held by another claim"),
        "{err}"
    );
    // Device names do not matter: a claim restores on its CPUs whatever is published now
    // (here a device of another model).
    let renamed: serde_json::Value =
        serde_json::from_str(&good.to_string().replace("numa0", "cpu2")).unwrap();
    let mut q = machine();
    q.restore(&renamed).unwrap();
    assert_eq!(q.claim_cpus("u1"), Some(set("2-3")));
}

#[test]
fn sync_rebuilds_placement_keeping_claims_and_running_exclusive_cpus() {
    // Claims get 16-19, Guaranteed containers exclusive CPUs from the rest.
    let partition = || machine_with(Exclusivity::Partition(ClaimCpus::Set(set("16-19"))));
    let mut p = partition();
    p.allocate_claim(&claim("u1", &[("numa1", 4)])).unwrap();
    let snap = p.snapshot();

    let mut q = partition();
    q.restore(&snap).unwrap();
    // g1 already runs on 20-21 (free): it stays there, and is reported unchanged.
    let mut g1 = container("g1", QosClass::Guaranteed, 2000);
    g1.cpus = Some(set("20-21"));
    g1.mems = Some(set("1"));
    // g2 runs on CPUs the claim holds: it moves.
    let mut g2 = container("g2", QosClass::Guaranteed, 2000);
    g2.cpus = Some(set("16-17"));
    let b1 = container("b1", QosClass::Burstable, 500);
    let mut x = container("x", QosClass::BestEffort, 0);
    x.pod.uid = "pod-x".into();
    x.cdi_devices = vec!["topology-aware.resmgr.io/device=claim-u1-0".into()];
    let updates = q.sync(&[b1, g1, g2, x]).unwrap();
    let got: Vec<String> = updates
        .iter()
        .map(|u| {
            format!(
                "{}={} mems={}",
                u.container_id,
                u.cpus.as_ref().unwrap(),
                u.mems.as_ref().map(ToString::to_string).unwrap_or_default()
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            // The deepest pool with the most room.
            "b1=32-47 mems=2",
            // Packed next to g1, in the NUMA node with the fewest free CPUs.
            "g2=22-23 mems=1",
            "x=16-19 mems=1",
        ]
    );
    assert_eq!(q.placement("g1").unwrap().cpus, set("20-21"));
    assert_eq!(q.claims(), ["u1"]);
    // A second sync with what the runtime now has changes nothing.
    let now: Vec<Container> = ["b1", "g1", "g2", "x"]
        .iter()
        .map(|id| {
            let pl = q.placement(id).unwrap();
            let mut c = container(id, QosClass::Burstable, 0);
            c.resources = match *id {
                "b1" => Resources {
                    cpu_request_milli: 500,
                    ..Resources::default()
                },
                "g1" | "g2" => Resources {
                    cpu_request_milli: 2000,
                    cpu_limit_milli: Some(2000),
                    ..Resources::default()
                },
                _ => Resources::default(),
            };
            c.pod.qos = match *id {
                "g1" | "g2" => QosClass::Guaranteed,
                "x" => QosClass::BestEffort,
                _ => QosClass::Burstable,
            };
            if *id == "x" {
                c.pod.uid = "pod-x".into();
                c.cdi_devices = vec!["topology-aware.resmgr.io/device=claim-u1-0".into()];
            }
            c.cpus = Some(pl.cpus);
            c.mems = pl.mems;
            c
        })
        .collect();
    assert_eq!(q.sync(&now).unwrap(), []);
}

/// The containers of a node where claim u1 holds 16-19 (a partition of 16-19 for claims):
/// a Burstable one running in NUMA node 3's shared CPUs, a Guaranteed one on every CPU (no
/// cpuset: created while no agent was there), the claim's container on every CPU, one whose
/// annotation the policy cannot read, and a Guaranteed one sharing b1's CPUs (it ran shared).
fn running_beside_a_claim() -> (TopologyAware, Vec<Container>) {
    let mut p = machine_with(Exclusivity::Partition(ClaimCpus::Set(set("16-19"))));
    p.allocate_claim(&claim("u1", &[("numa1", 4)])).unwrap();
    let mut b1 = container("b1", QosClass::Burstable, 500);
    b1.cpus = Some(set("48-63"));
    b1.mems = Some(set("3"));
    let g1 = container("g1", QosClass::Guaranteed, 2000);
    let mut x = container("x", QosClass::BestEffort, 0);
    x.pod.uid = "pod-x".into();
    x.cdi_devices = vec!["topology-aware.resmgr.io/device=claim-u1-0".into()];
    let mut odd = container("odd", QosClass::Burstable, 250);
    odd.annotations.insert(
        "prefer-shared-cpus.resource-policy.resmgr.io/container.odd".into(),
        "maybe".into(),
    );
    let mut g2 = container("g2", QosClass::Guaranteed, 1000);
    g2.cpus = Some(set("48-63"));
    (p, vec![b1, g1, x, odd, g2])
}

#[test]
fn a_running_container_the_sync_did_not_list_is_adopted_as_the_sync_would_place_it() {
    let (_, all) = running_beside_a_claim();
    for (i, late) in all.iter().enumerate() {
        // The sync listed everyone...
        let (mut listed, _) = running_beside_a_claim();
        let synced = listed.sync(&all).unwrap();
        // ...or everyone but `late`, which the policy hears of afterwards. (The others may be
        // placed otherwise without it: g2 shares CPUs with b1 only if b1 is listed.)
        let (mut unlisted, _) = running_beside_a_claim();
        let mut others = all.clone();
        others.remove(i);
        unlisted.sync(&others).unwrap();
        let adopted = unlisted.adopt_container(late).unwrap();

        let id = late.id.as_str();
        assert_eq!(
            unlisted.placement(id),
            listed.placement(id),
            "{id}: placed as the sync places it"
        );
        let own = |updates: &[policy::ContainerUpdate]| {
            updates.iter().find(|u| u.container_id == id).cloned()
        };
        assert_eq!(own(&adopted), own(&synced), "{id}: the same update");
        if let Some(last) = adopted.last() {
            assert_eq!(last.container_id, id, "its own update comes last");
        }
        let inventory = |p: &TopologyAware| {
            p.inventory()
                .containers
                .into_iter()
                .find(|c| c.id == id)
                .map(|c| c.fallbacks)
        };
        assert_eq!(inventory(&unlisted), inventory(&listed), "{id}: fallbacks");
    }
    // Where they land: x on its claim; g1 on CPUs of its own, off the claim's; g2 shared (it
    // shares its CPUs with b1); odd, whose annotation is malformed, shared with the defaults.
    let (mut p, _) = running_beside_a_claim();
    p.sync(&all[..1]).unwrap();
    for c in &all[1..] {
        p.adopt_container(c).unwrap();
    }
    assert_eq!(p.placement("x").unwrap().cpus, set("16-19"));
    let g1 = p.placement("g1").unwrap().cpus;
    assert!(g1.len() == 2 && !g1.intersects(&set("0-1,16-19")), "{g1}");
    assert!(!p.placement("odd").unwrap().cpus.intersects(&set("16-19")));
    assert!(!p.placement("g2").unwrap().cpus.intersects(&set("16-19")));
    assert!(!p.shared_cpus().intersects(&g1));
}

#[test]
fn adopting_an_exclusive_container_moves_the_shared_ones_and_a_held_one_changes_nothing() {
    let mut p = machine_with(Exclusivity::Pods);
    let mut b1 = container("b1", QosClass::Burstable, 500);
    b1.cpus = Some(set("2-63"));
    p.sync(std::slice::from_ref(&b1)).unwrap();
    let g1 = container("g1", QosClass::Guaranteed, 2000);
    let updates = p.adopt_container(&g1).unwrap();
    let ids: Vec<&str> = updates.iter().map(|u| u.container_id.as_str()).collect();
    assert_eq!(ids, ["b1", "g1"], "the ripple, then its own: {updates:?}");
    let own = updates.last().unwrap().cpus.clone().unwrap();
    assert!(!updates[0].cpus.as_ref().unwrap().intersects(&own));
    assert_eq!(p.placement("g1").unwrap().cpus, own);
    let before = placements(&p);
    assert_eq!(p.adopt_container(&g1).unwrap(), []);
    assert_eq!(placements(&p), before);
}

#[test]
fn update_moves_a_container_and_one_that_does_not_fit_runs_shared() {
    let mut p = machine_with(Exclusivity::Pods);
    p.allocate(&container("b1", QosClass::Burstable, 500))
        .unwrap();
    p.allocate(&container("g1", QosClass::Guaranteed, 1000))
        .unwrap();
    assert_eq!(p.placement("g1").unwrap().cpus, set("2"));
    let bigger = Resources {
        cpu_request_milli: 4000,
        cpu_limit_milli: Some(4000),
        ..Resources::default()
    };
    let updates = p.update("g1", &bigger).unwrap();
    let last = updates.last().unwrap();
    assert_eq!(
        last.container_id, "g1",
        "the container's own update comes last"
    );
    assert_eq!(last.cpus, Some(set("2-5")));

    // The kubelet resized it already: more than can be had exclusively runs shared.
    let huge = Resources {
        cpu_request_milli: 100_000,
        cpu_limit_milli: Some(100_000),
        ..Resources::default()
    };
    let updates = p.update("g1", &huge).unwrap();
    assert_eq!(updates.last().unwrap().cpus, Some(p.shared_cpus()));
    let placed = p.inventory().containers;
    let g1 = placed.iter().find(|c| c.id == "g1").unwrap();
    assert_eq!(g1.fallbacks, [Fallback::NotExclusive]);
    assert!(matches!(
        p.update("nope", &huge),
        Err(PolicyError::UnknownContainer(id)) if id == "nope"
    ));
}

#[test]
fn allocating_a_known_container_again_changes_nothing() {
    let mut p = machine();
    let first = p
        .allocate(&container("g1", QosClass::Guaranteed, 2000))
        .unwrap();
    let again = p
        .allocate(&container("g1", QosClass::Guaranteed, 2000))
        .unwrap();
    assert_eq!(first.adjustment, again.adjustment);
    assert!(again.updates.is_empty());
}

#[test]
fn a_malformed_annotation_is_refused_naming_it() {
    let mut p = machine();
    let mut c = container("g1", QosClass::Guaranteed, 2000);
    c.annotations.insert(
        "prefer-shared-cpus.resource-policy.resmgr.io/container.g1".into(),
        "maybe".into(),
    );
    let err = p.allocate(&c).unwrap_err();
    assert!(
        matches!(&err, PolicyError::Invalid { subject, reason }
            if subject == "container default/pod-g1/g1" && reason.contains("\"maybe\"")),
        "{err}"
    );
    assert!(p.container_ids().is_empty());
}

#[test]
fn sync_keeps_running_shared_containers_in_the_pool_they_run_in() {
    // b1 runs on NUMA node 3's shared CPUs, where a new container would not go (below). An
    // agent restart must not move it.
    let mut p = machine();
    let mut b1 = container("b1", QosClass::Burstable, 500);
    b1.cpus = Some(set("48-63"));
    b1.mems = Some(set("3"));
    let updates = p.sync(std::slice::from_ref(&b1)).unwrap();
    assert!(updates.is_empty(), "{updates:?}");
    assert_eq!(p.placement("b1").unwrap().cpus, set("48-63"));

    // A new container goes elsewhere: where a container runs only speaks for running ones.
    let mut fresh = machine();
    let placed = fresh
        .allocate(&container("b1", QosClass::Burstable, 500))
        .unwrap();
    assert_eq!(placed.adjustment.cpus, Some(set("16-31")));
}

#[test]
fn an_update_keeps_a_shared_container_in_its_pool() {
    let mut p = machine();
    let mut b1 = container("b1", QosClass::Burstable, 500);
    b1.cpus = Some(set("48-63"));
    p.sync(std::slice::from_ref(&b1)).unwrap();
    let more = Resources {
        cpu_request_milli: 2000,
        ..Resources::default()
    };
    let updates = p.update("b1", &more).unwrap();
    let cpus: Vec<(&str, String)> = updates
        .iter()
        .map(|u| {
            (
                u.container_id.as_str(),
                u.cpus.as_ref().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(
        cpus,
        [("b1", "48-63".to_owned())],
        "only its own update, in place"
    );
    assert_eq!(p.placement("b1").unwrap().cpus, set("48-63"));
}

#[test]
fn another_drivers_device_named_like_our_claim_does_not_pin_a_container_to_it() {
    let mut p = machine();
    p.allocate_claim(&claim("u1", &[("numa1", 4)])).unwrap();
    // The same device name under another vendor, or under our vendor in another class, is not
    // our claim's device: a pod of another driver must not land on the claim's CPUs.
    for foreign in [
        "gpu.example.com/device=claim-u1-0",
        "topology-aware.resmgr.io/gpu=claim-u1-0",
    ] {
        let mut c = container(&format!("c-{}", foreign.len()), QosClass::Burstable, 500);
        c.cdi_devices = vec![foreign.into()];
        let placed = p.allocate(&c).unwrap().adjustment.cpus.unwrap();
        assert!(
            !placed.intersects(&set("16-19")),
            "{foreign}: placed on {placed}, the claim holds 16-19"
        );
    }
    // Ours is.
    let mut ours = container("ours", QosClass::Burstable, 500);
    ours.cdi_devices = vec!["topology-aware.resmgr.io/device=claim-u1-0".into()];
    assert_eq!(
        p.allocate(&ours).unwrap().adjustment.cpus,
        Some(set("16-19"))
    );
}

#[test]
fn a_held_claim_with_other_results_is_refused_naming_the_difference_and_kept() {
    let mut p = machine();
    p.allocate_claim(&claim("u1", &[("numa1", 4)])).unwrap();
    let before = p.snapshot();
    let refused = |p: &mut TopologyAware, c: Claim| match p.allocate_claim(&c) {
        Err(PolicyError::Invalid { subject, reason }) => format!("{subject}: {reason}"),
        other => panic!("{other:?}"),
    };
    let two = refused(&mut p, claim("u1", &[("numa1", 4), ("numa2", 1)]));
    assert!(
        two.starts_with("claim ml/trainer-cpus (u1): it is prepared with other allocation results: it holds 1 allocation results, now asked for 2;"),
        "{two}"
    );
    let more = refused(&mut p, claim("u1", &[("numa1", 5)]));
    assert!(
        more.contains(
            "result 0 (request cpus) is on numa1 with 4 cpus, now asked on numa1 with 5 cpus"
        ),
        "{more}"
    );
    let mut renamed = claim("u1", &[("numa1", 4)]);
    renamed.results[0].request = "other".into();
    let renamed = refused(&mut p, renamed);
    assert!(
        renamed.contains("result 0 is for request cpus, now asked for request other"),
        "{renamed}"
    );
    assert_eq!(p.snapshot(), before, "the claim keeps what it holds");
    // The same results are still idempotent, and a new pod sharing it is taken note of.
    let mut shared = claim("u1", &[("numa1", 4)]);
    shared.reserved_for.push("pod-y".into());
    assert_eq!(
        p.allocate_claim(&shared).unwrap().edits[0].env[0],
        "DRA_CPUSET_u1=16-19"
    );
}

/// A state file of the version before device models: grouped `numa<N>` devices, no
/// `memory_pinning` field. It restores on its CPUs whatever model is configured now, and the
/// claim's re-prepare with the same allocation is answered as before.
#[test]
fn claims_saved_before_device_models_restore_under_every_model() {
    use policy::topology_aware::{Config, DeviceMode, DeviceModel, Granularity, ReservedCpus};
    let saved = serde_json::json!({
        "version": 1,
        "claims": [{
            "uid": "u1",
            "namespace": "ml",
            "name": "trainer-cpus",
            "reserved_for": ["pod-x"],
            "results": [{"request": "cpus", "device": "numa1", "cpus": "16-19", "mems": "1"}],
        }],
    });
    for mode in [DeviceMode::Grouped, DeviceMode::Individual] {
        for granularity in [Granularity::Cpu, Granularity::Core] {
            let topo = policy::Topology::load(&policy::TopologySource::Synthetic(
                "pack:2 numa:2 core:8 pu:2".into(),
            ))
            .unwrap();
            let config = Config {
                reserved_cpus: ReservedCpus::Set(set("0-1")),
                devices: DeviceModel {
                    mode,
                    granularity,
                    ..DeviceModel::default()
                },
                ..Config::default()
            };
            let mut p = TopologyAware::new(topo, config).unwrap();
            p.restore(&saved).unwrap();
            let at = format!("{mode:?} {granularity:?}");
            assert_eq!(p.claim_cpus("u1"), Some(set("16-19")), "{at}");
            let again = p.allocate_claim(&claim("u1", &[("numa1", 4)])).unwrap();
            assert_eq!(
                again.edits[0].env,
                ["DRA_CPUSET_u1=16-19", "DRA_MEMS_u1=1"],
                "{at}"
            );
            assert_eq!(p.snapshot(), saved, "{at}");
        }
    }
}

#[test]
fn a_claim_is_adopted_from_its_edits_with_what_they_grant_and_learns_the_rest_when_prepared() {
    let mut before = machine();
    let mut c = claim("u1", &[("numa1", 4), ("numa2", 2)]);
    let edits = before.allocate_claim(&c).unwrap().edits;

    let mut p = machine();
    p.adopt_claim("u1", &edits).unwrap();
    assert_eq!(p.claims(), ["u1"]);
    assert_eq!(p.claim_cpus("u1"), Some(set("16-19,32-33")));
    assert!(!p.shared_cpus().intersects(&set("16-19,32-33")));
    p.adopt_claim("u1", &[]).unwrap(); // held already: nothing to do
    // Its spec's environment, from a pod it does not know yet, pins a running container.
    let mut x = container("x", QosClass::Burstable, 0);
    x.pod.uid = "pod-unknown".into();
    x.env = vec!["DRA_CPUSET_u1=16-19,32-33".into()];
    p.sync(&[x]).unwrap();
    assert_eq!(p.placement("x").unwrap().cpus, set("16-19,32-33"));
    // The kubelet's prepare: same results, same edits; what the spec did not say is learnt.
    c.reserved_for = vec!["pod-new".into()];
    assert_eq!(p.allocate_claim(&c).unwrap().edits, edits);
    let learnt = &p.snapshot()["claims"][0];
    assert_eq!(
        (
            &learnt["namespace"],
            &learnt["name"],
            &learnt["reserved_for"],
            &learnt["results"][1]["request"],
            learnt.get("adopted"),
        ),
        (
            &serde_json::json!("ml"),
            &serde_json::json!("trainer-cpus"),
            &serde_json::json!(["pod-new"]),
            &serde_json::json!("cpus"),
            None
        )
    );
    assert_eq!(learnt["results"], before.snapshot()["claims"][0]["results"]);

    // Refused: CPUs no claim can hold, CPUs held, edits it did not write.
    let env = |e: &str| vec![cdi::ContainerEdits::with_env([e.to_owned()])];
    let refused = |p: &mut TopologyAware, uid: &str, edits: Vec<cdi::ContainerEdits>| match p
        .adopt_claim(uid, &edits)
    {
        Err(PolicyError::Restore { reason, .. }) => reason,
        other => panic!("{other:?}"),
    };
    assert_eq!(
        refused(&mut p, "u2", env("DRA_CPUSET_u2=0-1")),
        "claim u2: cpus 0-1 are not online or are reserved or kernel-isolated here"
    );
    assert_eq!(
        refused(&mut p, "u2", env("DRA_CPUSET_u2=19-20")),
        "claim u2: cpus 19 are held already"
    );
    assert_eq!(
        refused(&mut p, "u2", env("X=1")),
        "claim u2: device 0 sets no DRA_CPUSET_u2"
    );
    assert_eq!(p.claims(), ["u1"], "a refusal holds nothing");
}

#[test]
fn an_update_places_again_by_the_annotations_and_claim_environment_the_container_came_with() {
    // The policy keeps only what placement reads of a container (its annotations of ours and its
    // claims' environment): an update places it again from what it kept.
    let mut p = machine();
    p.allocate_claim(&claim("u1", &[("numa1", 2)])).unwrap();
    let claimed = p.claim_cpus("u1").unwrap();
    let mut user = container("x", QosClass::Burstable, 500);
    user.pod.uid = "pod-x".into();
    user.env = vec![
        "PATH=/usr/bin:/bin".into(),
        format!("DRA_CPUSET_u1={claimed}"),
        "HOME=/root".into(),
    ];
    p.allocate(&user).unwrap();
    assert_eq!(p.placement("x").unwrap().cpus, claimed);
    let mut system = container("s", QosClass::Burstable, 500);
    system.pod.annotations.insert(
        "reserved-cpus.resource-policy.resmgr.io/pod".into(),
        "true".into(),
    );
    system
        .annotations
        .insert("io.kubernetes.container.hash".into(), "8a1b".into());
    p.allocate(&system).unwrap();
    let reserved = p.placement("s").unwrap().cpus;
    assert!(
        reserved != p.shared_cpus() && reserved != claimed,
        "{reserved}"
    );

    let more = Resources {
        cpu_request_milli: 1000,
        cpu_limit_milli: Some(1000),
        ..Resources::default()
    };
    p.update("x", &more).unwrap();
    assert_eq!(p.placement("x").unwrap().cpus, claimed, "still the claim's");
    p.update("s", &more).unwrap();
    assert_eq!(
        p.placement("s").unwrap().cpus,
        reserved,
        "still on the reserved CPUs"
    );
}
