//! An unprivileged flood on the daemon's one bus connection is bounded as the daemon reads it:
//! the real `cpupoold` on a sandbox host, a private `dbus-daemon`, and a peer running as
//! nobody (this test binary run again through `Command::uid`).
//!
//! The daemon is stopped (`SIGSTOP`) while nobody, on a connection the daemon has never seen,
//! queues [`CALLS`] calls, and root queues one `Status` behind them; then it continues. The
//! daemon can only learn nobody's uid from the bus's answer to `GetConnectionUnixUser`, which
//! it asks after it continues, so that answer comes in behind every queued call: the calls it
//! reads before are calls of a caller it does not know. Those are held up to a bound, and
//! refused `Busy` beyond it as they are read, not kept without bound until the answer comes. Root's
//! call, behind them all, is answered. Counts and errors are asserted, never times.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::HashSet;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};

use common::{Daemon, PrivateBus};
use futures_util::StreamExt;
use serde_json::{json, Value};

const DEST: &str = "org.cpupool.Manager1";
const PATH: &str = "/org/cpupool/Manager1";
/// The environment variable that makes [`unidentified_flood_peer`] call the bus at its address.
const FLOOD_BUS: &str = "CPUPOOLD_FLOOD_BUS";
/// Calls nobody queues: under the `dbus-daemon`'s default of 128 calls awaiting a reply per
/// connection, and far beyond the daemon's bound of calls waiting to be identified.
const CALLS: usize = 120;
/// How many calls of one connection may wait for its uid (`CallLimits::PER_UID`).
const WAITING: usize = cpupoold::api::dbus::CallLimits::PER_UID;

/// What the flood's replies were.
#[derive(Default)]
struct Tally {
    ok: u64,
    /// `Busy` before the daemon knew who called.
    unidentified: u64,
    /// `Busy` beyond uid 65534's budget of calls in flight.
    over_budget: u64,
    other: Vec<String>,
}

/// The flood's peer, run as nobody by [`calls_of_an_unknown_caller_wait_within_a_bound`]: it
/// connects, says so, and on a line on stdin sends [`CALLS`] `Status` calls in a row, then asks
/// the bus for its id (so every call is queued for the daemon once that is answered), says so,
/// and prints how its calls were answered.
#[test]
#[ignore = "a helper: run as nobody by calls_of_an_unknown_caller_wait_within_a_bound"]
fn unidentified_flood_peer() {
    let Ok(address) = std::env::var(FLOOD_BUS) else { return };
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let tally = rt.block_on(async {
        let conn = zbus::connection::Builder::address(address.as_str()).unwrap().build().await.unwrap();
        let mut replies = zbus::MessageStream::from(&conn);
        println!("flood: connected");
        let mut line = String::new();
        std::io::stdin().read_line(&mut line).unwrap();
        let mut serials = HashSet::new();
        for _ in 0..CALLS {
            let call = zbus::Message::method_call(PATH, "Status")
                .unwrap()
                .destination(DEST)
                .unwrap()
                .interface(DEST)
                .unwrap()
                .build(&())
                .unwrap();
            serials.insert(call.primary_header().serial_num());
            conn.send(&call).await.unwrap();
        }
        let bus = zbus::fdo::DBusProxy::new(&conn).await.unwrap();
        bus.get_id().await.unwrap();
        println!("flood: queued");
        let mut tally = Tally::default();
        while !serials.is_empty() {
            let msg = replies.next().await.expect("the connection closed").unwrap();
            let hdr = msg.header();
            if !hdr.reply_serial().is_some_and(|s| serials.remove(&s)) {
                continue;
            }
            match hdr.error_name().map(|n| n.as_str().to_owned()) {
                None => tally.ok += 1,
                Some(name) if name == "org.cpupool.Manager1.Error.Busy" => {
                    let text: String = msg.body().deserialize().unwrap_or_default();
                    if text.contains("not identified") {
                        tally.unidentified += 1
                    } else if text.contains("uid 65534") {
                        tally.over_budget += 1
                    } else {
                        tally.other.push(format!("{name}: {text}"))
                    }
                }
                Some(name) => tally.other.push(name),
            }
        }
        tally
    });
    let report = json!({
        "ok": tally.ok, "unidentified": tally.unidentified,
        "over_budget": tally.over_budget, "other": tally.other,
    });
    println!("flood: {report}");
}

/// Reads the peer's stdout up to a line containing `what`.
fn wait_for(out: &mut impl BufRead, what: &str) -> String {
    let mut line = String::new();
    while !line.contains(what) {
        line.clear();
        assert!(out.read_line(&mut line).unwrap() > 0, "the flood peer ended before `{what}`");
    }
    line
}

/// The flood peer, killed if the test ends before it does.
struct Peer(std::process::Child);

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn signal(d: &Daemon, sig: nix::sys::signal::Signal) {
    let pid = nix::unistd::Pid::from_raw(i32::try_from(d.pid()).unwrap());
    nix::sys::signal::kill(pid, sig).unwrap();
}

#[test]
fn calls_of_an_unknown_caller_wait_within_a_bound() {
    let dir = tempfile::tempdir().unwrap();
    let bus = PrivateBus::start(dir.path());
    let d = Daemon::start(dir.path(), &["--bus", &bus.address]);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let root =
        rt.block_on(zbus::connection::Builder::address(bus.address.as_str()).unwrap().build()).unwrap();
    // Root's connection is known to the daemon before the flood.
    rt.block_on(root.call_method(Some(DEST), PATH, Some(DEST), "Status", &())).unwrap();

    let mut peer = Peer(
        Command::new(std::env::current_exe().unwrap())
            .args(["--ignored", "--exact", "unidentified_flood_peer", "--nocapture", "--test-threads=1"])
            .env(FLOOD_BUS, &bus.address)
            .uid(65534)
            .gid(65534)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("the flood peer: {e}")),
    );
    let mut out = BufReader::new(peer.0.stdout.take().unwrap());
    wait_for(&mut out, "flood: connected");

    signal(&d, nix::sys::signal::Signal::SIGSTOP);
    peer.0.stdin.as_mut().unwrap().write_all(b"go\n").unwrap();
    wait_for(&mut out, "flood: queued");
    // Root's call, queued behind the flood: sent, and routed once the bus answered the next.
    let status = zbus::Message::method_call(PATH, "Status")
        .unwrap()
        .destination(DEST)
        .unwrap()
        .interface(DEST)
        .unwrap()
        .build(&())
        .unwrap();
    let serial = status.primary_header().serial_num();
    let mut replies = zbus::MessageStream::from(&root);
    rt.block_on(root.send(&status)).unwrap();
    rt.block_on(async { zbus::fdo::DBusProxy::new(&root).await?.get_id().await }).unwrap();
    signal(&d, nix::sys::signal::Signal::SIGCONT);

    let answer = rt.block_on(async {
        loop {
            let msg = replies.next().await.expect("root's connection closed").unwrap();
            if msg.header().reply_serial() == Some(serial) {
                return msg;
            }
        }
    });
    assert!(answer.header().error_name().is_none(), "root's Status under the flood: {answer:?}");

    let mut rest = String::new();
    out.read_to_string(&mut rest).unwrap();
    assert!(peer.0.wait().unwrap().success(), "the flood peer failed: {rest}");
    let report: Value = rest
        .lines()
        .find_map(|l| l.split_once("flood: {").map(|(_, j)| format!("{{{j}")))
        .and_then(|j| serde_json::from_str(&j).ok())
        .unwrap_or_else(|| panic!("no report from the flood peer: {rest}"));
    eprintln!("{CALLS} calls of an unknown caller: {report}");
    let count = |k: &str| report[k].as_u64().unwrap_or_else(|| panic!("{k} in {report}"));
    assert_eq!(report["other"], json!([]), "{report}");
    assert_eq!(count("ok") + count("unidentified") + count("over_budget"), CALLS as u64, "{report}");
    // The daemon reads all but the calls its connection buffers before the bus's answer can
    // come in: far more than may wait, so calls were refused before it knew who called...
    assert!(count("unidentified") > 0, "every call of an unknown caller was held: {report}");
    // ...and those held were answered once it knew.
    assert!(count("ok") + count("over_budget") >= WAITING as u64, "{report}");
    d.stop();
}
