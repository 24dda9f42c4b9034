//! Hugepages for one run: the hugetlb v1 controller mounted where no v1 hierarchy has it on a
//! cgroup v1 machine, and a few 2 MiB pages reserved in the kernel, both given back when the
//! run ends.
//!
//! The mount is made in the run's private mount namespace (`main` enters one before anything
//! else): the host never sees it, and it goes with the namespace.
//! The kernel keeps a v1 hierarchy while it has cgroups, so the run's hugetlb cgroups are
//! removed while the mount is still there ([`crate::teardown`] removes cgroups before it
//! unmounts).
//!
//! The pages are the machine's (`nr_hugepages` is not namespaced) and other runs may reserve
//! theirs at the same time: a run adds its pages to the count and later takes back only what
//! the kernel gave it, under an exclusive `flock` on the `nr_hugepages` file itself (which the
//! cluster stage's Go side takes as well), and records what it got in its run directory so
//! that the sweep of a run killed with SIGKILL gives them back too.

use std::{
    fs,
    os::fd::AsFd as _,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, bail};

/// The 2 MiB pages' count in sysfs.
pub const NR_HUGEPAGES_2M: &str = "/sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages";
/// The file of a run directory recording the pages it reserved.
const RECORD: &str = "hugepages-2048kB.reserved";
/// Where the run's cgroup root is made, in the run directory, before it is moved in place.
const MOUNT: &str = "cgroup-root";

/// Mounts the hugetlb v1 controller where the runtime looks for it unless the runtime's cgroups
/// have it already; where it mounted it (`None`: already there). Refuses outside a private
/// mount namespace.
///
/// On cgroup v1 the runtime writes only to v1 hierarchies; a hybrid machine (v1 controllers
/// and cgroup2 mounted at `/sys/fs/cgroup/unified`) keeps every controller no v1 hierarchy
/// has on cgroup2, where no runtime sets it. Mounting it as v1 moves it there (the kernel
/// allows that while no cgroup2 subtree enables it) until the mount and its cgroups are gone.
/// runc (and the kubelet's libcontainer) look for a v1 controller in a directory named after it
/// in the cgroup root (the directory holding the hierarchies, `/sys/fs/cgroup`), a tmpfs the
/// host shares: the run puts a tmpfs of its own there, holding the host's hierarchies (bound)
/// and `hugetlb`, so the host's directory is never written.
pub fn mount(run_dir: &Path) -> anyhow::Result<Option<PathBuf>> {
    let (cpuset, v2) = crate::kernel::cpuset_mount()?;
    match crate::kernel::hierarchy("hugetlb") {
        Ok((_, false)) => return Ok(None),
        Ok((_, true)) if v2 => return Ok(None),
        _ => {}
    }
    if !crate::private_mounts()? {
        bail!("not in a private mount namespace: the hugetlb controller is left unmounted");
    }
    let root = cpuset
        .parent()
        .with_context(|| format!("the cpuset hierarchy {} has no parent", cpuset.display()))?;
    let ours = run_dir.join(MOUNT);
    fs::create_dir(&ours).with_context(|| format!("making {}", ours.display()))?;
    run_mount(&["-t", "tmpfs", "-o", "mode=755", "cgroup-root"], &ours)?;
    for entry in fs::read_dir(root).with_context(|| format!("reading {}", root.display()))? {
        let entry = entry?;
        let (from, to) = (entry.path(), ours.join(entry.file_name()));
        let kind = entry.file_type()?;
        if kind.is_symlink() {
            // cpu,cpuacct -> the joint hierarchy, and the like.
            std::os::unix::fs::symlink(fs::read_link(&from)?, &to)?;
        } else if kind.is_dir() {
            fs::create_dir(&to)?;
            run_mount(&["--rbind".as_ref(), from.as_os_str()], &to)?;
        }
    }
    let hugetlb = ours.join("hugetlb");
    fs::create_dir(&hugetlb)?;
    run_mount(&["-t", "cgroup", "-o", "hugetlb", "hugetlb"], &hugetlb)?;
    run_mount(&["--move".as_ref(), ours.as_os_str()], root)?;
    Ok(Some(root.join("hugetlb")))
}

/// `mount ARGS... POINT`.
fn run_mount<S: AsRef<std::ffi::OsStr>>(args: &[S], point: &Path) -> anyhow::Result<()> {
    let shown = || {
        let mut words: Vec<String> = args
            .iter()
            .map(|a| a.as_ref().to_string_lossy().into_owned())
            .collect();
        words.push(point.display().to_string());
        words.join(" ")
    };
    let out = Command::new("mount")
        .args(args)
        .arg(point)
        .output()
        .with_context(|| format!("running mount {}", shown()))?;
    if !out.status.success() {
        bail!(
            "mount {} failed ({}): {}",
            shown(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// Runs `f` on the count in `file`, under an exclusive lock of it.
fn locked<T>(file: &Path, f: impl FnOnce(u64) -> anyhow::Result<T>) -> anyhow::Result<T> {
    let handle = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(file)
        .with_context(|| format!("opening {}", file.display()))?;
    rustix::fs::flock(handle.as_fd(), rustix::fs::FlockOperation::LockExclusive)
        .with_context(|| format!("locking {}", file.display()))?;
    let now = count(file)?;
    // The lock goes with the handle, after `f` wrote.
    let result = f(now);
    drop(handle);
    result
}

fn count(file: &Path) -> anyhow::Result<u64> {
    let text = fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
    text.trim()
        .parse()
        .with_context(|| format!("{}: {text:?} is not a page count", file.display()))
}

fn write_count(file: &Path, n: u64) -> anyhow::Result<()> {
    fs::write(file, format!("{n}\n")).with_context(|| format!("writing {n} to {}", file.display()))
}

/// Reserves `pages` more pages in `file` (`nr_hugepages`) for the run in `run_dir`; how many
/// the kernel gave (it gives fewer, down to none, when memory is too fragmented). What it gave
/// is recorded in the run directory before anything else can fail.
pub fn reserve(file: &Path, run_dir: &Path, pages: u64) -> anyhow::Result<u64> {
    locked(file, |before| {
        write_count(file, before + pages)?;
        let got = count(file)?.saturating_sub(before);
        if got > 0 {
            fs::write(run_dir.join(RECORD), got.to_string()).with_context(|| {
                format!("recording the reserved pages in {}", run_dir.display())
            })?;
        }
        Ok(got)
    })
}

/// Gives back the pages the run in `run_dir` reserved in `file`, if it did; other runs' stay.
pub fn release(file: &Path, run_dir: &Path) -> anyhow::Result<()> {
    let record = run_dir.join(RECORD);
    let Ok(text) = fs::read_to_string(&record) else {
        return Ok(());
    };
    let ours: u64 = text
        .trim()
        .parse()
        .with_context(|| format!("{}: {text:?} is not a page count", record.display()))?;
    locked(file, |now| write_count(file, now.saturating_sub(ours)))?;
    fs::remove_file(&record).with_context(|| format!("removing {}", record.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_gives_back_what_it_reserved_and_leaves_other_runs_pages() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("nr_hugepages");
        fs::write(&file, "3\n").unwrap();
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        fs::create_dir(&a).unwrap();
        fs::create_dir(&b).unwrap();
        assert_eq!(reserve(&file, &a, 4).unwrap(), 4);
        assert_eq!(reserve(&file, &b, 2).unwrap(), 2);
        assert_eq!(count(&file).unwrap(), 9);
        release(&file, &a).unwrap();
        assert_eq!(count(&file).unwrap(), 5, "b's pages stay");
        assert!(!a.join(RECORD).exists());
        // Released once: a second release (the sweep after the run's own) gives nothing back.
        release(&file, &a).unwrap();
        assert_eq!(count(&file).unwrap(), 5);
        release(&file, &b).unwrap();
        assert_eq!(count(&file).unwrap(), 3, "the count before either run");
    }

    #[test]
    fn a_run_that_reserved_nothing_gives_nothing_back() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("nr_hugepages");
        fs::write(&file, "7").unwrap();
        release(&file, dir.path()).unwrap();
        assert_eq!(count(&file).unwrap(), 7);
    }

    #[test]
    fn a_count_that_is_not_a_number_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("nr_hugepages");
        fs::write(&file, "lots").unwrap();
        let err = reserve(&file, dir.path(), 1).unwrap_err();
        assert!(
            format!("{err:#}").contains("is not a page count"),
            "{err:#}"
        );
    }
}
