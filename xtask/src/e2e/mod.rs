//! `cargo xtask e2e`: resmgr end to end, in stages (`--stage` picks; default all):
//!
//! - `containerd`: on a real runtime, below;
//! - `crio`: the same scenarios on CRI-O, runc and conmon ([`crio`]), through the same runner;
//! - `controlplane`: against a real kube-apiserver, kube-scheduler and kube-controller-manager,
//!   on nodes without a kubelet ([`crate::controlplane`]);
//! - `cluster`: in a real one-node cluster, kubelet and controller-manager included, the agent
//!   installed with Helm ([`crate::cluster`]).
//!
//! The last two run once per Kubernetes release the repository has a build module for
//! ([`controlplane::releases`]; `--kubernetes 1.37` picks one).
//!
//! The containerd stage sets up what the run needs and hands over to the runner
//! (`tests/src/bin/e2e`, the binary `e2e`), which starts containerd, the fake API server and
//! `resmgr run`, plays the kubelet, runs the scenarios and tears everything down:
//!
//! 1. checks the machine ([`prerequisites`]: root, a cgroup cpuset controller, overlayfs, Go,
//!    two CPUs) and says what is missing and how to get it;
//! 2. installs `runc` and `busybox-static` with apt (as `cargo xtask test` installs the hwloc
//!    packages);
//! 3. builds containerd, its shim, `ctr` and `crictl` at pinned versions, or reuses the cached
//!    build ([`tools`]);
//! 4. builds the workspace's binaries, the test image ([`image`], with [`xtask::oci`]) and the
//!    agent's image from the debug binary ([`crate::image`]), and the chart renderer;
//! 5. runs `e2e`.
//!
//! `cargo xtask test` runs each stage after the conformance tests when the machine can; under
//! `CI=true` a missing prerequisite fails the run instead ([`in_test`]).

pub mod crio;
pub mod image;
pub mod tools;

use std::{
    ffi::OsString,
    path::{Path, PathBuf},
    process::Command,
    time::Instant,
};

use anyhow::{Context as _, bail};

use crate::{cluster, controlplane, sysdeps, test, util};

/// Debian packages the e2e uses: the OCI runtime and the test image's only program.
const PACKAGES: &[&str] = &["runc", "busybox-static"];

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
    /// Run only these scenarios (repeat); default: all. Most build on the ones before them.
    #[arg(long, value_name = "SCENARIO")]
    pub only: Vec<String>,
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

/// How the e2e starts the agent.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum AgentAs {
    #[default]
    Container,
    Process,
}

/// One thing the machine lacks, and how to get it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Missing {
    pub what: String,
    pub how: String,
}

impl std::fmt::Display for Missing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.what, self.how)
    }
}

/// What the machine lacks for the e2e; empty when it can run.
pub fn prerequisites() -> Vec<Missing> {
    let mut missing = Vec::new();
    let mut need = |what: &str, how: &str| {
        missing.push(Missing {
            what: what.into(),
            how: how.into(),
        });
    };
    if !sysdeps::running_as_root() {
        need(
            "root",
            "containerd, runc and the pods' cgroups need root: run `cargo xtask e2e` as root (the e2e touches nothing outside its own run directory and cgroups)",
        );
    }
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    if !has_cpuset(&mounts, |p| std::fs::read_to_string(p).ok()) {
        need(
            "the cgroup cpuset controller",
            "mount it (cgroup v1: `mkdir -p /sys/fs/cgroup/cpuset && mount -t cgroup -o cpuset cpuset /sys/fs/cgroup/cpuset`) or enable it on cgroup v2 (`echo +cpuset > /sys/fs/cgroup/cgroup.subtree_control`)",
        );
    }
    let filesystems = std::fs::read_to_string("/proc/filesystems").unwrap_or_default();
    if !filesystems
        .lines()
        .any(|l| l.trim_end().ends_with("overlay"))
    {
        need(
            "the overlay filesystem (containerd's snapshotter)",
            "load it: `modprobe overlay`",
        );
    }
    if !util::have("go") {
        need(
            "Go (builds containerd and crictl)",
            "install Go 1.26.6 or later from https://go.dev/dl/ and put `go` on PATH",
        );
    }
    match online_cpus() {
        Some(n) if n >= 2 => {}
        Some(n) => need(
            &format!("a second CPU (this machine has {n})"),
            "the e2e reserves one CPU and pins containers to the others: run it on a machine with 2 CPUs or more",
        ),
        None => need(
            "/sys/devices/system/cpu/online",
            "the e2e runs on Linux with sysfs mounted",
        ),
    }
    missing
}

/// Whether a cgroup hierarchy with the cpuset controller is mounted: a v1 `cpuset` mount, or
/// cgroup2 whose root offers `cpuset` (`read` reads a file).
fn has_cpuset(mounts: &str, read: impl Fn(&Path) -> Option<String>) -> bool {
    mounts.lines().any(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        match f.as_slice() {
            [_, _, "cgroup", options, ..] => options.split(',').any(|o| o == "cpuset"),
            [_, point, "cgroup2", ..] => read(&Path::new(point).join("cgroup.controllers"))
                .is_some_and(|c| c.split_whitespace().any(|c| c == "cpuset")),
            _ => false,
        }
    })
}

/// How many CPUs are online.
fn online_cpus() -> Option<usize> {
    let text = std::fs::read_to_string("/sys/devices/system/cpu/online").ok()?;
    let mut n = 0;
    for part in text.trim().split(',').filter(|p| !p.is_empty()) {
        let (lo, hi) = part.split_once('-').unwrap_or((part, part));
        n += hi.parse::<usize>().ok()? + 1 - lo.parse::<usize>().ok()?;
    }
    Some(n)
}

/// `cargo xtask e2e`: the stages `args` selects, in order.
pub fn run(root: &Path, args: &E2eArgs) -> anyhow::Result<()> {
    // A command runs against the containerd stage's node; the control plane has none to give.
    let all = args.stage.is_empty() && args.command.is_empty();
    if args.stage.is_empty() && !args.command.is_empty() {
        return containerd(root, args, None);
    }
    if all || args.stage.contains(&Stage::Containerd) {
        containerd(root, args, None)?;
    }
    if all || args.stage.contains(&Stage::Crio) {
        crio::run(root, args, None)?;
    }
    let releases = controlplane::select(root, &args.kubernetes)?;
    if all || args.stage.contains(&Stage::Controlplane) {
        let missing = controlplane::prerequisites();
        if !missing.is_empty() {
            bail!("the control plane e2e cannot run here:\n{}", list(&missing));
        }
        let bin_dir = test::build_test_binaries(root)?;
        for release in &releases {
            let binaries = controlplane::binaries(release, None)?;
            controlplane::run(root, &bin_dir, release, &binaries)?;
        }
    }
    if all || args.stage.contains(&Stage::Cluster) {
        for release in &releases {
            let binaries = controlplane::binaries(release, None)?;
            cluster::run(root, &args.only, release, &binaries, None, None)?;
        }
    }
    Ok(())
}

/// The containerd stage's runtime build, started in the background so that it overlaps other
/// work.
#[derive(Debug)]
pub struct Prefetch {
    build: std::thread::JoinHandle<anyhow::Result<PathBuf>>,
    log: PathBuf,
}

/// Starts building the containerd stage's runtime in the background when the machine can run
/// the stage: `cargo xtask test` does this first, so that on a fresh machine the Go module
/// downloads and builds (minutes, `nice`d) overlap the Rust build and tests instead of
/// following them.
pub fn prefetch() -> Option<Prefetch> {
    if !prerequisites().is_empty() {
        return None;
    }
    let log = std::env::temp_dir().join(format!("resmgr-e2e-tools-{}.log", std::process::id()));
    let build_log = log.clone();
    let build = std::thread::spawn(move || tools::ensure(Some(&build_log)));
    Some(Prefetch { build, log })
}

impl Prefetch {
    pub(crate) fn join(self) -> anyhow::Result<PathBuf> {
        if !self.build.is_finished() {
            eprintln!(
                "waiting for the e2e's containerd build to finish (its output: {})",
                self.log.display()
            );
        }
        let built = self
            .build
            .join()
            .map_err(|_| anyhow::anyhow!("the build of the e2e's runtime panicked"))?;
        if built.is_ok() {
            let _ = std::fs::remove_file(&self.log);
        }
        built
    }
}

/// The containerd stage, with the runtime from [`prefetch`] when it was started; with
/// `args.command`, that command runs against its containerd instead of the scenarios.
pub(crate) fn containerd(
    root: &Path,
    args: &E2eArgs,
    prefetched: Option<Prefetch>,
) -> anyhow::Result<()> {
    let missing = prerequisites();
    if !missing.is_empty() {
        bail!("the e2e cannot run here:\n{}", list(&missing));
    }
    let started = Instant::now();
    sysdeps::ensure_packages(PACKAGES)?;
    let tools = match prefetched {
        Some(p) => p.join()?,
        None => tools::ensure(None)?,
    };
    let flags: Vec<OsString> = vec!["--runc".into(), runc()?.into()];
    run_runner(root, args, &tools, &flags, started)
}

/// Builds what the runner needs besides the runtime and runs it: `tools` holds crictl (and
/// containerd's binaries), `runtime` are the runner's flags for the runtime.
pub(crate) fn run_runner(
    root: &Path,
    args: &E2eArgs,
    tools: &Path,
    runtime: &[OsString],
    started: Instant,
) -> anyhow::Result<()> {
    let bin_dir = test::build_test_binaries(root)?;
    let out = test::target_dir(root)?.join("e2e");
    std::fs::create_dir_all(&out)?;
    let image = image::build(Path::new(image::BUSYBOX), &out)?;
    let fake_apiserver = [
        bin_dir.join("fake-apiserver"),
        bin_dir.join("examples/fake-apiserver"),
    ]
    .into_iter()
    .find(|p| p.is_file())
    .context("the fake API server binary was not built")?;
    eprintln!("e2e prepared in {:.0} s", started.elapsed().as_secs_f64());
    let mut cmd = Command::new(bin_dir.join("e2e"));
    cmd.arg("--tools")
        .arg(tools)
        .args(runtime)
        .arg("--image")
        .arg(&image)
        .args(["--image-name", image::NAME])
        .arg("--resmgr")
        .arg(bin_dir.join("resmgr"))
        .arg("--fake-apiserver")
        .arg(&fake_apiserver);
    if args.keep {
        cmd.arg("--keep");
    }
    for scenario in &args.only {
        cmd.args(["--only", scenario]);
    }
    if args.command.is_empty() && args.agent_as == AgentAs::Container {
        // The image from the debug binary just built: a release build would cost minutes of
        // CI for the same code; `cargo xtask image` builds the shipped one the same way.
        let (agent_image, agent_image_name) = crate::image::for_e2e(root, &out)?;
        let helm = crate::manifests::build_helm(root)?;
        cmd.args(["--agent-as", "container"])
            .arg("--agent-image")
            .arg(&agent_image)
            .args(["--agent-image-name", &agent_image_name])
            .arg("--helm")
            .arg(helm.program())
            .arg("--chart")
            .arg(root.join(xtask::helm::CHART_DIR));
    } else {
        cmd.args(["--agent-as", "process"]);
    }
    for flag in &args.agent_args {
        cmd.arg(format!("--agent-arg={flag}"));
    }
    if !args.command.is_empty() {
        cmd.arg("--").args(&args.command);
    }
    util::run(&mut cmd)?;
    eprintln!("e2e finished in {:.0} s", started.elapsed().as_secs_f64());
    Ok(())
}

/// runc as installed by the package.
fn runc() -> anyhow::Result<PathBuf> {
    ["/usr/sbin/runc", "/usr/bin/runc"]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
        .context("runc is not installed (apt-get install runc)")
}

pub(crate) fn list(missing: &[Missing]) -> String {
    missing
        .iter()
        .map(|m| format!("  - {m}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The e2e as a step of `cargo xtask test`: each stage runs when the machine can (the
/// containerd stage with the runtime from [`prefetch`], the CRI-O stage with
/// [`crio::prefetch`], the control plane and cluster stages with the binaries of
/// [`controlplane::prefetch`] and the cluster stage with its [`cluster::prefetch`]); when it
/// cannot, fail under `CI=true` (CI machines are made for it) and otherwise say what is
/// missing and go on.
///
/// The control plane and cluster stages run once per Kubernetes release
/// ([`controlplane::releases`]), the primary release's two first: the releases are built in the
/// background in that order, so on a fresh machine the next release's build overlaps the stages
/// of the one before it.
pub fn in_test(
    root: &Path,
    mut prefetched: Option<Prefetch>,
    mut control_plane: Option<controlplane::Prefetch>,
    mut cluster: Option<cluster::Prefetch>,
    mut cri_o: Option<crio::Prefetch>,
) -> anyhow::Result<()> {
    // CRI-O before the control plane, whose real-runtime scenarios also run on the CRI-O it
    // builds.
    let mut stages = vec![(Stage::Containerd, None), (Stage::Crio, None)];
    for release in controlplane::releases(root)? {
        stages.push((Stage::Controlplane, Some(release.clone())));
        stages.push((Stage::Cluster, Some(release)));
    }
    for (stage, release) in stages {
        let (name, missing) = match stage {
            Stage::Containerd => ("the containerd e2e", prerequisites()),
            Stage::Crio => ("the CRI-O e2e", crio::prerequisites()),
            Stage::Controlplane => ("the control plane e2e", controlplane::prerequisites()),
            Stage::Cluster => ("the cluster e2e", cluster::prerequisites()),
        };
        if missing.is_empty() {
            let args = E2eArgs {
                stage: vec![stage],
                ..E2eArgs::default()
            };
            let mut binaries = |release: &controlplane::Release| match control_plane.as_mut() {
                Some(p) => p.take(release),
                None => controlplane::binaries(release, None),
            };
            match (stage, release) {
                (Stage::Containerd, _) => containerd(root, &args, prefetched.take())?,
                (Stage::Crio, _) => crio::run(root, &args, cri_o.take())?,
                (Stage::Controlplane, Some(release)) => {
                    let binaries = binaries(&release)?;
                    let bin_dir = test::build_test_binaries(root)?;
                    controlplane::run(root, &bin_dir, &release, &binaries)?;
                }
                (Stage::Cluster, Some(release)) => {
                    let binaries = binaries(&release)?;
                    cluster::run(root, &[], &release, &binaries, cluster.take(), None)?;
                }
                // The control plane and cluster stages are listed with their release.
                (Stage::Controlplane | Stage::Cluster, None) => {}
            }
        } else {
            let on = release
                .as_ref()
                .map(|r| format!(" on Kubernetes {}", r.minor()))
                .unwrap_or_default();
            if std::env::var("CI").is_ok_and(|v| v == "true") {
                bail!(
                    "CI=true and {name}{on} cannot run here:\n{}",
                    list(&missing)
                );
            }
            let release_arg = release
                .as_ref()
                .map(|r| format!(" --kubernetes {}", r.minor()))
                .unwrap_or_default();
            eprintln!(
                "NOT RUN: {name}{on} (`cargo xtask e2e --stage {}{release_arg}`), because this machine lacks:\n{}\n\
                 (under CI=true this is a failure)",
                clap::ValueEnum::to_possible_value(&stage)
                    .map(|v| v.get_name().to_owned())
                    .unwrap_or_default(),
                list(&missing)
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cpuset_controller_is_found_on_v1_and_on_v2() {
        let v1 = "cgroup /sys/fs/cgroup/cpu cgroup rw,relatime,cpu 0 0\n\
                  cgroup /sys/fs/cgroup/cpuset cgroup rw,relatime,cpuset 0 0\n";
        assert!(has_cpuset(v1, |_| None));
        let v1_without = "cgroup /sys/fs/cgroup/cpu cgroup rw,relatime,cpu 0 0\n";
        assert!(!has_cpuset(v1_without, |_| None));
        let v2 = "cgroup2 /sys/fs/cgroup cgroup2 rw,nosuid 0 0\n";
        let controllers = |want: &'static str| {
            move |p: &Path| {
                assert_eq!(p, Path::new("/sys/fs/cgroup/cgroup.controllers"));
                Some(want.to_owned())
            }
        };
        assert!(has_cpuset(v2, controllers("cpu cpuset memory")));
        assert!(!has_cpuset(v2, controllers("cpu memory")));
    }

    #[test]
    fn missing_things_are_listed_with_how_to_get_them() {
        let text = list(&[Missing {
            what: "Go".into(),
            how: "install it".into(),
        }]);
        assert_eq!(text, "  - Go: install it");
    }
}
