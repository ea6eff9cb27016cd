//! The D-Bus interface as shipped: `dbus/org.cpupool.Manager1.xml` (installed to
//! `/usr/share/dbus-1/interfaces/` by the packages, and served by the daemon; a test keeps
//! the two equal).

/// The introspection XML of `org.cpupool.Manager1`.
pub const INTROSPECTION_XML: &str = include_str!("../../dbus/org.cpupool.Manager1.xml");

use crate::views::{Assignment, ClassSetting, Cpu, CpuHealth, Pool, PoolIsolation};

/// A [`ClassSetting`] as D-Bus carries it, `(sssssss)`: pool, class, key, wanted, in_force,
/// scope, state, where state is `applied`, `degraded: <why>` or `unsupported: <what is
/// missing>` (the state word never holds a colon).
pub type ClassStruct = (String, String, String, String, String, String, String);

impl From<ClassSetting> for ClassStruct {
    fn from(c: ClassSetting) -> ClassStruct {
        let state = if c.reason.is_empty() { c.state } else { format!("{}: {}", c.state, c.reason) };
        (c.pool, c.class, c.key, c.wanted, c.in_force, c.scope, state)
    }
}

impl From<ClassStruct> for ClassSetting {
    fn from(t: ClassStruct) -> ClassSetting {
        let (pool, class, key, wanted, in_force, scope, state) = t;
        let (state, reason) = match state.split_once(": ") {
            Some((s, r)) => (s.to_owned(), r.to_owned()),
            None => (state, String::new()),
        };
        ClassSetting { pool, class, key, wanted, in_force, scope, state, reason }
    }
}

/// A [`Pool`] as D-Bus carries it, `(ssssttbus)`: name, kind, cpus, free_cpus,
/// free_millicpus, capacity_millicpus, isolated, assignments, partition.
pub type PoolStruct = (String, String, String, String, u64, u64, bool, u32, String);
/// An [`Assignment`] as D-Bus carries it, `(ssstsbsss)`: id, pool, cpus, millicpus, target,
/// reclaim, container, state, reason.
pub type AssignmentStruct = (String, String, String, u64, String, bool, String, String, String);
/// A [`Cpu`] as D-Bus carries it, `(uuuuuu)`: cpu, core, package, die, node, l3.
pub type CpuStruct = (u32, u32, u32, u32, u32, u32);
/// A [`CpuHealth`] as D-Bus carries it, `(uddds)`.
pub type CpuHealthStruct = (u32, f64, f64, f64, String);
/// A [`PoolIsolation`] as D-Bus carries it, `(sssssda(uddds)ss)`: pool, cpus, state, summary,
/// reason, foreign_percent, per_cpu, irqs, kthreads.
pub type PoolIsolationStruct =
    (String, String, String, String, String, f64, Vec<CpuHealthStruct>, String, String);

impl From<Pool> for PoolStruct {
    fn from(p: Pool) -> PoolStruct {
        let Pool {
            name,
            kind,
            cpus,
            free_cpus,
            free_millicpus,
            capacity_millicpus,
            isolated,
            assignments,
            partition,
        } = p;
        (name, kind, cpus, free_cpus, free_millicpus, capacity_millicpus, isolated, assignments, partition)
    }
}

impl From<PoolStruct> for Pool {
    fn from(t: PoolStruct) -> Pool {
        let (
            name,
            kind,
            cpus,
            free_cpus,
            free_millicpus,
            capacity_millicpus,
            isolated,
            assignments,
            partition,
        ) = t;
        Pool {
            name,
            kind,
            cpus,
            free_cpus,
            free_millicpus,
            capacity_millicpus,
            isolated,
            assignments,
            partition,
        }
    }
}

impl From<Assignment> for AssignmentStruct {
    fn from(a: Assignment) -> AssignmentStruct {
        let Assignment { id, pool, cpus, millicpus, target, reclaim, container, state, reason } = a;
        (id, pool, cpus, millicpus, target, reclaim, container, state, reason)
    }
}

impl From<AssignmentStruct> for Assignment {
    fn from(t: AssignmentStruct) -> Assignment {
        let (id, pool, cpus, millicpus, target, reclaim, container, state, reason) = t;
        Assignment { id, pool, cpus, millicpus, target, reclaim, container, state, reason }
    }
}

impl From<Cpu> for CpuStruct {
    fn from(c: Cpu) -> CpuStruct {
        (c.cpu, c.core, c.package, c.die, c.node, c.l3)
    }
}

impl From<CpuStruct> for Cpu {
    fn from(t: CpuStruct) -> Cpu {
        let (cpu, core, package, die, node, l3) = t;
        Cpu { cpu, core, package, die, node, l3 }
    }
}

impl From<CpuHealth> for CpuHealthStruct {
    fn from(c: CpuHealth) -> CpuHealthStruct {
        (c.cpu, c.device_irqs_per_sec, c.ipis_per_sec, c.timer_per_sec, c.sources)
    }
}

impl From<CpuHealthStruct> for CpuHealth {
    fn from(t: CpuHealthStruct) -> CpuHealth {
        let (cpu, device_irqs_per_sec, ipis_per_sec, timer_per_sec, sources) = t;
        CpuHealth { cpu, device_irqs_per_sec, ipis_per_sec, timer_per_sec, sources }
    }
}

impl From<PoolIsolation> for PoolIsolationStruct {
    fn from(p: PoolIsolation) -> PoolIsolationStruct {
        let per_cpu = p.per_cpu.into_iter().map(Into::into).collect();
        (p.pool, p.cpus, p.state, p.summary, p.reason, p.foreign_percent, per_cpu, p.irqs, p.kthreads)
    }
}

impl From<PoolIsolationStruct> for PoolIsolation {
    fn from(t: PoolIsolationStruct) -> PoolIsolation {
        let (pool, cpus, state, summary, reason, foreign_percent, per_cpu, irqs, kthreads) = t;
        let per_cpu = per_cpu.into_iter().map(Into::into).collect();
        PoolIsolation { pool, cpus, state, summary, reason, foreign_percent, per_cpu, irqs, kthreads }
    }
}
