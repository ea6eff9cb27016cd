//! The systemd backend: on a host where systemd is PID 1 the slices and units are systemd's, so
//! their CPUs are set through `org.freedesktop.systemd1` (`SetUnitProperties` with
//! `AllowedCPUs`, `AllowedMemoryNodes`, `CPUQuotaPerSecUSec`; runtime only, so a reboot
//! starts clean), never by writing their `cpuset.cpus` behind systemd's back. Pool slices are
//! transient units (`StartTransientUnit`): they survive a cpupoold restart and a systemd
//! re-exec, vanish at reboot, and cpupoold creates them again when it starts.
//!
//! What systemd does not manage goes to the cgroupfs backend: `cpuset.cpus.partition`,
//! `cpuset.cpus.exclusive`, cgroups that are not units (inside a delegated subtree), and
//! process affinity.
//!
//! The engine runs on its own thread; each call here blocks on the runtime handle given at
//! connection time. Jobs (starting and stopping slices) are waited for through `JobRemoved`,
//! and each `AllowedCPUs` change until systemd has written the cgroup, since partitions are
//! written right after and must see the new CPUs.

use std::time::{Duration, Instant};

use futures_util::StreamExt;
use zbus::zvariant::{OwnedObjectPath, Value};

use super::bus::Bus;
use super::cgroupfs::{CgroupFs, HostError};
use super::{Backend, Observed};
use crate::core::cpuset::CpuSet;
use crate::core::plan::{Effect, Key};
use crate::core::state::CgroupPath;

/// How long a job or a cgroup write may take before it counts as failed.
const JOB_TIMEOUT: Duration = Duration::from_secs(10);
/// How long systemd may take to write a cgroup after accepting `AllowedCPUs` (it realizes
/// cgroups from its event loop, within milliseconds); bounded so a reconcile over many units
/// stays well inside the watchdog's 30 s.
const REALIZE_TIMEOUT: Duration = Duration::from_secs(2);
/// How long one call may take. systemd answers in milliseconds; a call lost while it
/// re-executes would otherwise never be answered, and the engine thread must never hang (the
/// watchdog would kill the daemon).
const CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// After a call timed out, calls fail at once for this long, so a reconcile over many units
/// does not wait out one timeout per unit while systemd is away.
const BACKOFF: Duration = Duration::from_secs(10);

pub use proxies::*;

/// The systemd1 interfaces (the parts cpupoold uses), from org.freedesktop.systemd1(5). The
/// proxy macro generates items that cannot carry docs of their own.
#[allow(missing_docs)]
mod proxies {
    use zbus::zvariant::{OwnedObjectPath, Value};

    /// The systemd manager interface (the part cpupoold uses), from
    /// org.freedesktop.systemd1(5).
    #[zbus::proxy(
        interface = "org.freedesktop.systemd1.Manager",
        default_service = "org.freedesktop.systemd1",
        default_path = "/org/freedesktop/systemd1",
        gen_blocking = false
    )]
    pub trait Manager {
        /// `SetUnitProperties(in s name, in b runtime, in a(sv) properties)`.
        fn set_unit_properties(
            &self,
            name: &str,
            runtime: bool,
            properties: &[(&str, Value<'_>)],
        ) -> zbus::Result<()>;

        /// `StartTransientUnit(in s name, in s mode, in a(sv) properties, in a(sa(sv)) aux, out o job)`.
        fn start_transient_unit(
            &self,
            name: &str,
            mode: &str,
            properties: &[(&str, Value<'_>)],
            aux: &[(&str, Vec<(&str, Value<'_>)>)],
        ) -> zbus::Result<OwnedObjectPath>;

        /// `StartUnit(in s name, in s mode, out o job)`.
        fn start_unit(&self, name: &str, mode: &str) -> zbus::Result<OwnedObjectPath>;

        /// `StopUnit(in s name, in s mode, out o job)`.
        fn stop_unit(&self, name: &str, mode: &str) -> zbus::Result<OwnedObjectPath>;

        /// `GetUnit(in s name, out o unit)`: fails with NoSuchUnit when it is not loaded.
        fn get_unit(&self, name: &str) -> zbus::Result<OwnedObjectPath>;

        /// Loads a unit (if it is not) and returns its object path.
        fn load_unit(&self, name: &str) -> zbus::Result<OwnedObjectPath>;

        /// `Subscribe()`: ask for the unit and job signals.
        fn subscribe(&self) -> zbus::Result<()>;

        /// A job finished: `JobRemoved(u id, o job, s unit, s result)`.
        #[zbus(signal)]
        fn job_removed(
            &self,
            id: u32,
            job: OwnedObjectPath,
            unit: String,
            result: String,
        ) -> zbus::Result<()>;

        /// A unit was unloaded: `UnitRemoved(s unit, o path)`.
        #[zbus(signal)]
        fn unit_removed(&self, unit: String, path: OwnedObjectPath) -> zbus::Result<()>;

        /// systemd starts (`true`) or finished (`false`) reloading or re-executing.
        #[zbus(signal)]
        fn reloading(&self, active: bool) -> zbus::Result<()>;
    }

    /// The `org.freedesktop.systemd1.Unit` properties cpupoold reads.
    #[zbus::proxy(
        interface = "org.freedesktop.systemd1.Unit",
        default_service = "org.freedesktop.systemd1",
        gen_blocking = false
    )]
    pub trait Unit {
        /// `active`, `inactive`, `failed`, `activating`, `deactivating`, `reloading`.
        #[zbus(property)]
        fn active_state(&self) -> zbus::Result<String>;
    }
}

/// The unit-type interface that carries a unit's cgroup properties (`AllowedCPUs`, ...).
pub fn cgroup_interface(unit: &str) -> Option<&'static str> {
    Some(match unit.rsplit('.').next()? {
        "slice" => "org.freedesktop.systemd1.Slice",
        "scope" => "org.freedesktop.systemd1.Scope",
        "service" => "org.freedesktop.systemd1.Service",
        "socket" => "org.freedesktop.systemd1.Socket",
        "mount" => "org.freedesktop.systemd1.Mount",
        "swap" => "org.freedesktop.systemd1.Swap",
        _ => return None,
    })
}

/// The unit whose cgroup `path` is, if systemd manages it: every component is a unit name, and
/// the last one names the unit. `system.slice/foo.service` is `foo.service`; a cgroup inside a
/// delegated subtree (`.../foo.service/worker`) is not a unit.
pub fn unit_of(path: &CgroupPath) -> Option<&str> {
    let mut last = None;
    for c in path.as_str().split('/') {
        cgroup_interface(c)?;
        last = Some(c);
    }
    last
}

/// The `AllowedCPUs` / `AllowedMemoryNodes` value: systemd's `ay` mask (see
/// [`CpuSet::to_systemd_mask`]). The empty set is an empty array, which lifts the restriction.
pub fn mask_value(cpus: &CpuSet) -> Value<'static> {
    Value::from(if cpus.is_empty() { Vec::new() } else { cpus.to_systemd_mask() })
}

/// `CPUQuotaPerSecUSec` for `millis` millicpus: 1000 millicpus is one second of CPU time per
/// second; `u64::MAX` (infinity) lifts the limit.
pub fn quota_usec(millis: Option<u64>) -> u64 {
    millis.map_or(u64::MAX, |m| m.saturating_mul(1000).max(1000))
}

/// The systemd backend.
pub struct Systemd {
    fs: CgroupFs,
    conn: zbus::Connection,
    rt: tokio::runtime::Handle,
    /// Calls fail at once until then (see [`BACKOFF`]).
    away_until: std::sync::Mutex<Option<Instant>>,
}

impl Systemd {
    /// Connects to systemd on `bus` (the system bus on a real host). `fs` writes what systemd
    /// does not manage. `rt` runs the D-Bus calls for the engine thread.
    pub async fn connect(bus: &Bus, fs: CgroupFs, rt: tokio::runtime::Handle) -> zbus::Result<Systemd> {
        // Every call on the connection is bounded (the reclaimer's too); the engine's own bound
        // (CALL_TIMEOUT, then BACKOFF) is a little shorter, so it is the one that fires there.
        let conn = bus.builder()?.method_timeout(CALL_TIMEOUT + Duration::from_secs(1)).build().await?;
        let manager = ManagerProxy::new(&conn).await?;
        // Fails early when nothing answers as systemd.
        manager.subscribe().await?;
        Ok(Systemd { fs, conn, rt, away_until: std::sync::Mutex::new(None) })
    }

    /// The connection (for watching units).
    pub fn connection(&self) -> &zbus::Connection {
        &self.conn
    }

    /// Runs `f` for the engine thread, giving up after `limit` (and failing fast for a while
    /// after that).
    fn within<T>(
        &self,
        limit: Duration,
        f: impl std::future::Future<Output = zbus::Result<T>>,
    ) -> zbus::Result<T> {
        let away = |until: &Option<Instant>| until.is_some_and(|t| Instant::now() < t);
        if self.away_until.lock().is_ok_and(|u| away(&u)) {
            return Err(zbus::Error::Failure(
                "systemd did not answer a moment ago; not asking again yet".into(),
            ));
        }
        match self.rt.block_on(async { tokio::time::timeout(limit, f).await }) {
            Ok(r) => r,
            Err(_) => {
                if let Ok(mut u) = self.away_until.lock() {
                    *u = Some(Instant::now() + BACKOFF);
                }
                Err(zbus::Error::Failure(format!("systemd did not answer within {limit:?}")))
            }
        }
    }

    fn block_on<T>(&self, f: impl std::future::Future<Output = zbus::Result<T>>) -> zbus::Result<T> {
        self.within(CALL_TIMEOUT, f)
    }

    fn err(what: String) -> impl FnOnce(zbus::Error) -> HostError {
        move |source| HostError::Systemd { what, source: Box::new(source) }
    }

    /// Sets runtime properties on a unit.
    fn set_properties(&self, unit: &str, props: &[(&str, Value<'_>)], what: String) -> Result<(), HostError> {
        self.block_on(async {
            let m = ManagerProxy::new(&self.conn).await?;
            m.set_unit_properties(unit, true, props).await
        })
        .map_err(Self::err(what))
    }

    /// Whether `unit` is loaded; an error when systemd could not tell.
    fn loaded(&self, unit: &str) -> Result<bool, HostError> {
        let got = self.block_on(async {
            let m = ManagerProxy::new(&self.conn).await?;
            m.get_unit(unit).await
        });
        match got {
            Ok(_) => Ok(true),
            Err(zbus::Error::MethodError(name, _, _))
                if name.as_str() == "org.freedesktop.systemd1.NoSuchUnit" =>
            {
                Ok(false)
            }
            Err(e) => {
                Err(HostError::Systemd { what: format!("asking for unit {unit}"), source: Box::new(e) })
            }
        }
    }

    /// Runs a job-returning call and waits for the job to finish with `done`.
    fn job<F, Fut>(&self, what: String, call: F) -> Result<(), HostError>
    where
        F: FnOnce(ManagerProxy<'static>) -> Fut,
        Fut: std::future::Future<Output = zbus::Result<OwnedObjectPath>>,
    {
        let result = self.within(JOB_TIMEOUT + CALL_TIMEOUT, async {
            let m = ManagerProxy::new(&self.conn).await?;
            // Listen before asking, so the end of a quick job is not missed.
            let mut removed = m.receive_job_removed().await?;
            let job = call(m).await?;
            let wait = async {
                while let Some(sig) = removed.next().await {
                    if let Ok(args) = sig.args() {
                        if args.job == job {
                            return Some(args.result);
                        }
                    }
                }
                None
            };
            Ok::<_, zbus::Error>(tokio::time::timeout(JOB_TIMEOUT, wait).await)
        });
        match result.map_err(Self::err(what.clone()))? {
            Ok(Some(r)) if r == "done" => Ok(()),
            Ok(Some(r)) => Err(HostError::Job { what, result: r }),
            Ok(None) => Err(HostError::Job { what, result: "lost (the bus closed)".into() }),
            Err(_) => Err(HostError::Job { what, result: "not finished in time".into() }),
        }
    }

    /// Starts a transient slice (or the one that exists).
    fn start_slice(&self, unit: &str) -> Result<(), HostError> {
        let what = format!("starting {unit}");
        let desc = format!("cpupoold CPU pool {}", unit.trim_end_matches(".slice"));
        let props: Vec<(&str, Value<'_>)> = vec![("Description", Value::from(desc.as_str()))];
        let started = self
            .job(what.clone(), |m| async move { m.start_transient_unit(unit, "fail", &props, &[]).await });
        match started {
            Err(HostError::Systemd { source, .. }) if matches!(&*source, zbus::Error::MethodError(name, _, _) if name.as_str() == "org.freedesktop.systemd1.UnitExists") =>
            {
                // Loaded already (a slice a unit names, or ours from before): make sure it runs.
                self.job(what, |m| async move { m.start_unit(unit, "replace").await })
            }
            other => other,
        }
    }

    /// Waits until systemd has written `cpus` to the cgroup of `path` (it realizes cgroups from
    /// its event loop, possibly after the call returned).
    fn wait_realized(&self, path: &CgroupPath, cpus: &CpuSet) {
        let deadline = Instant::now() + REALIZE_TIMEOUT;
        while Instant::now() < deadline {
            match self.fs.read_cpus(path) {
                Ok(Some(now)) if &now == cpus => return,
                Ok(None) => return,
                _ => std::thread::sleep(Duration::from_millis(2)),
            }
        }
        log::warn!("systemd has not written `{cpus}` to `{path}/cpuset.cpus` after {REALIZE_TIMEOUT:?}");
    }

    fn set_cpus(&self, unit: &str, cpus: &CpuSet) -> Result<(), HostError> {
        let what = format!("setting AllowedCPUs={cpus} on {unit}");
        self.set_properties(unit, &[("AllowedCPUs", mask_value(cpus))], what)
    }

    /// The properties of unit object `path` under `iface` (its unit-type interface).
    async fn unit_properties(
        &self,
        path: OwnedObjectPath,
        iface: &'static str,
    ) -> zbus::Result<(zbus::fdo::PropertiesProxy<'_>, zbus::names::InterfaceName<'static>)> {
        let props = zbus::fdo::PropertiesProxy::builder(&self.conn)
            .destination("org.freedesktop.systemd1")?
            .path(path)?
            .build()
            .await?;
        let iface = zbus::names::InterfaceName::try_from(iface).map_err(zbus::Error::from)?;
        Ok((props, iface))
    }

    /// AllowedCPUs of a unit, as systemd holds it.
    fn unit_cpus(&self, unit: &str) -> Result<Option<CpuSet>, HostError> {
        let Some(iface) = cgroup_interface(unit) else { return Ok(None) };
        let what = format!("reading AllowedCPUs of {unit}");
        let mask: Option<Vec<u8>> = self
            .block_on(async {
                let m = ManagerProxy::new(&self.conn).await?;
                let Ok(path) = m.get_unit(unit).await else { return Ok(None) };
                let (props, iface) = self.unit_properties(path, iface).await?;
                let v = props.get(iface, "AllowedCPUs").await?;
                Ok(Vec::<u8>::try_from(v).ok())
            })
            .map_err(Self::err(what))?;
        Ok(mask.map(|m| CpuSet::from_systemd_mask(&m).unwrap_or_default()))
    }

    /// A unit's slice (`Slice`) and its cgroup (`ControlGroup`, empty while it does not run),
    /// as systemd holds them; `None` for unit types without a cgroup.
    fn unit_place(&self, unit: &str) -> Result<Option<(String, String)>, HostError> {
        let Some(iface) = cgroup_interface(unit) else { return Ok(None) };
        let what = format!("reading Slice and ControlGroup of {unit}");
        self.block_on(async {
            let m = ManagerProxy::new(&self.conn).await?;
            let path = m.load_unit(unit).await?;
            let (props, iface) = self.unit_properties(path, iface).await?;
            let slice = String::try_from(props.get(iface.clone(), "Slice").await?).unwrap_or_default();
            let cg = String::try_from(props.get(iface, "ControlGroup").await?).unwrap_or_default();
            Ok(Some((slice, cg)))
        })
        .map_err(Self::err(what))
    }
}

/// A cgroup path as systemd prints it (`/system.slice/x.service`, `/` for the root), relative.
fn relative(cg: &str) -> Option<CgroupPath> {
    CgroupPath::new(cg.trim_start_matches('/')).ok()
}

impl Systemd {
    /// Executes one effect (see [`Backend::apply`]).
    fn apply_effect(&self, effect: &Effect) -> Result<(), HostError> {
        match effect {
            Effect::CreateCgroup(path) => match unit_of(path) {
                Some(unit) => self.start_slice(unit),
                None => self.fs.create(path),
            },
            Effect::RemoveCgroup(path) => match unit_of(path) {
                Some(unit) => self.stop_unit_cgroup(unit, path),
                None => self.fs.remove(path),
            },
            Effect::SetCpus { key: Key::Cgroup(path), cpus, optional } => match unit_of(path) {
                Some(unit) => self.set_unit_cgroup_cpus(unit, path, cpus, *optional),
                None => self.fs.apply(effect),
            },
            Effect::SetCpus { key: Key::Unit(unit), cpus, optional } => {
                self.set_unit_cpus(unit, cpus, *optional)
            }
            Effect::SetCpus { key: Key::Pid(_), .. } => self.fs.apply(effect),
            Effect::SetMems { path, mems, optional } => match unit_of(path) {
                Some(unit) => {
                    if (*optional && !self.fs.exists(path)) || self.fs.vanished(path) {
                        return Ok(());
                    }
                    let what = format!("setting AllowedMemoryNodes={mems} on {unit}");
                    self.set_properties(unit, &[("AllowedMemoryNodes", mask_value(mems))], what)
                }
                None => self.fs.apply(effect),
            },
            Effect::SetQuota { key, millis } => self.set_quota(effect, key, *millis),
            // Partitions are not systemd's: written directly.
            Effect::SetPartition { .. } => self.fs.apply(effect),
        }
    }

    /// Stops the unit `unit` whose cgroup is `path`, if it is loaded.
    fn stop_unit_cgroup(&self, unit: &str, path: &CgroupPath) -> Result<(), HostError> {
        // Stopping a slice stops what runs in it: refuse, as rmdir would.
        if self.fs.populated(path) {
            return Err(HostError::Populated { path: self.fs.root().join(path.as_str()) });
        }
        if !self.loaded(unit)? {
            return Ok(());
        }
        self.job(format!("stopping {unit}"), |m| async move { m.stop_unit(unit, "replace").await })
    }

    /// Sets `AllowedCPUs` of the unit `unit` whose cgroup is `path`, and waits until systemd
    /// wrote the cgroup.
    fn set_unit_cgroup_cpus(
        &self,
        unit: &str,
        path: &CgroupPath,
        cpus: &CpuSet,
        optional: bool,
    ) -> Result<(), HostError> {
        // A container's scope that is gone has nothing left to confine: asking systemd would
        // only fail (NoSuchUnit) at every check until it is released.
        if (optional && !self.fs.exists(path)) || self.fs.vanished(path) {
            return Ok(());
        }
        self.set_cpus(unit, cpus)?;
        if cpus.is_empty() && self.fs.populated(path) {
            // systemd's write of "" fails on a populated cgroup (ENOSPC): the cgroup is let
            // go directly, to what its parent has.
            return self.fs.set_cpus(path, cpus);
        }
        self.wait_realized(path, cpus);
        Ok(())
    }

    /// Sets `AllowedCPUs` of the unit `unit` (wherever its cgroup is).
    fn set_unit_cpus(&self, unit: &str, cpus: &CpuSet, optional: bool) -> Result<(), HostError> {
        if optional && !self.loaded(unit)? {
            return Ok(());
        }
        self.set_cpus(unit, cpus)?;
        // A running unit's cgroup is written from systemd's event loop: wait for it, so what
        // is read back next is what systemd made of this call.
        if let Some((_, cg)) = self.unit_place(unit)? {
            if let Some(path) = relative(&cg) {
                self.wait_realized(&path, cpus);
            }
        }
        Ok(())
    }

    /// Sets (or lifts) the CPU time limit of `key` (`effect`); a cgroup that is not a unit is
    /// written directly, a process has none of its own.
    fn set_quota(&self, effect: &Effect, key: &Key, millis: Option<u64>) -> Result<(), HostError> {
        let unit = match key {
            Key::Unit(u) => u.as_str(),
            Key::Cgroup(path) => match unit_of(path) {
                Some(u) => u,
                None => return self.fs.apply(effect),
            },
            Key::Pid(_) => return Ok(()),
        };
        if !self.loaded(unit)? {
            return Ok(());
        }
        let usec = quota_usec(millis);
        let what = match millis {
            Some(m) => format!("setting CPUQuota={}% on {unit}", m / 10),
            None => format!("lifting CPUQuota= of {unit}"),
        };
        self.set_properties(unit, &[("CPUQuotaPerSecUSec", Value::from(usec))], what)
    }
}

impl Backend for Systemd {
    fn name(&self) -> &'static str {
        "systemd"
    }

    fn apply(&self, effect: &Effect) -> Result<(), HostError> {
        let applied = self.apply_effect(effect);
        // What systemd wrote for us, the cgroupfs side's kept reads do not know of.
        self.fs.forget_after(effect);
        applied
    }

    fn refresh(&self) {
        self.fs.forget_reads();
    }

    fn observe(&self, key: &Key) -> Result<Option<Observed>, HostError> {
        match key {
            Key::Unit(unit) => Ok(self.unit_cpus(unit)?.map(|cpus| Observed { cpus, ..Default::default() })),
            other => self.fs.observe(other),
        }
    }

    fn children(&self, top: &CgroupPath) -> Vec<CgroupPath> {
        self.fs.children(top)
    }

    fn enforced(&self, key: &Key) -> Result<Option<CpuSet>, HostError> {
        match key {
            Key::Unit(unit) => match self.unit_place(unit)? {
                Some((_, cg)) => match relative(&cg) {
                    Some(path) => self.fs.effective(&path),
                    None => Ok(None),
                },
                None => Ok(None),
            },
            other => self.fs.enforced(other),
        }
    }

    fn confinement(&self, key: &Key) -> Result<Option<super::Confinement>, HostError> {
        let Key::Unit(unit) = key else { return self.fs.confinement(key) };
        let Some((slice, cg)) = self.unit_place(unit)? else { return Ok(None) };
        // Running: the cgroup it sits in. Not running: the cgroup of its slice, where it will.
        let parent = match relative(&cg) {
            Some(path) => path.ancestors().pop(),
            None => crate::core::state::slice_cgroup(&slice),
        };
        self.fs.nearest(parent.as_ref())
    }

    fn runs_scopes(&self) -> bool {
        true
    }

    fn unit_runs_nothing(&self, unit: &str) -> bool {
        match self.unit_place(unit) {
            Ok(None) => true,
            // systemd names no cgroup for a unit that does not run (or is not loaded).
            Ok(Some((_, cg))) => cg.is_empty() || relative(&cg).is_some_and(|path| self.fs.emptied(&path)),
            Err(_) => false,
        }
    }

    fn partition_status(&self, path: &CgroupPath) -> Option<String> {
        self.fs.partition_status(path)
    }

    fn kept_partition_status(&self, path: &CgroupPath) -> Option<String> {
        self.fs.kept_partition_status(path)
    }

    fn remote_partitions(&self) -> bool {
        self.fs.has_exclusive_file()
    }

    fn vanished(&self, path: &CgroupPath) -> bool {
        self.fs.vanished(path)
    }

    fn kubelet_pods(&self) -> bool {
        self.fs.kubelet_pods()
    }

    fn process_start(&self, pid: u32) -> Option<u64> {
        self.fs.process_start(pid)
    }

    fn start_scope(&self, unit: &str, slice: &str, pid: u32, cpus: &CpuSet) -> Result<(), HostError> {
        let desc = format!("cpupoolctl run in {slice}");
        let mut props: Vec<(&str, Value<'_>)> = vec![
            ("Description", Value::from(desc.as_str())),
            ("Slice", Value::from(slice)),
            ("PIDs", Value::from(vec![pid])),
            // Gone from systemd's tables as soon as it ends, failed or not.
            ("CollectMode", Value::from("inactive-or-failed")),
        ];
        if !cpus.is_empty() {
            props.push(("AllowedCPUs", mask_value(cpus)));
        }
        self.job(format!("starting {unit} in {slice} for process {pid}"), |m| async move {
            m.start_transient_unit(unit, "fail", &props, &[]).await
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cg(s: &str) -> CgroupPath {
        CgroupPath::new(s).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn unit_cgroups_and_delegated_ones() {
        assert_eq!(unit_of(&cg("system.slice")), Some("system.slice"));
        assert_eq!(unit_of(&cg("cpupool.slice/cpupool-dp.slice")), Some("cpupool-dp.slice"));
        assert_eq!(unit_of(&cg("system.slice/foo.service")), Some("foo.service"));
        assert_eq!(unit_of(&cg("init.scope")), Some("init.scope"));
        assert_eq!(
            unit_of(&cg("kubepods.slice/kubepods-pod1.slice/cri-containerd-ab.scope")),
            Some("cri-containerd-ab.scope")
        );
        // Inside a delegated subtree, or not a unit at all: written directly.
        assert_eq!(unit_of(&cg("system.slice/foo.service/worker")), None);
        assert_eq!(unit_of(&cg("kubepods/pod1/ctr")), None);
    }

    #[test]
    fn quota_and_mask_values() {
        assert_eq!(quota_usec(Some(1500)), 1_500_000);
        assert_eq!(quota_usec(Some(250)), 250_000);
        assert_eq!(quota_usec(None), u64::MAX);
        assert_eq!(mask_value(&CpuSet::new()), Value::from(Vec::<u8>::new()));
    }

    /// The body of `SetUnitProperties("cpupool-dp.slice", true, [("AllowedCPUs", <ay>)])` for
    /// CPUs 3-6 and 10, marshalled by hand from the D-Bus specification (little endian):
    /// strings are a u32 length, the bytes and a NUL; a boolean is a u32; an array is a u32
    /// byte length, then padding to its element alignment (8 for a struct), then the elements;
    /// a variant is its signature (u8 length, bytes, NUL) and then the value. The mask is
    /// systemd's `cpu_set_to_dbus` encoding: CPU i is byte i/8, bit i%8.
    #[test]
    fn set_unit_properties_body_matches_the_wire_format() {
        let cpus = CpuSet::parse("3-6,10").unwrap_or_else(|e| panic!("{e}"));
        let props: Vec<(&str, Value<'_>)> = vec![("AllowedCPUs", mask_value(&cpus))];
        let msg = zbus::Message::method_call("/org/freedesktop/systemd1", "SetUnitProperties")
            .and_then(|b| b.interface("org.freedesktop.systemd1.Manager"))
            .and_then(|b| b.destination("org.freedesktop.systemd1"))
            .and_then(|b| b.build(&("cpupool-dp.slice", true, &props)))
            .unwrap_or_else(|e| panic!("{e}"));
        let mut want: Vec<u8> = Vec::new();
        // s "cpupool-dp.slice": length 16, 16 bytes, NUL, pad to 4 (offset 21 -> 24).
        want.extend(16u32.to_le_bytes());
        want.extend(b"cpupool-dp.slice\0");
        want.extend([0, 0, 0]);
        // b true at 24.
        want.extend(1u32.to_le_bytes());
        // a(sv): length at 28; the struct starts at 32, already 8-aligned, so no padding.
        let element: Vec<u8> = [
            &11u32.to_le_bytes()[..],
            b"AllowedCPUs\0",
            // variant signature "ay" (at 48), then the array of 2 bytes (u32 at 52).
            &[2],
            b"ay\0",
            &2u32.to_le_bytes()[..],
            &[0x78, 0x04],
        ]
        .concat();
        want.extend((element.len() as u32).to_le_bytes());
        want.extend(&element);
        let body = msg.body();
        // zvariant shows the body's types as one struct; the header field on the wire is sba(sv).
        assert_eq!(msg.header().signature().to_string(), "(sba(sv))");
        assert_eq!(&body.data()[..], &want[..]);
    }
}
