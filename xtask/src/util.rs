//! Small process and path helpers shared by the xtask commands.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, bail};

/// The repository root: the parent of xtask's manifest directory.
pub fn repo_root() -> anyhow::Result<PathBuf> {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest
        .parent()
        .map(Path::to_path_buf)
        .context("xtask's manifest directory has no parent")
}

/// The `cargo` that runs us, so that toolchain overrides carry through.
pub fn cargo() -> Command {
    Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
}

/// Runs a command to completion, failing with the command line when it does not succeed.
pub fn run(cmd: &mut Command) -> anyhow::Result<()> {
    eprintln!("$ {}", show(cmd));
    let status = cmd
        .status()
        .with_context(|| format!("cannot start `{}`", show(cmd)))?;
    if !status.success() {
        bail!("`{}` failed: {status}", show(cmd));
    }
    Ok(())
}

/// Runs a command and returns its standard output, failing with the command line and its
/// standard error when it does not succeed.
pub fn output(cmd: &mut Command) -> anyhow::Result<String> {
    let out = cmd
        .output()
        .with_context(|| format!("cannot start `{}`", show(cmd)))?;
    if !out.status.success() {
        bail!(
            "`{}` failed: {}\n{}",
            show(cmd),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    String::from_utf8(out.stdout).with_context(|| format!("`{}` printed non-UTF-8", show(cmd)))
}

/// `cargo metadata --no-deps` of the workspace at `root`, parsed.
pub fn metadata(root: &Path) -> anyhow::Result<serde_json::Value> {
    let meta =
        output(
            cargo()
                .current_dir(root)
                .args(["metadata", "--format-version", "1", "--no-deps"]),
        )?;
    serde_json::from_str(&meta).context("parsing cargo metadata")
}

/// Whether a program can be found on PATH.
pub fn have(program: &str) -> bool {
    Command::new(program)
        .arg("--version")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok()
}

fn show(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for arg in cmd.get_args() {
        s.push(' ');
        s.push_str(&arg.to_string_lossy());
    }
    s
}

/// Runs `go test -v ...` to completion like [`run`], its output passed through as it comes, and
/// returns the tests it skipped, each with its reason (`go test` counts a package whose tests
/// skipped as `ok`: the caller must not).
pub fn run_go_test(cmd: &mut Command) -> anyhow::Result<Vec<String>> {
    use std::io::BufRead as _;

    eprintln!("$ {}", show(cmd));
    let mut child = cmd
        .stdout(std::process::Stdio::piped())
        .spawn()
        .with_context(|| format!("cannot start `{}`", show(cmd)))?;
    let stdout = child.stdout.take().context("go test's output")?;
    let mut lines = Vec::new();
    for line in std::io::BufReader::new(stdout).lines() {
        let line = line?;
        eprintln!("{line}");
        lines.push(line);
    }
    let status = child.wait()?;
    if !status.success() {
        bail!("`{}` failed: {status}", show(cmd));
    }
    Ok(skipped_tests(&lines))
}

/// [`run_go_test`] with the test's output, standard output and error both, written to `log`
/// (created, or truncated) instead of this process's: for a test that runs beside others.
pub fn run_go_test_into(cmd: &mut Command, log: &Path) -> anyhow::Result<Vec<String>> {
    eprintln!("$ {} > {}", show(cmd), log.display());
    if let Some(dir) = log.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let out = std::fs::File::create(log).with_context(|| format!("creating {}", log.display()))?;
    let status = cmd
        .stdout(out.try_clone()?)
        .stderr(out)
        .status()
        .with_context(|| format!("cannot start `{}`", show(cmd)))?;
    if !status.success() {
        bail!(
            "`{}` failed: {status}; its output is in {}",
            show(cmd),
            log.display()
        );
    }
    let text =
        std::fs::read_to_string(log).with_context(|| format!("reading {}", log.display()))?;
    let lines: Vec<String> = text.lines().map(str::to_owned).collect();
    Ok(skipped_tests(&lines))
}

/// The tests `go test -v` output says were skipped (`--- SKIP: Name (0.00s)`), each with its
/// reason: the last line the test logged before (`    file_test.go:12: why`).
fn skipped_tests(lines: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let Some(rest) = line.trim_start().strip_prefix("--- SKIP: ") else {
            continue;
        };
        let name = rest.split_whitespace().next().unwrap_or(rest);
        let reason = lines[..i]
            .iter()
            .rev()
            .take_while(|l| !l.starts_with("=== RUN") && !l.trim_start().starts_with("--- "))
            .find(|l| l.starts_with(' ') && l.contains(".go:"))
            .map(|l| l.trim())
            .unwrap_or("no reason given");
        out.push(format!("{name}: {reason}"));
    }
    out
}

/// The first line where `have` and `want` differ, described for a human; None when equal.
pub fn first_difference(have: &str, want: &str) -> Option<String> {
    if have == want {
        return None;
    }
    let mut have_lines = have.lines();
    let mut want_lines = want.lines();
    for n in 1.. {
        match (have_lines.next(), want_lines.next()) {
            (Some(h), Some(w)) if h == w => continue,
            (None, None) => return Some("line endings differ".into()),
            (h, w) => {
                return Some(format!(
                    "line {n}: file has {:?}, chart renders {:?}",
                    h.unwrap_or("<end of file>"),
                    w.unwrap_or("<end of file>")
                ));
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skipped_go_tests_are_found_with_their_reason() {
        let out: Vec<String> = [
            "=== RUN   TestA",
            "    a_test.go:3: fine",
            "--- PASS: TestA (1.00s)",
            "=== RUN   TestB",
            "    runtimes_test.go:12: CRI-O 1.36.2 deadlocks here",
            "--- SKIP: TestB (0.00s)",
            "=== RUN   TestC",
            "--- SKIP: TestC (0.00s)",
            "PASS",
        ]
        .map(str::to_owned)
        .to_vec();
        assert_eq!(
            skipped_tests(&out),
            [
                "TestB: runtimes_test.go:12: CRI-O 1.36.2 deadlocks here",
                "TestC: no reason given"
            ]
        );
    }
}
