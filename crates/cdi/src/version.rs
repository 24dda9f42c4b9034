//! CDI specification versions and the minimum version a spec needs.
//!
//! A runtime rejects a spec whose `cdiVersion` it does not know (older runtimes vendor older CDI
//! libraries) and one whose `cdiVersion` is below what the spec's fields need. So a spec declares
//! exactly its minimum: the newest version whose requirement the spec meets, 0.3.0 if none. The
//! table is the reference's:
//!
//! | version | required when |
//! |---|---|
//! | 0.1.0, 0.2.0 | known, never required |
//! | 0.3.0 | baseline |
//! | 0.4.0 | a mount has a `type` |
//! | 0.5.0 | a device node has a `hostPath`, or a device name starts with a digit |
//! | 0.6.0 | spec or device annotations, or a `.` in the class |
//! | 0.7.0 | `intelRdt` present, or `additionalGids` non-empty |
//! | 0.8.0, 1.0.0 | never (library-only changes) |
//! | 1.1.0 | `netDevices` non-empty, `intelRdt.schemata` present, `intelRdt.enableMonitoring` |

use std::{fmt, str::FromStr};

use crate::spec::{ContainerEdits, Spec};

/// A released CDI specification version, ordered oldest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Version {
    /// 0.1.0.
    V0_1_0,
    /// 0.2.0.
    V0_2_0,
    /// 0.3.0, the baseline every computed minimum starts from.
    V0_3_0,
    /// 0.4.0: mount types.
    V0_4_0,
    /// 0.5.0: device node host paths, device names starting with a digit.
    V0_5_0,
    /// 0.6.0: annotations, dots in the class.
    V0_6_0,
    /// 0.7.0: Intel RDT, additional GIDs.
    V0_7_0,
    /// 0.8.0: no spec changes.
    V0_8_0,
    /// 1.0.0: no spec changes.
    V1_0_0,
    /// 1.1.0: network devices, RDT schemata and monitoring.
    V1_1_0,
}

/// A `cdiVersion` that is not a released CDI version.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cdiVersion {value:?} is not a known cdi version")]
pub struct VersionError {
    /// The declared version.
    pub value: String,
}

impl Version {
    /// Every known version, oldest first.
    pub const ALL: [Version; 10] = [
        Version::V0_1_0,
        Version::V0_2_0,
        Version::V0_3_0,
        Version::V0_4_0,
        Version::V0_5_0,
        Version::V0_6_0,
        Version::V0_7_0,
        Version::V0_8_0,
        Version::V1_0_0,
        Version::V1_1_0,
    ];

    /// The oldest version a computed minimum can be.
    pub const BASELINE: Version = Version::V0_3_0;

    /// The version as written in `cdiVersion`, without a leading `v`.
    pub fn as_str(self) -> &'static str {
        match self {
            Version::V0_1_0 => "0.1.0",
            Version::V0_2_0 => "0.2.0",
            Version::V0_3_0 => "0.3.0",
            Version::V0_4_0 => "0.4.0",
            Version::V0_5_0 => "0.5.0",
            Version::V0_6_0 => "0.6.0",
            Version::V0_7_0 => "0.7.0",
            Version::V0_8_0 => "0.8.0",
            Version::V1_0_0 => "1.0.0",
            Version::V1_1_0 => "1.1.0",
        }
    }

    /// Parses a `cdiVersion`, tolerating a leading `v` as the reference does.
    pub fn parse(value: &str) -> Result<Self, VersionError> {
        let bare = value.strip_prefix('v').unwrap_or(value);
        Self::ALL
            .into_iter()
            .find(|v| v.as_str() == bare)
            .ok_or_else(|| VersionError {
                value: value.into(),
            })
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Version {
    type Err = VersionError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

/// What made a spec need a version newer than the baseline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Requirement {
    /// The version needed.
    pub version: Version,
    /// The feature that needs it, for error messages.
    pub feature: &'static str,
}

/// Whether a spec uses a version's features.
type Needs = fn(&Spec) -> bool;

/// The requirements, newest version first, as in the reference; the first that holds decides.
const REQUIREMENTS: [(Version, &str, Needs); 5] = [
    (
        Version::V1_1_0,
        "netDevices, intelRdt.schemata or intelRdt.enableMonitoring",
        needs_1_1_0,
    ),
    (Version::V0_7_0, "intelRdt or additionalGids", needs_0_7_0),
    (
        Version::V0_6_0,
        "annotations or a '.' in the class",
        needs_0_6_0,
    ),
    (
        Version::V0_5_0,
        "a device node hostPath or a device name starting with a digit",
        needs_0_5_0,
    ),
    (Version::V0_4_0, "a mount type", needs_0_4_0),
];

/// The minimum version `spec` must declare.
pub fn minimum_version(spec: &Spec) -> Version {
    requirement(spec).map_or(Version::BASELINE, |r| r.version)
}

/// The newest requirement `spec` meets, or `None` if the baseline suffices.
pub fn requirement(spec: &Spec) -> Option<Requirement> {
    REQUIREMENTS
        .iter()
        .find(|(_, _, needs)| needs(spec))
        .map(|&(version, feature, _)| Requirement { version, feature })
}

/// Every set of edits in the spec: the spec's own, then each device's.
fn all_edits(spec: &Spec) -> impl Iterator<Item = &ContainerEdits> {
    std::iter::once(&spec.container_edits).chain(spec.devices.iter().map(|d| &d.container_edits))
}

fn needs_1_1_0(spec: &Spec) -> bool {
    all_edits(spec).any(|e| {
        !e.net_devices.is_empty()
            || e.intel_rdt
                .as_ref()
                .is_some_and(|rdt| rdt.schemata.is_some() || rdt.enable_monitoring)
    })
}

fn needs_0_7_0(spec: &Spec) -> bool {
    all_edits(spec).any(|e| e.intel_rdt.is_some() || !e.additional_gids.is_empty())
}

fn needs_0_6_0(spec: &Spec) -> bool {
    !spec.annotations.is_empty()
        || spec.devices.iter().any(|d| !d.annotations.is_empty())
        || spec
            .kind
            .split_once('/')
            .is_some_and(|(_, class)| class.contains('.'))
}

fn needs_0_5_0(spec: &Spec) -> bool {
    spec.devices
        .iter()
        .any(|d| d.name.starts_with(|c: char| c.is_ascii_digit()))
        || all_edits(spec).any(|e| e.device_nodes.iter().any(|n| !n.host_path.is_empty()))
}

fn needs_0_4_0(spec: &Spec) -> bool {
    all_edits(spec).any(|e| e.mounts.iter().any(|m| !m.kind.is_empty()))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::spec::{Device, DeviceNode, IntelRdt, Mount, NetDevice};

    fn spec_with(name: &str, edits: ContainerEdits) -> Spec {
        Spec {
            cdi_version: String::new(),
            kind: "example.com/device".into(),
            devices: vec![Device {
                name: name.into(),
                container_edits: edits,
                ..Device::default()
            }],
            ..Spec::default()
        }
    }

    fn env() -> ContainerEdits {
        ContainerEdits::with_env(["A=1".to_string()])
    }

    #[test]
    fn versions_parse_with_or_without_v_and_order_oldest_first() {
        for v in Version::ALL {
            assert_eq!(Version::parse(v.as_str()), Ok(v));
            assert_eq!(Version::parse(&format!("v{v}")), Ok(v));
        }
        assert!(Version::ALL.windows(2).all(|w| w[0] < w[1]));
        for bad in ["", "1.2.0", "0.3", "vv0.3.0", "0.3.0 "] {
            assert_eq!(Version::parse(bad), Err(VersionError { value: bad.into() }));
        }
    }

    #[test]
    fn row_0_3_0_env_only_edits_need_the_baseline() {
        assert_eq!(
            minimum_version(&spec_with("claim-1-0", env())),
            Version::V0_3_0
        );
        assert_eq!(requirement(&spec_with("claim-1-0", env())), None);
    }

    #[test]
    fn row_0_4_0_a_mount_type() {
        let mount = |kind: &str| Mount {
            host_path: "/a".into(),
            container_path: "/b".into(),
            kind: kind.into(),
            options: vec![],
        };
        let untyped = ContainerEdits {
            mounts: vec![mount("")],
            ..env()
        };
        assert_eq!(minimum_version(&spec_with("d", untyped)), Version::V0_3_0);
        let typed = ContainerEdits {
            mounts: vec![mount("bind")],
            ..env()
        };
        assert_eq!(
            minimum_version(&spec_with("d", typed.clone())),
            Version::V0_4_0
        );
        let spec_level = Spec {
            container_edits: typed,
            ..spec_with("d", env())
        };
        assert_eq!(minimum_version(&spec_level), Version::V0_4_0);
    }

    #[test]
    fn row_0_5_0_a_host_path_or_a_digit_leading_device_name() {
        let node = ContainerEdits {
            device_nodes: vec![DeviceNode {
                path: "/dev/x".into(),
                host_path: "/dev/null".into(),
                ..DeviceNode::default()
            }],
            ..ContainerEdits::default()
        };
        assert_eq!(minimum_version(&spec_with("d", node)), Version::V0_5_0);
        let no_host_path = ContainerEdits {
            device_nodes: vec![DeviceNode {
                path: "/dev/x".into(),
                ..DeviceNode::default()
            }],
            ..ContainerEdits::default()
        };
        assert_eq!(
            minimum_version(&spec_with("d", no_host_path)),
            Version::V0_3_0
        );
        // A claim UID as the device name needs 0.5.0; prefixed with `claim-` it does not.
        let uid = "0b2c9a5e-8f6d-4c1a-9e3b-2d7f1a6c4e80";
        assert_eq!(minimum_version(&spec_with(uid, env())), Version::V0_5_0);
        assert_eq!(
            minimum_version(&spec_with(&format!("claim-{uid}-0"), env())),
            Version::V0_3_0
        );
    }

    #[test]
    fn row_0_6_0_annotations_or_a_dotted_class() {
        let annotated = Spec {
            annotations: BTreeMap::from([("k".into(), "v".into())]),
            ..spec_with("d", env())
        };
        assert_eq!(minimum_version(&annotated), Version::V0_6_0);
        let mut device_annotated = spec_with("d", env());
        device_annotated.devices[0]
            .annotations
            .insert("k".into(), "v".into());
        assert_eq!(minimum_version(&device_annotated), Version::V0_6_0);
        let dotted = Spec {
            kind: "example.com/a.b".into(),
            ..spec_with("d", env())
        };
        assert_eq!(minimum_version(&dotted), Version::V0_6_0);
    }

    #[test]
    fn row_0_7_0_intel_rdt_or_additional_gids() {
        let rdt = ContainerEdits {
            intel_rdt: Some(IntelRdt {
                clos_id: "gold".into(),
                ..IntelRdt::default()
            }),
            ..ContainerEdits::default()
        };
        assert_eq!(minimum_version(&spec_with("d", rdt)), Version::V0_7_0);
        let gids = ContainerEdits {
            additional_gids: vec![5],
            ..ContainerEdits::default()
        };
        assert_eq!(minimum_version(&spec_with("d", gids)), Version::V0_7_0);
    }

    #[test]
    fn rows_0_8_0_and_1_0_0_are_never_required() {
        // Everything below 1.1.0 at once still needs only 0.7.0.
        let everything = ContainerEdits {
            device_nodes: vec![DeviceNode {
                path: "/dev/x".into(),
                host_path: "/dev/null".into(),
                ..DeviceNode::default()
            }],
            mounts: vec![Mount {
                host_path: "/a".into(),
                container_path: "/b".into(),
                kind: "bind".into(),
                options: vec![],
            }],
            intel_rdt: Some(IntelRdt::default()),
            additional_gids: vec![1],
            ..env()
        };
        let spec = Spec {
            annotations: BTreeMap::from([("k".into(), "v".into())]),
            ..spec_with("0", everything)
        };
        assert_eq!(minimum_version(&spec), Version::V0_7_0);
    }

    #[test]
    fn row_1_1_0_net_devices_schemata_or_monitoring() {
        let net = ContainerEdits {
            net_devices: vec![NetDevice {
                host_interface_name: "eth1".into(),
                name: "net0".into(),
            }],
            ..ContainerEdits::default()
        };
        assert_eq!(minimum_version(&spec_with("d", net)), Version::V1_1_0);
        let rdt = |rdt: IntelRdt| ContainerEdits {
            intel_rdt: Some(rdt),
            ..ContainerEdits::default()
        };
        let schemata = rdt(IntelRdt {
            schemata: Some(vec![]),
            ..IntelRdt::default()
        });
        assert_eq!(minimum_version(&spec_with("d", schemata)), Version::V1_1_0);
        let monitoring = rdt(IntelRdt {
            enable_monitoring: true,
            ..IntelRdt::default()
        });
        let spec_level = Spec {
            container_edits: monitoring,
            ..spec_with("d", env())
        };
        assert_eq!(minimum_version(&spec_level), Version::V1_1_0);
        assert_eq!(
            requirement(&spec_level).map(|r| r.version),
            Some(Version::V1_1_0)
        );
    }
}
