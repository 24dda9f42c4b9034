//! `cargo xtask bench`: every benchmark of the workspace and the conformance modules, one table.
//!
//! Rust benchmarks are `harness = false` bench targets. Each prints one line per measurement:
//! `bench: {"name": "...", "unit": "ns", "median": 1234.0, "p99": 2345.0, "target": "..."}`
//! (`p99` and `target` optional). Go benchmarks in the conformance modules print the standard
//! `BenchmarkX-N  iters  123 ns/op` lines, and may report extra metrics (`median-ns`, `p99-ns`)
//! with `b.ReportMetric`. This command collects both and prints them together.

use std::{path::Path, process::Command};

use anyhow::Context;

use crate::{sysdeps, test, util};

#[derive(Debug)]
struct Row {
    source: String,
    name: String,
    median: String,
    p99: String,
    target: String,
}

pub fn run(root: &Path) -> anyhow::Result<()> {
    sysdeps::ensure()?;
    let mut rows = Vec::new();
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
    // binaries and examples the Go benchmarks drive are built with the release profile.
    util::run(util::cargo().current_dir(root).args([
        "build",
        "--workspace",
        "--bins",
        "--examples",
        "--release",
        "--locked",
    ]))?;
    let bin_dir = test::target_dir(root)?.join("release");
    for module in test::go_modules(&root.join("tests/conformance"))? {
        let out = util::output(
            Command::new("go")
                .current_dir(&module)
                .env("RESMGR_BIN_DIR", &bin_dir)
                .env("GOFLAGS", test::go_flags())
                .args(["test", "-run", "^$", "-bench", ".", "-count=1", "./..."]),
        )?;
        rows.extend(out.lines().filter_map(parse_go_bench));
    }
    print_table(&rows);
    Ok(())
}

/// A measurement for the table: a ratio (unit `x`, such as prepare over its floor, where 1.27 and
/// 1.49 must not both read `1 x`) with two decimals, anything else (nanoseconds, bytes) whole.
fn show(value: f64, unit: &str) -> String {
    if unit == "x" {
        format!("{value:.2} {unit}")
    } else {
        format!("{value:.0} {unit}")
    }
}

fn parse_go_bench(line: &str) -> Option<Row> {
    let mut fields = line.split_whitespace();
    let name = fields.next()?.strip_prefix("Benchmark")?;
    let rest: Vec<&str> = fields.collect();
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
    fn ratios_get_two_decimals_and_times_none() {
        assert_eq!(show(1.2749, "x"), "1.27 x");
        assert_eq!(show(1.0, "x"), "1.00 x");
        assert_eq!(show(1234.6, "ns"), "1235 ns");
    }
}
