//! An NRI container event through the manager, against the policy's own decision.
//!
//! Every event takes the manager lock, asks the policy, and, when it changed anything, publishes
//! a fresh snapshot for readers before letting go (the published snapshot of resmgr's `core`:
//! the inventory, the devices and the CPUs behind them, recomputed from the policy). The snapshot is the price of
//! readers that never take the lock; this measures what it adds to the event the runtime waits
//! for. The floor is the same CreateContainer and StopContainer decided by a bare policy, in the
//! same run, interleaved: what is left over is the manager (lock, pending updates, snapshot).
//!
//! A realistic node: 2 sockets, 4 NUMA nodes, 128 threads, the real topology-aware policy in the
//! grouped device model, 10, 100 and 1,000 containers running, Burstable containers created and
//! stopped one at a time. Targets: an event's median under 1 ms (the runtime's NRI timeout is 2 s
//! and the kubelet's pod start-up is counted in hundreds of milliseconds), and the manager's
//! overhead at most 3 times the bare decision at every size: it must not grow with the node.
//!
//! Prints `bench: {json}` lines (see xtask/src/bench.rs).

use std::time::{Duration, Instant};

use integration_tests::fakes::{Harness, container, topology_aware};
use policy::Resources;

const MACHINE: &str = "pack:2 numa:2 core:16 pu:2";
const RUNNING: usize = 100;
const ITERATIONS: usize = 500;

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

/// A Burstable container asking for half a CPU.
fn burstable(id: &str) -> policy::Container {
    policy::Container {
        resources: Resources {
            cpu_request_milli: 500,
            ..Resources::default()
        },
        ..container(id, &format!("pod-{id}"))
    }
}

/// One node of `running` containers: the manager's CreateContainer + StopContainer against the
/// bare policy's, interleaved; the ratio of their medians.
async fn run(running: usize) -> f64 {
    let existing: Vec<_> = (0..running)
        .map(|i| burstable(&format!("web-{i}")))
        .collect();
    let h = Harness::new();
    let m = h.ready_with(topology_aware(MACHINE), &existing).await;
    let mut bare = topology_aware(MACHINE);
    bare.sync(&existing).unwrap();

    let (mut events, mut floors) = (Vec::new(), Vec::new());
    for i in 0..ITERATIONS {
        let c = burstable(&format!("new-{i}"));
        let start = Instant::now();
        bare.allocate(&c).unwrap();
        bare.release(&c.id).unwrap();
        floors.push(start.elapsed());

        let start = Instant::now();
        m.create_container(&c).await.unwrap();
        m.stop_container(&c).await;
        events.push(start.elapsed());
    }
    let floor = report(
        &format!("resmgr/nri-create-and-stop/policy-alone (128 CPUs, {running} running)"),
        &mut floors,
        "",
    );
    let event = report(
        &format!("resmgr/nri-create-and-stop/manager ({running} running)"),
        &mut events,
        if running == RUNNING {
            "median < 1 ms"
        } else {
            ""
        },
    );
    let ratio = event / floor;
    println!(
        "bench: {}",
        serde_json::json!({
            "name": format!("resmgr/nri-create-and-stop/manager-over-policy ({running} running)"),
            "unit": "x", "median": ratio, "target": "<= 3"
        })
    );
    ratio
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    // Benchmarks run under `cargo bench`; `cargo test --benches` only checks that it builds.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    // The manager's share must not grow with what runs on the node.
    for running in [10, RUNNING, 1000] {
        run(running).await;
    }
}
