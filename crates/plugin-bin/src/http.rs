//! The agent's HTTP endpoints: `/metrics`, `/healthz` and `/readyz` on the metrics address, and
//! `/debug/state` on an address of its own.
//!
//! Ready means the agent owns the node, the claim gate is open (the runtime has synchronized)
//! and the kubelet has accepted our registration: before that the kubelet cannot send us claims,
//! or we would hold and then refuse them. Without DRA (NRI-only mode) there is no registration,
//! and ready means synchronized. An agent waiting for an owner that cannot hand the node over
//! (an older release) is ready once registered: the DaemonSet deletes the old pod, which frees
//! the node, only once the new one is ready ([`crate::run::node::Standing::Standby`]). An agent
//! taking the node over, refused it, or that handed it over is not ready.
//! `/debug/state` is the current allocation as JSON: prepared claims as answered to the
//! kubelet, and every container's and claim's CPUs as the policy reports them
//! ([`policy::Policy::inventory`]; empty for a policy that keeps the default). It names every
//! claim and container of the node and has no authentication, so it is not served where the
//! probes and Prometheus reach the pod (the metrics address), but on the debug address, loopback
//! unless the operator says otherwise.
//!
//! An unspecified IPv6 address (`[::]`) listens dual-stack whatever the host's
//! `net.ipv6.bindv6only`, so one address serves the kubelet's probes on IPv4-only, IPv6-only and
//! dual-stack pods; on a kernel without IPv6 it falls back to `0.0.0.0`.

use std::{
    io,
    net::{Ipv4Addr, SocketAddr, SocketAddrV6},
    sync::{Arc, OnceLock},
};

use axum::{
    Json, Router,
    extract::State,
    http::{StatusCode, header},
    response::IntoResponse,
    routing::get,
};
use kube_dra::SlicePublisher;
use kubelet_plugin::RegistrationState;

use crate::{
    metrics::{Metrics, Snapshot},
    run::node::{Node, Standing},
};

/// What the endpoints read.
#[derive(Debug, Clone)]
pub struct Endpoints {
    /// The node's name when the agent serves DRA claims; `None` without DRA, when readiness
    /// needs no kubelet registration.
    pub node_name: Option<String>,
    pub driver: String,
    /// Who owns the node, its manager once this agent does, and the kubelet plugin's state.
    pub node: Arc<Node>,
    pub metrics: Arc<Metrics>,
    /// Set once the devices are being published.
    pub publisher: Arc<OnceLock<SlicePublisher>>,
    /// The Events poster; `None` without DRA.
    pub events: Option<kube_dra::KubeEvents>,
}

impl Endpoints {
    fn registration(&self) -> Option<RegistrationState> {
        self.node.kubelet().map(|k| k.registration.borrow().clone())
    }

    /// What keeps the agent from being ready; empty when it is.
    fn unready(&self) -> Vec<String> {
        let mut missing = Vec::new();
        match (self.node.standing(), self.node.manager()) {
            (Standing::Owner, Some(manager)) => {
                if let Some(why) = manager.contested() {
                    missing.push(format!("claims are refused: {why}"));
                } else if !manager.gate().is_open() {
                    missing.push("the container runtime has not synchronized yet".to_owned());
                }
            }
            (Standing::Standby { .. }, _) => {}
            (Standing::HandedOver { to }, _) => {
                missing.push(format!("handed the node over to the agent of pod {to}"));
            }
            (Standing::TakingOver { from }, _) => {
                missing.push(format!("taking the node over from the agent of pod {from}"));
            }
            (Standing::Refused { why }, _) => {
                missing.push(format!("the agent that owns the node refused it: {why}"));
            }
            (Standing::Starting | Standing::Owner, _) => {
                missing.push("the state directory is not taken yet".to_owned());
            }
        }
        if matches!(self.node.standing(), Standing::HandedOver { .. }) {
            return missing;
        }
        match self.registration() {
            _ if self.node_name.is_none() => {}
            None => missing.push("the kubelet plugin is not serving yet".to_owned()),
            Some(RegistrationState::Pending) => {
                missing.push("the kubelet has not confirmed our registration".to_owned());
            }
            Some(RegistrationState::Rejected { error }) => {
                missing.push(format!("the kubelet rejected our registration: {error}"));
            }
            Some(RegistrationState::Registered) => {}
        }
        missing
    }
}

/// One of the agent's HTTP servers, bound and not serving yet.
#[derive(Debug)]
pub struct Server {
    /// What it serves, for messages: `metrics endpoint` or `debug endpoint`.
    name: &'static str,
    /// The setting of its address, for messages.
    setting: &'static str,
    listener: tokio::net::TcpListener,
    app: Router,
}

impl Server {
    /// What it serves: `metrics endpoint` or `debug endpoint`.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The address it is bound to (port 0 picks one).
    pub fn addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Serves until `stop` resolves, then answers the requests in flight and returns.
    pub async fn serve(
        self,
        stop: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> anyhow::Result<()> {
        axum::serve(self.listener, self.app)
            .with_graceful_shutdown(stop)
            .await
            .map_err(|e| anyhow::anyhow!("{}: serving: {e}", self.setting))
    }
}

/// `/metrics`, `/healthz` and `/readyz` on `addr` (the `--metrics-addr` setting).
pub fn metrics_server(addr: SocketAddr, endpoints: Endpoints) -> anyhow::Result<Server> {
    let app = Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .with_state(endpoints);
    bind("metrics endpoint", "--metrics-addr", addr, app)
}

/// `/debug/state` on `addr` (the `--debug-addr` setting).
pub fn debug_server(addr: SocketAddr, endpoints: Endpoints) -> anyhow::Result<Server> {
    let app = Router::new()
        .route("/debug/state", get(debug_state))
        .with_state(endpoints);
    bind("debug endpoint", "--debug-addr", addr, app)
}

fn bind(
    name: &'static str,
    setting: &'static str,
    addr: SocketAddr,
    app: Router,
) -> anyhow::Result<Server> {
    let listener = listen(addr, bind_dual_stack)
        .map_err(|e| anyhow::anyhow!("{setting} {addr}: cannot listen: {e}"))?;
    Ok(Server {
        name,
        setting,
        listener,
        app,
    })
}

/// Binds `addr`. The unspecified IPv6 address goes through `dual_stack` (a seam for the test of
/// the fallback), and to `0.0.0.0` when the kernel has no IPv6 at all.
fn listen(
    addr: SocketAddr,
    dual_stack: impl FnOnce(SocketAddrV6) -> io::Result<std::net::TcpListener>,
) -> io::Result<tokio::net::TcpListener> {
    let std = match addr {
        SocketAddr::V6(v6) if v6.ip().is_unspecified() => match dual_stack(v6) {
            Err(e) if e.raw_os_error() == Some(rustix::io::Errno::AFNOSUPPORT.raw_os_error()) => {
                tracing::warn!(
                    port = v6.port(),
                    "this kernel has no IPv6: listening on 0.0.0.0 instead of [::]"
                );
                std::net::TcpListener::bind((Ipv4Addr::UNSPECIFIED, v6.port()))?
            }
            other => other?,
        },
        _ => std::net::TcpListener::bind(addr)?,
    };
    std.set_nonblocking(true)?;
    tokio::net::TcpListener::from_std(std)
}

/// Listens on `[::]:port` for IPv6 and, through IPv4-mapped addresses, IPv4: IPV6_V6ONLY off
/// explicitly, since its default is the host's `net.ipv6.bindv6only`.
fn bind_dual_stack(addr: SocketAddrV6) -> io::Result<std::net::TcpListener> {
    use rustix::net::{AddressFamily, SocketType, sockopt};
    let fd = rustix::net::socket(AddressFamily::INET6, SocketType::STREAM, None)?;
    sockopt::set_ipv6_v6only(&fd, false)?;
    sockopt::set_socket_reuseaddr(&fd, true)?;
    rustix::net::bind(&fd, &SocketAddr::V6(addr))?;
    rustix::net::listen(&fd, 1024)?;
    Ok(std::net::TcpListener::from(fd))
}

async fn metrics(State(e): State<Endpoints>) -> impl IntoResponse {
    let (inventory, pending, synchronized, reconciliation) = match e.node.manager() {
        Some(m) => (
            crate::view::inventory(m).await,
            m.pending_updates().await,
            m.gate().is_open(),
            m.reconciliation().await,
        ),
        None => (
            crate::view::InventoryRows::from(policy::Inventory::default()),
            0,
            false,
            resmgr::ReconcileReport::default(),
        ),
    };
    e.metrics.refresh(&Snapshot {
        inventory: &inventory,
        pending_updates: pending,
        synchronized,
        ready: e.unready().is_empty(),
        publish: e.publisher.get().map(SlicePublisher::status),
        events: e.events.as_ref().map(kube_dra::KubeEvents::stats),
        reconciliation: &reconciliation,
    });
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        e.metrics.encode(),
    )
}

async fn readyz(State(e): State<Endpoints>) -> impl IntoResponse {
    let missing = e.unready();
    if missing.is_empty() {
        return (StatusCode::OK, "ready\n".to_owned());
    }
    (
        StatusCode::SERVICE_UNAVAILABLE,
        format!("not ready: {}\n", missing.join("; ")),
    )
}

async fn debug_state(State(e): State<Endpoints>) -> impl IntoResponse {
    let standing = format!("{:?}", e.node.standing());
    let Some(manager) = e.node.manager() else {
        return Json(serde_json::json!({
            "node": e.node_name,
            "driver": e.driver,
            "standing": standing,
        }));
    };
    let claims = (*manager.snapshot().claims).clone();
    let allocation = crate::view::inventory(manager).await;
    let pending = manager.pending_updates().await;
    let kubelet = match e.registration() {
        None if e.node_name.is_none() => "not used: DRA is off".to_owned(),
        None => "not serving".to_owned(),
        Some(RegistrationState::Pending) => "pending".to_owned(),
        Some(RegistrationState::Registered) => "registered".to_owned(),
        Some(RegistrationState::Rejected { error }) => format!("rejected: {error}"),
    };
    Json(serde_json::json!({
        "node": e.node_name,
        "driver": e.driver,
        "standing": standing,
        "runtime_synchronized": manager.gate().is_open(),
        "kubelet": kubelet,
        "pending_updates": pending,
        "prepared_claims": claims,
        "reconciliation": manager.reconciliation().await,
        "allocation": allocation,
    }))
}

#[cfg(test)]
mod tests {
    use axum::response::Response;
    use kube_dra::fake::StaticClaims;
    use policy::{
        Allocation, Claim, ClaimAllocation, Container, ContainerUpdate, Device, Policy,
        PolicyError, Resources,
    };

    use super::*;
    use crate::simulate::{Dirs, start_manager, world::SimRuntime};

    /// A policy that places every container on CPU 0 and keeps the default inventory.
    #[derive(Debug)]
    struct Silent;

    impl Policy for Silent {
        fn name(&self) -> &str {
            "silent"
        }
        fn restore(&mut self, _: &serde_json::Value) -> Result<(), PolicyError> {
            Ok(())
        }
        fn snapshot(&self) -> serde_json::Value {
            serde_json::Value::Null
        }
        fn sync(&mut self, _: &[Container]) -> Result<Vec<ContainerUpdate>, PolicyError> {
            Ok(Vec::new())
        }
        fn allocate(&mut self, _: &Container) -> Result<Allocation, PolicyError> {
            let mut allocation = Allocation::default();
            allocation.adjustment.cpus = Some("0".parse().unwrap());
            Ok(allocation)
        }
        fn update(&mut self, _: &str, _: &Resources) -> Result<Vec<ContainerUpdate>, PolicyError> {
            Ok(Vec::new())
        }
        fn release(&mut self, _: &str) -> Result<Vec<ContainerUpdate>, PolicyError> {
            Ok(Vec::new())
        }
        fn devices(&self) -> Result<Vec<Device>, PolicyError> {
            Err(PolicyError::NoDraClaims)
        }
        fn allocate_claim(&mut self, _: &Claim) -> Result<ClaimAllocation, PolicyError> {
            Err(PolicyError::NoDraClaims)
        }
        fn release_claim(&mut self, _: &str) -> Result<Vec<ContainerUpdate>, PolicyError> {
            Ok(Vec::new())
        }
        fn claims(&self) -> Vec<String> {
            Vec::new()
        }
    }

    async fn body(response: Response) -> String {
        let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .unwrap();
        String::from_utf8(bytes.to_vec()).unwrap()
    }

    /// Connects to `client` and accepts on `listener`; the peer address the server saw.
    /// Connecting first: the kernel completes the handshake into the listen backlog without an
    /// accept, and a refused connection fails here instead of leaving accept waiting forever.
    async fn round_trip(listener: &tokio::net::TcpListener, client: SocketAddr) -> SocketAddr {
        let _stream = tokio::net::TcpStream::connect(client)
            .await
            .unwrap_or_else(|e| panic!("connecting to {client}: {e}"));
        listener.accept().await.unwrap().1
    }

    #[tokio::test]
    async fn the_unspecified_ipv6_address_serves_ipv4_and_ipv6_clients() {
        let listener = listen("[::]:0".parse().unwrap(), bind_dual_stack).unwrap();
        let port = listener.local_addr().unwrap().port();
        let v4 = round_trip(&listener, SocketAddr::from((Ipv4Addr::LOCALHOST, port))).await;
        assert_eq!(
            v4.ip().to_canonical(),
            std::net::IpAddr::from(Ipv4Addr::LOCALHOST),
            "{v4}"
        );
        let v6 = round_trip(
            &listener,
            SocketAddr::from((std::net::Ipv6Addr::LOCALHOST, port)),
        )
        .await;
        assert_eq!(v6.ip(), std::net::Ipv6Addr::LOCALHOST, "{v6}");
    }

    #[tokio::test]
    async fn without_ipv6_in_the_kernel_the_unspecified_address_falls_back_to_ipv4() {
        let no_ipv6 = |_| {
            Err(io::Error::from_raw_os_error(
                rustix::io::Errno::AFNOSUPPORT.raw_os_error(),
            ))
        };
        let listener = listen("[::]:0".parse().unwrap(), no_ipv6).unwrap();
        let bound = listener.local_addr().unwrap();
        assert_eq!(bound.ip(), std::net::IpAddr::from(Ipv4Addr::UNSPECIFIED));
        round_trip(
            &listener,
            SocketAddr::from((Ipv4Addr::LOCALHOST, bound.port())),
        )
        .await;

        let denied = |_| {
            Err(io::Error::from_raw_os_error(
                rustix::io::Errno::ACCESS.raw_os_error(),
            ))
        };
        let err = listen("[::]:0".parse().unwrap(), denied).unwrap_err();
        assert_eq!(
            err.kind(),
            io::ErrorKind::PermissionDenied,
            "other errors are not hidden"
        );
    }

    #[tokio::test]
    async fn other_addresses_bind_as_given() {
        let listener = listen("127.0.0.1:0".parse().unwrap(), |_| unreachable!()).unwrap();
        assert!(listener.local_addr().unwrap().ip().is_loopback());
        let listener = listen("[::1]:0".parse().unwrap(), |_| unreachable!()).unwrap();
        assert_eq!(
            listener.local_addr().unwrap().ip(),
            std::net::Ipv6Addr::LOCALHOST
        );
    }

    #[test]
    fn a_policy_that_serves_no_claims_shows_no_devices() {
        assert_eq!(Silent.devices(), Err(PolicyError::NoDraClaims));
        assert_eq!(crate::view::devices_to_show(&Silent), Ok(Vec::new()));
    }

    #[tokio::test]
    async fn a_policy_without_an_inventory_runs_and_shows_an_empty_allocation() {
        let dir = tempfile::tempdir().unwrap();
        let driver = crate::config::DEFAULT_DRIVER;
        let dirs = Dirs::under(dir.path());
        let (manager, _) = start_manager(
            driver,
            Box::new(Silent),
            &dirs,
            &Arc::new(SimRuntime::default()),
            &Arc::new(StaticClaims::new()),
        )
        .unwrap();
        let manager = Arc::new(manager);
        manager.synchronize(&[]).await.unwrap();
        manager.synchronized().await;
        let container = Container {
            id: "web".into(),
            ..Container::default()
        };
        let placed = manager.create_container(&container).await.unwrap();
        assert_eq!(placed.adjustment.cpus, Some("0".parse().unwrap()));
        let node = Arc::new(Node::default());
        node.own(manager);
        let endpoints = Endpoints {
            node_name: Some("node-a".into()),
            driver: driver.into(),
            node,
            metrics: Arc::new(Metrics::new()),
            publisher: Arc::new(OnceLock::new()),
            events: None,
        };

        let text = body(metrics(State(endpoints.clone())).await.into_response()).await;
        assert!(text.contains("resmgr_pending_updates 0"), "{text}");
        assert!(
            !text.contains("resmgr_pool_cpus{"),
            "no pool gauges: {text}"
        );

        let state: serde_json::Value =
            serde_json::from_str(&body(debug_state(State(endpoints)).await.into_response()).await)
                .unwrap();
        assert_eq!(
            state["allocation"],
            serde_json::json!({
                "reserved": "",
                "shared": "",
                "pools": [],
                "containers": [],
                "claims": [],
            })
        );
        assert_eq!(state["runtime_synchronized"], true);
    }
}
