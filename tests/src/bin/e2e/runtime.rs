//! The container runtime a run drives, as the scenarios see it: containerd ([`crate::containerd`])
//! or CRI-O ([`crate::crio`]). Both serve CRI on a socket of the run, call the agent over NRI on
//! the run's NRI socket and read CDI specs from the agent's directory; the scenarios start, stop
//! and restart the runtime and import images through this, and ask [`Kind`] where the two
//! legitimately behave differently.

use std::path::Path;

use crate::{containerd::Paths, cri::Cri};

/// Which runtime a run drives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Kind {
    Containerd,
    Crio,
}

/// A run's container runtime.
pub trait Runtime: std::fmt::Debug {
    /// Its name in messages: `containerd` or `CRI-O`.
    fn name(&self) -> &'static str;
    fn kind(&self) -> Kind;
    /// Its configuration, sockets, the CDI directory it reads and its log.
    fn paths(&self) -> &Paths;
    /// Starts it and waits until its CRI service answers.
    fn start(&mut self, cri: &Cri) -> anyhow::Result<()>;
    /// Stops it with SIGTERM; the containers keep running under their shims or monitors.
    fn stop(&mut self) -> anyhow::Result<()>;
    /// Whether it was started and not stopped since.
    fn running(&self) -> bool;
    /// Makes the image `name`, an OCI archive at `archive`, available to pods.
    fn import(&self, cri: &Cri, archive: &Path, name: &str) -> anyhow::Result<()>;
    /// The last lines of its log.
    fn tail(&self, lines: usize) -> String {
        crate::procs::tail(&self.paths().log, lines)
    }
}
