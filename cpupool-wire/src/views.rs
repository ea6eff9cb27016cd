//! The types replies carry, with the IDL's field names: the daemon builds them, varlink sends
//! them as JSON and D-Bus as the structures of the introspection XML, and `cpupoolctl` prints
//! them, so `--json` documents are the same whichever transport answered.
//!
//! Fields a newer daemon added have serde defaults, so a client still reads an older one.

use serde::{Deserialize, Serialize};

/// A pool resolved against the host: varlink `Pool`, D-Bus `(ssssttbus)`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pool {
    /// The name.
    pub name: String,
    /// `reserved`, `exclusive` or `shared`.
    pub kind: String,
    /// All its CPUs, a kernel CPU list.
    pub cpus: String,
    /// Exclusive pools: the CPUs no assignment owns; other pools: all of them.
    pub free_cpus: String,
    /// Capacity not yet assigned.
    pub free_millicpus: u64,
    /// 1000 per CPU.
    pub capacity_millicpus: u64,
    /// Whether it runs as an isolated cpuset partition.
    pub isolated: bool,
    /// How many assignments it has.
    pub assignments: u32,
    /// The kernel's word on its partition (`member`, `isolated`, `isolated invalid (...)`);
    /// empty for the reserved pool, which has no slice of its own.
    #[serde(default)]
    pub partition: String,
}

/// CPUs given to a target: varlink `Assignment`, D-Bus `(ssstsbsss)`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Assignment {
    /// Its id.
    pub id: String,
    /// Its pool.
    pub pool: String,
    /// The CPUs the target may run on.
    pub cpus: String,
    /// Capacity held.
    pub millicpus: u64,
    /// `unit:NAME`, `cgroup:PATH` or `pid:N`.
    pub target: String,
    /// Released when the target goes away.
    #[serde(default = "yes")]
    pub reclaim: bool,
    /// Kubelet assignments: `NAMESPACE/POD/CONTAINER` of the container holding the devices (a
    /// DRA claim's: the container it is bound to, or one running on its CPUs); empty otherwise.
    #[serde(default)]
    pub container: String,
    /// `allocated` (booked for a container the kubelet allocated them to, a device plugin
    /// allocation or a prepared DRA claim, that does not run on them yet: nothing enforces
    /// them), `applied` (the kernel enforces its CPUs on the target, as last read back; a
    /// kubelet allocation: in its running container's cgroup) or `degraded` (it does not, and
    /// correcting it failed).
    #[serde(default = "applied")]
    pub state: String,
    /// Why it is degraded; empty when applied.
    #[serde(default)]
    pub reason: String,
}

/// An optional string where `""` is absent (the D-Bus form of an absent reason).
fn empty_is_none<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    Ok(Option::<String>::deserialize(d)?.filter(|s| !s.is_empty()))
}

fn applied() -> String {
    "applied".into()
}

fn yes() -> bool {
    true
}

/// One online CPU: varlink `Cpu`, D-Bus `(uuuuuu)`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cpu {
    /// Logical CPU number.
    pub cpu: u32,
    /// Core id.
    pub core: u32,
    /// Package (socket).
    pub package: u32,
    /// Die.
    pub die: u32,
    /// NUMA node.
    pub node: u32,
    /// L3 cache group.
    pub l3: u32,
}

/// The reply of `GetTopology`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Topology {
    /// Online CPUs.
    pub online: String,
    /// Offline CPUs.
    pub offline: String,
    /// Kernel-isolated CPUs (`isolcpus=`).
    pub isolated: String,
    /// Every online CPU and where it sits.
    pub cpus: Vec<Cpu>,
}

/// The reply of `Status`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Status {
    /// The daemon's version.
    pub version: String,
    /// Seconds since the daemon started.
    pub uptime_seconds: u64,
    /// Number of pools.
    pub pools: u64,
    /// Number of assignments.
    pub assignments: u64,
    /// Where the state is kept.
    pub state_file: String,
    /// Why the configuration on disk is not the one running, if it is not: always present in
    /// the JSON (`null` when the configuration runs; D-Bus, which has no optionals, says `""`,
    /// which decodes as `None` too).
    #[serde(default, deserialize_with = "empty_is_none")]
    pub config_error: Option<String>,
    /// Assignments the kernel does not enforce as assigned.
    #[serde(default)]
    pub degraded_assignments: u64,
    /// How the kubelet's containers get their CPUs (NRI at creation, or the PodResources poll
    /// after they start) and what it costs; absent without the device plugin.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub containers: Option<String>,
}

/// A committed change, as `Monitor` streams it (varlink `Event`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    /// `pool` or `assignment`.
    pub kind: String,
    /// The pool, for pool events.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool: Option<String>,
    /// The assignment id, for assignment events.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// pool: `current` (the initial replay) or `changed`; assignment: `added`, `removed`,
    /// `degraded`, `restored`, `applied` (its container runs on its CPUs, read back) or
    /// `allocated` (booked for a container that does not run).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub change: Option<String>,
}

impl Event {
    /// A pool event.
    pub fn pool(name: &str, change: &str) -> Event {
        Event { kind: "pool".into(), pool: Some(name.into()), id: None, change: Some(change.into()) }
    }

    /// An assignment event.
    pub fn assignment(id: &str, change: &str) -> Event {
        Event { kind: "assignment".into(), pool: None, id: Some(id.into()), change: Some(change.into()) }
    }
}

/// One source of interruptions on an isolated CPU: varlink `Noise`, D-Bus `(sd)`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Noise {
    /// `timer:LOC` (the tick), `ipi:CAL`/`ipi:RES`/`ipi:TLB`/... (each IPI kind by its
    /// `/proc/interrupts` label), `device` (all device IRQs), `softirq:TIMER`/`softirq:RCU`/...
    /// (each `/proc/softirqs` line), `sched:switched_in` (tasks switched in).
    pub source: String,
    /// Per second over the last interval.
    pub per_sec: f64,
}

/// One isolated CPU's health: varlink `CpuHealth`, D-Bus `(udddsa(sd))`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CpuHealth {
    /// The CPU.
    pub cpu: u32,
    /// Device interrupts per second.
    pub device_irqs_per_sec: f64,
    /// Inter-processor interrupts per second (reported, not fixable).
    pub ipis_per_sec: f64,
    /// Local timer interrupts per second.
    pub timer_per_sec: f64,
    /// The device IRQs responsible, busiest first: `32 virtio1-requests 71/s, ...`.
    pub sources: String,
    /// Every source of interruptions, zeros included (empty from a daemon that does not say).
    #[serde(default)]
    pub noise: Vec<Noise>,
}

/// One isolated pool's isolation: varlink `Isolation`, D-Bus `(sssssda(udddsa(sd))sss)`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PoolIsolation {
    /// The pool.
    pub pool: String,
    /// Its CPUs.
    #[serde(default)]
    pub cpus: String,
    /// `holds`, `leaks`, `degraded` (its partition is invalid) or `unmeasured`.
    pub state: String,
    /// One line: `holds`, `71 IRQ/s from irq 32 virtio1-requests on CPU 2`, or the kernel's
    /// reason for an invalid partition.
    pub summary: String,
    /// The kernel's reason when the partition is invalid; empty otherwise.
    #[serde(default)]
    pub reason: String,
    /// CPU time used on its CPUs by tasks outside the pool, in percent; -1 when unknown.
    #[serde(default = "unknown_percent")]
    pub foreign_percent: f64,
    /// Each CPU over the last interval (empty until measured).
    #[serde(default)]
    pub per_cpu: Vec<CpuHealth>,
    /// Device IRQs kept off the isolated CPUs: `8 moved off 2-3 (1, 8, 9, 24, 25, ...); 3 placed
    /// by the kernel (0, 41, 42)` (empty from a daemon that does not say).
    #[serde(default)]
    pub irqs: String,
    /// Kernel threads kept off them: `6 moved off 2-3`.
    #[serde(default)]
    pub kthreads: String,
    /// Whether the kernel's boot isolation covers its CPUs: `covered`, or each boot parameter
    /// that misses some (`nohz_full= misses 2-3; rcu_nocbs= misses 2-3; isolcpus=managed_irq
    /// misses 2-3`); empty from a daemon that does not say.
    #[serde(default)]
    pub boot: String,
}

/// One configured key of a pool's power or cache class: varlink `ClassSetting`, D-Bus
/// `(sssssss)` where `state` and `reason` travel as one string, `degraded: WHY` (either form
/// decodes).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "crate::dbus::ClassRow")]
pub struct ClassSetting {
    /// The pool, or `(idle)` for the CPUs in no pool.
    pub pool: String,
    /// `power` or `cache`.
    pub class: String,
    /// The key as configured: `governor`, `resume_latency_us`, `l3`, `mb`...
    pub key: String,
    /// The value as configured: `performance`, `0`, `50%`.
    pub wanted: String,
    /// What was read back, as the kernel's file shows it (`n/a`, `0fc0`); distinct values
    /// joined with `,`.
    pub in_force: String,
    /// The CPUs or resctrl group the setting covers.
    pub scope: String,
    /// `applied`, `degraded` or `unsupported`.
    pub state: String,
    /// Why it is degraded, or what the host is missing; empty when applied.
    #[serde(default)]
    pub reason: String,
}

/// `GetClasses`' reply.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Classes {
    /// Every configured key, pool by pool.
    pub classes: Vec<ClassSetting>,
}

/// `ListPools`' reply.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Pools {
    /// Every pool, in name order.
    pub pools: Vec<Pool>,
}

/// The reply of `GetPool`, `CreatePool` and `ResizePool`: the pool (left out when an edit's
/// pool is already gone again).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct PoolReply {
    /// The pool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool: Option<Pool>,
}

/// `ListAssignments`' reply.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Assignments {
    /// The assignments.
    pub assignments: Vec<Assignment>,
}

/// The reply of `GetAssignment`, `Assign`, `Run` and `Release`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AssignmentReply {
    /// The assignment.
    pub assignment: Assignment,
}

/// `Reload`'s reply.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Reloaded {
    /// Whether the files said anything the daemon did not run already.
    pub changed: bool,
    /// What changed (`2 keys changed: pools.dp.cache.l3, pools.web.count`, or `nothing
    /// changed`), then each key of the administrator's files that a later file overrides,
    /// naming both (`` `…/90-cpupoold-runtime.toml` overrides pools.web.count of `…/config.toml` ``).
    #[serde(default)]
    pub summary: String,
}

/// The reply of a method that returns nothing (`DeletePool`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Nothing {}

/// One reply of `Monitor`'s stream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventReply {
    /// The change.
    pub event: Event,
}

fn unknown_percent() -> f64 {
    -1.0
}

/// The reply of `GetIsolation`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Isolation {
    /// `isolcpus=` on the kernel command line.
    pub isolcpus: String,
    /// `nohz_full=` on the kernel command line.
    pub nohz_full: String,
    /// CPUs left for interrupts, kernel threads and host slices.
    pub housekeeping: String,
    /// The unbound workqueue mask as read back, and who keeps isolated CPUs off it
    /// (`0-1 (cpupoold)`, `0-1 (kernel)`); empty where the kernel has no such file.
    pub workqueue: String,
    /// The isolated pools asked for.
    pub pools: Vec<PoolIsolation>,
    /// `rcu_nocbs=` on the kernel command line.
    pub rcu_nocbs: String,
    /// The kernel command line that covers every isolated pool's CPUs (`nohz_full=2-3
    /// rcu_nocbs=2-3 isolcpus=managed_irq,2-3`); empty without isolated pools.
    pub boot_line: String,
    /// CPUs the kernel isolates at boot that no isolated pool uses.
    pub boot_unused: String,
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// Replies of a daemon that predates a field still decode.
    #[test]
    fn older_replies_decode_with_defaults() {
        let a: Assignment = serde_json::from_value(
            json!({"id": "a", "pool": "p", "cpus": "1", "millicpus": 1000, "target": "pid:1"}),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert!(a.reclaim && a.state == "applied" && a.container.is_empty());
        let i: Isolation =
            serde_json::from_value(json!({"pools": [{"pool": "p", "state": "holds", "summary": "holds"}]}))
                .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(i.pools[0].foreign_percent, -1.0);
    }

    #[test]
    fn events_leave_absent_fields_out() {
        let e = serde_json::to_value(Event::assignment("x", "added")).unwrap_or_default();
        assert_eq!(e, json!({"kind": "assignment", "id": "x", "change": "added"}));
    }
}
