//! containerd for one run: its configuration (everything under the run directory: root, state,
//! sockets, NRI, CDI, runc's state, the shims' sockets), starting, stopping and restarting it,
//! and importing the test image.
//!
//! The configuration keys are containerd 2.x's (config version 3, which 2.4 migrates on load):
//! - NRI on, with its own socket, and plugin directories of the run's own, so that no plugin
//!   installed on the host is started;
//! - `cdi_spec_dirs` = the agent's `--cdi-dir`;
//! - runc with its own `Root` and cgroupfs (`SystemdCgroup = false`): the pods' cgroup parents
//!   are plain paths, like the kubelet's with the cgroupfs driver;
//! - `disable_hugetlb_controller = false`: containerd's default (`true`) silently drops every
//!   hugepage limit, the kubelet's and those NRI plugins set, so a claim's hugepages would never
//!   reach the container's hugetlb cgroup;
//! - `restrict_oom_score_adj = true`: without CAP_SYS_RESOURCE (as on some VMs), runc cannot
//!   lower a container's oom_score_adj below containerd's own and fails with `can't get final
//!   child's PID from pipe: EOF`;
//! - no CNI (every pod uses the host's network), no imports of host configuration, the pinned
//!   sandbox image is our test image (no registry is needed, or reachable).

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use anyhow::{Context as _, bail};
use rustix::process::Signal;

use crate::{
    Tools,
    cri::Cri,
    procs::{Proc, wait_until},
    runtime::{Kind, Runtime},
    teardown::Teardown,
};

/// How long containerd may take to start or stop.
const LIMIT: Duration = Duration::from_secs(60);

/// The paths of a run's containerd.
#[derive(Debug, Clone)]
pub struct Paths {
    pub dir: PathBuf,
    pub config: PathBuf,
    pub socket: PathBuf,
    pub nri_socket: PathBuf,
    pub cdi_dir: PathBuf,
    pub log: PathBuf,
}

impl Paths {
    pub fn under(dir: &Path) -> Self {
        Self {
            dir: dir.to_owned(),
            config: dir.join("containerd.toml"),
            socket: dir.join("containerd.sock"),
            // In a directory, as a node has it: the agent's DaemonSet mounts the directory.
            nri_socket: dir.join("nri/nri.sock"),
            cdi_dir: dir.join("cdi"),
            log: dir.join("containerd.log"),
        }
    }
}

/// A TOML basic string.
pub(crate) fn toml_str(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => out.push_str(&format!("\\u{:04x}", u32::from(c))),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// The configuration of a run's containerd.
pub fn config(paths: &Paths, runc: &Path, sandbox_image: &str) -> String {
    let p = |name: &str| toml_str(&paths.dir.join(name).display().to_string());
    format!(
        r#"# containerd for one resmgr e2e run: everything lives under this directory.
version = 3
root = {root}
state = {state}
temp = {temp}
imports = []
# Snapshotters and differs this run does not use (and that probe the host when loaded).
disabled_plugins = [
  "io.containerd.snapshotter.v1.blockfile",
  "io.containerd.snapshotter.v1.erofs",
  "io.containerd.differ.v1.erofs",
  "io.containerd.mount-handler.v1.erofs",
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper",
]

[grpc]
  address = {socket}

[ttrpc]
  address = {ttrpc}

[plugins.'io.containerd.internal.v1.opt']
  path = {opt}

[plugins.'io.containerd.shim.v1.manager']
  # At most 42 characters: the shims' socket paths add 65 to it.
  socket_dir = {shims}

[plugins.'io.containerd.nri.v1.nri']
  disable = false
  socket_path = {nri}
  plugin_path = {nri_plugins}
  plugin_config_path = {nri_conf}

[plugins.'io.containerd.cri.v1.images'.pinned_images]
  sandbox = {sandbox}

[plugins.'io.containerd.cri.v1.runtime']
  cdi_spec_dirs = [{cdi}]
  restrict_oom_score_adj = true
  disable_hugetlb_controller = false

[plugins.'io.containerd.cri.v1.runtime'.cni]
  conf_dir = {cni_conf}
  bin_dirs = [{cni_bin}]

[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
  BinaryName = {runc}
  Root = {runc_root}
  SystemdCgroup = false

[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
"#,
        root = p("root"),
        state = p("state"),
        temp = p("tmp"),
        socket = toml_str(&paths.socket.display().to_string()),
        ttrpc = p("containerd.sock.ttrpc"),
        opt = p("opt"),
        shims = p("s"),
        nri = toml_str(&paths.nri_socket.display().to_string()),
        nri_plugins = p("nri/plugins"),
        nri_conf = p("nri/conf.d"),
        sandbox = toml_str(sandbox_image),
        cdi = toml_str(&paths.cdi_dir.display().to_string()),
        cni_conf = p("cni/conf.d"),
        cni_bin = p("cni/bin"),
        runc = toml_str(&runc.display().to_string()),
        runc_root = p("runc"),
    )
}

/// A run's containerd.
#[derive(Debug)]
pub struct Containerd {
    pub paths: Paths,
    tools: Tools,
    proc: Option<Proc>,
    teardown: Teardown,
}

impl Containerd {
    /// Writes the configuration; [`Self::start`] starts it.
    pub fn new(
        paths: Paths,
        tools: &Tools,
        sandbox_image: &str,
        teardown: &Teardown,
    ) -> anyhow::Result<Self> {
        let shims = paths.dir.join("s");
        if shims.as_os_str().len() > 42 {
            bail!(
                "the run directory {} is too long for containerd's shim sockets (at most 40 characters)",
                paths.dir.display()
            );
        }
        std::fs::write(&paths.config, config(&paths, &tools.runc, sandbox_image))
            .with_context(|| format!("writing {}", paths.config.display()))?;
        for dir in ["cdi", "nri/plugins", "nri/conf.d", "cni/conf.d", "cni/bin"] {
            std::fs::create_dir_all(paths.dir.join(dir))?;
        }
        Ok(Self {
            paths,
            tools: tools.clone(),
            proc: None,
            teardown: teardown.clone(),
        })
    }
}

impl Runtime for Containerd {
    fn name(&self) -> &'static str {
        "containerd"
    }

    fn kind(&self) -> Kind {
        Kind::Containerd
    }

    fn paths(&self) -> &Paths {
        &self.paths
    }

    fn start(&mut self, cri: &Cri) -> anyhow::Result<()> {
        let mut cmd = Command::new(self.tools.dir.join("containerd"));
        cmd.arg("--config").arg(&self.paths.config);
        // containerd finds the shim on PATH, the shim finds runc by the configured name.
        let path = std::env::var_os("PATH").unwrap_or_default();
        let mut dirs = vec![self.tools.dir.clone()];
        dirs.extend(std::env::split_paths(&path));
        cmd.env("PATH", std::env::join_paths(dirs)?);
        let mut proc = Proc::start("containerd", cmd, &self.paths.log, &self.teardown)?;
        let started = wait_until("containerd's CRI service", LIMIT, || {
            if let Some(status) = proc.exited()? {
                bail!(
                    "containerd exited ({status}) while starting:\n{}",
                    proc.tail(30)
                );
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
            bail!(
                "containerd exited with {status} on SIGTERM:\n{}",
                proc.tail(30)
            );
        }
        Ok(())
    }

    /// Imports the archive into the CRI namespace (and unpacks it); the name is in it.
    fn import(&self, _cri: &Cri, archive: &Path, _name: &str) -> anyhow::Result<()> {
        let out = Command::new(self.tools.dir.join("ctr"))
            .arg("--address")
            .arg(&self.paths.socket)
            .args(["--namespace", "k8s.io", "images", "import", "--local"])
            .arg(archive)
            .output()
            .context("running ctr images import")?;
        if !out.status.success() {
            bail!(
                "ctr images import {} failed: {}\n{}",
                archive.display(),
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_config_keeps_everything_under_the_run_directory() {
        let paths = Paths::under(Path::new("/tmp/run"));
        let text = config(&paths, Path::new("/usr/sbin/runc"), "localhost/e2e:1");
        assert!(text.contains(r#"root = "/tmp/run/root""#), "{text}");
        assert!(text.contains(r#"socket_path = "/tmp/run/nri/nri.sock""#));
        assert!(text.contains(r#"cdi_spec_dirs = ["/tmp/run/cdi"]"#));
        assert!(text.contains("imports = []"));
        assert!(text.contains("restrict_oom_score_adj = true"));
        assert!(text.contains("disable_hugetlb_controller = false"));
        assert!(text.contains("SystemdCgroup = false"));
        assert!(text.contains(r#"sandbox = "localhost/e2e:1""#));
        // Every absolute path in it is the run's, apart from runc's binary.
        let quoted: Vec<&str> = text.split('"').skip(1).step_by(2).collect();
        assert!(quoted.len() > 10, "{quoted:?}");
        for q in quoted {
            if q.starts_with('/') {
                assert!(q.starts_with("/tmp/run/") || q == "/usr/sbin/runc", "{q}");
            }
        }
    }

    #[test]
    fn toml_strings_are_escaped() {
        assert_eq!(toml_str(r#"/a "b" \c"#), r#""/a \"b\" \\c""#);
        assert_eq!(toml_str("x\ny"), r#""x\u000ay""#);
    }
}
