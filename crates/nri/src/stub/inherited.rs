//! The socket a runtime hands a pre-launched plugin: `NRI_PLUGIN_SOCKET` names a descriptor the
//! process inherited (one end of a socketpair the runtime made), which the plugin takes once, at
//! start-up, and owns from then on.
//!
//! Turning a number into an [`OwnedFd`] is what std makes unsafe: the `OwnedFd` closes the
//! descriptor when it is dropped, so a number naming a descriptor that something else owns (`0`,
//! or the same number taken twice) would close it under its owner. [`take_plugin_socket`] is
//! therefore an `unsafe fn`, for the one place a binary reads its environment; everything below
//! it takes the `OwnedFd` ([`super::Endpoint::Inherited`]). Before it adopts a descriptor it
//! refuses what it can tell is wrong: a value that is no descriptor number, the standard
//! streams, a descriptor that is not an open socket, and any call after the first that
//! succeeded.

use std::{
    ffi::OsStr,
    io,
    mem::MaybeUninit,
    os::fd::{FromRawFd, OwnedFd, RawFd},
    sync::atomic::{AtomicBool, Ordering},
};

use super::StubError;

/// Whether this process has taken the runtime's socket.
static TAKEN: AtomicBool = AtomicBool::new(false);

/// Takes ownership of the descriptor `value` (the value of `NRI_PLUGIN_SOCKET`) names, for
/// [`super::Endpoint::Inherited`].
///
/// Refuses, adopting nothing: a value that is not a descriptor number
/// ([`StubError::InvalidSocketFd`]), 0, 1 and 2 ([`StubError::StandardStreamFd`]), a number that
/// is not open ([`StubError::InheritedSocket`]) or not a socket ([`StubError::NotASocket`]),
/// and every call once one has succeeded in this process ([`StubError::SocketFdTaken`]), so the
/// same descriptor is never handed out twice.
///
/// # Safety
///
/// If this call takes the descriptor, nothing else in the process may own or use it: `value`
/// must be what the runtime set in this process's environment, read before anything could
/// have closed that descriptor and had its number reused (at start-up). The checks above catch
/// the mistakes that can be seen from the number; they cannot tell the runtime's socket from
/// another socket of the process.
#[allow(
    unsafe_code,
    reason = "adopting an inherited descriptor by number is unsafe"
)]
pub unsafe fn take_plugin_socket(value: &OsStr) -> Result<OwnedFd, StubError> {
    let text = value.to_string_lossy();
    let fd: RawFd = text
        .trim()
        .parse()
        .ok()
        .filter(|&fd| fd >= 0)
        .ok_or_else(|| StubError::InvalidSocketFd {
            value: text.clone().into_owned(),
        })?;
    if fd <= 2 {
        return Err(StubError::StandardStreamFd { fd });
    }
    if TAKEN.load(Ordering::SeqCst) {
        return Err(StubError::SocketFdTaken { fd });
    }
    if !is_socket(fd).map_err(|source| StubError::InheritedSocket { fd, source })? {
        return Err(StubError::NotASocket { fd });
    }
    // Of two racing calls, one takes it.
    if TAKEN.swap(true, Ordering::SeqCst) {
        return Err(StubError::SocketFdTaken { fd });
    }
    // SAFETY: `fd` is an open socket (checked above), and the caller guarantees that a
    // descriptor this call takes is owned and used by nothing else; this is the only call in
    // the process that takes one (`TAKEN`), so no second `OwnedFd` of it exists.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Whether `fd` is a socket; an error (EBADF) if it is not open. Touches nothing of the
/// descriptor: `fstat` only looks the number up.
#[allow(
    unsafe_code,
    reason = "fstat of a raw descriptor number, which rustix does not offer"
)]
fn is_socket(fd: RawFd) -> io::Result<bool> {
    let mut stat = MaybeUninit::<libc::stat>::uninit();
    // SAFETY: fstat writes one `struct stat` through the pointer, which points to room for one;
    // any number is a valid argument (one that is not open fails with EBADF).
    if unsafe { libc::fstat(fd, stat.as_mut_ptr()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fstat succeeded, so it filled `stat`.
    let mode = unsafe { stat.assume_init() }.st_mode;
    Ok(mode & libc::S_IFMT == libc::S_IFSOCK)
}

#[cfg(test)]
mod tests {
    use std::{
        io::{Read as _, Write as _},
        os::{
            fd::{AsRawFd as _, IntoRawFd as _},
            unix::net::UnixStream,
        },
    };

    use super::*;

    /// Every refusal, then the one take, then a second take refused, in one test: the guard is
    /// the process's, and no other test takes a socket.
    #[test]
    #[allow(unsafe_code, reason = "the function under test is unsafe")]
    fn the_socket_is_taken_once_and_nothing_else_is_adopted() {
        let take = |value: &str| {
            // SAFETY: every value here either names no open socket (refused before anything is
            // adopted) or, once, a socketpair end whose ownership this test gave up.
            unsafe { take_plugin_socket(OsStr::new(value)) }
        };
        for value in ["three", "-1", "", "3.0"] {
            assert!(
                matches!(take(value), Err(StubError::InvalidSocketFd { .. })),
                "{value}"
            );
        }
        for fd in 0..=2 {
            assert!(
                matches!(take(&fd.to_string()), Err(StubError::StandardStreamFd { fd: f }) if f == fd),
                "{fd}"
            );
        }
        // No process has this many descriptors open.
        let closed = RawFd::MAX.to_string();
        let err = take(&closed).unwrap_err();
        match &err {
            StubError::InheritedSocket { source, .. } => {
                assert_eq!(source.raw_os_error(), Some(libc::EBADF), "{err}");
            }
            other => panic!("{other:?}"),
        }
        // An open descriptor that is no socket stays its owner's.
        let mut file = tempfile::tempfile().unwrap();
        let err = take(&file.as_raw_fd().to_string()).unwrap_err();
        assert!(matches!(err, StubError::NotASocket { .. }), "{err:?}");
        file.write_all(b"still open").unwrap();

        let (ours, mut theirs) = UnixStream::pair().unwrap();
        let raw = ours.into_raw_fd();
        let taken = take(&raw.to_string()).unwrap();
        assert_eq!(taken.as_raw_fd(), raw);
        // The same number again, and any other socket, are refused.
        let err = take(&raw.to_string()).unwrap_err();
        assert!(
            matches!(err, StubError::SocketFdTaken { fd } if fd == raw),
            "{err:?}"
        );
        let (other, _peer) = UnixStream::pair().unwrap();
        let err = take(&other.as_raw_fd().to_string()).unwrap_err();
        assert!(matches!(err, StubError::SocketFdTaken { .. }), "{err:?}");
        // What was taken is the socket, and the refused one is still its owner's.
        UnixStream::from(taken).write_all(b"hi").unwrap();
        let mut got = [0; 2];
        theirs.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"hi");
        (&other).write_all(b"still open").unwrap();
    }
}
