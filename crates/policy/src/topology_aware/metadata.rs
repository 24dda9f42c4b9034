//! What a container using a claim may read of it: each result's attributes for the claim's
//! device metadata (KEP-5304), which the resource manager writes per request and the runtime
//! mounts into the container.
//!
//! A result's attributes are those its device publishes (so the workload sees what the
//! scheduler matched on: `resource.kubernetes.io/numaNode`, `socket`,
//! `resource.kubernetes.io/pcieRoot` where exposed, ...), and what the result was granted:
//!
//! | attribute | value |
//! |---|---|
//! | `grantedCpus` | its CPUs in the kernel's list format, `4-7` (string); what `Cpus_allowed_list` shows in a container that uses only it |
//! | `grantedCpuIDs` | the same CPUs, one number each (list of ints) |
//! | `grantedMemoryNodes` | the memory nodes containers using it are pinned to, `1` (string); absent when its configuration turns `memoryPinning` off |
//! | `grantedMemory` | bytes of memory of its node it holds (int); absent when none |
//! | `grantedHugepages<size>` | bytes of hugepages of that size it holds, `grantedHugepages2Mi` (int); absent when none |
//!
//! A memory device's result (individual model) has no CPUs: it says its memory and nodes only.
//! Bare names are in the driver's domain, as in the slices. The attributes are a function of
//! the claim's record and the devices, so a claim prepared again (after a reboot emptied the
//! metadata's directory, say) reads the same.

use std::collections::BTreeMap;

use super::{
    claims::{HeldClaim, ResultRecord},
    devices::DeviceTable,
    memory,
};
use crate::model::AttributeValue;

/// A result's CPUs in the kernel's list format.
pub const GRANTED_CPUS: &str = "grantedCpus";
/// A result's CPUs as a list of numbers.
pub const GRANTED_CPU_IDS: &str = "grantedCpuIDs";
/// The memory nodes a result pins to.
pub const GRANTED_MEMORY_NODES: &str = "grantedMemoryNodes";
/// Bytes of memory a result holds.
pub const GRANTED_MEMORY: &str = "grantedMemory";
/// The prefix of the bytes of hugepages of one size a result holds (`grantedHugepages2Mi`).
pub const GRANTED_HUGEPAGES_PREFIX: &str = "granted";

/// The attributes of every result of `claim`, in result order; see the module docs.
pub fn attributes(claim: &HeldClaim, table: &DeviceTable) -> Vec<BTreeMap<String, AttributeValue>> {
    claim
        .results
        .iter()
        .map(|r| result_attributes(r, table))
        .collect()
}

fn result_attributes(r: &ResultRecord, table: &DeviceTable) -> BTreeMap<String, AttributeValue> {
    let mut out = table
        .get(&r.device)
        .map(|d| d.device.attributes.clone())
        .unwrap_or_default();
    if !r.cpus.is_empty() {
        out.insert(
            GRANTED_CPUS.to_owned(),
            AttributeValue::String(r.cpus.to_string()),
        );
        out.insert(
            GRANTED_CPU_IDS.to_owned(),
            AttributeValue::Ints(r.cpus.iter().map(i64::from).collect()),
        );
    }
    if r.memory_pinning && !r.mems.is_empty() {
        out.insert(
            GRANTED_MEMORY_NODES.to_owned(),
            AttributeValue::String(r.mems.to_string()),
        );
    }
    if r.memory > 0 {
        out.insert(GRANTED_MEMORY.to_owned(), int(r.memory));
    }
    for (&size, &bytes) in &r.hugepages {
        let capacity = memory::hugepage_capacity(size);
        // `hugepages2Mi` → `grantedHugepages2Mi`.
        let name = match capacity.strip_prefix('h') {
            Some(rest) => format!("{GRANTED_HUGEPAGES_PREFIX}H{rest}"),
            None => format!("{GRANTED_HUGEPAGES_PREFIX}{capacity}"),
        };
        out.insert(name, int(bytes));
    }
    out
}

fn int(bytes: u64) -> AttributeValue {
    AttributeValue::Int(i64::try_from(bytes).unwrap_or(i64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        Topology, TopologySource,
        idset::{CpuSet, NodeSet},
        topology_aware::devices::DeviceModel,
    };

    fn table() -> DeviceTable {
        let topo = Topology::load(&TopologySource::Synthetic(
            "pack:1 numa:2(memory=4GiB) core:4 pu:1".into(),
        ))
        .unwrap();
        DeviceTable::build(&topo, &"1-7".parse().unwrap(), &DeviceModel::default())
    }

    fn record(device: &str, cpus: &str, mems: &str) -> ResultRecord {
        ResultRecord {
            request: "cpus".into(),
            device: device.into(),
            cpus: cpus.parse::<CpuSet>().unwrap(),
            mems: mems.parse::<NodeSet>().unwrap(),
            ..ResultRecord::default()
        }
    }

    #[test]
    fn a_result_says_its_device_and_what_it_was_granted() {
        let mut r = record("numa1", "4-5", "1");
        r.memory = 1 << 30;
        r.memory_node = Some(1);
        r.hugepages.insert(2 << 20, 8 << 20);
        let got = result_attributes(&r, &table());
        assert_eq!(
            got.get("resource.kubernetes.io/numaNode"),
            Some(&AttributeValue::Int(1))
        );
        assert_eq!(
            got.get(GRANTED_CPUS),
            Some(&AttributeValue::String("4-5".into()))
        );
        assert_eq!(
            got.get(GRANTED_CPU_IDS),
            Some(&AttributeValue::Ints(vec![4, 5]))
        );
        assert_eq!(
            got.get(GRANTED_MEMORY_NODES),
            Some(&AttributeValue::String("1".into()))
        );
        assert_eq!(got.get(GRANTED_MEMORY), Some(&AttributeValue::Int(1 << 30)));
        assert_eq!(
            got.get("grantedHugepages2Mi"),
            Some(&AttributeValue::Int(8 << 20))
        );
    }

    #[test]
    fn unpinned_memory_and_unknown_devices_say_less() {
        let mut r = record("gone7", "7", "1");
        r.memory_pinning = false;
        let got = result_attributes(&r, &table());
        assert_eq!(
            got.keys().map(String::as_str).collect::<Vec<_>>(),
            [GRANTED_CPU_IDS, GRANTED_CPUS],
            "no device attributes for a device not published, no nodes when unpinned"
        );
    }
}
