//! From parsed arguments to output: pick the transport, call the daemon, print the result.
//!
//! `run` connects only for commands that talk to the daemon (`completions` and `manpage` work
//! without one), calls methods of the table through [`Client::call`], fills the request's arguments into a D-Bus
//! error's parameters (so both transports report alike), and writes either the human text or
//! the JSON document to `out`.

use std::io::Write;
use std::path::{Path, PathBuf};

use clap::CommandFactory;
use serde_json::{json, Value};

use crate::cli::{
    AmountArgs, AssignArgs, Cli, ColorChoice, Command, Global, IsolationCommand, PoolCommand, SourceArgs,
    DEFAULT_VARLINK,
};
use cpupool_wire::methods as api;
use cpupool_wire::varlink::params;

use crate::client::{self, Amount, AssignRequest, Client, CpuSource, CreatePoolRequest};
use crate::dbus::{self, Bus};
use crate::error::Error;
use crate::output;
use crate::varlink::{self, Address};

/// The hint when the packaged daemon cannot be reached.
const SYSTEM_HINT: &str = "is cpupoold running? `systemctl status cpupoold`";

/// How to reach the daemon, resolved from the global options.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// varlink at this address.
    Varlink(Address),
    /// D-Bus on this bus.
    Dbus(Bus),
}

/// Escapes a path for a D-Bus address value (`unix:path=...`): bytes outside the set the spec
/// allows unescaped become `%XX`.
pub fn dbus_escape(path: &Path) -> String {
    use std::os::unix::ffi::OsStrExt;
    path.as_os_str()
        .as_bytes()
        .iter()
        .map(|&b| match b {
            b'-' | b'0'..=b'9' | b'A'..=b'Z' | b'a'..=b'z' | b'_' | b'/' | b'.' | b'\\' | b'*' => {
                char::from(b).to_string()
            }
            _ => format!("%{b:02x}"),
        })
        .collect()
}

/// The transport and address the options ask for, and what to tell the user if nothing
/// answers there.
pub fn target(g: &Global) -> (Target, String) {
    let sandbox = g.sandbox.as_ref().map(|d| std::path::absolute(d).unwrap_or_else(|_| d.clone()));
    let hint = match &sandbox {
        Some(d) => format!("is `cpupoold --sandbox {}` running?", d.display()),
        None => SYSTEM_HINT.to_owned(),
    };
    let target = if let Some(bus) = &g.bus {
        Target::Dbus(bus.clone())
    } else if g.dbus {
        Target::Dbus(match &sandbox {
            Some(d) => Bus::Address(format!("unix:path={}", dbus_escape(&d.join("run/bus.sock")))),
            None => Bus::System,
        })
    } else {
        Target::Varlink(match (&g.varlink_address, &sandbox) {
            (Some(a), _) => a.clone(),
            (None, Some(d)) => Address::Path(d.join("run/org.cpupool.Manager")),
            (None, None) => Address::Path(PathBuf::from(DEFAULT_VARLINK.trim_start_matches("unix:"))),
        })
    };
    (target, hint)
}

fn connect(g: &Global) -> Result<Client, Error> {
    let (target, hint) = target(g);
    Ok(match target {
        Target::Varlink(a) => Client::Varlink(varlink::Client::connect(&a, g.timeout.0, &hint)?),
        Target::Dbus(b) => Client::Dbus(dbus::Client::connect(&b, g.timeout.0, &hint)?),
    })
}

fn source(s: &SourceArgs) -> CpuSource {
    match (&s.cpus, s.count) {
        (Some(list), _) => CpuSource::List(list.clone()),
        // clap makes one of --cpus and --count present.
        (None, count) => CpuSource::Count { count: count.unwrap_or_default(), numa: s.numa },
    }
}

/// The request arguments a D-Bus error's parameters may be filled from.
fn source_request(s: &CpuSource) -> Vec<(&'static str, Value)> {
    match s {
        CpuSource::List(l) => vec![("cpus", json!(l))],
        CpuSource::Count { count, numa } => vec![("count", json!(count)), ("numa", json!(numa))],
    }
}

/// Where results go: human text or a JSON document.
struct Printer<'a> {
    out: &'a mut dyn Write,
    json: bool,
}

impl Printer<'_> {
    fn print(&mut self, human: impl FnOnce() -> String, doc: impl FnOnce() -> Value) -> Result<(), Error> {
        let text = if self.json { format!("{}\n", doc()) } else { human() };
        self.write(&text)
    }

    fn write(&mut self, text: &str) -> Result<(), Error> {
        self.out
            .write_all(text.as_bytes())
            .and_then(|()| self.out.flush())
            .map_err(|source| Error::Local { what: "writing to stdout".into(), source })
    }
}

/// Whether `pool map` colours (`--color`, NO_COLOR, a terminal on stdout) and how wide it
/// draws (the terminal's width, 80 columns when stdout is not a terminal).
fn map_style(choice: ColorChoice) -> crate::map::Style {
    use std::io::IsTerminal;
    let tty = std::io::stdout().is_terminal();
    // https://no-color.org: set and not empty turns colour off; --color=always overrides it.
    let no_color = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
    let colour = match choice {
        ColorChoice::Always => true,
        ColorChoice::Never => false,
        ColorChoice::Auto => tty && !no_color,
    };
    let width =
        if tty { ratatui::crossterm::terminal::size().map_or(80, |(w, _)| usize::from(w)) } else { 80 };
    crate::map::Style { colour, width: width.max(20) }
}

/// Runs the command line, writing results to `out`.
pub fn run(cli: &Cli, out: &mut dyn Write) -> Result<(), Error> {
    let mut p = Printer { out, json: cli.global.json };
    match &cli.command {
        Command::Completions { .. } | Command::Manpage { .. } => without_daemon(&cli.command, &mut p),
        _ => with_daemon(cli, &mut p),
    }
}

/// The commands that call the daemon: connect, call, print.
fn with_daemon(cli: &Cli, p: &mut Printer<'_>) -> Result<(), Error> {
    let mut m = connect(&cli.global)?;
    match &cli.command {
        Command::Pool(c) => pool(&mut m, c, p),
        Command::Run(r) => crate::run::run(&mut m, r, amount(&r.amount), cli.global.sandbox.is_some()),
        Command::Assignments { pool } => {
            let list =
                m.assignments(pool.as_deref()).map_err(|e| e.with_request(&[("pool", json!(pool))]))?;
            p.print(|| output::assignments(&list, pool.as_deref()), || output::assignments_json(&list))
        }
        Command::Topology => {
            let t = m.call::<api::GetTopology>(&params::NoParameters {})?;
            p.print(|| output::topology(&t), || json!(t))
        }
        Command::Isolation(IsolationCommand::BootLine) => {
            let iso = m.isolation("")?;
            // On the side, for people; the JSON document carries the same.
            if !cli.global.json {
                for (what, text) in output::boot_problems(&iso) {
                    eprintln!("cpupoolctl: {what}: {text}");
                }
            }
            p.print(|| output::boot_line(&iso), || output::boot_line_json(&iso))
        }
        Command::Status => {
            let s = m.call::<api::Status>(&params::NoParameters {})?;
            let iso = m.isolation("").unwrap_or_default();
            let classes = classes(&mut m, "").unwrap_or_default();
            p.print(|| output::status(&s, &classes, &iso), || output::status_json(&s, &classes))
        }
        Command::Top(t) => {
            if cli.global.json {
                return Err(Error::Local {
                    what: "cpupoolctl top".into(),
                    source: std::io::Error::other(
                        "--json is not for a live view; use `pool list`, `assignments` or `pool map` with --json",
                    ),
                });
            }
            let global = cli.global.clone();
            crate::top::run(m, &move || connect(&global), t.interval)
        }
        Command::Reload => {
            let r = m.call::<api::Reload>(&params::NoParameters {})?;
            p.print(|| output::reloaded(&r), || json!({ "changed": r.changed, "summary": r.summary }))
        }
        Command::Monitor => {
            let json = cli.global.json;
            m.monitor(&mut |e| p.write(&if json { format!("{}\n", json!(e)) } else { output::event(&e) }))
        }
        // `run` answers these without a daemon.
        Command::Completions { .. } | Command::Manpage { .. } => Ok(()),
    }
}

/// The commands that need no daemon: `completions` and `manpage`.
fn without_daemon(command: &Command, p: &mut Printer<'_>) -> Result<(), Error> {
    match command {
        Command::Completions { shell } => {
            let mut buf = Vec::new();
            clap_complete::generate(*shell, &mut Cli::command(), "cpupoolctl", &mut buf);
            p.write(&String::from_utf8_lossy(&buf))
        }
        Command::Manpage { dir: None } => {
            let mut buf = Vec::new();
            crate::manpage::render(Cli::command(), true, &mut buf)
                .map_err(|source| Error::Local { what: "rendering the man page".into(), source })?;
            p.write(&String::from_utf8_lossy(&buf))
        }
        Command::Manpage { dir: Some(dir) } => {
            let written = crate::manpage::write_all(Cli::command(), dir)?;
            p.print(
                || written.iter().map(|f| format!("{}\n", f.display())).collect(),
                || json!({ "written": written }),
            )
        }
        // `run` sends only the commands above here.
        _ => Ok(()),
    }
}

/// `GetClasses` of `pool`, or of every pool (`""`).
fn classes(m: &mut Client, pool: &str) -> Result<Vec<cpupool_wire::views::ClassSetting>, Error> {
    Ok(m.call::<api::GetClasses>(&params::GetClasses { pool: Some(pool.to_owned()) })?.classes)
}

/// The `pool` commands.
fn pool(m: &mut Client, command: &PoolCommand, p: &mut Printer<'_>) -> Result<(), Error> {
    match command {
        PoolCommand::List => {
            let pools = m.call::<api::ListPools>(&params::NoParameters {})?.pools;
            p.print(|| output::pools(&pools), || output::pools_json(&pools))
        }
        PoolCommand::Show { name } => {
            let pool = m
                .pool::<api::GetPool>(&params::GetPool { name: name.clone() })
                .map_err(|e| e.with_request(&[("pool", json!(name))]))?;
            let list = m.assignments(Some(name)).unwrap_or_default();
            // A daemon without GetIsolation (older) shows the pool without it.
            let iso = if pool.isolated { m.isolation(name).unwrap_or_default() } else { Default::default() };
            // Nor one without GetClasses.
            let classes = classes(m, name).unwrap_or_default();
            p.print(
                || output::pool_show(&pool, &list, &iso, &classes),
                || output::pool_show_json(&pool, &classes, &iso),
            )
        }
        PoolCommand::Assign(a) => assign(m, a, p),
        PoolCommand::Release { id } => {
            let gone = m
                .call::<api::Release>(&params::Release { id: id.clone() })
                .map(|r| r.assignment)
                .map_err(|e| e.with_request(&[("id", json!(id))]))?;
            p.print(|| output::released(&gone), || output::assignment_json(&gone))
        }
        PoolCommand::Create(c) => {
            let req = CreatePoolRequest {
                name: c.name.clone(),
                kind: c.kind.as_str().to_owned(),
                source: source(&c.source),
                smt: c.smt.map(|s| s.as_str().to_owned()),
                isolate: c.isolate.then_some(true),
                kubelet: c.no_kubelet.then_some(false),
                dra: c.dra.then_some(true),
            };
            let mut request = vec![("pool", json!(req.name))];
            request.extend(source_request(&req.source));
            let pool = m
                .pool::<api::CreatePool>(&client::create_params(&req))
                .map_err(|e| e.with_request(&request))?;
            p.print(|| output::pool(&pool), || output::pool_json(&pool))
        }
        PoolCommand::Resize(r) => {
            let src = source(&r.source);
            let mut request = vec![("pool", json!(r.name))];
            request.extend(source_request(&src));
            let pool = m
                .pool::<api::ResizePool>(&client::resize_params(&r.name, &src))
                .map_err(|e| e.with_request(&request))?;
            p.print(|| output::pool(&pool), || output::pool_json(&pool))
        }
        PoolCommand::Delete { name } => {
            m.call::<api::DeletePool>(&params::DeletePool { name: name.clone() })
                .map_err(|e| e.with_request(&[("pool", json!(name))]))?;
            p.print(|| output::deleted(name), || json!({}))
        }
        PoolCommand::Map(a) => {
            let topo = m.call::<api::GetTopology>(&params::NoParameters {})?;
            let pools = m.call::<api::ListPools>(&params::NoParameters {})?.pools;
            let list = m.assignments(None)?;
            let map = crate::map::HostMap::build(&topo, &pools, &list)?;
            let style = map_style(a.color);
            p.print(|| crate::map::render(&map, style), || json!(map))
        }
    }
}

/// `pool assign`: the request's arguments fill a D-Bus error's parameters.
fn assign(m: &mut Client, a: &AssignArgs, p: &mut Printer<'_>) -> Result<(), Error> {
    let amount = amount(&a.amount);
    let req = AssignRequest {
        pool: a.pool.clone(),
        target: a.target.target(),
        amount,
        id: a.id.clone(),
        reclaim: !a.no_reclaim,
    };
    let (requested, unit) = match amount {
        Amount::Cpus(n) => (json!(n), "cpus"),
        Amount::Millicpus(m) => (json!(m), "millicpus"),
    };
    let made = m.call::<api::Assign>(&client::assign_params(&req)).map(|r| r.assignment).map_err(|e| {
        e.with_request(&[
            ("pool", json!(req.pool)),
            ("target", json!(req.target)),
            ("id", json!(req.id)),
            ("requested", requested),
            ("unit", json!(unit)),
        ])
    })?;
    p.print(|| output::assignment(&made), || output::assignment_json(&made))
}

/// The amount asked for: CPUs or millicpus (clap makes exactly one of them present).
fn amount(a: &AmountArgs) -> Amount {
    match (a.cpus, a.millicpus) {
        (Some(n), _) => Amount::Cpus(n),
        (None, m) => Amount::Millicpus(m.unwrap_or_default()),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use clap::Parser;

    fn target_of(args: &[&str]) -> (Target, String) {
        let cli =
            Cli::try_parse_from(std::iter::once("cpupoolctl").chain(args.iter().copied()).chain(["status"]))
                .unwrap();
        target(&cli.global)
    }

    #[test]
    fn transports_and_addresses() {
        let (t, hint) = target_of(&[]);
        assert_eq!(t, Target::Varlink(Address::Path("/run/cpupoold/org.cpupool.Manager".into())));
        assert_eq!(hint, SYSTEM_HINT);
        assert_eq!(
            target_of(&["--varlink-address", "unix:/x"]).0,
            Target::Varlink(Address::Path("/x".into()))
        );
        assert_eq!(target_of(&["--dbus"]).0, Target::Dbus(Bus::System));
        assert_eq!(target_of(&["--bus", "session"]).0, Target::Dbus(Bus::Session));
        assert_eq!(
            target_of(&["--dbus", "--bus", "unix:path=/b"]).0,
            Target::Dbus(Bus::Address("unix:path=/b".into()))
        );
        let (t, hint) = target_of(&["--sandbox", "/tmp/sb"]);
        assert_eq!(t, Target::Varlink(Address::Path("/tmp/sb/run/org.cpupool.Manager".into())));
        assert_eq!(hint, "is `cpupoold --sandbox /tmp/sb` running?");
        assert_eq!(
            target_of(&["--sandbox", "/tmp/s b", "--dbus"]).0,
            Target::Dbus(Bus::Address("unix:path=/tmp/s%20b/run/bus.sock".into()))
        );
        // A relative sandbox is made absolute: the address must not depend on the daemon's cwd.
        let (t, _) = target_of(&["--sandbox", "sb"]);
        let Target::Varlink(Address::Path(p)) = t else { panic!("{t:?}") };
        assert!(p.is_absolute() && p.ends_with("sb/run/org.cpupool.Manager"), "{}", p.display());
    }

    #[test]
    fn completions_and_manpage_need_no_daemon() {
        for args in [&["completions", "bash"][..], &["completions", "zsh"], &["manpage"]] {
            let cli = Cli::try_parse_from(std::iter::once("cpupoolctl").chain(args.iter().copied())).unwrap();
            let mut out = Vec::new();
            run(&cli, &mut out).unwrap();
            let text = String::from_utf8(out).unwrap();
            assert!(text.contains("cpupoolctl") && text.len() > 500, "{args:?}: {text}");
        }
    }

    #[test]
    fn an_unreachable_daemon_exits_3_and_says_where() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("none");
        let cli =
            Cli::try_parse_from(["cpupoolctl", "--varlink-address", sock.to_str().unwrap(), "pool", "list"])
                .unwrap();
        let e = run(&cli, &mut Vec::new()).unwrap_err();
        assert_eq!(e.exit_code(), 3);
        let msg = e.to_string();
        assert!(
            msg.contains(&format!("unix:{}", sock.display())) && msg.contains("systemctl status cpupoold"),
            "{msg}"
        );
    }
}
