//! The CDI spec document as serde types, mirroring the reference `specs-go` model.
//!
//! Field names are the JSON names of the CDI specification (camelCase); empty values are omitted on
//! writing, as the reference writer does; unknown fields are rejected on reading, as the runtimes
//! reject them. A missing field reads as its empty value, as in the reference, so that the
//! `validate` module (not the parser) reports it, naming the field. These types carry no validation
//! of their own.
//!
//! Reading accepts YAML and JSON through one YAML parser, as the runtimes do (JSON is YAML);
//! writing produces JSON, the format the store uses.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// A whole CDI spec file.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase", deny_unknown_fields)]
pub struct Spec {
    /// The CDI version the spec is written for.
    pub cdi_version: String,
    /// `vendor/class`.
    pub kind: String,
    /// Spec-level annotations (CDI 0.6.0).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    /// The devices the spec defines; at least one.
    pub devices: Vec<Device>,
    /// Edits applied once when any device of the spec is injected.
    #[serde(skip_serializing_if = "ContainerEdits::is_empty")]
    pub container_edits: ContainerEdits,
}

/// A spec document that could not be parsed.
#[derive(Debug, thiserror::Error)]
pub enum ParseError {
    /// Not a YAML (or JSON) CDI spec: bad syntax, a wrong type or an unknown field.
    #[error("parsing a cdi spec as yaml")]
    Yaml(#[source] serde_yaml_ng::Error),
    /// Not a JSON CDI spec.
    #[error("parsing a cdi spec as json")]
    Json(#[source] serde_json::Error),
}

impl Spec {
    /// Parses a spec as the runtimes do: as YAML, which also reads JSON.
    pub fn from_yaml(data: &[u8]) -> Result<Self, ParseError> {
        serde_yaml_ng::from_slice(data).map_err(ParseError::Yaml)
    }

    /// Parses a spec that must be JSON.
    pub fn from_json(data: &[u8]) -> Result<Self, ParseError> {
        serde_json::from_slice(data).map_err(ParseError::Json)
    }

    /// The spec as compact JSON, the form the store writes.
    pub fn to_json(&self) -> Vec<u8> {
        // Serializing cannot fail: every map has string keys and every value is a plain string,
        // number, bool, list or struct.
        serde_json::to_vec(self).expect("a cdi spec always serializes to json")
    }
}

/// One device of a spec.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase", deny_unknown_fields)]
pub struct Device {
    /// The device name, unique within the spec.
    pub name: String,
    /// Device annotations (CDI 0.6.0).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    /// What injecting the device does to a container; must not be empty.
    pub container_edits: ContainerEdits,
}

/// Changes CDI makes to a container when a device is injected.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase", deny_unknown_fields)]
pub struct ContainerEdits {
    /// Environment entries, `NAME=VALUE`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    /// Device nodes to create.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub device_nodes: Vec<DeviceNode>,
    /// Network devices to move into the container (CDI 1.1.0).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub net_devices: Vec<NetDevice>,
    /// OCI hooks to add.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub hooks: Vec<Hook>,
    /// Mounts to add.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub mounts: Vec<Mount>,
    /// Intel RDT settings (CDI 0.7.0).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub intel_rdt: Option<IntelRdt>,
    /// Supplementary group IDs (CDI 0.7.0); 0 is ignored by the runtimes.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub additional_gids: Vec<u32>,
}

impl ContainerEdits {
    /// Edits that only set environment entries.
    pub fn with_env(env: impl IntoIterator<Item = String>) -> Self {
        Self {
            env: env.into_iter().collect(),
            ..Self::default()
        }
    }

    /// Whether the edits change nothing.
    pub fn is_empty(&self) -> bool {
        self == &Self::default()
    }
}

/// A device node to create in the container.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase", deny_unknown_fields)]
pub struct DeviceNode {
    /// Path in the container.
    pub path: String,
    /// Path on the host (CDI 0.5.0).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub host_path: String,
    /// `b`, `c`, `u` or `p`.
    #[serde(rename = "type", skip_serializing_if = "String::is_empty")]
    pub kind: String,
    /// Major number.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub major: Option<i64>,
    /// Minor number.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub minor: Option<i64>,
    /// File mode of the node.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub file_mode: Option<u32>,
    /// Cgroup permissions, letters from `rwm`.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub permissions: String,
    /// Owner.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uid: Option<u32>,
    /// Group.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gid: Option<u32>,
}

/// A mount to add to the container.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase", deny_unknown_fields)]
pub struct Mount {
    /// Source on the host.
    pub host_path: String,
    /// Destination in the container.
    pub container_path: String,
    /// Filesystem type (CDI 0.4.0).
    #[serde(rename = "type", skip_serializing_if = "String::is_empty")]
    pub kind: String,
    /// Mount options.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<String>,
}

/// An OCI hook to add.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase", deny_unknown_fields)]
pub struct Hook {
    /// When the hook runs: prestart, createRuntime, createContainer, startContainer, poststart or
    /// poststop.
    pub hook_name: String,
    /// Executable path.
    pub path: String,
    /// Arguments, including argv\[0\].
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// Environment of the hook.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    /// Timeout in seconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeout: Option<i64>,
}

/// Intel RDT settings.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase", deny_unknown_fields)]
pub struct IntelRdt {
    /// The class of service.
    #[serde(rename = "closID", skip_serializing_if = "String::is_empty")]
    pub clos_id: String,
    /// L3 cache allocation schema.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub l3_cache_schema: String,
    /// Memory bandwidth schema.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub mem_bw_schema: String,
    /// Full schemata lines (CDI 1.1.0). An `Option` because the reference requires 1.1.0 for a
    /// present list even when it is empty (`schemata: []`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub schemata: Option<Vec<String>>,
    /// Enable monitoring (CDI 1.1.0).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub enable_monitoring: bool,
}

/// A network device to move into the container.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase", deny_unknown_fields)]
pub struct NetDevice {
    /// Interface name on the host.
    pub host_interface_name: String,
    /// Interface name in the container.
    pub name: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Spec {
        Spec {
            cdi_version: "1.1.0".into(),
            kind: "example.com/device".into(),
            annotations: BTreeMap::from([("a".into(), "b".into())]),
            devices: vec![Device {
                name: "dev0".into(),
                annotations: BTreeMap::new(),
                container_edits: ContainerEdits {
                    env: vec!["A=1".into()],
                    device_nodes: vec![DeviceNode {
                        path: "/dev/x".into(),
                        host_path: "/dev/null".into(),
                        kind: "c".into(),
                        major: Some(1),
                        minor: Some(3),
                        file_mode: Some(0o666),
                        permissions: "rw".into(),
                        uid: Some(0),
                        gid: Some(5),
                    }],
                    net_devices: vec![NetDevice {
                        host_interface_name: "eth1".into(),
                        name: "net0".into(),
                    }],
                    hooks: vec![Hook {
                        hook_name: "prestart".into(),
                        path: "/bin/true".into(),
                        args: vec!["true".into()],
                        env: vec!["H=1".into()],
                        timeout: Some(5),
                    }],
                    mounts: vec![Mount {
                        host_path: "/tmp".into(),
                        container_path: "/mnt".into(),
                        kind: "bind".into(),
                        options: vec!["ro".into()],
                    }],
                    intel_rdt: Some(IntelRdt {
                        clos_id: "gold".into(),
                        l3_cache_schema: "L3:0=f".into(),
                        mem_bw_schema: "MB:0=50".into(),
                        schemata: Some(vec!["L2:0=3".into()]),
                        enable_monitoring: true,
                    }),
                    additional_gids: vec![7],
                },
            }],
            container_edits: ContainerEdits::with_env(["S=1".to_string()]),
        }
    }

    #[test]
    fn json_round_trips_every_field() {
        let spec = sample();
        assert_eq!(Spec::from_json(&spec.to_json()).unwrap(), spec);
        assert_eq!(Spec::from_yaml(&spec.to_json()).unwrap(), spec);
    }

    #[test]
    fn json_uses_the_reference_field_names() {
        let json: serde_json::Value = serde_json::from_slice(&sample().to_json()).unwrap();
        let edits = &json["devices"][0]["containerEdits"];
        for key in [
            "env",
            "deviceNodes",
            "netDevices",
            "hooks",
            "mounts",
            "intelRdt",
            "additionalGids",
        ] {
            assert!(edits.get(key).is_some(), "missing {key} in {edits}");
        }
        assert_eq!(edits["deviceNodes"][0]["type"], "c");
        assert_eq!(edits["deviceNodes"][0]["hostPath"], "/dev/null");
        assert_eq!(edits["deviceNodes"][0]["fileMode"], 0o666);
        assert_eq!(edits["mounts"][0]["type"], "bind");
        assert_eq!(edits["hooks"][0]["hookName"], "prestart");
        assert_eq!(edits["intelRdt"]["closID"], "gold");
        assert_eq!(edits["intelRdt"]["enableMonitoring"], true);
        assert_eq!(edits["netDevices"][0]["hostInterfaceName"], "eth1");
        assert_eq!(json["cdiVersion"], "1.1.0");
    }

    #[test]
    fn empty_values_are_omitted() {
        let spec = Spec {
            cdi_version: "0.3.0".into(),
            kind: "example.com/device".into(),
            devices: vec![Device {
                name: "d".into(),
                container_edits: ContainerEdits::with_env(["A=1".to_string()]),
                ..Device::default()
            }],
            ..Spec::default()
        };
        assert_eq!(
            String::from_utf8(spec.to_json()).unwrap(),
            r#"{"cdiVersion":"0.3.0","kind":"example.com/device","devices":[{"name":"d","containerEdits":{"env":["A=1"]}}]}"#
        );
    }

    #[test]
    fn yaml_reads_like_the_runtimes() {
        let yaml = b"---\ncdiVersion: 0.5.0\nkind: example.com/device\ndevices:\n- name: d\n  containerEdits:\n    env: [A=1]\n    deviceNodes:\n    - path: /dev/x\n      hostPath: /dev/null\n";
        let spec = Spec::from_yaml(yaml).unwrap();
        assert_eq!(spec.cdi_version, "0.5.0");
        assert_eq!(spec.devices[0].container_edits.env, ["A=1"]);
        assert_eq!(
            spec.devices[0].container_edits.device_nodes[0].host_path,
            "/dev/null"
        );
    }

    #[test]
    fn unknown_fields_are_rejected_at_every_level() {
        let cases: [&[u8]; 4] = [
            br#"{"cdiVersion":"0.3.0","kind":"a/b","devices":[],"extra":1}"#,
            br#"{"cdiVersion":"0.3.0","kind":"a/b","devices":[{"name":"d","extra":1}]}"#,
            br#"{"cdiVersion":"0.3.0","kind":"a/b","devices":[{"name":"d","containerEdits":{"cpuset":"0"}}]}"#,
            br#"{"cdiVersion":"0.3.0","kind":"a/b","devices":[{"name":"d","containerEdits":{"mounts":[{"hostPath":"/a","containerPath":"/b","mode":1}]}}]}"#,
        ];
        for case in cases {
            assert!(
                Spec::from_json(case).is_err(),
                "json accepted {}",
                String::from_utf8_lossy(case)
            );
            assert!(
                Spec::from_yaml(case).is_err(),
                "yaml accepted {}",
                String::from_utf8_lossy(case)
            );
        }
    }

    #[test]
    fn missing_fields_read_as_empty_for_the_validator_to_report() {
        let spec = Spec::from_yaml(b"kind: a/b").unwrap();
        assert_eq!(spec.cdi_version, "");
        assert!(spec.devices.is_empty());
    }

    #[test]
    fn an_empty_schemata_list_is_kept_apart_from_none() {
        let spec = Spec::from_yaml(b"containerEdits: {intelRdt: {schemata: []}}").unwrap();
        assert_eq!(
            spec.container_edits.intel_rdt.unwrap().schemata,
            Some(vec![])
        );
    }

    #[test]
    fn edits_emptiness_counts_every_field() {
        assert!(ContainerEdits::default().is_empty());
        assert!(!ContainerEdits::with_env(["A=1".to_string()]).is_empty());
        let rdt = ContainerEdits {
            intel_rdt: Some(IntelRdt::default()),
            ..ContainerEdits::default()
        };
        assert!(!rdt.is_empty());
    }
}
