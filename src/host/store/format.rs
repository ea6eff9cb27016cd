//! The state file's bytes: a header line (magic word, format version, the journal sequence it
//! includes, payload length, CRC-32) and the JSON payload (see the [store's docs](super) for the
//! format). Encoding and the checks that find a damaged file, nothing that touches the disk.
//! Version 1 files (no sequence; written before the journal existed) are still read, as
//! including sequence 0, and version 2 files (no prepared claims) as they are.

use std::path::PathBuf;

use serde::de::DeserializeOwned;

use super::{PrevCopy, StoreError, FORMAT_VERSION};

const MAGIC: &str = "cpupoold-state";
/// A header is about 60 bytes; anything without a newline this far in is not our header.
const MAX_HEADER: usize = 128;

/// Header line plus payload, for a snapshot that includes the journal's records up to `seq`.
pub(super) fn frame(seq: u64, payload: &[u8]) -> Vec<u8> {
    let header =
        format!("{MAGIC} {FORMAT_VERSION} {seq} {} {:08x}\n", payload.len(), crc32fast::hash(payload));
    let mut bytes = Vec::with_capacity(header.len() + payload.len());
    bytes.extend_from_slice(header.as_bytes());
    bytes.extend_from_slice(payload);
    bytes
}

/// What is wrong with a state file's bytes; becomes a [`StoreError`] once the path and the
/// previous copy are known.
#[derive(Debug)]
pub(super) enum Defect {
    TruncatedHeader { len: u64 },
    Truncated { expected: u64, actual: u64 },
    TrailingData { expected: u64, actual: u64 },
    Checksum { expected: u32, actual: u32 },
    Version { found: u32 },
    BadHeader(String),
    Decode(serde_json::Error),
}

impl Defect {
    pub(super) fn into_error(self, path: PathBuf, prev: PrevCopy) -> StoreError {
        match self {
            Defect::TruncatedHeader { len } => StoreError::TruncatedHeader { path, len, prev },
            Defect::Truncated { expected, actual } => StoreError::Truncated { path, expected, actual, prev },
            Defect::TrailingData { expected, actual } => {
                StoreError::TrailingData { path, expected, actual, prev }
            }
            Defect::Checksum { expected, actual } => {
                StoreError::ChecksumMismatch { path, expected, actual, prev }
            }
            Defect::Version { found } => {
                StoreError::UnsupportedVersion { path, found, supported: FORMAT_VERSION, prev }
            }
            Defect::BadHeader(reason) => StoreError::BadHeader { path, reason, prev },
            Defect::Decode(source) => StoreError::Decode { path, prev, source },
        }
    }
}

/// Checks the header, length and checksum, then decodes the JSON. Returns the state and the
/// journal sequence it includes.
pub(super) fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<(T, u64), Defect> {
    let window = &bytes[..bytes.len().min(MAX_HEADER)];
    let Some(newline) = window.iter().position(|&b| b == b'\n') else {
        let magic = format!("{MAGIC} ");
        // A prefix of a plausible header (including an empty file) is what a cut-off write
        // leaves; anything else is not our file.
        return Err(
            if bytes.len() < MAX_HEADER
                && (magic.as_bytes().starts_with(bytes) || bytes.starts_with(magic.as_bytes()))
            {
                Defect::TruncatedHeader { len: len_u64(bytes) }
            } else if bytes.starts_with(magic.as_bytes()) {
                Defect::BadHeader(format!("no end of header line in the first {MAX_HEADER} bytes"))
            } else {
                Defect::BadHeader(format!("the file does not start with `{MAGIC}`"))
            },
        );
    };
    let header = std::str::from_utf8(&bytes[..newline])
        .map_err(|_| Defect::BadHeader("the header line is not UTF-8".to_owned()))?;
    let payload = &bytes[newline + 1..];
    let fields: Vec<&str> = header.split(' ').collect();
    if fields[0] != MAGIC {
        return Err(Defect::BadHeader(format!("the file does not start with `{MAGIC}`")));
    }
    // The version comes first so that a future format may change everything after it.
    let version = fields.get(1).copied().unwrap_or_default();
    let found = parse_decimal(version)
        .and_then(|v| u32::try_from(v).ok())
        .ok_or_else(|| Defect::BadHeader(format!("format version {version:?} is not a number")))?;
    let (seq, len, crc) = match (found, &fields[..]) {
        (1, [_, _, len, crc]) => ("0", *len, *crc),
        (1, _) => {
            return Err(Defect::BadHeader(format!("expected `{MAGIC} 1 <length> <crc32>`, found {header:?}")))
        }
        (2 | FORMAT_VERSION, [_, _, seq, len, crc]) => (*seq, *len, *crc),
        (2 | FORMAT_VERSION, _) => {
            return Err(Defect::BadHeader(format!(
                "expected `{MAGIC} {found} <sequence> <length> <crc32>`, found {header:?}"
            )))
        }
        _ => return Err(Defect::Version { found }),
    };
    let seq = parse_decimal(seq)
        .ok_or_else(|| Defect::BadHeader(format!("journal sequence {seq:?} is not a number")))?;
    let expected_len = parse_decimal(len)
        .ok_or_else(|| Defect::BadHeader(format!("payload length {len:?} is not a number")))?;
    let expected_crc = (crc.len() == 8 && crc.bytes().all(|b| b.is_ascii_hexdigit()))
        .then(|| u32::from_str_radix(crc, 16).ok())
        .flatten()
        .ok_or_else(|| Defect::BadHeader(format!("checksum {crc:?} is not 8 hex digits")))?;
    let actual_len = len_u64(payload);
    if actual_len < expected_len {
        return Err(Defect::Truncated { expected: expected_len, actual: actual_len });
    }
    if actual_len > expected_len {
        return Err(Defect::TrailingData { expected: expected_len, actual: actual_len });
    }
    let actual_crc = crc32fast::hash(payload);
    if actual_crc != expected_crc {
        return Err(Defect::Checksum { expected: expected_crc, actual: actual_crc });
    }
    serde_json::from_slice(payload).map(|state| (state, seq)).map_err(Defect::Decode)
}

/// Plain ASCII digits only (`u64::from_str` would also take a leading `+`).
fn parse_decimal(s: &str) -> Option<u64> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

pub(super) fn len_u64(bytes: &[u8]) -> u64 {
    u64::try_from(bytes.len()).unwrap_or(u64::MAX)
}
