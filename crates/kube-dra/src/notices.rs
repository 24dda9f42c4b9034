//! Kubernetes Events for what a user must see without reading the agent's log: a container the
//! agent refused at CreateContainer (an Event on its pod), a claim that failed to prepare and a
//! claim whose device was tainted (on the claim, and on each pod it is reserved for), so that
//! `kubectl describe pod` and `kubectl describe resourceclaim` say why.
//!
//! [`EventRecorder`] is what the driver (the resource manager) sees: it takes a [`Notice`], in
//! domain terms, and never blocks or fails, because its callers are an NRI handler (the runtime
//! waits for our answer, holding its own locks) and the claim lifecycle. [`KubeEvents`] puts
//! notices on a bounded queue and returns; a task of its own posts them. When the queue is full
//! (the API server slow or gone) a notice is dropped and counted ([`EventStats::queue_full`]),
//! never waited for. Without DRA the agent talks to no API server and records with [`NoEvents`].
//!
//! Events are `events.k8s.io/v1` (RBAC: `create` and `patch` on `events.k8s.io` `events`, nothing
//! else), posted with kube-rs's [`Recorder`]: the first occurrence creates an Event, a repeat
//! within six minutes patches its series count, so `kubectl describe` shows one line `(x5 over
//! 2m)` instead of five. Around it, the filters of client-go's recorder (the one the kubelet
//! uses), in its order:
//!
//! - **Distinct messages stay distinct.** kube-rs keys a repeat on object, reason and action, not
//!   on the message, so a claim that failed first because it was not allocated and then because
//!   it does not fit would show the first reason, counted twice. One recorder per message (a
//!   client handle and a small cache) makes a new message a new Event, as client-go's recorder
//!   keys on the message too.
//! - **Similar messages are combined**: once an object has had [`EventsConfig::similar_max`]
//!   distinct messages for the same reason, each within [`EventsConfig::similar_window`] of the
//!   last, further ones become one series whose note starts `(combined from similar events): `
//!   (client-go's aggregator: 10 within 10 minutes), so messages that differ in a number cannot
//!   create an Event each.
//! - **Rate limiting per object** (client-go's spam filter): a token bucket per regarding object,
//!   25 at once and one more every five minutes, so a pod refused in a tight retry loop cannot
//!   flood the API server.
//!
//! The clock these three read is [`EventsConfig::clock`], so tests drive the windows and the
//! buckets without waiting. The pods of a failed claim come from the claim's
//! `status.reservedFor` (one GET, only once the claim's own Event got past the rate limit): the
//! kubelet names only the claim.

use std::{
    collections::{HashMap, HashSet},
    fmt,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use ::kube::{
    Api,
    api::DynamicObject,
    runtime::events::{Event, EventType, Recorder, Reporter},
};
use k8s_openapi::api::core::v1::ObjectReference;
use kubelet_plugin::ClaimRef;
use tokio::sync::{mpsc, watch};

use super::version::ResourceApiVersions;

/// A pod, as events name it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PodRef {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// UID.
    pub uid: String,
}

/// Something a user must be told, in domain terms.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Notice {
    /// The runtime asked to create a container and the agent refused it: the container does not
    /// start.
    ContainerRefused {
        /// The container's pod.
        pod: PodRef,
        /// The container's name.
        container: String,
        /// Why, as the agent logged it.
        message: String,
    },
    /// A claim the kubelet asked for failed to prepare: its pods do not start until it does.
    ClaimNotPrepared {
        /// The claim.
        claim: ClaimRef,
        /// Why, as the agent logged it.
        message: String,
    },
    /// A device a prepared claim holds was tainted (resmgr's `taints`: CPUs behind it went
    /// offline, its NUMA node lost its memory): the claim keeps it, and its pods should know.
    /// On the claim and each pod it is reserved for.
    DeviceTainted {
        /// The claim.
        claim: ClaimRef,
        /// Which device and why.
        message: String,
    },
    /// Reconciling the node's CDI specs and held claims did something an operator must hear of
    /// (resmgr's `reconcile`): an Event on the Node.
    ClaimReconciled {
        /// What was done, as the agent logged it.
        message: String,
    },
    /// The API server makes the node's ResourceSlices be published without something the
    /// agent's settings ask for (the node-allocatable mapping, list attributes): an Event on the
    /// Node.
    PublicationDegraded {
        /// What is left out and why.
        message: String,
    },
}

impl Notice {
    /// The Event's reason, short and stable: what `kubectl get events --field-selector` filters on.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::ContainerRefused { .. } => "ContainerRefused",
            Self::ClaimNotPrepared { .. } => "ClaimNotPrepared",
            Self::DeviceTainted { .. } => "DeviceTainted",
            Self::ClaimReconciled { .. } => "ClaimReconciled",
            Self::PublicationDegraded { .. } => "PublicationDegraded",
        }
    }

    /// The Event's action: what the agent was asked to do.
    pub fn action(&self) -> &'static str {
        match self {
            Self::ContainerRefused { .. } => "CreateContainer",
            Self::ClaimNotPrepared { .. } => "PrepareResources",
            Self::DeviceTainted { .. } => "PublishResourceSlices",
            Self::ClaimReconciled { .. } => "Reconcile",
            Self::PublicationDegraded { .. } => "PublishResourceSlices",
        }
    }

    /// The Event's message (before any combining), at most what the API server takes.
    pub fn message(&self) -> String {
        let text = match self {
            Self::ContainerRefused {
                container, message, ..
            } => format!("container {container} refused: {message}"),
            // The lifecycle's message names the claim, the step and the cause.
            Self::ClaimNotPrepared { message, .. }
            | Self::DeviceTainted { message, .. }
            | Self::ClaimReconciled { message }
            | Self::PublicationDegraded { message } => message.clone(),
        };
        truncate(text, MAX_NOTE)
    }
}

/// The API server refuses notes longer than this many bytes.
const MAX_NOTE: usize = 1024;

/// What a combined Event's note starts with (client-go's words, which users know).
const COMBINED: &str = "(combined from similar events): ";

/// `text` cut to at most `max` bytes at a character boundary, ending in `…` when cut.
fn truncate(mut text: String, max: usize) -> String {
    if text.len() <= max {
        return text;
    }
    let mut end = max - '…'.len_utf8();
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.truncate(end);
    text.push('…');
    text
}

/// Takes notices. Never blocks and never fails: a notice that cannot be posted is dropped, and
/// counted where the implementation can.
pub trait EventRecorder: Send + Sync + fmt::Debug {
    /// Records `notice` for posting.
    fn record(&self, notice: Notice);
}

/// Records nothing: the agent without DRA (no API server), and tests that do not look.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoEvents;

impl EventRecorder for NoEvents {
    fn record(&self, _notice: Notice) {}
}

/// Where [`KubeEvents`] reads the time, for its rate limits and windows.
pub trait Clock: Send + Sync + fmt::Debug {
    /// Now, monotonic.
    fn now(&self) -> Instant;
}

/// The process's monotonic clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct MonotonicClock;

impl Clock for MonotonicClock {
    fn now(&self) -> Instant {
        Instant::now()
    }
}

/// What happened to notices, since the start. Each notice becomes one Event (a container's) or
/// several (a claim's: the claim and its pods); the counts are of Events.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EventStats {
    /// Events created or (a repeat) patched.
    pub posted: u64,
    /// Events dropped because their object had used up its rate limit.
    pub rate_limited: u64,
    /// Notices dropped because the queue was full.
    pub queue_full: u64,
    /// Events the API server refused or did not answer in time.
    pub failed: u64,
}

/// Settings of [`KubeEvents`].
#[derive(Debug, Clone)]
pub struct EventsConfig {
    /// The reporting controller, a qualified name: the agent's DRA driver name.
    pub controller: String,
    /// The reporting instance: the node's name.
    pub instance: String,
    /// Notices waiting to be posted; more are dropped.
    pub queue: usize,
    /// Events one object may get at once.
    pub burst: u32,
    /// After the burst, one more Event per object each this often.
    pub refill: Duration,
    /// How long a repeat is still the same Event (kube-rs's series window is six minutes).
    pub repeat_window: Duration,
    /// Distinct messages of one object and reason before they are combined.
    pub similar_max: usize,
    /// How long after the last one a message still counts towards [`Self::similar_max`].
    pub similar_window: Duration,
    /// How long one API request may take before the Event is given up.
    pub post_timeout: Duration,
    /// The clock of the rate limits and windows.
    pub clock: Arc<dyn Clock>,
}

impl EventsConfig {
    /// client-go's defaults: 25 Events per object at once and one more every five minutes;
    /// messages combined after 10 distinct ones within 10 minutes.
    pub fn new(controller: impl Into<String>, instance: impl Into<String>) -> Self {
        Self {
            controller: controller.into(),
            // The API server takes at most 128 characters.
            instance: truncate(instance.into(), 128),
            queue: 256,
            burst: 25,
            refill: Duration::from_secs(300),
            repeat_window: Duration::from_secs(360),
            similar_max: 10,
            similar_window: Duration::from_secs(600),
            post_timeout: Duration::from_secs(10),
            clock: Arc::new(MonotonicClock),
        }
    }
}

#[derive(Debug, Default)]
struct Counters {
    posted: AtomicU64,
    rate_limited: AtomicU64,
    queue_full: AtomicU64,
    failed: AtomicU64,
    /// Bumped after every change of the counts, for [`KubeEvents::wait_for`].
    changed: watch::Sender<()>,
}

impl Counters {
    fn add(&self, counter: impl Fn(&Self) -> &AtomicU64) {
        counter(self).fetch_add(1, Ordering::Relaxed);
        self.changed.send_replace(());
    }
}

/// Posts notices to the API server as Events, from a task of its own. Cheap to clone.
#[derive(Debug, Clone)]
pub struct KubeEvents {
    queue: mpsc::Sender<Notice>,
    counters: Arc<Counters>,
}

impl KubeEvents {
    /// Starts the posting task (on the current tokio runtime); it ends when every clone of the
    /// returned recorder is dropped.
    pub fn start(versions: Arc<ResourceApiVersions>, config: EventsConfig) -> Self {
        let (events, poster) = Self::new(versions, config);
        tokio::spawn(poster);
        events
    }

    /// The recorder, and the poster for the caller to run; the poster ends when every clone of
    /// the recorder is dropped.
    pub fn new(
        versions: Arc<ResourceApiVersions>,
        config: EventsConfig,
    ) -> (Self, impl std::future::Future<Output = ()> + Send + 'static) {
        let (queue, notices) = mpsc::channel(config.queue.max(1));
        let counters = Arc::new(Counters::default());
        let poster = Poster {
            versions,
            reporter: Reporter {
                controller: config.controller.clone(),
                instance: Some(config.instance.clone()),
            },
            limiter: RateLimiter::new(config.burst, config.refill),
            similar: Similar::new(config.similar_max, config.similar_window),
            recorders: HashMap::new(),
            config,
            counters: counters.clone(),
            failing: false,
        };
        (Self { queue, counters }, poster.run(notices))
    }

    /// What happened to notices so far.
    pub fn stats(&self) -> EventStats {
        let c = &self.counters;
        EventStats {
            posted: c.posted.load(Ordering::Relaxed),
            rate_limited: c.rate_limited.load(Ordering::Relaxed),
            queue_full: c.queue_full.load(Ordering::Relaxed),
            failed: c.failed.load(Ordering::Relaxed),
        }
    }

    /// Waits until the stats satisfy `condition`, woken by every change (an Event posted or
    /// dropped), and returns them.
    pub async fn wait_for(&self, condition: impl Fn(&EventStats) -> bool) -> EventStats {
        let mut changed = self.counters.changed.subscribe();
        loop {
            let stats = self.stats();
            if condition(&stats) {
                return stats;
            }
            // The sender lives in `self`: it cannot be dropped while we wait.
            let _ = changed.changed().await;
        }
    }
}

impl EventRecorder for KubeEvents {
    fn record(&self, notice: Notice) {
        if self.queue.try_send(notice).is_err() {
            self.counters.add(|c| &c.queue_full);
        }
    }
}

// === the filters, pure functions of the time they are given ===

/// A token bucket per object.
#[derive(Debug)]
struct RateLimiter {
    burst: f64,
    /// Tokens per second.
    rate: f64,
    buckets: HashMap<String, (f64, Instant)>,
}

impl RateLimiter {
    fn new(burst: u32, refill: Duration) -> Self {
        Self {
            burst: f64::from(burst),
            rate: 1.0 / refill.as_secs_f64().max(f64::MIN_POSITIVE),
            buckets: HashMap::new(),
        }
    }

    fn refilled(&self, (tokens, at): (f64, Instant), now: Instant) -> f64 {
        (tokens + now.saturating_duration_since(at).as_secs_f64() * self.rate).min(self.burst)
    }

    /// Takes a token of `object`'s at `now` if it has one.
    fn allow(&mut self, object: &str, now: Instant) -> bool {
        let tokens = self
            .buckets
            .get(object)
            .map_or(self.burst, |b| self.refilled(*b, now));
        let allowed = tokens >= 1.0;
        let left = if allowed { tokens - 1.0 } else { tokens };
        self.buckets.insert(object.to_owned(), (left, now));
        allowed
    }

    /// Forgets the objects whose buckets are full again: they hold nothing a new bucket would
    /// not, so the map holds only objects that had Events lately.
    fn forget(&mut self, now: Instant) {
        let full: Vec<String> = self
            .buckets
            .iter()
            .filter(|(_, b)| self.refilled(**b, now) >= self.burst)
            .map(|(k, _)| k.clone())
            .collect();
        for k in full {
            self.buckets.remove(&k);
        }
    }
}

/// The distinct messages each (object, reason) had lately, to combine similar ones.
#[derive(Debug)]
struct Similar {
    max: usize,
    window: Duration,
    seen: HashMap<String, (HashSet<String>, Instant)>,
}

impl Similar {
    fn new(max: usize, window: Duration) -> Self {
        Self {
            max: max.max(1),
            window,
            seen: HashMap::new(),
        }
    }

    /// Notes `message` for `key` at `now`; true if it is to be combined with the others.
    fn combine(&mut self, key: &str, message: &str, now: Instant) -> bool {
        let (messages, last) = self
            .seen
            .entry(key.to_owned())
            .or_insert_with(|| (HashSet::new(), now));
        if now.saturating_duration_since(*last) > self.window {
            messages.clear();
        }
        *last = now;
        // Once there are `max`, every message is combined: no need to keep more.
        if messages.len() < self.max {
            messages.insert(message.to_owned());
        }
        messages.len() >= self.max
    }

    fn forget(&mut self, now: Instant) {
        let window = self.window;
        self.seen
            .retain(|_, (_, last)| now.saturating_duration_since(*last) <= window);
    }
}

// === the posting task ===

/// One Event to post.
struct Posting {
    regarding: ObjectReference,
    related: Option<ObjectReference>,
    note: String,
    /// Which recorder: the same key is the same Event, repeated.
    key: String,
}

/// The posting task.
struct Poster {
    versions: Arc<ResourceApiVersions>,
    reporter: Reporter,
    limiter: RateLimiter,
    similar: Similar,
    /// One recorder per (object, related object, reason, message), with when it was last used.
    recorders: HashMap<String, (Recorder, Instant)>,
    config: EventsConfig,
    counters: Arc<Counters>,
    /// Whether the last Event failed: a failure is logged as a warning once, until one succeeds.
    failing: bool,
}

fn pod_reference(pod: &PodRef) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        namespace: Some(pod.namespace.clone()),
        name: Some(pod.name.clone()),
        uid: Some(pod.uid.clone()),
        ..ObjectReference::default()
    }
}

/// The Node, as the kubelet names it in its Events: the UID is the node's name, which is what
/// `kubectl describe node` looks for.
fn node_reference(node: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Node".into()),
        name: Some(node.to_owned()),
        uid: Some(node.to_owned()),
        ..ObjectReference::default()
    }
}

fn key_of(r: &ObjectReference) -> String {
    format!(
        "{}/{}/{}/{}",
        r.kind.as_deref().unwrap_or_default(),
        r.namespace.as_deref().unwrap_or_default(),
        r.name.as_deref().unwrap_or_default(),
        r.uid.as_deref().unwrap_or_default()
    )
}

impl Poster {
    async fn run(mut self, mut notices: mpsc::Receiver<Notice>) {
        while let Some(notice) = notices.recv().await {
            self.post(&notice).await;
        }
    }

    async fn post(&mut self, notice: &Notice) {
        let now = self.config.clock.now();
        self.forget(now);
        let first = match notice {
            Notice::ContainerRefused { pod, .. } => pod_reference(pod),
            Notice::ClaimNotPrepared { claim, .. } | Notice::DeviceTainted { claim, .. } => {
                self.claim_reference(claim).await
            }
            Notice::ClaimReconciled { .. } | Notice::PublicationDegraded { .. } => {
                node_reference(&self.config.instance)
            }
        };
        let Some(posting) = self.admit(first.clone(), None, notice, now) else {
            return;
        };
        let mut postings = vec![posting];
        if let Notice::ClaimNotPrepared { claim, .. } | Notice::DeviceTainted { claim, .. } = notice
        {
            for pod in self.reserved_pods(claim).await {
                postings.extend(self.admit(pod_reference(&pod), Some(first.clone()), notice, now));
            }
        }
        for posting in postings {
            self.publish(notice, posting, now).await;
        }
    }

    /// The filters: combines similar messages, then takes a token of the object's. `None` when
    /// the object has none left.
    fn admit(
        &mut self,
        regarding: ObjectReference,
        related: Option<ObjectReference>,
        notice: &Notice,
        now: Instant,
    ) -> Option<Posting> {
        let object = key_of(&regarding);
        let similar = format!(
            "{object}\n{}\n{}",
            related.as_ref().map(key_of).unwrap_or_default(),
            notice.reason()
        );
        let message = notice.message();
        let (note, key) = if self.similar.combine(&similar, &message, now) {
            (
                truncate(format!("{COMBINED}{message}"), MAX_NOTE),
                format!("{similar}\n{COMBINED}"),
            )
        } else {
            let key = format!("{similar}\n{message}");
            (message, key)
        };
        if !self.limiter.allow(&object, now) {
            self.counters.add(|c| &c.rate_limited);
            return None;
        }
        Some(Posting {
            regarding,
            related,
            note,
            key,
        })
    }

    fn forget(&mut self, now: Instant) {
        let window = self.config.repeat_window;
        self.recorders
            .retain(|_, (_, used)| now.saturating_duration_since(*used) < window);
        self.limiter.forget(now);
        self.similar.forget(now);
    }

    async fn publish(&mut self, notice: &Notice, posting: Posting, now: Instant) {
        let event = Event {
            type_: EventType::Warning,
            reason: notice.reason().to_owned(),
            note: Some(posting.note),
            action: notice.action().to_owned(),
            secondary: posting.related,
        };
        let (client, reporter) = (self.versions.client(), &self.reporter);
        let entry = self
            .recorders
            .entry(posting.key)
            .or_insert_with(|| (Recorder::new(client.clone(), reporter.clone()), now));
        entry.1 = now;
        let recorder = entry.0.clone();
        let result = tokio::time::timeout(
            self.config.post_timeout,
            recorder.publish(&event, &posting.regarding),
        )
        .await;
        let error = match result {
            Ok(Ok(())) => {
                self.counters.add(|c| &c.posted);
                self.failing = false;
                return;
            }
            Ok(Err(e)) => e.to_string(),
            Err(_) => format!("no answer within {:?}", self.config.post_timeout),
        };
        self.counters.add(|c| &c.failed);
        let object = key_of(&posting.regarding);
        if std::mem::replace(&mut self.failing, true) {
            tracing::debug!(%error, %object, reason = notice.reason(), "cannot post an event");
        } else {
            tracing::warn!(%error, %object, reason = notice.reason(), "cannot post an event (further failures are logged at debug level until one succeeds)");
        }
    }

    /// The claim as an object reference, in the `resource.k8s.io` version the server serves.
    async fn claim_reference(&self, claim: &ClaimRef) -> ObjectReference {
        let api_version = match self.versions.get().await {
            Ok(version) => version.api_version().to_owned(),
            Err(_) => "resource.k8s.io/v1".to_owned(),
        };
        ObjectReference {
            api_version: Some(api_version),
            kind: Some("ResourceClaim".into()),
            namespace: Some(claim.namespace.clone()),
            name: Some(claim.name.clone()),
            uid: Some(claim.uid.clone()),
            ..ObjectReference::default()
        }
    }

    /// The pods a claim is reserved for, from its status; none when it cannot be read (the
    /// Event on the claim itself still goes out).
    async fn reserved_pods(&self, claim: &ClaimRef) -> Vec<PodRef> {
        let Ok(version) = self.versions.get().await else {
            return Vec::new();
        };
        let resource = version.resource("ResourceClaim", "resourceclaims");
        let api: Api<DynamicObject> =
            Api::namespaced_with(self.versions.client().clone(), &claim.namespace, &resource);
        let read = tokio::time::timeout(self.config.post_timeout, api.get_opt(&claim.name)).await;
        let object = match read {
            Ok(Ok(Some(object))) => object,
            Ok(Ok(None)) => return Vec::new(),
            Ok(Err(error)) => {
                tracing::debug!(%error, claim = %claim.name, "reading a claim's pods for its events");
                return Vec::new();
            }
            Err(_) => return Vec::new(),
        };
        // Another claim of the same name (the one we were asked about is gone) has other pods.
        if object.metadata.uid.as_deref() != Some(claim.uid.as_str()) {
            return Vec::new();
        }
        reserved_pods(&claim.namespace, &object.data)
    }
}

/// The pods in a claim's `status.reservedFor`: entries of the core group's `pods`.
fn reserved_pods(namespace: &str, claim: &serde_json::Value) -> Vec<PodRef> {
    let Some(entries) = claim["status"]["reservedFor"].as_array() else {
        return Vec::new();
    };
    entries
        .iter()
        .filter(|e| e["apiGroup"].as_str().unwrap_or_default().is_empty())
        .filter(|e| e["resource"] == "pods")
        .filter_map(|e| {
            Some(PodRef {
                namespace: namespace.to_owned(),
                name: e["name"].as_str()?.to_owned(),
                uid: e["uid"].as_str()?.to_owned(),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notes_are_cut_to_what_the_api_server_takes_at_a_character_boundary() {
        let long = "é".repeat(600);
        let cut = truncate(long, MAX_NOTE);
        assert!(cut.len() <= MAX_NOTE && cut.ends_with('…'), "{}", cut.len());
        assert_eq!(truncate("short".into(), MAX_NOTE), "short");
    }

    #[test]
    fn each_object_gets_its_burst_then_one_event_per_refill() {
        let t0 = Instant::now();
        let at = |s| t0 + Duration::from_secs(s);
        let mut limiter = RateLimiter::new(2, Duration::from_secs(300));
        assert!(limiter.allow("a", t0) && limiter.allow("a", t0));
        assert!(!limiter.allow("a", t0), "the burst is spent");
        assert!(limiter.allow("b", t0), "another object has its own bucket");
        assert!(!limiter.allow("a", at(299)));
        assert!(limiter.allow("a", at(301)), "one token came back");
        assert!(!limiter.allow("a", at(301)));
        // Refused attempts do not reset the refill: a token accrues over the 300 s since the
        // last one was taken, however often it was asked for in between.
        assert!(!limiter.allow("a", at(450)));
        assert!(limiter.allow("a", at(602)));
    }

    #[test]
    fn full_buckets_are_forgotten_and_spent_ones_kept() {
        let t0 = Instant::now();
        let mut limiter = RateLimiter::new(1, Duration::from_secs(300));
        assert!(limiter.allow("a", t0));
        limiter.forget(t0 + Duration::from_secs(10));
        assert_eq!(limiter.buckets.len(), 1, "a's bucket is still empty");
        assert!(!limiter.allow("a", t0 + Duration::from_secs(10)));
        limiter.forget(t0 + Duration::from_secs(400));
        assert!(limiter.buckets.is_empty());
    }

    #[test]
    fn distinct_messages_are_combined_from_the_tenth_within_the_window() {
        let t0 = Instant::now();
        let mut similar = Similar::new(10, Duration::from_secs(600));
        for i in 0..9 {
            assert!(!similar.combine("pod", &format!("m{i}"), t0), "m{i}");
        }
        assert!(
            !similar.combine("pod", "m0", t0),
            "a repeat is not a new message"
        );
        assert!(
            !similar.combine("other", "m9", t0),
            "another object counts apart"
        );
        assert!(
            similar.combine("pod", "m9", t0),
            "the tenth distinct message"
        );
        assert!(
            similar.combine("pod", "m0", t0),
            "now every message is combined"
        );
        // Ten minutes of quiet start afresh.
        let later = t0 + Duration::from_secs(601);
        assert!(!similar.combine("pod", "m10", later));
        similar.forget(later + Duration::from_secs(601));
        assert!(similar.seen.is_empty());
    }

    #[test]
    fn the_pods_of_a_claim_come_from_reserved_for() {
        let claim = serde_json::json!({"status": {"reservedFor": [
            {"resource": "pods", "name": "db", "uid": "u1"},
            {"apiGroup": "", "resource": "pods", "name": "db2", "uid": "u2"},
            {"apiGroup": "example.com", "resource": "pods", "name": "x", "uid": "u3"},
            {"resource": "deployments", "name": "y", "uid": "u4"},
            {"resource": "pods", "name": "no-uid"},
        ]}});
        let pods: Vec<String> = reserved_pods("ns", &claim)
            .into_iter()
            .map(|p| format!("{}/{}/{}", p.namespace, p.name, p.uid))
            .collect();
        assert_eq!(pods, ["ns/db/u1", "ns/db2/u2"]);
        assert!(reserved_pods("ns", &serde_json::json!({})).is_empty());
    }
}
