//! Builds started in the background, so that on a fresh machine their minutes of Go module
//! downloads and compilation (`nice`d) overlap the Rust build and tests instead of following
//! them. Each writes its output to a log file of its own, removed once it succeeds, and named
//! when someone has to wait for it; how long it took and how long anyone waited for it go to
//! [`crate::timing`]. The Go builds among them run [`go`].
//!
//! A build's result is shared: the e2e's stages run on two threads at once
//! ([`crate::e2e::in_test`]), and both may need the same build, so each asks with
//! [`Background::get`] and gets a copy; whoever asks first waits for the build, and whoever asks
//! meanwhile waits with it.

use std::{
    path::{Path, PathBuf},
    process::Command,
    sync::{Mutex, OnceLock, PoisonError, TryLockError},
    thread::JoinHandle,
    time::Instant,
};

use crate::timing;

/// A build running on a thread of its own.
#[derive(Debug)]
pub struct Background<T> {
    what: &'static str,
    /// The build's thread until someone has joined it.
    build: Mutex<Option<JoinHandle<anyhow::Result<T>>>>,
    /// What it made; an error is kept as its message, which every asker gets.
    made: OnceLock<Result<T, String>>,
    log: PathBuf,
}

impl<T: Clone + Send + 'static> Background<T> {
    /// Starts `build` with the path of its log file (`<name>-<pid>.log` in the temporary
    /// directory); `what` names it in messages ("the e2e's containerd build").
    pub fn start(
        what: &'static str,
        name: &str,
        build: impl FnOnce(&Path) -> anyhow::Result<T> + Send + 'static,
    ) -> Self {
        let log = std::env::temp_dir().join(format!("{name}-{}.log", std::process::id()));
        let build_log = log.clone();
        let build = std::thread::spawn(move || {
            let started = Instant::now();
            let built = build(&build_log);
            timing::built(what, started.elapsed());
            built
        });
        Self {
            what,
            build: Mutex::new(Some(build)),
            made: OnceLock::new(),
            log,
        }
    }

    /// Whether the build has ended (however it ended): [`Background::get`] would not wait. It
    /// does not wait either: while another thread joins the build, the answer is no.
    pub fn is_done(&self) -> bool {
        if self.made.get().is_some() {
            return true;
        }
        match self.build.try_lock() {
            Ok(build) => build.as_ref().is_none_or(JoinHandle::is_finished),
            Err(TryLockError::Poisoned(build)) => build
                .into_inner()
                .as_ref()
                .is_none_or(JoinHandle::is_finished),
            Err(TryLockError::WouldBlock) => false,
        }
    }

    /// What the build made, waiting for it (and saying where its output is) if it has not
    /// finished.
    pub fn get(&self) -> anyhow::Result<T> {
        let asked = Instant::now();
        // Not done also while another asker joins the build: this one then waits with it, and
        // says so.
        let waits = !self.is_done();
        if waits {
            eprintln!(
                "waiting for {} to finish (its output: {})",
                self.what,
                self.log.display()
            );
        }
        // Whoever takes the lock first joins the build, holding the lock until what it made is
        // kept; another asker waits on the lock meanwhile.
        let mut running = self.build.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(build) = running.take() {
            let built = match build.join() {
                Ok(built) => built.map_err(|e| format!("{e:#}")),
                Err(_) => Err(format!("{} panicked", self.what)),
            };
            if built.is_ok() {
                let _ = std::fs::remove_file(&self.log);
            }
            let _ = self.made.set(built);
        }
        drop(running);
        if waits {
            timing::waited(self.what, asked.elapsed());
        }
        match self.made.get() {
            Some(Ok(made)) => Ok(made.clone()),
            Some(Err(error)) => Err(anyhow::anyhow!("{error}")),
            None => anyhow::bail!("{} was never joined", self.what),
        }
    }
}

/// `go`, for a build of ours in the background: `nice`d, so that the steps in the foreground
/// keep their pace, and with the compiler's garbage collector at a quarter of its usual work
/// (`GOGC=400`). The builds are CPU-bound on two cores, and measured here a cold build of
/// kube-scheduler took 211 s instead of 246 s (327 instead of 404 CPU seconds of user time),
/// no process of it growing past 2 GB either way. GOGC is no input of Go's build cache: what it
/// builds is the same.
pub fn go() -> Command {
    let mut go = Command::new("nice");
    go.args(["-n", "10", "go"]).env("GOGC", "400");
    go
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_threads_asking_at_once_get_the_same_build_and_its_error_each() {
        let (go, wait) = std::sync::mpsc::channel::<()>();
        let build = Background::start("a test build", "resmgr-test-build", move |_| {
            wait.recv()?;
            Ok(7_u32)
        });
        assert!(!build.is_done());
        std::thread::scope(|s| {
            let other = s.spawn(|| build.get().unwrap());
            assert!(!build.is_done(), "asked while the build waits to begin");
            go.send(()).unwrap();
            assert_eq!(build.get().unwrap(), 7);
            assert_eq!(other.join().unwrap(), 7);
        });
        assert!(build.is_done());
        let failed: Background<u32> =
            Background::start("a failing build", "resmgr-test-build", |_| {
                anyhow::bail!("no compiler")
            });
        for _ in 0..2 {
            let error = failed.get().unwrap_err().to_string();
            assert_eq!(error, "no compiler");
        }
    }
}
