//! Unsolicited updates wait for a lull in the runtime's events.
//!
//! # Why
//!
//! On runtimes built with NRI before v0.12 (CRI-O 1.36 is on v0.11), the runtime side of
//! `UpdateContainers` takes the adaptation's lock and then the runtime's own NRI lock, while every
//! event takes the runtime's lock first and then the adaptation's: a lock-order inversion inside
//! the runtime (fixed in NRI v0.12: containerd/nri#301; for CRI-O: cri-o/cri-o#9835). An
//! `UpdateContainers` that reaches the adaptation's lock while an event holds the runtime's lock
//! and has yet to take the adaptation's deadlocks the runtime for good: every later container
//! operation of the node hangs behind it, and no timeout on our side undoes it. Two of the windows
//! are (1) between an event taking the runtime's lock and calling the plugins, and (2) in CRI-O's
//! RemoveContainer of a container that exited by itself, between its StopContainer, whose
//! reply's updates the runtime applies one `runc update` at a time under its lock, and its
//! RemoveContainer. The resource manager's e2e hung CRI-O this way: a claim's release sent its
//! updates while the runtime was stopping the previous agent's container.
//!
//! A third is ours to close outright: an update the runtime is slow to apply (`runc update` of a
//! container being killed waits for it) holds both locks, events queue for the runtime's, and a
//! second update sent meanwhile queues for the adaptation's ahead of them; when the first lets go,
//! the second takes the adaptation's lock and an event the runtime's. So the stub never sends an
//! update while the runtime has not answered the one before ([`super::Handle::update_containers`]).
//!
//! A plugin cannot see window (1) open, but events come in bursts (a pod's containers are stopped,
//! then its sandbox, then removed), and window (2) follows a reply of ours. So an unsolicited
//! update is sent only once no call of the runtime's is being handled and none has been for
//! [`UpdateLull::quiet`], plus [`UpdateLull::per_update`] for each update the last reply carried
//! (which the runtime is still applying); never later than [`UpdateLull::max_wait`], so a node
//! with a steady stream of events still gets its updates. It narrows the race to an event that
//! starts right as the runtime receives the update; only a runtime on NRI v0.12 or later closes
//! it. The wait is the same on every runtime: the announced NRI version of a fixed runtime would
//! save it, but a wait that depends on a version string would go untested on the runtimes the
//! tests use; and it costs nothing when no event is near, and an update at most
//! [`UpdateLull::max_wait`] when one is.

use std::time::Duration;

use tokio::{sync::watch, time::Instant};

/// How long an unsolicited update waits for the runtime's events to pause (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UpdateLull {
    /// How long after the runtime's last call was answered it counts as quiet.
    pub quiet: Duration,
    /// More quiet per update carried in that call's reply: the runtime applies them after it.
    pub per_update: Duration,
    /// The longest an update waits for quiet.
    pub max_wait: Duration,
}

impl UpdateLull {
    /// What the stub uses: a reply's update takes CRI-O one `runc update`, tens of milliseconds
    /// on a busy node.
    pub const DEFAULT: UpdateLull = UpdateLull {
        quiet: Duration::from_millis(50),
        per_update: Duration::from_millis(50),
        max_wait: Duration::from_secs(1),
    };

    /// No wait at all.
    pub const NONE: UpdateLull = UpdateLull {
        quiet: Duration::ZERO,
        per_update: Duration::ZERO,
        max_wait: Duration::ZERO,
    };
}

/// The runtime's calls being handled, and when the last one's effects settle.
#[derive(Debug, Clone, Copy)]
struct Calls {
    handling: usize,
    quiet_from: Option<Instant>,
}

/// Tracks the runtime's calls for [`UpdateLull`].
#[derive(Debug)]
pub(crate) struct Lull {
    config: UpdateLull,
    calls: watch::Sender<Calls>,
}

impl Lull {
    pub fn new(config: UpdateLull) -> Self {
        let calls = Calls {
            handling: 0,
            quiet_from: None,
        };
        Self {
            config,
            calls: watch::channel(calls).0,
        }
    }

    /// A call of the runtime's is being handled until the returned guard is dropped.
    pub fn handling(&self) -> Handling<'_> {
        self.calls.send_modify(|c| c.handling += 1);
        Handling {
            lull: self,
            updates: 0,
        }
    }

    /// Waits until the runtime's calls pause, or [`UpdateLull::max_wait`] has passed.
    pub async fn wait(&self) {
        let deadline = Instant::now() + self.config.max_wait;
        let mut rx = self.calls.subscribe();
        loop {
            let calls = *rx.borrow_and_update();
            let now = Instant::now();
            if now >= deadline {
                if calls.handling != 0 || calls.quiet_from.is_some_and(|q| q > now) {
                    tracing::debug!(
                        waited = ?self.config.max_wait,
                        "the runtime's events did not pause; sending the update anyway"
                    );
                }
                return;
            }
            let until = match (calls.handling, calls.quiet_from) {
                (0, None) => return,
                (0, Some(q)) if q <= now => return,
                (0, Some(q)) => q.min(deadline),
                _ => deadline,
            };
            // A change (a call begins or ends) re-evaluates; so does reaching `until`.
            tokio::select! {
                changed = rx.changed() => {
                    if changed.is_err() {
                        return;
                    }
                }
                () = tokio::time::sleep_until(until) => {}
            }
        }
    }
}

/// A runtime call being handled (see [`Lull::handling`]).
#[derive(Debug)]
pub(crate) struct Handling<'a> {
    lull: &'a Lull,
    updates: usize,
}

impl Handling<'_> {
    /// The call's reply carries `n` updates, which the runtime applies after it.
    pub fn replied_with(&mut self, n: usize) {
        self.updates = n;
    }
}

impl Drop for Handling<'_> {
    fn drop(&mut self) {
        let config = &self.lull.config;
        let n = u32::try_from(self.updates).unwrap_or(u32::MAX);
        let settles = Instant::now() + config.quiet + config.per_update.saturating_mul(n);
        self.lull.calls.send_modify(|c| {
            c.handling -= 1;
            c.quiet_from = Some(c.quiet_from.map_or(settles, |q| q.max(settles)));
        });
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn lull() -> Arc<Lull> {
        Arc::new(Lull::new(UpdateLull {
            quiet: 50 * MS,
            per_update: 20 * MS,
            max_wait: 1000 * MS,
        }))
    }

    /// How long `wait` takes from now, on the paused clock.
    async fn waited(lull: &Lull) -> Duration {
        let start = Instant::now();
        lull.wait().await;
        start.elapsed()
    }

    #[tokio::test(start_paused = true)]
    async fn with_no_call_ever_an_update_goes_at_once() {
        assert_eq!(waited(&lull()).await, Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn an_update_waits_for_the_quiet_after_a_call_and_each_update_of_its_reply() {
        let lull = lull();
        lull.handling().replied_with(2);
        assert_eq!(waited(&lull).await, 90 * MS);
        // Quiet since: no wait.
        assert_eq!(waited(&lull).await, Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn an_update_waits_while_a_call_is_handled_then_for_the_quiet_after_it() {
        let lull = lull();
        let call = lull.handling();
        let waiter = tokio::spawn({
            let lull = lull.clone();
            async move { waited(&lull).await }
        });
        tokio::time::sleep(200 * MS).await;
        drop(call);
        assert_eq!(waiter.await.unwrap(), 250 * MS);
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_during_the_quiet_starts_it_again() {
        let lull = lull();
        drop(lull.handling());
        let waiter = tokio::spawn({
            let lull = lull.clone();
            async move { waited(&lull).await }
        });
        tokio::time::sleep(30 * MS).await;
        lull.handling().replied_with(1);
        assert_eq!(waiter.await.unwrap(), 100 * MS);
    }

    #[tokio::test(start_paused = true)]
    async fn an_earlier_quiet_does_not_cut_a_later_one_short() {
        let lull = lull();
        let long = lull.handling();
        let mut short = lull.handling();
        short.replied_with(3);
        drop(short);
        drop(long);
        // The first call to end settles at 110 ms; the second's 50 ms does not shorten that.
        assert_eq!(waited(&lull).await, 110 * MS);
    }

    #[tokio::test(start_paused = true)]
    async fn a_steady_stream_of_calls_delays_an_update_by_max_wait_at_most() {
        let lull = lull();
        let _stuck = lull.handling();
        assert_eq!(waited(&lull).await, 1000 * MS);
    }

    #[tokio::test(start_paused = true)]
    async fn none_never_waits() {
        let lull = Lull::new(UpdateLull::NONE);
        let _call = lull.handling();
        assert_eq!(waited(&lull).await, Duration::ZERO);
    }
}
