//! Which D-Bus bus to connect to: the daemon's own service ([`crate::api::dbus`]) and the
//! systemd backend ([`super::systemd`]) both connect through it.

use std::fmt;

/// Which bus to serve on or talk to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Bus {
    /// The system bus (the daemon's normal place).
    System,
    /// The user's session bus.
    Session,
    /// A bus at this address (`unix:path=...`): tests and the sandbox's private bus.
    Address(String),
}

impl Bus {
    /// A connection builder for the bus.
    pub fn builder(&self) -> zbus::Result<zbus::connection::Builder<'_>> {
        match self {
            Bus::System => zbus::connection::Builder::system(),
            Bus::Session => zbus::connection::Builder::session(),
            Bus::Address(a) => zbus::connection::Builder::address(a.as_str()),
        }
    }

    /// A plain client connection to the bus.
    pub async fn connect(&self) -> zbus::Result<zbus::Connection> {
        self.builder()?.build().await
    }
}

impl fmt::Display for Bus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Bus::System => f.write_str("the system bus"),
            Bus::Session => f.write_str("the session bus"),
            Bus::Address(a) => write!(f, "the bus at `{a}`"),
        }
    }
}
