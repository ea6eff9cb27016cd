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

/// How SMT siblings are handed out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Smt {
    /// Only whole cores: an assignment never shares a core with another.
    FullCores,
    /// Logical CPUs: siblings may go to different assignments.
    Threads,
}

impl fmt::Display for Smt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Smt::FullCores => "full-cores",
            Smt::Threads => "threads",
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
        let bad = |reason: &'static str| PoolError::InvalidName { name: name.to_owned(), reason };
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
}

impl Pool {
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
        /// The name as given.
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
        source: Box<crate::core::housekeeping::NoHousekeeping>,
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
    let online = topo.online();
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
        if spec.source == CpuSource::Isolcpus && spec.kind != PoolKind::Exclusive {
            return Err(PoolError::IsolcpusNotExclusive(spec.name.clone()));
        }
    }
    let reserved = reserved.ok_or(PoolError::NoReserved)?.clone();

    // Explicit lists, then isolcpus, then requests (reserved first, then by name).
    let mut resolved: BTreeMap<PoolName, CpuSet> = BTreeMap::new();
    let claim = |name: &PoolName, cpus: CpuSet, resolved: &mut BTreeMap<PoolName, CpuSet>| {
        for (other, theirs) in resolved.iter() {
            let both = theirs.intersection(&cpus);
            if !both.is_empty() {
                return Err(PoolError::Overlap { a: other.clone(), b: name.clone(), cpus: both });
            }
        }
        resolved.insert(name.clone(), cpus);
        Ok(())
    };
    for spec in specs {
        if let CpuSource::List(cpus) = &spec.source {
            if cpus.is_empty() {
                return Err(PoolError::Empty(spec.name.clone()));
            }
            let missing = cpus.difference(&online);
            if !missing.is_empty() {
                return Err(PoolError::NotOnline { pool: spec.name.clone(), cpus: missing });
            }
            claim(&spec.name, cpus.clone(), &mut resolved)?;
        }
    }
    for spec in specs.iter().filter(|s| s.source == CpuSource::Isolcpus) {
        let cpus = topo.isolated();
        if cpus.is_empty() {
            return Err(PoolError::IsolcpusEmpty(spec.name.clone()));
        }
        claim(&spec.name, cpus, &mut resolved)?;
    }
    let mut requests: Vec<&PoolSpec> =
        specs.iter().filter(|s| matches!(s.source, CpuSource::Request { .. })).collect();
    requests.sort_by_key(|s| (s.kind != PoolKind::Reserved, s.name.clone()));
    // First each request keeps what it has (up to its count), so the others' picks below
    // cannot take it.
    for spec in &requests {
        let CpuSource::Request { count, numa } = spec.source else { continue };
        let Some(now) = current.get(&spec.name) else { continue };
        let claimed = resolved.values().fold(CpuSet::new(), |acc, c| acc.union(c));
        let mut keep = now.intersection(&online).difference(&claimed).difference(&topo.isolated());
        if let Some(node_cpus) = numa.and_then(|n| topo.nodes().get(&n)) {
            keep = keep.intersection(node_cpus);
        }
        let smt = if spec.kind == PoolKind::Exclusive { spec.smt } else { Smt::Threads };
        if keep.len() > count as usize && spec.kind == PoolKind::Reserved {
            // The reserved pool holds its count and the CPUs nobody claims. Its own are those a
            // fresh resolution gives it (it picks first): keep those, so the host's slices do
            // not move when another pool takes the unclaimed ones.
            let free = online.difference(&claimed).difference(&topo.isolated());
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
                Err(_) => continue,
            }
        }
        if !keep.is_empty() {
            claim(&spec.name, keep, &mut resolved)?;
        }
    }
    for spec in requests {
        let CpuSource::Request { count, numa } = spec.source else { continue };
        if count == 0 {
            return Err(PoolError::ZeroCount(spec.name.clone()));
        }
        let kept = resolved.remove(&spec.name).unwrap_or_default();
        if kept.len() == count as usize {
            resolved.insert(spec.name.clone(), kept);
            continue;
        }
        let claimed = resolved.values().fold(CpuSet::new(), |acc, c| acc.union(c));
        // Kernel-isolated CPUs are only handed out on purpose, through `isolcpus = true`.
        let mut free = online.difference(&claimed).difference(&topo.isolated());
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
        claim(&spec.name, cpus, &mut resolved)?;
    }

    let claimed = resolved.values().fold(CpuSet::new(), |acc, c| acc.union(c));
    let leftover = online.difference(&claimed);
    if let Some(r) = resolved.get_mut(&reserved) {
        *r = r.union(&leftover);
    } else {
        resolved.insert(reserved.clone(), leftover);
    }

    let mut pools = Vec::with_capacity(specs.len());
    for (name, cpus) in resolved {
        let Some(spec) = seen.get(&name) else { continue };
        if spec.kind == PoolKind::Reserved && cpus.is_empty() {
            return Err(PoolError::ReservedEmpty(name));
        }
        // Interrupts, kernel threads and host slices run on the reserved pool's CPUs: some must
        // be ones the kernel did not isolate at boot.
        if spec.kind == PoolKind::Reserved {
            crate::core::housekeeping::housekeeping_cpus(&cpus, &topo.isolated())
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
        });
    }
    Ok(pools)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(s: &str) -> PoolName {
        PoolName::new(s).unwrap_or_else(|e| panic!("{e}"))
    }
    fn set(s: &str) -> CpuSet {
        CpuSet::parse(s).unwrap_or_else(|e| panic!("{e}"))
    }
    fn list(n: &str, kind: PoolKind, cpus: &str) -> PoolSpec {
        PoolSpec::new(name(n), kind, CpuSource::List(set(cpus)))
    }
    fn count(n: &str, kind: PoolKind, count: u32, numa: Option<u32>) -> PoolSpec {
        PoolSpec::new(name(n), kind, CpuSource::Request { count, numa })
    }
    fn cpus_of(pools: &[Pool], n: &str) -> CpuSet {
        pools.iter().find(|p| p.name.as_str() == n).map(|p| p.cpus.clone()).unwrap_or_default()
    }

    /// Creating or resizing a count pool leaves the other count pools' CPUs where they are; a
    /// fresh resolution would move the shared pool (the new pool sorts before it).
    #[test]
    fn count_pools_keep_their_cpus() {
        let t = Topology::synthetic(2, 8, 2, 2);
        let mut specs = vec![
            count("reserved", PoolKind::Reserved, 2, None),
            PoolSpec { smt: Smt::FullCores, ..count("dp", PoolKind::Exclusive, 14, Some(1)) },
            count("web", PoolKind::Shared, 8, None),
        ];
        let before = resolve(&specs, &t).unwrap_or_else(|e| panic!("{e}"));
        let now: BTreeMap<PoolName, CpuSet> =
            before.iter().map(|p| (p.name.clone(), p.cpus.clone())).collect();
        specs.push(PoolSpec { smt: Smt::FullCores, ..count("batch", PoolKind::Exclusive, 4, Some(0)) });
        let after = resolve_keeping(&specs, &t, &now).unwrap_or_else(|e| panic!("{e}"));
        for p in ["dp", "web"] {
            assert_eq!(cpus_of(&after, p), now[&name(p)], "{p} moved");
        }
        // The reserved pool gives up unclaimed CPUs, and keeps its own two.
        let reserved = cpus_of(&after, "reserved");
        assert!(reserved.is_subset(&now[&name("reserved")]), "{reserved}");
        let own = CpuSet::parse("0,16").unwrap_or_else(|e| panic!("{e}"));
        assert!(own.is_subset(&reserved) && now[&name("reserved")].len() > 2, "{reserved}");
        let batch = cpus_of(&after, "batch");
        assert_eq!(batch.len(), 4);
        assert!(batch.is_subset(&t.nodes()[&0]), "{batch}");
        let fresh = resolve(&specs, &t).unwrap_or_else(|e| panic!("{e}"));
        assert_ne!(
            cpus_of(&fresh, "web"),
            now[&name("web")],
            "the case must be one a fresh resolution moves"
        );

        // Shrinking stays within the pool's CPUs, growing keeps them all.
        let now: BTreeMap<PoolName, CpuSet> =
            after.iter().map(|p| (p.name.clone(), p.cpus.clone())).collect();
        specs[2] = count("web", PoolKind::Shared, 6, None);
        let shrunk = resolve_keeping(&specs, &t, &now).unwrap_or_else(|e| panic!("{e}"));
        assert!(cpus_of(&shrunk, "web").is_subset(&now[&name("web")]));
        assert_eq!(cpus_of(&shrunk, "batch"), now[&name("batch")]);
        specs[2] = count("web", PoolKind::Shared, 10, None);
        let grown = resolve_keeping(&specs, &t, &now).unwrap_or_else(|e| panic!("{e}"));
        assert!(now[&name("web")].is_subset(&cpus_of(&grown, "web")));
        assert_eq!(cpus_of(&grown, "web").len(), 10);
        assert_eq!(cpus_of(&grown, "dp"), now[&name("dp")]);
    }

    #[test]
    fn names() {
        assert!(PoolName::new("dp_1").is_ok());
        assert!(PoolName::new(&"a".repeat(32)).is_ok());
        for bad in ["", "Dp", "a-b", "a.b", "a/b", "ä", "_a", "a_", "_", &"a".repeat(33)] {
            assert!(matches!(PoolName::new(bad), Err(PoolError::InvalidName { .. })), "{bad}");
        }
    }

    #[test]
    fn explicit_lists_and_leftovers_join_reserved() {
        let t = Topology::synthetic(1, 4, 1, 1);
        let pools =
            resolve(&[list("sys", PoolKind::Reserved, "0"), list("dp", PoolKind::Exclusive, "2-3")], &t)
                .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(cpus_of(&pools, "sys"), set("0-1"));
        assert_eq!(cpus_of(&pools, "dp"), set("2-3"));
    }

    #[test]
    fn counted_pools_pack_whole_cores_on_the_asked_node() {
        let t = Topology::synthetic(2, 8, 2, 2);
        let mut dp = count("dp", PoolKind::Exclusive, 4, Some(1));
        dp.isolate = true;
        let pools = resolve(
            &[count("sys", PoolKind::Reserved, 2, None), dp, count("web", PoolKind::Shared, 3, None)],
            &t,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        // The request took core 0; the leftovers joined it.
        assert!(set("0,16").is_subset(&cpus_of(&pools, "sys")));
        let dp = cpus_of(&pools, "dp");
        assert_eq!(dp.len(), 4);
        assert!(t.is_whole_cores(&dp));
        assert!(dp.is_subset(&t.nodes()[&1]));
        assert_eq!(cpus_of(&pools, "web").len(), 3);
        let all = pools.iter().fold(CpuSet::new(), |a, p| a.union(&p.cpus));
        assert_eq!(all, t.online());
    }

    #[test]
    fn every_validation_error() {
        let t = Topology::synthetic(1, 4, 2, 1);
        let r = |specs: &[PoolSpec]| resolve(specs, &t).err();
        let sys = || list("sys", PoolKind::Reserved, "0,4");
        assert_eq!(r(&[sys(), sys()]), Some(PoolError::Duplicate(name("sys"))));
        assert_eq!(r(&[list("x", PoolKind::Shared, "1")]), Some(PoolError::NoReserved));
        assert_eq!(
            r(&[sys(), list("r2", PoolKind::Reserved, "1")]),
            Some(PoolError::TwoReserved(name("sys"), name("r2")))
        );
        assert_eq!(
            r(&[sys(), list("a", PoolKind::Shared, "1-2"), list("b", PoolKind::Shared, "2-3")]),
            Some(PoolError::Overlap { a: name("a"), b: name("b"), cpus: set("2") })
        );
        assert_eq!(
            r(&[sys(), list("a", PoolKind::Shared, "6-9")]),
            Some(PoolError::NotOnline { pool: name("a"), cpus: set("8-9") })
        );
        assert_eq!(
            r(&[sys(), list("a", PoolKind::Exclusive, "1-2")]),
            Some(PoolError::PartialCores { pool: name("a"), cpus: set("1-2") })
        );
        let mut shared_isolated = list("a", PoolKind::Shared, "1");
        shared_isolated.isolate = true;
        assert_eq!(r(&[sys(), shared_isolated]), Some(PoolError::IsolateNotExclusive(name("a"))));
        assert_eq!(
            r(&[sys(), PoolSpec::new(name("a"), PoolKind::Shared, CpuSource::Isolcpus)]),
            Some(PoolError::IsolcpusNotExclusive(name("a")))
        );
        assert_eq!(
            r(&[sys(), PoolSpec::new(name("a"), PoolKind::Exclusive, CpuSource::Isolcpus)]),
            Some(PoolError::IsolcpusEmpty(name("a")))
        );
        assert_eq!(r(&[sys(), list("a", PoolKind::Shared, "")]), Some(PoolError::Empty(name("a"))));
        assert_eq!(r(&[sys(), count("a", PoolKind::Shared, 0, None)]), Some(PoolError::ZeroCount(name("a"))));
        assert_eq!(
            r(&[sys(), count("a", PoolKind::Shared, 1, Some(3))]),
            Some(PoolError::UnknownNode { pool: name("a"), node: 3, nodes: set("0") })
        );
        assert_eq!(
            r(&[sys(), count("a", PoolKind::Shared, 7, None)]),
            Some(PoolError::NotEnoughCpus {
                pool: name("a"),
                requested: 7,
                available: 6,
                where_: String::new()
            })
        );
        assert_eq!(
            r(&[sys(), count("a", PoolKind::Exclusive, 3, None)]),
            Some(PoolError::CountNotWholeCores { pool: name("a"), requested: 3 })
        );
        assert_eq!(
            r(&[list("sys", PoolKind::Reserved, "0-7"), list("a", PoolKind::Shared, "1")]),
            Some(PoolError::Overlap { a: name("sys"), b: name("a"), cpus: set("1") })
        );
        // Every online CPU taken by other pools: the reserved pool ends up empty.
        let t1 = Topology::synthetic(1, 1, 1, 1);
        assert_eq!(
            resolve(&[count("sys", PoolKind::Reserved, 1, None), list("a", PoolKind::Shared, "0")], &t1)
                .err(),
            Some(PoolError::NotEnoughCpus {
                pool: name("sys"),
                requested: 1,
                available: 0,
                where_: String::new()
            })
        );
    }

    #[test]
    fn isolcpus_pool_takes_kernel_isolated_cpus_and_requests_avoid_them() {
        let mut data = Topology::synthetic(1, 4, 1, 1).data().clone();
        data.isolated = set("2-3");
        let t = Topology::new(data);
        let pools = resolve(
            &[
                count("sys", PoolKind::Reserved, 1, None),
                PoolSpec::new(name("iso"), PoolKind::Exclusive, CpuSource::Isolcpus),
                count("web", PoolKind::Shared, 1, None),
            ],
            &t,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(cpus_of(&pools, "iso"), set("2-3"));
        assert_eq!(cpus_of(&pools, "sys"), set("0"));
        assert_eq!(cpus_of(&pools, "web"), set("1"));
    }
}
