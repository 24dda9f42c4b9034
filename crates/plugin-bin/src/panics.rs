//! What a panic does in the agent: it stops the process at once, where it happened, saving
//! nothing.
//!
//! A panic is a bug, and a bug in the middle of a change (under the manager lock, between the
//! policy's allocation and the claim's record, say) leaves the process's memory half-changed.
//! Serving on from there would answer the runtime and the kubelet from that memory, and the
//! drain would save it. Stopping loses nothing: every write is atomic and comes in the order
//! the crash invariant asks (state before spec; ARCHITECTURE.md), so what is on disk is always
//! a state the agent restarts from, and the runtime's Synchronize and the kubelet's retries
//! bring the rest back. The kubelet's call in flight loses its connection and gets
//! `Unavailable`, which it retries; the DaemonSet restarts the container.
//!
//! The release profile builds with `panic = "abort"`, which also drops the unwinding code. The
//! dev profile unwinds: Rust's test harness needs it, and a dev profile that aborted would have
//! `cargo xtask test` build every dependency twice, once per panic strategy. So [`install`]
//! makes a panic abort in every build of the binary: a panic hook runs first thing when a panic
//! starts, before anything unwinds, which is also where `panic = "abort"` aborts, after the same
//! hook. The agent the tests drive (`resmgr`, and `resmgr-crashing`, the same [`crate::main`]
//! with the crash test's hook) therefore stops on a panic exactly as the release does.

/// Makes every panic of the process print its message, as Rust's own hook does, and abort.
pub fn install() {
    let report = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        report(info);
        eprintln!(
            "resmgr: a panic stops the agent at once, saving nothing; restarted, it starts \
             from what is on disk"
        );
        std::process::abort();
    }));
}
