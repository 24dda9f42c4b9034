//! A fake Kubernetes API server on loopback: plain HTTP/1.1 (hyper), enough
//! of `resource.k8s.io` (discovery, ResourceClaim get, ResourceSlice get/list/watch/create/update/
//! delete/deletecollection), `events.k8s.io/v1` Events (create, merge patch; checked as the API
//! server's validation does) and `nodes` get for the real kube-rs client to run against it.
//!
//! It behaves like the API server where our code depends on it: resourceVersions and optimistic
//! concurrency (409 on a stale update or delete precondition), `generateName`, field and label
//! selectors, watches that resume from a resourceVersion, a Status 404 naming the object for a
//! missing object and one naming nothing for an unserved version. It validates slices with
//! kube-dra's own `validate_slice_spec` (422 when refused). Tests can make it drop device fields
//! (a feature gate that is off), refuse the node-allocatable mapping for a Node that does not
//! declare it (1.37's admission), fail requests, and wait for a condition on its contents: every
//! change wakes the waiters, so no test sleeps.
//!
//! kube-dra's tests (`tests/kube_claims.rs`, `tests/kube_slices.rs`) start it in process;
//! the whole-agent conformance suite (`tests/conformance/agent`) runs it as a process, the
//! `fake-apiserver` binary (`src/bin/fake-apiserver.rs`).

use std::{
    collections::{BTreeMap, VecDeque},
    convert::Infallible,
    net::SocketAddr,
    sync::{Arc, Mutex, MutexGuard},
    time::Duration,
};

use futures::{Stream, StreamExt};
use http_body_util::{BodyExt, Full, StreamBody, combinators::BoxBody};
use hyper::{
    Method, Request, Response,
    body::{Bytes, Frame, Incoming},
    service::service_fn,
};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::sync::{broadcast, watch};

const GROUP: &str = "resource.k8s.io";

/// A watch event as the server sends it.
#[derive(Debug, Clone)]
struct Event {
    rv: u64,
    kind: &'static str,
    object: Value,
}

/// A request the server saw.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: Method,
    pub path: String,
    pub query: String,
}

/// Requests to fail: method, a path substring, the status to answer, how many more times.
#[derive(Debug)]
struct Failure {
    method: Method,
    path_contains: String,
    code: u16,
    remaining: usize,
}

#[derive(Debug, Default)]
struct Store {
    served: Vec<String>,
    rv: u64,
    next_name: u64,
    /// (plural, namespace, name) -> object.
    objects: BTreeMap<(String, String, String), Value>,
    log: Vec<Event>,
    seen: Vec<Seen>,
    failures: VecDeque<Failure>,
    /// Device fields the server drops on write (as with a feature gate off).
    dropped_device_fields: Vec<String>,
    /// Whether list-valued attributes are dropped on write (`DRAListTypeAttributes` off), which
    /// leaves them without a value and the slice refused.
    list_attributes_off: bool,
    /// Whether slices that map node resources are admitted only for a Node that declares the
    /// feature, as 1.37's NodeDeclaredFeatureValidator does.
    node_declared_features: bool,
}

#[derive(Debug)]
struct Shared {
    store: Mutex<Store>,
    events: broadcast::Sender<Event>,
    changed: watch::Sender<u64>,
}

/// The fake API server. Dropping it stops accepting connections.
#[derive(Debug)]
pub struct FakeApiServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FakeApiServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl FakeApiServer {
    /// Starts a server that serves `resource.k8s.io` in `versions` (`["v1", "v1beta2"]`).
    pub async fn start(versions: &[&str]) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (events, _) = broadcast::channel(4096);
        let shared = Arc::new(Shared {
            store: Mutex::new(Store {
                served: versions.iter().map(|v| (*v).to_owned()).collect(),
                ..Store::default()
            }),
            events,
            changed: watch::channel(0).0,
        });
        let server = Arc::clone(&shared);
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let shared = Arc::clone(&server);
                tokio::spawn(async move {
                    let service = service_fn(move |request| {
                        let shared = Arc::clone(&shared);
                        async move { Ok::<_, Infallible>(handle(&shared, request).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Self { addr, shared, task }
    }

    /// The server's base URL, `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A real kube-rs client for this server.
    pub fn client(&self) -> kube::Client {
        let url = self.url().parse().unwrap();
        kube::Client::try_from(kube::Config::new(url)).unwrap()
    }

    fn store(&self) -> MutexGuard<'_, Store> {
        self.shared.store.lock().unwrap()
    }

    /// Stores `object` as if created by someone else (claims, nodes, other slices), filling in
    /// uid and resourceVersion.
    pub fn insert(&self, mut object: Value) -> Value {
        let plural = plural_of(&object);
        let namespace = object["metadata"]["namespace"]
            .as_str()
            .unwrap_or("")
            .to_owned();
        let name = object["metadata"]["name"].as_str().unwrap().to_owned();
        if object["metadata"]["uid"].is_null() {
            object["metadata"]["uid"] = json!(format!("uid-{name}"));
        }
        let mut store = self.store();
        store.put(&self.shared, "ADDED", (plural, namespace, name), object)
    }

    /// Deletes an object (say `resourceclaims`, namespace, name) as its owner would; whether it
    /// was there.
    pub fn delete(&self, plural: &str, namespace: &str, name: &str) -> bool {
        let key = (plural.to_owned(), namespace.to_owned(), name.to_owned());
        self.store().remove(&self.shared, &key).is_some()
    }

    /// A node named `name` with uid `uid`.
    pub fn insert_node(&self, name: &str, uid: &str) {
        self.insert(json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "uid": uid},
        }));
    }

    /// All ResourceSlices, sorted by name.
    pub fn slices(&self) -> Vec<Value> {
        self.store()
            .objects
            .iter()
            .filter(|((plural, _, _), _)| plural == "resourceslices")
            .map(|(_, object)| object.clone())
            .collect()
    }

    /// Deletes every slice matching `field_selector` the way the kubelet does (DeleteCollection).
    pub fn delete_slices(&self, field_selector: &str) -> usize {
        let mut store = self.store();
        let keys: Vec<_> = store
            .objects
            .iter()
            .filter(|((plural, _, _), object)| {
                plural == "resourceslices" && matches_fields(object, field_selector)
            })
            .map(|(key, _)| key.clone())
            .collect();
        for key in &keys {
            store.remove(&self.shared, key);
        }
        keys.len()
    }

    /// Drops the list values of attributes (`strings`, ...) from every slice written from now
    /// on, as an API server without `DRAListTypeAttributes` does before validating.
    pub fn turn_list_attributes_off(&self) {
        self.store().list_attributes_off = true;
    }

    /// Drops these device fields from every slice written from now on.
    pub fn drop_device_fields(&self, fields: &[&str]) {
        self.store().dropped_device_fields = fields.iter().map(|f| (*f).to_owned()).collect();
    }

    /// From now on, refuses slices that map node resources (`nodeAllocatableResources`) for a
    /// Node whose `status.declaredFeatures` lacks `DRANodeAllocatableResources`, with the 403 of
    /// 1.37's NodeDeclaredFeatureValidator admission; `false` admits them again.
    pub fn check_node_declared_features(&self, on: bool) {
        self.store().node_declared_features = on;
    }

    /// Sets the Node's `status.declaredFeatures`, as its kubelet does when it starts.
    pub fn declare_node_features(&self, node: &str, features: &[&str]) {
        let mut store = self.store();
        let key = ("nodes".to_owned(), String::new(), node.to_owned());
        let mut object = store.objects.get(&key).cloned().expect("the node exists");
        object["status"]["declaredFeatures"] = json!(features);
        store.put(&self.shared, "MODIFIED", key, object);
    }

    /// Answers the next `count` `method` requests whose path contains `path_contains` with `code`.
    pub fn fail(&self, method: Method, path_contains: &str, code: u16, count: usize) {
        self.store().failures.push_back(Failure {
            method,
            path_contains: path_contains.to_owned(),
            code,
            remaining: count,
        });
    }

    /// Serves `resource.k8s.io` in `versions` from now on (an upgrade or a downgrade).
    pub fn set_served(&self, versions: &[&str]) {
        self.store().served = versions.iter().map(|v| (*v).to_owned()).collect();
    }

    /// Every request so far.
    pub fn requests(&self) -> Vec<Seen> {
        self.store().seen.clone()
    }

    /// All `events.k8s.io` Events, by namespace and name.
    pub fn events(&self) -> Vec<Value> {
        self.store()
            .objects
            .iter()
            .filter(|((plural, _, _), _)| plural == "events")
            .map(|(_, object)| object.clone())
            .collect()
    }

    /// Waits until `condition` holds for the Events, as [`FakeApiServer::wait_for_slices`].
    pub async fn wait_for_events(
        &self,
        what: &str,
        condition: impl Fn(&[Value]) -> bool,
    ) -> Vec<Value> {
        self.wait_for("events", Self::events, what, condition).await
    }

    /// Waits until `condition` holds for the slices, woken by every change; fails the test after
    /// 20 s (a guard against hanging, not a synchronization).
    pub async fn wait_for_slices(
        &self,
        what: &str,
        condition: impl Fn(&[Value]) -> bool,
    ) -> Vec<Value> {
        self.wait_for("slices", Self::slices, what, condition).await
    }

    /// Waits until `condition` holds for what `read` lists (`kind` names it in the failure),
    /// woken by every change of the store.
    async fn wait_for(
        &self,
        kind: &str,
        read: fn(&Self) -> Vec<Value>,
        what: &str,
        condition: impl Fn(&[Value]) -> bool,
    ) -> Vec<Value> {
        let mut changed = self.shared.changed.subscribe();
        let wait = async {
            loop {
                let objects = read(self);
                if condition(&objects) {
                    return objects;
                }
                changed.changed().await.unwrap();
            }
        };
        match tokio::time::timeout(Duration::from_secs(20), wait).await {
            Ok(objects) => objects,
            Err(_) => panic!(
                "timed out waiting for {what}; {kind}: {:#}",
                json!(read(self))
            ),
        }
    }
}

impl Store {
    fn bump(&mut self) -> u64 {
        self.rv += 1;
        self.rv
    }

    fn put(
        &mut self,
        shared: &Shared,
        kind: &'static str,
        key: (String, String, String),
        mut object: Value,
    ) -> Value {
        let rv = self.bump();
        object["metadata"]["resourceVersion"] = json!(rv.to_string());
        self.objects.insert(key, object.clone());
        self.emit(
            shared,
            Event {
                rv,
                kind,
                object: object.clone(),
            },
        );
        object
    }

    fn remove(&mut self, shared: &Shared, key: &(String, String, String)) -> Option<Value> {
        let mut object = self.objects.remove(key)?;
        let rv = self.bump();
        object["metadata"]["resourceVersion"] = json!(rv.to_string());
        self.emit(
            shared,
            Event {
                rv,
                kind: "DELETED",
                object: object.clone(),
            },
        );
        Some(object)
    }

    fn emit(&mut self, shared: &Shared, event: Event) {
        self.log.push(event.clone());
        let _ = shared.events.send(event);
        shared.changed.send_modify(|n| *n += 1);
    }
}

fn plural_of(object: &Value) -> String {
    match object["kind"].as_str().unwrap() {
        "Node" => "nodes".to_owned(),
        "ResourceClaim" => "resourceclaims".to_owned(),
        "ResourceSlice" => "resourceslices".to_owned(),
        "Event" => "events".to_owned(),
        other => panic!("fake api server does not know kind {other}"),
    }
}

type Body = BoxBody<Bytes, Infallible>;

fn respond(code: u16, body: &Value) -> Response<Body> {
    Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())).boxed())
        .unwrap()
}

fn status(code: u16, reason: &str, message: &str, details: Value) -> Response<Body> {
    respond(
        code,
        &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": message, "reason": reason, "details": details, "code": code}),
    )
}

fn not_found(plural: &str, name: &str) -> Response<Body> {
    status(
        404,
        "NotFound",
        &format!("{plural}.{GROUP} \"{name}\" not found"),
        json!({"name": name, "group": GROUP, "kind": plural}),
    )
}

/// What the API server answers for a path it does not serve: a 404 naming no object.
fn path_not_found() -> Response<Body> {
    status(
        404,
        "NotFound",
        "the server could not find the requested resource",
        json!({}),
    )
}

fn query_param(query: &str, key: &str) -> Option<String> {
    query.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=')?;
        (k == key).then(|| percent_decode(v))
    })
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && i + 2 < bytes.len()
            && let Ok(b) = u8::from_str_radix(&s[i + 1..i + 3], 16)
        {
            out.push(b);
            i += 3;
            continue;
        }
        out.push(if bytes[i] == b'+' { b' ' } else { bytes[i] });
        i += 1;
    }
    String::from_utf8(out).unwrap()
}

fn field_value<'a>(object: &'a Value, field: &str) -> &'a Value {
    field.split('.').fold(object, |v, key| &v[key])
}

fn matches_fields(object: &Value, selector: &str) -> bool {
    selector.split(',').filter(|s| !s.is_empty()).all(|term| {
        let (field, value) = term
            .split_once("==")
            .or_else(|| term.split_once('='))
            .unwrap();
        field_value(object, field).as_str() == Some(value)
    })
}

fn matches_labels(object: &Value, selector: &str) -> bool {
    selector.split(',').filter(|s| !s.is_empty()).all(|term| {
        let (key, value) = term
            .split_once("==")
            .or_else(|| term.split_once('='))
            .unwrap();
        object["metadata"]["labels"][key].as_str() == Some(value)
    })
}

fn selected(object: &Value, query: &str) -> bool {
    matches_fields(
        object,
        &query_param(query, "fieldSelector").unwrap_or_default(),
    ) && matches_labels(
        object,
        &query_param(query, "labelSelector").unwrap_or_default(),
    )
}

async fn handle(shared: &Arc<Shared>, request: Request<Incoming>) -> Response<Body> {
    let method = request.method().clone();
    let path = request.uri().path().to_owned();
    let query = request.uri().query().unwrap_or("").to_owned();
    let body = request
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    {
        let mut store = shared.store.lock().unwrap();
        store.seen.push(Seen {
            method: method.clone(),
            path: path.clone(),
            query: query.clone(),
        });
        let failure = store
            .failures
            .iter_mut()
            .find(|f| f.remaining > 0 && f.method == method && path.contains(&f.path_contains));
        if let Some(failure) = failure {
            failure.remaining -= 1;
            let code = failure.code;
            return status(code, "InternalError", "injected failure", json!({}));
        }
    }
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    match segments.as_slice() {
        ["api", "v1", "nodes", name] if method == Method::GET => get(shared, "nodes", "", name),
        ["apis", group] if *group == GROUP && method == Method::GET => discovery(shared),
        ["apis", "events.k8s.io", "v1", "namespaces", ns, "events"] if method == Method::POST => {
            create_event(shared, ns, body)
        }
        [
            "apis",
            "events.k8s.io",
            "v1",
            "namespaces",
            ns,
            "events",
            name,
        ] if method == Method::PATCH => patch_event(shared, ns, name, &body),
        ["apis", group, version, rest @ ..] if *group == GROUP => {
            let served = shared
                .store
                .lock()
                .unwrap()
                .served
                .iter()
                .any(|v| v == version);
            if !served {
                return path_not_found();
            }
            resource(shared, &method, version, rest, &query, body).await
        }
        _ => path_not_found(),
    }
}

fn discovery(shared: &Shared) -> Response<Body> {
    let served = shared.store.lock().unwrap().served.clone();
    let Some(first) = served.first() else {
        return path_not_found();
    };
    let versions: Vec<Value> = served
        .iter()
        .map(|v| json!({"groupVersion": format!("{GROUP}/{v}"), "version": v}))
        .collect();
    respond(
        200,
        &json!({
            "kind": "APIGroup", "apiVersion": "v1", "name": GROUP, "versions": versions,
            "preferredVersion": {"groupVersion": format!("{GROUP}/{first}"), "version": first},
        }),
    )
}

fn get(shared: &Shared, plural: &str, namespace: &str, name: &str) -> Response<Body> {
    let store = shared.store.lock().unwrap();
    match store
        .objects
        .get(&(plural.to_owned(), namespace.to_owned(), name.to_owned()))
    {
        Some(object) => respond(200, object),
        None => not_found(plural, name),
    }
}

async fn resource(
    shared: &Arc<Shared>,
    method: &Method,
    version: &str,
    rest: &[&str],
    query: &str,
    body: Value,
) -> Response<Body> {
    match rest {
        ["namespaces", ns, "resourceclaims", name] if *method == Method::GET => {
            get(shared, "resourceclaims", ns, name)
        }
        ["resourceclaims"] if *method == Method::GET => list_claims(shared, version),
        ["resourceslices"] if *method == Method::GET => {
            if matches!(query_param(query, "watch").as_deref(), Some("true" | "1")) {
                watch_slices(shared, version, query)
            } else {
                list_slices(shared, version, query)
            }
        }
        ["resourceslices"] if *method == Method::POST => create_slice(shared, version, body),
        ["resourceslices"] if *method == Method::DELETE => {
            let mut store = shared.store.lock().unwrap();
            let keys: Vec<_> = store
                .objects
                .iter()
                .filter(|((p, _, _), o)| p == "resourceslices" && selected(o, query))
                .map(|(k, _)| k.clone())
                .collect();
            let items: Vec<Value> = keys
                .iter()
                .filter_map(|k| store.remove(shared, k))
                .collect();
            respond(
                200,
                &json!({"kind": "ResourceSliceList", "apiVersion": format!("{GROUP}/{version}"),
                "metadata": {}, "items": items}),
            )
        }
        ["resourceslices", name] if *method == Method::GET => {
            get(shared, "resourceslices", "", name)
        }
        ["resourceslices", name] if *method == Method::PUT => {
            update_slice(shared, version, name, body)
        }
        ["resourceslices", name] if *method == Method::DELETE => delete_slice(shared, name, &body),
        _ => path_not_found(),
    }
}

/// Every ResourceClaim, of every namespace, in one page.
fn list_claims(shared: &Shared, version: &str) -> Response<Body> {
    let store = shared.store.lock().unwrap();
    let items: Vec<Value> = store
        .objects
        .iter()
        .filter(|((p, _, _), _)| p == "resourceclaims")
        .map(|(_, o)| o.clone())
        .collect();
    respond(
        200,
        &json!({
            "kind": "ResourceClaimList", "apiVersion": format!("{GROUP}/{version}"),
            "metadata": {"resourceVersion": store.rv.to_string()}, "items": items,
        }),
    )
}

fn list_slices(shared: &Shared, version: &str, query: &str) -> Response<Body> {
    let store = shared.store.lock().unwrap();
    let items: Vec<Value> = store
        .objects
        .iter()
        .filter(|((p, _, _), o)| p == "resourceslices" && selected(o, query))
        .map(|(_, o)| o.clone())
        .collect();
    respond(
        200,
        &json!({
            "kind": "ResourceSliceList", "apiVersion": format!("{GROUP}/{version}"),
            "metadata": {"resourceVersion": store.rv.to_string()}, "items": items,
        }),
    )
}

fn watch_slices(shared: &Arc<Shared>, _version: &str, query: &str) -> Response<Body> {
    let from: u64 = query_param(query, "resourceVersion")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let query = query.to_owned();
    // Subscribe under the lock so no event falls between the backlog and the live stream.
    let (backlog, live) = {
        let store = shared.store.lock().unwrap();
        let backlog: Vec<Event> = store.log.iter().filter(|e| e.rv > from).cloned().collect();
        (backlog, shared.events.subscribe())
    };
    let live = futures::stream::unfold(live, |mut rx| async move {
        loop {
            match rx.recv().await {
                Ok(event) => return Some((event, rx)),
                Err(broadcast::error::RecvError::Lagged(_)) => continue,
                Err(broadcast::error::RecvError::Closed) => return None,
            }
        }
    });
    let events = futures::stream::iter(backlog)
        .chain(live)
        .filter(move |e| {
            let keep = plural_of(&e.object) == "resourceslices" && selected(&e.object, &query);
            std::future::ready(keep)
        })
        .map(|e| {
            let line = format!("{}\n", json!({"type": e.kind, "object": e.object}));
            Ok::<_, Infallible>(Frame::data(Bytes::from(line)))
        });
    stream_response(events)
}

fn stream_response(
    frames: impl Stream<Item = Result<Frame<Bytes>, Infallible>> + Send + Sync + 'static,
) -> Response<Body> {
    Response::builder()
        .status(200)
        .header("content-type", "application/json")
        .body(BodyExt::boxed(StreamBody::new(frames)))
        .unwrap()
}

/// Validates a slice as the API server would (with resmgr's checker) and applies the
/// configured dropped fields.
/// `Err` is the 422 message.
fn admit_slice(store: &Store, version: &str, object: &mut Value) -> Result<(), String> {
    // `get_mut`, not indexing: indexing a missing key would insert a null.
    let devices = object
        .get_mut("spec")
        .and_then(|spec| spec.get_mut("devices"))
        .and_then(Value::as_array_mut)
        .into_iter()
        .flatten();
    for device in devices {
        let fields = if version == "v1beta1" {
            device.get_mut("basic")
        } else {
            Some(device)
        };
        if let Some(Value::Object(fields)) = fields {
            for dropped in &store.dropped_device_fields {
                fields.remove(dropped);
            }
            if store.list_attributes_off
                && let Some(Value::Object(attributes)) = fields.get_mut("attributes")
            {
                for value in attributes.values_mut().filter_map(Value::as_object_mut) {
                    for list in ["strings", "ints", "bools", "versions"] {
                        value.remove(list);
                    }
                }
            }
        }
    }
    let mut spec = object["spec"].clone();
    if version == "v1beta1" {
        for device in spec["devices"].as_array_mut().into_iter().flatten() {
            if let Some(Value::Object(basic)) =
                device.as_object_mut().and_then(|d| d.remove("basic"))
            {
                device.as_object_mut().unwrap().extend(basic);
            }
        }
    }
    let spec: k8s_openapi::api::resource::v1::ResourceSliceSpec =
        serde_json::from_value(spec).map_err(|e| e.to_string())?;
    kube_dra::slices::validate::validate_slice_spec(&spec).map_err(|e| e.to_string())
}

/// 1.37's NodeDeclaredFeatureValidator: a slice whose devices map node resources names a Node
/// that declares the feature, or is refused with 403 (its message, word for word). `name` is
/// the slice's, empty for a `generateName`.
fn forbidden_node_allocatable(store: &Store, name: &str, object: &Value) -> Option<Response<Body>> {
    const FEATURE: &str = "DRANodeAllocatableResources";
    if !store.node_declared_features {
        return None;
    }
    let maps = object["spec"]["devices"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|d| {
            d["nodeAllocatableResources"]
                .as_object()
                .is_some_and(|m| !m.is_empty())
        });
    if !maps {
        return None;
    }
    let node = object["spec"]["nodeName"].as_str().unwrap_or_default();
    let key = ("nodes".to_owned(), String::new(), node.to_owned());
    let declares = store.objects.get(&key).is_some_and(|n| {
        n["status"]["declaredFeatures"]
            .as_array()
            .is_some_and(|f| f.iter().any(|f| f == FEATURE))
    });
    (!declares).then(|| {
        status(
            403,
            "Forbidden",
            &format!(
                "resourceslices.resource.k8s.io \"{name}\" is forbidden: node \"{node}\" does not support {FEATURE} feature"
            ),
            json!({"name": name, "group": GROUP, "kind": "resourceslices"}),
        )
    })
}

fn create_slice(shared: &Shared, version: &str, mut object: Value) -> Response<Body> {
    let mut store = shared.store.lock().unwrap();
    if let Err(message) = admit_slice(&store, version, &mut object) {
        return status(422, "Invalid", &message, json!({}));
    }
    let requested = object["metadata"]["name"].as_str().unwrap_or_default();
    if let Some(refused) = forbidden_node_allocatable(&store, requested, &object) {
        return refused;
    }
    let name = match object["metadata"]["name"].as_str() {
        Some(name) => name.to_owned(),
        None => {
            let prefix = object["metadata"]["generateName"]
                .as_str()
                .unwrap_or("")
                .to_owned();
            store.next_name += 1;
            format!("{prefix}x{:04}", store.next_name)
        }
    };
    let key = ("resourceslices".to_owned(), String::new(), name.clone());
    if store.objects.contains_key(&key) {
        return status(
            409,
            "AlreadyExists",
            &format!("resourceslices \"{name}\" already exists"),
            json!({"name": name, "group": GROUP, "kind": "resourceslices"}),
        );
    }
    object["metadata"]["name"] = json!(name);
    object["metadata"]["uid"] = json!(format!("uid-{name}"));
    object["metadata"]["generation"] = json!(1);
    let stored = store.put(shared, "ADDED", key, object);
    respond(201, &stored)
}

fn update_slice(shared: &Shared, version: &str, name: &str, mut object: Value) -> Response<Body> {
    let mut store = shared.store.lock().unwrap();
    let key = ("resourceslices".to_owned(), String::new(), name.to_owned());
    let Some(current) = store.objects.get(&key).cloned() else {
        return not_found("resourceslices", name);
    };
    if object["metadata"]["resourceVersion"] != current["metadata"]["resourceVersion"] {
        return status(
            409,
            "Conflict",
            &format!("resourceslices \"{name}\": the object has been modified"),
            json!({"name": name, "group": GROUP, "kind": "resourceslices"}),
        );
    }
    if let Err(message) = admit_slice(&store, version, &mut object) {
        return status(422, "Invalid", &message, json!({}));
    }
    if let Some(refused) = forbidden_node_allocatable(&store, name, &object) {
        return refused;
    }
    object["metadata"]["uid"] = current["metadata"]["uid"].clone();
    object["metadata"]["generation"] =
        json!(current["metadata"]["generation"].as_i64().unwrap_or(1) + 1);
    let stored = store.put(shared, "MODIFIED", key, object);
    respond(200, &stored)
}

fn delete_slice(shared: &Shared, name: &str, options: &Value) -> Response<Body> {
    let mut store = shared.store.lock().unwrap();
    let key = ("resourceslices".to_owned(), String::new(), name.to_owned());
    let Some(current) = store.objects.get(&key) else {
        return not_found("resourceslices", name);
    };
    let wanted = &options["preconditions"]["resourceVersion"];
    if !wanted.is_null() && *wanted != current["metadata"]["resourceVersion"] {
        return status(
            409,
            "Conflict",
            "precondition failed: resourceVersion",
            json!({"name": name, "group": GROUP, "kind": "resourceslices"}),
        );
    }
    let deleted = store.remove(shared, &key).unwrap();
    respond(200, &deleted)
}

/// What the API server's validation of an `events.k8s.io/v1` Event refuses, for what we post.
fn event_invalid(namespace: &str, event: &Value) -> Option<String> {
    for field in [
        "reportingController",
        "reportingInstance",
        "action",
        "reason",
        "eventTime",
    ] {
        if event[field].as_str().is_none_or(str::is_empty) {
            return Some(format!("{field}: Required value"));
        }
    }
    for (field, max) in [
        ("reportingInstance", 128),
        ("action", 128),
        ("reason", 128),
        ("note", 1024),
    ] {
        if event[field].as_str().is_some_and(|v| v.len() > max) {
            return Some(format!(
                "{field}: Too long: may not be more than {max} bytes"
            ));
        }
    }
    if !matches!(event["type"].as_str(), Some("Normal" | "Warning")) {
        return Some("type: Unsupported value".into());
    }
    if event["regarding"]["namespace"].as_str() != Some(namespace)
        || event["metadata"]["namespace"]
            .as_str()
            .is_some_and(|n| n != namespace)
    {
        return Some("regarding.namespace: does not match event.namespace".into());
    }
    None
}

fn create_event(shared: &Shared, namespace: &str, mut event: Value) -> Response<Body> {
    if let Some(message) = event_invalid(namespace, &event) {
        return status(422, "Invalid", &message, json!({}));
    }
    let mut store = shared.store.lock().unwrap();
    let Some(name) = event["metadata"]["name"].as_str().map(str::to_owned) else {
        return status(422, "Invalid", "metadata.name: Required value", json!({}));
    };
    let key = ("events".to_owned(), namespace.to_owned(), name.clone());
    if store.objects.contains_key(&key) {
        return status(
            409,
            "AlreadyExists",
            &format!("events.events.k8s.io \"{name}\" already exists"),
            json!({"name": name, "group": "events.k8s.io", "kind": "events"}),
        );
    }
    event["apiVersion"] = json!("events.k8s.io/v1");
    event["kind"] = json!("Event");
    event["metadata"]["namespace"] = json!(namespace);
    event["metadata"]["uid"] = json!(format!("uid-{name}"));
    let stored = store.put(shared, "ADDED", key, event);
    respond(201, &stored)
}

fn patch_event(shared: &Shared, namespace: &str, name: &str, patch: &Value) -> Response<Body> {
    let mut store = shared.store.lock().unwrap();
    let key = ("events".to_owned(), namespace.to_owned(), name.to_owned());
    let Some(mut event) = store.objects.get(&key).cloned() else {
        return status(
            404,
            "NotFound",
            &format!("events.events.k8s.io \"{name}\" not found"),
            json!({"name": name, "group": "events.k8s.io", "kind": "events"}),
        );
    };
    merge_patch(&mut event, patch);
    if let Some(message) = event_invalid(namespace, &event) {
        return status(422, "Invalid", &message, json!({}));
    }
    let stored = store.put(shared, "MODIFIED", key, event);
    respond(200, &stored)
}

/// RFC 7386: objects merge key by key, `null` removes, anything else replaces.
fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(patch) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = json!({});
    }
    let Value::Object(fields) = target else {
        return;
    };
    for (key, value) in patch {
        if value.is_null() {
            fields.remove(key);
        } else {
            merge_patch(fields.entry(key.clone()).or_insert(Value::Null), value);
        }
    }
}
