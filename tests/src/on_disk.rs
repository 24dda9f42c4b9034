//! What a node's disk says, read as the randomized models check it after every step: the claims
//! the state file accounts for (its records and its policy's state must name the same ones),
//! the claims with a CDI spec, and whether claims share a CPU. Errors are the models' failure
//! messages.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::Path,
};

use policy::CpuSet;

use crate::fakes::DRIVER;

/// The claims the state file in `state_dir` accounts for, with their CPUs, from the policy's
/// state; none without a state file. Fails if the manager's records name other claims.
pub fn saved_claims(state_dir: &Path) -> Result<BTreeMap<String, CpuSet>, String> {
    let bytes = match std::fs::read(state_dir.join("state.json")) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(BTreeMap::new()),
        Err(e) => return Err(format!("reading the state: {e}")),
    };
    let v: serde_json::Value =
        serde_json::from_slice(&bytes).map_err(|e| format!("the state: {e}"))?;
    let records: BTreeSet<String> = v["claims"]
        .as_object()
        .map(|o| o.keys().cloned().collect())
        .unwrap_or_default();
    let mut held = BTreeMap::new();
    for claim in v["policy_state"]["claims"].as_array().into_iter().flatten() {
        let uid = claim["uid"].as_str().unwrap_or_default().to_owned();
        let mut cpus = CpuSet::new();
        for r in claim["results"].as_array().into_iter().flatten() {
            let c: CpuSet = r["cpus"]
                .as_str()
                .unwrap_or_default()
                .parse()
                .map_err(|e| format!("{e:?}"))?;
            cpus = cpus.union(&c);
        }
        held.insert(uid, cpus);
    }
    let policy: BTreeSet<String> = held.keys().cloned().collect();
    if policy != records {
        return Err(format!(
            "the state's records name {records:?}, its policy state {policy:?}"
        ));
    }
    Ok(held)
}

/// The claims with a CDI spec of the node's driver in `cdi_dir`; none without the directory.
pub fn spec_uids(cdi_dir: &Path) -> Result<BTreeSet<String>, String> {
    if !cdi_dir.exists() {
        return Ok(BTreeSet::new());
    }
    Ok(cdi::SpecStore::new(cdi_dir, DRIVER)
        .map_err(|e| e.to_string())?
        .claims()
        .map_err(|e| e.to_string())?
        .into_iter()
        .map(|u| u.to_string())
        .collect())
}

/// Fails if two of `claims` share a CPU, saying `what` they are.
pub fn disjoint(what: &str, claims: &BTreeMap<String, CpuSet>) -> Result<(), String> {
    let mut seen = CpuSet::new();
    for (uid, cpus) in claims {
        if seen.intersects(cpus) {
            return Err(format!(
                "{what}: claim {uid}'s cpus {cpus} are in another claim too: {claims:?}"
            ));
        }
        seen = seen.union(cpus);
    }
    Ok(())
}
