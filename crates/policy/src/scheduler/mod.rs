//! A model of how kube-scheduler allocates a ResourceClaim from our devices: what the scheduler
//! hands out, from what the agent has published at that moment and what is already allocated.
//!
//! The scheduler only ever sees the ResourceSlices. A claim it allocated is never moved, so when
//! the agent then refuses it the pod is stuck; this model lets the simulator and the tests put
//! the scheduler's view next to the node's. It follows the structured-parameters allocator of
//! `k8s.io/dynamic-resource-allocation/structured` (1.34 to 1.36) for the parts our devices use:
//!
//! - **requests by count** ([`DeviceRequest::count`], `exactly.count`): that many distinct
//!   devices, each taken whole unless it allows multiple allocations;
//! - **consumable capacity** ([`DeviceRequest::capacity`], `exactly.capacity.requests`): on a
//!   device with `allowMultipleAllocations`, each allocation consumes an amount rounded by the
//!   capacity's request policy ([`capacity`]: 2500m becomes 3 under `min 1, step 1`; no amount
//!   asked takes the policy's default, or the whole capacity without one), the sum over all
//!   allocations must stay within the capacity, and every result gets a fresh share ID and its
//!   `consumedCapacity` (every capacity of the device, under the name the device published);
//! - **`matchAttribute` constraints** ([`Constraint`]): every device of the requests named
//!   (all of them when none are) has the attribute, and their values have one in common: a
//!   list attribute (`strings`, `DRAListTypeAttributes`) is the set of its elements, a scalar
//!   a one-element set, as kube-scheduler compares them with that gate;
//! - **attribute-equality selectors** ([`Selector`]) in place of CEL: `device.attributes[...]
//!   == value`. Attributes are looked up as the allocator does: the qualified name, or, when
//!   its domain is the driver's, the bare name the device published; capacity names match
//!   exactly;
//! - **taints** ([`Device::taints`]): a device with a `NoSchedule` or `NoExecute` taint is
//!   allocated to no claim, as kube-scheduler does with `DRADeviceTaints` (beta and on from
//!   1.36, GA in 1.37) for claims that do not tolerate it (ours carry no tolerations);
//! - **the search** ([`search`]): requests in order, devices in published order, first
//!   solution, backtracking; at most 32 results per claim;
//! - **the `DRAConsumableCapacity` gate** ([`Gates`]): off (the default on 1.34 and 1.35), the
//!   API server drops `allowMultipleAllocations` and request policies from the slices and
//!   `capacity` from the claim's requests, so every device is handed out whole to one claim,
//!   with neither share ID nor consumed capacity ([`Scheduler::stored_devices`],
//!   [`Scheduler::stored_claim`]).
//!
//! What is allocated follows the scheduler's allocated state: a result with a share ID (gate on)
//! consumes capacity of a shared device; any other result holds its device whole, whatever the
//! device allows.
//!
//! Out of scope, because our devices and claims do not use them: CEL, `allocationMode: All`,
//! `firstAvailable` subrequests, admin access, tolerations, partitionable devices (shared counters),
//! `distinctAttribute`, several claims of a pod allocated together, and incomplete pools (the
//! devices given are one complete pool). Share IDs are deterministic here (the scheduler's are
//! random UIDs), so simulations print the same every time.
//!
//! The model is checked against the real allocator: `tests/scheduler_vectors.rs` and the Go
//! test in `tests/conformance/allocator` run the same cases through both.

pub mod capacity;
mod search;

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt,
};

use crate::{
    model::{AllocationResult, AttributeValue, Device, TaintEffect},
    quantity::Quantity,
};

/// Capacity consumed from shared devices: device name -> capacity name -> amount.
type SharedUse = BTreeMap<String, BTreeMap<String, Quantity>>;

/// Most results one claim's allocation may hold (`AllocationResultsMaxSize`).
pub const MAX_RESULTS: usize = 32;

/// The feature gates that change what the scheduler does with our devices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gates {
    /// `DRAConsumableCapacity`: alpha and off in 1.34 and 1.35, beta and on from 1.36.
    pub consumable_capacity: bool,
}

/// An attribute-equality selector: the device's attribute has this value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selector {
    /// A qualified name (`resource.kubernetes.io/numaNode`) or a bare one (in the driver's
    /// domain).
    pub attribute: String,
    /// The value it must have.
    pub value: AttributeValue,
}

/// One request of a claim (`spec.devices.requests[]` with `exactly`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceRequest {
    /// The request's name (a DNS label).
    pub name: String,
    /// How many devices (`exactly.count`, 1 when not set).
    pub count: u32,
    /// Selectors every device must satisfy.
    pub selectors: Vec<Selector>,
    /// Capacity each device must provide (`exactly.capacity.requests`), by capacity name.
    pub capacity: BTreeMap<String, Quantity>,
    /// Capacities every device must publish, whatever the gates (CEL `"cpu" in
    /// device.capacity["<driver>"]`, as the chart's DeviceClass selects CPU devices and not the
    /// memory devices of `device-mode: individual`). Bare names, in the driver's domain.
    pub has_capacity: Vec<String>,
}

impl DeviceRequest {
    /// A request for `count` devices named `name`, without selectors or capacity.
    pub fn count(name: &str, count: u32) -> Self {
        Self {
            name: name.to_owned(),
            count,
            selectors: Vec::new(),
            capacity: BTreeMap::new(),
            has_capacity: Vec::new(),
        }
    }

    /// A request for one device with `amount` of capacity `capacity`.
    pub fn capacity(name: &str, capacity: &str, amount: Quantity) -> Self {
        Self {
            capacity: BTreeMap::from([(capacity.to_owned(), amount)]),
            ..Self::count(name, 1)
        }
    }
}

/// A `matchAttribute` constraint (`spec.devices.constraints[]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Constraint {
    /// The requests it applies to; empty means all.
    pub requests: Vec<String>,
    /// The fully qualified attribute all their devices share a value of
    /// (`resource.kubernetes.io/numaNode`; of a list attribute such as
    /// `resource.kubernetes.io/pcieRoot`, one element).
    pub match_attribute: String,
}

/// What a ResourceClaim asks for (`spec.devices`), as far as allocation goes; its configuration
/// is carried next to the results, not chosen by the scheduler.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClaimSpec {
    /// The requests, in order.
    pub requests: Vec<DeviceRequest>,
    /// The constraints.
    pub constraints: Vec<Constraint>,
}

/// Why the scheduler did not allocate a claim.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScheduleError {
    /// The API server would refuse the claim itself.
    #[error("invalid claim: {0}")]
    Invalid(String),
    /// The claim is valid but does not fit on this node now: the pod stays Pending.
    #[error("unschedulable: {0}")]
    Unschedulable(String),
}

/// The scheduler's view of one node's pool: what it allocated from our devices. See the module
/// docs.
#[derive(Debug, Clone)]
pub struct Scheduler {
    driver: String,
    pool: String,
    gates: Gates,
    /// Claim UID -> its results, for every allocated claim.
    allocated: BTreeMap<String, Vec<AllocationResult>>,
    next_share: u64,
}

impl Scheduler {
    /// A scheduler allocating our `driver`'s devices from `pool` (the node's name), nothing
    /// allocated yet.
    pub fn new(driver: &str, pool: &str, gates: Gates) -> Self {
        Self {
            driver: driver.to_owned(),
            pool: pool.to_owned(),
            gates,
            allocated: BTreeMap::new(),
            next_share: 0,
        }
    }

    /// The gates it runs with.
    pub fn gates(&self) -> Gates {
        self.gates
    }

    /// The devices as the API server stores them: without `DRAConsumableCapacity` it drops
    /// `allowMultipleAllocations` and every capacity's request policy (the capacities stay).
    pub fn stored_devices(&self, published: &[Device]) -> Vec<Device> {
        let mut devices = published.to_vec();
        if !self.gates.consumable_capacity {
            for d in &mut devices {
                d.allow_multiple_allocations = false;
                for c in d.capacities.values_mut() {
                    c.request_policy = None;
                }
            }
        }
        devices
    }

    /// The claim as the API server stores it, and what it dropped (`request cpus: capacity
    /// cpu=4`): without `DRAConsumableCapacity`, every request's `capacity`.
    pub fn stored_claim(&self, spec: &ClaimSpec) -> (ClaimSpec, Vec<String>) {
        let mut stored = spec.clone();
        let mut dropped = Vec::new();
        if !self.gates.consumable_capacity {
            for r in &mut stored.requests {
                if !r.capacity.is_empty() {
                    let asked: Vec<String> =
                        r.capacity.iter().map(|(n, q)| format!("{n}={q}")).collect();
                    dropped.push(format!("request {}: capacity {}", r.name, asked.join(",")));
                    r.capacity.clear();
                }
            }
        }
        (stored, dropped)
    }

    /// Allocates claim `uid` from the devices `published` now, records it, and returns its
    /// results in the order the scheduler writes them (requests in order, devices in published
    /// order). Nothing is recorded when it fails.
    pub fn allocate(
        &mut self,
        uid: &str,
        spec: &ClaimSpec,
        published: &[Device],
    ) -> Result<Vec<AllocationResult>, ScheduleError> {
        if self.allocated.contains_key(uid) {
            return Err(ScheduleError::Invalid(format!(
                "claim {uid} is already allocated; an allocated claim is never allocated again"
            )));
        }
        validate(spec)?;
        let devices = self.stored_devices(published);
        let (spec, _) = self.stored_claim(spec);
        let wanted: u64 = spec.requests.iter().map(|r| u64::from(r.count)).sum();
        if wanted > MAX_RESULTS as u64 {
            return Err(ScheduleError::Unschedulable(format!(
                "the claim asks for {wanted} devices, more than the {MAX_RESULTS} results one claim can hold"
            )));
        }
        let (whole, shared) = self.held();
        let input = search::Input {
            driver: &self.driver,
            devices: &devices,
            consumable: self.gates.consumable_capacity,
            whole: &whole,
            shared: &shared,
            spec: &spec,
        };
        let Some(picks) = search::search(&input) else {
            return Err(ScheduleError::Unschedulable(explain(&input)));
        };
        let results: Vec<AllocationResult> = picks
            .into_iter()
            .map(|p| {
                let share_id = p.consumed.is_some().then(|| {
                    self.next_share += 1;
                    format!("5ca1ab1e-0000-4000-8000-{:012x}", self.next_share)
                });
                AllocationResult {
                    request: spec.requests[p.request].name.clone(),
                    pool: self.pool.clone(),
                    device: devices[p.device].name.clone(),
                    share_id,
                    consumed_capacity: p.consumed.unwrap_or_default(),
                }
            })
            .collect();
        self.allocated.insert(uid.to_owned(), results.clone());
        Ok(results)
    }

    /// Records an allocation made elsewhere (results written by hand, or restored), so that
    /// later allocations account for it. Replaces what `uid` had.
    pub fn record(&mut self, uid: &str, results: Vec<AllocationResult>) {
        self.allocated.insert(uid.to_owned(), results);
    }

    /// Deallocates claim `uid` (the claim was deleted or its pods are gone); returns what it
    /// held.
    pub fn deallocate(&mut self, uid: &str) -> Option<Vec<AllocationResult>> {
        self.allocated.remove(uid)
    }

    /// Every allocated claim's results, by claim UID.
    pub fn allocations(&self) -> &BTreeMap<String, Vec<AllocationResult>> {
        &self.allocated
    }

    /// How much of capacity `name` of `device` the shares allocated from it consume.
    pub fn consumed(&self, device: &str, name: &str) -> Quantity {
        self.held()
            .1
            .get(device)
            .and_then(|c| c.get(name))
            .copied()
            .unwrap_or_default()
    }

    /// Whether `device` is held whole by some claim.
    pub fn held_whole(&self, device: &str) -> bool {
        self.held().0.contains(device)
    }

    /// The allocated state: devices held whole, and capacity consumed from shared devices.
    fn held(&self) -> (BTreeSet<String>, SharedUse) {
        let mut whole = BTreeSet::new();
        let mut shared = SharedUse::new();
        for r in self.allocated.values().flatten() {
            if r.pool != self.pool {
                continue;
            }
            if self.gates.consumable_capacity && r.share_id.is_some() {
                let used = shared.entry(r.device.clone()).or_default();
                for (name, q) in &r.consumed_capacity {
                    let now = used.entry(name.clone()).or_default();
                    *now = Quantity::from_milli(now.milli().saturating_add(q.milli()));
                }
            } else {
                whole.insert(r.device.clone());
            }
        }
        (whole, shared)
    }
}

impl ClaimSpec {
    /// What the API server refuses in a claim, as far as this model goes: no requests, a
    /// request name that is not a unique DNS label, a count of 0, a selector or capacity
    /// without a name, a `matchAttribute` that is not fully qualified or names an unknown
    /// request.
    pub fn validate(&self) -> Result<(), ScheduleError> {
        validate(self)
    }
}

fn validate(spec: &ClaimSpec) -> Result<(), ScheduleError> {
    let invalid = |m: String| Err(ScheduleError::Invalid(m));
    if spec.requests.is_empty() {
        return invalid("the claim has no requests".into());
    }
    let mut names = BTreeSet::new();
    for r in &spec.requests {
        if !is_dns_label(&r.name) {
            return invalid(format!(
                "request name {:?} is not a DNS label (lower-case letters, digits and '-', at most 63)",
                r.name
            ));
        }
        if !names.insert(r.name.as_str()) {
            return invalid(format!("request name {:?} is used twice", r.name));
        }
        if r.count == 0 {
            return invalid(format!("request {}: count must be at least 1", r.name));
        }
        if let Some(s) = r.selectors.iter().find(|s| s.attribute.is_empty()) {
            return invalid(format!(
                "request {}: a selector names no attribute (value {})",
                r.name,
                show_value(&s.value)
            ));
        }
        if r.capacity.keys().any(String::is_empty) {
            return invalid(format!(
                "request {}: a capacity request has no name",
                r.name
            ));
        }
    }
    for c in &spec.constraints {
        let qualified = c
            .match_attribute
            .split_once('/')
            .is_some_and(|(domain, id)| !domain.is_empty() && !id.is_empty());
        if !qualified {
            return invalid(format!(
                "constraint matchAttribute {:?} must be a fully qualified name (domain/name, for example resource.kubernetes.io/numaNode)",
                c.match_attribute
            ));
        }
        if let Some(unknown) = c.requests.iter().find(|r| !names.contains(r.as_str())) {
            return invalid(format!(
                "constraint on {} names request {unknown:?}, which the claim does not have",
                c.match_attribute
            ));
        }
    }
    Ok(())
}

fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// A device's attribute as the allocator looks it up: by the qualified name, or, when the
/// name's domain is the driver's, by the bare identifier the device published. A bare `name`
/// is in the driver's domain.
pub(crate) fn lookup_attribute<'a>(
    device: &'a Device,
    driver: &str,
    name: &str,
) -> Option<&'a AttributeValue> {
    if let Some(v) = device.attributes.get(name) {
        return Some(v);
    }
    match name.split_once('/') {
        Some((domain, id)) if domain == driver => device.attributes.get(id),
        Some(_) => None,
        None => device.attributes.get(&format!("{driver}/{name}")),
    }
}

/// Whether `device` satisfies `request`'s selectors and publishes the capacities it requires.
pub(crate) fn selected(device: &Device, driver: &str, request: &DeviceRequest) -> bool {
    request
        .selectors
        .iter()
        .all(|s| lookup_attribute(device, driver, &s.attribute) == Some(&s.value))
        && request
            .has_capacity
            .iter()
            .all(|c| device.capacities.contains_key(c))
}

/// The requested amounts keyed by the device's capacity names, or `None` when the device lacks
/// a requested capacity (the allocator then skips it). Names match exactly, as in Kubernetes 1.34
/// to 1.36 (later versions also match `<driver>/cpu` to a bare `cpu`); our devices publish bare
/// names, so a claim asks for `cpu`.
pub(crate) fn resolve_capacity(
    device: &Device,
    requested: &BTreeMap<String, Quantity>,
) -> Option<BTreeMap<String, Quantity>> {
    requested
        .iter()
        .map(|(name, amount)| {
            device
                .capacities
                .contains_key(name)
                .then(|| (name.clone(), *amount))
        })
        .collect()
}

/// Whether a taint keeps the scheduler from allocating `device` to a claim that does not
/// tolerate it.
fn tainted(device: &Device) -> bool {
    device
        .taints
        .iter()
        .any(|t| matches!(t.effect, TaintEffect::NoSchedule | TaintEffect::NoExecute))
}

fn show_value(v: &AttributeValue) -> String {
    match v {
        AttributeValue::Int(i) => i.to_string(),
        AttributeValue::Bool(b) => b.to_string(),
        AttributeValue::String(s) | AttributeValue::Version(s) => format!("{s:?}"),
        AttributeValue::Strings(list) => format!("{list:?}"),
        AttributeValue::Ints(list) => format!("{list:?}"),
    }
}

impl fmt::Display for Selector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} == {}", self.attribute, show_value(&self.value))
    }
}

/// Why no allocation exists, request by request: which devices match, which are free, and for
/// the ones that are not, why (held by other claims, not enough capacity left, the request
/// policy's rounding), then the constraints.
fn explain(input: &search::Input<'_>) -> String {
    let mut reasons = Vec::new();
    for request in &input.spec.requests {
        let count = usize::try_from(request.count).unwrap_or(usize::MAX);
        let matching: Vec<&Device> = input
            .devices
            .iter()
            .filter(|d| selected(d, input.driver, request))
            .collect();
        let what = describe_request(request);
        if matching.is_empty() {
            let which = if input.devices.is_empty()
                || (request.selectors.is_empty() && request.has_capacity.is_empty())
            {
                "no device is published".to_owned()
            } else {
                let s: Vec<String> = request
                    .selectors
                    .iter()
                    .map(ToString::to_string)
                    .chain(request.has_capacity.iter().map(|c| format!("capacity {c}")))
                    .collect();
                format!("no published device has {}", s.join(" and "))
            };
            reasons.push(format!("request {} ({what}): {which}", request.name));
            continue;
        }
        let mut free = Vec::new();
        let mut refused: Vec<(String, String)> = Vec::new();
        for d in &matching {
            match why_not(input, request, d) {
                None => free.push(*d),
                Some(why) => refused.push((d.name.clone(), why)),
            }
        }
        if free.len() < count {
            reasons.push(format!(
                "request {} ({what}): {} of the {} matching devices can take it{}",
                request.name,
                free.len(),
                matching.len(),
                summarize(&refused)
            ));
            continue;
        }
        for c in input
            .spec
            .constraints
            .iter()
            .filter(|c| c.requests.is_empty() || c.requests.contains(&request.name))
        {
            let mut by_value: Vec<(String, usize)> = Vec::new();
            for d in &free {
                let Some(v) = lookup_attribute(d, input.driver, &c.match_attribute) else {
                    continue;
                };
                let v = show_value(v);
                match by_value.iter_mut().find(|(x, _)| *x == v) {
                    Some((_, n)) => *n += 1,
                    None => by_value.push((v, 1)),
                }
            }
            // The first value with the most free devices.
            let best = by_value.iter().min_by_key(|(_, n)| std::cmp::Reverse(*n));
            if best.is_none_or(|(_, n)| *n < count) {
                let most = best.map_or_else(
                    || format!("none of its {} free devices has the attribute", free.len()),
                    |(v, n)| {
                        format!(
                            "at most {n} free ones share a value ({} = {v})",
                            c.match_attribute
                        )
                    },
                );
                reasons.push(format!(
                    "request {} ({what}) must have one {} for all its devices: {most}",
                    request.name, c.match_attribute
                ));
            }
        }
    }
    if reasons.is_empty() {
        reasons.push(
            "each request fits alone, but not all of them together with the claim's constraints"
                .into(),
        );
    }
    reasons.join("; ")
}

/// "4 devices", "1 device with cpu=3", "2 devices with socket == 1".
fn describe_request(r: &DeviceRequest) -> String {
    let mut out = if r.count == 1 {
        "1 device".to_owned()
    } else {
        format!("{} devices", r.count)
    };
    let mut with: Vec<String> = r
        .capacity
        .iter()
        .map(|(n, q)| format!("{n}={}", amount(n, *q)))
        .collect();
    // The capacities a device must have are its class's, not the request's: left out.
    with.extend(r.selectors.iter().map(ToString::to_string));
    if !with.is_empty() {
        out.push_str(" with ");
        out.push_str(&with.join(", "));
    }
    out
}

/// An amount of capacity `name` as people read it: CPUs as they are, bytes of memory and
/// hugepages in the largest exact binary unit (`10Gi`, `4Mi`).
fn amount(name: &str, q: Quantity) -> String {
    let bytes = q.units_ceil();
    let binary = name != "cpu"
        && q.milli().is_multiple_of(1000)
        && bytes >= 1024
        && bytes.is_multiple_of(1024);
    if binary {
        crate::topology::page_size_name(bytes)
    } else {
        q.to_string()
    }
}

/// Why `request` alone cannot take `device` now, or `None` when it can.
fn why_not(input: &search::Input<'_>, request: &DeviceRequest, device: &Device) -> Option<String> {
    if input.whole.contains(&device.name) {
        return Some("allocated whole to another claim".into());
    }
    if tainted(device) {
        let keys: Vec<&str> = device.taints.iter().map(|t| t.key.as_str()).collect();
        return Some(format!("tainted ({})", keys.join(", ")));
    }
    if !input.consumable {
        return None;
    }
    let Some(requested) = resolve_capacity(device, &request.capacity) else {
        let names: Vec<&String> = request.capacity.keys().collect();
        return Some(format!("has no capacity {names:?}"));
    };
    for (name, cap) in &device.capacities {
        let asked = requested.get(name).copied();
        let amount = capacity::consumed(asked, cap);
        let shown = self::amount(name, amount);
        let how = match asked {
            None => format!("{shown} by default"),
            Some(a) if a != amount => format!(
                "{} rounded up to {shown} by its request policy",
                self::amount(name, a)
            ),
            Some(_) => shown,
        };
        if capacity::violates(amount, cap.request_policy.as_ref()) {
            return Some(format!("its request policy refuses {name} {how}"));
        }
        let used = input
            .shared
            .get(&device.name)
            .and_then(|c| c.get(name))
            .copied()
            .unwrap_or_default();
        let left = cap.value.milli().saturating_sub(used.milli());
        if amount.milli() > left {
            return Some(format!(
                "{} of its {} {name} left, {how} asked",
                self::amount(name, Quantity::from_milli(left)),
                self::amount(name, cap.value)
            ));
        }
    }
    None
}

/// ": numa0 has ..., numa1 ..." for a few devices; counts of each reason for many.
fn summarize(refused: &[(String, String)]) -> String {
    if refused.is_empty() {
        return String::new();
    }
    if refused.len() <= 4 {
        let each: Vec<String> = refused
            .iter()
            .map(|(d, why)| format!("{d}: {why}"))
            .collect();
        return format!(" ({})", each.join("; "));
    }
    let mut counts: Vec<(&str, usize)> = Vec::new();
    for (_, why) in refused {
        match counts.iter_mut().find(|(w, _)| *w == why) {
            Some((_, n)) => *n += 1,
            None => counts.push((why, 1)),
        }
    }
    let each: Vec<String> = counts.iter().map(|(w, n)| format!("{n} {w}")).collect();
    format!(" ({})", each.join("; "))
}

#[cfg(test)]
mod tests;
