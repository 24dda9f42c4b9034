//! Stub behaviour against a scripted fake runtime built from our own mux and ttrpc with the roles
//! reversed (the runtime serves conn 2 and calls conn 1). The Go conformance suite checks the same
//! behaviours against the real runtime side; these tests pin the details and the failure paths.

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use bytes::{Bytes, BytesMut};
use prost::Message;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt, DuplexStream},
    sync::{mpsc, oneshot},
};

use super::*;
use crate::{
    Delivery, EventSet, PluginError, StateChange,
    api::{self, Event},
    rpc::{ReplyFuture, Service, Status, code},
    wire::{self, Inbound, MessageDecoder, MuxDecoder},
};

// === the fake runtime ===

/// How the fake runtime answers UpdateContainers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum UpdateOutcome {
    Succeed,
    Fail,
}

#[derive(Debug)]
struct RuntimeService {
    registered: mpsc::UnboundedSender<api::RegisterPluginRequest>,
    updates: mpsc::UnboundedSender<Vec<api::ContainerUpdate>>,
    outcome: Mutex<UpdateOutcome>,
    /// When set, the next UpdateContainers is answered only once this fires (a runtime applying
    /// it slowly).
    hold: Mutex<Option<oneshot::Receiver<()>>>,
}

impl Service for RuntimeService {
    fn call(self: Arc<Self>, method: String, payload: Bytes) -> ReplyFuture {
        Box::pin(async move {
            match method.as_str() {
                "RegisterPlugin" => {
                    let req = api::RegisterPluginRequest::decode(payload).unwrap();
                    self.registered.send(req).unwrap();
                    Ok(Vec::new()).into()
                }
                "UpdateContainers" => {
                    let req = api::UpdateContainersRequest::decode(payload).unwrap();
                    self.updates.send(req.update).unwrap();
                    let hold = self.hold.lock().unwrap().take();
                    if let Some(hold) = hold {
                        let _ = hold.await;
                    }
                    match *self.outcome.lock().unwrap() {
                        UpdateOutcome::Succeed => {
                            Ok(api::UpdateContainersResponse::default().encode_to_vec()).into()
                        }
                        UpdateOutcome::Fail => Err(Status::new(
                            code::UNKNOWN,
                            "NRI update of some containers failed",
                        ))
                        .into(),
                    }
                }
                _ => Err(Status::new(code::UNIMPLEMENTED, "no such method")).into(),
            }
        })
    }
}

struct FakeRuntime {
    plugin: Client,
    service: Arc<RuntimeService>,
    registered: mpsc::UnboundedReceiver<api::RegisterPluginRequest>,
    updates: mpsc::UnboundedReceiver<Vec<api::ContainerUpdate>>,
    closer: Closer,
}

impl FakeRuntime {
    fn start(trunk: DuplexStream) -> Self {
        let mux = mux::start(trunk, &[PLUGIN_CONN, RUNTIME_CONN]);
        let mut inbound = mux.inbound;
        let (reg_tx, registered) = mpsc::unbounded_channel();
        let (upd_tx, updates) = mpsc::unbounded_channel();
        let service = Arc::new(RuntimeService {
            registered: reg_tx,
            updates: upd_tx,
            outcome: Mutex::new(UpdateOutcome::Succeed),
            hold: Mutex::new(None),
        });
        rpc::serve(
            RUNTIME_CONN,
            RUNTIME_SERVICE,
            service.clone(),
            mux.writer.clone(),
            inbound.remove(&RUNTIME_CONN).unwrap(),
        );
        let plugin = Client::start(
            PLUGIN_CONN,
            mux.writer,
            inbound.remove(&PLUGIN_CONN).unwrap(),
        );
        Self {
            plugin,
            service,
            registered,
            updates,
            closer: mux.closer,
        }
    }

    async fn call<Req: Message, Resp: Message + Default>(
        &self,
        method: &str,
        req: &Req,
    ) -> Result<Resp, CallError> {
        let bytes = self
            .plugin
            .call(
                PLUGIN_SERVICE,
                method,
                req.encode_to_vec(),
                Some(Duration::from_secs(10)),
            )
            .await?;
        Ok(Resp::decode(bytes).unwrap())
    }

    async fn configure(&self, nri_version: &str) -> Result<api::ConfigureResponse, CallError> {
        let req = api::ConfigureRequest {
            runtime_name: "fake".into(),
            runtime_version: "0.0.1".into(),
            registration_timeout: 5000,
            request_timeout: 2000,
            nri_version: nri_version.into(),
            ..Default::default()
        };
        self.call("Configure", &req).await
    }
}

// === a recording test plugin ===

#[derive(Debug)]
enum Seen {
    Sync {
        pods: usize,
        containers: usize,
    },
    Create(String),
    State(Event, Delivery),
    /// What update_containers returned when called from inside CreateContainer.
    UpdateFromHandler(Result<Vec<api::ContainerUpdate>, UpdateError>),
}

struct TestPlugin {
    events: EventSet,
    seen: mpsc::UnboundedSender<Seen>,
    /// Set once connected, so a handler can try an unsolicited update.
    handle: Mutex<Option<Handle>>,
    sync_update: Vec<api::ContainerUpdate>,
    /// Copied into the adjustment's annotations (to make big replies).
    echo_annotations: bool,
    /// What CreateContainer refuses with, if it refuses.
    refuse_create: Mutex<Option<PluginError>>,
    /// How long CreateContainer takes to answer (on the runtime's clock).
    create_takes: Duration,
}

impl Plugin for TestPlugin {
    fn events(&self) -> EventSet {
        self.events
    }

    async fn synchronize(
        &self,
        pods: Vec<api::PodSandbox>,
        containers: Vec<api::Container>,
    ) -> Result<Vec<api::ContainerUpdate>, PluginError> {
        let _ = self.seen.send(Seen::Sync {
            pods: pods.len(),
            containers: containers.len(),
        });
        Ok(self.sync_update.clone())
    }

    async fn create_container(
        &self,
        request: api::CreateContainerRequest,
    ) -> Result<api::CreateContainerResponse, PluginError> {
        let container = request.container.unwrap_or_default();
        tokio::time::sleep(self.create_takes).await;
        if let Some(refusal) = self.refuse_create.lock().unwrap().clone() {
            return Err(refusal);
        }
        let handle = self.handle.lock().unwrap().clone();
        if let Some(handle) = handle {
            let outcome = handle.update_containers(vec![]).await;
            let _ = self.seen.send(Seen::UpdateFromHandler(outcome));
        }
        let _ = self.seen.send(Seen::Create(container.id.clone()));
        let mut adjust = api::ContainerAdjustment::default();
        if self.echo_annotations {
            adjust.annotations = container.annotations;
        }
        Ok(api::CreateContainerResponse {
            adjust: Some(adjust),
            ..Default::default()
        })
    }

    async fn state_change(&self, change: StateChange) -> Result<(), PluginError> {
        let _ = self.seen.send(Seen::State(change.event, change.delivery));
        Ok(())
    }
}

fn test_plugin(events: &[Event]) -> (TestPlugin, mpsc::UnboundedReceiver<Seen>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let plugin = TestPlugin {
        events: EventSet::of(events),
        seen: tx,
        handle: Mutex::new(None),
        sync_update: vec![],
        echo_annotations: false,
        refuse_create: Mutex::new(None),
        create_takes: Duration::ZERO,
    };
    (plugin, rx)
}

/// Connects `plugin` to a fresh fake runtime that answers Configure as an NRI `nri_version`
/// runtime; returns both ends once the handshake is done.
async fn handshake(
    plugin: TestPlugin,
    config: StubConfig,
    nri_version: &str,
) -> (Handle, FakeRuntime, Arc<TestPlugin>, api::ConfigureResponse) {
    let (ours, theirs) = tokio::io::duplex(64 * 1024);
    let mut runtime = FakeRuntime::start(theirs);
    let plugin = Arc::new(plugin);
    let connecting = tokio::spawn(connect_over(plugin.clone(), config, ours));
    let reg = runtime.registered.recv().await.unwrap();
    assert_eq!(reg.plugin_name, "test");
    assert_eq!(reg.plugin_idx, "10");
    assert_eq!(reg.nri_version, PLUGIN_NRI_VERSION);
    let configured = runtime.configure(nri_version).await.unwrap();
    let handle = connecting.await.unwrap().unwrap();
    *plugin.handle.lock().unwrap() = Some(handle.clone());
    (handle, runtime, plugin, configured)
}

fn container(id: &str) -> api::Container {
    api::Container {
        id: id.into(),
        pod_sandbox_id: "pod0".into(),
        name: id.into(),
        ..Default::default()
    }
}

fn cpuset_update(id: &str, cpus: &str) -> api::ContainerUpdate {
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
        ignore_failure: false,
    }
}

// === handshake and Configure ===

#[tokio::test]
async fn registration_and_configure_announce_the_subscribed_events() {
    let (plugin, _seen) = test_plugin(&[Event::CreateContainer, Event::StopContainer]);
    let (handle, _rt, _p, configured) = handshake(plugin, StubConfig::new("test", "10"), "").await;
    assert_eq!(configured.events, 0x208);
    let info = handle.runtime_info().unwrap();
    assert_eq!(info.name, "fake");
    assert_eq!(info.request_timeout, Duration::from_secs(2));
    assert_eq!(info.nri_version, None);
}

#[tokio::test]
async fn events_unknown_to_the_runtime_are_not_subscribed() {
    let events = [Event::CreateContainer, Event::UpdatePodSandbox];
    let (plugin, _seen) = test_plugin(&events);
    let (_h, _rt, _p, old) = handshake(plugin, StubConfig::new("test", "10"), "v0.9.0").await;
    assert_eq!(old.events, 0x8, "v0.9 runtimes reject bit 0x800");
    let (plugin, _seen) = test_plugin(&events);
    let (_h, _rt, _p, new) = handshake(plugin, StubConfig::new("test", "10"), "v0.12.5").await;
    assert_eq!(new.events, 0x808);
}

#[tokio::test]
async fn configure_fails_when_no_subscribed_event_is_deliverable() {
    let (plugin, _seen) = test_plugin(&[Event::UpdatePodSandbox]);
    let (ours, theirs) = tokio::io::duplex(64 * 1024);
    let mut runtime = FakeRuntime::start(theirs);
    let connecting = tokio::spawn(connect_over(
        Arc::new(plugin),
        StubConfig::new("test", "10"),
        ours,
    ));
    runtime.registered.recv().await.unwrap();
    let err = runtime.configure("v0.8.0").await.unwrap_err();
    assert!(
        matches!(&err, CallError::Status { status, .. } if status.code == code::UNKNOWN),
        "{err}"
    );
    // The runtime drops such a plugin; the stub reports that as a rejection.
    runtime.closer.close(Disconnect::ClosedLocally);
    let outcome = connecting.await.unwrap();
    assert!(
        matches!(outcome, Err(StubError::Rejected(_))),
        "{outcome:?}"
    );
}

#[tokio::test]
async fn invalid_identity_is_refused_before_connecting() {
    let (ours, _theirs) = tokio::io::duplex(1024);
    let (plugin, _seen) = test_plugin(&[Event::CreateContainer]);
    let plugin = Arc::new(plugin);
    let err = connect_over(plugin.clone(), StubConfig::new("test", "1"), ours)
        .await
        .unwrap_err();
    assert!(matches!(err, StubError::InvalidIndex { .. }), "{err}");
    let (ours, _theirs) = tokio::io::duplex(1024);
    let err = connect_over(plugin, StubConfig::new("te st", "10"), ours)
        .await
        .unwrap_err();
    assert!(matches!(err, StubError::InvalidName { .. }), "{err}");
    let (ours, _theirs) = tokio::io::duplex(1024);
    let (empty, _seen) = test_plugin(&[]);
    let err = connect_over(Arc::new(empty), StubConfig::new("test", "10"), ours)
        .await
        .unwrap_err();
    assert!(matches!(err, StubError::NoEvents), "{err}");
}

#[tokio::test(start_paused = true)]
async fn a_runtime_that_never_configures_times_out_registration() {
    let (plugin, _seen) = test_plugin(&[Event::CreateContainer]);
    let (ours, theirs) = tokio::io::duplex(64 * 1024);
    let mut runtime = FakeRuntime::start(theirs);
    let mut config = StubConfig::new("test", "10");
    config.registration_timeout = Duration::from_millis(300);
    let connecting = tokio::spawn(connect_over(Arc::new(plugin), config, ours));
    runtime.registered.recv().await.unwrap();
    let err = connecting.await.unwrap().unwrap_err();
    assert!(
        matches!(err, StubError::ConfigureTimeout { timeout_ms: 300 }),
        "{err}"
    );
}

// === Synchronize ===

#[tokio::test]
async fn chunked_synchronize_is_gathered_and_answered_at_the_end() {
    let (mut plugin, mut seen) = test_plugin(&[Event::CreateContainer]);
    plugin.sync_update = vec![cpuset_update("c1", "0-1")];
    let (handle, runtime, _p, _) = handshake(plugin, StubConfig::new("test", "10"), "").await;

    let first = api::SynchronizeRequest {
        pods: vec![api::PodSandbox::default()],
        containers: vec![container("c1")],
        more: true,
    };
    let reply: api::SynchronizeResponse = runtime.call("Synchronize", &first).await.unwrap();
    assert!(reply.more, "a `more` chunk must be echoed");
    assert!(reply.update.is_empty(), "no updates before the last chunk");

    let last = api::SynchronizeRequest {
        pods: vec![],
        containers: vec![container("c2"), container("c3")],
        more: false,
    };
    let reply: api::SynchronizeResponse = runtime.call("Synchronize", &last).await.unwrap();
    assert!(!reply.more);
    assert_eq!(reply.update, vec![cpuset_update("c1", "0-1")]);
    assert!(matches!(
        seen.recv().await.unwrap(),
        Seen::Sync {
            pods: 1,
            containers: 3
        }
    ));
    handle.synchronized().await.unwrap();
}

/// The notification means "written to the socket": while the runtime does not read, the reply
/// cannot be written and the notification must not fire.
#[tokio::test]
async fn synchronized_fires_only_after_the_reply_is_written() {
    let (mut plugin, _seen) = test_plugin(&[Event::CreateContainer]);
    // A reply far larger than the duplex buffer, so writing it blocks until the runtime reads.
    plugin.sync_update = (0..2000)
        .map(|i| cpuset_update(&format!("container-{i:04}"), "0-63"))
        .collect();
    let (ours, mut theirs) = tokio::io::duplex(1024);
    let plugin = Arc::new(plugin);
    let connecting = tokio::spawn(connect_over(plugin, StubConfig::new("test", "10"), ours));
    // Play the runtime by hand on the raw stream.
    let mut reader = RawPeer::default();
    let (_, reg) = reader.next_message(&mut theirs).await;
    assert_eq!(reg.kind, wire::MESSAGE_TYPE_REQUEST);
    reply_ok(&mut theirs, RUNTIME_CONN, reg.stream_id, &[]).await;
    send_request(
        &mut theirs,
        1,
        "Configure",
        &api::ConfigureRequest::default(),
    )
    .await;
    let (conn, cfg) = reader.next_message(&mut theirs).await;
    assert_eq!((conn, cfg.stream_id), (PLUGIN_CONN, 1));
    let handle = connecting.await.unwrap().unwrap();
    send_request(
        &mut theirs,
        3,
        "Synchronize",
        &api::SynchronizeRequest::default(),
    )
    .await;

    // Read only the reply's first frame; the rest stays in the plugin's writer.
    let mut header = [0u8; wire::MUX_HEADER_LEN];
    theirs.read_exact(&mut header).await.unwrap();
    let len = u32::from_be_bytes(header[4..].try_into().unwrap()) as usize;
    let mut first = vec![0u8; len];
    theirs.read_exact(&mut first).await.unwrap();
    let total = u32::from_be_bytes(first[..4].try_into().unwrap()) as usize;
    assert!(total > 16 * 1024, "the reply must not fit the 1 KiB pipe");
    let synchronized = handle.synchronized();
    tokio::pin!(synchronized);
    // The writer is blocked on the full pipe, so the notification is pending.
    tokio::task::yield_now().await;
    assert!(futures_poll_once(synchronized.as_mut()).await.is_none());
    // Drain the rest of the reply: now the notification fires.
    let mut rest = vec![0u8; total - (len - wire::TTRPC_HEADER_LEN) + wire::MUX_HEADER_LEN];
    theirs.read_exact(&mut rest).await.unwrap();
    synchronized.await.unwrap();
}

// === events ===

#[tokio::test]
async fn dedicated_event_calls_are_served_or_refused_for_the_fallback() {
    let start = api::StartContainerRequest {
        pod: Some(api::PodSandbox::default()),
        container: Some(container("c1")),
    };
    let fallback = api::StateChangeEvent {
        event: Event::StartContainer as i32,
        pod: Some(api::PodSandbox::default()),
        container: Some(container("c1")),
    };

    let (plugin, mut seen) = test_plugin(&[Event::StartContainer]);
    let (_h, runtime, _p, _) = handshake(plugin, StubConfig::new("test", "10"), "").await;
    let _: api::StartContainerResponse = runtime.call("StartContainer", &start).await.unwrap();
    assert!(matches!(
        seen.recv().await.unwrap(),
        Seen::State(Event::StartContainer, Delivery::Dedicated)
    ));

    let (plugin, mut seen) = test_plugin(&[Event::StartContainer]);
    let mut config = StubConfig::new("test", "10");
    config.dedicated_event_calls = false;
    let (_h, runtime, _p, _) = handshake(plugin, config, "").await;
    let err = runtime
        .call::<_, api::StartContainerResponse>("StartContainer", &start)
        .await
        .unwrap_err();
    assert!(
        matches!(&err, CallError::Status { status, .. } if status.code == code::UNIMPLEMENTED),
        "{err}"
    );
    let _: api::Empty = runtime.call("StateChange", &fallback).await.unwrap();
    assert!(matches!(
        seen.recv().await.unwrap(),
        Seen::State(Event::StartContainer, Delivery::StateChange)
    ));
}

#[tokio::test]
async fn unknown_methods_get_unimplemented() {
    let (plugin, _seen) = test_plugin(&[Event::CreateContainer]);
    let (_h, runtime, _p, _) = handshake(plugin, StubConfig::new("test", "10"), "").await;
    let err = runtime
        .call::<_, api::Empty>("ValidateContainerAdjustment", &api::Empty {})
        .await
        .unwrap_err();
    assert!(
        matches!(&err, CallError::Status { status, .. } if status.code == code::UNIMPLEMENTED),
        "{err}"
    );
}

#[tokio::test]
async fn hundred_kilobyte_messages_cross_both_ways() {
    let (mut plugin, mut seen) = test_plugin(&[Event::CreateContainer]);
    plugin.echo_annotations = true;
    let (_h, runtime, plugin, _) = handshake(plugin, StubConfig::new("test", "10"), "").await;
    // Don't let the handler try an update: this test is about sizes.
    *plugin.handle.lock().unwrap() = None;
    let big: String = (0..100_000usize)
        .map(|i| char::from(b"abcdefghijklmnopqrstuvwxyz"[i % 26]))
        .collect();
    let mut c = container("big");
    c.annotations.insert("payload".into(), big.clone());
    let req = api::CreateContainerRequest {
        pod: Some(api::PodSandbox::default()),
        container: Some(c),
    };
    assert!(req.encoded_len() > 100_000);
    let reply: api::CreateContainerResponse = runtime.call("CreateContainer", &req).await.unwrap();
    assert!(matches!(seen.recv().await.unwrap(), Seen::Create(id) if id == "big"));
    assert_eq!(reply.adjust.unwrap().annotations["payload"], big);
}

#[tokio::test]
async fn a_handlers_refusal_reaches_the_runtime_with_its_kinds_code() {
    use crate::PluginErrorKind as K;
    let (plugin, _seen) = test_plugin(&[Event::CreateContainer]);
    let (_h, runtime, plugin, _) = handshake(plugin, StubConfig::new("test", "10"), "").await;
    let req = api::CreateContainerRequest {
        pod: Some(api::PodSandbox::default()),
        container: Some(container("c1")),
    };
    for (kind, code) in [
        (K::Unknown, code::UNKNOWN),
        (K::InvalidArgument, code::INVALID_ARGUMENT),
        (K::NotFound, code::NOT_FOUND),
        (K::FailedPrecondition, code::FAILED_PRECONDITION),
        (K::Unavailable, code::UNAVAILABLE),
        (K::Internal, code::INTERNAL),
    ] {
        let message = format!("refused as {kind:?}");
        *plugin.refuse_create.lock().unwrap() = Some(PluginError::with_kind(kind, &message));
        let err = runtime
            .call::<_, api::CreateContainerResponse>("CreateContainer", &req)
            .await
            .unwrap_err();
        assert_eq!(
            err,
            CallError::Status {
                method: "CreateContainer".into(),
                status: Status::new(code, message),
            }
        );
    }
    // A plain error is what a Go plugin's is.
    assert_eq!(PluginError::new("no").kind, K::Unknown);
}

// === unsolicited updates ===

#[tokio::test]
async fn update_containers_from_a_handler_is_refused() {
    let (plugin, mut seen) = test_plugin(&[Event::CreateContainer]);
    let (_h, runtime, _p, _) = handshake(plugin, StubConfig::new("test", "10"), "").await;
    let req = api::CreateContainerRequest {
        pod: Some(api::PodSandbox::default()),
        container: Some(container("c1")),
    };
    let _: api::CreateContainerResponse = runtime.call("CreateContainer", &req).await.unwrap();
    match seen.recv().await.unwrap() {
        Seen::UpdateFromHandler(outcome) => {
            assert_eq!(outcome, Err(UpdateError::InsideEventHandler));
        }
        other => panic!("expected the handler's update attempt, got {other:?}"),
    }
}

#[tokio::test]
async fn update_containers_from_a_task_reaches_the_runtime() {
    let (plugin, _seen) = test_plugin(&[Event::CreateContainer]);
    let (handle, mut runtime, _p, _) = handshake(plugin, StubConfig::new("test", "10"), "").await;
    let updates = vec![cpuset_update("c1", "2-3")];
    let failed = tokio::spawn({
        let handle = handle.clone();
        let updates = updates.clone();
        async move { handle.update_containers(updates).await }
    })
    .await
    .unwrap()
    .unwrap();
    assert!(failed.is_empty());
    assert_eq!(runtime.updates.recv().await.unwrap(), updates);

    *runtime.service.outcome.lock().unwrap() = UpdateOutcome::Fail;
    let err = handle.update_containers(updates.clone()).await.unwrap_err();
    assert_eq!(
        err,
        UpdateError::Rejected {
            code: code::UNKNOWN,
            message: "NRI update of some containers failed".into()
        }
    );
}

#[tokio::test(start_paused = true)]
async fn an_update_waits_for_the_runtimes_events_to_pause() {
    let lull = UpdateLull {
        quiet: Duration::from_millis(300),
        per_update: Duration::from_millis(100),
        max_wait: Duration::from_secs(5),
    };
    let mut config = StubConfig::new("test", "10");
    config.update_lull = lull;
    let (plugin, _seen) = test_plugin(&[Event::CreateContainer]);
    let (handle, mut runtime, _p, _) = handshake(plugin, config, "").await;
    // The handshake's Configure is a call too: wait it out first.
    tokio::time::sleep(lull.quiet).await;

    let req = api::CreateContainerRequest {
        pod: Some(api::PodSandbox::default()),
        container: Some(container("c1")),
    };
    let _: api::CreateContainerResponse = runtime.call("CreateContainer", &req).await.unwrap();
    let answered = tokio::time::Instant::now();
    let updates = vec![cpuset_update("c2", "2-3")];
    let sending = tokio::spawn({
        let handle = handle.clone();
        let updates = updates.clone();
        async move { handle.update_containers(updates).await }
    });
    assert_eq!(runtime.updates.recv().await.unwrap(), updates);
    let waited = answered.elapsed();
    assert!(
        waited >= lull.quiet,
        "the update reached the runtime {waited:?} after its event, before the {:?} lull",
        lull.quiet
    );
    sending.await.unwrap().unwrap();

    // Quiet since: the next update goes at once.
    let again = tokio::time::Instant::now();
    handle.update_containers(updates.clone()).await.unwrap();
    assert_eq!(runtime.updates.recv().await.unwrap(), updates);
    assert!(again.elapsed() < lull.quiet, "{:?}", again.elapsed());
}

/// A runtime call answered in over a second is logged by the service that answers it, with its
/// time split into waiting for a thread and handling; one answered sooner is not.
#[test]
fn a_call_answered_in_over_a_second_is_logged_with_where_its_time_went() {
    let answered_in = |takes: Duration| {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .unwrap();
        // The stub's tasks run on this thread, where the logs are captured.
        stdx::logs::captured(|| {
            runtime.block_on(async {
                let (mut plugin, _seen) = test_plugin(&[Event::CreateContainer]);
                plugin.create_takes = takes;
                let config = StubConfig::new("test", "10");
                let (_handle, runtime, _p, _) = handshake(plugin, config, "").await;
                let req = api::CreateContainerRequest {
                    pod: Some(api::PodSandbox::default()),
                    container: Some(container("c1")),
                };
                let _: api::CreateContainerResponse =
                    runtime.call("CreateContainer", &req).await.unwrap();
            });
        })
    };
    let slow = answered_in(Duration::from_millis(1200));
    assert!(slow.contains("answered a runtime call slowly"), "{slow}");
    for field in [
        "call=\"CreateContainer\"",
        "queued_ms=0",
        "handled_ms=1200",
        "runtime_timeout_ms=2000",
    ] {
        assert!(slow.contains(field), "{field} not in {slow}");
    }
    let quick = answered_in(Duration::from_millis(900));
    assert!(!quick.contains("slowly"), "{quick}");
}

#[tokio::test(start_paused = true)]
async fn no_update_is_sent_while_the_runtime_has_not_answered_the_one_before() {
    let mut config = StubConfig::new("test", "10");
    config.update_lull = UpdateLull::NONE;
    let (plugin, _seen) = test_plugin(&[Event::CreateContainer]);
    let (handle, mut runtime, _p, _) = handshake(plugin, config, "").await;
    let (release, hold) = oneshot::channel();
    *runtime.service.hold.lock().unwrap() = Some(hold);

    let first = vec![cpuset_update("c1", "2-3")];
    let err = handle.update_containers(first.clone()).await.unwrap_err();
    assert!(
        matches!(
            err,
            UpdateError::Call(CallError::DeadlineExceeded {
                timeout_ms: 2000,
                ..
            })
        ),
        "{err:?}"
    );
    assert_eq!(runtime.updates.recv().await.unwrap(), first);

    // The runtime is still applying it: the next one is not sent.
    let second = vec![cpuset_update("c2", "4-5")];
    let err = handle.update_containers(second.clone()).await.unwrap_err();
    assert_eq!(err, UpdateError::EarlierUnanswered { waited_ms: 2000 });
    assert!(
        runtime.updates.try_recv().is_err(),
        "a second update reached the runtime"
    );

    // Once the runtime answers the first, the next one goes.
    release.send(()).unwrap();
    handle.update_containers(second.clone()).await.unwrap();
    assert_eq!(runtime.updates.recv().await.unwrap(), second);
}

// === connection loss ===

#[tokio::test]
async fn connection_loss_is_reported() {
    let (plugin, _seen) = test_plugin(&[Event::CreateContainer]);
    let (handle, runtime, _p, _) = handshake(plugin, StubConfig::new("test", "10"), "").await;
    runtime.closer.close(Disconnect::ClosedLocally);
    assert_eq!(handle.closed().await, Disconnect::Eof);
    assert_eq!(handle.synchronized().await, Err(Disconnect::Eof));
    let err = handle.update_containers(vec![]).await.unwrap_err();
    assert!(
        matches!(err, UpdateError::Call(CallError::ConnectionClosed { .. })),
        "{err}"
    );
}

// === raw-stream helpers ===

/// Reads frames off a raw trunk and reassembles messages per connection.
#[derive(Default)]
struct RawPeer {
    buf: BytesMut,
    streams: std::collections::HashMap<u32, (MessageDecoder, BytesMut)>,
}

impl RawPeer {
    async fn next_message(&mut self, trunk: &mut DuplexStream) -> (u32, wire::MessageHeader) {
        let (conn, header, _) = self.next_message_with_payload(trunk).await;
        (conn, header)
    }

    async fn next_message_with_payload(
        &mut self,
        trunk: &mut DuplexStream,
    ) -> (u32, wire::MessageHeader, Bytes) {
        loop {
            for (conn, (decoder, buf)) in &mut self.streams {
                if let Some(Inbound::Message { header, payload }) = decoder.decode(buf) {
                    return (*conn, header, payload);
                }
            }
            let mut decoded = false;
            while let Some(frame) = MuxDecoder.decode(&mut self.buf).unwrap() {
                let entry = self.streams.entry(frame.conn).or_default();
                entry.1.extend_from_slice(&frame.payload);
                decoded = true;
            }
            if decoded {
                continue;
            }
            let mut chunk = [0u8; 4096];
            let n = trunk.read(&mut chunk).await.unwrap();
            assert!(n > 0, "plugin closed the trunk");
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }
}

async fn write_frames(trunk: &mut DuplexStream, frames: Vec<Bytes>) {
    for f in frames {
        trunk.write_all(&f).await.unwrap();
    }
}

async fn reply_ok(trunk: &mut DuplexStream, conn: u32, id: u32, payload: &[u8]) {
    let response = crate::envelope::Response {
        status: Some(crate::envelope::Status::default()),
        payload: payload.to_vec(),
    };
    let frames = wire::message_frames(
        conn,
        id,
        wire::MESSAGE_TYPE_RESPONSE,
        &response.encode_to_vec(),
    )
    .unwrap();
    write_frames(trunk, frames).await;
}

async fn send_request<M: Message>(trunk: &mut DuplexStream, id: u32, method: &str, msg: &M) {
    send_request_with_deadline(trunk, id, method, msg, 0).await;
}

async fn send_request_with_deadline<M: Message>(
    trunk: &mut DuplexStream,
    id: u32,
    method: &str,
    msg: &M,
    timeout_nano: i64,
) {
    let request = crate::envelope::Request {
        service: PLUGIN_SERVICE.into(),
        method: method.into(),
        payload: msg.encode_to_vec(),
        timeout_nano,
        metadata: vec![],
    };
    let frames = wire::message_frames(
        PLUGIN_CONN,
        id,
        wire::MESSAGE_TYPE_REQUEST,
        &request.encode_to_vec(),
    )
    .unwrap();
    write_frames(trunk, frames).await;
}

/// Polls a future once: Some(output) if it is ready, None if pending.
async fn futures_poll_once<F: std::future::Future + Unpin>(f: F) -> Option<F::Output> {
    let mut f = f;
    std::future::poll_fn(|cx| {
        std::task::Poll::Ready(match std::pin::Pin::new(&mut f).poll(cx) {
            std::task::Poll::Ready(v) => Some(v),
            std::task::Poll::Pending => None,
        })
    })
    .await
}

#[tokio::test]
async fn replies_are_matched_by_stream_id_out_of_order() {
    let (ours, mut theirs) = tokio::io::duplex(64 * 1024);
    let mux = mux::start(ours, &[RUNTIME_CONN]);
    let mut inbound = mux.inbound;
    let client = Client::start(
        RUNTIME_CONN,
        mux.writer.clone(),
        inbound.remove(&RUNTIME_CONN).unwrap(),
    );
    let calls: Vec<_> = ["first", "second", "third"]
        .into_iter()
        .map(|m| {
            let client = client.clone();
            tokio::spawn(async move {
                client
                    .call(RUNTIME_SERVICE, m, m.as_bytes().to_vec(), None)
                    .await
            })
        })
        .collect();
    // Collect the three requests; the IDs must be 1, 3, 5 in the order they hit the wire.
    let mut peer = RawPeer::default();
    let mut ids = Vec::new();
    for _ in 0..3 {
        let (conn, header) = peer.next_message(&mut theirs).await;
        assert_eq!(conn, RUNTIME_CONN);
        ids.push(header.stream_id);
    }
    assert_eq!(ids, vec![1, 3, 5]);
    // Answer in reverse order, each reply naming its stream's ID.
    for id in ids.iter().rev() {
        reply_ok(
            &mut theirs,
            RUNTIME_CONN,
            *id,
            format!("reply-{id}").as_bytes(),
        )
        .await;
    }
    let mut replies = Vec::new();
    for call in calls {
        replies.push(call.await.unwrap().unwrap());
    }
    // Each call got the reply to its own stream, whichever order the tasks sent in.
    let mut got: Vec<String> = replies
        .iter()
        .map(|r| String::from_utf8(r.to_vec()).unwrap())
        .collect();
    got.sort();
    assert_eq!(got, vec!["reply-1", "reply-3", "reply-5"]);
}

/// A call that overruns the caller's `timeout_nano` is abandoned (the handler future is dropped)
/// and not answered: the runtime has given up, and an answer could only arrive as a refusal.
#[tokio::test]
async fn a_handler_over_its_deadline_is_abandoned_without_a_reply() {
    /// Reports when the handler's future is dropped.
    struct DropSignal(Option<oneshot::Sender<()>>);
    impl Drop for DropSignal {
        fn drop(&mut self) {
            if let Some(tx) = self.0.take() {
                let _ = tx.send(());
            }
        }
    }
    struct Slow(Mutex<Option<oneshot::Sender<()>>>);
    impl Plugin for Slow {
        fn events(&self) -> EventSet {
            EventSet::of(&[Event::CreateContainer])
        }
        async fn create_container(
            &self,
            _request: api::CreateContainerRequest,
        ) -> Result<api::CreateContainerResponse, PluginError> {
            let _guard = DropSignal(self.0.lock().unwrap().take());
            std::future::pending().await
        }
    }
    let (dropped_tx, dropped) = oneshot::channel();
    let (ours, mut theirs) = tokio::io::duplex(64 * 1024);
    let connecting = tokio::spawn(connect_over(
        Arc::new(Slow(Mutex::new(Some(dropped_tx)))),
        StubConfig::new("test", "10"),
        ours,
    ));
    let mut peer = RawPeer::default();
    let (_, reg) = peer.next_message(&mut theirs).await;
    reply_ok(&mut theirs, RUNTIME_CONN, reg.stream_id, &[]).await;
    send_request(
        &mut theirs,
        1,
        "Configure",
        &api::ConfigureRequest::default(),
    )
    .await;
    peer.next_message(&mut theirs).await;
    connecting.await.unwrap().unwrap();
    let deadline = Duration::from_millis(50);
    send_request_with_deadline(
        &mut theirs,
        3,
        "CreateContainer",
        &api::CreateContainerRequest::default(),
        i64::try_from(deadline.as_nanos()).unwrap(),
    )
    .await;
    dropped.await.unwrap();
    // Nothing was sent for stream 3: the next message on the wire answers stream 5.
    send_request(&mut theirs, 5, "Shutdown", &api::Empty {}).await;
    let (conn, header) = peer.next_message(&mut theirs).await;
    assert_eq!((conn, header.stream_id), (PLUGIN_CONN, 5));
}
