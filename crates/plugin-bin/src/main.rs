//! `resmgr`: the node agent binary, as it ships: the crate's [`resmgr_agent::main`] with no fault
//! hooks.

fn main() -> std::process::ExitCode {
    resmgr_agent::main(resmgr::faults::Faults::default())
}
