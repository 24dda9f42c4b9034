//! Runtime events, in domain terms: what the resource manager does for each NRI event.
//!
//! Each handler takes the manager lock, asks the policy, turns the lock into a change and commits
//! it ([`crate::commit`]): the state is saved only if the policy's durable state changed (with
//! the topology-aware policy container events change nothing durable and never wait for the
//! disk). It returns the updates the policy made so the NRI reply can carry them.
//! Updates carried by a reply are delivered by it; the few events whose reply cannot carry
//! updates (those that arrive as StateChange) leave them pending for the background delivery,
//! because calling the runtime from inside its own event would deadlock (see [`crate::manager`]).
//!
//! The wire translation (NRI messages to domain types) happens before these are called.

use policy::{Allocation, Container, ContainerUpdate, PolicyError, Resources};
use tracing::{error, info, warn};

use crate::{
    commit::CommitError,
    errors::chain,
    manager::{Inner, Manager},
    pending::Ticket,
};

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
            .with_lock(|mut inner| {
                // Strays are judged by who runs before the policy places anyone
                // (crate::reconcile).
                let Inner {
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
        self.commit(change)
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
        if let Some(why) = self.with_lock(|inner| inner.reconcile.contested()).await {
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
        if let Err(source) = self.commit(change).await {
            // The runtime fails the container, and the reply with the updates of others never
            // reaches it: what placing it changed for them is undone, and asserted again in case
            // any of it reached them, from wherever they may be now.
            self.with_lock(|mut inner| {
                inner.pending.forget(&container.id);
                for moved in &allocation.updates {
                    inner.pending.placed(&moved.container_id, None);
                }
                match inner.policy.release(&container.id) {
                    Ok(updates) => {
                        self.record_pending(&mut inner, updates);
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

    /// The runtime started a container (its PostStartContainer): updates of it made while it
    /// was being created and started go out now, from the background (the runtime waits for
    /// this event's answer under the lock it serves `UpdateContainers` with).
    pub async fn container_started(&self, container: &Container) {
        self.with_lock(|mut inner| self.note_started(&mut inner, &container.id))
            .await;
    }

    /// A container's resources changed.
    pub async fn update_container(
        &self,
        container: &Container,
        resources: &Resources,
    ) -> Result<Vec<ContainerUpdate>, EventError> {
        let (updates, change) = self
            .with_lock(|mut inner| {
                let updates = inner
                    .policy
                    .update(&container.id, resources)
                    .map_err(|source| EventError::Policy {
                        container: describe(container),
                        source,
                    })?;
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
        self.commit(change)
            .await
            .map_err(|source| EventError::Commit {
                container: describe(container),
                source,
            })?;
        Ok(updates)
    }

    /// The runtime updated a container (its PostUpdateContainer): updates of it made meanwhile
    /// go out now, from the background.
    pub async fn container_updated(&self, container: &Container) {
        self.with_lock(|mut inner| self.note_started(&mut inner, &container.id))
            .await;
    }

    /// A container stopped: release what it held. The updates go in the StopContainer reply.
    pub async fn stop_container(&self, container: &Container) -> Vec<ContainerUpdate> {
        let (updates, change) = self
            .with_lock(|mut inner| {
                inner.pending.forget(&container.id);
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
        if let Err(e) = self.commit(change).await {
            warn!(container = %describe(container), error = %chain(&e), "committing a stopped container");
        }
        updates
    }

    /// A container was removed (or stopped without a StopContainer event reaching us). Its reply
    /// carries no updates, so what releasing it changes is delivered in the background.
    pub async fn remove_container(&self, container: &Container) {
        let change = self
            .with_lock(|mut inner| {
                inner.pending.forget(&container.id);
                inner.reconcile.container_gone(&container.id);
                match inner.policy.release(&container.id) {
                    Ok(updates) => {
                        // Delivered in the background: nothing here waits for them.
                        self.record_pending(&mut inner, updates);
                    }
                    Err(e) => {
                        warn!(container = %describe(container), error = %e, "releasing a removed container");
                    }
                }
                inner.change(Ticket::default())
            })
            .await;
        if let Err(e) = self.commit(change).await {
            warn!(container = %describe(container), error = %chain(&e), "committing a removed container");
        }
    }
}
