//! The crash test's fault hook: the process aborts at the named point that `RESMGR_CRASH_AT`
//! names ([`CRASH_AT_ENV`]), with no unwinding, no destructors and no flushing, as close to a
//! power cut as a test can get; or it panics there (`RESMGR_CRASH_AT=<point>:panic`), as a bug
//! would, and what follows is the process's own doing (the agent stops at once: ARCHITECTURE.md,
//! "A panic stops the agent"); or it stops at the point `RESMGR_HOLD_AT` names
//! ([`HOLD_AT_ENV`]) until the test lets it go on, so that a test can act at exactly that
//! instant (start another agent while one is between two steps of a handover, say).
//!
//! It is installed only by the binaries the crash tests run: `crash-child` (a manager over a
//! directory, killed at every step of prepare, unprepare and commit by `tests/crash.rs`) and
//! `resmgr-crashing` (the agent, `resmgr_agent::main`, killed or held at the steps of a handover
//! by the Go agent suite). The shipped `resmgr` has no hook, and nothing of this is in it:
//! `cargo xtask` checks its bytes for [`CRASH_AT_ENV`].

use std::{io::Read, path::PathBuf, sync::Arc};

use resmgr::{
    faults::{FaultHooks, Faults},
    points::{Point, UnknownPoint},
};

/// The environment variable naming the point to crash at, and how: `<point>` aborts there,
/// `<point>:panic` panics there ([`Crash`]).
pub const CRASH_AT_ENV: &str = "RESMGR_CRASH_AT";

/// The suffix of a [`CRASH_AT_ENV`] value that makes the crash a panic.
pub const PANIC_SUFFIX: &str = ":panic";

/// The environment variable naming the point to stop at, and the named pipe (FIFO) that lets
/// the process go on, as `<point>:<fifo>`.
///
/// At the point the process writes `hold point <point>: waiting for <fifo>` to stderr and opens
/// the pipe for reading, which blocks until the test opens it for writing; it goes on once the
/// test closes it. The thread that reached the point stops; the process's other threads carry
/// on, as they would if that step were slow.
pub const HOLD_AT_ENV: &str = "RESMGR_HOLD_AT";

/// How the process crashes at its point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Crash {
    /// `std::process::abort`: nothing of the process runs after it, a power cut.
    Abort,
    /// A panic, as a bug in the code at that point would make: what runs after it is what the
    /// process does with a panic.
    Panic,
}

/// Crashes the process at a point.
#[derive(Debug)]
pub struct CrashAt {
    /// Where.
    pub point: Point,
    /// How.
    pub how: Crash,
}

impl CrashAt {
    /// The crash a [`CRASH_AT_ENV`] value asks for: `<point>` or `<point>:panic`.
    pub fn parse(value: &str) -> Result<Self, UnknownPoint> {
        let (point, how) = match value.strip_suffix(PANIC_SUFFIX) {
            Some(point) => (point, Crash::Panic),
            None => (value, Crash::Abort),
        };
        Ok(Self {
            point: point.parse()?,
            how,
        })
    }
}

impl FaultHooks for CrashAt {
    fn crash_point(&self, point: Point) {
        if point != self.point {
            return;
        }
        match self.how {
            Crash::Abort => {
                eprintln!("crash point {point}: aborting");
                std::process::abort();
            }
            Crash::Panic => panic!("crash point {point}: panicking"),
        }
    }
}

/// Stops at the point of this name until the test writes to, and closes, the pipe.
#[derive(Debug)]
pub struct HoldAt {
    /// The point's name.
    pub point: String,
    /// The named pipe the test opens for writing to let the process go on.
    pub fifo: PathBuf,
}

impl FaultHooks for HoldAt {
    fn crash_point(&self, point: Point) {
        if point.name() != self.point {
            return;
        }
        eprintln!("hold point {point}: waiting for {}", self.fifo.display());
        // Opening a FIFO for reading blocks until a writer opens it; reading ends when the
        // writer closes it. Either failing (the test removed it, say) lets the process go on,
        // which the test then sees as the step not having waited.
        match std::fs::File::open(&self.fifo) {
            Ok(mut fifo) => {
                let _ = fifo.read_to_end(&mut Vec::new());
            }
            Err(e) => eprintln!("hold point {point}: opening {}: {e}", self.fifo.display()),
        }
        eprintln!("hold point {point}: going on");
    }
}

/// The fault handle the environment asks for: [`CrashAt`] the point [`CRASH_AT_ENV`] names,
/// [`HoldAt`] the point and pipe [`HOLD_AT_ENV`] names, or none when neither is set.
///
/// # Panics
///
/// When both are set, [`CRASH_AT_ENV`] names no point, or [`HOLD_AT_ENV`] is not
/// `<point>:<fifo>`: a test's mistake.
pub fn from_env() -> Faults {
    let crash = std::env::var(CRASH_AT_ENV).ok();
    let hold = std::env::var(HOLD_AT_ENV).ok();
    match (crash, hold) {
        (None, None) => Faults::default(),
        (Some(crash), None) => {
            let crash = CrashAt::parse(&crash).unwrap_or_else(|e| panic!("{CRASH_AT_ENV}: {e}"));
            Faults::new(Arc::new(crash))
        }
        (None, Some(hold)) => {
            let (point, fifo) = hold
                .split_once(':')
                .unwrap_or_else(|| panic!("{HOLD_AT_ENV}={hold}: expected <point>:<fifo>"));
            Faults::new(Arc::new(HoldAt {
                point: point.to_owned(),
                fifo: fifo.into(),
            }))
        }
        (Some(_), Some(_)) => panic!("{CRASH_AT_ENV} and {HOLD_AT_ENV} are both set"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_crash_is_an_abort_unless_it_says_panic_and_names_a_point() {
        let abort = CrashAt::parse("prepare.saved").unwrap();
        assert_eq!(
            (abort.point, abort.how),
            (Point::PrepareSaved, Crash::Abort)
        );
        let panic = CrashAt::parse("prepare.allocated:panic").unwrap();
        assert_eq!(
            (panic.point, panic.how),
            (Point::PrepareAllocated, Crash::Panic)
        );
        assert!(CrashAt::parse("prepare.nowhere").is_err());
        assert!(CrashAt::parse("prepare.saved:explode").is_err());
    }

    #[test]
    fn the_panic_is_raised_at_its_point_only() {
        let crash = CrashAt {
            point: Point::PrepareAllocated,
            how: Crash::Panic,
        };
        crash.crash_point(Point::PrepareSaved);
        let panicked = std::panic::catch_unwind(|| crash.crash_point(Point::PrepareAllocated));
        assert!(panicked.is_err());
    }
}
