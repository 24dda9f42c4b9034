//! One lock per claim: the prepares and unprepares of one claim run one at a time, in the order
//! they arrived ([`crate::claims`] says why); calls for different claims do not wait for each
//! other.

use std::{
    collections::HashMap,
    sync::{Arc, Weak},
};

use tokio::sync::{Mutex, OwnedMutexGuard};

/// One lock per claim UID in use, so that the prepares and unprepares of a claim run one at a
/// time, in the order they arrived (tokio's mutex is fair). Entries go when nobody holds or
/// waits for them.
#[derive(Debug, Default)]
pub(crate) struct ClaimLocks(std::sync::Mutex<HashMap<String, Weak<Mutex<()>>>>);

impl ClaimLocks {
    /// Waits for claim `uid`'s turn.
    pub(crate) async fn lock(&self, uid: &str) -> OwnedMutexGuard<()> {
        let lock = {
            let mut map = stdx::sync::lock(&self.0);
            map.retain(|_, w| w.strong_count() > 0);
            if let Some(lock) = map.get(uid).and_then(Weak::upgrade) {
                lock
            } else {
                let lock = Arc::new(Mutex::new(()));
                map.insert(uid.to_owned(), Arc::downgrade(&lock));
                lock
            }
        };
        lock.lock_owned().await
    }
}

#[cfg(test)]
mod tests {
    use futures::FutureExt;

    use super::*;

    fn entries(locks: &ClaimLocks) -> Vec<String> {
        let mut uids: Vec<String> = stdx::sync::lock(&locks.0).keys().cloned().collect();
        uids.sort();
        uids
    }

    #[tokio::test]
    async fn a_claims_lock_entry_goes_when_nobody_holds_or_waits_for_it() {
        let locks = ClaimLocks::default();
        let held = locks.lock("u1").await;
        drop(locks.lock("u2").await);
        // u2's entry is dead now, u1's is held: the next lock keeps only live ones.
        let _u3 = locks.lock("u3").await;
        assert_eq!(entries(&locks), ["u1", "u3"]);
        drop(held);
        let _u1 = locks.lock("u1").await;
        assert_eq!(entries(&locks), ["u1", "u3"]);
        drop(_u1);
        let _u4 = locks.lock("u4").await;
        assert_eq!(
            entries(&locks),
            ["u3", "u4"],
            "a claim no call holds or waits for leaves no entry behind"
        );
    }

    #[tokio::test]
    async fn calls_for_one_claim_take_turns_and_other_claims_do_not_wait() {
        let locks = ClaimLocks::default();
        let first = locks.lock("u1").await;
        // Another claim's turn comes at once.
        let other = locks.lock("u2").now_or_never();
        assert!(other.is_some(), "u2 waited for u1's call");
        // The same claim's waits until the first call ends.
        let mut second = Box::pin(locks.lock("u1"));
        assert!(
            (&mut second).now_or_never().is_none(),
            "a second call on u1 ran while the first held it"
        );
        drop(first);
        assert!(
            second.now_or_never().is_some(),
            "u1's next call got no turn"
        );
    }
}
