//! `logger`: an NRI plugin that logs every event it receives and changes nothing.
//!
//! Runs against a real runtime: as an external plugin it dials `/var/run/nri/nri.sock` (or
//! `--socket`); installed as `/opt/nri/plugins/NN-logger` it is pre-launched by the runtime and
//! uses the socket passed in `NRI_PLUGIN_SOCKET`. It subscribes to every event the runtime's NRI
//! version can deliver and exits when the runtime closes the connection.
//!
//! ```sh
//! sudo cargo run -p nri --example logger -- --index 10
//! ```

use std::{path::PathBuf, sync::Arc};

use anyhow::Context as _;
use clap::Parser;
use nri::{
    EventSet, Plugin, PluginError, RuntimeInfo, StateChange, StubConfig,
    api::{self, Event},
};

/// Log every NRI event.
#[derive(Debug, Parser)]
struct Args {
    /// The runtime's NRI socket (ignored when NRI_PLUGIN_SOCKET is set).
    #[arg(long, default_value = nri::DEFAULT_SOCKET_PATH)]
    socket: PathBuf,
    /// Plugin name.
    #[arg(long, default_value = "logger")]
    name: String,
    /// Plugin index: two digits.
    #[arg(long, default_value = "10")]
    index: String,
}

struct Logger;

fn ids(pod: Option<&api::PodSandbox>, container: Option<&api::Container>) -> (String, String) {
    let pod = pod.map_or_else(String::new, |p| format!("{}/{}", p.namespace, p.name));
    let container = container.map_or_else(String::new, |c| format!("{}({})", c.name, c.id));
    (pod, container)
}

impl Plugin for Logger {
    fn events(&self) -> EventSet {
        // Everything but adjustment validation, which is for validator plugins; events the
        // runtime's NRI version does not know are dropped by the stub.
        EventSet::of(
            &(1..Event::ValidateContainerAdjustment as i32)
                .filter_map(|n| Event::try_from(n).ok())
                .collect::<Vec<_>>(),
        )
    }

    async fn configure(&self, runtime: &RuntimeInfo) -> Result<(), PluginError> {
        tracing::info!(
            runtime = %runtime.name,
            version = %runtime.version,
            nri = ?runtime.nri_version,
            request_timeout_ms = runtime.request_timeout.as_millis(),
            "Configure"
        );
        Ok(())
    }

    async fn synchronize(
        &self,
        pods: Vec<api::PodSandbox>,
        containers: Vec<api::Container>,
    ) -> Result<Vec<api::ContainerUpdate>, PluginError> {
        tracing::info!(
            pods = pods.len(),
            containers = containers.len(),
            "Synchronize"
        );
        for c in &containers {
            tracing::info!(container = %c.name, id = %c.id, pod = %c.pod_sandbox_id, "  existing container");
        }
        Ok(Vec::new())
    }

    async fn create_container(
        &self,
        request: api::CreateContainerRequest,
    ) -> Result<api::CreateContainerResponse, PluginError> {
        let (pod, container) = ids(request.pod.as_ref(), request.container.as_ref());
        let cpus = request
            .container
            .as_ref()
            .and_then(|c| c.linux.as_ref()?.resources.as_ref()?.cpu.as_ref())
            .map(|cpu| cpu.cpus.clone())
            .unwrap_or_default();
        tracing::info!(%pod, %container, %cpus, "CreateContainer");
        Ok(api::CreateContainerResponse::default())
    }

    async fn update_container(
        &self,
        request: api::UpdateContainerRequest,
    ) -> Result<api::UpdateContainerResponse, PluginError> {
        let (pod, container) = ids(request.pod.as_ref(), request.container.as_ref());
        tracing::info!(%pod, %container, "UpdateContainer");
        Ok(api::UpdateContainerResponse::default())
    }

    async fn stop_container(
        &self,
        request: api::StopContainerRequest,
    ) -> Result<api::StopContainerResponse, PluginError> {
        let (pod, container) = ids(request.pod.as_ref(), request.container.as_ref());
        tracing::info!(%pod, %container, "StopContainer");
        Ok(api::StopContainerResponse::default())
    }

    async fn update_pod_sandbox(
        &self,
        request: api::UpdatePodSandboxRequest,
    ) -> Result<(), PluginError> {
        let (pod, _) = ids(request.pod.as_ref(), None);
        tracing::info!(%pod, "UpdatePodSandbox");
        Ok(())
    }

    async fn state_change(&self, change: StateChange) -> Result<(), PluginError> {
        let (pod, container) = ids(change.pod.as_ref(), change.container.as_ref());
        tracing::info!(%pod, %container, via = ?change.delivery, "{}", change.event.as_str_name());
        Ok(())
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let args = Args::parse();
    // The one place the process reads NRI_PLUGIN_SOCKET.
    let endpoint = match std::env::var_os(nri::PLUGIN_SOCKET_ENV) {
        Some(value) => {
            #[allow(unsafe_code, reason = "taking the descriptor the runtime handed us")]
            // SAFETY: the value is the runtime's, read at start-up before anything could have
            // closed the descriptor it names and reused the number; nothing else in this process
            // uses that descriptor.
            let socket = unsafe { nri::take_plugin_socket(&value) }?;
            nri::Endpoint::Inherited(socket)
        }
        None => nri::Endpoint::Socket(args.socket),
    };
    let handle = nri::connect(
        Arc::new(Logger),
        StubConfig::new(args.name, args.index),
        endpoint,
    )
    .await
    .context("connecting to the runtime")?;
    let why = handle.closed().await;
    tracing::info!(reason = %why, "connection closed, exiting");
    Ok(())
}
