//! The stub: connects a [`Plugin`] to the runtime and keeps the connection's state.
//!
//! Owns the handshake (serve the Plugin service first, then `RegisterPlugin` on the Runtime
//! connection, then wait for Configure, all within the registration timeout), the [`Handle`] for
//! unsolicited `UpdateContainers` and the two notifications the resource manager builds on: the
//! Synchronize reply has been written to the socket, and the connection is lost. The stub does not
//! reconnect: the resource manager exits on a lost connection and is restarted.

mod inherited;
mod lull;
mod service;
#[cfg(test)]
mod tests;

use std::{
    os::fd::{OwnedFd, RawFd},
    path::PathBuf,
    sync::Arc,
    time::Duration,
};

use prost::Message as _;
use tokio::{
    io::{AsyncRead, AsyncWrite},
    net::UnixStream,
    sync::watch,
};

pub use self::inherited::take_plugin_socket;
pub use self::lull::UpdateLull;
use self::service::{DEFAULT_REQUEST_TIMEOUT, IN_EVENT_HANDLER, PluginService};
use crate::{
    api,
    mux::{self, Closer, Disconnect},
    plugin::{Plugin, RuntimeInfo},
    rpc::{self, CallError, Client},
};

/// Where containerd and CRI-O listen for external plugins.
pub const DEFAULT_SOCKET_PATH: &str = "/var/run/nri/nri.sock";
/// The environment variable through which a runtime hands a pre-launched plugin its socket fd.
pub const PLUGIN_SOCKET_ENV: &str = "NRI_PLUGIN_SOCKET";
/// The NRI release whose API this crate implements, sent in RegisterPlugin (runtimes log it).
pub const PLUGIN_NRI_VERSION: &str = "v0.12.5";

/// Mux connection carrying the Plugin service (we serve).
const PLUGIN_CONN: u32 = 1;
/// Mux connection carrying the Runtime service (we call).
const RUNTIME_CONN: u32 = 2;
const PLUGIN_SERVICE: &str = "nri.pkg.api.v1alpha1.Plugin";
const RUNTIME_SERVICE: &str = "nri.pkg.api.v1alpha1.Runtime";

/// Why the stub could not connect.
#[derive(Debug, thiserror::Error)]
pub enum StubError {
    #[error(
        "plugin name {name:?} is invalid: it must be non-empty and use only A-Z a-z 0-9 _ . + -"
    )]
    InvalidName { name: String },
    #[error("plugin index {index:?} is invalid: it must be exactly two ASCII digits")]
    InvalidIndex { index: String },
    #[error("the plugin subscribes to no events (an empty mask would subscribe to all of them)")]
    NoEvents,
    #[error("connecting to the NRI socket {path}")]
    Connect {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{PLUGIN_SOCKET_ENV}={value:?} is not a file descriptor number")]
    InvalidSocketFd { value: String },
    #[error("{PLUGIN_SOCKET_ENV}={fd} names a standard stream, not the runtime's socket")]
    StandardStreamFd { fd: RawFd },
    #[error("{PLUGIN_SOCKET_ENV}={fd} is not a socket")]
    NotASocket { fd: RawFd },
    #[error(
        "{PLUGIN_SOCKET_ENV}={fd}: the runtime's socket has been taken already (once per process)"
    )]
    SocketFdTaken { fd: RawFd },
    #[error("using inherited socket fd {fd}")]
    InheritedSocket {
        fd: RawFd,
        #[source]
        source: std::io::Error,
    },
    #[error("registering with the runtime")]
    Register(#[source] CallError),
    #[error("the runtime did not send Configure within {timeout_ms} ms of registration")]
    ConfigureTimeout { timeout_ms: u128 },
    #[error("the connection ended during registration")]
    Rejected(#[source] Disconnect),
}

/// Why an unsolicited update did not report its outcome.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UpdateError {
    /// Called from inside an event handler. The runtime serves UpdateContainers under the lock it
    /// holds while it waits for the handler, so the call could only deadlock.
    #[error(
        "update_containers was called from inside an NRI event handler, where it would deadlock \
         with the runtime; call it from a separate task"
    )]
    InsideEventHandler,
    /// The runtime failed the call (some update failed). It drops the list of failed updates with
    /// the error, so none of the updates can be assumed applied.
    #[error("the runtime failed the update ({code}): {message}")]
    Rejected { code: i32, message: String },
    /// The call itself failed: connection lost, deadline, undecodable reply.
    #[error("calling UpdateContainers")]
    Call(#[source] CallError),
    /// An earlier call, which the runtime has not answered yet, kept this one from being sent
    /// for as long as the runtime's request timeout: the runtime may still be applying it.
    #[error(
        "the runtime has not answered an earlier UpdateContainers after {waited_ms} ms; not \
         sending another while it may still be applying that one"
    )]
    EarlierUnanswered { waited_ms: u128 },
}

/// How the stub identifies itself and behaves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StubConfig {
    /// Plugin name, `[A-Za-z0-9_.+-]+`.
    pub name: String,
    /// Two ASCII digits; plugins are called in index order.
    pub index: String,
    /// Serve the dedicated per-event calls of NRI v0.12+ runtimes (default). When false they are
    /// answered with Unimplemented and the runtime falls back to StateChange.
    pub dedicated_event_calls: bool,
    /// How long to wait for RegisterPlugin's reply, and then for Configure. Runtimes use 5 s.
    pub registration_timeout: Duration,
    /// How long an unsolicited update waits for the runtime's events to pause ([`UpdateLull`]).
    pub update_lull: UpdateLull,
}

impl StubConfig {
    pub fn new(name: impl Into<String>, index: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            index: index.into(),
            dedicated_event_calls: true,
            registration_timeout: Duration::from_secs(5),
            update_lull: UpdateLull::DEFAULT,
        }
    }
}

/// Where the runtime is. As the reference stub does, a plugin uses the socket in
/// `NRI_PLUGIN_SOCKET` when that is set (the library reads no environment: the binary takes it
/// with [`take_plugin_socket`]) and dials the runtime's socket otherwise.
#[derive(Debug)]
pub enum Endpoint {
    /// An external plugin dials the runtime's socket.
    Socket(PathBuf),
    /// A pre-launched plugin owns one end of a socketpair the runtime made.
    Inherited(OwnedFd),
}

/// Connects `plugin` to the runtime at `endpoint`, registers it and waits for Configure.
pub async fn connect<P: Plugin>(
    plugin: Arc<P>,
    config: StubConfig,
    endpoint: Endpoint,
) -> Result<Handle, StubError> {
    validate(&config, &*plugin)?;
    let stream = match endpoint {
        Endpoint::Socket(path) => UnixStream::connect(&path)
            .await
            .map_err(|source| StubError::Connect { path, source })?,
        Endpoint::Inherited(fd) => {
            use std::os::fd::AsRawFd as _;
            let raw = fd.as_raw_fd();
            let std = std::os::unix::net::UnixStream::from(fd);
            std.set_nonblocking(true)
                .and_then(|()| UnixStream::from_std(std))
                .map_err(|source| StubError::InheritedSocket { fd: raw, source })?
        }
    };
    connect_over(plugin, config, stream).await
}

/// Like [`connect`], over an already established trunk (any byte stream; tests use in-memory ones).
pub async fn connect_over<P, T>(
    plugin: Arc<P>,
    config: StubConfig,
    trunk: T,
) -> Result<Handle, StubError>
where
    P: Plugin,
    T: AsyncRead + AsyncWrite + Send + 'static,
{
    validate(&config, &*plugin)?;
    let mux = mux::start(trunk, &[PLUGIN_CONN, RUNTIME_CONN]);
    let mut inbound = mux.inbound;
    let (Some(plugin_rx), Some(runtime_rx)) =
        (inbound.remove(&PLUGIN_CONN), inbound.remove(&RUNTIME_CONN))
    else {
        // mux::start opens exactly the connections it was given.
        unreachable!("mux::start did not open connections 1 and 2");
    };
    let shared = Arc::new(Shared::new(config.update_lull));
    {
        let (shared, closer) = (shared.clone(), mux.closer.clone());
        tokio::spawn(async move {
            let why = closer.closed().await;
            // As an error, so that the subscriber prints its cause too.
            tracing::info!(
                reason = &why as &dyn std::error::Error,
                "NRI connection lost"
            );
            shared.set_closed(why);
        });
    }
    // Serve the Plugin service before registering: Configure may arrive before the reply to
    // RegisterPlugin does.
    let service = PluginService::new(plugin, shared.clone(), config.dedicated_event_calls);
    rpc::serve(
        PLUGIN_CONN,
        PLUGIN_SERVICE,
        Arc::new(service),
        mux.writer.clone(),
        plugin_rx,
    );
    let runtime = Client::start(RUNTIME_CONN, mux.writer, runtime_rx);
    let handle = Handle {
        shared,
        runtime,
        closer: mux.closer,
    };

    let request = api::RegisterPluginRequest {
        plugin_name: config.name.clone(),
        plugin_idx: config.index.clone(),
        nri_version: PLUGIN_NRI_VERSION.into(),
    };
    let registered = handle
        .runtime
        .call(
            RUNTIME_SERVICE,
            "RegisterPlugin",
            request.encode_to_vec(),
            Some(config.registration_timeout),
        )
        .await;
    if let Err(e) = registered {
        handle.close();
        return Err(StubError::Register(e));
    }
    tracing::info!(name = %config.name, index = %config.index, "registered with the runtime");
    let mut rx = handle.shared.lifecycle.subscribe();
    let configured = tokio::time::timeout(
        config.registration_timeout,
        rx.wait_for(|l| l.runtime.is_some() || l.closed.is_some()),
    )
    .await;
    let closed = match configured {
        Ok(Ok(l)) => l.closed.clone().filter(|_| l.runtime.is_none()),
        // `handle.shared` owns the sender, so the channel cannot close while we wait.
        Ok(Err(_)) => Some(Disconnect::ClosedLocally),
        Err(_) => {
            handle.close();
            return Err(StubError::ConfigureTimeout {
                timeout_ms: config.registration_timeout.as_millis(),
            });
        }
    };
    if let Some(why) = closed {
        return Err(StubError::Rejected(why));
    }
    Ok(handle)
}

fn validate<P: Plugin>(config: &StubConfig, plugin: &P) -> Result<(), StubError> {
    let name_ok = !config.name.is_empty()
        && config
            .name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_.+-".contains(&b));
    if !name_ok {
        return Err(StubError::InvalidName {
            name: config.name.clone(),
        });
    }
    if config.index.len() != 2 || !config.index.bytes().all(|b| b.is_ascii_digit()) {
        return Err(StubError::InvalidIndex {
            index: config.index.clone(),
        });
    }
    if plugin.events().is_empty() {
        return Err(StubError::NoEvents);
    }
    Ok(())
}

/// Where the connection stands; published through a watch channel.
#[derive(Debug, Clone, Default)]
struct Lifecycle {
    /// Set once Configure succeeded.
    runtime: Option<RuntimeInfo>,
    /// Set once the final Synchronize reply has been written to the socket.
    synchronized: bool,
    closed: Option<Disconnect>,
}

/// State shared by the service, the handles and the watcher of the trunk.
#[derive(Debug)]
pub(crate) struct Shared {
    lifecycle: watch::Sender<Lifecycle>,
    /// The runtime's calls being handled, which unsolicited updates wait out.
    lull: lull::Lull,
    /// Held by the UpdateContainers the runtime has not answered yet.
    update_slot: Arc<tokio::sync::Mutex<()>>,
}

impl Shared {
    fn new(update_lull: UpdateLull) -> Self {
        Self {
            lifecycle: watch::channel(Lifecycle::default()).0,
            lull: lull::Lull::new(update_lull),
            update_slot: Arc::default(),
        }
    }

    fn set_configured(&self, runtime: RuntimeInfo) {
        self.lifecycle.send_modify(|l| l.runtime = Some(runtime));
    }

    fn set_synchronized(&self) {
        self.lifecycle.send_modify(|l| l.synchronized = true);
    }

    /// The runtime's request timeout, as it announced it in Configure.
    fn request_timeout(&self) -> Duration {
        self.lifecycle
            .borrow()
            .runtime
            .as_ref()
            .map_or(DEFAULT_REQUEST_TIMEOUT, |r| r.request_timeout)
    }

    fn set_closed(&self, why: Disconnect) {
        self.lifecycle.send_modify(|l| {
            l.closed.get_or_insert(why);
        });
    }
}

/// The plugin's side of a live connection. Cheap to clone; use it from any task except an event
/// handler. The connection stays up until the runtime closes it or [`Handle::close`] is called.
#[derive(Debug, Clone)]
pub struct Handle {
    shared: Arc<Shared>,
    runtime: Client,
    closer: Closer,
}

impl Handle {
    /// Asks the runtime to apply `updates` to running containers (unsolicited `UpdateContainers`)
    /// and returns the updates that failed but were marked `ignore_failure`.
    ///
    /// Refused with [`UpdateError::InsideEventHandler`] when called from an event handler: the
    /// runtime holds its NRI lock while it waits for the handler and serves this call under the
    /// same lock, so awaiting it there blocks both sides until the runtime's request timeout
    /// drops the plugin. Spawning a task that calls it and awaiting that task from the handler
    /// deadlocks the same way and cannot be detected: don't.
    ///
    /// On [`UpdateError::Rejected`] the runtime has dropped the list of failed updates; which
    /// updates applied is unknown, so keep all of them pending and re-assert them.
    ///
    /// On NRI v0.11 runtimes an update that meets an event can deadlock the runtime
    /// ([`UpdateLull`]), so the call is sent only once the runtime has answered the one before
    /// it, and the runtime's events have paused (for up to [`UpdateLull::max_wait`]). All of it
    /// counts against the runtime's request timeout: past it the call fails
    /// ([`UpdateError::EarlierUnanswered`] when the earlier one still holds it back, a deadline
    /// otherwise), and a call that was sent stays in the runtime until it answers.
    pub async fn update_containers(
        &self,
        updates: Vec<api::ContainerUpdate>,
    ) -> Result<Vec<api::ContainerUpdate>, UpdateError> {
        if IN_EVENT_HANDLER.try_with(|_| ()).is_ok() {
            return Err(UpdateError::InsideEventHandler);
        }
        let timeout = self
            .runtime_info()
            .map_or(DEFAULT_REQUEST_TIMEOUT, |r| r.request_timeout);
        let deadline = tokio::time::Instant::now() + timeout;
        // One UpdateContainers in the runtime at a time, answered or not: one the runtime is
        // still applying holds its NRI locks, and on NRI v0.11 a second one queued behind it can
        // deadlock the runtime with the next event once the first lets go ([`UpdateLull`]).
        let Ok(slot) =
            tokio::time::timeout_at(deadline, self.shared.update_slot.clone().lock_owned()).await
        else {
            return Err(UpdateError::EarlierUnanswered {
                waited_ms: timeout.as_millis(),
            });
        };
        self.shared.lull.wait().await;
        let request = api::UpdateContainersRequest {
            update: updates,
            evict: vec![],
        };
        let runtime = self.runtime.clone();
        // The call outlives our deadline: it keeps the slot until the runtime answers or the
        // connection ends, however long that takes.
        let call = tokio::spawn(async move {
            let reply = runtime
                .call(
                    RUNTIME_SERVICE,
                    "UpdateContainers",
                    request.encode_to_vec(),
                    None,
                )
                .await;
            drop(slot);
            reply
        });
        let reply = match tokio::time::timeout_at(deadline, call).await {
            Ok(Ok(reply)) => reply,
            // The task neither panics nor is aborted; if it ever were, the call is lost.
            Ok(Err(_)) => Err(CallError::ConnectionClosed {
                method: "UpdateContainers".into(),
            }),
            Err(_) => Err(CallError::DeadlineExceeded {
                method: "UpdateContainers".into(),
                timeout_ms: timeout.as_millis(),
            }),
        };
        match reply {
            Ok(bytes) => api::UpdateContainersResponse::decode(bytes)
                .map(|r| r.failed)
                .map_err(|e| {
                    UpdateError::Call(CallError::Decode {
                        method: "UpdateContainers".into(),
                        detail: e.to_string(),
                    })
                }),
            Err(CallError::Status { status, .. }) => Err(UpdateError::Rejected {
                code: status.code,
                message: status.message,
            }),
            Err(e) => Err(UpdateError::Call(e)),
        }
    }

    /// Resolves once the final Synchronize reply has been written to the socket; fails with the
    /// reason if the connection ends first.
    pub async fn synchronized(&self) -> Result<(), Disconnect> {
        let mut rx = self.shared.lifecycle.subscribe();
        let l = rx
            .wait_for(|l| l.synchronized || l.closed.is_some())
            .await
            .map_err(|_| Disconnect::ClosedLocally)?;
        match (&l.closed, l.synchronized) {
            (_, true) => Ok(()),
            (Some(why), false) => Err(why.clone()),
            (None, false) => Err(Disconnect::ClosedLocally),
        }
    }

    /// Resolves with the reason once the connection to the runtime is lost.
    pub async fn closed(&self) -> Disconnect {
        let mut rx = self.shared.lifecycle.subscribe();
        match rx.wait_for(|l| l.closed.is_some()).await {
            Ok(l) => l.closed.clone().unwrap_or(Disconnect::ClosedLocally),
            Err(_) => Disconnect::ClosedLocally,
        }
    }

    /// What the runtime announced in Configure.
    pub fn runtime_info(&self) -> Option<RuntimeInfo> {
        self.shared.lifecycle.borrow().runtime.clone()
    }

    /// Closes the connection; the runtime sees EOF and drops the plugin.
    pub fn close(&self) {
        self.closer.close(Disconnect::ClosedLocally);
    }
}
