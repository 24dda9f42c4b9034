//! The claim lifecycle and the commit, end to end through the manager with a fake runtime, a fake
//! claim source and a small test policy: what prepare answers, what is on disk after each step
//! and each failure, what stays pending, the gate, and start-up reconciliation.

use std::fs;

use integration_tests::{
    fakes::{
        self as support, Harness, TWO_NUMA, TestPolicy, claim, claim_on, claim_ref, container,
        prepare_error, topology_aware,
    },
    faults::{Fault, Point},
};
use resmgr::{AdmitError, state::StateFile};

fn spec_path(h: &Harness, uid: &str) -> std::path::PathBuf {
    h.cdi_dir()
        .join(format!("{}-device_{uid}.json", support::DRIVER))
}

#[tokio::test]
async fn prepare_answers_each_result_in_order_and_grants_it_by_spec() {
    let h = Harness::new();
    let mut c = claim("c1", "pod-db", 2);
    c.results.push(policy::AllocationResult {
        request: "extra".into(),
        pool: "node-a".into(),
        device: "numa1".into(),
        share_id: None,
        consumed_capacity: [("cpu".to_owned(), policy::Quantity::from_units(1))].into(),
    });
    h.claims.insert(c);
    let m = h.ready(TestPolicy::new(8), &[]).await;

    let answers = m.prepare(&[claim_ref("c1")]).await.unwrap();
    let devices = answers["c1"].as_ref().unwrap();
    let summary: Vec<_> = devices
        .iter()
        .map(|d| {
            (
                d.request_names.clone(),
                d.pool.as_str(),
                d.device.as_str(),
                d.cdi_device_id.as_str(),
                d.share_id.as_deref(),
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            (
                vec!["cpus".to_owned()],
                "node-a",
                "numa0",
                "test.resmgr.io/device=claim-c1-0",
                Some("share-c1")
            ),
            (
                vec!["extra".to_owned()],
                "node-a",
                "numa1",
                "test.resmgr.io/device=claim-c1-1",
                None
            ),
        ]
    );
    assert_eq!(h.specs(), ["c1"]);
    assert_eq!(h.saved_claims(), ["c1"]);
    let spec = fs::read_to_string(spec_path(&h, "c1")).unwrap();
    assert!(spec.contains("DRA_CPUSET_c1=5-7"), "{spec}");
}

#[tokio::test(start_paused = true)]
async fn claims_are_held_until_the_synchronize_reply_is_out_and_refused_after_the_hold() {
    let h = Harness::new();
    // Disk work on the calling task: paused time does not run ahead while a save is on a
    // thread of the blocking pool.
    h.faults.run_inline();
    h.claims.insert(claim("c1", "pod-db", 2));
    let m = std::sync::Arc::new(h.start(TestPolicy::new(8)).unwrap());
    // Nothing synchronizes: held for HOLD, then refused, nothing allocated.
    let started = tokio::time::Instant::now();
    assert_eq!(
        m.prepare(&[claim_ref("c1")]).await.unwrap_err(),
        AdmitError::NotSynchronized
    );
    assert_eq!(started.elapsed(), resmgr::claims::HOLD);
    assert_eq!(
        m.unprepare(&[claim_ref("c1")]).await.unwrap_err(),
        AdmitError::NotSynchronized
    );
    assert!(h.specs().is_empty() && h.saved_claims().is_empty());

    // A prepare that arrives now is held while the runtime synchronizes, and served once the
    // Synchronize reply is out: not before.
    let started = tokio::time::Instant::now();
    let held = tokio::spawn({
        let m = m.clone();
        async move { m.prepare(&[claim_ref("c1")]).await }
    });
    tokio::task::yield_now().await;
    m.synchronize(&[container("a", "pod-web")]).await.unwrap();
    tokio::task::yield_now().await;
    assert!(
        !held.is_finished(),
        "served before the Synchronize reply was out"
    );
    assert!(!m.gate().is_open());
    assert!(h.specs().is_empty(), "allocated while held");
    m.synchronized().await;
    assert!(m.gate().is_open());
    let answers = held.await.unwrap().unwrap();
    assert!(answers["c1"].is_ok(), "{answers:?}");
    assert!(
        started.elapsed() < resmgr::claims::HOLD,
        "the held call waited out its hold"
    );
    assert!(h.specs() == ["c1"] && h.saved_claims() == ["c1"]);
}

#[tokio::test]
async fn a_malformed_uid_fails_the_whole_request_and_touches_nothing() {
    let h = Harness::new();
    let m = h.ready(TestPolicy::new(8), &[]).await;
    for uid in ["", "../../etc/passwd", "a/b", "x\0y", "has space"] {
        let err = m
            .prepare(&[claim_ref("ok"), claim_ref(uid)])
            .await
            .unwrap_err();
        assert!(
            matches!(&err, AdmitError::InvalidArgument(m) if m.contains("claim uid")),
            "{uid:?}: {err}"
        );
        let err = m.unprepare(&[claim_ref(uid)]).await.unwrap_err();
        assert!(matches!(err, AdmitError::InvalidArgument(_)), "{uid:?}");
    }
    assert!(!h.cdi_dir().exists() && !StateFile::new(h.state_dir()).path().exists());
}

#[tokio::test]
async fn each_claim_of_a_batch_is_answered_on_its_own() {
    let h = Harness::new();
    h.claims.insert(claim("good", "pod-db", 2));
    h.claims.insert(claim("huge", "pod-db", 100));
    let m = h.ready(TestPolicy::new(8), &[]).await;
    let answers = m
        .prepare(&[claim_ref("good"), claim_ref("missing"), claim_ref("huge")])
        .await
        .unwrap();
    assert!(answers["good"].is_ok());
    let missing = stdx::errors::chain(answers["missing"].as_ref().unwrap_err());
    assert!(
        missing.starts_with("claim default/claim-missing (uid missing): reading the claim: resource claim default/claim-missing (uid missing) not found"),
        "{missing}"
    );
    let huge = stdx::errors::chain(answers["huge"].as_ref().unwrap_err());
    assert!(
        huge.contains("(uid huge): allocating: claim huge does not fit: needs 100 CPUs"),
        "{huge}"
    );
    assert_eq!(h.specs(), ["good"]);
    assert_eq!(h.saved_claims(), ["good"]);
}

#[tokio::test]
async fn a_claim_without_our_results_is_an_empty_success() {
    let h = Harness::new();
    let mut c = claim("c1", "pod-db", 2);
    c.results.clear();
    h.claims.insert(c);
    let m = h.ready(TestPolicy::new(8), &[]).await;
    assert_eq!(
        m.prepare(&[claim_ref("c1")]).await.unwrap()["c1"]
            .as_ref()
            .unwrap(),
        &vec![]
    );
    assert!(h.specs().is_empty() && h.saved_claims().is_empty());
}

#[tokio::test]
async fn prepare_shrinks_the_shared_containers_before_the_spec_appears() {
    let h = Harness::new();
    h.claims.insert(claim("c1", "pod-db", 2));
    let m = h
        .ready(TestPolicy::new(8), &[container("a", "pod-web")])
        .await;
    assert_eq!(h.runtime.cpus("a").as_deref(), Some("0-7"));
    m.prepare(&[claim_ref("c1")]).await.unwrap()["c1"]
        .as_ref()
        .unwrap();
    assert_eq!(h.runtime.cpus("a").as_deref(), Some("0-5"));
    assert_eq!(m.pending_updates().await, 0);
}

#[tokio::test]
async fn a_failed_update_rolls_a_new_claim_back_and_keeps_the_updates_pending() {
    let h = Harness::new();
    h.claims.insert(claim("c1", "pod-db", 2));
    let m = h
        .ready(TestPolicy::new(8), &[container("a", "pod-web")])
        .await;
    h.runtime.state.lock().unwrap().fail_calls = 2; // the prepare's delivery, then the rollback's
    let err = prepare_error(&m, "c1").await;
    assert!(
        err.contains(
            "updating containers (the allocation was rolled back): 1 container update(s) not delivered: the runtime refused"
        ),
        "{err}"
    );
    assert!(h.specs().is_empty() && h.saved_claims().is_empty());
    assert_eq!(
        m.pending_updates().await,
        1,
        "a's update (back to all CPUs) is pending"
    );
    m.deliver().await.unwrap();
    assert_eq!(m.pending_updates().await, 0);
    let last = h
        .runtime
        .state
        .lock()
        .unwrap()
        .calls
        .last()
        .cloned()
        .unwrap();
    assert_eq!(last.len(), 1);
    assert_eq!(
        (
            last[0].container_id.as_str(),
            last[0].cpus.as_ref().unwrap().to_string()
        ),
        ("a", "0-7".into())
    );
}

#[tokio::test]
async fn a_failed_state_save_rolls_a_new_claim_back() {
    let h = Harness::new();
    h.claims.insert(claim("c1", "pod-db", 2));
    let m = h
        .ready(TestPolicy::new(8), &[container("a", "pod-web")])
        .await;
    h.break_state_saves();
    let err = prepare_error(&m, "c1").await;
    h.mend_state_saves();
    assert!(
        err.contains(
            "saving the state (the allocation was rolled back in memory; saving that failed): saving state file"
        ),
        "{err}"
    );
    assert!(h.specs().is_empty() && h.saved_claims().is_empty());
    assert_eq!(
        h.runtime.cpus("a").as_deref(),
        Some("0-7"),
        "nothing reached the runtime"
    );

    assert!(
        m.prepare(&[claim_ref("c1")]).await.unwrap()["c1"].is_ok(),
        "the retry succeeds"
    );
}

#[tokio::test]
async fn a_failed_spec_write_rolls_a_new_claim_back() {
    let h = Harness::new();
    h.claims.insert(claim("bad1", "pod-db", 2));
    let m = h
        .ready(TestPolicy::new(8), &[container("a", "pod-web")])
        .await;
    let err = prepare_error(&m, "bad1").await;
    assert!(
        err.contains(
            "writing the CDI spec (the allocation was rolled back): the cdi spec for claim bad1 would be invalid"
        ),
        "{err}"
    );
    assert!(h.saved_claims().is_empty() && h.specs().is_empty());
    let calls = h.runtime.state.lock().unwrap().calls.clone();
    let a: Vec<String> = calls
        .iter()
        .flatten()
        .map(|u| u.cpus.as_ref().unwrap().to_string())
        .collect();
    assert_eq!(
        a,
        ["0-5", "0-7"],
        "a shrank for the claim, then got its CPUs back"
    );
}

#[tokio::test]
async fn a_failed_re_prepare_keeps_the_allocation() {
    let h = Harness::new();
    h.claims.insert(claim("c1", "pod-db", 2));
    let m = h
        .ready(TestPolicy::new(8), &[container("a", "pod-web")])
        .await;
    let first = m.prepare(&[claim_ref("c1")]).await.unwrap()["c1"]
        .as_ref()
        .unwrap()
        .clone();

    // A re-prepare changes nothing durable: a state directory that takes no writes does not
    // fail it.
    h.break_state_saves();
    assert_eq!(
        m.prepare(&[claim_ref("c1")]).await.unwrap()["c1"]
            .as_ref()
            .unwrap(),
        &first.clone()
    );
    h.mend_state_saves();

    h.faults.arm(Point::SpecWrite, Fault::Fail, Some(1));
    let err = prepare_error(&m, "c1").await;
    assert!(err.contains("writing the CDI spec"), "{err}");
    assert!(
        err.contains("(the claim stays allocated: it was prepared before)"),
        "{err}"
    );
    assert_eq!(h.specs(), ["c1"]);
    assert_eq!(h.saved_claims(), ["c1"]);
    assert_eq!(
        h.runtime.cpus("a").as_deref(),
        Some("0-5"),
        "a still shares only the rest"
    );

    assert_eq!(
        m.prepare(&[claim_ref("c1")]).await.unwrap()["c1"]
            .as_ref()
            .unwrap(),
        &first
    );
}

#[tokio::test]
async fn re_prepare_rewrites_a_spec_a_reboot_removed() {
    let h = Harness::new();
    h.claims.insert(claim("c1", "pod-db", 2));
    let m = h.ready(TestPolicy::new(8), &[]).await;
    m.prepare(&[claim_ref("c1")]).await.unwrap()["c1"]
        .as_ref()
        .unwrap();
    let before = fs::read(spec_path(&h, "c1")).unwrap();
    fs::remove_file(spec_path(&h, "c1")).unwrap();
    m.prepare(&[claim_ref("c1")]).await.unwrap()["c1"]
        .as_ref()
        .unwrap();
    assert_eq!(
        fs::read(spec_path(&h, "c1")).unwrap(),
        before,
        "same claim, same CPUs, same spec"
    );
}

#[tokio::test]
async fn unprepare_removes_the_spec_releases_and_commits() {
    let h = Harness::new();
    h.claims.insert(claim("c1", "pod-db", 2));
    let m = h
        .ready(TestPolicy::new(8), &[container("a", "pod-web")])
        .await;
    m.prepare(&[claim_ref("c1")]).await.unwrap()["c1"]
        .as_ref()
        .unwrap();
    assert_eq!(
        m.unprepare(&[claim_ref("c1")]).await.unwrap()["c1"]
            .as_ref()
            .unwrap(),
        &()
    );
    assert!(h.specs().is_empty() && h.saved_claims().is_empty());
    assert_eq!(h.runtime.cpus("a").as_deref(), Some("0-7"));
    assert_eq!(m.claim_record("c1").await, None);
    // Unknown claims, and a second unprepare, are success.
    let again = m
        .unprepare(&[claim_ref("c1"), claim_ref("never-seen")])
        .await
        .unwrap();
    assert!(again.values().all(Result::is_ok));
}

#[tokio::test]
async fn an_unprepare_whose_updates_fail_succeeds_and_leaves_them_pending() {
    let h = Harness::new();
    h.claims.insert(claim("c1", "pod-db", 2));
    let m = h
        .ready(TestPolicy::new(8), &[container("a", "pod-web")])
        .await;
    m.prepare(&[claim_ref("c1")]).await.unwrap()["c1"]
        .as_ref()
        .unwrap();
    h.runtime.state.lock().unwrap().fail_calls = 1;
    assert_eq!(
        m.unprepare(&[claim_ref("c1")]).await.unwrap()["c1"]
            .as_ref()
            .unwrap(),
        &()
    );
    assert!(h.saved_claims().is_empty(), "the release is committed");
    assert_eq!(m.pending_updates().await, 1);
    assert_eq!(h.runtime.cpus("a").as_deref(), Some("0-5"));
    m.deliver().await.unwrap();
    assert_eq!(h.runtime.cpus("a").as_deref(), Some("0-7"));
}

#[tokio::test]
async fn one_container_the_runtime_refuses_does_not_hold_back_the_others() {
    let h = Harness::new();
    h.claims.insert(claim("c1", "pod-db", 2));
    let m = h
        .ready(
            TestPolicy::new(8),
            &[container("a", "pod-web"), container("b", "pod-web")],
        )
        .await;
    h.runtime.state.lock().unwrap().refuse.insert("a".into());
    let err = prepare_error(&m, "c1").await;
    assert!(err.contains("updating containers"), "{err}");
    assert_eq!(
        h.runtime.cpus("b").as_deref(),
        Some("0-7"),
        "b got its shrink and then its rollback"
    );
    assert_eq!(m.pending_updates().await, 1, "only a is still pending");
}

#[tokio::test]
async fn a_delivery_fails_naming_exactly_the_containers_the_runtime_refused() {
    let h = Harness::new();
    h.claims.insert(claim("c1", "pod-db", 2));
    let web = [
        container("a", "pod-web"),
        container("b", "pod-web"),
        container("c", "pod-web"),
    ];
    let m = h.ready(TestPolicy::new(8), &web).await;
    assert!(m.prepare(&[claim_ref("c1")]).await.unwrap()["c1"].is_ok());
    let refuse = |ids: &[&str]| {
        let mut s = h.runtime.state.lock().unwrap();
        s.refuse = ids.iter().map(|id| (*id).to_owned()).collect();
    };
    let calls = || h.runtime.state.lock().unwrap().calls.len();
    // The release's growth back onto the claim's CPUs: the runtime refuses a's and b's.
    refuse(&["a", "b"]);
    assert_eq!(
        m.unprepare(&[claim_ref("c1")]).await.unwrap()["c1"]
            .as_ref()
            .unwrap(),
        &()
    );
    assert_eq!(m.pending_updates().await, 2, "a and b");

    // The batch is refused, and so is each update on its own.
    let err = m.deliver().await.unwrap_err();
    assert_eq!(err.containers, ["a".to_owned(), "b".to_owned()].into());
    // Only a's is refused: b's goes through on its own.
    refuse(&["a"]);
    let err = m.deliver().await.unwrap_err();
    assert_eq!(err.containers, ["a".to_owned()].into(), "{err}");
    assert_eq!(h.runtime.cpus("b").as_deref(), Some("0-7"));
    // A lone update the runtime refuses is not sent a second time on its own.
    let before = calls();
    let err = m.deliver().await.unwrap_err();
    assert_eq!(err.containers, ["a".to_owned()].into());
    assert_eq!(calls(), before + 1);

    refuse(&[]);
    m.deliver().await.unwrap();
    assert_eq!(m.pending_updates().await, 0);
    for c in &web {
        assert_eq!(h.runtime.cpus(&c.id).as_deref(), Some("0-7"), "{}", c.id);
    }
}

#[tokio::test]
async fn an_in_process_crash_at_a_crash_point_freezes_the_manager_there() {
    // What the randomized lifecycle test relies on to crash thousands of times in one process:
    // armed at a crash point of the lifecycle, the manager stops there as a dead process would.
    let h = Harness::new();
    h.claims.insert(claim("c1", "pod-db", 2));
    let web = [container("a", "pod-web")];
    let m = h.ready(TestPolicy::new(8), &web).await;
    let calls = h.runtime.state.lock().unwrap().calls.len();
    h.faults.arm(Point::PrepareSaved, Fault::Crash, Some(1));
    assert!(m.prepare(&[claim_ref("c1")]).await.unwrap()["c1"].is_err());
    assert_eq!(h.faults.crashed_at(), Some(Point::PrepareSaved));
    // The claim was saved; after the crash nothing reached the runtime or the spec directory.
    assert_eq!(h.saved_claims(), ["c1"]);
    assert!(h.specs().is_empty());
    assert_eq!(h.runtime.state.lock().unwrap().calls.len(), calls);
    assert_eq!(h.runtime.cpus("a").as_deref(), Some("0-7"));
    drop(m);

    // Restarted (with faults of its own: a crash stays), the kubelet's retry finishes it.
    let m = resmgr::Manager::start(
        resmgr::ManagerConfig::new(support::DRIVER),
        Box::new(TestPolicy::new(8)),
        StateFile::new(h.state_dir()),
        cdi::SpecStore::new(h.cdi_dir(), support::DRIVER).unwrap(),
        h.runtime.clone(),
        h.claims.clone(),
    )
    .unwrap();
    h.runtime.apply_reply(&m.synchronize(&web).await.unwrap());
    m.synchronized().await;
    assert!(m.prepare(&[claim_ref("c1")]).await.unwrap()["c1"].is_ok());
    assert_eq!(h.specs(), ["c1"]);
    assert_eq!(h.runtime.cpus("a").as_deref(), Some("0-5"));
}

/// A claim's container created while no agent was connected (the gap of a restart or a
/// handover), whose start is under way when the new agent synchronizes: the runtime lists it as
/// created, and drops the Synchronize reply's update of it (containerd writes it into the spec
/// the task was already made from). The agent holds the update until the container's
/// PostStartContainer and delivers it then. Before, it took the reply as the delivery, and the
/// container ran on every CPU, the shared ones included (seen in the cluster's helm upgrade
/// test: a claim pod on "0-1" with its claim holding "1").
#[tokio::test]
async fn a_container_started_while_the_agent_synchronizes_gets_its_update_once_running() {
    let h = Harness::new();
    h.claims.insert(claim("c1", "pod-db", 2));
    {
        let m = h.ready(TestPolicy::new(8), &[]).await;
        m.prepare(&[claim_ref("c1")]).await.unwrap()["c1"]
            .as_ref()
            .unwrap();
    }
    // No agent: the runtime creates the claim's container where the kubelet asked, and starts it.
    let mut db = container("db", "pod-db");
    db.cpus = Some("0-7".parse().unwrap());
    h.runtime.creating("db");
    h.runtime.created("db", db.cpus.as_ref());

    let m = h.start(TestPolicy::new(8)).unwrap();
    let updates = m
        .synchronize_starting(&[db.clone()], &["db"])
        .await
        .unwrap();
    assert!(
        updates.iter().any(|u| u.container_id == "db"),
        "the Synchronize reply does not move db: nothing to check ({updates:?})"
    );
    h.runtime.apply_reply(&updates);
    m.synchronized().await;
    assert_eq!(
        h.runtime.cpus("db").as_deref(),
        Some("0-7"),
        "the reply was dropped"
    );

    h.runtime.started("db");
    m.container_started(&db).await;
    m.deliver().await.unwrap();
    assert_eq!(
        h.runtime.cpus("db").as_deref(),
        Some("6-7"),
        "once running, the claim's container is on its claim's CPUs only"
    );
}

/// A resize of a container the agent never heard of (the runtime's Synchronize left it out,
/// and its earlier events missed the agent): the container is placed, and the reply carries its
/// update, last, as the runtime takes the last update of the reply for the container it
/// updates. Before, the policy did not know it and the runtime failed the kubelet's resize.
#[tokio::test]
async fn a_resize_of_a_container_the_synchronize_did_not_list_places_it() {
    let h = Harness::new();
    h.claims.insert(claim("c1", "pod-db", 2));
    let m = h.ready(TestPolicy::new(8), &[]).await;
    assert!(m.prepare(&[claim_ref("c1")]).await.unwrap()["c1"].is_ok());
    let late = container("late", "pod-web");
    let more = policy::Resources {
        cpu_request_milli: 500,
        ..policy::Resources::default()
    };
    let updates = m.update_container(&late, &more).await.unwrap();
    let last = updates.last().expect("an update of late");
    assert_eq!(last.container_id, "late");
    assert_eq!(last.cpus, Some("0-5".parse().unwrap()));
    // The runtime applies the update after the event, then says so: the agent holds it now,
    // and asserts what it placed it on.
    h.runtime.apply_reply(&updates);
    m.container_updated(&late).await;
    m.deliver().await.unwrap();
    assert_eq!(h.runtime.cpus("late").as_deref(), Some("0-5"));
    assert_eq!(m.pending_updates().await, 0);
}

#[tokio::test]
async fn restart_restores_claims_and_a_retried_unprepare_finishes_the_release() {
    let h = Harness::new();
    h.claims.insert(claim("c1", "pod-db", 2));
    {
        let m = h.ready(TestPolicy::new(8), &[]).await;
        m.prepare(&[claim_ref("c1")]).await.unwrap()["c1"]
            .as_ref()
            .unwrap();
    }
    // As if an unprepare crashed right after removing the spec.
    fs::remove_file(spec_path(&h, "c1")).unwrap();
    let m = h
        .ready(TestPolicy::new(8), &[container("a", "pod-web")])
        .await;
    assert_eq!(
        h.runtime.cpus("a").as_deref(),
        Some("0-5"),
        "the restored claim keeps its CPUs"
    );
    assert_eq!(
        m.unprepare(&[claim_ref("c1")]).await.unwrap()["c1"]
            .as_ref()
            .unwrap(),
        &()
    );
    assert!(h.saved_claims().is_empty());
    assert_eq!(h.runtime.cpus("a").as_deref(), Some("0-7"));
}

#[tokio::test]
async fn no_stray_spec_stops_start_up_and_nothing_is_deleted_before_the_runtime_says_who_runs() {
    let h = Harness::new();
    h.claims.insert(claim("c1", "pod-db", 2));
    {
        let m = h.ready(TestPolicy::new(8), &[]).await;
        m.prepare(&[claim_ref("c1")]).await.unwrap()["c1"]
            .as_ref()
            .unwrap();
    }
    let store = cdi::SpecStore::new(h.cdi_dir(), support::DRIVER).unwrap();
    let other = cdi::SpecStore::new(h.cdi_dir(), "other.vendor.io").unwrap();
    other
        .write_claim("theirs", &[cdi::ContainerEdits::with_env(["X=1".into()])])
        .unwrap();
    // Specs of ours the state does not account for (a restored backup of the state, say): one
    // the policy takes back, and one that does not parse.
    for uid in ["orphan", "garbled"] {
        store
            .write_claim(
                uid,
                &[cdi::ContainerEdits::with_env([format!(
                    "DRA_CPUSET_{uid}=2-3"
                )])],
            )
            .unwrap();
    }
    fs::write(spec_path(&h, "garbled"), b"{not json").unwrap();

    let m = h.start(TestPolicy::new(8)).unwrap();
    assert_eq!(
        h.specs(),
        ["c1", "garbled", "orphan"],
        "nothing is deleted before the runtime says who runs"
    );
    let updates = m.synchronize(&[]).await.unwrap();
    h.runtime.apply_reply(&updates);
    m.synchronized().await;
    assert!(m.gate().is_open(), "no stray keeps claims out");
    assert_eq!(
        h.specs(),
        ["c1", "orphan"],
        "the unreadable one nothing uses is set aside; the adopted one waits for the API server"
    );
    m.reconcile_once().await;
    assert_eq!(h.specs(), ["c1"], "not allocated here: swept");
    let aside = h.cdi_dir().join(format!(
        "{}-device_garbled.json.unreadable",
        support::DRIVER
    ));
    assert_eq!(
        fs::read(&aside).unwrap(),
        b"{not json",
        "set aside, not deleted"
    );
    assert_eq!(
        other.claims().unwrap().len(),
        1,
        "another vendor's spec is left alone"
    );
    let report = m.reconciliation().await;
    assert_eq!(report.counts[&resmgr::Outcome::Swept], 1);
    assert_eq!(report.counts[&resmgr::Outcome::SetAside], 1);
    assert_eq!(h.saved_claims(), ["c1"]);
}

#[tokio::test]
async fn start_up_removes_the_temporary_files_of_interrupted_state_saves() {
    let h = Harness::new();
    drop(h.ready(TestPolicy::new(8), &[]).await);
    fs::create_dir_all(h.state_dir()).unwrap();
    // What a crash during a save leaves: today's random names, and the fixed name of old builds.
    for name in [".state.json.a1b2c3.tmp", ".state.json.tmp"] {
        fs::write(h.state_dir().join(name), b"{").unwrap();
    }
    fs::write(h.state_dir().join("notes.txt"), b"not ours").unwrap();
    h.start(TestPolicy::new(8)).unwrap();
    let mut left: Vec<String> = fs::read_dir(h.state_dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    left.sort();
    left.retain(|n| n != "state.json" && n != ".lock");
    assert_eq!(left, ["notes.txt"]);
}

#[tokio::test]
async fn an_unreadable_state_stops_start_up_and_deletes_nothing() {
    let h = Harness::new();
    let store = cdi::SpecStore::new(h.cdi_dir(), support::DRIVER).unwrap();
    store
        .write_claim("c1", &[cdi::ContainerEdits::with_env(["X=1".into()])])
        .unwrap();
    fs::create_dir_all(h.state_dir()).unwrap();
    fs::write(StateFile::new(h.state_dir()).path(), b"{ truncated").unwrap();
    let err = h.start(TestPolicy::new(8)).unwrap_err().to_string();
    assert!(err.contains("is corrupt"), "{err}");
    assert_eq!(h.specs(), ["c1"]);
    assert_eq!(
        fs::read(StateFile::new(h.state_dir()).path()).unwrap(),
        b"{ truncated"
    );
}

#[tokio::test]
async fn runtime_events_are_served_while_a_delivery_waits_on_the_runtime() {
    // The runtime holds its lock while it waits for our answer to an event, and serves our
    // UpdateContainers under that lock. If a commit kept the manager lock while it waited for
    // UpdateContainers, the event below could not be answered until the runtime timed us out.
    let h = Harness::new();
    h.claims.insert(claim("c1", "pod-db", 2));
    let runtime = std::sync::Arc::new(support::StalledRuntime::default());
    let m = std::sync::Arc::new(
        resmgr::Manager::start(
            resmgr::ManagerConfig::new(support::DRIVER),
            Box::new(TestPolicy::new(8)),
            StateFile::new(h.state_dir()),
            cdi::SpecStore::new(h.cdi_dir(), support::DRIVER).unwrap(),
            runtime.clone(),
            h.claims.clone(),
        )
        .unwrap(),
    );
    m.synchronize(&[container("a", "pod-web")]).await.unwrap();
    m.synchronized().await;
    let called = runtime.called.notified();
    let prepare = tokio::spawn({
        let m = m.clone();
        async move { m.prepare(&[claim_ref("c1")]).await }
    });
    // The prepare's delivery is now stuck in the runtime (bounded: a prepare that never
    // delivers fails the test rather than hanging it).
    tokio::time::timeout(std::time::Duration::from_secs(30), called)
        .await
        .expect("the prepare's delivery never reached the runtime");

    let created = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        m.create_container(&container("b", "pod-web")),
    )
    .await
    .expect("an event handler waited for a delivery in flight");
    assert!(created.is_ok());

    runtime.release.notify_one();
    let answers = prepare.await.unwrap().unwrap();
    assert!(answers["c1"].is_ok(), "{:?}", answers["c1"]);
}

#[tokio::test]
async fn the_claim_records_list_every_prepared_claim_as_it_was_answered() {
    // What /debug/state shows.
    let h = Harness::new();
    h.claims.insert(claim("c1", "pod-db", 2));
    h.claims.insert(claim("c2", "pod-db", 1));
    let m = h.ready(TestPolicy::new(8), &[]).await;
    assert!(m.claim_records().await.is_empty());
    let answers = m
        .prepare(&[claim_ref("c1"), claim_ref("c2")])
        .await
        .unwrap();
    let records = m.claim_records().await;
    assert_eq!(records.keys().collect::<Vec<_>>(), ["c1", "c2"]);
    for (uid, record) in &records {
        assert_eq!(&record.devices, answers[uid].as_ref().unwrap(), "{uid}");
        assert_eq!(
            (record.namespace.as_str(), record.name.clone()),
            ("default", format!("claim-{uid}"))
        );
        assert_eq!(m.claim_record(uid).await.as_ref(), Some(record));
    }
    assert_eq!(
        m.unprepare(&[claim_ref("c1")]).await.unwrap()["c1"]
            .as_ref()
            .unwrap(),
        &()
    );
    assert_eq!(m.claim_records().await.keys().collect::<Vec<_>>(), ["c2"]);
}

#[tokio::test]
async fn a_graceful_shutdown_saves_the_state_even_when_nothing_was_committed() {
    let h = Harness::new();
    let m = h.ready(TestPolicy::new(8), &[]).await;
    let file = StateFile::new(h.state_dir());
    assert!(!file.path().exists(), "nothing was committed");
    m.save_state().await.unwrap();
    let state = file.load("test").unwrap().expect("the state file");
    assert!(state.claims.is_empty());
    drop(m);

    // With a claim: the file says so, and a restart restores it.
    h.claims.insert(claim("c1", "pod-db", 2));
    let m = h.ready(TestPolicy::new(8), &[]).await;
    assert!(m.prepare(&[claim_ref("c1")]).await.unwrap()["c1"].is_ok());
    m.save_state().await.unwrap();
    drop(m);
    assert_eq!(h.saved_claims(), ["c1"]);
    let m = h.ready(TestPolicy::new(8), &[]).await;
    assert!(m.claim_record("c1").await.is_some());
}

#[tokio::test]
async fn a_runtime_event_that_changes_durable_policy_state_is_saved() {
    let h = Harness::new();
    let policy = TestPolicy {
        durable_containers: true,
        ..TestPolicy::new(8)
    };
    let m = h.ready(policy, &[]).await;
    m.create_container(&container("a", "pod-web"))
        .await
        .unwrap();
    let saved: serde_json::Value =
        serde_json::from_slice(&fs::read(StateFile::new(h.state_dir()).path()).unwrap()).unwrap();
    assert_eq!(
        saved["policy_state"]["containers"],
        serde_json::json!(["a"])
    );
}

#[tokio::test]
async fn a_failed_runtime_event_names_the_container_as_namespace_pod_container() {
    // The runtime fails the CRI operation with this message: it must say which container.
    let h = Harness::new();
    let policy = TestPolicy {
        durable_containers: true,
        ..TestPolicy::new(8)
    };
    let m = h.ready(policy, &[]).await;
    let err = m
        .create_container(&container("refused-1", "pod-web"))
        .await
        .unwrap_err();
    assert_eq!(err.to_string(), "container default/pod-web/refused-1");
    // A container the policy does not know and refuses to take in (see
    // a_resize_of_a_container_the_synchronize_did_not_list_places_it).
    let err = m
        .update_container(
            &container("refused-2", "pod-web"),
            &policy::Resources::default(),
        )
        .await
        .unwrap_err();
    assert_eq!(err.to_string(), "container default/pod-web/refused-2");
    h.break_state_saves();
    let err = m
        .create_container(&container("a", "pod-web"))
        .await
        .unwrap_err();
    assert!(
        stdx::errors::chain(&err).starts_with("container default/pod-web/a: saving the state: "),
        "{err:?}"
    );
}

#[tokio::test]
async fn updates_the_runtime_reports_as_failed_stay_pending_and_are_named() {
    let h = Harness::new();
    h.claims.insert(claim("c1", "pod-db", 2));
    let m = h
        .ready(
            TestPolicy::new(8),
            &[container("a", "pod-web"), container("b", "pod-web")],
        )
        .await;
    h.runtime
        .state
        .lock()
        .unwrap()
        .report_failed
        .insert("a".into());
    let err = prepare_error(&m, "c1").await;
    assert!(
        err.contains(r#"the runtime failed updates of {"a"}"#),
        "{err}"
    );
    assert_eq!(
        h.runtime.cpus("b").as_deref(),
        Some("0-7"),
        "b shrank, then grew back"
    );
}

/// A batch the runtime does not answer in time stays pending and is not sent again one update
/// at a time, as a refused one is: a runtime that did not answer the batch would not answer the
/// singles either, and each would be one more update into a runtime that may still be applying
/// the batch (on CRI-O 1.36, one that can deadlock it: `nri::UpdateLull`). The claim sends the
/// batch again, as a whole, until `SETTLE_WAIT` has passed, then fails.
#[tokio::test(start_paused = true)]
async fn a_batch_the_runtime_does_not_answer_is_not_resent_one_update_at_a_time() {
    let h = Harness::new();
    // Disk work on the calling task: paused time does not run ahead while a save is on a
    // thread of the blocking pool.
    h.faults.run_inline();
    h.claims.insert(claim("c1", "pod-db", 2));
    let m = h
        .ready(
            TestPolicy::new(8),
            &[container("a", "pod-web"), container("b", "pod-web")],
        )
        .await;
    let held = h.runtime.hold.lock().await;
    let began = tokio::time::Instant::now();
    let err = prepare_error(&m, "c1").await;
    assert!(err.contains("did not answer"), "{err}");
    assert!(
        began.elapsed() >= resmgr::SETTLE_WAIT,
        "the claim gave up after {:?}",
        began.elapsed()
    );
    drop(held);
    let arrivals = h.runtime.state.lock().unwrap().arrivals.clone();
    // Every 2 s (the update timeout) for SETTLE_WAIT, then the rollback's.
    assert_eq!(
        arrivals,
        [2, 2, 2, 2, 2, 2],
        "the prepare's batch, again and again, and its rollback's, each of a and b, and nothing else"
    );
    assert_eq!(m.pending_updates().await, 2);
}

/// A runtime slow to answer a claim's moves (a busy node) does not fail the claim: its commit
/// sends them again once the call timed out, and the claim is granted once the runtime answers.
#[tokio::test(start_paused = true)]
async fn a_claim_waits_out_a_runtime_slow_to_answer_its_moves() {
    let h = Harness::new();
    h.faults.run_inline();
    h.claims.insert(claim("c1", "pod-db", 2));
    let m = std::sync::Arc::new(
        h.ready(
            TestPolicy::new(8),
            &[container("a", "pod-web"), container("b", "pod-web")],
        )
        .await,
    );
    let held = h.runtime.hold.lock().await;
    let prepare = tokio::spawn({
        let m = m.clone();
        async move { m.prepare(&[claim_ref("c1")]).await }
    });
    // The first call times out in the runtime; the claim sends its moves again.
    h.runtime.call_arrives().await;
    h.runtime.call_arrives().await;
    drop(held);
    let answers = prepare.await.unwrap().unwrap();
    assert!(answers["c1"].is_ok(), "{:?}", answers["c1"]);
    assert_eq!(h.specs(), ["c1"]);
    let claimed: policy::CpuSet = spec_env(&h, "c1", "DRA_CPUSET_c1").parse().unwrap();
    for id in ["a", "b"] {
        let cpus: policy::CpuSet = h.runtime.cpus(id).unwrap().parse().unwrap();
        assert!(
            cpus.intersection(&claimed).is_empty(),
            "{id} runs on {cpus}, which c1 holds ({claimed})"
        );
    }
    assert_eq!(m.pending_updates().await, 0);
}

#[tokio::test(start_paused = true)]
async fn the_background_retry_delivers_what_a_commit_could_not_with_doubling_backoff() {
    let h = Harness::new();
    h.claims.insert(claim("c1", "pod-db", 2));
    let m = std::sync::Arc::new(
        h.ready(TestPolicy::new(8), &[container("a", "pod-web")])
            .await,
    );
    m.prepare(&[claim_ref("c1")]).await.unwrap()["c1"]
        .as_ref()
        .unwrap();
    // The release's delivery and the next two retries fail; the third retry gets through.
    h.runtime.state.lock().unwrap().fail_calls = 3;
    let calls_before = h.runtime.state.lock().unwrap().calls.len();
    assert_eq!(
        m.unprepare(&[claim_ref("c1")]).await.unwrap()["c1"]
            .as_ref()
            .unwrap(),
        &()
    );
    assert_eq!(m.pending_updates().await, 1);

    let retries = tokio::spawn({
        let m = m.clone();
        async move { m.run_retries().await }
    });
    let drained = async {
        loop {
            // Registered before the check, so a call in between is not missed.
            let called = h.runtime.called.notified();
            tokio::pin!(called);
            called.as_mut().enable();
            if m.pending_updates().await == 0 {
                break;
            }
            called.await;
        }
    };
    // Virtual time: the limit passes at once if the retry loop has nothing left to do.
    tokio::time::timeout(std::time::Duration::from_secs(600), drained)
        .await
        .expect("the retry loop never delivered the pending update");
    retries.abort();
    assert_eq!(h.runtime.cpus("a").as_deref(), Some("0-7"));
    let s = h.runtime.state.lock().unwrap();
    let times = &s.call_times[calls_before..];
    assert_eq!(times.len(), 4, "the commit's delivery and three retries");
    let gaps: Vec<u128> = times
        .windows(2)
        .map(|w| (w[1] - w[0]).as_millis())
        .collect();
    // The first retry follows the commit's failure at once; then 500 ms, then 1 s.
    assert_eq!(gaps, [0, 500, 1000]);
}

/// The runtime events with the real topology-aware policy: one NUMA node of 4 cores x 2 threads,
/// a shared container `web` and an exclusive `batch` (2 whole CPUs, with `cpu-exclusivity: pods`).
mod events {
    use integration_tests::{fakes::container, node::Node};
    use policy::{CpuSet, QosClass, Resources};

    fn exclusive(id: &str, cpus: u64) -> policy::Container {
        let mut c = container(id, "pod-batch");
        c.pod.qos = QosClass::Guaranteed;
        c.resources = Resources {
            cpu_request_milli: cpus * 1000,
            cpu_limit_milli: Some(cpus * 1000),
            ..Resources::default()
        };
        c
    }

    /// The node and the CPUs `batch` holds.
    async fn node_with_web_and_batch() -> (Node, CpuSet) {
        let pods = policy::Config {
            exclusivity: policy::topology_aware::Exclusivity::Pods,
            ..policy::Config::default()
        };
        let node = Node::start_with("pack:1 core:4 pu:2", [], pods).await;
        node.synchronize(&[]).await;
        let web = node.create(&container("web", "pod-web")).await;
        node.runtime.apply_reply(&[policy::ContainerUpdate {
            container_id: "web".into(),
            cpus: web.adjustment.cpus,
            mems: None,
        }]);
        let batch = node.create(&exclusive("batch", 2)).await;
        (node, batch.adjustment.cpus.unwrap())
    }

    #[tokio::test]
    async fn stopping_an_exclusive_container_gives_its_cpus_back_in_the_reply() {
        let (node, batch) = node_with_web_and_batch().await;
        let updates = node.manager.stop_container(&exclusive("batch", 2)).await;
        let web = updates
            .iter()
            .find(|u| u.container_id == "web")
            .expect("web grows back");
        assert!(
            web.cpus.as_ref().unwrap().is_superset(&batch),
            "{updates:?}"
        );
        assert_eq!(
            node.manager.pending_updates().await,
            0,
            "the reply delivers them"
        );
    }

    #[tokio::test]
    async fn removing_a_container_that_never_stopped_delivers_in_the_background() {
        let (node, batch) = node_with_web_and_batch().await;
        node.manager.remove_container(&exclusive("batch", 2)).await;
        assert_eq!(
            node.manager.pending_updates().await,
            1,
            "a RemoveContainer reply carries nothing"
        );
        node.manager.deliver().await.unwrap();
        let web: CpuSet = node.runtime.cpus("web").unwrap().parse().unwrap();
        assert!(web.is_superset(&batch), "web {web}, released {batch}");
    }

    #[tokio::test]
    async fn resizing_a_container_answers_with_its_own_update_last() {
        let (node, _) = node_with_web_and_batch().await;
        let now = node.runtime.cpus("web").unwrap();
        let bigger = Resources {
            cpu_request_milli: 1500,
            ..Resources::default()
        };
        let updates = node
            .manager
            .update_container(&container("web", "pod-web"), &bigger)
            .await
            .unwrap();
        let last = updates.last().expect("the container's own update");
        assert_eq!(last.container_id, "web");
        assert_eq!(
            last.cpus.as_ref().unwrap().to_string(),
            now,
            "resized in place"
        );
    }
}

#[tokio::test]
async fn a_claim_whose_configuration_the_policy_refuses_fails_alone_and_leaves_no_trace() {
    use policy::{ClaimConfig, ConfigSource, Topology, TopologyAware, TopologySource};
    use serde_json::json;

    let config = |fields: serde_json::Value| {
        let mut parameters = json!({"apiVersion": "resmgr.io/v1alpha1", "kind": "CpuConfig"});
        parameters
            .as_object_mut()
            .unwrap()
            .extend(fields.as_object().unwrap().clone());
        vec![ClaimConfig {
            source: ConfigSource::Claim,
            requests: vec!["cpus".into()],
            parameters,
        }]
    };
    let h = Harness::new();
    let mut refused = claim("refused", "pod-db", 2);
    refused.config = config(json!({"memoryPinning": "off"}));
    let mut unpinned = claim("unpinned", "pod-db", 2);
    unpinned.config = config(json!({"memoryPinning": false}));
    h.claims.insert(refused);
    h.claims.insert(unpinned);
    let topology = Topology::load(&TopologySource::Synthetic(
        "pack:1 numa:2 core:4 pu:2".into(),
    ))
    .unwrap();
    let real = TopologyAware::new(topology, policy::Config::default()).unwrap();
    let m = h.ready_with(Box::new(real), &[]).await;

    let answers = m
        .prepare(&[claim_ref("refused"), claim_ref("unpinned")])
        .await
        .unwrap();
    let error = stdx::errors::chain(answers["refused"].as_ref().unwrap_err());
    assert!(
        error.contains(
            "claim default/claim-refused (refused): configuration for request cpus (from the claim): memoryPinning: invalid type"
        ),
        "{error}"
    );
    assert!(answers["unpinned"].is_ok());
    // The refused claim has no spec and no record, in the manager's state or the policy's.
    assert_eq!(h.specs(), ["unpinned"]);
    let state: serde_json::Value =
        serde_json::from_slice(&fs::read(h.state_dir().join("state.json")).unwrap()).unwrap();
    let recorded: Vec<&str> = state["claims"]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    let held: Vec<&str> = state["policy_state"]["claims"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["uid"].as_str().unwrap())
        .collect();
    assert_eq!((recorded, held), (vec!["unpinned"], vec!["unpinned"]));
    // The one honoured is told only its CPUs.
    let spec = fs::read_to_string(spec_path(&h, "unpinned")).unwrap();
    assert!(
        spec.contains("DRA_CPUSET_unpinned=") && !spec.contains("DRA_MEMS_unpinned"),
        "{spec}"
    );
}

#[tokio::test]
async fn a_re_prepare_with_other_allocation_results_is_refused_by_name_and_keeps_the_claim() {
    let h = Harness::new();
    h.claims.insert(claim_on("c1", "pod-db", "numa0", 2));
    let m = h.ready_with(topology_aware(TWO_NUMA), &[]).await;
    let first = m.prepare(&[claim_ref("c1")]).await.unwrap()["c1"]
        .as_ref()
        .unwrap()
        .clone();
    let spec = fs::read_to_string(spec_path(&h, "c1")).unwrap();

    // The claim was deallocated and allocated again elsewhere while we still hold it.
    h.claims.insert(claim_on("c1", "pod-db", "numa1", 1));
    let err = prepare_error(&m, "c1").await;
    assert!(
        err.starts_with("claim default/claim-c1 (uid c1): allocating: "),
        "{err}"
    );
    assert!(
        err.contains(
            "result 0 (request cpus/big) is on numa0 with 2 cpus, now asked on numa1 with 1 cpu"
        ),
        "{err}"
    );
    assert!(err.contains("unprepare"), "says how it resolves: {err}");
    // Nothing changed: the claim keeps its CPUs, its spec, its record.
    assert_eq!(fs::read_to_string(spec_path(&h, "c1")).unwrap(), spec);
    assert_eq!(h.saved_claims(), ["c1"]);
    assert_eq!(m.claim_record("c1").await.unwrap().devices, first);

    // Once unprepared, the new results are prepared.
    assert_eq!(
        m.unprepare(&[claim_ref("c1")]).await.unwrap()["c1"]
            .as_ref()
            .unwrap(),
        &()
    );
    let now = m.prepare(&[claim_ref("c1")]).await.unwrap()["c1"]
        .as_ref()
        .unwrap()
        .clone();
    assert_eq!(now[0].device, "numa1");
    let spec = fs::read_to_string(spec_path(&h, "c1")).unwrap();
    assert!(spec.contains("DRA_CPUSET_c1=8\""), "{spec}");
}

#[tokio::test]
async fn unprepare_of_a_claim_already_gone_succeeds_without_saving() {
    let h = Harness::new();
    h.claims.insert(claim("c1", "pod-db", 2));
    let m = h.ready(TestPolicy::new(8), &[]).await;
    m.prepare(&[claim_ref("c1")]).await.unwrap()["c1"]
        .as_ref()
        .unwrap();
    // The state directory stops taking writes (full, read-only, broken).
    h.break_state_saves();

    // Gone already (never prepared, or purged by an earlier unprepare): nothing to save.
    assert_eq!(
        m.unprepare(&[claim_ref("never-seen")]).await.unwrap()["never-seen"]
            .as_ref()
            .unwrap(),
        &()
    );
    // A real release must be saved, so it fails; and its retry saves what is still unsaved
    // even though the claim is gone from memory by then.
    let err = stdx::errors::chain(
        m.unprepare(&[claim_ref("c1")]).await.unwrap()["c1"]
            .as_ref()
            .unwrap_err(),
    );
    assert!(err.contains("saving the state"), "{err}");
    assert!(m.unprepare(&[claim_ref("c1")]).await.unwrap()["c1"].is_err());
    h.mend_state_saves();
    assert_eq!(h.saved_claims(), ["c1"], "the release is not on disk yet");
    assert_eq!(
        m.unprepare(&[claim_ref("c1")]).await.unwrap()["c1"]
            .as_ref()
            .unwrap(),
        &()
    );
    assert!(h.saved_claims().is_empty());
}

#[tokio::test]
async fn a_second_manager_on_the_same_directories_is_refused_before_it_touches_anything() {
    let h = Harness::new();
    let first = h.start(TestPolicy::new(8)).unwrap();
    // What a spec write in flight in the first manager looks like on disk.
    fs::create_dir_all(h.cdi_dir()).unwrap();
    let in_flight = h
        .cdi_dir()
        .join(format!(".{}-device_c1.json.a1b2c3.tmp", support::DRIVER));
    fs::write(&in_flight, b"{").unwrap();

    let err = h.start(TestPolicy::new(8)).unwrap_err().to_string();
    assert!(
        err.contains("is in use by another instance")
            && err.contains(&h.state_dir().display().to_string()),
        "{err}"
    );
    assert!(
        in_flight.exists(),
        "the second manager cleaned up the first's files"
    );

    // The lock dies with its holder.
    drop(first);
    h.start(TestPolicy::new(8)).unwrap();
    assert!(
        !in_flight.exists(),
        "start-up removes what a crashed write left"
    );
}

/// The value of `name` in the environment claim `uid`'s spec gives its first device.
fn spec_env(h: &Harness, uid: &str, name: &str) -> String {
    let spec: serde_json::Value =
        serde_json::from_slice(&fs::read(spec_path(h, uid)).unwrap()).unwrap();
    spec["devices"][0]["containerEdits"]["env"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e.as_str()?.strip_prefix(&format!("{name}=")))
        .next()
        .unwrap()
        .to_owned()
}

#[tokio::test]
async fn a_lost_state_directory_adopts_the_claims_from_their_specs() {
    let h = Harness::new();
    h.claims.insert(claim_on("c1", "pod-db", "numa0", 2));
    h.claims.insert(claim_on("c2", "pod-batch", "numa1", 1));
    {
        let m = h.ready_with(topology_aware(TWO_NUMA), &[]).await;
        for uid in ["c1", "c2"] {
            m.prepare(&[claim_ref(uid)]).await.unwrap()[uid]
                .as_ref()
                .unwrap();
        }
    }
    let specs_before: Vec<Vec<u8>> = ["c1", "c2"]
        .iter()
        .map(|uid| fs::read(spec_path(&h, uid)).unwrap())
        .collect();
    let c1: policy::CpuSet = spec_env(&h, "c1", "DRA_CPUSET_c1").parse().unwrap();
    let c2: policy::CpuSet = spec_env(&h, "c2", "DRA_CPUSET_c2").parse().unwrap();

    // The agent restarts with its state directory gone (a changed hostPath, a re-imaged disk, a
    // wrong --state-dir), while the claims' pods still run: db on c1's CPUs (its runtime does
    // not report CDI devices, only the environment the spec gave it), web shared.
    fs::remove_dir_all(h.state_dir()).unwrap();
    let mut db = container("db", "pod-db");
    db.cpus = Some(c1.clone());
    db.env = vec![format!("DRA_CPUSET_c1={c1}")];
    let mut web = container("web", "pod-web");
    web.cpus = Some("1-15".parse().unwrap());
    let m = h.ready_with(topology_aware(TWO_NUMA), &[db, web]).await;

    let specs_after: Vec<Vec<u8>> = ["c1", "c2"]
        .iter()
        .map(|uid| fs::read(spec_path(&h, uid)).unwrap())
        .collect();
    assert!(
        specs_after == specs_before,
        "the specs are kept as they were"
    );
    assert_eq!(h.saved_claims(), ["c1", "c2"], "adopted, and saved");
    assert_eq!(
        h.runtime.cpus("db"),
        Some(c1.to_string()),
        "db stays on its claim"
    );
    let web: policy::CpuSet = h.runtime.cpus("web").unwrap().parse().unwrap();
    assert!(
        !web.intersects(&c1) && !web.intersects(&c2),
        "web {web} shares the claims' CPUs {c1}, {c2}"
    );

    // A new claim gets other CPUs.
    h.claims.insert(claim_on("c3", "pod-new", "numa0", 2));
    m.prepare(&[claim_ref("c3")]).await.unwrap()["c3"]
        .as_ref()
        .unwrap();
    let c3: policy::CpuSet = spec_env(&h, "c3", "DRA_CPUSET_c3").parse().unwrap();
    assert!(!c3.intersects(&c1), "c3 {c3} got c1's CPUs {c1}");

    // The kubelet's re-prepare finds the claim as it was, and its unprepare releases it.
    let again = m.prepare(&[claim_ref("c1")]).await.unwrap()["c1"]
        .as_ref()
        .unwrap()
        .clone();
    assert_eq!(again[0].device, "numa0");
    assert_eq!(fs::read(spec_path(&h, "c1")).unwrap(), specs_before[0]);
    assert_eq!(
        m.unprepare(&[claim_ref("c2")]).await.unwrap()["c2"]
            .as_ref()
            .unwrap(),
        &()
    );
    assert_eq!(h.saved_claims(), ["c1", "c3"]);
}

#[tokio::test]
async fn a_failed_save_is_retried_in_the_background_without_another_commit() {
    let h = Harness::new();
    h.claims.insert(claim("c1", "pod-db", 2));
    let m = h.ready(TestPolicy::new(8), &[]).await;
    assert!(m.prepare(&[claim_ref("c1")]).await.unwrap()["c1"].is_ok());
    assert_eq!(h.saved_claims(), ["c1"]);

    // The release's save fails: released in memory, its spec gone, still on disk.
    h.faults.arm(Point::StateSave, Fault::Fail, Some(1));
    let answers = m.unprepare(&[claim_ref("c1")]).await.unwrap();
    let err = stdx::errors::chain(answers["c1"].as_ref().unwrap_err());
    assert!(err.contains("saving the state"), "{err}");
    assert!(h.specs().is_empty());
    assert_eq!(
        h.saved_claims(),
        ["c1"],
        "the failed save left the disk as it was"
    );

    // Nothing else commits (an idle node): the background retry saves it.
    m.retry_once().await.unwrap();
    assert!(h.saved_claims().is_empty(), "{:?}", h.saved_claims());
}
