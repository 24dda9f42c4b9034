//! The Kubernetes releases the control plane and cluster stages run against, and their binaries.
//!
//! 1. Releases ([`Release`]): each is a build module under `tests/controlplane` that pins one
//!    `k8s.io/kubernetes` version, `build` (the primary release, 1.36, which `cargo xtask bench`
//!    and `cargo xtask cluster up` use unless told otherwise) and one `build-<minor>` per other
//!    release (`build-1.37`). They are modules of their own because each pins a whole module graph
//!    (etcd included); a new release is a new directory, found without a change here. Where a
//!    release needs a newer Go than the machine's, its go.mod says so in a `toolchain` line, and
//!    every go command that builds it is run with `GOTOOLCHAIN` set to that toolchain: machines
//!    here run with `GOTOOLCHAIN=local`, which ignores the line.
//! 2. Build, or take from the cache, a release's control plane ([`binaries`]): kube-apiserver,
//!    kube-scheduler, kube-controller-manager, kubelet and kubectl, and etcd from the same module
//!    graph. The binaries are kept outside the repository under
//!    `${XDG_CACHE_HOME:-~/.cache}/resmgr/controlplane/<version>-<key>/`, where the key hashes
//!    everything that goes into them (the build module's files, the Go version, the flags); the
//!    Go module and build caches are the ordinary shared ones. Cold, this is the most expensive
//!    step of `cargo xtask test` (about fifteen minutes of two cores per release, most of it
//!    kube-apiserver); warm, it costs nothing.
//!
//! `cargo xtask test` starts the builds of every release first, one after the other in the
//! background and `nice`d ([`in_background`]), so that on a fresh machine they overlap the Rust
//! build and tests and the stages of the releases built before them.

use std::{
    collections::HashMap,
    fs,
    path::{Path, PathBuf},
    process::Command,
    sync::{Arc, Condvar, Mutex, PoisonError},
    time::Instant,
};

use anyhow::{Context, bail};
use sha2::{Digest, Sha256};

use super::cache;
use crate::{timing, util};

/// The commands built from the Kubernetes module, and our etcd main.
const PACKAGES: [&str; 6] = [
    "k8s.io/kubernetes/cmd/kube-apiserver",
    "k8s.io/kubernetes/cmd/kube-scheduler",
    "k8s.io/kubernetes/cmd/kube-controller-manager",
    "k8s.io/kubernetes/cmd/kubelet",
    "k8s.io/kubernetes/cmd/kubectl",
    "./cmd/etcd",
];

/// The programs the scenarios run, as named in the binary directory.
const BINARIES: [&str; 6] = [
    "kube-apiserver",
    "kube-scheduler",
    "kube-controller-manager",
    "kubelet",
    "kubectl",
    "etcd",
];

/// A Kubernetes release the control plane and cluster stages run against: one build module.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Release {
    /// The build module (`tests/controlplane/build`, `tests/controlplane/build-1.37`).
    module: PathBuf,
    /// The `k8s.io/kubernetes` version it pins (`v1.36.3`).
    version: String,
    /// The Go toolchain its go.mod names in a `toolchain` line (`go1.27.3`).
    toolchain: Option<String>,
}

impl Release {
    /// The release of the build module `module`.
    fn of(module: PathBuf) -> anyhow::Result<Self> {
        let go_mod = module.join("go.mod");
        let text =
            fs::read_to_string(&go_mod).with_context(|| format!("reading {}", go_mod.display()))?;
        let version = version_in(&text)
            .with_context(|| format!("{} requires no k8s.io/kubernetes", go_mod.display()))?;
        minor_of(&version).with_context(|| {
            format!(
                "{}: k8s.io/kubernetes {version} is not vMAJOR.MINOR.PATCH",
                go_mod.display()
            )
        })?;
        Ok(Self {
            module,
            version,
            toolchain: toolchain_in(&text),
        })
    }

    /// The version the release pins (`v1.36.3`).
    pub fn version(&self) -> &str {
        &self.version
    }

    /// Its minor version (`1.36`), by which `--kubernetes` picks it.
    pub fn minor(&self) -> String {
        minor_of(&self.version)
            .map(|(major, minor)| format!("{major}.{minor}"))
            .unwrap_or_default()
    }

    /// Whether it is the primary release (`tests/controlplane/build`).
    pub fn is_primary(&self) -> bool {
        self.module.ends_with(PRIMARY)
    }

    /// `go`, with the toolchain the module asks for.
    fn go(&self) -> Command {
        let mut go = Command::new("go");
        if let Some(toolchain) = &self.toolchain {
            go.env("GOTOOLCHAIN", toolchain);
        }
        go
    }
}

/// The primary release's build module, relative to the repository.
const PRIMARY: &str = "tests/controlplane/build";

/// Every release, in the order the stages run them: the primary one, then the others
/// (`tests/controlplane/build-*`) by version.
pub fn releases(root: &Path) -> anyhow::Result<Vec<Release>> {
    let mut others = Vec::new();
    let dir = root.join("tests/controlplane");
    for entry in fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry?.path();
        let is_release = path
            .file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("build-"));
        if is_release && path.join("go.mod").is_file() {
            others.push(Release::of(path)?);
        }
    }
    others.sort_by_key(|r| version_key(&r.version));
    let mut all = vec![Release::of(root.join(PRIMARY))?];
    all.extend(others);
    Ok(all)
}

/// The releases `wanted` names by minor version (`1.37`), in the order of [`releases`]; all of
/// them when `wanted` is empty.
pub fn select(root: &Path, wanted: &[String]) -> anyhow::Result<Vec<Release>> {
    let all = releases(root)?;
    if wanted.is_empty() {
        return Ok(all);
    }
    for w in wanted {
        if !all.iter().any(|r| r.minor() == *w) {
            bail!(
                "no build module pins Kubernetes {w}: the releases are {}",
                all.iter()
                    .map(Release::minor)
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
    }
    Ok(all
        .into_iter()
        .filter(|r| wanted.contains(&r.minor()))
        .collect())
}

/// The release `wanted` names, or the primary one.
pub fn release(root: &Path, wanted: Option<&str>) -> anyhow::Result<Release> {
    match wanted {
        None => Release::of(root.join(PRIMARY)),
        Some(w) => Ok(select(root, &[w.to_owned()])?.remove(0)),
    }
}

/// The control planes' builds, started in the background: every release, one after the other.
/// Stages on two threads at once ask it for their release ([`Prefetch::get`]).
#[derive(Debug)]
pub struct Prefetch {
    /// Each release's build, by version: its log, and what it made once it is done.
    builds: HashMap<String, Arc<Slot>>,
}

/// One release's build in [`Prefetch`].
#[derive(Debug)]
struct Slot {
    log: PathBuf,
    /// The binaries' directory, or the error's message; None while it builds.
    made: Mutex<Option<Result<PathBuf, String>>>,
    done: Condvar,
}

/// Starts building the control plane of every release in the background, in the order the
/// stages use them, each build's output in a log file that is removed once it succeeds.
pub fn in_background(root: &Path) -> Option<Prefetch> {
    let releases = match releases(root) {
        Ok(releases) => releases,
        Err(error) => {
            // The stage reports it when it asks for the binaries.
            eprintln!("not building the control plane in the background: {error:#}");
            return None;
        }
    };
    let builds: HashMap<String, Arc<Slot>> = releases
        .iter()
        .map(|r| {
            let log = std::env::temp_dir().join(format!(
                "resmgr-controlplane-build-{}-{}.log",
                r.minor(),
                std::process::id()
            ));
            let slot = Slot {
                log,
                made: Mutex::new(None),
                done: Condvar::new(),
            };
            (r.version.clone(), Arc::new(slot))
        })
        .collect();
    let slots = builds.clone();
    std::thread::spawn(move || {
        let _settle = SettleUnfinished(slots.clone());
        let started = Instant::now();
        for release in releases {
            let slot = &slots[&release.version];
            let result = binaries(&release, Some(&slot.log));
            timing::built(
                format!(
                    "the control plane {} (one after the other)",
                    release.version
                ),
                started.elapsed(),
            );
            if result.is_ok() {
                let _ = fs::remove_file(&slot.log);
            }
            *slot.made.lock().unwrap_or_else(PoisonError::into_inner) =
                Some(result.map_err(|e| format!("{e:#}")));
            slot.done.notify_all();
        }
    });
    Some(Prefetch { builds })
}

impl Prefetch {
    /// Whether `release`'s build has ended, or is not one of these (the cache has it or
    /// [`binaries`] builds it).
    pub(crate) fn is_built(&self, release: &Release) -> bool {
        self.builds.get(&release.version).is_none_or(|slot| {
            slot.made
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .is_some()
        })
    }

    /// `release`'s binaries: from the background build, waiting for it, or from [`binaries`]
    /// (the cache) for a release it does not build.
    pub(crate) fn get(&self, release: &Release) -> anyhow::Result<PathBuf> {
        let Some(slot) = self.builds.get(&release.version) else {
            return binaries(release, None);
        };
        let mut made = slot.made.lock().unwrap_or_else(PoisonError::into_inner);
        let waiting = made.is_none().then(|| {
            eprintln!(
                "waiting for the build of the control plane {} to finish (its output: {})",
                release.version,
                slot.log.display()
            );
            Instant::now()
        });
        let result = loop {
            match made.as_ref() {
                Some(Ok(dir)) => break Ok(dir.clone()),
                Some(Err(error)) => break Err(anyhow::anyhow!("{error}")),
                None => made = slot.done.wait(made).unwrap_or_else(PoisonError::into_inner),
            }
        };
        if let Some(waiting) = waiting {
            timing::waited(
                format!("the build of the control plane {}", release.version),
                waiting.elapsed(),
            );
        }
        result
    }
}

/// Settles, when the background thread ends however it ends (a panic included), every build it
/// did not finish, so that nobody waits for it forever.
struct SettleUnfinished(HashMap<String, Arc<Slot>>);

impl Drop for SettleUnfinished {
    fn drop(&mut self) {
        for (version, slot) in &self.0 {
            let mut made = slot.made.lock().unwrap_or_else(PoisonError::into_inner);
            if made.is_none() {
                *made = Some(Err(format!(
                    "the control plane's background build ended before building {version}"
                )));
                slot.done.notify_all();
            }
        }
    }
}

/// The directory holding `release`'s control plane binaries, built now (`nice`d, its output
/// into `log` if given) if the cache has none for the current inputs.
pub fn binaries(release: &Release, log: Option<&Path>) -> anyhow::Result<PathBuf> {
    let module = &release.module;
    let version = &release.version;
    let ldflags = ldflags(version)?;
    let go_version = util::output(release.go().current_dir(module).args([
        "env",
        "GOVERSION",
        "GOOS",
        "GOARCH",
    ]))?;
    let key = cache_key(module, &[&go_version, &ldflags, "CGO_ENABLED=0"])?;
    let cache = cache::cache_root()?
        .join("controlplane")
        .join(format!("{version}-{key}"));
    if BINARIES.iter().all(|b| cache.join(b).is_file()) {
        eprintln!(
            "control plane {version}: using the binaries in {}",
            cache.display()
        );
        return Ok(cache);
    }
    // Build next to the final directory and rename it into place, so that a run on the same
    // machine never sees half a set of binaries.
    let parent = cache.parent().context("cache directory has no parent")?;
    fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
    cache::remove_abandoned(parent);
    let staging = tempfile::Builder::new()
        .prefix(".building-")
        .tempdir_in(parent)
        .with_context(|| format!("creating a build directory in {}", parent.display()))?;
    eprintln!(
        "control plane {version}: building kube-apiserver, kube-scheduler, kube-controller-manager, kubelet, kubectl and etcd (cold: about fifteen minutes on two cores)"
    );
    let started = Instant::now();
    let mut build = super::background::go();
    if let Some(toolchain) = &release.toolchain {
        build.env("GOTOOLCHAIN", toolchain);
    }
    build
        .current_dir(module)
        .env("CGO_ENABLED", "0")
        .env("GOFLAGS", "-mod=readonly -buildvcs=false")
        .args(["build", "-trimpath", "-ldflags", &ldflags, "-o"])
        .arg(staging.path())
        .args(PACKAGES);
    match log {
        None => util::run(&mut build)?,
        Some(log) => {
            let out = fs::OpenOptions::new().create(true).append(true).open(log)?;
            build.stdout(out.try_clone()?).stderr(out);
            let status = build.status().context("starting go build")?;
            if !status.success() {
                bail!(
                    "building the control plane failed ({status}); its output is in {}",
                    log.display()
                );
            }
        }
    }
    eprintln!(
        "control plane {version}: built in {:.0} s",
        started.elapsed().as_secs_f64()
    );
    let built = staging.keep();
    if let Err(error) = fs::rename(&built, &cache) {
        // Another run put the same binaries there meanwhile; use those.
        let _ = fs::remove_dir_all(&built);
        if !BINARIES.iter().all(|b| cache.join(b).is_file()) {
            return Err(error)
                .with_context(|| format!("moving the binaries to {}", cache.display()));
        }
    }
    Ok(cache)
}

fn version_in(go_mod: &str) -> Option<String> {
    go_mod.lines().find_map(|line| {
        // `require k8s.io/kubernetes vX` or, inside a `require (` block, `k8s.io/kubernetes vX`.
        let line = line.trim();
        let line = line.strip_prefix("require").unwrap_or(line).trim_start();
        let version = line
            .strip_prefix("k8s.io/kubernetes ")?
            .split_whitespace()
            .next()?;
        version.starts_with('v').then(|| version.to_owned())
    })
}

/// The Go toolchain a go.mod names in its `toolchain` line (`go1.27.3`).
fn toolchain_in(go_mod: &str) -> Option<String> {
    go_mod.lines().find_map(|line| {
        let mut words = line.split_whitespace();
        (words.next()? == "toolchain")
            .then(|| words.next())
            .flatten()
            .filter(|t| t.starts_with("go"))
            .map(str::to_owned)
    })
}

/// `(major, minor)` of a `vMAJOR.MINOR.PATCH` version.
fn minor_of(version: &str) -> Option<(u32, u32)> {
    let (major, minor, _) = version_key(version)?;
    Some((major, minor))
}

/// A `vMAJOR.MINOR.PATCH` version as numbers, so that 1.100 sorts after 1.99.
fn version_key(version: &str) -> Option<(u32, u32, u32)> {
    let mut parts = version.strip_prefix('v')?.splitn(3, '.');
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    // A pre-release (`0-rc.1`) sorts with its patch.
    let patch = parts.next()?;
    let digits = patch
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(patch.len());
    Some((major, minor, patch[..digits].parse().ok()?))
}

/// The linker flags that set the version the binaries report (as Kubernetes' own build does
/// in hack/lib/version.sh), so that version skew checks and `kubectl version` make sense; the
/// build date is fixed, so the same inputs give the same binaries. `-s -w` drops the symbol
/// tables, which the tests never need.
fn ldflags(version: &str) -> anyhow::Result<String> {
    let mut parts = version.trim_start_matches('v').split('.');
    let (Some(major), Some(minor)) = (parts.next(), parts.next()) else {
        bail!("k8s.io/kubernetes version {version} is not vMAJOR.MINOR.PATCH");
    };
    let mut flags = vec!["-s".to_owned(), "-w".to_owned()];
    for package in [
        "k8s.io/client-go/pkg/version",
        "k8s.io/component-base/version",
    ] {
        for (name, value) in [
            ("gitVersion", version),
            ("gitMajor", major),
            ("gitMinor", minor),
            ("gitTreeState", "clean"),
            ("buildDate", "1970-01-01T00:00:00Z"),
        ] {
            flags.push(format!("-X {package}.{name}={value}"));
        }
    }
    Ok(flags.join(" "))
}

/// A hash of every file of the build module and of `extra`, as 16 hex digits.
fn cache_key(module: &Path, extra: &[&str]) -> anyhow::Result<String> {
    let mut files = Vec::new();
    let mut stack = vec![module.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))? {
            let path = entry?.path();
            if path.is_dir() {
                stack.push(path);
            } else {
                files.push(path);
            }
        }
    }
    files.sort();
    let mut hash = Sha256::new();
    for file in files {
        let relative = file.strip_prefix(module).unwrap_or(&file);
        hash.update(relative.to_string_lossy().as_bytes());
        hash.update([0]);
        hash.update(fs::read(&file).with_context(|| format!("reading {}", file.display()))?);
        hash.update([0]);
    }
    for e in extra {
        hash.update(e.as_bytes());
        hash.update([0]);
    }
    Ok(hash
        .finalize()
        .iter()
        .take(8)
        .map(|b| format!("{b:02x}"))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_pinned_kubernetes_version() {
        let single = "module x\n\nrequire k8s.io/kubernetes v1.36.3\n";
        assert_eq!(version_in(single).as_deref(), Some("v1.36.3"));
        let block = "module x\n\nrequire (\n\tgo.etcd.io/etcd/server/v3 v3.6.8\n\tk8s.io/kubernetes v1.36.3\n)\n\nreplace k8s.io/api => k8s.io/api v0.36.3\n";
        assert_eq!(version_in(block).as_deref(), Some("v1.36.3"));
        assert_eq!(version_in("module x\nrequire k8s.io/api v0.36.3\n"), None);
    }

    #[test]
    fn reads_the_toolchain_a_module_asks_for() {
        let go_mod =
            "module x\n\ngo 1.27.0\n\ntoolchain go1.27.3\n\nrequire k8s.io/kubernetes v1.38.0\n";
        assert_eq!(toolchain_in(go_mod).as_deref(), Some("go1.27.3"));
        assert_eq!(toolchain_in("module x\n\ngo 1.26.0\n"), None);
    }

    #[test]
    fn releases_are_the_primary_module_then_the_others_by_version() {
        let root = tempfile::tempdir().unwrap();
        let module = |dir: &str, version: &str, toolchain: &str| {
            let dir = root.path().join("tests/controlplane").join(dir);
            fs::create_dir_all(&dir).unwrap();
            let text = format!(
                "module x\n\ngo 1.26.0\n{toolchain}\nrequire k8s.io/kubernetes {version}\n"
            );
            fs::write(dir.join("go.mod"), text).unwrap();
        };
        module("build", "v1.36.3", "");
        module("build-1.100", "v1.100.0", "toolchain go1.99.1");
        module("build-1.37", "v1.37.2", "");
        // Not a release: no go.mod, or not named build-*.
        fs::create_dir_all(root.path().join("tests/controlplane/build-notes")).unwrap();
        module("scale", "v1.36.3", "");
        let all = releases(root.path()).unwrap();
        let shown: Vec<(String, String)> = all
            .iter()
            .map(|r| (r.minor(), r.version().to_owned()))
            .collect();
        assert_eq!(
            shown,
            [
                ("1.36".to_owned(), "v1.36.3".to_owned()),
                ("1.37".to_owned(), "v1.37.2".to_owned()),
                ("1.100".to_owned(), "v1.100.0".to_owned()),
            ]
        );
        assert_eq!(all[0].module, root.path().join("tests/controlplane/build"));
        assert_eq!(
            all.iter().map(Release::is_primary).collect::<Vec<_>>(),
            [true, false, false]
        );
        assert_eq!(all[2].toolchain.as_deref(), Some("go1.99.1"));
        assert_eq!(
            all[2].go().get_envs().collect::<Vec<_>>(),
            [(
                std::ffi::OsStr::new("GOTOOLCHAIN"),
                Some(std::ffi::OsStr::new("go1.99.1"))
            )]
        );
        assert_eq!(all[0].go().get_envs().count(), 0);

        let picked = select(root.path(), &["1.100".to_owned(), "1.36".to_owned()]).unwrap();
        assert_eq!(
            picked.iter().map(Release::minor).collect::<Vec<_>>(),
            ["1.36", "1.100"]
        );
        assert_eq!(select(root.path(), &[]).unwrap(), all);
        let error = select(root.path(), &["1.35".to_owned()]).unwrap_err();
        assert_eq!(
            error.to_string(),
            "no build module pins Kubernetes 1.35: the releases are 1.36, 1.37, 1.100"
        );
        assert_eq!(release(root.path(), None).unwrap(), all[0]);
        assert_eq!(release(root.path(), Some("1.37")).unwrap(), all[1]);
    }

    #[test]
    fn the_repository_covers_kubernetes_1_36_and_1_37() {
        let root = util::repo_root().unwrap();
        let minors: Vec<String> = releases(&root)
            .unwrap()
            .iter()
            .map(Release::minor)
            .collect();
        assert_eq!(minors, ["1.36", "1.37"]);
    }

    #[test]
    fn the_version_flags_name_major_and_minor() {
        let flags = ldflags("v1.36.3").unwrap();
        for want in [
            "-X k8s.io/component-base/version.gitVersion=v1.36.3",
            "-X k8s.io/component-base/version.gitMajor=1",
            "-X k8s.io/client-go/pkg/version.gitMinor=36",
        ] {
            assert!(flags.contains(want), "{flags} lacks {want}");
        }
        assert!(ldflags("v1").is_err());
    }

    #[test]
    fn the_cache_key_follows_the_build_module_and_the_toolchain() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("go.mod"), "module x\n").unwrap();
        let a = cache_key(dir.path(), &["go1.26.8"]).unwrap();
        assert_eq!(a, cache_key(dir.path(), &["go1.26.8"]).unwrap());
        assert_ne!(a, cache_key(dir.path(), &["go1.27.0"]).unwrap());
        fs::create_dir(dir.path().join("cmd")).unwrap();
        fs::write(dir.path().join("cmd/main.go"), "package main\n").unwrap();
        assert_ne!(a, cache_key(dir.path(), &["go1.26.8"]).unwrap());
    }
}
