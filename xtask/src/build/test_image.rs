//! The e2e's container image: one layer holding busybox-static, a link per applet and `/bin/pause`,
//! its entrypoint, which sleeps until SIGTERM or SIGINT and then exits, as Kubernetes' pause
//! does (a plain `sleep`, PID 1 of its namespace, ignores SIGTERM: CRI-O would wait out every
//! infra container's stop). It serves both as the pods' sandbox ("pause") image and as their
//! containers' image, so no registry is needed. Built with [`oci_archive`], so its name and
//! digest are the same on every machine with the same busybox.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};
use oci_archive::{Compression, Config, Image, Layer};

use crate::util;

/// The image's name in the runtime.
pub const NAME: &str = "localhost/resmgr-e2e:busybox";

/// Where Debian's busybox-static puts the binary.
pub const BUSYBOX: &str = "/bin/busybox";

/// The image's entrypoint.
const PAUSE_PATH: &str = "/bin/pause";

/// `/bin/pause`: sleeps until SIGTERM or SIGINT, then exits (its sleep goes with its PID
/// namespace).
const PAUSE: &str = "#!/bin/sh\n# The e2e's pause: sleeps until SIGTERM or SIGINT, as Kubernetes' pause does.\ntrap 'exit 0' TERM INT\nsleep 2147483647 &\nwait\n";

/// Builds the image from `busybox` into `out`; its path.
pub fn build(busybox: &Path, out: &Path) -> anyhow::Result<PathBuf> {
    build_as(busybox, out, NAME, "resmgr-e2e-image.tar")
}

/// Builds the same image under another name (`docker.io/library/busybox:1.37`, which the
/// examples run) into `out/file`; its path.
pub fn build_as(busybox: &Path, out: &Path, name: &str, file: &str) -> anyhow::Result<PathBuf> {
    let applets = util::output(std::process::Command::new(busybox).arg("--list"))?;
    let tree = tempfile::tempdir()?;
    let bin = tree.path().join("bin");
    std::fs::create_dir_all(&bin)?;
    let tmp = tree.path().join("tmp");
    std::fs::create_dir_all(&tmp)?;
    std::fs::set_permissions(&tmp, std::os::unix::fs::PermissionsExt::from_mode(0o1777))?;
    std::fs::copy(busybox, bin.join("busybox"))
        .with_context(|| format!("copying {}", busybox.display()))?;
    let mut count = 0;
    for applet in applets.lines().map(str::trim) {
        if applet.is_empty() || applet == "busybox" || applet.contains('/') {
            continue;
        }
        std::os::unix::fs::symlink("busybox", bin.join(applet))?;
        count += 1;
    }
    if count == 0 {
        bail!("{} --list named no applets", busybox.display());
    }
    let pause = bin.join("pause");
    std::fs::write(&pause, PAUSE)?;
    std::fs::set_permissions(&pause, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
    let mut config = Config {
        entrypoint: vec![PAUSE_PATH.into()],
        env: vec!["PATH=/bin".into()],
        ..Config::default()
    };
    config.labels.insert(
        "org.opencontainers.image.description".into(),
        "resmgr e2e test image: busybox, sleeps until SIGTERM".into(),
    );
    let image = Image {
        name: name.into(),
        config,
        layers: vec![Layer::from_dir(tree.path(), Compression::Gzip)?],
        annotations: Default::default(),
    };
    let path = out.join(file);
    image.write_archive(&path)?;
    Ok(path)
}
