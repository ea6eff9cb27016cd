//! Resource control (Intel RDT, AMD PQoS) through the resctrl file system, below a root given
//! by the caller (`/sys/fs/resctrl` on a host, `DIR/resctrl` in the sandbox).
//!
//! Layout and formats (Documentation/arch/x86/resctrl.rst):
//! - `info/L3/{cbm_mask,shareable_bits}` hex, `info/L3/{min_cbm_bits,num_closids}` decimal,
//!   `info/L3/sparse_masks` (Linux 6.8+) `0` or `1`;
//! - `info/MB/{bandwidth_gran,min_bandwidth,num_closids}` decimal, `info/MB/delay_linear` `0`/`1`;
//! - `info/last_cmd_status`: the kernel's reason for the last refused write;
//! - a control group is a directory made with `mkdir`; the kernel fills it with `cpus`,
//!   `cpus_list`, `tasks`, `schemata`, `mode`, and `rmdir` gives its CPUs and tasks back to the
//!   default group (the root);
//! - `schemata`: one line per resource, `L3:<cache id>=<cbm>;<cache id>=<cbm>`,
//!   `MB:<domain>=<percent>`; the kernel shows the names padded and the values zero- or
//!   space-padded, and takes a write of some lines only (the others are kept). A write must end
//!   with a newline.
//!
//! The kernel's part (files appearing on `mkdir`, schemata checked and merged, CPUs moving
//! between groups) is a [`ResctrlKernel`]: the host's ([`HostResctrl`]) makes the call and the
//! file system answers; a simulated kernel (the sandbox's, `crate::sim::resctrl`) plays it on a
//! tree of plain files. It is chosen once at start ([`super::kernel::Kernel`]); the daemon's own
//! path (reads, writes, read-back) is the same.
#![deny(missing_docs)]

use std::io;
use std::path::{Path, PathBuf};

use super::fsutil::Root;
use super::IoError;
use crate::core::cache::{L3Info, MbInfo, ResctrlInfo};
use crate::core::cpuset::CpuSet;

/// Where resctrl is mounted on a host; the only place the daemon mounts it.
pub const DEFAULT_ROOT: &str = "/sys/fs/resctrl";

/// The prefix of the daemon's control groups: `cpupool-<pool>`.
pub const GROUP_PREFIX: &str = "cpupool-";

/// Why a resctrl file could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum ResctrlError {
    /// Reading failed.
    #[error(transparent)]
    Io(#[from] IoError),
    /// A file held something that is not in the kernel's format.
    #[error("`{}` holds `{text}`, not {what}", path.display())]
    Format {
        /// The file.
        path: PathBuf,
        /// What it held.
        text: String,
        /// What was expected.
        what: &'static str,
    },
    /// Writing failed; `status` is the kernel's `info/last_cmd_status` after it (the host's
    /// [`IoError::Write`], with the kernel's reason).
    #[error("writing `{}` to `{}`{}", data.trim_end().replace('\n', "\\n"), path.display(),
        if status.is_empty() { String::new() } else { format!(" (last_cmd_status: {status})") })]
    Write {
        /// The file.
        path: PathBuf,
        /// What was written.
        data: String,
        /// The kernel's reason, when it gave one.
        status: String,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// Creating or removing a control group failed.
    #[error("{op} the resctrl group `{}`", path.display())]
    Group {
        /// `creating` or `removing`.
        op: &'static str,
        /// The group's directory.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// Mounting resctrl failed.
    #[error("mounting resctrl on `{}`", path.display())]
    Mount {
        /// The mount point.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
}

/// The resctrl tree below one root.
#[derive(Debug, Clone)]
pub struct Resctrl {
    root: PathBuf,
    /// The kernel's part in the calls.
    kernel: &'static dyn ResctrlKernel,
}

/// The kernel's part in what the daemon does to a resctrl tree below `root`; an error is the
/// kernel's answer (`EINVAL` for a refused write, its reason in `info/last_cmd_status`).
pub trait ResctrlKernel: Send + Sync + std::fmt::Debug {
    /// `mkdir` of the control group `group`.
    fn create_group(&self, root: &Path, group: &str) -> io::Result<()>;
    /// `rmdir` of the control group `group`.
    fn remove_group(&self, root: &Path, group: &str) -> io::Result<()>;
    /// Writes `cpus` to `group`'s `cpus_list`.
    fn write_cpus(&self, root: &Path, group: &str, cpus: &CpuSet) -> io::Result<()>;
    /// Writes `lines` to `group`'s `schemata`.
    fn write_schemata(&self, root: &Path, group: &str, lines: &str) -> io::Result<()>;
}

/// The host's kernel: each call goes to the mounted resctrl (through [`Root`], which follows no
/// link), which answers.
#[derive(Debug, Clone, Copy)]
pub struct HostResctrl;

impl ResctrlKernel for HostResctrl {
    fn create_group(&self, root: &Path, group: &str) -> io::Result<()> {
        Root::new(root).create_dir(group, 0o755).map_err(|e| e.source)
    }
    fn remove_group(&self, root: &Path, group: &str) -> io::Result<()> {
        Root::new(root).remove_dir(group).map_err(|e| e.source)
    }
    fn write_cpus(&self, root: &Path, group: &str, cpus: &CpuSet) -> io::Result<()> {
        Root::new(root)
            .write(format!("{group}/cpus_list"), format!("{cpus}\n").as_bytes())
            .map_err(|e| e.source)
    }
    fn write_schemata(&self, root: &Path, group: &str, lines: &str) -> io::Result<()> {
        Root::new(root).write(format!("{group}/schemata"), lines.as_bytes()).map_err(|e| e.source)
    }
}

impl Resctrl {
    /// The tree below `root`, as the host's kernel answers it.
    pub fn new(root: impl Into<PathBuf>) -> Resctrl {
        Resctrl { root: root.into(), kernel: &HostResctrl }
    }

    /// The same tree, answered by `part`, the chosen kernel's part in this surface
    /// ([`Kernel`](super::kernel::Kernel) bundles the parts and hands each over, `with_kernel`).
    pub fn answered_by(self, part: &'static dyn ResctrlKernel) -> Resctrl {
        Resctrl { kernel: part, ..self }
    }

    /// The root.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Whether resctrl is there: its `info/` directory exists.
    pub fn mounted(&self) -> bool {
        self.root.join("info").is_dir()
    }

    /// Mounts resctrl on the root (which must exist).
    pub fn mount(&mut self) -> Result<(), ResctrlError> {
        nix::mount::mount(
            Some("resctrl"),
            &self.root,
            Some("resctrl"),
            nix::mount::MsFlags::empty(),
            None::<&str>,
        )
        .map_err(|e| ResctrlError::Mount { path: self.root.clone(), source: e.into() })
    }

    fn fs(&self) -> Root {
        Root::new(&self.root)
    }

    fn read(&self, rel: &str) -> Result<String, ResctrlError> {
        self.fs()
            .read_to_string(rel)
            .map_err(|e| ResctrlError::Io(IoError::Read { path: self.root.join(rel), source: e.source }))
    }

    fn number(&self, rel: &str, radix: u32) -> Result<u64, ResctrlError> {
        let text = self.read(rel)?;
        u64::from_str_radix(text.trim(), radix).map_err(|_| ResctrlError::Format {
            path: self.root.join(rel),
            text: text.trim().to_owned(),
            what: if radix == 16 { "a hexadecimal number" } else { "a number" },
        })
    }

    /// What the host offers: each resource from `info/`, or what is missing for it, and how
    /// many control groups are not the daemon's.
    pub fn info(&self) -> Result<ResctrlInfo, ResctrlError> {
        let schemata = crate::core::cache::parse_schemata(&self.read("schemata")?);
        let domains = |res: &str| schemata.get(res).map(|d| d.keys().copied().collect()).unwrap_or_default();
        let missing = |dir: &str, what: &str| {
            format!("no {what} (`{}` is missing)", self.root.join("info").join(dir).display())
        };
        let l3 = if self.root.join("info/L3").is_dir() {
            Ok(L3Info {
                cbm_mask: self.number("info/L3/cbm_mask", 16)?,
                min_cbm_bits: self.number("info/L3/min_cbm_bits", 10)? as u32,
                num_closids: self.number("info/L3/num_closids", 10)? as u32,
                shareable_bits: self.number("info/L3/shareable_bits", 16)?,
                sparse_masks: self.root.join("info/L3/sparse_masks").exists()
                    && self.number("info/L3/sparse_masks", 10)? == 1,
                domains: domains("L3"),
            })
        } else if self.root.join("info/L3CODE").is_dir() {
            Err(format!(
                "L3 cache allocation with code/data prioritisation (`{}` is mounted with cdp, which cpupoold does not drive)",
                self.root.display()
            ))
        } else {
            Err(missing("L3", "L3 cache allocation"))
        };
        let mb = if self.root.join("info/MB").is_dir() {
            Ok(MbInfo {
                bandwidth_gran: self.number("info/MB/bandwidth_gran", 10)? as u32,
                min_bandwidth: self.number("info/MB/min_bandwidth", 10)? as u32,
                num_closids: self.number("info/MB/num_closids", 10)? as u32,
                delay_linear: self.number("info/MB/delay_linear", 10)? == 1,
                domains: domains("MB"),
            })
        } else {
            Err(missing("MB", "memory bandwidth allocation"))
        };
        let foreign_groups = self.groups()?.iter().filter(|g| !g.starts_with(GROUP_PREFIX)).count();
        Ok(ResctrlInfo { l3, mb, foreign_groups })
    }

    /// Every control group's name (the root's directories but `info`, `mon_groups` and
    /// `mon_data`).
    pub fn groups(&self) -> Result<Vec<String>, ResctrlError> {
        let entries = std::fs::read_dir(&self.root)
            .map_err(|source| ResctrlError::Io(IoError::Read { path: self.root.clone(), source }))?;
        let mut out = Vec::new();
        for entry in entries {
            let entry = entry
                .map_err(|source| ResctrlError::Io(IoError::Read { path: self.root.clone(), source }))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if matches!(name.as_str(), "info" | "mon_groups" | "mon_data") {
                continue;
            }
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                out.push(name);
            }
        }
        out.sort();
        Ok(out)
    }

    /// Whether `group` exists.
    pub fn has_group(&self, group: &str) -> bool {
        self.root.join(group).is_dir()
    }

    /// Makes the control group `group` (its files are the kernel's).
    pub fn create_group(&self, group: &str) -> Result<(), ResctrlError> {
        self.kernel.create_group(&self.root, group).map_err(|source| ResctrlError::Group {
            op: "creating",
            path: self.root.join(group),
            source,
        })
    }

    /// Removes the control group `group`: its CPUs and tasks go back to the default group.
    pub fn remove_group(&self, group: &str) -> Result<(), ResctrlError> {
        self.kernel.remove_group(&self.root, group).map_err(|source| ResctrlError::Group {
            op: "removing",
            path: self.root.join(group),
            source,
        })
    }

    /// The CPUs of `group` (`cpus_list`).
    pub fn cpus(&self, group: &str) -> Result<CpuSet, ResctrlError> {
        let rel = format!("{group}/cpus_list");
        let text = self.read(&rel)?;
        CpuSet::parse(text.trim()).map_err(|_| ResctrlError::Format {
            path: self.root.join(&rel),
            text: text.trim().to_owned(),
            what: "a CPU list",
        })
    }

    /// Gives `cpus` to `group` (the kernel takes them from the group that had them).
    pub fn set_cpus(&self, group: &str, cpus: &CpuSet) -> Result<(), ResctrlError> {
        let rel = format!("{group}/cpus_list");
        let data = format!("{cpus}\n");
        self.kernel.write_cpus(&self.root, group, cpus).map_err(|source| self.write_error(&rel, data, source))
    }

    /// `group`'s `schemata` as the kernel shows it.
    pub fn schemata(&self, group: &str) -> Result<String, ResctrlError> {
        self.read(&format!("{group}/schemata"))
    }

    /// Writes `lines` (each ending with a newline) to `group`'s `schemata`.
    pub fn set_schemata(&self, group: &str, lines: &str) -> Result<(), ResctrlError> {
        let rel = format!("{group}/schemata");
        self.kernel
            .write_schemata(&self.root, group, lines)
            .map_err(|source| self.write_error(&rel, lines.to_owned(), source))
    }

    fn write_error(&self, rel: &str, data: String, source: io::Error) -> ResctrlError {
        let status = self.read("info/last_cmd_status").map(|s| s.trim().to_owned()).unwrap_or_default();
        let status = if status == "ok" { String::new() } else { status };
        ResctrlError::Write { path: self.root.join(rel), data, status, source }
    }
}

/// The control group of `pool`.
pub fn group_name(pool: &str) -> String {
    format!("{GROUP_PREFIX}{pool}")
}
