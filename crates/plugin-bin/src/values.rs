//! Parsers for the values the command line, the config file and scenarios share: topology
//! sources, reserved CPUs, output formats. Each error says what was given and what is allowed;
//! the caller adds where it was given (flag, config key, scenario line).

use std::{collections::BTreeMap, fmt, path::Path, str::FromStr};

use policy::{
    CpuSet, Quantity, TopologySource,
    topology::page_size_name,
    topology_aware::{
        ClaimCpus, DeviceMode, DeviceModel, Exclusivity, Granularity, GroupBy, NodeReservation,
        ReservedCpus,
    },
};

/// What `reserved-memory` accepts, for messages.
pub const RESERVED_MEMORY_ALLOWED: &str = "the kubelet's --reserved-memory syntax: per NUMA node `<node>:memory=<quantity>[,hugepages-<size>=<quantity>]`, nodes separated by `;`, such as `0:memory=1Gi,hugepages-1Gi=2Gi;1:memory=2Gi`";

/// Memory reserved per NUMA node, in the kubelet's `--reserved-memory` syntax
/// (`0:memory=1Gi,hugepages-2Mi=64Mi;1:memory=2Gi`). An empty value reserves nothing.
pub fn reserved_memory(value: &str) -> Result<BTreeMap<u32, NodeReservation>, String> {
    let bad = |why: String| {
        format!(
            "{value:?} is not a reserved-memory value ({why}): expected {RESERVED_MEMORY_ALLOWED}"
        )
    };
    let mut out: BTreeMap<u32, NodeReservation> = BTreeMap::new();
    for part in value.split(';').map(str::trim).filter(|p| !p.is_empty()) {
        let (node, limits) = part
            .split_once(':')
            .ok_or_else(|| bad(format!("{part:?} names no node")))?;
        let node: u32 = node
            .trim()
            .parse()
            .map_err(|_| bad(format!("{node:?} is not a NUMA node number")))?;
        if out.contains_key(&node) {
            return Err(bad(format!("node {node} is given twice")));
        }
        let mut reservation = NodeReservation::default();
        for limit in limits.split(',').map(str::trim).filter(|l| !l.is_empty()) {
            let (name, amount) = limit
                .split_once('=')
                .ok_or_else(|| bad(format!("{limit:?} has no `=`")))?;
            let amount: Quantity = amount
                .trim()
                .parse()
                .map_err(|e| bad(format!("{name}: {e}")))?;
            let bytes = amount.units_ceil();
            match name.trim() {
                "memory" => reservation.memory = bytes,
                other => {
                    let size = other
                        .strip_prefix("hugepages-")
                        .and_then(|s| s.parse::<Quantity>().ok())
                        .map(Quantity::units_ceil)
                        .filter(|s| *s > 0)
                        .ok_or_else(|| {
                            bad(format!(
                                "{other:?} is neither `memory` nor `hugepages-<size>`"
                            ))
                        })?;
                    reservation.hugepages.insert(size, bytes);
                }
            }
        }
        out.insert(node, reservation);
    }
    Ok(out)
}

/// [`reserved_memory`] written back, in its syntax; empty when nothing is reserved.
pub fn show_reserved_memory(reserved: &BTreeMap<u32, NodeReservation>) -> String {
    reserved
        .iter()
        .map(|(node, r)| {
            let mut limits = vec![format!("memory={}", bytes(r.memory))];
            limits.extend(
                r.hugepages
                    .iter()
                    .map(|(size, b)| format!("hugepages-{}={}", page_size_name(*size), bytes(*b))),
            );
            format!("{node}:{}", limits.join(","))
        })
        .collect::<Vec<_>>()
        .join(";")
}

fn bytes(b: u64) -> String {
    if b == 0 {
        "0".into()
    } else {
        page_size_name(b)
    }
}

/// `claim-memory`: a percentage, `0%` to `100%`.
pub fn claim_memory(value: &str) -> Result<u32, String> {
    value
        .trim()
        .strip_suffix('%')
        .and_then(|n| n.trim().parse::<u32>().ok())
        .filter(|n| *n <= 100)
        .ok_or_else(|| {
            format!("{value:?} is not a claim-memory value: expected a percentage from `0%` to `100%`, such as `80%`")
        })
}

/// What `--topology` accepts, for messages.
pub const TOPOLOGY_ALLOWED: &str = "`live`, `synthetic:<hwloc description>` (for example `synthetic:pack:2 numa:2 core:8 pu:2`) or `xml:<file>`";

/// What `reserved-cpus` accepts, for messages.
pub const RESERVED_ALLOWED: &str = "a cpuset in the kubelet's reservedSystemCPUs syntax, such as `0`, `0-1` or `0,32` (for a number of CPUs, set reserved-cpu-count instead)";

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

/// The reserved CPUs as a cpuset, in the kubelet's `reservedSystemCPUs` syntax: `0` is CPU 0,
/// `0,32` CPUs 0 and 32, `0-1` CPUs 0 and 1. The `cpuset:` prefix nri-plugins writes is accepted
/// too. A number is always a CPU: a count is [`reserved_count`], a setting of its own.
pub fn reserved_cpuset(value: &str) -> Result<CpuSet, String> {
    let bad = |why: String| {
        format!("{value:?} is not a reserved-cpus value ({why}): expected {RESERVED_ALLOWED}")
    };
    let text = value.trim();
    let text = text.strip_prefix("cpuset:").unwrap_or(text);
    let set = CpuSet::from_str(text).map_err(|e| bad(e.to_string()))?;
    if set.is_empty() {
        return Err(bad("the cpuset is empty".into()));
    }
    Ok(set)
}

#[cfg(test)]
mod memory_tests {
    use super::*;

    #[test]
    fn reserved_memory_reads_the_kubelets_syntax_and_writes_it_back() {
        let r = reserved_memory("0:memory=1Gi,hugepages-2Mi=3Mi;1:memory=512Mi").unwrap();
        assert_eq!(r[&0].memory, 1 << 30);
        assert_eq!(r[&0].hugepages, BTreeMap::from([(2 << 20, 3 << 20)]));
        assert_eq!(r[&1].memory, 512 << 20);
        assert_eq!(
            show_reserved_memory(&r),
            "0:memory=1Gi,hugepages-2Mi=3Mi;1:memory=512Mi"
        );
        assert!(reserved_memory("").unwrap().is_empty());
        for (bad, why) in [
            ("memory=1Gi", "names no node"),
            ("x:memory=1Gi", "is not a NUMA node number"),
            ("0:memory=1Gi;0:memory=2Gi", "node 0 is given twice"),
            ("0:memory", "has no `=`"),
            ("0:cpu=1", "is neither `memory` nor `hugepages-<size>`"),
            ("0:memory=lots", "memory: invalid quantity"),
        ] {
            let err = reserved_memory(bad).unwrap_err();
            assert!(err.contains(why), "{bad}: {err}");
        }
    }

    #[test]
    fn claim_memory_is_a_percentage() {
        assert_eq!(claim_memory("80%"), Ok(80));
        assert_eq!(claim_memory("0%"), Ok(0));
        assert!(claim_memory("101%").is_err());
        assert!(claim_memory("8Gi").unwrap_err().contains("a percentage"));
    }
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

/// `cpu-exclusivity` as written; [`combine_policy`] completes it with `claim-cpus`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ExclusivityMode {
    #[default]
    Claims,
    Partition,
    Pods,
}

/// The value of `allowed` named `value`, or why not (listing the names).
fn pick<T: Copy>(value: &str, allowed: &[(&'static str, T)]) -> Result<T, String> {
    let value = value.trim();
    allowed
        .iter()
        .find(|(name, _)| *name == value)
        .map(|(_, v)| *v)
        .ok_or_else(|| {
            let list: Vec<String> = allowed.iter().map(|(a, _)| format!("`{a}`")).collect();
            format!("{value:?} is not allowed: expected {}", list.join(", "))
        })
}

/// The name of `value` in `allowed`.
fn name_of<T: PartialEq>(value: &T, allowed: &[(&'static str, T)]) -> &'static str {
    allowed
        .iter()
        .find(|(_, v)| v == value)
        .map_or("", |(name, _)| name)
}

const EXCLUSIVITY_MODES: [(&str, ExclusivityMode); 3] = [
    ("claims", ExclusivityMode::Claims),
    ("partition", ExclusivityMode::Partition),
    ("pods", ExclusivityMode::Pods),
];
const DEVICE_MODES: [(&str, DeviceMode); 2] = [
    ("grouped", DeviceMode::Grouped),
    ("individual", DeviceMode::Individual),
];
const GROUP_BYS: [(&str, GroupBy); 2] = [("numa", GroupBy::Numa), ("socket", GroupBy::Socket)];
const GRANULARITIES: [(&str, Granularity); 2] =
    [("cpu", Granularity::Cpu), ("core", Granularity::Core)];

/// `cpu-exclusivity`: `claims`, `partition` or `pods`.
pub fn exclusivity_mode(value: &str) -> Result<ExclusivityMode, String> {
    pick(value, &EXCLUSIVITY_MODES)
}

/// [`exclusivity_mode`] written back.
pub fn show_exclusivity_mode(mode: ExclusivityMode) -> &'static str {
    name_of(&mode, &EXCLUSIVITY_MODES)
}

/// `device-mode`: `grouped` or `individual`.
pub fn device_mode(value: &str) -> Result<DeviceMode, String> {
    pick(value, &DEVICE_MODES)
}

/// [`device_mode`] written back.
pub fn show_device_mode(mode: DeviceMode) -> &'static str {
    name_of(&mode, &DEVICE_MODES)
}

/// `group-by`: `numa` or `socket`.
pub fn group_by(value: &str) -> Result<GroupBy, String> {
    pick(value, &GROUP_BYS)
}

/// [`group_by`] written back.
pub fn show_group_by(group_by: GroupBy) -> &'static str {
    name_of(&group_by, &GROUP_BYS)
}

/// `claim-granularity`: `cpu` or `core`.
pub fn granularity(value: &str) -> Result<Granularity, String> {
    pick(value, &GRANULARITIES)
}

/// [`granularity`] written back.
pub fn show_granularity(granularity: Granularity) -> &'static str {
    name_of(&granularity, &GRANULARITIES)
}

/// The policy's settings, each read.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PolicyChoice {
    pub cpu_exclusivity: ExclusivityMode,
    pub claim_cpus: Option<ClaimCpus>,
    pub device_mode: DeviceMode,
    pub group_by: GroupBy,
    pub claim_granularity: Granularity,
}

/// Checks the policy's settings together: `claim-cpus` exactly with `partition`, `group-by:
/// socket` only with `grouped` devices.
pub fn combine_policy(
    choice: &PolicyChoice,
) -> Result<(Exclusivity, DeviceModel), PolicyValueError> {
    let fail = |key, reason: String| PolicyValueError { key, reason };
    let exclusivity = match (choice.cpu_exclusivity, &choice.claim_cpus) {
        (ExclusivityMode::Partition, Some(cpus)) => Exclusivity::Partition(cpus.clone()),
        (ExclusivityMode::Partition, None) => {
            return Err(fail(
                "claim-cpus",
                "is not set: cpu-exclusivity partition publishes these cpus for claims (a count such as `8`, or a cpuset such as `8-15`)".into(),
            ));
        }
        (_, Some(cpus)) => {
            return Err(fail(
                "claim-cpus",
                format!(
                    "{:?} is set, but only cpu-exclusivity partition uses it",
                    show_claim_cpus(cpus)
                ),
            ));
        }
        (ExclusivityMode::Claims, None) => Exclusivity::Claims,
        (ExclusivityMode::Pods, None) => Exclusivity::Pods,
    };
    if choice.device_mode == DeviceMode::Individual && choice.group_by == GroupBy::Socket {
        return Err(fail(
            "group-by",
            "\"socket\" groups grouped devices only: individual devices carry their socket as an attribute (use matchAttribute on it)".into(),
        ));
    }
    Ok((
        exclusivity,
        DeviceModel {
            mode: choice.device_mode,
            group_by: choice.group_by,
            granularity: choice.claim_granularity,
            pcie_roots: false,
        },
    ))
}

/// Reads the policy's settings as written (each unset one at its default) and checks them
/// together ([`combine_policy`]).
pub fn policy_settings(
    v: &PolicyValues<'_>,
) -> Result<(Exclusivity, DeviceModel), PolicyValueError> {
    fn read<T: Default>(
        key: &'static str,
        value: Option<&str>,
        parse: fn(&str) -> Result<T, String>,
    ) -> Result<T, PolicyValueError> {
        value
            .map_or_else(|| Ok(T::default()), parse)
            .map_err(|reason| PolicyValueError { key, reason })
    }
    let choice = PolicyChoice {
        cpu_exclusivity: read("cpu-exclusivity", v.cpu_exclusivity, exclusivity_mode)?,
        claim_cpus: match v.claim_cpus {
            Some(cpus) => Some(claim_cpus(cpus).map_err(|reason| PolicyValueError {
                key: "claim-cpus",
                reason,
            })?),
            None => None,
        },
        device_mode: read("device-mode", v.device_mode, device_mode)?,
        group_by: read("group-by", v.group_by, group_by)?,
        claim_granularity: read("claim-granularity", v.claim_granularity, granularity)?,
    };
    combine_policy(&choice)
}

/// `claim-cpus`: a count (`8`) or a cpuset (`8-15`, `0,8`; `cpuset:3` for the single CPU 3).
pub fn claim_cpus(value: &str) -> Result<ClaimCpus, String> {
    let bad = |why: String| {
        format!(
            "{value:?} is not a claim-cpus value ({why}): expected a count of CPUs such as `8`, or a cpuset such as `8-15` or `0,8` (`cpuset:3` for the single CPU 3)"
        )
    };
    let text = value.trim();
    if let Some(set) = text.strip_prefix("cpuset:") {
        return nonempty_cpuset(set).map(ClaimCpus::Set).map_err(bad);
    }
    if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
        return match text.parse::<usize>() {
            Ok(0) => Err(bad("a count must be at least 1".into())),
            Ok(n) => Ok(ClaimCpus::Count(n)),
            Err(_) => Err(bad("the count is too large".into())),
        };
    }
    nonempty_cpuset(text).map(ClaimCpus::Set).map_err(bad)
}

/// [`claim_cpus`] written back: a set of one CPU is `cpuset:N`, since `N` is a count.
pub fn show_claim_cpus(cpus: &ClaimCpus) -> String {
    match cpus {
        ClaimCpus::Count(n) => n.to_string(),
        ClaimCpus::Set(set) => {
            let text = set.to_string();
            if text.bytes().all(|b| b.is_ascii_digit()) {
                format!("cpuset:{text}")
            } else {
                text
            }
        }
    }
}

fn nonempty_cpuset(text: &str) -> Result<CpuSet, String> {
    let set = CpuSet::from_str(text).map_err(|e| e.to_string())?;
    if set.is_empty() {
        return Err("the cpuset is empty".into());
    }
    Ok(set)
}

/// A number of CPUs to reserve, at least 1.
pub fn reserved_count(value: &str) -> Result<usize, String> {
    let text = value.trim();
    let bad = |why: &str| {
        format!(
            "{value:?} is not a reserved-cpu-count value ({why}): expected a whole number of CPUs, at least 1 (to name the CPUs, set reserved-cpus instead)"
        )
    };
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad("not a whole number"));
    }
    match text.parse::<usize>() {
        Ok(0) => Err(bad("a count must be at least 1")),
        Ok(n) => Ok(n),
        Err(_) => Err(bad("the count is too large")),
    }
}

/// Shows a reserved-cpus value: a cpuset as the kubelet writes it, a count as `N cpus`.
pub fn show_reserved(r: &ReservedCpus) -> String {
    match r {
        ReservedCpus::Count(n) => format!("{n} cpus"),
        ReservedCpus::Set(set) => set.to_string(),
    }
}

/// Shows a topology source the way it is written.
pub fn show_topology(t: &TopologySource) -> String {
    match t {
        TopologySource::Live => "live".to_owned(),
        TopologySource::Synthetic(d) => format!("synthetic:{d}"),
        TopologySource::Xml(p) => format!("xml:{}", p.display()),
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
    fn reserved_cpusets_take_the_kubelets_syntax() {
        let set = |s: &str| Ok(s.parse::<CpuSet>().unwrap());
        assert_eq!(
            reserved_cpuset("0"),
            set("0"),
            "CPU 0, as the kubelet reads it"
        );
        assert_eq!(reserved_cpuset("2"), set("2"));
        assert_eq!(reserved_cpuset("0,32"), set("0,32"));
        assert_eq!(reserved_cpuset("0-1"), set("0-1"));
        assert_eq!(reserved_cpuset("cpuset:3"), set("3"));
        for bad in ["", "a", "3-1", "cpuset:", "-1", "1.5", "750m"] {
            let e = reserved_cpuset(bad).unwrap_err();
            assert!(e.contains("reservedSystemCPUs"), "{bad:?}: {e}");
        }
    }

    #[test]
    fn reserved_counts() {
        assert_eq!(reserved_count("2"), Ok(2));
        for bad in ["0", "", "-1", "0-1", "two"] {
            let e = reserved_count(bad).unwrap_err();
            assert!(e.contains("a whole number of CPUs"), "{bad:?}: {e}");
        }
    }
}

/// A duration as `500ms`, `90s`, `2m` or `1h`: a whole number and a unit, more than zero.
pub fn duration(value: &str) -> Result<std::time::Duration, String> {
    let refuse = || format!("expected a duration such as `90s`, `2m` or `500ms`, got {value:?}");
    let digits = value.bytes().take_while(u8::is_ascii_digit).count();
    let (number, unit) = value.split_at(digits);
    let n: u64 = number.parse().map_err(|_| refuse())?;
    let millis = match unit {
        "ms" => Some(n),
        "s" => n.checked_mul(1_000),
        "m" => n.checked_mul(60_000),
        "h" => n.checked_mul(3_600_000),
        _ => None,
    }
    .filter(|&ms| ms > 0)
    .ok_or_else(refuse)?;
    Ok(std::time::Duration::from_millis(millis))
}

/// A duration as [`duration`] reads it, in the largest unit that says it exactly.
pub fn show_duration(d: std::time::Duration) -> String {
    let ms = d.as_millis();
    if ms.is_multiple_of(3_600_000) {
        format!("{}h", ms / 3_600_000)
    } else if ms.is_multiple_of(60_000) {
        format!("{}m", ms / 60_000)
    } else if ms.is_multiple_of(1_000) {
        format!("{}s", ms / 1_000)
    } else {
        format!("{ms}ms")
    }
}

#[cfg(test)]
mod duration_tests {
    use super::*;

    #[test]
    fn durations_read_back_as_shown_and_refuse_what_is_not_one() {
        for (text, ms) in [
            ("500ms", 500),
            ("90s", 90_000),
            ("2m", 120_000),
            ("1h", 3_600_000),
        ] {
            let d = duration(text).unwrap();
            assert_eq!(d.as_millis(), ms, "{text}");
            assert_eq!(show_duration(d), text);
        }
        for bad in [
            "",
            "2",
            "m",
            "0s",
            "-1s",
            "1.5s",
            "2 m",
            "99999999999999999999h",
        ] {
            assert!(duration(bad).is_err(), "{bad:?} was taken");
        }
    }
}
