//! The deploy objects as Kubernetes sees them: every object the Helm chart renders with Helm's own
//! engine (with its defaults, with the plain-manifest values, and with each optional part switched
//! the other way), the committed plain manifests, and the examples parse into k8s-openapi's types
//! with no unknown fields, and the DaemonSet, RBAC and DeviceClass say what the deployment
//! promises.
//!
//! k8s-openapi ignores unknown fields when deserializing, so "no unknown fields" is checked by a
//! round trip: the object parsed into its type and serialized again must give back exactly the
//! JSON it came from. A misspelled or misplaced field is dropped on the way and shows up as a
//! difference, reported with its path. (The schema check against the Kubernetes 1.34 OpenAPI,
//! field types and required fields included, is the Go conformance test in
//! tests/conformance/deploy.)

use std::{
    fs,
    path::{Path, PathBuf},
    sync::OnceLock,
};

use k8s_openapi::{
    api::{
        admissionregistration::v1::{ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding},
        apps::v1::DaemonSet,
        core::v1::{Namespace, Pod, ServiceAccount},
        rbac::v1::{ClusterRole, ClusterRoleBinding},
        resource::v1::{DeviceClass, ResourceClaimTemplate},
    },
    apimachinery::pkg::util::intstr::IntOrString,
};
use serde::{Serialize, de::DeserializeOwned};
use serde_json::Value as Json;
use xtask::helm::{self, Helm, Release};

fn repo_root() -> PathBuf {
    // tests/ is one level below the repository root.
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent directory")
        .to_path_buf()
}

/// The first place where `want` (what the file says) and `have` (what survived the round trip
/// through the typed object) differ, as a JSON path.
fn first_difference(path: &str, want: &Json, have: &Json) -> Option<String> {
    match (want, have) {
        (Json::Object(w), Json::Object(h)) => {
            for (k, wv) in w {
                let p = format!("{path}.{k}");
                match h.get(k) {
                    None => return Some(format!("{p} is unknown to the Kubernetes type")),
                    Some(hv) => {
                        if let Some(d) = first_difference(&p, wv, hv) {
                            return Some(d);
                        }
                    }
                }
            }
            h.keys()
                .find(|k| !w.contains_key(*k))
                .map(|k| format!("{path}.{k} appeared in the round trip"))
        }
        (Json::Array(w), Json::Array(h)) if w.len() == h.len() => w
            .iter()
            .zip(h)
            .enumerate()
            .find_map(|(i, (wv, hv))| first_difference(&format!("{path}[{i}]"), wv, hv)),
        _ if want == have => None,
        _ => Some(format!("{path} is {want} in the file but {have} as typed")),
    }
}

/// Parses `object` as `T` and requires the round trip to give back the same JSON.
fn round_trip<T: DeserializeOwned + Serialize>(object: &Json) -> Result<(), String> {
    let typed: T = serde_json::from_value(object.clone()).map_err(|e| e.to_string())?;
    let back = serde_json::to_value(&typed).map_err(|e| e.to_string())?;
    match first_difference("", object, &back) {
        None => Ok(()),
        Some(d) => Err(d),
    }
}

/// Checks one object by its apiVersion and kind, returning the kind.
fn check_object(object: &Json) -> Result<String, String> {
    let api_version = object["apiVersion"].as_str().unwrap_or_default();
    let kind = object["kind"].as_str().unwrap_or_default();
    let result = match (api_version, kind) {
        ("v1", "Namespace") => round_trip::<Namespace>(object),
        ("v1", "ServiceAccount") => round_trip::<ServiceAccount>(object),
        ("v1", "Pod") => round_trip::<Pod>(object),
        ("rbac.authorization.k8s.io/v1", "ClusterRole") => round_trip::<ClusterRole>(object),
        ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding") => {
            round_trip::<ClusterRoleBinding>(object)
        }
        ("resource.k8s.io/v1", "DeviceClass") => round_trip::<DeviceClass>(object),
        ("resource.k8s.io/v1", "ResourceClaimTemplate") => {
            round_trip::<ResourceClaimTemplate>(object)
        }
        ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicy") => {
            round_trip::<ValidatingAdmissionPolicy>(object)
        }
        ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicyBinding") => {
            round_trip::<ValidatingAdmissionPolicyBinding>(object)
        }
        ("apps/v1", "DaemonSet") => round_trip::<DaemonSet>(object),
        _ => Err("no Kubernetes type is known to this test for it".to_owned()),
    };
    let name = object["metadata"]["name"].as_str().unwrap_or("<unnamed>");
    result
        .map(|()| kind.to_owned())
        .map_err(|e| format!("{api_version} {kind} {name}: {e}"))
}

/// Parses a multi-document YAML text into JSON objects.
fn objects(text: &str) -> Vec<Json> {
    helm::documents(text)
        .expect("the YAML parses")
        .into_iter()
        .map(|doc| serde_json::to_value(doc).expect("YAML objects convert to JSON"))
        .collect()
}

/// Checks every object of `text`, returning their kinds in order; panics naming every failure.
fn check_all(what: &str, text: &str) -> Vec<String> {
    let mut kinds = Vec::new();
    let mut failures = Vec::new();
    for object in objects(text) {
        match check_object(&object) {
            Ok(kind) => kinds.push(kind),
            Err(e) => failures.push(e),
        }
    }
    assert!(
        failures.is_empty(),
        "{what}: objects that do not match their Kubernetes types:\n  {}",
        failures.join("\n  ")
    );
    kinds
}

fn plain_manifests() -> String {
    fs::read_to_string(repo_root().join(helm::PLAIN_MANIFESTS)).expect("the plain manifests exist")
}

/// The `helm-chart` program, built once per test run.
fn helm() -> &'static Helm {
    static HELM: OnceLock<Helm> = OnceLock::new();
    HELM.get_or_init(|| {
        Helm::build(&repo_root(), Path::new(env!("CARGO_TARGET_TMPDIR")))
            .unwrap_or_else(|e| panic!("{e}"))
    })
}

/// What Helm renders for the chart as release resmgr in kube-system with `overrides` (YAML) on
/// top of its values.
fn render_chart(overrides: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    let values = dir.path().join("values.yaml");
    fs::write(&values, overrides).unwrap();
    helm()
        .template(
            &repo_root().join(helm::CHART_DIR),
            Release {
                name: "resmgr",
                namespace: "kube-system",
            },
            &[&values],
            &[],
        )
        .unwrap_or_else(|e| panic!("{e}"))
}

/// The object of `kind` in a multi-document text.
fn object_of_kind(text: &str, kind: &str) -> Json {
    objects(text)
        .into_iter()
        .find(|o| o["kind"] == kind)
        .unwrap_or_else(|| panic!("no {kind} in the manifests"))
}

#[test]
fn the_plain_manifests_are_what_the_chart_renders() {
    let rendered = helm::render_plain(helm(), &repo_root(), None).unwrap_or_else(|e| panic!("{e}"));
    assert!(
        plain_manifests() == rendered,
        "{} differs from what the chart renders; run `cargo xtask manifests`",
        helm::PLAIN_MANIFESTS
    );
}

#[test]
fn every_plain_manifest_parses_into_its_type_with_no_unknown_fields() {
    let kinds = check_all(helm::PLAIN_MANIFESTS, &plain_manifests());
    assert_eq!(
        kinds,
        [
            "Namespace",
            "ServiceAccount",
            "ClusterRole",
            "ClusterRoleBinding",
            "DaemonSet",
            "DeviceClass",
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicyBinding"
        ]
    );
}

#[test]
fn the_chart_renders_typed_objects_with_defaults_and_every_option_flipped() {
    let defaults = check_all("chart defaults", &render_chart("{}"));
    assert!(
        !defaults.contains(&"Namespace".to_owned()),
        "Helm creates the namespace itself: {defaults:?}"
    );
    assert!(defaults.contains(&"ValidatingAdmissionPolicy".to_owned()));

    let flipped = render_chart(
        "{namespace: {create: true}, admissionPolicy: {enabled: false}, reservedCpus: '0-1', nodeAllocatableCpu: true}",
    );
    let kinds = check_all("chart with options flipped", &flipped);
    assert!(kinds.contains(&"Namespace".to_owned()), "{kinds:?}");
    assert!(
        !kinds.iter().any(|k| k.starts_with("ValidatingAdmission")),
        "{kinds:?}"
    );
    let daemonset = object_of_kind(&flipped, "DaemonSet");
    let args = &daemonset["spec"]["template"]["spec"]["containers"][0]["args"];
    assert!(
        args.as_array()
            .unwrap()
            .contains(&Json::from("--reserved-cpus=0-1")),
        "{args}"
    );
}

#[test]
fn every_example_parses_into_its_type_with_no_unknown_fields() {
    let dir = repo_root().join("examples/kubernetes");
    let mut files: Vec<PathBuf> = fs::read_dir(&dir)
        .expect("examples/kubernetes exists")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    let mut kinds = Vec::new();
    for file in &files {
        let text = fs::read_to_string(file).unwrap();
        kinds.extend(check_all(&file.display().to_string(), &text));
    }
    assert!(
        ["ResourceClaimTemplate", "Pod", "DeviceClass"]
            .iter()
            .all(|kind| kinds.contains(&(*kind).to_owned())),
        "{kinds:?}"
    );
}

#[test]
fn the_round_trip_catches_an_unknown_or_misplaced_field() {
    let mut daemonset = object_of_kind(&plain_manifests(), "DaemonSet");
    check_object(&daemonset).expect("the DaemonSet as shipped is fine");
    daemonset["spec"]["template"]["spec"]["containers"][0]["securityContext"]["dropCapabilities"] =
        Json::from("ALL");
    let err = check_object(&daemonset).unwrap_err();
    assert!(
        err.contains(".spec.template.spec.containers[0].securityContext.dropCapabilities"),
        "{err}"
    );

    let mut class = object_of_kind(&plain_manifests(), "DeviceClass");
    class["spec"]["selectors"][0]["expression"] = Json::from("true");
    let err = check_object(&class).unwrap_err();
    assert!(err.contains(".spec.selectors[0].expression"), "{err}");
}

fn daemonset_pod_spec() -> Json {
    object_of_kind(&plain_manifests(), "DaemonSet")["spec"]["template"]["spec"].clone()
}

#[test]
fn the_daemonset_runs_critical_with_the_node_name_probes_and_a_gentle_rollout() {
    let daemonset: DaemonSet =
        serde_json::from_value(object_of_kind(&plain_manifests(), "DaemonSet")).unwrap();
    let spec = daemonset.spec.unwrap();
    let rolling = spec.update_strategy.unwrap().rolling_update.unwrap();
    assert_eq!(rolling.max_unavailable, Some(IntOrString::Int(1)));
    let pod = spec.template.spec.unwrap();
    assert_eq!(
        pod.priority_class_name.as_deref(),
        Some("system-node-critical")
    );
    let container = &pod.containers[0];
    let node_name = container
        .env
        .iter()
        .flatten()
        .find(|e| e.name == "NODE_NAME")
        .and_then(|e| e.value_from.as_ref())
        .and_then(|v| v.field_ref.as_ref())
        .map(|f| f.field_path.as_str());
    assert_eq!(node_name, Some("spec.nodeName"));
    let probe_path = |p: &Option<k8s_openapi::api::core::v1::Probe>| {
        p.as_ref()
            .and_then(|p| p.http_get.as_ref())
            .and_then(|h| h.path.clone())
    };
    assert_eq!(
        probe_path(&container.liveness_probe).as_deref(),
        Some("/healthz")
    );
    assert_eq!(
        probe_path(&container.readiness_probe).as_deref(),
        Some("/readyz")
    );
    let resources = container.resources.as_ref().unwrap();
    let requests = resources.requests.as_ref().unwrap();
    assert!(requests.contains_key("cpu") && requests.contains_key("memory"));
    assert!(resources.limits.as_ref().unwrap().contains_key("memory"));
    let security = container.security_context.as_ref().unwrap();
    assert_eq!(security.allow_privilege_escalation, Some(false));
    assert_eq!(security.privileged, None);
    assert_eq!(
        security.capabilities.as_ref().unwrap().drop,
        Some(vec!["ALL".to_owned()])
    );
    assert_eq!(security.capabilities.as_ref().unwrap().add, None);
}

#[test]
fn the_daemonset_mounts_each_host_path_where_its_flag_points() {
    let pod = daemonset_pod_spec();
    let container = &pod["containers"][0];
    let args: Vec<&str> = container["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    let flag = |name: &str| {
        args.iter()
            .find_map(|a| a.strip_prefix(&format!("--{name}=")))
            .unwrap_or_else(|| panic!("no --{name} in {args:?}"))
    };
    // (host path, flag naming it or a file in it, read-only)
    let nri_dir = flag("nri-socket").trim_end_matches("/nri.sock");
    let expected = [
        ("/var/run/nri", nri_dir, true),
        (
            "/var/lib/kubelet/plugins",
            flag("kubelet-plugins-dir"),
            false,
        ),
        (
            "/var/lib/kubelet/plugins_registry",
            flag("kubelet-registry-dir"),
            false,
        ),
        ("/var/run/cdi", flag("cdi-dir"), false),
        ("/var/lib/resmgr", flag("state-dir"), false),
        ("/sys", "/sys", true),
    ];
    let volumes = pod["volumes"].as_array().unwrap();
    let mounts = container["volumeMounts"].as_array().unwrap();
    assert_eq!(volumes.len(), expected.len(), "no other volumes");
    for (host, flag_path, read_only) in expected {
        assert_eq!(host, flag_path, "the flag points at the host path");
        let volume = volumes
            .iter()
            .find(|v| v["hostPath"]["path"] == host)
            .unwrap_or_else(|| panic!("no hostPath volume for {host}"));
        let mount = mounts
            .iter()
            .find(|m| m["name"] == volume["name"])
            .unwrap_or_else(|| panic!("{host} is not mounted"));
        assert_eq!(
            mount["mountPath"], host,
            "{host} is mounted at the same path"
        );
        assert_eq!(
            mount["readOnly"].as_bool().unwrap_or(false),
            read_only,
            "{host} read-only"
        );
    }
    assert!(args.contains(&"--node-name=$(NODE_NAME)"));
}

#[test]
fn rbac_grants_exactly_what_the_agent_needs() {
    let role: ClusterRole =
        serde_json::from_value(object_of_kind(&plain_manifests(), "ClusterRole")).unwrap();
    let mut grants: Vec<(String, String, Vec<String>)> = role
        .rules
        .unwrap()
        .into_iter()
        .flat_map(|rule| {
            let groups = rule.api_groups.unwrap_or_default();
            let resources = rule.resources.unwrap_or_default();
            assert_eq!(rule.resource_names, None);
            assert_eq!(rule.non_resource_urls, None);
            groups
                .into_iter()
                .flat_map(move |g| {
                    let verbs = rule.verbs.clone();
                    resources
                        .clone()
                        .into_iter()
                        .map(move |r| (g.clone(), r, verbs.clone()))
                })
                .collect::<Vec<_>>()
        })
        .collect();
    grants.sort();
    let owned = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    assert_eq!(
        grants,
        [
            ("".to_owned(), "nodes".to_owned(), owned(&["get"])),
            (
                "resource.k8s.io".to_owned(),
                "resourceclaims".to_owned(),
                owned(&["get"])
            ),
            (
                "resource.k8s.io".to_owned(),
                "resourceslices".to_owned(),
                owned(&["get", "list", "watch", "create", "update", "delete"])
            ),
        ]
    );
}

#[test]
fn the_device_class_selects_the_driver_the_agent_runs_as() {
    let manifests = plain_manifests();
    let class: DeviceClass =
        serde_json::from_value(object_of_kind(&manifests, "DeviceClass")).unwrap();
    let selectors = class.spec.selectors.unwrap();
    let expression = &selectors[0].cel.as_ref().unwrap().expression;
    let pod = daemonset_pod_spec();
    let driver = pod["containers"][0]["args"]
        .as_array()
        .unwrap()
        .iter()
        .find_map(|a| a.as_str()?.strip_prefix("--driver-name="))
        .expect("the DaemonSet names its driver")
        .to_owned();
    assert_eq!(expression, &format!("device.driver == \"{driver}\""));
}
