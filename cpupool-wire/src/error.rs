//! Every error kind the management interfaces return.
//!
//! One kind is one varlink error (`org.cpupool.Manager.<kind>`, declared in the IDL with its
//! parameters) and one D-Bus error (`org.cpupool.Manager1.Error.<kind>`, whose message is its
//! only detail). Kinds are never collapsed into a generic failure.

use std::fmt;
use std::str::FromStr;

use crate::names::{DBUS_ERROR_PREFIX, VARLINK_INTERFACE};

macro_rules! kinds {
    ($($(#[$doc:meta])* $kind:ident,)*) => {
        /// An error kind of the management interfaces.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum ErrorKind {
            $($(#[$doc])* $kind,)*
        }

        impl ErrorKind {
            /// Every kind, in the IDL's order.
            pub const ALL: &'static [ErrorKind] = &[$(ErrorKind::$kind,)*];

            /// The short name: `NoSuchPool`, `InvalidArgument`, ...
            pub fn name(self) -> &'static str {
                match self {
                    $(ErrorKind::$kind => stringify!($kind),)*
                }
            }
        }
    };
}

kinds! {
    /// No pool of that name.
    NoSuchPool,
    /// A pool of that name exists already.
    PoolExists,
    /// The pool still has assignments.
    PoolInUse,
    /// No assignment with that id.
    NoSuchAssignment,
    /// The pool has less free capacity than asked.
    InsufficientCapacity,
    /// The id belongs to an assignment with another pool, target or size.
    DuplicateId,
    /// The target has an assignment already.
    TargetBusy,
    /// The target may not be assigned (a system slice, the daemon itself, ...).
    TargetNotAllowed,
    /// The target sits where the pool's CPUs cannot reach it.
    TargetOutsidePool,
    /// An argument is invalid; its parameters name it.
    InvalidArgument,
    /// The reserved pool is not assigned from.
    ReservedPool,
    /// The pool hands out whole cores, and the size is not.
    NotWholeCores,
    /// The caller may not change pools or assignments.
    AccessDenied,
    /// Applying the change to the host failed; it was rolled back.
    ApplyFailed,
    /// The change could not be saved; it was rolled back.
    NotDurable,
    /// The configuration is invalid; the running one stays.
    ConfigRejected,
    /// The configuration would strand assignments; the running one stays.
    AssignmentsStranded,
    /// Reading the CPU topology failed.
    TopologyFailed,
    /// The daemon is shutting down.
    ShuttingDown,
    /// Too many connections (varlink), or too many calls in flight (D-Bus).
    Busy,
    /// A call longer than the limit (varlink only).
    MessageTooLarge,
}

impl ErrorKind {
    /// The varlink error name, `org.cpupool.Manager.<kind>`.
    pub fn varlink_name(self) -> String {
        format!("{VARLINK_INTERFACE}.{}", self.name())
    }

    /// The D-Bus error name, `org.cpupool.Manager1.Error.<kind>`.
    pub fn dbus_name(self) -> String {
        format!("{DBUS_ERROR_PREFIX}.{}", self.name())
    }

    /// Whether the D-Bus interface returns it: `MessageTooLarge` is about varlink's framing,
    /// which the bus does for D-Bus.
    pub fn on_dbus(self) -> bool {
        !matches!(self, ErrorKind::MessageTooLarge)
    }

    /// The kind of a varlink or D-Bus error name, or of a short name; `None` for names that
    /// are not ours (`org.varlink.service.MethodNotFound`).
    pub fn from_error_name(name: &str) -> Option<ErrorKind> {
        let short = name
            .strip_prefix(VARLINK_INTERFACE)
            .and_then(|s| s.strip_prefix('.'))
            .or_else(|| name.strip_prefix(DBUS_ERROR_PREFIX).and_then(|s| s.strip_prefix('.')))
            .unwrap_or(name);
        short.parse().ok()
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A name that is no error kind.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{0}` is not an error kind of org.cpupool.Manager")]
pub struct UnknownKind(pub String);

impl FromStr for ErrorKind {
    type Err = UnknownKind;

    fn from_str(s: &str) -> Result<ErrorKind, UnknownKind> {
        ErrorKind::ALL.iter().copied().find(|k| k.name() == s).ok_or_else(|| UnknownKind(s.to_owned()))
    }
}

/// Compares with a short name, as tests and logs hold them.
impl PartialEq<&str> for ErrorKind {
    fn eq(&self, other: &&str) -> bool {
        self.name() == *other
    }
}

/// A refused or failed call as both interfaces send it: varlink as the error
/// `org.cpupool.Manager.<kind>` with `params`, D-Bus as `org.cpupool.Manager1.Error.<kind>`
/// with `message`. The daemon maps each of its errors to one ([`ErrorKind`] says which).
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    /// The error's kind: `NoSuchPool`, `InvalidArgument`, ...
    pub kind: ErrorKind,
    /// Its fields (varlink error parameters, as the IDL declares them).
    pub params: serde_json::Value,
    /// A sentence for people, naming the argument at fault (the D-Bus error message).
    pub message: String,
}

impl ApiError {
    /// An error of `kind`.
    pub fn new(kind: ErrorKind, params: serde_json::Value, message: impl Into<String>) -> ApiError {
        ApiError { kind, params, message: message.into() }
    }

    /// `InvalidArgument` naming `argument`.
    pub fn invalid_argument(argument: &str, reason: &str) -> ApiError {
        ApiError::new(
            ErrorKind::InvalidArgument,
            serde_json::json!({ "argument": argument, "reason": reason }),
            format!("invalid {argument}: {reason}"),
        )
    }

    /// `ShuttingDown`.
    pub fn shutting_down() -> ApiError {
        ApiError::new(ErrorKind::ShuttingDown, serde_json::json!({}), "the daemon is shutting down")
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;
    use crate::varlink::IDL;

    #[test]
    fn every_kind_is_an_idl_error_and_every_idl_error_a_kind() {
        let idl: BTreeSet<&str> = IDL
            .lines()
            .filter_map(|l| l.strip_prefix("error "))
            .filter_map(|l| l.split_whitespace().next())
            .collect();
        let ours: BTreeSet<&str> = ErrorKind::ALL.iter().map(|k| k.name()).collect();
        assert_eq!(ours, idl);
        assert_eq!(ours.len(), ErrorKind::ALL.len());
    }

    #[test]
    fn every_dbus_kind_is_in_the_introspection_xml() {
        for k in ErrorKind::ALL.iter().filter(|k| k.on_dbus()) {
            // The file lists them as `org.cpupool.Manager1.Error.NoSuchPool, .PoolExists, ...`.
            assert!(crate::dbus::INTROSPECTION_XML.contains(&format!(".{k}")), "{k}");
        }
    }

    #[test]
    fn names_round_trip() {
        for &k in ErrorKind::ALL {
            assert_eq!(ErrorKind::from_error_name(&k.varlink_name()), Some(k));
            assert_eq!(ErrorKind::from_error_name(&k.dbus_name()), Some(k));
            assert_eq!(k.name().parse::<ErrorKind>(), Ok(k));
        }
        assert_eq!(ErrorKind::NoSuchPool.varlink_name(), "org.cpupool.Manager.NoSuchPool");
        assert_eq!(ErrorKind::NoSuchPool.dbus_name(), "org.cpupool.Manager1.Error.NoSuchPool");
        assert_eq!(ErrorKind::from_error_name("org.varlink.service.MethodNotFound"), None);
        assert_eq!(ErrorKind::from_error_name("org.cpupool.Manager.Foo.Bar"), None);
        assert!("Nope".parse::<ErrorKind>().is_err());
    }
}
