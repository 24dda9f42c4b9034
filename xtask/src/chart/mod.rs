//! The Helm chart under deploy/helm/resmgr as a Rust value: loading it, merging values, rendering
//! its templates (with the subset in [`template`]), joining them into the plain manifests, and
//! packaging it as the `.tgz` `helm package` would.
//!
//! The chart's templates are the one source of the deploy objects. `cargo xtask manifests`
//! renders them into deploy/manifests/resmgr.yaml; the Go conformance test renders the same chart
//! with Helm's engine and requires the same text, so the chart and the plain manifests cannot
//! drift, and the subset renderer cannot silently disagree with Helm.

pub mod template;

use std::{
    fs,
    io::Write,
    path::{Path, PathBuf},
};

use serde::Deserialize;
use serde_yaml_ng::{Mapping, Value};

pub use template::{Template, TemplateError};

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

/// What went wrong with the chart, naming the file.
#[derive(Debug, thiserror::Error)]
pub enum ChartError {
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("writing {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("parsing {path}: {source}")]
    Yaml {
        path: PathBuf,
        source: serde_yaml_ng::Error,
    },
    #[error("{path}: {problem}")]
    Invalid { path: PathBuf, problem: String },
    #[error(transparent)]
    Template(#[from] TemplateError),
}

/// The fields of Chart.yaml that rendering and packaging use.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ChartMeta {
    pub api_version: String,
    pub name: String,
    pub version: String,
    #[serde(default)]
    pub app_version: Option<String>,
}

/// A chart loaded from its directory.
#[derive(Debug)]
pub struct Chart {
    dir: PathBuf,
    pub meta: ChartMeta,
    pub values: Value,
    /// Template file names under templates/, sorted, with their parsed templates.
    templates: Vec<(String, Template)>,
}

/// Release name and namespace, as `helm template --namespace NS NAME` gets them.
#[derive(Debug, Clone)]
pub struct Release<'a> {
    pub name: &'a str,
    pub namespace: &'a str,
}

/// One rendered template that produced objects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rendered {
    /// The template's file name under templates/.
    pub template: String,
    /// What it rendered to, with surrounding whitespace removed.
    pub text: String,
}

impl Chart {
    /// Loads Chart.yaml, values.yaml and every template of the chart in `dir`.
    pub fn load(dir: &Path) -> Result<Self, ChartError> {
        let meta: ChartMeta = read_yaml(&dir.join("Chart.yaml"))?;
        if meta.api_version != "v2" {
            return Err(ChartError::Invalid {
                path: dir.join("Chart.yaml"),
                problem: format!("apiVersion is {:?}, only v2 is supported", meta.api_version),
            });
        }
        let values: Value = read_yaml(&dir.join("values.yaml"))?;
        let templates_dir = dir.join("templates");
        let mut templates = Vec::new();
        for path in sorted_entries(&templates_dir)? {
            let name = file_name(&path);
            if path.is_dir() {
                return Err(ChartError::Invalid {
                    path,
                    problem: "subdirectories of templates/ are outside the subset we render".into(),
                });
            }
            // Helm does not render partials, and `helm template` leaves out NOTES.txt.
            if name.starts_with('_') || name == "NOTES.txt" {
                return Err(ChartError::Invalid {
                    path,
                    problem: "partials and NOTES.txt are outside the subset we render".into(),
                });
            }
            let source = read(&path)?;
            templates.push((name.clone(), Template::parse(&name, &source)?));
        }
        Ok(Self {
            dir: dir.to_path_buf(),
            meta,
            values,
            templates,
        })
    }

    /// Renders every template with the chart's values overlaid by `overrides` (later wins),
    /// dropping templates that render to whitespace, as `helm template` does.
    pub fn render(
        &self,
        release: &Release<'_>,
        overrides: &[Value],
    ) -> Result<Vec<Rendered>, ChartError> {
        let mut values = self.values.clone();
        for o in overrides {
            merge(&mut values, o);
        }
        let mut chart = Mapping::new();
        chart.insert("Name".into(), self.meta.name.clone().into());
        chart.insert("Version".into(), self.meta.version.clone().into());
        if let Some(app) = &self.meta.app_version {
            chart.insert("AppVersion".into(), app.clone().into());
        }
        let mut rel = Mapping::new();
        rel.insert("Name".into(), release.name.into());
        rel.insert("Namespace".into(), release.namespace.into());
        let mut root = Mapping::new();
        root.insert("Values".into(), values);
        root.insert("Release".into(), Value::Mapping(rel));
        root.insert("Chart".into(), Value::Mapping(chart));
        let root = Value::Mapping(root);
        let mut out = Vec::new();
        for (name, template) in &self.templates {
            let text = template.render(&root)?;
            let text = text.trim();
            if !text.is_empty() {
                out.push(Rendered {
                    template: name.clone(),
                    text: text.to_owned(),
                });
            }
        }
        Ok(out)
    }

    /// The chart's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

/// Deep-merges `over` into `base`: mappings merge key by key, anything else replaces.
pub fn merge(base: &mut Value, over: &Value) {
    match (base, over) {
        (Value::Mapping(b), Value::Mapping(o)) => {
            for (k, v) in o {
                match b.get_mut(k) {
                    Some(existing) => merge(existing, v),
                    None => {
                        b.insert(k.clone(), v.clone());
                    }
                }
            }
        }
        (b, o) => *b = o.clone(),
    }
}

/// `image.tag=<tag>` as a values override.
pub fn image_tag_override(tag: &str) -> Value {
    let mut image = Mapping::new();
    image.insert("tag".into(), tag.into());
    let mut top = Mapping::new();
    top.insert("image".into(), Value::Mapping(image));
    Value::Mapping(top)
}

/// Joins rendered templates into one multi-document file in template order (the templates are
/// numbered in install order, so `kubectl apply -f` creates the namespace first). Each part is
/// headed by `# Source: <chart>/templates/<file>`, as `helm template` prints it, which is also
/// how the conformance test finds each template's text.
pub fn join_manifests(chart_name: &str, rendered: &[Rendered]) -> String {
    let mut out = String::from(
        "# resmgr: plain manifests rendered by `cargo xtask manifests` from the Helm chart in\n\
         # deploy/helm/resmgr with deploy/manifests.values.yaml. Do not edit: change the chart.\n",
    );
    for r in rendered {
        out.push_str("---\n");
        out.push_str(&format!(
            "# Source: {chart_name}/templates/{}\n",
            r.template
        ));
        out.push_str(&r.text);
        out.push('\n');
    }
    out
}

/// Renders the plain manifests of the repository at `root`, with `image_tag` overriding the
/// image tag when given.
pub fn render_plain(root: &Path, image_tag: Option<&str>) -> Result<String, ChartError> {
    let chart = Chart::load(&root.join(CHART_DIR))?;
    let mut overrides = vec![read_yaml::<Value>(&root.join(PLAIN_VALUES))?];
    if let Some(tag) = image_tag {
        overrides.push(image_tag_override(tag));
    }
    let rendered = chart.render(
        &Release {
            name: PLAIN_RELEASE_NAME,
            namespace: PLAIN_NAMESPACE,
        },
        &overrides,
    )?;
    Ok(join_manifests(&chart.meta.name, &rendered))
}

/// Writes the chart in `dir` as `<name>-<version>.tgz` into `out_dir`, laid out as `helm
/// package` lays it out (every file under a top directory named after the chart), and returns
/// the file name. The archive is reproducible: sorted entries, fixed modes, owners and times.
pub fn package(dir: &Path, out_dir: &Path) -> Result<String, ChartError> {
    let meta: ChartMeta = read_yaml(&dir.join("Chart.yaml"))?;
    let file = format!("{}-{}.tgz", meta.name, meta.version);
    let path = out_dir.join(&file);
    let write_err = |source| ChartError::Write {
        path: path.clone(),
        source,
    };
    let mut files = Vec::new();
    collect_files(dir, Path::new(""), &mut files)?;
    let out = fs::File::create(&path).map_err(write_err)?;
    let gz = flate2::GzBuilder::new()
        .mtime(0)
        .write(out, flate2::Compression::best());
    let mut tar = tar::Builder::new(gz);
    tar.mode(tar::HeaderMode::Deterministic);
    for rel in files {
        let bytes = fs::read(dir.join(&rel)).map_err(|source| ChartError::Read {
            path: dir.join(&rel),
            source,
        })?;
        let mut header = tar::Header::new_ustar();
        header.set_size(bytes.len() as u64);
        header.set_mode(0o644);
        header.set_mtime(0);
        header.set_uid(0);
        header.set_gid(0);
        header.set_entry_type(tar::EntryType::Regular);
        let name = Path::new(&meta.name).join(&rel);
        tar.append_data(&mut header, &name, bytes.as_slice())
            .map_err(write_err)?;
    }
    let gz = tar.into_inner().map_err(write_err)?;
    let mut out = gz.finish().map_err(write_err)?;
    out.flush().map_err(write_err)?;
    out.sync_all().map_err(write_err)?;
    Ok(file)
}

/// Every regular file under `dir`, as paths relative to the chart root, sorted.
fn collect_files(root: &Path, rel: &Path, out: &mut Vec<PathBuf>) -> Result<(), ChartError> {
    for path in sorted_entries(&root.join(rel))? {
        let rel = rel.join(file_name(&path));
        if path.is_dir() {
            collect_files(root, &rel, out)?;
        } else {
            out.push(rel);
        }
    }
    Ok(())
}

fn sorted_entries(dir: &Path) -> Result<Vec<PathBuf>, ChartError> {
    let read_err = |source| ChartError::Read {
        path: dir.to_path_buf(),
        source,
    };
    let mut paths = Vec::new();
    for entry in fs::read_dir(dir).map_err(read_err)? {
        paths.push(entry.map_err(read_err)?.path());
    }
    paths.sort();
    Ok(paths)
}

fn file_name(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

fn read(path: &Path) -> Result<String, ChartError> {
    fs::read_to_string(path).map_err(|source| ChartError::Read {
        path: path.to_path_buf(),
        source,
    })
}

/// Reads and parses a YAML file.
pub fn read_yaml<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T, ChartError> {
    serde_yaml_ng::from_str(&read(path)?).map_err(|source| ChartError::Yaml {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, rel: &str, text: &str) {
        let path = dir.join(rel);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, text).unwrap();
    }

    fn tiny_chart() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        write(
            dir.path(),
            "Chart.yaml",
            "apiVersion: v2\nname: tiny\nversion: 1.2.3\nappVersion: \"1.2.3\"\n",
        );
        write(
            dir.path(),
            "values.yaml",
            "ns: {create: false}\nimage: {tag: old, repo: r}\n",
        );
        write(
            dir.path(),
            "templates/00-ns.yaml",
            "{{- if .Values.ns.create }}\nkind: Namespace\nname: {{ .Release.Namespace }}\n{{- end }}\n",
        );
        write(
            dir.path(),
            "templates/10-pod.yaml",
            "kind: Pod\nimage: {{ .Values.image.repo }}:{{ .Values.image.tag }}\nv: {{ .Chart.AppVersion }}\n",
        );
        dir
    }

    #[test]
    fn render_overlays_values_and_drops_empty_templates() {
        let dir = tiny_chart();
        let chart = Chart::load(dir.path()).unwrap();
        let release = Release {
            name: "r",
            namespace: "n",
        };
        let plain = chart.render(&release, &[]).unwrap();
        assert_eq!(
            plain,
            [Rendered {
                template: "10-pod.yaml".into(),
                text: "kind: Pod\nimage: r:old\nv: 1.2.3".into()
            }]
        );
        let create: Value = serde_yaml_ng::from_str("ns: {create: true}").unwrap();
        let both = chart
            .render(&release, &[create, image_tag_override("9.9.9")])
            .unwrap();
        assert_eq!(both.len(), 2);
        assert_eq!(both[0].text, "kind: Namespace\nname: n");
        assert_eq!(both[1].text, "kind: Pod\nimage: r:9.9.9\nv: 1.2.3");
        let joined = join_manifests("tiny", &both);
        assert!(joined.contains("---\n# Source: tiny/templates/00-ns.yaml\nkind: Namespace\n"));
        assert_eq!(documents(&joined).unwrap().len(), 2);
    }

    #[test]
    fn merge_is_deep_and_later_wins() {
        let mut base: Value = serde_yaml_ng::from_str("a: {b: 1, c: 2}\nd: [1]").unwrap();
        let over: Value = serde_yaml_ng::from_str("a: {c: 3, e: 4}\nd: [2]").unwrap();
        merge(&mut base, &over);
        let want: Value = serde_yaml_ng::from_str("a: {b: 1, c: 3, e: 4}\nd: [2]").unwrap();
        assert_eq!(base, want);
    }

    #[test]
    fn package_is_a_reproducible_gzip_tar_under_the_chart_name() {
        let dir = tiny_chart();
        let out = tempfile::tempdir().unwrap();
        let name = package(dir.path(), out.path()).unwrap();
        assert_eq!(name, "tiny-1.2.3.tgz");
        let first = fs::read(out.path().join(&name)).unwrap();
        let again = tempfile::tempdir().unwrap();
        package(dir.path(), again.path()).unwrap();
        assert_eq!(first, fs::read(again.path().join(&name)).unwrap());

        let mut archive = tar::Archive::new(flate2::read::GzDecoder::new(first.as_slice()));
        let mut entries = Vec::new();
        for entry in archive.entries().unwrap() {
            let mut entry = entry.unwrap();
            let path = entry.path().unwrap().display().to_string();
            let mut text = String::new();
            std::io::Read::read_to_string(&mut entry, &mut text).unwrap();
            entries.push((path, text));
        }
        let names: Vec<&str> = entries.iter().map(|(p, _)| p.as_str()).collect();
        assert_eq!(
            names,
            [
                "tiny/Chart.yaml",
                "tiny/templates/00-ns.yaml",
                "tiny/templates/10-pod.yaml",
                "tiny/values.yaml"
            ]
        );
        assert!(entries[0].1.contains("version: 1.2.3"));
    }

    #[test]
    fn load_refuses_what_the_subset_does_not_render() {
        let dir = tiny_chart();
        write(
            dir.path(),
            "templates/_helpers.tpl",
            "{{ define \"x\" }}{{ end }}",
        );
        let err = Chart::load(dir.path()).unwrap_err().to_string();
        assert!(
            err.contains("_helpers.tpl") && err.contains("partials"),
            "{err}"
        );
    }
}
