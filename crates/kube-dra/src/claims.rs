//! Reading allocated ResourceClaims: the kubelet names a claim, the API server has its allocation.
//!
//! [`ClaimReader::get_claim`] fetches the claim by namespace and name in the newest
//! `resource.k8s.io` version the cluster serves, refuses it (naming it) when it is missing, has
//! another UID than the kubelet sent, or is not allocated, and keeps only the allocation results of
//! our driver. A claim with no result for us is returned with empty results: the caller decides
//! (the kubelet treats such a claim as prepared). Allocation results, configurations and
//! `reservedFor` have the same JSON in v1, v1beta2 and v1beta1, so every version's status is read
//! as v1.
//!
//! A claim made from a ResourceClaimTemplate says the name its pod gives it
//! ([`POD_CLAIM_NAME_ANNOTATION`], [`Claim::pod_claim_name`]): where its containers find its
//! device metadata depends on it.
//!
//! The allocation's opaque configurations for our driver (`status.allocation.devices.config[]`,
//! from the DeviceClass and from the claim) are carried into [`Claim::config`] in the API's
//! order, for the policy to honour or refuse; those of other drivers, and entries that are not
//! opaque, are dropped. A malformed entry refuses the claim, naming the entry's field path.

use std::{collections::BTreeMap, fmt, sync::Arc};

use ::kube::{Api, api::DynamicObject};
use futures::future::BoxFuture;
use k8s_openapi::api::resource::v1 as wire;
use kubelet_plugin::ClaimRef;
use policy::{AllocationResult, Claim, ClaimConfig, ConfigSource, Quantity};

use super::{
    retry::{AttemptError, RetryError, RetryPolicy},
    version::{DiscoveryError, ResourceApiVersions, is_path_not_served},
};

/// Why a claim could not be read. Every variant names the claim.
#[derive(Debug, thiserror::Error)]
pub enum ClaimReadError {
    /// No claim of that namespace and name exists.
    #[error("resource claim {claim} not found")]
    NotFound {
        /// The claim asked for.
        claim: ClaimRef,
    },
    /// A claim of that name exists, but it is another object (deleted and re-created).
    #[error(
        "resource claim {claim} has uid {found} in the api server: it was deleted and re-created"
    )]
    UidMismatch {
        /// The claim asked for.
        claim: ClaimRef,
        /// The UID the API server has.
        found: String,
    },
    /// The claim has no allocation (yet, or any more).
    #[error("resource claim {claim} is not allocated")]
    NotAllocated {
        /// The claim asked for.
        claim: ClaimRef,
    },
    /// The claim's status is not what the API promises.
    #[error("resource claim {claim}: {field}: {reason}")]
    Invalid {
        /// The claim asked for.
        claim: ClaimRef,
        /// Path of the offending field.
        field: String,
        /// What is wrong with it.
        reason: String,
    },
    /// No `resource.k8s.io` version to read it with.
    #[error("reading resource claim {claim}")]
    Discovery {
        /// The claim asked for.
        claim: ClaimRef,
        /// Why discovery failed.
        #[source]
        source: Box<DiscoveryError>,
    },
    /// The claim is known only by its UID, and this reader cannot look claims up by UID.
    #[error("resource claim {claim} is known only by its uid, which this reader cannot look up")]
    Unnamed {
        /// The claim asked for.
        claim: ClaimRef,
    },
    /// The API server refused (for example 403: RBAC lacks `get` on `resourceclaims`), or did not
    /// answer within the retry budget.
    #[error("reading resource claim {claim}")]
    Api {
        /// The claim asked for.
        claim: ClaimRef,
        /// The last attempt's failure.
        #[source]
        source: Box<RetryError>,
    },
}

impl ClaimReadError {
    /// The claim the error is about.
    pub fn claim(&self) -> &ClaimRef {
        match self {
            Self::NotFound { claim }
            | Self::UidMismatch { claim, .. }
            | Self::NotAllocated { claim }
            | Self::Invalid { claim, .. }
            | Self::Unnamed { claim }
            | Self::Discovery { claim, .. }
            | Self::Api { claim, .. } => claim,
        }
    }
}

/// Reads allocated claims. Implemented against the API server by [`KubeClaimReader`], by
/// [`NoClaims`] where there is none, and in memory by [`super::fake::StaticClaims`].
pub trait ClaimReader: Send + Sync + fmt::Debug {
    /// The claim with only our driver's allocation results, or why not.
    fn get_claim<'a>(&'a self, claim: &'a ClaimRef)
    -> BoxFuture<'a, Result<Claim, ClaimReadError>>;

    /// Where a claim stands, for reconciliation (resmgr's `reconcile`): `Some` with our driver's
    /// results while a claim of that UID is allocated, `None` when there is none (deleted,
    /// re-created under another UID) or it is not allocated. `claim` may have no name (a claim
    /// taken back from its CDI spec knows only its UID): then the claim is looked for by UID.
    /// The default asks [`ClaimReader::get_claim`] and cannot look up a claim without a name.
    fn find_claim<'a>(
        &'a self,
        claim: &'a ClaimRef,
    ) -> BoxFuture<'a, Result<Option<Claim>, ClaimReadError>> {
        Box::pin(async move {
            if claim.name.is_empty() {
                return Err(ClaimReadError::Unnamed {
                    claim: claim.clone(),
                });
            }
            standing(self.get_claim(claim).await)
        })
    }
}

/// Reads no claims: the agent without DRA, which talks to no API server and is never asked to
/// prepare (the kubelet does not know it). A claim reads as not found, and none is found by UID;
/// reconciliation without DRA does not ask (resmgr's `ReconcileConfig::pool`).
#[derive(Debug, Default, Clone, Copy)]
pub struct NoClaims;

impl ClaimReader for NoClaims {
    fn get_claim<'a>(
        &'a self,
        claim: &'a ClaimRef,
    ) -> BoxFuture<'a, Result<Claim, ClaimReadError>> {
        Box::pin(std::future::ready(Err(ClaimReadError::NotFound {
            claim: claim.clone(),
        })))
    }

    fn find_claim<'a>(
        &'a self,
        _claim: &'a ClaimRef,
    ) -> BoxFuture<'a, Result<Option<Claim>, ClaimReadError>> {
        Box::pin(std::future::ready(Ok(None)))
    }
}

/// A read's answer as a standing: gone and not allocated are answers, not errors.
fn standing(read: Result<Claim, ClaimReadError>) -> Result<Option<Claim>, ClaimReadError> {
    match read {
        Ok(claim) => Ok(Some(claim)),
        Err(
            ClaimReadError::NotFound { .. }
            | ClaimReadError::UidMismatch { .. }
            | ClaimReadError::NotAllocated { .. },
        ) => Ok(None),
        Err(e) => Err(e),
    }
}

impl<T: ClaimReader + ?Sized> ClaimReader for Arc<T> {
    fn get_claim<'a>(
        &'a self,
        claim: &'a ClaimRef,
    ) -> BoxFuture<'a, Result<Claim, ClaimReadError>> {
        (**self).get_claim(claim)
    }

    fn find_claim<'a>(
        &'a self,
        claim: &'a ClaimRef,
    ) -> BoxFuture<'a, Result<Option<Claim>, ClaimReadError>> {
        (**self).find_claim(claim)
    }
}

/// Reads claims from the API server.
#[derive(Debug, Clone)]
pub struct KubeClaimReader {
    versions: Arc<ResourceApiVersions>,
    driver: String,
    retry: RetryPolicy,
}

impl KubeClaimReader {
    /// Reads claims for `driver` through `versions` (which holds the client), retrying per
    /// `retry`.
    pub fn new(
        versions: Arc<ResourceApiVersions>,
        driver: impl Into<String>,
        retry: RetryPolicy,
    ) -> Self {
        Self {
            versions,
            driver: driver.into(),
            retry,
        }
    }

    async fn read(&self, claim: &ClaimRef) -> Result<Claim, ClaimReadError> {
        let object = self
            .retry
            .run(|| self.fetch(claim))
            .await
            .map_err(|source| match source.last {
                AttemptError::Discovery(
                    source @ (DiscoveryError::GroupNotServed
                    | DiscoveryError::NoKnownVersion { .. }),
                ) => ClaimReadError::Discovery {
                    claim: claim.clone(),
                    source: Box::new(source),
                },
                _ => ClaimReadError::Api {
                    claim: claim.clone(),
                    source: Box::new(source),
                },
            })?
            .ok_or_else(|| ClaimReadError::NotFound {
                claim: claim.clone(),
            })?;
        claim_from_object(claim, &self.driver, object)
    }

    /// One attempt: `None` when the claim does not exist.
    async fn fetch(&self, claim: &ClaimRef) -> Result<Option<DynamicObject>, AttemptError> {
        let version = self.versions.get().await.map_err(AttemptError::Discovery)?;
        let resource = version.resource("ResourceClaim", "resourceclaims");
        let api: Api<DynamicObject> =
            Api::namespaced_with(self.versions.client().clone(), &claim.namespace, &resource);
        match api.get(&claim.name).await {
            Ok(object) => Ok(Some(object)),
            Err(e) if is_path_not_served(&e) => {
                self.versions.forget();
                Err(AttemptError::VersionGone(version))
            }
            Err(::kube::Error::Api(status)) if status.code == 404 => Ok(None),
            Err(e) => Err(AttemptError::from_kube(e)),
        }
    }
}

impl ClaimReader for KubeClaimReader {
    fn get_claim<'a>(
        &'a self,
        claim: &'a ClaimRef,
    ) -> BoxFuture<'a, Result<Claim, ClaimReadError>> {
        Box::pin(self.read(claim))
    }

    fn find_claim<'a>(
        &'a self,
        claim: &'a ClaimRef,
    ) -> BoxFuture<'a, Result<Option<Claim>, ClaimReadError>> {
        Box::pin(async move {
            if !claim.name.is_empty() {
                return standing(self.read(claim).await);
            }
            let found = self
                .retry
                .run(|| self.find_by_uid(&claim.uid))
                .await
                .map_err(|source| ClaimReadError::Api {
                    claim: claim.clone(),
                    source: Box::new(source),
                })?;
            match found {
                None => Ok(None),
                Some(object) => {
                    let named = ClaimRef::new(
                        object.metadata.namespace.clone().unwrap_or_default(),
                        object.metadata.name.clone().unwrap_or_default(),
                        &claim.uid,
                    );
                    standing(claim_from_object(&named, &self.driver, object))
                }
            }
        })
    }
}

impl KubeClaimReader {
    /// One attempt at finding the claim of UID `uid` in every namespace (a list, in pages: the
    /// API server has no selector on UIDs). Needs `list` on `resourceclaims`; only start-up
    /// reconciliation of claims taken back from their CDI specs does this.
    async fn find_by_uid(&self, uid: &str) -> Result<Option<DynamicObject>, AttemptError> {
        let version = self.versions.get().await.map_err(AttemptError::Discovery)?;
        let resource = version.resource("ResourceClaim", "resourceclaims");
        let api: Api<DynamicObject> = Api::all_with(self.versions.client().clone(), &resource);
        let mut params = ::kube::api::ListParams::default().limit(500);
        loop {
            let page = match api.list(&params).await {
                Ok(page) => page,
                Err(e) if is_path_not_served(&e) => {
                    self.versions.forget();
                    return Err(AttemptError::VersionGone(version));
                }
                Err(e) => return Err(AttemptError::from_kube(e)),
            };
            if let Some(found) = page
                .items
                .into_iter()
                .find(|o| o.metadata.uid.as_deref() == Some(uid))
            {
                return Ok(Some(found));
            }
            match page.metadata.continue_ {
                Some(token) if !token.is_empty() => params = params.continue_token(&token),
                _ => return Ok(None),
            }
        }
    }
}

/// The domain claim from a ResourceClaim object of any served version.
pub fn claim_from_object(
    claim: &ClaimRef,
    driver: &str,
    object: DynamicObject,
) -> Result<Claim, ClaimReadError> {
    let found = object.metadata.uid.clone().unwrap_or_default();
    if found != claim.uid {
        return Err(ClaimReadError::UidMismatch {
            claim: claim.clone(),
            found,
        });
    }
    let invalid = |field: String, reason: String| ClaimReadError::Invalid {
        claim: claim.clone(),
        field,
        reason,
    };
    let mut status = match object.data.get("status") {
        None | Some(serde_json::Value::Null) => serde_json::Value::Null,
        Some(status) => status.clone(),
    };
    // Configurations are decoded one by one, so a malformed one is named by its index rather
    // than failing the whole status with serde's line and column of a JSON we never saw.
    const CONFIG: &str = "/allocation/devices/config";
    let raw_configs = status.pointer_mut(CONFIG).map(serde_json::Value::take);
    let mut status: wire::ResourceClaimStatus = if status.is_null() {
        wire::ResourceClaimStatus::default()
    } else {
        serde_json::from_value(status).map_err(|e| invalid("status".to_owned(), e.to_string()))?
    };
    let configs = match raw_configs {
        None | Some(serde_json::Value::Null) => None,
        Some(serde_json::Value::Array(entries)) => Some(
            entries
                .into_iter()
                .enumerate()
                .map(|(index, entry)| {
                    serde_json::from_value(entry).map_err(|e| {
                        invalid(
                            format!("status.allocation.devices.config[{index}]"),
                            e.to_string(),
                        )
                    })
                })
                .collect::<Result<Vec<wire::DeviceAllocationConfiguration>, _>>()?,
        ),
        Some(other) => {
            return Err(invalid(
                "status.allocation.devices.config".to_owned(),
                format!("not a list: {other}"),
            ));
        }
    };
    if let Some(devices) = status.allocation.as_mut().and_then(|a| a.devices.as_mut()) {
        devices.config = configs;
    }
    let mut read = claim_from_status(claim, driver, status)?;
    read.pod_claim_name = object
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(POD_CLAIM_NAME_ANNOTATION))
        .filter(|name| !name.is_empty())
        .cloned();
    Ok(read)
}

/// The annotation the resource claim controller sets on a claim it made from a
/// ResourceClaimTemplate: the name the pod gives the claim (`pod.spec.resourceClaims[].name`).
pub const POD_CLAIM_NAME_ANNOTATION: &str = "resource.kubernetes.io/pod-claim-name";

/// The domain claim from a v1 status: our driver's results, and the pods it is reserved for.
pub fn claim_from_status(
    claim: &ClaimRef,
    driver: &str,
    status: wire::ResourceClaimStatus,
) -> Result<Claim, ClaimReadError> {
    let allocation = status
        .allocation
        .ok_or_else(|| ClaimReadError::NotAllocated {
            claim: claim.clone(),
        })?;
    let invalid = |field: String, reason: String| ClaimReadError::Invalid {
        claim: claim.clone(),
        field,
        reason,
    };
    let mut results = Vec::new();
    let (all_results, all_configs) = allocation
        .devices
        .map(|d| (d.results.unwrap_or_default(), d.config.unwrap_or_default()))
        .unwrap_or_default();
    for (index, result) in all_results.into_iter().enumerate() {
        if result.driver != driver {
            continue;
        }
        let field = |name: &str| format!("status.allocation.devices.results[{index}].{name}");
        for (name, value) in [
            ("request", &result.request),
            ("pool", &result.pool),
            ("device", &result.device),
        ] {
            if value.is_empty() {
                return Err(invalid(field(name), "empty".to_owned()));
            }
        }
        let mut consumed_capacity = BTreeMap::new();
        for (name, quantity) in result.consumed_capacity.unwrap_or_default() {
            let parsed: Quantity =
                quantity
                    .0
                    .parse()
                    .map_err(|e: policy::QuantityParseError| {
                        invalid(field(&format!("consumedCapacity[{name}]")), e.to_string())
                    })?;
            consumed_capacity.insert(name, parsed);
        }
        results.push(AllocationResult {
            request: result.request,
            pool: result.pool,
            device: result.device,
            share_id: result.share_id.filter(|s| !s.is_empty()),
            consumed_capacity,
        });
    }
    let mut config = Vec::new();
    for (index, entry) in all_configs.into_iter().enumerate() {
        let field = |name: &str| format!("status.allocation.devices.config[{index}].{name}");
        // Only opaque configurations exist today; a kind added later is not ours to read.
        let Some(opaque) = entry.opaque else {
            continue;
        };
        if opaque.driver != driver {
            continue;
        }
        let source = match entry.source.as_str() {
            "FromClass" => ConfigSource::Class,
            "FromClaim" => ConfigSource::Claim,
            other => {
                return Err(invalid(
                    field("source"),
                    format!("{other:?} is neither FromClass nor FromClaim"),
                ));
            }
        };
        let requests = entry.requests.unwrap_or_default();
        if let Some(i) = requests.iter().position(String::is_empty) {
            return Err(invalid(
                field(&format!("requests[{i}]")),
                "empty".to_owned(),
            ));
        }
        if opaque.parameters.0.is_null() {
            return Err(invalid(field("opaque.parameters"), "missing".to_owned()));
        }
        config.push(ClaimConfig {
            source,
            requests,
            parameters: opaque.parameters.0,
        });
    }
    // Only pods consume claims on a node; other consumers (a controller reserving a claim for
    // itself) have no containers for us to grant CPUs to.
    let reserved_for = status
        .reserved_for
        .unwrap_or_default()
        .into_iter()
        .filter(|r| r.api_group.as_deref().unwrap_or("").is_empty() && r.resource == "pods")
        .map(|r| r.uid)
        .collect();
    Ok(Claim {
        uid: claim.uid.clone(),
        namespace: claim.namespace.clone(),
        name: claim.name.clone(),
        reserved_for,
        results,
        config,
        pod_claim_name: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn without_an_api_server_no_claim_is_read_or_found() {
        let claim = ClaimRef::new("ns", "c", "uid-1");
        assert!(matches!(
            NoClaims.get_claim(&claim).await,
            Err(ClaimReadError::NotFound { claim: c }) if c == claim
        ));
        assert!(matches!(NoClaims.find_claim(&claim).await, Ok(None)));
        let unnamed = ClaimRef::new("", "", "uid-1");
        assert!(matches!(NoClaims.find_claim(&unnamed).await, Ok(None)));
    }
}
