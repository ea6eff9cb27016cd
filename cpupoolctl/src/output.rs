//! Printing results: aligned tables and `key: value` blocks for people, JSON for scripts.
//!
//! Every function here is pure (values in, text out), so the exact output is unit-tested.
//! The JSON documents mirror the varlink replies' parameters (`{"pools": [..]}`,
//! `{"assignment": {..}}`, ...), whichever transport answered, so the IDL documents them.

use serde_json::{json, Value};

use cpupool_wire::views::{Assignment, ClassSetting, Event, Isolation, Pool, Status, Topology};

/// Column alignment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Align {
    /// Text.
    Left,
    /// Numbers.
    Right,
}

/// A table with a header row; columns as wide as their widest cell, two spaces apart.
pub struct Table {
    headers: Vec<(&'static str, Align)>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table with these columns.
    pub fn new(headers: &[(&'static str, Align)]) -> Table {
        Table { headers: headers.to_vec(), rows: Vec::new() }
    }

    /// Adds a row (one cell per column).
    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    /// The table, each line ending in a newline and without trailing spaces.
    pub fn render(&self) -> String {
        let header: Vec<String> = self.headers.iter().map(|(h, _)| (*h).to_owned()).collect();
        let all: Vec<&Vec<String>> = std::iter::once(&header).chain(&self.rows).collect();
        let widths: Vec<usize> = (0..self.headers.len())
            .map(|i| all.iter().map(|r| r.get(i).map_or(0, |c| c.chars().count())).max().unwrap_or(0))
            .collect();
        let mut out = String::new();
        for row in all {
            let mut line = String::new();
            for (i, (_, align)) in self.headers.iter().enumerate() {
                let cell = row.get(i).map(String::as_str).unwrap_or("");
                if i > 0 {
                    line.push_str("  ");
                }
                let pad = widths[i].saturating_sub(cell.chars().count());
                match align {
                    Align::Left => {
                        line.push_str(cell);
                        line.push_str(&" ".repeat(pad));
                    }
                    Align::Right => {
                        line.push_str(&" ".repeat(pad));
                        line.push_str(cell);
                    }
                }
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }
}

/// `key: value` lines with the values aligned, however many parts of a command's output
/// feed them: `status` and `pool show` each print one, so their columns line up alike.
#[derive(Debug, Default)]
pub struct Fields(Vec<(String, String)>);

impl Fields {
    /// Adds a line.
    pub fn add(&mut self, key: impl Into<String>, value: impl Into<String>) {
        self.0.push((key.into(), value.into()));
    }

    /// The lines, each value two spaces after the longest `key:`.
    pub fn render(&self) -> String {
        let width = self.0.iter().map(|(k, _)| k.chars().count() + 1).max().unwrap_or(0);
        self.0
            .iter()
            .map(|(k, v)| format!("{:<width$}  {v}\n", format!("{k}:")).replace(" \n", "\n"))
            .collect()
    }
}

/// One aligned block of `pairs`.
fn block(pairs: &[(&str, String)]) -> String {
    let mut f = Fields::default();
    for (k, v) in pairs {
        f.add(*k, v.clone());
    }
    f.render()
}

/// Millicpus as people read them: `1500m`.
pub fn millicpus(m: u64) -> String {
    format!("{m}m")
}

fn yes_no(b: bool) -> String {
    if b { "yes" } else { "no" }.to_owned()
}

/// An empty CPU list, shown as a dash so the columns stay readable.
fn cpus(list: &str) -> String {
    if list.is_empty() {
        "-".to_owned()
    } else {
        list.to_owned()
    }
}

/// Seconds as `2d 3h 4m 5s`, leaving out leading zero units.
pub fn duration(secs: u64) -> String {
    let (d, h, m, s) = (secs / 86400, secs / 3600 % 24, secs / 60 % 60, secs % 60);
    let parts = [(d, "d"), (h, "h"), (m, "m"), (s, "s")];
    let first = parts.iter().position(|(n, _)| *n > 0).unwrap_or(3);
    parts[first..].iter().map(|(n, u)| format!("{n}{u}")).collect::<Vec<_>>().join(" ")
}

/// `pool list`.
pub fn pools(pools: &[Pool]) -> String {
    use Align::{Left, Right};
    let mut t = Table::new(&[
        ("NAME", Left),
        ("KIND", Left),
        ("CPUS", Left),
        ("FREE CPUS", Left),
        ("FREE", Right),
        ("CAPACITY", Right),
        ("ISOLATED", Left),
        ("ASSIGNMENTS", Right),
    ]);
    for p in pools {
        t.row(vec![
            p.name.clone(),
            p.kind.clone(),
            cpus(&p.cpus),
            cpus(&p.free_cpus),
            millicpus(p.free_millicpus),
            millicpus(p.capacity_millicpus),
            isolation(p),
            p.assignments.to_string(),
        ]);
    }
    t.render()
}

/// `pool create`, `pool resize`.
pub fn pool(p: &Pool) -> String {
    pool_fields(p).render()
}

fn pool_fields(p: &Pool) -> Fields {
    let mut f = Fields::default();
    f.add("name", p.name.clone());
    f.add("kind", p.kind.clone());
    f.add("cpus", cpus(&p.cpus));
    f.add("free cpus", cpus(&p.free_cpus));
    f.add("free", format!("{} of {}", millicpus(p.free_millicpus), millicpus(p.capacity_millicpus)));
    f.add("isolated", isolation(p));
    f.add("assignments", p.assignments.to_string());
    f
}

/// `no`, or what the kernel says of the isolated partition (`isolated`, `isolated invalid
/// (...)`): a pool that asked for isolation but did not get it shows why.
fn isolation(p: &Pool) -> String {
    match (p.isolated, p.partition.as_str()) {
        (false, _) => yes_no(false),
        (true, "") => yes_no(true),
        (true, kernel) => kernel.to_owned(),
    }
}

/// `assignments`.
pub fn assignments(list: &[Assignment], pool: Option<&str>) -> String {
    if list.is_empty() {
        return match pool {
            Some(p) => format!("no assignments in pool `{p}`\n"),
            None => "no assignments\n".to_owned(),
        };
    }
    use Align::{Left, Right};
    // The CONTAINER column only when some assignment serves a kubelet container.
    let containers = list.iter().any(|a| !a.container.is_empty());
    let mut headers = vec![
        ("ID", Left),
        ("POOL", Left),
        ("CPUS", Left),
        ("MILLICPUS", Right),
        ("STATE", Left),
        ("TARGET", Left),
    ];
    if containers {
        headers.push(("CONTAINER", Left));
    }
    let mut t = Table::new(&headers);
    for a in list {
        let mut row = vec![
            a.id.clone(),
            a.pool.clone(),
            cpus(&a.cpus),
            millicpus(a.millicpus),
            a.state.clone(),
            a.target.clone(),
        ];
        if containers {
            row.push(a.container.clone());
        }
        t.row(row);
    }
    let mut out = t.render();
    for a in list.iter().filter(|a| !a.reason.is_empty()) {
        out.push_str(&format!("{} is {}: {}\n", a.id, a.state, a.reason));
    }
    out
}

/// `pool show`: the pool, why its degraded assignments are, its isolation and its classes, in
/// one aligned block (the classes listed under it).
pub fn pool_show(p: &Pool, list: &[Assignment], iso: &Isolation, classes: &[ClassSetting]) -> String {
    let mut f = pool_fields(p);
    for a in list.iter().filter(|a| a.state == "degraded") {
        f.add("degraded", format!("assignment {} ({}): {}", a.id, a.target, a.reason));
    }
    isolation_fields(iso, false, &mut f);
    noise_fields(iso, &mut f);
    f.render() + &class_lines(classes)
}

/// `isolation boot-line`: the line, or nothing without isolated pools.
pub fn boot_line(iso: &Isolation) -> String {
    if iso.boot_line.is_empty() {
        String::new()
    } else {
        format!("{}\n", iso.boot_line)
    }
}

/// `isolation boot-line --json`.
pub fn boot_line_json(iso: &Isolation) -> Value {
    let pools: Vec<Value> =
        iso.pools.iter().map(|p| json!({"pool": p.pool, "cpus": p.cpus, "boot": p.boot})).collect();
    json!({
        "boot_line": iso.boot_line,
        "boot_unused": iso.boot_unused,
        "kernel": {"isolcpus": iso.isolcpus, "nohz_full": iso.nohz_full, "rcu_nocbs": iso.rcu_nocbs},
        "pools": pools,
    })
}

/// What the running kernel's boot isolation leaves undone: `(pool dp, nohz_full= misses 2-3)`,
/// `(boot, CPUs 6 are isolated at boot but in no isolated pool)`.
pub fn boot_problems(iso: &Isolation) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = iso
        .pools
        .iter()
        .filter(|p| !p.boot.is_empty() && p.boot != "covered")
        .map(|p| (format!("pool {}", p.pool), p.boot.clone()))
        .collect();
    if !iso.boot_unused.is_empty() {
        out.push((
            "boot".into(),
            format!("CPUs {} are isolated at boot but in no isolated pool", iso.boot_unused),
        ));
    }
    out
}

/// A rate as people read it: whole numbers from 10 up, one decimal below.
fn rate(r: f64) -> String {
    if r >= 10.0 {
        format!("{r:.0}")
    } else {
        format!("{r:.1}")
    }
}

/// `pool show`'s lines of what still interrupts each isolated CPU: `noise cpu 3: timer:LOC
/// 230/s, softirq:RCU 78/s` (busiest first, zeros left out; `none` when all are zero), and
/// whether the kernel's boot isolation covers the pool.
fn noise_fields(iso: &Isolation, f: &mut Fields) {
    for p in &iso.pools {
        for c in p.per_cpu.iter().filter(|c| !c.noise.is_empty()) {
            f.add(format!("noise cpu {}", c.cpu), noise_text(&c.noise, usize::MAX));
        }
        if !p.boot.is_empty() {
            let hint = if p.boot == "covered" { "" } else { " (cpupoolctl isolation boot-line)" };
            f.add("boot", format!("{}{hint}", p.boot));
        }
    }
}

/// What still interrupts a CPU, busiest source first, at most `most` of them: `timer:LOC 230/s,
/// softirq:RCU 78/s` (zeros left out; `none` when all are zero). For `pool show` and `top`.
pub(crate) fn noise_text(noise: &[cpupool_wire::views::Noise], most: usize) -> String {
    let mut busy: Vec<_> = noise.iter().filter(|n| n.per_sec > 0.0).collect();
    busy.sort_by(|a, b| b.per_sec.total_cmp(&a.per_sec).then_with(|| a.source.cmp(&b.source)));
    let text: Vec<String> =
        busy.iter().take(most).map(|n| format!("{} {}/s", n.source, rate(n.per_sec))).collect();
    if text.is_empty() {
        "none".to_owned()
    } else {
        text.join(", ")
    }
}

/// `isolation: holds` per isolated pool (`isolation dp: ...` when `named`, for `status`).
fn isolation_fields(iso: &Isolation, named: bool, f: &mut Fields) {
    for (i, p) in iso.pools.iter().enumerate() {
        f.add(
            if named { format!("isolation {}", p.pool) } else { "isolation".to_owned() },
            p.summary.clone(),
        );
        // One system-wide figure: said once in `status`.
        if !named || i == 0 {
            for (k, v) in [("irqs", &p.irqs), ("kernel threads", &p.kthreads)] {
                if !v.is_empty() {
                    f.add(k, v.clone());
                }
            }
        }
    }
}

/// `pool assign`.
pub fn assignment(a: &Assignment) -> String {
    block(
        &[
            ("id", a.id.clone()),
            ("pool", a.pool.clone()),
            ("cpus", cpus(&a.cpus)),
            ("millicpus", millicpus(a.millicpus)),
            ("target", a.target.clone()),
            (
                "state",
                if a.reason.is_empty() { a.state.clone() } else { format!("{}: {}", a.state, a.reason) },
            ),
        ]
        .into_iter()
        .chain((!a.container.is_empty()).then(|| ("container", a.container.clone())))
        .collect::<Vec<_>>(),
    )
}

/// `pool release`.
pub fn released(a: &Assignment) -> String {
    format!(
        "released `{}`: pool {}, CPUs {}, {}, {}\n",
        a.id,
        a.pool,
        cpus(&a.cpus),
        millicpus(a.millicpus),
        a.target
    )
}

/// `pool delete`.
pub fn deleted(name: &str) -> String {
    format!("deleted pool `{name}`; its CPUs joined the reserved pool\n")
}

/// `reload`: what changed and which file overrides what (the daemon's summary; an older
/// daemon gives none).
pub fn reloaded(r: &cpupool_wire::views::Reloaded) -> String {
    let summary = match (r.summary.as_str(), r.changed) {
        ("", true) => "applied",
        ("", false) => "nothing changed",
        (s, _) => s,
    };
    if r.changed {
        format!("configuration reloaded and applied: {summary}\n")
    } else {
        format!("configuration reloaded: {summary}\n")
    }
}

/// `topology`.
pub fn topology(t: &Topology) -> String {
    let mut out =
        block(&[("online", cpus(&t.online)), ("offline", cpus(&t.offline)), ("isolated", cpus(&t.isolated))]);
    out.push('\n');
    let mut table = Table::new(&[
        ("CPU", Align::Right),
        ("CORE", Align::Right),
        ("PACKAGE", Align::Right),
        ("DIE", Align::Right),
        ("NODE", Align::Right),
        ("L3", Align::Right),
    ]);
    for c in &t.cpus {
        table.row([c.cpu, c.core, c.package, c.die, c.node, c.l3].iter().map(u32::to_string).collect());
    }
    out.push_str(&table.render());
    out
}

/// `status`: the daemon, which classes are in force, and the isolation of every isolated pool,
/// in one aligned block.
pub fn status(s: &Status, classes: &[ClassSetting], iso: &Isolation) -> String {
    let mut f = Fields::default();
    for (k, v) in status_pairs(s) {
        f.add(k, v);
    }
    f.add("classes", classes_in_force(classes));
    isolation_fields(iso, true, &mut f);
    f.render()
}

fn status_pairs(s: &Status) -> Vec<(&'static str, String)> {
    let mut pairs = vec![
        ("version", s.version.clone()),
        ("uptime", duration(s.uptime_seconds)),
        ("pools", s.pools.to_string()),
        ("assignments", s.assignments.to_string()),
        ("state file", s.state_file.clone()),
        (
            "enforcement",
            match s.degraded_assignments {
                0 => "every assignment enforced as assigned".to_owned(),
                1 => "1 assignment degraded (`cpupoolctl assignments` says why)".to_owned(),
                n => format!("{n} assignments degraded (`cpupoolctl assignments` says why)"),
            },
        ),
        (
            "configuration",
            match &s.config_error {
                None => "running as on disk".to_owned(),
                Some(e) => format!("NOT the one on disk: {e}"),
            },
        ),
    ];
    if let Some(c) = &s.containers {
        pairs.push(("containers", c.clone()));
    }
    pairs
}

/// One `monitor` line.
pub fn event(e: &Event) -> String {
    let subject = e.pool.as_deref().or(e.id.as_deref()).unwrap_or("-");
    format!("{:<10}  {:<20}  {}\n", e.kind, subject, e.change.as_deref().unwrap_or("-")).replace("  \n", "\n")
}

/// The `--json` document of `pool list`.
pub fn pools_json(pools: &[Pool]) -> Value {
    json!({ "pools": pools })
}

/// The `--json` document of `pool show`, `create`, `resize`.
pub fn pool_json(pool: &Pool) -> Value {
    json!({ "pool": pool })
}

/// The `--json` document of `pool show`: the pool, its class settings, and for an isolated pool
/// its isolation as `GetIsolation` gives it (the interruptions by source per CPU, the boot
/// coverage).
pub fn pool_show_json(pool: &Pool, classes: &[ClassSetting], iso: &Isolation) -> Value {
    let mut v = json!({ "pool": pool, "classes": classes });
    if let (Some(o), Some(i)) = (v.as_object_mut(), iso.pools.iter().find(|i| i.pool == pool.name)) {
        o.insert("isolation".into(), json!(i));
    }
    v
}

/// The `--json` document of `status`: its fields and every class setting.
pub fn status_json(s: &Status, classes: &[ClassSetting]) -> Value {
    let mut v = json!(s);
    if let Some(o) = v.as_object_mut() {
        o.insert("classes".into(), json!(classes));
    }
    v
}

/// `pool show`'s `classes:` section: one line per configured key, `cache.l3 = 50%: applied
/// (0fc0 in cpupool-dp)`; nothing when the pool has none.
pub fn class_lines(classes: &[ClassSetting]) -> String {
    if classes.is_empty() {
        return String::new();
    }
    let mut out = "classes:\n".to_owned();
    for c in classes {
        let mut line = format!("  {}.{} = {}: {}", c.class, c.key, c.wanted, c.state);
        if !c.reason.is_empty() {
            line.push_str(&format!(": {}", c.reason));
        }
        match (c.in_force.is_empty(), c.scope.is_empty()) {
            (false, false) => line.push_str(&format!(" ({} in {})", c.in_force, c.scope)),
            (false, true) => line.push_str(&format!(" ({})", c.in_force)),
            (true, false) => line.push_str(&format!(" ({})", c.scope)),
            (true, true) => {}
        }
        out.push_str(&line);
        out.push('\n');
    }
    out
}

/// The value of `status`' `classes:` line: which classes of which pools are in force, `dp
/// cache, web power (1 of 3 degraded)`, or `none`.
pub fn classes_in_force(classes: &[ClassSetting]) -> String {
    let mut groups: Vec<(String, String, usize, usize, usize)> = Vec::new();
    for c in classes {
        let i = match groups.iter().position(|g| g.0 == c.pool && g.1 == c.class) {
            Some(i) => i,
            None => {
                groups.push((c.pool.clone(), c.class.clone(), 0, 0, 0));
                groups.len() - 1
            }
        };
        let g = &mut groups[i];
        g.2 += 1;
        match c.state.as_str() {
            "applied" => {}
            "unsupported" => g.4 += 1,
            _ => g.3 += 1,
        }
    }
    let said: Vec<String> = groups
        .iter()
        .map(|(pool, class, n, degraded, unsupported)| {
            let mut bad = Vec::new();
            if *degraded > 0 {
                bad.push(format!("{degraded} of {n} degraded"));
            }
            if *unsupported > 0 {
                bad.push(format!("{unsupported} of {n} unsupported"));
            }
            match bad.is_empty() {
                true => format!("{pool} {class}"),
                false => format!("{pool} {class} ({})", bad.join(", ")),
            }
        })
        .collect();
    if said.is_empty() {
        "none".to_owned()
    } else {
        said.join(", ")
    }
}

/// The `--json` document of `assignments`.
pub fn assignments_json(list: &[Assignment]) -> Value {
    json!({ "assignments": list })
}

/// The `--json` document of `pool assign` and `pool release`.
pub fn assignment_json(a: &Assignment) -> Value {
    json!({ "assignment": a })
}

#[cfg(test)]
mod tests;
