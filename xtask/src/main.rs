//! `cargo xtask`: the repository's build system.
//!
//! Every command a maintainer or CI runs is here, so that the README can promise exactly two
//! commands (`cargo xtask demo`, `cargo xtask test`) and have them set up a fresh machine by
//! themselves. Repository rules that need no compilation of the product (layering, module docs)
//! are plain `#[test]`s in [`tidy`], run by `cargo test --workspace`.

mod bench;
mod codegen;
mod release;
mod sysdeps;
mod test;
#[cfg(test)]
mod tidy;
mod util;

use std::path::PathBuf;

use clap::{Parser, Subcommand};

/// Repository automation for resmgr.
#[derive(Debug, Parser)]
#[command(name = "cargo xtask")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run everything CI checks: fmt, clippy, tests, the codegen check and the Go conformance tests.
    Test,
    /// Run the agent's simulator on a built-in scenario and print what was placed where.
    Demo,
    /// Regenerate the protocol code from the .proto files (pure Rust, no protoc).
    Codegen {
        /// Fail if the committed generated code differs from what the .proto files produce.
        #[arg(long)]
        check: bool,
    },
    /// Build the release binary of `resmgr`.
    Build,
    /// Build the stripped release binary and deploy artefacts with SHA-256 checksums into dist/.
    Release {
        /// Output directory (default: dist/ at the repository root).
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Run every benchmark of the workspace and the conformance module; print one summary table.
    Bench,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let root = util::repo_root()?;
    match cli.command {
        Command::Test => test::run(&root),
        Command::Demo => release::demo(&root),
        Command::Codegen { check } => codegen::run(&root, check),
        Command::Build => release::build(&root),
        Command::Release { out } => release::release(&root, out.as_deref()),
        Command::Bench => bench::run(&root),
    }
}
