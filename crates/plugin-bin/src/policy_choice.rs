//! The one place the binary names the policy it runs. Everything else (the resource manager,
//! [`crate::view`], the metrics, `/debug/state`, the simulator, `resmgr topology`) holds a
//! `Box<dyn Policy>` and reads it through the trait, so running another policy means changing
//! this function only.

use policy::{
    Policy, Topology, TopologyAware,
    topology_aware::{Config, ConfigError},
};

/// The policy for `topology`, holding nothing yet.
pub fn build(topology: Topology, config: Config) -> Result<Box<dyn Policy>, ConfigError> {
    Ok(Box::new(TopologyAware::new(topology, config)?))
}
