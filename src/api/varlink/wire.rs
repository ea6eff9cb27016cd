//! The varlink framing on a tokio stream: [`FrameReader`] reads into the wire contract's
//! [`FrameBuffer`], which splits the bytes into NUL-terminated messages within the limit.
//! The envelopes and the limit are the contract's ([`cpupool_wire::varlink`]).

pub use cpupool_wire::varlink::{Call, FrameBuffer, FrameError, Reply, MAX_MESSAGE};
use tokio::io::{AsyncRead, AsyncReadExt};

/// Splits a byte stream into NUL-terminated messages of at most `limit` bytes (see
/// [`FrameBuffer`] for how its memory is bounded and given back).
pub struct FrameReader<R> {
    inner: R,
    frames: FrameBuffer,
}

impl<R: AsyncRead + Unpin> FrameReader<R> {
    /// Reads from `inner`, with the default limit [`MAX_MESSAGE`].
    pub fn new(inner: R) -> Self {
        FrameReader::with_limit(inner, MAX_MESSAGE)
    }

    /// Reads from `inner`, refusing messages longer than `limit` bytes (NUL excluded).
    pub fn with_limit(inner: R, limit: usize) -> Self {
        FrameReader { inner, frames: FrameBuffer::new(limit) }
    }

    /// The bytes the buffer holds allocated (for tests of its memory use).
    pub fn capacity(&self) -> usize {
        self.frames.capacity()
    }

    /// The next message without its NUL; `None` at a clean end of stream.
    ///
    /// Cancel-safe: bytes read before a cancellation stay buffered for the next call.
    pub async fn next(&mut self) -> Result<Option<Vec<u8>>, FrameError> {
        loop {
            if let Some(msg) = self.frames.take() {
                return Ok(Some(msg));
            }
            // Reads into the spare capacity only, and only advances the length once data came:
            // a cancelled read leaves the buffer as it was.
            let n = self.inner.read_buf(self.frames.room()?).await.map_err(FrameError::Io)?;
            if n == 0 {
                return self.frames.at_end();
            }
        }
    }
}
