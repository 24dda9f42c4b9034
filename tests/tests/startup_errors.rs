//! Every error `resmgr run` can print for a start-up failure names each cause once.
//!
//! The binary prints a fatal error as its chain on one line (`stdx::errors::chain`). Our
//! library errors keep their cause in `source()` and out of their message (ARCHITECTURE.md); one
//! that put it in both would print it twice. So every variant of every error on the start-up path
//! (and on the final save) is built here, from a real failure where one is easy to cause, and
//! checked twice: our own errors do not repeat their direct cause, and the printed line has each
//! cause once. The `variant` functions match without a wildcard arm, so a new variant does not
//! compile until it is listed and built here.
//!
//! The start-up order, with what each step can fail with: flags (the binary's own messages),
//! topology (`TopologyError`), the policy (`ConfigError`), the API client (`ConnectError`), the
//! CDI store (`StoreError`), the manager (`StartError`), the metrics endpoint (the binary's own),
//! the runtime (`nri::StubError`), the kubelet plugin (`KubeletError`), the slice publisher
//! (`PublisherConfigError`), and on the way out, the state (`StateError`).

use std::{
    collections::BTreeSet,
    error::Error,
    fs, io,
    path::{Path, PathBuf},
    sync::Arc,
};

use integration_tests::fakes::{Harness, TestPolicy};
use kube_dra::{ConnectError, PublisherConfig};
use kubelet_plugin::{KubeletConfig, KubeletError, KubeletPlugin, SocketError};
use policy::{
    TopologySource,
    topology::{TopologyError, sysfs::SysfsError},
    topology_aware::ConfigError,
};
use resmgr::{
    StartError,
    state::{STATE_FILE, StateError, StateFile},
};

/// An OS error whose text cannot be mistaken for anything else in a message.
fn os_error() -> io::Error {
    io::Error::from_raw_os_error(28) // ENOSPC
}

/// The chain of `error` as text, outermost first.
fn chain_of(error: &(dyn Error + 'static)) -> Vec<String> {
    let mut out = vec![error.to_string()];
    let mut source = error.source();
    while let Some(cause) = source {
        out.push(cause.to_string());
        source = cause.source();
    }
    out
}

/// Checks an error as the binary would print it, under a context as the binary adds one.
/// `ours` says how many links from the top are our own errors: those must not contain their
/// direct cause's text at all; what follows is third-party, which the printer deduplicates.
fn check(ours: usize, error: impl Error + Send + Sync + 'static) -> String {
    let links = chain_of(&error);
    for pair in links.windows(2).take(ours) {
        let [outer, inner] = pair else { unreachable!() };
        assert!(
            !outer.contains(inner.as_str()),
            "{outer:?} repeats its cause {inner:?}"
        );
    }
    let error = anyhow::Error::new(error).context("starting");
    let printed = stdx::errors::chain(&*error);
    for cause in &links[1..] {
        assert_eq!(
            printed.matches(cause.as_str()).count(),
            1,
            "cause {cause:?} not printed exactly once: {printed}"
        );
    }
    printed
}

/// Checks that `built` covers exactly `all`, the names a `variant` function knows.
fn covers<E>(all: &[&str], built: &[E], variant: fn(&E) -> &'static str) {
    let built: BTreeSet<&str> = built.iter().map(variant).collect();
    let all: BTreeSet<&str> = all.iter().copied().collect();
    assert_eq!(built, all, "every variant is built");
}

// === the state file and the manager ===

const STATE_VARIANTS: &[&str] = &[
    "Read",
    "Corrupt",
    "Version",
    "PolicyMismatch",
    "Encode",
    "Write",
    "Cleanup",
    "InUse",
    "NotTheLock",
    "Lock",
];

fn state_variant(e: &StateError) -> &'static str {
    match e {
        StateError::Read { .. } => "Read",
        StateError::Corrupt { .. } => "Corrupt",
        StateError::Version { .. } => "Version",
        StateError::PolicyMismatch { .. } => "PolicyMismatch",
        StateError::Encode { .. } => "Encode",
        StateError::Write { .. } => "Write",
        StateError::Cleanup { .. } => "Cleanup",
        StateError::InUse { .. } => "InUse",
        StateError::NotTheLock { .. } => "NotTheLock",
        StateError::Lock { .. } => "Lock",
    }
}

fn state_errors(dir: &Path) -> Vec<StateError> {
    let mut errors = Vec::new();
    let at = |name: &str| {
        let d = dir.join(name);
        fs::create_dir_all(&d).unwrap();
        (StateFile::new(&d), d)
    };
    let (file, _) = at("read");
    fs::create_dir(file.path()).unwrap();
    errors.push(file.load("p").unwrap_err());
    let (file, _) = at("corrupt");
    fs::write(file.path(), b"{").unwrap();
    errors.push(file.load("p").unwrap_err());
    let (file, _) = at("version");
    fs::write(file.path(), br#"{"version": 99}"#).unwrap();
    errors.push(file.load("p").unwrap_err());
    let (file, _) = at("mismatch");
    fs::write(
        file.path(),
        br#"{"version": 1, "policy": "other", "policy_state": null, "claims": {}}"#,
    )
    .unwrap();
    errors.push(file.load("p").unwrap_err());
    // Encoding a State cannot fail with the types it holds; built by hand.
    errors.push(StateError::Encode {
        path: dir.join(STATE_FILE),
        source: serde_json::from_str::<u8>("x").unwrap_err(),
    });
    // A file where the state directory goes: saving and cleaning up both fail.
    fs::write(dir.join("blocked"), b"").unwrap();
    let blocked = StateFile::new(dir.join("blocked"));
    let state = resmgr::state::State {
        version: resmgr::state::STATE_VERSION,
        policy: "p".into(),
        policy_state: serde_json::Value::Null,
        claims: Default::default(),
    };
    errors.push(blocked.save(&state).unwrap_err());
    errors.push(blocked.remove_temporary_files().unwrap_err());
    // A second lock on a held state directory; a lock where the directory cannot be made.
    let (file, _) = at("locked");
    let _held = file.lock().unwrap();
    errors.push(file.lock().unwrap_err());
    errors.push(blocked.lock().unwrap_err());
    // A handover passing a descriptor of another file as the lock.
    let (other, other_dir) = at("other");
    drop(other);
    let not_the_lock = fs::File::create(other_dir.join("not-the-lock")).unwrap();
    errors.push(file.adopt(not_the_lock.into()).unwrap_err());
    errors
}

#[test]
fn state_errors_name_each_cause_once() {
    let dir = tempfile::tempdir().unwrap();
    let errors = state_errors(dir.path());
    covers(STATE_VARIANTS, &errors, state_variant);
    for e in errors {
        // Our error, then its source (our WriteError for Write and Cleanup, then the OS error).
        check(2, e);
    }
}

const START_VARIANTS: &[&str] = &["State", "Restore", "Specs"];

fn start_variant(e: &StartError) -> &'static str {
    match e {
        StartError::State(_) => "State",
        StartError::Restore { .. } => "Restore",
        StartError::Specs(_) => "Specs",
    }
}

#[tokio::test]
async fn manager_start_errors_name_each_cause_once() {
    let mut errors = Vec::new();

    let h = Harness::new();
    fs::create_dir_all(h.state_dir().join(STATE_FILE)).unwrap();
    errors.push(h.start(TestPolicy::new(4)).unwrap_err());

    // The real policy refuses a snapshot that is not its own.
    let h = Harness::new();
    fs::create_dir_all(h.state_dir()).unwrap();
    let topology =
        policy::Topology::load(&TopologySource::Synthetic("pack:1 core:2 pu:1".into())).unwrap();
    let real = policy::TopologyAware::new(topology, policy::Config::default()).unwrap();
    let name = policy::Policy::name(&real).to_owned();
    fs::write(
        h.state_dir().join(STATE_FILE),
        serde_json::json!({"version": 1, "policy": name, "policy_state": {"bogus": true}, "claims": {}})
            .to_string(),
    )
    .unwrap();
    errors.push(h.start_with(Box::new(real)).unwrap_err());

    let h = Harness::new();
    fs::write(h.cdi_dir(), b"").unwrap();
    errors.push(h.start(TestPolicy::new(4)).unwrap_err());

    covers(START_VARIANTS, &errors, start_variant);
    for e in errors {
        check(3, e);
    }
}

// === the CDI store ===

const STORE_VARIANTS: &[&str] = &[
    "Vendor",
    "VendorTooLong",
    "Uid",
    "NoEdits",
    "Invalid",
    "Foreign",
    "Io",
];

fn store_variant(e: &cdi::StoreError) -> &'static str {
    match e {
        cdi::StoreError::Vendor(_) => "Vendor",
        cdi::StoreError::VendorTooLong { .. } => "VendorTooLong",
        cdi::StoreError::Uid(_) => "Uid",
        cdi::StoreError::NoEdits { .. } => "NoEdits",
        cdi::StoreError::Invalid { .. } => "Invalid",
        cdi::StoreError::Foreign { .. } => "Foreign",
        cdi::StoreError::Io { .. } => "Io",
    }
}

#[test]
fn store_errors_name_each_cause_once() {
    let dir = tempfile::tempdir().unwrap();
    let edits = |env: &str| vec![cdi::ContainerEdits::with_env([env.to_owned()])];
    let store = cdi::SpecStore::new(dir.path().join("cdi"), "example.com").unwrap();
    fs::write(dir.path().join("file"), b"").unwrap();
    let blocked = cdi::SpecStore::new(dir.path().join("file"), "example.com").unwrap();
    let errors = vec![
        cdi::SpecStore::new(dir.path(), "Not A Vendor!").unwrap_err(),
        cdi::SpecStore::new(dir.path(), &format!("{}.com", "a".repeat(200))).unwrap_err(),
        store.write_claim("../escape", &edits("A=1")).unwrap_err(),
        store.write_claim("uid-1", &[]).unwrap_err(),
        store
            .write_claim("uid-1", &edits("NO_EQUALS_SIGN"))
            .unwrap_err(),
        blocked.claims().unwrap_err(),
    ];
    fs::create_dir_all(store.dir()).unwrap();
    fs::write(
        store.spec_path(&cdi::ClaimUid::new("uid-1").unwrap()),
        b"{ truncated",
    )
    .unwrap();
    let mut errors = errors;
    errors.push(store.read_claim("uid-1").unwrap_err());
    covers(STORE_VARIANTS, &errors, store_variant);
    for e in errors {
        check(3, e);
    }
}

// === topology and policy ===

const TOPOLOGY_VARIANTS: &[&str] = &["Build", "Sysfs", "NoCpus"];

fn topology_variant(e: &TopologyError) -> &'static str {
    match e {
        TopologyError::Build { .. } => "Build",
        TopologyError::Sysfs(_) => "Sysfs",
        TopologyError::NoCpus { .. } => "NoCpus",
    }
}

#[test]
fn topology_and_policy_errors_name_each_cause_once() {
    let errors = vec![
        policy::Topology::load(&TopologySource::Synthetic("pack:banana".into())).unwrap_err(),
        TopologyError::Sysfs(SysfsError::Read {
            path: "/sys/devices/system/cpu/online".into(),
            source: os_error(),
        }),
        TopologyError::Sysfs(SysfsError::Parse {
            path: "/sys/devices/system/cpu/isolated".into(),
            source: "0-x".parse::<policy::CpuSet>().unwrap_err(),
        }),
        TopologyError::NoCpus {
            source_kind: "live",
        },
    ];
    covers(TOPOLOGY_VARIANTS, &errors, topology_variant);
    for e in errors {
        check(3, e);
    }
    for e in [
        ConfigError::Reserved("cpus 8-9 are not online".into()),
        ConfigError::ClaimCpus("cpu 0 is reserved".into()),
    ] {
        match &e {
            ConfigError::Reserved(_) | ConfigError::ClaimCpus(_) => {}
        }
        check(1, e);
    }
}

// === the Kubernetes API client and the slice publisher ===

async fn connect_error(kubeconfig: Option<&Path>) -> ConnectError {
    match kube_dra::connect(kubeconfig).await {
        Ok(_) => panic!("connecting with {kubeconfig:?} must fail"),
        Err(e) => e,
    }
}

const CONNECT_VARIANTS: &[&str] = &["InCluster", "Kubeconfig", "Client"];

fn connect_variant(e: &ConnectError) -> &'static str {
    match e {
        ConnectError::InCluster(_) => "InCluster",
        ConnectError::Kubeconfig { .. } => "Kubeconfig",
        ConnectError::Client(_) => "Client",
    }
}

#[tokio::test]
async fn api_client_errors_name_each_cause_once() {
    let dir = tempfile::tempdir().unwrap();
    let mut errors = Vec::new();
    // Outside a pod: no service account.
    if std::env::var_os("KUBERNETES_SERVICE_HOST").is_none() {
        errors.push(connect_error(None).await);
    } else {
        errors.push(ConnectError::InCluster(
            kube::config::InClusterError::ReadEnvironmentVariable(std::env::VarError::NotPresent),
        ));
    }
    // kube's own error repeats the OS error in its message; the printer drops the repeat.
    errors.push(connect_error(Some(&dir.path().join("missing"))).await);
    errors.push(ConnectError::Client(kube::Error::Service(Box::new(
        os_error(),
    ))));
    covers(CONNECT_VARIANTS, &errors, connect_variant);
    for e in errors {
        check(1, e);
    }

    let e = PublisherConfig::new("cpu.resmgr.io", "Not_A_Node")
        .validate()
        .unwrap_err();
    check(1, e);
}

// === the runtime ===

const STUB_VARIANTS: &[&str] = &[
    "InvalidName",
    "InvalidIndex",
    "NoEvents",
    "Connect",
    "InvalidSocketFd",
    "StandardStreamFd",
    "NotASocket",
    "SocketFdTaken",
    "InheritedSocket",
    "Register",
    "ConfigureTimeout",
    "Rejected",
];

fn stub_variant(e: &nri::StubError) -> &'static str {
    use nri::StubError as S;
    match e {
        S::InvalidName { .. } => "InvalidName",
        S::InvalidIndex { .. } => "InvalidIndex",
        S::NoEvents => "NoEvents",
        S::Connect { .. } => "Connect",
        S::InvalidSocketFd { .. } => "InvalidSocketFd",
        S::StandardStreamFd { .. } => "StandardStreamFd",
        S::NotASocket { .. } => "NotASocket",
        S::SocketFdTaken { .. } => "SocketFdTaken",
        S::InheritedSocket { .. } => "InheritedSocket",
        S::Register(_) => "Register",
        S::ConfigureTimeout { .. } => "ConfigureTimeout",
        S::Rejected(_) => "Rejected",
    }
}

fn call_errors() -> Vec<nri::CallError> {
    use nri::CallError as C;
    let method = || "RegisterPlugin".to_owned();
    let all = vec![
        C::Status {
            method: method(),
            status: nri::Status::new(3, "plugin name taken"),
        },
        C::DeadlineExceeded {
            method: method(),
            timeout_ms: 2000,
        },
        C::ConnectionClosed { method: method() },
        C::TooLarge {
            method: method(),
            len: 5 << 20,
        },
        C::Decode {
            method: method(),
            detail: "invalid wire type".into(),
        },
        C::Protocol {
            method: method(),
            detail: "a data message as a reply".into(),
        },
    ];
    for e in &all {
        match e {
            C::Status { .. }
            | C::DeadlineExceeded { .. }
            | C::ConnectionClosed { .. }
            | C::TooLarge { .. }
            | C::Decode { .. }
            | C::Protocol { .. } => {}
        }
    }
    all
}

fn disconnects() -> Vec<nri::Disconnect> {
    use nri::Disconnect as D;
    let all = vec![
        D::Eof,
        D::ReadFailed(io::Error::from_raw_os_error(104).into()), // ECONNRESET
        D::WriteFailed(io::Error::from_raw_os_error(32).into()), // EPIPE
        D::Protocol(nri::wire::WireError::FrameTooLarge {
            conn: 1,
            len: 5 << 20,
        }),
        D::ClosedLocally,
    ];
    for e in &all {
        match e {
            D::Eof | D::ReadFailed(_) | D::WriteFailed(_) | D::Protocol(_) | D::ClosedLocally => {}
        }
    }
    all
}

#[test]
fn runtime_connection_errors_name_each_cause_once() {
    use nri::StubError as S;
    let mut errors = vec![
        S::InvalidName {
            name: "no spaces".into(),
        },
        S::InvalidIndex { index: "1".into() },
        S::NoEvents,
        S::Connect {
            path: "/var/run/nri/nri.sock".into(),
            source: os_error(),
        },
        S::InvalidSocketFd {
            value: "three".into(),
        },
        S::StandardStreamFd { fd: 0 },
        S::NotASocket { fd: 3 },
        S::SocketFdTaken { fd: 3 },
        S::InheritedSocket {
            fd: 3,
            source: os_error(),
        },
        S::ConfigureTimeout { timeout_ms: 2000 },
    ];
    errors.extend(call_errors().into_iter().map(S::Register));
    errors.extend(disconnects().into_iter().map(S::Rejected));
    covers(STUB_VARIANTS, &errors, stub_variant);
    for e in errors {
        check(2, e);
    }
}

// === the kubelet plugin ===

const KUBELET_VARIANTS: &[&str] = &[
    "InvalidDriverName",
    "InvalidInstance",
    "NonUtf8Path",
    "DraSocket",
    "RegistrationSocket",
    "RemoveSocket",
    "Task",
];

fn kubelet_variant(e: &KubeletError) -> &'static str {
    match e {
        KubeletError::InvalidDriverName(_) => "InvalidDriverName",
        KubeletError::InvalidInstance(_) => "InvalidInstance",
        KubeletError::NonUtf8Path(_) => "NonUtf8Path",
        KubeletError::DraSocket(_) => "DraSocket",
        KubeletError::RegistrationSocket(_) => "RegistrationSocket",
        KubeletError::RemoveSocket { .. } => "RemoveSocket",
        // tonic's transport error cannot be built outside tonic, and serving fails only after
        // start-up; its message names the server and nothing else.
        KubeletError::Serve { .. } => "Serve",
        KubeletError::Task { .. } => "Task",
    }
}

fn socket_errors() -> Vec<SocketError> {
    let p = || PathBuf::from("/var/lib/kubelet/plugins/x/dra.sock");
    let all = vec![
        SocketError::NoFileName("/".into()),
        SocketError::CreateDir {
            path: p(),
            source: os_error(),
        },
        SocketError::Lock {
            path: p(),
            source: os_error(),
        },
        SocketError::InUse {
            socket: p(),
            lock: p(),
        },
        SocketError::NotASocket(p()),
        SocketError::Remove {
            path: p(),
            source: os_error(),
        },
        SocketError::Bind {
            path: p(),
            source: os_error(),
        },
        SocketError::Chmod {
            path: p(),
            source: os_error(),
        },
    ];
    for e in &all {
        match e {
            SocketError::NoFileName(_)
            | SocketError::CreateDir { .. }
            | SocketError::Lock { .. }
            | SocketError::InUse { .. }
            | SocketError::NotASocket(_)
            | SocketError::Remove { .. }
            | SocketError::Bind { .. }
            | SocketError::Chmod { .. } => {}
        }
    }
    all
}

#[derive(Debug)]
struct Refusing;

impl kubelet_plugin::ClaimHandler for Refusing {
    async fn prepare(
        &self,
        _: &[kubelet_plugin::ClaimRef],
    ) -> Result<kubelet_plugin::PrepareResults, kubelet_plugin::RequestError> {
        Err(kubelet_plugin::RequestError::Unavailable("test".into()))
    }

    async fn unprepare(
        &self,
        _: &[kubelet_plugin::ClaimRef],
    ) -> Result<kubelet_plugin::UnprepareResults, kubelet_plugin::RequestError> {
        Err(kubelet_plugin::RequestError::Unavailable("test".into()))
    }
}

#[tokio::test]
async fn kubelet_plugin_errors_name_each_cause_once() {
    let dir = tempfile::tempdir().unwrap();
    let config = |driver: &str| KubeletConfig {
        driver_name: driver.into(),
        plugins_dir: dir.path().join("plugins"),
        registry_dir: dir.path().join("registry"),
        instance: None,
    };
    let handler = Arc::new(Refusing);
    let mut errors = vec![
        KubeletPlugin::start(&config("Not A Driver"), handler.clone())
            .await
            .unwrap_err(),
        KubeletPlugin::start(
            &KubeletConfig {
                instance: Some("Not/A/Pod".into()),
                ..config("cpu.resmgr.io")
            },
            handler.clone(),
        )
        .await
        .unwrap_err(),
    ];
    // Something that is not a socket where each socket goes.
    let c = config("cpu.resmgr.io");
    fs::create_dir_all(c.dra_socket().parent().unwrap()).unwrap();
    fs::write(c.dra_socket(), b"").unwrap();
    errors.push(KubeletPlugin::start(&c, handler.clone()).await.unwrap_err());
    fs::remove_file(c.dra_socket()).unwrap();
    fs::create_dir_all(c.registration_socket().parent().unwrap()).unwrap();
    fs::write(c.registration_socket(), b"").unwrap();
    errors.push(KubeletPlugin::start(&c, handler.clone()).await.unwrap_err());
    errors.push(KubeletError::NonUtf8Path(
        "/plugins/\u{fffd}/dra.sock".into(),
    ));
    errors.push(KubeletError::RemoveSocket {
        server: "registration",
        source: SocketError::Remove {
            path: c.registration_socket(),
            source: os_error(),
        },
    });
    let panicked = tokio::spawn(async { panic!("the server task panicked") })
        .await
        .unwrap_err();
    errors.push(KubeletError::Task {
        server: "DRA",
        source: panicked,
    });
    for wrap in [KubeletError::DraSocket, KubeletError::RegistrationSocket] {
        errors.extend(socket_errors().into_iter().map(wrap));
    }
    covers(KUBELET_VARIANTS, &errors, kubelet_variant);
    for e in errors {
        check(2, e);
    }
}
