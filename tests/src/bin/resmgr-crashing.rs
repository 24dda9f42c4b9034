//! `resmgr` as it ships (`resmgr_agent::main`), plus the crash test's hook: with
//! `RESMGR_CRASH_AT=<point>` it aborts at that point, with `RESMGR_CRASH_AT=<point>:panic` it
//! panics there (and stops as the agent stops on any panic), and with
//! `RESMGR_HOLD_AT=<point>:<fifo>` it stops there until the test lets it go on
//! ([`integration_tests::crash`]), the way the Go agent suite kills or holds either agent in the
//! middle of a handover (`tests/conformance/agent/handover_test.go`) and panics one in the middle
//! of a prepare (`panic_test.go`). Without either variable it is the shipped agent.

fn main() -> std::process::ExitCode {
    resmgr_agent::main(integration_tests::crash::from_env())
}
