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

/// Where a soak starts past the seeds every run tries: a number below a billion drawn from the
/// clock's nanoseconds, so that soaks started at any two instants (minutes or days apart) begin
/// far apart. The seconds alone would not do: a soak runs tens of seeds a second, so one started
/// an hour after another would walk seeds the other already ran.
pub fn clock_seed() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| {
            u64::from(d.subsec_nanos()) ^ (d.as_secs() % 1_000_000_000)
        })
        % 1_000_000_000
}
