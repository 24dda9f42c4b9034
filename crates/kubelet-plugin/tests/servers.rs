//! The kubelet-facing servers over real unix sockets: socket handling (stale sockets,
//! permissions, two instances, deregistration order), registration state, and the limits on
//! what a client may send. The kubelet's own clients are exercised by the Go conformance tests.

use std::{
    fs,
    os::unix::fs::{FileTypeExt, PermissionsExt},
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use dra_proto::{
    pluginregistration::{InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse},
    prost::Message,
    v1,
};
use kubelet_plugin::{
    ClaimHandler, ClaimRef, KubeletConfig, KubeletError, KubeletPlugin, PrepareResults,
    PreparedDevice, RegistrationState, RequestError, SocketError, UnprepareResults,
};
use tokio::sync::{Notify, mpsc};

/// Bounds every wait; nothing here should come near it.
const DEADLINE: Duration = Duration::from_secs(10);

const DRIVER: &str = "test.resmgr.io";

// === a claim handler for tests ===

/// Prepares every claim as one device named after it. When `gate` is set, each prepare reports
/// that it started and then waits until the gate is opened.
#[derive(Debug, Default)]
struct Handler {
    gate: Option<(mpsc::UnboundedSender<String>, Arc<Notify>)>,
}

impl ClaimHandler for Handler {
    async fn prepare(&self, claims: &[ClaimRef]) -> Result<PrepareResults, RequestError> {
        if let Some((started, open)) = &self.gate {
            let _ = started.send(claims[0].uid.clone());
            open.notified().await;
        }
        Ok(claims
            .iter()
            .map(|c| {
                let device = PreparedDevice {
                    pool: "pool".into(),
                    device: format!("dev-{}", c.name),
                    ..PreparedDevice::default()
                };
                (c.uid.clone(), Ok(vec![device]))
            })
            .collect())
    }

    async fn unprepare(&self, claims: &[ClaimRef]) -> Result<UnprepareResults, RequestError> {
        Ok(claims.iter().map(|c| (c.uid.clone(), Ok(()))).collect())
    }
}

// === a minimal gRPC client over h2 ===

/// A unary gRPC call's failure: status code and message.
#[derive(Debug, PartialEq, Eq)]
struct CallError {
    code: i32,
    message: String,
}

/// gRPC status codes used below.
const INVALID_ARGUMENT: i32 = 3;
const OUT_OF_RANGE: i32 = 11;

/// Sends `body` (already a protobuf message's bytes) to `path` on `socket` and returns the
/// response message's bytes.
async fn call_raw(socket: &Path, path: &str, body: &[u8]) -> Result<Vec<u8>, CallError> {
    let io = tokio::net::UnixStream::connect(socket)
        .await
        .expect("connect");
    let (client, conn) = h2::client::handshake(io).await.expect("handshake");
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let mut client = client.ready().await.expect("ready");
    let request = http::Request::builder()
        .method("POST")
        .uri(format!("http://localhost{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .expect("request");
    let (response, mut stream) = client.send_request(request, false).expect("send");
    let mut framed = vec![0u8];
    framed.extend_from_slice(&u32::try_from(body.len()).unwrap().to_be_bytes());
    framed.extend_from_slice(body);
    stream.send_data(framed.into(), true).expect("send body");
    let response = response.await.expect("response");
    let (parts, mut body) = response.into_parts();
    let mut data = Vec::new();
    while let Some(chunk) = body.data().await {
        let chunk = chunk.expect("body");
        let _ = body.flow_control().release_capacity(chunk.len());
        data.extend_from_slice(&chunk);
    }
    // A trailers-only response carries grpc-status in the headers.
    let trailers = match body.trailers().await.expect("trailers") {
        Some(t) => t,
        None => parts.headers,
    };
    let code: i32 = trailers["grpc-status"].to_str().unwrap().parse().unwrap();
    if code != 0 {
        let message = trailers
            .get("grpc-message")
            .map(|m| m.to_str().unwrap().to_owned())
            .unwrap_or_default();
        return Err(CallError { code, message });
    }
    assert!(data.len() >= 5, "a response message");
    Ok(data[5..].to_vec())
}

async fn call<Req: Message, Resp: Message + Default>(
    socket: &Path,
    path: &str,
    request: &Req,
) -> Result<Resp, CallError> {
    let bytes = call_raw(socket, path, &request.encode_to_vec()).await?;
    Ok(Resp::decode(bytes.as_slice()).expect("response decodes"))
}

async fn get_info(socket: &Path) -> PluginInfo {
    call(
        socket,
        "/pluginregistration.Registration/GetInfo",
        &InfoRequest {},
    )
    .await
    .expect("GetInfo")
}

const PREPARE_V1: &str = "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources";

fn prepare_request(uids: &[&str]) -> v1::NodePrepareResourcesRequest {
    v1::NodePrepareResourcesRequest {
        claims: uids
            .iter()
            .map(|uid| v1::Claim {
                namespace: "ns".into(),
                uid: (*uid).into(),
                name: format!("claim-{uid}"),
            })
            .collect(),
    }
}

async fn prepare(
    socket: &Path,
    uids: &[&str],
) -> Result<v1::NodePrepareResourcesResponse, CallError> {
    call(socket, PREPARE_V1, &prepare_request(uids)).await
}

// === helpers ===

fn config(root: &Path) -> KubeletConfig {
    KubeletConfig {
        driver_name: DRIVER.into(),
        plugins_dir: root.join("plugins"),
        registry_dir: root.join("plugins_registry"),
        instance: None,
    }
}

fn mode(path: &Path) -> u32 {
    fs::metadata(path).unwrap().permissions().mode() & 0o7777
}

/// Leaves a socket file at `path` with nobody listening, as a killed process does.
fn leave_stale_socket(path: &Path) {
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    drop(std::os::unix::net::UnixListener::bind(path).unwrap());
    assert!(fs::symlink_metadata(path).unwrap().file_type().is_socket());
    assert!(
        std::os::unix::net::UnixStream::connect(path).is_err(),
        "stale: nobody listens"
    );
}

/// Waits until `condition` holds, checking every few milliseconds, failing at the deadline.
async fn wait_until(what: &str, condition: impl Fn() -> bool) {
    let give_up = tokio::time::Instant::now() + DEADLINE;
    while !condition() {
        assert!(
            tokio::time::Instant::now() < give_up,
            "timed out waiting until {what}"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

async fn start(config: &KubeletConfig) -> KubeletPlugin {
    KubeletPlugin::start(config, Arc::new(Handler::default()))
        .await
        .expect("start")
}

// === tests ===

#[tokio::test]
async fn stale_sockets_from_an_earlier_run_are_replaced() {
    let root = tempfile::tempdir().unwrap();
    let config = config(root.path());
    leave_stale_socket(&config.dra_socket());
    leave_stale_socket(&config.registration_socket());

    let plugin = start(&config).await;
    let info = get_info(&config.registration_socket()).await;
    assert_eq!(info.endpoint, config.dra_socket().to_str().unwrap());
    let answer = prepare(&config.dra_socket(), &["u1"]).await.unwrap();
    assert_eq!(answer.claims["u1"].devices[0].device_name, "dev-claim-u1");
    plugin.shutdown().await.unwrap();
}

#[tokio::test]
async fn created_directories_are_0750_existing_ones_keep_their_mode_sockets_are_0600() {
    let root = tempfile::tempdir().unwrap();
    let config = KubeletConfig {
        driver_name: DRIVER.into(),
        plugins_dir: root.path().join("a/b/plugins"),
        registry_dir: root.path().join("registry"),
        instance: None,
    };
    fs::create_dir(&config.registry_dir).unwrap();
    fs::set_permissions(&config.registry_dir, fs::Permissions::from_mode(0o711)).unwrap();

    let plugin = start(&config).await;
    for dir in ["a", "a/b", "a/b/plugins", "a/b/plugins/test.resmgr.io"] {
        assert_eq!(mode(&root.path().join(dir)), 0o750, "{dir}");
    }
    assert_eq!(
        mode(&config.registry_dir),
        0o711,
        "the kubelet's directory is left alone"
    );
    for socket in [config.dra_socket(), config.registration_socket()] {
        let meta = fs::symlink_metadata(&socket).unwrap();
        assert!(meta.file_type().is_socket(), "{}", socket.display());
        assert_eq!(
            meta.permissions().mode() & 0o777,
            0o600,
            "{}",
            socket.display()
        );
    }
    plugin.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_second_instance_refuses_and_the_first_keeps_serving() {
    let root = tempfile::tempdir().unwrap();
    let config = config(root.path());
    let first = start(&config).await;

    let err = KubeletPlugin::start(&config, Arc::new(Handler::default()))
        .await
        .expect_err("a second instance on the same sockets must refuse");
    match &err {
        KubeletError::DraSocket(SocketError::InUse { socket, .. }) => {
            assert_eq!(socket, &config.dra_socket());
        }
        other => panic!("unexpected error: {other:?}"),
    }
    // The first instance's sockets were not touched.
    assert_eq!(get_info(&config.registration_socket()).await.name, DRIVER);
    assert!(prepare(&config.dra_socket(), &["u1"]).await.is_ok());

    first.shutdown().await.unwrap();
    // Once the first is gone, a new instance starts.
    start(&config).await.shutdown().await.unwrap();
}

#[tokio::test]
async fn losing_the_registration_socket_race_undoes_the_dra_socket() {
    let root = tempfile::tempdir().unwrap();
    let first = config(root.path());
    let plugin = start(&first).await;
    // Same registry and driver, different plugin directory: only the registration socket clashes.
    let second = KubeletConfig {
        plugins_dir: root.path().join("other-plugins"),
        ..first.clone()
    };
    let err = KubeletPlugin::start(&second, Arc::new(Handler::default()))
        .await
        .expect_err("the registration socket is taken");
    assert!(
        matches!(
            err,
            KubeletError::RegistrationSocket(SocketError::InUse { .. })
        ),
        "{err:?}"
    );
    assert!(
        !second.dra_socket().exists(),
        "the loser removed its DRA socket"
    );
    assert_eq!(get_info(&first.registration_socket()).await.name, DRIVER);
    plugin.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_file_that_is_not_a_socket_is_never_replaced() {
    let root = tempfile::tempdir().unwrap();
    let config = config(root.path());
    fs::create_dir_all(config.dra_socket().parent().unwrap()).unwrap();
    fs::write(config.dra_socket(), "precious").unwrap();
    let err = KubeletPlugin::start(&config, Arc::new(Handler::default()))
        .await
        .expect_err("a regular file is in the way");
    match &err {
        KubeletError::DraSocket(SocketError::NotASocket(path)) => {
            assert_eq!(path, &config.dra_socket());
        }
        other => panic!("unexpected error: {other:?}"),
    }
    assert_eq!(fs::read_to_string(config.dra_socket()).unwrap(), "precious");
    assert!(
        !config.registration_socket().exists(),
        "registration never appeared"
    );
}

#[tokio::test]
async fn shutdown_deregisters_first_and_answers_calls_in_flight() {
    let root = tempfile::tempdir().unwrap();
    let config = config(root.path());
    let (started_tx, mut started) = mpsc::unbounded_channel();
    let open = Arc::new(Notify::new());
    let handler = Handler {
        gate: Some((started_tx, Arc::clone(&open))),
    };
    let plugin = KubeletPlugin::start(&config, Arc::new(handler))
        .await
        .unwrap();

    // A prepare is in flight, held inside the handler.
    let dra_socket = config.dra_socket();
    let in_flight = tokio::spawn(async move { prepare(&dra_socket, &["held"]).await });
    let uid = tokio::time::timeout(DEADLINE, started.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(uid, "held");

    let shutdown = tokio::spawn(plugin.shutdown());
    let registration = config.registration_socket();
    wait_until("the registration socket is gone", || !registration.exists()).await;
    // Deregistered, but the DRA server is still draining the call in flight.
    assert!(
        config.dra_socket().exists(),
        "the DRA socket outlives the registration socket"
    );
    assert!(!in_flight.is_finished() && !shutdown.is_finished());

    open.notify_one();
    let answer = tokio::time::timeout(DEADLINE, in_flight)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(
        answer.claims["held"].devices[0].device_name,
        "dev-claim-held"
    );
    tokio::time::timeout(DEADLINE, shutdown)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(!config.dra_socket().exists());
}

/// The names that appeared in a directory (created or moved in), in order, read from an inotify
/// watch: what the kubelet's plugin watcher gets for the registry directory.
#[derive(Debug)]
struct DirWatch {
    dir: PathBuf,
    inotify: std::os::fd::OwnedFd,
}

impl DirWatch {
    fn new(dir: &Path) -> Self {
        use rustix::fs::inotify;
        let fd = inotify::init(inotify::CreateFlags::CLOEXEC | inotify::CreateFlags::NONBLOCK)
            .expect("inotify_init");
        inotify::add_watch(
            &fd,
            dir,
            inotify::WatchFlags::CREATE | inotify::WatchFlags::MOVED_TO,
        )
        .expect("inotify_add_watch");
        Self {
            dir: dir.to_owned(),
            inotify: fd,
        }
    }

    /// Every name that appeared since the watch began (the events are queued by then: the
    /// kernel queues them before the system call that caused them returns).
    fn appeared(&self) -> Vec<String> {
        use rustix::fs::inotify;
        let mut buf = [std::mem::MaybeUninit::uninit(); 4096];
        let mut reader = inotify::Reader::new(&self.inotify, &mut buf);
        let mut names = Vec::new();
        loop {
            match reader.next() {
                Ok(event) => {
                    if let Some(name) = event.file_name() {
                        names.push(name.to_string_lossy().into_owned());
                    }
                }
                Err(e) if e == rustix::io::Errno::WOULDBLOCK => return names,
                Err(e) => panic!("reading inotify events: {e}"),
            }
        }
    }
}

/// The kubelet's plugin watcher stats every name that appears in the registry directory when it
/// gets to the event, and logs an error for one that is already gone; it registers every socket
/// whose name does not start with a dot. So each socket must appear under its final name and
/// nothing may appear there only for a moment. The DRA socket's directory is held to the same
/// rule, for an operator who puts it in a watched directory.
#[tokio::test]
async fn sockets_appear_under_their_final_names_only_and_nothing_appears_for_a_moment() {
    let root = tempfile::tempdir().unwrap();
    let config = config(root.path());
    let dra_dir = config.dra_socket().parent().unwrap().to_owned();
    fs::create_dir_all(&config.registry_dir).unwrap();
    fs::create_dir_all(&dra_dir).unwrap();
    // A restart: the sockets of a killed run are still there.
    leave_stale_socket(&config.dra_socket());
    leave_stale_socket(&config.registration_socket());
    let watches = [
        (
            DirWatch::new(&config.registry_dir),
            config.registration_socket(),
        ),
        (DirWatch::new(&dra_dir), config.dra_socket()),
    ];

    let plugin = start(&config).await;
    for (watch, socket) in &watches {
        let appeared = watch.appeared();
        for name in &appeared {
            assert!(
                fs::symlink_metadata(watch.dir.join(name)).is_ok(),
                "{name} appeared in {} and is gone again (all that appeared: {appeared:?})",
                watch.dir.display()
            );
        }
        let sockets: Vec<&String> = appeared
            .iter()
            .filter(|n| {
                fs::symlink_metadata(watch.dir.join(n)).is_ok_and(|m| m.file_type().is_socket())
            })
            .collect();
        let final_name = socket.file_name().unwrap().to_str().unwrap();
        assert_eq!(sockets, [final_name], "in {}", watch.dir.display());
    }
    let info = get_info(&config.registration_socket()).await;
    assert_eq!(info.endpoint, config.dra_socket().to_str().unwrap());
    plugin.shutdown().await.unwrap();
}

#[tokio::test]
async fn dropping_the_plugin_removes_both_sockets() {
    let root = tempfile::tempdir().unwrap();
    let config = config(root.path());
    let plugin = start(&config).await;
    assert!(config.dra_socket().exists() && config.registration_socket().exists());
    drop(plugin);
    assert!(!config.registration_socket().exists());
    assert!(!config.dra_socket().exists());
}

#[tokio::test]
async fn registration_notifications_drive_the_published_state() {
    let root = tempfile::tempdir().unwrap();
    let config = config(root.path());
    let plugin = start(&config).await;
    let mut state = plugin.registration_state();
    assert_eq!(*state.borrow_and_update(), RegistrationState::Pending);

    let notify = |registered: bool, error: &str| RegistrationStatus {
        plugin_registered: registered,
        error: error.into(),
    };
    let path = "/pluginregistration.Registration/NotifyRegistrationStatus";
    let socket = config.registration_socket();
    let _: RegistrationStatusResponse = call(&socket, path, &notify(false, "version mismatch"))
        .await
        .unwrap();
    tokio::time::timeout(DEADLINE, state.changed())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        *state.borrow_and_update(),
        RegistrationState::Rejected {
            error: "version mismatch".into()
        }
    );
    let _: RegistrationStatusResponse = call(&socket, path, &notify(true, "")).await.unwrap();
    tokio::time::timeout(DEADLINE, state.changed())
        .await
        .unwrap()
        .unwrap();
    assert!(state.borrow().is_ready());
    plugin.shutdown().await.unwrap();
}

#[tokio::test]
async fn malformed_and_oversized_requests_are_refused_and_the_server_carries_on() {
    let root = tempfile::tempdir().unwrap();
    let config = config(root.path());
    let plugin = start(&config).await;
    let socket = config.dra_socket();

    // Field 1, length-delimited, claiming 100 bytes of which 2 follow.
    let err = call_raw(&socket, PREPARE_V1, &[0x0a, 100, 1, 2])
        .await
        .unwrap_err();
    assert_eq!(err.code, INVALID_ARGUMENT, "{err:?}");
    assert!(
        err.message.contains("NodePrepareResourcesRequest"),
        "{err:?}"
    );

    let err = prepare(&socket, &["u1", ""]).await.unwrap_err();
    assert_eq!(err.code, INVALID_ARGUMENT, "{err:?}");

    let err = prepare(&socket, &["dup", "dup"]).await.unwrap_err();
    assert_eq!(err.code, INVALID_ARGUMENT, "{err:?}");

    // Over the request limit: about 1.2 MiB of claims.
    let many: Vec<String> = (0..20_000).map(|i| format!("uid-{i:040}")).collect();
    let many: Vec<&str> = many.iter().map(String::as_str).collect();
    assert!(prepare_request(&many).encoded_len() > kubelet_plugin::MAX_DRA_REQUEST);
    let err = prepare(&socket, &many).await.unwrap_err();
    assert_eq!(err.code, OUT_OF_RANGE, "{err:?}");

    // The health stream's request carries nothing, in both versions; bytes that do not decode
    // are refused too, and so is a request over its limit.
    for watch in [
        "/v1.DRAResourceHealth/NodeWatchResources",
        "/v1alpha1.DRAResourceHealth/NodeWatchResources",
    ] {
        let err = call_raw(&socket, watch, &[0x0a, 100, 1, 2])
            .await
            .unwrap_err();
        assert_eq!(err.code, INVALID_ARGUMENT, "{watch}: {err:?}");
        assert!(
            err.message.contains("NodeWatchResourcesRequest"),
            "{watch}: {err:?}"
        );
        let huge = vec![0u8; kubelet_plugin::MAX_REGISTRATION_MESSAGE + 1];
        let err = call_raw(&socket, watch, &huge).await.unwrap_err();
        assert_eq!(err.code, OUT_OF_RANGE, "{watch}: {err:?}");
    }

    // Still serving.
    assert!(prepare(&socket, &["u1"]).await.is_ok());
    plugin.shutdown().await.unwrap();
}

#[tokio::test]
async fn two_instances_serve_under_names_of_their_own_and_count_the_kubelets_connections() {
    let root = tempfile::tempdir().unwrap();
    let old = KubeletConfig {
        instance: Some("0b6c2a4e-7f3d-4c1e-9a2b-000000000001".into()),
        ..config(root.path())
    };
    let new = KubeletConfig {
        instance: Some("0b6c2a4e-7f3d-4c1e-9a2b-000000000002".into()),
        ..config(root.path())
    };
    let a = start(&old).await;
    let b = start(&new).await;
    assert_eq!(
        a.dra_socket(),
        root.path()
            .join("plugins")
            .join(DRIVER)
            .join("dra-0b6c2a4e-7f3d-4c1e-9a2b-000000000001.sock")
    );
    assert_eq!(
        b.registration_socket(),
        root.path().join("plugins_registry").join(format!(
            "{DRIVER}-0b6c2a4e-7f3d-4c1e-9a2b-000000000002-reg.sock"
        ))
    );
    assert_eq!(
        get_info(b.registration_socket()).await.endpoint,
        b.dra_socket().to_str().unwrap(),
        "the registration names the instance's own DRA socket"
    );

    let connections = b.dra_connections();
    assert_eq!(*connections.borrow(), 0, "nobody has connected yet");
    prepare(b.dra_socket(), &["u1"]).await.unwrap();
    assert_eq!(*connections.borrow(), 1);
    assert_eq!(
        *a.dra_connections().borrow(),
        0,
        "the other instance was not called"
    );

    let err = KubeletPlugin::start(
        &KubeletConfig {
            instance: Some("../escape".into()),
            ..config(root.path())
        },
        Arc::new(Handler::default()),
    )
    .await
    .unwrap_err();
    assert!(matches!(err, KubeletError::InvalidInstance(_)), "{err}");
}

#[tokio::test]
async fn an_invalid_driver_name_is_refused_before_touching_the_filesystem() {
    let root = tempfile::tempdir().unwrap();
    let config = KubeletConfig {
        driver_name: "../escape".into(),
        ..config(root.path())
    };
    let err = KubeletPlugin::start(&config, Arc::new(Handler::default()))
        .await
        .expect_err("not a DNS subdomain");
    assert!(matches!(err, KubeletError::InvalidDriverName(_)), "{err:?}");
    let created: Vec<PathBuf> = fs::read_dir(root.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert!(created.is_empty(), "created {created:?}");
}

/// The `:authority` rewrite in front of our servers enforces their HTTP/2 limits and mirrors a
/// client HPACK table of at most 4096 bytes (src/authority/mod.rs). This pins what the
/// servers actually advertise, so a changed tonic or hyper default cannot silently break that.
#[tokio::test]
async fn servers_advertise_the_settings_the_authority_rewrite_assumes() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let root = tempfile::tempdir().unwrap();
    let config = config(root.path());
    let plugin = start(&config).await;
    for socket in [config.dra_socket(), config.registration_socket()] {
        let mut io = tokio::net::UnixStream::connect(&socket).await.unwrap();
        io.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0")
            .await
            .unwrap();
        let mut header = [0u8; 9];
        io.read_exact(&mut header).await.unwrap();
        assert_eq!(header[3], 0x4, "the server's first frame is SETTINGS");
        let len = usize::from(header[1]) << 8 | usize::from(header[2]);
        let mut payload = vec![0u8; len];
        io.read_exact(&mut payload).await.unwrap();
        let settings: Vec<(u16, u32)> = payload
            .chunks_exact(6)
            .map(|s| {
                (
                    u16::from_be_bytes([s[0], s[1]]),
                    u32::from_be_bytes([s[2], s[3], s[4], s[5]]),
                )
            })
            .collect();
        let get = |id: u16| settings.iter().find(|(i, _)| *i == id).map(|(_, v)| *v);
        // SETTINGS_HEADER_TABLE_SIZE: absent means the default, 4096.
        assert_eq!(
            get(0x1).unwrap_or(4096),
            4096,
            "{}: {settings:?}",
            socket.display()
        );
        // SETTINGS_MAX_FRAME_SIZE: absent means the default, 16384.
        assert_eq!(
            get(0x5).unwrap_or(16_384),
            16_384,
            "{}: {settings:?}",
            socket.display()
        );
        // SETTINGS_MAX_HEADER_LIST_SIZE: set explicitly to 16 KiB.
        assert_eq!(
            get(0x6),
            Some(16 * 1024),
            "{}: {settings:?}",
            socket.display()
        );
    }
    plugin.shutdown().await.unwrap();
}
