//! Kernel housekeeping and isolation health: the fourth keeper ([`super::keeper`]).
//!
//! Each pass ([`Keeper::keep`]) reads each isolated pool's partition back through the backend
//! (an `isolated invalid (reason)` partition makes the pool degraded, with the kernel's reason;
//! a change of that is returned as the pool's event), then fits the unbound workqueue and
//! writeback cpumasks to the isolated CPUs *after* the partitions exist, so a kernel that
//! already keeps them off (Linux 6.12 does for isolated partitions) is seen to and left alone.
//! Every write is read back; a difference is reported, never taken as done. Kernel threads that
//! may run on isolated CPUs and that the kernel lets userspace move (not per-CPU) are narrowed to
//! the housekeeping CPUs the same way, on every kernel that leaves them there (none are found on
//! one that moves them itself).
//!
//! The masks and thread affinities found before the first write are remembered in
//! `housekeeping.json` ([`Saved::load`]: a [`crate::host::store::Remembered`] value, with a
//! previous copy, deleted once nothing is remembered) and written back when isolation ends, also
//! when it ended while the daemon was down; at start, a record this daemon could not have
//! written is refused ([`Housekeeping::new`]). Nothing is put back when the daemon stops: the
//! pools stay isolated over a restart.
//!
//! Its timing is the one way it differs from the other keepers: it reads back what the kernel
//! made of the cpuset layout, so it passes after every reconcile, also one that changed no
//! setting (a reapply, partitions moved for the kubelet's pod cgroup), and not after settings
//! that left the layout alone ([`Keeper::reads_layout`]). It joins the engine after start
//! ([`super::Engine::with_housekeeping`]).
//!
//! [`Housekeeping::sample`] runs on the daemon's health tick: it reads the counters
//! ([`crate::host::health`]) and turns the last two samples into rates per isolated CPU.
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Instant;

use super::handle::Reports;
use super::keeper::{Keeper, Scene};
use super::{error_chain, Event};
use crate::config::{ConfigError, Settings};
use crate::core::cpuset::CpuSet;
use crate::core::housekeeping::{self, PoolHealth, Sample};
use crate::core::plan::{self, Partitions};
use crate::core::pool::{Pool, PoolError, PoolKind, PoolName};
use crate::core::state::{CgroupPath, State, Target};
use crate::host::health;
use crate::host::housekeeping::{self as hk, KernelIsolation, Kthreads, Saved, SavedThread};
use crate::host::store::Remembered;

/// Where housekeeping reads and writes.
#[derive(Debug, Clone)]
pub struct Roots {
    /// The kernel's procfs (`/proc`; the sandbox's `DIR/proc`).
    pub procfs: PathBuf,
    /// sysfs.
    pub sysfs: PathBuf,
    /// The cgroup2 root.
    pub cgroup: PathBuf,
    /// The state directory (the saved masks).
    pub state_dir: PathBuf,
    /// The kernel behind them (`paths.kernel`).
    pub kernel: crate::host::kernel::Kernel,
}

/// One mask file as last fitted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MaskReport {
    /// The file, relative to sysfs.
    pub file: &'static str,
    /// What it holds now (read back).
    pub mask: CpuSet,
    /// `kernel` (it keeps isolated CPUs off by itself, or there is nothing to keep off),
    /// `cpupoold` (we narrowed it), or why it could not be fitted.
    pub by: String,
}

/// One isolated pool.
#[derive(Debug, Clone, PartialEq)]
pub struct PoolIsolation {
    /// Its CPUs.
    pub cpus: CpuSet,
    /// Why its CPUs are not isolated partitions as planned: the kernel's reason (`isolated
    /// invalid (...)`) for its slice's or a container's partition, or why there is none.
    pub invalid: Option<String>,
    /// The last interval measured; `None` until two samples exist.
    pub health: Option<PoolHealth>,
}

impl PoolIsolation {
    /// `degraded`, `holds`, `leaks` or `unmeasured`.
    pub fn state(&self) -> &'static str {
        match (&self.invalid, &self.health) {
            (Some(_), _) => "degraded",
            (None, None) => "unmeasured",
            (None, Some(h)) if h.holds() => "holds",
            (None, Some(_)) => "leaks",
        }
    }

    /// One line for people.
    pub fn summary(&self) -> String {
        match (&self.invalid, &self.health) {
            (Some(why), _) => format!("degraded: {why}"),
            (None, None) => "not measured yet".to_owned(),
            (None, Some(h)) => h.summary(),
        }
    }
}

/// Kernel threads as last fitted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KthreadReport {
    /// The isolated CPUs they are kept off.
    pub isolated: CpuSet,
    /// Threads cpupoold narrowed that stay off the isolated CPUs (read back).
    pub moved: usize,
    /// Threads the kernel kept on isolated CPUs after the write (`name (pid)`).
    pub kept: Vec<String>,
    /// Why the threads could not be looked at or recorded; empty when all went well.
    pub problem: Option<String>,
}

impl KthreadReport {
    /// `5 moved off 2-3`, with the threads the kernel kept there; empty without isolation.
    pub fn summary(&self) -> String {
        if self.isolated.is_empty() {
            return String::new();
        }
        let mut s = match self.moved {
            // None found there: the kernel keeps them off itself (6.12 for isolated partitions).
            0 if self.kept.is_empty() => format!("none on {} (the kernel keeps them off)", self.isolated),
            0 => format!("none moved off {}", self.isolated),
            n => format!("{n} moved off {}", self.isolated),
        };
        if !self.kept.is_empty() {
            s.push_str(&format!("; kept there by the kernel: {}", self.kept.join(", ")));
        }
        if let Some(p) = &self.problem {
            s.push_str(&format!("; {p}"));
        }
        s
    }
}

/// What the APIs show of isolation.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct IsolationReport {
    /// The kernel's own isolation.
    pub kernel: KernelIsolation,
    /// CPUs left for interrupts, kernel threads and host slices.
    pub housekeeping: CpuSet,
    /// The workqueue masks.
    pub masks: Vec<MaskReport>,
    /// Kernel threads moved off the isolated CPUs.
    pub kthreads: KthreadReport,
    /// Each isolated pool.
    pub pools: BTreeMap<PoolName, PoolIsolation>,
}

/// Refuses `pools` when the reserved pool, which takes interrupts, kernel threads and host
/// slices, holds only CPUs the kernel keeps from housekeeping: `isolcpus=`/`nohz_full=` on
/// `/proc/cmdline` or as sysfs reports them. (Resolving the pools already refuses a reserved
/// pool of `isolcpus=` domain CPUs; `nohz_full=` alone does not show in the topology.)
pub fn check_housekeeping(settings: &Settings, pools: &[Pool]) -> Result<(), Box<ConfigError>> {
    let p = &settings.paths;
    let off = hk::read_kernel(&p.procfs_root, &p.sysfs_root, &p.cgroup_root).not_housekeeping();
    check_housekeeping_against(settings, pools, &off)
}

fn check_housekeeping_against(
    settings: &Settings,
    pools: &[Pool],
    off: &CpuSet,
) -> Result<(), Box<ConfigError>> {
    for pool in pools.iter().filter(|p| p.kind == PoolKind::Reserved) {
        housekeeping::housekeeping_cpus(&pool.cpus, off).map_err(|e| {
            Box::new(
                settings
                    .pool_error(PoolError::NoHousekeeping { pool: pool.name.clone(), source: Box::new(e) }),
            )
        })?;
    }
    Ok(())
}

/// The housekeeping keeper (module docs).
pub struct Housekeeping {
    roots: Roots,
    saved: Remembered<Saved>,
    last: Option<(Instant, Sample)>,
    report: IsolationReport,
    /// Whether the next pass logs the boot isolation's gaps even if unchanged: at start and
    /// after a reload.
    say_boot: bool,
}

impl Housekeeping {
    /// Housekeeping below `roots`, with the masks and affinities a previous run recorded that
    /// pass [`Housekeeping::check_saved`] against the `host`'s CPUs.
    pub fn new(roots: Roots, host: &CpuSet) -> Housekeeping {
        let saved = Saved::load(&roots.state_dir);
        let mut hk =
            Housekeeping { roots, saved, last: None, report: IsolationReport::default(), say_boot: true };
        hk.check_saved(host);
        hk
    }

    /// Forgets remembered masks and affinities this daemon could not have recorded, with an
    /// error naming the file: a mask must hold the mask in force now (the daemon only ever
    /// narrows the one it remembers, so what is in force lies within it) and no CPU that is
    /// neither the host's (`host`) nor in force; a kernel thread's CPUs must be the host's.
    /// Restoring anything else would write to the kernel what someone else put in the file.
    fn check_saved(&mut self, host: &CpuSet) {
        let path = self.saved.path();
        let mut refused = false;
        for file in [hk::WORKQUEUE_MASK, hk::WRITEBACK_MASK] {
            let Some(text) = self.saved.slot(file).clone() else { continue };
            let now = hk::read_mask(&self.roots.sysfs, file).ok().flatten();
            let why = match housekeeping::parse_mask(&text) {
                Err(e) => Some(e.to_string()),
                Ok(saved) if saved.is_empty() => Some("the mask holds no CPU".to_owned()),
                Ok(saved) => {
                    let known = now.as_ref().map_or_else(|| host.clone(), |n| n.union(host));
                    let outside = saved.difference(&known);
                    match &now {
                        _ if !outside.is_empty() => Some(format!("CPUs {outside} are not CPUs of this host")),
                        Some(now) if !now.is_subset(&saved) => Some(format!(
                            "`{file}` holds CPUs {now} now, more than the remembered CPUs {saved}: cpupoold only \
                             narrows the mask it remembers"
                        )),
                        _ => None,
                    }
                }
            };
            if let Some(why) = why {
                log::error!(
                    "`{}` remembers `{}` for `{file}`, which cpupoold did not record: {why}; it is not restored",
                    path.display(),
                    text.escape_debug()
                );
                *self.saved.slot(file) = None;
                refused = true;
            }
        }
        self.saved.kthreads.retain(|pid, t| {
            let why = match CpuSet::parse(&t.cpus) {
                Err(e) => e.to_string(),
                Ok(cpus) if cpus.is_empty() => "no CPU".to_owned(),
                Ok(cpus) if !cpus.is_subset(host) => format!("CPUs {} are not CPUs of this host", cpus.difference(host)),
                Ok(_) => return true,
            };
            log::error!(
                "`{}` remembers CPUs `{}` for kernel thread {} ({pid}), which cpupoold did not record: {why}; they are not restored",
                path.display(),
                t.cpus.escape_debug(),
                t.comm.escape_debug()
            );
            refused = true;
            false
        });
        if refused {
            self.saved.save_or_log();
        }
    }

    /// Fits one mask file to `isolated`; returns the report, and an error text when the kernel
    /// did not take what was written.
    fn fit(&mut self, file: &'static str, isolated: &CpuSet, bits: u32) -> Option<MaskReport> {
        let sysfs = self.roots.sysfs.clone();
        let report = |mask: CpuSet, by: String| Some(MaskReport { file, mask, by });
        let current = match hk::read_mask(&sysfs, file) {
            Ok(Some(m)) => m,
            Ok(None) => return None,
            Err(e) => return report(CpuSet::new(), format!("unreadable: {}", error_chain(&e))),
        };
        let base = self.saved.slot(file).as_deref().and_then(|t| housekeeping::parse_mask(t).ok());
        let base = base.unwrap_or_else(|| current.clone());
        let narrowed = base.difference(isolated);
        let want = if narrowed.is_empty() { base.clone() } else { narrowed };
        if want == current {
            if isolated.is_empty() && self.saved.slot(file).take().is_some() {
                self.saved.save_or_log();
            }
            let by = if self.saved.slot(file).is_some() { "cpupoold" } else { "kernel" };
            return report(current, by.to_owned());
        }
        // Recorded before the first write, so a crash right after it still restores.
        if self.saved.slot(file).is_none() {
            *self.saved.slot(file) = Some(housekeeping::format_mask(&current, bits));
            if !self.saved.save_or_log() {
                *self.saved.slot(file) = None;
                return report(current, "not narrowed: the previous mask could not be recorded".into());
            }
        }
        if let Err(e) = hk::write_mask(&sysfs, file, &want, bits) {
            log::error!("{}", error_chain(&e));
            return report(current, format!("not narrowed: {}", error_chain(&e)));
        }
        let back = hk::read_mask(&sysfs, file).ok().flatten().unwrap_or_default();
        if back != want {
            log::error!("wrote CPUs {want} to `{file}` but the kernel shows {back}");
            return report(back.clone(), format!("degraded: wrote CPUs {want}, the kernel shows {back}"));
        }
        if isolated.is_empty() {
            log::info!("restored `{file}` to CPUs {want}");
            *self.saved.slot(file) = None;
            self.saved.save_or_log();
            return report(back, "kernel".into());
        }
        log::info!("unbound work off the isolated CPUs: `{file}` now CPUs {want}");
        report(back, "cpupoold".into())
    }

    /// Narrows the movable kernel threads that may run on `isolated` CPUs to `housekeeping`
    /// ones, or gives narrowed threads back what they had (core::housekeeping::
    /// kthread_affinity). What is about to change is recorded durably before the first write;
    /// every write is read back.
    fn fit_kthreads(&mut self, isolated: &CpuSet, housekeeping: &CpuSet) -> KthreadReport {
        let mut report = KthreadReport { isolated: isolated.clone(), ..Default::default() };
        if isolated.is_empty() && self.saved.kthreads.is_empty() {
            // Nothing to keep off and nothing to give back: no walk over every task in /proc at
            // each drift check of a host without isolated pools.
            return report;
        }
        let fs = Kthreads::new(&self.roots.procfs).with_kernel(self.roots.kernel);
        let threads = match fs.movable() {
            Ok(t) => t,
            Err(e) => {
                report.problem = Some(format!("kernel threads not read: {}", error_chain(&e)));
                return report;
            }
        };
        // A remembered thread that is gone (or whose pid now names another) needs nothing back.
        let live: BTreeMap<u32, u64> = threads.iter().map(|t| (t.pid, t.stat.start)).collect();
        let before = self.saved.kthreads.len();
        self.saved.kthreads.retain(|pid, s| live.get(pid) == Some(&s.start));
        let mut dirty = self.saved.kthreads.len() != before;
        let mut wants = Vec::new();
        for t in threads {
            let remembered = self.saved.kthreads.get(&t.pid).and_then(|s| CpuSet::parse(&s.cpus).ok());
            if let Some(want) =
                housekeeping::kthread_affinity(&t.allowed, remembered.as_ref(), isolated, housekeeping)
            {
                if remembered.is_none() {
                    let saved = SavedThread {
                        comm: t.stat.comm.clone(),
                        start: t.stat.start,
                        cpus: t.allowed.to_string(),
                    };
                    self.saved.kthreads.insert(t.pid, saved);
                    dirty = true;
                }
                wants.push((t, want));
            } else if remembered.is_some() && isolated.is_empty() {
                // Already holds what it had.
                self.saved.kthreads.remove(&t.pid);
                dirty = true;
            }
        }
        if dirty && !self.saved.save_or_log() {
            report.problem = Some("not moved: their affinities could not be recorded".into());
            return report;
        }
        self.write_kthreads(&fs, wants, isolated, &mut report);
        report
    }

    /// Writes each kernel thread's wanted CPUs and reads them back: narrowed threads the
    /// kernel keeps on `isolated` CPUs are reported, given-back ones forgotten.
    fn write_kthreads(
        &mut self,
        fs: &Kthreads,
        wants: Vec<(hk::Kthread, CpuSet)>,
        isolated: &CpuSet,
        report: &mut KthreadReport,
    ) {
        let (mut restored, mut forgotten) = (0, false);
        for (t, want) in wants {
            if let Err(e) = fs.set_affinity(&t, &want) {
                // Unchanged, or not ours to give back any more; a failed restore is tried again.
                if hk::refused_or_gone(&e) || !isolated.is_empty() {
                    self.saved.kthreads.remove(&t.pid);
                    forgotten = true;
                }
                if hk::refused_or_gone(&e) {
                    log::debug!("{}", error_chain(&e));
                } else {
                    log::warn!("{}", error_chain(&e));
                    report.problem = Some(error_chain(&e));
                }
                continue;
            }
            let back = fs.read(t.pid).map(|b| b.allowed).unwrap_or_default();
            if isolated.is_empty() {
                self.saved.kthreads.remove(&t.pid);
                restored += 1;
            } else if !back.is_disjoint(isolated) {
                let name = format!("{} ({})", t.stat.comm, t.pid);
                // Said once: the kernel does the same at every check.
                if !self.report.kthreads.kept.contains(&name) {
                    log::warn!(
                        "kernel thread {name} was given CPUs {want} but the kernel keeps it on {back}"
                    );
                }
                report.kept.push(name);
            }
        }
        if restored > 0 {
            log::info!("isolation ended: {restored} kernel thread(s) have their CPUs back");
        }
        if restored > 0 || forgotten {
            self.saved.save_or_log();
        }
        if !isolated.is_empty() {
            let kept = report.kept.len();
            report.moved = self.saved.kthreads.len().saturating_sub(kept);
        }
    }
}

impl Keeper for Housekeeping {
    /// Nothing to take: its roots are the daemon's, given when it joins, and it has no setting;
    /// after a reload (or pool edit) the next pass says the boot isolation's gaps again.
    fn configure(&mut self, _: &Settings) {
        self.say_boot = true;
    }

    /// Reads back partitions and fits the workqueue masks and kernel threads to the isolated
    /// pools; returns the events of the pools whose partition validity changed.
    fn keep(&mut self, scene: &Scene<'_>) -> Vec<Event> {
        let mut events = Vec::new();
        let mut pools = BTreeMap::new();
        let mut isolated = CpuSet::new();
        for p in scene.state.pools().values().filter(|p| p.isolate) {
            let invalid = partition_problem(scene, p);
            let before = self.report.pools.get(&p.name);
            if before.map(|b| &b.invalid) != Some(&invalid) {
                match &invalid {
                    Some(why) => {
                        log::warn!(POOL = p.name.as_str(); "pool {} is degraded: {why}", p.name)
                    }
                    None if before.is_some_and(|b| b.invalid.is_some()) => {
                        log::info!(POOL = p.name.as_str(); "pool {}: its partitions are valid again", p.name)
                    }
                    None => {}
                }
                if before.is_some() || invalid.is_some() {
                    events.push(Event::PoolChanged(p.name.clone()));
                }
            }
            isolated = isolated.union(&p.cpus);
            let health = before.filter(|b| b.cpus == p.cpus).and_then(|b| b.health.clone());
            pools.insert(p.name.clone(), PoolIsolation { cpus: p.cpus.clone(), invalid, health });
        }
        let bits = scene.topo.online().union(scene.topo.offline()).last().map_or(1, |l| l + 1);
        let masks = [hk::WORKQUEUE_MASK, hk::WRITEBACK_MASK]
            .into_iter()
            .filter_map(|f| self.fit(f, &isolated, bits))
            .collect();
        let kernel = hk::read_kernel(&self.roots.procfs, &self.roots.sysfs, &self.roots.cgroup);
        let reserved = scene
            .state
            .pools()
            .values()
            .filter(|p| p.kind == PoolKind::Reserved)
            .fold(CpuSet::new(), |a, p| a.union(&p.cpus));
        let housekeeping = reserved.difference(&kernel.not_housekeeping());
        let kthreads = self.fit_kthreads(&isolated, &housekeeping);
        let news = kthreads.moved != self.report.kthreads.moved || kthreads.kept != self.report.kthreads.kept;
        if news && kthreads.moved > 0 {
            log::info!("kernel threads: {}", kthreads.summary());
        }
        log_boot_coverage(&self.report, &kernel, &pools, std::mem::take(&mut self.say_boot));
        self.report = IsolationReport { kernel, housekeeping, masks, kthreads, pools };
        events
    }

    fn reads_layout(&self) -> bool {
        true
    }

    fn publish(&self, reports: &mut Reports) {
        reports.put(self.report.clone());
    }

    /// Nothing: the pools stay isolated over a restart (module docs).
    fn stop(&mut self) {}
}

/// Logs what the kernel's boot isolation leaves undone for the isolated `pools`
/// ([`crate::core::boot::problems`]) when `always` (at start; at the first pass after a reload
/// or pool edit, which for a reload that changed no pool is the next drift check) and on any
/// pass that changes it.
fn log_boot_coverage(
    last: &IsolationReport,
    kernel: &KernelIsolation,
    pools: &BTreeMap<PoolName, PoolIsolation>,
    always: bool,
) {
    let problems = |k: &KernelIsolation, p: &BTreeMap<PoolName, PoolIsolation>| {
        let pools = p.iter().map(|(n, p)| (n.as_str(), &p.cpus));
        crate::core::boot::problems(pools, &k.boot, &k.nohz_full, &k.isolated)
    };
    let now = problems(kernel, pools);
    if !always && now == problems(&last.kernel, &last.pools) {
        return;
    }
    // Information, not a fault: the pools are isolated as configured; what only a reboot
    // removes is said so that it is known, and the sandbox's kernel has no boot parameters.
    for p in &now {
        log::info!("boot isolation: {p}");
    }
    if now.is_empty() && !pools.is_empty() {
        log::info!("boot isolation: the kernel's nohz_full=, rcu_nocbs= and isolcpus=managed_irq cover the isolated pools");
    }
}

/// What keeps an isolated pool's CPUs from being the partitions the layout plans: none at
/// all ([`plan::Partitions::Off`]), or the kernel's word on its slice's partition, or on
/// a container's that holds some of its CPUs.
fn partition_problem(scene: &Scene<'_>, pool: &Pool) -> Option<String> {
    if scene.partitions == Partitions::Off {
        return Some(crate::core::plan::no_partitions_reason(scene.state));
    }
    let slice = plan::pool_slice(&pool.name);
    let status = scene.backend.partition_status(&slice).unwrap_or_default();
    if status.contains("invalid") {
        return Some(format!("the kernel made the partition {status}"));
    }
    for (path, _) in container_partitions(scene.state, scene.partitions, pool) {
        let status = scene.backend.partition_status(&path).unwrap_or_default();
        if status != "isolated" {
            return Some(format!("the kernel made the partition of container cgroup {path} `{status}`"));
        }
    }
    None
}

/// The cgroups of containers holding CPUs of `pool` as partitions of their own, with the
/// assignment's CPUs.
fn container_partitions(state: &State, partitions: Partitions, pool: &Pool) -> Vec<(CgroupPath, CpuSet)> {
    if partitions != Partitions::Containers || state.usage(&pool.name).containers.is_empty() {
        return Vec::new();
    }
    state
        .assignments()
        .values()
        .filter(|a| a.pool == pool.name && a.target.outside_pools())
        .filter_map(|a| match &a.target {
            Target::Cgroup(p) => Some((p.clone(), a.cpus.clone())),
            _ => None,
        })
        .collect()
}

impl Housekeeping {
    /// Takes a sample of the counters and measures each isolated pool of `state` since the
    /// last one (the daemon's health tick).
    pub(super) fn sample(&mut self, state: &State, partitions: Partitions) {
        // A pool's own time: its slice's, and its containers' where they are partitions.
        let mut slices: Vec<(String, String)> = Vec::new();
        for n in self.report.pools.keys() {
            slices.push((n.to_string(), plan::pool_slice(n).as_str().to_owned()));
            if let Some(p) = state.pools().get(n) {
                for (path, _) in container_partitions(state, partitions, p) {
                    slices.push((n.to_string(), path.as_str().to_owned()));
                }
            }
        }
        let now = Instant::now();
        let sample = match health::read_sample(&self.roots.procfs, &self.roots.cgroup, &slices) {
            Ok(s) => s,
            Err(e) => {
                log::debug!("isolation health: {}", error_chain(&e));
                return;
            }
        };
        if let Some((then, before)) = &self.last {
            let secs = now.duration_since(*then).as_secs_f64();
            for (name, pool) in self.report.pools.iter_mut() {
                pool.health = housekeeping::assess(name.as_str(), &pool.cpus, before, &sample, secs);
            }
        }
        self.last = Some((now, sample));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(s: &str) -> CpuSet {
        CpuSet::parse(s).unwrap_or_else(|e| panic!("{e}"))
    }

    fn chain(e: &dyn std::error::Error) -> String {
        let mut s = e.to_string();
        let mut cur = e.source();
        while let Some(c) = cur {
            s.push_str(&format!(": {c}"));
            cur = c.source();
        }
        s
    }

    const POOLS: &str = "[pools.sys]\nkind = \"reserved\"\ncpus = \"0-1\"\n\
        [pools.dp]\nkind = \"exclusive\"\ncpus = \"2-3\"\nisolate = true\n";

    fn resolved() -> (Settings, Vec<Pool>) {
        let settings = crate::config::load_str(POOLS, "t.toml").unwrap_or_else(|e| panic!("{}", chain(&e)));
        let topo = crate::core::topology::Topology::synthetic(1, 4, 1, 1);
        let pools = settings.resolve_pools(&topo).unwrap_or_else(|e| panic!("{}", chain(&e)));
        (settings, pools)
    }

    #[test]
    fn nohz_full_reserved_cpus_are_not_housekeeping() {
        let (settings, pools) = resolved();
        // nohz_full=0-1 (and isolcpus=) on the command line: the reserved pool has nothing left.
        let e = check_housekeeping_against(&settings, &pools, &set("0-3"))
            .err()
            .unwrap_or_else(|| panic!("accepted"));
        assert_eq!(e.key(), Some("pools.sys.cpus"), "{}", chain(&*e));
        let text = chain(&*e);
        assert!(text.contains("pool `sys` (reserved)"), "{text}");
        assert!(text.contains("no housekeeping CPU: the reserved pool's CPUs 0-1"), "{text}");
        assert!(text.contains("isolcpus=/nohz_full= 0-3"), "{text}");
        // One reserved CPU the kernel left alone is enough.
        assert!(check_housekeeping_against(&settings, &pools, &set("1-3")).is_ok());
        assert!(check_housekeeping_against(&settings, &pools, &CpuSet::new()).is_ok());
    }

    #[test]
    fn the_guard_reads_the_kernel_command_line_under_the_procfs_root() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let (mut settings, pools) = resolved();
        settings.paths.procfs_root = dir.path().join("proc");
        settings.paths.sysfs_root = dir.path().join("sys");
        settings.paths.cgroup_root = dir.path().join("cg");
        std::fs::create_dir_all(&settings.paths.procfs_root).unwrap_or_else(|e| panic!("{e}"));
        assert!(check_housekeeping(&settings, &pools).is_ok(), "no /proc/cmdline: nothing isolated");
        let cmdline = settings.paths.procfs_root.join("cmdline");
        std::fs::write(&cmdline, "ro quiet nohz_full=0-1\n").unwrap_or_else(|e| panic!("{e}"));
        let e = check_housekeeping(&settings, &pools).err().unwrap_or_else(|| panic!("accepted"));
        assert!(chain(&*e).contains("CPUs 0-1 are all isolated by the kernel"), "{}", chain(&*e));
        std::fs::write(&cmdline, "ro isolcpus=domain,0 nohz_full=1\n").unwrap_or_else(|e| panic!("{e}"));
        assert!(check_housekeeping(&settings, &pools).is_err(), "isolcpus= and nohz_full= together");
        std::fs::write(&cmdline, "ro nohz_full=1-3\n").unwrap_or_else(|e| panic!("{e}"));
        assert!(check_housekeeping(&settings, &pools).is_ok());
    }

    #[test]
    fn kthread_summary_says_who_keeps_them_off() {
        let mut r = KthreadReport::default();
        assert_eq!(r.summary(), "", "no isolation, nothing to say");
        r.isolated = set("2-3");
        assert_eq!(r.summary(), "none on 2-3 (the kernel keeps them off)");
        r.moved = 5;
        assert_eq!(r.summary(), "5 moved off 2-3");
        r.moved = 0;
        r.kept.push("rcu_preempt (14)".into());
        assert_eq!(r.summary(), "none moved off 2-3; kept there by the kernel: rcu_preempt (14)");
    }
}
