//! Benchmarks of the topology-aware policy on a 1,024-thread, 16-NUMA-node synthetic machine
//! (`pack:4 numa:4 core:32 pu:2`) holding 1,000 containers: placing one more container (shared
//! and exclusive), allocating one claim, and syncing all 1,000 containers.
//!
//! Targets (issue 6): a placement's median under 20 µs, a sync under 20 ms. Each placement
//! sample is the `allocate` (or `allocate_claim`) call alone; the release that puts the state
//! back runs outside the timed section.
//!
//! Prints one `bench: {json}` line per measurement (see xtask/src/bench.rs).

use std::{
    collections::BTreeMap,
    hint::black_box,
    time::{Duration, Instant},
};

use policy::{
    Claim, Container, Pod, Policy, QosClass, Quantity, Resources, Topology, TopologyAware,
    TopologySource,
    model::AllocationResult,
    topology_aware::{ClaimCpus, Config, Exclusivity},
};

const MACHINE: &str = "pack:4 numa:4 core:32 pu:2";
const SAMPLES: usize = 2_000;
const SYNC_SAMPLES: usize = 30;

fn report(name: &str, mut samples: Vec<Duration>, target: &str) {
    samples.sort();
    let at = |q: f64| {
        // The index is in 0..len: q is in [0, 1] and len is at least 1.
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let i = ((samples.len() - 1) as f64 * q).round() as usize;
        samples[i].as_nanos() as f64
    };
    let line = serde_json::json!({
        "name": name,
        "unit": "ns",
        "median": at(0.5),
        "p99": at(0.99),
        "target": target,
    });
    println!("bench: {line}");
}

fn container(i: usize, qos: QosClass, cpu_milli: u64) -> Container {
    Container {
        id: format!("c{i:04}"),
        pod: Pod {
            uid: format!("pod{i:04}"),
            namespace: "bench".into(),
            name: format!("pod{i:04}"),
            qos,
            annotations: BTreeMap::new(),
        },
        name: "app".into(),
        resources: Resources {
            cpu_request_milli: cpu_milli,
            cpu_limit_milli: (qos == QosClass::Guaranteed).then_some(cpu_milli),
            memory_request_bytes: 4 << 20,
            memory_limit_bytes: None,
        },
        annotations: BTreeMap::new(),
        cdi_devices: vec![],
        env: vec![],
        cpus: None,
        mems: None,
    }
}

/// 1,000 containers: every tenth Guaranteed with 2 exclusive CPUs, the rest Burstable (250m)
/// and BestEffort.
fn workload() -> Vec<Container> {
    (0..1_000)
        .map(|i| match i % 10 {
            0 => container(i, QosClass::Guaranteed, 2_000),
            1..=5 => container(i, QosClass::Burstable, 250),
            _ => container(i, QosClass::BestEffort, 0),
        })
        .collect()
}

fn loaded() -> (TopologyAware, Vec<Container>) {
    let topo = Topology::load(&TopologySource::Synthetic(MACHINE.into())).expect("synthetic");
    assert_eq!(topo.online.len(), 1_024);
    assert_eq!(topo.numa_nodes.len(), 16);
    // Exclusive CPUs for the Guaranteed containers from the low half of the machine, the
    // high half (numa8-15) published for claims.
    let config = Config {
        exclusivity: Exclusivity::Partition(ClaimCpus::Set("512-1023".parse().expect("a cpuset"))),
        ..Config::default()
    };
    let mut p = TopologyAware::new(topo, config).expect("config");
    let containers = workload();
    for c in &containers {
        p.allocate(c).expect("the workload fits");
    }
    (p, containers)
}

fn bench_placement(p: &mut TopologyAware, name: &str, qos: QosClass, milli: u64) {
    let samples = (0..SAMPLES)
        .map(|i| {
            let c = container(10_000 + i, qos, milli);
            let start = Instant::now();
            let a = p.allocate(&c).expect("fits");
            let elapsed = start.elapsed();
            black_box(a);
            p.release(&c.id).expect("release");
            elapsed
        })
        .collect();
    report(name, samples, "median < 20 µs");
}

fn bench_claim(p: &mut TopologyAware) {
    let samples = (0..SAMPLES)
        .map(|i| {
            let claim = Claim {
                uid: format!("claim-{i}"),
                namespace: "bench".into(),
                name: "cpus".into(),
                reserved_for: vec![],
                results: vec![AllocationResult {
                    request: "cpus".into(),
                    pool: "node".into(),
                    // The high half is published for claims.
                    device: format!("numa{}", 8 + i % 8),
                    share_id: None,
                    consumed_capacity: BTreeMap::from([("cpu".into(), Quantity::from_units(2))]),
                }],
                config: Vec::new(),
                pod_claim_name: None,
            };
            let start = Instant::now();
            let a = p.allocate_claim(&claim).expect("fits");
            let elapsed = start.elapsed();
            black_box(a);
            p.release_claim(&claim.uid).expect("release");
            elapsed
        })
        .collect();
    report(
        "policy/allocate_claim/2-cpus/1000-containers",
        samples,
        "median < 20 µs",
    );
}

fn bench_sync(p: &mut TopologyAware, containers: &[Container]) {
    // What the runtime reports after a restart: the containers with the cpusets they have.
    let running: Vec<Container> = containers
        .iter()
        .map(|c| {
            let mut c = c.clone();
            if let Some(pl) = p.placement(&c.id) {
                c.cpus = Some(pl.cpus);
                c.mems = pl.mems;
            }
            c
        })
        .collect();
    let samples = (0..SYNC_SAMPLES)
        .map(|_| {
            let start = Instant::now();
            let updates = p.sync(&running).expect("sync");
            let elapsed = start.elapsed();
            black_box(updates);
            elapsed
        })
        .collect();
    report("policy/sync/1000-containers", samples, "< 20 ms");
}

fn main() {
    let (mut p, containers) = loaded();
    bench_placement(
        &mut p,
        "policy/allocate/shared/1000-containers",
        QosClass::Burstable,
        250,
    );
    bench_placement(
        &mut p,
        "policy/allocate/exclusive-2-cpus/1000-containers",
        QosClass::Guaranteed,
        2_000,
    );
    bench_claim(&mut p);
    bench_sync(&mut p, &containers);
}
