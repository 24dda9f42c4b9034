//! Container updates that the runtime does not have yet.
//!
//! Every placement change the policy makes to a running container becomes a pending update here,
//! and stays pending until the runtime has confirmed it. This is where the Go anchor lost state
//! (it cleared updates before sending them): here an update is cleared only by a confirmed
//! delivery of that very version, never by an attempt.
//!
//! Updates are level-triggered: each entry holds the full desired cpuset/mems of a container, so a
//! newer update for the same container replaces the older one instead of queueing behind it.
//! Every entry carries a sequence number; a delivery confirms the versions it carried, and an
//! entry that changed while the delivery was in flight stays pending with its newer value.

use std::collections::BTreeMap;

use policy::ContainerUpdate;

/// One pending update and the version it is at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Versioned {
    /// Increases with every change of any entry.
    pub seq: u64,
    /// The desired state of the container.
    pub update: ContainerUpdate,
}

/// The pending updates, by container ID.
#[derive(Debug, Default)]
pub struct PendingUpdates {
    entries: BTreeMap<String, Versioned>,
    /// Containers some delivery in flight carries: their fate is unknown until it returns.
    in_flight: BTreeMap<String, u32>,
    next_seq: u64,
}

impl PendingUpdates {
    /// Records updates the policy made. An update for a container that already has one merges
    /// into it field by field: a new cpuset with no opinion on mems keeps the pending mems.
    pub fn record(&mut self, updates: impl IntoIterator<Item = ContainerUpdate>) {
        for update in updates {
            self.next_seq += 1;
            let seq = self.next_seq;
            match self.entries.get_mut(&update.container_id) {
                Some(entry) => {
                    if update.cpus.is_some() {
                        entry.update.cpus = update.cpus;
                    }
                    if update.mems.is_some() {
                        entry.update.mems = update.mems;
                    }
                    entry.seq = seq;
                }
                None => {
                    self.entries
                        .insert(update.container_id.clone(), Versioned { seq, update });
                }
            }
        }
    }

    /// Takes note that updates went to the runtime inside an NRI reply, which delivers them.
    ///
    /// They supersede what was pending for those containers, unless a delivery that may carry an
    /// older version is in flight: the runtime may apply that one after the reply, so the
    /// reply's value stays pending to be asserted again once the delivery returns.
    pub fn delivered_in_reply(&mut self, updates: &[ContainerUpdate]) {
        for update in updates {
            if self.in_flight.contains_key(&update.container_id) {
                self.record([update.clone()]);
            } else {
                self.entries.remove(&update.container_id);
            }
        }
    }

    /// Forgets a container that is gone: the runtime would refuse updates to it.
    pub fn forget(&mut self, container_id: &str) {
        self.entries.remove(container_id);
    }

    /// Whether anything is pending.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// How many containers have pending updates.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// The pending update of a container, if any.
    pub fn get(&self, container_id: &str) -> Option<&ContainerUpdate> {
        self.entries.get(container_id).map(|v| &v.update)
    }

    /// Starts a delivery of everything pending: returns the batch to send, in container order,
    /// and marks its containers in flight. Nothing is cleared until [`Self::finish`].
    pub fn begin(&mut self) -> Vec<Versioned> {
        let batch: Vec<Versioned> = self.entries.values().cloned().collect();
        for v in &batch {
            *self
                .in_flight
                .entry(v.update.container_id.clone())
                .or_default() += 1;
        }
        batch
    }

    /// Starts a delivery of one container's pending update, if it has one.
    pub fn begin_one(&mut self, container_id: &str) -> Option<Versioned> {
        let v = self.entries.get(container_id)?.clone();
        *self.in_flight.entry(container_id.to_owned()).or_default() += 1;
        Some(v)
    }

    /// Ends a delivery started by [`Self::begin`] or [`Self::begin_one`]. `confirmed` are the containers the runtime
    /// confirmed (none on an error: runtimes drop the list of failures when they fail the call,
    /// so after an error nothing is known to have applied). A confirmed entry is cleared only if
    /// it is still at the version that was sent.
    pub fn finish(&mut self, batch: &[Versioned], confirmed: impl Fn(&str) -> bool) {
        for sent in batch {
            let id = &sent.update.container_id;
            if let Some(n) = self.in_flight.get_mut(id) {
                *n -= 1;
                if *n == 0 {
                    self.in_flight.remove(id);
                }
            }
            if confirmed(id) && self.entries.get(id).is_some_and(|v| v.seq == sent.seq) {
                self.entries.remove(id);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use policy::CpuSet;

    use super::*;

    fn upd(id: &str, cpus: &str) -> ContainerUpdate {
        ContainerUpdate {
            container_id: id.into(),
            cpus: Some(cpus.parse::<CpuSet>().unwrap()),
            mems: None,
        }
    }

    fn cpus(p: &PendingUpdates, id: &str) -> Option<String> {
        p.get(id)
            .and_then(|u| u.cpus.as_ref())
            .map(ToString::to_string)
    }

    #[test]
    fn a_newer_update_replaces_the_older_and_merges_fields() {
        let mut p = PendingUpdates::default();
        p.record([ContainerUpdate {
            mems: Some("0".parse().unwrap()),
            ..upd("a", "0-3")
        }]);
        p.record([upd("a", "0-1")]);
        assert_eq!(p.len(), 1);
        assert_eq!(cpus(&p, "a").as_deref(), Some("0-1"));
        assert_eq!(p.get("a").unwrap().mems.as_ref().unwrap().to_string(), "0");
    }

    #[test]
    fn only_a_confirmed_delivery_clears() {
        let mut p = PendingUpdates::default();
        p.record([upd("a", "0-3"), upd("b", "4-7")]);
        let batch = p.begin();
        assert_eq!(batch.len(), 2);
        assert_eq!(p.len(), 2, "beginning a delivery clears nothing");
        p.finish(&batch, |_| false);
        assert_eq!(p.len(), 2, "a failed delivery keeps everything pending");
        let batch = p.begin();
        p.finish(&batch, |id| id == "a");
        assert_eq!(cpus(&p, "a"), None);
        assert_eq!(cpus(&p, "b").as_deref(), Some("4-7"));
    }

    #[test]
    fn an_update_changed_during_delivery_stays_pending() {
        let mut p = PendingUpdates::default();
        p.record([upd("a", "0-3")]);
        let batch = p.begin();
        p.record([upd("a", "0-1")]);
        p.finish(&batch, |_| true);
        assert_eq!(cpus(&p, "a").as_deref(), Some("0-1"));
    }

    #[test]
    fn a_reply_supersedes_pending_unless_a_delivery_is_in_flight() {
        let mut p = PendingUpdates::default();
        p.record([upd("a", "0-3"), upd("b", "0-3")]);
        p.delivered_in_reply(&[upd("a", "0-5")]);
        assert_eq!(cpus(&p, "a"), None, "the reply delivered a's newest state");

        let batch = p.begin(); // carries b at 0-3
        p.delivered_in_reply(&[upd("b", "0-7")]);
        assert_eq!(
            cpus(&p, "b").as_deref(),
            Some("0-7"),
            "b must be asserted again"
        );
        p.finish(&batch, |_| true);
        assert_eq!(
            cpus(&p, "b").as_deref(),
            Some("0-7"),
            "the older delivery does not clear it"
        );
        let batch = p.begin();
        p.finish(&batch, |_| true);
        assert!(p.is_empty());
    }

    #[test]
    fn a_finished_delivery_is_no_longer_in_flight() {
        let mut p = PendingUpdates::default();
        assert!(p.is_empty());
        p.record([upd("a", "0-3")]);
        assert!(!p.is_empty());
        let first = p.begin();
        let second = p.begin(); // two deliveries carry a
        p.finish(&first, |_| true);
        p.delivered_in_reply(&[upd("a", "0-5")]);
        assert_eq!(
            cpus(&p, "a").as_deref(),
            Some("0-5"),
            "one delivery is still in flight"
        );
        p.finish(&second, |_| true);
        p.delivered_in_reply(&[upd("a", "0-7")]);
        assert_eq!(
            cpus(&p, "a"),
            None,
            "nothing in flight: the reply delivered it"
        );
    }

    #[test]
    fn forgotten_containers_are_not_sent() {
        let mut p = PendingUpdates::default();
        p.record([upd("a", "0-3")]);
        p.forget("a");
        assert!(p.begin().is_empty());
    }
}
