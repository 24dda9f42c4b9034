//! `cargo xtask bench --scale`: what each device model costs kube-scheduler and kube-apiserver at
//! 100 and 500 nodes (`tests/controlplane/scale`), one table.
//!
//! It builds `resmgr` (whose `resmgr slices` the benchmark publishes for every node) and takes the control plane from [`kubernetes::binaries`], then runs the Go benchmark
//! and prints its `scale: {json}` lines as a table, one row per phase. Not part of
//! `cargo xtask test`: a run takes tens of minutes and its figures depend on the machine's load,
//! which every row records.

use std::{
    io::{BufRead, BufReader},
    path::Path,
    process::{Command, Stdio},
};

use anyhow::{Context, bail};

use crate::{build::kubernetes, e2e::controlplane, missing, sysdeps, util, workspace};

/// The scale benchmark's knobs (each a `RESMGR_SCALE_*` variable of the Go benchmark).
#[derive(Debug, Clone, clap::Args)]
pub struct ScaleArgs {
    /// Cluster sizes, comma-separated; 0 runs only the filling-up phases.
    #[arg(
        long,
        default_value = "100,500",
        value_name = "N,...",
        requires = "scale"
    )]
    pub nodes: String,
    /// Pods per phase at most; a phase takes 10 per node when that is fewer.
    #[arg(long, default_value_t = 5000, value_name = "M", requires = "scale")]
    pub pods: usize,
    /// Times every (nodes, model) phase runs, the models alternating.
    #[arg(long, default_value_t = 1, requires = "scale")]
    pub rounds: usize,
    /// Models, comma-separated: grouped, individual-numa, individual-cores, individual [default:
    /// all].
    #[arg(long, value_name = "MODEL,...", requires = "scale")]
    pub models: Option<String>,
    /// Cluster size of the filling-up phases (claims for 90 % of all CPUs); 0 runs none.
    #[arg(long, default_value_t = 100, value_name = "N", requires = "scale")]
    pub fill_nodes: usize,
    /// Save 30 s of kube-scheduler's CPU profile per phase in DIR (`go tool pprof -top
    /// kube-scheduler DIR/<phase>.pprof`).
    #[arg(long, value_name = "DIR", requires = "scale")]
    pub profile: Option<std::path::PathBuf>,
    /// kube-scheduler's `percentageOfNodesToScore` (default: its own, adaptive: 46 % of 500
    /// nodes, at least 100).
    #[arg(long, value_name = "PERCENT", requires = "scale", value_parser = clap::value_parser!(u8).range(1..=100))]
    pub nodes_to_score: Option<u8>,
}

pub fn run(root: &Path, args: &ScaleArgs) -> anyhow::Result<()> {
    sysdeps::ensure()?;
    let missing = controlplane::prerequisites();
    if !missing.is_empty() {
        bail!(
            "the scale benchmark runs the control plane, and this machine lacks:\n{}",
            missing::list(&missing)
        );
    }
    // `resmgr slices` only prints objects: the debug build prints the same, and the benchmark
    // measures the control plane, not it.
    util::run(util::cargo().current_dir(root).args([
        "build",
        "--locked",
        "-p",
        "plugin-bin",
        "--bin",
        "resmgr",
    ]))?;
    let bin_dir = workspace::target_dir(root)?.join("debug");
    let control_plane = kubernetes::binaries(&kubernetes::release(root, None)?, None)?;
    let mut go = Command::new("go");
    go.current_dir(root.join("tests/controlplane"))
        .env("RESMGR_BIN_DIR", &bin_dir)
        .env("RESMGR_CONTROLPLANE_BIN_DIR", &control_plane)
        .env("GOFLAGS", workspace::go_flags())
        .env("RESMGR_SCALE_NODES", &args.nodes)
        .env("RESMGR_SCALE_PODS", args.pods.to_string())
        .env("RESMGR_SCALE_ROUNDS", args.rounds.to_string())
        .env("RESMGR_SCALE_FILL_NODES", args.fill_nodes.to_string())
        .env("RESMGR_SCALE_MODELS", args.models.as_deref().unwrap_or(""))
        .args([
            "test",
            "-run",
            "^$",
            "-bench",
            "^BenchmarkScale$",
            "-benchtime=1x",
        ])
        .args(["-count=1", "-timeout=300m", "-v", "./scale/"])
        .stdout(Stdio::piped());
    if let Some(percent) = args.nodes_to_score {
        go.env("RESMGR_SCALE_NODES_TO_SCORE", percent.to_string());
    }
    if let Some(dir) = &args.profile {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let dir = std::path::absolute(dir)?;
        go.env("RESMGR_SCALE_PROFILE", dir);
    }
    eprintln!("$ go test -bench ^BenchmarkScale$ ./scale/ (in tests/controlplane)");
    let mut child = go.spawn().context("starting go test")?;
    let stdout = child.stdout.take().context("go test's output")?;
    let mut lines = Vec::new();
    for line in BufReader::new(stdout).lines() {
        let line = line?;
        println!("{line}");
        lines.push(line);
    }
    let status = child.wait()?;
    let rows = rows(&lines)?;
    print!("{}", table(&rows));
    if !status.success() {
        bail!("the scale benchmark failed ({status}); the phases that finished are above");
    }
    Ok(())
}

/// The `scale:` lines' results.
fn rows(lines: &[String]) -> anyhow::Result<Vec<serde_json::Value>> {
    lines
        .iter()
        .filter_map(|l| l.strip_prefix("scale: "))
        .map(|json| {
            serde_json::from_str(json).with_context(|| format!("parsing scale line {json}"))
        })
        .collect()
}

/// One row per phase, in the order they ran.
fn table(rows: &[serde_json::Value]) -> String {
    let f = |v: &serde_json::Value, key: &str, digits: usize| {
        v[key]
            .as_f64()
            .map_or_else(|| "?".to_owned(), |x| format!("{x:.digits$}"))
    };
    let mib = |v: &serde_json::Value, key: &str| {
        v[key]
            .as_f64()
            .map_or_else(|| "?".to_owned(), |x| format!("{:.0}", x / 1_048_576.0))
    };
    let header = [
        "nodes",
        "model",
        "phase",
        "pods",
        "bound",
        "created/s",
        "pods/s",
        "p50 ms",
        "p99 ms",
        "sched cpu s",
        "attempts/pod",
        "sched peak MiB",
        "apiserver MiB",
        "devices/node",
        "slices",
        "slice MiB",
        "load",
    ];
    let mut cells: Vec<Vec<String>> = vec![header.iter().map(|h| (*h).to_owned()).collect()];
    for r in rows {
        let phase = if r["fill"].as_bool() == Some(true) {
            "fill 90 %"
        } else {
            "steady"
        };
        cells.push(vec![
            f(r, "nodes", 0),
            r["model"].as_str().unwrap_or("?").to_owned(),
            format!("{phase} r{}", f(r, "round", 0)),
            f(r, "pods", 0),
            f(r, "bound", 0),
            f(r, "created_per_s", 0),
            f(r, "pods_per_s", 1),
            f(r, "p50_ms", 0),
            f(r, "p99_ms", 0),
            f(r, "scheduler_cpu_s", 1),
            match (r["attempts"].as_f64(), r["pods"].as_f64()) {
                (Some(a), Some(p)) if p > 0.0 => format!("{:.2}", a / p),
                _ => "?".to_owned(),
            },
            mib(r, "scheduler_peak_rss_bytes"),
            mib(r, "apiserver_rss_bytes"),
            f(r, "devices_per_node", 0),
            f(r, "slices", 0),
            format!(
                "{:.1}",
                r["slice_bytes"].as_f64().unwrap_or(0.0) / 1_048_576.0
            ),
            r["load"].as_str().unwrap_or("?").to_owned(),
        ]);
    }
    let widths: Vec<usize> = (0..header.len())
        .map(|i| cells.iter().map(|row| row[i].len()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for row in &cells {
        let line: Vec<String> = row
            .iter()
            .zip(&widths)
            .enumerate()
            .map(|(i, (cell, w))| {
                if i == 1 || i == 2 || i == header.len() - 1 {
                    format!("{cell:w$}")
                } else {
                    format!("{cell:>w$}")
                }
            })
            .collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scale_lines_become_one_row_per_phase() {
        let lines = [
            "=== RUN   BenchmarkScale".to_owned(),
            r#"scale: {"nodes":500,"model":"grouped","fill":false,"round":1,"pods":5000,"bound":5000,"created_per_s":310.2,"pods_per_s":150.44,"p50_ms":80.5,"p99_ms":900.1,"scheduler_cpu_s":40.25,"attempts":5500,"unschedulable_attempts":500,"scheduler_peak_rss_bytes":209715200,"apiserver_rss_bytes":1073741824,"apiserver_peak_rss_bytes":1073741824,"slices":500,"slice_bytes":1048576,"devices_per_node":4,"load":"1.0 2.0 3.0"}"#.to_owned(),
        ];
        let rows = rows(&lines).unwrap();
        assert_eq!(rows.len(), 1);
        let table = table(&rows);
        let mut lines = table.lines();
        assert!(lines.next().unwrap().starts_with("nodes  model"), "{table}");
        let row = lines.next().unwrap();
        for want in [
            "500",
            "grouped",
            "steady r1",
            "150.4",
            "900",
            "40.2",
            "1.10",
            "200",
            "1024",
            "1.0",
        ] {
            assert!(row.contains(want), "{want} in {row}");
        }
        assert!(rows_of("scale: {not json").is_err());
    }

    #[derive(Debug, clap::Parser)]
    struct Bench {
        #[command(flatten)]
        args: crate::bench::BenchArgs,
    }

    #[test]
    fn the_scale_flags_need_scale() {
        use clap::{CommandFactory as _, Parser as _};
        Bench::command().debug_assert();
        let b = Bench::try_parse_from(["bench", "--scale", "--nodes", "5", "--fill-nodes", "0"])
            .unwrap();
        assert!(b.args.scale);
        assert_eq!(
            (
                b.args.scale_args.nodes.as_str(),
                b.args.scale_args.fill_nodes
            ),
            ("5", 0)
        );
        assert_eq!(b.args.scale_args.pods, 5000);
        assert!(Bench::try_parse_from(["bench", "--nodes", "5"]).is_err());
        assert!(!Bench::try_parse_from(["bench"]).unwrap().args.scale);
    }

    fn rows_of(line: &str) -> anyhow::Result<Vec<serde_json::Value>> {
        rows(&[line.to_owned()])
    }
}
