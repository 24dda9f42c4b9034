//! Planning a claim on the unchanged state: each result's CPUs out of its device's free ones
//! (whole cores first), its memory and hugepages out of its node's account, memory devices tied
//! to the claim's CPUs, and memory nodes widened to the kinds its configuration asks for.
//!
//! Like every `plan_*`, it takes `&self` and returns what to commit, so a refusal changes nothing.

use std::{cmp::Reverse, collections::BTreeMap};

use super::{
    Exclusivity, TopologyAware, claim_config,
    claims::{HeldClaim, ResultRecord},
    cpus,
    devices::{self, CPU_CAPACITY, Share},
    memory,
};
use crate::{
    api::PolicyError,
    idset::{CpuSet, NodeSet},
    model::Claim,
    topology::{MemoryKind, page_size_name},
};

/// What a claim's result gets of its node's memory account.
#[derive(Debug, Clone, Default)]
struct MemoryGrant {
    /// The node charged; `None` when nothing is granted.
    node: Option<u32>,
    /// Bytes of memory.
    memory: u64,
    /// Bytes of hugepages by page size.
    hugepages: BTreeMap<u64, u64>,
}

/// `request/subrequest` → `request`: a configuration names the CPUs of a request, whichever of
/// its subrequests was allocated.
fn base_request(request: &str) -> &str {
    request.split_once('/').map_or(request, |(base, _)| base)
}

/// Bytes as a Kubernetes quantity, in the largest binary unit that is exact (`16Gi`, `3Mi`).
fn bytes_text(bytes: u64) -> String {
    if bytes == 0 {
        "0".into()
    } else {
        page_size_name(bytes)
    }
}

/// What a result holds of memory and hugepages, in words (`16Gi of memory and 256Mi of
/// hugepages2Mi`; `no memory` when nothing).
fn held_text(r: &ResultRecord) -> String {
    let mut parts = Vec::new();
    if r.memory > 0 {
        parts.push(format!("{} of memory", bytes_text(r.memory)));
    }
    for (&size, &bytes) in &r.hugepages {
        parts.push(format!(
            "{} of {}",
            bytes_text(bytes),
            memory::hugepage_capacity(size)
        ));
    }
    if parts.is_empty() {
        "no memory".into()
    } else {
        parts.join(" and ")
    }
}

impl TopologyAware {
    /// Plans a new claim's CPUs, result by result, on the unchanged state, as its
    /// configuration asks; and what to warn about.
    ///
    /// Each result gets what the scheduler accounted on its device (see [`super::devices`]): a
    /// grouped device's consumed CPUs (picked whole cores first, and only whole cores on a
    /// whole-core device), a grouped device whole when the result consumed nothing (the API
    /// server dropped consumable capacity and the scheduler handed it out alone), an individual
    /// device's CPUs. It never waits for shared containers: they move to what stays shared. A
    /// result that cannot be had means the allocation disagrees with what this node published
    /// (another claim holds the CPUs), which the scheduler does not do from current slices.
    pub(super) fn plan_claim(
        &self,
        claim: &Claim,
    ) -> Result<(HeldClaim, Vec<String>), PolicyError> {
        let subject = format!("claim {}/{} ({})", claim.namespace, claim.name, claim.uid);
        let settings = claim_config::settings(claim)?;
        let mut tentative = CpuSet::new();
        // Memory this claim's earlier results take, by node: (bytes, hugepage bytes by size).
        let mut held: BTreeMap<u32, (u64, BTreeMap<u64, u64>)> = BTreeMap::new();
        let mut results = Vec::with_capacity(claim.results.len());
        // The CPUs each request's configuration names (`cpus`) that no result took yet.
        let mut named_left: BTreeMap<&str, CpuSet> = BTreeMap::new();
        // The CPUs of the devices allocated to each such request.
        let mut named_devices: BTreeMap<&str, CpuSet> = BTreeMap::new();
        for ((i, r), s) in claim.results.iter().enumerate().zip(&settings) {
            let at = format!("result {i} (request {})", r.request);
            let Some(device) = self.table.get(&r.device) else {
                let why = if self.config.exclusivity == Exclusivity::Pods {
                    "this node publishes no devices (cpu-exclusivity: pods)".to_owned()
                } else {
                    "it is not one this node publishes".to_owned()
                };
                return Err(PolicyError::Invalid {
                    subject,
                    reason: format!("{at}: device {:?}: {why}", r.device),
                });
            };
            if device.is_memory() && s.cpus.is_some() {
                return Err(PolicyError::Invalid {
                    subject,
                    reason: format!(
                        "{at}: its configuration names cpus, but the request is for memory device {}, which has none: name the cpus in the configuration of the request for cpus",
                        r.device
                    ),
                });
            }
            if device.is_memory() {
                // Memory without CPUs: what it consumed of its node's account, or, handed out
                // whole (the API server dropped consumable capacity), all of it.
                let whole = r.consumed_capacity.is_empty();
                let grant = self.plan_claim_memory(&subject, &at, r, device, whole, &held)?;
                if let Some(node) = grant.node {
                    let entry = held.entry(node).or_default();
                    entry.0 += grant.memory;
                    for (size, bytes) in &grant.hugepages {
                        *entry.1.entry(*size).or_default() += bytes;
                    }
                }
                results.push(ResultRecord {
                    request: r.request.clone(),
                    device: r.device.clone(),
                    mems: device.memory_node.into_iter().collect(),
                    cpus: CpuSet::new(),
                    memory_pinning: s.memory_pinning,
                    memory_node: grant.node,
                    memory: grant.memory,
                    hugepages: grant.hugepages,
                });
                continue;
            }
            let free = device.cpus.difference(&self.taken).difference(&tentative);
            let consumed = match device.share {
                Share::Whole => None,
                Share::Consumable { .. } => r.consumed_capacity.get(CPU_CAPACITY),
            };
            let cpus = if let Some(named) = &s.cpus {
                let n = match consumed {
                    None => device.cpus.len(),
                    Some(q) => usize::try_from(q.units_ceil()).unwrap_or(usize::MAX),
                };
                let in_devices = named_devices.entry(base_request(&r.request)).or_default();
                *in_devices = in_devices.union(&device.cpus);
                let left = named_left
                    .entry(base_request(&r.request))
                    .or_insert_with(|| named.clone());
                self.take_named(&subject, &at, &r.device, device, n, left, &tentative)?
            } else {
                match consumed {
                    None => {
                        if free != device.cpus {
                            let why = match device.share {
                            Share::Whole => "it is allocated to one claim at a time".to_owned(),
                            Share::Consumable { .. } => "the result consumed no capacity, so the scheduler handed the device out whole (DRAConsumableCapacity is off: device-mode individual fits this cluster)".to_owned(),
                        };
                            return Err(PolicyError::DoesNotFit {
                                subject,
                                reason: format!(
                                    "{at} on device {}: {why}, but cpus {} of it are held by {}",
                                    r.device,
                                    device.cpus.difference(&free),
                                    self.holders(&device.cpus.difference(&free), &tentative)
                                ),
                            });
                        }
                        device.cpus.clone()
                    }
                    Some(q) => {
                        let n = usize::try_from(q.units_ceil()).unwrap_or(usize::MAX);
                        if n == 0 {
                            return Err(PolicyError::Invalid {
                                subject,
                                reason: format!("{at}: consumes no cpu"),
                            });
                        }
                        let whole = (device.whole_cores || s.full_cores)
                            .then(|| self.pick_whole_cores(&free, n))
                            .flatten();
                        let picked =
                            whole.or_else(|| cpus::pick(&self.topo, &self.index, &free, n, None));
                        let Some(cpus) = picked else {
                            return Err(PolicyError::DoesNotFit {
                                subject,
                                reason: format!(
                                    "{at} consumed {n} cpus of device {}, but only {} of its {} are free ({} held by {})",
                                    r.device,
                                    free.len(),
                                    device.cpus.len(),
                                    device.cpus.difference(&free),
                                    self.holders(&device.cpus.difference(&free), &tentative)
                                ),
                            });
                        };
                        cpus
                    }
                }
            };
            tentative = tentative.union(&cpus);
            let whole = consumed.is_none();
            let grant = self.plan_claim_memory(&subject, &at, r, device, whole, &held)?;
            if let Some(node) = grant.node {
                let entry = held.entry(node).or_default();
                entry.0 += grant.memory;
                for (size, bytes) in &grant.hugepages {
                    *entry.1.entry(*size).or_default() += bytes;
                }
            }
            results.push(ResultRecord {
                request: r.request.clone(),
                device: r.device.clone(),
                mems: self.nodes_of(&cpus),
                cpus,
                memory_pinning: s.memory_pinning,
                memory_node: grant.node,
                memory: grant.memory,
                hugepages: grant.hugepages,
            });
        }
        for (request, left) in named_left {
            if left.is_empty() {
                continue;
            }
            let allocated = named_devices.get(request).cloned().unwrap_or_default();
            let beyond = left.intersection(&allocated);
            let reason = if beyond.is_empty() {
                format!(
                    "its configuration names cpus {left}, which lie in no device the scheduler allocated to it: {}",
                    self.why_not_allocated(&left)
                )
            } else {
                let outside = left.difference(&allocated);
                let also = if outside.is_empty() {
                    String::new()
                } else {
                    format!(", and {}", self.why_not_allocated(&outside))
                };
                format!(
                    "its configuration names cpus {beyond} beyond the cpus the scheduler allocated to it of its devices{also}: name exactly as many as the request consumed"
                )
            };
            return Err(PolicyError::Invalid {
                subject,
                reason: format!("request {request}: {reason}"),
            });
        }
        let mut warnings = self.tie_memory_devices(&subject, &mut results)?;
        self.widen_to_memory_kinds(&subject, &mut results, &settings)?;
        self.pin_named_nodes(&subject, &mut results, &settings)?;
        // fullCores: whole cores per request (an individual request's CPUs are whole cores
        // together, not one by one).
        let mut asked: BTreeMap<&str, CpuSet> = BTreeMap::new();
        for (r, s) in results.iter().zip(&settings) {
            if s.full_cores {
                let entry = asked.entry(r.request.as_str()).or_default();
                *entry = entry.union(&r.cpus);
            }
        }
        for (request, cpus) in asked {
            let split = cpus.difference(&devices::whole_cores(&self.topo, &cpus));
            if !split.is_empty() {
                warnings.push(format!(
                    "{subject}: request {request} asks for whole cores (fullCores), but got cpus {cpus}, which share cores through {split}: its devices hand out single cpus (claim-granularity: cpu), so it gets what the scheduler allocated; select devices with wholeCores in its DeviceClass to get whole cores"
                ));
            }
        }
        Ok((
            HeldClaim {
                uid: claim.uid.clone(),
                namespace: claim.namespace.clone(),
                name: claim.name.clone(),
                reserved_for: claim.reserved_for.clone(),
                results,
                adopted: false,
            },
            warnings,
        ))
    }

    /// Ties a claim's memory devices (individual model) to its CPUs: its results' memory nodes
    /// become the nodes of its memory devices, where its memory is charged, so a container using
    /// it allocates from the memory it was granted. A memory device result without any CPU
    /// result is refused (a container using it would have no CPUs of the claim to run on);
    /// memory on another node than the claim's CPUs (a claim without the `matchAttribute`
    /// constraint on `resource.kubernetes.io/numaNode`) is granted as allocated, since the
    /// scheduler placed the pod for it, with a warning. Errors and warnings name the request
    /// and the amount.
    fn tie_memory_devices(
        &self,
        subject: &str,
        results: &mut [ResultRecord],
    ) -> Result<Vec<String>, PolicyError> {
        let memory_nodes = results
            .iter()
            .filter(|r| r.cpus.is_empty())
            .fold(NodeSet::new(), |acc, r| acc.union(&r.mems));
        if memory_nodes.is_empty() {
            return Ok(Vec::new());
        }
        let cpus = results
            .iter()
            .fold(CpuSet::new(), |acc, r| acc.union(&r.cpus));
        let cpu_nodes = self.nodes_of(&cpus);
        let tie = format!(
            "tie its requests with constraints: [{{matchAttribute: {}}}]",
            devices::NUMA_NODE_ATTRIBUTE
        );
        let mut warnings = Vec::new();
        for (i, r) in results
            .iter()
            .enumerate()
            .filter(|(_, r)| r.cpus.is_empty())
        {
            let at = format!(
                "result {i} (request {}) is {} of NUMA node {} (device {})",
                r.request,
                held_text(r),
                r.mems,
                r.device
            );
            if cpus.is_empty() {
                return Err(PolicyError::Invalid {
                    subject: subject.to_owned(),
                    reason: format!(
                        "{at}, but the claim has no cpus to go with it: ask for cpu devices in the same claim and {tie}"
                    ),
                });
            }
            if r.memory_pinning && cpu_nodes != r.mems {
                warnings.push(format!(
                    "{subject}: {at}, but its cpus {cpus} are on NUMA node {cpu_nodes}: containers using it get memory node {} as allocated, away from their cpus; {tie}",
                    memory_nodes
                ));
            }
        }
        for r in results.iter_mut() {
            r.mems = memory_nodes.clone();
        }
        Ok(warnings)
    }

    /// Widens each pinned result's memory nodes to the kinds its configuration allows
    /// (`memoryKinds`, see [`claim_config`]): the memory-only nodes of those kinds attached to
    /// its DRAM nodes, and the DRAM nodes only when `dram` is among them. A kind none of its
    /// nodes has attached, and leaving out `dram` for a result that holds memory or hugepages
    /// of its node, refuse the claim, naming the request and what it holds.
    fn widen_to_memory_kinds(
        &self,
        subject: &str,
        results: &mut [ResultRecord],
        settings: &[claim_config::Settings],
    ) -> Result<(), PolicyError> {
        for (i, (r, s)) in results.iter_mut().zip(settings).enumerate() {
            if !r.memory_pinning || s.memory_kinds == [MemoryKind::Dram] {
                continue;
            }
            let holds = if r.cpus.is_empty() {
                held_text(r)
            } else if r.memory > 0 || !r.hugepages.is_empty() {
                format!("cpus {} and {}", r.cpus, held_text(r))
            } else {
                format!("cpus {}", r.cpus)
            };
            let at = format!(
                "result {i} (request {}, {holds} on NUMA node {})",
                r.request, r.mems
            );
            let refuse = |reason: String| PolicyError::Invalid {
                subject: subject.to_owned(),
                reason: format!("{at}: {reason}"),
            };
            for &kind in s.memory_kinds.iter().filter(|&&k| k != MemoryKind::Dram) {
                if self.attached_to(&r.mems, &[kind]).next().is_some() {
                    continue;
                }
                let elsewhere: NodeSet = self
                    .attached
                    .iter()
                    .filter(|(_, k, _)| *k == kind)
                    .map(|(node, _, _)| *node)
                    .collect();
                let here = if elsewhere.is_empty() {
                    format!("this machine has no {} memory", kind.as_str())
                } else {
                    format!(
                        "this machine's {} memory is node {}, attached to other nodes",
                        kind.as_str(),
                        elsewhere
                    )
                };
                let kind_name = kind.as_str();
                return Err(refuse(format!(
                    "its configuration's memoryKinds names {kind_name}, but no {kind_name} memory is attached to NUMA node {} ({here}); select devices with the attribute {}, or leave {kind_name} out",
                    r.mems,
                    devices::attached_attribute(kind),
                )));
            }
            if !s.memory_kinds.contains(&MemoryKind::Dram)
                && (r.memory > 0 || !r.hugepages.is_empty())
            {
                return Err(refuse(format!(
                    "its configuration's memoryKinds leaves out dram, but the {} it holds are NUMA node {}'s dram: add dram, or ask for no memory",
                    held_text(r),
                    r.mems
                )));
            }
            r.mems = self.zone(&r.mems, &s.memory_kinds);
        }
        Ok(())
    }

    /// The memory and hugepages result `r` on `device` gets from its node's account: what it
    /// consumed of the device's `memory` and `hugepages<size>` capacities, or, for a device
    /// handed out `whole`, all of them. `held` is what the claim's earlier results take. A
    /// result that consumed memory the node does not have for claims, hugepages of a size it
    /// keeps none of, or hugepages that are not whole pages is refused, naming the request and
    /// the amount; nothing is charged then.
    fn plan_claim_memory(
        &self,
        subject: &str,
        at: &str,
        r: &crate::model::AllocationResult,
        device: &devices::PublishedDevice,
        whole: bool,
        held: &BTreeMap<u32, (u64, BTreeMap<u64, u64>)>,
    ) -> Result<MemoryGrant, PolicyError> {
        let invalid = |reason: String| PolicyError::Invalid {
            subject: subject.to_owned(),
            reason: format!("{at}: {reason}"),
        };
        let short = |reason: String| PolicyError::DoesNotFit {
            subject: subject.to_owned(),
            reason: format!("{at}: {reason}"),
        };
        let mut memory = 0u64;
        let mut hugepages: BTreeMap<u64, u64> = BTreeMap::new();
        let mut asked = Vec::new();
        for (name, q) in &r.consumed_capacity {
            // Memory in whole bytes, rounded up as the kubelet rounds a request.
            let bytes = q.units_ceil();
            if bytes == 0 || name == CPU_CAPACITY {
                continue;
            }
            if name == devices::MEMORY_CAPACITY {
                memory = bytes;
                asked.push(format!("{} of memory", bytes_text(bytes)));
            } else if let Some(size) = memory::hugepage_size(name) {
                if !q.milli().is_multiple_of(1000) || !bytes.is_multiple_of(size) {
                    return Err(invalid(format!(
                        "consumed {} of {name}, which is not a whole number of {} pages",
                        bytes_text(bytes),
                        page_size_name(size)
                    )));
                }
                hugepages.insert(size, bytes);
                asked.push(format!("{} of {name}", bytes_text(bytes)));
            }
        }
        let Some(node) = device.memory_node else {
            if asked.is_empty() {
                return Ok(MemoryGrant::default());
            }
            return Err(invalid(format!(
                "consumed {} of device {}, which publishes no memory or hugepages",
                asked.join(" and "),
                r.device
            )));
        };
        let (held_memory, held_huge) = held.get(&node).cloned().unwrap_or_default();
        let memory_free = self.ledger.claim_free(node).saturating_sub(held_memory);
        let huge_free = |size: u64| {
            self.ledger
                .hugepages_free(node, size)
                .map(|free| free.saturating_sub(held_huge.get(&size).copied().unwrap_or(0)))
        };
        if whole {
            // The scheduler handed the device out alone: all of its node's memory is the
            // claim's, as all of its CPUs are.
            let hugepages = device
                .device
                .capacities
                .keys()
                .filter_map(|name| memory::hugepage_size(name))
                .filter_map(|size| huge_free(size).map(|free| (size, free)))
                .filter(|(_, free)| *free > 0)
                .collect();
            return Ok(MemoryGrant {
                node: Some(node),
                memory: memory_free,
                hugepages,
            });
        }
        if memory > memory_free {
            return Err(short(format!(
                "consumed {} of memory of device {} (node {node}), but only {} of the {} set aside for claims there are free ({} held by claims)",
                bytes_text(memory),
                r.device,
                bytes_text(memory_free),
                bytes_text(self.ledger.claim_free(node) + self.ledger.claimed(node)),
                bytes_text(self.ledger.claimed(node) + held_memory),
            )));
        }
        for (&size, &bytes) in &hugepages {
            let name = memory::hugepage_capacity(size);
            let Some(free) = huge_free(size) else {
                return Err(invalid(format!(
                    "consumed {} of {name}, but node {node} keeps no {} hugepages for claims",
                    bytes_text(bytes),
                    page_size_name(size)
                )));
            };
            if bytes > free {
                return Err(short(format!(
                    "consumed {} of {name} of device {} (node {node}), but only {} are free for claims",
                    bytes_text(bytes),
                    r.device,
                    bytes_text(free),
                )));
            }
        }
        let any = memory > 0 || !hugepages.is_empty();
        Ok(MemoryGrant {
            node: any.then_some(node),
            memory,
            hugepages,
        })
    }

    /// The `n` CPUs of `device` that a result whose configuration names its request's CPUs
    /// gets: the lowest `n` of those named (`left`, the named CPUs no earlier result of the
    /// request took) that lie in the device, taken out of `left`. Refused, naming the CPUs and
    /// why, when fewer than `n` of them lie in the device, when one of them is held (by a claim,
    /// or by an earlier result of this claim: `tentative`), or when they split a core of a
    /// whole-core device. Never other CPUs instead.
    #[allow(clippy::too_many_arguments)]
    fn take_named(
        &self,
        subject: &str,
        at: &str,
        device_name: &str,
        device: &devices::PublishedDevice,
        n: usize,
        left: &mut CpuSet,
        tentative: &CpuSet,
    ) -> Result<CpuSet, PolicyError> {
        let invalid = |reason: String| PolicyError::Invalid {
            subject: subject.to_owned(),
            reason: format!("{at}: {reason}"),
        };
        let here = left.intersection(&device.cpus);
        let held = here.intersection(&self.taken.union(tentative));
        if !held.is_empty() {
            return Err(PolicyError::DoesNotFit {
                subject: subject.to_owned(),
                reason: format!(
                    "{at}: its configuration names cpus {held} of device {device_name}, which are held by {}",
                    self.holders(&held, tentative)
                ),
            });
        }
        if here.len() < n {
            let elsewhere = left.difference(&device.cpus);
            let where_else = if elsewhere.is_empty() {
                String::new()
            } else {
                format!(
                    "; of the others it names, {}",
                    self.why_not_allocated(&elsewhere)
                )
            };
            let named = if here.is_empty() {
                "none of them".to_owned()
            } else {
                format!("{} of them ({here})", here.len())
            };
            return Err(invalid(format!(
                "the scheduler allocated {n} {} of device {device_name} (cpus {}), and its configuration names {named}{where_else}: name exactly as many of the device's cpus as the request consumed",
                if n == 1 { "cpu" } else { "cpus" },
                device.cpus
            )));
        }
        let taken: CpuSet = here.iter().take(n).collect();
        if device.whole_cores {
            let split = taken.difference(&devices::whole_cores(&self.topo, &taken));
            if !split.is_empty() {
                return Err(invalid(format!(
                    "device {device_name} hands out whole cores, but the cpus its configuration names for it ({taken}) take only part of a core through {split}: name every thread of each core"
                )));
            }
        }
        *left = left.difference(&taken);
        Ok(taken)
    }

    /// Why `cpus` are not CPUs of a claim's allocated devices, in words, by reason:
    /// `cpu 0 is reserved; cpus 8-11 are on device numa1`.
    fn why_not_allocated(&self, cpus: &CpuSet) -> String {
        let mut by_reason: BTreeMap<String, CpuSet> = BTreeMap::new();
        for cpu in cpus.iter() {
            let one: CpuSet = std::iter::once(cpu).collect();
            let reason = if !self.topo.online.contains(cpu) {
                "not online on this node".to_owned()
            } else if self.reserved.contains(cpu) {
                "reserved for system pods".to_owned()
            } else if let Some(d) = self.table.iter().find(|d| d.cpus.contains(cpu)) {
                format!(
                    "on device {}, which the scheduler did not allocate to the request",
                    d.device.name
                )
            } else if self.isolated.contains(cpu) {
                "kernel-isolated, not published for claims".to_owned()
            } else {
                "not published for claims".to_owned()
            };
            let entry = by_reason.entry(reason).or_default();
            *entry = entry.union(&one);
        }
        by_reason
            .into_iter()
            .map(|(reason, cpus)| match cpus.len() {
                1 => format!("cpu {cpus} is {reason}"),
                _ => format!("cpus {cpus} are {reason}"),
            })
            .collect::<Vec<_>>()
            .join("; ")
    }

    /// Pins each result whose configuration names its memory nodes (`memoryNodes`) to exactly
    /// those, once they are checked: memory pinning on, every node the NUMA node of the
    /// result's CPUs or memory or a memory-only node of a kind `memoryKinds` allows attached to
    /// one, and the node whose memory it holds among them. Refused otherwise, naming the nodes
    /// and why.
    fn pin_named_nodes(
        &self,
        subject: &str,
        results: &mut [ResultRecord],
        settings: &[claim_config::Settings],
    ) -> Result<(), PolicyError> {
        for (i, (r, s)) in results.iter_mut().zip(settings).enumerate() {
            let Some(named) = &s.memory_nodes else {
                continue;
            };
            let refuse = |reason: String| PolicyError::Invalid {
                subject: subject.to_owned(),
                reason: format!(
                    "result {i} (request {}): its configuration names memory nodes {named}, but {reason}",
                    r.request
                ),
            };
            if !r.memory_pinning {
                return Err(refuse(
                    "memoryPinning is false, so its containers are pinned to no memory node: leave one of the two out".to_owned(),
                ));
            }
            let mut dram = self.nodes_of(&r.cpus);
            dram.extend(r.memory_node);
            if r.cpus.is_empty() {
                dram.extend(r.mems.iter());
            }
            let allowed = self.zone(&dram, &s.memory_kinds).union(&r.mems);
            let outside = named.difference(&allowed);
            if !outside.is_empty() {
                return Err(refuse(format!(
                    "{} {outside} {} neither the NUMA node of its cpus or memory (node {dram}) nor a memory-only node of the kinds its memoryKinds allows attached to it",
                    if outside.len() == 1 { "node" } else { "nodes" },
                    if outside.len() == 1 { "is" } else { "are" },
                )));
            }
            if let Some(node) = r.memory_node.filter(|n| !named.contains(*n)) {
                return Err(refuse(format!(
                    "it holds {} of node {node}, which they leave out",
                    held_text(r)
                )));
            }
            r.mems = named.clone();
        }
        Ok(())
    }

    /// Who holds `cpus`: the claims (and this claim's earlier results, `tentative`).
    fn holders(&self, cpus: &CpuSet, tentative: &CpuSet) -> String {
        let mut who: Vec<String> = self
            .claims
            .values()
            .filter(|c| c.cpus().intersects(cpus))
            .map(|c| format!("claim {}", c.describe()))
            .collect();
        if tentative.intersects(cpus) {
            who.push("this claim's other results".into());
        }
        if who.is_empty() {
            "containers".into()
        } else {
            who.join(", ")
        }
    }

    /// `n` CPUs of `free` in whole cores, if whole cores can make them up exactly: as the
    /// picker chooses them (cache locality, packing), else the largest cores first (on hybrid
    /// parts, where cores have different thread counts).
    fn pick_whole_cores(&self, free: &CpuSet, n: usize) -> Option<CpuSet> {
        let whole = devices::whole_cores(&self.topo, free);
        if let Some(cpus) = cpus::pick(&self.topo, &self.index, &whole, n, None)
            && devices::whole_cores(&self.topo, &cpus) == cpus
        {
            return Some(cpus);
        }
        let mut cores: Vec<&CpuSet> = self
            .topo
            .cores
            .iter()
            .map(|c| &c.threads)
            .filter(|t| !t.is_empty() && whole.is_superset(t))
            .collect();
        cores.sort_by_key(|t| (Reverse(t.len()), t.first()));
        let mut picked = CpuSet::new();
        let mut left = n;
        for threads in cores {
            if threads.len() <= left {
                picked = picked.union(threads);
                left -= threads.len();
            }
        }
        (left == 0).then_some(picked)
    }

    /// How many CPUs an allocation result gets (see [`devices`]): what it consumed of a shared
    /// device, all of a device handed out whole; for a device not published (the device model
    /// changed since it was allocated), what it consumed, if it says.
    pub(super) fn cpus_for(&self, r: &crate::model::AllocationResult) -> Option<u64> {
        let consumed = r
            .consumed_capacity
            .get(devices::CPU_CAPACITY)
            .map(|q| q.units_ceil());
        let Some(device) = self.table.get(&r.device) else {
            return consumed;
        };
        let whole = u64::try_from(device.cpus.len()).ok();
        match device.share {
            devices::Share::Whole => whole,
            devices::Share::Consumable { .. } => consumed.or(whole),
        }
    }
}
