//! The metrics endpoint: Prometheus text and OpenMetrics over HTTP (`GET /metrics`).
//!
//! Two kinds of figures, and where each comes from:
//! - **Counters and histograms** (API calls, durable saves, group commits, reclaims, drift
//!   corrections, the device plugin) live in one process-wide [`crate::counters::Counters`],
//!   on the ground floor: the code paths that do the work add to them with one atomic
//!   operation each; nothing there waits. A scrape reads them.
//! - **Gauges of the state** (pools, assignments, partitions, isolation health) are computed at
//!   scrape time from the engine's latest published [`Snapshot`] (a `watch` channel): a scrape
//!   never sends the engine a request, so it neither waits behind a mutation nor delays one.
//!
//! Isolation health is what the daemon's health tick already measured (`IsolationReport`); a
//! scrape reads no per-CPU counter itself, so scraping does not wake isolated CPUs (the daemon's
//! own threads run on the housekeeping CPUs its unit confines it to).
//!
//! The server ([`serve`]) is a small hyper HTTP/1 server: only `GET`/`HEAD /metrics`, at most
//! [`MAX_CONNECTIONS`] connections at once, [`MAX_CONNECTIONS_PER_PEER`] of one peer, where a
//! new connection takes the slot of the one idle longest ([`slots`]: connections that ask
//! nothing cannot keep scrapers out), request heads of at most 8 KiB that must arrive within
//! [`REQUEST_TIMEOUT`], and each connection ends after [`CONNECTION_TIMEOUT`], so a slow or
//! stuck client holds one slot for a bounded time and stalls nothing else. The answer is OpenMetrics when the client asks for it (`Accept:
//! application/openmetrics-text`, as Prometheus does), the Prometheus text format 0.0.4
//! otherwise.
#![deny(missing_docs)]

mod collect;
mod slots;

use std::convert::Infallible;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use collect::{ProcessCollector, SnapshotCollector};
use http_body_util::Full;
use hyper::body::Bytes;
use hyper::{Method, Request, Response, StatusCode};
use prometheus_client::registry::Registry;
use slots::{Admit, Answering, Peer, Slots};
use tokio::sync::watch;

use crate::config::Listen;
use crate::engine::Snapshot;

/// What a scrape encodes: the process-wide counters, the snapshot's gauges, the process's
/// figures.
#[derive(Debug)]
pub struct Exporter {
    registry: Registry,
    process: Registry,
}

/// The OpenMetrics content type.
pub const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// The Prometheus text format's content type.
pub const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

impl Exporter {
    /// The exporter of the daemon publishing `snapshots`.
    pub fn new(snapshots: watch::Receiver<Snapshot>) -> Exporter {
        let mut registry = Registry::with_prefix("cpupoold");
        crate::counters::counters().register(&mut registry);
        registry.register_collector(Box::new(SnapshotCollector { snapshots }));
        // `process_*` without our prefix, as every exporter names them.
        let mut process = Registry::default();
        process.register_collector(Box::new(ProcessCollector));
        Exporter { registry, process }
    }

    /// The OpenMetrics text (ends with `# EOF`).
    pub fn openmetrics(&self) -> String {
        let mut out = String::with_capacity(16 * 1024);
        // Writing to a String fails only if an encoder does, which ours do not.
        let _ = prometheus_client::encoding::text::encode_registry(&mut out, &self.registry);
        let _ = prometheus_client::encoding::text::encode_registry(&mut out, &self.process);
        let _ = prometheus_client::encoding::text::encode_eof(&mut out);
        out
    }

    /// The same figures in the Prometheus text format 0.0.4 (see [`to_prometheus_text`]).
    pub fn prometheus_text(&self) -> String {
        to_prometheus_text(&self.openmetrics())
    }
}

/// Turns OpenMetrics text into the Prometheus text format 0.0.4: a counter family is named
/// with its `_total` suffix there (its samples already are), and `# UNIT` and `# EOF` are not
/// part of it.
pub fn to_prometheus_text(om: &str) -> String {
    let mut counters = std::collections::HashSet::new();
    for line in om.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            if let Some(name) = rest.strip_suffix(" counter") {
                counters.insert(name.to_owned());
            }
        }
    }
    let mut out = String::with_capacity(om.len());
    for line in om.lines() {
        if line.starts_with("# UNIT ") || line == "# EOF" {
            continue;
        }
        let meta = line
            .strip_prefix("# HELP ")
            .map(|r| ("HELP", r))
            .or(line.strip_prefix("# TYPE ").map(|r| ("TYPE", r)));
        match meta {
            Some((kind, rest)) => {
                let (name, tail) = rest.split_once(' ').unwrap_or((rest, ""));
                let suffix = if counters.contains(name) { "_total" } else { "" };
                let _ = writeln!(out, "# {kind} {name}{suffix} {tail}");
            }
            None => {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    out
}

/// A bound endpoint.
#[derive(Debug)]
pub enum Listener {
    /// TCP.
    Tcp(tokio::net::TcpListener),
    /// A unix socket.
    Unix(tokio::net::UnixListener),
}

impl Listener {
    /// What it listens on (the real port when port 0 was asked for).
    pub fn local(&self) -> std::io::Result<Listen> {
        Ok(match self {
            Listener::Tcp(l) => Listen::Tcp(l.local_addr()?),
            Listener::Unix(l) => {
                Listen::Unix(l.local_addr()?.as_pathname().map(std::path::Path::to_owned).unwrap_or_default())
            }
        })
    }
}

/// The listener to serve: a TCP socket passed by the service manager (socket activation, e.g.
/// `cpupoold-metrics.socket`), or `listen` bound here. A unix socket is made mode 0660: the
/// figures name the host's pools and workloads. Must be called within a tokio runtime.
/// `passed`: the sockets passed by the service manager (see [`crate::api::varlink::listen_from`]).
pub fn listen(listen: &Listen, passed: &mut listenfd::ListenFd) -> std::io::Result<Listener> {
    for i in 0..passed.len() {
        if let Ok(Some(l)) = passed.take_tcp_listener(i) {
            l.set_nonblocking(true)?;
            log::info!(
                "metrics: serving the TCP socket passed by the service manager ({:?})",
                l.local_addr()
            );
            return Ok(Listener::Tcp(tokio::net::TcpListener::from_std(l)?));
        }
    }
    Ok(match listen {
        Listen::Tcp(a) => {
            let l = std::net::TcpListener::bind(a)?;
            l.set_nonblocking(true)?;
            Listener::Tcp(tokio::net::TcpListener::from_std(l)?)
        }
        Listen::Unix(p) => {
            let l = crate::host::socket::bind_unix(p, 0o660)?;
            l.set_nonblocking(true)?;
            Listener::Unix(tokio::net::UnixListener::from_std(l)?)
        }
    })
}

/// Connection slots; when all are taken, a new connection takes the slot of the one idle the
/// longest (see [`slots`]), and is closed at accept only if every connection is answering.
pub const MAX_CONNECTIONS: usize = 16;
/// Slots one peer (a remote address; all of loopback; a unix socket uid) may hold; beyond them
/// its own idle connections give way first.
pub const MAX_CONNECTIONS_PER_PEER: usize = 8;
/// How long a request head may take to arrive, on a new connection and between the requests
/// of a kept-alive one.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);
/// How long one connection may stay open, whatever it does.
pub const CONNECTION_TIMEOUT: Duration = Duration::from_secs(10);

/// Serves `GET /metrics` on `listener` until `stop` completes.
pub async fn serve(listener: Listener, exporter: Arc<Exporter>, stop: impl std::future::Future<Output = ()>) {
    let mut slots = Slots::new(MAX_CONNECTIONS, MAX_CONNECTIONS_PER_PEER);
    let mut conns = tokio::task::JoinSet::new();
    tokio::pin!(stop);
    loop {
        let accepted = tokio::select! {
            _ = &mut stop => break,
            Some(ended) = conns.join_next_with_id(), if !conns.is_empty() => {
                let id = match ended {
                    Ok((id, ())) => id,
                    Err(e) => e.id(),
                };
                slots.remove(|h: &tokio::task::AbortHandle| h.id() == id);
                continue;
            }
            a = accept(&listener) => a,
        };
        let (io, peer) = match accepted {
            Ok(a) => a,
            Err(e) => {
                log::warn!("metrics: accept failed: {e}");
                // Out of descriptors, most likely: give the others a moment to end.
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let mut tries = 0;
        let admitted = loop {
            match slots.admit(&peer, tries < ADMIT_YIELDS) {
                // Connections accepted but not read yet: let their tasks run, they may hold a
                // scraper's request.
                Admit::Wait => {
                    tries += 1;
                    tokio::task::yield_now().await;
                }
                Admit::Evict(idle) => {
                    idle.abort();
                    break true;
                }
                Admit::Room => break true,
                Admit::Refuse => break false,
            }
        };
        // Every slot is answering: closed at once (dropped), so a flood costs one accept each.
        if !admitted {
            continue;
        }
        let activity = slots.activity();
        let io = hyper_util::rt::TokioIo::new(Watched { io, activity: activity.clone() });
        let exporter = exporter.clone();
        let conn_activity = activity.clone();
        let task = conns.spawn(async move {
            let service = hyper::service::service_fn(move |req| {
                let busy = conn_activity.answering();
                let exporter = exporter.clone();
                async move {
                    Ok::<_, Infallible>(answer(&exporter, &req).map(|body| Answer { body, _busy: busy }))
                }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(REQUEST_TIMEOUT)
                .max_buf_size(8192)
                .serve_connection(io, service);
            let _ = tokio::time::timeout(CONNECTION_TIMEOUT, conn).await;
        });
        slots.insert(peer, activity, task);
    }
    conns.shutdown().await;
}

/// An answer's body, holding its connection busy until hyper has written it and drops it.
struct Answer {
    body: Full<Bytes>,
    _busy: Answering,
}

impl hyper::body::Body for Answer {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, Infallible>>> {
        std::pin::Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.body.size_hint()
    }
}

/// How often a new connection lets the connections not read yet be read before one of them is
/// closed for it ([`Admit::Wait`]).
const ADMIT_YIELDS: usize = 4;

/// A connection of either kind.
type Io = Box<dyn Stream>;
trait Stream: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin> Stream for T {}

/// A connection that tells its [`slots::Activity`] when a read finds nothing to read.
struct Watched {
    io: Io,
    activity: Arc<slots::Activity>,
}

impl tokio::io::AsyncRead for Watched {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let r = std::pin::Pin::new(&mut self.io).poll_read(cx, buf);
        if r.is_pending() {
            self.activity.waited();
        }
        r
    }
}

impl tokio::io::AsyncWrite for Watched {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// The next connection and who it comes from.
async fn accept(l: &Listener) -> std::io::Result<(Io, Peer)> {
    let (stream, peer) = match l {
        Listener::Tcp(l) => {
            let (s, addr) = l.accept().await?;
            (Box::new(s) as Box<dyn Stream>, Peer::from_ip(addr.ip()))
        }
        Listener::Unix(l) => {
            let (s, _) = l.accept().await?;
            let peer = s.peer_cred().map_or(Peer::Unknown, |c| Peer::Uid(c.uid()));
            (Box::new(s) as Box<dyn Stream>, peer)
        }
    };
    Ok((stream, peer))
}

fn answer<B>(exporter: &Exporter, req: &Request<B>) -> Response<Full<Bytes>> {
    let reply = |status: StatusCode, body: &'static str| {
        let mut r = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
        *r.status_mut() = status;
        r
    };
    if req.uri().path() != "/metrics" {
        return reply(StatusCode::NOT_FOUND, "only /metrics is served here\n");
    }
    if req.method() != Method::GET && req.method() != Method::HEAD {
        let mut r = reply(StatusCode::METHOD_NOT_ALLOWED, "GET or HEAD\n");
        r.headers_mut().insert(hyper::header::ALLOW, hyper::header::HeaderValue::from_static("GET, HEAD"));
        return r;
    }
    let openmetrics = req
        .headers()
        .get_all(hyper::header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.contains("application/openmetrics-text"));
    let (body, kind) = if openmetrics {
        (exporter.openmetrics(), OPENMETRICS)
    } else {
        (exporter.prometheus_text(), PROMETHEUS_TEXT)
    };
    let mut r = Response::new(Full::new(Bytes::from(body)));
    r.headers_mut().insert(hyper::header::CONTENT_TYPE, hyper::header::HeaderValue::from_static(kind));
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prometheus_text_names_counter_families_with_their_total() {
        let om = "# HELP x_calls Calls.\n# TYPE x_calls counter\nx_calls_total 3\n# HELP x_up Up.\n# TYPE x_up gauge\n# UNIT x_up_seconds seconds\nx_up 1\n# EOF\n";
        assert_eq!(
            to_prometheus_text(om),
            "# HELP x_calls_total Calls.\n# TYPE x_calls_total counter\nx_calls_total 3\n# HELP x_up Up.\n# TYPE x_up gauge\nx_up 1\n"
        );
    }
}
