//! What the DRA servers ask of the claim lifecycle: the [`ClaimHandler`] trait and its types.
//!
//! These are the driver's types, not the wire's: both DRA versions convert to and from them at the
//! boundary (`wire.rs`), so the handler neither knows nor cares which version the kubelet speaks.
//! The handler gets the whole batch of one kubelet call and answers per claim; it refuses the
//! whole call only when nothing in it can be answered yet (for example while the runtime has not
//! synchronized), because the kubelet records and retries per claim.

use std::{collections::BTreeMap, fmt, future::Future};

/// A claim the kubelet asks about: what `NodePrepareResources` and `NodeUnprepareResources`
/// carry, namespace, name and UID, and nothing else. The servers hand the handler only claims
/// whose three fields are non-empty. A driver keeps using it past the handler (resmgr's claim
/// lifecycle and API client look claims up by it), so there is one claim reference, this one.
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

/// One device prepared for a claim, as the kubelet is told about it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PreparedDevice {
    /// Base names of the requests this device serves (no `/subrequest` suffix); empty means all
    /// requests of the claim.
    pub request_names: Vec<String>,
    pub pool: String,
    pub device: String,
    /// Fully qualified CDI device IDs (`vendor/class=name`) the runtime injects.
    pub cdi_device_ids: Vec<String>,
    /// The share of a device that allows multiple allocations. Only DRA v1 carries it (kubelets
    /// 1.35 and later read it); on v1beta1 it is dropped.
    pub share_id: Option<String>,
}

/// Why one claim failed; the kubelet shows the message in the pod's events and retries.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ClaimError {
    pub message: String,
}

impl ClaimError {
    pub fn new(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
        }
    }
}

/// The answer for a batch of prepares, keyed by claim UID: one entry per requested claim.
pub type PrepareResults = BTreeMap<String, Result<Vec<PreparedDevice>, ClaimError>>;

/// The answer for a batch of unprepares, keyed by claim UID: one entry per requested claim.
pub type UnprepareResults = BTreeMap<String, Result<(), ClaimError>>;

/// A refusal of a whole kubelet call; each variant is a gRPC status code.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    /// Not ready to answer any claim yet (for example, still synchronizing with the runtime);
    /// the kubelet retries. gRPC `Unavailable`.
    #[error("{0}")]
    Unavailable(String),
    /// The request itself is malformed (for example, a claim UID that cannot be one). gRPC
    /// `InvalidArgument`.
    #[error("{0}")]
    InvalidArgument(String),
    /// Something broke that a retry cannot fix by itself. gRPC `Internal`.
    #[error("{0}")]
    Internal(String),
}

impl From<RequestError> for tonic::Status {
    fn from(e: RequestError) -> Self {
        match e {
            RequestError::Unavailable(m) => tonic::Status::unavailable(m),
            RequestError::InvalidArgument(m) => tonic::Status::invalid_argument(m),
            RequestError::Internal(m) => tonic::Status::internal(m),
        }
    }
}

/// The claim lifecycle, as the DRA servers call it.
///
/// Calls for different pods arrive concurrently (the kubelet's pod workers run in parallel), so
/// implementations serialize what needs serializing themselves. A call may be abandoned when the
/// kubelet's deadline (45 s) passes; the future is then dropped.
pub trait ClaimHandler: Send + Sync + 'static {
    /// Prepares a batch of claims (never empty: the servers answer empty requests themselves).
    /// Must answer every claim in `claims`, by UID; a claim left out is reported to the kubelet
    /// as failed. Must be idempotent: the kubelet resends claims it already had prepared.
    fn prepare(
        &self,
        claims: &[ClaimRef],
    ) -> impl Future<Output = Result<PrepareResults, RequestError>> + Send;

    /// Unprepares a batch of claims (never empty). Unknown claims are a success: the kubelet
    /// unprepares claims whose prepare failed or never reached us.
    fn unprepare(
        &self,
        claims: &[ClaimRef],
    ) -> impl Future<Output = Result<UnprepareResults, RequestError>> + Send;
}
