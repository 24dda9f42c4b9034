//! Tests of `resmgr run` as a process: start-up checks, the HTTP endpoints, waiting for the
//! runtime with backoff, and a clean stop on SIGTERM.

use std::{
    io::{BufRead, BufReader, Read, Write},
    net::TcpStream,
    path::Path,
    process::{Child, Command, Stdio},
};

fn resmgr() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_resmgr"));
    cmd.env_remove("NODE_NAME").env_remove("RUST_LOG");
    cmd
}

/// A kubeconfig naming an API server that is never contacted before the runtime synchronizes.
fn kubeconfig(dir: &Path) -> std::path::PathBuf {
    let path = dir.join("kubeconfig");
    std::fs::write(
        &path,
        "apiVersion: v1\nkind: Config\n\
         clusters: [{name: c, cluster: {server: \"https://127.0.0.1:1\"}}]\n\
         users: [{name: u, user: {token: t}}]\n\
         contexts: [{name: x, context: {cluster: c, user: u}}]\n\
         current-context: x\n",
    )
    .unwrap();
    path
}

const TOPOLOGY: &str = "synthetic:pack:1 numa:2 core:2 pu:2";

fn agent(dir: &Path) -> Command {
    agent_with(dir, TOPOLOGY, "127.0.0.1:0")
}

fn agent_on(dir: &Path, topology: &str) -> Command {
    agent_with(dir, topology, "127.0.0.1:0")
}

fn agent_with(dir: &Path, topology: &str, metrics_addr: &str) -> Command {
    let mut cmd = resmgr();
    cmd.args(["run", "--node-name", "node-1", "--topology", topology])
        .arg("--kubeconfig")
        .arg(kubeconfig(dir))
        .arg("--nri-socket")
        .arg(dir.join("nri.sock"))
        .arg("--state-dir")
        .arg(dir.join("state"))
        .arg("--cdi-dir")
        .arg(dir.join("cdi"))
        .arg("--kubelet-plugins-dir")
        .arg(dir.join("plugins"))
        .arg("--kubelet-registry-dir")
        .arg(dir.join("registry"))
        .args(["--metrics-addr", metrics_addr, "--log-format", "json"])
        .args(["--debug-addr", "127.0.0.1:0"]);
    cmd
}

/// Reads the child's JSON log until a line's message contains `marker`; returns that line.
fn wait_for_log(reader: &mut impl BufRead, marker: &str, seen: &mut String) -> serde_json::Value {
    loop {
        let mut line = String::new();
        let n = reader.read_line(&mut line).unwrap();
        assert!(n > 0, "the agent's log ended before {marker:?}:\n{seen}");
        seen.push_str(&line);
        let Ok(value) = serde_json::from_str::<serde_json::Value>(&line) else {
            continue;
        };
        if value["message"]
            .as_str()
            .is_some_and(|m| m.contains(marker))
        {
            return value;
        }
    }
}

/// A plain HTTP/1.1 GET: status and body.
fn get(addr: &str, path: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let status = response
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (status, body)
}

fn sigterm(child: &Child) {
    let pid = rustix::process::Pid::from_child(child);
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
}

#[test]
fn waits_for_the_runtime_with_backoff_serves_health_and_stops_cleanly_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = agent(dir.path())
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let mut log = BufReader::new(child.stderr.take().unwrap());
    let mut seen = String::new();
    let serving = wait_for_log(&mut log, "serving /metrics", &mut seen);
    let addr = serving["addr"].as_str().unwrap().to_owned();
    let serving = wait_for_log(&mut log, "serving /debug/state", &mut seen);
    let debug_addr = serving["addr"].as_str().unwrap().to_owned();
    assert_ne!(addr, debug_addr);
    let first = wait_for_log(&mut log, "waiting for the container runtime", &mut seen);
    let second = wait_for_log(&mut log, "waiting for the container runtime", &mut seen);
    assert_eq!(first["retry_in"], "250ms", "{first}");
    assert_eq!(second["retry_in"], "500ms", "the wait backs off: {second}");

    let (status, body) = get(&addr, "/healthz");
    assert_eq!((status, body.as_str()), (200, "ok\n"));
    let (status, body) = get(&addr, "/readyz");
    assert_eq!(status, 503, "{body}");
    assert!(
        body.contains("the container runtime has not synchronized yet"),
        "{body}"
    );
    // The kubelet's sockets serve as early as the gate allows: before the runtime is up, its
    // calls held until it has synchronized.
    assert!(
        body.contains("the kubelet has not confirmed our registration"),
        "{body}"
    );
    let registry: Vec<_> = std::fs::read_dir(dir.path().join("registry"))
        .map(|d| {
            d.map(|e| e.unwrap().file_name())
                .filter(|n| !n.to_string_lossy().starts_with('.'))
                .collect()
        })
        .unwrap_or_default();
    assert_eq!(
        registry.len(),
        1,
        "the registration socket serves before the runtime is up: {registry:?}"
    );
    let (status, body) = get(&addr, "/metrics");
    assert_eq!(status, 200);
    for wanted in [
        "resmgr_pool_cpus{pool=\"root\",kind=\"reserved\"} 1",
        "resmgr_pool_cpus{pool=\"numa1\",kind=\"shared\"} 4",
        "resmgr_pending_updates 0",
        "resmgr_prepare_duration_seconds_count 0",
        "resmgr_claims_prepared_total 0",
    ] {
        assert!(body.contains(wanted), "{wanted:?} not in\n{body}");
    }
    let (status, _) = get(&addr, "/debug/state");
    assert_eq!(
        status, 404,
        "/debug/state is not served on the metrics address"
    );
    let (status, body) = get(&debug_addr, "/debug/state");
    assert_eq!(status, 200);
    let state: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(state["runtime_synchronized"], false);
    assert_eq!(state["kubelet"], "pending");
    assert_eq!(state["standing"], "Owner");
    assert_eq!(state["allocation"]["reserved"], "0");

    sigterm(&child);
    let status = child.wait().unwrap();
    let mut rest = String::new();
    log.read_to_string(&mut rest).unwrap();
    assert!(status.success(), "exit {status}:\n{seen}{rest}");
    assert!(rest.contains("state saved"), "{rest}");
    let state: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("state/state.json")).unwrap())
            .unwrap();
    assert_eq!(state["policy"], "topology-aware");
    // The socket's lock file stays (crates/kubelet-plugin's socket module says why); the
    // kubelet's watcher ignores names that start with a dot.
    let registry: Vec<_> = std::fs::read_dir(dir.path().join("registry"))
        .map(|d| {
            d.map(|e| e.unwrap().file_name())
                .filter(|n| !n.to_string_lossy().starts_with('.'))
                .collect()
        })
        .unwrap_or_default();
    assert!(
        registry.is_empty(),
        "no registration socket is left: {registry:?}"
    );
}

#[test]
fn start_up_refuses_what_the_machine_cannot_give_naming_the_flag() {
    let dir = tempfile::tempdir().unwrap();
    let out = agent(dir.path())
        .args(["--reserved-cpus", "0-99"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--reserved-cpus 0-99: cpus 8-99 are not online"),
        "{err}"
    );

    let out = agent_on(dir.path(), "synthetic:pack:banana")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--topology synthetic:pack:banana: cannot build"),
        "{err}"
    );

    let out = agent_with(dir.path(), TOPOLOGY, "192.0.2.1:1")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--metrics-addr 192.0.2.1:1: cannot listen"),
        "{err}"
    );
}

/// Each start-up failure the agent can meet on disk is printed with every cause once: library
/// errors keep their cause in `source()` only, and the binary prints the chain.
#[test]
fn start_up_failures_print_each_cause_once() {
    let run = |dir: &Path| {
        let out = agent(dir).output().unwrap();
        assert!(!out.status.success());
        // The error line; the others are logs.
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        stderr
            .lines()
            .find(|l| l.starts_with("resmgr: "))
            .unwrap_or_else(|| panic!("no error line in {stderr}"))
            .to_owned()
    };

    // The state file cannot be read: a directory where it should be.
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("state/state.json")).unwrap();
    let err = run(dir.path());
    assert!(err.contains("reading state file"), "{err}");
    assert_eq!(err.matches("(os error 21)").count(), 1, "{err}");

    // The policy refuses the saved state.
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("state")).unwrap();
    std::fs::write(
        dir.path().join("state/state.json"),
        r#"{"version": 1, "policy": "topology-aware", "policy_state": {"bogus": true}, "claims": {}}"#,
    )
    .unwrap();
    let err = run(dir.path());
    assert!(err.contains("restoring the policy from"), "{err}");
    let cause = err
        .rsplit("restoring the policy from ")
        .next()
        .and_then(|rest| rest.split_once(": "))
        .map(|(_, cause)| cause.trim().to_owned())
        .unwrap();
    assert_eq!(err.matches(cause.as_str()).count(), 1, "{err}");

    // The CDI spec directory cannot be listed: a file where it should be.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("cdi"), b"").unwrap();
    let err = run(dir.path());
    assert!(err.contains("reconciling CDI specs"), "{err}");
    assert_eq!(err.matches("(os error 20)").count(), 1, "{err}");
}

/// A task that fails ends the agent the way a signal does, through the one drain: the state is
/// saved, and the reason is logged and printed, with a non-zero
/// exit. The failing task here is the runtime connection: the NRI socket is there, but what
/// listens on it closes every connection before registration completes.
#[test]
fn a_failing_task_drains_like_a_signal_saving_the_state_and_saying_why() {
    let dir = tempfile::tempdir().unwrap();
    let listener = std::os::unix::net::UnixListener::bind(dir.path().join("nri.sock")).unwrap();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            drop(conn);
        }
    });
    let out = agent(dir.path()).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "exit {}:\n{stderr}", out.status);
    let lines: Vec<serde_json::Value> = stderr
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let message = |m: &str| {
        lines
            .iter()
            .position(|l| l["message"] == m)
            .unwrap_or_else(|| panic!("no log line {m:?} in\n{stderr}"))
    };
    let stopping = message("a task of the agent failed: stopping");
    assert_eq!(lines[stopping]["task"], "runtime connection", "{stderr}");
    assert!(
        lines[stopping]["error"]
            .as_str()
            .is_some_and(|e| e.contains("registering with the runtime")),
        "{stderr}"
    );
    assert!(message("state saved") > stopping, "{stderr}");
    let printed = stderr
        .lines()
        .find(|l| l.starts_with("resmgr: "))
        .unwrap_or_else(|| panic!("no error line in {stderr}"));
    assert!(
        printed.contains("--nri-socket") && printed.contains("registering with the runtime"),
        "{printed}"
    );
    let state: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("state/state.json")).unwrap())
            .unwrap();
    assert_eq!(state["policy"], "topology-aware");
}
