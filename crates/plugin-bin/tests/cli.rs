//! Tests of the built `resmgr` binary, run as a user runs it: flags, the config file, the
//! simulator on every shipped scenario against its checked-in expected output, the SVG drawing,
//! the topology command, and signal handling of `resmgr run`.
//!
//! Expected outputs live next to the scenarios (`<name>.txt`, `<name>.json`). After an intended
//! change of the output, regenerate them with `RESMGR_BLESS=1 cargo test -p plugin-bin --test
//! cli` and review the diff.

use std::{
    path::{Path, PathBuf},
    process::{Command, Output},
};

fn resmgr() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_resmgr"));
    cmd.env_remove("NODE_NAME").env_remove("RUST_LOG");
    cmd
}

fn scenarios_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/scenarios")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn run_ok(cmd: &mut Command) -> Output {
    let out = cmd.output().expect("the binary runs");
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}\n{}",
        out.status,
        text(&out.stderr)
    );
    out
}

fn run_err(cmd: &mut Command) -> String {
    let out = cmd.output().expect("the binary runs");
    assert!(
        !out.status.success(),
        "{cmd:?} succeeded:\n{}",
        text(&out.stdout)
    );
    text(&out.stderr)
}

#[test]
fn every_flag_refuses_a_bad_value_naming_the_flag_the_value_and_what_is_allowed() {
    // (flag, bad value, words of the allowed values)
    let cases: &[(&str, &str, &str)] = &[
        ("--node-name", "Not_A_Node", "DNS subdomain"),
        ("--driver-name", "nodots", "DNS subdomain"),
        ("--driver-name", "UPPER.case.io", "DNS subdomain"),
        ("--nri-socket", "", "non-empty path"),
        ("--nri-plugin-index", "9", "exactly two digits"),
        ("--nri-plugin-index", "100", "exactly two digits"),
        ("--nri-plugin-index", "ab", "exactly two digits"),
        ("--kubelet-plugins-dir", "", "non-empty path"),
        ("--kubelet-registry-dir", " ", "non-empty path"),
        ("--cdi-dir", "", "non-empty path"),
        ("--state-dir", "", "non-empty path"),
        ("--unconfirmed-claim-grace", "2", "a duration such as `90s`"),
        ("--kubeconfig", "", "kubeconfig file"),
        ("--topology", "hwloc:thing", "`live`, `synthetic:"),
        ("--topology", "synthetic:", "`live`, `synthetic:"),
        ("--reserved-cpus", "3-1", "reservedSystemCPUs syntax"),
        ("--reserved-cpus", "many", "reservedSystemCPUs syntax"),
        ("--reserved-cpu-count", "0", "a whole number of CPUs"),
        ("--reserved-namespaces", "Kube_System", "namespace names"),
        ("--dra", "no", "`true` or `false`"),
        ("--log-level", "info,=[", "a level"),
        ("--metrics-addr", "localhost", "IP address and port"),
        ("--metrics-addr", "127.0.0.1", "IP address and port"),
        (
            "--debug-addr",
            "localhost:8892",
            "`off` or an IP address and port",
        ),
        ("--log-format", "xml", "`text` or `json`"),
        ("--node-allocatable-cpu", "yes", "`true` or `false`"),
        (
            "--cpu-exclusivity",
            "exclusive",
            "`claims`, `partition`, `pods`",
        ),
        (
            "--claim-cpus",
            "4",
            "only cpu-exclusivity partition uses it",
        ),
        ("--device-mode", "per-cpu", "`grouped`, `individual`"),
        ("--group-by", "die", "`numa`, `socket`"),
        ("--claim-granularity", "thread", "`cpu`, `core`"),
    ];
    for (flag, value, allowed) in cases {
        let mut cmd = resmgr();
        cmd.args(["run", "--print-config", flag, value])
            .env("NODE_NAME", "node-1");
        let err = run_err(&mut cmd);
        assert!(err.contains(flag), "{flag} {value:?}: {err}");
        assert!(
            err.contains(&format!("{value:?}")),
            "{flag} {value:?}: {err}"
        );
        assert!(err.contains(allowed), "{flag} {value:?}: {err}");
    }
}

#[test]
fn the_node_name_comes_from_the_flag_the_file_or_node_name_and_is_required() {
    let err = run_err(resmgr().args(["run", "--print-config"]));
    assert!(err.contains("--node-name is not set"), "{err}");
    let out = run_ok(
        resmgr()
            .args(["run", "--print-config"])
            .env("NODE_NAME", "from-env"),
    );
    assert!(text(&out.stdout).contains("node-name: from-env\n"));
    let out = run_ok(
        resmgr()
            .args(["run", "--print-config", "--node-name", "from-flag"])
            .env("NODE_NAME", "from-env"),
    );
    assert!(text(&out.stdout).contains("node-name: from-flag\n"));
    // Without DRA no name is needed.
    let out = run_ok(resmgr().args(["run", "--print-config", "--dra", "false"]));
    assert!(!text(&out.stdout).contains("node-name"));
}

/// The config file as YAML, read back.
fn yaml(out: &Output) -> serde_yaml_ng::Value {
    serde_yaml_ng::from_slice(&out.stdout).unwrap()
}

#[test]
fn the_config_file_sets_every_key_and_flags_win() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("resmgr.yaml");
    let body = "apiVersion: resmgr.io/v1alpha1\n\
         kind: AgentConfiguration\n\
         node-name: file-node\n\
         pod-uid: 0b6c2a4e-7f3d-4c1e-9a2b-5d6e7f8a9b0c\n\
         dra: true\n\
         driver-name: cpu.example.io\n\
         nri-socket: /file/nri.sock\n\
         nri-plugin-index: '10'\n\
         kubelet-plugins-dir: /file/plugins\n\
         kubelet-registry-dir: /file/registry\n\
         cdi-dir: /file/cdi\n\
         kubeconfig: /file/kubeconfig\n\
         node-allocatable-cpu: true\n\
         node-allocatable-memory: true\n\
         expose-pcie-roots: true\n\
         retry-waiting-pods: true\n\
         device-metadata:\n\
         - v1alpha1\n\
         topology: synthetic:pack:1 core:2 pu:1\n\
         sysfs-root: /file/sys\n\
         reserved-cpus: '0'\n\
         reserved-namespaces:\n\
         - kube-system\n\
         - monitoring\n\
         cpu-exclusivity: partition\n\
         claim-cpus: '1'\n\
         device-mode: individual\n\
         group-by: numa\n\
         claim-granularity: core\n\
         reserved-memory: 0:memory=1Gi,hugepages-2Mi=4Mi\n\
         claim-memory: 80%\n\
         claim-hugepages: true\n\
         state-dir: /file/state\n\
         unconfirmed-claim-grace: 90s\n\
         metrics-addr: 0.0.0.0:9000\n\
         debug-addr: '[::1]:9001'\n\
         log-format: json\n\
         log-level: debug\n";
    std::fs::write(&file, body).unwrap();
    let out = run_ok(
        resmgr()
            .args(["run", "--print-config", "--config"])
            .arg(&file),
    );
    assert_eq!(
        text(&out.stdout),
        body,
        "--print-config prints the file back, every key resolved"
    );

    let out = run_ok(
        resmgr()
            .args(["run", "--print-config", "--config"])
            .arg(&file)
            .args([
                "--nri-plugin-index",
                "20",
                "--reserved-cpu-count",
                "3",
                "--log-format",
                "text",
                "--reserved-namespaces",
                "a,b",
            ]),
    );
    let got = yaml(&out);
    assert_eq!(got["nri-plugin-index"], "20", "the flag wins");
    assert_eq!(
        got["reserved-cpu-count"], 3,
        "a count given as a flag wins over a cpuset in the file"
    );
    assert!(got.get("reserved-cpus").is_none());
    assert_eq!(got["log-format"], "text");
    assert_eq!(
        got["reserved-namespaces"],
        serde_yaml_ng::from_str::<serde_yaml_ng::Value>("[a, b]").unwrap()
    );
    assert_eq!(got["cdi-dir"], "/file/cdi", "the file still sets the rest");
}

#[test]
fn print_defaults_prints_a_file_the_agent_reads_back_as_its_defaults() {
    let out = run_ok(resmgr().args(["config", "--print-defaults"]));
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("defaults.yaml");
    std::fs::write(&file, &out.stdout).unwrap();
    let from_file = run_ok(
        resmgr()
            .args(["run", "--print-config", "--node-name", "n", "--config"])
            .arg(&file),
    );
    let plain = run_ok(resmgr().args(["run", "--print-config", "--node-name", "n"]));
    assert_eq!(text(&from_file.stdout), text(&plain.stdout));
    assert!(text(&out.stdout).contains("# reserved-cpus:\n"));
}

#[test]
fn bad_config_files_are_refused_naming_the_file_line_key_and_value() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("resmgr.yaml");
    let check = |body: &str, wanted: &[&str]| {
        std::fs::write(&file, body).unwrap();
        let err = run_err(
            resmgr()
                .args(["run", "--node-name", "n", "--print-config", "--config"])
                .arg(&file),
        );
        assert!(err.contains(&file.display().to_string()), "{err}");
        for w in wanted {
            assert!(err.contains(w), "{body:?}: wanted {w:?} in {err}");
        }
    };
    const H: &str = "apiVersion: resmgr.io/v1alpha1\nkind: AgentConfiguration\n";
    check(
        &format!("{H}log-format: json\nnri-plugin-index: 7\n"),
        &["line 4", "nri-plugin-index", "\"7\"", "exactly two digits"],
    );
    check(
        &format!("{H}cdi-dir: /x\nnode_name: n\n"),
        &["line 4", "unknown key \"node_name\"", "node-name"],
    );
    check(
        &format!("{H}topology: [a, b]\n"),
        &["line 3", "topology", "a single value"],
    );
    check(
        &format!("{H}reserved-cpus: \"0\"\nreserved-cpu-count: 2\n"),
        &[
            "line 3: reserved-cpus and",
            "line 4: reserved-cpu-count",
            "both are set",
        ],
    );
    check(
        "log-format: json\n",
        &["no `apiVersion: resmgr.io/v1alpha1`"],
    );
    check("- a list\n", &["a mapping of settings"]);
    check("topology: \"\n", &["not valid YAML"]);
    // A bad value in the file is not an error when a flag overrides it.
    std::fs::write(&file, format!("{H}log-format: xml\n")).unwrap();
    run_ok(
        resmgr()
            .args([
                "run",
                "--node-name",
                "n",
                "--print-config",
                "--log-format",
                "json",
                "--config",
            ])
            .arg(&file),
    );
    let err = run_err(
        resmgr()
            .args(["run", "--print-config", "--config"])
            .arg(dir.path().join("missing.yaml")),
    );
    assert!(
        err.contains("--config") && err.contains("missing.yaml"),
        "{err}"
    );
}

fn shipped_scenarios() -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(scenarios_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    found.sort();
    assert!(
        found.len() >= 3,
        "the shipped scenarios are missing: {found:?}"
    );
    found
}

/// Compares `got` with the checked-in file, or writes it with RESMGR_BLESS=1.
fn expect(path: &Path, got: &str) {
    if std::env::var_os("RESMGR_BLESS").is_some() {
        std::fs::write(path, got).unwrap();
        return;
    }
    let want = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e} (generate it with RESMGR_BLESS=1)", path.display()));
    assert!(
        got == want,
        "{} differs from the output; rerun with RESMGR_BLESS=1 if the change is intended\n--- got ---\n{got}",
        path.display()
    );
}

#[test]
fn every_shipped_scenario_prints_its_expected_output_in_text_json_and_svg() {
    for scenario in shipped_scenarios() {
        let cdi = tempfile::tempdir().unwrap();
        let out = run_ok(
            resmgr()
                .arg("simulate")
                .arg(&scenario)
                .arg("--cdi-dir")
                .arg(cdi.path()),
        );
        expect(&scenario.with_extension("txt"), &text(&out.stdout));
        let out = run_ok(
            resmgr()
                .arg("simulate")
                .arg(&scenario)
                .args(["--output", "json"]),
        );
        let json = text(&out.stdout);
        serde_json::from_str::<serde_json::Value>(&json).unwrap();
        expect(&scenario.with_extension("json"), &json);
        let dir = tempfile::tempdir().unwrap();
        let svg = dir.path().join("m.svg");
        run_ok(
            resmgr()
                .arg("simulate")
                .arg(&scenario)
                .arg("--svg")
                .arg(&svg),
        );
        expect(
            &scenario.with_extension("svg"),
            &std::fs::read_to_string(&svg).unwrap(),
        );
    }
}

#[test]
fn simulate_writes_the_claims_cdi_specs_to_the_cdi_dir() {
    let cdi = tempfile::tempdir().unwrap();
    // The database pod and its claim are still there when the scenario ends.
    let scenario = scenarios_dir().join("web-and-db.yaml");
    let out = run_ok(
        resmgr()
            .arg("simulate")
            .arg(&scenario)
            .arg("--cdi-dir")
            .arg(cdi.path()),
    );
    let specs: Vec<String> = std::fs::read_dir(cdi.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(specs.len(), 1, "{specs:?}");
    assert!(
        text(&out.stdout).contains(&specs[0]),
        "the report names the spec file"
    );
    let spec: serde_json::Value =
        serde_json::from_slice(&std::fs::read(cdi.path().join(&specs[0])).unwrap()).unwrap();
    let env = spec["devices"][0]["containerEdits"]["env"].to_string();
    assert!(env.contains("DRA_CPUSET_"), "{spec}");
}

#[test]
fn json_output_is_stable_and_complete() {
    let scenario = scenarios_dir().join("web-and-db.yaml");
    let once = run_ok(
        resmgr()
            .arg("simulate")
            .arg(&scenario)
            .args(["--output", "json"]),
    )
    .stdout;
    let twice = run_ok(
        resmgr()
            .arg("simulate")
            .arg(&scenario)
            .args(["--output", "json"]),
    )
    .stdout;
    assert_eq!(once, twice, "the same scenario gives the same bytes");
    let v: serde_json::Value = serde_json::from_slice(&once).unwrap();
    for key in ["scenario", "machine", "devices", "steps", "allocation"] {
        assert!(v.get(key).is_some(), "missing {key}: {v}");
    }
    let steps = v["steps"].as_array().unwrap();
    assert_eq!(steps.len(), 8);
    assert_eq!(steps[3]["line"], 11);
    assert!(
        steps[3]["changes"]
            .to_string()
            .contains("\"change\":\"claimed\"")
    );
}

#[test]
fn the_svg_is_well_formed_and_draws_every_cpu() {
    let dir = tempfile::tempdir().unwrap();
    for scenario in shipped_scenarios() {
        let svg = dir.path().join("m.svg");
        let out = run_ok(
            resmgr()
                .arg("simulate")
                .arg(&scenario)
                .args(["--output", "json", "--svg"])
                .arg(&svg),
        );
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let online: policy::CpuSet = report["machine"]["online"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap();
        let body = std::fs::read_to_string(&svg).unwrap();
        let doc = roxmltree::Document::parse(&body)
            .unwrap_or_else(|e| panic!("{}: not well-formed: {e}", scenario.display()));
        assert_eq!(doc.root_element().tag_name().name(), "svg");
        let drawn: Vec<u32> = doc
            .descendants()
            .filter_map(|n| n.attribute("id")?.strip_prefix("cpu-")?.parse().ok())
            .collect();
        let want: Vec<u32> = online.iter().collect();
        assert_eq!(drawn, want, "{}", scenario.display());
        // Every claim in the final allocation has its own legend entry.
        for claim in report["allocation"]["claims"].as_array().unwrap() {
            let name = claim["name"].as_str().unwrap();
            assert!(
                body.contains(&format!("claim {name}")),
                "{name} not in the legend"
            );
        }
    }
}

#[test]
fn a_claim_step_carries_its_configuration_to_the_policy() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("config.yaml");
    let cpu_config = "apiVersion: resmgr.io/v1alpha1, kind: CpuConfig";
    std::fs::write(
        &file,
        format!(
            "topology: \"pack:1 numa:2 core:2 pu:2\"
steps:
  - pod: {{name: db, qos: Guaranteed}}
  - claim: {{name: loose, pod: db, results: [{{request: cpus, device: numa1, cpu: 2}}], config: [{{parameters: {{{cpu_config}, memoryPinning: false}}}}]}}
  - claim: {{name: typo, pod: db, results: [{{request: cpus, device: numa1, cpu: 1}}], config: [{{source: class, parameters: {{{cpu_config}, memoryPining: false}}}}]}}
  - container: {{pod: db, name: pg, cpu-request: 2, memory: 1Gi, claims: [loose]}}
"
        ),
    )
    .unwrap();
    let out = text(&run_ok(resmgr().arg("simulate").arg(&file)).stdout);
    assert!(
        out.contains(
            "configuration for all requests (from its device class): memoryPining: unknown field"
        ),
        "{out}"
    );
    // Its claim leaves memory to the runtime: neither it nor the container grants a node.
    assert!(
        out.contains("+ claim default/loose: numa1 -> cpus 4-5, mems -"),
        "{out}"
    );
    assert!(
        out.contains("+ default/db/pg: claim, cpus 4-5, mems -"),
        "{out}"
    );
}

/// `memoryKinds` through the binary: a claim naming HBM gets its node's HBM besides its DRAM,
/// and so does its container; one naming a kind the machine lacks is refused, naming what it
/// holds, and changes nothing.
#[test]
fn a_claims_memory_kinds_reach_its_containers_and_a_missing_kind_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("hbm.yaml");
    let cpu_config = "apiVersion: resmgr.io/v1alpha1, kind: CpuConfig";
    std::fs::write(
        &file,
        format!(
            "topology: \"pack:2 [numa(memory=4GiB)] [numa(memory=1GiB)] core:2 pu:2\"
steps:
  - pod: {{name: db, qos: Guaranteed}}
  - claim: {{name: fast, pod: db, results: [{{request: cpus, device: numa0, cpu: 2}}], config: [{{parameters: {{{cpu_config}, memoryKinds: [dram, hbm]}}}}]}}
  - claim: {{name: slow, pod: db, results: [{{request: cpus, device: numa2, cpu: 1}}], config: [{{parameters: {{{cpu_config}, memoryKinds: [pmem]}}}}]}}
  - container: {{pod: db, name: pg, cpu-request: 2, memory: 1Gi, claims: [fast]}}
"
        ),
    )
    .unwrap();
    let out = text(&run_ok(resmgr().arg("simulate").arg(&file)).stdout);
    for wanted in [
        "DRA devices published: numa0 (3 cpus), numa2 (4 cpus)",
        "+ claim default/fast: numa0 -> cpus 2-3, mems 0-1",
        "result 0 (request cpus, cpus 4 on NUMA node 2): its configuration's memoryKinds names pmem, but no pmem memory is attached to NUMA node 2 (this machine has no pmem memory)",
        "+ default/db/pg: claim, cpus 2-3, mems 0-1",
    ] {
        assert!(out.contains(wanted), "{wanted:?} not in:\n{out}");
    }
    assert!(!out.contains("+ claim default/slow"), "{out}");
}

/// The 2-CPU VM with one CPU reserved (issue 18's third finding): the simulator once refused
/// the machine (its device's request policy was invalid). Its one claimable CPU is published and
/// claimed, and a BestEffort container then runs on the reserved CPU rather than being refused.
#[test]
fn simulate_runs_a_two_cpu_machine_with_one_cpu_reserved() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("small.yaml");
    std::fs::write(
        &file,
        "topology: \"pack:1 core:2 pu:1\"
reserved-cpus: \"cpuset:0\"
steps:
  - pod: {name: g, qos: Guaranteed}
  - claim: {name: one, pod: g, results: [{request: cpus, device: numa0, cpu: 1}]}
  - container: {pod: g, name: app, cpu-request: 1, claims: [one]}
  - pod: {name: be, qos: BestEffort}
  - container: {pod: be, name: app}
  - remove: {pod: g}
",
    )
    .unwrap();
    let out = run_ok(resmgr().arg("simulate").arg(&file));
    let report = text(&out.stdout);
    for wanted in [
        "DRA devices published: numa0 (1 cpus)",
        "+ claim default/one: numa0 -> cpus 1, mems 0",
        "+ default/be/app: shared in root, cpus 0, mems 0",
        "~ default/be/app: cpus 0 -> 1",
    ] {
        assert!(report.contains(wanted), "{wanted:?} not in\n{report}");
    }
    let log = text(&out.stderr);
    assert!(
        log.contains("runs on the reserved cpus 0 until some are shared again"),
        "{log}"
    );
}

#[test]
fn invalid_scenarios_are_refused_with_the_line() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("bad.yaml");
    let cases: &[(&str, &str)] = &[
        (
            "topology: \"pack:1 core:2 pu:1\"\nsteps:\n  - pod: {name: a}\n  - container: {pod: b, name: c}\n",
            "line 4: container \"c\": pod \"b\" does not exist",
        ),
        (
            "topology: \"pack:1 core:2 pu:1\"\nsteps:\n  - pod: {name: a}\n  - container: {pod: a, name: c, cpu: 1}\n",
            "line 4",
        ),
        (
            "topology: \"pack:1 core:2 pu:1\"\nsteps:\n  - pod: {name: a}\n  - launch: {pod: a}\n",
            "line 4",
        ),
        (
            "topology: \"hwloc:x\"\nsteps:\n  - pod: {name: a}\n",
            "line 1: topology",
        ),
        (
            "topology: \"pack:1 core:2 pu:1\"\nreserved-cpus: none\nsteps:\n  - pod: {name: a}\n",
            "line 2: reserved-cpus",
        ),
    ];
    for (body, wanted) in cases {
        std::fs::write(&file, body).unwrap();
        let err = run_err(resmgr().arg("simulate").arg(&file));
        assert!(err.contains("bad.yaml: "), "{err}");
        assert!(err.contains(wanted), "{body:?}: wanted {wanted:?} in {err}");
    }
}

#[test]
fn topology_prints_pools_and_devices_as_text_and_json() {
    let out = run_ok(resmgr().args([
        "topology",
        "--topology",
        "synthetic:pack:2 numa:2 core:2 pu:2",
        "--reserved-cpus",
        "0-1",
    ]));
    let t = text(&out.stdout);
    for wanted in [
        "pools:",
        "socket1 (socket)",
        "numa3 (numa)",
        "DRA devices:",
        "numa0: 2 cpus to claim",
    ] {
        assert!(t.contains(wanted), "{wanted:?} not in\n{t}");
    }
    let out = run_ok(resmgr().args([
        "topology",
        "--topology",
        "synthetic:pack:2 numa:2 core:2 pu:2",
        "--format",
        "json",
    ]));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["devices"].as_array().unwrap().len(), 4);
    assert_eq!(v["pools"][0]["name"], "root");
    let err = run_err(resmgr().args(["topology", "--topology", "nonsense"]));
    assert!(
        err.contains("--topology") && err.contains("\"nonsense\""),
        "{err}"
    );
}

#[test]
fn the_readme_shows_the_demo_scenarios_current_output() {
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../README.md"))
            .unwrap();
    let demo = std::fs::read_to_string(scenarios_dir().join("web-and-db.txt")).unwrap();
    assert!(
        readme.contains(&demo),
        "README.md's `resmgr simulate` section is out of date: paste examples/scenarios/web-and-db.txt into it"
    );
    assert!(readme.contains("](examples/scenarios/web-and-db.svg)"));
}
