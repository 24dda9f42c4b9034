//! The Plugin service we serve on mux connection 1: decodes each call, runs the plugin's handler
//! and encodes its reply.
//!
//! Owns Configure (runtime version, timeouts, the subscription mask), chunked Synchronize
//! (answer every `more` chunk with an empty update and `more`, hand the plugin everything at the
//! end) and the mapping of every other call onto the [`Plugin`] trait, including the dedicated
//! per-event calls of NRI v0.12 runtimes or, when configured, Unimplemented so that those runtimes
//! fall back to StateChange. Every handler runs inside [`IN_EVENT_HANDLER`], which is how
//! `update_containers` recognises (and refuses) a call from inside a handler, and is counted by
//! the connection's lull ([`super::lull`]), with the updates its reply carries, which
//! `update_containers` waits out.

use std::{
    future::Future,
    sync::{Arc, Mutex},
    time::Duration,
};

use bytes::Bytes;
use prost::Message;
use stdx::sync::lock;
use tokio::sync::oneshot;

use super::Shared;
use crate::{
    api::{self, Event},
    plugin::{Delivery, Plugin, PluginError, RuntimeInfo, StateChange},
    rpc::{Reply, ReplyFuture, Service, Status, code},
    version,
};

tokio::task_local! {
    /// Set while a runtime call's handler runs: the runtime holds its NRI lock for exactly that
    /// long, so an unsolicited update from here would deadlock.
    pub(crate) static IN_EVENT_HANDLER: ();
}

/// Timeouts assumed when a runtime (NRI before v0.7) does not announce them.
const DEFAULT_REGISTRATION_TIMEOUT: Duration = Duration::from_secs(5);
pub(crate) const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(2);

/// Pods and containers of a chunked Synchronize gathered so far.
#[derive(Debug, Default)]
struct SyncChunks {
    pods: Vec<api::PodSandbox>,
    containers: Vec<api::Container>,
}

#[derive(Debug)]
pub(crate) struct PluginService<P> {
    pub plugin: Arc<P>,
    pub shared: Arc<Shared>,
    /// Serve the NRI v0.12 per-event calls; when false they get Unimplemented and the runtime
    /// falls back to StateChange.
    pub dedicated_event_calls: bool,
    sync: Mutex<SyncChunks>,
}

impl<P: Plugin> PluginService<P> {
    pub fn new(plugin: Arc<P>, shared: Arc<Shared>, dedicated_event_calls: bool) -> Self {
        Self {
            plugin,
            shared,
            dedicated_event_calls,
            sync: Mutex::default(),
        }
    }

    async fn dispatch(&self, method: &str, payload: Bytes) -> Reply {
        let mut handling = self.shared.lull.handling();
        let plugin = &*self.plugin;
        let mut replied = |n: usize| handling.replied_with(n);
        let result = match method {
            "Configure" => return self.configure(payload).await.into(),
            "Synchronize" => return self.synchronize(payload, &mut replied).await,
            "CreateContainer" => {
                unary_with_updates(payload, &mut replied, |r| plugin.create_container(r)).await
            }
            "UpdateContainer" => {
                unary_with_updates(payload, &mut replied, |r| plugin.update_container(r)).await
            }
            "StopContainer" => {
                unary_with_updates(payload, &mut replied, |r| plugin.stop_container(r)).await
            }
            "UpdatePodSandbox" => {
                unary(payload, |r| async {
                    plugin.update_pod_sandbox(r).await?;
                    Ok(api::UpdatePodSandboxResponse {})
                })
                .await
            }
            "StateChange" => {
                unary(payload, |r: api::StateChangeEvent| async move {
                    let event = Event::try_from(r.event).unwrap_or(Event::Unknown);
                    plugin
                        .state_change(StateChange {
                            event,
                            pod: r.pod,
                            container: r.container,
                            delivery: Delivery::StateChange,
                        })
                        .await?;
                    Ok(api::Empty {})
                })
                .await
            }
            "Shutdown" => {
                plugin.shutdown().await;
                Ok(Vec::new())
            }
            _ => match dedicated_event(method) {
                Some(event) if self.dedicated_event_calls => {
                    // Every dedicated request carries pod #1 and, for container events,
                    // container #2: one message type decodes them all.
                    unary(payload, |r: api::StartContainerRequest| async move {
                        plugin
                            .state_change(StateChange {
                                event,
                                pod: r.pod,
                                container: r.container,
                                delivery: Delivery::Dedicated,
                            })
                            .await?;
                        // Every dedicated response is an empty message.
                        Ok(api::Empty {})
                    })
                    .await
                }
                _ => Err(Status::new(
                    code::UNIMPLEMENTED,
                    format!("method {method} is not implemented"),
                )),
            },
        };
        result.into()
    }

    async fn configure(&self, payload: Bytes) -> Result<Vec<u8>, Status> {
        let req: api::ConfigureRequest = decode(payload)?;
        let runtime = RuntimeInfo {
            nri_version: version::runtime_nri_version(
                &req.nri_version,
                &req.runtime_name,
                &req.runtime_version,
            ),
            name: req.runtime_name,
            version: req.runtime_version,
            config: req.config,
            registration_timeout: millis_or(req.registration_timeout, DEFAULT_REGISTRATION_TIMEOUT),
            request_timeout: millis_or(req.request_timeout, DEFAULT_REQUEST_TIMEOUT),
        };
        self.plugin.configure(&runtime).await.map_err(refusal)?;
        let (events, dropped) = self.plugin.events().split_for(runtime.nri_version);
        if !dropped.is_empty() {
            tracing::warn!(
                runtime = %runtime.name,
                runtime_version = %runtime.version,
                ?dropped,
                "the runtime's NRI version cannot deliver these events; not subscribing to them"
            );
        }
        if events.is_empty() {
            // A zero mask would subscribe to everything.
            return Err(Status::new(
                code::UNKNOWN,
                format!(
                    "none of the plugin's events {:?} is known to {} {}",
                    self.plugin.events(),
                    runtime.name,
                    runtime.version
                ),
            ));
        }
        let mask = i32::try_from(events.mask()).map_err(|_| {
            Status::new(
                code::UNKNOWN,
                format!("event mask {:#x} overflows", events.mask()),
            )
        })?;
        tracing::info!(
            runtime = %runtime.name,
            runtime_version = %runtime.version,
            nri_version = ?runtime.nri_version,
            ?events,
            "configured"
        );
        self.shared.set_configured(runtime);
        Ok(api::ConfigureResponse { events: mask }.encode_to_vec())
    }

    /// Tells `replied` how many updates the final reply carries.
    async fn synchronize(&self, payload: Bytes, replied: &mut impl FnMut(usize)) -> Reply {
        let req: api::SynchronizeRequest = match decode(payload) {
            Ok(r) => r,
            Err(status) => return Err(status).into(),
        };
        let (pods, containers) = {
            let mut chunks = lock(&self.sync);
            chunks.pods.extend(req.pods);
            chunks.containers.extend(req.containers);
            if req.more {
                // Not the last chunk: an empty update and `more` echoed, or the runtime drops us.
                let reply = api::SynchronizeResponse {
                    update: vec![],
                    more: true,
                };
                return Ok(reply.encode_to_vec()).into();
            }
            let all = std::mem::take(&mut *chunks);
            (all.pods, all.containers)
        };
        tracing::info!(
            pods = pods.len(),
            containers = containers.len(),
            "synchronizing"
        );
        let update = match self.plugin.synchronize(pods, containers).await {
            Ok(u) => u,
            Err(e) => return Err(refusal(e)).into(),
        };
        replied(update.len());
        let reply = api::SynchronizeResponse {
            update,
            more: false,
        };
        let (written, on_written) = oneshot::channel();
        let shared = self.shared.clone();
        tokio::spawn(async move {
            if on_written.await.is_ok() {
                shared.set_synchronized();
            }
        });
        Reply {
            result: Ok(reply.encode_to_vec()),
            written: Some(written),
        }
    }
}

impl<P: Plugin> Service for PluginService<P> {
    fn call(self: Arc<Self>, method: String, payload: Bytes) -> ReplyFuture {
        let received = tokio::time::Instant::now();
        Box::pin(IN_EVENT_HANDLER.scope((), async move {
            let started = tokio::time::Instant::now();
            let reply = self.dispatch(&method, payload).await;
            warn_if_slow(&method, started - received, started.elapsed(), &self.shared);
            reply
        }))
    }
}

/// A call answered later than this is logged: runtimes drop a plugin that misses their request
/// timeout (2 s by default), so one that comes near it is worth knowing of, with where its time
/// went.
const SLOW_ANSWER: Duration = Duration::from_secs(1);

/// Logs a call whose answer took longer than [`SLOW_ANSWER`]: `queued` from its arrival until
/// its handler first ran (the process's threads were busy), `handled` in the handler.
fn warn_if_slow(method: &str, queued: Duration, handled: Duration, shared: &Shared) {
    if queued + handled > SLOW_ANSWER {
        tracing::warn!(
            call = method,
            queued_ms = queued.as_millis(),
            handled_ms = handled.as_millis(),
            runtime_timeout_ms = shared.request_timeout().as_millis(),
            "answered a runtime call slowly"
        );
    }
}

/// The event behind a v0.12 dedicated call.
fn dedicated_event(method: &str) -> Option<Event> {
    Some(match method {
        "RunPodSandbox" => Event::RunPodSandbox,
        "StopPodSandbox" => Event::StopPodSandbox,
        "RemovePodSandbox" => Event::RemovePodSandbox,
        "PostUpdatePodSandbox" => Event::PostUpdatePodSandbox,
        "PostCreateContainer" => Event::PostCreateContainer,
        "StartContainer" => Event::StartContainer,
        "PostStartContainer" => Event::PostStartContainer,
        "PostUpdateContainer" => Event::PostUpdateContainer,
        "RemoveContainer" => Event::RemoveContainer,
        _ => return None,
    })
}

/// Decodes the request, runs the handler, encodes its reply.
async fn unary<Req, Resp, F, Fut>(payload: Bytes, handler: F) -> Result<Vec<u8>, Status>
where
    Req: Message + Default,
    Resp: Message,
    F: FnOnce(Req) -> Fut,
    Fut: Future<Output = Result<Resp, PluginError>>,
{
    let request = decode(payload)?;
    let reply = handler(request).await.map_err(refusal)?;
    Ok(reply.encode_to_vec())
}

/// A reply that carries updates of other containers, which the runtime applies after it.
trait CarriesUpdates {
    fn updates(&self) -> usize;
}

impl CarriesUpdates for api::CreateContainerResponse {
    fn updates(&self) -> usize {
        self.update.len()
    }
}

impl CarriesUpdates for api::UpdateContainerResponse {
    fn updates(&self) -> usize {
        self.update.len()
    }
}

impl CarriesUpdates for api::StopContainerResponse {
    fn updates(&self) -> usize {
        self.update.len()
    }
}

/// Like [`unary`], telling `replied` how many updates the reply carries (for the lull).
async fn unary_with_updates<Req, Resp, F, Fut>(
    payload: Bytes,
    replied: &mut impl FnMut(usize),
    handler: F,
) -> Result<Vec<u8>, Status>
where
    Req: Message + Default,
    Resp: Message + CarriesUpdates,
    F: FnOnce(Req) -> Fut,
    Fut: Future<Output = Result<Resp, PluginError>>,
{
    let request = decode(payload)?;
    let reply = handler(request).await.map_err(refusal)?;
    replied(reply.updates());
    Ok(reply.encode_to_vec())
}

fn decode<M: Message + Default>(payload: Bytes) -> Result<M, Status> {
    M::decode(payload).map_err(|e| {
        Status::new(
            code::INVALID_ARGUMENT,
            format!("decoding {}: {e}", std::any::type_name::<M>()),
        )
    })
}

/// A handler's refusal as the status the runtime receives: its kind's code, its message.
fn refusal(e: PluginError) -> Status {
    Status::new(e.kind.code(), e.message)
}

/// A timeout announced in milliseconds; 0 or negative means "not announced".
fn millis_or(ms: i64, default: Duration) -> Duration {
    u64::try_from(ms)
        .ok()
        .filter(|&ms| ms > 0)
        .map_or(default, Duration::from_millis)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::UpdateLull;

    /// The threshold: through the service, `stub::tests` checks a call past it.
    #[test]
    fn a_call_answered_within_a_second_is_not_logged() {
        let logged = stdx::logs::captured(|| {
            warn_if_slow(
                "CreateContainer",
                Duration::from_millis(400),
                Duration::from_millis(500),
                &Shared::new(UpdateLull::NONE),
            );
        });
        assert_eq!(logged, "");
    }
}
