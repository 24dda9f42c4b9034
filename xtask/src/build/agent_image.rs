//! The agent's OCI image, built without a container engine or a registry (`cargo xtask image`
//! writes it into `dist/`; the e2e builds it from the debug binary).
//!
//! The root filesystem is the binary (`/usr/local/bin/resmgr`) and exactly the shared libraries
//! it loads, and the TLS roots (Debian's `ca-certificates`), nothing else: no shell, no package
//! manager. The libraries come from Debian's own
//! packages, not from the build machine's files: `ldd` names the files the binary loads here,
//! `dpkg-query -S` the packages that own them, `apt-get download` fetches those packages at the
//! installed versions (what the binary was linked and tested against; the candidate version when
//! the mirror no longer carries it), and `dpkg-deb -x` unpacks them. Each package's copyright
//! file and control record (`/var/lib/dpkg/status.d/<package>`, the distroless convention that
//! image scanners read) go in with its files, so the image says what it ships and under which
//! licences. The .debs are cached in `${XDG_CACHE_HOME:-~/.cache}/resmgr/image/debs`.
//!
//! Why dynamic linking from packages rather than a static binary: the agent needs hwloc, which
//! needs libudev, and Debian ships no static libudev; a static glibc binary would also lose the
//! NSS lookups a kubeconfig's host name needs, and a musl build would need its own hwloc and
//! udev. Packages keep the libraries exactly Debian's, patched by Debian's security updates,
//! visible to scanners, and the same ones the binary was tested against.
//!
//! The layout runs as anyone: every directory is 0755 and every file world-readable (whatever
//! the umask was), `/tmp` is 1777, and the image's user is 65532 (`nonroot` in its
//! `/etc/passwd`), so `resmgr --help`, `topology` or `simulate` start unprivileged. The
//! DaemonSet runs the agent as root (uid 0 without capabilities), because the runtime's NRI
//! socket and the kubelet's plugin directories on the host are root's.
//!
//! The image is written by [`oci_archive`] (the e2e's test image builder) as an OCI archive in
//! `dist/` that `ctr images import`, `skopeo copy oci-archive:…`, `crane push` and `docker load`
//! take. Its name is the chart's `image.repository` with the workspace version as tag, so the
//! chart's default values name it; `cargo xtask release` ships it with its checksum. The e2e
//! builds it from the debug binary with [`build`] and runs the agent as a container of it on a
//! real containerd.

use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    os::unix::fs::PermissionsExt as _,
    path::{Component, Path, PathBuf},
    process::Command,
};

use anyhow::{Context, bail, ensure};
use helm_chart as helm;
use oci_archive::{self as oci, Compression, Config, Image, Layer};

use super::cache;
use crate::{sysdeps, util, workspace};

/// Where the binary goes in the image.
pub const BINARY_PATH: &str = "usr/local/bin/resmgr";
/// The user the image runs as unless told otherwise (`nonroot`, as distroless images name it).
pub const USER: &str = "65532:65532";

/// What [`build`] builds.
#[derive(Debug, Clone)]
pub struct Spec<'a> {
    /// The `resmgr` binary to ship.
    pub binary: &'a Path,
    /// The full image name, `repository:tag`.
    pub name: &'a str,
    /// `org.opencontainers.image.version`.
    pub version: &'a str,
    /// The git commit, for `org.opencontainers.image.revision`.
    pub revision: Option<&'a str>,
    /// gzip for what ships; the e2e stores its layer plain (a debug binary compresses slowly).
    pub compression: Compression,
}

/// What [`build`] wrote.
#[derive(Debug, Clone)]
pub struct Built {
    pub archive: PathBuf,
    pub written: oci::Written,
    /// The Debian packages the libraries came from, `name:arch=version`.
    pub packages: Vec<String>,
}

/// The archive's file name for `version`.
pub fn archive_name(version: &str) -> String {
    format!("resmgr-{version}-image-{}.tar", oci::host_architecture())
}

/// The image's name: the chart's `image.repository` with `tag`.
pub fn name(root: &Path, tag: &str) -> anyhow::Result<String> {
    let values: serde_yaml_ng::Value =
        helm::read_yaml(&root.join(helm::CHART_DIR).join("values.yaml"))?;
    let repository = values["image"]["repository"]
        .as_str()
        .context("the chart's values.yaml has no image.repository")?;
    Ok(format!("{repository}:{tag}"))
}

/// Builds the image of `spec` into the archive `path`.
pub fn build(spec: &Spec<'_>, path: &Path) -> anyhow::Result<Built> {
    let tree = tempfile::tempdir().context("making the image's root directory")?;
    let packages = rootfs(spec.binary, tree.path())?;
    check_runs(tree.path())?;
    let mut labels = BTreeMap::new();
    let mut label = |key: &str, value: &str| {
        labels.insert(format!("org.opencontainers.image.{key}"), value.to_owned());
    };
    label("title", "resmgr");
    label(
        "description",
        "Topology-aware CPU placement for Kubernetes nodes: an NRI plugin and a kubelet DRA driver",
    );
    label("version", spec.version);
    label("source", "https://github.com/resmgr/resmgr");
    label("licenses", "Apache-2.0");
    if let Some(revision) = spec.revision {
        label("revision", revision);
    }
    let mut config = Config {
        entrypoint: vec![format!("/{BINARY_PATH}")],
        cmd: vec!["run".into()],
        env: vec!["PATH=/usr/local/bin:/usr/bin:/bin".into()],
        working_dir: Some("/".into()),
        user: Some(USER.into()),
        labels: labels.clone(),
        ..Config::default()
    };
    config
        .labels
        .insert("io.resmgr.image.debian-packages".into(), packages.join(" "));
    let image = Image {
        name: spec.name.to_owned(),
        config,
        layers: vec![
            Layer::from_dir(tree.path(), spec.compression)?
                .described("resmgr and the shared libraries it loads, from Debian packages"),
        ],
        annotations: labels,
    };
    let written = image.write_archive(path)?;
    Ok(Built {
        archive: path.to_owned(),
        written,
        packages,
    })
}

/// Fills `tree` with the image's root filesystem for `binary`; the packages used.
fn rootfs(binary: &Path, tree: &Path) -> anyhow::Result<Vec<String>> {
    let ldd = Command::new("ldd")
        .arg(binary)
        .output()
        .with_context(|| format!("running ldd {}", binary.display()))?;
    let text =
        String::from_utf8_lossy(&ldd.stdout).into_owned() + &String::from_utf8_lossy(&ldd.stderr);
    let libraries = parse_ldd(&text).with_context(|| format!("ldd {}", binary.display()))?;

    // Merged /usr, as Debian 12 has it: the loader's /lib64/… path and the libraries' /lib/…
    // paths resolve under /usr.
    for dir in [
        "usr/bin",
        "usr/lib",
        "usr/lib64",
        "usr/local/bin",
        "etc",
        "tmp",
        "var/lib/dpkg/status.d",
    ] {
        fs::create_dir_all(tree.join(dir))?;
    }
    for top in ["bin", "lib", "lib64"] {
        std::os::unix::fs::symlink(format!("usr/{top}"), tree.join(top))?;
    }
    fs::copy(binary, tree.join(BINARY_PATH))
        .with_context(|| format!("copying {}", binary.display()))?;
    fs::write(
        tree.join("etc/passwd"),
        "root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/:/sbin/nologin\n",
    )?;
    fs::write(tree.join("etc/group"), "root:x:0:\nnonroot:x:65532:\n")?;

    // Which package owns each library.
    let mut by_package: BTreeMap<Package, Vec<PathBuf>> = BTreeMap::new();
    for lib in &libraries {
        let package = owner(lib)?;
        by_package.entry(package).or_default().push(lib.clone());
    }
    let debs = cache::cache_root()?.join("image/debs");
    fs::create_dir_all(&debs).with_context(|| format!("creating {}", debs.display()))?;
    let unpacked = tempfile::tempdir()?;
    let mut shipped = Vec::new();
    for (package, files) in &by_package {
        let deb = fetch(package, &debs)?;
        let dir = unpacked.path().join(&package.name);
        util::output(Command::new("dpkg-deb").arg("-x").arg(&deb.path).arg(&dir))?;
        for file in files {
            copy_closure(&dir, file, tree).with_context(|| {
                format!("taking {} from {}", file.display(), deb.path.display())
            })?;
        }
        copyright(&package.name, &dir, tree, &debs, unpacked.path())?;
        let control = util::output(Command::new("dpkg-deb").arg("-f").arg(&deb.path))?;
        fs::write(
            tree.join("var/lib/dpkg/status.d").join(&package.name),
            format!("{}\n", control.trim_end()),
        )?;
        shipped.push(format!("{}:{}={}", package.name, package.arch, deb.version));
    }
    shipped.push(ca_bundle(tree, &debs, unpacked.path())?);
    normalize_modes(tree)?;
    Ok(shipped)
}

/// The package of the TLS roots (architecture-independent).
const CA_PACKAGE: &str = "ca-certificates";
/// Where OpenSSL, Go and rustls-native-certs look for the roots on Debian.
const CA_BUNDLE: &str = "etc/ssl/certs/ca-certificates.crt";

/// Writes the Mozilla roots Debian's `ca-certificates` ships as the bundle its
/// `update-ca-certificates` would make (every certificate, in name order), with the package's
/// copyright and record; the package shipped. The agent's API client verifies the API server
/// against the system roots when its kubeconfig names no certificate authority (in a pod, the
/// service account's CA is named), and refuses to start without any.
fn ca_bundle(tree: &Path, debs: &Path, unpacked: &Path) -> anyhow::Result<String> {
    let version =
        util::output(Command::new("dpkg-query").args(["-W", "-f=${Version}", CA_PACKAGE]))
            .or_else(|_| candidate(CA_PACKAGE))?;
    let package = Package {
        name: CA_PACKAGE.into(),
        arch: "all".into(),
        version: version.trim().to_owned(),
    };
    let deb = fetch(&package, debs)?;
    let dir = unpacked.join(CA_PACKAGE);
    util::output(Command::new("dpkg-deb").arg("-x").arg(&deb.path).arg(&dir))?;
    let mozilla = dir.join("usr/share/ca-certificates/mozilla");
    let mut certs: Vec<PathBuf> = fs::read_dir(&mozilla)
        .with_context(|| format!("reading {}", mozilla.display()))?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "crt"))
        .collect();
    certs.sort();
    ensure!(
        !certs.is_empty(),
        "{} holds no certificates",
        deb.path.display()
    );
    let mut bundle = String::new();
    for cert in &certs {
        let text =
            fs::read_to_string(cert).with_context(|| format!("reading {}", cert.display()))?;
        bundle.push_str(text.trim_end());
        bundle.push('\n');
    }
    fs::create_dir_all(tree.join("etc/ssl/certs"))?;
    fs::write(tree.join(CA_BUNDLE), bundle)?;
    copyright(CA_PACKAGE, &dir, tree, debs, unpacked)?;
    let control = util::output(Command::new("dpkg-deb").arg("-f").arg(&deb.path))?;
    fs::write(
        tree.join("var/lib/dpkg/status.d").join(CA_PACKAGE),
        format!("{}\n", control.trim_end()),
    )?;
    Ok(format!("{CA_PACKAGE}:all={}", deb.version))
}

/// The version apt would install of `name`.
fn candidate(name: &str) -> anyhow::Result<String> {
    let policy = util::output(Command::new("apt-cache").args(["policy", name]))?;
    policy
        .lines()
        .find_map(|l| l.trim().strip_prefix("Candidate: "))
        .filter(|v| *v != "(none)")
        .map(str::to_owned)
        .with_context(|| format!("apt knows no version of {name} (apt-get update?)"))
}

/// Copies the copyright file of `package` (unpacked in `dir`) into `tree`. Some packages point
/// their doc directory at another package's (libgcc-s1 -> gcc-12-base): that package's file is
/// fetched and shipped with the link.
fn copyright(
    package: &str,
    dir: &Path,
    tree: &Path,
    debs: &Path,
    unpacked: &Path,
) -> anyhow::Result<()> {
    let doc = Path::new("usr/share/doc").join(package);
    let file = doc.join("copyright");
    if dir.join(&file).is_file() {
        fs::create_dir_all(tree.join(&doc))?;
        fs::copy(dir.join(&file), tree.join(&file))?;
        return Ok(());
    }
    let target = fs::read_link(dir.join(&doc))
        .with_context(|| format!("{package} ships no {}", file.display()))?;
    let other = Path::new("/usr/share/doc").join(&target).join("copyright");
    let owner = owner(&other)?;
    let deb = fetch(&owner, debs)?;
    let other_dir = unpacked.join(&owner.name);
    if !other_dir.exists() {
        util::output(
            Command::new("dpkg-deb")
                .arg("-x")
                .arg(&deb.path)
                .arg(&other_dir),
        )?;
    }
    copy_closure(&other_dir, &other, tree)?;
    let link = tree.join(&doc);
    if link.symlink_metadata().is_err() {
        std::os::unix::fs::symlink(&target, &link)?;
    }
    Ok(())
}

/// Runs the binary from the finished tree as the image's user (`chroot` needs root; without it,
/// or where chroot is not allowed, the check is skipped and says so): a library missing from the
/// tree fails here rather than on a node.
fn check_runs(tree: &Path) -> anyhow::Result<()> {
    if !sysdeps::running_as_root() {
        eprintln!("image: not started from its root filesystem (chroot needs root)");
        return Ok(());
    }
    let out = Command::new("chroot")
        .arg(format!("--userspec={USER}"))
        .arg(tree)
        .arg(format!("/{BINARY_PATH}"))
        .arg("--version")
        .output()
        .context("running chroot")?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    match out.status.code() {
        Some(0) => Ok(()),
        // chroot itself failed (not permitted here): nothing was learnt about the image.
        Some(125) => {
            eprintln!(
                "image: not started from its root filesystem: {}",
                stderr.trim()
            );
            Ok(())
        }
        _ => bail!(
            "the binary does not start from the image's root filesystem as {USER} ({}): {}",
            out.status,
            stderr.trim()
        ),
    }
}

/// The absolute paths of the files `ldd` says a binary loads (the loader included); none for a
/// static binary. A library `ldd` cannot find is an error naming it.
pub fn parse_ldd(text: &str) -> anyhow::Result<Vec<PathBuf>> {
    let mut paths = Vec::new();
    let mut missing = Vec::new();
    for line in text.lines().map(str::trim) {
        if line.contains("statically linked") || line.contains("not a dynamic executable") {
            return Ok(Vec::new());
        }
        let target = match line.split_once(" => ") {
            Some((soname, rest)) => {
                if rest.trim().starts_with("not found") {
                    missing.push(soname.trim().to_owned());
                    continue;
                }
                rest
            }
            None => line,
        };
        // `/path (0xaddress)`; the vDSO has no path.
        let path = target.split(" (").next().unwrap_or("").trim();
        if path.starts_with('/') {
            paths.push(PathBuf::from(path));
        }
    }
    if !missing.is_empty() {
        bail!(
            "the binary needs libraries this machine lacks: {}",
            missing.join(", ")
        );
    }
    if paths.is_empty() {
        bail!("ldd named no libraries and did not say the binary is static:\n{text}");
    }
    Ok(paths)
}

/// A path and its other name on a merged-/usr system (`/lib/x` and `/usr/lib/x`).
pub fn aliases(path: &Path) -> Vec<PathBuf> {
    let mut out = vec![path.to_path_buf()];
    if let Ok(rest) = path.strip_prefix("/usr") {
        if is_merged_top(rest) {
            out.push(Path::new("/").join(rest));
        }
    } else if let Ok(rest) = path.strip_prefix("/")
        && is_merged_top(rest)
    {
        out.push(Path::new("/usr").join(rest));
    }
    out
}

/// Whether a path relative to `/` starts with a directory that merged /usr moves under `/usr`.
fn is_merged_top(rel: &Path) -> bool {
    matches!(
        rel.components().next(),
        Some(Component::Normal(c)) if ["bin", "sbin", "lib", "lib32", "lib64", "libx32"].contains(&c.to_str().unwrap_or(""))
    )
}

/// Where a package's path goes in the image's tree: relative, under usr/ when merged /usr puts
/// it there.
pub fn in_tree(path: &Path) -> PathBuf {
    let rel = path.strip_prefix("/").unwrap_or(path);
    if is_merged_top(rel) {
        Path::new("usr").join(rel)
    } else {
        rel.to_path_buf()
    }
}

/// A Debian package installed here.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Package {
    name: String,
    arch: String,
    version: String,
}

/// The installed package that owns `file`.
fn owner(file: &Path) -> anyhow::Result<Package> {
    for alias in aliases(file) {
        let Ok(out) = util::output(Command::new("dpkg-query").arg("-S").arg(&alias)) else {
            continue;
        };
        let Some((name, arch)) = parse_owner(&out) else {
            continue;
        };
        let version = util::output(
            Command::new("dpkg-query")
                .args(["-W", "-f=${Version}"])
                .arg(format!("{name}:{arch}")),
        )?;
        return Ok(Package {
            name,
            arch,
            version: version.trim().to_owned(),
        });
    }
    bail!(
        "{} belongs to no installed Debian package (dpkg-query -S); the image takes its libraries from Debian's packages",
        file.display()
    )
}

/// The package and architecture of `dpkg-query -S` output (`libc6:amd64: /lib/…/libc.so.6`).
fn parse_owner(out: &str) -> Option<(String, String)> {
    let line = out.lines().find(|l| !l.starts_with("diversion"))?;
    let (packages, _) = line.split_once(": ")?;
    let first = packages.split(", ").next()?;
    let (name, arch) = first
        .split_once(':')
        .unwrap_or((first, oci::host_architecture()));
    Some((name.to_owned(), arch.to_owned()))
}

/// A downloaded package file.
#[derive(Debug)]
struct Deb {
    path: PathBuf,
    version: String,
}

/// The .deb of `package` in `cache`, downloaded at the installed version (or, when the mirror
/// no longer has it, at the candidate version) when it is not there yet.
fn fetch(package: &Package, cache: &Path) -> anyhow::Result<Deb> {
    let cached = cache.join(deb_file_name(
        &package.name,
        &package.version,
        &package.arch,
    ));
    if cached.is_file() {
        return Ok(Deb {
            path: cached,
            version: package.version.clone(),
        });
    }
    // An architecture-independent package is named without one.
    let any = if package.arch == "all" {
        package.name.clone()
    } else {
        format!("{}:{}", package.name, package.arch)
    };
    let exact = format!("{any}={}", package.version);
    // The installed version; after refreshing stale lists (root only); any version.
    let mut attempts = vec![Some(exact.clone())];
    if sysdeps::running_as_root() {
        attempts.extend([None, Some(exact)]);
    }
    attempts.push(Some(any));
    let mut errors = Vec::new();
    for attempt in attempts {
        let Some(what) = attempt else {
            sysdeps::refresh_package_lists()?;
            continue;
        };
        let dir = tempfile::tempdir_in(cache)?;
        let got = util::output(
            Command::new("apt-get")
                .current_dir(dir.path())
                .args(["download", "-q"])
                .arg(&what),
        );
        if let Err(e) = got {
            errors.push(format!("{e:#}"));
            continue;
        }
        let deb = fs::read_dir(dir.path())?
            .filter_map(Result::ok)
            .map(|e| e.path())
            .find(|p| p.extension().is_some_and(|x| x == "deb"))
            .with_context(|| format!("apt-get download {what} wrote no .deb"))?;
        let version = util::output(
            Command::new("dpkg-deb")
                .args(["-f"])
                .arg(&deb)
                .arg("Version"),
        )?
        .trim()
        .to_owned();
        if version != package.version {
            eprintln!(
                "image: {} {} is installed, but the mirror has only {version}: the image gets {version}",
                package.name, package.version
            );
        }
        let path = cache.join(deb_file_name(&package.name, &version, &package.arch));
        fs::rename(&deb, &path)?;
        return Ok(Deb { path, version });
    }
    bail!("cannot download {}:\n{}", package.name, errors.join("\n"))
}

/// apt's file name for a package version (an epoch's colon is written `%3a`).
pub fn deb_file_name(name: &str, version: &str, arch: &str) -> String {
    format!("{name}_{}_{arch}.deb", version.replace(':', "%3a"))
}

/// Copies `file` (an absolute path as the package installs it) from the unpacked package `pkg`
/// into `tree`, following symbolic links inside the package and copying each link and its
/// target, so the image holds the same names the binary's loader looks up.
fn copy_closure(pkg: &Path, file: &Path, tree: &Path) -> anyhow::Result<()> {
    let mut next = Some(file.to_path_buf());
    let mut seen = BTreeSet::new();
    while let Some(path) = next.take() {
        if !seen.insert(path.clone()) {
            bail!("{} is a symbolic link loop", path.display());
        }
        let source = aliases(&path)
            .into_iter()
            .map(|a| pkg.join(a.strip_prefix("/").unwrap_or(&a)))
            .find(|p| p.symlink_metadata().is_ok())
            .with_context(|| format!("the package has no {}", path.display()))?;
        let dest = tree.join(in_tree(&path));
        if let Some(parent) = dest.parent() {
            fs::create_dir_all(parent)?;
        }
        let meta = source.symlink_metadata()?;
        if meta.file_type().is_symlink() {
            let target = fs::read_link(&source)?;
            if dest.symlink_metadata().is_err() {
                std::os::unix::fs::symlink(&target, &dest)?;
            }
            let parent = path.parent().unwrap_or(Path::new("/"));
            next = Some(normalize(&parent.join(target)));
        } else if !dest.exists() {
            fs::copy(&source, &dest).with_context(|| format!("copying {}", source.display()))?;
        }
    }
    Ok(())
}

/// `path` with `.` and `..` resolved lexically.
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::from("/");
    for c in path.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::Normal(n) => out.push(n),
            _ => {}
        }
    }
    out
}

/// Every directory 0755 (`/tmp` 1777), every file 0644 or, when anyone could execute it,
/// 0755: what the umask or the packages left does not decide who can use the image.
fn normalize_modes(tree: &Path) -> anyhow::Result<()> {
    let mut stack = vec![tree.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in fs::read_dir(&dir)? {
            let path = entry?.path();
            let meta = path.symlink_metadata()?;
            let mode = if meta.file_type().is_symlink() {
                continue;
            } else if meta.is_dir() {
                stack.push(path.clone());
                if path == tree.join("tmp") {
                    0o1777
                } else {
                    0o755
                }
            } else if meta.permissions().mode() & 0o111 != 0 {
                0o755
            } else {
                0o644
            };
            fs::set_permissions(&path, fs::Permissions::from_mode(mode))
                .with_context(|| format!("setting the mode of {}", path.display()))?;
        }
    }
    Ok(())
}

/// The image built for the e2e from the debug binary of `root`'s target directory, into `out`:
/// the layer stored plain, since compressing a debug binary costs more than it saves there.
pub fn for_e2e(root: &Path, out: &Path) -> anyhow::Result<(PathBuf, String)> {
    of_profile(root, out, "debug")
}

/// The agent's image from the binary of a cargo profile's target directory (`debug`, `release`),
/// built like [`for_e2e`]'s.
pub fn of_profile(root: &Path, out: &Path, profile: &str) -> anyhow::Result<(PathBuf, String)> {
    let binary = workspace::target_dir(root)?.join(profile).join("resmgr");
    of_binary(root, &binary, &out.join("resmgr-image.tar"))
}

/// [`of_profile`] with the binary's debug information and symbols left out (`objcopy
/// --strip-all`, into `out`): half the debug binary's size (91 MB to 44 MB), for a node that
/// imports the image slowly (the emulated VM of the node-v2 stage, where the kubelet's start
/// and the images' import take a minute and a half). A panic's message still names its file
/// and line; its backtrace no longer names functions.
pub fn of_profile_without_debug_info(
    root: &Path,
    out: &Path,
    profile: &str,
) -> anyhow::Result<(PathBuf, String)> {
    let binary = workspace::target_dir(root)?.join(profile).join("resmgr");
    let stripped = without_debug_info(&binary, out)?;
    of_binary(
        root,
        &stripped,
        &out.join("resmgr-image-without-debug-info.tar"),
    )
}

/// `binary` without its debug information and symbols, written into `out` (made if missing: a
/// fresh clone has no `target/node-v2`).
fn without_debug_info(binary: &Path, out: &Path) -> anyhow::Result<PathBuf> {
    let stripped = out.join("resmgr-without-debug-info");
    sysdeps::ensure_packages(&["binutils"])?;
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    util::run(
        std::process::Command::new("objcopy")
            .arg("--strip-all")
            .arg(binary)
            .arg(&stripped),
    )
    .with_context(|| format!("leaving the debug information out of {}", binary.display()))?;
    Ok(stripped)
}

/// The agent's image of `binary`, uncompressed, written to `archive`: its path and its name.
fn of_binary(root: &Path, binary: &Path, archive: &Path) -> anyhow::Result<(PathBuf, String)> {
    let version = workspace::workspace_version(root)?;
    let name = name(root, &version)?;
    let started = std::time::Instant::now();
    let built = build(
        &Spec {
            binary,
            name: &name,
            version: &version,
            revision: None,
            compression: Compression::None,
        },
        archive,
    )?;
    eprintln!(
        "e2e: agent image {name} built in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    Ok((built.archive, name))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh clone has no output directory yet (the node-v2 stage failed so on one).
    #[test]
    fn a_binary_without_its_debug_info_goes_to_an_output_directory_made_for_it() {
        let dir = tempfile::tempdir().unwrap();
        let binary = dir.path().join("resmgr");
        std::fs::copy(std::env::current_exe().unwrap(), &binary).unwrap();
        let out = dir.path().join("target/node-v2");
        let stripped = without_debug_info(&binary, &out).unwrap();
        let (before, after) = (
            std::fs::metadata(&binary).unwrap().len(),
            std::fs::metadata(&stripped).unwrap().len(),
        );
        assert!(
            after > 0 && after < before,
            "{before} bytes, stripped {after}"
        );
    }

    #[test]
    fn ldd_output_gives_every_loaded_file_and_the_loader() {
        let text = "\tlinux-vdso.so.1 (0x00007ffd)\n\
                    \tlibhwloc.so.15 => /lib/x86_64-linux-gnu/libhwloc.so.15 (0x00007f9c)\n\
                    \tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f9c)\n\
                    \t/lib64/ld-linux-x86-64.so.2 (0x00007f9c)\n";
        assert_eq!(
            parse_ldd(text).unwrap(),
            [
                "/lib/x86_64-linux-gnu/libhwloc.so.15",
                "/lib/x86_64-linux-gnu/libc.so.6",
                "/lib64/ld-linux-x86-64.so.2"
            ]
            .map(PathBuf::from)
        );
        assert!(parse_ldd("\tstatically linked\n").unwrap().is_empty());
        let err = parse_ldd("\tlibudev.so.1 => not found\n\tlibc.so.6 => /lib/libc.so.6 (0x1)\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("libudev.so.1"), "{err}");
        assert!(parse_ldd("").is_err(), "nothing named and not static");
    }

    #[test]
    fn merged_usr_aliases_and_tree_paths() {
        assert_eq!(
            aliases(Path::new("/lib/x86_64-linux-gnu/libc.so.6")),
            [
                "/lib/x86_64-linux-gnu/libc.so.6",
                "/usr/lib/x86_64-linux-gnu/libc.so.6"
            ]
            .map(PathBuf::from)
        );
        assert_eq!(
            aliases(Path::new("/usr/lib64/ld.so")),
            ["/usr/lib64/ld.so", "/lib64/ld.so"].map(PathBuf::from)
        );
        assert_eq!(aliases(Path::new("/etc/x")), [PathBuf::from("/etc/x")]);
        assert_eq!(aliases(Path::new("/library/x")).len(), 1, "not lib/");
        assert_eq!(
            in_tree(Path::new("/lib64/ld.so")),
            Path::new("usr/lib64/ld.so")
        );
        assert_eq!(
            in_tree(Path::new("/usr/lib/x.so")),
            Path::new("usr/lib/x.so")
        );
        assert_eq!(in_tree(Path::new("/etc/passwd")), Path::new("etc/passwd"));
    }

    #[test]
    fn dpkg_owner_lines_are_parsed() {
        assert_eq!(
            parse_owner("libc6:amd64: /lib/x86_64-linux-gnu/libc.so.6\n"),
            Some(("libc6".into(), "amd64".into()))
        );
        assert_eq!(
            parse_owner("diversion by x from: /a\nlibfoo1:arm64, libfoo1:amd64: /a\n"),
            Some(("libfoo1".into(), "arm64".into()))
        );
        assert_eq!(parse_owner("nothing here"), None);
        assert_eq!(
            deb_file_name("a", "1:2.0-1", "amd64"),
            "a_1%3a2.0-1_amd64.deb"
        );
    }

    #[test]
    fn a_library_is_copied_with_its_links_under_merged_usr() {
        // An unpacked package: /lib/…/libx.so.1 -> libx.so.1.2.3, and /lib64/ld.so -> an
        // absolute path.
        let pkg = tempfile::tempdir().unwrap();
        let lib = pkg.path().join("lib/x86_64-linux-gnu");
        fs::create_dir_all(&lib).unwrap();
        fs::write(lib.join("libx.so.1.2.3"), b"elf").unwrap();
        std::os::unix::fs::symlink("libx.so.1.2.3", lib.join("libx.so.1")).unwrap();
        fs::create_dir_all(pkg.path().join("lib64")).unwrap();
        fs::write(lib.join("ld-linux.so.2"), b"loader").unwrap();
        std::os::unix::fs::symlink(
            "/lib/x86_64-linux-gnu/ld-linux.so.2",
            pkg.path().join("lib64/ld.so"),
        )
        .unwrap();
        let tree = tempfile::tempdir().unwrap();
        // ldd says /usr/lib/… (the other name of what the package installs).
        copy_closure(
            pkg.path(),
            Path::new("/usr/lib/x86_64-linux-gnu/libx.so.1"),
            tree.path(),
        )
        .unwrap();
        copy_closure(pkg.path(), Path::new("/lib64/ld.so"), tree.path()).unwrap();
        let t = tree.path();
        assert_eq!(
            fs::read_link(t.join("usr/lib/x86_64-linux-gnu/libx.so.1")).unwrap(),
            Path::new("libx.so.1.2.3")
        );
        assert_eq!(
            fs::read(t.join("usr/lib/x86_64-linux-gnu/libx.so.1.2.3")).unwrap(),
            b"elf"
        );
        assert_eq!(
            fs::read_link(t.join("usr/lib64/ld.so")).unwrap(),
            Path::new("/lib/x86_64-linux-gnu/ld-linux.so.2")
        );
        assert_eq!(
            fs::read(t.join("usr/lib/x86_64-linux-gnu/ld-linux.so.2")).unwrap(),
            b"loader"
        );
        let err = copy_closure(pkg.path(), Path::new("/lib/libnot.so"), t).unwrap_err();
        assert!(format!("{err:#}").contains("/lib/libnot.so"), "{err:#}");
    }

    #[test]
    fn modes_let_anyone_use_the_tree_whatever_they_were() {
        let tree = tempfile::tempdir().unwrap();
        let t = tree.path();
        for dir in ["tmp", "usr/bin", "etc"] {
            fs::create_dir_all(t.join(dir)).unwrap();
        }
        fs::write(t.join("usr/bin/tool"), b"x").unwrap();
        fs::write(t.join("etc/passwd"), b"x").unwrap();
        fs::set_permissions(t.join("usr/bin"), fs::Permissions::from_mode(0o700)).unwrap();
        fs::set_permissions(t.join("usr/bin/tool"), fs::Permissions::from_mode(0o700)).unwrap();
        fs::set_permissions(t.join("etc/passwd"), fs::Permissions::from_mode(0o600)).unwrap();
        std::os::unix::fs::symlink("usr/bin", t.join("bin")).unwrap();
        normalize_modes(t).unwrap();
        let mode = |p: &str| fs::metadata(t.join(p)).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode("usr/bin"), 0o755);
        assert_eq!(mode("usr/bin/tool"), 0o755);
        assert_eq!(mode("etc/passwd"), 0o644);
        assert_eq!(mode("tmp"), 0o1777);
    }

    #[test]
    fn the_image_is_named_as_the_charts_default_values_name_it() {
        let root = util::repo_root().unwrap();
        let version = workspace::workspace_version(&root).unwrap();
        let values: serde_yaml_ng::Value =
            helm::read_yaml(&root.join(helm::CHART_DIR).join("values.yaml")).unwrap();
        let want = format!(
            "{}:{}",
            values["image"]["repository"].as_str().unwrap(),
            values["image"]["tag"].as_str().unwrap()
        );
        assert_eq!(name(&root, &version).unwrap(), want);
        assert_eq!(
            archive_name("1.2.3"),
            format!("resmgr-1.2.3-image-{}.tar", oci::host_architecture())
        );
    }
}
