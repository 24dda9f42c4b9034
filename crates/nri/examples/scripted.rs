//! `scripted`: a test plugin the Go conformance suite drives through its arguments and stdin.
//!
//! Protocol on stdout, one line per fact, so the Go side can wait on each:
//! `configured <runtime> <nri-version|unknown>`, `sync pods=N containers=M`, `synchronized`
//! (the Synchronize reply is on the socket), `event <EVENT> <dedicated|state-change> <id>`,
//! `update-ok failed=<ids>`, `update-error <message>`, `update-refused <message>` (an update
//! tried from inside CreateContainer), `closed <reason>`.
//! Commands on stdin: `update <container-id> <cpus> [ignore-failure]`.
//! With `--quiet` it prints nothing per event (the benchmark).

use std::{
    collections::HashMap,
    io::{BufRead as _, Write as _},
    path::PathBuf,
    sync::{Arc, Mutex},
};

use anyhow::Context as _;
use clap::Parser;
use nri::{
    Delivery, EventSet, Handle, Plugin, PluginError, StateChange, StubConfig,
    api::{self, Event},
};

#[derive(Debug, Parser)]
struct Args {
    #[arg(long)]
    socket: PathBuf,
    #[arg(long, default_value = "scripted")]
    name: String,
    #[arg(long, default_value = "10")]
    index: String,
    /// Subscribed events, by NRI name (e.g. CREATE_CONTAINER,STOP_CONTAINER).
    #[arg(long, value_delimiter = ',', default_value = "CREATE_CONTAINER")]
    events: Vec<String>,
    /// Answer the NRI v0.12 per-event calls with Unimplemented (StateChange fallback).
    #[arg(long)]
    no_dedicated_events: bool,
    /// Give every created container this cpuset.
    #[arg(long)]
    cpuset: Option<String>,
    /// Return `container-id=cpus` updates from Synchronize.
    #[arg(long)]
    sync_update: Vec<String>,
    /// Never answer CreateContainer.
    #[arg(long)]
    hang_create: bool,
    /// Try an unsolicited update from inside CreateContainer (it must be refused).
    #[arg(long)]
    update_in_create: bool,
    /// Copy the container's annotations into the adjustment (large replies).
    #[arg(long)]
    echo_annotations: bool,
    /// Print no line per event.
    #[arg(long)]
    quiet: bool,
}

struct Scripted {
    args: Args,
    events: EventSet,
    handle: Mutex<Option<Handle>>,
}

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

fn cpuset_update(id: &str, cpus: &str, ignore_failure: bool) -> api::ContainerUpdate {
    api::ContainerUpdate {
        container_id: id.into(),
        linux: Some(api::LinuxContainerUpdate {
            resources: Some(api::LinuxResources {
                cpu: Some(api::LinuxCpu {
                    cpus: cpus.into(),
                    ..Default::default()
                }),
                ..Default::default()
            }),
        }),
        ignore_failure,
    }
}

impl Scripted {
    fn event(&self, event: Event, delivery: Delivery, id: &str) {
        if !self.args.quiet {
            let via = match delivery {
                Delivery::Dedicated => "dedicated",
                Delivery::StateChange => "state-change",
            };
            say(&format!("event {} {via} {id}", event.as_str_name()));
        }
    }
}

impl Plugin for Scripted {
    fn events(&self) -> EventSet {
        self.events
    }

    async fn configure(&self, runtime: &nri::RuntimeInfo) -> Result<(), PluginError> {
        let nri = runtime
            .nri_version
            .map_or_else(|| "unknown".to_owned(), |v| v.to_string());
        say(&format!("configured {} {nri}", runtime.name));
        Ok(())
    }

    async fn synchronize(
        &self,
        pods: Vec<api::PodSandbox>,
        containers: Vec<api::Container>,
    ) -> Result<Vec<api::ContainerUpdate>, PluginError> {
        say(&format!(
            "sync pods={} containers={}",
            pods.len(),
            containers.len()
        ));
        let mut updates = Vec::new();
        for spec in &self.args.sync_update {
            let (id, cpus) = spec
                .split_once('=')
                .ok_or_else(|| PluginError::new(format!("bad --sync-update {spec:?}")))?;
            updates.push(cpuset_update(id, cpus, false));
        }
        Ok(updates)
    }

    async fn create_container(
        &self,
        request: api::CreateContainerRequest,
    ) -> Result<api::CreateContainerResponse, PluginError> {
        if self.args.hang_create {
            std::future::pending::<()>().await;
        }
        let container = request.container.unwrap_or_default();
        if self.args.update_in_create {
            let handle = self.handle.lock().map(|h| h.clone()).ok().flatten();
            if let Some(handle) = handle {
                match handle.update_containers(vec![]).await {
                    Err(e) => say(&format!("update-refused {e}")),
                    Ok(_) => say("update-allowed"),
                }
            }
        }
        self.event(Event::CreateContainer, Delivery::Dedicated, &container.id);
        let mut adjust = api::ContainerAdjustment::default();
        if let Some(cpus) = &self.args.cpuset {
            adjust.linux = Some(api::LinuxContainerAdjustment {
                resources: Some(api::LinuxResources {
                    cpu: Some(api::LinuxCpu {
                        cpus: cpus.clone(),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            });
        }
        if self.args.echo_annotations {
            adjust.annotations = container.annotations;
        }
        Ok(api::CreateContainerResponse {
            adjust: Some(adjust),
            ..Default::default()
        })
    }

    async fn update_container(
        &self,
        request: api::UpdateContainerRequest,
    ) -> Result<api::UpdateContainerResponse, PluginError> {
        let id = request.container.map(|c| c.id).unwrap_or_default();
        self.event(Event::UpdateContainer, Delivery::Dedicated, &id);
        Ok(api::UpdateContainerResponse::default())
    }

    async fn stop_container(
        &self,
        request: api::StopContainerRequest,
    ) -> Result<api::StopContainerResponse, PluginError> {
        let id = request.container.map(|c| c.id).unwrap_or_default();
        self.event(Event::StopContainer, Delivery::Dedicated, &id);
        Ok(api::StopContainerResponse::default())
    }

    async fn state_change(&self, change: StateChange) -> Result<(), PluginError> {
        let id = match (&change.container, &change.pod) {
            (Some(c), _) => c.id.clone(),
            (None, Some(p)) => p.id.clone(),
            (None, None) => String::new(),
        };
        self.event(change.event, change.delivery, &id);
        Ok(())
    }
}

fn parse_events(names: &[String]) -> anyhow::Result<EventSet> {
    let by_name: HashMap<&str, Event> = (1..Event::Last as i32)
        .filter_map(|n| Event::try_from(n).ok())
        .map(|e| (e.as_str_name(), e))
        .collect();
    names.iter().try_fold(EventSet::empty(), |set, name| {
        let event = by_name
            .get(name.trim())
            .with_context(|| format!("unknown event {name:?}"))?;
        Ok(set.with(*event))
    })
}

/// Runs one stdin command; prints its outcome.
async fn command(handle: Handle, line: String) {
    let words: Vec<&str> = line.split_whitespace().collect();
    match words.as_slice() {
        ["update", id, cpus, rest @ ..] => {
            let ignore = rest.first() == Some(&"ignore-failure");
            match handle
                .update_containers(vec![cpuset_update(id, cpus, ignore)])
                .await
            {
                Ok(failed) => {
                    let ids: Vec<String> = failed.into_iter().map(|u| u.container_id).collect();
                    say(&format!("update-ok failed={}", ids.join(",")));
                }
                Err(e) => say(&format!("update-error {e}")),
            }
        }
        _ => say(&format!("unknown-command {line}")),
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .init();
    let args = Args::parse();
    let events = parse_events(&args.events)?;
    let mut config = StubConfig::new(args.name.clone(), args.index.clone());
    config.dedicated_event_calls = !args.no_dedicated_events;
    let socket = args.socket.clone();
    let plugin = Arc::new(Scripted {
        args,
        events,
        handle: Mutex::new(None),
    });
    let handle = nri::connect(plugin.clone(), config, nri::Endpoint::Socket(socket))
        .await
        .context("connecting to the runtime")?;
    if let Ok(mut slot) = plugin.handle.lock() {
        *slot = Some(handle.clone());
    }

    // stdin is read on a plain thread: commands arrive rarely and block on a pipe.
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let synchronized = handle.synchronized();
    tokio::pin!(synchronized);
    let mut announced = false;
    loop {
        tokio::select! {
            done = &mut synchronized, if !announced => {
                announced = true;
                if done.is_ok() {
                    say("synchronized");
                }
            }
            Some(line) = rx.recv() => {
                tokio::spawn(command(handle.clone(), line));
            }
            why = handle.closed() => {
                say(&format!("closed {why}"));
                return Ok(());
            }
        }
    }
}
