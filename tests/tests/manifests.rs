//! The deploy objects as Kubernetes sees them: every object the Helm chart renders with Helm's own
//! engine (with its defaults, with the plain-manifest values, and with each values file of the
//! chart's ci/ directory: every optional object on, every one off, IPv6 addresses), the committed
//! plain manifests, and the examples parse into k8s-openapi's types with no unknown fields, and
//! the objects say what the deployment promises: each value reaches the object it is for, the
//! agent's config file names the paths the DaemonSet mounts and the port it probes, RBAC grants
//! exactly what the agent uses.
//!
//! k8s-openapi ignores unknown fields when deserializing, so "no unknown fields" is checked by a
//! round trip: the object parsed into its type and serialized again must give back exactly the
//! JSON it came from. A misspelled or misplaced field is dropped on the way and shows up as a
//! difference, reported with its path. (The schema check against the Kubernetes 1.34 OpenAPI,
//! field types and required fields included, the ServiceMonitor against the Prometheus
//! Operator's types, and the agent reading the rendered config file, are the Go conformance tests
//! in tests/conformance/deploy.)

use std::{
    fs,
    path::{Path, PathBuf},
    sync::OnceLock,
};

use helm_chart::{self as helm, Helm, Release};
use k8s_openapi::{
    api::{
        admissionregistration::v1::{ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding},
        apps::v1::DaemonSet,
        core::v1::{ConfigMap, Namespace, Pod, ResourceQuota, Service, ServiceAccount},
        rbac::v1::{ClusterRole, ClusterRoleBinding},
        resource::v1::{DeviceClass, ResourceClaimTemplate},
    },
    apimachinery::pkg::util::intstr::IntOrString,
};
use serde::{Serialize, de::DeserializeOwned};
use serde_json::Value as Json;

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
        ("v1", "ConfigMap") => round_trip::<ConfigMap>(object),
        ("v1", "Service") => round_trip::<Service>(object),
        ("v1", "ResourceQuota") => round_trip::<ResourceQuota>(object),
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
        // k8s-openapi has no Prometheus Operator types: the Go tests decode it strictly into them.
        ("monitoring.coreos.com/v1", "ServiceMonitor") => Ok(()),
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

/// What Helm renders for the chart as release resmgr in `namespace` with `overrides` (YAML) on
/// top of its values, or Helm's error.
fn try_render(namespace: &str, overrides: &str) -> Result<String, String> {
    let dir = tempfile::tempdir().unwrap();
    let values = dir.path().join("values.yaml");
    fs::write(&values, overrides).unwrap();
    helm()
        .template(
            &repo_root().join(helm::CHART_DIR),
            Release {
                name: "resmgr",
                namespace,
            },
            &[&values],
            &[],
        )
        .map_err(|e| e.to_string())
}

fn render_chart(overrides: &str) -> String {
    try_render("resmgr-system", overrides).unwrap_or_else(|e| panic!("{e}"))
}

/// The chart's ci/ values files, by name (`everything-on`, ...), with their text.
fn ci_values() -> Vec<(String, String)> {
    let dir = repo_root().join(helm::CHART_DIR).join("ci");
    let mut files: Vec<(String, String)> = fs::read_dir(&dir)
        .expect("the chart has a ci/ directory")
        .map(|e| e.unwrap().path())
        .filter_map(|p| {
            let name = p
                .file_name()?
                .to_str()?
                .strip_suffix("-values.yaml")?
                .to_owned();
            Some((name, fs::read_to_string(&p).unwrap()))
        })
        .collect();
    files.sort();
    assert!(files.len() >= 3, "{files:?}");
    files
}

fn ci(name: &str) -> String {
    ci_values()
        .into_iter()
        .find(|(n, _)| n == name)
        .unwrap_or_else(|| panic!("no ci/{name}-values.yaml"))
        .1
}

/// The object of `kind` in a multi-document text.
fn object_of_kind(text: &str, kind: &str) -> Json {
    objects(text)
        .into_iter()
        .find(|o| o["kind"] == kind)
        .unwrap_or_else(|| panic!("no {kind} in the manifests"))
}

fn has_kind(text: &str, kind: &str) -> bool {
    objects(text).iter().any(|o| o["kind"] == kind)
}

/// The agent's config file in the rendered ConfigMap, parsed.
fn config_file(text: &str) -> serde_yaml_ng::Value {
    let config_map = object_of_kind(text, "ConfigMap");
    let file = config_map["data"]["config.yaml"]
        .as_str()
        .expect("the ConfigMap holds config.yaml");
    serde_yaml_ng::from_str(file).expect("the config file is YAML")
}

fn setting(text: &str, key: &str) -> String {
    match &config_file(text)[key] {
        serde_yaml_ng::Value::String(s) => s.clone(),
        serde_yaml_ng::Value::Null => panic!("the config file has no {key}"),
        other => serde_yaml_ng::to_string(other).unwrap().trim().to_owned(),
    }
}

fn pod_spec(text: &str) -> Json {
    object_of_kind(text, "DaemonSet")["spec"]["template"]["spec"].clone()
}

fn strings(value: &Json) -> Vec<&str> {
    value
        .as_array()
        .map(|a| a.iter().filter_map(Json::as_str).collect())
        .unwrap_or_default()
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
            "ConfigMap",
            "ClusterRole",
            "ClusterRoleBinding",
            "Service",
            "DaemonSet",
            "DeviceClass",
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicyBinding",
            "ValidatingAdmissionPolicyBinding"
        ]
    );
}

#[test]
fn the_chart_renders_typed_objects_for_every_values_file() {
    let defaults = check_all("chart defaults", &render_chart("{}"));
    assert!(
        !defaults.contains(&"Namespace".to_owned()),
        "Helm creates the namespace itself: {defaults:?}"
    );
    for (name, values) in ci_values() {
        for namespace in ["resmgr-system", "kube-system"] {
            let text = try_render(namespace, &values).unwrap_or_else(|e| panic!("{name}: {e}"));
            let kinds = check_all(&name, &text);
            assert!(kinds.contains(&"DaemonSet".to_owned()), "{name}: {kinds:?}");
        }
    }
}

#[test]
fn everything_on_reaches_the_objects_it_is_for() {
    let text = render_chart(&ci("everything-on"));
    let kinds = check_all("everything on", &text);
    for kind in [
        "Namespace",
        "ResourceQuota",
        "Service",
        "ServiceMonitor",
        "ValidatingAdmissionPolicy",
    ] {
        assert!(kinds.contains(&kind.to_owned()), "no {kind}: {kinds:?}");
    }
    let daemonset = object_of_kind(&text, "DaemonSet");
    let spec = &daemonset["spec"];
    let pod = &spec["template"]["spec"];
    let container = &pod["containers"][0];
    assert_eq!(
        spec["updateStrategy"]["rollingUpdate"]["maxUnavailable"],
        "10%"
    );
    assert_eq!(
        spec["updateStrategy"]["rollingUpdate"]["maxSurge"], 0,
        "the old way, replacing before starting, is one value away"
    );
    assert_eq!(
        pod["nodeSelector"],
        serde_json::json!({"kubernetes.io/os": "linux", "node-role.example.com/cpu": "true"}),
        "a node selector given is merged with the default"
    );
    assert_eq!(
        pod["tolerations"],
        serde_json::json!([{"key": "dedicated", "operator": "Equal", "value": "cpu", "effect": "NoSchedule"}]),
        "tolerations given replace the default"
    );
    assert_eq!(
        pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
            [0]["matchExpressions"][0]["key"],
        "kubernetes.io/arch"
    );
    assert_eq!(
        pod["imagePullSecrets"],
        serde_json::json!([{"name": "registry-pull"}])
    );
    assert_eq!(pod["priorityClassName"], "system-cluster-critical");
    assert_eq!(pod["terminationGracePeriodSeconds"], 60);
    let metadata = &spec["template"]["metadata"];
    assert_eq!(metadata["annotations"]["example.com/owner"], "platform");
    assert_eq!(metadata["labels"]["example.com/tier"], "node");
    assert_eq!(container["image"], "registry.example.com/resmgr:9.9.9");
    assert_eq!(container["imagePullPolicy"], "Always");
    assert_eq!(
        strings(&container["args"]),
        [
            "run",
            "--config=/etc/resmgr/config.yaml",
            "--node-name=$(NODE_NAME)",
            "--log-format=json"
        ],
        "extra arguments come last, so they win over the file"
    );
    assert!(
        container["env"]
            .as_array()
            .unwrap()
            .contains(&serde_json::json!({"name": "RUST_LOG", "value": "info,resmgr=debug"}))
    );
    assert_eq!(
        container["resources"],
        serde_json::json!({"requests": {"cpu": "100m", "memory": "32Mi"}, "limits": {"cpu": "1", "memory": "128Mi"}})
    );
    let security = &container["securityContext"];
    assert_eq!(security["seLinuxOptions"]["type"], "spc_t");
    assert_eq!(
        security["runAsUser"], 0,
        "the override merges into the defaults"
    );
    assert_eq!(security["capabilities"]["drop"], serde_json::json!(["ALL"]));
    assert_eq!(container["ports"][0]["containerPort"], 9100);

    assert_eq!(setting(&text, "driver-name"), "cpus.example.com");
    assert_eq!(setting(&text, "nri-socket"), "/run/nri/nri.sock");
    assert_eq!(
        setting(&text, "kubelet-plugins-dir"),
        "/data/kubelet/plugins"
    );
    assert_eq!(setting(&text, "cdi-dir"), "/etc/cdi");
    assert_eq!(setting(&text, "state-dir"), "/data/resmgr");
    assert_eq!(setting(&text, "metrics-addr"), "0.0.0.0:9100");
    assert_eq!(setting(&text, "debug-addr"), "[::1]:9101");
    assert_eq!(setting(&text, "node-allocatable-cpu"), "true");
    assert_eq!(setting(&text, "nri-plugin-index"), "10");

    let service = object_of_kind(&text, "Service");
    assert_eq!(service["spec"]["ports"][0]["port"], 9100);
    assert_eq!(
        service["metadata"]["annotations"]["prometheus.io/port"],
        "9100"
    );
    assert_eq!(
        service["metadata"]["annotations"]["example.com/team"],
        "platform"
    );
    let monitor = object_of_kind(&text, "ServiceMonitor");
    assert_eq!(
        monitor["metadata"]["labels"]["release"],
        "kube-prometheus-stack"
    );
    assert_eq!(monitor["spec"]["endpoints"][0]["interval"], "15s");
    let selector = monitor["spec"]["selector"]["matchLabels"]
        .as_object()
        .unwrap();
    for (key, value) in selector {
        assert_eq!(
            &service["metadata"]["labels"][key], value,
            "the ServiceMonitor selects the Service by {key}"
        );
    }
    let quota = object_of_kind(&text, "ResourceQuota");
    assert_eq!(quota["spec"]["hard"]["pods"], "500");
    assert_eq!(
        quota["spec"]["scopeSelector"]["matchExpressions"][0]["values"],
        serde_json::json!(["system-cluster-critical"])
    );
    assert_eq!(
        object_of_kind(&text, "DeviceClass")["metadata"]["name"],
        "example-cpus"
    );
}

#[test]
fn everything_off_leaves_out_what_it_switches_off() {
    let text = render_chart(&ci("everything-off"));
    let kinds = check_all("everything off", &text);
    for kind in [
        "Namespace",
        "ResourceQuota",
        "Service",
        "ServiceMonitor",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    ] {
        assert!(!kinds.contains(&kind.to_owned()), "{kind}: {kinds:?}");
    }
    let daemonset = object_of_kind(&text, "DaemonSet");
    assert_eq!(
        daemonset["spec"]["updateStrategy"],
        serde_json::json!({"type": "OnDelete"}),
        "OnDelete takes no rollingUpdate"
    );
    let pod = &daemonset["spec"]["template"]["spec"];
    for field in [
        "nodeSelector",
        "tolerations",
        "priorityClassName",
        "affinity",
    ] {
        assert!(pod.get(field).is_none(), "{field}: {pod}");
    }
    assert!(pod["containers"][0].get("resources").is_none());
    assert_eq!(
        pod["containers"][0]["image"],
        format!(
            "ghcr.io/resmgr/resmgr:{}",
            objects(
                &fs::read_to_string(repo_root().join(helm::CHART_DIR).join("Chart.yaml")).unwrap()
            )[0]["appVersion"]
                .as_str()
                .unwrap()
        ),
        "an empty tag is the chart's appVersion"
    );
    assert_eq!(setting(&text, "debug-addr"), "off");
}

#[test]
fn without_dra_the_chart_installs_nothing_that_uses_the_api() {
    let text = render_chart(&ci("nri-only"));
    let kinds = check_all("NRI only", &text);
    for kind in [
        "ClusterRole",
        "ClusterRoleBinding",
        "DeviceClass",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    ] {
        assert!(!kinds.contains(&kind.to_owned()), "{kind}: {kinds:?}");
    }
    assert_eq!(pod_spec(&text)["automountServiceAccountToken"], false);
    assert_eq!(setting(&text, "dra"), "false");
    assert!(
        pod_spec(&render_chart("{}"))
            .get("automountServiceAccountToken")
            .is_none(),
        "with DRA the agent needs its token"
    );
}

#[test]
fn the_config_file_sets_either_reserved_cpus_or_their_count() {
    let file = config_file(&render_chart("{}"));
    assert_eq!(file["reserved-cpu-count"], 1);
    assert!(file.get("reserved-cpus").is_none(), "{file:?}");
    let file = config_file(&render_chart("{config: {reserved-cpus: '0,32'}}"));
    assert_eq!(file["reserved-cpus"], "0,32");
    assert!(
        file.get("reserved-cpu-count").is_none(),
        "the agent refuses both in one file: {file:?}"
    );
    let header = config_file(&render_chart("{}"));
    assert_eq!(header["apiVersion"], "resmgr.io/v1alpha1");
    assert_eq!(header["kind"], "AgentConfiguration");
}

#[test]
fn the_agents_own_namespace_runs_on_the_reserved_cpus() {
    let namespaces = |namespace: &str, overrides: &str| -> Vec<String> {
        let text = try_render(namespace, overrides).unwrap_or_else(|e| panic!("{e}"));
        serde_yaml_ng::from_value(config_file(&text)["reserved-namespaces"].clone())
            .expect("reserved-namespaces is a list")
    };
    assert_eq!(
        namespaces("resmgr-system", "{}"),
        ["kube-system", "resmgr-system"]
    );
    assert_eq!(
        namespaces("kube-system", "{}"),
        ["kube-system"],
        "named once"
    );
    assert_eq!(
        namespaces("agents", "{config: {reserved-namespaces: [infra]}}"),
        ["infra", "agents"]
    );
    assert_eq!(
        namespaces("agents", "{config: {reserved-namespaces: []}}"),
        ["agents"]
    );
}

#[test]
fn addresses_are_written_as_the_agent_takes_them_ipv6_in_brackets() {
    for (values, metrics, debug) in [
        ("{}", "[::]:8891", "127.0.0.1:8892"),
        (
            "{metrics: {bindAddress: 0.0.0.0}}",
            "0.0.0.0:8891",
            "127.0.0.1:8892",
        ),
        (
            "{metrics: {bindAddress: '[::]', port: 9000}, debug: {bindAddress: '::1'}}",
            "[::]:9000",
            "[::1]:8892",
        ),
        (&ci("ipv6"), "[fd00::10]:8891", "[::1]:8892"),
    ] {
        let text = render_chart(values);
        assert_eq!(setting(&text, "metrics-addr"), metrics, "{values}");
        assert_eq!(setting(&text, "debug-addr"), debug, "{values}");
    }
}

#[test]
fn the_probes_and_the_service_reach_the_port_the_agent_listens_on() {
    for (name, values) in [("defaults".to_owned(), "{}".to_owned())]
        .into_iter()
        .chain(ci_values())
    {
        let text = render_chart(&values);
        let container = &pod_spec(&text)["containers"][0];
        let port = &container["ports"][0];
        assert_eq!(port["name"], "metrics", "{name}");
        let listens = setting(&text, "metrics-addr");
        assert!(
            listens.ends_with(&format!(":{}", port["containerPort"])),
            "{name}: the agent listens on {listens}, the container port is {port}"
        );
        for probe in ["livenessProbe", "readinessProbe"] {
            assert_eq!(
                container[probe]["httpGet"]["port"], "metrics",
                "{name} {probe}"
            );
            assert!(
                container[probe]["httpGet"].get("host").is_none(),
                "{name}: probes go to the pod IP"
            );
        }
        if has_kind(&text, "Service") {
            assert_eq!(
                object_of_kind(&text, "Service")["spec"]["ports"][0]["targetPort"],
                "metrics"
            );
        }
    }
}

#[test]
fn a_changed_config_rolls_the_agents() {
    let checksum = |values: &str| {
        object_of_kind(&render_chart(values), "DaemonSet")["spec"]["template"]["metadata"]
            ["annotations"]["checksum/config"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    let before = checksum("{}");
    assert_eq!(before.len(), 64);
    assert_eq!(
        checksum("{podLabels: {a: b}}"),
        before,
        "only the config counts"
    );
    assert_ne!(checksum("{config: {log-format: text}}"), before);
    assert_ne!(
        checksum("{stateDir: /data/resmgr}"),
        before,
        "derived settings count too"
    );
}

#[test]
fn the_critical_pods_quota_is_only_where_it_is_asked_for_and_needed() {
    assert!(
        !has_kind(&render_chart("{}"), "ResourceQuota"),
        "off by default"
    );
    let on = "criticalPodsQuota: {enabled: true}";
    assert!(has_kind(&render_chart(on), "ResourceQuota"));
    let in_kube_system = try_render("kube-system", on).unwrap();
    assert!(!has_kind(&in_kube_system, "ResourceQuota"));
    for class in ["''", "batch-high"] {
        let values = format!("{on}\npriorityClassName: {class}\n");
        assert!(
            !has_kind(&render_chart(&values), "ResourceQuota"),
            "{class}"
        );
    }
}

#[test]
fn a_value_the_chart_does_not_know_fails_the_install_naming_it() {
    for (values, named) in [
        ("{tolerationz: []}", "tolerationz"),
        ("{config: {reserved-cpu: '2'}}", "reserved-cpu"),
        ("{config: {metrics-addr: '0.0.0.0:1'}}", "metrics-addr"),
        (
            "{metrics: {serviceMonitor: {enabled: true}, service: {enabled: false}}}",
            "metrics.service.enabled",
        ),
    ] {
        let err = try_render("resmgr-system", values).unwrap_err();
        assert!(err.contains(named), "{values}: {err}");
    }
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

#[test]
fn the_daemonset_runs_critical_with_the_node_name_probes_and_a_gentle_rollout() {
    let daemonset: DaemonSet =
        serde_json::from_value(object_of_kind(&plain_manifests(), "DaemonSet")).unwrap();
    let spec = daemonset.spec.unwrap();
    // The new agent starts beside the old one, which hands the node over to it.
    let rolling = spec.update_strategy.unwrap().rolling_update.unwrap();
    assert_eq!(rolling.max_surge, Some(IntOrString::Int(1)));
    assert_eq!(rolling.max_unavailable, Some(IntOrString::Int(0)));
    let pod = spec.template.spec.unwrap();
    assert_eq!(
        pod.priority_class_name.as_deref(),
        Some("system-node-critical")
    );
    assert_eq!(
        pod.tolerations.as_deref().map(<[_]>::len),
        Some(1),
        "one toleration: every taint"
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
    let pod_uid = container
        .env
        .iter()
        .flatten()
        .find(|e| e.name == "POD_UID")
        .and_then(|e| e.value_from.as_ref())
        .and_then(|v| v.field_ref.as_ref())
        .map(|f| f.field_path.as_str());
    assert_eq!(
        pod_uid,
        Some("metadata.uid"),
        "the pod names its kubelet sockets"
    );
    let generation = container
        .env
        .iter()
        .flatten()
        .find(|e| e.name == "POD_TEMPLATE_GENERATION")
        .and_then(|e| e.value_from.as_ref())
        .and_then(|v| v.field_ref.as_ref())
        .map(|f| f.field_path.as_str());
    assert_eq!(
        generation,
        Some("metadata.labels['pod-template-generation']"),
        "the pod's template generation: an old pod's agent is never handed the node"
    );
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
fn the_daemonset_mounts_each_host_path_where_the_config_file_points() {
    for (name, values) in [("plain".to_owned(), String::new())]
        .into_iter()
        .chain(ci_values())
    {
        let text = if name == "plain" {
            plain_manifests()
        } else {
            render_chart(&values)
        };
        let pod = pod_spec(&text);
        let container = &pod["containers"][0];
        assert!(strings(&container["args"]).contains(&"--node-name=$(NODE_NAME)"));
        let path = |key: &str| setting(&text, key);
        // (setting, the host path it names or is in, read-only)
        let nri_socket = path("nri-socket");
        let expected = [
            (
                nri_socket
                    .strip_suffix("/nri.sock")
                    .expect("the socket is nri.sock")
                    .to_owned(),
                true,
            ),
            (path("kubelet-plugins-dir"), false),
            (path("kubelet-registry-dir"), false),
            (path("cdi-dir"), false),
            (path("state-dir"), false),
            ("/sys".to_owned(), true),
        ];
        let volumes = pod["volumes"].as_array().unwrap();
        let mounts = container["volumeMounts"].as_array().unwrap();
        assert_eq!(
            volumes.len(),
            expected.len() + 1,
            "{name}: the host paths and the config, no other volumes"
        );
        for (host, read_only) in expected {
            let volume = volumes
                .iter()
                .find(|v| v["hostPath"]["path"] == host.as_str())
                .unwrap_or_else(|| panic!("{name}: no hostPath volume for {host}"));
            let mount = mounts
                .iter()
                .find(|m| m["name"] == volume["name"])
                .unwrap_or_else(|| panic!("{name}: {host} is not mounted"));
            assert_eq!(
                mount["mountPath"],
                host.as_str(),
                "{name}: {host} is mounted at the same path"
            );
            assert_eq!(
                mount["readOnly"].as_bool().unwrap_or(false),
                read_only,
                "{name}: {host} read-only"
            );
        }
        let config = volumes
            .iter()
            .find(|v| v.get("configMap").is_some())
            .expect("the config volume");
        assert_eq!(
            config["configMap"]["name"],
            object_of_kind(&text, "ConfigMap")["metadata"]["name"]
        );
        let mount = mounts.iter().find(|m| m["name"] == config["name"]).unwrap();
        assert_eq!(
            mount["mountPath"], "/etc/resmgr",
            "--config=/etc/resmgr/config.yaml"
        );
    }
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
            // retryWaitingPods, with the admission policy that confines it.
            ("".to_owned(), "pods".to_owned(), owned(&["list", "patch"])),
            (
                "events.k8s.io".to_owned(),
                "events".to_owned(),
                owned(&["create", "patch"])
            ),
            (
                "resource.k8s.io".to_owned(),
                "resourceclaims".to_owned(),
                owned(&["get", "list"])
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
fn the_device_class_selects_the_cpu_devices_of_the_driver_the_agent_runs_as() {
    for text in [plain_manifests(), render_chart(&ci("everything-on"))] {
        let class: DeviceClass =
            serde_json::from_value(object_of_kind(&text, "DeviceClass")).unwrap();
        let selectors = class.spec.selectors.unwrap();
        let expression = &selectors[0].cel.as_ref().unwrap().expression;
        let driver = setting(&text, "driver-name");
        // Devices with CPUs: not the memory devices of `device-mode: individual`.
        assert_eq!(
            expression,
            &format!("device.driver == \"{driver}\" && \"cpu\" in device.capacity[\"{driver}\"]")
        );
    }
}
