//! Rebuilding every container placement from the runtime's containers
//! ([`Policy::sync`](crate::Policy::sync)), keeping the claims: claim and reserved containers
//! first, exclusive ones on the CPUs they run on while those are free, then the shared ones where
//! they run now; a running container is never refused. A running container the sync did not
//! list is placed by the same rules when the policy first hears of it
//! ([`Policy::adopt_container`](crate::Policy::adopt_container)).

use std::collections::BTreeMap;

use super::{
    Grant, Placed, TopologyAware, Updates,
    annotations::{self, Options},
    cpus::Spare,
    into_vec,
    place::Class,
};
use crate::{
    idset::CpuSet,
    inventory::Fallback,
    model::{Container, ContainerUpdate},
};

impl TopologyAware {
    /// Keeps a running exclusive container on the CPUs it has, when they are still free.
    fn plan_keep(&self, c: &Container, opts: &Options, n: usize, isolated: bool) -> Option<Placed> {
        let cpus = c.cpus.as_ref().filter(|s| s.len() == n)?;
        let pool = self
            .pools
            .iter()
            .filter(|p| p.cpus.is_superset(cpus))
            .min_by_key(|p| (p.cpus.len(), p.id))?;
        let grant = if isolated
            && self
                .isolated
                .difference(&self.isolated_taken)
                .is_superset(cpus)
        {
            Grant::Isolated {
                pool: pool.id,
                cpus: cpus.clone(),
            }
        } else {
            // Not if claims may take them now (the exclusivity setting changed since).
            if !self.exclusive_free(0).is_superset(cpus) {
                return None;
            }
            let mut spare = self.spare();
            let list: Vec<u32> = cpus.iter().collect();
            if !(Spare {
                per_pool: &mut spare,
            })
            .take(&self.index, &list)
            {
                return None;
            }
            Grant::Exclusive {
                pool: pool.id,
                cpus: cpus.clone(),
            }
        };
        let nodes = self.nodes_of(cpus);
        let (mems, charge) = self.plan_memory(c, opts, &nodes, &pool.name).ok()?;
        Some(self.placed(c, grant, mems, charge))
    }

    /// Exclusive CPUs for a running container, with its memory unpinned if it does not fit
    /// pinned; `None` when the CPUs cannot be had.
    fn plan_exclusive_running(
        &self,
        c: &Container,
        opts: &Options,
        n: usize,
        isolated: bool,
    ) -> Option<Placed> {
        match self.plan_exclusive(c, opts, n, isolated) {
            Ok(Ok(placed)) => Some(placed),
            Ok(Err(_)) => None,
            Err(_) => {
                let unpinned = Options {
                    pin_memory: false,
                    ..opts.clone()
                };
                let mut placed = self.plan_exclusive(c, &unpinned, n, isolated).ok()?.ok()?;
                placed.fallbacks.push(Fallback::MemoryUnpinned);
                Some(placed)
            }
        }
    }

    /// Places a running container no matter what: as planned (which never refuses for CPUs or
    /// memory), else, for a request the policy cannot read, on the shared CPUs of the root.
    fn place_running(
        &mut self,
        c: &Container,
        opts: &Options,
        class: &Class,
        updates: &mut Updates,
    ) {
        let mut placed = self
            .plan_admitted(c, opts, class, c.cpus.as_ref())
            .unwrap_or_else(|_| {
                let grant = Grant::Shared {
                    pool: 0,
                    milli: c.resources.cpu_request_milli,
                };
                self.placed(c, grant, None, Vec::new())
            });
        // Nobody to tell on a sync; the inventory shows where it landed.
        placed.warnings.clear();
        self.commit(&c.id, placed, updates);
    }

    /// Rebuilds every container placement, keeping the claims; returns updates for containers
    /// whose cpuset or memory nodes differ from what the runtime reported.
    pub(super) fn sync_containers(&mut self, containers: &[Container]) -> Vec<ContainerUpdate> {
        // Containers that run shared because their exclusive CPUs could not be had stay shared:
        // a sync does not move running workloads it need not move.
        let ran_shared: std::collections::BTreeSet<String> = self
            .containers
            .iter()
            .filter(|(_, p)| p.fallbacks.contains(&Fallback::NotExclusive))
            .map(|(id, _)| id.clone())
            .collect();
        self.containers.clear();
        for l in &mut self.load {
            *l = super::PoolLoad::default();
        }
        self.ledger.clear_containers();
        self.taken = self
            .claims
            .values()
            .fold(CpuSet::new(), |acc, c| acc.union(&c.cpus()));
        self.isolated_taken = CpuSet::new();
        self.refresh_all_shared();

        let by_id: BTreeMap<&str, &Container> =
            containers.iter().map(|c| (c.id.as_str(), c)).collect();
        let planned: Vec<(&Container, Options, Class)> = by_id
            .values()
            .map(|&c| {
                let opts = annotations::options(c, &self.config.reserved_namespaces)
                    .unwrap_or_else(|_| annotations::defaults(c, &self.config.reserved_namespaces));
                let class = self.classify(c, &opts);
                (c, opts, class)
            })
            .collect();
        let mut scratch = Updates::new();

        // Claims and reserved CPUs compete with nobody.
        for (c, opts, class) in &planned {
            if matches!(class, Class::Claim { .. } | Class::Reserved) {
                self.place_running(c, opts, class, &mut scratch);
            }
        }

        let mut exclusive: Vec<(&Container, &Options, &Class, usize)> = planned
            .iter()
            .filter_map(|(c, o, class)| match class {
                Class::Exclusive { n, .. } => Some((*c, o, class, *n)),
                _ => None,
            })
            .collect();
        // Those that ran shared stay shared, placed with the shared ones (and like them,
        // where they run now): the policy said so before this sync, or, after a restart, their
        // CPUs are shared with another container, which exclusive CPUs never are.
        let shares_cpus = |c: &Container| {
            c.cpus.as_ref().is_some_and(|mine| {
                containers
                    .iter()
                    .any(|o| o.id != c.id && o.cpus.as_ref().is_some_and(|x| x.intersects(mine)))
            })
        };
        let mut not_exclusive = Vec::new();
        let mut rest = Vec::new();
        for &(c, opts, class, n) in &exclusive {
            let Class::Exclusive { isolated, .. } = class else {
                continue;
            };
            if ran_shared.contains(&c.id) || shares_cpus(c) {
                not_exclusive.push((c, opts));
                continue;
            }
            match self.plan_keep(c, opts, n, *isolated) {
                Some(placed) => self.commit(&c.id, placed, &mut scratch),
                None => rest.push((c, opts, class, n)),
            }
        }
        // New exclusive grants, leaving the shared containers to come room at the root. (Those
        // kept above are running: they stay where they are, shared containers or not.)
        let (shared_milli, shared_count) = planned
            .iter()
            .filter_map(|(_, _, class)| match class {
                Class::Shared { milli } => Some(*milli),
                _ => None,
            })
            .fold((0u64, 0usize), |(m, n), milli| (m + milli, n + 1));
        if let Some(root) = self.load.first_mut() {
            root.milli += shared_milli;
            root.count += shared_count;
        }
        exclusive = rest;
        exclusive.sort_by(|a, b| b.3.cmp(&a.3).then_with(|| a.0.id.cmp(&b.0.id)));
        for (c, opts, class, n) in exclusive {
            let Class::Exclusive { isolated, .. } = class else {
                continue;
            };
            match self.plan_exclusive_running(c, opts, n, *isolated) {
                Some(placed) => self.commit(&c.id, placed, &mut scratch),
                None => not_exclusive.push((c, opts)),
            }
        }
        if let Some(root) = self.load.first_mut() {
            root.milli = root.milli.saturating_sub(shared_milli);
            root.count = root.count.saturating_sub(shared_count);
        }

        for (c, opts, class) in &planned {
            if matches!(class, Class::Shared { .. }) {
                self.place_running(c, opts, class, &mut scratch);
            }
        }
        for (c, opts) in not_exclusive {
            self.place_not_exclusive(c, opts, &mut scratch);
        }

        by_id.values().filter_map(|c| self.differs(c)).collect()
    }

    /// Places a running container that asks for exclusive CPUs it cannot have (or that ran
    /// shared) on shared CPUs, where it runs now if it can.
    fn place_not_exclusive(&mut self, c: &Container, opts: &Options, updates: &mut Updates) {
        let shared = Class::Shared {
            milli: c.resources.cpu_request_milli,
        };
        let mut placed = self
            .plan_admitted(c, opts, &shared, c.cpus.as_ref())
            .unwrap_or_else(|_| {
                let grant = Grant::Shared {
                    pool: 0,
                    milli: c.resources.cpu_request_milli,
                };
                self.placed(c, grant, None, Vec::new())
            });
        placed.fallbacks.insert(0, Fallback::NotExclusive);
        placed.warnings.clear();
        self.commit(&c.id, placed, updates);
    }

    /// The update a placed running container needs: what it should run on, when that differs
    /// from what the runtime reported.
    fn differs(&self, c: &Container) -> Option<ContainerUpdate> {
        let want = self.update_of(&c.id)?;
        let cpus_differ = c.cpus != want.cpus;
        let mems_differ = want.mems.is_some() && c.mems != want.mems;
        (cpus_differ || mems_differ).then_some(want)
    }

    /// [`Policy::adopt_container`](crate::Policy::adopt_container): one running container the
    /// policy has not seen, placed as [`TopologyAware::sync_containers`] places each: by its
    /// class (a request it cannot read gets the defaults), an exclusive one kept on the CPUs it
    /// runs on while they are free, given free ones otherwise, and run shared when it shares
    /// its CPUs with a container the policy holds or none can be had; never refused. Returns
    /// the ripple, then its own update if it runs elsewhere. One the policy holds already
    /// changes nothing.
    pub(super) fn adopt_running(&mut self, c: &Container) -> Vec<ContainerUpdate> {
        if self.containers.contains_key(&c.id) {
            return Vec::new();
        }
        let opts = annotations::options(c, &self.config.reserved_namespaces)
            .unwrap_or_else(|_| annotations::defaults(c, &self.config.reserved_namespaces));
        let class = self.classify(c, &opts);
        let mut updates = Updates::new();
        match &class {
            Class::Exclusive { n, isolated } => {
                let shares_cpus = c.cpus.as_ref().is_some_and(|mine| {
                    self.containers
                        .values()
                        .any(|p| self.cpus_of(&p.grant).intersects(mine))
                });
                let exclusive = if shares_cpus {
                    None
                } else {
                    self.plan_keep(c, &opts, *n, *isolated)
                        .or_else(|| self.plan_exclusive_running(c, &opts, *n, *isolated))
                };
                match exclusive {
                    Some(placed) => self.commit(&c.id, placed, &mut updates),
                    None => self.place_not_exclusive(c, &opts, &mut updates),
                }
            }
            _ => self.place_running(c, &opts, &class, &mut updates),
        }
        updates.remove(&c.id);
        let mut out = into_vec(updates);
        out.extend(self.differs(c));
        out
    }
}
