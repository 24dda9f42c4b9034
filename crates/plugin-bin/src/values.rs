//! Parsers for the values the command line, the config file and scenarios share: topology
//! sources, reserved CPUs, output formats. Each error says what was given and what is allowed;
//! the caller adds where it was given (flag, config key, scenario line).

use std::{fmt, path::Path, str::FromStr};

use policy::{CpuSet, TopologySource, topology_aware::ReservedCpus};

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
