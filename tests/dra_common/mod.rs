//! What the DRA driver's tests (tests/dra.rs, tests/dra_claims.rs) share: the daemon started
//! as a DRA driver against the fake API server, the kubelet's registration of it, a claim's
//! results and a one-claim prepare, whether the daemon's state records a claim, and where a
//! record of an earlier release and the CDI spec are.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use cpupoold::core::state::{Delta, State, StateData};
use cpupoold::host::store::{Loaded, Store};
use cpupoold::kubernetes::dra::proto::dra as pb;
use serde_json::{json, Value};
use test_support::dra::{self as peer, DraKubelet};

use crate::common::{Daemon, Varlink};
use crate::fake_apiserver::claims::Result as Res;
use crate::fake_apiserver::Fake;

/// The node the daemon runs on, as the fake API server's claims name it.
pub const NODE: &str = "node-a";
/// The claims' namespace.
pub const NS: &str = "team";
/// The driver's name.
pub const DRIVER: &str = "dra.cpupool.io";
/// How long, in seconds, a test waits for the daemon before failing.
pub const WAIT: u64 = 60;

/// The daemon on a simulated host of `shape` with `pools`, serving them through DRA with the
/// fake API server's kubeconfig.
pub fn start_with(dir: &Path, fake: &Fake, shape: &str, pools: &str) -> Daemon {
    fake.write_kubeconfig(&dir.join("kubeconfig"));
    let config = format!(
        "{pools}\n[kubelet]\nenabled = true\n\n[k8s]\nenabled = true\nkubeconfig = \"{}\"\nnode_name = \"{NODE}\"\n",
        dir.join("kubeconfig").display()
    );
    Daemon::start_shaped(dir, shape, Some(&config), &["--bus", "none", "--log-level", "debug"])
}

/// Registers as the kubelet's plugin watcher does, and checks what the driver says of itself.
/// The socket a killed daemon left refuses until the new one binds its own, so a refusal (or
/// no socket yet) is tried again, as the kubelet's reconciler does.
pub async fn register(d: &Daemon) -> DraKubelet {
    let sock = d.sb.join(format!("kubelet/plugins_registry/{DRIVER}-reg.sock"));
    let deadline = Instant::now() + Duration::from_secs(WAIT);
    let k = loop {
        match peer::register(&sock).await {
            Ok(k) => break k,
            Err(_) if Instant::now() < deadline => tokio::time::sleep(Duration::from_millis(50)).await,
            Err(e) => panic!("{e}\n{}", d.logs()),
        }
    };
    assert_eq!(k.info.r#type, "DRAPlugin");
    assert_eq!(k.info.name, DRIVER);
    assert_eq!(k.info.supported_versions, ["v1.DRAPlugin"]);
    assert_eq!(Path::new(&k.info.endpoint), d.sb.join(format!("kubelet/plugins/{DRIVER}/dra.sock")));
    k
}

/// A result of ours on this node: `cpu` CPUs of `device`, for the request `cpus`.
pub fn dp(device: &'static str, cpu: &'static str) -> Res<'static> {
    Res { driver: DRIVER, pool: NODE, device, request: "cpus", cpu: Some(cpu) }
}

/// NodePrepareResources of the one claim `c`: its answer.
pub async fn prepare_one(k: &DraKubelet, c: &pb::Claim) -> pb::NodePrepareResourceResponse {
    let mut r = k.prepare(vec![c.clone()]).await.unwrap_or_else(|e| panic!("{e}"));
    r.claims.remove(&c.uid).unwrap_or_else(|| panic!("no answer for {}", c.uid))
}

/// Where claim `uid`'s record was written by releases before a prepared claim was the
/// engine's state (the engine takes such records in at start).
pub fn record_path(d: &Daemon, uid: &str) -> PathBuf {
    d.sb.join(format!("state/dra/{uid}.json"))
}

/// The state the daemon's files hold (its snapshot and journal, read as a restart reads them).
pub fn saved(d: &Daemon) -> StateData {
    let store = Store::open(&d.sb.join("state")).unwrap_or_else(|e| panic!("{e}"));
    match store.load(|s: &mut State, c: Delta| s.apply(c)).unwrap_or_else(|e| panic!("{e}")) {
        Loaded::State(s) => StateData::from(s),
        Loaded::Fresh => panic!("no state in {}", d.sb.display()),
    }
}

/// Whether the daemon's durable state records claim `uid` as prepared.
pub fn recorded(d: &Daemon, uid: &str) -> bool {
    saved(d).claims.contains_key(uid)
}

/// Makes the daemon's state (it is stopped) forget claim `uid` and keep its bookings, as an
/// earlier release's crash between booking a claim and writing its record left it: one
/// record appended to the journal with the store's own append.
pub fn forget_record(sb: &Path, uid: &str) {
    let store = Store::open(&sb.join("state")).unwrap_or_else(|e| panic!("{e}"));
    let next_id = match store.load(|s: &mut State, c: Delta| s.apply(c)).unwrap_or_else(|e| panic!("{e}")) {
        Loaded::State(s) => s.data().next_id,
        Loaded::Fresh => panic!("no state in {}", sb.display()),
    };
    let forget = Delta { forget: vec![uid.to_owned()], next_id, ..Delta::default() };
    store.append(&forget).unwrap_or_else(|e| panic!("{e}"));
}

/// Where claim `uid`'s CDI spec is.
pub fn cdi_path(d: &Daemon, uid: &str) -> PathBuf {
    d.sb.join(format!("run/cdi/cpupoold-{uid}.json"))
}

/// Every assignment, as ListAssignments answers.
pub fn assignments(d: &Daemon) -> Vec<Value> {
    let mut v = Varlink::connect(&d.varlink);
    let r = v.call("ListAssignments", json!({})).unwrap_or_else(|e| panic!("{e:?}"));
    r["assignments"].as_array().cloned().unwrap_or_default()
}
