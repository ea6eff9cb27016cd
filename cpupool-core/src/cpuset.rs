//! `CpuSet`: a set of logical CPU numbers.
//!
//! Two encodings come from outside and both are implemented here from their specs:
//! - the kernel's list syntax (`0-3,8,10-11`), read from sysfs and cgroupfs and written to
//!   `cpuset.cpus`; sysfs terminates it with a newline and writes an empty set as `"\n"`;
//! - systemd's D-Bus `AllowedCPUs` property, an `ay` byte mask in which CPU *i* is byte `i / 8`,
//!   bit `i % 8`, least significant bit first (systemd `cpu_set_to_dbus`).

use std::fmt;
use std::str::FromStr;

/// Highest CPU number accepted (the kernel's `NR_CPUS` maximum on x86_64 is 8192).
pub const MAX_CPU: u32 = 8191;

const WORD_BITS: u32 = 64;

/// A set of logical CPUs, stored as a bitmap. Equality ignores trailing empty words.
#[derive(Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CpuSet {
    /// Bit `i % 64` of word `i / 64` is CPU `i`. Never ends in a zero word.
    words: Vec<u64>,
}

/// Why a CPU list or mask could not be read. Each variant names the offending token.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CpuSetError {
    /// A token is not a number or a range of numbers.
    #[error("`{token}` is not a CPU number or range (expected e.g. `0-3,8`)")]
    Garbage {
        /// The token as written.
        token: String,
    },
    /// A CPU number is above [`MAX_CPU`].
    #[error("CPU `{token}` is out of range (highest CPU number is {MAX_CPU})")]
    OutOfRange {
        /// The token as written.
        token: String,
    },
    /// A range whose end is below its start.
    #[error("range `{token}` is reversed (the first number must not exceed the second)")]
    Reversed {
        /// The token as written.
        token: String,
    },
    /// A systemd mask longer than [`MAX_CPU`] allows.
    #[error("CPU mask of {len} bytes names CPUs above {MAX_CPU}")]
    MaskTooLong {
        /// The mask's length in bytes.
        len: usize,
    },
}

impl CpuSet {
    /// The empty set.
    pub const fn new() -> Self {
        CpuSet { words: Vec::new() }
    }

    /// The set `first..=last`. Both must be at most [`MAX_CPU`].
    pub fn range(first: u32, last: u32) -> Self {
        let mut s = CpuSet::new();
        for cpu in first..=last.min(MAX_CPU) {
            s.insert(cpu);
        }
        s
    }

    /// Parses the kernel list syntax. Surrounding whitespace (sysfs's trailing newline) is
    /// ignored and the empty string is the empty set.
    pub fn parse(text: &str) -> Result<Self, CpuSetError> {
        let mut set = CpuSet::new();
        let text = text.trim();
        if text.is_empty() {
            return Ok(set);
        }
        for raw in text.split(',') {
            let token = raw.trim();
            let (first, last) = match token.split_once('-') {
                Some((a, b)) => (parse_cpu(a, token)?, parse_cpu(b, token)?),
                None => {
                    let cpu = parse_cpu(token, token)?;
                    (cpu, cpu)
                }
            };
            if last < first {
                return Err(CpuSetError::Reversed { token: token.to_owned() });
            }
            set.insert_range(first, last);
        }
        Ok(set)
    }

    /// Decodes systemd's `AllowedCPUs` / `cpu_set_to_dbus` byte mask.
    pub fn from_systemd_mask(mask: &[u8]) -> Result<Self, CpuSetError> {
        let mut set = CpuSet::new();
        for (byte_index, byte) in mask.iter().enumerate() {
            for bit in 0..8u32 {
                if byte & (1 << bit) != 0 {
                    let cpu = u32::try_from(byte_index)
                        .ok()
                        .and_then(|b| b.checked_mul(8))
                        .and_then(|b| b.checked_add(bit))
                        .filter(|cpu| *cpu <= MAX_CPU)
                        .ok_or(CpuSetError::MaskTooLong { len: mask.len() })?;
                    set.insert(cpu);
                }
            }
        }
        Ok(set)
    }

    /// Encodes as systemd's byte mask: byte `i / 8`, bit `i % 8`, least significant first,
    /// as short as possible (the empty set is the empty array).
    pub fn to_systemd_mask(&self) -> Vec<u8> {
        let Some(last) = self.last() else { return Vec::new() };
        let mut mask = vec![0u8; (last / 8 + 1) as usize];
        for cpu in self.iter() {
            mask[(cpu / 8) as usize] |= 1 << (cpu % 8);
        }
        mask
    }

    /// Adds one CPU. CPUs above [`MAX_CPU`] are ignored; callers validate first.
    pub fn insert(&mut self, cpu: u32) {
        if cpu > MAX_CPU {
            return;
        }
        let word = (cpu / WORD_BITS) as usize;
        if self.words.len() <= word {
            self.words.resize(word + 1, 0);
        }
        self.words[word] |= 1 << (cpu % WORD_BITS);
    }

    fn insert_range(&mut self, first: u32, last: u32) {
        for cpu in first..=last {
            self.insert(cpu);
        }
    }

    /// Removes one CPU.
    pub fn remove(&mut self, cpu: u32) {
        let word = (cpu / WORD_BITS) as usize;
        if let Some(w) = self.words.get_mut(word) {
            *w &= !(1 << (cpu % WORD_BITS));
            self.trim();
        }
    }

    /// Whether `cpu` is in the set.
    pub fn contains(&self, cpu: u32) -> bool {
        self.words.get((cpu / WORD_BITS) as usize).is_some_and(|w| w & (1 << (cpu % WORD_BITS)) != 0)
    }

    /// Number of CPUs.
    pub fn len(&self) -> usize {
        self.words.iter().map(|w| w.count_ones() as usize).sum()
    }

    /// Whether the set has no CPU.
    pub fn is_empty(&self) -> bool {
        self.words.is_empty()
    }

    /// Lowest CPU.
    pub fn first(&self) -> Option<u32> {
        self.iter().next()
    }

    /// Highest CPU.
    pub fn last(&self) -> Option<u32> {
        let (i, w) = self.words.iter().enumerate().next_back()?;
        Some(i as u32 * WORD_BITS + (WORD_BITS - 1 - w.leading_zeros()))
    }

    /// CPUs in ascending order. Visits only the set bits of each word, so iterating costs the
    /// number of words plus the number of CPUs, not 64 steps per word (a core's two threads
    /// may be thousands of CPUs apart).
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = u32> + '_ {
        self.words.iter().enumerate().flat_map(|(i, &w)| Bits { word: w, base: i as u32 * WORD_BITS })
    }

    /// `self ∪ other`.
    pub fn union(&self, other: &CpuSet) -> CpuSet {
        let (long, short) = if self.words.len() >= other.words.len() { (self, other) } else { (other, self) };
        let mut words = long.words.clone();
        for (w, o) in words.iter_mut().zip(&short.words) {
            *w |= o;
        }
        CpuSet { words }
    }

    /// `self ∩ other`.
    pub fn intersection(&self, other: &CpuSet) -> CpuSet {
        let words = self.words.iter().zip(&other.words).map(|(a, b)| a & b).collect();
        let mut s = CpuSet { words };
        s.trim();
        s
    }

    /// `self \ other`.
    pub fn difference(&self, other: &CpuSet) -> CpuSet {
        let mut words = self.words.clone();
        for (w, o) in words.iter_mut().zip(&other.words) {
            *w &= !o;
        }
        let mut s = CpuSet { words };
        s.trim();
        s
    }

    /// Whether every CPU of `self` is in `other`. Allocates nothing.
    pub fn is_subset(&self, other: &CpuSet) -> bool {
        self.words.iter().enumerate().all(|(i, w)| w & !other.words.get(i).copied().unwrap_or(0) == 0)
    }

    /// Whether the sets share no CPU.
    pub fn is_disjoint(&self, other: &CpuSet) -> bool {
        self.words.iter().zip(&other.words).all(|(a, b)| a & b == 0)
    }

    fn trim(&mut self) {
        while self.words.last() == Some(&0) {
            self.words.pop();
        }
    }
}

/// The set bits of one word, as CPU numbers, from either end.
struct Bits {
    word: u64,
    base: u32,
}

impl Iterator for Bits {
    type Item = u32;
    fn next(&mut self) -> Option<u32> {
        if self.word == 0 {
            return None;
        }
        let bit = self.word.trailing_zeros();
        self.word &= self.word - 1;
        Some(self.base + bit)
    }
}

impl DoubleEndedIterator for Bits {
    fn next_back(&mut self) -> Option<u32> {
        if self.word == 0 {
            return None;
        }
        let bit = WORD_BITS - 1 - self.word.leading_zeros();
        self.word &= !(1 << bit);
        Some(self.base + bit)
    }
}

fn parse_cpu(num: &str, token: &str) -> Result<u32, CpuSetError> {
    let num = num.trim();
    if num.is_empty() || !num.bytes().all(|b| b.is_ascii_digit()) {
        return Err(CpuSetError::Garbage { token: token.to_owned() });
    }
    match num.parse::<u32>() {
        Ok(cpu) if cpu <= MAX_CPU => Ok(cpu),
        _ => Err(CpuSetError::OutOfRange { token: token.to_owned() }),
    }
}

impl FromIterator<u32> for CpuSet {
    fn from_iter<I: IntoIterator<Item = u32>>(iter: I) -> Self {
        let mut s = CpuSet::new();
        for cpu in iter {
            s.insert(cpu);
        }
        s
    }
}

impl FromStr for CpuSet {
    type Err = CpuSetError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        CpuSet::parse(s)
    }
}

/// The kernel list syntax, ranges collapsed, no trailing newline; the empty set is `""`.
impl fmt::Display for CpuSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut iter = self.iter().peekable();
        let mut first = true;
        while let Some(start) = iter.next() {
            let mut end = start;
            while iter.peek() == Some(&(end + 1)) {
                end += 1;
                iter.next();
            }
            if !first {
                f.write_str(",")?;
            }
            first = false;
            if start == end {
                write!(f, "{start}")?;
            } else {
                write!(f, "{start}-{end}")?;
            }
        }
        Ok(())
    }
}

impl fmt::Debug for CpuSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CpuSet({self})")
    }
}

impl serde::Serialize for CpuSet {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for CpuSet {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        CpuSet::parse(&text).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(s: &str) -> CpuSet {
        CpuSet::parse(s).unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn iterates_set_bits_from_both_ends_and_checks_subsets_in_place() {
        let s = set("0,5,63-64,100,4095,8191");
        assert_eq!(s.iter().collect::<Vec<_>>(), vec![0, 5, 63, 64, 100, 4095, 8191]);
        assert_eq!(s.iter().rev().collect::<Vec<_>>(), vec![8191, 4095, 100, 64, 63, 5, 0]);
        let mut both = s.iter();
        assert_eq!(
            (both.next(), both.next_back(), both.next(), both.next_back()),
            (Some(0), Some(8191), Some(5), Some(4095))
        );
        assert_eq!(s.first(), Some(0));
        assert_eq!(s.last(), Some(8191));
        assert_eq!(s.len(), 7);
        assert!(set("5,64").is_subset(&s));
        assert!(!set("5,65").is_subset(&s));
        assert!(set("").is_subset(&set("")));
        assert!(!set("8191").is_subset(&set("0-100")), "longer than the other set");
        assert!(set("1-2").is_subset(&set("0-8191")));
    }

    #[test]
    fn parses_kernel_syntax() {
        assert_eq!(set("0-3,8,10-11").iter().collect::<Vec<_>>(), vec![0, 1, 2, 3, 8, 10, 11]);
        assert!(set("").is_empty());
        assert!(set("\n").is_empty());
        assert!(set("   ").is_empty());
        assert_eq!(set("0-3\n"), set("0,1,2,3"));
        assert_eq!(set(" 1 , 4 - 5 "), set("1,4,5"));
        assert_eq!(set("5,1,3-4,1"), set("1,3-5"));
        assert_eq!(set("8191").iter().collect::<Vec<_>>(), vec![8191]);
    }

    #[test]
    fn formats_collapsed_ranges() {
        assert_eq!(set("0,1,2,3,8,10,11").to_string(), "0-3,8,10-11");
        assert_eq!(set("").to_string(), "");
        assert_eq!(set("7").to_string(), "7");
        assert_eq!(set("63-65").to_string(), "63-65");
    }

    #[test]
    fn rejects_bad_tokens_naming_them() {
        assert_eq!(CpuSet::parse("0-3,x"), Err(CpuSetError::Garbage { token: "x".into() }));
        assert_eq!(CpuSet::parse("1,,2"), Err(CpuSetError::Garbage { token: "".into() }));
        assert_eq!(CpuSet::parse("-1"), Err(CpuSetError::Garbage { token: "-1".into() }));
        assert_eq!(CpuSet::parse("1-2-3"), Err(CpuSetError::Garbage { token: "1-2-3".into() }));
        assert_eq!(CpuSet::parse("+3"), Err(CpuSetError::Garbage { token: "+3".into() }));
        assert_eq!(CpuSet::parse("0-8192"), Err(CpuSetError::OutOfRange { token: "0-8192".into() }));
        assert_eq!(
            CpuSet::parse("99999999999999999999"),
            Err(CpuSetError::OutOfRange { token: "99999999999999999999".into() })
        );
        assert_eq!(CpuSet::parse("2,5-3"), Err(CpuSetError::Reversed { token: "5-3".into() }));
        let msg = CpuSet::parse("0,abc").err().map(|e| e.to_string()).unwrap_or_default();
        assert!(msg.contains("`abc`"), "{msg}");
    }

    /// Vectors from systemd's encoding (src/shared/cpu-set-util.c `cpu_set_to_dbus`): CPU i is
    /// byte i/8, bit i%8, least significant bit first.
    #[test]
    fn systemd_mask_vectors() {
        assert_eq!(set("3-6,10").to_systemd_mask(), vec![0x78, 0x04]);
        assert_eq!(set("0").to_systemd_mask(), vec![0x01]);
        assert_eq!(set("8-15").to_systemd_mask(), vec![0x00, 0xff]);
        assert_eq!(set("7").to_systemd_mask(), vec![0x80]);
        assert_eq!(set("").to_systemd_mask(), Vec::<u8>::new());
        let big = set("0-1023");
        let mask = big.to_systemd_mask();
        assert_eq!(mask, vec![0xff; 128]);
        assert_eq!(CpuSet::from_systemd_mask(&mask), Ok(big));
        let sparse = set("1,1023");
        let mask = sparse.to_systemd_mask();
        assert_eq!(mask.len(), 128);
        assert_eq!(mask[0], 0x02);
        assert_eq!(mask[127], 0x80);
        assert!(mask[1..127].iter().all(|b| *b == 0));
        assert_eq!(CpuSet::from_systemd_mask(&[0x78, 0x04]), Ok(set("3-6,10")));
        assert_eq!(CpuSet::from_systemd_mask(&[0x00, 0xff, 0x00]), Ok(set("8-15")));
        assert!(matches!(
            CpuSet::from_systemd_mask(&[0u8; 1025].iter().map(|_| 0xff).collect::<Vec<_>>()),
            Err(CpuSetError::MaskTooLong { len: 1025 })
        ));
    }

    #[test]
    fn set_operations() {
        let a = set("0-7");
        let b = set("4-11");
        assert_eq!(a.union(&b), set("0-11"));
        assert_eq!(a.intersection(&b), set("4-7"));
        assert_eq!(a.difference(&b), set("0-3"));
        assert_eq!(set("100").intersection(&set("1")), CpuSet::new());
        assert!(set("4-5").is_subset(&a));
        assert!(!b.is_subset(&a));
        assert!(set("0-3").is_disjoint(&set("4-200")));
        assert!(!a.is_disjoint(&b));
        assert_eq!(set("3,200").last(), Some(200));
        assert_eq!(set("3,200").first(), Some(3));
        let mut c = set("200");
        c.remove(200);
        assert_eq!(c, CpuSet::new());
        assert_eq!(set("0-127").len(), 128);
    }

    proptest::proptest! {
        #[test]
        fn list_round_trip(cpus in proptest::collection::btree_set(0u32..=MAX_CPU, 0..200)) {
            let s: CpuSet = cpus.iter().copied().collect();
            let text = s.to_string();
            proptest::prop_assert_eq!(CpuSet::parse(&text), Ok(s.clone()));
            proptest::prop_assert_eq!(CpuSet::parse(&format!("{text}\n")), Ok(s.clone()));
            proptest::prop_assert_eq!(s.iter().collect::<std::collections::BTreeSet<_>>(), cpus);
        }

        #[test]
        fn mask_round_trip(cpus in proptest::collection::btree_set(0u32..=MAX_CPU, 0..200)) {
            let s: CpuSet = cpus.iter().copied().collect();
            let mask = s.to_systemd_mask();
            for cpu in &cpus {
                proptest::prop_assert!(mask[(*cpu / 8) as usize] & (1 << (cpu % 8)) != 0);
            }
            proptest::prop_assert_eq!(CpuSet::from_systemd_mask(&mask), Ok(s));
        }

        #[test]
        fn parse_never_panics(text in "[0-9,\\- x\n]{0,40}") {
            let _ = CpuSet::parse(&text);
        }
    }
}
