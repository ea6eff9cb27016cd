//! The sandbox's interrupts: a procfs-shaped tree of plain files under `DIR/proc`, and the
//! kernel's part in writes to it.
//!
//! Laid out as the kernel shows it (Documentation/core-api/irq/irq-affinity.rst, proc(5)):
//!
//! ```text
//! DIR/proc/interrupts                    header of CPUn columns (the online CPUs), one row per IRQ
//! DIR/proc/irq/default_smp_affinity      hex mask
//! DIR/proc/irq/N/smp_affinity            hex mask
//! DIR/proc/irq/N/smp_affinity_list       CPU list
//! DIR/proc/irq/N/effective_affinity_list CPU list: where it is delivered (one CPU, as on x86)
//! DIR/proc/irq/N/node                    NUMA node
//! DIR/proc/irq/N/sim_managed             only in the sandbox: marks a managed IRQ (see below)
//! ```
//!
//! Plain files cannot refuse a write, and a real kernel decides the effective affinity itself.
//! [`SimIrqs`], the twin of [`crate::host::irq::HostIrqs`], plays the kernel for the writes
//! [`IrqFs`] makes: a write to an IRQ marked `sim_managed` fails with `EIO`, as the kernel's
//! refusal of a managed interrupt does; a mask without an online CPU fails with `EINVAL`;
//! otherwise the list is written (through [`Root`], as on a host) and `smp_affinity` and
//! `effective_affinity_list` follow it. The daemon never reads `sim_managed`: it learns that
//! an IRQ is managed only from the refused write, as it does on a host. Rewriting a file by
//! hand (a test playing an administrator or irqbalance) bypasses this model, as writing on a
//! host bypasses nothing; the daemon's next check reads what the file holds.
#![deny(missing_docs)]

use std::io;
use std::path::Path;

use crate::core::cpuset::CpuSet;
use crate::host::fsutil::Root;
#[cfg(doc)]
use crate::host::irq::IrqFs;
use crate::host::irq::{format_mask, IrqKernel};

/// The simulated kernel's part in a write to an IRQ's affinity (module docs).
#[derive(Debug, Clone, Copy)]
pub struct SimIrqs;

impl IrqKernel for SimIrqs {
    fn write_affinity(&self, procfs_root: &Path, irq_dir: &Path, irq: u32, cpus: &CpuSet) -> io::Result<()> {
        write_affinity(procfs_root, irq_dir, irq, cpus)
    }
}

/// One simulated interrupt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimIrq {
    /// Its number.
    pub irq: u32,
    /// `chip hwirq-trigger name` as /proc/interrupts shows after the counts.
    pub desc: String,
    /// Whether the kernel places it itself (writes are refused).
    pub managed: bool,
    /// Its affinity (a managed one's is the kernel's choice).
    pub affinity: CpuSet,
}

/// The IRQs of the sandbox's simulated host with `online` CPUs: legacy and virtio devices that
/// may be moved, the timer and two NVMe queues that the kernel places itself.
pub fn default_irqs(online: &CpuSet) -> Vec<SimIrq> {
    let all = online.clone();
    let one = |n: usize| {
        online.iter().nth(n % online.len().max(1)).map(|c| CpuSet::range(c, c)).unwrap_or_default()
    };
    let irq = |irq, desc: &str, managed, affinity| SimIrq { irq, desc: desc.to_owned(), managed, affinity };
    vec![
        irq(0, "IO-APIC   2-edge      timer", true, one(0)),
        irq(1, "IO-APIC   1-edge      i8042", false, all.clone()),
        irq(8, "IO-APIC   8-edge      rtc0", false, all.clone()),
        irq(9, "IO-APIC   9-fasteoi   acpi", false, all.clone()),
        irq(24, "PCI-MSI 49152-edge      virtio0-config", false, all.clone()),
        irq(25, "PCI-MSI 49153-edge      virtio0-input.0", false, all.clone()),
        irq(26, "PCI-MSI 49154-edge      virtio0-output.0", false, all.clone()),
        irq(32, "PCI-MSI 65536-edge      virtio1-requests", false, all.clone()),
        irq(40, "PCI-MSIX-0000:00:04.0 0-edge      nvme0q0", false, all),
        irq(41, "PCI-MSIX-0000:00:04.0 1-edge      nvme0q1", true, one(1)),
        irq(42, "PCI-MSIX-0000:00:04.0 2-edge      nvme0q2", true, one(2)),
    ]
}

/// Writes the tree under `root` (the sandbox's `proc/`) for `online` CPUs with `irqs`.
pub fn write_procfs(root: &Path, online: &CpuSet, irqs: &[SimIrq]) -> io::Result<()> {
    let width = online.last().map_or(1, |l| l as usize / 4 + 1);
    std::fs::create_dir_all(root.join("irq"))?;
    std::fs::write(root.join("irq/default_smp_affinity"), format!("{}\n", format_mask(online, width)))?;
    let mut table: String = online.iter().map(|c| format!("{:>11}", format!("CPU{c}"))).collect();
    table.insert_str(0, "    ");
    table.push('\n');
    for i in irqs {
        let dir = root.join(format!("irq/{}", i.irq));
        std::fs::create_dir_all(&dir)?;
        std::fs::write(dir.join("smp_affinity"), format!("{}\n", format_mask(&i.affinity, width)))?;
        std::fs::write(dir.join("smp_affinity_list"), format!("{}\n", i.affinity))?;
        let eff = i.affinity.first().map(|c| CpuSet::range(c, c)).unwrap_or_default();
        std::fs::write(dir.join("effective_affinity_list"), format!("{eff}\n"))?;
        std::fs::write(dir.join("node"), "0\n")?;
        if i.managed {
            std::fs::write(dir.join("sim_managed"), "")?;
        }
        table.push_str(&format!("{:>4}:", i.irq));
        for _ in online.iter() {
            table.push_str(&format!(" {:>10}", 0));
        }
        table.push_str(&format!("   {}\n", i.desc));
    }
    std::fs::write(root.join("interrupts"), table)
}

/// The online CPUs: the `CPUn` columns of `interrupts`, as the kernel prints them.
fn online(root: &Path) -> io::Result<CpuSet> {
    let text = std::fs::read_to_string(root.join("interrupts"))?;
    let mut set = CpuSet::new();
    for col in text.lines().next().unwrap_or_default().split_whitespace() {
        if let Some(c) = col.strip_prefix("CPU").and_then(|n| n.parse().ok()) {
            set.insert(c);
        }
    }
    Ok(set)
}

/// The kernel's part in writing `cpus` to IRQ `irq`'s `smp_affinity_list` in `irq_dir`
/// (module docs); the online CPUs come from `root`'s `interrupts`.
pub fn write_affinity(root: &Path, irq_dir: &Path, irq: u32, cpus: &CpuSet) -> io::Result<()> {
    let dir = irq.to_string();
    let fs = Root::new(irq_dir);
    if !fs.exists(&dir) {
        return Err(io::Error::from_raw_os_error(nix::libc::ENOENT));
    }
    if fs.exists(format!("{dir}/sim_managed")) {
        return Err(io::Error::from_raw_os_error(nix::libc::EIO));
    }
    let online = online(root)?;
    let Some(target) = cpus.intersection(&online).first() else {
        return Err(io::Error::from_raw_os_error(nix::libc::EINVAL));
    };
    let width = online.last().map_or(1, |l| l as usize / 4 + 1);
    let put = |rel: String, data: String| fs.write(rel, data.as_bytes()).map_err(|e| e.source);
    put(format!("{dir}/smp_affinity_list"), format!("{cpus}\n"))?;
    put(format!("{dir}/smp_affinity"), format!("{}\n", format_mask(cpus, width)))?;
    // The kernel moves the vector at the next interrupt; the sandbox has no interrupts, so
    // the move is taken as done at once.
    put(format!("{dir}/effective_affinity_list"), format!("{target}\n"))
}

#[cfg(test)]
mod fake_procfs_tests {
    use super::*;
    use crate::host::irq::{irq_dir, IrqError, IrqFs};
    use crate::host::IoError;

    /// The sandbox's model of the kernel (sim::irq) behind the same calls as on a host.
    #[test]
    fn fake_procfs_managed_irq_refuses_and_a_mask_without_online_cpus_fails() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let online = CpuSet::range(0, 3);
        write_procfs(dir.path(), &online, &default_irqs(&online)).unwrap_or_else(|e| panic!("{e}"));
        let fs = IrqFs::new(dir.path(), irq_dir(dir.path(), &dir.path().join("run")))
            .with_kernel(super::super::KERNEL);
        assert_eq!(fs.dir(), dir.path().join("irq"));
        let cpus = CpuSet::range(0, 1);
        assert!(matches!(fs.set_affinity(41, &cpus), Err(IrqError::KernelPlaced { irq: 41 })));
        fs.set_affinity(32, &cpus).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(fs.affinity(32).ok(), Some(cpus.clone()));
        assert_eq!(fs.effective(32).ok().flatten(), Some(CpuSet::range(0, 0)));
        let offline = CpuSet::range(8, 9);
        match fs.set_affinity(32, &offline) {
            Err(e @ IrqError::Io(IoError::Write { .. })) => {
                assert!(e.to_string().contains("writing `8-9`"), "{e}")
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(fs.affinity(32).ok(), Some(cpus.clone()), "a refused write changes nothing");
        fs.set_default_affinity(&cpus).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(fs.default_affinity().ok(), Some(cpus));
        assert_eq!(fs.names().unwrap_or_default()[&32], ["virtio1-requests"]);
        assert_eq!(fs.irqs().unwrap_or_default(), [0, 1, 8, 9, 24, 25, 26, 32, 40, 41, 42]);
        // A service's writable binding of irq/ is preferred where it exists.
        std::fs::create_dir_all(dir.path().join("run/irq")).unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(dir.path().join("run/irq/default_smp_affinity"), "f\n")
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(irq_dir(dir.path(), &dir.path().join("run")), dir.path().join("run/irq"));
    }
}
