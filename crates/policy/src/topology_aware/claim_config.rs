//! A claim's opaque configuration for the topology-aware policy: strict decoding, and the
//! settings each allocation result gets after precedence.
//!
//! The parameters of a [`ClaimConfig`] for our driver must be a `CpuConfig`:
//!
//! ```yaml
//! apiVersion: resmgr.io/v1alpha1
//! kind: CpuConfig
//! memoryPinning: false   # default true
//! fullCores: true        # default false
//! memoryKinds: [dram, hbm]   # default [dram]
//! cpus: "4-7"            # default: the policy picks
//! memoryNodes: "1"       # default: the nodes of the cpus (and memoryKinds)
//! ```
//!
//! - `memoryPinning` (default `true`): containers using the result are pinned to its NUMA
//!   node's memory and the edits carry `DRA_MEMS_<uid>`. With `false` the memory nodes are
//!   left to the runtime (no `cpuset.mems` is set, no memory is charged to the node) and the
//!   edits carry no `DRA_MEMS_<uid>`, so what the container is told and what it gets agree.
//! - `fullCores` (default `false`): the result's CPUs must be whole cores (every SMT sibling of
//!   each core taken), so no other workload shares a core with it. Without it whole cores are
//!   still preferred, but a core may be split when the count asks for it or whole cores are
//!   short. A count that whole free cores cannot make up exactly is refused as not fitting.
//! - `memoryKinds` (default `[dram]`; any of `dram`, `hbm`, `pmem`, `cxl`, as hwloc classes
//!   NUMA nodes, see [`crate::topology`]): which kinds of memory node containers using the
//!   result may allocate from, when it pins memory. `dram` is the NUMA node of the result's
//!   CPUs, where its `memory` capacity is charged; the others are the memory-only nodes
//!   attached to that node (their closest node with CPUs). Memory-only nodes are not published,
//!   so the scheduler does not allocate them and they are not reserved for the claim: naming
//!   them lets the claim's containers use them besides (or, without `dram`, instead of) its
//!   node's DRAM. A kind the result's node has none of, and a list without `dram` for a
//!   result that holds memory of its node, refuse the claim at prepare
//!   (`plan_claim.rs`), naming the request and what it holds. Without pinning it has no
//!   effect.
//!
//! - `cpus` (default: unset): exactly the CPUs the request gets, in the kernel's list format,
//!   chosen outside Kubernetes (a batch scheduler such as Slurm picking cores for a job). Each
//!   CPU must lie in a device the scheduler allocated to the request and be free; each result
//!   gets the named CPUs of its device, exactly as many as it consumed (all of an individual
//!   device's). Otherwise the claim is refused at prepare, naming the CPUs and why (not in the
//!   request's devices: reserved, not claimable, on another device; held by another claim; more
//!   or fewer than the scheduler allocated; a core split on a whole-core device): never other
//!   CPUs instead (`plan_claim.rs`). It names one request's CPUs, so a configuration with it
//!   must apply to one request of the claim, and it comes from the claim, not its DeviceClass
//!   (every claim of the class would name the same CPUs).
//! - `memoryNodes` (default: unset): exactly the memory nodes containers using the request are
//!   pinned to, in the kernel's list format. Each must be the NUMA node of the request's CPUs
//!   or memory, or a memory-only node attached to one of them of a kind `memoryKinds` allows;
//!   a node whose memory the request holds must be among them. It needs memory pinning, and
//!   comes from the claim like `cpus`.
//!
//! All five are decided at allocation; what a claim got is kept with its record, so a restart
//! changes nothing and re-preparing the claim returns the same edits.
//!
//! Decoding is strict: a wrong or missing `apiVersion` or `kind`, a field this version does not
//! know, or a value of the wrong type refuses the claim with [`PolicyError::ClaimConfig`],
//! naming the claim, the requests the configuration applies to, and the field. Every
//! configuration for our driver is decoded, also one that applies to no result of ours: a
//! mistake is reported, not ignored. Configurations combine per [`ClaimConfig`]'s rule (class,
//! then claim; later ones override earlier ones field by field).

use serde::Deserialize;

use crate::{
    api::PolicyError,
    idset::{CpuSet, NodeSet},
    model::{Claim, ClaimConfig, ConfigSource},
    topology::MemoryKind,
};

/// The `apiVersion` of our configuration.
pub const API_VERSION: &str = "resmgr.io/v1alpha1";
/// The `kind` of our configuration.
pub const KIND: &str = "CpuConfig";

/// The parameters as written; an unset field leaves the value of an earlier configuration.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct CpuConfig {
    // Checked before decoding (so a config of another version says so rather than naming
    // some field it has); declared so that strict decoding accepts them.
    #[serde(rename = "apiVersion")]
    _api_version: String,
    #[serde(rename = "kind")]
    _kind: String,
    memory_pinning: Option<bool>,
    full_cores: Option<bool>,
    memory_kinds: Option<Vec<Kind>>,
    cpus: Option<String>,
    memory_nodes: Option<String>,
}

/// A configuration decoded: its fields, and the sets `cpus` and `memoryNodes` name.
#[derive(Debug, Clone, Default)]
struct Decoded {
    fields: CpuConfig,
    cpus: Option<CpuSet>,
    memory_nodes: Option<NodeSet>,
}

/// A memory kind as written in a configuration (lower case, like the `memory-type`
/// annotation).
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "lowercase")]
enum Kind {
    Dram,
    Hbm,
    Pmem,
    Cxl,
}

impl From<Kind> for MemoryKind {
    fn from(kind: Kind) -> Self {
        match kind {
            Kind::Dram => Self::Dram,
            Kind::Hbm => Self::Hbm,
            Kind::Pmem => Self::Pmem,
            Kind::Cxl => Self::Cxl,
        }
    }
}

/// What one allocation result gets, after precedence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// Pin containers to the result's NUMA memory.
    pub memory_pinning: bool,
    /// Take whole cores only.
    pub full_cores: bool,
    /// The kinds of memory node its containers may use: sorted, never empty.
    pub memory_kinds: Vec<MemoryKind>,
    /// Exactly the CPUs its request gets (`cpus`), when chosen outside.
    pub cpus: Option<CpuSet>,
    /// Exactly the memory nodes its containers are pinned to (`memoryNodes`).
    pub memory_nodes: Option<NodeSet>,
}

impl Default for Settings {
    /// What a claim without configuration gets.
    fn default() -> Self {
        Self {
            memory_pinning: true,
            full_cores: false,
            memory_kinds: vec![MemoryKind::Dram],
            cpus: None,
            memory_nodes: None,
        }
    }
}

impl Settings {
    fn apply(&mut self, decoded: &Decoded) {
        let config = &decoded.fields;
        if let Some(v) = config.memory_pinning {
            self.memory_pinning = v;
        }
        if let Some(v) = config.full_cores {
            self.full_cores = v;
        }
        if let Some(kinds) = &config.memory_kinds {
            let mut kinds: Vec<MemoryKind> = kinds.iter().map(|&k| k.into()).collect();
            kinds.sort_unstable();
            kinds.dedup();
            self.memory_kinds = kinds;
        }
        if let Some(cpus) = &decoded.cpus {
            self.cpus = Some(cpus.clone());
        }
        if let Some(nodes) = &decoded.memory_nodes {
            self.memory_nodes = Some(nodes.clone());
        }
    }
}

/// The settings of each of `claim`'s results, in result order; a configuration that does not
/// decode refuses the whole claim. See the module docs.
pub fn settings(claim: &Claim) -> Result<Vec<Settings>, PolicyError> {
    let decoded = claim
        .config
        .iter()
        .map(|c| decode(claim, c).map(|d| (c, d)))
        .collect::<Result<Vec<_>, _>>()?;
    for (config, decoded) in &decoded {
        one_request(claim, config, decoded)?;
    }
    Ok(claim
        .results
        .iter()
        .map(|r| {
            let mut s = Settings::default();
            for c in claim.configs_for(&r.request) {
                // Every config was decoded above; find it by identity, not by value (two equal
                // configs decode the same anyway).
                if let Some((_, d)) = decoded.iter().find(|(x, _)| std::ptr::eq(*x, c)) {
                    s.apply(d);
                }
            }
            s
        })
        .collect())
}

/// A configuration naming CPUs or memory nodes names those of one request: refused when it
/// applies to results of several.
fn one_request(claim: &Claim, config: &ClaimConfig, decoded: &Decoded) -> Result<(), PolicyError> {
    let field = if decoded.cpus.is_some() {
        "cpus"
    } else if decoded.memory_nodes.is_some() {
        "memoryNodes"
    } else {
        return Ok(());
    };
    let requests: std::collections::BTreeSet<&str> = claim
        .results
        .iter()
        .filter(|r| config.applies_to(&r.request))
        .map(|r| {
            r.request
                .split_once('/')
                .map_or(r.request.as_str(), |(base, _)| base)
        })
        .collect();
    if requests.len() > 1 {
        return Err(refusal(
            claim,
            config,
            field,
            format!(
                "it names the cpus and memory nodes of one request, but this configuration applies to requests {}: list one request in its requests",
                requests.into_iter().collect::<Vec<_>>().join(", ")
            ),
        ));
    }
    Ok(())
}

fn refusal(claim: &Claim, config: &ClaimConfig, field: &str, reason: String) -> PolicyError {
    PolicyError::ClaimConfig {
        claim: format!("{}/{} ({})", claim.namespace, claim.name, claim.uid),
        requests: describe_requests(config),
        field: field.to_owned(),
        reason,
    }
}

fn decode(claim: &Claim, config: &ClaimConfig) -> Result<Decoded, PolicyError> {
    let refuse = |field: &str, reason: String| refusal(claim, config, field, reason);
    let Some(object) = config.parameters.as_object() else {
        return Err(refuse(
            "parameters",
            format!("want a {KIND} object, got {}", config.parameters),
        ));
    };
    for (field, want) in [("apiVersion", API_VERSION), ("kind", KIND)] {
        match object.get(field) {
            Some(serde_json::Value::String(got)) if got == want => {}
            Some(got) => return Err(refuse(field, format!("want {want:?}, got {got}"))),
            None => return Err(refuse(field, format!("missing, want {want:?}"))),
        }
    }
    // The path names the field a type error is in, and the key of an unknown field.
    let decoded: CpuConfig = serde_path_to_error::deserialize(&config.parameters).map_err(|e| {
        let field = e.path().to_string();
        refuse(&field, e.into_inner().to_string())
    })?;
    if decoded.memory_kinds.as_ref().is_some_and(Vec::is_empty) {
        return Err(refuse(
            "memoryKinds",
            "empty: name at least one of dram, hbm, pmem, cxl".to_owned(),
        ));
    }
    let cpus = decoded
        .cpus
        .as_deref()
        .map(|list| parse_set::<CpuSet>(list, "cpu").map_err(|reason| refuse("cpus", reason)))
        .transpose()?;
    let memory_nodes = decoded
        .memory_nodes
        .as_deref()
        .map(|list| {
            parse_set::<NodeSet>(list, "node").map_err(|reason| refuse("memoryNodes", reason))
        })
        .transpose()?;
    if config.source == ConfigSource::Class {
        for (field, named) in [
            ("cpus", cpus.is_some()),
            ("memoryNodes", memory_nodes.is_some()),
        ] {
            if named {
                return Err(refuse(
                    field,
                    "a device class cannot name them: every claim of the class would get the same ones; put it in the claim's configuration".to_owned(),
                ));
            }
        }
    }
    Ok(Decoded {
        fields: decoded,
        cpus,
        memory_nodes,
    })
}

/// A non-empty set in the kernel's list format (`2-5,8`).
fn parse_set<T>(list: &str, what: &str) -> Result<T, String>
where
    T: std::str::FromStr + Default + PartialEq,
    T::Err: std::fmt::Display,
{
    let set: T = list
        .parse()
        .map_err(|e| format!("{list:?} is not a {what} list such as \"2-5,8\": {e}"))?;
    if set == T::default() {
        return Err(format!("{list:?} names no {what}"));
    }
    Ok(set)
}

fn describe_requests(config: &ClaimConfig) -> String {
    let source = match config.source {
        ConfigSource::Class => "from its device class",
        ConfigSource::Claim => "from the claim",
    };
    match config.requests.as_slice() {
        [] => format!("all requests ({source})"),
        [one] => format!("request {one} ({source})"),
        many => format!("requests {} ({source})", many.join(", ")),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::model::AllocationResult;

    fn config(source: ConfigSource, requests: &[&str], params: serde_json::Value) -> ClaimConfig {
        ClaimConfig {
            source,
            requests: requests.iter().map(|r| (*r).to_owned()).collect(),
            parameters: params,
        }
    }

    fn cpu(fields: serde_json::Value) -> serde_json::Value {
        let mut v = json!({"apiVersion": API_VERSION, "kind": KIND});
        if let (Some(o), Some(f)) = (v.as_object_mut(), fields.as_object()) {
            o.extend(f.clone());
        }
        v
    }

    fn claim(requests: &[&str], config: Vec<ClaimConfig>) -> Claim {
        Claim {
            uid: "u1".into(),
            namespace: "ns".into(),
            name: "c".into(),
            results: requests
                .iter()
                .map(|r| AllocationResult {
                    request: (*r).to_owned(),
                    device: "numa0".into(),
                    ..AllocationResult::default()
                })
                .collect(),
            config,
            ..Claim::default()
        }
    }

    fn pinning(c: &Claim) -> Vec<bool> {
        settings(c)
            .unwrap()
            .iter()
            .map(|s| s.memory_pinning)
            .collect()
    }

    #[test]
    fn no_configuration_gets_the_defaults() {
        assert_eq!(
            settings(&claim(&["a"], vec![])).unwrap(),
            [Settings::default()]
        );
    }

    #[test]
    fn a_claim_overrides_its_class_field_by_field() {
        use ConfigSource::{Claim as FromClaim, Class};
        // Listed claim first: the order of sources is by precedence, not by position.
        let c = claim(
            &["a"],
            vec![
                config(FromClaim, &[], cpu(json!({"memoryPinning": true}))),
                config(
                    Class,
                    &[],
                    cpu(json!({"memoryPinning": false, "fullCores": true})),
                ),
            ],
        );
        assert_eq!(
            settings(&c).unwrap(),
            [Settings {
                memory_pinning: true,
                full_cores: true,
                memory_kinds: vec![MemoryKind::Dram],
                cpus: None,
                memory_nodes: None,
            }],
            "the claim's pinning wins, the class's fullCores stays"
        );
    }

    #[test]
    fn within_a_source_the_later_wins_and_requests_scope_configs() {
        use ConfigSource::Claim as FromClaim;
        let off = || cpu(json!({"memoryPinning": false}));
        let on = || cpu(json!({"memoryPinning": true}));
        // A request-scoped config, then one for all requests: the later one wins for `a` too.
        let c = claim(
            &["a", "b"],
            vec![
                config(FromClaim, &["a"], off()),
                config(FromClaim, &[], on()),
            ],
        );
        assert_eq!(pinning(&c), [true, true]);
        // The other way round, the scoped one wins for its request only.
        let c = claim(
            &["a", "b"],
            vec![
                config(FromClaim, &[], on()),
                config(FromClaim, &["a"], off()),
            ],
        );
        assert_eq!(pinning(&c), [false, true]);
        // A base request name covers its subrequests; a full name only itself.
        let c = claim(
            &["a/x", "a/y", "b/x"],
            vec![
                config(FromClaim, &["a"], off()),
                config(FromClaim, &["b/y"], off()),
            ],
        );
        assert_eq!(pinning(&c), [false, false, true]);
    }

    fn refusal(params: serde_json::Value) -> (String, String) {
        let c = claim(
            &["a"],
            vec![config(ConfigSource::Claim, &["a", "b"], params)],
        );
        match settings(&c) {
            Err(PolicyError::ClaimConfig {
                claim,
                requests,
                field,
                reason,
            }) => {
                assert_eq!(claim, "ns/c (u1)");
                assert_eq!(requests, "requests a, b (from the claim)");
                (field, reason)
            }
            other => panic!("expected a config refusal, got {other:?}"),
        }
    }

    #[test]
    fn refusals_name_the_field() {
        let (field, reason) = refusal(json!({"apiVersion": "resmgr.io/v2", "kind": KIND}));
        assert_eq!(field, "apiVersion");
        assert!(reason.contains("resmgr.io/v2"), "{reason}");
        let (field, _) = refusal(json!({"apiVersion": API_VERSION, "kind": "GpuConfig"}));
        assert_eq!(field, "kind");
        let (field, _) = refusal(json!({"kind": KIND}));
        assert_eq!(field, "apiVersion");
        let (field, reason) = refusal(cpu(json!({"memoryPinnning": false})));
        assert_eq!(field, "memoryPinnning");
        assert!(reason.contains("unknown field"), "{reason}");
        let (field, reason) = refusal(cpu(json!({"fullCores": "yes"})));
        assert_eq!(field, "fullCores");
        assert!(reason.contains("invalid type"), "{reason}");
        let (field, _) = refusal(json!(["CpuConfig"]));
        assert_eq!(field, "parameters");
        let (field, reason) = refusal(cpu(json!({"memoryKinds": ["dram", "sram"]})));
        assert_eq!(field, "memoryKinds[1]");
        assert!(reason.contains("unknown variant `sram`"), "{reason}");
        let (field, reason) = refusal(cpu(json!({"memoryKinds": []})));
        assert_eq!(field, "memoryKinds");
        assert!(reason.contains("name at least one"), "{reason}");
        let (field, reason) = refusal(cpu(json!({"memoryKinds": "hbm"})));
        assert_eq!(field, "memoryKinds");
        assert!(reason.contains("invalid type"), "{reason}");
    }

    #[test]
    fn memory_kinds_are_sorted_and_deduplicated_and_override_as_a_whole() {
        use ConfigSource::{Claim as FromClaim, Class};
        let c = claim(
            &["a", "b"],
            vec![
                config(
                    Class,
                    &[],
                    cpu(json!({"memoryKinds": ["hbm", "dram", "hbm"]})),
                ),
                config(FromClaim, &["b"], cpu(json!({"memoryKinds": ["cxl"]}))),
            ],
        );
        let kinds: Vec<Vec<MemoryKind>> = settings(&c)
            .unwrap()
            .into_iter()
            .map(|s| s.memory_kinds)
            .collect();
        assert_eq!(
            kinds,
            [
                vec![MemoryKind::Dram, MemoryKind::Hbm],
                vec![MemoryKind::Cxl]
            ]
        );
    }

    #[test]
    fn a_bad_config_refuses_even_when_it_applies_to_no_result() {
        let c = claim(
            &["a"],
            vec![config(
                ConfigSource::Class,
                &["other"],
                cpu(json!({"bogus": 1})),
            )],
        );
        let err = settings(&c).unwrap_err();
        assert_eq!(
            err.to_string(),
            "claim ns/c (u1): configuration for request other (from its device class): bogus: \
             unknown field `bogus`, expected one of `apiVersion`, `kind`, `memoryPinning`, `fullCores`, `memoryKinds`, `cpus`, `memoryNodes`"
        );
    }
}
