//! A node as the kubelet sees it: the resource manager with the real topology-aware policy on a
//! synthetic machine, writing the claims' device metadata as the agent does by default, serving
//! the real DRA and registration sockets, over a fake runtime and in-memory claims; and a channel
//! to its DRA socket ([`crate::kubelet::dial`]).

use std::sync::Arc;

use kube_dra::fake::StaticClaims;
use kubelet_plugin::{KubeletConfig, KubeletPlugin};
use policy::{Allocation, Claim, Container, Topology, TopologyAware, TopologySource};
use resmgr::{Manager, ManagerConfig, dra_handler::LifecycleHandler, state::StateFile};
use tonic::transport::Channel;

use crate::fakes::FakeRuntime;

/// The driver name the node serves.
pub const DRIVER: &str = "topology-aware.resmgr.io";

/// A running node in a temporary directory.
#[derive(Debug)]
pub struct Node {
    pub dir: tempfile::TempDir,
    pub manager: Arc<Manager>,
    pub plugin: KubeletPlugin,
    pub runtime: Arc<FakeRuntime>,
    pub cdi_dir: std::path::PathBuf,
}

impl Node {
    /// Starts a node on the hwloc synthetic machine `topology`, whose API server holds `claims`.
    pub async fn start(topology: &str, claims: impl IntoIterator<Item = Claim>) -> Self {
        Self::start_with(topology, claims, policy::Config::default()).await
    }

    /// [`Node::start`] with the policy configured as `config` says.
    pub async fn start_with(
        topology: &str,
        claims: impl IntoIterator<Item = Claim>,
        config: policy::Config,
    ) -> Self {
        let topology = Topology::load(&TopologySource::Synthetic(topology.into())).unwrap();
        Self::start_on(topology, claims, config).await
    }

    /// [`Node::start_with`] on a topology built by the caller (one with hugepages, say, which
    /// a synthetic description cannot say).
    pub async fn start_on(
        topology: Topology,
        claims: impl IntoIterator<Item = Claim>,
        config: policy::Config,
    ) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let policy = TopologyAware::new(topology, config).unwrap();
        let reader = Arc::new(StaticClaims::new());
        for claim in claims {
            reader.insert(claim);
        }
        let runtime = Arc::new(FakeRuntime::default());
        let cdi_dir = dir.path().join("cdi");
        // Device metadata where the agent writes it by default: under the kubelet's plugins.
        let metadata = resmgr::metadata::MetadataStore::new(
            dir.path()
                .join("plugins")
                .join(DRIVER)
                .join(resmgr::metadata::SUBDIR),
            DRIVER,
            kube_dra::metadata::MetadataVersion::ALL.to_vec(),
        );
        let manager = Arc::new(
            Manager::start(
                ManagerConfig {
                    metadata: Some(metadata),
                    ..ManagerConfig::new(DRIVER)
                },
                Box::new(policy),
                StateFile::new(dir.path().join("state")),
                cdi::SpecStore::new(&cdi_dir, DRIVER).unwrap(),
                runtime.clone(),
                reader,
            )
            .unwrap(),
        );
        let config = KubeletConfig {
            driver_name: DRIVER.into(),
            plugins_dir: dir.path().join("plugins"),
            registry_dir: dir.path().join("plugins_registry"),
            instance: None,
        };
        let handler = Arc::new(LifecycleHandler::new(manager.clone()));
        let plugin = KubeletPlugin::start(&config, handler).await.unwrap();
        Self {
            dir,
            manager,
            plugin,
            runtime,
            cdi_dir,
        }
    }

    /// The runtime synchronizes with `containers` running; the claim gate opens.
    pub async fn synchronize(&self, containers: &[Container]) {
        let updates = self.manager.synchronize(containers).await.unwrap();
        self.runtime.apply_reply(&updates);
        self.manager.synchronized().await;
    }

    /// The runtime creates and starts `container`, as containerd does: CreateContainer, the
    /// reply's updates applied, then PostStartContainer once it runs. Returns what the agent
    /// answered.
    pub async fn create(&self, container: &Container) -> Allocation {
        self.runtime.creating(&container.id);
        let allocation = self.manager.create_container(container).await.unwrap();
        self.runtime.apply_reply(&allocation.updates);
        self.runtime
            .created(&container.id, allocation.adjustment.cpus.as_ref());
        self.runtime.started(&container.id);
        self.manager.container_started(container).await;
        allocation
    }

    /// A channel to the node's DRA socket.
    pub async fn dra_channel(&self) -> Channel {
        crate::kubelet::dial(self.plugin.dra_socket())
            .await
            .unwrap()
    }
}
