//! The `node-v2` stage: resmgr on the node its users run, cgroup v2 alone and the systemd cgroup
//! driver, with the newest Kubernetes release's kubelet (whose `failCgroupV1` refuses v1 by
//! default) and the runtime's systemd cgroup manager, in a VM (the scenarios in
//! `tests/controlplane/nodev2scenarios`, the node from package `onenode` with its `VM` option).
//!
//! The machine the e2e runs on may be cgroup v1, so the node is a qemu guest booted from
//! [`build::vm_image`] with systemd as PID 1 and cgroup v2 alone; its kubelet and runtime are
//! the cluster stage's builds, shared into the guest read-only (9p) from a directory this
//! module fills, and its control plane runs here, on loopback. qemu emulates the guest (TCG):
//! the KVM these machines offer runs only guests built for it, and a stock kernel does not
//! boot on it. The stage runs once per runtime ([`runtimes`]): containerd with runc's
//! `SystemdCgroup`, and CRI-O with `cgroup_manager = "systemd"`.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
    time::Instant,
};

use anyhow::Context as _;

use super::{
    args::{Runtime, Scenarios},
    cluster,
};
use crate::{
    build::{self, background::Background, kubernetes::Release, vm_image::VmImage},
    missing::Missing,
    timing, util, workspace,
};

/// The Kubernetes release the node runs by default: the newest one the repository has a build
/// module for, whose kubelet refuses cgroup v1 by default (`--kubernetes` picks another).
pub fn release(root: &Path) -> anyhow::Result<Release> {
    let mut releases = build::kubernetes::releases(root)?;
    releases.sort_by_key(|r| {
        r.minor()
            .split('.')
            .map(|p| p.parse::<u32>().unwrap_or(0))
            .collect::<Vec<_>>()
    });
    releases
        .pop()
        .context("no Kubernetes release under tests/controlplane")
}

/// The runtimes the stage runs on: those `wanted` names, or both.
pub fn runtimes(wanted: &[Runtime]) -> Vec<Runtime> {
    if wanted.is_empty() {
        vec![Runtime::Containerd, Runtime::Crio]
    } else {
        wanted.to_vec()
    }
}

/// What the machine lacks for the stage on `runtime`; empty when it can run: what the cluster
/// stage needs (the runtime's builds and the control plane, which run here). The VM's own
/// packages (qemu, mmdebstrap) are installed with apt when missing, as the cluster's are; it
/// needs neither KVM nor cgroup v2 on this machine.
pub fn prerequisites_on(runtime: Runtime) -> Vec<Missing> {
    cluster::prerequisites_on(runtime)
}

/// The scenarios CI leaves out for time, and why each adds little where it is left out: the
/// emulated node makes each cost minutes. Without `--all` the reboot runs on neither runtime,
/// and MemoryQoS on containerd only; what the runtime does with the systemd driver (its scopes,
/// the cpusets it gives systemd, a daemon-reload, cgroup v2 alone) runs on both.
pub const LEFT_OUT: &[LeftOut] = &[
    LeftOut {
        scenario: "TestARebootKeepsTheClaimAndTheAgentPreparesItAgain",
        runs_on: &[],
        why: "the kubelet preparing claims again after a reboot and the agent restoring them from its state directory are the kubelet's and the agent's, played in the acceptance suite on every run; a real reboot costs two emulated boots (about 4.5 minutes)",
    },
    LeftOut {
        scenario: "TestAMemoryClaimsNodeAndHugepagesAndWhatMemoryQoSWrites",
        runs_on: &[Runtime::Containerd],
        why: "what the kubelet writes for MemoryQoS and the agent's memory and hugepages limits are the kubelet's and the agent's, the same on both runtimes; two rollouts of the agent (about 2 minutes)",
    },
];

/// A scenario CI runs on some runtimes only ([`LEFT_OUT`]).
#[derive(Debug)]
pub struct LeftOut {
    pub scenario: &'static str,
    /// The runtimes it runs on without `--all`.
    pub runs_on: &'static [Runtime],
    pub why: &'static str,
}

/// The scenarios left out on `runtime` unless `--all`.
pub fn left_out(runtime: Runtime) -> impl Iterator<Item = &'static LeftOut> {
    LEFT_OUT
        .iter()
        .filter(move |l| !l.runs_on.contains(&runtime))
}

/// The stage on `release` and `runtime`: the scenarios against a fresh cluster whose node is a
/// VM (less [`left_out`] unless `all`). With `log`, the scenarios' output (`go test`'s, the
/// node's progress and, after a failure, its console and journals) goes to that file instead of
/// this process's: the stage then runs beside others ([`super::in_test`]), whose output it would
/// cut into.
#[allow(clippy::too_many_arguments)]
pub fn run(
    root: &Path,
    scenarios: Scenarios<'_>,
    all: bool,
    release: &Release,
    runtime: Runtime,
    image: Option<&Background<VmImage>>,
    prefetched: cluster::Prefetched<'_>,
    control_plane: Option<PathBuf>,
    log: Option<&Path>,
) -> anyhow::Result<()> {
    let started = Instant::now();
    let on = format!(
        "Kubernetes {} and {} with the systemd cgroup driver on cgroup v2, in a VM",
        release.version(),
        runtime.name()
    );
    eprintln!("node-v2 stage on {on}");
    let image = match image {
        Some(p) => p.get()?,
        None => build::vm_image::ensure(None)?,
    };
    let control_plane = match control_plane {
        Some(dir) => dir,
        None => build::kubernetes::binaries(release, None)?,
    };
    workspace::build_test_binaries(root)?;
    // The guest imports the agent's image under emulation: without the debug information and
    // symbols the debug binary carries, it has half the bytes to copy, unpack and hash. The
    // images go to a directory of the stage's own, per runtime: a cluster stage may be writing
    // its own at the same time.
    let out = out_dir(root, runtime)?;
    let mut env = cluster::environment(
        root,
        &out,
        cluster::AgentImage::DebugWithoutDebugInfo,
        runtime,
        &control_plane,
        prefetched,
    )?;
    let share = out.join("share");
    fill_share(&share, &env, &control_plane)?;
    let s = |p: &Path| p.to_string_lossy().into_owned();
    env.extend([
        ("RESMGR_VM_KERNEL", s(&image.kernel)),
        ("RESMGR_VM_INITRD", s(&image.initrd)),
        ("RESMGR_VM_IMAGE", s(&image.image)),
        ("RESMGR_VM_SSH_KEY", s(&image.key)),
        ("RESMGR_VM_SHARE", s(&share)),
    ]);
    // Beside other stages, the node (qemu, and its control plane here) yields the CPU to them.
    let mut go = if log.is_some() {
        let mut nice = Command::new("nice");
        nice.args(["-n", "5", "go"]);
        nice
    } else {
        Command::new("go")
    };
    go.current_dir(root.join("tests/controlplane"))
        .envs(env)
        .env("GOFLAGS", workspace::go_flags())
        .args(["test", &scenarios.count_flag(), "-v", "-timeout=40m"]);
    if !scenarios.only.is_empty() {
        go.args(["-run", &scenarios.only.join("|")]);
    } else if !all {
        let left: Vec<&LeftOut> = left_out(runtime).collect();
        if !left.is_empty() {
            let names: Vec<&str> = left.iter().map(|l| l.scenario).collect();
            go.args(["-skip", &format!("^({})$", names.join("|"))]);
        }
        for l in left {
            let elsewhere = match l.runs_on {
                [] => "on no runtime".to_owned(),
                on => format!(
                    "on {} only",
                    on.iter()
                        .map(|r| r.name())
                        .collect::<Vec<_>>()
                        .join(" and ")
                ),
            };
            eprintln!(
                "not run on {} (CI runs it {elsewhere}; `--all` runs it): {}: {}",
                runtime.name(),
                l.scenario,
                l.why
            );
            timing::not_run_here(format!("{} (node-v2, {elsewhere})", l.scenario));
        }
    }
    let skipped = match log {
        None => util::run_go_test(go.arg("./nodev2scenarios/"))?,
        Some(log) => util::run_go_test_into(go.arg("./nodev2scenarios/"), log)?,
    };
    eprintln!(
        "node-v2 stage on {on} finished in {:.0} s",
        started.elapsed().as_secs_f64()
    );
    for skip in skipped {
        eprintln!("SKIPPED (not passed) on {on}: {skip}");
        timing::skipped(format!("{skip} (on {on})"));
    }
    Ok(())
}

/// The stage's own directory on `runtime`, for its images and the share (`target/node-v2/<runtime>`).
fn out_dir(root: &Path, runtime: Runtime) -> anyhow::Result<PathBuf> {
    Ok(workspace::target_dir(root)?
        .join("node-v2")
        .join(runtime.arg()))
}

/// Where the scenarios' output goes when the stage runs beside others ([`run`]'s `log`).
pub fn log_path(root: &Path, runtime: Runtime) -> anyhow::Result<PathBuf> {
    Ok(out_dir(root, runtime)?.join("scenarios.log"))
}

/// Fills the directory shared into the guest: the runtime's binaries (containerd/, crio/), the
/// kubelet and the image archives (images/), as package onenode's VM node expects them. Files
/// are hard links where the file system allows (9p does not follow symbolic links out of the
/// share), copies otherwise.
fn fill_share(share: &Path, env: &[(&str, String)], control_plane: &Path) -> anyhow::Result<()> {
    if share.exists() {
        fs::remove_dir_all(share)?;
    }
    let get = |name: &str| {
        env.iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| PathBuf::from(v))
    };
    let mut files: Vec<(PathBuf, PathBuf)> =
        vec![(control_plane.join("kubelet"), share.join("kubelet"))];
    let dirs = [
        ("RESMGR_CLUSTER_CONTAINERD_DIR", "containerd"),
        ("RESMGR_CLUSTER_CRIO_DIR", "crio"),
    ];
    for (var, to) in dirs {
        let Some(dir) = get(var) else { continue };
        for entry in fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))? {
            let path = entry?.path();
            if path.is_file() {
                files.push((
                    path.clone(),
                    share.join(to).join(path.file_name().unwrap_or_default()),
                ));
            }
        }
    }
    for var in [
        "RESMGR_CLUSTER_TEST_IMAGE",
        "RESMGR_CLUSTER_AGENT_IMAGE",
        "RESMGR_CLUSTER_EXAMPLE_IMAGE",
    ] {
        let archive = get(var).with_context(|| format!("{var} is not set"))?;
        let name = archive.file_name().unwrap_or_default().to_owned();
        files.push((archive, share.join("images").join(name)));
    }
    for (from, to) in files {
        fs::create_dir_all(to.parent().unwrap_or(share))?;
        if fs::hard_link(&from, &to).is_err() {
            fs::copy(&from, &to)
                .with_context(|| format!("copying {} to {}", from.display(), to.display()))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A scenario renamed in Go and not here would run in CI again, unnoticed.
    #[test]
    fn every_scenario_left_out_is_one_of_the_stage() {
        for l in LEFT_OUT {
            super::super::tests::assert_scenario("nodev2scenarios", l.scenario);
        }
    }

    #[test]
    fn ci_runs_memory_qos_on_containerd_and_the_reboot_nowhere() {
        let names = |rt| left_out(rt).map(|l| l.scenario).collect::<Vec<_>>();
        assert_eq!(
            names(Runtime::Containerd),
            ["TestARebootKeepsTheClaimAndTheAgentPreparesItAgain"]
        );
        assert_eq!(names(Runtime::Crio).len(), 2);
    }
}
