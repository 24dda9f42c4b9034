//! `resmgr slices` prints what the agent's publisher writes: for each device model and setting
//! that shapes the slices, the binary's output equals what a `SlicePublisher` holding the same
//! policy's devices creates in a fake API server (less the fields the server fills in), in the
//! API version the server serves; the settings come from flags or the config file, as for
//! `resmgr run`; and settings that publish nothing are refused, naming them.

use std::{path::Path, process::Command, sync::Arc};

use integration_tests::fake_apiserver::FakeApiServer;
use kube_dra::{
    DevicePublisher as _, NodeAllocatableCpu, PublisherConfig, ResourceApiVersions, SlicePublisher,
};
use policy::{
    Policy as _, Topology, TopologyAware, TopologySource,
    topology_aware::{
        ClaimCpus, Config, DeviceMode, DeviceModel, Exclusivity, Granularity, GroupBy, ReservedCpus,
    },
};
use serde_json::Value;

const DRIVER: &str = "topology-aware.resmgr.io";
const NODE: &str = "worker-1";
const NODE_UID: &str = "3f1c2b9e-0000-4000-8000-000000000001";
/// 2 sockets, 4 NUMA nodes, 128 threads.
const SERVER: &str = "pack:2 numa:2 core:16 pu:2";
/// 256 threads: more than one slice of individual devices.
const LARGE: &str = "pack:2 numa:2 core:32 pu:2";

fn resmgr() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_resmgr"));
    cmd.env_remove("NODE_NAME").env_remove("RUST_LOG");
    cmd
}

/// `resmgr slices` with `args`: its standard output, or the test fails with its error.
fn slices(args: &[&str]) -> String {
    let out = resmgr().arg("slices").args(args).output().unwrap();
    assert!(
        out.status.success(),
        "resmgr slices {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// `resmgr slices` with `args`, which must fail: its message.
fn refused(args: &[&str]) -> String {
    let out = resmgr().arg("slices").args(args).output().unwrap();
    assert!(!out.status.success(), "resmgr slices {args:?} succeeded");
    String::from_utf8(out.stderr).unwrap()
}

/// The items of the JSON `List` printed with `--output json`.
fn items(json: &str) -> Vec<Value> {
    let list: Value = serde_json::from_str(json).unwrap();
    assert_eq!(list["kind"], "List", "{list}");
    list["items"].as_array().unwrap().clone()
}

/// The documents printed with `--output yaml`, as JSON.
fn documents(yaml: &str) -> Vec<Value> {
    yaml.split("---\n")
        .filter(|d| !d.trim().is_empty())
        .map(|d| serde_yaml_ng::from_str(d).unwrap())
        .collect()
}

/// The policy's devices for `topology` and `config`, published by the real publisher into a
/// fake API server serving `versions`: the slices it created, less what the server fills in.
async fn published(
    versions: &[&str],
    topology: &str,
    config: Config,
    publisher: PublisherConfig,
) -> Vec<Value> {
    let topology = Topology::load(&TopologySource::Synthetic(topology.into())).unwrap();
    let devices = TopologyAware::new(topology, config)
        .unwrap()
        .devices()
        .unwrap();
    let server = FakeApiServer::start(versions).await;
    server.insert_node(NODE, NODE_UID);
    let versions = Arc::new(ResourceApiVersions::discover(server.client()));
    let report = SlicePublisher::new(publisher, versions)
        .unwrap()
        .publish(devices)
        .await
        .unwrap();
    let mut slices = server.slices();
    assert_eq!(report.created, slices.len(), "{report:?}");
    for slice in &mut slices {
        let metadata = slice["metadata"].as_object_mut().unwrap();
        for filled_in in ["name", "uid", "resourceVersion", "generation"] {
            assert!(metadata.remove(filled_in).is_some(), "{filled_in}: {slice}");
        }
    }
    slices
}

/// Slices in pool order: by their first device (an empty slice first).
fn in_order(mut slices: Vec<Value>) -> Vec<Value> {
    slices.sort_by_key(|s| {
        s["spec"]["devices"][0]["name"]
            .as_str()
            .map(|n| (n.len(), n.to_owned()))
    });
    slices
}

fn policy_config(devices: DeviceModel, exclusivity: Exclusivity) -> Config {
    Config {
        reserved_cpus: ReservedCpus::Count(2),
        driver: DRIVER.to_owned(),
        exclusivity,
        devices,
        ..Config::default()
    }
}

fn publisher_config() -> PublisherConfig {
    PublisherConfig::new(DRIVER, NODE)
}

const COMMON: [&str; 6] = [
    "--node-name",
    NODE,
    "--node-uid",
    NODE_UID,
    "--reserved-cpu-count",
    "2",
];

/// `resmgr slices` for `topology` with `extra` flags, as JSON items.
fn printed(topology: &str, extra: &[&str]) -> Vec<Value> {
    let topology = format!("synthetic:{topology}");
    let mut args = COMMON.to_vec();
    args.extend(["--topology", &topology, "--output", "json"]);
    args.extend(extra);
    items(&slices(&args))
}

#[tokio::test]
async fn grouped_devices_are_printed_as_the_publisher_writes_them() {
    let model = DeviceModel::default();
    let want = published(
        &["v1"],
        SERVER,
        policy_config(model, Exclusivity::Claims),
        publisher_config(),
    )
    .await;
    let got = printed(SERVER, &[]);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0]["spec"]["devices"].as_array().unwrap().len(), 4);
    assert_eq!(in_order(got), in_order(want));
}

#[tokio::test]
async fn individual_devices_in_several_slices_are_printed_as_the_publisher_writes_them() {
    let model = DeviceModel {
        mode: DeviceMode::Individual,
        ..DeviceModel::default()
    };
    let want = published(
        &["v1"],
        LARGE,
        policy_config(model, Exclusivity::Claims),
        publisher_config(),
    )
    .await;
    let got = printed(LARGE, &["--device-mode", "individual"]);
    assert_eq!(got.len(), 2, "254 devices: 128 and 126");
    assert_eq!(got[0]["spec"]["pool"]["resourceSliceCount"], 2);
    assert_eq!(in_order(got), in_order(want));
}

#[tokio::test]
async fn whole_core_devices_are_printed_as_the_publisher_writes_them() {
    let model = DeviceModel {
        mode: DeviceMode::Individual,
        granularity: Granularity::Core,
        ..DeviceModel::default()
    };
    let want = published(
        &["v1"],
        SERVER,
        policy_config(model, Exclusivity::Claims),
        publisher_config(),
    )
    .await;
    let got = printed(
        SERVER,
        &["--device-mode", "individual", "--claim-granularity", "core"],
    );
    assert_eq!(got[0]["spec"]["devices"].as_array().unwrap().len(), 63);
    assert_eq!(in_order(got), in_order(want));
}

#[tokio::test]
async fn socket_groups_a_partition_and_node_allocatable_cpu_are_printed_as_published() {
    let model = DeviceModel {
        group_by: GroupBy::Socket,
        granularity: Granularity::Core,
        ..DeviceModel::default()
    };
    let exclusivity = Exclusivity::Partition(ClaimCpus::Set("32-63".parse().unwrap()));
    let publisher = PublisherConfig {
        node_allocatable_cpu: Some(NodeAllocatableCpu::default()),
        ..publisher_config()
    };
    let want = published(
        &["v1"],
        SERVER,
        policy_config(model, exclusivity),
        publisher,
    )
    .await;
    let got = printed(
        SERVER,
        &[
            "--group-by",
            "socket",
            "--claim-granularity",
            "core",
            "--cpu-exclusivity",
            "partition",
            "--claim-cpus",
            "32-63",
            "--node-allocatable-cpu",
            "true",
        ],
    );
    let devices = got[0]["spec"]["devices"].as_array().unwrap();
    assert_eq!(devices.len(), 1, "32-63 are all on socket 0: {devices:?}");
    assert!(
        devices[0]["nodeAllocatableResourceMappings"].is_object(),
        "{devices:?}"
    );
    assert_eq!(in_order(got), in_order(want));
}

#[tokio::test]
async fn on_kubernetes_1_32_the_v1beta1_objects_are_printed() {
    let model = DeviceModel {
        mode: DeviceMode::Individual,
        ..DeviceModel::default()
    };
    let want = published(
        &["v1beta1"],
        SERVER,
        policy_config(model, Exclusivity::Claims),
        publisher_config(),
    )
    .await;
    let got = printed(
        SERVER,
        &["--device-mode", "individual", "--api-version", "v1beta1"],
    );
    assert_eq!(got[0]["apiVersion"], "resource.k8s.io/v1beta1");
    assert!(got[0]["spec"]["devices"][0]["basic"].is_object(), "{got:?}");
    assert_eq!(in_order(got), in_order(want));
}

#[tokio::test]
async fn cpu_exclusivity_pods_is_the_one_empty_slice_the_agent_publishes() {
    let want = published(
        &["v1"],
        SERVER,
        policy_config(DeviceModel::default(), Exclusivity::Pods),
        publisher_config(),
    )
    .await;
    let got = printed(SERVER, &["--cpu-exclusivity", "pods"]);
    assert!(got[0]["spec"]["devices"].is_null(), "{got:?}");
    assert_eq!(got, want);
}

fn write(dir: &Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path.to_string_lossy().into_owned()
}

#[test]
fn settings_come_from_the_config_file_and_flags_win_as_for_resmgr_run() {
    let dir = tempfile::tempdir().unwrap();
    let file = write(
        dir.path(),
        "config.yaml",
        &format!(
            "apiVersion: resmgr.io/v1alpha1\nkind: AgentConfiguration\nnode-name: {NODE}\n\
             topology: \"synthetic:{SERVER}\"\nreserved-cpus: \"0-1\"\n\
             device-mode: individual\n"
        ),
    );
    let from_file = documents(&slices(&["--config", &file, "--node-uid", NODE_UID]));
    let from_flags = printed(SERVER, &["--device-mode", "individual"]);
    assert_eq!(from_file, from_flags, "YAML from the file, JSON from flags");
    let overridden = documents(&slices(&[
        "--config",
        &file,
        "--node-uid",
        NODE_UID,
        "--device-mode",
        "grouped",
    ]));
    assert_eq!(overridden, printed(SERVER, &[]));
}

#[test]
fn without_a_node_uid_the_slices_have_no_owner_and_stderr_says_so() {
    let topology = format!("synthetic:{SERVER}");
    let out = resmgr()
        .args(["slices", "--node-name", NODE, "--topology", &topology])
        .output()
        .unwrap();
    assert!(out.status.success());
    let docs = documents(&String::from_utf8(out.stdout).unwrap());
    assert_eq!(docs.len(), 1);
    assert!(docs[0]["metadata"]["ownerReferences"].is_null(), "{docs:?}");
    assert_eq!(
        docs[0]["metadata"]["generateName"],
        format!("{NODE}-{DRIVER}-")
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no --node-uid"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn what_publishes_nothing_or_is_wrong_is_refused_naming_it() {
    let topology = format!("synthetic:{SERVER}");
    let base = ["--topology", topology.as_str()];
    let e = refused(&[&base[..], &["--dra", "false"]].concat());
    assert!(
        e.contains("--dra: false: without DRA the agent publishes no resource slices"),
        "{e}"
    );
    let e = refused(&base);
    assert!(e.contains("--node-name is not set"), "{e}");
    let e = refused(
        &[
            &base[..],
            &["--node-name", NODE, "--device-mode", "per-cpu"],
        ]
        .concat(),
    );
    assert!(
        e.contains("--device-mode: \"per-cpu\" is not allowed"),
        "{e}"
    );
    let e = refused(&[&base[..], &["--node-name", NODE, "--reserved-cpus", "200"]].concat());
    assert!(
        e.contains("--reserved-cpus") && e.contains("not online"),
        "{e}"
    );
    let e = refused(&[&base[..], &["--node-name", NODE, "--node-uid", ""]].concat());
    assert!(e.contains("--node-uid: empty"), "{e}");
}
