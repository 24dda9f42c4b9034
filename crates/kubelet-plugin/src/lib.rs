//! The kubelet side of a DRA driver: plugin registration, the DRA gRPC service and the resource
//! health stream, over unix sockets, in front of a [`ClaimHandler`] the driver implements and
//! the [`HealthReport`]s it keeps.
//!
//! This is the part of a DRA driver that is the same for every driver (the shape of Go's
//! `k8s.io/dynamic-resource-allocation/kubeletplugin`): sockets, registration, both DRA versions,
//! request validation, the health stream, and the HTTP/2 fix the kubelet's clients need. It knows nothing of
//! resources, policies or the Kubernetes API; it depends only on `dra-proto`. What a prepare
//! means is the handler's business (resmgr's is its claim lifecycle, in `resmgr::dra_handler`).
//!
//! [`KubeletPlugin::start`] serves two sockets:
//!
//! | socket | default path | services |
//! |---|---|---|
//! | DRA | `/var/lib/kubelet/plugins/<driver>/dra.sock` | `k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin`, `k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin`, `v1.DRAResourceHealth`, `v1alpha1.DRAResourceHealth` |
//! | registration | `/var/lib/kubelet/plugins_registry/<driver>-reg.sock` | `pluginregistration.Registration` |
//!
//! Both directories are configurable ([`KubeletConfig`]), for kubelets with a relocated root
//! directory. Mount them into the container at the same paths as on the host: the DRA socket's
//! path is what we tell the kubelet, and the kubelet resolves it on the host. Each socket appears
//! in its directory once, under its final name, already with its final mode: the kubelet's plugin
//! watcher logs an error for any name that appears in the registry and is gone when it looks
//! (the `socket` module says how).
//!
//! # Which kubelet speaks which version to us
//!
//! `GetInfo` offers `["v1.DRAPlugin", "v1beta1.DRAPlugin"]`, most preferred first, and both are
//! served from the same [`ClaimHandler`]:
//!
//! | kubelet | DRA service it calls | how it dials the DRA socket |
//! |---|---|---|
//! | 1.32, 1.33 | `v1beta1.DRAPlugin` (the only one of ours it knows) | by path: percent-encoded `:authority` |
//! | 1.34 | `v1.DRAPlugin` (first of our list it supports) | `unix:` target: `:authority` `localhost` |
//! | 1.35 and later | `v1.DRAPlugin`; reads `share_id` | `unix:` target |
//!
//! Every kubelet dials the registration socket by path, with the percent-encoded path as
//! `:authority`; the `authority` module explains why our servers need a rewrite to answer it. 1.32 and
//! 1.33 also need the DRA feature gate on; without it they answer `NotifyRegistrationStatus`
//! with "no handler registered for plugin type", which we log and publish as
//! [`RegistrationState::Rejected`].
//!
//! # Device health
//!
//! The DRA socket also serves the resource health stream (`NodeWatchResources`) in both its
//! versions, `v1.DRAResourceHealth` and `v1alpha1.DRAResourceHealth` (the same messages in two
//! proto packages), from one source, and `GetInfo` lists both after the DRA versions (no kubelet
//! chooses its DRA version by other entries):
//!
//! | kubelet | health service it opens |
//! |---|---|
//! | 1.34, 1.35 | `v1alpha1`, with the alpha `ResourceHealthStatus` gate on, listed or not |
//! | 1.36 | `v1alpha1` (the gate is beta and on), listed or not |
//! | 1.37 to 1.39 | the newest version GetInfo lists: `v1`; none if neither is listed |
//!
//! Each opens a stream on every registered plugin and reopens it 5 s after it ends; 1.34 to
//! 1.36 log an `Unimplemented` answer at error level each time, 1.37 stops at it. A driver hands
//! its reports to [`KubeletPlugin::start_with_health`] as a `watch` channel of
//! [`HealthReport`]s; every stream sends the current report when it opens, each new one, and
//! the current one again before its timeout runs out. [`KubeletPlugin::start`] serves a stream
//! that reports no devices. The kubelet shows a device's health in `allocatedResourcesStatus`
//! of the containers whose claims hold it (the `message` from 1.36 on).
//!
//! # Limits and errors
//!
//! DRA requests are decoded up to [`MAX_DRA_REQUEST`] bytes and responses capped at
//! [`MAX_DRA_RESPONSE`] (grpc-go's default receive limit, which the kubelet keeps); larger
//! messages are refused by tonic with `OutOfRange`. A request that does not decode, or names a
//! claim without namespace, UID or name, or names a UID twice, is `InvalidArgument`; nothing a
//! client sends can panic the server. Refusals of a whole call come from the handler
//! ([`RequestError`]); everything else is answered per claim.
//!
//! # Modules
//!
//! - `plugin`: start-up and shutdown order, the servers' settings;
//! - `socket`: directories, locking, stale sockets, appearance under the final name only, removal;
//! - `registration`: `GetInfo` and the registration state;
//! - `dra`, `wire`, `handler`: the DRA service over one handler, version conversion;
//! - `health`: the resource health stream, fed by the driver's reports;
//! - `health_wire`: that stream as `v1` and as `v1alpha1` messages and services;
//! - `authority`: the `:authority` rewrite in front of both servers;
//! - [`names`]: DNS label and subdomain rules, shared with the driver.

mod authority;
mod dra;
mod handler;
mod health;
mod health_wire;
pub mod names;
mod plugin;
mod registration;
mod socket;
mod wire;

/// The properties the fuzz targets check (`fuzz/`); not an API.
#[doc(hidden)]
pub use self::authority::fuzzing;
pub use self::{
    handler::{
        ClaimError, ClaimHandler, ClaimRef, PrepareResults, PreparedDevice, RequestError,
        UnprepareResults,
    },
    health::{DeviceHealth, Health, HealthReport},
    plugin::{
        KubeletConfig, KubeletError, KubeletPlugin, MAX_DRA_REQUEST, MAX_DRA_RESPONSE,
        MAX_REGISTRATION_MESSAGE,
    },
    registration::{PLUGIN_TYPE, RegistrationState, SUPPORTED_VERSIONS},
    socket::{DIR_MODE, SOCKET_MODE, SocketError},
};
