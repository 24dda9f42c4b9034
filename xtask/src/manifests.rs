//! `cargo xtask manifests`: renders the plain manifests (deploy/manifests/resmgr.yaml) from the
//! Helm chart with Helm's own engine ([`helm_chart`]), or with `--check` fails when the committed
//! file differs from what the chart renders.

use std::{fs, path::Path};

use anyhow::{Context, bail};
use helm_chart as helm;

use crate::{util::first_difference, workspace};

pub fn run(root: &Path, check: bool) -> anyhow::Result<()> {
    let rendered = helm::render_plain(&workspace::build_helm(root)?, root, None)?;
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
