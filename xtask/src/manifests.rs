//! `cargo xtask manifests`: renders the plain manifests (deploy/manifests/resmgr.yaml) from the
//! Helm chart with Helm's own engine ([`xtask::helm`]), or with `--check` fails when the committed
//! file differs from what the chart renders.

use std::{fs, path::Path};

use anyhow::{Context, bail};
use xtask::helm::{self, Helm};

use crate::test;

pub fn run(root: &Path, check: bool) -> anyhow::Result<()> {
    let rendered = helm::render_plain(&build_helm(root)?, root, None)?;
    let path = root.join(helm::PLAIN_MANIFESTS);
    if check {
        let committed =
            fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
        if let Some(diff) = first_difference(&committed, &rendered) {
            bail!(
                "{} is not what the chart renders ({diff}); run `cargo xtask manifests`",
                helm::PLAIN_MANIFESTS
            );
        }
        eprintln!("{} is up to date", helm::PLAIN_MANIFESTS);
        return Ok(());
    }
    fs::write(&path, rendered).with_context(|| format!("writing {}", path.display()))?;
    eprintln!("wrote {}", helm::PLAIN_MANIFESTS);
    Ok(())
}

/// Builds the `helm-chart` program into the target directory.
pub fn build_helm(root: &Path) -> anyhow::Result<Helm> {
    let bin_dir = test::target_dir(root)?.join("helm-chart");
    Ok(Helm::build(root, &bin_dir)?)
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
