//! `resmgr run`'s configuration: command-line flags and an optional YAML file with the same keys.
//!
//! Every setting is a flag (`--reserved-cpus`) and a key of the file (`reserved-cpus`); a flag
//! given on the command line wins over the file, the file over the default. Values are checked
//! here, before anything starts, and a bad one is refused with a message naming where it came
//! from (the flag, or the file, key and line), the value, and what is allowed.

use std::{
    collections::BTreeMap,
    net::SocketAddr,
    path::{Path, PathBuf},
};

use policy::{
    TopologySource,
    topology_aware::{DeviceModel, Exclusivity, ReservedCpus},
};
use resmgr::kubelet_plugin::names::dns_subdomain;

use crate::values::{self, Format};

/// The NRI socket containerd and CRI-O listen on.
pub const DEFAULT_NRI_SOCKET: &str = "/var/run/nri/nri.sock";
/// The DRA driver name, also the CDI vendor.
pub const DEFAULT_DRIVER: &str = "topology-aware.resmgr.io";

/// `resmgr run`'s flags, as given (all optional: the file and defaults fill in).
#[derive(Debug, Default, Clone, clap::Args)]
pub struct RunFlags {
    /// A YAML file whose keys are these flags' names without `--`; flags win over it.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Print the effective configuration as JSON and exit, without starting anything.
    #[arg(long)]
    pub print_config: bool,
    /// This node's name [default: $NODE_NAME].
    #[arg(long)]
    pub node_name: Option<String>,
    /// The DRA driver name (also the CDI vendor) [default: topology-aware.resmgr.io].
    #[arg(long)]
    pub driver_name: Option<String>,
    /// The runtime's NRI socket [default: /var/run/nri/nri.sock].
    #[arg(long, value_name = "PATH")]
    pub nri_socket: Option<String>,
    /// Our NRI plugin index, two digits; plugins are called in index order [default: 90].
    #[arg(long, value_name = "NN")]
    pub nri_plugin_index: Option<String>,
    /// The kubelet's plugin directory [default: /var/lib/kubelet/plugins].
    #[arg(long, value_name = "DIR")]
    pub kubelet_plugins_dir: Option<String>,
    /// The kubelet's plugin registry [default: /var/lib/kubelet/plugins_registry].
    #[arg(long, value_name = "DIR")]
    pub kubelet_registry_dir: Option<String>,
    /// Where CDI specs are written [default: /var/run/cdi].
    #[arg(long, value_name = "DIR")]
    pub cdi_dir: Option<String>,
    /// Where the durable state lives [default: /var/lib/resmgr].
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<String>,
    /// A kubeconfig file; without one, the pod's service account is used.
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<String>,
    /// `live`, `synthetic:<description>` or `xml:<file>` [default: live].
    #[arg(long)]
    pub topology: Option<String>,
    /// CPUs for system pods: a count (`2`) or a cpuset (`0-1`) [default: 1].
    #[arg(long, value_name = "COUNT|CPUSET")]
    pub reserved_cpus: Option<String>,
    /// Address of /metrics, /healthz, /readyz and /debug/state [default: 127.0.0.1:8891].
    #[arg(long, value_name = "ADDR:PORT")]
    pub metrics_addr: Option<String>,
    /// `text` or `json` [default: text].
    #[arg(long, value_name = "FORMAT")]
    pub log_format: Option<String>,
    /// `true` to map each device's `cpu` capacity to the node's allocatable cpu in the
    /// published ResourceSlices (needs DRANodeAllocatableResources, Kubernetes 1.36) [default: false].
    #[arg(long, value_name = "BOOL")]
    pub node_allocatable_cpu: Option<String>,
    /// Who gets CPUs of their own: `claims` (DRA claims only; Guaranteed pods without one share),
    /// `partition` (claims get --claim-cpus, Guaranteed pods exclusive CPUs from the rest) or
    /// `pods` (Guaranteed pods, as nri-plugins; no devices published) [default: claims].
    #[arg(long, value_name = "MODE")]
    pub cpu_exclusivity: Option<String>,
    /// With `--cpu-exclusivity partition`: the CPUs published for claims, a count (`8`) or a
    /// cpuset (`8-15`).
    #[arg(long, value_name = "COUNT|CPUSET")]
    pub claim_cpus: Option<String>,
    /// `grouped` (one device per NUMA node or socket with consumable capacity `cpu`; needs
    /// DRAConsumableCapacity) or `individual` (one device per CPU; any cluster with DRA)
    /// [default: grouped].
    #[arg(long, value_name = "MODE")]
    pub device_mode: Option<String>,
    /// What a grouped device stands for: `numa` or `socket` [default: numa].
    #[arg(long, value_name = "GROUP")]
    pub group_by: Option<String>,
    /// The smallest amount a claim gets: `cpu` (a hardware thread) or `core` (whole cores only,
    /// which the scheduler then accounts for) [default: cpu].
    #[arg(long, value_name = "UNIT")]
    pub claim_granularity: Option<String>,
}

/// The keys of the config file, which are the flags' names.
pub const KEYS: [&str; 19] = [
    "node-name",
    "driver-name",
    "nri-socket",
    "nri-plugin-index",
    "kubelet-plugins-dir",
    "kubelet-registry-dir",
    "cdi-dir",
    "state-dir",
    "kubeconfig",
    "topology",
    "reserved-cpus",
    "metrics-addr",
    "log-format",
    "node-allocatable-cpu",
    "cpu-exclusivity",
    "claim-cpus",
    "device-mode",
    "group-by",
    "claim-granularity",
];

/// The checked configuration of `resmgr run`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct RunConfig {
    pub node_name: String,
    pub driver_name: String,
    pub nri_socket: PathBuf,
    pub nri_plugin_index: String,
    pub kubelet_plugins_dir: PathBuf,
    pub kubelet_registry_dir: PathBuf,
    pub cdi_dir: PathBuf,
    pub state_dir: PathBuf,
    pub kubeconfig: Option<PathBuf>,
    #[serde(serialize_with = "show_topology")]
    pub topology: TopologySource,
    #[serde(serialize_with = "show_reserved")]
    pub reserved_cpus: ReservedCpus,
    pub metrics_addr: SocketAddr,
    #[serde(serialize_with = "show_format")]
    pub log_format: Format,
    pub node_allocatable_cpu: bool,
    #[serde(flatten, serialize_with = "show_policy")]
    pub policy: (Exclusivity, DeviceModel),
}

fn show_policy<S: serde::Serializer>(
    (exclusivity, devices): &(Exclusivity, DeviceModel),
    s: S,
) -> Result<S::Ok, S::Error> {
    use serde::ser::SerializeMap as _;
    let values = values::show_policy_settings(exclusivity, devices);
    let keys = [
        "cpu_exclusivity",
        "claim_cpus",
        "device_mode",
        "group_by",
        "claim_granularity",
    ];
    let mut map = s.serialize_map(Some(keys.len()))?;
    for (key, value) in keys.iter().zip(&values) {
        map.serialize_entry(key, value)?;
    }
    map.end()
}

fn show_topology<S: serde::Serializer>(t: &TopologySource, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&match t {
        TopologySource::Live => "live".to_owned(),
        TopologySource::Synthetic(d) => format!("synthetic:{d}"),
        TopologySource::Xml(p) => format!("xml:{}", p.display()),
    })
}

fn show_reserved<S: serde::Serializer>(r: &ReservedCpus, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&values::show_reserved(r))
}

fn show_format<S: serde::Serializer>(f: &Format, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&f.to_string())
}

/// Where a value came from, for messages.
#[derive(Debug, Clone)]
enum Origin {
    Flag(&'static str),
    File {
        path: PathBuf,
        key: &'static str,
        line: Option<usize>,
    },
    Env(&'static str, &'static str),
    Default(&'static str),
}

impl Origin {
    fn key(&self) -> &'static str {
        match self {
            Self::Flag(key) | Self::File { key, .. } | Self::Env(_, key) | Self::Default(key) => {
                key
            }
        }
    }

    fn describe(&self) -> String {
        match self {
            Self::Flag(key) => format!("--{key}"),
            Self::File { path, key, line } => match line {
                Some(line) => format!("config file {}: line {line}: {key}", path.display()),
                None => format!("config file {}: {key}", path.display()),
            },
            Self::Env(var, key) => format!("{var} (the default of --{key})"),
            Self::Default(key) => format!("the default of --{key}"),
        }
    }
}

/// The config file: the keys it sets, as text, with their lines.
#[derive(Debug, Default)]
struct FileValues {
    path: PathBuf,
    values: BTreeMap<String, (String, Option<usize>)>,
}

impl FileValues {
    fn read(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| anyhow::anyhow!("--config {}: cannot read it: {e}", path.display()))?;
        Self::parse(path, &text)
    }

    fn parse(path: &Path, text: &str) -> anyhow::Result<Self> {
        let where_ = || format!("config file {}", path.display());
        let doc: serde_yaml_ng::Value = serde_yaml_ng::from_str(text)
            .map_err(|e| anyhow::anyhow!("{}: not valid YAML: {e}", where_()))?;
        let map = match doc {
            serde_yaml_ng::Value::Null => return Ok(Self::default()),
            serde_yaml_ng::Value::Mapping(map) => map,
            _ => anyhow::bail!(
                "{}: expected a mapping of settings (`key: value` lines) at the top level",
                where_()
            ),
        };
        let mut values = BTreeMap::new();
        for (key, value) in map {
            let serde_yaml_ng::Value::String(key) = key else {
                anyhow::bail!("{}: keys must be strings, found {key:?}", where_());
            };
            let line = line_of_key(text, &key);
            let at = match line {
                Some(l) => format!("{}: line {l}", where_()),
                None => where_(),
            };
            if !KEYS.contains(&key.as_str()) {
                anyhow::bail!(
                    "{at}: unknown key {key:?}: the keys are {}",
                    KEYS.join(", ")
                );
            }
            let value = match value {
                serde_yaml_ng::Value::String(s) => s,
                serde_yaml_ng::Value::Number(n) => n.to_string(),
                serde_yaml_ng::Value::Bool(b) => b.to_string(),
                other => anyhow::bail!(
                    "{at}: {key}: expected a single value (a string or a number), found {}",
                    kind_of(&other)
                ),
            };
            values.insert(key, (value, line));
        }
        Ok(Self {
            path: path.to_owned(),
            values,
        })
    }
}

fn kind_of(v: &serde_yaml_ng::Value) -> &'static str {
    match v {
        serde_yaml_ng::Value::Null => "nothing (null)",
        serde_yaml_ng::Value::Sequence(_) => "a list",
        serde_yaml_ng::Value::Mapping(_) => "a mapping",
        _ => "a tagged value",
    }
}

/// The 1-based line where a top-level `key:` is written, if it can be found.
fn line_of_key(text: &str, key: &str) -> Option<usize> {
    text.lines()
        .position(|l| {
            l.strip_prefix(key)
                .is_some_and(|rest| rest.trim_start().starts_with(':'))
                || l.strip_prefix(&format!("\"{key}\""))
                    .is_some_and(|rest| rest.trim_start().starts_with(':'))
        })
        .map(|i| i + 1)
}

impl RunFlags {
    /// Merges flags, the config file they name, and the defaults, and checks every value.
    /// `node_name_env` is `$NODE_NAME` (passed in: only `main` reads the environment).
    pub fn resolve(&self, node_name_env: Option<String>) -> anyhow::Result<RunConfig> {
        let file = match &self.config {
            Some(path) => FileValues::read(path)?,
            None => FileValues::default(),
        };
        let flags: [(&'static str, &Option<String>); 19] = [
            ("node-name", &self.node_name),
            ("driver-name", &self.driver_name),
            ("nri-socket", &self.nri_socket),
            ("nri-plugin-index", &self.nri_plugin_index),
            ("kubelet-plugins-dir", &self.kubelet_plugins_dir),
            ("kubelet-registry-dir", &self.kubelet_registry_dir),
            ("cdi-dir", &self.cdi_dir),
            ("state-dir", &self.state_dir),
            ("kubeconfig", &self.kubeconfig),
            ("topology", &self.topology),
            ("reserved-cpus", &self.reserved_cpus),
            ("metrics-addr", &self.metrics_addr),
            ("log-format", &self.log_format),
            ("node-allocatable-cpu", &self.node_allocatable_cpu),
            ("cpu-exclusivity", &self.cpu_exclusivity),
            ("claim-cpus", &self.claim_cpus),
            ("device-mode", &self.device_mode),
            ("group-by", &self.group_by),
            ("claim-granularity", &self.claim_granularity),
        ];
        let get =
            |key: &'static str, default: Option<(String, Origin)>| -> Option<(String, Origin)> {
                if let Some((_, Some(v))) = flags.iter().find(|(k, _)| *k == key) {
                    return Some((v.clone(), Origin::Flag(key)));
                }
                if let Some((v, line)) = file.values.get(key) {
                    return Some((
                        v.clone(),
                        Origin::File {
                            path: file.path.clone(),
                            key,
                            line: *line,
                        },
                    ));
                }
                default
            };
        let fixed = |key: &'static str, v: &str| Some((v.to_owned(), Origin::Default(key)));
        let refuse = |origin: &Origin, value: &str, allowed: &str| {
            anyhow::anyhow!("{}: {value:?} is not allowed: {allowed}", origin.describe())
        };

        let node_env = node_name_env
            .filter(|v| !v.is_empty())
            .map(|v| (v, Origin::Env("NODE_NAME", "node-name")));
        let Some((node_name, origin)) = get("node-name", node_env) else {
            anyhow::bail!(
                "--node-name is not set, nor NODE_NAME, nor node-name in a config file: the node's name is needed to publish its devices (a DNS subdomain such as `worker-1`)"
            );
        };
        if dns_subdomain(&node_name, 253).is_err() {
            return Err(refuse(
                &origin,
                &node_name,
                "expected the node's name, a DNS subdomain (lower-case letters, digits, `-` and `.`, at most 253 characters)",
            ));
        }

        let (driver_name, origin) =
            get("driver-name", fixed("driver-name", DEFAULT_DRIVER)).unwrap_or_default_pair();
        if dns_subdomain(&driver_name, 63).is_err() || !driver_name.contains('.') {
            return Err(refuse(
                &origin,
                &driver_name,
                "expected a DNS subdomain with at least one dot and at most 63 characters, such as `topology-aware.resmgr.io`",
            ));
        }

        let path = |key: &'static str, default: &str| -> anyhow::Result<PathBuf> {
            let (value, origin) = get(key, fixed(key, default)).unwrap_or_default_pair();
            if value.trim().is_empty() || value.contains('\0') {
                return Err(refuse(&origin, &value, "expected a non-empty path"));
            }
            Ok(PathBuf::from(value))
        };
        let nri_socket = path("nri-socket", DEFAULT_NRI_SOCKET)?;
        let kubelet_plugins_dir = path("kubelet-plugins-dir", "/var/lib/kubelet/plugins")?;
        let kubelet_registry_dir =
            path("kubelet-registry-dir", "/var/lib/kubelet/plugins_registry")?;
        let cdi_dir = path("cdi-dir", "/var/run/cdi")?;
        let state_dir = path("state-dir", "/var/lib/resmgr")?;
        let kubeconfig = match get("kubeconfig", None) {
            None => None,
            Some((value, origin)) => {
                if value.trim().is_empty() || value.contains('\0') {
                    return Err(refuse(
                        &origin,
                        &value,
                        "expected the path of a kubeconfig file",
                    ));
                }
                Some(PathBuf::from(value))
            }
        };

        let (index, origin) =
            get("nri-plugin-index", fixed("nri-plugin-index", "90")).unwrap_or_default_pair();
        if index.len() != 2 || !index.bytes().all(|b| b.is_ascii_digit()) {
            return Err(refuse(
                &origin,
                &index,
                "expected exactly two digits, `00` to `99` (plugins are called in index order)",
            ));
        }

        let (value, origin) = get("topology", fixed("topology", "live")).unwrap_or_default_pair();
        let topology = values::topology(&value, None)
            .map_err(|e| anyhow::anyhow!("{}: {e}", origin.describe()))?;

        let (value, origin) =
            get("reserved-cpus", fixed("reserved-cpus", "1")).unwrap_or_default_pair();
        let reserved_cpus = values::reserved_cpus(&value)
            .map_err(|e| anyhow::anyhow!("{}: {e}", origin.describe()))?;

        let (value, origin) =
            get("metrics-addr", fixed("metrics-addr", "127.0.0.1:8891")).unwrap_or_default_pair();
        let metrics_addr: SocketAddr = value.parse().map_err(|_| {
            refuse(
                &origin,
                &value,
                "expected an IP address and port such as `127.0.0.1:8891` or `[::]:8891` (port 0 picks a free one)",
            )
        })?;

        let (value, origin) =
            get("log-format", fixed("log-format", "text")).unwrap_or_default_pair();
        let log_format: Format = value
            .parse()
            .map_err(|_| refuse(&origin, &value, "expected `text` or `json`"))?;

        let (value, origin) = get(
            "node-allocatable-cpu",
            fixed("node-allocatable-cpu", "false"),
        )
        .unwrap_or_default_pair();
        let node_allocatable_cpu: bool = value
            .parse()
            .map_err(|_| refuse(&origin, &value, "expected `true` or `false`"))?;

        let given = |key| get(key, None);
        let policy_keys = [
            given("cpu-exclusivity"),
            given("claim-cpus"),
            given("device-mode"),
            given("group-by"),
            given("claim-granularity"),
        ];
        let value = |i: usize| policy_keys[i].as_ref().map(|(v, _)| v.as_str());
        let policy = values::policy_settings(&values::PolicyValues {
            cpu_exclusivity: value(0),
            claim_cpus: value(1),
            device_mode: value(2),
            group_by: value(3),
            claim_granularity: value(4),
        })
        .map_err(|e| {
            let origin = policy_keys
                .iter()
                .flatten()
                .find(|(_, o)| o.key() == e.key)
                .map_or_else(|| format!("--{}", e.key), |(_, o)| o.describe());
            anyhow::anyhow!("{origin}: {}", e.reason)
        })?;

        Ok(RunConfig {
            node_name,
            driver_name,
            nri_socket,
            nri_plugin_index: index,
            kubelet_plugins_dir,
            kubelet_registry_dir,
            cdi_dir,
            state_dir,
            kubeconfig,
            topology,
            reserved_cpus,
            metrics_addr,
            log_format,
            node_allocatable_cpu,
            policy,
        })
    }
}

/// Every key with a default has one; this unwraps that pair without a panic path.
trait OrDefaultPair {
    fn unwrap_or_default_pair(self) -> (String, Origin);
}

impl OrDefaultPair for Option<(String, Origin)> {
    fn unwrap_or_default_pair(self) -> (String, Origin) {
        self.unwrap_or_else(|| (String::new(), Origin::Default("?")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flags() -> RunFlags {
        RunFlags {
            node_name: Some("node-1".into()),
            ..RunFlags::default()
        }
    }

    #[test]
    fn defaults() {
        let c = flags().resolve(None).unwrap();
        assert_eq!(c.driver_name, DEFAULT_DRIVER);
        assert_eq!(c.nri_plugin_index, "90");
        assert_eq!(c.cdi_dir, PathBuf::from("/var/run/cdi"));
        assert_eq!(c.state_dir, PathBuf::from("/var/lib/resmgr"));
        assert_eq!(c.metrics_addr, "127.0.0.1:8891".parse().unwrap());
        assert_eq!(c.topology, TopologySource::Live);
        assert_eq!(c.reserved_cpus, ReservedCpus::Count(1));
        assert_eq!(c.log_format, Format::Text);
        assert_eq!(c.kubeconfig, None);
    }

    #[test]
    fn node_name_from_the_environment_unless_given() {
        let mut f = RunFlags::default();
        assert_eq!(
            f.resolve(Some("env-node".into())).unwrap().node_name,
            "env-node"
        );
        assert!(f.resolve(None).is_err());
        f.node_name = Some("flag-node".into());
        assert_eq!(
            f.resolve(Some("env-node".into())).unwrap().node_name,
            "flag-node"
        );
    }

    #[test]
    fn file_keys_with_lines_flags_win() {
        let text =
            "topology: synthetic:pack:1 core:2 pu:1\nnri-plugin-index: 10\nlog-format: json\n";
        let file = FileValues::parse(Path::new("/c.yaml"), text).unwrap();
        assert_eq!(file.values["nri-plugin-index"], ("10".to_owned(), Some(2)));
        let e = FileValues::parse(Path::new("/c.yaml"), "log-format: json\nbogus: 1\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("line 2") && e.contains("\"bogus\"") && e.contains("node-name"),
            "{e}"
        );
        let e = FileValues::parse(Path::new("/c.yaml"), "topology: [a]\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("line 1: topology: expected a single value"),
            "{e}"
        );
    }
}
