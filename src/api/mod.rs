//! The adapters: thin front-ends that decode a request, call the [`engine`](crate::engine)
//! through its [`Handle`](crate::engine::Handle), and encode the reply or map the error.
//!
//! No CPU arithmetic lives here; each error kind maps to its own API error.
#![deny(missing_docs)]

pub mod auth;
pub mod budget;
pub mod dbus;
pub mod metrics;
pub mod ops;
pub mod varlink;
