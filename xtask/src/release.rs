//! `cargo xtask build`, `release` and `demo`: the release binary and what ships with it.

use std::{
    fs,
    io::Write,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::Context;
use sha2::{Digest, Sha256};

use crate::{sysdeps, test, util};

/// The scenario `cargo xtask demo` runs.
const DEMO_TOPOLOGY: &str = "synthetic:pack:2 numa:2 core:4 pu:2";

/// `cargo xtask build`: release build of the `resmgr` binary.
pub fn build(root: &Path) -> anyhow::Result<()> {
    sysdeps::ensure()?;
    let bin = build_release(root, "release")?;
    eprintln!("built {}", bin.display());
    Ok(())
}

/// `cargo xtask release`: stripped binary, deploy artefacts and SHA256SUMS in `out`.
pub fn release(root: &Path, out: Option<&Path>) -> anyhow::Result<()> {
    sysdeps::ensure()?;
    let out = out.map_or_else(|| root.join("dist"), Path::to_path_buf);
    let bin = build_release(root, "dist")?;
    if out.exists() {
        fs::remove_dir_all(&out).with_context(|| format!("removing {}", out.display()))?;
    }
    fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let version = workspace_version(root)?;
    let name = format!("resmgr-{version}-{}-linux", std::env::consts::ARCH);
    let mut artefacts = vec![name.clone()];
    fs::copy(&bin, out.join(&name)).with_context(|| format!("copying {}", bin.display()))?;
    let manifests = root.join("deploy/manifests");
    if manifests.is_dir() {
        for entry in fs::read_dir(&manifests)? {
            let path = entry?.path();
            if let Some(file) = path.file_name() {
                let file = file.to_string_lossy().into_owned();
                fs::copy(&path, out.join(&file))?;
                artefacts.push(file);
            }
        }
    }
    artefacts.sort();
    write_checksums(&out, &artefacts)?;
    eprintln!("release {version} written to {}", out.display());
    Ok(())
}

/// `cargo xtask demo`: runs the agent on a synthetic machine and prints what it sees.
pub fn demo(root: &Path) -> anyhow::Result<()> {
    sysdeps::ensure()?;
    let bin_dir = test::target_dir(root)?.join("debug");
    util::run(
        util::cargo()
            .current_dir(root)
            .args(["build", "--quiet", "-p", "plugin-bin"]),
    )?;
    util::run(Command::new(bin_dir.join("resmgr")).args(["topology", "--topology", DEMO_TOPOLOGY]))
}

fn build_release(root: &Path, profile: &str) -> anyhow::Result<PathBuf> {
    util::run(util::cargo().current_dir(root).args([
        "build",
        "--locked",
        "--profile",
        profile,
        "-p",
        "plugin-bin",
    ]))?;
    Ok(test::target_dir(root)?.join(profile).join("resmgr"))
}

fn workspace_version(root: &Path) -> anyhow::Result<String> {
    let meta = util::output(util::cargo().current_dir(root).args([
        "metadata",
        "--format-version",
        "1",
        "--no-deps",
    ]))?;
    let meta: serde_json::Value = serde_json::from_str(&meta)?;
    meta["packages"]
        .as_array()
        .and_then(|p| p.iter().find(|p| p["name"] == "plugin-bin"))
        .and_then(|p| p["version"].as_str())
        .map(str::to_owned)
        .context("plugin-bin has no version in cargo metadata")
}

/// Writes `SHA256SUMS` in the format `sha256sum -c` reads.
fn write_checksums(out: &Path, artefacts: &[String]) -> anyhow::Result<()> {
    let mut sums = fs::File::create(out.join("SHA256SUMS"))?;
    for name in artefacts {
        let bytes = fs::read(out.join(name)).with_context(|| format!("reading {name}"))?;
        let digest = Sha256::digest(&bytes);
        let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
        writeln!(sums, "{hex}  {name}")?;
    }
    sums.sync_all()?;
    Ok(())
}
