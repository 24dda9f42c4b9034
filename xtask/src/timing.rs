//! Where the time of `cargo xtask test` goes: each step's start and wall time, the background
//! builds a step waited for and how long, and how long each background build took, printed as
//! one table at the end (also when a step fails), so that the next person sees it without a
//! profile.
//!
//! The builds ([`crate::build::background`], the control planes' prefetch) report a wait and a
//! finished build here ([`waited`], [`built`]), and the stages a test they skipped
//! ([`skipped`]); the steps ([`Steps`]) collect those that happened while they ran, and the
//! table lists the skipped tests as not passed. Steps may run on two threads at once (the e2e's
//! lanes, [`Steps::lane`]): a wait or a skip belongs to the step running on the thread that
//! reports it, so those are kept per thread. A command other than `cargo xtask test` reports
//! into nothing anyone reads, which costs a few bytes.

use std::{
    cell::RefCell,
    sync::Mutex,
    time::{Duration, Instant},
};

/// A wait for a background build, or a background build's own duration.
#[derive(Debug, Clone)]
struct Event {
    what: String,
    took: Duration,
}

/// The background builds' own durations, whichever thread ran them.
static BUILT: Mutex<Vec<Event>> = Mutex::new(Vec::new());

/// What happened on this thread during its current step.
#[derive(Debug, Default)]
struct StepEvents {
    waits: Vec<Event>,
    skipped: Vec<Event>,
    elsewhere: Vec<Event>,
}

thread_local! {
    static EVENTS: RefCell<StepEvents> = RefCell::new(StepEvents::default());
}

/// Records a test a stage leaves to another run of it on purpose ("TestX (on containerd
/// only)"), which the table names.
pub fn not_run_here(what: impl Into<String>) {
    let event = Event {
        what: what.into(),
        took: Duration::ZERO,
    };
    EVENTS.with_borrow_mut(|e| e.elsewhere.push(event));
}

/// Records that a test was skipped ("TestX: why"): not passed.
pub fn skipped(what: impl Into<String>) {
    let event = Event {
        what: what.into(),
        took: Duration::ZERO,
    };
    EVENTS.with_borrow_mut(|e| e.skipped.push(event));
}

/// Records that the caller waited `took` for `what` ("the e2e's CRI-O build").
pub fn waited(what: impl Into<String>, took: Duration) {
    let event = Event {
        what: what.into(),
        took,
    };
    EVENTS.with_borrow_mut(|e| e.waits.push(event));
}

/// Records that the background build `what` took `took` from its start to its end.
pub fn built(what: impl Into<String>, took: Duration) {
    // A poisoned list only means another thread panicked while pushing: the entries are whole.
    BUILT
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .push(Event {
            what: what.into(),
            took,
        });
}

/// This thread's events since the last call.
fn take_events() -> StepEvents {
    EVENTS.with_borrow_mut(std::mem::take)
}

/// One step's row.
#[derive(Debug)]
struct Row {
    name: String,
    /// When it began, from the run's start.
    began: Duration,
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
        Self {
            started: Instant::now(),
            rows: Vec::new(),
        }
    }

    /// Steps to run on another thread beside these, timed from the same start; [`Steps::merge`]
    /// puts them back among these.
    pub fn lane(&self) -> Self {
        Self {
            started: self.started,
            rows: Vec::new(),
        }
    }

    /// Takes in the steps of a [`Steps::lane`]; the table lists every step by when it began.
    pub fn merge(&mut self, lane: Steps) {
        self.rows.extend(lane.rows);
        self.rows.sort_by_key(|r| r.began);
    }

    /// Runs a step on this thread, timing it and the waits for background builds within it.
    pub fn run<T>(
        &mut self,
        name: impl Into<String>,
        step: impl FnOnce() -> anyhow::Result<T>,
    ) -> anyhow::Result<T> {
        take_events();
        let began = Instant::now();
        let result = step();
        let events = take_events();
        self.rows.push(Row {
            name: name.into(),
            began: began.duration_since(self.started),
            took: began.elapsed(),
            outcome: match (&result, events.skipped.is_empty()) {
                (Err(_), _) => "FAILED",
                (Ok(_), false) => "SKIPPED SOME",
                (Ok(_), true) => "",
            },
            waits: events.waits,
            skipped: events.skipped,
            elsewhere: events.elsewhere,
        });
        result
    }

    /// Records a step that did not run, and why (`NOT RUN`).
    pub fn not_run(&mut self, name: impl Into<String>) {
        self.rows.push(Row {
            name: name.into(),
            began: self.started.elapsed(),
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
        let mut out = format!(
            "{:width$}  {:>6}  {:>9}  waited for\n",
            "step", "began", "wall time"
        );
        for row in &self.rows {
            let waits: Vec<String> = row
                .waits
                .iter()
                .map(|w| format!("{} {}", w.what, secs(w.took)))
                .collect();
            let (began, time) = match row.outcome {
                "NOT RUN" => ("-".to_owned(), "-".to_owned()),
                _ => (clock(row.began), secs(row.took)),
            };
            let line = format!(
                "{:width$}  {began:>6}  {time:>9}  {}",
                row.name,
                waits.join(", ")
            );
            out.push_str(line.trim_end());
            if !row.outcome.is_empty() {
                out.push_str("  ");
                out.push_str(row.outcome);
            }
            out.push('\n');
            for skip in &row.skipped {
                out.push_str(&format!(
                    "{:width$}  {:>6}  {:>9}  skipped, not passed: {}\n",
                    "",
                    "",
                    "",
                    short(&skip.what)
                ));
            }
            for cut in &row.elsewhere {
                out.push_str(&format!(
                    "{:width$}  {:>6}  {:>9}  not run here: {}\n",
                    "", "", "", cut.what
                ));
            }
        }
        out.push_str(&format!(
            "{:width$}  {:>6}  {:>9}\n",
            "total",
            "",
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

/// An instant of the run, from its start, as minutes and seconds (`12:05`).
fn clock(d: Duration) -> String {
    let whole = d.as_secs();
    format!("{}:{:02}", whole / 60, whole % 60)
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
        assert!(
            lines[3].starts_with("cluster stage") && lines[3].ends_with("-          -  NOT RUN"),
            "{table}"
        );
        assert!(lines[4].starts_with("cluster on CRI-O") && lines[4].ends_with("SKIPPED SOME"));
        assert!(
            lines[5].ends_with("skipped, not passed: TestX: why"),
            "{table}"
        );
        assert!(lines[6].starts_with("total "), "{table}");
        assert_eq!(steps.skipped(), ["TestX: why"]);
    }

    /// Two steps at once, on two threads: each row has its own thread's waits and skips. The
    /// steps interleave so that, were the events one list for the process, the lane's step would
    /// end holding the main step's wait and the main step would end with nothing.
    #[test]
    fn a_lane_on_another_thread_keeps_its_waits_and_skips_out_of_the_step_beside_it() {
        let mut steps = Steps::new();
        let mut lane = steps.lane();
        let (lane_began, began) = std::sync::mpsc::channel();
        let (main_waited, waited_on_main) = std::sync::mpsc::channel();
        let (lane_ended, ended) = std::sync::mpsc::channel();
        let lane_steps = &mut lane;
        std::thread::scope(|s| {
            s.spawn(move || {
                lane_steps
                    .run("node-v2", || {
                        lane_began.send(()).unwrap();
                        waited_on_main.recv().unwrap();
                        waited("the VM image build", Duration::from_secs(3));
                        skipped("TestY: why");
                        Ok(())
                    })
                    .unwrap();
                lane_ended.send(()).unwrap();
            });
            began.recv().unwrap();
            steps
                .run("cluster", || {
                    waited("the helm build", Duration::from_secs(2));
                    main_waited.send(()).unwrap();
                    ended.recv().unwrap();
                    Ok(())
                })
                .unwrap();
        });
        steps.merge(lane);
        let table = steps.table();
        let row = |name: &str| {
            table
                .lines()
                .find(|l| l.starts_with(name))
                .unwrap_or_else(|| panic!("no row {name} in\n{table}"))
                .to_owned()
        };
        assert!(row("cluster").ends_with("the helm build 2.0 s"), "{table}");
        assert!(
            row("node-v2").contains("the VM image build 3.0 s")
                && row("node-v2").ends_with("SKIPPED SOME"),
            "{table}"
        );
        assert!(!row("cluster").contains("VM image"), "{table}");
        assert!(!row("node-v2").contains("helm"), "{table}");
        assert_eq!(steps.skipped(), ["TestY: why"]);
    }

    #[test]
    fn durations_read_as_seconds_then_minutes() {
        assert_eq!(clock(Duration::from_secs(725)), "12:05");
        assert_eq!(secs(Duration::from_millis(1500)), "1.5 s");
        assert_eq!(secs(Duration::from_secs(1909)), "31:49 min");
    }
}
