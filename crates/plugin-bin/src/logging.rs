//! Logging: `tracing` to stderr as text or JSON lines, filtered by `RUST_LOG` (default given by
//! the command: `info` for the agent, `warn` for the simulator, whose report is on stdout).

use tracing_subscriber::{EnvFilter, fmt};

use crate::values::Format;

/// Installs the global subscriber. Installing twice is harmless (the second is ignored).
pub fn init(format: Format, default_filter: &str) {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_filter));
    let builder = fmt().with_env_filter(filter).with_writer(std::io::stderr);
    let _ = match format {
        Format::Text => builder.try_init(),
        Format::Json => builder.json().flatten_event(true).try_init(),
    };
}
