//! The kubelet-facing unix sockets: their directories, who owns them, and how they appear and go.
//!
//! Binding a socket at `<dir>/<name>`:
//!
//! 1. Missing directories are created with mode 0750, set explicitly so the umask does not
//!    matter. Existing directories (the kubelet's own) are left as they are.
//! 2. `<dir>/.<name>.lock` is locked with `flock` (exclusive, non-blocking). A second instance
//!    for the same socket fails here, naming the socket, instead of deleting a live socket from
//!    under the first. The lock dies with the process, so a crash never leaves it stuck; the
//!    file itself stays (removing lock files races with the next locker).
//! 3. Holding the lock, a socket left at the path by an earlier run is stale and removed. Any
//!    other kind of file there is refused, never deleted.
//! 4. The listener is bound at the path itself, with its mode set on the socket before the
//!    bind, so the file appears once, under its final name, already 0600. Nothing else appears
//!    in the directory. That matters in the kubelet's registry: its plugin watcher stats every
//!    name that appears there when it gets to the event, and logs an error for one that is
//!    gone by then, dot-file or not, so a temporary name renamed into place costs an
//!    error-level line at every start. Binding elsewhere and renaming the socket in cannot work
//!    where it matters most: the DaemonSet mounts the registry directory alone, so any other
//!    directory is another mount and `rename` fails with `EXDEV`. Between `bind` and `listen`
//!    (the next system call) a connection would be refused; the kubelet's registration dial
//!    blocks and retries a refused connection, and it dials the DRA socket only once the
//!    registration socket, bound after it, has appeared.
//!
//! Removal ([`BoundSocket::remove`], also on drop) deletes the socket only if the file at the path
//! is still the one we bound.

use std::{
    fs::{self, File, OpenOptions},
    io,
    os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt},
    path::{Path, PathBuf},
};

use rustix::fs::{FlockOperation, flock};
use tokio::net::UnixListener;
use tracing::{info, warn};

/// Mode of directories we create.
pub const DIR_MODE: u32 = 0o750;

/// Mode of our sockets: the kubelet runs as root; nobody else needs to connect.
pub const SOCKET_MODE: u32 = 0o600;

/// Why a socket could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum SocketError {
    #[error("socket path {0} has no file name")]
    NoFileName(PathBuf),
    #[error("creating directory {path}")]
    CreateDir {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("locking {path}")]
    Lock {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{socket} is in use by another instance (lock {lock} is held)")]
    InUse { socket: PathBuf, lock: PathBuf },
    #[error("{0} exists and is not a socket; refusing to replace it")]
    NotASocket(PathBuf),
    #[error("removing {path}")]
    Remove {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("binding {path}")]
    Bind {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("setting the mode of {path}")]
    Chmod {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// A socket we bound and own: the lock, and the identity of the file to remove later.
#[derive(Debug)]
pub(crate) struct BoundSocket {
    path: PathBuf,
    /// (device, inode) of the socket file we created.
    identity: (u64, u64),
    /// Held (locked) for as long as we own the socket.
    _lock: File,
    removed: bool,
}

impl BoundSocket {
    /// Sets up and binds a listening socket at `path` (see the module docs for the steps).
    pub(crate) fn bind(path: &Path) -> Result<(Self, UnixListener), SocketError> {
        let name = path
            .file_name()
            .ok_or_else(|| SocketError::NoFileName(path.to_owned()))?
            .to_string_lossy()
            .into_owned();
        let dir = path.parent().unwrap_or(Path::new("."));
        ensure_dir(dir)?;
        let lock_path = dir.join(format!(".{name}.lock"));
        let lock = lock(&lock_path, path)?;
        remove_stale(path)?;
        let listener = bind_listener(path)?;
        // The mode was set before the bind, less the umask; this makes it exact whatever the
        // umask. It changes no name, so the kubelet's watcher sees no event for it.
        fs::set_permissions(path, fs::Permissions::from_mode(SOCKET_MODE)).map_err(|source| {
            SocketError::Chmod {
                path: path.to_owned(),
                source,
            }
        })?;
        let meta = fs::symlink_metadata(path).map_err(|source| SocketError::Bind {
            path: path.to_owned(),
            source,
        })?;
        let socket = Self {
            path: path.to_owned(),
            identity: (meta.dev(), meta.ino()),
            _lock: lock,
            removed: false,
        };
        Ok((socket, listener))
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Removes the socket file if it is still ours. Idempotent.
    pub(crate) fn remove(&mut self) -> Result<(), SocketError> {
        if self.removed {
            return Ok(());
        }
        self.removed = true;
        match fs::symlink_metadata(&self.path) {
            Ok(meta) if (meta.dev(), meta.ino()) == self.identity => fs::remove_file(&self.path)
                .map_err(|source| SocketError::Remove {
                    path: self.path.clone(),
                    source,
                }),
            Ok(_) => {
                warn!(path = %self.path.display(), "our socket was replaced by another file; leaving it");
                Ok(())
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(source) => Err(SocketError::Remove {
                path: self.path.clone(),
                source,
            }),
        }
    }
}

impl Drop for BoundSocket {
    fn drop(&mut self) {
        if let Err(e) = self.remove() {
            warn!(error = %e, "could not remove a socket on drop");
        }
    }
}

/// Creates `dir` and its missing ancestors, each with [`DIR_MODE`].
fn ensure_dir(dir: &Path) -> Result<(), SocketError> {
    let mut missing = Vec::new();
    let mut cur = Some(dir);
    while let Some(d) = cur {
        if d.as_os_str().is_empty() || d.exists() {
            break;
        }
        missing.push(d);
        cur = d.parent();
    }
    for d in missing.into_iter().rev() {
        let created = match fs::create_dir(d) {
            Ok(()) => true,
            // Someone (another instance, the kubelet) created it meanwhile: not ours to chmod.
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => false,
            Err(source) => {
                return Err(SocketError::CreateDir {
                    path: d.to_owned(),
                    source,
                });
            }
        };
        if created {
            fs::set_permissions(d, fs::Permissions::from_mode(DIR_MODE)).map_err(|source| {
                SocketError::Chmod {
                    path: d.to_owned(),
                    source,
                }
            })?;
        }
    }
    Ok(())
}

fn lock(lock_path: &Path, socket: &Path) -> Result<File, SocketError> {
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .mode(0o600)
        .open(lock_path)
        .map_err(|source| SocketError::Lock {
            path: lock_path.to_owned(),
            source,
        })?;
    match flock(&file, FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => Ok(file),
        Err(e) if e == rustix::io::Errno::WOULDBLOCK => Err(SocketError::InUse {
            socket: socket.to_owned(),
            lock: lock_path.to_owned(),
        }),
        Err(e) => Err(SocketError::Lock {
            path: lock_path.to_owned(),
            source: e.into(),
        }),
    }
}

/// Removes a socket a previous run left at `path`; refuses anything that is not a socket.
fn remove_stale(path: &Path) -> Result<(), SocketError> {
    use std::os::unix::fs::FileTypeExt;
    match fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => {
            info!(path = %path.display(), "removing a stale socket left by an earlier run");
            remove_if_present(path)
        }
        Ok(_) => Err(SocketError::NotASocket(path.to_owned())),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(SocketError::Remove {
            path: path.to_owned(),
            source,
        }),
    }
}

fn remove_if_present(path: &Path) -> Result<(), SocketError> {
    match fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(SocketError::Remove {
            path: path.to_owned(),
            source,
        }),
    }
}

/// Listens at `path` with [`SOCKET_MODE`] set on the socket before `bind` creates the file:
/// Linux gives a socket file the socket's own mode, less the umask.
fn bind_listener(path: &Path) -> Result<UnixListener, SocketError> {
    use rustix::net::{AddressFamily, SocketAddrUnix, SocketFlags, SocketType};
    let bind_error = |source: io::Error| SocketError::Bind {
        path: path.to_owned(),
        source,
    };
    let socket = rustix::net::socket_with(
        AddressFamily::UNIX,
        SocketType::STREAM,
        SocketFlags::CLOEXEC | SocketFlags::NONBLOCK,
        None,
    )
    .map_err(|e| bind_error(e.into()))?;
    rustix::fs::fchmod(&socket, rustix::fs::Mode::from_raw_mode(SOCKET_MODE)).map_err(|e| {
        SocketError::Chmod {
            path: path.to_owned(),
            source: e.into(),
        }
    })?;
    let address = SocketAddrUnix::new(path).map_err(|e| bind_error(e.into()))?;
    rustix::net::bind(&socket, &address).map_err(|e| bind_error(e.into()))?;
    rustix::net::listen(&socket, LISTEN_BACKLOG).map_err(|e| bind_error(e.into()))?;
    UnixListener::from_std(std::os::unix::net::UnixListener::from(socket)).map_err(bind_error)
}

/// Connections the kernel queues before we accept them (std's own listeners use the same).
const LISTEN_BACKLOG: i32 = 128;

#[cfg(test)]
mod tests {
    use std::os::unix::fs::FileTypeExt;

    use super::*;

    #[tokio::test]
    async fn a_socket_is_0600_from_the_moment_it_is_bound_and_answers() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.sock");
        let listener = bind_listener(&path).unwrap();
        let meta = fs::symlink_metadata(&path).unwrap();
        assert!(meta.file_type().is_socket());
        assert_eq!(meta.permissions().mode() & 0o777, SOCKET_MODE);
        let client = tokio::net::UnixStream::connect(&path);
        let (accepted, connected) = tokio::join!(listener.accept(), client);
        accepted.unwrap();
        connected.unwrap();
    }
}
