//! `cargo xtask image`: builds the container image from deploy/Containerfile with whichever OCI
//! engine is usable here, and refuses, naming what it tried, when none is.
//!
//! "Usable" means the engine answers `info`: a docker client without a daemon is installed but
//! cannot build. The build context is a temporary copy of the repository's tracked (and new,
//! unignored) files, so target/ and dist/ stay out of it without relying on each engine's own
//! ignore-file rules.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, bail};
use xtask::helm;

use crate::{release, util};

/// Engines tried in order when none is named.
const ENGINES: &[&str] = &["podman", "docker", "buildah", "nerdctl"];

pub fn run(root: &Path, engine: Option<&str>, tag: Option<&str>) -> anyhow::Result<()> {
    let candidates: Vec<&str> = engine.map_or_else(|| ENGINES.to_vec(), |e| vec![e]);
    let engine = choose_engine(&candidates, probe)?;
    let version = release::workspace_version(root)?;
    let values: serde_yaml_ng::Value =
        helm::read_yaml(&root.join(helm::CHART_DIR).join("values.yaml"))?;
    let repository = values["image"]["repository"]
        .as_str()
        .context("the chart's values.yaml has no image.repository")?;
    let image = format!("{repository}:{}", tag.unwrap_or(&version));
    let context = tempfile::tempdir().context("creating the build context directory")?;
    copy_tracked(root, context.path())?;
    // `build` is the subcommand of all four engines (buildah's older name is `bud`).
    util::run(
        Command::new(engine)
            .arg("build")
            .arg("-f")
            .arg(context.path().join("deploy/Containerfile"))
            .args(["-t", &image])
            .arg(context.path()),
    )?;
    eprintln!("built {image} with {engine}");
    Ok(())
}

/// The first candidate `probe` accepts, or an error listing why each was refused.
pub fn choose_engine<'a>(
    candidates: &[&'a str],
    probe: impl Fn(&str) -> Result<(), String>,
) -> anyhow::Result<&'a str> {
    let mut refused = Vec::new();
    for engine in candidates {
        match probe(engine) {
            Ok(()) => return Ok(engine),
            Err(why) => refused.push(format!("  {engine}: {why}")),
        }
    }
    bail!(
        "no container engine can build the image here:\n{}\n\
         install podman or buildah, or start a Docker daemon, then run `cargo xtask image` again \
         (`--engine NAME` picks one). `cargo xtask release` builds everything else without one.",
        refused.join("\n")
    )
}

/// Whether `engine` is installed and answers `info` (a daemon-backed engine needs its daemon).
fn probe(engine: &str) -> Result<(), String> {
    let out = Command::new(engine)
        .arg("info")
        .output()
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => "not installed".to_owned(),
            _ => format!("cannot be started ({e})"),
        })?;
    if out.status.success() {
        return Ok(());
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    let reason = stderr
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or("no error message");
    Err(format!("installed, but `{engine} info` failed: {reason}"))
}

/// Copies the files git knows (tracked, or new and not ignored) from `root` into `dest`.
fn copy_tracked(root: &Path, dest: &Path) -> anyhow::Result<()> {
    let list = util::output(Command::new("git").current_dir(root).args([
        "ls-files",
        "-z",
        "--cached",
        "--others",
        "--exclude-standard",
    ]))?;
    for rel in list.split('\0').filter(|p| !p.is_empty()) {
        let from = root.join(rel);
        // Deleted but still tracked files are listed too; skip them.
        if !from.is_file() {
            continue;
        }
        let to: PathBuf = dest.join(rel);
        if let Some(parent) = to.parent() {
            fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
        }
        fs::copy(&from, &to).with_context(|| format!("copying {rel}"))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_usable_engine_is_chosen() {
        let probe = |e: &str| {
            if e == "docker" {
                Ok(())
            } else {
                Err("not usable".to_owned())
            }
        };
        assert_eq!(choose_engine(ENGINES, probe).unwrap(), "docker");
    }

    #[test]
    fn no_usable_engine_is_refused_naming_each_and_why() {
        let probe = |e: &str| Err(format!("{e} said no"));
        let err = choose_engine(ENGINES, probe).unwrap_err().to_string();
        for engine in ENGINES {
            assert!(
                err.contains(&format!("  {engine}: {engine} said no")),
                "{err}"
            );
        }
        assert!(
            err.contains("no container engine can build the image"),
            "{err}"
        );
    }

    #[test]
    fn a_missing_program_is_reported_as_not_installed() {
        let why = probe("resmgr-no-such-engine").unwrap_err();
        assert_eq!(why, "not installed");
    }
}
