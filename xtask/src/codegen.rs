//! `cargo xtask codegen [--check]`: Rust code from our .proto files, with no `protoc` anywhere.
//!
//! protox (a protobuf compiler written in Rust) parses the .proto files into a descriptor set;
//! prost-build turns messages into Rust types and tonic-prost-build adds gRPC clients and servers.
//! The output is committed under each crate's `src/generated/`, so building the product never runs
//! a code generator; `--check` regenerates into a temporary directory and fails on any difference,
//! which is how stale generated code fails CI.

use std::{
    collections::BTreeMap,
    fs,
    path::{Path, PathBuf},
};

use anyhow::{Context, bail};

/// What to generate for a crate's protos.
#[derive(Debug, Clone, Copy)]
enum Flavour {
    /// Messages plus tonic clients and servers (kubelet-facing gRPC).
    Grpc,
    /// Messages only: the services are served by the crate's own transport (NRI over ttrpc).
    MessagesOnly,
}

/// The crates that own .proto files, relative to the repository root.
const TARGETS: &[(&str, Flavour)] = &[
    ("crates/dra-proto", Flavour::Grpc),
    ("crates/nri", Flavour::MessagesOnly),
];

pub fn run(root: &Path, check: bool) -> anyhow::Result<()> {
    let mut stale = Vec::new();
    for &(krate, flavour) in TARGETS {
        let crate_dir = root.join(krate);
        let proto_dir = crate_dir.join("proto");
        if !proto_dir.is_dir() {
            continue;
        }
        let tmp = tempfile::tempdir().context("creating a temporary directory")?;
        generate(&proto_dir, flavour, tmp.path())
            .with_context(|| format!("generating code for {krate}"))?;
        let out_dir = crate_dir.join("src/generated");
        let fresh = read_dir_files(tmp.path())?;
        if check {
            let committed = if out_dir.is_dir() {
                read_dir_files(&out_dir)?
            } else {
                BTreeMap::new()
            };
            for (name, text) in &fresh {
                if committed.get(name) != Some(text) {
                    stale.push(format!("{krate}/src/generated/{name} is out of date"));
                }
            }
            for name in committed.keys().filter(|n| !fresh.contains_key(*n)) {
                stale.push(format!("{krate}/src/generated/{name} has no .proto source"));
            }
        } else {
            if out_dir.is_dir() {
                fs::remove_dir_all(&out_dir)
                    .with_context(|| format!("removing {}", out_dir.display()))?;
            }
            fs::create_dir_all(&out_dir)
                .with_context(|| format!("creating {}", out_dir.display()))?;
            for (name, text) in &fresh {
                fs::write(out_dir.join(name), text)
                    .with_context(|| format!("writing {krate}/src/generated/{name}"))?;
            }
            eprintln!("generated {} file(s) in {krate}/src/generated", fresh.len());
        }
    }
    if !stale.is_empty() {
        bail!(
            "generated code is stale; run `cargo xtask codegen`:\n  {}",
            stale.join("\n  ")
        );
    }
    if check {
        eprintln!("generated code is up to date");
    }
    Ok(())
}

fn generate(proto_dir: &Path, flavour: Flavour, out: &Path) -> anyhow::Result<()> {
    let mut protos: Vec<PathBuf> = fs::read_dir(proto_dir)
        .with_context(|| format!("reading {}", proto_dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "proto"))
        .collect();
    protos.sort();
    let fds = protox::compile(&protos, [proto_dir]).map_err(|e| anyhow::anyhow!("{e:?}"))?;
    match flavour {
        Flavour::Grpc => tonic_prost_build::configure()
            .build_client(true)
            .build_server(true)
            // A request that does not decode is the caller's fault: InvalidArgument, not the
            // Internal of tonic-prost's own codec (see crates/dra-proto/src/codec.rs).
            .codec_path("crate::codec::InvalidArgumentCodec")
            .out_dir(out)
            .compile_fds(fds)
            .context("tonic-prost-build")?,
        Flavour::MessagesOnly => prost_build::Config::new()
            .out_dir(out)
            .compile_fds(fds)
            .context("prost-build")?,
    }
    Ok(())
}

fn read_dir_files(dir: &Path) -> anyhow::Result<BTreeMap<String, String>> {
    let mut files = BTreeMap::new();
    for entry in fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry?.path();
        if path.is_file() {
            let name = path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            let text =
                fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
            files.insert(name, text);
        }
    }
    Ok(files)
}
