//! `cpupoolctl pool map`: a picture of the host's CPUs and whose they are.
//!
//! Data flow: [`HostMap::build`] takes three replies (`GetTopology`, `ListPools`,
//! `ListAssignments`) and nests the online CPUs package → NUMA node → L3 group → core →
//! threads, each thread with its pool, the exclusive assignment holding it and whether it is
//! isolated; [`render`] draws that as text (one grid per L3 group: a column per core, a row
//! per thread), and `--json` prints the [`HostMap`] itself. Both are pure, so the exact
//! picture is unit-tested here and snapshot-tested against a sandbox daemon in
//! `tests/map_top.rs`.
//!
//! Offline CPUs have no place: the kernel drops their topology files while they are offline, so
//! they are listed on a line of their own rather than guessed into a core.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use cpupool_wire::views::{Assignment, Pool, Topology};

use crate::error::Error;
use crate::output::{Align, Table};

/// The picture's data, also the `--json` document.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HostMap {
    /// The pools, in name order, with the letter and colour the picture draws them in.
    pub pools: Vec<PoolKey>,
    /// The online CPUs where they sit.
    pub packages: Vec<Package>,
    /// CPUs present but offline.
    pub offline: Vec<u32>,
    /// CPUs the kernel isolated at boot (`isolcpus=`).
    pub kernel_isolated: Vec<u32>,
    /// Assignments of exclusive pools: who holds which CPUs.
    pub held: Vec<Held>,
}

/// How a pool is drawn.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PoolKey {
    /// The pool.
    pub name: String,
    /// Its letter in the picture.
    pub letter: char,
    /// `reserved`, `exclusive` or `shared`.
    pub kind: String,
    /// Its colour's name (`green`, ...), when colour is on.
    pub colour: &'static str,
    /// Its CPUs.
    pub cpus: String,
    /// Whether it runs as an isolated partition.
    pub isolated: bool,
    /// The kernel's word on its partition.
    pub partition: String,
}

/// One package (socket).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Package {
    /// Its id.
    pub package: u32,
    /// Its NUMA nodes.
    pub nodes: Vec<Node>,
}

/// One NUMA node within a package.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Node {
    /// Its id.
    pub node: u32,
    /// Its L3 groups.
    pub l3_groups: Vec<L3Group>,
}

/// CPUs sharing an L3 cache.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct L3Group {
    /// Its name (its lowest online CPU).
    pub l3: u32,
    /// Its cores.
    pub cores: Vec<Core>,
}

/// One core.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Core {
    /// Its name (its lowest online CPU).
    pub core: u32,
    /// Its online hardware threads, lowest first.
    pub threads: Vec<Thread>,
}

/// One online CPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Thread {
    /// The CPU number.
    pub cpu: u32,
    /// The pool it belongs to (none only if the daemon's pools do not cover it).
    pub pool: Option<String>,
    /// The assignment holding it, for CPUs of exclusive pools.
    pub assignment: Option<String>,
    /// In its pool's isolated partition.
    pub isolated_partition: bool,
    /// Isolated by the kernel at boot (`isolcpus=`).
    pub kernel_isolated: bool,
}

/// An exclusive assignment and the CPUs it holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Held {
    /// The assignment.
    pub id: String,
    /// Its pool.
    pub pool: String,
    /// Its CPUs.
    pub cpus: String,
    /// Its target.
    pub target: String,
}

/// Parses a kernel CPU list (`0-3,8`); what is wrong, otherwise.
pub fn cpu_list(text: &str) -> Result<Vec<u32>, String> {
    let mut out = BTreeSet::new();
    for part in text.trim().split(',').filter(|p| !p.is_empty()) {
        let num =
            |s: &str| s.trim().parse::<u32>().map_err(|_| format!("`{s}` in `{text}` is not a CPU number"));
        let (lo, hi) = match part.split_once('-') {
            Some((a, b)) => (num(a)?, num(b)?),
            None => (num(part)?, num(part)?),
        };
        if lo > hi {
            return Err(format!("range `{part}` in `{text}` runs backwards"));
        }
        // Guards against a reply that would make this client allocate without bound.
        if hi - lo > 1 << 20 {
            return Err(format!("range `{part}` in `{text}` is larger than any host"));
        }
        out.extend(lo..=hi);
    }
    Ok(out.into_iter().collect())
}

/// The colours pools are drawn in, in the order pools get them: (name, SGR code). The reserved
/// pool is always grey: it is the host's, not a workload's.
const PALETTE: [(&str, u8); 12] = [
    ("green", 32),
    ("blue", 34),
    ("magenta", 35),
    ("cyan", 36),
    ("yellow", 33),
    ("red", 31),
    ("bright-green", 92),
    ("bright-blue", 94),
    ("bright-magenta", 95),
    ("bright-cyan", 96),
    ("bright-yellow", 93),
    ("bright-red", 91),
];
const GREY: (&str, u8) = ("grey", 90);

/// The SGR code of a colour name from [`PALETTE`] (or grey).
fn sgr(colour: &str) -> u8 {
    PALETTE.iter().chain([&GREY]).find(|(n, _)| *n == colour).map_or(39, |(_, c)| *c)
}

/// One letter per pool, in the order given: the first character of its name not taken yet,
/// else the first free of a-z, 0-9, A-Z; `?` if all 62 are taken.
fn letters(names: &[&str]) -> Vec<char> {
    let mut taken = BTreeSet::new();
    let fallback = ('a'..='z').chain('0'..='9').chain('A'..='Z');
    names
        .iter()
        .map(|n| {
            let pick = n
                .chars()
                .filter(char::is_ascii_alphanumeric)
                .map(|c| c.to_ascii_lowercase())
                .chain(fallback.clone())
                .find(|c| !taken.contains(c))
                .unwrap_or('?');
            taken.insert(pick);
            pick
        })
        .collect()
}

fn protocol(what: String) -> Error {
    Error::Protocol { address: "the daemon".into(), reason: what }
}

/// The pools' keys in name order: each its letter, and a colour from the palette (grey for the
/// reserved pool).
fn pool_keys(sorted: &[&Pool]) -> Vec<PoolKey> {
    let names: Vec<&str> = sorted.iter().map(|p| p.name.as_str()).collect();
    let mut palette = PALETTE.iter().cycle();
    sorted
        .iter()
        .zip(letters(&names))
        .map(|(p, letter)| PoolKey {
            name: p.name.clone(),
            letter,
            kind: p.kind.clone(),
            colour: if p.kind == "reserved" { GREY.0 } else { palette.next().map_or(GREY.0, |c| c.0) },
            cpus: p.cpus.clone(),
            isolated: p.isolated,
            partition: p.partition.clone(),
        })
        .collect()
}

/// The assignments of exclusive pools in id order, and which of them holds each CPU.
fn exclusive_holders<'a>(
    pools: &[Pool],
    assignments: &'a [Assignment],
) -> Result<(Vec<Held>, BTreeMap<u32, &'a str>), Error> {
    let exclusive: BTreeSet<&str> =
        pools.iter().filter(|p| p.kind == "exclusive").map(|p| p.name.as_str()).collect();
    let mut held = Vec::new();
    let mut holder: BTreeMap<u32, &str> = BTreeMap::new();
    let mut sorted_assignments: Vec<&Assignment> =
        assignments.iter().filter(|a| exclusive.contains(a.pool.as_str())).collect();
    sorted_assignments.sort_by(|a, b| a.id.cmp(&b.id));
    for a in sorted_assignments {
        for cpu in
            cpu_list(&a.cpus).map_err(|e| protocol(format!("assignment `{}` field `cpus`: {e}", a.id)))?
        {
            holder.insert(cpu, &a.id);
        }
        held.push(Held {
            id: a.id.clone(),
            pool: a.pool.clone(),
            cpus: a.cpus.clone(),
            target: a.target.clone(),
        });
    }
    Ok((held, holder))
}

/// package → node → L3 group → core → CPUs, as the topology reply numbers them.
type Nest = BTreeMap<u32, BTreeMap<u32, BTreeMap<u32, BTreeMap<u32, Vec<u32>>>>>;

/// The online CPUs nested by where they sit.
fn nest(topo: &Topology) -> Nest {
    let mut nest: Nest = BTreeMap::new();
    for c in &topo.cpus {
        nest.entry(c.package)
            .or_default()
            .entry(c.node)
            .or_default()
            .entry(c.l3)
            .or_default()
            .entry(c.core)
            .or_default()
            .push(c.cpu);
    }
    nest
}

impl HostMap {
    /// Nests the topology and marks each CPU with its pool and holder. A CPU list in a reply
    /// that does not parse is a protocol error naming the field.
    pub fn build(topo: &Topology, pools: &[Pool], assignments: &[Assignment]) -> Result<HostMap, Error> {
        let mut sorted: Vec<&Pool> = pools.iter().collect();
        sorted.sort_by(|a, b| a.name.cmp(&b.name));
        let keys = pool_keys(&sorted);

        let mut pool_of: BTreeMap<u32, &Pool> = BTreeMap::new();
        for p in &sorted {
            for cpu in
                cpu_list(&p.cpus).map_err(|e| protocol(format!("pool `{}` field `cpus`: {e}", p.name)))?
            {
                pool_of.insert(cpu, p);
            }
        }
        let (held, holder) = exclusive_holders(pools, assignments)?;
        let list = |field: &str, text: &str| {
            cpu_list(text).map_err(|e| protocol(format!("GetTopology field `{field}`: {e}")))
        };
        let kernel_isolated = list("isolated", &topo.isolated)?;
        let offline = list("offline", &topo.offline)?;

        let thread = |cpu: u32| {
            let pool = pool_of.get(&cpu);
            Thread {
                cpu,
                pool: pool.map(|p| p.name.clone()),
                assignment: holder.get(&cpu).map(|s| (*s).to_owned()),
                isolated_partition: pool.is_some_and(|p| p.isolated),
                kernel_isolated: kernel_isolated.binary_search(&cpu).is_ok(),
            }
        };
        let packages = nest(topo)
            .into_iter()
            .map(|(package, nodes)| Package {
                package,
                nodes: nodes
                    .into_iter()
                    .map(|(node, l3s)| Node {
                        node,
                        l3_groups: l3s
                            .into_iter()
                            .map(|(l3, cores)| L3Group {
                                l3,
                                cores: cores
                                    .into_iter()
                                    .map(|(core, mut cpus)| {
                                        cpus.sort_unstable();
                                        Core { core, threads: cpus.into_iter().map(thread).collect() }
                                    })
                                    .collect(),
                            })
                            .collect(),
                    })
                    .collect(),
            })
            .collect();
        Ok(HostMap { pools: keys, packages, offline, kernel_isolated, held })
    }

    fn key(&self, pool: Option<&str>) -> Option<&PoolKey> {
        pool.and_then(|name| self.pools.iter().find(|k| k.name == name))
    }
}

/// How the picture is drawn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Style {
    /// ANSI colours, underline and bold.
    pub colour: bool,
    /// The columns to fit in.
    pub width: usize,
}

/// One cell's text and its SGR attributes.
struct Cell {
    text: String,
    sgr: Vec<u8>,
}

impl Cell {
    fn paint(&self, colour: bool, width: usize) -> String {
        let pad = " ".repeat(width.saturating_sub(self.text.chars().count()));
        if colour && !self.sgr.is_empty() {
            let codes: Vec<String> = self.sgr.iter().map(u8::to_string).collect();
            format!("\x1b[{}m{}\x1b[0m{pad}", codes.join(";"), self.text)
        } else {
            format!("{}{pad}", self.text)
        }
    }
}

/// What a thread is drawn as: `[d4]*` is CPU 4 of the pool lettered d, isolated (brackets),
/// held by an assignment (`*`). When some CPU on the host is isolated, the others get a space
/// where the bracket would be, so the letters line up.
fn thread_cell(map: &HostMap, t: &Thread, brackets: bool) -> Cell {
    let key = map.key(t.pool.as_deref());
    let isolated = t.isolated_partition || t.kernel_isolated;
    let (open, close) = match (brackets, isolated) {
        (false, _) => ("", ""),
        (true, true) => ("[", "]"),
        (true, false) => (" ", " "),
    };
    let letter = key.map_or('-', |k| k.letter);
    let held = if t.assignment.is_some() { "*" } else { "" };
    let text = format!("{open}{letter}{}{close}{held}", t.cpu).trim_end().to_owned();
    let mut sgr = vec![key.map_or(39, |k| sgr(k.colour))];
    if isolated {
        sgr.push(4);
    }
    if t.assignment.is_some() {
        sgr.push(1);
    }
    Cell { text, sgr }
}

/// Lays cells out as a grid: one column per core, one row per thread, as many columns per
/// line as `style.width` takes, each column `col` wide; blocks after the first are set off
/// by an empty line when there is more than one row, so a row is never read as the next
/// core's.
fn grid(out: &mut String, columns: &[Vec<Cell>], col: usize, style: Style) {
    const INDENT: &str = "  ";
    let per_line = ((style.width.saturating_sub(INDENT.len()) + 1) / (col + 1)).max(1);
    let rows = columns.iter().map(Vec::len).max().unwrap_or(0);
    for (i, chunk) in columns.chunks(per_line).enumerate() {
        if i > 0 && rows > 1 {
            out.push('\n');
        }
        for r in 0..rows {
            let cells: Vec<String> = chunk
                .iter()
                .map(|c| c.get(r).map_or_else(|| " ".repeat(col), |cell| cell.paint(style.colour, col)))
                .collect();
            out.push_str(INDENT);
            out.push_str(cells.join(" ").trim_end());
            out.push('\n');
        }
    }
}

/// Wraps `items` (joined by `sep`) into lines of at most `width` columns, the first after
/// `first` and the rest after `indent`.
fn wrap(first: &str, indent: usize, items: &[String], sep: &str, width: usize) -> String {
    let mut out = first.to_owned();
    let mut line_len = first.chars().count();
    for (i, item) in items.iter().enumerate() {
        let piece = if i + 1 < items.len() { format!("{item}{sep}") } else { item.clone() };
        let len = piece.trim_end().chars().count();
        if line_len + len > width && line_len > indent {
            out = out.trim_end().to_owned();
            out.push('\n');
            out.push_str(&" ".repeat(indent));
            line_len = indent;
        }
        out.push_str(&piece);
        line_len += piece.chars().count();
    }
    out.trim_end().to_owned() + "\n"
}

fn plural(n: usize, one: &str) -> String {
    if n == 1 {
        format!("1 {one}")
    } else {
        format!("{n} {one}s")
    }
}

/// The picture.
pub fn render(map: &HostMap, style: Style) -> String {
    let threads: Vec<&Thread> = map
        .packages
        .iter()
        .flat_map(|p| &p.nodes)
        .flat_map(|n| &n.l3_groups)
        .flat_map(|l| &l.cores)
        .flat_map(|c| &c.threads)
        .collect();
    let brackets = threads.iter().any(|t| t.isolated_partition || t.kernel_isolated);
    let mut out = summary(map, threads.len());
    grids(&mut out, map, &threads, brackets, style);
    legend(&mut out, map, style);
    marks(&mut out, map, brackets, style);
    held(&mut out, map);
    out
}

/// The first line: how many CPUs, packages, NUMA nodes, L3 groups and cores.
fn summary(map: &HostMap, online: usize) -> String {
    let nodes: BTreeSet<u32> = map.packages.iter().flat_map(|p| &p.nodes).map(|n| n.node).collect();
    let l3s = map.packages.iter().flat_map(|p| &p.nodes).flat_map(|n| &n.l3_groups).count();
    let cores =
        map.packages.iter().flat_map(|p| &p.nodes).flat_map(|n| &n.l3_groups).flat_map(|l| &l.cores).count();
    format!(
        "{} online{}: {}, {}, {}, {}\n",
        plural(online, "CPU"),
        if map.offline.is_empty() { String::new() } else { format!(", {} offline", map.offline.len()) },
        plural(map.packages.len(), "package"),
        plural(nodes.len(), "NUMA node"),
        plural(l3s, "L3 group"),
        plural(cores, "core"),
    )
}

/// One grid per L3 group (a column per core, a row per thread), then the offline CPUs.
fn grids(out: &mut String, map: &HostMap, threads: &[&Thread], brackets: bool, style: Style) {
    // One column width for the whole host, so grids line up from group to group.
    let offline_cells: Vec<Cell> =
        map.offline.iter().map(|cpu| Cell { text: format!("x{cpu}"), sgr: vec![2] }).collect();
    let col = threads
        .iter()
        .map(|t| thread_cell(map, t, brackets).text.chars().count())
        .chain(offline_cells.iter().map(|c| c.text.chars().count()))
        .max()
        .unwrap_or(1);
    for p in &map.packages {
        for n in &p.nodes {
            for l in &n.l3_groups {
                let count: usize = l.cores.iter().map(|c| c.threads.len()).sum();
                out.push_str(&format!(
                    "\npackage {} / node {} / L3 {}: {}, {}\n",
                    p.package,
                    n.node,
                    l.l3,
                    plural(l.cores.len(), "core"),
                    plural(count, "CPU")
                ));
                let columns: Vec<Vec<Cell>> = l
                    .cores
                    .iter()
                    .map(|c| c.threads.iter().map(|t| thread_cell(map, t, brackets)).collect())
                    .collect();
                grid(out, &columns, col, style);
            }
        }
    }
    if !offline_cells.is_empty() {
        out.push_str("\noffline (the kernel gives no place for an offline CPU)\n");
        let columns: Vec<Vec<Cell>> = offline_cells.into_iter().map(|c| vec![c]).collect();
        grid(out, &columns, col, style);
    }
}

/// The pools: letter, name, kind, colour and CPUs, wrapped within the width.
fn legend(out: &mut String, map: &HostMap, style: Style) {
    out.push_str("\npools\n");
    let name_w = map.pools.iter().map(|k| k.name.chars().count()).max().unwrap_or(0);
    let kinds: Vec<String> = map
        .pools
        .iter()
        .map(|k| match (k.isolated, k.partition.as_str()) {
            (false, _) => k.kind.clone(),
            (true, "") => format!("{}, isolated", k.kind),
            (true, word) => format!("{}, {word}", k.kind),
        })
        .collect();
    let kind_w = kinds.iter().map(|k| k.chars().count()).max().unwrap_or(0);
    let colour_w = map.pools.iter().map(|k| k.colour.len()).max().unwrap_or(0);
    for (k, kind) in map.pools.iter().zip(&kinds) {
        let letter = Cell { text: k.letter.to_string(), sgr: vec![sgr(k.colour)] }.paint(style.colour, 1);
        let lead = format!("  {letter}  {:<name_w$}  {kind:<kind_w$}  {:<colour_w$}  ", k.name, k.colour);
        let indent = 2 + 1 + 2 + name_w + 2 + kind_w + 2 + colour_w + 2;
        let items: Vec<String> = k.cpus.split(',').map(str::to_owned).collect();
        let items = if k.cpus.is_empty() { vec!["-".to_owned()] } else { items };
        // The lead's escape codes take no columns: wrap on its visible width.
        let visible = indent;
        let wrapped = wrap(&" ".repeat(visible), indent, &items, ",", style.width);
        out.push_str(&lead);
        out.push_str(&wrapped[visible..]);
    }
}

/// The marks this picture uses, and the CPUs the kernel isolates (`isolcpus=`).
fn marks(out: &mut String, map: &HostMap, brackets: bool, style: Style) {
    // Only the marks this picture uses.
    let marks = [
        (brackets, "[d4]", vec![4], "isolated: in an isolated partition, or by the kernel (isolcpus=)"),
        (!map.held.is_empty(), "d4*", vec![1], "held by an exclusive assignment (listed below)"),
        (!map.offline.is_empty(), "x15", vec![2], "offline"),
    ];
    if marks.iter().any(|m| m.0) {
        out.push_str("\nmarks\n");
    }
    for (_, text, codes, what) in marks.into_iter().filter(|m| m.0) {
        let sample = Cell { text: text.to_owned(), sgr: codes }.paint(style.colour, 4);
        out.push_str(&format!("  {sample}  {what}\n"));
    }
    if !map.kernel_isolated.is_empty() {
        let items: Vec<String> = map.kernel_isolated.iter().map(u32::to_string).collect();
        out.push_str(&wrap("  isolcpus=: ", 12, &items, ",", style.width));
    }
}

/// The exclusive assignments and the CPUs they hold.
fn held(out: &mut String, map: &HostMap) {
    out.push('\n');
    if map.held.is_empty() {
        out.push_str("no exclusive CPUs held\n");
    } else {
        out.push_str("held exclusive CPUs\n");
        let mut t = Table::new(&[
            ("ID", Align::Left),
            ("POOL", Align::Left),
            ("CPUS", Align::Left),
            ("TARGET", Align::Left),
        ]);
        for h in &map.held {
            t.row(vec![h.id.clone(), h.pool.clone(), h.cpus.clone(), h.target.clone()]);
        }
        for line in t.render().lines() {
            out.push_str("  ");
            out.push_str(line);
            out.push('\n');
        }
    }
}

#[cfg(test)]
mod tests;
