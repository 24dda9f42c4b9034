//! The kubelet's side of the agent: registration through the plugin registry socket, then
//! NodePrepareResources and NodeUnprepareResources (DRA v1) through the socket the agent
//! names, with the generated clients of `dra-proto`, dialed over unix sockets as the kubelet
//! dials them ([`integration_tests::kubelet`]).

use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};
use dra_proto::v1;
use integration_tests::kubelet::CALL_LIMIT;
use tonic::transport::Channel;

/// A prepared claim: its CDI device IDs, in result order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prepared {
    pub cdi_devices: Vec<String>,
    pub devices: Vec<String>,
}

/// The kubelet, for one driver.
#[derive(Debug)]
pub struct Kubelet {
    runtime: tokio::runtime::Runtime,
    registry_dir: PathBuf,
    driver: String,
    dra: Option<v1::dra_plugin_client::DraPluginClient<Channel>>,
}

impl Kubelet {
    pub fn new(registry_dir: PathBuf, driver: &str) -> anyhow::Result<Self> {
        Ok(Self {
            // A worker thread of its own drives the connections between calls, as a kubelet's
            // would: an agent that stops sends GOAWAY on its idle connection, and waits until
            // the client closes it.
            runtime: tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()?,
            registry_dir,
            driver: driver.to_owned(),
            dra: None,
        })
    }

    /// The registration socket the agent created last, if any: `<driver>-reg.sock`, or
    /// `<driver>-<instance>-reg.sock` when the agent names its sockets after its pod (as the
    /// kubelet's plugin watcher, this takes any socket in the registry directory; the newest is
    /// the agent just started).
    pub fn registration_socket(&self) -> Option<PathBuf> {
        let entries = std::fs::read_dir(&self.registry_dir).ok()?;
        entries
            .filter_map(Result::ok)
            .filter(|e| {
                e.file_name().to_str().is_some_and(|name| {
                    name.strip_prefix(self.driver.as_str())
                        .is_some_and(|rest| rest.ends_with("-reg.sock"))
                })
            })
            .filter_map(|e| Some((e.metadata().ok()?.modified().ok()?, e.path())))
            .max()
            .map(|(_, path)| path)
    }

    /// Registers the plugin as the kubelet's plugin watcher does: GetInfo, check it, accept.
    pub fn register(&mut self) -> anyhow::Result<()> {
        let socket = self.registration_socket().with_context(|| {
            format!("no registration socket in {}", self.registry_dir.display())
        })?;
        let endpoint = self
            .runtime
            .block_on(integration_tests::kubelet::register(&socket, &self.driver))?;
        let dra = self
            .runtime
            .block_on(integration_tests::kubelet::dial(Path::new(&endpoint)))?;
        self.dra = Some(v1::dra_plugin_client::DraPluginClient::new(dra));
        Ok(())
    }

    fn client(&self) -> anyhow::Result<v1::dra_plugin_client::DraPluginClient<Channel>> {
        self.dra
            .clone()
            .context("the kubelet has not registered the plugin")
    }

    /// Prepares one claim; its devices, or the per-claim error.
    pub fn prepare(&self, namespace: &str, name: &str, uid: &str) -> anyhow::Result<Prepared> {
        let mut client = self.client()?;
        let request = v1::NodePrepareResourcesRequest {
            claims: vec![v1::Claim {
                namespace: namespace.into(),
                name: name.into(),
                uid: uid.into(),
            }],
        };
        let answer = self
            .runtime
            .block_on(async {
                tokio::time::timeout(CALL_LIMIT, client.node_prepare_resources(request)).await
            })
            .context("NodePrepareResources timed out")?
            .context("NodePrepareResources")?
            .into_inner();
        let claim = answer
            .claims
            .get(uid)
            .with_context(|| format!("the answer has no claim {uid}: {answer:?}"))?;
        if !claim.error.is_empty() {
            bail!("preparing {namespace}/{name}: {}", claim.error);
        }
        Ok(Prepared {
            cdi_devices: claim
                .devices
                .iter()
                .flat_map(|d| d.cdi_device_ids.iter().cloned())
                .collect(),
            devices: claim
                .devices
                .iter()
                .map(|d| d.device_name.clone())
                .collect(),
        })
    }

    /// Unprepares one claim.
    pub fn unprepare(&self, namespace: &str, name: &str, uid: &str) -> anyhow::Result<()> {
        let mut client = self.client()?;
        let request = v1::NodeUnprepareResourcesRequest {
            claims: vec![v1::Claim {
                namespace: namespace.into(),
                name: name.into(),
                uid: uid.into(),
            }],
        };
        let answer = self
            .runtime
            .block_on(async {
                tokio::time::timeout(CALL_LIMIT, client.node_unprepare_resources(request)).await
            })
            .context("NodeUnprepareResources timed out")?
            .context("NodeUnprepareResources")?
            .into_inner();
        match answer.claims.get(uid) {
            Some(c) if c.error.is_empty() => Ok(()),
            Some(c) => bail!("unpreparing {namespace}/{name}: {}", c.error),
            None => bail!("the answer has no claim {uid}: {answer:?}"),
        }
    }

    /// Forgets the plugin (it went away); the next [`Self::register`] dials again.
    pub fn forget(&mut self) {
        self.dra = None;
    }
}
