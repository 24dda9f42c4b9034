//! The kubelet's CRI calls, made with `crictl` against the run's runtime: pods with the
//! cgroup parents the kubelet would give them, containers with their resources and CDI
//! devices, updates, and removal.
//!
//! crictl reads its own configuration file (never the host's `/etc/crictl.yaml`) and takes pod
//! and container configurations as JSON files in the CRI's field names.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, bail};
use policy::CpuSet;
use serde_json::{Value, json};

/// A pod's QoS class, which the kubelet puts in its cgroup parent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Qos {
    Guaranteed,
    Burstable,
    BestEffort,
}

/// A pod to run.
#[derive(Debug, Clone)]
pub struct Pod {
    pub name: String,
    pub namespace: String,
    pub uid: String,
    pub qos: Qos,
}

/// A container to create.
#[derive(Debug, Clone, Default)]
pub struct Container {
    pub name: String,
    pub command: Vec<String>,
    /// CPU request in milli-CPUs (shares as the kubelet computes them); 0 = none.
    pub cpu_request_milli: u64,
    /// CPU limit in milli-CPUs (a CFS quota over a 100 ms period); 0 = none.
    pub cpu_limit_milli: u64,
    /// Memory limit in bytes; 0 = none.
    pub memory_limit: u64,
    /// Fully qualified CDI device names (`vendor/class=name`), as the kubelet passes a claim's.
    pub cdi_devices: Vec<String>,
}

/// The kubelet's CPU shares for a request (`MilliCPUToShares`: at least 2).
pub fn shares(milli: u64) -> u64 {
    (milli * 1024 / 1000).max(2)
}

/// crictl against one runtime (containerd or CRI-O).
#[derive(Debug, Clone)]
pub struct Cri {
    crictl: PathBuf,
    config: PathBuf,
    /// Where pod and container configurations and logs are written.
    dir: PathBuf,
    image: String,
    /// The run's cgroup root (`/resmgr-e2e-<id>-kubepods`), the kubelet's `/kubepods`.
    cgroup_root: String,
}

impl Cri {
    pub fn new(
        crictl: &Path,
        socket: &Path,
        dir: &Path,
        image: &str,
        cgroup_root: &str,
    ) -> anyhow::Result<Self> {
        std::fs::create_dir_all(dir.join("cri"))?;
        let config = dir.join("crictl.yaml");
        let endpoint = format!("unix://{}", socket.display());
        std::fs::write(
            &config,
            format!("runtime-endpoint: {endpoint}\nimage-endpoint: {endpoint}\ntimeout: 30\n"),
        )?;
        Ok(Self {
            crictl: crictl.to_owned(),
            config,
            dir: dir.join("cri"),
            image: image.to_owned(),
            cgroup_root: cgroup_root.to_owned(),
        })
    }

    /// The crictl binary and the configuration file to pass it (`--config`).
    pub fn crictl(&self) -> (&Path, &Path) {
        (&self.crictl, &self.config)
    }

    fn run(&self, args: &[&str]) -> anyhow::Result<String> {
        let out = Command::new(&self.crictl)
            .arg("--config")
            .arg(&self.config)
            .args(args)
            .output()
            .with_context(|| format!("running crictl {}", args.join(" ")))?;
        if !out.status.success() {
            bail!(
                "crictl {} failed ({}): {}",
                args.join(" "),
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
    }

    /// Pulls an image through the runtime's image service.
    pub fn pull(&self, image: &str) -> anyhow::Result<()> {
        self.run(&["pull", image]).map(drop)
    }

    /// Whether the CRI service answers.
    pub fn ready(&self) -> bool {
        self.run(&["version"]).is_ok()
    }

    /// The kubelet's cgroup parent for `pod` (cgroupfs driver).
    pub fn cgroup_parent(&self, pod: &Pod) -> String {
        let uid = &pod.uid;
        match pod.qos {
            Qos::Guaranteed => format!("{}/pod{uid}", self.cgroup_root),
            Qos::Burstable => format!("{}/burstable/pod{uid}", self.cgroup_root),
            Qos::BestEffort => format!("{}/besteffort/pod{uid}", self.cgroup_root),
        }
    }

    /// The namespaces of every pod but the agent's. NODE (2): the host's network, so no CNI
    /// is needed. CONTAINER (1): a PID namespace per container, the kubelet's default (no
    /// shareProcessNamespace); CRI-O then runs no infra container for the pod.
    pub fn namespace_options(&self) -> Value {
        json!({"network": 2, "pid": 1})
    }

    /// The labels the kubelet gives a pod's sandbox and its containers. CRI-O tells NRI
    /// plugins a container's name from the label `io.kubernetes.container.name` alone (through
    /// its spec's annotation), so without them every container of the run was nameless to the
    /// agent on CRI-O, which no kubelet-made container is.
    fn pod_labels(pod: &Pod) -> serde_json::Map<String, Value> {
        let mut labels = serde_json::Map::new();
        labels.insert("io.kubernetes.pod.name".into(), json!(pod.name));
        labels.insert("io.kubernetes.pod.namespace".into(), json!(pod.namespace));
        labels.insert("io.kubernetes.pod.uid".into(), json!(pod.uid));
        labels
    }

    pub fn pod_config(&self, pod: &Pod) -> Value {
        json!({
            "metadata": {"name": pod.name, "namespace": pod.namespace, "uid": pod.uid, "attempt": 0},
            "labels": Self::pod_labels(pod),
            "log_directory": self.dir.join(format!("logs-{}", pod.name)),
            "linux": {
                "cgroup_parent": self.cgroup_parent(pod),
                "security_context": {"namespace_options": self.namespace_options()},
            },
        })
    }

    fn write(&self, name: &str, value: &Value) -> anyhow::Result<PathBuf> {
        let path = self.dir.join(name);
        std::fs::write(&path, serde_json::to_vec_pretty(value)?)
            .with_context(|| format!("writing {}", path.display()))?;
        Ok(path)
    }

    /// Runs a pod sandbox; its ID.
    pub fn run_pod(&self, pod: &Pod) -> anyhow::Result<String> {
        let path = self.write(&format!("pod-{}.json", pod.name), &self.pod_config(pod))?;
        self.run(&["runp", &path.display().to_string()])
    }

    /// Creates and starts a container in a pod; its ID.
    pub fn start_container(
        &self,
        pod_id: &str,
        pod: &Pod,
        c: &Container,
    ) -> anyhow::Result<String> {
        let mut resources = json!({"cpu_shares": shares(c.cpu_request_milli)});
        if c.cpu_request_milli == 0 && pod.qos == Qos::BestEffort {
            resources["cpu_shares"] = json!(2);
        }
        if c.cpu_limit_milli > 0 {
            resources["cpu_period"] = json!(100_000);
            resources["cpu_quota"] = json!(c.cpu_limit_milli * 100);
        }
        if c.memory_limit > 0 {
            resources["memory_limit_in_bytes"] = json!(c.memory_limit);
        }
        let mut labels = Self::pod_labels(pod);
        labels.insert("io.kubernetes.container.name".into(), json!(c.name));
        let mut config = json!({
            "metadata": {"name": c.name},
            "labels": labels,
            "image": {"image": self.image},
            "command": c.command,
            "log_path": format!("{}.log", c.name),
            "linux": {
                "resources": resources,
                // The pod's namespaces, as the kubelet repeats them for each container.
                "security_context": {"namespace_options": self.namespace_options()},
            },
        });
        if !c.cdi_devices.is_empty() {
            config["CDI_devices"] = c
                .cdi_devices
                .iter()
                .map(|name| json!({"name": name}))
                .collect();
        }
        let container = self.write(&format!("container-{}-{}.json", pod.name, c.name), &config)?;
        let pod_config = self.write(&format!("pod-{}.json", pod.name), &self.pod_config(pod))?;
        let id = self.run(&[
            "create",
            pod_id,
            &container.display().to_string(),
            &pod_config.display().to_string(),
        ])?;
        self.run(&["start", &id])?;
        Ok(id)
    }

    /// The host PID of a container's process.
    pub fn pid(&self, id: &str) -> anyhow::Result<u32> {
        let out = self.run(&[
            "inspect",
            "-o",
            "go-template",
            "--template",
            "{{.info.pid}}",
            id,
        ])?;
        out.parse()
            .with_context(|| format!("crictl inspect {id} gave pid {out:?}"))
    }

    /// The IDs of every running container the runtime knows of (ours, the agent's, any other).
    pub fn running_ids(&self) -> anyhow::Result<Vec<String>> {
        Ok(self
            .run(&["ps", "--quiet", "--state", "running"])?
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(str::to_owned)
            .collect())
    }

    /// A running container's `namespace/pod/container` and host PID, from `crictl inspect`.
    pub fn identify(&self, id: &str) -> anyhow::Result<(String, u32)> {
        let inspect = self.inspect(id)?;
        let pid = inspect["info"]["pid"]
            .as_u64()
            .and_then(|p| u32::try_from(p).ok())
            .with_context(|| format!("crictl inspect {id} has no pid: {}", inspect["info"]))?;
        let annotations = &inspect["info"]["runtimeSpec"]["annotations"];
        // containerd's annotation names, or CRI-O's.
        let text = |keys: [&str; 2]| {
            keys.iter()
                .find_map(|k| annotations[k].as_str())
                .unwrap_or("?")
                .to_owned()
        };
        let key = format!(
            "{}/{}/{}",
            text([
                "io.kubernetes.cri.sandbox-namespace",
                "io.kubernetes.pod.namespace"
            ]),
            text(["io.kubernetes.cri.sandbox-name", "io.kubernetes.pod.name"]),
            inspect["status"]["metadata"]["name"]
                .as_str()
                .unwrap_or("?"),
        );
        Ok((key, pid))
    }

    /// The cpuset the runtime reports a container has (its CRI ContainerStatus resources);
    /// None when it reports none.
    pub fn reported_cpus(&self, id: &str) -> anyhow::Result<Option<CpuSet>> {
        let inspect = self.inspect(id)?;
        match inspect["status"]["resources"]["linux"]["cpusetCpus"].as_str() {
            None | Some("") => Ok(None),
            Some(text) => text.parse().map(Some).map_err(|e| {
                anyhow::anyhow!("the runtime reports {id} with the cpuset {text:?}: {e}")
            }),
        }
    }

    /// `crictl update`: the kubelet resizing a running container.
    pub fn update(&self, id: &str, args: &[&str]) -> anyhow::Result<()> {
        let mut all = vec!["update"];
        all.extend_from_slice(args);
        all.push(id);
        self.run(&all).map(drop)
    }

    /// Runs a pod sandbox from a whole configuration (`name` names its file); its ID.
    pub fn run_pod_config(&self, name: &str, config: &Value) -> anyhow::Result<String> {
        let path = self.write(&format!("pod-{name}.json"), config)?;
        self.run(&["runp", &path.display().to_string()])
    }

    /// Creates and starts a container from a whole configuration in the pod `pod_id` made from
    /// `pod_config`; its ID.
    pub fn create_and_start(
        &self,
        pod_id: &str,
        name: &str,
        config: &Value,
        pod_config: &Value,
    ) -> anyhow::Result<String> {
        let container = self.write(&format!("container-{name}.json"), config)?;
        let pod = self.write(&format!("pod-{name}.json"), pod_config)?;
        let id = self.run(&[
            "create",
            pod_id,
            &container.display().to_string(),
            &pod.display().to_string(),
        ])?;
        self.run(&["start", &id])?;
        Ok(id)
    }

    /// `crictl inspect` of a container, parsed.
    pub fn inspect(&self, id: &str) -> anyhow::Result<Value> {
        let out = self.run(&["inspect", "-o", "json", id])?;
        serde_json::from_str(&out).with_context(|| format!("crictl inspect {id} printed {out:?}"))
    }

    /// The exit code of an exited container.
    pub fn exit_code(&self, id: &str) -> anyhow::Result<i32> {
        let status = &self.inspect(id)?["status"];
        if status["state"] != "CONTAINER_EXITED" {
            bail!("container {id} has not exited: {}", status["state"]);
        }
        status["exitCode"]
            .as_i64()
            .and_then(|c| i32::try_from(c).ok())
            .with_context(|| format!("container {id} has no exit code: {status}"))
    }

    /// Stops a container as the kubelet does: its stop signal, SIGKILL after `grace`.
    pub fn stop(&self, id: &str, grace: std::time::Duration) -> anyhow::Result<()> {
        self.run(&["stop", "--timeout", &grace.as_secs().to_string(), id])
            .map(drop)
    }

    /// Stops (at once) and removes a pod and its containers, as the kubelet does: each running
    /// container first (SIGKILL at once, a grace of 0), then the sandbox. CRI-O's
    /// StopPodSandbox would SIGTERM the containers still running and wait for them up to the
    /// request's deadline less a second (29 s here) before killing them, where containerd's kills
    /// them at once; the test containers' sleep ignores SIGTERM, so every pod removal took 29 s
    /// on CRI-O. The kubelet never leaves the sandbox's stop any container to wait for (the
    /// cluster stage checks it on both runtimes:
    /// TestDeletingAClaimPodUnpreparesRightAfterTheKubeletStopsItsContainers).
    pub fn remove_pod(&self, pod_id: &str) -> anyhow::Result<()> {
        for id in self.run(&["ps", "--quiet", "--pod", pod_id])?.lines() {
            self.stop(id.trim(), std::time::Duration::ZERO)?;
        }
        self.run(&["stopp", pod_id])?;
        self.run(&["rmp", pod_id]).map(drop)
    }

    /// Stops and removes every pod: the run's end, while the runtime still answers. The
    /// containers first, at once, as in [`Self::remove_pod`].
    pub fn remove_all_pods(&self) -> anyhow::Result<()> {
        for id in self.run(&["ps", "--quiet"])?.lines() {
            // One that exits meanwhile is no reason to keep the rest.
            let _ = self.stop(id.trim(), std::time::Duration::ZERO);
        }
        self.run(&["rmp", "--all", "--force"]).map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cri() -> Cri {
        let dir = tempfile::tempdir().unwrap();
        Cri::new(
            Path::new("/bin/false"),
            Path::new("/run/x.sock"),
            dir.path(),
            "localhost/e2e:1",
            "/resmgr-e2e-ab12-kubepods",
        )
        .unwrap()
    }

    #[test]
    fn cgroup_parents_carry_the_qos_class_as_the_kubelets_do() {
        let cri = cri();
        let pod = |qos| Pod {
            name: "p".into(),
            namespace: "default".into(),
            uid: "a-b".into(),
            qos,
        };
        assert_eq!(
            cri.cgroup_parent(&pod(Qos::Guaranteed)),
            "/resmgr-e2e-ab12-kubepods/poda-b"
        );
        assert_eq!(
            cri.cgroup_parent(&pod(Qos::Burstable)),
            "/resmgr-e2e-ab12-kubepods/burstable/poda-b"
        );
        assert_eq!(
            cri.cgroup_parent(&pod(Qos::BestEffort)),
            "/resmgr-e2e-ab12-kubepods/besteffort/poda-b"
        );
    }

    #[test]
    fn shares_follow_the_kubelet() {
        assert_eq!(shares(0), 2);
        assert_eq!(shares(100), 102);
        assert_eq!(shares(1000), 1024);
    }
}
