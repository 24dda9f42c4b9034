//! `resmgr run`: the agent.

use std::process::ExitCode;

use crate::config::RunFlags;

pub fn main(flags: &RunFlags, node_name_env: Option<String>) -> anyhow::Result<ExitCode> {
    let config = flags.resolve(node_name_env)?;
    if flags.print_config {
        println!("{}", serde_json::to_string_pretty(&config)?);
        return Ok(ExitCode::SUCCESS);
    }
    Ok(ExitCode::SUCCESS)
}
