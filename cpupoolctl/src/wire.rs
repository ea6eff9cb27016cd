//! The wire contract, as the client sees it: the types of `org.cpupool.Manager`
//! (`src/api/org.cpupool.Manager.varlink`) and the arguments of the calls that change things.
//!
//! Both transports decode into these types (varlink from JSON, D-Bus from the structures in
//! `dbus/org.cpupool.Manager1.xml`), and the output layer prints only these, so `--json`
//! documents are the same whichever transport answered. Field names are the IDL's, so a
//! script can read the IDL to know the JSON.

use serde::{Deserialize, Serialize};

/// A pool resolved against the host (`type Pool`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pool {
    /// The pool's name.
    pub name: String,
    /// `reserved`, `exclusive` or `shared`.
    pub kind: String,
    /// All CPUs of the pool, a kernel CPU list.
    pub cpus: String,
    /// Exclusive pools: the CPUs no assignment owns; other pools: all of them.
    pub free_cpus: String,
    /// Free capacity in millicpus.
    pub free_millicpus: u64,
    /// Capacity in millicpus (1000 per CPU).
    pub capacity_millicpus: u64,
    /// Whether the pool runs as an isolated cpuset partition.
    pub isolated: bool,
    /// How many assignments are made from the pool.
    pub assignments: u64,
    /// The kernel's word on the pool slice's partition (`member`, `isolated`,
    /// `isolated invalid (...)`); empty for the reserved pool.
    #[serde(default)]
    pub partition: String,
}

/// CPUs given to a target (`type Assignment`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Assignment {
    /// The assignment's id.
    pub id: String,
    /// The pool it is made from.
    pub pool: String,
    /// The CPUs the target may run on.
    pub cpus: String,
    /// Its size in millicpus.
    pub millicpus: u64,
    /// `unit:NAME`, `cgroup:PATH` or `pid:N`.
    pub target: String,
    /// Released when the target goes away.
    #[serde(default = "yes")]
    pub reclaim: bool,
    /// Kubelet assignments: `NAMESPACE/POD/CONTAINER`; empty otherwise.
    #[serde(default)]
    pub container: String,
    /// `applied`, or `degraded` when the kernel does not enforce its CPUs on the target.
    #[serde(default = "applied")]
    pub state: String,
    /// Why it is degraded; empty otherwise.
    #[serde(default)]
    pub reason: String,
}

fn applied() -> String {
    "applied".into()
}

fn yes() -> bool {
    true
}

/// One online logical CPU (`type Cpu`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cpu {
    /// Logical CPU number.
    pub cpu: u64,
    /// Core id.
    pub core: u64,
    /// Package (socket) id.
    pub package: u64,
    /// Die id.
    pub die: u64,
    /// NUMA node.
    pub node: u64,
    /// L3 cache group.
    pub l3: u64,
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
    /// Why the configuration on disk is not the one running, if it is not. Always present in
    /// the JSON output (`null` when the configuration runs), whichever transport answered.
    #[serde(default)]
    pub config_error: Option<String>,
    /// Assignments the kernel does not enforce as assigned.
    #[serde(default)]
    pub degraded_assignments: u64,
}

/// A committed change, as `Monitor` streams it (`type Event`).
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
    /// pool: `current` (the initial replay) or `changed`; assignment: `added` or `removed`.
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

/// How much an assignment asks for: exactly one of whole CPUs and millicpus.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Amount {
    /// Whole CPUs (exclusive pools).
    Cpus(u32),
    /// Millicpus (shared pools).
    Millicpus(u64),
}

/// The arguments of `Assign`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AssignRequest {
    /// The pool to assign from.
    pub pool: String,
    /// `unit:NAME`, `cgroup:PATH` or `pid:N`.
    pub target: String,
    /// The size.
    pub amount: Amount,
    /// The id to use; the daemon chooses one when `None`.
    pub id: Option<String>,
    /// Release it when the target goes away (the daemon's default).
    pub reclaim: bool,
}

/// The arguments of `Run`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunRequest {
    /// The pool to assign from.
    pub pool: String,
    /// The process (the caller's own).
    pub pid: u32,
    /// The size.
    pub amount: Amount,
    /// The id to use; the daemon chooses one when `None`.
    pub id: Option<String>,
}

/// Where a pool's CPUs come from: an explicit list, or a count (optionally from one NUMA node).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CpuSource {
    /// A kernel CPU list, e.g. `8-15`.
    List(String),
    /// A number of CPUs, packed by the daemon.
    Count {
        /// How many CPUs.
        count: u32,
        /// Take them all from this NUMA node.
        numa: Option<u32>,
    },
}

/// The arguments of `CreatePool`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreatePoolRequest {
    /// The new pool's name.
    pub name: String,
    /// `reserved`, `exclusive` or `shared`.
    pub kind: String,
    /// Its CPUs.
    pub source: CpuSource,
    /// `full-cores` or `threads`; the daemon's default when `None`.
    pub smt: Option<String>,
    /// Run as an isolated cpuset partition; the daemon's default when `None`.
    pub isolate: Option<bool>,
    /// Offer the pool to the kubelet; the daemon's default when `None`.
    pub kubelet: Option<bool>,
}

/// One isolated pool in the reply of `GetIsolation` (the fields `cpupoolctl` shows).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PoolIsolation {
    /// The pool.
    pub pool: String,
    /// `holds`, `leaks`, `degraded` or `unmeasured`.
    pub state: String,
    /// One line: `holds`, or what breaks isolation.
    pub summary: String,
    /// Device IRQs moved off the isolated CPUs (empty from a daemon that does not say).
    #[serde(default)]
    pub irqs: String,
    /// Kernel threads moved off them.
    #[serde(default)]
    pub kthreads: String,
}

/// The reply of `GetIsolation` (the fields `cpupoolctl` shows).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Isolation {
    /// The isolated pools asked for.
    pub pools: Vec<PoolIsolation>,
}
