//! Pools: what the operator asks for ([`PoolSpec`]) and what it resolves to on this host
//! ([`Pool`]).
//!
//! Resolution takes explicit CPU lists first, then `isolcpus` pools, then counted requests (the
//! reserved pool's first, so housekeeping keeps the low CPUs), each request packed by the same
//! allocator that serves assignments. Online CPUs that no pool claims join the reserved pool:
//! host daemons must run somewhere, and a CPU nobody may use helps nobody.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use super::alloc;
pub use super::alloc::Smt;
use super::cpuset::CpuSet;
use super::topology::Topology;

/// The three kinds of pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PoolKind {
    /// Housekeeping CPUs for system.slice, user.slice and init.scope.
    Reserved,
    /// Each assignment owns whole CPUs (or whole cores).
    Exclusive,
    /// Assignments share the pool's CPUs; capacity is counted in millicpus.
    Shared,
}

impl fmt::Display for PoolKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PoolKind::Reserved => "reserved",
            PoolKind::Exclusive => "exclusive",
            PoolKind::Shared => "shared",
        })
    }
}

/// A pool name usable as part of a slice and cgroup name: `[a-z0-9_]{1,32}`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct PoolName(String);

/// Longest pool name.
pub const MAX_POOL_NAME: usize = 32;

impl PoolName {
    /// Validates a name.
    pub fn new(name: &str) -> Result<Self, PoolError> {
        let bad = |reason: &'static str| PoolError::InvalidName { name: crate::echo(name), reason };
        if name.is_empty() {
            return Err(bad("it is empty"));
        }
        if name.len() > MAX_POOL_NAME {
            return Err(bad("it is longer than 32 characters"));
        }
        if !name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_') {
            return Err(bad("only a-z, 0-9 and _ may be used (it becomes a slice name)"));
        }
        if name.starts_with('_') || name.ends_with('_') {
            // The kubelet refuses a resource name `<prefix>/<name>` whose name part does.
            return Err(bad("it must start and end with a-z or 0-9 (it becomes a Kubernetes resource name)"));
        }
        Ok(PoolName(name.to_owned()))
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for PoolName {
    type Error = PoolError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        PoolName::new(&s)
    }
}

impl From<PoolName> for String {
    fn from(n: PoolName) -> String {
        n.0
    }
}

impl fmt::Display for PoolName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(&self.0)
    }
}

/// Where a pool's CPUs come from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CpuSource {
    /// An explicit list (`cpus = "2-5"`).
    List(CpuSet),
    /// `count` CPUs, optionally all from NUMA node `numa`.
    Request {
        /// How many logical CPUs.
        count: u32,
        /// The NUMA node to take them from.
        numa: Option<u32>,
    },
    /// The CPUs the kernel isolated at boot (`isolcpus = true`).
    Isolcpus,
}

/// A pool as configured.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolSpec {
    /// The pool's name.
    pub name: PoolName,
    /// Its kind.
    pub kind: PoolKind,
    /// Where its CPUs come from.
    pub source: CpuSource,
    /// How SMT siblings are handed out.
    pub smt: Smt,
    /// Run the pool as an isolated cpuset partition (exclusive pools only).
    pub isolate: bool,
    /// Offer the pool to the kubelet as a device-plugin resource.
    pub kubelet: bool,
    /// Limit each assignment's CPU time to its millicpus (shared pools only).
    pub enforce_quota: bool,
    /// Offer the pool to the kubelet through Dynamic Resource Allocation (ResourceSlices and
    /// the kubelet's DRA plugin API) instead of the device plugin: one owner per pool.
    pub dra: bool,
}

impl PoolSpec {
    /// A spec with the kind's defaults: exclusive pools hand out full cores, the kubelet is
    /// offered every pool but the reserved one.
    pub fn new(name: PoolName, kind: PoolKind, source: CpuSource) -> Self {
        PoolSpec {
            name,
            kind,
            source,
            smt: if kind == PoolKind::Exclusive { Smt::FullCores } else { Smt::Threads },
            isolate: false,
            kubelet: kind != PoolKind::Reserved,
            enforce_quota: false,
            dra: false,
        }
    }
}

/// A pool resolved against the host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pool {
    /// The pool's name.
    pub name: PoolName,
    /// Its kind.
    pub kind: PoolKind,
    /// Its CPUs.
    pub cpus: CpuSet,
    /// How SMT siblings are handed out.
    pub smt: Smt,
    /// Whether it runs as an isolated partition.
    pub isolate: bool,
    /// Whether the kubelet is offered it.
    pub kubelet: bool,
    /// Whether each assignment's CPU time is limited to its millicpus.
    #[serde(default)]
    pub enforce_quota: bool,
    /// Whether the kubelet is offered it through DRA rather than the device plugin.
    #[serde(default)]
    pub dra: bool,
}

impl Pool {
    /// Whether the kubelet is offered it at all (`kubelet = true`, never the reserved pool),
    /// by the device plugin or by DRA: its containers run on the pool's CPUs.
    pub fn offered_to_kubelet(&self) -> bool {
        self.kubelet && self.kind != PoolKind::Reserved
    }

    /// Whether the device plugin serves it (offered to the kubelet, and not through DRA).
    pub fn served_by_device_plugin(&self) -> bool {
        self.offered_to_kubelet() && !self.dra
    }

    /// Whether DRA serves it (`dra = true`): published in this node's ResourceSlice and
    /// prepared by the DRA plugin, never by the device plugin. One owner per pool.
    pub fn served_by_dra(&self) -> bool {
        self.offered_to_kubelet() && self.dra
    }

    /// Millicpus the pool can hand out (1000 per CPU).
    pub fn capacity_millis(&self) -> u64 {
        self.cpus.len() as u64 * 1000
    }
}

/// Why pools could not be resolved. Each variant names the pool and the setting at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PoolError {
    /// A name is not usable.
    #[error("pool name `{name}` is invalid: {reason}")]
    InvalidName {
        /// The name as given (cut short: [`crate::echo`]).
        name: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// Two pools with one name.
    #[error("pool `{0}` is defined twice")]
    Duplicate(PoolName),
    /// No reserved pool.
    #[error("no reserved pool: exactly one pool must have kind = \"reserved\"")]
    NoReserved,
    /// More than one reserved pool.
    #[error("pools `{0}` and `{1}` are both reserved; only one reserved pool is allowed")]
    TwoReserved(PoolName, PoolName),
    /// The reserved pool has no CPU.
    #[error("pool `{0}` (reserved) has no CPU; host daemons need at least one")]
    ReservedEmpty(PoolName),
    /// Two pools claim a CPU.
    #[error("pools `{a}` and `{b}` both claim CPUs {cpus}")]
    Overlap {
        /// The first pool.
        a: PoolName,
        /// The second pool.
        b: PoolName,
        /// The CPUs both claim.
        cpus: CpuSet,
    },
    /// A pool names CPUs that are not online.
    #[error("pool `{pool}`: cpus: CPUs {cpus} are not online")]
    NotOnline {
        /// The pool.
        pool: PoolName,
        /// The CPUs that are not online.
        cpus: CpuSet,
    },
    /// A full-cores exclusive pool holds part of a core.
    #[error("pool `{pool}`: smt = \"full-cores\" but CPUs {cpus} are only part of their cores (add their siblings or set smt = \"threads\")")]
    PartialCores {
        /// The pool.
        pool: PoolName,
        /// The CPUs whose siblings are missing.
        cpus: CpuSet,
    },
    /// `enforce_quota` on a pool that is not shared.
    #[error("pool `{0}`: enforce_quota = true is only allowed on shared pools")]
    QuotaNotShared(PoolName),
    /// `dra` on a pool the kubelet is not offered (`kubelet = false`, or the reserved pool).
    #[error("pool `{0}`: dra = true needs a pool the kubelet is offered (not kubelet = false, not the reserved pool)")]
    DraNotOffered(PoolName),
    /// `isolate` on a pool that is not exclusive.
    #[error("pool `{0}`: isolate = true is only allowed on exclusive pools")]
    IsolateNotExclusive(PoolName),
    /// `isolcpus` on a pool that is not exclusive.
    #[error("pool `{0}`: isolcpus = true is only allowed on exclusive pools")]
    IsolcpusNotExclusive(PoolName),
    /// `isolcpus` but the kernel isolated nothing.
    #[error("pool `{0}`: isolcpus = true but the kernel isolated no online CPU (boot with isolcpus=)")]
    IsolcpusEmpty(PoolName),
    /// The reserved pool holds only CPUs the kernel isolated at boot.
    #[error("pool `{pool}` (reserved)")]
    NoHousekeeping {
        /// The reserved pool.
        pool: PoolName,
        /// Which CPUs.
        // Boxed: two CPU sets would make every configuration error as large.
        #[source]
        source: Box<crate::housekeeping::NoHousekeeping>,
    },
    /// A pool with no CPU.
    #[error("pool `{0}`: cpus is empty")]
    Empty(PoolName),
    /// `count = 0`.
    #[error("pool `{0}`: count must be at least 1")]
    ZeroCount(PoolName),
    /// `numa` names a node the host does not have.
    #[error("pool `{pool}`: numa: node {node} does not exist (nodes: {nodes})")]
    UnknownNode {
        /// The pool.
        pool: PoolName,
        /// The node asked for.
        node: u32,
        /// The nodes that exist.
        nodes: CpuSet,
    },
    /// Not enough unclaimed CPUs for a counted pool.
    #[error("pool `{pool}`: count: {requested} CPUs requested but only {available} are unclaimed{where_}")]
    NotEnoughCpus {
        /// The pool.
        pool: PoolName,
        /// CPUs asked for.
        requested: u32,
        /// CPUs left.
        available: usize,
        /// Where they were looked for (empty or " on NUMA node N").
        where_: String,
    },
    /// A counted full-cores pool whose count is not a whole number of cores.
    #[error(
        "pool `{pool}`: count: {requested} CPUs is not a whole number of free cores (smt = \"full-cores\")"
    )]
    CountNotWholeCores {
        /// The pool.
        pool: PoolName,
        /// CPUs asked for.
        requested: u32,
    },
}

/// Resolves and validates the configured pools against `topo`. Returns the pools in name order.
pub fn resolve(specs: &[PoolSpec], topo: &Topology) -> Result<Vec<Pool>, PoolError> {
    resolve_keeping(specs, topo, &BTreeMap::new())
}

/// Like [`resolve`], with the CPUs each pool has now (`current`): a `count` pool keeps the
/// CPUs it has where they still fit its request, shrinks within them, grows around them, and
/// only a new or moved pool takes from what nobody keeps. So creating or resizing one pool does
/// not move another's CPUs (and its live assignments). When keeping cannot work (e.g. a new
/// `numa` pool needs CPUs another pool holds there) the pools are resolved afresh, as [`resolve`]
/// does.
pub fn resolve_keeping(
    specs: &[PoolSpec],
    topo: &Topology,
    current: &BTreeMap<PoolName, CpuSet>,
) -> Result<Vec<Pool>, PoolError> {
    match resolve_with(specs, topo, current) {
        Err(_) if !current.is_empty() => resolve_with(specs, topo, &BTreeMap::new()),
        other => other,
    }
}

fn resolve_with(
    specs: &[PoolSpec],
    topo: &Topology,
    current: &BTreeMap<PoolName, CpuSet>,
) -> Result<Vec<Pool>, PoolError> {
    let (seen, reserved) = check_specs(specs)?;
    // Explicit lists, then isolcpus, then requests (reserved first, then by name).
    let mut claims = Claims { topo, online: topo.online(), resolved: BTreeMap::new() };
    claims.fixed(specs)?;
    let mut requests: Vec<&PoolSpec> =
        specs.iter().filter(|s| matches!(s.source, CpuSource::Request { .. })).collect();
    requests.sort_by_key(|s| (s.kind != PoolKind::Reserved, s.name.clone()));
    // First each request keeps what it has (up to its count), so the others' picks below
    // cannot take it.
    for spec in &requests {
        claims.keep(spec, current)?;
    }
    for spec in requests {
        claims.pick(spec)?;
    }
    let leftover = claims.online.difference(&claims.claimed());
    let mut resolved = claims.resolved;
    if let Some(r) = resolved.get_mut(&reserved) {
        *r = r.union(&leftover);
    } else {
        resolved.insert(reserved.clone(), leftover);
    }
    finish(resolved, &seen, topo)
}

/// The specs' names are unique, exactly one is reserved, and each option suits its pool's kind.
/// Returns the specs by name and the reserved pool's name.
fn check_specs(specs: &[PoolSpec]) -> Result<(BTreeMap<&PoolName, &PoolSpec>, PoolName), PoolError> {
    let mut seen: BTreeMap<&PoolName, &PoolSpec> = BTreeMap::new();
    let mut reserved: Option<&PoolName> = None;
    for spec in specs {
        if seen.insert(&spec.name, spec).is_some() {
            return Err(PoolError::Duplicate(spec.name.clone()));
        }
        if spec.kind == PoolKind::Reserved {
            if let Some(first) = reserved {
                return Err(PoolError::TwoReserved(first.clone(), spec.name.clone()));
            }
            reserved = Some(&spec.name);
        }
        if spec.isolate && spec.kind != PoolKind::Exclusive {
            return Err(PoolError::IsolateNotExclusive(spec.name.clone()));
        }
        if spec.enforce_quota && spec.kind != PoolKind::Shared {
            return Err(PoolError::QuotaNotShared(spec.name.clone()));
        }
        if spec.dra && (!spec.kubelet || spec.kind == PoolKind::Reserved) {
            return Err(PoolError::DraNotOffered(spec.name.clone()));
        }
        if spec.source == CpuSource::Isolcpus && spec.kind != PoolKind::Exclusive {
            return Err(PoolError::IsolcpusNotExclusive(spec.name.clone()));
        }
    }
    let reserved = reserved.ok_or(PoolError::NoReserved)?.clone();
    Ok((seen, reserved))
}

/// The CPUs claimed so far, pool by pool, while the pools are resolved: no CPU is claimed twice.
struct Claims<'t> {
    topo: &'t Topology,
    online: CpuSet,
    resolved: BTreeMap<PoolName, CpuSet>,
}

impl Claims<'_> {
    /// Gives `cpus` to `name`, unless another pool has some of them.
    fn claim(&mut self, name: &PoolName, cpus: CpuSet) -> Result<(), PoolError> {
        for (other, theirs) in self.resolved.iter() {
            let both = theirs.intersection(&cpus);
            if !both.is_empty() {
                return Err(PoolError::Overlap { a: other.clone(), b: name.clone(), cpus: both });
            }
        }
        self.resolved.insert(name.clone(), cpus);
        Ok(())
    }

    /// Every CPU claimed so far.
    fn claimed(&self) -> CpuSet {
        self.resolved.values().fold(CpuSet::new(), |acc, c| acc.union(c))
    }

    /// The pools whose CPUs are fixed: explicit lists, then the kernel's isolated CPUs.
    fn fixed(&mut self, specs: &[PoolSpec]) -> Result<(), PoolError> {
        for spec in specs {
            if let CpuSource::List(cpus) = &spec.source {
                if cpus.is_empty() {
                    return Err(PoolError::Empty(spec.name.clone()));
                }
                let missing = cpus.difference(&self.online);
                if !missing.is_empty() {
                    return Err(PoolError::NotOnline { pool: spec.name.clone(), cpus: missing });
                }
                self.claim(&spec.name, cpus.clone())?;
            }
        }
        for spec in specs.iter().filter(|s| s.source == CpuSource::Isolcpus) {
            let cpus = self.topo.isolated();
            if cpus.is_empty() {
                return Err(PoolError::IsolcpusEmpty(spec.name.clone()));
            }
            self.claim(&spec.name, cpus)?;
        }
        Ok(())
    }

    /// A request keeps the CPUs it has now (`current`) that are still free, up to its count.
    fn keep(&mut self, spec: &PoolSpec, current: &BTreeMap<PoolName, CpuSet>) -> Result<(), PoolError> {
        let CpuSource::Request { count, numa } = spec.source else { return Ok(()) };
        let Some(now) = current.get(&spec.name) else { return Ok(()) };
        let (topo, claimed) = (self.topo, self.claimed());
        let mut keep = now.intersection(&self.online).difference(&claimed).difference(&topo.isolated());
        if let Some(node_cpus) = numa.and_then(|n| topo.nodes().get(&n)) {
            keep = keep.intersection(node_cpus);
        }
        let smt = if spec.kind == PoolKind::Exclusive { spec.smt } else { Smt::Threads };
        if keep.len() > count as usize && spec.kind == PoolKind::Reserved {
            // The reserved pool holds its count and the CPUs nobody claims. Its own are those a
            // fresh resolution gives it (it picks first): keep those, so the host's slices do
            // not move when another pool takes the unclaimed ones.
            let free = self.online.difference(&claimed).difference(&topo.isolated());
            let free = match numa.and_then(|n| topo.nodes().get(&n)) {
                Some(node_cpus) => free.intersection(node_cpus),
                None => free,
            };
            if let Ok(own) = alloc::pick(topo, &free, &CpuSet::new(), count as usize, smt) {
                if own.is_subset(&keep) {
                    keep = own;
                }
            }
        }
        if keep.len() > count as usize {
            match alloc::pick(topo, &keep, &CpuSet::new(), count as usize, smt) {
                Ok(cpus) => keep = cpus,
                Err(_) => return Ok(()),
            }
        }
        if !keep.is_empty() {
            self.claim(&spec.name, keep)?;
        }
        Ok(())
    }

    /// A request gets its count: what it kept, grown from the free CPUs (or picked afresh).
    fn pick(&mut self, spec: &PoolSpec) -> Result<(), PoolError> {
        let CpuSource::Request { count, numa } = spec.source else { return Ok(()) };
        if count == 0 {
            return Err(PoolError::ZeroCount(spec.name.clone()));
        }
        let kept = self.resolved.remove(&spec.name).unwrap_or_default();
        if kept.len() == count as usize {
            self.resolved.insert(spec.name.clone(), kept);
            return Ok(());
        }
        let topo = self.topo;
        // Kernel-isolated CPUs are only handed out on purpose, through `isolcpus = true`.
        let mut free = self.online.difference(&self.claimed()).difference(&topo.isolated());
        if let Some(node) = numa {
            let Some(node_cpus) = topo.nodes().get(&node) else {
                return Err(PoolError::UnknownNode {
                    pool: spec.name.clone(),
                    node,
                    nodes: topo.nodes().keys().copied().collect(),
                });
            };
            free = free.intersection(node_cpus);
        }
        // Pools are carved in whole cores where possible so that pools don't share cores.
        let smt = if spec.kind == PoolKind::Exclusive { spec.smt } else { Smt::Threads };
        // Growing around what it kept; if its cores do not allow that, picked afresh.
        let picked = alloc::pick(topo, &free, &kept, count as usize, smt)
            .or_else(|_| alloc::pick(topo, &free, &CpuSet::new(), count as usize, smt));
        let cpus = match picked {
            Ok(cpus) => cpus,
            Err(alloc::PickError::NotWholeCores { .. }) => {
                return Err(PoolError::CountNotWholeCores { pool: spec.name.clone(), requested: count })
            }
            Err(alloc::PickError::Insufficient { available, .. }) => {
                return Err(PoolError::NotEnoughCpus {
                    pool: spec.name.clone(),
                    requested: count,
                    available,
                    where_: numa.map(|n| format!(" on NUMA node {n}")).unwrap_or_default(),
                })
            }
        };
        self.claim(&spec.name, cpus)
    }
}

/// The pools from their resolved CPUs, checked as a whole: the reserved pool has CPUs and some
/// for housekeeping, and a full-cores exclusive pool has no partial core.
fn finish(
    resolved: BTreeMap<PoolName, CpuSet>,
    seen: &BTreeMap<&PoolName, &PoolSpec>,
    topo: &Topology,
) -> Result<Vec<Pool>, PoolError> {
    let mut pools = Vec::with_capacity(seen.len());
    for (name, cpus) in resolved {
        let Some(spec) = seen.get(&name) else { continue };
        if spec.kind == PoolKind::Reserved && cpus.is_empty() {
            return Err(PoolError::ReservedEmpty(name));
        }
        // Interrupts, kernel threads and host slices run on the reserved pool's CPUs: some must
        // be ones the kernel did not isolate at boot.
        if spec.kind == PoolKind::Reserved {
            crate::housekeeping::housekeeping_cpus(&cpus, &topo.isolated())
                .map_err(|e| PoolError::NoHousekeeping { pool: name.clone(), source: Box::new(e) })?;
        }
        if spec.kind == PoolKind::Exclusive && spec.smt == Smt::FullCores {
            let partial = topo.partial_cores(&cpus);
            if !partial.is_empty() {
                return Err(PoolError::PartialCores { pool: name, cpus: partial });
            }
        }
        pools.push(Pool {
            name,
            kind: spec.kind,
            cpus,
            smt: spec.smt,
            isolate: spec.isolate,
            kubelet: spec.kubelet,
            enforce_quota: spec.enforce_quota,
            dra: spec.dra,
        });
    }
    Ok(pools)
}

#[cfg(test)]
mod tests;
