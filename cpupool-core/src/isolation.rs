//! Isolation planning: which interrupts must move off which CPUs, and where they go.
//!
//! Pure: the engine reads the IRQs the kernel lists (number, names, current affinity), asks
//! [`plan_irq`] what each should hold, and the host writes it. A pool's [`IrqMode`] says what
//! its CPUs take:
//! - `isolate`: no movable interrupt; IRQs whose affinity reaches them are displaced onto the
//!   sink (the daemon's `irq_cpus`, by default the reserved pool, plus every `sink` pool);
//! - `sink`: displaced interrupts (its CPUs join the sink);
//! - `none`: left as they are.
//!
//! An IRQ whose affinity already avoids every isolated CPU is left alone, so that irqbalance
//! (told the isolated CPUs as its banned list) may keep spreading interrupts over the rest.
//! A pool may claim IRQs by name (`irq_claim`, globs on the names /proc/interrupts shows):
//! those are set to exactly the pool's CPUs. When no pool isolates or claims an IRQ any more,
//! the affinity remembered from before the daemon first changed it is written back.
#![deny(missing_docs)]

use super::cpuset::CpuSet;

/// What a pool's CPUs take of the host's interrupts (`pools.NAME.irq`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IrqMode {
    /// No movable interrupt (the default of `isolate = true` pools).
    Isolate,
    /// Displaced interrupts.
    Sink,
    /// Left as they are (the default of other pools).
    None,
}

impl IrqMode {
    /// Parses the configuration's word; `None` for an unknown one.
    pub fn parse(s: &str) -> Option<IrqMode> {
        match s {
            "isolate" => Some(IrqMode::Isolate),
            "sink" => Some(IrqMode::Sink),
            "none" => Some(IrqMode::None),
            _ => None,
        }
    }

    /// The configuration's word.
    pub fn as_str(self) -> &'static str {
        match self {
            IrqMode::Isolate => "isolate",
            IrqMode::Sink => "sink",
            IrqMode::None => "none",
        }
    }
}

/// One pool as the IRQ plan sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IrqPool {
    /// The pool's name (for reports).
    pub name: String,
    /// Its CPUs now.
    pub cpus: CpuSet,
    /// What its CPUs take.
    pub mode: IrqMode,
    /// Globs on IRQ names whose interrupts go to exactly its CPUs.
    pub claims: Vec<String>,
}

/// Where interrupts may go, derived once per pass from the pools.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct IrqLayout {
    /// CPUs no movable interrupt may reach (the `isolate` pools' CPUs).
    pub isolated: CpuSet,
    /// Where displaced interrupts go (and new ones, through `default_smp_affinity`).
    pub sink: CpuSet,
    /// `(glob, pool, CPUs)` in pool-name order: the first match wins.
    pub claims: Vec<(String, String, CpuSet)>,
}

/// Why no layout can be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IsolationError {
    /// Nothing is left to take displaced interrupts.
    #[error(
        "no CPU is left to take the interrupts displaced from the isolated CPUs {isolated} (daemon.irq_cpus and the irq = \"sink\" pools give {sink})"
    )]
    NoSink {
        /// The isolated CPUs.
        isolated: String,
        /// The sink as configured, before the isolated CPUs were taken out.
        sink: String,
    },
}

/// The layout for `pools`, with displaced interrupts on `base_sink` (the daemon's `irq_cpus`,
/// or the reserved pool's CPUs) plus the `sink` pools, minus offline and isolated CPUs.
pub fn layout(pools: &[IrqPool], base_sink: &CpuSet, online: &CpuSet) -> Result<IrqLayout, IsolationError> {
    let mut isolated = CpuSet::new();
    let mut sink = base_sink.clone();
    let mut claims = Vec::new();
    for p in pools {
        match p.mode {
            IrqMode::Isolate => isolated = isolated.union(&p.cpus),
            IrqMode::Sink => sink = sink.union(&p.cpus),
            IrqMode::None => {}
        }
        for glob in &p.claims {
            claims.push((glob.clone(), p.name.clone(), p.cpus.clone()));
        }
    }
    let usable = sink.intersection(online).difference(&isolated);
    if !isolated.is_empty() && usable.is_empty() {
        return Err(IsolationError::NoSink { isolated: isolated.to_string(), sink: sink.to_string() });
    }
    Ok(IrqLayout { isolated, sink: usable, claims })
}

/// What one IRQ should get.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IrqWant {
    /// Nothing to do.
    Keep,
    /// Write these CPUs.
    Set(CpuSet),
    /// Write back the affinity it had before the daemon changed it.
    Restore,
}

/// What IRQ `names` (its action names in /proc/interrupts), whose affinity is `current`
/// (`None` when unreadable), should get under `layout`; `remembered` says whether the daemon
/// holds an affinity from before it changed this IRQ.
pub fn plan_irq(layout: &IrqLayout, names: &[String], current: Option<&CpuSet>, remembered: bool) -> IrqWant {
    if let Some((_, _, cpus)) = layout.claims.iter().find(|(g, _, _)| names.iter().any(|n| glob_match(g, n)))
    {
        return if current == Some(cpus) { IrqWant::Keep } else { IrqWant::Set(cpus.clone()) };
    }
    if !layout.isolated.is_empty() {
        return match current {
            Some(c) if !c.is_empty() && c.is_disjoint(&layout.isolated) => IrqWant::Keep,
            _ => IrqWant::Set(layout.sink.clone()),
        };
    }
    if remembered {
        IrqWant::Restore
    } else {
        IrqWant::Keep
    }
}

/// What `default_smp_affinity` (where the kernel puts new IRQs) should get: the sink while
/// anything is isolated, the remembered value otherwise.
pub fn plan_default(layout: &IrqLayout, current: Option<&CpuSet>, remembered: bool) -> IrqWant {
    if layout.isolated.is_empty() {
        return if remembered { IrqWant::Restore } else { IrqWant::Keep };
    }
    match current {
        Some(c) if !c.is_empty() && c.is_disjoint(&layout.isolated) => IrqWant::Keep,
        _ => IrqWant::Set(layout.sink.clone()),
    }
}

/// Shell-style glob: `*` any run of characters, `?` one character, everything else itself.
pub fn glob_match(pattern: &str, name: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let n: Vec<char> = name.chars().collect();
    // Iterative matching with one backtrack point (the last `*`): linear in practice, and
    // never exponential on patterns such as `a*a*a*b`.
    let (mut pi, mut ni) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ni < n.len() {
        match p.get(pi) {
            Some('*') => {
                star = Some((pi, ni));
                pi += 1;
            }
            Some(c) if *c == '?' || *c == n[ni] => {
                pi += 1;
                ni += 1;
            }
            _ => match star {
                Some((sp, sn)) => {
                    pi = sp + 1;
                    ni = sn + 1;
                    star = Some((sp, sn + 1));
                }
                None => return false,
            },
        }
    }
    p[pi..].iter().all(|c| *c == '*')
}

/// Checks a claim glob from the configuration: not empty, printable.
pub fn check_glob(glob: &str) -> Result<(), String> {
    if glob.is_empty() {
        return Err("an empty glob matches no IRQ name".into());
    }
    if glob.chars().any(char::is_control) {
        return Err(format!("`{}` holds control characters", glob.escape_debug()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cpus(s: &str) -> CpuSet {
        CpuSet::parse(s).unwrap_or_else(|e| panic!("{e}"))
    }

    fn pool(name: &str, c: &str, mode: IrqMode, claims: &[&str]) -> IrqPool {
        IrqPool {
            name: name.into(),
            cpus: cpus(c),
            mode,
            claims: claims.iter().map(|s| s.to_string()).collect(),
        }
    }

    fn names(n: &[&str]) -> Vec<String> {
        n.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn displaced_irqs_go_to_the_sink_and_others_stay() {
        let pools = [pool("dp", "2-3", IrqMode::Isolate, &[]), pool("web", "4-7", IrqMode::None, &[])];
        let l = layout(&pools, &cpus("0-1"), &cpus("0-7")).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(l.isolated, cpus("2-3"));
        assert_eq!(l.sink, cpus("0-1"));
        let v = names(&["virtio1-requests"]);
        assert_eq!(plan_irq(&l, &v, Some(&cpus("0-7")), false), IrqWant::Set(cpus("0-1")));
        assert_eq!(plan_irq(&l, &v, Some(&cpus("3")), false), IrqWant::Set(cpus("0-1")));
        // Already off the isolated CPUs (irqbalance's choice, say): left alone.
        assert_eq!(plan_irq(&l, &v, Some(&cpus("5")), true), IrqWant::Keep);
        assert_eq!(plan_irq(&l, &v, None, false), IrqWant::Set(cpus("0-1")));
        assert_eq!(plan_default(&l, Some(&cpus("0-7")), false), IrqWant::Set(cpus("0-1")));
    }

    #[test]
    fn without_isolation_remembered_irqs_are_restored() {
        let pools = [pool("dp", "2-3", IrqMode::None, &[])];
        let l = layout(&pools, &cpus("0-1"), &cpus("0-7")).unwrap_or_else(|e| panic!("{e}"));
        let v = names(&["eth0"]);
        assert_eq!(plan_irq(&l, &v, Some(&cpus("0-1")), true), IrqWant::Restore);
        assert_eq!(plan_irq(&l, &v, Some(&cpus("0-1")), false), IrqWant::Keep);
        assert_eq!(plan_default(&l, Some(&cpus("0-1")), true), IrqWant::Restore);
        assert_eq!(plan_default(&l, Some(&cpus("0-1")), false), IrqWant::Keep);
    }

    #[test]
    fn claims_put_irqs_on_the_claiming_pool() {
        let pools = [pool("dp", "2-3", IrqMode::Isolate, &["eth0-rx-*"])];
        let l = layout(&pools, &cpus("0-1"), &cpus("0-7")).unwrap_or_else(|e| panic!("{e}"));
        let rx = names(&["eth0-rx-1"]);
        assert_eq!(plan_irq(&l, &rx, Some(&cpus("0-7")), false), IrqWant::Set(cpus("2-3")));
        assert_eq!(plan_irq(&l, &rx, Some(&cpus("2-3")), false), IrqWant::Keep);
        assert_eq!(plan_irq(&l, &names(&["eth0-tx-1"]), Some(&cpus("2")), false), IrqWant::Set(cpus("0-1")));
    }

    #[test]
    fn sink_pools_join_the_sink_and_isolated_cpus_leave_it() {
        let pools = [pool("dp", "1-3", IrqMode::Isolate, &[]), pool("io", "6-7", IrqMode::Sink, &[])];
        let l = layout(&pools, &cpus("0-1"), &cpus("0-7")).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(l.sink, cpus("0,6-7"));
    }

    #[test]
    fn no_sink_left_is_an_error() {
        let pools = [pool("dp", "0-3", IrqMode::Isolate, &[])];
        let e = layout(&pools, &cpus("0-1"), &cpus("0-3")).err();
        assert!(matches!(e, Some(IsolationError::NoSink { .. })), "{e:?}");
        // Offline sink CPUs do not count.
        let pools = [pool("dp", "2-3", IrqMode::Isolate, &[])];
        assert!(layout(&pools, &cpus("4"), &cpus("0-3")).is_err());
    }

    #[test]
    fn globs() {
        assert!(glob_match("virtio*-requests", "virtio1-requests"));
        assert!(glob_match("eth?", "eth0"));
        assert!(!glob_match("eth?", "eth10"));
        assert!(glob_match("*", ""));
        assert!(glob_match("a*a*a*b", "aaaaaaaaaaaaaaaaab"));
        assert!(!glob_match("a*a*a*b", "aaaaaaaaaaaaaaaaaa"));
        assert!(check_glob("").is_err());
        assert_eq!(IrqMode::parse("sink"), Some(IrqMode::Sink));
        assert_eq!(IrqMode::parse("isolated"), None);
    }
}
