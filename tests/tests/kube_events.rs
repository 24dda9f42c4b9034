//! Events users see, through real kube-rs against the fake API server: a refused container and a
//! claim that failed to prepare each become a Warning Event on the right objects; a repeat is the
//! same Event with a series; a new message is a new Event, and many similar ones are combined;
//! each object is rate-limited by the injected clock; the queue is bounded and recording never
//! waits; an Event the API server refuses is counted and does not hold up the next. Then the two
//! hooks: the NRI plugin and the claim lifecycle tell the recorder what they refused.
//!
//! The poster handles notices one at a time, in order, so a test that needs the earlier ones done
//! records one more notice for another pod and waits for its Event.

use std::{
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use hyper::Method;
use integration_tests::{
    fake_apiserver::FakeApiServer,
    fakes::{Harness, TestPolicy, claim_ref},
};
use kube_dra::{
    Clock, EventRecorder, EventStats, EventsConfig, KubeEvents, Notice, PodRef, ResourceApiVersion,
    ResourceApiVersions, fake::RecordingEvents,
};
use kubelet_plugin::{ClaimHandler, ClaimRef};
use nri::{Plugin as _, api};
use resmgr::{dra_handler::LifecycleHandler, nri_plugin::ResmgrPlugin};
use serde_json::{Value, json};

/// A clock that moves only when told.
#[derive(Debug)]
struct TestClock(Mutex<Instant>);

impl TestClock {
    fn new() -> Arc<Self> {
        Arc::new(Self(Mutex::new(Instant::now())))
    }

    fn advance(&self, by: Duration) {
        *self.0.lock().unwrap() += by;
    }
}

impl Clock for TestClock {
    fn now(&self) -> Instant {
        *self.0.lock().unwrap()
    }
}

fn config(clock: &Arc<TestClock>) -> EventsConfig {
    EventsConfig {
        clock: clock.clone(),
        ..EventsConfig::new("cpu.resmgr.io", "node-a")
    }
}

fn start(server: &FakeApiServer, config: EventsConfig) -> KubeEvents {
    let versions = ResourceApiVersions::pinned(server.client(), ResourceApiVersion::V1);
    KubeEvents::start(Arc::new(versions), config)
}

fn pod(name: &str) -> PodRef {
    PodRef {
        namespace: "team".into(),
        name: name.into(),
        uid: format!("uid-{name}"),
    }
}

fn refused(pod_name: &str, message: &str) -> Notice {
    Notice::ContainerRefused {
        pod: pod(pod_name),
        container: "app".into(),
        message: message.into(),
    }
}

/// The Events about `kind` `name`, oldest first.
fn about<'a>(events: &'a [Value], kind: &str, name: &str) -> Vec<&'a Value> {
    events
        .iter()
        .filter(|e| e["regarding"]["kind"] == kind && e["regarding"]["name"] == name)
        .collect()
}

fn has_event_on(events: &[Value], kind: &str, name: &str) -> bool {
    !about(events, kind, name).is_empty()
}

fn series_count(event: &Value) -> i64 {
    event["series"]["count"].as_i64().unwrap_or(1)
}

/// The stats once `condition` holds: the Event shows in the server before the poster has read
/// the answer and counted it.
async fn stats_when(events: &KubeEvents, condition: impl Fn(&EventStats) -> bool) -> EventStats {
    match tokio::time::timeout(Duration::from_secs(20), events.wait_for(condition)).await {
        Ok(stats) => stats,
        Err(_) => panic!("timed out; stats: {:?}", events.stats()),
    }
}

fn requests(server: &FakeApiServer, method: &Method) -> usize {
    server
        .requests()
        .iter()
        .filter(|r| r.method == *method && r.path.contains("/events"))
        .count()
}

#[tokio::test]
async fn a_refused_container_is_a_warning_event_on_its_pod() {
    let server = FakeApiServer::start(&["v1"]).await;
    let events = start(&server, config(&TestClock::new()));
    events.record(refused("web", "container app does not fit: needs 4 cpus"));
    let all = server
        .wait_for_events("the pod's event", |e| e.len() == 1)
        .await;
    let event = &all[0];
    assert_eq!(
        event["regarding"],
        json!({"apiVersion": "v1", "kind": "Pod", "namespace": "team", "name": "web", "uid": "uid-web"})
    );
    assert_eq!(event["metadata"]["namespace"], "team");
    assert_eq!(event["type"], "Warning");
    assert_eq!(event["reason"], "ContainerRefused");
    assert_eq!(event["action"], "CreateContainer");
    assert_eq!(
        event["note"],
        "container app refused: container app does not fit: needs 4 cpus"
    );
    assert_eq!(event["reportingController"], "cpu.resmgr.io");
    assert_eq!(event["reportingInstance"], "node-a");
    assert!(event["related"].is_null(), "{event:#}");
}

#[tokio::test]
async fn a_repeat_is_one_event_with_a_series_and_a_new_message_a_new_event() {
    let server = FakeApiServer::start(&["v1"]).await;
    let clock = TestClock::new();
    let events = start(&server, config(&clock));
    for _ in 0..3 {
        events.record(refused("web", "no cpus"));
    }
    events.record(refused("web", "no memory"));
    let all = server
        .wait_for_events("a series of 3 and another event", |e| {
            e.len() == 2 && e.iter().any(|e| series_count(e) == 3)
        })
        .await;
    let notes: Vec<(&str, i64)> = about(&all, "Pod", "web")
        .iter()
        .map(|e| (e["note"].as_str().unwrap(), series_count(e)))
        .collect();
    assert!(
        notes.contains(&("container app refused: no cpus", 3))
            && notes.contains(&("container app refused: no memory", 1)),
        "{notes:?}"
    );
    assert_eq!(
        requests(&server, &Method::POST),
        2,
        "one create per message"
    );
    assert_eq!(
        requests(&server, &Method::PATCH),
        2,
        "repeats patch the series"
    );

    // After the repeat window a repeat starts a new Event.
    clock.advance(Duration::from_secs(361));
    events.record(refused("web", "no cpus"));
    server
        .wait_for_events("a new event after the window", |e| e.len() == 3)
        .await;
    stats_when(&events, |s| s.posted == 5).await;
}

#[tokio::test]
async fn a_claim_that_failed_is_an_event_on_the_claim_and_on_each_of_its_pods() {
    let server = FakeApiServer::start(&["v1"]).await;
    server.insert(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"namespace": "team", "name": "db-cpus", "uid": "claim-uid"},
        "status": {"reservedFor": [
            {"resource": "pods", "name": "db-0", "uid": "uid-db-0"},
            {"apiGroup": "batch", "resource": "jobs", "name": "j", "uid": "uid-j"},
            {"resource": "pods", "name": "db-1", "uid": "uid-db-1"},
        ]},
    }));
    let events = start(&server, config(&TestClock::new()));
    events.record(Notice::ClaimNotPrepared {
        claim: ClaimRef::new("team", "db-cpus", "claim-uid"),
        message: "claim team/db-cpus: allocating: numa0 does not fit".into(),
    });
    let all = server
        .wait_for_events("events on the claim and both pods", |e| e.len() == 3)
        .await;
    let claim = about(&all, "ResourceClaim", "db-cpus");
    assert_eq!(claim.len(), 1, "{all:#?}");
    let claim_ref = json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "namespace": "team", "name": "db-cpus", "uid": "claim-uid",
    });
    assert_eq!(claim[0]["regarding"], claim_ref);
    assert_eq!(claim[0]["reason"], "ClaimNotPrepared");
    assert_eq!(claim[0]["action"], "PrepareResources");
    for name in ["db-0", "db-1"] {
        let on_pod = about(&all, "Pod", name);
        assert_eq!(on_pod.len(), 1, "{name}: {all:#?}");
        assert_eq!(on_pod[0]["related"], claim_ref, "{name}");
        assert_eq!(
            on_pod[0]["note"],
            "claim team/db-cpus: allocating: numa0 does not fit"
        );
    }

    // A claim of the same name but another UID (ours is gone): its pods are not ours to tell.
    events.record(Notice::ClaimNotPrepared {
        claim: ClaimRef::new("team", "db-cpus", "old-uid"),
        message: "gone".into(),
    });
    events.record(refused("marker", "m"));
    let all = server
        .wait_for_events("the marker", |e| has_event_on(e, "Pod", "marker"))
        .await;
    assert_eq!(all.len(), 5, "one more on the claim only: {all:#?}");
}

#[tokio::test]
async fn each_object_gets_its_burst_then_one_event_per_refill_of_the_clock() {
    let server = FakeApiServer::start(&["v1"]).await;
    let clock = TestClock::new();
    let events = start(
        &server,
        EventsConfig {
            burst: 2,
            refill: Duration::from_secs(300),
            ..config(&clock)
        },
    );
    for i in 0..4 {
        events.record(refused("web", &format!("reason {i}")));
    }
    events.record(refused("other", "m"));
    let all = server
        .wait_for_events("the other pod's event", |e| has_event_on(e, "Pod", "other"))
        .await;
    assert_eq!(about(&all, "Pod", "web").len(), 2, "{all:#?}");
    assert_eq!(
        stats_when(&events, |s| s.posted == 3).await,
        EventStats {
            posted: 3,
            rate_limited: 2,
            ..EventStats::default()
        }
    );

    clock.advance(Duration::from_secs(301));
    events.record(refused("web", "reason 4"));
    events.record(refused("web", "reason 5"));
    events.record(refused("other-2", "m"));
    let all = server
        .wait_for_events("the marker", |e| has_event_on(e, "Pod", "other-2"))
        .await;
    assert_eq!(
        about(&all, "Pod", "web").len(),
        3,
        "one token came back: {all:#?}"
    );
    assert_eq!(events.stats().rate_limited, 3);
}

#[tokio::test]
async fn many_distinct_messages_of_one_object_are_combined_into_one_series() {
    let server = FakeApiServer::start(&["v1"]).await;
    let events = start(
        &server,
        EventsConfig {
            similar_max: 3,
            ..config(&TestClock::new())
        },
    );
    for i in 0..5 {
        events.record(refused("web", &format!("needs {i} cpus")));
    }
    events.record(refused("marker", "m"));
    let all = server
        .wait_for_events("the marker", |e| has_event_on(e, "Pod", "marker"))
        .await;
    let web: Vec<(&str, i64)> = about(&all, "Pod", "web")
        .iter()
        .map(|e| (e["note"].as_str().unwrap(), series_count(e)))
        .collect();
    assert_eq!(web.len(), 3, "two distinct, then one combined: {web:?}");
    assert!(
        web.contains(&(
            "(combined from similar events): container app refused: needs 2 cpus",
            3
        )),
        "{web:?}"
    );
}

#[tokio::test]
async fn recording_never_waits_a_full_queue_drops_and_counts() {
    // On this single-threaded runtime the poster cannot run until the test awaits: the three
    // notices meet a queue of one.
    let server = FakeApiServer::start(&["v1"]).await;
    let events = start(
        &server,
        EventsConfig {
            queue: 1,
            ..config(&TestClock::new())
        },
    );
    events.record(refused("a", "m"));
    events.record(refused("b", "m"));
    events.record(refused("c", "m"));
    assert_eq!(events.stats().queue_full, 2);
    events.record(refused("marker", "m"));
    // The queue was still full (nothing ran): the marker is dropped too. Let the poster work.
    let all = server
        .wait_for_events("the first notice", |e| has_event_on(e, "Pod", "a"))
        .await;
    assert_eq!(all.len(), 1);
    events.record(refused("marker-2", "m"));
    let all = server
        .wait_for_events("the second marker", |e| has_event_on(e, "Pod", "marker-2"))
        .await;
    assert_eq!(
        all.len(),
        2,
        "b, c and the first marker were dropped: {all:#?}"
    );
    assert_eq!(events.stats().queue_full, 3);
}

#[tokio::test]
async fn an_event_the_api_server_refuses_is_counted_and_the_next_one_still_posted() {
    let server = FakeApiServer::start(&["v1"]).await;
    server.fail(Method::POST, "/events", 403, 1);
    let events = start(&server, config(&TestClock::new()));
    events.record(refused("web", "m"));
    events.record(refused("other", "m"));
    let all = server
        .wait_for_events("the second event", |e| has_event_on(e, "Pod", "other"))
        .await;
    assert_eq!(all.len(), 1, "{all:#?}");
    assert_eq!(
        stats_when(&events, |s| s.posted == 1).await,
        EventStats {
            posted: 1,
            failed: 1,
            ..EventStats::default()
        }
    );
}

fn create_request(pod: &str, container: &str) -> api::CreateContainerRequest {
    api::CreateContainerRequest {
        pod: Some(api::PodSandbox {
            id: format!("sandbox-{pod}"),
            name: pod.into(),
            uid: format!("uid-{pod}"),
            namespace: "team".into(),
            ..api::PodSandbox::default()
        }),
        container: Some(api::Container {
            id: format!("id-{container}"),
            pod_sandbox_id: format!("sandbox-{pod}"),
            name: container.into(),
            ..api::Container::default()
        }),
    }
}

#[tokio::test]
async fn the_nri_plugin_tells_the_recorder_which_container_it_refused_and_why() {
    let harness = Harness::new();
    let manager = Arc::new(harness.ready(TestPolicy::new(4), &[]).await);
    let recorded = Arc::new(RecordingEvents::new());
    let plugin = ResmgrPlugin::new(manager, Arc::new(())).with_recorder(recorded.clone());
    plugin
        .create_container(create_request("web", "app"))
        .await
        .unwrap();
    assert!(recorded.notices().is_empty(), "nothing to tell");
    let error = plugin
        .create_container(create_request("web", "refused-app"))
        .await
        .unwrap_err();
    let Notice::ContainerRefused {
        pod: notified,
        container,
        message,
    } = &recorded.notices()[0]
    else {
        panic!("{:?}", recorded.notices());
    };
    assert_eq!(*notified, pod("web"));
    assert_eq!(container, "refused-app");
    assert!(
        message.contains("needs more than the 4 cpus"),
        "the runtime's reason: {message}"
    );
    assert!(error.to_string().contains(message.as_str()), "{error}");
    assert_eq!(recorded.notices().len(), 1);
}

#[tokio::test]
async fn the_claim_lifecycle_tells_the_recorder_which_claims_failed_and_why() {
    let harness = Harness::new();
    let recorded = Arc::new(RecordingEvents::new());
    // Refused as a whole before the runtime synchronized: the kubelet retries; nothing to tell.
    let manager = Arc::new(harness.start(TestPolicy::new(4)).unwrap());
    let handler = LifecycleHandler::new(manager.clone()).with_recorder(recorded.clone());
    handler.prepare(&[claim_ref("missing")]).await.unwrap_err();
    assert!(recorded.notices().is_empty());

    manager.synchronize(&[]).await.unwrap();
    manager.synchronized().await;
    harness
        .claims
        .insert(integration_tests::fakes::claim("good", "pod-a", 1));
    let answers = handler
        .prepare(&[claim_ref("good"), claim_ref("missing")])
        .await
        .unwrap();
    let error = stdx::errors::chain(answers["missing"].as_ref().unwrap_err());
    assert!(answers["good"].is_ok());
    assert_eq!(
        recorded.notices(),
        [Notice::ClaimNotPrepared {
            claim: claim_ref("missing"),
            message: error,
        }]
    );
}
