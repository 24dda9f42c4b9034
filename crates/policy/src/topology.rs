//! Topology discovery through hwlocality: the live machine, a synthetic description, or XML.

use hwlocality::{Topology as HwTopology, object::types::ObjectType};

/// Where a topology comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TopologySource {
    /// The machine we run on.
    Live,
    /// An hwloc synthetic description such as `pack:2 numa:2 core:8 pu:2`.
    Synthetic(String),
}

/// Why a topology could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum TopologyError {
    /// hwloc refused to build the topology.
    #[error("cannot build the {source_kind} topology: {message}")]
    Build {
        /// Which kind of source failed.
        source_kind: &'static str,
        /// hwloc's message.
        message: String,
    },
}

/// One NUMA node as the policy sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NumaNode {
    /// The kernel's node number.
    pub id: u32,
    /// The kernel's numbers of the CPUs local to the node.
    pub cpus: Vec<u32>,
}

/// The machine as the policy sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topology {
    /// NUMA nodes in kernel order.
    pub numa_nodes: Vec<NumaNode>,
}

impl Topology {
    /// Discovers a topology from `source`.
    pub fn load(source: &TopologySource) -> Result<Self, TopologyError> {
        let (kind, built) = match source {
            TopologySource::Live => ("live", HwTopology::new().map_err(|e| e.to_string())),
            TopologySource::Synthetic(desc) => (
                "synthetic",
                HwTopology::builder()
                    .from_synthetic(desc)
                    .map_err(|e| e.to_string())
                    .and_then(|b| b.build().map_err(|e| e.to_string())),
            ),
        };
        let hw = built.map_err(|message| TopologyError::Build {
            source_kind: kind,
            message,
        })?;
        let numa_nodes = hw
            .objects_with_type(ObjectType::NUMANode)
            .map(|node| NumaNode {
                id: node
                    .os_index()
                    .and_then(|i| u32::try_from(i).ok())
                    .unwrap_or_default(),
                cpus: node
                    .cpuset()
                    .map(|set| {
                        set.iter_set()
                            .filter_map(|i| u32::try_from(usize::from(i)).ok())
                            .collect()
                    })
                    .unwrap_or_default(),
            })
            .collect();
        Ok(Self { numa_nodes })
    }
}
