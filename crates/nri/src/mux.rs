//! The connection multiplexer: one trunk (the unix socket) carrying logical connections.
//!
//! Owns the two tasks that touch the trunk. The reader decodes frames and hands each payload to
//! its logical connection's channel (frames for connections nobody opened are dropped, as Go does).
//! The writer is the only task that writes, so a frame is always written whole; it writes the
//! frames of one message back to back, one transport write per frame, and reports when a
//! message's last byte has been handed to the socket (the Synchronize notification needs that).
//! Any trunk error, EOF or a local close ends both tasks; the reason is published once.

use std::{collections::HashMap, io, sync::Arc};

use bytes::{Bytes, BytesMut};
use tokio::{
    io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt},
    sync::{mpsc, oneshot, watch},
};

use crate::wire::{MuxDecoder, WireError};

/// Why the connection to the runtime ended. The cause of a failure is its `source()`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Disconnect {
    /// The runtime closed the socket: it exited, or it dropped this plugin.
    #[error("the runtime closed the connection")]
    Eof,
    /// Reading from the socket failed.
    #[error("reading from the runtime connection failed")]
    ReadFailed(#[source] SharedIoError),
    /// Writing to the socket failed.
    #[error("writing to the runtime connection failed")]
    WriteFailed(#[source] SharedIoError),
    /// The runtime sent bytes that are not NRI.
    #[error("protocol error on the runtime connection")]
    Protocol(#[source] WireError),
    /// We closed the connection ourselves.
    #[error("the connection was closed by the plugin")]
    ClosedLocally,
}

/// An IO error that ended the connection, shared: everyone waiting on the connection gets the
/// same [`Disconnect`], so it is `Clone`. Two are equal when they are the same error or say the
/// same (kind, OS error and text).
#[derive(Debug, Clone, thiserror::Error)]
#[error(transparent)]
pub struct SharedIoError(Arc<io::Error>);

impl SharedIoError {
    /// The IO error.
    pub fn get(&self) -> &io::Error {
        &self.0
    }
}

impl From<io::Error> for SharedIoError {
    fn from(e: io::Error) -> Self {
        Self(Arc::new(e))
    }
}

impl PartialEq for SharedIoError {
    fn eq(&self, other: &Self) -> bool {
        let (a, b) = (&*self.0, &*other.0);
        Arc::ptr_eq(&self.0, &other.0)
            || (a.kind() == b.kind()
                && a.raw_os_error() == b.raw_os_error()
                && a.to_string() == b.to_string())
    }
}

impl Eq for SharedIoError {}

/// How many payloads may wait for a logical connection's reader before the trunk reader pauses.
const INBOUND_QUEUE: usize = 64;
/// Read granularity on the trunk.
const READ_CHUNK: usize = 64 * 1024;

/// One ttrpc message's frames, and who to tell once they are written.
#[derive(Debug)]
pub(crate) struct Outgoing {
    pub frames: Vec<Bytes>,
    pub written: Option<oneshot::Sender<()>>,
}

/// Queues messages for the trunk writer. Cheap to clone.
#[derive(Debug, Clone)]
pub(crate) struct MuxWriter {
    tx: mpsc::UnboundedSender<Outgoing>,
}

impl MuxWriter {
    /// Queues a message; fails only when the mux has shut down.
    pub fn send(&self, out: Outgoing) -> Result<(), Disconnected> {
        self.tx.send(out).map_err(|_| Disconnected)
    }
}

/// The mux is gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Disconnected;

/// Watches for, and triggers, the end of the trunk.
#[derive(Debug, Clone)]
pub(crate) struct Closer {
    state: Arc<watch::Sender<Option<Disconnect>>>,
}

impl Closer {
    /// Records why the trunk ended; the first reason wins.
    pub fn close(&self, why: Disconnect) {
        self.state.send_if_modified(|s| {
            if s.is_some() {
                return false;
            }
            *s = Some(why);
            true
        });
    }

    /// Resolves with the reason once the trunk has ended.
    pub async fn closed(&self) -> Disconnect {
        let mut rx = self.state.subscribe();
        match rx.wait_for(Option::is_some).await {
            Ok(s) => s.clone().unwrap_or(Disconnect::ClosedLocally),
            // The sender lives in `self`, so it cannot be dropped while we wait.
            Err(_) => Disconnect::ClosedLocally,
        }
    }
}

/// A running multiplexer: the writer, the inbound channels of the opened connections, and the closer.
#[derive(Debug)]
pub(crate) struct Mux {
    pub writer: MuxWriter,
    pub inbound: HashMap<u32, mpsc::Receiver<Bytes>>,
    pub closer: Closer,
}

/// Starts the reader and writer tasks on `trunk`, with logical connections `conns` open.
pub(crate) fn start<T>(trunk: T, conns: &[u32]) -> Mux
where
    T: AsyncRead + AsyncWrite + Send + 'static,
{
    let (read, write) = tokio::io::split(trunk);
    let closer = Closer {
        state: Arc::new(watch::channel(None).0),
    };
    let mut senders = HashMap::new();
    let mut inbound = HashMap::new();
    for &conn in conns {
        let (tx, rx) = mpsc::channel(INBOUND_QUEUE);
        senders.insert(conn, tx);
        inbound.insert(conn, rx);
    }
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(read_loop(read, senders, closer.clone()));
    tokio::spawn(write_loop(write, rx, closer.clone()));
    Mux {
        writer: MuxWriter { tx },
        inbound,
        closer,
    }
}

async fn read_loop<R: AsyncRead + Unpin>(
    mut read: R,
    senders: HashMap<u32, mpsc::Sender<Bytes>>,
    closer: Closer,
) {
    let why = tokio::select! {
        why = read_frames(&mut read, &senders) => why,
        why = closer.closed() => why,
    };
    tracing::debug!(
        reason = &why as &dyn std::error::Error,
        "nri mux reader stopped"
    );
    closer.close(why);
    // Dropping `senders` ends every logical connection's inbound stream.
}

async fn read_frames<R: AsyncRead + Unpin>(
    read: &mut R,
    senders: &HashMap<u32, mpsc::Sender<Bytes>>,
) -> Disconnect {
    let mut decoder = MuxDecoder;
    let mut buf = BytesMut::with_capacity(READ_CHUNK);
    loop {
        loop {
            match decoder.decode(&mut buf) {
                Ok(Some(frame)) => match senders.get(&frame.conn) {
                    Some(tx) => {
                        if tx.send(frame.payload).await.is_err() {
                            tracing::debug!(conn = frame.conn, "dropping frame: reader is gone");
                        }
                    }
                    None => {
                        tracing::debug!(conn = frame.conn, "dropping frame for a closed connection")
                    }
                },
                Ok(None) => break,
                Err(e) => return Disconnect::Protocol(e),
            }
        }
        buf.reserve(READ_CHUNK);
        match read.read_buf(&mut buf).await {
            Ok(0) => return Disconnect::Eof,
            Ok(_) => {}
            Err(e) => return Disconnect::ReadFailed(e.into()),
        }
    }
}

async fn write_loop<W: AsyncWrite + Unpin>(
    mut write: W,
    mut rx: mpsc::UnboundedReceiver<Outgoing>,
    closer: Closer,
) {
    let why = tokio::select! {
        why = write_frames(&mut write, &mut rx) => why,
        why = closer.closed() => why,
    };
    tracing::debug!(
        reason = &why as &dyn std::error::Error,
        "nri mux writer stopped"
    );
    closer.close(why);
    let _ = write.shutdown().await;
}

async fn write_frames<W: AsyncWrite + Unpin>(
    write: &mut W,
    rx: &mut mpsc::UnboundedReceiver<Outgoing>,
) -> Disconnect {
    while let Some(out) = rx.recv().await {
        for frame in &out.frames {
            // One frame per write, flushed at once: the peer must see the frame boundaries we
            // chose (reference §2.4, rule 5).
            if let Err(e) = write.write_all(frame).await {
                return Disconnect::WriteFailed(e.into());
            }
            if let Err(e) = write.flush().await {
                return Disconnect::WriteFailed(e.into());
            }
        }
        if let Some(done) = out.written {
            let _ = done.send(());
        }
    }
    // Every writer handle is gone: nobody can talk to the runtime any more.
    Disconnect::ClosedLocally
}
