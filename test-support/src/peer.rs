//! `tests/fixtures/varlink_peer.py` run as another user: an unprivileged varlink client that
//! opens connections as told, reports what it got on one line, and holds them until its stdin
//! closes. The connection-limit tests (the server's unit tests and tests/dos.rs) use it.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

/// The peer's source.
pub const VARLINK_PEER_PY: &str = include_str!("../../tests/fixtures/varlink_peer.py");

/// Starts the peer as `uid` with primary group `gid` and no supplementary groups (through
/// `setpriv`), with `args` (the socket first); returns the child, still holding its connections,
/// and its report line. Needs root.
pub fn varlink_peer_as(uid: u32, gid: u32, args: &[&str]) -> (Child, String) {
    let mut child = Command::new("setpriv")
        .args([format!("--reuid={uid}"), format!("--regid={gid}"), "--clear-groups".to_owned()])
        .args(["/usr/bin/python3", "-c", VARLINK_PEER_PY])
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("setpriv python3: {e}"));
    let mut line = String::new();
    let out = child.stdout.take().unwrap_or_else(|| panic!("uid {uid}: no stdout"));
    BufReader::new(out).read_line(&mut line).unwrap_or_else(|e| panic!("uid {uid}: {e}"));
    (child, line)
}
