//! Unit tests: framing limits and buffer sizes, argument decoding, the error mapping against the
//! IDL, the authorizer, binding, the connection budgets (with real peers of other uids), the idle
//! timeout, and the server's handling of bad input on a real engine.

use std::collections::BTreeSet;
use std::io;
use std::path::PathBuf;

use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use cpupool_wire::varlink::params;

use super::methods::{self, Method, MethodError, IDL, INTERFACE};
use super::wire::{FrameError, FrameReader, MAX_MESSAGE};
use super::*;
use crate::core::state;
use crate::engine::{Engine, EngineError};
use cpupool_wire::methods::MethodId;

fn idl_errors() -> BTreeSet<String> {
    IDL.lines()
        .filter_map(|l| l.strip_prefix("error "))
        .filter_map(|l| l.split_whitespace().next())
        .map(|n| format!("{INTERFACE}.{n}"))
        .collect()
}

fn io_err() -> io::Error {
    io::Error::new(io::ErrorKind::PermissionDenied, "denied")
}

/// One value of every error variant (adding a variant breaks the exhaustive matches in
/// `methods`, and this list is where its test goes).
fn every_error() -> Vec<MethodError> {
    let states = state::every_error();
    let engines = [
        EngineError::Apply(crate::host::cgroupfs::HostError::Io(crate::host::IoError::Write {
            path: "/x/cpuset.cpus".into(),
            data: "1".into(),
            source: io_err(),
        })),
        EngineError::Store(crate::host::store::StoreError::Io {
            op: "fsyncing",
            path: "/s".into(),
            source: io_err(),
        }),
        EngineError::Config(Box::new(crate::config::ConfigError::Read {
            file: "/c.toml".into(),
            source: io_err(),
        })),
        EngineError::Stranded("a".into()),
        EngineError::Topology(crate::host::sysfs::SysfsError::Read { path: "/sys".into(), source: io_err() }),
        EngineError::Stopped,
    ];
    let mut out: Vec<MethodError> = states.iter().map(|e| methods::api(e.to_api())).collect();
    out.extend(engines.iter().map(|e| methods::api(e.to_api())));
    out.push(methods::api(crate::api::error::access_denied(1000)));
    out.push(methods::busy());
    out.push(message_too_large(MAX_MESSAGE));
    out
}

#[test]
fn every_error_has_its_own_name_declared_in_the_idl() {
    let errors = every_error();
    let names: BTreeSet<String> = errors.iter().map(|e| e.name.clone()).collect();
    assert_eq!(names.len(), errors.len(), "two errors share a name: {names:?}");
    assert_eq!(names, idl_errors(), "the IDL and the mapping disagree");
}

#[test]
fn error_parameters_match_the_idl_fields() {
    for e in every_error() {
        let short = e.name.rsplit('.').next().unwrap_or_default();
        let line = IDL
            .lines()
            .find(|l| l.starts_with(&format!("error {short} ")))
            .unwrap_or_else(|| panic!("{short} not in the IDL"));
        let fields: BTreeSet<&str> = line
            .split_once('(')
            .map(|(_, f)| f.trim_end_matches(')'))
            .unwrap_or_default()
            .split(',')
            .filter_map(|f| f.split(':').next())
            .map(str::trim)
            .filter(|f| !f.is_empty())
            .collect();
        let got: BTreeSet<&str> =
            e.parameters.as_object().map(|m| m.keys().map(String::as_str).collect()).unwrap_or_default();
        assert_eq!(got, fields, "{short}");
    }
}

#[test]
fn engine_failures_carry_the_cause_chain() {
    let e = EngineError::Apply(crate::host::cgroupfs::HostError::Io(crate::host::IoError::Write {
        path: "/x/cpuset.cpus".into(),
        data: "2-3".into(),
        source: io::Error::from_raw_os_error(16),
    }));
    let m = methods::api(e.to_api());
    let reason = m.parameters["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("writing `2-3` to `/x/cpuset.cpus`") && reason.contains("busy"), "{reason}");
}

#[test]
fn every_idl_method_is_served() {
    for l in IDL.lines().filter_map(|l| l.strip_prefix("method ")) {
        let name = l.split('(').next().unwrap_or_default();
        assert!(Method::parse(&format!("{INTERFACE}.{name}")).is_ok(), "{name}");
    }
}

#[test]
fn unknown_methods_and_interfaces() {
    let name = |r: Result<Method, MethodError>| r.err().map(|e| e.name).unwrap_or_default();
    assert_eq!(name(Method::parse("org.cpupool.Manager.Nope")), "org.varlink.service.MethodNotFound");
    assert_eq!(name(Method::parse("org.varlink.service.Nope")), "org.varlink.service.MethodNotFound");
    assert_eq!(name(Method::parse("org.example.X.Y")), "org.varlink.service.InterfaceNotFound");
    assert_eq!(name(Method::parse("nodot")), "org.varlink.service.InterfaceNotFound");
    let ours = |m: &str| Method::parse(&format!("{INTERFACE}.{m}")).unwrap_or_else(|e| panic!("{e:?}"));
    assert!(ours("Assign").mutates() && ours("Release").mutates() && !ours("ListPools").mutates());
    assert_eq!(ours("Monitor"), Method::Ours(MethodId::Monitor));
}

#[test]
fn arguments_are_checked() {
    let e = methods::decode::<params::GetPool>(json!({ "nme": "x" }).as_object()).err().map(|e| e.parameters);
    assert_eq!(e, Some(json!({ "parameter": "nme" })));
    let e = methods::decode::<params::GetPool>(json!({ "name": 3 }).as_object()).err().map(|e| e.parameters);
    assert_eq!(e, Some(json!({ "parameter": "name" })));
    // A required parameter missing, and one given to a method that takes none, are named too.
    let e = methods::decode::<params::GetPool>(json!({}).as_object()).err().map(|e| e.parameters);
    assert_eq!(e, Some(json!({ "parameter": "name" })));
    let e =
        methods::decode::<params::NoParameters>(json!({ "x": 1 }).as_object()).err().map(|e| e.parameters);
    assert_eq!(e, Some(json!({ "parameter": "x" })));
    let e = methods::decode::<params::Run>(json!({ "pool": "dp", "pid": "1" }).as_object()).err();
    assert_eq!(e.map(|e| e.parameters), Some(json!({ "parameter": "pid" })));

    let spec = |v: Value| {
        methods::decode::<params::Assign>(v.as_object()).and_then(|p| {
            crate::api::args::assign_spec(p.pool, &p.target, p.cpus, p.millicpus, p.id.as_deref())
                .map_err(methods::api)
        })
    };
    let err = |v: Value| spec(v).err().map(|e| (e.name, e.parameters["argument"].clone()));
    let ok = spec(json!({ "pool": "dp", "target": "cgroup:a/b", "cpus": 2, "id": "x" }))
        .unwrap_or_else(|e| panic!("{e:?}"));
    assert_eq!(ok.size, state::Size::Cpus(2));
    assert_eq!(ok.id.as_ref().map(|i| i.as_str()), Some("x"));
    let null_id = spec(json!({ "pool": "dp", "target": "pid:1", "millicpus": 500, "id": null }));
    assert!(matches!(null_id, Ok(s) if s.id.is_none() && s.size == state::Size::Millicpus(500)));
    let inv = || Some(("org.cpupool.Manager.InvalidArgument".to_owned(), json!("cpus")));
    assert_eq!(err(json!({ "pool": "dp", "target": "pid:1" })), inv());
    assert_eq!(err(json!({ "pool": "dp", "target": "pid:1", "cpus": 1, "millicpus": 1 })), inv());
    assert_eq!(err(json!({ "pool": "dp", "target": "pid:1", "cpus": -1 })), inv());
    assert_eq!(
        err(json!({ "pool": "dp", "target": "nope", "cpus": 1 })),
        Some(("org.cpupool.Manager.InvalidArgument".to_owned(), json!("target")))
    );
    assert_eq!(
        err(json!({ "pool": "dp", "target": "pid:1", "cpus": 1, "id": "bad id" })),
        Some(("org.cpupool.Manager.InvalidArgument".to_owned(), json!("id")))
    );
    assert_eq!(
        spec(json!({ "pool": "dp", "target": "pid:1", "cpus": 1.5 })).err().map(|e| e.name),
        Some("org.varlink.service.InvalidParameter".to_owned())
    );
}

#[test]
fn authorizer() {
    let peer = |uid, gid, groups: &[u32]| Peer { uid, gid, groups: groups.to_vec() };
    let none = Authorizer::default();
    assert!(none.allows(&peer(0, 0, &[])));
    assert!(!none.allows(&peer(1000, 1000, &[1000])));
    let admin = Authorizer { admin_gid: Some(42), owner_uid: None, ..Default::default() };
    assert!(admin.allows(&peer(1000, 42, &[])));
    assert!(admin.allows(&peer(1000, 1000, &[7, 42])));
    assert!(!admin.allows(&peer(1000, 1000, &[7])));
    let owner = Authorizer { admin_gid: None, owner_uid: Some(1000), ..Default::default() };
    assert!(owner.allows(&peer(1000, 1000, &[])));
    assert!(!owner.allows(&peer(1001, 1000, &[])));
}

#[tokio::test]
async fn frames_are_split_and_bounded() {
    let (mut a, b) = tokio::io::duplex(1 << 16);
    let mut r = FrameReader::new(b);
    let writer = tokio::spawn(async move {
        a.write_all(b"{\"x\":1}\0{\"y\"").await?;
        a.write_all(b":2}\0").await?;
        a.write_all(&vec![b' '; MAX_MESSAGE + 10]).await?;
        io::Result::Ok(())
    });
    assert_eq!(r.next().await.ok().flatten().as_deref(), Some(&b"{\"x\":1}"[..]));
    assert_eq!(r.next().await.ok().flatten().as_deref(), Some(&b"{\"y\":2}"[..]));
    let e = r.next().await.err();
    assert!(matches!(e, Some(FrameError::TooLong { limit: MAX_MESSAGE })), "{e:?}");
    drop(r);
    let _ = writer.await;

    let (mut a, b) = tokio::io::duplex(64);
    let mut r = FrameReader::new(b);
    a.write_all(b"{\"x\"").await.unwrap_or_else(|e| panic!("{e}"));
    drop(a);
    assert!(matches!(r.next().await, Err(FrameError::Truncated)));
}

/// A message of exactly the limit passes, one byte more does not; the buffer never grows much
/// past the limit, and is given back once the message is taken.
#[tokio::test]
async fn frame_buffers_stay_within_the_limit_and_are_given_back() {
    let limit = 10_000;
    let (mut a, b) = tokio::io::duplex(1 << 16);
    let mut r = FrameReader::with_limit(b, limit);
    let writer = tokio::spawn(async move {
        let mut big = vec![b'a'; limit];
        big.push(0);
        a.write_all(&big).await?;
        // A small call right behind a big one, then a pause (the stream stays open).
        a.write_all(b"{}\0{\"half").await?;
        io::Result::Ok(a)
    });
    let first = r.next().await.ok().flatten().map(|m| m.len());
    assert_eq!(first, Some(limit));
    assert_eq!(r.next().await.ok().flatten().as_deref(), Some(&b"{}"[..]));
    // Only the half call is left: the buffer was shrunk from its peak.
    assert!(r.capacity() <= 2048, "{} bytes kept", r.capacity());
    let mut a = writer.await.unwrap_or_else(|e| panic!("{e}")).unwrap_or_else(|e| panic!("{e}"));
    a.write_all(b"\":1}\0").await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(r.next().await.ok().flatten().as_deref(), Some(&b"{\"half\":1}"[..]));
    assert_eq!(r.capacity(), 0, "an empty buffer is freed");

    let (mut a, b) = tokio::io::duplex(1 << 16);
    let mut r = FrameReader::with_limit(b, limit);
    let writer = tokio::spawn(async move { a.write_all(&vec![b'a'; limit + 1]).await });
    let e = r.next().await.err();
    assert!(matches!(e, Some(FrameError::TooLong { limit: 10_000 })), "{e:?}");
    assert!(r.capacity() <= limit + 1 + 64, "{} bytes for a limit of {limit}", r.capacity());
    drop(r);
    let _ = writer.await;
}

const CONFIG: &str = "[pools.sys]\nkind = \"reserved\"\ncpus = \"0,4\"\n\n[pools.web]\nkind = \"shared\"\ncpus = \"1-3,5-7\"\n";

/// A real engine on a sandbox (1x4x2, [`CONFIG`]) in `dir`, on a thread of its own.
struct Sandboxed {
    handle: Handle,
    engine: std::thread::JoinHandle<()>,
    sandbox: SandboxPaths,
}

struct SandboxPaths {
    settings: crate::config::Settings,
    cgroupfs: PathBuf,
}

fn sandboxed_engine(dir: &std::path::Path) -> Sandboxed {
    test_support::files::write_config(dir, CONFIG);
    let sb = crate::sandbox::Sandbox::prepare(dir, Some("1x4x2:1")).unwrap_or_else(|e| panic!("{e}"));
    let mut settings = crate::config::load(&sb.config_dirs()).unwrap_or_else(|e| panic!("{e}"));
    sb.confine(&mut settings);
    let backend = crate::sim::cgroupfs(sb.cgroupfs(), "/proc");
    let (engine, _) = Engine::start(&settings, Box::new(backend), false).unwrap_or_else(|e| panic!("{e}"));
    let (handle, engine) = engine.spawn().unwrap_or_else(|e| panic!("{e}"));
    Sandboxed { handle, engine, sandbox: SandboxPaths { settings, cgroupfs: sb.cgroupfs() } }
}

struct Server {
    _dir: tempfile::TempDir,
    path: PathBuf,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
    engine: std::thread::JoinHandle<()>,
}

impl Server {
    async fn start() -> Server {
        Server::start_with(Limits::default()).await
    }

    async fn start_with(limits: Limits) -> Server {
        Server::start_authorized(limits, Authorizer::default()).await
    }

    async fn start_authorized(limits: Limits, auth: Authorizer) -> Server {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let Sandboxed { handle, engine, sandbox } = sandboxed_engine(dir.path());
        let settings = sandbox.settings;
        let listener = bind(&settings.paths.runtime_dir).unwrap_or_else(|e| panic!("{e}"));
        let (tx, rx) = tokio::sync::oneshot::channel();
        let task = tokio::spawn(serve_with(listener, handle, auth, limits, async {
            let _ = rx.await;
        }));
        Server { path: socket_path(&settings.paths.runtime_dir), _dir: dir, stop: Some(tx), task, engine }
    }

    async fn connect(&self) -> UnixStream {
        UnixStream::connect(&self.path).await.unwrap_or_else(|e| panic!("{e}"))
    }

    /// Stops the server and checks that the engine can stop too (no handle left behind).
    async fn stop(mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        tokio::time::timeout(std::time::Duration::from_secs(10), self.task)
            .await
            .unwrap_or_else(|e| panic!("serve did not stop: {e}"))
            .unwrap_or_else(|e| panic!("{e}"));
        tokio::task::spawn_blocking(move || self.engine.join())
            .await
            .unwrap_or_else(|e| panic!("{e}"))
            .unwrap_or_else(|_| panic!("engine panicked"));
    }
}

async fn call(s: &mut UnixStream, msg: Value) -> Value {
    let mut bytes = serde_json::to_vec(&msg).unwrap_or_default();
    bytes.push(0);
    s.write_all(&bytes).await.unwrap_or_else(|e| panic!("{e}"));
    read_reply(s).await.unwrap_or_else(|| panic!("no reply to {msg}"))
}

async fn read_reply(s: &mut UnixStream) -> Option<Value> {
    let mut out = Vec::new();
    let mut b = [0u8; 1];
    loop {
        match s.read(&mut b).await {
            Ok(1) if b[0] == 0 => return serde_json::from_slice(&out).ok(),
            Ok(1) => out.push(b[0]),
            _ => return None,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_answers_errors_and_survives_bad_input() {
    let srv = Server::start().await;
    let mut s = srv.connect().await;
    let r = call(&mut s, json!({ "method": "org.cpupool.Manager.Nope" })).await;
    assert_eq!(r["error"], "org.varlink.service.MethodNotFound");
    let r = call(&mut s, json!({ "method": "org.cpupool.Manager.Monitor", "parameters": {} })).await;
    assert_eq!(r["error"], "org.varlink.service.ExpectedMore");
    let r =
        call(&mut s, json!({ "method": "org.cpupool.Manager.GetPool", "parameters": { "name": "nope" } }))
            .await;
    assert_eq!(r, json!({ "error": "org.cpupool.Manager.NoSuchPool", "parameters": { "pool": "nope" } }));
    // Root runs the tests, so use the reserved pool to see a state error through the engine.
    let r = call(
        &mut s,
        json!({ "method": "org.cpupool.Manager.Assign", "parameters": { "pool": "sys", "target": "pid:1", "cpus": 1 } }),
    )
    .await;
    let expected = if nix::unistd::getuid().is_root() { "ReservedPool" } else { "AccessDenied" };
    assert_eq!(r["error"], format!("org.cpupool.Manager.{expected}"));
    let r = call(&mut s, json!({ "method": "org.varlink.service.GetInfo" })).await;
    assert_eq!(r["parameters"]["interfaces"], json!(["org.varlink.service", "org.cpupool.Manager"]));

    // Malformed JSON: the connection is closed, the server lives on.
    s.write_all(b"{not json\0").await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(read_reply(&mut s).await, None);
    // An endless message: answered `MessageTooLarge` and closed once it passes the limit.
    let mut s = srv.connect().await;
    let junk = vec![b'x'; MAX_MESSAGE + 64 * 1024];
    let _ = s.write_all(&junk).await;
    let too_large =
        json!({ "error": "org.cpupool.Manager.MessageTooLarge", "parameters": { "limit": MAX_MESSAGE } });
    assert_eq!(read_reply(&mut s).await, Some(too_large));
    assert_eq!(read_reply(&mut s).await, None);

    // A monitor streams until the server stops; stopping does not wait for it.
    let mut m = srv.connect().await;
    let r = call(&mut m, json!({ "method": "org.cpupool.Manager.Monitor", "more": true })).await;
    assert_eq!(r["continues"], true);
    assert_eq!(r["parameters"]["event"]["change"], "current");
    let mut s = srv.connect().await;
    let r = call(&mut s, json!({ "method": "org.cpupool.Manager.ListPools" })).await;
    assert_eq!(r["parameters"]["pools"].as_array().map(Vec::len), Some(2));
    srv.stop().await;
}

/// The largest legitimate calls (see [`MAX_MESSAGE`]) are read and answered; one byte past the
/// limit is answered `MessageTooLarge` and the connection closes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_largest_legitimate_calls_fit_and_a_larger_one_is_refused() {
    let srv = Server::start().await;
    let envelope = |method: &str, params: Value| {
        let mut b =
            serde_json::to_vec(&json!({ "method": format!("{INTERFACE}.{method}"), "parameters": params }))
                .unwrap_or_default();
        b.push(0);
        b
    };
    // Every CPU named one by one, with the longest pool name.
    let all: Vec<String> = (0..=crate::core::cpuset::MAX_CPU).map(|c| c.to_string()).collect();
    let name = "p".repeat(crate::core::pool::MAX_POOL_NAME);
    let create = envelope("CreatePool", json!({ "name": name, "kind": "shared", "cpus": all.join(",") }));
    // A cgroup path of the longest length in two-byte characters, each escaped as `\u00e9`.
    let component = "\u{e9}".repeat(127);
    let mut path = String::new();
    while path.len() + 1 + component.len() <= state::MAX_CGROUP_PATH {
        path.push_str(&component);
        path.push('/');
    }
    let id = "i".repeat(state::MAX_ID);
    let assign =
        envelope("Assign", json!({ "pool": name, "target": format!("cgroup:{path}"), "cpus": 1, "id": id }));
    let assign = String::from_utf8_lossy(&assign).replace('\u{e9}', "\\u00e9").into_bytes();
    for msg in [&create, &assign] {
        assert!(msg.len() < MAX_MESSAGE, "{} bytes", msg.len());
        let mut s = srv.connect().await;
        s.write_all(msg).await.unwrap_or_else(|e| panic!("{e}"));
        let r = read_reply(&mut s).await.unwrap_or_else(|| panic!("no reply"));
        // Parsed and decided on (this 8-CPU host has no CPU 8191, no such pool): not refused
        // for its size.
        let error = r["error"].as_str().unwrap_or_default();
        assert!(error.starts_with("org.cpupool.Manager.") && !error.ends_with("MessageTooLarge"), "{r}");
        let r = call(&mut s, json!({ "method": "org.varlink.service.GetInfo" })).await;
        assert_eq!(r["parameters"]["product"], "cpupoold", "{r}");
    }
    eprintln!("largest legitimate calls: CreatePool {} bytes, Assign {} bytes", create.len(), assign.len());

    let mut s = srv.connect().await;
    let mut over = vec![b' '; MAX_MESSAGE + 1];
    over.push(0);
    let _ = s.write_all(&over).await;
    let r = read_reply(&mut s).await;
    assert_eq!(r.as_ref().map(|r| r["error"].clone()), Some(json!("org.cpupool.Manager.MessageTooLarge")));
    assert_eq!(read_reply(&mut s).await, None, "the connection is closed");
    srv.stop().await;
}

/// Idle connections and half-sent calls are closed after the idle timeout; a Monitor is not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_and_stalled_calls_are_closed_but_monitors_stay() {
    let limits = Limits { idle_timeout: std::time::Duration::from_millis(300), ..Limits::default() };
    let srv = Server::start_with(limits).await;
    let mut m = srv.connect().await;
    let r = call(&mut m, json!({ "method": "org.cpupool.Manager.Monitor", "more": true })).await;
    assert_eq!(r["continues"], true);
    let r = read_reply(&mut m).await.unwrap_or_default();
    assert_eq!(r["continues"], true, "{r}");

    let mut idle = srv.connect().await;
    let r = call(&mut idle, json!({ "method": "org.varlink.service.GetInfo" })).await;
    assert_eq!(r["parameters"]["product"], "cpupoold");
    let mut never = srv.connect().await;
    let mut stalled = srv.connect().await;
    stalled.write_all(b"{\"method\":\"org.varlink.").await.unwrap_or_else(|e| panic!("{e}"));
    // The server closes them; a generous bound only keeps a broken server from hanging the test.
    async fn closed(s: &mut UnixStream) -> Result<Option<Value>, tokio::time::error::Elapsed> {
        tokio::time::timeout(std::time::Duration::from_secs(30), read_reply(s)).await
    }
    assert_eq!(closed(&mut idle).await.ok(), Some(None), "idle after a call");
    assert_eq!(closed(&mut never).await.ok(), Some(None), "never called");
    assert_eq!(closed(&mut stalled).await.ok(), Some(None), "half a call");

    // The monitor outlived the idle timeout: it still streams.
    test_support::files::make_dirs(&srv._dir.path().join("cgroup/idle-test"));
    let mut s = srv.connect().await;
    let assign = json!({ "pool": "web", "target": "cgroup:idle-test", "millicpus": 100, "id": "idle-test" });
    let r = call(&mut s, json!({ "method": "org.cpupool.Manager.Assign", "parameters": assign })).await;
    assert!(r.get("error").is_none(), "{r}");
    let r = read_reply(&mut m).await.unwrap_or_default();
    assert_eq!(r["parameters"]["event"]["id"], "idle-test", "{r}");
    srv.stop().await;
}

/// A `varlink_peer.py` run as `uid` (gid the same, no supplementary groups) with `args`: the
/// child (holding its connections until its stdin closes) and its report.
fn peer_as(uid: u32, args: &[&str]) -> (std::process::Child, Value) {
    peer_as_ids(uid, uid, args)
}

/// [`peer_as`] with primary group `gid`.
fn peer_as_ids(uid: u32, gid: u32, args: &[&str]) -> (std::process::Child, Value) {
    let (child, line) = test_support::peer::varlink_peer_as(uid, gid, args);
    let report = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line:?}"));
    (child, report)
}

/// Lets other uids reach the server's socket.
fn open_dirs(path: &std::path::Path) {
    test_support::files::open_to_others(path);
}

/// Real unprivileged peers (uids 65534 and 65533, through `setpriv`) hold connections: each uid
/// gets at most `per_uid`, all together at most `unprivileged`, the rest are answered `Busy`;
/// root and the admin group still have their own room, and a closed connection's place is
/// given back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unprivileged_peers_share_a_small_budget_and_root_keeps_its_room() {
    if !nix::unistd::getuid().is_root() {
        eprintln!("SKIPPED: needs root to run peers as other uids");
        return;
    }
    let limits = Limits { privileged: 3, unprivileged: 3, per_uid: 2, ..Limits::default() };
    let admin_gid = 4242;
    let srv =
        Server::start_authorized(limits, Authorizer { admin_gid: Some(admin_gid), ..Default::default() })
            .await;
    open_dirs(&srv.path);
    let sock = srv.path.display().to_string();
    let hold = |uid: u32, n: &'static str| {
        let sock = sock.clone();
        tokio::task::spawn_blocking(move || peer_as(uid, &[&sock, n, "hold"]))
    };
    let (mut a, ra) = hold(65534, "3").await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!((ra["ok"].clone(), ra["busy"].clone()), (json!(2), json!(1)), "uid 65534: {ra}");
    let (mut b, rb) = hold(65533, "3").await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!((rb["ok"].clone(), rb["busy"].clone()), (json!(1), json!(2)), "uid 65533: {rb}");
    // A member of the admin group: privileged room, whatever the others hold.
    let sock2 = sock.clone();
    let admin = tokio::task::spawn_blocking(move || peer_as_ids(65530, admin_gid, &[&sock2, "1", "hold"]));
    let (mut admin, radmin) = admin.await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(radmin["ok"], 1, "the admin group: {radmin}");
    // Root: the two connections left, whatever the others hold.
    let mut r1 = srv.connect().await;
    let mut r2 = srv.connect().await;
    for r in [&mut r1, &mut r2] {
        let reply = call(r, json!({ "method": "org.varlink.service.GetInfo" })).await;
        assert_eq!(reply["parameters"]["product"], "cpupoold", "{reply}");
    }
    let mut r3 = srv.connect().await;
    // Refused at accept: the call may meet a closed socket, the answer is there all the same.
    let _ = r3.write_all(b"{\"method\":\"org.varlink.service.GetInfo\"}\0").await;
    let reply = read_reply(&mut r3).await.unwrap_or_default();
    assert_eq!(reply["error"], "org.cpupool.Manager.Busy", "{reply}");

    // 65534 lets go: its places are given back, which a third uid sees once the server has
    // noticed the hang-ups.
    drop(a.stdin.take());
    let _ = tokio::task::spawn_blocking(move || a.wait()).await;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let (mut c, rc) = hold(65532, "1").await.unwrap_or_else(|e| panic!("{e}"));
        drop(c.stdin.take());
        let _ = tokio::task::spawn_blocking(move || c.wait()).await;
        if rc["ok"] == 1 {
            break;
        }
        assert_eq!(rc["busy"], 1, "{rc}");
        assert!(std::time::Instant::now() < deadline, "the places of a closed peer were never given back");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    drop(b.stdin.take());
    drop(admin.stdin.take());
    let _ = tokio::task::spawn_blocking(move || (b.wait(), admin.wait())).await;
    srv.stop().await;
}

/// `ListAssignments` and `ListPools` are encoded once per snapshot: every caller of a snapshot,
/// concurrent or not, gets the same buffer (64 callers of a 1 MB list used to build 64 replies),
/// holding exactly what the reply built from the snapshot says; the next snapshot gets its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_replies_are_encoded_once_per_snapshot_and_follow_changes() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let Sandboxed { handle, engine, sandbox } = sandboxed_engine(dir.path());
    let assign = |id: &str| {
        std::fs::create_dir_all(sandbox.cgroupfs.join(id)).unwrap_or_else(|e| panic!("{e}"));
        let target = state::Target::parse(&format!("cgroup:{id}")).unwrap_or_else(|e| panic!("{e}"));
        let id = state::AssignmentId::new(id).unwrap_or_else(|e| panic!("{e}"));
        state::AssignSpec::new("web", target, state::Size::Millicpus(100), Some(id))
    };
    handle.assign(assign("a1")).await.unwrap_or_else(|e| panic!("{e}"));
    let lists = Arc::new(methods::Lists::default());
    let list = |method: MethodId, params: Value| {
        let (handle, lists) = (handle.clone(), lists.clone());
        async move {
            methods::list(method, params.as_object(), &handle.snapshot(), &lists)
                .await
                .unwrap_or_else(|e| panic!("{e:?}"))
        }
    };
    // What the reply is uncached: the parameters the method's handler builds, framed by `Reply`.
    let fresh = |method: MethodId, params: Value| {
        let handle = handle.clone();
        async move {
            let anyone = |_| Ok(());
            let cx = crate::api::handlers::Ctx {
                handle: &handle,
                started: std::time::Instant::now(),
                may_hand_over: &anyone,
            };
            let built =
                methods::call(method, params.as_object(), &cx).await.unwrap_or_else(|e| panic!("{e:?}"));
            super::reply(built, false).encode()
        }
    };
    let parsed = |bytes: &[u8]| -> Value {
        let (json, nul) = bytes.split_at(bytes.len().saturating_sub(1));
        assert_eq!(nul, b"\0", "a message ends with its NUL");
        serde_json::from_slice(json).unwrap_or_else(|e| panic!("{e}"))
    };
    let ids = |bytes: &[u8]| -> Vec<String> {
        let v = parsed(bytes);
        let list = v["parameters"]["assignments"].as_array().cloned().unwrap_or_default();
        list.iter().map(|a| a["id"].as_str().unwrap_or_default().to_owned()).collect()
    };

    let callers: Vec<_> = (0..64).map(|_| tokio::spawn(list(MethodId::ListAssignments, json!({})))).collect();
    let mut replies = Vec::new();
    for c in callers {
        replies.push(c.await.unwrap_or_else(|e| panic!("{e}")));
    }
    let first = replies[0].clone();
    assert!(replies.iter().all(|r| Arc::ptr_eq(r, &first)), "every caller of one snapshot shares one reply");
    assert_eq!(parsed(&first), parsed(&fresh(MethodId::ListAssignments, json!({})).await));
    assert_eq!(ids(&first), ["a1"]);
    let pools = list(MethodId::ListPools, json!({})).await;
    assert!(Arc::ptr_eq(&pools, &list(MethodId::ListPools, json!({})).await));
    assert_eq!(parsed(&pools), parsed(&fresh(MethodId::ListPools, json!({})).await));
    // One pool's list is a reply of its own, cached beside the whole one.
    let web = list(MethodId::ListAssignments, json!({ "pool": "web" })).await;
    assert_eq!(ids(&web), ["a1"]);
    assert!(Arc::ptr_eq(&web, &list(MethodId::ListAssignments, json!({ "pool": "web" })).await));
    assert_eq!(ids(&list(MethodId::ListAssignments, json!({ "pool": "sys" })).await), Vec::<String>::new());
    // Refusals are answered as before and leave nothing behind.
    let nope = methods::list(
        MethodId::ListAssignments,
        json!({ "pool": "nope" }).as_object(),
        &handle.snapshot(),
        &lists,
    )
    .await;
    assert_eq!(nope.err().map(|e| e.name), Some("org.cpupool.Manager.NoSuchPool".to_owned()));
    let bad =
        methods::list(MethodId::ListPools, json!({ "x": 1 }).as_object(), &handle.snapshot(), &lists).await;
    assert_eq!(bad.err().map(|e| e.parameters), Some(json!({ "parameter": "x" })));

    // A snapshot published with nothing changed (a drift check that found nothing) keeps them.
    handle.check_drift().await.unwrap_or_else(|e| panic!("{e}"));
    assert!(Arc::ptr_eq(&first, &list(MethodId::ListAssignments, json!({})).await));

    // The reply right after the Assign returns has it, and so does every list of its pool.
    handle.assign(assign("a2")).await.unwrap_or_else(|e| panic!("{e}"));
    let after = list(MethodId::ListAssignments, json!({})).await;
    assert_eq!(ids(&after), ["a1", "a2"]);
    assert_eq!(ids(&list(MethodId::ListAssignments, json!({ "pool": "web" })).await), ["a1", "a2"]);
    assert_eq!(parsed(&after), parsed(&fresh(MethodId::ListAssignments, json!({})).await));
    assert_ne!(
        parsed(&list(MethodId::ListPools, json!({})).await),
        parsed(&pools),
        "web's free capacity changed"
    );
    handle.release("a1").await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(ids(&list(MethodId::ListAssignments, json!({})).await), ["a2"]);
    // The old snapshot's replies are dropped with it: only the callers still hold them.
    assert_eq!(Arc::strong_count(&first), replies.len() + 1);

    drop((handle, lists));
    tokio::task::spawn_blocking(move || engine.join())
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .unwrap_or_else(|_| panic!("engine panicked"));
}
