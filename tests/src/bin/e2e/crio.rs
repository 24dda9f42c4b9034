//! CRI-O for one run: its configuration (everything under the run directory: storage, state,
//! sockets, NRI, CDI, the OCI runtime's state, conmon's files), starting, stopping and
//! restarting it, and making the test images available to it.
//!
//! The configuration is a main file of the run's own and a drop-in directory of the run's own
//! (never `/etc/crio`):
//! - NRI is off in the main file and turned on only by the drop-in docs/deploy.md tells
//!   operators to install ([`deploy_dropin`]), so a broken documented configuration fails the
//!   run; a later drop-in of the run points the NRI socket into the run directory;
//! - `cdi_spec_dirs` = the agent's `--cdi-dir`;
//! - runc (or crun) with its own state root, conmon as the monitor in the pod's cgroup, the
//!   cgroupfs manager: the pods' cgroup parents are plain paths, like the kubelet's with the
//!   cgroupfs driver;
//! - storage (overlay) under the run directory, with the files CRI-O keeps to tell a reboot or an
//!   unclean shutdown from a restart (`version_file`, `clean_shutdown_file`) there too, so a
//!   restart keeps the running containers as a node's restart does;
//! - no registry: the default transport is `oci-archive:` of a directory of the run where each
//!   image's archive is linked under its repository's name, so `crictl pull` of the test images
//!   goes through CRI-O's own image service; a signature policy of the run accepts them;
//! - no CNI (every pod uses the host's network), and the irqbalance files CRI-O may write are
//!   the run's, not `/etc/sysconfig`'s.

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use anyhow::{Context as _, bail, ensure};
use rustix::process::Signal;

use crate::{
    containerd::{Paths, toml_str},
    cri::Cri,
    procs::{Proc, wait_until},
    runtime::{Kind, Runtime},
    teardown::Teardown,
};

/// How long CRI-O may take to start or stop.
const LIMIT: Duration = Duration::from_secs(60);

/// The heading docs/deploy.md puts above the CRI-O drop-in, naming its file.
const DEPLOY_HEADING: &str = "**CRI-O** (a drop-in, `/etc/crio/crio.conf.d/";

/// The binaries CRI-O needs.
#[derive(Debug, Clone)]
pub struct CrioTools {
    pub crio: PathBuf,
    pub pinns: PathBuf,
    pub conmon: PathBuf,
    /// The OCI runtime (crun or runc).
    pub oci_runtime: PathBuf,
}

/// The paths of a run's CRI-O (its own directory under the run's: `crio/`).
pub fn paths(run_dir: &Path) -> Paths {
    Paths {
        dir: run_dir.to_owned(),
        config: run_dir.join("crio.conf"),
        socket: run_dir.join("crio.sock"),
        // In a directory, as a node has it: the agent's DaemonSet mounts the directory.
        nri_socket: run_dir.join("nri/nri.sock"),
        cdi_dir: run_dir.join("cdi"),
        log: run_dir.join("crio.log"),
    }
}

/// The drop-in docs/deploy.md gives for CRI-O: its file name and its text.
pub fn deploy_dropin(doc: &str) -> anyhow::Result<(String, String)> {
    let start = doc
        .find(DEPLOY_HEADING)
        .context("docs/deploy.md has no CRI-O drop-in")?;
    let rest = &doc[start + DEPLOY_HEADING.len()..];
    let name = rest
        .split('`')
        .next()
        .filter(|n| n.ends_with(".conf") && !n.contains('/'))
        .context("the CRI-O drop-in's heading names no file")?;
    let body = rest
        .split_once("```toml\n")
        .and_then(|(_, b)| b.split_once("\n```"))
        .map(|(b, _)| b)
        .context("the CRI-O drop-in has no toml block")?;
    Ok((name.to_owned(), format!("{body}\n")))
}

/// The main configuration of a run's CRI-O.
pub fn config(paths: &Paths, tools: &CrioTools, sandbox_image: &str) -> String {
    let p = |name: &str| toml_str(&paths.dir.join(name).display().to_string());
    let bin = |path: &Path| toml_str(&path.display().to_string());
    let runtime = runtime_name(&tools.oci_runtime);
    format!(
        r#"# CRI-O for one resmgr e2e run: everything lives under this directory.
[crio]
root = {root}
runroot = {runroot}
storage_driver = "overlay"
log_dir = {pod_logs}
version_file = {version}
version_file_persist = {version_persist}
clean_shutdown_file = {clean_shutdown}

[crio.api]
listen = {socket}
stream_address = "127.0.0.1"
stream_port = "0"

[crio.runtime]
default_runtime = "{runtime}"
cgroup_manager = "cgroupfs"
pinns_path = {pinns}
namespaces_dir = {namespaces}
container_exits_dir = {exits}
container_attach_socket_dir = {attach}
cdi_spec_dirs = [{cdi}]
hooks_dir = []
decryption_keys_path = {keys}
selinux = false
irqbalance_config_file = {irqbalance}
irqbalance_config_restore_file = {irqbalance_restore}

[crio.runtime.runtimes.{runtime}]
runtime_path = {oci_runtime}
runtime_type = "oci"
runtime_root = {runtime_root}
monitor_path = {conmon}
monitor_cgroup = "pod"

[crio.image]
default_transport = {transport}
pause_image = {sandbox}
pause_command = ""
signature_policy = {policy}
big_files_temporary_dir = {tmp}

[crio.network]
network_dir = {cni_conf}
plugin_dirs = [{cni_bin}]

[crio.metrics]
enable_metrics = false

[crio.nri]
# Off here: the drop-in docs/deploy.md gives operators turns it on.
enable_nri = false
nri_plugin_dir = {nri_plugins}
nri_plugin_config_dir = {nri_conf}
"#,
        root = p("crio/root"),
        runroot = p("crio/run"),
        pod_logs = p("crio/pod-logs"),
        version = p("crio/version"),
        version_persist = p("crio/version-persist"),
        clean_shutdown = p("crio/clean.shutdown"),
        socket = toml_str(&paths.socket.display().to_string()),
        pinns = bin(&tools.pinns),
        namespaces = p("crio/ns"),
        exits = p("crio/exits"),
        attach = p("crio/attach"),
        cdi = toml_str(&paths.cdi_dir.display().to_string()),
        keys = p("crio/keys"),
        irqbalance = p("crio/irqbalance"),
        irqbalance_restore = p("crio/orig_irq_banned_cpus"),
        oci_runtime = bin(&tools.oci_runtime),
        runtime_root = p(runtime),
        conmon = bin(&tools.conmon),
        transport = toml_str(&format!(
            "oci-archive:{}/",
            paths.dir.join("images").display()
        )),
        sandbox = toml_str(sandbox_image),
        policy = p("crio/policy.json"),
        tmp = p("crio/tmp"),
        cni_conf = p("cni/net.d"),
        cni_bin = p("cni/bin"),
        nri_plugins = p("nri/plugins"),
        nri_conf = p("nri/conf.d"),
    )
}

/// The drop-in of the run that follows the documented one: the run's NRI socket instead of the
/// node's.
fn run_dropin(paths: &Paths) -> String {
    format!(
        "# After the documented drop-in: this run's NRI socket, not the node's.\n[crio.nri]\nnri_listen = {}\n",
        toml_str(&paths.nri_socket.display().to_string())
    )
}

/// The handler's name for an OCI runtime binary (`crun`, `runc`).
fn runtime_name(path: &Path) -> &str {
    match path.file_name().and_then(|n| n.to_str()) {
        Some("runc") => "runc",
        _ => "crun",
    }
}

/// A run's CRI-O.
#[derive(Debug)]
pub struct Crio {
    paths: Paths,
    tools: CrioTools,
    dropins: PathBuf,
    proc: Option<Proc>,
    teardown: Teardown,
}

impl Crio {
    /// Writes the configuration, with the documented drop-in `deploy` (its file name and
    /// text); [`Runtime::start`] starts it.
    pub fn new(
        paths: Paths,
        tools: &CrioTools,
        sandbox_image: &str,
        deploy: &(String, String),
        teardown: &Teardown,
    ) -> anyhow::Result<Self> {
        for dir in [
            "cdi",
            "nri/plugins",
            "nri/conf.d",
            "cni/net.d",
            "cni/bin",
            "images",
            "crio/conf.d",
            "crio/tmp",
        ] {
            std::fs::create_dir_all(paths.dir.join(dir))?;
        }
        std::fs::write(&paths.config, config(&paths, tools, sandbox_image))
            .with_context(|| format!("writing {}", paths.config.display()))?;
        let dropins = paths.dir.join("crio/conf.d");
        let (name, text) = deploy;
        ensure!(
            name.as_str() < "95-e2e-run.conf",
            "the documented drop-in {name} sorts after the run's own"
        );
        std::fs::write(dropins.join(name), text)?;
        std::fs::write(dropins.join("95-e2e-run.conf"), run_dropin(&paths))?;
        std::fs::write(
            paths.dir.join("crio/policy.json"),
            r#"{"default": [{"type": "insecureAcceptAnything"}]}"#,
        )?;
        Ok(Self {
            paths,
            tools: tools.clone(),
            dropins,
            proc: None,
            teardown: teardown.clone(),
        })
    }
}

impl Runtime for Crio {
    fn name(&self) -> &'static str {
        "CRI-O"
    }

    fn kind(&self) -> Kind {
        Kind::Crio
    }

    fn paths(&self) -> &Paths {
        &self.paths
    }

    fn start(&mut self, cri: &Cri) -> anyhow::Result<()> {
        let mut cmd = Command::new(&self.tools.crio);
        cmd.arg("--config")
            .arg(&self.paths.config)
            .arg("--config-dir")
            .arg(&self.dropins)
            .args(["--log-level", "info"]);
        let mut proc = Proc::start("crio", cmd, &self.paths.log, &self.teardown)?;
        let started = wait_until("CRI-O's CRI service", LIMIT, || {
            if let Some(status) = proc.exited()? {
                bail!("CRI-O exited ({status}) while starting:\n{}", proc.tail(30));
            }
            Ok(self.paths.socket.exists() && cri.ready())
        });
        self.proc = Some(proc);
        started
    }

    fn running(&self) -> bool {
        self.proc.is_some()
    }

    fn stop(&mut self) -> anyhow::Result<()> {
        let Some(mut proc) = self.proc.take() else {
            return Ok(());
        };
        let status = proc.signal_and_wait(Signal::TERM, LIMIT)?;
        if !status.success() {
            bail!("CRI-O exited with {status} on SIGTERM:\n{}", proc.tail(30));
        }
        Ok(())
    }

    /// Links the archive under the image's repository in the images directory (the default
    /// transport's), then has CRI-O pull the image from it.
    fn import(&self, cri: &Cri, archive: &Path, name: &str) -> anyhow::Result<()> {
        let (repository, _tag) = name
            .rsplit_once(':')
            .filter(|(r, _)| !r.is_empty() && !r.contains(".."))
            .with_context(|| format!("the image name {name:?} has no tag"))?;
        let link = self.paths.dir.join("images").join(repository);
        if let Some(parent) = link.parent() {
            std::fs::create_dir_all(parent)?;
        }
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(archive, &link)
            .with_context(|| format!("linking {} to {}", link.display(), archive.display()))?;
        cri.pull(name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tools() -> CrioTools {
        CrioTools {
            crio: "/opt/crio".into(),
            pinns: "/opt/pinns".into(),
            conmon: "/usr/bin/conmon".into(),
            oci_runtime: "/usr/bin/crun".into(),
        }
    }

    #[test]
    fn the_config_keeps_everything_under_the_run_directory() {
        let paths = paths(Path::new("/tmp/run"));
        let text = config(&paths, &tools(), "localhost/e2e:1");
        assert!(text.contains(r#"root = "/tmp/run/crio/root""#), "{text}");
        assert!(text.contains(r#"cdi_spec_dirs = ["/tmp/run/cdi"]"#));
        assert!(text.contains(r#"cgroup_manager = "cgroupfs""#));
        assert!(text.contains("[crio.runtime.runtimes.crun]"));
        assert!(text.contains(r#"pause_image = "localhost/e2e:1""#));
        assert!(text.contains("enable_nri = false"));
        let tools = tools();
        let binaries = [&tools.crio, &tools.pinns, &tools.conmon, &tools.oci_runtime];
        let quoted: Vec<&str> = text.split('"').skip(1).step_by(2).collect();
        assert!(quoted.len() > 20, "{quoted:?}");
        for q in quoted {
            let q = q.strip_prefix("oci-archive:").unwrap_or(q);
            if q.starts_with('/') {
                assert!(
                    q.starts_with("/tmp/run/") || binaries.iter().any(|b| Path::new(q) == *b),
                    "{q}"
                );
            }
        }
        assert!(run_dropin(&paths).contains(r#"nri_listen = "/tmp/run/nri/nri.sock""#));
    }

    #[test]
    fn the_documented_dropin_turns_nri_on_at_the_nodes_socket() {
        let doc = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/deploy.md"),
        )
        .unwrap();
        let (name, text) = deploy_dropin(&doc).unwrap();
        assert_eq!(name, "90-nri.conf");
        assert!(text.starts_with("[crio.nri]\n"), "{text}");
        assert!(text.contains("enable_nri = true"), "{text}");
        assert!(
            text.contains(r#"nri_listen = "/var/run/nri/nri.sock""#),
            "{text}"
        );
    }

    #[test]
    fn a_doc_without_the_dropin_is_an_error() {
        assert!(deploy_dropin("# deploy\n").is_err());
        let no_block = format!("{DEPLOY_HEADING}90-nri.conf`):\n\nnothing\n");
        assert!(deploy_dropin(&no_block).is_err());
    }

    #[test]
    fn the_runtime_handler_is_named_after_the_binary() {
        assert_eq!(runtime_name(Path::new("/usr/sbin/runc")), "runc");
        assert_eq!(runtime_name(Path::new("/usr/bin/crun")), "crun");
    }
}
