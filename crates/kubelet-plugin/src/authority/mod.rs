//! Making our HTTP/2 servers answer requests whose `:authority` is a socket path.
//!
//! # The problem
//!
//! When grpc-go (1.57 and later) dials a unix socket by its bare path through a custom dialer,
//! which is how the kubelet's plugin watcher dials every registration socket (and how 1.32/1.33
//! kubelets dial the DRA socket), it sends the percent-encoded path as the request's
//! `:authority`, e.g. `%2Fvar%2Flib%2Fkubelet%2Fplugins_registry%2Fx-reg.sock`. The `http` crate
//! accepts `%` in an authority only inside userinfo or an IPv6 zone, so h2, the HTTP/2
//! implementation under hyper and tonic, answers every such request with
//! `RST_STREAM(PROTOCOL_ERROR)` before tonic sees it. The kubelet logs
//! `RST_STREAM error code 1` and the plugin is never registered. h2 has no setting to relax this
//! (checked up to h2 0.4.20, hyper 1.12, tonic 0.14.5; hyperium/h2 PR #487 has proposed one
//! since 2020), and we cannot change what the kubelet sends.
//!
//! # The choice
//!
//! A small layer sits between each accepted unix stream and the HTTP/2 server
//! ([`RewritingStream`]). Server-to-client bytes pass untouched. Client-to-server bytes go
//! through [`frames::AuthorityRewriter`], which passes every frame through unchanged except header
//! blocks: those it decodes ([`hpack`]), replaces an `:authority` that h2 would reject by
//! `localhost`, and re-encodes. Routing is by `:path` alone, so nothing of value is lost.
//!
//! Alternatives considered, and why not:
//!
//! - *A setting in h2, hyper or tonic*: there is none.
//! - *A patched or vendored h2*: the project takes no copied or patched third-party source, and a
//!   fork would have to be kept in step with h2's security fixes.
//! - *Rewriting the bytes without decoding HPACK*: grpc-go adds `:authority` to the HPACK dynamic
//!   table on the first request and sends only an index afterwards, and a Huffman-coded value
//!   cannot be recognised or replaced in place; the header blocks of a connection are not
//!   independent, so the rewrite must track the client's table.
//! - *Advertising a zero-size header table so the client stops indexing*: the client may send
//!   requests before it has seen our SETTINGS, and those may use the table, so a decoder is still
//!   needed; it saves nothing.
//! - *An HPACK crate*: none is well kept and exposes a decoder (h2 keeps its own private); the
//!   published ones are old forks. The decoder needed is small (integers, strings, a static and a
//!   dynamic table, a canonical Huffman code) and is tested against the RFC's own examples, so we
//!   keep our own.
//!
//! The re-encoding never uses the dynamic table, so the h2 server's decoder state stays empty and
//! the only HPACK state that matters is the client's, mirrored by our decoder. That is what makes
//! the layer easy to get right: per connection it keeps one decoder and at most one unfinished
//! header block.
//!
//! # What it relies on
//!
//! The layer enforces the server's own HTTP/2 limits, so it must know them: [`server_limits`]
//! derives them from the constants the servers are configured with
//! (`SETTINGS_MAX_FRAME_SIZE`, `SETTINGS_MAX_HEADER_LIST_SIZE`) and from h2's default
//! `SETTINGS_HEADER_TABLE_SIZE` of 4096, which tonic does not let us change.
//!
//! When h2 one day accepts such authorities, the Go conformance test that checks a stock tonic
//! server still resets these streams fails, and this module can go.

pub(crate) mod frames;
pub mod fuzzing;
pub(crate) mod hpack;
mod huffman;

use std::{
    io,
    pin::Pin,
    task::{Context, Poll, ready},
};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tonic::transport::server::Connected;
use tracing::{debug, warn};

use self::frames::{AuthorityRewriter, Limits};

/// `SETTINGS_MAX_FRAME_SIZE` of our servers: the protocol's default and minimum.
pub(crate) const MAX_FRAME_SIZE: u32 = 16_384;

/// `SETTINGS_MAX_HEADER_LIST_SIZE` of our servers (hyper's default, set explicitly so the
/// rewriter's bound below is known to be larger). The kubelet's requests carry a few hundred
/// bytes of headers.
pub(crate) const MAX_HEADER_LIST_SIZE: u32 = 16 * 1024;

/// h2's `SETTINGS_HEADER_TABLE_SIZE`, which tonic leaves at the protocol default.
const HEADER_TABLE_SIZE: usize = 4096;

/// The limits the rewriter enforces in front of one of our servers. Header lists between the
/// server's limit and ours reach the server, which refuses them the way it always does; only
/// larger ones (which no client may send) end the connection here.
pub(crate) fn server_limits() -> Limits {
    Limits {
        max_frame_size: MAX_FRAME_SIZE as usize,
        header_table_size: HEADER_TABLE_SIZE,
        max_block_size: 4 * MAX_HEADER_LIST_SIZE as usize,
        max_list_size: 4 * MAX_HEADER_LIST_SIZE as usize,
    }
}

/// An accepted connection whose client-to-server bytes go through an [`AuthorityRewriter`].
#[derive(Debug)]
pub(crate) struct RewritingStream<S> {
    inner: S,
    rewriter: AuthorityRewriter,
    scratch: Box<[u8]>,
    read: ReadState,
}

#[derive(Debug)]
enum ReadState {
    Open,
    Eof,
    /// The client broke HTTP/2 framing; the message is returned as the read error.
    Failed(String),
}

impl<S> RewritingStream<S> {
    pub(crate) fn new(inner: S, limits: Limits) -> Self {
        Self {
            inner,
            rewriter: AuthorityRewriter::new(limits),
            scratch: vec![0; 16 * 1024].into_boxed_slice(),
            read: ReadState::Open,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for RewritingStream<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        loop {
            // Hand out what is ready first, even when an error follows it.
            let ready = this.rewriter.output();
            if !ready.is_empty() {
                let n = ready.len().min(buf.remaining());
                buf.put_slice(&ready.split_to(n));
                return Poll::Ready(Ok(()));
            }
            match &this.read {
                ReadState::Open => {}
                ReadState::Eof => return Poll::Ready(Ok(())),
                ReadState::Failed(message) => {
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        message.clone(),
                    )));
                }
            }
            let mut scratch = ReadBuf::new(&mut this.scratch);
            ready!(Pin::new(&mut this.inner).poll_read(cx, &mut scratch))?;
            let filled = scratch.filled();
            if filled.is_empty() {
                if this.rewriter.rewritten() > 0 {
                    debug!(
                        rewritten = this.rewriter.rewritten(),
                        "connection closed; :authority values replaced on it"
                    );
                }
                this.read = ReadState::Eof;
                continue;
            }
            if let Err(e) = this.rewriter.feed(filled) {
                // A connection error in HTTP/2 terms; the server sees a failed read and closes.
                warn!(error = %e, "closing a kubelet-facing connection");
                this.read = ReadState::Failed(format!("http/2 client broke framing: {e}"));
            }
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for RewritingStream<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

impl<S: Connected> Connected for RewritingStream<S> {
    type ConnectInfo = S::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

#[cfg(test)]
mod tests;
