//! Injected faults, for tests of the claim lifecycle under failure: named points in the manager's
//! disk and runtime paths where a test makes an operation fail, wait, or where the manager
//! "crashes" in-process.
//!
//! Every manager has a [`Faults`] handle ([`crate::ManagerConfig::faults`]). In builds without
//! the `faults` feature (release builds: only the test packages turn it on) the handle is empty
//! and every check compiles to nothing but the work itself. With the feature, a test arms faults
//! on a handle it shares with the manager:
//!
//! - [`Fault::Fail`] at a disk point ([`Point::DISK`]) makes that operation fail with an IO error,
//!   as a full or broken disk would; at [`Point::SpecWritten`] the spec is already in place when
//!   it fails, as when the directory's fsync fails after the rename.
//! - [`Fault::Delay`] makes it wait first (on the runtime's clock, so paused-time tests see
//!   virtual time), as a slow fsync would.
//! - [`Fault::Block`] blocks the disk work itself, on the thread that does it, until the test
//!   calls [`Faults::unblock`]: a stalled disk, as the threads of the process see it.
//! - [`Fault::Crash`] at a step ([`Point::STEPS`]) or a disk point freezes
//!   the manager there: from that instant nothing it does reaches the disk or the runtime (disk
//!   operations fail, [`crate::Runtime`] calls are not made), which is what the world sees of a
//!   process that died at that point. The test then starts a new manager over the same
//!   directories, as the agent restarts after a crash. Unlike the crash test's real aborts
//!   ([`crate::crash`]), this runs thousands of crashes in one process.
//!
//! A handle can also have the manager's blocking disk work run inline instead of on tokio's
//! blocking pool ([`Faults::run_inline`]), so that a test on a current-thread runtime with paused
//! time interleaves tasks the same way on every run of a seed.
//!
//! The points are one enum, [`Point`], shared with the crash test's aborts ([`crate::crash`]).

use std::{io, time::Duration};

pub use crate::points::Point;

/// What happens at an armed point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The operation fails.
    Fail,
    /// The operation waits this long first.
    Delay(Duration),
    /// The manager freezes here, as a process that died: see the module docs.
    Crash,
    /// The disk work blocks the thread doing it until [`Faults::unblock`] (disk points only).
    Block,
}

#[cfg(feature = "faults")]
mod armed {
    use std::{
        collections::BTreeMap,
        sync::{Arc, Condvar, Mutex, MutexGuard},
    };

    use super::{Fault, Point};

    #[derive(Debug)]
    pub(super) struct Armed {
        pub(super) fault: Fault,
        /// Passes still to let through before it fires.
        pub(super) skip: usize,
        /// How many more times it fires (`None`: every time).
        pub(super) times: Option<usize>,
    }

    #[derive(Debug, Default)]
    pub(super) struct Table {
        /// Point → what fires there.
        pub(super) armed: BTreeMap<Point, Armed>,
        /// Where the manager crashed, once it has.
        pub(super) crashed: Option<Point>,
        pub(super) inline: bool,
        /// Disk operations blocked now, and whether they may go on.
        pub(super) blocked: usize,
        pub(super) unblocked: bool,
    }

    #[derive(Debug, Default)]
    pub(super) struct Inner {
        pub(super) table: Mutex<Table>,
        pub(super) changed: Condvar,
    }

    pub(super) type Shared = Option<Arc<Inner>>;

    pub(super) fn lock(inner: &Inner) -> MutexGuard<'_, Table> {
        // A test that panicked while holding the table poisoned it; its faults still apply.
        inner
            .table
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub(super) fn table(shared: &Shared) -> Option<MutexGuard<'_, Table>> {
        shared.as_deref().map(lock)
    }

    /// The fault to apply at `point` now, counting it; a [`Fault::Block`] only if `block` (it is
    /// taken on the thread doing the work, the others before it).
    pub(super) fn take(shared: &Shared, point: Point, block: bool) -> Option<Fault> {
        let mut table = table(shared)?;
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

/// A manager's fault handle: see the module docs. Cloning shares it.
#[derive(Debug, Clone, Default)]
pub struct Faults {
    #[cfg(feature = "faults")]
    shared: armed::Shared,
}

#[cfg(feature = "faults")]
impl Faults {
    /// A handle a test can arm (the default handle arms nothing and is never consulted).
    pub fn armable() -> Self {
        Self {
            shared: Some(std::sync::Arc::default()),
        }
    }

    /// Arms `fault` at `point` for its next `times` passes (`None`: until disarmed).
    pub fn arm(&self, point: Point, fault: Fault, times: Option<usize>) {
        self.arm_after(point, 0, fault, times);
    }

    /// Arms `fault` at `point` for `times` passes (`None`: until disarmed) after letting the
    /// next `skip` passes through.
    pub fn arm_after(&self, point: Point, skip: usize, fault: Fault, times: Option<usize>) {
        if let Some(mut t) = armed::table(&self.shared) {
            t.armed.insert(point, armed::Armed { fault, skip, times });
        }
    }

    /// Disarms every point (a crash, once it happened, stays).
    pub fn disarm_all(&self) {
        if let Some(mut t) = armed::table(&self.shared) {
            t.armed.clear();
        }
    }

    /// Where the manager crashed, if it did.
    pub fn crashed_at(&self) -> Option<Point> {
        armed::table(&self.shared).and_then(|t| t.crashed)
    }

    /// Runs the manager's blocking disk work inline, on the calling task, instead of on tokio's
    /// blocking pool.
    pub fn run_inline(&self) {
        if let Some(mut t) = armed::table(&self.shared) {
            t.inline = true;
        }
    }

    /// How many disk operations a [`Fault::Block`] holds now.
    pub fn blocked(&self) -> usize {
        armed::table(&self.shared).map_or(0, |t| t.blocked)
    }

    /// Lets every blocked disk operation, and every later one, go on.
    pub fn unblock(&self) {
        if let Some(inner) = &self.shared {
            armed::lock(inner).unblocked = true;
            inner.changed.notify_all();
        }
    }
}

impl Faults {
    /// Passes a disk point: fails if a failure or a crash is armed there or the manager crashed,
    /// waits if a delay is.
    #[allow(clippy::unused_async)] // async for the delay, which only the feature compiles in
    pub(crate) async fn disk(&self, point: Point) -> Result<(), io::Error> {
        #[cfg(feature = "faults")]
        match armed::take(&self.shared, point, false) {
            None | Some(Fault::Block) => {}
            Some(Fault::Delay(d)) => tokio::time::sleep(d).await,
            Some(Fault::Fail) => {
                return Err(io::Error::other(format!("injected failure at {point}")));
            }
            Some(Fault::Crash) => {
                return Err(io::Error::other(format!(
                    "the manager crashed (injected) before {point}"
                )));
            }
        }
        let _ = point;
        Ok(())
    }

    /// Whether the manager crashed: then nothing it does may reach the runtime.
    pub(crate) fn crashed(&self) -> bool {
        #[cfg(feature = "faults")]
        if let Some(t) = armed::table(&self.shared) {
            return t.crashed.is_some();
        }
        false
    }

    /// A named crash point: aborts the process if the environment asks for it
    /// ([`crate::crash::crash_point`]), and freezes this manager if a crash is armed here.
    pub(crate) fn crash_point(&self, point: Point) {
        crate::crash::crash_point(point);
        #[cfg(feature = "faults")]
        let _ = armed::take(&self.shared, point, false);
    }

    /// Whether blocking disk work runs inline ([`Faults::run_inline`]).
    pub(crate) fn inline(&self) -> bool {
        #[cfg(feature = "faults")]
        if let Some(t) = armed::table(&self.shared) {
            return t.inline;
        }
        false
    }

    /// Called first on the thread that does the disk work for `point`: blocks it while a
    /// [`Fault::Block`] armed there holds it.
    pub(crate) fn block_if_armed(&self, point: Point) {
        #[cfg(feature = "faults")]
        {
            let Some(inner) = &self.shared else { return };
            if armed::take(&self.shared, point, true).is_none() {
                return;
            }
            let mut table = armed::lock(inner);
            table.blocked += 1;
            while !table.unblocked {
                table = inner
                    .changed
                    .wait(table)
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
            }
            table.blocked -= 1;
        }
        let _ = point;
    }
}

#[cfg(all(test, feature = "faults"))]
mod tests {
    use super::*;
    use crate::disk::off_thread;

    #[tokio::test]
    async fn armed_faults_fire_as_often_as_asked_and_a_crash_freezes_everything() {
        let f = Faults::armable();
        assert!(f.disk(Point::StateSave).await.is_ok(), "nothing armed");
        f.arm(Point::StateSave, Fault::Fail, Some(1));
        assert!(f.disk(Point::StateSave).await.is_err());
        assert!(f.disk(Point::StateSave).await.is_ok(), "fired once");
        f.arm_after(Point::SpecWrite, 1, Fault::Fail, None);
        assert!(f.disk(Point::SpecWrite).await.is_ok(), "skipped");
        assert!(f.disk(Point::SpecWrite).await.is_err());
        assert!(f.disk(Point::SpecWrite).await.is_err(), "until disarmed");
        assert!(!f.crashed());
        f.arm(Point::PrepareSaved, Fault::Crash, None);
        f.crash_point(Point::PrepareAllocated);
        assert!(!f.crashed());
        f.crash_point(Point::PrepareSaved);
        assert_eq!(f.crashed_at(), Some(Point::PrepareSaved));
        f.disarm_all();
        let err = f.disk(Point::SpecRemove).await.unwrap_err();
        assert!(err.to_string().contains("crashed"), "{err}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn a_blocked_disk_operation_holds_its_thread_until_unblocked() {
        let f = Faults::armable();
        f.arm(Point::SpecWrite, Fault::Block, Some(1));
        assert!(
            f.disk(Point::SpecWrite).await.is_ok(),
            "not taken before the work"
        );
        let work = tokio::spawn({
            let f = f.clone();
            async move { off_thread(&f, Point::SpecWrite, || 7).await.unwrap() }
        });
        while f.blocked() == 0 {
            tokio::task::yield_now().await;
        }
        assert!(!work.is_finished());
        f.unblock();
        assert_eq!(work.await.unwrap(), 7);
        assert_eq!(f.blocked(), 0);
        assert_eq!(
            off_thread(&f, Point::SpecWrite, || 8).await.unwrap(),
            8,
            "fired once"
        );
    }

    #[tokio::test]
    async fn an_unarmed_handle_never_interferes() {
        let f = Faults::default();
        f.arm(Point::StateSave, Fault::Fail, None);
        assert!(f.disk(Point::StateSave).await.is_ok());
        assert_eq!(off_thread(&f, Point::StateSave, || 7).await.unwrap(), 7);
    }
}
