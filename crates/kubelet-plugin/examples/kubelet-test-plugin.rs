//! A kubelet plugin with a scripted claim handler, for the Go conformance tests
//! (tests/conformance/kubelet) that drive it with the kubelet's own gRPC clients.
//!
//! It serves the real `kubelet_plugin` servers. The test handler decides by the claim's name:
//!
//! - `fail-*`: that claim fails (prepare and unprepare), with a message naming it;
//! - `shared-*`: prepared with a share id (`share-<uid>`);
//! - anything else: prepared with one device, `dev-<name>` in pool `test-pool`, serving request
//!   `req-0`, granted by CDI device `test.resmgr.io/claim=<uid>`.
//!
//! A request containing a claim in namespace `refuse` is refused as a whole with `Unavailable`,
//! the way the real handler refuses claims before the runtime has synchronized.
//!
//! Its health stream reports device `dev-a` of `test-pool` Healthy until a line on stdin replaces
//! the report: `health <device>=<healthy|unhealthy|unknown>[:<message>];...` (devices of
//! `test-pool`, checked now, valid for 30 s).
//!
//! With `--stock-registration` it instead serves only the registration service on a plain tonic
//! server, without our `:authority` rewrite, so the Go tests can show the upstream problem.
//!
//! It prints one line per event to stdout, for the tests to wait on: `ready`, then `registration
//! <state>` on every change of the registration state, and `stopped` after an orderly shutdown
//! on SIGTERM or SIGINT. Logs go to stderr.

use std::{io::BufRead as _, path::PathBuf, sync::Arc, time::SystemTime};

use anyhow::Context;
use clap::Parser;
use kubelet_plugin::{
    ClaimError, ClaimHandler, ClaimRef, DeviceHealth, Health, HealthReport, KubeletConfig,
    KubeletPlugin, PrepareResults, PreparedDevice, RegistrationState, RequestError,
    UnprepareResults,
};
use tokio::{
    signal::unix::{SignalKind, signal},
    sync::watch,
};

#[derive(Debug, Parser)]
struct Args {
    /// The driver name.
    #[arg(long, default_value = "test.resmgr.io")]
    driver: String,
    /// The kubelet's plugins directory.
    #[arg(long)]
    plugins_dir: PathBuf,
    /// The kubelet's plugin registry directory.
    #[arg(long)]
    registry_dir: PathBuf,
    /// Serve only registration, on a stock tonic server (no `:authority` rewrite).
    #[arg(long)]
    stock_registration: bool,
}

#[derive(Debug)]
struct TestHandler;

impl TestHandler {
    fn refuse(claims: &[ClaimRef]) -> Result<(), RequestError> {
        if claims.iter().any(|c| c.namespace == "refuse") {
            return Err(RequestError::Unavailable(
                "test handler: still synchronizing with the container runtime".into(),
            ));
        }
        Ok(())
    }

    fn failure(claim: &ClaimRef, operation: &str) -> ClaimError {
        ClaimError::new(format!(
            "test handler: {operation} of claim {}/{} fails on purpose",
            claim.namespace, claim.name
        ))
    }
}

impl ClaimHandler for TestHandler {
    async fn prepare(&self, claims: &[ClaimRef]) -> Result<PrepareResults, RequestError> {
        Self::refuse(claims)?;
        Ok(claims
            .iter()
            .map(|claim| {
                let answer = if claim.name.starts_with("fail-") {
                    Err(Self::failure(claim, "prepare"))
                } else {
                    Ok(vec![PreparedDevice {
                        request_names: vec!["req-0".into()],
                        pool: "test-pool".into(),
                        device: format!("dev-{}", claim.name),
                        cdi_device_ids: vec![format!("test.resmgr.io/claim={}", claim.uid)],
                        share_id: claim
                            .name
                            .starts_with("shared-")
                            .then(|| format!("share-{}", claim.uid)),
                    }])
                };
                (claim.uid.clone(), answer)
            })
            .collect())
    }

    async fn unprepare(&self, claims: &[ClaimRef]) -> Result<UnprepareResults, RequestError> {
        Self::refuse(claims)?;
        Ok(claims
            .iter()
            .map(|claim| {
                let answer = if claim.name.starts_with("fail-") {
                    Err(Self::failure(claim, "unprepare"))
                } else {
                    Ok(())
                };
                (claim.uid.clone(), answer)
            })
            .collect())
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let args = Args::parse();
    let config = KubeletConfig {
        driver_name: args.driver,
        plugins_dir: args.plugins_dir,
        registry_dir: args.registry_dir,
        instance: None,
    };
    let mut term = signal(SignalKind::terminate()).context("SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("SIGINT handler")?;

    if args.stock_registration {
        return stock::serve(&config, async move {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
        })
        .await;
    }

    let (health, reports) = watch::channel(report("dev-a=healthy")?);
    // Blocking stdin on a thread of its own; a line that does not parse is logged and skipped.
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines().map_while(Result::ok) {
            match line.strip_prefix("health ").map(report) {
                Some(Ok(r)) => {
                    health.send_replace(r);
                }
                Some(Err(e)) => tracing::error!(error = %e, "bad health line"),
                None => tracing::error!(%line, "unknown command"),
            }
        }
        // No more lines: the last report stands, and is repeated, for as long as we run.
        loop {
            std::thread::park();
        }
    });
    let plugin = KubeletPlugin::start_with_health(&config, Arc::new(TestHandler), reports)
        .await
        .context("starting the kubelet plugin")?;
    println!("ready");
    let mut state = plugin.registration_state();
    loop {
        tokio::select! {
            _ = term.recv() => break,
            _ = int.recv() => break,
            changed = state.changed() => {
                if changed.is_err() {
                    break;
                }
                let line = match &*state.borrow_and_update() {
                    RegistrationState::Pending => "registration pending".to_owned(),
                    RegistrationState::Registered => "registration registered".to_owned(),
                    RegistrationState::Rejected { error } => {
                        format!("registration rejected: {error}")
                    }
                };
                println!("{line}");
            }
        }
    }
    plugin.shutdown().await.context("shutting down")?;
    println!("stopped");
    Ok(())
}

/// A report from `<device>=<health>[:<message>];...`.
fn report(spec: &str) -> anyhow::Result<HealthReport> {
    let devices = spec
        .split(';')
        .map(str::trim)
        .filter(|item| !item.is_empty())
        .map(|item| {
            let (device, rest) = item
                .split_once('=')
                .with_context(|| format!("{item:?}: no '='"))?;
            let (health, message) = rest.split_once(':').unwrap_or((rest, ""));
            let health = match health {
                "healthy" => Health::Healthy,
                "unhealthy" => Health::Unhealthy,
                "unknown" => Health::Unknown,
                other => anyhow::bail!("{item:?}: health {other:?}"),
            };
            Ok(DeviceHealth {
                pool: "test-pool".into(),
                device: device.to_owned(),
                health,
                message: message.to_owned(),
            })
        })
        .collect::<anyhow::Result<_>>()?;
    Ok(HealthReport {
        devices,
        checked_at: SystemTime::now(),
        valid_for: HealthReport::KUBELET_DEFAULT_TIMEOUT,
    })
}

/// A registration server as tonic serves it out of the box: no `:authority` rewrite.
mod stock {
    use std::future::Future;

    use anyhow::Context;
    use dra_proto::pluginregistration::{
        InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse,
        registration_server::{Registration, RegistrationServer},
    };
    use kubelet_plugin::KubeletConfig;
    use tokio::net::UnixListener;
    use tokio_stream::wrappers::UnixListenerStream;
    use tonic::{Request, Response, Status};

    struct Stock;

    #[tonic::async_trait]
    impl Registration for Stock {
        async fn get_info(&self, _: Request<InfoRequest>) -> Result<Response<PluginInfo>, Status> {
            Ok(Response::new(PluginInfo {
                r#type: "DRAPlugin".into(),
                ..PluginInfo::default()
            }))
        }

        async fn notify_registration_status(
            &self,
            _: Request<RegistrationStatus>,
        ) -> Result<Response<RegistrationStatusResponse>, Status> {
            Ok(Response::new(RegistrationStatusResponse {}))
        }
    }

    pub(crate) async fn serve(
        config: &KubeletConfig,
        stop: impl Future<Output = ()>,
    ) -> anyhow::Result<()> {
        let path = config.registration_socket();
        std::fs::create_dir_all(&config.registry_dir).context("creating the registry dir")?;
        let listener =
            UnixListener::bind(&path).with_context(|| format!("binding {}", path.display()))?;
        println!("ready");
        tonic::transport::Server::builder()
            .add_service(RegistrationServer::new(Stock))
            .serve_with_incoming_shutdown(UnixListenerStream::new(listener), stop)
            .await
            .context("serving")?;
        let _ = std::fs::remove_file(&path);
        println!("stopped");
        Ok(())
    }
}
