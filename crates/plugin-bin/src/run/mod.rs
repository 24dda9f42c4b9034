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
mod publish;
pub mod tasks;

use std::{
    future::Future,
    pin::Pin,
    process::ExitCode,
    sync::{Arc, OnceLock},
    time::Duration,
};

use anyhow::Context as _;
use policy::topology_aware::DeviceMode;
use resmgr::{
    ClaimReader, Manager,
    dra_handler::LifecycleHandler,
    health::{HealthConfig, HealthMonitor},
    kube_dra::{
        self, EventRecorder, EventsConfig, KubeEvents, NoEvents, ResourceApiVersions, RetryPolicy,
        SlicePublisher,
    },
    kubelet_plugin::{KubeletConfig, KubeletPlugin, RegistrationState},
    nri,
    nri_plugin::{self, NriRuntime, ResmgrPlugin},
    state::StateFile,
};
use tokio::{
    signal::unix::{SignalKind, signal},
    sync::watch,
};
use tracing::{error, info, warn};

use self::{
    measured::Measured,
    tasks::{Stop, Tasks},
};
use crate::{
    config::{RunConfig, RunFlags},
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
    let code = runtime.block_on(async {
        let tasks = Tasks::new();
        // Signals first, so that a SIGTERM during start-up is a clean stop too.
        tasks.spawn("signals", signals()?);
        let agent = Agent::build(config).await?;
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

/// Everything `resmgr run` runs, built from the configuration; nothing started.
struct Agent {
    config: RunConfig,
    manager: Arc<Manager>,
    runtime: Arc<NriRuntime>,
    plugin: ResmgrPlugin,
    metrics: Arc<Metrics>,
    servers: Vec<http::Server>,
    /// `None` without DRA.
    dra: Option<Dra>,
}

/// What serving DRA claims needs besides the manager: the kubelet and the API server.
struct Dra {
    kubelet: KubeletConfig,
    health: HealthConfig,
    events: Arc<dyn EventRecorder>,
    /// The Events poster, run until the exit: the runtime's events are answered (and containers
    /// refused) until then.
    poster: Pin<Box<dyn Future<Output = ()> + Send>>,
    publisher: SlicePublisher,
    /// Set once the kubelet plugin serves, for the endpoints.
    registration: Arc<OnceLock<watch::Receiver<RegistrationState>>>,
    /// Set once the devices are being published, for the endpoints.
    publishing: Arc<OnceLock<SlicePublisher>>,
}

impl Agent {
    /// Builds the agent. What fails here fails before anything runs: the machine (topology,
    /// state, specs), the API client's configuration, the listeners.
    async fn build(config: RunConfig) -> anyhow::Result<Self> {
        info!(config = %config.to_json(), "starting");
        let policy = config.policy()?;
        // Without DRA, nothing reads claims (the kubelet never calls us): an empty reader stands
        // in, and refusals are only logged (there is no API server to post Events to).
        let (versions, claims, kube_events): (_, Arc<dyn ClaimReader>, _) = match config.publisher()
        {
            Some(_) => {
                let client = kube_dra::connect(config.kubeconfig.as_deref())
                    .await
                    .context("the Kubernetes API client")?;
                let versions = Arc::new(ResourceApiVersions::discover(client));
                let claims = Arc::new(kube_dra::KubeClaimReader::new(
                    versions.clone(),
                    &config.driver_name,
                    RetryPolicy::default(),
                ));
                let events = KubeEvents::new(
                    versions.clone(),
                    EventsConfig::new(
                        &config.driver_name,
                        config.node_name.clone().unwrap_or_default(),
                    ),
                );
                (Some(versions), claims, Some(events))
            }
            None => (None, Arc::new(kube_dra::NoClaims), None),
        };
        let events: Arc<dyn EventRecorder> = match &kube_events {
            Some((events, _)) => Arc::new(events.clone()),
            None => Arc::new(NoEvents),
        };
        let runtime = Arc::new(NriRuntime::default());
        let specs = config
            .spec_store()
            .with_context(|| format!("--cdi-dir {}", config.cdi_dir.display()))?;
        let manager = Arc::new(
            Manager::start(
                config.manager(),
                policy,
                StateFile::new(&config.state_dir),
                specs,
                runtime.clone(),
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
            events: kube_events.as_ref().map(|(events, _)| events.clone()),
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

        let dra = match (versions, kube_events, config.publisher(), config.health()) {
            (Some(versions), Some((_, poster)), Some(publisher), Some(health)) => Some(Dra {
                kubelet: config.kubelet(),
                health,
                events: events.clone(),
                poster: Box::pin(poster),
                publisher: SlicePublisher::new(publisher, versions)
                    .context("the resource slice publisher")?
                    .with_events(events.clone()),
                registration,
                publishing,
            }),
            _ => None,
        };
        let plugin = ResmgrPlugin::new(manager.clone(), metrics.clone()).with_events(events);
        Ok(Self {
            config,
            manager,
            runtime,
            plugin,
            metrics,
            servers,
            dra,
        })
    }

    /// Spawns every task of the agent into `tasks`; returns what the drain needs.
    fn spawn(self, tasks: &Tasks) -> Drain {
        let Self {
            config,
            manager,
            runtime,
            plugin,
            metrics,
            servers,
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
        tasks.spawn_until_exit(
            "runtime connection",
            serve_runtime(config.clone(), plugin, runtime, tasks.clone()),
        );
        tasks.spawn_graceful(
            "claims",
            serve_claims(
                config.policy.1.mode,
                manager.clone(),
                metrics,
                dra,
                tasks.clone(),
            ),
        );
        Drain { manager }
    }
}

/// The runtime connection's task: reaches the runtime (retrying while it is not there, until the
/// agent stops), then serves it until the exit. Ends the agent when the runtime goes away.
async fn serve_runtime(
    config: RunConfig,
    plugin: ResmgrPlugin,
    runtime: Arc<NriRuntime>,
    tasks: Tasks,
) -> Result<(), Stop> {
    let connection = tokio::select! {
        connection = connect_runtime(&config, plugin, &runtime) => connection
            .map_err(|e| Stop::failed("runtime connection", e))?,
        () = tasks.stopping() => return Ok(()),
    };
    Err(Stop::RuntimeLost(resmgr::errors::chain(
        &connection.serve().await,
    )))
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

/// The claims' task: once the runtime has synchronized (the claim gate is open), gives back the
/// memory Synchronize left free and, with DRA, serves the kubelet and publishes our devices
/// until the agent stops, then deregisters and answers the calls in flight.
async fn serve_claims(
    mode: DeviceMode,
    manager: Arc<Manager>,
    metrics: Arc<Metrics>,
    dra: Option<Dra>,
    tasks: Tasks,
) -> Result<(), Stop> {
    // Claims need the gate, and the gate needs the runtime.
    tokio::select! {
        () = manager.gate().opened() => memory::return_freed_memory(),
        () = tasks.stopping() => return Ok(()),
    }
    let Some(dra) = dra else {
        info!(
            "DRA is off: serving the runtime only (no kubelet registration, no devices published)"
        );
        return Ok(());
    };
    let Dra {
        kubelet,
        health,
        events,
        poster,
        publisher,
        registration,
        publishing,
    } = dra;
    tasks.spawn_until_exit("event poster", async move {
        poster.await;
        Ok(())
    });
    // The health poll runs here, not in a task of its own: the kubelet's health streams read
    // it until the plugin has shut down.
    let (reports, poll) = HealthMonitor::new(health, {
        let manager = manager.clone();
        move || manager.snapshot().device_cpus.clone()
    })
    .start();
    let poll = std::pin::pin!(poll);
    let handler = Arc::new(Measured {
        inner: LifecycleHandler::new(manager.clone()).with_events(events),
        metrics: metrics.clone(),
        manager: manager.clone(),
    });
    let plugin = KubeletPlugin::start_with_health(&kubelet, handler, reports)
        .await
        .context("starting the kubelet plugin")
        .map_err(|e| Stop::failed("kubelet plugin", e))?;
    let _ = registration.set(plugin.registration_state());

    let _ = publishing.set(publisher.clone());
    tasks.spawn(
        "dropped slice fields",
        watch_dropped(publisher.clone(), mode, metrics),
    );
    tasks.spawn("slice publisher", {
        let publisher = publisher.clone();
        let snapshots = manager.published();
        async move {
            publish::publish(publisher, snapshots).await;
            Ok(())
        }
    });
    tasks.spawn("slice maintainer", async move {
        publisher.maintain().await;
        Ok(())
    });

    tokio::select! {
        () = tasks.stopping() => {}
        // It ends only once every stream is gone, which the plugin's own do not before it is.
        () = poll => tasks.stopping().await,
    }
    if let Err(e) = plugin.shutdown().await {
        warn!(error = %resmgr::errors::chain(&e), "stopping the kubelet plugin");
    }
    Ok(())
}

/// [`publish::watch_dropped_fields`] as a task.
async fn watch_dropped(
    publisher: SlicePublisher,
    mode: DeviceMode,
    metrics: Arc<Metrics>,
) -> Result<(), Stop> {
    publish::watch_dropped_fields(publisher.dropped_fields(), mode, metrics).await;
    Ok(())
}

/// The end of the agent: what the drain needs once every task is spawned.
#[derive(Debug)]
struct Drain {
    manager: Arc<Manager>,
}

impl Drain {
    /// The one way out: the serving tasks stop, the state is saved, the runtime connection goes,
    /// and the exit status says why (a failure is returned, for `main` to print).
    async fn run(self, stop: Stop, tasks: &Tasks) -> anyhow::Result<ExitCode> {
        let late = tasks.drain_serving(DRAIN_DEADLINE).await;
        if !late.is_empty() {
            warn!(tasks = ?late, deadline = ?DRAIN_DEADLINE, "tasks still running at the drain's deadline were dropped");
        }
        self.manager
            .save_state()
            .await
            .context("saving the state")?;
        info!("state saved");
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
