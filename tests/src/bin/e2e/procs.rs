//! The long-running processes of a run (containerd, the agent, the API server): started in a
//! process group of their own with their output in a log file of the run, registered for
//! teardown, stopped by PID.

use std::{
    fs,
    os::unix::process::CommandExt as _,
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};
use rustix::process::Signal;

use crate::teardown::{self, Teardown};

/// A process we started.
#[derive(Debug)]
pub struct Proc {
    pub name: String,
    child: Child,
    pub log: PathBuf,
    teardown: Teardown,
}

impl Proc {
    /// Starts `cmd` as `name`, its output appended to `log`. Its own process group keeps the
    /// terminal's Ctrl-C away from it: the run decides the order things stop in.
    pub fn start(
        name: &str,
        mut cmd: Command,
        log: &Path,
        teardown: &Teardown,
    ) -> anyhow::Result<Self> {
        let out = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .with_context(|| format!("opening {}", log.display()))?;
        let err = out.try_clone()?;
        cmd.stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .process_group(0);
        let child = cmd
            .spawn()
            .with_context(|| format!("starting {name}: {:?}", cmd.get_program()))?;
        teardown.process(name, child.id());
        Ok(Self {
            name: name.to_owned(),
            child,
            log: log.to_owned(),
            teardown: teardown.clone(),
        })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Its exit status, if it has exited.
    pub fn exited(&mut self) -> anyhow::Result<Option<ExitStatus>> {
        let status = self.child.try_wait()?;
        if status.is_some() {
            self.teardown.exited(self.child.id());
        }
        Ok(status)
    }

    /// Sends `signal` and waits up to `limit` for the exit.
    pub fn signal_and_wait(
        &mut self,
        signal: Signal,
        limit: Duration,
    ) -> anyhow::Result<ExitStatus> {
        teardown::kill(self.pid(), signal);
        self.wait(limit)
    }

    /// Waits up to `limit` for the process to exit on its own.
    pub fn wait(&mut self, limit: Duration) -> anyhow::Result<ExitStatus> {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.exited()? {
                return Ok(status);
            }
            if Instant::now() > deadline {
                bail!(
                    "{} (pid {}) did not exit within {limit:?}; its log: {}",
                    self.name,
                    self.pid(),
                    self.log.display()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The last `lines` lines of its log.
    pub fn tail(&self, lines: usize) -> String {
        tail(&self.log, lines)
    }
}

/// The last `lines` lines of a file, or a note that it cannot be read.
pub fn tail(path: &Path, lines: usize) -> String {
    match fs::read_to_string(path) {
        Ok(text) => {
            let all: Vec<&str> = text.lines().collect();
            all[all.len().saturating_sub(lines)..].join("\n")
        }
        Err(e) => format!("({}: {e})", path.display()),
    }
}

/// Polls `cond` every 20 ms until it holds or `limit` passes. For what has no event to wait on
/// (a socket appearing, an HTTP endpoint turning ready); reaching the limit is a failure.
pub fn wait_until(
    what: &str,
    limit: Duration,
    mut cond: impl FnMut() -> anyhow::Result<bool>,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + limit;
    loop {
        if cond()? {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("timed out after {limit:?} waiting for {what}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
