//! Durable file replacement: the one way the agent writes a file it relies on after a crash.
//!
//! [`replace`] writes `<dir>/<name>` so that a reader, or a crash at any instant, sees the old
//! contents or the new ones, never a mix, and so that the new contents survive a crash once it
//! returns: a temporary file in the same directory, named `.<name>.<random>.tmp`, is given its
//! mode, written, fsynced, renamed over the target, and the directory fsynced (the rename itself
//! is only durable once the directory is). A failure before the rename removes the temporary file
//! and leaves the target untouched. A crash can leave a temporary file behind; it never ends in
//! the target's extension (so the runtimes' CDI scanners, which read `*.json` and `*.yaml`, ignore
//! it), and [`remove_temporary_files`] deletes such files at start-up. [`create_dir`] creates a
//! directory durably, for the first write into it.
//!
//! The temporary name is random (the `tempfile` crate) rather than fixed: a fixed name is shared
//! by every writer of the same target, and a file or directory left at it blocks every later
//! write until someone removes it.
//!
//! # Why it lives in `cdi`
//!
//! Two crates write files that must survive a crash: this one (the claims' CDI specs) and
//! `resmgr` (its state file). `resmgr` depends on `cdi`, and `cdi` on no crate of ours, so this
//! is the lowest crate both can reach without a new edge in the layering; a crate of its own for
//! these hundred lines would add a crate and two edges. Nothing here knows what it writes.

use std::{
    fs::{self, DirBuilder, File, Permissions},
    io::{self, Write},
    os::unix::fs::{DirBuilderExt, PermissionsExt},
    path::{Path, PathBuf},
};

/// The suffix of every temporary file [`replace`] creates.
pub const TEMP_SUFFIX: &str = ".tmp";

/// Random characters in a temporary file's name: `.<name>.` + these + [`TEMP_SUFFIX`].
pub const TEMP_RAND_LEN: usize = 6;

/// A step of a durable write failed. Before the rename, the target is untouched and the
/// temporary file removed; when syncing the directory fails, the new contents are in place but
/// may not survive a crash.
#[derive(Debug, thiserror::Error)]
#[error("{step} {path}")]
pub struct WriteError {
    /// What was being done, such as `renaming a temporary file onto`.
    pub step: &'static str,
    /// On what.
    pub path: PathBuf,
    /// The OS error.
    #[source]
    pub source: io::Error,
}

impl WriteError {
    fn new(step: &'static str, path: &Path, source: io::Error) -> Self {
        Self {
            step,
            path: path.to_path_buf(),
            source,
        }
    }
}

/// Replaces `<dir>/<name>` with `data`, atomically and durably, the file getting `mode`. The
/// directory must exist (see [`create_dir`]).
pub fn replace(dir: &Path, name: &str, data: &[u8], mode: u32) -> Result<(), WriteError> {
    let target = dir.join(name);
    let mut tmp = tempfile::Builder::new()
        .prefix(&temporary_prefix(name))
        .suffix(TEMP_SUFFIX)
        .rand_bytes(TEMP_RAND_LEN)
        .tempfile_in(dir)
        .map_err(|source| WriteError::new("creating a temporary file in", dir, source))?;
    // Dropping `tmp` before `persist` deletes the temporary file, so every early return below
    // cleans up after itself.
    let tmp_path = tmp.path().to_path_buf();
    let tmp_path = tmp_path.as_path();
    let at = |step| move |source| WriteError::new(step, tmp_path, source);
    tmp.as_file()
        .set_permissions(Permissions::from_mode(mode))
        .map_err(at("setting the mode of"))?;
    tmp.write_all(data).map_err(at("writing"))?;
    tmp.as_file().sync_all().map_err(at("syncing"))?;
    tmp.persist(&target).map_err(|e| {
        // `persist` hands the file back on failure; dropping it removes the temporary file.
        WriteError::new("renaming a temporary file onto", &target, e.error)
    })?;
    sync_dir(dir)
}

/// Creates `dir` with `mode` if it is missing, with any missing parents, durably: the parent of
/// every directory created is fsynced, so the new entries survive a crash with the files written
/// into them.
pub fn create_dir(dir: &Path, mode: u32) -> Result<(), WriteError> {
    if dir.is_dir() {
        return Ok(());
    }
    let missing: Vec<&Path> = dir
        .ancestors()
        .take_while(|a| !a.as_os_str().is_empty() && !a.exists())
        .collect();
    DirBuilder::new()
        .recursive(true)
        .mode(mode)
        .create(dir)
        .map_err(|source| WriteError::new("creating directory", dir, source))?;
    for created in missing.iter().rev() {
        if let Some(parent) = created.parent().filter(|p| !p.as_os_str().is_empty()) {
            sync_dir(parent)?;
        }
    }
    Ok(())
}

/// Fsyncs a directory, making the creations, renames and removals of its entries durable.
pub fn sync_dir(dir: &Path) -> Result<(), WriteError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|source| WriteError::new("syncing directory", dir, source))
}

/// Whether `file_name` is a temporary file of [`replace`] for a target whose name starts with
/// `target_prefix` (the whole name for one file, such as `state.json`; a common prefix for a
/// family of files).
pub fn is_temporary_file(file_name: &str, target_prefix: &str) -> bool {
    file_name
        .strip_prefix('.')
        .is_some_and(|rest| rest.starts_with(target_prefix))
        && file_name.ends_with(TEMP_SUFFIX)
}

/// Deletes the temporary files crashed writes left in `dir` for targets whose names start with
/// `target_prefix` (see [`is_temporary_file`]) and returns how many. Call it only when no write
/// is in flight (at start-up): a live write's temporary file looks the same. A missing directory
/// has none.
pub fn remove_temporary_files(dir: &Path, target_prefix: &str) -> Result<usize, WriteError> {
    let listing = |source| WriteError::new("listing directory", dir, source);
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(0),
        Err(source) => return Err(listing(source)),
    };
    let mut removed = 0;
    for entry in entries {
        let entry = entry.map_err(listing)?;
        // Names that are not UTF-8 are never ours.
        let Ok(name) = entry.file_name().into_string() else {
            continue;
        };
        if !is_temporary_file(&name, target_prefix) {
            continue;
        }
        let path = entry.path();
        let is_dir = entry
            .file_type()
            .map_err(|source| WriteError::new("inspecting", &path, source))?
            .is_dir();
        if is_dir {
            continue;
        }
        match fs::remove_file(&path) {
            Ok(()) => removed += 1,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(source) => return Err(WriteError::new("removing temporary file", &path, source)),
        }
    }
    if removed > 0 {
        sync_dir(dir)?;
    }
    Ok(removed)
}

/// `.<name>.`: how every temporary file of target `name` begins.
fn temporary_prefix(name: &str) -> String {
    format!(".{name}.")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn replaces_the_file_with_its_mode_and_leaves_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        replace(dir.path(), "a.json", b"one", 0o640).unwrap();
        replace(dir.path(), "a.json", b"two", 0o640).unwrap();
        assert_eq!(fs::read(dir.path().join("a.json")).unwrap(), b"two");
        let mode = fs::metadata(dir.path().join("a.json"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o640);
        assert_eq!(names(dir.path()), ["a.json"]);
    }

    #[test]
    fn a_failed_rename_leaves_the_target_and_no_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        // A non-empty directory at the target: every step up to the rename succeeds.
        fs::create_dir_all(dir.path().join("a.json/x")).unwrap();
        let err = replace(dir.path(), "a.json", b"new", 0o644).unwrap_err();
        assert_eq!(err.step, "renaming a temporary file onto");
        assert_eq!(err.path, dir.path().join("a.json"));
        assert_eq!(names(dir.path()), ["a.json"]);
        assert!(dir.path().join("a.json/x").is_dir());
    }

    #[test]
    fn temporary_files_never_end_in_the_targets_extension() {
        let dir = tempfile::tempdir().unwrap();
        let tmp = tempfile::Builder::new()
            .prefix(&temporary_prefix("a.json"))
            .suffix(TEMP_SUFFIX)
            .rand_bytes(TEMP_RAND_LEN)
            .tempfile_in(dir.path())
            .unwrap();
        let name = tmp.path().file_name().unwrap().to_str().unwrap().to_owned();
        assert!(
            name.starts_with(".a.json.") && name.ends_with(".tmp"),
            "{name}"
        );
        assert!(is_temporary_file(&name, "a.json"));
        assert!(is_temporary_file(&name, "a."));
        assert!(!is_temporary_file(&name, "b"));
    }

    #[test]
    fn removes_only_temporary_files_of_the_targets_named() {
        let dir = tempfile::tempdir().unwrap();
        for name in [
            "state.json",
            ".state.json.tmp",
            ".state.json.x1y2z3.tmp",
            ".other.json.x1y2z3.tmp",
            "state.json.tmp",
        ] {
            fs::write(dir.path().join(name), b"").unwrap();
        }
        fs::create_dir(dir.path().join(".state.json.dir.tmp")).unwrap();
        assert_eq!(remove_temporary_files(dir.path(), "state.json").unwrap(), 2);
        assert_eq!(
            names(dir.path()),
            [
                ".other.json.x1y2z3.tmp",
                ".state.json.dir.tmp",
                "state.json",
                "state.json.tmp"
            ]
        );
        let missing = dir.path().join("missing");
        assert_eq!(remove_temporary_files(&missing, "state.json").unwrap(), 0);
    }

    #[test]
    fn creates_missing_directories_and_refuses_a_file_in_the_way() {
        let dir = tempfile::tempdir().unwrap();
        let deep = dir.path().join("a/b/c");
        create_dir(&deep, 0o755).unwrap();
        assert!(deep.is_dir());
        create_dir(&deep, 0o755).unwrap();
        fs::write(dir.path().join("file"), b"").unwrap();
        let err = create_dir(&dir.path().join("file"), 0o755).unwrap_err();
        assert_eq!(err.step, "creating directory");
    }
}
