//! What a closure logs through `tracing`, captured as the text the binary's formatter writes
//! (without colours), for tests of what code logs. Only with the `capture-logs` feature, which
//! crates turn on in their dev-dependencies.

use std::{
    io::Write,
    sync::{Arc, Mutex},
};

use tracing_subscriber::util::SubscriberInitExt as _;

use crate::sync::lock;

/// Runs `f` with a subscriber of this thread that captures every event at any level; what it
/// logged. Async code logs here when `f` runs it on this thread (a current-thread runtime).
pub fn captured(f: impl FnOnce()) -> String {
    let buffer = Buffer::default();
    let writer = buffer.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .with_max_level(tracing_subscriber::filter::LevelFilter::TRACE)
        .finish();
    let guard = subscriber.set_default();
    f();
    drop(guard);
    String::from_utf8_lossy(&lock(&buffer.0)).into_owned()
}

#[derive(Clone, Default)]
struct Buffer(Arc<Mutex<Vec<u8>>>);

impl Write for Buffer {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        lock(&self.0).extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
