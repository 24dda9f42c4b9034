//! The API server the agent talks to. Today the fake one of our tests (`fake-apiserver`):
//! a Node and the claims the scenarios prepare, allocated as the scheduler would have
//! allocated them. A run needs only a kubeconfig from it; a real control plane (kube-apiserver
//! and kube-scheduler) fits behind the same [`ApiServer`] trait.

use std::{
    os::unix::process::CommandExt as _,
    path::{Path, PathBuf},
    process::{Child, ChildStdin, Command, Stdio},
    time::Duration,
};

use anyhow::{Context as _, bail};
use serde_json::{Value, json};

use crate::{
    procs::wait_until,
    teardown::{self, Teardown},
};

/// What the agent needs of an API server.
pub trait ApiServer: std::fmt::Debug {
    /// A kubeconfig the agent can use.
    fn kubeconfig(&self) -> &Path;
}

/// A claim allocated by "the scheduler": `cpus` CPUs of device `device` for pod `pod_uid`,
/// and with `memory` and `hugepages_2mi` (bytes), that much of the device's memory capacities.
#[derive(Debug, Clone, Default)]
pub struct AllocatedClaim {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub pod_name: String,
    pub pod_uid: String,
    pub device: String,
    pub cpus: usize,
    pub memory: u64,
    pub hugepages_2mi: u64,
}

impl AllocatedClaim {
    /// The capacities the request asks for and the result consumed: `cpu`, and `memory` and
    /// `hugepages2Mi` when it has them.
    fn capacity(&self) -> Value {
        let mut capacity = json!({"cpu": self.cpus.to_string()});
        if self.memory > 0 {
            capacity["memory"] = json!(self.memory.to_string());
        }
        if self.hugepages_2mi > 0 {
            capacity["hugepages2Mi"] = json!(self.hugepages_2mi.to_string());
        }
        capacity
    }

    fn object(&self, driver: &str, node: &str) -> Value {
        json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": self.name, "namespace": self.namespace, "uid": self.uid},
            "spec": {"devices": {"requests": [{"name": "cpus", "exactly": {
                "deviceClassName": "cpu.resmgr.io", "count": 1,
                "capacity": {"requests": self.capacity()}}}]}},
            "status": {
                "allocation": {"devices": {"results": [{
                    "request": "cpus", "driver": driver, "pool": node, "device": self.device,
                    "consumedCapacity": self.capacity(),
                }]}},
                "reservedFor": [{"resource": "pods", "name": self.pod_name, "uid": self.pod_uid}],
            },
        })
    }
}

/// resmgr's fake API server, as a process that serves until its standard input closes.
#[derive(Debug)]
pub struct FakeApiServer {
    child: Child,
    stdin: Option<ChildStdin>,
    kubeconfig: PathBuf,
}

impl FakeApiServer {
    /// Starts `bin` holding node `node` and `claims` for `driver`.
    pub fn start(
        bin: &Path,
        dir: &Path,
        node: &str,
        driver: &str,
        claims: &[AllocatedClaim],
        teardown: &Teardown,
    ) -> anyhow::Result<Self> {
        let mut objects = vec![json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": node, "uid": format!("{node}-uid")},
        })];
        objects.extend(claims.iter().map(|c| c.object(driver, node)));
        let objects_file = dir.join("apiserver-objects.json");
        std::fs::write(&objects_file, serde_json::to_vec_pretty(&objects)?)?;
        let kubeconfig = dir.join("kubeconfig");
        let log = dir.join("apiserver.log");
        let out = std::fs::File::create(&log)?;
        let mut child = Command::new(bin)
            .arg(&objects_file)
            .arg(&kubeconfig)
            .stdin(Stdio::piped())
            .stdout(out.try_clone()?)
            .stderr(out)
            .process_group(0)
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        teardown.process("the fake API server", child.id());
        let stdin = child.stdin.take();
        wait_until("the fake API server", Duration::from_secs(30), || {
            if let Some(status) = child.try_wait()? {
                bail!(
                    "the fake API server exited ({status}):\n{}",
                    crate::procs::tail(&log, 20)
                );
            }
            Ok(std::fs::read_to_string(&log)?.contains("ready "))
        })?;
        Ok(Self {
            child,
            stdin,
            kubeconfig,
        })
    }
}

impl ApiServer for FakeApiServer {
    fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }
}

impl Drop for FakeApiServer {
    fn drop(&mut self) {
        // Closing its standard input is how it is told to stop.
        drop(self.stdin.take());
        let pid = self.child.id();
        if !teardown::wait_gone(pid, Duration::from_secs(5)) {
            teardown::kill(pid, rustix::process::Signal::KILL);
        }
        let _ = self.child.wait();
    }
}
