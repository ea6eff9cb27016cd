//! `cpupoolctl run --pool P --cpus N -- COMMAND...`: what CMK's `isolate` and CPU-Pooler's
//! process-starter did, with the daemon owning the decision.
//!
//! The process that becomes COMMAND must exist before the daemon can confine it, and must not
//! run COMMAND before it is confined. So cpupoolctl starts itself again as the child
//! (`__run-child FD -- COMMAND...`), which blocks reading a pipe it inherits as descriptor FD
//! (nothing on a file system: no directory to make, none left behind); the parent asks the daemon to
//! `Run` the child's pid (where systemd runs, the daemon moves it into a scope in the pool's
//! slice with AllowedCPUs; elsewhere it sets its affinity), then writes the environment
//! (`CPUPOOL_CPUS`, `CPUPOOL_POOL`, `EXCLUSIVE_CPUS` or `SHARED_CPUS`, `CPUPOOL_ASSIGNMENT`)
//! into the pipe. The child sets it and executes COMMAND in place: same pid, so the scope and
//! the affinity hold. The parent waits, sees the daemon release the assignment (it does so
//! when the process exits: over varlink the parent follows `Monitor` on a second connection,
//! subscribed before COMMAND can run, and waits for the assignment's `removed`; over D-Bus it
//! looks with `ListAssignments`; it asks only if it has not within a few seconds) and exits
//! with COMMAND's status (128 + N when a signal N ended it). If cpupoolctl itself dies, the
//! daemon still releases the assignment when the process exits. Against a sandbox the CPUs are simulated: COMMAND
//! runs unconfined and gets `CPUPOOL_SIMULATED=1`.

use std::ffi::OsString;
use std::io::Write;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::time::{Duration, Instant};

use crate::cli::RunArgs;
use cpupool_wire::methods as api;
use cpupool_wire::varlink::params;

use crate::client::Client;
use crate::client::{Amount, RunRequest};
use crate::error::Error;

fn local(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> Error {
    let what = what.into();
    move |source| Error::Local { what, source }
}

/// The pipe the parent hands the environment to the child through: the read end crosses the
/// child's `exec` (its number is the child's argument), the write end stays here.
struct Handover {
    read: std::os::fd::OwnedFd,
    write: std::os::fd::OwnedFd,
}

impl Handover {
    fn new() -> Result<Handover, Error> {
        use nix::fcntl::{fcntl, FcntlArg, FdFlag, OFlag};
        use std::os::fd::AsRawFd;
        let pipe_error =
            |e: nix::Error| Error::Local { what: "making the pipe to the child".into(), source: e.into() };
        let (read, write) = nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(pipe_error)?;
        // Only this end is inherited, and only the child is started while it exists (cpupoolctl
        // starts no other process).
        fcntl(read.as_raw_fd(), FcntlArg::F_SETFD(FdFlag::empty())).map_err(pipe_error)?;
        Ok(Handover { read, write })
    }
}

/// The parent side: never returns when COMMAND ran (exits with its status). Against a sandbox
/// (`sandbox`), the CPUs are the simulated host's: the daemon records them in its own
/// directory and never touches this process, so COMMAND runs unconfined, which is said on
/// stderr and in `CPUPOOL_SIMULATED=1`.
pub fn parent(m: &mut Client, args: &RunArgs, amount: Amount, sandbox: bool) -> Result<(), Error> {
    // Asked first, so that its subscription runs while GetPool and Run do. Without it (it
    // could not be opened), the release is looked for with ListAssignments.
    let events = m.events();
    // Started before the daemon is asked, so that its start runs while GetPool does; it
    // waits on the pipe, and runs nothing unless the CPUs are written into it.
    let handover = Handover::new()?;
    let exe = std::env::current_exe().map_err(local("finding cpupoolctl's own executable"))?;
    let spawned = std::process::Command::new(exe)
        .arg("__run-child")
        .arg(std::os::fd::AsRawFd::as_raw_fd(&handover.read).to_string())
        .arg("--")
        .args(&args.command)
        .spawn()
        .map_err(local("starting the child process"));
    // The child holds its end now: with ours closed, the child reads the end of the
    // environment when the write end closes, and a write finds out when the child is gone.
    let Handover { read, write } = handover;
    drop(read);
    let mut child = spawned?;
    // Fails clearly on a pool that does not exist; the child never runs COMMAND.
    let pool = match m.pool::<api::GetPool>(&params::GetPool { name: args.pool.clone() }) {
        Ok(p) => p,
        Err(e) => {
            let _ = child.kill();
            let _ = child.wait();
            return Err(e);
        }
    };
    let req = RunRequest { pool: args.pool.clone(), pid: child.id(), amount, id: args.id.clone() };
    let a = match m.call::<api::Run>(&crate::client::run_params(&req)) {
        Ok(r) => r.assignment,
        Err(e) => {
            // It is still waiting on the pipe: it never ran COMMAND.
            let _ = child.kill();
            let _ = child.wait();
            return Err(e);
        }
    };
    let text = environment(&pool, &a, args, sandbox);
    // Subscribed before COMMAND can run (and end): its release is not missed.
    let mut events = events.and_then(Result::ok).and_then(|mut e| e.subscribed().ok().map(|()| e));
    // Into the pipe's buffer; closing it ends the child's read. A child gone already fails it.
    let written = std::fs::File::from(write).write_all(text.as_bytes());
    if let Err(e) = written {
        let _ = child.kill();
        let _ = child.wait();
        let _ = m.call::<api::Release>(&params::Release { id: a.id.clone() });
        return Err(Error::Local { what: "handing the CPUs to the child".into(), source: e });
    }
    let status = child.wait().map_err(local("waiting for the command"))?;
    // The daemon releases a `Run` assignment itself when its process exits. Releasing it here
    // too would race that, and the loser's NoSuchAssignment would count as an API error on
    // the daemon's books: so this waits (reading) until the CPUs are free, and asks only a
    // daemon that has not released them within RECLAIM_WAIT.
    let freed = match events.as_mut() {
        Some(events) => released(m, events, &a.pool, &a.id),
        None => reclaimed(m, &a.pool, &a.id),
    };
    if !freed {
        match m.call::<api::Release>(&params::Release { id: a.id.clone() }) {
            Ok(_) => {}
            // It did, just now.
            Err(Error::Daemon(e)) if e.kind == "NoSuchAssignment" => {}
            Err(e) => eprintln!("cpupoolctl: releasing assignment {}: {}", a.id, e.human()),
        }
    }
    let code = status.code().unwrap_or_else(|| 128 + status.signal().unwrap_or(0));
    std::process::exit(code)
}

/// What the child is given through the pipe: the variables COMMAND gets. Against a sandbox
/// (`sandbox`) it also gets `CPUPOOL_SIMULATED=1`, and the user is told it runs unconfined.
fn environment(
    pool: &cpupool_wire::views::Pool,
    a: &cpupool_wire::views::Assignment,
    args: &RunArgs,
    sandbox: bool,
) -> String {
    let kind_var = if pool.kind == "exclusive" { "EXCLUSIVE_CPUS" } else { "SHARED_CPUS" };
    let env = [
        ("CPUPOOL_CPUS", a.cpus.as_str()),
        ("CPUPOOL_POOL", a.pool.as_str()),
        (kind_var, a.cpus.as_str()),
        ("CPUPOOL_ASSIGNMENT", a.id.as_str()),
    ];
    let mut text: String = env.iter().map(|(k, v)| format!("{k}={v}\n")).collect();
    if sandbox {
        eprintln!(
            "cpupoolctl: sandbox: CPUs {} belong to the simulated host; `{}` runs on this machine's CPUs, unconfined",
            a.cpus,
            args.command.first().map(|c| c.to_string_lossy()).unwrap_or_default()
        );
        text.push_str("CPUPOOL_SIMULATED=1\n");
    }
    text
}

/// How long the daemon is given to release a `Run` assignment whose process exited: it watches
/// the process (a pidfd) or its scope, so it is usually done before the first look.
const RECLAIM_WAIT: Duration = Duration::from_secs(5);

/// Whether the daemon released assignment `id` of `pool` within [`RECLAIM_WAIT`], by its
/// `removed` event on `events`; when none came (or the stream failed), one look with
/// `ListAssignments` decides. A replay of the pools (`current`: the stream fell behind and
/// may have lost events) is not looked into: the look at the deadline covers it.
fn released(m: &mut Client, events: &mut crate::varlink::Events, pool: &str, id: &str) -> bool {
    let deadline = Instant::now() + RECLAIM_WAIT;
    loop {
        match events.next(deadline.saturating_duration_since(Instant::now())) {
            Ok(Some(e))
                if e.kind == "assignment"
                    && e.id.as_deref() == Some(id)
                    && e.change.as_deref() == Some("removed") =>
            {
                return true
            }
            Ok(Some(_)) => {}
            Ok(None) | Err(_) => {
                let list = m.assignments(Some(pool));
                return matches!(list, Ok(list) if !list.iter().any(|a| a.id == id));
            }
        }
    }
}

/// Whether the daemon released assignment `id` of `pool` within [`RECLAIM_WAIT`] (looked at
/// with `ListAssignments`, which changes nothing); `false` also when it cannot be asked.
fn reclaimed(m: &mut Client, pool: &str, id: &str) -> bool {
    let deadline = Instant::now() + RECLAIM_WAIT;
    let mut pause = Duration::from_millis(5);
    loop {
        match m.assignments(Some(pool)) {
            Ok(list) if !list.iter().any(|a| a.id == id) => return true,
            Ok(_) => {}
            Err(_) => return false,
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(100));
    }
}

/// The child side: reads the environment from descriptor `fd` (the pipe from the parent, to
/// its end), closes it, then becomes COMMAND.
pub fn child(fd: i32, command: &[OsString]) -> Result<(), Error> {
    let failed = |e: nix::Error| Error::Local {
        what: format!("reading the pipe (descriptor {fd})"),
        source: e.into(),
    };
    let mut bytes = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match nix::unistd::read(fd, &mut buf) {
            Ok(0) => break,
            Ok(n) => bytes.extend_from_slice(&buf[..n]),
            Err(nix::Error::EINTR) => {}
            Err(e) => return Err(failed(e)),
        }
    }
    // Not COMMAND's.
    nix::unistd::close(fd).map_err(failed)?;
    let text = String::from_utf8_lossy(&bytes);
    if text.is_empty() {
        // The parent gave up: COMMAND must not run unconfined.
        std::process::exit(125);
    }
    let mut cmd = std::process::Command::new(&command[0]);
    cmd.args(&command[1..]);
    for line in text.lines() {
        if let Some((k, v)) = line.split_once('=') {
            cmd.env(k, v);
        }
    }
    let e = cmd.exec();
    let code = if e.kind() == std::io::ErrorKind::NotFound { 127 } else { 126 };
    eprintln!("cpupoolctl: running `{}`: {e}", command[0].to_string_lossy());
    std::process::exit(code)
}
