//! An out-of-tree policy in under 150 lines: how a team plugs its own decisions into resmgr.
//! `FirstFit` gives Guaranteed whole-CPU containers the lowest free CPUs, runs the rest on the
//! CPUs nobody holds, and serves no DRA claims, using only the crate's public API.
//! Run it with `cargo run -p policy --example first_fit`.

use std::collections::BTreeMap;

use policy::{
    Adjustment, Allocation, Claim, ClaimAllocation, Container, ContainerPlacement, ContainerUpdate,
    CpuSet, Device, GrantKind, Inventory, Pod, Policy, PolicyError, QosClass, Resources, Topology,
    TopologySource,
};

#[derive(Debug)]
struct FirstFit {
    online: CpuSet,
    /// Every container placed: its own CPUs, or `None` for the shared ones.
    placed: BTreeMap<String, Option<CpuSet>>,
}

impl FirstFit {
    fn free(&self) -> CpuSet {
        self.placed.values().flatten().fold(self.online.clone(), |free, s| free.difference(s))
    }
    fn wanted(&self, id: &str) -> ContainerUpdate {
        let cpus = self.placed.get(id).cloned().flatten().unwrap_or_else(|| self.free());
        ContainerUpdate { container_id: id.into(), cpus: Some(cpus), mems: None }
    }
    /// Level-triggered updates: every shared container gets the whole current shared set.
    fn ripple(&self) -> Vec<ContainerUpdate> {
        self.placed.iter().filter(|(_, own)| own.is_none()).map(|(id, _)| self.wanted(id)).collect()
    }
    fn place(&mut self, c: &Container) -> Result<(), PolicyError> {
        let milli = c.resources.cpu_request_milli;
        if c.pod.qos != QosClass::Guaranteed || milli < 1000 || !milli.is_multiple_of(1000) {
            self.placed.insert(c.id.clone(), None);
            return Ok(());
        }
        let (n, free) = (usize::try_from(milli / 1000).unwrap_or(usize::MAX), self.free());
        if free.len() <= n {
            // one CPU always stays for the shared containers
            let reason = format!("needs {n} cpus, {} free, one kept for sharing", free.len());
            return Err(PolicyError::DoesNotFit { subject: format!("container {}", c.id), reason });
        }
        self.placed.insert(c.id.clone(), Some(free.iter().take(n).collect()));
        Ok(())
    }
}

impl Policy for FirstFit {
    fn name(&self) -> &str {
        "first-fit"
    }
    /// No durable state: without claims, `sync` rebuilds everything.
    fn restore(&mut self, _snapshot: &serde_json::Value) -> Result<(), PolicyError> {
        Ok(())
    }
    fn snapshot(&self) -> serde_json::Value {
        serde_json::Value::Null
    }
    fn sync(&mut self, running: &[Container]) -> Result<Vec<ContainerUpdate>, PolicyError> {
        self.placed.clear();
        for c in running {
            // A running container that no longer fits is shared rather than refused.
            if self.place(c).is_err() {
                self.placed.insert(c.id.clone(), None);
            }
        }
        let wanted = running.iter().map(|c| (c, self.wanted(&c.id)));
        Ok(wanted.filter(|(c, u)| c.cpus != u.cpus).map(|(_, u)| u).collect())
    }
    fn allocate(&mut self, c: &Container) -> Result<Allocation, PolicyError> {
        self.place(c)?;
        let own = self.wanted(&c.id);
        let adjustment = Adjustment { cpus: own.cpus, ..Adjustment::default() };
        let exclusive = self.placed.get(&c.id).is_some_and(Option::is_some);
        let mut updates = if exclusive { self.ripple() } else { vec![] };
        updates.retain(|u| u.container_id != c.id);
        Ok(Allocation { adjustment, updates, warnings: vec![] })
    }
    fn update(&mut self, id: &str, _: &Resources) -> Result<Vec<ContainerUpdate>, PolicyError> {
        // Keeps the placement; the topology-aware policy re-places instead.
        let known = self.placed.contains_key(id);
        known.then(|| vec![self.wanted(id)]).ok_or_else(|| PolicyError::UnknownContainer(id.into()))
    }
    fn release(&mut self, id: &str) -> Result<Vec<ContainerUpdate>, PolicyError> {
        Ok(if self.placed.remove(id).flatten().is_some() { self.ripple() } else { vec![] })
    }
    fn devices(&self) -> Result<Vec<Device>, PolicyError> {
        Err(PolicyError::NoDraClaims)
    }
    fn allocate_claim(&mut self, _: &Claim) -> Result<ClaimAllocation, PolicyError> {
        Err(PolicyError::NoDraClaims)
    }
    fn release_claim(&mut self, _uid: &str) -> Result<Vec<ContainerUpdate>, PolicyError> {
        Ok(vec![]) // an unknown claim is success
    }
    fn claims(&self) -> Vec<String> {
        vec![]
    }
    /// What `resmgr` shows in its metrics, `/debug/state` and simulator (it has no pools).
    fn inventory(&self) -> Inventory {
        let place = |(id, own): (&String, &Option<CpuSet>)| {
            let grant = if own.is_some() { GrantKind::Exclusive } else { GrantKind::Shared };
            let cpus = own.clone().unwrap_or_else(|| self.free());
            ContainerPlacement {
                id: id.clone(),
                grant,
                pool: None,
                cpus,
                mems: None,
                fallbacks: vec![],
            }
        };
        let containers = self.placed.iter().map(place).collect();
        Inventory { shared: self.free(), containers, ..Inventory::default() }
    }
}

fn first_fit(desc: &str) -> FirstFit {
    let topo = Topology::load(&TopologySource::Synthetic(desc.into())).expect("a valid topology");
    FirstFit { online: topo.online, placed: BTreeMap::new() }
}

fn container(id: &str, qos: QosClass, cpu_request_milli: u64) -> Container {
    let pod = Pod { uid: format!("pod-{id}"), qos, ..Pod::default() };
    let resources = Resources { cpu_request_milli, ..Resources::default() };
    Container { id: id.into(), pod, resources, ..Container::default() }
}

fn main() {
    // The resource manager only ever sees a `Box<dyn Policy>`.
    let mut p: Box<dyn Policy> = Box::new(first_fit("pack:1 core:8 pu:1"));
    println!("web: {:?}", p.allocate(&container("web", QosClass::Burstable, 500)));
    println!("db: {:?}", p.allocate(&container("db", QosClass::Guaranteed, 2000)));
    println!("{}", serde_json::to_string_pretty(&p.inventory()).expect("plain data"));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exclusive_grants_shrink_the_shared_set_and_claims_are_refused() {
        let mut p = first_fit("pack:1 core:4 pu:1");
        p.allocate(&container("web", QosClass::Burstable, 500)).unwrap();
        let db = p.allocate(&container("db", QosClass::Guaranteed, 2000)).unwrap();
        assert_eq!(db.adjustment.cpus.unwrap().to_string(), "0-1");
        assert_eq!(db.updates[0].cpus.as_ref().unwrap().to_string(), "2-3");
        assert_eq!(p.inventory().containers[0].grant, GrantKind::Exclusive); // db, then web
        assert!(p.allocate(&container("big", QosClass::Guaranteed, 2000)).is_err());
        assert_eq!(p.release("db").unwrap()[0].cpus.as_ref().unwrap().to_string(), "0-3");
        assert_eq!(p.devices(), Err(PolicyError::NoDraClaims));
    }
}
