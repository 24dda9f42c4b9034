//! The registration service (`pluginregistration.Registration`) and the registration state it
//! records.
//!
//! The kubelet's plugin watcher finds our registration socket, calls `GetInfo` (1 s deadline),
//! validates the answer, and reports the outcome with `NotifyRegistrationStatus`. `GetInfo` is
//! answered from memory with no IO: newer kubelets (1.36+) call it every 10 s as a liveness
//! check and deregister after two failures. A rejection is logged with the kubelet's reason and
//! published as [`RegistrationState::Rejected`], which keeps readiness false.

use dra_proto::pluginregistration::{
    InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse,
    registration_server::Registration,
};
use tokio::sync::watch;
use tonic::{Request, Response, Status};
use tracing::{error, info};

/// The plugin type the kubelet's DRA handler registers under.
pub const PLUGIN_TYPE: &str = "DRAPlugin";

/// The services we serve on the DRA socket, as `<package version>.<service>`: the DRA versions
/// most preferred first, then the resource health stream's. 1.34+ kubelets take the first DRA
/// version of this list they know (v1); 1.32/1.33 kubelets know only v1beta1. No kubelet picks
/// its DRA service by the health entries. 1.37+ kubelets open the health stream only if it is
/// listed here, taking the newest version they know (v1, then v1alpha1, whatever our order);
/// 1.36 opens v1alpha1 either way.
pub const SUPPORTED_VERSIONS: [&str; 4] = [
    "v1.DRAPlugin",
    "v1beta1.DRAPlugin",
    "v1.DRAResourceHealth",
    "v1alpha1.DRAResourceHealth",
];

/// Where our registration with the kubelet stands, as the kubelet last told us.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RegistrationState {
    /// The kubelet has not reported on our registration (yet).
    Pending,
    /// The kubelet accepted the registration: prepare calls can come.
    Registered,
    /// The kubelet refused the registration, with its reason. The kubelet retries on its own
    /// schedule (or when the registration socket is re-created).
    Rejected { error: String },
}

impl RegistrationState {
    /// Whether this counts as ready: only an accepted registration does.
    pub fn is_ready(&self) -> bool {
        matches!(self, Self::Registered)
    }
}

/// Serves `GetInfo` and records `NotifyRegistrationStatus`.
#[derive(Debug)]
pub(crate) struct RegistrationService {
    info: PluginInfo,
    state: watch::Sender<RegistrationState>,
}

impl RegistrationService {
    /// `endpoint` is the DRA socket's path as the kubelet sees it.
    pub(crate) fn new(
        driver_name: &str,
        endpoint: &str,
        state: watch::Sender<RegistrationState>,
    ) -> Self {
        Self {
            info: PluginInfo {
                r#type: PLUGIN_TYPE.to_owned(),
                name: driver_name.to_owned(),
                endpoint: endpoint.to_owned(),
                supported_versions: SUPPORTED_VERSIONS.iter().map(|v| (*v).to_owned()).collect(),
            },
            state,
        }
    }
}

#[tonic::async_trait]
impl Registration for RegistrationService {
    async fn get_info(
        &self,
        _request: Request<InfoRequest>,
    ) -> Result<Response<PluginInfo>, Status> {
        Ok(Response::new(self.info.clone()))
    }

    async fn notify_registration_status(
        &self,
        request: Request<RegistrationStatus>,
    ) -> Result<Response<RegistrationStatusResponse>, Status> {
        let status = request.into_inner();
        let state = if status.plugin_registered {
            info!(driver = %self.info.name, "registered with the kubelet");
            RegistrationState::Registered
        } else {
            error!(
                driver = %self.info.name,
                kubelet_error = %status.error,
                "the kubelet refused our registration"
            );
            RegistrationState::Rejected {
                error: status.error,
            }
        };
        self.state.send_replace(state);
        Ok(Response::new(RegistrationStatusResponse {}))
    }
}

#[cfg(test)]
mod tests {
    use dra_proto::{health_v1, health_v1alpha1, v1, v1beta1};

    use super::*;

    /// The version strings are the last two components of the generated service names; if a
    /// proto package changed, this would catch the stale string.
    #[test]
    fn supported_versions_name_the_services_we_serve() {
        let from_service = |name: &str| {
            let mut parts = name.rsplit('.');
            let service = parts.next().unwrap();
            let version = parts.next().unwrap();
            format!("{version}.{service}")
        };
        assert_eq!(
            SUPPORTED_VERSIONS,
            [
                from_service(v1::dra_plugin_server::SERVICE_NAME).as_str(),
                from_service(v1beta1::dra_plugin_server::SERVICE_NAME).as_str(),
                health_v1::dra_resource_health_server::SERVICE_NAME,
                health_v1alpha1::dra_resource_health_server::SERVICE_NAME,
            ]
        );
    }

    #[tokio::test]
    async fn notifications_move_the_state() {
        let (tx, rx) = watch::channel(RegistrationState::Pending);
        let service = RegistrationService::new("cpu.resmgr.io", "/p/dra.sock", tx);
        assert!(!rx.borrow().is_ready());
        let notify = |registered: bool, error: &str| {
            Request::new(RegistrationStatus {
                plugin_registered: registered,
                error: error.to_owned(),
            })
        };
        service
            .notify_registration_status(notify(true, ""))
            .await
            .unwrap();
        assert_eq!(*rx.borrow(), RegistrationState::Registered);
        assert!(rx.borrow().is_ready());
        service
            .notify_registration_status(notify(false, "no handler registered for plugin type"))
            .await
            .unwrap();
        assert_eq!(
            *rx.borrow(),
            RegistrationState::Rejected {
                error: "no handler registered for plugin type".into()
            }
        );
        assert!(!rx.borrow().is_ready());
    }

    #[tokio::test]
    async fn get_info_describes_the_dra_plugin() {
        let (tx, _rx) = watch::channel(RegistrationState::Pending);
        let service = RegistrationService::new("cpu.resmgr.io", "/p/cpu.resmgr.io/dra.sock", tx);
        let info = service
            .get_info(Request::new(InfoRequest {}))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(info.r#type, "DRAPlugin");
        assert_eq!(info.name, "cpu.resmgr.io");
        assert_eq!(info.endpoint, "/p/cpu.resmgr.io/dra.sock");
        assert_eq!(
            info.supported_versions,
            [
                "v1.DRAPlugin",
                "v1beta1.DRAPlugin",
                "v1.DRAResourceHealth",
                "v1alpha1.DRAResourceHealth"
            ]
        );
    }
}
