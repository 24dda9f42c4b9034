//! `cargo xtask bench`: every benchmark of the workspace and the conformance modules, one table.
//!
//! Rust benchmarks are `harness = false` bench targets. Each prints one line per measurement:
//! `bench: {"name": "...", "unit": "ns", "median": 1234.0, "p99": 2345.0, "target": "..."}`
//! (`p99` and `target` optional). Go benchmarks in the conformance modules print the standard
//! `BenchmarkX-N  iters  123 ns/op` lines, and may report extra metrics (`median-ns`, `p99-ns`)
//! with `b.ReportMetric`; a benchmark reporting sizes (units ending in `-bytes`, such as the
//! agent's `VmRSS-bytes`) gets one row per size, in MiB, instead of a time. This command collects
//! both and prints them together.
//!
//! `--scale` runs the cluster-scale benchmark instead ([`crate::scale`]): the device models
//! against the real kube-scheduler and kube-apiserver at 100 and 500 nodes, tens of minutes.

use std::{path::Path, process::Command};

use anyhow::{Context, bail};

use crate::{e2e::cluster, missing, scale, sysdeps, util, workspace};

#[derive(Debug)]
struct Row {
    source: String,
    name: String,
    median: String,
    p99: String,
    target: String,
}

/// `cargo xtask bench`'s flags.
#[derive(Debug, clap::Args)]
pub struct BenchArgs {
    /// Run the cluster-scale benchmark (the device models against the real kube-scheduler and
    /// kube-apiserver) instead of the others.
    #[arg(long)]
    pub scale: bool,
    /// Run only the benchmarks of the one-node cluster: pod start-up with and without a claim,
    /// claim pods' start-up during a rolling update of the agent beside the same run's calm
    /// figures, and what a claim pod created as the agent's pod is deleted or its process killed
    /// waits.
    #[arg(long, conflicts_with = "scale")]
    pub cluster: bool,
    #[command(flatten)]
    pub scale_args: scale::ScaleArgs,
}

pub fn run(root: &Path, args: &BenchArgs) -> anyhow::Result<()> {
    if args.scale {
        return scale::run(root, &args.scale_args);
    }
    sysdeps::ensure()?;
    let mut rows = Vec::new();
    if args.cluster {
        let missing = cluster::prerequisites();
        if !missing.is_empty() {
            bail!(
                "the cluster benchmarks cannot run here:\n{}",
                missing::list(&missing)
            );
        }
        workspace::build_release(root, "release")?;
        rows.extend(cluster::bench(root)?.lines().flat_map(parse_go_bench));
        print_table(&rows);
        return Ok(());
    }
    let out =
        util::output(
            util::cargo()
                .current_dir(root)
                .args(["bench", "--workspace", "--locked"]),
        )?;
    for line in out.lines() {
        if let Some(json) = line.strip_prefix("bench: ") {
            let v: serde_json::Value =
                serde_json::from_str(json).with_context(|| format!("parsing bench line {json}"))?;
            let unit = v["unit"].as_str().unwrap_or("ns").to_owned();
            let fmt =
                |x: &serde_json::Value| x.as_f64().map_or_else(String::new, |x| show(x, &unit));
            rows.push(Row {
                source: "rust".into(),
                name: v["name"].as_str().unwrap_or("?").into(),
                median: fmt(&v["median"]),
                p99: fmt(&v["p99"]),
                target: v["target"].as_str().unwrap_or("").into(),
            });
        }
    }
    // Benchmarks measure optimized code: the Go side is compiled with optimizations, so the Rust
    // binaries and examples the Go benchmarks drive are built with the release profile (the
    // agent as it ships, see `build_binaries`).
    let bin_dir = workspace::build_binaries(root, "release")?;
    for module in workspace::go_modules(&root.join("tests/conformance"))? {
        let out = util::output(
            Command::new("go")
                .current_dir(&module)
                .env("RESMGR_BIN_DIR", &bin_dir)
                .env("GOFLAGS", workspace::go_flags())
                .args(["test", "-run", "^$", "-bench", ".", "-count=1", "./..."]),
        )?;
        rows.extend(out.lines().flat_map(parse_go_bench));
    }
    // Pod start-up in the one-node cluster, where the machine can run it.
    let missing = cluster::prerequisites();
    if missing.is_empty() {
        rows.extend(cluster::bench(root)?.lines().flat_map(parse_go_bench));
    } else {
        eprintln!(
            "NOT RUN: the cluster benchmarks (pod start-up), because this machine lacks:\n{}",
            missing::list(&missing)
        );
    }
    print_table(&rows);
    Ok(())
}

/// A measurement for the table: a ratio (unit `x`, such as prepare over its floor, where 1.27 and
/// 1.49 must not both read `1 x`) with two decimals, MiB with one (15.0 against a 15 MiB target
/// must not read as 15 when it is 15.4), anything else (nanoseconds, bytes) whole.
fn show(value: f64, unit: &str) -> String {
    match unit {
        "x" => format!("{value:.2} {unit}"),
        "MiB" => format!("{value:.1} {unit}"),
        _ => format!("{value:.0} {unit}"),
    }
}

/// Targets of Go benchmarks' sizes: (benchmark name prefix, unit, target).
const GO_TARGETS: &[(&str, &str, &str)] = &[
    // Issue 17: the agent's peak resident memory with 500 containers.
    ("Footprint/", "VmHWM-bytes", "< 15 MiB"),
    // Issue 38: resident now, with 500 containers; RssBinary and RssLibs say what bounds it.
    ("Footprint/", "VmRSS-bytes", "<= 11 MiB"),
    // Issue 38: the agent beside a no-op plugin on the same events, through the NRI adaptation.
    ("EventPath/", "create-p50-x", "<= 1.5 x"),
    ("EventPath/", "iteration-p50-x", "<= 1.5 x"),
    ("EventPath/", "cpu-x", "<= 1.5 x"),
];

/// The rows of one Go benchmark result line: its time, or its sizes if it reports any.
fn parse_go_bench(line: &str) -> Vec<Row> {
    let mut fields = line.split_whitespace();
    let Some(name) = fields.next().and_then(|f| f.strip_prefix("Benchmark")) else {
        return Vec::new();
    };
    let rest: Vec<&str> = fields.collect();
    let sizes: Vec<Row> = rest
        .windows(2)
        .filter_map(|w| {
            let label = w[1].strip_suffix("-bytes")?;
            let bytes: f64 = w[0].parse().ok()?;
            Some(Row {
                source: "go".into(),
                name: format!("{name} {label}"),
                median: show(bytes / 1_048_576.0, "MiB"),
                p99: String::new(),
                target: target(name, w[1]).into(),
            })
        })
        .collect();
    if !sizes.is_empty() {
        return sizes;
    }
    // Durations of named phases (`ready-ns`, `claim-running-ns`): one row each, after the
    // median and p99 when the benchmark reports them too.
    let phases: Vec<Row> = rest
        .windows(2)
        .filter_map(|w| {
            let label = w[1].strip_suffix("-ns")?;
            if ["median", "p99"].contains(&label) {
                return None;
            }
            let ns: f64 = w[0].parse().ok()?;
            Some(Row {
                source: "go".into(),
                name: format!("{name} {label}"),
                median: show(ns, "ns"),
                p99: String::new(),
                target: String::new(),
            })
        })
        .collect();
    // Ratios (`create-p50-x`, the agent over a no-op plugin): one row each, after the times.
    let ratios = rest.windows(2).filter_map(|w| {
        let label = w[1].strip_suffix("-x")?;
        let ratio: f64 = w[0].parse().ok()?;
        Some(Row {
            source: "go".into(),
            name: format!("{name} {label}"),
            median: show(ratio, "x"),
            p99: String::new(),
            target: target(name, w[1]).into(),
        })
    });
    if phases.is_empty() || rest.contains(&"median-ns") {
        parse_go_time(name, &rest)
            .into_iter()
            .chain(phases)
            .chain(ratios)
            .collect()
    } else {
        phases.into_iter().chain(ratios).collect()
    }
}

/// The target of a Go benchmark's metric, if it has one ([`GO_TARGETS`]).
fn target(name: &str, unit: &str) -> &'static str {
    GO_TARGETS
        .iter()
        .find(|(prefix, u, _)| name.starts_with(prefix) && *u == unit)
        .map_or("", |(_, _, target)| target)
}

fn parse_go_time(name: &str, rest: &[&str]) -> Option<Row> {
    let metric = |unit: &str| {
        rest.windows(2)
            .find(|w| w[1] == unit)
            .map(|w| format!("{} ns", w[0]))
            .unwrap_or_default()
    };
    let median = [metric("median-ns"), metric("ns/op")]
        .into_iter()
        .find(|m| !m.is_empty())?;
    Some(Row {
        source: "go".into(),
        name: name.into(),
        median,
        p99: metric("p99-ns"),
        target: String::new(),
    })
}

fn print_table(rows: &[Row]) {
    let w = |f: fn(&Row) -> &str, title: &str| {
        rows.iter()
            .map(|r| f(r).len())
            .chain([title.len()])
            .max()
            .unwrap_or(0)
    };
    let (ws, wn, wm, wp) = (
        w(|r| &r.source, "src"),
        w(|r| &r.name, "benchmark"),
        w(|r| &r.median, "median"),
        w(|r| &r.p99, "p99"),
    );
    println!(
        "{:ws$}  {:wn$}  {:>wm$}  {:>wp$}  target",
        "src", "benchmark", "median", "p99"
    );
    for r in rows {
        println!(
            "{:ws$}  {:wn$}  {:>wm$}  {:>wp$}  {}",
            r.source, r.name, r.median, r.p99, r.target
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ratios_get_two_decimals_mib_one_and_times_none() {
        assert_eq!(show(1.2749, "x"), "1.27 x");
        assert_eq!(show(1.0, "x"), "1.00 x");
        assert_eq!(show(14.96, "MiB"), "15.0 MiB");
        assert_eq!(show(1234.6, "ns"), "1235 ns");
    }

    #[test]
    fn go_sizes_are_rows_in_mib_and_times_a_row_in_ns() {
        let rows = parse_go_bench(
            "BenchmarkFootprint/dra-2  1  2345678 ns/op  15728640 VmHWM-bytes  9961472 idle-VmRSS-bytes",
        );
        let rows: Vec<_> = rows
            .iter()
            .map(|r| (r.name.as_str(), r.median.as_str(), r.target.as_str()))
            .collect();
        assert_eq!(
            rows,
            [
                ("Footprint/dra-2 VmHWM", "15.0 MiB", "< 15 MiB"),
                ("Footprint/dra-2 idle-VmRSS", "9.5 MiB", ""),
            ]
        );
        let rows = parse_go_bench("BenchmarkGetInfo-2  5000  212345 ns/op  180000 median-ns");
        assert_eq!(rows.len(), 1);
        assert_eq!(
            (rows[0].name.as_str(), rows[0].median.as_str()),
            ("GetInfo-2", "180000 ns")
        );
        assert!(parse_go_bench("ok  github.com/x 1.2s").is_empty());
    }

    #[test]
    fn go_ratios_are_a_row_each_with_their_target() {
        let rows = parse_go_bench(
            "BenchmarkEventPath/fit-2  1  9 ns/op  2000 create-p50-ns  1600 noop-create-p50-ns  1.25 create-p50-x",
        );
        let rows: Vec<_> = rows
            .iter()
            .map(|r| (r.name.as_str(), r.median.as_str(), r.target.as_str()))
            .collect();
        assert_eq!(
            rows,
            [
                ("EventPath/fit-2 create-p50", "2000 ns", ""),
                ("EventPath/fit-2 noop-create-p50", "1600 ns", ""),
                ("EventPath/fit-2 create-p50", "1.25 x", "<= 1.5 x"),
            ]
        );
    }

    #[test]
    fn named_go_phases_are_a_row_each() {
        let rows = parse_go_bench(
            "BenchmarkAgentGap/pod-deleted-2  1  9 ns/op  2100000000 ready-ns  2900000000 claim-running-ns",
        );
        let rows: Vec<_> = rows
            .iter()
            .map(|r| (r.name.as_str(), r.median.as_str()))
            .collect();
        assert_eq!(
            rows,
            [
                ("AgentGap/pod-deleted-2 ready", "2100000000 ns"),
                ("AgentGap/pod-deleted-2 claim-running", "2900000000 ns"),
            ]
        );
        let rows =
            parse_go_bench("BenchmarkPodStartup/claim-2  1  9 ns/op  700 median-ns  900 p99-ns");
        assert_eq!(
            (rows.len(), rows[0].median.as_str(), rows[0].p99.as_str()),
            (1, "700 ns", "900 ns")
        );
        let rows = parse_go_bench(
            "BenchmarkPodStartup/claim-2  1  9 ns/op  700 median-ns  900 p99-ns  300 bound-to-running-ns",
        );
        let rows: Vec<_> = rows
            .iter()
            .map(|r| (r.name.as_str(), r.median.as_str(), r.p99.as_str()))
            .collect();
        assert_eq!(
            rows,
            [
                ("PodStartup/claim-2", "700 ns", "900 ns"),
                ("PodStartup/claim-2 bound-to-running", "300 ns", ""),
            ]
        );
    }
}
