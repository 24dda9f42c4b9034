//! Handing the node over from the agent that owns it to the next one, so that an upgrade (a
//! DaemonSet rolling update with a surge) never leaves the kubelet without an agent to call.
//!
//! # Why there is a handover at all
//!
//! The kubelet (1.33 and later) registers two instances of a driver at once when their sockets
//! are named after their pods, and calls the newest one it is connected to
//! ([`kubelet_plugin::KubeletConfig::instance`]). A GPU driver's two instances only need to share
//! the claims' state. The agent is also the runtime's NRI plugin, and two plugins of one name
//! connected at once would each set every container's cpuset: the NRI adaptation fails an
//! event whose plugins both set the same field. So one agent owns the node at a time (the
//! state, its lock, the NRI connection, the CDI specs and the published devices), and ownership
//! passes from the old agent to the new one, in an exchange over a Unix socket.
//!
//! # Who asks whom
//!
//! The owner is the agent that holds the state directory's lock ([`crate::state::StateLock`]);
//! it serves `<state-dir>/handover.sock` ([`SOCKET`]; the state directory is the one path both
//! pods share). A starting agent that finds the lock held asks the owner:
//!
//! 1. new → owner: `hello` (protocol version, its pod UID, its version, the DaemonSet template
//!    generation of its pod when it knows it);
//! 2. owner → new: `accepted`, or `refused` with the reason: another protocol version, or a
//!    pod being replaced, which must not take the node back (a restarted container of it would
//!    leave the new pod unready for good, and the rollout stalled): a pod of an older template
//!    generation than the owner's, or one whose agent handed the node over already (which the
//!    state directory remembers, [`predecessors`], so that an owner that restarted refuses it
//!    too);
//! 3. the new agent registers with the kubelet under its own sockets and waits until the kubelet
//!    has connected to it (from then on the kubelet calls it rather than the owner; calls it
//!    gets are held until it owns the node, [`crate::claims::HOLD`]);
//! 4. new → owner: `go`;
//! 5. the owner shuts its claim gate (calls that come now are held) and waits for the claim
//!    calls in flight ([`Manager::hand_over`]); if the new agent goes away meanwhile, the
//!    handover is called off and the owner serves on, the held calls first ([`CalledOff`]);
//!    otherwise it closes its NRI connection, saves the state one last time, stops writing
//!    anything, removes its handover socket, adds its pod to the pods that handed the node
//!    over, and answers `released` with the state directory's lock attached
//!    ([`Successor::release`]);
//! 6. the new agent holds the lock it was passed, starts from the state on disk exactly as after
//!    a restart (specs reconciled, claims restored), connects to the runtime, whose Synchronize
//!    gives it every container, and opens its gate: the held calls are served.
//!
//! # How the lock passes, and why a third agent cannot slip in
//!
//! The lock is a `flock` on `<state-dir>/.lock`, which belongs to the open file description, not
//! to the process. The owner sends its descriptor with `released` (`SCM_RIGHTS`, [`conn`]) and
//! then closes its own: the lock is held from the owner's start until the successor lets it
//! go, and never free in between. Unlocking it for the successor to lock would let whichever
//! agent polled it first take the node: a second new agent, or the old pod's restarted
//! container (both poll it every second), and the successor, the agent the kubelet calls,
//! would hold the kubelet's calls for a lock it never gets. Any other agent finds the lock
//! held throughout and, the owner's socket gone, waits and asks the successor once it owns the
//! node. The successor checks that the descriptor is the lock file's and that its lock is held
//! ([`crate::state::StateFile::adopt`]). An owner that passes none (one that died) leaves the
//! lock to be taken once free.
//!
//! # What passes from the old agent to the new one
//!
//! Nothing but the files: the state (claims and the policy's durable state), the CDI specs, and
//! the lock. Containers are not state: the runtime's Synchronize lists them with their cpusets,
//! so the new agent places them as it does after any restart. Containers created between the
//! old agent's disconnect and the new one's Synchronize are created as the kubelet asked, and
//! placed once the new agent hears of them: by that Synchronize when it lists them (containerd
//! holds a plugin's synchronization while it creates a container; one it lists as created,
//! whose start may be under way, gets its update once the runtime says it started it,
//! [`crate::pending`]), and otherwise by the first event that names them (CRI-O's Synchronize
//! leaves out a container it is still creating: [`crate::container_events`]). An event in flight when the old agent disconnects is not failed:
//! the NRI adaptation treats a closed plugin connection as fatal for the plugin, drops it and
//! creates the container without its adjustment (`isFatalError` in `pkg/adaptation/plugin.go`,
//! NRI v0.11 and v0.12).
//!
//! # What the old agent does afterwards
//!
//! It deregisters from the kubelet, is not ready, writes nothing, and waits for the DaemonSet to
//! delete its pod; on SIGTERM it exits without saving. A kubelet call that still reaches it (or
//! that it held during the handover) is refused as `Unavailable`, naming the successor's pod
//! ([`crate::claims::AdmitError::HandedOver`]), and the kubelet's retry reaches the successor.
//! Few do: the kubelet calls the newest instance it registered, which is the successor once it
//! registered, before `go`; unless the successor registered first, in standby, or the kubelet
//! sent the call just before the successor registered. Forwarding such a call instead would
//! need the old agent to reach the new one's DRA socket. It never owns the node again: it
//! would have to take the lock, and an agent that handed over answers nobody.
//!
//! # When either dies in the middle
//!
//! Ownership is the lock, which the kernel lets go when its holder dies, and every file write is
//! atomic. So whatever dies, at whatever point ([`crate::points::Point::HANDOVER`]), the worst
//! case is a restart from disk, as today, never two owners:
//! - the new agent dies before `go`: the owner notices the closed connection and carries on;
//! - the new agent dies after `go`, while the owner drains its calls: the owner calls the
//!   handover off and keeps the node;
//! - the new agent dies once the owner is closing its runtime connection (there is no way back
//!   from that): the owner finishes handing over; the descriptor it sent dies with the
//!   connection, which frees the lock; the new pod's container is restarted and starts from
//!   disk;
//! - the owner dies during the handover: the new agent sees the connection close, waits for the
//!   lock, which is free, and starts from disk (or, if another agent took it first, asks that
//!   one for the node);
//! - two new agents at once: the owner answers one at a time; the other finds the lock held
//!   throughout, and asks the successor once it owns the node.

use std::{
    collections::BTreeSet,
    io,
    os::fd::OwnedFd,
    path::{Path, PathBuf},
    time::Duration,
};

use serde::{Deserialize, Serialize};
use stdx::errors::chain;
use tokio::net::{UnixListener, UnixStream};
use tracing::{info, warn};

use crate::{
    faults::Faults,
    manager::Manager,
    points::Point,
    runtime::BoxFuture,
    state::{StateError, StateFile, StateLock},
};

mod conn;
pub mod predecessors;

use conn::Conn;
use predecessors::Predecessors;

/// The handover socket's file name, in the state directory.
pub const SOCKET: &str = "handover.sock";

/// The version of the exchange this build speaks.
pub const PROTOCOL: u32 = 1;

/// The longest message either side accepts.
const MAX_MESSAGE: usize = 64 * 1024;

/// How long the owner waits for the asker's `hello`.
const HELLO_WAIT: Duration = Duration::from_secs(5);

/// How long the owner waits for `go` after accepting: the asker registers with the kubelet and
/// waits for its connection meanwhile ([`KUBELET_WAIT`] at most).
const GO_WAIT: Duration = Duration::from_secs(30);

/// How long a new agent waits, after it registered, for the kubelet to connect to it before it
/// says `go` anyway. The kubelet connects within a second of registering a plugin.
pub const KUBELET_WAIT: Duration = Duration::from_secs(10);

/// How long the asker waits for the owner's answer to `hello`: the owner answers one asker at a
/// time, and one it accepted may keep it [`GO_WAIT`].
const ANSWER_WAIT: Duration = Duration::from_secs(40);

/// How long the new agent waits for `released` after `go`: the owner waits for the claim calls
/// in flight, which the kubelet gives 45 s at most.
const RELEASE_WAIT: Duration = Duration::from_secs(60);

/// One message of the exchange, a line of JSON.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Message {
    /// The new agent introduces itself.
    Hello(Hello),
    /// The owner will hand over once told to go; the owner's pod.
    Accepted {
        /// The owner's pod UID.
        owner: String,
    },
    /// The owner will not hand over to this agent.
    Refused {
        /// Why.
        reason: String,
    },
    /// The new agent is registered with the kubelet: hand over now.
    Go,
    /// The owner let the node go: the state directory's lock comes with this message, as a
    /// descriptor ([`conn`]).
    Released,
}

/// What a new agent says of itself (and what the owner knows of its own pod).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    /// The exchange's version it speaks, [`PROTOCOL`].
    pub protocol: u32,
    /// Its pod's UID.
    pub pod_uid: String,
    /// Its release.
    pub version: String,
    /// The DaemonSet template generation its pod was made from (the pod's
    /// `pod-template-generation` label), when it knows it: an owner never hands the node to an
    /// agent of an older generation than its own. Absent from an older release's `hello`, and
    /// left out when unknown, so either side reads the other's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<u64>,
}

impl Hello {
    /// This build's `hello` for the agent of pod `pod_uid`.
    pub fn new(pod_uid: impl Into<String>) -> Self {
        Self {
            protocol: PROTOCOL,
            pod_uid: pod_uid.into(),
            version: env!("CARGO_PKG_VERSION").to_owned(),
            generation: None,
        }
    }

    /// This `hello` for a pod made from the DaemonSet's template generation `generation`.
    #[must_use]
    pub fn with_generation(mut self, generation: Option<u64>) -> Self {
        self.generation = generation;
        self
    }
}

/// What went wrong in the exchange.
#[derive(Debug, thiserror::Error)]
pub enum HandoverError {
    /// The handover socket could not be served.
    #[error("serving the handover socket {path}")]
    Bind {
        /// The socket.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// Reading or writing the connection failed.
    #[error("the handover connection failed")]
    Io(#[source] io::Error),
    /// The other side closed the connection.
    #[error("the other agent closed the handover connection")]
    Closed,
    /// The other side sent something that is not a message of the exchange.
    #[error("the other agent sent something that is not a handover message: {line:?}")]
    Malformed {
        /// What it sent (cut short).
        line: String,
        /// Why it does not parse.
        #[source]
        source: serde_json::Error,
    },
    /// The other side sent a message longer than any of the exchange.
    #[error("the other agent sent a message longer than {MAX_MESSAGE} bytes")]
    TooLong,
    /// The other side sent a message out of turn.
    #[error("the other agent sent {got:?} where {expected} was due")]
    Unexpected {
        /// What was due.
        expected: &'static str,
        /// What came.
        got: Message,
    },
    /// The other side did not answer in time.
    #[error("the other agent sent nothing for {0:?}")]
    Timeout(Duration),
    /// The owner refused.
    #[error("the agent that owns the node refused to hand it over: {0}")]
    Refused(String),
}

// === the owner's side ===

/// The owner's handover socket. It must be bound while the state directory's lock is held: a
/// socket found there then is a dead owner's, and is replaced.
#[derive(Debug)]
pub struct Owner {
    listener: UnixListener,
    path: PathBuf,
    /// The owner's own pod, as its `hello` would say.
    own: Hello,
    /// The state directory.
    state_dir: PathBuf,
    /// Pods whose agents handed the node over (to this one, or earlier ones: the state
    /// directory remembers them, [`predecessors`]): refused if they ask for it back.
    predecessors: Predecessors,
    /// Passed at [`Point::HandoverAccepted`]; the manager's own for the points after it.
    faults: Faults,
}

impl Owner {
    /// Serves `<state_dir>/handover.sock` for the agent `own` says it is, which took the node
    /// from the agents of `predecessors` (none after a plain start); it refuses them, and every
    /// pod the state directory remembers handed the node over ([`predecessors`]). `faults` are
    /// the manager's ([`crate::ManagerConfig::faults`]).
    pub fn bind(
        state_dir: &Path,
        own: &Hello,
        predecessors: BTreeSet<String>,
        faults: Faults,
    ) -> Result<Self, HandoverError> {
        let path = state_dir.join(SOCKET);
        let bind_error = |source| HandoverError::Bind {
            path: path.clone(),
            source,
        };
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(bind_error(e)),
        }
        let listener = UnixListener::bind(&path).map_err(bind_error)?;
        let predecessors = predecessors
            .iter()
            .fold(Predecessors::load(state_dir), |known, pod| known.with(pod));
        Ok(Self {
            listener,
            path,
            own: own.clone(),
            state_dir: state_dir.to_owned(),
            predecessors,
            faults,
        })
    }

    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Waits for an agent that asks for the node, accepts it, and returns it once it said go.
    /// Agents that cannot take over are refused, and an exchange that breaks off before `go`
    /// is forgotten; both are logged.
    pub async fn next_successor(&self) -> Successor {
        loop {
            let stream = match self.listener.accept().await {
                Ok((stream, _)) => stream,
                Err(e) => {
                    warn!(error = %e, "accepting a handover connection failed");
                    continue;
                }
            };
            match self.offer(Conn::new(stream)).await {
                Ok(successor) => return successor,
                Err(e) => {
                    info!(error = %chain(&e), "a handover did not happen; this agent keeps the node");
                }
            }
        }
    }

    async fn offer(&self, mut conn: Conn) -> Result<Successor, HandoverError> {
        let hello = match conn.recv_plain(HELLO_WAIT).await? {
            Message::Hello(hello) => hello,
            got => {
                return Err(HandoverError::Unexpected {
                    expected: "hello",
                    got,
                });
            }
        };
        let refusal = if hello.protocol != PROTOCOL {
            Some(format!(
                "it speaks handover protocol {}, this agent {PROTOCOL}",
                hello.protocol
            ))
        } else if hello.pod_uid == self.own.pod_uid || self.predecessors.contains(&hello.pod_uid) {
            Some(format!(
                "the agent of pod {} handed the node over already; its pod is being replaced",
                hello.pod_uid
            ))
        } else if let (Some(theirs), Some(ours)) = (hello.generation, self.own.generation)
            && theirs < ours
        {
            Some(format!(
                "the agent of pod {} is of the DaemonSet's template generation {theirs}, older than this agent's {ours}; its pod is being replaced",
                hello.pod_uid
            ))
        } else {
            None
        };
        if let Some(reason) = refusal {
            conn.send(
                &Message::Refused {
                    reason: reason.clone(),
                },
                None,
            )
            .await?;
            return Err(HandoverError::Refused(reason));
        }
        conn.send(
            &Message::Accepted {
                owner: self.own.pod_uid.clone(),
            },
            None,
        )
        .await?;
        self.faults.handover_step(Point::HandoverAccepted).await;
        info!(pod = %hello.pod_uid, version = %hello.version, "an agent asks for the node; accepted, waiting for it to register with the kubelet");
        match conn.recv_plain(GO_WAIT).await? {
            Message::Go => Ok(Successor {
                conn,
                hello,
                state_dir: self.state_dir.clone(),
                remember: self.predecessors.clone().with(&self.own.pod_uid),
                faults: self.faults.clone(),
            }),
            got => Err(HandoverError::Unexpected {
                expected: "go",
                got,
            }),
        }
    }
}

impl Drop for Owner {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// An agent the owner is handing the node over to: it said go.
#[derive(Debug)]
pub struct Successor {
    conn: Conn,
    /// What it said of itself.
    pub hello: Hello,
    /// The state directory.
    state_dir: PathBuf,
    /// The pods that handed the node over, the owner's now among them.
    remember: Predecessors,
    /// The owner's: passed at [`Point::HandoverRemembered`] and [`Point::HandoverReleased`].
    faults: Faults,
}

impl Successor {
    /// Resolves once the successor is gone: its connection closed (it died), or it sent
    /// something it should not have while the owner hands the node over.
    pub async fn gone(&mut self) {
        match self.conn.recv_plain(Duration::MAX).await {
            Err(HandoverError::Closed) => {}
            Ok(got) => {
                warn!(message = ?got, "the successor sent a message out of turn; calling the handover off");
            }
            Err(e) => info!(error = %chain(&e), "the connection to the successor failed"),
        }
    }

    /// Passes it the state directory's lock (what [`Manager::hand_over`] returned) with
    /// `released`, and lets go of this agent's descriptor of it: the lock is held all along, by
    /// the owner and then by the successor, so no other agent polling it finds it free in
    /// between. The successor may be gone already: the lock is then free once the kernel drops
    /// what was sent to it, and the next agent to look takes the node.
    ///
    /// First it adds the owner's pod to the pods the state directory remembers handed the node
    /// over ([`predecessors`]): a restarted container of it asks in vain from then on, whoever
    /// owns the node. A failed write is logged: the successor remembers this agent anyway.
    pub async fn release(mut self, lock: Option<StateLock>) {
        if let Err(e) = self.remember.save(&self.state_dir, &self.faults).await {
            warn!(error = %e, "remembering that this agent handed the node over failed; its successor knows it anyway");
        }
        self.faults.handover_step(Point::HandoverReleased).await;
        let fd = lock.as_ref().map(StateLock::as_fd);
        if let Err(e) = self.conn.send(&Message::Released, fd).await {
            info!(error = %chain(&e), "passing the node to the successor failed; its lock is free once this agent lets go of it");
        }
        drop(lock);
    }
}

/// A handover called off: the successor went away before the owner let go of anything it
/// cannot take back. The owner keeps the node.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the agent of pod {to} went away before the node was handed over to it")]
pub struct CalledOff {
    /// The successor's pod.
    pub to: String,
}

/// What the owner stops, besides the manager, when it hands the node over.
pub trait Surrender: Send + Sync {
    /// Closes the connection to the runtime, and returns once no event can reach the manager
    /// any more.
    fn close_runtime(&self) -> BoxFuture<'_, ()>;
}

impl Manager {
    /// Hands the node over to `successor`: shuts the claim gate (later calls are held) and waits
    /// for the claim calls in flight, closes the runtime connection (`surrender`), saves the
    /// state one last time, and stops every write. Returns the state directory's lock, for the
    /// caller to pass to the successor ([`Successor::release`]); the manager holds it no more.
    /// After it, the manager answers nothing that needs the node
    /// ([`crate::claims::AdmitError::HandedOver`]).
    ///
    /// If the successor goes away (it died) while the calls drain, the handover is called off
    /// ([`CalledOff`]) and the calls held meanwhile are served: this agent keeps the node. Once
    /// the runtime connection is closing there is no way back: the successor's pod's restarted
    /// container takes the node, finding the lock free.
    ///
    /// A failed last save does not stop it: every commit has saved already, and the successor
    /// starts from what is on disk as after a restart.
    pub async fn hand_over(
        &self,
        successor: &mut Successor,
        surrender: &dyn Surrender,
    ) -> Result<Option<StateLock>, CalledOff> {
        let to = successor.hello.pod_uid.clone();
        self.gate.begin_handover(&to);
        // Waits for the calls admitted; any later one is held by the gate.
        let drained = async { drop(self.calls.write().await) };
        tokio::select! {
            () = drained => {}
            () = successor.gone() => {
                self.gate.call_off();
                return Err(CalledOff { to });
            }
        }
        self.faults().handover_step(Point::HandoverDrained).await;
        // The last moment to call it off.
        if tokio::time::timeout(Duration::ZERO, successor.gone())
            .await
            .is_ok()
        {
            self.gate.call_off();
            return Err(CalledOff { to });
        }
        self.gate.hand_over(&to);
        surrender.close_runtime().await;
        self.faults()
            .handover_step(Point::HandoverRuntimeClosed)
            .await;
        if let Err(e) = self.core.save().await {
            warn!(error = %chain(&e), "the last save before the handover failed; the successor starts from the last commit's");
        }
        self.core.retire_disk().await;
        self.faults().handover_step(Point::HandoverSaved).await;
        let lock = stdx::sync::lock(&self.state_lock).take();
        info!(to = %to, "handed the node over: the state directory's lock goes to the successor");
        Ok(lock)
    }

    /// Whether this manager handed the node over.
    pub fn handed_over(&self) -> bool {
        self.gate.handed_over_to().is_some()
    }
}

// === the new agent's side ===

/// Why a new agent could not ask the owner.
#[derive(Debug, thiserror::Error)]
pub enum AskError {
    /// Nobody serves the handover socket: the owner is of a release without handovers, or it
    /// is dying. The lock goes when its holder does.
    #[error("no agent serves {path}")]
    NoOwner {
        /// The socket.
        path: PathBuf,
        /// Why it could not be reached.
        #[source]
        source: io::Error,
    },
    /// The exchange failed.
    #[error(transparent)]
    Handover(#[from] HandoverError),
}

/// The owner's acceptance: tell it to go once registered with the kubelet.
#[derive(Debug)]
pub struct Accepted {
    conn: Conn,
    /// The owner's pod UID.
    pub owner: String,
}

/// Asks the owner of the node whose state directory is `state_dir` to hand it over.
pub async fn ask(state_dir: &Path, hello: &Hello) -> Result<Accepted, AskError> {
    let path = state_dir.join(SOCKET);
    let stream = UnixStream::connect(&path)
        .await
        .map_err(|source| AskError::NoOwner {
            path: path.clone(),
            source,
        })?;
    let mut conn = Conn::new(stream);
    conn.send(&Message::Hello(hello.clone()), None).await?;
    match conn.recv_plain(ANSWER_WAIT).await? {
        Message::Accepted { owner } => Ok(Accepted { conn, owner }),
        Message::Refused { reason } => Err(HandoverError::Refused(reason).into()),
        got => Err(HandoverError::Unexpected {
            expected: "accepted or refused",
            got,
        }
        .into()),
    }
}

impl Accepted {
    /// Tells the owner to go, and waits until it says the node is released: returns the
    /// descriptor of the state directory's lock that came with `released` (none from an owner
    /// that let the lock go instead). An error means the owner broke off (it died, or stalled):
    /// the lock is free once it is gone.
    pub async fn go(mut self) -> Result<Option<OwnedFd>, HandoverError> {
        self.conn.send(&Message::Go, None).await?;
        match self.conn.recv(RELEASE_WAIT).await? {
            // One descriptor is passed; any more are dropped, which closes them.
            (Message::Released, fds) => Ok(fds.into_iter().next()),
            (got, _) => Err(HandoverError::Unexpected {
                expected: "released",
                got,
            }),
        }
    }
}

/// Takes the state directory's lock, waiting up to `within` for its holder to let it go (an
/// owner handing over, or dying).
pub async fn take_lock(state_file: &StateFile, within: Duration) -> Result<StateLock, StateError> {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        match state_file.lock() {
            Err(StateError::InUse { .. }) if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            taken => return taken,
        }
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::AsyncWriteExt;

    use super::*;

    async fn pair(dir: &Path, owner: &str, predecessors: &[&str]) -> Owner {
        Owner::bind(
            dir,
            &Hello::new(owner),
            predecessors.iter().map(|p| (*p).to_owned()).collect(),
            Faults::default(),
        )
        .unwrap()
    }

    #[tokio::test]
    async fn an_asker_is_accepted_and_told_released_after_go() {
        let dir = tempfile::tempdir().unwrap();
        let owner = pair(dir.path(), "old", &[]).await;
        let asker = tokio::spawn({
            let dir = dir.path().to_owned();
            async move {
                let accepted = ask(&dir, &Hello::new("new")).await.unwrap();
                assert_eq!(accepted.owner, "old");
                accepted.go().await
            }
        });
        let successor = owner.next_successor().await;
        assert_eq!(successor.hello.pod_uid, "new");
        assert_eq!(successor.hello.protocol, PROTOCOL);
        successor.release(None).await;
        assert!(
            asker.await.unwrap().unwrap().is_none(),
            "no lock was passed"
        );
    }

    #[tokio::test]
    async fn the_lock_passes_with_released_and_is_never_free_meanwhile() {
        let dir = tempfile::tempdir().unwrap();
        let state = StateFile::new(dir.path());
        let lock = state.lock().unwrap();
        let owner = pair(dir.path(), "old", &[]).await;
        let asker = tokio::spawn({
            let dir = dir.path().to_owned();
            async move { ask(&dir, &Hello::new("new")).await.unwrap().go().await }
        });
        let successor = owner.next_successor().await;
        drop(owner);
        successor.release(Some(lock)).await;
        // The owner holds nothing of the lock now; the descriptor in flight holds it.
        assert!(matches!(state.lock(), Err(StateError::InUse { .. })));
        let fd = asker
            .await
            .unwrap()
            .unwrap()
            .expect("the lock came with released");
        let taken = state.adopt(fd).unwrap();
        assert!(matches!(state.lock(), Err(StateError::InUse { .. })));
        drop(taken);
        state.lock().unwrap();
    }

    #[tokio::test]
    async fn a_lock_passed_to_a_successor_that_died_is_free() {
        let dir = tempfile::tempdir().unwrap();
        let state = StateFile::new(dir.path());
        let lock = state.lock().unwrap();
        let owner = pair(dir.path(), "old", &[]).await;
        let accepted = tokio::spawn({
            let dir = dir.path().to_owned();
            async move {
                let mut accepted = ask(&dir, &Hello::new("new")).await.unwrap();
                // Says go, and dies before it reads released.
                accepted.conn.send(&Message::Go, None).await.unwrap();
                accepted
            }
        });
        let successor = owner.next_successor().await;
        successor.release(Some(lock)).await;
        assert!(matches!(state.lock(), Err(StateError::InUse { .. })));
        drop(accepted.await.unwrap());
        state.lock().unwrap();
    }

    #[tokio::test]
    async fn a_predecessor_and_another_protocol_are_refused_saying_why() {
        let dir = tempfile::tempdir().unwrap();
        let owner = pair(dir.path(), "new", &["old"]).await;
        let serving = tokio::spawn(async move {
            owner.next_successor().await;
        });
        let err = ask(dir.path(), &Hello::new("old")).await.unwrap_err();
        assert!(
            matches!(&err, AskError::Handover(HandoverError::Refused(why)) if why.contains("handed the node over already")),
            "{err}"
        );
        let err = ask(
            dir.path(),
            &Hello {
                protocol: PROTOCOL + 1,
                ..Hello::new("newer")
            },
        )
        .await
        .unwrap_err();
        assert!(
            matches!(&err, AskError::Handover(HandoverError::Refused(why)) if why.contains("protocol")),
            "{err}"
        );
        assert!(!serving.is_finished(), "the owner keeps serving");
        serving.abort();
    }

    #[tokio::test]
    async fn an_agent_of_an_older_template_generation_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let owner = Owner::bind(
            dir.path(),
            &Hello::new("new").with_generation(Some(4)),
            BTreeSet::new(),
            Faults::default(),
        )
        .unwrap();
        let serving = tokio::spawn(async move { owner.next_successor().await });
        let old = Hello::new("old").with_generation(Some(3));
        let err = ask(dir.path(), &old).await.unwrap_err();
        assert!(
            matches!(&err, AskError::Handover(HandoverError::Refused(why)) if why.contains("generation 3, older than this agent's 4")),
            "{err}"
        );
        // The same generation (the pod was deleted and made again), a newer one, and an agent
        // that does not say (an older release) are accepted.
        for hello in [
            Hello::new("same").with_generation(Some(4)),
            Hello::new("newer").with_generation(Some(5)),
            Hello::new("unknown"),
        ] {
            let accepted = ask(dir.path(), &hello).await.unwrap();
            drop(accepted);
        }
        assert!(!serving.is_finished(), "nobody said go");
        serving.abort();
    }

    #[tokio::test]
    async fn a_hello_without_a_generation_reads_as_an_older_releases() {
        let old: Hello =
            serde_json::from_str(r#"{"protocol":1,"pod_uid":"p","version":"0.1.0"}"#).unwrap();
        assert_eq!(old.generation, None);
        let text = serde_json::to_string(&Hello::new("p")).unwrap();
        assert!(!text.contains("generation"), "{text}");
    }

    #[tokio::test]
    async fn a_pod_that_handed_over_is_refused_by_every_later_owner() {
        let dir = tempfile::tempdir().unwrap();
        let owner = pair(dir.path(), "a", &[]).await;
        let asker = tokio::spawn({
            let dir = dir.path().to_owned();
            async move { ask(&dir, &Hello::new("b")).await.unwrap().go().await }
        });
        owner.next_successor().await.release(None).await;
        asker.await.unwrap().unwrap();
        drop(owner);
        // An owner that knows nothing of a (it restarted, or took the node from a free lock)
        // still refuses a's restarted container.
        let later = pair(dir.path(), "c", &[]).await;
        let serving = tokio::spawn(async move { later.next_successor().await });
        let err = ask(dir.path(), &Hello::new("a")).await.unwrap_err();
        assert!(
            matches!(&err, AskError::Handover(HandoverError::Refused(why)) if why.contains("handed the node over already")),
            "{err}"
        );
        serving.abort();
    }

    #[tokio::test]
    async fn an_asker_that_goes_before_go_leaves_the_owner_serving_the_next() {
        let dir = tempfile::tempdir().unwrap();
        let owner = pair(dir.path(), "old", &[]).await;
        let serving = tokio::spawn(async move { owner.next_successor().await });
        let first = ask(dir.path(), &Hello::new("first")).await.unwrap();
        drop(first); // the new agent dies before it says go
        let second = ask(dir.path(), &Hello::new("second")).await.unwrap();
        let go = tokio::spawn(second.go());
        let successor = serving.await.unwrap();
        assert_eq!(successor.hello.pod_uid, "second");
        successor.release(None).await;
        go.await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn without_an_owner_serving_asking_says_so() {
        let dir = tempfile::tempdir().unwrap();
        let err = ask(dir.path(), &Hello::new("new")).await.unwrap_err();
        assert!(matches!(err, AskError::NoOwner { .. }), "{err}");
        // A dead owner's socket is there, but nobody listens.
        drop(std::os::unix::net::UnixListener::bind(dir.path().join(SOCKET)).unwrap());
        let err = ask(dir.path(), &Hello::new("new")).await.unwrap_err();
        assert!(matches!(err, AskError::NoOwner { .. }), "{err}");
        // The next owner replaces it.
        let _owner = pair(dir.path(), "owner", &[]).await;
    }

    #[tokio::test]
    async fn an_owner_that_dies_after_go_breaks_the_exchange_off() {
        let dir = tempfile::tempdir().unwrap();
        let owner = pair(dir.path(), "old", &[]).await;
        let asker = tokio::spawn({
            let dir = dir.path().to_owned();
            async move { ask(&dir, &Hello::new("new")).await.unwrap().go().await }
        });
        let successor = owner.next_successor().await;
        drop(successor);
        drop(owner);
        let err = asker.await.unwrap().unwrap_err();
        assert!(matches!(err, HandoverError::Closed), "{err}");
        assert!(
            !dir.path().join(SOCKET).exists(),
            "the owner's socket went with it"
        );
    }

    #[tokio::test]
    async fn garbage_and_oversized_messages_are_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let owner = pair(dir.path(), "old", &[]).await;
        let path = dir.path().join(SOCKET);
        let serving = tokio::spawn(async move { owner.next_successor().await });
        for bytes in [b"{not json}\n".to_vec(), vec![b'x'; MAX_MESSAGE + 10]] {
            let mut stream = UnixStream::connect(&path).await.unwrap();
            stream.write_all(&bytes).await.unwrap();
            // The owner hangs up on it and carries on.
            let mut reply = Vec::new();
            let _ = tokio::io::AsyncReadExt::read_to_end(&mut stream, &mut reply).await;
            assert!(reply.is_empty(), "{reply:?}");
        }
        let accepted = ask(dir.path(), &Hello::new("new")).await.unwrap();
        let go = tokio::spawn(accepted.go());
        serving.await.unwrap().release(None).await;
        go.await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn messages_round_trip_as_lines_of_json() {
        let hello = Message::Hello(Hello::new("p"));
        let text = serde_json::to_string(&hello).unwrap();
        assert!(
            text.starts_with(r#"{"hello":{"protocol":1,"pod_uid":"p""#),
            "{text}"
        );
        assert_eq!(serde_json::to_string(&Message::Go).unwrap(), r#""go""#);
        for m in [
            hello,
            Message::Accepted { owner: "o".into() },
            Message::Refused { reason: "r".into() },
            Message::Go,
            Message::Released,
        ] {
            let back: Message = serde_json::from_str(&serde_json::to_string(&m).unwrap()).unwrap();
            assert_eq!(back, m);
        }
    }

    #[tokio::test]
    async fn the_lock_is_taken_once_its_holder_lets_it_go() {
        let dir = tempfile::tempdir().unwrap();
        let state = StateFile::new(dir.path());
        let held = state.lock().unwrap();
        assert!(matches!(
            take_lock(&state, Duration::from_millis(50)).await,
            Err(StateError::InUse { .. })
        ));
        let taking = tokio::spawn({
            let state = state.clone();
            async move { take_lock(&state, Duration::from_secs(10)).await }
        });
        tokio::task::yield_now().await;
        drop(held);
        taking.await.unwrap().unwrap();
    }
}
