//! The allocator's search: the first combination of free devices, in published order, that
//! satisfies every request of a claim, its selectors, capacities and constraints.
//!
//! Like kube-scheduler's structured allocator, it walks requests in order and, for each device a
//! request needs, tries the published devices in order, recursing to the next one and
//! backtracking when a later one cannot be found. Within one request devices are taken in
//! increasing position (combinations, not permutations). The first full solution wins.
//!
//! One addition keeps it fast without changing its answer: before trying devices for a request,
//! it counts the devices from the current position on that could still be taken (free, selected,
//! with room, matching the constraints' values so far). When fewer remain than the request still
//! needs, no combination below can succeed, so the branch is cut where the exhaustive search
//! would have tried every subset in vain (2^30 of them for a 32-CPU request on a node with 30
//! free CPUs in one NUMA node).

use std::collections::{BTreeMap, BTreeSet};

use super::{ClaimSpec, capacity, lookup_attribute, resolve_capacity};
use crate::{
    model::{AttributeValue, Device},
    quantity::Quantity,
};

/// What the search starts from.
pub(super) struct Input<'a> {
    pub driver: &'a str,
    /// The devices as the API server stored them.
    pub devices: &'a [Device],
    /// Whether consumable capacity is on (capacities are checked and consumed).
    pub consumable: bool,
    /// Devices other claims hold whole.
    pub whole: &'a BTreeSet<String>,
    /// Capacity other claims consumed from shared devices, by device and capacity name.
    pub shared: &'a super::SharedUse,
    /// The claim, as the API server stored it.
    pub spec: &'a ClaimSpec,
}

/// One device the search picked for a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Pick {
    /// Index of the request in the claim.
    pub request: usize,
    /// Index of the device in [`Input::devices`].
    pub device: usize,
    /// What it consumes, for a device that allows multiple allocations; `None` for a device
    /// taken whole.
    pub consumed: Option<BTreeMap<String, Quantity>>,
}

/// A constraint's state while searching: after each device it applies to, the values all
/// devices so far share (the top is the current one; empty before the first device).
#[derive(Debug, Clone, Default)]
struct Fixed {
    shared: Vec<ValueSet>,
}

/// An attribute's values as kube-scheduler compares them under `matchAttribute` (with
/// `DRAListTypeAttributes`; without it the API server keeps no lists, and one-element sets
/// compare as the scalars do): a list is the set of its elements, a scalar a one-element set,
/// and values of different types never match. Devices match when the sets of all of them
/// intersect.
#[derive(Debug, Clone, PartialEq, Eq)]
enum ValueSet {
    Ints(BTreeSet<i64>),
    Bools(BTreeSet<bool>),
    Strings(BTreeSet<String>),
    Versions(BTreeSet<String>),
}

impl ValueSet {
    fn of(value: &AttributeValue) -> Self {
        match value {
            AttributeValue::Int(i) => Self::Ints(BTreeSet::from([*i])),
            AttributeValue::Bool(b) => Self::Bools(BTreeSet::from([*b])),
            AttributeValue::String(s) => Self::Strings(BTreeSet::from([s.clone()])),
            AttributeValue::Version(v) => Self::Versions(BTreeSet::from([v.clone()])),
            AttributeValue::Strings(list) => Self::Strings(list.iter().cloned().collect()),
            AttributeValue::Ints(list) => Self::Ints(list.iter().copied().collect()),
        }
    }

    /// The values both hold; `None` when they share none (or differ in type).
    fn intersect(&self, other: &Self) -> Option<Self> {
        fn common<T: Ord + Clone>(a: &BTreeSet<T>, b: &BTreeSet<T>) -> Option<BTreeSet<T>> {
            let both: BTreeSet<T> = a.intersection(b).cloned().collect();
            (!both.is_empty()).then_some(both)
        }
        match (self, other) {
            (Self::Ints(a), Self::Ints(b)) => common(a, b).map(Self::Ints),
            (Self::Bools(a), Self::Bools(b)) => common(a, b).map(Self::Bools),
            (Self::Strings(a), Self::Strings(b)) => common(a, b).map(Self::Strings),
            (Self::Versions(a), Self::Versions(b)) => common(a, b).map(Self::Versions),
            _ => None,
        }
    }
}

struct Search<'a> {
    input: &'a Input<'a>,
    /// Devices this claim takes whole.
    taking: BTreeSet<usize>,
    /// Capacity this claim consumes so far, by device index and capacity name.
    allocating: BTreeMap<usize, BTreeMap<String, Quantity>>,
    fixed: Vec<Fixed>,
    picks: Vec<Pick>,
}

/// The first solution, or `None` when there is none.
pub(super) fn search(input: &Input<'_>) -> Option<Vec<Pick>> {
    let mut s = Search {
        input,
        taking: BTreeSet::new(),
        allocating: BTreeMap::new(),
        fixed: vec![Fixed::default(); input.spec.constraints.len()],
        picks: Vec::new(),
    };
    s.step(0, 0, 0).then_some(s.picks)
}

impl Search<'_> {
    /// Finds device `nth` of request `req` at position `start` or later, then the rest.
    fn step(&mut self, req: usize, nth: usize, start: usize) -> bool {
        let Some(request) = self.input.spec.requests.get(req) else {
            return true;
        };
        let count = usize::try_from(request.count).unwrap_or(usize::MAX);
        if nth >= count {
            return self.step(req + 1, 0, 0);
        }
        let need = count - nth;
        let available = (start..self.input.devices.len())
            .filter(|&d| self.fits(req, d).is_some() && self.constraints_allow(req, d))
            .take(need)
            .count();
        if available < need {
            return false;
        }
        for d in start..self.input.devices.len() {
            let Some(consumed) = self.fits(req, d) else {
                continue;
            };
            if !self.constraints_allow(req, d) {
                continue;
            }
            self.take(req, d, consumed);
            if self.step(req, nth + 1, d + 1) {
                return true;
            }
            self.untake(req, d);
        }
        false
    }

    /// Whether request `req` may take device `d` now, and what it would consume: `Some(None)`
    /// takes it whole, `Some(Some(amounts))` shares it.
    fn fits(&self, req: usize, d: usize) -> Option<Option<BTreeMap<String, Quantity>>> {
        let device = &self.input.devices[d];
        let request = &self.input.spec.requests[req];
        if self.input.whole.contains(&device.name) || self.taking.contains(&d) {
            return None;
        }
        if !super::selected(device, self.input.driver, request) || super::tainted(device) {
            return None;
        }
        if !self.input.consumable {
            return Some(None);
        }
        let requested = resolve_capacity(device, &request.capacity)?;
        let mut amounts = BTreeMap::new();
        for (name, cap) in &device.capacities {
            let amount = capacity::consumed(requested.get(name).copied(), cap);
            if capacity::violates(amount, cap.request_policy.as_ref()) {
                return None;
            }
            let others = self
                .input
                .shared
                .get(&device.name)
                .and_then(|c| c.get(name))
                .map_or(0, |q| q.milli());
            let ours = self
                .allocating
                .get(&d)
                .and_then(|c| c.get(name))
                .map_or(0, |q| q.milli());
            let total = others.saturating_add(ours).saturating_add(amount.milli());
            if total > cap.value.milli() {
                return None;
            }
            amounts.insert(name.clone(), amount);
        }
        Some(device.allow_multiple_allocations.then_some(amounts))
    }

    /// The constraints that apply to request `req`, by index.
    fn constraints_of(&self, req: usize) -> impl Iterator<Item = usize> + '_ {
        let name = &self.input.spec.requests[req].name;
        self.input
            .spec
            .constraints
            .iter()
            .enumerate()
            .filter(move |(_, c)| c.requests.is_empty() || c.requests.contains(name))
            .map(|(i, _)| i)
    }

    /// The values constraint `c` would share with device `d` taken: `None` when `d` lacks the
    /// attribute or shares no value with the devices taken so far ([`ValueSet`]).
    fn shared_with(&self, c: usize, d: usize) -> Option<ValueSet> {
        let attribute = &self.input.spec.constraints[c].match_attribute;
        let values = ValueSet::of(lookup_attribute(
            &self.input.devices[d],
            self.input.driver,
            attribute,
        )?);
        match self.fixed[c].shared.last() {
            None => Some(values),
            Some(shared) => shared.intersect(&values),
        }
    }

    /// Whether device `d` has every constrained attribute of request `req`, with a value in
    /// common with the devices taken so far.
    fn constraints_allow(&self, req: usize, d: usize) -> bool {
        self.constraints_of(req)
            .all(|c| self.shared_with(c, d).is_some())
    }

    fn take(&mut self, req: usize, d: usize, consumed: Option<BTreeMap<String, Quantity>>) {
        let constraints: Vec<usize> = self.constraints_of(req).collect();
        for c in constraints {
            // constraints_allow held, so there is a shared value; an empty set (matching
            // nothing) would keep the stack in step with the picks all the same.
            let shared = self
                .shared_with(c, d)
                .unwrap_or_else(|| ValueSet::Ints(BTreeSet::new()));
            self.fixed[c].shared.push(shared);
        }
        match &consumed {
            None => {
                self.taking.insert(d);
            }
            Some(amounts) => {
                let ours = self.allocating.entry(d).or_default();
                for (name, amount) in amounts {
                    let now = ours.entry(name.clone()).or_default();
                    *now = Quantity::from_milli(now.milli().saturating_add(amount.milli()));
                }
            }
        }
        self.picks.push(Pick {
            request: req,
            device: d,
            consumed,
        });
    }

    fn untake(&mut self, req: usize, d: usize) {
        let Some(pick) = self.picks.pop() else {
            return;
        };
        debug_assert_eq!((pick.request, pick.device), (req, d));
        let constraints: Vec<usize> = self.constraints_of(req).collect();
        for c in constraints {
            self.fixed[c].shared.pop();
        }
        match pick.consumed {
            None => {
                self.taking.remove(&d);
            }
            Some(amounts) => {
                if let Some(ours) = self.allocating.get_mut(&d) {
                    for (name, amount) in amounts {
                        if let Some(now) = ours.get_mut(&name) {
                            *now = Quantity::from_milli(now.milli().saturating_sub(amount.milli()));
                        }
                    }
                    ours.retain(|_, q| q.milli() > 0);
                    if ours.is_empty() {
                        self.allocating.remove(&d);
                    }
                }
            }
        }
    }
}
