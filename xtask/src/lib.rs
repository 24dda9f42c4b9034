//! The library half of xtask: what both `cargo xtask` and the integration tests use: rendering
//! and packaging the Helm chart with Helm's own code (the tests parse the rendered manifests
//! into Kubernetes types; xtask writes them), and the OCI image builder (the e2e's test image,
//! the agent's image).

pub mod helm;
pub mod oci;
