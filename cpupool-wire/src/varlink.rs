//! varlink: the interface description, the framing and envelopes, and each method's
//! parameters.
//!
//! Every message is one JSON object followed by a NUL byte. A call is `{"method":
//! "iface.Method", "parameters": {...}, "more": bool, "oneway": bool}`; a reply is
//! `{"parameters": {...}, "continues": bool}` or `{"error": "iface.Error", "parameters":
//! {...}}`.
//!
//! [`FrameBuffer`] splits a byte stream into messages without doing I/O itself: the daemon
//! reads into it from a tokio socket, the CLI from a blocking one ([`FrameBuffer::read_from`]).

use std::io;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

pub use crate::methods::params;

/// The interface description of `org.cpupool.Manager`, served verbatim by
/// `GetInterfaceDescription` and installed to `/usr/share/varlink/`.
pub const IDL: &str = include_str!("../org.cpupool.Manager.varlink");

/// The description of the standard `org.varlink.service` interface.
pub const SERVICE_IDL: &str = "\
# The Varlink Service Interface is provided by every varlink service.
interface org.varlink.service

method GetInfo() -> (
  vendor: string,
  product: string,
  version: string,
  url: string,
  interfaces: []string
)

method GetInterfaceDescription(interface: string) -> (description: string)

error InterfaceNotFound (interface: string)
error MethodNotFound (method: string)
error MethodNotImplemented (method: string)
error InvalidParameter (parameter: string)
error PermissionDenied ()
error ExpectedMore ()
";

/// Largest call the daemon accepts, NUL excluded: 64 KiB.
///
/// The largest legitimate call is a `CreatePool` or `ResizePool` whose `cpus` names every
/// possible CPU one by one, `"0,1,2,…,8191"` (the daemon's highest CPU number): 39,849 bytes,
/// about 40 KiB with the envelope. Next come an `Assign` of a `cgroup:` target at the longest
/// cgroup path the daemon takes (4,096 bytes; 12 KiB even when a client escapes every byte of
/// two-byte UTF-8 characters as `\u00XX`) and the identifiers (128 bytes), pool names (32) and
/// unit names (255) of the other calls. 64 KiB leaves more than half again of that, and bounds
/// what a connection can make the daemon buffer: a peer that sends more without a NUL gets
/// `MessageTooLarge` and is disconnected. (The daemon's unit test
/// `the_largest_legitimate_calls_fit_and_a_larger_one_is_refused` builds both calls: 39,976 and
/// 12,469 bytes.)
pub const MAX_MESSAGE: usize = 64 * 1024;

/// What a frame buffer starts at, and shrinks back to between messages: enough for every
/// ordinary call in one read, so idle connections hold little.
const INITIAL_BUFFER: usize = 1024;

/// Why no message came.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// More than the limit arrived without a NUL.
    #[error("message longer than {limit} bytes")]
    TooLong {
        /// The limit.
        limit: usize,
    },
    /// The peer closed the connection in the middle of a message.
    #[error("connection closed inside a message")]
    Truncated,
    /// Reading failed.
    #[error("reading from the connection")]
    Io(#[source] io::Error),
}

/// Splits a byte stream into NUL-terminated messages of at most `limit` bytes.
///
/// The buffer grows only as a message needs it (doubling from 1 KiB, never much past the
/// limit) and is given back once no partial message is left in it, so a connection that once
/// carried a large message does not keep its peak allocation while it sits idle.
#[derive(Debug)]
pub struct FrameBuffer {
    buf: Vec<u8>,
    /// How far `buf` has been searched for a NUL already.
    scanned: usize,
    limit: usize,
}

impl FrameBuffer {
    /// A buffer refusing messages longer than `limit` bytes (NUL excluded).
    pub fn new(limit: usize) -> FrameBuffer {
        FrameBuffer { buf: Vec::new(), scanned: 0, limit }
    }

    /// The bytes the buffer holds allocated (for tests of its memory use).
    pub fn capacity(&self) -> usize {
        self.buf.capacity()
    }

    /// The next whole message buffered, without its NUL.
    pub fn take(&mut self) -> Option<Vec<u8>> {
        let i = self.buf[self.scanned..].iter().position(|&b| b == 0);
        let Some(i) = i else {
            self.scanned = self.buf.len();
            return None;
        };
        let end = self.scanned + i;
        let msg = self.buf[..end].to_vec();
        self.buf.drain(..=end);
        self.scanned = 0;
        self.give_back();
        Some(msg)
    }

    /// The buffer to read more bytes into, with spare capacity: read into the spare capacity
    /// only, and advance the length only by what arrived (so a cancelled read leaves it as it
    /// was). `TooLong` when the limit is reached without a NUL; call after [`Self::take`]
    /// found no message.
    pub fn room(&mut self) -> Result<&mut Vec<u8>, FrameError> {
        // One byte past the limit, so a message of exactly `limit` bytes plus its NUL fits.
        let room = (self.limit + 1).saturating_sub(self.buf.len());
        if room == 0 {
            return Err(FrameError::TooLong { limit: self.limit });
        }
        if self.buf.len() == self.buf.capacity() {
            let grow = self.buf.len().max(INITIAL_BUFFER).min(room);
            self.buf.reserve_exact(grow);
        }
        Ok(&mut self.buf)
    }

    /// The end of the stream: `Ok(None)` when it ended between messages.
    pub fn at_end(&self) -> Result<Option<Vec<u8>>, FrameError> {
        if self.buf.is_empty() {
            Ok(None)
        } else {
            Err(FrameError::Truncated)
        }
    }

    /// The next message from a blocking reader; `None` at a clean end of stream.
    pub fn read_from(&mut self, r: &mut impl io::Read) -> Result<Option<Vec<u8>>, FrameError> {
        loop {
            if let Some(msg) = self.take() {
                return Ok(Some(msg));
            }
            let buf = self.room()?;
            let start = buf.len();
            buf.resize(buf.capacity(), 0);
            let read = loop {
                match r.read(&mut buf[start..]) {
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    other => break other,
                }
            };
            let n = read.as_ref().map_or(0, |n| *n);
            buf.truncate(start + n);
            match read {
                Err(e) => return Err(FrameError::Io(e)),
                Ok(0) => return self.at_end(),
                Ok(_) => {}
            }
        }
    }

    /// Frees the buffer when nothing is left in it, and shrinks it when a little is (the next
    /// pipelined message), so its peak size is not kept.
    fn give_back(&mut self) {
        if self.buf.is_empty() {
            self.buf = Vec::new();
        } else if self.buf.capacity() > 2 * self.buf.len().max(INITIAL_BUFFER) {
            self.buf.shrink_to(self.buf.len().max(INITIAL_BUFFER));
        }
    }
}

/// A method call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Call {
    /// `interface.Method`.
    pub method: String,
    /// The arguments; absent and `null` mean none.
    #[serde(default)]
    pub parameters: Option<Map<String, Value>>,
    /// The caller accepts several replies.
    #[serde(default, skip_serializing_if = "is_false")]
    pub more: bool,
    /// The caller wants no reply.
    #[serde(default, skip_serializing_if = "is_false")]
    pub oneway: bool,
    /// The caller wants to switch protocols after the reply (not supported).
    #[serde(default, skip_serializing_if = "is_false")]
    pub upgrade: bool,
}

fn is_false(b: &bool) -> bool {
    !*b
}

impl Call {
    /// A call of `method` of `interface` with `parameters` (a struct of [`params`]).
    pub fn new(
        interface: &str,
        method: &str,
        parameters: &impl Serialize,
    ) -> Result<Call, serde_json::Error> {
        let parameters = match serde_json::to_value(parameters)? {
            Value::Object(m) => Some(m),
            Value::Null => None,
            other => return Err(serde::ser::Error::custom(format!("parameters are not an object: {other}"))),
        };
        Ok(Call {
            method: format!("{interface}.{method}"),
            parameters,
            more: false,
            oneway: false,
            upgrade: false,
        })
    }

    /// The message bytes, NUL included.
    pub fn encode(&self) -> Vec<u8> {
        encode(self)
    }
}

/// A reply.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Reply {
    /// The error name, for a failed call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The return values, or the error's parameters.
    #[serde(default)]
    pub parameters: Value,
    /// More replies follow.
    #[serde(default, skip_serializing_if = "is_false")]
    pub continues: bool,
}

impl Reply {
    /// The message bytes, NUL included.
    pub fn encode(&self) -> Vec<u8> {
        encode(self)
    }
}

fn encode(v: &impl Serialize) -> Vec<u8> {
    // Serializing a struct of strings, bools and `Value`s cannot fail.
    let mut out = serde_json::to_vec(v).unwrap_or_else(|_| b"{}".to_vec());
    out.push(0);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocking_reads_split_messages_and_report_truncation_and_length() {
        let mut bytes: &[u8] = b"{\"x\":1}\0{\"y\":2}\0{\"z\"";
        let mut f = FrameBuffer::new(MAX_MESSAGE);
        assert_eq!(f.read_from(&mut bytes).ok().flatten().as_deref(), Some(&b"{\"x\":1}"[..]));
        assert_eq!(f.read_from(&mut bytes).ok().flatten().as_deref(), Some(&b"{\"y\":2}"[..]));
        assert!(matches!(f.read_from(&mut bytes), Err(FrameError::Truncated)));
        let mut empty: &[u8] = b"";
        assert!(matches!(FrameBuffer::new(8).read_from(&mut empty), Ok(None)));
        let mut long: &[u8] = b"123456789\0";
        assert!(matches!(FrameBuffer::new(8).read_from(&mut long), Err(FrameError::TooLong { limit: 8 })));
        let mut exact: &[u8] = b"12345678\0";
        assert_eq!(FrameBuffer::new(8).read_from(&mut exact).ok().flatten().map(|m| m.len()), Some(8));
    }

    #[test]
    fn calls_leave_defaults_out() {
        let call = Call::new("org.cpupool.Manager", "GetPool", &params::GetPool { name: "x".into() })
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            call.encode(),
            b"{\"method\":\"org.cpupool.Manager.GetPool\",\"parameters\":{\"name\":\"x\"}}\0"
        );
        let r = Reply { error: None, parameters: serde_json::json!({}), continues: false };
        assert_eq!(r.encode(), b"{\"parameters\":{}}\0");
    }
}
