//! A run-time change to the pools (`CreatePool`, `ResizePool`, `DeletePool`): what the adapters
//! decode their arguments into and send to the engine, and what the configuration's drop-in
//! writer records. Plain data, no I/O.

use crate::cpuset::CpuSet;
use crate::pool::{PoolKind, PoolName, Smt};

/// Where a pool's CPUs come from, as an edit gives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// An explicit CPU list (`cpus`).
    Cpus(CpuSet),
    /// A number of CPUs (`count`), optionally from one NUMA node (`numa`).
    Count {
        /// How many.
        count: u32,
        /// From this node only.
        numa: Option<u32>,
    },
}

/// One run-time change to the pools.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PoolEdit {
    /// A new pool; keys left `None` come from earlier files or the defaults.
    Create {
        /// Its name.
        name: PoolName,
        /// Its kind.
        kind: PoolKind,
        /// Its CPUs.
        source: Source,
        /// `smt`.
        smt: Option<Smt>,
        /// `isolate`.
        isolate: Option<bool>,
        /// `kubelet`.
        kubelet: Option<bool>,
        /// `dra`.
        dra: Option<bool>,
    },
    /// A new CPU source for an existing pool.
    Resize {
        /// The pool.
        name: PoolName,
        /// Its new CPUs.
        source: Source,
    },
    /// Removes a pool.
    Delete {
        /// The pool.
        name: PoolName,
    },
}

impl PoolEdit {
    /// The pool the edit is about.
    pub fn name(&self) -> &PoolName {
        match self {
            PoolEdit::Create { name, .. } | PoolEdit::Resize { name, .. } | PoolEdit::Delete { name } => name,
        }
    }

    /// The pool keys (`count`, `kind`, ...) the edit writes, which must take effect.
    pub fn keys(&self) -> Vec<&'static str> {
        let source = |s: &Source| match s {
            Source::Cpus(_) => vec!["cpus"],
            Source::Count { numa: None, .. } => vec!["count"],
            Source::Count { numa: Some(_), .. } => vec!["count", "numa"],
        };
        match self {
            PoolEdit::Create { source: s, smt, isolate, kubelet, dra, .. } => {
                let mut keys = vec!["kind"];
                keys.extend(source(s));
                keys.extend(smt.map(|_| "smt"));
                keys.extend(isolate.map(|_| "isolate"));
                keys.extend(kubelet.map(|_| "kubelet"));
                keys.extend(dra.map(|_| "dra"));
                keys
            }
            PoolEdit::Resize { source: s, .. } => source(s),
            PoolEdit::Delete { .. } => vec!["removed"],
        }
    }
}
