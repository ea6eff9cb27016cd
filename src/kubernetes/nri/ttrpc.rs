//! ttRPC, the small RPC protocol NRI speaks inside each multiplexed connection: a 10-byte header
//! (payload length and stream id as big-endian `u32`, message type, flags), then a protobuf
//! `Request` (service, method, payload, timeout) or `Response` (a `google.rpc.Status` and the
//! payload). The client picks odd stream ids; one request, one response, on the same id.
//!
//! [`Connection`] is both ends of one NRI socket: it serves the plugin's service on
//! [`mux::PLUGIN_CONN`] through a [`Service`], each request on a task of its own, and calls the
//! runtime's on [`mux::RUNTIME_CONN`].
//!
//! At most [`IN_SERVICE`] requests of one connection are served or hold an unsent answer at a
//! time; beyond that the socket is not read until one is done. A runtime that sends requests
//! and never reads the answers then stops at its socket's buffer, instead of making the daemon
//! keep an answer (and a task) for every request it sends.

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prost::Message;
use tokio::io::AsyncWriteExt;
use tokio::net::UnixStream;
use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit, Semaphore};

use super::mux;

/// The header's size.
pub const HEADER: usize = 10;
/// The requests of one connection served at once, or answered and waiting to be written. A
/// runtime sends one event at a time per container and waits for its answer.
pub const IN_SERVICE: usize = 64;
/// The largest message either side sends (ttRPC's own limit).
pub const MAX_MESSAGE: usize = 4 << 20;
/// A request.
pub const TYPE_REQUEST: u8 = 1;
/// A response.
pub const TYPE_RESPONSE: u8 = 2;

/// gRPC status codes used in responses.
pub mod code {
    /// Success.
    pub const OK: i32 = 0;
    /// A field is malformed.
    pub const INVALID_ARGUMENT: i32 = 3;
    /// The deadline passed.
    pub const DEADLINE_EXCEEDED: i32 = 4;
    /// The system is not in a state for the call.
    pub const FAILED_PRECONDITION: i32 = 9;
    /// No such method.
    pub const UNIMPLEMENTED: i32 = 12;
    /// Something broke.
    pub const INTERNAL: i32 = 13;
    /// The server is going away.
    pub const UNAVAILABLE: i32 = 14;
}

/// ttRPC's `Request`.
#[derive(Clone, PartialEq, Message)]
pub struct Request {
    /// The service's full protobuf name.
    #[prost(string, tag = "1")]
    pub service: String,
    /// The method.
    #[prost(string, tag = "2")]
    pub method: String,
    /// The method's request message.
    #[prost(bytes = "vec", tag = "3")]
    pub payload: Vec<u8>,
    /// How long the caller waits, in nanoseconds; 0 for no deadline.
    #[prost(int64, tag = "4")]
    pub timeout_nano: i64,
    /// Metadata (unused by NRI).
    #[prost(message, repeated, tag = "5")]
    pub metadata: Vec<KeyValue>,
}

/// ttRPC's metadata entry.
#[derive(Clone, PartialEq, Message)]
pub struct KeyValue {
    /// Key.
    #[prost(string, tag = "1")]
    pub key: String,
    /// Value.
    #[prost(string, tag = "2")]
    pub value: String,
}

/// ttRPC's `Response`.
#[derive(Clone, PartialEq, Message)]
pub struct Response {
    /// The outcome; absent or code 0 is success.
    #[prost(message, optional, tag = "1")]
    pub status: Option<Status>,
    /// The method's response message.
    #[prost(bytes = "vec", tag = "2")]
    pub payload: Vec<u8>,
}

/// `google.rpc.Status` (details are not used).
#[derive(Clone, PartialEq, Message)]
pub struct Status {
    /// A gRPC code ([`code`]).
    #[prost(int32, tag = "1")]
    pub code: i32,
    /// What went wrong, for a person.
    #[prost(string, tag = "2")]
    pub message: String,
}

impl Status {
    /// A status with `code` and `message`.
    pub fn new(code: i32, message: impl Into<String>) -> Status {
        Status { code, message: message.into() }
    }
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ttRPC status {}: {}", self.code, self.message)
    }
}

/// One message with its header fields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// The stream id.
    pub stream: u32,
    /// [`TYPE_REQUEST`], [`TYPE_RESPONSE`], or another type (streaming; not used by NRI).
    pub kind: u8,
    /// Flags (0 for unary calls).
    pub flags: u8,
    /// The protobuf message.
    pub payload: Vec<u8>,
}

/// `payload` as one message on `stream`.
pub fn encode(stream: u32, kind: u8, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER + payload.len());
    // Callers never build messages over MAX_MESSAGE (checked in `Connection::send`).
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    out.extend_from_slice(&stream.to_be_bytes());
    out.push(kind);
    out.push(0);
    out.extend_from_slice(payload);
    out
}

/// Reassembles the messages of one logical connection from its frames.
#[derive(Debug, Default)]
pub struct Reassembly {
    buf: Vec<u8>,
}

impl Reassembly {
    /// Adds the bytes of a frame.
    pub fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// The next whole message, if one is there; an error when its length is over the limit
    /// (the stream cannot be trusted past it).
    pub fn next_frame(&mut self) -> Result<Option<Frame>, io::Error> {
        if self.buf.len() < HEADER {
            return Ok(None);
        }
        let b = &self.buf;
        let len = u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize;
        if len > MAX_MESSAGE {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("a ttRPC message of {len} bytes (at most {MAX_MESSAGE})"),
            ));
        }
        if b.len() < HEADER + len {
            return Ok(None);
        }
        let frame = Frame {
            stream: u32::from_be_bytes([b[4], b[5], b[6], b[7]]),
            kind: b[8],
            flags: b[9],
            payload: b[HEADER..HEADER + len].to_vec(),
        };
        self.buf.drain(..HEADER + len);
        Ok(Some(frame))
    }
}

/// What a served method returns: the response message's bytes, or a status.
pub type Reply = Pin<Box<dyn Future<Output = Result<Vec<u8>, Status>> + Send>>;

/// The plugin's side: one call per request, with the deadline the caller gave (if any).
pub trait Service: Send + Sync + 'static {
    /// Handles `method` of `service` with the request `payload`.
    fn call(
        self: Arc<Self>,
        service: &str,
        method: &str,
        payload: Vec<u8>,
        deadline: Option<Duration>,
    ) -> Reply;
}

/// Why a call to the runtime failed.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// The connection is gone.
    #[error("the runtime's connection is closed")]
    Closed,
    /// No response in time.
    #[error("the runtime did not answer within {0:?}")]
    Timeout(Duration),
    /// The runtime answered with an error.
    #[error("the runtime refused: {0}")]
    Status(Status),
    /// The response could not be decoded.
    #[error("decoding the runtime's response")]
    Decode(#[source] prost::DecodeError),
    /// The request is larger than ttRPC allows.
    #[error("a request of {0} bytes (at most {MAX_MESSAGE})")]
    TooLarge(usize),
}

type Pending = Arc<Mutex<HashMap<u32, oneshot::Sender<Response>>>>;

/// Both ends of one NRI socket. Cloning shares it; it ends when the socket does.
#[derive(Clone)]
pub struct Connection {
    out: mpsc::Sender<Vec<u8>>,
    pending: Pending,
    /// The next stream id. The runtime refuses an id not above the last it saw, so an id is
    /// taken and its request queued under this one lock: ids reach the wire in order.
    next: Arc<tokio::sync::Mutex<u32>>,
}

impl Connection {
    /// Starts reading and writing `stream`: requests on the plugin connection go to `service`.
    /// The returned task ends (with the reason) when the socket closes or breaks.
    pub fn start(
        stream: UnixStream,
        service: Arc<dyn Service>,
    ) -> (Connection, tokio::task::JoinHandle<io::Result<()>>) {
        let (mut rd, mut wr) = stream.into_split();
        let (out, mut rx) = mpsc::channel::<Vec<u8>>(64);
        let pending: Pending = Arc::default();
        let conn = Connection {
            out: out.clone(),
            pending: pending.clone(),
            next: Arc::new(tokio::sync::Mutex::new(1)),
        };
        let task = tokio::spawn(async move {
            let writer = tokio::spawn(async move {
                while let Some(bytes) = rx.recv().await {
                    wr.write_all(&bytes).await?;
                }
                Ok::<(), io::Error>(())
            });
            let _writer = AbortOnDrop(writer);
            let (mut server, mut client) = (Reassembly::default(), Reassembly::default());
            let in_service = Arc::new(Semaphore::new(IN_SERVICE));
            let result = loop {
                let (id, payload) = match mux::read_frame(&mut rd).await {
                    Ok(Some(f)) => f,
                    Ok(None) => break Ok(()),
                    Err(e) => break Err(e),
                };
                let (buf, is_server) = match id {
                    mux::PLUGIN_CONN => (&mut server, true),
                    mux::RUNTIME_CONN => (&mut client, false),
                    // Nothing else is opened by NRI; a frame for it has no reader.
                    _ => continue,
                };
                buf.push(&payload);
                let mut failed = None;
                loop {
                    match buf.next_frame() {
                        Ok(Some(f)) if is_server => {
                            // Never closed: the semaphore lives as long as this loop.
                            let Ok(slot) = in_service.clone().acquire_owned().await else { break };
                            serve(f, &service, &out, slot);
                        }
                        Ok(Some(f)) => answer(f, &pending),
                        Ok(None) => break,
                        Err(e) => {
                            failed = Some(e);
                            break;
                        }
                    }
                }
                if let Some(e) = failed {
                    break Err(e);
                }
            };
            // Calls still waiting fail now rather than at their timeouts.
            pending.lock().unwrap_or_else(|e| e.into_inner()).clear();
            result
        });
        (conn, task)
    }

    /// Calls `method` of the runtime's `service`, waiting at most `timeout`.
    pub async fn call<Req: Message, Resp: Message + Default>(
        &self,
        service: &str,
        method: &str,
        request: &Req,
        timeout: Duration,
    ) -> Result<Resp, CallError> {
        let mut next = self.next.lock().await;
        let stream = *next;
        *next = next.wrapping_add(2);
        let req = Request {
            service: service.to_owned(),
            method: method.to_owned(),
            payload: request.encode_to_vec(),
            timeout_nano: i64::try_from(timeout.as_nanos()).unwrap_or(i64::MAX),
            metadata: Vec::new(),
        };
        let (tx, rx) = oneshot::channel();
        self.pending.lock().unwrap_or_else(|e| e.into_inner()).insert(stream, tx);
        let sent = self.send(mux::RUNTIME_CONN, stream, TYPE_REQUEST, &req.encode_to_vec()).await;
        drop(next);
        let result = match sent {
            Err(e) => Err(e),
            Ok(()) => match tokio::time::timeout(timeout, rx).await {
                Err(_) => Err(CallError::Timeout(timeout)),
                Ok(Err(_)) => Err(CallError::Closed),
                Ok(Ok(resp)) => match resp.status {
                    Some(s) if s.code != code::OK => Err(CallError::Status(s)),
                    _ => Resp::decode(resp.payload.as_slice()).map_err(CallError::Decode),
                },
            },
        };
        self.pending.lock().unwrap_or_else(|e| e.into_inner()).remove(&stream);
        result
    }

    async fn send(&self, conn: u32, stream: u32, kind: u8, payload: &[u8]) -> Result<(), CallError> {
        if payload.len() > MAX_MESSAGE {
            return Err(CallError::TooLarge(payload.len()));
        }
        let bytes = mux::encode(conn, &encode(stream, kind, payload));
        self.out.send(bytes).await.map_err(|_| CallError::Closed)
    }

    /// Whether the socket is gone.
    pub fn is_closed(&self) -> bool {
        self.out.is_closed()
    }
}

/// Serves one request on a task of its own, and writes its response; `slot` is given back once
/// the response is queued for writing.
fn serve(frame: Frame, service: &Arc<dyn Service>, out: &mpsc::Sender<Vec<u8>>, slot: OwnedSemaphorePermit) {
    if frame.kind != TYPE_REQUEST {
        return;
    }
    let (service, out) = (service.clone(), out.clone());
    tokio::spawn(async move {
        let resp = match Request::decode(frame.payload.as_slice()) {
            Err(e) => Response {
                status: Some(Status::new(code::INVALID_ARGUMENT, format!("decoding the ttRPC request: {e}"))),
                payload: Vec::new(),
            },
            Ok(req) => {
                let deadline =
                    u64::try_from(req.timeout_nano).ok().filter(|&n| n > 0).map(Duration::from_nanos);
                match service.clone().call(&req.service, &req.method, req.payload, deadline).await {
                    // Success as ttRPC's own server says it: an explicit code 0.
                    Ok(payload) => Response { status: Some(Status::new(code::OK, "")), payload },
                    Err(status) => Response { status: Some(status), payload: Vec::new() },
                }
            }
        };
        let mut bytes = resp.encode_to_vec();
        if bytes.len() > MAX_MESSAGE {
            let status = Status::new(code::INTERNAL, format!("a response of {} bytes", bytes.len()));
            bytes = Response { status: Some(status), payload: Vec::new() }.encode_to_vec();
        }
        let _ = out.send(mux::encode(mux::PLUGIN_CONN, &encode(frame.stream, TYPE_RESPONSE, &bytes))).await;
        drop(slot);
    });
}

/// Hands a response to the call waiting for it (one that gave up already is gone).
fn answer(frame: Frame, pending: &Pending) {
    if frame.kind != TYPE_RESPONSE {
        return;
    }
    let Ok(resp) = Response::decode(frame.payload.as_slice()) else { return };
    if let Some(tx) = pending.lock().unwrap_or_else(|e| e.into_inner()).remove(&frame.stream) {
        let _ = tx.send(resp);
    }
}

struct AbortOnDrop(tokio::task::JoinHandle<io::Result<()>>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The header as ttRPC's channel writes it: length, stream id (big-endian), type, flags.
    #[test]
    fn a_message_header_is_length_stream_type_flags() {
        assert_eq!(encode(3, TYPE_REQUEST, b"xy"), [0, 0, 0, 2, 0, 0, 0, 3, 1, 0, b'x', b'y']);
    }

    /// Request and Response field numbers, checked against bytes worked out by hand from
    /// ttRPC's request.proto: a key is `(field << 3) | wire type`.
    #[test]
    fn request_and_response_bytes() {
        let r = Request {
            service: "s".into(),
            method: "m".into(),
            payload: vec![7],
            timeout_nano: 1,
            metadata: Vec::new(),
        };
        assert_eq!(r.encode_to_vec(), [0x0a, 1, b's', 0x12, 1, b'm', 0x1a, 1, 7, 0x20, 1]);
        let resp = Response { status: Some(Status::new(12, "x")), payload: vec![1] };
        assert_eq!(resp.encode_to_vec(), [0x0a, 5, 0x08, 12, 0x12, 1, b'x', 0x12, 1, 1]);
    }

    /// A service whose calls wait until the test lets them go, counting the calls begun.
    struct Held {
        begun: std::sync::atomic::AtomicUsize,
        go: Arc<Semaphore>,
    }

    impl Service for Held {
        fn call(self: Arc<Self>, _: &str, _: &str, _: Vec<u8>, _: Option<Duration>) -> Reply {
            self.begun.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Box::pin(async move {
                let _ = self.go.acquire().await.map(tokio::sync::SemaphorePermit::forget);
                Ok(Vec::new())
            })
        }
    }

    /// A runtime that sends 1,000 requests at once gets at most [`IN_SERVICE`] served at a time:
    /// the rest wait in its socket, not in the daemon. Let go, every one is answered.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn requests_in_service_are_bounded() {
        use std::sync::atomic::Ordering;
        use tokio::io::AsyncReadExt;
        let (ours, mut theirs) = UnixStream::pair().unwrap_or_else(|e| panic!("{e}"));
        let held = Arc::new(Held { begun: 0.into(), go: Arc::new(Semaphore::new(0)) });
        let (_conn, _task) = Connection::start(ours, held.clone());
        let request = Request {
            service: "s".into(),
            method: "m".into(),
            payload: Vec::new(),
            timeout_nano: 0,
            metadata: Vec::new(),
        }
        .encode_to_vec();
        let mut all = Vec::new();
        for i in 0..1000u32 {
            all.extend(mux::encode(mux::PLUGIN_CONN, &encode(2 * i + 1, TYPE_REQUEST, &request)));
        }
        theirs.write_all(&all).await.unwrap_or_else(|e| panic!("{e}"));
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while held.begun.load(Ordering::SeqCst) < IN_SERVICE {
            assert!(std::time::Instant::now() < deadline, "{} begun", held.begun.load(Ordering::SeqCst));
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // Room for a reader that would go on to take what it has not the room for.
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(held.begun.load(Ordering::SeqCst), IN_SERVICE);
        held.go.add_permits(1000);
        let mut answers = 0;
        let (mut buf, mut carry) = (vec![0u8; 1 << 16], Vec::new());
        while answers < 1000 {
            let n = theirs.read(&mut buf).await.unwrap_or_else(|e| panic!("{e}"));
            assert!(n > 0, "closed after {answers} answers");
            carry.extend_from_slice(&buf[..n]);
            answers += take_frames(&mut carry);
        }
        assert_eq!(held.begun.load(Ordering::SeqCst), 1000);
    }

    /// The whole multiplexer frames at the start of `carry` (each answer here is one frame),
    /// taken out of it.
    fn take_frames(carry: &mut Vec<u8>) -> usize {
        let (mut n, mut at) = (0, 0);
        while carry.len() >= at + mux::HEADER {
            let len =
                u32::from_be_bytes([carry[at + 4], carry[at + 5], carry[at + 6], carry[at + 7]]) as usize;
            if carry.len() < at + mux::HEADER + len {
                break;
            }
            n += 1;
            at += mux::HEADER + len;
        }
        carry.drain(..at);
        n
    }

    #[test]
    fn messages_split_across_frames_or_sharing_one_are_reassembled() {
        let a = encode(1, TYPE_REQUEST, b"first");
        let b = encode(3, TYPE_REQUEST, b"second");
        let all: Vec<u8> = a.iter().chain(&b).copied().collect();
        let mut r = Reassembly::default();
        r.push(&all[..4]);
        assert!(r.next_frame().unwrap_or_else(|e| panic!("{e}")).is_none());
        r.push(&all[4..a.len() + 3]);
        let first = r.next_frame().unwrap_or_else(|e| panic!("{e}")).unwrap_or_else(|| panic!("first"));
        assert_eq!((first.stream, first.payload.as_slice()), (1, &b"first"[..]));
        assert!(r.next_frame().unwrap_or_else(|e| panic!("{e}")).is_none());
        r.push(&all[a.len() + 3..]);
        let second = r.next_frame().unwrap_or_else(|e| panic!("{e}")).unwrap_or_else(|| panic!("second"));
        assert_eq!((second.stream, second.payload.as_slice()), (3, &b"second"[..]));
        let mut huge = Reassembly::default();
        huge.push(&[0x7f, 0, 0, 0, 0, 0, 0, 1, 1, 0]);
        assert!(huge.next_frame().is_err());
    }
}
