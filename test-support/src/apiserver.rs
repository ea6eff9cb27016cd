//! Inputs shaped as a Kubernetes API server makes them, for every test where Kubernetes talks
//! to cpupoold (claims, pods, DRA calls), so no test speaks with names only we would write.
//!
//! - UIDs: the API server gives every object a random version-4 UUID (its `uuid.NewRandom`),
//!   36 characters, lower-case hex; 10 in 16 begin with a digit. [`uid`] takes one from the
//!   kernel's generator (`/proc/sys/kernel/random/uuid`, random version-4 UUIDs too);
//!   [`uid_digit_first`] and [`uid_letter_first`] draw until the first character is of that
//!   kind, so a test covers both whatever the draw. [`uid_from_bytes`] makes one from 16 bytes
//!   a property test chose, and [`uids`] (feature `strategies`) is the property tests' strategy.
//! - Names at the API's maxima: a namespace is a DNS label (63), most object names (a claim, a
//!   pod) a DNS subdomain (253), a claim's request name a DNS label (63): [`label`],
//!   [`subdomain`].

/// A random version-4 UUID, from the kernel's generator.
pub fn uid() -> String {
    let text = std::fs::read_to_string("/proc/sys/kernel/random/uuid")
        .unwrap_or_else(|e| panic!("reading /proc/sys/kernel/random/uuid: {e}"));
    let uid = text.trim().to_owned();
    assert!(is_v4(&uid), "the kernel's uuid `{uid}` is not a version-4 UUID");
    uid
}

/// A random version-4 UUID that begins with a digit (10 draws in 16 do).
pub fn uid_digit_first() -> String {
    draw(|c| c.is_ascii_digit())
}

/// A random version-4 UUID that begins with a letter (`a`-`f`; 6 draws in 16 do).
pub fn uid_letter_first() -> String {
    draw(|c| c.is_ascii_alphabetic())
}

fn draw(first: fn(char) -> bool) -> String {
    // The chance that 200 draws all miss is (10/16)^200 at worst: never.
    (0..200)
        .map(|_| uid())
        .find(|u| u.chars().next().is_some_and(first))
        .unwrap_or_else(|| panic!("200 version-4 UUIDs, none of the kind asked"))
}

/// The version-4 UUID of 16 random bytes: the version nibble made 4 and the variant bits 10,
/// as RFC 9562 says and the API server's generator does.
pub fn uid_from_bytes(mut b: [u8; 16]) -> String {
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!("{}-{}-{}-{}-{}", &hex[0..8], &hex[8..12], &hex[12..16], &hex[16..20], &hex[20..32])
}

/// The property tests' strategy for a uid as the API server makes it: a random version-4
/// UUID, its first character's kind forced to a digit or a letter in a third of the cases each
/// (real ones: a digit 10 times in 16), so both kinds are always drawn.
#[cfg(feature = "strategies")]
pub fn uids() -> impl proptest::strategy::Strategy<Value = String> {
    use proptest::prelude::*;
    (any::<[u8; 16]>(), any::<Option<bool>>()).prop_map(|(mut b, digit)| {
        match digit {
            Some(true) => b[0] = (b[0] % 0xa0) & 0xf0 | (b[0] & 0x0f),
            Some(false) => b[0] = 0xa0 + (b[0] % 0x60),
            None => {}
        }
        uid_from_bytes(b)
    })
}

/// Whether `u` is a version-4 UUID in its canonical (lower-case, hyphenated) text.
pub fn is_v4(u: &str) -> bool {
    let b = u.as_bytes();
    b.len() == 36
        && b.iter().enumerate().all(|(i, c)| {
            if [8, 13, 18, 23].contains(&i) {
                *c == b'-'
            } else {
                c.is_ascii_digit() || (b'a'..=b'f').contains(c)
            }
        })
        && b[14] == b'4'
        && b"89ab".contains(&b[19])
}

/// The longest DNS label (63) beginning with `stem`, as a namespace or request name may be.
pub fn label(stem: &str) -> String {
    fill(stem, 63)
}

/// The longest DNS subdomain (253) beginning with `stem`, as a claim or pod name may be:
/// labels of 63 joined by dots.
pub fn subdomain(stem: &str) -> String {
    let mut name = fill(stem, 63);
    while name.len() < 253 {
        let room = 253 - name.len() - 1;
        name = format!("{name}.{}", fill("x", room.min(63)));
    }
    name
}

/// `stem` padded to `len` with digits and `-`, ending with an alphanumeric.
fn fill(stem: &str, len: usize) -> String {
    let mut s = stem.to_owned();
    let mut i = 0u32;
    while s.len() < len - 1 {
        s.push(if i % 8 == 7 { '-' } else { char::from(b'0' + (i % 10) as u8) });
        i += 1;
    }
    s.push('z');
    s.truncate(len);
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uids_are_v4_of_both_kinds_and_names_at_the_maxima() {
        assert!(uid_digit_first().starts_with(|c: char| c.is_ascii_digit()));
        assert!(uid_letter_first().starts_with(|c: char| c.is_ascii_alphabetic()));
        assert!(is_v4(&uid_from_bytes([0xff; 16])) && is_v4(&uid_from_bytes([0; 16])));
        assert_eq!(uid_from_bytes([0; 16]), "00000000-0000-4000-8000-000000000000");
        assert!(!is_v4("c1a1c1a1-0000-1000-8000-0000000000d1"));
        let (l, s) = (label("ns"), subdomain("claim"));
        assert_eq!((l.len(), s.len()), (63, 253));
        assert!(s.split('.').all(|p| !p.is_empty() && p.len() <= 63 && p.ends_with('z')));
        assert!(l.starts_with("ns") && l.ends_with('z'));
    }
}
