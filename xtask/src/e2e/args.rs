//! The options of `cargo xtask e2e`, which every stage takes.

/// A part of the e2e with prerequisites of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Stage {
    /// resmgr on containerd and runc, real containers checked in the kernel.
    Containerd,
    /// The containerd stage's scenarios on CRI-O, runc and conmon.
    Crio,
    /// resmgr against a real kube-apiserver, kube-scheduler and kube-controller-manager.
    Controlplane,
    /// resmgr installed with Helm in a real one-node cluster (kubelet, controller-manager).
    Cluster,
    /// The cluster's node in a VM with systemd: cgroup v2 alone, the systemd cgroup driver, the
    /// newest Kubernetes release, on containerd and on CRI-O.
    NodeV2,
}

/// Options of `cargo xtask e2e`.
#[derive(Debug, Default, Clone, clap::Args)]
pub struct E2eArgs {
    /// Run only this stage (repeat); default: all.
    #[arg(long, value_enum)]
    pub stage: Vec<Stage>,
    /// Keep the run's directory (logs, containerd's and the agent's state) afterwards.
    #[arg(long)]
    pub keep: bool,
    /// Run the control plane and cluster stages on this Kubernetes release only (`1.36`,
    /// `1.37`: the minor version a build module under tests/controlplane pins; repeat); default:
    /// every release.
    #[arg(long, value_name = "MINOR")]
    pub kubernetes: Vec<String>,
    /// Run the cluster stage on this container runtime only (repeat); default: containerd on
    /// every release, and CRI-O on the primary one (CRI-O 1.36 goes with Kubernetes 1.36). The
    /// node-v2 stage runs on both by default.
    #[arg(long, value_enum, value_name = "RUNTIME")]
    pub runtime: Vec<Runtime>,
    /// Run only these scenarios (repeat); default: all. Most build on the ones before them.
    #[arg(long, value_name = "SCENARIO")]
    pub only: Vec<String>,
    /// Run each scenario of the cluster and node-v2 stages this many times in a row (`go test
    /// -count`): how often a scenario fails is counted so, under load when it has timing in it.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub count: u32,
    /// Run every scenario of the node-v2 stage on every runtime (by default, as in CI, both run
    /// the cgroup driver, pinning, the shared pools and the daemon-reload; MemoryQoS runs on
    /// containerd only and the reboot on neither, each saying why).
    #[arg(long)]
    pub all: bool,
    /// How the agent runs: `container` (its image, as the chart's DaemonSet runs it; built from
    /// the debug binary) or `process` (`resmgr run` on the host; quicker while developing).
    #[arg(long, value_enum, default_value_t = AgentAs::Container)]
    pub agent_as: AgentAs,
    /// An extra flag for `resmgr run` (repeat).
    #[arg(long = "agent-arg", value_name = "FLAG", allow_hyphen_values = true)]
    pub agent_args: Vec<String>,
    /// Bring containerd up and run this command against it instead of the scenarios (the node
    /// is in its environment: RESMGR_E2E_*).
    #[arg(last = true)]
    pub command: Vec<String>,
}

impl E2eArgs {
    /// The scenarios these options choose, for the stages run by `go test`.
    pub fn scenarios(&self) -> Scenarios<'_> {
        Scenarios {
            only: &self.only,
            count: self.count,
        }
    }
}

/// Which scenarios a stage run by `go test` runs, and how many times each.
#[derive(Debug, Clone, Copy)]
pub struct Scenarios<'a> {
    /// Only these (`--only`); empty: every one.
    pub only: &'a [String],
    /// Each this many times in a row (`--count`).
    pub count: u32,
}

impl Scenarios<'_> {
    /// Every scenario, once: what `cargo xtask test` runs.
    pub const ALL: Scenarios<'static> = Scenarios {
        only: &[],
        count: 1,
    };

    /// `go test`'s `-count` flag for them.
    pub fn count_flag(&self) -> String {
        format!("-count={}", self.count)
    }
}

/// The container runtime of the cluster's node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Runtime {
    /// containerd 2.4 and runc (the containerd stage's build).
    Containerd,
    /// CRI-O 1.36, conmon and runc (the CRI-O stage's build).
    Crio,
}

impl Runtime {
    /// Its name as `--runtime` and the cluster's RESMGR_CLUSTER_RUNTIME take it.
    pub fn arg(self) -> &'static str {
        match self {
            Self::Containerd => "containerd",
            Self::Crio => "crio",
        }
    }

    /// Its name in messages.
    pub fn name(self) -> &'static str {
        match self {
            Self::Containerd => "containerd",
            Self::Crio => "CRI-O",
        }
    }
}

/// How the e2e starts the agent.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum AgentAs {
    #[default]
    Container,
    Process,
}
