//! The simulated kernel: what the sandbox (`cpupoold --sandbox DIR`), the tests and the benches
//! run the real daemon against, under one directory and without touching the host.
//!
//! Two halves:
//! - trees laid out as the kernel shows them, as plain files: sysfs, a cgroup2 root, procfs's
//!   counters ([`machine`]), interrupts ([`irq`]), kernel threads ([`kthreads`]), resctrl
//!   ([`resctrl`]), the power knobs ([`power`]);
//! - the kernel's part in the daemon's writes to them, as the twins of the host's:
//!   [`KERNEL`] implements each trait `crate::host` defines for a surface whose outcome the
//!   kernel decides ([`crate::host::kernel::Kernel`]), and [`cgroup::SimProcesses`] records
//!   processes' affinities instead of setting them.
//!
//! Data flow: the sandbox writes the trees once, points the configuration's roots into its
//! directory and puts [`KERNEL`] in `paths.kernel` (`crate::sandbox::Sandbox::confine`); the
//! daemon and the engine hand that kernel to every host type they build. The arrows point one
//! way: this module uses `crate::host`'s types and traits; production host code never names
//! it. It sits beside `host/` rather than inside the sandbox because the unit tests, the
//! integration tests and the benches use it without a sandbox.
#![deny(missing_docs)]

pub mod cgroup;
pub mod irq;
pub mod kthreads;
pub mod machine;
pub mod power;
pub mod resctrl;

use crate::host::kernel::Kernel;

/// The simulated kernel: each surface's twin.
pub const KERNEL: Kernel = Kernel {
    name: "simulated",
    cgroups: &cgroup::SimCgroups,
    irqs: &irq::SimIrqs,
    resctrl: &resctrl::SimResctrlKernel,
    kthreads: &kthreads::SimKthreads,
};

/// A cgroupfs backend on the simulated tree under `root`, with processes looked up under
/// `proc_root` and their affinities set for real: for tests whose processes are real.
pub fn cgroupfs(
    root: impl Into<std::path::PathBuf>,
    proc_root: impl Into<std::path::PathBuf>,
) -> crate::host::cgroupfs::CgroupFs {
    crate::host::cgroupfs::CgroupFs::new(root, proc_root).with_kernel(KERNEL)
}
