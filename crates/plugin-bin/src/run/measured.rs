//! The claim lifecycle as the kubelet calls it, timed for the metrics and logged with the CPUs
//! each claim got or gave back.

use std::sync::Arc;

use resmgr::{
    Manager,
    dra_handler::LifecycleHandler,
    kubelet_plugin::{ClaimHandler, ClaimRef, PrepareResults, RequestError, UnprepareResults},
};
use tracing::info;

use crate::{metrics::Metrics, view};

/// The claim lifecycle as the kubelet calls it, timed for the metrics, and logged with the CPUs
/// each claim got or gave back (the manager logs claims by device; only the binary can ask the
/// policy which CPUs those are).
#[derive(Debug)]
pub struct Measured {
    pub inner: LifecycleHandler,
    pub metrics: Arc<Metrics>,
    /// Whose snapshot says which CPUs each claim holds.
    pub manager: Arc<Manager>,
}

impl ClaimHandler for Measured {
    async fn prepare(&self, claims: &[ClaimRef]) -> Result<PrepareResults, RequestError> {
        let start = std::time::Instant::now();
        let answer = self.inner.prepare(claims).await;
        let (ok, failed) = outcome(&answer, claims.len());
        self.metrics
            .prepared(start.elapsed().as_secs_f64(), ok, failed);
        if let Ok(results) = &answer {
            let inventory = view::inventory(&self.manager);
            for c in inventory
                .claims
                .iter()
                .filter(|c| matches!(results.get(&c.uid), Some(Ok(_))))
            {
                info!(claim = %c.name, uid = %c.uid, cpus = %c.cpus, mems = %c.mems, "claim holds cpus");
            }
        }
        answer
    }

    async fn unprepare(&self, claims: &[ClaimRef]) -> Result<UnprepareResults, RequestError> {
        let before = view::inventory(&self.manager);
        let start = std::time::Instant::now();
        let answer = self.inner.unprepare(claims).await;
        let (_, failed) = outcome(&answer, claims.len());
        self.metrics
            .unprepared(start.elapsed().as_secs_f64(), failed);
        if let Ok(results) = &answer {
            for c in before
                .claims
                .iter()
                .filter(|c| matches!(results.get(&c.uid), Some(Ok(()))))
            {
                info!(claim = %c.name, uid = %c.uid, cpus = %c.cpus, "claim gave back cpus");
            }
        }
        answer
    }
}

/// How many claims of a kubelet request succeeded and failed. A request refused as a whole
/// fails every claim in it, except while the runtime is still synchronizing: the kubelet retries
/// those, and counting them would make every start look like a failure.
fn outcome<T, E>(
    answer: &Result<std::collections::BTreeMap<String, Result<T, E>>, RequestError>,
    asked: usize,
) -> (usize, usize) {
    match answer {
        Ok(results) => {
            let ok = results.values().filter(|r| r.is_ok()).count();
            (ok, results.len() - ok)
        }
        Err(RequestError::Unavailable(_)) => (0, 0),
        Err(_) => (0, asked),
    }
}

#[cfg(test)]
mod tests {
    use policy::{AllocationResult, Claim, Quantity, Topology, topology_aware::Config};
    use resmgr::kube_dra::fake::StaticClaims;

    use super::*;
    use crate::{
        policy_choice,
        simulate::{Dirs, start_manager, world::SimRuntime},
    };

    #[tokio::test]
    async fn the_kubelet_handler_times_and_counts_claims() {
        let dir = tempfile::tempdir().unwrap();
        let topology = Topology::load(&policy::TopologySource::Synthetic(
            "pack:1 numa:2 core:2 pu:1".into(),
        ))
        .unwrap();
        let claims = Arc::new(StaticClaims::new());
        let driver = crate::config::DEFAULT_DRIVER;
        let dirs = Dirs::under(dir.path());
        let (manager, view) = start_manager(
            driver,
            policy_choice::build(topology, Config::default()).unwrap(),
            &dirs,
            &Arc::new(SimRuntime::default()),
            &claims,
        )
        .unwrap();
        let manager = Arc::new(manager);
        manager.synchronize(&[]).await.unwrap();
        manager.synchronized().await;
        claims.insert(Claim {
            uid: "uid-1".into(),
            namespace: "ns".into(),
            name: "c".into(),
            reserved_for: vec!["pod".into()],
            results: vec![AllocationResult {
                request: "cpus".into(),
                pool: "node".into(),
                device: "numa1".into(),
                share_id: None,
                consumed_capacity: [("cpu".to_owned(), Quantity::from_units(1))].into(),
            }],
            config: Vec::new(),
        });
        let metrics = Arc::new(Metrics::new());
        let handler = Measured {
            inner: LifecycleHandler::new(manager.clone()),
            metrics: metrics.clone(),
            manager: manager.clone(),
        };
        let refs = [
            ClaimRef::new("ns", "c", "uid-1"),
            ClaimRef::new("ns", "missing", "uid-2"),
        ];
        let answers = handler.prepare(&refs).await.unwrap();
        assert!(answers["uid-1"].is_ok() && answers["uid-2"].is_err());
        let mut snapshots = manager.published();
        snapshots.mark_unchanged();
        handler.unprepare(&refs[..1]).await.unwrap();
        // The unprepare changed what the manager publishes, which wakes the republisher.
        assert!(
            snapshots.has_changed().unwrap(),
            "an unprepare publishes a new snapshot"
        );
        let text = metrics.encode();
        for wanted in [
            "resmgr_claims_prepared_total 1",
            "resmgr_prepare_duration_seconds_count 1",
            "resmgr_unprepare_duration_seconds_count 1",
        ] {
            assert!(text.contains(wanted), "{wanted:?} not in\n{text}");
        }
        assert!(
            view::snapshot_inventory(&view).claims.is_empty(),
            "the claim was released"
        );
    }
}
