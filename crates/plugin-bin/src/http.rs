//! The agent's HTTP endpoints: `/metrics`, `/healthz`, `/readyz` and `/debug/state`.
//!
//! Ready means the claim gate is open (the runtime has synchronized) and the kubelet has
//! accepted our registration: before that the kubelet cannot send us claims, or we would refuse
//! them. Without DRA (NRI-only mode) there is no registration, and ready means synchronized. `/debug/state` is the current allocation as JSON: prepared claims as answered to the
//! kubelet, and every container's and claim's CPUs as the policy reports them
//! ([`policy::Policy::inventory`]; empty for a policy that keeps the default).

use std::{
    net::SocketAddr,
    sync::{Arc, OnceLock},
};

use axum::{
    Json, Router,
    extract::State,
    http::{StatusCode, header},
    response::IntoResponse,
    routing::get,
};
use resmgr::{Manager, kube::SlicePublisher, kubelet_plugin::RegistrationState};
use tokio::sync::watch;

use crate::{
    metrics::{Metrics, Snapshot},
    view::PolicyView,
};

/// What the endpoints read.
#[derive(Debug, Clone)]
pub struct Endpoints {
    /// Whether the agent serves DRA claims; without, readiness needs no kubelet registration.
    pub dra: bool,
    pub node: String,
    pub driver: String,
    pub manager: Arc<Manager>,
    pub view: PolicyView,
    pub metrics: Arc<Metrics>,
    /// Set once the kubelet plugin is serving.
    pub registration: Arc<OnceLock<watch::Receiver<RegistrationState>>>,
    /// Set once the devices are being published.
    pub publisher: Arc<OnceLock<SlicePublisher>>,
}

impl Endpoints {
    fn registration(&self) -> Option<RegistrationState> {
        self.registration.get().map(|r| r.borrow().clone())
    }

    /// What keeps the agent from being ready; empty when it is.
    fn unready(&self) -> Vec<String> {
        let mut missing = Vec::new();
        if !self.manager.gate().is_open() {
            missing.push("the container runtime has not synchronized yet".to_owned());
        }
        match self.registration() {
            _ if !self.dra => {}
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

/// Binds `addr` and serves until `stop` resolves. Returns the bound address (port 0 picks one).
pub async fn serve(
    addr: SocketAddr,
    endpoints: Endpoints,
    stop: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| anyhow::anyhow!("--metrics-addr {addr}: cannot listen: {e}"))?;
    let bound = listener.local_addr()?;
    let app = Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/debug/state", get(debug_state))
        .with_state(endpoints);
    let task = tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app)
            .with_graceful_shutdown(stop)
            .await
        {
            tracing::error!(error = %e, "the metrics server failed");
        }
    });
    Ok((bound, task))
}

async fn metrics(State(e): State<Endpoints>) -> impl IntoResponse {
    let pending = e.manager.pending_updates().await;
    e.metrics.refresh(&Snapshot {
        inventory: &e.view.inventory(),
        pending_updates: pending,
        synchronized: e.manager.gate().is_open(),
        ready: e.unready().is_empty(),
        publish: e.publisher.get().map(SlicePublisher::status),
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
    let claims = e.manager.claim_records().await;
    let pending = e.manager.pending_updates().await;
    let kubelet = match e.registration() {
        None if !e.dra => "not used: DRA is off".to_owned(),
        None => "not serving".to_owned(),
        Some(RegistrationState::Pending) => "pending".to_owned(),
        Some(RegistrationState::Registered) => "registered".to_owned(),
        Some(RegistrationState::Rejected { error }) => format!("rejected: {error}"),
    };
    Json(serde_json::json!({
        "node": e.node,
        "driver": e.driver,
        "runtime_synchronized": e.manager.gate().is_open(),
        "kubelet": kubelet,
        "pending_updates": pending,
        "prepared_claims": claims,
        "allocation": e.view.inventory(),
    }))
}

#[cfg(test)]
mod tests {
    use axum::response::Response;
    use policy::{
        Allocation, Claim, ClaimAllocation, Container, ContainerUpdate, Device, Policy,
        PolicyError, Resources,
    };
    use resmgr::kube::fake::StaticClaims;

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
        let (manager, view) = start_manager(
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
        let endpoints = Endpoints {
            dra: true,
            node: "node-a".into(),
            driver: driver.into(),
            manager,
            view,
            metrics: Arc::new(Metrics::new()),
            registration: Arc::new(OnceLock::new()),
            publisher: Arc::new(OnceLock::new()),
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
