//! The cache the Go builds of the e2e go to, outside the repository:
//! `${XDG_CACHE_HOME:-~/.cache}/resmgr/<what>/<key>/`, each entry keyed by everything that goes
//! into it and built in a temporary directory next to its final place, then renamed in, so that
//! concurrent runs never see half a build.

use std::path::{Path, PathBuf};

use anyhow::Context as _;

/// `${XDG_CACHE_HOME:-$HOME/.cache}/resmgr`.
pub fn cache_root() -> anyhow::Result<PathBuf> {
    if let Some(dir) = std::env::var_os("XDG_CACHE_HOME").filter(|d| !d.is_empty()) {
        return Ok(PathBuf::from(dir).join("resmgr"));
    }
    let home = std::env::var_os("HOME").context("neither XDG_CACHE_HOME nor HOME is set")?;
    Ok(PathBuf::from(home).join(".cache/resmgr"))
}

/// Removes build directories a run left behind when it ended during a build (a failing
/// `cargo xtask test` does not wait for its background build); an hour is far longer than a
/// build takes, so a build in progress is never among them.
pub fn remove_abandoned(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let old = entry
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age.as_secs() > 3600);
        if old
            && entry
                .file_name()
                .to_string_lossy()
                .starts_with(".building-")
        {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}
