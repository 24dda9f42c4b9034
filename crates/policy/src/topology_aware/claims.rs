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
//! A result whose claim configuration turns `memoryPinning` off ([`super::claim_config`]) gets
//! no `DRA_MEMS_<uid>`, and containers using it get no memory nodes from it.
//!
//! Records saved by earlier versions (results on grouped `numa<N>` devices) restore as they are:
//! a record says which CPUs a result holds, whatever devices are published now.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::{
    idset::{CpuSet, NodeSet},
    model::{AllocationResult, Claim, Container},
};

/// The prefix of the environment variable carrying a claim's CPUs.
pub const CPUSET_ENV: &str = "DRA_CPUSET_";
/// The prefix of the environment variable carrying a claim's memory nodes.
pub const MEMS_ENV: &str = "DRA_MEMS_";
/// One allocation result of a claim, as granted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResultRecord {
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

// serde's skip_serializing_if passes a reference.
#[allow(clippy::trivially_copy_pass_by_ref)]
fn is_pinned(pinning: &bool) -> bool {
    *pinning
}

/// A claim the policy holds: the durable DRA truth.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClaimRecord {
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
}

impl ClaimRecord {
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
                let cpu_vars = names
                    .iter()
                    .map(|name| format!("{CPUSET_ENV}{name}={cpus}"));
                let mem_vars = names
                    .iter()
                    .filter(|_| r.memory_pinning)
                    .map(|name| format!("{MEMS_ENV}{name}={mems}"));
                cdi::ContainerEdits::with_env(cpu_vars.chain(mem_vars))
            })
            .collect()
    }

    /// `namespace/name (uid)` for messages.
    pub fn describe(&self) -> String {
        format!("{}/{} ({})", self.namespace, self.name, self.uid)
    }

    /// How `claim`'s allocation results differ from the ones this record was allocated for,
    /// if they do: another number of results, or a result with another request, device or
    /// number of CPUs. `cpus_of` says how many CPUs a result gets (`None` when that cannot be
    /// known, for a device no longer published: then the count is not compared). The first
    /// difference, in words.
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
                let m = cpus_of(asked).unwrap_or(n);
                if held.request != asked.request {
                    Some(format!(
                        "result {i} is for request {}, now asked for request {}",
                        held.request, asked.request
                    ))
                } else if held.device != asked.device || n != m {
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

fn cpus_word(n: u64) -> &'static str {
    if n == 1 { "cpu" } else { "cpus" }
}

/// The durable state: the claims, by UID.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Snapshot {
    /// Format version, 1.
    pub version: u32,
    /// Every claim held.
    pub claims: Vec<ClaimRecord>,
}

/// A claim UID as a shell accepts it in a variable name: hyphens as underscores
/// (`DRA_CPUSET_0b6c2a4e_7f3d_…`). Kubernetes UIDs are hex digits and hyphens, so this is
/// the UID's only change.
pub fn shell_safe(uid: &str) -> String {
    uid.replace('-', "_")
}

/// The claims and result indexes `container` uses among `claims`, whose devices are CDI devices
/// of vendor `driver`: see the module docs.
pub fn used_by(
    container: &Container,
    claims: &BTreeMap<String, ClaimRecord>,
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
        if !claim.reserved_for.contains(&container.pod.uid) {
            continue;
        }
        // The value says which request; a value we did not write means all of them.
        let matching: Vec<usize> = claim
            .results
            .iter()
            .enumerate()
            .filter(|(_, r)| claim.request_cpus(&r.request).0.to_string() == value)
            .map(|(i, _)| i)
            .collect();
        let indexes = if matching.is_empty() {
            (0..claim.results.len()).collect()
        } else {
            matching
        };
        used.entry(claim.uid.clone()).or_default().extend(indexes);
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

    fn held(uid: &str, pods: &[&str]) -> ClaimRecord {
        let result = |request: &str, cpus: &str| ResultRecord {
            request: request.into(),
            device: "numa0".into(),
            cpus: cpus.parse().unwrap(),
            mems: "0".parse().unwrap(),
            memory_pinning: true,
        };
        ClaimRecord {
            uid: uid.into(),
            namespace: "ns".into(),
            name: "c".into(),
            reserved_for: pods.iter().map(|p| (*p).to_owned()).collect(),
            results: vec![result("a", "2-3"), result("b", "4-5")],
        }
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
