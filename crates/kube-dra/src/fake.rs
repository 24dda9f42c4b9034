//! In-memory stand-ins for the Kubernetes API, for the simulator and for tests of a driver (the
//! resource manager's): [`StaticClaims`] answers claim reads from a map, [`RecordingPublisher`] records what
//! would have been published, [`RecordingEvents`] the notices that would have become Events. The
//! first two apply the same checks as the real ones (UID, allocation, device validation), so a
//! simulation refuses what a cluster would.

use std::{collections::HashMap, sync::Mutex};

use futures::future::BoxFuture;
use kubelet_plugin::ClaimRef;
use policy::{Claim, Device};
use stdx::sync::lock;

use super::{
    claims::{ClaimReadError, ClaimReader},
    notices::{EventRecorder, Notice},
    slices::{DevicePublisher, PublishError, PublishReport, validate::validate_devices},
};

/// Claims held in memory, by namespace and name. A claim stored without results reads as
/// allocated with no result for our driver; one removed with [`StaticClaims::deallocate`] reads
/// as not allocated.
#[derive(Debug, Default)]
pub struct StaticClaims {
    claims: Mutex<HashMap<(String, String), Option<Claim>>>,
}

impl StaticClaims {
    /// No claims.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds or replaces an allocated claim.
    pub fn insert(&self, claim: Claim) {
        let key = (claim.namespace.clone(), claim.name.clone());
        lock(&self.claims).insert(key, Some(claim));
    }

    /// Keeps the claim but drops its allocation.
    pub fn deallocate(&self, namespace: &str, name: &str) {
        lock(&self.claims).insert((namespace.to_owned(), name.to_owned()), None);
    }

    /// Removes the claim.
    pub fn remove(&self, namespace: &str, name: &str) {
        lock(&self.claims).remove(&(namespace.to_owned(), name.to_owned()));
    }
}

impl ClaimReader for StaticClaims {
    fn get_claim<'a>(
        &'a self,
        claim: &'a ClaimRef,
    ) -> BoxFuture<'a, Result<Claim, ClaimReadError>> {
        let key = (claim.namespace.clone(), claim.name.clone());
        let result = match lock(&self.claims).get(&key) {
            None => Err(ClaimReadError::NotFound {
                claim: claim.clone(),
            }),
            Some(None) => Err(ClaimReadError::NotAllocated {
                claim: claim.clone(),
            }),
            Some(Some(found)) if found.uid != claim.uid => Err(ClaimReadError::UidMismatch {
                claim: claim.clone(),
                found: found.uid.clone(),
            }),
            Some(Some(found)) => Ok(found.clone()),
        };
        Box::pin(std::future::ready(result))
    }

    fn find_claim<'a>(
        &'a self,
        claim: &'a ClaimRef,
    ) -> BoxFuture<'a, Result<Option<Claim>, ClaimReadError>> {
        let found = lock(&self.claims)
            .values()
            .flatten()
            .find(|c| c.uid == claim.uid)
            .cloned();
        Box::pin(std::future::ready(Ok(found)))
    }
}

/// Records every accepted publication.
#[derive(Debug)]
pub struct RecordingPublisher {
    driver: String,
    published: Mutex<Vec<Vec<Device>>>,
}

impl RecordingPublisher {
    /// A publisher for `driver` (bare attribute names belong to its domain).
    pub fn new(driver: impl Into<String>) -> Self {
        Self {
            driver: driver.into(),
            published: Mutex::new(Vec::new()),
        }
    }

    /// Every accepted publication, oldest first.
    pub fn publications(&self) -> Vec<Vec<Device>> {
        lock(&self.published).clone()
    }

    /// The devices published last, if any.
    pub fn current(&self) -> Option<Vec<Device>> {
        lock(&self.published).last().cloned()
    }
}

impl DevicePublisher for RecordingPublisher {
    fn publish(&self, devices: Vec<Device>) -> BoxFuture<'_, Result<PublishReport, PublishError>> {
        let result = validate_devices(&self.driver, &devices)
            .map_err(PublishError::from)
            .map(|()| {
                let mut published = lock(&self.published);
                published.push(devices);
                PublishReport {
                    generation: i64::try_from(published.len()).unwrap_or(i64::MAX),
                    slices: 1,
                    ..PublishReport::default()
                }
            });
        Box::pin(std::future::ready(result))
    }
}

/// Records every notice, in order.
#[derive(Debug, Default)]
pub struct RecordingEvents {
    notices: Mutex<Vec<Notice>>,
}

impl RecordingEvents {
    /// Nothing recorded.
    pub fn new() -> Self {
        Self::default()
    }

    /// Every notice so far, oldest first.
    pub fn notices(&self) -> Vec<Notice> {
        lock(&self.notices).clone()
    }
}

impl EventRecorder for RecordingEvents {
    fn record(&self, notice: Notice) {
        lock(&self.notices).push(notice);
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn claim(uid: &str) -> Claim {
        Claim {
            uid: uid.into(),
            namespace: "ns".into(),
            name: "c".into(),
            reserved_for: vec!["pod-1".into()],
            results: Vec::new(),
            config: Vec::new(),
            pod_claim_name: None,
        }
    }

    #[tokio::test]
    async fn static_claims_check_like_the_api_reader() {
        let claims = StaticClaims::new();
        let wanted = ClaimRef::new("ns", "c", "uid-1");
        assert!(matches!(
            claims.get_claim(&wanted).await,
            Err(ClaimReadError::NotFound { .. })
        ));
        claims.insert(claim("uid-2"));
        assert!(matches!(
            claims.get_claim(&wanted).await,
            Err(ClaimReadError::UidMismatch { .. })
        ));
        claims.insert(claim("uid-1"));
        assert_eq!(claims.get_claim(&wanted).await.unwrap(), claim("uid-1"));
        claims.deallocate("ns", "c");
        assert!(matches!(
            claims.get_claim(&wanted).await,
            Err(ClaimReadError::NotAllocated { .. })
        ));
    }

    #[tokio::test]
    async fn recording_publisher_validates_and_records() {
        let publisher = RecordingPublisher::new("d.io");
        let device = |name: &str| Device {
            name: name.into(),
            attributes: BTreeMap::new(),
            capacities: BTreeMap::new(),
            allow_multiple_allocations: false,
            taints: Vec::new(),
        };
        publisher.publish(vec![device("a")]).await.unwrap();
        assert!(matches!(
            publisher.publish(vec![device("Bad")]).await,
            Err(PublishError::Invalid(_))
        ));
        assert_eq!(publisher.publications(), vec![vec![device("a")]]);
    }
}
