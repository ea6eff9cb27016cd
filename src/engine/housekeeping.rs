//! Kernel housekeeping and isolation health, owned by the engine.
//!
//! After every change of the pools (start, reload, pool edit, drift check) the engine calls
//! [`Engine::sync_housekeeping`]: it reads each isolated pool's partition back (an `isolated
//! invalid (reason)` partition makes the pool degraded, with the kernel's reason), then fits the
//! unbound workqueue and writeback cpumasks to the isolated CPUs *after* the partitions exist,
//! so a kernel that already keeps them off (Linux 6.12 does for isolated partitions) is seen to
//! and left alone. Every write is read back; a difference is reported, never taken as done.
//! The masks found before the first write are recorded durably and written back when isolation
//! ends, also when it ended while the daemon was down.
//!
//! [`Engine::sample_isolation`] runs on the daemon's health tick: it reads the counters
//! ([`crate::host::health`]) and turns the last two samples into rates per isolated CPU.
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use super::{error_chain, Engine, Event};
use crate::core::cpuset::CpuSet;
use crate::core::housekeeping::{self, PoolHealth, Sample};
use crate::core::plan;
use crate::core::pool::PoolName;
use crate::host::health;
use crate::host::housekeeping::{self as hk, KernelIsolation, Saved};

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
    /// The kernel's reason when its partition is invalid.
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
            (Some(why), _) => format!("degraded: the kernel made the partition {why}"),
            (None, None) => "not measured yet".to_owned(),
            (None, Some(h)) => h.summary(),
        }
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
    /// Each isolated pool.
    pub pools: BTreeMap<PoolName, PoolIsolation>,
}

/// The engine's housekeeping part.
pub struct Housekeeping {
    roots: Roots,
    saved: Saved,
    last: Option<(Instant, Sample)>,
    report: IsolationReport,
}

impl Housekeeping {
    /// Housekeeping below `roots`, with the masks a previous run recorded.
    pub fn new(roots: Roots) -> Housekeeping {
        let saved = Saved::load(&roots.state_dir).unwrap_or_else(|e| {
            log::error!("{}; the masks found before isolation cannot be restored", error_chain(&e));
            Saved::default()
        });
        Housekeeping { roots, saved, last: None, report: IsolationReport::default() }
    }

    /// The report for the snapshot.
    pub fn report(&self) -> Arc<IsolationReport> {
        Arc::new(self.report.clone())
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
                self.store();
            }
            let by = if self.saved.slot(file).is_some() { "cpupoold" } else { "kernel" };
            return report(current, by.to_owned());
        }
        // Recorded before the first write, so a crash right after it still restores.
        if self.saved.slot(file).is_none() {
            *self.saved.slot(file) = Some(housekeeping::format_mask(&current, bits));
            if !self.store() {
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
            self.store();
            return report(back, "kernel".into());
        }
        log::info!("unbound work off the isolated CPUs: `{file}` now CPUs {want}");
        report(back, "cpupoold".into())
    }

    fn store(&self) -> bool {
        match self.saved.store(&self.roots.state_dir) {
            Ok(()) => true,
            Err(e) => {
                log::error!("recording the workqueue masks: {}", error_chain(&e));
                false
            }
        }
    }
}

impl Engine {
    /// Reads back partitions and fits the workqueue masks to the isolated pools; returns the
    /// pools whose partition validity changed, to publish.
    pub(super) fn sync_housekeeping(&mut self) -> Vec<Event> {
        let Some(mut hk) = self.hk.take() else { return Vec::new() };
        let mut events = Vec::new();
        let mut pools = BTreeMap::new();
        let mut isolated = CpuSet::new();
        for p in self.state.pools().values().filter(|p| p.isolate) {
            let status = self.backend.partition_status(&plan::pool_slice(&p.name)).unwrap_or_default();
            let invalid = status.contains("invalid").then(|| status.clone());
            let before = hk.report.pools.get(&p.name);
            if before.map(|b| &b.invalid) != Some(&invalid) {
                match &invalid {
                    Some(why) => {
                        log::warn!(POOL = p.name.as_str(); "pool {} is degraded: partition {why}", p.name)
                    }
                    None if before.is_some_and(|b| b.invalid.is_some()) => {
                        log::info!(POOL = p.name.as_str(); "pool {}: partition valid again", p.name)
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
        let bits = self.topo.online().union(self.topo.offline()).last().map_or(1, |l| l + 1);
        let masks = [hk::WORKQUEUE_MASK, hk::WRITEBACK_MASK]
            .into_iter()
            .filter_map(|f| hk.fit(f, &isolated, bits))
            .collect();
        let kernel = hk::read_kernel(&hk.roots.procfs, &hk.roots.sysfs, &hk.roots.cgroup);
        let reserved = self
            .state
            .pools()
            .values()
            .filter(|p| p.kind == crate::core::pool::PoolKind::Reserved)
            .fold(CpuSet::new(), |a, p| a.union(&p.cpus));
        let off = kernel.isolated.union(&kernel.nohz_full).union(&kernel.boot.nohz_full);
        let housekeeping = reserved.difference(&off);
        hk.report = IsolationReport { kernel, housekeeping, masks, pools };
        self.hk = Some(hk);
        events
    }

    /// Takes a sample of the counters and measures each isolated pool since the last one.
    pub(super) fn sample_isolation(&mut self) {
        let Some(hk) = self.hk.as_mut() else { return };
        let slices: Vec<(String, String)> = hk
            .report
            .pools
            .keys()
            .map(|n| (n.to_string(), plan::pool_slice(n).as_str().to_owned()))
            .collect();
        let now = Instant::now();
        let sample = match health::read_sample(&hk.roots.procfs, &hk.roots.cgroup, &slices) {
            Ok(s) => s,
            Err(e) => {
                log::debug!("isolation health: {}", error_chain(&e));
                return;
            }
        };
        if let Some((then, before)) = &hk.last {
            let secs = now.duration_since(*then).as_secs_f64();
            for (name, pool) in hk.report.pools.iter_mut() {
                pool.health = Some(housekeeping::assess(name.as_str(), &pool.cpus, before, &sample, secs));
            }
        }
        hk.last = Some((now, sample));
    }
}
