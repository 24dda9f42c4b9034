//! `cargo xtask build`, `release` and `demo`: the release binary and what ships with it (the
//! plain manifests and the packaged Helm chart, both made by Helm's own code, see
//! [`helm_chart`]).

use std::{fs, io::Write, path::Path, process::Command};

use anyhow::{Context, bail};
use helm_chart::{self as helm, Helm};
use sha2::{Digest, Sha256};

use crate::{build::agent_image as image, sysdeps, util, workspace};

/// The scenario `cargo xtask demo` runs (its expected output is checked in next to it, and the
/// README shows it).
const DEMO_SCENARIO: &str = "examples/scenarios/web-and-db.yaml";

/// `cargo xtask build`: release build of the `resmgr` binary.
pub fn build(root: &Path) -> anyhow::Result<()> {
    sysdeps::ensure()?;
    let bin = workspace::build_release(root, "release")?;
    eprintln!("built {}", bin.display());
    Ok(())
}

/// `cargo xtask release`: into `out` (default dist/), the stripped binary, the plain manifests
/// with the version as image tag, the packaged Helm chart, the Grafana dashboard and the
/// Prometheus alerts of deploy/monitoring, the agent's OCI image archive made from the binary
/// ([`image`], unless `with_image` is false), and SHA256SUMS over all of them. With `binary`,
/// that file is shipped instead of building one (the conformance test uses it to check the rest
/// of the release without a release build).
pub fn release(
    root: &Path,
    out: Option<&Path>,
    binary: Option<&Path>,
    with_image: bool,
) -> anyhow::Result<()> {
    let out = out.map_or_else(|| root.join("dist"), Path::to_path_buf);
    let version = workspace::workspace_version(root)?;
    check_chart_version(root, &version)?;
    let bin = match binary {
        Some(path) => {
            workspace::ensure_shipped(path)?;
            path.to_path_buf()
        }
        None => {
            sysdeps::ensure()?;
            workspace::build_release(root, "dist")?
        }
    };
    let helm = workspace::build_helm(root)?;
    let mut artefacts = assemble(&helm, root, &out, &version, &bin)?;
    if with_image {
        let name = image::archive_name(&version);
        image::build(
            &image::Spec {
                binary: &bin,
                name: &image::name(root, &version)?,
                version: &version,
                revision: workspace::revision(root).as_deref(),
                compression: oci_archive::Compression::Gzip,
            },
            &out.join(&name),
        )?;
        // The checksums again, with the image before them.
        let sums = artefacts.pop().context("no SHA256SUMS")?;
        artefacts.push(name);
        write_checksums(&out, &artefacts)?;
        artefacts.push(sums);
    }
    for name in &artefacts {
        eprintln!("  {name}");
    }
    eprintln!("release {version} written to {}", out.display());
    Ok(())
}

/// The names of the files [`release`] writes for `version`, checksums last.
pub fn artefact_names(version: &str) -> [String; 6] {
    [
        format!("resmgr-{version}-{}-linux", std::env::consts::ARCH),
        format!("resmgr-{version}.yaml"),
        format!("resmgr-{version}.tgz"),
        format!("resmgr-{version}-grafana-dashboard.json"),
        format!("resmgr-{version}-prometheus-alerts.yaml"),
        "SHA256SUMS".to_owned(),
    ]
}

/// The files of deploy/monitoring that ship as they are, in [`artefact_names`] order.
const MONITORING: [&str; 2] = [
    "deploy/monitoring/dashboard.json",
    "deploy/monitoring/alerts.yaml",
];

/// Writes the release into a fresh `out` and returns the names of the files written.
fn assemble(
    helm: &Helm,
    root: &Path,
    out: &Path,
    version: &str,
    bin: &Path,
) -> anyhow::Result<Vec<String>> {
    if out.exists() {
        fs::remove_dir_all(out).with_context(|| format!("removing {}", out.display()))?;
    }
    fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let [
        bin_name,
        manifests_name,
        chart_name,
        dashboard_name,
        alerts_name,
        sums_name,
    ] = artefact_names(version);
    fs::copy(bin, out.join(&bin_name)).with_context(|| format!("copying {}", bin.display()))?;
    let manifests = helm::render_plain(helm, root, Some(version))?;
    fs::write(out.join(&manifests_name), manifests)
        .with_context(|| format!("writing {manifests_name}"))?;
    let packaged = helm.package(&root.join(helm::CHART_DIR), out)?;
    anyhow::ensure!(
        packaged == chart_name,
        "the chart packaged as {packaged}, expected {chart_name}"
    );
    for (source, name) in MONITORING.iter().zip([&dashboard_name, &alerts_name]) {
        fs::copy(root.join(source), out.join(name)).with_context(|| format!("copying {source}"))?;
    }
    let artefacts = vec![
        bin_name,
        manifests_name,
        chart_name,
        dashboard_name,
        alerts_name,
    ];
    write_checksums(out, &artefacts)?;
    let mut all = artefacts;
    all.push(sums_name);
    Ok(all)
}

/// Refuses a release whose chart does not carry the workspace version: the chart's version and
/// appVersion, and the image tag its values default to, must all be `version`.
fn check_chart_version(root: &Path, version: &str) -> anyhow::Result<()> {
    let dir = root.join(helm::CHART_DIR);
    let meta: helm::ChartMeta = helm::read_yaml(&dir.join("Chart.yaml"))?;
    let values: serde_yaml_ng::Value = helm::read_yaml(&dir.join("values.yaml"))?;
    let found = [
        ("Chart.yaml version", Some(meta.version.as_str())),
        ("Chart.yaml appVersion", meta.app_version.as_deref()),
        ("values.yaml image.tag", values["image"]["tag"].as_str()),
    ];
    let wrong: Vec<String> = found
        .iter()
        .filter(|(_, v)| *v != Some(version))
        .map(|(what, v)| format!("{what} is {}", v.unwrap_or("missing")))
        .collect();
    if !wrong.is_empty() {
        bail!(
            "the chart in {} does not carry the workspace version {version}: {}",
            helm::CHART_DIR,
            wrong.join(", ")
        );
    }
    Ok(())
}

/// `cargo xtask demo`: runs the agent's simulator (the real resource manager and policy against
/// a simulated node) on a shipped scenario, prints what went where, and draws the machine.
pub fn demo(root: &Path) -> anyhow::Result<()> {
    sysdeps::ensure()?;
    let bin_dir = workspace::target_dir(root)?.join("debug");
    util::run(
        util::cargo()
            .current_dir(root)
            .args(["build", "--quiet", "-p", "plugin-bin"]),
    )?;
    let svg = bin_dir.join("resmgr-demo.svg");
    util::run(
        Command::new(bin_dir.join("resmgr"))
            .current_dir(root)
            .args(["simulate", DEMO_SCENARIO, "--svg"])
            .arg(&svg),
    )?;
    eprintln!(
        "the machine, coloured by who holds each CPU: {}",
        svg.display()
    );
    Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;

    fn sha256_hex(bytes: &[u8]) -> String {
        Sha256::digest(bytes)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }

    #[test]
    fn the_chart_carries_the_workspace_version() {
        let root = util::repo_root().unwrap();
        let version = crate::workspace::workspace_version(&root).unwrap();
        check_chart_version(&root, &version).unwrap();
        let err = check_chart_version(&root, "9.9.9").unwrap_err().to_string();
        assert!(
            err.contains("Chart.yaml version is")
                && err.contains("appVersion is")
                && err.contains("image.tag is"),
            "{err}"
        );
    }

    #[test]
    fn assemble_writes_every_artefact_with_its_checksum() {
        let root = util::repo_root().unwrap();
        let version = "0.1.0";
        let work = tempfile::tempdir().unwrap();
        let bin = work.path().join("resmgr");
        fs::write(&bin, b"stand-in for the stripped binary").unwrap();
        let out = work.path().join("dist");
        fs::create_dir_all(&out).unwrap();
        fs::write(out.join("stale"), "left over from an earlier release").unwrap();

        let helm = workspace::build_helm(&root).unwrap();
        let written = assemble(&helm, &root, &out, version, &bin).unwrap();
        assert_eq!(written, artefact_names(version));
        let mut on_disk: Vec<String> = fs::read_dir(&out)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        on_disk.sort();
        let mut want = written.clone();
        want.sort();
        assert_eq!(on_disk, want, "exactly the artefacts, nothing stale");

        let sums = fs::read_to_string(out.join("SHA256SUMS")).unwrap();
        let lines: Vec<&str> = sums.lines().collect();
        assert_eq!(lines.len(), 5);
        for (line, name) in lines.iter().zip(&written[..5]) {
            let digest = sha256_hex(&fs::read(out.join(name)).unwrap());
            assert_eq!(*line, format!("{digest}  {name}"));
        }

        let manifests = fs::read_to_string(out.join(&written[1])).unwrap();
        assert!(
            manifests.contains(&format!("image: ghcr.io/resmgr/resmgr:{version}\n")),
            "the manifests use the version as image tag"
        );
        let chart = fs::read(out.join(&written[2])).unwrap();
        let mut archive = tar::Archive::new(flate2::read::GzDecoder::new(chart.as_slice()));
        let names: Vec<String> = archive
            .entries()
            .unwrap()
            .map(|e| e.unwrap().path().unwrap().display().to_string())
            .collect();
        assert!(names.contains(&"resmgr/Chart.yaml".to_owned()), "{names:?}");
        assert!(
            names.contains(&"resmgr/templates/50-daemonset.yaml".to_owned()),
            "{names:?}"
        );

        let again = work.path().join("again");
        assert_eq!(
            assemble(&helm, &root, &again, version, &bin).unwrap(),
            written
        );
        assert!(
            fs::read(again.join(&written[2])).unwrap() == chart,
            "the chart package is reproducible"
        );
    }
}
