//! The claim lifecycle when calls overlap, a container never updates, or the disk stalls: what
//! the kubelet's concurrent calls (one per pod, a shared claim prepared by each of its pods, a
//! retry overlapping the call still in flight) and a slow runtime or disk do to the answers and
//! to what is on disk.
//!
//! Overlap is made deterministic by holding the fake runtime's `UpdateContainers` calls
//! ([`FakeRuntime::hold`]): a call stays in flight, as a real runtime's round trip does, while
//! the test starts other calls and events.

use std::{sync::Arc, time::Duration};

use integration_tests::{
    fakes::{
        Harness, TWO_NUMA, TestPolicy, claim, claim_on, claim_ref, container, prepare_error,
        topology_aware, topology_aware_with,
    },
    faults::{Fault, Point},
};
use policy::{CpuSet, QosClass, Resources};
use resmgr::Manager;

/// The real policy on [`TWO_NUMA`], with Guaranteed containers on CPUs of their own and CPUs 4-7
/// (numa0) set aside for claims, lent to the shared pool while unclaimed.
fn partitioned() -> Box<dyn policy::Policy> {
    use policy::topology_aware::{ClaimCpus, Exclusivity};
    topology_aware_with(
        TWO_NUMA,
        Exclusivity::Partition(ClaimCpus::Set("4-7".parse().unwrap())),
    )
}

/// A running container of pod `pod` on `cpus`, as Synchronize reports it.
fn running(id: &str, pod: &str, cpus: &str) -> policy::Container {
    policy::Container {
        cpus: Some(cpus.parse().unwrap()),
        ..container(id, pod)
    }
}

/// A Guaranteed container of `cpus` whole CPUs.
fn exclusive(id: &str, pod: &str, cpus: u64) -> policy::Container {
    let mut c = container(id, pod);
    c.pod.qos = QosClass::Guaranteed;
    c.resources = Resources {
        cpu_request_milli: cpus * 1000,
        cpu_limit_milli: Some(cpus * 1000),
        ..Resources::default()
    };
    c
}

/// An exclusive one-CPU container running on CPU 15 (numa1).
fn batch_on_15() -> policy::Container {
    policy::Container {
        cpus: Some("15".parse().unwrap()),
        ..exclusive("batch", "pod-batch", 1)
    }
}

fn spawn_prepare(
    m: &Arc<Manager>,
    uid: &str,
) -> tokio::task::JoinHandle<Result<Vec<resmgr::state::DeviceRecord>, resmgr::LifecycleError>> {
    let m = m.clone();
    let uid = uid.to_owned();
    tokio::spawn(async move {
        m.prepare(&[claim_ref(&uid)])
            .await
            .unwrap()
            .remove(&uid)
            .unwrap()
    })
}

#[tokio::test]
async fn concurrent_prepares_of_different_claims_all_succeed() {
    // Nine shared containers; four one-CPU claims prepared at once. Each allocation records a
    // newer version of every shared container while the first delivery is in flight.
    let h = Harness::new();
    let containers: Vec<_> = (0..9)
        .map(|i| container(&format!("web-{i}"), "pod-web"))
        .collect();
    for k in 1..=4 {
        h.claims
            .insert(claim(&format!("k{k}"), &format!("pod-{k}"), 1));
    }
    let m = Arc::new(h.ready(TestPolicy::new(16), &containers).await);

    let held = h.runtime.hold.lock().await;
    let prepares: Vec<_> = (1..=4)
        .map(|k| spawn_prepare(&m, &format!("k{k}")))
        .collect();
    h.runtime.call_arrives().await; // the first delivery is in flight
    drop(held);
    for (k, p) in (1..=4).zip(prepares) {
        let answer = p.await.unwrap();
        assert!(answer.is_ok(), "k{k}: {answer:?}");
    }
    assert_eq!(h.specs(), ["k1", "k2", "k3", "k4"]);
    assert_eq!(m.pending_updates().await, 0);
    for c in &containers {
        assert_eq!(h.runtime.cpus(&c.id).as_deref(), Some("0-11"), "{}", c.id);
    }
}

#[tokio::test]
async fn an_nri_reply_during_a_prepares_delivery_does_not_fail_it() {
    let h = Harness::new();
    h.claims.insert(claim_on("c1", "pod-db", "numa0", 1));
    let m = Arc::new(
        h.ready_with(partitioned(), &[running("web", "pod-web", "1-7")])
            .await,
    );

    let held = h.runtime.hold.lock().await;
    let prepare = spawn_prepare(&m, "c1");
    h.runtime.call_arrives().await; // web's shrink for the claim is in flight
    // An exclusive container created meanwhile shrinks web again, in its reply.
    let batch = m
        .create_container(&exclusive("batch", "pod-batch", 1))
        .await
        .unwrap();
    assert!(
        batch.updates.iter().any(|u| u.container_id == "web"),
        "the reply must update web for this test to mean anything: {batch:?}"
    );
    h.runtime.apply_reply(&batch.updates);
    drop(held);

    let answer = prepare.await.unwrap();
    assert!(answer.is_ok(), "{answer:?}");
    // The reply's value is asserted again after the older delivery, and then delivered.
    m.deliver().await.unwrap();
    assert_eq!(m.pending_updates().await, 0);
    let web: CpuSet = h.runtime.cpus("web").unwrap().parse().unwrap();
    let granted = batch.adjustment.cpus.unwrap();
    assert!(!web.intersects(&granted), "web {web}, batch {granted}");
}

#[tokio::test]
async fn a_prepare_that_fails_after_another_prepare_of_the_claim_answered_ok_keeps_the_claim() {
    // Two pods sharing a new claim prepare it at once. The second one's commit fails on an
    // update that is none of its business; it must not release what the first answered OK.
    let h = Harness::new();
    h.claims.insert(claim_on("c1", "pod-db", "numa0", 1));
    let m = Arc::new(
        h.ready_with(
            partitioned(),
            &[
                running("web0", "pod-web", "1-7"),
                running("web1", "pod-web", "8-14"),
                batch_on_15(),
            ],
        )
        .await,
    );

    let held = h.runtime.hold.lock().await;
    let first = spawn_prepare(&m, "c1");
    let second = spawn_prepare(&m, "c1");
    h.runtime.call_arrives().await; // the first prepare's delivery is in flight
    // Meanwhile a container on the other NUMA node goes, and its neighbour's growth is refused.
    m.remove_container(&batch_on_15()).await;
    assert_eq!(
        m.pending_updates().await,
        2,
        "web0 shrinking for the claim (in flight), web1 growing onto CPU 15"
    );
    h.runtime.state.lock().unwrap().refuse.insert("web1".into());
    drop(held);

    let first = first.await.unwrap();
    let second = second.await.unwrap();
    assert!(first.is_ok(), "{first:?}");
    assert_eq!(
        (h.saved_claims(), h.specs()),
        (vec!["c1".to_owned()], vec!["c1".to_owned()]),
        "the claim answered OK is held and its spec accounted for; second: {second:?}"
    );
    assert_eq!(
        second.unwrap(),
        first.unwrap(),
        "web1 is not the claim's business"
    );
}

#[tokio::test]
async fn a_spec_write_failing_for_the_second_of_two_prepares_keeps_the_claim() {
    let h = Harness::new();
    h.claims.insert(claim("c1", "pod-db", 2));
    let m = Arc::new(
        h.ready(TestPolicy::new(8), &[container("a", "pod-web")])
            .await,
    );
    let held = h.runtime.hold.lock().await;
    let first = spawn_prepare(&m, "c1");
    let second = spawn_prepare(&m, "c1");
    h.runtime.call_arrives().await;
    // The first spec write succeeds, the second fails.
    h.faults
        .arm_after(Point::SpecWrite, 1, Fault::Fail, Some(1));
    drop(held);
    assert!(first.await.unwrap().is_ok());
    let err = stdx::errors::chain(&second.await.unwrap().unwrap_err());
    assert!(
        err.contains("writing the CDI spec")
            && err.contains("(the claim stays allocated: it was prepared before)"),
        "{err}"
    );
    assert_eq!(h.specs(), ["c1"]);
    assert_eq!(h.saved_claims(), ["c1"]);
    assert_eq!(h.runtime.cpus("a").as_deref(), Some("0-5"));
}

#[tokio::test]
async fn a_spec_that_landed_before_its_write_failed_is_removed_before_the_claim_is_released() {
    let h = Harness::new();
    h.claims.insert(claim("c1", "pod-db", 2));
    let m = h
        .ready(TestPolicy::new(8), &[container("a", "pod-web")])
        .await;

    // The rename happened, the directory's fsync failed.
    h.faults.arm(Point::SpecWritten, Fault::Fail, Some(1));
    let err = prepare_error(&m, "c1").await;
    assert!(
        err.contains("writing the CDI spec (the allocation was rolled back): syncing directory"),
        "{err}"
    );
    assert!(h.specs().is_empty() && h.saved_claims().is_empty());
    assert_eq!(h.runtime.cpus("a").as_deref(), Some("0-7"));

    // If the spec cannot be removed either, it stays accounted for.
    h.faults.arm(Point::SpecWritten, Fault::Fail, Some(1));
    h.faults.arm(Point::SpecRemove, Fault::Fail, Some(1));
    let err = prepare_error(&m, "c1").await;
    assert!(
        err.contains("the claim stays allocated: its spec may be on disk (removing cdi spec in"),
        "{err}"
    );
    assert_eq!(h.specs(), ["c1"]);
    assert_eq!(h.saved_claims(), ["c1"]);
    assert_eq!(h.runtime.cpus("a").as_deref(), Some("0-5"));
    // The kubelet's retry finishes it.
    assert!(m.prepare(&[claim_ref("c1")]).await.unwrap()["c1"].is_ok());
}

#[tokio::test]
async fn a_container_the_runtime_refuses_holds_back_only_claims_on_cpus_it_may_run_on() {
    let h = Harness::new();
    h.claims.insert(claim_on("c1", "pod-db", "numa1", 1));
    h.claims.insert(claim_on("c2", "pod-db", "numa0", 1));
    let m = h
        .ready_with(
            topology_aware(TWO_NUMA),
            &[
                running("web", "pod-web", "1-7"),
                running("stuck", "pod-stuck", "8-15"),
            ],
        )
        .await;
    // The container exited, and neither StopContainer nor RemoveContainer reached us.
    h.runtime
        .state
        .lock()
        .unwrap()
        .refuse
        .insert("stuck".into());

    // A claim on its CPUs must wait: it may still run there.
    let err = prepare_error(&m, "c1").await;
    assert!(
        err.contains(
            r#"updating containers (the allocation was rolled back): 1 container update(s) not delivered: the runtime refused"#
        ),
        "{err}"
    );
    assert_eq!(m.pending_updates().await, 1, "stuck's update is pending");

    // A claim elsewhere goes ahead; stuck's update keeps waiting in the background.
    let answer = m
        .prepare(&[claim_ref("c2")])
        .await
        .unwrap()
        .remove("c2")
        .unwrap();
    assert!(answer.is_ok(), "{answer:?}");
    assert_eq!(h.specs(), ["c2"]);
    assert_eq!(m.pending_updates().await, 1);

    h.runtime.state.lock().unwrap().refuse.clear();
    m.deliver().await.unwrap();
    assert_eq!(m.pending_updates().await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn runtime_events_are_answered_while_a_save_is_stuck_on_the_disk() {
    // One runtime thread: if the stuck save ran on it, or held the manager lock, the event
    // below could not be answered.
    let h = Harness::new();
    h.claims.insert(claim_on("c1", "pod-db", "numa0", 1));
    let m = Arc::new(
        h.ready_with(
            topology_aware(TWO_NUMA),
            &[running("web", "pod-web", "1-7")],
        )
        .await,
    );
    h.faults.arm(Point::StateSave, Fault::Block, Some(1));
    let prepare = spawn_prepare(&m, "c1");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while h.faults.blocked() == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the prepare never reached its save"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }

    // A deadlock detector, not a clock: if the event cannot be answered while the save is
    // stuck, the save is let go after a while so that the test fails instead of hanging.
    drop(std::thread::spawn({
        let faults = h.faults.clone();
        move || {
            std::thread::sleep(Duration::from_secs(10));
            faults.unblock();
        }
    }));
    let faults = h.faults.clone();
    let created = tokio::spawn({
        let m = m.clone();
        async move {
            let answer = m.create_container(&container("web2", "pod-web")).await;
            (answer, faults.blocked())
        }
    });
    let (created, still_stuck) = created.await.unwrap();
    h.faults.unblock();
    let answer = prepare.await.unwrap();
    assert_eq!(
        still_stuck, 1,
        "an NRI event waited for a save stuck on the disk"
    );
    assert!(created.is_ok());
    assert!(answer.is_ok(), "the save went on: {answer:?}");
}

#[tokio::test(start_paused = true)]
async fn a_slow_disk_delays_claims_but_no_runtime_event() {
    let h = Harness::new();
    h.claims.insert(claim_on("c1", "pod-db", "numa0", 1));
    let m = Arc::new(
        h.ready_with(
            topology_aware(TWO_NUMA),
            &[running("web", "pod-web", "1-7")],
        )
        .await,
    );
    h.faults.arm(
        Point::StateSave,
        Fault::Delay(Duration::from_secs(60)),
        Some(1),
    );
    let start = tokio::time::Instant::now();
    let prepare = spawn_prepare(&m, "c1");
    // Until the prepare has allocated and is saving (bounded: yielding does not move the
    // paused clock, so a prepare that never allocates would spin here for ever).
    let mut turns = 0;
    while m.claim_record("c1").await.is_none() {
        turns += 1;
        assert!(turns < 10_000, "the prepare never allocated");
        tokio::task::yield_now().await;
    }
    let placed = m
        .create_container(&container("web2", "pod-web"))
        .await
        .unwrap();
    assert!(placed.adjustment.cpus.is_some());
    assert_eq!(
        start.elapsed(),
        Duration::ZERO,
        "the event waited for the disk"
    );
    assert!(prepare.await.unwrap().is_ok());
    assert!(start.elapsed() >= Duration::from_secs(60));
}

#[tokio::test]
async fn a_claim_waits_for_a_container_that_may_still_run_on_its_cpus_though_no_longer_placed_there()
 {
    // Two sockets of one NUMA node each: numa0 is CPUs 0-7 (0 reserved), numa1 8-15.
    let h = Harness::new();
    h.claims.insert(claim_on("all0", "pod-a", "numa0", 7));
    h.claims.insert(claim_on("c1", "pod-db", "numa1", 3));
    let m = h
        .ready_with(
            topology_aware("pack:2 numa:1 core:4 pu:2"),
            &[running("web", "pod-web", "1-7")],
        )
        .await;
    // A claim takes all of numa0: web moves to numa1, and the runtime has that.
    assert!(m.prepare(&[claim_ref("all0")]).await.unwrap()["all0"].is_ok());
    assert_eq!(h.runtime.cpus("web").as_deref(), Some("8-15"));
    // The runtime stops taking web's updates; the claim goes, and web's move back is pending.
    h.runtime.state.lock().unwrap().refuse.insert("web".into());
    assert_eq!(
        m.unprepare(&[claim_ref("all0")]).await.unwrap()["all0"]
            .as_ref()
            .unwrap(),
        &()
    );
    assert_eq!(m.pending_updates().await, 1);

    // The policy no longer places web on numa1, but it still runs there: a claim on numa1 must
    // not be granted until web has moved.
    let err = prepare_error(&m, "c1").await;
    assert!(
        err.contains(
            "updating containers (the allocation was rolled back): 1 container update(s) not delivered"
        ),
        "{err}"
    );
    assert!(h.specs().is_empty());

    h.runtime.state.lock().unwrap().refuse.clear();
    assert!(m.prepare(&[claim_ref("c1")]).await.unwrap()["c1"].is_ok());
    assert_eq!(h.runtime.cpus("web").as_deref(), Some("1-7"));
}
