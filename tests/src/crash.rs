//! The crash test's fault hook: the process aborts at the named point that `RESMGR_CRASH_AT`
//! names ([`CRASH_AT_ENV`]), with no unwinding, no destructors and no flushing, as close to a
//! power cut as a test can get.
//!
//! It is installed only by the binaries the crash tests run: `crash-child` (a manager over a
//! directory, killed at every step of prepare, unprepare and commit by `tests/crash.rs`) and
//! `resmgr-crashing` (the agent, `resmgr_agent::main`, killed at the steps of a handover by the
//! Go agent suite). The shipped `resmgr` has no hook, and nothing of this is in it: `cargo xtask`
//! checks its bytes for [`CRASH_AT_ENV`].

use std::sync::Arc;

use resmgr::{
    faults::{FaultHooks, Faults},
    points::Point,
};

/// The environment variable naming the point to abort at.
pub const CRASH_AT_ENV: &str = "RESMGR_CRASH_AT";

/// Aborts the process at the point of this name.
#[derive(Debug)]
pub struct CrashAt(pub String);

impl FaultHooks for CrashAt {
    fn crash_point(&self, point: Point) {
        if point.name() == self.0 {
            eprintln!("crash point {point}: aborting");
            std::process::abort();
        }
    }
}

/// The fault handle the environment asks for: [`CrashAt`] the point [`CRASH_AT_ENV`] names, or
/// none when it is unset.
pub fn from_env() -> Faults {
    match std::env::var(CRASH_AT_ENV) {
        Ok(name) => Faults::new(Arc::new(CrashAt(name))),
        Err(_) => Faults::default(),
    }
}
