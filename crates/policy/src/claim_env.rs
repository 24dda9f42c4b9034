//! The environment a claim's CDI spec gives a container, and the evidence that a container uses
//! a claim, as seen from outside any policy.
//!
//! A claim's spec sets `DRA_CPUSET_<uid>=<cpus>` (and `DRA_MEMS_<uid>=<nodes>` when it pins
//! memory), and the same under the UID's [`shell_safe`] name. This is part of what workloads
//! read, so it is the product's convention, not one policy's: the topology-aware policy writes
//! it, and the resource manager reads it back when it must tell, before any policy has seen a
//! claim, whether a running container uses it (start-up reconciliation of CDI specs the state
//! does not account for).
//!
//! A container uses claim `uid` of vendor `driver` when the runtime reports the CDI device
//! `<driver>/device=claim-<uid>-<i>` (parsed with [`cdi::claim_of_device`]), or, for runtimes
//! that report no CDI devices at Synchronize (containerd before 2.3), when its environment sets
//! `DRA_CPUSET_` with the UID or its shell-safe name.

use crate::model::Container;

/// The prefix of the environment variable carrying a claim's CPUs.
pub const CPUSET_ENV: &str = "DRA_CPUSET_";
/// The prefix of the environment variable carrying a claim's memory nodes.
pub const MEMS_ENV: &str = "DRA_MEMS_";

/// A claim UID as a shell accepts it in a variable name: hyphens as underscores
/// (`DRA_CPUSET_0b6c2a4e_7f3d_…`). Kubernetes UIDs are hex digits and hyphens, so this is
/// the UID's only change.
pub fn shell_safe(uid: &str) -> String {
    uid.replace('-', "_")
}

/// Whether `container` shows that it uses claim `uid` of vendor `driver`: see the module docs.
pub fn uses_claim(container: &Container, driver: &str, uid: &str) -> bool {
    let by_device = container.cdi_devices.iter().any(|dev| {
        cdi::claim_of_device(dev).is_ok_and(|d| d.vendor == driver && d.uid.as_str() == uid)
    });
    by_device || cpuset_env(container, uid).is_some()
}

/// The CPUs `container`'s environment says claim `uid` granted it (`DRA_CPUSET_<uid>`, or the
/// shell-safe name), as written.
pub fn cpuset_env<'a>(container: &'a Container, uid: &str) -> Option<&'a str> {
    value(container, CPUSET_ENV, uid)
}

/// The memory nodes `container`'s environment says claim `uid` pinned it to, as written.
pub fn mems_env<'a>(container: &'a Container, uid: &str) -> Option<&'a str> {
    value(container, MEMS_ENV, uid)
}

/// The CPUs an environment (a claim's CDI edits, a container's) says claim `uid` grants
/// (`DRA_CPUSET_<uid>`, or the shell-safe name), as written.
pub fn cpuset_in<'a>(env: impl IntoIterator<Item = &'a String>, uid: &str) -> Option<&'a str> {
    value_in(env, CPUSET_ENV, uid)
}

fn value<'a>(container: &'a Container, prefix: &str, uid: &str) -> Option<&'a str> {
    value_in(&container.env, prefix, uid)
}

fn value_in<'a>(
    env: impl IntoIterator<Item = &'a String>,
    prefix: &str,
    uid: &str,
) -> Option<&'a str> {
    let safe = shell_safe(uid);
    env.into_iter().find_map(|entry| {
        let (name, value) = entry.split_once('=')?;
        let named = name.strip_prefix(prefix)?;
        (named == uid || named == safe).then_some(value)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const UID: &str = "0b6c2a4e-7f3d-4000-8000-000000000001";

    fn with(env: &[&str], devices: &[&str]) -> Container {
        Container {
            env: env.iter().map(|s| (*s).to_owned()).collect(),
            cdi_devices: devices.iter().map(|s| (*s).to_owned()).collect(),
            ..Container::default()
        }
    }

    #[test]
    fn a_claims_cdi_device_of_our_vendor_is_use() {
        let dev = format!("ours.example.com/device=claim-{UID}-0");
        assert!(uses_claim(&with(&[], &[&dev]), "ours.example.com", UID));
        assert!(!uses_claim(&with(&[], &[&dev]), "other.example.com", UID));
        let other = "ours.example.com/device=claim-0b6c2a4e-7f3d-4000-8000-000000000002-0";
        assert!(!uses_claim(&with(&[], &[other]), "ours.example.com", UID));
    }

    #[test]
    fn the_claims_environment_by_uid_or_shell_safe_name_is_use() {
        let exact = format!("{CPUSET_ENV}{UID}=4-5");
        let safe = format!("{CPUSET_ENV}{}=4-5", shell_safe(UID));
        assert!(uses_claim(&with(&[&exact], &[]), "d", UID));
        assert!(uses_claim(&with(&[&safe], &[]), "d", UID));
        assert_eq!(cpuset_env(&with(&[&safe], &[]), UID), Some("4-5"));
        let mems = format!("{MEMS_ENV}{UID}=1");
        assert_eq!(mems_env(&with(&[&mems], &[]), UID), Some("1"));
        let other = format!("{CPUSET_ENV}{UID}0=4-5");
        assert!(!uses_claim(&with(&[&other, "PATH=/bin"], &[]), "d", UID));
    }
}
