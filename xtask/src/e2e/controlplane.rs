//! The control-plane stage of the end-to-end tests: `resmgr run` against a real kube-apiserver,
//! kube-scheduler and kube-controller-manager, on nodes without a kubelet (`tests/controlplane`),
//! once per Kubernetes release the e2e covers ([`crate::build::kubernetes`] builds them).
//!
//! It runs the scenarios with `go test`, with the workspace's binaries (`RESMGR_BIN_DIR`) and the
//! control plane's (`RESMGR_CONTROLPLANE_BIN_DIR`): first every scenario but the `OnCRIO` ones,
//! on containerd's NRI library; then the `OnCRIO` ones on the CRI-O stage's CRI-O (`e2e --
//! COMMAND`), which need what that stage needs (root, the cpuset controller, a C compiler):
//! without it, they fail the stage under `CI=true` and are reported as not run elsewhere. (On
//! containerd the cluster stage runs the same with the real kubelet.) The `OnCRIO` ones run on
//! the primary release only: the stage's CRI-O is 1.36, the release that goes with Kubernetes
//! 1.36, and what they check is CRI-O's side (its NRI and CDI), which a newer API server does
//! not change; that saves a minute of every `cargo xtask test`. The scenarios ask the API server
//! its version where what they expect differs between releases.
//!
//! Its [`prerequisites`] are Go and openssl; no root.

use std::{path::Path, process::Command, time::Instant};

use anyhow::bail;

use super::{args::E2eArgs, crio};
use crate::{
    build::{self, kubernetes::Release},
    missing::{self, Missing},
    util, workspace,
};

/// Runs the stage on one release, whose binaries are in `control_plane`: the scenarios against
/// `bin_dir`'s `resmgr`.
pub fn run(
    root: &Path,
    bin_dir: &Path,
    release: &Release,
    control_plane: &Path,
) -> anyhow::Result<()> {
    let started = Instant::now();
    eprintln!(
        "control plane stage on Kubernetes {} ({})",
        release.version(),
        control_plane.display()
    );
    let result = scenarios(root, bin_dir, release, control_plane);
    eprintln!(
        "control plane stage on Kubernetes {}: {} in {:.0} s",
        release.version(),
        if result.is_ok() { "done" } else { "failed" },
        started.elapsed().as_secs_f64()
    );
    result
}

/// The stage's scenarios on the control plane in `control_plane`.
fn scenarios(
    root: &Path,
    bin_dir: &Path,
    release: &Release,
    control_plane: &Path,
) -> anyhow::Result<()> {
    let dir = root.join("tests/controlplane");
    util::run(
        Command::new("go")
            .current_dir(&dir)
            .env("RESMGR_BIN_DIR", bin_dir)
            .env("RESMGR_CONTROLPLANE_BIN_DIR", control_plane)
            .env("GOFLAGS", workspace::go_flags())
            .args(["test", "-count=1", "-v", "-timeout=20m"])
            .args(["-skip", ON_CRIO, "./internal/...", "./scenarios/"]),
    )?;
    if !release.is_primary() {
        eprintln!(
            "the {ON_CRIO} scenarios run on the primary Kubernetes release only (CRI-O {} goes with it)",
            build::crio::VERSION
        );
        return Ok(());
    }
    // The CRI-O stage brings up its CRI-O and runs this against it; `env` carries our variables
    // through it.
    let mut command = vec!["env".to_owned()];
    for (name, value) in [
        ("RESMGR_BIN_DIR", bin_dir.as_os_str()),
        ("RESMGR_CONTROLPLANE_BIN_DIR", control_plane.as_os_str()),
    ] {
        command.push(format!("{name}={}", value.to_string_lossy()));
    }
    command.push(format!("GOFLAGS={}", workspace::go_flags()));
    command.extend(["go".to_owned(), "-C".to_owned()]);
    command.push(dir.to_string_lossy().into_owned());
    command.extend(
        [
            "test",
            "-count=1",
            "-v",
            "-timeout=10m",
            "-run",
            ON_CRIO,
            "./scenarios/",
        ]
        .map(str::to_owned),
    );
    let missing = crio::prerequisites();
    if !missing.is_empty() {
        let what = format!(
            "the control plane scenarios on CRI-O ({ON_CRIO}) need what the CRI-O stage needs; this machine lacks:\n{}",
            missing::list(&missing)
        );
        if std::env::var("CI").is_ok_and(|v| v == "true") {
            bail!("CI=true and {what}");
        }
        eprintln!("NOT RUN: {what}\n(under CI=true this is a failure)");
        return Ok(());
    }
    crio::run(
        root,
        &E2eArgs {
            command,
            ..E2eArgs::default()
        },
        None,
    )
}

/// The scenarios that run on the CRI-O stage's real CRI-O.
const ON_CRIO: &str = "OnCRIO";

/// What the machine lacks for the stage; empty when it can run.
pub fn prerequisites() -> Vec<Missing> {
    let mut missing = Vec::new();
    if !util::have("go") {
        missing.push(Missing {
            what: "Go (builds the control plane and runs the scenarios)".into(),
            how: "install Go 1.26 or later from https://go.dev/dl/ and put `go` on PATH".into(),
        });
    }
    if !util::have("openssl") {
        missing.push(Missing {
            what: "openssl (makes the control plane's certificates)".into(),
            how: "apt-get install openssl".into(),
        });
    }
    missing
}
