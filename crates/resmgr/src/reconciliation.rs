//! What reconciliation knows and decides in memory, under the manager lock: the strays found
//! at start-up and how each was judged, the unconfirmed claims and their grace, the disk work a
//! Synchronize left to do, what was done (the report), and the judgement of strays by the running
//! containers at the Synchronize. The passes that act on it (the disk, the API server) and the
//! contract they keep are [`crate::reconcile`]'s.

// Blocking IO under the manager lock does not pass clippy (crates/resmgr/clippy.toml).
#![deny(clippy::disallowed_methods)]

use std::{
    collections::{BTreeMap, BTreeSet},
    time::Duration,
};

use kubelet_plugin::ClaimRef;
use policy::{Container, Policy, claim_env};
use serde::Serialize;
use tokio::time::Instant;
use tracing::warn;

use crate::state::{DeviceRecord, PreparedClaim, Records};

/// How long an unconfirmed claim that nothing wants is kept, by default: twice the kubelet's
/// reconcile period of inactive pods (60 s), so that its unprepare comes first.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(120);

/// How reconciliation runs.
#[derive(Debug, Clone)]
pub struct ReconcileConfig {
    /// The pool our ResourceSlices publish devices in (the node's name): a claim allocated with
    /// a result of our driver in this pool is allocated here. `None` without DRA: no API server
    /// half.
    pub pool: Option<String>,
    /// How long an unconfirmed claim that nothing wants is kept before it is released.
    pub grace: Duration,
    /// Time between reconcile passes over unconfirmed claims.
    pub period: Duration,
}

impl Default for ReconcileConfig {
    fn default() -> Self {
        Self {
            pool: None,
            grace: DEFAULT_GRACE,
            period: Duration::from_secs(30),
        }
    }
}

/// What became of a claim: the `outcome` label of the `reconciled_claims` metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Outcome {
    /// A stray spec taken back: a container uses it, or the API server says it is allocated
    /// here.
    Adopted,
    /// A stray spec used by nothing and allocated nowhere here: removed (and its claim released
    /// if it had been adopted).
    Swept,
    /// An unreadable spec that nothing uses: renamed `<file>.unreadable`.
    SetAside,
    /// An unreadable spec that a container uses: its CPUs are held from what the container
    /// shows.
    HeldUnreadable,
    /// A spec a container uses whose CPUs another claim holds: claims are refused.
    Contested,
    /// An unconfirmed claim released after the grace period.
    Released,
    /// A claim the state held without a spec, used by no container, released at Synchronize
    /// because a stray spec (the proof of a completed prepare) grants its CPUs.
    GaveWay,
    /// An unconfirmed claim the kubelet prepared again.
    Confirmed,
}

impl Outcome {
    /// Every outcome, in label order.
    pub const ALL: [Self; 8] = [
        Self::Adopted,
        Self::Swept,
        Self::SetAside,
        Self::HeldUnreadable,
        Self::Contested,
        Self::Released,
        Self::GaveWay,
        Self::Confirmed,
    ];

    /// The outcome as it serializes.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Adopted => "adopted",
            Self::Swept => "swept",
            Self::SetAside => "set-aside",
            Self::HeldUnreadable => "held-unreadable",
            Self::Contested => "contested",
            Self::Released => "released",
            Self::GaveWay => "gave-way",
            Self::Confirmed => "confirmed",
        }
    }

    /// Whether an operator must hear of it (a warning), rather than read it in the log.
    pub fn is_warning(self) -> bool {
        !matches!(self, Self::Confirmed)
    }
}

/// One thing reconciliation did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Reconciled {
    /// The claim's UID.
    pub claim: String,
    /// What became of it.
    pub outcome: Outcome,
    /// Why, in words.
    pub detail: String,
}

impl std::fmt::Display for Reconciled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "claim {}: {}: {}",
            self.claim,
            self.outcome.as_str(),
            self.detail
        )
    }
}

/// What reconciliation did and holds, for `/debug/state` and the metrics.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ReconcileReport {
    /// How often each outcome happened since the start.
    pub counts: BTreeMap<Outcome, u64>,
    /// The latest things done, oldest first (at most [`RECENT`]).
    pub recent: Vec<Reconciled>,
    /// Claims held without confirmation yet, by UID.
    pub unconfirmed: Vec<String>,
    /// Claims whose CPUs a running container uses while another claim holds them, with why:
    /// while there are any, claims are refused.
    pub contested: BTreeMap<String, String>,
}

/// How many reconciled things the report keeps.
pub const RECENT: usize = 64;

/// A spec the state did not account for at start.
#[derive(Debug, Clone)]
pub(crate) enum Stray {
    /// Taken back from its spec, provisionally.
    Adopted,
    /// It reads back, but the policy cannot give it its CPUs: why, and what it reads.
    Refused(String, Vec<cdi::ContainerEdits>),
    /// It does not read back.
    Unreadable(String),
}

/// A claim held without proof that it is still wanted.
#[derive(Debug, Clone, Default)]
pub(crate) struct Unconfirmed {
    /// A stray adopted at this start that nothing used at Synchronize: the first pass that
    /// finds it not allocated here sweeps it at once, with no grace.
    pub(crate) stray: bool,
    /// When a pass first found nothing wanting it.
    pub(crate) unwanted_since: Option<Instant>,
    /// The state held it at start without a spec on disk: no prepare of it is known to have
    /// completed, so it gives way to a stray spec that grants its CPUs (see
    /// [`Reconciliation::synchronize`]).
    pub(crate) without_spec: bool,
}

/// Disk work decided at Synchronize, done after it, outside the lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Chore {
    /// Remove the spec of a stray that was never adopted.
    Sweep(String),
    /// Rename an unreadable spec aside.
    SetAside(String),
}

/// The reconciliation state, under the manager lock.
#[derive(Debug, Default)]
pub(crate) struct Reconciliation {
    /// Strays until the Synchronize.
    pub(crate) strays: BTreeMap<String, Stray>,
    pub(crate) unconfirmed: BTreeMap<String, Unconfirmed>,
    /// The running containers that use each unconfirmed claim, by container ID.
    pub(crate) users: BTreeMap<String, BTreeSet<String>>,
    pub(crate) chores: Vec<Chore>,
    pub(crate) report: ReconcileReport,
}

/// The record of a claim taken back from disk: only its CDI device IDs are known.
pub(crate) fn adopted_record(driver: &str, uid: &cdi::ClaimUid, devices: usize) -> PreparedClaim {
    let devices = (0..devices)
        .filter_map(|i| cdi::claim::qualified_device_name(driver, uid, i).ok())
        .map(|id| DeviceRecord {
            request_names: Vec::new(),
            pool: String::new(),
            device: String::new(),
            cdi_device_id: id.to_string(),
            share_id: None,
        })
        .collect();
    PreparedClaim {
        namespace: String::new(),
        name: String::new(),
        devices,
        adopted: true,
    }
}

/// The reference used to name an unconfirmed claim: its record's namespace and name when known.
pub(crate) fn claim_ref(uid: &str, record: Option<&PreparedClaim>) -> ClaimRef {
    match record {
        Some(r) if !r.name.is_empty() => ClaimRef::new(&r.namespace, &r.name, uid),
        _ => ClaimRef::new("", "", uid),
    }
}

impl Reconciliation {
    /// Notes what was done: counted, kept in the recent list, logged.
    pub(crate) fn note(
        &mut self,
        claim: &str,
        outcome: Outcome,
        detail: impl Into<String>,
    ) -> Reconciled {
        let done = Reconciled {
            claim: claim.to_owned(),
            outcome,
            detail: detail.into(),
        };
        if outcome.is_warning() {
            tracing::warn!(claim, outcome = outcome.as_str(), "{}", done.detail);
        } else {
            tracing::info!(claim, outcome = outcome.as_str(), "{}", done.detail);
        }
        *self.report.counts.entry(outcome).or_default() += 1;
        self.report.recent.push(done.clone());
        let excess = self.report.recent.len().saturating_sub(RECENT);
        self.report.recent.drain(..excess);
        done
    }

    /// The report as of now.
    pub(crate) fn report(&self) -> ReconcileReport {
        ReconcileReport {
            unconfirmed: self.unconfirmed.keys().cloned().collect(),
            ..self.report.clone()
        }
    }

    /// Whether claims must be refused, and why.
    pub(crate) fn contested(&self) -> Option<String> {
        let (uid, why) = self.report.contested.iter().next()?;
        let more = self.report.contested.len() - 1;
        let also = if more > 0 {
            format!(" (and {more} more)")
        } else {
            String::new()
        };
        Some(format!("claim {uid}: {why}{also}"))
    }

    /// A claim the kubelet prepared: it is confirmed.
    pub(crate) fn confirm(&mut self, uid: &str) -> Option<Reconciled> {
        self.users.remove(uid);
        self.unconfirmed
            .remove(uid)
            .map(|_| self.note(uid, Outcome::Confirmed, "prepared again by the kubelet"))
    }

    /// A claim that left by an unprepare or a release.
    pub(crate) fn forget(&mut self, uid: &str) {
        self.users.remove(uid);
        self.unconfirmed.remove(uid);
    }

    /// Judges the strays by the containers running at Synchronize (see the module docs), before
    /// the policy sees them, and notes which containers use each unconfirmed claim.
    /// `records` gains the claims taken back here.
    pub(crate) fn synchronize(
        &mut self,
        driver: &str,
        policy: &mut dyn Policy,
        records: &mut Records,
        containers: &[Container],
    ) -> Vec<Reconciled> {
        let mut done = Vec::new();
        let users_of = |uid: &str| -> Vec<&Container> {
            containers
                .iter()
                .filter(|c| claim_env::uses_claim(c, driver, uid))
                .collect()
        };
        for (uid, mut stray) in std::mem::take(&mut self.strays) {
            let users = users_of(&uid);
            let names = names(&users);
            if let Stray::Refused(_, edits) = &stray
                && self.make_way(&uid, edits, policy, records, &users_of, &mut done)
            {
                if let Ok(id) = cdi::ClaimUid::new(&uid) {
                    records.insert(uid.clone(), adopted_record(driver, &id, edits.len()));
                }
                stray = Stray::Adopted;
            }
            match stray {
                Stray::Adopted if users.is_empty() => {
                    self.unconfirmed.insert(
                        uid,
                        Unconfirmed {
                            stray: true,
                            ..Unconfirmed::default()
                        },
                    );
                }
                Stray::Adopted => {
                    done.push(self.note(
                        &uid,
                        Outcome::Adopted,
                        format!("its CDI spec, which the state did not account for, is used by {names}: the claim was taken back from the spec"),
                    ));
                    self.unconfirmed.insert(uid, Unconfirmed::default());
                }
                Stray::Refused(..) if users.is_empty() => self.chores.push(Chore::Sweep(uid)),
                Stray::Refused(why, _) => {
                    let detail = format!(
                        "its CDI spec, which the state does not account for, is used by {names}, but it cannot be taken back ({why}): \
                         two claims may grant the same CPUs, so claims are refused. To recover, delete the pods of {names} \
                         (or restore the state directory that accounts for the claim) and restart the agent"
                    );
                    self.report.contested.insert(uid.clone(), detail.clone());
                    done.push(self.note(&uid, Outcome::Contested, detail));
                }
                Stray::Unreadable(_) if users.is_empty() => self.chores.push(Chore::SetAside(uid)),
                Stray::Unreadable(why) => {
                    let outcome = take_back_unreadable(policy, &uid, &users);
                    match outcome {
                        Ok(cpus) => {
                            if let Ok(id) = cdi::ClaimUid::new(&uid) {
                                records.insert(uid.clone(), adopted_record(driver, &id, 1));
                            }
                            done.push(self.note(
                                &uid,
                                Outcome::HeldUnreadable,
                                format!(
                                    "its CDI spec cannot be read ({why}), and {names} use it: cpus {cpus} stay theirs, out of every grant. \
                                     The spec is kept; a runtime cannot inject it until the kubelet prepares the claim again"
                                ),
                            ));
                            self.unconfirmed.insert(uid, Unconfirmed::default());
                        }
                        Err(reason) => {
                            let detail = format!(
                                "its CDI spec cannot be read ({why}), {names} use it, and {reason}: two claims may grant the same CPUs, \
                                 so claims are refused. To recover, delete the pods of {names} and restart the agent"
                            );
                            self.report.contested.insert(uid.clone(), detail.clone());
                            done.push(self.note(&uid, Outcome::Contested, detail));
                        }
                    }
                }
            }
        }
        for uid in self.unconfirmed.keys() {
            let ids: BTreeSet<String> = users_of(uid).iter().map(|c| c.id.clone()).collect();
            self.users.insert(uid.clone(), ids);
        }
        done
    }

    /// Makes way for stray `uid`, refused because claims of the state hold its CPUs, if each
    /// of those is held without a spec and used by no container: they are released (the
    /// kubelet's next prepare of one allocates it afresh) and the stray adopted. A spec proves
    /// that a prepare completed; a claim the state holds without one (an older state restored,
    /// a crash before the spec write) proves nothing, and no container runs on its grant.
    /// Whether the stray was adopted; nothing changes otherwise.
    fn make_way<'c>(
        &mut self,
        uid: &str,
        edits: &[cdi::ContainerEdits],
        policy: &mut dyn Policy,
        records: &mut Records,
        users_of: &impl Fn(&str) -> Vec<&'c Container>,
        done: &mut Vec<Reconciled>,
    ) -> bool {
        let Some(wanted) = claim_env::cpuset_in(edits.iter().flat_map(|e| &e.env), uid)
            .and_then(|cpus| cpus.parse::<policy::CpuSet>().ok())
        else {
            return false;
        };
        let holders: Vec<String> = policy
            .claims()
            .into_iter()
            .filter(|c| c != uid)
            .filter(|c| {
                policy
                    .claim_cpus(c)
                    .is_some_and(|cpus| cpus.intersects(&wanted))
            })
            .collect();
        let yields = |c: &String| {
            self.unconfirmed
                .get(c)
                .is_some_and(|u| u.without_spec && !u.stray)
                && users_of(c).is_empty()
        };
        if holders.is_empty() || !holders.iter().all(yields) {
            return false;
        }
        for holder in &holders {
            if let Err(e) = policy.release_claim(holder) {
                warn!(claim = %holder, error = %e, "releasing a claim held without a spec failed");
                return false;
            }
            records.remove(holder);
            self.forget(holder);
            done.push(self.note(
                holder,
                Outcome::GaveWay,
                format!(
                    "the state held it without a CDI spec and no container uses it, while the spec of claim {uid} grants its cpus {wanted}: \
                     released, so that no cpu is granted twice; the kubelet's next prepare of it allocates it afresh"
                ),
            ));
        }
        policy.adopt_claim(uid, edits).is_ok()
    }

    /// A container was created: notes which unconfirmed claims it uses.
    pub(crate) fn container_created(&mut self, driver: &str, container: &Container) {
        for uid in self.unconfirmed.keys() {
            if claim_env::uses_claim(container, driver, uid) {
                self.users
                    .entry(uid.clone())
                    .or_default()
                    .insert(container.id.clone());
            }
        }
    }

    /// A container stopped or went.
    pub(crate) fn container_gone(&mut self, id: &str) {
        for users in self.users.values_mut() {
            users.remove(id);
        }
    }

    /// Whether a running container uses claim `uid`.
    pub(crate) fn is_used(&self, uid: &str) -> bool {
        self.users.get(uid).is_some_and(|u| !u.is_empty())
    }
}

/// `namespace/pod/container` of each container, joined.
fn names(containers: &[&Container]) -> String {
    let names: Vec<String> = containers
        .iter()
        .map(|c| format!("{}/{}/{}", c.pod.namespace, c.pod.name, c.name))
        .collect();
    names.join(", ")
}

/// Takes an unreadable spec's claim back from what its users show: the CPUs (and memory nodes)
/// their environment says the spec gave them, else their cpusets. Returns the CPUs held.
fn take_back_unreadable(
    policy: &mut dyn Policy,
    uid: &str,
    users: &[&Container],
) -> Result<String, String> {
    let mut cpus = policy::CpuSet::new();
    let mut mems: Option<String> = None;
    for c in users {
        let seen = match claim_env::cpuset_env(c, uid) {
            Some(value) => value.parse::<policy::CpuSet>().map_err(|e| {
                format!("{}{uid}={value} does not parse: {e}", claim_env::CPUSET_ENV)
            })?,
            None => c.cpus.clone().ok_or_else(|| {
                format!(
                    "neither its environment nor its cpuset says which cpus {}/{}/{} runs on",
                    c.pod.namespace, c.pod.name, c.name
                )
            })?,
        };
        cpus = cpus.union(&seen);
        if mems.is_none() {
            mems = claim_env::mems_env(c, uid).map(str::to_owned);
        }
    }
    let mut env = vec![format!("{}{uid}={cpus}", claim_env::CPUSET_ENV)];
    if let Some(mems) = mems {
        env.push(format!("{}{uid}={mems}", claim_env::MEMS_ENV));
    }
    policy
        .adopt_claim(uid, &[cdi::ContainerEdits::with_env(env)])
        .map_err(|e| format!("cpus {cpus} cannot be held for it: {e}"))?;
    Ok(cpus.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_report_keeps_the_latest_and_counts_all() {
        let mut r = Reconciliation::default();
        for i in 0..(RECENT + 3) {
            r.note(&format!("c{i}"), Outcome::Swept, "unused");
        }
        let report = r.report();
        assert_eq!(
            report.counts[&Outcome::Swept],
            u64::try_from(RECENT + 3).unwrap()
        );
        assert_eq!(report.recent.len(), RECENT);
        assert_eq!(report.recent[0].claim, "c3");
    }

    #[test]
    fn a_contested_claim_says_which_and_how_many_more() {
        let mut r = Reconciliation::default();
        assert_eq!(r.contested(), None);
        r.report.contested.insert("a".into(), "why".into());
        r.report.contested.insert("b".into(), "why".into());
        assert_eq!(r.contested().as_deref(), Some("claim a: why (and 1 more)"));
    }
}
