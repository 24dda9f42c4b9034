//! The claim lifecycle as the kubelet calls it: held until the agent owns the node, timed for
//! the metrics, and logged with the CPUs each claim got or gave back.

use std::sync::Arc;

use kube_dra::EventRecorder;
use kubelet_plugin::{ClaimHandler, ClaimRef, PrepareResults, RequestError, UnprepareResults};
use resmgr::{claims::HOLD, dra_handler::LifecycleHandler};
use tokio::time::Instant;
use tracing::info;

use super::node::{Node, Standing};
use crate::{metrics::Metrics, view};

/// The claim lifecycle as the kubelet calls it. The kubelet plugin may serve before the agent
/// owns the node (it registers early when it takes the node over from another agent): a call
/// is then held until the agent owns it and the runtime has synchronized, [`HOLD`] in all, and
/// only then refused. Timed for the metrics, and logged with the CPUs each claim got or gave
/// back (the manager logs claims by device; only the binary can ask the policy which CPUs
/// those are).
#[derive(Debug)]
pub struct Measured {
    pub node: Arc<Node>,
    pub recorder: Arc<dyn EventRecorder>,
    pub metrics: Arc<Metrics>,
}

impl Measured {
    /// The manager's lifecycle, once the agent owns the node (waiting until `deadline`).
    async fn lifecycle(&self, deadline: Instant) -> Result<LifecycleHandler, RequestError> {
        match self.node.manager_until(deadline).await {
            Some(manager) => {
                Ok(LifecycleHandler::new(manager).with_recorder(self.recorder.clone()))
            }
            None => Err(RequestError::Unavailable(match self.node.standing() {
                Standing::TakingOver { from } => format!(
                    "this agent is still taking the node over from the agent of pod {from} (the call was held {}s)",
                    HOLD.as_secs()
                ),
                Standing::Standby { why } => format!(
                    "another agent still owns the node ({why}); this one takes it once that agent is gone (the call was held {}s)",
                    HOLD.as_secs()
                ),
                Standing::Refused { why } => format!(
                    "the agent that owns the node will not hand it over to this one ({why}); this one no longer registers with the kubelet"
                ),
                other => format!(
                    "this agent does not own the node ({other:?}; the call was held {}s)",
                    HOLD.as_secs()
                ),
            })),
        }
    }
}

impl ClaimHandler for Measured {
    async fn prepare(&self, claims: &[ClaimRef]) -> Result<PrepareResults, RequestError> {
        let start = std::time::Instant::now();
        let deadline = Instant::now() + HOLD;
        let answer = match self.lifecycle(deadline).await {
            Ok(lifecycle) => lifecycle.prepare_until(claims, deadline).await,
            Err(refused) => Err(refused),
        };
        let (ok, failed) = outcome(&answer, claims.len());
        self.metrics
            .prepared(start.elapsed().as_secs_f64(), ok, failed);
        if let (Ok(results), Some(manager)) = (&answer, self.node.manager()) {
            let inventory = view::inventory(manager).await;
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
        let start = std::time::Instant::now();
        let deadline = Instant::now() + HOLD;
        let lifecycle = match self.lifecycle(deadline).await {
            Ok(lifecycle) => lifecycle,
            Err(refused) => {
                self.metrics.unprepared(start.elapsed().as_secs_f64(), 0);
                return Err(refused);
            }
        };
        let before = view::inventory(lifecycle.manager()).await;
        let answer = lifecycle.unprepare_until(claims, deadline).await;
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
    use kube_dra::fake::StaticClaims;
    use policy::{AllocationResult, Claim, Quantity, Topology, topology_aware::Config};

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
        let (manager, _) = start_manager(
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
            pod_claim_name: None,
        });
        let metrics = Arc::new(Metrics::new());
        let node = Arc::new(Node::default());
        node.own(manager.clone());
        let handler = Measured {
            node,
            recorder: Arc::new(kube_dra::NoEvents),
            metrics: metrics.clone(),
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
            view::inventory(&manager).await.claims.is_empty(),
            "the claim was released"
        );
    }
}
