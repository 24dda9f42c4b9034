//! Crash consistency of the claim lifecycle: the manager is killed at every named crash point of
//! prepare, unprepare and commit, restarted, and retried as the kubelet would; the invariants hold
//! at the crash itself and after recovery.
//!
//! At the crash: every CDI spec on disk belongs to a claim the committed state accounts for,
//! every file a spec mounts (the claim's device metadata) is on disk, and device metadata on
//! disk belongs to a claim the state accounts for. After the restart and the retry: every CPU a
//! container runs on is shared or belongs to a claim reserved for the container's pod, no
//! claim's CPU is used by another pod, and the claim is prepared with its metadata (after a
//! prepare) or gone without a trace, metadata included (after an unprepare).

use std::{
    path::Path,
    process::{Command, Output},
};

use integration_tests::{
    crash::CRASH_AT_ENV,
    fakes::{FileRuntime, RuntimeFile, saved_claims},
};
use policy::CpuSet;
use resmgr::points::Point;

const CHILD: &str = env!("CARGO_BIN_EXE_crash-child");

fn child(dir: &Path, op: &str, crash_at: Option<Point>) -> Output {
    let mut cmd = Command::new(CHILD);
    cmd.arg(dir).arg(op).env_remove(CRASH_AT_ENV);
    if let Some(point) = crash_at {
        cmd.env(CRASH_AT_ENV, point.name());
    }
    cmd.output().unwrap()
}

fn specs(dir: &Path) -> Vec<String> {
    cdi::SpecStore::new(dir.join("cdi"), integration_tests::fakes::DRIVER)
        .unwrap()
        .claims()
        .unwrap()
        .into_iter()
        .map(|u| u.to_string())
        .collect()
}

/// A node with two shared containers of one pod and one container of the claim's pod.
fn node(dir: &Path) -> FileRuntime {
    let runtime = FileRuntime {
        path: dir.join("runtime.json"),
    };
    let all: CpuSet = (0..8).collect();
    let containers: RuntimeFile = [
        ("web-1".to_owned(), ("pod-web".to_owned(), all.clone())),
        ("web-2".to_owned(), ("pod-web".to_owned(), all.clone())),
        ("db".to_owned(), ("pod-db".to_owned(), all)),
    ]
    .into();
    runtime.write(&containers);
    runtime
}

/// The claims with device metadata on disk.
fn metadata(dir: &Path) -> Vec<String> {
    resmgr::metadata::MetadataStore::new(
        dir.join("metadata"),
        integration_tests::fakes::DRIVER,
        vec![],
    )
    .claims()
    .unwrap()
    .into_iter()
    .map(|u| u.to_string())
    .collect()
}

fn assert_specs_accounted(dir: &Path, context: &str) {
    let saved = saved_claims(&dir.join("state"));
    let store = cdi::SpecStore::new(dir.join("cdi"), integration_tests::fakes::DRIVER).unwrap();
    for uid in specs(dir) {
        assert!(
            saved.contains(&uid),
            "{context}: spec of {uid} on disk, state accounts for {saved:?}"
        );
        let edits = store.read_claim(&uid).unwrap();
        assert!(
            edits.iter().all(|e| !e.mounts.is_empty()),
            "{context}: spec of {uid} mounts no device metadata"
        );
        for mount in edits.iter().flat_map(|e| &e.mounts) {
            assert!(
                Path::new(&mount.host_path).is_file(),
                "{context}: spec of {uid} mounts {}, which is not on disk",
                mount.host_path
            );
        }
    }
    for uid in metadata(dir) {
        assert!(
            saved.contains(&uid),
            "{context}: device metadata of {uid} on disk, state accounts for {saved:?}"
        );
    }
}

/// After recovery: containers of pod-db run on the claim's CPUs when it is prepared; everyone
/// else on the rest; nobody else on the claim's CPUs.
fn assert_cpus_accounted(dir: &Path, runtime: &FileRuntime, prepared: bool, context: &str) {
    let containers = runtime.read();
    let shared = &containers["web-1"].1;
    assert_eq!(
        &containers["web-2"].1, shared,
        "{context}: both shared containers agree"
    );
    if prepared {
        let claim = &containers["db"].1;
        assert_eq!(
            claim.len(),
            2,
            "{context}: the claim's pod runs on its 2 CPUs: {claim}"
        );
        assert!(
            !shared.intersects(claim),
            "{context}: shared {shared} overlaps claimed {claim}"
        );
        assert_eq!(
            shared.union(claim).len(),
            8,
            "{context}: every CPU is accounted"
        );
        assert_eq!(saved_claims(&dir.join("state")), ["c1"], "{context}");
        assert_eq!(specs(dir), ["c1"], "{context}");
        assert_eq!(metadata(dir), ["c1"], "{context}");
    } else {
        assert_eq!(
            shared.len(),
            8,
            "{context}: the released CPUs are shared again"
        );
        assert_eq!(containers["db"].1.len(), 8, "{context}");
        assert!(saved_claims(&dir.join("state")).is_empty(), "{context}");
        assert!(specs(dir).is_empty(), "{context}");
        assert!(metadata(dir).is_empty(), "{context}");
    }
}

#[test]
fn every_crash_point_leaves_a_recoverable_state() {
    let mut reached = 0;
    for &point in Point::STEPS {
        for op in ["prepare", "unprepare"] {
            let context = format!("{op}, crash at {point}");
            let dir = tempfile::tempdir().unwrap();
            let runtime = node(dir.path());
            if op == "unprepare" {
                let setup = child(dir.path(), "prepare", None);
                assert!(
                    setup.status.success(),
                    "{context}: setup prepare: {setup:?}"
                );
                assert_cpus_accounted(dir.path(), &runtime, true, &context);
            }
            let crashed = child(dir.path(), op, Some(point));
            if crashed.status.success() {
                // This operation does not pass this point (an unprepare never reaches a prepare
                // point); it ran to completion instead.
                assert_cpus_accounted(dir.path(), &runtime, op == "prepare", &context);
                continue;
            }
            reached += 1;
            let stderr = String::from_utf8_lossy(&crashed.stderr);
            assert!(
                stderr.contains(&format!("crash point {point}: aborting")),
                "{context}: {stderr}"
            );
            assert_specs_accounted(dir.path(), &context);

            let retried = child(dir.path(), op, None);
            assert!(
                retried.status.success(),
                "{context}: the kubelet's retry failed: {retried:?}"
            );
            assert_specs_accounted(dir.path(), &context);
            assert_cpus_accounted(dir.path(), &runtime, op == "prepare", &context);
        }
    }
    // Every point is reached by at least one of the two operations; the shared commit point by
    // both.
    assert_eq!(reached, Point::STEPS.len() + 1, "crash points reached");
}
