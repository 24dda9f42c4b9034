//! The process the crash-consistency test kills: a resource manager over a directory, with a
//! runtime whose state lives in a file there, asked to prepare or unprepare one claim.
//!
//! `crash-child <dir> prepare|unprepare`. It starts the manager from `<dir>/state`,
//! `<dir>/cdi` and `<dir>/metadata` (as the agent starts after a crash), synchronizes with the containers in
//! `<dir>/runtime.json`, opens the gate and runs the operation, as the kubelet's retry would.
//! With `RESMGR_CRASH_AT=<point>` it aborts at that crash point ([`integration_tests::crash`]);
//! otherwise it prints the answer and exits 0 when the claim's answer is a success.

use std::{path::PathBuf, process::ExitCode, sync::Arc};

use integration_tests::fakes::{FileRuntime, TestPolicy, claim, claim_ref};
use kube_dra::fake::StaticClaims;
use resmgr::{Manager, ManagerConfig, state::StateFile};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let [_, dir, op] = args.as_slice() else {
        eprintln!("usage: crash-child <dir> prepare|unprepare");
        return ExitCode::from(2);
    };
    let dir = PathBuf::from(dir);
    let runtime = Arc::new(FileRuntime {
        path: dir.join("runtime.json"),
    });
    let claims = Arc::new(StaticClaims::new());
    claims.insert(claim("c1", "pod-db", 2));
    let tokio = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    tokio.block_on(async {
        let manager = Manager::start(
            ManagerConfig {
                faults: integration_tests::crash::from_env(),
                metadata: Some(resmgr::metadata::MetadataStore::new(
                    dir.join("metadata"),
                    integration_tests::fakes::DRIVER,
                    kube_dra::metadata::MetadataVersion::ALL.to_vec(),
                )),
                ..ManagerConfig::new(integration_tests::fakes::DRIVER)
            },
            Box::new(TestPolicy::new(8)),
            StateFile::new(dir.join("state")),
            cdi::SpecStore::new(dir.join("cdi"), integration_tests::fakes::DRIVER).unwrap(),
            runtime.clone(),
            claims,
        )
        .unwrap();
        let updates = manager.synchronize(&runtime.containers()).await.unwrap();
        runtime.apply(&updates);
        manager.synchronized().await;
        let ok = match op.as_str() {
            "prepare" => {
                let answers = manager.prepare(&[claim_ref("c1")]).await.unwrap();
                println!("{:?}", answers["c1"]);
                answers["c1"].is_ok()
            }
            "unprepare" => {
                let answers = manager.unprepare(&[claim_ref("c1")]).await.unwrap();
                println!("{:?}", answers["c1"]);
                answers["c1"].is_ok()
            }
            other => {
                eprintln!("unknown operation {other:?}");
                false
            }
        };
        if ok {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        }
    })
}
