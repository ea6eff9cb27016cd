//! The command line, as clap definitions. The help, the shell completions and the man pages are
//! all generated from these, so they cannot drift apart.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::dbus::Bus;
use crate::varlink::Address;

/// The daemon's varlink socket when none is given.
pub const DEFAULT_VARLINK: &str = "unix:/run/cpupoold/org.cpupool.Manager";

/// The exit codes, shown by `--help` (and in the man page's EXIT STATUS section).
pub const EXIT_CODES: &str = "\
Exit status:
  0  success
  1  the daemon answered with an error (its name is printed, e.g. NoSuchPool, with what to do),
     or another failure after the arguments were parsed
  2  usage error: the command line is wrong
  3  the daemon could not be reached: no socket, nothing listening, not on the bus,
     or no reply within --timeout

With --json, results are one JSON document on stdout (for monitor: one JSON object per line),
and errors one JSON object on stderr: {\"error\": NAME, \"parameters\": {..}, \"message\": ..}.";

/// The examples of `--help` and of the man page's EXAMPLES, in an order that works as a
/// sequence on a fresh `cpupoold --sandbox` (tests/readme.rs runs them there). A comment
/// saying `needs systemd` marks a unit target, which the sandbox (no systemd) refuses;
/// `fails: ERROR` marks an example of a refusal.
pub const EXAMPLES: &str = "\
Examples:
  cpupoolctl pool list
  cpupoolctl pool assign dp --cgroup cpupool.slice/cpupool-dp.slice/app --cpus 2 --id app-1
  cpupoolctl pool assign web --unit nginx.service --millicpus 1500   # needs systemd
  cpupoolctl pool release app-1
  cpupoolctl pool resize web --count 8
  cpupoolctl pool create batch --kind exclusive --count 4 --numa 0
  cpupoolctl --json assignments --pool dp
  cpupoolctl --dbus monitor
  cpupoolctl --sandbox /tmp/cpupool-demo status";

/// Talk to cpupoold: list pools, assign and release CPUs, manage pools, watch changes.
#[derive(Parser, Debug)]
#[command(
    name = "cpupoolctl",
    version,
    about,
    long_about = "Talk to cpupoold, the CPU pool daemon: list pools and assignments, assign CPUs from a pool \
to a systemd unit, a cgroup or a process, release them, create, resize and delete pools, and watch \
changes as they happen.\n\nIt speaks varlink to the daemon's socket by default, or D-Bus with --dbus. \
Output is aligned tables for people, or --json for scripts.",
    after_long_help = format!("{EXIT_CODES}\n\n{EXAMPLES}"),
    after_help = "Exit status: 0 ok, 1 error from the daemon, 2 usage error, 3 daemon unreachable (--help says more).",
)]
pub struct Cli {
    #[command(flatten)]
    /// Options for every command.
    pub global: Global,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Options for every command: where the daemon is and how to print. They have a heading of
/// their own so a subcommand's help shows its own options first.
#[derive(Args, Debug, Clone)]
#[command(next_help_heading = "Global options")]
pub struct Global {
    /// The daemon's varlink socket: unix:PATH, unix:@ABSTRACT or a path
    /// [default: unix:/run/cpupoold/org.cpupool.Manager].
    #[arg(long, global = true, value_name = "ADDR", conflicts_with_all = ["dbus", "bus", "sandbox"])]
    pub varlink_address: Option<Address>,

    /// Use D-Bus (org.cpupool.Manager1 on the system bus, unless --bus or --sandbox says otherwise).
    #[arg(long, global = true)]
    pub dbus: bool,

    /// The bus for D-Bus: system, session or a D-Bus address (unix:path=...); implies --dbus.
    #[arg(long, global = true, value_name = "BUS", conflicts_with = "sandbox")]
    pub bus: Option<Bus>,

    /// Talk to the daemon of `cpupoold --sandbox DIR`: varlink at DIR/run/org.cpupool.Manager,
    /// with --dbus the bus at DIR/run/bus.sock.
    #[arg(long, global = true, value_name = "DIR")]
    pub sandbox: Option<PathBuf>,

    /// Print machine-readable JSON: one document on stdout (monitor: one object per line);
    /// errors as a JSON object on stderr.
    #[arg(long, global = true)]
    pub json: bool,

    /// Give up on a daemon that does not answer within SECONDS (0: wait forever).
    #[arg(long, global = true, value_name = "SECONDS", default_value = "30", value_parser = parse_timeout)]
    pub timeout: Timeout,
}

/// The per-call timeout; `None` waits forever.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeout(pub Option<Duration>);

fn parse_timeout(s: &str) -> Result<Timeout, String> {
    let secs: f64 = s.parse().map_err(|_| format!("`{s}` is not a number of seconds"))?;
    if !secs.is_finite() || secs < 0.0 {
        return Err(format!("`{s}`: expected zero or a positive number of seconds"));
    }
    Ok(Timeout(Some(Duration::from_secs_f64(secs)).filter(|d| !d.is_zero())))
}

/// The commands.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Pools: list, show, assign from them, release, create, resize, delete.
    #[command(subcommand)]
    Pool(PoolCommand),
    /// List assignments, of every pool or of one.
    Assignments {
        /// Only this pool's.
        #[arg(long, value_name = "POOL")]
        pool: Option<String>,
    },
    /// Run a command on CPUs of a pool, as `systemd-run --scope` does: this process is assigned
    /// the CPUs (put in a scope in the pool's slice, or without systemd given their affinity),
    /// then becomes COMMAND, with CPUPOOL_CPUS and CPUPOOL_POOL in its environment; the daemon
    /// releases the CPUs when it exits. The exit status is COMMAND's (127: not found).
    Run(RunArgs),
    /// Show the host's CPUs: online, offline, isolated, and where each sits.
    Topology,
    /// Show the daemon's version, uptime, counts and state file, and whether the configuration
    /// on disk is the one running.
    Status,
    /// Have the daemon read its configuration files again and apply them, and wait until it
    /// has: `systemctl reload cpupoold` runs this. A configuration that does not load or would
    /// take CPUs from live assignments is rejected whole: the running one stays, and this
    /// exits 1 printing why.
    Reload,
    /// A live view of the pools and CPUs, refreshed every --interval: per pool its kind, CPUs,
    /// assigned capacity and isolation; per CPU its pool and holder; per isolated CPU the
    /// interrupt rates and foreign CPU time the daemon measured. Quit with q, Esc or Ctrl-C.
    Top(TopArgs),
    /// Print pool and assignment changes as they happen, until interrupted. The current pools
    /// come first (change "current"), so you know the subscription is live.
    Monitor,
    /// The kernel's boot isolation against the isolated pools.
    #[command(subcommand)]
    Isolation(IsolationCommand),
    /// Print a shell completion script, e.g. `cpupoolctl completions bash > /etc/bash_completion.d/cpupoolctl`.
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
    /// Print the cpupoolctl(1) man page (roff), e.g. `cpupoolctl manpage | man -l -`.
    Manpage {
        /// Write cpupoolctl.1 and one page per subcommand (cpupoolctl-pool-assign.1, ...) into DIR,
        /// for packaging.
        #[arg(long, value_name = "DIR", hide = true)]
        dir: Option<PathBuf>,
    },
}

/// `cpupoolctl isolation ...`.
#[derive(Subcommand, Debug)]
pub enum IsolationCommand {
    /// Print the kernel command line that covers every isolated pool's CPUs
    /// (`nohz_full=L rcu_nocbs=L isolcpus=managed_irq,L`: what only a reboot stops, the tick,
    /// RCU callbacks and managed interrupts); on stderr, the isolated pools the running kernel's
    /// boot isolation does not cover and the CPUs it isolates that no isolated pool uses.
    /// Prints nothing without isolated pools.
    BootLine,
}

/// `cpupoolctl pool ...`.
#[derive(Subcommand, Debug)]
pub enum PoolCommand {
    /// List the pools: kind, CPUs, free CPUs and capacity, assignments.
    List,
    /// Show one pool.
    Show {
        /// The pool.
        name: String,
    },
    /// Assign CPUs from a pool to a systemd unit, a cgroup or a process. Exclusive pools give
    /// whole CPUs (--cpus), shared pools millicpus (--millicpus). Repeating the same call with
    /// the same --id is a no-op that prints the same assignment.
    Assign(AssignArgs),
    /// Release an assignment; prints what it held.
    Release {
        /// The assignment's id.
        id: String,
    },
    /// Add a pool at run time (kept across restarts in the daemon's runtime drop-in).
    Create(CreateArgs),
    /// Give a pool a new CPU source. Refused if live assignments would lose CPUs.
    Resize(ResizeArgs),
    /// Remove a pool without assignments; its CPUs join the reserved pool.
    Delete {
        /// The pool.
        name: String,
    },
    /// Draw the host: packages, NUMA nodes, L3 groups and cores with their threads, each CPU
    /// as its pool's letter (and colour) and number, isolated CPUs in brackets, CPUs held by
    /// an exclusive assignment marked `*` and listed with their holder, offline CPUs as `x`.
    /// With --json, the same data nested package → node → L3 group → core → threads.
    Map(MapArgs),
}

/// `pool map`.
#[derive(Args, Debug)]
pub struct MapArgs {
    /// Colour the picture: auto (when stdout is a terminal and NO_COLOR is unset or empty),
    /// always or never.
    #[arg(long, value_name = "WHEN", default_value = "auto")]
    pub color: ColorChoice,
}

/// When to colour.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum ColorChoice {
    /// When stdout is a terminal and NO_COLOR is unset or empty.
    Auto,
    /// Always, even with NO_COLOR set.
    Always,
    /// Never.
    Never,
}

/// `top`.
#[derive(Args, Debug)]
pub struct TopArgs {
    /// Refresh every SECONDS (at least 0.1).
    #[arg(long, value_name = "SECONDS", default_value = "1", value_parser = parse_interval)]
    pub interval: Duration,
}

fn parse_interval(s: &str) -> Result<Duration, String> {
    let secs: f64 = s.parse().map_err(|_| format!("`{s}` is not a number of seconds"))?;
    // Faster than this only loads the daemon; slower than a day is not "live".
    if !secs.is_finite() || !(0.1..=86400.0).contains(&secs) {
        return Err(format!("`{s}`: expected seconds between 0.1 and 86400"));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// `pool assign`.
#[derive(Args, Debug)]
pub struct AssignArgs {
    /// The pool to assign from.
    pub pool: String,
    /// Who gets the CPUs.
    #[command(flatten)]
    pub target: TargetArgs,
    /// How much.
    #[command(flatten)]
    pub amount: AmountArgs,
    /// The assignment's id (the daemon chooses one if absent); makes the call idempotent.
    #[arg(long, value_name = "ID")]
    pub id: Option<String>,
    /// Keep the assignment when the target goes away (unit stopped, process exited, cgroup
    /// removed); by default it is released within a second.
    #[arg(long)]
    pub no_reclaim: bool,
}

/// `run`.
#[derive(Args, Debug)]
pub struct RunArgs {
    /// The pool to take CPUs from.
    #[arg(long, value_name = "POOL")]
    pub pool: String,
    /// How much.
    #[command(flatten)]
    pub amount: AmountArgs,
    /// The assignment's id (the daemon chooses one if absent).
    #[arg(long, value_name = "ID")]
    pub id: Option<String>,
    /// The command and its arguments.
    #[arg(required = true, last = true, value_name = "COMMAND")]
    pub command: Vec<std::ffi::OsString>,
}

/// Exactly one target.
#[derive(Args, Debug)]
#[group(required = true, multiple = false)]
pub struct TargetArgs {
    /// A systemd unit, e.g. nginx.service.
    #[arg(long, value_name = "UNIT")]
    pub unit: Option<String>,
    /// A cgroup, as a path relative to the cgroup root, e.g. cpupool.slice/cpupool-dp.slice/app (the
    /// kernel gives a cgroup only CPUs its parent has: inside the pool's slice).
    #[arg(long, value_name = "PATH")]
    pub cgroup: Option<String>,
    /// A process (every thread of it).
    #[arg(long, value_name = "PID", value_parser = clap::value_parser!(u32).range(1..))]
    pub pid: Option<u32>,
}

impl TargetArgs {
    /// The wire form: `unit:NAME`, `cgroup:PATH` or `pid:N`.
    pub fn target(&self) -> String {
        match (&self.unit, &self.cgroup, self.pid) {
            (Some(u), _, _) => format!("unit:{u}"),
            (_, Some(c), _) => format!("cgroup:{c}"),
            (_, _, Some(p)) => format!("pid:{p}"),
            // clap's group makes exactly one present.
            (None, None, None) => String::new(),
        }
    }
}

/// Exactly one size.
#[derive(Args, Debug)]
#[group(required = true, multiple = false)]
pub struct AmountArgs {
    /// Whole CPUs (exclusive pools).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub cpus: Option<u32>,
    /// Millicpus, 1000 per CPU (shared pools).
    #[arg(long, value_name = "M", value_parser = clap::value_parser!(u64).range(1..))]
    pub millicpus: Option<u64>,
}

/// Where a pool's CPUs come from: exactly one of --cpus and --count.
#[derive(Args, Debug)]
#[group(skip)]
pub struct SourceArgs {
    /// An explicit CPU list, e.g. 8-15.
    #[arg(long, value_name = "LIST", conflicts_with = "count", required_unless_present = "count")]
    pub cpus: Option<String>,
    /// A number of CPUs, placed by the daemon (whole cores, fewest NUMA nodes).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub count: Option<u32>,
    /// With --count: take all of them from this NUMA node.
    // `requires` alone is not enough: clap waives it when a conflicting argument (--cpus) is
    // present, so the conflict is spelled out.
    #[arg(long, value_name = "NODE", requires = "count", conflicts_with = "cpus")]
    pub numa: Option<u32>,
}

/// A pool's kind.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Housekeeping CPUs (exactly one such pool exists).
    Reserved,
    /// Each assignment owns whole CPUs.
    Exclusive,
    /// Assignments share the pool's CPUs, counted in millicpus.
    Shared,
}

/// How an exclusive pool hands out SMT siblings.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Smt {
    /// Whole cores only.
    FullCores,
    /// Single hardware threads.
    Threads,
}

/// `pool create`.
#[derive(Args, Debug)]
pub struct CreateArgs {
    /// The new pool's name: [a-z0-9_], at most 32 characters.
    pub name: String,
    /// The pool's kind.
    #[arg(long, value_name = "KIND")]
    pub kind: Kind,
    /// Its CPUs.
    #[command(flatten)]
    pub source: SourceArgs,
    /// Exclusive pools: hand out whole cores (full-cores, the default) or threads.
    #[arg(long, value_name = "SMT")]
    pub smt: Option<Smt>,
    /// Run the pool as an isolated cpuset partition (exclusive pools only).
    #[arg(long)]
    pub isolate: bool,
    /// Do not offer the pool to the kubelet.
    #[arg(long)]
    pub no_kubelet: bool,
    /// Serve the pool by DRA instead of the device plugin (not with --no-kubelet, not a
    /// reserved pool).
    #[arg(long, conflicts_with = "no_kubelet")]
    pub dra: bool,
}

/// `pool resize`.
#[derive(Args, Debug)]
pub struct ResizeArgs {
    /// The pool.
    pub name: String,
    /// Its new CPUs.
    #[command(flatten)]
    pub source: SourceArgs,
}

impl Kind {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Reserved => "reserved",
            Kind::Exclusive => "exclusive",
            Kind::Shared => "shared",
        }
    }
}

impl Smt {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Smt::FullCores => "full-cores",
            Smt::Threads => "threads",
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("cpupoolctl").chain(args.iter().copied()))
    }

    fn usage_error(args: &[&str]) -> clap::error::ErrorKind {
        let e = parse(args).err().unwrap_or_else(|| panic!("{args:?} parsed"));
        // clap exits with 2 for every usage error.
        assert_eq!(e.exit_code(), 2, "{args:?}: {e}");
        e.kind()
    }

    #[test]
    fn the_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn assign_needs_one_target_and_one_size() {
        let cli =
            parse(&["pool", "assign", "dp", "--cgroup", "work/app", "--cpus", "2", "--id", "a"]).unwrap();
        let Command::Pool(PoolCommand::Assign(a)) = cli.command else { panic!("{:?}", cli.command) };
        assert_eq!(
            (a.pool.as_str(), a.target.target(), a.amount.cpus, a.id.as_deref()),
            ("dp", "cgroup:work/app".into(), Some(2), Some("a"))
        );
        let cli = parse(&["pool", "assign", "web", "--unit", "x.service", "--millicpus", "250"]).unwrap();
        let Command::Pool(PoolCommand::Assign(a)) = cli.command else { panic!() };
        assert_eq!((a.target.target(), a.amount.millicpus), ("unit:x.service".into(), Some(250)));
        let cli = parse(&["pool", "assign", "web", "--pid", "42", "--millicpus", "250"]).unwrap();
        let Command::Pool(PoolCommand::Assign(a)) = cli.command else { panic!() };
        assert_eq!(a.target.target(), "pid:42");

        use clap::error::ErrorKind as K;
        assert_eq!(usage_error(&["pool", "assign", "dp", "--cpus", "2"]), K::MissingRequiredArgument);
        assert_eq!(usage_error(&["pool", "assign", "dp", "--unit", "u"]), K::MissingRequiredArgument);
        assert_eq!(
            usage_error(&["pool", "assign", "dp", "--unit", "u", "--pid", "1", "--cpus", "1"]),
            K::ArgumentConflict
        );
        assert_eq!(
            usage_error(&["pool", "assign", "dp", "--unit", "u", "--cpus", "1", "--millicpus", "5"]),
            K::ArgumentConflict
        );
        assert_eq!(usage_error(&["pool", "assign", "dp", "--unit", "u", "--cpus", "0"]), K::ValueValidation);
        assert_eq!(usage_error(&["pool", "assign", "dp", "--pid", "x", "--cpus", "1"]), K::ValueValidation);
    }

    #[test]
    fn create_and_resize_need_one_source() {
        let cli = parse(&[
            "pool",
            "create",
            "batch",
            "--kind",
            "exclusive",
            "--count",
            "4",
            "--numa",
            "1",
            "--smt",
            "threads",
            "--isolate",
            "--no-kubelet",
        ])
        .unwrap();
        let Command::Pool(PoolCommand::Create(c)) = cli.command else { panic!() };
        assert_eq!(
            (c.kind, c.source.count, c.source.numa, c.smt, c.isolate, c.no_kubelet),
            (Kind::Exclusive, Some(4), Some(1), Some(Smt::Threads), true, true)
        );
        let cli = parse(&["pool", "create", "b", "--kind", "shared", "--count", "1", "--dra"]).unwrap();
        let Command::Pool(PoolCommand::Create(c)) = cli.command else { panic!() };
        assert!(c.dra && !c.no_kubelet);
        assert!(parse(&["pool", "create", "b", "--kind", "shared", "--count", "1", "--dra", "--no-kubelet"])
            .is_err());
        let cli = parse(&["pool", "resize", "batch", "--cpus", "4-7"]).unwrap();
        let Command::Pool(PoolCommand::Resize(r)) = cli.command else { panic!() };
        assert_eq!(r.source.cpus.as_deref(), Some("4-7"));

        use clap::error::ErrorKind as K;
        assert_eq!(usage_error(&["pool", "create", "b", "--kind", "shared"]), K::MissingRequiredArgument);
        assert_eq!(usage_error(&["pool", "create", "b", "--cpus", "1"]), K::MissingRequiredArgument);
        assert_eq!(usage_error(&["pool", "create", "b", "--kind", "odd", "--cpus", "1"]), K::InvalidValue);
        assert_eq!(
            usage_error(&["pool", "create", "b", "--kind", "shared", "--cpus", "1", "--count", "2"]),
            K::ArgumentConflict
        );
        assert_eq!(usage_error(&["pool", "resize", "b", "--cpus", "1", "--numa", "0"]), K::ArgumentConflict);
        assert_eq!(usage_error(&["pool", "resize", "b", "--numa", "0"]), K::MissingRequiredArgument);
        assert_eq!(usage_error(&["pool", "resize", "b"]), K::MissingRequiredArgument);
        assert_eq!(
            usage_error(&["pool", "create", "b", "--kind", "shared", "--count", "2", "--smt", "cores"]),
            K::InvalidValue
        );
    }

    #[test]
    fn global_options_go_anywhere() {
        let cli = parse(&["pool", "list", "--json", "--sandbox", "/tmp/sb"]).unwrap();
        assert!(cli.global.json);
        assert_eq!(cli.global.sandbox.as_deref(), Some(std::path::Path::new("/tmp/sb")));
        let cli = parse(&["--varlink-address", "/run/x", "status"]).unwrap();
        assert_eq!(cli.global.varlink_address, Some(Address::Path("/run/x".into())));
        assert_eq!(cli.global.timeout, Timeout(Some(Duration::from_secs(30))));
        let cli = parse(&["--bus", "session", "--timeout", "0", "topology"]).unwrap();
        assert_eq!((cli.global.bus, cli.global.timeout), (Some(Bus::Session), Timeout(None)));
        let cli = parse(&["--timeout", "0.5", "status"]).unwrap();
        assert_eq!(cli.global.timeout, Timeout(Some(Duration::from_millis(500))));

        use clap::error::ErrorKind as K;
        assert_eq!(usage_error(&["--varlink-address", "/x", "--dbus", "status"]), K::ArgumentConflict);
        assert_eq!(usage_error(&["--sandbox", "/x", "--bus", "system", "status"]), K::ArgumentConflict);
        assert_eq!(usage_error(&["--varlink-address", "tcp:1.2.3.4:5", "status"]), K::ValueValidation);
        assert_eq!(usage_error(&["--bus", "nonsense", "status"]), K::ValueValidation);
        assert_eq!(usage_error(&["--timeout=-1", "status"]), K::ValueValidation);
        assert_eq!(usage_error(&["frobnicate"]), K::InvalidSubcommand);
        assert_eq!(usage_error(&[]), K::DisplayHelpOnMissingArgumentOrSubcommand);
    }

    #[test]
    fn long_help_documents_the_exit_codes() {
        let help = Cli::command().render_long_help().to_string();
        for needle in [
            "Exit status:",
            "0  success",
            "1  the daemon answered",
            "2  usage error",
            "3  the daemon could not be reached",
        ] {
            assert!(help.contains(needle), "{needle} missing from:\n{help}");
        }
        let short = Cli::command().render_help().to_string();
        assert!(short.contains("3 daemon unreachable"), "{short}");
    }
}
