//! `cargo xtask manifests`: renders the plain manifests (deploy/manifests/resmgr.yaml) from the
//! Helm chart, or with `--check` fails when the committed file differs from what the chart
//! renders. With `--values FILE... --out FILE` it renders other values instead, which is how the
//! Go conformance test compares our renderer with Helm's on more than the committed values.

use std::{fs, path::Path, path::PathBuf};

use anyhow::{Context, bail};
use xtask::chart::{self, Chart, Release};

pub fn run(root: &Path, check: bool, values: &[PathBuf], out: Option<&Path>) -> anyhow::Result<()> {
    if !values.is_empty() || out.is_some() {
        let out = out.context("--values renders into the file named by --out")?;
        return render_with(root, values, out);
    }
    let rendered = chart::render_plain(root, None)?;
    let path = root.join(chart::PLAIN_MANIFESTS);
    if check {
        let committed =
            fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
        if let Some(diff) = first_difference(&committed, &rendered) {
            bail!(
                "{} is not what the chart renders ({diff}); run `cargo xtask manifests`",
                chart::PLAIN_MANIFESTS
            );
        }
        eprintln!("{} is up to date", chart::PLAIN_MANIFESTS);
        return Ok(());
    }
    fs::write(&path, rendered).with_context(|| format!("writing {}", path.display()))?;
    eprintln!("wrote {}", chart::PLAIN_MANIFESTS);
    Ok(())
}

/// Renders the chart with its values overlaid by `values` (in order) into `out`, as release
/// resmgr in namespace resmgr-system, in the format of the plain manifests.
fn render_with(root: &Path, values: &[PathBuf], out: &Path) -> anyhow::Result<()> {
    let chart = Chart::load(&root.join(chart::CHART_DIR))?;
    let overrides = values
        .iter()
        .map(|p| chart::read_yaml(p))
        .collect::<Result<Vec<serde_yaml_ng::Value>, _>>()?;
    let rendered = chart.render(
        &Release {
            name: chart::PLAIN_RELEASE_NAME,
            namespace: chart::PLAIN_NAMESPACE,
        },
        &overrides,
    )?;
    let text = chart::join_manifests(&chart.meta.name, &rendered);
    fs::write(out, text).with_context(|| format!("writing {}", out.display()))?;
    Ok(())
}

/// The first line where `have` and `want` differ, described for a human; None when equal.
pub fn first_difference(have: &str, want: &str) -> Option<String> {
    if have == want {
        return None;
    }
    let mut have_lines = have.lines();
    let mut want_lines = want.lines();
    for n in 1.. {
        match (have_lines.next(), want_lines.next()) {
            (Some(h), Some(w)) if h == w => continue,
            (None, None) => return Some("line endings differ".into()),
            (h, w) => {
                return Some(format!(
                    "line {n}: file has {:?}, chart renders {:?}",
                    h.unwrap_or("<end of file>"),
                    w.unwrap_or("<end of file>")
                ));
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_difference_names_the_line() {
        assert_eq!(first_difference("a\nb\n", "a\nb\n"), None);
        assert_eq!(
            first_difference("a\nb\n", "a\nc\n").unwrap(),
            "line 2: file has \"b\", chart renders \"c\""
        );
        assert_eq!(
            first_difference("a\n", "a\nb\n").unwrap(),
            "line 2: file has \"<end of file>\", chart renders \"b\""
        );
    }
}
