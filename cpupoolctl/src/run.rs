//! `cpupoolctl run --pool P --cpus N -- COMMAND...`: what CMK's `isolate` and CPU-Pooler's
//! process-starter did, with the daemon owning the decision, in the shape of `systemd-run
//! --scope`.
//!
//! cpupoolctl asks the daemon to `Run` its own pid: where systemd runs, the daemon moves it into
//! a scope in the pool's slice with AllowedCPUs; elsewhere it sets the affinity of its threads.
//! Only once that is applied and read back does the answer come, and cpupoolctl then becomes
//! COMMAND in place (`execvp`) with `CPUPOOL_CPUS`, `CPUPOOL_POOL`, `EXCLUSIVE_CPUS` or
//! `SHARED_CPUS`, and `CPUPOOL_ASSIGNMENT` in its environment. Same pid, so the scope and the
//! affinity hold from COMMAND's first instruction, signals reach COMMAND itself, and the exit
//! status is COMMAND's own. A refused `Run` starts nothing (exit 1, the daemon's reason).
//!
//! The daemon releases the assignment when the process ends (it watches a pidfd, or systemd's
//! word on the scope, which outlives COMMAND while COMMAND's children run in it). That release
//! can come a moment after the shell sees COMMAND exit; a booking in that moment (`run a; run b`
//! on a pool with room for one) is not refused: before the daemon refuses a booking for want of
//! capacity it releases the pool's assignments whose process has ended. A COMMAND that cannot
//! be executed is released here, and cpupoolctl exits 127 (not found) or 126, as a shell does.
//! Against a sandbox the CPUs are simulated: COMMAND runs unconfined and gets
//! `CPUPOOL_SIMULATED=1`.

use std::os::unix::process::CommandExt;

use crate::cli::RunArgs;
use cpupool_wire::methods as api;
use cpupool_wire::varlink::params;

use crate::client::Client;
use crate::client::{Amount, RunRequest};
use crate::error::Error;

/// Books CPUs for this process and becomes COMMAND on them: returns only when it could not.
/// Against a sandbox (`sandbox`), the CPUs are the simulated host's: the daemon records them
/// in its own directory and never touches this process, so COMMAND runs unconfined, which is
/// said on stderr and in `CPUPOOL_SIMULATED=1`.
pub fn run(m: &mut Client, args: &RunArgs, amount: Amount, sandbox: bool) -> Result<(), Error> {
    // Fails clearly on a pool that does not exist, before anything is booked.
    let pool = m.pool::<api::GetPool>(&params::GetPool { name: args.pool.clone() })?;
    let req = RunRequest { pool: args.pool.clone(), pid: std::process::id(), amount, id: args.id.clone() };
    let a = m.call::<api::Run>(&crate::client::run_params(&req))?.assignment;
    let Some((program, rest)) = args.command.split_first() else {
        // clap requires one; said plainly all the same.
        let source = std::io::Error::new(std::io::ErrorKind::InvalidInput, "no COMMAND given");
        return Err(Error::Local { what: "run".into(), source });
    };
    let mut cmd = std::process::Command::new(program);
    cmd.args(rest);
    for (k, v) in environment(&pool, &a, args, sandbox) {
        cmd.env(k, v);
    }
    // The connection to the daemon is close-on-exec: COMMAND inherits no descriptor of
    // cpupoolctl's own.
    let e = cmd.exec();
    let code = if e.kind() == std::io::ErrorKind::NotFound { 127 } else { 126 };
    eprintln!("cpupoolctl: running `{}`: {e}", program.to_string_lossy());
    // Still alive, so the daemon has not released it: nothing runs on these CPUs.
    if let Err(e) = m.call::<api::Release>(&params::Release { id: a.id.clone() }) {
        eprintln!("cpupoolctl: releasing assignment {}: {}", a.id, e.human());
    }
    std::process::exit(code)
}

/// The variables COMMAND gets. Against a sandbox (`sandbox`) it also gets
/// `CPUPOOL_SIMULATED=1`, and the user is told it runs unconfined.
fn environment(
    pool: &cpupool_wire::views::Pool,
    a: &cpupool_wire::views::Assignment,
    args: &RunArgs,
    sandbox: bool,
) -> Vec<(&'static str, String)> {
    let kind_var = if pool.kind == "exclusive" { "EXCLUSIVE_CPUS" } else { "SHARED_CPUS" };
    let mut env = vec![
        ("CPUPOOL_CPUS", a.cpus.clone()),
        ("CPUPOOL_POOL", a.pool.clone()),
        (kind_var, a.cpus.clone()),
        ("CPUPOOL_ASSIGNMENT", a.id.clone()),
    ];
    if sandbox {
        eprintln!(
            "cpupoolctl: sandbox: CPUs {} belong to the simulated host; `{}` runs on this machine's CPUs, unconfined",
            a.cpus,
            args.command.first().map(|c| c.to_string_lossy()).unwrap_or_default()
        );
        env.push(("CPUPOOL_SIMULATED", "1".to_owned()));
    }
    env
}
