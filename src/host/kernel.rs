//! Which kernel answers the daemon's writes: the host's, or a simulation of it (the sandbox's,
//! `crate::sim`), chosen once at start.
//!
//! Where the outcome of a write is the kernel's to decide (an IRQ's effective affinity, a
//! resctrl group's files, a kernel thread's affinity, a cgroup tree's effective CPUs), the host
//! module of that surface defines a small trait for the kernel's part and implements it for the
//! host's kernel beside the code that reads and writes the files. A [`Kernel`] bundles one
//! implementation of each. Data flow: the configuration's [`crate::config::Paths::kernel`] is
//! [`Kernel::HOST`] unless the sandbox replaced it (with the roots it points into its
//! directory); the daemon and the engine hand it to each host type they build
//! (`with_kernel`), which asks it for the kernel's part of every write and reads back the same
//! files either way. Production host code never names the simulation.
#![deny(missing_docs)]

use std::fmt;

use super::cgroupfs::{CgroupFs, CgroupKernel, HostCgroups};
use super::housekeeping::{HostKthreads, KthreadKernel, Kthreads};
use super::irq::{HostIrqs, IrqFs, IrqKernel};
use super::resctrl::{HostResctrl, Resctrl, ResctrlKernel};

/// One kernel's part in each surface (module docs).
#[derive(Clone, Copy)]
pub struct Kernel {
    /// `host` or what the simulation calls itself: for logs and equality.
    pub name: &'static str,
    /// A cgroup v2 tree.
    pub cgroups: &'static dyn CgroupKernel,
    /// IRQ affinities.
    pub irqs: &'static dyn IrqKernel,
    /// resctrl groups.
    pub resctrl: &'static dyn ResctrlKernel,
    /// Kernel threads' affinities.
    pub kthreads: &'static dyn KthreadKernel,
}

impl Kernel {
    /// The host's kernel: every write goes to the kernel's files, which answer themselves.
    pub const HOST: Kernel = Kernel {
        name: "host",
        cgroups: &HostCgroups,
        irqs: &HostIrqs,
        resctrl: &HostResctrl,
        kthreads: &HostKthreads,
    };
}

impl Default for Kernel {
    fn default() -> Kernel {
        Kernel::HOST
    }
}

impl fmt::Debug for Kernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Kernel({})", self.name)
    }
}

/// Two kernels are the same when they have the same name (there is one of each).
impl PartialEq for Kernel {
    fn eq(&self, other: &Kernel) -> bool {
        self.name == other.name
    }
}

impl Eq for Kernel {}

// Each surface takes its own part of a kernel; the bundle hands the parts over here, so the
// surfaces know only their own trait and not the bundle.

impl Kthreads {
    /// The same surface, answered by `kernel`'s part (chosen once at start).
    pub fn with_kernel(self, kernel: Kernel) -> Kthreads {
        self.answered_by(kernel.kthreads)
    }
}

impl Resctrl {
    /// The same surface, answered by `kernel`'s part (chosen once at start).
    pub fn with_kernel(self, kernel: Kernel) -> Resctrl {
        self.answered_by(kernel.resctrl)
    }
}

impl CgroupFs {
    /// The same surface, answered by `kernel`'s part (chosen once at start).
    pub fn with_kernel(self, kernel: Kernel) -> CgroupFs {
        self.answered_by(kernel.cgroups)
    }
}

impl IrqFs {
    /// The same surface, answered by `kernel`'s part (chosen once at start).
    pub fn with_kernel(self, kernel: Kernel) -> IrqFs {
        self.answered_by(kernel.irqs)
    }
}
