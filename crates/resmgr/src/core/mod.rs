//! The core: the one owner of the manager lock and of what it protects (the policy, the claim
//! records, the pending updates, the reconciliation's ledger, the containers the policy holds),
//! of the state file and the CDI specs (the disk), of the runtime's `UpdateContainers`, of
//! commit and of the published snapshot.
//!
//! Its fields are private, and so are the lock's bookkeeping (the versions of the durable state,
//! what is saved, what the snapshot was made at): the services (`claims`, `container_events`,
//! `reconcile`, `handover`) reach them only through this API:
//!
//! - [`Core::with_lock`]: runs a plain closure with the lock's [`Guard`], which derefs to
//!   [`Locked`] (the protected data) and is turned into a [`Change`] to end a mutation
//!   ([`Guard::change`], [`Guard::change_all`]); dropping a guard used mutably publishes what
//!   changed;
//! - [`Core::commit`]: saves a change's durable state and delivers its updates, once the lock
//!   is let go ([`commit`]);
//! - [`Core::published`], [`Core::snapshot`]: what readers see;
//! - the disk's claim files (spec and metadata written, removed, looked for, set aside), the
//!   background retries, the last save and the disk's retirement at a handover.
//!
//! # The lock
//!
//! NRI event handlers, the runtime's Synchronize, and the kubelet's prepare and unprepare all
//! take the lock, so the policy sees one sequence of calls. It is held only for in-memory work:
//! never across a call to the runtime, and never across disk IO. It is a
//! [`stdx::scoped::ScopedLock`], taken only by a plain closure that cannot await and whose guard
//! cannot leave it, so code that would hold it across IO does not compile (stdx's trybuild cases
//! pin each way of trying), and blocking IO in the closure is refused by clippy
//! (`disallowed_methods`, crates/resmgr/clippy.toml).
//!
//! # The lock is never held across a call to the runtime
//!
//! The runtime (containerd, CRI-O) holds its own NRI lock while it waits for our answer to an
//! event, and serves our unsolicited `UpdateContainers` under that same lock. If a commit held our
//! lock while waiting for `UpdateContainers`, an event arriving meanwhile would wait for our lock
//! while the runtime waits for our event answer: a deadlock that ends only when the runtime's
//! request timeout disconnects us. So a commit delivers the pending updates after letting go
//! ([`Core::deliver`]); deliveries are serialized by a lock of their own that event handlers
//! never take. Event handlers therefore never wait on the runtime, including Synchronize, which
//! takes the manager lock like every other event. What keeps claims from racing the Synchronize
//! is not the lock but the gate ([`crate::gate`]).
//!
//! # The lock is never held across disk IO
//!
//! Saves and spec writes fsync, and a slow disk must not delay the answers to NRI events (the
//! runtime drops a plugin that misses its timeout, which ends the agent). So every change of
//! the durable state bumps a version under the lock, and is made durable afterwards, outside it:
//! saves are serialized by a lock of their own, each writes the newest state (taken under the
//! manager lock, briefly), and a caller whose version a later save already covered does not
//! write at all. Disk IO runs on the blocking pool ([`crate::disk`]). Events that change nothing
//! durable (with the topology-aware policy: every container event) never wait for the disk.

// Blocking IO under the manager lock does not pass clippy (crates/resmgr/clippy.toml).
#![deny(clippy::disallowed_methods)]

mod commit;
mod guard;
mod published;

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use policy::Policy;
use stdx::scoped::ScopedLock;
use tokio::sync::watch;

pub(crate) use commit::Change;
use commit::Io;
pub use commit::{CommitError, DeliveryCause, DeliveryError, SETTLE_WAIT};
pub(crate) use guard::Guard;
pub use published::Published;

use crate::{
    disk::Disk,
    pending::PendingUpdates,
    reconciliation::Reconciliation,
    runtime::Runtime,
    state::{PreparedClaim, Records, STATE_VERSION, State},
};

/// The core (see the module doc). Every field is private.
#[derive(Debug)]
pub(crate) struct Core {
    /// Reached only through [`Core::with_lock`].
    lock: ScopedLock<Inner>,
    /// What readers see ([`Published`]), written only by a [`Guard`] let go.
    published: watch::Sender<Arc<Published>>,
    /// The disk and the runtime, reached only through [`commit`].
    io: Io,
}

/// What the lock protects, as the services see it through a [`Guard`].
#[derive(Debug)]
pub(crate) struct Locked {
    pub(crate) policy: Box<dyn Policy>,
    pub(crate) records: Records,
    pub(crate) pending: PendingUpdates,
    pub(crate) reconcile: Reconciliation,
    /// The containers the policy holds: listed by the runtime's last Synchronize, created or
    /// adopted since ([`crate::container_events`]), and not stopped or removed since.
    pub(crate) held: BTreeSet<String>,
}

/// Everything behind the lock: the protected data and the core's own books of it.
#[derive(Debug)]
struct Inner {
    locked: Locked,
    books: Books,
}

/// The core's books: which changes are durable, which saved, which published.
#[derive(Debug)]
struct Books {
    /// Counts changes of the durable state.
    version: u64,
    /// The version on disk, which [`commit`] sets after each save: a version above it is
    /// unsaved (a save failed, or is under way), and the background retry saves it.
    saved: Arc<AtomicU64>,
    /// The durable state as of `version`.
    durable: Durable,
    /// The counters the published snapshot was made at.
    published_at: PublishedAt,
}

/// The durable state as of the core's version: the policy's snapshot and the claim records,
/// with the counters they were taken at.
#[derive(Debug)]
struct Durable {
    snapshot: serde_json::Value,
    records: BTreeMap<String, PreparedClaim>,
    /// The policy's durable counter ([`policy::Generations::durable`]); `None`: it keeps none.
    policy: Option<u64>,
    records_generation: u64,
}

/// The counters the published snapshot was made at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct PublishedAt {
    /// The policy's devices counter; `None`: it keeps none.
    devices: Option<u64>,
    records: u64,
}

/// How the core talks to the runtime and retries what a commit could not finish.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Timing {
    /// How long one `UpdateContainers` call may take.
    pub(crate) update_timeout: Duration,
    /// First delay of the background retry; it doubles up to `max_retry_backoff`.
    pub(crate) retry_backoff: Duration,
    pub(crate) max_retry_backoff: Duration,
}

impl Core {
    /// A core over what start-up restored: the policy, the claim records and the reconciliation's
    /// ledger, as saved (or as start-up saved them); the disk and the runtime.
    pub(crate) fn new(
        policy: Box<dyn Policy>,
        records: Records,
        reconcile: Reconciliation,
        disk: Disk,
        runtime: Arc<dyn Runtime>,
        timing: Timing,
    ) -> Self {
        let generations = policy.generations();
        let durable = Durable {
            snapshot: policy.snapshot(),
            records: (*records).clone(),
            policy: generations.durable,
            records_generation: records.generation(),
        };
        let saved = Arc::new(AtomicU64::new(0));
        let published = watch::Sender::new(Arc::new(Published::of(policy.as_ref(), &records)));
        let published_at = PublishedAt {
            devices: generations.devices,
            records: records.generation(),
        };
        Self {
            lock: ScopedLock::new(Inner {
                locked: Locked {
                    policy,
                    records,
                    pending: PendingUpdates::default(),
                    reconcile,
                    held: BTreeSet::new(),
                },
                books: Books {
                    version: 0,
                    saved: saved.clone(),
                    durable,
                    published_at,
                },
            }),
            published,
            io: Io::new(disk, runtime, timing, saved),
        }
    }

    /// Runs `f` with the manager lock held, and lets the lock go when `f` returns: the one way
    /// to what the lock protects.
    ///
    /// `f` is a plain closure, so nothing can be awaited while the lock is held, and every IO
    /// of the core is awaited (the state file, CDI specs, the runtime: [`commit`]); the guard's
    /// lifetime is `f`'s own, so it cannot leave `f`, in what `f` returns or otherwise. So
    /// holding the lock across IO does not compile ([`stdx::scoped`]).
    ///
    /// A long wait for the lock is logged with the caller's place in the code: runtime events
    /// wait for the lock, and a runtime drops a plugin that misses its request timeout. Only a
    /// lock that was not free reads the clock.
    #[track_caller]
    pub(crate) fn with_lock<R, F>(&self, f: F) -> impl Future<Output = R> + use<'_, R, F>
    where
        F: FnOnce(Guard<'_>) -> R,
    {
        let caller = std::panic::Location::caller();
        async move {
            let (result, waited) = self
                .lock
                .with_waited(|held, waited| {
                    (f(Guard::new(held, &self.published, &self.io)), waited)
                })
                .await;
            // Logged once the lock is let go: a log line is IO.
            warn_if_long(caller, waited);
            result
        }
    }

    /// What readers need, refreshed under the lock at every change ([`Published`]).
    pub(crate) fn published(&self) -> watch::Receiver<Arc<Published>> {
        self.published.subscribe()
    }

    /// The snapshot as of now.
    pub(crate) fn snapshot(&self) -> Arc<Published> {
        self.published.borrow().clone()
    }
}

/// Longer than this waiting for the manager lock is logged ([`Core::with_lock`]): the work under
/// it is in memory, microseconds to a few milliseconds, so a wait this long means a holder that
/// was starved of a thread or did far more than it should.
const LONG_LOCK_WAIT: Duration = Duration::from_millis(250);

fn warn_if_long(caller: &std::panic::Location<'_>, waited: Duration) {
    if waited > LONG_LOCK_WAIT {
        tracing::warn!(
            at = %caller,
            waited_ms = waited.as_millis(),
            "waited long for the manager lock"
        );
    }
}

impl Inner {
    /// Takes note of what the calls since the last note changed: if the policy's durable state
    /// or the records changed, that is a new version, returned for [`Change`]; `None` if nothing
    /// durable changed.
    ///
    /// Changes are told by counters ([`policy::Policy::generations`], [`Records::generation`]):
    /// nothing is serialized or copied to find out, so an event that changed nothing durable
    /// costs nothing here. Only a policy that keeps no counter has its snapshot taken and
    /// compared after every mutating call.
    fn note_changes(&mut self) -> Option<u64> {
        let Self { locked, books } = self;
        let counted = locked.policy.generations().durable;
        let records_changed = locked.records.generation() != books.durable.records_generation;
        let snapshot = match counted {
            Some(now) if Some(now) == books.durable.policy => None,
            Some(_) => Some(locked.policy.snapshot()),
            None => Some(locked.policy.snapshot()).filter(|s| *s != books.durable.snapshot),
        };
        if snapshot.is_none() && !records_changed {
            return None;
        }
        if let Some(snapshot) = snapshot {
            books.durable.snapshot = snapshot;
            books.durable.policy = counted;
        }
        if records_changed {
            books.durable.records = (*locked.records).clone();
            books.durable.records_generation = locked.records.generation();
        }
        books.version += 1;
        Some(books.version)
    }

    /// The newest version if it is not on disk yet (an earlier save failed, or one is under
    /// way): what a claim's commit and the background retry save ([`Core::retry_once`]).
    fn unsaved(&self) -> Option<u64> {
        (self.books.version > self.books.saved.load(Ordering::Acquire))
            .then_some(self.books.version)
    }

    /// Notes changes ([`Inner::note_changes`]) and returns the version that includes every
    /// change so far, whoever made it.
    fn current_version(&mut self) -> u64 {
        self.note_changes();
        self.books.version
    }

    /// The newest durable state and its version.
    fn durable_state(&self) -> (u64, State) {
        let state = State {
            version: STATE_VERSION,
            policy: self.locked.policy.name().to_owned(),
            policy_state: self.books.durable.snapshot.clone(),
            claims: self.books.durable.records.clone(),
        };
        (self.books.version, state)
    }
}

#[cfg(test)]
mod tests {
    // They block a thread under the lock on purpose: a holder stuck there is what they make.
    #![allow(clippy::disallowed_methods)]

    use std::path::Path;

    use policy::{Topology, TopologyAware, TopologySource};

    use super::*;
    use crate::{
        faults::Faults,
        runtime::{BoxFuture, RuntimeError},
        state::StateFile,
    };

    /// A runtime the core never calls here.
    #[derive(Debug)]
    struct NoRuntime;

    impl Runtime for NoRuntime {
        fn update_containers(
            &self,
            _updates: Vec<policy::ContainerUpdate>,
        ) -> BoxFuture<'_, Result<Vec<String>, RuntimeError>> {
            Box::pin(std::future::ready(Ok(Vec::new())))
        }
    }

    /// A core over the real policy on a small synthetic machine, its disk in `dir`.
    fn core(dir: &Path) -> Core {
        let topology = Topology::load(&TopologySource::Synthetic(
            "pack:1 numa:1 core:2 pu:1".into(),
        ))
        .unwrap();
        let policy = TopologyAware::new(topology, policy::Config::default()).unwrap();
        let specs = cdi::SpecStore::new(dir.join("cdi"), "test.example.com").unwrap();
        let second = Duration::from_secs(1);
        Core::new(
            Box::new(policy),
            Records::default(),
            Reconciliation::default(),
            Disk::new(StateFile::new(dir.join("state")), specs, Faults::default()),
            Arc::new(NoRuntime),
            Timing {
                update_timeout: second,
                retry_backoff: second,
                max_retry_backoff: second,
            },
        )
    }

    /// Takes the lock with `with_lock` while another thread holds it for `held`; what that
    /// logged, and the line of the `with_lock` call.
    fn wait_behind_a_holder(held: Duration) -> (String, u32) {
        let dir = tempfile::tempdir().unwrap();
        let core = Arc::new(core(dir.path()));
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let mut line = 0;
        // The waiting call runs on this thread (block_on), where the logs are captured.
        let logged = stdx::logs::captured(|| {
            runtime.block_on(async {
                let (entered, wait_for_entry) = tokio::sync::oneshot::channel();
                let holder = {
                    let core = core.clone();
                    tokio::task::spawn_blocking(move || {
                        tokio::runtime::Handle::current().block_on(core.with_lock(|_guard| {
                            entered.send(()).unwrap();
                            // What is measured: a holder that keeps the lock this long.
                            std::thread::sleep(held);
                        }));
                    })
                };
                wait_for_entry.await.unwrap();
                let (waiting, at) = (core.with_lock(|_guard| ()), line!());
                line = at;
                waiting.await;
                holder.await.unwrap();
            });
        });
        (logged, line)
    }

    #[test]
    fn a_long_wait_for_the_lock_is_logged_with_the_callers_place() {
        let (logged, line) = wait_behind_a_holder(Duration::from_millis(600));
        assert!(
            logged.contains("waited long for the manager lock"),
            "{logged}"
        );
        let at = format!("at={}:{line}:", file!());
        assert!(logged.contains(&at), "{at} not in {logged}");
    }

    #[test]
    fn a_short_one_is_not() {
        let logged = stdx::logs::captured(|| {
            warn_if_long(std::panic::Location::caller(), Duration::from_millis(200));
        });
        assert_eq!(logged, "");
    }
}
