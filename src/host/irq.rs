//! Interrupt affinity: `/proc/irq/N/{smp_affinity_list,effective_affinity_list}`,
//! `/proc/irq/default_smp_affinity` and the names in `/proc/interrupts`, below a procfs root
//! given by the caller (`/proc` on a host, `DIR/proc` in the sandbox).
//!
//! Formats (Documentation/core-api/irq/irq-affinity.rst, proc(5)):
//! - `smp_affinity_list` and `effective_affinity_list`: the kernel list syntax (`0-1,4`);
//! - `default_smp_affinity` (and `smp_affinity`): a hex mask in comma-separated 32-bit groups,
//!   most significant first (`ffffffff,ffffffff`);
//! - `/proc/interrupts`: a header of `CPUn` columns, then one row per interrupt: `N:`, one count
//!   per CPU column, the chip, for most chips the hardware IRQ and trigger (`49152-edge`), and
//!   the action names joined by `, `.
//!
//! The kernel refuses a write to the affinity of an IRQ it places itself (managed interrupts of
//! multi-queue devices, the timer on x86) with `EIO`: that is [`IrqError::KernelPlaced`],
//! reported, never a failure.
//!
//! The kernel's part in a write to an affinity is an [`IrqKernel`]: the host's ([`HostIrqs`])
//! writes the file and procfs answers; a simulated kernel (the sandbox's, `crate::sim::irq`)
//! plays procfs on a tree of plain files. It is chosen once at start
//! ([`super::kernel::Kernel`]); the daemon's own path (reads, the write, the read-back) is the
//! same on both.
#![deny(missing_docs)]

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};

use super::fsutil::Root;
use super::IoError;
use crate::core::cpuset::CpuSet;

/// Why an IRQ file could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum IrqError {
    /// Reading or writing failed.
    #[error(transparent)]
    Io(#[from] IoError),
    /// A file held something that is not in the kernel's format.
    #[error("`{}` holds `{text}`, not a CPU list or mask", path.display())]
    Format {
        /// The file.
        path: PathBuf,
        /// What it held.
        text: String,
    },
    /// The kernel places this IRQ itself (a managed interrupt): it refused the write with EIO.
    #[error("IRQ {irq} is placed by the kernel (managed): writing its affinity was refused")]
    KernelPlaced {
        /// The IRQ.
        irq: u32,
    },
}

/// The IRQ files: `interrupts` below a procfs root, the affinities in an `irq/` directory.
#[derive(Debug, Clone)]
pub struct IrqFs {
    root: PathBuf,
    /// procfs's `irq/`, or where it is bound writable (see [`irq_dir`]).
    irq_dir: PathBuf,
    /// The kernel's part in a write.
    kernel: &'static dyn IrqKernel,
}

/// The kernel's part in a write to an IRQ's affinity: it takes the list, or refuses it with the
/// kernel's error (`EIO`, `EPERM`: it places the IRQ itself; `EINVAL`: no online CPU).
pub trait IrqKernel: Send + Sync + std::fmt::Debug {
    /// Writes `cpus` to IRQ `irq`'s `smp_affinity_list` in `irq_dir`; the kernel's
    /// `interrupts` is below `procfs_root`.
    fn write_affinity(&self, procfs_root: &Path, irq_dir: &Path, irq: u32, cpus: &CpuSet) -> io::Result<()>;
}

/// The host's kernel: the list is written (through [`Root`], which follows no link) and procfs
/// answers.
#[derive(Debug, Clone, Copy)]
pub struct HostIrqs;

impl IrqKernel for HostIrqs {
    fn write_affinity(&self, _procfs_root: &Path, irq_dir: &Path, irq: u32, cpus: &CpuSet) -> io::Result<()> {
        Root::new(irq_dir)
            .write(format!("{irq}/smp_affinity_list"), format!("{cpus}\n").as_bytes())
            .map_err(|e| e.source)
    }
}

/// Where the IRQ affinities are written: `<runtime_dir>/irq` when the service manager bound
/// procfs's `irq/` there (cpupoold.service does, `BindPaths=/proc/irq:/run/cpupoold/irq`,
/// because `ProtectKernelTunables=yes` makes `/proc/irq` itself read-only and a
/// `ReadWritePaths=/proc/irq` loses to it), else `<procfs_root>/irq`.
pub fn irq_dir(procfs_root: &Path, runtime_dir: &Path) -> PathBuf {
    let bound = runtime_dir.join("irq");
    if bound.join("default_smp_affinity").exists() {
        bound
    } else {
        procfs_root.join("irq")
    }
}

impl IrqFs {
    /// The IRQ files of the host's kernel: `interrupts` below `procfs_root` (normally
    /// `/proc`), affinities in `irq_dir` (normally `/proc/irq`).
    pub fn new(procfs_root: impl Into<PathBuf>, irq_dir: impl Into<PathBuf>) -> IrqFs {
        IrqFs { root: procfs_root.into(), irq_dir: irq_dir.into(), kernel: &HostIrqs }
    }

    /// The same files, answered by `part`, the chosen kernel's part in this surface
    /// ([`Kernel`](super::kernel::Kernel) bundles the parts and hands each over, `with_kernel`).
    pub fn answered_by(self, part: &'static dyn IrqKernel) -> IrqFs {
        IrqFs { kernel: part, ..self }
    }

    /// The affinity directory.
    pub fn dir(&self) -> &Path {
        &self.irq_dir
    }

    fn fs(&self) -> Root {
        Root::new(&self.irq_dir)
    }

    /// Whether the kernel offers IRQ affinity here at all (`irq/` exists).
    pub fn available(&self) -> bool {
        self.irq_dir.is_dir()
    }

    /// The IRQ numbers with an affinity file, in order.
    pub fn irqs(&self) -> Result<Vec<u32>, IrqError> {
        let dir = self.irq_dir.clone();
        let read = |source| IrqError::Io(IoError::Read { path: dir.clone(), source });
        let mut out = Vec::new();
        for entry in std::fs::read_dir(&dir).map_err(read)? {
            let entry = entry.map_err(read)?;
            let Some(n) = entry.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
            if entry.path().join("smp_affinity_list").exists() {
                out.push(n);
            }
        }
        out.sort_unstable();
        Ok(out)
    }

    /// Each numbered IRQ's action names from `/proc/interrupts`.
    pub fn names(&self) -> Result<BTreeMap<u32, Vec<String>>, IrqError> {
        let path = self.root.join("interrupts");
        let text = Root::new(&self.root)
            .read_to_string("interrupts")
            .map_err(|e| IrqError::Io(IoError::Read { path, source: e.source }))?;
        Ok(parse_interrupt_names(&text))
    }

    /// Each numbered IRQ's counts per CPU from `/proc/interrupts`.
    pub fn counts(&self) -> Result<BTreeMap<u32, BTreeMap<u32, u64>>, IrqError> {
        let path = self.root.join("interrupts");
        let text = Root::new(&self.root)
            .read_to_string("interrupts")
            .map_err(|e| IrqError::Io(IoError::Read { path, source: e.source }))?;
        Ok(crate::core::housekeeping::parse_interrupts(&text)
            .into_iter()
            .filter_map(|(label, line)| Some((label.parse().ok()?, line.counts)))
            .collect())
    }

    fn read_list(&self, rel: &str) -> Result<CpuSet, IrqError> {
        let path = self.root.join(rel);
        let text = self
            .fs()
            .read_to_string(rel)
            .map_err(|e| IrqError::Io(IoError::Read { path: path.clone(), source: e.source }))?;
        CpuSet::parse(text.trim()).map_err(|_| IrqError::Format { path, text: text.trim().to_owned() })
    }

    /// IRQ `irq`'s affinity as set (`smp_affinity_list`).
    pub fn affinity(&self, irq: u32) -> Result<CpuSet, IrqError> {
        self.read_list(&format!("{irq}/smp_affinity_list"))
    }

    /// Where the kernel delivers IRQ `irq` now (`effective_affinity_list`); `None` where the
    /// architecture has no such file.
    pub fn effective(&self, irq: u32) -> Result<Option<CpuSet>, IrqError> {
        let rel = format!("{irq}/effective_affinity_list");
        match self.read_list(&rel) {
            Ok(c) => Ok(Some(c)),
            Err(IrqError::Io(IoError::Read { source, .. })) if source.kind() == io::ErrorKind::NotFound => {
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// Writes IRQ `irq`'s affinity; `EIO` or `EPERM` from the kernel is [`IrqError::KernelPlaced`].
    pub fn set_affinity(&self, irq: u32, cpus: &CpuSet) -> Result<(), IrqError> {
        let rel = format!("{irq}/smp_affinity_list");
        let data = cpus.to_string();
        match self.kernel.write_affinity(&self.root, &self.irq_dir, irq, cpus) {
            Ok(()) => Ok(()),
            // EIO: the kernel lets no one place it (managed, or not movable at all); EPERM: the
            // interrupt chip refused this IRQ's move (seen in the guest for the timer, the cascade
            // and managed virtio queues when their old affinity is written back). Either way the
            // kernel keeps it where it is, and nothing of ours is on it to restore.
            Err(e) if matches!(e.raw_os_error(), Some(nix::libc::EIO | nix::libc::EPERM)) => {
                Err(IrqError::KernelPlaced { irq })
            }
            Err(source) => Err(IrqError::Io(IoError::Write { path: self.irq_dir.join(rel), data, source })),
        }
    }

    /// Where the kernel puts new IRQs (`irq/default_smp_affinity`).
    pub fn default_affinity(&self) -> Result<CpuSet, IrqError> {
        let rel = "default_smp_affinity";
        let path = self.irq_dir.join(rel);
        let text = self
            .fs()
            .read_to_string(rel)
            .map_err(|e| IrqError::Io(IoError::Read { path: path.clone(), source: e.source }))?;
        parse_mask(text.trim()).ok_or_else(|| IrqError::Format { path, text: text.trim().to_owned() })
    }

    /// Sets where the kernel puts new IRQs, in the mask shape the file shows now (the kernel
    /// refuses a mask wider than its CPU count).
    pub fn set_default_affinity(&self, cpus: &CpuSet) -> Result<(), IrqError> {
        let rel = "default_smp_affinity";
        let path = self.irq_dir.join(rel);
        let now = self
            .fs()
            .read_to_string(rel)
            .map_err(|e| IrqError::Io(IoError::Read { path: path.clone(), source: e.source }))?;
        let data = format_mask(cpus, now.trim().chars().filter(char::is_ascii_hexdigit).count());
        self.fs()
            .write(rel, format!("{data}\n").as_bytes())
            .map_err(|e| IrqError::Io(IoError::Write { path, data, source: e.source }))
    }
}

/// Each numbered row's action names: the text after the per-CPU counts, the chip and (when
/// present) the `HWIRQ-TRIGGER` field, split at `, `.
pub fn parse_interrupt_names(text: &str) -> BTreeMap<u32, Vec<String>> {
    let mut lines = text.lines();
    let cpus = lines.next().map_or(0, |h| h.split_whitespace().count());
    let mut out = BTreeMap::new();
    for line in lines {
        let Some((label, rest)) = line.split_once(':') else { continue };
        let Ok(irq) = label.trim().parse::<u32>() else { continue };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let desc = fields.get(cpus..).unwrap_or_default();
        // The chip, then usually `HWIRQ-TRIGGER` (`1-edge`, `49152-edge`, `9-fasteoi`).
        let start = desc
            .iter()
            .position(|f| {
                f.rsplit_once('-').is_some_and(|(_, t)| matches!(t, "edge" | "level" | "fasteoi" | "simple"))
            })
            .map_or(desc.len().min(1), |i| i + 1);
        let names: Vec<String> = desc
            .get(start..)
            .unwrap_or_default()
            .join(" ")
            .split(", ")
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(ToOwned::to_owned)
            .collect();
        out.insert(irq, names);
    }
    out
}

/// A kernel hex mask (`ff,ffffffff`) as a set; `None` if it is not one.
pub fn parse_mask(text: &str) -> Option<CpuSet> {
    let digits: Vec<u32> =
        text.chars().filter(|c| *c != ',').map(|c| c.to_digit(16)).collect::<Option<_>>()?;
    if digits.is_empty() {
        return None;
    }
    let mut set = CpuSet::new();
    for (i, d) in digits.iter().rev().enumerate() {
        for bit in 0..4 {
            if d & (1 << bit) != 0 {
                let cpu = u32::try_from(i * 4 + bit).ok()?;
                if cpu > crate::core::cpuset::MAX_CPU {
                    return None;
                }
                set.insert(cpu);
            }
        }
    }
    Some(set)
}

/// `cpus` as a kernel hex mask of `width` hex digits (at least what `cpus` needs), grouped in
/// 32-bit groups from the right.
pub fn format_mask(cpus: &CpuSet, width: usize) -> String {
    let need = cpus.last().map_or(1, |l| l as usize / 4 + 1);
    let width = width.max(need);
    let mut digits: Vec<char> = (0..width)
        .map(|i| {
            let nibble = (0..4).fold(0u32, |acc, b| {
                let cpu = u32::try_from(i * 4 + b).unwrap_or(u32::MAX);
                acc | (u32::from(cpus.contains(cpu)) << b)
            });
            char::from_digit(nibble, 16).unwrap_or('0')
        })
        .collect();
    digits.reverse();
    let mut out = String::new();
    for (i, c) in digits.iter().enumerate() {
        if i > 0 && (width - i).is_multiple_of(8) {
            out.push(',');
        }
        out.push(*c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cpus(s: &str) -> CpuSet {
        CpuSet::parse(s).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn interrupt_names_in_the_kernels_layouts() {
        let text = "           CPU0       CPU1       CPU2       CPU3\n\
              0:         44          0          0          0   IO-APIC   2-edge      timer\n\
              1:          9          0          0          0   IO-APIC   1-edge      i8042\n\
              9:          0          0          0          0   IO-APIC   9-fasteoi   acpi\n\
             24:          0          0          0          0  PCI-MSIX-0000:00:03.0   0-edge      virtio0-config\n\
             32:        120       7100          0          0   PCI-MSI 49152-edge      virtio1-requests\n\
             40:          1          2          3          4   IO-APIC  16-fasteoi   ahci[0000:00:1f.2], snd_hda_intel\n\
            NMI:          0          0          0          0   Non-maskable interrupts\n\
            LOC:       1000       1000       1000       1000   Local timer interrupts\n";
        let names = parse_interrupt_names(text);
        assert_eq!(names[&0], ["timer"]);
        assert_eq!(names[&24], ["virtio0-config"]);
        assert_eq!(names[&32], ["virtio1-requests"]);
        assert_eq!(names[&40], ["ahci[0000:00:1f.2]", "snd_hda_intel"]);
        assert_eq!(names.len(), 6);
    }

    #[test]
    fn masks_both_ways() {
        assert_eq!(parse_mask("f"), Some(cpus("0-3")));
        assert_eq!(parse_mask("ffffffff,00000003"), Some(cpus("0-1,32-63")));
        assert_eq!(parse_mask("xyz"), None);
        assert_eq!(parse_mask(""), None);
        assert_eq!(format_mask(&cpus("0-1"), 1), "3");
        assert_eq!(format_mask(&cpus("0-1"), 4), "0003");
        assert_eq!(format_mask(&cpus("0-1,32-63"), 16), "ffffffff,00000003");
        assert_eq!(format_mask(&cpus("0-1"), 10), "00,00000003");
        for s in ["0", "0-1", "2-3,40", "5-70"] {
            let c = cpus(s);
            assert_eq!(parse_mask(&format_mask(&c, 0)), Some(c));
        }
    }
}
