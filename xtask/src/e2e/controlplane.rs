//! The control-plane stage of the end-to-end tests: `resmgr run` against a real kube-apiserver,
//! kube-scheduler and kube-controller-manager, on nodes without a kubelet (`tests/controlplane`),
//! once per Kubernetes release the e2e covers ([`crate::build::kubernetes`] builds them).
//!
//! It runs the scenarios with `go test`, with the workspace's binaries (`RESMGR_BIN_DIR`) and the
//! control plane's (`RESMGR_CONTROLPLANE_BIN_DIR`), on containerd's NRI library: its nodes are
//! not the machine (any topology, device model, flags and gates). What a real kubelet and real
//! runtimes show, on containerd and on CRI-O, is the cluster stage's ([`super::cluster`]). The
//! scenarios ask the API server its version where what they expect differs between releases.
//!
//! Its [`prerequisites`] are Go and openssl; no root.

use std::{path::Path, process::Command, time::Instant};

use crate::{build::kubernetes::Release, missing::Missing, util, workspace};

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
    let result = scenarios(root, bin_dir, control_plane);
    eprintln!(
        "control plane stage on Kubernetes {}: {} in {:.0} s",
        release.version(),
        if result.is_ok() { "done" } else { "failed" },
        started.elapsed().as_secs_f64()
    );
    result
}

/// The stage's scenarios on the control plane in `control_plane`.
fn scenarios(root: &Path, bin_dir: &Path, control_plane: &Path) -> anyhow::Result<()> {
    util::run(
        Command::new("go")
            .current_dir(root.join("tests/controlplane"))
            .env("RESMGR_BIN_DIR", bin_dir)
            .env("RESMGR_CONTROLPLANE_BIN_DIR", control_plane)
            .env("GOFLAGS", workspace::go_flags())
            .args(["test", "-count=1", "-v", "-timeout=20m"])
            .args(["./internal/...", "./scenarios/"]),
    )
}

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
