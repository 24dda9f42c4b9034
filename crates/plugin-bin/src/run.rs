//! `resmgr run`: the agent, wired in the order the design needs.
//!
//! Start-up: state, topology, policy restore and CDI reconciliation (all in
//! [`resmgr::Manager::start`]), the HTTP endpoints, the NRI connection (retried with backoff
//! while the runtime is not up), the runtime's Synchronize, the claim gate, kubelet plugin
//! registration, and last ResourceSlice publication: the kubelet learns about us only once we can
//! serve its calls, and the scheduler learns about our devices only once the kubelet can reach
//! us.
//!
//! With `dra: false` (NRI-only mode) the agent stops after the claim gate: it builds no
//! Kubernetes client, registers nothing with the kubelet and publishes nothing, and is ready as
//! soon as the runtime has synchronized.
//!
//! Shutdown on SIGTERM (or SIGINT): deregister from the kubelet (the registration socket goes
//! first), stop accepting claims and answer the calls in flight (the DRA server stops
//! gracefully), save the state under the manager's lock (so a lifecycle step in flight finishes
//! first), exit 0. Losing the runtime connection ends the process with a non-zero status: the
//! gate never closes, so the agent restarts (the DaemonSet does it) and synchronizes afresh.

use std::{
    process::ExitCode,
    sync::{Arc, OnceLock},
    time::Duration,
};

use anyhow::Context as _;
use policy::{
    Topology,
    topology_aware::{Config, DeviceMode, ReservedCpus},
};
use resmgr::{
    Manager, ManagerConfig, ReconcileConfig,
    dra_handler::LifecycleHandler,
    kube::{
        self, EventRecorder, EventsConfig, KubeEvents, NoEvents, PublisherConfig,
        ResourceApiVersions, RetryPolicy, SlicePublisher,
    },
    kubelet_plugin::{
        ClaimHandler, ClaimRef, KubeletConfig, KubeletPlugin, PrepareResults, RequestError,
        UnprepareResults,
    },
    nri,
    nri_plugin::{self, NriRuntime, ResmgrPlugin},
    policy::cdi,
    state::StateFile,
};
use tokio::{
    signal::unix::{SignalKind, signal},
    sync::watch,
};
use tracing::{error, info, warn};

use crate::{
    config::{RunConfig, RunFlags},
    http::{self, Endpoints},
    logging, memory,
    metrics::Metrics,
    policy_choice, values, view,
};

/// First wait between attempts to reach the runtime; doubles up to [`MAX_RUNTIME_BACKOFF`].
const RUNTIME_BACKOFF: Duration = Duration::from_millis(250);
const MAX_RUNTIME_BACKOFF: Duration = Duration::from_secs(10);

pub fn main(flags: &RunFlags, node_name_env: Option<String>) -> anyhow::Result<ExitCode> {
    let config = flags.resolve(node_name_env)?;
    if flags.print_config {
        print!("{}", config.to_file());
        return Ok(ExitCode::SUCCESS);
    }
    logging::init(config.log_format, &config.log_level);
    memory::one_malloc_arena();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let code = runtime.block_on(agent(config))?;
    // Tasks still running (the retry loop, the slice watcher) are dropped with the runtime.
    runtime.shutdown_timeout(Duration::from_secs(1));
    Ok(code)
}

/// Why the agent stops.
#[derive(Debug)]
enum Stop {
    Signal(&'static str),
    RuntimeLost(String),
}

async fn agent(config: RunConfig) -> anyhow::Result<ExitCode> {
    info!(config = %config.to_json(), "starting");
    // Signals are installed first, so that a SIGTERM during start-up is a clean stop too.
    let mut sigterm = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut sigint = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    let (stop_tx, stop_rx) = watch::channel(None::<&'static str>);
    tokio::spawn(async move {
        let name = tokio::select! {
            _ = sigterm.recv() => "SIGTERM",
            _ = sigint.recv() => "SIGINT",
        };
        info!(signal = name, "stopping");
        let _ = stop_tx.send(Some(name));
    });

    // State, topology, policy restore, CDI reconciliation.
    let policy = build_policy(&config)?;
    // Without DRA, nothing reads claims (the kubelet never calls us): an empty reader stands in,
    // and refusals are only logged (there is no API server to post Events to).
    let (versions, claims, kube_events): (_, Arc<dyn resmgr::ClaimReader>, _) = if config.dra {
        let client = kube::connect(config.kubeconfig.as_deref())
            .await
            .context("the Kubernetes API client")?;
        let versions = Arc::new(ResourceApiVersions::discover(client));
        let claims = Arc::new(kube::KubeClaimReader::new(
            versions.clone(),
            &config.driver_name,
            RetryPolicy::default(),
        ));
        let events = KubeEvents::start(
            versions.clone(),
            EventsConfig::new(
                &config.driver_name,
                config.node_name.clone().unwrap_or_default(),
            ),
        );
        (Some(versions), claims, Some(events))
    } else {
        (None, Arc::new(kube::fake::StaticClaims::new()), None)
    };
    let events: Arc<dyn EventRecorder> = match &kube_events {
        Some(events) => Arc::new(events.clone()),
        None => Arc::new(NoEvents),
    };
    let nri_runtime = Arc::new(NriRuntime::default());
    let specs = cdi::SpecStore::new(&config.cdi_dir, &config.driver_name)
        .with_context(|| format!("--cdi-dir {}", config.cdi_dir.display()))?;
    let manager = Arc::new(
        Manager::start(
            ManagerConfig {
                reconcile: ReconcileConfig {
                    // Our slices publish in a pool named after the node.
                    pool: config.dra.then(|| config.node_name.clone()).flatten(),
                    grace: config.unconfirmed_claim_grace,
                    period: (config.unconfirmed_claim_grace / 4)
                        .clamp(Duration::from_millis(100), Duration::from_secs(30)),
                },
                ..ManagerConfig::new(&config.driver_name)
            },
            policy,
            StateFile::new(&config.state_dir),
            specs,
            nri_runtime.clone(),
            claims,
        )
        .context("starting the resource manager")?
        .with_events(events.clone()),
    );

    if !config.dra {
        let held = manager.claim_records().await.len();
        if held > 0 {
            warn!(
                claims = held,
                "DRA is off, yet the state holds prepared claims: they keep their CPUs until DRA is on again and the kubelet unprepares them"
            );
        }
    }

    // Observability.
    let metrics = Arc::new(Metrics::new());
    let registration = Arc::new(OnceLock::new());
    let publishing = Arc::new(OnceLock::new());
    let endpoints = Endpoints {
        dra: config.dra,
        node: config.node_name.clone().unwrap_or_default(),
        driver: config.driver_name.clone(),
        manager: manager.clone(),
        metrics: metrics.clone(),
        registration: registration.clone(),
        publisher: publishing.clone(),
        events: kube_events,
    };
    let http_stop = stopped(stop_rx.clone());
    let (addr, metrics_task) = http::serve(config.metrics_addr, endpoints.clone(), async move {
        http_stop.await;
    })
    .await?;
    info!(addr = %addr, "serving /metrics, /healthz and /readyz");
    let mut http_task = HttpTasks(vec![metrics_task]);
    if let Some(debug_addr) = config.debug_addr {
        let debug_stop = stopped(stop_rx.clone());
        let (addr, task) = http::serve_debug(debug_addr, endpoints, async move {
            debug_stop.await;
        })
        .await?;
        info!(addr = %addr, "serving /debug/state");
        http_task.0.push(task);
    }

    // The runtime. Until it answers, nothing else may start: claims need the gate.
    let connection = tokio::select! {
        c = connect_runtime(&config, &manager, &nri_runtime, metrics.clone(), &events) => c?,
        name = stopped(stop_rx.clone()) => {
            finish(&manager, None).await?;
            http_task.join().await;
            info!(signal = name, "stopped before the runtime connected");
            return Ok(ExitCode::SUCCESS);
        }
    };
    tokio::select! {
        () = manager.gate().opened() => memory::return_freed_memory(),
        why = connection.closed() => {
            error!(reason = %why, "lost the runtime connection before it synchronized");
            finish(&manager, None).await?;
            return Ok(ExitCode::FAILURE);
        }
        name = stopped(stop_rx.clone()) => {
            finish(&manager, None).await?;
            info!(signal = name, "stopped while synchronizing with the runtime");
            return Ok(ExitCode::SUCCESS);
        }
    }

    // The kubelet, then the API server; neither without DRA.
    let (Some(versions), Some(node_name)) = (versions, config.node_name.clone()) else {
        info!(
            "DRA is off: serving the runtime only (no kubelet registration, no devices published)"
        );
        let stop = tokio::select! {
            name = stopped(stop_rx.clone()) => Stop::Signal(name),
            why = connection.closed() => Stop::RuntimeLost(why),
        };
        return end(stop, &manager, None, http_task).await;
    };
    let kubelet_config = KubeletConfig {
        driver_name: config.driver_name.clone(),
        plugins_dir: config.kubelet_plugins_dir.clone(),
        registry_dir: config.kubelet_registry_dir.clone(),
    };
    let handler = Arc::new(Measured {
        inner: LifecycleHandler::new(manager.clone()).with_events(events.clone()),
        metrics: metrics.clone(),
        manager: manager.clone(),
    });
    // Device health for the kubelet: online CPUs from this machine's sysfs, unless the topology
    // is not this machine's.
    let health = resmgr::health::HealthMonitor::new(
        resmgr::health::HealthConfig {
            sysfs_root: matches!(config.topology, policy::TopologySource::Live)
                .then(|| "/sys".into()),
            ..resmgr::health::HealthConfig::new(&node_name)
        },
        {
            let manager = manager.clone();
            move || manager.snapshot().device_cpus.clone()
        },
    );
    let plugin = KubeletPlugin::start_with_health(&kubelet_config, handler, health.spawn())
        .await
        .context("starting the kubelet plugin")?;
    let _ = registration.set(plugin.registration_state());
    let publisher = SlicePublisher::new(publisher_config(&config, &node_name), versions)
        .map_err(|e| anyhow::anyhow!("--node-name/--driver-name: {e}"))?;
    let _ = publishing.set(publisher.clone());
    let watcher = tokio::spawn(watch_dropped_fields(
        publisher.dropped_fields(),
        config.policy.1.mode,
        metrics.clone(),
    ));
    // The devices as the manager publishes them after every change; a change of them (a claim
    // on a device of an earlier configuration gave back CPUs the devices withheld) is
    // republished.
    let mut snapshots = manager.published();
    let mut published = Vec::new();
    let first = snapshots.borrow_and_update().devices.clone();
    match first {
        Ok(devices) => {
            use kube::DevicePublisher as _;
            published.clone_from(&devices);
            match publisher.publish(devices).await {
                Ok(report) => info!(?report, "published our devices"),
                // The maintainer below retries.
                Err(e) => {
                    warn!(error = %resmgr::errors::chain(&e), "publishing our devices failed; retrying")
                }
            }
        }
        Err(e) => warn!(error = %e, "the policy publishes no devices"),
    }
    let republisher = {
        let publisher = publisher.clone();
        tokio::spawn(async move {
            while snapshots.changed().await.is_ok() {
                let devices = snapshots.borrow_and_update().devices.clone();
                republish_if_changed(devices, &publisher, &mut published).await;
            }
        })
    };
    let maintainer = tokio::spawn(async move { publisher.maintain().await });

    let stop = tokio::select! {
        name = stopped(stop_rx.clone()) => Stop::Signal(name),
        why = connection.closed() => Stop::RuntimeLost(why),
    };
    maintainer.abort();
    republisher.abort();
    watcher.abort();
    end(stop, &manager, Some(plugin), http_task).await
}

/// The last steps of a stop: deregister, save, stop serving, and the exit status.
async fn end(
    stop: Stop,
    manager: &Manager,
    plugin: Option<KubeletPlugin>,
    http_task: HttpTasks,
) -> anyhow::Result<ExitCode> {
    finish(manager, plugin).await?;
    if matches!(stop, Stop::RuntimeLost(_)) {
        // The endpoints stop on a signal by themselves; without one they would serve forever.
        http_task.abort();
    }
    http_task.join().await;
    match stop {
        Stop::Signal(name) => {
            info!(signal = name, "stopped");
            Ok(ExitCode::SUCCESS)
        }
        Stop::RuntimeLost(why) => {
            error!(reason = %why, "lost the runtime connection: exiting to be restarted");
            Ok(ExitCode::FAILURE)
        }
    }
}

/// Publishes `devices` (the policy's, from the manager's snapshot) if they differ from
/// `published` (the last ones), which they do when a claim on a device of an earlier
/// configuration gave back CPUs the devices withheld. A failure leaves the maintainer retrying
/// the new devices. Returns what was published.
async fn republish_if_changed(
    devices: Result<Vec<policy::Device>, policy::PolicyError>,
    publisher: &impl kube::DevicePublisher,
    published: &mut Vec<policy::Device>,
) -> Option<Vec<policy::Device>> {
    let devices = devices.ok()?;
    if devices == *published {
        return None;
    }
    published.clone_from(&devices);
    match publisher.publish(devices.clone()).await {
        Ok(report) => info!(
            ?report,
            "republished our devices: a claim gave back withheld cpus"
        ),
        Err(e) => {
            warn!(error = %resmgr::errors::chain(&e), "republishing our devices failed; retrying")
        }
    }
    Some(devices)
}

/// Exports the fields the API server drops from our slices as metrics, and says once, as an
/// error, when that makes the device model wrong for the cluster.
async fn watch_dropped_fields(
    mut dropped: tokio::sync::watch::Receiver<std::collections::BTreeSet<String>>,
    mode: DeviceMode,
    metrics: Arc<Metrics>,
) {
    let mut told = false;
    loop {
        let fields = dropped.borrow_and_update().clone();
        for field in &fields {
            metrics.slice_field_dropped(field);
        }
        if !told && let Some(advice) = dropped_capacity_advice(mode, &fields) {
            error!(fields = ?fields, "{advice}");
            told = true;
        }
        if dropped.changed().await.is_err() {
            return;
        }
    }
}

/// What to tell the operator when the API server drops consumable capacity (the
/// `DRAConsumableCapacity` gate is off) and grouped devices depend on it.
fn dropped_capacity_advice(
    mode: DeviceMode,
    fields: &std::collections::BTreeSet<String>,
) -> Option<&'static str> {
    let capacity = fields.iter().any(|f| {
        f == "devices[].allowMultipleAllocations"
            || (f.starts_with("devices[].capacity.") && f.ends_with(".requestPolicy"))
    });
    (capacity && mode == DeviceMode::Grouped).then_some(
        "the api server drops consumable capacity from our resource slices (DRAConsumableCapacity is off in this cluster): the scheduler hands each grouped device to one claim, which gets all of its cpus; set device-mode: individual for this cluster (or turn the gate on)",
    )
}

/// The agent's HTTP servers; they stop by themselves on a stop signal.
#[derive(Debug)]
struct HttpTasks(Vec<tokio::task::JoinHandle<()>>);

impl HttpTasks {
    fn abort(&self) {
        for task in &self.0 {
            task.abort();
        }
    }

    async fn join(self) {
        for task in self.0 {
            let _ = task.await;
        }
    }
}

/// Resolves with the signal's name once a stop signal arrived.
async fn stopped(mut rx: watch::Receiver<Option<&'static str>>) -> &'static str {
    // The sender lives in the signal task for the life of the process.
    let _ = rx.wait_for(Option::is_some).await;
    rx.borrow().unwrap_or("signal")
}

/// Deregisters from the kubelet (which also lets the calls in flight finish), then saves the
/// state under the manager's lock.
async fn finish(manager: &Manager, plugin: Option<KubeletPlugin>) -> anyhow::Result<()> {
    if let Some(plugin) = plugin
        && let Err(e) = plugin.shutdown().await
    {
        warn!(error = %resmgr::errors::chain(&e), "stopping the kubelet plugin");
    }
    manager.save_state().await.context("saving the state")?;
    info!("state saved");
    Ok(())
}

/// The runtime connection as `run` needs it.
trait Connection {
    /// Resolves with the reason once the runtime is gone.
    async fn closed(&self) -> String;
}

/// Reaches the runtime's NRI socket, retrying with backoff while it is not there.
async fn connect_runtime(
    config: &RunConfig,
    manager: &Arc<Manager>,
    runtime: &Arc<NriRuntime>,
    metrics: Arc<Metrics>,
    events: &Arc<dyn EventRecorder>,
) -> anyhow::Result<impl Connection> {
    let mut backoff = RUNTIME_BACKOFF;
    loop {
        if config.nri_socket.exists() {
            let plugin = ResmgrPlugin::new(manager.clone(), metrics).with_events(events.clone());
            return nri_connect(config, plugin, runtime).await;
        }
        warn!(
            socket = %config.nri_socket.display(),
            retry_in = ?backoff,
            "waiting for the container runtime: its NRI socket is not there yet"
        );
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(MAX_RUNTIME_BACKOFF);
    }
}

/// Registers `plugin` with the runtime as an external plugin named `resmgr` at the configured
/// index. The manager opens the claim gate by itself once the Synchronize reply is out.
async fn nri_connect(
    config: &RunConfig,
    plugin: ResmgrPlugin,
    runtime: &Arc<NriRuntime>,
) -> anyhow::Result<NriConnection> {
    let endpoint = nri::Endpoint::Socket(config.nri_socket.clone());
    let stub = nri::StubConfig::new("resmgr", config.nri_plugin_index.clone());
    let handle = nri_plugin::connect(plugin, runtime, stub, endpoint)
        .await
        .with_context(|| {
            format!(
                "--nri-socket {}: registering with the runtime",
                config.nri_socket.display()
            )
        })?;
    info!(socket = %config.nri_socket.display(), "registered with the container runtime");
    Ok(NriConnection(handle))
}

/// The live NRI connection.
#[derive(Debug)]
struct NriConnection(nri::Handle);

impl Connection for NriConnection {
    async fn closed(&self) -> String {
        self.0.closed().await.to_string()
    }
}

/// The claim lifecycle as the kubelet calls it, timed for the metrics, and logged with the CPUs
/// each claim got or gave back (the manager logs claims by device; only the binary can ask the
/// policy which CPUs those are).
#[derive(Debug)]
struct Measured {
    inner: LifecycleHandler,
    metrics: Arc<Metrics>,
    /// Whose snapshot says which CPUs each claim holds.
    manager: Arc<Manager>,
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

/// Refuses a reserved cpuset naming CPUs that are not online (the policy would drop them
/// silently).
/// The policy `config` asks for, on its topology, holding nothing yet.
pub fn build_policy(config: &RunConfig) -> anyhow::Result<Box<dyn policy::Policy>> {
    let topology = Topology::load(&config.topology).with_context(|| {
        format!(
            "{} {}",
            config.origin("topology"),
            values::show_topology(&config.topology)
        )
    })?;
    let reserved_key = match config.reserved_cpus {
        ReservedCpus::Set(_) => "reserved-cpus",
        ReservedCpus::Count(_) => "reserved-cpu-count",
    };
    check_reserved(&config.reserved_cpus, &topology)
        .map_err(|e| anyhow::anyhow!("{} {e}", config.origin(reserved_key)))?;
    #[allow(
        clippy::needless_update,
        reason = "settings the agent does not configure keep the policy's defaults"
    )]
    policy_choice::build(
        topology,
        Config {
            reserved_cpus: config.reserved_cpus.clone(),
            driver: config.driver_name.clone(),
            reserved_namespaces: config.reserved_namespaces.clone(),
            exclusivity: config.policy.0.clone(),
            devices: config.policy.1,
            memory: config.memory.clone(),
            ..Config::default()
        },
    )
    .map_err(|e| match e {
        policy::topology_aware::ConfigError::ClaimCpus(_) => {
            anyhow::anyhow!("{}: {e}", config.origin("claim-cpus"))
        }
        _ => anyhow::anyhow!("{}: {e}", config.origin(reserved_key)),
    })
}

/// What the publisher of `node_name`'s slices publishes, as `config` says.
pub fn publisher_config(config: &RunConfig, node_name: &str) -> PublisherConfig {
    PublisherConfig {
        node_allocatable_cpu: config
            .node_allocatable_cpu
            .then(kube::NodeAllocatableCpu::default),
        ..PublisherConfig::new(&config.driver_name, node_name)
    }
}

fn check_reserved(reserved: &ReservedCpus, topology: &Topology) -> anyhow::Result<()> {
    if let ReservedCpus::Set(set) = reserved {
        let missing = set.difference(&topology.online);
        if !missing.is_empty() {
            anyhow::bail!(
                "{set}: cpus {missing} are not online on this machine (online: {})",
                topology.online
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[tokio::test]
    async fn devices_withheld_for_a_claim_of_an_earlier_model_are_republished_when_it_goes() {
        use policy::topology_aware::{DeviceMode, DeviceModel};
        let topology = || {
            Topology::load(&policy::TopologySource::Synthetic(
                "pack:1 core:4 pu:1".into(),
            ))
            .unwrap()
        };
        // A claim of the grouped model, restored under the individual one.
        let mut grouped = policy_choice::build(topology(), Config::default()).unwrap();
        grouped
            .allocate_claim(&policy::Claim {
                uid: "u1".into(),
                results: vec![policy::AllocationResult {
                    request: "cpus".into(),
                    device: "numa0".into(),
                    consumed_capacity: [("cpu".to_owned(), policy::Quantity::from_units(2))].into(),
                    ..policy::AllocationResult::default()
                }],
                ..policy::Claim::default()
            })
            .unwrap();
        let individual = Config {
            devices: DeviceModel {
                mode: DeviceMode::Individual,
                ..DeviceModel::default()
            },
            ..Config::default()
        };
        let mut policy = policy_choice::build(topology(), individual).unwrap();
        policy.restore(&grouped.snapshot()).unwrap();
        let mut published = policy.devices().unwrap();
        assert_eq!(published.len(), 1, "cpu3 only: u1 holds 1-2");
        let publisher = resmgr::kube::fake::RecordingPublisher::new(crate::config::DEFAULT_DRIVER);
        assert_eq!(
            republish_if_changed(policy.devices(), &publisher, &mut published).await,
            None
        );
        policy.release_claim("u1").unwrap();
        let now = republish_if_changed(policy.devices(), &publisher, &mut published)
            .await
            .unwrap();
        assert_eq!(now.len(), 3);
        assert_eq!(publisher.current(), Some(now));
        assert_eq!(
            republish_if_changed(policy.devices(), &publisher, &mut published).await,
            None
        );
    }

    #[test]
    fn dropped_capacity_fields_call_for_individual_devices_only_when_grouped() {
        use super::{DeviceMode, dropped_capacity_advice};
        let fields = |list: &[&str]| list.iter().map(|f| (*f).to_owned()).collect();
        let dropped = fields(&["devices[].allowMultipleAllocations"]);
        let advice = dropped_capacity_advice(DeviceMode::Grouped, &dropped).unwrap();
        assert!(advice.contains("device-mode: individual"), "{advice}");
        let policy = fields(&["devices[].capacity.cpu.requestPolicy"]);
        assert!(dropped_capacity_advice(DeviceMode::Grouped, &policy).is_some());
        assert_eq!(
            dropped_capacity_advice(DeviceMode::Individual, &dropped),
            None
        );
        let other = fields(&["devices[].nodeAllocatableResourceMappings"]);
        assert_eq!(dropped_capacity_advice(DeviceMode::Grouped, &other), None);
    }

    use policy::{AllocationResult, Claim, Quantity};
    use resmgr::kube::fake::StaticClaims;

    use super::*;
    use crate::simulate::{Dirs, start_manager, world::SimRuntime};

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
