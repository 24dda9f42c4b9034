//! Injected faults, for tests of the claim lifecycle under failure: named points in the manager's
//! disk and runtime paths where a test makes an operation fail, wait, or where the manager
//! "crashes" in-process.
//!
//! Every manager has a [`Faults`] handle ([`crate::ManagerConfig::faults`]). In builds without
//! the `faults` feature (release builds: only the test packages turn it on) the handle is empty
//! and every check compiles to nothing but the work itself. With the feature, a test arms faults
//! on a handle it shares with the manager:
//!
//! - [`Fault::Fail`] at a disk point ([`DISK_POINTS`]) makes that operation fail with an IO error,
//!   as a full or broken disk would; at [`points::SPEC_WRITTEN`] the spec is already in place when
//!   it fails, as when the directory's fsync fails after the rename.
//! - [`Fault::Delay`] makes it wait first (on the runtime's clock, so paused-time tests see
//!   virtual time), as a slow fsync would.
//! - [`Fault::Block`] blocks the disk work itself, on the thread that does it, until the test
//!   calls [`Faults::unblock`]: a stalled disk, as the threads of the process see it.
//! - [`Fault::Crash`] at a crash point ([`crate::crash::CRASH_POINTS`]) or a disk point freezes
//!   the manager there: from that instant nothing it does reaches the disk or the runtime (disk
//!   operations fail, [`crate::Runtime`] calls are not made), which is what the world sees of a
//!   process that died at that point. The test then starts a new manager over the same
//!   directories, as the agent restarts after a crash. Unlike the crash test's real aborts
//!   ([`crate::crash`]), this runs thousands of crashes in one process.
//!
//! A handle can also run the manager's blocking disk work inline instead of on tokio's blocking
//! pool ([`Faults::run_inline`]), so that a test on a current-thread runtime with paused time
//! interleaves tasks the same way on every run of a seed.

use std::{io, time::Duration};

/// Names of the disk points.
pub mod points {
    /// Saving the state file: fails before anything is written.
    pub const STATE_SAVE: &str = "disk.state-save";
    /// Writing a claim's CDI spec: fails before anything is written.
    pub const SPEC_WRITE: &str = "disk.spec-write";
    /// After a claim's CDI spec is in place: fails as a failed directory fsync would, the spec
    /// being on disk.
    pub const SPEC_WRITTEN: &str = "disk.spec-written";
    /// Removing a claim's CDI spec: fails before anything is removed.
    pub const SPEC_REMOVE: &str = "disk.spec-remove";
}

/// Every disk point.
pub const DISK_POINTS: &[&str] = &[
    points::STATE_SAVE,
    points::SPEC_WRITE,
    points::SPEC_WRITTEN,
    points::SPEC_REMOVE,
];

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

    use super::Fault;

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
        pub(super) armed: BTreeMap<String, Armed>,
        /// Where the manager crashed, once it has.
        pub(super) crashed: Option<String>,
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
    pub(super) fn take(shared: &Shared, point: &str, block: bool) -> Option<Fault> {
        let mut table = table(shared)?;
        if table.crashed.is_some() {
            return (!block).then_some(Fault::Crash);
        }
        let armed = table.armed.get_mut(point)?;
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
            table.crashed = Some(point.to_owned());
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
    pub fn arm(&self, point: &str, fault: Fault, times: Option<usize>) {
        self.arm_after(point, 0, fault, times);
    }

    /// Arms `fault` at `point` for `times` passes (`None`: until disarmed) after letting the
    /// next `skip` passes through.
    pub fn arm_after(&self, point: &str, skip: usize, fault: Fault, times: Option<usize>) {
        if let Some(mut t) = armed::table(&self.shared) {
            t.armed
                .insert(point.to_owned(), armed::Armed { fault, skip, times });
        }
    }

    /// Disarms every point (a crash, once it happened, stays).
    pub fn disarm_all(&self) {
        if let Some(mut t) = armed::table(&self.shared) {
            t.armed.clear();
        }
    }

    /// Where the manager crashed, if it did.
    pub fn crashed_at(&self) -> Option<String> {
        armed::table(&self.shared).and_then(|t| t.crashed.clone())
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
    pub(crate) async fn disk(&self, point: &'static str) -> Result<(), io::Error> {
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
    pub(crate) fn crash_point(&self, name: &'static str) {
        crate::crash::crash_point(name);
        #[cfg(feature = "faults")]
        let _ = armed::take(&self.shared, name, false);
    }

    /// Runs blocking disk work for `point` off the async runtime's threads (or inline, see
    /// [`Faults::run_inline`]).
    pub(crate) async fn blocking<T: Send + 'static>(
        &self,
        point: &'static str,
        work: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, io::Error> {
        #[cfg(feature = "faults")]
        let work = {
            let shared = self.shared.clone();
            move || {
                block_if_armed(&shared, point);
                work()
            }
        };
        #[cfg(feature = "faults")]
        if armed::table(&self.shared).is_some_and(|t| t.inline) {
            return Ok(work());
        }
        let _ = point;
        tokio::task::spawn_blocking(work)
            .await
            .map_err(|e| io::Error::other(format!("the disk task failed: {e}")))
    }
}

/// Blocks the calling thread while a [`Fault::Block`] armed at `point` holds it.
#[cfg(feature = "faults")]
fn block_if_armed(shared: &armed::Shared, point: &str) {
    let Some(inner) = shared else { return };
    if armed::take(shared, point, true).is_none() {
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

#[cfg(all(test, feature = "faults"))]
mod tests {
    use super::*;

    #[tokio::test]
    async fn armed_faults_fire_as_often_as_asked_and_a_crash_freezes_everything() {
        let f = Faults::armable();
        assert!(f.disk(points::STATE_SAVE).await.is_ok(), "nothing armed");
        f.arm(points::STATE_SAVE, Fault::Fail, Some(1));
        assert!(f.disk(points::STATE_SAVE).await.is_err());
        assert!(f.disk(points::STATE_SAVE).await.is_ok(), "fired once");
        f.arm_after(points::SPEC_WRITE, 1, Fault::Fail, None);
        assert!(f.disk(points::SPEC_WRITE).await.is_ok(), "skipped");
        assert!(f.disk(points::SPEC_WRITE).await.is_err());
        assert!(f.disk(points::SPEC_WRITE).await.is_err(), "until disarmed");
        assert!(!f.crashed());
        f.arm("prepare.saved", Fault::Crash, None);
        f.crash_point("prepare.allocated");
        assert!(!f.crashed());
        f.crash_point("prepare.saved");
        assert_eq!(f.crashed_at().as_deref(), Some("prepare.saved"));
        f.disarm_all();
        let err = f.disk(points::SPEC_REMOVE).await.unwrap_err();
        assert!(err.to_string().contains("crashed"), "{err}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn a_blocked_disk_operation_holds_its_thread_until_unblocked() {
        let f = Faults::armable();
        f.arm(points::SPEC_WRITE, Fault::Block, Some(1));
        assert!(
            f.disk(points::SPEC_WRITE).await.is_ok(),
            "not taken before the work"
        );
        let work = tokio::spawn({
            let f = f.clone();
            async move { f.blocking(points::SPEC_WRITE, || 7).await.unwrap() }
        });
        while f.blocked() == 0 {
            tokio::task::yield_now().await;
        }
        assert!(!work.is_finished());
        f.unblock();
        assert_eq!(work.await.unwrap(), 7);
        assert_eq!(f.blocked(), 0);
        assert_eq!(
            f.blocking(points::SPEC_WRITE, || 8).await.unwrap(),
            8,
            "fired once"
        );
    }

    #[tokio::test]
    async fn an_unarmed_handle_never_interferes() {
        let f = Faults::default();
        f.arm(points::STATE_SAVE, Fault::Fail, None);
        assert!(f.disk(points::STATE_SAVE).await.is_ok());
        assert_eq!(f.blocking(points::STATE_SAVE, || 7).await.unwrap(), 7);
    }
}
