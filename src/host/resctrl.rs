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
//! On a tree of plain files (the sandbox, tests) the kernel's part (files appearing on `mkdir`,
//! schemata checked and merged, `rmdir` of a non-empty directory) is played by
//! [`super::simresctrl`]; the daemon's own path (reads, writes, read-back) is the same.
#![deny(missing_docs)]

use std::io;
use std::path::{Path, PathBuf};

use super::fsutil::Root;
use crate::core::cache::{L3Info, MbInfo, ResctrlInfo};
use crate::core::cpuset::CpuSet;

/// Where resctrl is mounted on a host; the only place the daemon mounts it.
pub const DEFAULT_ROOT: &str = "/sys/fs/resctrl";

/// The prefix of the daemon's control groups: `cpupool-<pool>`.
pub const GROUP_PREFIX: &str = "cpupool-";

/// resctrl's `f_type` (RDTGROUP_SUPER_MAGIC in include/uapi/linux/magic.h); the literal takes
/// whatever width the C library gives `f_type`.
const RDTGROUP_SUPER_MAGIC: nix::sys::statfs::FsType = nix::sys::statfs::FsType(0x0765_5821);

/// Why a resctrl file could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum ResctrlError {
    /// Reading failed.
    #[error("reading `{}`", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
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
    /// Writing failed; `status` is the kernel's `info/last_cmd_status` after it.
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
    /// Whether `root` is a mounted resctrl; otherwise [`super::simresctrl`] plays the kernel.
    kernel: bool,
}

impl Resctrl {
    /// The tree below `root`.
    pub fn new(root: impl Into<PathBuf>) -> Resctrl {
        let root = root.into();
        let kernel = is_resctrl(&root);
        Resctrl { root, kernel }
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
        .map_err(|e| ResctrlError::Mount { path: self.root.clone(), source: e.into() })?;
        self.kernel = is_resctrl(&self.root);
        Ok(())
    }

    fn fs(&self) -> Root {
        Root::new(&self.root)
    }

    fn read(&self, rel: &str) -> Result<String, ResctrlError> {
        self.fs()
            .read_to_string(rel)
            .map_err(|e| ResctrlError::Read { path: self.root.join(rel), source: e.source })
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
            .map_err(|source| ResctrlError::Read { path: self.root.clone(), source })?;
        let mut out = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|source| ResctrlError::Read { path: self.root.clone(), source })?;
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
        let made = if self.kernel {
            self.fs().create_dir(group, 0o755).map_err(|e| e.source)
        } else {
            super::simresctrl::mkdir_group(&self.root, group)
        };
        made.map_err(|source| ResctrlError::Group { op: "creating", path: self.root.join(group), source })
    }

    /// Removes the control group `group`: its CPUs and tasks go back to the default group.
    pub fn remove_group(&self, group: &str) -> Result<(), ResctrlError> {
        let removed = if self.kernel {
            self.fs().remove_dir(group).map_err(|e| e.source)
        } else {
            super::simresctrl::rmdir_group(&self.root, group)
        };
        removed.map_err(|source| ResctrlError::Group { op: "removing", path: self.root.join(group), source })
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
        let written = if self.kernel {
            self.fs().write(&rel, data.as_bytes()).map_err(|e| e.source)
        } else {
            super::simresctrl::write_cpus(&self.root, group, cpus)
        };
        written.map_err(|source| self.write_error(&rel, data, source))
    }

    /// `group`'s `schemata` as the kernel shows it.
    pub fn schemata(&self, group: &str) -> Result<String, ResctrlError> {
        self.read(&format!("{group}/schemata"))
    }

    /// Writes `lines` (each ending with a newline) to `group`'s `schemata`.
    pub fn set_schemata(&self, group: &str, lines: &str) -> Result<(), ResctrlError> {
        let rel = format!("{group}/schemata");
        let written = if self.kernel {
            self.fs().write(&rel, lines.as_bytes()).map_err(|e| e.source)
        } else {
            super::simresctrl::write_schemata(&self.root, group, lines)
        };
        written.map_err(|source| self.write_error(&rel, lines.to_owned(), source))
    }

    fn write_error(&self, rel: &str, data: String, source: io::Error) -> ResctrlError {
        let status = self.read("info/last_cmd_status").map(|s| s.trim().to_owned()).unwrap_or_default();
        let status = if status == "ok" { String::new() } else { status };
        ResctrlError::Write { path: self.root.join(rel), data, status, source }
    }
}

fn is_resctrl(root: &Path) -> bool {
    nix::sys::statfs::statfs(root).is_ok_and(|s| s.filesystem_type() == RDTGROUP_SUPER_MAGIC)
}

/// The control group of `pool`.
pub fn group_name(pool: &str) -> String {
    format!("{GROUP_PREFIX}{pool}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sandbox_model_behind_the_same_calls_as_on_a_host() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let root = dir.path().join("resctrl");
        let online = CpuSet::parse("0-7").unwrap_or_else(|e| panic!("{e}"));
        super::super::simresctrl::write_root(&root, &super::super::simresctrl::SimResctrl::new(&online, 2))
            .unwrap_or_else(|e| panic!("{e}"));
        let rc = Resctrl::new(&root);
        assert!(rc.mounted());
        let info = rc.info().unwrap_or_else(|e| panic!("{e}"));
        let l3 = info.l3.as_ref().unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            (l3.cbm_mask, l3.min_cbm_bits, l3.num_closids, l3.domains.clone()),
            (0xfff, 1, 16, vec![0, 1])
        );
        let mb = info.mb.as_ref().unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((mb.bandwidth_gran, mb.min_bandwidth, mb.num_closids), (10, 10, 8));
        rc.create_group("cpupool-dp").unwrap_or_else(|e| panic!("{e}"));
        let cpus = CpuSet::parse("2-3").unwrap_or_else(|e| panic!("{e}"));
        rc.set_cpus("cpupool-dp", &cpus).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(rc.cpus("cpupool-dp").unwrap_or_else(|e| panic!("{e}")), cpus);
        assert_eq!(std::fs::read_to_string(root.join("cpus_list")).unwrap_or_default(), "0-1,4-7\n");
        rc.set_schemata("cpupool-dp", "L3:0=ff0;1=ff0\n").unwrap_or_else(|e| panic!("{e}"));
        let shown = rc.schemata("cpupool-dp").unwrap_or_else(|e| panic!("{e}"));
        assert!(shown.contains("L3:0=ff0;1=ff0"), "{shown}");
        assert!(shown.contains("MB:0=100;1=100"), "the MB line is kept: {shown}");
        // The kernel's refusal, with its reason.
        match rc.set_schemata("cpupool-dp", "L3:0=f0f\n") {
            Err(e @ ResctrlError::Write { .. }) => {
                assert!(e.to_string().contains("last_cmd_status: Mask not contiguous"), "{e}")
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(rc.groups().unwrap_or_else(|e| panic!("{e}")), vec!["cpupool-dp".to_owned()]);
        rc.remove_group("cpupool-dp").unwrap_or_else(|e| panic!("{e}"));
        assert!(!rc.has_group("cpupool-dp"));
        assert_eq!(std::fs::read_to_string(root.join("cpus_list")).unwrap_or_default(), "0-7\n");
    }
}
