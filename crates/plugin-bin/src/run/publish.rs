//! Our devices in the API server: the first publication, republication when the devices change,
//! and what the API server's view of our slices tells the operator.

use std::{collections::BTreeSet, sync::Arc};

use policy::topology_aware::DeviceMode;
use resmgr::{
    Published,
    kube_dra::{self, DevicePublisher as _, SlicePublisher},
};
use tokio::sync::watch;
use tracing::{error, info, warn};

use crate::metrics::Metrics;

/// Publishes the devices as the manager publishes them after every change, first as they are
/// now, then again whenever they change (a claim on a device of an earlier configuration gave
/// back CPUs the devices withheld). A failed publication is retried by
/// [`SlicePublisher::maintain`]. Returns when the manager is gone.
pub async fn publish(publisher: SlicePublisher, mut snapshots: watch::Receiver<Arc<Published>>) {
    let mut published = Vec::new();
    let first = (*snapshots.borrow_and_update().devices).clone();
    match first {
        Ok(devices) => {
            published.clone_from(&devices);
            match publisher.publish(devices).await {
                Ok(report) => info!(?report, "published our devices"),
                // The maintainer retries.
                Err(e) => {
                    warn!(error = %resmgr::errors::chain(&e), "publishing our devices failed; retrying")
                }
            }
        }
        Err(e) => warn!(error = %e, "the policy publishes no devices"),
    }
    while snapshots.changed().await.is_ok() {
        let devices = (*snapshots.borrow_and_update().devices).clone();
        republish_if_changed(devices, &publisher, &mut published).await;
    }
}

/// Publishes `devices` (the policy's, from the manager's snapshot) if they differ from
/// `published` (the last ones), which they do when a claim on a device of an earlier
/// configuration gave back CPUs the devices withheld. A failure leaves the maintainer retrying
/// the new devices. Returns what was published.
async fn republish_if_changed(
    devices: Result<Vec<policy::Device>, policy::PolicyError>,
    publisher: &impl kube_dra::DevicePublisher,
    published: &mut Vec<policy::Device>,
) -> Option<Vec<policy::Device>> {
    let devices = devices.ok()?;
    if devices == *published {
        return None;
    }
    published.clone_from(&devices);
    match publisher.publish(devices.clone()).await {
        Ok(report) => info!(
            ?report,
            "republished our devices: a claim gave back withheld cpus"
        ),
        Err(e) => {
            warn!(error = %resmgr::errors::chain(&e), "republishing our devices failed; retrying")
        }
    }
    Some(devices)
}

/// Exports the fields the API server drops from our slices as metrics, and says once, as an
/// error, when that makes the device model wrong for the cluster. Returns when the publisher is
/// gone.
pub async fn watch_dropped_fields(
    mut dropped: watch::Receiver<BTreeSet<String>>,
    mode: DeviceMode,
    metrics: Arc<Metrics>,
) {
    let mut told = false;
    loop {
        let fields = dropped.borrow_and_update().clone();
        for field in &fields {
            metrics.slice_field_dropped(field);
        }
        if !told && let Some(advice) = dropped_capacity_advice(mode, &fields) {
            error!(fields = ?fields, "{advice}");
            told = true;
        }
        if dropped.changed().await.is_err() {
            return;
        }
    }
}

/// What to tell the operator when the API server drops consumable capacity (the
/// `DRAConsumableCapacity` gate is off) and grouped devices depend on it.
fn dropped_capacity_advice(mode: DeviceMode, fields: &BTreeSet<String>) -> Option<&'static str> {
    let capacity = fields.iter().any(|f| {
        f == "devices[].allowMultipleAllocations"
            || (f.starts_with("devices[].capacity.") && f.ends_with(".requestPolicy"))
    });
    (capacity && mode == DeviceMode::Grouped).then_some(
        "the api server drops consumable capacity from our resource slices (DRAConsumableCapacity is off in this cluster): the scheduler hands each grouped device to one claim, which gets all of its cpus; set device-mode: individual for this cluster (or turn the gate on)",
    )
}

#[cfg(test)]
mod tests {
    use policy::{
        Topology,
        topology_aware::{Config, DeviceModel},
    };

    use super::*;
    use crate::policy_choice;

    #[tokio::test]
    async fn devices_withheld_for_a_claim_of_an_earlier_model_are_republished_when_it_goes() {
        let topology = || {
            Topology::load(&policy::TopologySource::Synthetic(
                "pack:1 core:4 pu:1".into(),
            ))
            .unwrap()
        };
        // A claim of the grouped model, restored under the individual one.
        let mut grouped = policy_choice::build(topology(), Config::default()).unwrap();
        grouped
            .allocate_claim(&policy::Claim {
                uid: "u1".into(),
                results: vec![policy::AllocationResult {
                    request: "cpus".into(),
                    device: "numa0".into(),
                    consumed_capacity: [("cpu".to_owned(), policy::Quantity::from_units(2))].into(),
                    ..policy::AllocationResult::default()
                }],
                ..policy::Claim::default()
            })
            .unwrap();
        let individual = Config {
            devices: DeviceModel {
                mode: DeviceMode::Individual,
                ..DeviceModel::default()
            },
            ..Config::default()
        };
        let mut policy = policy_choice::build(topology(), individual).unwrap();
        policy.restore(&grouped.snapshot()).unwrap();
        let mut published = policy.devices().unwrap();
        assert_eq!(published.len(), 1, "cpu3 only: u1 holds 1-2");
        let publisher =
            resmgr::kube_dra::fake::RecordingPublisher::new(crate::config::DEFAULT_DRIVER);
        assert_eq!(
            republish_if_changed(policy.devices(), &publisher, &mut published).await,
            None
        );
        policy.release_claim("u1").unwrap();
        let now = republish_if_changed(policy.devices(), &publisher, &mut published)
            .await
            .unwrap();
        assert_eq!(now.len(), 3);
        assert_eq!(publisher.current(), Some(now));
        assert_eq!(
            republish_if_changed(policy.devices(), &publisher, &mut published).await,
            None
        );
    }

    #[test]
    fn dropped_capacity_fields_call_for_individual_devices_only_when_grouped() {
        let fields = |list: &[&str]| list.iter().map(|f| (*f).to_owned()).collect();
        let dropped = fields(&["devices[].allowMultipleAllocations"]);
        let advice = dropped_capacity_advice(DeviceMode::Grouped, &dropped).unwrap();
        assert!(advice.contains("device-mode: individual"), "{advice}");
        let policy = fields(&["devices[].capacity.cpu.requestPolicy"]);
        assert!(dropped_capacity_advice(DeviceMode::Grouped, &policy).is_some());
        assert_eq!(
            dropped_capacity_advice(DeviceMode::Individual, &dropped),
            None
        );
        let other = fields(&["devices[].nodeAllocatableResourceMappings"]);
        assert_eq!(dropped_capacity_advice(DeviceMode::Grouped, &other), None);
    }
}
