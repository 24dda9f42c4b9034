//! The DRA resource health stream: the driver's device health, streamed to the kubelet.
//!
//! The kubelet opens `NodeWatchResources` on the DRA socket of every plugin it registers, and
//! opens it again 5 s after a stream ends. Which service it opens depends on its release: 1.36
//! opens `v1alpha1.DRAResourceHealth` whether GetInfo lists it or not (the `ResourceHealthStatus`
//! gate is beta and on; 1.34 and 1.35 only with the alpha gate on); 1.37 and later open only a
//! service GetInfo lists, `v1.DRAResourceHealth` before `v1alpha1`, and stop at an
//! `Unimplemented` answer. We serve and list both. Each message is the complete list of our
//! devices; the kubelet shows a device's health in
//! `status.containerStatuses[].allocatedResourcesStatus` of the pods whose claims hold it, and
//! turns it Unknown once its last report is older than the report's timeout.
//!
//! This module is the one source of every stream, whatever its version: the `health_wire`
//! module adapts it to each version's messages ([`HealthMessage`]) and serves it under each
//! version's service. The driver keeps the current [`HealthReport`] in a `tokio::sync::watch`
//! channel, and every stream sends:
//!
//! - the current report when it opens;
//! - each new report the driver publishes (`send`, `send_replace`; a change of health);
//! - the current report again once a third of its [`HealthReport::valid_for`] has passed since
//!   the last message, so that the kubelet's timeout never runs out while we are alive. A
//!   driver refreshes [`HealthReport::checked_at`] without waking the streams
//!   (`send_if_modified` returning `false`), and these repeats carry the fresh time.
//!
//! A stream ends when the client goes away (its task ends at the next send or at once, and
//! nothing else is affected) and when the plugin stops, so that the DRA server's graceful stop
//! is not held up by streams that would otherwise never end. Once the driver drops its sender the
//! streams stop repeating the report (it would be stale) but stay open, so the kubelet does not
//! reopen them every 5 s.

use std::{
    pin::Pin,
    time::{Duration, SystemTime},
};

use tokio::{
    sync::{mpsc, watch},
    time::Instant,
};
use tokio_stream::{Stream, wrappers::ReceiverStream};
use tonic::Status;
use tracing::{debug, info};

/// The health of one device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Health {
    /// Working as published.
    Healthy,
    /// Not working as published; [`DeviceHealth::message`] says why.
    Unhealthy,
    /// Cannot be told.
    Unknown,
}

/// One device's health, as the kubelet is told about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceHealth {
    /// The pool the device is published in.
    pub pool: String,
    /// The device's name in its pool.
    pub device: String,
    pub health: Health,
    /// Why, in words (empty when there is nothing to say); kubelets 1.36 and later show it,
    /// cut at 1024 characters.
    pub message: String,
}

/// The health of every device of the driver, as last checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthReport {
    /// Every device of the driver on this node.
    pub devices: Vec<DeviceHealth>,
    /// When the driver last checked every device in the report.
    pub checked_at: SystemTime,
    /// How long after [`Self::checked_at`] the report holds; the kubelet turns the devices
    /// Unknown after that unless a newer report came (kubelets 1.35 and later; older ones
    /// assume 30 s). At least a second.
    pub valid_for: Duration,
}

impl HealthReport {
    /// The kubelet's own timeout, for reports that do not say.
    pub const KUBELET_DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

    /// A report on no devices, for a driver that reports no health.
    pub fn none() -> Self {
        Self {
            devices: Vec::new(),
            checked_at: SystemTime::now(),
            valid_for: Self::KUBELET_DEFAULT_TIMEOUT,
        }
    }

    /// [`Self::checked_at`] as the wire carries it: Unix seconds (0 before the epoch).
    pub(crate) fn wire_checked_at(&self) -> i64 {
        self.checked_at
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
    }

    /// [`Self::valid_for`] as the wire carries it: whole seconds, never zero (zero means the
    /// kubelet's default).
    pub(crate) fn wire_timeout(&self) -> i64 {
        i64::try_from(self.valid_for.as_secs().max(1)).unwrap_or(i64::MAX)
    }

    /// When a stream that sent this report at `sent` sends it again.
    fn repeat_at(&self, sent: Instant) -> Instant {
        sent + (self.valid_for / 3).max(Duration::from_millis(100))
    }
}

/// A health stream message of one wire version, made from a report. Implemented for each
/// version's `NodeWatchResourcesResponse` by the `health_wire` module.
pub(crate) trait HealthMessage: Send + 'static {
    fn from_report(report: &HealthReport) -> Self;
}

/// The messages of one open stream.
pub(crate) type Messages<M> = Pin<Box<dyn Stream<Item = Result<M, Status>> + Send>>;

/// Serves `NodeWatchResources`, in every version, from the driver's reports.
#[derive(Debug, Clone)]
pub(crate) struct HealthService {
    reports: watch::Receiver<HealthReport>,
    /// Becomes `true` (or its sender goes) when the plugin stops: every stream ends.
    stopping: watch::Receiver<bool>,
}

impl HealthService {
    pub(crate) fn new(
        reports: watch::Receiver<HealthReport>,
        stopping: watch::Receiver<bool>,
    ) -> Self {
        Self { reports, stopping }
    }

    /// Opens a stream of `version`'s messages (see the module docs for what it sends).
    pub(crate) fn open<M: HealthMessage>(&self, version: &'static str) -> Messages<M> {
        info!(version, "the kubelet opened a resource health stream");
        // One message in flight: a slow reader holds its own stream back and nobody else.
        let (tx, rx) = mpsc::channel(1);
        tokio::spawn(stream(
            self.reports.clone(),
            self.stopping.clone(),
            tx,
            version,
        ));
        Box::pin(ReceiverStream::new(rx))
    }
}

/// Why a stream's task ends.
#[derive(Debug)]
enum End {
    ClientGone,
    Stopping,
}

/// Feeds one stream until its client goes or the plugin stops (see the module docs).
async fn stream<M: HealthMessage>(
    mut reports: watch::Receiver<HealthReport>,
    mut stopping: watch::Receiver<bool>,
    tx: mpsc::Sender<Result<M, Status>>,
    version: &'static str,
) {
    let end = loop {
        let message = M::from_report(&reports.borrow_and_update());
        if let Err(end) = send(&tx, &mut stopping, message).await {
            break end;
        }
        // Once the driver dropped its sender, nothing new comes and repeating would send a stale
        // report as if fresh: wait for the end only.
        if reports.has_changed().is_err() {
            break idle(&tx, &mut stopping).await;
        }
        let repeat_at = reports.borrow().repeat_at(Instant::now());
        tokio::select! {
            changed = reports.changed() => {
                if changed.is_err() {
                    break idle(&tx, &mut stopping).await;
                }
            }
            () = tokio::time::sleep_until(repeat_at) => {}
            () = tx.closed() => break End::ClientGone,
            () = stopped(&mut stopping) => break End::Stopping,
        }
    };
    debug!(version, ?end, "a health stream ended");
}

/// Sends one message, unless the client goes or the plugin stops first.
async fn send<M>(
    tx: &mpsc::Sender<Result<M, Status>>,
    stopping: &mut watch::Receiver<bool>,
    message: M,
) -> Result<(), End> {
    tokio::select! {
        sent = tx.send(Ok(message)) => sent.map_err(|_| End::ClientGone),
        () = stopped(stopping) => Err(End::Stopping),
    }
}

/// Holds a stream open, sending nothing, until its client goes or the plugin stops.
async fn idle<M>(
    tx: &mpsc::Sender<Result<M, Status>>,
    stopping: &mut watch::Receiver<bool>,
) -> End {
    tokio::select! {
        () = tx.closed() => End::ClientGone,
        () = stopped(stopping) => End::Stopping,
    }
}

/// Resolves once the plugin stops (the flag is set or its sender dropped).
async fn stopped(stopping: &mut watch::Receiver<bool>) {
    let _ = stopping.wait_for(|stop| *stop).await;
}

#[cfg(test)]
mod tests {
    //! The streams' behaviour, through the v1alpha1 messages; `health_wire` checks that every
    //! version carries the same report.
    use dra_proto::health_v1alpha1 as wire;
    use tokio_stream::StreamExt;

    use super::*;

    type Stream = Messages<wire::NodeWatchResourcesResponse>;

    fn report(health: Health) -> HealthReport {
        HealthReport {
            devices: vec![DeviceHealth {
                pool: "node-a".into(),
                device: "cpu3".into(),
                health,
                message: String::new(),
            }],
            checked_at: SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000),
            valid_for: Duration::from_secs(45),
        }
    }

    fn open(service: &HealthService) -> Stream {
        service.open("v1alpha1")
    }

    async fn next(messages: &mut Stream) -> wire::NodeWatchResourcesResponse {
        messages
            .next()
            .await
            .expect("a message")
            .expect("not an error")
    }

    #[tokio::test(start_paused = true)]
    async fn a_stream_sends_the_current_report_each_change_and_repeats_before_the_timeout() {
        let (reports, rx) = watch::channel(report(Health::Healthy));
        let (_stop, stopping) = watch::channel(false);
        let service = HealthService::new(rx, stopping);
        let mut messages = open(&service);
        assert_eq!(
            next(&mut messages).await.devices[0].health(),
            wire::HealthStatus::Healthy
        );
        reports.send_replace(report(Health::Unhealthy));
        assert_eq!(
            next(&mut messages).await.devices[0].health(),
            wire::HealthStatus::Unhealthy
        );
        // A refreshed check wakes nobody; the repeat a third of the timeout later carries it.
        let before = Instant::now();
        reports.send_if_modified(|r| {
            r.checked_at += Duration::from_secs(5);
            false
        });
        let repeated = next(&mut messages).await;
        assert_eq!(Instant::now() - before, Duration::from_secs(15));
        assert_eq!(repeated.devices[0].last_updated_time, 1_700_000_005);
        assert_eq!(repeated.devices[0].health(), wire::HealthStatus::Unhealthy);
    }

    #[tokio::test(start_paused = true)]
    async fn streams_end_when_the_plugin_stops_and_idle_once_the_driver_is_gone() {
        let (reports, rx) = watch::channel(report(Health::Healthy));
        let (stop, stopping) = watch::channel(false);
        let service = HealthService::new(rx, stopping);
        let mut messages = open(&service);
        next(&mut messages).await;
        drop(reports);
        // No repeats of a report nobody refreshes any more; the stream stays open.
        let idle = tokio::time::timeout(Duration::from_secs(600), messages.next()).await;
        assert!(
            idle.is_err(),
            "nothing sent after the driver went: {idle:?}"
        );
        stop.send_replace(true);
        assert!(messages.next().await.is_none(), "the stream ends on stop");
    }

    #[tokio::test(start_paused = true)]
    async fn a_client_that_goes_mid_stream_ends_only_its_own_stream() {
        let (reports, rx) = watch::channel(report(Health::Healthy));
        let (_stop, stopping) = watch::channel(false);
        let service = HealthService::new(rx, stopping);
        let mut gone = open(&service);
        let mut stays = open(&service);
        next(&mut gone).await;
        next(&mut stays).await;
        drop(gone);
        reports.send_replace(report(Health::Unhealthy));
        assert_eq!(
            next(&mut stays).await.devices[0].health(),
            wire::HealthStatus::Unhealthy
        );
        let mut again = open(&service);
        assert_eq!(
            next(&mut again).await.devices[0].health(),
            wire::HealthStatus::Unhealthy,
            "a new stream starts from the current report"
        );
    }
}
