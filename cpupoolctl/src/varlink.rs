//! A small synchronous varlink client over a unix stream socket.
//!
//! The wire format is JSON objects, each terminated by a NUL byte. A call writes
//! `{"method": "org.cpupool.Manager.X", "parameters": {..}}` (plus `"more": true` for a
//! stream) and reads one reply, `{"parameters": {..}}` or `{"error": NAME, "parameters": {..}}`;
//! a streamed call reads replies until one comes without `"continues": true`. Errors become
//! [`crate::error::Error`]: a missing socket, a refused connection, a connection closed before
//! the reply or no reply within the timeout are [`Error::Unreachable`] (exit 3); an error reply
//! is [`Error::Daemon`] (exit 1).

use std::fmt;
use std::io::{self, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::mpsc;
use std::time::Duration;

use cpupool_wire::names::VARLINK_INTERFACE as INTERFACE;
use cpupool_wire::varlink::{Call, FrameBuffer, FrameError, Reply};
use serde_json::{Map, Value};

use crate::error::{DaemonError, Error};

/// The largest reply accepted; a peer sending more without a NUL is not the daemon.
const MAX_REPLY: usize = 64 << 20;

/// Where the daemon listens: `unix:PATH`, `unix:@ABSTRACT`, or a bare path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Address {
    /// A socket file.
    Path(PathBuf),
    /// A Linux abstract socket name (without the leading `@`).
    Abstract(String),
}

impl std::str::FromStr for Address {
    type Err = String;

    fn from_str(s: &str) -> Result<Address, String> {
        let rest = match s.strip_prefix("unix:") {
            // systemd-style parameters (`unix:/run/x;mode=0666`) describe the listener, not us.
            Some(rest) => rest.split(';').next().unwrap_or_default(),
            None if s.starts_with('/') || s.starts_with('.') || !s.contains(':') => s,
            None => {
                return Err(format!(
                    "`{s}`: only unix: addresses are supported (unix:PATH, unix:@NAME or a path)"
                ))
            }
        };
        if rest.is_empty() {
            return Err(format!("`{s}`: the address has no path"));
        }
        Ok(match rest.strip_prefix('@') {
            Some(name) if !name.is_empty() => Address::Abstract(name.to_owned()),
            Some(_) => return Err(format!("`{s}`: the abstract socket name is empty")),
            None => Address::Path(PathBuf::from(rest)),
        })
    }
}

impl fmt::Display for Address {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Address::Path(p) => write!(f, "unix:{}", p.display()),
            Address::Abstract(n) => write!(f, "unix:@{n}"),
        }
    }
}

/// One connection to the daemon.
pub struct Client {
    stream: UnixStream,
    frames: FrameBuffer,
    address: Address,
    timeout: Option<Duration>,
    hint: String,
}

fn connect_stream(address: &Address) -> io::Result<UnixStream> {
    match address {
        Address::Path(p) => UnixStream::connect(p),
        Address::Abstract(name) => {
            use std::os::linux::net::SocketAddrExt;
            let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())?;
            UnixStream::connect_addr(&addr)
        }
    }
}

impl Client {
    /// Connects to `address`. `timeout` bounds the connect and each reply (none: wait);
    /// `hint` tells the user what to do when nothing answers.
    pub fn connect(address: &Address, timeout: Option<Duration>, hint: &str) -> Result<Client, Error> {
        let unreachable = |reason: String| Error::Unreachable {
            address: address.to_string(),
            reason,
            hint: hint.to_owned(),
        };
        // A unix connect blocks only when the listener's backlog is full (a wedged daemon):
        // connect on a thread so that case ends with the timeout too.
        let stream = match timeout {
            None => connect_stream(address),
            Some(t) => {
                let (tx, rx) = mpsc::channel();
                let addr = address.clone();
                std::thread::spawn(move || {
                    let _ = tx.send(connect_stream(&addr));
                });
                match rx.recv_timeout(t) {
                    Ok(r) => r,
                    Err(_) => return Err(unreachable(format!("no connection within {}s", t.as_secs_f64()))),
                }
            }
        };
        let stream = stream.map_err(|e| {
            unreachable(match e.kind() {
                io::ErrorKind::NotFound => format!("no socket there ({e})"),
                io::ErrorKind::ConnectionRefused => format!("nothing listens on the socket ({e})"),
                _ => e.to_string(),
            })
        })?;
        stream
            .set_read_timeout(timeout)
            .and_then(|()| stream.set_write_timeout(timeout))
            .map_err(|e| unreachable(e.to_string()))?;
        Ok(Client {
            stream,
            frames: FrameBuffer::new(MAX_REPLY),
            address: address.clone(),
            timeout,
            hint: hint.to_owned(),
        })
    }

    /// Bounds each reply by `timeout` from now on (tests: connecting with a guard long enough
    /// for a loaded machine, then the reply's bound the test is about).
    #[cfg(test)]
    fn set_timeout(&mut self, timeout: Duration) -> io::Result<()> {
        self.stream.set_read_timeout(Some(timeout))?;
        self.stream.set_write_timeout(Some(timeout))?;
        self.timeout = Some(timeout);
        Ok(())
    }

    fn unreachable(&self, reason: String) -> Error {
        Error::Unreachable { address: self.address.to_string(), reason, hint: self.hint.clone() }
    }

    fn protocol(&self, reason: String) -> Error {
        Error::Protocol { address: self.address.to_string(), reason }
    }

    fn io_error(&self, e: &io::Error) -> Error {
        match e.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => self.unreachable(format!(
                "no reply within {}s",
                self.timeout.map(|t| t.as_secs_f64()).unwrap_or_default()
            )),
            io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset | io::ErrorKind::UnexpectedEof => {
                self.unreachable("the daemon closed the connection".into())
            }
            _ => self.unreachable(e.to_string()),
        }
    }

    fn send(&mut self, method: &str, parameters: Value, more: bool) -> Result<(), Error> {
        let mut call = Call::new(INTERFACE, method, &parameters).map_err(|e| self.protocol(e.to_string()))?;
        call.more = more;
        let bytes = call.encode();
        self.stream.write_all(&bytes).and_then(|()| self.stream.flush()).map_err(|e| self.io_error(&e))
    }

    /// Reads one reply: `Ok((parameters, continues))`, or the daemon's error.
    fn receive(&mut self) -> Result<(Map<String, Value>, bool), Error> {
        match self.receive_within()? {
            Some(r) => r,
            None => Err(self.io_error(&io::ErrorKind::TimedOut.into())),
        }
    }

    /// [`Client::receive`], `None` when the read timeout passed first.
    #[allow(clippy::type_complexity)]
    fn receive_within(&mut self) -> Result<Option<Result<(Map<String, Value>, bool), Error>>, Error> {
        let buf = match self.frames.read_from(&mut self.stream) {
            Ok(Some(buf)) => buf,
            Err(FrameError::Io(e))
                if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) =>
            {
                return Ok(None)
            }
            Ok(None) => {
                return Err(self.unreachable("the daemon closed the connection before replying".into()))
            }
            Err(FrameError::TooLong { limit }) => {
                return Err(self.protocol(format!("a reply longer than {limit} bytes")))
            }
            Err(FrameError::Truncated) => {
                return Err(self.unreachable("the daemon closed the connection inside a reply".into()))
            }
            Err(FrameError::Io(e)) => return Err(self.io_error(&e)),
        };
        decode_reply(&buf).map(Some).map_err(|reason| self.protocol(reason))
    }

    /// Calls `method` and returns the reply's parameters.
    pub fn call(&mut self, method: &str, parameters: Value) -> Result<Map<String, Value>, Error> {
        self.send(method, parameters, false)?;
        Ok(self.receive()?.0)
    }

    /// Calls `method` with `more` and hands each reply's parameters to `each` until the daemon
    /// ends the stream (`Ok`) or `each` fails.
    pub fn call_more(
        &mut self,
        method: &str,
        parameters: Value,
        each: &mut dyn FnMut(Map<String, Value>) -> Result<(), Error>,
    ) -> Result<(), Error> {
        self.send(method, parameters, true)?;
        // Events may be hours apart: only the call itself is bounded by the timeout.
        let _ = self.stream.set_read_timeout(None);
        loop {
            let (params, continues) = self.receive()?;
            each(params)?;
            if !continues {
                return Ok(());
            }
        }
    }

    /// The address, for messages.
    pub fn address(&self) -> &Address {
        &self.address
    }
}

/// Decodes one message (without its NUL): the outer `Result` is a protocol error, the inner
/// one the daemon's answer.
#[allow(clippy::type_complexity)]
fn decode_reply(bytes: &[u8]) -> Result<Result<(Map<String, Value>, bool), Error>, String> {
    let reply: Reply = serde_json::from_slice(bytes).map_err(|e| format!("not a varlink reply ({e})"))?;
    let parameters = match reply.parameters {
        Value::Null => Map::new(),
        Value::Object(m) => m,
        other => return Err(format!("parameters are not an object: {other}")),
    };
    match reply.error {
        None => Ok(Ok((parameters, reply.continues))),
        Some(name) => Ok(Err(Error::Daemon(DaemonError::from_name(&name, parameters, None)))),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::io::{BufRead, BufReader};
    use std::os::unix::net::UnixListener;

    #[test]
    fn addresses() {
        let p = |s: &str| s.parse::<Address>();
        assert_eq!(p("unix:/run/x"), Ok(Address::Path("/run/x".into())));
        assert_eq!(p("unix:/run/x;mode=0666"), Ok(Address::Path("/run/x".into())));
        assert_eq!(p("/run/x"), Ok(Address::Path("/run/x".into())));
        assert_eq!(p("run/x"), Ok(Address::Path("run/x".into())));
        assert_eq!(p("unix:@cpupool"), Ok(Address::Abstract("cpupool".into())));
        assert!(p("tcp:127.0.0.1:1").is_err());
        assert!(p("unix:").is_err());
        assert!(p("unix:@").is_err());
        assert_eq!(p("unix:/run/x;mode=0666").unwrap().to_string(), "unix:/run/x");
        assert_eq!(p("/run/x").unwrap().to_string(), "unix:/run/x");
        assert_eq!(p("unix:@n").unwrap().to_string(), "unix:@n");
    }

    /// A peer that reads one NUL-terminated call, checks it, and writes `replies` as given.
    fn serve(replies: Vec<Vec<u8>>) -> (tempfile::TempDir, Address, std::thread::JoinHandle<Value>) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sock");
        let listener = UnixListener::bind(&path).unwrap();
        let server = std::thread::spawn(move || {
            let (stream, _) = listener.accept().unwrap();
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut call = Vec::new();
            reader.read_until(0, &mut call).unwrap();
            assert_eq!(call.pop(), Some(0));
            let mut w = stream;
            for r in replies {
                w.write_all(&r).unwrap();
            }
            serde_json::from_slice(&call).unwrap()
        });
        (dir, Address::Path(path), server)
    }

    #[test]
    fn call_frames_the_request_and_decodes_the_reply() {
        // The reply arrives in two writes; the client must wait for the NUL.
        let (_dir, addr, server) = serve(vec![br#"{"parameters":{"pools":"#.to_vec(), b"[]}}\0".to_vec()]);
        let mut c = Client::connect(&addr, Some(Duration::from_secs(10)), "hint").unwrap();
        let reply = c.call("ListPools", json!({})).unwrap();
        assert_eq!(Value::Object(reply), json!({"pools": []}));
        assert_eq!(
            server.join().unwrap(),
            json!({"method": "org.cpupool.Manager.ListPools", "parameters": {}})
        );
    }

    #[test]
    fn error_replies_become_daemon_errors() {
        let (_dir, addr, server) = serve(vec![
            b"{\"error\":\"org.cpupool.Manager.NoSuchPool\",\"parameters\":{\"pool\":\"x\"}}\0".to_vec(),
        ]);
        let mut c = Client::connect(&addr, Some(Duration::from_secs(10)), "hint").unwrap();
        let e = c.call("GetPool", json!({"name": "x"})).unwrap_err();
        assert_eq!((e.name(), e.exit_code()), ("NoSuchPool", 1));
        assert_eq!(e.to_json()["parameters"], json!({"pool": "x"}));
        server.join().unwrap();
    }

    #[test]
    fn streams_read_until_the_last_reply() {
        let (_dir, addr, server) = serve(vec![
            b"{\"parameters\":{\"event\":{\"kind\":\"pool\",\"pool\":\"a\",\"change\":\"current\"}},\"continues\":true}\0{\"parameters\":{\"event\":{\"kind\":\"pool\",\"pool\":\"b\",\"change\":\"current\"}},\"continues\":true}\0".to_vec(),
            b"{\"parameters\":{\"event\":{\"kind\":\"assignment\",\"id\":\"x\",\"change\":\"added\"}}}\0".to_vec(),
        ]);
        let mut c = Client::connect(&addr, Some(Duration::from_secs(10)), "hint").unwrap();
        let mut seen = Vec::new();
        c.call_more("Monitor", json!({}), &mut |p| {
            seen.push(p["event"].clone());
            Ok(())
        })
        .unwrap();
        assert_eq!(seen.len(), 3);
        assert_eq!(seen[2], json!({"kind": "assignment", "id": "x", "change": "added"}));
        assert_eq!(server.join().unwrap()["more"], true);
    }

    #[test]
    fn a_closed_connection_or_garbage_is_reported() {
        let (_dir, addr, server) = serve(vec![]);
        let mut c = Client::connect(&addr, Some(Duration::from_secs(10)), "hint").unwrap();
        let e = c.call("Status", json!({})).unwrap_err();
        assert_eq!(e.exit_code(), 3, "{e}");
        server.join().unwrap();

        let (_dir, addr, server) = serve(vec![b"hello\0".to_vec()]);
        let mut c = Client::connect(&addr, Some(Duration::from_secs(10)), "hint").unwrap();
        let e = c.call("Status", json!({})).unwrap_err();
        assert!(matches!(e, Error::Protocol { .. }), "{e}");
        server.join().unwrap();
    }

    #[test]
    fn no_reply_within_the_timeout_is_unreachable() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sock");
        // Listening but never accepting or answering: the kernel completes the connect.
        let _listener = UnixListener::bind(&path).unwrap();
        // The connect is given a guard a loaded machine meets (a thread connects for it: with
        // 0.1 s that thread was once not even scheduled in time); the reply gets 0.1 s.
        let mut c = Client::connect(&Address::Path(path), Some(Duration::from_secs(180)), "hint").unwrap();
        c.set_timeout(Duration::from_millis(100)).unwrap();
        let e = c.call("Status", json!({})).unwrap_err();
        assert_eq!(e.exit_code(), 3);
        assert!(e.to_string().contains("no reply within 0.1s"), "{e}");
    }

    #[test]
    fn a_missing_socket_is_unreachable_and_says_where() {
        let dir = tempfile::tempdir().unwrap();
        let addr = Address::Path(dir.path().join("nope"));
        let e = Client::connect(&addr, Some(Duration::from_secs(1)), "is cpupoold running?").err().unwrap();
        assert_eq!(e.exit_code(), 3);
        let msg = e.to_string();
        assert!(msg.contains(&addr.to_string()) && msg.contains("no socket there"), "{msg}");
        assert!(msg.ends_with("is cpupoold running?"), "{msg}");
        // A socket file nobody listens on.
        let path = dir.path().join("dead");
        drop(UnixListener::bind(&path).unwrap());
        let e = Client::connect(&Address::Path(path), None, "h").err().unwrap();
        assert!(e.to_string().contains("nothing listens"), "{e}");
    }
}
