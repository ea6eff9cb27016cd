//! The varlink wire format: JSON objects, each terminated by a NUL byte.
//!
//! A call is `{"method": "iface.Method", "parameters": {...}, "more": bool, "oneway": bool}`;
//! a reply is `{"parameters": {...}, "continues": bool}` or `{"error": "iface.Error",
//! "parameters": {...}}`.

use std::io;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use tokio::io::{AsyncRead, AsyncReadExt};

/// Largest call accepted, NUL excluded: 64 KiB.
///
/// The largest legitimate call is a `CreatePool` or `ResizePool` whose `cpus` names every
/// possible CPU one by one, `"0,1,2,…,8191"` ([`MAX_CPU`](crate::core::cpuset::MAX_CPU)): 39,849
/// bytes, about 40 KiB with the envelope. Next come an `Assign` of a `cgroup:` target at
/// [`MAX_CGROUP_PATH`](crate::core::state::MAX_CGROUP_PATH) (4,096 bytes; 12 KiB even when a
/// client escapes every byte of two-byte UTF-8 characters as `\u00XX`) and the identifiers
/// (128 bytes), pool names (32) and unit names (255) of the other calls. 64 KiB leaves more than
/// half again of that, and bounds what a connection can make the daemon buffer: a peer that sends
/// more without a NUL gets `MessageTooLarge` and is disconnected. (The unit test
/// `the_largest_legitimate_calls_fit_and_a_larger_one_is_refused` builds both calls: 39,976 and
/// 12,469 bytes.)
pub const MAX_MESSAGE: usize = 64 * 1024;

/// What a connection's read buffer starts at, and shrinks back to between calls: enough for
/// every ordinary call in one read, so idle connections hold little.
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
/// The buffer grows only as a message needs it (doubling from [`INITIAL_BUFFER`], never past
/// the limit) and is given back once no partial message is left in it, so a connection that
/// once carried a large call does not keep its peak allocation while it sits idle.
pub struct FrameReader<R> {
    inner: R,
    buf: Vec<u8>,
    /// How far `buf` has been searched for a NUL already.
    scanned: usize,
    limit: usize,
}

impl<R: AsyncRead + Unpin> FrameReader<R> {
    /// Reads from `inner`, with the default limit [`MAX_MESSAGE`].
    pub fn new(inner: R) -> Self {
        FrameReader::with_limit(inner, MAX_MESSAGE)
    }

    /// Reads from `inner`, refusing messages longer than `limit` bytes (NUL excluded).
    pub fn with_limit(inner: R, limit: usize) -> Self {
        FrameReader { inner, buf: Vec::new(), scanned: 0, limit }
    }

    /// The bytes the buffer holds allocated (for tests of its memory use).
    pub fn capacity(&self) -> usize {
        self.buf.capacity()
    }

    /// The next message without its NUL; `None` at a clean end of stream.
    ///
    /// Cancel-safe: bytes read before a cancellation stay buffered for the next call.
    pub async fn next(&mut self) -> Result<Option<Vec<u8>>, FrameError> {
        loop {
            if let Some(i) = self.buf[self.scanned..].iter().position(|&b| b == 0) {
                let end = self.scanned + i;
                let msg = self.buf[..end].to_vec();
                self.buf.drain(..=end);
                self.scanned = 0;
                self.give_back();
                return Ok(Some(msg));
            }
            self.scanned = self.buf.len();
            // One byte past the limit, so a message of exactly `limit` bytes plus its NUL fits.
            let room = (self.limit + 1).saturating_sub(self.buf.len());
            if room == 0 {
                return Err(FrameError::TooLong { limit: self.limit });
            }
            if self.buf.len() == self.buf.capacity() {
                let grow = self.buf.len().max(INITIAL_BUFFER).min(room);
                self.buf.reserve_exact(grow);
            }
            // Reads into the spare capacity only, and only advances the length once data came:
            // a cancelled read leaves the buffer as it was.
            let n = self.inner.read_buf(&mut self.buf).await.map_err(FrameError::Io)?;
            if n == 0 {
                return if self.buf.is_empty() { Ok(None) } else { Err(FrameError::Truncated) };
            }
        }
    }

    /// Frees the buffer when nothing is left in it, and shrinks it when a little is (the next
    /// pipelined call), so its peak size is not kept.
    fn give_back(&mut self) {
        if self.buf.is_empty() {
            self.buf = Vec::new();
        } else if self.buf.capacity() > 2 * self.buf.len().max(INITIAL_BUFFER) {
            self.buf.shrink_to(self.buf.len().max(INITIAL_BUFFER));
        }
    }
}

/// A method call.
#[derive(Debug, Deserialize)]
pub struct Call {
    /// `interface.Method`.
    pub method: String,
    /// The arguments; absent and `null` mean none.
    #[serde(default)]
    pub parameters: Option<Map<String, Value>>,
    /// The caller accepts several replies.
    #[serde(default)]
    pub more: bool,
    /// The caller wants no reply.
    #[serde(default)]
    pub oneway: bool,
    /// The caller wants to switch protocols after the reply (not supported).
    #[serde(default)]
    pub upgrade: bool,
}

/// A reply.
#[derive(Debug, Serialize)]
pub struct Reply {
    /// The error name, for a failed call.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The return values, or the error's parameters.
    pub parameters: Value,
    /// More replies follow.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub continues: bool,
}

impl Reply {
    /// The message bytes, NUL included.
    pub fn encode(&self) -> Vec<u8> {
        // Serializing a struct of strings, bools and `Value`s cannot fail.
        let mut out = serde_json::to_vec(self).unwrap_or_else(|_| b"{}".to_vec());
        out.push(0);
        out
    }
}
