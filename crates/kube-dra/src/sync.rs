//! [`lock`]: the one poison-tolerant lock of a std mutex, for this crate, resmgr and the binary
//! (resmgr re-exports it as `resmgr::sync`). It lives here because this is the lowest crate that
//! needs it.
//!
//! A std mutex is poisoned when a thread panics while holding it, and every later `lock()` then
//! fails. Each std mutex locked with it guards data a panic cannot leave invalid: plain values
//! replaced in one assignment (the Kubernetes API version cache, the in-memory claim store, the
//! simulator's container table), or the policy, whose contract is that a failed call leaves it as
//! it was. Behind a poisoned lock the data is still the best there is, and failing every later
//! lock would turn one panic into an agent that no longer answers. (resmgr's manager lock is
//! tokio's, which does not poison.)

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
