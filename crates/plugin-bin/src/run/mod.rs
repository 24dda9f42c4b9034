//! `resmgr run`: the agent, built, then spawned, then drained.
//!
//! [`main`] does three things in turn. It builds ([`Agent::build`]): from the checked
//! [`RunConfig`], the state, topology, policy restore and CDI reconciliation (all in
//! [`Manager::start`]), the Kubernetes API client, the listeners of the HTTP endpoints; nothing
//! runs yet, and a failure here is a plain start-up error. It spawns ([`Agent::spawn`]) every
//! task into one [`Tasks`] set. It waits for the one reason to stop and drains
//! ([`Agent::drain`]).
//!
//! Start-up order, as the tasks follow it: the HTTP endpoints serve at once; the runtime
//! connection is retried with backoff while the runtime is not up; once the runtime has
//! synchronized and the claim gate is open, the kubelet plugin registers, and last our
//! ResourceSlices are published: the kubelet learns about us only once we can serve its calls,
//! and the scheduler learns about our devices only once the kubelet can reach us. With
//! `dra: false` (NRI-only mode) the agent stops after the claim gate: it builds no Kubernetes
//! client, registers nothing with the kubelet and publishes nothing, and is ready as soon as the
//! runtime has synchronized.
//!
//! Shutdown has one path, whatever stops the agent (SIGTERM or SIGINT, the runtime closing the
//! connection, a task failing; see [`tasks`]): the kubelet plugin deregisters (the registration
//! socket goes first) and answers the calls in flight, the HTTP servers and the publishers stop,
//! the state is saved under the manager's lock (so a lifecycle step in flight finishes first),
//! the runtime connection goes, and the process exits: 0 after a signal, 1 otherwise. Losing the
//! runtime is not survived: the gate never closes, so the agent restarts (the DaemonSet does it)
//! and synchronizes afresh.

mod measured;
pub mod node;
pub(crate) mod publish;
pub mod tasks;

use std::{
    future::Future,
    pin::Pin,
    process::ExitCode,
    sync::{Arc, OnceLock},
    time::Duration,
};

use anyhow::Context as _;
use kube_dra::{
    ClaimReader, EventRecorder, EventsConfig, KubeEvents, NoEvents, ResourceApiVersions,
    RetryPolicy, SlicePublisher, WaitingPods,
};
use kubelet_plugin::{KubeletConfig, KubeletPlugin, RegistrationState};
use policy::topology_aware::DeviceMode;
use resmgr::{
    Manager,
    faults::Faults,
    health::{HealthConfig, HealthMonitor},
    nri_plugin::{self, NriRuntime, ResmgrPlugin},
    state::StateFile,
};
use tokio::signal::unix::{SignalKind, signal};
use tracing::{error, info, warn};

use self::{
    measured::Measured,
    node::Node,
    tasks::{Stop, Tasks},
};
use crate::{
    config::{DraConfig, RunConfig, RunFlags},
    http::{self, Endpoints},
    logging, memory,
    metrics::Metrics,
};

/// First wait between attempts to reach the runtime; doubles up to [`MAX_RUNTIME_BACKOFF`].
const RUNTIME_BACKOFF: Duration = Duration::from_millis(250);
const MAX_RUNTIME_BACKOFF: Duration = Duration::from_secs(10);

/// How long the drain waits for the serving tasks (the kubelet's calls in flight) before it
/// saves the state anyway: within the DaemonSet's termination grace (30 s by default), so that
/// the save happens before the kubelet's SIGKILL.
const DRAIN_DEADLINE: Duration = Duration::from_secs(20);

/// How long the tasks that run until the exit get once the state is saved; they are dropped, not
/// asked, so they need no more than a moment.
const EXIT_DEADLINE: Duration = Duration::from_secs(1);

/// `resmgr run`. `faults` go to the manager and to both sides of a handover (none in the shipped
/// binary; see [`resmgr::faults`]).
pub fn main(
    flags: &RunFlags,
    node_name_env: Option<String>,
    pod_uid_env: Option<String>,
    pod_generation_env: Option<String>,
    faults: Faults,
) -> anyhow::Result<ExitCode> {
    let config = flags.resolve_env(node_name_env, pod_uid_env, pod_generation_env)?;
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
    let code = runtime.block_on(async {
        let tasks = Tasks::new();
        // Signals first, so that a SIGTERM during start-up is a clean stop too.
        tasks.spawn("signals", signals()?);
        let agent = Agent::build(config, faults).await?;
        let drain = agent.spawn(&tasks);
        let stop = tasks.stopped().await;
        drain.run(stop, &tasks).await
    });
    // What the libraries still run (the NRI connection's own tasks) goes with the runtime.
    runtime.shutdown_timeout(Duration::from_secs(1));
    code
}

/// The signal listener's task: ends, stopping the agent, at the first SIGTERM or SIGINT.
fn signals() -> anyhow::Result<impl Future<Output = Result<(), Stop>>> {
    let mut sigterm = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut sigint = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    Ok(async move {
        let name = tokio::select! {
            _ = sigterm.recv() => "SIGTERM",
            _ = sigint.recv() => "SIGINT",
        };
        Err(Stop::Signal(name))
    })
}

/// Everything `resmgr run` runs, built from the configuration; nothing started, and nothing of
/// the node taken yet (its state directory is the node task's to take: [`node`]).
struct Agent {
    config: RunConfig,
    /// The policy, restored from the state once the node is taken.
    policy: Box<dyn policy::Policy>,
    claims: Arc<dyn ClaimReader>,
    recorder: Arc<dyn EventRecorder>,
    runtime: Arc<NriRuntime>,
    metrics: Arc<Metrics>,
    servers: Vec<http::Server>,
    node: Arc<Node>,
    /// `None` without DRA.
    dra: Option<Dra>,
}

/// What serving DRA claims needs besides the manager: the kubelet and the API server.
struct Dra {
    kubelet: KubeletConfig,
    health: HealthConfig,
    device_mode: DeviceMode,
    recorder: Arc<dyn EventRecorder>,
    /// The Events poster, run until the exit: the runtime's events are answered (and containers
    /// refused) until then.
    poster: Pin<Box<dyn Future<Output = ()> + Send>>,
    publisher: SlicePublisher,
    /// Set once the devices are being published, for the endpoints.
    publishing: Arc<OnceLock<SlicePublisher>>,
    /// The node's pods that wait for their claims, marked once the agent serves
    /// (`retry-waiting-pods`).
    waiting: Option<WaitingPods>,
}

impl Dra {
    /// The API client and what the agent does with it, for `settings`: the parts that serve
    /// claims, the claim reader, and the Events poster (also the recorder of what the agent
    /// posts).
    async fn build(
        settings: &DraConfig,
        publishing: Arc<OnceLock<SlicePublisher>>,
    ) -> anyhow::Result<(Self, Arc<dyn ClaimReader>, KubeEvents)> {
        let client = kube_dra::connect(settings.kubeconfig.as_deref())
            .await
            .context("the Kubernetes API client")?;
        let driver = &settings.kubelet.driver_name;
        let waiting = settings
            .retry_waiting_pods
            .then(|| WaitingPods::new(client.clone(), settings.node_name.clone(), driver));
        let versions = Arc::new(ResourceApiVersions::discover(client));
        let claims = Arc::new(kube_dra::KubeClaimReader::new(
            versions.clone(),
            driver,
            RetryPolicy::default(),
        ));
        let (events, poster) = KubeEvents::new(
            versions.clone(),
            EventsConfig::new(driver, settings.node_name.clone()),
        );
        let recorder: Arc<dyn EventRecorder> = Arc::new(events.clone());
        let publisher = SlicePublisher::new(settings.publisher.clone(), versions)
            .context("the resource slice publisher")?
            .with_recorder(recorder.clone());
        let dra = Self {
            kubelet: settings.kubelet.clone(),
            health: settings.health.clone(),
            device_mode: settings.device_mode,
            recorder,
            poster: Box::pin(poster),
            publisher,
            publishing,
            waiting,
        };
        Ok((dra, claims, events))
    }
}

impl Agent {
    /// Builds the agent. What fails here fails before anything runs: the machine (topology),
    /// the API client's configuration, the listeners. The state is not read yet.
    async fn build(config: RunConfig, faults: Faults) -> anyhow::Result<Self> {
        info!(config = %config.to_json(), "starting");
        let policy = config.policy()?;
        let publishing = Arc::new(OnceLock::new());
        // Without DRA, nothing reads claims (the kubelet never calls us): an empty reader stands
        // in, and refusals are only logged (there is no API server to post Events to).
        let (claims, events, dra): (Arc<dyn ClaimReader>, _, _) = match &config.dra {
            Some(settings) => {
                let (dra, claims, events) = Dra::build(settings, publishing.clone()).await?;
                (claims, Some(events), Some(dra))
            }
            None => (Arc::new(kube_dra::NoClaims), None, None),
        };
        let recorder: Arc<dyn EventRecorder> = match &events {
            Some(events) => Arc::new(events.clone()),
            None => Arc::new(NoEvents),
        };
        // The spec directory's setting is checked before anything runs.
        config
            .spec_store()
            .with_context(|| format!("--cdi-dir {}", config.cdi_dir.display()))?;

        let node = Arc::new(Node::new(faults));
        let metrics = Arc::new(Metrics::new());
        let endpoints = Endpoints {
            node_name: config.dra.as_ref().map(|dra| dra.node_name.clone()),
            driver: config.driver_name.clone(),
            node: node.clone(),
            metrics: metrics.clone(),
            publisher: publishing,
            events,
        };
        let mut servers = vec![http::metrics_server(
            config.metrics_addr,
            endpoints.clone(),
        )?];
        info!(addr = %servers[0].addr()?, "serving /metrics, /healthz and /readyz");
        if let Some(addr) = config.debug_addr {
            let server = http::debug_server(addr, endpoints)?;
            info!(addr = %server.addr()?, "serving /debug/state");
            servers.push(server);
        }

        Ok(Self {
            config,
            policy,
            claims,
            recorder,
            runtime: Arc::new(NriRuntime::default()),
            metrics,
            servers,
            node,
            dra,
        })
    }

    /// Spawns every task of the agent into `tasks`; returns what the drain needs.
    fn spawn(self, tasks: &Tasks) -> Drain {
        let Self {
            config,
            policy,
            claims,
            recorder,
            runtime,
            metrics,
            servers,
            node,
            dra,
        } = self;
        for server in servers {
            let stopping = tasks.clone();
            let name = server.name();
            tasks.spawn_graceful(name, async move {
                server
                    .serve(async move { stopping.stopping().await })
                    .await
                    .map_err(|e| Stop::failed(name, e))
            });
        }
        tasks.spawn_graceful(
            "claims",
            serve_claims(node.clone(), metrics.clone(), dra, tasks.clone()),
        );
        let owning = Owning {
            config,
            policy,
            claims,
            recorder,
            runtime,
            metrics,
            node: node.clone(),
        };
        tasks.spawn_until_exit("node", owning.run(tasks.clone()));
        Drain { node }
    }
}

/// What the node task needs to take the node and serve the runtime.
struct Owning {
    config: RunConfig,
    policy: Box<dyn policy::Policy>,
    claims: Arc<dyn ClaimReader>,
    recorder: Arc<dyn EventRecorder>,
    runtime: Arc<NriRuntime>,
    metrics: Arc<Metrics>,
    node: Arc<Node>,
}

impl Owning {
    /// The node task: takes the node (at once, or from the agent that owns it), starts the
    /// manager from the state on disk, serves handovers to the next agent, reaches the runtime
    /// (retrying while it is not there, until the agent stops), then serves it until the exit.
    /// Ends the agent when the runtime goes away, unless the node was handed over.
    async fn run(self, tasks: Tasks) -> Result<(), Stop> {
        let Self {
            config,
            policy,
            claims,
            recorder,
            runtime,
            metrics,
            node,
        } = self;
        let state_file = StateFile::new(&config.state_dir);
        let pod = config.pod_uid.as_ref().map(|uid| {
            resmgr::handover::Hello::new(uid.clone()).with_generation(config.pod_generation)
        });
        let taken = tokio::select! {
            taken = node.take(&state_file, pod.as_ref(), config.dra.is_some()) => taken,
            () = tasks.stopping() => return Ok(()),
        };
        let (lock, predecessors) = taken.map_err(|e| Stop::failed("node", e))?;
        let manager = start_manager(
            &config,
            node.faults(),
            lock,
            policy,
            state_file,
            &runtime,
            claims,
            &recorder,
        )
        .await
        .map_err(|e| Stop::failed("node", e))?;
        node.own(manager.clone());
        if let Some(pod) = &pod {
            let owner = resmgr::handover::Owner::bind(
                &config.state_dir,
                pod,
                predecessors,
                node.faults().clone(),
            )
            .context("serving handovers")
            .map_err(|e| Stop::failed("node", e))?;
            info!(socket = %owner.path().display(), "this agent owns the node; a new agent may ask for it");
            let (node, manager) = (node.clone(), manager.clone());
            tasks.spawn("handover", async move {
                node.serve_handovers(owner, manager)
                    .await
                    .map_err(|e| Stop::failed("handover", e))
            });
        }
        let plugin = ResmgrPlugin::new(manager, metrics).with_recorder(recorder);
        let surrender = node.surrender.clone();
        let connection = tokio::select! {
            connection = connect_runtime(&config, plugin, &runtime) => connection
                .map_err(|e| Stop::failed("runtime connection", e))?,
            () = tasks.stopping() => return Ok(()),
            () = surrender.cancelled() => {
                node.runtime_closed.send_replace(true);
                return Ok(());
            }
        };
        let handle = connection.handle().clone();
        tokio::select! {
            why = connection.serve() => {
                if surrender.is_cancelled() {
                    node.runtime_closed.send_replace(true);
                    return Ok(());
                }
                Err(Stop::RuntimeLost(why.to_string()))
            }
            () = surrender.cancelled() => {
                // Handing the node over: the new agent connects once this one is gone.
                handle.close();
                let why = handle.closed().await;
                info!(reason = %why, "closed the runtime connection for the handover");
                node.runtime_closed.send_replace(true);
                Ok(())
            }
        }
    }
}

/// Starts the manager from the state on disk, the state directory's lock held.
#[allow(clippy::too_many_arguments)] // each part of the manager, once
async fn start_manager(
    config: &RunConfig,
    faults: &Faults,
    lock: resmgr::state::StateLock,
    policy: Box<dyn policy::Policy>,
    state_file: StateFile,
    runtime: &Arc<NriRuntime>,
    claims: Arc<dyn ClaimReader>,
    recorder: &Arc<dyn EventRecorder>,
) -> anyhow::Result<Arc<Manager>> {
    let specs = config
        .spec_store()
        .with_context(|| format!("--cdi-dir {}", config.cdi_dir.display()))?;
    let manager = Arc::new(
        Manager::start_locked(
            lock,
            resmgr::ManagerConfig {
                faults: faults.clone(),
                ..config.manager()
            },
            policy,
            state_file,
            specs,
            runtime.clone(),
            claims,
        )
        .context("starting the resource manager")?
        .with_recorder(recorder.clone()),
    );
    if config.dra.is_none() {
        let held = manager.claim_records().await.len();
        if held > 0 {
            warn!(
                claims = held,
                "DRA is off, yet the state holds prepared claims: they keep their CPUs until DRA is on again and the kubelet unprepares them"
            );
        }
    }
    Ok(manager)
}

/// Reaches the runtime's NRI socket, retrying with backoff while it is not there, and registers
/// `plugin` with it. The manager opens the claim gate once the Synchronize reply is out.
async fn connect_runtime(
    config: &RunConfig,
    plugin: ResmgrPlugin,
    runtime: &NriRuntime,
) -> anyhow::Result<nri_plugin::Connection> {
    let mut backoff = RUNTIME_BACKOFF;
    while !config.nri_socket.exists() {
        warn!(
            socket = %config.nri_socket.display(),
            retry_in = ?backoff,
            "waiting for the container runtime: its NRI socket is not there yet"
        );
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(MAX_RUNTIME_BACKOFF);
    }
    let endpoint = nri::Endpoint::Socket(config.nri_socket.clone());
    let connection = nri_plugin::connect(plugin, runtime, config.nri_stub(), endpoint)
        .await
        .with_context(|| {
            format!(
                "--nri-socket {}: registering with the runtime",
                config.nri_socket.display()
            )
        })?;
    info!(socket = %config.nri_socket.display(), "registered with the container runtime");
    Ok(connection)
}

/// The claims' task. With DRA: starts the kubelet plugin as soon as the node task says (at
/// once when the node is free, early when taking it over: the kubelet's calls are held until
/// the agent owns the node and the runtime has synchronized), publishes our devices once the
/// claim gate is open, and serves until the agent stops or hands the node over; then
/// deregisters and answers the calls in flight. Once the gate is open it gives back the memory
/// Synchronize left free.
async fn serve_claims(
    node: Arc<Node>,
    metrics: Arc<Metrics>,
    dra: Option<Dra>,
    tasks: Tasks,
) -> Result<(), Stop> {
    let Some(dra) = dra else {
        tokio::select! {
            () = node.opened() => memory::return_freed_memory(),
            () = tasks.stopping() => return Ok(()),
        }
        info!(
            "DRA is off: serving the runtime only (no kubelet registration, no devices published)"
        );
        return Ok(());
    };
    let Dra {
        kubelet,
        health,
        device_mode,
        recorder,
        poster,
        publisher,
        publishing,
        waiting,
    } = dra;
    let mut registration = tokio::select! {
        r = node.registering() => r,
        () = tasks.stopping() => return Ok(()),
    };
    tasks.spawn_until_exit("event poster", async move {
        poster.await;
        Ok(())
    });
    // The health poll runs here, not in a task of its own: the kubelet's health streams read
    // it until the plugin has shut down.
    // Its first report comes before this agent owns the node (no devices yet): it reports them
    // as soon as it does, refreshed below, not a poll later, when the kubelet would have shown
    // the devices of pods started meanwhile as Unknown.
    let devices_appeared = Arc::new(tokio::sync::Notify::new());
    let monitor = HealthMonitor::new(health, {
        let node = node.clone();
        move || {
            node.manager()
                .map(|m| (*m.snapshot().device_cpus).clone())
                .unwrap_or_default()
        }
    })
    .with_device_nodes({
        let node = node.clone();
        move || {
            node.manager()
                .map(|m| publish::device_nodes(&m.snapshot()))
                .unwrap_or_default()
        }
    })
    .refresh_on(devices_appeared.clone());
    let faults = monitor.faults();
    let (reports, poll) = monitor.start();
    let taints = resmgr::taints::Taints::new(kubelet.driver_name.clone());
    let tainted_recorder = recorder.clone();
    let mut poll = std::pin::pin!(poll);
    let handler = Arc::new(Measured {
        node: node.clone(),
        recorder,
        metrics: metrics.clone(),
    });
    let serve = async {
        node.opened().await;
        devices_appeared.notify_one();
        memory::return_freed_memory();
        let Some(manager) = node.manager().cloned() else {
            return;
        };
        if let Some(waiting) = &waiting {
            retry_waiting_pods(waiting, &node).await;
        }
        let _ = publishing.set(publisher.clone());
        tokio::join!(
            publish::publish(
                publisher.clone(),
                manager.published(),
                publish::Tainting {
                    faults,
                    taints,
                    recorder: tainted_recorder,
                },
            ),
            publisher.maintain(),
            publish::watch_dropped_fields(publisher.dropped_fields(), device_mode, metrics),
        );
    };
    let mut serve = std::pin::pin!(serve);
    // Registered until the agent stops or hands the node over. Deregistered if the agent that
    // owns the node refuses this one (it was in standby, registered, when it could not ask),
    // until the node is free.
    loop {
        let plugin = KubeletPlugin::start_with_health(&kubelet, handler.clone(), reports.clone())
            .await
            .context("starting the kubelet plugin")
            .map_err(|e| Stop::failed("kubelet plugin", e))?;
        node.kubelet_serves(node::Kubelet {
            registration: plugin.registration_state(),
            connections: plugin.dra_connections(),
        });
        let again = tokio::select! {
            () = tasks.stopping() => false,
            () = node.handed_over() => {
                info!("handed the node over: deregistering from the kubelet");
                false
            }
            () = node.registration_ends(registration) => {
                info!("deregistering from the kubelet until the node is free");
                true
            }
            // It ends only once every stream is gone, which the plugin's own do not before it is.
            () = &mut poll => {
                tasks.stopping().await;
                false
            }
            () = &mut serve => false,
        };
        if let Err(e) = plugin.shutdown().await {
            warn!(error = %stdx::errors::chain(&e), "stopping the kubelet plugin");
        }
        if !again {
            return Ok(());
        }
        registration = tokio::select! {
            r = node.registering() => r,
            () = tasks.stopping() => return Ok(()),
        };
    }
}

/// Once the kubelet has registered the agent, marks the node's pods that wait for their claims,
/// so that the kubelet prepares them now rather than at its next resync (`retry-waiting-pods`).
async fn retry_waiting_pods(waiting: &WaitingPods, node: &Node) {
    if let Some(kubelet) = node.kubelet() {
        let mut registration = kubelet.registration;
        let registered = registration.wait_for(|r| *r == RegistrationState::Registered);
        if tokio::time::timeout(Duration::from_secs(30), registered)
            .await
            .is_err()
        {
            warn!(
                "the kubelet has not registered the agent within 30 s; marking the waiting pods anyway"
            );
        }
    }
    // Seconds since the epoch: a value that differs at every start, which is what makes the
    // kubelet see an update.
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
        .to_string();
    if let Err(e) = waiting.retry(&stamp).await {
        warn!(error = %stdx::errors::chain(&e), "marking the pods that wait for their claims failed: the kubelet prepares them at its next resync");
    }
}

/// The end of the agent: what the drain needs once every task is spawned.
#[derive(Debug)]
struct Drain {
    node: Arc<Node>,
}

impl Drain {
    /// The one way out: the serving tasks stop, the state is saved (unless the agent never
    /// owned the node, or handed it over), the runtime connection goes, and the exit status
    /// says why (a failure is returned, for `main` to print).
    async fn run(self, stop: Stop, tasks: &Tasks) -> anyhow::Result<ExitCode> {
        let late = tasks.drain_serving(DRAIN_DEADLINE).await;
        if !late.is_empty() {
            warn!(tasks = ?late, deadline = ?DRAIN_DEADLINE, "tasks still running at the drain's deadline were dropped");
        }
        if let Some(manager) = self.node.manager() {
            manager.save_state().await.context("saving the state")?;
            info!("state saved");
        }
        let late = tasks.drain_lasting(EXIT_DEADLINE).await;
        if !late.is_empty() {
            warn!(tasks = ?late, "tasks still running at the exit were dropped");
        }
        match stop {
            Stop::Signal(name) => {
                info!(signal = name, "stopped");
                Ok(ExitCode::SUCCESS)
            }
            Stop::RuntimeLost(why) => {
                error!(reason = %why, "lost the runtime connection: exiting to be restarted");
                Ok(ExitCode::FAILURE)
            }
            Stop::Failed { error, .. } => Err(error),
        }
    }
}
