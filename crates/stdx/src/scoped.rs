//! [`ScopedLock`]: an async lock that is held only for a plain closure, so that holding it
//! across an `.await` does not compile.
//!
//! A lock held across an await is held for as long as whatever is awaited takes: a disk's fsync,
//! a peer's answer. Where that must never happen (resmgr's manager lock: the container runtime
//! waits for our answers under its own lock), a rule that every caller keeps by being careful is
//! one careless caller away from a deadlock. This lock makes it a type error instead: the only
//! way in is [`ScopedLock::with`], which takes the lock, runs a closure with the guard ([`Held`])
//! and lets go when the closure returns. A closure that is not `async` cannot await, and the
//! guard's lifetime is the closure's own (the closure is generic over it), so the guard cannot
//! leave it: not returned, not inside a returned future, not stored in a captured variable.
//!
//! `crates/stdx/tests/scoped_lock.rs` holds the compile-fail cases of each (trybuild, each pinned
//! to the error it expects) beside the same code without the guard held, which compiles. They are
//! why this lives here rather than in resmgr: a compile-fail test is built as a crate of its own
//! against the crate under test, and stdx builds in seconds where resmgr builds the Kubernetes
//! client.
//!
//! What the types cannot see is a closure that blocks (`std::fs`, `block_on`): resmgr refuses
//! those with clippy's `disallowed_methods` (its `clippy.toml`).

use std::{
    ops::{Deref, DerefMut},
    time::Duration,
};

use tokio::sync::{Mutex, MutexGuard};

/// An async mutex held only inside [`ScopedLock::with`]'s closure (see the module doc).
#[derive(Debug, Default)]
pub struct ScopedLock<T> {
    mutex: Mutex<T>,
}

/// The lock, held: what [`ScopedLock::with`] hands its closure. It cannot outlive the closure.
#[derive(Debug)]
pub struct Held<'a, T>(MutexGuard<'a, T>);

impl<T> ScopedLock<T> {
    /// A lock around `value`.
    pub fn new(value: T) -> Self {
        Self {
            mutex: Mutex::new(value),
        }
    }

    /// Waits for the lock, runs `f` with it held, and lets go when `f` returns: the one way to
    /// the value. Waiting is fair (tokio's mutex: first come, first served).
    pub async fn with<R>(&self, f: impl FnOnce(Held<'_, T>) -> R) -> R {
        f(Held(self.mutex.lock().await))
    }

    /// [`ScopedLock::with`] that also hands `f` how long the lock was waited for: zero when it
    /// was free, and then no clock is read, so that the common, uncontended case costs nothing
    /// more (a lock whose waits are watched, as resmgr's is, is taken on every runtime event).
    pub async fn with_waited<R>(&self, f: impl FnOnce(Held<'_, T>, Duration) -> R) -> R {
        let (guard, waited) = match self.mutex.try_lock() {
            Ok(guard) => (guard, Duration::ZERO),
            Err(_) => {
                let asked = tokio::time::Instant::now();
                let guard = self.mutex.lock().await;
                (guard, asked.elapsed())
            }
        };
        f(Held(guard), waited)
    }
}

impl<T> Deref for Held<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

impl<T> DerefMut for Held<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_closure_sees_what_the_last_one_left_and_its_result_comes_back() {
        let lock = ScopedLock::new(1);
        lock.with(|mut held| *held += 1).await;
        assert_eq!(lock.with(|held| *held * 10).await, 20);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_second_caller_waits_until_the_closure_has_returned() {
        let lock = std::sync::Arc::new(ScopedLock::new(()));
        let (holder, release) = held_on_another_thread(&lock).await;
        let second = lock.with(|_held| ());
        tokio::pin!(second);
        assert!(
            futures_poll_once(second.as_mut()).await.is_none(),
            "the lock was taken while the first closure held it"
        );
        release.send(()).unwrap();
        second.await;
        holder.await.unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_free_lock_was_waited_for_zero_and_a_held_one_for_longer() {
        let lock = std::sync::Arc::new(ScopedLock::new(()));
        assert_eq!(
            lock.with_waited(|_held, waited| waited).await,
            Duration::ZERO
        );
        let (holder, release) = held_on_another_thread(&lock).await;
        let second = lock.with_waited(|_held, waited| waited);
        tokio::pin!(second);
        assert!(futures_poll_once(second.as_mut()).await.is_none());
        release.send(()).unwrap();
        assert!(second.await > Duration::ZERO);
        holder.await.unwrap();
    }

    /// Takes `lock` on a blocking thread and holds it, inside its closure, until the returned
    /// sender sends; returns once it is held.
    async fn held_on_another_thread(
        lock: &std::sync::Arc<ScopedLock<()>>,
    ) -> (tokio::task::JoinHandle<()>, std::sync::mpsc::Sender<()>) {
        let (entered, wait_for_entry) = tokio::sync::oneshot::channel();
        let (release, released) = std::sync::mpsc::channel::<()>();
        let holder = {
            let lock = lock.clone();
            tokio::task::spawn_blocking(move || {
                tokio::runtime::Handle::current().block_on(lock.with(|_held| {
                    entered.send(()).unwrap();
                    released.recv().unwrap();
                }));
            })
        };
        wait_for_entry.await.unwrap();
        (holder, release)
    }

    /// Polls `f` once: `Some` if it completed.
    async fn futures_poll_once<F: std::future::Future + Unpin>(mut f: F) -> Option<F::Output> {
        std::future::poll_fn(|cx| {
            std::task::Poll::Ready(match std::pin::Pin::new(&mut f).poll(cx) {
                std::task::Poll::Ready(v) => Some(v),
                std::task::Poll::Pending => None,
            })
        })
        .await
    }
}
