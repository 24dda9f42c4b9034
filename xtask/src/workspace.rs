//! The workspace as the other commands see it: where cargo puts things, the binaries the tests
//! and stages run, the release binary and version, the check that the agent's binary holds no
//! crash hook, the Go flags and modules of the Go tests, and the chart renderer. Helpers only:
//! this module runs no command of its own.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::Context;
use helm_chart::Helm;

use crate::util;

/// Builds every binary and example of the workspace (debug) and returns the directory they are in.
///
/// One cargo invocation with examples among its targets, so the features are those of
/// `cargo test --workspace` (dev-dependencies included): every unit is the test build's, and on
/// a fresh machine the async stack, kube-rs and the agent's own crates are compiled once, not
/// once more for an agent built alone. What that adds to the `resmgr` binary the tests drive is
/// tokio's `test-util` (paused time, which nothing in the agent calls), stdx's `capture-logs` (a
/// helper for tests of what code logs, which the agent does not call either) and optional parts
/// of regex-automata and getrandom; the crash test's hook is not among it, and is checked for
/// ([`ensure_shipped`]). The release binary, which ships and which the benchmarks measure, is
/// built alone ([`build_binaries`]).
pub fn build_test_binaries(root: &Path) -> anyhow::Result<PathBuf> {
    util::run(util::cargo().current_dir(root).args([
        "build",
        "--workspace",
        "--bins",
        "--examples",
        "--locked",
    ]))?;
    check_hooks(target_dir(root)?.join("debug"))
}

/// Builds every binary and example of the workspace with cargo's `profile` (`release` for the
/// benchmarks) and returns the directory they are in, the agent as it ships: the `resmgr` binary
/// is built on its own (`-p plugin-bin`, as [`build_release`] builds it), so that no feature the
/// test package turns on, on the crates it shares with the agent, is unified into it, and it is
/// checked to hold no crash hook ([`ensure_shipped`]). The agent with the crash test's hook is
/// the test package's `resmgr-crashing`, checked to hold it.
pub fn build_binaries(root: &Path, profile: &str) -> anyhow::Result<PathBuf> {
    util::run(util::cargo().current_dir(root).args([
        "build",
        "--workspace",
        "--exclude",
        "plugin-bin",
        "--bins",
        "--examples",
        "--profile",
        profile,
        "--locked",
    ]))?;
    util::run(util::cargo().current_dir(root).args([
        "build",
        "-p",
        "plugin-bin",
        "--bin",
        "resmgr",
        "--profile",
        profile,
        "--locked",
    ]))?;
    check_hooks(target_dir(root)?.join(if profile == "dev" { "debug" } else { profile }))
}

/// `dir` (returned) holds an agent without the crash test's hook and a `resmgr-crashing` with it.
fn check_hooks(dir: PathBuf) -> anyhow::Result<PathBuf> {
    ensure_shipped(&dir.join("resmgr"))?;
    let crashing = dir.join("resmgr-crashing");
    anyhow::ensure!(
        contains(&read(&crashing)?, CRASH_HOOK_MARK.as_bytes()),
        "{} does not hold `{CRASH_HOOK_MARK}`: the check that the shipped binary has no crash \
         hook looks for what the hook no longer has (tests/src/crash.rs)",
        crashing.display()
    );
    Ok(dir)
}

/// What the crash test's fault hook holds, and the agent that ships must not: the environment
/// variable that names where it aborts (`CRASH_AT_ENV` in tests/src/crash.rs). Each build of the
/// test binaries checks that the `resmgr-crashing` binary does hold it, so that this check
/// cannot go vacuous.
pub const CRASH_HOOK_MARK: &str = "RESMGR_CRASH_AT";

/// Fails if the binary `bin` of the agent holds the crash test's hook ([`CRASH_HOOK_MARK`]):
/// the agent that is tested and the one that ships are both built without it.
pub fn ensure_shipped(bin: &Path) -> anyhow::Result<()> {
    anyhow::ensure!(
        !contains(&read(bin)?, CRASH_HOOK_MARK.as_bytes()),
        "{} holds `{CRASH_HOOK_MARK}`: the crash test's hook (tests/src/crash.rs) is in the agent \
         that ships; only the test package's `resmgr-crashing` may have it",
        bin.display()
    );
    Ok(())
}

fn read(path: &Path) -> anyhow::Result<Vec<u8>> {
    std::fs::read(path).with_context(|| format!("reading {}", path.display()))
}

/// Whether `needle` (not empty) occurs in `haystack`.
fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    let Some((&first, rest)) = needle.split_first() else {
        return true;
    };
    let mut at = 0;
    while let Some(i) = haystack[at..].iter().position(|&b| b == first) {
        let start = at + i + 1;
        if haystack[start..].starts_with(rest) {
            return true;
        }
        at = start;
    }
    false
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

/// Builds `resmgr` with cargo's `profile`, checks that it holds no crash hook
/// ([`ensure_shipped`]) and returns the binary's path.
pub fn build_release(root: &Path, profile: &str) -> anyhow::Result<PathBuf> {
    util::run(util::cargo().current_dir(root).args([
        "build",
        "--locked",
        "--profile",
        profile,
        "-p",
        "plugin-bin",
    ]))?;
    let bin = target_dir(root)?.join(profile).join("resmgr");
    ensure_shipped(&bin)?;
    Ok(bin)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contains_finds_a_needle_anywhere_and_only_whole() {
        assert!(contains(b"RESMGR_CRASH_AT", b"RESMGR_CRASH_AT"));
        assert!(contains(b"\0RRESMGR_CRASH_ATx", b"RESMGR_CRASH_AT"));
        assert!(!contains(b"RESMGR_CRASH_A", b"RESMGR_CRASH_AT"));
        assert!(!contains(b"RESMGR_CRASH_aT RESMGR_", b"RESMGR_CRASH_AT"));
        assert!(!contains(b"", b"R"));
    }

    #[test]
    fn a_binary_with_the_crash_hook_is_not_shipped() {
        let dir = tempfile::tempdir().unwrap();
        let clean = dir.path().join("clean");
        std::fs::write(&clean, b"\x7fELF resmgr run prepare.saved").unwrap();
        ensure_shipped(&clean).unwrap();
        let hooked = dir.path().join("hooked");
        std::fs::write(&hooked, b"\x7fELF ... RESMGR_CRASH_AT\0 prepare.saved").unwrap();
        let err = ensure_shipped(&hooked).unwrap_err().to_string();
        assert!(err.contains("holds `RESMGR_CRASH_AT`"), "{err}");
        assert!(ensure_shipped(&dir.path().join("missing")).is_err());
    }
}
