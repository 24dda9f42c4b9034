//! The type of each setting's value: how it is read from what was given (a flag, a key of the
//! config file, the documented default) and written back as the config file writes it.
//!
//! Every setting of [`super::SETTINGS`] is declared with one of these types
//! ([`super::Typed`]), so that resolving a setting and printing it (`--print-config`, the
//! start-up log, the documented defaults) go through the same two functions, and
//! `parse(show(v))` is `v`: a test checks it for every setting's default.

use std::{collections::BTreeMap, net::SocketAddr, path::PathBuf, time::Duration};

use kube_dra::metadata::MetadataVersion;
use kubelet_plugin::names::{dns_label, dns_subdomain};
use policy::{
    CpuSet, TopologySource,
    topology_aware::{ClaimCpus, DeviceMode, Granularity, GroupBy, NodeReservation},
};
use serde_json::{Value, json};

use crate::values::{self, ExclusivityMode, Format};

/// A value as given: one, or a list (from a YAML sequence).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Given {
    One(String),
    List(Vec<String>),
}

impl Given {
    /// The single value; a list is refused.
    fn one(&self) -> Result<&str, String> {
        match self {
            Self::One(v) => Ok(v),
            Self::List(_) => Err("expected a single value, found a list".into()),
        }
    }
}

/// A setting's type.
pub trait SettingType: Sized {
    /// Reads `given`; the error says what is wrong and what is allowed (the caller says where it
    /// was given).
    fn parse(given: &Given) -> Result<Self, String>;

    /// The value as the config file writes it, which [`SettingType::parse`] reads back.
    fn show(&self) -> Value;
}

/// The items of a list setting: a list's, or a single value's comma-separated ones.
fn items_of(given: &Given) -> Vec<String> {
    match given {
        Given::List(items) => items.clone(),
        Given::One(v) => v
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect(),
    }
}

/// `"value" is not allowed: <what is>`, the form of every refusal that names no parser.
fn refuse(value: &str, allowed: &str) -> String {
    format!("{value:?} is not allowed: {allowed}")
}

impl SettingType for bool {
    fn parse(given: &Given) -> Result<Self, String> {
        let v = given.one()?;
        v.parse()
            .map_err(|_| refuse(v, "expected `true` or `false`"))
    }

    fn show(&self) -> Value {
        json!(self)
    }
}

/// `node-name`: a DNS subdomain of at most 253 characters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeName(pub String);

impl SettingType for NodeName {
    fn parse(given: &Given) -> Result<Self, String> {
        let v = given.one()?;
        dns_subdomain(v, 253).map_err(|_| {
            refuse(
                v,
                "expected the node's name, a DNS subdomain (lower-case letters, digits, `-` and `.`, at most 253 characters)",
            )
        })?;
        Ok(Self(v.to_owned()))
    }

    fn show(&self) -> Value {
        json!(self.0)
    }
}

/// `pod-uid`: the agent's pod's UID, which names its kubelet sockets: lower-case hex digits and
/// `-` (a DNS label's characters, which also covers UIDs made up for tests).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodUid(pub String);

impl SettingType for PodUid {
    fn parse(given: &Given) -> Result<Self, String> {
        let v = given.one()?;
        dns_label(v).map_err(|_| {
            refuse(
                v,
                "expected the pod's UID, such as `0b6c2a4e-7f3d-4c1e-9a2b-5d6e7f8a9b0c` (lower-case letters, digits and `-`, at most 63 characters)",
            )
        })?;
        Ok(Self(v.to_owned()))
    }

    fn show(&self) -> Value {
        json!(self.0)
    }
}

/// `pod-generation`: the DaemonSet template generation of the agent's pod, a non-negative
/// integer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PodGeneration(pub u64);

impl SettingType for PodGeneration {
    fn parse(given: &Given) -> Result<Self, String> {
        let v = given.one()?;
        v.parse().map(Self).map_err(|_| {
            refuse(
                v,
                "expected the pod's `pod-template-generation` label, a non-negative integer such as `3`",
            )
        })
    }

    fn show(&self) -> Value {
        json!(self.0)
    }
}

/// `driver-name`: a DNS subdomain with a dot, at most 63 characters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriverName(pub String);

impl SettingType for DriverName {
    fn parse(given: &Given) -> Result<Self, String> {
        let v = given.one()?;
        if dns_subdomain(v, 63).is_err() || !v.contains('.') {
            return Err(refuse(
                v,
                "expected a DNS subdomain with at least one dot and at most 63 characters, such as `topology-aware.resmgr.io`",
            ));
        }
        Ok(Self(v.to_owned()))
    }

    fn show(&self) -> Value {
        json!(self.0)
    }
}

/// A path that is not empty: sockets and directories.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Path(pub PathBuf);

impl SettingType for Path {
    fn parse(given: &Given) -> Result<Self, String> {
        let v = given.one()?;
        if v.trim().is_empty() || v.contains('\0') {
            return Err(refuse(v, "expected a non-empty path"));
        }
        Ok(Self(PathBuf::from(v)))
    }

    fn show(&self) -> Value {
        json!(self.0.display().to_string())
    }
}

/// `kubeconfig`: a file's path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kubeconfig(pub PathBuf);

impl SettingType for Kubeconfig {
    fn parse(given: &Given) -> Result<Self, String> {
        let v = given.one()?;
        if v.trim().is_empty() || v.contains('\0') {
            return Err(refuse(v, "expected the path of a kubeconfig file"));
        }
        Ok(Self(PathBuf::from(v)))
    }

    fn show(&self) -> Value {
        json!(self.0.display().to_string())
    }
}

/// `nri-plugin-index`: two digits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginIndex(pub String);

impl SettingType for PluginIndex {
    fn parse(given: &Given) -> Result<Self, String> {
        let v = given.one()?;
        if v.len() != 2 || !v.bytes().all(|b| b.is_ascii_digit()) {
            return Err(refuse(
                v,
                "expected exactly two digits, `00` to `99` (plugins are called in index order)",
            ));
        }
        Ok(Self(v.to_owned()))
    }

    fn show(&self) -> Value {
        json!(self.0)
    }
}

impl SettingType for TopologySource {
    fn parse(given: &Given) -> Result<Self, String> {
        values::topology(given.one()?, None)
    }

    fn show(&self) -> Value {
        json!(values::show_topology(self))
    }
}

/// `reserved-cpus`: a cpuset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReservedSet(pub CpuSet);

impl SettingType for ReservedSet {
    fn parse(given: &Given) -> Result<Self, String> {
        values::reserved_cpuset(given.one()?).map(Self)
    }

    fn show(&self) -> Value {
        json!(self.0.to_string())
    }
}

/// `reserved-cpu-count`: at least 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReservedCount(pub usize);

impl SettingType for ReservedCount {
    fn parse(given: &Given) -> Result<Self, String> {
        values::reserved_count(given.one()?).map(Self)
    }

    fn show(&self) -> Value {
        json!(self.0)
    }
}

/// `reserved-namespaces`: namespace names, a list (comma-separated in one value).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Namespaces(pub Vec<String>);

impl SettingType for Namespaces {
    fn parse(given: &Given) -> Result<Self, String> {
        let names = items_of(given);
        if let Some(bad) = names.iter().find(|ns| dns_label(ns).is_err()) {
            return Err(refuse(
                bad,
                "expected namespace names (lower-case letters, digits and `-`, at most 63 characters)",
            ));
        }
        Ok(Self(names))
    }

    fn show(&self) -> Value {
        json!(self.0)
    }
}

/// `device-metadata`: metadata API versions, newest first; none turns device metadata off.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetadataVersions(pub Vec<MetadataVersion>);

impl SettingType for MetadataVersions {
    fn parse(given: &Given) -> Result<Self, String> {
        let items = items_of(given);
        let mut versions = Vec::new();
        for item in &items {
            let version: MetadataVersion = item
                .parse()
                .map_err(|_| refuse(item, "expected v1beta1 or v1alpha1"))?;
            if versions.contains(&version) {
                return Err(refuse(item, "each version once"));
            }
            versions.push(version);
        }
        Ok(Self(versions))
    }

    fn show(&self) -> Value {
        json!(self.0.iter().map(|v| v.as_str()).collect::<Vec<_>>())
    }
}

impl SettingType for ExclusivityMode {
    fn parse(given: &Given) -> Result<Self, String> {
        values::exclusivity_mode(given.one()?)
    }

    fn show(&self) -> Value {
        json!(values::show_exclusivity_mode(*self))
    }
}

impl SettingType for ClaimCpus {
    fn parse(given: &Given) -> Result<Self, String> {
        values::claim_cpus(given.one()?)
    }

    fn show(&self) -> Value {
        json!(values::show_claim_cpus(self))
    }
}

impl SettingType for DeviceMode {
    fn parse(given: &Given) -> Result<Self, String> {
        values::device_mode(given.one()?)
    }

    fn show(&self) -> Value {
        json!(values::show_device_mode(*self))
    }
}

impl SettingType for GroupBy {
    fn parse(given: &Given) -> Result<Self, String> {
        values::group_by(given.one()?)
    }

    fn show(&self) -> Value {
        json!(values::show_group_by(*self))
    }
}

impl SettingType for Granularity {
    fn parse(given: &Given) -> Result<Self, String> {
        values::granularity(given.one()?)
    }

    fn show(&self) -> Value {
        json!(values::show_granularity(*self))
    }
}

/// `reserved-memory`: per NUMA node; empty reserves nothing.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ReservedMemory(pub BTreeMap<u32, NodeReservation>);

impl SettingType for ReservedMemory {
    fn parse(given: &Given) -> Result<Self, String> {
        values::reserved_memory(given.one()?).map(Self)
    }

    fn show(&self) -> Value {
        if self.0.is_empty() {
            Value::Null
        } else {
            json!(values::show_reserved_memory(&self.0))
        }
    }
}

/// `claim-memory`: a percentage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClaimMemory(pub u32);

impl SettingType for ClaimMemory {
    fn parse(given: &Given) -> Result<Self, String> {
        values::claim_memory(given.one()?).map(Self)
    }

    fn show(&self) -> Value {
        json!(format!("{}%", self.0))
    }
}

impl SettingType for Duration {
    fn parse(given: &Given) -> Result<Self, String> {
        values::duration(given.one()?)
    }

    fn show(&self) -> Value {
        json!(values::show_duration(*self))
    }
}

impl SettingType for SocketAddr {
    fn parse(given: &Given) -> Result<Self, String> {
        let v = given.one()?;
        v.parse().map_err(|_| {
            refuse(
                v,
                "expected an IP address and port such as `127.0.0.1:8891` or `[::]:8891` (port 0 picks a free one)",
            )
        })
    }

    fn show(&self) -> Value {
        json!(self.to_string())
    }
}

/// `debug-addr`: an address, or `off`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DebugAddr(pub Option<SocketAddr>);

impl SettingType for DebugAddr {
    fn parse(given: &Given) -> Result<Self, String> {
        match given.one()? {
            "off" => Ok(Self(None)),
            v => v.parse().map(|a| Self(Some(a))).map_err(|_| {
                refuse(
                    v,
                    "expected `off` or an IP address and port such as `127.0.0.1:8892` (port 0 picks a free one)",
                )
            }),
        }
    }

    fn show(&self) -> Value {
        json!(self.0.map_or_else(|| "off".to_owned(), |a| a.to_string()))
    }
}

impl SettingType for Format {
    fn parse(given: &Given) -> Result<Self, String> {
        let v = given.one()?;
        v.parse()
            .map_err(|_| refuse(v, "expected `text` or `json`"))
    }

    fn show(&self) -> Value {
        json!(self.to_string())
    }
}

/// `log-level`: a level or a `tracing` filter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogFilter(pub String);

impl SettingType for LogFilter {
    fn parse(given: &Given) -> Result<Self, String> {
        let v = given.one()?;
        tracing_subscriber::EnvFilter::try_new(v).map_err(|e| {
            refuse(
                v,
                &format!(
                    "expected a level (`error`, `warn`, `info`, `debug`, `trace`) or a filter such as `info,resmgr=debug` ({e})"
                ),
            )
        })?;
        Ok(Self(v.to_owned()))
    }

    fn show(&self) -> Value {
        json!(self.0)
    }
}
