//! Prometheus metrics, served at `/metrics` in the OpenMetrics text format.
//!
//! [`METRICS`] documents every metric (name, type, labels, meaning); registration takes each
//! metric's help text from it, and docs/metrics.md is generated from it ([`markdown`], checked
//! by `cargo xtask docs --check`). The tests check that every registered metric is documented
//! and every documented one is registered and changed by one of [`Metrics`]' update methods;
//! the fields are private, so those methods are the only way to update a metric, and the
//! compiler's dead-code lint (an error in CI) fails on a method that nothing calls.
//!
//! The gauges are read from the policy, the manager and the publisher when scraped
//! ([`Metrics::refresh`]), so they are never stale.

use std::fmt::Write as _;

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{
        counter::Counter,
        family::Family,
        gauge::Gauge,
        histogram::{Histogram, exponential_buckets},
    },
    registry::{Metric, Registry},
};

use crate::view::InventoryRows;

/// One metric, as documented.
#[derive(Debug, Clone, Copy)]
pub struct MetricDoc {
    /// The registered name, without the `resmgr_` prefix (and without `_total` for counters).
    pub name: &'static str,
    pub kind: Kind,
    /// Label names and what their values are.
    pub labels: &'static [(&'static str, &'static str)],
    /// The `# HELP` text.
    pub help: &'static str,
    /// More, for the documentation; may be empty.
    pub details: &'static str,
}

/// A metric's type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Self::Counter => "counter",
            Self::Gauge => "gauge",
            Self::Histogram => "histogram",
        }
    }
}

impl MetricDoc {
    /// The family name as exposed: `resmgr_<name>`.
    pub fn family(&self) -> String {
        format!("resmgr_{}", self.name)
    }

    /// The name to look for: a counter's `_total` sample, else the family.
    pub fn display_name(&self) -> String {
        match self.kind {
            Kind::Counter => format!("{}_total", self.family()),
            Kind::Gauge | Kind::Histogram => self.family(),
        }
    }

    /// The sample names a scraper sees.
    pub fn samples(&self) -> String {
        let f = self.family();
        match self.kind {
            Kind::Counter => format!("`{f}_total`"),
            Kind::Gauge => format!("`{f}`"),
            Kind::Histogram => format!("`{f}_bucket`, `{f}_sum`, `{f}_count`"),
        }
    }
}

/// Every metric the agent exports, in documentation order.
pub const METRICS: &[MetricDoc] = &[
    MetricDoc {
        name: "build_info",
        kind: Kind::Gauge,
        labels: &[("version", "the agent's version")],
        help: "Always 1; its label says which version of the agent runs",
        details: "Join on it to break other series down by version during a rollout.",
    },
    MetricDoc {
        name: "ready",
        kind: Kind::Gauge,
        labels: &[],
        help: "1 when the agent is ready (what /readyz answers), else 0",
        details: "Ready means synchronized with the container runtime and, with DRA, registered \
                  with the kubelet. An agent that stays unready serves no claims: alert on it.",
    },
    MetricDoc {
        name: "runtime_synchronized",
        kind: Kind::Gauge,
        labels: &[],
        help: "1 once the container runtime's Synchronize has been handled, else 0",
        details: "Claims are refused until then; it never goes back to 0 (losing the runtime \
                  restarts the agent).",
    },
    MetricDoc {
        name: "nri_events",
        kind: Kind::Counter,
        labels: &[(
            "kind",
            "`synchronize`, `create-container`, `post-create-container`, `post-start-container`, `update-container`, `post-update-container`, `stop-container` or `remove-container`",
        )],
        help: "NRI events handled, by kind",
        details: "",
    },
    MetricDoc {
        name: "pending_updates",
        kind: Kind::Gauge,
        labels: &[],
        help: "Containers with updates the runtime does not have yet",
        details: "Updates the runtime refused or did not answer stay pending and are retried with \
                  backoff. Non-zero for minutes means containers run on CPUs the policy has \
                  given to someone else: alert on it.",
    },
    MetricDoc {
        name: "pool_cpus",
        kind: Kind::Gauge,
        labels: &[
            ("pool", "the pool: `root`, `socket0`, `numa1`, ..."),
            (
                "kind",
                "`reserved`, `shared`, `exclusive` (granted to containers) or `claimed` (granted to DRA claims)",
            ),
        ],
        help: "CPUs of each pool by use: reserved, shared, exclusive, claimed",
        details: "As the policy's inventory reports them; a policy that reports no pools has none.",
    },
    MetricDoc {
        name: "container_fallbacks",
        kind: Kind::Gauge,
        labels: &[(
            "kind",
            "`not-exclusive` (shared CPUs instead of exclusive ones), `widened` (claims took its pool's shared CPUs: an enclosing pool's), `reserved` (nothing shared anywhere: the reserved CPUs), `memory-unpinned`",
        )],
        help: "Containers placed otherwise than their request asks rather than refused, by kind",
        details: "The agent never refuses a container the kubelet admitted for want of CPUs or \
                  memory; it places it as well as it can and counts it here (and logs a \
                  warning, and shows it in `/debug/state`).",
    },
    MetricDoc {
        name: "claims_prepared",
        kind: Kind::Counter,
        labels: &[],
        help: "Claims prepared successfully",
        details: "",
    },
    MetricDoc {
        name: "claim_failures",
        kind: Kind::Counter,
        labels: &[("operation", "`prepare` or `unprepare`")],
        help: "Claims the kubelet asked for that failed, by operation",
        details: "Each failed claim of a request counts once; so does each claim of a request \
                  refused as a whole, except while the agent is still synchronizing with the \
                  runtime (the kubelet retries those). The claim's pod does not start while its \
                  prepare fails; the reason is in an event on the pod and the claim, and in the \
                  agent's log.",
    },
    MetricDoc {
        name: "prepare_duration_seconds",
        kind: Kind::Histogram,
        labels: &[],
        help: "Duration of kubelet NodePrepareResources calls",
        details: "One call, end to end: reading the claims, allocating, the durable commit, \
                  container updates and the CDI specs.",
    },
    MetricDoc {
        name: "unprepare_duration_seconds",
        kind: Kind::Histogram,
        labels: &[],
        help: "Duration of kubelet NodeUnprepareResources calls",
        details: "",
    },
    MetricDoc {
        name: "devices_published",
        kind: Kind::Gauge,
        labels: &[],
        help: "1 when the node's ResourceSlices hold the devices the policy publishes, else 0",
        details: "0 before the first publication, and after a publication or republication \
                  failed until one succeeds (they are retried with backoff). Always 0 with \
                  `dra: false`.",
    },
    MetricDoc {
        name: "node_allocatable_refused",
        kind: Kind::Gauge,
        labels: &[],
        help: "1 while the API server refuses the node-allocatable mapping for this node and the \
               ResourceSlices are published without it, else 0",
        details: "A 1.37 API server refuses slices that map node resources for a Node whose \
                  kubelet does not declare `DRANodeAllocatableResources`. The agent then \
                  publishes without the mapping (pods must request their claimed CPUs in \
                  `resources.requests`) and tries the mapping again every 5 minutes and when \
                  the Node comes to declare the feature. Always 0 with the switch off (see \
                  [deploy.md](deploy.md#kubernetes-137)).",
    },
    MetricDoc {
        name: "slice_fields_dropped",
        kind: Kind::Gauge,
        labels: &[(
            "field",
            "a field path of our ResourceSlices, such as `devices[].allowMultipleAllocations`",
        )],
        help: "Fields of our ResourceSlices the API server drops (1 each): a feature gate is off",
        details: "Without DRAConsumableCapacity the API server drops what grouped devices need; \
                  the agent then logs which `device-mode` fits (see \
                  [kubernetes.md](kubernetes.md)).",
    },
    MetricDoc {
        name: "publish_failures",
        kind: Kind::Counter,
        labels: &[],
        help: "ResourceSlice publications and republications that failed",
        details: "A failing publication leaves the scheduler with stale or no devices of this \
                  node: alert when it keeps increasing.",
    },
    MetricDoc {
        name: "events_dropped",
        kind: Kind::Counter,
        labels: &[(
            "reason",
            "`rate-limited` (the object had its share: 25 at once, then one per 5 minutes), \
             `queue-full` (the API server is slow or gone) or `failed` (it refused the Event)",
        )],
        help: "Kubernetes Events (a container refused, a claim not prepared) that were not posted",
        details: "Refusals are always logged; the Events only tell users without the log. \
                  `failed` that keeps increasing usually means the agent's RBAC lacks `create` or \
                  `patch` on `events.k8s.io` `events`. None without DRA, which posts no Events.",
    },
    MetricDoc {
        name: "reconciled_claims",
        kind: Kind::Counter,
        labels: &[(
            "outcome",
            "`adopted`, `swept`, `set-aside`, `held-unreadable`, `contested`, `released`, \
             `gave-way` or `confirmed`",
        )],
        help: "What reconciling the node's CDI specs and held claims did, by outcome",
        details: "A CDI spec the state does not account for is adopted (a container uses it, or \
                  the API server allocates it here), swept (nothing wants it), set aside \
                  (unreadable and unused), held from its containers' cpus (unreadable and used) \
                  or contested (used, and its cpus are another claim's). A claim held without \
                  the kubelet preparing it again is confirmed by the next prepare or released \
                  after `unconfirmed-claim-grace`. Anything but `confirmed` also posts a \
                  `ClaimReconciled` Event on the Node; docs/deploy.md says what to do.",
    },
    MetricDoc {
        name: "claims_contested",
        kind: Kind::Gauge,
        labels: &[],
        help: "Claims whose CDI spec a running container uses while another claim holds its cpus",
        details: "While it is not 0 the agent refuses claims and is not ready: serving them could \
                  grant the same cpus twice. /debug/state's `reconciliation` names them and the \
                  pods to delete; alert on it.",
    },
];

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabel {
    kind: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PoolLabel {
    pool: String,
    kind: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FieldLabel {
    field: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OperationLabel {
    operation: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabel {
    outcome: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VersionLabel {
    version: &'static str,
}

/// What the scrape-time gauges are set from.
#[derive(Debug)]
pub struct Snapshot<'a> {
    pub inventory: &'a InventoryRows,
    pub pending_updates: usize,
    pub synchronized: bool,
    pub ready: bool,
    /// `None` without DRA.
    pub publish: Option<kube_dra::PublishStatus>,
    /// `None` without DRA.
    pub events: Option<kube_dra::EventStats>,
    pub reconciliation: &'a resmgr::ReconcileReport,
}

/// Every metric the agent exports.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    prepare_seconds: Histogram,
    unprepare_seconds: Histogram,
    claims_prepared: Counter,
    claim_failures: Family<OperationLabel, Counter>,
    nri_events: Family<KindLabel, Counter>,
    pool_cpus: Family<PoolLabel, Gauge>,
    pending: Gauge,
    fallbacks: Family<KindLabel, Gauge>,
    dropped_fields: Family<FieldLabel, Gauge>,
    ready: Gauge,
    synchronized: Gauge,
    devices_published: Gauge,
    node_allocatable_refused: Gauge,
    publish_failures: Counter,
    events_dropped: Family<ReasonLabel, Counter>,
    reconciled: Family<OutcomeLabel, Counter>,
    contested: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

/// Registers `metric` under `name` with its documented help text (empty if undocumented, which
/// the tests refuse).
fn register(registry: &mut Registry, name: &'static str, metric: impl Metric) {
    let help = METRICS
        .iter()
        .find(|m| m.name == name)
        .map_or("", |m| m.help);
    registry.register(name, help, metric);
}

fn count(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("resmgr");
        let build_info = Family::<VersionLabel, Gauge>::default();
        build_info
            .get_or_create(&VersionLabel {
                version: env!("CARGO_PKG_VERSION"),
            })
            .set(1);
        // 100 µs to ~6.5 s: a prepare is two fsync'd writes and maybe an UpdateContainers call.
        let m = Self {
            prepare_seconds: Histogram::new(exponential_buckets(0.0001, 2.0, 17)),
            unprepare_seconds: Histogram::new(exponential_buckets(0.0001, 2.0, 17)),
            claims_prepared: Counter::default(),
            claim_failures: Family::default(),
            nri_events: Family::default(),
            pool_cpus: Family::default(),
            pending: Gauge::default(),
            fallbacks: Family::default(),
            dropped_fields: Family::default(),
            ready: Gauge::default(),
            synchronized: Gauge::default(),
            devices_published: Gauge::default(),
            node_allocatable_refused: Gauge::default(),
            publish_failures: Counter::default(),
            events_dropped: Family::default(),
            reconciled: Family::default(),
            contested: Gauge::default(),
            registry: Registry::default(),
        };
        register(&mut registry, "build_info", build_info);
        register(&mut registry, "ready", m.ready.clone());
        register(
            &mut registry,
            "runtime_synchronized",
            m.synchronized.clone(),
        );
        register(&mut registry, "nri_events", m.nri_events.clone());
        register(&mut registry, "pending_updates", m.pending.clone());
        register(&mut registry, "pool_cpus", m.pool_cpus.clone());
        register(&mut registry, "container_fallbacks", m.fallbacks.clone());
        register(&mut registry, "claims_prepared", m.claims_prepared.clone());
        register(&mut registry, "claim_failures", m.claim_failures.clone());
        register(
            &mut registry,
            "prepare_duration_seconds",
            m.prepare_seconds.clone(),
        );
        register(
            &mut registry,
            "unprepare_duration_seconds",
            m.unprepare_seconds.clone(),
        );
        register(
            &mut registry,
            "devices_published",
            m.devices_published.clone(),
        );
        register(
            &mut registry,
            "node_allocatable_refused",
            m.node_allocatable_refused.clone(),
        );
        register(
            &mut registry,
            "slice_fields_dropped",
            m.dropped_fields.clone(),
        );
        register(
            &mut registry,
            "publish_failures",
            m.publish_failures.clone(),
        );
        register(&mut registry, "events_dropped", m.events_dropped.clone());
        register(&mut registry, "reconciled_claims", m.reconciled.clone());
        register(&mut registry, "claims_contested", m.contested.clone());
        Self { registry, ..m }
    }

    /// One NodePrepareResources call: how long it took, and how many of its claims were
    /// prepared and failed.
    pub fn prepared(&self, seconds: f64, succeeded: usize, failed: usize) {
        self.prepare_seconds.observe(seconds);
        self.claims_prepared
            .inc_by(u64::try_from(succeeded).unwrap_or(u64::MAX));
        self.failed("prepare", failed);
    }

    /// One NodeUnprepareResources call: how long it took and how many of its claims failed.
    pub fn unprepared(&self, seconds: f64, failed: usize) {
        self.unprepare_seconds.observe(seconds);
        self.failed("unprepare", failed);
    }

    fn failed(&self, operation: &'static str, n: usize) {
        if n > 0 {
            self.claim_failures
                .get_or_create(&OperationLabel { operation })
                .inc_by(u64::try_from(n).unwrap_or(u64::MAX));
        }
    }

    /// Counts one NRI event of `kind` (for example `create-container`).
    pub fn nri_event(&self, kind: &str) {
        self.nri_events
            .get_or_create(&KindLabel { kind: kind.into() })
            .inc();
    }

    /// Sets the scrape-time gauges from what the policy, the manager and the publisher hold now.
    pub fn refresh(&self, now: &Snapshot<'_>) {
        for pool in &now.inventory.pools {
            for (kind, n) in [
                ("reserved", pool.reserved),
                ("shared", pool.shared),
                ("exclusive", pool.exclusive),
                ("claimed", pool.claimed),
            ] {
                self.pool_cpus
                    .get_or_create(&PoolLabel {
                        pool: pool.name.clone(),
                        kind: kind.into(),
                    })
                    .set(count(n));
            }
        }
        for kind in [
            policy::Fallback::NotExclusive,
            policy::Fallback::Widened,
            policy::Fallback::Reserved,
            policy::Fallback::MemoryUnpinned,
        ] {
            let n = now
                .inventory
                .containers
                .iter()
                .filter(|c| c.fallbacks.contains(&kind))
                .count();
            self.fallbacks
                .get_or_create(&KindLabel {
                    kind: kind.as_str().into(),
                })
                .set(count(n));
        }
        self.pending.set(count(now.pending_updates));
        self.synchronized.set(i64::from(now.synchronized));
        self.ready.set(i64::from(now.ready));
        let publish = now.publish.unwrap_or_default();
        self.devices_published.set(i64::from(publish.in_sync));
        self.node_allocatable_refused
            .set(i64::from(publish.node_allocatable_refused));
        // The publisher counts; the counter catches up with it.
        let behind = publish.failures.saturating_sub(self.publish_failures.get());
        self.publish_failures.inc_by(behind);
        self.reconciled(now.reconciliation);
        if let Some(events) = now.events {
            for (reason, n) in [
                ("rate-limited", events.rate_limited),
                ("queue-full", events.queue_full),
                ("failed", events.failed),
            ] {
                // The poster counts; each counter catches up with it.
                let counter = self.events_dropped.get_or_create(&ReasonLabel { reason });
                counter.inc_by(n.saturating_sub(counter.get()));
            }
        }
    }

    /// Sets the reconciliation counters and gauge from the manager's report.
    fn reconciled(&self, report: &resmgr::ReconcileReport) {
        for outcome in resmgr::Outcome::ALL {
            let n = report.counts.get(&outcome).copied().unwrap_or(0);
            // The manager counts; each counter catches up with it.
            let counter = self.reconciled.get_or_create(&OutcomeLabel {
                outcome: outcome.as_str(),
            });
            counter.inc_by(n.saturating_sub(counter.get()));
        }
        self.contested.set(count(report.contested.len()));
    }

    /// Records a field of our ResourceSlices the API server drops.
    pub fn slice_field_dropped(&self, field: &str) {
        self.dropped_fields
            .get_or_create(&FieldLabel {
                field: field.into(),
            })
            .set(1);
    }

    /// The OpenMetrics text.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

/// The NRI plugin counts its events here.
impl resmgr::nri_plugin::EventObserver for Metrics {
    fn event(&self, kind: &'static str) {
        self.nri_event(kind);
    }
}

/// docs/metrics.md.
pub fn markdown() -> String {
    let mut out = String::new();
    out.push_str(
        "<!-- Generated from crates/plugin-bin/src/metrics.rs by `cargo xtask docs`; edit that \
         file, not this one. -->\n\n",
    );
    out.push_str("# Metrics\n\n");
    out.push_str(
        "The agent serves these at `/metrics` on `metrics-addr` (see \
         [configuration.md](configuration.md)), in the OpenMetrics text format. Gauges are \
         read when scraped, so they are never stale. Every metric is listed here: a test fails \
         when one is registered but not listed, listed but not registered, or never updated.\n\n",
    );
    out.push_str("| metric | type | labels | what |\n|---|---|---|---|\n");
    for m in METRICS {
        let labels: Vec<String> = m.labels.iter().map(|(l, _)| format!("`{l}`")).collect();
        let _ = writeln!(
            out,
            "| [`{}`](#{}) | {} | {} | {} |",
            m.display_name(),
            m.family(),
            m.kind.as_str(),
            labels.join(", "),
            m.help
        );
    }
    for m in METRICS {
        let _ = write!(out, "\n## `{}`\n\n", m.family());
        let _ = writeln!(out, "{}; samples {}.\n", m.kind.as_str(), m.samples());
        let _ = writeln!(out, "{}.", m.help);
        if !m.details.is_empty() {
            let _ = writeln!(out, "{}", m.details);
        }
        if !m.labels.is_empty() {
            out.push_str("\n| label | values |\n|---|---|\n");
            for (label, values) in m.labels {
                let _ = writeln!(out, "| `{label}` | {values} |");
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};

    use super::*;
    use crate::view::PoolCounts;

    fn inventory() -> InventoryRows {
        InventoryRows {
            reserved: "0".into(),
            shared: "1-3".into(),
            pools: vec![PoolCounts {
                name: "root".into(),
                kind: "root".into(),
                cpus: "0-3".into(),
                reserved: 1,
                shared: 3,
                exclusive: 0,
                claimed: 0,
            }],
            containers: ["not-exclusive,widened", "reserved", ""]
                .iter()
                .enumerate()
                .map(|(i, kinds)| crate::view::ContainerRow {
                    id: format!("c{i}"),
                    name: String::new(),
                    grant: policy::GrantKind::Shared,
                    pool: None,
                    cpus: "1-3".into(),
                    mems: None,
                    fallbacks: kinds
                        .split(',')
                        .filter(|k| !k.is_empty())
                        .map(|k| serde_json::from_value(serde_json::json!(k)).unwrap())
                        .collect(),
                })
                .collect(),
            claims: Vec::new(),
            source: policy::Inventory::default(),
        }
    }

    /// Drives every update method once, with values that differ from the fresh ones.
    fn update_all(m: &Metrics) {
        m.prepared(0.002, 1, 1);
        m.unprepared(0.001, 1);
        m.nri_event("create-container");
        m.slice_field_dropped("devices[].allowMultipleAllocations");
        m.refresh(&Snapshot {
            inventory: &inventory(),
            pending_updates: 2,
            synchronized: true,
            ready: true,
            publish: Some(kube_dra::PublishStatus {
                in_sync: true,
                failures: 3,
                node_allocatable_refused: true,
            }),
            events: Some(kube_dra::EventStats {
                posted: 7,
                rate_limited: 4,
                queue_full: 5,
                failed: 6,
            }),
            reconciliation: &resmgr::ReconcileReport {
                counts: [(resmgr::Outcome::Swept, 2)].into(),
                contested: [("c1".to_owned(), "why".to_owned())].into(),
                ..Default::default()
            },
        });
    }

    /// The `# TYPE` lines: family name to type.
    fn families(text: &str) -> BTreeMap<String, String> {
        text.lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .filter_map(|l| l.split_once(' '))
            .map(|(n, t)| (n.to_owned(), t.to_owned()))
            .collect()
    }

    /// The sample lines of one family.
    fn samples(text: &str, family: &str) -> Vec<String> {
        text.lines()
            .filter(|l| !l.starts_with('#'))
            .filter(|l| {
                l.strip_prefix(family)
                    .is_some_and(|rest| rest.starts_with(['{', ' ', '_']))
            })
            .map(str::to_owned)
            .collect()
    }

    #[test]
    fn every_registered_metric_is_documented_and_every_documented_one_registered() {
        // A family with labels shows only once it has a sample: update everything first.
        let m = Metrics::new();
        update_all(&m);
        let text = m.encode();
        let registered = families(&text);
        let documented: BTreeMap<String, String> = METRICS
            .iter()
            .map(|m| (m.family(), m.kind.as_str().to_owned()))
            .collect();
        assert_eq!(registered, documented, "\n{text}");
        for m in METRICS {
            assert!(
                text.contains(&format!("# HELP {} {}.\n", m.family(), m.help)),
                "{}'s help is not the documented one:\n{text}",
                m.name
            );
        }
    }

    #[test]
    fn every_documented_metric_is_changed_by_an_update_and_has_its_labels() {
        let fresh = Metrics::new().encode();
        let m = Metrics::new();
        update_all(&m);
        let text = m.encode();
        for doc in METRICS {
            let family = doc.family();
            let after = samples(&text, &family);
            assert!(!after.is_empty(), "{family} has no samples:\n{text}");
            if doc.name != "build_info" {
                assert_ne!(
                    samples(&fresh, &family),
                    after,
                    "no update method changes {family}"
                );
            }
            let wanted: BTreeSet<&str> = doc.labels.iter().map(|(l, _)| *l).collect();
            for sample in &after {
                let labels: BTreeSet<&str> = sample
                    .split_once('{')
                    .and_then(|(_, rest)| rest.split_once('}'))
                    .map(|(labels, _)| {
                        labels
                            .split(',')
                            .filter_map(|kv| kv.split_once('=').map(|(k, _)| k))
                            .filter(|k| *k != "le")
                            .collect()
                    })
                    .unwrap_or_default();
                assert_eq!(labels, wanted, "{sample}");
            }
        }
        for wanted in [
            "resmgr_prepare_duration_seconds_count 1",
            "resmgr_unprepare_duration_seconds_count 1",
            "resmgr_claims_prepared_total 1",
            "resmgr_claim_failures_total{operation=\"prepare\"} 1",
            "resmgr_claim_failures_total{operation=\"unprepare\"} 1",
            "resmgr_nri_events_total{kind=\"create-container\"} 1",
            "resmgr_pool_cpus{pool=\"root\",kind=\"shared\"} 3",
            "resmgr_pool_cpus{pool=\"root\",kind=\"reserved\"} 1",
            "resmgr_pending_updates 2",
            "resmgr_container_fallbacks{kind=\"not-exclusive\"} 1",
            "resmgr_container_fallbacks{kind=\"widened\"} 1",
            "resmgr_container_fallbacks{kind=\"reserved\"} 1",
            "resmgr_container_fallbacks{kind=\"memory-unpinned\"} 0",
            "resmgr_slice_fields_dropped{field=\"devices[].allowMultipleAllocations\"} 1",
            "resmgr_ready 1",
            "resmgr_runtime_synchronized 1",
            "resmgr_devices_published 1",
            "resmgr_publish_failures_total 3",
            "resmgr_events_dropped_total{reason=\"rate-limited\"} 4",
            "resmgr_events_dropped_total{reason=\"queue-full\"} 5",
            "resmgr_events_dropped_total{reason=\"failed\"} 6",
        ] {
            assert!(text.contains(wanted), "{wanted:?} not in\n{text}");
        }
    }

    #[test]
    fn counters_kept_elsewhere_follow_them_without_counting_twice() {
        let m = Metrics::new();
        let inventory = inventory();
        for failures in [2, 2, 5] {
            m.refresh(&Snapshot {
                inventory: &inventory,
                pending_updates: 0,
                synchronized: true,
                ready: true,
                publish: Some(kube_dra::PublishStatus {
                    in_sync: false,
                    failures,
                    node_allocatable_refused: false,
                }),
                events: Some(kube_dra::EventStats {
                    queue_full: failures,
                    ..Default::default()
                }),
                reconciliation: &resmgr::ReconcileReport {
                    counts: [(resmgr::Outcome::Released, failures)].into(),
                    ..Default::default()
                },
            });
        }
        for wanted in [
            "resmgr_reconciled_claims_total{outcome=\"released\"} 5\n",
            "resmgr_publish_failures_total 5\n",
            "resmgr_events_dropped_total{reason=\"queue-full\"} 5\n",
        ] {
            assert!(m.encode().contains(wanted), "{wanted} in {}", m.encode());
        }
    }
}
