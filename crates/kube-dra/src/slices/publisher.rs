//! [`SlicePublisher`]: makes the API server's slices of our pool match our devices, and keeps them
//! that way.
//!
//! Each reconciliation lists our pool's slices (a quorum read, never a cache, so a slice we just
//! created is never created twice) and compares them with the wanted chunks:
//!
//! - all present and equal, one generation: nothing to do;
//! - some missing, the rest equal at one generation (the kubelet deleted some): create the
//!   missing ones at that generation;
//! - anything else (devices changed, a slice edited by someone else, a stale owner): rewrite the
//!   pool at a new generation: delete surplus slices first, update the others in place, create
//!   what is still missing. Updates and deletes carry the resourceVersion we saw; a conflict means
//!   someone else wrote meanwhile, and we start over.
//!
//! [`SlicePublisher::maintain`] watches the pool and reconciles when a slice is deleted, when one
//! is changed by anyone but us (we remember the resourceVersions our writes produced), and after
//! every (re)list of the watch, and retries failed publications with backoff.
//!
//! Fields the API server drops (a feature gate is off) are reported in each [`PublishReport`]
//! and, for whoever wants to react whenever it happens (the binary logs which setting fits the
//! cluster and exports a metric), through [`SlicePublisher::dropped_fields`]; the form of the
//! node-allocatable mapping the API server's release does not know is left out of both, as
//! long as it keeps the other ([`allocatable::superseded`]).
//!
//! List-valued attributes (`strings`, such as `resource.kubernetes.io/pcieRoot`) need the alpha
//! gate `DRAListTypeAttributes` on the API server. Without it the API server drops the list,
//! which leaves the attribute without a value, and refuses the slice (422, `exactly one value
//! must be specified` from 1.36, `must specify one of: ...` from 1.37). The reconciliation then publishes the same slices without list
//! attributes, logs a warning naming each attribute and the gate, and reports each dropped
//! field (`devices[].attributes["resource.kubernetes.io/pcieRoot"].strings`) like any other, so
//! the metric counts it; the lists stay out until the agent restarts.
//!
//! A 1.37 API server refuses (403) a slice that maps node resources for a Node whose kubelet
//! does not declare `DRANodeAllocatableResources` in `status.declaredFeatures` (its
//! NodeDeclaredFeatureValidator admission). Retrying would publish nothing, for ever. Instead
//! the reconciliation falls back at once to the same slices without the mapping, logs a warning
//! naming the Node and the refusal, and says so in [`PublishStatus::node_allocatable_refused`].
//! The mapped form is tried again when a reconciliation finds the Node declaring the feature it
//! did not declare when refused (a kubelet restarted with the gate; its start wipes our slices,
//! which reconciles), and [`PublisherConfig::node_allocatable_retry`] after the last refusal,
//! for what the Node does not show (the API server reconfigured).

use std::{
    collections::{BTreeMap, BTreeSet, HashSet},
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
};

use ::kube::{
    Api,
    api::{DeleteParams, DynamicObject, ListParams, ObjectMeta, PostParams, Preconditions},
    core::TypeMeta,
    runtime::{WatchStreamExt, watcher},
};
use futures::{FutureExt, StreamExt, future::BoxFuture};
use k8s_openapi::api::{core::v1::Node, resource::v1 as wire};
use policy::Device;
use serde_json::Value;
use tokio::{
    sync::{Notify, watch},
    time::Instant,
};

use super::{
    DevicePublisher, PublisherConfig, PublisherConfigError, allocatable,
    build::{self, MANAGED_BY, MANAGED_BY_LABEL},
    validate::{DeviceValidationError, validate_devices},
    wire::{FieldPath, Step, comparable, dropped_fields, from_wire, to_wire},
};
use stdx::errors::chain;

use crate::{
    notices::{EventRecorder, NoEvents, Notice},
    retry::{AttemptError, RetryError},
    version::{DiscoveryError, ResourceApiVersion, ResourceApiVersions, is_path_not_served},
};

/// Times a reconciliation starts over after a write conflict before giving up.
const CONFLICT_RETRIES: usize = 3;

/// Why the devices could not be published.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    /// A device the API server would refuse; nothing was sent.
    #[error(transparent)]
    Invalid(#[from] DeviceValidationError),
    /// No `resource.k8s.io` version to publish with.
    #[error("publishing resource slices")]
    Discovery(#[source] DiscoveryError),
    /// A request failed (for example 403: RBAC lacks a verb on `resourceslices` or `get` on
    /// `nodes`).
    #[error("{action} of node {node}")]
    Api {
        /// What we were doing (`creating a resource slice`).
        action: String,
        /// Our node.
        node: String,
        /// How the request failed.
        #[source]
        source: RetryError,
    },
    /// Someone else kept writing our slices while we did.
    #[error(
        "resource slices of node {node} kept changing while we wrote them ({attempts} attempts)"
    )]
    Conflict {
        /// Our node.
        node: String,
        /// Reconciliations tried.
        attempts: usize,
    },
}

/// How publication is going, for metrics: read it at any time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PublishStatus {
    /// Whether the last publication (or republication) succeeded: the API server has our
    /// devices as the policy last gave them.
    pub in_sync: bool,
    /// Publications and republications that failed, since the start.
    pub failures: u64,
    /// Whether the API server refuses the node-allocatable mapping for our Node, so the slices
    /// are published without it (see the module docs).
    pub node_allocatable_refused: bool,
}

/// What one publication did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PublishReport {
    /// The pool's generation now.
    pub generation: i64,
    /// Slices in the pool.
    pub slices: usize,
    /// Slices created.
    pub created: usize,
    /// Slices updated in place.
    pub updated: usize,
    /// Slices deleted.
    pub deleted: usize,
    /// Fields the API server dropped from what we sent, first seen in this publication (a feature
    /// gate is off): `devices[].allowMultipleAllocations`.
    pub dropped_fields: Vec<String>,
}

/// Publishes our devices as ResourceSlices through the API server. Cheap to clone; clones share
/// state.
#[derive(Debug, Clone)]
pub struct SlicePublisher {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    config: PublisherConfig,
    versions: Arc<ResourceApiVersions>,
    /// Held for a whole reconciliation, so publish and maintain never interleave writes.
    state: tokio::sync::Mutex<State>,
    /// Tells [`SlicePublisher::maintain`] that a publication failed and needs retrying.
    retry: Notify,
    /// Every field the API server was seen dropping, as printed (`devices[].allowMultipleAllocations`).
    dropped: watch::Sender<BTreeSet<String>>,
    /// [`PublishStatus::in_sync`].
    in_sync: AtomicBool,
    /// [`PublishStatus::failures`].
    failures: AtomicU64,
    /// When the refused node-allocatable mapping is next tried by [`SlicePublisher::maintain`];
    /// `None` while it is not refused. [`PublishStatus::node_allocatable_refused`] reads it.
    mapping_retry_at: watch::Sender<Option<Instant>>,
    /// Where what an operator must hear of goes: an Event on the Node ([`NoEvents`] unless
    /// [`SlicePublisher::with_recorder`] set it).
    recorder: std::sync::OnceLock<Arc<dyn EventRecorder>>,
}

#[derive(Debug, Default)]
struct State {
    /// What to publish; `None` until the first [`SlicePublisher::publish`].
    desired: Option<Vec<wire::Device>>,
    /// The highest pool generation we know of.
    generation: i64,
    /// The version `dropped` was learnt with.
    version: Option<ResourceApiVersion>,
    /// Fields the API server drops (gates off); ignored when comparing.
    dropped: BTreeSet<FieldPath>,
    /// resourceVersions of our own writes: their watch events need no reconciliation.
    written: HashSet<String>,
    /// Set while the API server refuses our node-allocatable mapping.
    refusal: Option<Refusal>,
    /// The API server refused list-valued attributes (see the module docs): they stay out.
    lists_refused: bool,
}

/// The API server's last refusal of the node-allocatable mapping.
#[derive(Debug)]
struct Refusal {
    /// When.
    at: Instant,
    /// Whether the Node declared the feature then.
    declared: bool,
}

/// What a reconciliation needs of our Node.
#[derive(Debug)]
struct NodeFacts {
    uid: String,
    /// Whether its `status.declaredFeatures` has [`NODE_ALLOCATABLE_FEATURE`].
    declares_node_allocatable: bool,
}

/// The feature a Node declares (`status.declaredFeatures`) for a 1.37 API server to admit slices
/// that map its resources.
const NODE_ALLOCATABLE_FEATURE: &str = "DRANodeAllocatableResources";

/// The API server's gate for list-valued attributes.
pub const LIST_ATTRIBUTES_GATE: &str = "DRAListTypeAttributes";

/// One of our pool's slices as the API server has it.
#[derive(Debug)]
struct Existing {
    name: String,
    resource_version: Option<String>,
    labels: BTreeMap<String, String>,
    generation: i64,
    /// The comparable form of its devices and pool size; `None` if it did not parse.
    key: Option<Value>,
    /// Has our label and our owner.
    ours: bool,
}

impl SlicePublisher {
    /// A publisher for `config`, speaking the version `versions` finds (which holds the client).
    pub fn new(
        config: PublisherConfig,
        versions: Arc<ResourceApiVersions>,
    ) -> Result<Self, PublisherConfigError> {
        config.validate()?;
        Ok(Self {
            inner: Arc::new(Inner {
                config,
                versions,
                state: tokio::sync::Mutex::new(State::default()),
                retry: Notify::new(),
                dropped: watch::Sender::new(BTreeSet::new()),
                in_sync: AtomicBool::new(false),
                failures: AtomicU64::new(0),
                mapping_retry_at: watch::Sender::new(None),
                recorder: std::sync::OnceLock::new(),
            }),
        })
    }

    /// Tells `recorder` when the API server makes the slices be published without something
    /// (the node-allocatable mapping, list attributes): an Event on the Node. The first call
    /// sets it, for every clone.
    #[must_use]
    pub fn with_recorder(self, recorder: Arc<dyn EventRecorder>) -> Self {
        let _ = self.inner.recorder.set(recorder);
        self
    }

    /// Records `notice` for an Event.
    fn tell(&self, notice: Notice) {
        match self.inner.recorder.get() {
            Some(recorder) => recorder.record(notice),
            None => NoEvents.record(notice),
        }
    }

    /// The fields the API server has been seen dropping from our slices since we started,
    /// updated as publications (by [`DevicePublisher::publish`] or
    /// [`SlicePublisher::maintain`]) find more.
    pub fn dropped_fields(&self) -> watch::Receiver<BTreeSet<String>> {
        self.inner.dropped.subscribe()
    }

    /// How publication is going.
    pub fn status(&self) -> PublishStatus {
        PublishStatus {
            in_sync: self.inner.in_sync.load(Ordering::Relaxed),
            failures: self.inner.failures.load(Ordering::Relaxed),
            node_allocatable_refused: self.inner.mapping_retry_at.borrow().is_some(),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &PublisherConfig {
        &self.inner.config
    }

    async fn publish_devices(&self, devices: Vec<Device>) -> Result<PublishReport, PublishError> {
        let wire_devices = wire_devices(&self.inner.config, &devices)?;
        let mut state = self.inner.state.lock().await;
        state.desired = Some(wire_devices);
        let result = self.reconcile(&mut state).await;
        if result.is_err() {
            self.inner.retry.notify_one();
        }
        result
    }

    /// Keeps the published slices as wanted, forever: watches our pool and reconciles when a
    /// slice is deleted or changed by someone else, after every (re)list, and after a failed
    /// publication (with backoff). Run it as a task next to [`DevicePublisher::publish`]; it does
    /// nothing until the first publication.
    pub async fn maintain(&self) {
        let config = &self.inner.config;
        let mut backoff = config.resync_backoff;
        loop {
            let version = match self.inner.versions.get().await {
                Ok(version) => version,
                Err(error) => {
                    tracing::warn!(error = %error, "cannot watch resource slices");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(config.max_resync_backoff);
                    continue;
                }
            };
            let api = self.api(version);
            let watch = watcher(
                api,
                watcher::Config::default().fields(&build::field_selector(config)),
            )
            .default_backoff();
            let restart = self.follow(watch, &mut backoff).await;
            if restart.version_gone {
                self.inner.versions.forget();
            }
            tokio::time::sleep(backoff).await;
        }
    }

    /// Follows one watch until it ends or its version goes away.
    async fn follow(
        &self,
        watch: impl futures::Stream<Item = Result<watcher::Event<DynamicObject>, watcher::Error>>,
        backoff: &mut std::time::Duration,
    ) -> Restart {
        let config = &self.inner.config;
        let mut watch = std::pin::pin!(watch);
        let mut retry_at: Option<Instant> = None;
        let mut mapping = self.inner.mapping_retry_at.subscribe();
        loop {
            let mapping_at = *mapping.borrow_and_update();
            let mut pending = tokio::select! {
                event = watch.next() => match event {
                    None => return Restart { version_gone: false },
                    Some(event) => match self.on_event(event).await {
                        Ok(pending) => pending,
                        Err(restart) => return restart,
                    },
                },
                () = self.inner.retry.notified() => true,
                () = sleep_until(retry_at), if retry_at.is_some() => true,
                // Time to try the refused node-allocatable mapping again.
                () = sleep_until(mapping_at), if mapping_at.is_some() => true,
                // A publication had the mapping refused, or accepted: look again.
                Ok(()) = mapping.changed() => false,
            };
            // Take every event already here (a DeleteCollection deletes many slices) before
            // reconciling once.
            while let Some(Some(event)) = watch.next().now_or_never() {
                match self.on_event(event).await {
                    Ok(more) => pending |= more,
                    Err(restart) => return restart,
                }
            }
            if !pending {
                continue;
            }
            let mut state = self.inner.state.lock().await;
            match self.reconcile(&mut state).await {
                Ok(report) => {
                    if report.created + report.updated + report.deleted > 0 {
                        tracing::info!(?report, "republished resource slices");
                    }
                    retry_at = None;
                    *backoff = config.resync_backoff;
                }
                Err(error) => {
                    tracing::warn!(error = %chain(&error), retry_in = ?*backoff, "republishing resource slices failed");
                    retry_at = Some(Instant::now() + *backoff);
                    *backoff = (*backoff * 2).min(config.max_resync_backoff);
                }
            }
        }
    }

    /// Whether a watch event calls for reconciliation; `Err` when the watch must restart.
    async fn on_event(
        &self,
        event: Result<watcher::Event<DynamicObject>, watcher::Error>,
    ) -> Result<bool, Restart> {
        let event = match event {
            Ok(event) => event,
            Err(error) => {
                let version_gone = match &error {
                    watcher::Error::InitialListFailed(e)
                    | watcher::Error::WatchStartFailed(e)
                    | watcher::Error::WatchFailed(e) => is_path_not_served(e),
                    _ => false,
                };
                tracing::warn!(error = %error, "watching resource slices");
                return if version_gone {
                    Err(Restart { version_gone })
                } else {
                    // The watcher relists by itself (with backoff); InitDone follows.
                    Ok(false)
                };
            }
        };
        let state = self.inner.state.lock().await;
        if state.desired.is_none() {
            return Ok(false);
        }
        Ok(match event {
            watcher::Event::Delete(_) | watcher::Event::InitDone => true,
            watcher::Event::Apply(slice) => slice
                .metadata
                .resource_version
                .as_ref()
                .is_none_or(|rv| !state.written.contains(rv)),
            watcher::Event::Init | watcher::Event::InitApply(_) => false,
        })
    }

    fn api(&self, version: ResourceApiVersion) -> Api<DynamicObject> {
        let resource = version.resource("ResourceSlice", "resourceslices");
        Api::all_with(self.inner.versions.client().clone(), &resource)
    }

    /// Reconciles, starting over after write conflicts, and records the outcome in
    /// [`SlicePublisher::status`].
    async fn reconcile(&self, state: &mut State) -> Result<PublishReport, PublishError> {
        let result = self.reconcile_with_retries(state).await;
        self.inner.in_sync.store(result.is_ok(), Ordering::Relaxed);
        if result.is_err() {
            self.inner.failures.fetch_add(1, Ordering::Relaxed);
        }
        result
    }

    async fn reconcile_with_retries(
        &self,
        state: &mut State,
    ) -> Result<PublishReport, PublishError> {
        for _ in 0..CONFLICT_RETRIES {
            match self.reconcile_once(state).await {
                Err(Conflict) => continue,
                Ok(result) => return result,
            }
        }
        Err(PublishError::Conflict {
            node: self.inner.config.node_name.clone(),
            attempts: CONFLICT_RETRIES,
        })
    }

    async fn reconcile_once(
        &self,
        state: &mut State,
    ) -> Result<Result<PublishReport, PublishError>, Conflict> {
        let Some(devices) = state.desired.clone() else {
            return Ok(Ok(PublishReport::default()));
        };
        let version = match self.inner.versions.get().await {
            Ok(version) => version,
            Err(error) => return Ok(Err(PublishError::Discovery(error))),
        };
        if state.version != Some(version) {
            state.version = Some(version);
            state.dropped.clear();
        }
        state.written.clear();
        let mut pass = SyncPass {
            publisher: self,
            api: self.api(version),
            version,
            state,
            report: PublishReport::default(),
        };
        match pass.run(devices).await {
            Ok(()) => Ok(Ok(pass.report)),
            Err(Failure::Conflict) => Err(Conflict),
            Err(Failure::Error(error)) => Ok(Err(error)),
        }
    }

    async fn node(&self) -> Result<NodeFacts, Failure> {
        let config = &self.inner.config;
        let nodes: Api<Node> = Api::all(self.inner.versions.client().clone());
        let node = self
            .call("reading the node (owner of its resource slices)", || {
                nodes.get(&config.node_name)
            })
            .await?;
        let declared = node.status.and_then(|s| s.declared_features);
        Ok(NodeFacts {
            uid: node.metadata.uid.unwrap_or_default(),
            declares_node_allocatable: declared
                .iter()
                .flatten()
                .any(|f| f == NODE_ALLOCATABLE_FEATURE),
        })
    }

    /// One API request with the configured timeouts and retries; 409 is a conflict.
    async fn call<T, Fut>(&self, action: &str, request: impl Fn() -> Fut) -> Result<T, Failure>
    where
        Fut: std::future::Future<Output = Result<T, ::kube::Error>>,
    {
        let result = self
            .inner
            .config
            .retry
            .run(|| async {
                request().await.map_err(|e| {
                    if is_path_not_served(&e) {
                        self.inner.versions.forget();
                    }
                    AttemptError::from_kube(e)
                })
            })
            .await;
        result.map_err(|source| match source.last {
            AttemptError::Api { code: 409, .. } => Failure::Conflict,
            _ => Failure::Error(PublishError::Api {
                action: action.to_owned(),
                node: self.inner.config.node_name.clone(),
                source,
            }),
        })
    }
}

impl DevicePublisher for SlicePublisher {
    fn publish(&self, devices: Vec<Device>) -> BoxFuture<'_, Result<PublishReport, PublishError>> {
        Box::pin(self.publish_devices(devices))
    }
}

/// A write conflict: the reconciliation starts over.
struct Conflict;

enum Failure {
    Conflict,
    Error(PublishError),
}

#[derive(Debug, Clone, Copy)]
struct Restart {
    version_gone: bool,
}

/// One pass of syncing the pool's slices with the wanted devices: the publisher's [`State`] it
/// reads and updates, and its report of what it did.
struct SyncPass<'a> {
    publisher: &'a SlicePublisher,
    api: Api<DynamicObject>,
    version: ResourceApiVersion,
    state: &'a mut State,
    report: PublishReport,
}

impl SyncPass<'_> {
    fn config(&self) -> &PublisherConfig {
        &self.publisher.inner.config
    }

    /// Makes the pool hold `devices`, with their node-allocatable mapping unless the API server
    /// refuses it (see the module docs).
    async fn run(&mut self, devices: Vec<wire::Device>) -> Result<(), Failure> {
        let lists = list_attributes(&devices);
        if lists.is_empty() || self.state.lists_refused {
            return self.run_mapped(without_lists(devices)).await;
        }
        match self.run_mapped(devices.clone()).await {
            Err(Failure::Error(error)) if is_valueless_attribute_refusal(&error) => {
                self.lists_refused(&lists, &error);
                self.run_mapped(without_lists(devices)).await
            }
            result => result,
        }
    }

    /// Records that the API server refuses list attributes: a warning naming them and the
    /// gate, and each as a dropped field.
    fn lists_refused(&mut self, lists: &BTreeSet<String>, error: &PublishError) {
        self.state.lists_refused = true;
        self.publisher.tell(Notice::PublicationDegraded {
            message: format!(
                "ResourceSlices published without the list-valued attributes {}: the API \
                     server refuses them (its {LIST_ATTRIBUTES_GATE} feature gate is off)",
                lists.iter().cloned().collect::<Vec<_>>().join(", ")
            ),
        });
        tracing::warn!(
            attributes = ?lists,
            gate = LIST_ATTRIBUTES_GATE,
            refusal = %chain(error),
            "the api server refuses list-valued device attributes: the {LIST_ATTRIBUTES_GATE} \
             feature gate is off on it (alpha, Kubernetes 1.36 and later); publishing the \
             resource slices without them (turn the gate on for the api server and the \
             scheduler, or expose-pcie-roots off; see docs/kubernetes.md)"
        );
        for name in lists {
            let field = FieldPath(vec![
                Step::Key("devices".into()),
                Step::Each,
                Step::Key("attributes".into()),
                Step::Key(name.clone()),
                Step::Key("strings".into()),
            ])
            .to_string();
            self.report.dropped_fields.push(field.clone());
            self.publisher
                .inner
                .dropped
                .send_if_modified(|all| all.insert(field));
        }
    }

    /// [`Self::run`] for devices whose list attributes are settled.
    async fn run_mapped(&mut self, devices: Vec<wire::Device>) -> Result<(), Failure> {
        let node = self.publisher.node().await?;
        let maps = self.config().node_allocatable_cpu.is_some();
        if !maps || !self.mapping_refused(&node) {
            match self.apply(devices.clone(), &node.uid).await {
                Err(Failure::Error(error)) if maps => match node_allocatable_refusal(&error) {
                    Some(message) => self.refused(&node, message),
                    None => return Err(Failure::Error(error)),
                },
                result => {
                    if maps && result.is_ok() {
                        self.accepted();
                    }
                    return result;
                }
            }
        }
        let unmapped = devices
            .into_iter()
            .map(|device| wire::Device {
                node_allocatable_resource_mappings: None,
                ..device
            })
            .collect();
        self.apply(unmapped, &node.uid).await
    }

    /// Whether the mapping stays out of this reconciliation: it was refused, the Node has not
    /// come to declare the feature since, and it is not time to try again.
    fn mapping_refused(&self, node: &NodeFacts) -> bool {
        let Some(refusal) = &self.state.refusal else {
            return false;
        };
        let newly_declared = node.declares_node_allocatable && !refusal.declared;
        let due = Instant::now() >= refusal.at + self.config().node_allocatable_retry;
        !(newly_declared || due)
    }

    /// Records the API server's refusal of the mapping; warns when it is news.
    fn refused(&mut self, node: &NodeFacts, message: &str) {
        let retry = self.config().node_allocatable_retry;
        if self.state.refusal.is_none() {
            tracing::warn!(
                node = %self.config().node_name,
                refusal = %message,
                node_declares_feature = node.declares_node_allocatable,
                retry_in = ?retry,
                "the api server refuses the node-allocatable mapping for this node (its kubelet \
                 does not declare DRANodeAllocatableResources): publishing the resource slices \
                 without it, so pods must request their claimed CPUs in resources.requests \
                 (see docs/deploy.md)"
            );
            self.publisher.tell(Notice::PublicationDegraded {
                message: format!(
                    "ResourceSlices published without the node-allocatable mapping: the API \
                         server refuses it ({message}); claim pods must request their claimed \
                         CPUs and memory in resources.requests until the kubelet declares \
                         DRANodeAllocatableResources"
                ),
            });
        } else {
            tracing::debug!(refusal = %message, retry_in = ?retry, "the node-allocatable mapping is still refused");
        }
        let now = Instant::now();
        self.state.refusal = Some(Refusal {
            at: now,
            declared: node.declares_node_allocatable,
        });
        self.publisher
            .inner
            .mapping_retry_at
            .send_replace(Some(now + retry));
    }

    /// The mapping went through: forget an earlier refusal.
    fn accepted(&mut self) {
        if self.state.refusal.take().is_some() {
            tracing::info!(
                node = %self.config().node_name,
                "the api server now accepts the node-allocatable mapping: published the resource slices with it"
            );
            self.publisher.inner.mapping_retry_at.send_replace(None);
        }
    }

    /// Makes the pool hold exactly `devices`.
    async fn apply(&mut self, devices: Vec<wire::Device>, node_uid: &str) -> Result<(), Failure> {
        let chunks = build::chunk(devices);
        let count = chunks.len();
        self.report.slices = count;
        let mut existing = self.list(node_uid).await?;
        existing.sort_by(|a, b| a.name.cmp(&b.name));
        let keys: Vec<Value> = chunks
            .iter()
            .map(|chunk| self.key(count, chunk.clone()))
            .collect();

        // Which wanted chunks already exist, as ours, unchanged.
        let mut missing: Vec<usize> = (0..count).collect();
        let mut mismatched = 0;
        for slice in &existing {
            let found = missing
                .iter()
                .position(|i| slice.ours && slice.key.as_ref() == Some(&keys[*i]));
            match found {
                Some(position) => {
                    missing.remove(position);
                }
                None => mismatched += 1,
            }
        }
        let generations: BTreeSet<i64> = existing.iter().map(|s| s.generation).collect();
        let highest = generations
            .last()
            .copied()
            .unwrap_or(0)
            .max(self.state.generation);
        self.state.generation = highest;
        if mismatched == 0 && generations.len() == 1 {
            // Unchanged; maybe some were deleted, and the rest still describe a complete pool.
            self.report.generation = highest;
            for i in missing {
                self.create(highest, count, chunks[i].clone(), node_uid)
                    .await?;
            }
            return Ok(());
        }

        let generation = highest + 1;
        self.report.generation = generation;
        let (keep, surplus) = existing.split_at(existing.len().min(count));
        for slice in surplus {
            self.delete(slice).await?;
        }
        let mut chunks = chunks.into_iter();
        for (slice, chunk) in keep.iter().zip(chunks.by_ref()) {
            self.update(slice, generation, count, chunk, node_uid)
                .await?;
        }
        for chunk in chunks {
            self.create(generation, count, chunk, node_uid).await?;
        }
        self.state.generation = generation;
        Ok(())
    }

    /// What a slice holding `chunk` must compare equal to.
    fn key(&self, count: usize, chunk: Vec<wire::Device>) -> Value {
        let spec = build::slice_spec(self.config(), 0, count, chunk);
        comparable(self.version, &spec, &self.state.dropped)
    }

    async fn list(&self, node_uid: &str) -> Result<Vec<Existing>, Failure> {
        let params = ListParams::default().fields(&build::field_selector(self.config()));
        let list = self
            .publisher
            .call("listing resource slices", || self.api.list(&params))
            .await?;
        Ok(list
            .items
            .into_iter()
            .map(|slice| self.existing(slice, node_uid))
            .collect())
    }

    fn existing(&self, slice: DynamicObject, node_uid: &str) -> Existing {
        let spec = slice
            .data
            .get("spec")
            .cloned()
            .and_then(|spec| from_wire(self.version, spec).ok());
        let generation = spec.as_ref().map_or(0, |s| s.pool.generation);
        let key = spec.map(|mut spec| {
            spec.pool.generation = 0;
            comparable(self.version, &spec, &self.state.dropped)
        });
        let labels = slice.metadata.labels.unwrap_or_default();
        let owned = slice.metadata.owner_references.unwrap_or_default()
            == [build::node_owner(&self.config().node_name, node_uid)];
        Existing {
            name: slice.metadata.name.unwrap_or_default(),
            resource_version: slice.metadata.resource_version,
            ours: owned && labels.get(MANAGED_BY_LABEL).map(String::as_str) == Some(MANAGED_BY),
            labels,
            generation,
            key,
        }
    }

    async fn create(
        &mut self,
        generation: i64,
        count: usize,
        chunk: Vec<wire::Device>,
        node_uid: &str,
    ) -> Result<(), Failure> {
        let metadata = new_slice_metadata(self.config(), node_uid);
        let (object, sent) = slice_object(
            self.config(),
            self.version,
            metadata,
            generation,
            count,
            chunk,
        );
        let params = PostParams::default();
        let stored = self
            .publisher
            .call("creating a resource slice", || {
                self.api.create(&params, &object)
            })
            .await?;
        self.report.created += 1;
        self.written(&sent, stored);
        Ok(())
    }

    async fn update(
        &mut self,
        slice: &Existing,
        generation: i64,
        count: usize,
        chunk: Vec<wire::Device>,
        node_uid: &str,
    ) -> Result<(), Failure> {
        let metadata = ObjectMeta {
            name: Some(slice.name.clone()),
            resource_version: slice.resource_version.clone(),
            ..slice_metadata(self.config(), slice.labels.clone(), node_uid)
        };
        let (object, sent) = slice_object(
            self.config(),
            self.version,
            metadata,
            generation,
            count,
            chunk,
        );
        let params = PostParams::default();
        let action = format!("updating resource slice {}", slice.name);
        let stored = self
            .publisher
            .call(&action, || self.api.replace(&slice.name, &params, &object))
            .await?;
        self.report.updated += 1;
        self.written(&sent, stored);
        Ok(())
    }

    async fn delete(&mut self, slice: &Existing) -> Result<(), Failure> {
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                resource_version: slice.resource_version.clone(),
                uid: None,
            }),
            ..Default::default()
        };
        let action = format!("deleting resource slice {}", slice.name);
        let result = self
            .publisher
            .call(&action, || async {
                match self.api.delete(&slice.name, &params).await {
                    // Already gone is what we wanted.
                    Err(::kube::Error::Api(status))
                        if status.code == 404
                            && !status.details.as_ref().is_none_or(|d| d.name.is_empty()) =>
                    {
                        Ok(())
                    }
                    other => other.map(|_| ()),
                }
            })
            .await;
        result?;
        self.report.deleted += 1;
        Ok(())
    }

    /// Remembers our write and what the API server dropped from it.
    fn written(&mut self, sent: &Value, stored: DynamicObject) {
        if let Some(rv) = stored.metadata.resource_version {
            self.state.written.insert(rv);
        }
        let stored_spec = stored.data.get("spec").cloned().unwrap_or(Value::Null);
        let dropped = dropped_fields(sent, &stored_spec);
        let superseded = allocatable::superseded(&dropped);
        for field in dropped {
            if !self.state.dropped.insert(field.clone()) {
                continue;
            }
            if superseded.contains(&field) {
                tracing::debug!(
                    field = %field,
                    api_version = %self.version,
                    "the api server keeps the other form of the node-allocatable mapping, the one its release knows"
                );
            } else {
                tracing::warn!(
                    field = %field,
                    api_version = %self.version,
                    "the api server dropped a field of our resource slices: its feature gate is off (see docs/kubernetes.md)"
                );
                self.report.dropped_fields.push(field.to_string());
                self.publisher
                    .inner
                    .dropped
                    .send_if_modified(|all| all.insert(field.to_string()));
            }
        }
    }
}

/// The names of the list-valued attributes of `devices`.
fn list_attributes(devices: &[wire::Device]) -> BTreeSet<String> {
    devices
        .iter()
        .flat_map(|d| d.attributes.iter().flatten())
        .filter(|(_, v)| {
            v.strings.is_some() || v.ints.is_some() || v.bools.is_some() || v.versions.is_some()
        })
        .map(|(name, _)| name.clone())
        .collect()
}

/// `devices` without their list-valued attributes.
fn without_lists(mut devices: Vec<wire::Device>) -> Vec<wire::Device> {
    let lists = list_attributes(&devices);
    for device in &mut devices {
        if let Some(attributes) = &mut device.attributes {
            attributes.retain(|name, _| !lists.contains(name));
            if attributes.is_empty() {
                device.attributes = None;
            }
        }
    }
    devices
}

/// Whether `error` is the API server's refusal of an attribute left without a value: what a
/// list attribute becomes when `DRAListTypeAttributes` is off (or the release does not know
/// the field), its value dropped before validation. 1.36 says `exactly one value must be
/// specified`; 1.37, whose declarative validation of the attribute union answers instead,
/// `must specify one of: ` and the union's fields. Both name the attribute's path.
fn is_valueless_attribute_refusal(error: &PublishError) -> bool {
    matches!(
        error,
        PublishError::Api {
            source: RetryError {
                last: AttemptError::Api { code: 422, message, .. },
                ..
            },
            ..
        } if message.contains(".attributes[")
            && (message.contains("exactly one value must be specified")
                || message.contains("must specify one of: "))
    )
}

/// The API server's message, when `error` is its refusal of the node-allocatable mapping: a 403
/// naming the feature (1.37's NodeDeclaredFeatureValidator says `node "…" does not support
/// DRANodeAllocatableResources feature`). Other 403s (RBAC) are not.
fn node_allocatable_refusal(error: &PublishError) -> Option<&str> {
    match error {
        PublishError::Api {
            source:
                RetryError {
                    last:
                        AttemptError::Api {
                            code: 403, message, ..
                        },
                    ..
                },
            ..
        } if message.contains(NODE_ALLOCATABLE_FEATURE) => Some(message),
        _ => None,
    }
}

/// The devices as v1 wire devices, validated first: what every publication sends.
fn wire_devices(
    config: &PublisherConfig,
    devices: &[Device],
) -> Result<Vec<wire::Device>, DeviceValidationError> {
    validate_devices(&config.driver, devices)?;
    Ok(devices
        .iter()
        .map(|d| build::wire_device(config, d))
        .collect())
}

/// The slices the publisher creates for `devices` in a pool the API server has none of (a new
/// node): every chunk at generation 1, as `version` writes it, owned by the node with
/// `node_uid`, or by no one when it is `None` (whoever prints them does not know the uid). The
/// objects are JSON, the way they go over the wire; the API server fills in each one's name from
/// its `generateName`.
pub fn first_publication(
    config: &PublisherConfig,
    version: ResourceApiVersion,
    node_uid: Option<&str>,
    devices: &[Device],
) -> Result<Vec<Value>, DeviceValidationError> {
    let chunks = build::chunk(wire_devices(config, devices)?);
    let count = chunks.len();
    Ok(chunks
        .into_iter()
        .map(|chunk| {
            let mut metadata = new_slice_metadata(config, node_uid.unwrap_or_default());
            if node_uid.is_none() {
                metadata.owner_references = None;
            }
            let (object, _) = slice_object(config, version, metadata, 1, count, chunk);
            // A DynamicObject is a map of strings and numbers: it always converts.
            serde_json::to_value(object).unwrap_or(Value::Null)
        })
        .collect())
}

/// A slice object holding `chunk`, and its spec as sent.
fn slice_object(
    config: &PublisherConfig,
    version: ResourceApiVersion,
    metadata: ObjectMeta,
    generation: i64,
    count: usize,
    chunk: Vec<wire::Device>,
) -> (DynamicObject, Value) {
    let spec = to_wire(
        version,
        &build::slice_spec(config, generation, count, chunk),
    );
    let object = DynamicObject {
        types: Some(TypeMeta {
            api_version: version.api_version().to_owned(),
            kind: "ResourceSlice".to_owned(),
        }),
        metadata,
        data: serde_json::json!({ "spec": spec }),
    };
    (object, spec)
}

/// The metadata of a slice we create: a generated name, our label, the node as owner.
fn new_slice_metadata(config: &PublisherConfig, node_uid: &str) -> ObjectMeta {
    ObjectMeta {
        generate_name: Some(build::generate_name(config)),
        ..slice_metadata(config, BTreeMap::new(), node_uid)
    }
}

/// `labels` with ours, and the node as owner.
fn slice_metadata(
    config: &PublisherConfig,
    mut labels: BTreeMap<String, String>,
    node_uid: &str,
) -> ObjectMeta {
    labels.insert(MANAGED_BY_LABEL.to_owned(), MANAGED_BY.to_owned());
    ObjectMeta {
        labels: Some(labels),
        owner_references: Some(vec![build::node_owner(&config.node_name, node_uid)]),
        ..Default::default()
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refusal(code: u16, message: &str) -> PublishError {
        PublishError::Api {
            action: "creating a resource slice".into(),
            node: "worker-a".into(),
            source: RetryError {
                attempts: 1,
                last: AttemptError::Api {
                    code,
                    reason: "Invalid".into(),
                    message: message.into(),
                },
            },
        }
    }

    #[test]
    fn a_valueless_attribute_is_recognized_in_each_releases_words() {
        // As the real API servers answer with DRAListTypeAttributes off.
        let v136 = "ResourceSlice.resource.k8s.io \"n-d-x\" is invalid: spec.devices[0].attributes[resource.kubernetes.io/pcieRoot]: Invalid value: \"\": exactly one value must be specified";
        let v137 = "ResourceSlice.resource.k8s.io \"n-d-x\" is invalid: [spec.devices[0].attributes[resource.kubernetes.io/pcieRoot]: Invalid value: \"\": must specify one of: `int`, `bool`, `string`, `version`, `ints`, `bools`, `strings`, `versions`]";
        assert!(is_valueless_attribute_refusal(&refusal(422, v136)));
        assert!(is_valueless_attribute_refusal(&refusal(422, v137)));
        // Another union of the slice, another code: not the lists' refusal.
        assert!(!is_valueless_attribute_refusal(&refusal(
            422,
            "spec.devices[0].capacity[cpu].requestPolicy.validRange: Invalid value: \"\": must specify one of: `default`"
        )));
        assert!(!is_valueless_attribute_refusal(&refusal(403, v137)));
    }
}
