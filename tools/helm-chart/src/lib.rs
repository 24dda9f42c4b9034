//! The Helm chart under deploy/helm/resmgr, rendered and packaged by Helm's own code.
//!
//! Helm is a Go library, so xtask does not imitate it: it builds `helm-chart`, a small Go program
//! in tools/helm-chart/go that calls Helm's loader, values coalescing and values.schema.json validation,
//! template engine and install-order sorting (`helm template`) and its chart packaging (`helm
//! package`), and runs it. `go build` is incremental, so after the first build a render costs
//! the program's start.
//!
//! The chart's templates are the one source of the deploy objects: `cargo xtask manifests`
//! renders them into deploy/manifests/resmgr.yaml, which stays checked in (`--check` fails when
//! it differs), and `cargo xtask release` ships them with the release's image tag and the
//! packaged chart.

use std::{
    fs, io,
    path::{Path, PathBuf},
    process::Command,
};

use serde::Deserialize;
use serde_yaml_ng::Value;

/// The chart directory, relative to the repository root.
pub const CHART_DIR: &str = "deploy/helm/resmgr";
/// The values the plain manifests are rendered with, on top of the chart's values.yaml.
pub const PLAIN_VALUES: &str = "deploy/manifests.values.yaml";
/// The plain manifests, relative to the repository root.
pub const PLAIN_MANIFESTS: &str = "deploy/manifests/resmgr.yaml";
/// The release name the plain manifests are rendered as (the objects' names derive from it).
pub const PLAIN_RELEASE_NAME: &str = "resmgr";
/// The namespace the plain manifests install into.
pub const PLAIN_NAMESPACE: &str = "resmgr-system";
/// The Go module of the `helm-chart` program, relative to the repository root.
pub const PROGRAM_DIR: &str = "tools/helm-chart/go";

/// What went wrong building or running `helm-chart`, or reading the chart.
#[derive(Debug, thiserror::Error)]
pub enum HelmError {
    #[error(
        "rendering the Helm chart needs Go (https://go.dev/dl/) to build {PROGRAM_DIR}; `go` is not on PATH"
    )]
    NoGo,
    #[error("cannot start `{command}`: {source}")]
    Spawn { command: String, source: io::Error },
    #[error("`{command}` failed ({status}):\n{stderr}")]
    Failed {
        command: String,
        status: std::process::ExitStatus,
        stderr: String,
    },
    #[error("`{command}` printed something that is not UTF-8")]
    NotUtf8 { command: String },
    #[error("reading {path}: {source}")]
    Read { path: PathBuf, source: io::Error },
    #[error("writing {path}: {source}")]
    Write { path: PathBuf, source: io::Error },
    #[error("parsing {path}: {source}")]
    Yaml {
        path: PathBuf,
        source: serde_yaml_ng::Error,
    },
}

/// The fields of Chart.yaml that the release checks.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ChartMeta {
    pub name: String,
    pub version: String,
    #[serde(default)]
    pub app_version: Option<String>,
}

/// Release name and namespace, as `helm template --namespace NS NAME` gets them.
#[derive(Debug, Clone, Copy)]
pub struct Release<'a> {
    pub name: &'a str,
    pub namespace: &'a str,
}

impl Release<'static> {
    /// The release the plain manifests are rendered as.
    pub const PLAIN: Self = Self {
        name: PLAIN_RELEASE_NAME,
        namespace: PLAIN_NAMESPACE,
    };
}

/// The built `helm-chart` program.
#[derive(Debug, Clone)]
pub struct Helm {
    program: PathBuf,
}

impl Helm {
    /// Builds `helm-chart` from the repository at `root` into `bin_dir` (created if missing).
    pub fn build(root: &Path, bin_dir: &Path) -> Result<Self, HelmError> {
        fs::create_dir_all(bin_dir).map_err(|source| HelmError::Write {
            path: bin_dir.to_path_buf(),
            source,
        })?;
        let program = bin_dir.join("helm-chart");
        let mut go = Command::new("go");
        go.current_dir(root.join(PROGRAM_DIR))
            .args(["build", "-buildvcs=false", "-o"])
            .arg(&program)
            .arg(".");
        match run(&mut go) {
            Err(HelmError::Spawn { source, .. }) if source.kind() == io::ErrorKind::NotFound => {
                Err(HelmError::NoGo)
            }
            Err(e) => Err(e),
            Ok(_) => Ok(Self { program }),
        }
    }

    /// The built program (the e2e's runner renders the chart with it).
    pub fn program(&self) -> &Path {
        &self.program
    }

    /// What `helm template` prints for the chart in `chart` (a directory or a packaged `.tgz`)
    /// as `release`, with the chart's values overlaid by `values` files in order, then by
    /// `set_strings` (`--set-string KEY=VALUE`).
    pub fn template(
        &self,
        chart: &Path,
        release: Release<'_>,
        values: &[&Path],
        set_strings: &[(&str, &str)],
    ) -> Result<String, HelmError> {
        let mut cmd = Command::new(&self.program);
        cmd.args(["template", "--chart"]).arg(chart).args([
            "--release",
            release.name,
            "--namespace",
            release.namespace,
        ]);
        for v in values {
            cmd.arg("-f").arg(v);
        }
        for (key, value) in set_strings {
            cmd.arg("--set-string").arg(format!("{key}={value}"));
        }
        let out = run(&mut cmd)?;
        String::from_utf8(out).map_err(|_| HelmError::NotUtf8 {
            command: show(&cmd),
        })
    }

    /// Packages the chart directory `chart` into `out_dir` as `helm package` does (files stamped
    /// with $SOURCE_DATE_EPOCH, default the Unix epoch, so the same chart gives the same bytes)
    /// and returns the package's file name.
    pub fn package(&self, chart: &Path, out_dir: &Path) -> Result<String, HelmError> {
        let mut cmd = Command::new(&self.program);
        cmd.args(["package", "--chart"])
            .arg(chart)
            .arg("--out")
            .arg(out_dir);
        let out = run(&mut cmd)?;
        let printed = String::from_utf8(out).map_err(|_| HelmError::NotUtf8 {
            command: show(&cmd),
        })?;
        Ok(Path::new(printed.trim())
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default())
    }
}

/// The plain manifests of the repository at `root`: the header, then what `helm template`
/// prints for the chart with [`PLAIN_VALUES`] as [`Release::PLAIN`], with `image_tag` as the
/// image tag when given.
pub fn render_plain(
    helm: &Helm,
    root: &Path,
    image_tag: Option<&str>,
) -> Result<String, HelmError> {
    let values = root.join(PLAIN_VALUES);
    let tag: Vec<(&str, &str)> = image_tag.map(|t| ("image.tag", t)).into_iter().collect();
    let objects = helm.template(&root.join(CHART_DIR), Release::PLAIN, &[&values], &tag)?;
    Ok(format!(
        "# resmgr: plain manifests rendered by `cargo xtask manifests` from the Helm chart in\n\
         # deploy/helm/resmgr with deploy/manifests.values.yaml, exactly as `helm template\n\
         # {PLAIN_RELEASE_NAME} deploy/helm/resmgr --namespace {PLAIN_NAMESPACE} -f {PLAIN_VALUES}` \
         prints them.\n# Do not edit: change the chart.\n{objects}"
    ))
}

/// Reads and parses a YAML file.
pub fn read_yaml<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T, HelmError> {
    let text = fs::read_to_string(path).map_err(|source| HelmError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    serde_yaml_ng::from_str(&text).map_err(|source| HelmError::Yaml {
        path: path.to_path_buf(),
        source,
    })
}

/// Splits a multi-document YAML text into its documents as values, skipping empty ones.
pub fn documents(text: &str) -> Result<Vec<Value>, serde_yaml_ng::Error> {
    let mut docs = Vec::new();
    for doc in serde_yaml_ng::Deserializer::from_str(text) {
        let value = Value::deserialize(doc)?;
        if !value.is_null() {
            docs.push(value);
        }
    }
    Ok(docs)
}

/// Runs to completion and returns standard output, or the error naming the command and what it
/// printed on standard error.
fn run(cmd: &mut Command) -> Result<Vec<u8>, HelmError> {
    let out = cmd.output().map_err(|source| HelmError::Spawn {
        command: show(cmd),
        source,
    })?;
    if !out.status.success() {
        return Err(HelmError::Failed {
            command: show(cmd),
            status: out.status,
            stderr: String::from_utf8_lossy(&out.stderr).trim_end().to_owned(),
        });
    }
    Ok(out.stdout)
}

fn show(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for arg in cmd.get_args() {
        s.push(' ');
        s.push_str(&arg.to_string_lossy());
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn documents_skips_empty_ones() {
        let docs = documents("---\n# only a comment\n---\na: 1\n---\nb: 2\n").unwrap();
        assert_eq!(docs.len(), 2);
        assert_eq!(docs[1]["b"], Value::from(2));
    }
}
