//! System packages the build needs, installed on demand.
//!
//! hwlocality links the system hwloc through pkg-config, whose `--static` query also needs libudev
//! (see the hwloc reference notes). On a fresh Debian machine none of these are present. As root
//! we install them with apt; otherwise we stop and print the exact command to run.

use std::{
    process::Command,
    sync::{Mutex, PoisonError},
};

use anyhow::bail;

use crate::util;

/// Debian packages needed to build and test the workspace.
const PACKAGES: &[&str] = &["libhwloc-dev", "libudev-dev", "pkg-config"];

/// Makes sure the system packages the build needs are installed.
pub fn ensure() -> anyhow::Result<()> {
    ensure_packages(PACKAGES)
}

/// One apt at a time from this process: the background builds and the e2e's lanes ask for
/// packages from several threads, and a second apt-get would fail on dpkg's lock.
static APT: Mutex<()> = Mutex::new(());

/// How long apt-get waits for dpkg's lock that another process (an unattended upgrade) holds.
const DPKG_LOCK_TIMEOUT: &str = "DPkg::Lock::Timeout=300";

/// Makes sure `packages` are installed: as root with apt, otherwise stop and say how.
pub fn ensure_packages(packages: &[&str]) -> anyhow::Result<()> {
    let _apt = APT.lock().unwrap_or_else(PoisonError::into_inner);
    let missing: Vec<&str> = packages.iter().copied().filter(|p| !installed(p)).collect();
    if missing.is_empty() {
        return Ok(());
    }
    let is_root = running_as_root();
    if !is_root {
        bail!(
            "missing system packages: {}\nrun: sudo apt-get update && sudo apt-get install -y {}",
            missing.join(" "),
            missing.join(" ")
        );
    }
    eprintln!("installing missing system packages: {}", missing.join(" "));
    let install = |update_first: bool| -> anyhow::Result<()> {
        if update_first {
            apt_update()?;
        }
        util::run(
            Command::new("apt-get")
                .env("DEBIAN_FRONTEND", "noninteractive")
                .args(["-o", DPKG_LOCK_TIMEOUT])
                .args(["install", "-y", "-q", "--no-install-recommends"])
                .args(&missing),
        )
    };
    // Package lists may be missing or stale on a fresh machine; refresh them only when needed.
    if install(false).is_err() {
        install(true)?;
    }
    Ok(())
}

/// Refreshes apt's package lists (as root), one apt at a time from this process.
pub fn refresh_package_lists() -> anyhow::Result<()> {
    let _apt = APT.lock().unwrap_or_else(PoisonError::into_inner);
    apt_update()
}

fn apt_update() -> anyhow::Result<()> {
    util::run(Command::new("apt-get").args(["-o", DPKG_LOCK_TIMEOUT, "update", "-q"]))
}

fn installed(package: &str) -> bool {
    Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", package])
        .output()
        .map(|o| o.status.success() && String::from_utf8_lossy(&o.stdout).contains("ok installed"))
        .unwrap_or(false)
}

/// Whether we run as root, read from `id -u` so xtask needs no libc bindings.
pub fn running_as_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}
