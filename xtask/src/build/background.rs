//! Builds started in the background, so that on a fresh machine their minutes of Go module
//! downloads and compilation (`nice`d) overlap the Rust build and tests instead of following
//! them. Each writes its output to a log file of its own, removed once it succeeds, and named
//! when someone has to wait for it; how long it took and how long anyone waited for it go to
//! [`crate::timing`].

use std::{
    path::{Path, PathBuf},
    thread::JoinHandle,
    time::Instant,
};

use crate::timing;

/// A build running on a thread of its own.
#[derive(Debug)]
pub struct Background<T> {
    what: &'static str,
    build: JoinHandle<anyhow::Result<T>>,
    log: PathBuf,
}

impl<T: Send + 'static> Background<T> {
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
        Self { what, build, log }
    }

    /// What the build made, waiting for it (and saying where its output is) if it has not
    /// finished.
    pub fn join(self) -> anyhow::Result<T> {
        let waiting = (!self.build.is_finished()).then(Instant::now);
        if waiting.is_some() {
            eprintln!(
                "waiting for {} to finish (its output: {})",
                self.what,
                self.log.display()
            );
        }
        let built = self
            .build
            .join()
            .map_err(|_| anyhow::anyhow!("{} panicked", self.what))?;
        if let Some(waiting) = waiting {
            timing::waited(self.what, waiting.elapsed());
        }
        if built.is_ok() {
            let _ = std::fs::remove_file(&self.log);
        }
        built
    }
}
