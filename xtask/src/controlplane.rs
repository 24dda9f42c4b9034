//! The control-plane stage of the end-to-end tests: `resmgr run` against a real kube-apiserver,
//! kube-scheduler and kube-controller-manager, on nodes without a kubelet (`tests/controlplane`).
//!
//! 1. Build, or take from the cache, the control plane: kube-apiserver, kube-scheduler,
//!    kube-controller-manager, kubelet and kubectl at the Kubernetes version
//!    `tests/controlplane/build/go.mod` pins, and etcd from the same module graph (the cluster
//!    stage, [`crate::cluster`], runs the kubelet and the controller-manager). The binaries are kept outside the repository under
//!    `${XDG_CACHE_HOME:-~/.cache}/resmgr/controlplane/<key>/`, where the key hashes everything
//!    that goes into them (the build module's files, the Go version, the flags); the Go module
//!    and build caches are the ordinary shared ones. Cold, this is the most expensive step of
//!    `cargo xtask test` (about ten minutes on two cores, almost all kube-apiserver); warm, it
//!    costs nothing.
//! 2. `go test` the scenarios, with the workspace's binaries (`RESMGR_BIN_DIR`) and the control
//!    plane's (`RESMGR_CONTROLPLANE_BIN_DIR`): first every scenario but the `OnCRIO` ones, on
//!    containerd's NRI library; then the `OnCRIO` ones on the CRI-O stage's CRI-O (`e2e --
//!    COMMAND`), which need what that stage needs (root, the cpuset controller, a C compiler):
//!    without it, they fail the stage under `CI=true` and are reported as not run elsewhere. (On
//!    containerd the cluster stage runs the same with the real kubelet.)
//!
//! It is the `controlplane` stage of `cargo xtask e2e` ([`crate::e2e`]), which checks its
//! [`prerequisites`] (Go and openssl; no root) and runs it from `cargo xtask test`; there the
//! build starts first, in the background and `nice`d ([`prefetch`]), so that on a fresh machine
//! it overlaps the Rust build and tests instead of following them.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
    time::Instant,
};

use anyhow::{Context, bail};
use sha2::{Digest, Sha256};

use crate::{
    e2e::{self, Missing},
    test, util,
};

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

/// The control plane's build, started in the background.
#[derive(Debug)]
pub struct Prefetch {
    build: std::thread::JoinHandle<anyhow::Result<PathBuf>>,
    log: PathBuf,
}

/// Starts building the control plane in the background when the stage can run, its output in
/// a log file that is removed once the build succeeds.
pub fn prefetch(root: &Path) -> Option<Prefetch> {
    if !prerequisites().is_empty() {
        return None;
    }
    let log = std::env::temp_dir().join(format!(
        "resmgr-controlplane-build-{}.log",
        std::process::id()
    ));
    let (root, build_log) = (root.to_owned(), log.clone());
    let build = std::thread::spawn(move || binaries(&root, Some(&build_log)));
    Some(Prefetch { build, log })
}

impl Prefetch {
    pub(crate) fn join(self) -> anyhow::Result<PathBuf> {
        if !self.build.is_finished() {
            eprintln!(
                "waiting for the control plane's build to finish (its output: {})",
                self.log.display()
            );
        }
        let built = self
            .build
            .join()
            .map_err(|_| anyhow::anyhow!("the control plane's build panicked"))?;
        if built.is_ok() {
            let _ = fs::remove_file(&self.log);
        }
        built
    }
}

/// Runs the stage: the control plane's binaries (from `prefetched` when it was started), then
/// the scenarios against `bin_dir`'s `resmgr`.
pub fn run(root: &Path, bin_dir: &Path, prefetched: Option<Prefetch>) -> anyhow::Result<()> {
    let control_plane = match prefetched {
        Some(p) => p.join()?,
        None => binaries(root, None)?,
    };
    let dir = root.join("tests/controlplane");
    util::run(
        Command::new("go")
            .current_dir(&dir)
            .env("RESMGR_BIN_DIR", bin_dir)
            .env("RESMGR_CONTROLPLANE_BIN_DIR", &control_plane)
            .env("GOFLAGS", test::go_flags())
            .args(["test", "-count=1", "-v", "-timeout=20m"])
            .args(["-skip", ON_CRIO, "./internal/...", "./scenarios/"]),
    )?;
    // The CRI-O stage brings up its CRI-O and runs this against it; `env` carries our variables
    // through it.
    let mut command = vec!["env".to_owned()];
    for (name, value) in [
        ("RESMGR_BIN_DIR", bin_dir.as_os_str()),
        ("RESMGR_CONTROLPLANE_BIN_DIR", control_plane.as_os_str()),
    ] {
        command.push(format!("{name}={}", value.to_string_lossy()));
    }
    command.push(format!("GOFLAGS={}", test::go_flags()));
    command.extend(["go".to_owned(), "-C".to_owned()]);
    command.push(dir.to_string_lossy().into_owned());
    command.extend(
        [
            "test",
            "-count=1",
            "-v",
            "-timeout=10m",
            "-run",
            ON_CRIO,
            "./scenarios/",
        ]
        .map(str::to_owned),
    );
    let missing = e2e::crio::prerequisites();
    if !missing.is_empty() {
        let what = format!(
            "the control plane scenarios on CRI-O ({ON_CRIO}) need what the CRI-O stage needs; this machine lacks:\n{}",
            e2e::list(&missing)
        );
        if std::env::var("CI").is_ok_and(|v| v == "true") {
            bail!("CI=true and {what}");
        }
        eprintln!("NOT RUN: {what}\n(under CI=true this is a failure)");
        return Ok(());
    }
    e2e::crio::run(
        root,
        &e2e::E2eArgs {
            command,
            ..e2e::E2eArgs::default()
        },
        None,
    )
}

/// The scenarios that run on the CRI-O stage's real CRI-O.
const ON_CRIO: &str = "OnCRIO";

/// What the machine lacks for the stage; empty when it can run.
pub fn prerequisites() -> Vec<Missing> {
    let mut missing = Vec::new();
    if !util::have("go") {
        missing.push(Missing {
            what: "Go (builds the control plane and runs the scenarios)".into(),
            how: "install Go 1.26 or later from https://go.dev/dl/ and put `go` on PATH".into(),
        });
    }
    if !util::have("openssl") {
        missing.push(Missing {
            what: "openssl (makes the control plane's certificates)".into(),
            how: "apt-get install openssl".into(),
        });
    }
    missing
}

/// The directory holding the control plane's binaries, built now (`nice`d, its output into
/// `log` if given) if the cache has none for the current inputs.
pub fn binaries(root: &Path, log: Option<&Path>) -> anyhow::Result<PathBuf> {
    let module = root.join("tests/controlplane/build");
    let version = kubernetes_version(&module)?;
    let ldflags = ldflags(&version)?;
    let go_version = util::output(Command::new("go").args(["env", "GOVERSION", "GOOS", "GOARCH"]))?;
    let key = cache_key(&module, &[&go_version, &ldflags, "CGO_ENABLED=0"])?;
    let cache = cache_dir()?.join(format!("{version}-{key}"));
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
    e2e::tools::remove_abandoned(parent);
    let staging = tempfile::Builder::new()
        .prefix(".building-")
        .tempdir_in(parent)
        .with_context(|| format!("creating a build directory in {}", parent.display()))?;
    eprintln!(
        "control plane {version}: building kube-apiserver, kube-scheduler, kube-controller-manager, kubelet, kubectl and etcd (cold: about fifteen minutes on two cores)"
    );
    let started = Instant::now();
    let mut build = Command::new("nice");
    build
        .args(["-n", "10", "go"])
        .current_dir(&module)
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

/// `${XDG_CACHE_HOME:-$HOME/.cache}/resmgr/controlplane`.
fn cache_dir() -> anyhow::Result<PathBuf> {
    let base = match std::env::var_os("XDG_CACHE_HOME") {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => PathBuf::from(std::env::var_os("HOME").context("HOME is not set")?).join(".cache"),
    };
    Ok(base.join("resmgr").join("controlplane"))
}

/// The `k8s.io/kubernetes` version the build module requires (`v1.36.3`).
fn kubernetes_version(module: &Path) -> anyhow::Result<String> {
    let go_mod = module.join("go.mod");
    let text =
        fs::read_to_string(&go_mod).with_context(|| format!("reading {}", go_mod.display()))?;
    version_in(&text).with_context(|| format!("{} requires no k8s.io/kubernetes", go_mod.display()))
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
