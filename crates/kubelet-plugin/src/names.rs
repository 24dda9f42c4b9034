//! Kubernetes' DNS name rules (RFC 1123 labels and subdomains), as the API server's validation
//! applies them: the one implementation of the workspace.
//!
//! The kubelet plugin needs them for driver names (a directory, a socket name and the kubelet's
//! key for us); its driver needs them too (resmgr's ResourceSlices carry driver, node, pool and
//! device names, and the binary checks its flags). This is the lowest crate on that path, so they
//! live here and the others use them from here.

/// Why a name is not a DNS label or subdomain. The message names the value and the rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DnsNameError {
    /// Empty, or longer than the limit.
    #[error("{name:?} must be 1 to {max} characters")]
    Length {
        /// The name.
        name: String,
        /// The limit.
        max: usize,
    },
    /// Not a DNS label.
    #[error(
        "{name:?} is not a DNS label (lower-case letters, digits and '-', starting and ending with a letter or digit)"
    )]
    Label {
        /// The name.
        name: String,
    },
    /// Not DNS labels joined by dots.
    #[error("{name:?} is not a DNS subdomain (DNS labels joined by '.')")]
    Subdomain {
        /// The name.
        name: String,
    },
}

/// The longest DNS label.
pub const MAX_LABEL_LEN: usize = 63;

/// The longest driver name ResourceSlice validation accepts.
pub const MAX_DRIVER_NAME_LEN: usize = 63;

/// A DNS label (RFC 1123): 1 to 63 lower-case letters, digits and `-`, starting and ending with
/// a letter or digit. Device names, and each part of a subdomain.
pub fn dns_label(name: &str) -> Result<(), DnsNameError> {
    if name.is_empty() || name.len() > MAX_LABEL_LEN {
        return Err(DnsNameError::Length {
            name: name.to_owned(),
            max: MAX_LABEL_LEN,
        });
    }
    let ok = name
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-');
    if ok {
        Ok(())
    } else {
        Err(DnsNameError::Label {
            name: name.to_owned(),
        })
    }
}

/// A DNS subdomain (RFC 1123): DNS labels joined by dots, 1 to `max` characters in all. Driver
/// names (63) and node names (253).
pub fn dns_subdomain(name: &str, max: usize) -> Result<(), DnsNameError> {
    if name.is_empty() || name.len() > max {
        return Err(DnsNameError::Length {
            name: name.to_owned(),
            max,
        });
    }
    name.split('.')
        .try_for_each(dns_label)
        .map_err(|_| DnsNameError::Subdomain {
            name: name.to_owned(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels() {
        for good in ["a", "numa0", "a-b", "0", &"n".repeat(63)] {
            dns_label(good).unwrap();
        }
        for bad in [
            "",
            "Numa0",
            "numa_0",
            "-numa",
            "numa-",
            "a.b",
            &"n".repeat(64),
        ] {
            dns_label(bad).unwrap_err();
        }
        assert_eq!(
            dns_label("").unwrap_err().to_string(),
            "\"\" must be 1 to 63 characters"
        );
    }

    #[test]
    fn subdomains() {
        for good in [
            "cpu.resmgr.io",
            "a",
            "dra-cpu.example.com",
            "x1.y2",
            "a.b-c.io",
        ] {
            dns_subdomain(good, 63).unwrap();
        }
        let too_long = "a".repeat(64);
        for bad in [
            "", "A.io", "Cpu.io", "-a.io", "a..io", "a..b", ".a", "a.", "a_b.io", "a.io-", "a/b",
            "..", "cpu.-x", &too_long,
        ] {
            dns_subdomain(bad, 63).unwrap_err();
        }
        // Each label is at most 63 even when the whole may be longer.
        dns_subdomain(&format!("{}.io", "a".repeat(64)), 253).unwrap_err();
        dns_subdomain(&format!("{}.{}", "a".repeat(63), "b".repeat(63)), 253).unwrap();
        assert_eq!(
            dns_subdomain("a..b", 63).unwrap_err().to_string(),
            "\"a..b\" is not a DNS subdomain (DNS labels joined by '.')"
        );
    }
}
