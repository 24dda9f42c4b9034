//! Which NRI version the runtime speaks (reference §6).
//!
//! Runtimes on NRI v0.12 and later say so in `ConfigureRequest.nri_version`; for older ones the
//! version follows from the runtime's name and release, by the table of which containerd and
//! CRI-O releases vendor which NRI. An unknown runtime yields `None`, which callers treat as the
//! oldest behaviour (the safest subscription mask).

use std::fmt;

/// An NRI release, e.g. v0.8.0. Pre-release suffixes are ignored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NriVersion {
    pub major: u32,
    pub minor: u32,
    pub patch: u32,
}

impl NriVersion {
    pub const fn new(major: u32, minor: u32, patch: u32) -> Self {
        Self {
            major,
            minor,
            patch,
        }
    }

    /// Parses `v0.12.5`, `0.8.0` or `v0.3.1-0.20230504231226-94185418e253`; None for anything else,
    /// including the `unknown` and `devel` markers and the `0.0.0-unknown` a runtime built without
    /// module information sends (there is no NRI v0.0.0).
    pub fn parse(text: &str) -> Option<Self> {
        let (major, minor, patch) = parse_triple(text)?;
        let version = Self::new(major, minor, patch);
        (version != Self::new(0, 0, 0)).then_some(version)
    }
}

impl fmt::Display for NriVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "v{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// The runtime's NRI version: the announced one if usable, otherwise inferred from the runtime's
/// name and version.
pub fn runtime_nri_version(
    announced: &str,
    runtime_name: &str,
    runtime_version: &str,
) -> Option<NriVersion> {
    NriVersion::parse(announced).or_else(|| infer(runtime_name, runtime_version))
}

/// The NRI version vendored by a containerd or CRI-O release.
pub fn infer(runtime_name: &str, runtime_version: &str) -> Option<NriVersion> {
    let release = parse_triple(runtime_version)?;
    let table: &[ReleaseRow] = match runtime_name {
        "containerd" => CONTAINERD,
        "cri-o" => CRIO,
        _ => return None,
    };
    // The last row whose first release is not after `release`.
    table
        .iter()
        .rev()
        .find(|(first, _)| *first <= release)
        .map(|&(_, (a, b, c))| NriVersion::new(a, b, c))
}

/// A version as (major, minor, patch).
type Triple = (u32, u32, u32);
/// (first runtime release, NRI version it vendors).
type ReleaseRow = (Triple, Triple);

/// Rows ascending by release. Releases before the first row have
/// no NRI. Releases after the last row are assumed to have at least its version.
const CONTAINERD: &[ReleaseRow] = &[
    ((1, 7, 0), (0, 3, 0)),
    ((1, 7, 7), (0, 4, 0)),
    ((1, 7, 14), (0, 6, 0)),
    ((1, 7, 16), (0, 6, 1)),
    ((1, 7, 26), (0, 8, 0)),
    ((2, 2, 0), (0, 10, 0)),
    ((2, 2, 1), (0, 11, 0)),
];

const CRIO: &[ReleaseRow] = &[
    ((1, 26, 0), (0, 2, 0)),
    ((1, 26, 2), (0, 3, 0)),
    ((1, 26, 4), (0, 3, 1)),
    ((1, 27, 0), (0, 3, 0)),
    ((1, 27, 1), (0, 3, 1)),
    ((1, 29, 0), (0, 5, 0)),
    ((1, 29, 2), (0, 6, 0)),
    ((1, 31, 0), (0, 6, 1)),
    ((1, 32, 0), (0, 9, 0)),
    ((1, 33, 0), (0, 9, 1)),
    ((1, 34, 0), (0, 10, 0)),
    ((1, 35, 0), (0, 11, 0)),
];

/// `[v]MAJOR.MINOR.PATCH[-suffix][+build]`.
fn parse_triple(text: &str) -> Option<Triple> {
    let text = text.trim();
    let text = text.strip_prefix('v').unwrap_or(text);
    let core = text.split(['-', '+']).next()?;
    let mut parts = core.split('.');
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    let patch = parts.next()?.parse().ok()?;
    parts.next().is_none().then_some((major, minor, patch))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(a: u32, b: u32, c: u32) -> Option<NriVersion> {
        Some(NriVersion::new(a, b, c))
    }

    #[test]
    fn announced_versions_parse() {
        assert_eq!(NriVersion::parse("v0.12.5"), v(0, 12, 5));
        assert_eq!(NriVersion::parse("0.8.0"), v(0, 8, 0));
        assert_eq!(
            NriVersion::parse("v0.3.1-0.20230504231226-94185418e253"),
            v(0, 3, 1)
        );
        assert_eq!(NriVersion::parse("unknown"), None);
        assert_eq!(NriVersion::parse("devel"), None);
        assert_eq!(NriVersion::parse("0.0.0-unknown"), None);
        assert_eq!(NriVersion::parse(""), None);
        assert_eq!(NriVersion::parse("v1.2"), None);
    }

    #[test]
    fn containerd_releases_map_to_their_nri() {
        for (release, want) in [
            ("v1.6.20", None),
            ("v1.7.0", v(0, 3, 0)),
            ("1.7.6", v(0, 3, 0)),
            ("v1.7.13", v(0, 4, 0)),
            ("v1.7.15", v(0, 6, 0)),
            ("v1.7.25", v(0, 6, 1)),
            ("v1.7.26", v(0, 8, 0)),
            ("v2.0.0", v(0, 8, 0)),
            ("v2.1.6", v(0, 8, 0)),
            ("v2.2.0", v(0, 10, 0)),
            ("v2.2.1", v(0, 11, 0)),
            ("v2.3.0-rc.1", v(0, 11, 0)),
        ] {
            assert_eq!(infer("containerd", release), want, "containerd {release}");
        }
    }

    #[test]
    fn crio_releases_map_to_their_nri() {
        for (release, want) in [
            ("1.26.1", v(0, 2, 0)),
            ("1.26.3", v(0, 3, 0)),
            ("1.26.4", v(0, 3, 1)),
            ("1.27.0", v(0, 3, 0)),
            ("1.28.11", v(0, 3, 1)),
            ("1.30.4", v(0, 6, 0)),
            ("1.32.0", v(0, 9, 0)),
            ("1.34.1", v(0, 10, 0)),
            ("1.35.0", v(0, 11, 0)),
        ] {
            assert_eq!(infer("cri-o", release), want, "cri-o {release}");
        }
    }

    #[test]
    fn the_announced_version_wins_over_inference() {
        assert_eq!(
            runtime_nri_version("v0.12.1", "containerd", "v2.1.0"),
            v(0, 12, 1)
        );
        assert_eq!(runtime_nri_version("", "containerd", "v2.1.0"), v(0, 8, 0));
        assert_eq!(
            runtime_nri_version("unknown", "fake-runtime", "0.0.1"),
            None
        );
    }
}
