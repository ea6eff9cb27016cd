//! The table of methods: every method of the management interfaces declared once, with who
//! may call it, the struct its parameters decode into ([`params`], in this file too) and the
//! view its reply carries.
//!
//! The daemon draws from it: varlink resolves a call's name here and decodes it into
//! [`Method::Params`], D-Bus's methods and the metrics label calls by [`MethodId::name`], and
//! both check [`MethodId::auth`] before a handler runs; one handler per method answers both
//! transports (the daemon's `api::handlers`). Clients draw from it too: the varlink client
//! sends [`Method::Params`] under [`Method::NAME`] and decodes [`Method::Reply`].
//!
//! What goes over the wire is not generated from here: the IDL (`org.cpupool.Manager.varlink`)
//! and the introspection XML (`dbus/org.cpupool.Manager1.xml`) are the contract, and this
//! module's tests check the table against both: the same methods, the same mutating ones.

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::views;

/// Who may call a method.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Auth {
    /// Anyone: the method reads.
    Anyone,
    /// Root or the daemon's admin group (`daemon.admin_group`): the method changes something.
    Admin,
}

/// One method of the table: its parameters and reply as types.
pub trait Method {
    /// Which method.
    const ID: MethodId;
    /// Its name, as both interfaces spell it (`GetPool`).
    const NAME: &'static str;
    /// What a call carries (varlink's parameters; D-Bus's arguments are converted into it).
    /// Its `Default` gives every required field and no optional one (D-Bus, which has no
    /// optionals, tells them apart by it).
    type Params: Serialize + DeserializeOwned + Send + Default;
    /// What a successful call returns (varlink's reply parameters; D-Bus's out arguments are
    /// converted from it).
    type Reply: Serialize + DeserializeOwned + Send;
}

macro_rules! methods {
    (
        $d:tt
        calls { $($(#[$doc:meta])* $name:ident($params:ty) -> $reply:ty, $auth:ident, dbus [$($dbus:literal),*];)* }
        streams { $($(#[$sdoc:meta])* $stream:ident($sparams:ty) -> $sreply:ty, $sauth:ident;)* }
    ) => {
        /// A method of the table, by name.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum MethodId {
            $($(#[$doc])* $name,)*
            $($(#[$sdoc])* $stream,)*
        }

        impl MethodId {
            /// Every method, in the table's order.
            pub const ALL: &'static [MethodId] = &[$(MethodId::$name,)* $(MethodId::$stream,)*];

            /// Its name, as both interfaces spell it.
            pub fn name(self) -> &'static str {
                match self {
                    $(MethodId::$name => stringify!($name),)*
                    $(MethodId::$stream => stringify!($stream),)*
                }
            }

            /// Who may call it.
            pub fn auth(self) -> Auth {
                match self {
                    $(MethodId::$name => Auth::$auth,)*
                    $(MethodId::$stream => Auth::$sauth,)*
                }
            }

            /// Whether it streams replies (varlink `more`; D-Bus has signals instead).
            pub fn streams(self) -> bool {
                match self {
                    $(MethodId::$name => false,)*
                    $(MethodId::$stream => true,)*
                }
            }

            /// The D-Bus methods that answer it (`Assign` has `AssignEx` beside it; a
            /// stream has none: D-Bus sends signals).
            pub fn dbus(self) -> &'static [&'static str] {
                match self {
                    $(MethodId::$name => &[$($dbus),*],)*
                    $(MethodId::$stream => &[],)*
                }
            }

            /// The method called `name` (short, as in `GetPool`).
            pub fn from_name(name: &str) -> Option<MethodId> {
                MethodId::ALL.iter().copied().find(|m| m.name() == name)
            }
        }

        $(
            $(#[$doc])*
            #[derive(Debug, Clone, Copy)]
            pub struct $name;

            impl Method for $name {
                const ID: MethodId = MethodId::$name;
                const NAME: &'static str = stringify!($name);
                type Params = $params;
                type Reply = $reply;
            }
        )*
        $(
            $(#[$sdoc])*
            #[derive(Debug, Clone, Copy)]
            pub struct $stream;

            impl Method for $stream {
                const ID: MethodId = MethodId::$stream;
                const NAME: &'static str = stringify!($stream);
                type Params = $sparams;
                type Reply = $sreply;
            }
        )*

        /// Expands `$mac! { Name, Name, ... }` with every method of the table that answers once
        /// (streams aside), for code written once per method: a transport's dispatch.
        #[macro_export]
        macro_rules! for_each_call {
            ($d mac:ident) => { $d mac! { $($name),* } };
        }
    };
}

methods! {
    $
    calls {
        /// `ListPools`: every pool.
        ListPools(params::NoParameters) -> views::Pools, Anyone, dbus ["ListPools"];
        /// `GetPool`: one pool.
        GetPool(params::GetPool) -> views::PoolReply, Anyone, dbus ["GetPool"];
        /// `GetTopology`: the host's CPUs.
        GetTopology(params::NoParameters) -> views::Topology, Anyone, dbus ["GetTopology"];
        /// `ListAssignments`: every assignment, or one pool's.
        ListAssignments(params::ListAssignments) -> views::Assignments, Anyone, dbus ["ListAssignments"];
        /// `GetAssignment`: one assignment.
        GetAssignment(params::GetAssignment) -> views::AssignmentReply, Anyone, dbus ["GetAssignment"];
        /// `Status`: the daemon in brief.
        Status(params::NoParameters) -> views::Status, Anyone, dbus ["Status"];
        /// `GetIsolation`: isolation health of one pool or every isolated pool.
        GetIsolation(params::GetIsolation) -> views::Isolation, Anyone, dbus ["GetIsolation"];
        /// `GetClasses`: the power and cache settings of one pool or every pool.
        GetClasses(params::GetClasses) -> views::Classes, Anyone, dbus ["GetClasses"];
        /// `Assign`: CPUs from a pool for a target.
        Assign(params::Assign) -> views::AssignmentReply, Admin, dbus ["Assign", "AssignEx"];
        /// `Run`: CPUs from a pool for a process of the caller's, confined.
        Run(params::Run) -> views::AssignmentReply, Admin, dbus ["Run"];
        /// `Release`: an assignment given back.
        Release(params::Release) -> views::AssignmentReply, Admin, dbus ["Release"];
        /// `CreatePool`: a new pool.
        CreatePool(params::CreatePool) -> views::PoolReply, Admin, dbus ["CreatePool"];
        /// `ResizePool`: a pool's CPUs from a new source.
        ResizePool(params::ResizePool) -> views::PoolReply, Admin, dbus ["ResizePool"];
        /// `DeletePool`: a pool without assignments removed.
        DeletePool(params::DeletePool) -> views::Nothing, Admin, dbus ["DeletePool"];
        /// `Reload`: the configuration files read again and applied.
        Reload(params::NoParameters) -> views::Reloaded, Admin, dbus ["Reload"];
    }
    streams {
        /// `Monitor`: every change, after a replay of the pools.
        Monitor(params::NoParameters) -> views::EventReply, Anyone;
    }
}

pub mod params {
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
            /// Serve it by DRA instead of the device plugin (as the configuration's `dra`).
            dra: Option<bool>,
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
                        dra: Some(true),
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
            assert_eq!(
                serde_json::to_value(&a).ok(),
                Some(json!({"pool": "dp", "target": "pid:1", "cpus": 2}))
            );
            assert!(serde_json::from_value::<GetPool>(json!({"name": "x", "nme": "y"})).is_err());
            assert!(serde_json::from_value::<NoParameters>(json!({"x": 1})).is_err());
            let null_id = serde_json::from_value::<Assign>(json!({"pool": "p", "target": "t", "id": null}));
            assert_eq!(null_id.ok().map(|a| a.id), Some(None));
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;
    use crate::varlink::IDL;

    fn table(f: impl Fn(MethodId) -> bool) -> BTreeSet<String> {
        MethodId::ALL.iter().copied().filter(|m| f(*m)).map(|m| m.name().to_owned()).collect()
    }

    /// The IDL declares exactly the table's methods.
    #[test]
    fn the_table_has_the_idls_methods() {
        let idl: BTreeSet<String> = IDL
            .lines()
            .filter_map(|l| l.strip_prefix("method "))
            .filter_map(|l| l.split('(').next())
            .map(str::to_owned)
            .collect();
        assert_eq!(table(|_| true), idl);
    }

    /// The IDL's header names the methods that need the admin group: the table's `Admin` ones.
    #[test]
    fn the_idls_header_names_the_admin_methods() {
        let header: String = IDL.lines().take_while(|l| l.starts_with('#')).collect::<Vec<_>>().join(" ");
        let (_, rest) = header.split_once("Reads are open to everyone;").unwrap_or_default();
        let (list, _) = rest.split_once("need root").unwrap_or_default();
        let named: BTreeSet<String> = list
            .replace(" and ", ",")
            .replace('#', " ")
            .split(',')
            .map(|n| n.trim().to_owned())
            .filter(|n| !n.is_empty())
            .collect();
        assert_eq!(table(|m| m.auth() == Auth::Admin), named);
    }

    /// The introspection XML declares exactly the table's D-Bus methods.
    #[test]
    fn the_table_has_the_xmls_methods() {
        let xml: BTreeSet<String> = crate::dbus::INTROSPECTION_XML
            .split("<method name=\"")
            .skip(1)
            .filter_map(|s| s.split('"').next())
            .map(str::to_owned)
            .collect();
        let ours: BTreeSet<String> =
            MethodId::ALL.iter().flat_map(|m| m.dbus()).map(|n| (*n).to_owned()).collect();
        assert_eq!(ours, xml);
        // A stream has no D-Bus method; every call has one under its own name.
        for m in MethodId::ALL {
            assert_eq!(m.streams(), m.dbus().is_empty(), "{m:?}");
            assert!(m.streams() || m.dbus().contains(&m.name()), "{m:?}");
        }
    }

    #[test]
    fn names_resolve() {
        for &m in MethodId::ALL {
            assert_eq!(MethodId::from_name(m.name()), Some(m));
        }
        assert_eq!(GetClasses::NAME, "GetClasses");
        assert_eq!(<Assign as Method>::ID.auth(), Auth::Admin);
        assert_eq!(MethodId::from_name("Nope"), None);
    }
}
