//! Taking back the claims that outlived the agent: from the durable snapshot
//! ([`Policy::restore`](crate::Policy::restore)) and, for a claim the snapshot lacks, from the
//! edits of its CDI spec ([`Policy::adopt_claim`](crate::Policy::adopt_claim)). Either holds CPUs
//! that a claim could ever hold, whatever devices are published now.

use std::collections::BTreeMap;

use super::{
    TopologyAware, Updates,
    claims::{self, HeldClaim, Snapshot},
};
use crate::{
    api::PolicyError,
    idset::{CpuSet, NodeSet},
    topology::MemoryKind,
};

impl TopologyAware {
    /// [`Policy::restore`](crate::Policy::restore): holds the claims of `snapshot`, or, when
    /// it cannot hold one of them exactly, refuses, holding nothing from it.
    pub(super) fn restore_snapshot(
        &mut self,
        snapshot: &serde_json::Value,
    ) -> Result<(), PolicyError> {
        if snapshot.is_null() {
            return Ok(());
        }
        // The version first, so that a newer snapshot says so rather than naming a field this
        // build does not know; then the shape, refusing unknown fields (see `Snapshot`).
        if let Some(version) = snapshot.get("version") {
            match version.as_u64() {
                Some(v) if v > u64::from(claims::SNAPSHOT_VERSION) => {
                    return Err(PolicyError::restore(format!(
                        "snapshot version {v} is newer than this build reads (1 to {}): it was \
                         written by a newer release",
                        claims::SNAPSHOT_VERSION
                    )));
                }
                Some(1..) => {}
                _ => {
                    return Err(PolicyError::restore(format!(
                        "not a topology-aware snapshot: version {version}"
                    )));
                }
            }
        }
        let snap: Snapshot = serde_path_to_error::deserialize(snapshot).map_err(|e| {
            let at = match e.path().to_string() {
                root if root == "." => String::new(),
                path => format!(" at {path}"),
            };
            let inner = e.into_inner();
            let reason = if inner.to_string().starts_with("unknown field") {
                format!(
                    "the snapshot has a field this build does not know, written by a newer \
                     release{at}"
                )
            } else {
                format!("not a topology-aware snapshot{at}")
            };
            PolicyError::restore_decoding(reason, inner)
        })?;
        // A claim keeps its CPUs whatever devices are published now (the device model or the
        // claimable CPUs may have changed since): its pods may be using them. It only needs
        // CPUs that a claim could ever have held, held by no other claim.
        let grantable = self
            .topo
            .online
            .difference(&self.reserved)
            .difference(&self.topo.isolated);
        let mut taken = self.taken.clone();
        let mut restored = BTreeMap::new();
        for claim in snap.claims {
            for (i, r) in claim.results.iter().enumerate() {
                let why = if !self.topo.online.is_superset(&r.cpus) {
                    Some(format!(
                        "{} are not online here (online {})",
                        r.cpus.difference(&self.topo.online),
                        self.topo.online
                    ))
                } else if !grantable.is_superset(&r.cpus) {
                    Some(format!(
                        "{} are reserved or kernel-isolated here",
                        r.cpus.difference(&grantable)
                    ))
                } else if taken.intersects(&r.cpus) {
                    Some(format!(
                        "{} are already held by another claim",
                        taken.intersection(&r.cpus)
                    ))
                } else {
                    None
                };
                if let Some(why) = why {
                    return Err(PolicyError::restore(format!(
                        "claim {} result {i} (device {}): cpus {}: {why}",
                        claim.describe(),
                        r.device,
                        r.cpus,
                    )));
                }
                taken = taken.union(&r.cpus);
            }
            restored.insert(claim.uid.clone(), claim);
        }
        let mut updates = Updates::new();
        let changed = taken.difference(&self.taken);
        self.taken = taken;
        for record in restored.values() {
            self.account_claim(record, true);
        }
        self.claims.extend(restored);
        self.generations.durable += 1;
        self.refresh_devices();
        self.ripple(&changed, &mut updates);
        Ok(())
    }

    /// [`Policy::adopt_claim`](crate::Policy::adopt_claim): holds claim `uid` as `edits`, read
    /// back from its CDI spec, grant it, or refuses, holding nothing from them.
    pub(super) fn adopt(
        &mut self,
        uid: &str,
        edits: &[cdi::ContainerEdits],
    ) -> Result<(), PolicyError> {
        if self.claims.contains_key(uid) {
            return Ok(());
        }
        let refuse = |reason: String| PolicyError::restore(format!("claim {uid}: {reason}"));
        let granted = claims::granted(uid, edits).map_err(refuse)?;
        let memory = claims::granted_memory(uid, edits).map_err(refuse)?;
        // Results whose edits say the same are one request's: two requests never share a CPU.
        // Each request's memory and hugepages are held by its first result.
        let mut requests: Vec<(CpuSet, Option<NodeSet>, Vec<usize>)> = Vec::new();
        for (i, (cpus, mems)) in granted.into_iter().enumerate() {
            match requests
                .iter_mut()
                .find(|(c, m, _)| *c == cpus && *m == mems)
            {
                Some((_, _, results)) => results.push(i),
                None => requests.push((cpus, mems, vec![i])),
            }
        }
        // Like a restore, it holds CPUs that a claim could ever hold, held by no other claim,
        // whatever devices are published now.
        let grantable = self
            .topo
            .online
            .difference(&self.reserved)
            .difference(&self.topo.isolated);
        let mut taken = self.taken.clone();
        let mut results = vec![None; edits.len()];
        // The node of the claim's CPUs: an unpinned memory device's result does not say its own.
        let cpu_node = self
            .nodes_of(
                &requests
                    .iter()
                    .fold(CpuSet::new(), |acc, (c, _, _)| acc.union(c)),
            )
            .first();
        for (k, (cpus, mems, indexes)) in requests.into_iter().enumerate() {
            if cpus.is_empty() {
                // Memory devices' results (individual model): their memory on their node.
                let node = mems.as_ref().and_then(NodeSet::first).or(cpu_node);
                let device = node
                    .map(|n| format!("memory{n}"))
                    .filter(|name| self.table.get(name).is_some_and(|d| d.is_memory()))
                    .unwrap_or_default();
                for (j, i) in indexes.iter().enumerate() {
                    let (bytes, hugepages) = if j == 0 {
                        memory.get(*i).cloned().unwrap_or_default()
                    } else {
                        Default::default()
                    };
                    let holds = bytes > 0 || !hugepages.is_empty();
                    results[*i] = Some(claims::ResultRecord {
                        request: format!("adopted-{k}"),
                        device: device.clone(),
                        memory_pinning: mems.is_some(),
                        memory_node: node.filter(|_| holds),
                        memory: bytes,
                        hugepages,
                        mems: node.into_iter().collect(),
                        cpus: CpuSet::new(),
                    });
                }
                continue;
            }
            if !grantable.is_superset(&cpus) {
                return Err(refuse(format!(
                    "cpus {} are not online or are reserved or kernel-isolated here",
                    cpus.difference(&grantable)
                )));
            }
            if taken.intersects(&cpus) {
                return Err(refuse(format!(
                    "cpus {} are held already",
                    taken.intersection(&cpus)
                )));
            }
            taken = taken.union(&cpus);
            for (i, (device, part)) in indexes.iter().zip(self.split_adopted(&cpus, indexes.len()))
            {
                // Its own nodes out of the request's, when it pins memory: its DRAM node and
                // the memory-only nodes attached to it (a claim's `memoryKinds`).
                let local = self.nodes_of(&part);
                let local_node = local.first();
                let near = self.zone(&local, &MemoryKind::ALL);
                let nodes = match &mems {
                    Some(all) if all.intersects(&near) => all.intersection(&near),
                    Some(all) => all.clone(),
                    None => local,
                };
                let (bytes, hugepages) = if Some(i) == indexes.first() {
                    memory.get(*i).cloned().unwrap_or_default()
                } else {
                    Default::default()
                };
                let holds = bytes > 0 || !hugepages.is_empty();
                results[*i] = Some(claims::ResultRecord {
                    request: format!("adopted-{k}"),
                    device,
                    memory_pinning: mems.is_some(),
                    memory_node: local_node.filter(|_| holds),
                    memory: bytes,
                    hugepages,
                    mems: nodes,
                    cpus: part,
                });
            }
        }
        let changed = taken.difference(&self.taken);
        self.taken = taken;
        let record = HeldClaim {
            uid: uid.to_owned(),
            namespace: String::new(),
            name: String::new(),
            reserved_for: Vec::new(),
            results: results.into_iter().flatten().collect(),
            adopted: true,
        };
        self.account_claim(&record, true);
        self.claims.insert(uid.to_owned(), record);
        self.generations.durable += 1;
        // Before Synchronize nobody runs here to update; the ripple keeps the pools right.
        self.ripple(&changed, &mut Updates::new());
        Ok(())
    }

    /// How an adopted request's `cpus` split over its `n` results: one published device each
    /// when exactly `n` devices make them up (individual devices), or all of them on the
    /// smallest device that holds them when `n` is 1; otherwise, not knowing, all on the first
    /// result. With the device's name, or an empty one when no published device tells.
    fn split_adopted(&self, cpus: &CpuSet, n: usize) -> Vec<(String, CpuSet)> {
        let parts: Vec<(String, CpuSet)> = self
            .table
            .iter()
            .filter(|d| d.cpus.intersects(cpus))
            .map(|d| (d.device.name.clone(), d.cpus.intersection(cpus)))
            .collect();
        let covered = parts.iter().fold(CpuSet::new(), |all, (_, c)| all.union(c));
        if n > 1 && parts.len() == n && covered == *cpus {
            return parts;
        }
        let holder = self
            .table
            .iter()
            .filter(|d| d.cpus.is_superset(cpus))
            .min_by_key(|d| d.cpus.len())
            .map(|d| d.device.name.clone())
            .filter(|_| n == 1)
            .unwrap_or_default();
        std::iter::once((holder, cpus.clone()))
            .chain(std::iter::repeat_n((String::new(), CpuSet::new()), n - 1))
            .collect()
    }
}
