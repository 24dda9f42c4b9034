//! Prometheus metrics, served at `/metrics` in the OpenMetrics text format.
//!
//! | metric | type | what |
//! |---|---|---|
//! | `resmgr_prepare_duration_seconds` | histogram | one kubelet NodePrepareResources call, end to end |
//! | `resmgr_unprepare_duration_seconds` | histogram | one NodeUnprepareResources call |
//! | `resmgr_claims_prepared_total` | counter | claims prepared successfully |
//! | `resmgr_nri_events_total{kind}` | counter | NRI events handled, by kind |
//! | `resmgr_pool_cpus{pool,kind}` | gauge | CPUs of each pool that are reserved, shared, exclusive or claimed, as the policy's `inventory()` reports them (none for a policy that reports no pools) |
//! | `resmgr_pending_updates` | gauge | containers with updates the runtime does not have yet |
//! | `resmgr_container_fallbacks{kind}` | gauge | containers the policy placed otherwise than their request asks rather than refuse them, by kind: `not-exclusive` (shared CPUs instead of exclusive ones), `widened` (claims took their pool's shared CPUs: an enclosing pool's), `reserved` (nothing shared anywhere: the reserved CPUs), `memory-unpinned` |
//! | `resmgr_slice_fields_dropped{field}` | gauge | 1 for each field of our ResourceSlices the API server drops (a feature gate is off), say `devices[].allowMultipleAllocations` without DRAConsumableCapacity |
//!
//! The gauges are read from the policy and the manager when scraped, so they are never stale.

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{
        counter::Counter,
        family::Family,
        gauge::Gauge,
        histogram::{Histogram, exponential_buckets},
    },
    registry::Registry,
};

use crate::view::Inventory;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EventLabel {
    kind: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PoolLabel {
    pool: String,
    kind: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabel {
    kind: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FieldLabel {
    field: String,
}

/// Every metric the agent exports.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    pub prepare_seconds: Histogram,
    pub unprepare_seconds: Histogram,
    pub claims_prepared: Counter,
    nri_events: Family<EventLabel, Counter>,
    pool_cpus: Family<PoolLabel, Gauge>,
    pending: Gauge,
    fallbacks: Family<KindLabel, Gauge>,
    dropped_fields: Family<FieldLabel, Gauge>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("resmgr");
        // 100 µs to ~6.5 s: a prepare is two fsync'd writes and maybe an UpdateContainers call.
        let prepare_seconds = Histogram::new(exponential_buckets(0.0001, 2.0, 17));
        let unprepare_seconds = Histogram::new(exponential_buckets(0.0001, 2.0, 17));
        let claims_prepared = Counter::default();
        let nri_events = Family::<EventLabel, Counter>::default();
        let pool_cpus = Family::<PoolLabel, Gauge>::default();
        let pending = Gauge::default();
        let fallbacks = Family::<KindLabel, Gauge>::default();
        let dropped_fields = Family::<FieldLabel, Gauge>::default();
        registry.register(
            "prepare_duration_seconds",
            "Duration of kubelet NodePrepareResources calls",
            prepare_seconds.clone(),
        );
        registry.register(
            "unprepare_duration_seconds",
            "Duration of kubelet NodeUnprepareResources calls",
            unprepare_seconds.clone(),
        );
        registry.register(
            "claims_prepared",
            "Claims prepared successfully",
            claims_prepared.clone(),
        );
        registry.register(
            "nri_events",
            "NRI events handled, by kind",
            nri_events.clone(),
        );
        registry.register(
            "pool_cpus",
            "CPUs of each pool by use: reserved, shared, exclusive, claimed",
            pool_cpus.clone(),
        );
        registry.register(
            "pending_updates",
            "Containers with updates the runtime does not have yet",
            pending.clone(),
        );
        registry.register(
            "container_fallbacks",
            "Containers placed otherwise than their request asks rather than refused, by kind",
            fallbacks.clone(),
        );
        registry.register(
            "slice_fields_dropped",
            "Fields of our ResourceSlices the API server drops (1 each): a feature gate is off",
            dropped_fields.clone(),
        );
        Self {
            fallbacks,
            dropped_fields,
            registry,
            prepare_seconds,
            unprepare_seconds,
            claims_prepared,
            nri_events,
            pool_cpus,
            pending,
        }
    }

    /// Counts one NRI event of `kind` (for example `create-container`).
    pub fn nri_event(&self, kind: &str) {
        self.nri_events
            .get_or_create(&EventLabel { kind: kind.into() })
            .inc();
    }

    /// Sets the gauges from what the policy and the manager hold now.
    pub fn refresh(&self, inventory: &Inventory, pending_updates: usize) {
        for pool in &inventory.pools {
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
                    .set(i64::try_from(n).unwrap_or(i64::MAX));
            }
        }
        self.pending
            .set(i64::try_from(pending_updates).unwrap_or(i64::MAX));
        for kind in [
            policy::Fallback::NotExclusive,
            policy::Fallback::Widened,
            policy::Fallback::Reserved,
            policy::Fallback::MemoryUnpinned,
        ] {
            let n = inventory
                .containers
                .iter()
                .filter(|c| c.fallbacks.contains(&kind))
                .count();
            self.fallbacks
                .get_or_create(&KindLabel {
                    kind: kind.as_str().into(),
                })
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::view::PoolCounts;

    #[test]
    fn exports_every_metric_with_pool_gauges() {
        let m = Metrics::new();
        m.claims_prepared.inc();
        m.prepare_seconds.observe(0.002);
        m.nri_event("create-container");
        let inventory = Inventory {
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
                    grant: crate::view::GrantKind::Shared,
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
        };
        m.refresh(&inventory, 2);
        m.slice_field_dropped("devices[].allowMultipleAllocations");
        let text = m.encode();
        for wanted in [
            "resmgr_prepare_duration_seconds_count 1",
            "resmgr_unprepare_duration_seconds_count 0",
            "resmgr_claims_prepared_total 1",
            "resmgr_nri_events_total{kind=\"create-container\"} 1",
            "resmgr_pool_cpus{pool=\"root\",kind=\"shared\"} 3",
            "resmgr_pool_cpus{pool=\"root\",kind=\"reserved\"} 1",
            "resmgr_pending_updates 2",
            "resmgr_container_fallbacks{kind=\"not-exclusive\"} 1",
            "resmgr_container_fallbacks{kind=\"widened\"} 1",
            "resmgr_container_fallbacks{kind=\"reserved\"} 1",
            "resmgr_container_fallbacks{kind=\"memory-unpinned\"} 0",
            "resmgr_slice_fields_dropped{field=\"devices[].allowMultipleAllocations\"} 1",
        ] {
            assert!(text.contains(wanted), "{wanted:?} not in\n{text}");
        }
    }
}
