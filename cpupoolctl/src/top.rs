//! `cpupoolctl top`: a live view of the pools and CPUs.
//!
//! Data flow: every `--interval` [`fetch`] asks the daemon for its status, pools,
//! assignments, topology and isolation health (the same calls as `status`, `pool list`,
//! `assignments`, `pool map`); [`draw`] lays the [`Snapshot`] out with ratatui; between
//! refreshes the loop waits for a key (q, Esc or Ctrl-C quit; a resize redraws).
//!
//! The figures are honest about what they are: USE is the capacity the daemon has granted
//! (assigned millicpus of the pool's capacity), not CPU time measured on the CPUs; the daemon
//! measures only isolated CPUs (interrupt and timer rates, foreign CPU time), and those are
//! shown as it reported them. Nothing is read from this machine's /proc, which may not be
//! the daemon's host.
//!
//! The terminal is put back (raw mode off, main screen) when the loop ends for any reason:
//! a guard's `Drop` on return and on error, ratatui's panic hook on a panic; on SIGTERM,
//! SIGHUP or SIGINT the loop returns, the guard restores, and then the signal kills. If the daemon
//! goes away the last picture stays, marked stale with the error, and the loop reconnects.

use std::io::IsTerminal;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ratatui::crossterm::event::{self, Event as TermEvent, KeyCode, KeyEvent, KeyEventKind, KeyModifiers};
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Paragraph, Row, Table, Wrap};
use ratatui::Frame;

use cpupool_wire::views::{Assignment, Isolation, Pool, Status, Topology};

use cpupool_wire::methods as api;
use cpupool_wire::varlink::params;

use crate::client::Client;
use crate::error::Error;
use crate::map::HostMap;
use crate::output::{duration, millicpus};

/// What one refresh read.
#[derive(Debug, Clone)]
pub struct Snapshot {
    /// `Status`.
    pub status: Status,
    /// `ListPools`.
    pub pools: Vec<Pool>,
    /// `ListAssignments`.
    pub assignments: Vec<Assignment>,
    /// `GetTopology`.
    pub topology: Topology,
    /// `GetIsolation` of every isolated pool (empty from a daemon without it).
    pub isolation: Isolation,
}

/// Reads one snapshot.
pub fn fetch(m: &mut Client) -> Result<Snapshot, Error> {
    Ok(Snapshot {
        status: m.call::<api::Status>(&params::NoParameters {})?,
        pools: m.call::<api::ListPools>(&params::NoParameters {})?.pools,
        assignments: m.assignments(None)?,
        topology: m.call::<api::GetTopology>(&params::NoParameters {})?,
        // An older daemon without GetIsolation: the view goes without it, as `status` does.
        isolation: m.isolation("").unwrap_or_default(),
    })
}

/// What the screen shows: the last snapshot read, and why the latest refresh failed if it did.
pub struct View {
    /// The last good snapshot (none before the first).
    pub snapshot: Option<Snapshot>,
    /// The last refresh's error, shown above a stale picture.
    pub problem: Option<String>,
    /// The refresh interval, shown in the header.
    pub interval: Duration,
}

fn colour(name: &str) -> Color {
    match name {
        "green" => Color::Green,
        "blue" => Color::Blue,
        "magenta" => Color::Magenta,
        "cyan" => Color::Cyan,
        "yellow" => Color::Yellow,
        "red" => Color::Red,
        "bright-green" => Color::LightGreen,
        "bright-blue" => Color::LightBlue,
        "bright-magenta" => Color::LightMagenta,
        "bright-cyan" => Color::LightCyan,
        "bright-yellow" => Color::LightYellow,
        "bright-red" => Color::LightRed,
        _ => Color::DarkGray,
    }
}

fn plural(n: u64, one: &str) -> String {
    if n == 1 {
        format!("1 {one}")
    } else {
        format!("{n} {one}s")
    }
}

/// `█████░░░░░  50%`: the share of capacity assigned.
fn bar(used: u64, capacity: u64) -> String {
    const WIDTH: u64 = 10;
    // A pool without capacity (no CPUs) shows an empty bar.
    let pct = used.saturating_mul(100).checked_div(capacity).unwrap_or(0);
    let full = used.saturating_mul(WIDTH).checked_div(capacity).unwrap_or(0).min(WIDTH);
    format!(
        "{}{} {pct:>3}%",
        "█".repeat(usize::try_from(full).unwrap_or(0)),
        "░".repeat(usize::try_from(WIDTH - full).unwrap_or(0))
    )
}

fn bold() -> Style {
    Style::default().add_modifier(Modifier::BOLD)
}

/// Draws the view: header, pools, CPUs, isolated CPUs (when any pool is isolated),
/// assignments, and a footer saying what USE is.
pub fn draw(frame: &mut Frame, view: &View) {
    let area = frame.area();
    let Some(snap) = &view.snapshot else {
        let text = match &view.problem {
            Some(p) => format!("cpupoolctl top: {p} (retrying; q quits)"),
            None => "cpupoolctl top: reading the daemon... (q quits)".to_owned(),
        };
        frame.render_widget(Paragraph::new(text).wrap(Wrap { trim: false }), area);
        return;
    };
    let header = header(&snap.status, view.interval);
    let problem = view.problem.as_ref().map(|p| {
        Line::from(Span::styled(
            format!("stale: {p} (retrying)"),
            Style::default().fg(Color::Red).add_modifier(Modifier::BOLD),
        ))
    });

    // The map gives each pool its letter and colour, and each CPU its pool and holder; a
    // reply it cannot read leaves the CPU grid out rather than the whole view.
    let map = HostMap::build(&snap.topology, &snap.pools, &snap.assignments).ok();
    let cpu_cells = map.as_ref().map(cpu_spans).unwrap_or_default();
    let cell_w = cpu_cells.iter().map(|(t, _)| t.chars().count()).max().unwrap_or(1) + 1;
    let per_line = (usize::from(area.width.saturating_sub(2)) / cell_w).max(1);
    let cpu_lines = cpu_cells.len().div_ceil(per_line);
    let iso_rows = snap.isolation.pools.iter().map(|p| 1 + p.per_cpu.len()).sum::<usize>();

    // The sections in the order they get the height there is: pools, CPUs, assignments, then
    // the isolation detail (its summary is in the pools' ISOLATION column too). What does not
    // fit is counted in the footer, never silently left out.
    let fixed = 2 + usize::from(problem.is_some());
    let fit = Fit::new(
        usize::from(area.height).saturating_sub(fixed),
        &[
            (snap.pools.len(), 3),
            (cpu_lines, 2),
            (snap.assignments.len(), 3),
            (iso_rows, if iso_rows > 0 { 3 } else { 0 }),
        ],
    );
    let [pool_rows, cpu_rows, assignment_rows, iso_shown] = fit.shown;

    let mut constraints = vec![Constraint::Length(1)];
    if problem.is_some() {
        constraints.push(Constraint::Length(1));
    }
    constraints.extend(fit.heights.iter().map(|h| Constraint::Length(u16::try_from(*h).unwrap_or(u16::MAX))));
    constraints.push(Constraint::Fill(1));
    constraints.push(Constraint::Length(1));
    let areas = Layout::vertical(constraints).split(area);
    let mut at = areas.iter().copied();
    let mut next = || at.next().unwrap_or(Rect::ZERO);

    frame.render_widget(Paragraph::new(header), next());
    if let Some(p) = problem {
        frame.render_widget(Paragraph::new(p), next());
    }
    let (pools_area, cpus_area, assignments_area, iso_area) = (next(), next(), next(), next());
    let _spare = next();
    if pool_rows > 0 {
        frame.render_widget(pools_table(snap, map.as_ref(), pool_rows), pools_area);
    }

    if cpu_rows > 0 {
        frame.render_widget(cpu_grid(&cpu_cells, per_line, cell_w, cpu_rows), cpus_area);
    }
    if assignment_rows > 0 || (snap.assignments.is_empty() && fit.heights[2] > 0) {
        frame.render_widget(assignments_table(&snap.assignments, assignment_rows), assignments_area);
    }
    if iso_shown > 0 {
        frame.render_widget(isolation_table(snap, iso_shown), iso_area);
    }
    let footer = footer(&[
        (snap.pools.len() - pool_rows, "pool", "pools"),
        (snap.assignments.len() - assignment_rows, "assignment", "assignments"),
        (cpu_lines - cpu_rows, "line of CPUs", "lines of CPUs"),
        (iso_rows - iso_shown, "isolation row", "isolation rows"),
    ]);
    frame.render_widget(Paragraph::new(footer), next());
}

/// The top line: the daemon's version, uptime and counts, and the refresh period.
fn header(s: &Status, interval: Duration) -> Line<'static> {
    Line::from(vec![
        Span::styled(format!("cpupoold {}", s.version), bold()),
        Span::raw(format!(
            "  up {}  {}  {}  every {}s  q quits",
            duration(s.uptime_seconds),
            plural(s.pools, "pool"),
            plural(s.assignments, "assignment"),
            interval.as_secs_f64()
        )),
    ])
}

/// The first `rows` lines of CPU cells, `per_line` cells of `cell_w` columns each, in a box.
fn cpu_grid(cells: &[(String, Style)], per_line: usize, cell_w: usize, rows: usize) -> Paragraph<'static> {
    let mut lines = Vec::new();
    for chunk in cells.chunks(per_line).take(rows) {
        let spans: Vec<Span> = chunk
            .iter()
            .map(|(text, style)| Span::styled(format!("{text:<w$}", w = cell_w), *style))
            .collect();
        lines.push(Line::from(spans));
    }
    Paragraph::new(lines)
        .block(Block::bordered().title(" CPUs: pool letter and number, [ ] isolated, * held "))
}

/// The bottom line: what the terminal was too small to show (`hidden`: how many, the word for
/// one, the word for several), or else what USE means.
fn footer(hidden: &[(usize, &str, &str)]) -> Line<'static> {
    let hidden: Vec<String> = hidden
        .iter()
        .filter(|(n, _, _)| *n > 0)
        .map(|(n, one, many)| if *n == 1 { format!("1 {one}") } else { format!("{n} {many}") })
        .collect();
    let footer = if hidden.is_empty() {
        Span::styled(
            "USE: capacity the daemon assigned (millicpus granted of the pool's), not measured CPU time",
            Style::default().add_modifier(Modifier::DIM),
        )
    } else {
        Span::styled(
            format!("… not shown: {} (enlarge the terminal)", hidden.join(", ")),
            Style::default().fg(Color::Yellow).add_modifier(Modifier::BOLD),
        )
    };
    Line::from(footer)
}

/// How the height there is goes to sections, each `(rows, frame)`: rows of content and the
/// lines its frame takes (borders, a table's header). In order, each section gets what it
/// needs or what is left; a section left less than its frame and one row is not drawn.
struct Fit {
    /// Each section's height (0: not drawn).
    heights: Vec<usize>,
    /// Each section's rows of content shown.
    shown: [usize; 4],
}

impl Fit {
    fn new(mut height: usize, sections: &[(usize, usize); 4]) -> Fit {
        let mut heights = Vec::new();
        let mut shown = [0; 4];
        for (i, (rows, frame)) in sections.iter().enumerate() {
            // An empty list still shows its (empty) frame when there is room: "0 assignments".
            let want = frame + rows;
            let room = height.min(want);
            let (h, n) =
                if room > *frame || (*rows == 0 && room == want) { (room, room - frame) } else { (0, 0) };
            heights.push(h);
            shown[i] = n;
            height -= h;
        }
        Fit { heights, shown }
    }
}

/// Every online CPU in number order, as `map` draws it: `[d4]*`, coloured by pool.
fn cpu_spans(map: &HostMap) -> Vec<(String, Style)> {
    let mut threads: Vec<_> = map
        .packages
        .iter()
        .flat_map(|p| &p.nodes)
        .flat_map(|n| &n.l3_groups)
        .flat_map(|l| &l.cores)
        .flat_map(|c| &c.threads)
        .collect();
    threads.sort_by_key(|t| t.cpu);
    let mut cells: Vec<(String, Style)> = threads
        .iter()
        .map(|t| {
            let key = t.pool.as_deref().and_then(|n| map.pools.iter().find(|k| k.name == n));
            let isolated = t.isolated_partition || t.kernel_isolated;
            let text = format!(
                "{}{}{}{}{}",
                if isolated { "[" } else { "" },
                key.map_or('-', |k| k.letter),
                t.cpu,
                if isolated { "]" } else { "" },
                if t.assignment.is_some() { "*" } else { "" }
            );
            let mut style = Style::default().fg(key.map_or(Color::Reset, |k| colour(k.colour)));
            if isolated {
                style = style.add_modifier(Modifier::UNDERLINED);
            }
            if t.assignment.is_some() {
                style = style.add_modifier(Modifier::BOLD);
            }
            (text, style)
        })
        .collect();
    cells.extend(
        map.offline.iter().map(|cpu| (format!("x{cpu}"), Style::default().add_modifier(Modifier::DIM))),
    );
    cells
}

/// The widest of `cells` and `header`, in characters: a column as wide as what it shows.
fn width<'a>(header: &str, cells: impl Iterator<Item = &'a str>) -> u16 {
    let w = cells.map(|c| c.chars().count()).chain([header.chars().count()]).max().unwrap_or(1);
    u16::try_from(w).unwrap_or(u16::MAX)
}

fn pools_table<'a>(snap: &'a Snapshot, map: Option<&HostMap>, shown: usize) -> Table<'a> {
    let name_w = width("POOL", snap.pools.iter().map(|p| p.name.as_str()));
    let cpus_w = width("CPUS", snap.pools.iter().map(|p| p.cpus.as_str()));
    let assigned = |p: &Pool| {
        let used = p.capacity_millicpus.saturating_sub(p.free_millicpus);
        format!("{} / {}", millicpus(used), millicpus(p.capacity_millicpus))
    };
    let assigned_w =
        width("ASSIGNED", snap.pools.iter().map(assigned).collect::<Vec<_>>().iter().map(String::as_str));
    let rows = snap.pools.iter().take(shown).map(|p| {
        let key = map.and_then(|m| m.pools.iter().find(|k| k.name == p.name));
        let used = p.capacity_millicpus.saturating_sub(p.free_millicpus);
        let iso = snap.isolation.pools.iter().find(|i| i.pool == p.name);
        let isolation = match (p.isolated, iso) {
            (false, _) => "-".to_owned(),
            // The state in a word; its summary is in the isolation table below.
            (true, Some(i)) if i.foreign_percent >= 0.0 => {
                format!("{}, foreign {:.1}%", i.state, i.foreign_percent)
            }
            (true, Some(i)) => i.state.clone(),
            (true, None) if p.partition.is_empty() => "isolated".to_owned(),
            (true, None) => p.partition.clone(),
        };
        Row::new(vec![
            Span::styled(
                key.map_or(' ', |k| k.letter).to_string(),
                Style::default()
                    .fg(key.map_or(Color::Reset, |k| colour(k.colour)))
                    .add_modifier(Modifier::BOLD),
            ),
            Span::raw(p.name.clone()),
            Span::raw(p.kind.clone()),
            Span::raw(if p.cpus.is_empty() { "-".to_owned() } else { p.cpus.clone() }),
            Span::raw(assigned(p)),
            Span::raw(bar(used, p.capacity_millicpus)),
            Span::raw(p.assignments.to_string()),
            Span::raw(isolation),
        ])
    });
    Table::new(
        rows,
        [
            Constraint::Length(1),
            Constraint::Length(name_w),
            Constraint::Length(9),
            Constraint::Length(cpus_w),
            Constraint::Length(assigned_w),
            Constraint::Length(15),
            Constraint::Length(6),
            Constraint::Fill(1),
        ],
    )
    .header(
        Row::new(vec!["", "POOL", "KIND", "CPUS", "ASSIGNED", "USE", "ASSIGN", "ISOLATION"]).style(bold()),
    )
    .block(Block::bordered().title(" pools "))
}

fn rate(v: f64) -> String {
    format!("{v:.1}")
}

fn isolation_table(snap: &Snapshot, shown: usize) -> Table<'_> {
    let name_w = width("POOL", snap.isolation.pools.iter().map(|p| p.pool.as_str()));
    let cpus_w = width("CPU", snap.isolation.pools.iter().map(|p| p.cpus.as_str()));
    let mut rows = Vec::new();
    for p in &snap.isolation.pools {
        let foreign =
            if p.foreign_percent < 0.0 { "-".to_owned() } else { format!("{:.1}%", p.foreign_percent) };
        rows.push(
            Row::new(vec![
                p.pool.clone(),
                if p.cpus.is_empty() { "-".to_owned() } else { p.cpus.clone() },
                String::new(),
                String::new(),
                String::new(),
                foreign,
                // `holds` says it all; a state that is also its summary is said once.
                if p.summary == p.state || p.summary.starts_with(&format!("{}:", p.state)) {
                    p.summary.clone()
                } else {
                    format!("{}: {}", p.state, p.summary)
                },
            ])
            .style(bold()),
        );
        for c in &p.per_cpu {
            rows.push(Row::new(vec![
                String::new(),
                c.cpu.to_string(),
                rate(c.device_irqs_per_sec),
                rate(c.ipis_per_sec),
                rate(c.timer_per_sec),
                String::new(),
                // The device IRQs, then what interrupts the CPU by source (its three busiest).
                match (c.sources.is_empty(), c.noise.is_empty()) {
                    (_, true) => c.sources.clone(),
                    (true, false) => format!("noise: {}", crate::output::noise_text(&c.noise, 3)),
                    (false, false) => {
                        format!("{}; noise: {}", c.sources, crate::output::noise_text(&c.noise, 3))
                    }
                },
            ]));
        }
    }
    rows.truncate(shown);
    Table::new(
        rows,
        [
            Constraint::Length(name_w),
            Constraint::Length(cpus_w),
            Constraint::Length(8),
            Constraint::Length(8),
            Constraint::Length(8),
            Constraint::Length(8),
            Constraint::Fill(3),
        ],
    )
    .header(
        Row::new(vec!["POOL", "CPU", "IRQ/s", "IPI/s", "TIMER/s", "FOREIGN", "STATE / SOURCES"])
            .style(bold()),
    )
    .block(Block::bordered().title(" isolation, as the daemon last measured it "))
}

fn assignments_table(list: &[Assignment], shown: usize) -> Table<'_> {
    let id_w = width("ID", list.iter().map(|a| a.id.as_str()));
    let pool_w = width("POOL", list.iter().map(|a| a.pool.as_str()));
    let cpus_w = width("CPUS", list.iter().map(|a| a.cpus.as_str()));
    let target_w = width("TARGET", list.iter().map(|a| a.target.as_str()));
    let rows = list.iter().take(shown).map(|a| {
        let state = if a.reason.is_empty() { a.state.clone() } else { format!("{}: {}", a.state, a.reason) };
        let row = Row::new(vec![
            a.id.clone(),
            a.pool.clone(),
            if a.cpus.is_empty() { "-".to_owned() } else { a.cpus.clone() },
            millicpus(a.millicpus),
            a.target.clone(),
            state,
        ]);
        match a.state.as_str() {
            "degraded" => row.style(Style::default().fg(Color::Red)),
            // Booked for a container that does not run yet: nothing enforces its CPUs.
            "allocated" => row.style(Style::default().add_modifier(Modifier::DIM)),
            _ => row,
        }
    });
    Table::new(
        rows,
        [
            Constraint::Length(id_w),
            Constraint::Length(pool_w),
            Constraint::Length(cpus_w),
            Constraint::Length(9),
            Constraint::Length(target_w),
            Constraint::Fill(1),
        ],
    )
    .header(Row::new(vec!["ID", "POOL", "CPUS", "MILLICPUS", "TARGET", "STATE"]).style(bold()))
    .block(Block::bordered().title(format!(" assignments ({}) ", list.len())))
}

/// Whether a key quits: q, Esc or Ctrl-C (raw mode turns Ctrl-C into a key, not SIGINT).
fn quits(k: &KeyEvent) -> bool {
    k.kind == KeyEventKind::Press
        && (matches!(k.code, KeyCode::Char('q') | KeyCode::Char('Q') | KeyCode::Esc)
            || (k.code == KeyCode::Char('c') && k.modifiers.contains(KeyModifiers::CONTROL)))
}

/// Puts the terminal back however the loop ends.
struct Restore;

impl Drop for Restore {
    fn drop(&mut self) {
        ratatui::restore();
    }
}

fn local(what: &str) -> impl FnOnce(std::io::Error) -> Error + '_ {
    move |source| Error::Local { what: what.to_owned(), source }
}

/// Runs the view until a quitting key, or until SIGTERM, SIGHUP or SIGINT, after which the
/// terminal is put back and the signal's default action (death by it) follows, as a shell
/// expects of a killed program. `m` is the connection made before (so a daemon that is not
/// there fails before the screen is taken); `connect` makes a new one after an error.
pub fn run(m: Client, connect: &dyn Fn() -> Result<Client, Error>, interval: Duration) -> Result<(), Error> {
    if !std::io::stdout().is_terminal() {
        return Err(Error::Local {
            what: "cpupoolctl top draws on a terminal".into(),
            source: std::io::Error::other(
                "stdout is not one (for scripts: `cpupoolctl --json pool list`, `pool map --json`)",
            ),
        });
    }
    let caught = Arc::new(AtomicUsize::new(0));
    for sig in QUIT_SIGNALS {
        signal_hook::flag::register_usize(sig, Arc::clone(&caught), sig as usize)
            .map_err(local("catching SIGTERM, SIGHUP and SIGINT"))?;
    }
    let ended = {
        // Made before the terminal is touched: raw mode may be on even if entering the
        // alternate screen then fails.
        let _restore = Restore;
        show(m, connect, interval, &caught)
    };
    match ended? {
        Ended::Key => Ok(()),
        // The terminal is back (the guard above has dropped): now die of the signal.
        Ended::Signal(sig) => {
            signal_hook::low_level::emulate_default_handler(sig).map_err(local("ending on a signal"))
        }
    }
}

/// The signals that end `top`. In raw mode Ctrl-C is a key, so SIGINT comes only from `kill`.
const QUIT_SIGNALS: [i32; 3] =
    [signal_hook::consts::SIGTERM, signal_hook::consts::SIGHUP, signal_hook::consts::SIGINT];

/// The longest a signal waits to be noticed: the terminal is polled in slices this long.
const SIGNAL_LATENCY: Duration = Duration::from_millis(100);

/// How the view ended.
enum Ended {
    /// A quitting key.
    Key,
    /// This signal.
    Signal(i32),
}

/// Draws and refreshes the view until a quitting key or a caught signal.
fn show(
    m: Client,
    connect: &dyn Fn() -> Result<Client, Error>,
    interval: Duration,
    caught: &AtomicUsize,
) -> Result<Ended, Error> {
    let mut m = Some(m);
    let mut view = View { snapshot: None, problem: None, interval };
    let mut terminal = ratatui::try_init().map_err(local("setting up the terminal"))?;
    let mut due = Instant::now();
    loop {
        if Instant::now() >= due {
            due = Instant::now() + interval;
            let conn = match m.take() {
                Some(c) => Ok(c),
                None => connect(),
            };
            match conn.and_then(|mut c| fetch(&mut c).map(|s| (c, s))) {
                Ok((c, snap)) => {
                    m = Some(c);
                    view.snapshot = Some(snap);
                    view.problem = None;
                }
                // The connection is dropped and made again at the next refresh: a daemon
                // that restarted is found again.
                Err(e) => view.problem = Some(e.human()),
            }
        }
        terminal.draw(|f| draw(f, &view)).map_err(local("drawing"))?;
        loop {
            let sig = caught.load(Ordering::SeqCst);
            if sig != 0 {
                return Ok(Ended::Signal(sig as i32));
            }
            let wait = due.saturating_duration_since(Instant::now());
            if wait.is_zero() {
                break;
            }
            // A terminal that hung up is readable for ever, at end of file: end as the SIGHUP
            // it sent does (which may not come: the hangup goes to the foreground group only).
            if terminal_hung_up() {
                return Ok(Ended::Signal(signal_hook::consts::SIGHUP));
            }
            if event::poll(wait.min(SIGNAL_LATENCY)).map_err(local("reading the terminal"))? {
                match event::read().map_err(local("reading the terminal"))? {
                    TermEvent::Key(k) if quits(&k) => return Ok(Ended::Key),
                    // Anything else (a resize, another key) redraws at once.
                    _ => break,
                }
            }
        }
    }
}

/// Whether the terminal on stdin hung up (its window, tmux or ssh connection went away):
/// `poll` says so with `POLLHUP` (or `POLLERR`, `POLLNVAL`) at once.
fn terminal_hung_up() -> bool {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    use std::os::fd::AsFd;
    let stdin = std::io::stdin();
    let mut fds = [PollFd::new(stdin.as_fd(), PollFlags::POLLIN)];
    let gone = PollFlags::POLLHUP | PollFlags::POLLERR | PollFlags::POLLNVAL;
    poll(&mut fds, PollTimeout::ZERO).is_ok() && fds[0].revents().is_some_and(|r| r.intersects(gone))
}

#[cfg(test)]
mod tests;
