//! The library half of xtask: what both `cargo xtask` and the integration tests use, which is the
//! Helm chart renderer and packager (the tests parse the rendered manifests into Kubernetes
//! types; xtask writes them).

pub mod chart;
