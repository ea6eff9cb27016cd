//! One struct per method of `org.cpupool.Manager` (and of `org.varlink.service`): the
//! daemon decodes a call's parameters into it, refusing names the method does not take, and
//! clients serialize the same struct, leaving absent optionals out.
//!
//! Numbers are `i64` as the IDL's `int` is: a negative or too large size is the daemon's
//! `InvalidArgument` naming the argument, not a decoding failure. `null` is the same as an
//! absent optional.

use serde::{Deserialize, Serialize};

macro_rules! params {
    ($($(#[$doc:meta])* $name:ident { $($(#[$fdoc:meta])* $field:ident: $ty:ty,)* })*) => {
        $(
            $(#[$doc])*
            #[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
            #[serde(deny_unknown_fields)]
            pub struct $name {
                $(
                    $(#[$fdoc])*
                    #[serde(skip_serializing_if = "IsAbsent::is_absent")]
                    pub $field: $ty,
                )*
            }
        )*
    };
}

/// Whether a field is left out of a call (only absent optionals are).
trait IsAbsent {
    fn is_absent(&self) -> bool;
}

impl<T> IsAbsent for Option<T> {
    fn is_absent(&self) -> bool {
        self.is_none()
    }
}

impl IsAbsent for String {
    fn is_absent(&self) -> bool {
        false
    }
}

impl IsAbsent for i64 {
    fn is_absent(&self) -> bool {
        false
    }
}

params! {
    /// The parameters of a method that takes none (`ListPools`, `GetTopology`, `Status`,
    /// `Reload`, `Monitor`, `GetInfo`).
    NoParameters {}

    /// `GetInterfaceDescription`.
    GetInterfaceDescription {
        /// The interface.
        interface: String,
    }

    /// `GetPool`.
    GetPool {
        /// The pool.
        name: String,
    }

    /// `ListAssignments`.
    ListAssignments {
        /// Only this pool's.
        pool: Option<String>,
    }

    /// `GetAssignment`.
    GetAssignment {
        /// The assignment.
        id: String,
    }

    /// `GetIsolation`.
    GetIsolation {
        /// Only this pool; every isolated pool when absent or empty.
        pool: Option<String>,
    }

    /// `GetClasses`.
    GetClasses {
        /// Only this pool's (`(idle)` for the CPUs in no pool); every pool's when absent or
        /// empty.
        pool: Option<String>,
    }

    /// `Assign`: `cpus` or `millicpus`, exactly one.
    Assign {
        /// The pool to assign from.
        pool: String,
        /// `unit:NAME`, `cgroup:PATH` or `pid:N`.
        target: String,
        /// Whole CPUs.
        cpus: Option<i64>,
        /// Millicpus.
        millicpus: Option<i64>,
        /// The id to use; the daemon chooses one when absent.
        id: Option<String>,
        /// Release it when the target goes away (true when absent).
        reclaim: Option<bool>,
    }

    /// `Run`: `cpus` or `millicpus`, exactly one.
    Run {
        /// The pool to assign from.
        pool: String,
        /// The process (the caller's own).
        pid: i64,
        /// Whole CPUs.
        cpus: Option<i64>,
        /// Millicpus.
        millicpus: Option<i64>,
        /// The id to use; the daemon chooses one when absent.
        id: Option<String>,
    }

    /// `Release`.
    Release {
        /// The assignment.
        id: String,
    }

    /// `CreatePool`: `cpus` or `count`, exactly one; the other keys as in the configuration
    /// file, the daemon's defaults when absent.
    CreatePool {
        /// The new pool's name.
        name: String,
        /// `reserved`, `exclusive` or `shared`.
        kind: String,
        /// A kernel CPU list.
        cpus: Option<String>,
        /// A number of CPUs, packed by the daemon.
        count: Option<i64>,
        /// With `count`: take them all from this NUMA node.
        numa: Option<i64>,
        /// `full-cores` or `threads`.
        smt: Option<String>,
        /// Run as an isolated cpuset partition.
        isolate: Option<bool>,
        /// Offer the pool to the kubelet.
        kubelet: Option<bool>,
    }

    /// `ResizePool`: `cpus` or `count`, exactly one.
    ResizePool {
        /// The pool.
        name: String,
        /// A kernel CPU list.
        cpus: Option<String>,
        /// A number of CPUs, packed by the daemon.
        count: Option<i64>,
        /// With `count`: take them all from this NUMA node.
        numa: Option<i64>,
    }

    /// `DeletePool`.
    DeletePool {
        /// The pool.
        name: String,
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use serde_json::{json, Value};

    use super::*;
    use crate::varlink::IDL;

    /// The names a struct serializes with every optional given.
    fn names(v: impl Serialize) -> BTreeSet<String> {
        match serde_json::to_value(v) {
            Ok(Value::Object(m)) => m.keys().cloned().collect(),
            _ => BTreeSet::new(),
        }
    }

    /// The parameter names of `method` in the IDL.
    fn idl(method: &str) -> BTreeSet<String> {
        let start = IDL.find(&format!("method {method}(")).unwrap_or_else(|| panic!("{method}"));
        let rest = &IDL[start + method.len() + 8..];
        let args = &rest[..rest.find(") ->").unwrap_or_else(|| panic!("{method}"))];
        args.lines()
            .map(|l| l.split('#').next().unwrap_or_default())
            .flat_map(|l| l.split(','))
            .filter_map(|a| a.split_once(':').map(|(n, _)| n.trim().to_owned()))
            .collect()
    }

    /// Each struct has exactly the IDL's parameters.
    #[test]
    fn structs_match_the_idl() {
        let s = || Some(String::new());
        let cases: Vec<(&str, BTreeSet<String>)> = vec![
            ("ListPools", names(NoParameters {})),
            ("GetPool", names(GetPool::default())),
            ("ListAssignments", names(ListAssignments { pool: s() })),
            ("GetAssignment", names(GetAssignment::default())),
            ("GetIsolation", names(GetIsolation { pool: s() })),
            ("GetClasses", names(GetClasses { pool: s() })),
            (
                "Assign",
                names(Assign {
                    cpus: Some(1),
                    millicpus: Some(1),
                    id: s(),
                    reclaim: Some(true),
                    ..Default::default()
                }),
            ),
            ("Run", names(Run { cpus: Some(1), millicpus: Some(1), id: s(), ..Default::default() })),
            ("Release", names(Release::default())),
            (
                "CreatePool",
                names(CreatePool {
                    cpus: s(),
                    count: Some(1),
                    numa: Some(1),
                    smt: s(),
                    isolate: Some(true),
                    kubelet: Some(true),
                    ..Default::default()
                }),
            ),
            (
                "ResizePool",
                names(ResizePool { cpus: s(), count: Some(1), numa: Some(1), ..Default::default() }),
            ),
            ("DeletePool", names(DeletePool::default())),
        ];
        for (method, fields) in cases {
            assert_eq!(fields, idl(method), "{method}");
        }
    }

    #[test]
    fn absent_optionals_are_left_out_and_unknown_names_refused() {
        let a = Assign { pool: "dp".into(), target: "pid:1".into(), cpus: Some(2), ..Default::default() };
        assert_eq!(serde_json::to_value(&a).ok(), Some(json!({"pool": "dp", "target": "pid:1", "cpus": 2})));
        assert!(serde_json::from_value::<GetPool>(json!({"name": "x", "nme": "y"})).is_err());
        assert!(serde_json::from_value::<NoParameters>(json!({"x": 1})).is_err());
        let null_id = serde_json::from_value::<Assign>(json!({"pool": "p", "target": "t", "id": null}));
        assert_eq!(null_id.ok().map(|a| a.id), Some(None));
    }
}
