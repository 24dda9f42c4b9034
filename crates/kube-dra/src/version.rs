//! Which `resource.k8s.io` version to speak: discovered from the API server once, then cached.
//!
//! Kubernetes 1.34 serves v1; 1.33 serves v1beta2 and v1beta1; 1.32 serves v1beta1 only (and only
//! with DRA enabled). We use the newest one served. A request that finds its version no longer
//! served (a 404 for the path, not for the object) calls [`ResourceApiVersions::forget`], and the
//! next use discovers again.

use std::sync::Mutex;

use ::kube::{Client, api::ApiResource};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::APIGroup;

/// The API group of ResourceClaims and ResourceSlices.
pub const GROUP: &str = "resource.k8s.io";

/// A `resource.k8s.io` version resmgr can speak.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ResourceApiVersion {
    /// GA, Kubernetes 1.34 and later.
    V1,
    /// Kubernetes 1.33 (and served alongside v1 later).
    V1beta2,
    /// Kubernetes 1.32 (and served alongside the others later). Nests device fields under `basic`.
    V1beta1,
}

impl ResourceApiVersion {
    /// Newest first: the order we prefer them in.
    pub const PREFERENCE: [Self; 3] = [Self::V1, Self::V1beta2, Self::V1beta1];

    /// The version string, `v1beta2`.
    pub const fn version(self) -> &'static str {
        match self {
            Self::V1 => "v1",
            Self::V1beta2 => "v1beta2",
            Self::V1beta1 => "v1beta1",
        }
    }

    /// The `apiVersion` of objects, `resource.k8s.io/v1beta2`.
    pub const fn api_version(self) -> &'static str {
        match self {
            Self::V1 => "resource.k8s.io/v1",
            Self::V1beta2 => "resource.k8s.io/v1beta2",
            Self::V1beta1 => "resource.k8s.io/v1beta1",
        }
    }

    /// The kube-rs description of a resource of this version (`ResourceClaim`, `resourceclaims`).
    pub fn resource(self, kind: &str, plural: &str) -> ApiResource {
        ApiResource {
            group: GROUP.to_owned(),
            version: self.version().to_owned(),
            api_version: self.api_version().to_owned(),
            kind: kind.to_owned(),
            plural: plural.to_owned(),
        }
    }
}

impl std::fmt::Display for ResourceApiVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.api_version())
    }
}

/// Why no `resource.k8s.io` version could be chosen.
#[derive(Debug, thiserror::Error)]
pub enum DiscoveryError {
    /// The group is not served at all.
    #[error(
        "the api server does not serve resource.k8s.io: DRA needs Kubernetes 1.34 or later, or 1.32/1.33 with the DynamicResourceAllocation feature gate and the resource.k8s.io/v1beta1 API enabled"
    )]
    GroupNotServed,
    /// The group is served, but in no version we speak.
    #[error(
        "the api server serves resource.k8s.io only as {served:?}; resmgr speaks v1, v1beta2 and v1beta1"
    )]
    NoKnownVersion {
        /// The versions the server offered.
        served: Vec<String>,
    },
    /// The server answered with an error status.
    #[error("discovering resource.k8s.io versions: api server answered {code} {reason}: {message}")]
    Api {
        /// HTTP status code.
        code: u16,
        /// The status reason (`Forbidden`).
        reason: String,
        /// The status message.
        message: String,
    },
    /// The request did not get an answer.
    #[error("discovering resource.k8s.io versions")]
    Transport(#[source] ::kube::Error),
}

/// The `resource.k8s.io` version to use, discovered on first use and cached.
pub struct ResourceApiVersions {
    client: Client,
    cached: Mutex<Option<ResourceApiVersion>>,
    pinned: bool,
}

impl std::fmt::Debug for ResourceApiVersions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResourceApiVersions")
            .field("cached", &*self.lock())
            .field("pinned", &self.pinned)
            .finish_non_exhaustive()
    }
}

impl ResourceApiVersions {
    /// Discovers the version from `client` on first use.
    pub fn discover(client: Client) -> Self {
        Self {
            client,
            cached: Mutex::new(None),
            pinned: false,
        }
    }

    /// Always uses `version`, never asking the server (for a configuration that forces it).
    pub fn pinned(client: Client, version: ResourceApiVersion) -> Self {
        Self {
            client,
            cached: Mutex::new(Some(version)),
            pinned: true,
        }
    }

    /// The client the versions were discovered with.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// The version to use, asking the server if it is not known yet.
    pub async fn get(&self) -> Result<ResourceApiVersion, DiscoveryError> {
        if let Some(version) = *self.lock() {
            return Ok(version);
        }
        let version = self.probe().await?;
        *self.lock() = Some(version);
        tracing::info!(version = %version, "using resource.k8s.io version");
        Ok(version)
    }

    /// Forgets the cached version (the server stopped serving it); the next [`Self::get`] asks.
    pub fn forget(&self) {
        if !self.pinned {
            *self.lock() = None;
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<ResourceApiVersion>> {
        stdx::sync::lock(&self.cached)
    }

    async fn probe(&self) -> Result<ResourceApiVersion, DiscoveryError> {
        let request = http::Request::get(format!("/apis/{GROUP}"))
            .body(Vec::new())
            .map_err(|e| DiscoveryError::Transport(::kube::Error::HttpError(e)))?;
        let group: APIGroup = match self.client.request(request).await {
            Ok(group) => group,
            Err(::kube::Error::Api(status)) if status.code == 404 => {
                return Err(DiscoveryError::GroupNotServed);
            }
            Err(::kube::Error::Api(status)) => {
                return Err(DiscoveryError::Api {
                    code: status.code,
                    reason: status.reason,
                    message: status.message,
                });
            }
            Err(e) => return Err(DiscoveryError::Transport(e)),
        };
        let served: Vec<String> = group.versions.iter().map(|v| v.version.clone()).collect();
        ResourceApiVersion::PREFERENCE
            .into_iter()
            .find(|v| served.iter().any(|s| s == v.version()))
            .ok_or(DiscoveryError::NoKnownVersion { served })
    }
}

/// Whether an error says the request's path is not served (the API version went away), as
/// opposed to the object not existing: the API server's NotFound for a missing object names the
/// object in its details; the one for an unknown path does not.
pub(crate) fn is_path_not_served(error: &::kube::Error) -> bool {
    match error {
        ::kube::Error::Api(status) => {
            status.code == 404 && status.details.as_ref().is_none_or(|d| d.name.is_empty())
        }
        _ => false,
    }
}
