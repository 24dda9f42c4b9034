//! Benchmarks of the spec store: how long a prepare waits for its spec to be durable
//! (`write_claim`) and an unprepare for it to be gone (`remove_claim`), on tmpfs (what
//! `/var/run/cdi` is in production) and on the disk the temporary directory is on; and the part
//! of a write that is pure computation (building, validating and serializing the spec).
//!
//! Prints one `bench: {json}` line per measurement (see xtask/src/bench.rs).

use std::{
    path::Path,
    time::{Duration, Instant},
};

use cdi::{ClaimUid, ContainerEdits, SpecStore, validate_spec};

const VENDOR: &str = "resmgr.example.com";
const UID: &str = "0b2c9a5e-8f6d-4c1a-9e3b-2d7f1a6c4e80";
const ITERATIONS: usize = 300;

/// What a claim of two allocation results looks like: one env entry per result.
fn edits() -> Vec<ContainerEdits> {
    (0..2)
        .map(|i| ContainerEdits::with_env([format!("RESMGR_CLAIM_{i}={UID}")]))
        .collect()
}

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

fn time(mut f: impl FnMut()) -> Vec<Duration> {
    (0..ITERATIONS)
        .map(|_| {
            let start = Instant::now();
            f();
            start.elapsed()
        })
        .collect()
}

fn bench_dir(label: &str, dir: &Path, write_target: &str) {
    let store = SpecStore::new(dir, VENDOR).expect("valid vendor");
    let edits = edits();
    let writes = time(|| {
        store.write_claim(UID, &edits).expect("write_claim");
    });
    report(&format!("cdi/write_claim/{label}"), writes, write_target);
    // Each removal needs a spec to remove; only the removal is timed.
    let mut samples = Vec::with_capacity(ITERATIONS);
    for _ in 0..ITERATIONS {
        store.write_claim(UID, &edits).expect("write_claim");
        let start = Instant::now();
        store.remove_claim(UID).expect("remove_claim");
        samples.push(start.elapsed());
    }
    report(&format!("cdi/remove_claim/{label}"), samples, "");
}

fn main() {
    let uid = ClaimUid::new(UID).expect("valid uid");
    let store = SpecStore::new("/nonexistent", VENDOR).expect("valid vendor");
    let edits = edits();
    report(
        "cdi/build_validate_serialize",
        time(|| {
            let spec = store.spec_for(&uid, &edits);
            validate_spec(&spec).expect("valid spec");
            std::hint::black_box(spec.to_json());
        }),
        "",
    );

    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        let dir = tempfile::tempdir_in(shm).expect("tempdir on tmpfs");
        bench_dir("tmpfs", dir.path(), "< 1 ms");
    }
    let dir = tempfile::tempdir().expect("tempdir");
    // Two fsyncs per write: the disk decides, not our code.
    bench_dir("tempdir", dir.path(), "");
}
