//! The wire contract of cpupoold: what the daemon's adapters and its clients (`cpupoolctl`)
//! must agree on, written once.
//!
//! - [`names`]: the D-Bus name, object and interface, the varlink interface and socket, the
//!   environment variables given to containers;
//! - [`ErrorKind`]: every error the management interfaces return, with its varlink and D-Bus
//!   error names, and [`ApiError`], one such error with its parameters and message;
//! - [`methods`]: the table of methods: names, who may call them, parameter and reply types;
//! - [`views`]: the types replies carry (pools, assignments, topology, status, isolation,
//!   events), serialized with the IDL's field names;
//! - [`varlink`]: the framing (NUL-terminated JSON), the call and reply envelopes, the message
//!   size limit, the IDL, and (from [`methods`]) one parameter struct per method;
//! - [`dbus`]: the introspection XML the daemon serves and packaging installs.
//!
//! It depends on serde alone, so the CLI can use it without linking daemon internals.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod dbus;
pub mod error;
pub mod methods;
pub mod names;
pub mod varlink;
pub mod views;

pub use error::{ApiError, ErrorKind};
