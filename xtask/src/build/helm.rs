//! The `helm` command the cluster installs the chart with, built once from the Go module proxy
//! at the Helm version the chart renderer (`tools/helm-chart/go`) uses, and cached like the
//! rest ([`super::cache`]).

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
    time::Instant,
};

use anyhow::{Context as _, bail};

use super::{background::Background, cache};
use crate::util;

/// Starts [`ensure`] in the background.
pub fn in_background(root: &Path) -> Background<PathBuf> {
    let root = root.to_owned();
    Background::start("the helm build", "resmgr-helm-build", move |log| {
        ensure(&root, Some(log))
    })
}

/// The helm command at the version of `tools/helm-chart/go/go.mod`, from the cache or built now (with
/// `log`, its output goes there).
pub fn ensure(root: &Path, log: Option<&Path>) -> anyhow::Result<PathBuf> {
    let go_mod = root.join(helm_chart::PROGRAM_DIR).join("go.mod");
    let text =
        fs::read_to_string(&go_mod).with_context(|| format!("reading {}", go_mod.display()))?;
    let version = helm_version(&text)
        .with_context(|| format!("{} requires no helm.sh/helm/v4", go_mod.display()))?;
    let go_version = util::output(Command::new("go").args(["env", "GOVERSION"]))?
        .trim()
        .to_owned();
    let dir = cache::cache_root()?
        .join("helm")
        .join(format!("{version}-{go_version}"));
    let program = dir.join("helm");
    if program.is_file() {
        return Ok(program);
    }
    let parent = dir.parent().context("cache directory has no parent")?;
    fs::create_dir_all(parent)?;
    cache::remove_abandoned(parent);
    let staging = tempfile::Builder::new()
        .prefix(".building-")
        .tempdir_in(parent)?;
    eprintln!("building helm {version} (once; later runs reuse it)");
    let started = Instant::now();
    let mut build = super::background::go();
    build
        .args(["install", "-trimpath"])
        .arg(format!(
            "-ldflags=-s -w -X helm.sh/helm/v4/internal/version.version={version}"
        ))
        .arg(format!("helm.sh/helm/v4/cmd/helm@{version}"))
        .env("GOBIN", staging.path())
        .env("CGO_ENABLED", "0")
        .env("GOFLAGS", "-buildvcs=false");
    match log {
        None => util::run(&mut build)?,
        Some(log) => {
            let out = fs::File::create(log)?;
            build.stdout(out.try_clone()?).stderr(out);
            if !build.status().context("starting go install")?.success() {
                bail!("building helm failed; its output is in {}", log.display());
            }
        }
    }
    eprintln!("built helm in {:.0} s", started.elapsed().as_secs_f64());
    let built = staging.keep();
    if fs::rename(&built, &dir).is_err() {
        let _ = fs::remove_dir_all(&built);
    }
    if !program.is_file() {
        bail!("helm was built but {} is missing", program.display());
    }
    Ok(program)
}

fn helm_version(go_mod: &str) -> Option<String> {
    go_mod.lines().find_map(|line| {
        let line = line.trim();
        let line = line.strip_prefix("require").unwrap_or(line).trim_start();
        let version = line
            .strip_prefix("helm.sh/helm/v4 ")?
            .split_whitespace()
            .next()?;
        version.starts_with('v').then(|| version.to_owned())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_helms_version_from_the_renderers_module() {
        assert_eq!(
            helm_version("module x\n\nrequire helm.sh/helm/v4 v4.3.2\n").as_deref(),
            Some("v4.3.2")
        );
        assert_eq!(
            helm_version("require (\n\thelm.sh/helm/v4 v4.3.2 // indirect\n)\n").as_deref(),
            Some("v4.3.2")
        );
        assert_eq!(helm_version("require k8s.io/api v0.36.3\n"), None);
    }
}
