//! The fault seam: where a test reaches into the manager, at the named points ([`Point`]) of its
//! disk operations, its lifecycle steps and the handover, to make an operation fail, wait or
//! block, to freeze the manager as if it had died there, or to abort the process there.
//!
//! Every manager has a [`Faults`] handle ([`crate::ManagerConfig::faults`]), and so have the
//! handover's owner ([`crate::handover::Owner::bind`]) and the binary's side of a takeover. The
//! agent's handle is empty ([`Faults::default`]): a point then costs one `None` check, and no
//! fault machinery is in this crate or the shipped binary at all. A test hands the manager a
//! handle over its own [`FaultHooks`] ([`Faults::new`]). The tests package has the two the
//! workspace uses: a table of faults that a test arms (`integration_tests::faults`: a disk
//! operation fails, waits or blocks its thread, or the manager "crashes" in-process at a point,
//! after which nothing it does reaches the disk or the runtime; thousands of crashes in one
//! process), and the crash test's hook, which aborts the process at the point its environment
//! names (`integration_tests::crash`, run by the `crash-child` and `resmgr-crashing` binaries).
//!
//! What the manager promises the hooks, which is what makes those tests mean something:
//!
//! - every disk operation ([`Point::DISK`]) passes its point in async code before it runs
//!   ([`FaultHooks::disk`]): an error there is the operation's error, and a wait there delays it;
//!   at [`Point::SpecWritten`] the spec is in place already, as when the directory's fsync fails
//!   after the rename;
//! - the blocking work of a disk operation calls [`FaultHooks::on_disk_thread`] first, on the
//!   thread that does it;
//! - every step of prepare, unprepare and commit ([`Point::STEPS`]) and of a handover
//!   ([`Point::HANDOVER`]) calls [`FaultHooks::crash_point`] as it is reached, and every step of a
//!   handover then awaits [`FaultHooks::pause`] (in async code, so a test's pause lets the
//!   other agents run);
//! - while [`FaultHooks::crashed`] says so, the manager makes no call to the runtime;
//! - with [`FaultHooks::inline`], blocking disk work runs on the calling task instead of tokio's
//!   blocking pool, so that a test on a current-thread runtime with paused time interleaves tasks
//!   the same way on every run of a seed.

use std::{io, sync::Arc};

pub use crate::points::Point;
use crate::runtime::BoxFuture;

/// What a test does at the manager's fault points: see the module docs. Every method has a
/// default that does nothing, so a hook implements only the points it acts on.
pub trait FaultHooks: std::fmt::Debug + Send + Sync {
    /// A disk operation at `point` is about to run: an error fails it, and the future may wait
    /// first (on the runtime's clock, so that paused-time tests see virtual time).
    fn disk(&self, point: Point) -> BoxFuture<'_, io::Result<()>> {
        let _ = point;
        Box::pin(std::future::ready(Ok(())))
    }

    /// Called first on the thread that does the disk work for `point` (a thread of tokio's
    /// blocking pool, or the calling task's with [`FaultHooks::inline`]); it may block that
    /// thread, as a stalled disk does.
    fn on_disk_thread(&self, point: Point) {
        let _ = point;
    }

    /// The manager (or the agent, on its side of a handover) reached the step `point`.
    fn crash_point(&self, point: Point) {
        let _ = point;
    }

    /// A step of a handover (one of [`Point::HANDOVER`]) is reached, after
    /// [`FaultHooks::crash_point`]: the future may wait first (on the runtime's clock), as an
    /// agent the scheduler put off would, so that a test widens the window between two steps
    /// for other agents to act in.
    fn pause(&self, point: Point) -> BoxFuture<'_, ()> {
        let _ = point;
        Box::pin(std::future::ready(()))
    }

    /// Whether the manager is dead as far as the world can tell: then it makes no call to the
    /// runtime.
    fn crashed(&self) -> bool {
        false
    }

    /// Whether blocking disk work runs inline, on the calling task.
    fn inline(&self) -> bool {
        false
    }
}

/// A fault handle: none (the default, the agent's) or a test's [`FaultHooks`]. Cloning shares
/// the hooks.
#[derive(Debug, Clone, Default)]
pub struct Faults(Option<Arc<dyn FaultHooks>>);

impl Faults {
    /// A handle over `hooks`.
    pub fn new(hooks: Arc<dyn FaultHooks>) -> Self {
        Self(Some(hooks))
    }

    /// Passes a disk point ([`FaultHooks::disk`]).
    pub(crate) async fn disk(&self, point: Point) -> Result<(), io::Error> {
        match &self.0 {
            None => Ok(()),
            Some(hooks) => hooks.disk(point).await,
        }
    }

    /// Whether the manager crashed ([`FaultHooks::crashed`]): then nothing it does may reach the
    /// runtime.
    pub fn crashed(&self) -> bool {
        self.0.as_ref().is_some_and(|h| h.crashed())
    }

    /// Passes a named step ([`FaultHooks::crash_point`]). Public for the binary's side of a
    /// takeover ([`Point::TakeoverAccepted`] and the points after it).
    pub fn crash_point(&self, point: Point) {
        if let Some(hooks) = &self.0 {
            hooks.crash_point(point);
        }
    }

    /// Passes a step of a handover: [`FaultHooks::crash_point`], then [`FaultHooks::pause`].
    /// Public for the binary's side of a takeover.
    pub async fn handover_step(&self, point: Point) {
        if let Some(hooks) = &self.0 {
            hooks.crash_point(point);
            hooks.pause(point).await;
        }
    }

    /// Whether blocking disk work runs inline ([`FaultHooks::inline`]).
    pub(crate) fn inline(&self) -> bool {
        self.0.as_ref().is_some_and(|h| h.inline())
    }

    /// Called first on the thread that does the disk work for `point`
    /// ([`FaultHooks::on_disk_thread`]).
    pub(crate) fn block_if_armed(&self, point: Point) {
        if let Some(hooks) = &self.0 {
            hooks.on_disk_thread(point);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{
        Mutex,
        atomic::{AtomicBool, Ordering},
    };

    use super::*;
    use crate::disk::off_thread;

    /// Records where it was called, on which thread, and fails one disk point.
    #[derive(Debug, Default)]
    struct Recorder {
        inline: bool,
        seen: Mutex<Vec<(&'static str, Point, std::thread::ThreadId)>>,
        crashed: AtomicBool,
    }

    impl Recorder {
        fn note(&self, what: &'static str, point: Point) {
            stdx::sync::lock(&self.seen).push((what, point, std::thread::current().id()));
        }
    }

    impl FaultHooks for Recorder {
        fn disk(&self, point: Point) -> BoxFuture<'_, io::Result<()>> {
            self.note("disk", point);
            Box::pin(async move {
                if point == Point::SpecRemove {
                    Err(io::Error::other("injected"))
                } else {
                    Ok(())
                }
            })
        }
        fn on_disk_thread(&self, point: Point) {
            self.note("thread", point);
        }
        fn crash_point(&self, point: Point) {
            self.note("step", point);
            self.crashed.store(true, Ordering::Relaxed);
        }
        fn crashed(&self) -> bool {
            self.crashed.load(Ordering::Relaxed)
        }
        fn inline(&self) -> bool {
            self.inline
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn a_handle_passes_every_point_to_its_hooks_and_disk_work_runs_where_they_say() {
        for inline in [false, true] {
            let hooks = Arc::new(Recorder {
                inline,
                ..Recorder::default()
            });
            let f = Faults::new(hooks.clone());
            assert!(f.disk(Point::StateSave).await.is_ok());
            assert!(f.disk(Point::SpecRemove).await.is_err(), "the hook's error");
            assert!(!f.crashed());
            f.crash_point(Point::PrepareSaved);
            assert!(f.crashed());
            assert_eq!(f.inline(), inline);
            let here = std::thread::current().id();
            let worker = off_thread(&f, Point::SpecWrite, || std::thread::current().id())
                .await
                .unwrap();
            let seen = stdx::sync::lock(&hooks.seen).clone();
            let kinds: Vec<_> = seen
                .iter()
                .map(|(what, point, _)| (*what, *point))
                .collect();
            assert_eq!(
                kinds,
                [
                    ("disk", Point::StateSave),
                    ("disk", Point::SpecRemove),
                    ("step", Point::PrepareSaved),
                    ("thread", Point::SpecWrite),
                ]
            );
            // The thread hook runs on the thread that does the work: the blocking pool's, or
            // the caller's when inline.
            assert_eq!(seen[3].2, worker);
            assert_eq!(worker == here, inline, "inline: {inline}");
        }
    }

    #[tokio::test]
    async fn an_empty_handle_never_interferes() {
        let f = Faults::default();
        assert!(f.disk(Point::StateSave).await.is_ok());
        f.crash_point(Point::PrepareSaved);
        assert!(!f.crashed());
        assert!(!f.inline());
        assert_eq!(off_thread(&f, Point::StateSave, || 7).await.unwrap(), 7);
    }
}
