//! Device health end to end in one process: resmgr's health monitor, reading a sysfs root of the
//! test's own, feeding the kubelet plugin's resource health stream, read over the DRA socket
//! with a gRPC client of our health proto.

use std::{collections::BTreeMap, path::Path, sync::Arc, time::Duration};

use dra_proto::health_v1alpha1::{
    HealthStatus, NodeWatchResourcesRequest, NodeWatchResourcesResponse,
    dra_resource_health_client::DraResourceHealthClient,
};
use integration_tests::kubelet;
use kubelet_plugin::{
    ClaimHandler, ClaimRef, KubeletConfig, KubeletPlugin, PrepareResults, RequestError,
    UnprepareResults,
};
use policy::CpuSet;
use resmgr::health::{HealthConfig, HealthMonitor};
use tonic::Streaming;

/// Bounds every wait; nothing here comes near it.
const DEADLINE: Duration = Duration::from_secs(10);

/// Claims are not what this is about.
#[derive(Debug)]
struct NoClaims;

impl ClaimHandler for NoClaims {
    async fn prepare(&self, _: &[ClaimRef]) -> Result<PrepareResults, RequestError> {
        Err(RequestError::Unavailable("no claims here".into()))
    }
    async fn unprepare(&self, _: &[ClaimRef]) -> Result<UnprepareResults, RequestError> {
        Err(RequestError::Unavailable("no claims here".into()))
    }
}

fn set_online(root: &Path, list: &str) {
    let dir = root.join("devices/system/cpu");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("online"), format!("{list}\n")).unwrap();
}

async fn watch(plugin: &KubeletPlugin) -> Streaming<NodeWatchResourcesResponse> {
    let mut client =
        DraResourceHealthClient::new(kubelet::dial(plugin.dra_socket()).await.unwrap());
    client
        .node_watch_resources(NodeWatchResourcesRequest {})
        .await
        .expect("NodeWatchResources")
        .into_inner()
}

/// The next message, as (device, health, message) rows.
async fn next(stream: &mut Streaming<NodeWatchResourcesResponse>) -> Vec<(String, i32, String)> {
    let message = tokio::time::timeout(DEADLINE, stream.message())
        .await
        .expect("a message within the deadline")
        .expect("no error")
        .expect("the stream is open");
    message
        .devices
        .into_iter()
        .map(|d| {
            let id = d.device.unwrap();
            assert_eq!(id.pool_name, "node-a");
            (id.device_name, d.health, d.message)
        })
        .collect()
}

fn row(device: &str, health: HealthStatus, message: &str) -> (String, i32, String) {
    (device.into(), health.into(), message.into())
}

#[tokio::test]
async fn a_cpu_going_offline_turns_its_device_unhealthy_on_an_open_stream() {
    let dir = tempfile::tempdir().unwrap();
    let sysfs = dir.path().join("sys");
    set_online(&sysfs, "0-3");
    let devices: BTreeMap<String, CpuSet> = [
        ("cpu2".to_owned(), "2".parse().unwrap()),
        ("cpu3".to_owned(), "3".parse().unwrap()),
    ]
    .into();
    let monitor = HealthMonitor::new(
        HealthConfig {
            sysfs_root: Some(sysfs.clone()),
            poll: Duration::from_millis(20),
            ..HealthConfig::new("node-a")
        },
        move || devices.clone(),
    );
    let config = KubeletConfig {
        driver_name: "test.resmgr.io".into(),
        plugins_dir: dir.path().join("plugins"),
        registry_dir: dir.path().join("registry"),
        instance: None,
    };
    let plugin = KubeletPlugin::start_with_health(&config, Arc::new(NoClaims), monitor.spawn())
        .await
        .unwrap();

    let mut open = watch(&plugin).await;
    let healthy = [
        row("cpu2", HealthStatus::Healthy, ""),
        row("cpu3", HealthStatus::Healthy, ""),
    ];
    assert_eq!(next(&mut open).await, healthy, "the current state on open");

    // A second client goes away mid-stream; the first loses nothing.
    let mut leaving = watch(&plugin).await;
    assert_eq!(next(&mut leaving).await, healthy);
    drop(leaving);

    set_online(&sysfs, "0-2");
    let offline = [
        row("cpu2", HealthStatus::Healthy, ""),
        row("cpu3", HealthStatus::Unhealthy, "cpu 3 is offline"),
    ];
    assert_eq!(next(&mut open).await, offline);
    let mut late = watch(&plugin).await;
    assert_eq!(
        next(&mut late).await,
        offline,
        "a new stream starts current"
    );

    set_online(&sysfs, "0-3");
    assert_eq!(next(&mut open).await, healthy, "back online, healthy again");

    // Shutdown ends the open streams instead of waiting for them.
    tokio::time::timeout(DEADLINE, plugin.shutdown())
        .await
        .expect("shutdown with streams open")
        .unwrap();
    let after = tokio::time::timeout(DEADLINE, open.message())
        .await
        .expect("the stream ends");
    assert!(
        !matches!(after, Ok(Some(_))),
        "no message after shutdown: {after:?}"
    );
}
