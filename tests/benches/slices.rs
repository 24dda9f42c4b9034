//! Publishing a large machine's devices as ResourceSlices: how many slices, how many bytes, and
//! how long building and validating them takes.
//!
//! The machine is `pack:4 numa:4 core:32 pu:2`, 1,024 CPUs in 16 NUMA nodes (two reserved), in
//! the device models of the topology-aware policy: `individual` (a device per CPU, 1,022
//! devices in slices of at most 128), `individual` with `claim-granularity: core` (a device per
//! whole core, 511) and `grouped` (a device per NUMA node). Building is what the
//! publisher does before it talks to the API server: every device to its v1 form, chunked,
//! into slice specs. Validating is what it checks first: the devices (names, attributes,
//! capacities, request policies) and every slice spec as the API server would. The bytes are
//! the slice specs' JSON, what goes over the wire for the pool (object metadata aside).
//!
//! Prints `bench: {json}` lines (see xtask/src/bench.rs).

use std::time::{Duration, Instant};

use kube_dra::slices::{
    PublisherConfig,
    build::{chunk, slice_spec, wire_device},
    validate::{validate_devices, validate_slice_spec},
};
use policy::{
    Device, Policy, Topology, TopologyAware, TopologySource,
    topology_aware::{Config, DeviceMode, DeviceModel, Granularity, ReservedCpus},
};

const ITERATIONS: usize = 200;
const DRIVER: &str = "topology-aware.resmgr.io";

fn percentile(samples: &mut [Duration], q: f64) -> f64 {
    samples.sort();
    // q is in [0, 1] and there is at least one sample, so the index is in range.
    #[allow(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss
    )]
    let i = ((samples.len() - 1) as f64 * q).round() as usize;
    samples[i].as_nanos() as f64
}

fn report(name: &str, samples: &mut [Duration], target: &str) {
    let line = serde_json::json!({
        "name": name, "unit": "ns", "median": percentile(samples, 0.5),
        "p99": percentile(samples, 0.99), "target": target,
    });
    println!("bench: {line}");
}

fn figure(name: &str, unit: &str, value: usize) {
    println!(
        "bench: {}",
        serde_json::json!({"name": name, "unit": unit, "median": value})
    );
}

fn devices(mode: DeviceMode, granularity: Granularity) -> Vec<Device> {
    let topology = Topology::load(&TopologySource::Synthetic(
        "pack:4 numa:4 core:32 pu:2".into(),
    ))
    .unwrap();
    let config = Config {
        reserved_cpus: ReservedCpus::Count(2),
        devices: DeviceModel {
            mode,
            granularity,
            ..DeviceModel::default()
        },
        ..Config::default()
    };
    TopologyAware::new(topology, config)
        .unwrap()
        .devices()
        .unwrap()
}

fn build(
    config: &PublisherConfig,
    devices: &[Device],
) -> Vec<k8s_openapi::api::resource::v1::ResourceSliceSpec> {
    let wire = devices.iter().map(|d| wire_device(config, d)).collect();
    let chunks = chunk(wire);
    let count = chunks.len();
    chunks
        .into_iter()
        .map(|c| slice_spec(config, 1, count, c))
        .collect()
}

fn main() {
    // Benchmarks run under `cargo bench`; `cargo test --benches` only checks that it builds.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let config = PublisherConfig::new(DRIVER, "node-1");
    for (label, mode, granularity) in [
        ("individual", DeviceMode::Individual, Granularity::Cpu),
        (
            "individual-cores",
            DeviceMode::Individual,
            Granularity::Core,
        ),
        ("grouped", DeviceMode::Grouped, Granularity::Cpu),
    ] {
        let devices = devices(mode, granularity);
        let specs = build(&config, &devices);
        let bytes: usize = specs
            .iter()
            .map(|s| serde_json::to_vec(s).unwrap().len())
            .sum();
        figure(
            &format!("slices/{label}-1024-cpus/devices"),
            "devices",
            devices.len(),
        );
        figure(
            &format!("slices/{label}-1024-cpus/slices"),
            "slices",
            specs.len(),
        );
        figure(&format!("slices/{label}-1024-cpus/bytes"), "bytes", bytes);

        let (mut builds, mut validations) = (Vec::new(), Vec::new());
        for _ in 0..ITERATIONS {
            let start = Instant::now();
            let specs = std::hint::black_box(build(&config, &devices));
            builds.push(start.elapsed());
            let start = Instant::now();
            validate_devices(DRIVER, &devices).unwrap();
            for spec in &specs {
                validate_slice_spec(spec).unwrap();
            }
            validations.push(start.elapsed());
        }
        report(
            &format!("slices/{label}-1024-cpus/build"),
            &mut builds,
            "median < 10 ms",
        );
        report(
            &format!("slices/{label}-1024-cpus/validate"),
            &mut validations,
            "median < 10 ms",
        );
    }
}
