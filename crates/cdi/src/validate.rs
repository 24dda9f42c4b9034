//! Validation of a whole spec and of container edits, with the reference's rules.
//!
//! A spec is valid when its `cdiVersion` is known and at least its minimum, its kind and device
//! names pass the name rules (with our length limits), its annotations are Kubernetes annotations,
//! it has at least one device, device names are unique, every device's edits are non-empty, and
//! every set of edits is valid:
//!
//! - `env` (and hook `env`) entries are `NAME=VALUE` with a non-empty name;
//! - device nodes have a `path`, a `type` among `b`, `c`, `u`, `p` (or none), non-negative major
//!   and minor numbers, and `permissions` that are empty, `none` or letters from `rwm`;
//! - mounts have both paths; hooks have a known `hookName` and a `path`;
//! - an RDT `closID` is a valid file name (or `/`); network devices have both names, each unique.
//!
//! Every error names the offending field by its path in the document (for example
//! `devices[1].containerEdits.env[0]`) and carries the offending value.

use std::collections::{BTreeMap, HashSet};

use crate::{
    names::{self, NameError},
    spec::{ContainerEdits, Spec},
    version::{self, Version, VersionError},
};

/// The largest total size of one annotation map (keys and values), as in Kubernetes.
pub const MAX_ANNOTATIONS_SIZE: usize = 256 * 1024;

/// The hook names OCI defines.
pub const HOOK_NAMES: [&str; 6] = [
    "prestart",
    "createRuntime",
    "createContainer",
    "startContainer",
    "poststart",
    "poststop",
];

/// A spec or edits that break a rule. Every variant names the field and, where there is one, the
/// value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ValidationError {
    /// `cdiVersion` is not a released version.
    #[error(transparent)]
    UnknownVersion(#[from] VersionError),
    /// `cdiVersion` is older than a field of the spec needs.
    #[error("cdiVersion {declared} is below {minimum}, which the spec needs for {feature}")]
    VersionTooLow {
        /// What the spec declares.
        declared: Version,
        /// What it needs.
        minimum: Version,
        /// Which feature needs it.
        feature: &'static str,
    },
    /// A name (kind, device name, annotation key) breaks the name rules.
    #[error("invalid {field}")]
    Name {
        /// Where the name is.
        field: String,
        /// What is wrong with it.
        #[source]
        source: NameError,
    },
    /// The spec defines no device.
    #[error("devices is empty: a spec must define at least one device")]
    NoDevices,
    /// Two devices of the spec share a name.
    #[error("{field}: device name {name:?} is already used by an earlier device")]
    DuplicateDevice {
        /// The second device.
        field: String,
        /// The shared name.
        name: String,
    },
    /// A device changes nothing.
    #[error("{field} is empty: a device must change something")]
    EmptyDeviceEdits {
        /// The device's edits.
        field: String,
    },
    /// An environment entry is not `NAME=VALUE`.
    #[error("{field} {value:?} is not of the form NAME=VALUE")]
    Env {
        /// The entry.
        field: String,
        /// Its value.
        value: String,
    },
    /// A required field is empty.
    #[error("{field} must not be empty")]
    Empty {
        /// The field.
        field: String,
    },
    /// A field has a value outside its allowed set.
    #[error("{field} {value:?} is invalid: expected {expected}")]
    Invalid {
        /// The field.
        field: String,
        /// Its value.
        value: String,
        /// What is allowed.
        expected: &'static str,
    },
    /// A device number is negative (the runtimes read -1 as a wildcard).
    #[error("{field} {value} is negative")]
    NegativeDeviceNumber {
        /// The field.
        field: String,
        /// Its value.
        value: i64,
    },
    /// Two network devices share a host or container interface name.
    #[error("{field} {value:?} is already used by an earlier network device")]
    DuplicateNetDevice {
        /// The field.
        field: String,
        /// The shared name.
        value: String,
    },
    /// An annotation map is too large.
    #[error("{field} take {size} bytes, more than the {max} allowed")]
    AnnotationsTooLarge {
        /// The annotation map.
        field: String,
        /// Keys and values, in bytes.
        size: usize,
        /// The limit.
        max: usize,
    },
}

/// Checks a whole spec as a runtime loading it would, plus our name length limits.
pub fn validate_spec(spec: &Spec) -> Result<(), ValidationError> {
    let declared = Version::parse(&spec.cdi_version)?;
    if let Some(req) = version::requirement(spec).filter(|req| declared < req.version) {
        return Err(ValidationError::VersionTooLow {
            declared,
            minimum: req.version,
            feature: req.feature,
        });
    }
    names::parse_kind(&spec.kind).map_err(|source| ValidationError::Name {
        field: "kind".into(),
        source,
    })?;
    validate_annotations(&spec.annotations, "annotations")?;
    validate_edits(&spec.container_edits, "containerEdits")?;

    if spec.devices.is_empty() {
        return Err(ValidationError::NoDevices);
    }
    let mut seen = HashSet::new();
    for (i, device) in spec.devices.iter().enumerate() {
        let field = format!("devices[{i}]");
        names::validate_device_name(&device.name).map_err(|source| ValidationError::Name {
            field: format!("{field}.name"),
            source,
        })?;
        if !seen.insert(device.name.as_str()) {
            return Err(ValidationError::DuplicateDevice {
                field: format!("{field}.name"),
                name: device.name.clone(),
            });
        }
        validate_annotations(&device.annotations, &format!("{field}.annotations"))?;
        let edits_field = format!("{field}.containerEdits");
        if device.container_edits.is_empty() {
            return Err(ValidationError::EmptyDeviceEdits { field: edits_field });
        }
        validate_edits(&device.container_edits, &edits_field)?;
    }
    Ok(())
}

/// Checks one set of edits; `field` is where they sit in the document, used in errors.
pub fn validate_edits(edits: &ContainerEdits, field: &str) -> Result<(), ValidationError> {
    validate_env(&edits.env, &format!("{field}.env"))?;

    for (i, node) in edits.device_nodes.iter().enumerate() {
        let at = format!("{field}.deviceNodes[{i}]");
        require(&node.path, || format!("{at}.path"))?;
        if !matches!(node.kind.as_str(), "" | "b" | "c" | "u" | "p") {
            return Err(ValidationError::Invalid {
                field: format!("{at}.type"),
                value: node.kind.clone(),
                expected: "one of b, c, u, p",
            });
        }
        for (name, number) in [("major", node.major), ("minor", node.minor)] {
            if let Some(value) = number.filter(|n| *n < 0) {
                return Err(ValidationError::NegativeDeviceNumber {
                    field: format!("{at}.{name}"),
                    value,
                });
            }
        }
        let p = node.permissions.as_str();
        if !(p == "none" || p.chars().all(|c| matches!(c, 'r' | 'w' | 'm'))) {
            return Err(ValidationError::Invalid {
                field: format!("{at}.permissions"),
                value: p.into(),
                expected: "none or letters from rwm",
            });
        }
    }

    for (i, mount) in edits.mounts.iter().enumerate() {
        let at = format!("{field}.mounts[{i}]");
        require(&mount.host_path, || format!("{at}.hostPath"))?;
        require(&mount.container_path, || format!("{at}.containerPath"))?;
    }

    for (i, hook) in edits.hooks.iter().enumerate() {
        let at = format!("{field}.hooks[{i}]");
        if !HOOK_NAMES.contains(&hook.hook_name.as_str()) {
            return Err(ValidationError::Invalid {
                field: format!("{at}.hookName"),
                value: hook.hook_name.clone(),
                expected: "prestart, createRuntime, createContainer, startContainer, poststart or poststop",
            });
        }
        require(&hook.path, || format!("{at}.path"))?;
        validate_env(&hook.env, &format!("{at}.env"))?;
    }

    if let Some(rdt) = &edits.intel_rdt {
        let c = rdt.clos_id.as_str();
        // A CLOS is a directory under /sys/fs/resctrl; "/" names the root group.
        let valid =
            c == "/" || !(c.len() >= 4096 || c == "." || c == ".." || c.contains(['/', '\n']));
        if !valid {
            return Err(ValidationError::Invalid {
                field: format!("{field}.intelRdt.closID"),
                value: c.into(),
                expected: "a file name or /",
            });
        }
    }

    let mut hosts = HashSet::new();
    let mut names = HashSet::new();
    for (i, net) in edits.net_devices.iter().enumerate() {
        let at = format!("{field}.netDevices[{i}]");
        require(&net.host_interface_name, || {
            format!("{at}.hostInterfaceName")
        })?;
        require(&net.name, || format!("{at}.name"))?;
        if !hosts.insert(net.host_interface_name.as_str()) {
            return Err(ValidationError::DuplicateNetDevice {
                field: format!("{at}.hostInterfaceName"),
                value: net.host_interface_name.clone(),
            });
        }
        if !names.insert(net.name.as_str()) {
            return Err(ValidationError::DuplicateNetDevice {
                field: format!("{at}.name"),
                value: net.name.clone(),
            });
        }
    }
    Ok(())
}

fn validate_env(env: &[String], field: &str) -> Result<(), ValidationError> {
    for (i, entry) in env.iter().enumerate() {
        // The reference requires an `=` after a non-empty name; the value may be empty.
        if entry.find('=').is_none_or(|at| at == 0) {
            return Err(ValidationError::Env {
                field: format!("{field}[{i}]"),
                value: entry.clone(),
            });
        }
    }
    Ok(())
}

fn validate_annotations(
    annotations: &BTreeMap<String, String>,
    field: &str,
) -> Result<(), ValidationError> {
    let mut size = 0;
    for (key, value) in annotations {
        names::validate_annotation_key(key).map_err(|source| ValidationError::Name {
            field: format!("{field}[{key:?}]"),
            source,
        })?;
        size += key.len() + value.len();
    }
    if size > MAX_ANNOTATIONS_SIZE {
        return Err(ValidationError::AnnotationsTooLarge {
            field: field.into(),
            size,
            max: MAX_ANNOTATIONS_SIZE,
        });
    }
    Ok(())
}

fn require(value: &str, field: impl FnOnce() -> String) -> Result<(), ValidationError> {
    if value.is_empty() {
        return Err(ValidationError::Empty { field: field() });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::{Device, DeviceNode, Hook, IntelRdt, Mount, NetDevice};

    fn env(entries: &[&str]) -> ContainerEdits {
        ContainerEdits::with_env(entries.iter().map(|e| e.to_string()))
    }

    fn spec(devices: Vec<Device>) -> Spec {
        Spec {
            cdi_version: "0.3.0".into(),
            kind: "example.com/device".into(),
            devices,
            ..Spec::default()
        }
    }

    fn device(name: &str, edits: ContainerEdits) -> Device {
        Device {
            name: name.into(),
            container_edits: edits,
            ..Device::default()
        }
    }

    fn valid() -> Spec {
        spec(vec![device("claim-1-0", env(&["A=1", "B="]))])
    }

    fn node(path: &str) -> DeviceNode {
        DeviceNode {
            path: path.into(),
            ..DeviceNode::default()
        }
    }

    fn edits_error(edits: ContainerEdits) -> ValidationError {
        validate_edits(&edits, "e").unwrap_err()
    }

    #[test]
    fn a_plain_spec_is_valid() {
        assert_eq!(validate_spec(&valid()), Ok(()));
    }

    #[test]
    fn versions_must_be_known_and_at_least_the_minimum() {
        let mut s = valid();
        s.cdi_version = "v0.3.0".into();
        assert_eq!(validate_spec(&s), Ok(()));
        s.cdi_version = "2.0.0".into();
        assert_eq!(
            validate_spec(&s),
            Err(ValidationError::UnknownVersion(VersionError {
                value: "2.0.0".into()
            }))
        );
        let mut digit = spec(vec![device("1abc", env(&["A=1"]))]);
        assert!(matches!(
            validate_spec(&digit),
            Err(ValidationError::VersionTooLow {
                declared: Version::V0_3_0,
                minimum: Version::V0_5_0,
                ..
            })
        ));
        digit.cdi_version = "0.5.0".into();
        assert_eq!(validate_spec(&digit), Ok(()));
        digit.cdi_version = "1.1.0".into();
        assert_eq!(
            validate_spec(&digit),
            Ok(()),
            "a newer version than needed is valid"
        );
    }

    #[test]
    fn names_are_checked_and_errors_name_the_field() {
        let mut s = valid();
        s.kind = format!("example.com/{}", "c".repeat(64));
        assert!(
            matches!(validate_spec(&s), Err(ValidationError::Name { field, .. }) if field == "kind")
        );
        let bad = spec(vec![
            device("a", env(&["A=1"])),
            device("-b", env(&["A=1"])),
        ]);
        assert!(
            matches!(validate_spec(&bad), Err(ValidationError::Name { field, .. }) if field == "devices[1].name")
        );
        let mut annotated = valid();
        annotated.cdi_version = "0.6.0".into();
        annotated.devices[0]
            .annotations
            .insert("bad key".into(), "v".into());
        assert!(matches!(
            validate_spec(&annotated),
            Err(ValidationError::Name { field, .. }) if field == r#"devices[0].annotations["bad key"]"#
        ));
    }

    #[test]
    fn devices_must_exist_be_unique_and_change_something() {
        assert_eq!(
            validate_spec(&spec(vec![])),
            Err(ValidationError::NoDevices)
        );
        let twice = spec(vec![device("a", env(&["A=1"])), device("a", env(&["B=1"]))]);
        assert_eq!(
            validate_spec(&twice),
            Err(ValidationError::DuplicateDevice {
                field: "devices[1].name".into(),
                name: "a".into()
            })
        );
        let empty = spec(vec![device("a", ContainerEdits::default())]);
        assert_eq!(
            validate_spec(&empty),
            Err(ValidationError::EmptyDeviceEdits {
                field: "devices[0].containerEdits".into()
            })
        );
    }

    #[test]
    fn annotations_are_limited_in_size() {
        let mut s = valid();
        s.cdi_version = "0.6.0".into();
        s.annotations
            .insert("k".into(), "v".repeat(MAX_ANNOTATIONS_SIZE));
        assert!(matches!(
            validate_spec(&s),
            Err(ValidationError::AnnotationsTooLarge { size, .. }) if size == MAX_ANNOTATIONS_SIZE + 1
        ));
    }

    #[test]
    fn env_entries_need_a_name_and_an_equals_sign() {
        for bad in ["", "=1", "NAME"] {
            assert_eq!(
                edits_error(env(&["A=1", bad])),
                ValidationError::Env {
                    field: "e.env[1]".into(),
                    value: bad.into()
                }
            );
        }
        let mut s = valid();
        s.container_edits = env(&["=x"]);
        assert!(matches!(
            validate_spec(&s),
            Err(ValidationError::Env { field, .. }) if field == "containerEdits.env[0]"
        ));
    }

    #[test]
    fn device_nodes_are_checked_field_by_field() {
        let with = |n: DeviceNode| ContainerEdits {
            device_nodes: vec![node("/dev/ok"), n],
            ..ContainerEdits::default()
        };
        assert_eq!(
            edits_error(with(node(""))),
            ValidationError::Empty {
                field: "e.deviceNodes[1].path".into()
            }
        );
        assert_eq!(
            edits_error(with(DeviceNode {
                kind: "x".into(),
                ..node("/dev/x")
            })),
            ValidationError::Invalid {
                field: "e.deviceNodes[1].type".into(),
                value: "x".into(),
                expected: "one of b, c, u, p"
            }
        );
        assert_eq!(
            edits_error(with(DeviceNode {
                minor: Some(-1),
                ..node("/dev/x")
            })),
            ValidationError::NegativeDeviceNumber {
                field: "e.deviceNodes[1].minor".into(),
                value: -1
            }
        );
        assert!(matches!(
            edits_error(with(DeviceNode { permissions: "rx".into(), ..node("/dev/x") })),
            ValidationError::Invalid { field, value, .. } if field == "e.deviceNodes[1].permissions" && value == "rx"
        ));
        for ok in ["", "none", "r", "rwm", "mw"] {
            for kind in ["", "b", "c", "u", "p"] {
                let n = DeviceNode {
                    permissions: ok.into(),
                    kind: kind.into(),
                    major: Some(0),
                    ..node("/dev/x")
                };
                assert_eq!(validate_edits(&with(n), "e"), Ok(()));
            }
        }
    }

    #[test]
    fn mounts_need_both_paths() {
        let mount = |host: &str, container: &str| ContainerEdits {
            mounts: vec![Mount {
                host_path: host.into(),
                container_path: container.into(),
                ..Mount::default()
            }],
            ..ContainerEdits::default()
        };
        assert_eq!(validate_edits(&mount("/a", "/b"), "e"), Ok(()));
        assert_eq!(
            edits_error(mount("", "/b")),
            ValidationError::Empty {
                field: "e.mounts[0].hostPath".into()
            }
        );
        assert_eq!(
            edits_error(mount("/a", "")),
            ValidationError::Empty {
                field: "e.mounts[0].containerPath".into()
            }
        );
    }

    #[test]
    fn hooks_need_a_known_name_a_path_and_a_valid_env() {
        let hook = |name: &str, path: &str, env: &[&str]| ContainerEdits {
            hooks: vec![Hook {
                hook_name: name.into(),
                path: path.into(),
                env: env.iter().map(|e| e.to_string()).collect(),
                ..Hook::default()
            }],
            ..ContainerEdits::default()
        };
        for name in HOOK_NAMES {
            assert_eq!(
                validate_edits(&hook(name, "/bin/true", &["A=1"]), "e"),
                Ok(())
            );
        }
        assert!(matches!(
            edits_error(hook("preStart", "/bin/true", &[])),
            ValidationError::Invalid { field, value, .. } if field == "e.hooks[0].hookName" && value == "preStart"
        ));
        assert_eq!(
            edits_error(hook("prestart", "", &[])),
            ValidationError::Empty {
                field: "e.hooks[0].path".into()
            }
        );
        assert_eq!(
            edits_error(hook("prestart", "/bin/true", &["X"])),
            ValidationError::Env {
                field: "e.hooks[0].env[0]".into(),
                value: "X".into()
            }
        );
    }

    #[test]
    fn rdt_clos_ids_must_be_file_names() {
        let rdt = |clos: &str| ContainerEdits {
            intel_rdt: Some(IntelRdt {
                clos_id: clos.into(),
                ..IntelRdt::default()
            }),
            ..ContainerEdits::default()
        };
        for ok in ["", "/", "gold", "a.b"] {
            assert_eq!(validate_edits(&rdt(ok), "e"), Ok(()), "{ok:?}");
        }
        for bad in [".", "..", "a/b", "a\nb", &"x".repeat(4096)] {
            assert!(
                matches!(edits_error(rdt(bad)), ValidationError::Invalid { field, .. } if field == "e.intelRdt.closID"),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn net_devices_need_unique_names_on_both_sides() {
        let net = |pairs: &[(&str, &str)]| ContainerEdits {
            net_devices: pairs
                .iter()
                .map(|(host, name)| NetDevice {
                    host_interface_name: host.to_string(),
                    name: name.to_string(),
                })
                .collect(),
            ..ContainerEdits::default()
        };
        assert_eq!(
            validate_edits(&net(&[("eth1", "a"), ("eth2", "b")]), "e"),
            Ok(())
        );
        assert_eq!(
            edits_error(net(&[("", "a")])),
            ValidationError::Empty {
                field: "e.netDevices[0].hostInterfaceName".into()
            }
        );
        assert_eq!(
            edits_error(net(&[("eth1", "")])),
            ValidationError::Empty {
                field: "e.netDevices[0].name".into()
            }
        );
        assert_eq!(
            edits_error(net(&[("eth1", "a"), ("eth1", "b")])),
            ValidationError::DuplicateNetDevice {
                field: "e.netDevices[1].hostInterfaceName".into(),
                value: "eth1".into()
            }
        );
        assert_eq!(
            edits_error(net(&[("eth1", "a"), ("eth2", "a")])),
            ValidationError::DuplicateNetDevice {
                field: "e.netDevices[1].name".into(),
                value: "a".into()
            }
        );
    }
}
