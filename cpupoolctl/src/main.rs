//! `cpupoolctl`: the command-line client of cpupoold.
//!
//! Data flow: clap parses the arguments ([`cli`]; usage errors exit 2 there) → [`commands`]
//! picks a transport from the global options and connects: [`varlink`] (a small synchronous
//! client over the daemon's unix socket, the default) or [`dbus`] (zbus on a current-thread
//! tokio runtime) → calls of the table's methods through [`client::Client::call`], typed by
//! the [`cpupool_wire`] parameter and view types whichever transport answers → [`output`] prints a table or a JSON document. Errors
//! from either transport become one [`error::Error`], printed with what to do and mapped to
//! the exit code (1 daemon error, 3 daemon unreachable).
//!
//! The commands that are more than a call and a print have a module each: [`run`] (`cpupoolctl
//! run`, the child confined through the daemon), [`map`] (`pool map`, the host's CPUs drawn) and
//! [`top`] (a live view); [`manpage`] writes cpupoolctl(1) from the clap definitions.
//!
//! The crate depends only on the wire contract ([`cpupool_wire`]: names, error kinds, views,
//! varlink framing and parameters), not on the daemon's crate.

#![forbid(unsafe_code)]

mod cli;
mod client;
mod commands;
mod dbus;
mod error;
mod manpage;
mod map;
mod output;
mod run;
mod top;
mod varlink;

use std::io::{self, Write};
use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    // Usage errors, --help and --version exit here (2 for usage errors).
    let cli = cli::Cli::parse();
    let stdout = io::stdout();
    let mut out = stdout.lock();
    match commands::run(&cli, &mut out) {
        Ok(()) => ExitCode::SUCCESS,
        // `cpupoolctl monitor | head`: the reader has gone, which is not a failure.
        Err(error::Error::Local { source, .. }) if source.kind() == io::ErrorKind::BrokenPipe => {
            ExitCode::SUCCESS
        }
        Err(e) => {
            let mut line =
                if cli.global.json { e.to_json().to_string() } else { format!("cpupoolctl: {}", e.human()) };
            // A sandbox daemon logs to the terminal it runs in, not to the journal.
            if cli.global.sandbox.is_some() {
                line = error::for_sandbox(&line);
            }
            // If stderr is gone too there is nobody left to tell.
            let _ = writeln!(io::stderr(), "{line}");
            ExitCode::from(e.exit_code())
        }
    }
}
