//! The adapters: thin front-ends that decode a request, call the [`engine`](crate::engine)
//! through its [`Handle`](crate::engine::Handle), and encode the reply or map the error.
//!
//! The methods are declared once, in the wire contract's table
//! ([`cpupool_wire::methods`]); each has one handler in [`handlers`], which both transports
//! call: [`varlink`] decodes a call's JSON into the method's parameters, [`dbus`] converts its
//! arguments, and each encodes the handler's reply view its own way. No CPU is chosen here: a
//! reply or a metric shows what the snapshot holds (the most computed is a union or difference
//! of CPU sets it shows, such as the boot line's); each error kind maps to its own API error.
#![deny(missing_docs)]

pub mod args;
pub mod auth;
pub mod budget;
pub mod dbus;
pub mod error;
pub mod handlers;
pub mod metrics;
pub mod per_snapshot;
pub mod varlink;
pub mod views;
