//! The CDI (Container Device Interface) spec model, the per-claim spec store, and the durable
//! file write both it and resmgr's state file use.
//!
//! A prepared DRA claim is granted to its containers through a CDI spec of its own: the kubelet
//! hands the runtime the qualified device names [`SpecStore::write_claim`] returned, and
//! containerd or CRI-O resolve them from the spec file it wrote. This crate knows nothing of what
//! a claim means, of policies, or of the kubelet: to it a claim is a validated UID and a list of
//! edits.
//!
//! # What is on disk
//!
//! The store owns the files of one vendor in one directory (normally `/var/run/cdi`, the
//! runtimes' highest-priority directory; it is tmpfs, so specs vanish on reboot and are written
//! again when the kubelet re-prepares the claims). For vendor `example.com`:
//!
//! | file | meaning |
//! |---|---|
//! | `example.com-device_<uid>.json` | the spec of prepared claim `<uid>`: kind `example.com/device`, one device `claim-<uid>-<i>` per allocation result `i`, each with that result's edits (typically one env entry naming the claim). Exists from the end of prepare until the start of unprepare. |
//! | `.example.com-device_<uid>.json.<random>.tmp` | a write in flight, or left by a crash during one. Never read by the runtimes (they scan only `*.json` and `*.yaml`); removed by [`SpecStore::remove_temporary_files`] at start-up. |
//! | anything else | not ours (other vendors' specs, static specs): never read, listed or touched. |
//!
//! The device `example.com/device=claim-<uid>-<i>` is what the kubelet puts in the container's CDI
//! devices; [`claim_of_device`] maps it back to the claim and the index. Device names carry the
//! `claim-` prefix because UIDs often start with a digit, which would need CDI 0.5.0; with it an
//! env-only spec declares `cdiVersion: 0.3.0` and loads in the oldest runtimes.
//!
//! # Modules
//!
//! - [`spec`]: the serde model of a spec document (reads YAML and JSON, writes JSON, rejects
//!   unknown fields like the runtimes).
//! - [`names`]: vendor, class, kind, device and qualified name rules, plus the length limits the
//!   specification states and the reference code does not enforce.
//! - [`version`]: the known versions and the minimum a spec needs; the store writes exactly that.
//! - [`validate`]: whole-spec and edit validation, errors naming the field and the value.
//! - [`claim`]: claim UIDs and the naming scheme above (no IO).
//! - [`store`]: [`SpecStore`], the claims' spec files.
//! - [`durable`]: atomic and durable file replacement, the only module that writes files; also
//!   used by resmgr for its state file (the module says why it lives here).
//!
//! # Why not the `container-device-interface` crate
//!
//! Its 1.1 releases pull in about 180 crates (an HTTP stack among them), keep most spec fields and
//! the name validators crate-private, and have no writer; the model here is a few serde structs.
//! The rules are ported from the reference Go implementation, and the Go conformance tests
//! (`tests/conformance/cdi`) check our files against its cache.

pub mod claim;
pub mod durable;
pub mod names;
pub mod spec;
pub mod store;
pub mod validate;
pub mod version;

pub use claim::{ClaimDevice, ClaimDeviceError, ClaimUid, UidError, claim_of_device};
pub use names::{NameError, QualifiedName};
pub use spec::{
    ContainerEdits, Device, DeviceNode, Hook, IntelRdt, Mount, NetDevice, ParseError, Spec,
};
pub use store::{SpecStore, StoreError};
pub use validate::{ValidationError, validate_edits, validate_spec};
pub use version::{Version, minimum_version};
