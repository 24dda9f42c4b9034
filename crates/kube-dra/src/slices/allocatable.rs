//! The node-allocatable mapping (KEP-5517, gate `DRANodeAllocatableResources`) in the two forms
//! Kubernetes has defined, on the wire.
//!
//! - 1.36: `nodeAllocatableResourceMappings: {cpu: {capacityKey?, allocationMultiplier?}}`,
//!   the multiplier defaulting to 1 and multiplying the consumed capacity when `capacityKey` is
//!   set, the number of allocated devices otherwise;
//! - 1.37: `nodeAllocatableResources: {cpu: {mapping: {capacityKey, capacityMultiplier} |
//!   {deviceMultiplier}}}`, every multiplier spelled out (a mapping without one charges
//!   nothing); the 1.36 field is tombstoned.
//!
//! The typed spec we build holds the 1.36 form (k8s-openapi's v1_36 types). Every write sends
//! both ([`add_newer_form`]): an API server keeps the one its release knows and drops the other
//! as unknown, so the agent needs no knowledge of the cluster's version, and a dropped form whose
//! sibling was kept is not a gate being off ([`superseded`]). Reading a slice back, the 1.37
//! form is turned into the 1.36 one ([`add_older_form`]) so that what was stored compares with
//! what we want.

use std::collections::BTreeSet;

use serde_json::{Map, Value};

use super::wire::{FieldPath, Step};

/// The 1.36 field.
pub const OLDER: &str = "nodeAllocatableResourceMappings";
/// The 1.37 field.
pub const NEWER: &str = "nodeAllocatableResources";

/// Adds the 1.37 form of the mapping to a device (a v1 device object) that has the 1.36 one.
pub fn add_newer_form(device: &mut Map<String, Value>) {
    let Some(Value::Object(older)) = device.get(OLDER) else {
        return;
    };
    let newer: Map<String, Value> = older
        .iter()
        .filter_map(|(resource, mapping)| {
            let mapping = mapping.as_object()?;
            let multiplier = mapping
                .get("allocationMultiplier")
                .cloned()
                .unwrap_or_else(|| Value::from("1"));
            let newer = match mapping.get("capacityKey") {
                Some(key) => {
                    serde_json::json!({"capacityKey": key, "capacityMultiplier": multiplier})
                }
                None => serde_json::json!({"deviceMultiplier": multiplier}),
            };
            Some((resource.clone(), serde_json::json!({ "mapping": newer })))
        })
        .collect();
    if !newer.is_empty() {
        device.insert(NEWER.to_owned(), Value::Object(newer));
    }
}

/// Adds the 1.36 form of the mapping to a device the API server stored with the 1.37 form only.
/// Overheads, which the 1.36 form cannot say and we never publish, are left out.
pub fn add_older_form(device: &mut Map<String, Value>) {
    if device.contains_key(OLDER) {
        return;
    }
    let Some(Value::Object(newer)) = device.get(NEWER) else {
        return;
    };
    let older: Map<String, Value> = newer
        .iter()
        .filter_map(|(resource, entry)| {
            let mapping = entry.get("mapping")?.as_object()?;
            let mut older = Map::new();
            let multiplier = match mapping.get("capacityKey") {
                Some(key) => {
                    older.insert("capacityKey".to_owned(), key.clone());
                    mapping.get("capacityMultiplier")
                }
                None => mapping.get("deviceMultiplier"),
            };
            if let Some(m) = multiplier.filter(|m| !is_one(m)) {
                older.insert("allocationMultiplier".to_owned(), m.clone());
            }
            Some((resource.clone(), Value::Object(older)))
        })
        .collect();
    if !older.is_empty() {
        device.insert(OLDER.to_owned(), Value::Object(older));
    }
}

/// Whether a quantity is 1, the 1.36 form's default multiplier, however it is spelled.
fn is_one(quantity: &Value) -> bool {
    quantity
        .as_str()
        .and_then(|q| q.parse::<policy::Quantity>().ok())
        .is_some_and(|q| q == policy::Quantity::from_units(1))
}

/// The fields of `dropped` that are one form of the mapping while the other form, at the same
/// place, was kept: the API server's release knows the other one, and nothing is lost.
pub fn superseded(dropped: &BTreeSet<FieldPath>) -> BTreeSet<FieldPath> {
    let sibling = |path: &FieldPath, from: &str, to: &str| {
        let (last, parent) = path.0.split_last()?;
        (*last == Step::Key(from.to_owned())).then(|| {
            let mut steps = parent.to_vec();
            steps.push(Step::Key(to.to_owned()));
            FieldPath(steps)
        })
    };
    dropped
        .iter()
        .filter(|path| {
            sibling(path, OLDER, NEWER)
                .or_else(|| sibling(path, NEWER, OLDER))
                .is_some_and(|other| !dropped.contains(&other))
        })
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn object(value: Value) -> Map<String, Value> {
        value.as_object().unwrap().clone()
    }

    #[test]
    fn the_newer_form_spells_out_every_multiplier() {
        let mut shared = object(json!({"name": "numa0", OLDER: {"cpu": {"capacityKey": "cpu"}}}));
        add_newer_form(&mut shared);
        assert_eq!(
            shared[NEWER],
            json!({"cpu": {"mapping": {"capacityKey": "cpu", "capacityMultiplier": "1"}}})
        );
        let mut exclusive = object(json!({OLDER: {"cpu": {"allocationMultiplier": "16"}}}));
        add_newer_form(&mut exclusive);
        assert_eq!(
            exclusive[NEWER],
            json!({"cpu": {"mapping": {"deviceMultiplier": "16"}}})
        );
        // A 1.37 mapping without a multiplier would charge the node nothing.
        let mut one_cpu = object(json!({OLDER: {"cpu": {}}}));
        add_newer_form(&mut one_cpu);
        assert_eq!(
            one_cpu[NEWER],
            json!({"cpu": {"mapping": {"deviceMultiplier": "1"}}})
        );
        let mut none = object(json!({"name": "numa0"}));
        add_newer_form(&mut none);
        assert_eq!(Value::Object(none), json!({"name": "numa0"}));
    }

    #[test]
    fn a_device_stored_in_the_newer_form_reads_as_what_we_sent() {
        for sent in [
            json!({"cpu": {"capacityKey": "cpu"}}),
            json!({"cpu": {"capacityKey": "cpu", "allocationMultiplier": "2"}}),
            json!({"cpu": {"allocationMultiplier": "16"}}),
            json!({"cpu": {}}),
        ] {
            let mut device = object(json!({ OLDER: sent }));
            add_newer_form(&mut device);
            // What a 1.37 API server stores: the newer form only.
            device.remove(OLDER);
            add_older_form(&mut device);
            assert_eq!(device[OLDER], sent);
        }
        // A respelled one (the API server's canonical quantities) is still a multiplier of 1.
        let mut respelled = object(
            json!({NEWER: {"cpu": {"mapping": {"capacityKey": "cpu", "capacityMultiplier": "1000m"}}}}),
        );
        add_older_form(&mut respelled);
        assert_eq!(respelled[OLDER], json!({"cpu": {"capacityKey": "cpu"}}));
        // Overheads have no older form.
        let mut overhead = object(json!({NEWER: {"memory": {"overhead": {"perPod": "1Gi"}}}}));
        add_older_form(&mut overhead);
        assert!(!overhead.contains_key(OLDER));
        // Both present: the older one stands.
        let mut both = object(
            json!({OLDER: {"cpu": {}}, NEWER: {"cpu": {"mapping": {"deviceMultiplier": "4"}}}}),
        );
        add_older_form(&mut both);
        assert_eq!(both[OLDER], json!({"cpu": {}}));
    }

    #[test]
    fn a_form_is_superseded_only_while_its_sibling_is_kept() {
        let path = |steps: &[&str]| {
            FieldPath(
                steps
                    .iter()
                    .map(|s| match *s {
                        "[]" => Step::Each,
                        key => Step::Key(key.to_owned()),
                    })
                    .collect(),
            )
        };
        let older = path(&["devices", "[]", OLDER]);
        let newer = path(&["devices", "[]", NEWER]);
        let basic_older = path(&["devices", "[]", "basic", OLDER]);
        let other = path(&["devices", "[]", "allowMultipleAllocations"]);
        // A 1.37 server drops the older form, a 1.36 one the newer; v1beta1 nests it.
        for (dropped, want) in [
            (vec![older.clone()], vec![older.clone()]),
            (vec![newer.clone()], vec![newer.clone()]),
            (vec![basic_older.clone()], vec![basic_older.clone()]),
            // The gate off: both go, and neither is superseded.
            (vec![older.clone(), newer.clone()], vec![]),
            (vec![other.clone(), newer.clone()], vec![newer.clone()]),
            (vec![other], vec![]),
        ] {
            let dropped: BTreeSet<FieldPath> = dropped.into_iter().collect();
            let want: BTreeSet<FieldPath> = want.into_iter().collect();
            assert_eq!(superseded(&dropped), want, "{dropped:?}");
        }
    }
}
