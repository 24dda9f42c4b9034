//! The ResourceSlices we want: the policy's devices as `resource.k8s.io/v1` objects, chunked.
//!
//! Pure: the publisher decides what to create, update and delete by comparing these with what
//! the API server has.

use std::collections::BTreeMap;

use k8s_openapi::{
    api::resource::v1 as wire,
    apimachinery::pkg::{api::resource::Quantity as WireQuantity, apis::meta::v1::OwnerReference},
};
use policy::{
    AttributeValue, Capacity, Device, DeviceTaint, Quantity, ValidValues,
    topology_aware::{devices::MEMORY_CAPACITY, memory::hugepage_size},
};

use super::PublisherConfig;

/// Devices per slice (the API allows 128 unless a device uses taints or counters).
pub const MAX_DEVICES_PER_SLICE: usize = 128;
/// Devices per slice when a device of it has taints (`ResourceSliceMaxDevicesWithTaintsOrConsumesCounters`).
pub const MAX_TAINTED_DEVICES_PER_SLICE: usize = 64;
/// The label on every slice we publish, so `kubectl get resourceslices -l` finds ours.
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
/// Its value.
pub const MANAGED_BY: &str = "resmgr";
/// The node resource the node-allocatable mapping charges for CPUs.
pub const NODE_CPU: &str = "cpu";
/// The node resource our `memory` capacity maps to.
pub const NODE_MEMORY: &str = "memory";

/// The v1 device the API server gets for a policy device.
pub fn wire_device(config: &PublisherConfig, device: &Device) -> wire::Device {
    let attributes: BTreeMap<String, wire::DeviceAttribute> = device
        .attributes
        .iter()
        .map(|(name, value)| (name.clone(), wire_attribute(value)))
        .collect();
    let capacity: BTreeMap<String, wire::DeviceCapacity> = device
        .capacities
        .iter()
        .map(|(name, capacity)| (name.clone(), wire_capacity(capacity)))
        .collect();
    wire::Device {
        name: device.name.clone(),
        attributes: (!attributes.is_empty()).then_some(attributes),
        capacity: (!capacity.is_empty()).then_some(capacity),
        allow_multiple_allocations: device.allow_multiple_allocations.then_some(true),
        node_allocatable_resource_mappings: node_allocatable_mapping(config, device),
        taints: (!device.taints.is_empty()).then(|| device.taints.iter().map(wire_taint).collect()),
        ..Default::default()
    }
}

fn wire_taint(taint: &DeviceTaint) -> wire::DeviceTaint {
    wire::DeviceTaint {
        key: taint.key.clone(),
        value: (!taint.value.is_empty()).then(|| taint.value.clone()),
        effect: taint.effect.as_str().to_owned(),
        time_added: taint
            .time_added
            .and_then(|seconds| k8s_openapi::jiff::Timestamp::from_second(seconds).ok())
            .map(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time),
    }
}

/// The node-allocatable mapping of a device, for each node resource configured whose capacity
/// the device has: `cpu` (with `node_allocatable_cpu`), and `memory` and `hugepages-<size>` (with
/// `node_allocatable_memory`, from the `memory` and `hugepages<size>` capacities). A shared
/// device charges the node what each claim consumed; an exclusive one charges its whole
/// capacity per allocation. `None` when nothing is mapped.
fn node_allocatable_mapping(
    config: &PublisherConfig,
    device: &Device,
) -> Option<BTreeMap<String, wire::NodeAllocatableResourceMapping>> {
    let mut mappings = BTreeMap::new();
    let mut map = |resource: String, capacity_name: &str| {
        let Some(capacity) = device.capacities.get(capacity_name) else {
            return;
        };
        let mapping = if device.allow_multiple_allocations {
            wire::NodeAllocatableResourceMapping {
                capacity_key: Some(capacity_name.to_owned()),
                allocation_multiplier: None,
            }
        } else {
            wire::NodeAllocatableResourceMapping {
                capacity_key: None,
                allocation_multiplier: (capacity.value != Quantity::from_units(1))
                    .then(|| quantity(capacity.value)),
            }
        };
        mappings.insert(resource, mapping);
    };
    if let Some(cpu) = &config.node_allocatable_cpu {
        map(NODE_CPU.to_owned(), &cpu.capacity);
    }
    if config.node_allocatable_memory {
        for name in device.capacities.keys() {
            if let Some(resource) = node_memory_resource(name) {
                map(resource, name);
            }
        }
    }
    (!mappings.is_empty()).then_some(mappings)
}

/// The node resource a memory capacity of ours maps to: `memory`, and `hugepages-2Mi` for
/// `hugepages2Mi` (a capacity name is a C identifier, a resource name has the dash).
fn node_memory_resource(capacity: &str) -> Option<String> {
    if capacity == MEMORY_CAPACITY {
        return Some(NODE_MEMORY.to_owned());
    }
    hugepage_size(capacity)?;
    let size = capacity.strip_prefix("hugepages")?;
    Some(format!("hugepages-{size}"))
}

/// An attribute value as the API writes it (in slices and in device metadata).
pub fn wire_attribute(value: &AttributeValue) -> wire::DeviceAttribute {
    match value {
        AttributeValue::Int(i) => wire::DeviceAttribute {
            int: Some(*i),
            ..Default::default()
        },
        AttributeValue::Bool(b) => wire::DeviceAttribute {
            bool: Some(*b),
            ..Default::default()
        },
        AttributeValue::String(s) => wire::DeviceAttribute {
            string: Some(s.clone()),
            ..Default::default()
        },
        AttributeValue::Version(v) => wire::DeviceAttribute {
            version: Some(v.clone()),
            ..Default::default()
        },
        AttributeValue::Strings(list) => wire::DeviceAttribute {
            strings: Some(list.clone()),
            ..Default::default()
        },
        AttributeValue::Ints(list) => wire::DeviceAttribute {
            ints: Some(list.clone()),
            ..Default::default()
        },
    }
}

fn wire_capacity(capacity: &Capacity) -> wire::DeviceCapacity {
    let request_policy = capacity.request_policy.as_ref().map(|policy| {
        let (valid_values, valid_range) = match &policy.valid {
            ValidValues::Values(values) => {
                (Some(values.iter().copied().map(quantity).collect()), None)
            }
            ValidValues::Range { min, max, step } => (
                None,
                Some(wire::CapacityRequestPolicyRange {
                    min: quantity(*min),
                    max: max.map(quantity),
                    step: step.map(quantity),
                }),
            ),
        };
        wire::CapacityRequestPolicy {
            default: policy.default.map(quantity),
            valid_values,
            valid_range,
        }
    });
    wire::DeviceCapacity {
        value: quantity(capacity.value),
        request_policy,
    }
}

/// A quantity as the API writes it.
pub fn quantity(q: Quantity) -> WireQuantity {
    WireQuantity(q.to_string())
}

/// Devices in slices of at most [`MAX_DEVICES_PER_SLICE`] ([`MAX_TAINTED_DEVICES_PER_SLICE`]
/// while a device is tainted), in the policy's order. No devices is one empty slice: it tells
/// the scheduler the driver runs on this node and offers nothing, which is not the same as
/// publishing nothing.
pub fn chunk(devices: Vec<wire::Device>) -> Vec<Vec<wire::Device>> {
    if devices.is_empty() {
        return vec![Vec::new()];
    }
    let per_slice = if devices
        .iter()
        .any(|d| d.taints.as_ref().is_some_and(|t| !t.is_empty()))
    {
        MAX_TAINTED_DEVICES_PER_SLICE
    } else {
        MAX_DEVICES_PER_SLICE
    };
    let mut chunks = Vec::with_capacity(devices.len().div_ceil(per_slice));
    let mut devices = devices.into_iter().peekable();
    while devices.peek().is_some() {
        chunks.push(devices.by_ref().take(per_slice).collect());
    }
    chunks
}

/// The spec of one slice of our pool.
pub fn slice_spec(
    config: &PublisherConfig,
    generation: i64,
    slice_count: usize,
    devices: Vec<wire::Device>,
) -> wire::ResourceSliceSpec {
    wire::ResourceSliceSpec {
        driver: config.driver.clone(),
        node_name: Some(config.node_name.clone()),
        pool: wire::ResourcePool {
            name: config.node_name.clone(),
            generation,
            resource_slice_count: i64::try_from(slice_count).unwrap_or(i64::MAX),
        },
        // An empty list is omitted, as the API server stores it.
        devices: (!devices.is_empty()).then_some(devices),
        ..Default::default()
    }
}

/// The owner reference that makes the Node's deletion take our slices with it.
pub fn node_owner(node_name: &str, node_uid: &str) -> OwnerReference {
    OwnerReference {
        api_version: "v1".to_owned(),
        kind: "Node".to_owned(),
        name: node_name.to_owned(),
        uid: node_uid.to_owned(),
        controller: Some(true),
        block_owner_deletion: None,
    }
}

/// `generateName` of our slices: `<node>-<driver>-`, shortened so the API server's five random
/// characters still fit in a 253-character name.
pub fn generate_name(config: &PublisherConfig) -> String {
    let mut prefix = format!("{}-{}", config.node_name, config.driver);
    if prefix.len() > 247 {
        let mut end = 247;
        while !prefix.is_char_boundary(end) {
            end -= 1;
        }
        prefix.truncate(end);
    }
    // A name part must end alphanumeric before the '-' we add.
    let prefix = prefix.trim_end_matches(['-', '.']);
    format!("{prefix}-")
}

/// The field selector of our pool's slices.
pub fn field_selector(config: &PublisherConfig) -> String {
    format!(
        "spec.nodeName={},spec.driver={}",
        config.node_name, config.driver
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> PublisherConfig {
        PublisherConfig::new("cpu.resmgr.io", "node-a")
    }

    fn q(s: &str) -> Quantity {
        s.parse().unwrap()
    }

    fn names(n: usize) -> Vec<wire::Device> {
        (0..n)
            .map(|i| wire::Device {
                name: format!("d{i}"),
                ..Default::default()
            })
            .collect()
    }

    #[test]
    fn chunks_at_128_keeping_order() {
        let sizes = |n| chunk(names(n)).iter().map(Vec::len).collect::<Vec<_>>();
        assert_eq!(sizes(0), [0]);
        assert_eq!(sizes(1), [1]);
        assert_eq!(sizes(128), [128]);
        assert_eq!(sizes(129), [128, 1]);
        assert_eq!(sizes(300), [128, 128, 44]);
        let chunks = chunk(names(130));
        assert_eq!(chunks[1][0].name, "d128");
    }

    #[test]
    fn a_tainted_device_goes_out_with_its_taint_in_slices_of_64() {
        let device = Device {
            name: "numa1".into(),
            attributes: BTreeMap::new(),
            capacities: BTreeMap::new(),
            allow_multiple_allocations: false,
            taints: vec![DeviceTaint {
                key: "topology-aware.resmgr.io/cpus-offline".into(),
                value: "5".into(),
                effect: policy::TaintEffect::NoSchedule,
                time_added: Some(1_700_000_000),
            }],
        };
        let json = serde_json::to_value(wire_device(&config(), &device)).unwrap();
        assert_eq!(
            json["taints"],
            serde_json::json!([{
                "key": "topology-aware.resmgr.io/cpus-offline",
                "value": "5",
                "effect": "NoSchedule",
                "timeAdded": "2023-11-14T22:13:20Z",
            }])
        );
        let mut devices = names(100);
        let sizes = |d: Vec<wire::Device>| chunk(d).iter().map(Vec::len).collect::<Vec<_>>();
        assert_eq!(sizes(devices.clone()), [100]);
        devices[99].taints = Some(vec![wire_taint(&device.taints[0])]);
        assert_eq!(sizes(devices), [64, 36]);
    }

    #[test]
    fn converts_a_shared_device_with_a_request_policy() {
        let mut device = Device {
            name: "numa-0".into(),
            attributes: BTreeMap::from([
                (
                    "resource.kubernetes.io/numaNode".into(),
                    AttributeValue::Int(0),
                ),
                ("smt".into(), AttributeValue::Bool(true)),
                ("model".into(), AttributeValue::String("x".into())),
                ("fw".into(), AttributeValue::Version("1.0.0".into())),
            ]),
            capacities: BTreeMap::from([(
                "cpu".into(),
                Capacity {
                    value: q("16"),
                    request_policy: Some(policy::RequestPolicy {
                        default: Some(q("1")),
                        valid: ValidValues::Range {
                            min: q("500m"),
                            max: None,
                            step: Some(q("500m")),
                        },
                    }),
                },
            )]),
            allow_multiple_allocations: true,
            taints: Vec::new(),
        };
        let json = serde_json::to_value(wire_device(&config(), &device)).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "name": "numa-0",
                "allowMultipleAllocations": true,
                "attributes": {
                    "fw": {"version": "1.0.0"},
                    "model": {"string": "x"},
                    "resource.kubernetes.io/numaNode": {"int": 0},
                    "smt": {"bool": true},
                },
                "capacity": {"cpu": {"value": "16", "requestPolicy": {
                    "default": "1", "validRange": {"min": "500m", "step": "500m"}}}},
            })
        );
        device.capacities.get_mut("cpu").unwrap().request_policy = Some(policy::RequestPolicy {
            default: Some(q("2")),
            valid: ValidValues::Values(vec![q("2"), q("4")]),
        });
        let json = serde_json::to_value(wire_device(&config(), &device)).unwrap();
        assert_eq!(
            json["capacity"]["cpu"]["requestPolicy"],
            serde_json::json!({"default": "2", "validValues": ["2", "4"]})
        );
    }

    #[test]
    fn maps_node_allocatable_cpu_only_when_configured() {
        let shared = Device {
            name: "numa-0".into(),
            attributes: BTreeMap::new(),
            capacities: BTreeMap::from([(
                "cpu".into(),
                Capacity {
                    value: q("16"),
                    request_policy: None,
                },
            )]),
            allow_multiple_allocations: true,
            taints: Vec::new(),
        };
        let mut exclusive = shared.clone();
        exclusive.allow_multiple_allocations = false;
        let mut single = exclusive.clone();
        single.capacities.get_mut("cpu").unwrap().value = q("1");
        let mapping = |config: &PublisherConfig, d: &Device| {
            serde_json::to_value(wire_device(config, d)).unwrap()["nodeAllocatableResourceMappings"]
                .clone()
        };
        let off = config();
        assert_eq!(mapping(&off, &shared), serde_json::Value::Null);
        let mut on = config();
        on.node_allocatable_cpu = Some(super::super::NodeAllocatableCpu::default());
        assert_eq!(
            mapping(&on, &shared),
            serde_json::json!({"cpu": {"capacityKey": "cpu"}})
        );
        assert_eq!(
            mapping(&on, &exclusive),
            serde_json::json!({"cpu": {"allocationMultiplier": "16"}})
        );
        assert_eq!(mapping(&on, &single), serde_json::json!({"cpu": {}}));
        let mut no_cpu = shared.clone();
        no_cpu.capacities.clear();
        assert_eq!(mapping(&on, &no_cpu), serde_json::Value::Null);
    }

    #[test]
    fn maps_node_allocatable_memory_and_hugepages_only_when_configured() {
        let capacity = |v: &str| Capacity {
            value: q(v),
            request_policy: None,
        };
        let shared = Device {
            name: "numa-0".into(),
            attributes: BTreeMap::new(),
            capacities: BTreeMap::from([
                ("cpu".into(), capacity("16")),
                ("memory".into(), capacity("16Gi")),
                ("hugepages2Mi".into(), capacity("512Mi")),
                ("hugepages1Gi".into(), capacity("2Gi")),
                ("other".into(), capacity("3")),
            ]),
            allow_multiple_allocations: true,
            taints: Vec::new(),
        };
        let mut exclusive = shared.clone();
        exclusive.allow_multiple_allocations = false;
        let mapping = |config: &PublisherConfig, d: &Device| {
            serde_json::to_value(wire_device(config, d)).unwrap()["nodeAllocatableResourceMappings"]
                .clone()
        };
        assert_eq!(mapping(&config(), &shared), serde_json::Value::Null);
        let mut memory = config();
        memory.node_allocatable_memory = true;
        assert_eq!(
            mapping(&memory, &shared),
            serde_json::json!({
                "memory": {"capacityKey": "memory"},
                "hugepages-2Mi": {"capacityKey": "hugepages2Mi"},
                "hugepages-1Gi": {"capacityKey": "hugepages1Gi"},
            })
        );
        let mut both = memory.clone();
        both.node_allocatable_cpu = Some(super::super::NodeAllocatableCpu::default());
        assert_eq!(
            mapping(&both, &exclusive),
            serde_json::json!({
                "cpu": {"allocationMultiplier": "16"},
                "memory": {"allocationMultiplier": "17179869184"},
                "hugepages-2Mi": {"allocationMultiplier": "536870912"},
                "hugepages-1Gi": {"allocationMultiplier": "2147483648"},
            })
        );
        // A per-CPU device carries no memory: nothing of memory is mapped.
        let mut cpu_only = shared.clone();
        cpu_only.capacities.retain(|name, _| name == "cpu");
        assert_eq!(mapping(&memory, &cpu_only), serde_json::Value::Null);
    }

    #[test]
    fn empty_slice_omits_devices_and_counts_the_pool() {
        let spec = slice_spec(&config(), 3, 1, Vec::new());
        assert_eq!(
            serde_json::to_value(spec).unwrap(),
            serde_json::json!({
                "driver": "cpu.resmgr.io",
                "nodeName": "node-a",
                "pool": {"name": "node-a", "generation": 3, "resourceSliceCount": 1},
            })
        );
    }

    #[test]
    fn generate_name_fits_and_ends_with_a_dash() {
        assert_eq!(generate_name(&config()), "node-a-cpu.resmgr.io-");
        let mut long = config();
        long.node_name = format!("{}.{}", "a".repeat(240), "b".repeat(12));
        let name = generate_name(&long);
        assert!(
            name.len() <= 248 && name.ends_with('-') && !name.ends_with(".-"),
            "{name}"
        );
        // A cut inside a multi-byte character backs off to its start.
        long.node_name = format!("{}é{}", "a".repeat(246), "b".repeat(20));
        let name = generate_name(&long);
        assert_eq!(name, format!("{}-", "a".repeat(246)));
    }
}
