//! `cpupoolctl run --pool P --cpus N -- COMMAND...`: what CMK's `isolate` and CPU-Pooler's
//! process-starter did, with the daemon owning the decision.
//!
//! The process that becomes COMMAND must exist before the daemon can confine it, and must not
//! run COMMAND before it is confined. So cpupoolctl starts itself again as the child
//! (`__run-child FIFO -- COMMAND...`), which blocks reading a FIFO; the parent asks the daemon to
//! `Run` the child's pid (where systemd runs, the daemon moves it into a scope in the pool's
//! slice with AllowedCPUs; elsewhere it sets its affinity), then writes the environment
//! (`CPUPOOL_CPUS`, `CPUPOOL_POOL`, `EXCLUSIVE_CPUS` or `SHARED_CPUS`, `CPUPOOL_ASSIGNMENT`)
//! into the FIFO. The child sets it and executes COMMAND in place: same pid, so the scope and
//! the affinity hold. The parent waits, sees the daemon release the assignment (it does so
//! when the process exits: over varlink the parent follows `Monitor` on a second connection,
//! subscribed before COMMAND can run, and waits for the assignment's `removed`; over D-Bus it
//! looks with `ListAssignments`; it asks only if it has not within a few seconds) and exits
//! with COMMAND's status (128 + N when a signal N ended it). If cpupoolctl itself dies, the
//! daemon still releases the assignment when the process exits. Against a sandbox the CPUs are simulated: COMMAND
//! runs unconfined and gets `CPUPOOL_SIMULATED=1`.

use std::ffi::OsString;
use std::io::{Read, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
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

/// A private directory holding the FIFO, removed on drop.
struct FifoDir(PathBuf);

impl FifoDir {
    fn new() -> Result<FifoDir, Error> {
        use std::os::unix::fs::DirBuilderExt;
        let base = std::env::var_os("XDG_RUNTIME_DIR").map(PathBuf::from).unwrap_or_else(std::env::temp_dir);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or_default();
        let dir = base.join(format!("cpupoolctl-run-{}-{nanos}", std::process::id()));
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .map_err(local(format!("creating `{}`", dir.display())))?;
        let d = FifoDir(dir);
        nix::unistd::mkfifo(&d.fifo(), nix::sys::stat::Mode::S_IRUSR | nix::sys::stat::Mode::S_IWUSR)
            .map_err(|e| Error::Local {
                what: format!("creating `{}`", d.fifo().display()),
                source: e.into(),
            })?;
        Ok(d)
    }

    fn fifo(&self) -> PathBuf {
        self.0.join("env")
    }
}

impl Drop for FifoDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
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
    // Sent before the child starts, so that the daemon answers it meanwhile; Run follows on
    // the same connection without waiting for it (over D-Bus each is made in turn).
    let get_pool = m.begin::<api::GetPool>(&params::GetPool { name: args.pool.clone() });
    // Waits on the FIFO, and runs nothing unless the CPUs are written into it.
    let dir = FifoDir::new()?;
    let exe = std::env::current_exe().map_err(local("finding cpupoolctl's own executable"))?;
    let mut child = std::process::Command::new(exe)
        .arg("__run-child")
        .arg(dir.fifo())
        .arg("--")
        .args(&args.command)
        .spawn()
        .map_err(local("starting the child process"))?;
    let req = RunRequest { pool: args.pool.clone(), pid: child.id(), amount, id: args.id.clone() };
    let run = m.begin::<api::Run>(&crate::client::run_params(&req));
    // Both replies are read whatever the first says. A pool that does not exist fails both
    // clearly; the child never runs COMMAND when either failed. A Run that succeeded after a
    // GetPool that did not is given back by the daemon as the child exits.
    let pool = m.finish_pool(get_pool);
    let (pool, a) = match (pool, m.finish(run)) {
        (Ok(p), Ok(r)) => (p, r.assignment),
        (Err(e), _) | (_, Err(e)) => {
            // It is still waiting on the FIFO: it never ran COMMAND.
            let _ = child.kill();
            let _ = child.wait();
            return Err(e);
        }
    };
    let text = environment(&pool, &a, args, sandbox);
    // Subscribed before COMMAND can run (and end): its release is not missed.
    let mut events = events.and_then(Result::ok).and_then(|mut e| e.subscribed().ok().map(|()| e));
    // Opening blocks until the child opens its end, which it does first thing.
    let written = std::fs::OpenOptions::new()
        .write(true)
        .open(dir.fifo())
        .and_then(|mut f| f.write_all(text.as_bytes()));
    if let Err(e) = written {
        let _ = child.kill();
        let _ = child.wait();
        let _ = m.call::<api::Release>(&params::Release { id: a.id.clone() });
        return Err(Error::Local { what: "handing the CPUs to the child".into(), source: e });
    }
    drop(dir);
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

/// What the child is given through the FIFO: the variables COMMAND gets. Against a sandbox
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

/// The child side: waits for the environment, then becomes COMMAND.
pub fn child(fifo: &Path, command: &[OsString]) -> Result<(), Error> {
    let mut text = String::new();
    std::fs::File::open(fifo)
        .and_then(|mut f| f.read_to_string(&mut text))
        .map_err(local(format!("reading `{}`", fifo.display())))?;
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
