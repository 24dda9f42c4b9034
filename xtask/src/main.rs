//! `cargo xtask`: the repository's build system.
//!
//! Every command a maintainer or CI runs is here, so that the README can promise exactly two
//! commands (`cargo xtask demo`, `cargo xtask test`) and have them set up a fresh machine by
//! themselves. Repository rules that need no compilation of the product (layering, module docs)
//! are plain `#[test]`s in `tidy`, run by `cargo test --workspace`. The modules are in layers that
//! only point down (helpers, builds, stages, commands; ARCHITECTURE.md), which `tidy` checks.

mod bench;
mod build;
mod codegen;
mod docs;
mod e2e;
mod image;
mod manifests;
mod missing;
mod release;
mod scale;
mod soak;
mod sysdeps;
mod test;
#[cfg(test)]
mod tidy;
mod timing;
mod util;
mod workspace;

use std::path::PathBuf;

use clap::{Parser, Subcommand};

/// Repository automation for resmgr.
#[derive(Debug, Parser)]
#[command(name = "cargo xtask")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run everything CI checks: fmt, clippy, tests, the codegen check and the Go conformance tests.
    Test {
        /// Also run what CI leaves out for time: the cluster stage of the newest Kubernetes release
        /// on this machine's node (cgroup v1, which that release's kubelet refuses by default),
        /// and the node-v2 scenarios CI runs on one runtime or none (the reboot, MemoryQoS on
        /// CRI-O); about 20 minutes more on two cores.
        #[arg(long)]
        all: bool,
    },
    /// Run the agent's simulator on a built-in scenario and print what was placed where.
    Demo,
    /// Regenerate the protocol code from the .proto files (pure Rust, no protoc).
    Codegen {
        /// Fail if the committed generated code differs from what the .proto files produce.
        #[arg(long)]
        check: bool,
    },
    /// Regenerate docs/configuration.md and docs/metrics.md from the agent's code.
    Docs {
        /// Fail if the committed documents differ from what the code generates.
        #[arg(long)]
        check: bool,
    },
    /// Build the release binary of `resmgr`.
    Build,
    /// Build the stripped release binary and deploy artefacts with SHA-256 checksums into dist/.
    Release {
        /// Output directory (default: dist/ at the repository root).
        #[arg(long)]
        out: Option<PathBuf>,
        /// Ship this binary instead of building one (for tests of the rest of the release).
        #[arg(long)]
        binary: Option<PathBuf>,
        /// Leave out the agent's image (it takes its libraries from Debian's packages, with apt).
        #[arg(long)]
        no_image: bool,
    },
    /// Render deploy/manifests/resmgr.yaml from the Helm chart in deploy/helm/resmgr, with Helm's
    /// own engine (needs Go).
    Manifests {
        /// Fail if the committed manifests differ from what the chart renders.
        #[arg(long)]
        check: bool,
    },
    /// Build the agent's OCI image archive into dist/ without a container engine: the stripped
    /// release binary and the shared libraries it loads, from Debian's packages.
    Image {
        /// Ship this binary instead of building the release binary.
        #[arg(long)]
        binary: Option<PathBuf>,
        /// The image tag (default: the workspace version).
        #[arg(long)]
        tag: Option<String>,
        /// Output directory (default: dist/ at the repository root).
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Run every benchmark of the workspace and the conformance module; print one summary table.
    /// With --scale, the cluster-scale benchmark instead (the real control plane).
    Bench(bench::BenchArgs),
    /// Run resmgr end to end on containerd and runc: real containers, pinned, checked in the
    /// kernel (needs root, the cgroup cpuset controller and Go; builds what it needs).
    E2e(e2e::E2eArgs),
    /// Run the long randomized tests longer than `cargo xtask test` does.
    Soak(soak::Args),
    /// A one-node Kubernetes cluster on this machine with resmgr installed (needs root and Go):
    /// `up` starts it and prints the KUBECONFIG to use, `down` leaves nothing of it behind.
    Cluster {
        #[arg(value_enum)]
        action: e2e::cluster::Action,
        /// The Kubernetes release `up` starts (`1.36`, `1.37`: the minor version a build module
        /// under tests/controlplane pins); default: the primary one, tests/controlplane/build.
        #[arg(long, value_name = "MINOR")]
        kubernetes: Option<String>,
        /// The node's container runtime.
        #[arg(long, value_enum, default_value_t = e2e::args::Runtime::Containerd)]
        runtime: e2e::args::Runtime,
    },
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let root = util::repo_root()?;
    match cli.command {
        Command::Test { all } => test::run(&root, all),
        Command::Demo => release::demo(&root),
        Command::Codegen { check } => codegen::run(&root, check),
        Command::Docs { check } => docs::run(&root, check),
        Command::Build => release::build(&root),
        Command::Release {
            out,
            binary,
            no_image,
        } => release::release(&root, out.as_deref(), binary.as_deref(), !no_image),
        Command::Manifests { check } => manifests::run(&root, check),
        Command::Image { binary, tag, out } => {
            image::run(&root, binary.as_deref(), tag.as_deref(), out.as_deref())
        }
        Command::Bench(args) => bench::run(&root, &args),
        Command::E2e(args) => e2e::run(&root, &args),
        Command::Soak(args) => soak::run(&root, &args),
        Command::Cluster {
            action,
            kubernetes,
            runtime,
        } => e2e::cluster::command(&root, action, kubernetes.as_deref(), runtime),
    }
}
