//! ResourceSlice specs on the wire: the three API versions, comparing what we want with what the
//! API server has, and finding fields the API server dropped.
//!
//! We build v1 specs. v1beta2 has the same JSON; v1beta1 nests every device field but `name`
//! under `basic`. The API server rewrites quantities into its canonical form (`4000` becomes
//! `4k`) and silently drops fields whose feature gate is off (say `allowMultipleAllocations`
//! without `DRAConsumableCapacity`), so "the slice is as we want it" means: equal after parsing
//! quantities, ignoring the fields we have seen it drop. Without that, a cluster with a gate off
//! would see us rewrite our slices forever. The node-allocatable mapping goes out in both the
//! forms Kubernetes has defined, of which the API server keeps one ([`allocatable`]).

use std::{collections::BTreeSet, fmt};

use k8s_openapi::{
    api::resource::v1 as wire, apimachinery::pkg::api::resource::Quantity as WireQuantity,
};
use serde_json::Value;

use super::allocatable;
use crate::version::ResourceApiVersion;

/// The spec as `version` writes it, with the node-allocatable mapping in both of its forms
/// ([`allocatable`]).
pub fn to_wire(version: ResourceApiVersion, spec: &wire::ResourceSliceSpec) -> Value {
    // Serializing k8s-openapi types into a Value cannot fail: they are maps, strings and numbers.
    let mut value = serde_json::to_value(spec).unwrap_or(Value::Null);
    for device in devices_mut(&mut value) {
        if let Value::Object(fields) = device {
            allocatable::add_newer_form(fields);
        }
    }
    if version == ResourceApiVersion::V1beta1 {
        for device in devices_mut(&mut value) {
            if let Value::Object(fields) = device {
                let name = fields.remove("name");
                let basic = std::mem::take(fields);
                if let Some(name) = name {
                    fields.insert("name".to_owned(), name);
                }
                fields.insert("basic".to_owned(), Value::Object(basic));
            }
        }
    }
    value
}

/// The spec as v1, from `version`'s JSON; a node-allocatable mapping stored in its 1.37 form
/// only is read as the 1.36 form the typed spec holds.
pub fn from_wire(
    version: ResourceApiVersion,
    mut value: Value,
) -> Result<wire::ResourceSliceSpec, serde_json::Error> {
    for device in devices_mut(&mut value) {
        if let Value::Object(fields) = device {
            if version == ResourceApiVersion::V1beta1
                && let Some(Value::Object(basic)) = fields.remove("basic")
            {
                fields.extend(basic);
            }
            allocatable::add_older_form(fields);
        }
    }
    serde_json::from_value(value)
}

fn devices_mut(spec: &mut Value) -> impl Iterator<Item = &mut Value> {
    spec.get_mut("devices")
        .and_then(Value::as_array_mut)
        .into_iter()
        .flatten()
}

/// The spec with every quantity in our canonical form, so specs compare by amount, not spelling.
/// A quantity we cannot parse is left as it is (and so compares unequal to ours).
pub fn canonical(mut spec: wire::ResourceSliceSpec) -> wire::ResourceSliceSpec {
    fn canon(q: &mut WireQuantity) {
        if let Ok(parsed) = q.0.parse::<policy::Quantity>() {
            q.0 = parsed.to_string();
        }
    }
    for device in spec.devices.iter_mut().flatten() {
        // The API server sets a taint's time when it is missing; which instant a taint was
        // first seen is not worth a rewrite (an agent restarted sees it again later).
        for taint in device.taints.iter_mut().flatten() {
            taint.time_added = None;
        }
        for capacity in device.capacity.iter_mut().flat_map(|c| c.values_mut()) {
            canon(&mut capacity.value);
            if let Some(policy) = &mut capacity.request_policy {
                policy.default.iter_mut().for_each(canon);
                policy.valid_values.iter_mut().flatten().for_each(canon);
                if let Some(range) = &mut policy.valid_range {
                    canon(&mut range.min);
                    range.max.iter_mut().chain(&mut range.step).for_each(canon);
                }
            }
        }
        for mapping in device
            .node_allocatable_resource_mappings
            .iter_mut()
            .flat_map(|m| m.values_mut())
        {
            mapping.allocation_multiplier.iter_mut().for_each(canon);
            // The API server fills in the default, 1, which we leave out.
            if mapping.allocation_multiplier.as_ref().map(|q| q.0.as_str())
                == Some(&policy::Quantity::from_units(1).to_string())
            {
                mapping.allocation_multiplier = None;
            }
        }
    }
    spec
}

/// One step of a path into a spec.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Step {
    /// A field or map key.
    Key(String),
    /// Every element of a list.
    Each,
}

/// A path into a spec, the same for every element of a list (`devices[].allowMultipleAllocations`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FieldPath(pub Vec<Step>);

impl fmt::Display for FieldPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        for step in &self.0 {
            match step {
                Step::Each => f.write_str("[]")?,
                Step::Key(key) if key.contains(['.', '/']) => write!(f, "[{key:?}]")?,
                Step::Key(key) => {
                    if !first {
                        f.write_str(".")?;
                    }
                    f.write_str(key)?;
                }
            }
            first = false;
        }
        Ok(())
    }
}

/// Fields present in `sent` and absent (or null) in `stored`: what the API server dropped.
pub fn dropped_fields(sent: &Value, stored: &Value) -> BTreeSet<FieldPath> {
    let mut dropped = BTreeSet::new();
    walk(sent, Some(stored), &mut Vec::new(), &mut dropped);
    dropped
}

fn walk(sent: &Value, stored: Option<&Value>, path: &mut Vec<Step>, out: &mut BTreeSet<FieldPath>) {
    match (sent, stored) {
        (Value::Null, _) => {}
        (_, None | Some(Value::Null)) => {
            out.insert(FieldPath(path.clone()));
        }
        (Value::Object(sent), Some(Value::Object(stored))) => {
            for (key, value) in sent {
                path.push(Step::Key(key.clone()));
                walk(value, stored.get(key), path, out);
                path.pop();
            }
        }
        (Value::Array(sent), Some(Value::Array(stored))) => {
            path.push(Step::Each);
            for (i, value) in sent.iter().enumerate() {
                walk(value, stored.get(i), path, out);
            }
            path.pop();
        }
        _ => {}
    }
}

/// Removes every field at one of `paths` from `value`.
pub fn strip(value: &mut Value, paths: &BTreeSet<FieldPath>) {
    for path in paths {
        strip_path(value, &path.0);
    }
}

fn strip_path(value: &mut Value, path: &[Step]) {
    match (path, value) {
        ([Step::Key(key)], Value::Object(fields)) => {
            fields.remove(key);
        }
        ([Step::Key(key), rest @ ..], Value::Object(fields)) => {
            if let Some(inner) = fields.get_mut(key) {
                strip_path(inner, rest);
            }
        }
        ([Step::Each, rest @ ..], Value::Array(items)) if !rest.is_empty() => {
            items.iter_mut().for_each(|item| strip_path(item, rest));
        }
        _ => {}
    }
}

/// What a spec looks like for comparison: canonical quantities in `version`'s JSON, without the
/// fields the API server is known to drop, without empty maps and lists.
pub fn comparable(
    version: ResourceApiVersion,
    spec: &wire::ResourceSliceSpec,
    dropped: &BTreeSet<FieldPath>,
) -> Value {
    let mut value = to_wire(version, &canonical(spec.clone()));
    strip(&mut value, dropped);
    prune_empty(&mut value);
    value
}

fn prune_empty(value: &mut Value) {
    match value {
        Value::Object(fields) => {
            fields.values_mut().for_each(prune_empty);
            fields.retain(|_, v| !is_empty(v));
        }
        Value::Array(items) => items.iter_mut().for_each(prune_empty),
        _ => {}
    }
}

fn is_empty(value: &Value) -> bool {
    match value {
        Value::Null => true,
        Value::Object(fields) => fields.is_empty(),
        Value::Array(items) => items.is_empty(),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn spec() -> wire::ResourceSliceSpec {
        serde_json::from_value(json!({
            "driver": "d.io",
            "nodeName": "n",
            "pool": {"name": "n", "generation": 1, "resourceSliceCount": 1},
            "devices": [{
                "name": "numa-0",
                "allowMultipleAllocations": true,
                "attributes": {"resource.kubernetes.io/numaNode": {"int": 0}},
                "capacity": {"cpu": {"value": "4000", "requestPolicy": {"default": "1", "validValues": ["1", "2000m"]}}},
            }],
        }))
        .unwrap()
    }

    #[test]
    fn v1beta1_nests_device_fields_under_basic_and_back() {
        let wire = to_wire(ResourceApiVersion::V1beta1, &spec());
        assert_eq!(wire["devices"][0]["name"], "numa-0");
        assert_eq!(
            wire["devices"][0]["basic"]["allowMultipleAllocations"],
            true
        );
        assert_eq!(
            wire["devices"][0]["basic"]["capacity"]["cpu"]["value"],
            "4000"
        );
        assert_eq!(wire["devices"][0].as_object().unwrap().len(), 2);
        assert_eq!(
            from_wire(ResourceApiVersion::V1beta1, wire).unwrap(),
            spec()
        );
        let v1beta2 = to_wire(ResourceApiVersion::V1beta2, &spec());
        assert_eq!(v1beta2, serde_json::to_value(spec()).unwrap());
        assert_eq!(
            from_wire(ResourceApiVersion::V1beta2, v1beta2).unwrap(),
            spec()
        );
    }

    #[test]
    fn quantities_compare_by_amount() {
        let mut respelled = spec();
        let devices = respelled.devices.as_mut().unwrap();
        let cpu = devices[0]
            .capacity
            .as_mut()
            .unwrap()
            .get_mut("cpu")
            .unwrap();
        cpu.value = WireQuantity("4k".into());
        cpu.request_policy.as_mut().unwrap().valid_values =
            Some(vec![WireQuantity("1000m".into()), WireQuantity("2".into())]);
        let none = BTreeSet::new();
        assert_eq!(
            comparable(ResourceApiVersion::V1, &respelled, &none),
            comparable(ResourceApiVersion::V1, &spec(), &none)
        );
        cpu_value(&mut respelled, "4001");
        assert_ne!(
            comparable(ResourceApiVersion::V1, &respelled, &none),
            comparable(ResourceApiVersion::V1, &spec(), &none)
        );
    }

    fn cpu_value(spec: &mut wire::ResourceSliceSpec, value: &str) {
        spec.devices.as_mut().unwrap()[0]
            .capacity
            .as_mut()
            .unwrap()
            .get_mut("cpu")
            .unwrap()
            .value = WireQuantity(value.into());
    }

    #[test]
    fn finds_dropped_fields_and_ignores_them_when_comparing() {
        let sent = to_wire(ResourceApiVersion::V1, &spec());
        let mut stored = sent.clone();
        let device = stored["devices"][0].as_object_mut().unwrap();
        device.remove("allowMultipleAllocations");
        device["capacity"]["cpu"]
            .as_object_mut()
            .unwrap()
            .remove("requestPolicy");
        let dropped = dropped_fields(&sent, &stored);
        let shown: Vec<String> = dropped.iter().map(ToString::to_string).collect();
        assert_eq!(
            shown,
            [
                "devices[].allowMultipleAllocations",
                "devices[].capacity.cpu.requestPolicy"
            ]
        );

        let stored_spec = from_wire(ResourceApiVersion::V1, stored).unwrap();
        assert_ne!(
            comparable(ResourceApiVersion::V1, &stored_spec, &BTreeSet::new()),
            comparable(ResourceApiVersion::V1, &spec(), &BTreeSet::new())
        );
        assert_eq!(
            comparable(ResourceApiVersion::V1, &stored_spec, &dropped),
            comparable(ResourceApiVersion::V1, &spec(), &dropped)
        );
    }

    #[test]
    fn a_taint_compares_whenever_it_was_added() {
        let taint = |seconds| wire::DeviceTaint {
            key: "d.io/cpus-offline".into(),
            value: Some("3".into()),
            effect: "NoSchedule".into(),
            time_added: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::from_second(seconds).unwrap(),
            )),
        };
        let spec = |t: wire::DeviceTaint| wire::ResourceSliceSpec {
            devices: Some(vec![wire::Device {
                name: "numa0".into(),
                taints: Some(vec![t]),
                ..Default::default()
            }]),
            ..Default::default()
        };
        let none = BTreeSet::new();
        let ours = comparable(ResourceApiVersion::V1, &spec(taint(100)), &none);
        assert_eq!(
            ours,
            comparable(ResourceApiVersion::V1, &spec(taint(200)), &none)
        );
        let mut other = taint(100);
        other.value = Some("4".into());
        assert_ne!(
            ours,
            comparable(ResourceApiVersion::V1, &spec(other), &none)
        );
    }

    #[test]
    fn a_mapping_multiplier_of_one_compares_as_the_default() {
        let mapping = |multiplier: Option<&str>| {
            let mut spec = spec();
            spec.devices.as_mut().unwrap()[0].node_allocatable_resource_mappings = Some(
                [(
                    "cpu".to_owned(),
                    wire::NodeAllocatableResourceMapping {
                        capacity_key: Some("cpu".to_owned()),
                        allocation_multiplier: multiplier.map(|m| WireQuantity(m.to_owned())),
                    },
                )]
                .into(),
            );
            comparable(ResourceApiVersion::V1, &spec, &BTreeSet::new())
        };
        // What we send, and what a 1.36 API server stores for it.
        assert_eq!(mapping(None), mapping(Some("1")));
        assert_eq!(mapping(None), mapping(Some("1000m")));
        assert_ne!(mapping(None), mapping(Some("2")));
    }

    #[test]
    fn paths_with_dots_in_keys_print_quoted() {
        let sent = json!({"attributes": {"resource.kubernetes.io/numaNode": {"int": 0}}});
        let dropped = dropped_fields(&sent, &json!({"attributes": {}}));
        let shown: Vec<String> = dropped.iter().map(ToString::to_string).collect();
        assert_eq!(shown, [r#"attributes["resource.kubernetes.io/numaNode"]"#]);
    }
}
