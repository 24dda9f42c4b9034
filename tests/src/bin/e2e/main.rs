//! `e2e`: resmgr end to end on a real runtime. containerd with NRI and runc, or CRI-O with NRI,
//! runc and conmon (`--runtime`, [`runtime`]), real containers in real cgroups created over CRI
//! (`crictl`), the agent as the NRI plugin and the DRA driver (a
//! container of its image run as the chart's DaemonSet runs it, or `resmgr run`: [`agent`]),
//! our kubelet client on its DRA socket and resmgr's fake API server; every scenario is checked
//! in the kernel's view of each container. `cargo xtask e2e` builds the pieces and runs this.
//!
//! It plays the kubelet (registration, prepare and unprepare over the DRA socket, pods and
//! containers over CRI) where a real one cannot serve: its scenarios act at exact instants a
//! kubelet gives no hold on (the agent killed with SIGKILL or the runtime stopped between two
//! given steps, containers created while a claim is prepared, a stray CDI spec planted while the
//! agent is down) and compare the runtime's own CRI reports with the kernel around them. What a
//! real kubelet does (claims from templates, unprepare when a pod goes, an in-place resize, its
//! own restart and the agent pod's) is the cluster stage's, on containerd and on CRI-O, with
//! nothing played (`tests/controlplane/clusterscenarios`); on CRI-O this runner runs only the
//! scenarios that need it ([`scenarios::ON_CRIO`], each with why).
//!
//! Each run lives in a mount namespace of its own (its mounts never reach the host: [`hugetlb`]),
//! a directory of its own (sockets, the runtime's root and state, runc's state,
//! the agent's state, CDI specs, logs) and a cgroup root of its own
//! (`/resmgr-e2e-<id>-kubepods/{burstable,besteffort}/pod<uid>`, named like the kubelet's so
//! the agent reads each pod's QoS class from it), so several runs can share a machine. When it
//! ends, however it ends, everything it started is stopped by PID and everything it created is
//! removed ([`teardown`]).
//!
//! `e2e ... -- COMMAND` runs no scenarios: it brings the node up (the runtime and a fake API
//! server holding the Node, no agent) and runs COMMAND with the node in its environment
//! ([`NODE_ENV`]), for people and suites that bring their own agent (and API server); then
//! tears the node down.

mod agent;
mod apiserver;
mod containerd;
mod cri;
mod crio;
mod daemonset;
mod hugetlb;
mod kernel;
mod kubelet;
mod procs;
mod runtime;
mod scenarios;
mod teardown;

use std::{
    path::{Path, PathBuf},
    process::ExitCode,
    time::Instant,
};

use anyhow::{Context as _, bail};
use clap::Parser;
use policy::CpuSet;

use crate::{
    agent::{AgentConfig, ContainerLaunch, Launch},
    apiserver::{AllocatedClaim, ApiServer as _, FakeApiServer},
    containerd::Containerd,
    cri::Cri,
    crio::{Crio, CrioTools},
    kernel::Machine,
    kubelet::Kubelet,
    runtime::{Kind, Runtime},
    scenarios::World,
    teardown::{Guard, Teardown},
};

/// The driver name the agent serves.
const DRIVER: &str = "topology-aware.resmgr.io";
/// The node's name in the API server.
const NODE: &str = "e2e-node";

/// The variables `e2e -- COMMAND` gives COMMAND.
pub const NODE_ENV: [&str; 10] = [
    "RESMGR_E2E_RUN_DIR",
    "RESMGR_E2E_CRI_ENDPOINT",
    "RESMGR_E2E_CRICTL",
    "RESMGR_E2E_CRICTL_CONFIG",
    "RESMGR_E2E_NRI_SOCKET",
    "RESMGR_E2E_CDI_DIR",
    "RESMGR_E2E_IMAGE",
    "RESMGR_E2E_CGROUP_ROOT",
    "RESMGR_E2E_KUBECONFIG",
    "RESMGR_E2E_NODE",
];

/// resmgr end to end on containerd and runc, or on CRI-O.
#[derive(Debug, Parser)]
#[command(name = "e2e")]
struct Args {
    /// The runtime to run on.
    #[arg(long, value_enum, default_value_t = Kind::Containerd)]
    runtime: Kind,
    /// The directory holding crictl, and containerd, containerd-shim-runc-v2 and ctr.
    #[arg(long, value_name = "DIR")]
    tools: PathBuf,
    /// CRI-O's `crio` binary (with `--runtime crio`).
    #[arg(long, value_name = "FILE")]
    crio: Option<PathBuf>,
    /// CRI-O's `pinns` binary (with `--runtime crio`).
    #[arg(long, value_name = "FILE")]
    pinns: Option<PathBuf>,
    /// conmon (with `--runtime crio`).
    #[arg(long, value_name = "FILE", default_value = "/usr/bin/conmon")]
    conmon: PathBuf,
    /// CRI-O's OCI runtime, crun or runc (with `--runtime crio`).
    #[arg(long, value_name = "FILE", default_value = "/usr/sbin/runc")]
    oci_runtime: PathBuf,
    /// docs/deploy.md, whose CRI-O drop-in the run's CRI-O uses (with `--runtime crio`).
    #[arg(long, value_name = "FILE")]
    deploy_doc: Option<PathBuf>,
    /// The runc binary.
    #[arg(long, default_value = "/usr/sbin/runc")]
    runc: PathBuf,
    /// The test image, an OCI archive.
    #[arg(long, value_name = "FILE")]
    image: PathBuf,
    /// The image's name in the archive.
    #[arg(long)]
    image_name: String,
    /// The `resmgr` binary.
    #[arg(long, value_name = "FILE")]
    resmgr: PathBuf,
    /// How the agent runs: as a container of its image, as its DaemonSet runs it, or as a
    /// `resmgr run` process on the host.
    #[arg(long, value_enum, default_value_t = AgentAs::Container)]
    agent_as: AgentAs,
    /// The agent's image, an OCI archive (with `--agent-as container`).
    #[arg(long, value_name = "FILE")]
    agent_image: Option<PathBuf>,
    /// The agent image's name in the archive; the chart's values must name it.
    #[arg(long)]
    agent_image_name: Option<String>,
    /// the chart renderer `helm-chart` (tools/helm-chart), which renders the chart (with `--agent-as container`).
    #[arg(long, value_name = "FILE")]
    helm: Option<PathBuf>,
    /// The Helm chart's directory (with `--agent-as container`).
    #[arg(long, value_name = "DIR")]
    chart: Option<PathBuf>,
    /// The fake API server binary.
    #[arg(long, value_name = "FILE")]
    fake_apiserver: PathBuf,
    /// Where the run's directory is made; short, for the unix socket paths in it.
    #[arg(long, default_value = "/tmp")]
    run_root: PathBuf,
    /// Keep the run's directory (its logs) at the end.
    #[arg(long)]
    keep: bool,
    /// An extra flag for `resmgr run` (repeat for more).
    #[arg(long = "agent-arg", value_name = "FLAG", allow_hyphen_values = true)]
    agent_args: Vec<String>,
    /// Run only these scenarios (repeat; default: all, in order). Most build on the ones
    /// before them (the claim moves the shared containers they started).
    #[arg(long, value_name = "SCENARIO")]
    only: Vec<String>,
    /// Bring the node up, run this command against it, tear down.
    #[arg(last = true)]
    command: Vec<String>,
}

/// How the agent is started.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum AgentAs {
    Container,
    Process,
}

/// The binaries containerd needs.
#[derive(Debug, Clone)]
pub struct Tools {
    pub dir: PathBuf,
    pub runc: PathBuf,
}

/// Set in the environment once the runner is in a mount namespace of its own.
const PRIVATE_MOUNTS: &str = "RESMGR_E2E_PRIVATE_MOUNTS";

/// Whether this process is in another mount namespace than the one it was started from (its
/// parent's: unshare(1) execs the runner, so that is whoever ran unshare).
pub fn private_mounts() -> anyhow::Result<bool> {
    let ns = |pid: &str| {
        let path = format!("/proc/{pid}/ns/mnt");
        std::fs::read_link(&path).with_context(|| format!("reading {path}"))
    };
    Ok(std::env::var_os(PRIVATE_MOUNTS).is_some()
        && ns("self")? != ns(&std::os::unix::process::parent_id().to_string())?)
}

fn main() -> ExitCode {
    // The run's mounts (containerd's root filesystems, the hugetlb controller) are made in a
    // mount namespace of its own, whose mounts never reach the host (host mounts still reach
    // it) and go with it, however the run ends: the runner execs itself under unshare(1),
    // before any thread, the PID staying the same.
    if std::env::var_os(PRIVATE_MOUNTS).is_none() {
        use std::os::unix::process::CommandExt as _;
        let exe = std::env::current_exe();
        let err = match exe {
            Ok(exe) => std::process::Command::new("unshare")
                .args(["--mount", "--propagation", "slave", "--"])
                .arg(exe)
                .args(std::env::args_os().skip(1))
                .env(PRIVATE_MOUNTS, "1")
                .exec(),
            Err(e) => e,
        };
        eprintln!("e2e: FAILED: entering a private mount namespace (unshare --mount): {err}");
        return ExitCode::FAILURE;
    }
    let args = Args::parse();
    let teardown = Teardown::default();
    let result = run(&args, &teardown);
    if let Some(signal) = teardown.interrupted() {
        // What failed after the signal failed because of the teardown: say only that.
        eprintln!("e2e: interrupted by signal {signal}; everything the run started is stopped");
        return ExitCode::from(u8::try_from(128 + signal).unwrap_or(u8::MAX));
    }
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("e2e: FAILED: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &Args, teardown: &Teardown) -> anyhow::Result<ExitCode> {
    let started = Instant::now();
    let machine = Machine::read()?;
    kernel::cpuset_mount()?;
    let tools: &[&str] = match args.runtime {
        Kind::Containerd => &["containerd", "containerd-shim-runc-v2", "ctr", "crictl"],
        Kind::Crio => &["crictl"],
    };
    for tool in tools {
        let path = args.tools.join(tool);
        if !path.is_file() {
            bail!("{} is missing", path.display());
        }
    }
    let run_dir = tempfile::Builder::new()
        .prefix(teardown::RUN_PREFIX)
        .tempdir_in(&args.run_root)
        .with_context(|| format!("making a run directory in {}", args.run_root.display()))?
        .keep();
    teardown::claim_run(&run_dir)?;
    let cgroup_root = teardown::cgroup_root_of(&run_dir);
    eprintln!(
        "e2e: run directory {}, cgroup root {cgroup_root}",
        run_dir.display()
    );

    teardown.set_run_dir(&run_dir, args.keep);
    let _guard = Guard(teardown.clone());
    teardown.on_signals(args.command.is_empty())?;
    teardown.cgroup_root(&cgroup_root);
    let hugepages = hugepages(&run_dir)?;
    // After the mount: a stale run's hugetlb cgroups are seen, and go, too.
    teardown::sweep_stale(&args.run_root);

    let mut runtime = runtime(args, &run_dir, teardown)?;
    let paths = runtime.paths().clone();
    let cri = Cri::new(
        &args.tools.join("crictl"),
        &paths.socket,
        &run_dir,
        &args.image_name,
        &cgroup_root,
    )?;
    runtime
        .start(&cri)
        .with_context(|| format!("starting {}:\n{}", runtime.name(), runtime.tail(30)))?;
    {
        // Pods go while the runtime still answers: it stops the containers and shims (or
        // monitors), and unmounts their root filesystems, itself.
        let cri = cri.clone();
        teardown.graceful(move || {
            if let Err(e) = cri.remove_all_pods() {
                eprintln!("e2e: removing the pods: {e:#}");
            }
        });
    }
    runtime.import(&cri, &args.image, &args.image_name)?;
    let launch = match args.agent_as {
        AgentAs::Process => Launch::Process,
        AgentAs::Container if args.command.is_empty() => {
            let need = |what: &Option<PathBuf>, flag: &str| {
                what.clone()
                    .with_context(|| format!("--agent-as container needs {flag}"))
            };
            let image = args
                .agent_image_name
                .clone()
                .context("--agent-as container needs --agent-image-name")?;
            runtime.import(&cri, &need(&args.agent_image, "--agent-image")?, &image)?;
            // The image starts unprivileged before it runs as the DaemonSet runs it.
            agent::check_image_unprivileged(&cri, &image, &run_dir)?;
            Launch::Container(ContainerLaunch {
                cri: cri.clone(),
                image,
                helm: need(&args.helm, "--helm")?,
                chart: need(&args.chart, "--chart")?,
            })
        }
        AgentAs::Container => Launch::Process,
    };
    eprintln!(
        "e2e: {} up and image imported in {:.1} s",
        runtime.name(),
        started.elapsed().as_secs_f64()
    );

    if !args.command.is_empty() {
        let api =
            FakeApiServer::start(&args.fake_apiserver, &run_dir, NODE, DRIVER, &[], teardown)?;
        return exec(args, &run_dir, &paths, &cri, &cgroup_root, api.kubeconfig());
    }

    let reserved: CpuSet = machine
        .online
        .difference(&machine.isolated)
        .first()
        .into_iter()
        .collect();
    let first = plan_claim(&machine, &reserved)?;
    let claims = vec![
        first.clone(),
        plan_next_claim(&machine, &reserved, &first),
        plan_memory_claim(&first, hugepages.is_ok()),
    ];
    let api = FakeApiServer::start(
        &args.fake_apiserver,
        &run_dir,
        NODE,
        DRIVER,
        &claims,
        teardown,
    )?;
    let agent_config = AgentConfig {
        launch,
        bin: args.resmgr.clone(),
        node: NODE.into(),
        driver: DRIVER.into(),
        nri_socket: paths.nri_socket.clone(),
        cdi_dir: paths.cdi_dir.clone(),
        kubeconfig: api.kubeconfig().to_owned(),
        reserved: format!("cpuset:{reserved}"),
        dir: run_dir.clone(),
        extra: args.agent_args.clone(),
        phase: Vec::new(),
        state: "agent-state".into(),
    };
    let kubelet = Kubelet::new(agent_config.registry_dir(), DRIVER)?;
    let mut world = World::new(
        machine,
        reserved,
        cri,
        runtime,
        kubelet,
        agent_config,
        teardown.clone(),
        claims,
        hugepages.err(),
    );
    eprintln!(
        "e2e: the agent runs {}",
        match args.agent_as {
            AgentAs::Container => "as a container of its image, as the chart's DaemonSet runs it",
            AgentAs::Process => "as a resmgr run process",
        }
    );
    let result = world.run(&args.only);
    println!("{}", scenarios::table(&world.rows));
    for note in &world.notes {
        println!("note: {note}");
    }
    if let Err(e) = result {
        eprintln!("e2e: FAILED: {e:#}");
        let log = world.agent_config.log();
        eprintln!(
            "--- the agent ({}):\n{}",
            log.display(),
            procs::tail(&log, 40)
        );
        eprintln!(
            "--- {} ({}):\n{}",
            world.runtime.name(),
            paths.log.display(),
            procs::tail(&paths.log, 20)
        );
        return Ok(ExitCode::FAILURE);
    }
    drop(api);
    eprintln!(
        "e2e: all scenarios passed in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    Ok(ExitCode::SUCCESS)
}

/// The run's runtime, configured (not started yet).
fn runtime(args: &Args, run_dir: &Path, teardown: &Teardown) -> anyhow::Result<Box<dyn Runtime>> {
    Ok(match args.runtime {
        Kind::Containerd => {
            let tools = Tools {
                dir: args.tools.clone(),
                runc: args.runc.clone(),
            };
            let paths = containerd::Paths::under(run_dir);
            Box::new(Containerd::new(paths, &tools, &args.image_name, teardown)?)
        }
        Kind::Crio => {
            let need = |what: &Option<PathBuf>, flag: &str| {
                what.clone()
                    .with_context(|| format!("--runtime crio needs {flag}"))
            };
            let tools = CrioTools {
                crio: need(&args.crio, "--crio")?,
                pinns: need(&args.pinns, "--pinns")?,
                conmon: args.conmon.clone(),
                oci_runtime: args.oci_runtime.clone(),
            };
            for path in [&tools.crio, &tools.pinns, &tools.conmon, &tools.oci_runtime] {
                if !path.is_file() {
                    bail!("{} is missing", path.display());
                }
            }
            let doc = need(&args.deploy_doc, "--deploy-doc")?;
            let text = std::fs::read_to_string(&doc)
                .with_context(|| format!("reading {}", doc.display()))?;
            let dropin = crio::deploy_dropin(&text)
                .with_context(|| format!("reading the CRI-O drop-in of {}", doc.display()))?;
            let paths = crio::paths(run_dir);
            Box::new(Crio::new(
                paths,
                &tools,
                &args.image_name,
                &dropin,
                teardown,
            )?)
        }
    })
}

/// The claim the scenarios prepare: half the claimable CPUs (at least one) of the NUMA node
/// with the most of them, for the pod `db`.
fn plan_claim(machine: &Machine, reserved: &CpuSet) -> anyhow::Result<AllocatedClaim> {
    let allowed = machine.online.difference(&machine.isolated);
    let (node, claimable) = machine
        .nodes
        .iter()
        .map(|(id, cpus)| (*id, cpus.intersection(&allowed).difference(reserved).len()))
        .max_by_key(|(id, n)| (*n, std::cmp::Reverse(*id)))
        .context("no NUMA node")?;
    if claimable == 0 {
        bail!("no CPU is left to claim next to the reserved CPU {reserved}: the e2e needs 2 CPUs");
    }
    Ok(AllocatedClaim {
        namespace: "default".into(),
        name: "db-cpus".into(),
        uid: "c1a1e2e0-0000-4000-8000-000000000001".into(),
        pod_name: "db".into(),
        pod_uid: scenarios::pod_uid("db"),
        device: format!("numa{node}"),
        cpus: (claimable / 2).max(1),
        ..AllocatedClaim::default()
    })
}

/// The claim of the memory scenario: one CPU, [`scenarios::CLAIMED_MEMORY`] and, when the run
/// reserved hugepages, [`scenarios::CLAIMED_HUGEPAGES`] of 2 MiB pages, on the first claim's
/// device, for the pod `hp`.
fn plan_memory_claim(first: &AllocatedClaim, hugepages: bool) -> AllocatedClaim {
    AllocatedClaim {
        namespace: "default".into(),
        name: "hp-memory".into(),
        uid: "c1a1e2e0-0000-4000-8000-000000000003".into(),
        pod_name: "hp".into(),
        pod_uid: scenarios::pod_uid("hp"),
        device: first.device.clone(),
        cpus: 1,
        memory: scenarios::CLAIMED_MEMORY,
        hugepages_2mi: if hugepages {
            scenarios::CLAIMED_HUGEPAGES
        } else {
            0
        },
    }
}

/// How many 2 MiB pages a run reserves: what the memory scenario claims, and one more.
const RESERVED_PAGES: u64 = scenarios::CLAIMED_HUGEPAGES / (2 << 20) + 1;

/// Mounts the hugetlb controller and reserves the run's hugepages; `Err` says why hugetlb
/// limits cannot be checked here (which fails the run under CI=true).
fn hugepages(run_dir: &Path) -> anyhow::Result<Result<u64, String>> {
    let ready = match hugetlb::mount(run_dir) {
        Err(e) => Err(format!("{e:#}")),
        Ok(point) => {
            if let Some(point) = point {
                eprintln!("e2e: hugetlb controller mounted at {}", point.display());
            }
            match hugetlb::reserve(Path::new(hugetlb::NR_HUGEPAGES_2M), run_dir, RESERVED_PAGES) {
                Ok(got) if got * (2 << 20) >= scenarios::CLAIMED_HUGEPAGES => Ok(got),
                Ok(got) => Err(format!(
                    "{} gave {got} of the {RESERVED_PAGES} 2 MiB pages asked for (memory too fragmented?)",
                    hugetlb::NR_HUGEPAGES_2M
                )),
                Err(e) => Err(format!("{e:#}")),
            }
        }
    };
    match &ready {
        Ok(pages) => eprintln!("e2e: {pages} 2 MiB pages reserved"),
        Err(reason) if std::env::var("CI").is_ok_and(|v| v == "true") => {
            bail!("CI=true and the hugetlb limits cannot be checked here: {reason}")
        }
        Err(reason) => eprintln!(
            "e2e: NOT CHECKED: hugetlb limits, because {reason} (under CI=true this is a failure)"
        ),
    }
    Ok(ready)
}

/// The claim prepared after a stray spec was swept: every claimable CPU of the first claim's
/// NUMA node, for the pod `next`.
fn plan_next_claim(machine: &Machine, reserved: &CpuSet, first: &AllocatedClaim) -> AllocatedClaim {
    let allowed = machine.online.difference(&machine.isolated);
    let claimable = first
        .device
        .strip_prefix("numa")
        .and_then(|n| n.parse().ok())
        .and_then(|n| machine.nodes.get(&n))
        .map_or(0, |cpus| {
            cpus.intersection(&allowed).difference(reserved).len()
        });
    AllocatedClaim {
        namespace: "default".into(),
        name: "next-cpus".into(),
        uid: "c1a1e2e0-0000-4000-8000-000000000002".into(),
        pod_name: "next".into(),
        pod_uid: scenarios::pod_uid("next"),
        device: first.device.clone(),
        cpus: claimable.max(1),
        ..AllocatedClaim::default()
    }
}

/// Runs the user's command against the node.
fn exec(
    args: &Args,
    run_dir: &Path,
    paths: &containerd::Paths,
    cri: &Cri,
    cgroup_root: &str,
    kubeconfig: &Path,
) -> anyhow::Result<ExitCode> {
    let (crictl, crictl_config) = cri.crictl();
    let values = [
        run_dir.display().to_string(),
        format!("unix://{}", paths.socket.display()),
        crictl.display().to_string(),
        crictl_config.display().to_string(),
        paths.nri_socket.display().to_string(),
        paths.cdi_dir.display().to_string(),
        args.image_name.clone(),
        cgroup_root.to_owned(),
        kubeconfig.display().to_string(),
        NODE.to_owned(),
    ];
    let mut cmd = std::process::Command::new(&args.command[0]);
    cmd.args(&args.command[1..]);
    for (name, value) in NODE_ENV.iter().zip(values) {
        cmd.env(name, value);
    }
    let status = cmd
        .status()
        .with_context(|| format!("running {:?}", args.command))?;
    Ok(if status.success() {
        ExitCode::SUCCESS
    } else {
        eprintln!("e2e: {:?} failed: {status}", args.command);
        ExitCode::FAILURE
    })
}
