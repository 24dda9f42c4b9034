//! Property tests: random sequences of allocate / release / claim / unclaim / sync on the
//! topology-aware policy, under each `cpu-exclusivity` setting, checking after every step that
//!
//! - every container is placed (none is refused: the kubelet admitted it), and every claim
//!   that fits what its device advertises and claims already consumed is granted, while one
//!   that does not is refused (as the scheduler, counting consumed capacity, would never
//!   allocate it);
//! - no CPU is granted exclusively twice (containers and claims together);
//! - shared and exclusive CPUs never overlap, and no container is left without CPUs;
//! - a refused call changes nothing;
//! - an exclusive request that one NUMA node could hold never spans two;
//! - a Guaranteed container without a claim (`partition`, `pods`) runs shared only when fewer
//!   CPUs than it asks for are neither reserved, set aside for claims nor held exclusively:
//!   shared containers never keep it from them, whatever arrived first;
//! - when every request is whole cores, every grant is whole cores (SMT siblings are not split
//!   while whole cores are free);
//! - a sync reporting what the policy decided changes nothing;
//!
//! and at the end that releasing everything returns the initial state.

use std::collections::BTreeMap;

use policy::{
    Claim, Container, CpuSet, GrantKind, Pod, Policy, QosClass, Quantity, Resources, Topology,
    TopologyAware, TopologySource,
    model::AllocationResult,
    topology_aware::{ClaimCpus, Config, Exclusivity, Grant, ReservedCpus},
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
/// picking the lowest free CPUs would split cores. With `Partition`, numa1 and numa3 are
/// published for claims.
fn machine(mode: Mode) -> TopologyAware {
    let siblings: Vec<String> = (0..16).map(|k| format!("{k},{}", k + 16)).collect();
    let desc = format!("pack:2 numa:2 core:4 pu:2(indexes={})", siblings.join(","));
    let topo = Topology::load(&TopologySource::Synthetic(desc)).unwrap();
    let exclusivity = match mode {
        Mode::Claims => Exclusivity::Claims,
        Mode::Partition => Exclusivity::Partition(ClaimCpus::Set(claim_partition(mode))),
        Mode::Pods => Exclusivity::Pods,
    };
    let config = Config {
        reserved_cpus: ReservedCpus::Set("0,16".parse().unwrap()),
        exclusivity,
        ..Config::default()
    };
    TopologyAware::new(topo, config).unwrap()
}

/// The CPUs set aside for claims with `Partition`: numa1 and numa3.
fn claim_partition(mode: Mode) -> CpuSet {
    match mode {
        Mode::Partition => "4-7,12-15,20-23,28-31".parse().unwrap(),
        Mode::Claims | Mode::Pods => CpuSet::new(),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Claims,
    Partition,
    Pods,
}

/// The `cpu` capacity each device advertises.
fn capacities(p: &TopologyAware) -> BTreeMap<String, u64> {
    p.devices()
        .unwrap()
        .iter()
        .map(|d| (d.name.clone(), d.capacities["cpu"].value.units_ceil()))
        .collect()
}

/// Whether NUMA node `node` could have held `n` exclusive CPUs for a container: whether every
/// pool holding it has `n` shared CPUs (not published for claims) beyond what its shared
/// containers need (their requests, at least one CPU per pool in use).
fn numa_could_hold(
    p: &TopologyAware,
    specs: &BTreeMap<String, Container>,
    node: u32,
    n: u64,
) -> bool {
    let inv = p.inventory();
    let published = p.devices().unwrap().iter().fold(CpuSet::new(), |acc, d| {
        let cpus = &p
            .topology()
            .numa_nodes
            .iter()
            .find(|m| {
                d.attributes.get("resource.kubernetes.io/numaNode")
                    == Some(&policy::AttributeValue::Int(m.id.into()))
            })
            .unwrap()
            .cpus;
        acc.union(cpus)
    });
    let claim_cpus = published
        .intersection(&p.topology().online)
        .difference(p.reserved_cpus());
    let name = format!("numa{node}");
    let Some(at) = inv.pools.iter().position(|pool| pool.name == name) else {
        return false;
    };
    // The pool and its ancestors: each earlier pool of smaller depth that contains it.
    let target = &inv.pools[at];
    inv.pools[..=at]
        .iter()
        .filter(|pool| pool.cpus.is_superset(&target.cpus))
        .all(|pool| {
            let (milli, count) = inv
                .containers
                .iter()
                .filter(|c| c.grant == GrantKind::Shared)
                .filter(|c| {
                    let home = inv.pools.iter().find(|x| Some(&x.name) == c.pool.as_ref());
                    home.is_some_and(|h| pool.cpus.is_superset(&h.cpus))
                })
                .fold((0, 0), |(m, k), c| {
                    (m + specs[&c.id].resources.cpu_request_milli, k + 1)
                });
            let need = milli.div_ceil(1000).max(u64::from(count > 0));
            let have = pool.shared.difference(&claim_cpus).len() as u64;
            have >= need + n
        })
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
        pod_claim_name: None,
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

fn run(ops: Vec<Op>, whole_cores_only: bool, mode: Mode) -> Result<(), TestCaseError> {
    let mut p = machine(mode);
    let initial = observe(&p);
    let advertised = capacities(&p);
    let mut specs: BTreeMap<String, Container> = BTreeMap::new();
    // What the scheduler has handed out: claim UID -> (device, cpus).
    let mut allocated: BTreeMap<String, (String, u64)> = BTreeMap::new();
    for op in ops {
        let before_seen = observe(&p);
        let failed = match &op {
            Op::Alloc { id, kind, mem_mib } => {
                let c = container(*id, kind, *mem_mib);
                let known = specs.contains_key(&c.id);
                let a = p.allocate(&c);
                prop_assert!(a.is_ok(), "{op:?} was refused: {a:?}");
                let a = a.unwrap();
                if !known {
                    specs.insert(c.id.clone(), c.clone());
                }
                let exclusive = p.placement(&c.id).map(|pl| pl.grant);
                if let (Kind::Guaranteed(n), false, Some(Grant::Shared { .. }), false) =
                    (kind, known, &exclusive, mode == Mode::Claims)
                {
                    let held = exclusive_grants(&p)
                        .iter()
                        .fold(CpuSet::new(), |acc, (_, cpus)| acc.union(cpus));
                    let free = p
                        .topology()
                        .online
                        .difference(p.reserved_cpus())
                        .difference(&claim_partition(mode))
                        .difference(&held);
                    prop_assert!(
                        (free.len() as u64) < *n,
                        "{} runs shared though {free} were free for its {n} exclusive cpus",
                        c.id
                    );
                }
                if let (Kind::Guaranteed(n), Some(cpus), false, Some(Grant::Exclusive { .. })) =
                    (kind, &a.adjustment.cpus, known, exclusive)
                {
                    let nodes = numa_of(&p, cpus);
                    if nodes.len() > 1 {
                        let mut undo = p.clone();
                        undo.release(&c.id).unwrap();
                        for node in 0..4 {
                            prop_assert!(
                                !numa_could_hold(&undo, &specs, node, *n),
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
            Op::Release(id) => {
                p.release(&format!("c{id}")).unwrap();
                specs.remove(&format!("c{id}"));
                false
            }
            Op::Claim { uid, node, cpus } => {
                let key = format!("u{uid}");
                let device = format!("numa{node}");
                let consumed: u64 = allocated
                    .iter()
                    .filter(|(k, (d, _))| **k != key && *d == device)
                    .map(|(_, (_, n))| n)
                    .sum();
                let schedulable = advertised
                    .get(&device)
                    .is_some_and(|cap| consumed + cpus <= *cap);
                let held = allocated.get(&key).cloned();
                let result = p.allocate_claim(&claim(*uid, *node, *cpus));
                if let Some(was) = &held {
                    // A re-prepare: what it got before; other results under the same UID wait
                    // for the unprepare.
                    let same = *was == (device.clone(), *cpus);
                    prop_assert_eq!(result.is_ok(), same, "re-preparing {}: {:?}", key, result);
                } else {
                    prop_assert_eq!(
                        result.is_ok(),
                        schedulable,
                        "{:?} with {} of {:?} consumed: {:?}",
                        op,
                        consumed,
                        advertised.get(&device),
                        result
                    );
                }
                if result.is_ok() && held.is_none() {
                    allocated.insert(key.clone(), (device, *cpus));
                    if whole_cores_only {
                        let got = p.claim_cpus(&key).unwrap();
                        prop_assert!(whole_cores(&p, &got), "claim {got} splits a core");
                    }
                }
                result.is_err()
            }
            Op::Unclaim(uid) => {
                p.release_claim(&format!("u{uid}")).unwrap();
                allocated.remove(&format!("u{uid}"));
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
    fn random_sequences_keep_the_invariants_with_exclusivity_through_claims(ops in ops(false)) {
        run(ops, false, Mode::Claims)?;
    }

    #[test]
    fn random_sequences_keep_the_invariants_with_a_claim_partition(ops in ops(false)) {
        run(ops, false, Mode::Partition)?;
    }

    #[test]
    fn random_sequences_keep_the_invariants_with_exclusive_pods(ops in ops(false)) {
        run(ops, false, Mode::Pods)?;
    }

    #[test]
    fn whole_core_requests_get_whole_cores(ops in ops(true)) {
        run(ops.clone(), true, Mode::Partition)?;
        run(ops, true, Mode::Claims)?;
    }
}
