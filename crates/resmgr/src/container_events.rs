//! Runtime events, in domain terms: what the resource manager does for each NRI event.
//!
//! Each handler takes the manager lock, asks the policy, turns the lock into a change and commits
//! it ([`crate::core`]): the state is saved only if the policy's durable state changed (with
//! the topology-aware policy container events change nothing durable and never wait for the
//! disk). It returns the updates the policy made so the NRI reply can carry them.
//! Updates carried by a reply are delivered by it; the few events whose reply cannot carry
//! updates (those that arrive as StateChange) leave them pending for the background delivery,
//! because calling the runtime from inside its own event would deadlock (see [`crate::core`]).
//!
//! The wire translation (NRI messages to domain types) happens before these are called.
//!
//! # Containers the Synchronize did not list
//!
//! The policy is meant to hold every container the runtime runs: those its Synchronize lists,
//! and those created since. containerd holds a plugin's synchronization while it creates,
//! starts, updates or stops a container (`BlockPluginSync`), so its Synchronize lists every
//! container it has, created ones included ([`Manager::synchronize_starting`]). CRI-O 1.36 does
//! not: it lists the containers of its server, which a container joins only once created, after
//! the CreateContainer call to the plugins. A container whose CreateContainer reached no agent of
//! ours (the gap of a restart, a crash or a handover; an event in flight when the old agent
//! disconnected, which the runtime goes on with, unadjusted) and that joins CRI-O's server right
//! after the list is made is in no Synchronize, and runs where the kubelet created it: on every
//! CPU, claims' included. CRI-O also inserts a plugin into its list a moment after synchronizing
//! it, and the events of that moment do not reach it.
//!
//! So every event that names a container the policy does not hold (PostCreateContainer,
//! PostStartContainer, UpdateContainer, PostUpdateContainer) places it first, as the
//! Synchronize would have ([`policy::Policy::adopt_container`]: a claim's container, told by
//! its claim's evidence, on its claim's CPUs; others shared or exclusive by their class), noting
//! where the runtime says it runs now, so that a claim granted CPUs it may run on waits for its
//! move ([`crate::pending`]). Its updates go out as any event's do: in the reply of an
//! UpdateContainer, otherwise from the background, and not before the runtime has started it
//! (until its PostStartContainer, [`crate::pending`]). A StopContainer or RemoveContainer of such
//! a container places nothing: it runs no more, and releasing it holds nothing.
//!
//! PostCreateContainer comes before the container runs. What no event can mend: a claim granted
//! in the moments between the Synchronize and the container's PostCreateContainer is not held
//! back by it (the container runs on its CPUs until its first update lands, right after its
//! start), and a container every event of which misses the agent until it stops is never
//! placed.

// Blocking IO under the manager lock does not pass clippy (crates/resmgr/clippy.toml).
#![deny(clippy::disallowed_methods)]

use policy::{Allocation, Container, ContainerUpdate, PolicyError, Resources};
use stdx::errors::chain;
use tracing::{error, info, warn};

use crate::{core::CommitError, core::Locked, manager::Manager, pending::Ticket};

/// Why an event handler failed; the runtime fails the CRI operation with this message.
#[derive(Debug, thiserror::Error)]
pub enum EventError {
    /// The policy refused.
    #[error("container {container}")]
    Policy {
        /// `namespace/pod/container`.
        container: String,
        /// The policy's reason.
        #[source]
        source: PolicyError,
    },
    /// The change could not be committed (its state saved).
    #[error("container {container}")]
    Commit {
        /// `namespace/pod/container`.
        container: String,
        /// The cause.
        #[source]
        source: CommitError,
    },
}

fn describe(c: &Container) -> String {
    format!("{}/{}/{}", c.pod.namespace, c.pod.name, c.name)
}

/// Where a container the policy first hears of is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// Created, not started: the runtime may drop its updates until it starts it.
    Created,
    /// Running.
    Running,
}

/// `updates` and then `then`, one update per container, each container's fields as the later
/// update sets them (and the earlier where the later leaves one alone); `last`'s update, if
/// any, comes last, as the runtime takes the last update of an UpdateContainer reply for the
/// container being updated.
fn merged(
    updates: Vec<ContainerUpdate>,
    then: Vec<ContainerUpdate>,
    last: &str,
) -> Vec<ContainerUpdate> {
    let mut out: Vec<ContainerUpdate> = Vec::new();
    for update in updates.into_iter().chain(then) {
        match out
            .iter_mut()
            .find(|u| u.container_id == update.container_id)
        {
            Some(earlier) => {
                if update.cpus.is_some() {
                    earlier.cpus = update.cpus;
                }
                if update.mems.is_some() {
                    earlier.mems = update.mems;
                }
            }
            None => out.push(update),
        }
    }
    if let Some(i) = out.iter().position(|u| u.container_id == last) {
        let own = out.remove(i);
        out.push(own);
    }
    out
}

impl Manager {
    /// The runtime's Synchronize: rebuilds placement from the running containers. The returned
    /// updates go out in the Synchronize reply; once it has been written, call
    /// [`Manager::synchronized`].
    pub async fn synchronize(
        &self,
        containers: &[Container],
    ) -> Result<Vec<ContainerUpdate>, EventError> {
        self.synchronize_starting(containers, &[]).await
    }

    /// [`Manager::synchronize`], where the runtime lists some of `containers` as created and
    /// not running yet (`starting`, by ID).
    ///
    /// The runtime may be starting such a container right now: one created while no agent was
    /// connected (the gap of a restart or a handover, or an event in flight when the old agent
    /// disconnected) whose StartContainer is under way. containerd writes an update of a
    /// container that is not running into its spec only, which the task being started may
    /// already have been made from: the Synchronize reply's update would be confirmed and lost,
    /// and the container would run where the kubelet created it (a claim's container on shared
    /// CPUs too). So, as after its CreateContainer, its updates are held until its
    /// PostStartContainer and delivered then ([`crate::pending`]).
    pub async fn synchronize_starting(
        &self,
        containers: &[Container],
        starting: &[&str],
    ) -> Result<Vec<ContainerUpdate>, EventError> {
        let (updates, change) = self
            .core
            .with_lock(|mut inner| {
                // Strays are judged by who runs before the policy places anyone
                // (crate::reconcile).
                let Locked {
                    policy,
                    records,
                    reconcile,
                    ..
                } = &mut *inner;
                let reconciled = reconcile.synchronize(
                    &self.config.driver,
                    policy.as_mut(),
                    records,
                    containers,
                );
                for done in reconciled {
                    self.tell(&done);
                }
                let updates =
                    inner
                        .policy
                        .sync(containers)
                        .map_err(|source| EventError::Policy {
                            container: format!("(synchronizing {} containers)", containers.len()),
                            source,
                        })?;
                inner.held = containers.iter().map(|c| c.id.clone()).collect();
                // Where each container runs, as the runtime says; then what the reply changes.
                inner.pending.synchronized();
                for c in containers {
                    inner.pending.placed(&c.id, c.cpus.as_ref());
                }
                for id in starting {
                    inner.pending.creating(id);
                }
                inner.pending.delivered_in_reply(&updates);
                Ok((updates, inner.change(Ticket::default())))
            })
            .await?;
        self.core
            .commit(change)
            .await
            .map_err(|source| EventError::Commit {
                container: "(synchronizing)".into(),
                source,
            })?;
        info!(
            containers = containers.len(),
            updates = updates.len(),
            "synchronized with the runtime"
        );
        Ok(updates)
    }

    /// The Synchronize reply has been written to the runtime: deliver what is still pending and
    /// open the claim gate, for good.
    ///
    /// The stray specs that nothing uses are swept or set aside first. The gate stays closed
    /// while a claim is contested (two claims may grant the same CPUs: see [`crate::reconcile`]).
    pub async fn synchronized(&self) {
        self.do_reconcile_chores().await;
        if let Err(e) = self.deliver().await {
            // Every commit delivers pending updates first, and the background retry keeps
            // trying: holding claims back would not get these updates through any sooner.
            warn!(error = %e, "updates pending when the claim gate opens");
        }
        if let Some(why) = self
            .core
            .with_lock(|inner| inner.reconcile.contested())
            .await
        {
            self.gate.refuse(why.clone());
            error!("runtime synchronized, but claims stay refused and the agent unready: {why}");
            return;
        }
        self.gate.open();
        info!("runtime synchronized: serving claims");
    }

    /// A container is being created: where does it go.
    ///
    /// Where the runtime creates it, and that the runtime may drop updates of it until it has
    /// started it, are noted under the same lock as the decision: a claim allocated the moment
    /// the lock is let go must find the container where it is and wait for its update, not
    /// send that update into the gap before the runtime knows the container (which it skips,
    /// reporting it applied) and answer while the container runs on its CPUs.
    pub async fn create_container(&self, container: &Container) -> Result<Allocation, EventError> {
        let (allocation, change) = self
            .core
            .with_lock(|mut inner| {
                inner
                    .reconcile
                    .container_created(&self.config.driver, container);
                let allocation =
                    inner
                        .policy
                        .allocate(container)
                        .map_err(|source| EventError::Policy {
                            container: describe(container),
                            source,
                        })?;
                inner.held.insert(container.id.clone());
                // The runtime creates it where the reply says (or where it asked, if we do not
                // say).
                let cpus = allocation
                    .adjustment
                    .cpus
                    .as_ref()
                    .or(container.cpus.as_ref());
                inner.pending.placed(&container.id, cpus);
                inner.pending.delivered_in_reply(&allocation.updates);
                // Until its PostStartContainer the runtime may drop updates of it
                // (crate::pending).
                inner.pending.creating(&container.id);
                Ok((allocation, inner.change(Ticket::default())))
            })
            .await?;
        if let Err(source) = self.core.commit(change).await {
            // The runtime fails the container, and the reply with the updates of others never
            // reaches it: what placing it changed for them is undone, and asserted again in case
            // any of it reached them, from wherever they may be now.
            self.core.with_lock(|mut inner| {
                inner.pending.forget(&container.id);
                inner.held.remove(&container.id);
                for moved in &allocation.updates {
                    inner.pending.placed(&moved.container_id, None);
                }
                match inner.policy.release(&container.id) {
                    Ok(updates) => {
                        inner.record_pending(updates);
                    }
                    Err(e) => {
                        warn!(container = %describe(container), error = %e, "releasing a container that could not be saved")
                    }
                }
                // Saved by the next commit.
                let _ = inner.change(Ticket::default());
            })
            .await;
            return Err(EventError::Commit {
                container: describe(container),
                source,
            });
        }
        info!(
            container = %describe(container),
            cpus = %allocation.adjustment.cpus.as_ref().map(ToString::to_string).unwrap_or_default(),
            mems = %allocation.adjustment.mems.as_ref().map(ToString::to_string).unwrap_or_default(),
            updates = allocation.updates.len(),
            "container placed"
        );
        for warning in &allocation.warnings {
            warn!(container = %describe(container), "{warning}");
        }
        Ok(allocation)
    }

    /// Places a container the policy does not hold (see the module docs): as the Synchronize
    /// would have, noting where the runtime runs it now and, if the runtime has not started it,
    /// that it may drop its updates until it has. Returns the updates to deliver (the
    /// container's own last), or `None` when the policy holds it already. A policy may refuse
    /// it (the topology-aware one never does): it then runs where the runtime put it, and the
    /// next event that names it tries again.
    fn adopt(
        &self,
        inner: &mut Locked,
        container: &Container,
        stage: Stage,
    ) -> Result<Option<Vec<ContainerUpdate>>, PolicyError> {
        if inner.held.contains(&container.id) {
            return Ok(None);
        }
        let updates = inner.policy.adopt_container(container)?;
        inner.held.insert(container.id.clone());
        inner
            .reconcile
            .container_created(&self.config.driver, container);
        inner.pending.placed(&container.id, container.cpus.as_ref());
        if stage == Stage::Created {
            inner.pending.creating(&container.id);
        }
        let own = updates.iter().find(|u| u.container_id == container.id);
        info!(
            container = %describe(container),
            running_on = %container.cpus.as_ref().map_or_else(|| "every cpu".to_owned(), ToString::to_string),
            cpus = %own.and_then(|u| u.cpus.as_ref()).map(ToString::to_string).unwrap_or_default(),
            updates = updates.len(),
            "placed a container the runtime's Synchronize did not list"
        );
        Ok(Some(updates))
    }

    /// A lifecycle event whose reply carries nothing (PostCreateContainer, PostStartContainer,
    /// PostUpdateContainer), of a container at `stage`: one the policy does not hold is placed
    /// ([`Manager::adopt`]) and its updates go out from the background, committed; a running
    /// one's updates held back until now go out too ([`crate::core::Guard::note_started`]).
    async fn after_event(&self, container: &Container, stage: Stage) {
        let change = self.core
            .with_lock(|mut inner| {
                let adopted = match self.adopt(&mut inner, container, stage) {
                    Ok(adopted) => adopted.map(|updates| inner.record_pending(updates)),
                    Err(e) => {
                        warn!(container = %describe(container), error = %e,
                            "a container the runtime's Synchronize did not list cannot be placed: it runs where the runtime put it");
                        None
                    }
                };
                if stage == Stage::Running {
                    inner.note_started(&container.id);
                }
                adopted.map(|_| inner.change(Ticket::default()))
            })
            .await;
        if let Some(change) = change
            && let Err(e) = self.core.commit(change).await
        {
            warn!(container = %describe(container), error = %chain(&e), "committing a container the runtime's Synchronize did not list");
        }
    }

    /// The runtime created a container (its PostCreateContainer). Only one the policy does not
    /// hold needs anything: it is placed (see the module docs), and its own update waits for
    /// its start.
    pub async fn container_created(&self, container: &Container) {
        self.after_event(container, Stage::Created).await;
    }

    /// The runtime started a container (its PostStartContainer): updates of it made while it
    /// was being created and started go out now, from the background (the runtime waits for
    /// this event's answer under the lock it serves `UpdateContainers` with). One the policy
    /// does not hold is placed first (see the module docs).
    pub async fn container_started(&self, container: &Container) {
        self.after_event(container, Stage::Running).await;
    }

    /// A container's resources changed. One the policy does not hold is placed first (see the
    /// module docs), and the reply carries what that changed too.
    pub async fn update_container(
        &self,
        container: &Container,
        resources: &Resources,
    ) -> Result<Vec<ContainerUpdate>, EventError> {
        let (updates, change) = self
            .core
            .with_lock(|mut inner| {
                // Refused, it is not resized either: the runtime fails the update, saying why.
                let adopted = self
                    .adopt(&mut inner, container, Stage::Running)
                    .map_err(|source| EventError::Policy {
                        container: describe(container),
                        source,
                    })?
                    .unwrap_or_default();
                let updates = match inner.policy.update(&container.id, resources) {
                    Ok(updates) => merged(adopted, updates, &container.id),
                    Err(source) => {
                        // Placed, but not resized: what placing it changed still goes out.
                        inner.record_pending(adopted);
                        return Err(EventError::Policy {
                            container: describe(container),
                            source,
                        });
                    }
                };
                // The updates of others apply with the reply; the container's own after the
                // event: until its PostUpdateContainer ours could be overwritten
                // (crate::pending).
                let (own, others): (Vec<_>, Vec<_>) = updates
                    .iter()
                    .cloned()
                    .partition(|u| u.container_id == container.id);
                inner.pending.delivered_in_reply(&others);
                if !own.is_empty() {
                    inner.pending.updating(&container.id);
                    inner.pending.delivered_in_reply(&own);
                }
                Ok((updates, inner.change(Ticket::default())))
            })
            .await?;
        self.core
            .commit(change)
            .await
            .map_err(|source| EventError::Commit {
                container: describe(container),
                source,
            })?;
        Ok(updates)
    }

    /// The runtime updated a container (its PostUpdateContainer): updates of it made meanwhile
    /// go out now, from the background. One the policy does not hold is placed first (see the
    /// module docs).
    pub async fn container_updated(&self, container: &Container) {
        self.after_event(container, Stage::Running).await;
    }

    /// A container stopped: release what it held. The updates go in the StopContainer reply.
    pub async fn stop_container(&self, container: &Container) -> Vec<ContainerUpdate> {
        let (updates, change) = self.core
            .with_lock(|mut inner| {
                inner.pending.forget(&container.id);
                inner.held.remove(&container.id);
                inner.reconcile.container_gone(&container.id);
                let updates = match inner.policy.release(&container.id) {
                    Ok(updates) => updates,
                    Err(e) => {
                        warn!(container = %describe(container), error = %e, "releasing a stopped container");
                        Vec::new()
                    }
                };
                inner.pending.delivered_in_reply(&updates);
                (updates, inner.change(Ticket::default()))
            })
            .await;
        if let Err(e) = self.core.commit(change).await {
            warn!(container = %describe(container), error = %chain(&e), "committing a stopped container");
        }
        updates
    }

    /// A container was removed (or stopped without a StopContainer event reaching us). Its reply
    /// carries no updates, so what releasing it changes is delivered in the background.
    pub async fn remove_container(&self, container: &Container) {
        let change = self.core
            .with_lock(|mut inner| {
                inner.pending.forget(&container.id);
                inner.held.remove(&container.id);
                inner.reconcile.container_gone(&container.id);
                match inner.policy.release(&container.id) {
                    Ok(updates) => {
                        // Delivered in the background: nothing here waits for them.
                        inner.record_pending(updates);
                    }
                    Err(e) => {
                        warn!(container = %describe(container), error = %e, "releasing a removed container");
                    }
                }
                inner.change(Ticket::default())
            })
            .await;
        if let Err(e) = self.core.commit(change).await {
            warn!(container = %describe(container), error = %chain(&e), "committing a removed container");
        }
    }
}
