//! The replies both interfaces build from the engine's snapshot, as the wire contract's views
//! ([`cpupool_wire::views`]): pools with their use and partition, assignments with their
//! health, the CPUs, isolation health and the class settings. Handlers call these; D-Bus then
//! turns a view into its structure, varlink sends it as JSON.

use cpupool_wire::views::{self, CpuHealth, PoolIsolation};
use cpupool_wire::ApiError;

use crate::core::boot::{self, Coverage};
use crate::core::cpuset::CpuSet;
use crate::core::pool::Pool;
use crate::core::state::{self, Assignment, AssignmentId, State};
use crate::core::topology::Topology;
use crate::engine::Snapshot;

/// A pool as both interfaces show it (the varlink `Pool` type, the D-Bus `(ssssttbus)`), and
/// the lists of them.
pub struct PoolView;

// The views are the wire contract's types; these unit structs only name their builders.
#[allow(clippy::new_ret_no_self)]
impl PoolView {
    /// `p` with its use and partition in `snap`.
    pub fn new(snap: &Snapshot, p: &Pool) -> views::Pool {
        let state = &snap.state;
        views::Pool {
            name: p.name.to_string(),
            kind: p.kind.to_string(),
            cpus: p.cpus.to_string(),
            free_cpus: state.free_cpus(p).to_string(),
            free_millicpus: state.free_millis(p),
            capacity_millicpus: p.capacity_millis(),
            isolated: p.isolate,
            assignments: u32::try_from(state.usage(&p.name).count).unwrap_or(u32::MAX),
            partition: snap.partitions.get(&p.name).cloned().unwrap_or_default(),
        }
    }

    /// Every pool, in name order.
    pub fn all(snap: &Snapshot) -> Vec<views::Pool> {
        snap.state.pools().values().map(|p| PoolView::new(snap, p)).collect()
    }

    /// The pool called `name`.
    pub fn find(snap: &Snapshot, name: &str) -> Result<views::Pool, ApiError> {
        Ok(PoolView::new(snap, pool_named(&snap.state, name)?))
    }
}

pub(crate) fn pool_named<'a>(state: &'a State, name: &str) -> Result<&'a Pool, ApiError> {
    state
        .pools()
        .values()
        .find(|p| p.name.as_str() == name)
        .ok_or_else(|| state::Error::NoSuchPool { pool: crate::core::echo(name) }.to_api())
}

/// An assignment as both interfaces show it: varlink `Assignment`, D-Bus `(ssstsbsss)`.
pub struct AssignmentView;

// The views are the wire contract's types; these unit structs only name their builders.
#[allow(clippy::new_ret_no_self)]
impl AssignmentView {
    /// `a` as recorded: applied, or allocated when it is a booking for a container (a
    /// `kubelet:` target), as it is when just made.
    pub fn from(a: &Assignment) -> views::Assignment {
        let phase = a.phase(None, false);
        views::Assignment {
            id: a.id.to_string(),
            pool: a.pool.to_string(),
            cpus: a.cpus.to_string(),
            millicpus: a.millicpus,
            target: a.target.to_string(),
            reclaim: a.reclaim,
            container: a.container.as_ref().map(|c| c.to_string()).unwrap_or_default(),
            state: phase.as_str().into(),
            reason: phase.reason().into(),
        }
    }

    /// `a` with its phase in `snap` (allocated, applied or degraded) and the container it
    /// serves.
    pub fn new(snap: &Snapshot, a: &Assignment) -> views::Assignment {
        let mut v = AssignmentView::from(a);
        let phase = snap.phase(a);
        v.state = phase.as_str().into();
        v.reason = phase.reason().into();
        v.container = snap.container_of(a).unwrap_or_default();
        v
    }

    /// All assignments, or those of `pool` (which must exist).
    pub fn list(snap: &Snapshot, pool: Option<&str>) -> Result<Vec<views::Assignment>, ApiError> {
        Ok(AssignmentView::iter(snap, pool)?.collect())
    }

    /// Like [`AssignmentView::list`], one at a time: for encoders that write each as it comes
    /// rather than holding them all.
    pub fn iter<'a>(
        snap: &'a Snapshot,
        pool: Option<&'a str>,
    ) -> Result<impl Iterator<Item = views::Assignment> + 'a, ApiError> {
        if let Some(name) = pool {
            pool_named(&snap.state, name)?;
        }
        Ok(snap
            .state
            .assignments()
            .values()
            .filter(move |a| pool.is_none_or(|p| a.pool.as_str() == p))
            .map(|a| AssignmentView::new(snap, a)))
    }

    /// The assignment `id`.
    pub fn find(snap: &Snapshot, id: &str) -> Result<views::Assignment, ApiError> {
        AssignmentId::new(id)
            .ok()
            .and_then(|k| snap.state.assignments().get(&k))
            .map(|a| AssignmentView::new(snap, a))
            .ok_or_else(|| state::Error::NoSuchAssignment { id: crate::core::echo(id) }.to_api())
    }
}

/// The online CPUs: varlink `Cpu`, D-Bus `(uuuuuu)`.
pub struct CpuView;

impl CpuView {
    /// Every online CPU of `topo`.
    pub fn all(topo: &Topology) -> Vec<views::Cpu> {
        topo.data()
            .cpus
            .iter()
            .map(|(&cpu, p)| views::Cpu {
                cpu,
                core: p.core,
                package: p.package,
                die: p.die,
                node: p.node,
                l3: p.l3,
            })
            .collect()
    }
}

/// The reply of `GetClasses`.
pub struct ClassesReply;

#[allow(clippy::new_ret_no_self)]
impl ClassesReply {
    /// The class rows of the pool `name` (`(idle)` for the CPUs in no pool), or of every pool
    /// when `name` is empty. A pool without classes has none.
    pub fn new(snap: &Snapshot, name: &str) -> Result<views::Classes, ApiError> {
        if !name.is_empty() && name != crate::core::classes::IDLE_CPUS {
            pool_named(&snap.state, name)?;
        }
        let classes = snap
            .report::<Vec<crate::core::classes::ClassRow>>()
            .iter()
            .filter(|r| name.is_empty() || r.pool == name)
            .map(|r| views::ClassSetting {
                pool: r.pool.clone(),
                class: r.class.as_str().to_owned(),
                key: r.key.clone(),
                wanted: r.wanted.clone(),
                in_force: r.in_force.clone(),
                scope: r.scope.clone(),
                state: r.state.as_str().to_owned(),
                reason: r.state.why().to_owned(),
            })
            .collect();
        Ok(views::Classes { classes })
    }
}

/// The reply of `GetIsolation`.
pub struct IsolationReply;

// The views are the wire contract's types; these unit structs only name their builders.
#[allow(clippy::new_ret_no_self)]
impl IsolationReply {
    /// Isolation of the pool `name`, or of every isolated pool when `name` is empty. A pool
    /// that is not isolated has an empty list.
    pub fn new(snap: &Snapshot, name: &str) -> Result<views::Isolation, ApiError> {
        if !name.is_empty() {
            pool_named(&snap.state, name)?;
        }
        let iso = snap.report::<crate::engine::IsolationReport>();
        let pools = iso
            .pools
            .iter()
            .filter(|(n, _)| name.is_empty() || n.as_str() == name)
            .map(|(n, p)| PoolIsolation {
                pool: n.to_string(),
                cpus: p.cpus.to_string(),
                state: p.state().to_owned(),
                summary: p.summary(),
                reason: p.invalid.clone().unwrap_or_default(),
                foreign_percent: p.health.as_ref().and_then(|h| h.foreign_percent).unwrap_or(-1.0),
                per_cpu: p
                    .health
                    .iter()
                    .flat_map(|h| &h.cpus)
                    .map(|c| CpuHealth {
                        cpu: c.cpu,
                        device_irqs_per_sec: c.device_per_sec,
                        ipis_per_sec: c.ipi_per_sec,
                        timer_per_sec: c.timer_per_sec,
                        sources: c
                            .sources
                            .iter()
                            .map(|s| {
                                format!(
                                    "{} {} {}/s",
                                    s.irq,
                                    s.name,
                                    crate::core::housekeeping::rate(s.per_sec)
                                )
                            })
                            .collect::<Vec<_>>()
                            .join(", "),
                        noise: c
                            .noise
                            .iter()
                            .map(|n| views::Noise { source: n.source.clone(), per_sec: n.per_sec })
                            .collect(),
                    })
                    .collect(),
                irqs: snap.report::<crate::engine::IrqReport>().summary(),
                kthreads: iso.kthreads.summary(),
                boot: Coverage::of(&p.cpus, &iso.kernel.boot, &iso.kernel.nohz_full).summary(),
            })
            .collect();
        let isolated = iso.pools.values().fold(CpuSet::new(), |a, p| a.union(&p.cpus));
        let workqueue = iso
            .masks
            .iter()
            .find(|m| m.file == crate::host::housekeeping::WORKQUEUE_MASK)
            .map(|m| format!("{} ({})", m.mask, m.by))
            .unwrap_or_default();
        Ok(views::Isolation {
            isolcpus: iso.kernel.boot.isolcpus.to_string(),
            nohz_full: iso.kernel.boot.nohz_full.union(&iso.kernel.nohz_full).to_string(),
            housekeeping: iso.housekeeping.to_string(),
            workqueue,
            pools,
            rcu_nocbs: iso.kernel.boot.rcu_nocbs.to_string(),
            boot_line: boot::boot_line(&isolated),
            boot_unused: boot::unused(
                &iso.kernel.boot,
                &iso.kernel.nohz_full,
                &iso.kernel.isolated,
                &isolated,
            )
            .to_string(),
        })
    }
}
