//! The runtime the e2e runs on, built from its Go modules at pinned versions: containerd, its
//! runc shim and `ctr` (containerd v2.4.2), and `crictl` (cri-tools v1.37.0).
//!
//! No release binaries are downloaded (only the Go module proxy is reachable): `go install`
//! builds them into a cache directory outside the repository,
//! `${XDG_CACHE_HOME:-~/.cache}/resmgr/containerd/<key>/bin`, keyed by the versions, the build
//! flags and the Go version, so a second run reuses them and Go's own module and build caches
//! make a rebuild after a key change cheap. A build goes to a temporary directory next to the
//! final one and is renamed into place, so concurrent runs never see half a toolset.

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::Instant,
};

use anyhow::{Context as _, bail};
use sha2::{Digest as _, Sha256};

use super::{background::Background, cache};
use crate::util;

/// containerd's module version.
pub const CONTAINERD: &str = "v2.4.2";
/// cri-tools' module version (crictl).
pub const CRICTL: &str = "v1.37.0";

/// One `go install`: packages, build tags, whether cgo is on, extra linker flags.
struct Install {
    packages: &'static [&'static str],
    tags: &'static str,
    cgo: bool,
    ldflags: String,
}

fn installs() -> Vec<Install> {
    // What containerd reports to NRI plugins and in `containerd --version`.
    let version = |pkg: &str| format!("-X {pkg}.Version={CONTAINERD}");
    vec![
        // The daemon and ctr, without the snapshotters this e2e does not use (their cgo
        // dependencies are not on a fresh machine) and without the CLI's doc generator.
        Install {
            packages: &[
                "github.com/containerd/containerd/v2/cmd/containerd",
                "github.com/containerd/containerd/v2/cmd/ctr",
            ],
            tags: "no_btrfs,no_devmapper,no_zfs,urfave_cli_no_docs",
            cgo: true,
            ldflags: version("github.com/containerd/containerd/v2/version"),
        },
        // The shim as containerd's release builds it: static, no gRPC.
        Install {
            packages: &["github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2"],
            tags: "urfave_cli_no_docs,no_grpc",
            cgo: false,
            ldflags: version("github.com/containerd/containerd/v2/version"),
        },
        Install {
            packages: &["sigs.k8s.io/cri-tools/cmd/crictl"],
            tags: "",
            cgo: false,
            ldflags: format!("-X sigs.k8s.io/cri-tools/pkg/version.Version={CRICTL}"),
        },
    ]
}

/// The binaries a built toolset holds.
pub const BINARIES: [&str; 4] = ["containerd", "containerd-shim-runc-v2", "crictl", "ctr"];

/// Starts [`ensure`] in the background.
pub fn in_background() -> Background<PathBuf> {
    Background::start("the e2e's containerd build", "resmgr-e2e-tools", |log| {
        ensure(Some(log))
    })
}

/// The cache key: what the binaries are built from.
fn key(go_version: &str) -> String {
    let mut hash = Sha256::new();
    for install in installs() {
        hash.update(install.packages.join(" "));
        hash.update(install.tags);
        hash.update([u8::from(install.cgo)]);
        hash.update(&install.ldflags);
    }
    hash.update(go_version);
    let digest = format!("{:x}", hash.finalize());
    format!("containerd-{CONTAINERD}-crictl-{CRICTL}-{}", &digest[..12])
}

/// The directory holding the built binaries, building them first when the cache has none.
/// With `log`, the build's output goes there instead of to the terminal (a build in the
/// background of other steps).
pub fn ensure(log: Option<&Path>) -> anyhow::Result<PathBuf> {
    let go_version = util::output(Command::new("go").args(["env", "GOVERSION"]))?
        .trim()
        .to_owned();
    let dir = cache::cache_root()?
        .join("containerd")
        .join(key(&go_version));
    let bin = dir.join("bin");
    if BINARIES.iter().all(|b| bin.join(b).is_file()) {
        return Ok(bin);
    }
    std::fs::create_dir_all(dir.parent().unwrap_or(&dir))?;
    cache::remove_abandoned(dir.parent().unwrap_or(&dir));
    let tmp = tempfile::Builder::new()
        .prefix(".building-")
        .tempdir_in(dir.parent().unwrap_or(&dir))?;
    let started = Instant::now();
    eprintln!(
        "building containerd {CONTAINERD} and crictl {CRICTL} with {go_version} into {} (once; later runs reuse them)",
        bin.display()
    );
    build(&tmp.path().join("bin"), log)?;
    eprintln!(
        "built the containerd tools in {:.0} s",
        started.elapsed().as_secs_f64()
    );
    match std::fs::rename(tmp.path(), &dir) {
        Ok(()) => {
            // The directory is ours now; the guard must not remove it.
            let _ = tmp.keep();
        }
        // Another run finished first: use its build.
        Err(_) if BINARIES.iter().all(|b| bin.join(b).is_file()) => {}
        Err(e) => bail!("moving the built tools to {}: {e}", dir.display()),
    }
    Ok(bin)
}

fn build(gobin: &Path, log: Option<&Path>) -> anyhow::Result<()> {
    for install in installs() {
        let mut cmd = super::background::go();
        cmd.args(["install", "-trimpath"])
            .arg(format!("-ldflags={}", install.ldflags))
            .env("GOBIN", gobin)
            .env("CGO_ENABLED", if install.cgo { "1" } else { "0" })
            // Our conformance modules' GOFLAGS (nri_no_wasm) are not meant for these builds.
            .env("GOFLAGS", "-buildvcs=false");
        if !install.tags.is_empty() {
            cmd.arg(format!("-tags={}", install.tags));
        }
        for package in install.packages {
            let version = if package.starts_with("sigs.k8s.io/cri-tools") {
                CRICTL
            } else {
                CONTAINERD
            };
            cmd.arg(format!("{package}@{version}"));
        }
        match log {
            None => util::run(&mut cmd)?,
            Some(log) => {
                let out = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(log)?;
                cmd.stdout(out.try_clone()?).stderr(out);
                let status = cmd.status().context("starting go install")?;
                if !status.success() {
                    bail!(
                        "go install failed ({status}); its output is in {}",
                        log.display()
                    );
                }
            }
        }
    }
    for b in BINARIES {
        if !gobin.join(b).is_file() {
            bail!("go install produced no {b} in {}", gobin.display());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_key_names_the_versions_and_changes_with_go() {
        let a = key("go1.26.8");
        assert!(a.starts_with("containerd-v2.4.2-crictl-v1.37.0-"), "{a}");
        assert_ne!(a, key("go1.26.9"));
        assert_eq!(a, key("go1.26.8"));
    }

    #[test]
    fn every_binary_comes_from_an_install() {
        let all: Vec<&str> = installs()
            .iter()
            .flat_map(|i| i.packages.iter().map(|p| p.rsplit('/').next().unwrap()))
            .collect();
        let mut all = all;
        all.sort_unstable();
        assert_eq!(all, BINARIES);
    }
}
