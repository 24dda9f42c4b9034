//! Repository rules checked as plain tests: the crate layering, module docs, and the module tables
//! of ARCHITECTURE.md.
//!
//! The layering is the architecture's first invariant (ARCHITECTURE.md): internal dependencies
//! only point down. It is checked here from `cargo metadata`, so a new edge between crates fails
//! the tests of this package (`cargo xtask test`, or `cargo test -p xtask`; plain `cargo test`
//! builds only the product crates) with the edge named, and has to be made on purpose, in this
//! table and in ARCHITECTURE.md together.
//!
//! A crate whose section in ARCHITECTURE.md has a module table lists every top-level module of
//! the crate there, and nothing else, so the code map cannot silently fall behind the code.

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

/// Crates whose ARCHITECTURE.md section must have a module table, by directory under `crates/`.
const MODULE_TABLES: &[&str] = &["kubelet-plugin", "plugin-bin", "policy", "resmgr"];

/// The module names in the tables of `krate`'s section of ARCHITECTURE.md (`### `crates/<krate>``
/// up to the next heading): every backticked name in the first column of a table row. `None`
/// when the section has no table.
fn table_modules(architecture: &str, krate: &str) -> Option<BTreeSet<String>> {
    let heading = format!("### `crates/{krate}`");
    let mut lines = architecture
        .lines()
        .skip_while(|l| !l.starts_with(&heading))
        .skip(1)
        .take_while(|l| !l.starts_with("## ") && !l.starts_with("### "));
    let mut modules = BTreeSet::new();
    let mut found = false;
    for line in lines.by_ref() {
        let Some(row) = line.trim().strip_prefix('|') else {
            continue;
        };
        let first = row.split('|').next().unwrap_or_default().trim();
        if first.is_empty() || first.starts_with('-') || first == "module" {
            found = true; // the header and the separator
            continue;
        }
        found = true;
        modules.extend(
            first
                .split('`')
                .skip(1)
                .step_by(2)
                .map(|m| m.trim().to_owned())
                .filter(|m| !m.is_empty()),
        );
    }
    found.then_some(modules)
}

/// The top-level modules a crate root declares (`mod x;`, `pub mod x;`, `pub(crate) mod x {`),
/// leaving out `tests`.
fn declared_modules(root_source: &str) -> BTreeSet<String> {
    root_source
        .lines()
        .filter_map(|line| {
            let mut l = line.trim();
            // Attributes on the same line, such as `#[doc(hidden)] pub mod x;`.
            while l.starts_with("#[") {
                l = l.split_once(']').map_or("", |(_, rest)| rest.trim_start());
            }
            let l = l
                .strip_prefix("pub(crate) ")
                .or_else(|| l.strip_prefix("pub "))
                .unwrap_or(l);
            let name = l.strip_prefix("mod ")?;
            let name = name.split([';', ' ', '{']).next()?;
            (name != "tests" && !name.is_empty()).then(|| name.to_owned())
        })
        .collect()
}

/// For every crate with a module table, the modules missing from it and the names in it that
/// are no module, as readable lines; and a line for each crate of [`MODULE_TABLES`] without one.
fn module_table_problems(root: &Path, architecture: &str) -> Vec<String> {
    let mut problems = Vec::new();
    let Ok(entries) = fs::read_dir(root.join("crates")) else {
        return vec!["no crates/ directory".into()];
    };
    let mut crates: Vec<String> = entries
        .flatten()
        .filter(|e| e.path().join("Cargo.toml").is_file())
        .filter_map(|e| e.file_name().into_string().ok())
        .collect();
    crates.sort();
    for krate in crates {
        let Some(listed) = table_modules(architecture, &krate) else {
            if MODULE_TABLES.contains(&krate.as_str()) {
                problems.push(format!("crates/{krate}: its section has no module table"));
            }
            continue;
        };
        let src = root.join("crates").join(&krate).join("src");
        let root_file = ["lib.rs", "main.rs"]
            .iter()
            .map(|f| src.join(f))
            .find(|p| p.is_file());
        let declared = root_file
            .and_then(|p| fs::read_to_string(p).ok())
            .map(|text| declared_modules(&text))
            .unwrap_or_default();
        for m in declared.difference(&listed) {
            problems.push(format!(
                "crates/{krate}: module `{m}` is not in its ARCHITECTURE.md table"
            ));
        }
        for m in listed.difference(&declared) {
            problems.push(format!(
                "crates/{krate}: ARCHITECTURE.md lists `{m}`, which is not a module of it"
            ));
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

#[test]
fn every_module_is_in_its_crates_architecture_table() {
    let root = util::repo_root().unwrap();
    let architecture = fs::read_to_string(root.join("ARCHITECTURE.md")).unwrap();
    for krate in MODULE_TABLES {
        let listed = table_modules(&architecture, krate).unwrap_or_default();
        assert!(listed.len() > 3, "crates/{krate}: table has {listed:?}");
    }
    let problems = module_table_problems(&root, &architecture);
    assert!(
        problems.is_empty(),
        "ARCHITECTURE.md's module tables and the code disagree:\n  {}",
        problems.join("\n  ")
    );
}

#[test]
fn module_tables_and_declarations_are_read_as_written() {
    let architecture = "\
## Crates

### `crates/a`: a crate

| module | owns |
|---|---|
| `one` | this |
| `two`, `three` | that, with `code` in the second column |

### `crates/b`: no table

Prose naming `x`.
";
    let names = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<BTreeSet<_>>();
    assert_eq!(
        table_modules(architecture, "a"),
        Some(names(&["one", "two", "three"]))
    );
    assert_eq!(table_modules(architecture, "b"), None);
    assert_eq!(table_modules(architecture, "c"), None);
    let lib = "//! Doc.\n\nmod one;\npub mod two;\npub(crate) mod three {\n}\n#[doc(hidden)] pub mod four;\n#[cfg(test)]\nmod tests;\nuse x::mod_y;\n";
    assert_eq!(
        declared_modules(lib),
        names(&["one", "two", "three", "four"])
    );
}
