//! Per-container placement options read from annotations in the `resource-policy.resmgr.io`
//! namespace.
//!
//! An option `<option>` is looked up, first match wins, as
//!
//! 1. `<option>.resource-policy.resmgr.io/container.<container name>` (one container),
//! 2. `<option>.resource-policy.resmgr.io/pod` (every container of the pod),
//! 3. `<option>.resource-policy.resmgr.io` (the same, short form),
//!
//! in the container's annotations, then in the pod's. Options:
//!
//! | option | values | default | effect |
//! |---|---|---|---|
//! | `prefer-shared-cpus` | `true`/`false` | `false` | a Guaranteed whole-CPU container runs on shared CPUs |
//! | `prefer-isolated-cpus` | `true`/`false` | `false` | its exclusive CPUs come from the kernel-isolated ones when the pool has enough |
//! | `reserved-cpus` | `true`/`false` | `true` in reserved namespaces | run on the reserved CPUs |
//! | `pin-memory` | `true`/`false` | `true` | `false`: leave `cpuset.mems` alone (and account no memory) |
//! | `memory-type` | list of `dram`, `hbm`, `pmem`, `cxl` | `dram` | which kinds of NUMA node the container's memory may use; memory-only nodes are used only when named here |
//!
//! A malformed value is an error naming the key and the value, not a silent default.

use std::collections::BTreeMap;

use crate::{api::PolicyError, model::Container, topology::MemoryKind};

/// The annotation namespace.
pub const DOMAIN: &str = "resource-policy.resmgr.io";

/// The options of one container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    /// `prefer-shared-cpus`.
    pub prefer_shared: bool,
    /// `prefer-isolated-cpus`.
    pub prefer_isolated: bool,
    /// `reserved-cpus`, with the namespace default already applied.
    pub reserved: bool,
    /// `pin-memory`.
    pub pin_memory: bool,
    /// `memory-type`, sorted, never empty.
    pub memory_kinds: Vec<MemoryKind>,
}

/// Reads the options of `container`; `reserved_namespaces` run on reserved CPUs by default.
pub fn options(
    container: &Container,
    reserved_namespaces: &[String],
) -> Result<Options, PolicyError> {
    let ours = |m: &BTreeMap<String, String>| m.keys().any(|k| k.contains(DOMAIN));
    if !ours(&container.annotations) && !ours(&container.pod.annotations) {
        // The common case, without formatting fifteen keys to look up.
        return Ok(defaults(container, reserved_namespaces));
    }
    let in_reserved_ns = reserved_namespaces.contains(&container.pod.namespace);
    Ok(Options {
        prefer_shared: flag(container, "prefer-shared-cpus")?.unwrap_or(false),
        prefer_isolated: flag(container, "prefer-isolated-cpus")?.unwrap_or(false),
        reserved: flag(container, "reserved-cpus")?.unwrap_or(in_reserved_ns),
        pin_memory: flag(container, "pin-memory")?.unwrap_or(true),
        memory_kinds: match lookup(container, "memory-type") {
            None => vec![MemoryKind::Dram],
            Some((key, value)) => memory_kinds(container, &key, value)?,
        },
    })
}

/// The options of a container whose annotations do not parse: every default. Used where a
/// container already runs and must be placed somehow (sync).
pub fn defaults(container: &Container, reserved_namespaces: &[String]) -> Options {
    Options {
        prefer_shared: false,
        prefer_isolated: false,
        reserved: reserved_namespaces.contains(&container.pod.namespace),
        pin_memory: true,
        memory_kinds: vec![MemoryKind::Dram],
    }
}

fn lookup<'c>(container: &'c Container, option: &str) -> Option<(String, &'c str)> {
    let keys = [
        format!("{option}.{DOMAIN}/container.{}", container.name),
        format!("{option}.{DOMAIN}/pod"),
        format!("{option}.{DOMAIN}"),
    ];
    let maps: [&BTreeMap<String, String>; 2] = [&container.annotations, &container.pod.annotations];
    keys.into_iter().find_map(|key| {
        maps.iter()
            .find_map(|m| m.get(&key))
            .map(|v| (key, v.as_str()))
    })
}

fn invalid(container: &Container, key: &str, value: &str, expected: &str) -> PolicyError {
    PolicyError::Invalid {
        subject: format!("container {}", describe(container)),
        reason: format!("annotation {key}={value:?}: expected {expected}"),
    }
}

fn flag(container: &Container, option: &str) -> Result<Option<bool>, PolicyError> {
    match lookup(container, option) {
        None => Ok(None),
        Some((key, value)) => match value.trim() {
            "true" => Ok(Some(true)),
            "false" => Ok(Some(false)),
            _ => Err(invalid(container, &key, value, "true or false")),
        },
    }
}

fn memory_kinds(
    container: &Container,
    key: &str,
    value: &str,
) -> Result<Vec<MemoryKind>, PolicyError> {
    let mut kinds = Vec::new();
    for word in value.split(',').map(str::trim) {
        let kind = match word {
            "dram" => MemoryKind::Dram,
            "hbm" => MemoryKind::Hbm,
            "pmem" => MemoryKind::Pmem,
            "cxl" => MemoryKind::Cxl,
            _ => {
                return Err(invalid(
                    container,
                    key,
                    value,
                    "a comma-separated list of dram, hbm, pmem, cxl",
                ));
            }
        };
        kinds.push(kind);
    }
    kinds.sort();
    kinds.dedup();
    Ok(kinds)
}

/// `namespace/pod/container` for messages.
pub fn describe(container: &Container) -> String {
    format!(
        "{}/{}/{}",
        container.pod.namespace, container.pod.name, container.name
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Pod, QosClass, Resources};

    fn container(pod_ann: &[(&str, &str)], ann: &[(&str, &str)]) -> Container {
        let map = |kv: &[(&str, &str)]| {
            kv.iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect()
        };
        Container {
            id: "c1".into(),
            pod: Pod {
                uid: "p1".into(),
                namespace: "default".into(),
                name: "web".into(),
                qos: QosClass::Guaranteed,
                annotations: map(pod_ann),
            },
            name: "app".into(),
            resources: Resources::default(),
            annotations: map(ann),
            cdi_devices: vec![],
            env: vec![],
            cpus: None,
            mems: None,
        }
    }

    #[test]
    fn container_scope_beats_pod_scope_beats_short_form() {
        let c = container(
            &[
                ("prefer-shared-cpus.resource-policy.resmgr.io", "false"),
                ("prefer-shared-cpus.resource-policy.resmgr.io/pod", "true"),
                (
                    "pin-memory.resource-policy.resmgr.io/container.other",
                    "false",
                ),
                ("memory-type.resource-policy.resmgr.io/pod", "hbm,dram"),
            ],
            &[(
                "prefer-isolated-cpus.resource-policy.resmgr.io/container.app",
                "true",
            )],
        );
        let o = options(&c, &[]).unwrap();
        assert!(o.prefer_shared);
        assert!(o.prefer_isolated);
        assert!(o.pin_memory, "scoped to another container");
        assert!(!o.reserved);
        assert_eq!(o.memory_kinds, [MemoryKind::Dram, MemoryKind::Hbm]);
    }

    #[test]
    fn reserved_namespaces_default_to_reserved_cpus_unless_annotated() {
        let mut c = container(&[], &[]);
        c.pod.namespace = "kube-system".into();
        assert!(options(&c, &["kube-system".into()]).unwrap().reserved);
        c.pod.annotations.insert(
            "reserved-cpus.resource-policy.resmgr.io/pod".into(),
            "false".into(),
        );
        assert!(!options(&c, &["kube-system".into()]).unwrap().reserved);
    }

    #[test]
    fn malformed_values_name_key_and_value() {
        let c = container(&[("pin-memory.resource-policy.resmgr.io", "yes")], &[]);
        let err = options(&c, &[]).unwrap_err().to_string();
        assert!(
            err.contains("default/web/app")
                && err.contains("pin-memory.resource-policy.resmgr.io=\"yes\""),
            "{err}"
        );
        let c = container(
            &[("memory-type.resource-policy.resmgr.io", "dram,sram")],
            &[],
        );
        assert!(options(&c, &[]).is_err());
    }
}
