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
//!
//! # Tickets
//!
//! Recording updates returns a [`Ticket`]: the version each container was recorded at. A claim
//! prepare waits for its ticket, not for the pending set to be empty: a version is *settled*
//! once the runtime confirmed it or a newer one (which, being the full desired state, supersedes
//! it), or once the container is gone. So two commits at once do not fail each other by each
//! recording a newer version of a shared container while the other's delivery is in flight, and
//! an NRI reply recorded during a delivery does not fail it.
//!
//! # Where a container may run
//!
//! What the policy wants for a container is not always what it runs on: until an update is
//! confirmed, the container runs on what the runtime last confirmed (its placement at creation,
//! what Synchronize reported, a reply, a confirmed delivery), or on any version sent since,
//! which a failed or timed-out call may have applied. Each pending entry keeps that set of CPUs
//! (its *risk*; unknown when the runtime never told us, which counts as anywhere). A claim
//! waits for every pending container whose risk meets its CPUs and that is not meant to run
//! there ([`PendingUpdates::at_risk`]), whether or not its own allocation moved it, and whether
//! this prepare allocated the claim or an earlier one that failed did: a container moved away
//! by an earlier change whose update never arrived is still there. A container that the runtime refuses (one that
//! exited without a Stop or Remove reaching us) holds back only the claims on CPUs it may run
//! on, and its update keeps being retried.
//!
//! # Containers the runtime has not started yet
//!
//! Between our answer to a container's CreateContainer and its PostCreateContainer, the runtime
//! does not know the container yet: containerd adds it to its store, and CRI-O to its server,
//! only after the NRI call returns. Both runtimes skip an update of a container they do not know
//! and report it as applied, whether it came in an event's reply or in `UpdateContainers`. From
//! then until the container runs, containerd writes an update into the container's spec only,
//! which the task it is starting may already have been made from: confirmed, and lost again.
//! So until a container's PostStartContainer an update of it is never taken as delivered: it
//! stays pending, is not sent ([`PendingUpdates::begin`] leaves it out), and goes out once the
//! runtime says it started the container ([`PendingUpdates::started`]). The same holds for a
//! container the runtime's Synchronize lists as created and not running: made while no agent
//! was connected, it may be being started right then
//! ([`crate::Manager::synchronize_starting`]); and for one the Synchronize did not list, which
//! the agent first hears of at its PostCreateContainer ([`crate::container_events`]).
//!
//! Likewise while the runtime updates a container (a resize): containerd applies the updates of
//! other containers in our UpdateContainer reply under its NRI lock, but the container's own
//! resources after the event, outside it, so that an `UpdateContainers` of ours it serves in
//! between is overwritten by what our reply said. Until the container's PostUpdateContainer its
//! updates are held back the same way ([`PendingUpdates::updating`]).

use std::collections::{BTreeMap, BTreeSet};

use policy::{ContainerUpdate, CpuSet};

/// How long a container whose update the runtime did not finish (no PostUpdateContainer: its
/// update failed) holds our updates of it back: a runtime applies an update in milliseconds.
pub const UPDATE_SETTLES: std::time::Duration = std::time::Duration::from_secs(10);

/// Why the runtime may drop or overwrite our updates of a container now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Settling {
    /// It is being created and started.
    Creating,
    /// It is being updated, since then.
    Updating(tokio::time::Instant),
}

/// One pending update and the version it is at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Versioned {
    /// Increases with every change of any entry.
    pub seq: u64,
    /// The desired state of the container.
    pub update: ContainerUpdate,
}

#[derive(Debug)]
struct Entry {
    current: Versioned,
    /// Every version of this container up to this one is settled: confirmed, or superseded by a
    /// confirmed one.
    settled: u64,
    /// The CPUs the container may run on now (see the module docs); `None`: unknown.
    risk: Option<CpuSet>,
}

/// The versions a set of updates was recorded at, by container.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Ticket(BTreeMap<String, u64>);

impl Ticket {
    /// Adds `other`'s versions (the later one of a container named by both).
    pub fn extend(&mut self, other: Ticket) {
        for (id, seq) in other.0 {
            let mine = self.0.entry(id).or_default();
            *mine = (*mine).max(seq);
        }
    }

    /// The containers it names.
    pub fn containers(&self) -> BTreeSet<String> {
        self.0.keys().cloned().collect()
    }

    /// Whether it names no container.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// The pending updates, by container ID.
#[derive(Debug, Default)]
pub struct PendingUpdates {
    entries: BTreeMap<String, Entry>,
    /// Containers some delivery in flight carries: their fate is unknown until it returns.
    in_flight: BTreeMap<String, u32>,
    /// The CPUs the runtime last confirmed for each container, as far as we know.
    known: BTreeMap<String, CpuSet>,
    /// Containers whose CreateContainer was answered and whose PostStartContainer has not come,
    /// or whose UpdateContainer was answered and whose PostUpdateContainer has not come (see
    /// the module docs): the runtime may drop or overwrite their updates.
    starting: BTreeMap<String, Settling>,
    next_seq: u64,
}

impl PendingUpdates {
    /// Records updates the policy made, returning the version each is at. An update for a
    /// container that already has one merges into it field by field: a new cpuset with no
    /// opinion on mems keeps the pending mems.
    pub fn record(&mut self, updates: impl IntoIterator<Item = ContainerUpdate>) -> Ticket {
        let mut ticket = Ticket::default();
        for update in updates {
            self.next_seq += 1;
            let seq = self.next_seq;
            ticket.0.insert(update.container_id.clone(), seq);
            match self.entries.get_mut(&update.container_id) {
                Some(entry) => {
                    if let (Some(risk), Some(cpus)) = (&mut entry.risk, &update.cpus) {
                        *risk = risk.union(cpus);
                    }
                    if update.cpus.is_some() {
                        entry.current.update.cpus = update.cpus;
                    }
                    if update.mems.is_some() {
                        entry.current.update.mems = update.mems;
                    }
                    entry.current.seq = seq;
                }
                None => {
                    // Nothing pending: every earlier version was confirmed or superseded, and
                    // the container runs on what the runtime last confirmed.
                    let risk = self.known.get(&update.container_id).map(|known| {
                        update
                            .cpus
                            .as_ref()
                            .map_or_else(|| known.clone(), |cpus| known.union(cpus))
                    });
                    let entry = Entry {
                        current: Versioned { seq, update },
                        settled: seq - 1,
                        risk,
                    };
                    self.entries
                        .insert(entry.current.update.container_id.clone(), entry);
                }
            }
        }
        ticket
    }

    /// Takes note that updates went to the runtime inside an NRI reply, which delivers them.
    ///
    /// They supersede what was pending for those containers, unless a delivery that may carry an
    /// older version is in flight: the runtime may apply that one after the reply, so the
    /// reply's value stays pending to be asserted again once the delivery returns.
    /// An update of a container the runtime has not started is not delivered by a reply: it
    /// stays pending until the container is started.
    pub fn delivered_in_reply(&mut self, updates: &[ContainerUpdate]) {
        for update in updates {
            if self.in_flight.contains_key(&update.container_id)
                || self.is_starting(&update.container_id)
            {
                self.record([update.clone()]);
            } else {
                self.entries.remove(&update.container_id);
                if let Some(cpus) = &update.cpus {
                    self.known.insert(update.container_id.clone(), cpus.clone());
                }
            }
        }
    }

    /// Takes note of where the runtime runs a container, as it said (Synchronize) or as it
    /// placed it (the adjustment of its creation); `None`: it did not say.
    pub fn placed(&mut self, container_id: &str, cpus: Option<&CpuSet>) {
        match cpus {
            Some(cpus) => {
                self.known.insert(container_id.to_owned(), cpus.clone());
                let in_flight = self.in_flight.contains_key(container_id);
                if let Some(e) = self.entries.get_mut(container_id) {
                    e.risk = if in_flight {
                        // What is in flight may still land.
                        e.risk.as_ref().map(|risk| risk.union(cpus))
                    } else {
                        // There now, and where the pending version would put it.
                        let pending = e.current.update.cpus.as_ref();
                        Some(pending.map_or_else(|| cpus.clone(), |p| p.union(cpus)))
                    };
                }
            }
            None => {
                self.known.remove(container_id);
                if let Some(e) = self.entries.get_mut(container_id) {
                    e.risk = None;
                }
            }
        }
    }

    /// Forgets a container that is gone: the runtime would refuse updates to it, and it runs on
    /// no CPUs any more.
    pub fn forget(&mut self, container_id: &str) {
        self.entries.remove(container_id);
        self.known.remove(container_id);
        self.starting.remove(container_id);
    }

    /// Takes note that the runtime is creating a container: we answered its CreateContainer, and
    /// it may drop updates of it until it says it started it ([`Self::started`]).
    pub fn creating(&mut self, container_id: &str) {
        self.starting
            .insert(container_id.to_owned(), Settling::Creating);
    }

    /// Takes note that the runtime is updating a container: we answered its UpdateContainer, and
    /// it applies the container's own resources after that event, outside the lock it serves
    /// our `UpdateContainers` under, so that one of ours sent before it is done is overwritten,
    /// until it says it did (PostUpdateContainer, [`Self::started`]). A runtime that never says
    /// (its update failed) holds our updates of the container back for [`UPDATE_SETTLES`] at
    /// most. A container still being created stays so.
    pub fn updating(&mut self, container_id: &str) {
        self.starting
            .entry(container_id.to_owned())
            .or_insert(Settling::Updating(tokio::time::Instant::now()));
    }

    /// Takes note that the runtime started (PostStartContainer) or updated
    /// (PostUpdateContainer) a container: its updates can be delivered. Whether one is pending,
    /// to send now.
    pub fn started(&mut self, container_id: &str) -> bool {
        self.starting.remove(container_id).is_some() && self.entries.contains_key(container_id)
    }

    /// Takes note of a Synchronize: the runtime knows every container it lists, and its updates
    /// reach the running ones.
    pub fn synchronized(&mut self) {
        self.starting.clear();
    }

    /// Whether the runtime may still drop or overwrite updates of this container: it has not
    /// started it, or not finished updating it.
    pub fn is_starting(&self, container_id: &str) -> bool {
        self.starting.get(container_id).is_some_and(|s| match s {
            Settling::Creating => true,
            Settling::Updating(since) => since.elapsed() < UPDATE_SETTLES,
        })
    }

    /// Whether anything is pending.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Whether anything pending can be sent now: pending for a container the runtime knows.
    pub fn is_deliverable(&self) -> bool {
        self.entries.keys().any(|id| !self.is_starting(id))
    }

    /// How many containers have pending updates.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// The pending update of a container, if any.
    pub fn get(&self, container_id: &str) -> Option<&ContainerUpdate> {
        self.entries.get(container_id).map(|e| &e.current.update)
    }

    /// The pending containers that may run on some of `cpus` now, at the version pending for
    /// them (see the module docs), whether or not they are meant to.
    pub fn may_run_on(&self, cpus: &CpuSet) -> Ticket {
        Ticket(
            self.entries
                .iter()
                .filter(|(_, e)| e.risk.as_ref().is_none_or(|r| r.intersects(cpus)))
                .map(|(id, e)| (id.clone(), e.current.seq))
                .collect(),
        )
    }

    /// The pending containers that may run on some of `cpus` now and are not meant to: what a
    /// claim granted `cpus` waits for, whether this prepare allocated it or an earlier one did.
    /// A container whose pending cpuset itself takes some of `cpus` is meant to run there (it
    /// uses the claim they are granted to); one whose pending update says nothing of CPUs is at
    /// risk wherever it may run.
    pub fn at_risk(&self, cpus: &CpuSet) -> Ticket {
        let mut ticket = self.may_run_on(cpus);
        ticket.0.retain(|id, _| {
            self.entries[id]
                .current
                .update
                .cpus
                .as_ref()
                .is_none_or(|want| !want.intersects(cpus))
        });
        ticket
    }

    /// The pending containers that may run outside the CPUs pending for them: where any CPU
    /// might be at risk when it is not known which.
    pub fn displaced(&self) -> Ticket {
        Ticket(
            self.entries
                .iter()
                .filter(|(_, e)| match (&e.risk, &e.current.update.cpus) {
                    (None, _) => true,
                    (Some(risk), Some(want)) => !want.is_superset(risk),
                    (Some(_), None) => false,
                })
                .map(|(id, e)| (id.clone(), e.current.seq))
                .collect(),
        )
    }

    /// The containers of `ticket` whose recorded version is not settled yet.
    pub fn unsettled(&self, ticket: &Ticket) -> BTreeSet<String> {
        ticket
            .0
            .iter()
            .filter(|&(id, &seq)| self.entries.get(id).is_some_and(|e| e.settled < seq))
            .map(|(id, _)| id.clone())
            .collect()
    }

    /// Starts a delivery of what is pending for `only` (everything when `None`): returns the
    /// batch to send, in container order, and marks its containers in flight. Nothing is
    /// cleared until [`Self::finish`]. Containers the runtime has not started are left out.
    pub fn begin(&mut self, only: Option<&BTreeSet<String>>) -> Vec<Versioned> {
        let batch: Vec<Versioned> = self
            .entries
            .iter()
            .filter(|(id, _)| only.is_none_or(|only| only.contains(*id)))
            .filter(|(id, _)| !self.is_starting(id))
            .map(|(_, e)| e.current.clone())
            .collect();
        for v in &batch {
            *self
                .in_flight
                .entry(v.update.container_id.clone())
                .or_default() += 1;
        }
        batch
    }

    /// Starts a delivery of one container's pending update, if it has one and the runtime knows
    /// the container.
    pub fn begin_one(&mut self, container_id: &str) -> Option<Versioned> {
        if self.is_starting(container_id) {
            return None;
        }
        let v = self.entries.get(container_id)?.current.clone();
        *self.in_flight.entry(container_id.to_owned()).or_default() += 1;
        Some(v)
    }

    /// Ends a delivery started by [`Self::begin`] or [`Self::begin_one`]. `confirmed` are the
    /// containers the runtime confirmed (none on an error: runtimes drop the list of failures
    /// when they fail the call, so after an error nothing is known to have applied). A
    /// confirmed version is settled, and its entry cleared if it is still at that version.
    pub fn finish(&mut self, batch: &[Versioned], confirmed: impl Fn(&str) -> bool) {
        for sent in batch {
            let id = &sent.update.container_id;
            if let Some(n) = self.in_flight.get_mut(id) {
                *n -= 1;
                if *n == 0 {
                    self.in_flight.remove(id);
                }
            }
            if !confirmed(id) {
                continue;
            }
            if let Some(cpus) = &sent.update.cpus {
                self.known.insert(id.clone(), cpus.clone());
            }
            if let Some(e) = self.entries.get_mut(id) {
                e.settled = e.settled.max(sent.seq);
                if e.current.seq == sent.seq {
                    self.entries.remove(id);
                } else {
                    // It runs on what was confirmed, or on the newer version if that arrives.
                    e.risk = self.known.get(id).map(|known| {
                        e.current
                            .update
                            .cpus
                            .as_ref()
                            .map_or_else(|| known.clone(), |cpus| known.union(cpus))
                    });
                }
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
        let batch = p.begin(None);
        assert_eq!(batch.len(), 2);
        assert_eq!(p.len(), 2, "beginning a delivery clears nothing");
        p.finish(&batch, |_| false);
        assert_eq!(p.len(), 2, "a failed delivery keeps everything pending");
        let batch = p.begin(None);
        p.finish(&batch, |id| id == "a");
        assert_eq!(cpus(&p, "a"), None);
        assert_eq!(cpus(&p, "b").as_deref(), Some("4-7"));
    }

    #[test]
    fn an_update_changed_during_delivery_stays_pending() {
        let mut p = PendingUpdates::default();
        p.record([upd("a", "0-3")]);
        let batch = p.begin(None);
        p.record([upd("a", "0-1")]);
        p.finish(&batch, |_| true);
        assert_eq!(cpus(&p, "a").as_deref(), Some("0-1"));
    }

    #[test]
    fn an_update_of_a_container_not_started_waits_until_it_is() {
        let mut p = PendingUpdates::default();
        p.placed("a", Some(&"0-7".parse().unwrap()));
        p.creating("a");
        p.delivered_in_reply(&[upd("a", "0-3")]);
        assert_eq!(
            cpus(&p, "a").as_deref(),
            Some("0-3"),
            "a reply does not reach a container the runtime has not started"
        );
        p.record([upd("b", "4-7")]);
        let ids: Vec<String> = p
            .begin(None)
            .into_iter()
            .map(|v| v.update.container_id)
            .collect();
        assert_eq!(ids, ["b"], "nothing is sent to a container not started");
        assert!(p.begin_one("a").is_none());
        assert!(
            p.may_run_on(&"6".parse().unwrap())
                .containers()
                .contains("a"),
            "created on 0-7, it runs there until its update lands"
        );
        let ticket = p.record([upd("a", "0-2")]);
        assert!(!p.unsettled(&ticket).is_empty());

        assert!(p.started("a"), "its pending update is to be sent now");
        assert!(!p.started("a"), "started once");
        let batch = p.begin(None);
        assert!(batch.iter().any(|v| v.update.container_id == "a"));
        p.finish(&batch, |_| true);
        assert!(p.unsettled(&ticket).is_empty());
        assert!(p.is_empty());
    }

    #[test]
    fn only_containers_the_runtime_knows_are_deliverable() {
        let mut p = PendingUpdates::default();
        p.creating("a");
        p.record([upd("a", "0-3")]);
        assert!(!p.is_empty() && !p.is_deliverable());
        p.creating("b");
        p.forget("b");
        assert!(!p.is_starting("b"), "a container gone is not starting");
        p.synchronized();
        assert!(
            !p.is_starting("a"),
            "a Synchronize lists what the runtime has"
        );
        assert!(p.is_deliverable());
    }

    #[test]
    fn a_reply_supersedes_pending_unless_a_delivery_is_in_flight() {
        let mut p = PendingUpdates::default();
        p.record([upd("a", "0-3"), upd("b", "0-3")]);
        p.delivered_in_reply(&[upd("a", "0-5")]);
        assert_eq!(cpus(&p, "a"), None, "the reply delivered a's newest state");

        let batch = p.begin(None); // carries b at 0-3
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
        let batch = p.begin(None);
        p.finish(&batch, |_| true);
        assert!(p.is_empty());
    }

    #[test]
    fn a_finished_delivery_is_no_longer_in_flight() {
        let mut p = PendingUpdates::default();
        assert!(p.is_empty());
        p.record([upd("a", "0-3")]);
        assert!(!p.is_empty());
        let first = p.begin(None);
        let second = p.begin(None); // two deliveries carry a
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

    fn ids(v: &[&str]) -> BTreeSet<String> {
        v.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn a_ticket_is_settled_by_its_version_or_a_newer_one_confirmed() {
        let mut p = PendingUpdates::default();
        let first = p.record([upd("a", "0-5"), upd("b", "0-5")]);
        assert_eq!(first.containers(), ids(&["a", "b"]));
        assert_eq!(p.unsettled(&first), ids(&["a", "b"]));
        let batch = p.begin(None);
        // Another commit records newer versions while the first delivery is in flight.
        let second = p.record([upd("a", "0-3")]);
        p.finish(&batch, |id| id == "a");
        assert_eq!(
            p.unsettled(&first),
            ids(&["b"]),
            "a's version was confirmed"
        );
        assert_eq!(p.unsettled(&second), ids(&["a"]), "a's newer one was not");
        assert_eq!(cpus(&p, "a").as_deref(), Some("0-3"));
        // A newer version confirmed settles the older ones it supersedes.
        let third = p.record([upd("b", "0-2")]);
        let batch = p.begin(Some(&ids(&["b"])));
        assert_eq!(batch.len(), 1, "only b");
        p.finish(&batch, |_| true);
        assert!(p.unsettled(&first).is_empty() && p.unsettled(&third).is_empty());
        assert_eq!(p.unsettled(&second), ids(&["a"]));
    }

    #[test]
    fn a_reply_settles_what_no_delivery_carries_and_nothing_while_one_is_in_flight() {
        let mut p = PendingUpdates::default();
        let t = p.record([upd("a", "0-5"), upd("b", "0-5")]);
        p.delivered_in_reply(&[upd("a", "0-4")]);
        assert_eq!(p.unsettled(&t), ids(&["b"]));
        let batch = p.begin(None); // carries b
        p.delivered_in_reply(&[upd("b", "0-4")]);
        assert_eq!(
            p.unsettled(&t),
            ids(&["b"]),
            "the older delivery may still land after the reply"
        );
        p.finish(&batch, |_| false);
        assert_eq!(p.unsettled(&t), ids(&["b"]));
        // A container that is gone settles everything recorded for it; a new entry for a
        // container starts settled up to its first version.
        p.forget("b");
        assert!(p.unsettled(&t).is_empty());
        let again = p.record([upd("b", "0-1")]);
        assert!(p.unsettled(&t).is_empty());
        assert_eq!(p.unsettled(&again), ids(&["b"]));
        assert!(Ticket::default().is_empty() && !again.is_empty());
    }

    #[test]
    fn begin_one_carries_the_newest_version_and_counts_in_flight() {
        let mut p = PendingUpdates::default();
        assert!(p.begin_one("a").is_none());
        p.record([upd("a", "0-5")]);
        p.record([upd("a", "0-4")]);
        let one = p.begin_one("a").unwrap();
        assert_eq!(one.update.cpus.as_ref().unwrap().to_string(), "0-4");
        p.delivered_in_reply(&[upd("a", "0-3")]);
        assert_eq!(cpus(&p, "a").as_deref(), Some("0-3"), "in flight: kept");
        p.finish(std::slice::from_ref(&one), |_| true);
        p.delivered_in_reply(&[upd("a", "0-2")]);
        assert!(p.is_empty(), "no longer in flight");
    }

    fn set(s: &str) -> CpuSet {
        s.parse().unwrap()
    }

    #[test]
    fn a_container_may_run_on_what_was_confirmed_and_on_everything_sent_since() {
        let mut p = PendingUpdates::default();
        p.placed("a", Some(&set("0-7")));
        p.placed("b", Some(&set("0-7")));
        p.placed("c", None); // the runtime did not say
        p.record([upd("a", "0-3"), upd("b", "0-7"), upd("c", "0-3")]);
        // a moved off 4-7 but may still be there; b stays; c may be anywhere.
        assert_eq!(p.may_run_on(&set("6")).containers(), ids(&["a", "b", "c"]));
        assert_eq!(p.displaced().containers(), ids(&["a", "c"]));
        // Once a's move is confirmed, it runs on 0-3 only.
        let batch = p.begin(Some(&ids(&["a"])));
        p.finish(&batch, |_| true);
        assert_eq!(p.may_run_on(&set("6")).containers(), ids(&["b", "c"]));
        // A later change starts from what was confirmed: 0-3, then 0-1 sent.
        p.record([upd("a", "0-1")]);
        assert!(!p.may_run_on(&set("6")).containers().contains("a"));
        assert_eq!(p.may_run_on(&set("2")).containers(), ids(&["a", "b", "c"]));
        // A failed delivery proves nothing: what it carried may have landed.
        p.record([upd("a", "4-5")]);
        let batch = p.begin(Some(&ids(&["a"])));
        p.finish(&batch, |_| false);
        p.record([upd("a", "0-1")]);
        assert!(p.may_run_on(&set("5")).containers().contains("a"));
        // An older version confirmed while a newer is pending: that one, or the newer.
        let batch = p.begin(Some(&ids(&["a"])));
        p.record([upd("a", "6-7")]);
        p.finish(&batch, |_| true);
        assert!(!p.may_run_on(&set("4-5")).containers().contains("a"));
        assert!(p.may_run_on(&set("0")).containers().contains("a"));
        assert!(p.may_run_on(&set("7")).containers().contains("a"));
        // A reply (nothing in flight) delivers; where the runtime says a container runs is
        // where it runs (and where its pending version would put it).
        p.delivered_in_reply(&[upd("a", "2")]);
        p.record([upd("a", "3"), upd("b", "0-1"), upd("c", "0")]);
        p.placed("b", Some(&set("0-1")));
        p.placed("c", Some(&set("0")));
        assert!(p.may_run_on(&set("4-7")).is_empty());
        assert_eq!(p.may_run_on(&set("1")).containers(), ids(&["b"]));
        assert_eq!(p.may_run_on(&set("0")).containers(), ids(&["b", "c"]));
        // A container gone runs nowhere; recorded again, where it runs is unknown.
        p.forget("a");
        assert!(!p.may_run_on(&set("0-7")).containers().contains("a"));
        p.record([upd("a", "1")]);
        assert!(p.may_run_on(&set("7")).containers().contains("a"));
        assert!(p.displaced().containers().contains("a"));
    }

    #[test]
    fn a_container_at_risk_is_one_that_may_run_on_cpus_it_is_not_meant_to() {
        let mut p = PendingUpdates::default();
        for id in ["moved", "user", "mems", "unknown"] {
            p.placed(id, Some(&set("0-7")));
        }
        p.placed("unknown", None);
        p.record([
            upd("moved", "4-7"),
            upd("user", "0-3"),
            ContainerUpdate {
                container_id: "mems".into(),
                cpus: None,
                mems: Some("0".parse().unwrap()),
            },
            upd("unknown", "4-7"),
        ]);
        // All four may run on 0-3 until their updates land...
        assert_eq!(
            p.may_run_on(&set("0-3")).containers(),
            ids(&["mems", "moved", "unknown", "user"])
        );
        // ...but "user" is meant to: its own update puts it there.
        assert_eq!(
            p.at_risk(&set("0-3")).containers(),
            ids(&["mems", "moved", "unknown"])
        );
        assert_eq!(
            p.at_risk(&set("2")).containers(),
            ids(&["mems", "moved", "unknown"]),
            "meant to run on some of them is meant to run there"
        );
    }

    #[test]
    fn tickets_merge_keeping_the_later_version() {
        let mut p = PendingUpdates::default();
        let mut first = p.record([upd("a", "0"), upd("b", "0")]);
        let second = p.record([upd("b", "1")]);
        first.extend(second.clone());
        assert_eq!(first.containers(), ids(&["a", "b"]));
        let batch = p.begin(Some(&ids(&["a"])));
        p.finish(&batch, |_| true);
        assert_eq!(p.unsettled(&first), ids(&["b"]));
        assert_eq!(p.unsettled(&second), ids(&["b"]));
    }

    #[test]
    fn forgotten_containers_are_not_sent() {
        let mut p = PendingUpdates::default();
        p.record([upd("a", "0-3")]);
        p.forget("a");
        assert!(p.begin(None).is_empty());
    }
}
