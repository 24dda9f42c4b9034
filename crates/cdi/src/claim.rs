//! How a claim maps to CDI names and file names, and back: claim UIDs, the device names
//! `claim-<uid>-<i>`, the spec file name `<vendor>-device_<uid>.json`, and the inverse mapping from
//! a qualified device name to its claim.
//!
//! This module does no IO; [`crate::store`] uses it to name what it writes and to recognise what
//! it finds.

use std::fmt;

use crate::names::{self, NameError, QualifiedName};

/// The CDI class of every device the store writes: kinds are `<vendor>/device`.
pub const CLASS: &str = "device";

/// The prefix of every device name the store writes.
pub const DEVICE_PREFIX: &str = "claim-";

/// The extension of every spec file the store writes.
pub const SPEC_EXTENSION: &str = ".json";

/// The longest claim UID accepted. A Kubernetes UID is a UUID (36 characters); the margin admits
/// other generators (test fixtures, readable UIDs) while keeping file names well below the
/// 255-byte file name limit.
pub const MAX_UID_LEN: usize = 63;

/// A validated claim UID: 1 to [`MAX_UID_LEN`] ASCII letters, digits and `-`, starting and ending
/// with a letter or digit. Nothing else (no `/`, `.`, NUL, space) can reach a file name or a
/// device name through it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ClaimUid(String);

/// A string that is not a claim UID.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UidError {
    /// The UID is empty.
    #[error("claim uid is empty")]
    Empty,
    /// The UID is longer than [`MAX_UID_LEN`].
    #[error("claim uid {value:?} is {len} bytes long, more than the {max} allowed")]
    TooLong {
        /// The UID.
        value: String,
        /// Its length in bytes.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The UID contains a character other than ASCII letters, digits and `-`.
    #[error(
        "claim uid {value:?} contains {found:?}; only ascii letters, digits and '-' are allowed"
    )]
    BadChar {
        /// The UID.
        value: String,
        /// The offending character.
        found: char,
    },
    /// The UID starts or ends with `-`.
    #[error("claim uid {value:?} must start and end with a letter or digit")]
    BadEdge {
        /// The UID.
        value: String,
    },
}

impl ClaimUid {
    /// Checks `uid` and wraps it.
    pub fn new(uid: &str) -> Result<Self, UidError> {
        if uid.is_empty() {
            return Err(UidError::Empty);
        }
        if uid.len() > MAX_UID_LEN {
            return Err(UidError::TooLong {
                value: uid.into(),
                len: uid.len(),
                max: MAX_UID_LEN,
            });
        }
        if let Some(found) = uid
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || *c == '-'))
        {
            return Err(UidError::BadChar {
                value: uid.into(),
                found,
            });
        }
        if uid.starts_with('-') || uid.ends_with('-') {
            return Err(UidError::BadEdge { value: uid.into() });
        }
        Ok(Self(uid.into()))
    }

    /// The UID.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ClaimUid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<str> for ClaimUid {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

/// The name of the `index`-th device of a claim: `claim-<uid>-<index>`.
///
/// The prefix keeps the name from starting with a digit (UIDs often do), which would need CDI
/// 0.5.0 and lock out older runtimes.
pub fn device_name(uid: &ClaimUid, index: usize) -> String {
    format!("{DEVICE_PREFIX}{uid}-{index}")
}

/// The qualified name of the `index`-th device of a claim: `<vendor>/device=claim-<uid>-<index>`.
pub fn qualified_device_name(
    vendor: &str,
    uid: &ClaimUid,
    index: usize,
) -> Result<QualifiedName, NameError> {
    QualifiedName::new(vendor, CLASS, &device_name(uid, index))
}

/// The file name of a claim's spec: `<vendor>-device_<uid>.json`, the reference's transient spec
/// name for kind `<vendor>/device` and transient ID `<uid>`.
pub fn spec_file_name(vendor: &str, uid: &ClaimUid) -> String {
    format!("{vendor}-{CLASS}_{uid}{SPEC_EXTENSION}")
}

/// The claim whose spec a file name is, if it is one of `vendor`'s spec file names.
pub fn uid_of_spec_file(vendor: &str, file_name: &str) -> Option<ClaimUid> {
    let uid = file_name
        .strip_prefix(vendor)?
        .strip_prefix('-')?
        .strip_prefix(CLASS)?
        .strip_prefix('_')?
        .strip_suffix(SPEC_EXTENSION)?;
    ClaimUid::new(uid).ok()
}

/// The claim a qualified device name belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimDevice {
    /// The CDI vendor: the caller checks it is its own.
    pub vendor: String,
    /// The claim.
    pub uid: ClaimUid,
    /// The position of the device among the claim's devices (its allocation result).
    pub index: usize,
}

/// A qualified device name that is not one of a claim's devices.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClaimDeviceError {
    /// Not a qualified CDI device name at all.
    #[error("not a claim device")]
    Name(#[from] NameError),
    /// The class is not the store's.
    #[error("{value:?} is not a claim device: its class is not {CLASS:?}")]
    Class {
        /// The qualified name.
        value: String,
    },
    /// The device name is not `claim-<uid>-<index>`.
    #[error("{value:?} is not a claim device: its name is not claim-<uid>-<index>")]
    Shape {
        /// The qualified name.
        value: String,
    },
    /// The UID part is not a claim UID.
    #[error("{value:?} is not a claim device")]
    Uid {
        /// The qualified name.
        value: String,
        /// What is wrong with the UID.
        #[source]
        source: UidError,
    },
}

/// The inverse of [`qualified_device_name`]: vendor, claim and index of a claim's device.
///
/// UIDs contain `-`, so the index is what follows the last `-`. Only the canonical decimal form
/// of an index is accepted (no sign, no leading zero), so the mapping is one-to-one.
pub fn claim_of_device(qualified: &str) -> Result<ClaimDevice, ClaimDeviceError> {
    let name = names::QualifiedName::parse(qualified)?;
    if name.class() != CLASS {
        return Err(ClaimDeviceError::Class {
            value: qualified.into(),
        });
    }
    let shape = || ClaimDeviceError::Shape {
        value: qualified.into(),
    };
    let (uid, index) = name
        .name()
        .strip_prefix(DEVICE_PREFIX)
        .and_then(|rest| rest.rsplit_once('-'))
        .ok_or_else(shape)?;
    let canonical =
        index.bytes().all(|b| b.is_ascii_digit()) && (index == "0" || !index.starts_with('0'));
    let index: usize = index.parse().ok().filter(|_| canonical).ok_or_else(shape)?;
    let uid = ClaimUid::new(uid).map_err(|source| ClaimDeviceError::Uid {
        value: qualified.into(),
        source,
    })?;
    Ok(ClaimDevice {
        vendor: name.vendor().into(),
        uid,
        index,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const UUID: &str = "0b2c9a5e-8f6d-4c1a-9e3b-2d7f1a6c4e80";

    fn uid(s: &str) -> ClaimUid {
        ClaimUid::new(s).unwrap()
    }

    #[test]
    fn kubernetes_uids_are_accepted() {
        for ok in [UUID, "A", "claim-1", "0", &"a".repeat(MAX_UID_LEN)] {
            assert_eq!(ClaimUid::new(ok).map(|u| u.to_string()), Ok(ok.to_string()));
        }
    }

    #[test]
    fn anything_that_could_escape_a_path_or_a_name_is_refused() {
        assert_eq!(ClaimUid::new(""), Err(UidError::Empty));
        for (bad, found) in [
            ("../etc", '.'),
            ("..", '.'),
            ("a/b", '/'),
            ("/etc/passwd", '/'),
            ("a\0b", '\0'),
            ("a b", ' '),
            ("a\nb", '\n'),
            ("a_b", '_'),
            ("a.json", '.'),
            ("a:b", ':'),
            ("ü", 'ü'),
        ] {
            assert_eq!(
                ClaimUid::new(bad),
                Err(UidError::BadChar {
                    value: bad.into(),
                    found
                }),
                "{bad:?}"
            );
        }
        for bad in ["-a", "a-", "-"] {
            assert_eq!(
                ClaimUid::new(bad),
                Err(UidError::BadEdge { value: bad.into() })
            );
        }
        let long = "a".repeat(MAX_UID_LEN + 1);
        assert!(matches!(
            ClaimUid::new(&long),
            Err(UidError::TooLong { len: 64, .. })
        ));
    }

    #[test]
    fn names_of_a_claim() {
        let u = uid(UUID);
        assert_eq!(device_name(&u, 3), format!("claim-{UUID}-3"));
        assert_eq!(
            qualified_device_name("example.com", &u, 0)
                .unwrap()
                .to_string(),
            format!("example.com/device=claim-{UUID}-0")
        );
        assert_eq!(
            spec_file_name("example.com", &u),
            format!("example.com-device_{UUID}.json")
        );
    }

    #[test]
    fn spec_files_are_recognised_only_for_our_vendor() {
        let u = uid(UUID);
        assert_eq!(
            uid_of_spec_file("example.com", &spec_file_name("example.com", &u)),
            Some(u.clone())
        );
        for other in [
            format!("other.com-device_{UUID}.json"),
            format!("example.com-device_{UUID}.yaml"),
            format!("example.com-gpu_{UUID}.json"),
            format!(".example.com-device_{UUID}.json.abc123.tmp"),
            format!("example.com-device_{UUID}.json.tmp"),
            "example.com-device_.json".into(),
            "example.com-device_a.b.json".into(),
            "example.com-device.json".into(),
            // A vendor that extends ours is another vendor.
            format!("example.com.x-device_{UUID}.json"),
        ] {
            assert_eq!(uid_of_spec_file("example.com", &other), None, "{other}");
        }
    }

    #[test]
    fn claim_of_device_splits_at_the_last_dash() {
        let got = claim_of_device(&format!("example.com/device=claim-{UUID}-12")).unwrap();
        assert_eq!(
            got,
            ClaimDevice {
                vendor: "example.com".into(),
                uid: uid(UUID),
                index: 12
            }
        );
    }

    #[test]
    fn claim_of_device_refuses_other_devices() {
        assert!(matches!(
            claim_of_device("nonsense"),
            Err(ClaimDeviceError::Name(_))
        ));
        assert!(matches!(
            claim_of_device(&format!("example.com/gpu=claim-{UUID}-0")),
            Err(ClaimDeviceError::Class { .. })
        ));
        for name in [
            format!("{UUID}-0"),
            "claim-0".into(),
            format!("claim-{UUID}-x"),
            format!("claim-{UUID}-01"),
            format!("claim-{UUID}-99999999999999999999999"),
        ] {
            assert!(
                matches!(
                    claim_of_device(&format!("example.com/device={name}")),
                    Err(ClaimDeviceError::Shape { .. })
                ),
                "{name}"
            );
        }
        assert!(matches!(
            claim_of_device("example.com/device=claim-a_b-0"),
            Err(ClaimDeviceError::Uid {
                source: UidError::BadChar { found: '_', .. },
                ..
            })
        ));
        assert!(matches!(
            claim_of_device("example.com/device=claim--0"),
            Err(ClaimDeviceError::Uid {
                source: UidError::Empty,
                ..
            })
        ));
    }
}
