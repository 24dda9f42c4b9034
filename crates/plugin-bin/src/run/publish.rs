//! Our devices in the API server: the first publication, republication when the devices change
//! or a device's health taints it ([`resmgr::taints`]), and what the API server's view of our
//! slices tells the operator.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
    time::SystemTime,
};

use kube_dra::{self, DevicePublisher as _, EventRecorder, Notice, SlicePublisher};
use policy::{AttributeValue, topology_aware::DeviceMode};
use resmgr::{
    Published,
    health::DeviceFaults,
    taints::{self, Taints},
};
use tokio::sync::watch;
use tracing::{error, info, warn};

use crate::metrics::Metrics;

/// What taints our devices: the faults the health monitor finds, the taints they call for, and
/// where the claims prepared on a tainted device are reported.
pub struct Tainting {
    /// What is wrong with each published device.
    pub faults: watch::Receiver<DeviceFaults>,
    /// The taints, with when each was first seen.
    pub taints: Taints,
    /// Where claims on a tainted device are told (an Event on each and its pods).
    pub recorder: Arc<dyn EventRecorder>,
}

/// Publishes the devices as the manager publishes them after every change, tainted as their
/// faults say, first as they are now, then again whenever they change (a claim on a device of
/// an earlier configuration gave back CPUs the devices withheld) or their faults do (CPUs went
/// offline or came back). A failed publication is retried by [`SlicePublisher::maintain`].
/// Returns when the manager is gone.
pub async fn publish(
    publisher: SlicePublisher,
    mut snapshots: watch::Receiver<Arc<Published>>,
    mut tainting: Tainting,
) {
    let mut published = Vec::new();
    let mut told = BTreeMap::new();
    let first = tainted(&snapshots.borrow_and_update(), &mut tainting, &mut told);
    match first {
        Ok(devices) => {
            published.clone_from(&devices);
            match publisher.publish(devices).await {
                Ok(report) => info!(?report, "published our devices"),
                // The maintainer retries.
                Err(e) => {
                    warn!(error = %stdx::errors::chain(&e), "publishing our devices failed; retrying")
                }
            }
        }
        Err(e) => warn!(error = %e, "the policy publishes no devices"),
    }
    // Once the monitor is gone, the faults stay as last seen.
    let mut monitored = true;
    loop {
        tokio::select! {
            changed = snapshots.changed() => if changed.is_err() { return },
            changed = tainting.faults.changed(), if monitored => monitored = changed.is_ok(),
        }
        let devices = tainted(&snapshots.borrow_and_update(), &mut tainting, &mut told);
        republish_if_changed(devices, &publisher, &mut published).await;
    }
}

/// The policy's devices in `snapshot` with the taints their faults call for; tells of a device
/// newly tainted (and of each claim prepared on it) and of one whose taint went. `told` holds
/// what was told of each tainted device.
fn tainted(
    snapshot: &Published,
    tainting: &mut Tainting,
    told: &mut BTreeMap<String, String>,
) -> Result<Vec<policy::Device>, policy::PolicyError> {
    let faults = tainting.faults.borrow_and_update().clone();
    let devices = (*snapshot.devices).clone()?;
    let devices = tainting.taints.apply(devices, &faults, SystemTime::now());
    let now: BTreeMap<String, String> = devices
        .iter()
        .filter(|d| !d.taints.is_empty())
        .filter_map(|d| Some((d.name.clone(), faults.get(&d.name)?.describe())))
        .collect();
    let fresh: Vec<String> = now
        .iter()
        .filter(|(name, why)| told.get(*name) != Some(*why))
        .map(|(name, _)| name.clone())
        .collect();
    for name in &fresh {
        warn!(device = %name, reason = %now[name], "device tainted: the scheduler allocates it to no new claim; claims prepared on it keep it");
    }
    for (claim, on) in taints::claims_on(&fresh, &snapshot.claims) {
        let reasons: Vec<String> = on
            .iter()
            .map(|d| format!("device {d}: {}", now[*d]))
            .collect();
        let message = format!(
            "{}; the device is tainted, so no new claim is allocated on it, and this claim keeps its cpus",
            reasons.join("; ")
        );
        warn!(claim = %claim, "{message}");
        tainting
            .recorder
            .record(Notice::DeviceTainted { claim, message });
    }
    for name in told.keys().filter(|name| !now.contains_key(*name)) {
        info!(device = %name, "device healthy again: its taint is taken off");
    }
    *told = now;
    Ok(devices)
}

/// The NUMA node of each device `snapshot` publishes that says one
/// (`resource.kubernetes.io/numaNode`): whose memory its health depends on.
pub fn device_nodes(snapshot: &Published) -> BTreeMap<String, u32> {
    let Ok(devices) = &*snapshot.devices else {
        return BTreeMap::new();
    };
    devices
        .iter()
        .filter_map(|d| {
            match d
                .attributes
                .get(policy::topology_aware::devices::NUMA_NODE_ATTRIBUTE)?
            {
                AttributeValue::Int(node) => Some((d.name.clone(), u32::try_from(*node).ok()?)),
                _ => None,
            }
        })
        .collect()
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
            warn!(error = %stdx::errors::chain(&e), "republishing our devices failed; retrying")
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
        let publisher = kube_dra::fake::RecordingPublisher::new(crate::config::DEFAULT_DRIVER);
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
    fn a_faulty_device_is_published_tainted_and_its_claims_are_told_once() {
        let device = |name: &str, node: i64| policy::Device {
            name: name.into(),
            attributes: BTreeMap::from([(
                "resource.kubernetes.io/numaNode".to_owned(),
                AttributeValue::Int(node),
            )]),
            capacities: BTreeMap::new(),
            allow_multiple_allocations: true,
            taints: Vec::new(),
        };
        let record = resmgr::state::PreparedClaim {
            namespace: "ns".into(),
            name: "db".into(),
            devices: vec![resmgr::state::DeviceRecord {
                request_names: vec!["cpus".into()],
                pool: "node-a".into(),
                device: "numa1".into(),
                cdi_device_id: String::new(),
                share_id: None,
            }],
            adopted: false,
        };
        let snapshot = Published {
            devices: Arc::new(Ok(vec![device("numa0", 0), device("numa1", 1)])),
            device_cpus: Arc::default(),
            claims: Arc::new(BTreeMap::from([("u1".to_owned(), record)])),
        };
        assert_eq!(
            device_nodes(&snapshot),
            BTreeMap::from([("numa0".to_owned(), 0), ("numa1".to_owned(), 1)])
        );
        let (faults, rx) = watch::channel(DeviceFaults::new());
        let events = Arc::new(kube_dra::fake::RecordingEvents::new());
        let mut tainting = Tainting {
            faults: rx,
            taints: Taints::new("d.io"),
            recorder: events.clone(),
        };
        let mut told = BTreeMap::new();
        let clean = tainted(&snapshot, &mut tainting, &mut told).unwrap();
        assert!(clean.iter().all(|d| d.taints.is_empty()));
        faults.send_replace(DeviceFaults::from([(
            "numa1".to_owned(),
            resmgr::health::DeviceFault {
                offline_cpus: "5".parse().unwrap(),
                ..Default::default()
            },
        )]));
        let devices = tainted(&snapshot, &mut tainting, &mut told).unwrap();
        assert_eq!(devices[1].taints.len(), 1);
        assert_eq!(devices[1].taints[0].key, "d.io/cpus-offline");
        assert!(devices[0].taints.is_empty());
        let again = tainted(&snapshot, &mut tainting, &mut told).unwrap();
        assert_eq!(again, devices);
        let notices = events.notices();
        assert_eq!(notices.len(), 1, "told once: {notices:?}");
        assert!(
            matches!(&notices[0], Notice::DeviceTainted { claim, message }
                if claim.uid == "u1" && message.contains("device numa1: cpu 5 is offline")),
            "{notices:?}"
        );
        faults.send_replace(DeviceFaults::new());
        let healed = tainted(&snapshot, &mut tainting, &mut told).unwrap();
        assert!(healed.iter().all(|d| d.taints.is_empty()));
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
