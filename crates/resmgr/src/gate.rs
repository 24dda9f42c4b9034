//! The claim gate: claims wait for the runtime's synchronization.
//!
//! Before the runtime's Synchronize has been handled, the policy has not seen the running
//! containers: CPUs it would grant a claim may be in use, and updates it would send could race
//! with the Synchronize reply and be overtaken by it. So the kubelet's requests are refused, as a
//! whole, until the gate opens. It opens once, after the Synchronize reply (carrying the
//! synchronized updates) has been written to the runtime and the updates still pending have been
//! delivered, and never closes: losing the runtime connection ends the process.

use tokio::sync::watch;

/// A one-way latch shared by the NRI side (which opens it) and the kubelet side (which asks).
#[derive(Debug, Clone)]
pub struct Gate {
    open: watch::Sender<bool>,
}

impl Default for Gate {
    fn default() -> Self {
        Self {
            open: watch::Sender::new(false),
        }
    }
}

impl Gate {
    /// Whether claims may be served.
    pub fn is_open(&self) -> bool {
        *self.open.borrow()
    }

    /// Opens the gate for good. Opening an open gate does nothing.
    pub fn open(&self) {
        self.open.send_replace(true);
    }

    /// Waits until the gate is open.
    pub async fn opened(&self) {
        let mut rx = self.open.subscribe();
        // The sender lives in `self`, so the channel cannot close while we wait.
        let _ = rx.wait_for(|open| *open).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn opens_once_and_wakes_waiters() {
        let gate = Gate::default();
        assert!(!gate.is_open());
        // A zero timeout polls the wait exactly once: closed, it is still pending.
        let early = tokio::time::timeout(std::time::Duration::ZERO, gate.opened()).await;
        assert!(early.is_err(), "opened() returned before the gate opened");
        let waiter = tokio::spawn({
            let gate = gate.clone();
            async move { gate.opened().await }
        });
        gate.open();
        waiter.await.unwrap();
        assert!(gate.is_open());
        gate.open();
        assert!(gate.is_open());
    }
}
