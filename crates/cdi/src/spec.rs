//! The CDI spec document as serde types, mirroring the reference `specs-go` model.
//!
//! Field names are the JSON names of the CDI specification (camelCase); empty values are omitted on
//! writing, as the reference writer does; unknown fields are rejected on reading, as the runtimes
//! reject them. These types carry no validation of their own: see the `validate` module.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// A whole CDI spec file.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Spec {
    /// The CDI version the spec is written for.
    pub cdi_version: String,
    /// `vendor/class`.
    pub kind: String,
    /// Spec-level annotations (CDI 0.6.0).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    /// The devices the spec defines; at least one.
    pub devices: Vec<Device>,
    /// Edits applied once when any device of the spec is injected.
    #[serde(default, skip_serializing_if = "ContainerEdits::is_empty")]
    pub container_edits: ContainerEdits,
}

/// One device of a spec.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Device {
    /// The device name, unique within the spec.
    pub name: String,
    /// Device annotations (CDI 0.6.0).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    /// What injecting the device does to a container; must not be empty.
    pub container_edits: ContainerEdits,
}

/// Changes CDI makes to a container when a device is injected.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ContainerEdits {
    /// Environment entries, `NAME=VALUE`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    /// Device nodes to create.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub device_nodes: Vec<DeviceNode>,
    /// OCI hooks to add.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hooks: Vec<Hook>,
    /// Mounts to add.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mounts: Vec<Mount>,
    /// Intel RDT settings (CDI 0.7.0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub intel_rdt: Option<IntelRdt>,
    /// Supplementary group IDs (CDI 0.7.0).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub additional_gids: Vec<u32>,
    /// Network devices to move into the container (CDI 1.1.0).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub net_devices: Vec<NetDevice>,
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
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DeviceNode {
    /// Path in the container.
    pub path: String,
    /// Path on the host (CDI 0.5.0).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub host_path: String,
    /// `b`, `c`, `u` or `p`.
    #[serde(default, rename = "type", skip_serializing_if = "String::is_empty")]
    pub kind: String,
    /// Major number.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub major: Option<i64>,
    /// Minor number.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub minor: Option<i64>,
    /// File mode of the node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file_mode: Option<u32>,
    /// Cgroup permissions, letters from `rwm`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub permissions: String,
    /// Owner.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<u32>,
    /// Group.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gid: Option<u32>,
}

/// A mount to add to the container.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Mount {
    /// Source on the host.
    pub host_path: String,
    /// Destination in the container.
    pub container_path: String,
    /// Filesystem type (CDI 0.4.0).
    #[serde(default, rename = "type", skip_serializing_if = "String::is_empty")]
    pub kind: String,
    /// Mount options.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<String>,
}

/// An OCI hook to add.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Hook {
    /// When the hook runs: prestart, createRuntime, createContainer, startContainer, poststart or
    /// poststop.
    pub hook_name: String,
    /// Executable path.
    pub path: String,
    /// Arguments, including argv\[0\].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// Environment of the hook.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    /// Timeout in seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<i64>,
}

/// Intel RDT settings.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct IntelRdt {
    /// The class of service.
    #[serde(default, rename = "closID", skip_serializing_if = "String::is_empty")]
    pub clos_id: String,
    /// L3 cache allocation schema.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub l3_cache_schema: String,
    /// Memory bandwidth schema.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub mem_bw_schema: String,
    /// Full schemata lines (CDI 1.1.0).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub schemata: Vec<String>,
    /// Enable monitoring (CDI 1.1.0).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub enable_monitoring: bool,
}

/// A network device to move into the container.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NetDevice {
    /// Interface name on the host.
    pub host_interface_name: String,
    /// Interface name in the container.
    pub name: String,
}
