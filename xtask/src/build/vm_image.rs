//! The VM image of the e2e's `node-v2` stage ([`crate::e2e::node_v2`]): a Debian bookworm root
//! filesystem made by `mmdebstrap` from Debian's packages alone, with systemd as PID 1, Debian's
//! generic kernel (whose initramfs has the virtio drivers and whose modules have 9p), runc,
//! conmon, the CNI plugins and sshd, as a raw ext4 image made with `mkfs.ext4 -d` (no loop
//! mount), beside the kernel and initramfs taken out of it and the ssh key its root accepts.
//!
//! It is cached like the Go builds, in `${XDG_CACHE_HOME:-~/.cache}/resmgr/vm/<key>/`, keyed by
//! the suite, the mirrors, the packages and everything this module writes into it; a build goes
//! to a temporary directory next to the final one and is renamed into place. The guest never
//! writes the image: each run boots an overlay of it.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
    time::Instant,
};

use anyhow::{Context as _, bail};
use sha2::{Digest as _, Sha256};

use super::{background::Background, cache};
use crate::{sysdeps, util};

/// The Debian release the guest runs.
const SUITE: &str = "bookworm";
/// Where its packages come from.
const MIRRORS: &[&str] = &[
    "deb http://deb.debian.org/debian bookworm main",
    "deb http://deb.debian.org/debian bookworm-updates main",
    "deb http://deb.debian.org/debian-security bookworm-security main",
];
/// The guest's packages besides the minimal base: systemd and the kernel, what the node runs
/// (runc, conmon, the CNI plugins with iptables for their masquerade), and sshd.
const PACKAGES: &[&str] = &[
    "systemd",
    "systemd-sysv",
    "udev",
    "dbus",
    "linux-image-amd64",
    "kmod",
    "iproute2",
    "iptables",
    "util-linux",
    "mount",
    "procps",
    "runc",
    "conmon",
    "containernetworking-plugins",
    "openssh-server",
    "ca-certificates",
];
/// The host's packages that build and boot the image.
pub const HOST_PACKAGES: &[&str] = &[
    "mmdebstrap",
    "qemu-system-x86",
    "qemu-utils",
    "e2fsprogs",
    "openssh-client",
];
/// The image's size (a sparse file; the guest's images and containers go there).
const IMAGE_SIZE: &str = "8G";

/// Files written into the root filesystem: the root file system and the share (9p, read-only)
/// in fstab, the modules the node needs loaded, DHCP on qemu's network, the initramfs's
/// drivers, sshd's one host key.
const FILES: &[(&str, &str)] = &[
    ("etc/hostname", "node-1\n"),
    (
        "etc/fstab",
        "/dev/vda / ext4 rw,relatime 0 1\n\
         share /opt/resmgr 9p trans=virtio,version=9p2000.L,ro,msize=524288,nofail 0 0\n",
    ),
    (
        "etc/modules-load.d/resmgr-node.conf",
        "9pnet_virtio\n9p\noverlay\nbr_netfilter\n",
    ),
    (
        "etc/systemd/network/10-qemu.network",
        "[Match]\nName=en* eth*\n\n[Network]\nDHCP=yes\n",
    ),
    // An initramfs of the three drivers the root file system needs (a fifth of Debian's
    // default, which has every driver: unpacking it is seconds of an emulated boot).
    ("etc/initramfs-tools/conf.d/resmgr-node", "MODULES=list\n"),
    (
        "etc/initramfs-tools/modules",
        "virtio_pci\nvirtio_blk\next4\n",
    ),
    (
        "etc/ssh/sshd_config.d/resmgr-node.conf",
        "HostKey /etc/ssh/ssh_host_ed25519_key\nUseDNS no\n",
    ),
];
/// Units enabled, and units masked: periodic jobs that would only slow an emulated boot.
const ENABLE: &[&str] = &["systemd-networkd", "ssh"];
const MASK: &[&str] = &[
    "e2scrub_reap.service",
    "e2scrub_all.timer",
    "apt-daily.timer",
    "apt-daily-upgrade.timer",
    "fstrim.timer",
    "man-db.timer",
    "dpkg-db-backup.timer",
    "systemd-tmpfiles-clean.timer",
];

/// A built image.
#[derive(Debug, Clone)]
pub struct VmImage {
    pub kernel: PathBuf,
    pub initrd: PathBuf,
    pub image: PathBuf,
    /// The private key root accepts over ssh.
    pub key: PathBuf,
}

impl VmImage {
    fn at(dir: &Path) -> Self {
        Self {
            kernel: dir.join("vmlinuz"),
            initrd: dir.join("initrd.img"),
            image: dir.join("root.img"),
            key: dir.join("id_ed25519"),
        }
    }

    fn complete(&self) -> bool {
        [&self.kernel, &self.initrd, &self.image, &self.key]
            .iter()
            .all(|p| p.is_file())
    }
}

/// Starts [`ensure`] in the background.
pub fn in_background() -> Background<VmImage> {
    Background::start("the e2e's VM image build", "resmgr-e2e-vm-image", |log| {
        ensure(Some(log))
    })
}

/// The cache key: everything the image is made of.
fn key() -> String {
    let mut hash = Sha256::new();
    for part in [SUITE, IMAGE_SIZE]
        .iter()
        .chain(MIRRORS)
        .chain(PACKAGES)
        .chain(ENABLE)
        .chain(MASK)
    {
        hash.update(part);
        hash.update([0]);
    }
    for (path, text) in FILES {
        hash.update(path);
        hash.update(text);
    }
    let digest = format!("{:x}", hash.finalize());
    format!("{SUITE}-{}", &digest[..12])
}

/// The image, built first when the cache has none. With `log`, the build's output goes there.
pub fn ensure(log: Option<&Path>) -> anyhow::Result<VmImage> {
    let dir = cache::cache_root()?.join("vm").join(key());
    let image = VmImage::at(&dir);
    if image.complete() {
        return Ok(image);
    }
    sysdeps::ensure_packages(HOST_PACKAGES)?;
    let parent = dir.parent().unwrap_or(&dir).to_owned();
    fs::create_dir_all(&parent)?;
    cache::remove_abandoned(&parent);
    let tmp = tempfile::Builder::new()
        .prefix(".building-")
        .tempdir_in(&parent)?;
    let started = Instant::now();
    eprintln!(
        "building the VM image (Debian {SUITE}, systemd, cgroup v2) into {} (once; later runs reuse it)",
        dir.display()
    );
    build(tmp.path(), log)?;
    eprintln!(
        "built the VM image in {:.0} s",
        started.elapsed().as_secs_f64()
    );
    match fs::rename(tmp.path(), &dir) {
        Ok(()) => {
            let _ = tmp.keep();
        }
        Err(_) if image.complete() => {}
        Err(e) => bail!("moving the VM image to {}: {e}", dir.display()),
    }
    Ok(image)
}

/// Runs `cmd`, its output to `log` when given.
fn run_logged(cmd: &mut Command, log: Option<&Path>, what: &str) -> anyhow::Result<()> {
    let Some(log) = log else {
        return util::run(cmd);
    };
    let out = fs::OpenOptions::new().create(true).append(true).open(log)?;
    cmd.stdout(out.try_clone()?).stderr(out);
    let status = cmd.status().with_context(|| format!("starting {what}"))?;
    if !status.success() {
        bail!(
            "{what} failed ({status}); its output is in {}",
            log.display()
        );
    }
    Ok(())
}

/// Builds the image into `out`, from a root filesystem in `out/rootfs` (removed afterwards).
fn build(out: &Path, log: Option<&Path>) -> anyhow::Result<()> {
    let rootfs = out.join("rootfs");
    let mut debootstrap = Command::new("nice");
    debootstrap
        .args(["-n", "10", "mmdebstrap", "--variant=minbase", "--mode=root"])
        .arg(format!("--include={}", PACKAGES.join(",")))
        .arg(SUITE)
        .arg(&rootfs)
        .args(MIRRORS);
    run_logged(&mut debootstrap, log, "mmdebstrap")?;
    for (path, text) in FILES {
        let file = rootfs.join(path);
        fs::create_dir_all(file.parent().unwrap_or(&rootfs))?;
        fs::write(&file, text).with_context(|| format!("writing {}", file.display()))?;
    }
    fs::create_dir_all(rootfs.join("opt/resmgr"))?;
    // sshd's host key, and root's key for the stage, made once for the image.
    for f in [
        "ssh_host_rsa_key",
        "ssh_host_ecdsa_key",
        "ssh_host_ed25519_key",
    ] {
        for suffix in ["", ".pub"] {
            let _ = fs::remove_file(rootfs.join("etc/ssh").join(format!("{f}{suffix}")));
        }
    }
    let keygen = |file: &Path, comment: &str| -> anyhow::Result<()> {
        util::run(
            Command::new("ssh-keygen")
                .args(["-q", "-t", "ed25519", "-N", "", "-C", comment, "-f"])
                .arg(file),
        )
    };
    keygen(
        &rootfs.join("etc/ssh/ssh_host_ed25519_key"),
        "resmgr-node host",
    )?;
    let image = VmImage::at(out);
    keygen(&image.key, "resmgr-node root")?;
    let ssh = rootfs.join("root/.ssh");
    fs::create_dir_all(&ssh)?;
    fs::copy(image.key.with_extension("pub"), ssh.join("authorized_keys"))?;
    util::run(Command::new("chmod").arg("700").arg(&ssh))?;
    util::run(
        Command::new("chroot")
            .arg(&rootfs)
            .args(["systemctl", "enable", "--quiet"])
            .args(ENABLE),
    )?;
    util::run(
        Command::new("chroot")
            .arg(&rootfs)
            .args(["systemctl", "mask", "--quiet"])
            .args(MASK),
    )?;
    util::run(
        Command::new("chroot")
            .arg(&rootfs)
            .args(["update-initramfs", "-u", "-k", "all"]),
    )?;
    // The kernel and initramfs the packages installed, out of the image: qemu boots them.
    let boot = rootfs.join("boot");
    let pick = |prefix: &str| -> anyhow::Result<PathBuf> {
        let mut found: Vec<PathBuf> = fs::read_dir(&boot)?
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with(prefix))
            })
            .collect();
        found.sort();
        found
            .pop()
            .with_context(|| format!("no {prefix}* in {}", boot.display()))
    };
    fs::copy(pick("vmlinuz-")?, &image.kernel)?;
    fs::copy(pick("initrd.img-")?, &image.initrd)?;
    run_logged(
        Command::new("mkfs.ext4")
            .args(["-q", "-F", "-L", "root", "-d"])
            .arg(&rootfs)
            .arg(&image.image)
            .arg(IMAGE_SIZE),
        log,
        "mkfs.ext4",
    )?;
    fs::remove_dir_all(&rootfs)?;
    Ok(())
}
