//! The varlink wire format: JSON objects, each terminated by a NUL byte.
//!
//! A call is `{"method": "iface.Method", "parameters": {...}, "more": bool, "oneway": bool}`;
//! a reply is `{"parameters": {...}, "continues": bool}` or `{"error": "iface.Error",
//! "parameters": {...}}`.

use std::io;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use tokio::io::{AsyncRead, AsyncReadExt};

/// Largest message accepted. A client that sends more without a NUL is disconnected, so a
/// peer cannot make the daemon buffer without bound.
pub const MAX_MESSAGE: usize = 1 << 20;

/// Splits a byte stream into NUL-terminated messages.
pub struct FrameReader<R> {
    inner: R,
    buf: Vec<u8>,
    /// How far `buf` has been searched for a NUL already.
    scanned: usize,
}

impl<R: AsyncRead + Unpin> FrameReader<R> {
    /// Reads from `inner`.
    pub fn new(inner: R) -> Self {
        FrameReader { inner, buf: Vec::new(), scanned: 0 }
    }

    /// The next message without its NUL; `None` at a clean end of stream.
    ///
    /// Cancel-safe: bytes read before a cancellation stay buffered for the next call.
    pub async fn next(&mut self) -> io::Result<Option<Vec<u8>>> {
        loop {
            if let Some(i) = self.buf[self.scanned..].iter().position(|&b| b == 0) {
                let end = self.scanned + i;
                let mut msg: Vec<u8> = self.buf.drain(..=end).collect();
                msg.pop();
                self.scanned = 0;
                return Ok(Some(msg));
            }
            self.scanned = self.buf.len();
            if self.buf.len() > MAX_MESSAGE {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("message longer than {MAX_MESSAGE} bytes"),
                ));
            }
            let mut chunk = [0u8; 16 * 1024];
            let n = self.inner.read(&mut chunk).await?;
            if n == 0 {
                return if self.buf.is_empty() {
                    Ok(None)
                } else {
                    Err(io::Error::new(io::ErrorKind::UnexpectedEof, "connection closed inside a message"))
                };
            }
            self.buf.extend_from_slice(&chunk[..n]);
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
