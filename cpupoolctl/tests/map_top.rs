//! `cpupoolctl pool map` and `cpupoolctl top` against the real `cpupoold` on sandbox hosts.
//!
//! `pool map` is compared with committed snapshots in `tests/snapshots/` (plain, coloured,
//! JSON): a 2-socket SMT-2 2-NUMA host with an offline CPU, a kernel-isolated CPU and three
//! kinds of assignment, and a 1-socket host. `UPDATE_SNAPSHOTS=1` rewrites them; read the diff
//! before committing it.
//!
//! `top` runs in a tmux pane (a real terminal): the test reads the screen with
//! `capture-pane` until the pools show (polling against a deadline, never a fixed sleep),
//! assigns and sees the count change, presses q, and checks the exit status and that the
//! terminal is back in cooked mode on its main screen; killed with SIGTERM or SIGHUP, the same,
//! with the shell seeing death by the signal.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

mod common;
use common::{text, Ctl, Daemon, CTL};

/// Compares `actual` with `tests/snapshots/NAME`, or writes it there with `UPDATE_SNAPSHOTS=1`.
fn snapshot(name: &str, actual: &str) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/snapshots").join(name);
    if std::env::var_os("UPDATE_SNAPSHOTS").is_some_and(|v| v == "1") {
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(&path, actual).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        return;
    }
    let expected = fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (UPDATE_SNAPSHOTS=1 writes it)", path.display()));
    if expected != actual {
        let diff: Vec<String> = expected
            .lines()
            .zip(actual.lines())
            .enumerate()
            .filter(|(_, (e, a))| e != a)
            .map(|(i, (e, a))| format!("line {}:\n  expected {e:?}\n  actual   {a:?}", i + 1))
            .collect();
        panic!(
            "{} differs from the output ({} vs {} lines; UPDATE_SNAPSHOTS=1 rewrites it):\n{}\n--- actual:\n{actual}",
            path.display(),
            expected.lines().count(),
            actual.lines().count(),
            diff.join("\n")
        );
    }
}

/// `pool map ARGS` with `env`, which must succeed; its stdout.
fn map(ctl: &Ctl, args: &[&str], env: &[(&str, &str)]) -> String {
    let mut cmd = ctl.command(&[&["pool", "map"], args].concat());
    cmd.env_remove("NO_COLOR");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out: Output = cmd.output().unwrap();
    assert!(out.status.success(), "pool map {args:?}: {}\n{}", out.status, text(&out.stderr));
    text(&out.stdout)
}

/// A cgroup inside `pool`'s slice, for `--cgroup`.
fn app(d: &Daemon, pool: &str) -> String {
    let rel = format!("cpupool.slice/cpupool-{pool}.slice/app");
    fs::create_dir_all(d.sb.join("cgroup").join(&rel)).unwrap();
    rel
}

fn assign(ctl: &Ctl, d: &Daemon, pool: &str, amount: &[&str], id: &str) {
    let cg = app(d, pool);
    ctl.ok(&[&["pool", "assign", pool, "--cgroup", &cg, "--id", id], amount].concat());
}

const TWO_SOCKETS: &str = r#"
[pools.reserved]
kind = "reserved"
cpus = "0,8"

[pools.dp]
kind = "exclusive"
cpus = "4-6,12-14"
isolate = true

[pools.web]
kind = "shared"
cpus = "1-3,9-11"

[pools.batch]
kind = "exclusive"
cpus = "7"
smt = "threads"
"#;

/// 2 sockets x 4 cores x 2 threads on 2 NUMA nodes (siblings c and c+8; socket 1 is CPUs
/// 4-7,12-15), CPU 15 offline and CPU 7 isolated by the kernel: the sandbox is made on a first
/// start, then its simulated sysfs is changed as the kernel would show it and the daemon
/// started again (the topology is read at start).
#[test]
fn map_of_a_two_socket_smt2_two_node_host() {
    let dir = tempfile::tempdir().unwrap();
    test_support::files::write_config(&dir.path().join("sb"), TWO_SOCKETS);
    Daemon::start_shape(dir.path(), "2x4x2:2").stop();
    let cpu = dir.path().join("sb/sys/devices/system/cpu");
    for (file, list) in [("online", "0-14"), ("offline", "15"), ("isolated", "7")] {
        fs::write(cpu.join(file), format!("{list}\n")).unwrap();
    }
    let d = Daemon::start_shape(dir.path(), "2x4x2:2");
    let ctl = Ctl::new(&d, false);
    assign(&ctl, &d, "dp", &["--cpus", "2"], "app-1");
    assign(&ctl, &d, "batch", &["--cpus", "1"], "batch-1");
    assign(&ctl, &d, "web", &["--millicpus", "1500"], "web-1");

    // Not a terminal: no colour, with or without NO_COLOR.
    let plain = map(&ctl, &[], &[]);
    snapshot("two-socket.txt", &plain);
    assert_eq!(map(&ctl, &["--color=auto"], &[("NO_COLOR", "1")]), plain);
    assert_eq!(map(&ctl, &["--color=never"], &[]), plain);
    // --color=always wins over NO_COLOR (no-color.org: an explicit choice overrides it).
    let coloured = map(&ctl, &["--color=always"], &[("NO_COLOR", "1")]);
    snapshot("two-socket.color.txt", &coloured);
    assert_eq!(strip_ansi(&coloured), plain, "colour adds escapes and nothing else");
    // The same picture over D-Bus.
    assert_eq!(map(&Ctl::new(&d, true), &[], &[]), plain);

    let json = ctl.ok(&["pool", "map"]);
    snapshot("two-socket.json", &(serde_json::to_string_pretty(&json).unwrap() + "\n"));
    let threads: Vec<&Value> = json["packages"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|p| p["nodes"].as_array().into_iter().flatten())
        .flat_map(|n| n["l3_groups"].as_array().into_iter().flatten())
        .flat_map(|l| l["cores"].as_array().into_iter().flatten())
        .flat_map(|c| c["threads"].as_array().into_iter().flatten())
        .collect();
    assert_eq!(threads.len(), 15, "every online CPU once: {json}");
    assert_eq!(json["offline"], serde_json::json!([15]));
    d.stop();
}

/// The sandbox's own sample configuration on 1 socket x 4 cores x 2 threads: reserved 0,4; dp
/// (exclusive, isolated) 2 CPUs; web (shared) the rest.
#[test]
fn map_of_a_one_socket_host() {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start_shape(dir.path(), "1x4x2:1");
    let ctl = Ctl::new(&d, false);
    assign(&ctl, &d, "dp", &["--cpus", "2"], "app-1");
    let plain = map(&ctl, &[], &[]);
    snapshot("one-socket.txt", &plain);
    let coloured = map(&ctl, &["--color=always"], &[]);
    snapshot("one-socket.color.txt", &coloured);
    assert_eq!(strip_ansi(&coloured), plain);
    d.stop();
}

fn strip_ansi(s: &str) -> String {
    let mut out = String::new();
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            chars.by_ref().find(|d| *d == 'm');
        } else {
            out.push(c);
        }
    }
    out
}

/// Errors come before the terminal is touched: no daemon exits 3 naming where it looked; a
/// stdout that is not a terminal, and --json, exit 1 saying why.
#[test]
fn top_and_map_errors() {
    let dir = tempfile::tempdir().unwrap();
    let none = dir.path().join("none");
    let none = none.to_str().unwrap();
    for cmd in [&["top"][..], &["pool", "map"]] {
        let out = Command::new(CTL).args(["--varlink-address", none]).args(cmd).output().unwrap();
        assert_eq!(out.status.code(), Some(3), "{cmd:?}: {}", text(&out.stderr));
        assert!(
            text(&out.stderr).contains(&format!("cannot reach cpupoold at unix:{none}")),
            "{}",
            text(&out.stderr)
        );
    }
    let d = Daemon::start(dir.path());
    let ctl = Ctl::new(&d, false);
    let (code, _, stderr) = ctl.human(&["top"]);
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("cpupoolctl top draws on a terminal: stdout is not one"), "{stderr}");
    let (code, e) = ctl.err(&["top"]);
    assert_eq!(code, 1, "{e}");
    assert!(e["message"].as_str().unwrap_or_default().contains("--json is not for a live view"), "{e}");
    let out = ctl.command(&["pool", "map", "--color=sometimes"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    let out = ctl.command(&["top", "--interval", "0"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("expected seconds between 0.1 and 86400"), "{}", text(&out.stderr));
    d.stop();
}

/// A tmux server of the test's own (its socket in the test's directory), killed on drop.
struct Tmux {
    socket: PathBuf,
}

impl Tmux {
    fn cmd(&self, args: &[&str]) -> Output {
        let out = Command::new("tmux").arg("-S").arg(&self.socket).args(args).output().unwrap();
        assert!(out.status.success(), "tmux {args:?}: {}", text(&out.stderr));
        out
    }

    /// The pane's visible text (`-e`: with its colour escapes).
    fn screen(&self, escapes: bool) -> String {
        let args: &[&str] = if escapes {
            &["capture-pane", "-p", "-e", "-t", "t"]
        } else {
            &["capture-pane", "-p", "-t", "t"]
        };
        text(&self.cmd(args).stdout)
    }

    /// Polls the screen until `ok` holds (deadline 30 s); the screen then.
    fn wait(&self, what: &str, ok: impl Fn(&str) -> bool) -> String {
        test_support::wait::until(test_support::wait::PATIENCE, what, || {
            let s = self.screen(false);
            if ok(&s) {
                Ok(s)
            } else {
                Err(format!("screen:\n{s}"))
            }
        })
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = Command::new("tmux").arg("-S").arg(&self.socket).arg("kill-server").output();
    }
}

impl Tmux {
    /// Starts `top --interval 0.2` on `d` in session `t` of a 120x40 terminal, from a script
    /// that afterwards prints top's exit status and the terminal modes, and waits.
    fn run_top(&self, dir: &Path, d: &Daemon) {
        self.run_top_in(dir, d, (120, 40));
    }

    /// [`Tmux::run_top`] in a terminal of `(columns, lines)`.
    fn run_top_in(&self, dir: &Path, d: &Daemon, (w, h): (u16, u16)) {
        let script = dir.join("top.sh");
        fs::write(
            &script,
            format!(
                "'{CTL}' --sandbox '{}' top --interval 0.2\n\
                 echo \"exited=$?\"\n\
                 echo \"modes: $(stty -a | tr ' ;' '\\n\\n' | grep -x -e icanon -e -icanon -e echo -e -echo | tr '\\n' ' ')end\"\n\
                 read x\n",
                d.sb.display()
            ),
        )
        .unwrap();
        let (w, h) = (w.to_string(), h.to_string());
        self.cmd(&["new-session", "-d", "-s", "t", "-x", &w, "-y", &h, "sh", script.to_str().unwrap()]);
    }

    /// The pid of `top`: the child of the pane's shell.
    fn top_pid(&self) -> i32 {
        let shell: u32 =
            text(&self.cmd(&["display", "-p", "-t", "t", "#{pane_pid}"]).stdout).trim().parse().unwrap();
        let children = fs::read_to_string(format!("/proc/{shell}/task/{shell}/children")).unwrap();
        children.split_whitespace().next().unwrap_or_else(|| panic!("no child of {shell}")).parse().unwrap()
    }

    /// Waits for top to end; asserts its exit status, cooked mode (icanon, echo) and the main
    /// screen (top's picture gone).
    fn assert_restored(&self, status: i32) {
        let screen = self.wait("top to exit", |s| s.contains("modes:"));
        assert!(screen.contains(&format!("exited={status}\n")), "{screen}");
        assert!(screen.contains("modes: icanon echo end"), "{screen}");
        assert!(!screen.contains("q quits"), "top's screen is still showing:\n{screen}");
    }
}

/// `top` needs a terminal: tmux's.
fn tmux_missing() -> bool {
    !test_support::needs::command(&["tmux", "-V"], "`apt install tmux`")
}

/// A pane's line for pool `name` in top's pool table: its cells, split on whitespace.
fn pool_row(screen: &str, name: &str) -> Option<Vec<String>> {
    screen.lines().find_map(|l| {
        let cells: Vec<String> = l
            .trim_matches(|c: char| c == '│' || c.is_whitespace())
            .split_whitespace()
            .map(str::to_owned)
            .collect();
        (cells.get(1).map(String::as_str) == Some(name)).then_some(cells)
    })
}

#[test]
fn top_in_a_terminal() {
    if tmux_missing() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(dir.path());
    let ctl = Ctl::new(&d, false);
    let tmux = Tmux { socket: dir.path().join("tmux.sock") };
    tmux.run_top(dir.path(), &d);
    let screen =
        tmux.wait("top to show the pools", |s| pool_row(s, "dp").is_some() && pool_row(s, "web").is_some());
    assert!(screen.contains("0 assignments"), "{screen}");
    assert_eq!(pool_row(&screen, "dp").unwrap()[2], "exclusive", "{screen}");
    // dp has no assignment yet: ASSIGNED is 0m of 2000m.
    assert!(pool_row(&screen, "dp").unwrap().join(" ").contains("0m / 2000m"), "{screen}");

    assign(&ctl, &d, "dp", &["--cpus", "2"], "app-1");
    let screen =
        tmux.wait("top to show the assignment", |s| s.contains("1 assignment ") && s.contains("app-1"));
    let dp = pool_row(&screen, "dp").unwrap().join(" ");
    assert!(dp.contains("2000m / 2000m") && dp.contains("100%"), "{screen}");
    // Colour is on in a terminal.
    assert!(tmux.screen(true).contains("\x1b["), "no colour in top");

    tmux.cmd(&["send-keys", "-t", "t", "q"]);
    tmux.assert_restored(0);
    d.stop();
}

/// The README's sandbox host (2x8x2, 32 CPUs) with 4 pools and 3 assignments: at 80x24 `top`
/// shows every pool and assignment and says in its last line what it leaves out (the
/// isolated CPUs' rows); at 120 columns the CPU lists, ids and targets are whole.
#[test]
fn top_fits_an_80x24_terminal_and_uses_120_columns() {
    if tmux_missing() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start_shape(dir.path(), "2x8x2:2");
    let ctl = Ctl::new(&d, false);
    ctl.ok(&["pool", "resize", "web", "--count", "8"]);
    ctl.ok(&["pool", "create", "batch", "--kind", "exclusive", "--count", "4", "--numa", "0"]);
    let ids: Vec<String> = (1..=3).map(|i| format!("analytics-worker-{i}")).collect();
    for id in &ids {
        let cg = format!("cpupool.slice/cpupool-web.slice/{id}");
        fs::create_dir_all(d.sb.join("cgroup").join(&cg)).unwrap();
        ctl.ok(&["pool", "assign", "web", "--cgroup", &cg, "--millicpus", "500", "--id", id]);
    }
    let pools = ctl.pools();
    let names: Vec<&str> = pools.as_array().unwrap().iter().filter_map(|p| p["name"].as_str()).collect();
    assert_eq!(names.len(), 4, "{pools}");

    let small = Tmux { socket: dir.path().join("tmux-80.sock") };
    small.run_top_in(dir.path(), &d, (80, 24));
    // The isolated pool's per-CPU rows come with the daemon's first health sample (within its
    // --health-interval): then there is more than fits.
    let screen = small.wait("top to say what does not fit in 80x24", |s| {
        s.contains("3 assignments") && s.contains("not shown:")
    });
    for name in &names {
        assert!(pool_row(&screen, name).is_some(), "pool {name} not shown in 80x24:\n{screen}");
    }
    for id in &ids {
        assert!(screen.contains(id.as_str()), "{id} not shown in 80x24:\n{screen}");
    }
    let last = screen.lines().rfind(|l| !l.trim().is_empty()).unwrap_or_default();
    assert!(
        last.starts_with("… not shown: ")
            && last.contains("isolation rows")
            && last.ends_with("(enlarge the terminal)"),
        "the last line does not say what is left out:\n{screen}"
    );
    small.cmd(&["send-keys", "-t", "t", "q"]);
    small.assert_restored(0);

    let wide = Tmux { socket: dir.path().join("tmux-120.sock") };
    wide.run_top_in(dir.path(), &d, (120, 40));
    // With the daemon's health sample, each isolated CPU's row says what still interrupts it.
    let screen = wide.wait("top to draw in 120 columns", |s| {
        s.contains("3 assignments") && s.contains("analytics") && s.contains("noise: ")
    });
    for p in pools.as_array().unwrap() {
        let (name, cpus) = (p["name"].as_str().unwrap(), p["cpus"].as_str().unwrap());
        let row = pool_row(&screen, name).unwrap_or_else(|| panic!("no {name}:\n{screen}"));
        assert_eq!(row[3], cpus, "pool {name}'s CPUs are cut:\n{screen}");
    }
    for id in &ids {
        let target = format!("cgroup:cpupool.slice/cpupool-web.slice/{id}");
        assert!(
            screen.lines().any(|l| l.contains(&format!("{id} ")) && l.contains(&target)),
            "{id} or its target is cut:\n{screen}"
        );
    }
    wide.cmd(&["send-keys", "-t", "t", "q"]);
    wide.assert_restored(0);
    d.stop();
}

/// Killed with SIGTERM or SIGHUP (a closed terminal), `top` puts the terminal back and then dies
/// of the signal, so the shell sees 128 + its number.
#[test]
fn top_puts_the_terminal_back_when_killed() {
    if tmux_missing() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(dir.path());
    for (sig, status) in [(nix::sys::signal::SIGTERM, 143), (nix::sys::signal::SIGHUP, 129)] {
        let tmux = Tmux { socket: dir.path().join(format!("tmux-{status}.sock")) };
        tmux.run_top(dir.path(), &d);
        tmux.wait("top to show the pools", |s| pool_row(s, "dp").is_some());
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(tmux.top_pid()), sig).unwrap();
        tmux.assert_restored(status);
    }
    d.stop();
}

/// When its terminal goes away (tmux's server killed: the pty closes, as when a terminal window
/// or an ssh connection does), `top` exits. It used to spin for ever on the end of file of a
/// hung-up terminal, a core's worth of CPU, deaf to SIGTERM.
#[test]
fn top_exits_when_its_terminal_goes_away() {
    if tmux_missing() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(dir.path());
    let tmux = Tmux { socket: dir.path().join("tmux-gone.sock") };
    tmux.run_top(dir.path(), &d);
    tmux.wait("top to show the pools", |s| pool_row(s, "dp").is_some());
    let top = tmux.top_pid();
    tmux.cmd(&["kill-server"]);
    test_support::wait::until(test_support::wait::PATIENCE, "top to exit with its terminal gone", || {
        match fs::read_to_string(format!("/proc/{top}/stat")) {
            // Gone, or a zombie nobody reaps (its shell died with the terminal).
            Err(_) => Ok(()),
            Ok(stat) if stat.rsplit(')').next().is_some_and(|r| r.trim_start().starts_with('Z')) => Ok(()),
            Ok(stat) => Err(format!("/proc/{top}/stat: {stat}")),
        }
    });
    d.stop();
}

/// `pool map` in a terminal colours by default and not with NO_COLOR set.
#[test]
fn map_in_a_terminal_respects_no_color() {
    if tmux_missing() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(dir.path());
    let tmux = Tmux { socket: dir.path().join("tmux.sock") };
    let script = dir.path().join("map.sh");
    let sb = d.sb.display();
    // Each run's stdout is the pane itself: a terminal.
    fs::write(
        &script,
        format!(
            "unset NO_COLOR\n'{CTL}' --sandbox '{sb}' pool map\n\
             NO_COLOR=1 '{CTL}' --sandbox '{sb}' pool map --color=auto\necho done=$?\nread x\n"
        ),
    )
    .unwrap();
    tmux.cmd(&["new-session", "-d", "-s", "t", "-x", "100", "-y", "80", "sh", script.to_str().unwrap()]);
    let plain = tmux.wait("both maps", |s| s.contains("done=0"));
    let coloured = tmux.screen(true);
    let first = coloured.split("no exclusive CPUs held").next().unwrap_or_default();
    let second = coloured.split("no exclusive CPUs held").nth(1).unwrap_or_default();
    assert!(first.contains("\x1b["), "no colour without NO_COLOR:\n{coloured}");
    assert!(!second.contains("\x1b["), "colour with NO_COLOR=1:\n{coloured}");
    assert_eq!(plain.matches("package 0 / node 0 / L3 0").count(), 2, "{plain}");
    d.stop();
}
