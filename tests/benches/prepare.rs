//! NodePrepareResources for one claim, end to end over the DRA socket, against its floor.
//!
//! A prepare is, at the least, one gRPC round trip over a unix socket and three durable file
//! writes (the state, the claim's device metadata, then the CDI spec), each written to a
//! temporary file, fsynced, renamed and its directory fsynced, and the metadata's two new
//! directories (the claim's and its request's) created durably. The floor is exactly that,
//! measured in the same run, interleaved with the prepares so both see the same disk and the same
//! load: an empty NodePrepareResources (answered by the server without touching the lifecycle)
//! plus those writes in the same file system by the agent's own durable write
//! (`cdi::durable::create_dir` and `replace`).
//! Target: the prepare's median under 1.5 times the floor's.
//!
//! Everything else a prepare does is here too: the real topology-aware policy on a 64-thread
//! synthetic machine with shared containers to shrink, the claim read (from memory), the CDI
//! spec's validation, the delivery of updates to a runtime (in memory). Measured in both device
//! models: `grouped` (a claim consumes 2 CPUs of NUMA node 1's shared device), `individual`
//! (a claim holds two devices of one CPU each, two results, two CDI devices), and
//! `grouped-memory` (`claim-memory: 50%`, `claim-hugepages: true` on a machine with 2 MiB and
//! 1 GiB hugepages: a claim consumes 2 CPUs, 4 GiB of memory, 64 MiB of 2 MiB pages and one
//! 1 GiB page of NUMA node 1's device, which the prepare grants from the node's account).
//!
//! Prints `bench: {json}` lines (see xtask/src/bench.rs).

use std::{
    fs,
    time::{Duration, Instant},
};

use dra_proto::v1;
use integration_tests::{
    fakes::{claim, container},
    node::Node,
};
use policy::{
    Claim, Quantity, Topology, TopologySource,
    topology_aware::{Config, DeviceMode, DeviceModel, MemoryConfig},
};

/// Which prepares to measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Model {
    Grouped,
    Individual,
    /// Grouped, with memory and hugepages published and claimed.
    GroupedMemory,
}

impl Model {
    fn mode(self) -> DeviceMode {
        match self {
            Self::Grouped | Self::GroupedMemory => DeviceMode::Grouped,
            Self::Individual => DeviceMode::Individual,
        }
    }
}

const ITERATIONS: usize = 200;

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

fn report(name: &str, samples: &mut [Duration], target: &str) -> f64 {
    let median = percentile(samples, 0.5);
    let line = serde_json::json!({
        "name": name, "unit": "ns", "median": median, "p99": percentile(samples, 0.99), "target": target,
    });
    println!("bench: {line}");
    median
}

/// The claims a model's prepares use: grouped, 2 CPUs of `numa1`; individual, `cpu16` and
/// `cpu17` (two CPUs of NUMA node 1 on this machine).
fn claims(model: Model) -> Vec<Claim> {
    (0..ITERATIONS)
        .map(|i| {
            let mut c = claim(&format!("c{i}"), "pod-db", 2);
            match model {
                Model::Grouped => c.results[0].device = "numa1".into(),
                Model::GroupedMemory => {
                    let r = &mut c.results[0];
                    r.device = "numa1".into();
                    for (name, bytes) in [
                        ("memory", 4u64 << 30),
                        ("hugepages2Mi", 64 << 20),
                        ("hugepages1Gi", 1 << 30),
                    ] {
                        r.consumed_capacity
                            .insert(name.into(), Quantity::from_units(bytes));
                    }
                }
                Model::Individual => {
                    let mut second = c.results[0].clone();
                    for (r, device) in c
                        .results
                        .iter_mut()
                        .chain([&mut second])
                        .zip(["cpu16", "cpu17"])
                    {
                        r.device = device.into();
                        r.share_id = None;
                        r.consumed_capacity.clear();
                    }
                    c.results.push(second);
                }
            }
            c
        })
        .collect()
}

/// Prepares and unprepares claims one by one in `mode`, interleaved with the floor; returns the
/// prepares' median.
async fn measure(label: &str, model: Model) -> f64 {
    let mut config = Config {
        devices: DeviceModel {
            mode: model.mode(),
            ..DeviceModel::default()
        },
        ..Config::default()
    };
    // The memory model needs more memory than the synthetic default to publish.
    let machine = match model {
        Model::GroupedMemory => "pack:2 numa:2(memory=64GiB) core:8 pu:2",
        Model::Grouped | Model::Individual => "pack:2 numa:2 core:8 pu:2",
    };
    let mut topology = Topology::load(&TopologySource::Synthetic(machine.into())).unwrap();
    if model == Model::GroupedMemory {
        for node in &mut topology.numa_nodes {
            node.hugepages = [(2 << 20, 1024), (1 << 30, 4)].into();
        }
        config.memory = MemoryConfig {
            claim_percent: 50,
            claim_hugepages: true,
            ..MemoryConfig::default()
        };
    }
    let node = Node::start_on(topology, claims(model), config).await;
    let containers: Vec<_> = (0..20)
        .map(|i| container(&format!("web-{i}"), "pod-web"))
        .collect();
    node.synchronize(&containers).await;
    let channel = node.dra_channel().await;
    let mut client = v1::dra_plugin_client::DraPluginClient::new(channel);
    let floor_dir = node.dir.path().join("floor");
    fs::create_dir_all(&floor_dir).unwrap();
    let state = fs::read(node.dir.path().join("state/state.json")).unwrap_or_default();

    let (mut prepares, mut floors) = (Vec::new(), Vec::new());
    for i in 0..ITERATIONS {
        let start = Instant::now();
        client
            .node_prepare_resources(v1::NodePrepareResourcesRequest::default())
            .await
            .unwrap();
        cdi::durable::replace(&floor_dir, "state.json", &state, 0o644).unwrap();
        let metadata = floor_dir.join(format!("c{i}")).join("cpus");
        cdi::durable::create_dir(&metadata, 0o755).unwrap();
        cdi::durable::replace(&metadata, "metadata.json", &state, 0o644).unwrap();
        cdi::durable::replace(
            &floor_dir,
            "spec.json",
            b"{\"cdiVersion\":\"0.3.0\"}",
            0o644,
        )
        .unwrap();
        floors.push(start.elapsed());

        let uid = format!("c{i}");
        let claim = v1::Claim {
            namespace: "default".into(),
            uid: uid.clone(),
            name: format!("claim-{uid}"),
        };
        let start = Instant::now();
        let answer = client
            .node_prepare_resources(v1::NodePrepareResourcesRequest {
                claims: vec![claim.clone()],
            })
            .await
            .unwrap()
            .into_inner();
        prepares.push(start.elapsed());
        assert_eq!(answer.claims[&uid].error, "", "prepare {uid}");
        let answer = client
            .node_unprepare_resources(v1::NodeUnprepareResourcesRequest {
                claims: vec![claim],
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(answer.claims[&uid].error, "", "unprepare {uid}");
    }
    let floor = report(
        &format!("resmgr/prepare-floor/{label} (1 round trip + 3 durable writes, 2 directories)"),
        &mut floors,
        "",
    );
    let prepare = report(
        &format!("resmgr/prepare-one-claim/{label}"),
        &mut prepares,
        "median < 1.5 x floor",
    );
    println!(
        "bench: {}",
        serde_json::json!({"name": format!("resmgr/prepare-over-floor/{label}"), "unit": "x", "median": prepare / floor, "target": "< 1.5"})
    );
    node.plugin.shutdown().await.unwrap();
    prepare
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    // Benchmarks run under `cargo bench`; `cargo test --benches` only checks that it builds.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    measure("grouped", Model::Grouped).await;
    measure("individual", Model::Individual).await;
    measure("grouped-memory", Model::GroupedMemory).await;
}
