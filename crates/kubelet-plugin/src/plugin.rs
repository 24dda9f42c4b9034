//! Starting and stopping the two kubelet-facing servers, in the order the kubelet needs.
//!
//! Start: bind and serve the DRA socket first, then make the registration socket appear. The
//! kubelet may call prepare right after it registers us, so the DRA socket must already answer.
//!
//! Stop: remove the registration socket first (its disappearance is what deregisters us), stop
//! the registration server, then stop the DRA server (graceful: calls in flight are answered) and
//! remove its socket.

use std::{
    path::{Path, PathBuf},
    sync::Arc,
};

use dra_proto::{
    health_v1, health_v1alpha1, pluginregistration::registration_server::RegistrationServer, v1,
    v1beta1,
};
use tokio::{
    net::UnixListener,
    sync::{oneshot, watch},
    task::JoinHandle,
};
use tokio_stream::{StreamExt, wrappers::UnixListenerStream};
use tonic::transport::{Server, server::Router};
use tracing::info;

use crate::{
    authority::{MAX_FRAME_SIZE, MAX_HEADER_LIST_SIZE, RewritingStream, server_limits},
    dra::DraService,
    handler::ClaimHandler,
    health::{HealthReport, HealthService},
    names,
    registration::{RegistrationService, RegistrationState},
    socket::{BoundSocket, SocketError},
};

/// Largest DRA request we decode. A request names claims (about 150 bytes each); a pod has a
/// handful.
pub const MAX_DRA_REQUEST: usize = 1024 * 1024;

/// Largest DRA response we send: grpc-go's default receive limit, which the kubelet keeps. A
/// larger answer would fail at the kubelet anyway; failing here says why.
pub const MAX_DRA_RESPONSE: usize = 4 * 1024 * 1024;

/// Largest registration message either way; they carry a few short strings. Also the largest
/// health stream request (which carries nothing).
pub const MAX_REGISTRATION_MESSAGE: usize = 64 * 1024;

/// Where the kubelet-facing sockets go, and under which driver name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubeletConfig {
    /// The DRA driver name: a DNS subdomain, e.g. `cpu.resmgr.io`.
    pub driver_name: String,
    /// The kubelet's plugin directory; our socket is `<plugins_dir>/<driver>/dra.sock`, or
    /// `dra-<instance>.sock` for an instance.
    pub plugins_dir: PathBuf,
    /// The kubelet's plugin registry; our socket is `<registry_dir>/<driver>-reg.sock`, or
    /// `<driver>-<instance>-reg.sock` for an instance.
    pub registry_dir: PathBuf,
    /// This instance of the driver, when two may be registered at once (a rolling update with
    /// a surge): a name of its pod (its UID, or part of it: a socket's path has at most 107
    /// bytes). Its sockets are then named after it, as the Go helper's `RollingUpdate(podUID)`
    /// names them, so that the kubelet (1.33 or later) registers both and calls the newest one
    /// it is connected to. `None`: one instance, the plain names.
    pub instance: Option<String>,
}

impl KubeletConfig {
    pub const DEFAULT_PLUGINS_DIR: &str = "/var/lib/kubelet/plugins";
    pub const DEFAULT_REGISTRY_DIR: &str = "/var/lib/kubelet/plugins_registry";

    /// The default kubelet directories.
    pub fn new(driver_name: impl Into<String>) -> Self {
        Self {
            driver_name: driver_name.into(),
            plugins_dir: PathBuf::from(Self::DEFAULT_PLUGINS_DIR),
            registry_dir: PathBuf::from(Self::DEFAULT_REGISTRY_DIR),
            instance: None,
        }
    }

    /// The DRA service socket.
    pub fn dra_socket(&self) -> PathBuf {
        let name = match &self.instance {
            Some(instance) => format!("dra-{instance}.sock"),
            None => "dra.sock".to_owned(),
        };
        self.plugins_dir.join(&self.driver_name).join(name)
    }

    /// The registration socket.
    pub fn registration_socket(&self) -> PathBuf {
        let name = match &self.instance {
            Some(instance) => format!("{}-{instance}-reg.sock", self.driver_name),
            None => format!("{}-reg.sock", self.driver_name),
        };
        self.registry_dir.join(name)
    }
}

/// Why the kubelet-facing servers could not start or stop cleanly.
#[derive(Debug, thiserror::Error)]
pub enum KubeletError {
    #[error("driver name {0:?} is not a DNS subdomain of at most 63 characters")]
    InvalidDriverName(String),
    #[error(
        "instance {0:?} is not a pod UID: lower-case letters, digits and '-', at most 63 characters"
    )]
    InvalidInstance(String),
    #[error("socket path {0} is not valid UTF-8, so the kubelet cannot be told about it")]
    NonUtf8Path(PathBuf),
    #[error("setting up the DRA socket")]
    DraSocket(#[source] SocketError),
    #[error("setting up the registration socket")]
    RegistrationSocket(#[source] SocketError),
    #[error("removing the {server} socket")]
    RemoveSocket {
        server: &'static str,
        #[source]
        source: SocketError,
    },
    #[error("the {server} server failed")]
    Serve {
        server: &'static str,
        #[source]
        source: tonic::transport::Error,
    },
    #[error("the {server} server task ended abnormally")]
    Task {
        server: &'static str,
        #[source]
        source: tokio::task::JoinError,
    },
}

/// The running registration and DRA servers.
#[derive(Debug)]
pub struct KubeletPlugin {
    // Field order is drop order: the registration socket goes first on drop too.
    registration: ServerTask,
    dra: ServerTask,
    state: watch::Receiver<RegistrationState>,
    /// How many connections the DRA server has accepted: the kubelet connects once it has
    /// registered us, and from then on prefers us to older instances of the driver.
    dra_connections: watch::Receiver<u64>,
    /// Set on shutdown (and dropped with the plugin): ends the health streams, which would
    /// otherwise hold up the DRA server's graceful stop for ever.
    stopping: watch::Sender<bool>,
}

impl KubeletPlugin {
    /// Serves the DRA socket, then the registration socket. Both serve until [`Self::shutdown`]
    /// (or until this value is dropped, which stops them without waiting). The health stream
    /// reports no devices: see [`Self::start_with_health`].
    pub async fn start<H: ClaimHandler>(
        config: &KubeletConfig,
        handler: Arc<H>,
    ) -> Result<Self, KubeletError> {
        let (_, reports) = watch::channel(HealthReport::none());
        Self::start_with_health(config, handler, reports).await
    }

    /// [`Self::start`], with the device health the driver keeps in `reports` streamed to the
    /// kubelet (see the `health` module).
    pub async fn start_with_health<H: ClaimHandler>(
        config: &KubeletConfig,
        handler: Arc<H>,
        reports: watch::Receiver<HealthReport>,
    ) -> Result<Self, KubeletError> {
        validate_driver_name(&config.driver_name)?;
        if let Some(instance) = &config.instance {
            validate_instance(instance)?;
        }
        let dra_path =
            std::path::absolute(config.dra_socket()).unwrap_or_else(|_| config.dra_socket());
        let endpoint = dra_path
            .to_str()
            .ok_or_else(|| KubeletError::NonUtf8Path(dra_path.clone()))?
            .to_owned();

        let (dra_socket, listener) =
            BoundSocket::bind(&dra_path).map_err(KubeletError::DraSocket)?;
        let service = DraService::new(handler);
        let (stopping, stopping_rx) = watch::channel(false);
        let health = HealthService::new(reports, stopping_rx);
        let router = server()
            .add_service(
                v1::dra_plugin_server::DraPluginServer::new(service.clone())
                    .max_decoding_message_size(MAX_DRA_REQUEST)
                    .max_encoding_message_size(MAX_DRA_RESPONSE),
            )
            .add_service(
                v1beta1::dra_plugin_server::DraPluginServer::new(service)
                    .max_decoding_message_size(MAX_DRA_REQUEST)
                    .max_encoding_message_size(MAX_DRA_RESPONSE),
            )
            .add_service(
                health_v1::dra_resource_health_server::DraResourceHealthServer::new(health.clone())
                    .max_decoding_message_size(MAX_REGISTRATION_MESSAGE)
                    .max_encoding_message_size(MAX_DRA_RESPONSE),
            )
            .add_service(
                health_v1alpha1::dra_resource_health_server::DraResourceHealthServer::new(health)
                    .max_decoding_message_size(MAX_REGISTRATION_MESSAGE)
                    .max_encoding_message_size(MAX_DRA_RESPONSE),
            );
        let (connections_tx, dra_connections) = watch::channel(0);
        let mut dra = ServerTask::spawn("DRA", dra_socket, listener, router, Some(connections_tx));
        info!(
            socket = %endpoint,
            "serving DRA v1 and v1beta1, and the resource health stream v1 and v1alpha1"
        );

        let (state_tx, state) = watch::channel(RegistrationState::Pending);
        let service = RegistrationService::new(&config.driver_name, &endpoint, state_tx);
        let (reg_socket, listener) = match BoundSocket::bind(&config.registration_socket()) {
            Ok(bound) => bound,
            Err(e) => {
                // Best effort: the registration error is the one worth reporting.
                let _ = dra.stop().await;
                return Err(KubeletError::RegistrationSocket(e));
            }
        };
        let router = server().add_service(
            RegistrationServer::new(service)
                .max_decoding_message_size(MAX_REGISTRATION_MESSAGE)
                .max_encoding_message_size(MAX_REGISTRATION_MESSAGE),
        );
        let registration = ServerTask::spawn("registration", reg_socket, listener, router, None);
        info!(socket = %registration.socket.path().display(), "registration socket ready");
        Ok(Self {
            registration,
            dra,
            state,
            dra_connections,
            stopping,
        })
    }

    /// How many connections the DRA server has accepted so far. The kubelet connects right
    /// after it registers us; from then on it calls us, the newest instance it is connected to,
    /// rather than an older one still registered.
    pub fn dra_connections(&self) -> watch::Receiver<u64> {
        self.dra_connections.clone()
    }

    /// The registration state, as the kubelet last reported it; ready means registered.
    pub fn registration_state(&self) -> watch::Receiver<RegistrationState> {
        self.state.clone()
    }

    /// The DRA socket's path.
    pub fn dra_socket(&self) -> &Path {
        self.dra.socket.path()
    }

    /// The registration socket's path.
    pub fn registration_socket(&self) -> &Path {
        self.registration.socket.path()
    }

    /// Deregisters (removes the registration socket), then stops both servers, the DRA server
    /// after the calls in flight are answered and the health streams ended, and removes the DRA
    /// socket.
    pub async fn shutdown(mut self) -> Result<(), KubeletError> {
        let deregistered = self.registration.socket.remove();
        info!("removed the registration socket; the kubelet deregisters us");
        let registration = self.registration.stop().await;
        self.stopping.send_replace(true);
        let dra = self.dra.stop().await;
        deregistered.map_err(|source| KubeletError::RemoveSocket {
            server: "registration",
            source,
        })?;
        registration?;
        dra
    }
}

/// The HTTP/2 settings both servers share. The authority rewrite is matched to them.
fn server() -> Server {
    Server::builder()
        .max_frame_size(MAX_FRAME_SIZE)
        .http2_max_header_list_size(MAX_HEADER_LIST_SIZE)
}

/// A server task serving one socket until told to stop.
#[derive(Debug)]
struct ServerTask {
    name: &'static str,
    socket: BoundSocket,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<Result<(), tonic::transport::Error>>>,
}

impl ServerTask {
    fn spawn(
        name: &'static str,
        socket: BoundSocket,
        listener: UnixListener,
        router: Router,
        accepted: Option<watch::Sender<u64>>,
    ) -> Self {
        let incoming = UnixListenerStream::new(listener).map(move |conn| {
            if let (Ok(_), Some(accepted)) = (&conn, &accepted) {
                accepted.send_modify(|n| *n += 1);
            }
            conn.map(|stream| RewritingStream::new(stream, server_limits()))
        });
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(router.serve_with_incoming_shutdown(incoming, async move {
            // A dropped sender stops the server too.
            let _ = stopped.await;
        }));
        Self {
            name,
            socket,
            stop: Some(stop),
            task: Some(task),
        }
    }

    /// Stops serving (gracefully: calls in flight are answered), then removes the socket.
    async fn stop(&mut self) -> Result<(), KubeletError> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let served = match self.task.take() {
            Some(task) => match task.await {
                Ok(Ok(())) => Ok(()),
                Ok(Err(source)) => Err(KubeletError::Serve {
                    server: self.name,
                    source,
                }),
                Err(source) => Err(KubeletError::Task {
                    server: self.name,
                    source,
                }),
            },
            None => Ok(()),
        };
        self.socket
            .remove()
            .map_err(|source| KubeletError::RemoveSocket {
                server: self.name,
                source,
            })?;
        served
    }
}

/// An instance name becomes part of two file names and is a pod's UID: lower-case hex digits
/// and `-` (a DNS label's characters, which also covers the UIDs tests make up).
fn validate_instance(instance: &str) -> Result<(), KubeletError> {
    names::dns_label(instance).map_err(|_| KubeletError::InvalidInstance(instance.to_owned()))
}

/// A driver name becomes a directory and a file name and is the kubelet's key for us: a DNS
/// subdomain (lower-case alphanumerics, `-` and `.`, alphanumeric at both ends) of at most 63
/// characters, as ResourceSlice validation requires.
fn validate_driver_name(name: &str) -> Result<(), KubeletError> {
    names::dns_subdomain(name, names::MAX_DRIVER_NAME_LEN)
        .map_err(|_| KubeletError::InvalidDriverName(name.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn driver_names_must_be_dns_subdomains() {
        for good in ["cpu.resmgr.io", "a", "dra-cpu.example.com", "x1.y2"] {
            assert!(validate_driver_name(good).is_ok(), "{good}");
        }
        let too_long = "a".repeat(64);
        for bad in [
            "", "Cpu.io", "cpu..io", ".cpu", "cpu-", "a/b", "..", "cpu.-x", &too_long,
        ] {
            assert!(validate_driver_name(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn socket_paths_follow_the_kubelet_layout() {
        let config = KubeletConfig::new("cpu.resmgr.io");
        assert_eq!(
            config.dra_socket(),
            Path::new("/var/lib/kubelet/plugins/cpu.resmgr.io/dra.sock")
        );
        assert_eq!(
            config.registration_socket(),
            Path::new("/var/lib/kubelet/plugins_registry/cpu.resmgr.io-reg.sock")
        );
    }
}
