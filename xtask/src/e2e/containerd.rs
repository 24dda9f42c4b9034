//! The containerd stage: resmgr on containerd 2.4 and runc. It sets up what the run needs and
//! hands over to the runner (`tests/src/bin/e2e`, the binary `e2e`), which starts containerd, the
//! fake API server and `resmgr run`, plays the kubelet, runs the scenarios and tears everything
//! down:
//!
//! 1. checks the machine ([`prerequisites`]: root, a cgroup cpuset controller, overlayfs, Go,
//!    two CPUs) and says what is missing and how to get it;
//! 2. installs `runc` and `busybox-static` with apt (as `cargo xtask test` installs the hwloc
//!    packages);
//! 3. builds containerd, its shim, `ctr` and `crictl` at pinned versions, or reuses the cached
//!    build ([`build::containerd`]);
//! 4. builds the workspace's binaries, the test image ([`build::test_image`]) and the agent's
//!    image from the debug binary ([`build::agent_image`]), and the chart renderer;
//! 5. runs `e2e`.
//!
//! The CRI-O stage runs the same runner ([`run_runner`]) with CRI-O in containerd's place.

use std::{
    ffi::OsString,
    path::{Path, PathBuf},
    process::Command,
    time::Instant,
};

use anyhow::{Context as _, bail};

use super::args::{AgentAs, E2eArgs};
use crate::{
    build::{self, background::Background},
    missing::{self, Missing},
    sysdeps, util, workspace,
};

/// Debian packages the e2e uses: the OCI runtime and the test image's only program.
const PACKAGES: &[&str] = &["runc", "busybox-static"];

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

/// The containerd stage, with the runtime from a background build
/// ([`build::containerd::in_background`]) when one was started; with `args.command`, that
/// command runs against its containerd instead of the scenarios.
pub fn run(
    root: &Path,
    args: &E2eArgs,
    prefetched: Option<&Background<PathBuf>>,
) -> anyhow::Result<()> {
    let missing = prerequisites();
    if !missing.is_empty() {
        bail!("the e2e cannot run here:\n{}", missing::list(&missing));
    }
    let started = Instant::now();
    sysdeps::ensure_packages(PACKAGES)?;
    let tools = match prefetched {
        Some(p) => p.get()?,
        None => build::containerd::ensure(None)?,
    };
    let flags: Vec<OsString> = vec!["--runc".into(), runc()?.into()];
    run_runner(root, args, &tools, &flags, started)
}

/// Builds what the runner needs besides the runtime and runs it: `tools` holds crictl (and
/// containerd's binaries), `runtime` are the runner's flags for the runtime.
pub fn run_runner(
    root: &Path,
    args: &E2eArgs,
    tools: &Path,
    runtime: &[OsString],
    started: Instant,
) -> anyhow::Result<()> {
    let bin_dir = workspace::build_test_binaries(root)?;
    let out = workspace::target_dir(root)?.join("e2e");
    std::fs::create_dir_all(&out)?;
    let image = build::test_image::build(Path::new(build::test_image::BUSYBOX), &out)?;
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
        .args(["--image-name", build::test_image::NAME])
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
        let (agent_image, agent_image_name) = build::agent_image::for_e2e(root, &out)?;
        let helm = workspace::build_helm(root)?;
        cmd.args(["--agent-as", "container"])
            .arg("--agent-image")
            .arg(&agent_image)
            .args(["--agent-image-name", &agent_image_name])
            .arg("--helm")
            .arg(helm.program())
            .arg("--chart")
            .arg(root.join(helm_chart::CHART_DIR));
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
pub fn runc() -> anyhow::Result<PathBuf> {
    ["/usr/sbin/runc", "/usr/bin/runc"]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
        .context("runc is not installed (apt-get install runc)")
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
}
