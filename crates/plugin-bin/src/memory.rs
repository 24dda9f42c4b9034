//! How `resmgr run` keeps its heap small, measured by `cargo xtask bench` (`Footprint`: the agent
//! with 500 containers).
//!
//! - [`one_malloc_arena`]: glibc gives each thread that ever contended for the heap an arena of
//!   its own (up to 8 per CPU), each keeping its own free memory. The agent's threads (the
//!   runtime's two workers, the few that do disk IO) are rarely busy at once: one arena is enough.
//! - [`return_freed_memory`]: glibc returns freed memory to the system only from the top of the
//!   heap. The runtime's Synchronize (every container of the node, decoded, translated and
//!   placed at once) is the agent's one large burst; afterwards the holes it leaves are given
//!   back.
//!
//! Both are best effort: where they do not apply (not glibc) or fail, the agent runs as before.
//! The rest of the agent's resident memory is mostly its own binary's code pages, which the
//! release profile's size settings (Cargo.toml) keep down.

/// Makes glibc's malloc use one arena for the whole process, unless `MALLOC_ARENA_MAX` says
/// otherwise. Call before any other thread starts.
pub fn one_malloc_arena() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    if std::env::var_os("MALLOC_ARENA_MAX").is_none() {
        #[allow(unsafe_code, reason = "mallopt is glibc's interface for M_ARENA_MAX")]
        // SAFETY: mallopt only sets a malloc parameter; no other thread exists yet.
        let set = unsafe { libc::mallopt(libc::M_ARENA_MAX, 1) };
        if set != 1 {
            tracing::warn!("glibc refused M_ARENA_MAX=1: malloc keeps an arena per thread");
        }
    }
}

/// Gives the heap's free pages back to the system (glibc's `malloc_trim`).
pub fn return_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        #[allow(unsafe_code, reason = "malloc_trim is glibc's interface for it")]
        // SAFETY: malloc_trim only releases free memory of malloc's own heap.
        let _released = unsafe { libc::malloc_trim(0) };
    }
}
