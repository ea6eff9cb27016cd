//! Cache classes, the pure part: what `[pools.NAME.cache]` asks (`l3`, `mb`), checked against
//! what the host's resctrl offers ([`ResctrlInfo`], read from its `info/` directory), and turned
//! into the `schemata` lines of each pool's control group.
//!
//! The arithmetic follows the kernel's resctrl documentation (Documentation/arch/x86/resctrl.rst):
//! a capacity bitmask (CBM) must lie within `info/L3/cbm_mask`, have at least `min_cbm_bits`
//! bits set and, unless `info/L3/sparse_masks` says `1`, be contiguous; a memory bandwidth
//! percentage is at least `info/MB/min_bandwidth` and the kernel rounds it up to a multiple of
//! `bandwidth_gran` (so a value that is not one is refused: what would be in force would not be
//! what was asked); every control group takes one CLOSID, the default group one of them.
//!
//! A share (`l3 = "50%"`) is a run of whole ways: pools with shares get disjoint runs, in pool
//! name order from the highest way down, so that two pools asking 50% each do not evict each
//! other. A bitmask is taken as written, overlapping whatever it overlaps.

use std::collections::BTreeMap;
use std::fmt;

use crate::pool::PoolName;

/// `l3`: a share of the L3 ways or an explicit capacity bitmask.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum L3Share {
    /// `"N%"`, 1 to 100.
    Percent(u32),
    /// `"0xMASK"`.
    Mask(u64),
}

impl L3Share {
    /// Parses `"50%"` or `"0xff0"`; the error says what is wrong.
    pub fn parse(text: &str) -> Result<L3Share, String> {
        let t = text.trim();
        if let Some(p) = t.strip_suffix('%') {
            return match p.trim().parse::<u32>() {
                Ok(n) if (1..=100).contains(&n) => Ok(L3Share::Percent(n)),
                _ => Err(format!("`{}` is not a share between 1% and 100%", text.escape_debug())),
            };
        }
        if let Some(hex) = t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
            return match u64::from_str_radix(hex, 16) {
                Ok(0) => Err("the bitmask 0x0 names no cache way".to_owned()),
                Ok(m) => Ok(L3Share::Mask(m)),
                Err(_) => Err(format!("`{}` is not a hexadecimal bitmask", text.escape_debug())),
            };
        }
        Err(format!(
            "`{}` is neither a share of the ways (\"50%\") nor a capacity bitmask (\"0xff0\")",
            text.escape_debug()
        ))
    }
}

impl fmt::Display for L3Share {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            L3Share::Percent(p) => write!(f, "{p}%"),
            L3Share::Mask(m) => write!(f, "0x{m:x}"),
        }
    }
}

/// One pool's `[pools.NAME.cache]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CacheClass {
    /// `l3`.
    pub l3: Option<L3Share>,
    /// `mb`: memory bandwidth, percent.
    pub mb: Option<u32>,
}

impl CacheClass {
    /// The keys set, with their values as configured, in the order rows are reported.
    pub fn keys(&self) -> Vec<(&'static str, String)> {
        let mut keys = Vec::new();
        if let Some(l3) = self.l3 {
            keys.push(("l3", l3.to_string()));
        }
        if let Some(mb) = self.mb {
            keys.push(("mb", mb.to_string()));
        }
        keys
    }
}

/// `info/L3`: the L3 cache allocation the host offers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct L3Info {
    /// `cbm_mask`: every way.
    pub cbm_mask: u64,
    /// `min_cbm_bits`.
    pub min_cbm_bits: u32,
    /// `num_closids`.
    pub num_closids: u32,
    /// `shareable_bits`: ways other agents may use too (reported, not avoided).
    pub shareable_bits: u64,
    /// `sparse_masks`: non-contiguous masks allowed (absent before Linux 6.8: not allowed).
    pub sparse_masks: bool,
    /// The cache ids (domains) in the default group's `schemata`.
    pub domains: Vec<u32>,
}

/// `info/MB`: the memory bandwidth allocation the host offers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MbInfo {
    /// `bandwidth_gran`: percentages are rounded up to a multiple of it.
    pub bandwidth_gran: u32,
    /// `min_bandwidth`.
    pub min_bandwidth: u32,
    /// `num_closids`.
    pub num_closids: u32,
    /// `delay_linear`: whether the percentage is a linear scale.
    pub delay_linear: bool,
    /// The domains in the default group's `schemata`.
    pub domains: Vec<u32>,
}

/// What resctrl offers: each resource, or what is missing for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResctrlInfo {
    /// L3 CAT, or what is missing (`/sys/fs/resctrl/info/L3 is missing`).
    pub l3: Result<L3Info, String>,
    /// MBA, or what is missing.
    pub mb: Result<MbInfo, String>,
    /// Control groups that are not the daemon's (each holds a CLOSID).
    pub foreign_groups: usize,
}

/// What a pool's group should hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Wanted {
    /// The L3 bitmask, the same on every cache id.
    pub l3: Option<u64>,
    /// The bandwidth percentage, the same on every domain.
    pub mb: Option<u32>,
}

/// Why the cache classes cannot be applied on this host; names the pool and key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CacheError {
    /// The host lacks what the key needs.
    Unsupported {
        /// The pool.
        pool: PoolName,
        /// `l3` or `mb`.
        key: &'static str,
        /// What is missing.
        missing: String,
    },
    /// The value does not fit what the host offers.
    Invalid {
        /// The pool.
        pool: PoolName,
        /// `l3` or `mb`.
        key: &'static str,
        /// Why.
        reason: String,
    },
}

/// Each pool's wanted group contents, or the first key the host cannot honour (in pool name
/// order, `l3` before `mb`).
pub fn plan(
    classes: &BTreeMap<PoolName, CacheClass>,
    info: &ResctrlInfo,
) -> Result<BTreeMap<PoolName, Wanted>, CacheError> {
    let mut out = BTreeMap::new();
    // Shares take runs of ways from the top down.
    let mut top = info.l3.as_ref().map_or(0, |l3| 64 - l3.cbm_mask.leading_zeros());
    for (pool, class) in classes {
        let mut want = Wanted::default();
        if let Some(share) = class.l3 {
            let l3 = info.l3.as_ref().map_err(|missing| CacheError::Unsupported {
                pool: pool.clone(),
                key: "l3",
                missing: missing.clone(),
            })?;
            let mask = l3_mask(share, l3, &mut top).map_err(|reason| CacheError::Invalid {
                pool: pool.clone(),
                key: "l3",
                reason,
            })?;
            want.l3 = Some(mask);
        }
        if let Some(mb) = class.mb {
            let info_mb = info.mb.as_ref().map_err(|missing| CacheError::Unsupported {
                pool: pool.clone(),
                key: "mb",
                missing: missing.clone(),
            })?;
            check_mb(mb, info_mb).map_err(|reason| CacheError::Invalid {
                pool: pool.clone(),
                key: "mb",
                reason,
            })?;
            want.mb = Some(mb);
        }
        out.insert(pool.clone(), want);
    }
    check_closids(classes, info, &out)?;
    Ok(out)
}

/// Refuses more groups than resctrl has CLOSIDs for.
fn check_closids(
    classes: &BTreeMap<PoolName, CacheClass>,
    info: &ResctrlInfo,
    out: &BTreeMap<PoolName, Wanted>,
) -> Result<(), CacheError> {
    // Every group holds a CLOSID; the default group holds one, other groups theirs.
    let closids = [info.l3.as_ref().ok().map(|l| l.num_closids), info.mb.as_ref().ok().map(|m| m.num_closids)]
        .into_iter()
        .flatten()
        .min()
        .unwrap_or(0) as usize;
    let free = closids.saturating_sub(1 + info.foreign_groups);
    if let Some((pool, _)) = out.iter().nth(free) {
        let class = &classes[pool];
        let key = if class.l3.is_some() { "l3" } else { "mb" };
        return Err(CacheError::Invalid {
            pool: pool.clone(),
            key,
            reason: format!(
                "{} pools set cache classes, but resctrl has {closids} CLOSIDs (num_closids): {free} \
                 groups besides the default one{}",
                out.len(),
                match info.foreign_groups {
                    0 => String::new(),
                    n => format!(" and {n} other groups"),
                }
            ),
        });
    }
    Ok(())
}

/// The ways `share` takes of `l3`: a percentage takes a run of ways below `top` (and lowers
/// it), a mask is checked against what the host takes; why not, when it cannot.
fn l3_mask(share: L3Share, l3: &L3Info, top: &mut u32) -> Result<u64, String> {
    match share {
        L3Share::Percent(p) => {
            let ways = l3.cbm_mask.count_ones();
            let n = ((ways * p + 50) / 100).max(1);
            if n < l3.min_cbm_bits {
                return Err(format!(
                    "{p}% of the {ways} ways is {n}, fewer than min_cbm_bits ({})",
                    l3.min_cbm_bits
                ));
            }
            let low = l3.cbm_mask.trailing_zeros();
            if *top < low + n {
                return Err(format!(
                    "{p}% ({n} ways) does not fit: the shares of the pools before it in name order \
                     leave {} of the {ways} ways",
                    top.saturating_sub(low)
                ));
            }
            *top -= n;
            Ok(((1u64 << n) - 1) << *top)
        }
        L3Share::Mask(m) => {
            if m & !l3.cbm_mask != 0 {
                return Err(format!("0x{m:x} has bits outside cbm_mask 0x{:x}", l3.cbm_mask));
            }
            let shifted = m >> m.trailing_zeros();
            let contiguous = shifted & shifted.wrapping_add(1) == 0;
            if !contiguous && !l3.sparse_masks {
                return Err(format!(
                    "0x{m:x} is not contiguous, and this host's L3 takes contiguous masks only"
                ));
            }
            if m.count_ones() < l3.min_cbm_bits {
                return Err(format!(
                    "0x{m:x} has {} bits set, fewer than min_cbm_bits ({})",
                    m.count_ones(),
                    l3.min_cbm_bits
                ));
            }
            Ok(m)
        }
    }
}

/// Why `mb` percent is not a bandwidth the host takes, if it is not.
fn check_mb(mb: u32, info: &MbInfo) -> Result<(), String> {
    if mb < info.min_bandwidth {
        return Err(format!("{mb}% is below min_bandwidth ({}%)", info.min_bandwidth));
    }
    if info.bandwidth_gran > 0 && !mb.is_multiple_of(info.bandwidth_gran) {
        return Err(format!(
            "{mb}% is not a multiple of bandwidth_gran ({}%): the kernel would round it up",
            info.bandwidth_gran
        ));
    }
    Ok(())
}

/// The `schemata` text that sets `want` on every domain; ends with a newline (the kernel
/// refuses a write without one).
pub fn schemata(want: &Wanted, info: &ResctrlInfo) -> String {
    let mut s = String::new();
    if let (Some(mask), Ok(l3)) = (want.l3, &info.l3) {
        let doms: Vec<String> = l3.domains.iter().map(|d| format!("{d}={mask:x}")).collect();
        s.push_str(&format!("L3:{}\n", doms.join(";")));
    }
    if let (Some(mb), Ok(m)) = (want.mb, &info.mb) {
        let doms: Vec<String> = m.domains.iter().map(|d| format!("{d}={mb}")).collect();
        s.push_str(&format!("MB:{}\n", doms.join(";")));
    }
    s
}

/// A `schemata` file as the kernel shows it (`    L3:0=0ff0;1=0ff0`, `    MB:0= 50;1= 50`):
/// resource → domain → value as written (trimmed).
pub fn parse_schemata(text: &str) -> BTreeMap<String, BTreeMap<u32, String>> {
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let Some((res, doms)) = line.split_once(':') else { continue };
        let entry: &mut BTreeMap<u32, String> = out.entry(res.trim().to_owned()).or_default();
        for dom in doms.split(';') {
            if let Some((id, value)) = dom.split_once('=') {
                if let Ok(id) = id.trim().parse() {
                    entry.insert(id, value.trim().to_owned());
                }
            }
        }
    }
    out
}

/// Whether a read-back `schemata` line holds `want` on every domain of `domains`: the distinct
/// values as shown (joined with `,`), and whether they are all the one wanted.
pub fn in_force(
    shown: &BTreeMap<String, BTreeMap<u32, String>>,
    resource: &str,
    domains: &[u32],
    want: u64,
    radix: u32,
) -> (String, bool) {
    let line = shown.get(resource);
    let mut values: Vec<String> = Vec::new();
    let mut all = !domains.is_empty();
    for d in domains {
        let v = line.and_then(|l| l.get(d)).cloned().unwrap_or_else(|| "?".to_owned());
        all &= u64::from_str_radix(&v, radix).ok() == Some(want);
        if !values.contains(&v) {
            values.push(v);
        }
    }
    (values.join(","), all)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(n: &str) -> PoolName {
        PoolName::new(n).unwrap_or_else(|e| panic!("{e}"))
    }

    fn info() -> ResctrlInfo {
        ResctrlInfo {
            l3: Ok(L3Info {
                cbm_mask: 0xfff,
                min_cbm_bits: 2,
                num_closids: 4,
                shareable_bits: 0,
                sparse_masks: false,
                domains: vec![0, 1],
            }),
            mb: Ok(MbInfo {
                bandwidth_gran: 10,
                min_bandwidth: 10,
                num_closids: 4,
                delay_linear: true,
                domains: vec![0, 1],
            }),
            foreign_groups: 0,
        }
    }

    fn classes(list: &[(&str, Option<&str>, Option<u32>)]) -> BTreeMap<PoolName, CacheClass> {
        list.iter()
            .map(|(n, l3, mb)| {
                let l3 = l3.map(|t| L3Share::parse(t).unwrap_or_else(|e| panic!("{e}")));
                (pool(n), CacheClass { l3, mb: *mb })
            })
            .collect()
    }

    #[test]
    fn shares_take_disjoint_runs_from_the_top_in_name_order() {
        let p = plan(&classes(&[("a", Some("50%"), None), ("b", Some("25%"), Some(50))]), &info())
            .unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!(p[&pool("a")].l3, Some(0xfc0));
        assert_eq!(p[&pool("b")].l3, Some(0x038));
        assert_eq!(p[&pool("b")].mb, Some(50));
        assert_eq!(schemata(&p[&pool("b")], &info()), "L3:0=38;1=38\nMB:0=50;1=50\n");
    }

    #[test]
    fn values_the_host_cannot_take_are_refused_naming_the_key() {
        let bad = |l3: Option<&str>, mb: Option<u32>| match plan(&classes(&[("dp", l3, mb)]), &info()) {
            Err(CacheError::Invalid { key, reason, .. }) => (key, reason),
            other => panic!("{other:?}"),
        };
        assert_eq!(bad(Some("0xf0f"), None).0, "l3");
        assert!(bad(Some("0xf0f"), None).1.contains("not contiguous"));
        assert!(bad(Some("0x1000"), None).1.contains("outside cbm_mask 0xfff"));
        assert!(bad(Some("0x8"), None).1.contains("min_cbm_bits (2)"));
        assert!(bad(Some("8%"), None).1.contains("min_cbm_bits"));
        assert_eq!(bad(None, Some(55)).0, "mb");
        assert!(bad(None, Some(55)).1.contains("bandwidth_gran"));
        let too_many = classes(&[
            ("a", Some("20%"), None),
            ("b", None, Some(50)),
            ("c", Some("0x3"), None),
            ("d", Some("0x3"), None),
        ]);
        match plan(&too_many, &info()) {
            Err(CacheError::Invalid { pool: p, key: "l3", reason }) => {
                assert_eq!(p, pool("d"));
                assert!(reason.contains("4 CLOSIDs"), "{reason}");
            }
            other => panic!("{other:?}"),
        }
        let mut sparse = info();
        if let Ok(l3) = &mut sparse.l3 {
            l3.sparse_masks = true;
        }
        assert!(plan(&classes(&[("dp", Some("0xf0f"), None)]), &sparse).is_ok());
    }

    #[test]
    fn a_missing_resource_is_unsupported_for_the_key_that_needs_it() {
        let mut i = info();
        i.mb = Err("no MBA".into());
        assert!(plan(&classes(&[("dp", Some("50%"), None)]), &i).is_ok());
        assert_eq!(
            plan(&classes(&[("dp", Some("50%"), Some(50))]), &i),
            Err(CacheError::Unsupported { pool: pool("dp"), key: "mb", missing: "no MBA".into() })
        );
    }

    #[test]
    fn schemata_as_the_kernel_shows_it_is_read_back_by_value() {
        let shown = parse_schemata("    L3:0=0fc0;1=0fc0\n    MB:0= 50;1=100\n");
        assert_eq!(in_force(&shown, "L3", &[0, 1], 0xfc0, 16), ("0fc0".to_owned(), true));
        assert_eq!(in_force(&shown, "MB", &[0, 1], 50, 10), ("50,100".to_owned(), false));
        assert_eq!(L3Share::parse("0xFF0"), Ok(L3Share::Mask(0xff0)));
        assert!(L3Share::parse("101%").is_err());
        assert!(L3Share::parse("ff0").is_err());
    }
}
