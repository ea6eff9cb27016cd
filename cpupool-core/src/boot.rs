//! The kernel's boot-time isolation, checked against the isolated pools, decided without I/O.
//!
//! Data flow: the host reads `/proc/cmdline` and sysfs's `devices/system/cpu/{nohz_full,isolated}`
//! (the daemon's `host::housekeeping::read_kernel`) and hands the text here. [`parse_cmdline`] reads
//! `isolcpus=` (with its flags), `nohz_full=` and `rcu_nocbs=`; [`Coverage::of`] says, for
//! the CPUs of an isolated pool, which of the boot-only parameters leave some of them out, and
//! [`unused`] which CPUs the kernel isolates at boot that no isolated pool uses; [`boot_line`]
//! is the command line that would cover the isolated pools.
//!
//! Why these parameters: what still interrupts an isolated partition's busy CPU is the tick
//! and RCU callbacks, which only `nohz_full=` and `rcu_nocbs=` stop, and managed device
//! interrupts, whose affinity userspace cannot change, which only `isolcpus=managed_irq` keeps
//! off. `isolcpus=`'s default flag, `domain`, is left out on purpose: the cpuset partitions
//! cpupoold makes already take the CPUs out of the scheduler's domains at run time, and the
//! kernel lets a CPU isolated with `domain` at boot be in no partition but an isolated one
//! (cgroup-v2's `cpuset.cpus.partition`), so such a CPU could never again join a shared or
//! exclusive pool without a reboot. Giving `isolcpus=` a flag turns its default off.
#![deny(missing_docs)]

use super::cpuset::CpuSet;

/// What the kernel was told at boot to keep off CPUs (`/proc/cmdline`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BootIsolation {
    /// `isolcpus=`'s CPUs.
    pub isolcpus: CpuSet,
    /// `isolcpus=`'s flags (`domain`, `managed_irq`, `nohz`) as given; none means `domain`.
    pub isolcpus_flags: Vec<String>,
    /// `nohz_full=`.
    pub nohz_full: CpuSet,
    /// `rcu_nocbs=`.
    pub rcu_nocbs: CpuSet,
    /// Isolation words whose CPU list was not understood (`rcu_nocbs=all`), as written: they
    /// are reported, never taken to cover anything.
    pub unread: Vec<String>,
}

impl BootIsolation {
    /// Whether `isolcpus=` has `flag`; without flags the kernel takes `domain`.
    pub fn isolcpus_has(&self, flag: &str) -> bool {
        if self.isolcpus_flags.is_empty() {
            return flag == "domain";
        }
        self.isolcpus_flags.iter().any(|f| f == flag)
    }
}

/// Reads `isolcpus=`, `nohz_full=` and `rcu_nocbs=` from a kernel command line. A value that
/// is not a CPU list is kept in [`BootIsolation::unread`] rather than fatal.
pub fn parse_cmdline(cmdline: &str) -> BootIsolation {
    let mut boot = BootIsolation::default();
    for word in cmdline.split_whitespace() {
        let Some((key, value)) = word.split_once('=') else { continue };
        // `isolcpus=[flag,...,]cpu-list`: flags are words, the list starts at a digit.
        let (list, flags): (Vec<&str>, Vec<&str>) = match key {
            "isolcpus" => value.split(',').partition(|t| t.starts_with(|c: char| c.is_ascii_digit())),
            "nohz_full" | "rcu_nocbs" => (vec![value], Vec::new()),
            _ => continue,
        };
        let cpus = match CpuSet::parse(&list.join(",")) {
            Ok(cpus) if !cpus.is_empty() => cpus,
            _ => {
                boot.unread.push(word.to_owned());
                continue;
            }
        };
        let set = match key {
            "isolcpus" => {
                for f in flags {
                    if !boot.isolcpus_flags.iter().any(|g| g == f) {
                        boot.isolcpus_flags.push(f.to_owned());
                    }
                }
                &mut boot.isolcpus
            }
            "nohz_full" => &mut boot.nohz_full,
            _ => &mut boot.rcu_nocbs,
        };
        *set = set.union(&cpus);
    }
    boot
}

/// A boot parameter that removes a source of interruptions no run-time setting removes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Param {
    /// `nohz_full=`: stops the tick on a CPU running one task.
    NohzFull,
    /// `rcu_nocbs=`: runs RCU callbacks on other CPUs (`nohz_full=` implies it).
    RcuNocbs,
    /// `isolcpus=managed_irq`: keeps managed device interrupts off.
    ManagedIrq,
}

impl Param {
    /// Every parameter, in command-line order.
    pub const ALL: [Param; 3] = [Param::NohzFull, Param::RcuNocbs, Param::ManagedIrq];

    /// As written on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            Param::NohzFull => "nohz_full",
            Param::RcuNocbs => "rcu_nocbs",
            Param::ManagedIrq => "isolcpus=managed_irq",
        }
    }

    /// The CPUs the kernel covers with this parameter: the command line, and for `nohz_full`
    /// also sysfs's `nohz_full` (`sysfs_nohz`), what the kernel took of it. `isolcpus=nohz`
    /// counts as `nohz_full=`, and the kernel offloads RCU callbacks of `nohz_full=` CPUs.
    pub fn covers(self, boot: &BootIsolation, sysfs_nohz: &CpuSet) -> CpuSet {
        let mut nohz = boot.nohz_full.union(sysfs_nohz);
        if boot.isolcpus_has("nohz") {
            nohz = nohz.union(&boot.isolcpus);
        }
        match self {
            Param::NohzFull => nohz,
            Param::RcuNocbs => boot.rcu_nocbs.union(&nohz),
            Param::ManagedIrq if boot.isolcpus_has("managed_irq") => boot.isolcpus.clone(),
            Param::ManagedIrq => CpuSet::new(),
        }
    }
}

/// Which CPUs of one isolated pool each boot parameter leaves out.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Coverage {
    /// The parameters that leave CPUs out, with those CPUs; empty when the pool is covered.
    pub missing: Vec<(Param, CpuSet)>,
}

impl Coverage {
    /// The coverage of `cpus` by the kernel's boot isolation.
    pub fn of(cpus: &CpuSet, boot: &BootIsolation, sysfs_nohz: &CpuSet) -> Coverage {
        let missing = Param::ALL
            .into_iter()
            .map(|p| (p, cpus.difference(&p.covers(boot, sysfs_nohz))))
            .filter(|(_, left)| !left.is_empty())
            .collect();
        Coverage { missing }
    }

    /// `covered`, or `nohz_full= misses 2-3; rcu_nocbs= misses 2-3`.
    pub fn summary(&self) -> String {
        if self.missing.is_empty() {
            return "covered".to_owned();
        }
        let word = |p: Param| {
            if p == Param::ManagedIrq {
                p.as_str().to_owned()
            } else {
                format!("{}=", p.as_str())
            }
        };
        self.missing.iter().map(|(p, c)| format!("{} misses {c}", word(*p))).collect::<Vec<_>>().join("; ")
    }
}

/// The CPUs the kernel isolates at boot (any of the parameters, `isolcpus=` with any flag, and
/// sysfs's `isolated` and `nohz_full`) that no isolated pool uses (`isolated`): they pay for
/// isolation, such as the lost tick, and gain nothing; with `isolcpus=domain` they can only
/// ever be in an isolated partition.
pub fn unused(
    boot: &BootIsolation,
    sysfs_nohz: &CpuSet,
    sysfs_isolated: &CpuSet,
    isolated: &CpuSet,
) -> CpuSet {
    Param::ALL
        .into_iter()
        .fold(boot.isolcpus.union(sysfs_isolated), |a, p| a.union(&p.covers(boot, sysfs_nohz)))
        .difference(isolated)
}

/// What the daemon logs of the boot isolation, one line each: every isolated pool (`pools`:
/// name and CPUs) that the boot parameters do not cover, with the line that would, and the
/// CPUs isolated at boot that no isolated pool uses; empty when there is nothing to say.
pub fn problems<'a>(
    pools: impl IntoIterator<Item = (&'a str, &'a CpuSet)>,
    boot: &BootIsolation,
    sysfs_nohz: &CpuSet,
    sysfs_isolated: &CpuSet,
) -> Vec<String> {
    let mut out = Vec::new();
    let mut isolated = CpuSet::new();
    for (name, cpus) in pools {
        isolated = isolated.union(cpus);
        let c = Coverage::of(cpus, boot, sysfs_nohz);
        if !c.missing.is_empty() {
            out.push(format!(
                "isolated pool {name} ({cpus}): {}; the tick, RCU callbacks or managed interrupts stay on its CPUs until a reboot with `{}` (cpupoolctl isolation boot-line)",
                c.summary(),
                boot_line(cpus)
            ));
        }
    }
    let left = unused(boot, sysfs_nohz, sysfs_isolated, &isolated);
    if !left.is_empty() {
        out.push(format!(
            "CPUs {left} are isolated at boot (isolcpus=/nohz_full=/rcu_nocbs=) but in no isolated pool"
        ));
    }
    for word in &boot.unread {
        out.push(format!(
            "`{word}` on the kernel command line is not a CPU list cpupoold reads; it is not counted"
        ));
    }
    out
}

/// The kernel command line that covers the `isolated` CPUs (module docs say why these
/// words); empty without isolated CPUs.
pub fn boot_line(isolated: &CpuSet) -> String {
    if isolated.is_empty() {
        return String::new();
    }
    format!("nohz_full={isolated} rcu_nocbs={isolated} isolcpus=managed_irq,{isolated}")
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn set(s: &str) -> CpuSet {
        CpuSet::parse(s).unwrap_or_else(|e| panic!("{e}"))
    }

    /// A Debian 12 guest booted the way the last column was: as `/proc/cmdline` shows it.
    const CMDLINE: &str =
        "BOOT_IMAGE=/boot/vmlinuz-6.12.0-0.deb12.1-amd64 root=UUID=0b8f4b5e-9c1e-4f7a-8d0e-2f3c4d5e6f70 \
        ro console=ttyS0 nohz_full=2-3 rcu_nocbs=2-3 tsc=reliable isolcpus=managed_irq,domain,2-3 quiet\n";

    #[test]
    fn cmdline_reads_the_three_parameters_and_isolcpus_flags() {
        let b = parse_cmdline(CMDLINE);
        assert_eq!(b.isolcpus, set("2-3"));
        assert_eq!(b.isolcpus_flags, ["managed_irq", "domain"]);
        assert_eq!((b.nohz_full.clone(), b.rcu_nocbs.clone()), (set("2-3"), set("2-3")));
        assert!(b.unread.is_empty(), "{b:?}");
        assert!(b.isolcpus_has("domain") && b.isolcpus_has("managed_irq") && !b.isolcpus_has("nohz"));
        // Without flags the kernel takes `domain`; a flag turns that default off.
        let plain = parse_cmdline("isolcpus=1,3-4");
        assert_eq!(plain.isolcpus, set("1,3-4"));
        assert!(plain.isolcpus_has("domain") && !plain.isolcpus_has("managed_irq"));
        assert!(!parse_cmdline("isolcpus=managed_irq,2").isolcpus_has("domain"));
        // Not understood: reported, never covering.
        let odd = parse_cmdline("quiet isolcpus=nohz rcu_nocbs=all nohz_full=2-x rcu_nocbs");
        assert_eq!(odd.unread, ["isolcpus=nohz", "rcu_nocbs=all", "nohz_full=2-x"]);
        assert!(odd.isolcpus.is_empty() && odd.rcu_nocbs.is_empty() && odd.nohz_full.is_empty());
    }

    #[test]
    fn coverage_names_each_parameter_and_the_cpus_it_misses() {
        let none = BootIsolation::default();
        let c = Coverage::of(&set("2-3"), &none, &CpuSet::new());
        assert_eq!(
            c.summary(),
            "nohz_full= misses 2-3; rcu_nocbs= misses 2-3; isolcpus=managed_irq misses 2-3"
        );
        let b = parse_cmdline(CMDLINE);
        assert_eq!(Coverage::of(&set("2-3"), &b, &set("2-3")).summary(), "covered");
        // One more CPU in the pool than at boot.
        assert_eq!(
            Coverage::of(&set("2-4"), &b, &set("2-3")).missing,
            vec![(Param::NohzFull, set("4")), (Param::RcuNocbs, set("4")), (Param::ManagedIrq, set("4"))]
        );
        // nohz_full= alone offloads RCU too; sysfs counts where the command line is silent.
        let nohz = parse_cmdline("nohz_full=2-3");
        assert_eq!(
            Coverage::of(&set("2-3"), &nohz, &CpuSet::new()).missing,
            vec![(Param::ManagedIrq, set("2-3"))]
        );
        let sysfs_only = BootIsolation::default();
        assert_eq!(Param::RcuNocbs.covers(&sysfs_only, &set("3")), set("3"));
        assert_eq!(Param::NohzFull.covers(&parse_cmdline("isolcpus=nohz,5"), &CpuSet::new()), set("5"));
    }

    #[test]
    fn unused_is_what_boot_isolates_and_no_isolated_pool_uses() {
        let b = parse_cmdline(CMDLINE);
        assert_eq!(unused(&b, &set("2-3"), &set("2-3"), &set("2-3")), CpuSet::new());
        assert_eq!(unused(&b, &set("2-3"), &set("2-3"), &set("3")), set("2"));
        assert_eq!(
            unused(&parse_cmdline("isolcpus=6"), &CpuSet::new(), &set("7"), &CpuSet::new()),
            set("6-7")
        );
    }

    #[test]
    fn the_boot_line_leaves_out_isolcpus_domain() {
        assert_eq!(boot_line(&CpuSet::new()), "");
        let line = boot_line(&set("2-3,6"));
        assert_eq!(line, "nohz_full=2-3,6 rcu_nocbs=2-3,6 isolcpus=managed_irq,2-3,6");
        let b = parse_cmdline(&line);
        assert!(!b.isolcpus_has("domain"));
        assert_eq!(Coverage::of(&set("2-3,6"), &b, &CpuSet::new()).summary(), "covered");
    }

    #[test]
    fn problems_name_the_pool_the_parameters_and_the_unused_cpus() {
        let dp = set("2-3");
        let none = problems([("dp", &dp)], &BootIsolation::default(), &CpuSet::new(), &CpuSet::new());
        assert_eq!(none.len(), 1, "{none:?}");
        assert!(none[0].starts_with("isolated pool dp (2-3): nohz_full= misses 2-3;"), "{none:?}");
        assert!(none[0].contains("`nohz_full=2-3 rcu_nocbs=2-3 isolcpus=managed_irq,2-3`"), "{none:?}");
        let b = parse_cmdline(CMDLINE);
        assert!(problems([("dp", &dp)], &b, &dp, &dp).is_empty());
        let more =
            problems([("dp", &set("3"))], &parse_cmdline(&format!("{CMDLINE} rcu_nocbs=all")), &dp, &dp);
        assert_eq!(
            more,
            [
                "CPUs 2 are isolated at boot (isolcpus=/nohz_full=/rcu_nocbs=) but in no isolated pool",
                "`rcu_nocbs=all` on the kernel command line is not a CPU list cpupoold reads; it is not counted"
            ]
        );
    }

    proptest! {
        /// The line made for any set of isolated CPUs, read back as the kernel's command line,
        /// covers exactly them and leaves nothing unused.
        #[test]
        fn the_boot_line_covers_what_it_was_made_for(cpus in proptest::collection::btree_set(0u32..256, 1..40)) {
            let isolated: CpuSet = cpus.into_iter().collect();
            let b = parse_cmdline(&format!("ro quiet {}", boot_line(&isolated)));
            prop_assert!(b.unread.is_empty());
            prop_assert_eq!(Coverage::of(&isolated, &b, &CpuSet::new()).summary(), "covered");
            prop_assert_eq!(unused(&b, &CpuSet::new(), &CpuSet::new(), &isolated), CpuSet::new());
        }
    }
}
