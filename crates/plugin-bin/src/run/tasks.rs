//! The agent's background tasks, their one cancellation, and why the agent stops.
//!
//! Every task of `resmgr run` is spawned through [`Tasks`]. The first one to end with a
//! [`Stop`] (the signal listener, the runtime connection when the runtime goes away, any task
//! that fails) records why and cancels the others; a reason that comes later is only logged. So
//! a signal, a lost runtime and a failed task all lead to the same drain ([`Tasks::drain`]), in
//! two steps:
//!
//! 1. the tasks that serve (HTTP servers, the kubelet plugin, the publishers) stop: those spawned
//!    with [`Tasks::spawn`] are dropped, those spawned with [`Tasks::spawn_graceful`] finish what
//!    is in flight (the kubelet plugin deregisters and answers the calls it has), and the drain
//!    waits for them, up to a deadline;
//! 2. after the caller saved the state, the tasks spawned with [`Tasks::spawn_until_exit`] are
//!    dropped: the runtime connection and what works for it. The runtime waits for our answer to
//!    every container event, so one that arrives while the agent drains is answered, not left to
//!    the runtime's timeout.
//!
//! A task spawned once the agent is stopping is not started.
//!
//! A panic is not a way to stop: it aborts the process where it happens (`crate::panics`), before
//! any task could see it, so no drain saves what the panic left half-changed.

use std::{
    future::Future,
    sync::{Arc, Mutex},
    time::Duration,
};

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{error, warn};

/// Why the agent stops.
#[derive(Debug)]
pub enum Stop {
    /// SIGTERM or SIGINT: a clean stop.
    Signal(&'static str),
    /// The runtime closed the NRI connection. The claim gate never closes, so the agent exits to
    /// be restarted (the DaemonSet does it) and synchronizes afresh.
    RuntimeLost(String),
    /// A task failed.
    Failed {
        task: &'static str,
        error: anyhow::Error,
    },
}

impl Stop {
    /// A failure of `task`.
    pub fn failed(task: &'static str, error: anyhow::Error) -> Self {
        Self::Failed { task, error }
    }

    /// Logs why the agent stops, as it begins to.
    fn log_stopping(&self) {
        match self {
            Self::Signal(name) => tracing::info!(signal = name, "stopping"),
            Self::RuntimeLost(why) => {
                error!(reason = %why, "lost the runtime connection: stopping")
            }
            Self::Failed { task, error } => error!(
                task,
                error = %stdx::errors::chain(&**error),
                "a task of the agent failed: stopping"
            ),
        }
    }
}

/// Tasks of one phase, by name.
type Running = Mutex<Vec<(&'static str, JoinHandle<()>)>>;

/// The agent's tasks; cheap to clone, so that a task can spawn more.
#[derive(Debug, Clone, Default)]
pub struct Tasks {
    inner: Arc<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    /// Cancelled when the agent stops: step 1 of the drain.
    stopping: CancellationToken,
    /// Cancelled once the state is saved: step 2.
    exiting: CancellationToken,
    /// The first reason to stop.
    reason: Mutex<Option<Stop>>,
    serving: Running,
    lasting: Running,
}

impl Tasks {
    pub fn new() -> Self {
        Self::default()
    }

    /// Stops the agent for `why`, unless it is stopping already (then `why` is only logged).
    pub fn stop(&self, why: Stop) {
        let mut reason = stdx::sync::lock(&self.inner.reason);
        if reason.is_some() {
            match &why {
                Stop::Signal(name) => warn!(signal = name, "already stopping"),
                Stop::RuntimeLost(r) => {
                    warn!(reason = %r, "lost the runtime connection while stopping")
                }
                Stop::Failed { task, error } => warn!(
                    task,
                    error = %stdx::errors::chain(&**error),
                    "a task failed while stopping"
                ),
            }
            return;
        }
        why.log_stopping();
        *reason = Some(why);
        drop(reason);
        self.inner.stopping.cancel();
    }

    /// Whether the agent is stopping.
    pub fn is_stopping(&self) -> bool {
        self.inner.stopping.is_cancelled()
    }

    /// Resolves once the agent stops.
    pub async fn stopping(&self) {
        self.inner.stopping.cancelled().await;
    }

    /// Runs `task` until it ends or the agent stops, whichever is first. An error stops the
    /// agent.
    pub fn spawn<F>(&self, name: &'static str, task: F)
    where
        F: Future<Output = Result<(), Stop>> + Send + 'static,
    {
        let stopping = self.inner.stopping.clone();
        self.start(&self.inner.serving, name, async move {
            stopping.run_until_cancelled(task).await.unwrap_or(Ok(()))
        });
    }

    /// Runs `task`, which ends by itself once the agent stops (see [`Tasks::stopping`]) after
    /// finishing what is in flight: the drain waits for it. An error stops the agent.
    pub fn spawn_graceful<F>(&self, name: &'static str, task: F)
    where
        F: Future<Output = Result<(), Stop>> + Send + 'static,
    {
        self.start(&self.inner.serving, name, task);
    }

    /// Runs `task` until it ends or the state is saved at the end of the drain. An error stops
    /// the agent.
    pub fn spawn_until_exit<F>(&self, name: &'static str, task: F)
    where
        F: Future<Output = Result<(), Stop>> + Send + 'static,
    {
        let exiting = self.inner.exiting.clone();
        self.start(&self.inner.lasting, name, async move {
            exiting.run_until_cancelled(task).await.unwrap_or(Ok(()))
        });
    }

    fn start<F>(&self, running: &Running, name: &'static str, task: F)
    where
        F: Future<Output = Result<(), Stop>> + Send + 'static,
    {
        let mut running = stdx::sync::lock(running);
        if self.is_stopping() {
            tracing::debug!(task = name, "not started: the agent is stopping");
            return;
        }
        let tasks = self.clone();
        let handle = tokio::spawn(async move {
            if let Err(stop) = task.await {
                tasks.stop(stop);
            }
        });
        running.retain(|(_, h)| !h.is_finished());
        running.push((name, handle));
    }

    /// Waits until the agent stops; returns why.
    pub async fn stopped(&self) -> Stop {
        self.stopping().await;
        stdx::sync::lock(&self.inner.reason)
            .take()
            .unwrap_or(Stop::Signal("stop"))
    }

    /// Step 1 of the drain: waits, up to `deadline`, for the serving tasks to end (the agent must
    /// be stopping: see [`Tasks::stopped`]), then drops those still running. Returns the names of
    /// those, which the caller logs.
    pub async fn drain_serving(&self, deadline: Duration) -> Vec<&'static str> {
        debug_assert!(self.is_stopping());
        drain(&self.inner.serving, deadline).await
    }

    /// Step 2 of the drain, once the state is saved: ends the tasks that run until the exit.
    pub async fn drain_lasting(&self, deadline: Duration) -> Vec<&'static str> {
        self.inner.exiting.cancel();
        drain(&self.inner.lasting, deadline).await
    }
}

/// Waits up to `deadline` for every task of `running`, then aborts the rest; their names.
async fn drain(running: &Running, deadline: Duration) -> Vec<&'static str> {
    let mut tasks = std::mem::take(&mut *stdx::sync::lock(running));
    let wait = futures::future::join_all(tasks.iter_mut().map(|(_, handle)| handle));
    let _ = tokio::time::timeout(deadline, wait).await;
    let mut late = Vec::new();
    for (name, handle) in tasks {
        if !handle.is_finished() {
            handle.abort();
            late.push(name);
        }
    }
    late
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::*;

    /// Sets its flag when dropped: a task's future was dropped, or ran to its end.
    #[derive(Debug, Clone, Default)]
    struct Dropped(Arc<AtomicBool>);

    impl Dropped {
        fn guard(&self) -> Guard {
            Guard(self.0.clone())
        }

        fn is_set(&self) -> bool {
            self.0.load(Ordering::SeqCst)
        }
    }

    #[derive(Debug)]
    struct Guard(Arc<AtomicBool>);

    impl Drop for Guard {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }

    /// A task that runs until it is dropped.
    fn forever(dropped: &Dropped) -> impl Future<Output = Result<(), Stop>> + Send + 'static {
        let guard = dropped.guard();
        async move {
            let _guard = guard;
            std::future::pending().await
        }
    }

    #[tokio::test]
    async fn a_failing_task_stops_the_agent_and_is_why() {
        let tasks = Tasks::new();
        let serving = Dropped::default();
        tasks.spawn("server", forever(&serving));
        tasks.spawn("broken", async {
            Err(Stop::failed("broken", anyhow::anyhow!("it broke")))
        });
        let Stop::Failed { task, error } = tasks.stopped().await else {
            panic!("not stopped for the failure");
        };
        assert_eq!((task, error.to_string().as_str()), ("broken", "it broke"));
        assert_eq!(
            tasks.drain_serving(Duration::from_secs(10)).await,
            Vec::<&str>::new()
        );
        assert!(serving.is_set(), "the other task was dropped");
    }

    #[tokio::test]
    async fn the_first_reason_to_stop_wins() {
        let tasks = Tasks::new();
        tasks.stop(Stop::Signal("SIGTERM"));
        tasks.stop(Stop::RuntimeLost("gone".into()));
        tasks.spawn("late", async {
            Err(Stop::failed("late", anyhow::anyhow!("after the stop")))
        });
        assert!(matches!(tasks.stopped().await, Stop::Signal("SIGTERM")));
    }

    #[tokio::test]
    async fn a_task_that_ends_well_stops_nothing() {
        let tasks = Tasks::new();
        let (done_tx, done_rx) = tokio::sync::oneshot::channel();
        tasks.spawn("one-off", async move {
            let _ = done_tx.send(());
            Ok(())
        });
        done_rx.await.unwrap();
        assert!(!tasks.is_stopping());
    }

    #[tokio::test]
    async fn the_drain_waits_for_graceful_tasks_and_keeps_the_lasting_ones_until_the_exit() {
        let tasks = Tasks::new();
        let finished = Arc::new(AtomicBool::new(false));
        let lasting = Dropped::default();
        let cut = Dropped::default();
        tasks.spawn("cut", forever(&cut));
        tasks.spawn_until_exit("runtime", forever(&lasting));
        tasks.spawn_graceful("kubelet", {
            let tasks = tasks.clone();
            let finished = finished.clone();
            async move {
                tasks.stopping().await;
                // What is in flight is finished after the stop: a yield stands for it.
                tokio::task::yield_now().await;
                finished.store(true, Ordering::SeqCst);
                Ok(())
            }
        });
        tasks.stop(Stop::Signal("SIGTERM"));
        assert_eq!(
            tasks.drain_serving(Duration::from_secs(10)).await,
            Vec::<&str>::new()
        );
        assert!(
            finished.load(Ordering::SeqCst),
            "the graceful task finished"
        );
        assert!(cut.is_set());
        assert!(
            !lasting.is_set(),
            "the runtime connection lasts until the state is saved"
        );
        assert_eq!(
            tasks.drain_lasting(Duration::from_secs(10)).await,
            Vec::<&str>::new()
        );
        assert!(lasting.is_set());
    }

    #[tokio::test]
    async fn tasks_still_running_at_the_deadline_are_named_and_dropped() {
        let tasks = Tasks::new();
        let stuck = Dropped::default();
        tasks.spawn_graceful("stuck", forever(&stuck));
        tasks.stop(Stop::Signal("SIGINT"));
        // The task never ends, so any deadline finds it running.
        assert_eq!(
            tasks.drain_serving(Duration::from_millis(10)).await,
            ["stuck"]
        );
        // The abort takes effect when the runtime next polls the task.
        tokio::task::yield_now().await;
        assert!(stuck.is_set());
    }

    #[tokio::test]
    async fn nothing_starts_once_the_agent_is_stopping() {
        let tasks = Tasks::new();
        tasks.stop(Stop::Signal("SIGTERM"));
        let started = Arc::new(AtomicBool::new(false));
        tasks.spawn_until_exit("late", {
            let started = started.clone();
            async move {
                started.store(true, Ordering::SeqCst);
                Ok(())
            }
        });
        tasks.drain_serving(Duration::from_secs(1)).await;
        tasks.drain_lasting(Duration::from_secs(1)).await;
        assert!(!started.load(Ordering::SeqCst));
    }
}
