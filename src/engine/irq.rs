//! Interrupt affinity, kept by the engine: after start's reconcile, after every installed
//! configuration, at every drift check, and (when `daemon.irq_restore_on_stop`) once more on
//! the way out to put everything back.
//!
//! Each pass reads every IRQ the kernel lists, asks [`crate::core::isolation`] what it should
//! hold, and writes the difference through [`IrqFs`]. Before the first write to an IRQ its
//! affinity as found is remembered durably (`irq.json` in the state directory, written as a [`Remembered`] value, with a previous copy), so that the daemon can put it back when isolation ends, its pool goes,
//! or the daemon stops, also after a crash. IRQs the kernel places itself refuse the write and
//! are reported as kernel-placed. Re-application after someone (irqbalance, an administrator)
//! rewrites an affinity, and of IRQs that appear later (new ones also start on
//! `default_smp_affinity`, which is set too), happens at the next drift check: procfs offers
//! no event for either.
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::error_chain;
use super::handle::Reports;
use super::keeper::{Keeper, Scene};
use super::Event;
use crate::config::{Irq, Settings};
use crate::core::cpuset::CpuSet;
use crate::core::isolation::{self, IrqLayout, IrqPool, IrqWant};
use crate::core::pool::PoolKind;
use crate::core::state::State;
use crate::host::irq::{IrqError, IrqFs};
use crate::host::irqbalance;
use crate::host::store::{MemoryFile, Remembered};

/// The file in the state directory that remembers affinities from before the daemon's writes
/// (its previous copy, `irq.json.prev`, is what start uses when it cannot be read).
pub const MEMORY: MemoryFile = MemoryFile { name: "irq.json", keeper: "irq", holds: "the affinities" };

/// What the last pass found and did, for the snapshot and logs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IrqReport {
    /// CPUs kept free of movable interrupts.
    pub isolated: CpuSet,
    /// Where displaced interrupts went.
    pub sink: CpuSet,
    /// IRQs whose affinity the daemon set (and remembers the previous one of).
    pub moved: BTreeSet<u32>,
    /// IRQs the kernel places itself (writes refused), with their names.
    pub kernel_placed: BTreeMap<u32, String>,
    /// What does not hold: IRQs still delivered to isolated CPUs, writes that failed or read
    /// back differently, a layout that cannot be made.
    pub problems: Vec<String>,
    /// irqbalance: what it was told or why it could not be, `None` when it does not run.
    pub irqbalance: Option<String>,
}

impl IrqReport {
    /// `8 moved off 2-3 (1, 8, 9, 24, 25, ...); 3 placed by the kernel (0, 41, 42)`, then what
    /// does not hold; empty when no CPU is kept free of interrupts.
    pub fn summary(&self) -> String {
        if self.isolated.is_empty() {
            return String::new();
        }
        let few = |irqs: Vec<u32>| {
            let mut list: Vec<String> = irqs.iter().take(5).map(ToString::to_string).collect();
            if irqs.len() > 5 {
                list.push("...".into());
            }
            list.join(", ")
        };
        let mut s = match self.moved.len() {
            0 => format!("none to move off {}", self.isolated),
            n => format!("{n} moved off {} ({})", self.isolated, few(self.moved.iter().copied().collect())),
        };
        if !self.kernel_placed.is_empty() {
            let n = self.kernel_placed.len();
            s.push_str(&format!(
                "; {n} placed by the kernel ({})",
                few(self.kernel_placed.keys().copied().collect())
            ));
        }
        if let Some(p) = self.problems.first() {
            s.push_str(&format!("; {p}"));
            if self.problems.len() > 1 {
                s.push_str(&format!(" (and {} more)", self.problems.len() - 1));
            }
        }
        s
    }
}

/// The durable memory: each changed IRQ's affinity as found, and whether irqbalance was told.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
struct Memory {
    /// IRQ number → its `smp_affinity_list` before the daemon first wrote it.
    irqs: BTreeMap<u32, String>,
    /// IRQ number → what the daemon last wrote to it: one found holding something else (that
    /// avoids the isolated CPUs) was moved by someone else since, and is theirs again.
    #[serde(default)]
    written: BTreeMap<u32, String>,
    /// `default_smp_affinity` before the daemon wrote it (as a CPU list).
    default: Option<String>,
    /// Whether irqbalance was given a banned list (to hand it back on the way out).
    irqbalance: bool,
}

/// The engine's interrupt state.
pub(crate) struct IrqManager {
    fs: IrqFs,
    config: Irq,
    irqbalance_dir: PathBuf,
    memory: Remembered<Memory>,
    report: IrqReport,
    /// Whether the one-CPU reserved pool warning was given for the current pools.
    warned_one_cpu: bool,
    /// The conversation with irqbalance, on a thread of its own.
    notifier: Notifier,
    /// IRQs whose effective affinity named isolated CPUs at the last pass (where their
    /// `smp_affinity` does not), with their count on those CPUs then: the kernel moves an
    /// interrupt at its next occurrence, so one that has not fired since is not delivered there.
    stale: BTreeMap<u32, u64>,
}

impl IrqManager {
    /// Set up from `settings`, reading the memory a previous run left.
    pub(crate) fn new(settings: &Settings) -> IrqManager {
        let memory: Remembered<Memory> = Remembered::load(&settings.paths.state_dir, MEMORY);
        if !memory.irqs.is_empty() {
            log::info!("irq: {} affinities remembered from an earlier run", memory.irqs.len());
        }
        let memory_told = memory.irqbalance;
        IrqManager {
            fs: irq_fs(settings),
            config: settings.irq.clone(),
            irqbalance_dir: settings.paths.irqbalance_dir.clone(),
            memory,
            report: IrqReport::default(),
            warned_one_cpu: false,
            notifier: Notifier::new(memory_told),
            stale: BTreeMap::new(),
        }
    }

    /// One pass (module docs). `pools` as the plan sees them, `base_sink` the daemon's
    /// `irq_cpus` or the reserved pool's CPUs.
    fn apply(&mut self, pools: &[IrqPool], base_sink: &CpuSet, online: &CpuSet, boot_isolated: &CpuSet) {
        let mut report = IrqReport::default();
        let Some(Survey { layout, names, irqs }) = self.survey(pools, base_sink, online, &mut report) else {
            self.finish(report);
            return;
        };
        // Decide everything first, remember what is about to change, save, then write: a crash
        // after any write finds its previous value on disk.
        let wants = self.decide(&layout, &names, &irqs);
        let default_now = self.fs.default_affinity().ok();
        let default_want =
            isolation::plan_default(&layout, default_now.as_ref(), self.memory.default.is_some());
        if let (IrqWant::Set(_), Some(c), None) = (&default_want, &default_now, &self.memory.default) {
            self.memory.default = Some(c.to_string());
        }
        let saved_before = (*self.memory).clone();
        let needs_save =
            wants.iter().any(|(_, w)| matches!(w, IrqWant::Set(_))) || default_want != IrqWant::Keep;
        if needs_save && !self.memory.save_or_log() {
            report.problems.push("the remembered affinities could not be saved: nothing was moved".into());
            self.finish(report);
            return;
        }
        let written = self.write(wants, &names, &mut report);
        self.write_default(default_want, &mut report);
        self.judge_delivery(&irqs, &written, &layout, &names, &mut report);
        report.moved = self.memory.irqs.keys().copied().collect();
        if self.config.irqbalance {
            // Told on the notifier's thread: the report shows what the last finished exchange
            // said (this pass's, once start has waited for it; the previous one's later).
            let want = (!layout.isolated.is_empty()).then(|| layout.isolated.union(boot_isolated));
            self.notifier.ask(&self.irqbalance_dir, want);
            report.irqbalance = self.notifier.said();
        }
        self.memory.irqbalance = self.notifier.told();
        if *self.memory != saved_before {
            self.memory.save_or_log();
        }
        self.finish(report);
    }

    /// The layout, the IRQs' names and the IRQs the kernel lists; `None` (with the problem in
    /// `report`) when interrupts cannot be moved now.
    fn survey(
        &self,
        pools: &[IrqPool],
        base_sink: &CpuSet,
        online: &CpuSet,
        report: &mut IrqReport,
    ) -> Option<Survey> {
        if !self.fs.available() {
            if !self.memory.irqs.is_empty() || pools.iter().any(|p| p.mode == isolation::IrqMode::Isolate) {
                report.problems.push(format!(
                    "`{}` does not exist: interrupts cannot be moved",
                    self.fs.dir().display()
                ));
            }
            return None;
        }
        let layout = isolation::layout(pools, base_sink, online)
            .map_err(|e| report.problems.push(e.to_string()))
            .ok()?;
        report.isolated = layout.isolated.clone();
        report.sink = layout.sink.clone();
        let names = self.fs.names().unwrap_or_else(|e| {
            log::warn!("irq: {}", error_chain(&e));
            BTreeMap::new()
        });
        let irqs = self.fs.irqs().map_err(|e| report.problems.push(error_chain(&e))).ok()?;
        Some(Survey { layout, names, irqs })
    }

    /// What each IRQ should hold ([`isolation::plan_irq`]), remembering (in memory, not yet
    /// saved) the affinity of each about to be set, and forgetting those someone else moved
    /// since the daemon wrote them.
    fn decide(&mut self, layout: &IrqLayout, names: &Names, irqs: &[u32]) -> Vec<(u32, IrqWant)> {
        let mut wants = Vec::new();
        for &irq in irqs {
            let empty = Vec::new();
            let n = names.get(&irq).unwrap_or(&empty);
            let current = self.fs.affinity(irq).ok();
            let want = isolation::plan_irq(layout, n, current.as_ref(), self.memory.irqs.contains_key(&irq));
            if want == IrqWant::Keep && !layout.isolated.is_empty() {
                let ours = self.memory.written.get(&irq);
                if ours.is_some()
                    && ours.map(String::as_str) != current.as_ref().map(ToString::to_string).as_deref()
                {
                    log::info!("irq: IRQ {irq} was moved by someone else to CPUs that are not isolated: theirs again");
                    self.forget(irq);
                }
            }
            if let (IrqWant::Set(_), Some(c)) = (&want, &current) {
                self.memory.irqs.entry(irq).or_insert_with(|| c.to_string());
            }
            wants.push((irq, want));
        }
        wants
    }

    /// Forgets what the memory holds of `irq`.
    fn forget(&mut self, irq: u32) {
        self.memory.irqs.remove(&irq);
        self.memory.written.remove(&irq);
    }

    /// Writes each IRQ's wanted affinity and reads it back; the IRQs written.
    fn write(&mut self, wants: Vec<(u32, IrqWant)>, names: &Names, report: &mut IrqReport) -> BTreeSet<u32> {
        let mut written = BTreeSet::new();
        for (irq, want) in wants {
            let restoring = matches!(want, IrqWant::Restore);
            let target = match want {
                IrqWant::Keep => continue,
                IrqWant::Set(c) => c,
                IrqWant::Restore => match self.memory.irqs.get(&irq).map(|s| CpuSet::parse(s)) {
                    Some(Ok(c)) => c,
                    _ => {
                        self.forget(irq);
                        continue;
                    }
                },
            };
            written.insert(irq);
            match self.fs.set_affinity(irq, &target) {
                Ok(()) => match self.fs.affinity(irq) {
                    Ok(now) if now == target => {
                        log::info!("irq: IRQ {} now on CPUs {target}", label(names, irq));
                        if restoring {
                            self.forget(irq);
                        } else {
                            self.memory.written.insert(irq, target.to_string());
                        }
                    }
                    Ok(now) => report.problems.push(format!(
                        "IRQ {}: wrote CPUs {target}, the kernel holds {now}",
                        label(names, irq)
                    )),
                    Err(e) => report.problems.push(format!("IRQ {}: {}", label(names, irq), error_chain(&e))),
                },
                Err(IrqError::KernelPlaced { .. }) => {
                    self.forget(irq);
                    report
                        .kernel_placed
                        .insert(irq, names.get(&irq).map(|n| n.join(", ")).unwrap_or_default());
                }
                Err(e) => {
                    log::warn!("irq: {}", error_chain(&e));
                    report.problems.push(error_chain(&e));
                }
            }
        }
        written
    }

    /// Writes `default_smp_affinity` as planned.
    fn write_default(&mut self, want: IrqWant, report: &mut IrqReport) {
        match want {
            IrqWant::Keep => {}
            IrqWant::Set(c) => {
                if let Err(e) = self.fs.set_default_affinity(&c) {
                    report.problems.push(error_chain(&e));
                }
            }
            IrqWant::Restore => {
                let back = self.memory.default.as_deref().and_then(|s| CpuSet::parse(s).ok());
                if let Some(c) = back {
                    match self.fs.set_default_affinity(&c) {
                        Ok(()) => self.memory.default = None,
                        Err(e) => report.problems.push(error_chain(&e)),
                    }
                } else {
                    self.memory.default = None;
                }
            }
        }
    }

    /// Reads back where every interrupt is delivered. The kernel moves an interrupt at its next
    /// occurrence, so an effective affinity that still names isolated CPUs is judged by the
    /// counts: delivered there only if it fired there since the last pass. Those `written` just
    /// now, or first seen so, are judged at the next pass.
    fn judge_delivery(
        &mut self,
        irqs: &[u32],
        written: &BTreeSet<u32>,
        layout: &IrqLayout,
        names: &Names,
        report: &mut IrqReport,
    ) {
        let counts = self.fs.counts().ok();
        let mut stale = BTreeMap::new();
        for &irq in irqs {
            if written.contains(&irq) || report.kernel_placed.contains_key(&irq) {
                continue;
            }
            let Ok(Some(eff)) = self.fs.effective(irq) else { continue };
            let on = eff.intersection(&layout.isolated);
            let claimed = self.fs.affinity(irq).ok().is_some_and(|a| !a.is_disjoint(&layout.isolated));
            if on.is_empty() || claimed {
                continue;
            }
            let still = || format!("IRQ {} is still delivered to isolated CPUs {on}", label(names, irq));
            let Some(counts) = &counts else {
                // No counts to judge by: what the kernel shows is all there is.
                report.problems.push(still());
                continue;
            };
            let there: u64 = counts.get(&irq).map_or(0, |c| on.iter().filter_map(|cpu| c.get(&cpu)).sum());
            if self.stale.get(&irq).is_some_and(|&before| there > before) {
                report.problems.push(still());
            }
            stale.insert(irq, there);
        }
        self.stale = stale;
    }

    /// Writes every remembered affinity back and forgets it (the daemon stops).
    fn restore_all(&mut self) {
        self.memory.written.clear();
        for (irq, text) in std::mem::take(&mut self.memory.irqs) {
            let Ok(c) = CpuSet::parse(&text) else { continue };
            match self.fs.set_affinity(irq, &c) {
                Ok(()) | Err(IrqError::KernelPlaced { .. }) => log::info!("irq: IRQ {irq} back on CPUs {c}"),
                Err(e) => log::warn!("irq: restoring: {}", error_chain(&e)),
            }
        }
        if let Some(c) = self.memory.default.take().and_then(|s| CpuSet::parse(&s).ok()) {
            if let Err(e) = self.fs.set_default_affinity(&c) {
                log::warn!("irq: restoring: {}", error_chain(&e));
            }
        }
        if self.notifier.told() {
            // The last word before stopping: after anything still queued, and waited for.
            self.notifier.ask(&self.irqbalance_dir, None);
            self.notifier.settle(SETTLE);
            self.memory.irqbalance = self.notifier.told();
        }
        self.memory.save_or_log();
    }

    fn finish(&mut self, report: IrqReport) {
        if report.problems != self.report.problems {
            for p in &report.problems {
                log::warn!("irq: {p}");
            }
        }
        if report.kernel_placed != self.report.kernel_placed && !report.kernel_placed.is_empty() {
            let list: Vec<String> = report.kernel_placed.iter().map(|(i, n)| format!("{i} {n}")).collect();
            log::info!("irq: placed by the kernel (managed), left where it puts them: {}", list.join(", "));
        }
        self.report = report;
    }
}

/// Each IRQ's action names, as `/proc/interrupts` lists them.
type Names = BTreeMap<u32, Vec<String>>;

/// What a pass starts from.
struct Survey {
    layout: IrqLayout,
    names: Names,
    irqs: Vec<u32>,
}

/// `24 (eth0-rx-0)` or `24`.
fn label(names: &Names, irq: u32) -> String {
    match names.get(&irq) {
        Some(n) if !n.is_empty() => format!("{irq} ({})", n.join(", ")),
        _ => irq.to_string(),
    }
}

/// How long start and stop wait for irqbalance to be told.
const SETTLE: Duration = Duration::from_secs(5);

/// Tells irqbalance the CPUs to ban on a thread of its own, so that a slow or hung irqbalance
/// never holds up the engine (each exchange may wait [`irqbalance::ANSWER_TIMEOUT`] per
/// command). The engine only hands it the wanted set ([`Notifier::ask`]); asks that arrive while
/// an exchange runs are coalesced into one exchange with the latest set. Each exchange reads
/// what irqbalance bans now and tells it only when that differs, and logs what it found when
/// that changed (`irq: irqbalance asked to ban CPUs 2-3`).
struct Notifier {
    shared: Arc<(Mutex<Talk>, Condvar)>,
    started: bool,
}

/// What the engine and the notifier's thread share.
#[derive(Default)]
struct Talk {
    /// The latest set not yet sent, and the socket directory: `Some(None)` hands irqbalance
    /// its own choice back.
    pending: Option<(PathBuf, Option<CpuSet>)>,
    /// Asks made, and asks answered by a finished exchange.
    asked: u64,
    done: u64,
    /// Whether irqbalance was given a banned list (to hand it back), as the memory keeps it.
    told: bool,
    /// What the last exchange found; `None` when no irqbalance runs.
    said: Option<String>,
    /// The engine is gone.
    stop: bool,
}

impl Notifier {
    fn new(told: bool) -> Notifier {
        let talk = Talk { told, ..Talk::default() };
        Notifier { shared: Arc::new((Mutex::new(talk), Condvar::new())), started: false }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Talk> {
        // A panic on the thread leaves plain data behind: still usable.
        self.shared.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Hands the thread the set to ban (`None`: give irqbalance its own choice back), starting
    /// the thread the first time.
    fn ask(&mut self, dir: &Path, want: Option<CpuSet>) {
        if !self.started {
            let shared = self.shared.clone();
            let spawned =
                std::thread::Builder::new().name("cpupoold-irqbalance".into()).spawn(move || talk(&shared));
            match spawned {
                Ok(_) => self.started = true,
                Err(e) => {
                    log::error!("irq: cannot start the irqbalance thread: {e}");
                    return;
                }
            }
        }
        let mut t = self.lock();
        t.pending = Some((dir.to_owned(), want));
        t.asked += 1;
        self.shared.1.notify_all();
    }

    /// Waits until every ask so far is answered, at most `bound`; whether they are.
    fn settle(&self, bound: Duration) -> bool {
        let t = self.lock();
        let (t, _) = self
            .shared
            .1
            .wait_timeout_while(t, bound, |t| t.done < t.asked)
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        t.done >= t.asked
    }

    fn said(&self) -> Option<String> {
        self.lock().said.clone()
    }

    fn told(&self) -> bool {
        self.lock().told
    }
}

impl Drop for Notifier {
    fn drop(&mut self) {
        self.lock().stop = true;
        self.shared.1.notify_all();
    }
}

/// The notifier's thread: one exchange per batch of asks, until the engine is gone.
fn talk(shared: &(Mutex<Talk>, Condvar)) {
    let lock = || shared.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    loop {
        let (dir, want, asked, mut told) = {
            let t = shared
                .1
                .wait_while(lock(), |t| t.pending.is_none() && !t.stop)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let mut t = t;
            let Some((dir, want)) = t.pending.take() else { return };
            (dir, want, t.asked, t.told)
        };
        let said = coordinate(&dir, want.as_ref(), &mut told);
        let mut t = lock();
        if said != t.said {
            if let Some(s) = &said {
                log::info!("irq: {s}");
            }
        }
        t.said = said;
        t.told = told;
        t.done = asked;
        shared.1.notify_all();
    }
}

/// Tells each running irqbalance in `dir` to ban `want` (the isolated CPUs, and the CPUs it bans
/// by itself at start, `isolcpus=`, which its banned list would otherwise drop); hands the
/// choice back when nothing is isolated any more and it was `told` before. What it said, `None`
/// when no irqbalance runs.
fn coordinate(dir: &Path, want: Option<&CpuSet>, told: &mut bool) -> Option<String> {
    let sockets = irqbalance::sockets(dir);
    if sockets.is_empty() {
        return None;
    }
    let mut said = Vec::new();
    for sock in &sockets {
        let banned = irqbalance::banned(sock);
        let result = match (want, &banned) {
            (Some(w), Ok(b)) if w == b => Ok(format!("irqbalance bans CPUs {w}")),
            (Some(w), _) => irqbalance::set_banned(sock, Some(w)).map(|()| {
                *told = true;
                format!("irqbalance asked to ban CPUs {w}")
            }),
            (None, _) if *told => irqbalance::set_banned(sock, None).map(|()| {
                *told = false;
                "irqbalance given back its own banned CPUs".to_owned()
            }),
            (None, Ok(b)) => Ok(format!("irqbalance bans CPUs {b}")),
            (None, Err(e)) => Ok(format!("irqbalance: {}", error_chain(e))),
        };
        match result {
            Ok(s) => said.push(s),
            Err(e) => said.push(format!("irqbalance: {}", error_chain(&e))),
        }
    }
    Some(said.join("; "))
}

fn irq_fs(settings: &Settings) -> IrqFs {
    let p = &settings.paths;
    IrqFs::new(&p.procfs_root, crate::host::irq::irq_dir(&p.procfs_root, &p.runtime_dir))
        .with_kernel(p.kernel)
}

impl Keeper for IrqManager {
    fn configure(&mut self, settings: &Settings) {
        self.config = settings.irq.clone();
        self.fs = irq_fs(settings);
        self.irqbalance_dir = settings.paths.irqbalance_dir.clone();
    }

    /// One interrupt pass over the current pools (see [`IrqManager`]); no pool events.
    fn keep(&mut self, scene: &Scene<'_>) -> Vec<Event> {
        let (pools, base_sink, reserved) = self.irq_pools(scene.state);
        // systemd judges irqbalance.service's ConditionCPUs=>1 on the CPUs init.scope may use,
        // which are the reserved pool's: with one, a restart of irqbalance is skipped and it
        // stops without a word.
        let one_cpu = reserved.len() == 1 && self.config.irqbalance;
        if one_cpu && !self.warned_one_cpu {
            log::warn!(
                "irq: the reserved pool has one CPU ({reserved}): systemd skips starting irqbalance \
                 (ConditionCPUs=>1 is judged on init.scope's CPUs), so `systemctl restart irqbalance` \
                 stops it; give the reserved pool two CPUs to keep irqbalance"
            );
        }
        self.warned_one_cpu = one_cpu;
        let online = scene.topo.online();
        self.apply(&pools, &base_sink, &online, &scene.topo.data().isolated);
        Vec::new()
    }

    /// Waits (at most [`SETTLE`]) until irqbalance has been told what the last pass wants, and
    /// reports what it said: start does, so that irqbalance knows the isolated CPUs by the time
    /// the daemon is ready.
    fn settle(&mut self) {
        if !self.notifier.settle(SETTLE) {
            log::warn!("irq: irqbalance has not answered yet; it is told in the background");
        }
        if self.config.irqbalance {
            self.report.irqbalance = self.notifier.said();
        }
    }

    fn publish(&self, reports: &mut Reports) {
        reports.put(self.report.clone());
    }

    /// Puts every interrupt back, if so configured (the daemon stops).
    fn stop(&mut self) {
        if self.config.restore_on_stop {
            self.restore_all();
        }
    }
}

impl IrqManager {
    /// The pools as the interrupt plan sees them, the daemon's sink and the reserved CPUs.
    fn irq_pools(&self, state: &State) -> (Vec<IrqPool>, CpuSet, CpuSet) {
        let mut reserved = CpuSet::new();
        let pools = state
            .pools()
            .values()
            .map(|p| {
                if p.kind == PoolKind::Reserved {
                    reserved = p.cpus.clone();
                }
                let cfg = self.config.pools.get(&p.name);
                let default_mode =
                    if p.isolate { isolation::IrqMode::Isolate } else { isolation::IrqMode::None };
                IrqPool {
                    name: p.name.to_string(),
                    cpus: p.cpus.clone(),
                    mode: cfg.map_or(default_mode, |c| c.mode),
                    claims: cfg.map(|c| c.claims.clone()).unwrap_or_default(),
                }
            })
            .collect();
        (pools, self.config.cpus.clone().unwrap_or_else(|| reserved.clone()), reserved)
    }
}

#[cfg(test)]
mod tests {
    use std::fs;
    use std::os::unix::net::{UnixListener, UnixStream};
    use std::time::Duration;

    use super::super::tests::{rt, spec, Fixture};
    use crate::core::state::Size;

    const ISOLATED: &str = "[pools.sys]\nkind = \"reserved\"\ncpus = \"0,4\"\n\
        [pools.dp]\nkind = \"exclusive\"\ncpus = \"1-2,5-6\"\nisolate = true\n\
        [pools.web]\nkind = \"shared\"\ncpus = \"3,7\"\n";

    /// Whether the other end of `conn` has closed it (not just shut down its writing half,
    /// which an irqbalance client does right after its command): a write then fails. A client
    /// still there reads the byte as a (meaningless) answer.
    fn hung_up(mut conn: &UnixStream) -> bool {
        use std::io::Write;
        conn.write_all(b"?").is_err()
    }

    /// The kernel moves an interrupt at its next occurrence: until then its effective affinity
    /// names the CPUs it left. Such an IRQ is "still delivered" to an isolated CPU only once its
    /// count there grows.
    #[test]
    fn fake_procfs_an_irq_that_has_not_fired_since_it_was_moved_is_not_called_delivered() {
        let f = Fixture::new();
        fs::write(f.sb.etc().join("config.toml"), ISOLATED).unwrap_or_else(|e| panic!("{e}"));
        let (mut engine, _) = f.start();
        let proc = f.sb.procfs();
        // IRQ 1 (i8042) went to the reserved CPUs at start; it has not fired since, so the
        // kernel still shows it on isolated CPU 1.
        fs::write(proc.join("irq/1/effective_affinity_list"), "1\n").unwrap_or_else(|e| panic!("{e}"));
        // One pass of the keepers, then what the snapshot says of IRQ 1.
        let said = |e: &mut super::super::Engine| {
            let events = e.keep_host(crate::engine::keeper::Pass::Pools);
            e.publish(events);
            let snap = e.snapshots.borrow();
            snap.report::<crate::engine::IrqReport>()
                .problems
                .iter()
                .filter(|p| p.starts_with("IRQ 1 "))
                .cloned()
                .collect::<Vec<_>>()
        };
        assert_eq!(said(&mut engine), Vec::<String>::new(), "first seen: judged at the next pass");
        assert_eq!(said(&mut engine), Vec::<String>::new(), "it has not fired on CPU 1 since");
        // It fires on CPU 1: the kernel delivered it there.
        let table = fs::read_to_string(proc.join("interrupts")).unwrap_or_else(|e| panic!("{e}"));
        let header: Vec<&str> = table.lines().next().unwrap_or_default().split_whitespace().collect();
        let col = header.iter().position(|c| *c == "CPU1").unwrap_or_else(|| panic!("{table}")) + 1;
        let bumped: Vec<String> = table
            .lines()
            .map(|l| {
                if l.trim_start().starts_with("1:") {
                    let mut w: Vec<String> = l.split_whitespace().map(str::to_owned).collect();
                    w[col] = "3".into();
                    w.join(" ")
                } else {
                    l.to_owned()
                }
            })
            .collect();
        fs::write(proc.join("interrupts"), bumped.join("\n") + "\n").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(said(&mut engine), ["IRQ 1 (i8042) is still delivered to isolated CPUs 1"]);
    }

    #[test]
    fn a_silent_irqbalance_holds_up_no_engine_request() {
        let f = Fixture::new();
        fs::write(f.sb.etc().join("config.toml"), ISOLATED).unwrap_or_else(|e| panic!("{e}"));
        let (engine, _) = f.start();
        f.write("cpupool.slice/cpupool-web.slice/a/cpuset.cpus", "\n");
        // An irqbalance that takes the first connection and never answers on it; later ones
        // are closed at once.
        let dir = f.sb.run().join("irqbalance");
        fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
        let listener = UnixListener::bind(dir.join("irqbalance4242.sock")).unwrap_or_else(|e| panic!("{e}"));
        let (held_tx, held) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for (i, conn) in listener.incoming().enumerate() {
                if i == 0 {
                    let _ = held_tx.send(conn);
                }
            }
        });
        let (handle, thread) = engine.spawn().unwrap_or_else(|e| panic!("{e}"));
        let guard = Duration::from_secs(60);
        rt().block_on(async {
            // The drift check's interrupt pass hands irqbalance the isolated CPUs.
            tokio::time::timeout(guard, handle.check_drift())
                .await
                .unwrap_or_else(|_| panic!("the drift check waited for irqbalance"))
                .unwrap_or_else(|e| panic!("{e}"));
            let conn = held
                .recv_timeout(guard)
                .unwrap_or_else(|e| panic!("irqbalance was never asked: {e}"))
                .unwrap_or_else(|e| panic!("{e}"));
            // irqbalance has been asked and has not answered: the engine answers meanwhile.
            let a = tokio::time::timeout(
                guard,
                handle.assign(spec(
                    "web",
                    "cgroup:cpupool.slice/cpupool-web.slice/a",
                    Size::Millicpus(100),
                    None,
                )),
            )
            .await
            .unwrap_or_else(|_| panic!("the engine waited for irqbalance"));
            a.unwrap_or_else(|e| panic!("{e}"));
            assert!(!hung_up(&conn), "the engine answered only after giving up on irqbalance");
            drop(conn);
        });
        drop(handle);
        let _ = thread.join();
    }
}
