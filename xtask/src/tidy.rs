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
//!
//! The agent that ships holds no test machinery: no product crate's source has the crash test's
//! hook (its environment variable or a process abort; the one abort allowed is the agent's own
//! answer to a panic, plugin-bin's `panics`), and no package outside the product
//! crates turns on a feature of one (cargo would unify it into the agent that the tests run).
//! Tests reach into the agent through the fault seam (`resmgr::faults`) instead. `cargo xtask`
//! checks the built binaries too (`workspace::ensure_shipped`).
//!
//! resmgr's core owns the manager lock ([`RESMGR_CORE`]): resmgr's modules import each other
//! without a circle, no module outside the core names one of its submodules, the core's
//! structs keep their fields private, and every module that takes the lock refuses blocking IO
//! (clippy's `disallowed_methods`, with resmgr's `clippy.toml`).

use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    path::{Path, PathBuf},
};

use crate::util;

/// Allowed normal (non-dev, non-build) dependencies between the workspace's library crates, by
/// directory: the product crates under `crates/` and the tooling crates under `tools/` (the
/// build system's parts that the tests use too, which depend on no product crate and which no
/// product crate depends on), and the test package, `tests`. The xtask package may depend on
/// anything.
const ALLOWED: &[(&str, &[&str])] = &[
    // The generic helpers (the error-chain printer, the poison-tolerant lock): a leaf any crate
    // may use.
    ("crates/stdx", &[]),
    ("crates/dra-proto", &[]),
    ("crates/cdi", &[]),
    ("crates/nri", &["crates/stdx"]),
    ("crates/policy", &["crates/cdi"]),
    ("crates/kubelet-plugin", &["crates/dra-proto"]),
    // `kubelet-plugin` for its `ClaimRef` and DNS name checks, each the workspace's one.
    (
        "crates/kube-dra",
        &["crates/policy", "crates/kubelet-plugin", "crates/stdx"],
    ),
    (
        "crates/resmgr",
        &[
            "crates/kube-dra",
            "crates/policy",
            "crates/cdi",
            "crates/nri",
            "crates/kubelet-plugin",
            "crates/stdx",
        ],
    ),
    // The binary names each crate it uses itself: resmgr re-exports none.
    (
        "crates/plugin-bin",
        &[
            "crates/resmgr",
            "crates/policy",
            "crates/cdi",
            "crates/kube-dra",
            "crates/kubelet-plugin",
            "crates/nri",
            "crates/stdx",
        ],
    ),
    ("tools/oci-archive", &[]),
    ("tools/helm-chart", &[]),
    // Every product crate; plugin-bin's library (`resmgr_agent`) only for `resmgr-crashing`, the
    // agent with the crash test's hook. No other package depends on the binary's crate.
    (
        "tests",
        &[
            "crates/dra-proto",
            "crates/cdi",
            "crates/nri",
            "crates/policy",
            "crates/kubelet-plugin",
            "crates/kube-dra",
            "crates/resmgr",
            "crates/plugin-bin",
            "crates/stdx",
        ],
    ),
];

/// The directories that hold the workspace's library crates (see [`ALLOWED`]).
const LAYERED_DIRS: [&str; 2] = ["crates", "tools"];

/// The test package's directory (see [`ALLOWED`]).
const TESTS_DIR: &str = "tests";

/// A package of `metadata` (the JSON of `cargo metadata`) as [`ALLOWED`] names it:
/// `crates/<dir>`, `tools/<dir>` or `tests`; `None` for the others (xtask).
fn layered_dir(package: &serde_json::Value) -> Option<String> {
    let manifest = Path::new(package["manifest_path"].as_str()?);
    let dir = manifest.parent()?;
    let name = dir.file_name()?.to_str()?;
    if name == TESTS_DIR {
        return Some(TESTS_DIR.to_owned());
    }
    let parent = dir.parent()?.file_name()?.to_str()?;
    LAYERED_DIRS
        .contains(&parent)
        .then(|| format!("{parent}/{name}"))
}

/// Every internal edge of `metadata` (the JSON of `cargo metadata`) that [`ALLOWED`] does not
/// list, as "crates/a -> crates/b", layered crates missing from [`ALLOWED`], and features of a
/// product crate that a package outside `crates/` turns on (any kind of dependency: cargo
/// unifies them into the binaries the tests run).
fn forbidden_edges(metadata: &serde_json::Value) -> Vec<String> {
    let allowed: BTreeMap<&str, BTreeSet<&str>> = ALLOWED
        .iter()
        .map(|(c, deps)| (*c, deps.iter().copied().collect()))
        .collect();
    let packages = metadata["packages"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default();
    // Package name -> `crates/<dir>`, `tools/<dir>` or `tests`.
    let dir_of: BTreeMap<&str, String> = packages
        .iter()
        .filter_map(|p| Some((p["name"].as_str()?, layered_dir(p)?)))
        .collect();
    let mut problems = Vec::new();
    for p in packages {
        let src = p["name"].as_str().and_then(|n| dir_of.get(n));
        let deps = p["dependencies"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or_default();
        if !src.is_some_and(|s| s.starts_with("crates/")) {
            let from = src.map_or_else(|| p["name"].as_str().unwrap_or("?"), String::as_str);
            for dep in deps {
                let Some(dst) = dep["name"].as_str().and_then(|n| dir_of.get(n)) else {
                    continue;
                };
                let features = dep["features"].as_array().map_or(0, Vec::len);
                if dst.starts_with("crates/") && features > 0 {
                    problems.push(format!("{from} turns on features of {dst}"));
                }
            }
        }
        let Some(src) = src else {
            continue;
        };
        let Some(allowed_deps) = allowed.get(src.as_str()) else {
            problems.push(format!("{src} is not in the layering table"));
            continue;
        };
        for dep in deps {
            if !dep["kind"].is_null() {
                continue; // dev- and build-dependencies may cross layers
            }
            let Some(dst) = dep["name"].as_str().and_then(|n| dir_of.get(n)) else {
                continue;
            };
            if !allowed_deps.contains(dst.as_str()) {
                problems.push(format!("{src} -> {dst}"));
            }
        }
    }
    problems
}

/// What no source of a product crate (`crates/*/src`, what the shipped agent is built from) may
/// hold: the crash test's hook, which the tests package supplies through the fault seam.
const CRASH_HOOK: [&str; 2] = ["RESMGR_CRASH_AT", "process::abort"];

/// The one product source that may abort the process: the agent's answer to a panic, which is
/// to stop at once (ARCHITECTURE.md, "A panic stops the agent at once"), not a crash test's hook.
const PANIC_ABORT: (&str, &str) = ("crates/plugin-bin/src/panics.rs", "process::abort");

/// The product crates' sources that hold any of [`CRASH_HOOK`], as "path: what".
fn crash_hook_problems(root: &Path) -> Vec<String> {
    let mut problems = Vec::new();
    let Ok(crates) = fs::read_dir(root.join("crates")) else {
        return vec!["no crates/ directory".into()];
    };
    let mut stack: Vec<PathBuf> = crates.flatten().map(|e| e.path().join("src")).collect();
    while let Some(dir) = stack.pop() {
        let Ok(entries) = fs::read_dir(&dir) else {
            continue;
        };
        for path in entries.flatten().map(|e| e.path()) {
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let text = fs::read_to_string(&path).unwrap_or_default();
                let shown = path.strip_prefix(root).unwrap_or(&path);
                for what in CRASH_HOOK.iter().filter(|w| text.contains(*w)) {
                    if (shown, *what) != (Path::new(PANIC_ABORT.0), PANIC_ABORT.1) {
                        problems.push(format!("{}: {what}", shown.display()));
                    }
                }
            }
        }
    }
    problems.sort();
    problems
}

/// The `pub use` lines of `text` that re-export another of the workspace's crates, or anything
/// of one, named by its library name (`kube_dra`): `crate` is the crate `text` belongs to. Every
/// crate names the crates it uses through its own Cargo.toml, never through another's re-export
/// (ARCHITECTURE.md, "Layering").
fn reexports<'a>(text: &'a str, krate: &str, crates: &[String]) -> Vec<&'a str> {
    text.lines()
        .map(str::trim)
        .filter(|line| {
            let Some(rest) = line.strip_prefix("pub") else {
                return false;
            };
            // `pub use`, `pub(crate) use`, `pub(super) use`, ...
            let rest = match rest.strip_prefix('(') {
                Some(r) => r.split_once(')').map_or("", |(_, r)| r),
                None => rest,
            };
            let Some(path) = rest.trim_start().strip_prefix("use ") else {
                return false;
            };
            let path = path.trim_start().trim_start_matches("::");
            let first = path
                .split(|c: char| !(c.is_alphanumeric() || c == '_'))
                .next()
                .unwrap_or_default();
            first != krate && crates.iter().any(|c| c == first)
        })
        .collect()
}

/// Every re-export of a workspace crate in a product crate's sources ([`reexports`]), as
/// "path: line".
fn reexport_problems(root: &Path) -> Vec<String> {
    let Ok(entries) = fs::read_dir(root.join("crates")) else {
        return vec!["no crates/ directory".into()];
    };
    let mut dirs: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
    dirs.sort();
    // Library names as code spells them: `kube-dra` is `kube_dra`.
    let crates: Vec<String> = dirs
        .iter()
        .filter_map(|d| d.file_name()?.to_str().map(|n| n.replace('-', "_")))
        .collect();
    let mut problems = Vec::new();
    for dir in &dirs {
        let krate = dir
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default()
            .replace('-', "_");
        let mut stack = vec![dir.join("src")];
        while let Some(d) = stack.pop() {
            let Ok(entries) = fs::read_dir(&d) else {
                continue;
            };
            for path in entries.flatten().map(|e| e.path()) {
                if path.is_dir() && !path.ends_with("generated") {
                    stack.push(path);
                } else if path.extension().is_some_and(|e| e == "rs") {
                    let text = fs::read_to_string(&path).unwrap_or_default();
                    let shown = path.strip_prefix(root).unwrap_or(&path);
                    for line in reexports(&text, &krate, &crates) {
                        problems.push(format!("{}: {line}", shown.display()));
                    }
                }
            }
        }
    }
    problems.sort();
    problems
}

/// Crates whose ARCHITECTURE.md section must have a module table, by directory under `crates/`.
const MODULE_TABLES: &[&str] = &[
    "kube-dra",
    "kubelet-plugin",
    "plugin-bin",
    "policy",
    "resmgr",
];

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
    // Whether the table the line is in is a module table (its header says `module`): other
    // tables of the section (such as where a type's methods are) list files.
    let mut in_module_table = false;
    let mut in_table = false;
    for line in lines.by_ref() {
        let Some(row) = line.trim().strip_prefix('|') else {
            in_table = false;
            continue;
        };
        let first = row.split('|').next().unwrap_or_default().trim();
        if !in_table {
            in_table = true;
            in_module_table = first == "module";
            found |= in_module_table;
            continue; // the header
        }
        if !in_module_table || first.is_empty() || first.starts_with('-') {
            continue; // the separator
        }
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

/// Types whose methods are spread over several files of a directory, each file listed in an
/// ARCHITECTURE.md table headed `| file | `impl <Type>` |` with what it holds: so that a newcomer
/// finds a behaviour's file from the table, and a new file of the type's methods is a decision
/// written down.
const IMPL_TABLES: &[(&str, &str)] = &[
    ("Core", "crates/resmgr/src"),
    ("Manager", "crates/resmgr/src"),
    ("TopologyAware", "crates/policy/src/topology_aware"),
];

/// The files listed in the table of `impl <ty>` (the first column's backticked names). `None`
/// when there is no such table.
fn impl_table_files(architecture: &str, ty: &str) -> Option<BTreeSet<String>> {
    let header = format!("`impl {ty}`");
    let mut lines = architecture
        .lines()
        .skip_while(|l| !(l.trim_start().starts_with("| file |") && l.contains(&header)));
    lines.next()?;
    Some(
        lines
            .skip(1) // the separator
            .take_while(|l| l.trim_start().starts_with('|'))
            .flat_map(|l| {
                let first = l.trim().trim_start_matches('|');
                let first = first.split('|').next().unwrap_or_default().to_owned();
                first
                    .split('`')
                    .skip(1)
                    .step_by(2)
                    .map(str::to_owned)
                    .collect::<Vec<_>>()
            })
            .collect(),
    )
}

/// The files under `dir` (relative to it) with an inherent `impl <ty>` block, outside tests.
fn impl_files(dir: &Path, ty: &str) -> BTreeSet<String> {
    let opening = format!("impl {ty} {{");
    let mut out = BTreeSet::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "rs")
                && fs::read_to_string(&p)
                    .is_ok_and(|t| without_tests(&t).lines().any(|l| l.starts_with(&opening)))
                && let Ok(rel) = p.strip_prefix(dir)
            {
                out.insert(rel.display().to_string());
            }
        }
    }
    out
}

/// Where ARCHITECTURE.md's `impl` tables and the code disagree, as readable lines.
fn impl_table_problems(root: &Path, architecture: &str) -> Vec<String> {
    let mut problems = Vec::new();
    for (ty, dir) in IMPL_TABLES {
        let Some(listed) = impl_table_files(architecture, ty) else {
            problems.push(format!(
                "ARCHITECTURE.md has no `| file | `impl {ty}` |` table"
            ));
            continue;
        };
        let found = impl_files(&root.join(dir), ty);
        for f in found.difference(&listed) {
            problems.push(format!(
                "{dir}/{f} has `impl {ty}`, but ARCHITECTURE.md's table does not list it"
            ));
        }
        for f in listed.difference(&found) {
            problems.push(format!(
                "ARCHITECTURE.md lists {dir}/{f} for `impl {ty}`, which has none"
            ));
        }
    }
    problems
}

/// Rust files that must open with a `//!` module doc: everything we wrote, not generated code.
fn rust_sources(root: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![
        root.join("crates"),
        root.join("tools"),
        root.join("xtask"),
        root.join("tests"),
    ];
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
        .filter(|p| layered_dir(p).is_some())
        .count();
    assert_eq!(
        crates,
        ALLOWED.len(),
        "every crate under crates/ and tools/, and tests, is in the layering table"
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
            {"name": "oci-archive", "manifest_path": "/r/tools/oci-archive/Cargo.toml", "dependencies": [
                {"name": "cdi", "kind": null},
            ]},
            {"name": "xtask", "manifest_path": "/r/xtask/Cargo.toml", "dependencies": [
                {"name": "oci-archive", "kind": null},
                {"name": "plugin-bin", "kind": null},
            ]},
            {"name": "plugin-bin", "manifest_path": "/r/crates/plugin-bin/Cargo.toml", "dependencies": [
                {"name": "resmgr", "kind": null, "features": ["crash-points"]},
            ]},
            {"name": "integration-tests", "manifest_path": "/r/tests/Cargo.toml", "dependencies": [
                {"name": "plugin-bin", "kind": null},
                {"name": "resmgr", "kind": null, "features": ["faults"]},
                {"name": "oci-archive", "kind": null},
                {"name": "helm-chart", "kind": "dev"},
            ]},
        ]
    });
    assert_eq!(
        forbidden_edges(&meta),
        [
            "crates/policy -> crates/nri",
            "crates/rogue is not in the layering table",
            "tools/oci-archive -> crates/cdi",
            "tests turns on features of crates/resmgr",
            "tests -> tools/oci-archive",
        ]
    );
}

#[test]
fn no_product_crate_holds_the_crash_hook() {
    let root = util::repo_root().unwrap();
    let problems = crash_hook_problems(&root);
    assert!(
        problems.is_empty(),
        "the crash test's hook is in a product crate (it belongs in tests/src/crash.rs, \
         reached through resmgr::faults):\n  {}",
        problems.join("\n  ")
    );
}

#[test]
fn crash_hook_check_finds_a_planted_hook() {
    let root = tempfile::tempdir().unwrap();
    let src = root.path().join("crates/rogue/src/deep");
    fs::create_dir_all(&src).unwrap();
    fs::write(
        src.join("crash.rs"),
        "//! x\nfn f() { if std::env::var_os(\"RESMGR_CRASH_AT\").is_some() { std::process::abort() } }\n",
    )
    .unwrap();
    fs::write(root.path().join("crates/rogue/src/lib.rs"), "//! fine\n").unwrap();
    // The agent's answer to a panic may abort; the crash test's variable is still refused there.
    let panics = root.path().join(PANIC_ABORT.0);
    fs::create_dir_all(panics.parent().unwrap()).unwrap();
    fs::write(
        &panics,
        "//! x\nfn f() { std::process::abort() }\nconst C: &str = \"RESMGR_CRASH_AT\";\n",
    )
    .unwrap();
    assert_eq!(
        crash_hook_problems(root.path()),
        [
            "crates/plugin-bin/src/panics.rs: RESMGR_CRASH_AT",
            "crates/rogue/src/deep/crash.rs: RESMGR_CRASH_AT",
            "crates/rogue/src/deep/crash.rs: process::abort",
        ]
    );
}

#[test]
fn no_product_crate_reexports_another() {
    let root = util::repo_root().unwrap();
    let problems = reexport_problems(&root);
    assert!(
        problems.is_empty(),
        "a product crate re-exports another crate of the workspace (name it where it is used, \
         and declare it in that crate's Cargo.toml):\n  {}",
        problems.join("\n  ")
    );
}

#[test]
fn reexports_of_workspace_crates_are_found_and_nothing_else() {
    let crates = ["kube_dra", "policy", "resmgr"].map(String::from);
    let text = "//! x\npub use kube_dra;\npub use kube_dra::{errors, sync};\n\
                pub(crate) use ::policy::CpuSet;\npub use claims::Claim;\npub use prost;\n\
                use policy::Device;\npub use self::inner::X;\npub use resmgr::Manager;\n\
                pub use policyish::Y;\n";
    assert_eq!(
        reexports(text, "resmgr", &crates),
        [
            "pub use kube_dra;",
            "pub use kube_dra::{errors, sync};",
            "pub(crate) use ::policy::CpuSet;",
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
fn every_file_of_a_split_types_methods_is_in_its_table() {
    let root = util::repo_root().unwrap();
    let architecture = fs::read_to_string(root.join("ARCHITECTURE.md")).unwrap();
    for (ty, dir) in IMPL_TABLES {
        let found = impl_files(&root.join(dir), ty);
        assert!(
            found.len() > 1,
            "{dir}: `impl {ty}` found only in {found:?}"
        );
    }
    let problems = impl_table_problems(&root, &architecture);
    assert!(
        problems.is_empty(),
        "ARCHITECTURE.md's impl tables and the code disagree:\n  {}",
        problems.join("\n  ")
    );
}

#[test]
fn impl_tables_are_read_as_written() {
    let architecture = "\
| module | owns |
|---|---|
| `x` | x |

| file | `impl Thing` |
|---|---|
| `a.rs` | one |
| `b.rs`, `c/d.rs` | two |

After.
";
    let names = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<BTreeSet<_>>();
    assert_eq!(
        impl_table_files(architecture, "Thing"),
        Some(names(&["a.rs", "b.rs", "c/d.rs"]))
    );
    assert_eq!(impl_table_files(architecture, "Other"), None);
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("a.rs"), "//! A.\nimpl Thing {\n}\n").unwrap();
    fs::write(
        dir.path().join("b.rs"),
        "//! B.\nimpl Other for Thing {\n}\n",
    )
    .unwrap();
    fs::write(
        dir.path().join("t.rs"),
        "//! T.\n#[cfg(test)]\nmod tests {\nimpl Thing {\n}\n}\n",
    )
    .unwrap();
    assert_eq!(impl_files(dir.path(), "Thing"), names(&["a.rs"]));
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

| file | `impl A` |
|---|---|
| `one.rs` | not a module |

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

/// xtask's own layers, lowest first. A module may use modules of its own layer or lower ones,
/// never of a higher one, and the modules' uses (submodules included) form no cycle: the
/// helpers know no command, a build knows nothing of the stage that runs it, and a stage no
/// command. `main` (the CLI) and `tidy` (these tests) stand above them all.
const XTASK_LAYERS: &[(&str, &[&str])] = &[
    (
        "helpers",
        &["util", "sysdeps", "missing", "workspace", "timing"],
    ),
    ("builds", &["build"]),
    ("stages", &["e2e"]),
    (
        "commands",
        &[
            "codegen",
            "docs",
            "manifests",
            "image",
            "release",
            "scale",
            "soak",
        ],
    ),
    ("commands of commands", &["test", "bench"]),
];

/// xtask's modules (`e2e::cluster`, `e2e` for `e2e/mod.rs`) and their sources without the
/// trailing `#[cfg(test)]` module.
fn xtask_modules(src: &Path) -> BTreeMap<String, String> {
    let mut modules = BTreeMap::new();
    let mut stack = vec![src.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            let Ok(relative) = path.strip_prefix(src) else {
                continue;
            };
            let Some(name) = relative.to_str().and_then(|r| r.strip_suffix(".rs")) else {
                continue;
            };
            let name = name.strip_suffix("/mod").unwrap_or(name).replace('/', "::");
            let text = fs::read_to_string(&path).unwrap_or_default();
            modules.insert(name, without_tests(&text));
        }
    }
    modules
}

/// `text`'s code: without comments (prose may name any module) and without its trailing
/// `#[cfg(test)] mod tests`, whose uses are the tests' own.
fn without_tests(text: &str) -> String {
    let code = text
        .find("#[cfg(test)]\nmod tests")
        .map_or(text, |at| &text[..at]);
    code.lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The paths `text` names after `prefix` (`crate::`, `super::`), with `use` groups expanded:
/// `crate::{a, b::{c, d}}` names `a`, `b::c` and `b::d`. Only the lowercase segments a path
/// starts with are kept (`build::kubernetes::Release` gives `build::kubernetes`).
fn paths_after(text: &str, prefix: &str) -> Vec<String> {
    fn group(rest: &str, base: &str, out: &mut Vec<String>) -> usize {
        // `rest` starts after a `{`; returns the bytes consumed through the matching `}`.
        let mut i = 0;
        let mut item = String::new();
        let bytes = rest.as_bytes();
        while i < bytes.len() {
            match bytes[i] {
                b'{' => {
                    let inner = format!("{base}{}", item.trim());
                    i += 1 + group(&rest[i + 1..], &inner, out);
                    item.clear();
                }
                b'}' => {
                    push(&format!("{base}{}", item.trim()), out);
                    return i + 1;
                }
                b',' => {
                    push(&format!("{base}{}", item.trim()), out);
                    item.clear();
                    i += 1;
                }
                c => {
                    item.push(char::from(c));
                    i += 1;
                }
            }
        }
        i
    }
    fn push(path: &str, out: &mut Vec<String>) {
        let path = path.split(" as ").next().unwrap_or_default();
        let segments: Vec<&str> = path
            .split("::")
            .map(str::trim)
            .take_while(|s| {
                s.chars().next().is_some_and(|c| c.is_ascii_lowercase()) && *s != "self"
            })
            .collect();
        if !segments.is_empty() {
            out.push(segments.join("::"));
        }
    }
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find(prefix) {
        let preceded_by_ident = rest[..at]
            .chars()
            .next_back()
            .is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':');
        rest = &rest[at + prefix.len()..];
        if preceded_by_ident {
            continue;
        }
        if let Some(inner) = rest.strip_prefix('{') {
            let used = group(inner, "", &mut out);
            rest = &inner[used..];
        } else {
            let end = rest
                .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
                .unwrap_or(rest.len());
            push(rest[..end].trim_end_matches(':'), &mut out);
            rest = &rest[end..];
        }
    }
    out
}

/// The module graph of `modules`: for each, the modules it uses (through `crate::` and
/// `super::` paths, each path resolved to the longest module it starts with) and the
/// submodules it declares.
fn module_graph(modules: &BTreeMap<String, String>) -> BTreeMap<String, BTreeSet<String>> {
    let resolve = |path: &str| -> Option<String> {
        let segments: Vec<&str> = path.split("::").collect();
        (1..=segments.len())
            .rev()
            .map(|n| segments[..n].join("::"))
            .find(|m| modules.contains_key(m))
    };
    let mut graph = BTreeMap::new();
    for (name, text) in modules {
        let mut uses = BTreeSet::new();
        let parent = name.rsplit_once("::").map(|(p, _)| p);
        for path in paths_after(text, "crate::") {
            uses.extend(resolve(&path));
        }
        for path in paths_after(text, "super::") {
            let full = match parent {
                Some(p) => format!("{p}::{path}"),
                None => path,
            };
            uses.extend(resolve(&full).or_else(|| parent.map(str::to_owned)));
        }
        for child in modules.keys() {
            if child
                .strip_prefix(name.as_str())
                .and_then(|r| r.strip_prefix("::"))
                .is_some_and(|r| !r.contains("::"))
            {
                uses.insert(child.clone());
            }
        }
        uses.remove(name);
        graph.insert(name.clone(), uses);
    }
    graph
}

/// The uses that break [`XTASK_LAYERS`], a module missing from it, and a cycle, as lines.
fn xtask_layer_problems(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<String> {
    let layer_of = |module: &str| {
        let top = module.split("::").next().unwrap_or_default();
        XTASK_LAYERS
            .iter()
            .position(|(_, modules)| modules.contains(&top))
    };
    let mut problems = Vec::new();
    for (module, uses) in graph {
        if module == "main" || module == "tidy" {
            continue;
        }
        let Some(layer) = layer_of(module) else {
            if !module.contains("::") {
                problems.push(format!("xtask module `{module}` is in no layer"));
            }
            continue;
        };
        for used in uses {
            if layer_of(used).is_some_and(|l| l > layer) {
                problems.push(format!(
                    "`{module}` ({}) uses `{used}` ({})",
                    XTASK_LAYERS[layer].0,
                    XTASK_LAYERS[layer_of(used).unwrap_or(layer)].0
                ));
            }
        }
    }
    if let Some(cycle) = find_cycle(graph) {
        problems.push(format!("a cycle: {}", cycle.join(" -> ")));
    }
    problems
}

/// One cycle of `graph`, as the modules along it (the first repeated at the end).
fn find_cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit<'a>(
        node: &'a str,
        graph: &'a BTreeMap<String, BTreeSet<String>>,
        done: &mut BTreeSet<&'a str>,
        path: &mut Vec<&'a str>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|n| *n == node) {
            let mut cycle: Vec<String> = path[at..].iter().map(|n| (*n).to_owned()).collect();
            cycle.push(node.to_owned());
            return Some(cycle);
        }
        if !done.insert(node) {
            return None;
        }
        path.push(node);
        for next in graph.get(node).into_iter().flatten() {
            if let Some(cycle) = visit(next, graph, done, path) {
                return Some(cycle);
            }
        }
        path.pop();
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|n| visit(n, graph, &mut done, &mut Vec::new()))
}

#[test]
fn xtask_modules_use_only_lower_layers_and_form_no_cycle() {
    let root = util::repo_root().unwrap();
    let modules = xtask_modules(&root.join("xtask/src"));
    let graph = module_graph(&modules);
    assert!(
        graph
            .get("e2e::cluster")
            .is_some_and(|uses| uses.contains("build::kubernetes")),
        "the graph misses a use: {graph:?}"
    );
    let problems = xtask_layer_problems(&graph);
    assert!(
        problems.is_empty(),
        "xtask's modules break their layering (see XTASK_LAYERS):\n  {}",
        problems.join("\n  ")
    );
}

#[test]
fn xtask_layer_check_catches_an_upward_use_and_a_cycle() {
    let sources = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(m, t)| ((*m).to_owned(), without_tests(t)))
            .collect()
    };
    let modules = sources(&[
        (
            "util",
            "fn f() {}\n#[cfg(test)]\nmod tests {\n    use crate::test;\n}\n",
        ),
        ("build", "pub mod kubernetes;\n"),
        (
            "build::kubernetes",
            "use crate::{util, e2e::{self, cluster::Release}};\n",
        ),
        ("e2e", "pub mod cluster;\n"),
        (
            "e2e::cluster",
            "use super::Stage;\nuse crate::build::kubernetes::Release;\n",
        ),
        ("test", "fn t() { crate::e2e::cluster::run(); }\n"),
    ]);
    let graph = module_graph(&modules);
    assert_eq!(
        graph["util"],
        BTreeSet::new(),
        "a comment or a test module counts as a use"
    );
    let problems = xtask_layer_problems(&graph);
    assert_eq!(
        problems,
        [
            "`build::kubernetes` (builds) uses `e2e` (stages)",
            "`build::kubernetes` (builds) uses `e2e::cluster` (stages)",
            "a cycle: build::kubernetes -> e2e -> e2e::cluster -> build::kubernetes",
        ]
    );
}

#[test]
fn architecture_lists_xtasks_layers_as_the_check_has_them() {
    let root = util::repo_root().unwrap();
    let architecture = fs::read_to_string(root.join("ARCHITECTURE.md")).unwrap();
    for (layer, modules) in XTASK_LAYERS {
        let row = architecture
            .lines()
            .find(|l| l.starts_with(&format!("| {layer} |")))
            .unwrap_or_else(|| panic!("ARCHITECTURE.md has no row for xtask's layer {layer:?}"));
        let listed: BTreeSet<&str> = row
            .split('|')
            .nth(2)
            .unwrap_or_default()
            .split('`')
            .skip(1)
            .step_by(2)
            .collect();
        let want: BTreeSet<&str> = modules.iter().copied().collect();
        assert_eq!(listed, want, "ARCHITECTURE.md's row for xtask's {layer}");
    }
}

/// resmgr's core: the one module that owns the manager lock and what it protects
/// (ARCHITECTURE.md, "The core owns the lock").
const RESMGR_CORE: &str = "core";

/// resmgr's modules, each with its submodules as one (`handover` for `handover::conn`): the
/// graph its import circles are looked for in. `lib` is left out: it declares every module and
/// nothing names it.
fn top_level_graph(modules: &BTreeMap<String, String>) -> BTreeMap<String, BTreeSet<String>> {
    let top = |m: &str| m.split("::").next().unwrap_or_default().to_owned();
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (module, uses) in module_graph(modules) {
        let from = top(&module);
        if from == "lib" {
            continue;
        }
        let entry = graph.entry(from.clone()).or_default();
        entry.extend(
            uses.iter()
                .map(|u| top(u))
                .filter(|u| *u != from && u != "lib"),
        );
    }
    graph
}

/// The modules outside resmgr's core that name one of its submodules (`crate::core::commit`),
/// rather than what the core's root offers, as lines.
fn core_inside_problems(modules: &BTreeMap<String, String>) -> Vec<String> {
    let inside = format!("{RESMGR_CORE}::");
    let mut problems = Vec::new();
    for (module, text) in modules {
        if module == RESMGR_CORE || module.starts_with(&inside) {
            continue;
        }
        for path in paths_after(text, "crate::") {
            if path.starts_with(&inside) {
                problems.push(format!("`{module}` names `crate::{path}`, inside the core"));
            }
        }
    }
    problems
}

/// The `pub` fields of `structs` in `text` (a struct's lines up to its closing brace), as
/// lines.
fn public_fields(text: &str, structs: &[&str]) -> Vec<String> {
    let mut problems = Vec::new();
    for name in structs {
        let opening = [format!("struct {name} {{"), format!("struct {name}<'a> {{")];
        let Some(start) = text.lines().position(|l| {
            opening.iter().any(|o| {
                l.trim_start()
                    .trim_start_matches("pub(crate) ")
                    .starts_with(o.as_str())
            })
        }) else {
            problems.push(format!("no `struct {name}` found"));
            continue;
        };
        for line in text
            .lines()
            .skip(start + 1)
            .take_while(|l| !l.starts_with('}'))
        {
            let field = line.trim_start();
            if field.starts_with("pub ") || field.starts_with("pub(") {
                problems.push(format!("`{name}` has a public field: `{field}`"));
            }
        }
    }
    problems
}

/// Whether `code` takes the manager lock: calls `with_lock` (the core's API), or `.lock.with`
/// (the core's own way to its books), however the call is laid out.
fn takes_the_lock(code: &str) -> bool {
    let code: String = code.split_whitespace().collect();
    code.contains("with_lock(") || code.contains(".lock.with(")
}

/// The modules of `modules` that take the manager lock ([`takes_the_lock`]) without `#![deny(clippy::disallowed_methods)]`, as lines.
fn blocking_io_problems(
    modules: &BTreeMap<String, String>,
    sources: &BTreeMap<String, String>,
) -> Vec<String> {
    modules
        .iter()
        .filter(|(_, code)| takes_the_lock(code))
        .filter(|(m, _)| {
            !sources
                .get(*m)
                .is_some_and(|s| s.contains("#![deny(clippy::disallowed_methods)]"))
        })
        .map(|(m, _)| {
            format!("`{m}` takes the manager lock without `#![deny(clippy::disallowed_methods)]`")
        })
        .collect()
}

#[test]
fn resmgrs_modules_form_no_import_circle() {
    let root = util::repo_root().unwrap();
    let modules = xtask_modules(&root.join("crates/resmgr/src"));
    let graph = top_level_graph(&modules);
    assert!(
        graph
            .get("claims")
            .is_some_and(|uses| uses.contains(RESMGR_CORE) && uses.contains("manager")),
        "the graph misses a use: {graph:?}"
    );
    assert_eq!(
        find_cycle(&graph),
        None,
        "resmgr's modules import each other in a circle (ARCHITECTURE.md: the core under the \
         manager, the manager under the services)"
    );
}

#[test]
fn resmgr_circle_check_catches_a_circle_through_submodules() {
    let modules: BTreeMap<String, String> = [
        ("lib", "pub mod core;\npub mod manager;\n"),
        ("core", "mod commit;\nuse crate::state::State;\n"),
        (
            "core::commit",
            "use super::Core;\nuse crate::manager::Manager;\n",
        ),
        ("manager", "use crate::core::Core;\n"),
        ("handover", "mod conn;\n"),
        ("handover::conn", "use super::Message;\n"),
        ("state", "fn f() {}\n"),
    ]
    .iter()
    .map(|(m, t)| ((*m).to_owned(), without_tests(t)))
    .collect();
    let graph = top_level_graph(&modules);
    assert_eq!(
        graph["handover"],
        BTreeSet::new(),
        "a module's own submodule is no circle"
    );
    assert_eq!(
        find_cycle(&graph),
        Some(vec![
            "core".to_owned(),
            "manager".to_owned(),
            "core".to_owned()
        ])
    );
}

#[test]
fn only_resmgrs_core_names_its_insides_and_its_fields_are_private() {
    let root = util::repo_root().unwrap();
    let src = root.join("crates/resmgr/src");
    let modules = xtask_modules(&src);
    assert!(
        modules.contains_key("core::commit"),
        "no core::commit in {:?}",
        modules.keys()
    );
    let mut problems = core_inside_problems(&modules);
    let core = fs::read_to_string(src.join("core/mod.rs")).unwrap();
    problems.extend(public_fields(
        &without_tests(&core),
        &["Core", "Inner", "Books"],
    ));
    let guard = fs::read_to_string(src.join("core/guard.rs")).unwrap();
    problems.extend(public_fields(&without_tests(&guard), &["Guard"]));
    // The compile-fail guarantee is the scoped lock's (stdx's trybuild cases): it holds for the
    // manager lock as long as the lock is one, and the guard is made of its `Held`.
    if !core.contains("    lock: ScopedLock<Inner>,") || core.contains("Mutex<Inner>") {
        problems.push("the core's lock is not `lock: ScopedLock<Inner>`".to_owned());
    }
    if !guard.contains("inner: Held<'a, Inner>,") {
        problems.push("the core's `Guard` is not made of the scoped lock's `Held`".to_owned());
    }
    assert!(
        problems.is_empty(),
        "resmgr's core is reached around its API:\n  {}",
        problems.join("\n  ")
    );
}

#[test]
fn core_checks_catch_a_use_of_its_insides_and_a_public_field() {
    let modules: BTreeMap<String, String> = [
        ("core", "mod commit;\n"),
        ("core::commit", "use crate::core::guard::Guard;\n"),
        (
            "claims",
            "use crate::{core::{Change, commit::Io}, state::State};\n",
        ),
    ]
    .iter()
    .map(|(m, t)| ((*m).to_owned(), without_tests(t)))
    .collect();
    assert_eq!(
        core_inside_problems(&modules),
        ["`claims` names `crate::core::commit`, inside the core"]
    );
    let text = "pub(crate) struct Core {\n    published: P,\n    pub(crate) io: Io,\n}\nstruct Inner {\n    a: u8,\n}\n";
    assert_eq!(
        public_fields(text, &["Core", "Inner", "Books"]),
        [
            "`Core` has a public field: `pub(crate) io: Io,`",
            "no `struct Books` found"
        ]
    );
}

#[test]
fn every_resmgr_module_that_takes_the_lock_refuses_blocking_io() {
    let root = util::repo_root().unwrap();
    let src = root.join("crates/resmgr/src");
    let modules = xtask_modules(&src);
    let sources: BTreeMap<String, String> = modules
        .keys()
        .map(|m| {
            let file = if src.join(format!("{}.rs", m.replace("::", "/"))).exists() {
                src.join(format!("{}.rs", m.replace("::", "/")))
            } else {
                src.join(m.replace("::", "/")).join("mod.rs")
            };
            (m.clone(), fs::read_to_string(file).unwrap_or_default())
        })
        .collect();
    let taking: Vec<&String> = modules
        .iter()
        .filter(|(_, c)| takes_the_lock(c))
        .map(|(m, _)| m)
        .collect();
    assert!(
        taking.len() > 4,
        "too few modules take the lock: {taking:?}"
    );
    let problems = blocking_io_problems(&modules, &sources);
    assert!(
        problems.is_empty(),
        "blocking IO under the manager lock would pass clippy:\n  {}",
        problems.join("\n  ")
    );
    let clippy = fs::read_to_string(root.join("crates/resmgr/clippy.toml")).unwrap();
    for blocking in [
        "\"std::fs::write\"",
        "\"futures::executor::block_on\"",
        "\"tokio::runtime::Handle::block_on\"",
    ] {
        assert!(
            clippy.contains(blocking),
            "crates/resmgr/clippy.toml's disallowed-methods lacks {blocking}"
        );
    }
}
