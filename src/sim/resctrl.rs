//! The sandbox's resctrl: a tree of plain files under `DIR/resctrl` laid out as the kernel's
//! (Documentation/arch/x86/resctrl.rst), and the kernel's part in what the daemon does to it.
//!
//! ```text
//! DIR/resctrl/info/L3/{cbm_mask,min_cbm_bits,num_closids,shareable_bits,bit_usage}
//! DIR/resctrl/info/MB/{bandwidth_gran,min_bandwidth,num_closids,delay_linear}
//! DIR/resctrl/info/last_cmd_status
//! DIR/resctrl/{cpus_list,tasks,schemata,mode}      the default group
//! DIR/resctrl/<group>/{cpus_list,tasks,schemata,mode}
//! ```
//!
//! Plain files do not appear on `mkdir`, cannot refuse a write and do not move CPUs between
//! groups. For the calls [`crate::host::resctrl::Resctrl`] makes, [`SimResctrlKernel`] (the twin
//! of [`crate::host::resctrl::HostResctrl`]) does what the kernel does: `mkdir` fills the group with the default
//! group's schemata; a `schemata` write is checked line by line as the kernel checks it (mask
//! within `cbm_mask`, contiguous, at least `min_cbm_bits`; bandwidth at least `min_bandwidth`,
//! rounded up to `bandwidth_gran`), refused with `EINVAL` and the reason in
//! `info/last_cmd_status`, or merged into the lines already there; a `cpus_list` write takes the
//! CPUs from the other groups; `rmdir` gives them back to the default group. Tests that use it
//! are named `fake_*`.
#![deny(missing_docs)]

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::path::Path;

use crate::core::cache::parse_schemata;
use crate::core::cpuset::CpuSet;
use crate::host::resctrl::ResctrlKernel;

/// The simulated kernel's part in the resctrl calls (module docs).
#[derive(Debug, Clone, Copy)]
pub struct SimResctrlKernel;

impl ResctrlKernel for SimResctrlKernel {
    fn create_group(&self, root: &Path, group: &str) -> io::Result<()> {
        mkdir_group(root, group)
    }
    fn remove_group(&self, root: &Path, group: &str) -> io::Result<()> {
        rmdir_group(root, group)
    }
    fn write_cpus(&self, root: &Path, group: &str, cpus: &CpuSet) -> io::Result<()> {
        write_cpus(root, group, cpus)
    }
    fn write_schemata(&self, root: &Path, group: &str, lines: &str) -> io::Result<()> {
        write_schemata(root, group, lines)
    }
}

/// The simulated host's resctrl.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimResctrl {
    /// The online CPUs (the default group's at first).
    pub cpus: CpuSet,
    /// L3 cache ids (one per package).
    pub domains: Vec<u32>,
    /// `info/L3/cbm_mask`.
    pub cbm_mask: u64,
    /// `info/L3/min_cbm_bits`.
    pub min_cbm_bits: u32,
    /// `info/L3/num_closids`.
    pub l3_closids: u32,
    /// `info/MB/num_closids`; `None`: no MBA.
    pub mb_closids: Option<u32>,
}

impl SimResctrl {
    /// A host like a two-socket Xeon's: 12 L3 ways, 16 CLOSIDs for L3, 8 for MBA (granularity
    /// and minimum 10%), one cache id per package.
    pub fn new(cpus: &CpuSet, packages: u32) -> SimResctrl {
        SimResctrl {
            cpus: cpus.clone(),
            domains: (0..packages.max(1)).collect(),
            cbm_mask: 0xfff,
            min_cbm_bits: 1,
            l3_closids: 16,
            mb_closids: Some(8),
        }
    }
}

/// Writes the simulated resctrl root.
pub fn write_root(root: &Path, sim: &SimResctrl) -> io::Result<()> {
    let w = |rel: &str, text: String| -> io::Result<()> {
        let path = root.join(rel);
        if let Some(dir) = path.parent() {
            fs::create_dir_all(dir)?;
        }
        fs::write(path, text)
    };
    w("info/L3/cbm_mask", format!("{:x}\n", sim.cbm_mask))?;
    w("info/L3/min_cbm_bits", format!("{}\n", sim.min_cbm_bits))?;
    w("info/L3/num_closids", format!("{}\n", sim.l3_closids))?;
    w("info/L3/shareable_bits", "0\n".into())?;
    w("info/last_cmd_status", "ok\n".into())?;
    let doms = |v: String| sim.domains.iter().map(|d| format!("{d}={v}")).collect::<Vec<_>>().join(";");
    let width = (64 - sim.cbm_mask.leading_zeros()).div_ceil(4) as usize;
    let mut schemata = format!("    L3:{}\n", doms(format!("{:0width$x}", sim.cbm_mask)));
    if let Some(n) = sim.mb_closids {
        w("info/MB/bandwidth_gran", "10\n".into())?;
        w("info/MB/min_bandwidth", "10\n".into())?;
        w("info/MB/num_closids", format!("{n}\n"))?;
        w("info/MB/delay_linear", "1\n".into())?;
        schemata.push_str(&format!("    MB:{}\n", doms("100".into())));
    }
    w("schemata", schemata)?;
    w("cpus_list", format!("{}\n", sim.cpus))?;
    w("tasks", String::new())?;
    w("mode", "shareable\n".into())
}

/// `mkdir` of a group: the kernel's files, the default group's schemata, no CPUs.
pub fn mkdir_group(root: &Path, group: &str) -> io::Result<()> {
    let dir = root.join(group);
    fs::create_dir(&dir)?;
    fs::write(dir.join("schemata"), fs::read_to_string(root.join("schemata"))?)?;
    fs::write(dir.join("cpus_list"), "\n")?;
    fs::write(dir.join("tasks"), "")?;
    fs::write(dir.join("mode"), "shareable\n")
}

/// `rmdir` of a group: its CPUs go back to the default group.
pub fn rmdir_group(root: &Path, group: &str) -> io::Result<()> {
    let dir = root.join(group);
    let cpus = read_cpus(&dir.join("cpus_list"))?;
    for f in ["schemata", "cpus_list", "tasks", "mode"] {
        match fs::remove_file(dir.join(f)) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
    }
    fs::remove_dir(&dir)?;
    let default = read_cpus(&root.join("cpus_list"))?.union(&cpus);
    fs::write(root.join("cpus_list"), format!("{default}\n"))
}

fn read_cpus(path: &Path) -> io::Result<CpuSet> {
    let text = fs::read_to_string(path)?;
    CpuSet::parse(text.trim()).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))
}

/// A `cpus_list` write: the CPUs leave every other group; those the group gives up go to the
/// default group.
pub fn write_cpus(root: &Path, group: &str, cpus: &CpuSet) -> io::Result<()> {
    for entry in fs::read_dir(root)? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name == group
            || matches!(name.as_str(), "info" | "mon_groups" | "mon_data")
            || !entry.file_type()?.is_dir()
        {
            continue;
        }
        let path = entry.path().join("cpus_list");
        let had = read_cpus(&path)?;
        if !had.is_disjoint(cpus) {
            fs::write(&path, format!("{}\n", had.difference(cpus)))?;
        }
    }
    let own = root.join(group).join("cpus_list");
    let default = read_cpus(&root.join("cpus_list"))?.union(&read_cpus(&own)?).difference(cpus);
    fs::write(own, format!("{cpus}\n"))?;
    fs::write(root.join("cpus_list"), format!("{default}\n"))
}

/// A `schemata` write, checked and merged as the kernel does.
pub fn write_schemata(root: &Path, group: &str, text: &str) -> io::Result<()> {
    let refuse = |why: &str| -> io::Result<()> {
        fs::write(root.join("info/last_cmd_status"), format!("{why}\n"))?;
        Err(io::Error::from_raw_os_error(nix::libc::EINVAL))
    };
    if !text.ends_with('\n') {
        return refuse("schemata must end with a newline");
    }
    let number = |rel: &str, radix: u32| -> u64 {
        fs::read_to_string(root.join(rel))
            .ok()
            .and_then(|t| u64::from_str_radix(t.trim(), radix).ok())
            .unwrap_or(0)
    };
    let path = root.join(group).join("schemata");
    let mut lines = parse_schemata(&fs::read_to_string(&path)?);
    for (res, doms) in parse_schemata(text) {
        let Some(current) = lines.get_mut(&res) else {
            return refuse(&format!("Unknown or unsupported resource name '{res}'"));
        };
        for (dom, value) in doms {
            if !current.contains_key(&dom) {
                return refuse(&format!("Unknown domain ID {dom}"));
            }
            let value = match res.as_str() {
                "L3" => {
                    let Ok(m) = u64::from_str_radix(&value, 16) else {
                        return refuse(&format!("Non-hex character in the mask {value}"));
                    };
                    let shifted = m >> m.trailing_zeros();
                    if m == 0 || m & !number("info/L3/cbm_mask", 16) != 0 {
                        return refuse("Mask out of range");
                    }
                    if shifted & shifted.wrapping_add(1) != 0 {
                        return refuse(&format!("Mask not contiguous {m:x}"));
                    }
                    if u64::from(m.count_ones()) < number("info/L3/min_cbm_bits", 10) {
                        return refuse(&format!(
                            "Need at least {} bits in the mask",
                            number("info/L3/min_cbm_bits", 10)
                        ));
                    }
                    format!("{m:x}")
                }
                "MB" => {
                    let Ok(bw) = value.parse::<u64>() else {
                        return refuse(&format!("Non-decimal digit in MB value {value}"));
                    };
                    let (gran, min) =
                        (number("info/MB/bandwidth_gran", 10).max(1), number("info/MB/min_bandwidth", 10));
                    if bw < min || bw > 100 {
                        return refuse(&format!("MB value {bw} out of range [{min},100]"));
                    }
                    bw.div_ceil(gran).saturating_mul(gran).to_string()
                }
                _ => value,
            };
            current.insert(dom, value);
        }
    }
    fs::write(root.join("info/last_cmd_status"), "ok\n")?;
    fs::write(path, format_schemata(&lines))
}

fn format_schemata(lines: &BTreeMap<String, BTreeMap<u32, String>>) -> String {
    // The kernel shows L3 before MB (resource order), names right-aligned.
    let mut order: Vec<&String> = lines.keys().collect();
    order.sort_by_key(|r| (r.as_str() != "L3", r.to_string()));
    order
        .into_iter()
        .map(|res| {
            let doms: Vec<String> = lines[res].iter().map(|(d, v)| format!("{d}={v}")).collect();
            format!("{res:>6}:{}\n", doms.join(";"))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::resctrl::{Resctrl, ResctrlError};

    #[test]
    fn the_sandbox_model_behind_the_same_calls_as_on_a_host() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let root = dir.path().join("resctrl");
        let online = CpuSet::parse("0-7").unwrap_or_else(|e| panic!("{e}"));
        write_root(&root, &SimResctrl::new(&online, 2)).unwrap_or_else(|e| panic!("{e}"));
        let rc = Resctrl::new(&root).with_kernel(super::super::KERNEL);
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
