//! Taints (KEP-5055) on the published devices that something is wrong with: CPUs behind them
//! went offline, or their NUMA node lost its memory ([`crate::health::DeviceFault`]).
//!
//! The device health stream tells the kubelet, which shows it in the status of pods already
//! using the device; the scheduler reads neither. A taint on the device in our ResourceSlice
//! tells the scheduler, which then allocates the device to no new claim (a claim would have to
//! tolerate it), and `kubectl describe resourceslice` tells the operator why:
//!
//! | key | value | when |
//! |---|---|---|
//! | `<driver>/cpus-offline` | the offline CPUs, list format with `_` for `,` (`3_5-7`; `<n>-cpus` past 63 characters) | a CPU behind the device is offline |
//! | `<driver>/memory-offline` | the node, `1` | the device's NUMA node had memory at start and has none online |
//!
//! The effect is `NoSchedule`: claims prepared on the device keep it. `NoExecute` would make
//! the scheduler's eviction controller delete their pods, and a CPU taken offline is most often
//! one of many behind a device (a grouped device is a NUMA node) and taken offline on purpose,
//! for maintenance or power: the pods keep running on the CPUs still online (the kernel takes
//! an offline CPU out of every cpuset), and a pod that must not run short can tell from its
//! device health. So those claims are reported (a log line and a `DeviceTainted` Event on each
//! claim and its pods), not revoked. The taint goes when the CPUs and the memory come back.
//!
//! A taint keeps the time it was first seen (`timeAdded`) while it stays, so that publishing
//! the same taint again is no change.

use std::{
    collections::BTreeMap,
    time::{SystemTime, UNIX_EPOCH},
};

use kubelet_plugin::ClaimRef;
use policy::{CpuSet, Device, DeviceTaint, TaintEffect};

use crate::{health::DeviceFaults, state::PreparedClaim};

/// The key's name part for offline CPUs.
pub const CPUS_OFFLINE: &str = "cpus-offline";
/// The key's name part for a NUMA node without memory.
pub const MEMORY_OFFLINE: &str = "memory-offline";
/// The longest label value.
const MAX_VALUE: usize = 63;

/// The taints a driver puts on its devices, and when each was first seen.
#[derive(Debug, Clone)]
pub struct Taints {
    driver: String,
    /// (device, key) → seconds since the epoch when first seen.
    since: BTreeMap<(String, String), i64>,
}

impl Taints {
    /// Taints under `driver`'s domain.
    pub fn new(driver: impl Into<String>) -> Self {
        Self {
            driver: driver.into(),
            since: BTreeMap::new(),
        }
    }

    /// `devices` with the taints `faults` call for, as of `now`; devices without a fault keep
    /// whatever taints they had (a policy's own).
    pub fn apply(
        &mut self,
        mut devices: Vec<Device>,
        faults: &DeviceFaults,
        now: SystemTime,
    ) -> Vec<Device> {
        let now = now
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
        let mut present = Vec::new();
        for device in &mut devices {
            let Some(fault) = faults.get(&device.name) else {
                continue;
            };
            let mut wanted = Vec::new();
            if !fault.offline_cpus.is_empty() {
                wanted.push((CPUS_OFFLINE, cpus_value(&fault.offline_cpus)));
            }
            if !fault.memoryless_nodes.is_empty() {
                wanted.push((
                    MEMORY_OFFLINE,
                    fault.memoryless_nodes.to_string().replace(',', "_"),
                ));
            }
            for (name, value) in wanted {
                let key = format!("{}/{name}", self.driver);
                let since = *self
                    .since
                    .entry((device.name.clone(), key.clone()))
                    .or_insert(now);
                present.push((device.name.clone(), key.clone()));
                device.taints.push(DeviceTaint {
                    key,
                    value,
                    effect: TaintEffect::NoSchedule,
                    time_added: Some(since),
                });
            }
        }
        self.since.retain(|k, _| present.contains(k));
        devices
    }
}

/// Offline CPUs as a label value: the list format, `_` for `,`; their count past 63 characters.
pub fn cpus_value(cpus: &CpuSet) -> String {
    let value = cpus.to_string().replace(',', "_");
    if value.len() <= MAX_VALUE {
        value
    } else {
        format!("{}-cpus", cpus.len())
    }
}

/// The prepared claims with a result on one of `devices`, with those devices: what a taint on
/// them is reported to.
pub fn claims_on<'a>(
    devices: &[String],
    claims: &'a BTreeMap<String, PreparedClaim>,
) -> Vec<(ClaimRef, Vec<&'a str>)> {
    claims
        .iter()
        .filter_map(|(uid, claim)| {
            let mut on: Vec<&str> = claim
                .devices
                .iter()
                .map(|d| d.device.as_str())
                .filter(|d| devices.iter().any(|t| t == d))
                .collect();
            on.dedup();
            (!on.is_empty()).then(|| {
                (
                    ClaimRef::new(claim.namespace.clone(), claim.name.clone(), uid),
                    on,
                )
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::{health::DeviceFault, state::DeviceRecord};

    fn device(name: &str) -> Device {
        Device {
            name: name.into(),
            attributes: BTreeMap::new(),
            capacities: BTreeMap::new(),
            allow_multiple_allocations: true,
            taints: Vec::new(),
        }
    }

    fn at(seconds: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(seconds)
    }

    #[test]
    fn a_faulty_device_is_tainted_until_it_recovers_keeping_when_the_taint_came() {
        let mut taints = Taints::new("d.io");
        let devices = vec![device("numa0"), device("numa1")];
        let fault = DeviceFault {
            offline_cpus: "5,7-8".parse().unwrap(),
            memoryless_nodes: "1".parse().unwrap(),
        };
        let faults = DeviceFaults::from([("numa1".to_owned(), fault)]);
        let first = taints.apply(devices.clone(), &faults, at(100));
        assert!(first[0].taints.is_empty());
        assert_eq!(
            first[1].taints,
            [
                DeviceTaint {
                    key: "d.io/cpus-offline".into(),
                    value: "5_7-8".into(),
                    effect: TaintEffect::NoSchedule,
                    time_added: Some(100),
                },
                DeviceTaint {
                    key: "d.io/memory-offline".into(),
                    value: "1".into(),
                    effect: TaintEffect::NoSchedule,
                    time_added: Some(100),
                },
            ]
        );
        let later = taints.apply(devices.clone(), &faults, at(200));
        assert_eq!(later, first, "the same taint keeps its time");
        let recovered = taints.apply(devices.clone(), &DeviceFaults::new(), at(300));
        assert!(recovered.iter().all(|d| d.taints.is_empty()));
        let again = taints.apply(devices, &faults, at(400));
        assert_eq!(
            again[1].taints[0].time_added,
            Some(400),
            "a new taint, a new time"
        );
    }

    #[test]
    fn long_cpu_lists_become_a_count() {
        let scattered: CpuSet = (0..80).step_by(2).collect();
        assert_eq!(cpus_value(&scattered), "40-cpus");
        assert_eq!(cpus_value(&"3".parse().unwrap()), "3");
    }

    #[test]
    fn claims_on_tainted_devices_are_found() {
        let record = |device: &str| PreparedClaim {
            namespace: "ns".into(),
            name: format!("on-{device}"),
            devices: vec![DeviceRecord {
                request_names: vec!["cpus".into()],
                pool: "node-a".into(),
                device: device.into(),
                cdi_device_id: String::new(),
                share_id: None,
            }],
            adopted: false,
        };
        let claims = BTreeMap::from([
            ("u0".to_owned(), record("numa0")),
            ("u1".to_owned(), record("numa1")),
        ]);
        let found = claims_on(&["numa1".to_owned()], &claims);
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].0, ClaimRef::new("ns", "on-numa1", "u1"));
        assert_eq!(found[0].1, ["numa1"]);
    }
}
