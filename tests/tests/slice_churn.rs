//! How often an agent writes its ResourceSlices in a day of churn: claims coming and going,
//! agent restarts, the kubelet wiping the node's slices, and one reconfiguration. The agent
//! publishes the policy's devices at start and republishes after an unprepare when they changed;
//! this test publishes after every claim regardless, with a new publisher at every restart (a new
//! process), and counts the writes the fake API server sees: only the first publication, the
//! kubelet's wipe and the reconfiguration write anything.

use std::{sync::Arc, time::Duration};

use hyper::Method;
use integration_tests::{
    fake_apiserver::FakeApiServer,
    fakes::{DRIVER, claim_on},
};
use kube_dra::{
    DevicePublisher as _, PublisherConfig, ResourceApiVersions, RetryPolicy, SlicePublisher,
};
use policy::{
    Policy, Topology, TopologyAware, TopologySource,
    topology_aware::{Config, DeviceMode, DeviceModel, ReservedCpus},
};

const NODE: &str = "node-a";
/// Two sockets, 4 NUMA nodes, 128 threads: 126 individual devices, one slice.
const SERVER: &str = "pack:2 numa:2 core:16 pu:2";

fn node_policy(mode: DeviceMode) -> Box<dyn Policy> {
    let topology = Topology::load(&TopologySource::Synthetic(SERVER.into())).unwrap();
    let config = Config {
        driver: DRIVER.into(),
        reserved_cpus: ReservedCpus::Count(2),
        devices: DeviceModel {
            mode,
            ..DeviceModel::default()
        },
        ..Config::default()
    };
    Box::new(TopologyAware::new(topology, config).unwrap())
}

/// A new agent process's publisher.
fn publisher(server: &FakeApiServer) -> SlicePublisher {
    let config = PublisherConfig {
        retry: RetryPolicy {
            attempt_timeout: Duration::from_secs(5),
            ..RetryPolicy::default()
        },
        ..PublisherConfig::new(DRIVER, NODE)
    };
    SlicePublisher::new(
        config,
        Arc::new(ResourceApiVersions::discover(server.client())),
    )
    .unwrap()
}

/// Creates, updates and deletes of slices so far.
fn writes(server: &FakeApiServer) -> usize {
    server
        .requests()
        .iter()
        .filter(|r| r.path.contains("/resourceslices") && r.method != Method::GET)
        .count()
}

#[tokio::test]
async fn a_day_of_churn_writes_slices_only_at_first_start_after_a_wipe_and_on_reconfiguration() {
    let server = FakeApiServer::start(&["v1"]).await;
    server.insert_node(NODE, "node-a-uid");
    let mut policy = node_policy(DeviceMode::Individual);
    let devices = policy.devices().unwrap();
    assert_eq!(devices.len(), 126);

    // The first start: the pool is created, one slice.
    let report = publisher(&server).publish(devices.clone()).await.unwrap();
    assert_eq!((report.created, report.generation), (1, 1));
    assert_eq!(writes(&server), 1);

    // A day: 3 restarts, and between them claims prepared and unprepared, 12 at a time.
    for restart in 0..3 {
        let agent = publisher(&server);
        let report = agent.publish(policy.devices().unwrap()).await.unwrap();
        assert_eq!(
            (report.created, report.updated, report.deleted),
            (0, 0, 0),
            "restart {restart}"
        );
        for wave in 0..2 {
            let uids: Vec<String> = (0..12).map(|i| format!("r{restart}-w{wave}-{i}")).collect();
            for (i, uid) in uids.iter().enumerate() {
                // An individual device: no share, nothing consumed.
                let mut claim = claim_on(uid, "pod", &format!("cpu{}", 2 + i * 4), 1);
                claim.results[0].share_id = None;
                claim.results[0].consumed_capacity.clear();
                policy.allocate_claim(&claim).unwrap();
                agent.publish(policy.devices().unwrap()).await.unwrap();
            }
            for uid in &uids {
                policy.release_claim(uid).unwrap();
                agent.publish(policy.devices().unwrap()).await.unwrap();
            }
        }
        assert_eq!(
            policy.devices().unwrap(),
            devices,
            "claims change no device"
        );
    }
    assert_eq!(writes(&server), 1, "restarts and claims wrote nothing");

    // A restart the kubelet outlived its grace period for: it wiped the node's slices, and the
    // agent creates them again, at the same generation.
    assert_eq!(server.delete_slices(&format!("spec.nodeName={NODE}")), 1);
    let report = publisher(&server).publish(devices.clone()).await.unwrap();
    assert_eq!((report.created, report.generation), (1, 1));
    assert_eq!(writes(&server), 2);

    // A reconfiguration (individual to grouped): the slice is updated in place, generation 2.
    let grouped = node_policy(DeviceMode::Grouped).devices().unwrap();
    let report = publisher(&server).publish(grouped).await.unwrap();
    assert_eq!(
        (
            report.created,
            report.updated,
            report.deleted,
            report.generation
        ),
        (0, 1, 0, 2)
    );
    assert_eq!(writes(&server), 3);
}
