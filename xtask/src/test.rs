//! `cargo xtask test`: everything CI checks, in the order that fails fastest.
//!
//! 1. system packages (installed when missing);
//! 2. `cargo fmt --check`;
//! 3. the codegen check and the generated documents' check;
//! 4. clippy with `-D warnings` over all targets;
//! 5. `cargo test --workspace`, which includes the tidy tests;
//! 6. the Go conformance modules under `tests/conformance`, run against binaries built here and
//!    passed in through `RESMGR_BIN_DIR`, and the NRI suite a second time against NRI v0.8.0;
//!    and `go test` (which vets) of xtask's own Go program, the chart renderer in `xtask/helm`.
//! 7. the e2e (`cargo xtask e2e`): the containerd, CRI-O, control plane and cluster stages,
//!    each when the machine can run it (under `CI=true` it must).

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, bail};

use crate::{cluster, codegen, controlplane, docs, e2e, sysdeps, util};

pub fn run(root: &Path) -> anyhow::Result<()> {
    sysdeps::ensure()?;
    // The e2e's containerd, control plane and CRI-O builds (Go, minutes on a fresh machine)
    // overlap the steps below.
    let e2e_runtime = e2e::prefetch();
    let control_plane = controlplane::prefetch(root);
    let cluster = cluster::prefetch(root);
    let cri_o = e2e::crio::prefetch();
    util::run(
        util::cargo()
            .current_dir(root)
            .args(["fmt", "--all", "--", "--check"]),
    )?;
    codegen::run(root, true)?;
    docs::run(root, true)?;
    util::run(util::cargo().current_dir(root).args([
        "clippy",
        "--workspace",
        "--all-targets",
        "--locked",
        "--",
        "-D",
        "warnings",
    ]))?;
    util::run(
        util::cargo()
            .current_dir(root)
            .args(["test", "--workspace", "--locked"]),
    )?;
    conformance(root)?;
    e2e::in_test(root, e2e_runtime, control_plane, cluster, cri_o)?;
    eprintln!("all checks passed");
    Ok(())
}

/// Builds the binaries the Go tests drive and runs `go test ./...` in every Go module under
/// `tests/conformance` and in xtask's chart renderer.
fn conformance(root: &Path) -> anyhow::Result<()> {
    if !util::have("go") {
        bail!("the conformance tests need Go (https://go.dev/dl/); `go` is not on PATH");
    }
    let bin_dir = build_test_binaries(root)?;
    let mut modules = go_modules(&root.join("tests/conformance"))?;
    modules.push(root.join(xtask::helm::PROGRAM_DIR));
    for module in modules {
        util::run(
            Command::new("go")
                .current_dir(&module)
                .env("RESMGR_BIN_DIR", &bin_dir)
                .env("GOFLAGS", go_flags())
                .args(["test", "-count=1", "./..."]),
        )?;
    }
    // The NRI suite once more against the adaptation of NRI v0.8.0 (containerd 1.7.26 to 2.1),
    // through an alternate module file; the nri_v080 tag selects that version's API glue.
    util::run(
        Command::new("go")
            .current_dir(root.join("tests/conformance"))
            .env("RESMGR_BIN_DIR", &bin_dir)
            .env("GOFLAGS", go_flags())
            .args(NRI_V080_TEST)
            .arg("./nri/..."),
    )?;
    Ok(())
}

/// `go test` arguments (before the package pattern) that run the NRI conformance suite against
/// github.com/containerd/nri v0.8.0; relative to tests/conformance.
const NRI_V080_TEST: [&str; 4] = [
    "test",
    "-count=1",
    "-modfile=nri/v080.mod",
    "-tags=nri_no_wasm,nri_v080",
];

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
