//! Power classes, kept by the engine: after start's reconcile, after every installed
//! configuration (reload, pool edit), at every drift check, and (when
//! `daemon.power_restore_on_stop`) once more on the way out to put everything back.
//!
//! Each pass turns every configured class (`[pools.NAME.power]`, `[idle_cpus.power]`) into the
//! sysfs files it sets on the pool's CPUs now ([`plan_class`], pure, in `core::power::plan`: words such as `max` resolved
//! against what each CPU reports), remembers what each file held before the daemon's first
//! write to it durably (`power.json` in the state directory, a [`Remembered`] value, saved
//! before any write, as `irq.json` is), writes what differs, and reads every file back. A file
//! no class wants any more (its CPU left the pool, the key or the pool went, the daemon was
//! stopped without restoring, or crashed) gets the remembered value back and is forgotten.
//! What was read back is reported as one [`ClassRow`] per configured key and pool.
//!
//! The same plan checks new settings before the engine takes them ([`check_power`]): a key the
//! host has no driver for, or a value it does not offer, refuses the configuration naming the
//! key, and nothing is written. A value that cannot be applied later (a write refused, a file
//! gone) is reported as degraded on its row, as interrupts report what does not hold.
use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::error_chain;
use super::handle::Reports;
use super::keeper::{Keeper, Scene};
use super::Event;
use crate::config::{power_key, ConfigError, Power, Settings};
use crate::core::classes::{ClassKind, ClassRow, ClassState, IDLE_CPUS};
use crate::core::cpuset::CpuSet;
use crate::core::pool::Pool;
use crate::core::power::plan::{plan_class, KeyPlan, PowerFacts, Refusal};
use crate::core::power::PowerClass;
use crate::core::topology::Topology;
use crate::host::power::{PowerFs, CPU_DIR};
use crate::host::store::{MemoryFile, Remembered};

/// The file in the state directory that remembers the values found before the daemon's writes
/// (with its previous copy, `power.json.prev`, as `irq.json` has).
pub const MEMORY: MemoryFile = MemoryFile { name: "power.json", keeper: "power", holds: "the values" };

/// The durable memory.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
struct Memory {
    /// sysfs file (relative to the sysfs root) → what it held before the daemon first wrote it.
    files: BTreeMap<String, String>,
}

/// What a pass reads to plan: the host's limits, lists and drivers, and where the files are.
/// They do not change while a pass runs, and every CPU and key asks for them again (a 1,024-CPU
/// class would read each CPU's limits four times), so each is read once per pass.
pub(crate) struct Facts<'a> {
    fs: &'a PowerFs,
    files: std::cell::RefCell<std::collections::HashMap<String, Result<String, String>>>,
    places: std::cell::RefCell<std::collections::HashMap<String, Result<String, String>>>,
}

impl<'a> Facts<'a> {
    pub(crate) fn new(fs: &'a PowerFs) -> Facts<'a> {
        Facts { fs, files: Default::default(), places: Default::default() }
    }

    fn place(&self, key: String, find: impl FnOnce() -> Result<String, String>) -> Result<String, String> {
        self.places.borrow_mut().entry(key).or_insert_with(find).clone()
    }
}

impl PowerFacts for Facts<'_> {
    fn root(&self) -> &std::path::Path {
        self.fs.root()
    }

    fn read(&self, rel: &str) -> Result<String, String> {
        self.files
            .borrow_mut()
            .entry(rel.to_owned())
            .or_insert_with(|| self.fs.read(rel).map_err(|e| error_chain(&e)))
            .clone()
    }

    fn cpufreq_dir(&self, cpu: u32) -> Result<String, String> {
        self.place(format!("cpufreq{cpu}"), || self.fs.cpufreq_dir(cpu))
    }

    fn resume_latency_file(&self, cpu: u32) -> Result<String, String> {
        self.fs.resume_latency_file(cpu)
    }

    fn uncore_dir(&self, package: u32, die: u32) -> Result<String, String> {
        self.place(format!("uncore{package}/{die}"), || self.fs.uncore_dir(package, die))
    }
}

/// Each class with the CPUs it covers now: a pool's CPUs, or for [`IDLE_CPUS`] the online CPUs
/// no pool holds.
fn scopes<'a>(
    power: &'a Power,
    topo: &Topology,
    pools: &BTreeMap<String, CpuSet>,
) -> Vec<(&'a str, &'a PowerClass, CpuSet)> {
    let pooled = pools.values().fold(CpuSet::new(), |acc, c| acc.union(c));
    power
        .classes
        .iter()
        .map(|(name, class)| {
            let cpus = if name == IDLE_CPUS {
                topo.online().difference(&pooled)
            } else {
                pools.get(name).cloned().unwrap_or_default()
            };
            (name.as_str(), class, cpus)
        })
        .collect()
}

/// Refuses settings whose power classes the host cannot apply to `pools` (module docs), naming
/// the key and the file that set it.
pub(crate) fn check_power(
    settings: &Settings,
    topo: &Topology,
    pools: &[Pool],
) -> Result<(), Box<ConfigError>> {
    if settings.power.classes.is_empty() {
        return Ok(());
    }
    let power_fs = PowerFs::new(&settings.paths.sysfs_root);
    let fs = Facts::new(&power_fs);
    let by_name: BTreeMap<String, CpuSet> =
        pools.iter().map(|p| (p.name.to_string(), p.cpus.clone())).collect();
    // An uncore die is shared by every pool on it: two pools may not ask it for different values.
    let mut dies: BTreeMap<String, (String, String)> = BTreeMap::new();
    for (name, class, cpus) in scopes(&settings.power, topo, &by_name) {
        for plan in plan_class(&fs, topo, name, class, &cpus) {
            let key = power_key(name, plan.key);
            let file = settings.origins.file_for(&key).unwrap_or_default();
            let writes = match plan.writes {
                Ok(w) => w,
                Err(Refusal::Unsupported(missing)) => {
                    return Err(Box::new(ConfigError::Unsupported {
                        file,
                        key,
                        missing: missing.to_string(),
                    }))
                }
                Err(Refusal::Invalid(unfit)) => {
                    return Err(Box::new(ConfigError::Invalid { file, key, reason: unfit.to_string() }))
                }
            };
            if !plan.key.starts_with("uncore_") {
                continue;
            }
            for (f, value) in writes {
                match dies.get(&f) {
                    Some((other, v)) if *v != value => {
                        let reason = format!(
                            "pool `{other}` shares the die of `{}` and sets it to {v} kHz, not {value}",
                            fs.root().join(&f).display()
                        );
                        return Err(Box::new(ConfigError::Invalid { file, key, reason }));
                    }
                    _ => {
                        dies.insert(f, (name.to_owned(), value));
                    }
                }
            }
        }
    }
    Ok(())
}

/// What [`PowerManager::write_all`] left: what each file holds (read back), and why those that
/// do not hold their value do not.
#[derive(Debug, Default)]
struct Written {
    held: BTreeMap<String, Result<String, String>>,
    failed: BTreeMap<String, String>,
}

/// The cpufreq files a class writes (see [`crate::core::power::plan`]).
const CPUFREQ_FILES: [&str; 4] =
    ["scaling_governor", "scaling_min_freq", "scaling_max_freq", "energy_performance_preference"];

/// Why the remembered `value` of `file` is not one this daemon could have recorded, or `None`
/// when it is: `file` must be one a class writes ([`plan_class`]: PM QoS resume latency of a CPU,
/// a cpufreq policy's governor, frequency limits or EPP, an uncore die's frequency limits), of
/// a CPU of the host (`online`, when known), and `value` what such a file holds (a frequency
/// within the limits the CPU or die reports, a governor or preference it offers). The files
/// are read by `fs`; a limit that cannot be read is not held against the value.
fn refuse_remembered(fs: &PowerFs, online: Option<&CpuSet>, file: &str, value: &str) -> Option<String> {
    let number = |v: &str| v.parse::<u64>().map_err(|_| format!("`{}` is not a number", v.escape_debug()));
    let within = |dir: &str, lo: &str, hi: &str| -> Option<String> {
        let v = match number(value) {
            Ok(v) => v,
            Err(e) => return Some(e),
        };
        let limit = |name: &str| fs.read_number(&format!("{dir}/{name}")).ok();
        match (limit(lo), limit(hi)) {
            (Some(lo), _) if v < lo => Some(format!("{v} is below the minimum {lo}")),
            (_, Some(hi)) if v > hi => Some(format!("{v} is above the maximum {hi}")),
            _ => None,
        }
    };
    let offered = |dir: &str, list: &str| -> Option<String> {
        if !crate::core::power::is_word(value) {
            return Some(format!("`{}` is not a word the kernel lists", value.escape_debug()));
        }
        let words = fs.read(&format!("{dir}/{list}")).ok()?;
        (!words.split_whitespace().any(|w| w == value))
            .then(|| format!("`{value}` is not in {list} ({words})"))
    };
    let cpu_of = |n: &str| -> Result<u32, String> {
        let cpu: u32 = n.parse().ok().filter(|_| n.bytes().all(|b| b.is_ascii_digit())).ok_or("not a CPU")?;
        match online {
            Some(on) if !on.contains(cpu) => Err(format!("CPU {cpu} is not an online CPU of this host")),
            _ => Ok(cpu),
        }
    };
    let Some(rest) = file.strip_prefix(CPU_DIR).and_then(|r| r.strip_prefix('/')) else {
        return Some("not a file below the CPUs' sysfs directory".into());
    };
    let parts: Vec<&str> = rest.split('/').collect();
    let not_ours = || Some("not a file a power class writes".to_owned());
    match parts[..] {
        [cpu, "power", "pm_qos_resume_latency_us"] if cpu.starts_with("cpu") => {
            if let Err(e) = cpu_of(&cpu[3..]) {
                return Some(e);
            }
            crate::core::power::parse_resume_latency(value).err()
        }
        [cpu, "cpufreq", name] | ["cpufreq", cpu, name]
            if CPUFREQ_FILES.contains(&name) && (cpu.starts_with("cpu") || cpu.starts_with("policy")) =>
        {
            let n = cpu.trim_start_matches("cpu").trim_start_matches("policy");
            if let Err(e) = cpu_of(n) {
                return Some(e);
            }
            let dir = file.rsplit_once('/').map_or("", |(d, _)| d);
            match name {
                "scaling_governor" => offered(dir, "scaling_available_governors"),
                "energy_performance_preference" if value.parse::<u8>().is_ok() => None,
                "energy_performance_preference" => offered(dir, "energy_performance_available_preferences"),
                _ => within(dir, "cpuinfo_min_freq", "cpuinfo_max_freq"),
            }
        }
        ["intel_uncore_frequency", die, "min_freq_khz" | "max_freq_khz"] => {
            let ok =
                die.strip_prefix("package_").and_then(|d| d.split_once("_die_")).is_some_and(|(p, d)| {
                    [p, d].iter().all(|n| n.len() == 2 && n.bytes().all(|b| b.is_ascii_digit()))
                });
            if !ok {
                return not_ours();
            }
            let dir = file.rsplit_once('/').map_or("", |(d, _)| d);
            within(dir, "initial_min_freq_khz", "initial_max_freq_khz")
        }
        _ => not_ours(),
    }
}

/// The engine's power state (public for benches/classes.rs, which times a pass).
pub struct PowerManager {
    fs: PowerFs,
    config: Power,
    memory: Remembered<Memory>,
    /// Whether the memory read at start was checked against the host's CPUs
    /// ([`PowerManager::check_memory`]).
    checked: bool,
    rows: Vec<ClassRow>,
}

impl PowerManager {
    /// Set up from `settings`, reading the memory a previous run left.
    pub fn new(settings: &Settings) -> PowerManager {
        let memory: Remembered<Memory> = Remembered::load(&settings.paths.state_dir, MEMORY);
        if !memory.files.is_empty() {
            log::info!("power: {} values remembered from an earlier run", memory.files.len());
        }
        let mut m = PowerManager {
            fs: PowerFs::new(&settings.paths.sysfs_root),
            config: settings.power.clone(),
            memory,
            checked: false,
            rows: Vec::new(),
        };
        m.check_memory(None);
        m
    }

    /// Forgets every remembered value that is not one the daemon could have recorded
    /// ([`refuse_remembered`]; `online`: the host's CPUs, when known), with an error naming the
    /// file, and saves the memory without them: a value put there by hand or by another program
    /// is never written to the kernel.
    fn check_memory(&mut self, online: Option<&CpuSet>) {
        let path = self.memory.path();
        let mut refused = false;
        let fs = &self.fs;
        self.memory.files.retain(|file, value| match refuse_remembered(fs, online, file, value) {
            None => true,
            Some(why) => {
                log::error!(
                    "power: `{}` remembers `{}` = `{}`, which cpupoold does not write: {why}; it is not restored",
                    path.display(),
                    file.escape_debug(),
                    value.escape_debug()
                );
                refused = true;
                false
            }
        });
        if refused {
            self.memory.save_or_log();
        }
        self.checked |= online.is_some();
    }

    /// Takes new settings (a reload; public for benches/classes.rs).
    pub fn configure(&mut self, settings: &Settings) {
        self.config = settings.power.clone();
        self.fs = PowerFs::new(&settings.paths.sysfs_root);
    }

    /// One row per configured key and class, as the last pass left them.
    pub fn report(&self) -> Vec<ClassRow> {
        self.rows.clone()
    }

    /// Writes `value` to `file` unless it holds it; then, for files whose read-back differs,
    /// once more: a minimum above the current maximum is taken only after the maximum is
    /// raised, so min/max pairs settle on the second round in either direction.
    fn write_all(&self, writes: &[(String, String)]) -> Written {
        let mut out = Written::default();
        let mut todo: Vec<&(String, String)> = writes.iter().collect();
        for round in 0..2 {
            out.failed.clear();
            for (file, value) in todo {
                let held = self.fs.read(file).map_err(|e| error_chain(&e));
                if held.as_deref() == Ok(value.as_str()) {
                    out.held.insert(file.clone(), held);
                    continue;
                }
                if let Err(e) = self.fs.write(file, value) {
                    out.failed.insert(file.clone(), error_chain(&e));
                    out.held.insert(file.clone(), held);
                    continue;
                }
                let now = self.fs.read(file).map_err(|e| error_chain(&e));
                match &now {
                    Ok(now) if now == value => {
                        if round == 0 {
                            log::debug!("power: `{file}` = {value}");
                        }
                    }
                    Ok(now) => {
                        out.failed
                            .insert(file.clone(), format!("wrote `{value}` to `{file}`, it holds `{now}`"));
                    }
                    Err(e) => {
                        out.failed.insert(file.clone(), e.clone());
                    }
                }
                out.held.insert(file.clone(), now);
            }
            todo = writes.iter().filter(|(f, _)| out.failed.contains_key(f)).collect();
            if todo.is_empty() {
                break;
            }
        }
        out
    }

    /// One pass (module docs) over the pools' CPUs now.
    pub fn apply(&mut self, topo: &Topology, pools: &BTreeMap<String, CpuSet>) {
        if !self.checked {
            self.check_memory(Some(&topo.online()));
        }
        let facts = Facts::new(&self.fs);
        let plans: Vec<KeyPlan> = scopes(&self.config, topo, pools)
            .into_iter()
            .flat_map(|(name, class, cpus)| plan_class(&facts, topo, name, class, &cpus))
            .collect();
        let mut desired: BTreeMap<String, String> = BTreeMap::new();
        for p in &plans {
            if let Ok(w) = &p.writes {
                desired.extend(w.iter().cloned());
            }
        }
        // Remember before writing: a crash after any write finds the value it replaced on disk.
        let before = (*self.memory).clone();
        for file in desired.keys() {
            if !self.memory.files.contains_key(file) {
                if let Ok(now) = self.fs.read(file) {
                    self.memory.files.insert(file.clone(), now);
                }
            }
        }
        if *self.memory != before && !self.memory.save_or_log() {
            *self.memory = before;
            let why = "the values found could not be saved, so nothing was written".to_owned();
            self.rows =
                plans.iter().map(|p| row(p, String::new(), ClassState::Degraded(why.clone()))).collect();
            return;
        }
        let writes: Vec<(String, String)> = desired.iter().map(|(f, v)| (f.clone(), v.clone())).collect();
        let written = self.write_all(&writes);
        // Files no class wants any more get their value back.
        let stale: Vec<(String, String)> = self
            .memory
            .files
            .iter()
            .filter(|(f, _)| !desired.contains_key(*f))
            .map(|(f, v)| (f.clone(), v.clone()))
            .collect();
        self.restore(&stale);
        let rows: Vec<ClassRow> = plans.iter().map(|p| row_for(p, &written)).collect();
        // Said when a row changes, not at every drift check.
        for r in rows.iter().filter(|r| !self.rows.contains(r)) {
            match &r.state {
                ClassState::Applied => log::info!(
                    POOL = r.pool.as_str();
                    "power: {} {} = {} on CPUs {} (the kernel shows {}){}",
                    r.pool, r.key, r.wanted, r.scope, r.in_force, self.idle_note(r)
                ),
                ClassState::Degraded(why) | ClassState::Unsupported(why) => {
                    log::warn!(POOL = r.pool.as_str(); "power: {} {}: {why}", r.pool, r.key)
                }
            }
        }
        self.rows = rows;
    }

    /// For an applied resume latency: which of the first CPU's idle states (cpuidle, read only)
    /// it leaves usable, as the cpuidle governors skip states whose exit latency exceeds it.
    fn idle_note(&self, r: &ClassRow) -> String {
        let Some(cpu) = CpuSet::parse(&r.scope).ok().and_then(|c| c.first()) else { return String::new() };
        let states = self.fs.idle_states(cpu);
        if r.key != "resume_latency_us" || states.is_empty() {
            return String::new();
        }
        let limit: u64 = r.wanted.parse().unwrap_or(0);
        let usable: Vec<&str> =
            states.iter().filter(|s| s.latency_us <= limit).map(|s| s.name.as_str()).collect();
        match usable.as_slice() {
            [] => "; no idle state is used".to_owned(),
            u => format!("; idle states used: {}", u.join(", ")),
        }
    }

    /// Writes remembered values back and forgets those that hold (or whose file is gone).
    fn restore(&mut self, files: &[(String, String)]) {
        if files.is_empty() {
            return;
        }
        let files: Vec<(String, String)> = files
            .iter()
            .filter(|(f, v)| refuse_remembered(&self.fs, None, f, v).is_none())
            .cloned()
            .collect();
        let written = self.write_all(&files);
        for (file, value) in &files {
            match written.failed.get(file) {
                None => {
                    log::info!("power: `{file}` back to {value}");
                    self.memory.files.remove(file);
                }
                Some(_) if !self.fs.exists(file) => {
                    log::info!("power: `{file}` is gone (its CPU went offline?); its value is forgotten");
                    self.memory.files.remove(file);
                }
                Some(why) => log::warn!("power: restoring: {why}"),
            }
        }
        self.memory.save_or_log();
    }

    /// Writes every remembered value back (the daemon stops).
    pub fn restore_all(&mut self) {
        let files: Vec<(String, String)> =
            self.memory.files.iter().map(|(f, v)| (f.clone(), v.clone())).collect();
        self.restore(&files);
    }
}

/// The row of `p` from what the writes read back.
fn row_for(p: &KeyPlan, written: &Written) -> ClassRow {
    let writes = match &p.writes {
        Ok(w) => w,
        Err(Refusal::Unsupported(m)) => return row(p, String::new(), ClassState::Unsupported(m.to_string())),
        Err(Refusal::Invalid(r)) => return row(p, String::new(), ClassState::Degraded(r.to_string())),
    };
    let mut seen = BTreeSet::new();
    let mut in_force = Vec::new();
    let mut wrong = Vec::new();
    for (file, value) in writes {
        match written.held.get(file) {
            Some(Ok(now)) => {
                if now != value {
                    let why = written.failed.get(file).cloned();
                    wrong.push(why.unwrap_or_else(|| format!("`{file}` holds `{now}`, not `{value}`")));
                }
                if seen.insert(now.clone()) {
                    in_force.push(now.clone());
                }
            }
            Some(Err(e)) => wrong.push(e.clone()),
            None => wrong.push(format!("`{file}` was not written")),
        }
    }
    let state = match wrong.first() {
        None => ClassState::Applied,
        Some(w) if wrong.len() == 1 => ClassState::Degraded(w.clone()),
        Some(w) => ClassState::Degraded(format!("{w} (and {} more)", wrong.len() - 1)),
    };
    row(p, in_force.join(","), state)
}

fn row(p: &KeyPlan, in_force: String, state: ClassState) -> ClassRow {
    ClassRow {
        pool: p.pool.clone(),
        class: ClassKind::Power,
        key: p.key.to_owned(),
        wanted: p.wanted.clone(),
        in_force,
        scope: p.cpus.to_string(),
        state,
    }
}

impl Keeper for PowerManager {
    fn configure(&mut self, settings: &Settings) {
        PowerManager::configure(self, settings);
    }

    /// One power pass over the current pools (see [`PowerManager`]); no pool events.
    fn keep(&mut self, scene: &Scene<'_>) -> Vec<Event> {
        let pools: BTreeMap<String, CpuSet> =
            scene.state.pools().values().map(|p| (p.name.to_string(), p.cpus.clone())).collect();
        self.apply(scene.topo, &pools);
        Vec::new()
    }

    fn publish(&self, reports: &mut Reports) {
        reports.update(|rows: &mut Vec<crate::core::classes::ClassRow>| rows.extend(self.report()));
    }

    /// Puts every power value back, if so configured (the daemon stops).
    fn stop(&mut self) {
        if self.config.restore_on_stop {
            self.restore_all();
        }
    }
}

#[cfg(test)]
mod tests;
