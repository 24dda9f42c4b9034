//! The agent as its DaemonSet runs it: the Helm chart rendered for this node by Helm's own code
//! (`helm-chart template`, with a values file that points the chart's host paths into the run
//! directory, as an operator of a node with other paths would), and the DaemonSet's pod turned
//! into what the kubelet would ask of the runtime: the container's image, arguments (with
//! `$(VAR)` expanded), environment, mounts (host paths at the paths the chart names, ConfigMaps
//! as read-only directories), security context, resources (so its QoS class and cgroup parent),
//! and the readiness and liveness probes.
//!
//! The agent needs of the host only what the DaemonSet mounts, and the e2e gives it the same: the
//! NRI socket's directory (read-only: connecting to a socket needs no write access to its mount),
//! the kubelet's plugin directories at their host paths (the kubelet dials the socket paths the
//! agent registers, so they must be the same inside and out), the CDI directory, its state
//! directory, and `/sys` read-only for hwloc's topology (with `/sys/fs/cgroup` below it, only
//! read: the runtime writes the cpusets the agent asks for over NRI). It reads no other process,
//! so its pod keeps a PID namespace of its own (no `hostPID`).
//!
//! What the e2e cannot do as a cluster does, it does differently on purpose, and says so here:
//! the pod uses the node's network (there is no CNI here; the probes then reach 127.0.0.1, so the
//! values bind the metrics port to loopback on a free port), and the agent gets a kubeconfig for
//! the fake API server instead of a service account token (no token issuer here; the control
//! plane stage covers RBAC). Fields that only decide where and whether the pod runs (node
//! selector, affinity, tolerations, priority, pull secrets, service account) are read and left
//! aside. Any other field of the pod or container is refused by name: a chart change the e2e
//! does not model fails here, instead of being run as something it is not.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use anyhow::{Context as _, bail, ensure};
use serde_json::{Value, json};

use crate::cri::{Qos, shares};

/// The release name the chart is rendered as (that of the plain manifests).
pub const RELEASE: &str = "resmgr";
/// The namespace it is installed into, that of the plain manifests. The chart adds it to the
/// agent's reserved namespaces: otherwise the agent's own pod would be a shared container, and on
/// a 2-CPU node (one CPU reserved) keep the last shared CPU from an exclusive container.
pub const NAMESPACE: &str = "resmgr-system";

/// Pod fields that decide where and whether the pod runs, not how: read and left aside.
const POD_SCHEDULING: &[&str] = &[
    "affinity",
    "automountServiceAccountToken",
    "imagePullSecrets",
    "nodeSelector",
    "priorityClassName",
    "serviceAccountName",
    "tolerations",
];
/// Pod fields the e2e runs as the kubelet would.
const POD_RUN: &[&str] = &[
    "containers",
    "hostIPC",
    "hostNetwork",
    "hostPID",
    "terminationGracePeriodSeconds",
    "volumes",
];
/// Container fields the e2e runs as the kubelet would (`ports` only names the probes' port).
const CONTAINER: &[&str] = &[
    "args",
    "command",
    "env",
    "image",
    "imagePullPolicy",
    "livenessProbe",
    "name",
    "ports",
    "readinessProbe",
    "resources",
    "securityContext",
    "volumeMounts",
];
const SECURITY: &[&str] = &[
    "allowPrivilegeEscalation",
    "capabilities",
    "privileged",
    "readOnlyRootFilesystem",
    "runAsGroup",
    "runAsNonRoot",
    "runAsUser",
    "seccompProfile",
];
const PROBE: &[&str] = &[
    "failureThreshold",
    "httpGet",
    "initialDelaySeconds",
    "periodSeconds",
    "successThreshold",
    "timeoutSeconds",
];

/// The node-specific values the chart is rendered with.
#[derive(Debug, Clone)]
pub struct NodeValues {
    /// `repository:tag` of the agent's image in the runtime.
    pub image: String,
    pub nri_socket_dir: PathBuf,
    pub kubelet_root: PathBuf,
    pub cdi_dir: PathBuf,
    pub state_dir: PathBuf,
    pub metrics_port: u16,
}

impl NodeValues {
    /// The values file: only the chart's keys for host paths, the image and the metrics address.
    pub fn yaml(&self) -> anyhow::Result<String> {
        let (repository, tag) = self
            .image
            .rsplit_once(':')
            .with_context(|| format!("image {} has no tag", self.image))?;
        let values = json!({
            "image": {"repository": repository, "tag": tag},
            "nri": {"socketDir": self.nri_socket_dir},
            "kubelet": {"rootDir": self.kubelet_root},
            "cdi": {"specDir": self.cdi_dir},
            "stateDir": self.state_dir,
            "metrics": {"bindAddress": "127.0.0.1", "port": self.metrics_port},
        });
        // JSON is YAML.
        Ok(serde_json::to_string_pretty(&values)?)
    }
}

/// Renders the chart at `chart` with `helm` (the chart renderer `helm-chart` (tools/helm-chart)) and `values_file`.
pub fn render(helm: &Path, chart: &Path, values_file: &Path) -> anyhow::Result<Vec<Value>> {
    let out = Command::new(helm)
        .args(["template", "--chart"])
        .arg(chart)
        .args(["--release", RELEASE, "--namespace", NAMESPACE, "-f"])
        .arg(values_file)
        .output()
        .with_context(|| format!("running {}", helm.display()))?;
    if !out.status.success() {
        bail!(
            "rendering the chart {} failed ({}): {}",
            chart.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    documents(&String::from_utf8_lossy(&out.stdout))
}

/// The documents of a multi-document YAML text, as JSON values.
pub fn documents(text: &str) -> anyhow::Result<Vec<Value>> {
    let mut docs = Vec::new();
    for doc in serde_yaml_ng::Deserializer::from_str(text) {
        let value: Value =
            serde::Deserialize::deserialize(doc).context("parsing the rendered chart")?;
        if !value.is_null() {
            docs.push(value);
        }
    }
    Ok(docs)
}

/// A bind mount of the agent's container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    pub host: PathBuf,
    pub container: PathBuf,
    pub readonly: bool,
}

/// What the kubelet would run for the DaemonSet's pod on this node.
#[derive(Debug, Clone)]
pub struct AgentPod {
    pub namespace: String,
    pub name: String,
    pub host_network: bool,
    pub host_pid: bool,
    pub host_ipc: bool,
    pub grace: Duration,
    pub image: String,
    /// The image's entrypoint is kept when empty.
    pub command: Vec<String>,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    /// Environment variables that hold the pod's UID (fieldRef `metadata.uid`): the UID is the
    /// sandbox's, known only once the e2e names it.
    pub pod_uid_env: Vec<String>,
    pub mounts: Vec<Mount>,
    /// Host directories to make first (`hostPath` of type `DirectoryOrCreate`).
    pub make_dirs: Vec<PathBuf>,
    /// Files to write first (ConfigMap data): path -> content.
    pub files: BTreeMap<PathBuf, String>,
    pub qos: Qos,
    /// CRI `linux.resources`.
    pub resources: Value,
    /// CRI `linux.security_context` of the container (namespaces are the pod's).
    pub security: Value,
    /// What the security context asks of the process, to check in the kernel's view.
    pub expect: Expected,
    pub port: u16,
    pub readiness: String,
    pub liveness: Option<String>,
}

/// What the agent's process must look like in `/proc/<pid>/status`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expected {
    pub uid: Option<i64>,
    pub gid: Option<i64>,
    pub no_capabilities: bool,
    pub no_new_privs: bool,
    pub seccomp: bool,
}

fn refuse_unknown(object: &Value, known: &[&str], what: &str) -> anyhow::Result<()> {
    let Some(map) = object.as_object() else {
        bail!("{what} is not an object: {object}");
    };
    for key in map.keys() {
        ensure!(
            known.contains(&key.as_str()),
            "{what} has `{key}`, which the e2e does not know how to run: model it in \
             tests/src/bin/e2e/daemonset.rs"
        );
    }
    Ok(())
}

fn strings(v: &Value, what: &str) -> anyhow::Result<Vec<String>> {
    match v {
        Value::Null => Ok(Vec::new()),
        Value::Array(items) => items
            .iter()
            .map(|i| {
                i.as_str()
                    .map(str::to_owned)
                    .with_context(|| format!("{what}: {i} is not a string"))
            })
            .collect(),
        other => bail!("{what} is not a list: {other}"),
    }
}

/// Kubernetes' `$(VAR)` expansion of a command or argument: a defined variable is replaced,
/// `$$` is a literal `$`, anything else stays as written.
pub fn expand(text: &str, env: &[(String, String)]) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
        } else if let Some(inner) = after.strip_prefix('(')
            && let Some(end) = inner.find(')')
            && let Some((_, value)) = env.iter().find(|(k, _)| k == &inner[..end])
        {
            out.push_str(value);
            rest = &inner[end + 1..];
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

/// A quantity in milli-units (`50m` -> 50, `2` -> 2000) or bytes (`64Mi`).
pub fn quantity(text: &str, milli: bool) -> anyhow::Result<u64> {
    let (number, factor): (&str, u64) = [
        ("Ki", 1 << 10),
        ("Mi", 1 << 20),
        ("Gi", 1 << 30),
        ("Ti", 1 << 40),
        ("k", 1_000),
        ("M", 1_000_000),
        ("G", 1_000_000_000),
        ("T", 1_000_000_000_000),
    ]
    .iter()
    .find_map(|(suffix, f)| text.strip_suffix(suffix).map(|n| (n, *f)))
    .unwrap_or((text, 1));
    if milli && let Some(n) = text.strip_suffix('m') {
        return n
            .parse()
            .with_context(|| format!("quantity {text:?} is not a number of milli-units"));
    }
    let n: u64 = number.parse().with_context(|| {
        format!("quantity {text:?}: only whole numbers with a suffix are modelled")
    })?;
    Ok(n * factor * if milli { 1000 } else { 1 })
}

/// The kubelet's view of the rendered objects: the DaemonSet's pod on node `node`, its
/// ConfigMaps as files under `config_dir`.
pub fn translate(docs: &[Value], node: &str, config_dir: &Path) -> anyhow::Result<AgentPod> {
    let daemonsets: Vec<&Value> = docs.iter().filter(|d| d["kind"] == "DaemonSet").collect();
    ensure!(
        daemonsets.len() == 1,
        "the chart renders {} DaemonSets, want 1",
        daemonsets.len()
    );
    let ds = daemonsets[0];
    let namespace = ds["metadata"]["namespace"]
        .as_str()
        .unwrap_or(NAMESPACE)
        .to_owned();
    let name = ds["metadata"]["name"]
        .as_str()
        .context("the DaemonSet has no name")?
        .to_owned();
    let spec = &ds["spec"]["template"]["spec"];
    let known: Vec<&str> = POD_SCHEDULING.iter().chain(POD_RUN).copied().collect();
    refuse_unknown(spec, &known, "the DaemonSet's pod spec")?;
    let flag = |key: &str| spec[key].as_bool().unwrap_or(false);
    let containers = spec["containers"]
        .as_array()
        .context("the pod has no containers")?;
    ensure!(
        containers.len() == 1,
        "the pod has {} containers, the e2e runs one",
        containers.len()
    );
    let c = &containers[0];
    refuse_unknown(c, CONTAINER, "the agent's container")?;

    if c["imagePullPolicy"] == "Always" {
        bail!("imagePullPolicy Always: the e2e has no registry to pull from");
    }
    let mut env = Vec::new();
    let mut pod_uid_env = Vec::new();
    for e in c["env"].as_array().into_iter().flatten() {
        let key = e["name"]
            .as_str()
            .context("an env entry has no name")?
            .to_owned();
        let value = if let Some(v) = e["value"].as_str() {
            v.to_owned()
        } else {
            match e["valueFrom"]["fieldRef"]["fieldPath"].as_str() {
                Some("spec.nodeName") => node.to_owned(),
                Some("metadata.namespace") => namespace.clone(),
                Some("metadata.uid") => {
                    pod_uid_env.push(key);
                    continue;
                }
                // The e2e runs one template of the DaemonSet: every pod is of generation 1.
                Some("metadata.labels['pod-template-generation']") => "1".to_owned(),
                _ => bail!(
                    "env {key}: only values and the fieldRefs spec.nodeName, metadata.namespace, metadata.uid and the pod-template-generation label are modelled: {e}"
                ),
            }
        };
        env.push((key, value));
    }
    let command = strings(&c["command"], "command")?
        .iter()
        .map(|a| expand(a, &env))
        .collect();
    let args = strings(&c["args"], "args")?
        .iter()
        .map(|a| expand(a, &env))
        .collect();

    // Volumes and mounts.
    let mut volumes: BTreeMap<&str, &Value> = BTreeMap::new();
    for v in spec["volumes"].as_array().into_iter().flatten() {
        volumes.insert(v["name"].as_str().context("a volume has no name")?, v);
    }
    let mut mounts = Vec::new();
    let mut make_dirs = Vec::new();
    let mut files = BTreeMap::new();
    for m in c["volumeMounts"].as_array().into_iter().flatten() {
        refuse_unknown(m, &["mountPath", "name", "readOnly"], "a volumeMount")?;
        let vname = m["name"].as_str().context("a volumeMount has no name")?;
        let v = volumes
            .get(vname)
            .with_context(|| format!("no volume {vname}"))?;
        let container = PathBuf::from(m["mountPath"].as_str().context("no mountPath")?);
        let readonly = m["readOnly"].as_bool().unwrap_or(false);
        let host = if let Some(path) = v["hostPath"]["path"].as_str() {
            match v["hostPath"]["type"].as_str().unwrap_or("") {
                "DirectoryOrCreate" => make_dirs.push(PathBuf::from(path)),
                "Directory" | "" => {}
                other => bail!("volume {vname}: hostPath type {other} is not modelled"),
            }
            PathBuf::from(path)
        } else if let Some(cm) = v["configMap"]["name"].as_str() {
            refuse_unknown(
                &v["configMap"],
                &["name", "defaultMode"],
                "a configMap volume",
            )?;
            let object = docs
                .iter()
                .find(|d| d["kind"] == "ConfigMap" && d["metadata"]["name"] == cm)
                .with_context(|| format!("volume {vname}: the chart renders no ConfigMap {cm}"))?;
            let dir = config_dir.join(cm);
            for (key, value) in object["data"].as_object().into_iter().flatten() {
                let text = value
                    .as_str()
                    .with_context(|| format!("ConfigMap {cm}: {key} is not text"))?;
                files.insert(dir.join(key), text.to_owned());
            }
            make_dirs.push(dir.clone());
            dir
        } else {
            bail!("volume {vname} is neither a hostPath nor a configMap: {v}");
        };
        mounts.push(Mount {
            host,
            container,
            readonly,
        });
    }

    // Security context.
    let sc = &c["securityContext"];
    if !sc.is_null() {
        refuse_unknown(sc, SECURITY, "the container's securityContext")?;
    }
    let uid = sc["runAsUser"].as_i64();
    let gid = sc["runAsGroup"].as_i64();
    if sc["runAsNonRoot"] == true && uid == Some(0) {
        bail!("runAsNonRoot with runAsUser 0: the kubelet refuses to start it");
    }
    let mut security = json!({});
    if let Some(uid) = uid {
        security["run_as_user"] = json!({"value": uid});
    }
    if let Some(gid) = gid {
        security["run_as_group"] = json!({"value": gid});
    }
    security["readonly_rootfs"] = json!(sc["readOnlyRootFilesystem"] == true);
    security["privileged"] = json!(sc["privileged"] == true);
    // The kubelet: allowPrivilegeEscalation false is no_new_privs.
    let no_new_privs = sc["allowPrivilegeEscalation"] == false;
    security["no_new_privs"] = json!(no_new_privs);
    let drop = strings(&sc["capabilities"]["drop"], "capabilities.drop")?;
    let add = strings(&sc["capabilities"]["add"], "capabilities.add")?;
    security["capabilities"] = json!({"drop_capabilities": drop, "add_capabilities": add});
    let seccomp = match sc["seccompProfile"]["type"].as_str() {
        None => false,
        Some("RuntimeDefault") => {
            // CRI SecurityProfile.ProfileType RuntimeDefault.
            security["seccomp"] = json!({"profile_type": 0});
            true
        }
        Some(other) => bail!("seccompProfile {other} is not modelled"),
    };
    let expect = Expected {
        uid,
        gid,
        no_capabilities: drop.iter().any(|d| d == "ALL") && add.is_empty(),
        no_new_privs,
        seccomp,
    };

    // Resources, and the QoS class they make.
    let r = &c["resources"];
    let get = |kind: &str, res: &str, milli: bool| -> anyhow::Result<Option<u64>> {
        r[kind][res]
            .as_str()
            .map(str::to_owned)
            .or_else(|| r[kind][res].as_u64().map(|n| n.to_string()))
            .map(|q| quantity(&q, milli))
            .transpose()
    };
    let cpu_req = get("requests", "cpu", true)?;
    let cpu_lim = get("limits", "cpu", true)?;
    let mem_req = get("requests", "memory", false)?;
    let mem_lim = get("limits", "memory", false)?;
    // The kubelet's QoS classes: a request defaults to its limit.
    let guaranteed = match (cpu_lim, mem_lim) {
        (Some(cpu), Some(mem)) => cpu_req.unwrap_or(cpu) == cpu && mem_req.unwrap_or(mem) == mem,
        _ => false,
    };
    let qos = if guaranteed {
        Qos::Guaranteed
    } else if [cpu_req, cpu_lim, mem_req, mem_lim]
        .iter()
        .all(Option::is_none)
    {
        Qos::BestEffort
    } else {
        Qos::Burstable
    };
    let mut resources = json!({"cpu_shares": shares(cpu_req.or(cpu_lim).unwrap_or(0))});
    if let Some(limit) = cpu_lim {
        resources["cpu_period"] = json!(100_000);
        resources["cpu_quota"] = json!(limit * 100);
    }
    if let Some(limit) = mem_lim {
        resources["memory_limit_in_bytes"] = json!(limit);
    }

    // Probes: HTTP GETs on a named or numbered port.
    let ports: BTreeMap<String, u16> = c["ports"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| {
            Some((
                p["name"].as_str()?.to_owned(),
                u16::try_from(p["containerPort"].as_u64()?).ok()?,
            ))
        })
        .collect();
    let probe = |key: &str| -> anyhow::Result<Option<(String, u16)>> {
        let p = &c[key];
        if p.is_null() {
            return Ok(None);
        }
        refuse_unknown(p, PROBE, key)?;
        let get = &p["httpGet"];
        refuse_unknown(get, &["path", "port", "scheme"], &format!("{key}.httpGet"))?;
        ensure!(
            get["scheme"].is_null() || get["scheme"] == "HTTP",
            "{key}: only HTTP is modelled"
        );
        let port = match &get["port"] {
            Value::String(name) => *ports
                .get(name)
                .with_context(|| format!("{key}: no port named {name}"))?,
            Value::Number(n) => u16::try_from(n.as_u64().unwrap_or(0))?,
            other => bail!("{key}: port {other}"),
        };
        Ok(Some((get["path"].as_str().unwrap_or("/").to_owned(), port)))
    };
    let (readiness, port) = probe("readinessProbe")?
        .context("the agent's container has no readiness probe: the e2e waits for it")?;
    let liveness = match probe("livenessProbe")? {
        Some((path, p)) => {
            ensure!(
                p == port,
                "the liveness probe's port {p} is not the readiness probe's {port}"
            );
            Some(path)
        }
        None => None,
    };

    Ok(AgentPod {
        namespace,
        name,
        host_network: flag("hostNetwork"),
        host_pid: flag("hostPID"),
        host_ipc: flag("hostIPC"),
        grace: Duration::from_secs(spec["terminationGracePeriodSeconds"].as_u64().unwrap_or(30)),
        image: c["image"]
            .as_str()
            .context("the container has no image")?
            .to_owned(),
        command,
        args,
        env,
        pod_uid_env,
        mounts,
        make_dirs,
        files,
        qos,
        resources,
        security,
        expect,
        port,
        readiness,
        liveness,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn variables_expand_as_kubernetes_expands_them() {
        let env = vec![("NODE_NAME".to_owned(), "n1".to_owned())];
        assert_eq!(expand("--node-name=$(NODE_NAME)", &env), "--node-name=n1");
        assert_eq!(
            expand("$$(NODE_NAME) $(OTHER) $", &env),
            "$(NODE_NAME) $(OTHER) $"
        );
    }

    #[test]
    fn quantities() {
        assert_eq!(quantity("50m", true).unwrap(), 50);
        assert_eq!(quantity("2", true).unwrap(), 2000);
        assert_eq!(quantity("64Mi", false).unwrap(), 64 << 20);
        assert_eq!(quantity("1G", false).unwrap(), 1_000_000_000);
        assert!(quantity("1.5Gi", false).is_err());
    }

    fn daemonset(extra_pod: Value, extra_container: Value) -> Vec<Value> {
        let mut container = json!({
            "name": "resmgr", "image": "localhost/resmgr:1",
            "args": ["run", "--config=/etc/resmgr/config.yaml", "--node-name=$(NODE_NAME)"],
            "env": [{"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                    {"name": "POD_UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}},
                    {"name": "POD_TEMPLATE_GENERATION", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['pod-template-generation']"}}}],
            "ports": [{"name": "metrics", "containerPort": 8891}],
            "readinessProbe": {"httpGet": {"path": "/readyz", "port": "metrics"}, "periodSeconds": 5},
            "livenessProbe": {"httpGet": {"path": "/healthz", "port": "metrics"}},
            "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}},
            "securityContext": {"runAsUser": 0, "runAsGroup": 0, "allowPrivilegeEscalation": false,
                "readOnlyRootFilesystem": true, "capabilities": {"drop": ["ALL"]},
                "seccompProfile": {"type": "RuntimeDefault"}},
            "volumeMounts": [
                {"name": "config", "mountPath": "/etc/resmgr", "readOnly": true},
                {"name": "nri", "mountPath": "/run/x/nri", "readOnly": true},
            ],
        });
        for (k, v) in extra_container.as_object().into_iter().flatten() {
            container[k] = v.clone();
        }
        let mut spec = json!({
            "serviceAccountName": "resmgr", "tolerations": [{"operator": "Exists"}],
            "containers": [container],
            "volumes": [
                {"name": "config", "configMap": {"name": "resmgr"}},
                {"name": "nri", "hostPath": {"path": "/run/x/nri", "type": "DirectoryOrCreate"}},
            ],
        });
        for (k, v) in extra_pod.as_object().into_iter().flatten() {
            spec[k] = v.clone();
        }
        vec![
            json!({"kind": "ConfigMap", "metadata": {"name": "resmgr"}, "data": {"config.yaml": "a: 1\n"}}),
            json!({"kind": "DaemonSet", "metadata": {"name": "resmgr", "namespace": "ns"},
                   "spec": {"template": {"spec": spec}}}),
        ]
    }

    #[test]
    fn the_pod_becomes_what_the_kubelet_would_run() {
        let pod = translate(
            &daemonset(json!({}), json!({})),
            "node-1",
            Path::new("/r/cm"),
        )
        .unwrap();
        assert_eq!(
            pod.args,
            [
                "run",
                "--config=/etc/resmgr/config.yaml",
                "--node-name=node-1"
            ]
        );
        assert_eq!(
            pod.env,
            [
                ("NODE_NAME".to_owned(), "node-1".to_owned()),
                ("POD_TEMPLATE_GENERATION".to_owned(), "1".to_owned())
            ]
        );
        assert_eq!(pod.pod_uid_env, ["POD_UID"]);
        assert_eq!(
            pod.mounts,
            [
                Mount {
                    host: "/r/cm/resmgr".into(),
                    container: "/etc/resmgr".into(),
                    readonly: true
                },
                Mount {
                    host: "/run/x/nri".into(),
                    container: "/run/x/nri".into(),
                    readonly: true
                },
            ]
        );
        assert_eq!(pod.files[Path::new("/r/cm/resmgr/config.yaml")], "a: 1\n");
        assert!(pod.make_dirs.contains(&PathBuf::from("/run/x/nri")));
        assert_eq!(pod.qos, Qos::Burstable);
        assert_eq!(pod.resources["memory_limit_in_bytes"], 256 << 20);
        assert_eq!(pod.resources["cpu_shares"], 51);
        assert_eq!(pod.security["run_as_user"]["value"], 0);
        assert_eq!(pod.security["no_new_privs"], true);
        assert_eq!(pod.security["readonly_rootfs"], true);
        assert_eq!(
            pod.security["capabilities"]["drop_capabilities"],
            json!(["ALL"])
        );
        assert_eq!(pod.security["seccomp"]["profile_type"], 0);
        assert_eq!(
            pod.expect,
            Expected {
                uid: Some(0),
                gid: Some(0),
                no_capabilities: true,
                no_new_privs: true,
                seccomp: true
            }
        );
        assert_eq!((pod.readiness.as_str(), pod.port), ("/readyz", 8891));
        assert_eq!(pod.liveness.as_deref(), Some("/healthz"));
        assert_eq!((pod.host_network, pod.host_pid), (false, false));
        assert_eq!(pod.namespace, "ns");
    }

    #[test]
    fn resources_make_the_kubelets_qos_classes() {
        for (resources, qos) in [
            (
                json!({"limits": {"cpu": "1", "memory": "1Gi"}}),
                Qos::Guaranteed,
            ),
            (
                json!({"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"cpu": "1", "memory": "1Gi"}}),
                Qos::Guaranteed,
            ),
            (
                json!({"requests": {"cpu": "500m"}, "limits": {"cpu": "1", "memory": "1Gi"}}),
                Qos::Burstable,
            ),
            (json!({"requests": {"cpu": "50m"}}), Qos::Burstable),
            (json!({}), Qos::BestEffort),
        ] {
            let docs = daemonset(json!({}), json!({"resources": resources}));
            let pod = translate(&docs, "n", Path::new("/r")).unwrap();
            assert_eq!(pod.qos, qos, "{resources}");
        }
    }

    #[test]
    fn fields_the_e2e_does_not_model_are_refused_by_name() {
        for (pod, container, name) in [
            (json!({"initContainers": []}), json!({}), "initContainers"),
            (json!({}), json!({"lifecycle": {}}), "lifecycle"),
            (
                json!({}),
                json!({"securityContext": {"seLinuxOptions": {}}}),
                "seLinuxOptions",
            ),
            (json!({}), json!({"imagePullPolicy": "Always"}), "Always"),
        ] {
            let err = translate(&daemonset(pod, container), "n", Path::new("/r")).unwrap_err();
            assert!(format!("{err:#}").contains(name), "{name}: {err:#}");
        }
    }
}
