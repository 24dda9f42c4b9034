//! Reconciling what is on disk with what runs and what the API server says: CDI specs the state
//! does not account for, and claims held without proof that anyone still wants them.
//!
//! # The contract
//!
//! **Nothing on disk stops the agent.** Whatever the state directory and the CDI directory hold,
//! the manager starts and serves. What it cannot reconcile it reports (the log, the
//! `reconciled_claims` metric, an Event on the Node, `/debug/state`). The one exception is a risk
//! of granting the same CPUs twice (below): then claims are refused, saying why and how to
//! recover, and readiness stays false, while NRI is served and the process keeps running, so
//! liveness does not crash-loop it.
//!
//! **A spec proves use only when something uses it.** Our ordering (the spec is written after
//! its claim is saved, and removed before the claim leaves the state) never leaves a spec the
//! state does not account for, so next to an intact state such a *stray* is a leftover (a
//! restored backup, a failed cleanup, a manual copy), and after a lost state directory every spec
//! is one. Each stray is judged by evidence:
//!
//! 1. At start, before anything is served, a stray that reads back is *adopted*
//!    ([`policy::Policy::adopt_claim`]) so that the Synchronize that follows places nobody on its
//!    CPUs; one that does not read back, or whose CPUs the policy cannot give it (another claim of
//!    the state holds them), waits for the Synchronize.
//! 2. At the runtime's Synchronize, the running containers say who uses it (its CDI device, or
//!    its `DRA_CPUSET_<uid>` environment when the runtime reports no CDI devices:
//!    [`policy::claim_env`]):
//!    - an unreadable spec that a container uses: the claim is taken back from what that
//!      container's environment (or, failing that, its cpuset) shows, so its CPUs stay out of
//!      every grant; one that nothing uses is *set aside* (renamed `<file>.unreadable`, never
//!      deleted);
//!    - a readable spec whose CPUs claims of the state hold that have no spec and that no
//!      container uses (an older state restored): those claims *give way*, released so that the
//!      kubelet's next prepare of one allocates it afresh, and the stray is taken back. A spec
//!      proves that a prepare completed; a claim held without one proves nothing;
//!    - a readable spec whose CPUs another claim of the state holds otherwise: if a container
//!      uses it, two claims grant the same CPUs and the agent refuses claims until an operator
//!      resolves it (*contested*); if nothing uses it, the spec is removed (*swept*), unless the
//!      API server says it is allocated here (contested too).
//! 3. After the Synchronize, an adopted stray that no container uses is looked up in the API
//!    server (with DRA): allocated to this node, it stays adopted (its pod may not have started
//!    its containers yet, and the kubelet, which thinks it prepared, will not prepare it again);
//!    not allocated here (deleted, re-created, allocated elsewhere) it is swept: its spec
//!    removed, then its claim released and saved, as an unprepare does. An API server that
//!    cannot be reached sweeps nothing; the next pass asks again. Without DRA there is no API
//!    server half and a stray nothing uses is swept at once.
//!
//! **Held claims are reconciled until they are confirmed or gone.** An adopted claim, and a
//! claim the state holds without a spec (a crash before the spec write, or an older state
//! restored), is *unconfirmed*. A prepare of the kubelet confirms it. A pass every
//! [`ReconcileConfig::period`] looks at each unconfirmed claim: while a container uses it, or the
//! API server says it is allocated to this node, it stays; once neither holds it is released
//! after [`ReconcileConfig::grace`] (log line, Event on the Node, metric), spec first. The grace
//! is longer than the kubelet's own reconcile of inactive pods (it unprepares the claims of pods
//! that went while we were away about a minute after it starts, from its checkpoint): the
//! kubelet's unprepare is the normal path, this is the backstop for claims it no longer knows.
//! Without DRA only adopted claims are released this way (when their containers are gone): a
//! claim prepared before DRA was turned off keeps its CPUs until the kubelet unprepares it.
//!
//! What is done with the disk (sweeping, setting aside, releasing) happens outside the manager
//! lock, through [`crate::disk`], like every commit.

// Blocking IO under the manager lock does not pass clippy (crates/resmgr/clippy.toml).
#![deny(clippy::disallowed_methods)]

use kube_dra::Notice;
use kubelet_plugin::ClaimRef;
use stdx::errors::chain;
use tokio::time::Instant;
use tracing::{debug, info, warn};

pub use crate::reconciliation::{
    DEFAULT_GRACE, Outcome, RECENT, ReconcileConfig, ReconcileReport, Reconciled,
};
use crate::{
    manager::Manager,
    reconciliation::{Chore, claim_ref},
};

/// What the evidence says of an unconfirmed claim that no container uses.
#[derive(Debug)]
enum Standing {
    /// The API server says it is allocated here (for these pods).
    Wanted(String),
    /// Nothing wants it: why.
    Unwanted(String),
    /// No answer: why.
    Unknown(String),
}

impl Manager {
    /// Tells users what reconciliation did, when it is a warning: an Event on the Node.
    pub(crate) fn tell(&self, done: &Reconciled) {
        if done.outcome.is_warning() {
            self.recorder.record(Notice::ClaimReconciled {
                message: done.to_string(),
            });
        }
    }

    /// What reconciliation did and holds.
    pub async fn reconciliation(&self) -> ReconcileReport {
        self.core.with_lock(|inner| inner.reconcile.report()).await
    }

    /// The disk work the Synchronize decided: sweeping strays that were never adopted, setting
    /// aside unreadable ones that nothing uses.
    pub(crate) async fn do_reconcile_chores(&self) {
        let chores = self
            .core
            .with_lock(|mut inner| std::mem::take(&mut inner.reconcile.chores))
            .await;
        for chore in chores {
            let done = match chore {
                Chore::Sweep(uid) => self.sweep_refused(uid).await,
                Chore::SetAside(uid) => self.set_aside_unused(uid).await,
            };
            if let Some(done) = done {
                self.tell(&done);
            }
        }
    }

    /// A readable stray that nothing uses, whose CPUs another claim of the state holds: swept,
    /// unless the API server says it is allocated here (then contested: sweeping would strand
    /// its pod, granting would grant the same CPUs twice) or cannot say (then it stays until the
    /// next start).
    async fn sweep_refused(&self, uid: String) -> Option<Reconciled> {
        if self.config.reconcile.pool.is_some() {
            match self.standing(&ClaimRef::new("", "", &uid), false).await {
                Standing::Unwanted(_) => {}
                Standing::Unknown(why) => {
                    warn!(claim = %uid, reason = %why, "a stray cdi spec whose cpus another claim holds stays until the next start: the api server cannot say whether it is allocated here");
                    return None;
                }
                Standing::Wanted(why) => {
                    // The claim is wanted here, but the policy gave its CPUs to another claim of
                    // the state (an older state restored).
                    let detail = format!(
                        "its CDI spec, which the state does not account for, grants cpus another claim of the state holds, \
                         and {why}: claims are refused so that no cpu is granted twice. The other claim, if nothing wants it, \
                         is released after unconfirmed-claim-grace; then restart the agent (delete its pod) to take this one back"
                    );
                    return self
                        .core
                        .with_lock(|mut inner| {
                            inner
                                .reconcile
                                .report
                                .contested
                                .insert(uid.clone(), detail.clone());
                            Some(inner.reconcile.note(&uid, Outcome::Contested, detail))
                        })
                        .await;
                }
            }
        }
        match self.core.remove_spec(&uid).await {
            Ok(_) => {
                // Its device metadata went with it; left behind, the next start removes it.
                if let Err(e) = self.core.remove_metadata(&uid).await {
                    warn!(claim = %uid, error = %chain(&e), "removing the device metadata of a swept cdi spec failed");
                }
                let detail = "its CDI spec, which the state did not account for and whose cpus another claim holds, is used by no container: removed";
                let done = self
                    .core
                    .with_lock(|mut inner| inner.reconcile.note(&uid, Outcome::Swept, detail))
                    .await;
                Some(done)
            }
            Err(e) => {
                // The spec stays; the next start judges it again.
                warn!(claim = %uid, error = %chain(&e), "sweeping a stray cdi spec failed; it stays until the next start");
                None
            }
        }
    }

    /// An unreadable stray that nothing uses: moved aside, never deleted.
    async fn set_aside_unused(&self, uid: String) -> Option<Reconciled> {
        match self.core.set_aside(&uid).await {
            Ok(path) => {
                let path = path.map(|p| p.display().to_string()).unwrap_or_default();
                let detail = format!(
                    "its CDI spec cannot be read and no container uses it: moved aside to {path}"
                );
                let done = self
                    .core
                    .with_lock(|mut inner| inner.reconcile.note(&uid, Outcome::SetAside, detail))
                    .await;
                Some(done)
            }
            Err(e) => {
                warn!(claim = %uid, error = %chain(&e), "setting aside an unreadable cdi spec failed; it stays until the next start");
                None
            }
        }
    }

    /// Reconciles unconfirmed claims every [`ReconcileConfig::period`], for as long as the
    /// manager lives. Started once the runtime has synchronized.
    pub async fn run_reconciler(&self) {
        loop {
            self.reconcile_once().await;
            tokio::time::sleep(self.config.reconcile.period).await;
        }
    }

    /// One pass over the unconfirmed claims (see the module docs).
    pub async fn reconcile_once(&self) {
        let candidates: Vec<(String, ClaimRef, bool, bool)> = self
            .core
            .with_lock(|inner| {
                inner
                    .reconcile
                    .unconfirmed
                    .iter()
                    .map(|(uid, u)| {
                        let record = inner.records.get(uid);
                        let adopted = record.is_some_and(|r| r.adopted);
                        (
                            uid.clone(),
                            claim_ref(uid, record),
                            inner.reconcile.is_used(uid),
                            adopted || u.stray,
                        )
                    })
                    .collect()
            })
            .await;
        for (uid, claim, used, adopted) in candidates {
            let standing = if used {
                Standing::Wanted("a running container uses it".into())
            } else {
                self.standing(&claim, adopted).await
            };
            let now = Instant::now();
            // What to tell once the lock is let go, and what to release.
            let (adopted, release) = self.core
                .with_lock(|mut inner| {
                    let r = &mut inner.reconcile;
                    let Some(u) = r.unconfirmed.get_mut(&uid) else {
                        return (None, None); // confirmed or released meanwhile
                    };
                    match standing {
                        Standing::Wanted(why) => {
                            u.unwanted_since = None;
                            if !std::mem::take(&mut u.stray) {
                                return (None, None);
                            }
                            let done = r.note(&uid, Outcome::Adopted, format!(
                                "its CDI spec, which the state did not account for, is used by no container, but {why}: the claim was taken back from the spec"
                            ));
                            (Some(done), None)
                        }
                        Standing::Unknown(why) => {
                            debug!(claim = %uid, reason = %why, "cannot tell whether an unconfirmed claim is still wanted; asking again later");
                            (None, None)
                        }
                        Standing::Unwanted(why) if u.stray => {
                            let detail = format!(
                                "its CDI spec, which the state did not account for, is used by no container and {why}: removed, and its cpus released"
                            );
                            (None, Some((Outcome::Swept, detail)))
                        }
                        Standing::Unwanted(why) => match u.unwanted_since {
                            None => {
                                u.unwanted_since = Some(now);
                                info!(claim = %uid, reason = %why, grace = ?self.config.reconcile.grace,
                                    "an unconfirmed claim is used by no container: released after the grace period unless the kubelet prepares it or a container uses it");
                                (None, None)
                            }
                            Some(since)
                                if now.saturating_duration_since(since)
                                    >= self.config.reconcile.grace =>
                            {
                                let detail = format!(
                                    "held without the kubelet preparing it again, used by no container for {:?}, and {why}: released",
                                    self.config.reconcile.grace
                                );
                                (None, Some((Outcome::Released, detail)))
                            }
                            Some(_) => (None, None),
                        },
                    }
                })
                .await;
            if let Some(done) = adopted {
                self.tell(&done);
            }
            if let Some((outcome, detail)) = release {
                self.release_unwanted(&claim, outcome, detail).await;
            }
        }
    }

    /// What says whether unconfirmed claim `claim`, which no container uses, is wanted.
    async fn standing(&self, claim: &ClaimRef, adopted: bool) -> Standing {
        let Some(pool) = &self.config.reconcile.pool else {
            // Without DRA nothing can prepare a claim: one taken back from its spec is wanted
            // only by its containers. A claim prepared before DRA was turned off keeps its
            // CPUs until the kubelet unprepares it.
            return if adopted {
                Standing::Unwanted("without DRA nothing can prepare it".into())
            } else {
                Standing::Wanted("it was prepared before DRA was turned off".into())
            };
        };
        match self.claim_reader.find_claim(claim).await {
            Ok(Some(found)) if found.results.iter().any(|r| r.pool == *pool) => {
                let pods = if found.reserved_for.is_empty() {
                    "no pod yet".to_owned()
                } else {
                    format!("pods {}", found.reserved_for.join(", "))
                };
                Standing::Wanted(format!(
                    "the api server says resource claim {}/{} is allocated to this node (reserved for {pods})",
                    found.namespace, found.name
                ))
            }
            Ok(Some(found)) => Standing::Unwanted(format!(
                "resource claim {}/{} is allocated elsewhere",
                found.namespace, found.name
            )),
            Ok(None) => Standing::Unwanted(
                "the api server has no allocated resource claim of that uid".into(),
            ),
            Err(e) => Standing::Unknown(chain(&e)),
        }
    }

    /// Releases an unconfirmed claim nothing wants, as an unprepare does (spec first), unless a
    /// prepare confirmed it or a container started using it meanwhile.
    async fn release_unwanted(&self, claim: &ClaimRef, outcome: Outcome, detail: String) {
        let uid = claim.uid.as_str();
        let _turn = self.claim_locks.lock(uid).await;
        let still_unwanted = self
            .core
            .with_lock(|inner| {
                inner.reconcile.unconfirmed.contains_key(uid) && !inner.reconcile.is_used(uid)
            })
            .await;
        if !still_unwanted {
            return;
        }
        match self.unprepare_steps(claim).await {
            Ok(()) => {
                let done = self
                    .core
                    .with_lock(|mut inner| inner.reconcile.note(uid, outcome, detail))
                    .await;
                self.tell(&done);
            }
            Err(e) => {
                warn!(error = %e, "releasing an unconfirmed claim failed; the next pass tries again")
            }
        }
    }
}
