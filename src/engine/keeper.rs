//! The keepers of host settings beside the cpusets, behind one contract, driven from one place.
//!
//! A keeper owns one kind of host setting that follows the pools: device interrupts off
//! isolated CPUs (`irq`), the sysfs files of the power classes (`power`), the resctrl groups of
//! the cache classes (`cache`), and kernel housekeeping off isolated CPUs with the partitions'
//! validity (`housekeeping`: workqueue masks, kernel threads). Each runs the same lifecycle, the
//! [`Keeper`] trait:
//!
//! 1. **check**: new settings are checked against the host before the engine takes them
//!    ([`check`], at start and before a reload or pool edit is installed); a key the host cannot
//!    honour refuses the configuration, naming it, and nothing changes;
//! 2. **configure**: the engine hands over settings it installed ([`Keeper::configure`]);
//! 3. **keep**: one pass over the pools as they are now ([`Keeper::keep`]): plan (the pure part
//!    in `core`), remember what is about to change (a [`crate::host::store::Remembered`] value,
//!    durable before the first write, so a crash finds it), write what differs, read it back,
//!    and report what holds and what does not, returning the events of pools whose report
//!    changed;
//! 4. **publish**: the last pass's report goes into each snapshot ([`Keeper::publish`]);
//! 5. **restore**: when the daemon stops, what was remembered is put back, if so configured
//!    ([`Keeper::stop`]); a restart after a crash restores what no pool wants any more at its
//!    first pass.
//!
//! The engine drives them all from here: [`Engine::keep_host`] after start's reconcile, every
//! installed configuration ([`Engine::reconfigure_keepers`]), every drift check, reapply and
//! move of the partitions, and [`Engine::stop_keepers`] on the way out. A new keeper implements
//! [`Keeper`] in its own file and is registered by one line in [`Keepers::new`] (plus its check
//! in [`check`], if it has one).
//!
//! **When they pass** ([`Pass`]) is the one place they differ, and the contract says it with one
//! method, [`Keeper::reads_layout`]: interrupts, power and cache follow the pools and the
//! settings, so they pass for settings that changed nothing else, and not for a reconcile that
//! only applied the cpusets again; housekeeping reads back what the kernel made of the cpuset
//! layout (an `isolated invalid` partition), so it passes after every reconcile, also one with
//! no new settings, and not for settings that left the layout alone. Both pass for a change of
//! the pools and at each drift check. Housekeeping also joins later than the others (the daemon
//! adds it after start, [`Engine::with_housekeeping`], and tests without it leave it out) and
//! has a health tick of its own ([`Engine::sample_isolation`]), so [`Keepers`] holds it by type.
//!
//! They are trait objects because the engine treats them alike everywhere but in their reports,
//! which each puts under its own type in the snapshot ([`super::Reports`]).
use super::housekeeping::Housekeeping;
use super::{cache, irq, power, Engine, Event};
use crate::config::{ConfigError, Settings};
use crate::core::plan::Partitions;
use crate::core::pool::Pool;
use crate::core::state::State;
use crate::core::topology::Topology;
use crate::host::Backend;

use super::handle::Reports;

/// What a pass looks at: the pools as the state holds them now, the host's CPUs, and the
/// cpuset layout as applied.
pub(crate) struct Scene<'a> {
    /// The committed state.
    pub state: &'a State,
    /// The topology the state was laid out on.
    pub topo: &'a Topology,
    /// The backend that applied the layout, to read its partitions back.
    pub backend: &'a dyn Backend,
    /// Where the layout makes the isolated pools' partitions.
    pub partitions: Partitions,
}

/// Why the engine runs a pass, which decides the keepers that pass (module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pass {
    /// The pools as they are now: after start's reconcile, at a drift check, or for installed
    /// settings that changed the pools or the layout. Every keeper passes.
    Pools,
    /// Installed settings that left the pools and the layout as they were: the keepers that do
    /// not read the layout back.
    Settings,
    /// The cpusets applied again with the pools and settings as they were (a reapply, isolated
    /// partitions moved for the kubelet's pod cgroup, housekeeping joining after start): the
    /// keepers that read the layout back.
    Layout,
}

impl Pass {
    fn includes(self, keeper: &dyn Keeper) -> bool {
        match self {
            Pass::Pools => true,
            Pass::Settings => !keeper.reads_layout(),
            Pass::Layout => keeper.reads_layout(),
        }
    }
}

/// One keeper's lifecycle (module docs).
pub(crate) trait Keeper: Send {
    /// Takes new settings (start's are given to its constructor; this is a reload or pool edit).
    fn configure(&mut self, settings: &Settings);
    /// One pass over `scene`: plan, remember, write, read back, report; the events of pools
    /// whose report changed, to publish.
    fn keep(&mut self, scene: &Scene<'_>) -> Vec<Event>;
    /// Whether a pass reads back what the kernel made of the cpuset layout rather than follows
    /// the settings: such a keeper passes after every reconcile ([`Pass::Layout`]) and not for
    /// settings alone ([`Pass::Settings`]); the others the other way round.
    fn reads_layout(&self) -> bool {
        false
    }
    /// Waits for work a pass handed to a thread of its own (start does, before the daemon says
    /// it is ready).
    fn settle(&mut self) {}
    /// Puts the last pass's report under its type, for the snapshot being built.
    fn publish(&self, reports: &mut Reports);
    /// Puts back what it remembers, if so configured (the daemon stops).
    fn stop(&mut self);
}

/// Every keeper, in the order they pass: housekeeping last, once it has joined.
pub(crate) struct Keepers {
    /// Interrupts, power classes, cache classes.
    keepers: Vec<Box<dyn Keeper>>,
    /// Housekeeping, held by type for its health tick; `None` until
    /// [`Engine::with_housekeeping`].
    housekeeping: Option<Housekeeping>,
}

/// What [`check`] prepared for the keepers it checked.
pub(crate) struct Checked {
    cache: cache::Prepared,
}

/// Checks new settings against the host for every keeper that checks (module docs).
pub(crate) fn check(
    settings: &Settings,
    topo: &Topology,
    pools: &[Pool],
) -> Result<Checked, Box<ConfigError>> {
    super::housekeeping::check_housekeeping(settings, pools)?;
    let cache = cache::check(settings).map_err(Box::new)?;
    power::check_power(settings, topo, pools)?;
    Ok(Checked { cache })
}

impl Keepers {
    /// Every keeper, set up from `settings` as [`check`]ed, reading what earlier runs remembered.
    pub(crate) fn new(settings: &Settings, checked: Checked) -> Keepers {
        let keepers: Vec<Box<dyn Keeper>> = vec![
            Box::new(irq::IrqManager::new(settings)),
            Box::new(power::PowerManager::new(settings)),
            Box::new(cache::CacheManager::new(checked.cache)),
        ];
        Keepers { keepers, housekeeping: None }
    }

    /// Adds housekeeping, which passes after the others.
    pub(crate) fn join_housekeeping(&mut self, hk: Housekeeping) {
        self.housekeeping = Some(hk);
    }

    /// Housekeeping, once it has joined.
    pub(crate) fn housekeeping(&mut self) -> Option<&mut Housekeeping> {
        self.housekeeping.as_mut()
    }

    fn iter(&self) -> impl Iterator<Item = &dyn Keeper> {
        let hk = self.housekeeping.iter().map(|h| h as &dyn Keeper);
        self.keepers.iter().map(|k| &**k).chain(hk)
    }

    fn iter_mut(&mut self) -> impl Iterator<Item = &mut dyn Keeper> {
        let hk = self.housekeeping.iter_mut().map(|h| h as &mut dyn Keeper);
        self.keepers.iter_mut().map(|k| &mut **k as &mut dyn Keeper).chain(hk)
    }
}

impl Engine {
    /// One pass over the current pools of the keepers that pass for `pass`; the events of
    /// pools whose reports changed.
    pub(crate) fn keep_host(&mut self, pass: Pass) -> Vec<Event> {
        let scene = Scene {
            state: &self.state,
            topo: &self.topo,
            backend: &*self.backend,
            partitions: self.opts.partitions,
        };
        let mut events = Vec::new();
        for k in self.keepers.iter_mut().filter(|k| pass.includes(&**k)) {
            events.extend(k.keep(&scene));
        }
        events
    }

    /// Hands every keeper installed settings, then runs a pass for `pass`.
    pub(crate) fn reconfigure_keepers(&mut self, settings: &Settings, pass: Pass) -> Vec<Event> {
        for k in self.keepers.iter_mut() {
            k.configure(settings);
        }
        self.keep_host(pass)
    }

    /// Waits for what the last passes handed to threads (see [`Keeper::settle`]).
    pub(crate) fn settle_keepers(&mut self) {
        for k in self.keepers.iter_mut() {
            k.settle();
        }
    }

    /// Every keeper's report, for the snapshot being built.
    pub(crate) fn keepers_reports(&self) -> Reports {
        let mut reports = Reports::default();
        for k in self.keepers.iter() {
            k.publish(&mut reports);
        }
        reports
    }

    /// Every keeper puts back what it remembers, if so configured (the daemon stops).
    pub(crate) fn stop_keepers(&mut self) {
        for k in self.keepers.iter_mut() {
            k.stop();
        }
    }
}
