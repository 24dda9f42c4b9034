//! Where shared containers run when their pool has no shared CPUs left (the enclosing pool's,
//! at worst the reserved CPUs), why ([`Fallback::Widened`], [`Fallback::Reserved`]), and the
//! warnings when an exclusive grant or a claim takes a pool's last shared CPUs.

use super::TopologyAware;
use crate::{idset::CpuSet, inventory::Fallback};

impl TopologyAware {
    /// Where shared containers run when no CPU is shared anywhere: the reserved CPUs, which the
    /// kubelet's static CPU manager keeps in its shared pool for this very reason; on a machine
    /// configured without reserved CPUs, every online CPU rather than none.
    pub(super) fn last_resort(&self) -> CpuSet {
        if self.reserved.is_empty() {
            self.topo.online.clone()
        } else {
            self.reserved.clone()
        }
    }

    /// Why shared pool `pool`'s containers do not run on its own shared CPUs, if they do not.
    pub(super) fn shared_fallback(&self, pool: usize) -> Option<Fallback> {
        if self.shared.get(pool).is_some_and(|s| !s.is_empty()) {
            return None;
        }
        let widened = self
            .ancestors(pool)
            .any(|a| self.shared.get(a).is_some_and(|s| !s.is_empty()));
        Some(if widened {
            Fallback::Widened
        } else {
            Fallback::Reserved
        })
    }

    /// For every pool with shared containers, why they do not run on its own shared CPUs.
    pub(super) fn pool_fallbacks(&self) -> Vec<Option<Fallback>> {
        (0..self.pools.len())
            .map(|i| {
                let members = self.load.get(i).is_some_and(|l| !l.members.is_empty());
                members.then(|| self.shared_fallback(i)).flatten()
            })
            .collect()
    }

    /// Warnings for pools whose shared containers lost their own shared CPUs since `before`
    /// (a [`TopologyAware::pool_fallbacks`]), blaming `cause`.
    pub(super) fn fallback_warnings(
        &self,
        before: &[Option<Fallback>],
        cause: &str,
    ) -> Vec<String> {
        let now = self.pool_fallbacks();
        let mut out = Vec::new();
        for (i, (was, is)) in before.iter().zip(&now).enumerate() {
            let (Some(is), Some(pool), Some(load)) = (is, self.pools.get(i), self.load.get(i))
            else {
                continue;
            };
            if was.as_ref() == Some(is) {
                continue;
            }
            let cpus = self.runs_on.get(i).cloned().unwrap_or_default();
            let instead = match is {
                Fallback::Reserved => "the reserved cpus, as nothing else is shared".to_owned(),
                _ => {
                    let from = self
                        .ancestors(i)
                        .find(|&a| self.shared.get(a).is_some_and(|s| !s.is_empty()))
                        .and_then(|a| self.pools.get(a))
                        .map_or_else(|| "an enclosing pool".to_owned(), |p| p.name.clone());
                    format!("the shared cpus of {from}")
                }
            };
            out.push(format!(
                "{cause} took the last shared cpus of pool {pool}: its shared containers ({}) now run on {instead} ({cpus})",
                load.members.len()
            ));
        }
        out
    }
}
