//! Who owns the node: taking it (from a free state directory, or from the agent that owns it, by
//! handover), giving it to the next agent, and what the rest of the agent reads of it.
//!
//! The protocol and the manager's part are [`resmgr::handover`]'s; this module is their wiring
//! into `resmgr run`: when the kubelet plugin registers (before the node is owned, so that the
//! kubelet calls this agent and its calls are held rather than refused), when the old agent is
//! told to go (once the kubelet has connected to this one), and what the old agent stops (its
//! runtime connection, then its kubelet plugin and publishers).
//!
//! A new agent that finds the state directory locked:
//! - asks the owner over `<state-dir>/handover.sock`; accepted, it takes the node over
//!   ([`Standing::TakingOver`]);
//! - with nobody answering there (an owner of a release without handovers, or one that is
//!   dying), it waits for the lock in [`Standing::Standby`]: registered with the kubelet,
//!   holding its calls, and ready, because the DaemonSet deletes the old pod only once the new
//!   one is ready, and that is what frees the lock;
//! - refused (it is a restarted container of a pod that handed the node over already), it waits
//!   unregistered and unready in [`Standing::Refused`] until the lock is free.

use std::{
    collections::BTreeSet,
    sync::{Arc, OnceLock},
    time::Duration,
};

use kubelet_plugin::RegistrationState;
use resmgr::{
    Manager,
    faults::Faults,
    handover::{self, AskError, HandoverError, Hello, Owner, Surrender},
    points::Point,
    runtime::BoxFuture,
    state::{StateError, StateFile, StateLock},
};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// How long a new agent waits for the state directory's lock once the owner broke the exchange
/// off, or let the lock go rather than passing it: the kernel lets a lock go as its holder
/// dies, within moments. Held longer, another agent took it (one waiting in standby polls it
/// every [`LOCK_POLL`]), and the new agent asks that one for the node rather than hold its
/// calls for a lock that is not coming: the agent that asks on goes back to polling too, if the
/// holder cannot be asked.
const LOCK_WAIT: Duration = Duration::from_secs(2);

/// How often an agent that cannot take the node over yet looks whether the lock is free.
const LOCK_POLL: Duration = Duration::from_secs(1);

/// Where the agent stands with the node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Standing {
    /// The state directory is not looked at yet.
    Starting,
    /// The owner agreed to hand the node over to this agent.
    TakingOver {
        /// The owner's pod.
        from: String,
    },
    /// Another agent owns the node and nobody answers on its handover socket: this one is
    /// registered, holds the kubelet's calls, and takes the node once that agent is gone.
    Standby {
        /// Why it cannot ask.
        why: String,
    },
    /// The owner refused to hand the node over to this agent: it waits, unregistered.
    Refused {
        /// The owner's reason.
        why: String,
    },
    /// This agent owns the node.
    Owner,
    /// This agent handed the node over.
    HandedOver {
        /// The successor's pod.
        to: String,
    },
}

/// What the agent's tasks share about the node.
#[derive(Debug)]
pub struct Node {
    standing: watch::Sender<Standing>,
    /// Set once the agent owns the node.
    manager: OnceLock<Arc<Manager>>,
    manager_set: watch::Sender<bool>,
    /// Whether, and as which registration, the kubelet plugin should be registered: 0 when it
    /// should not be (not yet, or an agent in standby that the owner then refused), and a new
    /// number each time it should register again.
    register: watch::Sender<u64>,
    /// Registrations asked for so far: each is numbered anew.
    registrations: std::sync::atomic::AtomicU64,
    /// The kubelet plugin's registration state and its count of the kubelet's connections, once
    /// it serves.
    kubelet: watch::Sender<Option<Kubelet>>,
    /// Cancelled to close the runtime connection for a handover.
    pub surrender: CancellationToken,
    /// Set once the runtime connection is closed for a handover.
    pub runtime_closed: watch::Sender<bool>,
    /// The agent's fault hooks (none in the shipped binary): the manager's, and passed at the
    /// new agent's steps of a takeover.
    faults: Faults,
}

/// What the kubelet plugin tells of the kubelet.
#[derive(Debug, Clone)]
pub struct Kubelet {
    pub registration: watch::Receiver<RegistrationState>,
    pub connections: watch::Receiver<u64>,
}

impl Default for Node {
    fn default() -> Self {
        Self::new(Faults::default())
    }
}

impl Node {
    /// A node not taken yet, for an agent with `faults`.
    pub fn new(faults: Faults) -> Self {
        Self {
            standing: watch::Sender::new(Standing::Starting),
            manager: OnceLock::new(),
            manager_set: watch::Sender::new(false),
            register: watch::Sender::new(0),
            registrations: std::sync::atomic::AtomicU64::new(0),
            kubelet: watch::Sender::new(None),
            surrender: CancellationToken::new(),
            runtime_closed: watch::Sender::new(false),
            faults,
        }
    }

    /// The agent's fault hooks.
    pub fn faults(&self) -> &Faults {
        &self.faults
    }

    /// Where the agent stands now.
    pub fn standing(&self) -> Standing {
        self.standing.borrow().clone()
    }

    fn set_standing(&self, standing: Standing) {
        self.standing.send_replace(standing);
    }

    /// The manager, once the agent owns the node.
    pub fn manager(&self) -> Option<&Arc<Manager>> {
        self.manager.get()
    }

    /// Waits for the manager until `deadline`, or until the agent that owns the node refuses
    /// this one: it deregisters then, and a call it held is better refused at once, for the
    /// kubelet to retry with the agent it calls now.
    pub async fn manager_until(&self, deadline: tokio::time::Instant) -> Option<Arc<Manager>> {
        let mut set = self.manager_set.subscribe();
        let mut standing = self.standing.subscribe();
        tokio::select! {
            _ = tokio::time::timeout_at(deadline, set.wait_for(|s| *s)) => {}
            _ = standing.wait_for(|s| matches!(s, Standing::Refused { .. })) => {}
        }
        self.manager.get().cloned()
    }

    /// Waits until the agent owns the node and its claim gate is open.
    pub async fn opened(&self) {
        let mut set = self.manager_set.subscribe();
        let _ = set.wait_for(|s| *s).await;
        if let Some(manager) = self.manager.get() {
            manager.gate().opened().await;
        }
    }

    /// Resolves once the agent handed the node over.
    pub async fn handed_over(&self) {
        let mut standing = self.standing.subscribe();
        let _ = standing
            .wait_for(|s| matches!(s, Standing::HandedOver { .. }))
            .await;
    }

    /// Tells the kubelet plugin to register, unless it is.
    fn register(&self) {
        let next = self
            .registrations
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            + 1;
        self.register.send_if_modified(|r| {
            if *r == 0 {
                *r = next;
                true
            } else {
                false
            }
        });
    }

    /// Tells the kubelet plugin to deregister: the kubelet calls the newest agent registered,
    /// and one that the owner refuses would only hold its calls until they fail.
    fn deregister(&self) {
        self.kubelet.send_replace(None);
        self.register.send_replace(0);
    }

    /// Resolves once the kubelet plugin should register: with the registration.
    pub async fn registering(&self) -> u64 {
        let mut register = self.register.subscribe();
        let registration = register.wait_for(|r| *r != 0).await.map(|r| *r);
        // The sender lives as long as the node; an agent without one registers nothing.
        match registration {
            Ok(r) => r,
            Err(_) => std::future::pending().await,
        }
    }

    /// Resolves once the kubelet plugin should no longer be registered as `registration`: it
    /// should deregister, or register anew.
    pub async fn registration_ends(&self, registration: u64) {
        let mut register = self.register.subscribe();
        let _ = register.wait_for(|r| *r != registration).await;
    }

    /// The kubelet plugin serves: what it tells of the kubelet.
    pub fn kubelet_serves(&self, kubelet: Kubelet) {
        self.kubelet.send_replace(Some(kubelet));
    }

    /// The kubelet's view of the plugin, once it serves.
    pub fn kubelet(&self) -> Option<Kubelet> {
        self.kubelet.borrow().clone()
    }

    /// Waits up to [`handover::KUBELET_WAIT`] until the kubelet has registered the plugin and
    /// connected to it: from then on it calls this agent rather than an older one. Whether it
    /// did.
    async fn kubelet_connected(&self) -> bool {
        let wait = async {
            let mut kubelet = self.kubelet.subscribe();
            let k = match kubelet.wait_for(Option::is_some).await {
                Ok(k) => k.clone(),
                Err(_) => return,
            };
            let Some(k) = k else { return };
            let mut registration = k.registration.clone();
            let mut connections = k.connections.clone();
            let _ = registration
                .wait_for(|r| *r == RegistrationState::Registered)
                .await;
            let _ = connections.wait_for(|n| *n > 0).await;
        };
        tokio::time::timeout(handover::KUBELET_WAIT, wait)
            .await
            .is_ok()
    }

    /// Takes the node: the state directory's lock, directly when it is free, or from the
    /// agent that holds it. Returns the lock and the pods whose agents handed the node over to
    /// this one. `pod`: what the agent says of its pod when it asks (none: one agent per node,
    /// a second one refuses to start). `dra`: whether the agent registers with the kubelet.
    ///
    /// Until it has the node it looks again every second: the lock may have come free (its
    /// holder died or exited), or a new owner may serve the handover socket (the one it asked
    /// went, or handed the node to another new agent first). It never finds the lock free in
    /// the middle of a handover: the owner passes it to its successor, held.
    pub async fn take(
        &self,
        state_file: &StateFile,
        pod: Option<&Hello>,
        dra: bool,
    ) -> anyhow::Result<(StateLock, BTreeSet<String>)> {
        loop {
            let in_use = match state_file.lock() {
                Ok(lock) => return self.owned(lock, BTreeSet::new(), dra).await,
                Err(e @ StateError::InUse { .. }) => e,
                Err(e) => return Err(e.into()),
            };
            let Some(hello) = pod else {
                // One agent per node: a second one refuses to start, as before handovers.
                return Err(in_use.into());
            };
            match handover::ask(state_file.dir(), hello).await {
                Ok(accepted) => match self.take_over(state_file, accepted, dra).await? {
                    Some(taken) => return Ok(taken),
                    // The exchange broke off and another agent holds the node now: ask it.
                    None => continue,
                },
                Err(AskError::Handover(HandoverError::Refused(why))) => {
                    if !matches!(self.standing(), Standing::Refused { .. }) {
                        warn!(reason = %why, "the agent that owns the node will not hand it over to this one: waiting, unregistered, until the node is free");
                    }
                    self.set_standing(Standing::Refused { why });
                    // Registered in standby, before it could ask: no longer.
                    self.deregister();
                }
                Err(e) => {
                    let why = stdx::errors::chain(&e);
                    if !matches!(self.standing(), Standing::Standby { .. }) {
                        warn!(reason = %why, "another agent owns the node and cannot be asked for it now: registered, holding the kubelet's calls, until it is gone or can be asked");
                    }
                    self.set_standing(Standing::Standby { why });
                    if dra {
                        self.register();
                    }
                }
            }
            tokio::time::sleep(LOCK_POLL).await;
        }
    }

    /// The owner accepted: registers with the kubelet, waits for it to connect, tells the owner
    /// to go, and takes the lock the owner passes with `released`. If the exchange breaks off
    /// (the owner died, or stalled), takes the lock once it is free; `None` if another agent
    /// holds it by then, which the caller asks for the node.
    async fn take_over(
        &self,
        state_file: &StateFile,
        accepted: handover::Accepted,
        dra: bool,
    ) -> anyhow::Result<Option<(StateLock, BTreeSet<String>)>> {
        self.faults.handover_step(Point::TakeoverAccepted).await;
        let from = accepted.owner.clone();
        info!(owner = %from, "the agent that owns the node hands it over to this one");
        self.set_standing(Standing::TakingOver { from: from.clone() });
        if dra {
            self.register();
            if !self.kubelet_connected().await {
                warn!(wait = ?handover::KUBELET_WAIT, "the kubelet has not connected to this agent yet; taking the node over anyway");
            }
        }
        self.faults.handover_step(Point::TakeoverGo).await;
        let passed = match accepted.go().await {
            Ok(Some(fd)) => match state_file.adopt(fd) {
                Ok(lock) => Some(lock),
                Err(e) => {
                    warn!(error = %stdx::errors::chain(&e), "the owner passed something other than the node's lock; taking the node once its lock is free");
                    None
                }
            },
            Ok(None) => {
                info!("the owner let the node's lock go instead of passing it; taking it");
                None
            }
            Err(e) => {
                warn!(error = %stdx::errors::chain(&e), "the owner broke the handover off; taking the node once its lock is free");
                None
            }
        };
        let lock = match passed {
            Some(lock) => lock,
            None => match handover::take_lock(state_file, LOCK_WAIT).await {
                Ok(lock) => lock,
                Err(StateError::InUse { .. }) => {
                    warn!(wait = ?LOCK_WAIT, "another agent holds the node's lock now; asking it for the node");
                    return Ok(None);
                }
                Err(e) => return Err(e.into()),
            },
        };
        self.owned(lock, BTreeSet::from([from]), dra)
            .await
            .map(Some)
    }

    async fn owned(
        &self,
        lock: StateLock,
        predecessors: BTreeSet<String>,
        dra: bool,
    ) -> anyhow::Result<(StateLock, BTreeSet<String>)> {
        self.faults.handover_step(Point::TakeoverLocked).await;
        if dra {
            self.register();
        }
        Ok((lock, predecessors))
    }

    /// The agent owns the node: `manager` serves it.
    pub fn own(&self, manager: Arc<Manager>) {
        let _ = self.manager.set(manager);
        self.manager_set.send_replace(true);
        self.set_standing(Standing::Owner);
    }

    /// Serves the handover socket for as long as the agent owns the node, and hands the node
    /// over to the first agent that asks and may take it. Returns once it has.
    pub async fn serve_handovers(
        self: Arc<Self>,
        owner: Owner,
        manager: Arc<Manager>,
    ) -> anyhow::Result<()> {
        loop {
            let mut successor = owner.next_successor().await;
            let to = successor.hello.pod_uid.clone();
            info!(successor = %to, version = %successor.hello.version, "handing the node over");
            let lock = match manager.hand_over(&mut successor, self.as_ref()).await {
                Ok(lock) => lock,
                Err(off) => {
                    warn!(reason = %off, "the handover is called off: this agent keeps the node");
                    continue;
                }
            };
            // The socket goes before the lock does: an agent that asks now is told nobody
            // serves, and asks the successor once it owns the node.
            drop(owner);
            successor.release(lock).await;
            self.set_standing(Standing::HandedOver { to });
            return Ok(());
        }
    }
}

impl Surrender for Node {
    fn close_runtime(&self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            self.surrender.cancel();
            let mut closed = self.runtime_closed.subscribe();
            if tokio::time::timeout(Duration::from_secs(10), closed.wait_for(|c| *c))
                .await
                .is_err()
            {
                warn!("the runtime connection did not close within 10 s; handing over anyway");
            }
        })
    }
}
