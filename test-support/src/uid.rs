//! UIDs as an API server makes them: random version 4 UUIDs (RFC 9562), lower-case hex in the
//! 8-4-4-4-12 form. About 10 in 16 begin with a digit; tests that must cover both kinds ask
//! for one of each.

use std::io::Read;

/// 16 random bytes from the kernel.
fn random() -> [u8; 16] {
    let mut b = [0u8; 16];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut b))
        .unwrap_or_else(|e| panic!("reading /dev/urandom: {e}"));
    b
}

/// A random v4 UUID.
pub fn v4() -> String {
    let mut b = random();
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!("{}-{}-{}-{}-{}", &h[0..8], &h[8..12], &h[12..16], &h[16..20], &h[20..32])
}

/// A random v4 UUID whose first character is a digit (`0`-`9`).
pub fn v4_digit_first() -> String {
    loop {
        let u = v4();
        if u.starts_with(|c: char| c.is_ascii_digit()) {
            return u;
        }
    }
}

/// A random v4 UUID whose first character is a letter (`a`-`f`).
pub fn v4_letter_first() -> String {
    loop {
        let u = v4();
        if u.starts_with(|c: char| c.is_ascii_alphabetic()) {
            return u;
        }
    }
}

/// A container id as containerd makes it: 64 random hex digits.
pub fn container_id() -> String {
    random().iter().chain(random().iter()).map(|x| format!("{x:02x}")).collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn v4_has_the_version_and_variant_bits() {
        for _ in 0..64 {
            let u = super::v4();
            assert_eq!(u.len(), 36);
            assert_eq!(u.as_bytes()[14], b'4', "{u}");
            assert!(matches!(u.as_bytes()[19], b'8' | b'9' | b'a' | b'b'), "{u}");
        }
        assert!(super::v4_digit_first().starts_with(|c: char| c.is_ascii_digit()));
        assert!(super::v4_letter_first().starts_with(|c: char| c.is_ascii_alphabetic()));
        assert_eq!(super::container_id().len(), 64);
    }
}
