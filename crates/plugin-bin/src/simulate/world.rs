//! The simulated container runtime: it applies what it is told. (The simulated API server is
//! kube-dra's in-memory claim store, `kube_dra::fake::StaticClaims`.)
//!
//! It is deliberately dumb: the decisions under test are the real manager's and the real
//! policy's, and it only records their effects so the report can show them.

use std::{collections::BTreeMap, sync::Mutex};

use policy::{ContainerUpdate, CpuSet, NodeSet};
use resmgr::{BoxFuture, Runtime, RuntimeError};
use stdx::sync::lock;

/// A container as the runtime has it applied.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Applied {
    pub cpus: Option<CpuSet>,
    pub mems: Option<NodeSet>,
}

/// A runtime that applies every update it gets to its table of running containers: the
/// simulator's runtime, so part of what `resmgr simulate` shows, not a test double (tests that
/// record calls or inject failures use the `tests` package's `FakeRuntime`; see its `fakes`
/// module for which runtime double is for what).
#[derive(Debug, Default)]
pub struct SimRuntime {
    containers: Mutex<BTreeMap<String, Applied>>,
}

impl SimRuntime {
    /// A container starts with what its creation reply said.
    pub fn start(&self, id: &str, applied: Applied) {
        lock(&self.containers).insert(id.to_owned(), applied);
    }

    /// A container is gone.
    pub fn remove(&self, id: &str) {
        lock(&self.containers).remove(id);
    }

    /// Applies updates, from a reply or an `UpdateContainers` call; unknown containers are
    /// reported as failed, as a real runtime does.
    pub fn apply(&self, updates: &[ContainerUpdate]) -> Vec<String> {
        let mut table = lock(&self.containers);
        let mut failed = Vec::new();
        for u in updates {
            match table.get_mut(&u.container_id) {
                Some(c) => {
                    if let Some(cpus) = &u.cpus {
                        c.cpus = Some(cpus.clone());
                    }
                    if let Some(mems) = &u.mems {
                        c.mems = Some(mems.clone());
                    }
                }
                None => failed.push(u.container_id.clone()),
            }
        }
        failed
    }

    /// Every running container and what it runs on.
    pub fn table(&self) -> BTreeMap<String, Applied> {
        lock(&self.containers).clone()
    }
}

impl Runtime for SimRuntime {
    fn update_containers(
        &self,
        updates: Vec<ContainerUpdate>,
    ) -> BoxFuture<'_, Result<Vec<String>, RuntimeError>> {
        let failed = self.apply(&updates);
        Box::pin(std::future::ready(Ok(failed)))
    }
}
