//! A fake Kubernetes API server for the cluster-integration tests: an in-process HTTP/1.1
//! server on 127.0.0.1 that speaks the API server's JSON.
//!
//! - `GET` of a collection (`/api/v1/nodes`, `/api/v1/pods`,
//!   `/api/v1/namespaces/NS/configmaps`) answers a `*List` with `metadata.resourceVersion`,
//!   filtered by `fieldSelector` (`metadata.name=`, `spec.nodeName=`);
//! - with `watch=true` it streams chunked, newline-delimited `{"type":"ADDED","object":{...}}`
//!   events after the `resourceVersion` asked for; a version older than the last
//!   [`Fake::expire`] gets an `ERROR` event carrying a `410 Gone` `Status`, as the API server
//!   sends it; [`Fake::drop_watches`] cuts every open watch mid-stream;
//! - `PATCH` (server-side apply) of `cpupoolnodes/NAME` creates or updates the object, and of
//!   `cpupoolnodes/NAME/status` sets its status (`404` while the object does not exist);
//! - `resource.k8s.io/v1` ResourceSlices and DeviceClasses: see [`slices`];
//! - [`Fake::fail_next`] answers the next matching requests with a `Status` error (401, 409...),
//!   [`Fake::fail_next_watches`] only the watch requests (410 on the watch request itself).
//!
//! - `GET` of a ResourceClaim by namespace and name ([`claims`]).
//!
//! Every request is recorded for the tests to count.
#![allow(dead_code)]

pub mod claims;
mod slices;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{broadcast, watch};

/// One request as the server saw it.
#[derive(Debug, Clone)]
pub struct Request {
    pub method: String,
    pub path: String,
    pub query: BTreeMap<String, String>,
    pub body: String,
}

impl Request {
    pub fn is_watch(&self) -> bool {
        self.query.get("watch").map(String::as_str) == Some("true")
    }
}

/// An injected failure: the next `count` requests with `method` whose path contains `path`.
struct Fault {
    method: String,
    path: String,
    code: u16,
    count: usize,
    /// Only watch requests (`watch=true`), not the lists of the same path.
    watch_only: bool,
}

#[derive(Default)]
struct State {
    rv: u64,
    /// (collection, name) → object. Collections: `nodes`, `pods`, `configmaps`, `cpupoolnodes`.
    objects: BTreeMap<(String, String), Value>,
    /// Every change: (rv, collection, event type, object).
    log: Vec<(u64, String, String, Value)>,
    /// Per collection: watches from a version below this get 410 Gone.
    compacted: BTreeMap<String, u64>,
    requests: Vec<Request>,
    faults: Vec<Fault>,
    /// The `DRAConsumableCapacity` feature gate is off (see [`slices`]).
    consumable_capacity_off: bool,
}

/// The fake server; it runs on a thread of its own until dropped.
pub struct Fake {
    pub port: u16,
    state: Arc<Mutex<State>>,
    events: broadcast::Sender<(u64, String, String, Value)>,
    cut: Arc<watch::Sender<u64>>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Fake {
    pub fn start() -> Fake {
        let std_listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        std_listener.set_nonblocking(true).unwrap();
        let port = std_listener.local_addr().unwrap().port();
        let state = Arc::new(Mutex::new(State { rv: 100, ..State::default() }));
        let (events, _) = broadcast::channel(1024);
        let cut = Arc::new(watch::channel(0u64).0);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let (st, ev, ct) = (state.clone(), events.clone(), cut.clone());
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(async move {
                let listener = TcpListener::from_std(std_listener).unwrap();
                tokio::pin!(stopped);
                loop {
                    tokio::select! {
                        _ = &mut stopped => break,
                        accepted = listener.accept() => {
                            let Ok((sock, _)) = accepted else { continue };
                            // Head and body go out as two writes: without this, Nagle's
                            // algorithm holds the body for the client's delayed ACK (40 ms).
                            let _ = sock.set_nodelay(true);
                            let (st, ev, ct) = (st.clone(), ev.clone(), ct.clone());
                            tokio::spawn(async move { let _ = serve(sock, st, ev, ct).await; });
                        }
                    }
                }
            });
        });
        Fake { port, state, events, cut, stop: Some(stop), thread: Some(thread) }
    }

    /// A kubeconfig pointing at this server, with a bearer token.
    pub fn write_kubeconfig(&self, path: &Path) {
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: http://127.0.0.1:{}\n\
             users:\n- name: tester\n  user:\n    token: test-token\ncontexts:\n- name: fake\n  context:\n    \
             cluster: fake\n    user: tester\ncurrent-context: fake\n",
            self.port
        );
        std::fs::write(path, text).unwrap();
    }

    /// Creates or replaces an object (`metadata.name` set by the caller) and tells the watches.
    pub fn put(&self, collection: &str, mut obj: Value) {
        let mut s = self.state.lock().unwrap();
        s.rv += 1;
        let rv = s.rv;
        obj["metadata"]["resourceVersion"] = json!(rv.to_string());
        let name = obj["metadata"]["name"].as_str().unwrap().to_owned();
        if obj["metadata"].get("uid").is_none() {
            obj["metadata"]["uid"] = json!(format!("uid-{name}"));
        }
        let key = (collection.to_owned(), name);
        let kind = if s.objects.insert(key, obj.clone()).is_some() { "MODIFIED" } else { "ADDED" };
        s.log.push((rv, collection.to_owned(), kind.to_owned(), obj.clone()));
        let _ = self.events.send((rv, collection.to_owned(), kind.to_owned(), obj));
    }

    /// Deletes an object and tells the watches.
    pub fn delete(&self, collection: &str, name: &str) {
        let mut s = self.state.lock().unwrap();
        let Some(mut obj) = s.objects.remove(&(collection.to_owned(), name.to_owned())) else { return };
        s.rv += 1;
        let rv = s.rv;
        obj["metadata"]["resourceVersion"] = json!(rv.to_string());
        s.log.push((rv, collection.to_owned(), "DELETED".to_owned(), obj.clone()));
        let _ = self.events.send((rv, collection.to_owned(), "DELETED".to_owned(), obj));
    }

    /// Cuts every open watch connection mid-stream (no terminating chunk).
    pub fn drop_watches(&self) {
        self.cut.send_modify(|n| *n += 1);
    }

    /// Compacts `collection`'s history: a watch from any version seen so far gets 410 Gone.
    /// Open watches are cut, so the clients come back with their old versions.
    pub fn expire(&self, collection: &str) {
        {
            let mut s = self.state.lock().unwrap();
            let rv = s.rv + 1;
            s.rv = rv;
            s.compacted.insert(collection.to_owned(), rv);
        }
        self.drop_watches();
    }

    /// Answers the next `count` requests with `method` whose path contains `path` with a
    /// `Status` error of `code`.
    pub fn fail_next(&self, method: &str, path: &str, code: u16, count: usize) {
        let f = Fault { method: method.into(), path: path.into(), code, count, watch_only: false };
        self.state.lock().unwrap().faults.push(f);
    }

    /// Answers the next `count` watch requests whose path contains `path` with a `Status`
    /// error of `code`, as the API server answers a watch from a compacted version with an
    /// HTTP 410 (rather than an `ERROR` event in the stream); lists are answered as usual.
    pub fn fail_next_watches(&self, path: &str, code: u16, count: usize) {
        let f = Fault { method: "GET".into(), path: path.into(), code, count, watch_only: true };
        self.state.lock().unwrap().faults.push(f);
    }

    /// Forgets every fault still pending.
    pub fn clear_faults(&self) {
        self.state.lock().unwrap().faults.clear();
    }

    pub fn requests(&self) -> Vec<Request> {
        self.state.lock().unwrap().requests.clone()
    }

    /// How many requests match.
    pub fn count(&self, pred: impl Fn(&Request) -> bool) -> usize {
        self.state.lock().unwrap().requests.iter().filter(|r| pred(r)).count()
    }

    pub fn object(&self, collection: &str, name: &str) -> Option<Value> {
        self.state.lock().unwrap().objects.get(&(collection.to_owned(), name.to_owned())).cloned()
    }

    /// The CpuPoolNode's status, once one was applied.
    pub fn status(&self, node: &str) -> Option<Value> {
        self.object("cpupoolnodes", node).and_then(|o| o.get("status").cloned())
    }
}

impl Drop for Fake {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        self.drop_watches();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Polls `cond` until it holds or `secs` pass; panics with `what` and the last value.
pub fn wait_for<T: std::fmt::Debug>(secs: u64, what: &str, mut cond: impl FnMut() -> Result<T, String>) -> T {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        match cond() {
            Ok(v) => return v,
            Err(last) => {
                assert!(Instant::now() < deadline, "timed out waiting for {what}; last: {last}");
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

/// The condition `type_` of a status: (status, message).
pub fn condition(status: &Value, type_: &str) -> Option<(String, String)> {
    status["conditions"].as_array()?.iter().find(|c| c["type"] == type_).map(|c| {
        (c["status"].as_str().unwrap_or("").to_owned(), c["message"].as_str().unwrap_or("").to_owned())
    })
}

fn status_body(code: u16, message: &str) -> Value {
    let reason = match code {
        401 => "Unauthorized",
        404 => "NotFound",
        409 => "Conflict",
        410 => "Expired",
        _ => "InternalError",
    };
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
           "message": message, "reason": reason, "code": code})
}

fn reason_phrase(code: u16) -> &'static str {
    match code {
        200 => "OK",
        201 => "Created",
        401 => "Unauthorized",
        404 => "Not Found",
        409 => "Conflict",
        410 => "Gone",
        _ => "Error",
    }
}

async fn respond(sock: &mut TcpStream, code: u16, body: &Value) -> std::io::Result<()> {
    let body = body.to_string();
    let head = format!(
        "HTTP/1.1 {code} {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        reason_phrase(code),
        body.len()
    );
    sock.write_all(head.as_bytes()).await?;
    sock.write_all(body.as_bytes()).await
}

/// (collection, kind of its items, namespace) for a collection path.
fn collection(path: &str) -> Option<(&'static str, &'static str)> {
    match path {
        "/api/v1/nodes" => Some(("nodes", "Node")),
        "/api/v1/pods" => Some(("pods", "Pod")),
        p if p.starts_with("/api/v1/namespaces/") && p.ends_with("/configmaps") => {
            Some(("configmaps", "ConfigMap"))
        }
        p => slices::collection(p),
    }
}

fn selected(obj: &Value, query: &BTreeMap<String, String>) -> bool {
    let Some(sel) = query.get("fieldSelector") else { return true };
    sel.split(',').all(|term| match term.split_once('=') {
        Some(("metadata.name", v)) => obj["metadata"]["name"] == v,
        Some(("spec.nodeName", v)) => obj["spec"]["nodeName"] == v,
        Some(("spec.driver", v)) => obj["spec"]["driver"] == v,
        _ => true,
    })
}

fn decode(s: &str) -> String {
    let mut out = Vec::new();
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' if i + 2 < b.len() => {
                let hex = std::str::from_utf8(&b[i + 1..i + 3]).unwrap_or("");
                out.push(u8::from_str_radix(hex, 16).unwrap_or(b'?'));
                i += 3;
                continue;
            }
            b'+' => out.push(b' '),
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

async fn serve(
    sock: TcpStream,
    state: Arc<Mutex<State>>,
    events: broadcast::Sender<(u64, String, String, Value)>,
    cut: Arc<watch::Sender<u64>>,
) -> std::io::Result<()> {
    let mut reader = BufReader::new(sock);
    loop {
        // The request head.
        let mut line = String::new();
        if reader.read_line(&mut line).await? == 0 {
            return Ok(());
        }
        let mut parts = line.split_whitespace();
        let (method, target) = (parts.next().unwrap_or("").to_owned(), parts.next().unwrap_or("").to_owned());
        let mut length = 0usize;
        loop {
            let mut h = String::new();
            if reader.read_line(&mut h).await? == 0 {
                return Ok(());
            }
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            if let Some((k, v)) = h.split_once(':') {
                if k.eq_ignore_ascii_case("content-length") {
                    length = v.trim().parse().unwrap_or(0);
                }
            }
        }
        let mut body = vec![0; length];
        reader.read_exact(&mut body).await?;
        let (path, query) = target.split_once('?').unwrap_or((&target, ""));
        let query: BTreeMap<String, String> = query
            .split('&')
            .filter_map(|kv| kv.split_once('=').map(|(k, v)| (decode(k), decode(v))))
            .collect();
        let req = Request {
            method: method.clone(),
            path: path.to_owned(),
            query,
            body: String::from_utf8_lossy(&body).into(),
        };

        // Injected failures first.
        let fault = {
            let mut s = state.lock().unwrap();
            s.requests.push(req.clone());
            let hit = s.faults.iter_mut().find(|f| {
                f.count > 0
                    && f.method == req.method
                    && req.path.contains(&f.path)
                    && (!f.watch_only || req.is_watch())
            });
            hit.map(|f| {
                f.count -= 1;
                f.code
            })
        };
        let sock = reader.get_mut();
        if let Some(code) = fault {
            respond(sock, code, &status_body(code, &format!("injected {code} for {}", req.path))).await?;
            continue;
        }

        let claim = claims::get(&req, &state.lock().unwrap());
        if let Some((code, body)) = claim {
            respond(sock, code, &body).await?;
            continue;
        }
        if let Some((code, body)) = slices::answer(&req, &state, &events) {
            respond(sock, code, &body).await?;
            continue;
        }
        if req.method == "GET" {
            let Some((coll, kind)) = collection(&req.path) else {
                respond(sock, 404, &status_body(404, "no such collection")).await?;
                continue;
            };
            if req.is_watch() {
                let from: u64 = req.query.get("resourceVersion").and_then(|v| v.parse().ok()).unwrap_or(0);
                return stream_watch(sock, &state, &events, &cut, coll, kind, from, &req).await;
            }
            let (rv, items) = {
                let s = state.lock().unwrap();
                let items: Vec<Value> = s
                    .objects
                    .iter()
                    .filter(|((c, _), o)| c == coll && selected(o, &req.query))
                    .map(|(_, o)| o.clone())
                    .collect();
                (s.rv, items)
            };
            let list = json!({"kind": format!("{kind}List"), "apiVersion": "v1",
                              "metadata": {"resourceVersion": rv.to_string()}, "items": items});
            respond(sock, 200, &list).await?;
            continue;
        }

        if req.method == "PATCH" && req.path.starts_with("/apis/cpupool.io/v1alpha1/cpupoolnodes/") {
            let rest = &req.path["/apis/cpupool.io/v1alpha1/cpupoolnodes/".len()..];
            let (name, sub) = rest.split_once('/').unwrap_or((rest, ""));
            let patch: Value = serde_json::from_str(&req.body).unwrap_or(Value::Null);
            let answer = {
                let mut s = state.lock().unwrap();
                let key = ("cpupoolnodes".to_owned(), name.to_owned());
                match (sub, s.objects.get(&key).cloned()) {
                    ("status", None) => {
                        (404, status_body(404, &format!("cpupoolnodes.cpupool.io \"{name}\" not found")))
                    }
                    ("status", Some(mut obj)) => {
                        obj["status"] = patch["status"].clone();
                        s.rv += 1;
                        obj["metadata"]["resourceVersion"] = json!(s.rv.to_string());
                        s.objects.insert(key, obj.clone());
                        (200, obj)
                    }
                    (_, existing) => {
                        let mut obj =
                            existing.unwrap_or_else(|| json!({"metadata": {"name": name, "uid": "uid-cpn"}}));
                        obj["apiVersion"] = patch["apiVersion"].clone();
                        obj["kind"] = patch["kind"].clone();
                        obj["spec"] = patch["spec"].clone();
                        s.rv += 1;
                        obj["metadata"]["resourceVersion"] = json!(s.rv.to_string());
                        s.objects.insert(key, obj.clone());
                        (200, obj)
                    }
                }
            };
            respond(sock, answer.0, &answer.1).await?;
            continue;
        }
        respond(sock, 404, &status_body(404, "not served by the fake")).await?;
    }
}

#[allow(clippy::too_many_arguments)]
async fn stream_watch(
    sock: &mut TcpStream,
    state: &Arc<Mutex<State>>,
    events: &broadcast::Sender<(u64, String, String, Value)>,
    cut: &Arc<watch::Sender<u64>>,
    coll: &str,
    kind: &str,
    from: u64,
    req: &Request,
) -> std::io::Result<()> {
    let mut cut_rx = cut.subscribe();
    cut_rx.mark_unchanged();
    let mut rx = events.subscribe();
    let (backlog, gone) = {
        let s = state.lock().unwrap();
        let gone = s.compacted.get(coll).is_some_and(|&c| from < c);
        let backlog: Vec<_> = s.log.iter().filter(|(rv, c, _, _)| *rv > from && c == coll).cloned().collect();
        (backlog, gone)
    };
    sock.write_all(
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n",
    )
    .await?;
    let send = |v: Value| {
        let line = format!("{v}\n");
        format!("{:x}\r\n{line}\r\n", line.len())
    };
    if gone {
        let ev = json!({"type": "ERROR", "object": status_body(410, &format!("too old resource version: {from}"))});
        sock.write_all(send(ev).as_bytes()).await?;
        sock.write_all(b"0\r\n\r\n").await?;
        return sock.shutdown().await;
    }
    let with_kind = |mut o: Value| {
        o["kind"] = json!(kind);
        if o.get("apiVersion").is_none() {
            o["apiVersion"] = json!("v1");
        }
        o
    };
    let mut last = from;
    for (rv, _, ty, obj) in backlog {
        if selected(&obj, &req.query) {
            sock.write_all(send(json!({"type": ty, "object": with_kind(obj)})).as_bytes()).await?;
        }
        last = rv;
    }
    sock.flush().await?;
    loop {
        // A cut made before an event was sent wins over that event.
        tokio::select! {
            biased;
            _ = cut_rx.changed() => {
                // A dropped connection: no terminating chunk, the socket just closes.
                return Ok(());
            }
            ev = rx.recv() => match ev {
                Ok((rv, c, ty, obj)) if c == coll && rv > last => {
                    last = rv;
                    if selected(&obj, &req.query) {
                        sock.write_all(send(json!({"type": ty, "object": with_kind(obj)})).as_bytes()).await?;
                        sock.flush().await?;
                    }
                }
                Ok(_) => {}
                Err(_) => return Ok(()),
            }
        }
    }
}
