//! The journal's bytes: a header line, then records, each a header line (`r <seq> <len> <crc32>`)
//! and a compact JSON payload followed by a newline. Encoding and the scan that tells good
//! records, a torn tail and damage apart; nothing that touches the disk.

/// The first line of every journal file.
pub(super) const HEADER: &[u8] = b"cpupoold-journal 1\n";
/// A record header is about 40 bytes; anything without a newline this far in is not one.
const MAX_RECORD_HEADER: usize = 64;

/// One record: header line, payload, newline. The CRC-32 covers the header's sequence and
/// length as well as the payload, so a record copied to another place in the sequence or cut
/// to another length does not check.
pub(super) fn record(seq: u64, payload: &[u8]) -> Vec<u8> {
    let len = payload.len();
    let header = format!("r {seq} {len} {:08x}\n", crc(seq, len as u64, payload));
    let mut bytes = Vec::with_capacity(header.len() + len + 1);
    bytes.extend_from_slice(header.as_bytes());
    bytes.extend_from_slice(payload);
    bytes.push(b'\n');
    bytes
}

fn crc(seq: u64, len: u64, payload: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(format!("r {seq} {len} ").as_bytes());
    h.update(payload);
    h.finalize()
}

/// A good record, as found in the file.
#[derive(Debug)]
pub(super) struct Record<'a> {
    pub seq: u64,
    /// Where its header starts.
    pub offset: u64,
    pub payload: &'a [u8],
}

/// How the good records end.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum End {
    /// At the end of the file.
    Clean,
    /// With a record that is cut short or does not check, and nothing good after it: a write
    /// whose fdatasync never returned.
    Torn { offset: u64, bytes: u64 },
    /// With a record that does not check (or breaks the sequence) and good records after it, or
    /// with a bad file header: damage.
    Damaged { offset: u64, seq: Option<u64>, reason: String },
}

/// The good records of a journal file and how they end.
#[derive(Debug)]
pub(super) struct Scan<'a> {
    pub records: Vec<Record<'a>>,
    pub end: End,
}

enum Parsed<'a> {
    Good(Record<'a>, usize),
    /// The file ends inside the record.
    Short(Option<u64>),
    Bad(Option<u64>, String),
}

/// Reads every record of `bytes`, checking each one's checksum and that sequence numbers follow
/// each other.
pub(super) fn scan(bytes: &[u8]) -> Scan<'_> {
    let mut records: Vec<Record<'_>> = Vec::new();
    if !bytes.starts_with(HEADER) {
        let reason = format!("the file does not start with `{}`", String::from_utf8_lossy(HEADER).trim_end());
        return Scan { records, end: End::Damaged { offset: 0, seq: None, reason } };
    }
    let mut pos = HEADER.len();
    while pos < bytes.len() {
        let (seq, reason) = match parse_at(bytes, pos) {
            Parsed::Good(r, end) => {
                if let Some(last) = records.last() {
                    if r.seq != last.seq + 1 {
                        let reason = format!("record {} follows record {}", r.seq, last.seq);
                        return Scan {
                            end: End::Damaged { offset: r.offset, seq: Some(r.seq), reason },
                            records,
                        };
                    }
                }
                records.push(r);
                pos = end;
                continue;
            }
            Parsed::Short(seq) => (seq, "the record is cut short".to_owned()),
            Parsed::Bad(seq, reason) => (seq, reason),
        };
        let offset = pos as u64;
        let end = if good_after(bytes, pos) {
            End::Damaged { offset, seq, reason: format!("{reason}, and good records follow it") }
        } else {
            End::Torn { offset, bytes: (bytes.len() - pos) as u64 }
        };
        return Scan { records, end };
    }
    Scan { records, end: End::Clean }
}

/// Whether a good record starts anywhere after `pos` (at the start of a line).
fn good_after(bytes: &[u8], pos: usize) -> bool {
    (pos + 1..bytes.len())
        .filter(|&p| bytes[p - 1] == b'\n' && bytes[p] == b'r')
        .any(|p| matches!(parse_at(bytes, p), Parsed::Good(..)))
}

fn parse_at(bytes: &[u8], pos: usize) -> Parsed<'_> {
    let rest = &bytes[pos..];
    let window = &rest[..rest.len().min(MAX_RECORD_HEADER)];
    let Some(nl) = window.iter().position(|&b| b == b'\n') else {
        return if rest.len() < MAX_RECORD_HEADER {
            Parsed::Short(None)
        } else {
            Parsed::Bad(None, format!("no record header line in the next {MAX_RECORD_HEADER} bytes"))
        };
    };
    let header = String::from_utf8_lossy(&rest[..nl]);
    let fields: Vec<&str> = header.split(' ').collect();
    let [tag, seq, len, sum] = fields[..] else {
        return Parsed::Bad(None, format!("bad record header {header:?}"));
    };
    let (Some(seq), Some(len), Some(sum)) = (decimal(seq), decimal(len), hex32(sum)) else {
        return Parsed::Bad(None, format!("bad record header {header:?}"));
    };
    if tag != "r" {
        return Parsed::Bad(Some(seq), format!("bad record header {header:?}"));
    }
    let start = pos + nl + 1;
    let Some(end) = usize::try_from(len).ok().and_then(|l| start.checked_add(l)?.checked_add(1)) else {
        return Parsed::Short(Some(seq));
    };
    if end > bytes.len() {
        return Parsed::Short(Some(seq));
    }
    let payload = &bytes[start..end - 1];
    if bytes[end - 1] != b'\n' {
        return Parsed::Bad(Some(seq), "the record does not end with a newline".to_owned());
    }
    let actual = crc(seq, len, payload);
    if actual != sum {
        return Parsed::Bad(
            Some(seq),
            format!("checksum mismatch (header says {sum:08x}, record has {actual:08x})"),
        );
    }
    Parsed::Good(Record { seq, offset: pos as u64, payload }, end)
}

fn decimal(s: &str) -> Option<u64> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

fn hex32(s: &str) -> Option<u32> {
    if s.len() != 8 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u32::from_str_radix(s, 16).ok()
}
