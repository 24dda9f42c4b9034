//! Injected faults, for tests of the claim lifecycle under failure: a table of faults a test arms
//! at the manager's named points ([`Point`]), which the manager consults through its fault seam
//! ([`resmgr::faults`]; the table is [`FaultHooks`] and [`FaultTable::handle`] the manager's
//! handle on it).
//!
//! - [`Fault::Fail`] at a disk point ([`Point::DISK`]) makes that operation fail with an IO error,
//!   as a full or broken disk would; at [`Point::SpecWritten`] the spec is already in place when
//!   it fails, as when the directory's fsync fails after the rename.
//! - [`Fault::Delay`] makes it wait first (on the runtime's clock, so paused-time tests see
//!   virtual time), as a slow fsync would.
//! - [`Fault::Block`] blocks the disk work itself, on the thread that does it, until the test
//!   calls [`FaultTable::unblock`]: a stalled disk, as the threads of the process see it.
//! - [`Fault::Crash`] at a step ([`Point::STEPS`]) or a disk point freezes the manager there:
//!   from that instant nothing it does reaches the disk or the runtime (disk operations fail,
//!   [`resmgr::Runtime`] calls are not made), which is what the world sees of a process that died
//!   at that point. The test then starts a new manager over the same directories, as the agent
//!   restarts after a crash. Unlike the crash test's real aborts ([`crate::crash`]), this runs
//!   thousands of crashes in one process.
//!
//! A table can also have the manager's blocking disk work run inline instead of on tokio's
//! blocking pool ([`FaultTable::run_inline`]), so that a test on a current-thread runtime with
//! paused time interleaves tasks the same way on every run of a seed.

use std::{
    collections::BTreeMap,
    io,
    sync::{Arc, Condvar, Mutex, MutexGuard},
    time::Duration,
};

pub use resmgr::faults::Point;
use resmgr::{
    BoxFuture,
    faults::{FaultHooks, Faults},
};

/// What happens at an armed point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The operation fails.
    Fail,
    /// The operation waits this long first.
    Delay(Duration),
    /// The manager freezes here, as a process that died: see the module docs.
    Crash,
    /// The disk work blocks the thread doing it until [`FaultTable::unblock`] (disk points only).
    Block,
}

#[derive(Debug)]
struct Armed {
    fault: Fault,
    /// Passes still to let through before it fires.
    skip: usize,
    /// How many more times it fires (`None`: every time).
    times: Option<usize>,
}

#[derive(Debug, Default)]
struct Table {
    /// Point → what fires there.
    armed: BTreeMap<Point, Armed>,
    /// Where the manager crashed, once it has.
    crashed: Option<Point>,
    inline: bool,
    /// Disk operations blocked now, and whether they may go on.
    blocked: usize,
    unblocked: bool,
}

#[derive(Debug, Default)]
struct Inner {
    table: Mutex<Table>,
    changed: Condvar,
}

/// Faults a test arms, shared with the managers it starts ([`FaultTable::handle`]). Cloning
/// shares the table.
#[derive(Debug, Clone, Default)]
pub struct FaultTable(Arc<Inner>);

impl FaultTable {
    /// A table with nothing armed.
    pub fn new() -> Self {
        Self::default()
    }

    /// The manager's handle on this table ([`resmgr::ManagerConfig::faults`]).
    pub fn handle(&self) -> Faults {
        Faults::new(self.0.clone())
    }

    /// Arms `fault` at `point` for its next `times` passes (`None`: until disarmed).
    pub fn arm(&self, point: Point, fault: Fault, times: Option<usize>) {
        self.arm_after(point, 0, fault, times);
    }

    /// Arms `fault` at `point` for `times` passes (`None`: until disarmed) after letting the
    /// next `skip` passes through.
    pub fn arm_after(&self, point: Point, skip: usize, fault: Fault, times: Option<usize>) {
        self.0
            .lock()
            .armed
            .insert(point, Armed { fault, skip, times });
    }

    /// Disarms every point (a crash, once it happened, stays).
    pub fn disarm_all(&self) {
        self.0.lock().armed.clear();
    }

    /// Where the manager crashed, if it did.
    pub fn crashed_at(&self) -> Option<Point> {
        self.0.lock().crashed
    }

    /// Runs the manager's blocking disk work inline, on the calling task, instead of on tokio's
    /// blocking pool.
    pub fn run_inline(&self) {
        self.0.lock().inline = true;
    }

    /// How many disk operations a [`Fault::Block`] holds now.
    pub fn blocked(&self) -> usize {
        self.0.lock().blocked
    }

    /// Lets every blocked disk operation, and every later one, go on.
    pub fn unblock(&self) {
        self.0.lock().unblocked = true;
        self.0.changed.notify_all();
    }
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, Table> {
        // A test that panicked while holding the table poisoned it; its faults still apply.
        stdx::sync::lock(&self.table)
    }

    /// The fault to apply at `point` now, counting it; a [`Fault::Block`] only if `block` (it is
    /// taken on the thread doing the work, the others before it).
    fn take(&self, point: Point, block: bool) -> Option<Fault> {
        let mut table = self.lock();
        if table.crashed.is_some() {
            return (!block).then_some(Fault::Crash);
        }
        let armed = table.armed.get_mut(&point)?;
        if (armed.fault == Fault::Block) != block {
            return None;
        }
        if armed.skip > 0 {
            armed.skip -= 1;
            return None;
        }
        match &mut armed.times {
            Some(0) => return None,
            Some(n) => *n -= 1,
            None => {}
        }
        let fault = armed.fault;
        if fault == Fault::Crash {
            table.crashed = Some(point);
        }
        Some(fault)
    }
}

impl FaultHooks for Inner {
    /// Fails if a failure or a crash is armed at `point` or the manager crashed, waits if a delay
    /// is.
    fn disk(&self, point: Point) -> BoxFuture<'_, io::Result<()>> {
        let fault = self.take(point, false);
        Box::pin(async move {
            match fault {
                None | Some(Fault::Block) => Ok(()),
                Some(Fault::Delay(d)) => {
                    tokio::time::sleep(d).await;
                    Ok(())
                }
                Some(Fault::Fail) => Err(io::Error::other(format!("injected failure at {point}"))),
                Some(Fault::Crash) => Err(io::Error::other(format!(
                    "the manager crashed (injected) before {point}"
                ))),
            }
        })
    }

    /// Blocks the thread while a [`Fault::Block`] armed at `point` holds it.
    fn on_disk_thread(&self, point: Point) {
        if self.take(point, true).is_none() {
            return;
        }
        let mut table = self.lock();
        table.blocked += 1;
        while !table.unblocked {
            table = self
                .changed
                .wait(table)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
        }
        table.blocked -= 1;
    }

    /// Freezes the manager if a crash is armed here.
    fn crash_point(&self, point: Point) {
        let _ = self.take(point, false);
    }

    fn crashed(&self) -> bool {
        self.lock().crashed.is_some()
    }

    fn inline(&self) -> bool {
        self.lock().inline
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn armed_faults_fire_as_often_as_asked_and_a_crash_freezes_everything() {
        let t = FaultTable::new();
        let f = t.0.as_ref();
        assert!(f.disk(Point::StateSave).await.is_ok(), "nothing armed");
        t.arm(Point::StateSave, Fault::Fail, Some(1));
        assert!(f.disk(Point::StateSave).await.is_err());
        assert!(f.disk(Point::StateSave).await.is_ok(), "fired once");
        t.arm_after(Point::SpecWrite, 1, Fault::Fail, None);
        assert!(f.disk(Point::SpecWrite).await.is_ok(), "skipped");
        assert!(f.disk(Point::SpecWrite).await.is_err());
        assert!(f.disk(Point::SpecWrite).await.is_err(), "until disarmed");
        assert!(!f.crashed());
        t.arm(Point::PrepareSaved, Fault::Crash, None);
        f.crash_point(Point::PrepareAllocated);
        assert!(!f.crashed());
        f.crash_point(Point::PrepareSaved);
        assert_eq!(t.crashed_at(), Some(Point::PrepareSaved));
        assert!(t.handle().crashed(), "the manager's handle sees it");
        t.disarm_all();
        let err = f.disk(Point::SpecRemove).await.unwrap_err();
        assert!(err.to_string().contains("crashed"), "{err}");
    }

    #[test]
    fn a_blocked_disk_operation_holds_its_thread_until_unblocked() {
        let t = FaultTable::new();
        t.arm(Point::SpecWrite, Fault::Block, Some(1));
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        assert!(
            runtime.block_on(t.0.disk(Point::SpecWrite)).is_ok(),
            "not taken before the work"
        );
        let work = std::thread::spawn({
            let t = t.clone();
            move || {
                t.0.on_disk_thread(Point::SpecWrite);
                7
            }
        });
        while t.blocked() == 0 {
            std::thread::yield_now();
        }
        assert!(!work.is_finished());
        t.unblock();
        assert_eq!(work.join().unwrap(), 7);
        assert_eq!(t.blocked(), 0);
    }

    #[test]
    fn run_inline_is_what_the_manager_reads() {
        let t = FaultTable::new();
        assert!(!t.0.inline());
        t.run_inline();
        assert!(t.0.inline());
    }
}
