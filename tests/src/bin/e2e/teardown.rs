//! Everything a run created, and taking it down again: processes by PID, cgroups, mounts, the
//! hugepages it reserved and the run directory, in that order, exactly once, whether the run passed, failed, panicked or was
//! interrupted.
//!
//! The registry is shared between the run and a signal thread. The run's guard tears down when
//! it is dropped (a scenario's error or panic unwinds through it); SIGINT, SIGTERM and SIGHUP
//! tear down from the signal thread and then end the process. Nothing is ever found by name:
//! processes are the PIDs we started, the shims and container processes containerd started for
//! us (read from the pid files in our own state directory and from our own cgroups), mounts are
//! those under our run directory, cgroups those under our run's unique cgroup root.

use std::{
    collections::BTreeSet,
    fs,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use rustix::process::{Pid, Signal};

/// What a run created, to be taken down.
#[derive(Default)]
struct Registry {
    /// Processes we started, in start order; stopped in reverse, each with SIGTERM first.
    processes: Vec<(String, u32)>,
    /// Run before anything is killed, while the runtime still answers (removing pods).
    graceful: Vec<Box<dyn FnOnce() + Send>>,
    /// The run directory: mounts under it are unmounted, pid files under it read, then it goes.
    run_dir: Option<PathBuf>,
    /// Cgroup paths relative to each hierarchy's root (`/resmgr-e2e-<id>-kubepods`).
    cgroup_roots: Vec<String>,
    /// Keep the run directory (for its logs).
    keep: bool,
    /// Teardown has begun: anything started from now on is stopped at once.
    done: bool,
    /// The signal that began it, if one did.
    signal: Option<i32>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field("processes", &self.processes)
            .field("graceful", &self.graceful.len())
            .field("run_dir", &self.run_dir)
            .field("cgroup_roots", &self.cgroup_roots)
            .field("keep", &self.keep)
            .field("done", &self.done)
            .field("signal", &self.signal)
            .finish()
    }
}

#[derive(Debug, Default)]
struct Shared {
    registry: Mutex<Registry>,
    /// Held for the whole teardown, so that a second caller (the run ending while a signal's
    /// teardown is under way) waits for it to finish instead of ending the process under it.
    busy: Mutex<()>,
}

/// The shared registry; clones are handles to the same one.
#[derive(Debug, Clone, Default)]
pub struct Teardown(Arc<Shared>);

impl Teardown {
    /// Sets the run directory (and whether it is kept at the end).
    pub fn set_run_dir(&self, run_dir: &Path, keep: bool) {
        let mut r = self.lock();
        r.run_dir = Some(run_dir.to_owned());
        r.keep = keep;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Registry> {
        // A panic while holding the lock leaves plain data behind; teardown must still run.
        stdx::sync::lock(&self.0.registry)
    }

    /// Registers a process we started; one started after teardown began is stopped at once
    /// (the run may still be working when a signal's teardown starts).
    pub fn process(&self, name: &str, pid: u32) {
        let mut r = self.lock();
        if r.done {
            drop(r);
            stop_pid(name, pid, Duration::from_secs(5));
        } else {
            r.processes.push((name.to_owned(), pid));
        }
    }

    /// The signal that interrupted the run, if one did.
    pub fn interrupted(&self) -> Option<i32> {
        self.lock().signal
    }

    /// Forgets a process that has exited (its PID may be reused).
    pub fn exited(&self, pid: u32) {
        self.lock().processes.retain(|(_, p)| *p != pid);
    }

    /// Registers a cgroup root of the run: one top-level cgroup, `/<name>`, in every
    /// hierarchy. Every process in it is killed at the end, so it must be the run's own.
    pub fn cgroup_root(&self, root: &str) {
        let name = root.trim_start_matches('/');
        assert!(
            !name.is_empty() && !name.contains('/') && name != "..",
            "a run's cgroup root is one top-level cgroup of its own, not {root:?}"
        );
        self.lock().cgroup_roots.push(format!("/{name}"));
    }

    /// Registers a step to run first, while the runtime still answers.
    pub fn graceful(&self, step: impl FnOnce() + Send + 'static) {
        self.lock().graceful.push(Box::new(step));
    }

    /// Takes everything down, once; a call while another is under way waits for it.
    pub fn run(&self) {
        let _busy = stdx::sync::lock(&self.0.busy);
        let (graceful, processes, run_dir, cgroups, keep) = {
            let mut r = self.lock();
            if r.done {
                return;
            }
            r.done = true;
            (
                std::mem::take(&mut r.graceful),
                std::mem::take(&mut r.processes),
                r.run_dir.clone(),
                r.cgroup_roots.clone(),
                r.keep,
            )
        };
        for step in graceful.into_iter().rev() {
            step();
        }
        for (name, pid) in processes.iter().rev() {
            stop_pid(name, *pid, Duration::from_secs(10));
        }
        // What containerd started for us and may have left: shims and container processes,
        // found by their pid files in our state directory, by our cgroups, and by the run
        // directory in their command line (a shim starting while containerd was stopped may
        // not have written its pid file yet; shims live in no cgroup of ours).
        let mut leftovers = BTreeSet::new();
        if let Some(dir) = &run_dir {
            leftovers.extend(pid_files(dir));
            leftovers.extend(naming(dir));
        }
        for root in &cgroups {
            leftovers.extend(cgroup_pids(root));
        }
        for pid in leftovers {
            kill(pid, Signal::KILL);
        }
        // Cgroups before mounts: a hierarchy the run mounted under its directory (hugetlb) is
        // where its cgroups are seen, and the kernel keeps them after it is unmounted.
        for root in &cgroups {
            remove_cgroups(root);
        }
        if let Some(dir) = &run_dir {
            unmount_under(dir);
            if let Err(e) = crate::hugetlb::release(Path::new(crate::hugetlb::NR_HUGEPAGES_2M), dir)
            {
                eprintln!("e2e: giving back the run's hugepages: {e:#}");
            }
            if keep {
                eprintln!("e2e: kept the run directory {}", dir.display());
            } else if let Err(e) = fs::remove_dir_all(dir) {
                eprintln!("e2e: could not remove {}: {e}", dir.display());
            }
        }
    }

    /// Tears down on SIGINT, SIGTERM or SIGHUP, then ends the process with 128 + the signal.
    /// With `interrupt` false, SIGINT is left to the command in the foreground (a shell the
    /// user runs against the node, where Ctrl-C is for it), and only SIGTERM and SIGHUP end
    /// the run.
    pub fn on_signals(&self, interrupt: bool) -> std::io::Result<()> {
        use tokio::signal::unix::{SignalKind, signal};
        let teardown = self.clone();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        // Register the handlers here, so a signal from now on is ours.
        let (mut int, mut term, mut hup) = runtime.block_on(async {
            Ok::<_, std::io::Error>((
                signal(SignalKind::interrupt())?,
                signal(SignalKind::terminate())?,
                signal(SignalKind::hangup())?,
            ))
        })?;
        std::thread::spawn(move || {
            let number = runtime.block_on(async {
                loop {
                    tokio::select! {
                        _ = int.recv() => if interrupt { return 2 },
                        _ = term.recv() => return 15,
                        _ = hup.recv() => return 1,
                    }
                }
            });
            eprintln!("e2e: signal {number}: tearing down");
            teardown.lock().signal = Some(number);
            teardown.run();
            #[allow(clippy::exit)] // reason: the process was told to stop, and has cleaned up
            std::process::exit(128 + number);
        });
        Ok(())
    }
}

/// The prefix of run directories.
pub const RUN_PREFIX: &str = "rme2e-";
/// The file in a run directory naming the process that owns it.
const OWNER: &str = "e2e.owner";

/// The run's cgroup root, derived from its directory's name (`/resmgr-e2e-<id>-kubepods`: the
/// kubelet's `kubepods` is in it, so the agent reads the pods' QoS classes from their parents).
pub fn cgroup_root_of(run_dir: &Path) -> String {
    let name = run_dir.file_name().unwrap_or_default().to_string_lossy();
    let id = name.trim_start_matches(RUN_PREFIX).to_ascii_lowercase();
    format!("/resmgr-e2e-{id}-kubepods")
}

/// A live process's identity: its PID and its start time (so a reused PID is not taken for
/// it). None for a process that is gone or a zombie (killed, not yet reaped).
fn identity(pid: u32) -> Option<String> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // `rest` starts at field 3, the state; field 22 is the start time.
    if matches!(fields.first(), Some(&("Z" | "X")) | None) {
        return None;
    }
    Some(format!("{pid} {}", fields.get(19)?))
}

/// Marks `run_dir` as this process's.
pub fn claim_run(run_dir: &Path) -> anyhow::Result<()> {
    let me = identity(std::process::id()).unwrap_or_default();
    fs::write(run_dir.join(OWNER), me)?;
    Ok(())
}

/// Tears down the runs under `root` whose runner is gone: killed with SIGKILL, or by a machine
/// that lost power, they could not clean up after themselves. A run whose owner still runs
/// (another engineer's, another CI job's) is left alone, and so is one too young to have
/// written its owner file yet.
pub fn sweep_stale(root: &Path) {
    let Ok(entries) = fs::read_dir(root) else {
        return;
    };
    for entry in entries.flatten() {
        let dir = entry.path();
        let is_run = entry
            .file_name()
            .to_str()
            .is_some_and(|n| n.starts_with(RUN_PREFIX))
            && entry.file_type().is_ok_and(|t| t.is_dir());
        if !is_run {
            continue;
        }
        let owner = fs::read_to_string(dir.join(OWNER)).ok();
        let stale = match owner.as_deref().map(str::trim) {
            Some(owner) => {
                let pid = owner.split_whitespace().next().and_then(|p| p.parse().ok());
                pid.and_then(identity).as_deref() != Some(owner)
            }
            None => entry
                .metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|age| age > Duration::from_secs(600)),
        };
        if stale {
            eprintln!(
                "e2e: tearing down {}, left by a run that is gone",
                dir.display()
            );
            let t = Teardown::default();
            t.set_run_dir(&dir, false);
            t.cgroup_root(&cgroup_root_of(&dir));
            t.run();
        }
    }
}

/// A guard that tears down when dropped.
#[derive(Debug)]
pub struct Guard(pub Teardown);

impl Drop for Guard {
    fn drop(&mut self) {
        self.0.run();
    }
}

fn pid_of(pid: u32) -> Option<Pid> {
    i32::try_from(pid).ok().and_then(Pid::from_raw)
}

/// Sends `signal` to `pid`; a process that is gone is fine.
pub fn kill(pid: u32, signal: Signal) {
    if let Some(p) = pid_of(pid) {
        let _ = rustix::process::kill_process(p, signal);
    }
}

/// Whether `pid` names a live process (not a zombie).
pub fn alive(pid: u32) -> bool {
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the command in parentheses, which may itself hold parentheses.
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X"),
        Err(_) => false,
    }
}

/// Waits until `pid` is gone or `limit` passes; whether it is gone.
pub fn wait_gone(pid: u32, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    while alive(pid) {
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    true
}

/// SIGTERM, then SIGKILL after `grace`.
pub fn stop_pid(name: &str, pid: u32, grace: Duration) {
    if !alive(pid) {
        return;
    }
    kill(pid, Signal::TERM);
    if !wait_gone(pid, grace) {
        eprintln!("e2e: {name} (pid {pid}) ignored SIGTERM for {grace:?}; killing it");
        kill(pid, Signal::KILL);
        wait_gone(pid, Duration::from_secs(5));
    }
}

/// PIDs in `*.pid` files under `dir` (containerd's task directories hold `shim.pid` and
/// `init.pid`).
fn pid_files(dir: &Path) -> Vec<u32> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = fs::read_dir(&d) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let Ok(kind) = entry.file_type() else {
                continue;
            };
            if kind.is_dir() {
                stack.push(path);
            } else if kind.is_file()
                && path.extension().is_some_and(|e| e == "pid")
                && let Some(pid) = fs::read_to_string(&path)
                    .ok()
                    .and_then(|s| s.trim().parse().ok())
            {
                out.push(pid);
            }
        }
    }
    out
}

/// Processes (other than this one) whose command line names `dir`, the run's own directory.
fn naming(dir: &Path) -> Vec<u32> {
    let needle = dir.as_os_str().as_encoded_bytes();
    let me = std::process::id();
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| *pid != me)
        .filter(|pid| {
            fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|cmdline| {
                cmdline
                    .split(|b| *b == 0)
                    .any(|arg| arg.windows(needle.len()).any(|w| w == needle))
            })
        })
        .collect()
}

/// Where each cgroup hierarchy is mounted (v1 controllers and the unified one).
pub fn cgroup_mounts() -> Vec<PathBuf> {
    let Ok(mounts) = fs::read_to_string("/proc/self/mounts") else {
        return Vec::new();
    };
    mounts
        .lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let (_, point, kind) = (fields.next()?, fields.next()?, fields.next()?);
            (kind == "cgroup" || kind == "cgroup2").then(|| PathBuf::from(unescape(point)))
        })
        .collect()
}

/// Every cgroup directory under `root` in every hierarchy, deepest first.
fn cgroup_dirs(root: &str) -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    for mount in cgroup_mounts() {
        let top = mount.join(root.trim_start_matches('/'));
        let mut stack = vec![top];
        while let Some(d) = stack.pop() {
            if !d.is_dir() {
                continue;
            }
            if let Ok(entries) = fs::read_dir(&d) {
                for entry in entries.flatten() {
                    if entry.file_type().is_ok_and(|k| k.is_dir()) {
                        stack.push(entry.path());
                    }
                }
            }
            dirs.push(d);
        }
    }
    dirs.sort_by_key(|d| std::cmp::Reverse(d.components().count()));
    dirs
}

fn cgroup_pids(root: &str) -> Vec<u32> {
    cgroup_dirs(root)
        .iter()
        .filter_map(|d| fs::read_to_string(d.join("cgroup.procs")).ok())
        .flat_map(|s| {
            s.lines()
                .filter_map(|l| l.trim().parse().ok())
                .collect::<Vec<u32>>()
        })
        .collect()
}

fn remove_cgroups(root: &str) {
    for dir in cgroup_dirs(root) {
        // A cgroup goes with rmdir once its processes are gone; they were killed just before,
        // and the kernel may take a moment to let go of them.
        let deadline = Instant::now() + Duration::from_secs(5);
        while let Err(e) = fs::remove_dir(&dir) {
            if e.kind() == std::io::ErrorKind::NotFound {
                break;
            }
            if Instant::now() > deadline {
                eprintln!("e2e: could not remove cgroup {}: {e}", dir.display());
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// `/proc/self/mounts` escapes spaces and a few other bytes as octal.
fn unescape(s: &str) -> String {
    let mut out = Vec::with_capacity(s.len());
    let bytes = s.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && i + 3 < bytes.len()
            && bytes[i + 1..i + 4]
                .iter()
                .all(|b| (b'0'..=b'7').contains(b))
        {
            let n = (bytes[i + 1] - b'0') * 64 + (bytes[i + 2] - b'0') * 8 + (bytes[i + 3] - b'0');
            out.push(n);
            i += 4;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Unmounts every mount point under `dir`, deepest first (lazily, so a busy mount still goes).
fn unmount_under(dir: &Path) {
    let Ok(mounts) = fs::read_to_string("/proc/self/mountinfo") else {
        return;
    };
    let mut points: Vec<PathBuf> = mounts
        .lines()
        .filter_map(|line| line.split_whitespace().nth(4))
        .map(|p| PathBuf::from(unescape(p)))
        .filter(|p| p.starts_with(dir))
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    for point in points {
        // umount(8) rather than the system call: rustix's mount feature is not in the
        // workspace's feature set, and this runs once per leftover mount.
        let status = std::process::Command::new("umount")
            .arg("--lazy")
            .arg(&point)
            .status();
        if !status.is_ok_and(|s| s.success()) {
            eprintln!("e2e: could not unmount {}", point.display());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mount_paths_are_unescaped() {
        assert_eq!(unescape(r"/tmp/a\040b"), "/tmp/a b");
        assert_eq!(unescape("/plain"), "/plain");
        assert_eq!(unescape(r"/end\04"), r"/end\04");
    }

    #[test]
    fn pid_files_are_found_under_a_tree() {
        let dir = tempfile::tempdir().unwrap();
        let task = dir.path().join("state/task/k8s.io/abc");
        fs::create_dir_all(&task).unwrap();
        fs::write(task.join("shim.pid"), "123\n").unwrap();
        fs::write(task.join("init.pid"), "456").unwrap();
        fs::write(task.join("other"), "789").unwrap();
        let mut pids = pid_files(dir.path());
        pids.sort_unstable();
        assert_eq!(pids, [123, 456]);
    }

    #[test]
    fn processes_are_found_by_the_run_directory_in_their_command_line() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("log");
        fs::write(&file, "").unwrap();
        // Runs until killed, with the path in its command line.
        let mut child = std::process::Command::new("tail")
            .arg("-f")
            .arg(&file)
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap();
        // Until the child has exec'd tail, its command line is still ours.
        let file_bytes = file.as_os_str().as_encoded_bytes().to_vec();
        let deadline = Instant::now() + Duration::from_secs(10);
        while !fs::read(format!("/proc/{}/cmdline", child.id()))
            .is_ok_and(|c| c.split(|b| *b == 0).any(|arg| arg == file_bytes))
        {
            assert!(Instant::now() < deadline, "tail never started");
            std::thread::sleep(Duration::from_millis(10));
        }
        let found = naming(dir.path());
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(found, [child.id()]);
    }

    #[test]
    fn a_run_whose_owner_is_gone_is_swept_and_a_live_ones_is_not() {
        let root = tempfile::tempdir().unwrap();
        let live = root.path().join(format!("{RUN_PREFIX}live"));
        let gone = root.path().join(format!("{RUN_PREFIX}gone"));
        let young = root.path().join(format!("{RUN_PREFIX}young"));
        let other = root.path().join("unrelated");
        for d in [&live, &gone, &young, &other] {
            fs::create_dir(d).unwrap();
        }
        claim_run(&live).unwrap();
        let mut child = std::process::Command::new("sleep")
            .arg("60")
            .spawn()
            .unwrap();
        let dead = identity(child.id()).unwrap();
        child.kill().unwrap();
        // Killed but not reaped (as a runner killed under a parent that does not reap): a
        // zombie is gone too.
        assert!(wait_gone(child.id(), Duration::from_secs(10)));
        fs::write(gone.join(OWNER), &dead).unwrap();
        assert_eq!(identity(child.id()), None);
        sweep_stale(root.path());
        assert!(live.exists(), "its owner (this test) still runs");
        assert!(!gone.exists(), "its owner has exited");
        assert!(young.exists(), "no owner file yet, and only just made");
        assert!(other.exists(), "not a run directory");
        child.wait().unwrap();
    }

    #[test]
    fn the_cgroup_root_names_the_run_and_kubepods() {
        assert_eq!(
            cgroup_root_of(Path::new("/tmp/rme2e-AbC123")),
            "/resmgr-e2e-abc123-kubepods"
        );
    }

    #[test]
    fn our_own_process_is_alive_and_a_reaped_one_is_not() {
        assert!(alive(std::process::id()));
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        assert!(!alive(pid));
    }
}
