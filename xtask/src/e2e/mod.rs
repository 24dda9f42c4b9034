//! `cargo xtask e2e`: resmgr end to end, in stages (`--stage` picks; default all), each a
//! module with its own prerequisites:
//!
//! - [`containerd`]: on containerd and runc, real containers checked in the kernel, through the
//!   runner `tests/src/bin/e2e`, which plays the kubelet at instants a real one does not give;
//! - [`crio`]: those of its scenarios that need an exact instant or a fault, on CRI-O, runc and
//!   conmon, through the same runner;
//! - [`controlplane`]: against a real kube-apiserver, kube-scheduler and
//!   kube-controller-manager, on nodes without a kubelet (any topology, flags and gates);
//! - [`cluster`]: in a real one-node cluster, kubelet and controller-manager included, the agent
//!   installed with Helm, on containerd and on CRI-O;
//! - [`node_v2`]: that cluster with its node in a VM with systemd, cgroup v2 alone and the
//!   systemd cgroup driver, on the newest release, on containerd and on CRI-O.
//!
//! The last two run once per Kubernetes release the repository has a build module for
//! ([`build::kubernetes::releases`]; `--kubernetes 1.37` picks one), the cluster stage once per
//! runtime of each ([`cluster::runtimes`]; `--runtime crio` picks one). What the stages run is
//! built by [`crate::build`]; `cargo xtask test` runs each stage after the conformance tests when
//! the machine can, and under `CI=true` a missing prerequisite fails the run instead
//! ([`in_test`]).

pub mod args;
pub mod cluster;
pub mod containerd;
pub mod controlplane;
pub mod crio;
pub mod node_v2;

use std::{
    path::{Path, PathBuf},
    sync::atomic::{AtomicBool, Ordering},
};

use anyhow::bail;

use args::Scenarios;
pub use args::{E2eArgs, Runtime, Stage};

use crate::{
    build::{self, background::Background, kubernetes},
    missing,
    timing::Steps,
    workspace,
};

/// `cargo xtask e2e`: the stages `args` selects, in order.
pub fn run(root: &Path, args: &E2eArgs) -> anyhow::Result<()> {
    // A command runs against the containerd stage's node; the control plane has none to give.
    let all = args.stage.is_empty() && args.command.is_empty();
    if args.stage.is_empty() && !args.command.is_empty() {
        return containerd::run(root, args, None);
    }
    if all || args.stage.contains(&Stage::Containerd) {
        containerd::run(root, args, None)?;
    }
    if all || args.stage.contains(&Stage::Crio) {
        crio::run(root, args, None)?;
    }
    let releases = kubernetes::select(root, &args.kubernetes)?;
    if all || args.stage.contains(&Stage::Controlplane) {
        let missing = controlplane::prerequisites();
        if !missing.is_empty() {
            bail!(
                "the control plane e2e cannot run here:\n{}",
                missing::list(&missing)
            );
        }
        let bin_dir = workspace::build_test_binaries(root)?;
        for release in &releases {
            let binaries = kubernetes::binaries(release, None)?;
            controlplane::run(root, &bin_dir, release, &binaries)?;
        }
    }
    if all || args.stage.contains(&Stage::Cluster) {
        for release in &releases {
            let binaries = kubernetes::binaries(release, None)?;
            for runtime in cluster::runtimes(release, &args.runtime) {
                cluster::run(
                    root,
                    args.scenarios(),
                    release,
                    runtime,
                    &binaries,
                    cluster::Prefetched::default(),
                )?;
            }
        }
    }
    if all || args.stage.contains(&Stage::NodeV2) {
        let releases = if args.kubernetes.is_empty() {
            vec![node_v2::release(root)?]
        } else {
            releases
        };
        for release in &releases {
            for runtime in node_v2::runtimes(&args.runtime) {
                node_v2::run(
                    root,
                    args.scenarios(),
                    args.all,
                    release,
                    runtime,
                    None,
                    cluster::Prefetched::default(),
                    None,
                    None,
                )?;
            }
        }
    }
    Ok(())
}

/// What the stages need built, building in the background ([`start_builds`]); the stages of
/// both lanes of [`in_test`] ask it for what they need.
#[derive(Debug)]
pub struct Builds {
    containerd: Option<Background<PathBuf>>,
    crio: Option<Background<PathBuf>>,
    kubernetes: Option<kubernetes::Prefetch>,
    helm: Option<Background<PathBuf>>,
    vm_image: Option<Background<build::vm_image::VmImage>>,
}

impl Builds {
    /// What a cluster takes from these builds.
    fn prefetched(&self) -> cluster::Prefetched<'_> {
        cluster::Prefetched {
            containerd: self.containerd.as_ref(),
            crio: self.crio.as_ref(),
            helm: self.helm.as_ref(),
        }
    }

    /// Whether everything the node-v2 stage on `release` needs from the background builds is
    /// built (or was in the cache).
    fn ready_for_node_v2(&self, release: &kubernetes::Release) -> bool {
        let done = |b: &Option<Background<PathBuf>>| b.as_ref().is_none_or(Background::is_done);
        done(&self.containerd)
            && done(&self.crio)
            && done(&self.helm)
            && self.vm_image.as_ref().is_none_or(Background::is_done)
            && self.kubernetes.as_ref().is_none_or(|p| p.is_built(release))
    }

    /// `release`'s control plane: from its background build, or from the cache.
    fn control_plane(&self, release: &kubernetes::Release) -> anyhow::Result<PathBuf> {
        match &self.kubernetes {
            Some(prefetch) => prefetch.get(release),
            None => kubernetes::binaries(release, None),
        }
    }
}

/// Starts building, in the background, what each stage the machine can run needs: `cargo xtask
/// test` does this first, so that on a fresh machine the Go module downloads and builds
/// (minutes, `nice`d) and the VM image overlap the Rust build and tests instead of following
/// them.
pub fn start_builds(root: &Path) -> Builds {
    let can = |missing: Vec<missing::Missing>| missing.is_empty();
    Builds {
        containerd: can(containerd::prerequisites()).then(build::containerd::in_background),
        kubernetes: can(controlplane::prerequisites())
            .then(|| kubernetes::in_background(root))
            .flatten(),
        helm: can(cluster::prerequisites()).then(|| build::helm::in_background(root)),
        crio: can(crio::prerequisites()).then(build::crio::in_background),
        vm_image: can(node_v2::prerequisites_on(Runtime::Containerd))
            .then(build::vm_image::in_background),
    }
}

/// One stage of [`in_test`]: the stage, and the release and runtime it runs on where it runs
/// once per release (and runtime).
type Planned = (Stage, Option<kubernetes::Release>, Option<Runtime>);

/// The e2e as steps of `cargo xtask test` (each timed in `steps`): each stage runs when the
/// machine can, with what [`start_builds`] started; when it cannot, fail under `CI=true` (CI
/// machines are made for it) and otherwise say what is missing and go on.
///
/// The stages run in two lanes, on two threads:
/// - **this machine's node**: the containerd and CRI-O stages, then the control plane and
///   cluster stages once per Kubernetes release ([`kubernetes::releases`]), the primary
///   release's first, and the cluster stage once per runtime of the release
///   ([`cluster::runtimes`]). The releases are built in the background in that order, so on a
///   fresh machine the next release's build overlaps the stages of the one before it.
/// - **the VM's node, beside it**: the node-v2 stage on the newest release, on containerd and
///   then on CRI-O, the scenarios CI runs ([`node_v2::left_out`]). The emulated node costs
///   about a core and a half for twelve minutes, while the cluster stages beside it mostly wait
///   for pods; one after the other they made the longest run of all (34:35 on two cores, and
///   23:27 beside). Its scenarios' output goes to a log per runtime, printed whole after both
///   lanes end, and it runs `nice`d, so that the stages of this machine's node keep their
///   pace. When one lane fails, the other stops after the stage it is in.
///
///   It runs beside only when everything it needs is built as the e2e begins (a machine whose
///   builds are cached). On a fresh machine the Kubernetes builds still keep both cores busy
///   then, and the newest release is built last: the node could start only after it, beside
///   stages that by then use a core, and an emulated node short of CPU slows more than the
///   stages it shares with. Measured from empty caches, the node-v2 stage on containerd took
///   13:16 beside them instead of 5:46 after them, and the run took longer than one after the
///   other. So there it runs after the other stages, as one lane.
///
/// On the newest release the cluster stage runs on this machine's node only the scenarios whose
/// outcome is the release's ([`cluster::RELEASE_SPECIFIC`]), unless `all`: that release's
/// kubelet refuses cgroup v1 by default, so its users' node is the node-v2 stage's, where the
/// rest of that release runs; on this machine's cgroup v1 the rest would check a node its users
/// have to opt into, for five more minutes.
pub fn in_test(root: &Path, builds: Builds, steps: &mut Steps, all: bool) -> anyhow::Result<()> {
    let mut host: Vec<Planned> = vec![(Stage::Containerd, None, None), (Stage::Crio, None, None)];
    let newest = node_v2::release(root)?;
    for release in kubernetes::releases(root)? {
        host.push((Stage::Controlplane, Some(release.clone()), None));
        for runtime in cluster::runtimes(&release, &[]) {
            host.push((Stage::Cluster, Some(release.clone()), Some(runtime)));
        }
    }
    let vm: Vec<Planned> = node_v2::runtimes(&[])
        .into_iter()
        .map(|runtime| (Stage::NodeV2, Some(newest.clone()), Some(runtime)))
        .collect();
    // A log of an earlier run is not this run's.
    for (_, _, runtime) in &vm {
        let _ = std::fs::remove_file(node_v2::log_path(
            root,
            runtime.unwrap_or(Runtime::Containerd),
        )?);
    }
    let lanes = Lanes {
        root,
        builds: &builds,
        all,
        newest: &newest,
        failed: AtomicBool::new(false),
    };
    if !builds.ready_for_node_v2(&newest) {
        eprintln!(
            "the node-v2 stage runs after the others: what it needs is still building, and the \
             builds and the stages already keep both cores busy"
        );
        let host_result = lanes.run(&host, steps, false);
        return host_result.and_then(|()| lanes.run(&vm, steps, false));
    }
    let mut beside = steps.lane();
    let (host_result, vm_result) = std::thread::scope(|scope| {
        let vm_lane = scope.spawn(|| lanes.run(&vm, &mut beside, true));
        let host_result = lanes.run(&host, steps, false);
        let vm_result = vm_lane
            .join()
            .unwrap_or_else(|_| Err(anyhow::anyhow!("the node-v2 lane panicked")));
        (host_result, vm_result)
    });
    steps.merge(beside);
    for (_, _, runtime) in &vm {
        let runtime = runtime.unwrap_or(Runtime::Containerd);
        let log = node_v2::log_path(root, runtime)?;
        if let Ok(text) = std::fs::read_to_string(&log) {
            eprintln!(
                "\n--- the node-v2 e2e's scenarios on {}, which ran beside the stages above ({}):\n{text}--- end of {}",
                runtime.name(),
                log.display(),
                log.display()
            );
        }
    }
    match (host_result, vm_result) {
        (Err(host), Err(vm)) => Err(host.context(format!("and beside it: {vm:#}"))),
        (host, vm) => host.and(vm),
    }
}

/// What both lanes of [`in_test`] share.
struct Lanes<'a> {
    root: &'a Path,
    builds: &'a Builds,
    all: bool,
    newest: &'a kubernetes::Release,
    /// Set by the lane that fails, so that the other stops after its stage.
    failed: AtomicBool,
}

impl Lanes<'_> {
    /// Runs `plan`'s stages one after the other, each a step of `steps`; `beside`: this lane
    /// runs beside the other (its scenarios' output to logs, `nice`d).
    fn run(&self, plan: &[Planned], steps: &mut Steps, beside: bool) -> anyhow::Result<()> {
        let result = self.run_stages(plan, steps, beside);
        if result.is_err() {
            self.failed.store(true, Ordering::SeqCst);
        }
        result
    }

    fn run_stages(&self, plan: &[Planned], steps: &mut Steps, beside: bool) -> anyhow::Result<()> {
        let root = self.root;
        let builds = self.builds;
        // The newest release's own scenarios on this machine's node; the rest of it on
        // node-v2's.
        let release_specific: Vec<String> = cluster::RELEASE_SPECIFIC
            .iter()
            .map(|name| format!("^{name}$"))
            .collect();
        let cluster_scenarios = |release: &kubernetes::Release| {
            if self.all || release.is_primary() || release.minor() != self.newest.minor() {
                (Scenarios::ALL, "")
            } else {
                let only = Scenarios {
                    only: &release_specific,
                    ..Scenarios::ALL
                };
                (only, " (the release's own scenarios)")
            }
        };
        for (stage, release, runtime) in plan {
            let (stage, runtime) = (*stage, *runtime);
            let (name, missing) = match stage {
                Stage::Containerd => ("the containerd e2e", containerd::prerequisites()),
                Stage::Crio => ("the CRI-O e2e", crio::prerequisites()),
                Stage::Controlplane => ("the control plane e2e", controlplane::prerequisites()),
                Stage::Cluster => (
                    "the cluster e2e",
                    cluster::prerequisites_on(runtime.unwrap_or(Runtime::Containerd)),
                ),
                Stage::NodeV2 => (
                    "the node-v2 e2e (cgroup v2, systemd driver, in a VM)",
                    node_v2::prerequisites_on(runtime.unwrap_or(Runtime::Containerd)),
                ),
            };
            let on = match (release, runtime) {
                (Some(r), Some(rt)) => format!(" on Kubernetes {} and {}", r.minor(), rt.name()),
                (Some(r), None) => format!(" on Kubernetes {}", r.minor()),
                _ => String::new(),
            };
            let mut step = format!("{name}{on}");
            if let (Stage::Cluster, Some(release)) = (stage, release) {
                step.push_str(cluster_scenarios(release).1);
            }
            if self.failed.load(Ordering::SeqCst) {
                eprintln!("NOT RUN: {step}, because a stage beside it failed");
                steps.not_run(format!("{step} (a stage beside it failed)"));
                continue;
            }
            if !missing.is_empty() {
                if std::env::var("CI").is_ok_and(|v| v == "true") {
                    bail!(
                        "CI=true and {name}{on} cannot run here:\n{}",
                        missing::list(&missing)
                    );
                }
                let mut options = release
                    .as_ref()
                    .map(|r| format!(" --kubernetes {}", r.minor()))
                    .unwrap_or_default();
                if let Some(runtime) = runtime {
                    options.push_str(&format!(" --runtime {}", runtime.arg()));
                }
                eprintln!(
                    "NOT RUN: {name}{on} (`cargo xtask e2e --stage {}{options}`), because this machine lacks:\n{}\n\
                     (under CI=true this is a failure)",
                    clap::ValueEnum::to_possible_value(&stage)
                        .map(|v| v.get_name().to_owned())
                        .unwrap_or_default(),
                    missing::list(&missing)
                );
                steps.not_run(step);
                continue;
            }
            let args = E2eArgs {
                stage: vec![stage],
                ..E2eArgs::default()
            };
            match (stage, release, runtime) {
                (Stage::Containerd, ..) => steps.run(step, || {
                    containerd::run(root, &args, builds.containerd.as_ref())
                })?,
                (Stage::Crio, ..) => {
                    steps.run(step, || crio::run(root, &args, builds.crio.as_ref()))?
                }
                (Stage::Controlplane, Some(release), _) => steps.run(step, || {
                    let binaries = builds.control_plane(release)?;
                    let bin_dir = workspace::build_test_binaries(root)?;
                    controlplane::run(root, &bin_dir, release, &binaries)
                })?,
                (Stage::Cluster, Some(release), Some(runtime)) => steps.run(step, || {
                    let binaries = builds.control_plane(release)?;
                    cluster::run(
                        root,
                        cluster_scenarios(release).0,
                        release,
                        runtime,
                        &binaries,
                        builds.prefetched(),
                    )
                })?,
                (Stage::NodeV2, Some(release), Some(runtime)) => steps.run(step, || {
                    let binaries = builds.control_plane(release)?;
                    let log = node_v2::log_path(root, runtime)?;
                    node_v2::run(
                        root,
                        Scenarios::ALL,
                        self.all,
                        release,
                        runtime,
                        builds.vm_image.as_ref(),
                        builds.prefetched(),
                        Some(binaries),
                        beside.then_some(log.as_path()),
                    )
                })?,
                // The control plane, cluster and node-v2 stages are listed with their release
                // (and the cluster and node-v2 stages with their runtime).
                (Stage::Controlplane | Stage::Cluster | Stage::NodeV2, ..) => {}
            }
        }
        Ok(())
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::{fs, path::Path};

    use super::cluster;

    /// Fails unless `scenario` is a test of the Go package `tests/controlplane/<package>`.
    pub fn assert_scenario(package: &str, scenario: &str) {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../tests/controlplane")
            .join(package);
        let mut go = String::new();
        for entry in fs::read_dir(&dir).unwrap() {
            go.push_str(&fs::read_to_string(entry.unwrap().path()).unwrap());
        }
        let func = format!("func {scenario}(t *testing.T)");
        assert!(
            go.contains(&func),
            "{scenario} is not a test of {}",
            dir.display()
        );
    }

    /// A scenario renamed in Go and not here would leave CI, unnoticed.
    #[test]
    fn every_scenario_named_for_the_cluster_stage_is_one_of_it() {
        let named = cluster::RELEASE_SPECIFIC
            .iter()
            .chain(cluster::CONTAINERD_ONLY.iter().map(|(name, _)| name));
        for name in named {
            assert_scenario("clusterscenarios", name);
        }
    }
}
