//! The agent under test: `resmgr run` against the run's containerd (NRI), the kubelet's
//! directories of the run, the API server's kubeconfig, and loopback ports of its own, started,
//! made ready (registered by our kubelet, `/readyz` answering 200) and stopped the ways a
//! node stops it.

use std::{
    io::{Read as _, Write as _},
    net::{TcpListener, TcpStream},
    path::{Path, PathBuf},
    process::{Command, ExitStatus},
    time::Duration,
};

use anyhow::{Context as _, bail};
use rustix::process::Signal;

use crate::{
    kubelet::Kubelet,
    procs::{Proc, wait_until},
    teardown::Teardown,
};

/// How long the agent may take to become ready or to stop.
const LIMIT: Duration = Duration::from_secs(60);

/// How to run the agent.
#[derive(Debug, Clone)]
pub struct AgentConfig {
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
    pub fn plugins_dir(&self) -> PathBuf {
        self.dir.join("kubelet/plugins")
    }

    pub fn registry_dir(&self) -> PathBuf {
        self.dir.join("kubelet/plugins_registry")
    }

    pub fn state_dir(&self) -> PathBuf {
        self.dir.join(&self.state)
    }
}

/// A running agent.
#[derive(Debug)]
pub struct Agent {
    proc: Proc,
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

impl Agent {
    /// Starts the agent and brings it to ready: our kubelet registers it once its
    /// registration socket appears, then `/readyz` must say 200.
    pub fn start(
        config: &AgentConfig,
        kubelet: &mut Kubelet,
        teardown: &Teardown,
    ) -> anyhow::Result<Self> {
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
            .arg("--kubeconfig")
            .arg(&config.kubeconfig)
            .args(["--reserved-cpus", &config.reserved])
            .args(["--metrics-addr", &metrics]);
        // /debug/state has a listener of its own in newer agents; never its default port, which
        // another run on this machine may hold.
        if has_flag(&config.bin, "--debug-addr")? {
            cmd.args(["--debug-addr", &free_addr()?]);
        }
        cmd.args(&config.phase)
            .args(&config.extra)
            .env("NO_COLOR", "1")
            .env("RUST_LOG", "info");
        kubelet.forget();
        let mut proc = Proc::start("resmgr", cmd, &config.dir.join("agent.log"), teardown)?;
        let socket = kubelet.registration_socket();
        let check_alive = |proc: &mut Proc| -> anyhow::Result<()> {
            if let Some(status) = proc.exited()? {
                bail!(
                    "resmgr run exited ({status}) while starting:\n{}",
                    proc.tail(40)
                );
            }
            Ok(())
        };
        // A registration socket left by a killed agent may be there before the new one is: dial
        // until the agent answers, as the kubelet's plugin watcher does on each new socket.
        let mut last = None;
        wait_until("the agent to accept its registration", LIMIT, || {
            check_alive(&mut proc)?;
            if !socket.exists() {
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
        .with_context(|| format!("last registration error: {last:?}\n{}", proc.tail(40)))?;
        wait_until("/readyz to answer 200", LIMIT, || {
            check_alive(&mut proc)?;
            Ok(get(&metrics, "/readyz").is_ok_and(|(code, _)| code == 200))
        })?;
        Ok(Self { proc })
    }

    /// Sends `signal` and waits for the exit.
    pub fn stop(mut self, signal: Signal) -> anyhow::Result<ExitStatus> {
        self.proc.signal_and_wait(signal, LIMIT)
    }

    /// Waits for the agent to exit on its own (its runtime went away).
    pub fn wait_exit(mut self) -> anyhow::Result<ExitStatus> {
        self.proc.wait(LIMIT)
    }
}
