//! Publishing ResourceSlices through real kube-rs against the fake API server: chunking, the
//! pool's generation and size, the empty slice, owner and labels, updates in place, republishing
//! after deletion, other nodes' and drivers' slices left alone, v1beta1 nesting, fields the API
//! server drops, and what reaches the wire fitting k8s-openapi's types exactly.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
    time::Duration,
};

use hyper::Method;
use integration_tests::fake_apiserver::FakeApiServer;
use k8s_openapi::api::resource::{v1, v1beta1};
use kube_dra::{
    DevicePublisher, NodeAllocatableCpu, Notice, PublishError, PublishStatus, PublisherConfig,
    ResourceApiVersions, RetryPolicy, SlicePublisher, fake::RecordingEvents,
    slices::validate::validate_slice_spec,
};
use policy::{AttributeValue, Capacity, Device, Quantity};
use serde_json::{Value, json};

const DRIVER: &str = "cpu.resmgr.io";
const NODE: &str = "node-a";
const NODE_UID: &str = "node-a-uid";
const OURS: &str = "spec.nodeName=node-a,spec.driver=cpu.resmgr.io";

fn device(name: &str, cpus: u64) -> Device {
    Device {
        name: name.to_owned(),
        attributes: BTreeMap::from([
            (
                "resource.kubernetes.io/numaNode".to_owned(),
                AttributeValue::Int(0),
            ),
            ("smtEnabled".to_owned(), AttributeValue::Bool(true)),
        ]),
        capacities: BTreeMap::from([(
            "cpu".to_owned(),
            Capacity {
                value: Quantity::from_units(cpus),
                request_policy: None,
            },
        )]),
        allow_multiple_allocations: true,
        taints: Vec::new(),
    }
}

fn devices(n: usize) -> Vec<Device> {
    (0..n).map(|i| device(&format!("cpu-{i}"), 1)).collect()
}

fn config() -> PublisherConfig {
    PublisherConfig {
        retry: RetryPolicy {
            attempt_timeout: Duration::from_secs(5),
            budget: Duration::from_millis(200),
            initial_backoff: Duration::from_millis(1),
            max_backoff: Duration::from_millis(5),
        },
        resync_backoff: Duration::from_millis(10),
        max_resync_backoff: Duration::from_millis(50),
        ..PublisherConfig::new(DRIVER, NODE)
    }
}

async fn start(versions: &[&str], config: PublisherConfig) -> (FakeApiServer, SlicePublisher) {
    let server = FakeApiServer::start(versions).await;
    server.insert_node(NODE, NODE_UID);
    let versions = Arc::new(ResourceApiVersions::discover(server.client()));
    let publisher = SlicePublisher::new(config, versions).unwrap();
    (server, publisher)
}

/// Runs [`SlicePublisher::maintain`] until dropped.
struct Maintained(tokio::task::JoinHandle<()>);

impl Drop for Maintained {
    fn drop(&mut self) {
        self.0.abort();
    }
}

fn maintain(publisher: &SlicePublisher) -> Maintained {
    let publisher = publisher.clone();
    Maintained(tokio::spawn(async move { publisher.maintain().await }))
}

fn ours(slices: &[Value]) -> Vec<Value> {
    slices
        .iter()
        .filter(|s| s["spec"]["nodeName"] == NODE && s["spec"]["driver"] == DRIVER)
        .cloned()
        .collect()
}

fn device_names(slice: &Value) -> Vec<String> {
    slice["spec"]["devices"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|d| d["name"].as_str().unwrap().to_owned())
        .collect()
}

fn generation(slice: &Value) -> i64 {
    slice["spec"]["pool"]["generation"].as_i64().unwrap()
}

/// Whether our pool is complete: `count` slices, one generation, the right size, `names` in order.
fn pool_is(slices: &[Value], names: &[String]) -> bool {
    let ours = ours(slices);
    let count = names.len().div_ceil(128).max(1);
    let generations: std::collections::BTreeSet<i64> = ours.iter().map(generation).collect();
    ours.len() == count
        && generations.len() == 1
        && ours
            .iter()
            .all(|s| s["spec"]["pool"]["resourceSliceCount"] == count)
        && ours.iter().flat_map(device_names).collect::<Vec<_>>() == names
}

fn names(devices: &[Device]) -> Vec<String> {
    devices.iter().map(|d| d.name.clone()).collect()
}

/// The stored object, read into k8s-openapi's v1 type and written back, is unchanged: no field
/// we sent is unknown to the Kubernetes API schema. And it passes our own slice validation.
fn assert_fits_v1(slice: &Value) {
    let typed: v1::ResourceSlice = serde_json::from_value(slice.clone()).unwrap();
    assert_eq!(
        &serde_json::to_value(&typed).unwrap(),
        slice,
        "fields unknown to v1::ResourceSlice"
    );
    validate_slice_spec(&typed.spec).unwrap();
}

fn writes(server: &FakeApiServer) -> Vec<(Method, String)> {
    server
        .requests()
        .into_iter()
        .filter(|r| r.path.contains("/resourceslices") && r.method != Method::GET)
        .map(|r| (r.method, r.path))
        .collect()
}

#[tokio::test]
async fn publishes_one_pool_in_slices_of_128_owned_by_the_node() {
    let (server, publisher) = start(&["v1"], config()).await;
    let wanted = devices(300);
    let report = publisher.publish(wanted.clone()).await.unwrap();
    assert_eq!(
        (
            report.slices,
            report.created,
            report.updated,
            report.deleted
        ),
        (3, 3, 0, 0)
    );
    assert_eq!(
        publisher.status(),
        PublishStatus {
            in_sync: true,
            failures: 0,
            node_allocatable_refused: false,
        }
    );

    let slices = server.slices();
    assert!(pool_is(&slices, &names(&wanted)), "{slices:#?}");
    let sizes: Vec<usize> = slices.iter().map(|s| device_names(s).len()).collect();
    assert_eq!(sizes, [128, 128, 44]);
    for slice in &slices {
        assert_eq!(slice["apiVersion"], "resource.k8s.io/v1");
        assert_eq!(slice["spec"]["pool"]["name"], NODE);
        assert_eq!(generation(slice), report.generation);
        assert_eq!(
            slice["metadata"]["labels"]["app.kubernetes.io/managed-by"],
            "resmgr"
        );
        assert_eq!(
            slice["metadata"]["ownerReferences"],
            json!([{"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": NODE_UID, "controller": true}])
        );
        assert!(
            slice["metadata"]["name"]
                .as_str()
                .unwrap()
                .starts_with("node-a-cpu.resmgr.io-")
        );
        assert_fits_v1(slice);
    }
    assert_eq!(
        slices[0]["spec"]["devices"][0],
        json!({
            "name": "cpu-0",
            "allowMultipleAllocations": true,
            "attributes": {"resource.kubernetes.io/numaNode": {"int": 0}, "smtEnabled": {"bool": true}},
            "capacity": {"cpu": {"value": "1"}},
        })
    );
}

#[tokio::test]
async fn no_devices_is_one_empty_slice() {
    let (server, publisher) = start(&["v1"], config()).await;
    let report = publisher.publish(Vec::new()).await.unwrap();
    assert_eq!((report.slices, report.created), (1, 1));
    let slices = server.slices();
    assert_eq!(slices.len(), 1);
    assert!(
        slices[0]["spec"].get("devices").is_none(),
        "{:#}",
        slices[0]
    );
    assert_eq!(slices[0]["spec"]["pool"]["resourceSliceCount"], 1);
    assert_fits_v1(&slices[0]);
}

#[tokio::test]
async fn changed_devices_update_the_slices_in_place_with_a_new_generation() {
    let (server, publisher) = start(&["v1"], config()).await;
    let first = publisher.publish(devices(2)).await.unwrap();
    let before = server.slices();

    let mut changed = devices(2);
    changed[1] = device("cpu-1", 2);
    let second = publisher.publish(changed).await.unwrap();

    assert_eq!((second.created, second.updated, second.deleted), (0, 1, 0));
    assert_eq!(second.generation, first.generation + 1);
    let after = server.slices();
    assert_eq!(after.len(), 1);
    assert_eq!(
        after[0]["metadata"]["name"], before[0]["metadata"]["name"],
        "updated, not re-created"
    );
    assert_eq!(after[0]["metadata"]["uid"], before[0]["metadata"]["uid"]);
    assert_eq!(generation(&after[0]), second.generation);
    assert_eq!(
        after[0]["spec"]["devices"][1]["capacity"]["cpu"]["value"],
        "2"
    );
    assert_fits_v1(&after[0]);
}

#[tokio::test]
async fn a_shrinking_pool_deletes_its_surplus_slices_first() {
    let (server, publisher) = start(&["v1"], config()).await;
    let first = publisher.publish(devices(300)).await.unwrap();
    let report = publisher.publish(devices(10)).await.unwrap();
    assert_eq!(
        (
            report.slices,
            report.created,
            report.updated,
            report.deleted
        ),
        (1, 0, 1, 2)
    );
    assert!(report.generation > first.generation);
    assert!(pool_is(&server.slices(), &names(&devices(10))));
    let methods: Vec<Method> = writes(&server)
        .into_iter()
        .map(|(m, _)| m)
        .skip(3)
        .collect();
    assert_eq!(methods, [Method::DELETE, Method::DELETE, Method::PUT]);
}

#[tokio::test]
async fn the_same_devices_again_write_nothing() {
    let (server, publisher) = start(&["v1"], config()).await;
    let first = publisher.publish(devices(130)).await.unwrap();
    let writes_before = writes(&server).len();
    let again = publisher.publish(devices(130)).await.unwrap();
    assert_eq!((again.created, again.updated, again.deleted), (0, 0, 0));
    assert_eq!(again.generation, first.generation);
    assert_eq!(writes(&server).len(), writes_before);
}

#[tokio::test]
async fn slices_deleted_by_the_kubelet_are_published_again() {
    let (server, publisher) = start(&["v1"], config()).await;
    let _maintained = maintain(&publisher);
    let wanted = names(&devices(200));
    publisher.publish(devices(200)).await.unwrap();

    // The kubelet's wipe at its start: DeleteCollection of everything on the node.
    assert_eq!(server.delete_slices("spec.nodeName=node-a"), 2);
    let slices = server
        .wait_for_slices("the wiped pool to come back", |s| pool_is(s, &wanted))
        .await;
    slices.iter().for_each(assert_fits_v1);

    // One slice of two deleted: the other still describes the pool, so it comes back as it was.
    let generation_before = generation(&slices[0]);
    let victim = slices[1]["metadata"]["name"].as_str().unwrap().to_owned();
    assert_eq!(server.delete_slices(&format!("metadata.name={victim}")), 1);
    let slices = server
        .wait_for_slices("the deleted slice to come back", |s| {
            pool_is(s, &wanted) && !s.iter().any(|x| x["metadata"]["name"] == victim.as_str())
        })
        .await;
    assert!(slices.iter().all(|s| generation(s) == generation_before));
}

#[tokio::test]
async fn a_slice_changed_by_someone_else_is_restored() {
    let (server, publisher) = start(&["v1"], config()).await;
    let _maintained = maintain(&publisher);
    let wanted = names(&devices(3));
    publisher.publish(devices(3)).await.unwrap();
    let mut edited = server.slices()[0].clone();
    edited["spec"]["devices"].as_array_mut().unwrap().pop();
    server.insert(edited);
    let slices = server
        .wait_for_slices("the edit to be undone", |s| pool_is(s, &wanted))
        .await;
    slices.iter().for_each(assert_fits_v1);
}

#[tokio::test]
async fn other_nodes_and_other_drivers_slices_are_left_alone() {
    let (server, publisher) = start(&["v1"], config()).await;
    let foreign = |name: &str, node: &str, driver: &str| {
        json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": name},
            "spec": {"driver": driver, "nodeName": node,
                     "pool": {"name": node, "generation": 7, "resourceSliceCount": 1},
                     "devices": [{"name": "other"}]},
        })
    };
    let other_node = server.insert(foreign("node-b-ours", "node-b", DRIVER));
    let other_driver = server.insert(foreign("node-a-gpu", NODE, "gpu.example.com"));
    let _maintained = maintain(&publisher);
    publisher.publish(devices(2)).await.unwrap();
    publisher.publish(devices(3)).await.unwrap();
    server.delete_slices(OURS);
    server
        .wait_for_slices("our pool to come back", |s| pool_is(s, &names(&devices(3))))
        .await;

    let slices = server.slices();
    assert!(
        slices.contains(&other_node) && slices.contains(&other_driver),
        "{slices:#?}"
    );
    for (_, path) in writes(&server) {
        assert!(
            !path.ends_with("node-b-ours") && !path.ends_with("node-a-gpu"),
            "touched {path}"
        );
    }
}

#[tokio::test]
async fn on_kubernetes_1_32_slices_are_v1beta1_with_device_fields_under_basic() {
    let (server, publisher) = start(&["v1beta1"], config()).await;
    publisher.publish(devices(2)).await.unwrap();
    let slices = server.slices();
    assert_eq!(slices.len(), 1);
    let slice = &slices[0];
    assert_eq!(slice["apiVersion"], "resource.k8s.io/v1beta1");
    assert_eq!(slice["spec"]["devices"][0]["name"], "cpu-0");
    assert_eq!(
        slice["spec"]["devices"][0]["basic"]["capacity"]["cpu"]["value"],
        "1"
    );
    let typed: v1beta1::ResourceSlice = serde_json::from_value(slice.clone()).unwrap();
    assert_eq!(
        &serde_json::to_value(&typed).unwrap(),
        slice,
        "fields unknown to v1beta1::ResourceSlice"
    );
    // Unchanged devices compare equal through the nesting: nothing is rewritten.
    let again = publisher.publish(devices(2)).await.unwrap();
    assert_eq!((again.created, again.updated, again.deleted), (0, 0, 0));
}

#[tokio::test]
async fn without_v1_slices_are_v1beta2() {
    let (server, publisher) = start(&["v1beta2", "v1beta1"], config()).await;
    publisher.publish(devices(2)).await.unwrap();
    let slices = server.slices();
    assert_eq!(slices[0]["apiVersion"], "resource.k8s.io/v1beta2");
    let typed: k8s_openapi::api::resource::v1beta2::ResourceSlice =
        serde_json::from_value(slices[0].clone()).unwrap();
    assert_eq!(serde_json::to_value(&typed).unwrap(), slices[0]);
}

#[tokio::test]
async fn fields_the_api_server_drops_are_reported_and_not_rewritten_forever() {
    let (server, publisher) = start(&["v1"], config()).await;
    // DRAConsumableCapacity off (Kubernetes 1.34/1.35 default).
    server.drop_device_fields(&["allowMultipleAllocations"]);
    let mut watched = publisher.dropped_fields();
    assert!(watched.borrow_and_update().is_empty());
    let first = publisher.publish(devices(2)).await.unwrap();
    assert_eq!(first.dropped_fields, ["devices[].allowMultipleAllocations"]);
    // Whoever watches learns it too, once.
    assert!(watched.has_changed().unwrap());
    assert_eq!(
        watched.borrow_and_update().iter().collect::<Vec<_>>(),
        ["devices[].allowMultipleAllocations"]
    );
    let again = publisher.publish(devices(2)).await.unwrap();
    assert_eq!((again.created, again.updated, again.deleted), (0, 0, 0));
    assert!(again.dropped_fields.is_empty(), "reported once");
    assert!(!watched.has_changed().unwrap());
}

#[tokio::test]
async fn list_attributes_refused_without_their_gate_are_left_out_and_named() {
    let with_roots = || {
        let mut d = device("numa-0", 8);
        d.attributes.insert(
            "resource.kubernetes.io/pcieRoot".to_owned(),
            AttributeValue::Strings(vec!["pci0000:00".into()]),
        );
        vec![d]
    };
    // With the gate the list is published as it is.
    let (server, publisher) = start(&["v1"], config()).await;
    let report = publisher.publish(with_roots()).await.unwrap();
    assert!(report.dropped_fields.is_empty());
    assert_eq!(
        server.slices()[0]["spec"]["devices"][0]["attributes"]["resource.kubernetes.io/pcieRoot"],
        serde_json::json!({"strings": ["pci0000:00"]})
    );

    // Without it the API server refuses the slice; the publisher publishes without the list and
    // names it, once.
    let (server, publisher) = start(&["v1"], config()).await;
    let events = Arc::new(RecordingEvents::new());
    let publisher = publisher.with_recorder(events.clone());
    server.turn_list_attributes_off();
    let report = publisher.publish(with_roots()).await.unwrap();
    assert_eq!(report.created, 1);
    assert_eq!(
        report.dropped_fields,
        [r#"devices[].attributes["resource.kubernetes.io/pcieRoot"].strings"#]
    );
    assert_eq!(
        publisher.dropped_fields().borrow().len(),
        1,
        "whoever watches learns it too"
    );
    let stored = &server.slices()[0]["spec"]["devices"][0]["attributes"];
    assert!(
        stored.get("resource.kubernetes.io/pcieRoot").is_none(),
        "{stored}"
    );
    assert_eq!(
        stored["resource.kubernetes.io/numaNode"],
        serde_json::json!({"int": 0})
    );
    let again = publisher.publish(with_roots()).await.unwrap();
    assert_eq!((again.created, again.updated, again.deleted), (0, 0, 0));
    assert!(again.dropped_fields.is_empty(), "reported once");
    assert_degraded_once(&events, "resource.kubernetes.io/pcieRoot");
}

/// The one Event on the Node a publication without something asked for makes, naming `what`.
fn assert_degraded_once(events: &RecordingEvents, what: &str) {
    let notices = events.notices();
    assert!(
        matches!(&notices[..], [Notice::PublicationDegraded { message }] if message.contains(what)),
        "{notices:?}"
    );
    assert_eq!(notices[0].reason(), "PublicationDegraded");
}

#[tokio::test]
async fn node_allocatable_mapping_is_published_only_when_switched_on() {
    let (server, publisher) = start(&["v1"], config()).await;
    publisher.publish(vec![device("numa-0", 8)]).await.unwrap();
    assert!(
        server.slices()[0]["spec"]["devices"][0]
            .get("nodeAllocatableResourceMappings")
            .is_none()
    );

    let on = PublisherConfig {
        node_allocatable_cpu: Some(NodeAllocatableCpu::default()),
        ..config()
    };
    let (server, publisher) = start(&["v1"], on).await;
    publisher.publish(vec![device("numa-0", 8)]).await.unwrap();
    let slice = &server.slices()[0];
    // Both forms: 1.36's, and 1.37's, which spells out the multiplier.
    assert_eq!(
        slice["spec"]["devices"][0]["nodeAllocatableResourceMappings"],
        json!({"cpu": {"capacityKey": "cpu"}})
    );
    assert_eq!(
        slice["spec"]["devices"][0]["nodeAllocatableResources"],
        json!({"cpu": {"mapping": {"capacityKey": "cpu", "capacityMultiplier": "1"}}})
    );
    // The rest is what k8s-openapi's v1 (1.36) types know.
    let mut older = slice.clone();
    older["spec"]["devices"][0]
        .as_object_mut()
        .unwrap()
        .remove("nodeAllocatableResources");
    assert_fits_v1(&older);
}

/// Each API server keeps the form of the node-allocatable mapping its release knows and drops
/// the other: that is no gate being off, nothing is reported, and what it kept is not rewritten.
/// With the gate off both go, and both are reported.
#[tokio::test]
async fn the_form_of_the_mapping_a_release_does_not_know_is_not_a_dropped_field() {
    let on = || PublisherConfig {
        node_allocatable_cpu: Some(NodeAllocatableCpu::default()),
        ..config()
    };
    for (release, unknown) in [
        ("1.36", "nodeAllocatableResources"),
        ("1.37", "nodeAllocatableResourceMappings"),
    ] {
        let (server, publisher) = start(&["v1"], on()).await;
        server.drop_device_fields(&[unknown]);
        let first = publisher
            .publish(vec![device("numa-0", 8), device("numa-1", 8)])
            .await
            .unwrap();
        assert_eq!(first.created, 1, "{release}");
        assert!(first.dropped_fields.is_empty(), "{release}: {first:?}");
        assert!(publisher.dropped_fields().borrow().is_empty(), "{release}");
        let kept = &server.slices()[0]["spec"]["devices"][1];
        assert!(kept.get(unknown).is_none(), "{release}: {kept}");
        assert!(kept.as_object().unwrap().len() > 1, "{release}: {kept}");
        let again = publisher
            .publish(vec![device("numa-0", 8), device("numa-1", 8)])
            .await
            .unwrap();
        assert_eq!(
            (again.created, again.updated, again.deleted),
            (0, 0, 0),
            "{release}: what the API server kept is what we want"
        );
    }

    let (server, publisher) = start(&["v1"], on()).await;
    server.drop_device_fields(&[
        "nodeAllocatableResourceMappings",
        "nodeAllocatableResources",
    ]);
    let gate_off = publisher.publish(vec![device("numa-0", 8)]).await.unwrap();
    assert_eq!(
        gate_off.dropped_fields,
        [
            "devices[].nodeAllocatableResourceMappings",
            "devices[].nodeAllocatableResources"
        ]
    );
}

fn mapping_on() -> PublisherConfig {
    PublisherConfig {
        node_allocatable_cpu: Some(NodeAllocatableCpu::default()),
        ..config()
    }
}

/// Whether every device of our pool maps its cpu to the node (in 1.37's form, which the fake
/// API server keeps along with 1.36's) or none does.
fn pool_maps(slices: &[Value]) -> Option<bool> {
    let maps: BTreeSet<bool> = ours(slices)
        .iter()
        .flat_map(|s| s["spec"]["devices"].as_array().cloned().unwrap_or_default())
        .map(|d| {
            let newer = d.get("nodeAllocatableResources").is_some();
            assert_eq!(
                newer,
                d.get("nodeAllocatableResourceMappings").is_some(),
                "{d}"
            );
            newer
        })
        .collect();
    (maps.len() == 1).then(|| maps.into_iter().next().unwrap())
}

/// A 1.37 API server refuses slices that map node resources for a Node whose kubelet does not
/// declare the feature (403 from NodeDeclaredFeatureValidator). The agent publishes the same
/// devices without the mapping at once, says so, does not try the refused form again on every
/// publication, and maps again once the Node declares the feature: its kubelet restarted with
/// the gate, declaring it and wiping our slices.
#[tokio::test]
async fn a_refused_node_allocatable_mapping_falls_back_to_slices_without_it() {
    let (server, publisher) = start(&["v1"], mapping_on()).await;
    let events = Arc::new(RecordingEvents::new());
    let publisher = publisher.with_recorder(events.clone());
    server.check_node_declared_features(true);
    let numa = || vec![device("numa-0", 8), device("numa-1", 8)];
    let report = publisher.publish(numa()).await.unwrap();
    assert_eq!(report.created, 1, "{report:?}");
    assert_eq!(pool_maps(&server.slices()), Some(false));
    assert!(pool_is(&server.slices(), &names(&numa())));
    let status = publisher.status();
    assert!(
        status.in_sync && status.node_allocatable_refused,
        "{status:?}"
    );
    assert_eq!(status.failures, 0, "a fallback is no failure");
    let refused_writes = writes(&server).len();
    assert_eq!(
        refused_writes, 2,
        "the refused create and the one without the mapping"
    );

    let again = publisher.publish(numa()).await.unwrap();
    assert_eq!((again.created, again.updated, again.deleted), (0, 0, 0));
    assert_eq!(
        writes(&server).len(),
        refused_writes,
        "no new attempt at the refused form before its retry is due"
    );
    assert_degraded_once(&events, "node-allocatable mapping");

    let _maintained = maintain(&publisher);
    server.declare_node_features(NODE, &["DRANodeAllocatableResources"]);
    server.delete_slices(OURS);
    server
        .wait_for_slices("the pool published with the mapping", |s| {
            pool_is(s, &names(&numa())) && pool_maps(s) == Some(true)
        })
        .await;
    // Once the republication is done (it holds the publisher while it runs), nothing is left
    // to write and nothing refused.
    let after = publisher.publish(numa()).await.unwrap();
    assert_eq!((after.created, after.updated, after.deleted), (0, 0, 0));
    assert!(!publisher.status().node_allocatable_refused);
}

/// The refused form is tried again at the configured interval, for refusals the Node does not
/// show (here the API server stops checking): the mapping comes back without any event.
#[tokio::test]
async fn a_refused_node_allocatable_mapping_is_tried_again_at_its_interval() {
    let (server, publisher) = start(
        &["v1"],
        PublisherConfig {
            node_allocatable_retry: Duration::from_millis(50),
            ..mapping_on()
        },
    )
    .await;
    server.check_node_declared_features(true);
    let _maintained = maintain(&publisher);
    publisher.publish(vec![device("numa-0", 8)]).await.unwrap();
    assert_eq!(pool_maps(&server.slices()), Some(false));
    assert!(publisher.status().node_allocatable_refused);
    server.check_node_declared_features(false);
    server
        .wait_for_slices("the mapping tried again and admitted", |s| {
            pool_maps(s) == Some(true)
        })
        .await;
    let after = publisher.publish(vec![device("numa-0", 8)]).await.unwrap();
    assert_eq!((after.created, after.updated, after.deleted), (0, 0, 0));
    assert!(!publisher.status().node_allocatable_refused);
}

/// Another 403 (RBAC, say) is a failed publication, not a reason to drop the mapping.
#[tokio::test]
async fn other_refusals_are_failures_and_keep_the_mapping() {
    let (server, publisher) = start(&["v1"], mapping_on()).await;
    server.fail(Method::POST, "/resourceslices", 403, 1);
    let error = publisher
        .publish(vec![device("numa-0", 8)])
        .await
        .unwrap_err();
    assert!(matches!(error, PublishError::Api { .. }), "{error:?}");
    assert!(server.slices().is_empty());
    let status = publisher.status();
    assert!(
        !status.in_sync && !status.node_allocatable_refused,
        "{status:?}"
    );
    publisher.publish(vec![device("numa-0", 8)]).await.unwrap();
    assert_eq!(pool_maps(&server.slices()), Some(true));
}

#[tokio::test]
async fn invalid_devices_never_reach_the_api_server() {
    let (server, publisher) = start(&["v1"], config()).await;
    let mut bad = devices(2);
    bad[1]
        .attributes
        .insert("not a name".to_owned(), AttributeValue::Bool(true));
    let error = publisher.publish(bad).await.unwrap_err();
    let PublishError::Invalid(invalid) = &error else {
        panic!("expected invalid, got {error:?}")
    };
    assert_eq!(
        (invalid.device.as_str(), invalid.field.as_str()),
        ("cpu-1", "attributes[not a name]")
    );
    assert!(server.requests().is_empty(), "{:?}", server.requests());
}

#[tokio::test]
async fn a_write_conflict_starts_the_reconciliation_over() {
    let (server, publisher) = start(&["v1"], config()).await;
    publisher.publish(devices(2)).await.unwrap();
    server.fail(Method::PUT, "/resourceslices/", 409, 1);
    let report = publisher.publish(devices(3)).await.unwrap();
    assert_eq!(report.updated, 1);
    assert!(pool_is(&server.slices(), &names(&devices(3))));
    let puts = writes(&server)
        .into_iter()
        .filter(|(m, _)| *m == Method::PUT)
        .count();
    assert_eq!(
        puts, 2,
        "the conflicting update and the one after listing again"
    );
}

#[tokio::test]
async fn a_failed_publication_is_retried_in_the_background() {
    let (server, publisher) = start(&["v1"], config()).await;
    server.fail(Method::POST, "/resourceslices", 500, 40);
    let error = publisher.publish(devices(2)).await.unwrap_err();
    assert!(matches!(error, PublishError::Api { .. }), "{error:?}");
    assert!(
        error
            .to_string()
            .contains("creating a resource slice of node node-a"),
        "{error}"
    );
    assert!(server.slices().is_empty());
    assert_eq!(
        publisher.status(),
        PublishStatus {
            in_sync: false,
            failures: 1,
            node_allocatable_refused: false,
        }
    );
    let _maintained = maintain(&publisher);
    server
        .wait_for_slices("the retried publication", |s| {
            pool_is(s, &names(&devices(2)))
        })
        .await;
}

/// The topology-aware policy's individual devices of a 1,024-CPU machine (one per CPU, CPU 0
/// reserved): 8 slices of one pool, each counting the pool's 8 slices, each passing the API
/// server's rules.
#[tokio::test]
async fn individual_devices_of_a_1024_cpu_machine_are_eight_slices_of_one_pool() {
    use policy::{
        Policy, Topology, TopologyAware, TopologySource,
        topology_aware::{Config, DeviceMode, DeviceModel},
    };
    let topo = Topology::load(&TopologySource::Synthetic(
        "pack:4 numa:4 core:32 pu:2".into(),
    ))
    .unwrap();
    let individual = Config {
        devices: DeviceModel {
            mode: DeviceMode::Individual,
            ..DeviceModel::default()
        },
        ..Config::default()
    };
    let devices = TopologyAware::new(topo, individual)
        .unwrap()
        .devices()
        .unwrap();
    assert_eq!(devices.len(), 1_023);
    let (server, publisher) = start(&["v1"], config()).await;
    let report = publisher.publish(devices).await.unwrap();
    assert_eq!((report.slices, report.created), (8, 8));
    let slices = server.slices();
    assert_eq!(slices.len(), 8);
    let mut total = 0;
    for slice in &slices {
        assert_eq!(slice["spec"]["pool"]["resourceSliceCount"], 8);
        let spec: v1::ResourceSliceSpec = serde_json::from_value(slice["spec"].clone()).unwrap();
        validate_slice_spec(&spec).unwrap();
        total += device_names(slice).len();
    }
    assert_eq!(total, 1_023);
}
