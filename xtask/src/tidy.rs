//! Repository rules checked as plain tests: the crate layering and module docs.
//!
//! The layering is the architecture's first invariant (ARCHITECTURE.md): internal dependencies
//! only point down. It is checked here from `cargo metadata`, so a new edge between crates fails
//! `cargo test` with the edge named, and has to be made on purpose, in this table and in
//! ARCHITECTURE.md together.

use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    path::{Path, PathBuf},
};

use crate::util;

/// Allowed normal (non-dev, non-build) dependencies between the product crates, by directory name
/// under `crates/`. The test and xtask packages may depend on anything.
const ALLOWED: &[(&str, &[&str])] = &[
    ("dra-proto", &[]),
    ("cdi", &[]),
    ("nri", &[]),
    ("policy", &["cdi"]),
    ("kubelet-plugin", &["dra-proto"]),
    ("resmgr", &["policy", "cdi", "nri", "kubelet-plugin"]),
    ("plugin-bin", &["resmgr", "policy"]),
];

/// Every internal edge of `metadata` (the JSON of `cargo metadata`) that [`ALLOWED`] does not
/// list, as "crates/a -> crates/b", plus product crates missing from [`ALLOWED`].
fn forbidden_edges(metadata: &serde_json::Value) -> Vec<String> {
    let allowed: BTreeMap<&str, BTreeSet<&str>> = ALLOWED
        .iter()
        .map(|(c, deps)| (*c, deps.iter().copied().collect()))
        .collect();
    let packages = metadata["packages"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default();
    // Package name -> directory under crates/, for product crates only.
    let dir_of: BTreeMap<&str, &str> = packages
        .iter()
        .filter_map(|p| {
            let name = p["name"].as_str()?;
            let manifest = Path::new(p["manifest_path"].as_str()?);
            let dir = manifest.parent()?;
            let parent = dir.parent()?.file_name()?.to_str()?;
            (parent == "crates").then(|| Some((name, dir.file_name()?.to_str()?)))?
        })
        .collect();
    let mut problems = Vec::new();
    for p in packages {
        let Some(src) = p["name"].as_str().and_then(|n| dir_of.get(n)) else {
            continue;
        };
        let Some(allowed_deps) = allowed.get(src) else {
            problems.push(format!("crates/{src} is not in the layering table"));
            continue;
        };
        for dep in p["dependencies"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or_default()
        {
            if !dep["kind"].is_null() {
                continue; // dev- and build-dependencies may cross layers
            }
            let Some(dst) = dep["name"].as_str().and_then(|n| dir_of.get(n)) else {
                continue;
            };
            if !allowed_deps.contains(dst) {
                problems.push(format!("crates/{src} -> crates/{dst}"));
            }
        }
    }
    problems
}

/// Rust files that must open with a `//!` module doc: everything we wrote, not generated code.
fn rust_sources(root: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![root.join("crates"), root.join("xtask"), root.join("tests")];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let name = entry.file_name();
            let skip = ["target", "generated", "conformance", "corpus", "artifacts"];
            if path.is_dir() && !skip.iter().any(|s| name == *s) {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

/// Whether a source text opens (after blank lines and inner attributes) with a `//!` comment.
fn opens_with_module_doc(text: &str) -> bool {
    text.lines()
        .map(str::trim)
        .find(|l| !l.is_empty() && !l.starts_with("#!["))
        .is_some_and(|l| l.starts_with("//!"))
}

#[test]
fn internal_dependencies_only_point_down() {
    let root = util::repo_root().unwrap();
    let meta = util::output(util::cargo().current_dir(&root).args([
        "metadata",
        "--format-version",
        "1",
        "--no-deps",
        "--offline",
    ]))
    .unwrap();
    let meta: serde_json::Value = serde_json::from_str(&meta).unwrap();
    let crates = meta["packages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| {
            p["manifest_path"]
                .as_str()
                .is_some_and(|m| m.contains("/crates/"))
        })
        .count();
    assert_eq!(
        crates,
        ALLOWED.len(),
        "every product crate is in the layering table"
    );
    let problems = forbidden_edges(&meta);
    assert!(
        problems.is_empty(),
        "forbidden internal dependencies:\n  {}",
        problems.join("\n  ")
    );
}

#[test]
fn layering_check_catches_a_forbidden_edge() {
    let meta = serde_json::json!({
        "packages": [
            {"name": "policy", "manifest_path": "/r/crates/policy/Cargo.toml", "dependencies": [
                {"name": "cdi", "kind": null},
                {"name": "nri", "kind": null},
                {"name": "resmgr", "kind": "dev"},
                {"name": "serde", "kind": null},
            ]},
            {"name": "cdi", "manifest_path": "/r/crates/cdi/Cargo.toml", "dependencies": []},
            {"name": "nri", "manifest_path": "/r/crates/nri/Cargo.toml", "dependencies": []},
            {"name": "resmgr", "manifest_path": "/r/crates/resmgr/Cargo.toml", "dependencies": []},
            {"name": "rogue", "manifest_path": "/r/crates/rogue/Cargo.toml", "dependencies": []},
        ]
    });
    assert_eq!(
        forbidden_edges(&meta),
        [
            "crates/policy -> crates/nri",
            "crates/rogue is not in the layering table"
        ]
    );
}

#[test]
fn every_module_opens_with_a_doc_comment() {
    let root = util::repo_root().unwrap();
    let sources = rust_sources(&root);
    assert!(
        sources.len() > 10,
        "found only {} Rust sources under {}",
        sources.len(),
        root.display()
    );
    let missing: Vec<String> = sources
        .iter()
        .filter(|p| !opens_with_module_doc(&fs::read_to_string(p).unwrap()))
        .map(|p| p.strip_prefix(&root).unwrap_or(p).display().to_string())
        .collect();
    assert!(
        missing.is_empty(),
        "these files do not open with a `//!` doc:\n  {}",
        missing.join("\n  ")
    );
}

#[test]
fn module_doc_check_tells_docs_from_other_comments() {
    assert!(opens_with_module_doc("//! Owns things.\nfn f() {}"));
    assert!(opens_with_module_doc("\n#![allow(x)]\n//! Owns things."));
    assert!(!opens_with_module_doc("// A plain comment.\n//! Late doc."));
    assert!(!opens_with_module_doc("use std::fs;\n"));
    assert!(!opens_with_module_doc(""));
}
