//! [`lock`]: the one poison-tolerant lock of a std mutex, for every crate of the workspace.
//!
//! A std mutex is poisoned when a thread panics while holding it, and every later `lock()` then
//! fails. In the agent that cannot happen: a panic aborts it before anything unwinds
//! (ARCHITECTURE.md, "A panic stops the agent at once"). It can in what unwinds (tests, the
//! benchmarks), where a test that catches one panic must still read what the others left. Each
//! std mutex locked with this guards data a panic cannot leave invalid: plain values replaced in
//! one assignment (the Kubernetes API version cache, the in-memory claim store, the simulator's
//! container table, the NRI connection's call table), or the policy, whose contract is that a
//! failed call leaves it as it was; behind a poisoned lock the data is still the best there is.

use std::sync::{Mutex, MutexGuard, PoisonError};

/// Locks `mutex`, ignoring poisoning (see the module doc for why that is right here).
pub fn lock<T: ?Sized>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_poisoned_mutex_still_locks_with_its_last_value() {
        let mutex = Mutex::new(1);
        let _ = std::panic::catch_unwind(|| {
            let mut guard = mutex.lock().unwrap();
            *guard = 2;
            panic!("poisoning the mutex");
        });
        assert!(mutex.is_poisoned());
        assert_eq!(*lock(&mutex), 2);
    }
}
