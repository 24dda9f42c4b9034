//! CDI name rules: vendor, class, kind (`vendor/class`), device name, qualified device name
//! (`vendor/class=name`) and annotation keys.
//!
//! The character rules are those the reference parser enforces, so a name we accept the runtimes
//! accept too. On top of them we enforce the length limits the CDI specification states and the
//! reference code does not check: a vendor is at most 253 characters (a DNS subdomain), a class at
//! most 63. Annotation keys follow the Kubernetes qualified-name rule the specification names.

use std::{fmt, str::FromStr};

/// The longest vendor the CDI specification allows (a DNS subdomain).
pub const MAX_VENDOR_LEN: usize = 253;
/// The longest class the CDI specification allows (the kind's name segment).
pub const MAX_CLASS_LEN: usize = 63;
/// The longest name part of an annotation key (a Kubernetes qualified name).
pub const MAX_ANNOTATION_NAME_LEN: usize = 63;
/// The longest prefix of an annotation key (a DNS subdomain).
pub const MAX_ANNOTATION_PREFIX_LEN: usize = 253;

/// Which kind of name an error is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NameKind {
    /// The part of a kind before the `/`.
    Vendor,
    /// The part of a kind after the `/`.
    Class,
    /// `vendor/class`.
    Kind,
    /// The name of a device within its spec.
    Device,
    /// `vendor/class=name`.
    Qualified,
    /// The key of a spec or device annotation.
    AnnotationKey,
}

impl fmt::Display for NameKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            NameKind::Vendor => "cdi vendor",
            NameKind::Class => "cdi class",
            NameKind::Kind => "cdi kind",
            NameKind::Device => "cdi device name",
            NameKind::Qualified => "qualified cdi device name",
            NameKind::AnnotationKey => "annotation key",
        })
    }
}

/// A name that breaks the CDI name rules. Every variant names the kind of name and its value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    /// The name is empty.
    #[error("{what} is empty")]
    Empty {
        /// Which name.
        what: NameKind,
    },
    /// The name is longer than the specification allows.
    #[error("{what} {value:?} is {len} characters long, more than the {max} allowed")]
    TooLong {
        /// Which name.
        what: NameKind,
        /// The name.
        value: String,
        /// Its length in bytes.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The first character is not allowed there.
    #[error("{what} {value:?} must start with {expected}")]
    BadStart {
        /// Which name.
        what: NameKind,
        /// The name.
        value: String,
        /// What the first character must be.
        expected: &'static str,
    },
    /// The last character is not a letter or digit.
    #[error("{what} {value:?} must end with a letter or digit")]
    BadEnd {
        /// Which name.
        what: NameKind,
        /// The name.
        value: String,
    },
    /// A character is not allowed anywhere in this kind of name.
    #[error("{what} {value:?} contains {found:?}, which is not allowed")]
    BadChar {
        /// Which name.
        what: NameKind,
        /// The name.
        value: String,
        /// The offending character.
        found: char,
    },
    /// The name does not have the required shape (`vendor/class`, `vendor/class=name`).
    #[error("{what} {value:?} is not of the form {form}")]
    Malformed {
        /// Which name.
        what: NameKind,
        /// The name.
        value: String,
        /// The expected shape.
        form: &'static str,
    },
}

/// Checks a vendor: a letter first, a letter or digit last, letters, digits, `_`, `-` and `.`
/// between; at most [`MAX_VENDOR_LEN`] characters.
pub fn validate_vendor(vendor: &str) -> Result<(), NameError> {
    check_len(NameKind::Vendor, vendor, MAX_VENDOR_LEN)?;
    check_vendor_or_class(NameKind::Vendor, vendor)
}

/// Checks a class: the vendor's character rules, at most [`MAX_CLASS_LEN`] characters.
pub fn validate_class(class: &str) -> Result<(), NameError> {
    check_len(NameKind::Class, class, MAX_CLASS_LEN)?;
    check_vendor_or_class(NameKind::Class, class)
}

/// Checks a device name: a letter or digit first and last, letters, digits, `_`, `-`, `.` and `:`
/// between. A leading digit is valid but needs CDI 0.5.0 (see [`crate::version`]).
pub fn validate_device_name(name: &str) -> Result<(), NameError> {
    let what = NameKind::Device;
    let first = first_char(what, name)?;
    if !first.is_ascii_alphanumeric() {
        return Err(NameError::BadStart {
            what,
            value: name.into(),
            expected: "a letter or digit",
        });
    }
    check_middle_and_end(what, name, |c| matches!(c, '_' | '-' | '.' | ':'))
}

/// Splits a kind at its first `/` into vendor and class, and checks both.
pub fn parse_kind(kind: &str) -> Result<(&str, &str), NameError> {
    let malformed = || NameError::Malformed {
        what: NameKind::Kind,
        value: kind.into(),
        form: "vendor/class",
    };
    let (vendor, class) = kind.split_once('/').ok_or_else(malformed)?;
    if vendor.is_empty() || class.is_empty() {
        return Err(malformed());
    }
    validate_vendor(vendor)?;
    validate_class(class)?;
    Ok((vendor, class))
}

/// Checks an annotation key: a Kubernetes qualified name (`[prefix/]name`, letter case ignored),
/// the prefix a DNS subdomain of at most 253 characters, the name at most 63 characters of
/// letters, digits, `-`, `_` and `.`, starting and ending with a letter or digit.
pub fn validate_annotation_key(key: &str) -> Result<(), NameError> {
    check_annotation_key(key).map_err(|err| err.for_value(key))
}

fn check_annotation_key(key: &str) -> Result<(), NameError> {
    let what = NameKind::AnnotationKey;
    let malformed = || NameError::Malformed {
        what,
        value: key.into(),
        form: "[dns-subdomain/]name",
    };
    let (prefix, name) = match key.split_once('/') {
        Some((_, rest)) if rest.contains('/') => return Err(malformed()),
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    if let Some(prefix) = prefix {
        check_len(what, prefix, MAX_ANNOTATION_PREFIX_LEN)?;
        // A DNS subdomain: non-empty labels of letters, digits and `-`, with a letter or digit
        // at both ends, joined by dots.
        for label in prefix.split('.') {
            let edge_ok = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
            if !edge_ok(label.chars().next()) || !edge_ok(label.chars().last()) {
                return Err(malformed());
            }
            if let Some(found) = label
                .chars()
                .find(|c| !(c.is_ascii_alphanumeric() || *c == '-'))
            {
                return Err(NameError::BadChar {
                    what,
                    value: key.into(),
                    found,
                });
            }
        }
    }
    check_len(what, name, MAX_ANNOTATION_NAME_LEN)?;
    let first = first_char(what, name)?;
    if !first.is_ascii_alphanumeric() {
        return Err(NameError::BadStart {
            what,
            value: key.into(),
            expected: "a letter or digit",
        });
    }
    check_middle_and_end(what, name, |c| matches!(c, '_' | '-' | '.'))
}

/// A fully qualified CDI device name, `vendor/class=name`, every part valid.
///
/// This is what the kubelet hands the runtime and what the runtime's CDI cache resolves.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct QualifiedName {
    vendor: String,
    class: String,
    name: String,
}

impl QualifiedName {
    /// Builds a qualified name from its parts, checking each.
    pub fn new(vendor: &str, class: &str, name: &str) -> Result<Self, NameError> {
        validate_vendor(vendor)?;
        validate_class(class)?;
        validate_device_name(name)?;
        Ok(Self {
            vendor: vendor.into(),
            class: class.into(),
            name: name.into(),
        })
    }

    /// Parses `vendor/class=name`: the first `=` ends the kind, the first `/` ends the vendor.
    pub fn parse(qualified: &str) -> Result<Self, NameError> {
        let malformed = || NameError::Malformed {
            what: NameKind::Qualified,
            value: qualified.into(),
            form: "vendor/class=name",
        };
        let (kind, name) = qualified.split_once('=').ok_or_else(malformed)?;
        let (vendor, class) = kind.split_once('/').ok_or_else(malformed)?;
        if vendor.is_empty() || class.is_empty() || name.is_empty() {
            return Err(malformed());
        }
        Self::new(vendor, class, name)
    }

    /// The vendor.
    pub fn vendor(&self) -> &str {
        &self.vendor
    }

    /// The class.
    pub fn class(&self) -> &str {
        &self.class
    }

    /// The device name within its spec.
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl fmt::Display for QualifiedName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}={}", self.vendor, self.class, self.name)
    }
}

impl FromStr for QualifiedName {
    type Err = NameError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

// === helpers ===

impl NameError {
    /// The same error about the whole `value` rather than the part that was checked.
    fn for_value(self, value: &str) -> Self {
        let value = value.to_string();
        match self {
            NameError::Empty { what } => NameError::Malformed {
                what,
                value,
                form: "[dns-subdomain/]name",
            },
            NameError::TooLong { what, len, max, .. } => NameError::TooLong {
                what,
                value,
                len,
                max,
            },
            NameError::BadStart { what, expected, .. } => NameError::BadStart {
                what,
                value,
                expected,
            },
            NameError::BadEnd { what, .. } => NameError::BadEnd { what, value },
            NameError::BadChar { what, found, .. } => NameError::BadChar { what, value, found },
            NameError::Malformed { what, form, .. } => NameError::Malformed { what, value, form },
        }
    }
}

fn check_len(what: NameKind, value: &str, max: usize) -> Result<(), NameError> {
    if value.len() > max {
        return Err(NameError::TooLong {
            what,
            value: value.into(),
            len: value.len(),
            max,
        });
    }
    Ok(())
}

fn first_char(what: NameKind, value: &str) -> Result<char, NameError> {
    value.chars().next().ok_or(NameError::Empty { what })
}

fn check_vendor_or_class(what: NameKind, value: &str) -> Result<(), NameError> {
    let first = first_char(what, value)?;
    if !first.is_ascii_alphabetic() {
        return Err(NameError::BadStart {
            what,
            value: value.into(),
            expected: "a letter",
        });
    }
    check_middle_and_end(what, value, |c| matches!(c, '_' | '-' | '.'))
}

/// Checks every character after the first: the middle ones are letters, digits or `extra`, the
/// last (if there is more than one) a letter or digit. The first has been checked by the caller.
fn check_middle_and_end(
    what: NameKind,
    value: &str,
    extra: impl Fn(char) -> bool,
) -> Result<(), NameError> {
    let mut rest = value.chars().skip(1).peekable();
    while let Some(c) = rest.next() {
        let last = rest.peek().is_none();
        if c.is_ascii_alphanumeric() {
            continue;
        }
        if last && extra(c) {
            return Err(NameError::BadEnd {
                what,
                value: value.into(),
            });
        }
        if last || !extra(c) {
            return Err(NameError::BadChar {
                what,
                value: value.into(),
                found: c,
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vendors_follow_the_reference_character_rules() {
        for ok in ["a", "example.com", "Vendor_1-x.y", "a9"] {
            assert_eq!(validate_vendor(ok), Ok(()), "{ok}");
        }
        let cases = [
            (
                "",
                NameError::Empty {
                    what: NameKind::Vendor,
                },
            ),
            ("1abc", bad_start(NameKind::Vendor, "1abc", "a letter")),
            ("-abc", bad_start(NameKind::Vendor, "-abc", "a letter")),
            ("abc-", bad_end(NameKind::Vendor, "abc-")),
            ("ab:c", bad_char(NameKind::Vendor, "ab:c", ':')),
            ("ab/c", bad_char(NameKind::Vendor, "ab/c", '/')),
            ("abé", bad_char(NameKind::Vendor, "abé", 'é')),
        ];
        for (value, want) in cases {
            assert_eq!(validate_vendor(value), Err(want), "{value:?}");
        }
    }

    #[test]
    fn lengths_the_reference_does_not_check_are_enforced() {
        let vendor = format!("a{}", "b".repeat(MAX_VENDOR_LEN - 1));
        assert_eq!(validate_vendor(&vendor), Ok(()));
        let long = format!("{vendor}c");
        assert!(matches!(
            validate_vendor(&long),
            Err(NameError::TooLong {
                what: NameKind::Vendor,
                len: 254,
                max: 253,
                ..
            })
        ));

        let class = format!("a{}", "b".repeat(MAX_CLASS_LEN - 1));
        assert_eq!(validate_class(&class), Ok(()));
        let long = "c".repeat(300);
        assert!(matches!(
            validate_class(&long),
            Err(NameError::TooLong {
                what: NameKind::Class,
                len: 300,
                max: 63,
                ..
            })
        ));
        assert!(parse_kind(&format!("example.com/{long}")).is_err());
    }

    #[test]
    fn device_names_allow_digits_first_and_colons() {
        for ok in ["0", "1abc", "a:b", "claim-0a1b-2", "x_y.z"] {
            assert_eq!(validate_device_name(ok), Ok(()), "{ok}");
        }
        assert_eq!(
            validate_device_name(""),
            Err(NameError::Empty {
                what: NameKind::Device
            })
        );
        assert_eq!(
            validate_device_name("a:"),
            Err(bad_end(NameKind::Device, "a:"))
        );
        assert_eq!(
            validate_device_name(":a"),
            Err(bad_start(NameKind::Device, ":a", "a letter or digit"))
        );
        assert_eq!(
            validate_device_name("a=b"),
            Err(bad_char(NameKind::Device, "a=b", '='))
        );
        assert_eq!(
            validate_device_name("a/b"),
            Err(bad_char(NameKind::Device, "a/b", '/'))
        );
    }

    #[test]
    fn kinds_split_at_the_first_slash() {
        assert_eq!(parse_kind("example.com/gpu"), Ok(("example.com", "gpu")));
        assert_eq!(
            parse_kind("example.com/a/b"),
            Err(bad_char(NameKind::Class, "a/b", '/'))
        );
        for bad in ["", "example.com", "/gpu", "example.com/"] {
            assert!(
                matches!(
                    parse_kind(bad),
                    Err(NameError::Malformed {
                        what: NameKind::Kind,
                        ..
                    })
                ),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn qualified_names_parse_and_format() {
        let q = QualifiedName::parse("example.com/device=claim-1-0").unwrap();
        assert_eq!(
            (q.vendor(), q.class(), q.name()),
            ("example.com", "device", "claim-1-0")
        );
        assert_eq!(q.to_string(), "example.com/device=claim-1-0");
        assert_eq!(
            "example.com/device=claim-1-0".parse::<QualifiedName>(),
            Ok(q)
        );

        for bad in ["", "/a/b=c", "a/b", "a=b", "a/=c", "/b=c", "a/b="] {
            assert!(
                matches!(
                    QualifiedName::parse(bad),
                    Err(NameError::Malformed {
                        what: NameKind::Qualified,
                        ..
                    })
                ),
                "{bad:?}"
            );
        }
        // The first `=` ends the kind, so a second one lands in the device name.
        assert_eq!(
            QualifiedName::parse("a/b=c=d"),
            Err(bad_char(NameKind::Device, "c=d", '='))
        );
        assert!(QualifiedName::new("a", &"c".repeat(64), "d").is_err());
    }

    #[test]
    fn errors_say_which_kind_of_name_was_wrong() {
        for (what, words) in [
            (NameKind::Vendor, "cdi vendor"),
            (NameKind::Class, "cdi class"),
            (NameKind::Kind, "cdi kind"),
            (NameKind::Device, "cdi device name"),
            (NameKind::Qualified, "qualified cdi device name"),
            (NameKind::AnnotationKey, "annotation key"),
        ] {
            let message = NameError::Empty { what }.to_string();
            assert_eq!(message, format!("{words} is empty"));
        }
    }

    #[test]
    fn annotation_keys_are_kubernetes_qualified_names() {
        for ok in ["a", "A.b-c_d", "example.com/key", "Example.COM/Key", "x/1"] {
            assert_eq!(validate_annotation_key(ok), Ok(()), "{ok}");
        }
        for bad in [
            "",
            "/a",
            "a/b/c",
            "-a",
            "a-",
            "a b",
            "ex_ample.com/a",
            "example..com/a",
            "-example.com/a",
        ] {
            assert!(validate_annotation_key(bad).is_err(), "{bad:?}");
        }
        assert_eq!(
            validate_annotation_key("example.com/a b"),
            Err(bad_char(NameKind::AnnotationKey, "example.com/a b", ' '))
        );
        assert!(validate_annotation_key(&"a".repeat(64)).is_err());
        assert_eq!(validate_annotation_key(&"a".repeat(63)), Ok(()));
        let prefix = "a".repeat(254);
        assert!(validate_annotation_key(&format!("{prefix}/a")).is_err());
    }

    fn bad_start(what: NameKind, value: &str, expected: &'static str) -> NameError {
        NameError::BadStart {
            what,
            value: value.into(),
            expected,
        }
    }

    fn bad_end(what: NameKind, value: &str) -> NameError {
        NameError::BadEnd {
            what,
            value: value.into(),
        }
    }

    fn bad_char(what: NameKind, value: &str, found: char) -> NameError {
        NameError::BadChar {
            what,
            value: value.into(),
            found,
        }
    }
}
