//! The table of methods: every method of the management interfaces declared once, with who
//! may call it, the struct its parameters decode into and the view its reply carries.
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

use crate::varlink::params;
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
    type Params: Serialize + DeserializeOwned + Send;
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
