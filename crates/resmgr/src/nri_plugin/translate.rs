//! NRI wire types to domain types and back: the only place the resource manager reads an NRI
//! message field by field.
//!
//! The runtime does not tell us a container's Kubernetes requests; it tells us the cgroup values
//! the kubelet derived from them. We invert the kubelet's arithmetic: CPU shares are
//! `milli-CPU * 1024 / 1000` (at least 2), a CPU limit is a CFS quota over a period, the QoS class
//! is in the pod's cgroup parent (`kubepods-burstable-…`, `/kubepods/besteffort/…`). Memory
//! requests are not visible at all; a Guaranteed container's request equals its limit, others
//! count as zero.

use std::collections::BTreeMap;

use nri::api;
use policy::{Adjustment, Container, ContainerUpdate, CpuSet, NodeSet, Pod, QosClass, Resources};
use tracing::warn;

/// The domain container for an NRI container of `pod`.
pub fn container(pod: &api::PodSandbox, c: &api::Container) -> Container {
    let resources = c.linux.as_ref().and_then(|l| l.resources.as_ref());
    let cpu = resources.and_then(|r| r.cpu.as_ref());
    let qos = qos_class(pod, resources);
    let mut res = resources_of(resources);
    if qos == QosClass::Guaranteed {
        res.memory_request_bytes = res.memory_limit_bytes.unwrap_or(0);
    }
    Container {
        id: c.id.clone(),
        pod: Pod {
            uid: pod.uid.clone(),
            namespace: pod.namespace.clone(),
            name: pod.name.clone(),
            qos,
            annotations: sorted(&pod.annotations),
        },
        name: c.name.clone(),
        resources: res,
        annotations: sorted(&c.annotations),
        cdi_devices: c.cdi_devices.iter().map(|d| d.name.clone()).collect(),
        env: c.env.clone(),
        cpus: cpu.and_then(|cpu| parse_set(&c.id, "cpus", &cpu.cpus)),
        mems: cpu.and_then(|cpu| parse_set(&c.id, "mems", &cpu.mems)),
    }
}

/// Requests and limits from the cgroup values the kubelet set.
pub fn resources_of(resources: Option<&api::LinuxResources>) -> Resources {
    let cpu = resources.and_then(|r| r.cpu.as_ref());
    let shares = cpu.and_then(|c| c.shares.as_ref()).map_or(0, |s| s.value);
    let quota = cpu.and_then(|c| c.quota.as_ref()).map_or(-1, |q| q.value);
    let period = cpu.and_then(|c| c.period.as_ref()).map_or(0, |p| p.value);
    let memory_limit = resources
        .and_then(|r| r.memory.as_ref())
        .and_then(|m| m.limit.as_ref())
        .map_or(0, |l| l.value);
    Resources {
        // Shares of 2 or less are the kubelet's floor for "no request".
        cpu_request_milli: if shares <= 2 {
            0
        } else {
            (shares * 1000 + 512) / 1024
        },
        cpu_limit_milli: u64::try_from(quota)
            .ok()
            .filter(|q| *q > 0 && period > 0)
            .map(|q| (q * 1000).div_ceil(period)),
        memory_request_bytes: 0,
        memory_limit_bytes: u64::try_from(memory_limit).ok().filter(|l| *l > 0),
    }
}

/// The pod's QoS class, from its cgroup parent, or failing that from the container's values.
fn qos_class(pod: &api::PodSandbox, resources: Option<&api::LinuxResources>) -> QosClass {
    let parent = pod
        .linux
        .as_ref()
        .map_or("", |l| l.cgroup_parent.as_str())
        .to_ascii_lowercase();
    if parent.contains("besteffort") {
        QosClass::BestEffort
    } else if parent.contains("burstable") {
        QosClass::Burstable
    } else if parent.contains("kubepods") {
        QosClass::Guaranteed
    } else {
        let r = resources_of(resources);
        match (r.cpu_request_milli, r.cpu_limit_milli, r.memory_limit_bytes) {
            (0, None, None) => QosClass::BestEffort,
            (req, Some(lim), Some(_)) if req == lim => QosClass::Guaranteed,
            _ => QosClass::Burstable,
        }
    }
}

fn sorted(map: &std::collections::HashMap<String, String>) -> BTreeMap<String, String> {
    map.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
}

fn parse_set(container: &str, field: &str, text: &str) -> Option<CpuSet> {
    if text.is_empty() {
        return None;
    }
    match text.parse() {
        Ok(set) => Some(set),
        Err(e) => {
            warn!(container, field, error = %e, "ignoring the runtime's unparsable cpuset");
            None
        }
    }
}

fn cpu(cpus: Option<&CpuSet>, mems: Option<&NodeSet>) -> api::LinuxResources {
    api::LinuxResources {
        cpu: Some(api::LinuxCpu {
            cpus: cpus.map(ToString::to_string).unwrap_or_default(),
            mems: mems.map(ToString::to_string).unwrap_or_default(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// A hugepage size as the runtime and the kernel's hugetlb controller name it (`2MB`, `1GB`,
/// `64KB`: `hugetlb.2MB.max`), which is how the kubelet writes it in CRI.
pub fn hugepage_size_name(bytes: u64) -> String {
    for (shift, unit) in [(30, "GB"), (20, "MB"), (10, "KB")] {
        if bytes >= 1 << shift && bytes.is_multiple_of(1 << shift) {
            return format!("{}{unit}", bytes >> shift);
        }
    }
    format!("{bytes}B")
}

/// The NRI adjustment for a container being created; `None` when there is nothing to set.
/// Besides the cpuset and memory nodes, a container using claims that granted memory or
/// hugepages gets its memory limit and hugepage limits (the runtime writes them into the OCI
/// spec it creates the container with, replacing the kubelet's values for those fields).
pub fn adjustment(a: &Adjustment) -> Option<api::ContainerAdjustment> {
    if a.cpus.is_none()
        && a.mems.is_none()
        && a.memory_limit_bytes.is_none()
        && a.hugepage_limits.is_empty()
    {
        return None;
    }
    let mut resources = cpu(a.cpus.as_ref(), a.mems.as_ref());
    if let Some(limit) = a.memory_limit_bytes {
        resources.memory = Some(api::LinuxMemory {
            limit: Some(api::OptionalInt64 {
                value: i64::try_from(limit).unwrap_or(i64::MAX),
            }),
            ..Default::default()
        });
    }
    resources.hugepage_limits = a
        .hugepage_limits
        .iter()
        .map(|(size, limit)| api::HugepageLimit {
            page_size: hugepage_size_name(*size),
            limit: *limit,
        })
        .collect();
    Some(api::ContainerAdjustment {
        linux: Some(api::LinuxContainerAdjustment {
            resources: Some(resources),
            ..Default::default()
        }),
        ..Default::default()
    })
}

/// The NRI update for a running container.
pub fn update(u: &ContainerUpdate) -> api::ContainerUpdate {
    api::ContainerUpdate {
        container_id: u.container_id.clone(),
        linux: Some(api::LinuxContainerUpdate {
            resources: Some(cpu(u.cpus.as_ref(), u.mems.as_ref())),
        }),
        ignore_failure: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resources(shares: u64, quota: i64, period: u64, mem: i64) -> api::LinuxResources {
        api::LinuxResources {
            cpu: Some(api::LinuxCpu {
                shares: Some(api::OptionalUInt64 { value: shares }),
                quota: Some(api::OptionalInt64 { value: quota }),
                period: Some(api::OptionalUInt64 { value: period }),
                cpus: "0-3".into(),
                ..Default::default()
            }),
            memory: Some(api::LinuxMemory {
                limit: Some(api::OptionalInt64 { value: mem }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn pod(cgroup_parent: &str) -> api::PodSandbox {
        api::PodSandbox {
            uid: "pod-uid".into(),
            namespace: "ns".into(),
            name: "p".into(),
            linux: Some(api::LinuxPodSandbox {
                cgroup_parent: cgroup_parent.into(),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn ctr(r: api::LinuxResources) -> api::Container {
        api::Container {
            id: "c1".into(),
            name: "app".into(),
            linux: Some(api::LinuxContainer {
                resources: Some(r),
                ..Default::default()
            }),
            cdi_devices: vec![api::CdiDevice {
                name: "v.io/device=claim-u-0".into(),
            }],
            env: vec!["A=1".into()],
            ..Default::default()
        }
    }

    #[test]
    fn inverts_the_kubelets_cpu_arithmetic() {
        // 4 CPUs requested and limited: shares 4096, quota 400000 per 100000.
        let r = resources_of(Some(&resources(4096, 400_000, 100_000, 1 << 30)));
        assert_eq!(r.cpu_request_milli, 4000);
        assert_eq!(r.cpu_limit_milli, Some(4000));
        assert_eq!(r.memory_limit_bytes, Some(1 << 30));
        // 100m: shares 102.
        assert_eq!(
            resources_of(Some(&resources(102, -1, 100_000, 0))).cpu_request_milli,
            100
        );
        // BestEffort: shares 2, no quota, no memory limit.
        let be = resources_of(Some(&resources(2, -1, 100_000, 0)));
        assert_eq!(
            (
                be.cpu_request_milli,
                be.cpu_limit_milli,
                be.memory_limit_bytes
            ),
            (0, None, None)
        );
        assert_eq!(resources_of(None), Resources::default());
    }

    #[test]
    fn a_limit_needs_a_positive_quota_and_a_positive_period() {
        // The runtime's values are outside input: a zero period must not divide.
        let limit =
            |quota, period| resources_of(Some(&resources(1024, quota, period, 0))).cpu_limit_milli;
        assert_eq!(limit(400_000, 0), None);
        assert_eq!(limit(0, 100_000), None);
        assert_eq!(limit(-1, 100_000), None);
        assert_eq!(limit(1, 100_000), Some(1), "rounded up, never to zero");
        // No quota field at all is no limit.
        let mut r = resources(1024, 0, 100_000, 0);
        r.cpu.as_mut().unwrap().quota = None;
        assert_eq!(resources_of(Some(&r)).cpu_limit_milli, None);
    }

    #[test]
    fn without_a_cgroup_parent_the_qos_class_follows_the_values() {
        let class = |r: api::LinuxResources| container(&pod(""), &ctr(r)).pod.qos;
        assert_eq!(class(resources(2, -1, 100_000, 0)), QosClass::BestEffort);
        assert_eq!(
            class(api::LinuxResources::default()),
            QosClass::BestEffort,
            "nothing set at all"
        );
        assert_eq!(
            class(resources(1024, 200_000, 100_000, 1 << 30)),
            QosClass::Burstable,
            "request 1 CPU, limit 2"
        );
        assert_eq!(
            class(resources(2048, 200_000, 100_000, 0)),
            QosClass::Burstable,
            "no memory limit"
        );
        assert_eq!(
            class(resources(2048, 200_000, 100_000, 1 << 30)),
            QosClass::Guaranteed
        );
    }

    #[test]
    fn reads_the_qos_class_from_the_cgroup_parent() {
        let r = resources(4096, 400_000, 100_000, 1 << 30);
        let c = container(&pod("kubepods-burstable-podx.slice"), &ctr(r.clone()));
        assert_eq!(c.pod.qos, QosClass::Burstable);
        assert_eq!(c.resources.memory_request_bytes, 0);
        let c = container(&pod("/kubepods/besteffort/podx"), &ctr(r.clone()));
        assert_eq!(c.pod.qos, QosClass::BestEffort);
        let c = container(&pod("/kubepods/podx"), &ctr(r.clone()));
        assert_eq!(c.pod.qos, QosClass::Guaranteed);
        assert_eq!(
            c.resources.memory_request_bytes,
            1 << 30,
            "guaranteed: request = limit"
        );
        let c = container(&pod(""), &ctr(r));
        assert_eq!(
            c.pod.qos,
            QosClass::Guaranteed,
            "no cgroup parent: equal request and limit"
        );
    }

    #[test]
    fn carries_identity_devices_env_annotations_and_the_current_cpuset() {
        let mut p = pod("/kubepods/podx");
        p.annotations
            .insert("resource-policy.resmgr.io/cpu".into(), "shared".into());
        let mut nri_ctr = ctr(resources(1024, -1, 0, 0));
        nri_ctr.annotations.insert("k".into(), "v".into());
        let c = container(&p, &nri_ctr);
        assert_eq!(
            c.pod.annotations,
            BTreeMap::from([("resource-policy.resmgr.io/cpu".into(), "shared".into())])
        );
        assert_eq!(c.annotations, BTreeMap::from([("k".into(), "v".into())]));
        assert_eq!(
            (c.id.as_str(), c.name.as_str(), c.pod.uid.as_str()),
            ("c1", "app", "pod-uid")
        );
        assert_eq!(c.cdi_devices, ["v.io/device=claim-u-0"]);
        assert_eq!(c.env, ["A=1"]);
        assert_eq!(c.cpus.unwrap().to_string(), "0-3");
        assert_eq!(c.mems, None);
    }

    #[test]
    fn writes_cpusets_in_the_kernel_list_format() {
        let u = update(&ContainerUpdate {
            container_id: "c1".into(),
            cpus: Some("0,1,2,8".parse().unwrap()),
            mems: Some("1".parse().unwrap()),
        });
        let cpu = u.linux.unwrap().resources.unwrap().cpu.unwrap();
        assert_eq!((cpu.cpus.as_str(), cpu.mems.as_str()), ("0-2,8", "1"));
        assert_eq!(adjustment(&Adjustment::default()), None);
        let a = adjustment(&Adjustment {
            cpus: Some("4-5".parse().unwrap()),
            ..Adjustment::default()
        })
        .unwrap();
        let resources = a.linux.unwrap().resources.unwrap();
        let cpu = resources.cpu.unwrap();
        assert_eq!((cpu.cpus.as_str(), cpu.mems.as_str()), ("4-5", ""));
        assert_eq!(resources.memory, None, "the kubelet's limit stays");
        assert!(resources.hugepage_limits.is_empty());
    }

    #[test]
    fn a_claims_memory_and_hugepages_become_the_containers_limits() {
        let a = adjustment(&Adjustment {
            cpus: Some("8-11".parse().unwrap()),
            mems: Some("1".parse().unwrap()),
            memory_limit_bytes: Some(16 << 30),
            hugepage_limits: BTreeMap::from([(2 << 20, 64 << 20), (1 << 30, 2 << 30)]),
        })
        .unwrap();
        let resources = a.linux.unwrap().resources.unwrap();
        assert_eq!(resources.memory.unwrap().limit.unwrap().value, 16 << 30);
        let limits: Vec<(String, u64)> = resources
            .hugepage_limits
            .into_iter()
            .map(|h| (h.page_size, h.limit))
            .collect();
        assert_eq!(
            limits,
            [("2MB".to_owned(), 64 << 20), ("1GB".to_owned(), 2 << 30)]
        );
        assert_eq!(hugepage_size_name(64 << 10), "64KB");
        assert_eq!(hugepage_size_name(16 << 30), "16GB");
    }
}
