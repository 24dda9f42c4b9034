//! The claim lifecycle end to end through the kubelet's front door: the real DRA and registration
//! servers on unix sockets, the real topology-aware policy on a synthetic machine, and the
//! generated DRA clients (v1 and v1beta1) as the kubelet.

use std::sync::Arc;

use dra_proto::{v1, v1beta1};
use integration_tests::fakes::{FakeRuntime, claim, container};
use policy::{Topology, TopologyAware, TopologySource};
use resmgr::{
    Manager, ManagerConfig,
    dra_handler::LifecycleHandler,
    kube::fake::StaticClaims,
    kubelet::{KubeletConfig, KubeletPlugin},
    state::StateFile,
};
use tonic::transport::{Channel, Endpoint};

const DRIVER: &str = "topology-aware.resmgr.io";

struct Node {
    _dir: tempfile::TempDir,
    manager: Arc<Manager>,
    plugin: KubeletPlugin,
    runtime: Arc<FakeRuntime>,
    cdi_dir: std::path::PathBuf,
}

/// A node with 2 packages x 2 NUMA nodes x 4 cores x 2 threads and one claim per UID in `uids`,
/// each reserved for pod `pod-db` and taking 2 CPUs of `numa1`.
async fn node(uids: &[&str]) -> Node {
    let dir = tempfile::tempdir().unwrap();
    let topology = Topology::load(&TopologySource::Synthetic(
        "pack:2 numa:2 core:4 pu:2".into(),
    ))
    .unwrap();
    let policy = TopologyAware::new(topology, policy::Config::default()).unwrap();
    let claims = Arc::new(StaticClaims::new());
    for uid in uids {
        let mut c = claim(uid, "pod-db", 2);
        c.results[0].device = "numa1".into();
        claims.insert(c);
    }
    let runtime = Arc::new(FakeRuntime::default());
    let cdi_dir = dir.path().join("cdi");
    let manager = Arc::new(
        Manager::start(
            ManagerConfig::new(DRIVER),
            Box::new(policy),
            StateFile::new(dir.path().join("state")),
            cdi::SpecStore::new(&cdi_dir, DRIVER).unwrap(),
            runtime.clone(),
            claims,
        )
        .unwrap(),
    );
    let config = KubeletConfig {
        driver_name: DRIVER.into(),
        plugins_dir: dir.path().join("plugins"),
        registry_dir: dir.path().join("plugins_registry"),
    };
    let plugin = KubeletPlugin::start(&config, Arc::new(LifecycleHandler::new(manager.clone())))
        .await
        .unwrap();
    Node {
        _dir: dir,
        manager,
        plugin,
        runtime,
        cdi_dir,
    }
}

async fn synchronize(node: &Node) {
    let updates = node
        .manager
        .synchronize(&[container("web", "pod-web")])
        .await
        .unwrap();
    node.runtime.apply_reply(&updates);
    node.manager.synchronized().await;
}

/// A channel to a unix socket, the way tonic dials one.
async fn channel(socket: &std::path::Path) -> Channel {
    let socket = socket.to_owned();
    Endpoint::from_static("http://localhost")
        .connect_with_connector(tower::service_fn(move |_| {
            let socket = socket.clone();
            async move {
                tokio::net::UnixStream::connect(socket)
                    .await
                    .map(hyper_util::rt::TokioIo::new)
            }
        }))
        .await
        .unwrap()
}

fn v1_claim(uid: &str) -> v1::Claim {
    v1::Claim {
        namespace: "default".into(),
        uid: uid.into(),
        name: format!("claim-{uid}"),
    }
}

#[tokio::test]
async fn a_claim_is_refused_until_synchronized_then_prepared_on_v1_with_its_share() {
    let node = node(&["c1"]).await;
    let mut client =
        v1::dra_plugin_client::DraPluginClient::new(channel(node.plugin.dra_socket()).await);
    let request = v1::NodePrepareResourcesRequest {
        claims: vec![v1_claim("c1")],
    };

    let refused = client
        .node_prepare_resources(request.clone())
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unavailable);
    assert!(
        refused.message().contains("still synchronizing"),
        "{}",
        refused.message()
    );

    synchronize(&node).await;
    let answer = client
        .node_prepare_resources(request)
        .await
        .unwrap()
        .into_inner();
    let c1 = &answer.claims["c1"];
    assert_eq!(c1.error, "");
    assert_eq!(
        c1.devices,
        [v1::Device {
            request_names: vec!["cpus".into()],
            pool_name: "node-a".into(),
            device_name: "numa1".into(),
            cdi_device_ids: vec![format!("{DRIVER}/device=claim-c1-0")],
            share_id: Some("share-c1".into()),
        }]
    );
    let spec =
        std::fs::read_to_string(node.cdi_dir.join(format!("{DRIVER}-device_c1.json"))).unwrap();
    let cpus = node.manager.claim_record("c1").await.unwrap();
    assert_eq!(cpus.devices.len(), 1);
    assert!(spec.contains("DRA_CPUSET_c1="), "{spec}");
    // The web container's shared cpuset no longer holds the claim's CPUs.
    let web = node.runtime.cpus("web").unwrap();
    let claimed = spec
        .split("DRA_CPUSET_c1=")
        .nth(1)
        .unwrap()
        .split('"')
        .next()
        .unwrap();
    let web: policy::CpuSet = web.parse().unwrap();
    assert!(
        !web.intersects(&claimed.parse().unwrap()),
        "web {web} vs claim {claimed}"
    );
}

#[tokio::test]
async fn v1beta1_prepares_and_both_versions_unprepare() {
    let node = node(&["c1", "c2"]).await;
    synchronize(&node).await;
    let web_before = node.runtime.cpus("web").unwrap();
    let channel = channel(node.plugin.dra_socket()).await;
    let mut beta = v1beta1::dra_plugin_client::DraPluginClient::new(channel.clone());
    let answer = beta
        .node_prepare_resources(v1beta1::NodePrepareResourcesRequest {
            claims: vec![v1beta1::Claim {
                namespace: "default".into(),
                uid: "c1".into(),
                name: "claim-c1".into(),
            }],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        answer.claims["c1"].devices[0].cdi_device_ids,
        [format!("{DRIVER}/device=claim-c1-0")]
    );

    let mut v1 = v1::dra_plugin_client::DraPluginClient::new(channel);
    let answer = v1
        .node_unprepare_resources(v1::NodeUnprepareResourcesRequest {
            claims: vec![v1_claim("c1"), v1_claim("never")],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(answer.claims.len(), 2);
    assert!(
        answer.claims.values().all(|c| c.error.is_empty()),
        "{answer:?}"
    );
    assert!(
        !node
            .cdi_dir
            .join(format!("{DRIVER}-device_c1.json"))
            .exists()
    );
    assert_eq!(
        node.runtime.cpus("web").unwrap(),
        web_before,
        "web got the claim's CPUs back"
    );
}

#[tokio::test]
async fn a_claim_uid_that_tries_path_traversal_is_invalid_argument() {
    let node = node(&[]).await;
    synchronize(&node).await;
    let mut client =
        v1::dra_plugin_client::DraPluginClient::new(channel(node.plugin.dra_socket()).await);
    let status = client
        .node_prepare_resources(v1::NodePrepareResourcesRequest {
            claims: vec![v1_claim("../../../etc/x")],
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(
        status.message().contains("claim uid"),
        "{}",
        status.message()
    );
    assert!(!node.cdi_dir.exists(), "nothing was written");
}
