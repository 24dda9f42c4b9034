//! How the kubelet names a claim: namespace, name and UID, and nothing else.
//!
//! The DRA servers receive these, the claim lifecycle works on them, and the Kubernetes API
//! client looks claims up by them; one type serves all three.

use std::fmt;

/// The claim the kubelet asked about: all it tells us.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ClaimRef {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// The UID the kubelet saw; a claim with another UID is a different (re-created) claim.
    pub uid: String,
}

impl ClaimRef {
    /// A claim reference from the kubelet's three fields.
    pub fn new(
        namespace: impl Into<String>,
        name: impl Into<String>,
        uid: impl Into<String>,
    ) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
            uid: uid.into(),
        }
    }
}

/// `namespace/name (uid …)`, the way every error names a claim.
impl fmt::Display for ClaimRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{} (uid {})", self.namespace, self.name, self.uid)
    }
}
