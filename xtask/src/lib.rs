//! The library half of xtask: what both `cargo xtask` and the integration tests use, which is
//! rendering and packaging the Helm chart with Helm's own code (the tests parse the rendered
//! manifests into Kubernetes types; xtask writes them).

pub mod helm;
