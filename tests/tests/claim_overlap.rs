//! A claim is answered OK only once no other container can run on its CPUs: the interleavings
//! in which a container the runtime is still creating kept running on a claim's CPUs after the
//! claim was answered (issue 35), each made deterministic on a current-thread runtime with
//! paused time, through the manager with the real state file and spec store.
//!
//! The runtime double behaves as containerd does at worst: from a container's CreateContainer
//! until it runs, an update of it is skipped and reported applied.

use std::sync::Arc;

use integration_tests::{
    fakes::{Harness, TestPolicy, claim, claim_ref, container, prepare_error},
    faults::{Fault, Point},
};
use policy::CpuSet;
use resmgr::Manager;

fn set(s: &str) -> CpuSet {
    s.parse().unwrap()
}

/// The CPUs a prepared claim grants, from its record in the policy's spec: the claim's
/// `DRA_CPUSET_<uid>`.
fn granted(h: &Harness, uid: &str) -> CpuSet {
    let edits = cdi::SpecStore::new(h.cdi_dir(), integration_tests::fakes::DRIVER)
        .unwrap()
        .read_claim(uid)
        .unwrap();
    let prefix = format!("DRA_CPUSET_{uid}=");
    edits[0]
        .env
        .iter()
        .find_map(|e| e.strip_prefix(&prefix))
        .unwrap()
        .parse()
        .unwrap()
}

/// The runtime creates and starts container `id` of `pod` as the kubelet has it do: the
/// CreateContainer call, the container made where the answer says, started, PostStartContainer.
async fn create_and_start(h: &Harness, m: &Manager, id: &str, pod: &str) -> CpuSet {
    h.runtime.creating(id);
    let allocation = m.create_container(&container(id, pod)).await.unwrap();
    h.runtime.apply_reply(&allocation.updates);
    let cpus = allocation.adjustment.cpus.clone().unwrap();
    h.runtime.created(id, Some(&cpus));
    tokio::task::yield_now().await;
    h.runtime.started(id);
    m.container_started(&container(id, pod)).await;
    cpus
}

/// A claim whose first prepare failed and could not be rolled back (whether its spec was on
/// disk could not be told) is still allocated when the kubelet retries; the retry must wait, as
/// the first call did, for the container the allocation moved off its CPUs, which the runtime
/// has not started yet. Before the fix the retry saw the claim held, skipped the wait, and
/// answered OK while the container still ran on the claim's CPUs.
#[tokio::test(start_paused = true)]
async fn a_retry_of_a_claim_a_failed_prepare_left_allocated_waits_for_containers_on_its_cpus() {
    let h = Harness::new();
    h.claims.insert(claim("c1", "pod-db", 2));
    let m = h.ready(TestPolicy::new(8), &[]).await;

    // Container a of another pod: created on every CPU, not started yet.
    h.runtime.creating("a");
    let created_on = m
        .create_container(&container("a", "pod-web"))
        .await
        .unwrap()
        .adjustment
        .cpus
        .unwrap();
    h.runtime.created("a", Some(&created_on));
    assert_eq!(created_on, set("0-7"));

    // The first prepare moves a off the claim's CPUs and waits for the runtime to start it; it
    // never does in time. The rollback cannot tell whether a spec is on disk.
    h.faults.arm(Point::SpecCheck, Fault::Fail, Some(1));
    let err = prepare_error(&m, "c1").await;
    assert!(
        err.contains("has not finished creating and starting")
            && err.contains("its spec may be on disk"),
        "{err}"
    );
    assert!(
        m.claim_record("c1").await.is_some(),
        "the claim stays allocated"
    );

    // The kubelet retries while a still runs on every CPU.
    let err = prepare_error(&m, "c1").await;
    assert!(
        err.contains("updating containers") && err.contains("\"a\""),
        "a retry answered without waiting for a, which runs on {:?}: {err}",
        h.runtime.cpus("a")
    );
    assert!(
        h.specs().is_empty(),
        "no spec for a claim a container runs on"
    );

    // Once the runtime has started a, the update reaches it, and the retry is granted.
    h.runtime.started("a");
    m.container_started(&container("a", "pod-web")).await;
    let answers = m.prepare(&[claim_ref("c1")]).await.unwrap();
    assert!(answers["c1"].is_ok(), "{answers:?}");
    let claimed = granted(&h, "c1");
    let a_runs_on = set(&h.runtime.cpus("a").unwrap());
    assert!(
        !a_runs_on.intersects(&claimed),
        "claim granted {claimed} while a runs on {a_runs_on}"
    );
}

/// A container created while a claim is prepared, the claim's allocation taking the lock
/// between the container's placement and the end of its event (here while a policy with
/// durable per-container state saves it). Before the fix, the container was placed under one
/// lock and noted as being created under a second: the claim, allocated in between, found it
/// nowhere and not being created, sent its update into the gap in which the runtime does not
/// know it (skipped, reported applied), and was answered OK while the container was created on
/// its CPUs.
#[tokio::test(start_paused = true)]
async fn a_claim_prepared_while_a_container_is_created_waits_until_it_has_moved() {
    let h = Harness::new();
    h.faults.run_inline();
    h.claims.insert(claim("c1", "pod-db", 2));
    let policy = TestPolicy {
        durable_containers: true,
        ..TestPolicy::new(8)
    };
    let m = Arc::new(h.ready(policy, &[]).await);
    let retries = tokio::spawn({
        let m = m.clone();
        async move { m.run_retries().await }
    });

    // The container's event saves the policy's state, slowly: the claim gets the lock meanwhile.
    h.faults.arm(
        Point::StateSave,
        Fault::Delay(std::time::Duration::from_secs(1)),
        Some(1),
    );
    let h = Arc::new(h);
    let create = tokio::spawn({
        let (h, m) = (h.clone(), m.clone());
        async move { create_and_start(&h, &m, "a", "pod-web").await }
    });
    let prepare = tokio::spawn({
        let m = m.clone();
        async move { m.prepare(&[claim_ref("c1")]).await.unwrap() }
    });

    let created_on = create.await.unwrap();
    let answers = prepare.await.unwrap();
    retries.abort();
    assert_eq!(created_on, set("0-7"), "created before the claim took CPUs");
    let answer = answers["c1"].as_ref();
    assert!(answer.is_ok(), "{answers:?}");
    let claimed = granted(&h, "c1");
    let a_runs_on = set(&h.runtime.cpus("a").unwrap());
    assert!(
        !a_runs_on.intersects(&claimed),
        "claim answered OK with {claimed} while a runs on {a_runs_on}"
    );
}

/// A container the runtime created while the agent synchronized and left out of the
/// Synchronize, as CRI-O does, which it announces (PostCreateContainer) and starts later. Once
/// announced it is placed as the Synchronize would have placed it, and a claim that would take
/// CPUs it runs on (every CPU: the runtime created it as the kubelet asked) waits for its start
/// and its move, and fails naming it if the runtime never starts it. Before, the agent only noted
/// its start: the claim was granted while the container ran on its CPUs, for good.
#[tokio::test(start_paused = true)]
async fn a_claim_waits_for_a_container_the_synchronize_did_not_list() {
    let h = Harness::new();
    h.claims.insert(claim("c1", "pod-db", 2));
    // The runtime creates `late` while the agent synchronizes: on every CPU (no cpuset of
    // ours, so the runtime reports none), not in the Synchronize's list.
    h.runtime.creating("late");
    h.runtime.created("late", Some(&set("0-7")));
    let m = h.ready(TestPolicy::new(8), &[]).await;
    let late = container("late", "pod-web");
    m.container_created(&late).await;
    m.deliver().await.unwrap();
    assert!(
        h.runtime.state.lock().unwrap().calls.is_empty(),
        "nothing is sent to a container the runtime has not started"
    );

    let err = prepare_error(&m, "c1").await;
    assert!(
        err.contains("has not finished creating and starting") && err.contains("\"late\""),
        "the claim answered without waiting for late, which runs on {:?}: {err}",
        h.runtime.cpus("late")
    );
    assert!(h.specs().is_empty(), "no spec for a claim late runs on");

    h.runtime.started("late");
    m.container_started(&late).await;
    let answers = m.prepare(&[claim_ref("c1")]).await.unwrap();
    assert!(answers["c1"].is_ok(), "{answers:?}");
    let claimed = granted(&h, "c1");
    let late_runs_on = set(&h.runtime.cpus("late").unwrap());
    assert!(
        !late_runs_on.intersects(&claimed),
        "claim granted {claimed} while late runs on {late_runs_on}"
    );
}

/// Such a container whose PostCreateContainer missed the agent (CRI-O inserts a plugin into
/// its list a moment after synchronizing it): its start is the first the agent hears of it, and
/// its update goes out from the background, to the running container.
#[tokio::test(start_paused = true)]
async fn a_container_the_synchronize_did_not_list_is_placed_when_it_starts() {
    let h = Harness::new();
    h.claims.insert(claim("c1", "pod-db", 2));
    let m = h.ready(TestPolicy::new(8), &[]).await;
    assert!(m.prepare(&[claim_ref("c1")]).await.unwrap()["c1"].is_ok());
    let claimed = granted(&h, "c1");
    h.runtime.creating("late");
    h.runtime.created("late", Some(&set("0-7")));
    h.runtime.started("late");
    let late = container("late", "pod-web");
    m.container_started(&late).await;
    assert_eq!(
        m.pending_updates().await,
        1,
        "its update waits for the background"
    );
    m.deliver().await.unwrap();
    let late_runs_on = set(&h.runtime.cpus("late").unwrap());
    assert_eq!(late_runs_on, set("0-7").difference(&claimed));
}
