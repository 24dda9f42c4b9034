//! Parsers for the values the command line, the config file and scenarios share: topology
//! sources, reserved CPUs, output formats. Each error says what was given and what is allowed;
//! the caller adds where it was given (flag, config key, scenario line).

use std::{fmt, path::Path, str::FromStr};

use policy::{
    CpuSet, TopologySource,
    topology_aware::{
        ClaimCpus, DeviceMode, DeviceModel, Exclusivity, Granularity, GroupBy, ReservedCpus,
    },
};

/// What `--topology` accepts, for messages.
pub const TOPOLOGY_ALLOWED: &str = "`live`, `synthetic:<hwloc description>` (for example `synthetic:pack:2 numa:2 core:8 pu:2`) or `xml:<file>`";

/// What `--reserved-cpus` accepts, for messages.
pub const RESERVED_ALLOWED: &str = "a count of CPUs such as `2`, or a cpuset such as `0-1` or `0,8` (`cpuset:3` for the single CPU 3)";

/// `live`, `synthetic:<description>` or `xml:<path>`. Relative XML paths are resolved against
/// `base` (a scenario's directory), if given.
pub fn topology(value: &str, base: Option<&Path>) -> Result<TopologySource, String> {
    match value.split_once(':') {
        Some(("synthetic", desc)) if !desc.trim().is_empty() => {
            Ok(TopologySource::Synthetic(desc.trim().to_owned()))
        }
        Some(("xml", path)) if !path.trim().is_empty() => {
            let path = Path::new(path.trim());
            Ok(TopologySource::Xml(match base {
                Some(base) if path.is_relative() => base.join(path),
                _ => path.to_path_buf(),
            }))
        }
        None if value.trim() == "live" => Ok(TopologySource::Live),
        _ => Err(format!(
            "{value:?} is not a topology: expected {TOPOLOGY_ALLOWED}"
        )),
    }
}

/// A count (`2`) or a cpuset (`0-1`, `0,8`, `cpuset:3`). A bare number is a count, so a single
/// CPU is written `cpuset:3` (or `3-3`).
pub fn reserved_cpus(value: &str) -> Result<ReservedCpus, String> {
    let bad = |why: String| {
        format!("{value:?} is not a reserved-cpus value ({why}): expected {RESERVED_ALLOWED}")
    };
    let text = value.trim();
    if let Some(set) = text.strip_prefix("cpuset:") {
        return cpuset(set).map(ReservedCpus::Set).map_err(bad);
    }
    if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
        let n: usize = text
            .parse()
            .map_err(|_| bad("the count is too large".into()))?;
        if n == 0 {
            return Err(bad("a count must be at least 1".into()));
        }
        return Ok(ReservedCpus::Count(n));
    }
    cpuset(text).map(ReservedCpus::Set).map_err(bad)
}

fn cpuset(text: &str) -> Result<CpuSet, String> {
    let set = CpuSet::from_str(text).map_err(|e| e.to_string())?;
    if set.is_empty() {
        return Err("the cpuset is empty".into());
    }
    Ok(set)
}

/// The policy's settings as written (`cpu-exclusivity`, `claim-cpus`, `device-mode`, `group-by`,
/// `claim-granularity`), each `None` when not given.
#[derive(Debug, Clone, Copy, Default)]
pub struct PolicyValues<'a> {
    pub cpu_exclusivity: Option<&'a str>,
    pub claim_cpus: Option<&'a str>,
    pub device_mode: Option<&'a str>,
    pub group_by: Option<&'a str>,
    pub claim_granularity: Option<&'a str>,
}

/// Which of [`PolicyValues`] is wrong, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyValueError {
    /// The key (`cpu-exclusivity`, ...).
    pub key: &'static str,
    /// What is wrong, with what is allowed.
    pub reason: String,
}

/// Checks the policy's settings together: each value, `claim-cpus` exactly with `partition`,
/// `group-by: socket` only with `grouped` devices.
pub fn policy_settings(
    v: &PolicyValues<'_>,
) -> Result<(Exclusivity, DeviceModel), PolicyValueError> {
    let fail = |key, reason: String| PolicyValueError { key, reason };
    let pick = |key: &'static str, value: Option<&str>, allowed: &[&'static str]| {
        let value = value.map(str::trim).unwrap_or(allowed[0]);
        allowed.iter().position(|a| *a == value).ok_or_else(|| {
            let list: Vec<String> = allowed.iter().map(|a| format!("`{a}`")).collect();
            fail(
                key,
                format!("{value:?} is not allowed: expected {}", list.join(", ")),
            )
        })
    };
    let exclusivity = pick(
        "cpu-exclusivity",
        v.cpu_exclusivity,
        &["claims", "partition", "pods"],
    )?;
    let exclusivity = match (exclusivity, v.claim_cpus) {
        (1, Some(cpus)) => {
            Exclusivity::Partition(claim_cpus(cpus).map_err(|e| fail("claim-cpus", e))?)
        }
        (1, None) => {
            return Err(fail(
                "claim-cpus",
                "is not set: cpu-exclusivity partition publishes these cpus for claims (a count such as `8`, or a cpuset such as `8-15`)".into(),
            ));
        }
        (_, Some(cpus)) => {
            return Err(fail(
                "claim-cpus",
                format!("{cpus:?} is set, but only cpu-exclusivity partition uses it"),
            ));
        }
        (0, None) => Exclusivity::Claims,
        (_, None) => Exclusivity::Pods,
    };
    let mode = match pick("device-mode", v.device_mode, &["grouped", "individual"])? {
        0 => DeviceMode::Grouped,
        _ => DeviceMode::Individual,
    };
    let group_by = match pick("group-by", v.group_by, &["numa", "socket"])? {
        0 => GroupBy::Numa,
        _ => GroupBy::Socket,
    };
    if mode == DeviceMode::Individual && group_by == GroupBy::Socket {
        return Err(fail(
            "group-by",
            "\"socket\" groups grouped devices only: individual devices carry their socket as an attribute (use matchAttribute on it)".into(),
        ));
    }
    let granularity = match pick("claim-granularity", v.claim_granularity, &["cpu", "core"])? {
        0 => Granularity::Cpu,
        _ => Granularity::Core,
    };
    Ok((
        exclusivity,
        DeviceModel {
            mode,
            group_by,
            granularity,
        },
    ))
}

/// `claim-cpus`: a count or a cpuset, written like `reserved-cpus`.
fn claim_cpus(value: &str) -> Result<ClaimCpus, String> {
    reserved_cpus(value)
        .map(|r| match r {
            ReservedCpus::Count(n) => ClaimCpus::Count(n),
            ReservedCpus::Set(set) => ClaimCpus::Set(set),
        })
        .map_err(|e| e.replace("reserved-cpus value", "claim-cpus value"))
}

/// The policy's settings the way they are written, in [`PolicyValues`] order.
pub fn show_policy_settings(exclusivity: &Exclusivity, devices: &DeviceModel) -> [String; 5] {
    let (name, cpus) = match exclusivity {
        Exclusivity::Claims => ("claims", None),
        Exclusivity::Partition(ClaimCpus::Count(n)) => ("partition", Some(n.to_string())),
        Exclusivity::Partition(ClaimCpus::Set(set)) => ("partition", Some(set.to_string())),
        Exclusivity::Pods => ("pods", None),
    };
    [
        name.to_owned(),
        cpus.unwrap_or_default(),
        match devices.mode {
            DeviceMode::Grouped => "grouped",
            DeviceMode::Individual => "individual",
        }
        .to_owned(),
        match devices.group_by {
            GroupBy::Numa => "numa",
            GroupBy::Socket => "socket",
        }
        .to_owned(),
        match devices.granularity {
            Granularity::Cpu => "cpu",
            Granularity::Core => "core",
        }
        .to_owned(),
    ]
}

/// Shows a reserved-cpus value the way it is written.
pub fn show_reserved(r: &ReservedCpus) -> String {
    match r {
        ReservedCpus::Count(n) => n.to_string(),
        ReservedCpus::Set(set) => set.to_string(),
    }
}

/// `text` or `json`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Format {
    /// For people.
    #[default]
    Text,
    /// For programs; stable field names.
    Json,
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Text => "text",
            Self::Json => "json",
        })
    }
}

impl FromStr for Format {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "text" => Ok(Self::Text),
            "json" => Ok(Self::Json),
            _ => Err(format!("{s:?} is not a format: expected `text` or `json`")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topology_sources() {
        assert_eq!(topology("live", None), Ok(TopologySource::Live));
        assert_eq!(
            topology("synthetic:pack:1 core:2 pu:1", None),
            Ok(TopologySource::Synthetic("pack:1 core:2 pu:1".into()))
        );
        assert_eq!(
            topology("xml:m.xml", Some(Path::new("/s"))),
            Ok(TopologySource::Xml("/s/m.xml".into()))
        );
        assert_eq!(
            topology("xml:/abs/m.xml", Some(Path::new("/s"))),
            Ok(TopologySource::Xml("/abs/m.xml".into()))
        );
        for bad in ["", "livee", "synthetic:", "xml:", "hwloc:x"] {
            let e = topology(bad, None).unwrap_err();
            assert!(e.contains("expected `live`"), "{bad:?}: {e}");
        }
    }

    #[test]
    fn policy_settings_check_each_value_and_how_they_go_together() {
        let ok = |v: PolicyValues<'_>| policy_settings(&v).unwrap();
        let (e, d) = ok(PolicyValues::default());
        assert_eq!((e, d), (Exclusivity::Claims, DeviceModel::default()));
        let (e, d) = ok(PolicyValues {
            cpu_exclusivity: Some("partition"),
            claim_cpus: Some("8-15"),
            device_mode: Some("individual"),
            claim_granularity: Some("core"),
            ..PolicyValues::default()
        });
        assert_eq!(
            e,
            Exclusivity::Partition(ClaimCpus::Set("8-15".parse().unwrap()))
        );
        assert_eq!(
            (d.mode, d.group_by, d.granularity),
            (DeviceMode::Individual, GroupBy::Numa, Granularity::Core)
        );
        let (e, _) = ok(PolicyValues {
            cpu_exclusivity: Some("partition"),
            claim_cpus: Some("4"),
            ..PolicyValues::default()
        });
        assert_eq!(e, Exclusivity::Partition(ClaimCpus::Count(4)));
        assert_eq!(
            ok(PolicyValues {
                cpu_exclusivity: Some("pods"),
                group_by: Some("socket"),
                ..PolicyValues::default()
            }),
            (
                Exclusivity::Pods,
                DeviceModel {
                    group_by: GroupBy::Socket,
                    ..DeviceModel::default()
                }
            )
        );
        let bad = |v: PolicyValues<'_>| {
            let e = policy_settings(&v).unwrap_err();
            format!("{}: {}", e.key, e.reason)
        };
        let e = bad(PolicyValues {
            cpu_exclusivity: Some("exclusive"),
            ..PolicyValues::default()
        });
        assert_eq!(
            e,
            "cpu-exclusivity: \"exclusive\" is not allowed: expected `claims`, `partition`, `pods`"
        );
        let e = bad(PolicyValues {
            cpu_exclusivity: Some("partition"),
            ..PolicyValues::default()
        });
        assert!(e.starts_with("claim-cpus: is not set"), "{e}");
        let e = bad(PolicyValues {
            claim_cpus: Some("4"),
            ..PolicyValues::default()
        });
        assert!(e.contains("only cpu-exclusivity partition uses it"), "{e}");
        let e = bad(PolicyValues {
            cpu_exclusivity: Some("partition"),
            claim_cpus: Some("x"),
            ..PolicyValues::default()
        });
        assert!(
            e.starts_with("claim-cpus: \"x\" is not a claim-cpus value"),
            "{e}"
        );
        let e = bad(PolicyValues {
            device_mode: Some("individual"),
            group_by: Some("socket"),
            ..PolicyValues::default()
        });
        assert!(
            e.starts_with("group-by: \"socket\" groups grouped devices only"),
            "{e}"
        );
        for (key, v) in [
            (
                "device-mode",
                PolicyValues {
                    device_mode: Some("per-cpu"),
                    ..PolicyValues::default()
                },
            ),
            (
                "group-by",
                PolicyValues {
                    group_by: Some("die"),
                    ..PolicyValues::default()
                },
            ),
            (
                "claim-granularity",
                PolicyValues {
                    claim_granularity: Some("thread"),
                    ..PolicyValues::default()
                },
            ),
        ] {
            assert!(bad(v).starts_with(&format!("{key}: ")), "{key}");
        }
    }

    #[test]
    fn reserved_counts_and_sets() {
        assert_eq!(reserved_cpus("2"), Ok(ReservedCpus::Count(2)));
        assert_eq!(
            reserved_cpus("0-1"),
            Ok(ReservedCpus::Set("0-1".parse().unwrap()))
        );
        assert_eq!(
            reserved_cpus("cpuset:3"),
            Ok(ReservedCpus::Set("3".parse().unwrap()))
        );
        for bad in ["0", "", "a", "3-1", "cpuset:", "-1", "1.5"] {
            let e = reserved_cpus(bad).unwrap_err();
            assert!(e.contains("expected a count"), "{bad:?}: {e}");
        }
    }
}
