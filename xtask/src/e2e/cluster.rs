//! The one-node cluster with resmgr installed: the `cluster` stage of `cargo xtask e2e` (the
//! scenarios in `tests/controlplane/clusterscenarios`) and `cargo xtask cluster up|down` for
//! users (`tests/controlplane/cmd/cluster`). Both are package `onenode` of `tests/controlplane`:
//! a real kubelet, kube-controller-manager, kube-scheduler and kube-apiserver, a container
//! runtime (containerd, or CRI-O: [`Runtime`]) with runc, the agent installed with Helm from the
//! chart.
//!
//! This module gathers what the cluster runs and passes it in the environment:
//! - the control plane's binaries of one Kubernetes release, kubelet and
//!   kube-controller-manager included ([`build::kubernetes::binaries`]; the stage runs once per
//!   release and runtime ([`runtimes`]), `cluster up` starts the primary release on containerd
//!   unless `--kubernetes` and `--runtime` say otherwise);
//! - containerd, its shim, `ctr` and `crictl` from the containerd stage's build
//!   ([`build::containerd`]), and on CRI-O the CRI-O stage's `crio` and `pinns`
//!   ([`build::crio`]) with Debian's conmon and docs/deploy.md, whose CRI-O drop-in the node's
//!   CRI-O uses; Debian's runc and CNI plugins (`containernetworking-plugins`), installed with
//!   apt;
//! - the `helm` command, built once from the Go module proxy at the Helm version xtask's chart
//!   renderer uses and cached like the rest ([`build::helm`]);
//! - the test image (also under the name the examples run, `docker.io/library/busybox:1.37`) and
//!   the agent's image from the debug binary, loaded into the runtime.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
    time::Instant,
};

use anyhow::{Context as _, bail};

use super::{
    args::{Runtime, Scenarios},
    containerd, controlplane, crio,
};
use crate::{
    build::{self, background::Background, kubernetes::Release},
    missing::{self, Missing},
    sysdeps, timing, util, workspace,
};

/// Debian packages the cluster runs: the OCI runtime, the test image's only program, the CNI
/// plugins (bridge, host-local, loopback) and the tools that make its namespaces.
const PACKAGES: &[&str] = &[
    "runc",
    "busybox-static",
    "containernetworking-plugins",
    "iproute2",
    "util-linux",
];

/// Where Debian's containernetworking-plugins puts the plugins.
const CNI_DIR: &str = "/usr/lib/cni";

/// What the machine lacks for the cluster on `runtime`; empty when it can run.
pub fn prerequisites_on(runtime: Runtime) -> Vec<Missing> {
    let mut missing = prerequisites();
    if runtime == Runtime::Crio {
        for m in crio::prerequisites() {
            if !missing.iter().any(|have| have.what == m.what) {
                missing.push(m);
            }
        }
    }
    missing
}

/// What the machine lacks for the cluster on containerd; empty when it can run.
pub fn prerequisites() -> Vec<Missing> {
    let mut missing = containerd::prerequisites();
    for m in controlplane::prerequisites() {
        if !missing.iter().any(|have| have.what == m.what) {
            missing.push(m);
        }
    }
    if !Path::new("/proc/self/ns/net").exists() {
        missing.push(Missing {
            what: "network namespaces".into(),
            how: "the cluster runs in a network namespace of its own: use a kernel with CONFIG_NET_NS".into(),
        });
    }
    missing
}

/// The background builds a cluster takes its programs from, those `cargo xtask test` started
/// ([`super::Builds::prefetched`]); what is not among them comes from the cache, or is built.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Prefetched<'a> {
    pub containerd: Option<&'a Background<PathBuf>>,
    pub crio: Option<&'a Background<PathBuf>>,
    pub helm: Option<&'a Background<PathBuf>>,
}

/// The agent's image a cluster runs.
#[derive(Debug, Clone, Copy)]
pub(crate) enum AgentImage<'a> {
    /// From the binary of a cargo profile (`debug`, `release`), which must have been built.
    Of(&'a str),
    /// From the debug binary without its debug information, for a node that imports images
    /// slowly ([`build::agent_image::of_profile_without_debug_info`]).
    DebugWithoutDebugInfo,
}

/// Everything the cluster runs on `runtime`, as the environment of `tests/controlplane`'s
/// programs; the images are written into `out`, which a cluster running at the same time must
/// not share.
pub(crate) fn environment(
    root: &Path,
    out: &Path,
    agent: AgentImage<'_>,
    runtime: Runtime,
    control_plane: &Path,
    prefetched: Prefetched<'_>,
) -> anyhow::Result<Vec<(&'static str, String)>> {
    let missing = prerequisites_on(runtime);
    if !missing.is_empty() {
        bail!(
            "the cluster on {} cannot run here:\n{}",
            runtime.name(),
            missing::list(&missing)
        );
    }
    sysdeps::ensure_packages(PACKAGES)?;
    if runtime == Runtime::Crio {
        sysdeps::ensure_packages(crio::PACKAGES)?;
    }
    let tools = match prefetched.containerd {
        Some(p) => p.get()?,
        None => build::containerd::ensure(None)?,
    };
    let helm = match prefetched.helm {
        Some(p) => p.get()?,
        None => build::helm::ensure(root, None)?,
    };
    fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let busybox = Path::new(build::test_image::BUSYBOX);
    let test_image = build::test_image::build(busybox, out)?;
    let example_image =
        build::test_image::build_as(busybox, out, EXAMPLE_IMAGE, "resmgr-example-image.tar")?;
    let (agent_image, agent_image_name) = match agent {
        AgentImage::Of(profile) => build::agent_image::of_profile(root, out, profile)?,
        AgentImage::DebugWithoutDebugInfo => {
            build::agent_image::of_profile_without_debug_info(root, out, "debug")?
        }
    };
    let runc = ["/usr/sbin/runc", "/usr/bin/runc"]
        .into_iter()
        .find(|p| Path::new(p).is_file())
        .context("runc is not installed (apt-get install runc)")?;
    let s = |p: &Path| p.to_string_lossy().into_owned();
    let mut env = vec![
        ("RESMGR_CLUSTER_RUNTIME", runtime.arg().to_owned()),
        ("RESMGR_CLUSTER_EXAMPLE_IMAGE", s(&example_image)),
        ("RESMGR_CONTROLPLANE_BIN_DIR", s(control_plane)),
        ("RESMGR_CLUSTER_CONTAINERD_DIR", s(&tools)),
        ("RESMGR_CLUSTER_RUNC", runc.to_owned()),
        ("RESMGR_CLUSTER_CNI_DIR", CNI_DIR.to_owned()),
        ("RESMGR_CLUSTER_HELM", s(&helm)),
        ("RESMGR_CLUSTER_CHART", s(&root.join(helm_chart::CHART_DIR))),
        ("RESMGR_CLUSTER_AGENT_IMAGE", s(&agent_image)),
        ("RESMGR_CLUSTER_AGENT_IMAGE_NAME", agent_image_name),
        ("RESMGR_CLUSTER_TEST_IMAGE", s(&test_image)),
        (
            "RESMGR_CLUSTER_TEST_IMAGE_NAME",
            build::test_image::NAME.to_owned(),
        ),
    ];
    if runtime == Runtime::Crio {
        let crio = match prefetched.crio {
            Some(p) => p.get()?,
            None => build::crio::ensure(None)?,
        };
        env.extend([
            ("RESMGR_CLUSTER_CRIO_DIR", s(&crio)),
            ("RESMGR_CLUSTER_CONMON", s(&crio::conmon()?)),
            ("RESMGR_CLUSTER_DEPLOY_DOC", s(&root.join("docs/deploy.md"))),
        ]);
    }
    Ok(env)
}

/// Where a cluster of `profile`'s agent writes its images (`target/cluster/<profile>`).
fn out_dir(root: &Path, profile: &str) -> anyhow::Result<PathBuf> {
    Ok(workspace::target_dir(root)?.join("cluster").join(profile))
}

/// The name the examples (examples/kubernetes) give their image, which the node cannot pull:
/// the test image, busybox too, is loaded under it.
const EXAMPLE_IMAGE: &str = "docker.io/library/busybox:1.37";

/// The scenarios the stage runs on containerd only, and why each adds nothing on CRI-O: what
/// they check is the agent's and the kubelet's, and the part of it that is the runtime's another
/// scenario checks on CRI-O. This is what pays for the CRI-O cluster in `cargo xtask test`'s
/// time; `--only` runs one on CRI-O all the same.
pub const CONTAINERD_ONLY: &[(&str, &str)] = &[(
    "TestAPrepareRefusedWhileTheCPUsAreStillHeldIsAnEventOnThePodAndRunsLater",
    "the agent refusing a prepare while a force-deleted pod's claim still holds the CPUs, and the \
     kubelet retrying it at its pod resync, 70 to 90 s later; the runtime's part, stopping the old \
     pod's containers before the unprepare, is TestDeletingAClaimPodUnpreparesRightAfterTheKubeletStopsItsContainers",
)];

/// The scenarios whose outcome depends on the Kubernetes release: what the kubelet writes for the
/// node-allocatable mapping and for a memory claim, the health stream's version, the metadata
/// file's. `cargo xtask test` runs only these on the newest release's cluster on this machine's
/// node ([`super::in_test`]); the rest of that release runs on its users' node, in the node-v2
/// stage. Each stands alone (`--only` runs them in a fresh cluster).
pub const RELEASE_SPECIFIC: &[&str] = &[
    "TestTheKubeletAddsAClaimsMappedCPUsToThePodsLimitsFrom137",
    "TestTheKubeletStreamsDeviceHealthInTheVersionItsReleasePrefers",
    "TestAMemoryAndHugepagesClaimIsHeldToItsClaimInTheKernel",
    "TestAPodReadsItsClaimsCPUsInItsDeviceMetadata",
];

/// The runtimes the stage runs on for `release`: those `wanted` names, or by default containerd
/// on every release and CRI-O on the primary one. The CRI-O build is 1.36, which goes with
/// Kubernetes 1.36 (CRI-O's minor follows Kubernetes'); what CRI-O adds to the scenarios is its
/// side (NRI, CDI, cgroups, sandboxes), which a newer kubelet and API server do not change,
/// while every scenario's Kubernetes side runs on both releases on containerd.
pub fn runtimes(release: &Release, wanted: &[Runtime]) -> Vec<Runtime> {
    if !wanted.is_empty() {
        return wanted.to_vec();
    }
    let mut all = vec![Runtime::Containerd];
    if release.is_primary() {
        all.push(Runtime::Crio);
    }
    all
}

/// The `cluster` stage: the scenarios against a fresh cluster of `release`, whose binaries are
/// in `control_plane`, on `runtime`.
pub fn run(
    root: &Path,
    scenarios: Scenarios<'_>,
    release: &Release,
    runtime: Runtime,
    control_plane: &Path,
    prefetched: Prefetched<'_>,
) -> anyhow::Result<()> {
    let started = Instant::now();
    let on = format!("Kubernetes {} and {}", release.version(), runtime.name());
    eprintln!("cluster stage on {on}");
    workspace::build_test_binaries(root)?;
    let env = environment(
        root,
        &out_dir(root, "debug")?,
        AgentImage::Of("debug"),
        runtime,
        control_plane,
        prefetched,
    )?;
    let mut go = Command::new("go");
    go.current_dir(root.join("tests/controlplane"))
        .envs(env)
        .env("GOFLAGS", workspace::go_flags())
        .args(["test", &scenarios.count_flag(), "-v", "-timeout=30m"]);
    if !scenarios.only.is_empty() {
        go.args(["-run", &scenarios.only.join("|")]);
    } else if runtime == Runtime::Crio {
        let names: Vec<&str> = CONTAINERD_ONLY.iter().map(|(n, _)| *n).collect();
        go.args(["-skip", &format!("^({})$", names.join("|"))]);
        for (name, why) in CONTAINERD_ONLY {
            eprintln!("not run on CRI-O, run on containerd: {name}: {why}");
            timing::not_run_here(format!("{name} (on containerd only)"));
        }
    }
    let skipped = util::run_go_test(go.arg("./clusterscenarios/"))?;
    eprintln!(
        "cluster stage on {on} finished in {:.0} s",
        started.elapsed().as_secs_f64()
    );
    for skip in skipped {
        eprintln!("SKIPPED (not passed) on {on}: {skip}");
        timing::skipped(format!("{skip} (on {on})"));
    }
    Ok(())
}

/// The benchmarks of the cluster (pod start-up with and without a claim) on the primary
/// Kubernetes release, with the agent's image from the release binary, which `cargo xtask
/// bench` has built; their output.
pub fn bench(root: &Path) -> anyhow::Result<String> {
    let control_plane =
        build::kubernetes::binaries(&build::kubernetes::release(root, None)?, None)?;
    let env = environment(
        root,
        &out_dir(root, "release")?,
        AgentImage::Of("release"),
        Runtime::Containerd,
        &control_plane,
        Prefetched::default(),
    )?;
    util::output(
        Command::new("go")
            .current_dir(root.join("tests/controlplane"))
            .envs(env)
            .env("GOFLAGS", workspace::go_flags())
            .args([
                "test",
                "-count=1",
                "-run",
                "^$",
                "-bench",
                ".",
                "-benchtime=1x",
            ])
            .args(["-timeout=30m", "./clusterscenarios/"]),
    )
}

/// `cargo xtask cluster up|down`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Action {
    /// Start the cluster with resmgr installed and print the KUBECONFIG to use.
    Up,
    /// Take it down: every process, mount, cgroup, namespace and link, its hugepages and its
    /// files.
    Down,
}

/// Runs `tests/controlplane/cmd/cluster` with what it needs; `up` starts the Kubernetes
/// release `kubernetes` names (`1.37`), by default the primary one, on `runtime`.
pub fn command(
    root: &Path,
    action: Action,
    kubernetes: Option<&str>,
    runtime: Runtime,
) -> anyhow::Result<()> {
    let mut program = Command::new("go");
    program
        .current_dir(root.join("tests/controlplane"))
        .env("GOFLAGS", workspace::go_flags());
    match action {
        Action::Up => {
            if !sysdeps::running_as_root() {
                bail!(
                    "the cluster needs root (namespaces, cgroups, containerd): run `cargo xtask cluster up` as root"
                );
            }
            let release = build::kubernetes::release(root, kubernetes)?;
            let control_plane = build::kubernetes::binaries(&release, None)?;
            workspace::build_test_binaries(root)?;
            program
                .envs(environment(
                    root,
                    &out_dir(root, "debug")?,
                    AgentImage::Of("debug"),
                    runtime,
                    &control_plane,
                    Prefetched::default(),
                )?)
                .args(["run", "./cmd/cluster", "up"])
        }
        Action::Down => program.args(["run", "./cmd/cluster", "down"]),
    };
    util::run(&mut program)
}
