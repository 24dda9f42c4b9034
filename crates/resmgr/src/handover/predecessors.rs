//! The pods whose agents handed the node over, remembered in the state directory
//! (`<state-dir>/handed-over.json`, [`FILE`]), so that the owner refuses them whoever it is.
//!
//! A pod that handed the node over is being replaced: the DaemonSet deletes it once its
//! successor is ready. If its container restarts meanwhile (it crashed, or was killed), its
//! agent must not be handed the node back: the node would go to a pod about to be deleted, and
//! the successor, which handed it over, would be done with it for good. Remembering them only
//! in the owner's memory is not enough: an owner that crashed and restarted, or took the node
//! from a free lock, knows nobody. So each owner, as it hands the node over, adds its own pod to
//! the file (atomically and durably, while it still holds the lock), and the owner reads it when
//! it starts serving handovers. The last [`REMEMBERED`] pods are kept: a pod being replaced is
//! deleted within minutes, many handovers before it would be forgotten.
//!
//! The file is advice, not state: one that cannot be read is logged and taken as empty, so it
//! never stops an agent.

use std::{io, path::Path};

use cdi::durable::{self, WriteError};
use tracing::warn;

use crate::{disk::off_thread, faults::Faults, points::Point};

/// The file's name in the state directory.
pub const FILE: &str = "handed-over.json";

/// How many pods the file keeps, the most recent.
pub const REMEMBERED: usize = 32;

/// The file's mode.
const MODE: u32 = 0o644;

/// Pods whose agents handed the node over, oldest first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Predecessors(Vec<String>);

impl Predecessors {
    /// What the state directory `dir` remembers: none if the file is missing, and none, with
    /// a warning, if it cannot be read. Removes what a write that a crash interrupted left
    /// (the caller holds the state directory's lock).
    pub fn load(dir: &Path) -> Self {
        if let Err(e) = durable::remove_temporary_files(dir, FILE) {
            warn!(error = %e, "removing what an interrupted write of the pods that handed the node over left");
        }
        let path = dir.join(FILE);
        let bytes = match std::fs::read(&path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Self::default(),
            Err(e) => {
                warn!(path = %path.display(), error = %e, "cannot read which pods handed the node over; refusing none of them");
                return Self::default();
            }
        };
        match serde_json::from_slice::<Vec<String>>(&bytes) {
            Ok(pods) => Self(pods),
            Err(e) => {
                warn!(path = %path.display(), error = %e, "the list of pods that handed the node over is corrupt; refusing none of them");
                Self::default()
            }
        }
    }

    /// Whether the agent of `pod` handed the node over.
    pub fn contains(&self, pod: &str) -> bool {
        self.0.iter().any(|p| p == pod)
    }

    /// These and `pod`, the most recent [`REMEMBERED`].
    #[must_use]
    pub fn with(mut self, pod: &str) -> Self {
        self.0.retain(|p| p != pod);
        self.0.push(pod.to_owned());
        let excess = self.0.len().saturating_sub(REMEMBERED);
        self.0.drain(..excess);
        self
    }

    /// Writes them to the state directory `dir`, atomically and durably, off the async
    /// runtime's threads; passes [`Point::HandoverRemembered`] once they are on disk.
    pub async fn save(&self, dir: &Path, faults: &Faults) -> Result<(), io::Error> {
        let bytes = serde_json::to_vec(&self.0).map_err(io::Error::other)?;
        let dir = dir.to_owned();
        off_thread(faults, Point::HandoverRemembered, move || {
            durable::replace(&dir, FILE, &bytes, MODE).map_err(|e: WriteError| io::Error::other(e))
        })
        .await??;
        faults.handover_step(Point::HandoverRemembered).await;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn they_survive_the_agent_and_keep_the_most_recent() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(Predecessors::load(dir.path()), Predecessors::default());
        let mut remembered = Predecessors::default();
        for i in 0..REMEMBERED + 3 {
            remembered = remembered.with(&format!("pod-{i}"));
        }
        remembered = remembered.with("pod-5");
        remembered
            .save(dir.path(), &Faults::default())
            .await
            .unwrap();
        let loaded = Predecessors::load(dir.path());
        assert_eq!(loaded, remembered);
        assert_eq!(loaded.0.len(), REMEMBERED);
        assert!(!loaded.contains("pod-2"), "the oldest are forgotten");
        assert!(loaded.contains("pod-3") && loaded.contains("pod-34"));
        assert_eq!(
            loaded.0.last().map(String::as_str),
            Some("pod-5"),
            "again: the most recent"
        );
    }

    #[test]
    fn a_corrupt_file_refuses_nobody_and_stops_nothing() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(FILE), b"{not a list").unwrap();
        assert_eq!(Predecessors::load(dir.path()), Predecessors::default());
    }
}
