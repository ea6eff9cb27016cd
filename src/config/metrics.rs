//! `[metrics]`: where the metrics endpoint listens. The setting's types live here, with the
//! configuration; the server that binds them is an adapter (`api::metrics`).

use std::net::SocketAddr;
use std::path::PathBuf;

/// Where the endpoint listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Listen {
    /// A TCP address.
    Tcp(SocketAddr),
    /// A unix socket.
    Unix(PathBuf),
}

impl std::fmt::Display for Listen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Listen::Tcp(a) => write!(f, "http://{a}/metrics"),
            Listen::Unix(p) => write!(f, "unix:{} (GET /metrics)", p.display()),
        }
    }
}

/// `[metrics]`: where the metrics endpoint listens (served by `api::metrics`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Metrics {
    /// `metrics.enabled`: serve the endpoint.
    pub enabled: bool,
    /// `metrics.listen`: an `IP:PORT` or `unix:/PATH`.
    pub listen: Listen,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            enabled: true,
            listen: Listen::Tcp(std::net::SocketAddr::from(([127, 0, 0, 1], DEFAULT_METRICS_PORT))),
        }
    }
}

/// The port of `metrics.listen` when no file sets it (loopback only: the figures describe the
/// host's workloads, and the endpoint has no authentication).
pub const DEFAULT_METRICS_PORT: u16 = 9465;

/// Parses `metrics.listen`: `IP:PORT` (`[IPv6]:PORT`) or `unix:/ABSOLUTE/PATH`. Host names are
/// refused: what a name resolves to may change, and a root daemon should not resolve names to
/// decide where it listens.
pub fn parse_metrics_listen(text: &str) -> Result<Listen, String> {
    if let Some(path) = text.strip_prefix("unix:") {
        let path = PathBuf::from(path);
        return if path.is_absolute() {
            Ok(Listen::Unix(path))
        } else {
            Err(format!(
                "`{}`: a unix socket needs an absolute path (unix:/run/cpupoold/metrics.sock)",
                text.escape_debug()
            ))
        };
    }
    text.parse::<std::net::SocketAddr>().map(Listen::Tcp).map_err(|_| {
        format!(
            "`{}` is not an IP:PORT address (127.0.0.1:9465, [::1]:9465) or unix:/PATH",
            text.escape_debug()
        )
    })
}
