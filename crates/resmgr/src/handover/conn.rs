//! One end of the handover exchange: lines of JSON over the handover socket, and the file
//! descriptors that travel with them.
//!
//! The state directory's lock passes from the owner to its successor as a descriptor attached to
//! the `released` message (`SCM_RIGHTS`): a `flock` belongs to the open file description, so the
//! lock stays held from the moment the owner took it until the successor lets it go, and no
//! third agent polling the lock can find it free in between. Descriptors are read with every
//! message (`recvmsg`, close-on-exec) and handed out with the line they came with; a message that
//! should carry none drops what came with it, which closes it.

use std::{
    io::{self, IoSlice, IoSliceMut},
    mem::MaybeUninit,
    os::fd::{AsFd, BorrowedFd, OwnedFd},
    time::Duration,
};

use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags, recvmsg, sendmsg,
};
use tokio::{io::Interest, net::UnixStream, time::timeout};

use super::{HandoverError, MAX_MESSAGE, Message};

/// The most descriptors one read takes: the exchange passes one; more are a peer's mistake, and
/// the kernel closes what does not fit.
const MAX_FDS: usize = 4;

/// How much one read takes.
const READ_CHUNK: usize = 4096;

/// One end of the exchange: a line of JSON each way at a time, with descriptors.
#[derive(Debug)]
pub(super) struct Conn {
    stream: UnixStream,
    /// Bytes read and not yet returned as a message.
    buffered: Vec<u8>,
    /// Descriptors read with them.
    fds: Vec<OwnedFd>,
}

impl Conn {
    pub(super) fn new(stream: UnixStream) -> Self {
        Self {
            stream,
            buffered: Vec::new(),
            fds: Vec::new(),
        }
    }

    /// Sends `message`, with `fd` attached when there is one.
    pub(super) async fn send(
        &mut self,
        message: &Message,
        fd: Option<BorrowedFd<'_>>,
    ) -> Result<(), HandoverError> {
        let mut line = serde_json::to_vec(message).map_err(|e| HandoverError::Io(e.into()))?;
        line.push(b'\n');
        let mut sent = 0;
        let mut fd = fd;
        while sent < line.len() {
            self.stream.writable().await.map_err(HandoverError::Io)?;
            let rest = &line[sent..];
            match self
                .stream
                .try_io(Interest::WRITABLE, || send_some(&self.stream, rest, fd))
            {
                Ok(n) => {
                    sent += n;
                    // The descriptor went with the first bytes.
                    fd = None;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(HandoverError::Io(e)),
            }
        }
        Ok(())
    }

    /// The next message and the descriptors that came with it, waiting at most `within`.
    pub(super) async fn recv(
        &mut self,
        within: Duration,
    ) -> Result<(Message, Vec<OwnedFd>), HandoverError> {
        match timeout(within, self.read_line()).await {
            Ok(message) => message,
            Err(_) => Err(HandoverError::Timeout(within)),
        }
    }

    /// The next message, dropping any descriptor that came with it.
    pub(super) async fn recv_plain(&mut self, within: Duration) -> Result<Message, HandoverError> {
        self.recv(within).await.map(|(message, _fds)| message)
    }

    async fn read_line(&mut self) -> Result<(Message, Vec<OwnedFd>), HandoverError> {
        loop {
            if let Some(end) = self.buffered.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = self.buffered.drain(..=end).collect();
                let fds = std::mem::take(&mut self.fds);
                let line = &line[..end];
                let message =
                    serde_json::from_slice(line).map_err(|source| HandoverError::Malformed {
                        line: String::from_utf8_lossy(line).chars().take(200).collect(),
                        source,
                    })?;
                return Ok((message, fds));
            }
            if self.buffered.len() > MAX_MESSAGE {
                return Err(HandoverError::TooLong);
            }
            self.stream.readable().await.map_err(HandoverError::Io)?;
            let mut chunk = [0u8; READ_CHUNK];
            let read = self.stream.try_io(Interest::READABLE, || {
                recv_some(&self.stream, &mut chunk, &mut self.fds)
            });
            match read {
                Ok(0) => return Err(HandoverError::Closed),
                Ok(n) => self.buffered.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(HandoverError::Io(e)),
            }
        }
    }
}

/// One `sendmsg` of `bytes`, with `fd` attached.
fn send_some(stream: &UnixStream, bytes: &[u8], fd: Option<BorrowedFd<'_>>) -> io::Result<usize> {
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    let fds;
    if let Some(fd) = fd {
        fds = [fd];
        if !control.push(SendAncillaryMessage::ScmRights(&fds)) {
            return Err(io::Error::other("no room for the descriptor"));
        }
    }
    // No SIGPIPE when the other side is gone: EPIPE, which the caller reports.
    Ok(sendmsg(
        stream.as_fd(),
        &[IoSlice::new(bytes)],
        &mut control,
        SendFlags::NOSIGNAL | SendFlags::DONTWAIT,
    )?)
}

/// One `recvmsg` into `chunk`, keeping the descriptors that came with it in `fds`.
fn recv_some(stream: &UnixStream, chunk: &mut [u8], fds: &mut Vec<OwnedFd>) -> io::Result<usize> {
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let received = recvmsg(
        stream.as_fd(),
        &mut [IoSliceMut::new(chunk)],
        &mut control,
        RecvFlags::CMSG_CLOEXEC | RecvFlags::DONTWAIT,
    )?;
    for message in control.drain() {
        if let RecvAncillaryMessage::ScmRights(received) = message {
            fds.extend(received);
        }
    }
    Ok(received.bytes)
}
