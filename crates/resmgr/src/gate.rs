//! The claim gate: claims wait for the runtime's synchronization.
//!
//! Before the runtime's Synchronize has been handled, the policy has not seen the running
//! containers: CPUs it would grant a claim may be in use, and updates it would send could race
//! with the Synchronize reply and be overtaken by it. So the kubelet's requests are refused, as a
//! whole, until the gate opens. It opens once, after the Synchronize reply (carrying the
//! synchronized updates) has been written to the runtime and the updates still pending have been
//! delivered, and never closes while the agent owns the node: losing the runtime connection
//! ends the process.
//!
//! A call that arrives before the gate settles is held until it does, up to a bound
//! ([`crate::claims::HOLD`]), rather than refused at once: a refused prepare costs the pod the
//! kubelet's resync, 60 to 90 s, and the runtime's Synchronize usually comes within a second of
//! the agent's start. Nothing is allocated while it is held.
//!
//! The gate also shuts when the agent begins to hand the node over to its successor
//! ([`crate::handover`]): calls that arrive then are held, not refused, until the handover is
//! done (then refused, naming the successor: the claims are its to serve, and the kubelet calls
//! it) or called off because the successor went away (then served: the agent keeps the node).
//!
//! Instead of opening, the Synchronize may find that serving claims could grant the same CPUs
//! twice (a contested claim, [`crate::reconcile`]): then the gate stays shut to prepares for
//! good, and says why, until an operator restarts the agent. Unprepares pass a refusing gate
//! ([`crate::claims`]): they only give CPUs back, and may release the claim the contest is with.

use tokio::sync::watch;

#[derive(Debug, Clone, PartialEq, Eq)]
enum State {
    Synchronizing,
    Open,
    Refusing(String),
    /// The node is being handed over to the agent of this pod: calls are held; the state it
    /// goes back to if the handover is called off.
    HandingOver {
        to: String,
        before: Box<State>,
    },
    /// The node was handed over to the agent of this pod ([`crate::handover`]).
    HandedOver(String),
}

/// A one-way latch shared by the NRI side (which opens it) and the kubelet side (which asks).
#[derive(Debug, Clone)]
pub struct Gate {
    state: watch::Sender<State>,
}

impl Default for Gate {
    fn default() -> Self {
        Self {
            state: watch::Sender::new(State::Synchronizing),
        }
    }
}

impl Gate {
    /// Whether claims may be served.
    pub fn is_open(&self) -> bool {
        *self.state.borrow() == State::Open
    }

    /// Why claims are refused although the runtime synchronized, if they are.
    pub fn refusal(&self) -> Option<String> {
        match &*self.state.borrow() {
            State::Refusing(why) => Some(why.clone()),
            _ => None,
        }
    }

    /// Opens the gate for good. Opening an open gate does nothing; a refusing gate stays shut.
    pub fn open(&self) {
        self.state.send_if_modified(|s| {
            let opens = *s == State::Synchronizing;
            if opens {
                *s = State::Open;
            }
            opens
        });
    }

    /// Keeps the gate shut for good, saying why, instead of opening it.
    pub fn refuse(&self, why: String) {
        self.state.send_if_modified(|s| {
            let refuses = *s == State::Synchronizing;
            if refuses {
                *s = State::Refusing(why);
            }
            refuses
        });
    }

    /// Waits until the gate is open.
    pub async fn opened(&self) {
        let mut rx = self.state.subscribe();
        // The sender lives in `self`, so the channel cannot close while we wait.
        let _ = rx.wait_for(|s| *s == State::Open).await;
    }

    /// Waits until the runtime's synchronization has been handled and no handover is under
    /// way: the gate is open, refusing, or handed over.
    pub async fn settled(&self) {
        let mut rx = self.state.subscribe();
        let _ = rx
            .wait_for(|s| !matches!(s, State::Synchronizing | State::HandingOver { .. }))
            .await;
    }

    /// Whether a handover is under way: calls are held until it is done or called off.
    pub fn handing_over(&self) -> bool {
        matches!(*self.state.borrow(), State::HandingOver { .. })
    }

    /// Shuts the gate while the node is handed over to the agent of pod `to`: calls are held
    /// until [`Gate::hand_over`] or [`Gate::call_off`].
    pub fn begin_handover(&self, to: &str) {
        self.state.send_modify(|s| {
            let before = std::mem::replace(s, State::Synchronizing);
            *s = State::HandingOver {
                to: to.to_owned(),
                before: Box::new(before),
            };
        });
    }

    /// The handover begun is called off: the gate is as it was before.
    pub fn call_off(&self) {
        self.state.send_if_modified(|s| match s {
            State::HandingOver { before, .. } => {
                *s = std::mem::replace(before, State::Synchronizing);
                true
            }
            _ => false,
        });
    }

    /// Shuts the gate for good: the node was handed over to the agent of pod `to`. Whatever
    /// state it was in.
    pub fn hand_over(&self, to: &str) {
        self.state.send_replace(State::HandedOver(to.to_owned()));
    }

    /// The pod whose agent the node was handed over to, if it was.
    pub fn handed_over_to(&self) -> Option<String> {
        match &*self.state.borrow() {
            State::HandedOver(to) => Some(to.clone()),
            _ => None,
        }
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
        gate.refuse("too late".into());
        assert!(
            gate.is_open() && gate.refusal().is_none(),
            "an open gate stays open"
        );
    }

    #[tokio::test]
    async fn a_handover_holds_calls_until_it_is_done_or_called_off() {
        let gate = Gate::default();
        gate.open();
        gate.begin_handover("next");
        assert!(!gate.is_open() && gate.handing_over());
        let held = tokio::time::timeout(std::time::Duration::ZERO, gate.settled()).await;
        assert!(
            held.is_err(),
            "a call is held while the node is handed over"
        );
        gate.call_off();
        assert!(gate.is_open(), "called off: open again");
        gate.settled().await;
        gate.begin_handover("next");
        let waiter = tokio::spawn({
            let gate = gate.clone();
            async move { gate.settled().await }
        });
        gate.hand_over("next");
        waiter.await.unwrap();
        assert_eq!(gate.handed_over_to().as_deref(), Some("next"));
        gate.call_off();
        assert!(!gate.is_open(), "handed over is for good");
    }

    #[test]
    fn a_refusing_gate_says_why_and_never_opens() {
        let gate = Gate::default();
        assert_eq!(gate.refusal(), None, "synchronizing is no refusal");
        gate.refuse("claim c1 is contested".into());
        gate.open();
        assert!(!gate.is_open());
        assert_eq!(gate.refusal().as_deref(), Some("claim c1 is contested"));
    }
}
