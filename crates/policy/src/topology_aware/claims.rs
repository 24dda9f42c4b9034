//! DRA claims: claim records (the durable state), CDI edits, and finding which claims a
//! container uses. What is published and what a result gets is [`super::devices`]' business.
//!
//! A claim's result `i` is granted through CDI edits that set `DRA_CPUSET_<uid>=<cpus>` and
//! `DRA_MEMS_<uid>=<nodes>`, and the same under the claim's [`shell_safe`] name (hyphens as
//! underscores): a Kubernetes UID has hyphens, which no shell accepts in a variable name, so
//! `sh` drops `DRA_CPUSET_<uid>` from the environment of everything it starts, and a workload
//! started through a shell wrapper would never see it. The CPUs and nodes are those of every
//! result of the same request: a container gets the devices of the requests it names, so with
//! several results per request (`count: 4` of individual devices) each result's edits say the
//! same, whole thing. A container using a claim is pinned to the CPUs of the results it uses. It
//! uses a claim when the runtime reports the CDI device `<vendor>/device=claim-<uid>-<i>` (the
//! resource manager's naming, parsed with [`cdi::claim_of_device`]) whose vendor is our driver
//! ([`super::Config::driver`]) and whose class is `device`: another driver may name its devices
//! the same way, and its device is no proof of ours. Only the kubelet can inject such a device;
//! failing that (runtimes that do not report CDI devices) when its environment has `DRA_CPUSET_`
//! with the claim's UID or its shell-safe name, and then only if its pod is among the claim's
//! reserved-for pods, because a pod can set any environment variable it likes.
//!
//! A result that holds memory or hugepages of its node's account ([`super::memory`]) also sets
//! `DRA_MEMORY_<uid>=<bytes>` and `DRA_HUGEPAGES_<uid>=2Mi=64Mi,1Gi=2Gi` (its request's, under
//! both names): the workload learns what it may use, and a claim taken back from its spec
//! ([`granted_memory`]) holds its memory again, so the slices do not promise it twice.
//!
//! A result on a memory device of the individual model (no CPUs, see [`super::devices`]) sets no
//! `DRA_CPUSET_<uid>`: its `DRA_MEMS_<uid>` is its node and `DRA_MEMORY_`/`DRA_HUGEPAGES_` what
//! its request holds, so [`granted`] tells it from a CPU result by that. A container uses it by
//! its CDI device or, through the environment fallback, when it was told the claim's memory.
//!
//! A result whose claim configuration turns `memoryPinning` off ([`super::claim_config`]) gets
//! no `DRA_MEMS_<uid>`, and containers using it get no memory nodes from it.
//!
//! Records saved by earlier versions (results on grouped `numa<N>` devices) restore as they are:
//! a record says which CPUs a result holds, whatever devices are published now.
//!
//! A claim whose spec is on disk but that the saved state does not account for is taken back
//! from the spec ([`granted`], [`super::TopologyAware`]'s `adopt_claim`): the spec says each
//! request's CPUs and memory nodes, not the request names, the pods or which of a request's
//! results holds which CPU. Until the kubelet prepares it again ([`HeldClaim::learn`]) such a
//! claim is [`HeldClaim::adopted`]: its requests are named `adopted-<k>`, and a container
//! proves its use by its CDI device or by carrying exactly the environment the spec gave, from
//! any pod.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::{
    idset::{CpuSet, NodeSet},
    model::{AllocationResult, Claim, Container},
    topology::page_size_name,
};

pub use crate::claim_env::{CPUSET_ENV, MEMS_ENV, shell_safe};

/// The prefix of the environment variable carrying the bytes of memory a claim's request holds.
pub const MEMORY_ENV: &str = "DRA_MEMORY_";
/// The prefix of the environment variable carrying a claim's hugepages (`2Mi=64Mi,1Gi=1Gi`).
pub const HUGEPAGES_ENV: &str = "DRA_HUGEPAGES_";

/// One allocation result of a claim, as granted. Part of the durable state: see [`Snapshot`]
/// before adding a field.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResultRecord {
    /// The NUMA node whose memory account `memory` and `hugepages` are charged to; absent when
    /// the result holds neither.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_node: Option<u32>,
    /// Bytes of memory granted (what the result consumed of its device's `memory`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub memory: u64,
    /// Bytes of hugepages granted, by page size in bytes.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub hugepages: BTreeMap<u64, u64>,
    /// The request it satisfies.
    pub request: String,
    /// The device it was allocated on (`numa<N>`, `cpu<N>`, ...).
    pub device: String,
    /// The CPUs granted.
    pub cpus: CpuSet,
    /// The memory nodes granted.
    pub mems: NodeSet,
    /// Whether containers using it are pinned to `mems` (the claim's `memoryPinning`, see
    /// [`super::claim_config`]). When not, its edits carry no `DRA_MEMS_<uid>`. Absent from
    /// snapshots of claims that pin, which is how every claim was before configurations.
    #[serde(default = "pinned", skip_serializing_if = "is_pinned")]
    pub memory_pinning: bool,
}

fn pinned() -> bool {
    true
}

impl Default for ResultRecord {
    /// Nothing granted, memory pinned.
    fn default() -> Self {
        Self {
            memory_node: None,
            memory: 0,
            hugepages: BTreeMap::new(),
            request: String::new(),
            device: String::new(),
            cpus: CpuSet::new(),
            mems: NodeSet::new(),
            memory_pinning: true,
        }
    }
}

// serde's skip_serializing_if passes a reference.
#[allow(clippy::trivially_copy_pass_by_ref)]
fn is_zero(n: &u64) -> bool {
    *n == 0
}

// serde's skip_serializing_if passes a reference.
#[allow(clippy::trivially_copy_pass_by_ref)]
fn is_pinned(pinning: &bool) -> bool {
    *pinning
}

/// A claim the policy holds: the durable DRA truth. Part of the durable state: see
/// [`Snapshot`] before adding a field.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HeldClaim {
    /// UID.
    pub uid: String,
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// Pods allowed to use it through the environment fallback.
    pub reserved_for: Vec<String>,
    /// Results in the claim's order.
    pub results: Vec<ResultRecord>,
    /// Taken back from its CDI spec when the saved state did not account for it (see the
    /// module docs): its namespace, name, pods, request names and possibly devices (empty when
    /// unknown) are learnt from the next prepare. Absent from snapshots of other claims.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub adopted: bool,
}

impl HeldClaim {
    /// The lowest snapshot version that holds the claim (see [`Snapshot`]): [`SNAPSHOT_V2`]
    /// when it has a field that some reader of [`SNAPSHOT_V1`] does not know.
    pub fn fields_since(&self) -> u32 {
        let beyond_v1 = |r: &ResultRecord| {
            r.memory_node.is_some() || r.memory != 0 || !r.hugepages.is_empty() || !r.memory_pinning
        };
        if self.adopted || self.results.iter().any(beyond_v1) {
            SNAPSHOT_V2
        } else {
            SNAPSHOT_V1
        }
    }

    /// Every CPU the claim holds.
    pub fn cpus(&self) -> CpuSet {
        self.results
            .iter()
            .fold(CpuSet::new(), |acc, r| acc.union(&r.cpus))
    }

    /// The CPUs and memory nodes of every result for `request`: what a container using it is
    /// told it has.
    pub fn request_cpus(&self, request: &str) -> (CpuSet, NodeSet) {
        self.results
            .iter()
            .filter(|r| r.request == request)
            .fold((CpuSet::new(), NodeSet::new()), |(cpus, mems), r| {
                (cpus.union(&r.cpus), mems.union(&r.mems))
            })
    }

    /// The CDI edits of every result, in result order: the CPUs of its request, and its memory
    /// nodes when it pins memory (a container is told only what it is held to), each under the
    /// claim's UID and, when that differs, under its [`shell_safe`] name.
    pub fn edits(&self) -> Vec<cdi::ContainerEdits> {
        let safe = shell_safe(&self.uid);
        let names: Vec<&str> = if safe == self.uid {
            vec![&self.uid]
        } else {
            vec![&self.uid, &safe]
        };
        self.results
            .iter()
            .map(|r| {
                let (cpus, mems) = self.request_cpus(&r.request);
                // A memory request (individual memory devices) has no CPUs to say.
                let cpu_vars = names
                    .iter()
                    .filter(|_| !cpus.is_empty())
                    .map(|name| format!("{CPUSET_ENV}{name}={cpus}"));
                let mem_vars = names
                    .iter()
                    .filter(|_| r.memory_pinning)
                    .map(|name| format!("{MEMS_ENV}{name}={mems}"));
                let (memory, hugepages) = self.request_memory(&r.request);
                let memory_vars = names
                    .iter()
                    .filter(|_| memory > 0)
                    .map(|name| format!("{MEMORY_ENV}{name}={memory}"));
                let hugepages = hugepages
                    .iter()
                    .map(|(size, bytes)| {
                        format!("{}={}", page_size_name(*size), page_size_name(*bytes))
                    })
                    .collect::<Vec<_>>()
                    .join(",");
                let huge_vars = names
                    .iter()
                    .filter(|_| !hugepages.is_empty())
                    .map(|name| format!("{HUGEPAGES_ENV}{name}={hugepages}"));
                cdi::ContainerEdits::with_env(
                    cpu_vars.chain(mem_vars).chain(memory_vars).chain(huge_vars),
                )
            })
            .collect()
    }

    /// The memory and hugepages every result for `request` holds together.
    pub fn request_memory(&self, request: &str) -> (u64, BTreeMap<u64, u64>) {
        self.results.iter().filter(|r| r.request == request).fold(
            (0, BTreeMap::new()),
            |(memory, mut huge), r| {
                for (size, bytes) in &r.hugepages {
                    *huge.entry(*size).or_default() += bytes;
                }
                (memory + r.memory, huge)
            },
        )
    }

    /// `namespace/name (uid)` for messages.
    pub fn describe(&self) -> String {
        format!("{}/{} ({})", self.namespace, self.name, self.uid)
    }

    /// Takes note of what a prepare of the claim says: pods that share it, and for an adopted
    /// claim what its spec did not say (names, requests, devices it could not tell).
    pub fn learn(&mut self, claim: &Claim) {
        for pod in &claim.reserved_for {
            if !self.reserved_for.contains(pod) {
                self.reserved_for.push(pod.clone());
            }
        }
        if self.adopted {
            self.namespace.clone_from(&claim.namespace);
            self.name.clone_from(&claim.name);
            for (held, asked) in self.results.iter_mut().zip(&claim.results) {
                held.request.clone_from(&asked.request);
                if held.device.is_empty() {
                    held.device.clone_from(&asked.device);
                }
            }
            self.adopted = false;
        }
    }

    /// How `claim`'s allocation results differ from the ones this record was allocated for,
    /// if they do: another number of results, or a result with another request, device or
    /// number of CPUs. `cpus_of` says how many CPUs a result gets (`None` when that cannot be
    /// known, for a device no longer published: then the count is not compared). What an
    /// adopted record does not know (request names; a device it could not tell; the CPUs of
    /// each of a request's results) is not compared. The first difference, in words.
    pub fn difference(
        &self,
        claim: &Claim,
        cpus_of: impl Fn(&AllocationResult) -> Option<u64>,
    ) -> Option<String> {
        if self.results.len() != claim.results.len() {
            return Some(format!(
                "it holds {} allocation results, now asked for {}",
                self.results.len(),
                claim.results.len()
            ));
        }
        self.results
            .iter()
            .zip(&claim.results)
            .enumerate()
            .find_map(|(i, (held, asked))| {
                let n = u64::try_from(held.cpus.len()).unwrap_or(u64::MAX);
                let m = if self.adopted {
                    n
                } else {
                    cpus_of(asked).unwrap_or(n)
                };
                let device_known = !(self.adopted && held.device.is_empty());
                if !self.adopted && held.request != asked.request {
                    Some(format!(
                        "result {i} is for request {}, now asked for request {}",
                        held.request, asked.request
                    ))
                } else if (device_known && held.device != asked.device) || n != m {
                    Some(format!(
                        "result {i} (request {}) is on {} with {n} {}, now asked on {} with {m} {}",
                        held.request,
                        held.device,
                        cpus_word(n),
                        asked.device,
                        cpus_word(m),
                    ))
                } else {
                    None
                }
            })
    }
}

/// What claim `uid`'s CDI edits (one per result, as [`HeldClaim::edits`] writes them) grant:
/// per result, the CPUs of its request (none for a memory device's result, which says its
/// memory instead) and, when it pins memory, the memory nodes. Reads the
/// names under the exact UID, which every spec carries.
pub fn granted(
    uid: &str,
    edits: &[cdi::ContainerEdits],
) -> Result<Vec<(CpuSet, Option<NodeSet>)>, String> {
    if edits.is_empty() {
        return Err("its spec has no devices".into());
    }
    let value = |edit: &cdi::ContainerEdits, prefix: &str| {
        let name = format!("{prefix}{uid}=");
        edit.env
            .iter()
            .find_map(|e| e.strip_prefix(&name).map(str::to_owned))
    };
    edits
        .iter()
        .enumerate()
        .map(|(i, edit)| {
            let Some(cpus) = value(edit, CPUSET_ENV) else {
                // A memory device's result says its memory, not CPUs.
                if value(edit, MEMORY_ENV).is_some() || value(edit, HUGEPAGES_ENV).is_some() {
                    let mems = value(edit, MEMS_ENV)
                        .map(|m| {
                            m.parse::<NodeSet>()
                                .map_err(|e| format!("device {i}: {MEMS_ENV}{uid}={m}: {e}"))
                        })
                        .transpose()?;
                    return Ok((CpuSet::new(), mems));
                }
                return Err(format!("device {i} sets no {CPUSET_ENV}{uid}"));
            };
            let cpus: CpuSet = cpus
                .parse()
                .map_err(|e| format!("device {i}: {CPUSET_ENV}{uid}={cpus}: {e}"))?;
            if cpus.is_empty() {
                return Err(format!("device {i}: {CPUSET_ENV}{uid} is empty"));
            }
            let mems = value(edit, MEMS_ENV)
                .map(|m| {
                    m.parse::<NodeSet>()
                        .map_err(|e| format!("device {i}: {MEMS_ENV}{uid}={m}: {e}"))
                })
                .transpose()?;
            Ok((cpus, mems))
        })
        .collect()
}

/// Bytes of memory, and bytes of hugepages by page size.
pub type HeldMemory = (u64, BTreeMap<u64, u64>);

/// What claim `uid`'s CDI edits say each result's request holds of memory and hugepages
/// (`DRA_MEMORY_<uid>`, `DRA_HUGEPAGES_<uid>`; nothing when they are absent).
pub fn granted_memory(uid: &str, edits: &[cdi::ContainerEdits]) -> Result<Vec<HeldMemory>, String> {
    let value = |edit: &cdi::ContainerEdits, prefix: &str| {
        let name = format!("{prefix}{uid}=");
        edit.env
            .iter()
            .find_map(|e| e.strip_prefix(&name).map(str::to_owned))
    };
    let bytes = |text: &str, what: &str| -> Result<u64, String> {
        let q: crate::quantity::Quantity = text.parse().map_err(|e| format!("{what}: {e}"))?;
        Ok(q.units_ceil())
    };
    edits
        .iter()
        .enumerate()
        .map(|(i, edit)| {
            let memory = match value(edit, MEMORY_ENV) {
                Some(m) => bytes(&m, &format!("device {i}: {MEMORY_ENV}{uid}"))?,
                None => 0,
            };
            let mut hugepages = BTreeMap::new();
            if let Some(h) = value(edit, HUGEPAGES_ENV) {
                for entry in h.split(',').filter(|e| !e.is_empty()) {
                    let at = format!("device {i}: {HUGEPAGES_ENV}{uid}={h}");
                    let (size, amount) = entry
                        .split_once('=')
                        .ok_or_else(|| format!("{at}: {entry:?} has no `=`"))?;
                    hugepages.insert(bytes(size, &at)?, bytes(amount, &at)?);
                }
            }
            Ok((memory, hugepages))
        })
        .collect()
}

fn cpus_word(n: u64) -> &'static str {
    if n == 1 { "cpu" } else { "cpus" }
}

/// The durable state: the claims, by UID.
///
/// # Versions
///
/// Every build since the first state file (755633b) restores only a snapshot whose `version`
/// is one it reads, and until version 2 that was 1 alone. Before version 2 the records did not
/// refuse fields they did not know, so a build older than a field dropped it without a word
/// (`memory_pinning` came with dd2cc73, `adopted` with 6c8db4b, `memory_node`, `memory` and
/// `hugepages` with 5696b47): it would pin memory a claim leaves unpinned, treat a claim taken
/// back from its spec as an ordinary one, or forget the memory and hugepages a claim holds
/// and, rolled forward again, promise them twice. Hence:
///
/// - version 1 ([`SNAPSHOT_V1`]) is written when every claim is one each of those builds
///   reads whole: CPUs and pinned memory nodes, nothing more ([`HeldClaim::fields_since`]);
/// - version 2 ([`SNAPSHOT_V2`]) when a claim has a field some reader of version 1 would drop,
///   which every one of them refuses by its version (`snapshot version 2 is not 1`);
/// - a build reads every version up to its own (builds before version 2 wrote version 1 with
///   every field they had, which reads the same) and refuses a newer one by its version, and
///   any field it does not know by its name (`deny_unknown_fields`): a snapshot is never read
///   in part.
///
/// A new field is written only when it matters (`skip_serializing_if` its old meaning) and
/// raises the version of the snapshots that have it; `tests/fixtures/state` keeps a state of
/// every format written so far, which the current build must read.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Snapshot {
    /// Format version: the lowest that holds every claim (see above).
    pub version: u32,
    /// Every claim held.
    pub claims: Vec<HeldClaim>,
}

/// The snapshot version every build reads whole: claims holding CPUs and pinned memory nodes.
pub const SNAPSHOT_V1: u32 = 1;

/// The snapshot version of claims that are adopted, hold memory or hugepages, or leave memory
/// unpinned: fields readers of [`SNAPSHOT_V1`] would drop.
pub const SNAPSHOT_V2: u32 = 2;

/// The newest snapshot version this build writes and reads.
pub const SNAPSHOT_VERSION: u32 = SNAPSHOT_V2;

impl Snapshot {
    /// The snapshot of `claims`, with the lowest version that holds them all.
    pub fn of(claims: Vec<HeldClaim>) -> Self {
        let version = claims
            .iter()
            .map(HeldClaim::fields_since)
            .max()
            .unwrap_or(SNAPSHOT_V1);
        Self { version, claims }
    }
}

/// The claims and result indexes `container` uses among `claims`, whose devices are CDI devices
/// of vendor `driver`: see the module docs.
pub fn used_by(
    container: &Container,
    claims: &BTreeMap<String, HeldClaim>,
    driver: &str,
) -> BTreeMap<String, Vec<usize>> {
    let mut used: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    for dev in &container.cdi_devices {
        // The resource manager names a claim's devices through the cdi crate; parse them back
        // the same way (which checks the class). Devices of other drivers do not parse, or name
        // another vendor, or no claim of ours.
        if let Ok(d) = cdi::claim_of_device(dev)
            && d.vendor == driver
            && claims
                .get(d.uid.as_str())
                .is_some_and(|c| d.index < c.results.len())
        {
            used.entry(d.uid.as_str().to_owned())
                .or_default()
                .push(d.index);
        }
    }
    if !used.is_empty() {
        return dedup(used);
    }
    for entry in &container.env {
        let Some((name, value)) = entry.split_once('=') else {
            continue;
        };
        let Some(uid) = name.strip_prefix(CPUSET_ENV) else {
            continue;
        };
        // The exact UID, or the shell-safe name of one (see the module docs).
        let Some(claim) = claims
            .get(uid)
            .or_else(|| claims.values().find(|c| shell_safe(&c.uid) == uid))
        else {
            continue;
        };
        // The value says which request.
        let matching: Vec<usize> = claim
            .results
            .iter()
            .enumerate()
            .filter(|(_, r)| claim.request_cpus(&r.request).0.to_string() == value)
            .map(|(i, _)| i)
            .collect();
        let indexes = if claim.adopted {
            // Its pods are unknown: only exactly what its spec gave counts.
            if matching.is_empty() {
                continue;
            }
            matching
        } else if !claim.reserved_for.contains(&container.pod.uid) {
            continue;
        } else if matching.is_empty() {
            // A value we did not write means all of them.
            (0..claim.results.len()).collect()
        } else {
            matching
        };
        // The memory requests (individual memory devices, no CPUs to match) it was told of.
        let told = |prefix: &str| {
            container.env.iter().any(|e| {
                [claim.uid.clone(), shell_safe(&claim.uid)]
                    .iter()
                    .any(|n| e.starts_with(&format!("{prefix}{n}=")))
            })
        };
        let memory: Vec<usize> = if told(MEMORY_ENV) || told(HUGEPAGES_ENV) {
            claim
                .results
                .iter()
                .enumerate()
                .filter(|(_, r)| r.cpus.is_empty())
                .map(|(i, _)| i)
                .collect()
        } else {
            Vec::new()
        };
        used.entry(claim.uid.clone())
            .or_default()
            .extend(indexes.into_iter().chain(memory));
    }
    dedup(used)
}

fn dedup(mut used: BTreeMap<String, Vec<usize>>) -> BTreeMap<String, Vec<usize>> {
    for v in used.values_mut() {
        v.sort_unstable();
        v.dedup();
    }
    used
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(uid: &str, pods: &[&str]) -> HeldClaim {
        let result = |request: &str, cpus: &str| ResultRecord {
            request: request.into(),
            device: "numa0".into(),
            cpus: cpus.parse().unwrap(),
            mems: "0".parse().unwrap(),
            memory_pinning: true,
            ..ResultRecord::default()
        };
        HeldClaim {
            uid: uid.into(),
            namespace: "ns".into(),
            name: "c".into(),
            reserved_for: pods.iter().map(|p| (*p).to_owned()).collect(),
            results: vec![result("a", "2-3"), result("b", "4-5")],
            adopted: false,
        }
    }

    /// The fields of each record that every reader of snapshot version 1 knows; every other
    /// field makes a snapshot version 2 when present (see [`Snapshot`]).
    const CLAIM_FIELDS_V1: &[&str] = &["uid", "namespace", "name", "reserved_for", "results"];
    const RESULT_FIELDS_V1: &[&str] = &["request", "device", "cpus", "mems"];

    fn keys(v: &serde_json::Value) -> Vec<&str> {
        v.as_object().unwrap().keys().map(String::as_str).collect()
    }

    /// A change that sets one field of a claim away from its default.
    type SetField = fn(&mut HeldClaim);

    /// The changes that each set one field beyond version 1 on a claim that has none.
    fn beyond_v1() -> Vec<(&'static str, SetField)> {
        vec![
            ("adopted", |c| c.adopted = true),
            ("memory_node", |c| c.results[0].memory_node = Some(0)),
            ("memory", |c| c.results[0].memory = 1 << 30),
            ("hugepages", |c| {
                c.results[0].hugepages.insert(2 << 20, 64 << 20);
            }),
            ("memory_pinning", |c| c.results[0].memory_pinning = false),
        ]
    }

    #[test]
    fn every_field_of_the_durable_records_has_a_snapshot_version() {
        let mut full = held("u1", &["pod"]);
        for (_, set) in beyond_v1() {
            set(&mut full);
        }
        let json = serde_json::to_value(Snapshot::of(vec![full])).unwrap();
        assert_eq!(keys(&json), ["claims", "version"]);
        // A field not listed here fails this test until the snapshot versions say who reads it.
        let beyond: Vec<&str> = beyond_v1().into_iter().map(|(f, _)| f).collect();
        for (record, v1) in [
            (&json["claims"][0], CLAIM_FIELDS_V1),
            (&json["claims"][0]["results"][0], RESULT_FIELDS_V1),
        ] {
            for field in keys(record) {
                assert!(
                    v1.contains(&field) || beyond.contains(&field),
                    "{field}: which snapshot version holds it?"
                );
            }
        }
        assert_eq!(json["version"], SNAPSHOT_V2);
    }

    #[test]
    fn a_snapshot_is_version_1_unless_a_claim_has_a_field_some_reader_of_1_drops() {
        let plain = held("u1", &["pod"]);
        assert_eq!(Snapshot::of(Vec::new()).version, SNAPSHOT_V1);
        assert_eq!(Snapshot::of(vec![plain.clone()]).version, SNAPSHOT_V1);
        let json = serde_json::to_value(Snapshot::of(vec![plain.clone()])).unwrap();
        let sorted = |fields: &[&'static str]| {
            let mut fields = fields.to_vec();
            fields.sort_unstable();
            fields
        };
        let mut got = keys(&json["claims"][0]);
        got.sort_unstable();
        assert_eq!(got, sorted(CLAIM_FIELDS_V1));
        let mut got = keys(&json["claims"][0]["results"][0]);
        got.sort_unstable();
        assert_eq!(got, sorted(RESULT_FIELDS_V1));
        for (field, set) in beyond_v1() {
            let mut claim = held("u2", &["pod"]);
            set(&mut claim);
            let snap = Snapshot::of(vec![plain.clone(), claim]);
            assert_eq!(snap.version, SNAPSHOT_V2, "{field}");
            let json = serde_json::to_string(&snap).unwrap();
            assert!(json.contains(&format!("\"{field}\"")), "{field}: {json}");
        }
    }

    #[test]
    fn what_the_edits_grant_reads_back_from_them() {
        let uid = "0b6c2a4e-7f3d-4c5e-9a1b-2c3d4e5f6a7b";
        let mut claim = held(uid, &[]);
        claim.results[1].memory_pinning = false;
        assert_eq!(
            granted(uid, &claim.edits()).unwrap(),
            [
                ("2-3".parse().unwrap(), Some("0".parse().unwrap())),
                ("4-5".parse().unwrap(), None)
            ]
        );
        let bad = |env: &[&str]| {
            granted(
                uid,
                &[cdi::ContainerEdits::with_env(
                    env.iter().map(|e| (*e).to_owned()),
                )],
            )
            .unwrap_err()
        };
        assert_eq!(granted(uid, &[]).unwrap_err(), "its spec has no devices");
        assert_eq!(
            bad(&["X=1", "DRA_CPUSET_other=1"]),
            format!("device 0 sets no DRA_CPUSET_{uid}")
        );
        assert!(
            bad(&[&format!("DRA_CPUSET_{uid}=x")])
                .starts_with(&format!("device 0: DRA_CPUSET_{uid}=x: "))
        );
        assert_eq!(
            bad(&[&format!("DRA_CPUSET_{uid}=")]),
            format!("device 0: DRA_CPUSET_{uid} is empty")
        );
        assert!(
            bad(&[&format!("DRA_CPUSET_{uid}=1"), &format!("DRA_MEMS_{uid}=z")])
                .starts_with(&format!("device 0: DRA_MEMS_{uid}=z: "))
        );
    }

    #[test]
    fn an_adopted_claim_is_used_by_the_exact_environment_of_any_pod_and_learns_the_rest() {
        let uid = "u1";
        let mut claim = held(uid, &[]);
        claim.adopted = true;
        claim.results[0].request = "adopted-0".into();
        claim.results[1].request = "adopted-1".into();
        claim.results[1].device = String::new();
        let claims = BTreeMap::from([(uid.to_owned(), claim.clone())]);
        let mut c = Container::default();
        c.pod.uid = "pod-a".into();
        c.env = vec!["DRA_CPUSET_u1=4-5".into()];
        let used = |c: &Container| used_by(c, &claims, "cpu.resmgr.io");
        assert_eq!(used(&c), BTreeMap::from([(uid.to_owned(), vec![1])]));
        c.env = vec!["DRA_CPUSET_u1=4-6".into()];
        assert!(used(&c).is_empty(), "not what its spec gave");

        let result = |request: &str, device: &str| AllocationResult {
            request: request.into(),
            pool: "node".into(),
            device: device.into(),
            share_id: None,
            consumed_capacity: BTreeMap::new(),
        };
        let mut asked = Claim {
            uid: uid.into(),
            namespace: "ns2".into(),
            name: "c2".into(),
            reserved_for: vec!["pod-a".into()],
            results: vec![result("r0", "numa0"), result("r1", "numa1")],
            config: Vec::new(),
            pod_claim_name: None,
        };
        let count = |_: &AllocationResult| Some(7);
        assert_eq!(
            claim.difference(&asked, count),
            None,
            "its requests, its second device and its counts are unknown"
        );
        asked.results[0].device = "numa3".into();
        assert!(
            claim.difference(&asked, count).is_some(),
            "its first device is known"
        );
        asked.results[0].device = "numa0".into();
        claim.learn(&asked);
        assert!(!claim.adopted);
        assert_eq!(
            (
                claim.namespace.as_str(),
                claim.name.as_str(),
                claim.reserved_for.clone()
            ),
            ("ns2", "c2", vec!["pod-a".to_owned()])
        );
        assert_eq!(
            (
                claim.results[1].request.as_str(),
                claim.results[1].device.as_str()
            ),
            ("r1", "numa1")
        );
        asked.results[1].request = "r9".into();
        assert_eq!(
            claim.difference(&asked, |_| None).unwrap(),
            "result 1 is for request r1, now asked for request r9"
        );
    }

    #[test]
    fn containers_use_claims_by_cdi_device_or_by_environment_of_a_reserved_pod() {
        let uid = "0b6c2a4e-7f3d-4c5e-9a1b-2c3d4e5f6a7b";
        let claims = BTreeMap::from([(uid.to_owned(), held(uid, &["pod-a"]))]);
        let mut c = Container::default();
        c.pod.uid = "pod-b".into();
        c.cdi_devices = vec![
            format!("cpu.resmgr.io/device=claim-{uid}-1"),
            "gpu.example.com/device=claim-someone-elses-0".into(),
            format!("gpu.example.com/device=claim-{uid}-0"),
            format!("cpu.resmgr.io/gpu=claim-{uid}-0"),
            format!("cpu.resmgr.io/device=claim-{uid}-7"),
        ];
        // The device is proof enough, whatever the pod; unknown claims and indexes, and our
        // claim's name under another vendor or class, are ignored.
        let used = |c: &Container| used_by(c, &claims, "cpu.resmgr.io");
        assert_eq!(used(&c), BTreeMap::from([(uid.to_owned(), vec![1])]));

        c.cdi_devices.clear();
        c.env = vec![format!("{CPUSET_ENV}{uid}=4-5")];
        assert!(used(&c).is_empty(), "pod-b is not reserved for");
        c.pod.uid = "pod-a".into();
        assert_eq!(used(&c), BTreeMap::from([(uid.to_owned(), vec![1])]));
        c.env = vec![format!("{CPUSET_ENV}{uid}=edited")];
        assert_eq!(used(&c), BTreeMap::from([(uid.to_owned(), vec![0, 1])]));
    }

    #[test]
    fn edits_also_name_a_hyphenated_uid_the_way_a_shell_keeps_it() {
        let uid = "0b6c2a4e-7f3d-4c5e-9a1b-2c3d4e5f6a7b";
        let safe = "0b6c2a4e_7f3d_4c5e_9a1b_2c3d4e5f6a7b";
        let mut claim = held(uid, &["pod-a"]);
        assert_eq!(
            claim.edits()[0].env,
            [
                format!("DRA_CPUSET_{uid}=2-3"),
                format!("DRA_CPUSET_{safe}=2-3"),
                format!("DRA_MEMS_{uid}=0"),
                format!("DRA_MEMS_{safe}=0"),
            ]
        );
        claim.results[1].memory_pinning = false;
        assert_eq!(
            claim.edits()[1].env,
            [
                format!("DRA_CPUSET_{uid}=4-5"),
                format!("DRA_CPUSET_{safe}=4-5")
            ]
        );
        // A UID a shell already accepts is named once.
        assert_eq!(
            held("u1", &[]).edits()[0].env,
            ["DRA_CPUSET_u1=2-3", "DRA_MEMS_u1=0"]
        );
    }

    /// A claim of the individual model: two CPU devices and a memory device.
    fn with_memory_device(uid: &str) -> HeldClaim {
        let mut claim = held(uid, &["pod-a"]);
        for (r, device) in claim.results.iter_mut().zip(["cpu2", "cpu3"]) {
            r.request = "cpus".into();
            r.device = device.into();
        }
        claim.results[0].cpus = "2".parse().unwrap();
        claim.results[1].cpus = "3".parse().unwrap();
        claim.results.push(ResultRecord {
            request: "memory".into(),
            device: "memory0".into(),
            mems: "0".parse().unwrap(),
            memory_node: Some(0),
            memory: 1 << 30,
            ..ResultRecord::default()
        });
        claim
    }

    #[test]
    fn a_memory_device_result_says_its_memory_and_node_and_reads_back_without_cpus() {
        let claim = with_memory_device("u1");
        let edits = claim.edits();
        assert_eq!(edits[2].env, ["DRA_MEMS_u1=0", "DRA_MEMORY_u1=1073741824"]);
        assert_eq!(
            granted("u1", &edits).unwrap(),
            [
                ("2-3".parse().unwrap(), Some("0".parse().unwrap())),
                ("2-3".parse().unwrap(), Some("0".parse().unwrap())),
                (CpuSet::new(), Some("0".parse().unwrap())),
            ]
        );
        assert_eq!(
            granted_memory("u1", &edits).unwrap()[2],
            (1 << 30, BTreeMap::new())
        );
    }

    #[test]
    fn the_environment_fallback_uses_memory_results_only_when_told_the_memory() {
        let claims = BTreeMap::from([("u1".to_owned(), with_memory_device("u1"))]);
        let mut c = Container::default();
        c.pod.uid = "pod-a".into();
        c.env = vec!["DRA_CPUSET_u1=2-3".into()];
        let used = |c: &Container| used_by(c, &claims, "cpu.resmgr.io");
        assert_eq!(used(&c), BTreeMap::from([("u1".to_owned(), vec![0, 1])]));
        c.env.push("DRA_MEMORY_u1=1073741824".into());
        assert_eq!(used(&c), BTreeMap::from([("u1".to_owned(), vec![0, 1, 2])]));
    }

    #[test]
    fn the_environment_fallback_accepts_the_shell_safe_name() {
        let uid = "0b6c2a4e-7f3d-4c5e-9a1b-2c3d4e5f6a7b";
        let claims = BTreeMap::from([(uid.to_owned(), held(uid, &["pod-a"]))]);
        let mut c = Container::default();
        c.pod.uid = "pod-a".into();
        // All a shell wrapper passes on: the names with underscores.
        c.env = vec![format!("DRA_CPUSET_{}=4-5", shell_safe(uid))];
        let used = |c: &Container| used_by(c, &claims, "cpu.resmgr.io");
        assert_eq!(used(&c), BTreeMap::from([(uid.to_owned(), vec![1])]));
        // Both names, as the runtime injects them, are one use.
        c.env.push(format!("DRA_CPUSET_{uid}=4-5"));
        assert_eq!(used(&c), BTreeMap::from([(uid.to_owned(), vec![1])]));
        // Still only for the claim's own pods.
        c.pod.uid = "pod-b".into();
        assert!(used(&c).is_empty());
    }

    #[test]
    fn results_of_one_request_tell_their_containers_all_of_its_cpus() {
        let mut claim = held("u1", &["pod-a"]);
        for r in &mut claim.results {
            r.request = "cpus".into();
        }
        claim.results[1].mems = "1".parse().unwrap();
        let env: Vec<Vec<String>> = claim.edits().into_iter().map(|e| e.env).collect();
        let all = vec!["DRA_CPUSET_u1=2-5".to_owned(), "DRA_MEMS_u1=0-1".to_owned()];
        assert_eq!(env, [all.clone(), all]);
        // Through the environment, that value means both results.
        let claims = BTreeMap::from([("u1".to_owned(), claim)]);
        let mut c = Container::default();
        c.pod.uid = "pod-a".into();
        c.env = vec![format!("{CPUSET_ENV}u1=2-5")];
        assert_eq!(
            used_by(&c, &claims, "cpu.resmgr.io"),
            BTreeMap::from([("u1".to_owned(), vec![0, 1])])
        );
    }
}
