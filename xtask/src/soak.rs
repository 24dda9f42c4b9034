//! `cargo xtask soak`: the long runs that `cargo xtask test` keeps short.
//!
//! - `--invariant-cases N`: the policy invariant of issue 18 (`crates/policy/tests/invariant.rs`:
//!   claims the scheduler allocates are prepared, no CPU is held twice, admitted containers run)
//!   on N seeded random walks per machine shape and device model, optimized. The first seed is
//!   printed; a failure prints the command that replays the failing walk.

use std::{
    path::Path,
    time::{SystemTime, UNIX_EPOCH},
};

use crate::{sysdeps, util};

/// What to soak, and how long.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Random walks per test of the policy invariant.
    #[arg(long, default_value_t = 500)]
    pub invariant_cases: u64,
    /// Steps per walk.
    #[arg(long, default_value_t = 200)]
    pub invariant_steps: u64,
    /// The first walk's seed (default: from the clock).
    #[arg(long)]
    pub seed: Option<u64>,
}

pub fn run(root: &Path, args: &Args) -> anyhow::Result<()> {
    sysdeps::ensure()?;
    let seed = args.seed.unwrap_or_else(|| {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs())
    });
    println!(
        "soak: policy invariant, {} walks of {} steps per test, seeds {seed}..{}",
        args.invariant_cases,
        args.invariant_steps,
        seed.saturating_add(args.invariant_cases)
    );
    util::run(
        util::cargo()
            .current_dir(root)
            .env("RESMGR_INVARIANT_CASES", args.invariant_cases.to_string())
            .env("RESMGR_INVARIANT_STEPS", args.invariant_steps.to_string())
            .env("RESMGR_INVARIANT_SEED", seed.to_string())
            .args([
                "test",
                "--release",
                "--locked",
                "-p",
                "policy",
                "--test",
                "invariant",
            ]),
    )
}
