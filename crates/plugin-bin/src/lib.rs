//! `resmgr`: the node agent binary, as a library whose [`main`] the binary runs
//! (`src/main.rs`).
//!
//! - `resmgr run`: the agent (NRI plugin and kubelet DRA plugin), see [`run`];
//! - `resmgr simulate SCENARIO`: the real resource manager and policy against a simulated node,
//!   see [`simulate`];
//! - `resmgr topology`: the machine, its pools and DRA devices, as the policy sees them;
//! - `resmgr slices`: the ResourceSlices the agent would publish for a node, see [`slices`];
//! - `resmgr config --print-defaults`: the complete default config file, see [`settings`].
//!
//! Only this crate reads the environment and the command line, and only it uses `anyhow`. A
//! panic anywhere in the process aborts it at once ([`panics`]).
//!
//! It is a library so that the tests package can run the same agent with fault hooks
//! ([`resmgr::faults`]): its `resmgr-crashing` binary is [`main`] with the crash test's hook,
//! which aborts the process at the point its environment names, for the Go handover suite. The
//! shipped binary passes no hooks, and no crate it is built from has any. The tests package's
//! randomized model of handovers (`tests/tests/random_handover.rs`) runs several agents' [`node`]
//! (who owns the node, and the takeover) in one process, exactly as `resmgr run` wires it.

mod config;
mod http;
mod logging;
mod memory;
mod metrics;
mod panics;
mod policy_choice;
mod run;
mod settings;
mod simulate;
mod slices;
mod topology;
mod values;
mod view;

pub use run::node;

use std::{path::PathBuf, process::ExitCode};

use clap::{Parser, Subcommand};
use resmgr::faults::Faults;

use crate::values::Format;

/// Decides which CPUs and memory nodes every container gets, and grants CPUs to DRA claims.
#[derive(Debug, Parser)]
#[command(name = "resmgr", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the agent: the NRI plugin and the kubelet DRA plugin.
    Run(Box<config::RunFlags>),
    /// Run the resource manager and policy against a simulated node, from a scenario file.
    Simulate {
        /// The scenario (YAML; see examples/scenarios/).
        scenario: PathBuf,
        /// Where to write the CDI specs [default: a temporary directory].
        #[arg(long, value_name = "DIR")]
        cdi_dir: Option<PathBuf>,
        /// Where to keep the agent's state (`state.json`) [default: a temporary directory]. A
        /// state already there is restored first, as the agent restores it at start-up.
        #[arg(long, value_name = "DIR")]
        state_dir: Option<PathBuf>,
        /// `text` or `json`.
        #[arg(long, value_enum, default_value_t = Format::Text)]
        output: Format,
        /// Also draw the machine, coloured by who holds each CPU, into this SVG file.
        #[arg(long, value_name = "FILE")]
        svg: Option<PathBuf>,
    },
    /// Print the topology as the policy sees it, with its pools and the DRA devices it publishes.
    Topology {
        /// `live`, `synthetic:<description>` or `xml:<file>`.
        #[arg(long, default_value = "live")]
        topology: String,
        /// CPUs for system pods, as a cpuset in the kubelet's reservedSystemCPUs syntax (`0`,
        /// `0-1`, `0,32`).
        #[arg(long, value_name = "CPUSET", conflicts_with = "reserved_cpu_count")]
        reserved_cpus: Option<String>,
        /// How many CPUs to reserve for system pods, when --reserved-cpus is not given.
        #[arg(long, default_value = "1", value_name = "COUNT")]
        reserved_cpu_count: String,
        /// `text` or `json`.
        #[arg(long, value_enum, default_value_t = Format::Text)]
        format: Format,
    },
    /// Print the ResourceSlices the agent would publish for a node, from the settings of `resmgr
    /// run`.
    Slices(Box<slices::SliceArgs>),
    /// The agent's configuration file.
    Config {
        /// Print the complete default config file, every setting documented.
        #[arg(long, required = true)]
        print_defaults: bool,
    },
    /// Print a generated document (docs/configuration.md or docs/metrics.md); `cargo xtask docs`
    /// writes and checks them.
    #[command(hide = true)]
    Docs {
        #[arg(value_enum)]
        which: Doc,
    },
}

/// The generated documents.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum Doc {
    Configuration,
    Metrics,
}

/// The `resmgr` command line, with `faults` given to the agent that `resmgr run` starts (none in
/// the shipped binary).
pub fn main(faults: Faults) -> ExitCode {
    panics::install();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Run(flags) => run::main(
            &flags,
            std::env::var("NODE_NAME").ok(),
            std::env::var("POD_UID").ok(),
            std::env::var("POD_TEMPLATE_GENERATION").ok(),
            faults,
        ),
        Command::Simulate {
            scenario,
            cdi_dir,
            state_dir,
            output,
            svg,
        } => simulate_main(&scenario, cdi_dir, state_dir, output, svg.as_deref()),
        Command::Topology {
            topology,
            reserved_cpus,
            reserved_cpu_count,
            format,
        } => topology::main(
            &topology,
            reserved_cpus.as_deref(),
            &reserved_cpu_count,
            format,
        ),
        Command::Slices(args) => slices::main(&args, std::env::var("NODE_NAME").ok()),
        Command::Config { print_defaults: _ } => {
            print!("{}", settings::default_file());
            Ok(ExitCode::SUCCESS)
        }
        Command::Docs { which } => {
            print!(
                "{}",
                match which {
                    Doc::Configuration => settings::markdown(),
                    Doc::Metrics => metrics::markdown(),
                }
            );
            Ok(ExitCode::SUCCESS)
        }
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            // The whole chain on one line, each cause once (some third-party errors, such as
            // kube's kubeconfig errors, repeat their cause in their message).
            eprintln!("resmgr: {}", stdx::errors::chain(&*e));
            ExitCode::FAILURE
        }
    }
}

fn simulate_main(
    path: &std::path::Path,
    cdi_dir: Option<PathBuf>,
    state_dir: Option<PathBuf>,
    output: Format,
    svg: Option<&std::path::Path>,
) -> anyhow::Result<ExitCode> {
    logging::init(Format::Text, "warn");
    let scenario = simulate::scenario::load(path)?;
    let scratch = tempfile::Builder::new()
        .prefix("resmgr-simulate-")
        .tempdir()?;
    let cdi_given = cdi_dir.is_some();
    let cdi = match cdi_dir {
        Some(dir) => dir,
        None => scratch.path().join("cdi"),
    };
    let dirs = simulate::Dirs {
        cdi: cdi.clone(),
        state: state_dir
            .clone()
            .unwrap_or_else(|| scratch.path().join("state")),
        ..simulate::Dirs::under(scratch.path())
    };
    // The name only: reports must not depend on where the scenario was run from.
    let file = path.file_name().map_or_else(
        || path.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    );
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let outcome = runtime.block_on(simulate::run(&scenario, &file, dirs))?;
    match output {
        Format::Text => print!("{}", outcome.report.text()),
        Format::Json => print!("{}", outcome.report.json()),
    }
    if cdi_given {
        eprintln!("CDI specs written to {}", cdi.display());
    } else {
        eprintln!(
            "CDI specs were written to a temporary directory, removed now; pass --cdi-dir to keep them"
        );
    }
    if let Some(dir) = &state_dir {
        eprintln!("state written to {}", dir.display());
    }
    if let Some(svg) = svg {
        let title = format!("resmgr simulate {file}");
        std::fs::write(
            svg,
            simulate::svg::render(&outcome.topology, &outcome.inventory, &title),
        )
        .map_err(|e| anyhow::anyhow!("--svg {}: cannot write it: {e}", svg.display()))?;
    }
    Ok(ExitCode::SUCCESS)
}
