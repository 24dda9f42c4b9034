//! Property tests: random sequences of allocate / release / claim / unclaim / sync on the
//! topology-aware policy, checking after every step that
//!
//! - no CPU is granted exclusively twice (containers and claims together);
//! - shared and exclusive CPUs never overlap, and no shared container is left without CPUs;
//! - a refused call changes nothing;
//! - an exclusive request that one NUMA node could hold never spans two;
//! - when every request is whole cores, every grant is whole cores (SMT siblings are not split
//!   while whole cores are free);
//! - a sync reporting what the policy decided changes nothing;
//!
//! and at the end that releasing everything returns the initial state.

use std::collections::BTreeMap;

use policy::{
    Claim, Container, CpuSet, Pod, Policy, QosClass, Quantity, Resources, Topology, TopologyAware,
    TopologySource,
    model::AllocationResult,
    topology_aware::{Config, Grant, ReservedCpus},
};
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum Kind {
    Guaranteed(u64),
    Burstable(u64),
    BestEffort,
    /// A container using claim `u<k>` through its CDI device (a 2-CPU Burstable one when the
    /// claim does not exist).
    UsesClaim(u8),
}

#[derive(Debug, Clone)]
enum Op {
    Alloc { id: u8, kind: Kind, mem_mib: u64 },
    Release(u8),
    Claim { uid: u8, node: u8, cpus: u64 },
    Unclaim(u8),
    Sync,
}

fn ops(whole_cores_only: bool) -> impl Strategy<Value = Vec<Op>> {
    let kind = if whole_cores_only {
        prop_oneof![
            (1u64..5).prop_map(|n| Kind::Guaranteed(2 * n)),
            (1u64..3).prop_map(|n| Kind::Burstable(2000 * n)),
            (0u8..4).prop_map(Kind::UsesClaim),
        ]
        .boxed()
    } else {
        prop_oneof![
            3 => (1u64..10).prop_map(Kind::Guaranteed),
            2 => (0u64..4000).prop_map(Kind::Burstable),
            1 => Just(Kind::BestEffort),
            1 => (0u8..4).prop_map(Kind::UsesClaim),
        ]
        .boxed()
    };
    let claim_cpus = if whole_cores_only {
        (1u64..4).prop_map(|n| 2 * n).boxed()
    } else {
        (1u64..7).boxed()
    };
    let op = prop_oneof![
        5 => (0u8..12, kind, prop_oneof![Just(0u64), 1u64..700])
            .prop_map(|(id, kind, mem_mib)| Op::Alloc { id, kind, mem_mib }),
        3 => (0u8..12).prop_map(Op::Release),
        2 => (0u8..4, 0u8..4, claim_cpus).prop_map(|(uid, node, cpus)| Op::Claim { uid, node, cpus }),
        1 => (0u8..4).prop_map(Op::Unclaim),
        1 => Just(Op::Sync),
    ];
    proptest::collection::vec(op, 1..40)
}

/// Two sockets of two NUMA nodes of four 2-thread cores, numbered as Linux does on most x86
/// servers: first threads 0-15, their siblings 16-31 (core k is CPUs k and k+16), so that
/// picking the lowest free CPUs would split cores.
fn machine() -> TopologyAware {
    let siblings: Vec<String> = (0..16).map(|k| format!("{k},{}", k + 16)).collect();
    let desc = format!("pack:2 numa:2 core:4 pu:2(indexes={})", siblings.join(","));
    let topo = Topology::load(&TopologySource::Synthetic(desc)).unwrap();
    let config = Config {
        reserved_cpus: ReservedCpus::Set("0,16".parse().unwrap()),
        ..Config::default()
    };
    TopologyAware::new(topo, config).unwrap()
}

fn container(id: u8, kind: &Kind, mem_mib: u64) -> Container {
    let (qos, milli) = match kind {
        Kind::Guaranteed(n) => (QosClass::Guaranteed, n * 1000),
        Kind::Burstable(m) => (QosClass::Burstable, *m),
        Kind::BestEffort => (QosClass::BestEffort, 0),
        // Whole CPUs, so that without its claim it still needs whole cores of shared CPUs.
        Kind::UsesClaim(_) => (QosClass::Burstable, 2000),
    };
    let cdi_devices = match kind {
        Kind::UsesClaim(k) => vec![format!("topology-aware.resmgr.io/device=claim-u{k}-0")],
        _ => vec![],
    };
    Container {
        id: format!("c{id}"),
        pod: Pod {
            uid: format!("pod{id}"),
            namespace: "default".into(),
            name: format!("pod{id}"),
            qos,
            annotations: BTreeMap::new(),
        },
        name: "app".into(),
        resources: Resources {
            cpu_request_milli: milli,
            cpu_limit_milli: (qos == QosClass::Guaranteed).then_some(milli),
            memory_request_bytes: mem_mib << 20,
            memory_limit_bytes: None,
        },
        annotations: BTreeMap::new(),
        cdi_devices,
        env: vec![],
        cpus: None,
        mems: None,
    }
}

fn claim(uid: u8, node: u8, cpus: u64) -> Claim {
    Claim {
        uid: format!("u{uid}"),
        namespace: "default".into(),
        name: format!("claim{uid}"),
        reserved_for: vec![],
        results: vec![AllocationResult {
            request: "cpus".into(),
            pool: "node".into(),
            device: format!("numa{node}"),
            share_id: None,
            consumed_capacity: BTreeMap::from([("cpu".into(), Quantity::from_units(cpus))]),
        }],
        config: Vec::new(),
    }
}

/// Everything observable, for "nothing changed".
fn observe(p: &TopologyAware) -> String {
    let placements: Vec<String> = p
        .container_ids()
        .iter()
        .map(|id| format!("{id}:{:?}", p.placement(id)))
        .collect();
    let memory: Vec<u64> = (0..4).map(|n| p.memory_used(n)).collect();
    format!(
        "{placements:?} {} {memory:?} {}",
        p.shared_cpus(),
        p.snapshot()
    )
}

fn exclusive_grants(p: &TopologyAware) -> Vec<(String, CpuSet)> {
    let mut grants: Vec<(String, CpuSet)> = p
        .container_ids()
        .into_iter()
        .filter_map(|id| match p.placement(&id)?.grant {
            Grant::Exclusive { cpus, .. } | Grant::Isolated { cpus, .. } => Some((id, cpus)),
            _ => None,
        })
        .collect();
    for uid in p.claims() {
        let cpus = p.claim_cpus(&uid).unwrap();
        grants.push((uid, cpus));
    }
    grants
}

fn check_invariants(p: &TopologyAware) -> Result<(), TestCaseError> {
    let grants = exclusive_grants(p);
    let mut all = CpuSet::new();
    for (who, cpus) in &grants {
        prop_assert!(
            !all.intersects(cpus),
            "{who} got {cpus}, some already granted"
        );
        all = all.union(cpus);
    }
    prop_assert!(!p.shared_cpus().intersects(&all));
    prop_assert!(!p.shared_cpus().intersects(p.reserved_cpus()));
    for id in p.container_ids() {
        let pl = p.placement(&id).unwrap();
        prop_assert!(!pl.cpus.is_empty(), "{id} has no cpus");
        if let Grant::Shared { .. } = pl.grant {
            prop_assert!(
                !pl.cpus.intersects(&all),
                "shared {id} on {} overlaps {all}",
                pl.cpus
            );
        }
    }
    Ok(())
}

fn numa_of(p: &TopologyAware, cpus: &CpuSet) -> Vec<u32> {
    p.topology()
        .numa_nodes
        .iter()
        .filter(|n| n.cpus.intersects(cpus))
        .map(|n| n.id)
        .collect()
}

fn whole_cores(p: &TopologyAware, cpus: &CpuSet) -> bool {
    p.topology()
        .cores
        .iter()
        .all(|c| !c.threads.intersects(cpus) || cpus.is_superset(&c.threads))
}

fn run(ops: Vec<Op>, whole_cores_only: bool) -> Result<(), TestCaseError> {
    let mut p = machine();
    let initial = observe(&p);
    let mut specs: BTreeMap<String, Container> = BTreeMap::new();
    for op in ops {
        let before = p.clone();
        let before_seen = observe(&p);
        let failed = match &op {
            Op::Alloc { id, kind, mem_mib } => {
                let c = container(*id, kind, *mem_mib);
                let known = specs.contains_key(&c.id);
                match p.allocate(&c) {
                    Ok(a) => {
                        if !known {
                            specs.insert(c.id.clone(), c.clone());
                        }
                        if let (Kind::Guaranteed(n), Some(cpus), false) =
                            (kind, &a.adjustment.cpus, known)
                        {
                            let nodes = numa_of(&p, cpus);
                            if nodes.len() > 1 {
                                // Could one NUMA node have held it? Ask the claim allocator,
                                // which cuts CPUs out of a node under the same rules.
                                for node in 0..4 {
                                    let mut probe = before.clone();
                                    let fits = probe.allocate_claim(&claim(99, node, *n)).is_ok();
                                    prop_assert!(
                                        !fits,
                                        "{} cpus {cpus} span {nodes:?} though numa{node} had room",
                                        n
                                    );
                                }
                            }
                            if whole_cores_only {
                                prop_assert!(whole_cores(&p, cpus), "{cpus} splits a core");
                            }
                        }
                        false
                    }
                    Err(_) => true,
                }
            }
            Op::Release(id) => {
                p.release(&format!("c{id}")).unwrap();
                specs.remove(&format!("c{id}"));
                false
            }
            Op::Claim { uid, node, cpus } => match p.allocate_claim(&claim(*uid, *node, *cpus)) {
                Ok(_) => {
                    if whole_cores_only {
                        let got = p.claim_cpus(&format!("u{uid}")).unwrap();
                        prop_assert!(whole_cores(&p, &got), "claim {got} splits a core");
                    }
                    false
                }
                Err(_) => true,
            },
            Op::Unclaim(uid) => {
                p.release_claim(&format!("u{uid}")).unwrap();
                false
            }
            Op::Sync => {
                let report = |p: &TopologyAware| -> Vec<Container> {
                    specs
                        .values()
                        .map(|c| {
                            let mut c = c.clone();
                            if let Some(pl) = p.placement(&c.id) {
                                c.cpus = Some(pl.cpus);
                                c.mems = pl.mems;
                            }
                            c
                        })
                        .collect()
                };
                let running = report(&p);
                p.sync(&running).unwrap();
                // Everything the runtime reported is placed, and reporting the result back is
                // a fixed point.
                prop_assert_eq!(p.container_ids().len(), specs.len());
                let again = p.sync(&report(&p)).unwrap();
                prop_assert!(again.is_empty(), "second sync moved {again:?}");
                false
            }
        };
        if failed {
            prop_assert_eq!(
                observe(&p),
                before_seen,
                "a refused {:?} changed something",
                op
            );
        }
        check_invariants(&p)?;
    }
    for id in p.container_ids() {
        p.release(&id).unwrap();
    }
    for uid in p.claims() {
        p.release_claim(&uid).unwrap();
    }
    prop_assert_eq!(observe(&p), initial);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn random_sequences_keep_the_invariants(ops in ops(false)) {
        run(ops, false)?;
    }

    #[test]
    fn whole_core_requests_get_whole_cores(ops in ops(true)) {
        run(ops, true)?;
    }
}
