//! What a policy has placed where, as it reports it through [`crate::Policy::inventory`].
//!
//! These are report types, not decisions: the resource manager never reads them. The binary
//! turns them into its metrics (`resmgr_pool_cpus{pool,kind}`), `/debug/state`, `resmgr
//! topology`, and the simulator's report and drawing, so any policy gets all of those by filling
//! in an [`Inventory`]. CPU and memory node sets serialize in the kernel's list format.

use serde::{Deserialize, Serialize};

use crate::idset::{CpuSet, NodeSet};

/// Everything a policy has placed, copied out at one instant. [`Inventory::default`] (all empty)
/// is what a policy that reports nothing returns.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Inventory {
    /// CPUs kept for system pods.
    pub reserved: CpuSet,
    /// CPUs shared by containers without CPUs of their own: every CPU not reserved, isolated or
    /// granted to a container or claim.
    pub shared: CpuSet,
    /// The policy's pools, parents before children; a policy without pools lists none.
    pub pools: Vec<PoolUsage>,
    /// Every container placed, by ID.
    pub containers: Vec<ContainerPlacement>,
    /// Every claim held, by UID.
    pub claims: Vec<ClaimPlacement>,
}

/// One pool's CPUs, split by use. The four uses are disjoint subsets of [`PoolUsage::cpus`]; CPUs
/// in none of them are isolated and idle.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolUsage {
    /// A name unique among the pools, for example `numa1`.
    pub name: String,
    /// What part of the machine the pool stands for, in the policy's words, for example `numa`.
    pub kind: String,
    /// Distance from the root pool (0), for drawing the tree.
    pub depth: usize,
    /// Its online CPUs.
    pub cpus: CpuSet,
    /// Of those, reserved for system pods.
    pub reserved: CpuSet,
    /// Shared by containers without CPUs of their own.
    pub shared: CpuSet,
    /// Granted to containers alone (exclusive or isolated grants).
    pub exclusive: CpuSet,
    /// Held by claims.
    pub claimed: CpuSet,
}

/// How a container is placed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum GrantKind {
    /// On the reserved CPUs.
    Reserved,
    /// On shared CPUs.
    Shared,
    /// On CPUs of its own.
    Exclusive,
    /// On kernel-isolated CPUs of its own.
    Isolated,
    /// On the CPUs of the claims it uses.
    Claim,
}

impl GrantKind {
    /// The kind in words, as it serializes: `reserved`, `shared`, `exclusive`, `isolated`,
    /// `claim`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Reserved => "reserved",
            Self::Shared => "shared",
            Self::Exclusive => "exclusive",
            Self::Isolated => "isolated",
            Self::Claim => "claim",
        }
    }
}

/// What a policy did for a container instead of refusing it: the kubelet admitted it, so it
/// must run, even where its request would not put it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Fallback {
    /// It asked for exclusive CPUs and none could be had: it runs on shared CPUs.
    NotExclusive,
    /// Its pool has no shared CPU left (claims took them): it runs on the shared CPUs of an
    /// enclosing pool.
    Widened,
    /// No CPU is shared anywhere: it runs on the reserved CPUs.
    Reserved,
    /// Its memory did not fit next to its CPUs: its memory is not pinned.
    MemoryUnpinned,
}

impl Fallback {
    /// The fallback in words, as it serializes: `not-exclusive`, `widened`, `reserved`,
    /// `memory-unpinned`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NotExclusive => "not-exclusive",
            Self::Widened => "widened",
            Self::Reserved => "reserved",
            Self::MemoryUnpinned => "memory-unpinned",
        }
    }
}

/// One container's placement.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerPlacement {
    /// The container ID.
    pub id: String,
    /// How it is placed.
    pub grant: GrantKind,
    /// The pool it was placed in, for pool grants.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool: Option<String>,
    /// Its cpuset now.
    pub cpus: CpuSet,
    /// Its memory nodes, when the policy pins them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mems: Option<NodeSet>,
    /// What was done for it instead of refusing it, if anything.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fallbacks: Vec<Fallback>,
}

/// One claim's grant.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClaimPlacement {
    /// The claim's UID.
    pub uid: String,
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// The devices of its results, in result order.
    pub devices: Vec<String>,
    /// Every CPU it holds.
    pub cpus: CpuSet,
    /// Every memory node it grants.
    pub mems: NodeSet,
    /// Bytes of memory it holds of its nodes' accounts.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub memory: u64,
    /// Bytes of hugepages it holds, by page size in bytes.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub hugepages: std::collections::BTreeMap<u64, u64>,
}

// serde's skip_serializing_if passes a reference.
#[allow(clippy::trivially_copy_pass_by_ref)]
fn is_zero(n: &u64) -> bool {
    *n == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grant_kinds_serialize_as_their_words() {
        for kind in [
            GrantKind::Reserved,
            GrantKind::Shared,
            GrantKind::Exclusive,
            GrantKind::Isolated,
            GrantKind::Claim,
        ] {
            let json = serde_json::to_value(kind).unwrap();
            assert_eq!(json, serde_json::Value::String(kind.as_str().into()));
            assert_eq!(serde_json::from_value::<GrantKind>(json).unwrap(), kind);
        }
    }

    #[test]
    fn fallbacks_serialize_as_their_words() {
        for kind in [
            Fallback::NotExclusive,
            Fallback::Widened,
            Fallback::Reserved,
            Fallback::MemoryUnpinned,
        ] {
            let json = serde_json::to_value(kind).unwrap();
            assert_eq!(json, serde_json::Value::String(kind.as_str().into()));
            assert_eq!(serde_json::from_value::<Fallback>(json).unwrap(), kind);
        }
    }
}
