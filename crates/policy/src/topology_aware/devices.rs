//! The devices published for DRA, and the CPUs behind each: the only thing the scheduler sees.
//!
//! Everything here serves one rule: **a claim the scheduler allocates from these devices can
//! always be granted**. The scheduler accounts what it hands out against what a device says
//! (consumable capacity, or one claim per device) and never looks at anything else, so what a
//! device says must hold whatever else happens on the node. Three things make it hold:
//!
//! - the CPUs behind a device are *claimable* (see [`super::Exclusivity`]): no exclusive
//!   container grant ever takes them, and shared containers only borrow them, so claims never
//!   compete with anything the scheduler does not see;
//! - a claim gets exactly what the scheduler accounted: the CPUs a result consumed from a
//!   grouped device, the CPUs of an individual device, or a grouped device whole when the API
//!   server dropped consumable capacity (then the scheduler handed the device out exclusively);
//! - a configuration the scheduler cannot see (`fullCores`) never turns into a refusal: whole
//!   cores are a property of the devices ([`Granularity::Core`]), which the scheduler accounts
//!   for, and a claim asking for them on per-CPU devices gets what it consumed, with a warning.
//!
//! # Device models ([`DeviceMode`])
//!
//! **`grouped`** (default): one device per NUMA node (`numa<N>`; per socket, `socket<N>`, with
//! [`GroupBy::Socket`]) with the consumable capacity `cpu` = its claimable CPUs, shared by many
//! claims (`allowMultipleAllocations`). The request policy makes every amount the scheduler
//! accounts one the policy can grant: a default and minimum of one CPU (one core's threads with
//! [`Granularity::Core`]), in steps of the same, up to the capacity rounded down to a step. A
//! step is left out when the capacity holds only one step (the API server refuses a range whose
//! minimum plus step exceeds the capacity). Needs `DRAConsumableCapacity` (beta and on from
//! Kubernetes 1.36, alpha before): without it the API server drops the capacity fields and the
//! scheduler hands each device to one claim, which then gets all of it.
//!
//! **`individual`**: one device per claimable CPU (`cpu<N>`), or per claimable core (`core<I>`,
//! I the core's index) with [`Granularity::Core`], each for one claim. A claim asks for `count`
//! devices, usually with `matchAttribute` on `resource.kubernetes.io/numaNode`, and gets exactly
//! the CPUs the scheduler picked. Works with GA DRA (1.34) and no alpha gate; a claim holds at
//! most 32 devices (the API's limit on allocation results).
//!
//! With memory published ([`super::memory`]), the individual model adds one **memory device**
//! per NUMA node that offers claims memory or hugepages (`memory<N>`, after the CPU devices):
//! no CPUs, the consumable capacities `memory` and `hugepages<size>` of that node (the same
//! request policies as a grouped NUMA device's, from the same offer, so what it promises is
//! only the claims' share, never what containers placed through NRI use), shared by claims
//! (`allowMultipleAllocations`), and the attributes `resource.kubernetes.io/numaNode`, `socket`
//! and `memoryKind` (`dram`). A claim asks for `count` CPU devices and one memory device with
//! the amounts it needs, tied by `matchAttribute` on `resource.kubernetes.io/numaNode`, so the
//! scheduler puts both on one NUMA node or leaves the claim pending. A DeviceClass for CPUs
//! selects devices with the `cpu` capacity (the chart's does), one for memory the `memoryKind`
//! attribute, testing that a device has it first (a CEL error on a CPU device would abort the
//! allocation). Memory devices need `DRAConsumableCapacity`; without it the scheduler hands one
//! to a single claim, which then gets all of its node's memory for claims.
//!
//! # Attributes
//!
//! Bare names are in the driver's domain (`<driver>/socket`; in CEL
//! `device.attributes["<driver>"].socket`).
//!
//! | attribute | grouped | individual | value |
//! |---|---|---|---|
//! | `resource.kubernetes.io/numaNode` | numa groups | yes (memory devices too) | NUMA node (int) |
//! | `socket` | yes | yes (memory devices too) | package number (int) |
//! | `smt` | yes | — | some core of the group has several threads (bool) |
//! | `wholeCores` | yes | yes | every grant from the device is whole cores (bool) |
//! | `cpu` | — | per-CPU devices | the CPU number (int) |
//! | `core` | — | yes | the core's index on the machine (int) |
//! | `cpus` | — | yes | the device's CPUs, `4,36` (string) |
//! | `siblings` | — | yes | the core's online threads, `4,36` (string) |
//! | `l3` | — | when known | the L3 cache group's index (int) |
//! | `coreType` | — | yes | `standard`, `p-core` or `e-core` (string) |
//! | `memoryKind` | — | memory devices | `dram` (string) |
//! | `hbmAttached`, `pmemAttached`, `cxlAttached` | numa groups | yes (memory devices too) | present (`true`) only when the device's NUMA node has memory-only nodes of that kind attached (bool) |
//! | `resource.kubernetes.io/pcieRoot` | with [`DeviceModel::pcie_roots`] | the same (memory devices: their node's CPUs') | the PCIe roots local to the device's CPUs, sorted (list of strings) |
//!
//! `resource.kubernetes.io/pcieRoot` is a list attribute (`strings`), which the API server
//! keeps only with the alpha gate `DRAListTypeAttributes` (1.36 on), so it is opt-in: a driver
//! cannot see the cluster's gates. There `matchAttribute` on it means the devices' lists
//! intersect, so a GPU publishing its root as a plain string aligns with our devices that list
//! it. A device whose CPUs no root is local to (or a topology without roots) has none.
//!
//! The `…Attached` attributes let a claim whose configuration names a memory kind
//! (`memoryKinds`, [`super::claim_config`]) select devices whose node has it:
//! `"hbmAttached" in device.attributes["<driver>"]`. So the scheduler places such a claim where
//! the kind is, rather than the node refusing it at prepare. They appear only on machines with
//! memory-only nodes, so most nodes' devices carry none.
//!
//! `wholeCores` lets a DeviceClass that sets `fullCores` select only devices that can honour it
//! (`device.attributes["<driver>"].wholeCores`), so such a class is never allocated where whole
//! cores cannot be had.

use std::collections::BTreeMap;

use super::memory::{NodeOffer, hugepage_capacity};
use crate::{
    idset::CpuSet,
    model::{AttributeValue, Capacity, Device, RequestPolicy, ValidValues},
    quantity::Quantity,
    topology::{MemoryKind, Topology},
};

/// The standard list attribute naming the PCIe roots local to a device.
pub const PCIE_ROOT_ATTRIBUTE: &str = "resource.kubernetes.io/pcieRoot";
/// The standard attribute naming a device's NUMA node.
pub const NUMA_NODE_ATTRIBUTE: &str = "resource.kubernetes.io/numaNode";
/// The attribute saying every grant from a device is whole cores.
pub const WHOLE_CORES_ATTRIBUTE: &str = "wholeCores";
/// The consumable capacity of grouped devices (and the size of individual ones).
pub const CPU_CAPACITY: &str = "cpu";
/// The attribute of memory devices naming their memory's kind (`dram`).
pub const MEMORY_KIND_ATTRIBUTE: &str = "memoryKind";
/// The consumable capacity of a NUMA node's memory set aside for claims, in bytes.
pub const MEMORY_CAPACITY: &str = "memory";

/// How devices are cut: see the module docs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum DeviceMode {
    /// One shared device per NUMA node or socket with consumable capacity `cpu`.
    #[default]
    Grouped,
    /// One device per CPU (or per core).
    Individual,
}

/// What a grouped device stands for.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum GroupBy {
    /// One device per NUMA node with CPUs.
    #[default]
    Numa,
    /// One device per socket (package).
    Socket,
}

/// The smallest amount a claim gets.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Granularity {
    /// Single CPUs (hardware threads): a claim may share a core with another.
    #[default]
    Cpu,
    /// Whole cores: only cores whose every online thread is claimable are published, and every
    /// claim gets whole cores.
    Core,
}

/// The device model: see the module docs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeviceModel {
    /// Grouped or individual devices.
    pub mode: DeviceMode,
    /// What a grouped device stands for.
    pub group_by: GroupBy,
    /// Single CPUs or whole cores.
    pub granularity: Granularity,
    /// Whether devices carry `resource.kubernetes.io/pcieRoot` (see the module docs).
    pub pcie_roots: bool,
}

/// How a device is allocated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Share {
    /// Shared by claims, each consuming some of its CPUs in multiples of `step`.
    Consumable {
        /// CPUs per step of the request policy.
        step: usize,
    },
    /// One claim gets all of it.
    Whole,
}

/// A published device and the CPUs behind it (named apart from `resmgr::Published`, the
/// manager's snapshot for readers).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublishedDevice {
    /// As the scheduler sees it.
    pub device: Device,
    /// The CPUs claims on it get.
    pub cpus: CpuSet,
    /// How claims consume it.
    pub share: Share,
    /// Every grant from it is whole cores.
    pub whole_cores: bool,
    /// The NUMA node whose memory and hugepages its `memory` and `hugepages<size>` capacities
    /// are, when it publishes any.
    pub memory_node: Option<u32>,
}

impl PublishedDevice {
    /// Whether it is a memory device of the individual model (`memory<N>`): no CPUs, only its
    /// node's memory and hugepages.
    pub fn is_memory(&self) -> bool {
        self.cpus.is_empty() && self.memory_node.is_some()
    }
}

/// Every device published, by name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeviceTable {
    devices: Vec<PublishedDevice>,
    by_name: BTreeMap<String, usize>,
    cpus: CpuSet,
}

impl DeviceTable {
    /// The devices for `claimable` (the CPUs claims may take) on `topo`, as `model` cuts them,
    /// without memory.
    pub fn build(topo: &Topology, claimable: &CpuSet, model: &DeviceModel) -> Self {
        Self::build_with_memory(topo, claimable, model, &BTreeMap::new())
    }

    /// The devices for `claimable` and for the memory each NUMA node offers claims (`offer`, by
    /// node number): grouped NUMA devices carry their node's as capacities; individual CPU
    /// devices are followed by one memory device per node with an offer.
    pub fn build_with_memory(
        topo: &Topology,
        claimable: &CpuSet,
        model: &DeviceModel,
        offer: &BTreeMap<u32, NodeOffer>,
    ) -> Self {
        let claimable = match model.granularity {
            Granularity::Cpu => claimable.clone(),
            Granularity::Core => whole_cores(topo, claimable),
        };
        let mut devices = match model.mode {
            DeviceMode::Grouped => grouped(topo, &claimable, model, offer),
            DeviceMode::Individual => {
                let mut devices = individual(topo, &claimable, model.granularity);
                devices.extend(memory_devices(topo, offer));
                devices
            }
        };
        if model.pcie_roots {
            for d in &mut devices {
                let local = match (d.is_memory(), d.memory_node) {
                    (true, Some(node)) => topo
                        .numa_node(node)
                        .map(|n| n.cpus.clone())
                        .unwrap_or_default(),
                    _ => d.cpus.clone(),
                };
                let roots = topo.pcie_roots_of(&local);
                if !roots.is_empty() {
                    d.device.attributes.insert(
                        PCIE_ROOT_ATTRIBUTE.to_owned(),
                        AttributeValue::Strings(roots),
                    );
                }
            }
        }
        let by_name = devices
            .iter()
            .enumerate()
            .map(|(i, d)| (d.device.name.clone(), i))
            .collect();
        let cpus = devices
            .iter()
            .fold(CpuSet::new(), |acc, d| acc.union(&d.cpus));
        Self {
            devices,
            by_name,
            cpus,
        }
    }

    /// The device named `name`.
    pub fn get(&self, name: &str) -> Option<&PublishedDevice> {
        self.by_name.get(name).and_then(|&i| self.devices.get(i))
    }

    /// Every CPU behind some device.
    pub fn cpus(&self) -> &CpuSet {
        &self.cpus
    }

    /// The devices in publication order.
    pub fn iter(&self) -> impl Iterator<Item = &PublishedDevice> {
        self.devices.iter()
    }

    /// The devices as published.
    pub fn devices(&self) -> Vec<Device> {
        self.devices.iter().map(|d| d.device.clone()).collect()
    }
}

/// The CPUs of `cpus` whose core is in it whole (every online thread of the core).
pub fn whole_cores(topo: &Topology, cpus: &CpuSet) -> CpuSet {
    topo.cores
        .iter()
        .map(|core| &core.threads)
        .filter(|threads| !threads.is_empty() && cpus.is_superset(threads))
        .fold(CpuSet::new(), |acc, threads| acc.union(threads))
}

fn units(n: usize) -> Quantity {
    Quantity::from_units(u64::try_from(n).unwrap_or(u64::MAX))
}

/// The request policy of a grouped device of `count` CPUs handed out in steps of `step`: see the
/// module docs.
fn request_policy(count: usize, step: usize) -> RequestPolicy {
    let step = step.clamp(1, count.max(1));
    let max = count / step * step;
    RequestPolicy {
        default: Some(units(step)),
        valid: ValidValues::Range {
            min: units(step),
            max: Some(units(max)),
            step: (2 * step <= count).then(|| units(step)),
        },
    }
}

/// The request policy of a memory capacity of `value` bytes consumed in `step`s: nothing by
/// default (a request for CPUs alone takes no memory), any whole number of steps up to all of
/// it. Memory in whole bytes, as the kubelet's Memory Manager counts it; hugepages in whole
/// pages.
fn memory_policy(value: u64, step: u64) -> RequestPolicy {
    RequestPolicy {
        default: Some(Quantity::from_units(0)),
        valid: ValidValues::Range {
            min: Quantity::from_units(0),
            max: Some(Quantity::from_units(value / step * step)),
            step: Some(Quantity::from_units(step)),
        },
    }
}

/// The memory capacities of a node's offer: `memory`, `hugepages<size>`.
fn memory_capacities(offer: &NodeOffer) -> BTreeMap<String, Capacity> {
    let mut out = BTreeMap::new();
    if offer.memory > 0 {
        out.insert(
            MEMORY_CAPACITY.to_owned(),
            Capacity {
                value: Quantity::from_units(offer.memory),
                request_policy: Some(memory_policy(offer.memory, 1)),
            },
        );
    }
    for (&size, &bytes) in &offer.hugepages {
        if bytes >= size && size > 0 {
            out.insert(
                hugepage_capacity(size),
                Capacity {
                    value: Quantity::from_units(bytes),
                    request_policy: Some(memory_policy(bytes, size)),
                },
            );
        }
    }
    out
}

/// A grouped device before its CPUs are cut: name, CPUs, attributes, and its NUMA node (for a
/// device per node).
type Group = (
    String,
    CpuSet,
    BTreeMap<String, AttributeValue>,
    Option<u32>,
);

fn grouped(
    topo: &Topology,
    claimable: &CpuSet,
    model: &DeviceModel,
    offer: &BTreeMap<u32, NodeOffer>,
) -> Vec<PublishedDevice> {
    // Memory goes with NUMA devices only: a socket device's would span nodes, and a claim
    // could not say which.
    let memory_of = |node: u32| match model.group_by {
        GroupBy::Numa => offer.get(&node).map(memory_capacities).unwrap_or_default(),
        GroupBy::Socket => BTreeMap::new(),
    };
    let groups: Vec<Group> = match model.group_by {
        GroupBy::Numa => topo
            .numa_nodes
            .iter()
            .filter(|n| !n.is_memory_only())
            .map(|n| {
                let mut attributes = BTreeMap::new();
                attributes.insert(NUMA_NODE_ATTRIBUTE.to_owned(), int(n.id));
                if let Some(socket) = n.package {
                    attributes.insert("socket".to_owned(), int(socket));
                }
                attributes.extend(attached_attributes(topo, n.id));
                (
                    format!("numa{}", n.id),
                    n.cpus.clone(),
                    attributes,
                    Some(n.id),
                )
            })
            .collect(),
        GroupBy::Socket => topo
            .packages
            .iter()
            .map(|p| {
                let attributes = BTreeMap::from([("socket".to_owned(), int(p.id))]);
                (format!("socket{}", p.id), p.cpus.clone(), attributes, None)
            })
            .collect(),
    };
    groups
        .into_iter()
        .filter_map(|(name, cpus, mut attributes, node)| {
            let cpus = cpus.intersection(claimable);
            if cpus.is_empty() {
                return None;
            }
            let cores = topo.cores.iter().filter(|c| c.threads.intersects(&cpus));
            let threads = cores.map(|c| c.threads.len()).max().unwrap_or(1);
            let smt = threads > 1;
            let step = match model.granularity {
                Granularity::Cpu => 1,
                Granularity::Core => threads,
            };
            let whole = model.granularity == Granularity::Core || !smt;
            attributes.insert("smt".to_owned(), AttributeValue::Bool(smt));
            attributes.insert(
                WHOLE_CORES_ATTRIBUTE.to_owned(),
                AttributeValue::Bool(whole),
            );
            let capacity = Capacity {
                value: units(cpus.len()),
                request_policy: Some(request_policy(cpus.len(), step)),
            };
            let mut capacities = node.map(memory_of).unwrap_or_default();
            let memory_node = node.filter(|_| !capacities.is_empty());
            capacities.insert(CPU_CAPACITY.to_owned(), capacity);
            Some(PublishedDevice {
                device: Device {
                    name,
                    attributes,
                    capacities,
                    allow_multiple_allocations: true,
                    taints: Vec::new(),
                },
                cpus,
                share: Share::Consumable { step },
                whole_cores: whole,
                memory_node,
            })
        })
        .collect()
}

fn individual(
    topo: &Topology,
    claimable: &CpuSet,
    granularity: Granularity,
) -> Vec<PublishedDevice> {
    let package_id = |i: usize| topo.packages.get(i).map(|p| p.id);
    let mut out = Vec::new();
    for (index, core) in topo.cores.iter().enumerate() {
        let mut base = BTreeMap::new();
        if let Some(node) = core.numa {
            base.insert(NUMA_NODE_ATTRIBUTE.to_owned(), int(node));
        }
        if let Some(socket) = package_id(core.package) {
            base.insert("socket".to_owned(), int(socket));
        }
        if let Some(node) = core.numa {
            base.extend(attached_attributes(topo, node));
        }
        base.insert("core".to_owned(), int(index));
        if let Some(l3) = core.l3 {
            base.insert("l3".to_owned(), int(l3));
        }
        base.insert(
            "siblings".to_owned(),
            AttributeValue::String(core.threads.to_string()),
        );
        base.insert(
            "coreType".to_owned(),
            AttributeValue::String(core.kind.as_str().to_owned()),
        );
        let single = |name: String, cpus: CpuSet, mut attributes: BTreeMap<_, _>| {
            let whole = cpus == core.threads;
            attributes.insert(
                WHOLE_CORES_ATTRIBUTE.to_owned(),
                AttributeValue::Bool(whole),
            );
            attributes.insert("cpus".to_owned(), AttributeValue::String(cpus.to_string()));
            let capacity = Capacity {
                value: units(cpus.len()),
                request_policy: None,
            };
            PublishedDevice {
                device: Device {
                    name,
                    attributes,
                    capacities: BTreeMap::from([(CPU_CAPACITY.to_owned(), capacity)]),
                    allow_multiple_allocations: false,
                    taints: Vec::new(),
                },
                cpus,
                share: Share::Whole,
                whole_cores: whole,
                memory_node: None,
            }
        };
        match granularity {
            Granularity::Core => {
                if !core.threads.is_empty() && claimable.is_superset(&core.threads) {
                    out.push(single(format!("core{index}"), core.threads.clone(), base));
                }
            }
            Granularity::Cpu => {
                for cpu in core.threads.iter().filter(|&c| claimable.contains(c)) {
                    let mut attributes = base.clone();
                    attributes.insert("cpu".to_owned(), int(cpu));
                    let cpus = CpuSet::from_iter([cpu]);
                    out.push(single(format!("cpu{cpu}"), cpus, attributes));
                }
            }
        }
    }
    // CPU order, so slices list CPUs in the order people count them.
    out.sort_by_key(|d| d.cpus.first());
    out
}

/// The memory devices of the individual model: one per node that offers claims memory or
/// hugepages (`memory<N>`), shared by claims through its consumable capacities, in node order
/// after the CPU devices.
fn memory_devices(topo: &Topology, offer: &BTreeMap<u32, NodeOffer>) -> Vec<PublishedDevice> {
    offer
        .iter()
        .filter_map(|(&id, offer)| {
            let capacities = memory_capacities(offer);
            if capacities.is_empty() {
                return None;
            }
            let node = topo.numa_nodes.iter().find(|n| n.id == id)?;
            let mut attributes = BTreeMap::new();
            attributes.insert(NUMA_NODE_ATTRIBUTE.to_owned(), int(id));
            if let Some(socket) = node.package {
                attributes.insert("socket".to_owned(), int(socket));
            }
            attributes.insert(
                MEMORY_KIND_ATTRIBUTE.to_owned(),
                AttributeValue::String(node.kind.as_str().to_owned()),
            );
            attributes.extend(attached_attributes(topo, id));
            Some(PublishedDevice {
                device: Device {
                    name: format!("memory{id}"),
                    attributes,
                    capacities,
                    allow_multiple_allocations: true,
                    taints: Vec::new(),
                },
                cpus: CpuSet::new(),
                share: Share::Consumable { step: 1 },
                whole_cores: false,
                memory_node: Some(id),
            })
        })
        .collect()
}

/// `<kind>Attached: true` for each kind of memory-only node attached to NUMA node `node`.
fn attached_attributes(topo: &Topology, node: u32) -> Vec<(String, AttributeValue)> {
    let mut kinds: Vec<MemoryKind> = topo
        .attached_memory()
        .into_iter()
        .filter(|&(_, _, closest)| closest == node)
        .map(|(_, kind, _)| kind)
        .collect();
    kinds.sort_unstable();
    kinds.dedup();
    kinds
        .into_iter()
        .map(|kind| (attached_attribute(kind), AttributeValue::Bool(true)))
        .collect()
}

/// The attribute saying a device's node has memory of `kind` attached (`hbmAttached`).
pub fn attached_attribute(kind: MemoryKind) -> String {
    format!("{}Attached", kind.as_str())
}

fn int(n: impl TryInto<i64>) -> AttributeValue {
    AttributeValue::Int(n.try_into().unwrap_or(i64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::TopologySource;

    fn topo(desc: &str) -> Topology {
        Topology::load(&TopologySource::Synthetic(desc.into())).unwrap()
    }

    fn set(s: &str) -> CpuSet {
        s.parse().unwrap()
    }

    fn range(policy: &RequestPolicy) -> (u64, u64, Option<u64>, u64) {
        let ValidValues::Range { min, max, step } = &policy.valid else {
            panic!("{policy:?}")
        };
        (
            policy.default.unwrap().units_ceil(),
            min.units_ceil(),
            step.map(Quantity::units_ceil),
            max.unwrap().units_ceil(),
        )
    }

    #[test]
    fn request_policies_hold_whole_steps_and_never_a_step_past_the_capacity() {
        // (default, min, step, max)
        assert_eq!(range(&request_policy(6, 1)), (1, 1, Some(1), 6));
        assert_eq!(range(&request_policy(1, 1)), (1, 1, None, 1));
        assert_eq!(range(&request_policy(8, 2)), (2, 2, Some(2), 8));
        assert_eq!(range(&request_policy(7, 2)), (2, 2, Some(2), 6));
        assert_eq!(range(&request_policy(3, 2)), (2, 2, None, 2));
        assert_eq!(range(&request_policy(2, 2)), (2, 2, None, 2));
    }

    #[test]
    fn core_granularity_publishes_whole_cores_only() {
        let t = topo("pack:1 numa:2 core:4 pu:2");
        let model = DeviceModel {
            granularity: Granularity::Core,
            ..DeviceModel::default()
        };
        // CPU 1 is claimable but its sibling 0 is not.
        let table = DeviceTable::build(&t, &set("1-15"), &model);
        let numa0 = table.get("numa0").unwrap();
        assert_eq!(numa0.cpus, set("2-7"));
        assert_eq!(numa0.share, Share::Consumable { step: 2 });
        let cap = &numa0.device.capacities[CPU_CAPACITY];
        assert_eq!(cap.value, Quantity::from_units(6));
        assert_eq!(
            range(cap.request_policy.as_ref().unwrap()),
            (2, 2, Some(2), 6)
        );
        assert_eq!(
            numa0.device.attributes[WHOLE_CORES_ATTRIBUTE],
            AttributeValue::Bool(true)
        );
        assert_eq!(table.cpus(), &set("2-15"));
    }

    #[test]
    fn individual_devices_carry_their_place_on_the_machine() {
        let t = topo("pack:2 numa:1 l3:1 core:2 pu:2");
        let model = DeviceModel {
            mode: DeviceMode::Individual,
            ..DeviceModel::default()
        };
        let table = DeviceTable::build(&t, &set("1-7"), &model);
        let names: Vec<&str> = table.iter().map(|d| d.device.name.as_str()).collect();
        assert_eq!(
            names,
            ["cpu1", "cpu2", "cpu3", "cpu4", "cpu5", "cpu6", "cpu7"]
        );
        let cpu5 = table.get("cpu5").unwrap();
        assert_eq!(cpu5.share, Share::Whole);
        assert!(!cpu5.device.allow_multiple_allocations);
        let attrs = &cpu5.device.attributes;
        assert_eq!(attrs[NUMA_NODE_ATTRIBUTE], AttributeValue::Int(1));
        assert_eq!(attrs["socket"], AttributeValue::Int(1));
        assert_eq!(attrs["core"], AttributeValue::Int(2));
        assert_eq!(attrs["cpu"], AttributeValue::Int(5));
        assert_eq!(attrs["l3"], AttributeValue::Int(1));
        assert_eq!(attrs["siblings"], AttributeValue::String("4-5".into()));
        assert_eq!(attrs["coreType"], AttributeValue::String("standard".into()));
        assert_eq!(attrs[WHOLE_CORES_ATTRIBUTE], AttributeValue::Bool(false));

        let cores = DeviceTable::build(
            &t,
            &set("1-7"),
            &DeviceModel {
                granularity: Granularity::Core,
                ..model
            },
        );
        let names: Vec<&str> = cores.iter().map(|d| d.device.name.as_str()).collect();
        assert_eq!(
            names,
            ["core1", "core2", "core3"],
            "core 0 is split by CPU 0"
        );
        let core2 = cores.get("core2").unwrap();
        assert_eq!(core2.cpus, set("4-5"));
        assert_eq!(
            core2.device.capacities[CPU_CAPACITY].value,
            Quantity::from_units(2)
        );
        assert_eq!(
            core2.device.attributes[WHOLE_CORES_ATTRIBUTE],
            AttributeValue::Bool(true)
        );
    }

    #[test]
    fn sockets_group_their_numa_nodes() {
        let t = topo("pack:2 numa:2 core:2 pu:1");
        let model = DeviceModel {
            group_by: GroupBy::Socket,
            ..DeviceModel::default()
        };
        let table = DeviceTable::build(&t, &set("1-7"), &model);
        let got: Vec<(String, String)> = table
            .iter()
            .map(|d| (d.device.name.clone(), d.cpus.to_string()))
            .collect();
        assert_eq!(
            got,
            [
                ("socket0".to_owned(), "1-3".to_owned()),
                ("socket1".to_owned(), "4-7".to_owned())
            ]
        );
        assert!(
            !table
                .get("socket0")
                .unwrap()
                .device
                .attributes
                .contains_key(NUMA_NODE_ATTRIBUTE)
        );
        // No SMT: single CPUs are whole cores.
        assert!(table.get("socket1").unwrap().whole_cores);
    }

    fn with_roots(mut t: Topology) -> Topology {
        let root = |name: &str, cpus: &str| crate::topology::PcieRoot {
            name: name.to_owned(),
            cpus: set(cpus),
            numa_node: None,
        };
        t.pcie_roots = vec![
            root("pci0000:00", "0-3"),
            root("pci0000:40", "2-5"),
            root("pci0000:80", ""),
        ];
        t
    }

    fn roots_of(table: &DeviceTable, name: &str) -> Option<AttributeValue> {
        table
            .get(name)
            .unwrap()
            .device
            .attributes
            .get(PCIE_ROOT_ATTRIBUTE)
            .cloned()
    }

    fn strings(list: &[&str]) -> Option<AttributeValue> {
        Some(AttributeValue::Strings(
            list.iter().map(|s| (*s).to_owned()).collect(),
        ))
    }

    #[test]
    fn pcie_roots_are_published_only_when_asked_and_only_where_local() {
        let t = with_roots(topo("pack:1 numa:2 core:4 pu:1"));
        let grouped = DeviceModel {
            pcie_roots: true,
            ..DeviceModel::default()
        };
        let table = DeviceTable::build(&t, &set("0-7"), &grouped);
        assert_eq!(
            roots_of(&table, "numa0"),
            strings(&["pci0000:00", "pci0000:40"])
        );
        assert_eq!(roots_of(&table, "numa1"), strings(&["pci0000:40"]));
        // Only the claimable CPUs count: numa1 without 4-5 has no root.
        let table = DeviceTable::build(&t, &set("0-3,6-7"), &grouped);
        assert_eq!(roots_of(&table, "numa1"), None);
        let off = DeviceTable::build(&t, &set("0-7"), &DeviceModel::default());
        assert_eq!(roots_of(&off, "numa0"), None, "opt-in");

        let individual = DeviceModel {
            mode: DeviceMode::Individual,
            ..grouped
        };
        let offer = BTreeMap::from([(
            1,
            NodeOffer {
                memory: 1 << 30,
                ..NodeOffer::default()
            },
        )]);
        let table = DeviceTable::build_with_memory(&t, &set("0-7"), &individual, &offer);
        assert_eq!(roots_of(&table, "cpu1"), strings(&["pci0000:00"]));
        assert_eq!(
            roots_of(&table, "cpu3"),
            strings(&["pci0000:00", "pci0000:40"])
        );
        assert_eq!(roots_of(&table, "cpu7"), None);
        assert_eq!(
            roots_of(&table, "memory1"),
            strings(&["pci0000:40"]),
            "a memory device has its node's cpus' roots"
        );
    }

    #[test]
    fn nothing_claimable_is_no_device() {
        let t = topo("pack:1 core:1 pu:1");
        let table = DeviceTable::build(&t, &CpuSet::new(), &DeviceModel::default());
        assert!(table.devices().is_empty());
    }
}
