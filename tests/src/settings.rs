//! The randomized models' settings, read from the environment (`RESMGR_SEED`, `RESMGR_STEPS`,
//! `RESMGR_SOAK_SECONDS`...: `cargo xtask soak` sets them).

/// The number in the environment variable `name`, if set; a value that is not one panics,
/// naming it (the models' settings: seeds, steps, seconds).
pub fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().map(|v| {
        v.parse()
            .unwrap_or_else(|e| panic!("{name}={v:?} is not a number: {e}"))
    })
}
