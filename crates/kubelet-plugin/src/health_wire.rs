//! The resource health stream in each of its wire versions: `v1.DRAResourceHealth` (kubelets
//! 1.37 and later prefer it) and `v1alpha1.DRAResourceHealth` (1.34 to 1.36, and later kubelets
//! for drivers that list only it).
//!
//! The two versions have the same messages in different proto packages, so prost generates a
//! set of types for each. Each adapter is the one conversion of a [`HealthReport`] into its
//! version's message and the tonic service that opens a stream of the `health` module's
//! [`HealthService`]; both are written once, in [`health_wire!`], and instantiated per version.
//! Nothing about when or what a stream sends lives here.

use tonic::{Request, Response, Status};

use crate::health::{Health, HealthMessage, HealthReport, HealthService, Messages};

/// The adapter for the health service of `dra_proto::$wire`, named `$version` in logs.
macro_rules! health_wire {
    ($wire:ident, $version:literal) => {
        impl HealthMessage for dra_proto::$wire::NodeWatchResourcesResponse {
            fn from_report(report: &HealthReport) -> Self {
                use dra_proto::$wire as wire;
                let checked_at = report.wire_checked_at();
                let timeout = report.wire_timeout();
                wire::NodeWatchResourcesResponse {
                    devices: report
                        .devices
                        .iter()
                        .map(|d| wire::DeviceHealth {
                            device: Some(wire::DeviceIdentifier {
                                pool_name: d.pool.clone(),
                                device_name: d.device.clone(),
                            }),
                            health: match d.health {
                                Health::Healthy => wire::HealthStatus::Healthy,
                                Health::Unhealthy => wire::HealthStatus::Unhealthy,
                                Health::Unknown => wire::HealthStatus::Unknown,
                            }
                            .into(),
                            last_updated_time: checked_at,
                            health_check_timeout_seconds: timeout,
                            message: d.message.clone(),
                        })
                        .collect(),
                }
            }
        }

        #[tonic::async_trait]
        impl dra_proto::$wire::dra_resource_health_server::DraResourceHealth for HealthService {
            type NodeWatchResourcesStream = Messages<dra_proto::$wire::NodeWatchResourcesResponse>;

            async fn node_watch_resources(
                &self,
                _request: Request<dra_proto::$wire::NodeWatchResourcesRequest>,
            ) -> Result<Response<Self::NodeWatchResourcesStream>, Status> {
                Ok(Response::new(self.open($version)))
            }
        }
    };
}

health_wire!(health_v1, "v1");
health_wire!(health_v1alpha1, "v1alpha1");

#[cfg(test)]
mod tests {
    use std::time::{Duration, SystemTime};

    use dra_proto::{health_v1, health_v1alpha1, prost::Message};
    use tokio::sync::watch;
    use tokio_stream::StreamExt;

    use super::*;
    use crate::health::DeviceHealth;

    fn report() -> HealthReport {
        let device = |name: &str, health, message: &str| DeviceHealth {
            pool: "node-a".into(),
            device: name.into(),
            health,
            message: message.into(),
        };
        HealthReport {
            devices: vec![
                device("cpu1", Health::Healthy, ""),
                device("cpu3", Health::Unhealthy, "cpu 3 is offline"),
                device("cpu5", Health::Unknown, "the online CPUs cannot be read"),
            ],
            checked_at: SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000),
            valid_for: Duration::from_secs(45),
        }
    }

    #[test]
    fn a_report_goes_on_the_wire_with_its_time_timeout_and_message() {
        let mut r = report();
        let wire = health_v1::NodeWatchResourcesResponse::from_report(&r);
        let got: Vec<_> = wire
            .devices
            .iter()
            .map(|d| {
                let id = d.device.as_ref().unwrap();
                assert_eq!(id.pool_name, "node-a");
                assert_eq!(d.last_updated_time, 1_700_000_000);
                assert_eq!(d.health_check_timeout_seconds, 45);
                (id.device_name.as_str(), d.health(), d.message.as_str())
            })
            .collect();
        assert_eq!(
            got,
            [
                ("cpu1", health_v1::HealthStatus::Healthy, ""),
                (
                    "cpu3",
                    health_v1::HealthStatus::Unhealthy,
                    "cpu 3 is offline"
                ),
                (
                    "cpu5",
                    health_v1::HealthStatus::Unknown,
                    "the online CPUs cannot be read"
                ),
            ]
        );
        r.valid_for = Duration::from_millis(10);
        assert_eq!(
            health_v1::NodeWatchResourcesResponse::from_report(&r).devices[0]
                .health_check_timeout_seconds,
            1,
            "never zero: zero means the kubelet's default"
        );
    }

    /// The versions differ in their package only: the same report is the same bytes in both,
    /// so a kubelet of either release reads what the other would.
    #[test]
    fn every_version_carries_the_same_report_in_the_same_bytes() {
        let r = report();
        let v1 = health_v1::NodeWatchResourcesResponse::from_report(&r).encode_to_vec();
        let v1alpha1 = health_v1alpha1::NodeWatchResourcesResponse::from_report(&r).encode_to_vec();
        assert!(!v1.is_empty());
        assert_eq!(v1, v1alpha1);
    }

    /// Both services open streams of the one source: a change reaches a stream of each.
    #[tokio::test]
    async fn both_services_stream_the_same_source() {
        use health_v1::dra_resource_health_server::DraResourceHealth as V1;
        use health_v1alpha1::dra_resource_health_server::DraResourceHealth as V1alpha1;

        let (reports, rx) = watch::channel(HealthReport::none());
        let (_stop, stopping) = watch::channel(false);
        let service = HealthService::new(rx, stopping);
        let mut v1 = V1::node_watch_resources(
            &service,
            Request::new(health_v1::NodeWatchResourcesRequest {}),
        )
        .await
        .unwrap()
        .into_inner();
        let mut v1alpha1 = V1alpha1::node_watch_resources(
            &service,
            Request::new(health_v1alpha1::NodeWatchResourcesRequest {}),
        )
        .await
        .unwrap()
        .into_inner();
        assert!(v1.next().await.unwrap().unwrap().devices.is_empty());
        assert!(v1alpha1.next().await.unwrap().unwrap().devices.is_empty());
        reports.send_replace(report());
        let from_v1 = v1.next().await.unwrap().unwrap();
        let from_v1alpha1 = v1alpha1.next().await.unwrap().unwrap();
        assert_eq!(from_v1.devices.len(), 3);
        assert_eq!(from_v1.encode_to_vec(), from_v1alpha1.encode_to_vec());
    }
}
