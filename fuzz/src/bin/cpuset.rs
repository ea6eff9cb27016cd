//! CpuSet: the kernel list syntax parsed, formatted and parsed again gives the same set and the
//! same text; the set's systemd mask decodes back to it.
use cpupoold::core::cpuset::CpuSet;

fn main() {
    afl::fuzz!(|data: &[u8]| {
        let Ok(text) = std::str::from_utf8(data) else { return };
        let Ok(set) = CpuSet::parse(text) else { return };
        let formatted = set.to_string();
        let again = CpuSet::parse(&formatted).expect("a formatted set parses");
        assert_eq!(again, set, "parse(format(s)) != s for {text:?}");
        assert_eq!(again.to_string(), formatted, "formatting is not canonical for {text:?}");
        assert_eq!(set.iter().count(), set.len());
        assert_eq!(set.is_empty(), set.first().is_none());
        let mask = set.to_systemd_mask();
        assert_eq!(CpuSet::from_systemd_mask(&mask).expect("our own mask decodes"), set);
    });
}
