//! CRI-O v1.36.2 (the release that goes with Kubernetes 1.36), built from its Go module for the
//! e2e's CRI-O stage ([`crate::e2e::crio`]).
//!
//! The Go module proxy serves the module at its exact version but refuses its version list, so
//! `go install pkg@version` cannot build it: the module is downloaded, copied out of the
//! read-only module cache and built there with its own `go.mod`. One of its requirements,
//! `k8s.io/cri-client v0.36.0-rc.0`, is refused by the proxy as well; the build replaces it
//! with the released v0.36.0 (the same API). The build tags avoid the C libraries the stage does
//! not use (gpgme: `containers_image_openpgp`; btrfs; ostree) and keep seccomp (libseccomp-dev
//! from apt), which the agent's pod asks for. `pinns`, CRI-O's small C helper that pins a pod's
//! namespaces, is compiled from the same module with `cc`.
//!
//! The binaries are cached like the containerd build, in
//! `${XDG_CACHE_HOME:-~/.cache}/resmgr/crio/<key>/bin`, keyed by the version, the build's flags
//! and the Go version; a build goes to a temporary directory next to the final one and is
//! renamed into place.

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::Instant,
};

use anyhow::{Context as _, bail};
use sha2::{Digest as _, Sha256};

use super::{background::Background, cache};
use crate::{sysdeps, util};

/// CRI-O's module version.
pub const VERSION: &str = "v1.36.2";
/// The module.
const MODULE: &str = "github.com/cri-o/cri-o";
/// Build tags: no gpgme, btrfs or ostree (their C libraries are not needed here); seccomp on.
const TAGS: &str = "containers_image_ostree_stub containers_image_openpgp exclude_graphdriver_btrfs btrfs_noversion seccomp";
/// Requirements the proxy refuses, and what replaces them.
const REPLACES: &[(&str, &str)] = &[(
    "k8s.io/cri-client@v0.36.0-rc.0",
    "k8s.io/cri-client@v0.36.0",
)];
/// pinns' sources in the module, and its compiler flags (those of its Makefile).
const PINNS_SOURCES: &[&str] = &["pinns/src/pinns.c", "pinns/src/sysctl.c"];
const PINNS_CFLAGS: &[&str] = &["-std=c99", "-Os", "-Wall", "-Werror", "-Wextra", "-static"];

/// The binaries a build holds.
pub const BINARIES: [&str; 2] = ["crio", "pinns"];

/// Starts [`ensure`] in the background.
pub fn in_background() -> Background<PathBuf> {
    Background::start("the e2e's CRI-O build", "resmgr-e2e-crio", |log| {
        ensure(Some(log))
    })
}

/// The cache key: what the binaries are built from.
fn key(go_version: &str) -> String {
    let mut hash = Sha256::new();
    hash.update(VERSION);
    hash.update(TAGS);
    for (from, to) in REPLACES {
        hash.update(from);
        hash.update(to);
    }
    hash.update(PINNS_CFLAGS.join(" "));
    hash.update(go_version);
    let digest = format!("{:x}", hash.finalize());
    format!("crio-{VERSION}-{}", &digest[..12])
}

/// The directory holding `crio` and `pinns`, building them first when the cache has none. With
/// `log`, the build's output goes there instead of to the terminal.
pub fn ensure(log: Option<&Path>) -> anyhow::Result<PathBuf> {
    let go_version = util::output(Command::new("go").args(["env", "GOVERSION"]))?
        .trim()
        .to_owned();
    let dir = cache::cache_root()?.join("crio").join(key(&go_version));
    let bin = dir.join("bin");
    if BINARIES.iter().all(|b| bin.join(b).is_file()) {
        return Ok(bin);
    }
    let parent = dir.parent().unwrap_or(&dir).to_owned();
    std::fs::create_dir_all(&parent)?;
    cache::remove_abandoned(&parent);
    // libseccomp's headers must be there before the build starts.
    sysdeps::ensure_packages(&["libseccomp-dev"])?;
    let tmp = tempfile::Builder::new()
        .prefix(".building-")
        .tempdir_in(&parent)?;
    let started = Instant::now();
    eprintln!(
        "building CRI-O {VERSION} with {go_version} into {} (once; later runs reuse it)",
        bin.display()
    );
    build(tmp.path(), log)?;
    eprintln!("built CRI-O in {:.0} s", started.elapsed().as_secs_f64());
    match std::fs::rename(tmp.path(), &dir) {
        Ok(()) => {
            // The directory is ours now; the guard must not remove it.
            let _ = tmp.keep();
        }
        Err(_) if BINARIES.iter().all(|b| bin.join(b).is_file()) => {}
        Err(e) => bail!("moving the built CRI-O to {}: {e}", dir.display()),
    }
    Ok(bin)
}

/// Runs `cmd`, its output to `log` when given.
fn run_logged(cmd: &mut Command, log: Option<&Path>, what: &str) -> anyhow::Result<()> {
    match log {
        None => util::run(cmd),
        Some(log) => {
            let out = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(log)?;
            cmd.stdout(out.try_clone()?).stderr(out);
            let status = cmd.status().with_context(|| format!("starting {what}"))?;
            if !status.success() {
                bail!(
                    "{what} failed ({status}); its output is in {}",
                    log.display()
                );
            }
            Ok(())
        }
    }
}

/// A `go` command for the build ([`super::background::go`], with our conformance GOFLAGS left
/// out).
fn go(dir: &Path) -> Command {
    let mut cmd = super::background::go();
    cmd.current_dir(dir).env("GOFLAGS", "-buildvcs=false");
    cmd
}

/// Builds `crio` and `pinns` into `out/bin`, from a copy of the module in `out/src` (removed
/// afterwards).
fn build(out: &Path, log: Option<&Path>) -> anyhow::Result<()> {
    let download = util::output(
        go(out)
            .args(["mod", "download", "-json"])
            .arg(format!("{MODULE}@{VERSION}")),
    )?;
    let info: serde_json::Value =
        serde_json::from_str(&download).context("reading go mod download's answer")?;
    let module = info["Dir"]
        .as_str()
        .with_context(|| format!("go mod download of {MODULE}@{VERSION}: {download}"))?;
    let src = out.join("src");
    util::run(Command::new("cp").arg("-R").arg(module).arg(&src))?;
    util::run(Command::new("chmod").args(["-R", "u+w"]).arg(&src))?;
    for (from, to) in REPLACES {
        util::run(
            go(&src)
                .args(["mod", "edit"])
                .arg(format!("-replace={from}={to}")),
        )?;
    }
    let bin = out.join("bin");
    std::fs::create_dir_all(&bin)?;
    run_logged(
        go(&src)
            .args(["build", "-mod=mod", "-trimpath"])
            .arg(format!("-tags={TAGS}"))
            .arg("-o")
            .arg(bin.join("crio"))
            .arg("./cmd/crio")
            .env("CGO_ENABLED", "1"),
        log,
        "go build of CRI-O",
    )?;
    run_logged(
        Command::new("cc")
            .current_dir(&src)
            .args(PINNS_CFLAGS)
            .arg("-o")
            .arg(bin.join("pinns"))
            .args(PINNS_SOURCES),
        log,
        "cc of pinns",
    )?;
    std::fs::remove_dir_all(&src)?;
    for b in BINARIES {
        if !bin.join(b).is_file() {
            bail!("the build produced no {b} in {}", bin.display());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_key_names_the_version_and_changes_with_go() {
        let a = key("go1.26.8");
        assert!(a.starts_with("crio-v1.36.2-"), "{a}");
        assert_ne!(a, key("go1.26.9"));
        assert_eq!(a, key("go1.26.8"));
    }
}
