//! irqbalance's control socket: telling a running irqbalance which CPUs it must not give
//! interrupts to, so that it balances around the isolated pools instead of undoing them.
//!
//! What irqbalance offers (its irqbalance.c and ui/, 1.9.x, the version Debian 12 ships with
//! the UI built in): a stream socket `/run/irqbalance/irqbalance<PID>.sock`; each connection
//! carries one command in one message, which must come with `SCM_CREDENTIALS` of uid 0.
//! `settings cpus <list>` sets the banned CPUs (a CPU list; `NULL` goes back to what it
//! detected at start: `isolcpus=` and `nohz_full=`) and takes effect at its next rescan;
//! `setup` answers `SLEEP <s> [IRQ ...] BANNED <hex mask>`, which is how the daemon reads the
//! setting back. The environment (`IRQBALANCE_BANNED_CPULIST`) would need a restart, which a
//! one-CPU reserved pool can make systemd skip (`ConditionCPUs=>1`), so it is not used.
#![deny(missing_docs)]

use std::io::{self, IoSlice, Read};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags, UnixCredentials};

use crate::core::cpuset::CpuSet;

/// Where irqbalance puts its socket.
pub const SOCKET_DIR: &str = "/run/irqbalance";

/// How long an answer is waited for. The daemon talks to irqbalance on a thread of its own
/// (see `engine::irq`), so a busy irqbalance (its socket is served between rescans) holds up
/// nothing else; a hung one is given up on after this.
pub const ANSWER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Why irqbalance could not be told or asked.
#[derive(Debug, thiserror::Error)]
pub enum IrqbalanceError {
    /// The socket could not be reached or the command not sent.
    #[error("sending `{command}` to irqbalance at `{}`", socket.display())]
    Io {
        /// The socket.
        socket: PathBuf,
        /// The command.
        command: String,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// Its answer to `setup` had no `BANNED` mask.
    #[error("irqbalance at `{}` answered `setup` with `{answer}`, which names no banned CPUs", socket.display())]
    Answer {
        /// The socket.
        socket: PathBuf,
        /// What it said.
        answer: String,
    },
}

/// The sockets of running irqbalance daemons in `dir` (normally one; none when it does not
/// run or was built without its socket).
pub fn sockets(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    let mut out: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| {
            p.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
                n.strip_prefix("irqbalance")
                    .and_then(|r| r.strip_suffix(".sock"))
                    .is_some_and(|pid| !pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit()))
            })
        })
        .collect();
    out.sort();
    out
}

/// Sends one command with our credentials and reads the answer to its end.
fn command(socket: &Path, command: &str) -> Result<String, IrqbalanceError> {
    let err = |source| IrqbalanceError::Io { socket: socket.to_owned(), command: command.to_owned(), source };
    let mut stream = UnixStream::connect(socket).map_err(err)?;
    // irqbalance reads the command with one recvmsg and needs the credentials on it: sent
    // explicitly, since the kernel adds them by itself only once it has accepted.
    let creds = UnixCredentials::new();
    sendmsg::<()>(
        stream.as_raw_fd(),
        &[IoSlice::new(command.as_bytes())],
        &[ControlMessage::ScmCredentials(&creds)],
        MsgFlags::empty(),
        None,
    )
    .map_err(|e| err(e.into()))?;
    stream.shutdown(std::net::Shutdown::Write).map_err(err)?;
    stream.set_read_timeout(Some(ANSWER_TIMEOUT)).map_err(err)?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).map_err(err)?;
    Ok(answer)
}

/// The CPUs irqbalance at `socket` keeps interrupts off now.
pub fn banned(socket: &Path) -> Result<CpuSet, IrqbalanceError> {
    let answer = command(socket, "setup")?;
    answer
        .split_once("BANNED ")
        .and_then(|(_, mask)| super::irq::parse_mask(mask.split_whitespace().next().unwrap_or_default()))
        .ok_or_else(|| IrqbalanceError::Answer {
            socket: socket.to_owned(),
            answer: answer.trim().to_owned(),
        })
}

/// Tells irqbalance at `socket` to keep interrupts off `cpus`; `None` hands the choice back
/// to it (what it detects itself).
pub fn set_banned(socket: &Path, cpus: Option<&CpuSet>) -> Result<(), IrqbalanceError> {
    let list = cpus.filter(|c| !c.is_empty()).map_or_else(|| "NULL".to_owned(), ToString::to_string);
    command(socket, &format!("settings cpus {list}")).map(|_| ())
}
