//! Named crash points in the claim lifecycle and the commit, for crash-consistency tests.
//!
//! Every step of prepare, unprepare and commit calls [`crash_point`] with its point
//! ([`Point::STEPS`]). In builds with
//! the `crash-points` feature (enabled only by the test packages, never in a release build), the
//! process aborts on the spot when the environment variable `RESMGR_CRASH_AT` names that point:
//! no unwinding, no destructors, no flushing, as close to a power cut as a test can get. Without
//! the feature the calls compile to nothing.

use crate::points::Point;

/// The environment variable naming the crash point to abort at.
pub const CRASH_AT_ENV: &str = "RESMGR_CRASH_AT";

/// Aborts the process if `RESMGR_CRASH_AT` names this point (only with the `crash-points`
/// feature).
#[cfg(feature = "crash-points")]
pub fn crash_point(point: Point) {
    if std::env::var_os(CRASH_AT_ENV).is_some_and(|v| v == point.name()) {
        eprintln!("crash point {point}: aborting");
        std::process::abort();
    }
}

/// Does nothing: this build has no crash points.
#[cfg(not(feature = "crash-points"))]
#[inline(always)]
pub fn crash_point(_point: Point) {}
