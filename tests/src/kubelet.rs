//! The kubelet's side of a DRA driver's sockets, played with `dra-proto`'s generated clients:
//! a gRPC channel to a unix socket, dialed as the kubelet dials it, and the plugin watcher's
//! registration. The one Rust home of the played kubelet: the e2e runner's, [`crate::node`]'s
//! and the tests' and benches' that dial a plugin themselves.

use std::{path::Path, time::Duration};

use anyhow::{Context as _, bail};
use dra_proto::pluginregistration::{
    InfoRequest, RegistrationStatus, registration_client::RegistrationClient,
};
use tonic::transport::{Channel, Endpoint};

/// Each registration call's limit, as the kubelet's (45 s) rounded down.
pub const CALL_LIMIT: Duration = Duration::from_secs(40);

/// A gRPC channel to the unix socket `socket`.
pub async fn dial(socket: &Path) -> anyhow::Result<Channel> {
    let path = socket.to_owned();
    Endpoint::from_static("http://localhost")
        .connect_timeout(Duration::from_secs(5))
        .connect_with_connector(tower::service_fn(move |_| {
            let socket = path.clone();
            async move {
                tokio::net::UnixStream::connect(socket)
                    .await
                    .map(hyper_util::rt::TokioIo::new)
            }
        }))
        .await
        .with_context(|| format!("dialing {}", socket.display()))
}

/// Registers the plugin behind `registration_socket` as the kubelet's plugin watcher does:
/// GetInfo, check that it is the DRA plugin `driver` and serves `v1.DRAPlugin`, accept. Its DRA
/// endpoint.
pub async fn register(registration_socket: &Path, driver: &str) -> anyhow::Result<String> {
    let mut client = RegistrationClient::new(dial(registration_socket).await?);
    let info = tokio::time::timeout(CALL_LIMIT, client.get_info(InfoRequest {}))
        .await
        .context("GetInfo timed out")??
        .into_inner();
    if info.r#type != "DRAPlugin" || info.name != driver {
        bail!(
            "GetInfo answered type {:?} name {:?}, want DRAPlugin {driver:?}",
            info.r#type,
            info.name
        );
    }
    if !info.supported_versions.iter().any(|v| v == "v1.DRAPlugin") {
        bail!(
            "the plugin supports {:?}, not v1.DRAPlugin",
            info.supported_versions
        );
    }
    tokio::time::timeout(
        CALL_LIMIT,
        client.notify_registration_status(RegistrationStatus {
            plugin_registered: true,
            error: String::new(),
        }),
    )
    .await
    .context("NotifyRegistrationStatus timed out")??;
    Ok(info.endpoint)
}
