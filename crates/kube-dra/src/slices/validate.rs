//! The API server's ResourceSlice rules, checked before the API server sees our devices.
//!
//! A slice the API server refuses leaves the node without published devices and the reason in a
//! log line far from its cause. Checking here names the device and the field instead. The
//! limits are those of `resource.k8s.io/v1` (Kubernetes 1.34-1.36); v1beta1 and v1beta2 have
//! the same ones.

use std::collections::BTreeSet;

use kubelet_plugin::names::{dns_label, dns_subdomain};
use policy::{AttributeValue, Capacity, Device, Quantity, RequestPolicy, ValidValues};

/// Attributes and capacities together, per device.
pub const MAX_ATTRIBUTES_AND_CAPACITIES: usize = 32;
/// Characters of a string or version attribute value.
pub const MAX_ATTRIBUTE_VALUE_LEN: usize = 64;
/// Characters of the domain of a qualified name.
pub const MAX_DOMAIN_LEN: usize = 63;
/// Characters of the identifier of a qualified name.
pub const MAX_ID_LEN: usize = 32;
/// Attribute values per device, each entry of a list attribute counted (the API server's
/// `ResourceSliceMaxAttributeValuesPerDevice`, 1.36 and 1.37).
pub const MAX_ATTRIBUTE_VALUES: usize = 48;
/// Entries of a request policy's valid values.
pub const MAX_VALID_VALUES: usize = 10;
/// Taints per device (`DeviceTaintsMaxLength`).
pub const MAX_TAINTS: usize = 16;

/// A device the API server would refuse, naming the device and the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("device {device:?}: {field}: {reason}")]
pub struct DeviceValidationError {
    /// The device's name as the policy gave it.
    pub device: String,
    /// The offending field (`name`, `attributes[numaNode]`, `capacity[cpu].requestPolicy`).
    pub field: String,
    /// What is wrong with it.
    pub reason: String,
}

/// Checks every device and that their names are unique. `driver` is the domain bare names
/// belong to.
pub fn validate_devices(driver: &str, devices: &[Device]) -> Result<(), DeviceValidationError> {
    let mut names = BTreeSet::new();
    for device in devices {
        validate_device(driver, device)?;
        if !names.insert(device.name.as_str()) {
            return Err(error(device, "name", "used by another device".to_owned()));
        }
    }
    Ok(())
}

/// Checks one device.
pub fn validate_device(driver: &str, device: &Device) -> Result<(), DeviceValidationError> {
    dns_label(&device.name).map_err(|e| error(device, "name", e.to_string()))?;
    let count = device.attributes.len() + device.capacities.len();
    if count > MAX_ATTRIBUTES_AND_CAPACITIES {
        return Err(error(
            device,
            "attributes",
            format!(
                "{count} attributes and capacities, at most {MAX_ATTRIBUTES_AND_CAPACITIES} allowed"
            ),
        ));
    }
    let values: usize = device
        .attributes
        .values()
        .map(|v| match v {
            AttributeValue::Strings(list) => list.len().max(1),
            AttributeValue::Ints(list) => list.len().max(1),
            _ => 1,
        })
        .sum();
    if values > MAX_ATTRIBUTE_VALUES {
        return Err(error(
            device,
            "attributes",
            format!(
                "{values} attribute values (each entry of a list counted), at most {MAX_ATTRIBUTE_VALUES} allowed"
            ),
        ));
    }
    // Field names are only spelled out for an error: a 1,024-CPU node has 10,000 attributes.
    let mut qualified = BTreeSet::new();
    for (name, value) in &device.attributes {
        let field = || format!("attributes[{name}]");
        qualified_name(name).map_err(|reason| error(device, &field(), reason))?;
        if !qualified.insert(fully_qualified(driver, name)) {
            return Err(error(
                device,
                &field(),
                "names the same attribute as another one".to_owned(),
            ));
        }
        attribute_value(value).map_err(|reason| error(device, &field(), reason))?;
    }
    if device.taints.len() > MAX_TAINTS {
        return Err(error(
            device,
            "taints",
            format!(
                "{} taints, at most {MAX_TAINTS} allowed",
                device.taints.len()
            ),
        ));
    }
    for (i, taint) in device.taints.iter().enumerate() {
        taint_fields(&taint.key, &taint.value)
            .map_err(|reason| error(device, &format!("taints[{i}]"), reason))?;
    }
    let mut qualified = BTreeSet::new();
    for (name, capacity) in &device.capacities {
        let field = || format!("capacity[{name}]");
        qualified_name(name).map_err(|reason| error(device, &field(), reason))?;
        if !qualified.insert(fully_qualified(driver, name)) {
            return Err(error(
                device,
                &field(),
                "names the same capacity as another one".to_owned(),
            ));
        }
        if let Some(policy) = &capacity.request_policy {
            let field = || format!("{}.requestPolicy", field());
            if !device.allow_multiple_allocations {
                return Err(error(
                    device,
                    &field(),
                    "only devices that allow multiple allocations may have a request policy"
                        .to_owned(),
                ));
            }
            request_policy(capacity, policy).map_err(|reason| error(device, &field(), reason))?;
        }
    }
    Ok(())
}

/// A v1 slice spec the API server would refuse, naming the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("resource slice: {field}: {reason}")]
pub struct SliceValidationError {
    /// The offending field (`devices[3].attributes[numaNode]`).
    pub field: String,
    /// What is wrong with it.
    pub reason: String,
}

/// Checks a v1 slice spec as the API server does, for what we publish: one node, at most 128
/// devices with valid, unique names, qualified attribute and capacity names, one value per
/// attribute, and request policies only on devices that allow multiple allocations. Used to check
/// what actually went over the wire.
pub fn validate_slice_spec(
    spec: &k8s_openapi::api::resource::v1::ResourceSliceSpec,
) -> Result<(), SliceValidationError> {
    let error = |field: String, reason: String| SliceValidationError { field, reason };
    dns_subdomain(&spec.driver, 63).map_err(|e| error("driver".into(), e.to_string()))?;
    if spec.pool.name.is_empty() || spec.pool.name.len() > 253 {
        return Err(error(
            "pool.name".into(),
            "must be 1 to 253 characters".into(),
        ));
    }
    if spec.pool.generation < 0 || spec.pool.resource_slice_count <= 0 {
        return Err(error(
            "pool".into(),
            "generation must be >= 0 and resourceSliceCount > 0".into(),
        ));
    }
    match &spec.node_name {
        Some(node) => {
            dns_subdomain(node, 253).map_err(|e| error("nodeName".into(), e.to_string()))?
        }
        None => {
            return Err(error(
                "nodeName".into(),
                "required for a node-local pool".into(),
            ));
        }
    }
    let devices = spec.devices.as_deref().unwrap_or_default();
    let tainted = devices
        .iter()
        .any(|d| d.taints.as_ref().is_some_and(|t| !t.is_empty()));
    let max = if tainted {
        crate::slices::build::MAX_TAINTED_DEVICES_PER_SLICE
    } else {
        crate::slices::build::MAX_DEVICES_PER_SLICE
    };
    if devices.len() > max {
        return Err(error(
            "devices".into(),
            format!(
                "{} devices, at most {max} allowed{}",
                devices.len(),
                if tainted {
                    " when a device has taints"
                } else {
                    ""
                }
            ),
        ));
    }
    let mut names = BTreeSet::new();
    for (i, device) in devices.iter().enumerate() {
        let at = |field: &str| format!("devices[{i}].{field}");
        dns_label(&device.name).map_err(|e| error(at("name"), e.to_string()))?;
        if !names.insert(device.name.as_str()) {
            return Err(error(at("name"), "duplicate".into()));
        }
        let attributes = device.attributes.as_ref().map_or(0, |a| a.len());
        let capacities = device.capacity.as_ref().map_or(0, |c| c.len());
        if attributes + capacities > MAX_ATTRIBUTES_AND_CAPACITIES {
            return Err(error(
                at("attributes"),
                "more than 32 attributes and capacities".into(),
            ));
        }
        for (name, value) in device.attributes.iter().flatten() {
            let field = || at(&format!("attributes[{name}]"));
            qualified_name(name).map_err(|r| error(field(), r))?;
            let set = [
                value.int.is_some(),
                value.bool.is_some(),
                value.string.is_some(),
                value.version.is_some(),
                value.ints.is_some(),
                value.bools.is_some(),
                value.strings.is_some(),
                value.versions.is_some(),
            ];
            if set.iter().filter(|s| **s).count() != 1 {
                return Err(error(field(), "exactly one value must be specified".into()));
            }
            for s in value.string.iter().chain(&value.version) {
                max_len(s, MAX_ATTRIBUTE_VALUE_LEN).map_err(|r| error(field(), r))?;
            }
            if let Some(list) = &value.strings {
                string_list(list).map_err(|r| error(field(), r))?;
            }
        }
        let taints = device.taints.as_deref().unwrap_or_default();
        if taints.len() > MAX_TAINTS {
            return Err(error(
                at("taints"),
                format!("{} taints, at most {MAX_TAINTS} allowed", taints.len()),
            ));
        }
        for (t, taint) in taints.iter().enumerate() {
            taint_fields(&taint.key, taint.value.as_deref().unwrap_or_default())
                .map_err(|r| error(at(&format!("taints[{t}]")), r))?;
            if !["NoSchedule", "NoExecute", "None"].contains(&taint.effect.as_str()) {
                return Err(error(
                    at(&format!("taints[{t}].effect")),
                    format!(
                        "{:?} is not one of NoSchedule, NoExecute, None",
                        taint.effect
                    ),
                ));
            }
        }
        for (name, capacity) in device.capacity.iter().flatten() {
            let field = || at(&format!("capacity[{name}]"));
            qualified_name(name).map_err(|r| error(field(), r))?;
            if capacity.request_policy.is_some() && device.allow_multiple_allocations != Some(true)
            {
                return Err(error(
                    field(),
                    "a request policy needs allowMultipleAllocations".into(),
                ));
            }
        }
    }
    Ok(())
}

fn error(device: &Device, field: &str, reason: String) -> DeviceValidationError {
    DeviceValidationError {
        device: device.name.clone(),
        field: field.to_owned(),
        reason,
    }
}

/// A name as the API server compares it, as (domain, name): a bare name belongs to the
/// driver's domain.
fn fully_qualified<'a>(driver: &'a str, name: &'a str) -> (&'a str, &'a str) {
    name.split_once('/').unwrap_or((driver, name))
}

/// A taint's key is a label name, its value a label value.
fn taint_fields(key: &str, value: &str) -> Result<(), String> {
    let name = match key.split_once('/') {
        Some((prefix, name)) => {
            dns_subdomain(prefix, 253).map_err(|reason| format!("key {key:?}: {reason}"))?;
            name
        }
        None => key,
    };
    if name.is_empty() {
        return Err(format!("key {key:?}: the name after the prefix is empty"));
    }
    label_value(name).map_err(|reason| format!("key {key:?}: {reason}"))?;
    label_value(value).map_err(|reason| format!("value {value:?}: {reason}"))
}

/// A label value (or the name part of a label name): at most 63 characters, alphanumerics,
/// `-`, `_` and `.`, beginning and ending with an alphanumeric; empty is allowed.
fn label_value(s: &str) -> Result<(), String> {
    if s.len() > 63 {
        return Err(format!("{} characters, at most 63 allowed", s.len()));
    }
    let ok = s.is_empty()
        || (s
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
            && s.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
            && s.bytes().last().is_some_and(|b| b.is_ascii_alphanumeric()));
    if ok {
        Ok(())
    } else {
        Err(
            "must be alphanumerics, '-', '_' or '.', beginning and ending with an alphanumeric"
                .to_owned(),
        )
    }
}

fn attribute_value(value: &AttributeValue) -> Result<(), String> {
    match value {
        AttributeValue::Int(_) | AttributeValue::Bool(_) => Ok(()),
        AttributeValue::Ints(list) if list.is_empty() => {
            Err("a list of ints must not be empty".to_owned())
        }
        AttributeValue::Ints(_) => Ok(()),
        AttributeValue::String(s) => max_len(s, MAX_ATTRIBUTE_VALUE_LEN),
        AttributeValue::Strings(list) => string_list(list),
        AttributeValue::Version(v) => {
            max_len(v, MAX_ATTRIBUTE_VALUE_LEN)?;
            semver::Version::parse(v)
                .map(|_| ())
                .map_err(|e| format!("{v:?} is not a semantic version: {e}"))
        }
    }
}

/// A list attribute's strings, as the API server checks them: at least one, each at most 64
/// bytes (`maxBytes`, not characters).
fn string_list(list: &[String]) -> Result<(), String> {
    if list.is_empty() {
        return Err("a list of strings must not be empty".to_owned());
    }
    for (i, s) in list.iter().enumerate() {
        if s.len() > MAX_ATTRIBUTE_VALUE_LEN {
            return Err(format!(
                "strings[{i}]: {} bytes, at most {MAX_ATTRIBUTE_VALUE_LEN} allowed",
                s.len()
            ));
        }
    }
    Ok(())
}

fn max_len(s: &str, max: usize) -> Result<(), String> {
    let len = s.chars().count();
    if len > max {
        Err(format!("{len} characters, at most {max} allowed"))
    } else {
        Ok(())
    }
}

/// The request policy rules the API server applies (see `CapacityRequestPolicy`).
fn request_policy(capacity: &Capacity, policy: &RequestPolicy) -> Result<(), String> {
    let total = capacity.value;
    let default = policy.default.ok_or_else(|| {
        "a request policy with valid values or a range needs a default".to_owned()
    })?;
    if default > total {
        return Err(format!("default {default} exceeds the capacity {total}"));
    }
    match &policy.valid {
        ValidValues::Values(values) => {
            if values.is_empty() || values.len() > MAX_VALID_VALUES {
                return Err(format!(
                    "{} valid values, between 1 and {MAX_VALID_VALUES} allowed",
                    values.len()
                ));
            }
            if values.windows(2).any(|w| w[0] >= w[1]) {
                return Err("valid values must be sorted ascending and unique".to_owned());
            }
            if let Some(big) = values.iter().find(|v| **v > total) {
                return Err(format!("valid value {big} exceeds the capacity {total}"));
            }
            if !values.contains(&default) {
                return Err(format!("default {default} is not one of the valid values"));
            }
        }
        ValidValues::Range { min, max, step } => {
            if *min > total {
                return Err(format!("range min {min} exceeds the capacity {total}"));
            }
            if default < *min {
                return Err(format!("default {default} is below the range min {min}"));
            }
            if let Some(max) = max
                && (*max > total || *max < *min || default > *max)
            {
                return Err(format!(
                    "range max {max} must lie between min {min} and the capacity {total}, and not below the default {default}"
                ));
            }
            if let Some(step) = step {
                multiple_of(default, *step, "default")?;
                if let Some(max) = max {
                    multiple_of(*max, *step, "range max")?;
                }
                if min.milli().saturating_add(step.milli()) > total.milli() {
                    return Err(format!(
                        "range min {min} plus step {step} exceeds the capacity {total}"
                    ));
                }
            }
        }
    }
    Ok(())
}

fn multiple_of(value: Quantity, step: Quantity, what: &str) -> Result<(), String> {
    if step.milli() == 0 {
        return Err("range step must be positive".to_owned());
    }
    if !value.milli().is_multiple_of(step.milli()) {
        return Err(format!(
            "{what} {value} is not a multiple of the step {step}"
        ));
    }
    Ok(())
}

/// A qualified name of an attribute or capacity: `domain/id` or a bare `id`, where the domain is
/// a DNS subdomain of at most 63 characters and the id a C identifier of at most 32.
pub fn qualified_name(name: &str) -> Result<(), String> {
    let id = match name.split_once('/') {
        Some((domain, id)) => {
            dns_subdomain(domain, MAX_DOMAIN_LEN)
                .map_err(|reason| format!("domain of {name:?}: {reason}"))?;
            id
        }
        None => name,
    };
    let c_identifier = id
        .bytes()
        .next()
        .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
        && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
    if !c_identifier || id.len() > MAX_ID_LEN {
        return Err(format!(
            "{name:?}: {id:?} is not a C identifier of at most {MAX_ID_LEN} characters"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn device(name: &str) -> Device {
        Device {
            name: name.to_owned(),
            attributes: BTreeMap::new(),
            capacities: BTreeMap::new(),
            allow_multiple_allocations: false,
            taints: Vec::new(),
        }
    }

    fn q(s: &str) -> Quantity {
        s.parse().unwrap()
    }

    fn capacity(value: &str, policy: Option<RequestPolicy>) -> Capacity {
        Capacity {
            value: q(value),
            request_policy: policy,
        }
    }

    fn field_of(result: Result<(), DeviceValidationError>) -> String {
        result.unwrap_err().field
    }

    /// What the topology-aware policy publishes passes on every machine shape and device model,
    /// down to a 2-CPU VM with one CPU reserved (one claimable CPU: its request policy once
    /// asked for a step past the capacity, and the node published nothing) and a 1-CPU one
    /// (nothing claimable: no device, which publishes an empty pool).
    #[test]
    fn the_topology_aware_policys_devices_pass_on_every_machine_and_model() {
        use policy::{
            Policy, Topology, TopologyAware, TopologySource,
            topology_aware::{Config, DeviceMode, DeviceModel, Granularity, GroupBy},
        };
        let shapes = [
            "pack:1 core:1 pu:1",
            "pack:1 core:2 pu:1",
            "pack:1 core:1 pu:2",
            "pack:1 numa:2 core:4 pu:2",
            "pack:2 numa:2 l3:2 core:8 pu:2",
        ];
        for shape in shapes {
            let mut topo = Topology::load(&TopologySource::Synthetic(shape.into())).unwrap();
            topo.pcie_roots = vec![policy::topology::PcieRoot {
                name: "pci0000:00".into(),
                cpus: topo.online.clone(),
                numa_node: None,
            }];
            for mode in [DeviceMode::Grouped, DeviceMode::Individual] {
                for group_by in [GroupBy::Numa, GroupBy::Socket] {
                    for granularity in [Granularity::Cpu, Granularity::Core] {
                        let config = Config {
                            devices: DeviceModel {
                                mode,
                                group_by,
                                granularity,
                                pcie_roots: true,
                            },
                            ..Config::default()
                        };
                        let p = TopologyAware::new(topo.clone(), config).unwrap();
                        let devices = p.devices().unwrap();
                        let at = format!("{shape} {mode:?} {group_by:?} {granularity:?}");
                        validate_devices("topology-aware.resmgr.io", &devices)
                            .unwrap_or_else(|e| panic!("{at}: {e}"));
                        let claimable = u64::try_from(topo.online.len()).unwrap() - 1;
                        let published: u64 = devices
                            .iter()
                            .map(|d| d.capacities["cpu"].value.units_ceil())
                            .sum();
                        if granularity == Granularity::Cpu {
                            assert_eq!(published, claimable, "{at}");
                        }
                        if shape == "pack:1 core:1 pu:1" {
                            assert!(devices.is_empty(), "{at}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn accepts_a_typical_cpu_device() {
        let mut d = device("numa-0");
        d.allow_multiple_allocations = true;
        d.attributes.insert(
            "resource.kubernetes.io/numaNode".into(),
            AttributeValue::Int(0),
        );
        d.attributes
            .insert("smtEnabled".into(), AttributeValue::Bool(true));
        d.attributes.insert(
            "driverVersion".into(),
            AttributeValue::Version("1.2.3-rc.1".into()),
        );
        d.capacities.insert(
            "cpu".into(),
            capacity(
                "16",
                Some(RequestPolicy {
                    default: Some(q("1")),
                    valid: ValidValues::Range {
                        min: q("1"),
                        max: Some(q("16")),
                        step: Some(q("1")),
                    },
                }),
            ),
        );
        validate_devices("cpu.resmgr.io", &[d]).unwrap();
    }

    #[test]
    fn refuses_names_that_are_not_dns_labels() {
        for bad in ["", "Numa0", "numa_0", "-numa", "numa-", &"n".repeat(64)] {
            let err = validate_device("d.io", &device(bad)).unwrap_err();
            assert_eq!(err.field, "name", "{bad:?}");
            assert_eq!(err.device, bad);
        }
        validate_device("d.io", &device(&"n".repeat(63))).unwrap();
    }

    #[test]
    fn refuses_duplicate_device_names() {
        let err = validate_devices("d.io", &[device("a"), device("b"), device("a")]).unwrap_err();
        assert_eq!((err.device.as_str(), err.field.as_str()), ("a", "name"));
    }

    #[test]
    fn refuses_more_than_32_attributes_and_capacities() {
        let mut d = device("dev");
        for i in 0..20 {
            d.attributes.insert(format!("a{i}"), AttributeValue::Int(i));
        }
        for i in 0..12 {
            d.capacities.insert(format!("c{i}"), capacity("1", None));
        }
        validate_device("d.io", &d).unwrap();
        d.capacities.insert("c12".into(), capacity("1", None));
        let err = validate_device("d.io", &d).unwrap_err();
        assert_eq!(err.field, "attributes");
        assert!(err.reason.contains("33"), "{err}");
    }

    #[test]
    fn refuses_bad_qualified_names() {
        for bad in [
            "1abc",
            "a-b",
            "",
            "Dom.io/x",
            "d.io/",
            "d.io/a.b",
            &"x".repeat(33),
            &format!("{}/x", "d".repeat(64)),
        ] {
            let mut d = device("dev");
            d.attributes
                .insert(bad.to_owned(), AttributeValue::Bool(true));
            assert_eq!(
                field_of(validate_device("d.io", &d)),
                format!("attributes[{bad}]"),
                "{bad:?}"
            );
        }
        for good in [
            "_x",
            "numaNode",
            "resource.kubernetes.io/pcieRoot",
            &"x".repeat(32),
        ] {
            let mut d = device("dev");
            d.attributes
                .insert(good.to_owned(), AttributeValue::Bool(true));
            validate_device("d.io", &d).unwrap();
        }
    }

    #[test]
    fn refuses_a_bare_name_and_its_driver_qualified_twin() {
        let mut d = device("dev");
        d.attributes.insert("numa".into(), AttributeValue::Int(0));
        d.attributes
            .insert("d.io/numa".into(), AttributeValue::Int(0));
        assert!(field_of(validate_device("d.io", &d)).starts_with("attributes["));
        // In another domain the same id is a different attribute.
        validate_device("other.io", &d).unwrap();
    }

    #[test]
    fn refuses_long_strings_and_bad_versions() {
        let mut d = device("dev");
        d.attributes
            .insert("model".into(), AttributeValue::String("x".repeat(65)));
        assert_eq!(field_of(validate_device("d.io", &d)), "attributes[model]");
        d.attributes
            .insert("model".into(), AttributeValue::String("x".repeat(64)));
        validate_device("d.io", &d).unwrap();
        d.attributes
            .insert("v".into(), AttributeValue::Version("v1.2".into()));
        assert_eq!(field_of(validate_device("d.io", &d)), "attributes[v]");
    }

    #[test]
    fn list_attributes_are_non_empty_short_strings_and_count_per_entry() {
        let mut d = device("dev");
        let root = "resource.kubernetes.io/pcieRoot";
        d.attributes.insert(
            root.into(),
            AttributeValue::Strings(vec!["pci0000:00".into(), "pci0000:80".into()]),
        );
        validate_device("d.io", &d).unwrap();
        d.attributes
            .insert(root.into(), AttributeValue::Strings(Vec::new()));
        let err = validate_device("d.io", &d).unwrap_err();
        assert_eq!(err.field, format!("attributes[{root}]"));
        assert!(err.reason.contains("must not be empty"), "{err}");
        // 64 bytes pass, 65 do not, counted in bytes as the API server does.
        d.attributes.insert(
            root.into(),
            AttributeValue::Strings(vec!["a".into(), "é".repeat(32)]),
        );
        validate_device("d.io", &d).unwrap();
        d.attributes.insert(
            root.into(),
            AttributeValue::Strings(vec!["a".into(), format!("{}x", "é".repeat(32))]),
        );
        let err = validate_device("d.io", &d).unwrap_err();
        assert!(err.reason.starts_with("strings[1]: 65 bytes"), "{err}");
        // 30 scalars and a list of 19: 49 values in 31 attributes.
        let mut d = device("dev");
        for i in 0..30 {
            d.attributes.insert(format!("a{i}"), AttributeValue::Int(i));
        }
        d.attributes.insert(
            root.into(),
            AttributeValue::Strings((0..19).map(|i| format!("pci0000:{i:02x}")).collect()),
        );
        assert_eq!(d.attributes.len(), 31);
        let err = validate_device("d.io", &d).unwrap_err();
        assert_eq!(err.field, "attributes");
        assert!(err.reason.starts_with("49 attribute values"), "{err}");
        d.attributes.remove("a0");
        validate_device("d.io", &d).unwrap();
    }

    #[test]
    fn refuses_request_policies_the_api_server_would() {
        let policy = |default: Option<&str>, valid: ValidValues| RequestPolicy {
            default: default.map(q),
            valid,
        };
        let values = |v: &[&str]| ValidValues::Values(v.iter().map(|s| q(s)).collect());
        let range = |min: &str, max: Option<&str>, step: Option<&str>| ValidValues::Range {
            min: q(min),
            max: max.map(q),
            step: step.map(q),
        };
        let cases = [
            (policy(None, values(&["1"])), "needs a default"),
            (policy(Some("2"), values(&["1", "4"])), "not one of"),
            (policy(Some("1"), values(&["4", "1"])), "sorted"),
            (policy(Some("1"), values(&["1", "1"])), "sorted"),
            (policy(Some("1"), values(&["1", "9"])), "exceeds"),
            (
                policy(
                    Some("1"),
                    values(&[
                        "1", "2", "3", "4", "5", "6", "7", "8", "8500m", "8600m", "8700m",
                    ]),
                ),
                "between 1 and 10",
            ),
            (
                policy(Some("1"), range("2", None, None)),
                "below the range min",
            ),
            (policy(Some("3"), range("1", Some("2"), None)), "range max"),
            (policy(Some("1"), range("1", Some("9"), None)), "range max"),
            (
                policy(Some("3"), range("1", None, Some("2"))),
                "multiple of the step",
            ),
            (
                policy(Some("2"), range("1", None, Some("0"))),
                "step must be positive",
            ),
            (policy(Some("8"), range("4", None, Some("8"))), "plus step"),
            (policy(Some("9"), values(&["9"])), "exceeds the capacity"),
        ];
        for (policy, reason) in cases {
            let mut d = device("dev");
            d.allow_multiple_allocations = true;
            d.capacities
                .insert("cpu".into(), capacity("8", Some(policy.clone())));
            let err = validate_device("d.io", &d).unwrap_err();
            assert_eq!(err.field, "capacity[cpu].requestPolicy", "{policy:?}");
            assert!(err.reason.contains(reason), "{policy:?}: {err}");
        }
    }

    #[test]
    fn taints_are_label_names_and_values_and_at_most_16() {
        let taint = |key: &str, value: &str| policy::DeviceTaint {
            key: key.into(),
            value: value.into(),
            effect: policy::TaintEffect::NoSchedule,
            time_added: None,
        };
        let mut d = device("numa0");
        d.taints = vec![taint("topology-aware.resmgr.io/cpus-offline", "3_5-7")];
        assert_eq!(validate_device("d.io", &d), Ok(()));
        for (key, value) in [
            ("d.io/cpus offline", "3"),
            ("d.io/", "3"),
            ("-bad-/x", "3"),
            ("d.io/x", "3,5"),
            ("d.io/x", &"7".repeat(64)),
        ] {
            d.taints = vec![taint(key, value)];
            assert_eq!(
                field_of(validate_device("d.io", &d)),
                "taints[0]",
                "{key} {value}"
            );
        }
        d.taints = vec![taint("d.io/x", ""); 17];
        assert_eq!(field_of(validate_device("d.io", &d)), "taints");
    }

    #[test]
    fn refuses_a_request_policy_on_an_exclusive_device() {
        let mut d = device("dev");
        let policy = RequestPolicy {
            default: Some(q("1")),
            valid: ValidValues::Values(vec![q("1")]),
        };
        d.capacities
            .insert("cpu".into(), capacity("8", Some(policy)));
        let err = validate_device("d.io", &d).unwrap_err();
        assert!(err.reason.contains("multiple allocations"), "{err}");
    }

    /// What the API server would refuse, refused here too, naming the field.
    #[test]
    fn slice_specs_are_checked_field_by_field() {
        let spec = |patch: serde_json::Value| {
            let mut v = serde_json::json!({
                "driver": "cpu.resmgr.io",
                "pool": {"name": "node-a", "generation": 1, "resourceSliceCount": 1},
                "nodeName": "node-a",
                "devices": [{"name": "numa0"}, {"name": "numa1"}],
            });
            for (k, x) in patch.as_object().unwrap() {
                v[k] = x.clone();
            }
            serde_json::from_value::<k8s_openapi::api::resource::v1::ResourceSliceSpec>(v).unwrap()
        };
        let field = |patch: serde_json::Value| match validate_slice_spec(&spec(patch.clone())) {
            Err(e) => e.field,
            Ok(()) => panic!("accepted {patch}"),
        };
        assert_eq!(validate_slice_spec(&spec(serde_json::json!({}))), Ok(()));
        assert_eq!(field(serde_json::json!({"driver": "Not_A.Name"})), "driver");
        let pool = |name: &str, generation: i64, count: i64| serde_json::json!({"pool": {"name": name, "generation": generation, "resourceSliceCount": count}});
        assert_eq!(field(pool("", 1, 1)), "pool.name");
        assert_eq!(field(pool(&"a".repeat(254), 1, 1)), "pool.name");
        assert_eq!(
            validate_slice_spec(&spec(pool(&"a".repeat(253), 0, 1))),
            Ok(())
        );
        assert_eq!(field(pool("node-a", -1, 1)), "pool");
        assert_eq!(field(pool("node-a", 1, 0)), "pool");
        assert_eq!(field(serde_json::json!({"nodeName": null})), "nodeName");
        assert_eq!(
            field(serde_json::json!({"devices": [{"name": "numa0"}, {"name": "numa0"}]})),
            "devices[1].name"
        );
        let many = |n: usize| {
            let devices: Vec<_> = (0..n)
                .map(|i| serde_json::json!({"name": format!("d{i}")}))
                .collect();
            serde_json::json!({ "devices": devices })
        };
        assert_eq!(validate_slice_spec(&spec(many(128))), Ok(()));
        assert_eq!(field(many(129)), "devices");

        // Per device: at most 32 attributes and capacities together.
        let with = |attributes: usize, capacities: usize| {
            let attributes: serde_json::Map<_, _> = (0..attributes)
                .map(|i| (format!("a{i}"), serde_json::json!({"int": i})))
                .collect();
            let capacity: serde_json::Map<_, _> = (0..capacities)
                .map(|i| (format!("c{i}"), serde_json::json!({"value": "1"})))
                .collect();
            serde_json::json!({"devices": [{"name": "numa0", "attributes": attributes, "capacity": capacity}]})
        };
        assert_eq!(validate_slice_spec(&spec(with(20, 12))), Ok(()));
        assert_eq!(field(with(20, 13)), "devices[0].attributes");
        assert_eq!(field(with(33, 0)), "devices[0].attributes");
        let device = |d: serde_json::Value| serde_json::json!({"devices": [d]});
        assert_eq!(
            field(device(
                serde_json::json!({"name": "numa0", "attributes": {"bad name": {"int": 1}}})
            )),
            "devices[0].attributes[bad name]"
        );
        assert_eq!(
            field(device(
                serde_json::json!({"name": "numa0", "attributes": {"x": {"int": 1, "bool": true}}})
            )),
            "devices[0].attributes[x]"
        );
        assert_eq!(
            field(device(
                serde_json::json!({"name": "numa0", "attributes": {"x": {}}})
            )),
            "devices[0].attributes[x]"
        );
        let long = |n: usize| {
            device(
                serde_json::json!({"name": "numa0", "attributes": {"x": {"string": "s".repeat(n)}}}),
            )
        };
        assert_eq!(validate_slice_spec(&spec(long(64))), Ok(()));
        assert_eq!(field(long(65)), "devices[0].attributes[x]");
        let policy = serde_json::json!({"value": "4", "requestPolicy": {"default": "1"}});
        assert_eq!(
            field(device(
                serde_json::json!({"name": "numa0", "capacity": {"cpu": policy}})
            )),
            "devices[0].capacity[cpu]"
        );
        assert_eq!(
            validate_slice_spec(&spec(device(serde_json::json!({
                "name": "numa0", "allowMultipleAllocations": true, "capacity": {"cpu": policy}
            })))),
            Ok(())
        );
        assert_eq!(
            field(device(
                serde_json::json!({"name": "numa0", "capacity": {"bad name": {"value": "1"}}})
            )),
            "devices[0].capacity[bad name]"
        );
    }
}
