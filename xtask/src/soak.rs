//! `cargo xtask soak`: the long runs that `cargo xtask test` keeps short.
//!
//! - `--invariant-cases N`: the policy invariant of issue 18 (`crates/policy/tests/invariant.rs`:
//!   claims the scheduler allocates are prepared, no CPU is held twice, admitted containers run)
//!   on N seeded random walks per machine shape and device model, optimized. The first seed is
//!   printed; a failure prints the command that replays the failing walk.
//! - `--minutes N`: instead, the randomized lifecycle test of issue 15
//!   (`tests/tests/random_lifecycle.rs`: concurrent kubelet calls, runtime events, faults,
//!   in-process crashes and restarts, checked against the lifecycle's invariants after every
//!   step) for two thirds of N minutes, then the randomized handover model
//!   (`tests/tests/random_handover.rs`: two or three agents starting, dying and handing the node
//!   over at random instants) for the rest, each drawing new seeds, optimized, from `--seed`
//!   (default: each test draws a first seed past its bounded run's, different on every run, and
//!   prints it). A failure prints the seed, the step, the steps before it and the command that
//!   reruns that seed; the end, what the run did: seeds, steps, operations.

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
    /// The first walk's seed (default: from the clock; with `--minutes`, a seed past those the
    /// bounded lifecycle run covers, drawn by the test from the clock).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Run the randomized lifecycle test for this many minutes (instead of the invariant walks).
    #[arg(long)]
    pub minutes: Option<u64>,
}

pub fn run(root: &Path, args: &Args) -> anyhow::Result<()> {
    sysdeps::ensure()?;
    if let Some(minutes) = args.minutes {
        return lifecycle(root, minutes, args.seed);
    }
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

/// The randomized lifecycle test, then the randomized handover model, for `minutes` in all,
/// each from seed `first` (default: each test draws one past its bounded run's seeds, and
/// prints it).
fn lifecycle(root: &Path, minutes: u64, first: Option<u64>) -> anyhow::Result<()> {
    let seconds = minutes * 60;
    let handover = seconds / 3;
    for (test, seconds) in [
        ("random_lifecycle", seconds - handover),
        ("random_handover", handover),
    ] {
        if seconds == 0 {
            continue;
        }
        println!("soak: {test} for {seconds} s");
        let mut cargo = util::cargo();
        if let Some(first) = first {
            cargo.env("RESMGR_FIRST_SEED", first.to_string());
        }
        util::run(
            cargo
                .current_dir(root)
                .env("RESMGR_SOAK_SECONDS", seconds.to_string())
                .args([
                    "test",
                    "--release",
                    "--locked",
                    "-p",
                    "integration-tests",
                    "--test",
                    test,
                    "--",
                    "--nocapture",
                ]),
        )?;
    }
    Ok(())
}
