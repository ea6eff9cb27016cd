//! Unit tests: framing limits, argument decoding, the error mapping against the IDL, the
//! authorizer, binding, and the server's handling of bad input on a real engine.

use std::collections::BTreeSet;
use std::io;
use std::path::PathBuf;

use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::methods::{self, Method, MethodError, Params, IDL, INTERFACE};
use super::wire::{FrameReader, MAX_MESSAGE};
use super::*;
use crate::core::state;
use crate::engine::{Engine, EngineError};

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
    let states = [
        state::Error::NoSuchPool { pool: "p".into() },
        state::Error::NoSuchAssignment { id: "a".into() },
        state::Error::InsufficientCapacity { pool: "p".into(), requested: 3, free: 2, unit: "cpus" },
        state::Error::DuplicateId { id: "a".into() },
        state::Error::TargetBusy { target: "pid:1".into(), id: "a".into(), pool: "p".into() },
        state::Error::TargetNotAllowed { target: "unit:system.slice".into(), reason: "r".into() },
        state::Error::TargetOutsidePool {
            target: "cgroup:w/a".into(),
            cpus: "2".into(),
            parent: "w".into(),
            parent_cpus: "0-1".into(),
            hint: "h".into(),
        },
        state::Error::InvalidArgument { arg: "cpus", reason: "r".into() },
        state::Error::ReservedPool { pool: "p".into() },
        state::Error::NotWholeCores { pool: "p".into(), requested: 3 },
        state::Error::PoolExists { pool: "p".into() },
        state::Error::PoolInUse { pool: "p".into(), assignments: 1 },
    ];
    let engines = [
        EngineError::Apply(crate::host::cgroupfs::HostError::Write {
            path: "/x/cpuset.cpus".into(),
            data: "1".into(),
            source: io_err(),
        }),
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
    let mut out: Vec<MethodError> = states.iter().map(methods::state_error).collect();
    out.extend(engines.iter().map(methods::engine_error));
    out.push(methods::access_denied(1000));
    out.push(methods::busy());
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
    let e = EngineError::Apply(crate::host::cgroupfs::HostError::Write {
        path: "/x/cpuset.cpus".into(),
        data: "2-3".into(),
        source: io::Error::from_raw_os_error(16),
    });
    let m = methods::engine_error(&e);
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
    assert!(Method::Assign.mutates() && Method::Release.mutates() && !Method::ListPools.mutates());
}

fn params(v: Value, m: Method) -> Result<Params, MethodError> {
    Params::new(v.as_object().cloned(), methods::arguments(m))
}

#[test]
fn arguments_are_checked() {
    let e = params(json!({ "nme": "x" }), Method::GetPool).err().map(|e| e.parameters);
    assert_eq!(e, Some(json!({ "parameter": "nme" })));
    let p = params(json!({ "name": 3 }), Method::GetPool).unwrap_or_else(|e| panic!("{e:?}"));
    assert_eq!(p.string("name").err().map(|e| e.parameters), Some(json!({ "parameter": "name" })));

    let spec = |v: Value| params(v, Method::Assign).and_then(|p| methods::assign_spec(&p));
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
    let e = r.next().await.err().map(|e| e.kind());
    assert_eq!(e, Some(io::ErrorKind::InvalidData));
    drop(r);
    let _ = writer.await;

    let (mut a, b) = tokio::io::duplex(64);
    let mut r = FrameReader::new(b);
    a.write_all(b"{\"x\"").await.unwrap_or_else(|e| panic!("{e}"));
    drop(a);
    assert_eq!(r.next().await.err().map(|e| e.kind()), Some(io::ErrorKind::UnexpectedEof));
}

#[tokio::test]
async fn bind_replaces_a_stale_socket_and_refuses_a_live_one() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let run = dir.path().join("run");
    let path = socket_path(&run);
    std::fs::create_dir_all(&run).unwrap_or_else(|e| panic!("{e}"));
    drop(std::os::unix::net::UnixListener::bind(&path).unwrap_or_else(|e| panic!("{e}")));
    let l = bind(&run).unwrap_or_else(|e| panic!("{e}"));
    let mode = std::fs::metadata(&path).map(|m| m.permissions().mode() & 0o777).unwrap_or_default();
    assert_eq!(mode, 0o666);
    assert_eq!(bind(&run).err().map(|e| e.kind()), Some(io::ErrorKind::AddrInUse));
    drop(l);
}

const CONFIG: &str = "[pools.sys]\nkind = \"reserved\"\ncpus = \"0,4\"\n\n[pools.web]\nkind = \"shared\"\ncpus = \"1-3,5-7\"\n";

struct Server {
    _dir: tempfile::TempDir,
    path: PathBuf,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
    engine: std::thread::JoinHandle<()>,
}

impl Server {
    async fn start() -> Server {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let etc = dir.path().join("etc/cpupoold");
        std::fs::create_dir_all(&etc).unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(etc.join("config.toml"), CONFIG).unwrap_or_else(|e| panic!("{e}"));
        let sb =
            crate::sandbox::Sandbox::prepare(dir.path(), Some("1x4x2:1")).unwrap_or_else(|e| panic!("{e}"));
        let mut settings = crate::config::load(&sb.config_dirs()).unwrap_or_else(|e| panic!("{e}"));
        sb.confine(&mut settings);
        let backend = crate::host::cgroupfs::CgroupFs::new(sb.cgroupfs(), "/proc");
        let (engine, _) =
            Engine::start(&settings, Box::new(backend), false).unwrap_or_else(|e| panic!("{e}"));
        let (handle, engine) = engine.spawn();
        let listener = bind(&settings.paths.runtime_dir).unwrap_or_else(|e| panic!("{e}"));
        let (tx, rx) = tokio::sync::oneshot::channel();
        let task = tokio::spawn(serve(listener, handle, Authorizer::default(), async {
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
    // An endless message: closed once it passes the limit.
    let mut s = srv.connect().await;
    let junk = vec![b'x'; MAX_MESSAGE + 64 * 1024];
    let _ = s.write_all(&junk).await;
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
