//! `cargo xtask test`: everything CI checks, in the order that fails fastest.
//!
//! 1. system packages (installed when missing);
//! 2. `cargo fmt --check`;
//! 3. the codegen check;
//! 4. clippy with `-D warnings` over all targets;
//! 5. `cargo test --workspace`, which includes the tidy tests;
//! 6. the binaries the Go tests and the e2e drive, built with the features of the test build so
//!    that they share its compiled crates ([`workspace::build_test_binaries`]), and the generated
//!    documents' check, which the agent among them prints;
//! 7. the Go conformance modules under `tests/conformance`, run against those binaries, passed in
//!    through `RESMGR_BIN_DIR`, and the NRI suite a second time against NRI v0.8.0; and `go test`
//!    (which vets) of the chart renderer's Go program, `tools/helm-chart/go`.
//! 8. the e2e (`cargo xtask e2e`): the containerd, CRI-O, control plane and cluster stages, and
//!    beside them, on a thread of its own, the node-v2 stage; each when the machine can run it
//!    (under `CI=true` it must); the newest release's cluster runs on the node-v2 stage's node,
//!    and `--all` adds what CI leaves out for time ([`e2e::in_test`]).
//!
//! It ends, whether it passed or not, with a table of when each step began and its wall time,
//! the background builds each waited for and how long, and how long each background build took
//! ([`crate::timing`]).

use std::{path::Path, process::Command};

use anyhow::bail;

use crate::{codegen, docs, e2e, sysdeps, timing::Steps, util, workspace};

pub fn run(root: &Path, all: bool) -> anyhow::Result<()> {
    let mut steps = Steps::new();
    let result = checks(root, &mut steps, all);
    eprintln!("\n{}", steps.table());
    result?;
    let skipped = steps.skipped();
    if skipped.is_empty() {
        eprintln!("all checks passed");
    } else {
        eprintln!(
            "all checks that ran passed; {} skipped, which is not passed:\n  {}",
            skipped.len(),
            skipped.join("\n  ")
        );
    }
    Ok(())
}

/// Every check, each a step of `steps`.
fn checks(root: &Path, steps: &mut Steps, all: bool) -> anyhow::Result<()> {
    steps.run("system packages", sysdeps::ensure)?;
    // The e2e's builds (Go, minutes on a fresh machine) overlap the steps below.
    let builds = e2e::start_builds(root);
    steps.run("cargo fmt --check", || {
        util::run(
            util::cargo()
                .current_dir(root)
                .args(["fmt", "--all", "--", "--check"]),
        )
    })?;
    steps.run("codegen --check", || codegen::run(root, true))?;
    steps.run("clippy", || {
        util::run(util::cargo().current_dir(root).args([
            "clippy",
            "--workspace",
            "--all-targets",
            "--locked",
            "--",
            "-D",
            "warnings",
        ]))
    })?;
    steps.run("cargo test --workspace", || {
        util::run(
            util::cargo()
                .current_dir(root)
                .args(["test", "--workspace", "--locked"]),
        )
    })?;
    let bin_dir = steps.run("the test binaries, docs --check", || {
        let bin_dir = workspace::build_test_binaries(root)?;
        docs::generate(root, &bin_dir.join("resmgr"), true)?;
        Ok(bin_dir)
    })?;
    steps.run("Go conformance tests", || conformance(root, &bin_dir))?;
    e2e::in_test(root, builds, steps, all)
}

/// Runs `go test ./...` in every Go module under `tests/conformance` against the binaries in
/// `bin_dir`, in the Go tests' shared helpers (`tests/gokit`) and in xtask's chart renderer.
fn conformance(root: &Path, bin_dir: &Path) -> anyhow::Result<()> {
    if !util::have("go") {
        bail!("the conformance tests need Go (https://go.dev/dl/); `go` is not on PATH");
    }
    let mut modules = workspace::go_modules(&root.join("tests/conformance"))?;
    modules.push(root.join("tests/gokit"));
    modules.push(root.join(helm_chart::PROGRAM_DIR));
    for module in modules {
        util::run(
            Command::new("go")
                .current_dir(&module)
                .env("RESMGR_BIN_DIR", bin_dir)
                .env("GOFLAGS", workspace::go_flags())
                .args(["test", "-count=1", "./..."]),
        )?;
    }
    // The NRI suite once more against the adaptation of NRI v0.8.0 (containerd 1.7.26 to 2.1),
    // through an alternate module file; the nri_v080 tag selects that version's API glue.
    util::run(
        Command::new("go")
            .current_dir(root.join("tests/conformance"))
            .env("RESMGR_BIN_DIR", bin_dir)
            .env("GOFLAGS", workspace::go_flags())
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
