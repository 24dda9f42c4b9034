//! Applying plans to the state: each change (a container allocated, updated or released, a claim
//! held or dropped) commits what was planned on the unchanged state, and the ripple follows: the
//! pools' shared CPUs, what their shared containers run on and the updates they get, the
//! published devices rebuilt, and what each pool can spare for exclusive grants.

use super::{
    Grant, Placed, TopologyAware, Updates, annotations,
    claims::{self, HeldClaim},
    devices::DeviceTable,
    into_vec, metadata,
    pools::Pool,
    to_i64,
};
use crate::{
    api::PolicyError,
    idset::CpuSet,
    model::{
        Adjustment, Allocation, Claim, ClaimAllocation, Container, ContainerUpdate, Resources,
    },
};

impl TopologyAware {
    /// [`Policy::allocate`](crate::Policy::allocate): plans the container on the unchanged state,
    /// commits the plan, and answers with its adjustment, the ripple's updates and the warnings.
    pub(super) fn allocate_container(
        &mut self,
        container: &Container,
    ) -> Result<Allocation, PolicyError> {
        if let Some(p) = self.containers.get(&container.id) {
            return Ok(Allocation {
                adjustment: self.adjustment_of(p),
                ..Allocation::default()
            });
        }
        let mut placed = self.plan(container)?;
        let mut warnings = std::mem::take(&mut placed.warnings);
        // An exclusive grant may take a pool's last shared CPUs, as a claim may.
        let before = matches!(placed.grant, Grant::Exclusive { .. }).then(|| self.pool_fallbacks());
        let mut updates = Updates::new();
        self.commit(&container.id, placed, &mut updates);
        updates.remove(&container.id);
        if let Some(before) = before {
            let cause = format!("container {}", annotations::describe(container));
            warnings.extend(self.fallback_warnings(&before, &cause));
        }
        let adjustment = self
            .containers
            .get(&container.id)
            .map(|p| self.adjustment_of(p))
            .unwrap_or_default();
        Ok(Allocation {
            adjustment,
            updates: into_vec(updates),
            warnings,
        })
    }

    /// [`Policy::update`](crate::Policy::update): places the container again with `resources`,
    /// or, when that is refused, puts it back where it was.
    pub(super) fn update_container(
        &mut self,
        container_id: &str,
        resources: &Resources,
    ) -> Result<Vec<ContainerUpdate>, PolicyError> {
        let Some(old) = self.containers.get(container_id) else {
            return Err(PolicyError::UnknownContainer(container_id.to_owned()));
        };
        let mut container = old.container.clone();
        container.resources = *resources;
        container.cpus = Some(self.cpus_of(&old.grant));
        let mut updates = Updates::new();
        let Some(old) = self.uncommit(container_id, &mut updates) else {
            return Err(PolicyError::UnknownContainer(container_id.to_owned()));
        };
        match self.plan_again(&container) {
            Ok(mut placed) => {
                // An update has no answer but updates; where it landed shows in the inventory.
                placed.warnings.clear();
                self.commit(container_id, placed, &mut updates);
                let own = updates
                    .remove(container_id)
                    .or_else(|| self.update_of(container_id));
                let mut out = into_vec(updates);
                out.extend(own);
                Ok(out)
            }
            Err(e) => {
                // Put the old placement back exactly: what it held was just freed.
                let mut undo = Updates::new();
                self.commit(container_id, old, &mut undo);
                Err(e)
            }
        }
    }

    /// [`Policy::allocate_claim`](crate::Policy::allocate_claim): the edits of a claim held
    /// already, or the claim planned on the unchanged state, then held, with the ripple.
    pub(super) fn hold_claim(&mut self, claim: &Claim) -> Result<ClaimAllocation, PolicyError> {
        if let Some(held) = self.claims.get(&claim.uid) {
            // Same UID, same results, same CPUs. Other results under a UID we hold mean the
            // claim was deallocated and allocated again before its unprepare reached us: the
            // old CPUs may still be in use, so the new results wait for the unprepare.
            if let Some(difference) = held.difference(claim, |r| self.cpus_for(r)) {
                return Err(PolicyError::Invalid {
                    subject: format!("claim {}", held.describe()),
                    reason: format!(
                        "it is prepared with other allocation results: {difference}; it keeps \
                         what it holds until it is unprepared, and a prepare after that gets the \
                         new results"
                    ),
                });
            }
        }
        if let Some(held) = self.claims.get_mut(&claim.uid) {
            // Later prepares may name more pods sharing the claim; an adopted claim learns
            // what its spec did not say.
            held.learn(claim);
            return self
                .claim_edits(&claim.uid)
                .ok_or_else(|| PolicyError::Invalid {
                    subject: format!("claim {}", claim.uid),
                    reason: "vanished while being read".into(),
                });
        }
        let (record, mut warnings) = self.plan_claim(claim)?;
        let cpus = record.cpus();
        let edits = record.edits();
        let attributes = metadata::attributes(&record, &self.table);
        let before = self.pool_fallbacks();
        self.taken = self.taken.union(&cpus);
        self.account_claim(&record, true);
        self.claims.insert(claim.uid.clone(), record);
        self.generations.durable += 1;
        let mut updates = Updates::new();
        self.ripple(&cpus, &mut updates);
        warnings
            .extend(self.fallback_warnings(&before, &format!("claim {}", describe_claim(claim))));
        Ok(ClaimAllocation {
            edits,
            updates: into_vec(updates),
            warnings,
            attributes,
        })
    }

    fn claim_edits(&self, uid: &str) -> Option<ClaimAllocation> {
        self.claims.get(uid).map(|c| ClaimAllocation {
            edits: c.edits(),
            attributes: metadata::attributes(c, &self.table),
            ..ClaimAllocation::default()
        })
    }

    /// [`Policy::release_claim`](crate::Policy::release_claim): gives back what the claim held
    /// (and publishes again what its devices withheld), with the ripple.
    pub(super) fn drop_claim(&mut self, uid: &str) -> Result<Vec<ContainerUpdate>, PolicyError> {
        let Some(record) = self.claims.remove(uid) else {
            return Ok(Vec::new());
        };
        self.generations.durable += 1;
        let cpus = record.cpus();
        self.taken = self.taken.difference(&cpus);
        self.account_claim(&record, false);
        if record
            .results
            .iter()
            .any(|r| self.table.get(&r.device).is_none())
        {
            self.refresh_devices();
        }
        let mut updates = Updates::new();
        self.ripple(&cpus, &mut updates);
        Ok(into_vec(updates))
    }

    /// Records a placement: CPUs, pool load, memory; queues the ripple.
    pub(super) fn commit(&mut self, id: &str, placed: Placed, updates: &mut Updates) {
        self.ledger.charge(&placed.charge);
        match &placed.grant {
            Grant::Exclusive { cpus, .. } => {
                self.taken = self.taken.union(cpus);
                let cpus = cpus.clone();
                self.containers.insert(id.to_owned(), placed);
                self.ripple(&cpus, updates);
                return;
            }
            Grant::Isolated { cpus, .. } => {
                self.isolated_taken = self.isolated_taken.union(cpus);
            }
            Grant::Shared { pool, milli } => {
                let (pool, milli) = (*pool, *milli);
                for p in self.ancestors(pool).collect::<Vec<_>>() {
                    if let Some(l) = self.load.get_mut(p) {
                        l.milli += milli;
                        l.count += 1;
                    }
                }
                if let Some(l) = self.load.get_mut(pool) {
                    l.members.insert(id.to_owned(), placed.mems.clone());
                }
            }
            Grant::Reserved | Grant::Claim { .. } => {}
        }
        self.containers.insert(id.to_owned(), placed);
    }

    /// Forgets a placement, giving back what it held; queues the ripple.
    pub(super) fn uncommit(&mut self, id: &str, updates: &mut Updates) -> Option<Placed> {
        let placed = self.containers.remove(id)?;
        updates.remove(id);
        self.ledger.uncharge(&placed.charge);
        match &placed.grant {
            Grant::Exclusive { cpus, .. } => {
                self.taken = self.taken.difference(cpus);
                self.ripple(cpus, updates);
            }
            Grant::Isolated { cpus, .. } => {
                self.isolated_taken = self.isolated_taken.difference(cpus);
            }
            Grant::Shared { pool, milli } => {
                for p in self.ancestors(*pool).collect::<Vec<_>>() {
                    if let Some(l) = self.load.get_mut(p) {
                        l.milli = l.milli.saturating_sub(*milli);
                        l.count = l.count.saturating_sub(1);
                    }
                }
                if let Some(l) = self.load.get_mut(*pool) {
                    l.members.remove(id);
                }
            }
            Grant::Reserved | Grant::Claim { .. } => {}
        }
        Some(placed)
    }

    /// Charges (or with `charge` false takes back) what a claim's results hold of the memory
    /// account.
    pub(super) fn account_claim(&mut self, record: &HeldClaim, charge: bool) {
        for r in &record.results {
            if let Some(node) = r.memory_node {
                if charge {
                    self.ledger.charge_claim(node, r.memory, &r.hugepages);
                } else {
                    self.ledger.uncharge_claim(node, r.memory, &r.hugepages);
                }
            }
        }
    }

    /// Recomputes the shared CPUs of the pools holding any of `changed`, and queues an update
    /// for every shared container whose CPUs changed (the ripple): the members of those pools,
    /// and of pools below them that had run out of shared CPUs and borrow theirs.
    pub(super) fn ripple(&mut self, changed: &CpuSet, updates: &mut Updates) {
        let mut any = false;
        for i in 0..self.pools.len() {
            let Some(pool) = self.pools.get(i) else {
                continue;
            };
            if !pool.cpus.intersects(changed) {
                continue;
            }
            let now = self.pool_shared_now(pool);
            if let Some(slot) = self.shared.get_mut(i)
                && *slot != now
            {
                *slot = now;
                any = true;
            }
        }
        if !any {
            return;
        }
        let now = self.compute_runs_on();
        let before = std::mem::replace(&mut self.runs_on, now);
        for (i, (was, now)) in before.iter().zip(&self.runs_on).enumerate() {
            if was == now {
                continue;
            }
            let Some(load) = self.load.get(i) else {
                continue;
            };
            for (id, mems) in &load.members {
                updates.push(ContainerUpdate {
                    container_id: id.clone(),
                    cpus: Some(now.clone()),
                    mems: mems.clone(),
                });
            }
        }
    }

    fn pool_shared_now(&self, pool: &Pool) -> CpuSet {
        pool.cpus
            .difference(&self.reserved)
            .difference(&self.isolated)
            .difference(&self.taken)
    }

    pub(super) fn refresh_all_shared(&mut self) {
        for i in 0..self.pools.len() {
            let now = self.pools.get(i).map(|p| self.pool_shared_now(p));
            if let (Some(now), Some(slot)) = (now, self.shared.get_mut(i)) {
                *slot = now;
            }
        }
        self.runs_on = self.compute_runs_on();
    }

    /// What each pool's shared containers run on: see [`TopologyAware::runs_on`]'s field docs.
    /// Pools are numbered parents first, so one pass sees every parent before its children.
    fn compute_runs_on(&self) -> Vec<CpuSet> {
        let mut out: Vec<CpuSet> = Vec::with_capacity(self.pools.len());
        for (i, pool) in self.pools.iter().enumerate() {
            let own = self.shared.get(i).filter(|s| !s.is_empty());
            let set = match (own, pool.parent.and_then(|p| out.get(p))) {
                (Some(own), _) => own.clone(),
                (None, Some(parent)) => parent.clone(),
                (None, None) => self.last_resort(),
            };
            out.push(set);
        }
        out
    }

    /// Rebuilds the published devices, withholding the CPUs that claims allocated on devices
    /// this configuration does not publish hold (the device model, `group-by` or the claimable
    /// CPUs changed while they were held): the scheduler does not count those claims against the
    /// new devices, so publishing their CPUs would promise them twice. When such a claim goes,
    /// its CPUs are published again. Claims on devices still published need nothing: the
    /// scheduler already counts them.
    ///
    /// Memory goes the same way: what such claims hold of a node's memory and hugepages is left
    /// out of what that node's device publishes (`numa<N>` and `memory<N>` stand for the same
    /// account, and a claim on one is not counted against the other).
    pub(super) fn refresh_devices(&mut self) {
        let mut offer = self.ledger.offer();
        let full = DeviceTable::build_with_memory(
            &self.topo,
            &self.claimable,
            &self.config.devices,
            &offer,
        );
        let unpublished: Vec<&claims::ResultRecord> = self
            .claims
            .values()
            .flat_map(|c| &c.results)
            .filter(|r| full.get(&r.device).is_none())
            .collect();
        let withheld = unpublished
            .iter()
            .fold(CpuSet::new(), |acc, r| acc.union(&r.cpus));
        let mut memory_withheld = false;
        for r in &unpublished {
            let Some(node) = r.memory_node else {
                continue;
            };
            if let Some(o) = offer.get_mut(&node) {
                o.memory = o.memory.saturating_sub(r.memory);
                for (size, bytes) in &r.hugepages {
                    if let Some(h) = o.hugepages.get_mut(size) {
                        *h = h.saturating_sub(*bytes);
                    }
                }
                memory_withheld = true;
            }
        }
        self.table = if withheld.intersects(full.cpus()) || memory_withheld {
            let claimable = self.claimable.difference(&withheld);
            DeviceTable::build_with_memory(&self.topo, &claimable, &self.config.devices, &offer)
        } else {
            full
        };
        self.generations.devices += 1;
    }

    /// Shared CPUs each pool can still give up to exclusive container grants without taking
    /// what its shared containers need: those that are not set aside for claims, minus that need
    /// (so that claims taking back what they lent never leave shared containers short because
    /// of an exclusive grant). The grants prefer these; see [`TopologyAware::plan_exclusive`].
    pub(super) fn spare(&self) -> Vec<i64> {
        (0..self.pools.len())
            .map(|i| {
                let have = self.exclusive_free(i).len();
                to_i64(have) - to_i64(self.need(i))
            })
            .collect()
    }

    /// The shared CPUs of pool `pool` an exclusive container grant may take: never the ones set
    /// aside for claims, published or not right now (the devices withhold some while claims of
    /// an earlier configuration hold them, and leave out the lone threads of split cores with
    /// whole-core granularity; either may be published later).
    pub(super) fn exclusive_free(&self, pool: usize) -> CpuSet {
        self.shared
            .get(pool)
            .map(|s| s.difference(&self.claimable))
            .unwrap_or_default()
    }

    /// CPUs a pool's shared containers need: their summed requests, at least one if any.
    fn need(&self, pool: usize) -> usize {
        self.load.get(pool).map_or(0, |l| {
            let cpus = usize::try_from(l.milli.div_ceil(1000)).unwrap_or(usize::MAX);
            cpus.max(usize::from(l.count > 0))
        })
    }

    pub(super) fn ancestors(&self, pool: usize) -> impl Iterator<Item = usize> + '_ {
        std::iter::successors(Some(pool), |&p| self.pools.get(p).and_then(|p| p.parent))
    }

    pub(super) fn cpus_of(&self, grant: &Grant) -> CpuSet {
        match grant {
            Grant::Reserved => self.reserved.clone(),
            Grant::Shared { pool, .. } => self.runs_on.get(*pool).cloned().unwrap_or_default(),
            Grant::Exclusive { cpus, .. }
            | Grant::Isolated { cpus, .. }
            | Grant::Claim { cpus } => cpus.clone(),
        }
    }

    fn adjustment_of(&self, p: &Placed) -> Adjustment {
        Adjustment {
            cpus: Some(self.cpus_of(&p.grant)),
            mems: p.mems.clone(),
            memory_limit_bytes: p.limits.memory,
            hugepage_limits: p.limits.hugepages.clone(),
        }
    }

    pub(super) fn update_of(&self, id: &str) -> Option<ContainerUpdate> {
        let p = self.containers.get(id)?;
        Some(ContainerUpdate {
            container_id: id.to_owned(),
            cpus: Some(self.cpus_of(&p.grant)),
            mems: p.mems.clone(),
        })
    }
}

/// `namespace/name (uid)` of a claim, for messages.
fn describe_claim(claim: &Claim) -> String {
    format!("{}/{} ({})", claim.namespace, claim.name, claim.uid)
}
