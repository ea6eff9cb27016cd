//! systemd's `AllowedCPUs` byte mask: decoding agrees bit by bit with the spec (CPU i is byte
//! i/8, bit i%8, least significant first), and encoding the decoded set gives the mask back
//! without its trailing zero bytes. A mask is refused only when it names a CPU above MAX_CPU.
use cpupoold::core::cpuset::{CpuSet, MAX_CPU};

fn main() {
    afl::fuzz!(|data: &[u8]| {
        let highest = data
            .iter()
            .enumerate()
            .rev()
            .find(|(_, b)| **b != 0)
            .map(|(i, b)| i as u64 * 8 + u64::from(7 - b.leading_zeros()));
        match CpuSet::from_systemd_mask(data) {
            Ok(set) => {
                assert!(highest.is_none_or(|h| h <= u64::from(MAX_CPU)), "accepted CPU {highest:?}");
                for (i, byte) in data.iter().enumerate() {
                    for bit in 0..8u32 {
                        let cpu = i as u32 * 8 + bit;
                        assert_eq!(set.contains(cpu), byte & (1 << bit) != 0, "CPU {cpu}");
                    }
                }
                let end = data.iter().rposition(|b| *b != 0).map_or(0, |i| i + 1);
                assert_eq!(set.to_systemd_mask(), &data[..end]);
                assert_eq!(CpuSet::parse(&set.to_string()).expect("formatted set parses"), set);
            }
            Err(_) => {
                assert!(highest.is_some_and(|h| h > u64::from(MAX_CPU)), "refused a mask up to {highest:?}")
            }
        }
    });
}
