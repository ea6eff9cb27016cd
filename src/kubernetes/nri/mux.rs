//! NRI's connection multiplexer: several byte streams over the one unix socket a plugin opens
//! to the runtime. Each frame is an 8-byte header, the logical connection's id and the
//! payload's length (both big-endian `u32`), then the payload. The plugin serves its ttRPC
//! service on connection [`PLUGIN_CONN`] and calls the runtime's on [`RUNTIME_CONN`].
//!
//! A logical connection is a byte stream: a frame is whatever one write carried, so a ttRPC
//! message may in principle span frames (and a frame hold several), and the reader of each
//! connection reassembles them ([`super::ttrpc::Reassembly`]).

use std::io;

use tokio::io::{AsyncRead, AsyncReadExt};

/// The connection on which the runtime calls the plugin (the plugin's ttRPC server).
pub const PLUGIN_CONN: u32 = 1;
/// The connection on which the plugin calls the runtime (the plugin's ttRPC client).
pub const RUNTIME_CONN: u32 = 2;
/// The header's size.
pub const HEADER: usize = 8;
/// The largest payload one frame carries; a longer write is split. The runtime (Go) reads each
/// logical connection through a 4096-byte buffer and hands it one frame per read: a frame
/// larger than the buffer it is read into fails the whole connection, so none is.
pub const MAX_PAYLOAD: usize = 4096;
/// The largest frame accepted from the runtime: NRI v0.6.1 writes a whole ttRPC message (4 MiB
/// at most, with its header) as one frame, and refuses writes over 16 MiB itself; a larger
/// length is a broken stream, not a big message.
pub const MAX_ACCEPTED: usize = 16 << 20;

/// `payload` for connection `conn` as frames, split at [`MAX_PAYLOAD`].
pub fn encode(conn: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(payload.len() + HEADER * (1 + payload.len() / MAX_PAYLOAD));
    for chunk in payload.chunks(MAX_PAYLOAD) {
        out.extend_from_slice(&conn.to_be_bytes());
        // A chunk is at most MAX_PAYLOAD long: it fits a u32.
        out.extend_from_slice(&(chunk.len() as u32).to_be_bytes());
        out.extend_from_slice(chunk);
    }
    out
}

/// Reads one frame: `None` at a clean end of the stream (between frames).
pub async fn read_frame<R: AsyncRead + Unpin>(r: &mut R) -> io::Result<Option<(u32, Vec<u8>)>> {
    let mut header = [0u8; HEADER];
    match r.read_exact(&mut header[..1]).await {
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    r.read_exact(&mut header[1..]).await?;
    let conn = u32::from_be_bytes([header[0], header[1], header[2], header[3]]);
    let len = u32::from_be_bytes([header[4], header[5], header[6], header[7]]) as usize;
    if len > MAX_ACCEPTED {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("a multiplexer frame of {len} bytes on connection {conn} (at most {MAX_ACCEPTED})"),
        ));
    }
    let mut payload = vec![0u8; len];
    r.read_exact(&mut payload).await?;
    Ok(Some((conn, payload)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The header as NRI's multiplexer writes it: connection id, then length, big-endian.
    #[test]
    fn a_frame_is_conn_id_then_length_big_endian() {
        let bytes = encode(RUNTIME_CONN, b"abc");
        assert_eq!(bytes, [0, 0, 0, 2, 0, 0, 0, 3, b'a', b'b', b'c']);
    }

    #[test]
    fn long_payloads_are_split_and_read_back_in_order() {
        let payload: Vec<u8> = (0..(MAX_PAYLOAD * 300 + 10)).map(|i| (i % 251) as u8).collect();
        let bytes = encode(PLUGIN_CONN, &payload);
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap_or_else(|e| panic!("{e}"));
        let got = rt.block_on(async {
            let mut r = bytes.as_slice();
            let mut got = Vec::new();
            while let Some((conn, p)) = read_frame(&mut r).await.unwrap_or_else(|e| panic!("{e}")) {
                assert_eq!(conn, PLUGIN_CONN);
                assert!(p.len() <= MAX_PAYLOAD);
                got.extend(p);
            }
            got
        });
        assert_eq!(got, payload);
    }

    #[test]
    fn a_torn_or_oversized_frame_is_an_error_and_a_clean_end_is_none() {
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap_or_else(|e| panic!("{e}"));
        rt.block_on(async {
            let mut empty: &[u8] = &[];
            assert!(read_frame(&mut empty).await.unwrap_or_else(|e| panic!("{e}")).is_none());
            let mut torn: &[u8] = &[0, 0, 0, 1, 0, 0, 0, 9, 1, 2];
            assert!(read_frame(&mut torn).await.is_err());
            let mut huge: &[u8] = &[0, 0, 0, 1, 0x7f, 0xff, 0xff, 0xff];
            let e = read_frame(&mut huge).await.err().map(|e| e.to_string()).unwrap_or_default();
            assert!(e.contains("at most"), "{e}");
        });
    }
}
