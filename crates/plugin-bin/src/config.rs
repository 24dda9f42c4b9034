//! `resmgr run`'s configuration: command-line flags and a YAML file with the same keys.
//!
//! The settings themselves, the types of their values, their defaults and their documentation
//! are listed once in [`crate::settings`]; this module turns flags, the file and those defaults
//! into a checked [`RunConfig`], reading each value with its setting's type and checking the
//! rules between settings (`reserved-cpus` or `reserved-cpu-count`, the policy's settings
//! together, `node-name` with DRA). With DRA on, what serving claims needs is one value,
//! [`DraConfig`], checked here: [`RunConfig::dra`] is `None` without DRA, and nothing downstream
//! asks again whether DRA is on or a node name is set. Every setting is a flag (`--reserved-cpus`) and a key of the file
//! (`reserved-cpus`); a flag given on the command line wins over the file, the file over the
//! default. The file starts with an `apiVersion`/`kind` header, so that its format can evolve,
//! and a key the agent does not know is refused by name, so a typo cannot go unnoticed. Values
//! are checked here, before anything starts, and a bad one is refused with a message naming
//! where it came from (the flag, or the file, line and key), the value, and what is allowed.

use std::{
    collections::BTreeMap,
    net::SocketAddr,
    path::{Path, PathBuf},
    time::Duration,
};

use crate::{
    settings::{
        self, API_VERSION, KIND, SETTINGS, Setting, Shape, Typed,
        types::{Given, SettingType},
    },
    values::{self, ExclusivityMode, Format},
};
use anyhow::Context as _;
use kube_dra::{PublisherConfig, metadata::MetadataVersion};
use kubelet_plugin::KubeletConfig;
use policy::{
    Topology, TopologySource,
    topology_aware::{
        Config, ConfigError, DeviceMode, DeviceModel, Exclusivity, MemoryConfig, ReservedCpus,
    },
};
use resmgr::{ManagerConfig, ReconcileConfig, health::HealthConfig, metadata::MetadataStore};

/// The DRA driver name, also the CDI vendor (the default of `driver-name`).
pub const DEFAULT_DRIVER: &str = "topology-aware.resmgr.io";

/// `resmgr run`'s flags, as given (all optional: the file and defaults fill in). The flags
/// other than `--config` and `--print-config` come from [`SETTINGS`].
#[derive(Debug, Default, Clone)]
pub struct RunFlags {
    /// The config file.
    pub config: Option<PathBuf>,
    /// Print the resolved configuration and exit.
    pub print_config: bool,
    /// The settings given as flags, by key.
    pub values: BTreeMap<&'static str, String>,
}

impl RunFlags {
    /// Sets a flag, as if given on the command line (for tests and callers that build flags).
    #[cfg(test)]
    pub fn with(mut self, key: &'static str, value: &str) -> Self {
        assert!(settings::find(key).is_some(), "no setting {key}");
        self.values.insert(key, value.to_owned());
        self
    }
}

impl RunFlags {
    /// `--config` and a flag per setting of [`SETTINGS`]: the agent's settings, for `resmgr run`
    /// and for every command that shows what the agent would do with them (`resmgr slices`).
    pub fn setting_args(cmd: clap::Command) -> clap::Command {
        let cmd = cmd.arg(
            clap::Arg::new("config")
                .long("config")
                .value_name("FILE")
                .value_parser(clap::value_parser!(PathBuf))
                .help(
                    "A YAML file setting any of the flags below by name (without `--`); \
                     flags win over it. `resmgr config --print-defaults` prints one",
                ),
        );
        SETTINGS.iter().fold(cmd, |cmd, s| {
            cmd.arg(
                clap::Arg::new(s.key)
                    .long(s.key)
                    .value_name(s.value_name)
                    .help(s.help())
                    .help_heading(s.section.title()),
            )
        })
    }

    /// The settings [`RunFlags::setting_args`] parsed (`print_config` off).
    pub fn settings_from(matches: &clap::ArgMatches) -> Self {
        let mut values = BTreeMap::new();
        for s in SETTINGS {
            if let Some(v) = matches.get_one::<String>(s.key) {
                values.insert(s.key, v.clone());
            }
        }
        Self {
            config: matches.get_one::<PathBuf>("config").cloned(),
            print_config: false,
            values,
        }
    }
}

impl clap::FromArgMatches for RunFlags {
    fn from_arg_matches(matches: &clap::ArgMatches) -> Result<Self, clap::Error> {
        Ok(Self {
            print_config: matches.get_flag("print-config"),
            ..Self::settings_from(matches)
        })
    }

    fn update_from_arg_matches(&mut self, matches: &clap::ArgMatches) -> Result<(), clap::Error> {
        *self = Self::from_arg_matches(matches)?;
        Ok(())
    }
}

impl clap::Args for RunFlags {
    fn augment_args(cmd: clap::Command) -> clap::Command {
        Self::setting_args(cmd).arg(
            clap::Arg::new("print-config")
                .long("print-config")
                .action(clap::ArgAction::SetTrue)
                .help(
                    "Print the resolved configuration as a config file and exit, without \
                     starting anything",
                ),
        )
    }

    fn augment_args_for_update(cmd: clap::Command) -> clap::Command {
        Self::augment_args(cmd)
    }
}

/// The checked configuration of `resmgr run`, and the configurations of the parts it is built
/// from ([`RunConfig::manager`], [`RunConfig::publisher`], ...), each checked when the settings
/// are resolved: what `resmgr run` builds from them fails only on the machine, never on a value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunConfig {
    /// What serving the kubelet's claims needs; `None` with `dra: false` (the agent is an NRI
    /// plugin only).
    pub dra: Option<DraConfig>,
    /// The agent's pod, when it may hand the node over and take it over
    /// ([`resmgr::handover`]).
    pub pod_uid: Option<String>,
    /// The DaemonSet template generation of the agent's pod: an agent of an older one is never
    /// handed the node.
    pub pod_generation: Option<u64>,
    /// The DRA driver name, also the CDI vendor of our specs (with DRA off too).
    pub driver_name: String,
    pub nri_socket: PathBuf,
    pub nri_plugin_index: String,
    pub cdi_dir: PathBuf,
    pub expose_pcie_roots: bool,
    pub topology: TopologySource,
    /// `sysfs-root` as given; see [`RunConfig::sysfs_root`].
    pub sysfs_root_given: Option<PathBuf>,
    pub reserved_cpus: ReservedCpus,
    pub reserved_namespaces: Vec<String>,
    /// `cpu-exclusivity` with `claim-cpus`, and `device-mode`, `group-by`, `claim-granularity`.
    pub policy: (Exclusivity, DeviceModel),
    /// `reserved-memory`, `claim-memory`, `claim-hugepages`.
    pub memory: MemoryConfig,
    pub state_dir: PathBuf,
    /// How long an unconfirmed claim nothing wants is kept ([`resmgr::reconcile`]).
    pub unconfirmed_claim_grace: std::time::Duration,
    pub metrics_addr: SocketAddr,
    /// None: `/debug/state` is not served (`off`).
    pub debug_addr: Option<SocketAddr>,
    pub log_format: Format,
    pub log_level: String,
    /// Where each setting came from, for messages about values checked later (at start-up).
    origins: BTreeMap<&'static str, String>,
    /// Each setting's value as its type writes it back ([`RunConfig::values`]).
    shown: BTreeMap<&'static str, serde_json::Value>,
}

impl RunConfig {
    /// Where `key`'s value came from: `--key`, `config file F: line N: key`, or its default.
    pub fn origin(&self, key: &str) -> String {
        self.origins
            .get(key)
            .cloned()
            .unwrap_or_else(|| format!("--{key}"))
    }

    /// The resource manager's configuration.
    pub fn manager(&self) -> ManagerConfig {
        ManagerConfig {
            reconcile: ReconcileConfig {
                // Our slices publish in a pool named after the node.
                pool: self.dra.as_ref().map(|dra| dra.node_name.clone()),
                grace: self.unconfirmed_claim_grace,
                period: (self.unconfirmed_claim_grace / 4)
                    .clamp(Duration::from_millis(100), Duration::from_secs(30)),
            },
            metadata: self.metadata_store(),
            ..ManagerConfig::new(&self.driver_name)
        }
    }

    /// Where prepared claims' device metadata goes: the driver's directory under the kubelet's
    /// plugins (`<kubelet-plugins-dir>/<driver>/dra-device-metadata`, which the chart mounts at
    /// the host's path, as CDI mounts need); `None` without DRA or with `device-metadata: []`.
    pub fn metadata_store(&self) -> Option<MetadataStore> {
        let dra = self.dra.as_ref()?;
        (!dra.device_metadata.is_empty()).then(|| {
            MetadataStore::new(
                dra.kubelet
                    .plugins_dir
                    .join(&self.driver_name)
                    .join(resmgr::metadata::SUBDIR),
                &self.driver_name,
                dra.device_metadata.clone(),
            )
        })
    }

    /// The store of our CDI specs.
    pub fn spec_store(&self) -> Result<cdi::SpecStore, cdi::StoreError> {
        cdi::SpecStore::new(&self.cdi_dir, &self.driver_name)
    }

    /// How the agent registers with the runtime: as the external plugin `resmgr`, at its index.
    pub fn nri_stub(&self) -> nri::StubConfig {
        nri::StubConfig::new("resmgr", self.nri_plugin_index.clone())
    }

    /// The sysfs the agent reads: `sysfs-root`, else `/sys` for the live machine, else none.
    pub fn sysfs_root(&self) -> Option<PathBuf> {
        sysfs_root(self.sysfs_root_given.as_deref(), &self.topology)
    }

    /// The policy the settings ask for, on the topology they name, holding nothing yet. The
    /// settings that depend on the machine are checked here, naming where they came from: the
    /// topology, reserved CPUs that are not online, what the policy refuses of its settings.
    pub fn policy(&self) -> anyhow::Result<Box<dyn policy::Policy>> {
        let sysfs_root = self.sysfs_root();
        let topology = Topology::load_with_sysfs(&self.topology, sysfs_root.as_deref())
            .with_context(|| {
                format!(
                    "{} {}",
                    self.origin("topology"),
                    values::show_topology(&self.topology)
                )
            })?;
        let reserved_key = match self.reserved_cpus {
            ReservedCpus::Set(_) => "reserved-cpus",
            ReservedCpus::Count(_) => "reserved-cpu-count",
        };
        check_reserved(&self.reserved_cpus, &topology)
            .map_err(|e| anyhow::anyhow!("{} {e}", self.origin(reserved_key)))?;
        #[allow(
            clippy::needless_update,
            reason = "settings the agent does not configure keep the policy's defaults"
        )]
        crate::policy_choice::build(
            topology,
            Config {
                reserved_cpus: self.reserved_cpus.clone(),
                driver: self.driver_name.clone(),
                reserved_namespaces: self.reserved_namespaces.clone(),
                exclusivity: self.policy.0.clone(),
                devices: DeviceModel {
                    pcie_roots: self.expose_pcie_roots,
                    ..self.policy.1
                },
                memory: self.memory.clone(),
                ..Config::default()
            },
        )
        .map_err(|e| match e {
            ConfigError::ClaimCpus(_) => anyhow::anyhow!("{}: {e}", self.origin("claim-cpus")),
            _ => anyhow::anyhow!("{}: {e}", self.origin(reserved_key)),
        })
    }

    /// Checks what the libraries would refuse of the parts built from the settings, so that
    /// building them at start-up cannot fail on a value.
    fn check_parts(&self) -> anyhow::Result<()> {
        self.spec_store().map_err(|e| {
            anyhow::anyhow!(
                "{}: {}",
                self.origin("driver-name"),
                stdx::errors::chain(&e)
            )
        })?;
        if let Some(dra) = &self.dra {
            dra.publisher.validate().map_err(|e| {
                let key = match e.field {
                    "driver" => "driver-name",
                    "node name" => "node-name",
                    _ => "node-allocatable-cpu",
                };
                anyhow::anyhow!("{}: {e}", self.origin(key))
            })?;
        }
        Ok(())
    }

    /// Every setting with its value as its type writes it back, in [`SETTINGS`] order (`null`
    /// for unset ones): what the settings resolved to, kept as they were resolved.
    pub fn values(&self) -> Vec<(&'static str, serde_json::Value)> {
        SETTINGS
            .iter()
            .map(|s| {
                let value = self.shown.get(s.key).cloned();
                (s.key, value.unwrap_or(serde_json::Value::Null))
            })
            .collect()
    }

    /// The configuration as a config file that resolves to it: what `--print-config` prints.
    pub fn to_file(&self) -> String {
        let mut map = serde_yaml_ng::Mapping::new();
        map.insert("apiVersion".into(), API_VERSION.into());
        map.insert("kind".into(), KIND.into());
        for (key, value) in self.values() {
            if !value.is_null() {
                // A JSON value always converts to YAML.
                let value = serde_yaml_ng::to_value(&value).unwrap_or_default();
                map.insert(key.into(), value);
            }
        }
        serde_yaml_ng::to_string(&map).unwrap_or_default()
    }

    /// The configuration as one JSON object, for the start-up log line.
    pub fn to_json(&self) -> String {
        let map: serde_json::Map<String, serde_json::Value> = self
            .values()
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v))
            .collect();
        serde_json::Value::Object(map).to_string()
    }
}

/// DRA on: everything serving the kubelet's claims needs, each part's configuration built and
/// checked when the settings are resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DraConfig {
    /// The node's name: the pool our ResourceSlices publish, and the node Events are about.
    pub node_name: String,
    /// The API client's kubeconfig; `None`: the pod's service account.
    pub kubeconfig: Option<PathBuf>,
    /// The kubelet plugin's sockets: the driver's name, the kubelet's directories, the pod.
    pub kubelet: KubeletConfig,
    /// What the slice publisher publishes for the node (checked as the API server would).
    pub publisher: PublisherConfig,
    /// How the published devices' health is told.
    pub health: HealthConfig,
    /// How the published devices are shaped, for telling which fields a cluster drops.
    pub device_mode: DeviceMode,
    /// Mark the node's pods that wait for their claims once the agent serves.
    pub retry_waiting_pods: bool,
    /// The device metadata versions each file holds, newest first; none: no metadata.
    pub device_metadata: Vec<MetadataVersion>,
}

/// The sysfs the agent reads: `sysfs-root` as given, else `/sys` for the live machine, else none.
fn sysfs_root(given: Option<&Path>, topology: &TopologySource) -> Option<PathBuf> {
    given
        .map(Path::to_path_buf)
        .or_else(|| matches!(topology, TopologySource::Live).then(|| PathBuf::from("/sys")))
}

/// Where a value came from, for messages. Ordered by precedence, lowest first.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Origin {
    Default(&'static str),
    Env(&'static str, &'static str),
    File {
        path: PathBuf,
        key: &'static str,
        line: Option<usize>,
    },
    Flag(&'static str),
}

impl Origin {
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

    /// Precedence: a flag over the file over the environment and the default.
    fn rank(&self) -> u8 {
        match self {
            Self::Default(_) | Self::Env(..) => 0,
            Self::File { .. } => 1,
            Self::Flag(_) => 2,
        }
    }
}

/// The config file: the keys it sets, with their lines.
#[derive(Debug, Default)]
struct FileValues {
    path: PathBuf,
    values: BTreeMap<String, (Given, Option<usize>)>,
}

impl FileValues {
    fn read(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| anyhow::anyhow!("--config {}: cannot read it: {e}", path.display()))?;
        Self::parse(path, &text)
    }

    fn parse(path: &Path, text: &str) -> anyhow::Result<Self> {
        use serde_yaml_ng::Value;
        let where_ = || format!("config file {}", path.display());
        let doc: Value = serde_yaml_ng::from_str(text)
            .map_err(|e| anyhow::anyhow!("{}: not valid YAML: {e}", where_()))?;
        let map = match doc {
            Value::Null => return Ok(Self::default()),
            Value::Mapping(map) => map,
            _ => anyhow::bail!(
                "{}: expected a mapping of settings (`key: value` lines) at the top level",
                where_()
            ),
        };
        let at = |key: &str| match line_of_key(text, key) {
            Some(l) => format!("{}: line {l}", where_()),
            None => where_(),
        };
        let header = |key: &str, want: &str| -> anyhow::Result<()> {
            match map.get(key) {
                Some(Value::String(v)) if v == want => Ok(()),
                Some(other) => anyhow::bail!(
                    "{}: {key} {}: this agent reads `{key}: {want}`",
                    at(key),
                    serde_yaml_ng::to_string(other)
                        .unwrap_or_default()
                        .trim_end()
                ),
                None => anyhow::bail!(
                    "{}: no `{key}: {want}`: a config file starts with the two lines \
                     `apiVersion: {API_VERSION}` and `kind: {KIND}`",
                    where_()
                ),
            }
        };
        header("apiVersion", API_VERSION)?;
        header("kind", KIND)?;
        let mut values = BTreeMap::new();
        for (key, value) in map {
            let Value::String(key) = key else {
                anyhow::bail!("{}: keys must be strings, found {key:?}", where_());
            };
            if key == "apiVersion" || key == "kind" {
                continue;
            }
            let line = line_of_key(text, &key);
            let at = at(&key);
            let Some(setting) = settings::find(&key) else {
                anyhow::bail!(
                    "{at}: unknown key {key:?}: the keys are {}",
                    settings::keys().join(", ")
                );
            };
            let scalar = |v: &Value| -> Option<String> {
                match v {
                    Value::String(s) => Some(s.clone()),
                    Value::Number(n) => Some(n.to_string()),
                    Value::Bool(b) => Some(b.to_string()),
                    _ => None,
                }
            };
            let raw = match (&value, setting.shape) {
                (Value::Sequence(items), Shape::List) => {
                    let mut list = Vec::new();
                    for item in items {
                        let Some(s) = scalar(item) else {
                            anyhow::bail!(
                                "{at}: {key}: expected a list of single values, found {} in it",
                                kind_of(item)
                            );
                        };
                        list.push(s);
                    }
                    Given::List(list)
                }
                (v, shape) => match scalar(v) {
                    Some(s) => Given::One(s),
                    None => anyhow::bail!(
                        "{at}: {key}: expected {}, found {}",
                        match shape {
                            Shape::Scalar => "a single value (a string, a number or a boolean)",
                            Shape::List => "a list, or one value",
                        },
                        kind_of(v)
                    ),
                },
            };
            values.insert(key, (raw, line));
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
        serde_yaml_ng::Value::Tagged(_) => "a tagged value",
        _ => "a single value",
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

/// Flags, the file and the defaults, looked up by key in order of precedence.
struct Sources<'a> {
    flags: &'a BTreeMap<&'static str, String>,
    file: FileValues,
}

impl Sources<'_> {
    /// The value of `setting` and where it came from: a flag, the file, or the setting's
    /// default (`None` when it has none).
    fn get(&self, setting: &Setting) -> anyhow::Result<Option<(Given, Origin)>> {
        let key = setting.key;
        if let Some(v) = self.flags.get(key) {
            return Ok(Some((Given::One(v.clone()), Origin::Flag(key))));
        }
        if let Some((v, line)) = self.file.values.get(key) {
            let origin = Origin::File {
                path: self.file.path.clone(),
                key,
                line: *line,
            };
            return Ok(Some((v.clone(), origin)));
        }
        let default = setting
            .default_given()
            .map_err(|e| anyhow::anyhow!("internal: the default of {key}: {e}"))?;
        Ok(default.map(|v| (v, Origin::Default(key))))
    }
}

/// Reads each setting as its type ([`settings::types`]), and keeps, for every setting, where its
/// value came from and the value as its type writes it back: what [`RunConfig::values`] prints
/// is the value resolved, by construction.
struct Resolver<'a> {
    src: Sources<'a>,
    origins: BTreeMap<&'static str, String>,
    shown: BTreeMap<&'static str, serde_json::Value>,
}

impl Resolver<'_> {
    /// Where `setting`'s value comes from, and the value as given; `None` when it is not set and
    /// has no default.
    fn lookup<T>(&self, setting: &Typed<T>) -> anyhow::Result<Option<(Given, Origin)>> {
        self.src.get(setting)
    }

    /// Reads `given` (from `origin`) as `setting`'s type.
    fn parse<T: SettingType>(
        _setting: &Typed<T>,
        given: &Given,
        origin: &Origin,
    ) -> anyhow::Result<T> {
        T::parse(given).map_err(|e| anyhow::anyhow!("{}: {e}", origin.describe()))
    }

    /// Keeps `value` as `setting`'s, given at `origin` (`None`: a default that depends on other
    /// settings).
    fn record<T: SettingType>(&mut self, setting: &Typed<T>, value: &T, origin: Option<&Origin>) {
        self.shown.insert(setting.key, value.show());
        if let Some(origin) = origin {
            self.origins.insert(setting.key, origin.describe());
        }
    }

    /// Keeps `setting` as unset.
    fn unset<T>(&mut self, setting: &Typed<T>) {
        self.shown.insert(setting.key, serde_json::Value::Null);
    }

    /// The value of a setting, read and kept; `None` (kept as unset) when it is not set and has
    /// no default.
    fn optional<T: SettingType>(&mut self, setting: &Typed<T>) -> anyhow::Result<Option<T>> {
        let Some((given, origin)) = self.lookup(setting)? else {
            self.unset(setting);
            return Ok(None);
        };
        let value = Self::parse(setting, &given, &origin)?;
        self.record(setting, &value, Some(&origin));
        Ok(Some(value))
    }

    /// The value of a setting that has a default, read and kept.
    fn take<T: SettingType>(&mut self, setting: &Typed<T>) -> anyhow::Result<T> {
        self.optional(setting)?
            .ok_or_else(|| anyhow::anyhow!("internal: setting {:?} has no default", setting.key))
    }

    /// The value of a setting that has a default, read but not kept yet, with its origin.
    fn peek<T: SettingType>(&self, setting: &Typed<T>) -> anyhow::Result<(T, Origin)> {
        let (given, origin) = self
            .lookup(setting)?
            .ok_or_else(|| anyhow::anyhow!("internal: setting {:?} has no default", setting.key))?;
        Ok((Self::parse(setting, &given, &origin)?, origin))
    }
}

impl RunFlags {
    /// Merges flags, the config file they name, and the defaults, and checks every value.
    /// `node_name_env` is `$NODE_NAME` (passed in: only `main` reads the environment).
    pub fn resolve(&self, node_name_env: Option<String>) -> anyhow::Result<RunConfig> {
        self.resolve_env(node_name_env, None, None)
    }

    /// [`RunFlags::resolve`], with `$POD_UID` and `$POD_TEMPLATE_GENERATION` too.
    pub fn resolve_env(
        &self,
        node_name_env: Option<String>,
        pod_uid_env: Option<String>,
        pod_generation_env: Option<String>,
    ) -> anyhow::Result<RunConfig> {
        use settings::*;
        let file = match &self.config {
            Some(path) => FileValues::read(path)?,
            None => FileValues::default(),
        };
        let mut r = Resolver {
            src: Sources {
                flags: &self.values,
                file,
            },
            origins: BTreeMap::new(),
            shown: BTreeMap::new(),
        };

        let dra_on = r.take(&DRA)?;
        let node_env = node_name_env
            .filter(|v| !v.is_empty())
            .map(|v| (Given::One(v), Origin::Env("NODE_NAME", "node-name")));
        let node_name = match r.lookup(&NODE_NAME)?.or(node_env) {
            Some((given, origin)) => {
                let name = Resolver::parse(&NODE_NAME, &given, &origin)?;
                r.record(&NODE_NAME, &name, Some(&origin));
                Some(name.0)
            }
            None if dra_on => anyhow::bail!(
                "--node-name is not set, nor NODE_NAME, nor node-name in a config file: the node's name is needed to publish its devices (a DNS subdomain such as `worker-1`); with `dra: false` it is not"
            ),
            None => {
                r.unset(&NODE_NAME);
                None
            }
        };
        let pod_env = pod_uid_env
            .filter(|v| !v.is_empty())
            .map(|v| (Given::One(v), Origin::Env("POD_UID", "pod-uid")));
        let pod_uid = match r.lookup(&POD_UID)?.or(pod_env) {
            Some((given, origin)) => {
                let uid = Resolver::parse(&POD_UID, &given, &origin)?;
                r.record(&POD_UID, &uid, Some(&origin));
                Some(uid.0)
            }
            None => {
                r.unset(&POD_UID);
                None
            }
        };
        let generation_env = pod_generation_env.filter(|v| !v.is_empty()).map(|v| {
            (
                Given::One(v),
                Origin::Env("POD_TEMPLATE_GENERATION", "pod-generation"),
            )
        });
        let pod_generation = match r.lookup(&POD_GENERATION)?.or(generation_env) {
            Some((given, origin)) => {
                let generation = Resolver::parse(&POD_GENERATION, &given, &origin)?;
                r.record(&POD_GENERATION, &generation, Some(&origin));
                Some(generation.0)
            }
            None => {
                r.unset(&POD_GENERATION);
                None
            }
        };
        let driver_name = r.take(&DRIVER_NAME)?.0;
        let nri_socket = r.take(&NRI_SOCKET)?.0;
        let kubelet_plugins_dir = r.take(&KUBELET_PLUGINS_DIR)?.0;
        let kubelet_registry_dir = r.take(&KUBELET_REGISTRY_DIR)?.0;
        let cdi_dir = r.take(&CDI_DIR)?.0;
        let state_dir = r.take(&STATE_DIR)?.0;
        let kubeconfig = r.optional(&KUBECONFIG)?.map(|k| k.0);
        let nri_plugin_index = r.take(&NRI_PLUGIN_INDEX)?.0;
        let node_allocatable_cpu = r.take(&NODE_ALLOCATABLE_CPU)?;
        let node_allocatable_memory = r.take(&NODE_ALLOCATABLE_MEMORY)?;
        let expose_pcie_roots = r.take(&EXPOSE_PCIE_ROOTS)?;
        let retry_waiting_pods = r.take(&RETRY_WAITING_PODS)?;
        let device_metadata = r.take(&DEVICE_METADATA)?.0;
        let topology = r.take(&TOPOLOGY)?;
        let sysfs_root_given = r.optional(&SYSFS_ROOT)?.map(|p| p.0);

        // A count always has a default; the set wins when given where the count was not.
        let (count, count_origin) = r.peek(&RESERVED_CPU_COUNT)?;
        let reserved_cpus = match r.lookup(&RESERVED_CPUS)? {
            Some((_, set_origin)) if set_origin.rank() == count_origin.rank() => {
                anyhow::bail!(
                    "{} and {}: both are set; reserved-cpus names the CPUs, \
                     reserved-cpu-count picks that many: set one of them",
                    set_origin.describe(),
                    count_origin.describe()
                )
            }
            Some((given, set_origin)) if set_origin.rank() > count_origin.rank() => {
                let set = Resolver::parse(&RESERVED_CPUS, &given, &set_origin)?;
                r.record(&RESERVED_CPUS, &set, Some(&set_origin));
                r.unset(&RESERVED_CPU_COUNT);
                ReservedCpus::Set(set.0)
            }
            _ => {
                r.record(&RESERVED_CPU_COUNT, &count, Some(&count_origin));
                r.unset(&RESERVED_CPUS);
                ReservedCpus::Count(count.0)
            }
        };
        let reserved_namespaces = r.take(&RESERVED_NAMESPACES)?.0;

        // The policy's settings are checked together; without DRA, nothing is published and
        // Guaranteed pods get exclusive CPUs unless told otherwise.
        let exclusivity = match r.lookup(&CPU_EXCLUSIVITY)? {
            Some((given, origin)) => {
                Some((Resolver::parse(&CPU_EXCLUSIVITY, &given, &origin)?, origin))
            }
            None => None,
        };
        let claim_cpus = match r.lookup(&CLAIM_CPUS)? {
            Some((given, origin)) => Some((Resolver::parse(&CLAIM_CPUS, &given, &origin)?, origin)),
            None => None,
        };
        let (device_mode, device_mode_origin) = r.peek(&DEVICE_MODE)?;
        let (group_by, group_by_origin) = r.peek(&GROUP_BY)?;
        let (claim_granularity, granularity_origin) = r.peek(&CLAIM_GRANULARITY)?;
        let choice = values::PolicyChoice {
            cpu_exclusivity: exclusivity.as_ref().map_or(
                if dra_on {
                    ExclusivityMode::Claims
                } else {
                    ExclusivityMode::Pods
                },
                |(mode, _)| *mode,
            ),
            claim_cpus: claim_cpus.as_ref().map(|(cpus, _)| cpus.clone()),
            device_mode,
            group_by,
            claim_granularity,
        };
        let policy = values::combine_policy(&choice).map_err(|e| {
            let origin = match e.key {
                "claim-cpus" => claim_cpus.as_ref().map(|(_, o)| o),
                "group-by" => Some(&group_by_origin),
                _ => None,
            };
            let origin = origin.map_or_else(|| format!("--{}", e.key), Origin::describe);
            anyhow::anyhow!("{origin}: {}", e.reason)
        })?;
        r.record(
            &CPU_EXCLUSIVITY,
            &choice.cpu_exclusivity,
            exclusivity.as_ref().map(|(_, o)| o),
        );
        match &claim_cpus {
            Some((cpus, origin)) => r.record(&CLAIM_CPUS, cpus, Some(origin)),
            None => r.unset(&CLAIM_CPUS),
        }
        r.record(&DEVICE_MODE, &device_mode, Some(&device_mode_origin));
        r.record(&GROUP_BY, &group_by, Some(&group_by_origin));
        r.record(
            &CLAIM_GRANULARITY,
            &claim_granularity,
            Some(&granularity_origin),
        );

        let unconfirmed_claim_grace = r.take(&UNCONFIRMED_CLAIM_GRACE)?;
        let memory = MemoryConfig {
            reserved: r.optional(&RESERVED_MEMORY)?.unwrap_or_default().0,
            claim_percent: r.take(&CLAIM_MEMORY)?.0,
            claim_hugepages: r.take(&CLAIM_HUGEPAGES)?,
        };
        let metrics_addr = r.take(&METRICS_ADDR)?;
        let debug_addr = r.take(&DEBUG_ADDR)?.0;
        let log_format = r.take(&LOG_FORMAT)?;
        let log_level = r.take(&LOG_LEVEL)?.0;

        if let Some(missed) = SETTINGS.iter().find(|s| !r.shown.contains_key(s.key)) {
            anyhow::bail!("internal: setting {:?} was not resolved", missed.key);
        }
        // With DRA on, the node's name is set (required above); with it off, a name given (by
        // NODE_NAME, say) is shown and not used.
        let dra = node_name.filter(|_| dra_on).map(|node_name| DraConfig {
            kubeconfig,
            kubelet: KubeletConfig {
                driver_name: driver_name.clone(),
                plugins_dir: kubelet_plugins_dir,
                registry_dir: kubelet_registry_dir,
                // The pod UID's first eight characters (its first group): a Unix socket's path
                // has at most 107 bytes, which a whole UID under a kubelet root dir other than
                // /var/lib/kubelet can exceed; two pods of the DaemonSet on one node differ there.
                instance: pod_uid.as_ref().map(|uid| uid.chars().take(8).collect()),
            },
            publisher: PublisherConfig {
                node_allocatable_cpu: node_allocatable_cpu
                    .then(kube_dra::NodeAllocatableCpu::default),
                node_allocatable_memory,
                ..PublisherConfig::new(&driver_name, &node_name)
            },
            health: HealthConfig {
                sysfs_root: sysfs_root(sysfs_root_given.as_deref(), &topology),
                ..HealthConfig::new(&node_name)
            },
            device_mode: policy.1.mode,
            retry_waiting_pods,
            device_metadata,
            node_name,
        });
        let config = RunConfig {
            dra,
            pod_uid,
            pod_generation,
            driver_name,
            nri_socket,
            nri_plugin_index,
            cdi_dir,
            expose_pcie_roots,
            topology,
            sysfs_root_given,
            reserved_cpus,
            reserved_namespaces,
            policy,
            memory,
            state_dir,
            unconfirmed_claim_grace,
            metrics_addr,
            debug_addr,
            log_format,
            log_level,
            origins: r.origins,
            shown: r.shown,
        };
        config.check_parts()?;
        Ok(config)
    }
}

/// Refuses a reserved cpuset naming CPUs that are not online (the policy would drop them
/// silently).
fn check_reserved(reserved: &ReservedCpus, topology: &Topology) -> anyhow::Result<()> {
    if let ReservedCpus::Set(set) = reserved {
        let missing = set.difference(&topology.online);
        if !missing.is_empty() {
            anyhow::bail!(
                "{set}: cpus {missing} are not online on this machine (online: {})",
                topology.online
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flags() -> RunFlags {
        RunFlags::default().with("node-name", "node-1")
    }

    fn file(text: &str) -> anyhow::Result<FileValues> {
        FileValues::parse(Path::new("/c.yaml"), text)
    }

    const HEADER: &str = "apiVersion: resmgr.io/v1alpha1\nkind: AgentConfiguration\n";

    #[test]
    fn defaults() {
        let c = flags().resolve(None).unwrap();
        let dra = c.dra.as_ref().expect("DRA is on by default");
        assert_eq!(dra.node_name, "node-1");
        assert_eq!(dra.kubeconfig, None);
        assert_eq!(
            dra.kubelet.plugins_dir,
            PathBuf::from("/var/lib/kubelet/plugins")
        );
        assert_eq!(dra.kubelet.driver_name, DEFAULT_DRIVER);
        assert_eq!(
            (
                dra.publisher.driver.as_str(),
                dra.publisher.node_name.as_str()
            ),
            (DEFAULT_DRIVER, "node-1")
        );
        assert_eq!(dra.health.sysfs_root, Some(PathBuf::from("/sys")));
        assert_eq!(c.driver_name, DEFAULT_DRIVER);
        assert_eq!(c.nri_socket, PathBuf::from("/var/run/nri/nri.sock"));
        assert_eq!(c.nri_plugin_index, "90");
        assert_eq!(c.cdi_dir, PathBuf::from("/var/run/cdi"));
        assert_eq!(c.state_dir, PathBuf::from("/var/lib/resmgr"));
        assert_eq!(c.metrics_addr, "127.0.0.1:8891".parse().unwrap());
        assert_eq!(c.debug_addr, Some("127.0.0.1:8892".parse().unwrap()));
        assert_eq!(c.topology, TopologySource::Live);
        assert_eq!(c.reserved_cpus, ReservedCpus::Count(1));
        assert_eq!(c.reserved_namespaces, vec!["kube-system".to_owned()]);
        assert_eq!(c.log_format, Format::Text);
        assert_eq!(c.log_level, "info");
    }

    #[test]
    fn every_setting_is_resolved_and_shown() {
        let c = flags().resolve(None).unwrap();
        let shown: Vec<&str> = c.values().iter().map(|(k, _)| *k).collect();
        assert_eq!(shown, settings::keys());
    }

    #[test]
    fn node_name_from_the_environment_unless_given_and_optional_without_dra() {
        let node = |c: RunConfig| c.dra.map(|dra| dra.node_name);
        let f = RunFlags::default();
        assert_eq!(
            node(f.resolve(Some("env-node".into())).unwrap()),
            Some("env-node".into())
        );
        assert!(f.resolve(None).is_err());
        let f = f.with("node-name", "flag-node");
        assert_eq!(
            node(f.resolve(Some("env-node".into())).unwrap()),
            Some("flag-node".into())
        );
        let c = RunFlags::default()
            .with("dra", "false")
            .resolve(None)
            .unwrap();
        assert_eq!(c.dra, None);
        // A name given without DRA is shown, and nothing uses it.
        let c = RunFlags::default()
            .with("dra", "false")
            .resolve(Some("env-node".into()))
            .unwrap();
        assert_eq!(c.dra, None);
        assert_eq!(c.manager().reconcile.pool, None);
    }

    #[test]
    fn with_dra_every_part_is_built_for_the_node_and_the_pod() {
        let c = flags()
            .with("pod-uid", "0123abcd-0000-4000-8000-000000000001")
            .with("kubeconfig", "/etc/k.conf")
            .with("node-allocatable-cpu", "true")
            .with("retry-waiting-pods", "true")
            .with("topology", "synthetic:pack:1 core:2 pu:1")
            .resolve(None)
            .unwrap();
        let dra = c.dra.clone().unwrap();
        assert_eq!(dra.kubeconfig, Some(PathBuf::from("/etc/k.conf")));
        assert_eq!(dra.kubelet.instance.as_deref(), Some("0123abcd"));
        assert!(dra.publisher.node_allocatable_cpu.is_some());
        assert!(dra.retry_waiting_pods);
        assert_eq!(
            dra.health.sysfs_root, None,
            "a synthetic machine has no sysfs"
        );
        assert_eq!(c.manager().reconcile.pool.as_deref(), Some("node-1"));
    }

    #[test]
    fn without_dra_guaranteed_pods_get_exclusive_cpus_unless_told_otherwise() {
        assert_eq!(flags().resolve(None).unwrap().policy.0, Exclusivity::Claims);
        let c = flags().with("dra", "false").resolve(None).unwrap();
        assert_eq!(c.policy.0, Exclusivity::Pods);
        let c = flags()
            .with("dra", "false")
            .with("cpu-exclusivity", "claims")
            .resolve(None)
            .unwrap();
        assert_eq!(c.policy.0, Exclusivity::Claims, "a given value wins");
    }

    #[test]
    fn policy_settings_are_refused_naming_where_they_came_from() {
        let e = flags()
            .with("cpu-exclusivity", "partition")
            .resolve(None)
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("--claim-cpus: is not set"), "{e}");
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.yaml");
        std::fs::write(&path, format!("{HEADER}device-mode: per-cpu\n")).unwrap();
        let mut f = flags();
        f.config = Some(path);
        let e = f.resolve(None).unwrap_err().to_string();
        assert!(
            e.contains("line 3: device-mode: \"per-cpu\" is not allowed"),
            "{e}"
        );
    }

    #[test]
    fn file_keys_with_lines_lists_and_unknown_keys() {
        let text = format!(
            "{HEADER}topology: synthetic:pack:1 core:2 pu:1\nnri-plugin-index: 10\n\
             reserved-namespaces: [a, b]\n"
        );
        let f = file(&text).unwrap();
        assert_eq!(
            f.values["nri-plugin-index"],
            (Given::One("10".into()), Some(4))
        );
        assert_eq!(
            f.values["reserved-namespaces"].0,
            Given::List(vec!["a".into(), "b".into()])
        );
        let e = file(&format!("{HEADER}log-format: json\nbogus: 1\n"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("line 4") && e.contains("\"bogus\"") && e.contains("node-name"),
            "{e}"
        );
        let e = file(&format!("{HEADER}topology: [a]\n"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("line 3: topology: expected a single value"),
            "{e}"
        );
        let e = file(&format!("{HEADER}reserved-namespaces: [{{a: 1}}]\n"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("a list of single values"), "{e}");
    }

    #[test]
    fn the_header_is_required_and_checked() {
        assert!(file("").unwrap().values.is_empty(), "an empty file is fine");
        let e = file("log-format: json\n").unwrap_err().to_string();
        assert!(
            e.contains("no `apiVersion: resmgr.io/v1alpha1`")
                && e.contains("kind: AgentConfiguration"),
            "{e}"
        );
        let e = file("apiVersion: resmgr.io/v2\nkind: AgentConfiguration\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(
                "line 1: apiVersion resmgr.io/v2: this agent reads `apiVersion: resmgr.io/v1alpha1`"
            ),
            "{e}"
        );
        let e = file("apiVersion: resmgr.io/v1alpha1\nkind: Other\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("line 2: kind Other"), "{e}");
    }

    #[test]
    fn reserved_cpus_are_a_cpuset_and_a_count_is_its_own_key() {
        let c = flags().with("reserved-cpus", "0").resolve(None).unwrap();
        assert_eq!(c.reserved_cpus, ReservedCpus::Set("0".parse().unwrap()));
        let c = flags().with("reserved-cpus", "0,32").resolve(None).unwrap();
        assert_eq!(c.reserved_cpus, ReservedCpus::Set("0,32".parse().unwrap()));
        let c = flags()
            .with("reserved-cpu-count", "2")
            .resolve(None)
            .unwrap();
        assert_eq!(c.reserved_cpus, ReservedCpus::Count(2));
        let e = flags()
            .with("reserved-cpus", "0")
            .with("reserved-cpu-count", "2")
            .resolve(None)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("--reserved-cpus and --reserved-cpu-count: both are set"),
            "{e}"
        );
        let e = flags()
            .with("reserved-cpu-count", "0")
            .resolve(None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("at least 1"), "{e}");
    }

    #[test]
    fn a_flag_beats_the_other_reserved_key_in_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.yaml");
        std::fs::write(&path, format!("{HEADER}reserved-cpus: \"0-1\"\n")).unwrap();
        let mut f = flags().with("reserved-cpu-count", "3");
        f.config = Some(path.clone());
        assert_eq!(
            f.resolve(None).unwrap().reserved_cpus,
            ReservedCpus::Count(3)
        );
        let mut f = flags();
        f.config = Some(path);
        let c = f.resolve(None).unwrap();
        assert_eq!(c.reserved_cpus, ReservedCpus::Set("0-1".parse().unwrap()));
        assert!(c.origin("reserved-cpus").ends_with("line 3: reserved-cpus"));
    }

    #[test]
    fn reserved_namespaces_as_a_flag_are_comma_separated_and_checked() {
        let c = flags()
            .with("reserved-namespaces", "kube-system, monitoring")
            .resolve(None)
            .unwrap();
        assert_eq!(c.reserved_namespaces, ["kube-system", "monitoring"]);
        let c = flags()
            .with("reserved-namespaces", "")
            .resolve(None)
            .unwrap();
        assert!(c.reserved_namespaces.is_empty());
        let e = flags()
            .with("reserved-namespaces", "ok,Not_Ok")
            .resolve(None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("--reserved-namespaces: \"Not_Ok\""), "{e}");
    }

    #[test]
    fn print_config_output_resolves_to_the_same_configuration() {
        let c = flags()
            .with("reserved-cpus", "0,4")
            .with("reserved-namespaces", "a,b")
            .with("log-level", "info,resmgr=debug")
            .resolve(None)
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.yaml");
        std::fs::write(&path, c.to_file()).unwrap();
        let again = RunFlags {
            config: Some(path),
            ..RunFlags::default()
        }
        .resolve(None)
        .unwrap();
        assert_eq!(again.values(), c.values());
    }

    #[test]
    fn a_claim_cpuset_of_one_cpu_prints_as_a_cpuset_not_a_count() {
        let c = flags()
            .with("cpu-exclusivity", "partition")
            .with("claim-cpus", "cpuset:3")
            .resolve(None)
            .unwrap();
        let shown: BTreeMap<_, _> = c.values().into_iter().collect();
        assert_eq!(shown["claim-cpus"], "cpuset:3");
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.yaml");
        std::fs::write(&path, c.to_file()).unwrap();
        let again = RunFlags {
            config: Some(path),
            ..RunFlags::default()
        }
        .resolve(None)
        .unwrap();
        assert_eq!(again.policy, c.policy);
    }

    #[test]
    fn the_default_file_resolves_to_the_defaults() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.yaml");
        std::fs::write(&path, settings::default_file()).unwrap();
        let mut f = flags();
        f.config = Some(path);
        assert_eq!(
            f.resolve(None).unwrap().values(),
            flags().resolve(None).unwrap().values()
        );
    }

    #[test]
    fn log_levels_are_checked() {
        let e = flags()
            .with("log-level", "info,=[")
            .resolve(None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("--log-level"), "{e}");
    }
}
