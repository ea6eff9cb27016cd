//! The systemd backend against a STAND-IN for `org.freedesktop.systemd1` on a private bus: a
//! supplement to the real systemd in the guest VM (`tests/vm/checks/55-systemd.sh`), which is
//! where the backend is proven. The stand-in implements the handful of Manager methods cpupoold
//! calls, records every call with its arguments as they arrived on the wire, and "realizes"
//! `AllowedCPUs` into the sandbox's cgroupfs the way systemd would, so the test can check the
//! order and the bytes of what cpupoold asks systemd to do.
//!
//! The expected `AllowedCPUs` bytes are written out by hand from systemd's encoding
//! (`cpu_set_to_dbus`: CPU i is byte i/8, bit i%8), not computed with cpupoold's encoder.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::json;
use zbus::object_server::SignalEmitter;
use zbus::zvariant::{OwnedObjectPath, OwnedValue};

use common::{Daemon, PrivateBus, Varlink};

#[derive(Debug, zbus::DBusError)]
#[zbus(prefix = "org.freedesktop.systemd1")]
enum SdError {
    #[zbus(error)]
    ZBus(zbus::Error),
    UnitExists(String),
    NoSuchUnit(String),
}

/// One recorded call: method, unit, and the properties as `name=value` with `ay` values as hex.
type Call = (String, String, Vec<String>);

#[derive(Default)]
struct Shared {
    calls: Vec<Call>,
    /// Loaded units and their cgroup directory.
    units: BTreeMap<String, PathBuf>,
    jobs: u32,
}

struct StandIn {
    cgroupfs: PathBuf,
    shared: Arc<Mutex<Shared>>,
}

/// A unit's object, for the properties cpupoold reads back: `Slice` and `ControlGroup` (empty
/// while the unit has no cgroup, as systemd shows a unit that does not run).
struct UnitObject {
    name: String,
    cgroupfs: PathBuf,
    shared: Arc<Mutex<Shared>>,
}

impl UnitObject {
    fn slice(&self) -> String {
        if self.name.ends_with(".slice") {
            let parent = StandIn::cgroup_of(&self.name, None);
            return parent
                .rsplit_once('/')
                .map_or("-.slice", |(p, _)| p.rsplit('/').next().unwrap_or("-.slice"))
                .to_owned();
        }
        let s = self.shared.lock().unwrap();
        match s.units.get(&self.name) {
            Some(dir) => dir
                .parent()
                .and_then(|p| p.file_name())
                .and_then(|n| n.to_str())
                .unwrap_or("-.slice")
                .to_owned(),
            None => "system.slice".to_owned(),
        }
    }

    fn control_group(&self) -> String {
        let s = self.shared.lock().unwrap();
        let dir = match s.units.get(&self.name) {
            Some(d) => d.clone(),
            None if ["system.slice", "user.slice", "init.scope"].contains(&self.name.as_str()) => {
                self.cgroupfs.join(&self.name)
            }
            None => return String::new(),
        };
        format!("/{}", dir.strip_prefix(&self.cgroupfs).unwrap().display())
    }
}

macro_rules! unit_interface {
    ($ty:ident, $iface:literal) => {
        struct $ty(UnitObject);
        #[zbus::interface(name = $iface)]
        impl $ty {
            #[zbus(property)]
            fn slice(&self) -> String {
                self.0.slice()
            }
            #[zbus(property)]
            fn control_group(&self) -> String {
                self.0.control_group()
            }
        }
    };
}
unit_interface!(ServiceObject, "org.freedesktop.systemd1.Service");
unit_interface!(ScopeObject, "org.freedesktop.systemd1.Scope");
unit_interface!(SliceObject, "org.freedesktop.systemd1.Slice");

/// A unit's object path, escaped as systemd does.
fn unit_path(name: &str) -> OwnedObjectPath {
    let escaped: String = name
        .bytes()
        .map(|b| if b.is_ascii_alphanumeric() { (b as char).to_string() } else { format!("_{b:02x}") })
        .collect();
    OwnedObjectPath::try_from(format!("/org/freedesktop/systemd1/unit/{escaped}")).unwrap()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Decodes an `ay` CPU mask by the spec, independently of cpupoold: a kernel CPU list.
fn mask_list(bytes: &[u8]) -> String {
    let cpus: Vec<String> =
        (0..bytes.len() * 8).filter(|i| bytes[i / 8] & (1 << (i % 8)) != 0).map(|i| i.to_string()).collect();
    cpus.join(",")
}

fn describe(props: &[(String, OwnedValue)]) -> Vec<String> {
    props
        .iter()
        .map(|(k, v)| match Vec::<u8>::try_from(v.try_clone().unwrap()) {
            Ok(bytes) => format!("{k}={}", hex(&bytes)),
            Err(_) => format!("{k}={v:?}"),
        })
        .collect()
}

impl StandIn {
    /// The cgroup of a unit: slices by systemd's dash hierarchy (`a-b.slice` is in `a.slice`),
    /// other units in their `Slice=` (default system.slice).
    fn cgroup_of(unit: &str, slice: Option<&str>) -> String {
        if unit == "init.scope" {
            return unit.to_owned();
        }
        if let Some(name) = unit.strip_suffix(".slice") {
            let parts: Vec<&str> = name.split('-').collect();
            return (1..=parts.len())
                .map(|n| format!("{}.slice", parts[..n].join("-")))
                .collect::<Vec<_>>()
                .join("/");
        }
        let slice = slice.unwrap_or("system.slice");
        format!("{}/{unit}", StandIn::cgroup_of(slice, None))
    }

    async fn job_done(&self, emitter: &SignalEmitter<'_>, unit: &str) -> OwnedObjectPath {
        let id = {
            let mut s = self.shared.lock().unwrap();
            s.jobs += 1;
            s.jobs
        };
        let job = OwnedObjectPath::try_from(format!("/org/freedesktop/systemd1/job/{id}")).unwrap();
        StandIn::job_removed(emitter, id, job.clone(), unit, "done").await.unwrap();
        job
    }
}

#[zbus::interface(name = "org.freedesktop.systemd1.Manager")]
impl StandIn {
    async fn set_unit_properties(&self, name: String, runtime: bool, properties: Vec<(String, OwnedValue)>) {
        let mut s = self.shared.lock().unwrap();
        s.calls.push(("SetUnitProperties".into(), name.clone(), describe(&properties)));
        assert!(runtime, "cpupoold sets runtime properties only");
        // Realize, as systemd does, when the unit has a cgroup.
        let dir = s
            .units
            .get(&name)
            .cloned()
            .unwrap_or_else(|| self.cgroupfs.join(StandIn::cgroup_of(&name, None)));
        for (k, v) in &properties {
            let file = match k.as_str() {
                "AllowedCPUs" => "cpuset.cpus",
                "AllowedMemoryNodes" => "cpuset.mems",
                _ => continue,
            };
            if dir.is_dir() {
                let bytes = Vec::<u8>::try_from(v.try_clone().unwrap()).unwrap();
                std::fs::write(dir.join(file), format!("{}\n", mask_list(&bytes))).unwrap();
            }
        }
    }

    async fn start_transient_unit(
        &self,
        #[zbus(signal_emitter)] emitter: SignalEmitter<'_>,
        name: String,
        mode: String,
        properties: Vec<(String, OwnedValue)>,
        _aux: Vec<(String, Vec<(String, OwnedValue)>)>,
    ) -> Result<OwnedObjectPath, SdError> {
        let slice = properties
            .iter()
            .find(|(k, _)| k == "Slice")
            .and_then(|(_, v)| String::try_from(v.try_clone().unwrap()).ok());
        {
            let mut s = self.shared.lock().unwrap();
            s.calls.push(("StartTransientUnit".into(), name.clone(), describe(&properties)));
            assert_eq!(mode, "fail");
            if s.units.contains_key(&name) {
                return Err(SdError::UnitExists(format!(
                    "Unit {name} was already loaded or has a fragment file."
                )));
            }
            let dir = self.cgroupfs.join(StandIn::cgroup_of(&name, slice.as_deref()));
            std::fs::create_dir_all(&dir).unwrap();
            s.units.insert(name.clone(), dir);
        }
        Ok(self.job_done(&emitter, &name).await)
    }

    async fn start_unit(
        &self,
        #[zbus(signal_emitter)] emitter: SignalEmitter<'_>,
        name: String,
        _mode: String,
    ) -> OwnedObjectPath {
        self.shared.lock().unwrap().calls.push(("StartUnit".into(), name.clone(), vec![]));
        self.job_done(&emitter, &name).await
    }

    async fn stop_unit(
        &self,
        #[zbus(signal_emitter)] emitter: SignalEmitter<'_>,
        name: String,
        _mode: String,
    ) -> OwnedObjectPath {
        {
            let mut s = self.shared.lock().unwrap();
            s.calls.push(("StopUnit".into(), name.clone(), vec![]));
            if let Some(dir) = s.units.remove(&name) {
                let _ = std::fs::remove_dir_all(dir);
            }
        }
        self.job_done(&emitter, &name).await
    }

    async fn get_unit(&self, name: String) -> Result<OwnedObjectPath, SdError> {
        if name == "lost.service" {
            // A call systemd never answers (as one sent while it re-executes).
            std::future::pending::<()>().await;
        }
        let s = self.shared.lock().unwrap();
        if s.units.contains_key(&name)
            || ["system.slice", "user.slice", "init.scope"].contains(&name.as_str())
        {
            Ok(unit_path(&name))
        } else {
            Err(SdError::NoSuchUnit(format!("Unit {name} not loaded.")))
        }
    }

    /// Loads a unit: its object, with `Slice` and `ControlGroup`, at its path.
    async fn load_unit(
        &self,
        #[zbus(object_server)] server: &zbus::ObjectServer,
        name: String,
    ) -> Result<OwnedObjectPath, SdError> {
        self.shared.lock().unwrap().calls.push(("LoadUnit".into(), name.clone(), vec![]));
        let path = unit_path(&name);
        let object =
            UnitObject { name: name.clone(), cgroupfs: self.cgroupfs.clone(), shared: self.shared.clone() };
        // Already there: `at` says so and keeps the first.
        let _ = match name.rsplit('.').next() {
            Some("service") => server.at(&path, ServiceObject(object)).await,
            Some("scope") => server.at(&path, ScopeObject(object)).await,
            Some("slice") => server.at(&path, SliceObject(object)).await,
            _ => Ok(false),
        };
        Ok(path)
    }

    async fn subscribe(&self) {}

    #[zbus(signal)]
    async fn job_removed(
        emitter: &SignalEmitter<'_>,
        id: u32,
        job: OwnedObjectPath,
        unit: &str,
        result: &str,
    ) -> zbus::Result<()>;

    #[zbus(signal)]
    async fn unit_removed(emitter: &SignalEmitter<'_>, unit: &str, path: OwnedObjectPath)
        -> zbus::Result<()>;

    #[zbus(signal)]
    async fn reloading(emitter: &SignalEmitter<'_>, active: bool) -> zbus::Result<()>;
}

fn calls(shared: &Arc<Mutex<Shared>>, method: &str, unit: &str) -> Vec<Vec<String>> {
    shared
        .lock()
        .unwrap()
        .calls
        .iter()
        .filter(|(m, u, _)| m == method && u == unit)
        .map(|(_, _, p)| p.clone())
        .collect()
}

fn wait_until(what: &str, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + test_support::wait::PATIENCE;
    while !ok() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn standin_systemd1_gets_allowed_cpus_slices_scopes_and_reclaim() {
    let dir = tempfile::tempdir().unwrap();
    let bus = PrivateBus::start(dir.path());
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let shared = Arc::new(Mutex::new(Shared::default()));
    let sb = dir.path().join("sb");
    let standin = StandIn { cgroupfs: sb.join("cgroup"), shared: shared.clone() };
    let conn = rt.block_on(async {
        zbus::connection::Builder::address(bus.address.as_str())
            .unwrap()
            .name("org.freedesktop.systemd1")
            .unwrap()
            .serve_at("/org/freedesktop/systemd1", standin)
            .unwrap()
            .build()
            .await
            .unwrap()
    });

    let d = Daemon::start(dir.path(), &["--bus", "none", "--systemd-bus", &bus.address]);
    assert!(d.logs().contains("through the systemd backend"), "{}", d.logs());

    // The reserved pool (0,4: bits 0 and 4 = 0x11) on the host slices, at run time.
    for host in ["system.slice", "user.slice", "init.scope"] {
        assert_eq!(
            calls(&shared, "SetUnitProperties", host),
            vec![vec!["AllowedCPUs=11".to_owned()], vec!["AllowedMemoryNodes=01".to_owned()]],
            "{host}"
        );
    }
    // Pool slices: transient, the parent first, then their CPUs: cpupool.slice 1-3,5-7 (0xee),
    // dp 1-2,5-6 (0x66), web 3,7 (0x88).
    let order: Vec<String> = shared
        .lock()
        .unwrap()
        .calls
        .iter()
        .filter(|(m, ..)| m == "StartTransientUnit")
        .map(|(_, u, _)| u.clone())
        .collect();
    assert_eq!(order, ["cpupool.slice", "cpupool-dp.slice", "cpupool-web.slice"]);
    assert_eq!(calls(&shared, "SetUnitProperties", "cpupool.slice")[0], ["AllowedCPUs=ee"]);
    assert_eq!(calls(&shared, "SetUnitProperties", "cpupool-dp.slice")[0], ["AllowedCPUs=66"]);
    assert_eq!(calls(&shared, "SetUnitProperties", "cpupool-web.slice")[0], ["AllowedCPUs=88"]);
    // Written by the stand-in, which spells lists out.
    assert_eq!(d.cgroup("cpupool.slice/cpupool-dp.slice/cpuset.cpus").as_deref(), Some("1,2,5,6"));

    // A unit in system.slice cannot run on dp's CPUs (its slice has the reserved ones):
    // refused, naming the slice and its CPUs, and nothing is set on it.
    let mut v = Varlink::connect(&d.varlink);
    let stray = sb.join("cgroup/system.slice/stray.service");
    std::fs::create_dir_all(&stray).unwrap();
    std::fs::write(sb.join("cgroup/system.slice/cpuset.cpus.effective"), "0,4\n").unwrap();
    shared.lock().unwrap().units.insert("stray.service".into(), stray);
    let Err((name, params)) =
        v.call("Assign", json!({ "pool": "dp", "target": "unit:stray.service", "cpus": 2, "id": "stray" }))
    else {
        panic!("a unit outside its pool's slice was accepted")
    };
    assert_eq!(name, "org.cpupool.Manager.TargetOutsidePool", "{params}");
    assert_eq!(
        (params["parent"].as_str(), params["parent_cpus"].as_str()),
        (Some("system.slice"), Some("0,4"))
    );
    assert!(params["hint"].as_str().unwrap().contains("--slice=cpupool-dp.slice"), "{params}");
    assert!(calls(&shared, "SetUnitProperties", "stray.service").is_empty());
    assert_eq!(v.call("ListAssignments", json!({})).unwrap()["assignments"], json!([]));

    // A unit target in its pool's slice gets AllowedCPUs through systemd; releasing it lifts
    // them (an empty array).
    let app = sb.join("cgroup/cpupool.slice/cpupool-dp.slice/app.service");
    std::fs::create_dir_all(&app).unwrap();
    shared.lock().unwrap().units.insert("app.service".into(), app);
    let a = v
        .call(
            "Assign",
            json!({ "pool": "dp", "target": "unit:app.service", "cpus": 2, "id": "app", "reclaim": false }),
        )
        .unwrap();
    assert_eq!(a["assignment"]["cpus"], "1,5");
    assert_eq!(a["assignment"]["reclaim"], false);
    assert_eq!(calls(&shared, "SetUnitProperties", "app.service"), [["AllowedCPUs=22"]]);
    v.call("Release", json!({ "id": "app" })).unwrap();
    assert_eq!(calls(&shared, "SetUnitProperties", "app.service")[1], ["AllowedCPUs="]);

    // Run: the daemon starts a scope in the pool's slice holding the process.
    let mut child = std::process::Command::new("sleep").arg("30").spawn().unwrap();
    let pid = child.id();
    let r = v.call("Run", json!({ "pool": "dp", "pid": pid, "cpus": 2, "id": "run" })).unwrap();
    let target = r["assignment"]["target"].as_str().unwrap().to_owned();
    let scope = target.strip_prefix("unit:").unwrap().to_owned();
    assert!(scope.starts_with(&format!("cpupool-run-{pid}-")) && scope.ends_with(".scope"), "{target}");
    let start = calls(&shared, "StartTransientUnit", &scope);
    assert_eq!(start.len(), 1);
    let props = start[0].join(" ");
    assert!(
        props.contains(r#"Slice=Str("cpupool-dp.slice")"#) || props.contains("cpupool-dp.slice"),
        "{props}"
    );
    // Its own CPUs come after the save, like any assignment's.
    assert!(!props.contains("AllowedCPUs"), "{props}");
    assert_eq!(calls(&shared, "SetUnitProperties", &scope), [["AllowedCPUs=22"]]);
    assert!(props.contains("PIDs="), "{props}");
    assert!(sb.join("cgroup/cpupool.slice/cpupool-dp.slice").join(&scope).is_dir());

    // systemd collects the scope when its process is gone: the assignment is reclaimed.
    let _ = child.kill();
    let _ = child.wait();
    rt.block_on(async {
        shared.lock().unwrap().units.remove(&scope);
        let emitter = SignalEmitter::new(&conn, "/org/freedesktop/systemd1").unwrap();
        let path = OwnedObjectPath::try_from("/org/freedesktop/systemd1/unit/x").unwrap();
        StandIn::unit_removed(&emitter, &scope, path).await.unwrap();
    });
    wait_until("the scope's assignment to be reclaimed", || {
        v.call("ListAssignments", json!({})).unwrap()["assignments"].as_array().unwrap().is_empty()
    });
    assert!(d.logs().contains("reclaimed assignment run"), "{}", d.logs());

    // systemd finished reloading: cpupoold reads back and corrects what differs.
    std::fs::write(sb.join("cgroup/cpupool.slice/cpupool-web.slice/cpuset.cpus"), "0-7\n").unwrap();
    rt.block_on(async {
        let emitter = SignalEmitter::new(&conn, "/org/freedesktop/systemd1").unwrap();
        StandIn::reloading(&emitter, false).await.unwrap();
    });
    wait_until("re-application after the reload", || {
        d.logs().contains("systemd reloaded: state re-applied (1 corrections)")
    });
    assert_eq!(d.cgroup("cpupool.slice/cpupool-web.slice/cpuset.cpus").as_deref(), Some("3,7"));

    // A call systemd never answers does not hang the daemon: the release fails after the call
    // timeout, nothing changes, and it keeps answering.
    let lost = sb.join("cgroup/cpupool.slice/cpupool-dp.slice/lost.service");
    std::fs::create_dir_all(&lost).unwrap();
    shared.lock().unwrap().units.insert("lost.service".into(), lost);
    v.call(
        "Assign",
        json!({ "pool": "dp", "target": "unit:lost.service", "cpus": 2, "id": "lost", "reclaim": false }),
    )
    .unwrap();
    let err = v.call("Release", json!({ "id": "lost" })).unwrap_err();
    assert_eq!(err.0, "org.cpupool.Manager.ApplyFailed", "{err:?}");
    let left = v.call("ListAssignments", json!({})).unwrap();
    assert_eq!(left["assignments"][0]["id"], "lost", "{left}");
    assert!(d.logs().contains("did not answer within"), "{}", d.logs());
    d.stop();
}
