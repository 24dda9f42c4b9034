//! The e2e's CRI-O stage: the containerd stage's runner on CRI-O ([`crate::build::crio`]), with
//! Debian's conmon and runc (`e2e --runtime crio`), running there only the scenarios that need an
//! exact instant or a fault, and those they build on (the runner's `ON_CRIO`, each with why); the
//! cluster stage runs the rest on CRI-O under the real kubelet ([`super::cluster`]). Debian's crun
//! (1.8.1, OCI spec 1.0) refuses the specs CRI-O 1.36 writes (`unknown version specified`), so
//! the OCI runtime is runc, as on the containerd stage.

use std::{
    ffi::OsString,
    path::{Path, PathBuf},
    time::Instant,
};

use anyhow::{Context as _, bail};

use super::{args::E2eArgs, containerd};
use crate::{
    build::{self, background::Background},
    missing::{self, Missing},
    sysdeps, util,
};

/// Debian packages the stage uses: CRI-O's monitor and OCI runtime, libseccomp's headers for
/// the build, the test image's only program, and iptables (CRI-O will not start without it: its
/// HostPortManager needs iptables or nft, which a fresh machine may not have).
pub(crate) const PACKAGES: &[&str] = &[
    "conmon",
    "runc",
    "libseccomp-dev",
    "busybox-static",
    "iptables",
];

/// What the machine lacks for the CRI-O stage, beyond the containerd stage's needs.
pub fn prerequisites() -> Vec<Missing> {
    let mut missing = containerd::prerequisites();
    if !util::have("cc") {
        missing.push(Missing {
            what: "a C compiler (builds CRI-O's pinns and its seccomp binding)".into(),
            how: "apt-get install gcc".into(),
        });
    }
    missing
}

/// conmon as installed by the package.
pub(crate) fn conmon() -> anyhow::Result<PathBuf> {
    ["/usr/bin/conmon", "/usr/libexec/crio/conmon"]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
        .context("conmon is not installed (apt-get install conmon)")
}

/// The CRI-O stage, with CRI-O from a background build ([`build::crio::in_background`]) when
/// one was started.
pub fn run(
    root: &Path,
    args: &E2eArgs,
    prefetched: Option<&Background<PathBuf>>,
) -> anyhow::Result<()> {
    let missing = prerequisites();
    if !missing.is_empty() {
        bail!(
            "the CRI-O e2e cannot run here:\n{}",
            missing::list(&missing)
        );
    }
    let started = Instant::now();
    sysdeps::ensure_packages(PACKAGES)?;
    // crictl comes with the containerd stage's tools.
    let tools = build::containerd::ensure(None)?;
    let crio = match prefetched {
        Some(p) => p.get()?,
        None => build::crio::ensure(None)?,
    };
    let flags: Vec<OsString> = vec![
        "--runtime".into(),
        "crio".into(),
        "--crio".into(),
        crio.join("crio").into(),
        "--pinns".into(),
        crio.join("pinns").into(),
        "--conmon".into(),
        conmon()?.into(),
        "--oci-runtime".into(),
        containerd::runc()?.into(),
        "--deploy-doc".into(),
        root.join("docs/deploy.md").into(),
    ];
    containerd::run_runner(root, args, &tools, &flags, started)
}
