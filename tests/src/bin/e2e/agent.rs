//! The agent under test, started one of two ways ([`Launch`]):
//!
//! - as a container of the agent's image, the way its DaemonSet runs it (the default): the
//!   chart rendered for this node and its pod run over CRI with the pod's mounts, arguments and
//!   security context ([`crate::daemonset`]), ready when the pod's readiness probe says so;
//!   stopped as the kubelet stops it (`crictl stop` with the pod's grace period) or killed;
//!   restarted as a new pod;
//! - as a `resmgr run` process on the host, for a quick run while developing.
//!
//! Either way it serves the run's runtime (NRI), the kubelet directories of the run (our
//! kubelet registers it), the API server's kubeconfig, on loopback ports of its own.

use std::{
    io::{Read as _, Write as _},
    net::{TcpListener, TcpStream},
    os::unix::process::ExitStatusExt as _,
    path::{Path, PathBuf},
    process::{Command, ExitStatus},
    sync::atomic::{AtomicU32, Ordering},
    time::Duration,
};

use anyhow::{Context as _, bail, ensure};
use rustix::process::Signal;
use serde_json::json;

use crate::{
    cri::{Cri, Pod},
    daemonset::{self, AgentPod, NodeValues},
    kubelet::Kubelet,
    procs::{Proc, wait_until},
    teardown::{self, Teardown},
};

/// How long the agent may take to become ready or to stop.
const LIMIT: Duration = Duration::from_secs(60);

/// How the agent is started.
#[derive(Debug, Clone)]
pub enum Launch {
    /// `resmgr run` on the host.
    Process,
    /// A container of the agent's image, as the chart's DaemonSet runs it.
    Container(ContainerLaunch),
}

/// What running the agent as its DaemonSet needs.
#[derive(Debug, Clone)]
pub struct ContainerLaunch {
    pub cri: Cri,
    /// The agent's image, imported into the run's runtime.
    pub image: String,
    /// the chart renderer `helm-chart` (tools/helm-chart).
    pub helm: PathBuf,
    /// The chart's directory.
    pub chart: PathBuf,
}

/// How to run the agent.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    pub launch: Launch,
    pub bin: PathBuf,
    pub node: String,
    pub driver: String,
    pub nri_socket: PathBuf,
    pub cdi_dir: PathBuf,
    pub kubeconfig: PathBuf,
    pub reserved: String,
    /// The run directory: the agent's state, the kubelet's directories and the log go here.
    pub dir: PathBuf,
    /// More flags from the command line.
    pub extra: Vec<String>,
    /// The flags of the phase being run (its settings), before `extra`.
    pub phase: Vec<String>,
    /// The agent's state directory's name in `dir` (one per phase: settings change).
    pub state: String,
}

impl AgentConfig {
    pub fn kubelet_root(&self) -> PathBuf {
        self.dir.join("kubelet")
    }

    pub fn plugins_dir(&self) -> PathBuf {
        self.kubelet_root().join("plugins")
    }

    pub fn registry_dir(&self) -> PathBuf {
        self.kubelet_root().join("plugins_registry")
    }

    pub fn state_dir(&self) -> PathBuf {
        self.dir.join(&self.state)
    }

    /// Where the agent's output goes: the process's log, or the latest container's CRI log.
    pub fn log(&self) -> PathBuf {
        match &self.launch {
            Launch::Process => self.dir.join("agent.log"),
            Launch::Container(_) => latest_log(&self.dir.join("agent-logs"))
                .unwrap_or_else(|| self.dir.join("agent-logs")),
        }
    }
}

/// The newest file in `dir`.
fn latest_log(dir: &Path) -> Option<PathBuf> {
    std::fs::read_dir(dir)
        .ok()?
        .filter_map(Result::ok)
        .filter_map(|e| Some((e.metadata().ok()?.modified().ok()?, e.path())))
        .max()
        .map(|(_, p)| p)
}

/// A running agent.
#[derive(Debug)]
pub struct Agent {
    run: Run,
    /// Where its probes and metrics answer.
    addr: String,
}

#[derive(Debug)]
enum Run {
    Process(Proc),
    Container(Container),
}

/// The agent's pod and container.
#[derive(Debug)]
struct Container {
    cri: Cri,
    pod_id: String,
    id: String,
    pid: u32,
    grace: Duration,
}

/// An agent that has exited; its status may need the runtime back to be read.
#[derive(Debug)]
pub struct Exited {
    status: Option<ExitStatus>,
    container: Option<Container>,
}

impl Exited {
    /// The exit status (for a container: from the runtime, which must answer), and the pod goes.
    pub fn status(self) -> anyhow::Result<ExitStatus> {
        match (self.status, self.container) {
            (Some(status), _) => Ok(status),
            (None, Some(c)) => c.finish(),
            (None, None) => bail!("no exit status"),
        }
    }
}

/// A loopback address with a port that was free a moment ago.
fn free_addr() -> anyhow::Result<String> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?.to_string())
}

/// Whether `resmgr run` has a flag (settings come and go between versions).
fn has_flag(bin: &Path, flag: &str) -> anyhow::Result<bool> {
    let out = Command::new(bin)
        .args(["run", "--help"])
        .output()
        .with_context(|| format!("running {} run --help", bin.display()))?;
    Ok(String::from_utf8_lossy(&out.stdout).contains(flag))
}

/// An HTTP/1.0 GET on loopback: the status code and the body.
pub fn get(addr: &str, path: &str) -> anyhow::Result<(u16, String)> {
    let mut stream = TcpStream::connect(addr).with_context(|| format!("connecting to {addr}"))?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n")?;
    let mut text = String::new();
    stream.read_to_string(&mut text)?;
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .with_context(|| format!("GET {path}: no status in {head:?}"))?;
    Ok((code, body.to_owned()))
}

/// Numbers the agent's pods of a run.
static STARTS: AtomicU32 = AtomicU32::new(0);

impl Agent {
    /// Starts the agent and brings it to ready: our kubelet registers it once its
    /// registration socket appears, then `/readyz` (the pod's readiness probe) must say 200.
    pub fn start(
        config: &AgentConfig,
        kubelet: &mut Kubelet,
        teardown: &Teardown,
    ) -> anyhow::Result<Self> {
        // Flags of the e2e, of the phase and of the command line, after the agent's own.
        let mut flags = vec![
            format!("--reserved-cpus={}", config.reserved),
            format!("--kubeconfig={}", config.kubeconfig.display()),
        ];
        // /debug/state has a listener of its own in newer agents; never its default port, which
        // another run on this machine may hold.
        if has_flag(&config.bin, "--debug-addr")? {
            flags.push(format!("--debug-addr={}", free_addr()?));
        }
        flags.extend(config.phase.iter().cloned());
        flags.extend(config.extra.iter().cloned());
        kubelet.forget();
        let (run, ready, live) = match &config.launch {
            Launch::Process => {
                let metrics = free_addr()?;
                let mut cmd = Command::new(&config.bin);
                cmd.arg("run")
                    .args(["--node-name", &config.node])
                    .args(["--driver-name", &config.driver])
                    .arg("--nri-socket")
                    .arg(&config.nri_socket)
                    .arg("--kubelet-plugins-dir")
                    .arg(config.plugins_dir())
                    .arg("--kubelet-registry-dir")
                    .arg(config.registry_dir())
                    .arg("--cdi-dir")
                    .arg(&config.cdi_dir)
                    .arg("--state-dir")
                    .arg(config.state_dir())
                    .args(["--metrics-addr", &metrics])
                    .args(&flags)
                    .env("NO_COLOR", "1")
                    .env("RUST_LOG", "info");
                let proc = Proc::start("resmgr", cmd, &config.log(), teardown)?;
                let ready = (metrics.clone(), "/readyz".to_owned());
                (Run::Process(proc), ready, None)
            }
            Launch::Container(launch) => {
                let (container, pod) = Container::start(config, launch, &flags).map_err(|e| {
                    anyhow::anyhow!(
                        "starting the agent's container: {e:#}\n--- its log:\n{}",
                        crate::procs::tail(&config.log(), 40)
                    )
                })?;
                let addr = format!("127.0.0.1:{}", pod.port);
                let live = pod.liveness.clone().map(|path| (addr.clone(), path));
                (Run::Container(container), (addr, pod.readiness), live)
            }
        };
        let mut agent = Self {
            run,
            addr: ready.0.clone(),
        };
        // A registration socket left by a killed agent may be there before the new one is: dial
        // until the agent answers, as the kubelet's plugin watcher does on each new socket.
        let mut last = None;
        wait_until("the agent to accept its registration", LIMIT, || {
            agent.check_alive(config)?;
            if kubelet.registration_socket().is_none() {
                return Ok(false);
            }
            match kubelet.register() {
                Ok(()) => Ok(true),
                Err(e) => {
                    last = Some(e);
                    Ok(false)
                }
            }
        })
        .with_context(|| {
            format!(
                "last registration error: {last:?}\n{}",
                crate::procs::tail(&config.log(), 40)
            )
        })?;
        let (addr, path) = ready;
        wait_until(&format!("{path} to answer 200"), LIMIT, || {
            agent.check_alive(config)?;
            Ok(get(&addr, &path).is_ok_and(|(code, _)| code == 200))
        })?;
        if let Some((addr, path)) = live {
            let (code, body) = get(&addr, &path)?;
            ensure!(
                code == 200,
                "the liveness probe {path} answers {code}: {body}"
            );
        }
        Ok(agent)
    }

    /// A GET on the agent's metrics listener (its probes' port): the status code and the body.
    pub fn get(&self, path: &str) -> anyhow::Result<(u16, String)> {
        get(&self.addr, path)
    }

    fn check_alive(&mut self, config: &AgentConfig) -> anyhow::Result<()> {
        let exited = match &mut self.run {
            Run::Process(proc) => proc.exited()?.is_some(),
            Run::Container(c) => !teardown::alive(c.pid),
        };
        if exited {
            bail!(
                "the agent exited while starting:\n{}",
                crate::procs::tail(&config.log(), 40)
            );
        }
        Ok(())
    }

    /// Stops the agent: SIGTERM as the kubelet stops a container (grace period, then SIGKILL),
    /// or SIGKILL at once (a crash); its exit status.
    pub fn stop(self, signal: Signal) -> anyhow::Result<ExitStatus> {
        match self.run {
            Run::Process(mut proc) => proc.signal_and_wait(signal, LIMIT),
            Run::Container(c) => {
                if signal == Signal::TERM {
                    c.cri.stop(&c.id, c.grace)?;
                } else {
                    teardown::kill(c.pid, signal);
                    ensure!(
                        teardown::wait_gone(c.pid, LIMIT),
                        "the agent's container (pid {}) outlived {signal:?}",
                        c.pid
                    );
                }
                c.finish()
            }
        }
    }

    /// Waits for the agent to exit on its own (its runtime went away).
    pub fn wait_exit(self) -> anyhow::Result<Exited> {
        match self.run {
            Run::Process(mut proc) => Ok(Exited {
                status: Some(proc.wait(LIMIT)?),
                container: None,
            }),
            Run::Container(c) => {
                ensure!(
                    teardown::wait_gone(c.pid, LIMIT),
                    "the agent's container (pid {}) did not exit within {LIMIT:?}",
                    c.pid
                );
                Ok(Exited {
                    status: None,
                    container: Some(c),
                })
            }
        }
    }
}

// === impl Container ===

impl Container {
    /// Renders the chart for this node, runs its pod, checks the process runs as the pod's
    /// security context says.
    fn start(
        config: &AgentConfig,
        launch: &ContainerLaunch,
        flags: &[String],
    ) -> anyhow::Result<(Self, AgentPod)> {
        let n = STARTS.fetch_add(1, Ordering::Relaxed);
        let metrics_port: u16 = free_addr()?
            .rsplit_once(':')
            .and_then(|(_, p)| p.parse().ok())
            .context("a free port")?;
        let values = NodeValues {
            image: launch.image.clone(),
            nri_socket_dir: config
                .nri_socket
                .parent()
                .context("the NRI socket has no directory")?
                .to_owned(),
            kubelet_root: config.kubelet_root(),
            cdi_dir: config.cdi_dir.clone(),
            state_dir: config.state_dir(),
            metrics_port,
        };
        ensure!(
            config.nri_socket.file_name() == Some("nri.sock".as_ref()),
            "the chart names the NRI socket nri.sock in its directory; the runtime's is {}",
            config.nri_socket.display()
        );
        let values_file = config.dir.join(format!("chart-values-{n}.yaml"));
        std::fs::write(&values_file, values.yaml()?)?;
        let docs = daemonset::render(&launch.helm, &launch.chart, &values_file)?;
        let mut pod = daemonset::translate(&docs, &config.node, &config.dir.join("configmaps"))?;
        ensure!(
            pod.image == launch.image,
            "the DaemonSet runs {}, the agent's image is {}",
            pod.image,
            launch.image
        );
        for dir in &pod.make_dirs {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        for (path, text) in &pod.files {
            std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
        }
        // The fake API server's kubeconfig, at its own path (no service account token here).
        pod.mounts.push(daemonset::Mount {
            host: config.kubeconfig.clone(),
            container: config.kubeconfig.clone(),
            readonly: true,
        });
        pod.args.extend(flags.iter().cloned());

        if n == 0 && !pod.host_network {
            eprintln!(
                "e2e: the DaemonSet's pod has its own network; here it gets the node's (no CNI)"
            );
        }
        let cri = launch.cri.clone();
        let sandbox = Pod {
            name: format!("{}-{}", pod.name, n),
            namespace: pod.namespace.clone(),
            uid: crate::scenarios::pod_uid(&format!("agent{n}")),
            qos: pod.qos,
        };
        for key in &pod.pod_uid_env {
            pod.env.push((key.clone(), sandbox.uid.clone()));
        }
        let mut sandbox_config = cri.pod_config(&sandbox);
        let logs = config.dir.join("agent-logs");
        std::fs::create_dir_all(&logs)?;
        sandbox_config["log_directory"] = json!(logs);
        // CRI NamespaceMode: POD 0, CONTAINER 1, NODE 2. The network is always the node's here
        // (no CNI); the PID and IPC namespaces are what the pod spec asks.
        sandbox_config["linux"]["security_context"]["namespace_options"] = json!({
            "network": 2,
            "pid": if pod.host_pid { 2 } else { 1 },
            "ipc": if pod.host_ipc { 2 } else { 0 },
        });
        let pod_id = cri.run_pod_config(&sandbox.name, &sandbox_config)?;
        let mut security = pod.security.clone();
        security["namespace_options"] =
            sandbox_config["linux"]["security_context"]["namespace_options"].clone();
        let mut container = json!({
            "metadata": {"name": "resmgr"},
            "image": {"image": pod.image},
            "args": pod.args,
            "envs": pod.env.iter().map(|(k, v)| json!({"key": k, "value": v})).collect::<Vec<_>>(),
            "mounts": pod.mounts.iter().map(|m| json!({
                "container_path": m.container, "host_path": m.host, "readonly": m.readonly,
            })).collect::<Vec<_>>(),
            "log_path": format!("resmgr-{n}.log"),
            "linux": {"resources": pod.resources, "security_context": security},
        });
        if !pod.command.is_empty() {
            container["command"] = json!(pod.command);
        }
        let id = cri.create_and_start(&pod_id, &sandbox.name, &container, &sandbox_config)?;
        let pid = cri.pid(&id)?;
        let started = Self {
            cri,
            pod_id,
            id,
            pid,
            grace: pod.grace,
        };
        started.check_security(&pod.expect)?;
        Ok((started, pod))
    }

    /// The agent's process as the kernel sees it against what its security context asks.
    fn check_security(&self, want: &daemonset::Expected) -> anyhow::Result<()> {
        let path = format!("/proc/{}/status", self.pid);
        let status = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {path}: the agent's process is gone"))?;
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(&format!("{name}:")))
                .map(|v| v.split_whitespace().collect::<Vec<_>>())
                .unwrap_or_default()
        };
        let mut wrong = Vec::new();
        if let Some(uid) = want.uid
            && field("Uid").iter().any(|u| *u != uid.to_string())
        {
            wrong.push(format!("Uid {:?}, want {uid}", field("Uid")));
        }
        if let Some(gid) = want.gid
            && field("Gid").iter().any(|g| *g != gid.to_string())
        {
            wrong.push(format!("Gid {:?}, want {gid}", field("Gid")));
        }
        if want.no_capabilities {
            for set in ["CapEff", "CapPrm", "CapBnd"] {
                if field(set)
                    .first()
                    .is_none_or(|c| !c.trim_start_matches('0').is_empty())
                {
                    wrong.push(format!("{set} {:?}, want none", field(set)));
                }
            }
        }
        if want.no_new_privs && field("NoNewPrivs").first() != Some(&"1") {
            wrong.push(format!("NoNewPrivs {:?}", field("NoNewPrivs")));
        }
        // 2: a seccomp filter.
        if want.seccomp && field("Seccomp").first() != Some(&"2") {
            wrong.push(format!("Seccomp {:?}, want a filter (2)", field("Seccomp")));
        }
        ensure!(
            wrong.is_empty(),
            "the agent's process (pid {}) does not run as its securityContext says: {}",
            self.pid,
            wrong.join("; ")
        );
        Ok(())
    }

    /// The container's exit status from the runtime (which learns of the exit from the shim a
    /// moment after the process is gone); then its pod goes.
    fn finish(self) -> anyhow::Result<ExitStatus> {
        wait_until(
            "the runtime to report the agent's container exited",
            LIMIT,
            || Ok(self.cri.inspect(&self.id)?["status"]["state"] == "CONTAINER_EXITED"),
        )?;
        let code = self.cri.exit_code(&self.id)?;
        self.cri.remove_pod(&self.pod_id)?;
        Ok(ExitStatus::from_raw(code << 8))
    }
}

/// The image runs unprivileged: containers of `image` with nothing but its own configuration
/// (user 65532) print the topology (hwloc reading /sys) and the default configuration file, and
/// exit 0.
pub fn check_image_unprivileged(cri: &Cri, image: &str, dir: &Path) -> anyhow::Result<()> {
    let pod = Pod {
        name: "image-check".into(),
        namespace: "default".into(),
        uid: crate::scenarios::pod_uid("imagechk"),
        qos: crate::cri::Qos::BestEffort,
    };
    let mut pod_config = cri.pod_config(&pod);
    let logs = dir.join("image-check");
    std::fs::create_dir_all(&logs)?;
    pod_config["log_directory"] = json!(logs);
    let pod_id = cri.run_pod_config(&pod.name, &pod_config)?;
    let checks: [(&str, &[&str], &str); 2] = [
        ("topology", &["topology"], "cpu"),
        (
            "config",
            &["config", "--print-defaults"],
            "kind: AgentConfiguration",
        ),
    ];
    for (name, args, want) in checks {
        let container = json!({
            "metadata": {"name": name},
            "image": {"image": image},
            "args": args,
            "log_path": format!("{name}.log"),
            "linux": {"security_context": {"namespace_options": cri.namespace_options()}},
        });
        let id = cri.create_and_start(
            &pod_id,
            &format!("image-check-{name}"),
            &container,
            &pod_config,
        )?;
        wait_until(
            &format!("`resmgr {}` in the image to exit", args.join(" ")),
            LIMIT,
            || Ok(cri.inspect(&id)?["status"]["state"] == "CONTAINER_EXITED"),
        )?;
        let inspect = cri.inspect(&id)?;
        let code = inspect["status"]["exitCode"].as_i64();
        let log = std::fs::read_to_string(logs.join(format!("{name}.log"))).unwrap_or_default();
        let uid = &inspect["info"]["runtimeSpec"]["process"]["user"]["uid"];
        ensure!(
            code == Some(0) && log.contains(want),
            "`resmgr {}` in the image exited {code:?}, want 0 and {want:?} in:\n{log}",
            args.join(" ")
        );
        ensure!(
            uid.as_i64() == Some(65532),
            "the image ran as uid {uid}, want its own user 65532"
        );
    }
    cri.remove_pod(&pod_id)
}
