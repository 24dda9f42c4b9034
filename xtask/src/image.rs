//! `cargo xtask image`: the agent's OCI image archive in `dist/`, built by
//! [`crate::build::agent_image`] from the stripped release binary (or a given one).

use std::{fs, path::Path};

use oci_archive::Compression;

use crate::{
    build::agent_image::{self, Spec},
    sysdeps, workspace,
};

/// `cargo xtask image`: builds the stripped release binary (or takes `binary`) and writes the
/// image archive into `out` (default dist/).
pub fn run(
    root: &Path,
    binary: Option<&Path>,
    tag: Option<&str>,
    out: Option<&Path>,
) -> anyhow::Result<()> {
    let version = workspace::workspace_version(root)?;
    let binary = match binary {
        Some(path) => path.to_path_buf(),
        None => {
            sysdeps::ensure()?;
            workspace::build_release(root, "dist")?
        }
    };
    let name = agent_image::name(root, tag.unwrap_or(&version))?;
    let revision = workspace::revision(root);
    let out = out.map_or_else(|| root.join("dist"), Path::to_path_buf);
    let archive = out.join(agent_image::archive_name(&version));
    let started = std::time::Instant::now();
    let built = agent_image::build(
        &Spec {
            binary: &binary,
            name: &name,
            version: &version,
            revision: revision.as_deref(),
            compression: Compression::Gzip,
        },
        &archive,
    )?;
    let size = fs::metadata(&built.archive)?.len();
    eprintln!(
        "image {name} ({}) written to {} ({:.1} MiB, {:.0} s), libraries from {}",
        built.written.manifest,
        built.archive.display(),
        size as f64 / f64::from(1 << 20),
        started.elapsed().as_secs_f64(),
        built.packages.join(" ")
    );
    Ok(())
}
