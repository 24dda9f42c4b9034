//! The claim lifecycle end to end through the kubelet's front door: the real DRA and registration
//! servers on unix sockets, the real topology-aware policy on a synthetic machine, and the
//! generated DRA clients (v1 and v1beta1) as the kubelet.
//!
//! The clients play the kubelet here because these are calls a real kubelet does not make on
//! cue, checked in milliseconds: a prepare that arrives before the runtime's Synchronize (with a
//! real kubelet that is a race), the v1beta1 service (only 1.32 and 1.33 kubelets use it; the
//! cluster stage's 1.36 kubelet uses v1), and a claim UID that tries path traversal (the API
//! server never hands one out). The real kubelet's calls are the cluster stage's
//! (`tests/controlplane/clusterscenarios`).

use dra_proto::{v1, v1beta1};
use integration_tests::{
    fakes::{claim, container},
    node::{DRIVER, Node},
};

/// A node whose API server holds one claim per UID in `uids`, each reserved for pod `pod-db` and
/// taking 2 CPUs of `numa1`, on 2 packages x 2 NUMA nodes x 4 cores x 2 threads.
async fn node(uids: &[&str]) -> Node {
    let claims = uids.iter().map(|uid| {
        let mut c = claim(uid, "pod-db", 2);
        c.results[0].device = "numa1".into();
        c
    });
    Node::start("pack:2 numa:2 core:4 pu:2", claims).await
}

async fn synchronize(node: &Node) {
    node.synchronize(&[container("web", "pod-web")]).await;
}

fn v1_claim(uid: &str) -> v1::Claim {
    v1::Claim {
        namespace: "default".into(),
        uid: uid.into(),
        name: format!("claim-{uid}"),
    }
}

#[tokio::test]
async fn a_claim_is_held_until_synchronized_then_prepared_on_v1_with_its_share() {
    let node = node(&["c1"]).await;
    let mut client = v1::dra_plugin_client::DraPluginClient::new(node.dra_channel().await);
    let request = v1::NodePrepareResourcesRequest {
        claims: vec![v1_claim("c1")],
    };

    // Sent before the runtime synchronized: held (the refusal after the hold is
    // tests/lifecycle.rs's), and answered once it has.
    let held = tokio::spawn(async move { client.node_prepare_resources(request).await });
    tokio::task::yield_now().await;
    assert!(
        !held.is_finished(),
        "answered before the runtime synchronized"
    );
    assert!(
        std::fs::read_dir(&node.cdi_dir).map_or(true, |mut d| d.next().is_none()),
        "a spec was written before the runtime synchronized"
    );
    synchronize(&node).await;
    let answer = held.await.unwrap().unwrap().into_inner();
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
    let channel = node.dra_channel().await;
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
    let mut client = v1::dra_plugin_client::DraPluginClient::new(node.dra_channel().await);
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
