//! The workspace as the other commands see it: where cargo puts things, the binaries the tests
//! and stages run, the release binary and version, the Go flags and modules of the Go tests,
//! and the chart renderer. Helpers only: this module runs no command of its own.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::Context;
use helm_chart::Helm;

use crate::util;

/// Builds every binary and example of the workspace (debug) and returns the directory they are in.
pub fn build_test_binaries(root: &Path) -> anyhow::Result<PathBuf> {
    util::run(util::cargo().current_dir(root).args([
        "build",
        "--workspace",
        "--bins",
        "--examples",
        "--locked",
    ]))?;
    Ok(target_dir(root)?.join("debug"))
}

/// GOFLAGS for the conformance modules: the NRI adaptation is built without its WASM plugin
/// support, which needs a WASM runtime we do not use.
pub fn go_flags() -> String {
    let mut flags = std::env::var("GOFLAGS").unwrap_or_default();
    for flag in ["-tags=nri_no_wasm", "-buildvcs=false"] {
        if !flags.split_whitespace().any(|f| f == flag) {
            flags.push(' ');
            flags.push_str(flag);
        }
    }
    flags.trim().to_owned()
}

/// Every directory under `dir` that holds a go.mod, sorted.
pub fn go_modules(dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let mut modules = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        if d.join("go.mod").is_file() {
            modules.push(d.clone());
        }
        for entry in std::fs::read_dir(&d).with_context(|| format!("reading {}", d.display()))? {
            let path = entry?.path();
            if path.is_dir()
                && path
                    .file_name()
                    .is_some_and(|n| n != "testdata" && n != "bin")
            {
                stack.push(path);
            }
        }
    }
    modules.sort();
    Ok(modules)
}

/// Cargo's target directory, honouring CARGO_TARGET_DIR and config.
pub fn target_dir(root: &Path) -> anyhow::Result<PathBuf> {
    let meta = util::metadata(root)?;
    meta["target_directory"]
        .as_str()
        .map(PathBuf::from)
        .context("cargo metadata has no target_directory")
}

/// Builds `resmgr` with cargo's `profile` and returns the binary's path.
pub fn build_release(root: &Path, profile: &str) -> anyhow::Result<PathBuf> {
    util::run(util::cargo().current_dir(root).args([
        "build",
        "--locked",
        "--profile",
        profile,
        "-p",
        "plugin-bin",
    ]))?;
    Ok(target_dir(root)?.join(profile).join("resmgr"))
}

/// The version the workspace gives the binary (plugin-bin's).
pub fn workspace_version(root: &Path) -> anyhow::Result<String> {
    let meta = util::metadata(root)?;
    meta["packages"]
        .as_array()
        .and_then(|p| p.iter().find(|p| p["name"] == "plugin-bin"))
        .and_then(|p| p["version"].as_str())
        .map(str::to_owned)
        .context("plugin-bin has no version in cargo metadata")
}

/// The git commit of `root`'s checkout, when there is one.
pub fn revision(root: &Path) -> Option<String> {
    util::output(
        Command::new("git")
            .current_dir(root)
            .args(["rev-parse", "HEAD"]),
    )
    .ok()
    .map(|r| r.trim().to_owned())
}

/// Builds the `helm-chart` program into the target directory.
pub fn build_helm(root: &Path) -> anyhow::Result<Helm> {
    let bin_dir = target_dir(root)?.join("helm-chart");
    Ok(Helm::build(root, &bin_dir)?)
}
