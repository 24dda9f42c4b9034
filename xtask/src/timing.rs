//! Where the time of `cargo xtask test` goes: each step's wall time, the background builds a
//! step waited for and how long, and how long each background build took, printed as one table
//! at the end (also when a step fails), so that the next person sees it without a profile.
//!
//! The builds ([`crate::build::background`], the control planes' prefetch) report a wait and a
//! finished build here ([`waited`], [`built`]), and the stages a test they skipped
//! ([`skipped`]); the steps ([`Steps`]) collect those that happened while they ran, and the
//! table lists the skipped tests as not passed. A command other than `cargo xtask test` reports into nothing anyone
//! reads, which costs a lock and a few bytes.

use std::{
    sync::Mutex,
    time::{Duration, Instant},
};

/// A wait for a background build, or a background build's own duration.
#[derive(Debug, Clone)]
struct Event {
    what: String,
    took: Duration,
}

static WAITS: Mutex<Vec<Event>> = Mutex::new(Vec::new());
static BUILT: Mutex<Vec<Event>> = Mutex::new(Vec::new());
static SKIPPED: Mutex<Vec<Event>> = Mutex::new(Vec::new());
static ELSEWHERE: Mutex<Vec<Event>> = Mutex::new(Vec::new());

/// Records a test a stage leaves to another run of it on purpose ("TestX (on containerd
/// only)"), which the table names.
pub fn not_run_here(what: impl Into<String>) {
    push(&ELSEWHERE, what.into(), Duration::ZERO);
}

/// Records that a test was skipped ("TestX: why"): not passed.
pub fn skipped(what: impl Into<String>) {
    push(&SKIPPED, what.into(), Duration::ZERO);
}

/// Records that the caller waited `took` for `what` ("the e2e's CRI-O build").
pub fn waited(what: impl Into<String>, took: Duration) {
    push(&WAITS, what.into(), took);
}

/// Records that the background build `what` took `took` from its start to its end.
pub fn built(what: impl Into<String>, took: Duration) {
    push(&BUILT, what.into(), took);
}

fn push(to: &Mutex<Vec<Event>>, what: String, took: Duration) {
    // A poisoned list only means another thread panicked while pushing: the entries are whole.
    to.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .push(Event { what, took });
}

fn take(from: &Mutex<Vec<Event>>) -> Vec<Event> {
    std::mem::take(
        &mut *from
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner),
    )
}

/// One step's row.
#[derive(Debug)]
struct Row {
    name: String,
    took: Duration,
    outcome: &'static str,
    waits: Vec<Event>,
    skipped: Vec<Event>,
    elsewhere: Vec<Event>,
}

/// The steps of a run, timed.
#[derive(Debug)]
pub struct Steps {
    started: Instant,
    rows: Vec<Row>,
}

impl Default for Steps {
    fn default() -> Self {
        Self::new()
    }
}

impl Steps {
    pub fn new() -> Self {
        take(&WAITS);
        take(&SKIPPED);
        Self {
            started: Instant::now(),
            rows: Vec::new(),
        }
    }

    /// Runs a step, timing it and the waits for background builds within it.
    pub fn run<T>(
        &mut self,
        name: impl Into<String>,
        step: impl FnOnce() -> anyhow::Result<T>,
    ) -> anyhow::Result<T> {
        take(&WAITS);
        take(&SKIPPED);
        take(&ELSEWHERE);
        let began = Instant::now();
        let result = step();
        let skipped = take(&SKIPPED);
        self.rows.push(Row {
            name: name.into(),
            took: began.elapsed(),
            outcome: match (&result, skipped.is_empty()) {
                (Err(_), _) => "FAILED",
                (Ok(_), false) => "SKIPPED SOME",
                (Ok(_), true) => "",
            },
            waits: take(&WAITS),
            skipped,
            elsewhere: take(&ELSEWHERE),
        });
        result
    }

    /// Records a step that did not run, and why (`NOT RUN`).
    pub fn not_run(&mut self, name: impl Into<String>) {
        self.rows.push(Row {
            name: name.into(),
            took: Duration::ZERO,
            outcome: "NOT RUN",
            waits: Vec::new(),
            skipped: Vec::new(),
            elsewhere: Vec::new(),
        });
    }

    /// The tests skipped in every step so far, each "TestX: why" (not passed).
    pub fn skipped(&self) -> Vec<String> {
        self.rows
            .iter()
            .flat_map(|r| r.skipped.iter().map(|s| s.what.clone()))
            .collect()
    }

    /// The table: each step's wall time and what it waited for, the total, and the background
    /// builds' own times.
    pub fn table(&self) -> String {
        let width = self
            .rows
            .iter()
            .map(|r| r.name.len())
            .chain(["total".len()])
            .max()
            .unwrap_or(0);
        let mut out = format!("{:width$}  {:>9}  waited for\n", "step", "wall time");
        for row in &self.rows {
            let waits: Vec<String> = row
                .waits
                .iter()
                .map(|w| format!("{} {}", w.what, secs(w.took)))
                .collect();
            let time = match row.outcome {
                "NOT RUN" => "-".to_owned(),
                _ => secs(row.took),
            };
            let line = format!("{:width$}  {:>9}  {}", row.name, time, waits.join(", "));
            out.push_str(line.trim_end());
            if !row.outcome.is_empty() {
                out.push_str("  ");
                out.push_str(row.outcome);
            }
            out.push('\n');
            for skip in &row.skipped {
                out.push_str(&format!(
                    "{:width$}  {:>9}  skipped, not passed: {}\n",
                    "",
                    "",
                    short(&skip.what)
                ));
            }
            for cut in &row.elsewhere {
                out.push_str(&format!(
                    "{:width$}  {:>9}  not run here: {}\n",
                    "", "", cut.what
                ));
            }
        }
        out.push_str(&format!(
            "{:width$}  {:>9}\n",
            "total",
            secs(self.started.elapsed())
        ));
        let built = BUILT
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        if !built.is_empty() {
            out.push_str("background builds (from their start, which is the run's):\n");
            for b in built {
                out.push_str(&format!("  {} {}\n", b.what, secs(b.took)));
            }
        }
        out
    }
}

/// The first sentence of a long reason, for the table (the stage printed all of it).
fn short(what: &str) -> String {
    match what.find(". ") {
        Some(end) if end < what.len() - 2 => format!("{}. (…)", &what[..end]),
        _ => what.to_owned(),
    }
}

/// A duration as seconds, or minutes and seconds from a minute on.
fn secs(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s < 60.0 {
        format!("{s:.1} s")
    } else {
        let whole = d.as_secs();
        format!("{}:{:02} min", whole / 60, whole % 60)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_names_each_step_its_time_and_its_waits() {
        let mut steps = Steps::new();
        steps
            .run("clippy", || {
                waited("the helm build", Duration::from_secs(75));
                Ok(())
            })
            .unwrap();
        assert!(
            steps
                .run("fails", || -> anyhow::Result<()> { anyhow::bail!("no") })
                .is_err()
        );
        steps.not_run("cluster stage");
        steps
            .run("cluster on CRI-O", || {
                skipped("TestX: why");
                Ok(())
            })
            .unwrap();
        let table = steps.table();
        let lines: Vec<&str> = table.lines().collect();
        assert!(lines[0].starts_with("step "), "{table}");
        assert!(lines[1].starts_with("clippy "), "{table}");
        assert!(lines[1].ends_with("the helm build 1:15 min"), "{table}");
        assert!(lines[2].ends_with("FAILED"), "{table}");
        assert!(lines[3].starts_with("cluster stage") && lines[3].ends_with("-  NOT RUN"));
        assert!(lines[4].starts_with("cluster on CRI-O") && lines[4].ends_with("SKIPPED SOME"));
        assert!(
            lines[5].ends_with("skipped, not passed: TestX: why"),
            "{table}"
        );
        assert!(lines[6].starts_with("total "), "{table}");
        assert_eq!(steps.skipped(), ["TestX: why"]);
    }

    #[test]
    fn durations_read_as_seconds_then_minutes() {
        assert_eq!(secs(Duration::from_millis(1500)), "1.5 s");
        assert_eq!(secs(Duration::from_secs(1909)), "31:49 min");
    }
}
