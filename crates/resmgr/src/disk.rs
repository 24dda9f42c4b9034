//! The manager's disk while it serves: the state file, the CDI spec store and the claims' device
//! metadata, used from async code without blocking the async runtime's threads.
//!
//! Every write here fsyncs, and a slow or stalled disk must not stall the NRI event handlers
//! (the runtime drops a plugin that does not answer in time, which ends the agent) or anything
//! else on the two runtime threads. So each operation runs on tokio's blocking pool, and none is
//! ever called with the manager lock held ([`crate::core`]). Start-up, which runs before
//! anything is served, reads and writes directly.
//!
//! Each operation passes its fault point first ([`crate::faults`]).
//!
//! Only the core's commit holds a [`Disk`] ([`crate::core`]): the rest of the manager reaches the
//! disk through the core's API, never with the manager lock held.

use std::{io, sync::Arc};

use cdi::{ContainerEdits, SpecStore, StoreError};
use tokio::sync::{OwnedRwLockReadGuard, RwLock};

use crate::{
    faults::{Faults, Point},
    metadata::{MetadataError, MetadataFile, MetadataStore},
    state::{State, StateError, StateFile},
};

/// Runs blocking disk work for `point` on tokio's blocking pool, off the async runtime's
/// threads (or inline on the calling task, when a test's hooks ask:
/// [`crate::faults::FaultHooks::inline`]).
pub(crate) async fn off_thread<T: Send + 'static>(
    faults: &Faults,
    point: Point,
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, io::Error> {
    let inline = faults.inline();
    let faults = faults.clone();
    let work = move || {
        faults.block_if_armed(point);
        work()
    };
    if inline {
        return Ok(work());
    }
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| io::Error::other(format!("the disk task failed: {e}")))
}

/// The state file and the spec store, off the runtime threads.
#[derive(Debug, Clone)]
pub(crate) struct Disk {
    pub(crate) state_file: StateFile,
    pub(crate) specs: SpecStore,
    /// The claims' device metadata, when the agent writes any.
    pub(crate) metadata: Option<MetadataStore>,
    pub(crate) faults: Faults,
    /// Whether the node was handed over ([`crate::handover`]): then nothing is written any
    /// more. Every operation holds a read share until its blocking work is done, even if the
    /// future that started it is dropped, so retiring waits for the disk work in flight.
    pub(crate) retired: Arc<RwLock<bool>>,
}

/// An operation of a manager that handed the node over.
fn retired_error() -> io::Error {
    io::Error::other("this agent handed the node over: its successor owns the state now")
}

impl Disk {
    /// The disk over `state_file` and `specs`.
    pub(crate) fn new(state_file: StateFile, specs: SpecStore, faults: Faults) -> Self {
        Self {
            state_file,
            specs,
            metadata: None,
            faults,
            retired: Arc::default(),
        }
    }

    /// The disk that also writes the claims' device metadata into `metadata`.
    pub(crate) fn with_metadata(mut self, metadata: Option<MetadataStore>) -> Self {
        self.metadata = metadata;
        self
    }

    /// A share of the disk for one operation, unless it was retired.
    async fn enter(&self) -> Result<OwnedRwLockReadGuard<bool>, io::Error> {
        let share = self.retired.clone().read_owned().await;
        if *share {
            return Err(retired_error());
        }
        Ok(share)
    }

    /// Nothing is written from now on; waits for the operations in flight.
    pub(crate) async fn retire(&self) {
        *self.retired.write().await = true;
    }

    /// Saves the state atomically and durably.
    pub(crate) async fn save_state(&self, state: State) -> Result<(), StateError> {
        let failed = |step, source| StateError::Write {
            path: self.state_file.path(),
            source: cdi::durable::WriteError {
                step,
                path: self.state_file.path(),
                source,
            },
        };
        let share = self.enter().await.map_err(|e| failed("passing", e))?;
        self.faults
            .disk(Point::StateSave)
            .await
            .map_err(|e| failed("passing", e))?;
        let file = self.state_file.clone();
        off_thread(&self.faults, Point::StateSave, move || {
            let _share = share;
            file.save(&state)
        })
        .await
        .map_err(|e| failed("running the write of", e))?
    }

    /// Whether claim `uid` has a spec on disk.
    pub(crate) async fn has_spec(&self, uid: &str) -> Result<bool, StoreError> {
        let share = self
            .enter()
            .await
            .map_err(|e| self.io("checking for a cdi spec in", e))?;
        self.faults
            .disk(Point::SpecCheck)
            .await
            .map_err(|e| self.io("checking for a cdi spec in", e))?;
        let specs = self.specs.clone();
        let uid = uid.to_owned();
        off_thread(&self.faults, Point::SpecCheck, move || {
            let _share = share;
            specs.has_claim(&uid)
        })
        .await
        .map_err(|e| self.io("checking for a cdi spec in", e))?
    }

    /// Writes claim `uid`'s spec, one device per edit, durably.
    pub(crate) async fn write_spec(
        &self,
        uid: &str,
        edits: Vec<ContainerEdits>,
    ) -> Result<(), StoreError> {
        let share = self
            .enter()
            .await
            .map_err(|e| self.io("writing a cdi spec in", e))?;
        self.faults
            .disk(Point::SpecWrite)
            .await
            .map_err(|e| self.io("writing a cdi spec in", e))?;
        let specs = self.specs.clone();
        let owned = uid.to_owned();
        off_thread(&self.faults, Point::SpecWrite, move || {
            let _share = share;
            specs.write_claim(&owned, &edits)
        })
        .await
        .map_err(|e| self.io("writing a cdi spec in", e))??;
        self.faults
            .disk(Point::SpecWritten)
            .await
            .map_err(|e| self.io("syncing directory", e))
    }

    /// Removes claim `uid`'s spec durably; whether there was one.
    pub(crate) async fn remove_spec(&self, uid: &str) -> Result<bool, StoreError> {
        let share = self
            .enter()
            .await
            .map_err(|e| self.io("removing cdi spec in", e))?;
        self.faults
            .disk(Point::SpecRemove)
            .await
            .map_err(|e| self.io("removing cdi spec in", e))?;
        let specs = self.specs.clone();
        let uid = uid.to_owned();
        off_thread(&self.faults, Point::SpecRemove, move || {
            let _share = share;
            specs.remove_claim(&uid)
        })
        .await
        .map_err(|e| self.io("removing cdi spec in", e))?
    }

    /// Moves claim `uid`'s spec aside ([`SpecStore::set_aside`]); where to, if it was there.
    pub(crate) async fn set_aside(
        &self,
        uid: &str,
    ) -> Result<Option<std::path::PathBuf>, StoreError> {
        let share = self
            .enter()
            .await
            .map_err(|e| self.io("setting aside cdi spec in", e))?;
        self.faults
            .disk(Point::SpecSetAside)
            .await
            .map_err(|e| self.io("setting aside cdi spec in", e))?;
        let specs = self.specs.clone();
        let uid = uid.to_owned();
        off_thread(&self.faults, Point::SpecSetAside, move || {
            let _share = share;
            specs.set_aside(&uid)
        })
        .await
        .map_err(|e| self.io("setting aside cdi spec in", e))?
    }

    /// Writes claim `uid`'s device metadata files durably (nothing without a metadata store).
    pub(crate) async fn write_metadata(
        &self,
        uid: &str,
        files: Vec<MetadataFile>,
    ) -> Result<(), MetadataError> {
        let Some(store) = self.metadata.clone() else {
            return Ok(());
        };
        let dir = store.dir().to_owned();
        let failed = |source| MetadataError::Io {
            op: "writing device metadata in",
            path: dir.clone(),
            source,
        };
        let share = self.enter().await.map_err(failed)?;
        self.faults
            .disk(Point::MetadataWrite)
            .await
            .map_err(failed)?;
        let uid = uid.to_owned();
        off_thread(&self.faults, Point::MetadataWrite, move || {
            let _share = share;
            store.write_claim(&uid, &files)
        })
        .await
        .map_err(failed)?
    }

    /// Removes claim `uid`'s device metadata durably; whether there was any.
    pub(crate) async fn remove_metadata(&self, uid: &str) -> Result<bool, MetadataError> {
        let Some(store) = self.metadata.clone() else {
            return Ok(false);
        };
        let dir = store.dir().to_owned();
        let failed = |source| MetadataError::Io {
            op: "removing device metadata in",
            path: dir.clone(),
            source,
        };
        let share = self.enter().await.map_err(failed)?;
        self.faults
            .disk(Point::MetadataRemove)
            .await
            .map_err(failed)?;
        let uid = uid.to_owned();
        off_thread(&self.faults, Point::MetadataRemove, move || {
            let _share = share;
            store.remove_claim(&uid)
        })
        .await
        .map_err(failed)?
    }

    fn io(&self, op: &'static str, source: std::io::Error) -> StoreError {
        StoreError::Io {
            op,
            path: self.specs.dir().to_owned(),
            source,
        }
    }
}
