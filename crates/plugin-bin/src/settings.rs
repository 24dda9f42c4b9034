//! Every setting of `resmgr run`, described once.
//!
//! [`SETTINGS`] is the one list: each setting's key (the config file's key and, with `--`, the
//! flag), the type of its value ([`Typed`], [`types`]), its default as it is written in the file,
//! and its documentation. From it come the flags and their `--help`
//! ([`crate::config::RunFlags`]), the keys the config file accepts, the defaults the resolver
//! falls back to, `resmgr config --print-defaults` ([`default_file`]) and docs/configuration.md
//! ([`markdown`], checked by `cargo xtask docs --check`), so none of them can drift from the
//! others. A value is read and written back by its setting's type only: resolving it
//! ([`crate::config`]) and printing what it resolved to (`--print-config`, the start-up log)
//! cannot differ, the resolver refuses to finish with a setting it did not resolve, and a test
//! checks that every documented default reads as its type and writes back as documented.

pub mod types;

use std::{fmt::Write as _, marker::PhantomData, net::SocketAddr, time::Duration};

use policy::{
    TopologySource,
    topology_aware::{ClaimCpus, DeviceMode, Granularity, GroupBy},
};

use self::types::{
    ClaimMemory, DebugAddr, DriverName, Given, Kubeconfig, LogFilter, MetadataVersions, Namespaces,
    NodeName, Path, PluginIndex, PodGeneration, PodUid, ReservedCount, ReservedMemory, ReservedSet,
    SettingType,
};
use crate::values::{ExclusivityMode, Format};

/// The config file's `apiVersion`.
pub const API_VERSION: &str = "resmgr.io/v1alpha1";
/// The config file's `kind`.
pub const KIND: &str = "AgentConfiguration";

/// A group of settings, in the order they are documented.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Section {
    Node,
    Runtime,
    Kubernetes,
    Policy,
    Agent,
}

impl Section {
    pub const ALL: [Self; 5] = [
        Self::Node,
        Self::Runtime,
        Self::Kubernetes,
        Self::Policy,
        Self::Agent,
    ];

    pub fn title(self) -> &'static str {
        match self {
            Self::Node => "The node and the driver",
            Self::Runtime => "The container runtime (NRI)",
            Self::Kubernetes => "The kubelet and the Kubernetes API (used with dra: true)",
            Self::Policy => "The policy: who gets which CPUs",
            Self::Agent => "The agent itself: state, endpoints, logs",
        }
    }
}

/// Whether a setting takes one value or a list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// One value: a string, a number or a boolean.
    Scalar,
    /// A YAML list in the file; comma-separated as a flag.
    List,
}

/// A setting's default.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DefaultValue {
    /// This value, written as YAML exactly as the default file has it.
    Value(&'static str),
    /// No value: the setting is unset unless given, and this says what happens then.
    Unset(&'static str),
}

/// One setting.
#[derive(Debug, Clone, Copy)]
pub struct Setting {
    /// The key in the file; the flag is `--<key>`.
    pub key: &'static str,
    pub section: Section,
    /// The value's placeholder in `--help`.
    pub value_name: &'static str,
    pub shape: Shape,
    pub default: DefaultValue,
    /// One line: `--help` and the summary table.
    pub summary: &'static str,
    /// More, for the default file's comments and the documentation; may be empty.
    pub details: &'static str,
}

/// A setting, with the type of its value ([`types`]): what resolving it reads and printing it
/// writes.
pub struct Typed<T> {
    pub setting: Setting,
    ty: PhantomData<fn() -> T>,
}

impl<T> Typed<T> {
    const fn new(setting: Setting) -> Self {
        Self {
            setting,
            ty: PhantomData,
        }
    }
}

impl<T> std::fmt::Debug for Typed<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Typed").field(&self.setting).finish()
    }
}

impl<T> std::ops::Deref for Typed<T> {
    type Target = Setting;

    fn deref(&self) -> &Setting {
        &self.setting
    }
}

/// A setting, whatever the type of its value.
pub trait AnySetting: std::fmt::Debug + Sync {
    fn setting(&self) -> &Setting;

    /// Reads `given` as this setting's value and writes it back, as `resmgr run --print-config`
    /// prints it (for the test that every documented default reads back as written).
    #[cfg(test)]
    fn canonical(&self, given: &Given) -> Result<serde_json::Value, String>;
}

impl<T: SettingType> AnySetting for Typed<T> {
    fn setting(&self) -> &Setting {
        &self.setting
    }

    #[cfg(test)]
    fn canonical(&self, given: &Given) -> Result<serde_json::Value, String> {
        T::parse(given).map(|v| v.show())
    }
}

impl std::ops::Deref for dyn AnySetting {
    type Target = Setting;

    fn deref(&self) -> &Setting {
        self.setting()
    }
}

/// Every setting, in documentation order.
pub const SETTINGS: &[&dyn AnySetting] = &[
    &NODE_NAME,
    &POD_UID,
    &POD_GENERATION,
    &DRA,
    &DRIVER_NAME,
    &NRI_SOCKET,
    &NRI_PLUGIN_INDEX,
    &KUBELET_PLUGINS_DIR,
    &KUBELET_REGISTRY_DIR,
    &CDI_DIR,
    &KUBECONFIG,
    &NODE_ALLOCATABLE_CPU,
    &NODE_ALLOCATABLE_MEMORY,
    &EXPOSE_PCIE_ROOTS,
    &RETRY_WAITING_PODS,
    &DEVICE_METADATA,
    &TOPOLOGY,
    &SYSFS_ROOT,
    &RESERVED_CPUS,
    &RESERVED_CPU_COUNT,
    &RESERVED_NAMESPACES,
    &CPU_EXCLUSIVITY,
    &CLAIM_CPUS,
    &DEVICE_MODE,
    &GROUP_BY,
    &CLAIM_GRANULARITY,
    &RESERVED_MEMORY,
    &CLAIM_MEMORY,
    &CLAIM_HUGEPAGES,
    &STATE_DIR,
    &UNCONFIRMED_CLAIM_GRACE,
    &METRICS_ADDR,
    &DEBUG_ADDR,
    &LOG_FORMAT,
    &LOG_LEVEL,
];

// === The node and the driver ===

pub const NODE_NAME: Typed<NodeName> = Typed::new(Setting {
    key: "node-name",
    section: Section::Node,
    value_name: "NAME",
    shape: Shape::Scalar,
    default: DefaultValue::Unset(
        "`$NODE_NAME` (the DaemonSet sets it from the downward API); required with `dra: true`",
    ),
    summary: "This node's name, as the API server knows it.",
    details: "The agent publishes its devices for this node and names it in events. \
              A DNS subdomain such as `worker-1`.",
});

pub const POD_GENERATION: Typed<PodGeneration> = Typed::new(Setting {
    key: "pod-generation",
    section: Section::Node,
    value_name: "N",
    shape: Shape::Scalar,
    default: DefaultValue::Unset(
        "`$POD_TEMPLATE_GENERATION` (the DaemonSet sets it from the pod's `pod-template-generation` label); unset, no agent is refused for its age",
    ),
    summary: "The DaemonSet template generation of the agent's pod: an agent of an older one is never handed the node.",
    details: "The DaemonSet labels each pod with the generation of the template it was made \
              from. An agent that owns the node refuses to hand it over to an agent of an \
              older generation: a restarted container of a pod that a rolling update is \
              replacing would otherwise take the node back from the new pod, which would then \
              never be ready, and the rollout would stall. With `pod-uid` only.",
});

pub const POD_UID: Typed<PodUid> = Typed::new(Setting {
    key: "pod-uid",
    section: Section::Node,
    value_name: "UID",
    shape: Shape::Scalar,
    default: DefaultValue::Unset(
        "`$POD_UID` (the DaemonSet sets it from the downward API); unset, one agent per node",
    ),
    summary: "The agent's pod's UID: lets a new agent take the node over from the old one.",
    details: "With it, the agent registers with the kubelet under sockets named after its \
              pod (`<driver>-<uid>-reg.sock`, `dra-<uid>.sock`, with the UID's first eight \
              characters: a socket's path has at most 107 bytes), so that the kubelet (1.33 \
              or later) keeps two agents registered during a rolling update and calls the \
              newest, and a new agent that finds the node owned asks the owner to hand it \
              over (through `<state-dir>/handover.sock`) instead of failing: docs/deploy.md, \
              \"Upgrading\". Without it, a second agent on the node refuses to start.",
});

pub const DRA: Typed<bool> = Typed::new(Setting {
    key: "dra",
    section: Section::Node,
    value_name: "BOOL",
    shape: Shape::Scalar,
    default: DefaultValue::Value("true"),
    summary: "Serve DRA claims: register with the kubelet and publish devices.",
    details: "`false` runs the agent as an NRI plugin only, the way nri-plugins' \
              topology-aware policy runs: it needs no API server, no kubeconfig and no \
              kubelet registration, publishes nothing and posts no events, and is ready \
              once it has synchronized with the runtime. Guaranteed pods then get \
              exclusive CPUs by default. Claims prepared while it was `true` stay \
              accounted for until it is `true` again.",
});

pub const DRIVER_NAME: Typed<DriverName> = Typed::new(Setting {
    key: "driver-name",
    section: Section::Node,
    value_name: "NAME",
    shape: Shape::Scalar,
    default: DefaultValue::Value("topology-aware.resmgr.io"),
    summary: "The DRA driver name, also the vendor of the CDI specs the agent writes.",
    details: "A DNS subdomain with at least one dot, at most 63 characters. DeviceClasses \
              select this driver's devices by it.",
});

// === The container runtime ===

pub const NRI_SOCKET: Typed<Path> = Typed::new(Setting {
    key: "nri-socket",
    section: Section::Runtime,
    value_name: "PATH",
    shape: Shape::Scalar,
    default: DefaultValue::Value("/var/run/nri/nri.sock"),
    summary: "The runtime's NRI socket.",
    details: "The agent waits for it, retrying with backoff, while the runtime is not up.",
});

pub const NRI_PLUGIN_INDEX: Typed<PluginIndex> = Typed::new(Setting {
    key: "nri-plugin-index",
    section: Section::Runtime,
    value_name: "NN",
    shape: Shape::Scalar,
    default: DefaultValue::Value("\"90\""),
    summary: "Our NRI plugin index, two digits; the runtime calls plugins in index order.",
    details: "90 runs after most other plugins, so the cpusets the agent sets are the ones \
              that stay.",
});

// === The kubelet and the API ===

pub const KUBELET_PLUGINS_DIR: Typed<Path> = Typed::new(Setting {
    key: "kubelet-plugins-dir",
    section: Section::Kubernetes,
    value_name: "DIR",
    shape: Shape::Scalar,
    default: DefaultValue::Value("/var/lib/kubelet/plugins"),
    summary: "The kubelet's plugin directory, where the agent's DRA socket goes.",
    details: "",
});

pub const KUBELET_REGISTRY_DIR: Typed<Path> = Typed::new(Setting {
    key: "kubelet-registry-dir",
    section: Section::Kubernetes,
    value_name: "DIR",
    shape: Shape::Scalar,
    default: DefaultValue::Value("/var/lib/kubelet/plugins_registry"),
    summary: "The kubelet's plugin registry, where the agent's registration socket goes.",
    details: "",
});

pub const CDI_DIR: Typed<Path> = Typed::new(Setting {
    key: "cdi-dir",
    section: Section::Kubernetes,
    value_name: "DIR",
    shape: Shape::Scalar,
    default: DefaultValue::Value("/var/run/cdi"),
    summary: "Where the agent writes one CDI spec per prepared claim.",
    details: "A directory the runtime reads CDI specs from.",
});

pub const KUBECONFIG: Typed<Kubeconfig> = Typed::new(Setting {
    key: "kubeconfig",
    section: Section::Kubernetes,
    value_name: "FILE",
    shape: Shape::Scalar,
    default: DefaultValue::Unset("the pod's service account (in-cluster configuration)"),
    summary: "A kubeconfig file to reach the API server with.",
    details: "",
});

pub const NODE_ALLOCATABLE_CPU: Typed<bool> = Typed::new(Setting {
    key: "node-allocatable-cpu",
    section: Section::Kubernetes,
    value_name: "BOOL",
    shape: Shape::Scalar,
    default: DefaultValue::Value("false"),
    summary: "Map each published device's `cpu` capacity to the node's allocatable cpu.",
    details: "The scheduler then charges claimed CPUs against the node, and from 1.37 the \
              kubelet adds them to the pod's cgroup limits. Needs Kubernetes 1.36 or later \
              with the DRANodeAllocatableResources feature gate (the mapping is written in \
              1.36's form and in 1.37's; the API server keeps the one it knows); without \
              it, pods repeat their claimed CPUs in `resources.requests`.",
});

pub const NODE_ALLOCATABLE_MEMORY: Typed<bool> = Typed::new(Setting {
    key: "node-allocatable-memory",
    section: Section::Kubernetes,
    value_name: "BOOL",
    shape: Shape::Scalar,
    default: DefaultValue::Value("false"),
    summary: "Map each published device's `memory` and `hugepages<size>` capacities to the \
              node's allocatable memory and `hugepages-<size>`.",
    details: "As `node-allocatable-cpu` does for CPUs, with the same versions and gate: the \
              scheduler charges claimed memory and hugepages against the node, and from 1.37 \
              the kubelet adds them to the pod's and the container's limits, so a pod need \
              not repeat them in `resources` (without it, the kubelet caps the pod's hugetlb \
              at what `resources` lists). Only devices with memory capacities are mapped \
              (`claim-memory`, `claim-hugepages`).",
});

pub const EXPOSE_PCIE_ROOTS: Typed<bool> = Typed::new(Setting {
    key: "expose-pcie-roots",
    section: Section::Kubernetes,
    value_name: "BOOL",
    shape: Shape::Scalar,
    default: DefaultValue::Value("false"),
    summary: "Publish `resource.kubernetes.io/pcieRoot` on each device: the PCIe roots local to \
              its CPUs.",
    details: "A claim can then put CPUs (and memory) on the PCIe root of another driver's GPU \
              or NIC with `matchAttribute: resource.kubernetes.io/pcieRoot`. The attribute is \
              a list of strings, which needs the alpha DRAListTypeAttributes feature gate on \
              the API server and the scheduler, and Kubernetes 1.37 (1.36's scheduler matches \
              no list attribute): without the gate the API server refuses such slices, and the agent then publishes its devices without \
              the attribute and warns naming the gate. Roots come from sysfs \
              (`sysfs-root`); a device whose CPUs no root is local to gets none. Aligning on \
              `resource.kubernetes.io/numaNode` needs no gate (docs/kubernetes.md).",
});

pub const DEVICE_METADATA: Typed<MetadataVersions> = Typed::new(Setting {
    key: "device-metadata",
    section: Section::Kubernetes,
    value_name: "VERSION,...",
    shape: Shape::List,
    default: DefaultValue::Value("[v1beta1, v1alpha1]"),
    summary: "The device metadata (KEP-5304) each prepared claim's containers find at \
              `/var/run/kubernetes.io/dra-device-attributes/...`, in these API versions \
              (`v1beta1`, `v1alpha1`), newest first; `[]` writes none.",
    details: "Each file holds the same metadata once per version, and a reader takes the first \
              it knows: Kubernetes 1.36's readers know `v1alpha1`, 1.37's both. The files are \
              written under `kubelet-plugins-dir`/<driver>/dra-device-metadata, which the \
              runtime mounts into the containers through the claim's CDI spec \
              (docs/kubernetes.md, \"Device metadata\"). Needs no feature gate.",
});

pub const RETRY_WAITING_PODS: Typed<bool> = Typed::new(Setting {
    key: "retry-waiting-pods",
    section: Section::Kubernetes,
    value_name: "BOOL",
    shape: Shape::Scalar,
    default: DefaultValue::Value("false"),
    summary: "Once it serves, mark the node's pods that wait for their claims, so that the \
              kubelet prepares them at once.",
    details: "The kubelet retries a prepare that failed (while the agent was down: a crash, a \
              pod deleted without a surge) only at its resync, 60 to 90 s later; a change of \
              a pod's annotations makes it sync the pod at once. With this on, an agent that \
              becomes ready sets `<driver-name>/prepare-retry` on the pending pods of its node \
              that have resource claims and no started container. It needs `list` and \
              `patch` on pods: the chart grants them only with its admission policy, which \
              lets the agent change that annotation and nothing else, of pods on its own node \
              (docs/deploy.md, \"When the agent was down\").",
});

// === The policy ===

pub const TOPOLOGY: Typed<TopologySource> = Typed::new(Setting {
    key: "topology",
    section: Section::Policy,
    value_name: "SOURCE",
    shape: Shape::Scalar,
    default: DefaultValue::Value("live"),
    summary: "The machine: `live`, `synthetic:<hwloc description>` or `xml:<file>`.",
    details: "Anything but `live` is for tests and demonstrations.",
});

pub const RESERVED_CPUS: Typed<ReservedSet> = Typed::new(Setting {
    key: "reserved-cpus",
    section: Section::Policy,
    value_name: "CPUSET",
    shape: Shape::Scalar,
    default: DefaultValue::Unset("`reserved-cpu-count` CPUs"),
    summary: "CPUs for system pods, as a cpuset in the kubelet's `reservedSystemCPUs` syntax.",
    details: "`\"0\"` is CPU 0, `\"0,32\"` CPUs 0 and 32, `\"0-1\"` CPUs 0 and 1 (a \
              `cpuset:` prefix, as nri-plugins writes it, is accepted too). Copy the \
              kubelet's `reservedSystemCPUs` here. A number is always a CPU, never a \
              count: the count is `reserved-cpu-count`, so a value means the same \
              whichever tool it was copied from. Reserved CPUs are never granted \
              exclusively nor shared with other pods.",
});

pub const RESERVED_CPU_COUNT: Typed<ReservedCount> = Typed::new(Setting {
    key: "reserved-cpu-count",
    section: Section::Policy,
    value_name: "COUNT",
    shape: Shape::Scalar,
    default: DefaultValue::Value("1"),
    summary: "How many CPUs to reserve for system pods, when `reserved-cpus` is not set.",
    details: "They are picked like an exclusive grant, whole cores from the lowest-numbered. \
              Setting both this and `reserved-cpus` is refused.",
});

pub const RESERVED_NAMESPACES: Typed<Namespaces> = Typed::new(Setting {
    key: "reserved-namespaces",
    section: Section::Policy,
    value_name: "NS,...",
    shape: Shape::List,
    default: DefaultValue::Value("[kube-system]"),
    summary: "Namespaces whose pods run on the reserved CPUs.",
    details: "A pod's `reserved-cpus` annotation overrides this for the pod. An empty list \
              (`[]`) puts no namespace there.",
});

pub const CPU_EXCLUSIVITY: Typed<ExclusivityMode> = Typed::new(Setting {
    key: "cpu-exclusivity",
    section: Section::Policy,
    value_name: "MODE",
    shape: Shape::Scalar,
    default: DefaultValue::Unset("`claims`; `pods` with `dra: false`"),
    summary: "Who gets CPUs of their own: `claims`, `partition` or `pods`.",
    details: "`claims`: only DRA claims; Guaranteed pods without one run on shared CPUs. \
              `partition`: claims get the `claim-cpus`, Guaranteed pods exclusive CPUs from \
              the rest. `pods`: Guaranteed pods with whole CPUs get exclusive CPUs and no \
              devices are published, as nri-plugins does. docs/kubernetes.md says which \
              for which cluster.",
});

pub const CLAIM_CPUS: Typed<ClaimCpus> = Typed::new(Setting {
    key: "claim-cpus",
    section: Section::Policy,
    value_name: "COUNT|CPUSET",
    shape: Shape::Scalar,
    default: DefaultValue::Unset("none; required with `cpu-exclusivity: partition`"),
    summary: "With `cpu-exclusivity: partition`: the CPUs published for claims.",
    details: "A count (`8`) or a cpuset (`8-15`, `0,8`; `cpuset:3` for the single CPU 3). \
              Set with any other `cpu-exclusivity`, it is refused.",
});

pub const DEVICE_MODE: Typed<DeviceMode> = Typed::new(Setting {
    key: "device-mode",
    section: Section::Policy,
    value_name: "MODE",
    shape: Shape::Scalar,
    default: DefaultValue::Value("grouped"),
    summary: "How CPUs are published: `grouped` or `individual`.",
    details: "`grouped`: one device per NUMA node (or socket) with consumable capacity `cpu`; \
              needs the DRAConsumableCapacity feature gate. `individual`: one device per CPU \
              (or core); any cluster with DRA.",
});

pub const GROUP_BY: Typed<GroupBy> = Typed::new(Setting {
    key: "group-by",
    section: Section::Policy,
    value_name: "GROUP",
    shape: Shape::Scalar,
    default: DefaultValue::Value("numa"),
    summary: "What a grouped device stands for: `numa` or `socket`.",
    details: "`socket` only with `device-mode: grouped`.",
});

pub const CLAIM_GRANULARITY: Typed<Granularity> = Typed::new(Setting {
    key: "claim-granularity",
    section: Section::Policy,
    value_name: "UNIT",
    shape: Shape::Scalar,
    default: DefaultValue::Value("cpu"),
    summary: "The smallest amount a claim gets: `cpu` (a hardware thread) or `core`.",
    details: "`core` publishes whole cores only, which the scheduler then accounts for.",
});

pub const RESERVED_MEMORY: Typed<ReservedMemory> = Typed::new(Setting {
    key: "reserved-memory",
    section: Section::Policy,
    value_name: "N:memory=Q,...;...",
    shape: Shape::Scalar,
    default: DefaultValue::Unset("nothing reserved"),
    summary: "Memory and hugepages reserved for the system per NUMA node, as the kubelet's \
              `--reserved-memory` says.",
    details: "`0:memory=1Gi,hugepages-1Gi=2Gi;1:memory=2Gi`: nodes separated by `;`. Give \
              the kubelet's value: what is reserved is never published for claims nor \
              charged to containers. Hugepages are rounded up to whole pages.",
});

pub const CLAIM_MEMORY: Typed<ClaimMemory> = Typed::new(Setting {
    key: "claim-memory",
    section: Section::Policy,
    value_name: "PERCENT",
    shape: Shape::Scalar,
    default: DefaultValue::Value("0%"),
    summary: "The share of each NUMA node's memory, less the reserved, set aside for claims \
              and published as the `memory` capacity of its device.",
    details: "`0%` publishes no memory. Containers placed through NRI are pinned to the \
              rest of a node's memory (widened to other nodes, else unpinned, when it is \
              short); claims get what they consumed of their node's share. Published on \
              grouped NUMA devices (`device-mode: grouped`, `group-by: numa`).",
});

pub const CLAIM_HUGEPAGES: Typed<bool> = Typed::new(Setting {
    key: "claim-hugepages",
    section: Section::Policy,
    value_name: "BOOL",
    shape: Shape::Scalar,
    default: DefaultValue::Value("false"),
    summary: "Publish each NUMA node's hugepages, less the reserved, for claims \
              (`hugepages2Mi`, `hugepages1Gi`).",
    details: "Pods then ask claims for hugepages; the hugetlb limits of their containers \
              are set from what the claim got. Leave it off on nodes whose pods request \
              hugepages through `resources` without claims: the kubelet hands those out \
              from the same pages.",
});

pub const SYSFS_ROOT: Typed<Path> = Typed::new(Setting {
    key: "sysfs-root",
    section: Section::Policy,
    value_name: "DIR",
    shape: Shape::Scalar,
    default: DefaultValue::Unset("`/sys` with `topology: live`; none with another topology"),
    summary: "Where the agent reads what hwloc does not say: isolated and offline CPUs, \
              hugepages, PCIe roots.",
    details: "Set it where the host's sysfs is mounted when that is not `/sys`, or, with a \
              synthetic or XML topology, to a sysfs tree of the machine it describes (tests \
              and demonstrations): without one such a topology has every CPU online, none \
              isolated, no hugepages and no PCIe roots.",
});

// === The agent ===

pub const STATE_DIR: Typed<Path> = Typed::new(Setting {
    key: "state-dir",
    section: Section::Agent,
    value_name: "DIR",
    shape: Shape::Scalar,
    default: DefaultValue::Value("/var/lib/resmgr"),
    summary: "Where the durable state lives (claims and their CPUs).",
    details: "Keep it across upgrades and restarts: it is how prepared claims survive them.",
});

pub const UNCONFIRMED_CLAIM_GRACE: Typed<Duration> = Typed::new(Setting {
    key: "unconfirmed-claim-grace",
    section: Section::Agent,
    value_name: "DURATION",
    shape: Shape::Scalar,
    default: DefaultValue::Value("2m"),
    summary: "How long a claim the kubelet has not prepared since the agent took it back is \
              kept once nothing uses it and the API server no longer allocates it here.",
    details: "Such claims come from CDI specs the state did not account for (a lost state \
              directory) or a state that holds a claim without its spec. The kubelet \
              unprepares the claims of pods that went about a minute after it starts; this \
              is the backstop for claims it no longer knows. `90s`, `2m`, `500ms`.",
});

pub const METRICS_ADDR: Typed<SocketAddr> = Typed::new(Setting {
    key: "metrics-addr",
    section: Section::Agent,
    value_name: "ADDR:PORT",
    shape: Shape::Scalar,
    default: DefaultValue::Value("\"127.0.0.1:8891\""),
    summary: "Where `/metrics`, `/healthz` and `/readyz` are served.",
    details: "An IP address and a port, such as `0.0.0.0:8891` or `[::]:8891`; port 0 \
              picks a free one. `[::]` listens on IPv4 and IPv6 whatever the host's \
              `net.ipv6.bindv6only` (and on `0.0.0.0` when the kernel has no IPv6), so \
              the kubelet's probes reach it on IPv4-only, IPv6-only and dual-stack pods.",
});

pub const DEBUG_ADDR: Typed<DebugAddr> = Typed::new(Setting {
    key: "debug-addr",
    section: Section::Agent,
    value_name: "ADDR:PORT|off",
    shape: Shape::Scalar,
    default: DefaultValue::Value("\"127.0.0.1:8892\""),
    summary: "Where `/debug/state` is served, or `off`.",
    details: "`/debug/state` names every claim and container of the node and has no \
              authentication, so it has an address of its own, loopback by default: \
              reach it with `kubectl port-forward` or `kubectl debug` (docs/deploy.md). \
              An IP address and a port as for `metrics-addr`, or `off`.",
});

pub const LOG_FORMAT: Typed<Format> = Typed::new(Setting {
    key: "log-format",
    section: Section::Agent,
    value_name: "FORMAT",
    shape: Shape::Scalar,
    default: DefaultValue::Value("text"),
    summary: "`text` for people, `json` for log collectors.",
    details: "",
});

pub const LOG_LEVEL: Typed<LogFilter> = Typed::new(Setting {
    key: "log-level",
    section: Section::Agent,
    value_name: "FILTER",
    shape: Shape::Scalar,
    default: DefaultValue::Value("info"),
    summary: "What to log: a level or a filter such as `info,resmgr=debug`.",
    details: "`RUST_LOG`, when set, wins over this setting (it is the usual way to turn \
              debugging on for one run).",
});

/// The setting with this key.
pub fn find(key: &str) -> Option<&'static dyn AnySetting> {
    SETTINGS.iter().copied().find(|s| s.key == key)
}

/// The keys, for messages.
pub fn keys() -> Vec<&'static str> {
    SETTINGS.iter().map(|s| s.key).collect()
}

impl Setting {
    /// The default, as a value given; `None` when there is none. Fails only on a default that is
    /// not YAML of a single value or a list of them (a test checks every one).
    pub fn default_given(&self) -> Result<Option<Given>, String> {
        use serde_yaml_ng::Value;
        let DefaultValue::Value(yaml) = self.default else {
            return Ok(None);
        };
        let scalar = |v: &Value| match v {
            Value::String(s) => Some(s.clone()),
            Value::Bool(b) => Some(b.to_string()),
            Value::Number(n) => Some(n.to_string()),
            _ => None,
        };
        let value: Value = serde_yaml_ng::from_str(yaml).map_err(|e| e.to_string())?;
        match &value {
            Value::Sequence(items) => items
                .iter()
                .map(|v| scalar(v).ok_or_else(|| format!("{yaml}: not a list of single values")))
                .collect::<Result<_, _>>()
                .map(|list| Some(Given::List(list))),
            other => scalar(other)
                .map(|v| Some(Given::One(v)))
                .ok_or_else(|| format!("{yaml}: not a single value")),
        }
    }

    /// The `--help` line: the summary and the default.
    pub fn help(&self) -> String {
        match self.default {
            DefaultValue::Value(v) => format!(
                "{} [default: {}]",
                self.summary,
                v.trim_matches(|c| matches!(c, '"' | '[' | ']'))
            ),
            DefaultValue::Unset(what) => {
                format!("{} [default: {}]", self.summary, strip_ticks(what))
            }
        }
    }
}

fn strip_ticks(s: &str) -> String {
    s.replace('`', "")
}

/// Wraps prose at 96 columns after `prefix`.
fn wrap(text: &str, prefix: &str) -> String {
    let mut out = String::new();
    let mut line = String::new();
    for word in text.split_whitespace() {
        if !line.is_empty() && prefix.len() + line.len() + 1 + word.len() > 96 {
            let _ = writeln!(out, "{prefix}{line}");
            line.clear();
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(word);
    }
    if !line.is_empty() {
        let _ = writeln!(out, "{prefix}{line}");
    }
    out
}

/// The complete default config file, every setting with its documentation as comments: what
/// `resmgr config --print-defaults` prints. Settings without a default are commented out.
pub fn default_file() -> String {
    let mut out = String::new();
    out.push_str(&wrap(
        "The configuration of `resmgr run`, given with `--config FILE`. Every key is also a \
         flag of `resmgr run` (`--<key>`); a flag wins over the file, the file over the \
         default. Unknown keys are refused by name. Printed by `resmgr config \
         --print-defaults`; docs/configuration.md says the same.",
        "# ",
    ));
    let _ = writeln!(out, "apiVersion: {API_VERSION}");
    let _ = writeln!(out, "kind: {KIND}");
    for section in Section::ALL {
        let _ = writeln!(out, "\n# === {} ===", section.title());
        for s in SETTINGS.iter().filter(|s| s.section == section) {
            out.push('\n');
            out.push_str(&wrap(&format!("{} {}", s.summary, s.details), "# "));
            match s.default {
                DefaultValue::Value(v) => {
                    let _ = writeln!(out, "{}: {v}", s.key);
                }
                DefaultValue::Unset(what) => {
                    out.push_str(&wrap(&format!("Default: {what}."), "# "));
                    let _ = writeln!(out, "# {}:", s.key);
                }
            }
        }
    }
    out
}

/// docs/configuration.md.
pub fn markdown() -> String {
    let mut out = String::new();
    out.push_str(
        "<!-- Generated from crates/plugin-bin/src/settings.rs by `cargo xtask docs`; edit that \
         file, not this one. -->\n\n",
    );
    out.push_str("# Configuring the agent\n\n");
    out.push_str(&wrap(
        "`resmgr run` takes every setting from one YAML file given with `--config FILE`, and \
         each also as a flag of the same name (`--reserved-cpus`); a flag wins over the file, \
         the file over the default. The file starts with a header naming its format, and a \
         key the agent does not know is refused by name, with its line, so a typo cannot pass \
         unnoticed. Every value is checked before anything starts: a bad one stops the agent \
         with a message naming the flag or the file, line and key, the value and what is \
         allowed. `resmgr run --print-config` prints the settings the agent would run with, \
         resolved, as a config file; `resmgr config --print-defaults` prints the complete \
         default file below. In the Helm chart, the `config:` value is this file.",
        "",
    ));
    out.push('\n');
    out.push_str("| key | default | what |\n|---|---|---|\n");
    for s in SETTINGS {
        let default = match s.default {
            DefaultValue::Value(v) => format!("`{v}`"),
            DefaultValue::Unset(what) => what.to_owned(),
        };
        let _ = writeln!(
            out,
            "| [`{}`](#{}) | {default} | {} |",
            s.key, s.key, s.summary
        );
    }
    for section in Section::ALL {
        let _ = write!(out, "\n## {}\n", section.title());
        for s in SETTINGS.iter().filter(|s| s.section == section) {
            let _ = write!(out, "\n### `{}`\n\n", s.key);
            let flag = match s.shape {
                Shape::Scalar => format!("`--{} {}`", s.key, s.value_name),
                Shape::List => format!("`--{} {}` (comma-separated)", s.key, s.value_name),
            };
            let default = match s.default {
                DefaultValue::Value(v) => format!("`{v}`"),
                DefaultValue::Unset(what) => what.to_owned(),
            };
            let _ = writeln!(out, "Flag {flag}. Default: {default}.\n");
            out.push_str(&wrap(&format!("{} {}", s.summary, s.details), ""));
        }
    }
    out.push_str("\n## The default file\n\n```yaml\n");
    out.push_str(&default_file());
    out.push_str("```\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_unique_kebab_case_and_documented() {
        let mut seen = std::collections::BTreeSet::new();
        for s in SETTINGS {
            assert!(seen.insert(s.key), "{} twice", s.key);
            assert!(
                s.key
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-'),
                "{}",
                s.key
            );
            assert!(s.summary.ends_with('.'), "{}: {}", s.key, s.summary);
            assert!(
                s.details.is_empty() || s.details.ends_with('.'),
                "{}",
                s.key
            );
        }
        assert!(!seen.contains("config") && !seen.contains("print-config"));
    }

    #[test]
    fn every_default_reads_as_its_type_and_writes_back_as_documented() {
        for s in SETTINGS {
            let DefaultValue::Value(yaml) = s.default else {
                continue;
            };
            let given = s.default_given().unwrap().unwrap();
            let shown = s
                .canonical(&given)
                .unwrap_or_else(|e| panic!("{}: the default {yaml} is refused: {e}", s.key));
            let documented: serde_json::Value = serde_yaml_ng::from_str(yaml).unwrap();
            assert_eq!(shown, documented, "{}", s.key);
        }
    }

    #[test]
    fn the_default_file_is_commented_yaml_with_every_key() {
        let text = default_file();
        let doc: serde_yaml_ng::Value = serde_yaml_ng::from_str(&text).unwrap();
        assert_eq!(doc["apiVersion"], API_VERSION);
        assert_eq!(doc["kind"], KIND);
        for s in SETTINGS {
            match s.default {
                DefaultValue::Value(_) => assert!(doc.get(s.key).is_some(), "{} missing", s.key),
                DefaultValue::Unset(_) => {
                    assert!(doc.get(s.key).is_none(), "{} set", s.key);
                    assert!(text.contains(&format!("\n# {}:\n", s.key)), "{}", s.key);
                }
            }
        }
        assert!(text.lines().all(|l| l.len() <= 100), "{text}");
    }
}
