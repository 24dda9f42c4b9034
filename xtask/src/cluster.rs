//! The one-node cluster with resmgr installed: the `cluster` stage of `cargo xtask e2e` (the
//! scenarios in `tests/controlplane/clusterscenarios`) and `cargo xtask cluster up|down` for
//! users (`tests/controlplane/cmd/cluster`). Both are package `onenode` of `tests/controlplane`:
//! a real kubelet, kube-controller-manager, kube-scheduler and kube-apiserver, containerd and
//! runc, the agent installed with Helm from the chart.
//!
//! This module gathers what the cluster runs and passes it in the environment:
//! - the control plane's binaries of one Kubernetes release, kubelet and
//!   kube-controller-manager included ([`controlplane::binaries`]; the stage runs once per
//!   release, `cluster up` starts the primary one unless `--kubernetes` names another);
//! - containerd, its shim and `ctr` from the containerd stage's build ([`e2e::tools`]) and
//!   Debian's runc and CNI plugins (`containernetworking-plugins`), installed with apt;
//! - the `helm` command, built once from the Go module proxy at the Helm version xtask's chart
//!   renderer uses and cached like the rest ([`helm`]);
//! - the test image and the agent's image from the debug binary, imported into containerd.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
    time::Instant,
};

use anyhow::{Context as _, bail};

use crate::{
    controlplane,
    e2e::{self, Missing},
    sysdeps, test, util,
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

/// What the machine lacks for the cluster; empty when it can run.
pub fn prerequisites() -> Vec<Missing> {
    let mut missing = e2e::prerequisites();
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

/// The cluster's build, started in the background by `cargo xtask test`: the helm command
/// (the control plane's binaries come with [`controlplane::prefetch`]).
#[derive(Debug)]
pub struct Prefetch {
    helm: std::thread::JoinHandle<anyhow::Result<PathBuf>>,
}

/// Starts building what only the cluster needs when it can run.
pub fn prefetch(root: &Path) -> Option<Prefetch> {
    if !prerequisites().is_empty() {
        return None;
    }
    let root = root.to_owned();
    let log = std::env::temp_dir().join(format!("resmgr-helm-build-{}.log", std::process::id()));
    Some(Prefetch {
        helm: std::thread::spawn(move || {
            let built = helm(&root, Some(&log));
            if built.is_ok() {
                let _ = fs::remove_file(&log);
            }
            built
        }),
    })
}

/// Everything the cluster runs, as the environment of `tests/controlplane`'s programs; the
/// agent's image is made from the binary of cargo's `profile`, which must have been built.
pub(crate) fn environment(
    root: &Path,
    profile: &str,
    prefetched: Option<Prefetch>,
    control_plane: &Path,
    containerd: Option<e2e::Prefetch>,
) -> anyhow::Result<Vec<(&'static str, String)>> {
    let missing = prerequisites();
    if !missing.is_empty() {
        bail!("the cluster cannot run here:\n{}", e2e::list(&missing));
    }
    sysdeps::ensure_packages(PACKAGES)?;
    let tools = match containerd {
        Some(p) => p.join()?,
        None => e2e::tools::ensure(None)?,
    };
    let helm = match prefetched {
        Some(p) => p
            .helm
            .join()
            .map_err(|_| anyhow::anyhow!("the helm build panicked"))??,
        None => helm(root, None)?,
    };
    let out = test::target_dir(root)?.join("cluster").join(profile);
    fs::create_dir_all(&out)?;
    let test_image = e2e::image::build(Path::new(e2e::image::BUSYBOX), &out)?;
    let (agent_image, agent_image_name) = crate::image::of_profile(root, &out, profile)?;
    let runc = ["/usr/sbin/runc", "/usr/bin/runc"]
        .into_iter()
        .find(|p| Path::new(p).is_file())
        .context("runc is not installed (apt-get install runc)")?;
    let s = |p: &Path| p.to_string_lossy().into_owned();
    Ok(vec![
        ("RESMGR_CONTROLPLANE_BIN_DIR", s(control_plane)),
        ("RESMGR_CLUSTER_CONTAINERD_DIR", s(&tools)),
        ("RESMGR_CLUSTER_RUNC", runc.to_owned()),
        ("RESMGR_CLUSTER_CNI_DIR", CNI_DIR.to_owned()),
        ("RESMGR_CLUSTER_HELM", s(&helm)),
        (
            "RESMGR_CLUSTER_CHART",
            s(&root.join(xtask::helm::CHART_DIR)),
        ),
        ("RESMGR_CLUSTER_AGENT_IMAGE", s(&agent_image)),
        ("RESMGR_CLUSTER_AGENT_IMAGE_NAME", agent_image_name),
        ("RESMGR_CLUSTER_TEST_IMAGE", s(&test_image)),
        (
            "RESMGR_CLUSTER_TEST_IMAGE_NAME",
            e2e::image::NAME.to_owned(),
        ),
    ])
}

/// The `cluster` stage: the scenarios against a fresh cluster of `release`, whose binaries are
/// in `control_plane`.
pub fn run(
    root: &Path,
    only: &[String],
    release: &controlplane::Release,
    control_plane: &Path,
    prefetched: Option<Prefetch>,
    containerd: Option<e2e::Prefetch>,
) -> anyhow::Result<()> {
    let started = Instant::now();
    eprintln!("cluster stage on Kubernetes {}", release.version());
    test::build_test_binaries(root)?;
    let env = environment(root, "debug", prefetched, control_plane, containerd)?;
    let mut go = Command::new("go");
    go.current_dir(root.join("tests/controlplane"))
        .envs(env)
        .env("GOFLAGS", test::go_flags())
        .args(["test", "-count=1", "-v", "-timeout=30m"]);
    if !only.is_empty() {
        go.args(["-run", &only.join("|")]);
    }
    util::run(go.arg("./clusterscenarios/"))?;
    eprintln!(
        "cluster stage on Kubernetes {} finished in {:.0} s",
        release.version(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// The benchmarks of the cluster (pod start-up with and without a claim) on the primary
/// Kubernetes release, with the agent's image from the release binary, which `cargo xtask
/// bench` has built; their output.
pub fn bench(root: &Path) -> anyhow::Result<String> {
    let control_plane = controlplane::binaries(&controlplane::release(root, None)?, None)?;
    let env = environment(root, "release", None, &control_plane, None)?;
    util::output(
        Command::new("go")
            .current_dir(root.join("tests/controlplane"))
            .envs(env)
            .env("GOFLAGS", test::go_flags())
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
    /// Take it down: every process, mount, cgroup, namespace and link, and its files.
    Down,
}

/// Runs `tests/controlplane/cmd/cluster` with what it needs; `up` starts the Kubernetes
/// release `kubernetes` names (`1.37`), by default the primary one.
pub fn command(root: &Path, action: Action, kubernetes: Option<&str>) -> anyhow::Result<()> {
    let mut program = Command::new("go");
    program
        .current_dir(root.join("tests/controlplane"))
        .env("GOFLAGS", test::go_flags());
    match action {
        Action::Up => {
            if !crate::sysdeps::running_as_root() {
                bail!(
                    "the cluster needs root (namespaces, cgroups, containerd): run `cargo xtask cluster up` as root"
                );
            }
            let release = controlplane::release(root, kubernetes)?;
            let control_plane = controlplane::binaries(&release, None)?;
            test::build_test_binaries(root)?;
            program
                .envs(environment(root, "debug", None, &control_plane, None)?)
                .args(["run", "./cmd/cluster", "up"])
        }
        Action::Down => program.args(["run", "./cmd/cluster", "down"]),
    };
    util::run(&mut program)
}

/// The helm command at the version of `xtask/helm/go.mod`, from the cache or built now (with
/// `log`, its output goes there).
pub fn helm(root: &Path, log: Option<&Path>) -> anyhow::Result<PathBuf> {
    let go_mod = root.join(xtask::helm::PROGRAM_DIR).join("go.mod");
    let text =
        fs::read_to_string(&go_mod).with_context(|| format!("reading {}", go_mod.display()))?;
    let version = helm_version(&text)
        .with_context(|| format!("{} requires no helm.sh/helm/v4", go_mod.display()))?;
    let go_version = util::output(Command::new("go").args(["env", "GOVERSION"]))?
        .trim()
        .to_owned();
    let dir = e2e::tools::cache_root()?
        .join("helm")
        .join(format!("{version}-{go_version}"));
    let program = dir.join("helm");
    if program.is_file() {
        return Ok(program);
    }
    let parent = dir.parent().context("cache directory has no parent")?;
    fs::create_dir_all(parent)?;
    e2e::tools::remove_abandoned(parent);
    let staging = tempfile::Builder::new()
        .prefix(".building-")
        .tempdir_in(parent)?;
    eprintln!("building helm {version} (once; later runs reuse it)");
    let started = Instant::now();
    let mut build = Command::new("nice");
    build
        .args(["-n", "10", "go", "install", "-trimpath"])
        .arg(format!(
            "-ldflags=-s -w -X helm.sh/helm/v4/internal/version.version={version}"
        ))
        .arg(format!("helm.sh/helm/v4/cmd/helm@{version}"))
        .env("GOBIN", staging.path())
        .env("CGO_ENABLED", "0")
        .env("GOFLAGS", "-buildvcs=false");
    match log {
        None => util::run(&mut build)?,
        Some(log) => {
            let out = fs::File::create(log)?;
            build.stdout(out.try_clone()?).stderr(out);
            if !build.status().context("starting go install")?.success() {
                bail!("building helm failed; its output is in {}", log.display());
            }
        }
    }
    eprintln!("built helm in {:.0} s", started.elapsed().as_secs_f64());
    let built = staging.keep();
    if fs::rename(&built, &dir).is_err() {
        let _ = fs::remove_dir_all(&built);
    }
    if !program.is_file() {
        bail!("helm was built but {} is missing", program.display());
    }
    Ok(program)
}

fn helm_version(go_mod: &str) -> Option<String> {
    go_mod.lines().find_map(|line| {
        let line = line.trim();
        let line = line.strip_prefix("require").unwrap_or(line).trim_start();
        let version = line
            .strip_prefix("helm.sh/helm/v4 ")?
            .split_whitespace()
            .next()?;
        version.starts_with('v').then(|| version.to_owned())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_helms_version_from_the_renderers_module() {
        assert_eq!(
            helm_version("module x\n\nrequire helm.sh/helm/v4 v4.3.2\n").as_deref(),
            Some("v4.3.2")
        );
        assert_eq!(
            helm_version("require (\n\thelm.sh/helm/v4 v4.3.2 // indirect\n)\n").as_deref(),
            Some("v4.3.2")
        );
        assert_eq!(helm_version("require k8s.io/api v0.36.3\n"), None);
    }
}
