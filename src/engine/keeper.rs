//! The keepers of host settings beside the cpusets, behind one contract, driven from one place.
//!
//! A keeper owns one kind of host setting that follows the pools: device interrupts off
//! isolated CPUs (`irq`), the sysfs files of the power classes (`power`), the resctrl groups of
//! the cache classes (`cache`), and kernel housekeeping off isolated CPUs with the partitions'
//! validity (`housekeeping`: workqueue masks, kernel threads). Each runs the same lifecycle, the
//! [`Keeper`] trait:
//!
//! 1. **check**: new settings are checked against the host before the engine takes them
//!    ([`super::keepers::check`], at start and before a reload or pool edit is installed); a key the host cannot
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
//! The engine drives them all from one place, [`super::keepers`]: after start's reconcile, every
//! installed configuration, every drift check, reapply and move of the partitions, and on the
//! way out. A new keeper implements [`Keeper`] in its own file and is registered by one line in
//! [`super::keepers::Keepers::new`] (plus its check in [`super::keepers::check`], if it has one).
//! This file is the contract alone: it names no keeper.
//!
//! **When they pass** ([`Pass`]) is the one place they differ, and the contract says it with one
//! method, [`Keeper::reads_layout`]: interrupts, power and cache follow the pools and the
//! settings, so they pass for settings that changed nothing else, and not for a reconcile that
//! only applied the cpusets again; housekeeping reads back what the kernel made of the cpuset
//! layout (an `isolated invalid` partition), so it passes after every reconcile, also one with
//! no new settings, and not for settings that left the layout alone. Both pass for a change of
//! the pools and at each drift check. Housekeeping also joins later than the others (the daemon
//! adds it after start, and tests without it leave it out) and has a health tick of its own, so
//! the registry holds it by type.
//!
//! They are trait objects because the engine treats them alike everywhere but in their reports,
//! which each puts under its own type in the snapshot ([`super::Reports`]).
use super::handle::Reports;
use super::Event;
use crate::config::Settings;
use crate::core::plan::Partitions;
use crate::core::state::State;
use crate::core::topology::Topology;
use crate::host::Backend;

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
    pub(super) fn includes(self, keeper: &dyn Keeper) -> bool {
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
