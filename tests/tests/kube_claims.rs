//! Reading ResourceClaims through real kube-rs against the fake API server: found, missing, wrong
//! UID, not allocated, other drivers' results, our configurations, version fallback, retries.

use std::{sync::Arc, time::Duration};

use hyper::Method;
use integration_tests::fake_apiserver::FakeApiServer;
use kube_dra::{
    ClaimReadError, ClaimReader, DiscoveryError, KubeClaimReader, ResourceApiVersions, RetryPolicy,
};
use kubelet_plugin::ClaimRef;
use policy::{AllocationResult, ClaimConfig, ConfigSource, Quantity};
use serde_json::{Value, json};

const DRIVER: &str = "cpu.resmgr.io";

fn claim(version: &str, name: &str, uid: &str, status: Value) -> Value {
    json!({
        "apiVersion": format!("resource.k8s.io/{version}"),
        "kind": "ResourceClaim",
        "metadata": {"namespace": "team", "name": name, "uid": uid},
        "spec": {"devices": {"requests": [{"name": "cpus", "exactly": {"deviceClassName": "cpu"}}]}},
        "status": status,
    })
}

fn allocated(results: Value) -> Value {
    json!({
        "allocation": {"devices": {"results": results}},
        "reservedFor": [
            {"resource": "pods", "name": "web-0", "uid": "pod-uid-1"},
            {"apiGroup": "batch", "resource": "jobs", "name": "j", "uid": "job-uid"},
            // Each differs from a pod in one way only: another group's "pods", a core-group
            // resource that is not pods.
            {"apiGroup": "example.com", "resource": "pods", "name": "x", "uid": "crd-pod-uid"},
            {"resource": "services", "name": "s", "uid": "service-uid"},
            {"resource": "pods", "name": "web-1", "uid": "pod-uid-2"},
        ],
    })
}

fn result(driver: &str, request: &str, device: &str) -> Value {
    json!({"request": request, "driver": driver, "pool": "node-a", "device": device})
}

/// Quick retries, so tests that exhaust them finish fast.
fn quick() -> RetryPolicy {
    RetryPolicy {
        attempt_timeout: Duration::from_secs(5),
        budget: Duration::from_millis(300),
        initial_backoff: Duration::from_millis(1),
        max_backoff: Duration::from_millis(5),
    }
}

fn reader(server: &FakeApiServer, retry: RetryPolicy) -> KubeClaimReader {
    let versions = Arc::new(ResourceApiVersions::discover(server.client()));
    KubeClaimReader::new(versions, DRIVER, retry)
}

fn claim_gets(server: &FakeApiServer) -> Vec<String> {
    server
        .requests()
        .into_iter()
        .filter(|r| r.method == Method::GET && r.path.contains("/resourceclaims/"))
        .map(|r| r.path)
        .collect()
}

#[tokio::test]
async fn found_claim_keeps_our_results_in_order_and_its_pods() {
    let server = FakeApiServer::start(&["v1", "v1beta2", "v1beta1"]).await;
    let mut shared = result(DRIVER, "cpus", "numa-0");
    shared["shareID"] = json!("share-1");
    shared["consumedCapacity"] = json!({"cpu": "1500m"});
    server.insert(claim(
        "v1",
        "c1",
        "uid-1",
        allocated(json!([
            shared,
            result("gpu.example.com", "gpu", "gpu-0"),
            result(DRIVER, "more/sub", "numa-1"),
        ])),
    ));

    let got = reader(&server, quick())
        .get_claim(&ClaimRef::new("team", "c1", "uid-1"))
        .await
        .unwrap();

    assert_eq!(
        (got.uid.as_str(), got.namespace.as_str(), got.name.as_str()),
        ("uid-1", "team", "c1")
    );
    assert_eq!(got.reserved_for, ["pod-uid-1", "pod-uid-2"]);
    assert_eq!(
        got.results,
        [
            AllocationResult {
                request: "cpus".into(),
                pool: "node-a".into(),
                device: "numa-0".into(),
                share_id: Some("share-1".into()),
                consumed_capacity: [("cpu".to_owned(), Quantity::from_milli(1500))].into(),
            },
            AllocationResult {
                request: "more/sub".into(),
                pool: "node-a".into(),
                device: "numa-1".into(),
                share_id: None,
                consumed_capacity: Default::default(),
            },
        ]
    );
    assert_eq!(
        claim_gets(&server),
        ["/apis/resource.k8s.io/v1/namespaces/team/resourceclaims/c1"]
    );
}

#[tokio::test]
async fn missing_claim_is_refused_naming_it() {
    let server = FakeApiServer::start(&["v1"]).await;
    let error = reader(&server, quick())
        .get_claim(&ClaimRef::new("team", "gone", "uid-9"))
        .await
        .unwrap_err();
    assert!(
        matches!(error, ClaimReadError::NotFound { .. }),
        "{error:?}"
    );
    assert_eq!(
        error.to_string(),
        "resource claim team/gone (uid uid-9) not found"
    );
    assert_eq!(
        claim_gets(&server).len(),
        1,
        "not found is final, not retried"
    );
}

#[tokio::test]
async fn claim_with_another_uid_is_refused() {
    let server = FakeApiServer::start(&["v1"]).await;
    server.insert(claim(
        "v1",
        "c1",
        "uid-new",
        allocated(json!([result(DRIVER, "cpus", "numa-0")])),
    ));
    let error = reader(&server, quick())
        .get_claim(&ClaimRef::new("team", "c1", "uid-old"))
        .await
        .unwrap_err();
    match &error {
        ClaimReadError::UidMismatch { claim, found } => {
            assert_eq!((claim.uid.as_str(), found.as_str()), ("uid-old", "uid-new"));
        }
        other => panic!("expected a uid mismatch, got {other:?}"),
    }
    assert!(error.to_string().contains("team/c1"), "{error}");
}

#[tokio::test]
async fn unallocated_claim_is_refused() {
    let server = FakeApiServer::start(&["v1"]).await;
    server.insert(claim("v1", "pending", "uid-1", json!({})));
    let error = reader(&server, quick())
        .get_claim(&ClaimRef::new("team", "pending", "uid-1"))
        .await
        .unwrap_err();
    assert!(
        matches!(error, ClaimReadError::NotAllocated { .. }),
        "{error:?}"
    );
    assert_eq!(
        error.to_string(),
        "resource claim team/pending (uid uid-1) is not allocated"
    );
}

#[tokio::test]
async fn claim_of_other_drivers_only_reads_as_empty_results() {
    let server = FakeApiServer::start(&["v1"]).await;
    server.insert(claim(
        "v1",
        "gpus",
        "uid-1",
        allocated(json!([result("gpu.example.com", "gpu", "gpu-0")])),
    ));
    let got = reader(&server, quick())
        .get_claim(&ClaimRef::new("team", "gpus", "uid-1"))
        .await
        .unwrap();
    assert!(got.results.is_empty());
    assert_eq!(got.reserved_for, ["pod-uid-1", "pod-uid-2"]);
}

#[tokio::test]
async fn bad_consumed_capacity_names_the_field() {
    let server = FakeApiServer::start(&["v1"]).await;
    let mut bad = result(DRIVER, "cpus", "numa-0");
    bad["consumedCapacity"] = json!({"cpu": "lots"});
    server.insert(claim("v1", "c1", "uid-1", allocated(json!([bad]))));
    let error = reader(&server, quick())
        .get_claim(&ClaimRef::new("team", "c1", "uid-1"))
        .await
        .unwrap_err();
    match &error {
        ClaimReadError::Invalid { field, .. } => {
            assert_eq!(
                field,
                "status.allocation.devices.results[0].consumedCapacity[cpu]"
            );
        }
        other => panic!("expected invalid, got {other:?}"),
    }
}

#[tokio::test]
async fn without_v1_the_claim_is_read_as_v1beta2() {
    let server = FakeApiServer::start(&["v1beta2", "v1beta1"]).await;
    server.insert(claim(
        "v1beta2",
        "c1",
        "uid-1",
        allocated(json!([result(DRIVER, "cpus", "numa-0")])),
    ));
    let got = reader(&server, quick())
        .get_claim(&ClaimRef::new("team", "c1", "uid-1"))
        .await
        .unwrap();
    assert_eq!(got.results.len(), 1);
    assert_eq!(
        claim_gets(&server),
        ["/apis/resource.k8s.io/v1beta2/namespaces/team/resourceclaims/c1"]
    );
}

#[tokio::test]
async fn on_kubernetes_1_32_the_claim_is_read_as_v1beta1() {
    let server = FakeApiServer::start(&["v1beta1"]).await;
    // v1beta1 requests are flat; the allocation has the same shape in every version.
    let mut object = claim(
        "v1beta1",
        "c1",
        "uid-1",
        allocated(json!([result(DRIVER, "cpus", "numa-0")])),
    );
    object["spec"] =
        json!({"devices": {"requests": [{"name": "cpus", "deviceClassName": "cpu", "count": 1}]}});
    server.insert(object);
    let got = reader(&server, quick())
        .get_claim(&ClaimRef::new("team", "c1", "uid-1"))
        .await
        .unwrap();
    assert_eq!(got.results[0].device, "numa-0");
    assert_eq!(
        claim_gets(&server),
        ["/apis/resource.k8s.io/v1beta1/namespaces/team/resourceclaims/c1"]
    );
}

#[tokio::test]
async fn a_version_that_stops_being_served_is_rediscovered() {
    let server = FakeApiServer::start(&["v1", "v1beta2"]).await;
    server.insert(claim(
        "v1",
        "c1",
        "uid-1",
        allocated(json!([result(DRIVER, "cpus", "numa-0")])),
    ));
    let reader = reader(&server, quick());
    let wanted = ClaimRef::new("team", "c1", "uid-1");
    reader.get_claim(&wanted).await.unwrap();
    server.set_served(&["v1beta2"]);
    reader.get_claim(&wanted).await.unwrap();
    assert_eq!(
        claim_gets(&server),
        [
            "/apis/resource.k8s.io/v1/namespaces/team/resourceclaims/c1",
            "/apis/resource.k8s.io/v1/namespaces/team/resourceclaims/c1",
            "/apis/resource.k8s.io/v1beta2/namespaces/team/resourceclaims/c1",
        ]
    );
}

#[tokio::test]
async fn transient_failures_are_retried() {
    let server = FakeApiServer::start(&["v1"]).await;
    server.insert(claim(
        "v1",
        "c1",
        "uid-1",
        allocated(json!([result(DRIVER, "cpus", "numa-0")])),
    ));
    server.fail(Method::GET, "/resourceclaims/c1", 503, 2);
    let retry = RetryPolicy {
        budget: Duration::from_secs(10),
        ..quick()
    };
    let got = reader(&server, retry)
        .get_claim(&ClaimRef::new("team", "c1", "uid-1"))
        .await
        .unwrap();
    assert_eq!(got.results.len(), 1);
    assert_eq!(claim_gets(&server).len(), 3);
}

#[tokio::test]
async fn retries_stop_at_the_budget_with_an_error_naming_the_claim() {
    let server = FakeApiServer::start(&["v1"]).await;
    server.fail(Method::GET, "/resourceclaims/c1", 500, usize::MAX);
    let error = reader(&server, quick())
        .get_claim(&ClaimRef::new("team", "c1", "uid-1"))
        .await
        .unwrap_err();
    let ClaimReadError::Api { claim, source } = &error else {
        panic!("expected an api error, got {error:?}")
    };
    assert_eq!(claim.name, "c1");
    assert!(source.attempts > 1, "{source}");
    assert_eq!(claim_gets(&server).len(), source.attempts as usize);
    assert!(error.to_string().contains("team/c1"), "{error}");
}

#[tokio::test]
async fn forbidden_is_final_at_once() {
    let server = FakeApiServer::start(&["v1"]).await;
    server.fail(Method::GET, "/resourceclaims/c1", 403, 1);
    let error = reader(&server, quick())
        .get_claim(&ClaimRef::new("team", "c1", "uid-1"))
        .await
        .unwrap_err();
    let ClaimReadError::Api { source, .. } = &error else {
        panic!("{error:?}")
    };
    assert_eq!(source.attempts, 1);
    assert_eq!(claim_gets(&server).len(), 1);
}

#[tokio::test]
async fn a_cluster_without_dra_says_so() {
    let server = FakeApiServer::start(&[]).await;
    let error = reader(&server, quick())
        .get_claim(&ClaimRef::new("team", "c1", "uid-1"))
        .await
        .unwrap_err();
    let ClaimReadError::Discovery { source, .. } = &error else {
        panic!("expected a discovery error, got {error:?}")
    };
    assert!(
        matches!(**source, DiscoveryError::GroupNotServed),
        "{error:?}"
    );
}

fn opaque(source: &str, requests: Value, driver: &str, parameters: Value) -> Value {
    json!({
        "source": source,
        "requests": requests,
        "opaque": {"driver": driver, "parameters": parameters},
    })
}

fn with_config(results: Value, config: Value) -> Value {
    let mut status = allocated(results);
    status["allocation"]["devices"]["config"] = config;
    status
}

async fn read_config(version: &str, config: Value) -> Result<Vec<ClaimConfig>, ClaimReadError> {
    let server = FakeApiServer::start(&[version]).await;
    let mut object = claim(
        version,
        "c1",
        "uid-1",
        with_config(json!([result(DRIVER, "cpus", "numa-0")]), config),
    );
    if version == "v1beta1" {
        object["spec"] = json!({"devices": {"requests": [{"name": "cpus", "deviceClassName": "cpu", "count": 1}]}});
    }
    server.insert(object);
    reader(&server, quick())
        .get_claim(&ClaimRef::new("team", "c1", "uid-1"))
        .await
        .map(|c| c.config)
}

#[tokio::test]
async fn our_configurations_are_carried_in_order_and_others_dropped() {
    let ours = |n: u32| json!({"apiVersion": "resmgr.io/v1alpha1", "kind": "CpuConfig", "n": n});
    let config = json!([
        opaque("FromClass", json!([]), DRIVER, ours(1)),
        opaque("FromClaim", json!(["gpu"]), "gpu.example.com", json!({"sharing": "time"})),
        // A configuration that is not opaque (a kind a later API may add) is not ours.
        {"source": "FromClaim", "requests": ["cpus"]},
        opaque("FromClaim", json!(["cpus", "more/sub"]), DRIVER, ours(2)),
    ]);
    let want = vec![
        ClaimConfig {
            source: ConfigSource::Class,
            requests: vec![],
            parameters: ours(1),
        },
        ClaimConfig {
            source: ConfigSource::Claim,
            requests: vec!["cpus".into(), "more/sub".into()],
            parameters: ours(2),
        },
    ];
    assert_eq!(read_config("v1", config.clone()).await.unwrap(), want);
    // The same JSON in v1beta1 (Kubernetes 1.32), where requests are flat and
    // `requests: null` means all requests.
    let mut old = config;
    old[0]["requests"] = Value::Null;
    assert_eq!(read_config("v1beta1", old).await.unwrap(), want);
}

#[tokio::test]
async fn a_malformed_configuration_of_ours_is_refused_naming_its_path() {
    let params = json!({"apiVersion": "resmgr.io/v1alpha1", "kind": "CpuConfig"});
    let cases = [
        (
            json!([opaque("FromNowhere", json!([]), DRIVER, params.clone())]),
            "status.allocation.devices.config[0].source",
        ),
        (
            json!([
                opaque("FromClass", json!([]), DRIVER, params.clone()),
                opaque("FromClaim", json!(["cpus", ""]), DRIVER, params.clone()),
            ]),
            "status.allocation.devices.config[1].requests[1]",
        ),
        (
            json!([{"source": "FromClaim", "opaque": {"driver": DRIVER}}]),
            "status.allocation.devices.config[0].opaque.parameters",
        ),
        (
            json!([opaque("FromClaim", json!("cpus"), DRIVER, params.clone())]),
            "status.allocation.devices.config[0]",
        ),
        (json!({"not": "a list"}), "status.allocation.devices.config"),
    ];
    for (config, want) in cases {
        let error = read_config("v1", config).await.unwrap_err();
        match &error {
            ClaimReadError::Invalid { claim, field, .. } => {
                assert_eq!((claim.name.as_str(), field.as_str()), ("c1", want));
            }
            other => panic!("expected invalid, got {other:?}"),
        }
        assert!(error.to_string().contains("team/c1"), "{error}");
    }
}
