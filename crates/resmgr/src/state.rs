//! The durable state file: the policy's snapshot and our records of prepared claims.
//!
//! One JSON file, `<state-dir>/state.json`, written atomically and durably on every commit
//! ([`cdi::durable::replace`]: temporary file in the same directory, fsync, rename, fsync the
//! directory), so that after a crash it holds exactly the last commit. It is the only memory the agent has of a previous run:
//! at start-up everything durable is rebuilt from it and from the CDI directory.
//!
//! A state file that cannot be read is an error that stops the agent: deleting or overwriting it
//! would forget claims whose CPUs are in use. A missing file is a fresh start.
//!
//! One manager at a time uses a state directory: [`StateFile::lock`] takes an exclusive `flock`
//! on `<state-dir>/.lock` before anything is read or cleaned up, and a second manager is refused
//! ([`StateError::InUse`]) instead of reconciling files under the first one's feet. The lock dies
//! with the process, so a crash never leaves it stuck; the file itself stays (removing lock files
//! races with the next locker). A `flock` belongs to the open file description, not to the
//! process: a handover passes the descriptor itself to the next agent ([`StateLock::as_fd`],
//! [`StateFile::adopt`]), so that the directory is never unlocked between two owners.

use std::{
    collections::BTreeMap,
    fs, io,
    os::{
        fd::{AsFd, BorrowedFd, OwnedFd},
        unix::fs::MetadataExt,
    },
    path::{Path, PathBuf},
};

use cdi::durable::{self, WriteError};
use serde::{Deserialize, Serialize};

/// The format version of the file's own records ([`State`], [`PreparedClaim`],
/// [`DeviceRecord`]) that this build writes and reads. It has been 1 since the first state
/// file: these records refuse fields they do not know (`deny_unknown_fields`), so a field added
/// since (`adopted`) makes an older build refuse the file naming it, never read it in part. The
/// policy's snapshot carries a version of its own, which its `restore` checks (the
/// topology-aware policy's `Snapshot`). `tests/fixtures/state` holds a file of every format
/// written so far, which this build must read.
pub const STATE_VERSION: u32 = 1;

/// The file name inside the state directory.
pub const STATE_FILE: &str = "state.json";

/// The mode of the state file.
const STATE_MODE: u32 = 0o644;

/// The mode of a state directory the agent creates.
const DIR_MODE: u32 = 0o755;

/// The lock file inside the state directory.
pub const LOCK_FILE: &str = ".lock";

/// Everything durable.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct State {
    /// Format version, [`STATE_VERSION`].
    pub version: u32,
    /// The name of the policy whose snapshot this is.
    pub policy: String,
    /// The policy's snapshot.
    pub policy_state: serde_json::Value,
    /// The claims prepared (or being prepared), by UID.
    pub claims: BTreeMap<String, PreparedClaim>,
}

/// The claim records the manager holds, by UID, with a count of their changes: the durable
/// state and the published snapshot take a copy only when the count moved, never to find out
/// whether it did. Read through `Deref`; changed only through [`Records::insert`] and
/// [`Records::remove`], which count.
#[derive(Debug, Clone, Default)]
pub struct Records {
    map: BTreeMap<String, PreparedClaim>,
    generation: u64,
}

impl Records {
    /// Records as loaded.
    pub fn new(map: BTreeMap<String, PreparedClaim>) -> Self {
        Self { map, generation: 0 }
    }

    /// Records a claim (replacing its record). The same record again is no change: a
    /// re-prepare writes nothing.
    pub fn insert(&mut self, uid: String, record: PreparedClaim) -> Option<PreparedClaim> {
        if self.map.get(&uid) == Some(&record) {
            return Some(record);
        }
        self.generation += 1;
        self.map.insert(uid, record)
    }

    /// Forgets a claim's record, if there is one.
    pub fn remove(&mut self, uid: &str) -> Option<PreparedClaim> {
        let removed = self.map.remove(uid);
        if removed.is_some() {
            self.generation += 1;
        }
        removed
    }

    /// Moves whenever the records change.
    pub fn generation(&self) -> u64 {
        self.generation
    }
}

impl std::ops::Deref for Records {
    type Target = BTreeMap<String, PreparedClaim>;
    fn deref(&self) -> &Self::Target {
        &self.map
    }
}

/// What we answered the kubelet for a claim, kept to serve unprepare and to show in
/// `/debug/state` without asking the API server.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PreparedClaim {
    /// Namespace of the claim (empty when adopted).
    pub namespace: String,
    /// Name of the claim (empty when adopted).
    pub name: String,
    /// The devices, in allocation-result order (of an adopted claim, only their CDI device IDs
    /// are known).
    pub devices: Vec<DeviceRecord>,
    /// Taken back from its CDI spec at start-up because the state did not account for it (see
    /// [`crate::manager::Manager::start`]); the next prepare fills in what the spec did not say.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub adopted: bool,
}

/// One prepared device, as answered to the kubelet.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeviceRecord {
    /// Base request names (any `/subrequest` suffix stripped).
    pub request_names: Vec<String>,
    /// Pool of the device.
    pub pool: String,
    /// Device name.
    pub device: String,
    /// The qualified CDI device ID that grants it.
    pub cdi_device_id: String,
    /// Share ID, for devices allocated in shares.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub share_id: Option<String>,
}

/// Why the state could not be loaded or saved.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// Reading the file failed.
    #[error("reading state file {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// The file is not a state file we understand.
    #[error("state file {path} is corrupt: {reason}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong, with line and column.
        reason: String,
    },
    /// The file was written by a newer or unknown format.
    #[error("state file {path} has format version {found}, this build reads {STATE_VERSION}")]
    Version {
        /// The file.
        path: PathBuf,
        /// The version found.
        found: u32,
    },
    /// The file holds another policy's state.
    #[error("state file {path} holds the state of policy {found:?}, not of {expected:?}")]
    PolicyMismatch {
        /// The file.
        path: PathBuf,
        /// The policy named in the file.
        found: String,
        /// The policy running now.
        expected: String,
    },
    /// The state could not be encoded; nothing was written.
    #[error("encoding the state for {path}")]
    Encode {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: serde_json::Error,
    },
    /// Another manager holds the state directory.
    #[error("state directory {dir} is in use by another instance (lock {lock} is held)")]
    InUse {
        /// The state directory.
        dir: PathBuf,
        /// The lock file.
        lock: PathBuf,
    },
    /// A descriptor passed as the state directory's lock is another file's.
    #[error("the descriptor passed as the lock of state directory {dir} is not {lock}")]
    NotTheLock {
        /// The state directory.
        dir: PathBuf,
        /// The lock file.
        lock: PathBuf,
    },
    /// The state directory could not be locked.
    #[error("locking state directory {dir}: {step}")]
    Lock {
        /// The state directory.
        dir: PathBuf,
        /// The step that failed.
        step: &'static str,
        /// The cause.
        source: io::Error,
    },
    /// Writing the file failed; the previous state is intact.
    #[error("saving state file {path}")]
    Write {
        /// The file.
        path: PathBuf,
        /// The step that failed, and why.
        #[source]
        source: WriteError,
    },
    /// Temporary files that crashed saves left could not be removed.
    #[error("removing temporary files of state file {path}")]
    Cleanup {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: WriteError,
    },
}

/// The exclusive hold of one manager on a state directory, released when dropped (or when the
/// process dies).
#[derive(Debug)]
pub struct StateLock {
    file: fs::File,
}

impl StateLock {
    /// The lock's descriptor, to pass to the next owner of the directory: the lock is held for
    /// as long as any descriptor of its open file description is open, in whichever process.
    pub fn as_fd(&self) -> BorrowedFd<'_> {
        self.file.as_fd()
    }
}

/// The state file of one state directory.
#[derive(Debug, Clone)]
pub struct StateFile {
    dir: PathBuf,
}

impl StateFile {
    /// The state file in `dir`; the directory is created on the first save.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self { dir: dir.into() }
    }

    /// The file's path.
    pub fn path(&self) -> PathBuf {
        self.dir.join(STATE_FILE)
    }

    /// The state directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Takes the state directory for this process (creating it if needed), or refuses with
    /// [`StateError::InUse`] if another holds it. Does not wait: a second instance must not
    /// start, not queue.
    pub fn lock(&self) -> Result<StateLock, StateError> {
        let failed = |step| {
            let dir = self.dir.clone();
            move |source| StateError::Lock { dir, step, source }
        };
        durable::create_dir(&self.dir, DIR_MODE).map_err(|e| StateError::Lock {
            dir: self.dir.clone(),
            step: e.step,
            source: e.source,
        })?;
        let lock = self.dir.join(LOCK_FILE);
        let file = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock)
            .map_err(failed("opening the lock file"))?;
        match file.try_lock() {
            Ok(()) => Ok(StateLock { file }),
            Err(fs::TryLockError::WouldBlock) => Err(StateError::InUse {
                dir: self.dir.clone(),
                lock,
            }),
            Err(fs::TryLockError::Error(source)) => Err(failed("locking the lock file")(source)),
        }
    }

    /// Takes the state directory through `fd`, a descriptor of its lock file that the previous
    /// owner passed ([`StateLock::as_fd`]): the lock its open file description holds becomes
    /// this process's, and was never free in between. Refuses a descriptor of another file
    /// ([`StateError::NotTheLock`]), and one whose lock is not held by it but by another
    /// ([`StateError::InUse`]); a descriptor of the lock file whose lock nobody holds takes it.
    pub fn adopt(&self, fd: OwnedFd) -> Result<StateLock, StateError> {
        let lock = self.dir.join(LOCK_FILE);
        let failed = |step| {
            let dir = self.dir.clone();
            move |source| StateError::Lock { dir, step, source }
        };
        let file = fs::File::from(fd);
        let passed = file
            .metadata()
            .map_err(failed("reading the passed lock's metadata"))?;
        let on_disk = fs::metadata(&lock).map_err(failed("reading the lock file's metadata"))?;
        if (passed.dev(), passed.ino()) != (on_disk.dev(), on_disk.ino()) {
            return Err(StateError::NotTheLock {
                dir: self.dir.clone(),
                lock,
            });
        }
        // Locking again through the open file description that holds the lock succeeds at
        // once; through one that does not, it fails while another holds it.
        match file.try_lock() {
            Ok(()) => Ok(StateLock { file }),
            Err(fs::TryLockError::WouldBlock) => Err(StateError::InUse {
                dir: self.dir.clone(),
                lock,
            }),
            Err(fs::TryLockError::Error(source)) => Err(failed("locking the lock file")(source)),
        }
    }

    /// Loads the state: `None` when there is none yet.
    pub fn load(&self, policy: &str) -> Result<Option<State>, StateError> {
        let path = self.path();
        let bytes = match fs::read(&path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(source) => return Err(StateError::Read { path, source }),
        };
        // Check the version before the shape, so a newer format says so instead of "corrupt".
        let value: serde_json::Value =
            serde_json::from_slice(&bytes).map_err(|e| StateError::Corrupt {
                path: path.clone(),
                reason: e.to_string(),
            })?;
        let found = value.get("version").and_then(serde_json::Value::as_u64);
        if found != Some(u64::from(STATE_VERSION)) {
            let found = found.and_then(|v| u32::try_from(v).ok()).unwrap_or(0);
            return Err(StateError::Version { path, found });
        }
        let state: State = serde_json::from_value(value).map_err(|e| StateError::Corrupt {
            path: path.clone(),
            reason: e.to_string(),
        })?;
        if state.policy != policy {
            return Err(StateError::PolicyMismatch {
                path,
                found: state.policy,
                expected: policy.to_owned(),
            });
        }
        Ok(Some(state))
    }

    /// Saves the state atomically and durably, creating the directory if needed.
    pub fn save(&self, state: &State) -> Result<(), StateError> {
        let path = self.path();
        let mut bytes = serde_json::to_vec_pretty(state).map_err(|source| StateError::Encode {
            path: path.clone(),
            source,
        })?;
        bytes.push(b'\n');
        durable::create_dir(&self.dir, DIR_MODE)
            .and_then(|()| durable::replace(&self.dir, STATE_FILE, &bytes, STATE_MODE))
            .map_err(|source| StateError::Write { path, source })
    }

    /// Deletes the temporary files saves left behind when the process died during them, and
    /// returns how many. Only at start-up: a save in flight has one too.
    pub fn remove_temporary_files(&self) -> Result<usize, StateError> {
        durable::remove_temporary_files(&self.dir, STATE_FILE).map_err(|source| {
            StateError::Cleanup {
                path: self.path(),
                source,
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state() -> State {
        let mut claims = BTreeMap::new();
        claims.insert(
            "uid-1".into(),
            PreparedClaim {
                namespace: "ns".into(),
                name: "c".into(),
                devices: vec![DeviceRecord {
                    request_names: vec!["cpus".into()],
                    pool: "node".into(),
                    device: "numa0".into(),
                    cdi_device_id: "x.io/device=claim-uid-1-0".into(),
                    share_id: None,
                }],
                adopted: false,
            },
        );
        State {
            version: STATE_VERSION,
            policy: "p".into(),
            policy_state: serde_json::json!({"k": 1}),
            claims,
        }
    }

    #[test]
    fn saves_and_loads() {
        let dir = tempfile::tempdir().unwrap();
        let file = StateFile::new(dir.path().join("sub"));
        assert_eq!(file.load("p").unwrap(), None, "no file is a fresh start");
        file.save(&state()).unwrap();
        assert_eq!(file.load("p").unwrap(), Some(state()));
        let names: Vec<_> = fs::read_dir(dir.path().join("sub"))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(names, [STATE_FILE], "no temporary file is left behind");
    }

    #[test]
    fn a_corrupt_file_is_an_error_naming_the_file_and_is_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let file = StateFile::new(dir.path());
        fs::write(file.path(), b"{\"version\": 1, \"policy\": ").unwrap();
        let err = file.load("p").unwrap_err();
        assert!(matches!(err, StateError::Corrupt { .. }), "{err}");
        assert!(
            err.to_string().contains(&file.path().display().to_string()),
            "{err}"
        );
        assert!(err.to_string().contains("line 1"), "{err}");
        assert_eq!(
            fs::read(file.path()).unwrap(),
            b"{\"version\": 1, \"policy\": "
        );
    }

    #[test]
    fn a_state_file_that_cannot_be_read_is_an_error_not_a_fresh_start() {
        let dir = tempfile::tempdir().unwrap();
        let file = StateFile::new(dir.path());
        // A directory where the file should be: reading fails, and not with "not found".
        fs::create_dir(file.path()).unwrap();
        let err = file.load("p").unwrap_err();
        assert!(matches!(err, StateError::Read { .. }), "{err}");
    }

    #[test]
    fn refuses_other_versions_and_other_policies() {
        let dir = tempfile::tempdir().unwrap();
        let file = StateFile::new(dir.path());
        fs::write(file.path(), br#"{"version": 2, "future": true}"#).unwrap();
        assert!(matches!(
            file.load("p").unwrap_err(),
            StateError::Version { found: 2, .. }
        ));
        file.save(&state()).unwrap();
        let err = file.load("other").unwrap_err();
        assert!(matches!(err, StateError::PolicyMismatch { .. }), "{err}");
    }

    #[test]
    fn one_lock_per_state_directory_until_it_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let file = StateFile::new(dir.path().join("sub"));
        let held = file.lock().unwrap();
        let err = file.lock().unwrap_err();
        assert!(matches!(err, StateError::InUse { .. }), "{err}");
        drop(held);
        file.lock().unwrap();
        // Nothing but the lock file: the state itself is written by the first save.
        assert_eq!(file.load("p").unwrap(), None);
    }

    #[test]
    fn a_passed_lock_stays_held_while_it_changes_hands() {
        let dir = tempfile::tempdir().unwrap();
        let file = StateFile::new(dir.path());
        let owner = file.lock().unwrap();
        // What a handover passes: another descriptor of the same open file description.
        let passed = owner.as_fd().try_clone_to_owned().unwrap();
        drop(owner);
        // The owner let go of its descriptor; the lock is still held, by the one in flight.
        let err = file.lock().unwrap_err();
        assert!(matches!(err, StateError::InUse { .. }), "{err}");
        let successor = file.adopt(passed).unwrap();
        assert!(matches!(file.lock(), Err(StateError::InUse { .. })));
        drop(successor);
        file.lock().unwrap();
    }

    #[test]
    fn a_passed_descriptor_of_another_file_or_lock_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let file = StateFile::new(dir.path().join("a"));
        let other = StateFile::new(dir.path().join("b"));
        let held = file.lock().unwrap();
        let not_ours = other.lock().unwrap();
        let err = file
            .adopt(not_ours.as_fd().try_clone_to_owned().unwrap())
            .unwrap_err();
        assert!(matches!(err, StateError::NotTheLock { .. }), "{err}");
        assert!(err.to_string().contains("is not"), "{err}");
        // The lock file itself, opened anew: its lock is another's, so it is not taken.
        let reopened = fs::File::open(dir.path().join("a").join(LOCK_FILE)).unwrap();
        let err = file.adopt(reopened.into()).unwrap_err();
        assert!(matches!(err, StateError::InUse { .. }), "{err}");
        drop(held);
    }

    #[test]
    fn a_save_that_fails_part_way_leaves_no_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = StateFile::new(dir.path());
        // A non-empty directory where the file goes: everything succeeds up to the rename.
        fs::create_dir_all(file.path().join("in-the-way")).unwrap();
        file.save(&state()).unwrap_err();
        let mut names: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(names, [STATE_FILE], "only what was there before");
    }

    #[test]
    fn a_failed_save_is_an_error_naming_the_file_and_the_step() {
        let dir = tempfile::tempdir().unwrap();
        let file = StateFile::new(dir.path().join("sub"));
        // A file where the directory goes. (That the previous state survives a failed write is
        // the durable write's contract, tested in cdi::durable.)
        fs::write(dir.path().join("sub"), b"").unwrap();
        let err = file.save(&state()).unwrap_err();
        let StateError::Write { path, source } = &err else {
            panic!("{err}");
        };
        assert_eq!(*path, file.path());
        assert_eq!(source.step, "creating directory");
        assert_eq!(
            err.to_string(),
            format!("saving state file {}", file.path().display())
        );
    }
}
