//! Start-up reconciliation with the real topology-aware policy: CDI specs the state does not
//! account for, judged by the containers the runtime reports at Synchronize and by the API
//! server; claims held without confirmation, released after the grace period once nothing wants
//! them; and the one case that refuses claims, two claims granting the same CPUs.

use std::{fs, time::Duration};

use integration_tests::fakes::{
    self as support, Harness, TWO_NUMA, claim_on, claim_ref, container, topology_aware,
};
use policy::CpuSet;
use resmgr::{AdmitError, Manager, Outcome};

fn spec_path(h: &Harness, uid: &str) -> std::path::PathBuf {
    h.cdi_dir()
        .join(format!("{}-device_{uid}.json", support::DRIVER))
}

/// The CPUs claim `uid`'s spec grants.
fn spec_cpus(h: &Harness, uid: &str) -> CpuSet {
    let spec: serde_json::Value =
        serde_json::from_slice(&fs::read(spec_path(h, uid)).unwrap()).unwrap();
    let prefix = format!("DRA_CPUSET_{uid}=");
    spec["devices"][0]["containerEdits"]["env"]
        .as_array()
        .unwrap()
        .iter()
        .find_map(|e| e.as_str()?.strip_prefix(&prefix))
        .unwrap()
        .parse()
        .unwrap()
}

/// Writes a spec of ours for `uid` granting `cpus`, as an earlier agent would have.
fn plant(h: &Harness, uid: &str, cpus: &str) {
    cdi::SpecStore::new(h.cdi_dir(), support::DRIVER)
        .unwrap()
        .write_claim(
            uid,
            &[cdi::ContainerEdits::with_env([
                format!("DRA_CPUSET_{uid}={cpus}"),
                format!("DRA_MEMS_{uid}=0"),
            ])],
        )
        .unwrap();
}

/// A container of pod `pod` running on `cpus` with the environment claim `uid`'s spec gave it
/// (its runtime reports no CDI devices).
fn user(id: &str, pod: &str, uid: &str, cpus: &str) -> policy::Container {
    let mut c = container(id, pod);
    c.cpus = Some(cpus.parse().unwrap());
    c.env = vec![format!("DRA_CPUSET_{uid}={cpus}")];
    c
}

/// A node whose intact state holds claim c1 (2 CPUs of numa0, CPUs 1-7 claimable); returns c1's
/// CPUs.
async fn node_with_c1(h: &Harness) -> CpuSet {
    h.claims.insert(claim_on("c1", "pod-db", "numa0", 2));
    let m = h.ready_with(topology_aware(TWO_NUMA), &[]).await;
    m.prepare(&[claim_ref("c1")]).await.unwrap()["c1"]
        .as_ref()
        .unwrap();
    spec_cpus(h, "c1")
}

/// Prepares a new claim of `cpus` CPUs of numa0 and returns what it got, or the error.
async fn claim_numa0(h: &Harness, m: &Manager, uid: &str, cpus: u64) -> Result<CpuSet, String> {
    h.claims.insert(claim_on(uid, "pod-new", "numa0", cpus));
    match m
        .prepare(&[claim_ref(uid)])
        .await
        .unwrap()
        .remove(uid)
        .unwrap()
    {
        Ok(_) => Ok(spec_cpus(h, uid)),
        Err(e) => Err(e.to_string()),
    }
}

fn count(m: &resmgr::ReconcileReport, outcome: Outcome) -> u64 {
    m.counts.get(&outcome).copied().unwrap_or(0)
}

#[tokio::test]
async fn a_stray_spec_nothing_uses_or_allocates_here_is_swept_and_its_cpus_are_free_again() {
    let h = Harness::new();
    let c1 = node_with_c1(&h).await;
    let free: CpuSet = "1-7".parse::<CpuSet>().unwrap().difference(&c1);
    let stray = free.iter().take(2).collect::<CpuSet>().to_string();
    plant(&h, "stray", &stray);

    let m = h.ready_with(topology_aware(TWO_NUMA), &[]).await;
    assert!(m.gate().is_open(), "a stray never keeps claims out");
    assert_eq!(
        h.specs(),
        ["c1", "stray"],
        "kept until the API server is asked"
    );
    m.reconcile_once().await;
    assert_eq!(h.specs(), ["c1"], "swept");
    assert_eq!(h.saved_claims(), ["c1"]);
    let report = m.reconciliation().await;
    assert_eq!(count(&report, Outcome::Swept), 1);
    assert!(report.unconfirmed.is_empty(), "{report:?}");

    // Every CPU of numa0 not c1's is claimable again, the stray's included.
    let all = claim_numa0(&h, &m, "c2", 5).await.unwrap();
    assert_eq!(all, free);
}

#[tokio::test]
async fn a_stray_spec_a_running_container_uses_is_adopted_and_keeps_its_cpus() {
    let h = Harness::new();
    let c1 = node_with_c1(&h).await;
    let free: CpuSet = "1-7".parse::<CpuSet>().unwrap().difference(&c1);
    let stray = free.iter().take(2).collect::<CpuSet>();
    plant(&h, "stray", &stray.to_string());
    let app = user("app", "pod-app", "stray", &stray.to_string());

    let m = h.ready_with(topology_aware(TWO_NUMA), &[app]).await;
    assert!(m.gate().is_open());
    assert_eq!(h.saved_claims(), ["c1", "stray"], "adopted, durably");
    m.reconcile_once().await;
    assert_eq!(h.specs(), ["c1", "stray"], "a used spec is kept");
    let report = m.reconciliation().await;
    assert_eq!(count(&report, Outcome::Adopted), 1);
    assert_eq!(report.unconfirmed, ["stray"]);
    assert_eq!(h.runtime.cpus("app"), Some(stray.to_string()));

    // A new claim gets none of its CPUs, and there are only three left.
    let got = claim_numa0(&h, &m, "c2", 3).await.unwrap();
    assert!(!got.intersects(&stray), "c2 {got} took the stray's {stray}");
    assert!(claim_numa0(&h, &m, "c3", 1).await.is_err());
}

#[tokio::test]
async fn an_unreadable_spec_in_use_holds_its_containers_cpus_and_an_unused_one_is_set_aside() {
    let h = Harness::new();
    plant(&h, "used", "4-5");
    plant(&h, "unused", "6-7");
    fs::write(spec_path(&h, "used"), b"\x00garbage").unwrap();
    fs::write(spec_path(&h, "unused"), b"{\"cdiVersion\":").unwrap();
    let app = user("app", "pod-app", "used", "4-5");
    let mut web = container("web", "pod-web");
    web.cpus = Some("1-15".parse().unwrap());

    let m = h.ready_with(topology_aware(TWO_NUMA), &[app, web]).await;
    assert!(m.gate().is_open());
    assert_eq!(h.specs(), ["used"], "the used one is kept where it is");
    let aside = h
        .cdi_dir()
        .join(format!("{}-device_unused.json.unreadable", support::DRIVER));
    assert_eq!(
        fs::read(aside).unwrap(),
        b"{\"cdiVersion\":",
        "moved aside whole"
    );
    let report = m.reconciliation().await;
    assert_eq!(count(&report, Outcome::HeldUnreadable), 1);
    assert_eq!(count(&report, Outcome::SetAside), 1);
    assert_eq!(h.saved_claims(), ["used"]);

    let held: CpuSet = "4-5".parse().unwrap();
    let web: CpuSet = h.runtime.cpus("web").unwrap().parse().unwrap();
    assert!(!web.intersects(&held), "web {web} runs on the held {held}");
    let got = claim_numa0(&h, &m, "c2", 5).await.unwrap();
    assert!(!got.intersects(&held), "c2 {got} took the held {held}");
}

#[tokio::test]
async fn a_used_stray_whose_cpus_another_claim_holds_refuses_claims_saying_how_to_recover() {
    let h = Harness::new();
    let c1 = node_with_c1(&h).await;
    // A restored backup's spec grants c1's CPUs to another claim, whose pod still runs.
    plant(&h, "twin", &c1.to_string());
    let intruder = user("intruder", "pod-x", "twin", &c1.to_string());

    let m = h.ready_with(topology_aware(TWO_NUMA), &[intruder]).await;
    assert!(!m.gate().is_open(), "claims stay refused");
    let why = m.contested().expect("contested");
    assert!(
        why.contains("claim twin") && why.contains("delete the pods of default/pod-x/intruder"),
        "{why}"
    );
    match m.prepare(&[claim_ref("c1")]).await {
        Err(AdmitError::Contested(message)) => assert_eq!(message, why),
        other => panic!("prepare answered {other:?}"),
    }
    assert_eq!(h.specs(), ["c1", "twin"], "nothing deleted");
    let report = m.reconciliation().await;
    assert_eq!(count(&report, Outcome::Contested), 1);
    assert!(report.contested.contains_key("twin"));

    // The kubelet lets go of c1 (its pods are gone): served, though prepares are refused, since
    // it only gives CPUs back; after a restart the contest is over.
    let answers = m.unprepare(&[claim_ref("c1")]).await.unwrap();
    assert!(answers["c1"].is_ok(), "{answers:?}");
    assert_eq!(h.specs(), ["twin"]);
    assert!(matches!(
        m.prepare(&[claim_ref("c1")]).await,
        Err(AdmitError::Contested(_))
    ));
    drop(m);
    let intruder = user("intruder", "pod-x", "twin", &c1.to_string());
    let m = h.ready_with(topology_aware(TWO_NUMA), &[intruder]).await;
    assert!(m.contested().is_none() && m.gate().is_open());
}

#[tokio::test]
async fn an_adopted_claim_gone_from_the_api_server_is_released_after_the_grace_once_unused() {
    let mut h = Harness::new();
    h.reconcile.grace = Duration::ZERO;
    let c1 = node_with_c1(&h).await;
    let db = user("db", "pod-db", "c1", &c1.to_string());
    // The state directory is lost while db runs; then the claim is deleted.
    fs::remove_dir_all(h.state_dir()).unwrap();
    let m = h
        .ready_with(topology_aware(TWO_NUMA), std::slice::from_ref(&db))
        .await;
    h.claims.remove("default", "claim-c1");
    m.reconcile_once().await;
    assert_eq!(h.specs(), ["c1"], "kept while db uses it");

    m.remove_container(&db).await;
    m.reconcile_once().await;
    assert_eq!(
        h.specs(),
        ["c1"],
        "the grace starts at the first pass that finds it unwanted"
    );
    m.reconcile_once().await;
    assert!(h.specs().is_empty(), "released after the grace");
    assert!(h.saved_claims().is_empty());
    assert_eq!(count(&m.reconciliation().await, Outcome::Released), 1);
}

#[tokio::test]
async fn an_unwanted_claim_is_kept_for_the_grace_and_one_the_kubelet_prepares_is_confirmed() {
    let h = Harness::new();
    node_with_c1(&h).await;
    fs::remove_dir_all(h.state_dir()).unwrap();
    // Nothing runs, but the API server allocates c1 here: its pod may not have started yet.
    let m = h.ready_with(topology_aware(TWO_NUMA), &[]).await;
    m.reconcile_once().await;
    assert_eq!(h.specs(), ["c1"]);
    assert_eq!(count(&m.reconciliation().await, Outcome::Adopted), 1);

    // Deallocated: unwanted now, but within the default grace of two minutes it stays.
    h.claims.remove("default", "claim-c1");
    m.reconcile_once().await;
    m.reconcile_once().await;
    assert_eq!(h.specs(), ["c1"]);

    // The kubelet prepares it again (re-allocated): confirmed, nothing reconciles it any more.
    h.claims.insert(claim_on("c1", "pod-db", "numa0", 2));
    m.prepare(&[claim_ref("c1")]).await.unwrap()["c1"]
        .as_ref()
        .unwrap();
    let report = m.reconciliation().await;
    assert_eq!(count(&report, Outcome::Confirmed), 1);
    assert!(report.unconfirmed.is_empty());
}

#[tokio::test]
async fn a_restored_older_state_releases_the_claim_it_holds_without_a_spec_once_gone() {
    let mut h = Harness::new();
    h.reconcile.grace = Duration::ZERO;
    node_with_c1(&h).await;
    let older = fs::read(h.state_dir().join("state.json")).unwrap();
    {
        let m = h.ready_with(topology_aware(TWO_NUMA), &[]).await;
        assert_eq!(
            m.unprepare(&[claim_ref("c1")]).await.unwrap()["c1"]
                .as_ref()
                .unwrap(),
            &()
        );
    }
    h.claims.remove("default", "claim-c1");
    // The operator restores a backup that still holds c1; the kubelet unprepared it long ago.
    fs::write(h.state_dir().join("state.json"), older).unwrap();
    let m = h.ready_with(topology_aware(TWO_NUMA), &[]).await;
    assert_eq!(h.saved_claims(), ["c1"]);
    assert_eq!(m.reconciliation().await.unconfirmed, ["c1"]);
    m.reconcile_once().await;
    m.reconcile_once().await;
    assert!(h.saved_claims().is_empty(), "the leak is released");
    assert_eq!(count(&m.reconciliation().await, Outcome::Released), 1);
}

/// c1 is prepared, then unprepared, and c2 gets its CPUs; then a backup of the state that still
/// holds c1 (without its spec) is restored, and the agent starts with the containers `running`
/// makes of c1's CPUs.
async fn restore_a_state_that_holds_c1_under_c2(
    h: &Harness,
    running: impl FnOnce(&CpuSet) -> Vec<policy::Container>,
) -> Manager {
    let c1 = node_with_c1(h).await;
    let older = fs::read(h.state_dir().join("state.json")).unwrap();
    {
        // c1 goes; c2 is prepared on the same CPUs, its pod not started yet. The API server
        // still says c1 is allocated here, as while the kubelet retries a prepare of it.
        let m = h.ready_with(topology_aware(TWO_NUMA), &[]).await;
        assert_eq!(
            m.unprepare(&[claim_ref("c1")]).await.unwrap()["c1"]
                .as_ref()
                .unwrap(),
            &()
        );
        let got = claim_numa0(h, &m, "c2", 7).await.unwrap();
        assert!(got.is_superset(&c1));
    }
    // A backup that still holds c1 is restored.
    fs::write(h.state_dir().join("state.json"), older).unwrap();
    h.ready_with(topology_aware(TWO_NUMA), &running(&c1)).await
}

#[tokio::test]
async fn a_claim_a_restored_state_holds_without_a_spec_gives_way_to_a_stray_spec_on_its_cpus() {
    let h = Harness::new();
    let m = restore_a_state_that_holds_c1_under_c2(&h, |_| Vec::new()).await;
    // c2's spec proves its prepare completed; the state's c1 has none, and nothing uses it.
    assert!(m.contested().is_none(), "{:?}", m.contested());
    assert!(m.gate().is_open());
    assert_eq!(h.specs(), ["c2"], "c2's spec is kept: its pod needs it");
    assert_eq!(
        h.saved_claims(),
        ["c2"],
        "c1 released, c2 taken back, saved"
    );
    assert!(m.claim_record("c1").await.is_none());
    let report = m.reconciliation().await;
    assert_eq!(count(&report, Outcome::GaveWay), 1);
    let gave_way = report
        .recent
        .iter()
        .find(|r| r.outcome == Outcome::GaveWay)
        .unwrap();
    assert!(
        gave_way.claim == "c1" && gave_way.detail.contains("claim c2"),
        "{gave_way}"
    );
    assert!(report.unconfirmed.contains(&"c2".to_owned()));
}

#[tokio::test]
async fn a_claim_held_without_a_spec_that_a_container_uses_does_not_give_way() {
    let h = Harness::new();
    // A container runs with c1's grant (its spec is gone, its environment says so).
    let m = restore_a_state_that_holds_c1_under_c2(&h, |c1| {
        vec![user("db", "pod-db", "c1", &c1.to_string())]
    })
    .await;
    assert!(
        !m.gate().is_open(),
        "granting c2's CPUs could grant them twice"
    );
    let why = m.contested().expect("contested");
    assert!(
        why.contains("claim c2") && why.contains("allocated to this node"),
        "{why}"
    );
    assert_eq!(h.specs(), ["c2"], "c2's spec is kept: its pod needs it");
    assert!(m.claim_record("c1").await.is_some(), "c1 stays: db uses it");
    assert_eq!(count(&m.reconciliation().await, Outcome::GaveWay), 0);
}
