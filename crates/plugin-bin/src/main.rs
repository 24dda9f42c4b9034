//! `resmgr`: the node agent binary.

use clap::{Parser, Subcommand};
use policy::topology::{Topology, TopologySource};

/// Decides which CPUs and memory nodes every container gets, and grants CPUs to DRA claims.
#[derive(Debug, Parser)]
#[command(name = "resmgr", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Print the topology as the policy sees it.
    Topology {
        /// `live`, `synthetic:<description>` or `xml:<path>`.
        #[arg(long, default_value = "live")]
        topology: String,
    },
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Topology { topology } => {
            let source = match topology.split_once(':') {
                Some(("synthetic", desc)) => TopologySource::Synthetic(desc.to_owned()),
                Some(("xml", path)) => TopologySource::Xml(path.into()),
                None if topology == "live" => TopologySource::Live,
                _ => anyhow::bail!(
                    "--topology {topology:?}: expected `live`, `synthetic:<description>` or `xml:<path>`"
                ),
            };
            let topo = Topology::load(&source)?;
            print!("{topo}");
        }
    }
    Ok(())
}
